//! Worker glue (Wasm only): the `fetch` event, routing, key rings, the
//! sale summary and sold-out caches, and forwarding to the origin. The queue
//! routes live in `waiting`.
//!
//! Invariants kept here:
//! - the origin's sale summary is cached (Cache API) for at most 1 s and a
//!   stale copy is served, marked, when the origin sheds or fails;
//! - once the edge knows a sale is sold out (an origin `410 sold_out`, no
//!   other 410; the summary; or the queue coordinator) reservations get 410 here without an origin
//!   request; the flag lives 3 s and is then rechecked against the summary,
//!   never by sending a reservation. The one exception is a replay: an
//!   Idempotency-Key this edge passed a `202` for (remembered in isolate
//!   memory and the Cache API, [`api::held_key_name`]) still reaches the
//!   origin, which answers it with its first answer;
//! - isolate memory is only ever a cache (a panic or eviction wipes it);
//! - every answer is JSON with the documented error shape; no input panics;
//! - misconfigured (key rings missing, malformed or sharing a secret) the
//!   edge answers every request with a 500 `config_error`; `DEV_MODE` is
//!   ignored unless `ORIGIN_URL` is a loopback address.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use serde_json::{Value, json};
use token::{Claims, Expect, KeyRing, TokenError, TokenType};
use worker::{
    AbortSignal, Cache, Context, Env, Fetch, Headers, Method, Request, RequestInit, Response,
    Result, console_log, event, js_sys, web_sys,
};

use crate::api::{self, ApiError, Route};
use crate::botcheck;
use crate::draw;
use crate::limit::Limiter;
use crate::objects::internal;
use crate::waiting;
use crate::{config, trace};

/// How long the sold-out flag stands before it is rechecked.
const SOLD_OUT_RECHECK_MS: u64 = 3_000;
/// Stale sale summaries are served for up to this long when the origin fails.
const SUMMARY_STALE_MS: u64 = 600_000;
const ORIGIN_TIMEOUT_MS: u32 = 5_000;
pub(crate) const SUMMARY_TIMEOUT_MS: u32 = 2_000;
/// Bound on per-sale entries kept in isolate memory.
const MAX_CACHED_SALES: usize = 1_024;
const CACHE_HOST: &str = "https://edge-cache.flashsale.internal";
/// How long a held key is remembered: well past any hold (an hour is the
/// longest a sale's holds last in practice); after its hold is gone the
/// origin answers a replay `410 reservation_released` itself.
const HELD_KEY_TTL_S: u32 = 3_600;

type ApiResult<T> = std::result::Result<T, ApiError>;

thread_local! {
    static RINGS: RefCell<HashMap<&'static str, (String, Rc<KeyRing>)>> = RefCell::new(HashMap::new());
    /// The (user, admission) rings last found apart, so the check is one
    /// pointer comparison per request until a secret changes.
    static RINGS_APART: RefCell<Option<(Rc<KeyRing>, Rc<KeyRing>)>> = const { RefCell::new(None) };
    static SOLD_OUT: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
    static STALE_SUMMARY: RefCell<HashMap<String, (u64, Value)>> = RefCell::new(HashMap::new());
    /// Keys that got a hold through this isolate ([`api::held_key_name`]),
    /// with when: a replay of one after sell-out still reaches the origin.
    static HELD_KEYS: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
    /// Reservations one account may send to the origin: 10 per 10 s.
    static RESERVE_LIMIT: RefCell<Limiter> = RefCell::new(Limiter::new(10, 10_000, 100_000));
}

pub(crate) fn now_ms() -> u64 {
    js_sys::Date::now().max(0.0) as u64
}

fn bounded_insert<V>(map: &mut HashMap<String, V>, key: String, value: V) {
    if map.len() >= MAX_CACHED_SALES && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, value);
}

/// The key ring named `name` from the environment, parsed once per isolate.
pub(crate) fn ring(env: &Env, name: &'static str) -> ApiResult<Rc<KeyRing>> {
    let raw = env
        .secret(name)
        .map(|s| s.to_string())
        .or_else(|_| env.var(name).map(|v| v.to_string()))
        .map_err(|_| ApiError::new(500, "config_error", format!("{name} is not set")))?;
    if let Some(r) = RINGS.with(|m| {
        m.borrow()
            .get(name)
            .filter(|(text, _)| *text == raw)
            .map(|(_, r)| r.clone())
    }) {
        return Ok(r);
    }
    let parsed = Rc::new(
        KeyRing::parse(&raw)
            .map_err(|e| ApiError::new(500, "config_error", format!("{name}: {e}")))?,
    );
    RINGS.with(|m| m.borrow_mut().insert(name, (raw, parsed.clone())));
    Ok(parsed)
}

pub(crate) fn json_response(status: u16, body: &Value, cache: &str) -> Result<Response> {
    let headers = Headers::new();
    headers.set("content-type", "application/json; charset=utf-8")?;
    headers.set("cache-control", cache)?;
    Ok(Response::ok(body.to_string())?
        .with_status(status)
        .with_headers(headers))
}

fn error_response(e: &ApiError) -> Result<Response> {
    let headers = Headers::new();
    headers.set("content-type", "application/json; charset=utf-8")?;
    headers.set("cache-control", "no-store")?;
    if let Some(s) = e.retry_after {
        headers.set("retry-after", &s.to_string())?;
    }
    Ok(Response::ok(e.body())?
        .with_status(e.status)
        .with_headers(headers))
}

pub(crate) fn bearer_of(req: &Request) -> ApiResult<String> {
    let h = req.headers().get("authorization").ok().flatten();
    api::bearer(h.as_deref())
        .map(str::to_string)
        .ok_or_else(ApiError::token_missing)
}

fn origin_url(env: &Env) -> String {
    env.var("ORIGIN_URL")
        .map(|v| v.to_string())
        .unwrap_or_else(|_| "http://127.0.0.1:8080".to_string())
        .trim_end_matches('/')
        .to_string()
}

/// Sends with a timeout (an aborted fetch is an error like a refused one).
pub(crate) async fn send_with_timeout(f: Fetch, ms: u32) -> Result<Response> {
    let signal = AbortSignal::from(web_sys::AbortSignal::timeout_with_u32(ms));
    f.send_with_signal(&signal).await
}

/// The edge refuses to run misconfigured, like the origin refuses to start:
/// key rings that are missing, malformed or share a secret, or an unknown
/// `ADMISSION_CONTROL`, get a 500 `config_error` on every request (the
/// parses are cached per isolate, so this costs a pointer comparison once
/// the rings were found apart).
fn check_config(env: &Env) -> ApiResult<()> {
    let control = env.var("ADMISSION_CONTROL").ok().map(|v| v.to_string());
    crate::control::Mode::from_setting(control.as_deref())
        .map_err(|m| ApiError::new(500, "config_error", m))?;
    let users = ring(env, "USER_TOKEN_KEYS")?;
    let admission = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let known = RINGS_APART.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|(u, a)| Rc::ptr_eq(u, &users) && Rc::ptr_eq(a, &admission))
    });
    if !known {
        config::rings_apart(&users, &admission)
            .map_err(|m| ApiError::new(500, "config_error", m))?;
        RINGS_APART.with(|c| *c.borrow_mut() = Some((users, admission)));
    }
    Ok(())
}

fn health(env: &Env) -> ApiResult<Response> {
    let mut body =
        json!({"ok": true, "service": "edge", "time_ms": now_ms(), "dev_mode": dev_mode(env)});
    if let Some(why) = config::dev_mode_refusal(dev_mode_requested(env), &origin_url(env)) {
        body["dev_mode_refused"] = json!(why);
    }
    json_response(200, &body, "no-store").map_err(internal)
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    if let Err(e) = check_config(&env) {
        return error_response(&e);
    }
    let method = req.method().to_string();
    let path = req.path();
    let out = match api::route(&method, &path) {
        Route::Health => health(&env),
        Route::Ping => Response::ok("pong").map_err(internal),
        Route::Summary(sale) => summary(&env, &sale).await,
        Route::Join(sale) => waiting::join(&env, req, &sale).await,
        Route::Challenge(sale) => waiting::challenge(&env, &req, &sale, dev_mode(&env)).await,
        Route::Status(sale) => waiting::status(&env, &req, &sale).await,
        Route::Draw(sale) => waiting::draw_audit(&env, &req, &sale).await,
        Route::Receipt(sale) => waiting::receipt(&env, &req, &sale).await,
        Route::Metrics(sale) => waiting::metrics(&env, &sale).await,
        Route::Reserve(sale) => reserve(&env, req, &sale).await,
        Route::ReservationGet(id) => {
            forward_reservation(&env, req, Method::Get, &format!("/api/reservations/{id}")).await
        }
        Route::ReservationCancel(id) => {
            forward_reservation(
                &env,
                req,
                Method::Delete,
                &format!("/api/reservations/{id}"),
            )
            .await
        }
        Route::ReservationPurchase(id) => {
            forward_reservation(
                &env,
                req,
                Method::Post,
                &format!("/api/reservations/{id}/purchase"),
            )
            .await
        }
        Route::Page(sale) => page(&env, &sale).await,
        Route::DevToken if dev_mode(&env) => dev_token(&env, req).await,
        Route::DevPayment(id) if dev_mode(&env) => {
            forward(
                &env,
                req,
                Method::Post,
                &format!("/api/dev/payments/{id}/complete"),
            )
            .await
        }
        Route::DevBulk(sale) if dev_mode(&env) => waiting::bulk(&env, req, &sale).await,
        Route::DevForget if dev_mode(&env) => {
            SOLD_OUT.with(|m| m.borrow_mut().clear());
            STALE_SUMMARY.with(|m| m.borrow_mut().clear());
            waiting::forget_memory();
            json_response(200, &json!({"forgotten": true}), "no-store").map_err(internal)
        }
        Route::DevToken | Route::DevPayment(_) | Route::DevBulk(_) | Route::DevForget => {
            Err(ApiError::not_found())
        }
        Route::MethodNotAllowed => Err(ApiError::method_not_allowed()),
        Route::NotFound => Err(ApiError::not_found()),
    };
    match out {
        Ok(r) => Ok(r),
        Err(e) => error_response(&e),
    }
}

/// `DEV_MODE=1` (local runs only): the page may mint user tokens and
/// complete payments with the origin's dev provider. Honoured only with a
/// loopback `ORIGIN_URL` (see [`config::dev_mode_refusal`]): anywhere else
/// it would mint user tokens for anyone.
fn dev_mode(env: &Env) -> bool {
    dev_mode_requested(env) && config::dev_mode_refusal(true, &origin_url(env)).is_none()
}

fn dev_mode_requested(env: &Env) -> bool {
    env.var("DEV_MODE")
        .map(|v| v.to_string())
        .or_else(|_| env.secret("DEV_MODE").map(|v| v.to_string()))
        .is_ok_and(|v| v == "1" || v == "true")
}

/// The queue page (one HTML file for every sale; the script reads the sale
/// from the path). HTML is short-cached, its hashed assets long-cached.
async fn page(env: &Env, sale: &str) -> ApiResult<Response> {
    let assets = env.assets("ASSETS").map_err(internal)?;
    let mut r = assets
        .fetch("https://assets.local/sale", None)
        .await
        .map_err(internal)?;
    let status = r.status_code();
    let body = r.bytes().await.map_err(internal)?;
    let h = Headers::new();
    h.set("content-type", "text/html; charset=utf-8")
        .map_err(internal)?;
    h.set("cache-control", "public, max-age=30")
        .map_err(internal)?;
    // The security headers come from edge/public/_headers (one source, built
    // by edge/page/build.mjs), as for the page's assets.
    for name in [
        "content-security-policy",
        "referrer-policy",
        "x-content-type-options",
    ] {
        if let Ok(Some(v)) = r.headers().get(name) {
            let v = if name == "content-security-policy" && turnstile_sale(env, sale).await {
                botcheck::turnstile_csp(&v)
            } else {
                v
            };
            h.set(name, &v).map_err(internal)?;
        }
    }
    Ok(Response::from_bytes(body)
        .map_err(internal)?
        .with_status(status)
        .with_headers(h))
}

/// Whether `sale` asks for Turnstile (its page then loads Cloudflare's
/// widget, which the CSP must allow). An unknown or unreachable sale keeps
/// the strict CSP.
async fn turnstile_sale(env: &Env, sale: &str) -> bool {
    let v = match recent_summary(sale, 60_000) {
        Some(v) => v,
        None => match origin_summary(env, sale).await {
            Ok((v, _)) => v,
            Err(_) => return false,
        },
    };
    v["bot_check"].as_str() == Some("turnstile")
}

/// Dev mode only: a `user` token for a typed name (the shop's login in
/// production).
async fn dev_token(env: &Env, mut req: Request) -> ApiResult<Response> {
    let body = req.bytes().await.map_err(internal)?;
    let name = crate::bodies::dev_token_name(&body)?;
    let name = name.as_str();
    let ring = ring(env, "USER_TOKEN_KEYS")?;
    let claims = Claims::new(TokenType::User, name, None, now_ms() / 1000, 12 * 3600);
    json_response(
        200,
        &json!({"user_token": ring.sign(&claims), "sub": name, "exp": claims.exp}),
        "no-store",
    )
    .map_err(internal)
}

// ------------------------------------------------------------ sale summary

pub(crate) fn cache_key(kind: &str, sale: &str) -> String {
    format!("{CACHE_HOST}/{kind}/{sale}")
}

pub(crate) async fn cache_put_json(key: &str, status: u16, body: &str, max_age: u32) {
    let Ok(headers) = (|| -> Result<Headers> {
        let h = Headers::new();
        h.set("content-type", "application/json")?;
        h.set("cache-control", &format!("public, max-age={max_age}"))?;
        Ok(h)
    })() else {
        return;
    };
    if let Ok(r) = Response::ok(body.to_string()) {
        let _ = Cache::default()
            .put(key, r.with_status(status).with_headers(headers))
            .await;
    }
}

/// The origin's sale summary: Cache API (≤ 1 s), then origin, then a stale
/// copy from isolate memory. Returns the JSON and whether it is stale.
pub(crate) async fn origin_summary(env: &Env, sale: &str) -> ApiResult<(Value, bool)> {
    let key = cache_key("summary", sale);
    if let Ok(Some(mut r)) = Cache::default().get(key.as_str(), false).await {
        let st = r.status_code();
        if let Ok(text) = r.text().await {
            if st == 404 {
                return Err(ApiError::sale_not_found(sale));
            }
            if let Ok(v) = serde_json::from_str::<Value>(&text) {
                return Ok((v, false));
            }
        }
    }
    let url = format!("{}/api/sales/{}", origin_url(env), sale);
    let fetched = match worker::Url::parse(&url) {
        Ok(u) => send_with_timeout(Fetch::Url(u), SUMMARY_TIMEOUT_MS).await,
        Err(_) => {
            return Err(ApiError::new(
                500,
                "config_error",
                "ORIGIN_URL is not a URL",
            ));
        }
    };
    if let Ok(mut r) = fetched {
        let st = r.status_code();
        let text = r.text().await.unwrap_or_default();
        if st == 200
            && let Ok(v) = serde_json::from_str::<Value>(&text)
        {
            cache_put_json(&key, 200, &text, 1).await;
            let now = now_ms();
            STALE_SUMMARY
                .with(|m| bounded_insert(&mut m.borrow_mut(), sale.to_string(), (now, v.clone())));
            return Ok((v, false));
        }
        if st == 404 {
            cache_put_json(&key, 404, &ApiError::sale_not_found(sale).body(), 1).await;
            return Err(ApiError::sale_not_found(sale));
        }
    }
    let now = now_ms();
    STALE_SUMMARY
        .with(|m| {
            m.borrow()
                .get(sale)
                .filter(|(at, _)| now.saturating_sub(*at) < SUMMARY_STALE_MS)
                .map(|(_, v)| (v.clone(), true))
        })
        .ok_or_else(ApiError::origin_unavailable)
}

/// The origin's summary of `sale` if this isolate saw one in the last
/// `max_age_ms` (no wait on the origin).
pub(crate) fn recent_summary(sale: &str, max_age_ms: u64) -> Option<Value> {
    let now = now_ms();
    STALE_SUMMARY.with(|m| {
        m.borrow()
            .get(sale)
            .filter(|(at, _)| now.saturating_sub(*at) < max_age_ms)
            .map(|(_, v)| v.clone())
    })
}

fn summary_says_sold_out(v: &Value) -> bool {
    v["sold_out"].as_bool() == Some(true)
        || v["phase"].as_str() == Some("sold_out")
        || v["units_available"].as_u64() == Some(0)
}

async fn summary(env: &Env, sale: &str) -> ApiResult<Response> {
    let (mut body, stale) = origin_summary(env, sale).await?;
    if summary_says_sold_out(&body) {
        set_sold_out(sale).await;
    }
    // Queue figures are best effort: the summary stands without them.
    if let Ok(s) = waiting::snapshot_within(env, sale, 900).await {
        // The frontier people are admitted by (extrapolated from the
        // snapshot's checkpoint, as their polls are), so the figure is never
        // behind a place someone was just told is admitted.
        let admitted = crate::queue::frontier_at(&s, now_ms());
        body["queue"] = json!({
            "shards": s.shards,
            "entries": s.entries,
            "prequeue": s.prequeue,
            "placed": s.placed,
            "admitted": admitted,
            "waiting": s.placed.saturating_sub(admitted),
            "drawn": s.drawn,
            // The admission controller's current rate (the sale's
            // `admission_rate` is its ceiling), and whether it is held.
            "admission_rate": s.rate,
            "paused": s.paused,
            "frozen": s.frozen,
            // Places of people who arrived before this (unix ms) are final.
            "places_final_through_ms": s.fifo_through_ms,
            "do_requests": s.do_requests,
        });
        // The draw as the coordinator publishes it (DESIGN.md "The draw,
        // v2"): each part once known.
        let mut d = s.draw.clone();
        if !d.is_object() {
            d = json!({"commitment": s.commitment, "method": draw::METHOD});
        }
        d["audit"] = json!(format!("/api/sales/{sale}/draw"));
        d["receipt"] = json!(format!("/api/sales/{sale}/queue/receipt"));
        body["draw"] = d;
    }
    body["stale"] = json!(stale);
    json_response(200, &body, "public, max-age=1").map_err(internal)
}

// ------------------------------------------------------------ sold-out flag

pub(crate) fn set_sold_out_local(sale: &str) {
    let now = now_ms();
    SOLD_OUT.with(|m| bounded_insert(&mut m.borrow_mut(), sale.to_string(), now));
}

/// Whether `map` has `key` stamped (ms) less than `ttl_ms` ago.
fn stamped_within(map: &HashMap<String, u64>, key: &str, ttl_ms: u64) -> bool {
    let now = now_ms();
    map.get(key)
        .is_some_and(|at| now.saturating_sub(*at) < ttl_ms)
}

/// Whether the Cache API holds an answer under `key`.
async fn cached(key: &str) -> bool {
    matches!(Cache::default().get(key, false).await, Ok(Some(_)))
}

pub(crate) fn sold_out_local(sale: &str) -> bool {
    SOLD_OUT.with(|m| stamped_within(&m.borrow(), sale, SOLD_OUT_RECHECK_MS))
}

/// Records the flag in isolate memory and the Cache API (other isolates).
async fn set_sold_out(sale: &str) {
    set_sold_out_local(sale);
    cache_put_json(&cache_key("sold-out", sale), 200, "{\"sold_out\":true}", 3).await;
}

/// Remembers that a key got a hold ([`api::held_key_name`]), in isolate
/// memory and in the Cache API (the other isolates of this location).
async fn remember_held_key(name: &str) {
    HELD_KEYS.with(|m| bounded_insert(&mut m.borrow_mut(), name.to_string(), now_ms()));
    cache_put_json(&cache_key("held-key", name), 200, "{}", HELD_KEY_TTL_S).await;
}

/// Whether a key got a hold through this edge location.
async fn held_key_known(name: &str) -> bool {
    let ttl_ms = u64::from(HELD_KEY_TTL_S) * 1000;
    HELD_KEYS.with(|m| stamped_within(&m.borrow(), name, ttl_ms))
        || cached(&cache_key("held-key", name)).await
}

/// Whether the edge knows the sale is sold out; rechecks an old flag
/// against the (cached) summary, never with a reservation.
async fn sold_out_known(env: &Env, sale: &str) -> bool {
    if sold_out_local(sale) {
        return true;
    }
    if cached(&cache_key("sold-out", sale)).await {
        set_sold_out_local(sale);
        return true;
    }
    let was_flagged = SOLD_OUT.with(|m| m.borrow().contains_key(sale));
    if was_flagged {
        match origin_summary(env, sale).await {
            Ok((v, _)) if summary_says_sold_out(&v) => {
                set_sold_out(sale).await;
                return true;
            }
            Ok(_) => {
                SOLD_OUT.with(|m| m.borrow_mut().remove(sale));
            }
            // Origin down: keep refusing rather than stampede it.
            Err(_) => {
                set_sold_out_local(sale);
                return true;
            }
        }
    }
    false
}

// -------------------------------------------------------------- forwarding

/// Forwards to the origin with a request id (see [`trace::request_id`]),
/// echoes it to the caller and logs one access line (`wrangler dev` and
/// Workers logs show it).
async fn forward(env: &Env, mut req: Request, method: Method, path: &str) -> ApiResult<Response> {
    let started = now_ms();
    let header = |name: &str| req.headers().get(name).ok().flatten();
    let rid = trace::request_id(
        header("x-request-id").as_deref(),
        header("cf-ray").as_deref(),
        token::random_jti,
    );
    let log = |status: u16| {
        console_log!(
            "{}",
            trace::access_line(
                method.as_ref(),
                path,
                status,
                now_ms().saturating_sub(started),
                &rid
            )
        );
    };
    let headers = Headers::new();
    for name in ["authorization", "idempotency-key", "content-type", "accept"] {
        if let Ok(Some(v)) = req.headers().get(name) {
            headers.set(name, &v).map_err(internal)?;
        }
    }
    headers.set("x-request-id", &rid).map_err(internal)?;
    let mut init = RequestInit::new();
    init.with_method(method.clone()).with_headers(headers);
    if method == Method::Post {
        let body = req.bytes().await.unwrap_or_default();
        if body.len() > 16 * 1024 {
            return Err(ApiError::new(
                413,
                "body_too_large",
                "request body too large",
            ));
        }
        let arr = js_sys::Uint8Array::from(body.as_slice());
        init.with_body(Some(arr.into()));
    }
    let url = format!("{}{}", origin_url(env), path);
    let out = Request::new_with_init(&url, &init).map_err(internal)?;
    let Ok(mut resp) = send_with_timeout(Fetch::Request(out), ORIGIN_TIMEOUT_MS).await else {
        let e = ApiError::origin_unavailable();
        log(e.status);
        return Err(e);
    };
    let status = resp.status_code();
    log(status);
    let body = resp.bytes().await.unwrap_or_default();
    let h = Headers::new();
    for name in [
        "content-type",
        "location",
        "retry-after",
        "idempotent-replayed",
    ] {
        if let Ok(Some(v)) = resp.headers().get(name) {
            h.set(name, &v).map_err(internal)?;
        }
    }
    h.set("cache-control", "no-store").map_err(internal)?;
    h.set("x-request-id", &rid).map_err(internal)?;
    Ok(Response::from_bytes(body)
        .map_err(internal)?
        .with_status(status)
        .with_headers(h))
}

async fn reserve(env: &Env, req: Request, sale: &str) -> ApiResult<Response> {
    let token = bearer_of(&req)?;
    let admits = ring(env, "ADMISSION_TOKEN_KEYS")?;
    let claims = admits
        .verify(
            &token,
            Expect {
                typ: TokenType::Admit,
                sale: Some(sale),
            },
            now_ms() / 1000,
        )
        .map_err(ApiError::token)?;
    let idem = req.headers().get("idempotency-key").ok().flatten();
    let held = api::held_key_name(sale, &claims.sub, idem.as_deref());
    if sold_out_known(env, sale).await {
        let replay = match &held {
            Some(name) => held_key_known(name).await,
            None => false,
        };
        if !replay {
            let mut r = error_response(&ApiError::sold_out()).map_err(internal)?;
            let _ = r.headers_mut().set("x-edge-sold-out", "1");
            return Ok(r);
        }
    }
    let key = format!("{sale}/{}", claims.sub);
    if let Err(wait_ms) = RESERVE_LIMIT.with(|l| l.borrow_mut().check(&key, now_ms())) {
        let secs = u32::try_from(wait_ms.div_ceil(1000)).unwrap_or(u32::MAX);
        return Err(ApiError::new(
            429,
            "too_many_requests",
            "too many reservation attempts from this account; retry later",
        )
        .retry_after(secs));
    }
    let mut resp = forward(
        env,
        req,
        Method::Post,
        &format!("/api/sales/{sale}/reservations"),
    )
    .await?;
    if resp.status_code() == 202 {
        // A person with a live hold never loses the turn (issue 13 #4).
        waiting::tell_held(env, sale, &claims.sub).await;
        if let Some(name) = &held {
            remember_held_key(name).await;
        }
    }
    if resp.status_code() == 410 && gone_says_sold_out(&mut resp).await {
        set_sold_out(sale).await;
        // Tell the queue so every waiting person hears it at once.
        waiting::tell_sold_out(env, sale).await;
    }
    Ok(resp)
}

/// Whether the origin's 410 is `sold_out` (read from a copy of the answer,
/// which is passed on untouched). See [`api::gone_means_sold_out`].
async fn gone_says_sold_out(resp: &mut Response) -> bool {
    match resp.cloned() {
        Ok(mut copy) => copy
            .bytes()
            .await
            .is_ok_and(|b| api::gone_means_sold_out(&b)),
        Err(_) => false,
    }
}

/// Reservation calls accept an `admit` or a `user` token; the origin checks
/// the reservation belongs to that account.
async fn forward_reservation(
    env: &Env,
    req: Request,
    method: Method,
    path: &str,
) -> ApiResult<Response> {
    let token = bearer_of(&req)?;
    let now = now_ms() / 1000;
    if !token::is_v1(&token) {
        // A JWT can only be a shop's user token.
        ring(env, "USER_TOKEN_KEYS")?
            .verify_user(&token, now)
            .map_err(ApiError::token)?;
        return forward(env, req, method, path).await;
    }
    let admit = ring(env, "ADMISSION_TOKEN_KEYS")?.verify(
        &token,
        Expect {
            typ: TokenType::Admit,
            sale: None,
        },
        now,
    );
    if let Err(admit_err) = admit {
        let user = ring(env, "USER_TOKEN_KEYS")?.verify_user(&token, now);
        if let Err(user_err) = user {
            // Report the more telling of the two refusals.
            let e = match admit_err {
                TokenError::UnknownKid | TokenError::WrongType => user_err,
                other => other,
            };
            let e = if e == TokenError::UnknownKid && admit_err == TokenError::WrongType {
                admit_err
            } else {
                e
            };
            return Err(ApiError::token(e));
        }
    }
    forward(env, req, method, path).await
}
