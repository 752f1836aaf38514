//! The Worker's calls to a sale's queue objects (Wasm only): the
//! coordinator, a shard, and the two things the reservation path tells
//! them.
//!
//! Invariant kept here: telling is best effort — a lost `held` or
//! `sold_out` is made up by the next poll or the coordinator's own
//! summary fetch, so no reservation waits on it failing.

use serde_json::{Value, json};
use worker::{Env, Method};

use crate::api::error::ApiResult;
use crate::objects::call::call_object;
use crate::queue::shards;
use crate::worker::sale::sale_cfg;

/// Calls the sale's coordinator.
pub(crate) async fn call_coordinator(
    env: &Env,
    sale: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> ApiResult<Value> {
    call_object(env, "SALE_QUEUE", sale, sale, method, path, body).await
}

/// Calls shard `k` of the sale.
pub(crate) async fn call_shard(
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
