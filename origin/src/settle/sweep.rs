//! The expiry sweep: every interval, for every active sale and shard, gives
//! back expired holds (sweep.lua) and carries over `unquota` notes — the
//! per-user counts that a released spilled hold owes its home shard
//! (quota_return.lua, at most once per hold id).
//!
//! It also publishes each sale's settlement lag (entries not yet in
//! Postgres) as a gauge, once per interval.
//!
//! Reservations also reclaim expired holds on demand (reserve.lua and
//! take.lua), so selling resumes the moment a hold expires; the sweep keeps
//! the counts honest for sales nobody is hammering.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::reserve::engine::Engine;
use crate::sales::registry::SaleRegistry;
use crate::sales::sale::Sale;

/// Expired holds given back per shard per script call.
const BATCH: u32 = 200;

#[derive(serde::Deserialize)]
struct UnquotaNote {
    id: String,
    h: usize,
}

/// Sweeps one sale once; returns the units given back.
pub async fn sweep_sale(engine: &Engine, sale: &Sale) -> redis::RedisResult<i64> {
    let mut conn = engine.conn.clone();
    let mut units = 0;
    for (i, k) in sale.shards.iter().enumerate() {
        loop {
            let r: Vec<i64> = engine
                .scripts
                .sweep
                .key(k.all().as_slice())
                .arg(i)
                .arg(BATCH)
                .invoke_async(&mut conn)
                .await?;
            units += r.first().copied().unwrap_or(0);
            if r.get(1).copied().unwrap_or(0) == 0 {
                break;
            }
        }
        let notes: Vec<String> = conn.lrange(&k.unquota, 0, 199).await?;
        for raw in notes {
            if let Ok(note) = serde_json::from_str::<UnquotaNote>(&raw)
                && let Some(home) = sale.shards.get(note.h)
            {
                engine.give_back_quota(home, &note.id).await?;
            }
            // Only after the quota is back (or the note is unreadable, which
            // no script writes) is the note dropped: at-least-once, and
            // quota_return makes the repeat harmless.
            let _: i64 = conn.lrem(&k.unquota, 1, &raw).await?;
        }
    }
    Ok(units)
}

/// The per-sale figures a dashboard shows beside the request rates: units
/// still for sale in Redis (Σ over SKUs and shards) and the configured admission
/// rate. Best effort: a Redis error leaves the last value.
async fn publish_sale_gauges(engine: &Engine, sale: &Sale) {
    let id = sale.config.id.clone();
    metrics::gauge!("flashsale_admission_rate", "sale" => id.clone())
        .set(sale.config.admission_rate);
    metrics::gauge!("flashsale_units_total", "sale" => id.clone())
        .set(f64::from(sale.config.units_total));
    let Ok(stock) = crate::reserve::engine::SkuStock::read(&engine.conn, sale).await else {
        return;
    };
    let available: i64 = stock.available.iter().sum();
    metrics::gauge!("flashsale_units_available", "sale" => id).set(available as f64);
}

/// Runs the sweep until cancelled.
pub async fn run(
    engine: Arc<Engine>,
    sales: Arc<SaleRegistry>,
    interval: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut active: Vec<Arc<Sale>> = Vec::new();
    let mut listed = Instant::now() - Duration::from_secs(3600);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if listed.elapsed() >= Duration::from_secs(1) {
            match sales.active().await {
                Ok(list) => {
                    active = list;
                    listed = Instant::now();
                }
                Err(e) => tracing::warn!(error = %e, "sweep: cannot list sales"),
            }
        }
        for sale in &active {
            if let Ok(lag) = crate::settle::settler::lag(&engine, sale).await {
                metrics::gauge!("flashsale_settlement_lag", "sale" => sale.config.id.clone())
                    .set(lag as f64);
            }
            publish_sale_gauges(&engine, sale).await;
            match sweep_sale(&engine, sale).await {
                Ok(0) => {}
                Ok(units) => {
                    metrics::counter!("flashsale_expired_units_total").increment(units as u64);
                    sales.units_back(&sale.config.id, Instant::now());
                    tracing::info!(sale = %sale.config.id, units, "expired holds returned");
                }
                Err(e) => tracing::warn!(sale = %sale.config.id, error = %e, "sweep failed"),
            }
        }
    }
}
