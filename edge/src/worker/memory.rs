//! What the Worker keeps of the queue in isolate memory (Wasm only):
//! bounded per-key maps, and the tickets of joins this isolate answered.
//!
//! Invariant kept here: isolate memory is only ever a cache (a panic or
//! eviction wipes it), every map is bounded (full, it is cleared), and a
//! remembered ticket answers a repeated join only while it has more than
//! an hour to live and the join brings no bot check to spend.

use std::cell::RefCell;
use std::collections::HashMap;

/// Bound on per-sale entries kept in isolate memory.
pub(crate) const MAX_SALES: usize = 1_024;

/// Bound on cached pieces (buckets, seconds) kept in isolate memory.
pub(crate) const MAX_BUCKETS: usize = 4_096;

/// Bound on remembered joins and seen accounts.
pub(crate) const MAX_JOINED: usize = 100_000;

thread_local! {
    /// `sale/sub` → (ticket, exp) of joins this isolate answered.
    static JOINED: RefCell<HashMap<String, (String, u64)>> = RefCell::new(HashMap::new());
}

/// Inserts into a map of isolate memory, clearing it when full.
pub(crate) fn bounded<V>(map: &mut HashMap<String, V>, max: usize, key: String, value: V) {
    if map.len() >= max && !map.contains_key(&key) {
        map.clear();
    }
    map.insert(key, value);
}

/// Remembers the ticket (expiring at `exp`, unix s) this isolate handed
/// `sub` for `sale`.
pub(crate) fn remember_join(sale: &str, sub: &str, ticket: &str, exp: u64) {
    JOINED.with(|m| {
        bounded(
            &mut m.borrow_mut(),
            MAX_JOINED,
            format!("{sale}/{sub}"),
            (ticket.to_string(), exp),
        )
    });
}

/// The ticket this isolate handed `sub` for `sale`, if a repeated join at
/// `now` may be answered with it: one without a bot check to spend, while
/// the ticket has more than an hour to live.
pub(crate) fn known_join(sale: &str, sub: &str, bot_checked: bool, now: u64) -> Option<String> {
    JOINED.with(|m| {
        m.borrow()
            .get(&format!("{sale}/{sub}"))
            .filter(|(_, exp)| !bot_checked && *exp > now / 1000 + 3600)
            .map(|(t, _)| t.clone())
    })
}

/// Forgets the remembered joins (DEV_MODE hook).
pub(crate) fn forget_memory() {
    JOINED.with(|m| m.borrow_mut().clear());
}
