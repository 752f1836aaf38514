//! A live sale, second by second, for the admin API (`GET …/live` and its
//! Server-Sent Events stream) and the console's charts.
//!
//! Role: one sampler task per watched sale builds a [`Frame`] each second
//! from what this origin knows (its sale config and summary, Postgres'
//! reservation and outbox counts, the holds and error answers of this
//! process) and, when `ADMIN_EDGE_URL` is set, the edge coordinator's
//! admission figures; readers share its frames through a `watch` channel.
//!
//! Invariants kept here:
//! - the cost does not grow with the viewers: however many consoles and
//!   streams watch a sale, one sampler reads once a second (its Postgres
//!   queries use the `reservations (sale_id, status)` and
//!   `outbox_unpublished` indexes);
//! - a sampler nobody watched for [`IDLE`] stops;
//! - a figure that cannot be read now (the edge down, Postgres slow) is
//!   `null` with the reason beside it, never a made-up zero, and never
//!   stops the other figures;
//! - per-second rates come from two samples' difference over their real
//!   interval, and are `null` until there are two.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use crate::ops::state::AppState;

/// A sampler nobody asked for this long stops.
pub const IDLE: Duration = Duration::from_secs(30);
/// How often a frame is made.
pub const PERIOD: Duration = Duration::from_secs(1);
/// The edge's figures wait at most this long.
const EDGE_TIMEOUT: Duration = Duration::from_millis(800);

/// The queue as the edge's coordinator reports it.
#[derive(Debug, Clone, Serialize, Deserialize, Default, utoipa::ToSchema)]
pub struct Queue {
    /// People with a place in line, and those of them not yet admitted.
    pub placed: u64,
    pub waiting: u64,
    /// People admitted so far, and per second over the last frame.
    pub admitted: u64,
    pub admitted_per_s: Option<f64>,
    /// People placed (joined) per second over the last frame.
    pub joins_per_s: Option<f64>,
    /// The rate the admission controller chose (people/s), the sale's
    /// ceiling, and why the rate is what it is.
    pub rate: f64,
    pub ceiling: f64,
    pub reason: String,
    /// Whether the frontier is held (paused, or the origin not answering).
    pub frozen: bool,
    pub paused: bool,
    /// Turns that went unused and passed on to the next people.
    pub turns_passed_on: u64,
    /// Admission windows that ended (used or not).
    pub windows_ended: u64,
    /// Turns revoked (and so passed on at once).
    pub revoked: u64,
    /// Joins that failed the bot check and were put in the shadow queue.
    pub shadowed: u64,
    /// Joins that failed the bot check and were refused with its error.
    pub bot_refused: u64,
}

/// Reservations of the sale in Postgres, by status (settled rows).
#[derive(Debug, Clone, Serialize, Default, utoipa::ToSchema)]
pub struct Reservations {
    pub held: i64,
    pub paid: i64,
    pub expired: i64,
    pub cancelled: i64,
    pub rejected: i64,
}

/// One SKU's stock now.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SkuFigures {
    pub id: String,
    pub name: String,
    pub units_total: i64,
    /// Units Redis can still grant.
    pub units_left: i64,
    /// Units paid for (Postgres).
    pub units_sold: i64,
    pub sold_out: bool,
}

/// The outbox: events not yet on the sink.
#[derive(Debug, Clone, Serialize, Default, utoipa::ToSchema)]
pub struct Outbox {
    pub pending: i64,
    /// Seconds since the oldest unpublished event was written (0: none).
    pub lag_s: f64,
}

/// One error code this origin process answered.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Answered {
    pub code: String,
    pub total: u64,
    pub per_s: Option<f64>,
}

/// A sale at one second.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Frame {
    pub sale: String,
    #[schema(value_type = String, format = DateTime)]
    pub at: DateTime<Utc>,
    /// `upcoming`, `live`, `sold_out`, `ended`.
    pub phase: String,
    pub paused: bool,
    /// The admission ceiling the operator set (people/s).
    pub admission_rate: f64,
    pub message: Option<String>,
    /// The edge's figures; null with `queue_error` when they cannot be read.
    pub queue: Option<Queue>,
    pub queue_error: Option<String>,
    /// Holds this origin process granted per second.
    pub holds_per_s: Option<f64>,
    pub units_total: i64,
    pub units_left: i64,
    pub units_held: i64,
    pub units_sold: i64,
    pub skus: Vec<SkuFigures>,
    pub reservations: Option<Reservations>,
    /// Seconds the settlement of Redis holds into Postgres is behind.
    pub settlement_lag_s: Option<f64>,
    pub outbox: Option<Outbox>,
    /// Error answers of this origin process (the public API), by code.
    pub errors: Vec<Answered>,
    /// Why a figure above is null, when one is.
    pub notes: Vec<String>,
}

/// What the previous frame counted, for rates.
#[derive(Default)]
struct Totals {
    at: Option<Instant>,
    admitted: Option<u64>,
    placed: Option<u64>,
    granted: u64,
    errors: HashMap<&'static str, u64>,
}

fn per_s(now: u64, before: Option<u64>, secs: f64) -> Option<f64> {
    let b = before?;
    (secs > 0.0).then(|| now.saturating_sub(b) as f64 / secs)
}

/// The samplers of every watched sale.
#[derive(Default)]
pub struct Hub {
    samplers: std::sync::Mutex<HashMap<String, Watched>>,
}

struct Watched {
    frames: watch::Receiver<Option<Arc<Frame>>>,
    wanted: Arc<std::sync::Mutex<Instant>>,
}

impl Hub {
    /// The frames of `sale`, starting its sampler if none runs. The sale
    /// must exist (the caller checked).
    pub fn watch(&self, app: &AppState, sale: &str) -> watch::Receiver<Option<Arc<Frame>>> {
        let mut map = self
            .samplers
            .lock()
            .expect("the hub's lock is never poisoned: no panics while held");
        if let Some(w) = map.get(sale)
            && w.frames.has_changed().is_ok()
        {
            *w.wanted.lock().expect("never poisoned") = Instant::now();
            return w.frames.clone();
        }
        let (tx, rx) = watch::channel(None);
        let wanted = Arc::new(std::sync::Mutex::new(Instant::now()));
        tokio::spawn(sample(app.clone(), sale.to_string(), tx, wanted.clone()));
        map.insert(
            sale.to_string(),
            Watched {
                frames: rx.clone(),
                wanted,
            },
        );
        rx
    }

    /// The sale's latest frame, waiting up to 3 s for a first one.
    pub async fn latest(&self, app: &AppState, sale: &str) -> Option<Arc<Frame>> {
        let mut rx = self.watch(app, sale);
        let first = tokio::time::timeout(Duration::from_secs(3), rx.wait_for(Option::is_some));
        match first.await {
            Ok(Ok(f)) => f.clone(),
            _ => None,
        }
    }
}

async fn sample(
    app: AppState,
    sale: String,
    tx: watch::Sender<Option<Arc<Frame>>>,
    wanted: Arc<std::sync::Mutex<Instant>>,
) {
    let client = reqwest::Client::builder()
        .timeout(EDGE_TIMEOUT)
        .build()
        .unwrap_or_default();
    let mut totals = Totals::default();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let idle = wanted.lock().expect("never poisoned").elapsed();
        if tx.receiver_count() <= 1 && idle > IDLE {
            // The hub's own receiver is the one left.
            break;
        }
        if tx.receiver_count() > 1 {
            *wanted.lock().expect("never poisoned") = Instant::now();
        }
        match frame(&app, &client, &sale, &mut totals).await {
            Some(f) => {
                tx.send_replace(Some(Arc::new(f)));
            }
            None => break,
        }
    }
    tracing::debug!(sale, "live sampler stopped");
}

/// One frame; `None` when the sale no longer exists.
async fn frame(
    app: &AppState,
    client: &reqwest::Client,
    sale: &str,
    totals: &mut Totals,
) -> Option<Frame> {
    let now = Instant::now();
    let secs = totals
        .at
        .map_or(0.0, |t| now.duration_since(t).as_secs_f64());
    let cfg = app.sales.get(sale).await.ok().flatten()?.config.clone();
    let mut notes = Vec::new();
    let summary = crate::http::routes::sales::summary_of(app, sale).await;
    let summary = match summary {
        Ok(s) => Some(s),
        Err(e) => {
            notes.push(format!("summary: {e}"));
            None
        }
    };
    let n = |k: &str| summary.as_ref().and_then(|s| s[k].as_i64()).unwrap_or(0);
    let reservations = match by_status(app, sale).await {
        Ok(r) => Some(r),
        Err(e) => {
            notes.push(format!("reservations: {e}"));
            None
        }
    };
    let sold_by_sku = sold_by_sku(app, sale).await.unwrap_or_default();
    let skus = summary
        .as_ref()
        .and_then(|s| s["skus"].as_array())
        .map(|list| {
            list.iter()
                .enumerate()
                .map(|(p, k)| SkuFigures {
                    id: k["id"].as_str().unwrap_or_default().to_string(),
                    name: k["name"].as_str().unwrap_or_default().to_string(),
                    units_total: k["units_total"].as_i64().unwrap_or(0),
                    units_left: k["units_available"].as_i64().unwrap_or(0),
                    units_sold: sold_by_sku.get(&(p as i32)).copied().unwrap_or(0),
                    sold_out: k["sold_out"].as_bool() == Some(true),
                })
                .collect()
        })
        .unwrap_or_default();
    let outbox = match outbox(app).await {
        Ok(o) => Some(o),
        Err(e) => {
            notes.push(format!("outbox: {e}"));
            None
        }
    };
    let (queue, queue_error) = match edge_figures(app, client, sale).await {
        Ok(mut q) => {
            q.admitted_per_s = per_s(q.admitted, totals.admitted, secs);
            q.joins_per_s = per_s(q.placed, totals.placed, secs);
            totals.admitted = Some(q.admitted);
            totals.placed = Some(q.placed);
            (Some(q), None)
        }
        Err(e) => {
            totals.admitted = None;
            totals.placed = None;
            (None, Some(e))
        }
    };
    let granted = app.sales.granted(sale).load(Ordering::Relaxed);
    let holds_per_s = totals
        .at
        .and_then(|_| per_s(granted, Some(totals.granted), secs));
    totals.granted = granted;
    let errors = crate::http::error::answered()
        .into_iter()
        .map(|(code, total)| Answered {
            code: code.to_string(),
            total,
            per_s: totals
                .at
                .and_then(|_| per_s(total, Some(*totals.errors.get(code).unwrap_or(&0)), secs)),
        })
        .collect::<Vec<_>>();
    totals.errors = errors
        .iter()
        .filter_map(|a| {
            crate::http::error::ERROR_CODES
                .iter()
                .find(|c| **c == a.code)
                .map(|c| (*c, a.total))
        })
        .collect();
    totals.at = Some(now);
    let phase = summary
        .as_ref()
        .and_then(|s| s["phase"].as_str())
        .unwrap_or("unknown")
        .to_string();
    Some(Frame {
        sale: sale.to_string(),
        at: Utc::now(),
        phase,
        paused: cfg.paused,
        admission_rate: cfg.admission_rate,
        message: cfg.message.clone(),
        queue,
        queue_error,
        holds_per_s,
        units_total: n("units_total"),
        units_left: n("units_available"),
        units_held: n("units_held"),
        units_sold: n("units_sold"),
        skus,
        reservations,
        settlement_lag_s: summary
            .as_ref()
            .and_then(|s| s["health"]["settlement_lag"].as_f64()),
        outbox,
        errors,
        notes,
    })
}

async fn by_status(app: &AppState, sale: &str) -> Result<Reservations, sqlx::Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status, count(*) FROM reservations WHERE sale_id = $1 GROUP BY status",
    )
    .bind(sale)
    .fetch_all(&app.pool)
    .await?;
    let mut r = Reservations::default();
    for (status, n) in rows {
        match status.as_str() {
            "settled" | "pending_payment" => r.held += n,
            "paid" => r.paid += n,
            "expired" => r.expired += n,
            "cancelled" => r.cancelled += n,
            "rejected" => r.rejected += n,
            _ => {}
        }
    }
    Ok(r)
}

async fn sold_by_sku(app: &AppState, sale: &str) -> Result<HashMap<i32, i64>, sqlx::Error> {
    let rows: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT sku, sum(qty)::bigint FROM reservations
          WHERE sale_id = $1 AND status = 'paid' GROUP BY sku",
    )
    .bind(sale)
    .fetch_all(&app.pool)
    .await?;
    Ok(rows.into_iter().collect())
}

async fn outbox(app: &AppState) -> Result<Outbox, sqlx::Error> {
    let (pending, lag_s): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), EXTRACT(EPOCH FROM now() - min(created_at))::float8
           FROM outbox WHERE published_at IS NULL",
    )
    .fetch_one(&app.pool)
    .await?;
    Ok(Outbox {
        pending,
        lag_s: lag_s.unwrap_or(0.0).max(0.0),
    })
}

/// The edge's admission figures of the sale (`?format=json`).
async fn edge_figures(
    app: &AppState,
    client: &reqwest::Client,
    sale: &str,
) -> Result<Queue, String> {
    let admin = &app.settings.admin;
    let (Some(base), Some(secret)) = (&admin.edge_url, &admin.edge_secret) else {
        return Err("ADMIN_EDGE_URL is not set".into());
    };
    let url = format!("{base}/api/sales/{sale}/metrics?format=json");
    let r = client
        .get(&url)
        .bearer_auth(secret.expose_secret())
        .send()
        .await
        .map_err(|e| format!("edge: {}", e.without_url()))?;
    let status = r.status();
    let body: Value = r
        .json()
        .await
        .map_err(|e| format!("edge answered {status}: {}", e.without_url()))?;
    if !status.is_success() {
        return Err(format!(
            "edge answered {status}: {}",
            body["error"]["code"].as_str().unwrap_or("?")
        ));
    }
    let u = |k: &str| body[k].as_u64().unwrap_or(0);
    Ok(Queue {
        placed: u("placed"),
        waiting: u("waiting"),
        admitted: u("admitted"),
        admitted_per_s: None,
        joins_per_s: None,
        rate: body["rate"].as_f64().unwrap_or(0.0),
        ceiling: body["ceiling"].as_f64().unwrap_or(0.0),
        reason: body["reason"].as_str().unwrap_or("").to_string(),
        frozen: body["frozen"].as_bool() == Some(true),
        paused: body["paused"].as_bool() == Some(true),
        turns_passed_on: u("abandoned"),
        windows_ended: u("windows_ended"),
        revoked: u("revoked"),
        shadowed: u("shadowed"),
        bot_refused: u("bot_refused"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_needs_two_samples_and_time_between_them() {
        assert_eq!(per_s(10, None, 1.0), None);
        assert_eq!(per_s(10, Some(4), 0.0), None);
        assert_eq!(per_s(10, Some(4), 2.0), Some(3.0));
        // A counter that went back (an edge restarted) is not negative.
        assert_eq!(per_s(3, Some(4), 1.0), Some(0.0));
    }
}
