//! docs/openapi/edge.json is the edge's route table, checked on the host:
//! the committed file is `edge::api::openapi::json()` byte for byte; every
//! operation in it routes ([`edge::api::route`]) to a served route for its
//! method; and every `/api/` route is in it.
//!
//! To rewrite the file after a change: `EDGE_OPENAPI_WRITE=1 cargo test -p
//! edge --test openapi`.
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeSet;
use std::path::PathBuf;

use edge::api::routes::{Route, route};

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi/edge.json")
}

/// Which documented route a variant is; `None` for what is not an `/api/`
/// route. Exhaustive on purpose: a new variant does not compile here until
/// it is classified (and so documented, or said not to be).
fn documented(r: &Route) -> Option<&'static str> {
    Some(match r {
        Route::Health => "Health",
        Route::Ping => "Ping",
        Route::Summary(_) => "Summary",
        Route::Join(_) => "Join",
        Route::Status(_) => "Status",
        Route::Challenge(_) => "Challenge",
        Route::Draw(_) => "Draw",
        Route::Receipt(_) => "Receipt",
        Route::Metrics(_) => "Metrics",
        Route::Revoke(_) => "Revoke",
        Route::Reserve(_) => "Reserve",
        Route::ReservationGet(_) => "ReservationGet",
        Route::ReservationCancel(_) => "ReservationCancel",
        Route::ReservationPurchase(_) => "ReservationPurchase",
        Route::DevToken => "DevToken",
        Route::DevPayment(_) => "DevPayment",
        Route::DevBulk(_) => "DevBulk",
        Route::DevForget => "DevForget",
        // The queue page (HTML, not under /api/) and the two refusals.
        Route::Page(_) | Route::MethodNotAllowed | Route::NotFound => return None,
    })
}

const ALL_API_ROUTES: [&str; 18] = [
    "Health",
    "Ping",
    "Summary",
    "Join",
    "Status",
    "Challenge",
    "Draw",
    "Receipt",
    "Metrics",
    "Revoke",
    "Reserve",
    "ReservationGet",
    "ReservationCancel",
    "ReservationPurchase",
    "DevToken",
    "DevPayment",
    "DevBulk",
    "DevForget",
];

#[test]
fn the_committed_document_is_the_generated_one() {
    let generated = edge::api::openapi::json();
    if std::env::var_os("EDGE_OPENAPI_WRITE").is_some() {
        std::fs::write(committed_path(), &generated).unwrap();
    }
    let committed = std::fs::read_to_string(committed_path()).unwrap();
    assert!(
        generated == committed,
        "docs/openapi/edge.json is stale: EDGE_OPENAPI_WRITE=1 cargo test -p edge --test openapi"
    );
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
}

#[test]
fn every_documented_operation_is_routed_and_every_api_route_documented() {
    let doc: serde_json::Value = serde_json::from_str(&edge::api::openapi::json()).unwrap();
    let mut seen = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        assert!(path.starts_with("/api/"), "{path}");
        // Sample ids: a sale id, and a reservation id as the origin makes them.
        let concrete = path
            .replace("{sale}", "drop-1")
            .replace("{id}", "drop-1.0.0190f1b2c3d4");
        for method in item.as_object().unwrap().keys() {
            let m = method.to_ascii_uppercase();
            let r = route(&m, &concrete);
            let name = documented(&r)
                .unwrap_or_else(|| panic!("{m} {path} is documented but routes to {r:?}"));
            assert!(seen.insert(name), "{name} is documented twice");
        }
    }
    let all: BTreeSet<&str> = ALL_API_ROUTES.into_iter().collect();
    assert_eq!(seen, all, "every /api/ route is documented, once");
}
