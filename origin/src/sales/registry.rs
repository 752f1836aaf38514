//! The in-process registry of sales: configs loaded from Postgres on
//! demand and cached, so a running `origin serve` picks up a new sale
//! without a restart, and each sale's sold-out flag.
//!
//! Invariants kept here:
//! - the config cache is bounded against junk: ids Postgres does not know
//!   live in a capacity-bounded cache for 1 s (so random ids cannot grow
//!   memory), and a first sight of an id is loaded once however many
//!   requests ask at the same moment (single flight);
//! - a known sale is answered from the cache while one background task
//!   reloads it: the reservation path never waits on Postgres for a sale it
//!   has seen.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::RwLock;

use crate::sales::sale::{
    COLUMNS, Sale, SaleConfig, SoldOutFlag, load_sale, valid_sale_id, with_skus,
};

struct Cached {
    sale: Option<Arc<Sale>>,
    fetched: Instant,
    /// A background reload is under way (at most one per sale).
    reloading: bool,
}

type Cache = Arc<RwLock<HashMap<String, Cached>>>;

/// How long a loaded sale config is reused before Postgres is asked again.
const CONFIG_TTL: Duration = Duration::from_secs(5);
/// Unknown sale ids are remembered briefly so junk ids cannot hammer Postgres.
const NEGATIVE_TTL: Duration = Duration::from_secs(1);
/// At most this many first loads (mostly unknown ids) are remembered.
pub const FIRST_LOAD_CAPACITY: u64 = 10_000;
/// First loads of distinct ids running at once, at most: ids nobody sells
/// (each a miss of every cache) take at most this many of the pool's
/// connections, whatever their rate, so webhooks and settlement keep theirs
/// (issue 43 #8).
pub const FIRST_LOADS_AT_ONCE: usize = 4;
/// How long a first load waits for its turn before the request is told
/// 503 `database_unavailable` (retry), instead of queueing without bound.
const FIRST_LOAD_WAIT: Duration = Duration::from_secs(1);

/// First loads of a sale id, single flight: `Some` moves into the config
/// map at once; `None` (no such sale) stays here for [`NEGATIVE_TTL`].
type FirstLoads = moka::future::Cache<String, Option<Arc<Sale>>>;

/// Turns a shared error (a single-flight load's, handed to every waiter)
/// back into an owned one of the same kind, so callers still tell an
/// unreachable Postgres (503) from anything else.
fn unshare(e: Arc<sqlx::Error>) -> sqlx::Error {
    Arc::try_unwrap(e).unwrap_or_else(|e| match &*e {
        sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
        sqlx::Error::Io(io) => sqlx::Error::Io(std::io::Error::new(io.kind(), io.to_string())),
        other => sqlx::Error::Protocol(other.to_string()),
    })
}

/// Sale configs by id, loaded from Postgres on demand.
pub struct SaleRegistry {
    pool: PgPool,
    prefix: String,
    cache: Cache,
    first_loads: FirstLoads,
    /// Bounds the first loads running at once ([`FIRST_LOADS_AT_ONCE`]).
    loading: Arc<tokio::sync::Semaphore>,
    /// First loads that reached Postgres, by this registry.
    loads: Arc<std::sync::atomic::AtomicU64>,
    flags: std::sync::Mutex<HashMap<String, Arc<SoldOutFlag>>>,
    /// Holds this process granted, by sale (the admin API's holds/s).
    granted: std::sync::Mutex<HashMap<String, Arc<std::sync::atomic::AtomicU64>>>,
    pub epoch: Instant,
}

impl SaleRegistry {
    pub fn new(pool: PgPool, prefix: String) -> Self {
        Self::with_first_load_capacity(pool, prefix, FIRST_LOAD_CAPACITY)
    }

    /// As [`SaleRegistry::new`], remembering at most `capacity` first loads.
    pub fn with_first_load_capacity(pool: PgPool, prefix: String, capacity: u64) -> Self {
        SaleRegistry {
            pool,
            prefix,
            cache: Arc::new(RwLock::new(HashMap::new())),
            first_loads: moka::future::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(NEGATIVE_TTL)
                .build(),
            loading: Arc::new(tokio::sync::Semaphore::new(FIRST_LOADS_AT_ONCE)),
            loads: Arc::default(),
            flags: Default::default(),
            granted: Default::default(),
            epoch: Instant::now(),
        }
    }

    /// The sale, or `None` if it does not exist.
    ///
    /// A known sale's config older than its TTL is still answered at once
    /// while one background task reloads it: the reservation path never
    /// waits on Postgres for a sale it has seen, and keeps selling from Redis
    /// while Postgres is down (the config it sells by is at most as old as
    /// the outage). Only the first sight of a sale id reads Postgres inline.
    pub async fn get(&self, id: &str) -> Result<Option<Arc<Sale>>, sqlx::Error> {
        if !valid_sale_id(id) {
            return Ok(None);
        }
        if let Some(c) = self.cache.read().await.get(id)
            && (c.reloading || c.fetched.elapsed() < CONFIG_TTL)
        {
            return Ok(c.sale.clone());
        }
        let stale = {
            let mut cache = self.cache.write().await;
            match cache.get_mut(id) {
                Some(c) => {
                    if !c.reloading && c.fetched.elapsed() >= CONFIG_TTL {
                        c.reloading = true;
                        tokio::spawn(reload(
                            self.pool.clone(),
                            self.prefix.clone(),
                            self.cache.clone(),
                            id.to_string(),
                        ));
                    }
                    c.sale.clone()
                }
                None => None,
            }
        };
        if stale.is_some() {
            return Ok(stale);
        }
        let (pool, prefix) = (self.pool.clone(), self.prefix.clone());
        let owned = id.to_string();
        let loading = self.loading.clone();
        let loads = self.loads.clone();
        let sale = self
            .first_loads
            .try_get_with(id.to_string(), async move {
                let _turn = tokio::time::timeout(FIRST_LOAD_WAIT, loading.acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .ok_or(sqlx::Error::PoolTimedOut)?;
                metrics::counter!("flashsale_sale_config_loads_total").increment(1);
                loads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                load_sale(&pool, &owned)
                    .await
                    .map(|c| c.map(|cfg| Arc::new(Sale::new(cfg, &prefix))))
            })
            .await
            .map_err(unshare)?;
        if let Some(sale) = &sale {
            self.cache
                .write()
                .await
                .entry(id.to_string())
                .or_insert_with(|| Cached {
                    sale: Some(sale.clone()),
                    fetched: Instant::now(),
                    reloading: false,
                });
        }
        Ok(sale)
    }

    /// Puts a config this process just changed (and committed) into the
    /// cache at once, so its own answers (the summary the edge reads) carry
    /// the change now rather than within [`CONFIG_TTL`]; a reload already
    /// under way does not overwrite it with what it read before.
    pub async fn changed(&self, cfg: SaleConfig) {
        let id = cfg.id.clone();
        let sale = Arc::new(Sale::new(cfg, &self.prefix));
        let mut cache = self.cache.write().await;
        let reloading = cache.get(&id).is_some_and(|c| c.reloading);
        cache.insert(
            id,
            Cached {
                sale: Some(sale),
                fetched: Instant::now(),
                reloading,
            },
        );
    }

    /// Follows `sales::spec::SALE_CHANGED_CHANNEL` until `stop`: each sale
    /// changed anywhere (another origin's admin API, `origin sale update`)
    /// is reloaded here at once, not within [`CONFIG_TTL`]. A lost
    /// connection is reopened after a second; changes meanwhile are
    /// caught by the TTL as before.
    pub async fn follow(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let channel = crate::sales::spec::SALE_CHANGED_CHANNEL;
        while !stop.is_cancelled() {
            let mut listener = match sqlx::postgres::PgListener::connect_with(&self.pool).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for sale changes; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = stop.cancelled() => return,
                    }
                }
            };
            if let Err(e) = listener.listen(channel).await {
                tracing::warn!(error = %e, "cannot listen for sale changes; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            loop {
                let next = tokio::select! {
                    n = listener.try_recv() => n,
                    _ = stop.cancelled() => return,
                };
                match next {
                    Ok(Some(n)) => {
                        let id = n.payload().to_string();
                        match load_sale(&self.pool, &id).await {
                            Ok(Some(cfg)) => self.changed(cfg).await,
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!(sale = %id, error = %e, "cannot reload a changed sale")
                            }
                        }
                    }
                    // The connection was lost (and is reopened by the
                    // listener itself): changes in between may be missed.
                    Ok(None) => {
                        tracing::warn!(
                            "sale change listener reconnected; changes meanwhile reach this origin within its config TTL"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "sale change listener failed; reopening");
                        break;
                    }
                }
            }
        }
    }

    /// First loads this registry sent to Postgres (the process-wide figure
    /// is `flashsale_sale_config_loads_total`).
    pub fn first_loads_sent(&self) -> u64 {
        self.loads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// First loads remembered now (mostly unknown ids); bounded by the
    /// registry's capacity.
    pub async fn first_loads_cached(&self) -> u64 {
        self.first_loads.run_pending_tasks().await;
        self.first_loads.entry_count()
    }

    /// The count of holds this process granted in sale `id` (new ones, not
    /// replays), kept across config reloads.
    pub fn granted(&self, id: &str) -> Arc<std::sync::atomic::AtomicU64> {
        let mut map = self
            .granted
            .lock()
            .expect("granted map lock is never poisoned: no panics while held");
        // Called on every hold: no key allocated once the sale is known.
        if let Some(n) = map.get(id) {
            return n.clone();
        }
        map.entry(id.to_string()).or_default().clone()
    }

    /// The sold-out flag of a sale (created unset on first use).
    pub fn flag(&self, id: &str) -> Arc<SoldOutFlag> {
        self.flags
            .lock()
            .expect("flag map lock is never poisoned: no panics while held")
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// The sold-out flag of one SKU of a sale of several (a one-SKU sale
    /// uses the sale's [`Self::flag`]).
    pub fn sku_flag(&self, id: &str, position: i32) -> Arc<SoldOutFlag> {
        self.flag(&format!("{id}/{position}"))
    }

    /// Units of sale `id` came back (a cancel, an expiry): its flag and
    /// every one of its SKUs' flags are cleared, so this process sells
    /// again at once.
    pub fn units_back(&self, id: &str, now: Instant) {
        let prefix = format!("{id}/");
        let flags: Vec<Arc<SoldOutFlag>> = self
            .flags
            .lock()
            .expect("flag map lock is never poisoned: no panics while held")
            .iter()
            .filter(|(k, _)| k.as_str() == id || k.starts_with(&prefix))
            .map(|(_, f)| f.clone())
            .collect();
        for f in flags {
            f.set(false, now, self.epoch);
        }
    }

    /// The sales the background workers (settlement, sweep, reconciler)
    /// look after: from a day before the start until a day after the last
    /// hold could have expired, so a settlement backlog left by a long
    /// Postgres outage still drains after the sale has ended.
    /// (`hold_seconds * 2.0`: in floating point, so one sale row beyond
    /// today's bounds cannot overflow int4 and hide every sale from them.)
    pub async fn active(&self) -> Result<Vec<Arc<Sale>>, sqlx::Error> {
        let rows: Vec<SaleConfig> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM sales
             WHERE starts_at <= now() + interval '1 day'
               AND (ends_at IS NULL OR ends_at + make_interval(secs => hold_seconds * 2.0) + interval '1 day' > now())"
        ))
        .fetch_all(&self.pool)
        .await?;
        let rows = with_skus(&self.pool, rows).await?;
        Ok(rows
            .into_iter()
            .map(|c| Arc::new(Sale::new(c, &self.prefix)))
            .collect())
    }
}

/// Reloads one cached sale config; on failure keeps the old one and tries
/// again after the TTL.
async fn reload(pool: PgPool, prefix: String, cache: Cache, id: String) {
    let started = Instant::now();
    let loaded = load_sale(&pool, &id).await;
    let mut cache = cache.write().await;
    let Some(c) = cache.get_mut(&id) else { return };
    c.reloading = false;
    if c.fetched > started {
        // `SaleRegistry::changed` put a newer config meanwhile: this load
        // may have read Postgres before that change committed.
        return;
    }
    c.fetched = Instant::now();
    match loaded {
        Ok(Some(cfg)) => c.sale = Some(Arc::new(Sale::new(cfg, &prefix))),
        // A sale is never deleted while it sells; keep what we had.
        Ok(None) => {}
        Err(e) => {
            metrics::counter!("flashsale_sale_config_reload_failures_total").increment(1);
            tracing::warn!(sale = %id, error = %e, "cannot reload sale config; selling by the cached one");
        }
    }
}
