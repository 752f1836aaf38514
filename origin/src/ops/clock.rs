//! The wall clock, as the origin's tokens, webhook signatures and operator
//! commands read it: one place, below every part that asks.
//!
//! Hold lifetimes do not follow this clock: the Lua scripts take Redis's
//! own time, so an origin whose clock is off neither expires holds early
//! nor late (origin/tests/clock.rs).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Unix seconds now.
pub fn now_secs() -> u64 {
    now_ms() / 1000
}
