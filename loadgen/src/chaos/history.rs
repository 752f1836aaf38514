//! The history of a chaos run: one JSON line per HTTP request the load
//! sent (what was sent, what came back), plus samples of the origin's
//! settlement lag. Written while the run goes, read back by the checker.
//!
//! Invariant: every request the load sends is recorded, also when it got
//! no answer (`status: null`, Jepsen's "indeterminate": it may or may not
//! have taken effect). A record is written once the request has ended, so
//! a file cut short by a crash lacks only requests still in flight.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `POST /api/sales/{sale}/reservations` (first try or a retry of a key).
    Reserve,
    /// The same key sent again after a 202 (same body: must answer the same).
    Replay,
    /// The same key sent again with another qty (must be 422, changing nothing).
    Reuse,
    /// `DELETE /api/reservations/{id}`.
    Cancel,
    /// `POST /api/reservations/{id}/purchase`.
    Purchase,
    /// `POST /webhooks/payments` (one delivery of one provider event).
    Webhook,
    /// Not a request: the origin's settlement lag (`/metrics`) at `t0`.
    Lag,
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Sent (ms since the Unix epoch).
    pub t0: u64,
    /// Answered, or given up on (ms since the Unix epoch).
    pub t1: u64,
    pub op: Op,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub account: String,
    /// The request's Idempotency-Key (reservations and purchases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The qty asked for (reservations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qty: Option<i64>,
    /// HTTP status; `None`: no answer (connection refused or cut, timeout).
    pub status: Option<u16>,
    /// The error code of a refusal, or the transport error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The reservation the answer names (reserve, replay) or the request
    /// is about (cancel, purchase, webhook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// Units granted (a 202's `qty`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<i64>,
    /// A 202 marked `Idempotent-Replayed: true`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment: Option<String>,
    /// The provider's event id (webhooks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// `payment.succeeded` or `payment.failed` (webhooks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The webhook answer's `result` (paid, refund_required, failed,
    /// duplicate, ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The settlement lag sampled (`Op::Lag`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<i64>,
}

impl Entry {
    /// A request of kind `op` sent at `t0` (ms), not answered yet.
    pub fn new(op: Op, t0: u64) -> Self {
        Entry {
            t0,
            t1: t0,
            op,
            account: String::new(),
            key: None,
            qty: None,
            status: None,
            code: None,
            reservation: None,
            granted: None,
            replayed: false,
            payment: None,
            event: None,
            kind: None,
            result: None,
            lag: None,
        }
    }

    /// A 2xx answer.
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }

    /// A request (not a lag sample).
    pub fn is_request(&self) -> bool {
        self.op != Op::Lag
    }
}

/// Writes entries as JSON lines.
pub struct Writer {
    out: std::io::BufWriter<std::fs::File>,
}

impl Writer {
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        Ok(Writer {
            out: std::io::BufWriter::new(std::fs::File::create(path)?),
        })
    }

    pub fn write(&mut self, e: &Entry) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, e)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }

    pub fn finish(mut self) -> anyhow::Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

/// Reads a history file; a last line cut short (the writer was killed) is
/// skipped, any other bad line is an error.
pub fn read(path: &Path) -> anyhow::Result<Vec<Entry>> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let lines: Vec<String> = file.lines().collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(e) => out.push(e),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => anyhow::bail!("{}:{}: {e}", path.display(), i + 1),
        }
    }
    Ok(out)
}
