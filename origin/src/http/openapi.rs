//! The origin's HTTP API as an OpenAPI 3.1 document, generated from the
//! code with utoipa: the paths from the `#[utoipa::path]` attributes on the
//! handlers in `crate::http::routes`, the request bodies from the types that read
//! them (`crate::http::bodies`, `crate::payments::webhook::Event`), the answers from the
//! types below, and the error codes from [`crate::http::error::ERROR_CODES`].
//!
//! Invariants kept here:
//! - `docs/openapi/origin.json` is [`json`]'s output byte for byte
//!   (`origin openapi` prints it; origin/tests/cli.rs fails when the two
//!   differ), so the checked-in document cannot go stale;
//! - the document describes what a live origin answers: `scripts/test-api`
//!   runs schemathesis with it against one (every status, header and body
//!   must conform, no 5xx), so an answer type here that drifts from the
//!   handler's JSON is a failing test, not a wrong document.

use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, ServerBuilder};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use crate::http::error::ERROR_CODES;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flashsale origin",
        version = "1",
        description = "The origin's HTTP API (DESIGN.md \"Origin API\"): reservations on sharded \
            Redis stock, Postgres as the truth, payments. The edge forwards the reservation \
            calls; browsers never call the origin directly. Errors are always \
            `{\"error\": {\"code\", \"message\"}}`; 429 and 503 carry `Retry-After`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        crate::http::routes::sales::summary,
        crate::http::routes::reservations::create,
        crate::http::routes::reservations::show,
        crate::http::routes::reservations::cancel,
        crate::http::routes::payments::purchase,
        crate::http::routes::payments::webhook,
        crate::http::routes::payments::dev_complete,
        crate::http::routes::health::healthz,
        crate::http::routes::health::readyz,
        crate::http::routes::health::metrics,
    ),
    components(schemas(ErrorCode)),
    modifiers(&Security),
    tags(
        (name = "sales", description = "Sale summaries"),
        (name = "reservations", description = "Holds on units, and their purchase"),
        (name = "payments", description = "The payment provider's side"),
        (name = "operations", description = "Liveness, readiness, metrics"),
    ),
)]
struct ApiDoc;

/// The security schemes the paths name: `bearer` (an `admit` token, or a
/// `user` token where the path says so) and `payment_signature` (the
/// provider's `Payment-Signature: t=…,v1=…`).
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("v1.<kid>.<payload>.<sig> (DESIGN.md), or a JWT user token")
                    .build(),
            ),
        );
        components.add_security_scheme(
            "payment_signature",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "Payment-Signature",
                "t=<unix>,v1=<hex HMAC-SHA256(secret, \"<t>.<body>\")>, 5-minute tolerance",
            ))),
        );
        openapi.servers = Some(vec![
            ServerBuilder::new()
                .url("http://127.0.0.1:8080")
                .description(Some("ORIGIN_ADDR's default"))
                .build(),
        ]);
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as `docs/openapi/origin.json` holds it: pretty JSON and a
/// final newline.
pub fn json() -> String {
    let mut text = document()
        .to_pretty_json()
        .expect("the document always serializes");
    text.push('\n');
    text
}

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
    health: Health,
    queue: QueueLayout,
    /// `none`, `pow:<bits>` or `turnstile`.
    bot_check: String,
    /// Joins per minute per address.
    join_limit: i32,
    /// ISO 4217.
    currency: String,
    /// The drand-style beacon the draw takes its round from.
    draw_beacon: Option<String>,
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
