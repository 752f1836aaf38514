//! The outbox relay: rows written to `outbox` in the same transaction as
//! the state change they announce are published at least once to a sink,
//! then marked sent.
//!
//! Sinks: the Redis stream (default) and Kafka (`run_kafka`, issue 46).
//!
//! Invariant: a row is marked sent only after its publish returned, in the
//! transaction that locked it (`FOR UPDATE SKIP LOCKED`, so two relays never
//! publish one row at once); a crash between the two publishes it again.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::events::batch;
use crate::events::kafka::KafkaSink;
use crate::events::sink::{OutboxEvent, Sink};
use crate::events::wal::slot::WalSlot;
use crate::events::webhooks;
use crate::ops::configuration::{KafkaSettings, OutboxSource};

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
    let n = send(&mut tx, sink, rows, die_after_publish).await?;
    if die_after_publish {
        return Ok(n);
    }
    tx.commit().await?;
    Ok(n)
}

/// Publishes `rows`' events, then queues their webhook deliveries and
/// marks the rows sent in `tx` (which the caller commits: an event is
/// published with its deliveries or not at all). With
/// `die_after_publish`, stops after publishing (a crash).
async fn send<S: Sink>(
    tx: &mut sqlx::PgConnection,
    sink: &S,
    rows: Vec<OutboxEvent>,
    die_after_publish: bool,
) -> anyhow::Result<usize> {
    let ids: Vec<i64> = rows.iter().map(|e| e.id).collect();
    let events = events_of(&mut *tx, rows).await?;
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
    webhooks::store::queue_deliveries(&mut *tx, &events).await?;
    sqlx::query("UPDATE outbox SET published_at = now() WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    if !events.is_empty() {
        metrics::counter!("flashsale_outbox_published_total").increment(events.len() as u64);
    }
    Ok(events.len())
}

/// Rows a WAL round reads: whole transactions until about this many
/// messages (a settlement batch is a few rows, however many holds).
pub const WAL_CHANGES_PER_ROUND: i32 = 200;

/// `OUTBOX_SOURCE=wal`: publishes the outbox rows the slot holds past its
/// confirmed position, marks them (and queues their deliveries) as the
/// table relay does, then moves the slot past them; returns how many
/// events. One relay reads a slot at a time (a session advisory lock; the
/// others find it taken and wait for the next round). A row found already
/// marked was published by a relay that stopped before moving the slot,
/// and is not sent again; a relay that stops before marking sends its
/// rows again (same event ids). `die_after_publish` as in [`relay_once`].
pub async fn relay_wal_once<S: Sink>(
    pool: &PgPool,
    sink: &S,
    slot: &WalSlot,
    die_after_publish: bool,
) -> anyhow::Result<WalRound> {
    let mut conn = pool.acquire().await?;
    let lock = format!("flashsale outbox slot {}", slot.name);
    let (mine,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock(hashtext($1))")
        .bind(&lock)
        .fetch_one(&mut *conn)
        .await?;
    if !mine {
        return Ok(WalRound::default());
    }
    let sent = wal_round(&mut conn, sink, slot, die_after_publish).await;
    let unlocked = sqlx::query("SELECT pg_advisory_unlock(hashtext($1))")
        .bind(&lock)
        .execute(&mut *conn)
        .await;
    if unlocked.is_err() || die_after_publish {
        // A session that may still hold the lock must not go back to the pool.
        drop(conn.detach());
    }
    sent
}

/// What a WAL round did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WalRound {
    /// Events published.
    pub events: usize,
    /// The read was full: more may be waiting.
    pub full: bool,
}

async fn wal_round<S: Sink>(
    conn: &mut sqlx::PgConnection,
    sink: &S,
    slot: &WalSlot,
    die_after_publish: bool,
) -> anyhow::Result<WalRound> {
    let changes = slot.peek(&mut *conn, WAL_CHANGES_PER_ROUND).await?;
    let full = changes.messages >= WAL_CHANGES_PER_ROUND as usize;
    let Some(through) = changes.through else {
        return Ok(WalRound::default());
    };
    let ids: Vec<i64> = changes.rows.iter().map(|r| r.id).collect();
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let unsent: HashSet<i64> = sqlx::query_scalar(
        "SELECT id FROM outbox WHERE id = ANY($1) AND published_at IS NULL FOR UPDATE",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    let rows: Vec<OutboxEvent> = changes
        .rows
        .into_iter()
        .filter(|r| unsent.contains(&r.id))
        .collect();
    let events = send(&mut tx, sink, rows, die_after_publish).await?;
    if die_after_publish {
        return Ok(WalRound { events, full });
    }
    tx.commit().await?;
    slot.advance(&mut *conn, &through).await?;
    Ok(WalRound { events, full })
}

/// The events `rows` carry, as the relay publishes them: a batch row's
/// reservation events read from the reservations it names
/// (`events::batch`). Also what an auditor expects on the sink (the chaos
/// checker).
pub async fn events_of(
    conn: &mut sqlx::PgConnection,
    rows: Vec<OutboxEvent>,
) -> Result<Vec<OutboxEvent>, sqlx::Error> {
    let facts = reservation_facts(&mut *conn, &batch::references(&rows)).await?;
    Ok(batch::expand(rows, &facts))
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

/// One round from `source`: how many events it published, and whether
/// more are waiting (a full round: the next starts at once).
/// With `die_after_publish` it stops after the sink acknowledged, before
/// marking (see [`relay_once`]).
async fn round<S: Sink>(
    pool: &PgPool,
    sink: &S,
    source: &OutboxSource,
    die_after_publish: bool,
) -> anyhow::Result<(usize, bool)> {
    match source {
        OutboxSource::Table => {
            let n = relay_once(pool, sink, 100, die_after_publish).await?;
            // 100 rows, or the events cap.
            Ok((n, n >= 100))
        }
        OutboxSource::Wal { slot } => {
            let slot = WalSlot { name: slot.clone() };
            let r = relay_wal_once(pool, sink, &slot, die_after_publish).await?;
            Ok((r.events, r.full))
        }
    }
}

/// How a running relay works (`relay::run`).
#[derive(Debug, Clone, Default)]
pub struct RelayOptions {
    /// Where it finds new outbox rows.
    pub source: OutboxSource,
    /// A fault for `scripts/chaos` (`FAULT_RELAY_ABORT_AFTER_ACK`): the
    /// process aborts right after the sink acknowledged the `n`th round
    /// that carried events, before the rows are marked: a crash at the
    /// one moment at-least-once exists for. `None` in production.
    pub abort_after_ack: Option<u64>,
}

/// Runs the relay until cancelled, then publishes what is left (a clean
/// shutdown leaves no event waiting for the next start).
pub async fn run<S: Sink>(pool: PgPool, sink: S, options: RelayOptions, stop: CancellationToken) {
    let source = &options.source;
    let mut measured = std::time::Instant::now() - Duration::from_secs(60);
    // Rounds with events before the fault, if one is asked for.
    let mut fault_in = options.abort_after_ack;
    loop {
        if measured.elapsed() >= Duration::from_secs(5) {
            measured = std::time::Instant::now();
            measure_backlog(&pool, source).await;
        }
        let die = fault_in == Some(1);
        let result = round(&pool, &sink, source, die).await;
        if let (Ok((n, _)), Some(left)) = (&result, fault_in.as_mut())
            && *n > 0
        {
            if die {
                tracing::error!(
                    events = n,
                    "FAULT_RELAY_ABORT_AFTER_ACK: aborting after the sink's ack, before the mark"
                );
                std::process::abort();
            }
            *left -= 1;
        }
        let pause = match result {
            Ok((_, true)) => Duration::ZERO,
            Ok(_) => Duration::from_millis(200),
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "outbox relay failed; retrying");
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
    match flush(&pool, &sink, source).await {
        Ok(n) => tracing::info!(published = n, "outbox flushed"),
        Err(e) => tracing::warn!(
            error = format!("{e:#}"),
            "outbox flush failed; events stay for the next relay"
        ),
    }
}

/// Publishes every row waiting (from `source`) until a round finds none
/// full; returns how many events. What a relay does at shutdown, for a
/// process that changed state without running one (the chaos checker,
/// after `origin reconcile --once`).
pub async fn flush<S: Sink>(
    pool: &PgPool,
    sink: &S,
    source: &OutboxSource,
) -> anyhow::Result<usize> {
    let mut total = 0;
    loop {
        let (n, full) = round(pool, sink, source, false).await?;
        total += n;
        if !full {
            return Ok(total);
        }
    }
}

/// `flashsale_outbox_pending` (rows not yet published) and
/// `flashsale_outbox_oldest_pending_seconds`: events that stop leaving (a
/// sink down) show here first (deploy/prometheus/alerts.yml).
async fn measure_backlog(pool: &PgPool, source: &OutboxSource) {
    if let OutboxSource::Wal { slot } = source
        && let Ok(Some(lag)) = (WalSlot { name: slot.clone() }).lag_bytes(pool).await
    {
        metrics::gauge!("flashsale_outbox_slot_lag_bytes").set(lag);
    }
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
pub async fn run_kafka(
    pool: PgPool,
    settings: KafkaSettings,
    options: RelayOptions,
    stop: CancellationToken,
) {
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
    run(pool, sink, options, stop).await
}
