//! The reconciler and the cold rebuild: Redis against Postgres.
//!
//! Per shard, Postgres implies the stock exactly: a hold takes units from the
//! shard it was granted on and a release gives them back there, so
//! `stock(s) = share(s) − Σ qty of live reservations on s` (live = settled,
//! pending_payment, paid). In a sale of several SKUs this holds per SKU:
//! `stock(s, p) = share(s, p) − Σ qty of live reservations of SKU p on s`
//! for each SKU p placed on s (`crate::sales::placement`), and the shard is
//! compared and repaired as a whole (every SKU's key at the one version). The reconciler compares that with Redis once the
//! shard's stream is drained, reports the drift (metric + log line) and
//! repairs the stock with reconcile.lua, which refuses if the stream is not
//! drained or the shard moved since it was read: it never "repairs" from a
//! Postgres that is behind.
//!
//! When the hold records themselves disagree, one direction has a known
//! cause and is repaired: a reservation Postgres has live that the drained,
//! stable shard does not hold. Only a failover does that (the settler wrote
//! the hold from a primary whose replica never had it, which `REDIS_ACK=local`
//! allows; `wait` makes the settler wait for a replica). Nothing else would
//! ever release it, so:
//! - unpaid (`settled`/`pending_payment`): released in Postgres (`expired`,
//!   `release_reason = 'lost'`, its units back in `inventory`, one
//!   transaction) — Redis already offers those units again; its
//!   Idempotency-Key record is put back (if absent) so a retried key gets
//!   its first answer, not a second reservation;
//! - `paid`: its hold record is put back in Redis as paid and its units
//!   taken from the shard's stock (restore.lua: atomically, only at the
//!   version compared), with the account's count, its spill quota
//!   (restore_quota.lua on the home shard, counted first) and its key record.
//!
//! Each repair runs under the reservation's and its payments' row locks
//! (`NOWAIT`, the locks a purchase and a payment event take first, as in
//! `saga::align_hold`), re-reads Redis under them (the shard still at the
//! version compared, the hold still nowhere), and skips the reservation
//! when anything is locked or moved: the next round looks again. The settler
//! cannot interleave (a new entry moves the version; an entry it applies
//! meanwhile waits on the row lock and then finds the row released), the
//! sweep has no hold to expire, and a shard whose keys are gone is the cold
//! rebuild's (it is never compared). Hold records Postgres does not have
//! live are reported and left alone: that needs an operator.
//!
//! A round costs Redis and this process a bounded amount of work per step,
//! whatever the number of holds: hold records are read with `HSCAN` in
//! chunks, never as one reply. A scan is not a snapshot, so a shard is
//! compared only between two equal *versions* (observe.lua: the id of the
//! last record appended to the shard's stream, which every unit that moves
//! appends to in the same script): observe, read Postgres, scan, observe
//! again; if the version moved, the shard is busy and is left for the next
//! round. reconcile.lua repairs only at the version compared, so a hold that
//! came and went (leaving the stock as it was read) cannot slip past it.
//!
//! Each hold's `paid` state in Redis is also compared with its reservation
//! in Postgres (a crash between the payment saga's confirm and its commit
//! leaves Redis `paid` over an unpaid reservation: a unit no expiry would
//! return). The disagreement is reported and, when repairing, re-aligned
//! with Postgres under the rows' locks (`saga::align_hold`). This check
//! runs every round whatever the load, so it reads only what can disagree:
//! Postgres's paid reservations and their hold records, with the number of
//! holds Redis has as paid (paid_holds.lua); every hold record is read only
//! when that number says some hold is paid in Redis alone.
//!
//! A shard whose keys are gone is not compared: it is rebuilt from Postgres
//! (`crate::settle::rebuild`).

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::payments::saga::{self, Alignment};
use crate::reserve::engine::{Engine, HoldRecord, IDEMPOTENCY_TTL_SECS};
use crate::sales::registry::SaleRegistry;
use crate::sales::sale::Sale;
use crate::settle::rebuild::{RebuildError, rebuild_sale};
use crate::settle::scan::{HashScan, REBUILD_COLUMNS, RebuildRow, SCAN_CHUNK, key_ttl};
use crate::settle::settler;

/// What reconciling one sale found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub sale: String,
    /// Entries not yet settled; when > 0 nothing was compared or repaired.
    pub lag: i64,
    /// Σ over shards of |Redis stock − stock Postgres implies|: absolute,
    /// so drifts in opposite directions on two shards cannot hide each other.
    pub drift: i64,
    pub repaired_shards: Vec<usize>,
    pub rebuilt_shards: Vec<usize>,
    /// Shards whose hold records disagree with Postgres (not auto-repaired).
    pub mismatched_shards: Vec<usize>,
    /// Settlement entries parked in the sale's dead-letter streams (each
    /// needs an operator: docs/operations.md, "Dead letters").
    pub dead_letters: i64,
    /// Holds whose `paid` state in Redis disagrees with Postgres (Redis
    /// `paid`, reservation not paid; or the reverse), by reservation id.
    pub state_mismatches: Vec<String>,
    /// Those of them re-aligned with Postgres this round (when `repair`).
    pub aligned: Vec<String>,
    /// Reservations Postgres has live that their drained, stable shard does
    /// not hold (a failover took them back), by id.
    pub lost_holds: Vec<String>,
    /// Those of them that were unpaid and are now released in Postgres
    /// (`release_reason = 'lost'`) (when `repair`).
    pub released_lost: Vec<String>,
    /// Those of them that were paid and whose hold is back in Redis (when
    /// `repair`).
    pub restored_paid: Vec<String>,
    /// Hold records read one by one for the paid-state check this round: 0
    /// when Postgres's paid reservations accounted for every paid hold.
    pub hold_records_scanned: usize,
}

/// One shard as observe.lua read it at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observed {
    /// `None`: the shard's keys are gone.
    stock: Option<String>,
    /// The other SKUs placed on the shard (sale of several SKUs): their
    /// position and stock (`None`: the key is gone).
    skus: Vec<(i32, Option<String>)>,
    /// Settlement entries not yet in Postgres.
    unsettled: i64,
    /// The id of the last entry appended to the shard's stream: unchanged
    /// means no unit moved and no hold came or went.
    version: String,
}

pub(crate) async fn observe(
    engine: &Engine,
    sale: &Sale,
    i: usize,
) -> Result<Observed, redis::RedisError> {
    let k = &sale.shards[i];
    let positions = other_skus_on(sale, i);
    let mut conn = engine.conn.clone();
    let (stock, unsettled, version, skus): (Option<String>, i64, String, Vec<Option<String>>) =
        engine
            .scripts
            .observe
            .key(&k.stock)
            .key(&k.stream)
            .arg(positions.as_slice())
            .invoke_async(&mut conn)
            .await?;
    Ok(Observed {
        stock,
        skus: positions.into_iter().zip(skus).collect(),
        unsettled,
        version,
    })
}

/// The positions other than 0 of the SKUs placed on shard `i` (none in a
/// one-SKU sale).
fn other_skus_on(sale: &Sale, i: usize) -> Vec<i32> {
    (1..sale.placements.len())
        .filter(|p| sale.placements[*p].holds(i))
        .map(|p| p as i32)
        .collect()
}

impl Observed {
    /// Whether the shard (any of its SKUs' keys) is gone.
    fn lost(&self) -> bool {
        self.stock.is_none() || self.skus.iter().any(|(_, s)| s.is_none())
    }
}

/// Live reservations (held, pending or paid) Postgres records on one shard.
async fn live_on_shard(
    pool: &PgPool,
    sale: &str,
    shard: usize,
) -> Result<Vec<(String, i32, i32)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, qty, sku FROM reservations
         WHERE sale_id = $1 AND shard = $2 AND status IN ('settled', 'pending_payment', 'paid')",
    )
    .bind(sale)
    .bind(shard as i32)
    .fetch_all(pool)
    .await
}

/// How one shard compared.
enum ShardCheck {
    /// Units moved while it was read: nothing to conclude this round.
    Moving,
    /// Redis's hold records and Postgres's live reservations differ.
    Mismatch {
        observed: Observed,
        /// Live in Postgres, no hold record on the shard.
        missing: Vec<String>,
        /// Hold records Postgres does not have live.
        extra: usize,
    },
    /// The records agree; the stock Redis has and the one Postgres implies
    /// for each SKU on the shard (position 0 first).
    Compared {
        observed: Observed,
        expected: Vec<(i32, i64)>,
    },
}

/// Compares one drained shard with Postgres, between two equal versions:
/// observe, read Postgres (which then has every entry up to the
/// observation), scan the hold records, observe again. If nothing moved in
/// between, the scan is exactly the records at the observation and the
/// figure from Postgres is exactly the stock they imply.
async fn compare_shard(
    engine: &Engine,
    pool: &PgPool,
    sale: &Sale,
    i: usize,
) -> Result<ShardCheck, ReconcileError> {
    let cfg = &sale.config;
    let k = &sale.shards[i];
    let before = observe(engine, sale, i).await?;
    if before.lost() || before.unsettled > 0 {
        return Ok(ShardCheck::Moving);
    }
    let live = live_on_shard(pool, &cfg.id, i).await?;
    let expected: Vec<(i32, i64)> = std::iter::once(0)
        .chain(other_skus_on(sale, i))
        .map(|p| {
            let units = usize::try_from(p)
                .ok()
                .and_then(|p| cfg.skus.get(p))
                .map_or(0, |s| s.units_total);
            let held: i64 = live
                .iter()
                .filter(|(_, _, sku)| *sku == p)
                .map(|(_, q, _)| i64::from(*q))
                .sum();
            (p, i64::from(sale.placement(p).units_on(units, i)) - held)
        })
        .collect();
    let mut redis_ids: HashSet<String> = HashSet::new();
    let mut scan = HashScan::new(&k.holds);
    while let Some(pairs) = scan.next(engine).await? {
        redis_ids.extend(pairs.into_iter().map(|(id, _)| id));
        // A sale that starts selling again mid-scan (10^6 holds are a
        // thousand chunks) is left at once, not read to the end in vain.
        if observe(engine, sale, i).await? != before {
            return Ok(ShardCheck::Moving);
        }
    }
    if observe(engine, sale, i).await? != before {
        return Ok(ShardCheck::Moving);
    }
    let missing: Vec<String> = live
        .iter()
        .filter(|(id, _, _)| !redis_ids.contains(id))
        .map(|(id, _, _)| id.clone())
        .collect();
    let extra = redis_ids.len() - (live.len() - missing.len());
    if !missing.is_empty() || extra > 0 {
        return Ok(ShardCheck::Mismatch {
            observed: before,
            missing,
            extra,
        });
    }
    Ok(ShardCheck::Compared {
        observed: before,
        expected,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("postgres: {0}")]
    Db(#[from] sqlx::Error),
}

impl From<RebuildError> for ReconcileError {
    fn from(e: RebuildError) -> Self {
        match e {
            RebuildError::Redis(r) => ReconcileError::Redis(r),
            RebuildError::Db(d) => ReconcileError::Db(d),
        }
    }
}

impl From<saga::AlignError> for ReconcileError {
    fn from(e: saga::AlignError) -> Self {
        match e {
            saga::AlignError::Db(d) => ReconcileError::Db(d),
            saga::AlignError::Redis(r) => ReconcileError::Redis(r),
        }
    }
}

/// Compares one sale and, when `repair`, repairs it.
pub async fn reconcile_sale(
    engine: &Engine,
    pool: &PgPool,
    sale: &Sale,
    repair: bool,
) -> Result<Report, ReconcileError> {
    let cfg = &sale.config;
    let mut report = Report {
        sale: cfg.id.clone(),
        ..Default::default()
    };
    let mut conn = engine.conn.clone();
    let mut lost = Vec::new();
    for (i, k) in sale.shards.iter().enumerate() {
        let exists: bool = conn.exists(&k.stock).await?;
        if !exists {
            lost.push(i);
        }
        let parked: i64 = conn.xlen(&k.dead_letter).await?;
        report.dead_letters += parked;
    }
    metrics::gauge!("flashsale_dead_letter_entries", "sale" => cfg.id.clone())
        .set(report.dead_letters as f64);
    if !lost.is_empty() {
        if repair {
            report.rebuilt_shards = rebuild_sale(engine, pool, sale).await?;
        } else {
            report.rebuilt_shards = lost;
        }
        return Ok(report);
    }
    check_hold_states(engine, pool, sale, repair, &mut report).await?;
    report.lag = settler::lag(engine, sale).await?;
    metrics::gauge!("flashsale_settlement_lag", "sale" => cfg.id.clone()).set(report.lag as f64);
    if report.lag > 0 {
        tracing::info!(sale = %cfg.id, lag = report.lag, "reconcile: settlement is behind; not comparing");
        return Ok(report);
    }
    for (i, k) in sale.shards.iter().enumerate() {
        let (observed, expected) = match compare_shard(engine, pool, sale, i).await? {
            ShardCheck::Moving => continue,
            ShardCheck::Mismatch {
                observed,
                missing,
                extra,
            } => {
                report.lost_holds.extend(missing.iter().cloned());
                let repaired = if repair && !missing.is_empty() {
                    repair_missing(engine, pool, sale, i, &observed, &missing, &mut report).await?
                } else {
                    0
                };
                let left = missing.len() - repaired;
                if left > 0 || extra > 0 {
                    tracing::error!(sale = %cfg.id, shard = i, missing = left, extra, "reconcile: hold records disagree; left for an operator or the next round");
                    report.mismatched_shards.push(i);
                }
                continue;
            }
            ShardCheck::Compared { observed, expected } => (observed, expected),
        };
        // Each SKU's stock as observed, position 0 (the shard's own key)
        // first, in `expected`'s order.
        let Some(stock) = observed.stock.clone() else {
            continue;
        };
        let seen: Vec<String> = std::iter::once(stock)
            .chain(observed.skus.iter().filter_map(|(_, s)| s.clone()))
            .collect();
        let mut shard_drift = 0;
        for ((p, want), have) in expected.iter().zip(&seen) {
            let have: i64 = have.parse().unwrap_or(i64::MIN);
            let drift = have - want;
            if drift != 0 {
                tracing::warn!(sale = %cfg.id, shard = i, sku = p, redis = have, postgres = want, drift, "reconcile: stock drift");
            }
            shard_drift += drift.abs();
        }
        report.drift += shard_drift;
        if shard_drift != 0 && repair {
            let mut conn = engine.conn.clone();
            let mut call = engine.scripts.reconcile.key(&k.stock);
            call.key(&k.stream)
                .arg(&seen[0])
                .arg(expected[0].1)
                .arg(&observed.version);
            for ((p, want), have) in expected.iter().zip(&seen).skip(1) {
                call.arg(p).arg(have).arg(want);
            }
            let fixed: i64 = call.invoke_async(&mut conn).await?;
            if fixed == 1 {
                report.repaired_shards.push(i);
                tracing::warn!(sale = %cfg.id, shard = i, "reconcile: repaired Redis stock from Postgres");
            }
        }
    }
    metrics::gauge!("flashsale_drift_units", "sale" => cfg.id.clone()).set(report.drift as f64);
    metrics::gauge!("flashsale_mismatched_shards", "sale" => cfg.id.clone())
        .set(report.mismatched_shards.len() as f64);
    Ok(report)
}

/// What one repair of a missing hold came to.
enum Repair {
    /// Unpaid: released in Postgres.
    Released,
    /// Paid: back in Redis; the shard's version after it.
    Restored { version: String },
    /// Not now (locked, moved, found after all, no stock): the next round.
    Skipped(&'static str),
}

/// Repairs the reservations Postgres has live on shard `i` that the shard,
/// drained and stable at `observed`, does not hold (module doc); returns
/// how many it repaired. Unpaid ones first: releasing them in Postgres
/// does not move the shard's version, a restore does (and says to what, so
/// the next restore of this comparison checks against it).
async fn repair_missing(
    engine: &Engine,
    pool: &PgPool,
    sale: &Sale,
    i: usize,
    observed: &Observed,
    missing: &[String],
    report: &mut Report,
) -> Result<usize, ReconcileError> {
    let cfg = &sale.config;
    let rows: Vec<RebuildRow> = sqlx::query_as(&format!(
        "SELECT {REBUILD_COLUMNS} FROM reservations WHERE sale_id = $1 AND id = ANY($2)"
    ))
    .bind(&cfg.id)
    .bind(missing)
    .fetch_all(pool)
    .await?;
    let multi = sale.multi_sku();
    let mut rows: Vec<RebuildRow> = rows.into_iter().map(|r| r.in_sale(multi)).collect();
    rows.sort_by_key(|r| (r.status == "paid", r.created_at));
    let mut version = observed.version.clone();
    let mut repaired = 0;
    for r in &rows {
        match repair_one(engine, pool, sale, i, &version, r).await? {
            Repair::Released => {
                tracing::warn!(sale = %cfg.id, shard = i, reservation = %r.id, account = %r.account, qty = r.qty, "reconcile: released in Postgres a hold the shard lost (failover); its units are on sale again");
                metrics::counter!("flashsale_lost_holds_total", "repair" => "released")
                    .increment(1);
                report.released_lost.push(r.id.clone());
                repaired += 1;
            }
            Repair::Restored { version: v } => {
                tracing::warn!(sale = %cfg.id, shard = i, reservation = %r.id, account = %r.account, qty = r.qty, "reconcile: restored in Redis a paid hold the shard lost (failover)");
                metrics::counter!("flashsale_lost_holds_total", "repair" => "restored")
                    .increment(1);
                report.restored_paid.push(r.id.clone());
                version = v;
                repaired += 1;
            }
            Repair::Skipped(why) => {
                tracing::info!(sale = %cfg.id, shard = i, reservation = %r.id, why, "reconcile: a lost hold not repaired this round");
            }
        }
    }
    Ok(repaired)
}

/// One missing hold, under the reservation's and its payments' row locks:
/// committed when repaired, rolled back explicitly otherwise (a dropped
/// transaction would keep the rows locked until its pooled connection is
/// used again).
async fn repair_one(
    engine: &Engine,
    pool: &PgPool,
    sale: &Sale,
    i: usize,
    version: &str,
    r: &RebuildRow,
) -> Result<Repair, ReconcileError> {
    let mut tx = pool.begin().await?;
    let outcome = repair_locked(&mut tx, engine, sale, i, version, r).await;
    if !matches!(outcome, Ok(Repair::Released | Repair::Restored { .. })) {
        tx.rollback().await?;
        return outcome;
    }
    // Released only now: a restore's Redis change happened under the locks.
    tx.commit().await?;
    if let Ok(Repair::Released) = outcome
        && let Some((key, ttl)) = key_to_restore(sale, r)
    {
        // A retried key answers its first hold (gone), as after a cold
        // rebuild, rather than making a second reservation.
        let _: redis::Value = redis::cmd("SET")
            .arg(key)
            .arg(r.key_record().to_string())
            .arg("NX")
            .arg("EX")
            .arg(ttl)
            .query_async(&mut engine.conn.clone())
            .await?;
    }
    outcome
}

/// The reservation's Idempotency-Key record on its home shard and the
/// seconds it has left, if it has one still to keep.
fn key_to_restore(sale: &Sale, r: &RebuildRow) -> Option<(String, i64)> {
    let ttl = key_ttl(
        r.created_at.timestamp_millis(),
        Utc::now().timestamp_millis(),
    );
    let home = sale.shards.get(r.home as usize)?;
    Some((home.idem_at(r.idem.as_deref()?), ttl)).filter(|_| ttl > 0)
}

async fn repair_locked(
    tx: &mut sqlx::PgConnection,
    engine: &Engine,
    sale: &Sale,
    i: usize,
    version: &str,
    r: &RebuildRow,
) -> Result<Repair, ReconcileError> {
    let (Some(k), Some(home)) = (sale.shards.get(i), sale.shards.get(r.home as usize)) else {
        return Ok(Repair::Skipped("unknown shard"));
    };
    let Some(status) = saga::lock_reservation_rows(tx, &r.id).await? else {
        return Ok(Repair::Skipped("locked"));
    };
    if status.as_deref() != Some(r.status.as_str()) {
        return Ok(Repair::Skipped("changed"));
    }
    // Under the locks, Redis again: the hold still nowhere to be found.
    if engine
        .find_hold(sale, &r.id, r.home as usize)
        .await?
        .is_some()
    {
        return Ok(Repair::Skipped("found"));
    }
    if r.status != "paid" {
        // The shard still at the version compared: no hold came or went.
        let now = observe(engine, sale, i).await?;
        if now.lost() || now.version != version {
            return Ok(Repair::Skipped("moved"));
        }
        let released: Option<(i32, i32)> = sqlx::query_as(
            "UPDATE reservations SET status = 'expired', released_at = now(), release_reason = 'lost'
             WHERE id = $1 AND status IN ('settled', 'pending_payment') RETURNING sku, qty",
        )
        .bind(&r.id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(released) = released else {
            return Ok(Repair::Skipped("changed"));
        };
        settler::give_back_units(&mut *tx, &sale.config.id, &[released]).await?;
        return Ok(Repair::Released);
    }
    // Paid: the count (and quota) on the home shard first, the safe side.
    // (A hold without a key record to restore still names a key in the
    // script's slot; the script leaves it alone when given no value.)
    let key = key_to_restore(sale, r);
    let ttl = key.as_ref().map_or(1, |(_, ttl)| *ttl);
    let record = || {
        key.as_ref()
            .map(|_| r.key_record().to_string())
            .unwrap_or_default()
    };
    let mut conn = engine.conn.clone();
    let spilled = r.home as usize != i;
    let counted_now = if spilled {
        let counted: i64 = engine
            .scripts
            .restore_quota
            .key(&home.stock)
            .key(&home.users)
            .key(&home.quota)
            .key(
                key.as_ref()
                    .map_or_else(|| home.idem_at("none"), |(k, _)| k.clone()),
            )
            .arg(&r.id)
            .arg(&r.account)
            .arg(r.qty)
            .arg(i)
            .arg(record())
            .arg(ttl)
            .arg(r.sku.map(|p| p.to_string()).unwrap_or_default())
            .invoke_async(&mut conn)
            .await?;
        if counted < 0 {
            return Ok(Repair::Skipped("home shard lost"));
        }
        counted == 1
    } else {
        false
    };
    let (eighth, value, eighth_ttl) = if spilled {
        (
            k.spill_marker(&r.id),
            "H".to_string(),
            IDEMPOTENCY_TTL_SECS as i64,
        )
    } else {
        let key = key
            .as_ref()
            .map_or_else(|| k.idem_at("none"), |(k, _)| k.clone());
        (key, record(), ttl)
    };
    let (done, detail): (i64, String) = engine
        .scripts
        .restore
        .key(k.all().as_slice())
        .key(eighth)
        .arg(version)
        .arg(&r.id)
        .arg(r.hold_record().to_string())
        .arg(i)
        .arg(&sale.config.id)
        .arg(value)
        .arg(eighth_ttl)
        .invoke_async(&mut conn)
        .await?;
    if done == 1 {
        return Ok(Repair::Restored { version: detail });
    }
    if counted_now {
        engine.give_back_quota(home, &r.id).await?;
    }
    Ok(Repair::Skipped(match detail.as_str() {
        "stock" => "no stock left on the shard",
        "exists" => "found",
        "gone" => "shard lost",
        _ => "moved",
    }))
}

/// Finds holds whose Redis `paid` state disagrees with their reservation's
/// Postgres status and, when `repair`, re-aligns them with Postgres
/// ([`saga::align_hold`]). Independent of settlement lag: a payment only
/// exists for a reservation Postgres already has.
///
/// No grace period is needed: a disagreement is re-checked and repaired
/// under the reservation's and its payments' row locks, and the payment saga
/// only confirms in Redis while it holds the payment row lock, so an event
/// in flight makes the repair skip (`Busy`) instead of undoing its confirm.
///
/// Per shard, the cheap look first ([`paid_holds_agree`]); the scan of
/// every hold record (chunks of [`SCAN_CHUNK`], each looked up in Postgres)
/// only when it is not conclusive.
async fn check_hold_states(
    engine: &Engine,
    pool: &PgPool,
    sale: &Sale,
    repair: bool,
    report: &mut Report,
) -> Result<(), ReconcileError> {
    let cfg = &sale.config;
    for (i, k) in sale.shards.iter().enumerate() {
        match paid_holds_agree(engine, pool, sale, i).await? {
            // Every hold Redis has as paid is paid in Postgres: only the
            // reverse can disagree, and those are known.
            Some(held) => {
                for id in &held {
                    align_state(pool, engine, sale, id, repair, false, report).await?;
                }
            }
            None => {
                let mut scan = HashScan::new(&k.holds);
                while let Some(pairs) = scan.next(engine).await? {
                    report.hold_records_scanned += pairs.len();
                    let ids: Vec<&str> = pairs.iter().map(|(id, _)| id.as_str()).collect();
                    let pg_paid: HashSet<String> = sqlx::query_scalar(
                        "SELECT id FROM reservations WHERE id = ANY($1) AND status = 'paid'",
                    )
                    .bind(&ids)
                    .fetch_all(pool)
                    .await?
                    .into_iter()
                    .collect();
                    for (id, raw) in &pairs {
                        let redis_paid = paid_record(raw);
                        if redis_paid != pg_paid.contains(id) {
                            align_state(pool, engine, sale, id, repair, redis_paid, report).await?;
                        }
                    }
                }
            }
        }
    }
    metrics::gauge!("flashsale_hold_state_mismatches", "sale" => cfg.id.clone())
        .set(report.state_mismatches.len() as f64);
    Ok(())
}

/// One hold whose paid state disagreed: re-read under the locks (it may
/// agree after all — an event just committed — or an event may be being
/// applied right now: `Busy`), reported, and re-aligned when `repair`.
async fn align_state(
    pool: &PgPool,
    engine: &Engine,
    sale: &Sale,
    id: &str,
    repair: bool,
    redis_paid: bool,
    report: &mut Report,
) -> Result<(), ReconcileError> {
    match saga::align_hold(pool, engine, sale, id, repair).await? {
        Alignment::Agreed | Alignment::Busy => {}
        a => {
            tracing::warn!(sale = %sale.config.id, reservation = %id, redis_paid, outcome = ?a, repaired = repair, "reconcile: a hold's paid state disagreed with Postgres");
            report.state_mismatches.push(id.to_string());
            if repair {
                report.aligned.push(id.to_string());
            }
        }
    }
    Ok(())
}

/// The cheap check of one shard's paid states (paid_holds.lua), without
/// reading every hold record: Postgres's paid reservations on the shard,
/// their records in Redis, and how many holds Redis has as paid. When the
/// ids Postgres has as paid include every hold Redis has as paid (as many of
/// them are paid in Redis as Redis has paid holds), the only disagreements
/// can be among those ids: the ones Redis holds unpaid are returned. `None`: they
/// do not account for them all (a hold paid in Redis alone — the crash
/// between the saga's confirm and its commit — or a payment moving meanwhile,
/// or more paid ids than one look takes): scan the shard.
///
/// Between chunks the count is read again and must not move; a payment that
/// moves a hold both ways between two chunks could hide one round's
/// disagreement, which the next round (a minute later) sees.
async fn paid_holds_agree(
    engine: &Engine,
    pool: &PgPool,
    sale: &Sale,
    i: usize,
) -> Result<Option<Vec<String>>, ReconcileError> {
    let k = &sale.shards[i];
    let paid: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM reservations WHERE sale_id = $1 AND shard = $2 AND status = 'paid'",
    )
    .bind(&sale.config.id)
    .bind(i as i32)
    .fetch_all(pool)
    .await?;
    if paid.len() > PAID_LOOK_MAX {
        return Ok(None);
    }
    let mut conn = engine.conn.clone();
    let mut count = None;
    let mut paid_in_redis = 0i64;
    let mut held = Vec::new();
    // At least one call, for the count, when Postgres has none paid.
    let chunks: Vec<&[String]> = if paid.is_empty() {
        vec![&[]]
    } else {
        paid.chunks(SCAN_CHUNK).collect()
    };
    for ids in chunks {
        let mut call = engine.scripts.paid_holds.key(&k.holds);
        call.key(&k.exp);
        for id in ids {
            call.arg(id);
        }
        let (n, recs): (i64, Vec<Option<String>>) = call.invoke_async(&mut conn).await?;
        if *count.get_or_insert(n) != n {
            return Ok(None);
        }
        for (id, rec) in ids.iter().zip(recs) {
            match rec.as_deref().map(paid_record) {
                Some(true) => paid_in_redis += 1,
                Some(false) => held.push(id.clone()),
                // No hold record: a lost hold, the stock comparison's case.
                None => {}
            }
        }
    }
    Ok((count == Some(paid_in_redis)).then_some(held))
}

/// Whether a hold record (JSON, `lua/_lib.lua`) says the hold is paid.
fn paid_record(raw: &str) -> bool {
    HoldRecord::parse(raw).is_some_and(|h| h.status == "paid")
}

/// More reservations paid on one shard than this and the reconciler scans
/// the shard's hold records instead of looking them up by id.
const PAID_LOOK_MAX: usize = 100_000;

/// Reconciles every active sale each `interval` until cancelled.
pub async fn run(
    engine: std::sync::Arc<Engine>,
    pool: PgPool,
    sales: std::sync::Arc<SaleRegistry>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let list = match sales.active().await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "reconcile: cannot list sales");
                continue;
            }
        };
        for sale in list {
            if let Err(e) = reconcile_sale(&engine, &pool, &sale, true).await {
                tracing::warn!(sale = %sale.config.id, error = %e, "reconcile failed");
            }
        }
    }
}
