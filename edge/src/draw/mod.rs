//! The verifiable pre-queue draw (DESIGN.md "The draw, v2"), as plain Rust
//! tested on the host: the hashes ([`hash`]), each shard's bounded draw
//! steps into buckets ([`steps`]) and the index they publish ([`index`]),
//! the coordinator's bounded merge of every shard's sorted pages into the
//! entrant set's Merkle tree and the listing ([`freeze`]), and the order
//! of the coordinator's phases ([`phases`]).
//!
//! Invariant of the part: the order depends only on the key and the set of
//! leaves; every step is bounded, and its state can be stored and resumed.

pub mod freeze;
pub mod hash;
pub mod index;
pub mod phases;
pub mod steps;
