//! Settlement: making every hold durable in Postgres (the truth), giving
//! back units nobody paid for, and keeping Redis and Postgres in agreement.
//!
//! - `settler`: the settlement streams into Postgres, exactly once;
//! - `sweep`: expired holds back on sale, spilled quota back home;
//! - `reconcile`: Redis against Postgres, drift reported and repaired;
//! - `rebuild`: a shard whose keys are gone, rebuilt from Postgres;
//! - `scan`: what `reconcile` and `rebuild` both read.
//!
//! Imports flow one way: `reconcile` → `rebuild` → `scan` → `crate::reserve`;
//! `sweep` and `reconcile` ask `settler` for a sale's settlement lag.

pub mod rebuild;
pub mod reconcile;
pub mod scan;
pub mod settler;
pub mod sweep;
