//! Issue 21 #9: hold lifetimes follow Redis's clock, not the origins'. Two
//! origins share one Redis; one of them runs with its clock 700 s ahead
//! (libfaketime), as a badly synchronised host would. Its expiry sweep must
//! not take the other origin's 600 s holds early, and the holds it grants
//! itself must expire 600 s after Redis's now, not its own.

use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use origin::ops::workers::Workers;
use tests::{AppOptions, OriginProcess, TestApp, parse_time, sale_spec};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_origin"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_with_a_skewed_clock_neither_expires_holds_early_nor_late() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "libfaketime is missing: scripts/setup installs Debian's faketime"
    );
    // The in-process origin (true clock) grants a hold; its own sweep is off.
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers {
            sweep: false,
            reconcile: false,
            ..Workers::ALL
        },
        ..AppOptions::default()
    })
    .await;
    app.create_sale(sale_spec("skew", 10, 2, 2)).await;
    let token = app.admit("early", "skew");
    let (s, b, _) = app
        .reserve("skew", Some(&token), Some("k"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202, "{b}");
    let id = b["reservation_id"].as_str().unwrap().to_string();

    // A second origin whose clock runs 700 s ahead, sweeping every 100 ms.
    let skewed = OriginProcess::start(
        bin(),
        &app,
        &[
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", "+700s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ("SWEEP_INTERVAL_MS", "100"),
        ],
    )
    .await;
    // The skewed origin's tokens would be "from the future" for this test's
    // clock; it verifies them with a 5 s skew allowance, so mint its token
    // with its own notion of now.
    let late = token::Claims::new(
        token::TokenType::Admit,
        "late",
        Some("skew".into()),
        tests::now_secs() + 700,
        120,
    );
    let late = app.admission_keys.sign(&late);
    let (s, b) = skewed.reserve("skew", &late, "k").await;
    assert_eq!(s, 202, "{b}\n{}", skewed.log());
    let expires = parse_time(b["expires_at"].as_str().unwrap());
    let lifetime = (expires - Utc::now()).num_seconds();
    assert!(
        (590..=610).contains(&lifetime),
        "a hold granted by the skewed origin lives {lifetime} s by Redis's clock, not 600"
    );

    // Several of its sweeps later, the first hold is still held.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        app.redis_hold_ids("skew").await.contains(&id),
        "the skewed origin's sweep took a hold 599 s early:\n{}",
        skewed.log()
    );
    let (s, b) = app
        .get(&format!("/api/reservations/{id}"), Some(&token))
        .await;
    assert_eq!((s, b["status"].as_str()), (200, Some("settled")), "{b}");
    app.stop().await;
}
