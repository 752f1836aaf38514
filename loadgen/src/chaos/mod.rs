//! `loadgen chaos`: the Jepsen-style half of `scripts/chaos` (issue 17).
//!
//! The script starts the servers, the origin and the faults; this module
//! drives the load and records its history (`chaos run`, in `load`),
//! waits for the sale to go quiet (`chaos wait`), checks the history
//! against the end state of Redis and Postgres (`chaos check`, in `check`)
//! and writes RELIABILITY.md from the rows (`chaos report`, in `report`).
//!
//! Invariant of the split: nothing here injects a fault or knows which one
//! ran; the checker judges every row by the same rules (DESIGN.md
//! invariants 1–4), so a row cannot pass by being checked more leniently.

//!
//! Imports flow one way: `command` → (`load`, `check`, `report`) → `row`;
//! `load` writes and `check` reads `history`; `check` → `events` (the
//! events half: outbox against sink and webhook receiver) → `row`.

pub mod check;
pub mod command;
pub mod events;
pub mod history;
pub mod load;
pub mod report;
pub mod row;
