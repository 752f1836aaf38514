//! The answers of the origin's HTTP API as types, for the OpenAPI document:
//! the handlers (`crate::http::routes`) name them in their
//! `#[utoipa::path]` attributes and the document (`crate::http::openapi`)
//! publishes them; both import them from here, below both.
//!
//! Invariant: each type is the schema of what its handler answers (the
//! handlers build their JSON themselves); `scripts/test-api` checks every
//! answer of a live origin against these schemas, so a drift fails a test.

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::http::error::ERROR_CODES;

/// One of [`ERROR_CODES`]: the document lists them all as an enum.
pub struct ErrorCode;

impl PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "Stable machine-readable reason; each refusal has its own \
                 (README \"API\", DESIGN.md).",
            ))
            .enum_values(Some(ERROR_CODES.iter().copied()))
            .into()
    }
}

impl ToSchema for ErrorCode {}

/// What went wrong.
#[derive(ToSchema)]
#[allow(dead_code)] // a schema only: the answer is built by `ApiError`
pub struct ErrorDetail {
    code: ErrorCode,
    /// For people; never carries internals.
    message: String,
}

/// Every error answer: `{"error": {"code", "message"}}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorBody {
    error: ErrorDetail,
}

/// A reservation's state.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum ReservationStatus {
    Held,
    Settled,
    PendingPayment,
    Paid,
    Expired,
    Cancelled,
    Rejected,
}

/// A reservation (`202` of a hold, and `GET /api/reservations/{id}`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Reservation {
    /// `<sale>.<home shard>.<uuid>`.
    reservation_id: String,
    sale: String,
    /// The SKU held (in a `202` of a hold; a lookup may leave it out).
    #[schema(example = "size-42")]
    sku: Option<String>,
    #[schema(minimum = 1)]
    qty: i64,
    status: ReservationStatus,
    /// RFC 3339: when an unpaid hold returns its units.
    #[schema(format = DateTime)]
    expires_at: String,
}

/// A cancelled hold (its units are back on sale at once).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Cancelled {
    reservation_id: String,
    sale: String,
    #[schema(minimum = 1)]
    qty: i64,
    /// Always `cancelled`.
    #[schema(pattern = "^cancelled$")]
    status: String,
}

/// A payment started for a reservation.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Payment {
    payment_id: String,
    amount_cents: i64,
    /// `pending` until the provider's webhook says otherwise.
    status: String,
    /// The payment provider (`dev` locally).
    provider: String,
    /// Where the buyer pays.
    checkout_url: String,
}

/// The webhook's answer.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct WebhookAnswer {
    received: bool,
    result: crate::payments::saga::Applied,
}

/// The dev provider's answer: what the origin's own webhook said.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct DevCompleteAnswer {
    webhook_status: u16,
    /// The webhook's JSON answer (null when it was not JSON).
    #[schema(value_type = Object, nullable)]
    webhook_answer: Option<serde_json::Value>,
}

/// A sale's phase at the time of the summary.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum Phase {
    Upcoming,
    Live,
    SoldOut,
    Ended,
}

/// The origin's load signal (this replica, the last `window_s` seconds),
/// which the edge's admission controller follows.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Health {
    window_s: u64,
    requests_per_s: f64,
    accepted_per_s: f64,
    shed_share: f64,
    error_share: f64,
    p99_ms: f64,
    /// Settlement stream entries not yet in Postgres.
    settlement_lag: i64,
    units_available: i64,
}

/// The sale's queue layout at the edge.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct QueueLayout {
    /// Queue shards (Durable Objects).
    shards: i32,
}

/// One SKU of a sale, as the summary lists it.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SkuSummary {
    /// Slug, unique in the sale: what a reservation's `sku` names.
    #[schema(example = "size-42")]
    id: String,
    name: String,
    /// In the sale's `currency`, minor units.
    #[schema(minimum = 0)]
    price_cents: i64,
    #[schema(minimum = 1)]
    units_total: i64,
    /// Units still for sale (not held, not sold).
    #[schema(minimum = 0)]
    units_available: i64,
    /// Units one account may hold and buy of this SKU (the sale's
    /// `per_user_limit` applies too); none: only the sale's.
    per_user_limit: Option<i32>,
    sold_out: bool,
}

/// A sale summary (cached in process for at most 1 s).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SaleSummary {
    sale: String,
    name: String,
    price_cents: i64,
    #[schema(format = DateTime)]
    starts_at: String,
    #[schema(format = DateTime)]
    ends_at: Option<String>,
    units_total: i64,
    units_available: i64,
    units_held: i64,
    units_sold: i64,
    /// Postgres did not answer in time: `units_sold` (and `units_held`) is
    /// the last figure it gave.
    units_sold_stale: bool,
    percent_sold: f64,
    sold_out: bool,
    phase: Phase,
    per_user_limit: i32,
    hold_seconds: i32,
    admission_rate: f64,
    admission_factor: f64,
    admission_p99_ms: f64,
    paused: bool,
    /// The operator's message to every waiting page: plain text (shown as
    /// text, never as markup), at most 280 characters; null: none.
    message: Option<String>,
    /// When the message was posted.
    message_at: Option<String>,
    health: Health,
    queue: QueueLayout,
    /// `none`, `pow:<bits>` or `turnstile`.
    bot_check: String,
    /// A join that fails the bot check gets a place in a shadow queue that
    /// never moves up, instead of an error.
    bot_shadow: bool,
    /// Joins per minute per address.
    join_limit: i32,
    /// ISO 4217.
    currency: String,
    /// The drand-style beacon the draw takes its round from.
    draw_beacon: Option<String>,
    /// What the sale sells, in the operator's order.
    skus: Vec<SkuSummary>,
}

/// `GET /healthz`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Alive {
    /// Always `ok`.
    status: String,
}

/// One dependency's state.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum CheckState {
    Ok,
    Unavailable,
}

/// Redis and Postgres, each checked.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Checks {
    redis: CheckState,
    postgres: CheckState,
}

/// `GET /readyz` when both answer.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Ready {
    /// Always `ready`.
    status: String,
    checks: Checks,
}

/// `GET /readyz` when one is down: the error (`not_ready`) and the checks.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct NotReady {
    error: ErrorDetail,
    checks: Checks,
}
