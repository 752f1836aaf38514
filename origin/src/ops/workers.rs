//! The background workers of `origin serve` — settlement, sweep, reconciler,
//! outbox relay and webhook deliveries — on a thread of their own, with their own Tokio runtime,
//! Redis connection and Postgres pool, at a lower CPU priority than the
//! request handlers (`ORIGIN_WORKERS_NICE`, default 10).
//!
//! Why (issue 16; BENCHMARKS.md, "Why the reservation tail was long"): the
//! customer's reservation and the settlement of earlier ones compete on
//! the same cores, and where they shared a runtime and a connection the
//! customer lost:
//!
//! - the requests' Redis connection is one multiplexed pipe: a settlement
//!   read of up to 1,000 stream entries, or a reconciler scan chunk, on it
//!   sits in front of every customer's answer that follows it;
//! - a settlement batch decodes, encodes and writes for milliseconds; on the
//!   handlers' runtime, requests queued on that worker thread wait for it;
//! - when the cores are short (a flash sale's first seconds), the kernel
//!   should run the customer's request first and the bookkeeping after:
//!   settlement's lag may grow during a burst and is made up after it
//!   (holds last minutes; BENCHMARKS.md gives the measured lag).
//!
//! The workers keep every guarantee of their own modules (the same code
//! runs); only where it runs and at what priority changes. They stop with
//! the server (`stop`), or when the handle is dropped.

use std::sync::Arc;

use anyhow::Context;
use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::events::relay;
use crate::events::sink::RedisStreamSink;
use crate::events::wal::slot::WalSlot;
use crate::events::webhooks::deliver;
use crate::ops::configuration::Settings;
use crate::ops::configuration::{EventsSink, OutboxSource};
use crate::ops::db::pg_pool;
use crate::ops::state;
use crate::reserve::engine::Engine;
use crate::reserve::scripts::Scripts;
use crate::sales::registry::SaleRegistry;
use crate::settle::reconcile;
use crate::settle::sweep;

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

    fn any(&self) -> bool {
        self.settle || self.sweep || self.reconcile || self.relay
    }
}

/// The running workers' thread. Dropping it stops them.
pub struct Running {
    _stop: DropGuard,
    done: oneshot::Receiver<()>,
}

impl Running {
    /// Resolves once every worker has stopped (after `stop` was cancelled):
    /// the settler's batch in hand is committed and acknowledged first.
    pub async fn finished(self) {
        let Running { _stop, done } = self;
        let _ = done.await;
    }
}

/// Connects the workers' own Redis connection and Postgres pool on a new
/// thread and starts `which` there; returns once they are connected (a
/// Redis that cannot be reached fails the start, as for the handlers).
/// `None`: no worker asked for.
pub async fn start(
    settings: &Settings,
    which: Workers,
    stop: CancellationToken,
) -> anyhow::Result<Option<Running>> {
    if !which.any() {
        return Ok(None);
    }
    let settings = settings.clone();
    let (ready_tx, ready_rx) = oneshot::channel::<anyhow::Result<()>>();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let guard = stop.clone().drop_guard();
    std::thread::Builder::new()
        .name("origin-workers".into())
        .spawn(move || {
            lower_priority(settings.workers_nice);
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("origin-workers")
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            rt.block_on(async move {
                let (engine, pool, sales) = match connect(&settings, which).await {
                    Ok(parts) => {
                        let _ = ready_tx.send(Ok(()));
                        parts
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                run(&settings, which, engine, pool, sales, stop).await;
            });
            drop(rt);
            let _ = done_tx.send(());
        })
        .context("starting the workers' thread")?;
    ready_rx
        .await
        .context("the workers' thread ended before connecting")??;
    Ok(Some(Running {
        _stop: guard,
        done: done_rx,
    }))
}

async fn connect(
    settings: &Settings,
    which: Workers,
) -> anyhow::Result<(Arc<Engine>, PgPool, Arc<SaleRegistry>)> {
    let pool = pg_pool(settings.database_url(), settings.pg_pool_size)?;
    if which.relay
        && let OutboxSource::Wal { slot } = &settings.outbox_source
    {
        // A server without logical WAL is a configuration error: refuse
        // to start rather than leave events in the outbox unsaid.
        WalSlot { name: slot.clone() }
            .prepare(&pool)
            .await
            .context("OUTBOX_SOURCE=wal")?;
    }
    let engine = Arc::new(Engine {
        conn: state::redis_at_start(settings).await?,
        scripts: Scripts::load(),
        // The workers tell no client anything; the settler checks
        // replication with an acknowledger of its own (`state::settler`).
        acker: None,
    });
    let sales = Arc::new(SaleRegistry::new(pool.clone(), settings.key_prefix.clone()));
    Ok((engine, pool, sales))
}

async fn run(
    settings: &Settings,
    which: Workers,
    engine: Arc<Engine>,
    pool: PgPool,
    sales: Arc<SaleRegistry>,
    stop: CancellationToken,
) {
    let mut tasks = tokio::task::JoinSet::new();
    if which.sweep {
        tasks.spawn(sweep::run(
            engine.clone(),
            sales.clone(),
            settings.sweep_interval,
            stop.clone(),
        ));
    }
    if which.settle {
        let settler = state::settler(settings, engine.clone(), pool.clone(), sales.clone());
        tasks.spawn(settler.run(stop.clone()));
    }
    if which.relay {
        let relay_options = relay::RelayOptions {
            source: settings.outbox_source.clone(),
            abort_after_ack: settings.relay_abort_after_ack,
        };
        match &settings.events {
            EventsSink::RedisStream => {
                tasks.spawn(relay::run(
                    pool.clone(),
                    RedisStreamSink::new(engine.conn.clone(), &settings.key_prefix)
                        // REDIS_ACK=wait: a batch counts as published once a
                        // replica has it.
                        .acknowledged_by(state::worker_acker(settings)),
                    relay_options.clone(),
                    stop.clone(),
                ));
            }
            EventsSink::Kafka(kafka) => {
                tasks.spawn(relay::run_kafka(
                    pool.clone(),
                    kafka.clone(),
                    relay_options.clone(),
                    stop.clone(),
                ));
            }
        }
        // The relay queues webhook deliveries; this worker sends them.
        tasks.spawn(deliver::run(
            pool.clone(),
            settings.webhooks.clone(),
            stop.clone(),
        ));
    }
    if which.reconcile {
        tasks.spawn(reconcile::run(
            engine,
            pool,
            sales,
            settings.reconcile_interval,
            stop,
        ));
    }
    while tasks.join_next().await.is_some() {}
}

/// Raises this thread's nice value by `by` (Linux: `setpriority` with
/// `PRIO_PROCESS` and 0 applies to the calling thread only; threads it
/// starts inherit it). A failure only costs the priority: logged, not fatal.
fn lower_priority(by: i32) {
    if by == 0 {
        return;
    }
    let now = rustix::process::getpriority_process(None).unwrap_or(0);
    let to = (now + by).min(19);
    if let Err(e) = rustix::process::setpriority_process(None, to) {
        tracing::warn!(error = %e, nice = to, "could not lower the workers' priority");
    }
}
