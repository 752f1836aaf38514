//! The HTTP face of the origin: the router, its handlers, what they read
//! (request bodies, bearer credentials) and answer (one error type, the
//! OpenAPI document), and this replica's load signal.
//!
//! Imports flow one way: `openapi` and `router` → `routes` → (`api`,
//! `bodies`, `auth`, `error`, `load`) → the domain parts (`reserve`,
//! `sales`, `settle`, `payments`). Nothing below `http` imports it, except
//! `crate::ops` (the state holds the load signal; startup serves the router).

pub mod api;
pub mod auth;
pub mod bodies;
pub mod error;
pub mod load;
pub mod openapi;
pub mod router;
pub mod routes;
