//! The origin's load signal (issue 13): what the edge's admission controller
//! reads to follow the origin — reservations accepted per second, the share
//! shed (429) and failed (503/5xx), and the reservation handler's p99, over
//! the last [`WINDOW_SECS`] seconds of this replica.
//!
//! Published in the sale summary (`health`) and, compactly, on every
//! reservation answer (`x-origin-load`), so the edge learns it from traffic
//! it already makes. Per replica: behind a load balancer the edge samples
//! the replicas it reaches, which is what it needs (any replica shedding is
//! a reason to slow down).
//!
//! Cost on the hot path: one uncontended lock and a few increments per
//! reservation; the summary is computed at most once per [`SIGNAL_EVERY`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Seconds the signal looks back.
pub const WINDOW_SECS: usize = 10;
/// How often the compact header text is recomputed.
pub const SIGNAL_EVERY: Duration = Duration::from_millis(200);

/// Latency bucket upper bounds (ms) for the window's p99.
const BOUNDS_MS: [f64; 16] = [
    0.5,
    1.0,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    25.0,
    50.0,
    75.0,
    100.0,
    250.0,
    500.0,
    1000.0,
    f64::INFINITY,
];

/// How one reservation request ended, for the signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// 202 (a new hold or a replay).
    Accepted,
    /// 429: the origin shed it.
    Shed,
    /// 503 or any 5xx: the origin or its stores failed.
    Failed,
    /// Any other answer (410 sold out, 409 limit, 4xx): the origin was fine.
    Other,
}

#[derive(Debug, Clone, Copy, Default)]
struct Second {
    /// Which second (since the window's epoch) this slot holds.
    at: u64,
    accepted: u64,
    shed: u64,
    failed: u64,
    total: u64,
    latency: [u64; BOUNDS_MS.len()],
}

/// What the edge reads.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Signal {
    pub window_s: u64,
    pub requests_per_s: f64,
    pub accepted_per_s: f64,
    /// Shed (429) answers ÷ all reservation answers; 0 with no traffic.
    pub shed_share: f64,
    /// 503/5xx answers ÷ all reservation answers.
    pub error_share: f64,
    /// The handler's p99 (ms, bucket upper bound); 0 with no traffic.
    pub p99_ms: f64,
}

impl Signal {
    /// `x-origin-load`: `rps=…;acc=…;shed=…;err=…;p99=…`.
    pub fn header(&self) -> String {
        format!(
            "rps={:.1};acc={:.1};shed={:.3};err={:.3};p99={}",
            self.requests_per_s,
            self.accepted_per_s,
            self.shed_share,
            self.error_share,
            self.p99_ms
        )
    }
}

/// A ring of per-second slots.
pub struct LoadWindow {
    epoch: Instant,
    slots: Mutex<[Second; WINDOW_SECS]>,
    cached: Mutex<Option<(Instant, String)>>,
}

impl Default for LoadWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl LoadWindow {
    pub fn new() -> Self {
        LoadWindow {
            epoch: Instant::now(),
            slots: Mutex::new([Second::default(); WINDOW_SECS]),
            cached: Mutex::new(None),
        }
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_secs() + 1
    }

    /// Records one reservation answer and how long it took.
    pub fn record(&self, ended: Ended, took: Duration) {
        self.record_at(Instant::now(), ended, took);
    }

    pub fn record_at(&self, now: Instant, ended: Ended, took: Duration) {
        let at = self.second(now);
        let ms = took.as_secs_f64() * 1e3;
        let bucket = BOUNDS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(BOUNDS_MS.len() - 1);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut slots[(at as usize) % WINDOW_SECS];
        if slot.at != at {
            *slot = Second {
                at,
                ..Second::default()
            };
        }
        slot.total += 1;
        match ended {
            Ended::Accepted => slot.accepted += 1,
            Ended::Shed => slot.shed += 1,
            Ended::Failed => slot.failed += 1,
            Ended::Other => {}
        }
        slot.latency[bucket] += 1;
    }

    /// The signal over the last [`WINDOW_SECS`] complete-or-current seconds.
    pub fn signal(&self) -> Signal {
        self.signal_at(Instant::now())
    }

    pub fn signal_at(&self, now: Instant) -> Signal {
        let at = self.second(now);
        let slots = *self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let live = slots
            .iter()
            .filter(|s| s.at > 0 && s.at + (WINDOW_SECS as u64) > at && s.at <= at);
        let (mut total, mut accepted, mut shed, mut failed) = (0u64, 0u64, 0u64, 0u64);
        let mut latency = [0u64; BOUNDS_MS.len()];
        for s in live {
            total += s.total;
            accepted += s.accepted;
            shed += s.shed;
            failed += s.failed;
            for (l, n) in latency.iter_mut().zip(s.latency) {
                *l += n;
            }
        }
        // The window covers the seconds the process has lived, at most WINDOW_SECS.
        let span = (at.min(WINDOW_SECS as u64)) as f64;
        let share = |n: u64| {
            if total == 0 {
                0.0
            } else {
                n as f64 / total as f64
            }
        };
        let p99_ms = if total == 0 {
            0.0
        } else {
            let want = (total as f64 * 0.99).ceil() as u64;
            let mut seen = 0;
            let mut p = BOUNDS_MS[BOUNDS_MS.len() - 2];
            for (i, n) in latency.iter().enumerate() {
                seen += n;
                if seen >= want {
                    // The open last bucket reports its lower bound.
                    p = if i == BOUNDS_MS.len() - 1 {
                        BOUNDS_MS[i - 1]
                    } else {
                        BOUNDS_MS[i]
                    };
                    break;
                }
            }
            p
        };
        Signal {
            window_s: WINDOW_SECS as u64,
            requests_per_s: total as f64 / span,
            accepted_per_s: accepted as f64 / span,
            shed_share: share(shed),
            error_share: share(failed),
            p99_ms,
        }
    }

    /// The compact header text, recomputed at most every [`SIGNAL_EVERY`].
    pub fn header(&self) -> String {
        let now = Instant::now();
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, text)) = cached.as_ref()
            && now.saturating_duration_since(*at) < SIGNAL_EVERY
        {
            return text.clone();
        }
        let text = self.signal_at(now).header();
        *cached = Some((now, text.clone()));
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn empty_window_says_nothing_is_wrong() {
        let w = LoadWindow::new();
        let s = w.signal();
        assert_eq!(
            (s.requests_per_s, s.shed_share, s.error_share, s.p99_ms),
            (0.0, 0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn shares_rates_and_p99_over_the_window() {
        let w = LoadWindow::new();
        let t0 = w.epoch;
        // Ten seconds: each 90 accepted at 1 ms, 8 shed at 2 ms, 2 failed at 40 ms.
        for sec in 0..10u64 {
            let now = t0 + Duration::from_secs(sec);
            for _ in 0..90 {
                w.record_at(now, Ended::Accepted, MS);
            }
            for _ in 0..8 {
                w.record_at(now, Ended::Shed, 2 * MS);
            }
            for _ in 0..2 {
                w.record_at(now, Ended::Failed, 40 * MS);
            }
        }
        let s = w.signal_at(t0 + Duration::from_millis(9_500));
        assert_eq!(s.requests_per_s, 100.0);
        assert_eq!(s.accepted_per_s, 90.0);
        assert!((s.shed_share - 0.08).abs() < 1e-9);
        assert!((s.error_share - 0.02).abs() < 1e-9);
        assert_eq!(
            s.p99_ms, 50.0,
            "the 99th percentile falls in the 25-50 ms bucket"
        );
        assert!(
            s.header()
                .starts_with("rps=100.0;acc=90.0;shed=0.080;err=0.020;p99=50")
        );
    }

    #[test]
    fn old_seconds_leave_the_window() {
        let w = LoadWindow::new();
        let t0 = w.epoch;
        for _ in 0..100 {
            w.record_at(t0, Ended::Shed, 300 * MS);
        }
        let later = t0 + Duration::from_secs(WINDOW_SECS as u64 + 1);
        w.record_at(later, Ended::Accepted, MS);
        let s = w.signal_at(later);
        assert_eq!(s.shed_share, 0.0, "the shed second is out of the window");
        assert_eq!(s.p99_ms, 1.0);
        assert_eq!(s.accepted_per_s, 0.1);
    }
}
