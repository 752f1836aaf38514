//! `loadgen bench-relay` (issue 46, `scripts/bench-events`): the outbox
//! relay to Kafka against a plain producer of the same messages to the same
//! broker, in one run.
//!
//! - **relay**: `events` outbox rows (the shape `order.paid` has) are
//!   written at once, then the product's relay (`relay_once`, 100 rows a
//!   round, as `relay::run` does) publishes them with the product's Kafka
//!   sink and marks them, until none is left;
//! - **plain producer**: the same messages (the very records, read from the
//!   same rows: key, headers, envelope) produced with rskafka straight to a
//!   topic of the same partitions, 100 at a time, grouped per partition, the
//!   partitions in parallel: the relay's produce pattern without Postgres.
//!
//! The ratio relay ÷ producer is the figure (target ≥ 0.5); the two are
//! measured in alternation (producer, relay, producer) to see the moment.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::future::try_join_all;
use origin::events::envelope::envelope;
use origin::events::kafka::{KafkaSink, partition_for};
use origin::events::relay::relay_once;
use origin::events::sink::OutboxEvent;
use origin::ops::configuration::KafkaSettings;
use rskafka::client::ClientBuilder;
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::record::Record;
use serde_json::json;

#[derive(Args)]
pub struct BenchRelayArgs {
    /// A migrated database of the product (its outbox is used).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The broker, host:port.
    #[arg(long)]
    brokers: String,
    /// Events in each measured run.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Partitions of the topics the bench creates.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
}

const BATCH: usize = 100;

/// Writes `n` unpublished outbox rows shaped like `order.paid` over 20 SKUs
/// of one sale; returns them as the relay will read them.
async fn write_rows(pool: &sqlx::PgPool, run: &str, n: usize) -> anyhow::Result<Vec<OutboxEvent>> {
    sqlx::query(
        "INSERT INTO outbox (event_id, type, payload)
         SELECT $1 || '-' || i, 'order.paid', jsonb_build_object(
                  'reservation_id', 'r_' || md5(i::text), 'payment_id', 'pay_' || md5(i::text),
                  'sale', 'bench-drop', 'sku', 'sku-' || lpad((i % 20)::text, 2, '0'),
                  'account', 'acct-' || i, 'amount_cents', 12900, 'qty', 1)
           FROM generate_series(1, $2) AS i",
    )
    .bind(run)
    .bind(n as i64)
    .execute(pool)
    .await?;
    Ok(sqlx::query_as(
        "SELECT id, event_id, type, payload, created_at FROM outbox
          WHERE event_id LIKE $1 || '-%' ORDER BY id",
    )
    .bind(run)
    .fetch_all(pool)
    .await?)
}

fn settings(a: &BenchRelayArgs, topic: &str) -> KafkaSettings {
    KafkaSettings {
        brokers: vec![a.brokers.clone()],
        topic: topic.into(),
        partitions: a.partitions,
        replication: 1,
        client_id: "flashsale-bench".into(),
        timeout: Duration::from_secs(30),
    }
}

/// The plain producer: `events`' records, 100 at a time; events/s.
async fn plain_producer(
    a: &BenchRelayArgs,
    topic: &str,
    events: &[OutboxEvent],
) -> anyhow::Result<f64> {
    // The topic exists with the same partitions (created the relay's way).
    let n = KafkaSink::connect(&settings(a, topic))
        .await?
        .partition_count();
    let client = ClientBuilder::new(vec![a.brokers.clone()]).build().await?;
    let mut partitions = Vec::new();
    for p in 0..n {
        partitions.push(
            client
                .partition_client(topic, p, UnknownTopicHandling::Retry)
                .await?,
        );
    }
    let t0 = Instant::now();
    for chunk in events.chunks(BATCH) {
        let mut by: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        for e in chunk {
            let env = envelope(e);
            by.entry(partition_for(env.key.as_bytes(), n))
                .or_default()
                .push(KafkaSink::record(&env)?);
        }
        try_join_all(by.into_iter().map(|(p, records)| {
            let pc = &partitions[p as usize];
            async move { pc.produce(records, Compression::NoCompression).await }
        }))
        .await?;
    }
    Ok(events.len() as f64 / t0.elapsed().as_secs_f64())
}

/// The product's relay over `events` fresh rows; events/s.
async fn relay(
    a: &BenchRelayArgs,
    pool: &sqlx::PgPool,
    topic: &str,
    run: &str,
) -> anyhow::Result<f64> {
    let sink = KafkaSink::connect(&settings(a, topic)).await?;
    write_rows(pool, run, a.events).await?;
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < a.events {
        let n = relay_once(pool, &sink, BATCH as i64, false).await?;
        anyhow::ensure!(n > 0, "the relay stopped at {sent} of {}", a.events);
        sent += n;
    }
    Ok(sent as f64 / t0.elapsed().as_secs_f64())
}

pub async fn bench_relay(a: BenchRelayArgs) -> anyhow::Result<()> {
    crate::loopback::ensure_loopback(&format!("http://{}", a.brokers))?;
    let pool = sqlx::PgPool::connect(&a.database_url)
        .await
        .context("DATABASE_URL")?;
    let run = format!(
        "evt_bench_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    // Nothing else may be waiting: the relay takes the oldest rows first.
    sqlx::query("UPDATE outbox SET published_at = now() WHERE published_at IS NULL")
        .execute(&pool)
        .await?;
    let template = write_rows(&pool, &format!("{run}-p"), a.events).await?;
    sqlx::query("UPDATE outbox SET published_at = now() WHERE published_at IS NULL")
        .execute(&pool)
        .await?;
    let p1 = plain_producer(&a, &format!("{run}.producer"), &template).await?;
    let r = relay(&a, &pool, &format!("{run}.relay"), &format!("{run}-r")).await?;
    let p2 = plain_producer(&a, &format!("{run}.producer2"), &template).await?;
    let producer = (p1 + p2) / 2.0;
    println!(
        "{}",
        json!({
            "events": a.events,
            "batch": BATCH,
            "partitions": a.partitions,
            "producer_per_s": [p1.round(), p2.round()],
            "relay_per_s": r.round(),
            "relay_over_producer": (r / producer * 100.0).round() / 100.0,
        })
    );
    Ok(())
}
