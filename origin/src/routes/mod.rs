//! HTTP routes. `router(state)` is the whole API surface of the origin.

mod health;
mod reservations;
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
        .fallback(health::not_found)
        .with_state(state)
}
