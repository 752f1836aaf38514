//! The admission frontier: how many places in line have been let through.
//!
//! Role: a pure state machine, advanced by the sale's Durable Object each
//! time it is asked (lazily, no timer needed), persisted as JSON between
//! requests. Place `p` is admitted once `floor(admitted) >= p`.
//!
//! Invariants kept here:
//! - the frontier never moves before `starts_at` and never moves backwards;
//! - it grows at most at `rate` places per second of wall time: time in
//!   which it could not move (nobody waiting, sold out, no inventory) is not
//!   banked, so a burst of late joiners is still let in at `rate`;
//! - it never passes the number of people placed in line;
//! - it stops while the sale is sold out and resumes when units come back;
//! - inventory-aware: people whose admission window (the `admit` token
//!   lifetime) is still open never exceed `factor × units_available`
//!   (everyone admitted within the window counts, except `freed`: turns
//!   given back by people who walked away, and people who already made a
//!   reservation — their unit has left `units_available` already), so
//!   nobody is let in to buy what is gone;
//! - with no inventory figure yet (origin never answered) it does not move.

use serde::{Deserialize, Serialize};

/// The sale's admission settings (from the origin's sale summary).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// People per second.
    pub rate: f64,
    /// `k`: admitted-but-not-yet-holding people per unit available.
    pub factor: f64,
    /// Length of one person's admission window (the admit token TTL), ms.
    pub window_ms: u64,
}

/// What the Durable Object knows when it advances the frontier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Inputs {
    pub now_ms: u64,
    pub starts_at_ms: u64,
    /// People who have a place (drawn pre-queue + joined after start).
    pub placed: u64,
    /// Units still available (origin summary), if known.
    pub units_available: Option<u64>,
    pub sold_out: bool,
    /// Admitted people whose window is still open who need no share of the
    /// inventory cap any more: they lost the turn (`turns`), or they hold
    /// (their unit is already out of `units_available`).
    pub freed: u64,
}

/// Checkpoints are kept about once a second.
const CHECKPOINT_EVERY_MS: u64 = 1_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Frontier {
    /// Places admitted so far (fractional: grows continuously).
    pub admitted: f64,
    /// Last time the frontier was advanced, unix ms (0 = never).
    pub last_ms: u64,
    /// `(unix ms, admitted)` history covering at least one window.
    pub checkpoints: Vec<(u64, f64)>,
}

impl Frontier {
    /// Whole places admitted.
    pub fn admitted_places(&self) -> u64 {
        self.admitted.floor().max(0.0) as u64
    }

    /// The frontier as it was one window ago: places at or below it have
    /// had their admission window close. Conservative (never too high).
    pub fn expired_at(&self, now_ms: u64, window_ms: u64) -> f64 {
        let cutoff = now_ms.saturating_sub(window_ms);
        self.checkpoints
            .iter()
            .rev()
            .find(|(t, _)| *t <= cutoff)
            .map(|(_, f)| *f)
            .unwrap_or(0.0)
    }

    /// How far the frontier may go with these inputs (people placed, the
    /// inventory cap), and the rate it moves at meanwhile (0: it cannot).
    pub fn ceiling(&self, p: Params, inp: Inputs) -> (f64, f64) {
        let expired = self.expired_at(inp.now_ms, p.window_ms);
        let inventory_cap = match inp.units_available {
            Some(units) => expired + inp.freed as f64 + p.factor.max(0.0) * units as f64,
            None => self.admitted,
        };
        let cap = (inp.placed as f64).min(inventory_cap).max(self.admitted);
        let moving = inp.now_ms >= inp.starts_at_ms
            && !inp.sold_out
            && p.rate.is_finite()
            && p.rate > 0.0
            && cap > self.admitted;
        (cap, if moving { p.rate } else { 0.0 })
    }

    /// Advances the frontier to `inp.now_ms`.
    pub fn advance(&mut self, p: Params, inp: Inputs) {
        if inp.now_ms < inp.starts_at_ms {
            return;
        }
        let from = self.last_ms.max(inp.starts_at_ms);
        if inp.now_ms > from && !inp.sold_out && p.rate.is_finite() && p.rate > 0.0 {
            let dt = (inp.now_ms - from) as f64 / 1000.0;
            let expired = self.expired_at(inp.now_ms, p.window_ms);
            let inventory_cap = match inp.units_available {
                Some(units) => expired + inp.freed as f64 + p.factor.max(0.0) * units as f64,
                None => self.admitted,
            };
            let target = (self.admitted + p.rate * dt)
                .min(inp.placed as f64)
                .min(inventory_cap);
            if target > self.admitted {
                self.admitted = target;
            }
        }
        self.last_ms = self.last_ms.max(inp.now_ms);
        self.checkpoint(inp.now_ms, p.window_ms);
    }

    fn checkpoint(&mut self, now_ms: u64, window_ms: u64) {
        let due = self
            .checkpoints
            .last()
            .is_none_or(|(t, _)| now_ms >= t + CHECKPOINT_EVERY_MS);
        // Within a second the first value stands: the expired frontier read
        // from it can only be too low, never too high.
        if due {
            self.checkpoints.push((now_ms, self.admitted));
        }
        // Keep one checkpoint at or before the oldest cutoff still needed.
        let cutoff = now_ms.saturating_sub(window_ms);
        let keep_from = self
            .checkpoints
            .iter()
            .rposition(|(t, _)| *t <= cutoff)
            .unwrap_or(0);
        if keep_from > 0 {
            self.checkpoints.drain(..keep_from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        rate: 10.0,
        factor: 2.0,
        window_ms: 120_000,
    };

    fn inp(now_ms: u64, placed: u64, units: Option<u64>, sold_out: bool) -> Inputs {
        Inputs {
            now_ms,
            starts_at_ms: 100_000,
            placed,
            units_available: units,
            sold_out,
            freed: 0,
        }
    }

    #[test]
    fn nothing_before_start_then_rate() {
        let mut f = Frontier::default();
        f.advance(P, inp(50_000, 1000, Some(1000), false));
        assert_eq!(f.admitted_places(), 0);
        f.advance(P, inp(100_000, 1000, Some(1000), false));
        assert_eq!(f.admitted_places(), 0);
        f.advance(P, inp(103_000, 1000, Some(1000), false));
        assert_eq!(f.admitted_places(), 30);
        f.advance(P, inp(103_500, 1000, Some(1000), false));
        assert_eq!(f.admitted_places(), 35);
        // Time does not run backwards.
        f.advance(P, inp(101_000, 1000, Some(1000), false));
        assert_eq!(f.admitted_places(), 35);
    }

    #[test]
    fn idle_time_is_not_banked() {
        let mut f = Frontier::default();
        f.advance(P, inp(110_000, 5, Some(1000), false));
        assert_eq!(f.admitted_places(), 5, "capped by people in line");
        // 500 people arrive at once: still only rate per second.
        f.advance(P, inp(111_000, 505, Some(1000), false));
        assert_eq!(f.admitted_places(), 15);
    }

    #[test]
    fn stops_when_sold_out_and_resumes() {
        let mut f = Frontier::default();
        f.advance(P, inp(102_000, 1000, Some(1000), false));
        assert_eq!(f.admitted_places(), 20);
        f.advance(P, inp(105_000, 1000, Some(0), true));
        assert_eq!(f.admitted_places(), 20);
        f.advance(P, inp(106_000, 1000, Some(1000), false));
        assert_eq!(f.admitted_places(), 30, "resumes at rate, no banked burst");
    }

    #[test]
    fn inventory_caps_admitted_within_window() {
        let mut f = Frontier::default();
        // 3 units left, k = 2: at most 6 people in an open window.
        f.advance(P, inp(110_000, 1000, Some(3), false));
        assert_eq!(f.admitted_places(), 6);
        f.advance(P, inp(150_000, 1000, Some(3), false));
        assert_eq!(f.admitted_places(), 6);
        // Once the first window has closed, 6 more may come in.
        f.advance(P, inp(231_000, 1000, Some(3), false));
        assert_eq!(f.admitted_places(), 12);
        // No inventory figure: no movement.
        f.advance(P, inp(400_000, 1000, None, false));
        assert_eq!(f.admitted_places(), 12);
    }

    #[test]
    fn abandoned_turns_free_the_cap_for_the_next_people() {
        let mut f = Frontier::default();
        // 3 units, k = 2: 6 people in an open window, then stuck.
        f.advance(P, inp(110_000, 1000, Some(3), false));
        f.advance(P, inp(150_000, 1000, Some(3), false));
        assert_eq!(f.admitted_places(), 6);
        // Two of them walked away: two more may come in.
        let freed = Inputs {
            freed: 2,
            ..inp(151_000, 1000, Some(3), false)
        };
        f.advance(P, freed);
        assert_eq!(f.admitted_places(), 8);
        assert_eq!(f.ceiling(P, freed).0, 8.0);
    }

    #[test]
    fn expired_frontier_trails_by_one_window() {
        let mut f = Frontier::default();
        for s in 0..=300u64 {
            f.advance(
                P,
                inp(100_000 + s * 1000, 1_000_000, Some(1_000_000), false),
            );
        }
        assert_eq!(f.admitted_places(), 3000);
        let e = f.expired_at(400_000, P.window_ms);
        assert!((1790.0..=1800.0).contains(&e), "{e}");
        assert!(f.checkpoints.len() <= 125, "history is pruned");
    }

    #[test]
    fn ceiling_is_what_advance_reaches() {
        let mut f = Frontier::default();
        f.advance(P, inp(100_300, 1000, Some(3), false));
        let (cap, rate) = f.ceiling(P, inp(100_300, 1000, Some(3), false));
        assert_eq!((cap, rate), (6.0, 10.0));
        let mut g = f.clone();
        g.advance(P, inp(110_000, 1000, Some(3), false));
        assert_eq!(g.admitted, cap);
        assert_eq!(
            g.ceiling(P, inp(110_000, 1000, Some(3), false)).1,
            0.0,
            "at the cap"
        );
        assert_eq!(f.ceiling(P, inp(100_300, 1000, Some(3), true)).1, 0.0);
        assert_eq!(f.ceiling(P, inp(50_000, 1000, Some(3), false)).1, 0.0);
    }

    #[test]
    fn survives_json_round_trip() {
        let mut f = Frontier::default();
        f.advance(P, inp(104_000, 1000, Some(1000), false));
        let back: Frontier = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
    }
}
