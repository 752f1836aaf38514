//! The outbox's batch rows (migration 0017) opened into the events they
//! carry, before any sink sees them.
//!
//! A statement that changes many reservations (a settlement batch of
//! hundreds of holds) writes one outbox row of type `batch`: one row
//! instead of one per event keeps the outbox off the hot path's cost. Two
//! forms:
//!
//! - `{"reservations": [id, …], "types": [type, …]}`: reservation events
//!   by reference; what each says is read from the reservation row
//!   ([`Facts`], fields that never change once the row is written);
//! - `{"events": [{"id", "type", "data"}, …]}`: whole events (payments).
//!
//! Sinks, webhooks and consumers only ever see the events.
//!
//! Pure. Invariants kept here: every event of a row comes out, in the
//! row's order, after the events of earlier rows; its id is derived from
//! what changed (`evt_<reservation>.<held|expired|…>`: stable across
//! republishes, unique because each change happens once); each keeps its
//! row's `id` (what the relay marks published) and `created_at` (when the
//! change committed).

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use crate::events::sink::OutboxEvent;

/// The outbox type of a row that carries other events.
pub const BATCH: &str = "batch";

/// What a reservation event says about its reservation: the row's fields
/// that never change once it is written.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Facts {
    pub id: String,
    pub sale: String,
    /// The SKU's id (`None` only if the sale lost the SKU row: never).
    pub sku: Option<String>,
    pub account: String,
    pub qty: i32,
    pub held_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Why it was released (`expired`, `cancelled`, `lost`, `over_total`, …).
    pub reason: Option<String>,
}

/// The reservations whose rows `rows`' events refer to.
pub fn references(rows: &[OutboxEvent]) -> Vec<String> {
    let mut ids: Vec<String> = rows
        .iter()
        .filter(|r| r.kind == BATCH)
        .filter_map(|r| r.payload["reservations"].as_array())
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The status a reservation event's row has, as the event reports it.
fn status_of(kind: &str) -> &'static str {
    match kind {
        "reservation.held" => "settled",
        "reservation.expired" => "expired",
        "reservation.cancelled" => "cancelled",
        _ => "rejected",
    }
}

/// One reservation event from its row's facts.
fn reservation_event(row: &OutboxEvent, kind: &str, f: &Facts) -> OutboxEvent {
    let suffix = kind.rsplit('.').next().unwrap_or(kind);
    let time = |t: &DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::Micros, true);
    OutboxEvent {
        id: row.id,
        event_id: format!("evt_{}.{suffix}", f.id),
        kind: kind.to_string(),
        payload: json!({
            "reservation_id": f.id,
            "sale": f.sale,
            "sku": f.sku,
            "account": f.account,
            "qty": f.qty,
            "status": status_of(kind),
            "reason": if kind == "reservation.held" { None } else { f.reason.clone() },
            "held_at": time(&f.held_at),
            "expires_at": time(&f.expires_at),
        }),
        created_at: row.created_at,
    }
}

fn malformed(row: &OutboxEvent, item: &Value, why: &str) {
    // Only the triggers of migration 0017 write batch rows; this is a
    // defect there. Counted and logged, not sent: a consumer could not
    // dedupe an event without its id.
    metrics::counter!("flashsale_outbox_malformed_total").increment(1);
    tracing::error!(row = row.id, %item, why, "outbox batch item not sent");
}

/// `rows` (outbox order) as the events they announce: a batch row becomes
/// its events (reservation references read from `facts`), any other row
/// stays itself.
pub fn expand(rows: Vec<OutboxEvent>, facts: &HashMap<String, Facts>) -> Vec<OutboxEvent> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        if row.kind != BATCH {
            out.push(row);
            continue;
        }
        if let (Some(ids), Some(types)) = (
            row.payload["reservations"].as_array(),
            row.payload["types"].as_array(),
        ) {
            for (id, kind) in ids.iter().zip(types) {
                match (id.as_str().and_then(|id| facts.get(id)), kind.as_str()) {
                    (Some(f), Some(kind)) => out.push(reservation_event(&row, kind, f)),
                    _ => malformed(&row, id, "no such reservation, or no type"),
                }
            }
            if ids.len() != types.len() {
                malformed(&row, &row.payload, "as many ids as types");
            }
        }
        for item in row.payload["events"].as_array().into_iter().flatten() {
            match (item["id"].as_str(), item["type"].as_str()) {
                (Some(id), Some(kind)) => out.push(OutboxEvent {
                    id: row.id,
                    event_id: id.to_string(),
                    kind: kind.to_string(),
                    payload: item["data"].clone(),
                    created_at: row.created_at,
                }),
                _ => malformed(&row, item, "an event without id or type"),
            }
        }
    }
    out
}

/// How many events `row` carries once expanded.
pub fn events_in(row: &OutboxEvent) -> usize {
    if row.kind == BATCH {
        row.payload["reservations"].as_array().map_or(0, Vec::len)
            + row.payload["events"].as_array().map_or(0, Vec::len)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, kind: &str, payload: Value) -> OutboxEvent {
        OutboxEvent {
            id,
            event_id: format!("row-{id}"),
            kind: kind.into(),
            payload,
            created_at: DateTime::from_timestamp(1_800_000_000 + id, 0).unwrap(),
        }
    }

    fn facts(id: &str, reason: Option<&str>) -> Facts {
        Facts {
            id: id.into(),
            sale: "drop-1".into(),
            sku: Some("size-42".into()),
            account: "ann".into(),
            qty: 2,
            held_at: DateTime::from_timestamp(1_800_000_000, 123_456_000).unwrap(),
            expires_at: DateTime::from_timestamp(1_800_000_600, 123_456_000).unwrap(),
            reason: reason.map(str::to_string),
        }
    }

    #[test]
    fn batch_rows_become_their_events_in_order_and_others_stay() {
        let rows = vec![
            row(1, "order.paid", json!({"sale": "s"})),
            row(
                2,
                BATCH,
                json!({"reservations": ["r1", "r2", "r2"],
                       "types": ["reservation.held", "reservation.held", "reservation.cancelled"]}),
            ),
            row(
                3,
                BATCH,
                json!({"events": [
                    {"id": "evt_p1.started", "type": "payment.started", "data": {"payment_id": "p1"}},
                ]}),
            ),
        ];
        assert_eq!(rows.iter().map(events_in).sum::<usize>(), 5);
        assert_eq!(references(&rows), ["r1", "r2"]);
        let known: HashMap<String, Facts> = [
            ("r1".to_string(), facts("r1", None)),
            ("r2".to_string(), facts("r2", Some("cancelled"))),
        ]
        .into();
        let out = expand(rows, &known);
        let ids: Vec<(&str, &str, i64)> = out
            .iter()
            .map(|e| (e.event_id.as_str(), e.kind.as_str(), e.id))
            .collect();
        assert_eq!(
            ids,
            [
                ("row-1", "order.paid", 1),
                ("evt_r1.held", "reservation.held", 2),
                ("evt_r2.held", "reservation.held", 2),
                ("evt_r2.cancelled", "reservation.cancelled", 2),
                ("evt_p1.started", "payment.started", 3),
            ]
        );
        assert_eq!(
            out[2].payload,
            json!({"reservation_id": "r2", "sale": "drop-1", "sku": "size-42", "account": "ann",
                   "qty": 2, "status": "settled", "reason": null,
                   "held_at": "2027-01-15T08:00:00.123456Z",
                   "expires_at": "2027-01-15T08:10:00.123456Z"})
        );
        assert_eq!(
            (
                out[3].payload["status"].as_str(),
                out[3].payload["reason"].as_str()
            ),
            (Some("cancelled"), Some("cancelled"))
        );
        assert_eq!(out[1].created_at, out[2].created_at);
        assert_eq!(out[4].payload, json!({"payment_id": "p1"}));
    }

    #[test]
    fn an_item_that_cannot_be_an_event_is_left_out_and_the_rest_kept() {
        let known: HashMap<String, Facts> = [("r1".to_string(), facts("r1", None))].into();
        let out = expand(
            vec![
                row(
                    1,
                    BATCH,
                    json!({"reservations": ["gone", "r1", 7], "types": ["reservation.held", "reservation.held", "reservation.held"]}),
                ),
                row(
                    2,
                    BATCH,
                    json!({"events": [
                        {"type": "payment.started", "data": {}},
                        {"id": "evt_p.started", "type": "payment.started", "data": {}},
                    ]}),
                ),
            ],
            &known,
        );
        let ids: Vec<&str> = out.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["evt_r1.held", "evt_p.started"]);
        assert!(expand(vec![row(1, BATCH, json!({}))], &known).is_empty());
    }
}
