//! The outbox relay: rows written to `outbox` in the same transaction as
//! the state change they announce are published at least once to a sink,
//! then marked sent.
//!
//! Sinks: the Redis stream (default) and Kafka (`run_kafka`, issue 46).
//!
//! Invariant: a row is marked sent only after its publish returned, in the
//! transaction that locked it (`FOR UPDATE SKIP LOCKED`, so two relays never
//! publish one row at once); a crash between the two publishes it again.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::events::batch;
use crate::events::kafka::KafkaSink;
use crate::events::sink::{OutboxEvent, Sink};
use crate::events::webhooks;
use crate::ops::configuration::KafkaSettings;

/// A round sends the rows it locked until they carry this many events: a
/// batch row (`events::batch`) carries up to a settlement batch's holds.
pub const MAX_EVENTS_PER_ROUND: usize = 2_000;

/// Publishes the events of up to `limit` unsent outbox rows (fewer when
/// they carry more than [`MAX_EVENTS_PER_ROUND`] events); returns how many
/// events. `die_after_publish` is a test hook: stop right after publishing,
/// before marking (a crash).
pub async fn relay_once<S: Sink>(
    pool: &PgPool,
    sink: &S,
    limit: i64,
    die_after_publish: bool,
) -> anyhow::Result<usize> {
    let mut tx = pool.begin().await?;
    let mut rows: Vec<OutboxEvent> = sqlx::query_as(
        "SELECT id, event_id, type, payload, created_at FROM outbox WHERE published_at IS NULL
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    // The rows past the cap stay unsent (their locks go with this
    // transaction) for the next round, which starts at once.
    let mut carried = 0;
    let keep = rows
        .iter()
        .take_while(|r| {
            let before = carried;
            carried += batch::events_in(r);
            before < MAX_EVENTS_PER_ROUND
        })
        .count();
    rows.truncate(keep);
    let ids: Vec<i64> = rows.iter().map(|e| e.id).collect();
    let facts = reservation_facts(&mut tx, &batch::references(&rows)).await?;
    let events = batch::expand(rows, &facts);
    sink.publish_batch(&events).await?;
    let acked = chrono::Utc::now();
    for e in &events {
        // Commit to acknowledged by the sink: what a consumer waits at best.
        let lag = (acked - e.created_at)
            .num_microseconds()
            .unwrap_or(0)
            .max(0);
        metrics::histogram!("flashsale_events_publish_lag_seconds").record(lag as f64 / 1e6);
    }
    if die_after_publish {
        return Ok(events.len());
    }
    // Queued with the mark, in one transaction: an event is published with
    // its deliveries or not at all.
    webhooks::store::queue_deliveries(&mut tx, &events).await?;
    sqlx::query("UPDATE outbox SET published_at = now() WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    if !events.is_empty() {
        metrics::counter!("flashsale_outbox_published_total").increment(events.len() as u64);
    }
    Ok(events.len())
}

/// What the reservation events of a round say, read from their rows.
async fn reservation_facts(
    tx: &mut sqlx::PgConnection,
    ids: &[String],
) -> Result<HashMap<String, batch::Facts>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let facts: Vec<batch::Facts> = sqlx::query_as(
        "SELECT r.id, r.sale_id AS sale, k.id AS sku, r.account, r.qty, r.created_at AS held_at,
                r.expires_at, r.release_reason AS reason
           FROM reservations r LEFT JOIN skus k ON k.sale_id = r.sale_id AND k.position = r.sku
          WHERE r.id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(&mut *tx)
    .await?;
    Ok(facts.into_iter().map(|f| (f.id.clone(), f)).collect())
}

/// Runs the relay until cancelled, then publishes what is left (a clean
/// shutdown leaves no event waiting for the next start).
pub async fn run<S: Sink>(pool: PgPool, sink: S, stop: CancellationToken) {
    let mut measured = std::time::Instant::now() - Duration::from_secs(60);
    loop {
        if measured.elapsed() >= Duration::from_secs(5) {
            measured = std::time::Instant::now();
            measure_backlog(&pool).await;
        }
        let pause = match relay_once(&pool, &sink, 100, false).await {
            // A full round (100 rows, or the events cap): more are waiting.
            Ok(n) if n >= 100 => Duration::ZERO,
            Ok(_) => Duration::from_millis(200),
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay failed; retrying");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    // The caller bounds this loop by its shutdown grace; a failure leaves
    // the rest in the outbox, where the next relay finds it.
    loop {
        match relay_once(&pool, &sink, 100, false).await {
            Ok(n) if n >= 100 => continue,
            Ok(n) => {
                tracing::info!(published = n, "outbox flushed");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "outbox flush failed; events stay for the next relay");
                return;
            }
        }
    }
}

/// `flashsale_outbox_pending` (rows not yet published) and
/// `flashsale_outbox_oldest_pending_seconds`: events that stop leaving (a
/// sink down) show here first (deploy/prometheus/alerts.yml).
async fn measure_backlog(pool: &PgPool) {
    let r: Result<(i64, Option<f64>), _> = sqlx::query_as(
        "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
           FROM outbox WHERE published_at IS NULL",
    )
    .fetch_one(pool)
    .await;
    if let Ok((n, age)) = r {
        metrics::gauge!("flashsale_outbox_pending").set(n as f64);
        metrics::gauge!("flashsale_outbox_oldest_pending_seconds").set(age.unwrap_or(0.0));
    }
}

/// The relay to Kafka (`EVENTS_SINK=kafka`): connects (again, backing off
/// up to 30 s, while the brokers cannot be reached: the origin serves
/// meanwhile and events wait in the outbox), then relays until cancelled.
pub async fn run_kafka(pool: PgPool, settings: KafkaSettings, stop: CancellationToken) {
    let mut pause = Duration::from_millis(500);
    let sink = loop {
        match KafkaSink::connect(&settings).await {
            Ok(sink) => break sink,
            Err(e) => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "Kafka unreachable; events wait in the outbox"
                );
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    };
    run(pool, sink, stop).await
}
