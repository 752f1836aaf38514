//! The storage interface of the Durable Objects' logic (plain Rust): a
//! thin SQL trait ([`sql::Sql`]: a statement with `?` parameters in, rows
//! or a count of rows written out) and the write-through key/value table
//! every object keeps its settings in ([`sql::Meta`]).
//!
//! Why a SQL trait, not a trait of domain operations: the objects' storage
//! *is* SQL — upserts that keep the larger of two stamps, `INSERT OR
//! IGNORE` for idempotent joins, JSON arrays unpacked by `json_each`,
//! partial indexes. A domain trait would need a second, map-based copy of
//! each of those semantics for the tests, and the SQL the objects really
//! run would stay untested until `wrangler dev`. With this trait the same
//! statements run on Durable Object storage (`SqlStorage`, in
//! `objects::storage`) and, in host tests, on an in-memory SQLite
//! (`sqlite`, `rusqlite` as a host dev-dependency only: the Worker's
//! upload carries none of it). Both are SQLite, so what the host tests
//! prove of a statement holds in the object.
//!
//! Invariants kept here: numbers are bound as SQLite integers when they
//! fit (as JavaScript numbers on Durable Object storage, as the objects
//! always bound them); a row is read by column name into a `serde` type,
//! so both stores hand the logic the same shapes.

pub mod sql;
#[cfg(all(test, not(target_arch = "wasm32")))]
pub mod sqlite;
