//! The Worker (Wasm only): the `#[event(fetch)]` entry and router
//! ([`entry`]), and the handlers it routes to — the queue's routes
//! ([`waiting`]), the summary ([`summary`]) and reservations and other
//! forwarded calls ([`reserve`]). Thin I/O: every decision is a call into
//! a host-tested module.

mod entry;
pub mod reserve;
pub mod summary;
pub mod waiting;
