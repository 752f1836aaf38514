//! `GET /api/sales/{sale}`: the sale summary, computed from Redis (stock per
//! shard) and Postgres (sold units), cached in process for at most 1 s so a
//! crowd refreshing the page costs Redis one read per shard per second. It
//! carries the origin's load signal (`health`) for the edge's admission
//! controller.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use chrono::Utc;
use serde_json::{Value, json};

use crate::http::error::ApiError;
use crate::ops::state::AppState;
use crate::reserve::engine::SkuStock;
use crate::sales::sale::{Phase, Sale};

/// How long the summary waits for Postgres' sold figure. The edge admits by
/// the summary and reads a summary it cannot get within its own timeout as
/// a silent origin (the frontier freezes); the origin sells from Redis
/// while Postgres is down, so Postgres must not make the summary late.
pub const SOLD_READ_TIMEOUT: Duration = Duration::from_millis(250);

/// Units Postgres has sold, and whether the figure is the last one it gave
/// (Postgres down or slow) rather than a fresh one.
async fn sold_units(app: &AppState, sale: &str) -> (i64, bool) {
    let read = sqlx::query_scalar::<_, i32>("SELECT sold FROM inventory WHERE sale_id = $1")
        .bind(sale)
        .fetch_optional(&app.pool);
    match tokio::time::timeout(SOLD_READ_TIMEOUT, read).await {
        Ok(Ok(sold)) => {
            let sold = sold.map(i64::from).unwrap_or(0);
            app.last_sold.insert(sale.to_string(), sold).await;
            (sold, false)
        }
        Ok(Err(e)) => {
            tracing::warn!(sale, error = %e, "summary: Postgres did not give the sold figure; using the last one");
            (app.last_sold.get(sale).await.unwrap_or(0), true)
        }
        Err(_) => {
            tracing::warn!(
                sale,
                "summary: Postgres too slow for the sold figure; using the last one"
            );
            (app.last_sold.get(sale).await.unwrap_or(0), true)
        }
    }
}

/// The sale summary.
#[utoipa::path(
    get,
    path = "/api/sales/{sale}",
    tag = "sales",
    params(("sale" = String, Path, description = "The sale id", example = "drop-1")),
    responses(
        (status = 200, description = "The summary (at most 1 s old)", body = crate::http::api::SaleSummary),
        (status = 404, description = "`sale_not_found`", body = crate::http::api::ErrorBody),
        (status = 503, description = "`redis_unavailable`, `database_unavailable`, `summary_unavailable`", body = crate::http::api::ErrorBody, headers(("Retry-After" = u32, description = "seconds"))),
    )
)]
pub async fn summary(
    State(app): State<AppState>,
    Path(sale_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(summary_of(&app, &sale_id).await?))
}

/// The summary of a sale as `GET /api/sales/{sale}` answers it (cached
/// [`crate::ops::state::SUMMARY_TTL`], single flight).
pub async fn summary_of(app: &AppState, sale_id: &str) -> Result<Value, ApiError> {
    let sale = app
        .sales
        .get(sale_id)
        .await?
        .ok_or_else(|| ApiError::not_found("sale_not_found", format!("no sale {sale_id:?}")))?;
    app.summaries
        .try_get_with(sale_id.to_string(), compute(app, &sale))
        .await
        // The first waiter gets its own error; others a plain 503.
        .map_err(|e| {
            Arc::try_unwrap(e).unwrap_or_else(|e| {
                ApiError::unavailable(
                    "summary_unavailable",
                    format!("the summary could not be computed: {e}"),
                )
            })
        })
}

async fn compute(app: &AppState, sale: &Sale) -> Result<Value, ApiError> {
    let cfg = &sale.config;
    metrics::counter!("flashsale_summary_computations_total", "sale" => cfg.id.clone())
        .increment(1);
    // Per SKU: its units in Redis, and whether expired holds would give it
    // units back; a SKU is sold out when it has neither.
    let stock = SkuStock::read(&app.engine.conn, sale).await?;
    let sku_available = &stock.available;
    let sku_sold_out: Vec<bool> = (0..cfg.skus.len()).map(|p| stock.sold_out(p)).collect();
    let available: i64 = sku_available.iter().sum();
    let (sold, sold_stale) = sold_units(app, &cfg.id).await;
    let total = i64::from(cfg.units_total);
    let available = available.min(total);
    let sold = sold.min(total - available);
    let held = total - available - sold;
    // The sale is sold out only when every SKU is.
    let sold_out = sku_sold_out.iter().all(|s| *s);
    let mut phase = cfg.phase_by_time(Utc::now());
    if phase == Phase::Live && sold_out {
        phase = Phase::SoldOut;
    }
    let lag = crate::settle::settler::lag(&app.engine, sale).await?;
    let signal = app.load.signal();
    // "Percent sold" as a shopper reads it: units no longer for sale.
    let percent_sold = ((total - available) as f64 * 1000.0 / total as f64).round() / 10.0;
    let skus: Vec<Value> = cfg
        .skus
        .iter()
        .enumerate()
        .map(|(p, k)| {
            json!({
                "id": k.id,
                "name": k.name,
                "price_cents": k.price_cents,
                "units_total": k.units_total,
                "units_available": sku_available[p].min(i64::from(k.units_total)),
                "per_user_limit": k.per_user_limit,
                "sold_out": sku_sold_out[p],
            })
        })
        .collect();
    Ok(json!({
        "sale": cfg.id,
        "name": cfg.name,
        "price_cents": cfg.price_cents,
        "starts_at": cfg.starts_at.to_rfc3339(),
        "ends_at": cfg.ends_at.map(|e| e.to_rfc3339()),
        "units_total": total,
        "units_available": available,
        "units_held": held,
        "units_sold": sold,
        // Postgres did not answer in time: `units_sold` (and so `units_held`)
        // is the last figure it gave; `units_available` is Redis's, live.
        "units_sold_stale": sold_stale,
        "percent_sold": percent_sold,
        "sold_out": sold_out,
        "phase": phase,
        "per_user_limit": cfg.per_user_limit,
        "hold_seconds": cfg.hold_seconds,
        "admission_rate": cfg.admission_rate,
        "admission_factor": cfg.admission_factor,
        "admission_p99_ms": cfg.admission_p99_ms,
        // An operator paused admission (the edge's frontier holds).
        "paused": cfg.paused,
        // The operator's message to waiting people (plain text; null: none).
        "message": cfg.message,
        "message_at": cfg.message_at.map(|t| t.to_rfc3339()),
        // What the edge's admission controller follows (this replica, the
        // last `window_s` seconds; see crate::http::load).
        "health": {
            "window_s": signal.window_s,
            "requests_per_s": signal.requests_per_s,
            "accepted_per_s": signal.accepted_per_s,
            "shed_share": signal.shed_share,
            "error_share": signal.error_share,
            "p99_ms": signal.p99_ms,
            "settlement_lag": lag,
            "units_available": available,
        },
        "queue": {"shards": cfg.queue_shards},
        "bot_check": cfg.bot_check,
        // A failed bot check gets a place in a shadow queue (issue 47).
        "bot_shadow": cfg.bot_shadow,
        "join_limit": cfg.join_limit,
        "currency": cfg.currency,
        // The beacon the edge's draw takes its round from (null: none).
        "draw_beacon": cfg.draw_beacon,
        "skus": skus,
    }))
}
