//! The edge's public HTTP API as plain data (host-tested): routes, errors,
//! the request bodies the edge reads, the origin's reservation answers it
//! reads, the response bodies it renders
//! (Prometheus metrics, access lines), and its OpenAPI document.
//!
//! Nothing here touches the runtime: the Worker (`worker/`) turns a request
//! into a [`routes::Route`] here and an [`error::ApiError`] into an answer.
//! Invariant of the part: no input makes any of it panic.

pub mod bodies;
pub mod error;
pub mod metrics;
/// Host only: the OpenAPI document of the routes (docs/openapi/edge.json).
#[cfg(not(target_arch = "wasm32"))]
pub mod openapi;
pub mod reservation;
pub mod routes;
pub mod summary;
pub mod trace;
