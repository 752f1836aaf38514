//! The edge's `/api/` routes as an OpenAPI 3.1 document, generated with
//! utoipa on the host (this module is not in the Wasm build: the Worker
//! never serves it, and utoipa is a host-only dependency).
//!
//! The Worker's handlers are Wasm glue that the host cannot compile, so
//! each operation is described here on a stand-in function named after the
//! [`crate::api::routes::Route`] it documents. That is hand-written, so it is kept
//! honest by edge/tests/openapi.rs: every operation in the document, with
//! sample ids in its path, must route ([`crate::api::routes::route`]) to a served
//! route for its method; every `/api/` route variant must be documented
//! (an exhaustive match, so a new variant cannot be forgotten); and
//! `docs/openapi/edge.json` must be [`json`]'s output byte for byte.
//!
//! Reservation calls are forwarded to the origin, whose document
//! (docs/openapi/origin.json) details their answers; the edge adds `410
//! sold_out` and `410 sku_sold_out` of its own (marked `x-edge-sold-out:
//! 1`), 413 and 503.

#![allow(dead_code)] // schema types and stand-ins are read by the derive only

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flashsale edge",
        version = "1",
        description = "The edge's API (DESIGN.md \"Edge API\"): the sale summary, the fair queue \
            (join, status, receipt, the draw's audit listing), the bot check, and the reservation \
            calls it forwards to the origin once a person is admitted. Errors are always \
            `{\"error\": {\"code\", \"message\"}}`; 429 and 503 carry `Retry-After`. The \
            `/api/dev/` routes exist only in dev mode (`DEV_MODE=1` with a loopback \
            `ORIGIN_URL`), else 404.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        health, ping, summary, join, status, receipt, challenge, draw, metrics, revoke,
        reserve, reservation_get, reservation_cancel, reservation_purchase,
        dev_token, dev_payment, dev_bulk, dev_forget,
    ),
    modifiers(&Security),
    tags(
        (name = "sales", description = "Sale summaries and the draw's audit"),
        (name = "queue", description = "Joining and waiting"),
        (name = "reservations", description = "Forwarded to the origin once admitted"),
        (name = "dev", description = "Dev mode only"),
        (name = "operations", description = "Health and metrics"),
    ),
)]
struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format(
                        "v1.<kid>.<payload>.<sig> (DESIGN.md): a user token (or a JWT user \
                         token), a ticket or an admit token, as each route says",
                    )
                    .build(),
            ),
        );
        components.add_security_scheme(
            "admin_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format(
                        "the secret of one of the worker secret ADMIN_KEYS                          (`id:secret[,id:secret…]`), for operators' routes",
                    )
                    .description(Some(
                        "Operators only: `Authorization: Bearer <secret>` of one of `ADMIN_KEYS`",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as `docs/openapi/edge.json` holds it: pretty JSON and a
/// final newline.
pub fn json() -> String {
    let mut text = document()
        .to_pretty_json()
        .expect("the document always serializes");
    text.push('\n');
    text
}

/// What went wrong.
#[derive(ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable reason: the edge's own (README "API", "Bot
    /// check and join limits"; token codes as `token::TokenError::code()`)
    /// or, on forwarded calls, the origin's (docs/openapi/origin.json).
    code: String,
    message: String,
}

/// Every error answer: `{"error": {"code", "message"}}`.
#[derive(ToSchema)]
pub struct ErrorBody {
    error: ErrorDetail,
}

/// `GET /api/health`.
#[derive(ToSchema)]
pub struct Health {
    ok: bool,
    /// Always `edge`.
    service: String,
    time_ms: u64,
    dev_mode: bool,
    /// Why a requested dev mode is ignored (a non-loopback `ORIGIN_URL`).
    dev_mode_refused: Option<String>,
}

/// The origin's summary (docs/openapi/origin.json `SaleSummary`) with the
/// edge's queue figures, the draw's commitment (and seed, key, beacon once
/// known) and whether it is a stale copy served while the origin fails.
#[derive(ToSchema)]
pub struct Summary {
    sale: String,
    name: String,
    units_total: i64,
    units_available: i64,
    sold_out: bool,
    /// upcoming, live, sold_out or ended.
    phase: String,
    /// Queue figures (entrants, admitted, frontier…).
    #[schema(value_type = Object)]
    queue: serde_json::Value,
    /// commitment, entrants, entrants_root, beacon, seed, key (each once
    /// known), and where to audit it.
    #[schema(value_type = Object)]
    draw: serde_json::Value,
    /// A copy kept from before the origin shed or failed.
    stale: bool,
    /// What the sale sells (docs/openapi/origin.json `SkuSummary`): id,
    /// name, price, units left, limit, sold out.
    #[schema(value_type = Vec<Object>)]
    skus: serde_json::Value,
}

/// A join's bot-check proof (an empty body carries none).
#[derive(ToSchema)]
pub struct JoinBody {
    /// A challenge from `GET …/challenge`.
    challenge: Option<String>,
    /// Decimal (a string or a non-negative integer): `SHA-256(challenge ":"
    /// nonce)` starts with `difficulty` zero bits.
    #[schema(value_type = Option<String>)]
    nonce: Option<String>,
    /// A Turnstile token (sales with `--bot-check turnstile`).
    turnstile: Option<String>,
}

/// A person's place and what to do next.
#[derive(ToSchema)]
pub struct QueueStatus {
    /// The person's place in the queue: send it back as `Bearer` to poll.
    ticket: String,
    /// prequeue, drawing, waiting, admitted, paused, sold_out or closed.
    status: String,
    /// Absolute place in the sale's order (1 = first), once known.
    place: Option<u64>,
    /// Place counted from the admission frontier (0 once admitted).
    position: Option<u64>,
    /// People still waiting in front.
    ahead: Option<u64>,
    eta_seconds: Option<u64>,
    poll_after_ms: u64,
    starts_at_ms: u64,
    /// Why the status is what it is, when that needs saying.
    reason: Option<String>,
    /// Once admitted: the admit token for the reservation calls.
    admission_token: Option<String>,
    /// Unix seconds.
    admission_expires_at: Option<u64>,
    window_ends_at_ms: Option<u64>,
    /// While waiting: per SKU, whether it is likely left at this person's
    /// turn (docs/skus.md); absent when the edge has no recent summary.
    sku_outlook: Option<Vec<SkuOutlook>>,
}

/// One SKU's outlook for a waiting person.
#[derive(ToSchema)]
pub struct SkuOutlook {
    sku: String,
    /// likely, maybe, unlikely, sold_out or unknown (fewer than 20 admitted).
    band: String,
}

/// The holder's draw receipt (DESIGN.md "The draw, v2" step 6).
#[derive(ToSchema)]
pub struct Receipt {
    account: String,
    /// Lowercase hex.
    leaf: String,
    /// 16 bytes, lowercase hex.
    salt: String,
    leaf_index: u64,
    /// RFC 6962 audit path, bottom-up, lowercase hex.
    audit_path: Vec<String>,
    entrants: u64,
    place: Option<u64>,
}

/// What the sale's bot check asks of a join.
#[derive(ToSchema)]
pub struct Challenge {
    /// none, pow or turnstile.
    kind: String,
    /// pow: the signed challenge (usable once, 5 minutes).
    challenge: Option<String>,
    /// pow: leading zero bits asked.
    difficulty: Option<u32>,
    /// pow: unix seconds.
    expires_at: Option<u64>,
    expires_at_ms: Option<u64>,
    /// turnstile: the widget's site key.
    site_key: Option<String>,
}

/// One place of the draw.
#[derive(ToSchema)]
pub struct DrawEntry {
    place: u64,
    /// Lowercase hex.
    leaf: String,
    /// Lowercase hex.
    value: String,
}

/// `GET …/draw?from=&limit=`: a page of the drawn order. Without `from`
/// the answer is the draw's published state instead (commitment, root,
/// seed, key…).
#[derive(ToSchema)]
pub struct DrawListing {
    entries: Vec<DrawEntry>,
}

/// A reservation's body (checked by the origin).
#[derive(ToSchema)]
pub struct ReserveBody {
    /// The SKU (an `id` of the summary's `skus`); may be left out on a
    /// sale of one SKU.
    sku: Option<String>,
    #[schema(minimum = 1)]
    qty: i64,
}

/// The origin's answer to a forwarded call (docs/openapi/origin.json).
#[derive(ToSchema)]
#[schema(value_type = Object)]
pub struct Forwarded(serde_json::Value);

/// `POST /api/dev/token`.
#[derive(ToSchema)]
pub struct DevTokenBody {
    /// 1-64 letters, digits, `-` or `_` (trimmed).
    name: String,
}

/// A user token for a typed name.
#[derive(ToSchema)]
pub struct DevToken {
    user_token: String,
    sub: String,
    /// Unix seconds.
    exp: u64,
}

/// `POST /api/dev/sales/{sale}/bulk`: synthetic entrants `prefix-i`.
#[derive(ToSchema)]
pub struct DevBulkBody {
    prefix: String,
    from: u64,
    /// At most `from + 50000` (`crate::api::bodies::BULK_MAX`).
    to: u64,
}

/// Entrants added.
#[derive(ToSchema)]
pub struct DevBulk {
    added: u64,
    shards: u32,
}

/// The isolate's memory caches were dropped.
#[derive(ToSchema)]
pub struct DevForget {
    forgotten: bool,
}

/// Route::Health.
#[utoipa::path(get, path = "/api/health", tag = "operations",
    responses((status = 200, description = "Alive", body = Health)))]
fn health() {}

/// Route::Ping: a plain-text baseline for benchmarks.
#[utoipa::path(get, path = "/api/ping", tag = "operations",
    responses((status = 200, description = "`pong`", body = String, content_type = "text/plain")))]
fn ping() {}

/// Route::Summary.
#[utoipa::path(get, path = "/api/sales/{sale}", tag = "sales",
    params(("sale" = String, Path, description = "The sale id", example = "drop-1")),
    responses(
        (status = 200, description = "The summary, at most 1 s old (a stale copy is marked)", body = Summary),
        (status = 404, description = "`sale_not_found`, `not_found` (an id that is not one)", body = ErrorBody),
        (status = 503, description = "`origin_unavailable`", body = ErrorBody),
    ))]
fn summary() {}

/// Route::Join.
#[utoipa::path(post, path = "/api/sales/{sale}/queue", tag = "queue",
    params(
        ("sale" = String, Path, description = "The sale id", example = "drop-1"),
        ("x-queue-ticket" = Option<String>, Header, description = "a ticket already held: answered from it, no new join or bot check"),
    ),
    request_body(content = JoinBody, content_type = "application/json", description = "the bot-check proof, when the sale asks for one"),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Joined (idempotent per account): the status and the ticket", body = QueueStatus),
        (status = 400, description = "`malformed_json`, `bad_nonce`", body = ErrorBody),
        (status = 401, description = "`token_*`: a user token is required", body = ErrorBody),
        (status = 403, description = "`bot_check_required`, `bot_check_failed`, `challenge_expired`, `challenge_reused`, `challenge_invalid`", body = ErrorBody),
        (status = 404, description = "`sale_not_found`", body = ErrorBody),
        (status = 413, description = "`body_too_large`: a bot-check body over 1 KiB (by its Content-Length, or while read)", body = ErrorBody),
        (status = 429, description = "`too_many_joins` (`Retry-After: 60`)", body = ErrorBody),
        (status = 503, description = "`bot_check_unavailable`, `queue_unavailable`, `origin_unavailable`", body = ErrorBody),
    ))]
fn join() {}

/// Route::Status.
#[utoipa::path(get, path = "/api/sales/{sale}/queue", tag = "queue",
    params(("sale" = String, Path, description = "The sale id", example = "drop-1")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The status (with `admission_token` once admitted)", body = QueueStatus),
        (status = 401, description = "`token_*`: a ticket is required", body = ErrorBody),
        (status = 403, description = "`token_wrong_sale`", body = ErrorBody),
        (status = 404, description = "`sale_not_found`", body = ErrorBody),
        (status = 503, description = "`queue_unavailable`", body = ErrorBody),
    ))]
fn status() {}

/// Route::Receipt.
#[utoipa::path(get, path = "/api/sales/{sale}/queue/receipt", tag = "queue",
    params(("sale" = String, Path, description = "The sale id", example = "drop-1")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The holder's leaf, salt and audit path", body = Receipt),
        (status = 401, description = "`token_*`: a ticket is required", body = ErrorBody),
        (status = 404, description = "`not_in_draw`, `sale_not_found`", body = ErrorBody),
        (status = 409, description = "`not_drawn`, `not_frozen`: not yet", body = ErrorBody),
        (status = 503, description = "`queue_unavailable`", body = ErrorBody),
    ))]
fn receipt() {}

/// Route::Challenge.
#[utoipa::path(get, path = "/api/sales/{sale}/challenge", tag = "queue",
    params(("sale" = String, Path, description = "The sale id", example = "drop-1")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "What the sale's bot check asks", body = Challenge),
        (status = 401, description = "`token_*`: a user token is required", body = ErrorBody),
        (status = 404, description = "`sale_not_found`", body = ErrorBody),
    ))]
fn challenge() {}

/// Route::Draw.
#[utoipa::path(get, path = "/api/sales/{sale}/draw", tag = "sales",
    params(
        ("sale" = String, Path, description = "The sale id", example = "drop-1"),
        ("from" = Option<u64>, Query, description = "first place (1 or more)", minimum = 1),
        ("limit" = Option<u64>, Query, description = "places in the page", minimum = 1),
    ),
    responses(
        (status = 200, description = "A page of the drawn order (with `from`), else the draw's published state", body = DrawListing),
        (status = 400, description = "`bad_request`: from/limit out of range", body = ErrorBody),
        (status = 404, description = "`sale_not_found`", body = ErrorBody),
        (status = 409, description = "`not_drawn`", body = ErrorBody),
        (status = 503, description = "`queue_unavailable`", body = ErrorBody),
    ))]
fn draw() {}

/// Route::Metrics.
#[utoipa::path(get, path = "/api/sales/{sale}/metrics", tag = "operations",
    params(("sale" = String, Path, description = "The sale id", example = "drop-1")),
    security(("admin_key" = [])),
    responses(
        (status = 200, description = "The sale's admission figures, Prometheus text", body = String, content_type = "text/plain; version=0.0.4"),
        (status = 401, description = "`admin_key_required`: no admin key, or not one of `ADMIN_KEYS` (checked before anything else)", body = ErrorBody),
        (status = 404, description = "`sale_not_found`", body = ErrorBody),
        (status = 500, description = "`config_error`: `ADMIN_KEYS` is malformed", body = ErrorBody),
    ))]
fn metrics() {}

/// Route::Revoke.
#[utoipa::path(post, path = "/api/sales/{sale}/revoke", tag = "operations",
    params(("sale" = String, Path, description = "The sale id", example = "drop-1")),
    security(("admin_key" = [])),
    request_body(content = Object, description = "`{\"account\": \"<account>\"}`: whose admission ends", content_type = "application/json"),
    responses(
        (status = 200, description = "The account's shard ended the turn; the coordinator passes it on with the shard's next report (about a second)", body = Object),
        (status = 400, description = "`malformed_json`", body = ErrorBody),
        (status = 401, description = "`admin_key_required`", body = ErrorBody),
        (status = 403, description = "`admin_scope`: a read key", body = ErrorBody),
        (status = 404, description = "`sale_not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_body`: no valid account", body = ErrorBody),
        (status = 500, description = "`config_error`: `ADMIN_KEYS` is malformed", body = ErrorBody),
    ))]
fn revoke() {}

/// Route::Reserve.
#[utoipa::path(post, path = "/api/sales/{sale}/reservations", tag = "reservations",
    params(
        ("sale" = String, Path, description = "The sale id", example = "drop-1"),
        ("Idempotency-Key" = String, Header, description = "1-200 visible ASCII characters", pattern = "^[!-~]{1,200}$"),
    ),
    request_body(content = ReserveBody, content_type = "application/json"),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Held (the origin's answer)", body = Forwarded),
        (status = 410, description = "`sold_out` (the sale) or `sku_sold_out` (the SKU named; the sale's others may be left) from the edge itself (`x-edge-sold-out: 1`), or the origin's 410", body = ErrorBody),
        (status = 413, description = "`body_too_large` (over 16 KiB)", body = ErrorBody),
        (status = 429, description = "the edge's per-account limiter, or the origin's `overloaded`", body = ErrorBody),
        (status = 503, description = "`origin_unavailable`", body = ErrorBody),
        (status = "4XX", description = "the origin's refusals (docs/openapi/origin.json)", body = ErrorBody),
    ))]
fn reserve() {}

/// Route::ReservationGet.
#[utoipa::path(get, path = "/api/reservations/{id}", tag = "reservations",
    params(("id" = String, Path, description = "The reservation id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The origin's answer", body = Forwarded),
        (status = 503, description = "`origin_unavailable`", body = ErrorBody),
        (status = "4XX", description = "the origin's refusals", body = ErrorBody),
    ))]
fn reservation_get() {}

/// Route::ReservationCancel.
#[utoipa::path(delete, path = "/api/reservations/{id}", tag = "reservations",
    params(("id" = String, Path, description = "The reservation id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The origin's answer", body = Forwarded),
        (status = 503, description = "`origin_unavailable`", body = ErrorBody),
        (status = "4XX", description = "the origin's refusals", body = ErrorBody),
    ))]
fn reservation_cancel() {}

/// Route::ReservationPurchase.
#[utoipa::path(post, path = "/api/reservations/{id}/purchase", tag = "reservations",
    params(
        ("id" = String, Path, description = "The reservation id"),
        ("Idempotency-Key" = Option<String>, Header, description = "optional"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Payment started (the origin's answer)", body = Forwarded),
        (status = 200, description = "The payment already under way", body = Forwarded),
        (status = 413, description = "`body_too_large`", body = ErrorBody),
        (status = 503, description = "`origin_unavailable`", body = ErrorBody),
        (status = "4XX", description = "the origin's refusals", body = ErrorBody),
    ))]
fn reservation_purchase() {}

/// Route::DevToken.
#[utoipa::path(post, path = "/api/dev/token", tag = "dev",
    request_body(content = DevTokenBody, content_type = "application/json"),
    responses(
        (status = 200, description = "A user token for the name", body = DevToken),
        (status = 400, description = "`malformed_json`", body = ErrorBody),
        (status = 404, description = "`not_found`: not dev mode", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_name`", body = ErrorBody),
    ))]
fn dev_token() {}

/// Route::DevPayment.
#[utoipa::path(post, path = "/api/dev/payments/{id}/complete", tag = "dev",
    params(("id" = String, Path, description = "The payment id")),
    responses(
        (status = 200, description = "The origin's dev provider's answer", body = Forwarded),
        (status = 404, description = "`not_found`: not dev mode; the origin's `payment_not_found`", body = ErrorBody),
        (status = "4XX", description = "the origin's refusals", body = ErrorBody),
    ))]
fn dev_payment() {}

/// Route::DevBulk.
#[utoipa::path(post, path = "/api/dev/sales/{sale}/bulk", tag = "dev",
    params(("sale" = String, Path, description = "The sale id", example = "drop-1")),
    request_body(content = DevBulkBody, content_type = "application/json"),
    responses(
        (status = 200, description = "Loaded into the sale's queue shards", body = DevBulk),
        (status = 400, description = "`malformed_json`", body = ErrorBody),
        (status = 404, description = "`not_found`: not dev mode; `sale_not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `bad_request` (prefix, range)", body = ErrorBody),
    ))]
fn dev_bulk() {}

/// Route::DevForget.
#[utoipa::path(post, path = "/api/dev/isolate/forget", tag = "dev",
    responses(
        (status = 200, description = "Forgotten", body = DevForget),
        (status = 404, description = "`not_found`: not dev mode", body = ErrorBody),
    ))]
fn dev_forget() {}
