//! The origin's whole HTTP surface: which handler answers which path, and
//! the layers every request passes (access log, request id, body limits).
//!
//! Invariant: a path is served only if it is routed here; anything else
//! gets the JSON 404 of `routes::health::not_found`.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::http::routes::health;
use crate::http::routes::payments;
use crate::http::routes::reservations;
use crate::http::routes::sales;
use crate::ops::state::AppState;

/// The origin's HTTP API. `/metrics` is here unless an admin address
/// (`ORIGIN_METRICS_ADDR`) serves it apart ([`admin_router`]).
pub fn router(state: AppState) -> Router {
    let mut api = Router::new();
    if state.settings.metrics_addr.is_none() {
        api = api.route("/metrics", get(health::metrics));
    }
    let api = api
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/api/sales/{sale}", get(sales::summary))
        .route("/api/sales/{sale}/reservations", post(reservations::create))
        .route(
            "/api/reservations/{id}",
            get(reservations::show).delete(reservations::cancel),
        )
        .route("/api/reservations/{id}/purchase", post(payments::purchase))
        .route(
            "/webhooks/payments",
            // Payment events are tiny: the limit refuses a large body before
            // a byte of it is read or hashed (payments::WEBHOOK_BODY_LIMIT).
            post(payments::webhook).layer(DefaultBodyLimit::max(payments::WEBHOOK_BODY_LIMIT)),
        )
        .route(
            "/api/dev/payments/{id}/complete",
            post(payments::dev_complete),
        )
        .fallback(health::not_found);
    crate::ops::telemetry::access_log(api).with_state(state)
}

/// The metrics listener's router (`ORIGIN_METRICS_ADDR`): [`metrics_routes`]
/// and a 404 for anything else.
pub fn admin_router() -> Router {
    metrics_routes().fallback(health::not_found)
}

/// `/metrics` and `/healthz` (liveness of a process, e.g. `origin settle`,
/// that serves no API), with no fallback: the admin API's router takes
/// them in when the two share a listener, and axum refuses to merge two
/// routers that both have one.
pub fn metrics_routes() -> Router {
    Router::new()
        .route("/metrics", get(health::process_metrics))
        .route("/healthz", get(health::healthz))
}
