//! The sold-out flag and the keys that got a hold (Wasm only): what lets
//! the edge answer a reservation of a sold-out sale itself.
//!
//! Invariants kept here:
//! - once the edge knows a sale is sold out (an origin `410 sold_out`, no
//!   other 410; the summary; or the queue coordinator) the flag stands for
//!   3 s in isolate memory and the Cache API, and is then rechecked against
//!   the summary, never by sending a reservation; with the origin down it
//!   keeps standing rather than stampede it;
//! - a key this edge passed a `202` for (`api::routes::held_key_name`) is
//!   remembered for an hour, so its replay still reaches the origin;
//! - a SKU the origin said is sold out (`410 sku_sold_out`) is flagged for
//!   3 s on its own (`sale/sku`), never the sale: the sale's other SKUs
//!   keep selling, and admission goes on.

use std::cell::RefCell;
use std::collections::HashMap;

use worker::Env;

use crate::api::summary::says_sold_out;
use crate::http::cache::{bounded_insert, cache_key, cache_put_json, cached, stamped_within};
use crate::http::origin::origin_summary;
use crate::http::respond::now_ms;

/// How long the sold-out flag stands before it is rechecked.
const SOLD_OUT_RECHECK_MS: u64 = 3_000;

/// How long a held key is remembered: well past any hold (an hour is the
/// longest a sale's holds last in practice); after its hold is gone the
/// origin answers a replay `410 reservation_released` itself.
const HELD_KEY_TTL_S: u32 = 3_600;

thread_local! {
    static SOLD_OUT: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
    /// Keys that got a hold through this isolate
    /// (`api::routes::held_key_name`), with when: a replay of one after
    /// sell-out still reaches the origin.
    static HELD_KEYS: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
}

/// Flags the sale sold out in isolate memory only.
pub(crate) fn set_sold_out_local(sale: &str) {
    let now = now_ms();
    SOLD_OUT.with(|m| bounded_insert(&mut m.borrow_mut(), sale.to_string(), now));
}

/// Whether this isolate flagged the sale sold out in the last 3 s.
pub(crate) fn sold_out_local(sale: &str) -> bool {
    SOLD_OUT.with(|m| stamped_within(&m.borrow(), sale, SOLD_OUT_RECHECK_MS))
}

/// Records the flag in isolate memory and the Cache API (other isolates).
pub(crate) async fn set_sold_out(sale: &str) {
    set_sold_out_local(sale);
    cache_put_json(&cache_key("sold-out", sale), 200, "{\"sold_out\":true}", 3).await;
}

/// The flag's name for one SKU of a sale.
fn sku_flag(sale: &str, sku: &str) -> String {
    format!("{sale}/{sku}")
}

/// Flags one SKU sold out (an origin `410 sku_sold_out`) in isolate memory
/// and the Cache API, for 3 s: the reservations for that SKU meanwhile are
/// answered here. Then the flag lapses and the next one asks the origin,
/// whose own per-SKU flag answers without Redis: at most about one origin
/// request per SKU per 3 s per isolate, the rest of the sale untouched.
pub(crate) async fn set_sku_sold_out(sale: &str, sku: &str) {
    let name = sku_flag(sale, sku);
    let now = now_ms();
    SOLD_OUT.with(|m| bounded_insert(&mut m.borrow_mut(), name.clone(), now));
    cache_put_json(&cache_key("sold-out", &name), 200, "{\"sold_out\":true}", 3).await;
}

/// Whether the edge flagged this SKU sold out in the last 3 s.
pub(crate) async fn sku_sold_out_known(sale: &str, sku: &str) -> bool {
    let name = sku_flag(sale, sku);
    if SOLD_OUT.with(|m| stamped_within(&m.borrow(), &name, SOLD_OUT_RECHECK_MS)) {
        return true;
    }
    if cached(&cache_key("sold-out", &name)).await {
        let now = now_ms();
        SOLD_OUT.with(|m| bounded_insert(&mut m.borrow_mut(), name, now));
        return true;
    }
    false
}

/// Remembers that a key got a hold ([`routes::held_key_name`]), in isolate
/// memory and in the Cache API (the other isolates of this location).
pub(crate) async fn remember_held_key(name: &str) {
    HELD_KEYS.with(|m| bounded_insert(&mut m.borrow_mut(), name.to_string(), now_ms()));
    cache_put_json(&cache_key("held-key", name), 200, "{}", HELD_KEY_TTL_S).await;
}

/// Whether a key got a hold through this edge location.
pub(crate) async fn held_key_known(name: &str) -> bool {
    let ttl_ms = u64::from(HELD_KEY_TTL_S) * 1000;
    HELD_KEYS.with(|m| stamped_within(&m.borrow(), name, ttl_ms))
        || cached(&cache_key("held-key", name)).await
}

/// Whether the edge knows the sale is sold out; rechecks an old flag
/// against the (cached) summary, never with a reservation.
pub(crate) async fn sold_out_known(env: &Env, sale: &str) -> bool {
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
            Ok((v, _)) if says_sold_out(&v) => {
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

/// Forgets the sold-out flags of this isolate (DEV_MODE hook: the next
/// request behaves as in a fresh isolate).
pub(crate) fn forget_memory() {
    SOLD_OUT.with(|m| m.borrow_mut().clear());
}
