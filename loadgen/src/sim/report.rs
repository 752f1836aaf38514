//! What both modes' reports share: the time series of a run ([`Sample`]),
//! its chart, and the summary text of its JSON report; for a sale of
//! several SKUs (direct mode), the per-SKU table and its chart.

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
    let mut text = sale_text(r);
    if let Some(skus) = r["skus"].as_array().filter(|s| s.len() > 1) {
        text.push('\n');
        text.push_str(&sku_text(r, skus));
    }
    text
}

fn sale_text(r: &Value) -> String {
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

/// The per-SKU table: units, what Postgres sold and holds, what the crowd
/// did, and whether the SKU ended exactly sold out.
fn sku_text(r: &Value, skus: &[Value]) -> String {
    let inv = &r["invariants"];
    let mut t = format!(
        "{n} SKUs, hot share {hot:.2} on {first}, second choice {second}; refused sku_sold_out {sso}, sold_out {so}; run ended: {ended}\n",
        n = skus.len(),
        hot = r["hot_share"].as_f64().unwrap_or(0.0),
        first = skus[0]["id"].as_str().unwrap_or_default(),
        second = r["second_choice"],
        sso = r["refused_sku_sold_out"],
        so = r["refused_sold_out"],
        ended = r["ended"].as_str().unwrap_or("?"),
    );
    t.push_str(&format!(
        "{:<10} {:>6} {:>6} {:>5} {:>7} {:>7} {:>6} {:>8} {:>8} {:>7} {:>10}  {}\n",
        "sku",
        "units",
        "sold",
        "held",
        "avail",
        "wishes",
        "2nd",
        "202s",
        "sku_410",
        "gave_up",
        "sold out@s",
        "check"
    ));
    for k in skus {
        let units = k["units"].as_i64().unwrap_or(0);
        let sold = k["postgres_sold"].as_i64().unwrap_or(0);
        let check = if k["oversold"] == true {
            format!("OVERSOLD (paid rows {})", k["paid_rows"])
        } else if k["sold_out_exactly"] == true {
            "sold out exactly".to_string()
        } else {
            format!("{} unsold", units - sold)
        };
        let consistent = ["paid_rows_match_sold", "redis_adds_up", "postgres_adds_up"]
            .iter()
            .all(|c| k[c] == true);
        let at = k["first_seen_sold_out_s"]
            .as_f64()
            .map_or("-".to_string(), |t| format!("{t:.1}"));
        t.push_str(&format!(
            "{:<10} {:>6} {:>6} {:>5} {:>7} {:>7} {:>6} {:>8} {:>8} {:>7} {:>10}  {}{}\n",
            k["id"].as_str().unwrap_or_default(),
            units,
            sold,
            k["postgres_held"].to_string(),
            k["redis_available"].to_string(),
            k["wishes"].to_string(),
            k["second_choice_attempts"].to_string(),
            k["accepted_202"].to_string(),
            k["refused_sku_sold_out"].to_string(),
            k["gave_up"].to_string(),
            at,
            check,
            if consistent {
                ""
            } else {
                " (Redis/Postgres do not add up)"
            },
        ));
    }
    let total = |f: &str| skus.iter().filter_map(|k| k[f].as_u64()).sum::<u64>();
    t.push_str(&format!(
        "second choice: {tried} people tried another SKU after their wish answered sku_sold_out; {left} left instead ({none} of them because every other SKU was known sold out)\n",
        tried = total("second_choice_attempts"),
        left = total("gave_up"),
        none = total("gave_up_nothing_open"),
    ));
    t.push_str(&outlook_text(&r["outlook_check"]));
    t.push_str(&format!(
        "per SKU: no SKU oversold {a}; every SKU sold out exactly {b}; paid rows = skus.sold {c}; Redis holds + available + sold = units {d}; Postgres held + sold + available = units {e}",
        a = inv["no_sku_oversold"],
        b = inv["every_sku_sold_out"],
        c = inv["sku_paid_rows_match_sold"],
        d = inv["sku_redis_adds_up"],
        e = inv["sku_postgres_adds_up"],
    ));
    t
}

/// The "At your turn" check (`crate::sim::outlook`): per band, how often
/// the wanted SKU was there at the person's turn.
fn outlook_text(check: &Value) -> String {
    let Some(bands) = check["bands"].as_object() else {
        return String::new();
    };
    let mut t = format!(
        "\"At your turn\" told {} times to {} waiting people (their wish):",
        check["told"], check["people"]
    );
    for (name, b) in bands {
        if b["told"] == 0 {
            continue;
        }
        let share = b["share_there"]
            .as_f64()
            .map_or("-".to_string(), |s| format!("{:.0} %", s * 100.0));
        t.push_str(&format!(
            " {name}: told {}, there at their turn {share} of {};",
            b["told"], b["judged"]
        ));
    }
    t.pop();
    t.push('\n');
    t
}

/// Per SKU: units against units sold (Postgres), and first wishes against
/// second-choice attempts; `<sale>-skus.svg` beside the time-series chart.
pub(crate) fn sku_chart(r: &Value, path: &str) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let skus = r["skus"].as_array().cloned().unwrap_or_default();
    let n = skus.len().max(1);
    let field = |k: &Value, f: &str| k[f].as_f64().unwrap_or(0.0);
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(320);
    type Bar = (&'static str, &'static str, RGBColor);
    let panels: [(_, &str, [Bar; 2]); 2] = [
        (
            &top,
            "Units per SKU: on sale and sold (Postgres)",
            [
                ("units", "units", RGBColor(190, 190, 190)),
                ("sold", "postgres_sold", RGBColor(44, 160, 44)),
            ],
        ),
        (
            &bottom,
            "People per SKU: first wishes and second-choice attempts",
            [
                ("first wishes", "wishes", RGBColor(31, 119, 180)),
                (
                    "second-choice attempts",
                    "second_choice_attempts",
                    RGBColor(255, 127, 14),
                ),
            ],
        ),
    ];
    for (area, caption, bars) in panels {
        let ymax = skus
            .iter()
            .flat_map(|k| bars.iter().map(|(_, f, _)| field(k, f)))
            .fold(1.0, f64::max);
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(60)
            // Bars centred on their position; room above them for the legend.
            .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..ymax * 1.35)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n.min(40))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_label_formatter(&|x| {
                let p = x.round().max(0.0) as usize;
                skus.get(p)
                    .and_then(|k| k["id"].as_str())
                    .map(|id| id.trim_start_matches("sku-").to_string())
                    .unwrap_or_default()
            })
            .x_desc("SKU (position)")
            .draw()?;
        for (i, (name, f, color)) in bars.into_iter().enumerate() {
            let x0 = -0.4 + 0.4 * i as f64;
            chart
                .draw_series(skus.iter().enumerate().map(|(p, k)| {
                    let x = p as f64 + x0;
                    Rectangle::new([(x, 0.0), (x + 0.4, field(k, f))], color.filled())
                }))?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
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
