//! A fixed-window request limiter, per key (an account in a sale), and the
//! keys and bindings of the per-address join limit (issue 19).
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
use std::net::{IpAddr, Ipv6Addr};

/// The per-address join limits a sale may choose (joins per address per
/// minute, `origin sale create … --join-limit`). Cloudflare's rate-limiting
/// binding counts across isolates but its limit is fixed in configuration,
/// so each choice is one binding (`JOIN_LIMIT_<n>` in wrangler.toml).
pub const JOIN_LIMITS: [u64; 5] = [10, 30, 100, 300, 1000];
/// The limit of a sale whose summary names none (an older origin).
pub const DEFAULT_JOIN_LIMIT: u64 = 1000;
/// The bindings' period: what a refused join is told to wait, at most.
pub const JOIN_LIMIT_PERIOD_S: u32 = 60;

/// The rate-limiting binding that enforces `limit` joins per minute, or
/// `None` when the sale names a limit this edge has no binding for (0, no
/// limit, is the caller's to skip).
pub fn join_limit_binding(limit: u64) -> Option<&'static str> {
    Some(match limit {
        10 => "JOIN_LIMIT_10",
        30 => "JOIN_LIMIT_30",
        100 => "JOIN_LIMIT_100",
        300 => "JOIN_LIMIT_300",
        1000 => "JOIN_LIMIT_1000",
        _ => return None,
    })
}

/// The key one address's joins of one sale are counted under. An IPv6
/// address counts as its /64 (one subscriber's usual share: counting each
/// address would give one machine 2^64 budgets); anything that does not
/// parse counts under one shared key, so garbage buys no fresh budget.
pub fn join_limit_key(sale: &str, addr: Option<&str>) -> String {
    let who = match addr.map(str::trim).and_then(|a| a.parse::<IpAddr>().ok()) {
        Some(IpAddr::V4(v4)) => v4.to_string(),
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        None => "unknown".to_string(),
    };
    format!("join:{sale}:{who}")
}

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
    fn join_limits_have_bindings_and_others_do_not() {
        for l in JOIN_LIMITS {
            let b = join_limit_binding(l).unwrap();
            assert_eq!(b, format!("JOIN_LIMIT_{l}"));
        }
        assert!(join_limit_binding(DEFAULT_JOIN_LIMIT).is_some());
        for l in [0, 1, 50, 1001, u64::MAX] {
            assert_eq!(join_limit_binding(l), None);
        }
    }

    #[test]
    fn addresses_are_keyed_per_sale_v4_as_is_v6_by_64() {
        assert_eq!(
            join_limit_key("d", Some("203.0.113.7")),
            "join:d:203.0.113.7"
        );
        assert_eq!(
            join_limit_key("e", Some("203.0.113.7")),
            "join:e:203.0.113.7"
        );
        let a = join_limit_key("d", Some("2001:db8:1:2:aaaa::1"));
        assert_eq!(a, "join:d:2001:db8:1:2::/64");
        assert_eq!(a, join_limit_key("d", Some("2001:db8:1:2:ffff:1:2:3")));
        assert_ne!(a, join_limit_key("d", Some("2001:db8:1:3::1")));
        assert_eq!(
            join_limit_key("d", Some("::ffff:203.0.113.7")),
            "join:d:203.0.113.7"
        );
        // Missing or garbage: one shared key, never a fresh one per spelling.
        for junk in [
            None,
            Some(""),
            Some("x"),
            Some("1.2.3.4, 5.6.7.8"),
            Some("é"),
        ] {
            assert_eq!(join_limit_key("d", junk), "join:d:unknown", "{junk:?}");
        }
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
