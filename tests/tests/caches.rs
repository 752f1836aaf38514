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
    let got = futures::future::join_all((0..64).map(|_| fresh.get("flight"))).await;
    assert!(got.iter().all(|r| r.as_ref().unwrap().is_some()));
    // The registry's own count (the metric is the process's: the other
    // test of this binary moves it too).
    let loads = fresh.first_loads_sent();
    assert_eq!(
        loads, 1,
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

/// Issue 43 #8: requests for sale ids nobody sells must not take Postgres
/// from the requests that need it. A request that carries a token is
/// checked first (no config load for a missing or wrong token), and first
/// loads of unknown ids are bounded: while Postgres is slow to answer them,
/// a payment webhook still gets a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sale_ids_cost_no_load_before_auth_and_never_starve_webhooks() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("guarded", 5, 1, 1)).await;
    let (_, t, pay) = app.reserve_and_purchase("guarded", "pia").await;

    // Token first: junk ids with no token, or another sale's token, load nothing.
    // This app's registry's own count: the metric is the whole process's,
    // which the other test of this binary moves too.
    let loads = || async { app.state.sales.first_loads_sent() as f64 };
    let before = loads().await;
    for i in 0..40 {
        let sale = format!("nosale-{i}");
        let token = (i % 2 == 1).then_some(t.as_str());
        let (s, _, _) = app.reserve(&sale, token, Some("k"), r#"{"qty":1}"#).await;
        assert!(s == 401 || s == 403, "{sale}: {s}");
        let (s, _) = app
            .get(
                &format!("/api/reservations/nosale-{i}.0.{}", "ab".repeat(16)),
                token,
            )
            .await;
        assert!(
            s == 401 || s == 403 || s == 404,
            "reservation of {sale}: {s}"
        );
    }
    assert_eq!(
        loads().await - before,
        0.0,
        "no config load before the token check"
    );

    // Postgres stalls on the sales table; anonymous summaries of junk ids pile up.
    let mut lock = app.state.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE sales IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let flood = {
        let (client, addr) = (app.client.clone(), app.addr.clone());
        tokio::spawn(async move {
            futures::future::join_all((0..200).map(|i| {
                let (client, addr) = (client.clone(), addr.clone());
                async move {
                    let r = client
                        .get(format!("{addr}/api/sales/junk-{i}"))
                        .send()
                        .await
                        .expect("request sent");
                    r.status().as_u16()
                }
            }))
            .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (s, r) = app
        .payment_event("evt_f", "payment.failed", &pay, 4_999)
        .await;
    lock.rollback().await.unwrap();
    assert_eq!(
        (s, r["result"].as_str()),
        (200, Some("failed")),
        "the webhook gets a connection while junk ids wait: {r}"
    );
    let statuses = flood.await.unwrap();
    assert!(
        statuses.iter().all(|s| *s == 404 || *s == 503),
        "junk ids answer 404, or 503 while loads are bounded: {statuses:?}"
    );
    app.stop().await;
}
