//! When a failed webhook delivery is tried again: a growing schedule with
//! jitter, then the dead-letter state.
//!
//! Pure. Invariants kept here: a delivery is tried at most once plus once
//! per step of the schedule; each wait is its step scaled by a jitter in
//! [0.8, 1.2] (endpoints that failed together do not come back together).

use std::time::Duration;

/// The default `WEBHOOK_RETRY_SCHEDULE`: about a day of retries.
pub const DEFAULT_SCHEDULE: &str = "5s,30s,2m,10m,1h,3h,8h,12h";

/// The waits after the first, second, … failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule(pub Vec<Duration>);

impl Schedule {
    /// `5s,30s,2m,10m,1h,…`: steps of `ms`, `s`, `m`, `h` or `d`, at least one.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let steps = text
            .split(',')
            .map(|s| s.trim())
            .map(|s| {
                let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
                let (n, unit) = s.split_at(split);
                let n: u64 = n
                    .parse()
                    .map_err(|_| format!("{s:?} is not a number with a unit"))?;
                let ms = match unit {
                    "ms" => 1,
                    "s" => 1_000,
                    "m" => 60_000,
                    "h" => 3_600_000,
                    "d" => 86_400_000,
                    _ => return Err(format!("{s:?}: the unit is ms, s, m, h or d")),
                };
                if n == 0 || n.saturating_mul(ms) > 7 * 86_400_000 {
                    return Err(format!("{s:?}: a step is above 0 and at most 7 days"));
                }
                Ok(Duration::from_millis(n * ms))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Schedule(steps))
    }

    /// The wait after attempt `attempts` (1 = the first) failed, scaled by
    /// `jitter` (clamped to [0.8, 1.2]); `None`: that was the last attempt,
    /// the delivery is dead.
    pub fn after_failure(&self, attempts: u32, jitter: f64) -> Option<Duration> {
        let step = self.0.get((attempts.max(1) - 1) as usize)?;
        Some(step.mul_f64(jitter.clamp(0.8, 1.2)))
    }

    /// How many attempts a delivery gets in all.
    pub fn attempts(&self) -> usize {
        self.0.len() + 1
    }
}

/// A jitter factor for [`Schedule::after_failure`].
pub fn jitter() -> f64 {
    rand::random_range(0.8..=1.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grows_to_about_a_day() {
        let s = Schedule::parse(DEFAULT_SCHEDULE).unwrap();
        assert_eq!(s.attempts(), 9);
        assert!(s.0.windows(2).all(|w| w[0] < w[1]));
        let total: Duration = s.0.iter().sum();
        assert!(
            total > Duration::from_secs(20 * 3600) && total <= Duration::from_secs(26 * 3600),
            "{total:?}"
        );
    }

    #[test]
    fn each_failure_waits_its_step_with_jitter_then_the_delivery_is_dead() {
        let s = Schedule::parse("100ms, 2s,1m").unwrap();
        assert_eq!(s.after_failure(1, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(s.after_failure(2, 1.2), Some(Duration::from_millis(2_400)));
        assert_eq!(s.after_failure(3, 0.8), Some(Duration::from_secs(48)));
        assert_eq!(s.after_failure(3, 5.0), Some(Duration::from_secs(72)));
        assert_eq!(s.after_failure(4, 1.0), None);
        for _ in 0..100 {
            let j = jitter();
            assert!((0.8..=1.2).contains(&j));
        }
    }

    #[test]
    fn a_bad_schedule_says_which_step() {
        for (bad, says) in [
            ("", "not a number"),
            ("5s,,1m", "not a number"),
            ("5x", "unit"),
            ("0s", "above 0"),
            ("8d", "at most 7 days"),
            ("s", "not a number"),
        ] {
            let e = Schedule::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
