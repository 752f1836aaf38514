//! Webhook endpoints and deliveries in Postgres (migration 0018): what the
//! CLI writes, what the relay queues, what the worker claims and records.
//!
//! Invariants kept here: a delivery is queued once per (endpoint, event),
//! in the relay's transaction that marks the event published
//! ([`queue_deliveries`]); a delivery is claimed only when no earlier
//! delivery of its endpoint and order key (the reservation) is pending,
//! so one reservation's events reach an endpoint in order; a claim is a
//! lease (the worker that dies mid-delivery leaves it to be tried again:
//! at least once); a removed endpoint gets nothing more.

use std::time::Duration;

use serde::Serialize;
use sqlx::{PgConnection, PgPool, Row};

use crate::events::envelope::{EVENT_TYPES, envelope};
use crate::events::sink::OutboxEvent;
use crate::events::webhooks::signing;

/// An endpoint as `origin webhook list` shows it (never its secret).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Endpoint {
    pub id: String,
    pub url: String,
    /// `None`: every event type.
    pub events: Option<Vec<String>>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Deliveries waiting (first attempt or a retry).
    pub pending: i64,
    /// Deliveries that used every attempt (`origin webhook replay`).
    pub dead: i64,
}

/// What `add` and `rotate` print: the endpoint and its new secret, shown
/// this once.
#[derive(Debug, Clone, Serialize)]
pub struct WithSecret {
    pub id: String,
    pub url: String,
    pub events: Option<Vec<String>>,
    pub secret: String,
}

/// Why a CLI write was refused.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("unknown event type {0:?}; the types are {types}", types = EVENT_TYPES.join(", "))]
    UnknownEventType(String),
    #[error("no endpoint {0}")]
    NoSuchEndpoint(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The event types of a `--events a,b` filter, checked; `None` for every type.
pub fn event_filter(text: Option<&str>) -> Result<Option<Vec<String>>, EndpointError> {
    let Some(text) = text else { return Ok(None) };
    let mut types: Vec<String> = Vec::new();
    for t in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if !EVENT_TYPES.contains(&t) {
            return Err(EndpointError::UnknownEventType(t.to_string()));
        }
        if !types.iter().any(|x| x == t) {
            types.push(t.to_string());
        }
    }
    if types.is_empty() {
        return Err(EndpointError::UnknownEventType(text.to_string()));
    }
    Ok(Some(types))
}

/// Registers an endpoint (its URL already through the guard).
pub async fn add(
    pool: &PgPool,
    url: &str,
    events: Option<Vec<String>>,
) -> Result<WithSecret, EndpointError> {
    let id = format!("wh_{}", uuid::Uuid::now_v7().simple());
    let secret = signing::new_secret();
    sqlx::query("INSERT INTO webhook_endpoints (id, url, events, secret) VALUES ($1, $2, $3, $4)")
        .bind(&id)
        .bind(url)
        .bind(&events)
        .bind(&secret)
        .execute(pool)
        .await?;
    Ok(WithSecret {
        id,
        url: url.to_string(),
        events,
        secret,
    })
}

/// The endpoints not removed, oldest first, with their queues.
pub async fn list(pool: &PgPool) -> Result<Vec<Endpoint>, EndpointError> {
    Ok(sqlx::query_as(
        "SELECT e.id, e.url, e.events, e.created_at,
                (SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.status = 'pending') AS pending,
                (SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id AND d.status = 'dead') AS dead
           FROM webhook_endpoints e WHERE e.removed_at IS NULL ORDER BY e.created_at, e.id",
    )
    .fetch_all(pool)
    .await?)
}

/// Removes an endpoint: nothing more is queued for it or sent to it; its
/// waiting deliveries end dead ("endpoint removed").
pub async fn remove(pool: &PgPool, id: &str) -> Result<(), EndpointError> {
    let mut tx = pool.begin().await?;
    let n = sqlx::query(
        "UPDATE webhook_endpoints SET removed_at = now() WHERE id = $1 AND removed_at IS NULL",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if n == 0 {
        return Err(EndpointError::NoSuchEndpoint(id.to_string()));
    }
    sqlx::query(
        "UPDATE webhook_deliveries SET status = 'dead', last_error = 'endpoint removed'
          WHERE endpoint_id = $1 AND status = 'pending'",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// A new secret for an endpoint; the old one keeps signing beside it for
/// `overlap` (receivers switch without a gap).
pub async fn rotate(
    pool: &PgPool,
    id: &str,
    overlap: Duration,
) -> Result<WithSecret, EndpointError> {
    let secret = signing::new_secret();
    let row = sqlx::query(
        "UPDATE webhook_endpoints
            SET previous_secret = secret, previous_secret_until = now() + make_interval(secs => $3),
                secret = $2
          WHERE id = $1 AND removed_at IS NULL
         RETURNING url, events",
    )
    .bind(id)
    .bind(&secret)
    .bind(overlap.as_secs_f64())
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| EndpointError::NoSuchEndpoint(id.to_string()))?;
    Ok(WithSecret {
        id: id.to_string(),
        url: row.get(0),
        events: row.get(1),
        secret,
    })
}

/// Sends dead deliveries of an endpoint again (all, or one event's):
/// they wait as new, with every attempt again. Returns how many.
pub async fn replay(pool: &PgPool, id: &str, event: Option<&str>) -> Result<u64, EndpointError> {
    let live: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM webhook_endpoints WHERE id = $1 AND removed_at IS NULL")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    if live.is_none() {
        return Err(EndpointError::NoSuchEndpoint(id.to_string()));
    }
    Ok(sqlx::query(
        "UPDATE webhook_deliveries SET status = 'pending', attempts = 0, next_attempt_at = now(),
                last_error = NULL, last_status = NULL
          WHERE endpoint_id = $1 AND status = 'dead' AND ($2::text IS NULL OR event_id = $2)",
    )
    .bind(id)
    .bind(event)
    .execute(pool)
    .await?
    .rows_affected())
}

/// Queues the deliveries of `events` to every endpoint that wants them, in
/// the relay's transaction (the one that marks them published). An event
/// queued before (a republish) is not queued again. Returns how many.
pub async fn queue_deliveries(
    tx: &mut PgConnection,
    events: &[OutboxEvent],
) -> Result<u64, sqlx::Error> {
    if events.is_empty() {
        return Ok(0);
    }
    let endpoints: Vec<(String, Option<Vec<String>>)> =
        sqlx::query_as("SELECT id, events FROM webhook_endpoints WHERE removed_at IS NULL")
            .fetch_all(&mut *tx)
            .await?;
    if endpoints.is_empty() {
        return Ok(0);
    }
    let (mut ep, mut ids, mut types, mut keys, mut bodies) =
        (vec![], vec![], vec![], vec![], vec![]);
    for e in events {
        let wanted: Vec<&String> = endpoints
            .iter()
            .filter(|(_, f)| f.as_ref().is_none_or(|f| f.contains(&e.kind)))
            .map(|(id, _)| id)
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let body = envelope(e).value;
        let key = e.payload["reservation_id"]
            .as_str()
            .unwrap_or(&e.event_id)
            .to_string();
        for id in wanted {
            ep.push(id.clone());
            ids.push(e.event_id.clone());
            types.push(e.kind.clone());
            keys.push(key.clone());
            bodies.push(body.clone());
        }
    }
    if ep.is_empty() {
        return Ok(0);
    }
    Ok(sqlx::query(
        "INSERT INTO webhook_deliveries (endpoint_id, event_id, event_type, order_key, body)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[])
         ON CONFLICT (endpoint_id, event_id) DO NOTHING",
    )
    .bind(&ep)
    .bind(&ids)
    .bind(&types)
    .bind(&keys)
    .bind(&bodies)
    .execute(&mut *tx)
    .await?
    .rows_affected())
}

/// A delivery claimed for one attempt.
#[derive(Debug, Clone)]
pub struct Due {
    pub id: i64,
    pub endpoint_id: String,
    pub url: String,
    pub event_id: String,
    pub body: serde_json::Value,
    /// This attempt's number (1 = the first).
    pub attempts: i32,
    /// The keys that sign it: the secret's, and the previous secret's
    /// during a rotation.
    pub keys: Vec<Vec<u8>>,
}

/// Claims up to `limit` due deliveries, at most `per_endpoint` of any one
/// endpoint and none of the endpoints in `full` (those at their cap of
/// deliveries in flight): a slow endpoint holds only its own share. Each
/// claim counts an attempt and is a lease of `lease`: if no outcome is
/// recorded by then, the delivery is due again.
pub async fn claim(
    pool: &PgPool,
    limit: i64,
    per_endpoint: i64,
    full: &[String],
    lease: Duration,
) -> Result<Vec<Due>, sqlx::Error> {
    let rows = sqlx::query(
        // Per endpoint, its oldest due deliveries through the partial index
        // (endpoint_id, id): a claim reads a few rows per endpoint, not
        // every pending delivery.
        "WITH picked AS (
             SELECT d.id FROM webhook_endpoints e
              CROSS JOIN LATERAL (
                  SELECT d.id FROM webhook_deliveries d
                   WHERE d.endpoint_id = e.id AND d.status = 'pending' AND d.next_attempt_at <= now()
                     AND NOT EXISTS (SELECT 1 FROM webhook_deliveries b
                                      WHERE b.endpoint_id = d.endpoint_id AND b.order_key = d.order_key
                                        AND b.status = 'pending' AND b.id < d.id)
                   ORDER BY d.id LIMIT $2
                     FOR UPDATE OF d SKIP LOCKED) d
              WHERE e.removed_at IS NULL AND NOT (e.id = ANY($3))
              LIMIT $1
         )
         UPDATE webhook_deliveries d
            SET attempts = d.attempts + 1, next_attempt_at = now() + make_interval(secs => $4)
           FROM picked, webhook_endpoints e
          WHERE d.id = picked.id AND e.id = d.endpoint_id
         RETURNING d.id, d.endpoint_id, e.url, d.event_id, d.body, d.attempts, e.secret,
                   CASE WHEN e.previous_secret_until > now() THEN e.previous_secret END",
    )
    .bind(limit)
    .bind(per_endpoint)
    .bind(full)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?;
    let mut due: Vec<Due> = rows
        .into_iter()
        .map(|r| {
            let secrets = [r.get::<Option<String>, _>(6), r.get::<Option<String>, _>(7)];
            Due {
                id: r.get(0),
                endpoint_id: r.get(1),
                url: r.get(2),
                event_id: r.get(3),
                body: r.get(4),
                attempts: r.get(5),
                keys: secrets
                    .iter()
                    .flatten()
                    .filter_map(|s| signing::secret_key(s))
                    .collect(),
            }
        })
        .collect();
    due.sort_by_key(|d| d.id);
    Ok(due)
}

/// The endpoint answered 2xx.
pub async fn delivered(pool: &PgPool, id: i64, status: u16) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now(), last_status = $2, last_error = NULL
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(id)
    .bind(i32::from(status))
    .execute(pool)
    .await?;
    Ok(())
}

/// The attempt failed: tried again after `retry_in`, or dead when `None`.
pub async fn failed(
    pool: &PgPool,
    id: i64,
    status: Option<u16>,
    error: &str,
    retry_in: Option<Duration>,
) -> Result<(), sqlx::Error> {
    let error: String = error.chars().take(500).collect();
    sqlx::query(
        "UPDATE webhook_deliveries
            SET status = CASE WHEN $4::float8 IS NULL THEN 'dead' ELSE 'pending' END,
                next_attempt_at = CASE WHEN $4::float8 IS NULL THEN next_attempt_at
                                       ELSE now() + make_interval(secs => $4::float8) END,
                last_status = $2, last_error = $3
          WHERE id = $1 AND status = 'pending'",
    )
    .bind(id)
    .bind(status.map(i32::from))
    .bind(error)
    .bind(retry_in.map(|d| d.as_secs_f64()))
    .execute(pool)
    .await?;
    Ok(())
}

/// Deliveries waiting and the age of the oldest, for the metrics.
pub async fn backlog(pool: &PgPool) -> Result<(i64, f64), sqlx::Error> {
    let (n, age): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
           FROM webhook_deliveries WHERE status = 'pending'",
    )
    .fetch_one(pool)
    .await?;
    Ok((n, age.unwrap_or(0.0)))
}
