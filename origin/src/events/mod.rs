//! Events: the outbox (rows written in the same transaction as the state
//! change they announce), its relay to a sink, and the consumers' dedupe —
//! exactly-once effects on at-least-once delivery.
//!
//! Imports flow one way: `relay` → `batch` → `sink`; `relay` → `wal` → `sink`; `kafka` (issue 46) → `envelope`
//! → `sink`; `consume` reads what a sink published.

pub mod batch;
pub mod consume;
pub mod envelope;
pub mod kafka;
pub mod relay;
pub mod sink;
pub mod wal;
pub mod webhooks;
