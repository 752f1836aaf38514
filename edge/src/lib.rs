//! The edge: a Cloudflare Worker (Rust compiled to Wasm) in front of the
//! origin. It serves the queue page, holds each sale's fair queue spread
//! over `QueueShard` Durable Objects with a `SaleQueue` coordinator, admits
//! people at the sale's admission rate with HMAC `admit` tokens, caches the
//! sale summary and the sold-out flag, and forwards admitted requests to
//! the origin.
//!
//! Layout: the pure modules ([`api`], [`bodies`], [`botcheck`], [`config`], [`control`],
//! [`draw`], [`draw_phases`], [`freeze`], [`frontier`], [`limit`], [`metrics`], [`places`], [`queue`],
//! [`shard_draw`], [`shards`], [`trace`], [`turns`]) hold all the logic and are tested on the host;
//! `glue`, `waiting`, `objects`, `queue_shard` and `sale_queue` (Wasm only)
//! are thin runtime glue. Invariant: nothing in this crate trusts input —
//! every token is verified, every id validated, and no input can make it
//! panic.

pub mod api;
pub mod bodies;
pub mod botcheck;
pub mod config;
pub mod control;
pub mod draw;
pub mod draw_phases;
pub mod freeze;
pub mod frontier;
pub mod limit;
pub mod metrics;
/// Host only: the OpenAPI document of the routes (docs/openapi/edge.json).
#[cfg(not(target_arch = "wasm32"))]
pub mod openapi;
pub mod places;
pub mod queue;
pub mod shard_draw;
pub mod shards;
pub mod trace;
pub mod turns;

#[cfg(target_arch = "wasm32")]
mod glue;
#[cfg(target_arch = "wasm32")]
mod objects;
#[cfg(target_arch = "wasm32")]
mod queue_shard;
#[cfg(target_arch = "wasm32")]
mod sale_queue;
#[cfg(target_arch = "wasm32")]
mod waiting;
