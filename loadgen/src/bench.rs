//! Benchmark clients used by `scripts/bench`. They print JSON; the script
//! turns it into ratios against baselines measured in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use hdrhistogram::Histogram;
use origin::ops::configuration::Settings;
use origin::sales::spec::SaleSpec;
use origin::ops::state::AppState;
use serde_json::json;
use token::{Claims, KeyRing, TokenType};

#[derive(Args)]
pub struct TokensArgs {
    #[arg(long)]
    sale: String,
    #[arg(long, default_value_t = 1000)]
    count: usize,
    /// Account ids are `<prefix><n>`.
    #[arg(long, default_value = "bench-")]
    prefix: String,
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
}

fn admission_ring() -> anyhow::Result<KeyRing> {
    Ok(origin::ops::configuration::key_ring("ADMISSION_TOKEN_KEYS")?)
}

pub fn now_secs() -> u64 {
    origin::http::auth::now_secs()
}

pub fn tokens(a: TokensArgs) -> anyhow::Result<()> {
    let ring = admission_ring()?;
    for i in 0..a.count {
        let c = Claims::new(
            TokenType::Admit,
            format!("{}{i}", a.prefix),
            Some(a.sale.clone()),
            now_secs(),
            a.ttl,
        );
        println!("{}", ring.sign(&c));
    }
    Ok(())
}

/// Where the open-loop client sends and with how many accounts and
/// connections (shared by `bench-origin` and `latency-curve`).
#[derive(Args, Clone)]
pub struct Target {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    origin: String,
    #[arg(long)]
    sale: String,
    /// Distinct accounts (tokens) to spread the requests over. Enough that
    /// each shard's per-account counts are a Redis hashtable, as in a real
    /// crowd: with 1,000 over 4 shards they are listpacks, scanned on every
    /// reservation (see `scripts/bench`).
    #[arg(long, default_value_t = 10_000)]
    accounts: usize,
    /// Persistent HTTP/1.1 connections (one request in flight on each).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// How often (µs) the client's pacing thread wakes to send what has
    /// come due. Tokio's timer ticks once a millisecond, which sent a whole
    /// millisecond's requests at once and delayed each by up to 1 ms: at
    /// 9,000/s that was most of `/healthz`'s p99 (2.0 ms; 0.6 ms with 250
    /// µs). Smaller is finer and costs the client more CPU on the cores it
    /// shares with the origin (2026-12-04 entry of
    /// scripts/bench.d/origin-diagnosis.md).
    #[arg(long, default_value_t = 250)]
    pace_us: u64,
}

#[derive(Args)]
pub struct BenchOriginArgs {
    #[command(flatten)]
    target: Target,
    /// Requests per second (open loop: sent on schedule, whatever the answers).
    #[arg(long)]
    rate: u64,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Calibration: GET this path (e.g. /healthz) instead of reserving, to
    /// measure the client and the HTTP stack alone at the same rate.
    #[arg(long)]
    probe: Option<String>,
    /// Diagnosis: write each request's due time (ms from the start) and
    /// latency (ms), one per line, to this file — to line a tail's stalls up
    /// with what else ran then.
    #[arg(long)]
    timeline: Option<std::path::PathBuf>,
}

/// One request as scheduled: its index and when it was due.
type Job = (u64, Instant);

/// Open-loop latency at a fixed rate, printed as JSON.
pub async fn bench_origin(a: BenchOriginArgs) -> anyhow::Result<()> {
    crate::ensure_loopback(&a.target.origin)?;
    let ring = admission_ring()?;
    let point = open_loop(&a, &ring).await?;
    println!("{}", serde_json::to_string(&point)?);
    Ok(())
}

/// What one open-loop run measured.
#[derive(serde::Serialize, Clone)]
pub struct LatencyPoint {
    target_rate: u64,
    sent: u64,
    answered: u64,
    connections: usize,
    pace_us: u64,
    probe: Option<String>,
    achieved_rate: f64,
    statuses: std::collections::BTreeMap<u16, u64>,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
}

/// Hands job `i` (due `i / rate` s after `start`) to `send`, in order, never
/// before it is due; wakes every `tick` or at the next due time, whichever
/// is later, and then sends every job that has come due. Stops early when
/// `send` returns false (the workers are gone). Runs on a thread of its own:
/// its sleeps have microsecond resolution, Tokio's timer has milliseconds.
fn pace(start: Instant, rate: u64, total: u64, tick: Duration, mut send: impl FnMut(Job) -> bool) {
    let due = |i: u64| start + Duration::from_nanos(i * 1_000_000_000 / rate);
    let mut i = 0;
    while i < total {
        let now = Instant::now();
        while i < total && due(i) <= now {
            if !send((i, due(i))) {
                return;
            }
            i += 1;
        }
        if i < total {
            std::thread::sleep(due(i).saturating_duration_since(now).max(tick));
        }
    }
}

/// Open-loop latency at a fixed rate. Requests are due on a fixed schedule
/// and latency counts from the due time, not from the send (no coordinated
/// omission: a stall shows in every request it delays). The client is kept
/// cheap, because it shares the two cores with the origin and Redis: raw
/// hyper HTTP/1.1 on a fixed pool of persistent connections, no per-request
/// task, no connection setup inside the measurement; a pacing thread
/// ([`pace`]) hands due requests to the connections every `pace_us`.
async fn open_loop(a: &BenchOriginArgs, ring: &KeyRing) -> anyhow::Result<LatencyPoint> {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;

    anyhow::ensure!(
        a.rate > 0 && a.rate <= 100_000 && a.seconds <= 120,
        "rate 1-100000, at most 120 s"
    );
    anyhow::ensure!(
        (1..=1024).contains(&a.target.connections),
        "1-1024 connections"
    );
    let tokens: Arc<Vec<String>> = Arc::new(
        (0..a.target.accounts)
            .map(|i| {
                let claims = Claims::new(
                    TokenType::Admit,
                    format!("lat-{i}"),
                    Some(a.target.sale.clone()),
                    now_secs(),
                    3600,
                );
                format!("Bearer {}", ring.sign(&claims))
            })
            .collect(),
    );
    let authority = a
        .target
        .origin
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let path = Arc::new(format!("/api/sales/{}/reservations", a.target.sale));
    let run = Arc::new(uuid::Uuid::new_v4().simple().to_string());
    let total = a.rate * a.seconds;
    let (job_tx, job_rx) = tokio::sync::mpsc::channel::<Job>(total as usize + 1);
    let job_rx = Arc::new(tokio::sync::Mutex::new(job_rx));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<(u16, u64, u64)>();
    let mut workers = Vec::new();
    for _ in 0..a.target.connections {
        let stream = tokio::net::TcpStream::connect(&authority)
            .await
            .with_context(|| format!("connecting to {authority}"))?;
        stream.set_nodelay(true)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
        let (tokens, path, run, authority, probe) = (
            tokens.clone(),
            path.clone(),
            run.clone(),
            authority.clone(),
            a.probe.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let job = job_rx.lock().await.recv().await;
                let Some((i, due)) = job else { return };
                let builder = match probe.as_deref() {
                    Some(p) => hyper::Request::get(p),
                    None => hyper::Request::post(path.as_str()),
                };
                let req = builder
                    .header("host", authority.as_str())
                    .header("authorization", &tokens[i as usize % tokens.len()])
                    .header("idempotency-key", format!("{run}-{i}"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(br#"{"qty":1}"#)))
                    .expect("a valid request");
                let status = match sender.send_request(req).await {
                    Ok(res) => {
                        let status = res.status().as_u16();
                        // Read the body so the connection is ready for the next.
                        let _ = res.into_body().collect().await;
                        status
                    }
                    Err(_) => 0,
                };
                let _ = done_tx.send((status, due.elapsed().as_micros() as u64, i));
                if status == 0 {
                    return;
                }
            }
        }));
    }
    drop(done_tx);
    let start = Instant::now();
    let rate = a.rate;
    let tick = Duration::from_micros(a.target.pace_us);
    let pacer = std::thread::spawn(move || {
        pace(start, rate, total, tick, |job| {
            job_tx.blocking_send(job).is_ok()
        });
    });
    let mut hist = Histogram::<u64>::new(3)?;
    let mut statuses = std::collections::BTreeMap::<u16, u64>::new();
    let mut answered = 0u64;
    let mut timeline = Vec::new();
    while let Some((status, us, i)) = done_rx.recv().await {
        hist.record(us.max(1))?;
        if a.timeline.is_some() {
            timeline.push((i, us));
        }
        *statuses.entry(status).or_default() += 1;
        answered += 1;
    }
    // The workers ended, so the pacer has sent every job (or found them gone).
    let _ = pacer.join();
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(path) = &a.timeline {
        timeline.sort_unstable();
        let lines: String = timeline
            .iter()
            .map(|(i, us)| {
                let due_ms = *i as f64 * 1000.0 / a.rate as f64;
                format!("{due_ms:.3} {:.3}\n", *us as f64 / 1000.0)
            })
            .collect();
        std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(LatencyPoint {
        target_rate: a.rate,
        sent: total,
        answered,
        connections: a.target.connections,
        pace_us: a.target.pace_us,
        probe: a.probe.clone(),
        achieved_rate: (answered as f64 / elapsed).round(),
        statuses,
        p50_ms: ms(0.50),
        p90_ms: ms(0.90),
        p99_ms: ms(0.99),
        p999_ms: ms(0.999),
        max_ms: hist.max() as f64 / 1000.0,
    })
}

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
    crate::ensure_loopback(&a.target.origin)?;
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

#[derive(Args)]
pub struct BenchSettleArgs {
    /// Holds to settle in each mode.
    #[arg(long, default_value_t = 10_000)]
    holds: usize,
    /// Entries per Postgres transaction in the batched mode (the worker's
    /// default when absent).
    #[arg(long)]
    batch: Option<usize>,
    /// Only the batched mode (for A/B runs of the worker; the row-at-a-time
    /// mode takes a minute per 50,000 holds).
    #[arg(long)]
    batched_only: bool,
}

/// Settles `holds` fresh holds with the product's worker at batch size
/// `batch`; returns holds/s.
async fn settle_rate(
    state: &AppState,
    tag: &str,
    holds: usize,
    batch: usize,
) -> anyhow::Result<f64> {
    let sale_id = format!(
        "sb-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let spec = SaleSpec {
        id: sale_id.clone(),
        name: "settlement bench".into(),
        units: holds as i32,
        per_user_limit: 1,
        shards: 4,
        starts_at: chrono::Utc::now() - chrono::Duration::seconds(1),
        ends_at: None,
        hold_seconds: 3600,
        admission_rate: 100.0,
        admission_factor: 2.0,
        price_cents: 100,
        queue_shards: 1,
        admission_p99_ms: 50.0,
        bot_check: "none".into(),
        join_limit: origin::sales::spec::DEFAULT_JOIN_LIMIT,
        currency: origin::sales::spec::DEFAULT_CURRENCY.into(),
        draw_beacon: None,
    };
    let mut conn = state.engine.conn.clone();
    origin::sales::spec::create_sale(&state.pool, &mut conn, &state.settings.key_prefix, &spec).await?;
    let sale = state
        .sales
        .get(&sale_id)
        .await?
        .context("sale just created")?;
    // Fill the stream through the real reservation engine (no settlement running).
    futures::stream::iter(0..holds)
        .map(|i| {
            let sale = sale.clone();
            async move {
                state
                    .engine
                    .reserve(&sale, &format!("acct-{i}"), 1, "k")
                    .await
            }
        })
        .buffer_unordered(64)
        .for_each(|r| async move {
            r.expect("reserve");
        })
        .await;
    let mut settler = state.settler();
    Arc::get_mut(&mut settler).expect("fresh settler").cfg.batch = batch;
    let start = Instant::now();
    let mut settled = 0;
    while settled < holds {
        let n = settler.settle_sale_round(&sale).await?;
        anyhow::ensure!(n > 0, "streams ran dry at {settled} of {holds}");
        settled += n;
    }
    Ok(holds as f64 / start.elapsed().as_secs_f64())
}

pub async fn bench_settle(a: BenchSettleArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.holds <= 200_000, "at most 200000 holds");
    let state = AppState::connect(Settings::from_env()?).await?;
    let batch = a
        .batch
        .unwrap_or(origin::settle::settler::SettleConfig::new(String::new()).batch);
    let batched = settle_rate(&state, "batch", a.holds, batch).await?;
    if a.batched_only {
        println!(
            "{}",
            json!({"holds": a.holds, "batch": batch, "batched_per_s": batched.round()})
        );
        return Ok(());
    }
    let row = settle_rate(&state, "row", a.holds, 1).await?;
    println!(
        "{}",
        json!({"holds": a.holds, "batch": batch, "batched_per_s": batched.round(), "row_at_a_time_per_s": row.round(), "ratio": (batched / row * 100.0).round() / 100.0})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pacer sends every job once, in order, never before it is due,
    /// and stops when the workers are gone.
    #[test]
    fn pacing_sends_each_job_in_order_and_never_early() {
        let start = Instant::now();
        let mut sent = Vec::new();
        pace(
            start,
            20_000,
            400,
            Duration::from_micros(250),
            |(i, due)| {
                sent.push((i, due, Instant::now()));
                true
            },
        );
        assert_eq!(sent.len(), 400);
        for (n, (i, due, at)) in sent.iter().enumerate() {
            assert_eq!(*i, n as u64);
            assert_eq!(*due, start + Duration::from_micros(50 * *i));
            assert!(at >= due, "job {i} sent before it was due");
        }
        let mut calls = 0;
        pace(Instant::now(), 1_000_000, 10, Duration::ZERO, |_| {
            calls += 1;
            calls < 3
        });
        assert_eq!(calls, 3);
    }
}
