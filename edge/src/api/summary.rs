//! What the edge reads of the origin's sale summary (pure, host-tested):
//! the settings a join is routed by, and whether the sale is sold out.
//!
//! Invariants kept here: a summary without a readable start is refused
//! (502 `origin_error`), and so is a bot-check setting this edge does not
//! know — a join would otherwise pass a check the shop asked for; the
//! shard count is clamped to `1..=MAX_SHARDS`.

use serde_json::Value;

use crate::api::error::{ApiError, ApiResult};
use crate::botcheck::join::BotCheck;
use crate::guard::limit::DEFAULT_JOIN_LIMIT;
use crate::queue::shards;

/// What the Worker needs of a sale's settings to route a join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleCfg {
    pub shards: u32,
    pub starts_at_ms: u64,
    pub ends_at_ms: Option<u64>,
    /// What a join must bring (absent from an older origin's summary:
    /// none).
    pub bot_check: BotCheck,
    /// Joins per address per minute (0: none).
    pub join_limit: u64,
    /// A join that fails the bot check gets a shadow ticket (a place that
    /// never moves up) instead of an error (issue 47; absent: off).
    pub bot_shadow: bool,
}

impl SaleCfg {
    /// The settings in summary `v`; its times are read by `parse_time`
    /// (RFC 3339 to unix ms: `Date.parse` in the Worker).
    pub fn read(v: &Value, parse_time: impl Fn(&str) -> Option<u64>) -> ApiResult<SaleCfg> {
        let time = |k: &str| v[k].as_str().and_then(&parse_time);
        let starts_at_ms = time("starts_at")
            .ok_or_else(|| ApiError::new(502, "origin_error", "sale has no starts_at"))?;
        let bot_check = match v["bot_check"].as_str() {
            None => BotCheck::None,
            Some(text) => BotCheck::parse(text).ok_or_else(|| {
                ApiError::new(502, "origin_error", format!("unknown bot_check {text:?}"))
            })?,
        };
        Ok(SaleCfg {
            shards: shards::clamp_shards(v["queue"]["shards"].as_u64().unwrap_or(1)),
            starts_at_ms,
            ends_at_ms: time("ends_at"),
            bot_check,
            join_limit: v["join_limit"].as_u64().unwrap_or(DEFAULT_JOIN_LIMIT),
            bot_shadow: v["bot_shadow"].as_bool() == Some(true),
        })
    }
}

/// Whether a summary says the sale is sold out.
pub fn says_sold_out(v: &Value) -> bool {
    v["sold_out"].as_bool() == Some(true)
        || v["phase"].as_str() == Some("sold_out")
        || v["units_available"].as_u64() == Some(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn time(t: &str) -> Option<u64> {
        t.parse().ok()
    }

    #[test]
    fn a_summary_gives_the_join_settings() {
        let v = json!({"starts_at": "1000", "ends_at": "9000", "queue": {"shards": 8},
                       "bot_check": "pow:12", "join_limit": 30, "bot_shadow": true});
        let c = SaleCfg::read(&v, time).unwrap();
        assert_eq!(
            c,
            SaleCfg {
                shards: 8,
                starts_at_ms: 1000,
                ends_at_ms: Some(9000),
                bot_check: BotCheck::Pow(12),
                join_limit: 30,
                bot_shadow: true,
            }
        );
        // An older origin's summary: one shard, no check, the default limit.
        let old = SaleCfg::read(&json!({"starts_at": "5"}), time).unwrap();
        assert_eq!(
            (old.shards, old.bot_check, old.ends_at_ms),
            (1, BotCheck::None, None)
        );
        assert_eq!(old.join_limit, DEFAULT_JOIN_LIMIT);
        assert!(!old.bot_shadow, "off unless the sale asks");
        let huge = json!({"starts_at": "5", "queue": {"shards": 1_000_000}});
        assert_eq!(
            SaleCfg::read(&huge, time).unwrap().shards,
            shards::MAX_SHARDS
        );
    }

    #[test]
    fn unknown_checks_and_missing_starts_are_refused() {
        let e = SaleCfg::read(&json!({"starts_at": "5", "bot_check": "captcha"}), time);
        assert_eq!(e.unwrap_err().code, "origin_error");
        let e = SaleCfg::read(&json!({"starts_at": "soon"}), time);
        assert_eq!(e.unwrap_err().status, 502);
    }

    #[test]
    fn sold_out_is_said_three_ways() {
        assert!(says_sold_out(&json!({"sold_out": true})));
        assert!(says_sold_out(&json!({"phase": "sold_out"})));
        assert!(says_sold_out(&json!({"units_available": 0})));
        assert!(!says_sold_out(
            &json!({"units_available": 3, "phase": "open"})
        ));
    }
}
