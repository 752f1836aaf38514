//! The sale's settings as the Worker routes joins by (Wasm only).
//!
//! Invariant kept here: a join never waits on a stalled origin for a sale
//! this isolate saw in the last minute (the queue settings are fixed once
//! people may join); an unknown sale is refused before any object exists
//! for it.

use worker::{Env, js_sys};

use crate::api::error::ApiResult;
use crate::api::summary::SaleCfg;
use crate::http::origin::{origin_summary, recent_summary};

/// A time of the origin's summary (RFC 3339) in unix ms, as `Date.parse`
/// reads it.
pub(crate) fn parse_time(text: &str) -> Option<u64> {
    let ms = js_sys::Date::parse(text);
    ms.is_finite().then(|| ms.max(0.0) as u64)
}

/// The sale's settings from the origin's summary: one this isolate saw in
/// the last minute (sales do not disappear, and the queue settings are
/// fixed once people may join), else the origin's (cached ≤ 1 s; a 404
/// refuses the join before any object exists for it).
pub(crate) async fn sale_cfg(env: &Env, sale: &str) -> ApiResult<SaleCfg> {
    let v = match recent_summary(sale, 60_000) {
        Some(v) => v,
        None => origin_summary(env, sale).await?.0,
    };
    SaleCfg::read(&v, parse_time)
}
