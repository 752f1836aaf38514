//! `origin sale create`'s arguments, also the admin API's create
//! (`POST /admin/api/sales`, whose JSON body is read as these flags: one
//! parser, one set of defaults, one set of checks for both).

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::{Args, Parser};

use crate::sales::sku::{SkuSpec, parse_sku_flag};
use crate::sales::spec::{DEFAULT_CURRENCY, DEFAULT_JOIN_LIMIT, SaleSpec};

/// `now` or RFC 3339.
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    if s == "now" {
        return Ok(Utc::now());
    }
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("expected RFC 3339 (e.g. 2026-12-01T12:00:00Z) or 'now': {e}"))
}

#[derive(Args, Debug)]
#[command(group(
    clap::ArgGroup::new("what")
        .required(true)
        .args(["units", "sku", "skus"])
))]
pub struct CreateArgs {
    #[arg(long)]
    pub sale: String,
    #[arg(long)]
    pub name: String,
    /// Units of a sale of one SKU (its id and name are the sale's); or list
    /// the SKUs with --sku / --skus.
    #[arg(long, conflicts_with_all = ["sku", "skus"])]
    pub units: Option<i32>,
    /// A SKU, `<id>:<units>:<price_cents>[:<per_user_limit>]` (its name is
    /// its id); repeat for each SKU, in the order the page lists them.
    #[arg(long, value_parser = parse_sku_flag, conflicts_with = "skus")]
    pub sku: Vec<SkuSpec>,
    /// A file listing the SKUs: a JSON array of {"id", "name", "units",
    /// "price_cents", "per_user_limit"} or CSV with a header line naming
    /// those columns (`name`, `per_user_limit` optional).
    #[arg(long)]
    pub skus: Option<PathBuf>,
    #[arg(long)]
    pub per_user_limit: i32,
    #[arg(long)]
    pub shards: i32,
    /// RFC 3339 time or `now`.
    #[arg(long, value_parser = parse_time)]
    pub starts_at: DateTime<Utc>,
    #[arg(long, value_parser = parse_time)]
    pub ends_at: Option<DateTime<Utc>>,
    #[arg(long, default_value_t = 600)]
    pub hold_seconds: i32,
    /// Most people admitted per second by the edge (the ceiling of its
    /// adaptive rate).
    #[arg(long, default_value_t = 50.0)]
    pub admission_rate: f64,
    /// The reservation path's p99 (ms) above which the edge admits slower.
    #[arg(long, default_value_t = 50.0)]
    pub admission_p99_ms: f64,
    /// Admitted-but-not-holding people never exceed this × units available.
    #[arg(long, default_value_t = 2.0)]
    pub admission_factor: f64,
    /// Price of the one SKU of a sale given with --units (default 0).
    #[arg(long, conflicts_with_all = ["sku", "skus"])]
    pub price_cents: Option<i64>,
    /// Durable Objects the edge spreads the sale's queue over (1-256; an
    /// account always lands on the same one). Fixed once created.
    #[arg(long, default_value_t = 1)]
    pub queue_shards: i32,
    /// What a join must bring at the edge: `none`, `pow:<1-32>` (proof of
    /// work of that many zero bits) or `turnstile`. Fixed once created.
    #[arg(long, default_value = "none")]
    pub bot_check: String,
    /// Answer a join that fails the bot check with a place in a shadow
    /// queue that never moves up, instead of an error a bot would retry on.
    #[arg(long)]
    pub bot_shadow: bool,
    /// Joins the edge accepts per address per minute: 10, 30, 100, 300 or
    /// 1000 (each a rate-limiting binding of the edge), or 0 for no limit.
    #[arg(long, default_value_t = DEFAULT_JOIN_LIMIT)]
    pub join_limit: i32,
    /// ISO 4217 code of the price's currency (the queue page shows prices
    /// in it).
    #[arg(long, default_value = DEFAULT_CURRENCY)]
    pub currency: String,
    /// Base URL of a drand-style randomness beacon whose first round at or
    /// after the start goes into the draw's key (`<url>/info`,
    /// `<url>/public/<round>`). Unset: no beacon. Fixed once created.
    #[arg(long)]
    pub draw_beacon: Option<String>,
}

impl CreateArgs {
    /// The sale these arguments ask for, selling `skus` (the --sku flags,
    /// or the --skus file read by the caller).
    pub fn spec(self, skus: Vec<SkuSpec>) -> SaleSpec {
        SaleSpec {
            id: self.sale,
            name: self.name,
            units: self.units.unwrap_or(0),
            per_user_limit: self.per_user_limit,
            shards: self.shards,
            starts_at: self.starts_at,
            ends_at: self.ends_at,
            hold_seconds: self.hold_seconds,
            admission_rate: self.admission_rate,
            admission_factor: self.admission_factor,
            price_cents: self.price_cents.unwrap_or(0),
            queue_shards: self.queue_shards,
            admission_p99_ms: self.admission_p99_ms,
            bot_check: self.bot_check,
            bot_shadow: self.bot_shadow,
            join_limit: self.join_limit,
            currency: self.currency,
            draw_beacon: self.draw_beacon,
            skus,
        }
    }
}

/// Only to parse [`CreateArgs`] from a list of flags.
#[derive(Parser, Debug)]
#[command(name = "create", no_binary_name = true, disable_help_flag = true)]
struct Create {
    #[command(flatten)]
    args: CreateArgs,
}

/// Reads `--flag value` pairs (no program name) as `sale create` would.
pub fn parse_flags(flags: &[String]) -> Result<CreateArgs, String> {
    Create::try_parse_from(flags)
        .map(|c| c.args)
        .map_err(|e| e.render().to_string().trim().to_string())
}
