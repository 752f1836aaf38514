//! The fair queue (pure, host-tested): which shard an account belongs to
//! ([`shards`]), global places from sharded queues ([`places`]), the
//! status a poll answers from a ticket and the coordinator's snapshot
//! ([`status`]), and the logic of the queue's Durable Objects over the
//! storage interface (`store`): a shard's entries ([`entries`]) and the
//! sale's coordinator ([`coordinator`]); and, per SKU, whether it is likely
//! to be left at a waiting person's turn ([`outlook`]).
//!
//! Invariant of the part: one entry — one place — per account, places
//! drawn uniformly at random before the start and by arrival after it.

pub mod coordinator;
pub mod entries;
pub mod outlook;
pub mod places;
pub mod poll;
pub mod shards;
pub mod status;
