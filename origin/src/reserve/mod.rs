//! The Redis path: the reservation engine and everything it stands on —
//! connections (single, cluster, sentinel), the key layout, the Lua
//! scripts, and `REDIS_ACK=wait`'s replica acknowledgement.
//!
//! Imports flow one way: `engine` → (`scripts`, `store`, `ack`) →
//! `failover`; `engine` also reads a sale's keys from `crate::sales::sale`.

pub mod ack;
pub mod engine;
pub mod failover;
pub mod scripts;
pub mod store;
