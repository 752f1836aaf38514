//! `loadgen events-lag`: the commit-to-sink lag of events during a sale,
//! read from the origin's own histogram `flashsale_events_publish_lag_seconds`
//! (an outbox row's `created_at` to the sink's acknowledgement, recorded by
//! the relay) by scraping `/metrics` every few seconds (issue 46: "p99 ≤ 1 s
//! and never growing").
//!
//! A window's p99 is given as the bucket bound it is under (`p99 ≤ le`):
//! the histogram keeps counts per bucket, not values, so a finer figure
//! would be invented. The bucket bounds include 0.5, 1 and 2.5 s
//! (`origin::ops::telemetry::LATENCY_BUCKETS`), so "≤ 1 s" is decided
//! exactly.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

const METRIC: &str = "flashsale_events_publish_lag_seconds";

#[derive(Args, Debug)]
pub struct EventsLagArgs {
    /// The origin's metrics URL (`http://127.0.0.1:PORT/metrics`).
    #[arg(long)]
    metrics: String,
    /// Milliseconds between scrapes: one window each.
    #[arg(long, default_value_t = 5_000)]
    every_ms: u64,
    /// Stop once no event was published for this long after the first.
    #[arg(long, default_value_t = 20)]
    idle_seconds: u64,
    /// Stop after this long whatever happens.
    #[arg(long, default_value_t = 900)]
    max_seconds: u64,
    /// A window with fewer events than this has no p99 of its own.
    #[arg(long, default_value_t = 100)]
    min_events: u64,
}

/// Cumulative counts per upper bound (`+Inf` as infinity), ascending.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    /// Reads `metric`'s buckets from Prometheus text (no other labels).
    pub fn parse(text: &str, metric: &str) -> Histogram {
        let prefix = format!("{metric}_bucket{{le=\"");
        let mut buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(&prefix)?;
                let (le, count) = rest.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, count.trim().parse::<f64>().ok()? as u64))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Histogram { buckets }
    }

    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.buckets.last().map_or(0, |b| b.1)
    }

    /// What was observed since `before` (bucket by bucket).
    pub fn since(&self, before: &Histogram) -> Histogram {
        let base = |le: f64| before.buckets.iter().find(|b| b.0 == le).map_or(0, |b| b.1);
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, n)| (le, n.saturating_sub(base(le))))
                .collect(),
        }
    }

    /// The smallest bucket bound at or under which `q` of the
    /// observations fall (`None`: none observed).
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let need = (q * total as f64).ceil() as u64;
        self.buckets.iter().find(|b| b.1 >= need).map(|b| b.0)
    }
}

/// One window of the run.
#[derive(Debug, Serialize)]
struct Window {
    /// Seconds from the first scrape to this window's end.
    at_s: f64,
    events: u64,
    /// p99 ≤ this (seconds); `None` below `min_events`.
    p99_le: Option<f64>,
}

/// The verdict on a run's windows: the p99 bound of every window with
/// enough events, the largest of them, and whether the lag grew: the
/// last third of those windows has a larger bound than any of the first
/// third.
pub fn growing(bounds: &[f64]) -> bool {
    if bounds.len() < 3 {
        return false;
    }
    let third = bounds.len() / 3;
    let first = bounds[..third].iter().copied().fold(0.0, f64::max);
    let last = bounds[bounds.len() - third..]
        .iter()
        .copied()
        .fold(0.0, f64::max);
    last > first
}

async fn scrape(client: &reqwest::Client, url: &str) -> anyhow::Result<Histogram> {
    let text = client
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?
        .error_for_status()?
        .text()
        .await?;
    Ok(Histogram::parse(&text, METRIC))
}

pub async fn run(args: EventsLagArgs) -> anyhow::Result<()> {
    crate::loopback::ensure_loopback(&args.metrics)?;
    let client = reqwest::Client::new();
    let started = Instant::now();
    let first = scrape(&client, &args.metrics).await?;
    let mut last = first.clone();
    let mut last_change: Option<Instant> = None;
    let mut windows = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(args.every_ms)).await;
        let now = scrape(&client, &args.metrics).await?;
        let w = now.since(&last);
        let events = w.count();
        if events > 0 {
            last_change = Some(Instant::now());
        }
        windows.push(Window {
            at_s: started.elapsed().as_secs_f64(),
            events,
            p99_le: (events >= args.min_events)
                .then(|| w.quantile_bound(0.99))
                .flatten(),
        });
        last = now;
        let idle =
            last_change.is_some_and(|t| t.elapsed() >= Duration::from_secs(args.idle_seconds));
        if idle || started.elapsed() >= Duration::from_secs(args.max_seconds) {
            break;
        }
    }
    let all = last.since(&first);
    let bounds: Vec<f64> = windows.iter().filter_map(|w| w.p99_le).collect();
    let worst = bounds
        .iter()
        .copied()
        .fold(None, |m: Option<f64>, b| Some(m.map_or(b, |m| m.max(b))));
    let report = serde_json::json!({
        "metric": METRIC,
        "events": all.count(),
        "p99_le_s": all.quantile_bound(0.99),
        "worst_window_p99_le_s": worst,
        "growing": growing(&bounds),
        "target": "p99 <= 1 s in every window and not growing",
        "met": worst.is_some_and(|w| w <= 1.0) && !growing(&bounds),
        "windows": windows,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE flashsale_events_publish_lag_seconds histogram
flashsale_events_publish_lag_seconds_bucket{le=\"0.1\"} 50
flashsale_events_publish_lag_seconds_bucket{le=\"0.5\"} 90
flashsale_events_publish_lag_seconds_bucket{le=\"1\"} 99
flashsale_events_publish_lag_seconds_bucket{le=\"2.5\"} 100
flashsale_events_publish_lag_seconds_bucket{le=\"+Inf\"} 100
flashsale_events_publish_lag_seconds_sum 30.5
flashsale_events_publish_lag_seconds_count 100
other_seconds_bucket{le=\"0.1\"} 7
";

    #[test]
    fn buckets_are_read_and_the_p99_is_the_bound_it_falls_under() {
        let h = Histogram::parse(TEXT, METRIC);
        assert_eq!(h.buckets.len(), 5);
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_bound(0.99), Some(1.0));
        assert_eq!(h.quantile_bound(0.5), Some(0.1));
        assert_eq!(h.quantile_bound(1.0), Some(2.5));
        assert_eq!(Histogram::default().quantile_bound(0.99), None);
    }

    #[test]
    fn a_window_is_what_was_observed_between_two_scrapes() {
        let before = Histogram::parse(TEXT, METRIC);
        let after = Histogram {
            buckets: before
                .buckets
                .iter()
                .map(|&(le, n)| (le, n + if le >= 2.5 { 10 } else { 0 }))
                .collect(),
        };
        let w = after.since(&before);
        assert_eq!(w.count(), 10);
        // Every one of the window's events was over 1 s.
        assert_eq!(w.quantile_bound(0.99), Some(2.5));
    }

    #[test]
    fn growth_is_the_last_third_above_the_first() {
        assert!(!growing(&[0.5, 0.5, 0.5, 0.5, 0.5, 0.5]));
        assert!(!growing(&[1.0, 0.5, 0.5, 0.5, 0.5, 0.5]));
        assert!(growing(&[0.25, 0.25, 0.5, 0.5, 1.0, 1.0]));
        assert!(!growing(&[2.5, 2.5]));
    }
}
