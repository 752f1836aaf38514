//! A fixed-window request limiter, per key (an account in a sale).
//!
//! Role: the edge's first line for invariant 8 (bounded origin load). The
//! frontier bounds how many people may reserve; this bounds how often one
//! admitted person may send a reservation to the origin, so one script
//! holding an admit token cannot turn into a flood.
//!
//! Invariants kept here:
//! - at most `limit` requests are allowed per key in any window of
//!   `window_ms` starting at the key's first request;
//! - memory stays bounded: at most `max_keys` keys are remembered (expired
//!   windows are dropped first; if every window is live, a new key is
//!   refused until one ends — never are live budgets wiped, which would
//!   fail open).

use std::collections::HashMap;

#[derive(Debug)]
pub struct Limiter {
    pub limit: u32,
    pub window_ms: u64,
    pub max_keys: usize,
    windows: HashMap<String, (u64, u32)>,
}

impl Limiter {
    pub fn new(limit: u32, window_ms: u64, max_keys: usize) -> Self {
        Limiter {
            limit,
            window_ms,
            max_keys,
            windows: HashMap::new(),
        }
    }

    /// `Ok(())` if allowed (and counted), else `Err(ms until allowed)`.
    pub fn check(&mut self, key: &str, now_ms: u64) -> Result<(), u64> {
        if self.windows.len() >= self.max_keys && !self.windows.contains_key(key) {
            let w = self.window_ms;
            self.windows
                .retain(|_, (start, _)| now_ms.saturating_sub(*start) < w);
            if self.windows.len() >= self.max_keys {
                // Full of live windows: refuse the newcomer until the oldest
                // window ends. Dropping windows instead would hand every
                // dropped key a fresh budget (fail open, against invariant 8).
                let oldest = self.windows.values().map(|(start, _)| *start).min();
                let until = oldest.map_or(w, |s| (s + w).saturating_sub(now_ms));
                return Err(until.max(1));
            }
        }
        let entry = self.windows.entry(key.to_string()).or_insert((now_ms, 0));
        if now_ms.saturating_sub(entry.0) >= self.window_ms {
            *entry = (now_ms, 0);
        }
        if entry.1 >= self.limit {
            return Err((entry.0 + self.window_ms).saturating_sub(now_ms).max(1));
        }
        entry.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_limit_per_window_then_refuses_until_it_ends() {
        let mut l = Limiter::new(3, 10_000, 100);
        for _ in 0..3 {
            assert_eq!(l.check("a", 1_000), Ok(()));
        }
        assert_eq!(l.check("a", 2_000), Err(9_000));
        assert_eq!(l.check("b", 2_000), Ok(()), "keys are independent");
        assert_eq!(l.check("a", 11_000), Ok(()), "a new window");
    }

    /// A full map must not wipe budgets (that would fail open: every
    /// account that used its budget could send `limit` more at once): a
    /// new key waits until a window ends, old keys keep their counts.
    #[test]
    fn a_full_map_refuses_new_keys_and_keeps_every_budget() {
        let mut l = Limiter::new(2, 10_000, 3);
        for k in ["a", "b", "c"] {
            assert_eq!(l.check(k, 1_000), Ok(()));
            assert_eq!(l.check(k, 1_000), Ok(()));
        }
        assert_eq!(
            l.check("d", 2_000),
            Err(9_000),
            "no room: wait for a window to end"
        );
        assert_eq!(l.check("a", 2_000), Err(9_000), "a's budget is still spent");
        assert!(l.windows.len() <= 3);
        assert_eq!(l.check("d", 11_000), Ok(()), "expired windows make room");
        assert_eq!(l.check("a", 11_000), Ok(()), "a new window for a");
    }

    #[test]
    fn memory_is_bounded() {
        let mut l = Limiter::new(1, 1_000, 10);
        for i in 0..1_000 {
            let _ = l.check(&format!("k{i}"), i);
        }
        assert!(l.windows.len() <= 10);
    }
}
