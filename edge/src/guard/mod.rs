//! What the edge refuses before any work (pure, host-tested): a
//! misconfigured edge ([`config`]: dev mode only with a loopback origin,
//! key rings kept apart), operator routes without the admin key
//! ([`admin`]) and too many requests ([`limit`]: reservations per account,
//! joins per address).

pub mod admin;
pub mod config;
pub mod limit;
