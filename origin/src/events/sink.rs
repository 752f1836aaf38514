//! Where the outbox's events go: the [`Sink`] boundary and the default
//! sink, the Redis stream `<prefix>:events`.
//!
//! Invariant: a sink may receive an event more than once (the relay
//! publishes, then marks the row sent); consumers dedupe
//! (`crate::events::consume`).

use crate::reserve::ack::{Acker, Fact};
use crate::reserve::store::RedisConn;

/// One outbox event.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxEvent {
    pub id: i64,
    pub event_id: String,
    #[sqlx(rename = "type")]
    pub kind: String,
    pub payload: serde_json::Value,
    /// When the state change it announces was committed (the outbox row's
    /// `created_at`).
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Where events go. Pluggable: a shop may publish to its own bus instead.
pub trait Sink: Send + Sync {
    fn publish(&self, event: &OutboxEvent) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Publishes `events` in their order; returns only when every one was
    /// accepted. A sink that can send a batch at once overrides this.
    fn publish_batch(
        &self,
        events: &[OutboxEvent],
    ) -> impl Future<Output = anyhow::Result<()>> + Send {
        async move {
            for e in events {
                self.publish(e).await?;
            }
            Ok(())
        }
    }
}

/// The events stream keeps about this many entries (trimmed as it grows):
/// a consumer must not fall further behind than that. The outbox table
/// keeps every event for a republish (docs/operations.md).
pub const EVENTS_MAXLEN: usize = 1_000_000;

/// Publishes to a Redis stream, trimmed to about [`EVENTS_MAXLEN`] entries.
///
/// With an acknowledger (`REDIS_ACK=wait`) a batch counts as published
/// only once a replica has it: the relay then marks rows whose events
/// survive a failover. Without one, the stream is as durable as the
/// Redis it is on (a primary lost with its data loses the events published
/// to it; `scripts/chaos` counts them).
#[derive(Clone)]
pub struct RedisStreamSink {
    pub conn: RedisConn,
    pub stream: String,
    /// `REDIS_ACK=wait`: confirms each batch's last entry on a replica.
    pub acker: Option<Acker>,
}

impl RedisStreamSink {
    pub fn new(conn: RedisConn, prefix: &str) -> Self {
        RedisStreamSink {
            conn,
            stream: format!("{prefix}:events"),
            acker: None,
        }
    }

    /// The same, acknowledged by `acker`'s replica checks.
    pub fn acknowledged_by(mut self, acker: Option<Acker>) -> Self {
        self.acker = acker;
        self
    }

    /// Waits for a replica to have the entry `entry_id` of event
    /// `event_id` (no acknowledger: at once).
    async fn replicated(&self, entry_id: &str, event_id: &str) -> anyhow::Result<()> {
        let Some(acker) = &self.acker else {
            return Ok(());
        };
        let barrier = format!("{}:ack", self.stream);
        acker
            .confirm(Fact::event(&self.stream, &barrier, entry_id, event_id))
            .await
            .map_err(|e| anyhow::anyhow!("events stream not replicated: {e}"))
    }
}

impl RedisStreamSink {
    /// The XADD of one event, trimming the stream to about
    /// [`EVENTS_MAXLEN`] entries.
    fn xadd(&self, event: &OutboxEvent) -> redis::Cmd {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&self.stream)
            .arg("MAXLEN")
            .arg("~")
            .arg(EVENTS_MAXLEN)
            .arg("*")
            .arg("event_id")
            .arg(&event.event_id)
            .arg("type")
            .arg(&event.kind)
            .arg("payload")
            .arg(event.payload.to_string());
        cmd
    }
}

impl Sink for RedisStreamSink {
    async fn publish(&self, event: &OutboxEvent) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        let entry: String = self.xadd(event).query_async(&mut conn).await?;
        self.replicated(&entry, &event.event_id).await
    }

    /// One pipeline per batch: a settlement batch's hundreds of hold
    /// events cost one round trip, not one each. The stream keeps their
    /// order (one connection, commands in order).
    async fn publish_batch(&self, events: &[OutboxEvent]) -> anyhow::Result<()> {
        let mut conn = self.conn.clone();
        let mut last = None;
        for chunk in events.chunks(500) {
            let mut pipe = redis::pipe();
            for e in chunk {
                pipe.add_command(self.xadd(e));
            }
            let entries: Vec<String> = pipe.query_async(&mut conn).await?;
            last = entries.last().cloned().zip(chunk.last());
        }
        // The last entry on a replica: every earlier one is too.
        match last {
            Some((entry, event)) => self.replicated(&entry, &event.event_id).await,
            None => Ok(()),
        }
    }
}
