//! HTTP routes. `router(state)` is the whole API surface of the origin.

mod health;
mod payments;
pub(crate) mod reservations;
mod sales;

use axum::Router;
use axum::routing::{get, post};

use crate::startup::AppState;

/// The origin's HTTP API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/api/sales/{sale}", get(sales::summary))
        .route("/api/sales/{sale}/reservations", post(reservations::create))
        .route(
            "/api/reservations/{id}",
            get(reservations::show).delete(reservations::cancel),
        )
        .route("/api/reservations/{id}/purchase", post(payments::purchase))
        .route("/webhooks/payments", post(payments::webhook))
        .route(
            "/api/dev/payments/{id}/complete",
            post(payments::dev_complete),
        )
        .fallback(health::not_found)
        .with_state(state)
}
