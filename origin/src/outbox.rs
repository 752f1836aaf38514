//! The outbox relay and its consumers' dedupe.
//!
//! Rows written to `outbox` in the same transaction as the state change
//! they announce are published at least once to a sink (by default the Redis
//! stream `<prefix>:events`): the relay publishes, then marks the row sent.
//! A crash between the two publishes the row again, so every consumer
//! records the event ids it processed (`processed_messages`) and skips
//! repeats — exactly-once effects on at-least-once delivery.

use std::time::Duration;

use redis::AsyncCommands;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::reserve::store::RedisConn;

/// One outbox event.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxEvent {
    pub id: i64,
    pub event_id: String,
    #[sqlx(rename = "type")]
    pub kind: String,
    pub payload: serde_json::Value,
}

/// Where events go. Pluggable: a shop may publish to its own bus instead.
pub trait Sink: Send + Sync {
    fn publish(&self, event: &OutboxEvent) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// The events stream keeps about this many entries (trimmed as it grows):
/// a consumer must not fall further behind than that. The outbox table
/// keeps every event for a republish (docs/operations.md).
pub const EVENTS_MAXLEN: usize = 1_000_000;

/// Publishes to a Redis stream, trimmed to about [`EVENTS_MAXLEN`] entries.
#[derive(Clone)]
pub struct RedisStreamSink {
    pub conn: RedisConn,
    pub stream: String,
}

impl RedisStreamSink {
    pub fn new(conn: RedisConn, prefix: &str) -> Self {
        RedisStreamSink {
            conn,
            stream: format!("{prefix}:events"),
        }
    }
}

impl Sink for RedisStreamSink {
    async fn publish(&self, event: &OutboxEvent) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        let _: String = conn
            .xadd_maxlen(
                &self.stream,
                redis::streams::StreamMaxlen::Approx(EVENTS_MAXLEN),
                "*",
                &[
                    ("event_id", event.event_id.as_str()),
                    ("type", event.kind.as_str()),
                    ("payload", &event.payload.to_string()),
                ],
            )
            .await?;
        Ok(())
    }
}

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
        "SELECT id, event_id, type, payload FROM outbox WHERE published_at IS NULL
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    for e in &events {
        sink.publish(e).await?;
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

/// A consumer's side: processes each event of the Redis events stream once,
/// however often it was published. Returns the events it processed (new
/// ones only); `handle` is called inside the transaction that records the id.
pub async fn consume_once(
    pool: &PgPool,
    conn: &mut RedisConn,
    stream: &str,
    consumer: &str,
    mut handle: impl FnMut(&str, &str),
) -> anyhow::Result<usize> {
    let entries: redis::streams::StreamRangeReply = conn.xrange_all(stream).await?;
    let mut processed = 0;
    for e in entries.ids {
        let Some(event_id) = e.get::<String>("event_id") else {
            continue;
        };
        let kind = e.get::<String>("type").unwrap_or_default();
        let mut tx = pool.begin().await?;
        let new = sqlx::query(
            "INSERT INTO processed_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(&event_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if new {
            handle(&event_id, &kind);
            processed += 1;
        }
        tx.commit().await?;
    }
    Ok(processed)
}
