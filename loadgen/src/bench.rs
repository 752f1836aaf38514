//! Benchmark clients used by `scripts/bench`. They print JSON; the script
//! turns it into ratios against baselines measured in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use hdrhistogram::Histogram;
use origin::configuration::Settings;
use origin::sales::SaleSpec;
use origin::startup::AppState;
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
    Ok(origin::configuration::key_ring("ADMISSION_TOKEN_KEYS")?)
}

pub fn now_secs() -> u64 {
    origin::auth::now_secs()
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

#[derive(Args)]
pub struct BenchOriginArgs {
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    origin: String,
    #[arg(long)]
    sale: String,
    /// Requests per second (open loop: sent on schedule, whatever the answers).
    #[arg(long)]
    rate: u64,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Distinct accounts (tokens) to spread the requests over.
    #[arg(long, default_value_t = 1000)]
    accounts: usize,
}

pub async fn bench_origin(a: BenchOriginArgs) -> anyhow::Result<()> {
    crate::ensure_loopback(&a.origin)?;
    anyhow::ensure!(
        a.rate > 0 && a.rate <= 100_000 && a.seconds <= 120,
        "rate 1-100000, at most 120 s"
    );
    let ring = admission_ring()?;
    let tokens: Arc<Vec<String>> = Arc::new(
        (0..a.accounts)
            .map(|i| {
                ring.sign(&Claims::new(
                    TokenType::Admit,
                    format!("lat-{i}"),
                    Some(a.sale.clone()),
                    now_secs(),
                    3600,
                ))
            })
            .collect(),
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(10))
        .build()?;
    let url = Arc::new(format!("{}/api/sales/{}/reservations", a.origin, a.sale));
    let total = a.rate * a.seconds;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u16, u64)>();
    let start = Instant::now();
    let run = Arc::new(uuid::Uuid::new_v4().simple().to_string());
    for i in 0..total {
        let due = start + Duration::from_nanos(i * 1_000_000_000 / a.rate);
        tokio::time::sleep_until(due.into()).await;
        let (client, url, tokens, tx, run) = (
            client.clone(),
            url.clone(),
            tokens.clone(),
            tx.clone(),
            run.clone(),
        );
        tokio::spawn(async move {
            let t0 = Instant::now();
            let token = &tokens[i as usize % tokens.len()];
            let status = match client
                .post(url.as_str())
                .bearer_auth(token)
                .header("Idempotency-Key", format!("{run}-{i}"))
                .header("content-type", "application/json")
                .body(r#"{"qty":1}"#)
                .send()
                .await
            {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            };
            let _ = tx.send((status, t0.elapsed().as_micros() as u64));
        });
    }
    drop(tx);
    let mut hist = Histogram::<u64>::new(3)?;
    let mut by_status = std::collections::BTreeMap::<u16, u64>::new();
    while let Some((status, us)) = rx.recv().await {
        hist.record(us.max(1))?;
        *by_status.entry(status).or_default() += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({
            "target_rate": a.rate,
            "sent": total,
            "achieved_rate": (total as f64 / elapsed).round(),
            "statuses": by_status,
            "p50_ms": hist.value_at_quantile(0.50) as f64 / 1000.0,
            "p90_ms": hist.value_at_quantile(0.90) as f64 / 1000.0,
            "p99_ms": hist.value_at_quantile(0.99) as f64 / 1000.0,
            "max_ms": hist.max() as f64 / 1000.0,
        })
    );
    Ok(())
}

#[derive(Args)]
pub struct BenchSettleArgs {
    /// Holds to settle in each mode.
    #[arg(long, default_value_t = 10_000)]
    holds: usize,
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
    };
    let mut conn = state.engine.conn.clone();
    origin::sales::create_sale(&state.pool, &mut conn, &state.settings.key_prefix, &spec).await?;
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
    let batched = settle_rate(&state, "batch", a.holds, 200).await?;
    let row = settle_rate(&state, "row", a.holds, 1).await?;
    println!(
        "{}",
        json!({"holds": a.holds, "batched_per_s": batched.round(), "row_at_a_time_per_s": row.round(), "ratio": (batched / row * 100.0).round() / 100.0})
    );
    Ok(())
}
