//! Answers as the Worker sends them (Wasm only): JSON bodies, the
//! documented error shape with `Retry-After`, the clock, and small request
//! helpers.
//!
//! Invariant kept here: every answer is JSON with the documented error
//! shape (`api::error::ApiError::body`), marked `no-store` when it is an
//! error, so no cache ever keeps a refusal.

use serde_json::Value;
use worker::{Headers, Response, Result, js_sys};

use crate::api::error::ApiError;

pub(crate) fn now_ms() -> u64 {
    js_sys::Date::now().max(0.0) as u64
}

/// A runtime error as the API answers it: a 500 `internal`.
pub(crate) fn internal(e: worker::Error) -> ApiError {
    ApiError::new(500, "internal", format!("edge error: {e}"))
}

pub(crate) fn json_response(status: u16, body: &Value, cache: &str) -> Result<Response> {
    let headers = Headers::new();
    headers.set("content-type", "application/json; charset=utf-8")?;
    headers.set("cache-control", cache)?;
    Ok(Response::ok(body.to_string())?
        .with_status(status)
        .with_headers(headers))
}

pub(crate) fn error_response(e: &ApiError) -> Result<Response> {
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

/// The request's body, at most `max` bytes: refused (413) by its
/// `Content-Length` before a byte is read, and while streaming once it
/// passes `max` (`api::bodies::Limited`).
pub(crate) async fn body_limited(
    req: &mut worker::Request,
    max: usize,
) -> Result<Vec<u8>, ApiError> {
    use futures::StreamExt;
    let declared = req.headers().get("content-length").ok().flatten();
    let mut body = crate::api::bodies::Limited::new(max, declared.as_deref())?;
    let Ok(mut stream) = req.stream() else {
        // No body at all.
        return Ok(Vec::new());
    };
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(internal)?;
        body.push(&chunk)?;
    }
    Ok(body.into_bytes())
}

/// Query parameter `name` of a URL.
pub(crate) fn query(url: &worker::Url, name: &str) -> Option<String> {
    url.query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}
