//! The outbox relay: rows written to `outbox` in the same transaction as
//! the state change they announce are published at least once to a sink,
//! then marked sent.
//!
//! Sinks: the Redis stream (default) and Kafka (`run_kafka`, issue 46).
//!
//! Invariant: a row is marked sent only after its publish returned, in the
//! transaction that locked it (`FOR UPDATE SKIP LOCKED`, so two relays never
//! publish one row at once); a crash between the two publishes it again.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::events::kafka::KafkaSink;
use crate::events::sink::{OutboxEvent, Sink};
use crate::ops::configuration::KafkaSettings;

/// Publishes up to `limit` unsent events; returns how many. `die_after_publish`
/// is a test hook: stop right after publishing, before marking (a crash).
pub async fn relay_once<S: Sink>(
    pool: &PgPool,
    sink: &S,
    limit: i64,
    die_after_publish: bool,
) -> anyhow::Result<usize> {
    let mut tx = pool.begin().await?;
    let events: Vec<OutboxEvent> = sqlx::query_as(
        "SELECT id, event_id, type, payload, created_at FROM outbox WHERE published_at IS NULL
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
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
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
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

/// Runs the relay until cancelled, then publishes what is left (a clean
/// shutdown leaves no event waiting for the next start).
pub async fn run<S: Sink>(pool: PgPool, sink: S, stop: CancellationToken) {
    loop {
        let pause = match relay_once(&pool, &sink, 100, false).await {
            Ok(100) => Duration::ZERO,
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
            Ok(100) => continue,
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
