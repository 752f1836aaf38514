//! `loadgen bench-origin`: the open-loop client — requests sent at a fixed
//! rate whatever the answers, each timed from when it was due, so a slow
//! origin shows in the latencies instead of slowing the client down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use token::{Claims, KeyRing, TokenType};

use crate::bench::tokens::{admission_ring, now_secs};

/// Where the open-loop client sends and with how many accounts and
/// connections (shared by `bench-origin` and `latency-curve`).
#[derive(Args, Clone)]
pub struct Target {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub(crate) origin: String,
    #[arg(long)]
    pub(crate) sale: String,
    /// Distinct accounts (tokens) to spread the requests over. Enough that
    /// each shard's per-account counts are a Redis hashtable, as in a real
    /// crowd: with 1,000 over 4 shards they are listpacks, scanned on every
    /// reservation (see `scripts/bench`).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) accounts: usize,
    /// Persistent HTTP/1.1 connections (one request in flight on each).
    #[arg(long, default_value_t = 32)]
    pub(crate) connections: usize,
    /// How often (µs) the client's pacing thread wakes to send what has
    /// come due. Tokio's timer ticks once a millisecond, which sent a whole
    /// millisecond's requests at once and delayed each by up to 1 ms: at
    /// 9,000/s that was most of `/healthz`'s p99 (2.0 ms; 0.6 ms with 250
    /// µs). Smaller is finer and costs the client more CPU on the cores it
    /// shares with the origin (2026-12-04 entry of
    /// scripts/bench.d/origin-diagnosis.md).
    #[arg(long, default_value_t = 250)]
    pub(crate) pace_us: u64,
}

#[derive(Args)]
pub struct BenchOriginArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    /// Requests per second (open loop: sent on schedule, whatever the answers).
    #[arg(long)]
    pub(crate) rate: u64,
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Calibration: GET this path (e.g. /healthz) instead of reserving, to
    /// measure the client and the HTTP stack alone at the same rate.
    #[arg(long)]
    pub(crate) probe: Option<String>,
    /// Diagnosis: write each request's due time (ms from the start) and
    /// latency (ms), one per line, to this file — to line a tail's stalls up
    /// with what else ran then.
    #[arg(long)]
    pub(crate) timeline: Option<std::path::PathBuf>,
}

/// One request as scheduled: its index and when it was due.
type Job = (u64, Instant);

/// Open-loop latency at a fixed rate, printed as JSON.
pub async fn bench_origin(a: BenchOriginArgs) -> anyhow::Result<()> {
    crate::loopback::ensure_loopback(&a.target.origin)?;
    let ring = admission_ring()?;
    let point = open_loop(&a, &ring).await?;
    println!("{}", serde_json::to_string(&point)?);
    Ok(())
}

/// What one open-loop run measured.
#[derive(serde::Serialize, Clone)]
pub struct LatencyPoint {
    pub(crate) target_rate: u64,
    pub(crate) sent: u64,
    pub(crate) answered: u64,
    pub(crate) connections: usize,
    pub(crate) pace_us: u64,
    pub(crate) probe: Option<String>,
    pub(crate) achieved_rate: f64,
    pub(crate) statuses: std::collections::BTreeMap<u16, u64>,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p999_ms: f64,
    pub(crate) max_ms: f64,
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
pub(crate) async fn open_loop(a: &BenchOriginArgs, ring: &KeyRing) -> anyhow::Result<LatencyPoint> {
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
