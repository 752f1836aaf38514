//! The edge: a Cloudflare Worker (Rust compiled to Wasm) in front of the
//! origin. It serves the queue page, holds each sale's fair queue spread
//! over `QueueShard` Durable Objects with a `SaleQueue` coordinator, admits
//! people at the sale's admission rate with HMAC `admit` tokens, caches the
//! sale summary and the sold-out flag, and forwards admitted requests to
//! the origin.
//!
//! Layout: one folder per part. Plain Rust, tested on the host:
//! - [`api`]: routes, errors, request and response bodies, the OpenAPI
//!   document;
//! - [`botcheck`]: the bot check at join (proof of work, Turnstile);
//! - [`guard`]: refusals before any work (configuration, rate limits);
//! - [`draw`]: the verifiable pre-queue draw, in bounded steps;
//! - [`queue`]: shards, places and the status a poll answers;
//! - [`admission`]: the frontier, its rate controller, abandoned turns;
//! - [`store`]: the storage interface the objects' logic runs on (SQL:
//!   Durable Object storage in the Worker, in-memory SQLite in tests).
//!
//! Wasm only (`cfg(target_arch = "wasm32")`), thin I/O over the above:
//! - `http`: answers, key rings, caches, the origin's summary, the
//!   sold-out flag;
//! - `objects`: the Durable Objects;
//! - `worker`: the `#[event(fetch)]` entry, its router and handlers.
//!
//! No file imports another around a loop (`scripts/modgraph edge`): the
//! Wasm parts import the plain ones, never the reverse, and within the Wasm
//! parts `worker` and `objects` import `http`, which imports neither.
//!
//! Invariant: nothing in this crate trusts input — every token is
//! verified, every id validated, and no input can make it panic.

pub mod admission;
pub mod api;
pub mod botcheck;
pub mod draw;
pub mod guard;
pub mod queue;
pub mod store;

#[cfg(target_arch = "wasm32")]
mod http;
#[cfg(target_arch = "wasm32")]
mod objects;
#[cfg(target_arch = "wasm32")]
mod worker;
