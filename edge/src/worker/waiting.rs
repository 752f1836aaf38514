//! The waiting room in the Worker (Wasm only): joins, status polls, places
//! and the draw listing, over a sale's queue shards and its coordinator.
//!
//! Role: wire the queue routes to the pure modules (`shards`, `places`,
//! `queue`) and to the objects. Who talks to whom:
//! - a join goes to the account's shard only (`shards::shard_of`); a
//!   repeated join this isolate has answered is answered from memory;
//! - a status poll is a ticket check plus arithmetic on the coordinator's
//!   snapshot, kept in isolate memory ≤ 2.5 s (single flight) and shared
//!   through the Cache API, so the isolates of one location together ask
//!   the coordinator about once per refresh, not once each;
//! - a place not yet in the ticket is computed here, once per person, from
//!   immutable pieces (the shards' draw index and buckets, or one complete
//!   second of arrivals), each cached in isolate memory and the Cache API,
//!   so an object serves each piece about once per cache; the place goes
//!   into a re-minted ticket.
//!
//! Invariants kept here: no poll writes to an object, except that an
//! admitted person's polls are reported to their shard (batched: one call
//! per shard per 2 s per isolate; issue 13's abandoned turns); isolate
//! memory is only a cache; a piece is cached for good only once it is immutable (the
//! draw is done, the second is complete).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use serde::Deserialize;
use serde_json::{Value, json};
use token::{Claims, Expect, KeyRing, TicketData, TokenType};
use worker::{Cache, Env, Method, Request, Response, js_sys};

use crate::api::error::ApiError;
use crate::api::error::ApiResult;
use crate::botcheck::join::{BotCheck, Proof, Refusal};
use crate::botcheck::pow::{self, CHALLENGE_TTL_MS};
use crate::botcheck::turnstile::{TURNSTILE_SITEVERIFY, read_siteverify, siteverify_form};
use crate::draw::hash;
use crate::draw::index::ShardIndex;
use crate::guard::limit::{self, DEFAULT_JOIN_LIMIT, JOIN_LIMIT_PERIOD_S};
use crate::http::cache::{cache_key, cache_put_json};
use crate::http::keys::{bearer_of, ring};
use crate::http::origin::{origin_summary, recent_summary, send_with_timeout};
use crate::http::respond::json_response;
use crate::http::respond::now_ms;
use crate::http::respond::{internal, query};
use crate::http::sold_out::{set_sold_out_local, sold_out_local};
use crate::objects::call::call_object;
use crate::queue::places::{Arrival, SecondArrivals, is_member, place_of};
use crate::queue::shards;
use crate::queue::status::{self, Snapshot, Status, TICKET_TTL_SECS};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;

/// How long a queue snapshot is reused from isolate memory. Between
/// refreshes the frontier is extrapolated from its checkpoint and rate
/// (`status::frontier_at`), so a longer life costs no admission speed.
const SNAPSHOT_TTL_MS: u64 = 3_000;
/// From this age on, one request refreshes the snapshot while the others
/// keep using the cached one (single flight: no herd on the object).
const SNAPSHOT_REFRESH_MS: u64 = status::FRONTIER_HORIZON_MS;
/// How long a stale snapshot may stand in when the object cannot answer.
const SNAPSHOT_STALE_MS: u64 = 60_000;
/// How long a request with a cached snapshot waits for a fresh one.
const SNAPSHOT_BUDGET_MS: u64 = 300;
/// Bounds on what isolate memory keeps.
const MAX_SALES: usize = 1_024;
const MAX_BUCKETS: usize = 4_096;
const MAX_JOINED: usize = 100_000;
/// Immutable pieces stay in the Cache API this long.
const IMMUTABLE_SECS: u32 = 86_400;

thread_local! {
    static SNAPSHOTS: RefCell<HashMap<String, (u64, Rc<Snapshot>)>> = RefCell::new(HashMap::new());
    static REFRESHING: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
    static INDEXES: RefCell<HashMap<String, Rc<Vec<ShardIndex>>>> = RefCell::new(HashMap::new());
    static BUCKETS: RefCell<HashMap<String, Rc<Vec<String>>>> = RefCell::new(HashMap::new());
    static SECONDS: RefCell<HashMap<String, Rc<SecondArrivals>>> = RefCell::new(HashMap::new());
    /// `sale/sub` → (ticket, exp) of joins this isolate answered.
    static JOINED: RefCell<HashMap<String, (String, u64)>> = RefCell::new(HashMap::new());
    /// `sale/sub` → when this isolate last told the shard the admitted
    /// person was seen.
    static SEEN: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
    /// `sale/shard` → seen reports not yet sent.
    static SEEN_BATCH: RefCell<HashMap<String, SeenBatch>> = RefCell::new(HashMap::new());
    /// Pieces being fetched by a request of this isolate (single flight).
    static LOADING: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
}

/// One seen report: `(sub, place, seen ms)`.
type SeenReport = (String, u64, u64);

/// Seen reports waiting for one shard, since `started`.
struct SeenBatch {
    sale: String,
    shard: u32,
    started: u64,
    pending: Vec<SeenReport>,
}

/// An admitted person's polls are told to their shard at most this often
/// per isolate (they poll every ~10 s; the turn is lost after 30 s unseen).
const SEEN_EVERY_MS: u64 = 5_000;
/// A shard's seen reports wait this long for company...
const SEEN_FLUSH_MS: u64 = 2_000;
/// ...or once this many are pending.
const SEEN_BATCH_MAX: usize = 500;

/// How long a request waits for another one fetching the same piece.
const PIECE_WAIT_MS: u64 = 3_000;
/// How long a status poll waits for the pieces its place needs. Past it the
/// poll answers without the place (`drawing`, ask again soon) and the next
/// one finds the pieces loaded meanwhile: right after the draw every
/// waiting person's first poll wants pieces at once, and none of them
/// should wait for all of that (issue 20: "no request waits > 1 s").
const PLACE_BUDGET_MS: u64 = 500;
/// A poll slower than this is logged with where its time went.
const SLOW_POLL_MS: u64 = 400;

fn bounded<V>(map: &mut HashMap<String, V>, max: usize, key: String, value: V) {
    if map.len() >= max && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, value);
}

/// What the Worker needs of a sale's settings to route a join.
struct SaleCfg {
    shards: u32,
    starts_at_ms: u64,
    ends_at_ms: Option<u64>,
    /// What a join must bring (absent from an older origin's summary:
    /// none).
    bot_check: BotCheck,
    /// Joins per address per minute (0: none).
    join_limit: u64,
}

fn parse_ms(v: &Value) -> Option<u64> {
    v.as_str()
        .map(js_sys::Date::parse)
        .filter(|ms| ms.is_finite())
        .map(|ms| ms.max(0.0) as u64)
}

/// The sale's settings from the origin's summary: one this isolate saw in
/// the last minute (sales do not disappear, and the queue settings are
/// fixed once people may join), else the origin's (cached ≤ 1 s; a 404
/// refuses the join before any object exists for it). A join never waits
/// on a stalled origin for a sale this isolate knows.
async fn sale_cfg(env: &Env, sale: &str) -> ApiResult<SaleCfg> {
    let v = match recent_summary(sale, 60_000) {
        Some(v) => v,
        None => origin_summary(env, sale).await?.0,
    };
    let starts_at_ms = parse_ms(&v["starts_at"])
        .ok_or_else(|| ApiError::new(502, "origin_error", "sale has no starts_at"))?;
    // A setting this edge does not know is refused, not guessed: joins
    // would otherwise pass a check the shop asked for.
    let bot_check = match v["bot_check"].as_str() {
        None => BotCheck::None,
        Some(text) => BotCheck::parse(text).ok_or_else(|| {
            ApiError::new(502, "origin_error", format!("unknown bot_check {text:?}"))
        })?,
    };
    Ok(SaleCfg {
        shards: shards::clamp_shards(v["queue"]["shards"].as_u64().unwrap_or(1)),
        starts_at_ms,
        ends_at_ms: parse_ms(&v["ends_at"]),
        bot_check,
        join_limit: v["join_limit"].as_u64().unwrap_or(DEFAULT_JOIN_LIMIT),
    })
}

async fn call_coordinator(
    env: &Env,
    sale: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> ApiResult<Value> {
    call_object(env, "SALE_QUEUE", sale, sale, method, path, body).await
}

async fn call_shard(
    env: &Env,
    sale: &str,
    k: u32,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> ApiResult<Value> {
    let name = shards::object_name(sale, k);
    call_object(env, "QUEUE_SHARD", &name, sale, method, path, body).await
}

/// Tells the coordinator the sale sold out (every waiting person hears it).
pub(crate) async fn tell_sold_out(env: &Env, sale: &str) {
    let _ = call_coordinator(env, sale, Method::Post, "/sold_out", Some(&json!({}))).await;
}

/// Keeps `s` in isolate memory as taken at `at` (unix ms): the time the
/// coordinator answered, so a snapshot from the Cache API is not made
/// younger than it is.
fn remember_snapshot(s: Snapshot, at: u64) -> Rc<Snapshot> {
    let s = Rc::new(s);
    let sale = s.sale.clone();
    if s.sold_out {
        set_sold_out_local(&sale);
    }
    SNAPSHOTS.with(|m| bounded(&mut m.borrow_mut(), MAX_SALES, sale, (at, s.clone())));
    s
}

/// A snapshot another isolate of this location took less than `refresh_ms`
/// ago (Cache API), if any. Its age is the coordinator's own clock reading
/// (`now_ms` in the snapshot), so a copy never passes for fresher than it
/// is however often it is passed on.
async fn shared_snapshot(sale: &str, now: u64, refresh_ms: u64) -> Option<Snapshot> {
    let key = cache_key("snapshot", sale);
    let mut r = Cache::default().get(key.as_str(), false).await.ok()??;
    let s: Snapshot = serde_json::from_str(&r.text().await.ok()?).ok()?;
    (s.sale == sale && now.saturating_sub(s.now_ms) < refresh_ms).then_some(s)
}

/// Forgets everything this isolate keeps in memory (DEV_MODE hook): the next
/// request behaves as in a fresh isolate, which is how a test on one
/// `wrangler dev` process sees what the Cache API shares between isolates.
pub(crate) fn forget_memory() {
    SNAPSHOTS.with(|m| m.borrow_mut().clear());
    REFRESHING.with(|m| m.borrow_mut().clear());
    INDEXES.with(|m| m.borrow_mut().clear());
    BUCKETS.with(|m| m.borrow_mut().clear());
    SECONDS.with(|m| m.borrow_mut().clear());
    JOINED.with(|m| m.borrow_mut().clear());
    SEEN.with(|m| m.borrow_mut().clear());
    SEEN_BATCH.with(|m| m.borrow_mut().clear());
    LOADING.with(|m| m.borrow_mut().clear());
}

/// The queue snapshot from isolate memory: fresh for 2.5 s; from then on a
/// single request refreshes it from the coordinator while the others go on
/// using the cached one (at most 3 s plus one object round trip old).
pub(crate) async fn snapshot(env: &Env, sale: &str) -> ApiResult<Rc<Snapshot>> {
    refreshed_snapshot(env, sale, SNAPSHOT_REFRESH_MS, Some(SNAPSHOT_BUDGET_MS)).await
}

/// The snapshot, refreshed once older than `refresh_ms` (the summary asks
/// for one at most 1 s old, as DESIGN promises for its figures, and waits
/// for it).
pub(crate) async fn snapshot_within(
    env: &Env,
    sale: &str,
    refresh_ms: u64,
) -> ApiResult<Rc<Snapshot>> {
    refreshed_snapshot(env, sale, refresh_ms, None).await
}

/// The snapshot, refreshed once older than `refresh_ms`; with a `budget`,
/// a request holding a cached snapshot waits at most that long for a fresh
/// one (status polls: the frontier is extrapolated from the cached one
/// meanwhile, as between refreshes).
async fn refreshed_snapshot(
    env: &Env,
    sale: &str,
    refresh_ms: u64,
    budget: Option<u64>,
) -> ApiResult<Rc<Snapshot>> {
    let now = now_ms();
    let cached = SNAPSHOTS.with(|m| m.borrow().get(sale).cloned());
    let in_flight = REFRESHING.with(|m| {
        m.borrow()
            .get(sale)
            .is_some_and(|t| now.saturating_sub(*t) < 2 * SNAPSHOT_TTL_MS)
    });
    if let Some((at, s)) = &cached {
        let age = now.saturating_sub(*at);
        if age < refresh_ms || (in_flight && age < 2 * SNAPSHOT_TTL_MS) {
            return Ok(s.clone());
        }
    }
    let refreshing = Refreshing::start(sale, now);
    if let Some(s) = shared_snapshot(sale, now, refresh_ms).await {
        drop(refreshing);
        let at = s.now_ms.min(now);
        return Ok(remember_snapshot(s, at));
    }
    let ask = call_coordinator(env, sale, Method::Get, "/snapshot", None);
    let got = match (&cached, budget) {
        // A busy coordinator (a draw step under way) does not hold the
        // poll: the cached snapshot stands in, as between refreshes, and a
        // later request asks again.
        (Some((at, s)), Some(budget)) if now.saturating_sub(*at) < SNAPSHOT_STALE_MS => {
            match within(budget, ask).await {
                Some(got) => got,
                None => return Ok(s.clone()),
            }
        }
        _ => ask.await,
    };
    drop(refreshing);
    match got {
        Ok(v) => {
            let s: Snapshot = serde_json::from_value(v)
                .map_err(|_| ApiError::new(502, "queue_error", "bad snapshot"))?;
            if let Ok(body) = serde_json::to_string(&s) {
                let secs = SNAPSHOT_TTL_MS.div_ceil(1000) as u32;
                cache_put_json(&cache_key("snapshot", sale), 200, &body, secs).await;
            }
            Ok(remember_snapshot(s, now_ms()))
        }
        Err(e) if e.status >= 500 => match cached {
            // People keep their place and see `waiting`, not an error page.
            Some((at, s)) if now.saturating_sub(at) < SNAPSHOT_STALE_MS => Ok(s),
            _ => Err(e),
        },
        Err(e) => Err(e),
    }
}

fn status_body(
    env: &Env,
    sale: &str,
    sub: &str,
    ticket: &str,
    place: Option<u64>,
    after_start: bool,
    snap: &Snapshot,
) -> ApiResult<Value> {
    let now = now_ms();
    let mut s = snap.clone();
    s.sold_out = s.sold_out || sold_out_local(sale);
    let v = status::view(place, after_start, &s, now, js_sys::Math::random());
    let mut body = json!({
        "ticket": ticket,
        "status": v.status,
        "place": v.place,
        "position": v.position,
        "ahead": v.ahead,
        "eta_seconds": v.eta_seconds,
        "poll_after_ms": v.poll_after_ms,
        "starts_at_ms": s.starts_at_ms,
    });
    if let Some(why) = v.reason {
        body["reason"] = json!(why);
    }
    if v.status == Status::Admitted
        && let Some(p) = place
    {
        let ring = ring(env, "ADMISSION_TOKEN_KEYS")?;
        // Never past the end of the admission window, however often the
        // person re-polls.
        let claims = Claims::new(
            TokenType::Admit,
            sub,
            Some(sale.to_string()),
            now / 1000,
            status::admit_ttl_secs(p, &s, now),
        );
        body["admission_token"] = json!(ring.sign(&claims));
        body["admission_expires_at"] = json!(claims.exp);
        // The page counts down to the window's end, not the token's.
        body["window_ends_at_ms"] = json!(status::window_ends_at_ms(p, &s, now));
    }
    Ok(body)
}

fn reply(body: &Value) -> ApiResult<Response> {
    json_response(200, body, "no-store").map_err(internal)
}

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
    let body = req.bytes().await.unwrap_or_default();
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
    let bot_iat_ms = check_bot(env, &mut req, sale, &claims.sub, cfg.bot_check, now).await?;
    let key = format!("{sale}/{}", claims.sub);
    // A bot-checked join always goes to the shard, which spends the
    // challenge; only unchecked repeats are answered from memory.
    let known = JOINED.with(|m| {
        m.borrow()
            .get(&key)
            .filter(|(_, exp)| bot_iat_ms.is_none() && *exp > now / 1000 + 3600)
            .map(|(t, _)| t.clone())
    });
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
            let exp = now / 1000 + TICKET_TTL_SECS;
            JOINED.with(|m| {
                bounded(
                    &mut m.borrow_mut(),
                    MAX_JOINED,
                    key,
                    (j.ticket.clone(), exp),
                )
            });
            j.ticket
        }
    };
    let ticket = again_if_abandoned(env, sale, &claims.sub, ticket, now).await?;
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
    if snap.abandoned.binary_search(&place).is_err() {
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
    JOINED.with(|m| {
        bounded(
            &mut m.borrow_mut(),
            MAX_JOINED,
            format!("{sale}/{sub}"),
            (j.ticket.clone(), exp),
        )
    });
    Ok(j.ticket)
}

pub(crate) async fn status(env: &Env, req: &Request, sale: &str) -> ApiResult<Response> {
    let token = bearer_of(req)?;
    status_for(env, sale, &token).await
}

/// The claims of a valid ticket of this sale (every token error its code).
fn ticket_claims(tickets: &KeyRing, sale: &str, ticket: &str) -> ApiResult<Claims> {
    tickets
        .verify(
            ticket,
            Expect {
                typ: TokenType::Ticket,
                sale: Some(sale),
            },
            now_ms() / 1000,
        )
        .map_err(ApiError::token)
}

/// The status object of the holder of `ticket`; learns the place (once)
/// when it has become known and re-mints the ticket with it.
async fn status_for(env: &Env, sale: &str, ticket: &str) -> ApiResult<Response> {
    let t0 = now_ms();
    let tickets = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let claims = ticket_claims(&tickets, sale, ticket)?;
    let tkt = claims.tkt.clone().unwrap_or_default();
    let snap = snapshot(env, sale).await?;
    let t_snap = now_ms();
    flush_seen(env, sale).await;
    let t_seen = now_ms();
    let after_start = tkt.t_ms.is_some();
    if let Some(p) = tkt.place {
        let body = status_body(
            env,
            sale,
            &claims.sub,
            ticket,
            tkt.place,
            after_start,
            &snap,
        )?;
        if body["status"] == "admitted" {
            let shard = tkt
                .shard
                .unwrap_or_else(|| shards::shard_of(&claims.sub, snap.shards));
            seen(env, sale, &claims.sub, shard, p).await;
        }
        return reply(&body);
    }
    let shard = tkt
        .shard
        .unwrap_or_else(|| shards::shard_of(&claims.sub, snap.shards));
    let place = within(
        PLACE_BUDGET_MS,
        place_of_ticket(env, sale, &claims.sub, &tkt, &snap),
    )
    .await
    .flatten();
    let t_place = now_ms();
    if t_place.saturating_sub(t0) > SLOW_POLL_MS {
        worker::console_warn!(
            "slow poll {sale}: {} ms (snapshot {}, seen {}, place {}: {})",
            t_place - t0,
            t_snap - t0,
            t_seen - t_snap,
            t_place - t_seen,
            if place.is_some() { "known" } else { "not yet" }
        );
    }
    let Some(p) = place else {
        let body = status_body(env, sale, &claims.sub, ticket, None, after_start, &snap)?;
        return reply(&body);
    };
    let fresh = Claims::new(
        TokenType::Ticket,
        claims.sub.as_str(),
        Some(sale.to_string()),
        now_ms() / 1000,
        TICKET_TTL_SECS,
    )
    .with_ticket(TicketData {
        place: Some(p),
        shard: Some(shard),
        ..tkt
    });
    let renewed = tickets.sign(&fresh);
    JOINED.with(|m| {
        bounded(
            &mut m.borrow_mut(),
            MAX_JOINED,
            format!("{sale}/{}", claims.sub),
            (renewed.clone(), fresh.exp),
        )
    });
    let body = status_body(
        env,
        sale,
        &claims.sub,
        &renewed,
        Some(p),
        after_start,
        &snap,
    )?;
    if body["status"] == "admitted" {
        seen(env, sale, &claims.sub, shard, p).await;
    }
    reply(&body)
}

/// The place of a ticket's holder once it is known: from the ticket, or
/// computed from the immutable pieces (see the module doc).
async fn place_of_ticket(
    env: &Env,
    sale: &str,
    sub: &str,
    tkt: &TicketData,
    snap: &Snapshot,
) -> Option<u64> {
    if tkt.place.is_some() {
        return tkt.place;
    }
    let shard = tkt
        .shard
        .unwrap_or_else(|| shards::shard_of(sub, snap.shards));
    match tkt.t_ms {
        Some(t) if t < snap.fifo_through_ms => {
            let me = Arrival {
                t_ms: t,
                shard,
                seq: tkt.seq,
            };
            fifo_place(env, sale, me).await
        }
        Some(_) => None,
        None if snap.drawn => {
            prequeue_place(env, sale, sub, tkt.salt.as_deref()?, shard, snap).await
        }
        None => None,
    }
}

/// Tells the account's shard an admitted person was seen (at their poll's
/// time): at most once per [`SEEN_EVERY_MS`] per person and isolate, in
/// batches of one call per shard per [`SEEN_FLUSH_MS`] — a batch starts
/// when its first report comes and is sent by the first poll of the sale
/// (any poll) that finds it due — so admitted people's polls cost their
/// shard a write per batch, not per poll, and a fresh isolate none at once.
/// Best effort: a lost report is made up by the next poll (~10 s later,
/// inside the 30 s).
async fn seen(env: &Env, sale: &str, sub: &str, shard: u32, place: u64) {
    let key = format!("{sale}/{sub}");
    let now = now_ms();
    let fresh = SEEN.with(|m| {
        m.borrow()
            .get(&key)
            .is_some_and(|t| now.saturating_sub(*t) < SEEN_EVERY_MS)
    });
    if fresh {
        return;
    }
    SEEN.with(|m| bounded(&mut m.borrow_mut(), MAX_JOINED, key, now));
    SEEN_BATCH.with(|m| {
        let mut m = m.borrow_mut();
        let batch_key = format!("{sale}/{shard}");
        if m.len() >= MAX_SALES && !m.contains_key(&batch_key) {
            m.clear();
        }
        let b = m.entry(batch_key).or_insert_with(|| SeenBatch {
            sale: sale.to_string(),
            shard,
            started: now,
            pending: Vec::new(),
        });
        if b.pending.is_empty() {
            b.started = now;
        }
        b.pending.push((sub.to_string(), place, now));
    });
    flush_seen(env, sale).await;
}

/// Sends this sale's seen batches that are due (see [`seen`]).
async fn flush_seen(env: &Env, sale: &str) {
    let now = now_ms();
    let due: Vec<(u32, Vec<SeenReport>)> = SEEN_BATCH.with(|m| {
        m.borrow_mut()
            .values_mut()
            .filter(|b| {
                b.sale == sale
                    && !b.pending.is_empty()
                    && (now.saturating_sub(b.started) >= SEEN_FLUSH_MS
                        || b.pending.len() >= SEEN_BATCH_MAX)
            })
            .map(|b| (b.shard, std::mem::take(&mut b.pending)))
            .collect()
    });
    for (shard, batch) in due {
        let body = json!({ "seen": batch });
        let _ = call_shard(env, sale, shard, Method::Post, "/seen", Some(&body)).await;
    }
}

/// Tells the account's shard it made a reservation: a person with a live
/// hold never loses the turn.
pub(crate) async fn tell_held(env: &Env, sale: &str, sub: &str) {
    let Ok(cfg) = sale_cfg(env, sale).await else {
        return;
    };
    let k = shards::shard_of(sub, cfg.shards);
    let body = json!({"sub": sub});
    let _ = call_shard(env, sale, k, Method::Post, "/held", Some(&body)).await;
}

/// Waits while another request of this isolate fetches piece `id` (the
/// first poll after the draw comes in a crowd: one fetch per piece, not one
/// per concurrent poll). Returns once it is no longer being fetched.
async fn await_piece(id: &str, in_memory: impl Fn() -> bool) {
    let start = now_ms();
    while !in_memory()
        && now_ms().saturating_sub(start) < PIECE_WAIT_MS
        && LOADING.with(|m| {
            m.borrow()
                .get(id)
                .is_some_and(|t| now_ms().saturating_sub(*t) < PIECE_WAIT_MS)
        })
    {
        worker::Delay::from(std::time::Duration::from_millis(20)).await;
    }
}

/// `fut`'s output if it is ready within `ms`, else `None` (and `fut` is
/// dropped).
async fn within<T>(ms: u64, fut: impl Future<Output = T>) -> Option<T> {
    let fut = std::pin::pin!(fut);
    let delay = std::pin::pin!(worker::Delay::from(std::time::Duration::from_millis(ms)));
    match futures::future::select(fut, delay).await {
        futures::future::Either::Left((v, _)) => Some(v),
        futures::future::Either::Right(_) => None,
    }
}

/// Marks a sale's snapshot as being refreshed by this request for as long
/// as it lives (a refresh given up half way unmarks it).
struct Refreshing<'a>(&'a str);

impl<'a> Refreshing<'a> {
    fn start(sale: &'a str, now: u64) -> Self {
        REFRESHING.with(|m| bounded(&mut m.borrow_mut(), MAX_SALES, sale.to_string(), now));
        Refreshing(sale)
    }
}

impl Drop for Refreshing<'_> {
    fn drop(&mut self) {
        REFRESHING.with(|m| m.borrow_mut().remove(self.0));
    }
}

/// Marks piece `id` as being fetched by this request for as long as it
/// lives: a fetch given up half way (a poll past its budget) unmarks it,
/// so other requests fetch it themselves instead of waiting for nobody.
struct Loading<'a>(&'a str);

impl<'a> Loading<'a> {
    fn start(id: &'a str) -> Self {
        LOADING.with(|m| bounded(&mut m.borrow_mut(), MAX_BUCKETS, id.to_string(), now_ms()));
        Loading(id)
    }
}

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        LOADING.with(|m| m.borrow_mut().remove(self.0));
    }
}

/// An immutable JSON piece: Cache API, else `load` (then cached for good).
async fn immutable(id: &str, load: impl Future<Output = ApiResult<Value>>) -> Option<Value> {
    let _loading = Loading::start(id);
    immutable_uncounted(id, load).await
}

async fn immutable_uncounted(
    id: &str,
    load: impl Future<Output = ApiResult<Value>>,
) -> Option<Value> {
    let ck = cache_key("piece", id);
    if let Ok(Some(mut r)) = Cache::default().get(ck.as_str(), false).await
        && let Ok(t) = r.text().await
        && let Ok(v) = serde_json::from_str::<Value>(&t)
    {
        return Some(v);
    }
    let v = load.await.ok()?;
    cache_put_json(&ck, 200, &v.to_string(), IMMUTABLE_SECS).await;
    Some(v)
}

async fn draw_index(env: &Env, sale: &str, commitment: &str) -> Option<Rc<Vec<ShardIndex>>> {
    let id = format!("{sale}/{commitment}/index");
    await_piece(&id, || INDEXES.with(|m| m.borrow().contains_key(&id))).await;
    if let Some(x) = INDEXES.with(|m| m.borrow().get(&id).cloned()) {
        return Some(x);
    }
    let v = immutable(
        &id,
        call_coordinator(env, sale, Method::Get, "/index", None),
    )
    .await?;
    let x: Vec<ShardIndex> = serde_json::from_value(v["shards"].clone()).ok()?;
    let x = Rc::new(x);
    INDEXES.with(|m| bounded(&mut m.borrow_mut(), MAX_SALES, id, x.clone()));
    Some(x)
}

async fn bucket(
    env: &Env,
    sale: &str,
    commitment: &str,
    k: u32,
    j: u64,
) -> Option<Rc<Vec<String>>> {
    let id = format!("{sale}/{commitment}/b/{k}/{j}");
    await_piece(&id, || BUCKETS.with(|m| m.borrow().contains_key(&id))).await;
    if let Some(x) = BUCKETS.with(|m| m.borrow().get(&id).cloned()) {
        return Some(x);
    }
    let path = format!("/bucket?j={j}");
    let v = immutable(&id, call_shard(env, sale, k, Method::Get, &path, None)).await?;
    let x: Vec<String> = serde_json::from_value(v["values"].clone()).ok()?;
    let x = Rc::new(x);
    BUCKETS.with(|m| bounded(&mut m.borrow_mut(), MAX_BUCKETS, id, x.clone()));
    Some(x)
}

/// Every shard's bucket straddling `v` (empty where none does), fetched
/// at once: one person's first poll after the draw waits for the slowest of
/// them, not for their sum.
async fn straddling_buckets(
    env: &Env,
    sale: &str,
    commitment: &str,
    index: &[ShardIndex],
    v: &str,
) -> Option<Vec<Rc<Vec<String>>>> {
    let fetches = index.iter().enumerate().map(|(k, ix)| async move {
        match ix.straddling(v) {
            Some(j) => bucket(env, sale, commitment, k as u32, j).await,
            None => Some(Rc::new(Vec::new())),
        }
    });
    futures::future::join_all(fetches)
        .await
        .into_iter()
        .collect::<Option<_>>()
}

async fn prequeue_place(
    env: &Env,
    sale: &str,
    sub: &str,
    salt: &str,
    shard: u32,
    snap: &Snapshot,
) -> Option<u64> {
    let key = snap.key.as_deref().and_then(::draw::from_hex)?;
    let index = draw_index(env, sale, &snap.commitment).await?;
    let own = index.get(shard as usize)?;
    let v = hash::value_hex(&key, &hash::leaf_of_ticket(sub, salt)?);
    own.straddling(&v)?;
    // The own shard's bucket is one of the buckets the place needs: they
    // are fetched in one concurrent round (right after the draw every first
    // poll waits for these round trips; a membership check first would add
    // a round).
    let held = straddling_buckets(env, sale, &snap.commitment, &index, &v).await?;
    if !is_member(own, &v, held.get(shard as usize)?) {
        // A ticket of someone who joined after the entrant set froze.
        return None;
    }
    let parts: Vec<(&ShardIndex, &[String])> = index
        .iter()
        .zip(&held)
        .map(|(ix, b)| (ix, b.as_slice()))
        .collect();
    place_of(&v, &parts)
}

async fn fifo_place(env: &Env, sale: &str, me: Arrival) -> Option<u64> {
    let second = me.t_ms / 1000;
    let id = format!("{sale}/s/{second}");
    await_piece(&id, || SECONDS.with(|m| m.borrow().contains_key(&id))).await;
    let sec = match SECONDS.with(|m| m.borrow().get(&id).cloned()) {
        Some(s) => s,
        None => {
            let path = format!("/arrivals?s={second}");
            // Only a complete second is immutable: an incomplete one is an
            // error to `immutable`, so it is neither cached nor answered.
            let load = async {
                let v = call_coordinator(env, sale, Method::Get, &path, None).await?;
                if v["arrivals"]["complete"].as_bool() == Some(true) {
                    Ok(v)
                } else {
                    Err(ApiError::new(503, "queue_error", "second not complete"))
                }
            };
            let v = immutable(&id, load).await?;
            let mut s: SecondArrivals = serde_json::from_value(v["arrivals"].clone()).ok()?;
            if !s.complete {
                return None;
            }
            // The pre-queue goes into `before`: the cached piece is whole.
            s.before += v["prequeue"].as_u64().unwrap_or(0);
            let s = Rc::new(s);
            SECONDS.with(|m| bounded(&mut m.borrow_mut(), MAX_BUCKETS, id, s.clone()));
            s
        }
    };
    sec.place_of(0, me)
}

// ------------------------------------------------------------ draw audit

/// `GET /api/sales/{sale}/draw`: the draw as published (commitment, and
/// each part once known); `?from=&limit=` lists places `from ..
/// from + limit` (limit ≤ 512) as `{"entries": [{place, leaf, value}]}` —
/// immutable once listed, so cached for good and asked of the coordinator
/// once per page and location.
pub(crate) async fn draw_audit(env: &Env, req: &Request, sale: &str) -> ApiResult<Response> {
    let url = req.url().map_err(internal)?;
    // Unknown sales are refused before an object is created for them.
    origin_summary(env, sale).await?;
    let (from, limit) = (query(&url, "from"), query(&url, "limit"));
    if from.is_none() && limit.is_none() {
        let snap = snapshot(env, sale).await?;
        // The overview is immutable once listed (the Cache API keeps it for
        // good), and before that at most a second old: anyone may ask, and
        // the coordinator hears about once a second per location.
        if snap.listed() {
            let id = format!("{sale}/{}/draw", snap.commitment);
            let v = immutable(&id, call_coordinator(env, sale, Method::Get, "/draw", None))
                .await
                .ok_or_else(|| {
                    ApiError::new(503, "queue_unavailable", "try again").retry_after(1)
                })?;
            return json_response(200, &v, "public, max-age=3600").map_err(internal);
        }
        let ck = cache_key("draw", sale);
        if let Ok(Some(mut r)) = Cache::default().get(ck.as_str(), false).await
            && let Ok(t) = r.text().await
            && let Ok(v) = serde_json::from_str::<Value>(&t)
        {
            return json_response(200, &v, "public, max-age=1").map_err(internal);
        }
        let v = call_coordinator(env, sale, Method::Get, "/draw", None).await?;
        cache_put_json(&ck, 200, &v.to_string(), 1).await;
        return json_response(200, &v, "public, max-age=1").map_err(internal);
    }
    let max = crate::draw::freeze::LISTING_MAX;
    let bad = || {
        ApiError::new(
            400,
            "bad_request",
            format!("from must be a place (1 or more) and limit 1..={max}"),
        )
    };
    let from: u64 = from
        .unwrap_or_else(|| "1".into())
        .parse()
        .ok()
        .filter(|f| *f >= 1)
        .ok_or_else(bad)?;
    let limit: u64 = limit
        .unwrap_or_else(|| max.to_string())
        .parse()
        .ok()
        .filter(|l| (1..=max).contains(l))
        .ok_or_else(bad)?;
    let snap = snapshot(env, sale).await?;
    if !snap.listed() {
        return Err(ApiError::new(
            409,
            "not_drawn",
            "the draw has not happened yet (or its listing is being written)",
        )
        .retry_after(1));
    }
    let id = format!("{sale}/{}/list/{from}/{limit}", snap.commitment);
    let path = format!("/listing?from={from}&limit={limit}");
    let v = immutable(&id, call_coordinator(env, sale, Method::Get, &path, None))
        .await
        .ok_or_else(|| ApiError::new(503, "queue_unavailable", "try again").retry_after(1))?;
    json_response(200, &v, "public, max-age=86400, immutable").map_err(internal)
}

/// `GET /api/sales/{sale}/queue/receipt` (ticket auth): the holder's entry
/// in the draw, `{account, leaf, salt, leaf_index, audit_path, place}`, so
/// they can check it themselves (the page does, with WebCrypto): their leaf
/// from their account and salt, its audit path to the published
/// `entrants_root`, and the listing at their place.
pub(crate) async fn receipt(env: &Env, req: &Request, sale: &str) -> ApiResult<Response> {
    let ticket = bearer_of(req)?;
    let claims = ticket_claims(&*ring(env, "ADMISSION_TOKEN_KEYS")?, sale, &ticket)?;
    let tkt = claims.tkt.clone().unwrap_or_default();
    if tkt.t_ms.is_some() {
        return Err(not_in_draw());
    }
    let snap = snapshot(env, sale).await?;
    if !snap.listed() {
        return Err(ApiError::new(
            409,
            "not_drawn",
            "the draw has not happened yet: a receipt exists once it is listed",
        )
        .retry_after(1));
    }
    let salt = tkt.salt.as_deref().ok_or_else(not_in_draw)?;
    let leaf = hash::leaf_of_ticket(&claims.sub, salt).ok_or_else(not_in_draw)?;
    let shard = tkt
        .shard
        .unwrap_or_else(|| shards::shard_of(&claims.sub, snap.shards));
    let unavailable = || ApiError::new(503, "queue_unavailable", "try again").retry_after(1);
    let place = prequeue_place(env, sale, &claims.sub, salt, shard, &snap)
        .await
        .ok_or_else(not_in_draw)?;
    let proof = call_coordinator(env, sale, Method::Get, &format!("/proof?leaf={leaf}"), None)
        .await
        .map_err(|e| if e.status == 404 { not_in_draw() } else { e })?;
    if proof["leaf_index"].as_u64().is_none() {
        return Err(unavailable());
    }
    let body = json!({
        "account": claims.sub,
        "leaf": leaf,
        "salt": salt,
        "leaf_index": proof["leaf_index"],
        "audit_path": proof["audit_path"],
        "entrants": proof["entrants"],
        "place": place,
    });
    json_response(200, &body, "private, no-store").map_err(internal)
}

fn not_in_draw() -> ApiError {
    ApiError::new(
        409,
        "not_in_draw",
        "this ticket's holder was not in the draw: they joined after the start, and places after it follow arrival",
    )
}

// ------------------------------------------------------------- metrics

/// `GET /api/sales/{sale}/metrics`: the coordinator's admission figures as
/// Prometheus text (`metrics::render`), for a scraper; never cached.
pub(crate) async fn metrics(env: &Env, sale: &str) -> ApiResult<Response> {
    // Unknown sales are refused before an object is created for them.
    origin_summary(env, sale).await?;
    let v = call_coordinator(env, sale, Method::Get, "/metrics", None).await?;
    let f: crate::api::metrics::AdmissionFigures = serde_json::from_value(v)
        .map_err(|_| ApiError::new(502, "queue_error", "bad admission figures"))?;
    let headers = worker::Headers::new();
    headers
        .set("content-type", "text/plain; version=0.0.4; charset=utf-8")
        .map_err(internal)?;
    headers.set("cache-control", "no-store").map_err(internal)?;
    Ok(Response::ok(crate::api::metrics::render(sale, &f))
        .map_err(internal)?
        .with_headers(headers))
}

// ------------------------------------------------------------- dev hook

/// DEV_MODE only (the router checks): loads synthetic pre-queue entrants
/// `prefix-i`, `i` in `from..to`, into the sale's shards.
pub(crate) async fn bulk(env: &Env, mut req: Request, sale: &str) -> ApiResult<Response> {
    let body = req.bytes().await.map_err(internal)?;
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
