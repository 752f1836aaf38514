//! How the Worker and the Durable Objects call each other (Wasm only):
//! JSON both ways, the `x-sale` header, the answer of an object's `fetch`.
//!
//! Invariants kept here:
//! - an object's error answer keeps its status and `{"error":{code,…}}`
//!   shape through the caller; an object that cannot be reached is a 503
//!   with `Retry-After`, never a panic.

use serde_json::Value;
use worker::{Env, Headers, Method, Request, RequestInit, Response};

use crate::api::error::{ApiError, ApiResult};
use crate::api::routes;
use crate::http::respond::internal;

/// Calls object `name` of namespace `binding` at `path` (JSON both ways).
pub async fn call_object(
    env: &Env,
    binding: &str,
    name: &str,
    sale: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> ApiResult<Value> {
    let stub = env
        .durable_object(binding)
        .and_then(|ns| ns.id_from_name(name).and_then(|id| id.get_stub()))
        .map_err(internal)?;
    let headers = Headers::new();
    headers.set("x-sale", sale).map_err(internal)?;
    headers
        .set("content-type", "application/json")
        .map_err(internal)?;
    let mut init = RequestInit::new();
    init.with_method(method).with_headers(headers);
    if let Some(b) = body {
        init.with_body(Some(b.to_string().into()));
    }
    let req =
        Request::new_with_init(&format!("https://queue-object{path}"), &init).map_err(internal)?;
    let mut resp = stub.fetch_with_request(req).await.map_err(|_| {
        ApiError::new(503, "queue_unavailable", "the queue is busy, try again").retry_after(1)
    })?;
    let status = resp.status_code();
    let text = resp.text().await.map_err(internal)?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|_| ApiError::new(502, "queue_error", "the queue answered garbage"))?;
    if status >= 400 {
        let code = v["error"]["code"].as_str().unwrap_or("queue_error");
        let msg = v["error"]["message"].as_str().unwrap_or("queue error");
        let mut e = ApiError::new(status, code, msg);
        if status == 503 {
            e = e.retry_after(1);
        }
        return Err(e);
    }
    Ok(v)
}

/// The sale a call to an object is about (its `x-sale` header: a valid
/// id, or a 400).
pub fn sale_of(req: &Request) -> ApiResult<String> {
    req.headers()
        .get("x-sale")
        .ok()
        .flatten()
        .filter(|s| routes::valid_id(s))
        .ok_or_else(|| ApiError::new(400, "bad_request", "x-sale missing"))
}

/// A JSON answer from an object's `fetch`.
pub fn respond(result: ApiResult<Value>) -> worker::Result<Response> {
    let (status, body) = match result {
        Ok(v) => (200, v.to_string()),
        Err(e) => (e.status, e.body()),
    };
    let h = Headers::new();
    h.set("content-type", "application/json")?;
    Ok(Response::ok(body)?.with_status(status).with_headers(h))
}
