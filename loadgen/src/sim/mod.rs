//! `loadgen sale` and `loadgen compare`: one whole sale simulated end to
//! end over HTTP, either straight at the origin (`direct`, the simulator
//! plays the edge) or through the real edge (`edge`), then the invariants
//! read back from Postgres and Redis.
//!
//! Imports flow one way: `direct` and `edge` → (`sale`, `report`) → `args`;
//! `demand` (the crowd's SKU choices, pure) is used by `direct` and `sale`;
//! `outlook` (the "At your turn" bands against outcomes, pure) by `direct`
//! (`report` prints its figures).

pub mod args;
pub mod demand;
pub mod direct;
pub mod edge;
pub mod outlook;
pub mod report;
pub mod sale;
