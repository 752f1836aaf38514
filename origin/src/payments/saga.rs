//! Payment events applied: the saga that turns a held unit into a sale,
//! and its compensation.
//!
//! The saga order of an event (`apply_event`), each step inside one
//! Postgres transaction:
//!
//! 1. record the event id (a concurrent or repeated delivery stops here);
//! 2. lock the payment row (`FOR UPDATE`) and check it is `pending`: every
//!    event of one payment takes its turn here, so a `failed` and a
//!    `succeeded` racing cannot both act, and the loser changes nothing;
//! 3. failure: payment `failed`, commit. The reservation stays payable until
//!    expiry, whose release is the compensation (unit back in Redis and
//!    Postgres);
//! 4. success: confirm the hold in Redis (confirm.lua) *while holding the
//!    lock*, so expiry can no longer return the unit; then payment
//!    `succeeded`, reservation `paid` (`WHERE status = 'pending_payment'`),
//!    inventory held→sold, outbox `order.paid`; commit. If Redis says the
//!    hold is gone or expired, the unit is already back on sale: the payment
//!    is recorded with `refund_required` and the outbox says
//!    `payment.refund_required` — never a second sale of the unit; so is a
//!    payment that would take the account's paid units over the per-user
//!    limit (Postgres is its last guard: a `REDIS_ACK=local` failover can
//!    take a paid hold and the account's count out of Redis);
//! 5. compensation: if the transaction fails after the confirm (or commits
//!    without selling the unit), [`align_hold`] puts the hold back to `held`
//!    and into the expiry index (unconfirm.lua), under the reservation's and
//!    payments' row locks and only if Postgres says it is not paid — so an
//!    expired one is swept and its unit comes back.
//!
//! Invariant: Redis `paid` ⇔ Postgres `paid`, except while step 4 holds the
//! payment lock. A crash between confirm and commit (or a commit whose
//! outcome was lost) breaks it; the reconciler finds such holds and, when
//! no event holds the locks, re-aligns them with [`align_hold`].

use serde_json::json;
use sqlx::PgPool;

use crate::reserve::ack::FactKind;
use crate::reserve::engine::{Engine, ReservationId};
use crate::sales::sale::Sale;

use crate::payments::webhook::Event;
/// What applying a payment event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
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
    /// `REDIS_ACK=wait`: the confirm did not reach a replica in time; it
    /// was undone and nothing was recorded (the provider delivers again).
    #[error("{0}")]
    NotReplicated(#[from] crate::reserve::ack::AckError),
    /// The hold was not found because its shard lost its keys (Redis lost
    /// data): nothing was recorded; the provider delivers again after the
    /// rebuild, which restores the hold from Postgres.
    #[error("the hold's shard lost its keys and is being restored")]
    ShardLost,
}

#[derive(sqlx::FromRow)]
struct PaymentRow {
    reservation_id: String,
    sale_id: String,
    account: String,
    amount_cents: i64,
    /// The shard the reservation's hold was granted on.
    shard: i32,
}

/// Applies a verified provider event; see the module doc for the saga order.
pub async fn apply_event(
    pool: &PgPool,
    engine: &Engine,
    sale_of: impl AsyncFnOnce(&str) -> Result<Option<std::sync::Arc<Sale>>, sqlx::Error>,
    event: &Event,
) -> Result<Applied, ApplyError> {
    let success = match event.kind.as_str() {
        "payment.succeeded" => true,
        "payment.failed" => false,
        other => return Err(ApplyError::UnknownType(other.to_string())),
    };
    let pay: PaymentRow = sqlx::query_as(
        "SELECT p.reservation_id, p.sale_id, p.account, p.amount_cents, r.shard
         FROM payments p JOIN reservations r ON r.id = p.reservation_id WHERE p.id = $1",
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
        // Seen before (or a concurrent delivery of it won the insert).
        return Ok(Applied::Duplicate);
    }
    // The payment row lock is what orders this event against every other
    // event of the payment (and against the reconciler's repairs): from here
    // to the commit, nobody else decides this payment.
    let current: String =
        sqlx::query_scalar("SELECT status FROM payments WHERE id = $1 FOR UPDATE")
            .bind(&event.data.payment_id)
            .fetch_one(&mut *tx)
            .await?;
    if current == "failed" && success {
        // Captured after it was reported failed (issue 43 #5): the money is
        // taken, but the failure already gave the reservation back to the
        // buyer, who may have paid again. It never sells the unit: it is
        // recorded `succeeded` with `refund_required`, and the outbox says
        // `payment.refund_required`, as any capture that lost.
        let done = record_success(tx, &pay, event, false).await?;
        metrics::counter!("flashsale_payment_events_total", "outcome" => "CaptureAfterFailure")
            .increment(1);
        return Ok(done.applied);
    }
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
        tx.commit().await?;
        Applied::Failed
    } else {
        // A failure to load the sale says nothing about the payment (issue
        // 43 #4: read as "no such sale", a good payment became
        // `refund_required` for good): the transaction rolls back, the
        // event is not marked processed, and the provider delivers again.
        let sale = sale_of(&pay.sale_id).await?;
        // Confirmed in Redis while the lock is held: only this transaction
        // can now record (or fail to record) the sale.
        let confirmed_on = match &sale {
            Some(sale) => confirm_hold(engine, sale, &pay.reservation_id, false).await?,
            None => None,
        };
        // Not found because its shard lost its keys: no verdict (a refund)
        // about a hold the rebuild will restore; the provider retries.
        if confirmed_on.is_none()
            && let Some(sale) = &sale
            && let Some(rid) = ReservationId::parse(&pay.reservation_id)
            && engine
                .any_lost(sale, &[rid.home, pay.shard as usize])
                .await?
        {
            return Err(ApplyError::ShardLost);
        }
        let confirmed = confirmed_on.is_some();
        // REDIS_ACK=wait: the sale is recorded only once a replica has the
        // confirm (a failover must not hand the unit back to expiry while
        // Postgres says paid). If not: roll back, undo the confirm under the
        // locks (`compensate`), and let the provider deliver again.
        if let (Some(keys), Some(sale)) = (confirmed_on, &sale) {
            let acked = engine
                .acknowledge(keys, &pay.reservation_id, FactKind::Paid)
                .await;
            if let Err(e) = acked {
                drop(tx);
                compensate(pool, engine, sale, &pay.reservation_id).await;
                return Err(e.into());
            }
        }
        match record_success(tx, &pay, event, confirmed).await {
            Ok(RecordedSuccess { applied, unsold }) => {
                if unsold && let Some(sale) = &sale {
                    // Confirmed but Postgres did not sell it (the reservation
                    // was no longer pending_payment): the unit must not stay
                    // `paid` in Redis.
                    compensate(pool, engine, sale, &pay.reservation_id).await;
                }
                applied
            }
            Err(e) => {
                if confirmed && let Some(sale) = &sale {
                    compensate(pool, engine, sale, &pay.reservation_id).await;
                }
                return Err(e.into());
            }
        }
    };
    metrics::counter!("flashsale_payment_events_total", "outcome" => format!("{applied:?}"))
        .increment(1);
    Ok(applied)
}

struct RecordedSuccess {
    applied: Applied,
    /// Redis confirmed the hold but Postgres did not mark it paid.
    unsold: bool,
}

/// The success transaction, under the payment row lock: payment
/// `succeeded`, reservation `paid` (when Redis confirmed), inventory
/// held→sold, the outbox event; committed here, or rolled back explicitly
/// on any error, so the row locks are gone before the compensation runs.
async fn record_success(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    pay: &PaymentRow,
    event: &Event,
    confirmed: bool,
) -> Result<RecordedSuccess, sqlx::Error> {
    match write_success(&mut tx, pay, event, confirmed).await {
        Ok(done) => {
            tx.commit().await?;
            Ok(done)
        }
        Err(e) => {
            if let Err(r) = tx.rollback().await {
                tracing::warn!(error = %r, "payment: rollback failed (the connection closes, which rolls back)");
            }
            Err(e)
        }
    }
}

async fn write_success(
    tx: &mut sqlx::PgConnection,
    pay: &PaymentRow,
    event: &Event,
    confirmed: bool,
) -> Result<RecordedSuccess, sqlx::Error> {
    let paid: Option<(i32, i32)> = if confirmed {
        // Postgres is the last guard of the per-user limit (as of the
        // total): Redis counts an account's units, but a failover under
        // `REDIS_ACK=local` can take a paid hold and the count with it, and
        // the account is granted its whole limit again. One payment of an
        // account at a time (the advisory lock), and only within the limit.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))")
            .bind(&pay.sale_id)
            .bind(&pay.account)
            .execute(&mut *tx)
            .await?;
        // Both limits: the sale's (units across all SKUs) and the SKU's own.
        sqlx::query_as(
            "UPDATE reservations r SET status = 'paid'
             WHERE r.id = $1 AND r.status = 'pending_payment'
               AND r.qty + (SELECT coalesce(sum(p.qty), 0) FROM reservations p
                            WHERE p.sale_id = r.sale_id AND p.account = r.account AND p.status = 'paid')
                   <= (SELECT s.per_user_limit FROM sales s WHERE s.id = r.sale_id)
               AND r.qty + (SELECT coalesce(sum(p.qty), 0) FROM reservations p
                            WHERE p.sale_id = r.sale_id AND p.account = r.account AND p.status = 'paid'
                              AND p.sku = r.sku)
                   <= coalesce((SELECT k.per_user_limit FROM skus k
                                WHERE k.sale_id = r.sale_id AND k.position = r.sku), 2147483647)
             RETURNING r.sku, r.qty",
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
         WHERE id = $1 AND status IN ('pending', 'failed')",
    )
    .bind(&event.data.payment_id)
    .bind(&event.id)
    .bind(refund)
    .execute(&mut *tx)
    .await?;
    if let Some((sku, qty)) = paid {
        sqlx::query("UPDATE inventory SET held = held - $2, sold = sold + $2 WHERE sale_id = $1")
            .bind(&pay.sale_id)
            .bind(qty)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE skus SET held = held - $3, sold = sold + $3 WHERE sale_id = $1 AND position = $2",
        )
        .bind(&pay.sale_id)
        .bind(sku)
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
        "qty": paid.map(|(_, qty)| qty),
    });
    // Every event names the SKU (issue 45): the reservation's, by position.
    sqlx::query(
        "INSERT INTO outbox (event_id, type, payload)
         VALUES ($1, $2, $3::jsonb || jsonb_build_object('sku',
                 (SELECT k.id FROM reservations r
                    JOIN skus k ON k.sale_id = r.sale_id AND k.position = r.sku
                   WHERE r.id = $4)))",
    )
    .bind(format!("evt_{}", uuid::Uuid::now_v7().simple()))
    .bind(kind)
    .bind(payload)
    .bind(&pay.reservation_id)
    .execute(&mut *tx)
    .await?;
    Ok(RecordedSuccess {
        applied,
        unsold: confirmed && refund,
    })
}

/// confirm.lua on the hold's shard; the keys of the shard it confirmed the
/// hold on, `None` when the hold is gone, expired (unless `force`) or unknown.
async fn confirm_hold<'s>(
    engine: &Engine,
    sale: &'s Sale,
    reservation_id: &str,
    force: bool,
) -> Result<Option<&'s crate::reserve::store::ShardKeys>, redis::RedisError> {
    let Some(rid) = ReservationId::parse(reservation_id) else {
        return Ok(None);
    };
    let Some((shard, _)) = engine.find_hold(sale, reservation_id, rid.home).await? else {
        return Ok(None);
    };
    let mut conn = engine.conn.clone();
    let r: i64 = engine
        .scripts
        .confirm
        .key(sale.shards[shard].all().as_slice())
        .arg(reservation_id)
        .arg(if force { "1" } else { "0" })
        .invoke_async(&mut conn)
        .await?;
    Ok((r == 1).then(|| &sale.shards[shard]))
}

/// The compensation of a confirm whose transaction did not record the sale:
/// re-aligns the hold with Postgres (normally: unconfirm). Tried a few times
/// while an event of the same payment holds the lock; what it cannot do is
/// left to the reconciler, which finds the disagreement.
async fn compensate(pool: &PgPool, engine: &Engine, sale: &Sale, reservation_id: &str) {
    for _ in 0..20 {
        match align_hold(pool, engine, sale, reservation_id, true).await {
            Ok(Alignment::Busy) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            Ok(a) => {
                tracing::warn!(reservation = reservation_id, outcome = ?a, "payment: confirm compensated");
                return;
            }
            Err(e) => {
                tracing::error!(reservation = reservation_id, error = %e, "payment: cannot compensate the confirm; the reconciler will");
                return;
            }
        }
    }
    tracing::error!(
        reservation = reservation_id,
        "payment: compensation kept finding the payment locked; the reconciler will"
    );
}

/// What [`align_hold`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Alignment {
    /// Redis and Postgres agree (or there is no hold in Redis to align).
    Agreed,
    /// Redis said `paid`, Postgres did not: the hold is `held` again (or
    /// would be, without `apply`).
    Unconfirmed,
    /// Postgres said `paid`, Redis `held`: the hold is `paid` again (or
    /// would be, without `apply`).
    Confirmed,
    /// The reservation or one of its payments is locked (an event is being
    /// applied): nothing was read or changed; try again later.
    Busy,
}

/// Why [`align_hold`] could not run.
#[derive(Debug, thiserror::Error)]
pub enum AlignError {
    #[error("postgres: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Makes a hold's `paid` state in Redis agree with Postgres (the truth):
/// Redis `paid` is right exactly when the reservation is `paid` in Postgres.
/// With `apply` false it only says what it would do (a locked, consistent
/// look, for reports).
///
/// Runs with the reservation row and then all its payment rows locked
/// (`NOWAIT`: [`Alignment::Busy`] when anything is locked), the same locks a
/// purchase (reservation) and an event (payment) take before they change
/// anything, so no confirm, purchase or success can interleave with the
/// decision; the Redis state is read only after the locks are held.
pub async fn align_hold(
    pool: &PgPool,
    engine: &Engine,
    sale: &Sale,
    reservation_id: &str,
    apply: bool,
) -> Result<Alignment, AlignError> {
    let mut tx = pool.begin().await?;
    match align_locked(&mut tx, engine, sale, reservation_id, apply).await {
        // Released only now: the Redis change happened under the locks.
        Ok(a) if a != Alignment::Busy => {
            tx.commit().await?;
            Ok(a)
        }
        // Rolled back explicitly, not by drop: a dropped transaction's
        // rollback runs later on its pooled connection, keeping the
        // reservation row locked meanwhile (the next look would find it Busy).
        other => {
            tx.rollback().await?;
            other
        }
    }
}

async fn align_locked(
    tx: &mut sqlx::PgConnection,
    engine: &Engine,
    sale: &Sale,
    reservation_id: &str,
    apply: bool,
) -> Result<Alignment, AlignError> {
    let Some(status) = lock_reservation_rows(tx, reservation_id).await? else {
        return Ok(Alignment::Busy);
    };
    let Some(status) = status else {
        return Ok(Alignment::Agreed);
    };
    let Some(rid) = ReservationId::parse(reservation_id) else {
        return Ok(Alignment::Agreed);
    };
    let Some((shard, hold)) = engine.find_hold(sale, reservation_id, rid.home).await? else {
        return Ok(Alignment::Agreed);
    };
    let pg_paid = status == "paid";
    Ok(match (hold.status == "paid", pg_paid) {
        (true, false) if !apply => Alignment::Unconfirmed,
        (false, true) if !apply => Alignment::Confirmed,
        (true, false) => {
            let mut conn = engine.conn.clone();
            let _: i64 = engine
                .scripts
                .unconfirm
                .key(sale.shards[shard].all().as_slice())
                .arg(reservation_id)
                .invoke_async(&mut conn)
                .await?;
            Alignment::Unconfirmed
        }
        (false, true) => {
            confirm_hold(engine, sale, reservation_id, true).await?;
            Alignment::Confirmed
        }
        _ => Alignment::Agreed,
    })
}

/// Locks reservation `id`'s row and then all its payment rows (`NOWAIT`),
/// the locks a purchase (reservation) and an event (payment) take before
/// they change anything, so none of them interleaves with what the caller
/// decides under them. `None`: something is locked (an event or purchase is
/// under way; the caller rolls back and looks again later). Else the
/// reservation's status (`Some(None)`: no such row).
pub(crate) async fn lock_reservation_rows(
    tx: &mut sqlx::PgConnection,
    id: &str,
) -> Result<Option<Option<String>>, sqlx::Error> {
    let status =
        match sqlx::query_scalar("SELECT status FROM reservations WHERE id = $1 FOR UPDATE NOWAIT")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
        {
            Err(e) if is_lock_unavailable(&e) => return Ok(None),
            other => other?,
        };
    match sqlx::query("SELECT 1 FROM payments WHERE reservation_id = $1 FOR UPDATE NOWAIT")
        .bind(id)
        .execute(&mut *tx)
        .await
    {
        Err(e) if is_lock_unavailable(&e) => Ok(None),
        Err(e) => Err(e),
        Ok(_) => Ok(Some(status)),
    }
}

fn is_lock_unavailable(e: &sqlx::Error) -> bool {
    // 55P03 lock_not_available: what NOWAIT answers when a row is locked.
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("55P03"))
}
