//! Postgres down during a sale: the origin keeps selling from Redis by the
//! sale config it already has, readiness names Postgres, the settlement
//! backlog waits in the streams, and once Postgres is back it drains so
//! that Postgres holds exactly what Redis granted (invariants 1 and 3).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tests::{TestApp, pg_admin_url, sale_spec};

/// Cuts this test's database off: existing connections are terminated and
/// no new one is allowed, as if its Postgres were unreachable.
async fn postgres_down(app: &TestApp, down: bool) {
    use sqlx::Connection;
    let mut admin = sqlx::PgConnection::connect(&pg_admin_url()).await.unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE {} ALLOW_CONNECTIONS {}",
        app.db.name, !down
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    if down {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&app.db.name)
        .execute(&mut admin)
        .await
        .unwrap();
    }
}

/// One reservation of one unit by `acct-<i>` (key `k-<i>`), which must be
/// granted: its id and how long it took.
async fn reserve_one(app: &TestApp, sale: &str, i: usize) -> (String, Duration) {
    let token = app.admit(&format!("acct-{i}"), sale);
    let t0 = Instant::now();
    let (status, body, _) = app
        .reserve(sale, Some(&token), Some(&format!("k-{i}")), r#"{"qty":1}"#)
        .await;
    assert_eq!(status, 202, "{body}");
    (
        body["reservation_id"].as_str().unwrap().to_string(),
        t0.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selling_goes_on_while_postgres_is_down_and_settles_after() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("pgdown", 100, 2, 2)).await;
    let reserve = |i: usize| reserve_one(&app, "pgdown", i);
    let mut told = HashSet::new();
    told.insert(reserve(0).await.0);

    postgres_down(&app, true).await;
    // Past the config TTL, so that selling relies on the cached config.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    for i in 1..=20 {
        let (id, took) = reserve(i).await;
        assert!(
            took < Duration::from_millis(500),
            "reservation {i} took {took:?}"
        );
        told.insert(id);
    }
    let (status, body) = app.get("/readyz", None).await;
    assert_eq!(status, 503);
    assert_eq!(body["checks"]["postgres"], "unavailable", "{body}");
    let s = app.state.sales.get("pgdown").await.unwrap().unwrap();
    let lag = origin::settle::settler::lag(&app.state.engine, &s)
        .await
        .unwrap();
    assert!(lag >= 20, "the backlog waits in the streams: lag {lag}");

    postgres_down(&app, false).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while origin::settle::settler::lag(&app.state.engine, &s)
        .await
        .unwrap()
        > 0
    {
        assert!(Instant::now() < deadline, "settlement did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settled: HashSet<String> = sqlx::query_scalar(
        "SELECT id FROM reservations WHERE sale_id = 'pgdown' AND status = 'settled'",
    )
    .fetch_all(&app.state.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(settled, told);
    assert_eq!(app.redis_hold_ids("pgdown").await, told);
    let held: i32 = sqlx::query_scalar("SELECT held FROM inventory WHERE sale_id = 'pgdown'")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_eq!(held, 21);
    let (status, _) = app.get("/readyz", None).await;
    assert_eq!(status, 200);
}

/// The edge admits by the sale summary (its admission controller freezes
/// the frontier while the summary does not answer). Postgres down must not
/// look like "origin down": the origin still sells from Redis, so the
/// summary still answers, quickly, with the stock Redis has and the last
/// sold figure Postgres gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_answers_from_redis_while_postgres_is_down() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("pgsum", 100, 2, 2)).await;
    let reserve = |i: usize| reserve_one(&app, "pgsum", i);
    reserve(0).await;
    let (status, body) = app.get("/api/sales/pgsum", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["units_available"], 99);

    postgres_down(&app, true).await;
    for i in 1..=5 {
        reserve(i).await;
    }
    // Past the summary's 1 s cache, so it is computed anew without Postgres.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for _ in 0..3 {
        let t0 = Instant::now();
        let (status, body) = app.get("/api/sales/pgsum", None).await;
        let took = t0.elapsed();
        assert_eq!(
            status, 200,
            "the summary answers while Postgres is down: {body}"
        );
        assert!(
            took < Duration::from_millis(500),
            "the summary took {took:?}: the edge would read it as a silent origin"
        );
        assert_eq!(body["units_available"], 94, "{body}");
        assert_eq!(body["sold_out"], false);
        assert!(body["health"].is_object(), "{body}");
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    postgres_down(&app, false).await;
}
