//! The origin as the Worker reads it (Wasm only): its URL, fetches with a
//! timeout, and the sale summary (Cache API ≤ 1 s, then origin, then a
//! stale copy).
//!
//! Invariants kept here: the origin's sale summary is cached (Cache API)
//! for at most 1 s, and a stale copy (at most `SUMMARY_STALE_MS` old) is
//! served, marked, when the origin sheds or fails; a 404 is cached as one,
//! so an unknown sale costs the origin one request a second per location.

use std::cell::RefCell;
use std::collections::HashMap;

use serde_json::Value;
use worker::{AbortSignal, Cache, Env, Fetch, Response, Result, web_sys};

use crate::api::error::{ApiError, ApiResult};
use crate::draw::phases::DRAW_GRACE_MS;
use crate::http::cache::{bounded_insert, cache_key, cache_put_json};
use crate::http::respond::now_ms;

/// Stale sale summaries are served for up to this long when the origin fails.
const SUMMARY_STALE_MS: u64 = 600_000;

/// How long the Worker waits for the origin's summary.
pub(crate) const SUMMARY_TIMEOUT_MS: u32 = 2_000;

// A join on its way when the start comes must reach its shard before the
// draw freezes the pre-queue (see `DRAW_GRACE_MS`).
const _: () = assert!(DRAW_GRACE_MS >= SUMMARY_TIMEOUT_MS as u64 + 1_000);

thread_local! {
    static STALE_SUMMARY: RefCell<HashMap<String, (u64, Value)>> = RefCell::new(HashMap::new());
}

/// The origin's base URL (`ORIGIN_URL`, without a trailing slash).
pub(crate) fn origin_url(env: &Env) -> String {
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
                // This isolate's memory keeps it too (`recent_summary`: the
                // per-SKU outlook of a status poll reads it from there).
                let now = now_ms();
                STALE_SUMMARY.with(|m| {
                    bounded_insert(&mut m.borrow_mut(), sale.to_string(), (now, v.clone()))
                });
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

/// Forgets the stale summaries of this isolate (DEV_MODE hook: the next
/// request behaves as in a fresh isolate).
pub(crate) fn forget_memory() {
    STALE_SUMMARY.with(|m| m.borrow_mut().clear());
}
