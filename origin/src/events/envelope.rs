//! What an event looks like once it leaves the product (issue 46,
//! docs/events.md): the outbox row wrapped in a versioned envelope, with
//! the key that keeps one SKU's events in order wherever they go.
//!
//! Pure. Invariants kept here: the envelope's `id` is the outbox row's
//! `event_id`, the same on every copy of the event (consumers dedupe by
//! it); `version` changes only when a field changes meaning or goes away
//! (new fields may appear in any version).

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::events::sink::OutboxEvent;

/// Every event type the product sends (docs/events.md); webhook filters
/// name these.
pub const EVENT_TYPES: &[&str] = &[
    "reservation.held",
    "reservation.expired",
    "reservation.cancelled",
    "reservation.rejected",
    "payment.started",
    "payment.failed",
    "order.paid",
    "payment.refund_required",
];

/// The envelope's version: bumped only on a breaking change.
pub const ENVELOPE_VERSION: u32 = 1;

/// One event as the sinks send it.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// `<sale>/<sku>`, or `<sale>` for an event that names no SKU.
    pub key: String,
    pub event_id: String,
    pub event_type: String,
    pub occurred_at: DateTime<Utc>,
    /// `{"version", "id", "type", "occurred_at", "sale", "sku", "data"}`.
    pub value: Value,
}

/// The envelope of one outbox row.
pub fn envelope(event: &OutboxEvent) -> Envelope {
    let sale = event.payload["sale"].as_str().unwrap_or_default();
    let sku = event.payload["sku"].as_str();
    let key = match sku {
        Some(sku) => format!("{sale}/{sku}"),
        None => sale.to_string(),
    };
    Envelope {
        key,
        event_id: event.event_id.clone(),
        event_type: event.kind.clone(),
        occurred_at: event.created_at,
        value: json!({
            "version": ENVELOPE_VERSION,
            "id": event.event_id,
            "type": event.kind,
            "occurred_at": event.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "sale": sale,
            "sku": sku,
            "data": event.payload,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(payload: Value) -> OutboxEvent {
        OutboxEvent {
            id: 7,
            event_id: "evt_1".into(),
            kind: "order.paid".into(),
            payload,
            created_at: DateTime::from_timestamp(1_800_000_000, 123_456_000).unwrap(),
        }
    }

    #[test]
    fn the_key_names_the_sale_and_the_sku() {
        let e = envelope(&event(
            json!({"sale": "drop-1", "sku": "size-42", "qty": 1}),
        ));
        assert_eq!(e.key, "drop-1/size-42");
        assert_eq!(e.event_id, "evt_1");
        assert_eq!(
            e.value,
            json!({
                "version": 1,
                "id": "evt_1",
                "type": "order.paid",
                "occurred_at": "2027-01-15T08:00:00.123456Z",
                "sale": "drop-1",
                "sku": "size-42",
                "data": {"sale": "drop-1", "sku": "size-42", "qty": 1},
            })
        );
    }

    #[test]
    fn an_event_without_a_sku_is_keyed_by_its_sale() {
        let e = envelope(&event(json!({"sale": "drop-1"})));
        assert_eq!(e.key, "drop-1");
        assert_eq!(e.value["sku"], Value::Null);
    }
}
