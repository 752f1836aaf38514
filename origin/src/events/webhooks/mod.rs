//! Outgoing webhooks (issue 46, docs/webhooks.md): endpoints the operator
//! registers receive every event they asked for, signed the Standard
//! Webhooks way, at least once, retried on a schedule, then dead-lettered
//! for `origin webhook replay`.
//!
//! Imports flow one way: `deliver` → `store`, `signing`, `guard`,
//! `schedule`; `store` → `signing` and the events' `envelope`. The relay
//! queues deliveries through `store`.

pub mod deliver;
pub mod guard;
pub mod schedule;
pub mod signing;
pub mod store;
