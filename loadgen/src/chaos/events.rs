//! The events half of the chaos check (issue 46): what the outbox holds
//! against what reached the sink (the Redis stream or the Kafka topic the
//! row's origin published to) and, when the row ran a webhook receiver,
//! what that receiver verified.
//!
//! [`observe`] reads (after a last pass of the product's relay, for what
//! `origin reconcile --once` released with the origin stopped); [`check`]
//! is a pure function of what was read, tested with known defects.
//! Repeats are counted, never failed: delivery is at least once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::Context;
use origin::events::relay;
use origin::events::sink::{OutboxEvent, RedisStreamSink};
use origin::ops::configuration::{EventsSink, KafkaSettings};
use origin::ops::state::AppState;
use rskafka::client::ClientBuilder;
use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
use serde::Serialize;

use crate::chaos::row::Figures;

/// One event the outbox holds: its id and the reservation it is about.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Expected {
    pub id: String,
    pub reservation: Option<String>,
}

/// What the events came to at the end of a row.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EventsEnd {
    /// Every event the outbox holds, in the order the relay sends them.
    pub expected: Vec<Expected>,
    /// The ids on the sink, in its order (per partition for Kafka),
    /// repeats included.
    pub on_sink: Vec<String>,
    /// Outbox rows not marked published.
    pub unpublished: i64,
    /// With a webhook receiver: what it should have had and got.
    pub webhook: Option<WebhookEnd>,
}

/// The webhook receiver's side.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WebhookEnd {
    /// The events published while the origin ran (their deliveries were
    /// queued then): the ones the receiver must have.
    pub expected: Vec<Expected>,
    /// `(event id, reservation)` of each delivery it verified, in the
    /// order it got them.
    pub received: Vec<(String, Option<String>)>,
    /// Deliveries the product still has pending or dead.
    pub undelivered: i64,
}

/// Reads the events side: publishes what waits in the outbox (from the
/// configured source, to the configured sink), then reads the outbox, the
/// sink and, given its log, the webhook receiver.
pub async fn observe(state: &AppState, webhook_log: Option<&Path>) -> anyhow::Result<EventsEnd> {
    let pool = &state.pool;
    let settings = &state.settings;
    // Published before this pass: the deliveries the origin itself queued
    // (nothing delivers what this pass queues).
    let published_before: BTreeSet<i64> =
        sqlx::query_scalar("SELECT id FROM outbox WHERE published_at IS NOT NULL")
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
    let on_sink = match &settings.events {
        EventsSink::RedisStream => {
            let stream = format!("{}:events", settings.key_prefix);
            let sink = RedisStreamSink {
                conn: state.engine.conn.clone(),
                stream: stream.clone(),
                acker: None,
            };
            relay::flush(pool, &sink, &settings.outbox_source).await?;
            stream_ids(state, &stream).await?
        }
        EventsSink::Kafka(kafka) => {
            let sink = origin::events::kafka::KafkaSink::connect(kafka).await?;
            relay::flush(pool, &sink, &settings.outbox_source).await?;
            topic_ids(kafka).await?
        }
    };
    let rows: Vec<OutboxEvent> =
        sqlx::query_as("SELECT id, event_id, type, payload, created_at FROM outbox ORDER BY id")
            .fetch_all(pool)
            .await?;
    let before: Vec<OutboxEvent> = rows
        .iter()
        .filter(|r| published_before.contains(&r.id))
        .cloned()
        .collect();
    let mut db = pool.acquire().await?;
    let expected = expected_of(relay::events_of(&mut db, rows).await?);
    let unpublished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(pool)
            .await?;
    let webhook = match webhook_log {
        None => None,
        Some(path) => {
            let undelivered: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered'",
            )
            .fetch_one(pool)
            .await?;
            Some(WebhookEnd {
                expected: expected_of(relay::events_of(&mut db, before).await?),
                received: received(path)?,
                undelivered,
            })
        }
    };
    Ok(EventsEnd {
        expected,
        on_sink,
        unpublished,
        webhook,
    })
}

fn expected_of(events: Vec<OutboxEvent>) -> Vec<Expected> {
    events
        .into_iter()
        .map(|e| Expected {
            reservation: e.payload["reservation_id"].as_str().map(String::from),
            id: e.event_id,
        })
        .collect()
}

/// The event ids on the Redis stream, in order.
async fn stream_ids(state: &AppState, stream: &str) -> anyhow::Result<Vec<String>> {
    use redis::AsyncCommands;
    let mut conn = state.engine.conn.clone();
    let mut ids = Vec::new();
    let mut after = "-".to_string();
    loop {
        let page: redis::streams::StreamRangeReply =
            conn.xrange_count(stream, &after, "+", 10_000).await?;
        let Some(last) = page.ids.last().map(|e| e.id.clone()) else {
            return Ok(ids);
        };
        for e in &page.ids {
            ids.push(e.get::<String>("event_id").unwrap_or_default());
        }
        after = format!("({last}");
    }
}

/// The `event_id` header of every record on the topic, partition by
/// partition, each in its order.
async fn topic_ids(kafka: &KafkaSettings) -> anyhow::Result<Vec<String>> {
    let client = ClientBuilder::new(kafka.brokers.clone())
        .build()
        .await
        .context("the Kafka brokers")?;
    let partitions = client
        .list_topics()
        .await?
        .into_iter()
        .find(|t| t.name == kafka.topic)
        .map_or(0, |t| t.partitions.len() as i32);
    let mut ids = Vec::new();
    for p in 0..partitions {
        let pc = client
            .partition_client(kafka.topic.clone(), p, UnknownTopicHandling::Retry)
            .await?;
        let end = pc.get_offset(OffsetAt::Latest).await?;
        let mut offset = pc.get_offset(OffsetAt::Earliest).await?;
        while offset < end {
            let (records, _) = pc.fetch_records(offset, 1..4_000_000, 1_000).await?;
            let Some(last) = records.last().map(|r| r.offset) else {
                anyhow::bail!("partition {p}: no record at offset {offset} of {end}");
            };
            for r in records {
                let id = r
                    .record
                    .headers
                    .get("event_id")
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                ids.push(id);
            }
            offset = last + 1;
        }
    }
    Ok(ids)
}

/// The deliveries the receiver verified (`docs/examples/webhook_receiver.py`
/// prints one JSON line each; rejected ones carry `rejected`).
fn received(path: &Path) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("rejected").is_none())
        .filter_map(|v| {
            Some((
                v["id"].as_str()?.to_string(),
                v["reservation_id"].as_str().map(String::from),
            ))
        })
        .collect())
}

/// The events figures: every expected event on the sink, every row
/// published, nothing on the sink unexplained; with a receiver, every
/// event it should have had verified there, none left undelivered, and
/// one reservation's events first received in the outbox's order.
pub fn check(ev: &EventsEnd, f: &mut Figures) {
    let expected: BTreeSet<&str> = ev.expected.iter().map(|e| e.id.as_str()).collect();
    let mut seen: BTreeMap<&str, i64> = BTreeMap::new();
    for id in &ev.on_sink {
        *seen.entry(id.as_str()).or_default() += 1;
    }
    f.events = expected.len() as i64;
    for id in &expected {
        if !seen.contains_key(id) {
            f.events_lost
                .add(1, || format!("{id}: in the outbox, never on the sink"));
        }
    }
    for (id, n) in &seen {
        if !expected.contains(id) {
            f.events_lost
                .add(1, || format!("{id}: on the sink, in no outbox row"));
        }
        f.events_repeated += n - 1;
    }
    f.events_lost.add(ev.unpublished, || {
        format!("{} outbox rows never marked published", ev.unpublished)
    });
    let Some(w) = &ev.webhook else {
        return;
    };
    let got: BTreeSet<&str> = w.received.iter().map(|(id, _)| id.as_str()).collect();
    for e in &w.expected {
        if !got.contains(e.id.as_str()) {
            f.events_lost.add(1, || {
                format!("{}: never reached the webhook receiver", e.id)
            });
        }
    }
    f.events_lost.add(w.undelivered, || {
        format!("{} webhook deliveries pending or dead", w.undelivered)
    });
    // One reservation's events, in the order first received, must be in
    // the order the outbox has them.
    let rank: HashMap<&str, usize> = w
        .expected
        .iter()
        .enumerate()
        .map(|(i, e)| (e.id.as_str(), i))
        .collect();
    let mut first = BTreeSet::new();
    let mut last_of: HashMap<&str, (usize, &str)> = HashMap::new();
    for (id, reservation) in &w.received {
        let (Some(reservation), Some(&r)) = (reservation, rank.get(id.as_str())) else {
            continue;
        };
        if !first.insert(id.as_str()) {
            continue; // a repeat: at least once
        }
        if let Some((before, before_id)) = last_of.get(reservation.as_str())
            && *before > r
        {
            f.events_misordered.add(1, || {
                format!("{reservation}: {id} received after {before_id}, which comes after it")
            });
        }
        last_of.insert(reservation.as_str(), (r, id.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(ids: &[(&str, &str)]) -> Vec<Expected> {
        ids.iter()
            .map(|(id, r)| Expected {
                id: id.to_string(),
                reservation: Some(r.to_string()),
            })
            .collect()
    }

    fn end(expected: &[&str], on_sink: &[&str], unpublished: i64) -> EventsEnd {
        EventsEnd {
            expected: expected
                .iter()
                .map(|id| Expected {
                    id: id.to_string(),
                    reservation: None,
                })
                .collect(),
            on_sink: on_sink.iter().map(|s| s.to_string()).collect(),
            unpublished,
            webhook: None,
        }
    }

    fn figures(ev: &EventsEnd) -> Figures {
        let mut f = Figures::default();
        check(ev, &mut f);
        f
    }

    #[test]
    fn lost_unpublished_or_unexplained_events_count_and_repeats_do_not() {
        let f = figures(&end(&["a", "b"], &["a", "b", "a"], 0));
        assert_eq!(
            (f.events_lost.count, f.events, f.events_repeated),
            (0, 2, 1)
        );
        assert!(!f.broken(), "{f:#?}");
        let f = figures(&end(&["a", "b"], &["a"], 0));
        assert_eq!(f.events_lost.count, 1);
        assert!(f.events_lost.examples[0].starts_with("b: in the outbox"));
        assert!(f.broken());
        let f = figures(&end(&["a"], &["a", "z"], 0));
        assert_eq!(f.events_lost.count, 1);
        assert!(f.events_lost.examples[0].starts_with("z: on the sink"));
        let f = figures(&end(&["a"], &["a"], 3));
        assert_eq!(f.events_lost.count, 3);
    }

    #[test]
    fn the_receiver_must_have_every_event_once_at_least_in_each_reservations_order() {
        let expected = exp(&[("r1.held", "r1"), ("r2.held", "r2"), ("r1.expired", "r1")]);
        let with = |received: &[(&str, &str)], undelivered: i64| EventsEnd {
            webhook: Some(WebhookEnd {
                expected: expected.clone(),
                received: received
                    .iter()
                    .map(|(id, r)| (id.to_string(), Some(r.to_string())))
                    .collect(),
                undelivered,
            }),
            ..end(&[], &[], 0)
        };
        // Another reservation's events may come between; repeats are fine.
        let f = figures(&with(
            &[
                ("r2.held", "r2"),
                ("r1.held", "r1"),
                ("r1.held", "r1"),
                ("r1.expired", "r1"),
            ],
            0,
        ));
        assert!(!f.broken(), "{f:#?}");
        let f = figures(&with(
            &[("r1.expired", "r1"), ("r1.held", "r1"), ("r2.held", "r2")],
            0,
        ));
        assert_eq!(f.events_misordered.count, 1, "{f:#?}");
        assert!(f.broken());
        let f = figures(&with(&[("r1.held", "r1"), ("r1.expired", "r1")], 2));
        assert_eq!(
            f.events_lost.count, 3,
            "r2.held missing and 2 undelivered: {f:#?}"
        );
    }
}
