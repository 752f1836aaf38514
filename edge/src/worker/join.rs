//! `POST /api/sales/{sale}/queue` and its challenge (Wasm only): a join
//! goes to the account's shard only (`shards::shard_of`), after the
//! address's join limit and the bot check; a repeated join this isolate
//! answered, or one carrying the account's own ticket, is answered without
//! an object call. The answer is the status (`worker::status`).
//!
//! Invariants kept here:
//! - the press is judged by when it reached the edge: the shard stamps it
//!   with the Worker's clock reading taken first (`status::arrival_ms`);
//! - the join limit is counted before the bot check (failed solutions
//!   count too), and the bot check is verified before any object call; a
//!   bot-checked join always reaches the shard, which spends the challenge;
//! - a person whose turn was abandoned joins again at the back only for
//!   the turn the coordinator lists (`queue::poll::abandoned`).

use serde::Deserialize;
use serde_json::json;
use token::{Claims, Expect, TicketData, TokenType};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{Env, Method, Request, Response, console_log, js_sys};

use crate::api::error::{ApiError, ApiResult};
use crate::botcheck::join::{BotCheck, Proof, Refusal};
use crate::botcheck::pow::{self, CHALLENGE_TTL_MS};
use crate::botcheck::turnstile::{TURNSTILE_SITEVERIFY, read_siteverify, siteverify_form};
use crate::guard::limit::{self, JOIN_LIMIT_PERIOD_S};
use crate::http::keys::{bearer_of, ring};
use crate::http::origin::send_with_timeout;
use crate::http::respond::{body_limited, internal, now_ms, query};
use crate::queue::poll;
use crate::queue::shards;
use crate::queue::status::{self, TICKET_TTL_SECS};
use crate::worker::calls::{call_coordinator, call_shard};
use crate::worker::memory::{known_join, remember_join};
use crate::worker::pieces::place_of_ticket;
use crate::worker::sale::sale_cfg;
use crate::worker::snapshot::snapshot;
use crate::worker::status::{reply, status_for};

#[derive(Deserialize)]
struct Joined {
    ticket: String,
}

/// `GET /api/sales/{sale}/challenge` (user token): what the sale's bot
/// check asks of this account's join — a signed proof-of-work challenge
/// (`botcheck::pow::issue`), the Turnstile site key, or nothing. No object is
/// called. In dev mode `?ttl_ms=` shortens the challenge's life (the e2e
/// test of an expired challenge).
pub(crate) async fn challenge(
    env: &Env,
    req: &Request,
    sale: &str,
    dev_mode: bool,
) -> ApiResult<Response> {
    let now = now_ms();
    let token = bearer_of(req)?;
    let claims = ring(env, "USER_TOKEN_KEYS")?
        .verify_user(&token, now / 1000)
        .map_err(ApiError::token)?;
    let cfg = sale_cfg(env, sale).await?;
    let body = match cfg.bot_check {
        BotCheck::None => json!({"kind": "none"}),
        BotCheck::Turnstile => json!({
            "kind": "turnstile",
            "site_key": env.var("TURNSTILE_SITE_KEY").map(|v| v.to_string()).ok(),
        }),
        BotCheck::Pow(bits) => {
            let url = req.url().map_err(internal)?;
            let ttl = query(&url, "ttl_ms")
                .filter(|_| dev_mode)
                .and_then(|t| t.parse::<u64>().ok())
                .map_or(CHALLENGE_TTL_MS, |t| t.clamp(1, CHALLENGE_TTL_MS));
            let keys = ring(env, "ADMISSION_TOKEN_KEYS")?;
            let (c, content) = pow::issue(
                &keys,
                &claims.sub,
                sale,
                bits,
                now,
                ttl,
                token::random_jti(),
            );
            json!({
                "kind": "pow",
                "challenge": c,
                "difficulty": bits,
                "expires_at": content.exp_ms / 1000,
                "expires_at_ms": content.exp_ms,
            })
        }
    };
    reply(&body)
}

/// The bot check of a join, before any object call: `Some(iat_ms)` of the
/// proof-of-work challenge it solved (its shard refuses one not newer than
/// the last it accepted for the account), `None` when the sale asks for
/// nothing.
async fn check_bot(
    env: &Env,
    req: &mut Request,
    sale: &str,
    sub: &str,
    check: BotCheck,
    now: u64,
) -> ApiResult<Option<u64>> {
    if check == BotCheck::None {
        return Ok(None);
    }
    let body = body_limited(req, crate::api::bodies::MAX_DEV_BODY_LEN).await?;
    let proof = crate::api::bodies::join(&body)?;
    let BotCheck::Pow(bits) = check else {
        turnstile(env, req, &proof).await?;
        return Ok(None);
    };
    let keys = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let c = pow::verify(&keys, &proof, sub, sale, bits, now).map_err(Refusal::error)?;
    Ok(Some(c.iat_ms))
}

/// The sale's per-address join limit, counted across isolates by the
/// rate-limiting binding of its tier (`limit::join_limit_binding`), keyed
/// by sale and address (`CF-Connecting-IP`, which Cloudflare sets). The
/// binding is called through the environment object itself (its `limit`
/// method), so no wrapper type has to match the runtime's class name. A
/// binding that fails to answer lets the join through (logged): the limit
/// is a brake on bots, not worth refusing everyone over.
async fn limit_joins(env: &Env, req: &Request, sale: &str, per_min: u64) -> ApiResult<()> {
    if per_min == 0 {
        return Ok(());
    }
    let name = limit::join_limit_binding(per_min).ok_or_else(|| {
        ApiError::new(
            502,
            "origin_error",
            format!("no join limit binding for {per_min}/min"),
        )
    })?;
    let missing = || {
        ApiError::new(
            500,
            "config_error",
            format!("rate-limiting binding {name} is missing"),
        )
    };
    let env_js: &JsValue = env.as_ref();
    let binding = js_sys::Reflect::get(env_js, &name.into()).map_err(|_| missing())?;
    let limit_fn = js_sys::Reflect::get(&binding, &"limit".into())
        .ok()
        .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
        .ok_or_else(missing)?;
    let addr = req.headers().get("cf-connecting-ip").ok().flatten();
    let opts = js_sys::Object::new();
    let key = limit::join_limit_key(sale, addr.as_deref());
    let _ = js_sys::Reflect::set(&opts, &"key".into(), &key.into());
    let outcome = match limit_fn.call1(&binding, &opts) {
        Ok(p) => match p.dyn_into::<js_sys::Promise>() {
            Ok(p) => JsFuture::from(p).await.ok(),
            Err(_) => None,
        },
        Err(_) => None,
    };
    let Some(outcome) = outcome else {
        worker::console_log!("join limit {name}: the binding did not answer; join let through");
        return Ok(());
    };
    let allowed = js_sys::Reflect::get(&outcome, &"success".into())
        .ok()
        .and_then(|v| v.as_bool())
        .unwrap_or(true);
    if allowed {
        Ok(())
    } else {
        Err(ApiError::new(
            429,
            "too_many_joins",
            format!("more than {per_min} joins a minute from this address: retry later"),
        )
        .retry_after(JOIN_LIMIT_PERIOD_S))
    }
}

/// Verifies a join's Turnstile token against `TURNSTILE_SITEVERIFY_URL`
/// (Cloudflare's in production) with the secret `TURNSTILE_SECRET_KEY`.
/// Turnstile tokens are single-use at Cloudflare: a replay comes back as
/// `timeout-or-duplicate` (`challenge_reused`).
async fn turnstile(env: &Env, req: &Request, proof: &Proof) -> ApiResult<()> {
    let secret = env
        .secret("TURNSTILE_SECRET_KEY")
        .map(|s| s.to_string())
        .or_else(|_| env.var("TURNSTILE_SECRET_KEY").map(|v| v.to_string()))
        .map_err(|_| ApiError::new(500, "config_error", "TURNSTILE_SECRET_KEY is not set"))?;
    let url = env
        .var("TURNSTILE_SITEVERIFY_URL")
        .map(|v| v.to_string())
        .unwrap_or_else(|_| TURNSTILE_SITEVERIFY.to_string());
    let addr = req.headers().get("cf-connecting-ip").ok().flatten();
    let form = siteverify_form(&secret, proof, addr.as_deref()).map_err(Refusal::error)?;
    let unavailable = || {
        ApiError::new(
            503,
            "bot_check_unavailable",
            "the bot check cannot be verified right now",
        )
        .retry_after(2)
    };
    let headers = worker::Headers::new();
    headers
        .set("content-type", "application/x-www-form-urlencoded")
        .map_err(internal)?;
    let mut init = worker::RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(form.into()));
    let out = Request::new_with_init(&url, &init)
        .map_err(|_| ApiError::new(500, "config_error", "TURNSTILE_SITEVERIFY_URL is not a URL"))?;
    let mut resp = send_with_timeout(worker::Fetch::Request(out), 5_000)
        .await
        .map_err(|_| unavailable())?;
    let body = resp.bytes().await.map_err(|_| unavailable())?;
    read_siteverify(&body).map_err(|r| r.map_or_else(unavailable, Refusal::error))
}

/// `POST /api/sales/{sale}/queue` (user token).
pub(crate) async fn join(env: &Env, mut req: Request, sale: &str) -> ApiResult<Response> {
    // The press is judged by when it reached the edge (the shard stamps it
    // with this, see `status::arrival_ms`), not after the waits below.
    let now = now_ms();
    let token = bearer_of(&req)?;
    let users = ring(env, "USER_TOKEN_KEYS")?;
    // `v1` or a shop's JWT (HS256); see `KeyRing::verify_user`.
    let claims = users
        .verify_user(&token, now / 1000)
        .map_err(ApiError::token)?;
    let cfg = sale_cfg(env, sale).await?;
    // Counted before the bot check: failed solutions count too.
    limit_joins(env, &req, sale, cfg.join_limit).await?;
    // A repeated join carrying the account's own ticket is answered from
    // it: no object call, and no new bot check (the ticket shows one passed).
    let held = req
        .headers()
        .get(status::HELD_TICKET_HEADER)
        .ok()
        .flatten()
        .filter(|t| {
            ring(env, "ADMISSION_TOKEN_KEYS")
                .is_ok_and(|r| status::is_held_ticket(&r, t, sale, &claims.sub, now / 1000))
        });
    if let Some(ticket) = held {
        let ticket = again_if_abandoned(env, sale, &claims.sub, ticket, now).await?;
        return status_for(env, sale, &ticket).await;
    }
    let bot_iat_ms = match check_bot(env, &mut req, sale, &claims.sub, cfg.bot_check, now).await {
        Ok(iat) => iat,
        // A sale with a shadow queue answers a failed check with a place
        // that never moves up, so a bot learns nothing to retry on. Only
        // the solver's own refusals (4xx): an unavailable Turnstile is
        // still the edge's failure, not the person's.
        Err(e) if cfg.bot_shadow && bot_failed(&e) => {
            return shadow_join(env, sale, &claims.sub, now).await;
        }
        Err(e) => {
            if bot_failed(&e) {
                // Counted for the operator (one object call per refusal,
                // bounded as every join is by the address's join limit).
                let _ = call_coordinator(env, sale, Method::Post, "/bot-refused", Some(&json!({})))
                    .await;
            }
            return Err(e);
        }
    };
    // A bot-checked join always goes to the shard, which spends the
    // challenge; only unchecked repeats are answered from memory.
    let known = known_join(sale, &claims.sub, bot_iat_ms.is_some(), now);
    let ticket = match known {
        // A repeated join: the ticket this isolate handed out, no object call.
        Some(t) => t,
        None => {
            let k = shards::shard_of(&claims.sub, cfg.shards);
            let body = json!({
                "sub": claims.sub, "shard": k, "shards": cfg.shards,
                "starts_at_ms": cfg.starts_at_ms, "ends_at_ms": cfg.ends_at_ms,
                "arrival_ms": now, "bot_iat_ms": bot_iat_ms,
            });
            let v = call_shard(env, sale, k, Method::Post, "/join", Some(&body)).await?;
            let j: Joined = serde_json::from_value(v)
                .map_err(|_| ApiError::new(502, "queue_error", "bad join"))?;
            remember_join(sale, &claims.sub, &j.ticket, now / 1000 + TICKET_TTL_SECS);
            j.ticket
        }
    };
    let ticket = again_if_abandoned(env, sale, &claims.sub, ticket, now).await?;
    status_for(env, sale, &ticket).await
}

/// Whether a bot check's error is the person's failure (4xx but 429), not
/// the edge's (an unavailable Turnstile is a 5xx).
fn bot_failed(e: &ApiError) -> bool {
    (400..500).contains(&e.status) && e.status != 429
}

/// A shadow ticket for `sub` (`token::TicketData::shadow`): signed like a
/// real one, known to no shard; the coordinator only counts it.
async fn shadow_join(env: &Env, sale: &str, sub: &str, now: u64) -> ApiResult<Response> {
    let tickets = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let mut seq = [0u8; 4];
    getrandom::fill(&mut seq).map_err(|_| ApiError::new(500, "rng", "CSPRNG unavailable"))?;
    let claims = Claims::new(
        TokenType::Ticket,
        sub,
        Some(sale.to_string()),
        now / 1000,
        TICKET_TTL_SECS,
    )
    .with_ticket(TicketData {
        seq: u64::from(u32::from_be_bytes(seq)),
        shadow: true,
        ..TicketData::default()
    });
    let ticket = tickets.sign(&claims);
    let _ = call_coordinator(env, sale, Method::Post, "/shadowed", Some(&json!({}))).await;
    console_log!("join {sale}: bot check failed, shadow ticket");
    status_for(env, sale, &ticket).await
}

/// A join by someone whose turn was abandoned (`status::CloseReason::
/// Abandoned`) puts them in line again, at the back: the shard gives the
/// entry a new arrival (only for the turn named, so twice is once).
async fn again_if_abandoned(
    env: &Env,
    sale: &str,
    sub: &str,
    ticket: String,
    now: u64,
) -> ApiResult<String> {
    let tickets = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let expect = Expect {
        typ: TokenType::Ticket,
        sale: Some(sale),
    };
    let Ok(claims) = tickets.verify(&ticket, expect, now / 1000) else {
        return Ok(ticket);
    };
    let tkt = claims.tkt.unwrap_or_default();
    let snap = snapshot(env, sale).await?;
    if snap.abandoned.is_empty() {
        return Ok(ticket);
    }
    let Some(place) = place_of_ticket(env, sale, sub, &tkt, &snap).await else {
        return Ok(ticket);
    };
    if !poll::abandoned(place, &snap) {
        return Ok(ticket);
    }
    let cfg = sale_cfg(env, sale).await?;
    let k = tkt
        .shard
        .unwrap_or_else(|| shards::shard_of(sub, cfg.shards));
    let body = json!({
        "sub": sub, "shard": k, "shards": cfg.shards,
        "starts_at_ms": cfg.starts_at_ms, "ends_at_ms": cfg.ends_at_ms,
        "arrival_ms": now, "again_seq": tkt.seq,
    });
    let v = call_shard(env, sale, k, Method::Post, "/join", Some(&body)).await?;
    let j: Joined =
        serde_json::from_value(v).map_err(|_| ApiError::new(502, "queue_error", "bad join"))?;
    let exp = now / 1000 + TICKET_TTL_SECS;
    remember_join(sale, sub, &j.ticket, exp);
    Ok(j.ticket)
}

/// DEV_MODE only (the router checks): loads synthetic pre-queue entrants
/// `prefix-i`, `i` in `from..to`, into the sale's shards.
pub(crate) async fn bulk(env: &Env, mut req: Request, sale: &str) -> ApiResult<Response> {
    let body = body_limited(&mut req, crate::api::bodies::MAX_DEV_BODY_LEN).await?;
    let b = crate::api::bodies::dev_bulk(&body)?;
    let cfg = sale_cfg(env, sale).await?;
    let mut added = 0u64;
    for k in 0..cfg.shards {
        let body = json!({"prefix": b.prefix, "from": b.from, "to": b.to, "shard": k,
                          "shards": cfg.shards, "starts_at_ms": cfg.starts_at_ms});
        let v = call_shard(env, sale, k, Method::Post, "/bulk", Some(&body)).await?;
        added += v["added"].as_u64().unwrap_or(0);
    }
    reply(&json!({"added": added, "shards": cfg.shards}))
}
