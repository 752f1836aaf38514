//! The origin's load signal (issue 13 #1): what the edge's admission
//! controller follows. Reservation answers carry it compactly
//! (`x-origin-load`), the sale summary in full (`health`); a burst past a
//! small in-flight limit shows up as a shed share, quiet selling as none.

use tests::{AppOptions, TestApp, sale_spec};

fn field(header: &str, name: &str) -> f64 {
    header
        .split(';')
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in {header}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheds_and_latency_reach_the_edge_with_the_answers_and_the_summary() {
    // Quiet selling: accepted, nothing shed.
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("calm", 100, 2, 2)).await;
    for i in 0..20 {
        let t = app.admit(&format!("c{i}"), "calm");
        let (s, _, h) = app
            .reserve("calm", Some(&t), Some("k"), r#"{"qty":1}"#)
            .await;
        assert_eq!(s, 202);
        let load = h["x-origin-load"].to_str().unwrap().to_string();
        assert_eq!(field(&load, "shed"), 0.0, "{load}");
    }
    let (_, summary) = app.get("/api/sales/calm", None).await;
    let health = &summary["health"];
    assert!(health["accepted_per_s"].as_f64().unwrap() > 0.0, "{health}");
    assert_eq!(health["shed_share"], 0.0);
    assert!(health["p99_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(health["units_available"], 80);
    assert!(health["settlement_lag"].as_i64().is_some());
    app.stop().await;

    // A burst past max_in_flight = 1: some are shed, and the signal says so.
    let app = TestApp::spawn_with(AppOptions {
        max_in_flight: 1,
        ..AppOptions::default()
    })
    .await;
    app.create_sale(sale_spec("busy", 1_000, 2, 2)).await;
    let answers = futures::future::join_all((0..64).map(|i| {
        let t = app.admit(&format!("b{i}"), "busy");
        let app = &app;
        async move {
            app.reserve("busy", Some(&t), Some("k"), r#"{"qty":1}"#)
                .await
        }
    }))
    .await;
    let shed = answers.iter().filter(|(s, _, _)| *s == 429).count();
    assert!(shed > 0, "the burst was shed in part");
    let (_, _, h) = app
        .reserve(
            "busy",
            Some(&app.admit("late", "busy")),
            Some("k"),
            r#"{"qty":1}"#,
        )
        .await;
    let load = h["x-origin-load"].to_str().unwrap().to_string();
    let (_, summary) = app.get("/api/sales/busy", None).await;
    let share = summary["health"]["shed_share"].as_f64().unwrap();
    let expected = shed as f64 / 65.0;
    assert!(
        (share - expected).abs() < 0.02,
        "shed share {share} vs {shed} of 65 answers ({load})"
    );
    app.stop().await;
}

/// Issue 13 #3: `origin sale update --paused true|false` and
/// `--admission-p99-ms` reach the summary the edge follows (within the
/// origin's config TTL); bad values are refused and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_the_p99_target_are_published_in_the_summary() {
    use origin::sales::spec::{SaleChange, SaleSpec, change_sale};
    let app = TestApp::spawn().await;
    app.create_sale(SaleSpec {
        admission_p99_ms: 80.0,
        ..sale_spec("pausable", 10, 1, 1)
    })
    .await;
    let (_, summary) = app.get("/api/sales/pausable", None).await;
    assert_eq!(summary["paused"], false, "{summary}");
    assert_eq!(summary["admission_p99_ms"], 80.0);
    let pool = &app.state.pool;
    for bad in [0.0, -5.0, f64::NAN, 1e9] {
        let change = SaleChange {
            admission_p99_ms: Some(bad),
            paused: Some(true),
            ..SaleChange::default()
        };
        let err = change_sale(pool, "pausable", &change).await.unwrap_err();
        assert!(err.to_string().contains("--admission-p99-ms"), "{err}");
    }
    let paused = SaleChange {
        paused: Some(true),
        ..SaleChange::default()
    };
    assert!(change_sale(pool, "pausable", &paused).await.unwrap().paused);
    let seen = async {
        loop {
            let (_, s) = app.get("/api/sales/pausable", None).await;
            if s["paused"] == true {
                return s;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    };
    let s = tokio::time::timeout(std::time::Duration::from_secs(10), seen)
        .await
        .expect("the pause reaches the summary within the config TTL");
    assert_eq!(
        s["admission_p99_ms"], 80.0,
        "the refused changes changed nothing"
    );
    let resumed = SaleChange {
        paused: Some(false),
        admission_p99_ms: Some(120.0),
        ..SaleChange::default()
    };
    let c = change_sale(pool, "pausable", &resumed).await.unwrap();
    assert!(!c.paused);
    assert_eq!(c.admission_p99_ms, 120.0);
    app.stop().await;
}
