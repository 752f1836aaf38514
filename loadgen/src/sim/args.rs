//! The command line of `loadgen sale`, both modes: the sale's shape and the
//! crowd's behaviour ([`SaleArgs`]), and what edge mode adds ([`EdgeArgs`]).

use clap::Args;

#[derive(Args, Clone)]
pub struct SaleArgs {
    /// The origin to load (direct mode).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub(crate) origin: String,
    #[arg(long, default_value = "sim")]
    pub(crate) sale: String,
    #[arg(long, default_value_t = 200_000)]
    pub(crate) accounts: usize,
    /// Units of the whole sale; with `--skus N` they are split over the N
    /// SKUs as evenly as possible (each gets units / N, the first
    /// units % N SKUs one more, SKU 0 first).
    #[arg(long, default_value_t = 1_000)]
    pub(crate) units: i32,
    /// SKUs the sale sells (1-1000; ids sku-00, sku-01, …, each priced
    /// 9,900 cents, no limit of their own: the sale-wide
    /// `--per-user-limit` counts units across all of them). 1: a sale of
    /// one SKU made the old way (`--units`), reserved with {"qty"} only.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) skus: u16,
    /// Share of people whose first wish is SKU 0 (the hot one, e.g. the
    /// size that takes half the wishes); the others wish uniformly among
    /// the other SKUs. Not given: every SKU is wished equally.
    #[arg(long)]
    pub(crate) hot_share: Option<f64>,
    /// Probability that a person whose wish answered 410 `sku_sold_out`
    /// tries one other SKU, drawn uniformly among those not known to be
    /// sold out (the summary's flags and the 410s seen); otherwise they
    /// leave.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) second_choice: f64,
    #[arg(long, default_value_t = 2)]
    pub(crate) per_user_limit: i32,
    #[arg(long, default_value_t = 4)]
    pub(crate) shards: i32,
    /// People admitted per second.
    #[arg(long, default_value_t = 200.0)]
    pub(crate) admission_rate: f64,
    #[arg(long, default_value_t = 2.0)]
    pub(crate) admission_factor: f64,
    #[arg(long, default_value_t = 8)]
    pub(crate) hold_seconds: i32,
    /// Seconds between the simulator's start and the sale's start
    /// (people arriving in that window form the pre-queue).
    #[arg(long, default_value_t = 3.0)]
    pub(crate) prestart_seconds: f64,
    /// Share of people who arrive before the start.
    #[arg(long, default_value_t = 0.2)]
    pub(crate) prestart_share: f64,
    /// Mean arrival delay after the start, seconds (exponential burst).
    #[arg(long, default_value_t = 2.0)]
    pub(crate) burst_seconds: f64,
    /// Probability that a person holding units pays.
    #[arg(long, default_value_t = 0.75)]
    pub(crate) pay: f64,
    /// Probability that a holder cancels (the rest walk away: the hold expires).
    #[arg(long, default_value_t = 0.10)]
    pub(crate) cancel: f64,
    /// Probability of asking for the full per-user limit instead of 1 unit.
    #[arg(long, default_value_t = 0.2)]
    pub(crate) multi: f64,
    #[arg(long, default_value_t = 120)]
    pub(crate) max_seconds: u64,
    /// Where the report (JSON, summary, SVG) goes.
    #[arg(long, default_value = "sim-output")]
    pub(crate) output: String,
    /// Edge mode (`--edge <url>`): see `crate::sim::edge`.
    #[command(flatten)]
    pub(crate) edge: EdgeArgs,
}

#[derive(Args, Clone, Default)]
pub struct EdgeArgs {
    /// Edge mode: people join, poll, reserve and pay through this edge
    /// (`--origin` is then used for the payment webhook and `/metrics`).
    #[arg(long)]
    pub(crate) edge: Option<String>,
    /// Edge mode: status polls in flight at most.
    #[arg(long, default_value_t = 16)]
    pub(crate) edge_in_flight: usize,
    /// Edge mode: joins in flight at most (a separate pool, so a burst of
    /// arrivals does not hold up the polls of people already in line).
    #[arg(long, default_value_t = 8)]
    pub(crate) join_in_flight: usize,
    /// Edge mode: checkout calls (reserve, purchase, cancel) in flight at most.
    #[arg(long, default_value_t = 8)]
    pub(crate) checkout_in_flight: usize,
    /// Edge mode: mean seconds a person keeps polling after being told
    /// `sold_out` before leaving (exponential).
    #[arg(long, default_value_t = 10.0)]
    pub(crate) sold_out_patience: f64,
    /// Edge mode: seconds between report samples.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) sample_seconds: f64,
    /// Edge mode: share of admitted people who close the tab at once: they
    /// stop polling and never reserve (the edge closes such a turn after
    /// 30 s unseen and admits the next person).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) walk_away_admitted: f64,
    /// Edge mode: the origin stops answering this many seconds after the
    /// sale's start (SIGSTOP to `--origin-pid`), for `--outage-seconds`.
    #[arg(long)]
    pub(crate) outage_at: Option<f64>,
    #[arg(long, default_value_t = 15.0)]
    pub(crate) outage_seconds: f64,
    /// The origin's process id, for `--outage-at`.
    #[arg(long)]
    pub(crate) origin_pid: Option<u32>,
}
