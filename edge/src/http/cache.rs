//! The Cache API and isolate memory as caches (Wasm only): cache keys,
//! JSON entries with a lifetime, and bounded per-sale maps.
//!
//! Invariants kept here: isolate memory is only ever a cache (a panic or
//! eviction wipes it), and each map is bounded (full, it is cleared, never
//! grown); a Cache API entry lives at most its `max-age`.

use std::collections::HashMap;

use worker::{Cache, Headers, Response, Result};

use crate::http::respond::now_ms;

/// Bound on per-sale entries kept in isolate memory.
pub(crate) const MAX_CACHED_SALES: usize = 1_024;

const CACHE_HOST: &str = "https://edge-cache.flashsale.internal";

/// Inserts into a per-sale map of isolate memory, clearing it when full.
pub(crate) fn bounded_insert<V>(map: &mut HashMap<String, V>, key: String, value: V) {
    if map.len() >= MAX_CACHED_SALES && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, value);
}

/// The Cache API key of `kind` for `sale` (or a piece id).
pub(crate) fn cache_key(kind: &str, sale: &str) -> String {
    format!("{CACHE_HOST}/{kind}/{sale}")
}

/// Puts a JSON answer into the Cache API for `max_age` seconds (best
/// effort: a failed put is a cache miss later).
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

/// Whether the Cache API holds an answer under `key`.
pub(crate) async fn cached(key: &str) -> bool {
    matches!(Cache::default().get(key, false).await, Ok(Some(_)))
}

/// Whether `map` has `key` stamped (ms) less than `ttl_ms` ago.
pub(crate) fn stamped_within(map: &HashMap<String, u64>, key: &str, ttl_ms: u64) -> bool {
    let now = now_ms();
    map.get(key)
        .is_some_and(|at| now.saturating_sub(*at) < ttl_ms)
}
