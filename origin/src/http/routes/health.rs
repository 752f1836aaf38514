//! Liveness, readiness (Redis and Postgres each checked, the missing one
//! named), Prometheus metrics, and the JSON 404 for unknown paths.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::http::error::ApiError;
use crate::ops::state::AppState;

/// Liveness: no dependencies.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Alive", body = crate::http::api::Alive)))]
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// Readiness: Redis and Postgres, each checked; a 503 names the one down.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = crate::http::api::Ready),
        (status = 503, description = "`not_ready`", body = crate::http::api::NotReady, headers(("Retry-After" = u32, description = "seconds"))),
    ))]
pub async fn readyz(State(app): State<AppState>) -> Response {
    let mut conn = app.engine.conn.clone();
    let redis_ok = tokio::time::timeout(
        CHECK_TIMEOUT,
        redis::cmd("PING").query_async::<String>(&mut conn),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    let pg_ok = tokio::time::timeout(
        CHECK_TIMEOUT,
        sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&app.pool),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    let word = |ok: bool| if ok { "ok" } else { "unavailable" };
    let checks = json!({"redis": word(redis_ok), "postgres": word(pg_ok)});
    if redis_ok && pg_ok {
        return (
            StatusCode::OK,
            Json(json!({"status": "ready", "checks": checks})),
        )
            .into_response();
    }
    let missing: Vec<&str> = [("redis", redis_ok), ("postgres", pg_ok)]
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| n)
        .collect();
    let body = json!({
        "error": {"code": "not_ready", "message": format!("unavailable: {}", missing.join(", "))},
        "checks": checks,
    });
    let mut res = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from(1));
    res
}

/// Prometheus metrics (here unless `ORIGIN_METRICS_ADDR` serves them apart).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text", body = String, content_type = "text/plain; version=0.0.4")))]
pub async fn metrics(State(app): State<AppState>) -> Response {
    prometheus_text(app.metrics.render())
}

/// `/metrics` of the admin listener: the process's one recorder.
pub async fn process_metrics() -> Response {
    prometheus_text(crate::ops::telemetry::metrics_handle().render())
}

fn prometheus_text(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such endpoint")
}
