//! The bot check at join (pure, host-tested). The Worker reads the sale's
//! setting from the origin's summary, issues proof-of-work challenges and
//! verifies a join's proof here before it calls any object; the account's
//! queue shard refuses a challenge used before (`queue::entries`).
//!
//! - [`join`]: the setting, the join body's proof, the refusals;
//! - [`pow`]: proof-of-work challenges (issue, verify, solve);
//! - [`turnstile`]: Cloudflare Turnstile's siteverify and the page's CSP.

pub mod join;
pub mod pow;
pub mod turnstile;
