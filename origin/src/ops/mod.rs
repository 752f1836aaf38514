//! The process and its operator: configuration from the environment,
//! logging and metrics, the Postgres pool and schema, the state a process
//! shares, building and running the server with its background workers,
//! and the `origin` command line (with `audit draw`).
//!
//! Two layers: `clock`, `configuration`, `telemetry` and `db` sit below
//! every other part; `cli` → `startup` → `workers` → `state` sit above
//! them all (`audit` beside `cli`, which runs it).

pub mod audit;
pub mod cli;
pub mod clock;
pub mod configuration;
pub mod db;
pub mod startup;
pub mod state;
pub mod telemetry;
pub mod workers;
