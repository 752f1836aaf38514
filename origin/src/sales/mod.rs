//! Sales: what is sold, how much, when and to whom — configured in Postgres
//! (the one source), loaded and cached per process, created and changed by
//! the operator.
//!
//! Imports flow one way: `spec` and `registry` → `sale` → `sku` →
//! `bounds`, `sale` → `placement` (where each SKU's stock lives), and `sale` → `crate::reserve::store` (the keys of a sale's
//! shards).

pub mod bounds;
pub mod create;
pub mod placement;
pub mod registry;
pub mod revoke;
pub mod sale;
pub mod sku;
pub mod spec;
