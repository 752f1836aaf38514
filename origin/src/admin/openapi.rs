//! The admin API (`/admin/api/` on `ADMIN_ADDR`) as an OpenAPI 3.1
//! document, generated with utoipa: one documented stub per route (the
//! handlers are built by a macro in `routes`), the bodies and answers from
//! the types that read and write them (`control`, `live`, `audit`), and
//! the error codes from [`ADMIN_ERROR_CODES`].
//!
//! Invariants kept here: `docs/openapi/admin.json` is [`json`]'s output
//! byte for byte (`origin openapi --admin`; origin/tests/cli.rs fails when
//! they differ), and `scripts/test-api` runs schemathesis with it against
//! a live admin listener, so the document cannot drift from the answers.
#![allow(dead_code)] // the stubs exist for their attributes only

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, ServerBuilder, Type};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use crate::admin::audit::Entry;
use crate::admin::control::{EditBody, MessageBody, RateBody, RevokeBody};
use crate::admin::error::ADMIN_ERROR_CODES;
use crate::admin::live::{Answered, Frame, Outbox, Queue, Reservations, SkuFigures};
use crate::admin::routes::NoBody;

/// An admin error code.
pub struct AdminErrorCode;

impl PartialSchema for AdminErrorCode {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "Stable machine-readable reason; each refusal has its own.",
            ))
            .enum_values(Some(ADMIN_ERROR_CODES.iter().copied()))
            .into()
    }
}

impl ToSchema for AdminErrorCode {}

/// What went wrong.
#[derive(ToSchema)]
pub struct AdminErrorDetail {
    code: AdminErrorCode,
    /// For people; never carries internals.
    message: String,
}

/// Every admin error answer: `{"error": {"code", "message"}}`.
#[derive(ToSchema)]
pub struct AdminErrorBody {
    error: AdminErrorDetail,
}

/// A sale's settings as an audit entry keeps them.
#[derive(ToSchema)]
pub struct SaleSettings {
    paused: bool,
    admission_rate: f64,
    admission_factor: f64,
    admission_p99_ms: f64,
    #[schema(format = DateTime)]
    starts_at: String,
    #[schema(format = DateTime)]
    ends_at: Option<String>,
    message: Option<String>,
}

/// The answer of a write.
#[derive(ToSchema)]
pub struct WriteAnswer {
    sale: String,
    /// `pause`, `resume`, `rate`, `end`, `message`, `edit`, `revoke`.
    action: String,
    /// The sale's settings after the write (a revoke: the account, whether
    /// it was new, and what the edge said).
    #[schema(value_type = Object)]
    after: serde_json::Value,
}

/// One sale of the list.
#[derive(ToSchema)]
pub struct SaleItem {
    sale: String,
    name: String,
    #[schema(format = DateTime)]
    starts_at: String,
    #[schema(format = DateTime)]
    ends_at: Option<String>,
    paused: bool,
    units_total: i64,
    /// How many SKUs it sells.
    skus: i64,
}

/// `GET sales`.
#[derive(ToSchema)]
pub struct SaleList {
    sales: Vec<SaleItem>,
}

/// `GET audit`.
#[derive(ToSchema)]
pub struct AuditPage {
    entries: Vec<Entry>,
    /// Pass as `before` for the next (older) page; null on the last.
    next_before: Option<i64>,
}

const S: &str = "The sale id";

#[utoipa::path(get, path = "/admin/api/sales", tag = "sales",
    security(("admin_key" = [])),
    responses(
        (status = 200, description = "Every sale, newest start first (at most 1,000)", body = SaleList),
        (status = 401, description = "`admin_key_required`", body = AdminErrorBody),
        (status = 429, description = "`rate_limited`", body = AdminErrorBody, headers(("Retry-After" = u32))),
    ))]
fn list_sales() {}

/// `POST sales`: `origin sale create`'s flags as a JSON object.
#[derive(ToSchema)]
pub struct CreateBody {
    /// The sale id (`[a-z0-9-]`, as `--sale`).
    sale: String,
    name: String,
    /// A sale of one SKU (its id and name the sale's); or `sku`.
    units: Option<i64>,
    /// SKUs, each `id:units:price_cents[:per_user_limit]`.
    sku: Option<Vec<String>>,
    price_cents: Option<i64>,
    per_user_limit: Option<i64>,
    /// RFC 3339, or `now`.
    starts_at: String,
    ends_at: Option<String>,
    shards: Option<i64>,
    queue_shards: Option<i64>,
    hold_seconds: Option<i64>,
    admission_rate: Option<f64>,
    admission_factor: Option<f64>,
    admission_p99_ms: Option<f64>,
    bot_check: Option<String>,
    bot_shadow: Option<bool>,
    join_limit: Option<i64>,
    currency: Option<String>,
    draw_beacon: Option<String>,
}

#[utoipa::path(post, path = "/admin/api/sales", tag = "control",
    request_body = CreateBody,
    security(("admin_key" = [])),
    description = "A new sale: the flags of `origin sale create` (defaults and checks the same); `skus` (a file) is not read here.",
    responses(
        (status = 201, description = "Created (Postgres and the Redis stock), with its audit entry", body = Object),
        (status = 400, description = "`invalid_change` (the flags' own message), `malformed_json`", body = AdminErrorBody),
        (status = 401, description = "`admin_key_required`", body = AdminErrorBody),
        (status = 403, description = "`admin_scope`: a read key", body = AdminErrorBody),
        (status = 409, description = "`sale_exists`", body = AdminErrorBody),
        (status = 429, description = "`rate_limited`", body = AdminErrorBody, headers(("Retry-After" = u32))),
        (status = 503, description = "`database_unavailable`, `redis_unavailable`", body = AdminErrorBody, headers(("Retry-After" = u32))),
    ))]
fn create_sale() {}

#[utoipa::path(get, path = "/admin/api/sales/{sale}", tag = "sales",
    params(("sale" = String, Path, description = S, example = "drop-1")),
    security(("admin_key" = [])),
    responses(
        (status = 200, description = "The sale's configuration, SKUs and phase", body = Object),
        (status = 401, description = "`admin_key_required`", body = AdminErrorBody),
        (status = 404, description = "`sale_not_found`", body = AdminErrorBody),
        (status = 429, description = "`rate_limited`", body = AdminErrorBody, headers(("Retry-After" = u32))),
    ))]
fn show_sale() {}

#[utoipa::path(patch, path = "/admin/api/sales/{sale}", tag = "control",
    params(("sale" = String, Path, description = S, example = "drop-1")),
    request_body = EditBody,
    security(("admin_key" = [])),
    responses(
        (status = 200, description = "Changed (before the start only)", body = WriteAnswer),
        (status = 400, description = "`invalid_change`, `malformed_json`", body = AdminErrorBody),
        (status = 401, description = "`admin_key_required`", body = AdminErrorBody),
        (status = 403, description = "`admin_scope`: a read key", body = AdminErrorBody),
        (status = 404, description = "`sale_not_found`", body = AdminErrorBody),
        (status = 409, description = "`sale_started`: only pause, resume, rate, message, end and revoke after the start", body = AdminErrorBody),
        (status = 429, description = "`rate_limited`", body = AdminErrorBody, headers(("Retry-After" = u32))),
    ))]
fn edit_sale() {}

macro_rules! write_doc {
    ($fn:ident, $path:literal, $body:ty, $what:literal) => {
        #[utoipa::path(post, path = $path, tag = "control",
            params(("sale" = String, Path, description = S, example = "drop-1")),
            request_body = $body,
            security(("admin_key" = [])),
            description = $what,
            responses(
                (status = 200, description = "Applied, with its audit entry", body = WriteAnswer),
                (status = 400, description = "`invalid_change`, `malformed_json`, `message_too_long`", body = AdminErrorBody),
                (status = 401, description = "`admin_key_required`", body = AdminErrorBody),
                (status = 403, description = "`admin_scope`: a read key", body = AdminErrorBody),
                (status = 404, description = "`sale_not_found`", body = AdminErrorBody),
                (status = 429, description = "`rate_limited`", body = AdminErrorBody, headers(("Retry-After" = u32))),
                (status = 503, description = "`database_unavailable`, `redis_unavailable`", body = AdminErrorBody, headers(("Retry-After" = u32))),
            ))]
        fn $fn() {}
    };
}

write_doc!(
    pause,
    "/admin/api/sales/{sale}/pause",
    Option<NoBody>,
    "The edge admits nobody new; places are kept."
);
write_doc!(
    resume,
    "/admin/api/sales/{sale}/resume",
    Option<NoBody>,
    "Admission goes on."
);
write_doc!(
    rate,
    "/admin/api/sales/{sale}/rate",
    RateBody,
    "The admission ceiling (people per second)."
);
write_doc!(
    end,
    "/admin/api/sales/{sale}/end",
    Option<NoBody>,
    "The sale ends now; holds granted stay payable until they expire."
);
write_doc!(
    message,
    "/admin/api/sales/{sale}/message",
    MessageBody,
    "The message every waiting page shows within 5 s, as text; empty takes it down."
);
write_doc!(
    revoke,
    "/admin/api/sales/{sale}/revoke",
    RevokeBody,
    "Ends the account's admission: no new hold; its turn passes on at once at the edge."
);

#[utoipa::path(get, path = "/admin/api/sales/{sale}/live", tag = "live",
    params(("sale" = String, Path, description = S, example = "drop-1")),
    security(("admin_key" = [])),
    responses(
        (status = 200, description = "The sale now (at most about 1 s old)", body = Frame),
        (status = 401, description = "`admin_key_required`", body = AdminErrorBody),
        (status = 404, description = "`sale_not_found`", body = AdminErrorBody),
        (status = 429, description = "`rate_limited`", body = AdminErrorBody, headers(("Retry-After" = u32))),
        (status = 503, description = "`database_unavailable`: no figures yet", body = AdminErrorBody, headers(("Retry-After" = u32))),
    ))]
fn live() {}

#[utoipa::path(get, path = "/admin/api/sales/{sale}/live/stream", tag = "live",
    params(("sale" = String, Path, description = S, example = "drop-1")),
    security(("admin_key" = [])),
    responses(
        (status = 200, description = "Server-Sent Events: `event: frame`, `data:` a Frame as JSON, one a second, until the client leaves", content_type = "text/event-stream", body = String),
        (status = 401, description = "`admin_key_required`", body = AdminErrorBody),
        (status = 404, description = "`sale_not_found`", body = AdminErrorBody),
        (status = 429, description = "`rate_limited`", body = AdminErrorBody, headers(("Retry-After" = u32))),
    ))]
fn live_stream() {}

#[utoipa::path(get, path = "/admin/api/audit", tag = "audit",
    params(crate::admin::routes::AuditQuery),
    security(("admin_key" = [])),
    responses(
        (status = 200, description = "Entries newest first", body = AuditPage),
        (status = 400, description = "`invalid_change`: a bad limit or cursor", body = AdminErrorBody),
        (status = 401, description = "`admin_key_required`", body = AdminErrorBody),
        (status = 429, description = "`rate_limited`", body = AdminErrorBody, headers(("Retry-After" = u32))),
    ))]
fn audit() {}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flashsale admin",
        version = "1",
        description = "The operator's API (issue 47): on its own listener (`ADMIN_ADDR`, never the \
            public port), every call with `Authorization: Bearer <secret>` of `ADMIN_KEYS` \
            (`read` keys read, `write` keys also change), rate-limited per address. Every write, \
            applied or refused, is in the append-only audit log. Errors are always \
            `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(list_sales, create_sale, show_sale, edit_sale, pause, resume, rate, end, message, revoke, live,
          live_stream, audit),
    components(schemas(AdminErrorCode, SaleSettings, Queue, Reservations, SkuFigures, Outbox,
                       Answered)),
    modifiers(&Security),
    tags(
        (name = "sales", description = "Sales and their configuration"),
        (name = "control", description = "Writes: each audited"),
        (name = "live", description = "A sale second by second"),
        (name = "audit", description = "Who did what, when"),
    ),
)]
struct AdminDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("a secret of ADMIN_KEYS (kid:scope:secret)")
                    .build(),
            ),
        );
        openapi.servers = Some(vec![
            ServerBuilder::new()
                .url("http://127.0.0.1:9091")
                .description(Some("ADMIN_ADDR's default"))
                .build(),
        ]);
    }
}

/// The document as `docs/openapi/admin.json` holds it.
pub fn json() -> String {
    let mut text = AdminDoc::openapi()
        .to_pretty_json()
        .expect("the document always serializes");
    text.push('\n');
    text
}
