//! The Worker's HTTP helpers (Wasm only): answers, key rings, the Cache API
//! and isolate-memory caches, the origin's summary and the sold-out flag.
//!
//! Shared by the Worker's handlers (`worker/`) and the Durable Objects
//! (`objects/`); imports neither, so no import circle runs through here.

pub mod cache;
pub mod keys;
pub mod origin;
pub mod respond;
pub mod sold_out;
