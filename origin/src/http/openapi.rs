//! The origin's HTTP API as an OpenAPI 3.1 document, generated from the
//! code with utoipa: the paths from the `#[utoipa::path]` attributes on the
//! handlers in `crate::http::routes`, the request bodies from the types that
//! read them (`crate::http::bodies`, `crate::payments::webhook::Event`), the
//! answers from the types of `crate::http::api`, and the error codes from
//! [`crate::http::error::ERROR_CODES`].
//!
//! Invariants kept here:
//! - `docs/openapi/origin.json` is [`json`]'s output byte for byte
//!   (`origin openapi` prints it; origin/tests/cli.rs fails when the two
//!   differ), so the checked-in document cannot go stale;
//! - the document describes what a live origin answers: `scripts/test-api`
//!   runs schemathesis with it against one (every status, header and body
//!   must conform, no 5xx), so an answer type of `crate::http::api` that
//!   drifts from the handler's JSON is a failing test, not a wrong document.

use utoipa::openapi::ServerBuilder;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::http::api::ErrorCode;

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
