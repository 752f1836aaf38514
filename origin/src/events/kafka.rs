//! The Kafka sink of the outbox relay (issue 46, `EVENTS_SINK=kafka`,
//! docs/events.md): every outbox event becomes one record on the topic
//! (`KAFKA_TOPIC`, default `flashsale.events`), created by the relay when it
//! is missing.
//!
//! - **Key** `<sale>/<sku>` (or `<sale>` for an event without a SKU),
//!   partitioned as Kafka's own clients do (murmur2 of the key, positive,
//!   modulo the partitions): one SKU's events stay in one partition, in the
//!   order the outbox wrote them, and a shop's consumer or Kafka Streams job
//!   keyed the same way is co-partitioned with the topic.
//! - **Headers** `event_id` and `event_type`; **value** the envelope of
//!   [`crate::events::envelope`] (JSON with `version`).
//! - **Acknowledged**: the client asks for `acks=all` (rskafka's produce
//!   always does) and a batch returns only when every partition's broker
//!   acknowledged it; the relay marks rows published only after that.
//!
//! Invariant kept here: a record is produced to the partition of its key
//! and a batch is reported sent only when every record of it was
//! acknowledged. Not kept here: exactly-once on the topic. rskafka has no
//! idempotent producer, so a produce retried after a lost answer, or a relay
//! that dies between the broker's ack and its `UPDATE`, writes the event
//! again with the same `event_id` header; consumers dedupe by it
//! (`crate::events::consume`, docs/events.md).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use futures::future::try_join_all;
use rskafka::BackoffConfig;
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;

use crate::events::envelope::{Envelope, envelope};
use crate::events::sink::{OutboxEvent, Sink};
use crate::ops::configuration::KafkaSettings;

/// Kafka's default partitioner for a keyed record: `toPositive(murmur2(key))
/// % partitions`, with the seed Kafka's clients use.
pub fn partition_for(key: &[u8], partitions: i32) -> i32 {
    let hash = murmur2::murmur2(key, murmur2::KAFKA_SEED) as i32;
    (hash & 0x7fff_ffff) % partitions.max(1)
}

/// Produces outbox events to one topic.
pub struct KafkaSink {
    topic: String,
    partitions: Vec<PartitionClient>,
    timeout: Duration,
}

impl KafkaSink {
    /// Connects, creates the topic when it is missing, and opens a client
    /// per partition.
    pub async fn connect(settings: &KafkaSettings) -> anyhow::Result<Self> {
        let client = ClientBuilder::new(settings.brokers.clone())
            .client_id(settings.client_id.clone())
            .backoff_config(BackoffConfig {
                deadline: Some(settings.timeout),
                ..BackoffConfig::default()
            })
            .build()
            .await
            .with_context(|| format!("Kafka brokers {}", settings.brokers.join(",")))?;
        let count = ensure_topic(&client, settings).await?;
        let mut partitions = Vec::with_capacity(count as usize);
        for p in 0..count {
            partitions.push(
                client
                    .partition_client(settings.topic.clone(), p, UnknownTopicHandling::Retry)
                    .await
                    .with_context(|| format!("partition {p} of {}", settings.topic))?,
            );
        }
        tracing::info!(topic = %settings.topic, partitions = count, "Kafka sink ready");
        Ok(KafkaSink {
            topic: settings.topic.clone(),
            partitions,
            timeout: settings.timeout,
        })
    }

    /// The topic's partition count, as the sink partitions keys over it.
    pub fn partition_count(&self) -> i32 {
        self.partitions.len() as i32
    }

    /// The Kafka record of one event: key, headers `event_id` and
    /// `event_type`, the envelope as value, committed-at as timestamp.
    pub fn record(e: &Envelope) -> anyhow::Result<Record> {
        Ok(Record {
            key: Some(e.key.clone().into_bytes()),
            value: Some(serde_json::to_vec(&e.value)?),
            headers: BTreeMap::from([
                ("event_id".to_string(), e.event_id.clone().into_bytes()),
                ("event_type".to_string(), e.event_type.clone().into_bytes()),
            ]),
            timestamp: e.occurred_at,
        })
    }
}

/// The topic's partition count; creates the topic first when it is missing
/// (another relay creating it at the same moment is not an error).
async fn ensure_topic(client: &Client, s: &KafkaSettings) -> anyhow::Result<i32> {
    let find = || async {
        anyhow::Ok(
            client
                .list_topics()
                .await?
                .into_iter()
                .find(|t| t.name == s.topic)
                .map(|t| t.partitions.len() as i32)
                .filter(|n| *n > 0),
        )
    };
    if let Some(n) = find().await? {
        return Ok(n);
    }
    let created = client
        .controller_client()?
        .create_topic(
            s.topic.clone(),
            s.partitions,
            s.replication,
            s.timeout.as_millis() as i32,
        )
        .await;
    match created {
        Ok(()) => {
            tracing::info!(topic = %s.topic, partitions = s.partitions, "created the events topic")
        }
        Err(rskafka::client::error::Error::ServerError {
            protocol_error: rskafka::client::error::ProtocolError::TopicAlreadyExists,
            ..
        }) => {}
        Err(e) => return Err(e).with_context(|| format!("creating topic {}", s.topic)),
    }
    let deadline = tokio::time::Instant::now() + s.timeout;
    loop {
        if let Some(n) = find().await? {
            return Ok(n);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "topic {} not listed by the brokers after creating it",
            s.topic
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Sink for KafkaSink {
    async fn publish(&self, event: &OutboxEvent) -> anyhow::Result<()> {
        self.publish_batch(std::slice::from_ref(event)).await
    }

    /// One produce request per partition, all at once; each partition's
    /// records in outbox order. Returns when every one was acknowledged.
    async fn publish_batch(&self, events: &[OutboxEvent]) -> anyhow::Result<()> {
        let n = self.partition_count();
        let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        for event in events {
            let e = envelope(event);
            by_partition
                .entry(partition_for(e.key.as_bytes(), n))
                .or_default()
                .push(Self::record(&e)?);
        }
        let produce = by_partition.into_iter().map(|(p, records)| async move {
            let count = records.len();
            let offsets = tokio::time::timeout(
                self.timeout,
                self.partitions[p as usize].produce(records, Compression::NoCompression),
            )
            .await
            .with_context(|| format!("produce to {}/{p} timed out", self.topic))?
            .with_context(|| format!("produce to {}/{p}", self.topic))?;
            anyhow::ensure!(
                offsets.len() == count,
                "{}/{p} acknowledged {} of {count} records",
                self.topic,
                offsets.len()
            );
            Ok(())
        });
        try_join_all(produce).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_go_where_kafkas_own_partitioner_puts_them() {
        // Kafka's Utils.murmur2 test vectors (UtilsTest#testMurmur2).
        for (key, expected) in [
            ("21", -973_932_308i32),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
        ] {
            assert_eq!(
                murmur2::murmur2(key.as_bytes(), murmur2::KAFKA_SEED) as i32,
                expected,
                "{key}"
            );
        }
        // toPositive, then modulo.
        assert_eq!(partition_for(b"21", 7), (-973_932_308i32 & 0x7fff_ffff) % 7);
        for p in [1, 3, 12] {
            let k = partition_for(b"drop-1/size-42", p);
            assert!((0..p).contains(&k));
            assert_eq!(k, partition_for(b"drop-1/size-42", p), "stable");
        }
    }
}
