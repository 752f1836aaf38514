//! Purchase and payment: the saga that turns a held unit into a sale.
//!
//! - `purchase` opens one payment per reservation: the reservation row is
//!   locked (`FOR UPDATE`), so two concurrent purchases produce one payment
//!   (the second gets the first's), and a partial unique index keeps at most
//!   one open (pending/succeeded) payment per reservation anyway.
//! - The provider's webhook is verified (HMAC-SHA256 over `"<t>.<body>"`,
//!   constant time, 5-minute tolerance, any of several `v1` signatures and
//!   any of our secrets, for rotation), deduplicated by the provider's event
//!   id (`processed_messages`), and applied in one transaction.
//! - Success: first the Redis hold is confirmed (confirm.lua), so expiry can
//!   no longer return the unit; then, in one transaction, payment
//!   `succeeded`, reservation `paid` (`WHERE status = 'pending_payment'`),
//!   inventory held→sold, outbox `order.paid`. If Redis says the hold is gone
//!   or expired, the unit is already back on sale: the payment is recorded
//!   with `refund_required` and the outbox says `payment.refund_required` —
//!   never a second sale of the unit.
//! - Failure: payment `failed`; the reservation stays payable until expiry,
//!   whose release is the saga's compensation (unit back in Redis and Postgres).

use hmac::digest::{CtOutput, Output};
use hmac::{Hmac, KeyInit, Mac};
use serde::Deserialize;
use serde_json::json;
use sha2::Sha256;
use sqlx::PgPool;

use crate::reservations::{Engine, ReservationId, now_ms};
use crate::sales::Sale;

/// Webhook timestamps older or newer than this are refused.
pub const WEBHOOK_TOLERANCE_SECS: u64 = 300;

/// Why a webhook signature was refused; each has its own error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the Payment-Signature header is missing")]
    Missing,
    #[error("the Payment-Signature header is malformed")]
    Malformed,
    #[error("the signature timestamp is outside the 5-minute tolerance")]
    Stale,
    #[error("no signature matches")]
    Mismatch,
}

impl SignatureError {
    pub fn code(self) -> &'static str {
        match self {
            SignatureError::Missing => "signature_missing",
            SignatureError::Malformed => "signature_malformed",
            SignatureError::Stale => "signature_stale",
            SignatureError::Mismatch => "signature_mismatch",
        }
    }
}

fn mac(secret: &str, t: u64, body: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    m.update(t.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m
}

/// `t=<t>,v1=<hex>`: what a provider sends (and our dev provider does).
pub fn sign_webhook(secret: &str, t: u64, body: &[u8]) -> String {
    format!(
        "t={t},v1={}",
        hex::encode(mac(secret, t, body).finalize().into_bytes())
    )
}

/// At most this many `v1` candidates in one header: a provider sends one
/// per secret it signs with (two while it rotates); more is refused before
/// any MAC is computed, so a header cannot buy unbounded work.
pub const MAX_SIGNATURES: usize = 5;

/// Verifies a `Payment-Signature` header against any of `secrets`.
///
/// The header is parsed fully (and cheaply) before any MAC: at most
/// [`MAX_SIGNATURES`] candidates, each exactly 64 hex digits (an HMAC-SHA256),
/// else `Malformed`. Then one MAC per secret over the body, compared in
/// constant time with every candidate: the work is bounded by
/// `secrets × body`, whatever the header says.
pub fn verify_webhook(
    secrets: &[String],
    header: Option<&str>,
    body: &[u8],
    now: u64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let mut t = None;
    let mut sigs: Vec<[u8; 32]> = Vec::new();
    for part in header.split(',') {
        let (k, v) = part
            .trim()
            .split_once('=')
            .ok_or(SignatureError::Malformed)?;
        match k {
            "t" => t = Some(v.parse::<u64>().map_err(|_| SignatureError::Malformed)?),
            "v1" => {
                if sigs.len() == MAX_SIGNATURES || v.len() != 64 {
                    return Err(SignatureError::Malformed);
                }
                let mut sig = [0u8; 32];
                hex::decode_to_slice(v, &mut sig).map_err(|_| SignatureError::Malformed)?;
                sigs.push(sig);
            }
            _ => {} // other schemes are ignored, as providers add them
        }
    }
    let t = t.ok_or(SignatureError::Malformed)?;
    if sigs.is_empty() {
        return Err(SignatureError::Malformed);
    }
    if now.abs_diff(t) > WEBHOOK_TOLERANCE_SECS {
        return Err(SignatureError::Stale);
    }
    // Every secret and every candidate is compared (no early exit), so the
    // time taken says nothing about which comparison matched.
    let mut ok = false;
    for s in secrets {
        let tag = mac(s, t, body).finalize();
        for sig in &sigs {
            ok |= tag == CtOutput::new(Output::<Hmac<Sha256>>::from(*sig));
        }
    }
    if ok {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The provider boundary. A real provider returns where to send the buyer;
/// the dev provider (local runs) completes payments itself by posting signed
/// webhooks over HTTP, exactly like a real one would.
pub trait PaymentProvider: Send + Sync {
    fn name(&self) -> &'static str;
    /// Where the buyer completes payment `payment_id`, if anywhere.
    fn checkout_url(&self, payment_id: &str) -> Option<String>;
}

/// Local runs: `POST /api/dev/payments/{id}/complete` (dev mode only) or
/// `origin pay simulate`.
pub struct DevProvider;

impl PaymentProvider for DevProvider {
    fn name(&self) -> &'static str {
        "dev"
    }
    fn checkout_url(&self, payment_id: &str) -> Option<String> {
        Some(format!("/api/dev/payments/{payment_id}/complete"))
    }
}

/// Builds and signs a webhook body as the provider would, and posts it.
pub async fn post_webhook(
    client: &reqwest::Client,
    origin: &str,
    secret: &str,
    event: &serde_json::Value,
) -> reqwest::Result<reqwest::Response> {
    let body = serde_json::to_vec(event).expect("json");
    let sig = sign_webhook(secret, crate::auth::now_secs(), &body);
    client
        .post(format!("{origin}/webhooks/payments"))
        .header("content-type", "application/json")
        .header("Payment-Signature", sig)
        .body(body)
        .send()
        .await
}

/// A provider event, as the webhook carries it.
#[derive(Debug, Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub data: EventData,
}

#[derive(Debug, Deserialize)]
pub struct EventData {
    pub payment_id: String,
    pub amount_cents: i64,
}

/// What applying an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    Paid,
    RefundRequired,
    Failed,
    /// The event id was seen before: nothing changed.
    Duplicate,
    /// The payment was already in a final state: nothing changed.
    Ignored,
}

/// Why an event could not be applied (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    #[error("unknown payment {0:?}")]
    UnknownPayment(String),
    #[error("amount {got} does not match the payment's {want}")]
    AmountMismatch { got: i64, want: i64 },
    #[error("postgres: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

#[derive(sqlx::FromRow)]
struct PaymentRow {
    reservation_id: String,
    sale_id: String,
    account: String,
    amount_cents: i64,
    status: String,
}

/// Applies a verified provider event; see the module doc.
pub async fn apply_event(
    pool: &PgPool,
    engine: &Engine,
    sale_of: impl AsyncFnOnce(&str) -> Option<std::sync::Arc<Sale>>,
    event: &Event,
) -> Result<Applied, ApplyError> {
    let success = match event.kind.as_str() {
        "payment.succeeded" => true,
        "payment.failed" => false,
        other => return Err(ApplyError::UnknownType(other.to_string())),
    };
    // Look first, outside the transaction: confirming in Redis must happen
    // before the Postgres transaction that records the sale.
    let pay: PaymentRow = sqlx::query_as(
        "SELECT reservation_id, sale_id, account, amount_cents, status FROM payments WHERE id = $1",
    )
    .bind(&event.data.payment_id)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| ApplyError::UnknownPayment(event.data.payment_id.clone()))?;
    if pay.amount_cents != event.data.amount_cents {
        return Err(ApplyError::AmountMismatch {
            got: event.data.amount_cents,
            want: pay.amount_cents,
        });
    }
    let seen: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM processed_messages WHERE consumer = 'payment-webhook' AND message_id = $1)",
    )
    .bind(&event.id)
    .fetch_one(pool)
    .await?;
    if seen {
        return Ok(Applied::Duplicate);
    }
    let confirmed = if success && pay.status == "pending" {
        let rid = ReservationId::parse(&pay.reservation_id);
        let sale = sale_of(&pay.sale_id).await;
        match (rid, sale) {
            (Some(rid), Some(sale)) => match engine
                .find_hold(&sale, &pay.reservation_id, rid.home)
                .await?
            {
                Some((shard, _)) => {
                    let mut conn = engine.conn.clone();
                    let r: i64 = engine
                        .scripts
                        .confirm
                        .key(sale.shards[shard].all().as_slice())
                        .arg(&pay.reservation_id)
                        .arg(now_ms())
                        .invoke_async(&mut conn)
                        .await?;
                    r == 1
                }
                None => false,
            },
            _ => false,
        }
    } else {
        false
    };

    let mut tx = pool.begin().await?;
    let first = sqlx::query(
        "INSERT INTO processed_messages (consumer, message_id) VALUES ('payment-webhook', $1)
         ON CONFLICT DO NOTHING",
    )
    .bind(&event.id)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !first {
        // A concurrent delivery of the same event won the insert.
        return Ok(Applied::Duplicate);
    }
    let current: String =
        sqlx::query_scalar("SELECT status FROM payments WHERE id = $1 FOR UPDATE")
            .bind(&event.data.payment_id)
            .fetch_one(&mut *tx)
            .await?;
    if current != "pending" {
        tx.commit().await?;
        return Ok(Applied::Ignored);
    }
    let applied = if !success {
        sqlx::query("UPDATE payments SET status = 'failed', provider_event_id = $2, updated_at = now() WHERE id = $1 AND status = 'pending'")
            .bind(&event.data.payment_id)
            .bind(&event.id)
            .execute(&mut *tx)
            .await?;
        Applied::Failed
    } else {
        let paid: Option<i32> = if confirmed {
            sqlx::query_scalar(
                "UPDATE reservations SET status = 'paid' WHERE id = $1 AND status = 'pending_payment' RETURNING qty",
            )
            .bind(&pay.reservation_id)
            .fetch_optional(&mut *tx)
            .await?
        } else {
            None
        };
        let refund = paid.is_none();
        sqlx::query(
            "UPDATE payments SET status = 'succeeded', refund_required = $3, provider_event_id = $2, updated_at = now()
             WHERE id = $1 AND status = 'pending'",
        )
        .bind(&event.data.payment_id)
        .bind(&event.id)
        .bind(refund)
        .execute(&mut *tx)
        .await?;
        if let Some(qty) = paid {
            sqlx::query(
                "UPDATE inventory SET held = held - $2, sold = sold + $2 WHERE sale_id = $1",
            )
            .bind(&pay.sale_id)
            .bind(qty)
            .execute(&mut *tx)
            .await?;
        }
        let (kind, applied) = if refund {
            ("payment.refund_required", Applied::RefundRequired)
        } else {
            ("order.paid", Applied::Paid)
        };
        let payload = json!({
            "reservation_id": pay.reservation_id,
            "payment_id": event.data.payment_id,
            "sale": pay.sale_id,
            "account": pay.account,
            "amount_cents": pay.amount_cents,
            "qty": paid,
        });
        sqlx::query("INSERT INTO outbox (event_id, type, payload) VALUES ($1, $2, $3)")
            .bind(format!("evt_{}", uuid::Uuid::now_v7().simple()))
            .bind(kind)
            .bind(payload)
            .execute(&mut *tx)
            .await?;
        applied
    };
    tx.commit().await?;
    metrics::counter!("flashsale_payment_events_total", "outcome" => format!("{applied:?}"))
        .increment(1);
    Ok(applied)
}
