//! The settlement worker: makes every hold durable in Postgres.
//!
//! It reads every shard's settlement stream with the consumer group
//! `settlement`, in batches (up to 1,000 entries, or what arrived within a
//! short idle wait), and writes one transaction per batch:
//! - holds are inserted with `ON CONFLICT (id) DO NOTHING`, so a redelivered
//!   entry changes nothing;
//! - the inventory takes them with a conditional update
//!   (`held + sold + n <= total`): Postgres is the last guard. If the batch as
//!   a whole does not fit, holds are taken one by one in stream order and
//!   those that do not fit are marked `rejected`; after commit their Redis
//!   units are released (release.lua);
//! - releases (cancel, expiry, rejection) are applied first, so a hold in the
//!   same batch can use the unit a release freed (the reclaim at sell-out
//!   writes such a pair); they move a reservation only from a live status
//!   (`WHERE status IN (…)`), so a repeat is a no-op, and give `held` back.
//!   A release whose hold Postgres has not seen yet (its batch failed and is
//!   still pending) writes the row as released from the fields the release
//!   record carries; the hold, when claimed, then changes nothing;
//! - every row names a sale Postgres has: the batch locks the sale's row
//!   once (`lock_sale`, in place of a foreign key checked per row), and a
//!   missing sale writes nothing.
//!
//! With `REDIS_ACK=wait` a batch is committed only once a replica has its
//! entries (`crate::reserve::ack`: the barrier checks this primary's stream holds
//! each entry, then `WAIT 1`, on a dedicated connection of the settler's own
//! acknowledger, so neither a request connection nor the requests' rounds
//! wait for it). Otherwise nothing is written and the entries
//! stay pending, read again by this consumer (or claimed): Postgres never
//! learns a hold or release that a failover can take back. (With `local` it
//! may; the reconciler repairs what a failover took back, `crate::settle::reconcile`.)
//!
//! Stream order is kept: a hold is refused only once every earlier entry
//! of its stream is settled (an unsettled release may be what freed its
//! unit; else `Overtaken`, nothing written), and after any failed batch the
//! consumer reads its own pending entries first (a failed batch, or a read
//! whose reply a timeout lost, is pending there).
//!
//! Entries are acknowledged only after the commit, and the stream is then
//! trimmed below the oldest entry not settled yet (`lua/settled.lua`).
//! Entries a dead consumer left pending are claimed with XAUTOCLAIM after
//! `claim_idle`. Errors are split: a lost connection is retryable (back
//! off, the same entries are read again); an entry that cannot be parsed is
//! fatal for that entry only: it is parked in the shard's dead-letter stream
//! and the worker keeps going.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use redis::Value;
use redis::streams::{StreamAutoClaimOptions, StreamReadOptions};
use sqlx::{PgPool, Row};
use tokio_util::sync::CancellationToken;

use crate::reserve::ack::{AckError, Acker, Fact};
use crate::reserve::engine::{Engine, HoldRecord};
use crate::reserve::store::ShardKeys;
use crate::sales::registry::SaleRegistry;
use crate::sales::sale::Sale;

use crate::reserve::store::GROUP;

/// Tuning of one worker.
#[derive(Debug, Clone)]
pub struct SettleConfig {
    /// This worker's consumer name (unique per process).
    pub consumer: String,
    /// Entries per read and Postgres transaction at most. Bigger batches
    /// settle a backlog faster: `loadgen bench-settle --holds 50000`
    /// measured 29.5k holds/s at 200, 35.4k at 500, 41.0k at 1,000.
    pub batch: usize,
    /// How long to wait for more entries when a round found none.
    pub idle_wait: Duration,
    /// How long to wait when a round found entries but no full batch, so
    /// the next round's batches fill: a Postgres transaction costs about
    /// the same for 10 entries as for 200 (measured: 11 entries per batch
    /// at 2,000 holds/s without it, Postgres then using a third of a core).
    pub linger: Duration,
    /// Entries pending this long on another consumer are taken over.
    pub claim_idle: Duration,
    /// How often pending entries are looked for.
    pub claim_every: Duration,
}

impl SettleConfig {
    pub fn new(consumer: impl Into<String>) -> Self {
        SettleConfig {
            consumer: consumer.into(),
            batch: 1_000,
            idle_wait: Duration::from_millis(20),
            linger: Duration::from_millis(50),
            claim_idle: Duration::from_secs(30),
            claim_every: Duration::from_secs(5),
        }
    }
}

/// Why a batch failed.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    /// Try again later; nothing was acknowledged.
    #[error("retryable: {0}")]
    Retryable(String),
    /// `REDIS_ACK=wait`: no replica showed the batch's entries in time;
    /// nothing was written, the entries stay pending.
    #[error("not replicated: {0}")]
    NotReplicated(AckError),
    /// The batch does not fit in Postgres while an earlier entry of its
    /// stream is still pending (a failed batch, or one another consumer
    /// holds): refusing now could refuse a hold whose unit that earlier
    /// release freed. Nothing was written; the entries stay pending.
    #[error("earlier entries of the stream are not settled yet")]
    Overtaken,
    /// The sale is not in Postgres (deleted under a running sale): nothing
    /// was written, the entries stay pending for an operator.
    #[error("sale {0} is not in Postgres; its entries stay pending")]
    UnknownSale(String),
    /// Postgres refuses a value of the batch for good (SQLSTATE class 22):
    /// nothing was written; [`Settler::process_or_park`] finds the entry
    /// and parks it.
    #[error("refused for good: {0}")]
    Refused(String),
}

impl From<redis::RedisError> for SettleError {
    fn from(e: redis::RedisError) -> Self {
        SettleError::Retryable(format!("redis: {e}"))
    }
}

impl From<sqlx::Error> for SettleError {
    fn from(e: sqlx::Error) -> Self {
        // SQLSTATE class 22, "data exception": the values themselves are
        // refused (U+0000 in text, a number out of range), so no retry can
        // ever write them. Anything else (a lost connection, a lock
        // timeout, a constraint the data may meet later) is tried again.
        let refused = e
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|code| code.starts_with("22"));
        if refused {
            SettleError::Refused(format!("postgres: {e}"))
        } else {
            SettleError::Retryable(format!("postgres: {e}"))
        }
    }
}

/// One parsed settlement record.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Hold {
        id: String,
        row: HoldRow,
    },
    Release {
        id: String,
        reason: String,
        /// What Postgres needs to write the row itself when the release
        /// arrives before its hold (absent in records written before these
        /// fields existed).
        row: Option<HoldRow>,
    },
}

/// A reservation row as a hold's stream records carry it (the hold record,
/// and its release record too).
#[derive(Debug, Clone, PartialEq)]
pub struct HoldRow {
    pub account: String,
    pub qty: i32,
    pub shard: i32,
    pub home: i32,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The Idempotency-Key's hash and the qty the request asked for
    /// (absent in records written before they existed).
    pub idem: Option<String>,
    pub requested: Option<i32>,
    /// The SKU's position (`reservations.sku`; 0 in a one-SKU sale, whose
    /// records carry none).
    pub sku: i32,
}

impl HoldRow {
    /// `created` names the field holding the hold's creation time (`at` in
    /// a hold record, `created` in a release record, whose `at` is the
    /// release's own time).
    fn parse(e: &Entry, created: &str) -> Option<Self> {
        Some(HoldRow {
            account: e.get("acct")?.to_owned(),
            qty: e.get("qty")?.parse().ok().filter(|q| *q > 0)?,
            shard: e.get("shard")?.parse().ok()?,
            home: e.get("home")?.parse().ok()?,
            created_at: ms_time(e.get(created))?,
            expires_at: ms_time(e.get("exp"))?,
            idem: e.get("idem").filter(|k| !k.is_empty()).map(str::to_owned),
            requested: e.get("rq").and_then(|q| q.parse().ok()).filter(|q| *q > 0),
            sku: match e.get("p") {
                None => 0,
                Some(p) => p.parse().ok().filter(|p| *p >= 0)?,
            },
        })
    }

    /// A hold record's `rec` field: the hold as the shard's holds hash
    /// keeps it ([`HoldRecord`]), granted on `shard`, the stream's own.
    fn from_record(raw: &str, shard: usize) -> Option<Self> {
        let h = HoldRecord::parse(raw)?;
        let ms = |t: u64| DateTime::<Utc>::from_timestamp_millis(i64::try_from(t).ok()?);
        Some(HoldRow {
            account: h.account,
            qty: i32::try_from(h.qty).ok().filter(|q| *q > 0)?,
            shard: i32::try_from(shard).ok()?,
            home: i32::try_from(h.home).ok()?,
            created_at: ms(h.created_ms)?,
            expires_at: ms(h.expires_ms)?,
            idem: h.idem.filter(|k| !k.is_empty()),
            requested: h
                .requested
                .and_then(|q| i32::try_from(q).ok())
                .filter(|q| *q > 0),
            sku: match h.position {
                None => 0,
                Some(p) => i32::try_from(p).ok().filter(|p| *p >= 0)?,
            },
        })
    }
}

/// Column arrays of reservation rows, for one `unnest` insert; the query's
/// parameters `$2..$11` in this order.
#[derive(Default)]
struct RowColumns {
    ids: Vec<String>,
    accounts: Vec<String>,
    qtys: Vec<i32>,
    shards: Vec<i32>,
    homes: Vec<i32>,
    created: Vec<DateTime<Utc>>,
    expires: Vec<DateTime<Utc>>,
    idems: Vec<Option<String>>,
    requested: Vec<Option<i32>>,
    skus: Vec<i32>,
}

impl RowColumns {
    fn push(&mut self, id: &str, r: &HoldRow) {
        self.ids.push(id.to_string());
        self.accounts.push(r.account.clone());
        self.qtys.push(r.qty);
        self.shards.push(r.shard);
        self.homes.push(r.home);
        self.created.push(r.created_at);
        self.expires.push(r.expires_at);
        self.idems.push(r.idem.clone());
        self.requested.push(r.requested);
        self.skus.push(r.sku);
    }

    fn bind<'q>(
        &'q self,
        q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        q.bind(&self.ids)
            .bind(&self.accounts)
            .bind(&self.qtys)
            .bind(&self.shards)
            .bind(&self.homes)
            .bind(&self.created)
            .bind(&self.expires)
            .bind(&self.idems)
            .bind(&self.requested)
            .bind(&self.skus)
    }
}

fn ms_time(v: Option<&str>) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp_millis(v?.parse().ok()?)
}

/// One settlement stream entry as read: its id and its fields in stream
/// order, as bytes (an entry that is not UTF-8 is still parked whole in the
/// dead-letter stream).
///
/// The settler reads XREADGROUP's reply into these directly instead of
/// redis-rs's `StreamId` (a `HashMap<String, Value>` per entry, each value
/// cloned again when read): with 12 fields per entry that parse was about
/// two fifths of the worker's CPU per hold in `perf` of `loadgen
/// bench-settle`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Entry {
    /// The value of the field `name` (its first occurrence), if UTF-8.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k.as_slice() == name.as_bytes())
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// One entry of a stream reply, `[id, [field, value, …]]` (the fields
    /// nil for an entry deleted while pending); `None` if not that shape.
    fn from_value(v: Value) -> Option<Self> {
        let Value::Array(parts) = v else { return None };
        let mut parts = parts.into_iter();
        let id = match parts.next()? {
            Value::BulkString(b) => String::from_utf8(b).ok()?,
            Value::SimpleString(s) => s,
            _ => return None,
        };
        let fields = match parts.next()? {
            Value::Array(flat) => {
                let mut flat = flat.into_iter().map(bytes);
                let mut fields = Vec::with_capacity(flat.len() / 2);
                while let Some(k) = flat.next() {
                    fields.push((k?, flat.next()??));
                }
                fields
            }
            Value::Map(pairs) => pairs
                .into_iter()
                .map(|(k, v)| Some((bytes(k)?, bytes(v)?)))
                .collect::<Option<_>>()?,
            Value::Nil => Vec::new(),
            _ => return None,
        };
        Some(Entry { id, fields })
    }

    /// The entries of an XREADGROUP reply on one stream: `[[key, [entry,
    /// …]]]` (RESP2) or `{key: [entry, …]}` (RESP3); nil when none.
    fn from_read_reply(v: Value) -> Option<Vec<Self>> {
        let entries = match v {
            Value::Nil => return Some(Vec::new()),
            Value::Array(streams) => streams
                .into_iter()
                .map(|s| match s {
                    Value::Array(kv) => kv.into_iter().nth(1),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?,
            Value::Map(streams) => streams.into_iter().map(|(_, v)| v).collect(),
            _ => return None,
        };
        let mut out = Vec::new();
        for list in entries {
            out.extend(Entry::from_list(list)?);
        }
        Some(out)
    }

    /// The entries an XAUTOCLAIM reply claimed: `[next id, [entry, …],
    /// [deleted id, …]]` (the last part from Redis 7).
    fn from_autoclaim_reply(v: Value) -> Option<Vec<Self>> {
        let Value::Array(parts) = v else { return None };
        Entry::from_list(parts.into_iter().nth(1)?)
    }

    /// A list of entries (nil: none).
    fn from_list(v: Value) -> Option<Vec<Self>> {
        match v {
            Value::Array(list) => list.into_iter().map(Entry::from_value).collect(),
            Value::Nil => Some(Vec::new()),
            _ => None,
        }
    }
}

fn bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

/// Parses an entry of the stream of `sale`'s shard `shard`; `None` means
/// malformed (dead-letter it).
///
/// A hold record carries the hold record itself (`rec`, `lua/_lib.lua`
/// `grant_hold`); one written field by field (by an origin before that
/// change, or by `lua/restore.lua`) still parses.
pub fn parse(e: &Entry, sale: &str, shard: usize) -> Option<Record> {
    match e.get("t")? {
        "hold" => {
            if e.get("sale")? != sale {
                return None;
            }
            let row = match e.get("rec") {
                Some(rec) => HoldRow::from_record(rec, shard)?,
                None => HoldRow::parse(e, "at")?,
            };
            Some(Record::Hold {
                id: e.get("id")?.to_owned(),
                row,
            })
        }
        "release" => {
            let reason = e.get("reason")?;
            matches!(reason, "expired" | "cancelled" | "rejected").then_some(())?;
            Some(Record::Release {
                id: e.get("id")?.to_owned(),
                reason: reason.to_owned(),
                row: HoldRow::parse(e, "created"),
            })
        }
        _ => None,
    }
}

/// The worker.
pub struct Settler {
    pub engine: Arc<Engine>,
    pub pool: PgPool,
    pub sales: Arc<SaleRegistry>,
    pub cfg: SettleConfig,
    /// Test hook: when it counts down to zero, the worker "dies" right after
    /// a commit and before acknowledging (negative: disabled).
    pub die_before_ack_after: AtomicI64,
    /// Streams where a batch failed `REDIS_ACK=wait`'s replication check:
    /// this consumer reads its own pending entries there first, so the
    /// batch settles as soon as a replica has it (not only after
    /// `claim_idle`).
    retry_own: Mutex<HashSet<String>>,
    /// `REDIS_ACK=wait`: the settler's own acknowledger (a dedicated
    /// connection of its own, not the requests' one, so a settlement
    /// round never sits in front of a customer's answer); `None`: `local`.
    pub acker: Option<Acker>,
}

/// What one batch did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchOutcome {
    pub entries: usize,
    pub inserted: usize,
    pub rejected: usize,
    pub released: usize,
    pub dead_lettered: usize,
    /// The test hook fired: the batch committed and was not acknowledged.
    pub died: bool,
}

impl Settler {
    pub fn new(
        engine: Arc<Engine>,
        pool: PgPool,
        sales: Arc<SaleRegistry>,
        cfg: SettleConfig,
    ) -> Self {
        Settler {
            engine,
            pool,
            sales,
            cfg,
            die_before_ack_after: AtomicI64::new(-1),
            retry_own: Mutex::new(HashSet::new()),
            acker: None,
        }
    }

    async fn ensure_group(&self, keys: &ShardKeys) -> redis::RedisResult<()> {
        crate::reserve::store::ensure_group(&mut self.engine.conn.clone(), keys).await
    }

    /// Reads and settles one batch of new entries from one shard.
    pub async fn settle_shard(
        &self,
        sale: &Sale,
        shard: usize,
    ) -> Result<BatchOutcome, SettleError> {
        let keys = &sale.shards[shard];
        // A batch no replica had yet is still pending on this consumer: read
        // it again ("0": this consumer's pending entries) before new ones.
        let own = self
            .retry_own
            .lock()
            .expect("retry_own lock")
            .contains(&keys.stream);
        if own {
            let entries = self.read_group(keys, "0").await?;
            if !entries.is_empty() {
                let r = self.process_or_park(sale, shard, entries).await;
                return self.after(keys, r);
            }
            self.retry_own
                .lock()
                .expect("retry_own lock")
                .remove(&keys.stream);
        }
        let r = match self.read_group(keys, ">").await {
            Ok(entries) => self.process_or_park(sale, shard, entries).await,
            Err(e) => Err(e),
        };
        self.after(keys, r)
    }

    /// After a failed batch, this consumer reads its own pending entries
    /// first: a failed batch stays pending (and a read whose reply a
    /// timeout lost moved its entries into this consumer's pending list
    /// all the same), and newer entries settled before it would be applied
    /// out of stream order — a hold before the release that freed its unit
    /// is refused as over total (chaos: Redis frozen 5 s).
    fn after(
        &self,
        keys: &ShardKeys,
        r: Result<BatchOutcome, SettleError>,
    ) -> Result<BatchOutcome, SettleError> {
        if r.is_err() {
            self.retry_own
                .lock()
                .expect("retry_own lock")
                .insert(keys.stream.clone());
        }
        r
    }

    /// XREADGROUP of up to one batch from `id` (`>`: new entries; `0`: this
    /// consumer's pending ones).
    async fn read_group(&self, keys: &ShardKeys, id: &str) -> Result<Vec<Entry>, SettleError> {
        let mut conn = self.engine.conn.clone();
        let opts = StreamReadOptions::default()
            .group(GROUP, &self.cfg.consumer)
            .count(self.cfg.batch);
        let read: redis::RedisResult<Value> =
            conn.xread_options(&[&keys.stream], &[id], &opts).await;
        let reply = match read {
            // The group is made at `sale create`; a Redis that lost its data
            // lost it too: make it again (from 0: nothing is skipped).
            Err(e) if e.code() == Some("NOGROUP") => {
                self.ensure_group(keys).await?;
                conn.xread_options(&[&keys.stream], &[id], &opts).await?
            }
            other => other?,
        };
        Entry::from_read_reply(reply).ok_or_else(|| {
            SettleError::Retryable(format!("unexpected XREADGROUP reply on {}", keys.stream))
        })
    }

    /// Takes over entries another consumer left pending too long.
    pub async fn claim_shard(
        &self,
        sale: &Sale,
        shard: usize,
    ) -> Result<BatchOutcome, SettleError> {
        let keys = &sale.shards[shard];
        let mut conn = self.engine.conn.clone();
        let r: redis::RedisResult<Value> = conn
            .xautoclaim_options(
                &keys.stream,
                GROUP,
                &self.cfg.consumer,
                self.cfg.claim_idle.as_millis() as u64,
                "0-0",
                StreamAutoClaimOptions::default().count(self.cfg.batch),
            )
            .await;
        let reply = match r {
            Err(e) if e.code() == Some("NOGROUP") => {
                self.ensure_group(keys).await?;
                return Ok(BatchOutcome::default());
            }
            other => other?,
        };
        let claimed = Entry::from_autoclaim_reply(reply).ok_or_else(|| {
            SettleError::Retryable(format!("unexpected XAUTOCLAIM reply on {}", keys.stream))
        })?;
        if !claimed.is_empty() {
            tracing::info!(sale = %sale.config.id, shard, entries = claimed.len(), "claimed entries left pending by another consumer");
        }
        let r = self.process_or_park(sale, shard, claimed).await;
        self.after(keys, r)
    }

    /// [`Settler::process`], and when Postgres refuses the batch for good
    /// (issue 43 #2: one entry whose account holds U+0000 was retried
    /// forever, and no later entry of its stream settled): the entries one
    /// by one, in stream order, so only the refused ones are parked in the
    /// dead-letter stream and the rest settle.
    async fn process_or_park(
        &self,
        sale: &Sale,
        shard: usize,
        entries: Vec<Entry>,
    ) -> Result<BatchOutcome, SettleError> {
        let all = if entries.len() > 1 {
            Some(entries.clone())
        } else {
            None
        };
        let first = entries.first().cloned();
        match self.process(sale, shard, entries).await {
            Err(SettleError::Refused(why)) => match (all, first) {
                (Some(all), _) => {
                    let mut out = BatchOutcome {
                        entries: all.len(),
                        ..Default::default()
                    };
                    for e in all {
                        let one = match self.process(sale, shard, vec![e.clone()]).await {
                            Err(SettleError::Refused(why)) => {
                                self.park_refused(sale, shard, &e, &why).await?
                            }
                            other => other?,
                        };
                        out.inserted += one.inserted;
                        out.rejected += one.rejected;
                        out.released += one.released;
                        out.dead_lettered += one.dead_lettered;
                        if one.died {
                            out.died = true;
                            return Ok(out);
                        }
                    }
                    Ok(out)
                }
                (None, Some(e)) => self.park_refused(sale, shard, &e, &why).await,
                (None, None) => Err(SettleError::Refused(why)),
            },
            other => other,
        }
    }

    /// Parks one entry Postgres refuses for good: copied to the shard's
    /// dead-letter stream with the reason, acknowledged, and, for a hold,
    /// its units given back in Redis as `rejected` (Postgres, the last
    /// guard, refused it: the same end as a hold over total).
    async fn park_refused(
        &self,
        sale: &Sale,
        shard: usize,
        e: &Entry,
        why: &str,
    ) -> Result<BatchOutcome, SettleError> {
        let keys = &sale.shards[shard];
        let mut conn = self.engine.conn.clone();
        let mut fields = e.fields.clone();
        fields.push((b"original_id".to_vec(), e.id.clone().into_bytes()));
        fields.push((b"error".to_vec(), why.as_bytes().to_vec()));
        let _: String = conn.xadd(&keys.dead_letter, "*", &fields).await?;
        tracing::error!(sale = %sale.config.id, shard, entry = %e.id, error = %why, "settlement entry Postgres refuses for good parked in the dead-letter stream");
        metrics::counter!("flashsale_settlement_refused_total").increment(1);
        let mut out = BatchOutcome {
            entries: 1,
            dead_lettered: 1,
            ..Default::default()
        };
        if let Some(Record::Hold { id, .. }) = parse(e, &sale.config.id, shard) {
            self.engine.release(keys, shard, &id, "rejected").await?;
            out.rejected = 1;
        }
        self.acknowledge(keys, &[e.id.as_str()]).await?;
        Ok(out)
    }

    /// Writes a batch to Postgres in one transaction, then acknowledges it.
    /// Called only through `Settler::after`, which keeps stream order on
    /// failure.
    async fn process(
        &self,
        sale: &Sale,
        shard: usize,
        entries: Vec<Entry>,
    ) -> Result<BatchOutcome, SettleError> {
        let mut out = BatchOutcome {
            entries: entries.len(),
            ..Default::default()
        };
        if entries.is_empty() {
            return Ok(out);
        }
        let keys = &sale.shards[shard];
        let sale_id = &sale.config.id;
        let mut conn = self.engine.conn.clone();
        let mut holds = Vec::new();
        let mut releases = Vec::new();
        let mut malformed = Vec::new();
        let mut facts = Vec::new();
        for e in &entries {
            match parse(e, sale_id, shard) {
                Some(r) => {
                    // Only an acknowledger (REDIS_ACK=wait) reads facts: each
                    // is five strings per entry, made for nothing otherwise.
                    if self.acker.is_some() {
                        let (Record::Hold { id, .. } | Record::Release { id, .. }) = &r;
                        facts.push(Fact::entry(keys, &e.id, id));
                    }
                    match r {
                        Record::Hold { .. } => holds.push(r),
                        Record::Release { .. } => releases.push(r),
                    }
                }
                None => malformed.push(e),
            }
        }
        // REDIS_ACK=wait: commit only what a replica has. An entry only this
        // primary has may die with it in a failover; in Postgres it would
        // outlive it for good (a live reservation the new primary never had,
        // its unit sold twice, its key free for a second hold). If not
        // replicated, nothing is written or acknowledged: the entries stay
        // pending and are read again later (`retry_own`).
        if let Some(acker) = &self.acker
            && !facts.is_empty()
            && let Err(e) = acker.confirm_all(facts).await
        {
            // `Settler::after` marks the stream for `retry_own`.
            metrics::counter!("flashsale_settlement_not_replicated_total").increment(1);
            return Err(SettleError::NotReplicated(e));
        }
        for e in malformed {
            // Fatal for this entry only: park it, keep going.
            let mut fields = e.fields.clone();
            fields.push((b"original_id".to_vec(), e.id.clone().into_bytes()));
            let _: String = conn.xadd(&keys.dead_letter, "*", &fields).await?;
            tracing::error!(sale = %sale_id, shard, entry = %e.id, "malformed settlement entry parked in the dead-letter stream");
            out.dead_lettered += 1;
        }

        let mut tx = self.pool.begin().await?;
        if !holds.is_empty() || !releases.is_empty() {
            lock_sale(&mut tx, sale_id).await?;
        }
        // Releases first. They only give units back, and the batch commits
        // as a whole, so this order can never take the sale over total; the
        // other order can refuse a hold whose unit a release in the same
        // batch freed (the reclaim at sell-out writes exactly that pair).
        out.released = apply_releases(&mut tx, sale_id, &releases).await?;
        let mut rejected_ids: Vec<String> = Vec::new();
        if !holds.is_empty() {
            let mut cols = RowColumns::default();
            for h in &holds {
                if let Record::Hold { id, row } = h {
                    cols.push(id, row);
                }
            }
            let inserted: Vec<(String, i32)> = cols
                .bind(sqlx::query(
                    "INSERT INTO reservations (id, sale_id, account, qty, status, shard, home, created_at, expires_at, idem, requested_qty, sku)
                     SELECT u.id, $1, u.account, u.qty, 'settled', u.shard, u.home, u.created_at, u.expires_at, u.idem, u.rq, u.sku
                     FROM unnest($2::text[], $3::text[], $4::int[], $5::int[], $6::int[], $7::timestamptz[], $8::timestamptz[], $9::text[], $10::int[], $11::int[])
                          WITH ORDINALITY AS u(id, account, qty, shard, home, created_at, expires_at, idem, rq, sku, n)
                     ORDER BY u.n
                     ON CONFLICT (id) DO NOTHING
                     RETURNING id, qty",
                ).bind(sale_id))
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .map(|r| (r.get::<String, _>(0), r.get::<i32, _>(1)))
                .collect();
            out.inserted = inserted.len();
            let sku_of: HashMap<&str, i32> = holds
                .iter()
                .filter_map(|h| match h {
                    Record::Hold { id, row } => Some((id.as_str(), row.sku)),
                    _ => None,
                })
                .collect();
            // RETURNING order is not guaranteed: restore stream order.
            let order: HashMap<&str, usize> = cols
                .ids
                .iter()
                .enumerate()
                .map(|(i, id)| (id.as_str(), i))
                .collect();
            let mut inserted = inserted;
            inserted.sort_by_key(|(id, _)| order.get(id.as_str()).copied().unwrap_or(usize::MAX));
            let takes: Vec<(i32, i32)> = inserted
                .iter()
                .map(|(id, q)| (sku_of.get(id.as_str()).copied().unwrap_or(0), *q))
                .collect();
            if !takes.is_empty() && !take_units(&mut tx, sale_id, &takes).await? {
                // Only once every earlier entry of the stream is settled:
                // an unsettled earlier release may be what freed the unit.
                if earlier_pending(&mut conn, keys, &entries[0].id).await? {
                    metrics::counter!("flashsale_settlement_overtaken_total").increment(1);
                    return Err(SettleError::Overtaken);
                }
                // The batch does not fit: Postgres refuses what would go over total.
                for ((id, _), take) in inserted.iter().zip(&takes) {
                    if !take_units(&mut tx, sale_id, std::slice::from_ref(take)).await? {
                        rejected_ids.push(id.clone());
                    }
                }
                sqlx::query(
                    "UPDATE reservations SET status = 'rejected', released_at = now(), release_reason = 'over_total'
                     WHERE id = ANY($1)",
                )
                .bind(&rejected_ids)
                .execute(&mut *tx)
                .await?;
                out.rejected = rejected_ids.len();
                metrics::counter!("flashsale_settlement_rejected_total")
                    .increment(rejected_ids.len() as u64);
            }
            // A redelivered batch finds earlier rejections: release them
            // (again) too. Only a row this batch did not insert can have
            // been written, and rejected, before: a batch of new holds (the
            // usual case) skips the lookup of every id.
            if out.inserted < cols.ids.len() {
                let earlier: Vec<String> = sqlx::query_scalar(
                    "SELECT id FROM reservations WHERE id = ANY($1) AND status = 'rejected' AND NOT (id = ANY($2))",
                )
                .bind(&cols.ids)
                .bind(&rejected_ids)
                .fetch_all(&mut *tx)
                .await?;
                rejected_ids.extend(earlier);
            }
        }
        tx.commit().await?;

        if self.die_before_ack_after.load(Ordering::Acquire) >= 0
            && self.die_before_ack_after.fetch_sub(1, Ordering::AcqRel) == 0
        {
            out.died = true;
            return Ok(out);
        }
        for id in &rejected_ids {
            self.engine.release(keys, shard, id, "rejected").await?;
        }
        // Acknowledged, and the settled part of the stream dropped
        // (lua/settled.lua): one script, one round trip.
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        self.acknowledge(keys, &ids).await?;
        metrics::histogram!("flashsale_settlement_batch_size").record(entries.len() as f64);
        metrics::counter!("flashsale_settled_entries_total").increment(entries.len() as u64);
        Ok(out)
    }

    /// Acknowledges entries `ids` of `keys`' stream and drops the settled
    /// part of it (lua/settled.lua): one script, one round trip.
    async fn acknowledge(&self, keys: &ShardKeys, ids: &[&str]) -> Result<(), SettleError> {
        let last = ids
            .iter()
            .copied()
            .max_by_key(|id| stream_id(id))
            .unwrap_or("0-0");
        let _: (i64, i64) = self
            .engine
            .scripts
            .settled
            .key(&keys.stream)
            .arg(GROUP)
            .arg(last)
            .arg(ids)
            .invoke_async(&mut self.engine.conn.clone())
            .await?;
        Ok(())
    }

    /// One shard's turn: take over stale pending entries (when `claim`),
    /// then settle one batch of new ones.
    pub async fn shard_round(
        &self,
        sale: &Sale,
        shard: usize,
        claim: bool,
    ) -> Result<BatchOutcome, SettleError> {
        if claim {
            let o = self.claim_shard(sale, shard).await?;
            if o.died {
                return Ok(o);
            }
        }
        self.settle_shard(sale, shard).await
    }

    /// Settles one batch from every shard of `sale`, concurrently; returns
    /// the entries handled.
    pub async fn settle_sale_round(&self, sale: &Sale) -> Result<usize, SettleError> {
        let rounds = (0..sale.shards.len()).map(|shard| self.settle_shard(sale, shard));
        let mut n = 0;
        for r in futures::future::join_all(rounds).await {
            n += r?.entries;
        }
        Ok(n)
    }

    /// Runs until cancelled (or until the test hook "kills" it).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut active: Vec<Arc<Sale>> = Vec::new();
        let mut listed = Instant::now() - Duration::from_secs(3600);
        let mut claimed = Instant::now() - Duration::from_secs(3600);
        let mut backoff = Duration::from_millis(50);
        let mut behind = false;
        loop {
            if stop.is_cancelled() {
                break;
            }
            if listed.elapsed() >= Duration::from_secs(1) {
                match self.sales.active().await {
                    Ok(list) => {
                        for sale in &list {
                            for k in &sale.shards {
                                if let Err(e) = self.ensure_group(k).await {
                                    tracing::warn!(error = %e, "settlement: cannot create consumer group");
                                }
                            }
                        }
                        active = list;
                        listed = Instant::now();
                    }
                    Err(e) => tracing::warn!(error = %e, "settlement: cannot list sales"),
                }
            }
            let claim = claimed.elapsed() >= self.cfg.claim_every;
            if claim {
                claimed = Instant::now();
            }
            let mut work = 0;
            let mut full = false;
            let mut failed = false;
            // A shard waiting for earlier entries another consumer holds
            // (`Overtaken`, until they are claimed) holds up only itself:
            // the other sales settle on, and the loop backs off.
            let mut waiting = false;
            for sale in &active {
                // Keeping up, the shards of a sale settle one after another:
                // one settlement transaction in Postgres at a time, so where
                // Postgres shares the cores with the request path it takes
                // one of them at most (issue 16: every shard's transaction
                // at once each round stalled reservations ~10 ms). Behind (a
                // full batch last round), they settle concurrently: each has
                // its own stream, and their transactions overlap.
                let results = if behind {
                    let rounds =
                        (0..sale.shards.len()).map(|shard| self.shard_round(sale, shard, claim));
                    futures::future::join_all(rounds).await
                } else {
                    let mut results = Vec::with_capacity(sale.shards.len());
                    for shard in 0..sale.shards.len() {
                        results.push(self.shard_round(sale, shard, claim).await);
                    }
                    results
                };
                for (shard, r) in results.into_iter().enumerate() {
                    match r {
                        Ok(o) if o.died => return,
                        Ok(o) => {
                            work += o.entries;
                            full |= o.entries >= self.cfg.batch;
                        }
                        Err(SettleError::Overtaken) => {
                            tracing::info!(sale = %sale.config.id, shard, "settlement waits for earlier entries pending on another consumer");
                            waiting = true;
                        }
                        Err(e) => {
                            // This shard waits (backoff); the other shards
                            // and sales of this round still settle.
                            tracing::warn!(sale = %sale.config.id, shard, error = %e, ?backoff, "settlement batch failed; backing off");
                            failed = true;
                        }
                    }
                }
            }
            behind = full;
            let pause = if failed || waiting {
                backoff = (backoff * 2).min(Duration::from_secs(2));
                backoff
            } else {
                backoff = Duration::from_millis(50);
                if work == 0 {
                    self.cfg.idle_wait
                } else if full {
                    // Behind: no pause until the backlog is gone.
                    Duration::ZERO
                } else {
                    self.cfg.linger
                }
            };
            if !pause.is_zero() {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
        self.leave(&active).await;
    }

    /// On a clean stop, removes this worker's consumer from each group it
    /// holds nothing in, so XINFO CONSUMERS lists live workers only. A
    /// consumer with pending entries stays: deleting it would drop them
    /// from the pending list, where XAUTOCLAIM finds them.
    async fn leave(&self, sales: &[Arc<Sale>]) {
        let mut conn = self.engine.conn.clone();
        for k in sales.iter().flat_map(|s| s.shards.iter()) {
            let mine: redis::RedisResult<redis::streams::StreamPendingCountReply> = conn
                .xpending_consumer_count(&k.stream, GROUP, "-", "+", 1, &self.cfg.consumer)
                .await;
            if mine.is_ok_and(|p| p.ids.is_empty()) {
                let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
                    .arg("DELCONSUMER")
                    .arg(&k.stream)
                    .arg(GROUP)
                    .arg(&self.cfg.consumer)
                    .query_async(&mut conn)
                    .await;
            }
        }
    }
}

/// Whether the settlement group of `keys`' stream has an entry older than
/// `first` still pending (delivered, not acknowledged), on any consumer.
async fn earlier_pending(
    conn: &mut crate::reserve::store::RedisConn,
    keys: &ShardKeys,
    first: &str,
) -> Result<bool, SettleError> {
    let p: redis::streams::StreamPendingReply = conn.xpending(&keys.stream, GROUP).await?;
    Ok(match p {
        redis::streams::StreamPendingReply::Data(d) => stream_id(&d.start_id) < stream_id(first),
        _ => false,
    })
}

/// A stream entry id `ms-seq` as a number pair (ids order numerically, not
/// as strings); an id that does not parse sorts last (nothing is older).
fn stream_id(id: &str) -> (u64, u64) {
    id.split_once('-')
        .and_then(|(ms, seq)| Some((ms.parse().ok()?, seq.parse().ok()?)))
        .unwrap_or((u64::MAX, u64::MAX))
}

fn released_status(reason: &str) -> &'static str {
    match reason {
        "expired" => "expired",
        "cancelled" => "cancelled",
        _ => "rejected",
    }
}

/// Moves released reservations out of their live status and gives their
/// units back; returns how many it released. A release whose hold Postgres
/// does not know yet (the hold's batch failed and is still pending, or it
/// comes later in this batch) writes the row as released from what the
/// release record carries, so the hold, when it arrives, finds its row and
/// takes nothing (`ON CONFLICT DO NOTHING`): no phantom live row.
///
/// Two settlers (issue 43 #1): the hold may be in another settler's
/// transaction, inserted but not committed, when this one looks. The lookup
/// cannot see it, and the insert of the released row waits for that
/// transaction and then conflicts. A row that conflicted exists now (each
/// statement of a READ COMMITTED transaction sees what committed before it
/// began), so its release is applied to it again: the hold ends released
/// and its unit leaves `held`, whichever settler commits first.
async fn apply_releases(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    sale_id: &str,
    releases: &[Record],
) -> Result<usize, sqlx::Error> {
    if releases.is_empty() {
        return Ok(0);
    }
    let mut by_reason: HashMap<&str, Vec<String>> = HashMap::new();
    for r in releases {
        if let Record::Release { id, reason, .. } = r {
            by_reason
                .entry(reason.as_str())
                .or_default()
                .push(id.clone());
        }
    }
    let mut count = 0;
    for (reason, ids) in &by_reason {
        count += release_rows(tx, sale_id, ids, reason).await?;
    }
    let all: Vec<String> = by_reason.values().flatten().cloned().collect();
    let known: std::collections::HashSet<String> =
        sqlx::query_scalar("SELECT id FROM reservations WHERE id = ANY($1)")
            .bind(&all)
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .collect();
    let mut cols = RowColumns::default();
    let (mut statuses, mut reasons) = (vec![], vec![]);
    for r in releases {
        let Record::Release { id, reason, row } = r else {
            continue;
        };
        if known.contains(id) || cols.ids.contains(id) {
            continue;
        }
        let Some(row) = row else {
            tracing::warn!(sale = %sale_id, %id, "release of a hold Postgres does not know, without the hold's fields; nothing written");
            continue;
        };
        cols.push(id, row);
        statuses.push(released_status(reason));
        reasons.push(reason.clone());
    }
    if !cols.ids.is_empty() {
        let inserted: std::collections::HashSet<String> = cols
            .bind(sqlx::query(
                "INSERT INTO reservations (id, sale_id, account, qty, status, shard, home, created_at, expires_at,
                                           released_at, release_reason, idem, requested_qty, sku)
                 SELECT u.id, $1, u.account, u.qty, u.status, u.shard, u.home, u.created_at, u.expires_at, now(), u.reason, u.idem, u.rq, u.sku
                 FROM unnest($2::text[], $3::text[], $4::int[], $5::int[], $6::int[], $7::timestamptz[], $8::timestamptz[],
                             $9::text[], $10::int[], $11::int[], $12::text[], $13::text[])
                      AS u(id, account, qty, shard, home, created_at, expires_at, idem, rq, sku, status, reason)
                 ON CONFLICT (id) DO NOTHING
                 RETURNING id",
            ).bind(sale_id))
            .bind(&statuses)
            .bind(&reasons)
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .map(|r| r.get::<String, _>(0))
            .collect();
        count += inserted.len();
        // Rows another settler committed since the lookup: release them now.
        let mut raced: HashMap<&str, Vec<String>> = HashMap::new();
        for (id, reason) in cols.ids.iter().zip(&reasons) {
            if !inserted.contains(id) {
                raced.entry(reason.as_str()).or_default().push(id.clone());
            }
        }
        for (reason, ids) in &raced {
            let n = release_rows(tx, sale_id, ids, reason).await?;
            if n > 0 {
                metrics::counter!("flashsale_settlement_release_races_total").increment(n as u64);
            }
            count += n;
        }
    }
    Ok(count)
}

/// The live rows among `ids` leave their live status for `reason`'s, and
/// their units leave `held`; returns how many rows it released.
async fn release_rows(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    sale_id: &str,
    ids: &[String],
    reason: &str,
) -> Result<usize, sqlx::Error> {
    let released: Vec<(i32, i32)> = sqlx::query_as(
        "UPDATE reservations SET status = $2, released_at = now(), release_reason = $3
         WHERE id = ANY($1) AND sale_id = $4 AND status IN ('settled', 'pending_payment')
         RETURNING sku, qty",
    )
    .bind(ids)
    .bind(released_status(reason))
    .bind(reason)
    .bind(sale_id)
    .fetch_all(&mut **tx)
    .await?;
    give_back_units(tx, sale_id, &released).await?;
    Ok(released.len())
}

/// Every reservation row names a sale Postgres has: the batch locks the
/// sale's row against deletion until it commits (`FOR KEY SHARE`, the lock a
/// foreign key check takes per row; migration 0012 replaced that check,
/// ~4 µs per settled hold, with this one per batch), and writes nothing if
/// the sale is missing: its entries stay pending.
async fn lock_sale(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    sale: &str,
) -> Result<(), SettleError> {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM sales WHERE id = $1 FOR KEY SHARE")
        .bind(sale)
        .fetch_optional(&mut **tx)
        .await?;
    found
        .map(|_| ())
        .ok_or_else(|| SettleError::UnknownSale(sale.to_string()))
}

/// The conditional inventory update, the last guard of "never one too
/// many": takes the `(sku position, qty)` units into `held` only if the
/// sale's held + sold stay within its total AND each SKU's within its
/// units. All or nothing: returns whether it took them (when not, nothing
/// changed). The sale's row first: it serialises the sale's writers, so the
/// SKU rows are never locked in two orders (`migrations/0015`).
async fn take_units(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    sale: &str,
    takes: &[(i32, i32)],
) -> Result<bool, sqlx::Error> {
    let n: i32 = takes.iter().map(|(_, q)| q).sum();
    let r = sqlx::query(
        "UPDATE inventory SET held = held + $2 WHERE sale_id = $1 AND held + sold + $2 <= total",
    )
    .bind(sale)
    .bind(n)
    .execute(&mut **tx)
    .await?;
    if r.rows_affected() != 1 {
        return Ok(false);
    }
    let per_sku = by_sku(takes);
    let (positions, qtys): (Vec<i32>, Vec<i32>) = per_sku.iter().copied().unzip();
    // Each SKU row's condition is rechecked on its latest version under its
    // row lock, so the rows that come back are exactly the ones that fit.
    let fitted: Vec<i32> = sqlx::query_scalar(
        "UPDATE skus k SET held = k.held + w.n
           FROM unnest($2::int[], $3::int[]) AS w(pos, n)
          WHERE k.sale_id = $1 AND k.position = w.pos AND k.held + k.sold + w.n <= k.units_total
         RETURNING k.position",
    )
    .bind(sale)
    .bind(&positions)
    .bind(&qtys)
    .fetch_all(&mut **tx)
    .await?;
    if fitted.len() == per_sku.len() {
        return Ok(true);
    }
    // Some SKU would go over: undo what was taken, the caller goes hold by
    // hold.
    let undo: Vec<(i32, i32)> = per_sku
        .into_iter()
        .filter(|(p, _)| fitted.contains(p))
        .collect();
    sku_held_less(tx, sale, &undo).await?;
    sqlx::query("UPDATE inventory SET held = held - $2 WHERE sale_id = $1")
        .bind(sale)
        .bind(n)
        .execute(&mut **tx)
        .await?;
    Ok(false)
}

/// `(sku position, qty)` pairs summed per SKU, in position order.
fn by_sku(pairs: &[(i32, i32)]) -> Vec<(i32, i32)> {
    let mut sums: std::collections::BTreeMap<i32, i32> = Default::default();
    for (p, q) in pairs {
        *sums.entry(*p).or_default() += q;
    }
    sums.into_iter().collect()
}

/// Released units leave `held`: the sale's and each SKU's (`(sku position,
/// qty)` pairs; the sale's row first, as in [`take_units`]).
pub(crate) async fn give_back_units(
    tx: &mut sqlx::PgConnection,
    sale: &str,
    released: &[(i32, i32)],
) -> Result<(), sqlx::Error> {
    let n: i32 = released.iter().map(|(_, q)| q).sum();
    if n == 0 {
        return Ok(());
    }
    sqlx::query("UPDATE inventory SET held = held - $2 WHERE sale_id = $1")
        .bind(sale)
        .bind(n)
        .execute(&mut *tx)
        .await?;
    sku_held_less(tx, sale, &by_sku(released)).await
}

/// Each SKU's `held` less its `(sku position, qty)` pairs (one per SKU).
async fn sku_held_less(
    tx: &mut sqlx::PgConnection,
    sale: &str,
    per_sku: &[(i32, i32)],
) -> Result<(), sqlx::Error> {
    let (positions, qtys): (Vec<i32>, Vec<i32>) = per_sku.iter().copied().unzip();
    sqlx::query(
        "UPDATE skus k SET held = k.held - w.n FROM unnest($2::int[], $3::int[]) AS w(pos, n)
          WHERE k.sale_id = $1 AND k.position = w.pos",
    )
    .bind(sale)
    .bind(&positions)
    .bind(&qtys)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Settlement lag of a sale: entries in its streams not yet settled.
pub async fn lag(engine: &Engine, sale: &Sale) -> redis::RedisResult<i64> {
    let mut conn = engine.conn.clone();
    let mut n = 0;
    for k in &sale.shards {
        let len: i64 = conn.xlen(&k.stream).await?;
        n += len;
    }
    Ok(n)
}

/// One hold's stream entry in both layouts (shard 2 of sale `s`), for the
/// tests of every reader of the stream.
#[cfg(test)]
pub(crate) mod fixtures {
    const REC: &str = r#"{"a":"al\"ice","q":2,"e":1700000060000,"h":1,"c":1700000000000,"s":"held","k":"abc","r":3}"#;
    /// As `lua/_lib.lua` `grant_hold` writes it.
    pub(crate) const HOLD_AS_REC: &[(&str, &str)] =
        &[("t", "hold"), ("id", "s.1.x"), ("sale", "s"), ("rec", REC)];
    /// As older origins (and `lua/restore.lua`) wrote it.
    pub(crate) const HOLD_AS_FIELDS: &[(&str, &str)] = &[
        ("t", "hold"),
        ("id", "s.1.x"),
        ("sale", "s"),
        ("acct", "al\"ice"),
        ("qty", "2"),
        ("shard", "2"),
        ("home", "1"),
        ("exp", "1700000060000"),
        ("at", "1700000000000"),
        ("idem", "abc"),
        ("rq", "3"),
    ];
}

#[cfg(test)]
mod tests {
    use super::{Entry, fixtures, stream_id};
    use redis::Value;

    fn bulk(s: &[u8]) -> Value {
        Value::BulkString(s.to_vec())
    }

    fn entry(id: &str, flat: &[&[u8]]) -> Value {
        Value::Array(vec![
            bulk(id.as_bytes()),
            Value::Array(flat.iter().map(|b| bulk(b)).collect()),
        ])
    }

    #[test]
    fn a_read_reply_gives_its_entries_in_order_with_their_fields_in_order() {
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk(b"s"),
            Value::Array(vec![
                entry("1-0", &[b"t", b"hold", b"id", b"a"]),
                entry("1-1", &[b"t", b"release", b"id", b"\xff"]),
            ]),
        ])]);
        let got = Entry::from_read_reply(resp2).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].id.as_str(), got[0].get("t"), got[0].get("id")),
            ("1-0", Some("hold"), Some("a"))
        );
        assert_eq!(got[1].get("id"), None, "not UTF-8: no value to parse");
        assert_eq!(
            got[1].fields[1],
            (b"id".to_vec(), b"\xff".to_vec()),
            "kept whole for the dead-letter stream"
        );
        // RESP3 answers a map of streams.
        let resp3 = Value::Map(vec![(
            bulk(b"s"),
            Value::Array(vec![entry("2-0", &[b"t", b"hold"])]),
        )]);
        assert_eq!(
            Entry::from_read_reply(resp3).unwrap()[0].get("t"),
            Some("hold")
        );
        assert_eq!(
            Entry::from_read_reply(Value::Nil),
            Some(vec![]),
            "nothing new"
        );
    }

    #[test]
    fn an_entry_deleted_while_pending_reads_as_one_without_fields() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk(b"s"),
            Value::Array(vec![Value::Array(vec![bulk(b"3-0"), Value::Nil])]),
        ])]);
        let got = Entry::from_read_reply(reply).unwrap();
        assert_eq!((got[0].id.as_str(), got[0].fields.len()), ("3-0", 0));
        assert!(
            super::parse(&got[0], "sale", 0).is_none(),
            "malformed: parked"
        );
    }

    #[test]
    fn an_autoclaim_reply_gives_the_claimed_entries() {
        let reply = Value::Array(vec![
            bulk(b"0-0"),
            Value::Array(vec![entry("4-0", &[b"t", b"hold"])]),
            Value::Array(vec![bulk(b"3-0")]),
        ]);
        let got = Entry::from_autoclaim_reply(reply).unwrap();
        assert_eq!((got.len(), got[0].id.as_str()), (1, "4-0"));
        assert_eq!(Entry::from_autoclaim_reply(Value::Nil), None);
    }

    #[test]
    fn a_reply_of_another_shape_is_refused_not_guessed() {
        let odd_fields = Value::Array(vec![Value::Array(vec![
            bulk(b"s"),
            Value::Array(vec![entry("1-0", &[b"t", b"hold", b"id"])]),
        ])]);
        assert_eq!(Entry::from_read_reply(odd_fields), None);
        assert_eq!(Entry::from_read_reply(Value::Int(1)), None);
        assert_eq!(Entry::from_read_reply(Value::Array(vec![bulk(b"s")])), None);
    }

    fn fields(kv: &[(&str, &str)]) -> Entry {
        Entry {
            id: "1-0".into(),
            fields: kv
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        }
    }

    #[test]
    fn a_hold_record_reads_the_same_from_its_rec_as_from_its_fields() {
        let new = fields(fixtures::HOLD_AS_REC);
        let old = fields(fixtures::HOLD_AS_FIELDS);
        let got = super::parse(&new, "s", 2).expect("a hold");
        assert_eq!(Some(&got), super::parse(&old, "s", 2).as_ref());
        let super::Record::Hold { id, row } = got else {
            panic!("a hold")
        };
        assert_eq!(
            (
                id.as_str(),
                row.account.as_str(),
                row.qty,
                row.shard,
                row.home
            ),
            ("s.1.x", "al\"ice", 2, 2, 1),
            "the shard is the stream's"
        );
        assert_eq!(row.expires_at.timestamp_millis(), 1_700_000_060_000);
        assert_eq!((row.idem.as_deref(), row.requested), (Some("abc"), Some(3)));
        assert!(super::parse(&new, "other", 2).is_none(), "another sale's");
        for bad in [
            "not json",
            r#"{"a":"x","q":0,"e":1,"h":0,"c":1,"s":"held"}"#,
            r#"{"a":"x","q":1,"h":0,"c":1,"s":"held"}"#,
        ] {
            let e = fields(&[("t", "hold"), ("id", "s.0.x"), ("sale", "s"), ("rec", bad)]);
            assert!(super::parse(&e, "s", 0).is_none(), "malformed: {bad}");
        }
    }

    #[test]
    fn stream_ids_order_numerically_not_as_strings() {
        assert!(stream_id("999-0") < stream_id("1000-0"));
        assert!(stream_id("1000-9") < stream_id("1000-10"));
        assert!(stream_id("1000-0") < stream_id("not an id"));
    }
}
