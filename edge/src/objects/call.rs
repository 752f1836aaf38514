//! What the Durable Objects and the Worker share (Wasm only): calling an
//! object with JSON, and a small write-through key/value table.
//!
//! Invariants kept here:
//! - an object's error answer keeps its status and `{"error":{code,…}}`
//!   shape through the caller; an object that cannot be reached is a 503
//!   with `Retry-After`, never a panic;
//! - [`Meta`] is the only writer of its table, so its memory copy cannot go
//!   stale, and writing a value equal to the stored one writes nothing
//!   (reads that re-assert a setting stay write-free).

use std::cell::RefCell;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;
use worker::{Env, Headers, Method, Request, RequestInit, Response, SqlStorage, SqlStorageValue};

use crate::api::error::{ApiError, ApiResult};
use crate::api::routes;
use crate::http::respond::internal;

/// A storage error as the API answers it: a 500 `queue_storage`.
pub fn sql_err(e: worker::Error) -> ApiError {
    ApiError::new(500, "queue_storage", format!("queue storage error: {e}"))
}

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

/// One admitted person's turn as both the shards' and the coordinator's
/// `turns` tables store it (SQLite numbers come back as `f64`).
#[derive(Deserialize)]
pub(crate) struct TurnRow {
    pub place: f64,
    pub seen_ms: f64,
    pub held: f64,
}

#[derive(Deserialize)]
struct KvRow {
    k: String,
    v: String,
}

/// A `meta (k, v)` table with a write-through copy in memory.
#[derive(Default)]
pub struct Meta {
    map: RefCell<HashMap<String, String>>,
}

impl Meta {
    /// Creates the table if needed and loads it.
    pub fn load(&self, sql: &SqlStorage) -> ApiResult<()> {
        sql.exec(
            "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
            None,
        )
        .map_err(sql_err)?;
        let rows = sql
            .exec("SELECT k, v FROM meta", None)
            .map_err(sql_err)?
            .to_array::<KvRow>()
            .map_err(sql_err)?;
        *self.map.borrow_mut() = rows.into_iter().map(|r| (r.k, r.v)).collect();
        Ok(())
    }

    pub fn get(&self, k: &str) -> Option<String> {
        self.map.borrow().get(k).cloned()
    }

    pub fn u64(&self, k: &str) -> Option<u64> {
        self.get(k).and_then(|v| v.parse().ok())
    }

    pub fn f64(&self, k: &str) -> Option<f64> {
        self.get(k).and_then(|v| v.parse().ok())
    }

    pub fn flag(&self, k: &str) -> bool {
        self.get(k).as_deref() == Some("1")
    }

    pub fn set(&self, sql: &SqlStorage, k: &str, v: impl ToString) -> ApiResult<()> {
        let v = v.to_string();
        if self.map.borrow().get(k) == Some(&v) {
            return Ok(());
        }
        sql.exec(
            "INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            Some(vec![k.into(), SqlStorageValue::from(v.as_str())]),
        )
        .map_err(sql_err)?;
        self.map.borrow_mut().insert(k.to_string(), v);
        Ok(())
    }

    pub fn delete(&self, sql: &SqlStorage, k: &str) -> ApiResult<()> {
        if self.map.borrow_mut().remove(k).is_some() {
            sql.exec("DELETE FROM meta WHERE k = ?", Some(vec![k.into()]))
                .map_err(sql_err)?;
        }
        Ok(())
    }
}
