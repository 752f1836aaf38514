//! Building and running the origin: connections, shared state, the HTTP
//! server on its listener, the background workers, and graceful shutdown
//! (SIGINT/SIGTERM: stop accepting, finish in-flight requests, then stop the
//! workers cleanly, all within a bounded grace).

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::configuration::Settings;
use crate::reservations::Engine;
use crate::sales::SaleRegistry;
use crate::settlement::{SettleConfig, Settler};
use crate::store::{self, Scripts};
use crate::{outbox, reconcile, routes, sweep, telemetry};

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
    pub load: crate::load::LoadWindow,
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
        let conn = store::connect(&settings.redis)
            .await
            .context("Redis must be reachable at start (REDIS_URL / REDIS_CLUSTER_NODES)")?;
        Ok(AppState(Arc::new(Inner {
            engine: Arc::new(Engine {
                conn,
                scripts: Scripts::load(),
            }),
            sales: Arc::new(SaleRegistry::new(pool.clone(), settings.key_prefix.clone())),
            pool,
            user_keys: settings.user_keys.clone(),
            admission_keys: settings.admission_keys.clone(),
            in_flight: Semaphore::new(settings.max_in_flight),
            summaries: moka::future::Cache::builder()
                .max_capacity(crate::sales::FIRST_LOAD_CAPACITY)
                .time_to_live(crate::routes::SUMMARY_TTL)
                .build(),
            last_sold: moka::future::Cache::new(crate::sales::FIRST_LOAD_CAPACITY),
            load: crate::load::LoadWindow::new(),
            metrics: telemetry::metrics_handle(),
            settings,
            bound_port: std::sync::OnceLock::new(),
        })))
    }

    /// A settlement worker with a consumer name unique to this process.
    pub fn settler(&self) -> Arc<Settler> {
        let mut cfg = SettleConfig::new(consumer_name());
        cfg.claim_idle = self.settings.settle_claim_idle;
        Arc::new(Settler::new(
            self.engine.clone(),
            self.pool.clone(),
            self.sales.clone(),
            cfg,
        ))
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

/// Which background workers `serve` runs in-process.
#[derive(Debug, Clone, Copy)]
pub struct Workers {
    pub settle: bool,
    pub sweep: bool,
    pub reconcile: bool,
    /// The outbox relay.
    pub relay: bool,
}

impl Workers {
    pub const ALL: Workers = Workers {
        settle: true,
        sweep: true,
        reconcile: true,
        relay: true,
    };
    pub const NONE: Workers = Workers {
        settle: false,
        sweep: false,
        reconcile: false,
        relay: false,
    };
}

/// Postgres connections for one-off commands (`migrate`, `sale …`).
pub const CLI_POOL_SIZE: u32 = 4;

/// Connects to Postgres (lazily: readiness reports it when it is down).
pub fn pg_pool(url: &str, size: u32) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(url)
        .with_context(|| "DATABASE_URL is not a valid Postgres URL")
}

/// The migrations compiled into the binary (`migrations/`).
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("../migrations")
}

/// At start: applies the migrations, or with `auto` off only checks that
/// none is pending (serving roles then need no DDL rights).
pub async fn migrate_or_check(pool: &PgPool, auto: bool) -> anyhow::Result<()> {
    if auto {
        return migrate(pool)
            .await
            .context("Postgres must be reachable at start (DATABASE_URL)");
    }
    let pending = pending_migrations(pool)
        .await
        .context("Postgres must be reachable at start (DATABASE_URL)")?;
    anyhow::ensure!(
        pending == 0,
        "{pending} migration(s) not applied and ORIGIN_AUTO_MIGRATE=0: run `origin migrate` first"
    );
    Ok(())
}

/// How many of the compiled-in migrations the database lacks.
pub async fn pending_migrations(pool: &PgPool) -> Result<usize, sqlx::Error> {
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await
            .or_else(|e| match e {
                // No migrations table: nothing was ever applied.
                sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => Ok(Vec::new()),
                e => Err(e),
            })?;
    Ok(migrator()
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .count())
}

/// Applies `migrations/`.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    migrator().run(pool).await.context("applying migrations")
}

/// A built, bound, not yet running origin.
pub struct Application {
    port: u16,
    listener: TcpListener,
    state: AppState,
    workers: Workers,
}

impl Application {
    /// Connects, migrates, binds `settings.addr` (port 0 picks a free port).
    pub async fn build(settings: Settings, workers: Workers) -> anyhow::Result<Self> {
        let addr = settings.addr;
        let state = AppState::connect(settings).await?;
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let port = listener.local_addr()?.port();
        let _ = state.bound_port.set(port);
        Ok(Application {
            port,
            listener,
            state,
            workers,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state(&self) -> AppState {
        self.state.clone()
    }

    /// Serves until `stop` is cancelled, then shuts down in order, within
    /// `settings.shutdown_grace`:
    ///
    /// 1. the listener closes and in-flight requests finish (the workers
    ///    keep running meanwhile, so the settler keeps up with them);
    /// 2. the workers are told to stop: the settler finishes the batch it
    ///    is in (commit + ack) and takes no new one, the outbox relay
    ///    publishes what is left, sweep and reconciler stop;
    /// 3. if the grace runs out first, what is left is dropped: an
    ///    uncommitted settlement transaction rolls back and its entries stay
    ///    pending in the stream for the next worker (XAUTOCLAIM), so nothing
    ///    is lost, and the call returns an error (exit code 1).
    pub async fn run_until_stopped(self, stop: CancellationToken) -> anyhow::Result<()> {
        let state = self.state;
        let workers_stop = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        if self.workers.sweep {
            tasks.spawn(sweep::run(
                state.engine.clone(),
                state.sales.clone(),
                state.settings.sweep_interval,
                workers_stop.clone(),
            ));
        }
        if self.workers.settle {
            tasks.spawn(state.settler().run(workers_stop.clone()));
        }
        if self.workers.relay {
            tasks.spawn(outbox::run(
                state.pool.clone(),
                outbox::RedisStreamSink::new(state.engine.conn.clone(), &state.settings.key_prefix),
                workers_stop.clone(),
            ));
        }
        if self.workers.reconcile {
            tasks.spawn(reconcile::run(
                state.engine.clone(),
                state.pool.clone(),
                state.sales.clone(),
                state.settings.reconcile_interval,
                workers_stop.clone(),
            ));
        }
        let _admin = serve_admin(state.settings.metrics_addr, workers_stop.clone()).await?;
        tracing::info!(port = self.port, "origin listening");
        let app = routes::router(state.clone());
        let server_stop = stop.clone();
        let server = axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { server_stop.cancelled().await })
            .into_future();
        tokio::pin!(server);
        // Serve until asked to stop (or until the server fails on its own).
        let early = tokio::select! {
            r = &mut server => Some(r),
            _ = stop.cancelled() => None,
        };
        let grace = state.settings.shutdown_grace;
        let deadline = tokio::time::Instant::now() + grace;
        tracing::info!(?grace, "stopping: draining requests, then workers");
        let drained = tokio::time::timeout_at(deadline, async {
            let served = match early {
                Some(r) => r,
                None => server.await,
            };
            tracing::info!("requests drained; stopping workers");
            workers_stop.cancel();
            while tasks.join_next().await.is_some() {}
            served
        })
        .await;
        match drained {
            Ok(served) => {
                served.context("HTTP server")?;
                tracing::info!("origin stopped");
                Ok(())
            }
            Err(_) => {
                workers_stop.cancel();
                tasks.abort_all();
                tracing::error!(
                    ?grace,
                    "shutdown grace ran out: unfinished requests were cut; an unfinished settlement batch rolled back and stays pending for the next worker"
                );
                anyhow::bail!("shutdown took longer than ORIGIN_SHUTDOWN_GRACE_MS ({grace:?})")
            }
        }
    }
}

/// Serves [`routes::admin_router`] on `ORIGIN_METRICS_ADDR` until `stop`;
/// nothing when it is unset. Binds before returning, so a bad address fails
/// the start.
pub async fn serve_admin(
    addr: Option<std::net::SocketAddr>,
    stop: CancellationToken,
) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding ORIGIN_METRICS_ADDR {addr}"))?;
    tracing::info!(%addr, "admin listener (/metrics, /healthz)");
    Ok(Some(tokio::spawn(async move {
        let served = axum::serve(listener, routes::admin_router())
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin listener failed");
        }
    })))
}

/// Cancels the token on SIGINT or SIGTERM.
pub fn stop_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("installing a SIGTERM handler");
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutdown requested");
        t.cancel();
    });
    token
}
