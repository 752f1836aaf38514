//! What the reconciler and the cold rebuild both read, in bounded pieces:
//! a shard's Redis hash with `HSCAN` in chunks, and the reservations
//! Postgres has as rows a hold record (and its Idempotency-Key record) can
//! be rebuilt from.
//!
//! Invariant: no read here asks Redis for a whole hash at once; each call
//! returns at most about [`SCAN_CHUNK`] fields, whatever the sale's size.

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::reserve::engine::{Engine, IDEMPOTENCY_TTL_SECS};

/// Holds asked for per `HSCAN` call, and checked against Postgres at a
/// time: Redis and the origin's runtime each do a bounded amount of work
/// per step, whatever the number of live holds (a whole-hash `HGETALL` of
/// 10^5 holds stalled every request, `/healthz` included: issue 16).
pub(crate) const SCAN_CHUNK: usize = 1_000;

/// A hash read in chunks with `HSCAN` (at most about [`SCAN_CHUNK`] fields
/// per Redis call). Not a snapshot: a field present throughout is seen at
/// least once; one added or removed meanwhile may or may not be.
pub(crate) struct HashScan<'k> {
    key: &'k str,
    cursor: Option<u64>,
}

impl<'k> HashScan<'k> {
    pub(crate) fn new(key: &'k str) -> Self {
        HashScan {
            key,
            cursor: Some(0),
        }
    }

    /// The next chunk of `(field, value)` pairs; `None` once the scan is over.
    pub(crate) async fn next(
        &mut self,
        engine: &Engine,
    ) -> Result<Option<Vec<(String, String)>>, redis::RedisError> {
        let mut conn = engine.conn.clone();
        while let Some(cursor) = self.cursor {
            let (next, pairs): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
                .arg(self.key)
                .arg(cursor)
                .arg("COUNT")
                .arg(SCAN_CHUNK)
                .query_async(&mut conn)
                .await?;
            self.cursor = (next != 0).then_some(next);
            if !pairs.is_empty() {
                return Ok(Some(pairs));
            }
        }
        Ok(None)
    }
}

/// A reservation as a rebuild needs it: live ones become holds and counts;
/// any recent one with an Idempotency-Key gets its key record back.
#[derive(sqlx::FromRow)]
pub(crate) struct RebuildRow {
    pub(crate) id: String,
    pub(crate) account: String,
    pub(crate) qty: i32,
    pub(crate) status: String,
    pub(crate) shard: i32,
    pub(crate) home: i32,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) expires_at: DateTime<Utc>,
    pub(crate) idem: Option<String>,
    pub(crate) requested_qty: Option<i32>,
    /// Its SKU's position (`reservations.sku`), as its records carry it:
    /// `None` in a one-SKU sale, whose records carry none
    /// ([`RebuildRow::in_sale`]).
    pub(crate) sku: Option<i32>,
}

impl RebuildRow {
    /// The row as the records of `sale` carry it: no SKU position in a
    /// one-SKU sale (its layout is the one from before SKUs).
    pub(crate) fn in_sale(mut self, multi_sku: bool) -> Self {
        if !multi_sku {
            self.sku = None;
        }
        self
    }

    pub(crate) fn live(&self) -> bool {
        matches!(self.status.as_str(), "settled" | "pending_payment" | "paid")
    }

    /// Its hold record, as `lua/_lib.lua` lays it out.
    pub(crate) fn hold_record(&self) -> serde_json::Value {
        let s = if self.status == "paid" {
            "paid"
        } else {
            "held"
        };
        let mut h = json!({"a": self.account, "q": self.qty, "e": self.expires_at.timestamp_millis(),
                           "h": self.home, "c": self.created_at.timestamp_millis(), "s": s});
        if let Some(idem) = &self.idem {
            h["k"] = json!(idem);
            h["r"] = json!(self.requested_qty.unwrap_or(self.qty));
        }
        if let Some(p) = self.sku {
            h["p"] = json!(p);
        }
        h
    }

    /// Its Idempotency-Key record (the first answer), as reserve.lua keeps it.
    pub(crate) fn key_record(&self) -> serde_json::Value {
        let mut k = json!({"st": "held", "id": self.id, "sh": self.shard, "e": self.expires_at.timestamp_millis(),
               "q": self.qty, "rq": self.requested_qty.unwrap_or(self.qty)});
        if let Some(p) = self.sku {
            k["p"] = json!(p);
        }
        k
    }
}

/// Seconds an Idempotency-Key record made at `created_ms` has left (≤ 0:
/// expired, not to be restored).
pub(crate) fn key_ttl(created_ms: i64, now_ms: i64) -> i64 {
    IDEMPOTENCY_TTL_SECS as i64 - (now_ms - created_ms) / 1000
}

pub(crate) const REBUILD_COLUMNS: &str =
    "id, account, qty, status, shard, home, created_at, expires_at, idem, requested_qty, sku";
