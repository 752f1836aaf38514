//! A consumer's dedupe of the events stream: exactly-once effects on
//! at-least-once delivery.
//!
//! Invariant: an event's effect and the record of its id
//! (`processed_messages`) commit in one transaction, so a repeat of the
//! event (a relay's republish) finds the id and does nothing.

use redis::AsyncCommands;
use sqlx::PgPool;

use crate::reserve::store::RedisConn;

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
