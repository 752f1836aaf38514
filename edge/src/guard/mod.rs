//! What the edge refuses before any work (pure, host-tested): a
//! misconfigured edge ([`config`]: dev mode only with a loopback origin,
//! key rings kept apart) and too many requests ([`limit`]: reservations per
//! account, joins per address).

pub mod config;
pub mod limit;
