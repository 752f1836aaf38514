//! A sale as Postgres (the one source) configures it, as a process loads
//! it (its config plus each shard's keys), and its in-process sold-out flag.
//!
//! Invariants kept here:
//! - a sale's units are split over its shards ([`shard_units`]) so that the
//!   shards' stock adds up to exactly `units_total` at creation;
//! - the sold-out flag is only ever a cache: it is set after every shard
//!   said empty and is rechecked against Redis at most 1 s later.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::reserve::store::ShardKeys;
pub use crate::sales::bounds::valid_sale_id;
use crate::sales::placement::Placement;
pub use crate::sales::placement::shard_units;
use crate::sales::sku::{self, SKU_COLUMNS, Sku, SkuChoice};

/// A sale as configured.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct SaleConfig {
    #[serde(rename = "sale")]
    pub id: String,
    pub name: String,
    pub price_cents: i64,
    pub units_total: i32,
    pub per_user_limit: i32,
    pub shards: i32,
    pub shard_tags: Vec<String>,
    pub starts_at: DateTime<Utc>,
    pub ends_at: Option<DateTime<Utc>>,
    pub hold_seconds: i32,
    pub admission_rate: f64,
    pub admission_factor: f64,
    /// Edge queue shards (Durable Objects) of the sale's waiting room.
    pub queue_shards: i32,
    /// An operator paused admission: the edge's frontier holds (issue 13).
    pub paused: bool,
    /// The reservation path's p99 (ms) above which the edge's admission
    /// controller slows down.
    pub admission_p99_ms: f64,
    /// What a join must bring at the edge: `none`, `pow:<bits>` or
    /// `turnstile` (DESIGN.md "Bot check at join").
    pub bot_check: String,
    /// Joins the edge accepts per address per minute in this sale.
    pub join_limit: i32,
    /// ISO 4217 code of `price_cents`' currency (the page formats prices in it).
    pub currency: String,
    /// The drand-style beacon the draw's key takes a round of (DESIGN.md
    /// "The draw, v2"); `None`: no beacon.
    pub draw_beacon: Option<String>,
    /// The operator's message to every waiting page (plain text, at most
    /// 280 characters; `None`: no message), and when it was posted.
    pub message: Option<String>,
    pub message_at: Option<DateTime<Utc>>,
    /// A join that fails the bot check gets a place in a shadow queue that
    /// never moves up, instead of an error (issue 47).
    pub bot_shadow: bool,
    /// What the sale sells, by position (at least one once loaded: every
    /// query that reads a config goes through [`with_skus`]).
    #[sqlx(skip)]
    pub skus: Vec<Sku>,
}

/// Whether a sale accepts reservations at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Upcoming,
    Live,
    SoldOut,
    Ended,
}

impl SaleConfig {
    pub fn phase_by_time(&self, now: DateTime<Utc>) -> Phase {
        if now < self.starts_at {
            Phase::Upcoming
        } else if self.ends_at.is_some_and(|e| now >= e) {
            Phase::Ended
        } else {
            Phase::Live
        }
    }
}

/// A loaded sale: config plus the keys of each shard and where each SKU's
/// stock lives on them.
#[derive(Debug)]
pub struct Sale {
    pub config: SaleConfig,
    pub shards: Vec<ShardKeys>,
    /// By position: the shards each SKU is on ([`Placement`]).
    pub placements: Vec<Placement>,
    /// SKU id → index in `config.skus`: a reservation names its SKU by id,
    /// and a sale may sell 1,000 (a linear scan cost ~1 µs a request there).
    sku_index: HashMap<String, usize>,
}

impl Sale {
    pub(crate) fn new(config: SaleConfig, prefix: &str) -> Self {
        let shards: Vec<ShardKeys> = config
            .shard_tags
            .iter()
            .map(|t| ShardKeys::new(prefix, t))
            .collect();
        let placements = config
            .skus
            .iter()
            .map(|s| Placement::of(s.units_total, s.position, config.skus.len(), shards.len()))
            .collect();
        let sku_index = config
            .skus
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.clone(), i))
            .collect();
        Sale {
            config,
            shards,
            placements,
            sku_index,
        }
    }

    /// Whether the sale sells several SKUs. Only then do holds, counts and
    /// records carry a SKU position: a one-SKU sale keeps the layout it had
    /// before SKUs, so its keys and records stay valid as they are.
    /// The SKU a reservation is for: the one named, or the only one
    /// (`sku::resolve`'s rule, by the index).
    pub fn sku(&self, named: Option<&str>) -> Result<&Sku, SkuChoice> {
        match named {
            Some(id) => self
                .sku_index
                .get(id)
                .and_then(|&i| self.config.skus.get(i))
                .ok_or(SkuChoice::Unknown),
            None => sku::resolve(&self.config.skus, None),
        }
    }

    pub fn multi_sku(&self) -> bool {
        self.config.skus.len() > 1
    }

    /// The position the scripts are given for the SKU at `position`: `None`
    /// in a one-SKU sale.
    pub fn script_position(&self, position: i32) -> Option<i32> {
        self.multi_sku().then_some(position)
    }

    /// The placement of the SKU at `position` (the whole sale's shards for
    /// an unknown position, as a one-SKU sale is placed).
    pub fn placement(&self, position: i32) -> Placement {
        usize::try_from(position)
            .ok()
            .and_then(|p| self.placements.get(p).copied())
            .unwrap_or_else(|| Placement::of(1, 0, 1, self.shards.len()))
    }
}

/// The in-process sold-out flag of one sale.
#[derive(Debug, Default)]
pub struct SoldOutFlag {
    set: AtomicBool,
    /// When the flag was last confirmed against Redis (ms since `epoch`).
    checked_ms: AtomicU64,
    /// A request is asking Redis whether units came back (single flight).
    checking: AtomicBool,
}

/// The one running check of a stale sold-out flag; see
/// [`SoldOutFlag::begin_check`].
pub struct CheckGuard<'a>(&'a SoldOutFlag);

impl Drop for CheckGuard<'_> {
    fn drop(&mut self) {
        self.0.checking.store(false, Ordering::Release);
    }
}

/// How long a set sold-out flag is trusted before Redis is asked again.
pub const SOLD_OUT_RECHECK: Duration = Duration::from_secs(1);

impl SoldOutFlag {
    /// `true` when the flag is set and was confirmed less than 1 s ago.
    pub fn is_fresh(&self, now: Instant, epoch: Instant) -> bool {
        // saturating: another thread may have stamped a later instant.
        self.set.load(Ordering::Acquire)
            && (now.duration_since(epoch).as_millis() as u64)
                .saturating_sub(self.checked_ms.load(Ordering::Acquire))
                < SOLD_OUT_RECHECK.as_millis() as u64
    }
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }
    /// Single flight of the stale flag's check: a guard for the one caller
    /// that should ask Redis now (the check ends when it drops, also when
    /// the request is cancelled midway); `None` for everyone else, who go
    /// by the flag as it stands.
    pub fn begin_check(&self) -> Option<CheckGuard<'_>> {
        self.checking
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| CheckGuard(self))
    }
    /// Returns true when this call flipped the flag.
    pub fn set(&self, value: bool, now: Instant, epoch: Instant) -> bool {
        self.checked_ms.store(
            now.duration_since(epoch).as_millis() as u64,
            Ordering::Release,
        );
        self.set.swap(value, Ordering::AcqRel) != value
    }
}

/// The columns of a [`SaleConfig`], in every query that reads one.
pub(crate) const COLUMNS: &str = "id, name, price_cents, units_total, per_user_limit, shards, shard_tags, \
     starts_at, ends_at, hold_seconds, admission_rate, admission_factor, queue_shards, paused, \
     admission_p99_ms, bot_check, join_limit, currency, draw_beacon, message, message_at, bot_shadow";

/// A sale's config from Postgres, or `None` when there is no such sale.
pub(crate) async fn load_sale(pool: &PgPool, id: &str) -> Result<Option<SaleConfig>, sqlx::Error> {
    let cfg: Option<SaleConfig> =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM sales WHERE id = $1"))
            .bind(id)
            .fetch_optional(pool)
            .await?;
    match cfg {
        Some(cfg) => Ok(with_skus(pool, vec![cfg]).await?.pop()),
        None => Ok(None),
    }
}

/// Fills in the SKUs of sale configs read from `sales` (one query for all
/// of them). A sale without SKU rows is left out (and logged) rather than
/// loaded as a sale that sells nothing, and without hiding the others from
/// the workers: migration 0014 gave every sale its SKU, and `create_sale`
/// writes them in the sale's transaction, so only a hand-written row lacks
/// them.
pub(crate) async fn with_skus<'e, E>(
    db: E,
    cfgs: Vec<SaleConfig>,
) -> Result<Vec<SaleConfig>, sqlx::Error>
where
    E: sqlx::PgExecutor<'e>,
{
    if cfgs.is_empty() {
        return Ok(cfgs);
    }
    let ids: Vec<String> = cfgs.iter().map(|c| c.id.clone()).collect();
    let rows: Vec<SkuRow> = sqlx::query_as(&format!(
        "SELECT sale_id, {SKU_COLUMNS} FROM skus WHERE sale_id = ANY($1) ORDER BY sale_id, position"
    ))
    .bind(&ids)
    .fetch_all(db)
    .await?;
    let mut by_sale: std::collections::HashMap<String, Vec<Sku>> =
        std::collections::HashMap::with_capacity(cfgs.len());
    for r in rows {
        by_sale.entry(r.sale_id).or_default().push(r.sku);
    }
    Ok(cfgs
        .into_iter()
        .filter_map(|mut cfg| {
            cfg.skus = by_sale.remove(&cfg.id).unwrap_or_default();
            if cfg.skus.is_empty() {
                metrics::counter!("flashsale_sales_without_skus_total").increment(1);
                tracing::error!(sale = %cfg.id, "sale has no SKUs: not loaded (was migration 0014 applied to it?)");
                return None;
            }
            Some(cfg)
        })
        .collect())
}

#[derive(sqlx::FromRow)]
struct SkuRow {
    sale_id: String,
    #[sqlx(flatten)]
    sku: Sku,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_units_add_up() {
        for units in 1..200 {
            for shards in 1..=units.min(17) {
                let sum: i32 = (0..shards).map(|i| shard_units(units, shards, i)).sum();
                assert_eq!(sum, units);
            }
        }
    }

    fn sale_of(skus: usize) -> Sale {
        let config = SaleConfig {
            id: "s".into(),
            name: "s".into(),
            price_cents: 100,
            units_total: skus as i32 * 10,
            per_user_limit: 2,
            shards: 4,
            shard_tags: vec!["a".into(), "b".into(), "c".into(), "d".into()],
            starts_at: Utc::now(),
            ends_at: None,
            hold_seconds: 60,
            admission_rate: 1.0,
            admission_factor: 2.0,
            queue_shards: 1,
            paused: false,
            admission_p99_ms: 50.0,
            bot_check: "none".into(),
            join_limit: 1_000,
            currency: "EUR".into(),
            draw_beacon: None,
            message: None,
            message_at: None,
            bot_shadow: false,
            skus: (0..skus)
                .map(|p| Sku {
                    id: format!("u{p:04}"),
                    name: "n".into(),
                    price_cents: 100,
                    units_total: 10,
                    per_user_limit: None,
                    position: p as i32,
                })
                .collect(),
        };
        Sale::new(config, "fs")
    }

    #[test]
    fn the_index_finds_what_the_scan_finds() {
        for n in [1, 2, 1_000] {
            let sale = sale_of(n);
            for k in &sale.config.skus {
                assert_eq!(sale.sku(Some(&k.id)), Ok(k));
                assert_eq!(
                    sale.sku(Some(&k.id)),
                    sku::resolve(&sale.config.skus, Some(&k.id))
                );
            }
            assert_eq!(sale.sku(Some("nope")), Err(SkuChoice::Unknown));
            assert_eq!(sale.sku(None), sku::resolve(&sale.config.skus, None));
        }
        assert_eq!(sale_of(1).sku(None).map(|k| k.position), Ok(0));
        assert_eq!(sale_of(2).sku(None), Err(SkuChoice::Required));
    }
}
