//! The admission rate controller (issue 13): the frontier's rate follows the
//! origin's load signal (`health` in the sale summary the coordinator
//! fetches once a second) instead of a fixed rate. (The origin also puts a
//! compact copy, `x-origin-load`, on reservation answers; the controller
//! does not need it: one sample a second is its step.) Pure: the
//! coordinator feeds it samples and the clock, and stores what it returns.
//!
//! AIMD, as TCP does for the same reason (find the most a shared server
//! takes without a model of it):
//! - **additive increase**: while the origin is healthy (a sample at most
//!   [`FRESH_MS`] old; an older one holds the rate) the rate grows by
//!   `ceiling × INCREASE_PER_S` people/s every second, up to the sale's
//!   `admission_rate` (a ceiling, never passed);
//! - **multiplicative decrease**: a sample with sheds or errors above
//!   [`BAD_SHARE`], or a p99 over the sale's target, multiplies the rate by
//!   [`DECREASE`] — at most once per [`DECREASE_EVERY_MS`], so one bad
//!   second seen through several samples is one step, not several;
//! - **freeze**: while the origin does not answer, nobody is admitted and
//!   the outage is counted ([`Controller::frozen_ms`]) so that windows open
//!   meanwhile are extended by it (a window opened at `t0` with the counter
//!   at `F0` ends at `t0 + W + (F(now) − F0)`); a pause freezes the same way;
//! - the rate never falls below [`FLOOR_SHARE`] of the ceiling while
//!   the origin answers, so the controller keeps probing;
//! - a sale opens at its ceiling (the operator's `admission_rate`, which
//!   they chose as safe for their origin) and backs off from there; an
//!   operator's change of the ceiling keeps the rate's share of it (a
//!   controller at the old ceiling is at the new one).
//!
//! The coordinator runs the frontier on a *service clock* (wall time less
//! [`Controller::frozen_ms_at`]): it stands still while frozen, so a
//! window measured on it is extended by every outage and pause.
//!
//! Invariants: `0 < rate ≤ ceiling` when not frozen; while frozen the
//! frontier does not move; the frozen counter only grows.

use serde::{Deserialize, Serialize};

/// Share of answers shed or failed above which the rate backs off.
pub const BAD_SHARE: f64 = 0.01;
/// The multiplicative decrease.
pub const DECREASE: f64 = 0.7;
/// The additive increase, as a share of the ceiling per second.
pub const INCREASE_PER_S: f64 = 0.05;
/// The lowest rate while the origin answers, as a share of the ceiling.
pub const FLOOR_SHARE: f64 = 0.02;
/// At most one decrease per this many milliseconds.
pub const DECREASE_EVERY_MS: u64 = 1_000;
/// A sample older than this counts as "the origin does not answer".
pub const STALE_AFTER_MS: u64 = 5_000;
/// Only a sample at most this old lets the rate grow (an older one holds it).
pub const FRESH_MS: u64 = 2_000;

/// One reading of the origin's health.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// When the origin answered with it (ms).
    pub at_ms: u64,
    pub shed_share: f64,
    pub error_share: f64,
    pub p99_ms: f64,
}

/// Why the rate is what it is (for operators: a metric label and a log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Start,
    Increase,
    AtCeiling,
    Shedding,
    Errors,
    Slow,
    OriginDown,
    Paused,
}

impl Reason {
    /// Every reason, for metrics that list them all.
    pub const ALL: [Reason; 8] = [
        Reason::Start,
        Reason::Increase,
        Reason::AtCeiling,
        Reason::Shedding,
        Reason::Errors,
        Reason::Slow,
        Reason::OriginDown,
        Reason::Paused,
    ];

    /// The reason as a metric label (the same as its JSON name).
    pub fn label(self) -> &'static str {
        match self {
            Reason::Start => "start",
            Reason::Increase => "increase",
            Reason::AtCeiling => "at_ceiling",
            Reason::Shedding => "shedding",
            Reason::Errors => "errors",
            Reason::Slow => "slow",
            Reason::OriginDown => "origin_down",
            Reason::Paused => "paused",
        }
    }
}

/// The controller's state; stored by the coordinator between steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Controller {
    /// People per second the frontier advances at (when not frozen).
    pub rate: f64,
    pub reason: Reason,
    /// Total milliseconds the frontier has been frozen (outage or pause).
    pub frozen_ms: u64,
    pub frozen: bool,
    last_step_ms: u64,
    last_decrease_ms: u64,
    /// The ceiling of the last step (0: none yet), to rescale the rate
    /// when an operator changes it.
    #[serde(default)]
    ceiling: f64,
}

/// How the rate is chosen: the Worker's `ADMISSION_CONTROL` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// AIMD on the origin's health, frozen while it does not answer.
    #[default]
    Adaptive,
    /// The sale's `admission_rate` whatever the origin says, as before
    /// issue 13: only a pause holds the frontier. A switch for an operator
    /// who finds the controller misjudges their origin, and the baseline
    /// the simulator compares the controller with.
    Fixed,
}

impl Mode {
    /// Reads the setting: unset or `adaptive`, or `fixed`; anything else is
    /// a configuration error (the edge refuses to run on it).
    pub fn from_setting(v: Option<&str>) -> Result<Mode, String> {
        match v.map(str::trim) {
            None | Some("") | Some("adaptive") => Ok(Mode::Adaptive),
            Some("fixed") => Ok(Mode::Fixed),
            Some(other) => Err(format!(
                "ADMISSION_CONTROL is {other:?}: expected \"adaptive\" or \"fixed\""
            )),
        }
    }
}

/// The sale's settings the controller needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// The sale's `admission_rate`: never exceeded.
    pub ceiling: f64,
    /// The sale's p99 target for the reservation path (ms).
    pub p99_target_ms: f64,
    /// Adaptive, or fixed at the ceiling.
    pub mode: Mode,
}

impl Controller {
    /// Starts at the ceiling: the operator's rate is what they judged
    /// their origin takes; the controller only ever slows below it.
    pub fn new(limits: Limits, now_ms: u64) -> Self {
        Controller {
            rate: limits.ceiling,
            reason: Reason::Start,
            frozen_ms: 0,
            frozen: false,
            last_step_ms: now_ms,
            last_decrease_ms: 0,
            ceiling: limits.ceiling,
        }
    }

    /// The frozen counter extrapolated to `now_ms` (the time since the last
    /// step counts as frozen while frozen): what the service clock
    /// subtracts from wall time.
    pub fn frozen_ms_at(&self, now_ms: u64) -> u64 {
        if self.frozen {
            self.frozen_ms + now_ms.saturating_sub(self.last_step_ms)
        } else {
            self.frozen_ms
        }
    }

    /// One step at `now_ms`, with the latest sample (if any) and whether an
    /// operator paused the sale.
    pub fn step(&mut self, limits: Limits, now_ms: u64, sample: Option<Sample>, paused: bool) {
        if !(limits.ceiling.is_finite() && limits.ceiling > 0.0) {
            // Never divided by, never clamped to: the step is skipped.
            return;
        }
        let dt = now_ms.saturating_sub(self.last_step_ms);
        self.last_step_ms = now_ms.max(self.last_step_ms);
        if self.ceiling > 0.0 && self.ceiling != limits.ceiling {
            self.rate *= limits.ceiling / self.ceiling;
        }
        self.ceiling = limits.ceiling;
        let fixed = limits.mode == Mode::Fixed;
        let answering =
            fixed || sample.is_some_and(|s| now_ms.saturating_sub(s.at_ms) <= STALE_AFTER_MS);
        if paused || !answering {
            if self.frozen {
                self.frozen_ms += dt;
            }
            self.frozen = true;
            self.reason = if paused {
                Reason::Paused
            } else {
                Reason::OriginDown
            };
            return;
        }
        let mut grow_ms = dt;
        if self.frozen {
            // The step that ends a freeze counts the time up to now as
            // frozen, and grows nothing for it.
            self.frozen_ms += dt;
            self.frozen = false;
            grow_ms = 0;
        }
        if fixed {
            self.rate = limits.ceiling;
            self.reason = Reason::AtCeiling;
            return;
        }
        let floor = limits.ceiling * FLOOR_SHARE;
        let s = sample.expect("answering implies a sample");
        let bad = if s.shed_share > BAD_SHARE {
            Some(Reason::Shedding)
        } else if s.error_share > BAD_SHARE {
            Some(Reason::Errors)
        } else if s.p99_ms > limits.p99_target_ms {
            Some(Reason::Slow)
        } else {
            None
        };
        match bad {
            Some(why) => {
                if now_ms.saturating_sub(self.last_decrease_ms) >= DECREASE_EVERY_MS {
                    self.rate = (self.rate * DECREASE).max(floor);
                    self.last_decrease_ms = now_ms;
                }
                self.reason = why;
            }
            None if now_ms.saturating_sub(s.at_ms) > FRESH_MS => {}
            None => {
                let grown = self.rate + limits.ceiling * INCREASE_PER_S * grow_ms as f64 / 1000.0;
                self.rate = grown.min(limits.ceiling);
                self.reason = if self.rate >= limits.ceiling {
                    Reason::AtCeiling
                } else {
                    Reason::Increase
                };
            }
        }
        self.rate = self.rate.clamp(floor, limits.ceiling);
    }

    /// People per second the frontier advances at now (0 while frozen).
    pub fn effective_rate(&self) -> f64 {
        if self.frozen { 0.0 } else { self.rate }
    }

    /// When a window opened at `opened_ms`, with the frozen counter then at
    /// `frozen_then`, ends: its length plus every frozen millisecond since.
    pub fn window_end_ms(&self, opened_ms: u64, frozen_then: u64, window_ms: u64) -> u64 {
        opened_ms + window_ms + self.frozen_ms.saturating_sub(frozen_then)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        ceiling: 100.0,
        p99_target_ms: 50.0,
        mode: Mode::Adaptive,
    };

    fn healthy(at_ms: u64) -> Option<Sample> {
        Some(Sample {
            at_ms,
            shed_share: 0.0,
            error_share: 0.0,
            p99_ms: 5.0,
        })
    }

    fn run(c: &mut Controller, from: u64, to: u64, f: impl Fn(u64) -> Option<Sample>) {
        let mut t = from;
        while t <= to {
            c.step(L, t, f(t), false);
            t += 250;
        }
    }

    #[test]
    fn climbs_additively_to_the_ceiling_and_never_past_it() {
        let mut c = Controller::new(L, 0);
        assert_eq!(c.rate, 100.0, "opens at the ceiling");
        c.rate = 10.0;
        run(&mut c, 0, 10_000, healthy);
        // 10 + 5/s × 10 s = 60.
        assert!((c.rate - 60.0).abs() < 1e-6, "{}", c.rate);
        assert_eq!(c.reason, Reason::Increase);
        run(&mut c, 10_000, 60_000, healthy);
        assert_eq!(c.rate, 100.0);
        assert_eq!(c.reason, Reason::AtCeiling);
    }

    #[test]
    fn backs_off_multiplicatively_once_per_second_on_sheds_errors_or_slowness() {
        for (bad, why) in [
            (
                Sample {
                    at_ms: 0,
                    shed_share: 0.2,
                    error_share: 0.0,
                    p99_ms: 5.0,
                },
                Reason::Shedding,
            ),
            (
                Sample {
                    at_ms: 0,
                    shed_share: 0.0,
                    error_share: 0.05,
                    p99_ms: 5.0,
                },
                Reason::Errors,
            ),
            (
                Sample {
                    at_ms: 0,
                    shed_share: 0.0,
                    error_share: 0.0,
                    p99_ms: 80.0,
                },
                Reason::Slow,
            ),
        ] {
            let mut c = Controller::new(L, 0);
            c.rate = 100.0;
            // Four steps within one second: one decrease.
            for t in [1_000, 1_250, 1_500, 1_750] {
                c.step(L, t, Some(Sample { at_ms: t, ..bad }), false);
            }
            assert!((c.rate - 70.0).abs() < 1e-9, "{why:?}: {}", c.rate);
            assert_eq!(c.reason, why);
            c.step(
                L,
                2_000,
                Some(Sample {
                    at_ms: 2_000,
                    ..bad
                }),
                false,
            );
            assert!((c.rate - 49.0).abs() < 1e-9);
            // Never below the floor.
            run(&mut c, 2_000, 60_000, |t| Some(Sample { at_ms: t, ..bad }));
            assert_eq!(c.rate, 2.0);
        }
    }

    #[test]
    fn a_silent_origin_freezes_the_frontier_and_windows_grow_by_the_outage() {
        let mut c = Controller::new(L, 0);
        c.rate = 10.0;
        run(&mut c, 0, 5_000, healthy);
        let (opened, frozen_then) = (5_000, c.frozen_ms);
        // The last answer at 5 s: the rate grows while it is fresh (to 7 s),
        // holds until it is stale (10 s), then the frontier freezes.
        run(&mut c, 5_250, 9_000, |_| healthy(5_000));
        let held = c.rate;
        assert!((held - 45.0).abs() < 1e-6, "{held}");
        run(&mut c, 9_250, 30_000, |_| healthy(5_000));
        assert!(c.frozen && c.effective_rate() == 0.0);
        assert_eq!(c.reason, Reason::OriginDown);
        assert_eq!(c.rate, held, "a freeze neither grows nor shrinks the rate");
        // It answers again at 30.25 s.
        run(&mut c, 30_250, 31_000, healthy);
        assert!(!c.frozen);
        // Frozen from the first stale step (10.25 s) to 30.25 s: 20 s.
        assert_eq!(c.frozen_ms, 20_000);
        assert_eq!(c.frozen_ms_at(40_000), 20_000, "not frozen: no growth");
        assert_eq!(
            c.window_end_ms(opened, frozen_then, 120_000),
            5_000 + 120_000 + 20_000
        );
    }

    #[test]
    fn a_pause_holds_exactly() {
        let mut c = Controller::new(L, 0);
        run(&mut c, 0, 2_000, healthy);
        let rate = c.rate;
        for t in (2_250..=12_000).step_by(250) {
            c.step(L, t, healthy(t), true);
            assert_eq!(c.effective_rate(), 0.0);
            assert_eq!(c.reason, Reason::Paused);
        }
        // Between steps the service clock stands still too.
        assert_eq!(c.frozen_ms_at(12_000), 9_750);
        assert_eq!(c.frozen_ms_at(12_200), 9_950);
        c.step(L, 12_250, healthy(12_250), false);
        assert_eq!(c.rate, rate, "a pause changes no rate");
        assert_eq!(c.frozen_ms, 10_000);
    }

    #[test]
    fn fixed_mode_keeps_the_ceiling_through_sheds_and_outages_and_holds_only_for_a_pause() {
        let fixed = Limits {
            mode: Mode::Fixed,
            ..L
        };
        let shedding = |t| {
            Some(Sample {
                at_ms: t,
                shed_share: 0.5,
                error_share: 0.5,
                p99_ms: 5_000.0,
            })
        };
        let mut c = Controller::new(fixed, 0);
        for t in (0..=10_000).step_by(250) {
            c.step(fixed, t, shedding(t), false);
            assert_eq!(c.effective_rate(), 100.0, "shedding at {t}");
        }
        // The origin silent for 20 s: the frontier moves on, nothing is
        // frozen, so no window is extended (what issue 13 fixed).
        for t in (10_250..=30_000).step_by(250) {
            c.step(fixed, t, None, false);
            assert!(!c.frozen);
            assert_eq!(c.effective_rate(), 100.0);
        }
        assert_eq!(c.frozen_ms_at(30_000), 0);
        // A pause still holds it, and counts.
        for t in (30_250..=35_000).step_by(250) {
            c.step(fixed, t, None, true);
            assert_eq!(c.effective_rate(), 0.0);
            assert_eq!(c.reason, Reason::Paused);
        }
        c.step(fixed, 35_250, None, false);
        assert_eq!((c.effective_rate(), c.frozen_ms), (100.0, 5_000));
    }

    #[test]
    fn the_setting_reads_adaptive_or_fixed_and_refuses_anything_else() {
        assert_eq!(Mode::from_setting(None), Ok(Mode::Adaptive));
        assert_eq!(Mode::from_setting(Some("")), Ok(Mode::Adaptive));
        assert_eq!(Mode::from_setting(Some("adaptive")), Ok(Mode::Adaptive));
        assert_eq!(Mode::from_setting(Some(" fixed ")), Ok(Mode::Fixed));
        let e = Mode::from_setting(Some("Fixed!")).unwrap_err();
        assert!(e.contains("ADMISSION_CONTROL"), "{e}");
    }

    #[test]
    fn labels_are_the_json_names() {
        for r in Reason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.label());
        }
    }

    #[test]
    fn an_operators_new_ceiling_keeps_the_rates_share_of_it() {
        let mut c = Controller::new(L, 0);
        run(&mut c, 0, 2_000, healthy);
        assert_eq!(c.rate, 100.0);
        assert_eq!(c.reason, Reason::AtCeiling);
        let up = Limits {
            ceiling: 400.0,
            ..L
        };
        c.step(up, 2_250, healthy(2_250), false);
        assert_eq!(c.rate, 400.0, "at the old ceiling, at the new one");
        c.rate = 200.0;
        let down = Limits { ceiling: 4.0, ..L };
        c.step(down, 2_500, healthy(2_500), false);
        assert!(
            (c.rate - 2.0 - 4.0 * INCREASE_PER_S * 0.25).abs() < 1e-9,
            "{}",
            c.rate
        );
        // Bad ceilings are ignored, never divided by.
        let zero = Limits { ceiling: 0.0, ..L };
        c.step(zero, 2_750, healthy(2_750), false);
        assert!(c.rate.is_finite());
    }
}
