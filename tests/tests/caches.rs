//! The origin's caches under a crowd (issue 18 #5): a sale summary is
//! computed once however many ask at the same moment (single flight), a
//! first sight of a sale id reads Postgres once, and ids nobody sells are
//! remembered in a bounded cache, so random ids cannot grow memory.

use origin::sales::registry::SaleRegistry;
use tests::{TestApp, sale_spec};

/// The value of a counter line in Prometheus text (0 when absent).
fn counter(metrics: &str, line_start: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_and_first_loads_are_single_flight_and_unknown_ids_bounded() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("flight", 10, 2, 4)).await;

    // 64 people open the sale page at once: one computation. (Connections
    // and the sale's config are warmed first, so the 64 really do arrive
    // together at the summary.)
    futures::future::join_all((0..64).map(|_| app.get("/healthz", None))).await;
    app.state.sales.get("flight").await.unwrap().unwrap();
    let answers =
        futures::future::join_all((0..64).map(|_| app.get("/api/sales/flight", None))).await;
    assert!(
        answers
            .iter()
            .all(|(s, b)| *s == 200 && b["sale"] == "flight")
    );
    let computed = counter(
        &app.metrics().await,
        "flashsale_summary_computations_total{sale=\"flight\"}",
    );
    assert!(
        (1.0..=2.0).contains(&computed),
        "64 concurrent requests computed the summary {computed} times (one per 1 s TTL at most)"
    );

    // A replica seeing the sale for the first time: one Postgres load.
    let fresh = SaleRegistry::new(app.state.pool.clone(), app.prefix.clone());
    let before = counter(&app.metrics().await, "flashsale_sale_config_loads_total");
    let got = futures::future::join_all((0..64).map(|_| fresh.get("flight"))).await;
    assert!(got.iter().all(|r| r.as_ref().unwrap().is_some()));
    let loads = counter(&app.metrics().await, "flashsale_sale_config_loads_total") - before;
    assert_eq!(
        loads, 1.0,
        "64 concurrent first sights loaded the config {loads} times"
    );

    // Junk ids: answered "no such sale", remembered within the bound.
    let bounded =
        SaleRegistry::with_first_load_capacity(app.state.pool.clone(), app.prefix.clone(), 100);
    let junk: Vec<String> = (0..600).map(|i| format!("junk-{i}")).collect();
    for chunk in junk.chunks(8) {
        let got = futures::future::join_all(chunk.iter().map(|id| bounded.get(id))).await;
        assert!(got.iter().all(|r| r.as_ref().unwrap().is_none()));
    }
    let kept = bounded.first_loads_cached().await;
    assert!(kept <= 100, "{kept} unknown ids kept, bound 100");
    app.stop().await;
}
