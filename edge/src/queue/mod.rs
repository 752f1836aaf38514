//! The fair queue (pure, host-tested): which shard an account belongs to
//! ([`shards`]), global places from sharded queues ([`places`]), and the
//! status a poll answers from a ticket and the coordinator's snapshot
//! ([`status`]).
//!
//! Invariant of the part: one entry — one place — per account, places
//! drawn uniformly at random before the start and by arrival after it.

pub mod places;
pub mod shards;
pub mod status;
