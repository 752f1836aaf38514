//! What both modes' reports share: the time series of a run ([`Sample`]),
//! its chart, and the summary text of its JSON report.

use serde::Serialize;
use serde_json::Value;

#[derive(Serialize, Clone)]
pub(crate) struct Sample {
    pub(crate) t: f64,
    pub(crate) arrived: u64,
    pub(crate) waiting: u64,
    pub(crate) admitted: u64,
    pub(crate) holding_units: i64,
    pub(crate) paid_units: i64,
    pub(crate) reserve_requests: u64,
}

pub(crate) fn summary_text(r: &Value) -> String {
    let inv = &r["invariants"];
    format!(
        "Simulated sale {sale}: {accounts} accounts ({pre} in the pre-queue), {units} units, limit {limit}, {shards} shards\n\
         admitted {admitted} at {rate}/s over {secs:.1} s; holds granted {holds}; paid {paid} units (Postgres sold {sold}, held {held})\n\
         cancelled {cancelled}, walked away {walked}; refused: sold out {so}, limit {lim}; retried 429/503 {retried}; errors {errors}\n\
         reservation latency p50 {p50} ms, p90 {p90} ms, p99 {p99} ms, max {max} ms\n\
         origin reservation rate while selling {orate:.1}/s = {ratio:.3} × admission rate\n\
         invariants: sold ≤ units {a}; per-user limit {b}; no duplicate payments {c}; Redis holds + available + sold = units {d}; Postgres held + sold + available = units {e}",
        sale = r["sale"].as_str().unwrap_or_default(),
        accounts = r["accounts"],
        pre = r["prequeue"],
        units = r["units"],
        limit = r["per_user_limit"],
        shards = r["shards"],
        admitted = r["admitted"],
        rate = r["admission_rate"],
        secs = r["seconds"].as_f64().unwrap_or(0.0),
        holds = r["holds_granted"],
        paid = r["paid_units_seen"],
        sold = inv["postgres_sold"],
        held = inv["postgres_held"],
        cancelled = r["cancelled"],
        walked = r["walked_away"],
        so = r["refused_sold_out"],
        lim = r["refused_limit"],
        retried = r["retried_429_503"],
        errors = r["errors"],
        p50 = r["reservation_latency_ms"]["p50"],
        p90 = r["reservation_latency_ms"]["p90"],
        p99 = r["reservation_latency_ms"]["p99"],
        max = r["reservation_latency_ms"]["max"],
        orate = r["origin_reservation_rate"].as_f64().unwrap_or(0.0),
        ratio = r["origin_rate_over_admission_rate"].as_f64().unwrap_or(0.0),
        a = inv["sold_le_units"],
        b = inv["per_user_limit_kept"],
        c = inv["no_duplicate_payments"],
        d = inv["redis_holds_plus_available_plus_sold_eq_units"],
        e = inv["postgres_held_plus_sold_plus_redis_available_eq_units"],
    )
}

pub(crate) fn chart(samples: &[Sample], rate: f64, path: &str) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let t0 = samples.first().map(|s| s.t).unwrap_or(0.0);
    let t1 = samples.last().map(|s| s.t).unwrap_or(1.0).max(t0 + 1.0);
    let ymax = samples
        .iter()
        .map(|s| s.waiting.max(s.admitted) as f64)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Flash sale: people over time (log scale)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(t0..t1, (1.0..ymax * 1.2).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("seconds from the sale's start")
        .y_desc("people / units")
        .draw()?;
    type Line = (&'static str, RGBColor, fn(&Sample) -> f64);
    let series: [Line; 5] = [
        ("waiting", RGBColor(120, 120, 120), |s| s.waiting as f64),
        ("admitted", RGBColor(31, 119, 180), |s| s.admitted as f64),
        ("holding (units)", RGBColor(255, 127, 14), |s| {
            s.holding_units as f64
        }),
        ("paid (units)", RGBColor(44, 160, 44), |s| {
            s.paid_units as f64
        }),
        (
            "reservation requests (cumulative)",
            RGBColor(214, 39, 40),
            |s| s.reserve_requests as f64,
        ),
    ];
    for (name, color, f) in series {
        chart
            .draw_series(LineSeries::new(
                samples.iter().map(|s| (s.t, f(s).max(1.0))),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .draw_series(LineSeries::new(
            samples
                .iter()
                .filter(|s| s.t >= 0.0)
                .map(|s| (s.t, (s.t * rate).max(1.0))),
            RGBColor(0, 0, 0).stroke_width(1),
        ))?
        .label("admission rate × t")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
