//! The Worker (Wasm only): the `#[event(fetch)]` entry and router
//! ([`entry`]) and the handlers it routes to. Thin I/O: every decision is
//! a call into a host-tested module (`api`, `botcheck`, `guard`, `queue`).
//!
//! - [`join`]: joins and their challenge (`POST …/queue`, `GET …/challenge`);
//! - [`status`]: status polls (`GET …/queue`) and seen reports;
//! - [`audit`]: the draw's audit, receipts, admission metrics;
//! - [`summary`]: the sale summary with the queue's figures;
//! - [`reserve`]: reservations and other calls forwarded to the origin;
//! - [`snapshot`], [`pieces`], [`memory`], [`calls`], [`sale`]: what the
//!   handlers share — the coordinator's snapshot, the immutable pieces
//!   places are computed from, isolate memory, object calls, the sale's
//!   settings.

pub mod audit;
pub mod calls;
mod entry;
pub mod join;
pub mod memory;
pub mod pieces;
pub mod reserve;
pub mod sale;
pub mod snapshot;
pub mod status;
pub mod summary;
