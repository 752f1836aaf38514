//! The flash-sale origin: atomic reservations on sharded Redis stock, with
//! Postgres as the truth behind it. See each module's doc for the
//! invariants it keeps; `reserve::engine` holds the core protocol.

pub mod admin;
pub mod events;
pub mod http;
pub mod ops;
pub mod payments;
pub mod reserve;
pub mod sales;
pub mod settle;
