//! `loadgen latency-curve`: reservation latency from a tenth of a peak to
//! the whole peak, each rate beside the calibration route at the same rate
//! with the same client; JSON and an SVG chart.

use clap::Args;
use serde_json::json;

use crate::bench::open_loop::{BenchOriginArgs, LatencyPoint, Target, open_loop};
use crate::bench::tokens::admission_ring;

#[derive(Args)]
pub struct LatencyCurveArgs {
    #[command(flatten)]
    target: Target,
    /// Seconds at each rate.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// The peak the fractions are taken of (req/s, e.g. wrk's saturated rate).
    #[arg(long)]
    peak: u64,
    /// Points from 1/steps of the peak to the whole peak.
    #[arg(long, default_value_t = 10)]
    steps: u64,
    /// The calibration route run at every rate too (the HTTP stack alone).
    #[arg(long, default_value = "/healthz")]
    baseline: String,
    /// Where the SVG chart goes.
    #[arg(long)]
    svg: std::path::PathBuf,
}

/// p50/p99/p999 of reservations from 10 % to 100 % of the peak, each rate
/// followed by the calibration route at the same rate with the same client;
/// prints every point as JSON and draws them.
pub async fn latency_curve(a: LatencyCurveArgs) -> anyhow::Result<()> {
    crate::loopback::ensure_loopback(&a.target.origin)?;
    anyhow::ensure!((1..=20).contains(&a.steps), "1-20 steps");
    anyhow::ensure!(a.peak >= a.steps, "peak below the number of steps");
    let ring = admission_ring()?;
    let mut points = Vec::new();
    for step in 1..=a.steps {
        let rate = a.peak * step / a.steps;
        let run = BenchOriginArgs {
            target: a.target.clone(),
            rate,
            seconds: a.seconds,
            probe: None,
            timeline: None,
        };
        let product = open_loop(&run, &ring).await?;
        let probe = BenchOriginArgs {
            probe: Some(a.baseline.clone()),
            ..run
        };
        let baseline = open_loop(&probe, &ring).await?;
        eprintln!(
            "  {rate}/s: reservations p50 {} p99 {} p999 {} ms; {} p99 {} ms",
            product.p50_ms, product.p99_ms, product.p999_ms, a.baseline, baseline.p99_ms
        );
        points.push((step * 100 / a.steps, product, baseline));
    }
    draw_curve(&a.svg, a.peak, &a.baseline, &points)?;
    let json: Vec<_> = points
        .iter()
        .map(|(pct, p, b)| json!({"percent_of_peak": pct, "reservations": p, "baseline": b}))
        .collect();
    println!("{}", serde_json::to_string(&json)?);
    Ok(())
}

/// Latency (log scale) against offered rate: the product's three quantiles
/// solid, the calibration route's p99 dashed.
fn draw_curve(
    path: &std::path::Path,
    peak: u64,
    baseline: &str,
    points: &[(u64, LatencyPoint, LatencyPoint)],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = points
        .iter()
        .map(|(_, p, b)| p.p999_ms.max(b.p99_ms))
        .fold(1.0f64, f64::max)
        * 1.5;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("origin POST /reservations, open loop (peak {peak}/s = 100 %)"),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0u64..105u64, (0.05f64..top).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("offered rate, % of the peak")
        .y_desc("latency, ms (log)")
        .draw()?;
    type Quantile = fn(&LatencyPoint) -> f64;
    let series: [(&str, RGBColor, Quantile); 3] = [
        ("p50", BLUE, |p| p.p50_ms),
        ("p99", RED, |p| p.p99_ms),
        ("p999", BLACK, |p| p.p999_ms),
    ];
    for (name, color, value) in series {
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|(x, p, _)| (*x, value(p).max(0.05))),
                color.stroke_width(2),
            ))?
            .label(format!("reservations {name}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .draw_series(DashedLineSeries::new(
            points.iter().map(|(x, _, b)| (*x, b.p99_ms.max(0.05))),
            6,
            4,
            GREEN.stroke_width(2),
        ))?
        .label(format!("{baseline} p99 (same client, same rate)"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
