//! The state every request handler and worker shares: the Postgres pool,
//! the Redis engine, the sale registry, the token rings, the caches and
//! this replica's load signal. Built once per process ([`AppState::connect`]).
//!
//! Role in the module graph: `crate::http::routes`, `crate::ops::workers`
//! and `crate::ops::startup` use it; it uses only the domain parts below
//! it, never `routes`, `workers` or `startup`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio::sync::Semaphore;

use crate::ops::configuration::{AckMode, Settings};
use crate::ops::db::{migrate_or_check, pg_pool};
use crate::ops::telemetry;
use crate::reserve::ack::Acker;
use crate::reserve::engine::Engine;
use crate::reserve::scripts::Scripts;
use crate::reserve::store;
use crate::sales::registry::SaleRegistry;
use crate::settle::settler::{SettleConfig, Settler};

/// How long a computed sale summary is served from memory.
pub const SUMMARY_TTL: Duration = Duration::from_secs(1);

/// Shared by every request handler.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub pool: PgPool,
    pub engine: Arc<Engine>,
    pub sales: Arc<SaleRegistry>,
    pub user_keys: token::KeyRing,
    pub admission_keys: token::KeyRing,
    pub in_flight: Semaphore,
    /// Sale summaries, computed once per sale per TTL however many ask
    /// (single flight), bounded.
    pub summaries: moka::future::Cache<String, serde_json::Value>,
    /// The last sold figure Postgres gave per sale, for summaries while it
    /// is down (bounded like the sale caches).
    pub last_sold: moka::future::Cache<String, i64>,
    /// This replica's load signal for the edge's admission controller.
    pub load: crate::http::load::LoadWindow,
    pub metrics: PrometheusHandle,
    pub settings: Settings,
    /// The port `serve` is bound to (the dev payment provider posts to it).
    pub bound_port: std::sync::OnceLock<u16>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// The HTTP port, once bound.
    pub fn port(&self) -> u16 {
        self.bound_port.get().copied().unwrap_or(0)
    }

    /// Connects to Postgres (and migrates) and Redis; binds nothing (the
    /// worker-only subcommands use this too).
    pub async fn connect(settings: Settings) -> anyhow::Result<Self> {
        let pool = pg_pool(settings.database_url(), settings.pg_pool_size)?;
        migrate_or_check(&pool, settings.auto_migrate).await?;
        let conn = redis_at_start(&settings).await?;
        Ok(AppState(Arc::new(Inner {
            engine: Arc::new(Engine {
                conn,
                scripts: Scripts::load(),
                acker: match settings.redis_ack {
                    AckMode::Local => None,
                    AckMode::Wait {
                        timeout,
                        connections,
                    } => Some(Acker::start(settings.redis.clone(), timeout, connections)),
                },
            }),
            sales: Arc::new(SaleRegistry::new(pool.clone(), settings.key_prefix.clone())),
            pool,
            user_keys: settings.user_keys.clone(),
            admission_keys: settings.admission_keys.clone(),
            in_flight: Semaphore::new(settings.max_in_flight),
            summaries: moka::future::Cache::builder()
                .max_capacity(crate::sales::registry::FIRST_LOAD_CAPACITY)
                .time_to_live(SUMMARY_TTL)
                .build(),
            last_sold: moka::future::Cache::new(crate::sales::registry::FIRST_LOAD_CAPACITY),
            load: crate::http::load::LoadWindow::new(),
            metrics: telemetry::metrics_handle(),
            settings,
            bound_port: std::sync::OnceLock::new(),
        })))
    }

    /// A settlement worker with a consumer name unique to this process.
    pub fn settler(&self) -> Arc<Settler> {
        settler(
            &self.settings,
            self.engine.clone(),
            self.pool.clone(),
            self.sales.clone(),
        )
    }
}

/// The Redis connection a process needs before it starts serving or
/// working: unreachable fails the start.
pub async fn redis_at_start(settings: &Settings) -> anyhow::Result<store::RedisConn> {
    store::connect(&settings.redis).await.context(
        "Redis must be reachable at start (REDIS_URL / REDIS_CLUSTER_NODES / REDIS_SENTINEL)",
    )
}

/// A settlement worker on the given connections, configured from
/// `settings`, with a consumer name unique to this process.
pub fn settler(
    settings: &Settings,
    engine: Arc<Engine>,
    pool: PgPool,
    sales: Arc<SaleRegistry>,
) -> Arc<Settler> {
    let mut cfg = SettleConfig::new(consumer_name());
    cfg.claim_idle = settings.settle_claim_idle;
    cfg.linger = settings.settle_linger;
    let mut settler = Settler::new(engine, pool, sales, cfg);
    // REDIS_ACK=wait: batches commit once a replica has them, checked
    // on a connection of the settler's own (ends with the settler).
    settler.acker = worker_acker(settings);
    Arc::new(settler)
}

/// `REDIS_ACK=wait`: an acknowledger on a connection of one worker's own
/// (the settler's, the relay's), which ends with it; `None` for `local`.
pub fn worker_acker(settings: &Settings) -> Option<Acker> {
    match settings.redis_ack {
        AckMode::Wait { timeout, .. } => Some(Acker::start(settings.redis.clone(), timeout, 1)),
        AckMode::Local => None,
    }
}

/// `<host>-<pid>-<random>`: unique per worker, readable in XINFO CONSUMERS.
pub fn consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "origin".into());
    format!(
        "{host}-{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}
