//! The Worker's calls to a sale's queue objects (Wasm only): the
//! coordinator, a shard, and the three things the reservation path tells
//! them (a hold granted, a hold cancelled, sold out).
//!
//! Invariant kept here: telling is best effort — a lost `held` or
//! `sold_out` is made up by the next poll or the coordinator's own
//! summary fetch, and a lost `released` leaves the turn protected until
//! the hold's own expiry, so no reservation waits on it failing.

use serde_json::{Value, json};
use worker::{Env, Method};

use crate::api::error::ApiResult;
use crate::api::reservation::{Cancelled, Granted};
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

/// Tells the account's shard it made a reservation: a person whose hold
/// may still exist (until `expires_at`) does not lose the turn.
pub(crate) async fn tell_held(env: &Env, sale: &str, sub: &str, hold: Option<&Granted>) {
    let body = json!({
        "sub": sub,
        "reservation": hold.map(|h| h.reservation_id.as_str()),
        "until_ms": hold.and_then(|h| h.expires_at_ms),
    });
    tell_shard(env, sale, sub, "/held", &body).await;
}

/// Tells the account's shard it cancelled a reservation: that hold no
/// longer protects the turn.
pub(crate) async fn tell_released(env: &Env, sub: &str, c: &Cancelled) {
    let body = json!({"sub": sub, "reservation": c.reservation_id});
    tell_shard(env, &c.sale, sub, "/released", &body).await;
}

/// Tells the account's shard its admission ended (an origin answer's
/// `Flashsale-Command: revoke`): the turn is passed on at once.
pub(crate) async fn tell_revoked(env: &Env, sale: &str, sub: &str) {
    tell_shard(env, sale, sub, "/revoke", &json!({ "sub": sub })).await;
}

async fn tell_shard(env: &Env, sale: &str, sub: &str, path: &str, body: &Value) {
    let Ok(cfg) = sale_cfg(env, sale).await else {
        return;
    };
    let k = shards::shard_of(sub, cfg.shards);
    let _ = call_shard(env, sale, k, Method::Post, path, Some(body)).await;
}
