//! Building and running the origin: the HTTP server on its listener (the
//! state it serves is [`crate::ops::state`]), the background workers, and
//! graceful shutdown (SIGINT/SIGTERM: stop accepting, finish in-flight
//! requests, then stop the workers cleanly, all within a bounded grace).
//!
//! Imports flow one way: `startup` → `crate::http::router` →
//! `crate::ops::state` → the domain parts (`settle::settler` →
//! `reserve::engine` → `sales::sale` → `reserve::store`).

use std::future::IntoFuture;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::http::router;
use crate::ops::configuration::Settings;
use crate::ops::state::AppState;
use crate::ops::workers::{self, Workers};

/// A built, bound, not yet running origin.
pub struct Application {
    port: u16,
    listener: TcpListener,
    /// The admin API's listener (`ADMIN_ADDR`), when `ADMIN_KEYS` is set.
    admin: Option<TcpListener>,
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
        let admin = if state.settings.admin.keys.is_empty() {
            None
        } else {
            let a = state.settings.admin.addr;
            Some(
                TcpListener::bind(a)
                    .await
                    .with_context(|| format!("binding ADMIN_ADDR {a}"))?,
            )
        };
        Ok(Application {
            port,
            listener,
            admin,
            state,
            workers,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The admin listener's port, when there is one.
    pub fn admin_port(&self) -> Option<u16> {
        self.admin
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| a.port())
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
    /// 3. if the grace runs out first, the call returns an error and
    ///    `origin serve` exits 1 with what is left unfinished: requests are
    ///    cut, and an uncommitted settlement transaction (on the workers'
    ///    thread, which nothing waits for any more) rolls back with the
    ///    process; its entries stay pending in the stream for the next
    ///    worker (XAUTOCLAIM), so nothing is lost.
    pub async fn run_until_stopped(self, stop: CancellationToken) -> anyhow::Result<()> {
        let state = self.state;
        let workers_stop = CancellationToken::new();
        // On a thread of their own, at a lower priority (`crate::ops::workers`).
        let workers = workers::start(&state.settings, self.workers, workers_stop.clone()).await?;
        // Sale changes made anywhere reach this origin's answers at once.
        tokio::spawn(state.sales.clone().follow(workers_stop.clone()));
        // One listener when ADMIN_ADDR is ORIGIN_METRICS_ADDR: the admin
        // API's serves /metrics and /healthz too.
        let shared =
            self.admin.is_some() && state.settings.metrics_addr == Some(state.settings.admin.addr);
        let _metrics = if shared {
            None
        } else {
            serve_admin(state.settings.metrics_addr, workers_stop.clone()).await?
        };
        let _admin = self.admin.map(|listener| {
            let stop = workers_stop.clone();
            let app = crate::admin::routes::router(state.clone(), shared, stop.clone());
            tracing::info!(addr = ?listener.local_addr().ok(), "admin API and console (/admin/)");
            tokio::spawn(async move {
                let served = axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
                )
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "admin API listener failed");
                }
            })
        });
        tracing::info!(port = self.port, "origin listening");
        let app = router::router(state.clone());
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
            if let Some(w) = workers {
                w.finished().await;
            }
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
                tracing::error!(
                    ?grace,
                    "shutdown grace ran out: unfinished requests were cut; an unfinished settlement batch rolled back and stays pending for the next worker"
                );
                anyhow::bail!("shutdown took longer than ORIGIN_SHUTDOWN_GRACE_MS ({grace:?})")
            }
        }
    }
}

/// Serves [`router::admin_router`] on `ORIGIN_METRICS_ADDR` until `stop`;
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
        let served = axum::serve(listener, router::admin_router())
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
