//! `loadgen bench-settle`: settlement throughput with the product's own
//! worker, batched against row-at-a-time, in one run.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use origin::ops::configuration::Settings;
use origin::ops::state::AppState;
use origin::sales::spec::SaleSpec;
use serde_json::json;

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
        bot_shadow: false,
        join_limit: origin::sales::spec::DEFAULT_JOIN_LIMIT,
        currency: origin::sales::spec::DEFAULT_CURRENCY.into(),
        draw_beacon: None,
        skus: Vec::new(),
    };
    let mut conn = state.engine.conn.clone();
    origin::sales::spec::create_sale(&state.pool, &mut conn, &state.settings.key_prefix, &spec)
        .await?;
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
                    .reserve(&sale, 0, &format!("acct-{i}"), 1, "k")
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
