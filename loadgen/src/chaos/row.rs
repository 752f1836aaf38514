//! One row of RELIABILITY.md as a file: the fault it names, the figures
//! `chaos check` found (or why it did not run, `chaos skip`), which
//! `chaos report` reads back into the table.
//!
//! Invariant: a row carries every figure the verdict is taken from, so the
//! report judges the row it shows.

use clap::Args;
use serde::{Deserialize, Serialize};

/// Examples kept per finding in the report.
const EXAMPLES: usize = 5;

/// One finding's count and a few examples.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Finding {
    pub count: i64,
    pub examples: Vec<String>,
}

impl Finding {
    pub(crate) fn add(&mut self, n: i64, example: impl FnOnce() -> String) {
        if n <= 0 {
            return;
        }
        self.count += n;
        if self.examples.len() < EXAMPLES {
            self.examples.push(example());
        }
    }
}

/// What one run came to: the figures of one row of RELIABILITY.md.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Figures {
    /// HTTP requests sent (every attempt, answered or not).
    pub requests: i64,
    /// Reservation requests answered 202 (replays included).
    pub accepted: i64,
    /// Distinct holds acknowledged (reservation ids answered 202).
    pub acknowledged: i64,
    /// Requests that got no answer (indeterminate) or a 5xx.
    pub failed_requests: i64,
    pub acks_lost: Finding,
    pub oversold: Finding,
    pub lost_units: Finding,
    pub double_effects: Finding,
    pub limit_breaches: Finding,
    #[serde(default)]
    pub replays_answered_otherwise: Finding,
    /// Events the outbox holds that never reached the sink, outbox rows
    /// never published, and events on the sink no outbox row explains
    /// (issue 46).
    #[serde(default)]
    pub events_lost: Finding,
    /// One reservation's events reaching the webhook receiver out of the
    /// outbox's order.
    #[serde(default)]
    pub events_misordered: Finding,
    /// Events on the sink more than once (same id: allowed, at least once).
    #[serde(default)]
    pub events_repeated: i64,
    /// Events the outbox holds (all of them checked).
    #[serde(default)]
    pub events: i64,
    /// Fault end → first new hold granted (ms); `None`: none after it.
    pub recover_202_ms: Option<u64>,
    /// Fault end → settlement lag back at its pre-fault level (ms).
    pub recover_lag_ms: Option<u64>,
    /// The largest settlement lag sampled.
    pub max_lag: i64,
    /// Units sold (Postgres) and available (Redis) at the end.
    pub sold: i64,
    pub available: i64,
    /// Units still held at the end (the wait for expiry timed out).
    pub still_held: i64,
    /// Payments taken for a unit that was no longer held: refunded.
    pub refunds: i64,
    /// Whether the run had a fault window (`--fault-start-ms`/`--fault-end-ms`).
    #[serde(default)]
    pub faulted: bool,
    /// Requests in flight during the fault (sent before its end, answered or
    /// given up on after its start): a row none overlapped tested nothing.
    #[serde(default)]
    pub overlapping: i64,
}

impl Figures {
    /// Oversold, lost units, double effects, limit breaches, or events
    /// lost or out of order.
    pub fn broken(&self) -> bool {
        self.broken_but_for_lost_events() || self.events_lost.count > 0
    }

    /// The same, but events lost do not count: for a row whose fault
    /// destroys the sink's own data (the Redis stream with `REDIS_ACK=local`
    /// when Redis loses what it acknowledged), as acknowledged holds lost
    /// do not count there either.
    pub fn broken_but_for_lost_events(&self) -> bool {
        self.oversold.count > 0
            || self.lost_units.count > 0
            || self.double_effects.count > 0
            || self.limit_breaches.count > 0
            || self.events_misordered.count > 0
    }

    /// Why the run proves nothing, if it does not (issue 43: such a row
    /// passed): it accepted no reservation; no request overlapped the
    /// fault; or selling never came back after the fault while units were
    /// still for sale at the end.
    pub fn vacuous(&self) -> Vec<&'static str> {
        let mut why = Vec::new();
        if self.accepted == 0 {
            why.push("no reservation was accepted");
        }
        if self.faulted && self.overlapping == 0 {
            why.push("no request overlapped the fault");
        }
        if self.faulted && self.recover_202_ms.is_none() && self.available > 0 {
            why.push("selling never came back after the fault, with units still for sale");
        }
        why
    }
}

/// One row, as `chaos check` (or `chaos skip`) writes it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Row {
    pub row: String,
    /// What was done, in words.
    pub fault: String,
    /// Why the row did not run (then no figures).
    #[serde(default)]
    pub not_run: Option<String>,
    #[serde(default)]
    pub figures: Option<Figures>,
    /// Acknowledged holds lost fail this row.
    #[serde(default)]
    pub must_keep_acks: bool,
    /// The fault destroys the events sink's own data: events lost do not
    /// fail this row.
    #[serde(default)]
    pub sink_may_lose: bool,
    /// Seconds of load.
    #[serde(default)]
    pub seconds: u64,
}

/// Names a row of RELIABILITY.md and where its file goes.
#[derive(Args, Clone, Debug)]
pub struct RowArgs {
    /// The row's name (e.g. `origin-kill`).
    #[arg(long)]
    pub row: String,
    /// What was done, in words.
    #[arg(long)]
    pub fault: String,
    /// Acknowledged holds lost fail this row.
    #[arg(long)]
    pub must_keep_acks: bool,
    /// The fault destroys the events sink's own data (events lost do not
    /// fail the row).
    #[arg(long)]
    pub sink_may_lose: bool,
    /// Seconds of load.
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// Where the row goes (JSON, for `chaos report`).
    #[arg(long)]
    pub out: std::path::PathBuf,
}

impl RowArgs {
    /// Writes the row; prints its figures in one line.
    pub fn write(&self, figures: Option<Figures>, not_run: Option<String>) -> anyhow::Result<()> {
        let row = Row {
            row: self.row.clone(),
            fault: self.fault.clone(),
            not_run,
            figures,
            must_keep_acks: self.must_keep_acks,
            sink_may_lose: self.sink_may_lose,
            seconds: self.seconds,
        };
        std::fs::write(&self.out, serde_json::to_string_pretty(&row)?)?;
        match &row.figures {
            Some(f) => eprintln!(
                "{}: requests {}, 202s {}, acks lost {}, oversold {}, units lost {}, double effects {}, \
                 limit breaches {}, replays answered otherwise {}, events lost {} of {} ({} repeated), \
                 recovered after {:?} / {:?} ms",
                row.row,
                f.requests,
                f.accepted,
                f.acks_lost.count,
                f.oversold.count,
                f.lost_units.count,
                f.double_effects.count,
                f.limit_breaches.count,
                f.replays_answered_otherwise.count,
                f.events_lost.count,
                f.events,
                f.events_repeated,
                f.recover_202_ms,
                f.recover_lag_ms
            ),
            None => eprintln!("{}: not run: {}", row.row, row.not_run.unwrap_or_default()),
        }
        Ok(())
    }
}
