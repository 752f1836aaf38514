//! Graceful shutdown of the real `origin` binary: SIGTERM in the middle of
//! a reservation race, and a stop that outlasts its grace. Invariants 1, 3
//! and 4 across a restart: every hold a client was told about is in Redis
//! and, once settled, in Postgres exactly once; nothing is left pending on
//! the stopped worker; the units add up.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use origin::ops::workers::Workers;
use origin::sales::sale::Sale;
use redis::AsyncCommands;
use tests::{AppOptions, OriginProcess, TestApp, heavy, sale_spec};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_origin"))
}

/// The test's handle on Postgres and Redis: an in-process origin with no
/// workers, whose HTTP port nobody uses.
async fn control() -> TestApp {
    TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..AppOptions::default()
    })
    .await
}

async fn sale(app: &TestApp, id: &str) -> Arc<Sale> {
    app.state.sales.get(id).await.unwrap().unwrap()
}

async fn postgres_holds(app: &TestApp, id: &str) -> HashSet<String> {
    sqlx::query_scalar("SELECT id FROM reservations WHERE sale_id = $1 AND status = 'settled'")
        .bind(id)
        .fetch_all(&app.state.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Entries read by some consumer and not yet acknowledged, over all shards.
async fn pending(app: &TestApp, s: &Sale) -> i64 {
    let mut conn = app.redis().await;
    let mut n = 0;
    for k in &s.shards {
        let summary: redis::Value = redis::cmd("XPENDING")
            .arg(&k.stream)
            .arg(origin::reserve::store::GROUP)
            .query_async(&mut conn)
            .await
            .unwrap();
        if let redis::Value::Array(parts) = summary
            && let Some(redis::Value::Int(count)) = parts.first()
        {
            n += count;
        }
    }
    n
}

/// Consumers registered in the settlement groups, over all shards.
async fn consumers(app: &TestApp, s: &Sale) -> usize {
    let mut conn = app.redis().await;
    let mut n = 0;
    for k in &s.shards {
        let list: Vec<redis::Value> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(&k.stream)
            .arg(origin::reserve::store::GROUP)
            .query_async(&mut conn)
            .await
            .unwrap();
        n += list.len();
    }
    n
}

async fn wait_drained(app: &TestApp, s: &Sale, origin: &OriginProcess) {
    for _ in 0..400 {
        if origin::settle::settler::lag(&app.state.engine, s)
            .await
            .unwrap()
            == 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("settlement did not drain:\n{}", origin.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_reservation_race_loses_nothing() {
    let _heavy = heavy().await;
    let app = control().await;
    app.create_sale(sale_spec("term", 5_000, 2, 4)).await;
    let mut first = OriginProcess::start(bin(), &app, &[("SETTLE_CLAIM_IDLE_MS", "1000")]).await;

    // 3,000 accounts × 2 requests, 64 at a time; SIGTERM after 600 answers.
    let answered = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let tokens: Vec<String> = (0..3_000)
        .map(|a| app.admit(&format!("acct-{a}"), "term"))
        .collect();
    let race = {
        let answered = answered.clone();
        let addr = first.addr.clone();
        futures::stream::iter((0..6_000).map(move |i| {
            let (client, addr, answered) = (client.clone(), addr.clone(), answered.clone());
            let token = tokens[i / 2].clone();
            async move {
                let res = client
                    .post(format!("{addr}/api/sales/term/reservations"))
                    .bearer_auth(token)
                    .header("Idempotency-Key", format!("k-{i}"))
                    .header("content-type", "application/json")
                    .body(r#"{"qty":1}"#)
                    .send()
                    .await;
                // A refused connection after the stop is an answer too: the
                // client knows it holds nothing.
                let Ok(res) = res else { return None };
                answered.fetch_add(1, Ordering::Relaxed);
                let status = res.status().as_u16();
                let body: serde_json::Value = res.json().await.unwrap_or_default();
                Some((status, body))
            }
        }))
        .buffer_unordered(64)
        .collect::<Vec<_>>()
    };
    let stopper = async {
        while answered.load(Ordering::Relaxed) < 600 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        first.sigterm();
        first.exit_within(Duration::from_secs(10)).await
    };
    let (results, (status, took)) = tokio::join!(race, stopper);
    let log = first.log();
    assert!(status.success(), "exit {status:?} after {took:?}:\n{log}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(log.contains("origin stopped"), "{log}");

    let mut told: HashSet<String> = HashSet::new();
    let mut refused_connections = 0;
    for r in &results {
        match r {
            Some((202, body)) => {
                told.insert(body["reservation_id"].as_str().unwrap().to_string());
            }
            Some((status, body)) => panic!("unexpected answer {status} {body}"),
            None => refused_connections += 1,
        }
    }
    assert!(told.len() >= 600, "{} holds told", told.len());
    assert!(
        refused_connections > 0,
        "the race outlived the process: SIGTERM came too late to test anything"
    );

    // Right after a clean stop: every hold a client was told about is in
    // Redis, and no more; the stopped worker left nothing pending.
    let s = sale(&app, "term").await;
    assert_eq!(app.redis_hold_ids("term").await, told);
    assert_eq!(
        consumers(&app, &s).await,
        0,
        "a clean stop leaves no consumer behind"
    );
    assert_eq!(
        pending(&app, &s).await,
        0,
        "nothing left pending on the stopped worker"
    );

    // After a restart everything settles: Postgres holds exactly what
    // Redis holds, and the units add up on both sides.
    let mut second = OriginProcess::start(bin(), &app, &[]).await;
    wait_drained(&app, &s, &second).await;
    assert_eq!(postgres_holds(&app, "term").await, told);
    let (total, held, sold): (i32, i32, i32) =
        sqlx::query_as("SELECT total, held, sold FROM inventory WHERE sale_id = 'term'")
            .fetch_one(&app.state.pool)
            .await
            .unwrap();
    assert_eq!((total, held, sold), (5_000, told.len() as i32, 0));
    let report =
        origin::settle::reconcile::reconcile_sale(&app.state.engine, &app.state.pool, &s, false)
            .await
            .unwrap();
    assert_eq!((report.lag, report.drift), (0, 0), "{report:?}");
    assert!(report.mismatched_shards.is_empty(), "{report:?}");

    // An idle origin stops at once.
    second.sigterm();
    let (status, took) = second.exit_within(Duration::from_secs(10)).await;
    assert!(
        status.success() && took < Duration::from_secs(3),
        "{status:?} {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_outlasting_the_grace_is_abandoned_and_taken_over() {
    let _heavy = heavy().await;
    let app = control().await;
    app.create_sale(sale_spec("stuck", 100, 2, 1)).await;
    let s = sale(&app, "stuck").await;

    // Hold the inventory row so the settler's batch blocks inside its
    // transaction, as it would on a stalled Postgres.
    let mut blocker = app.state.pool.begin().await.unwrap();
    sqlx::query("SELECT * FROM inventory WHERE sale_id = 'stuck' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();

    let mut first = OriginProcess::start(
        bin(),
        &app,
        &[
            ("ORIGIN_SHUTDOWN_GRACE_MS", "1500"),
            ("SETTLE_CLAIM_IDLE_MS", "500"),
        ],
    )
    .await;
    let mut told = HashSet::new();
    for a in 0..20 {
        let (status, body) = first
            .reserve(
                "stuck",
                &app.admit(&format!("acct-{a}"), "stuck"),
                &format!("k-{a}"),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        told.insert(body["reservation_id"].as_str().unwrap().to_string());
    }
    // Wait until the worker has read the entries (they are pending on it).
    for _ in 0..200 {
        if pending(&app, &s).await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(pending(&app, &s).await > 0, "{}", first.log());

    first.sigterm();
    let (status, took) = first.exit_within(Duration::from_secs(10)).await;
    let log = first.log();
    assert_eq!(
        status.code(),
        Some(1),
        "exit after the grace is a failure:\n{log}"
    );
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(log.contains("shutdown grace ran out"), "{log}");

    // The abandoned batch rolled back: nothing in Postgres, entries still
    // pending in the stream for the next worker.
    blocker.rollback().await.unwrap();
    assert!(postgres_holds(&app, "stuck").await.is_empty());
    assert!(pending(&app, &s).await > 0);
    assert_eq!(
        consumers(&app, &s).await,
        1,
        "a consumer with pending entries stays"
    );

    let mut second = OriginProcess::start(bin(), &app, &[("SETTLE_CLAIM_IDLE_MS", "500")]).await;
    wait_drained(&app, &s, &second).await;
    assert_eq!(postgres_holds(&app, "stuck").await, told);
    assert_eq!(app.redis_hold_ids("stuck").await, told);
    let held: i32 = sqlx::query_scalar("SELECT held FROM inventory WHERE sale_id = 'stuck'")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_eq!(held, 20, "each abandoned entry settled exactly once");
    second.sigterm();
    assert!(
        second
            .exit_within(Duration::from_secs(10))
            .await
            .0
            .success()
    );
    assert_eq!(
        consumers(&app, &s).await,
        1,
        "the dead worker's emptied consumer stays; the clean one left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_flushes_the_outbox() {
    let _heavy = heavy().await;
    let app = control().await;
    let mut origin = OriginProcess::start(bin(), &app, &[]).await;
    // Let the relay settle into its idle pause, then add events and stop at
    // once: only the flush on the way out can publish them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlx::query(
        "INSERT INTO outbox (event_id, type, payload)
         SELECT 'evt-' || g, 'test.event', '{}' FROM generate_series(1, 150) g",
    )
    .execute(&app.state.pool)
    .await
    .unwrap();
    origin.sigterm();
    let (status, _) = origin.exit_within(Duration::from_secs(10)).await;
    assert!(status.success(), "{}", origin.log());
    let unpublished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(&app.state.pool)
            .await
            .unwrap();
    assert_eq!(unpublished, 0, "{}", origin.log());
    let mut conn = app.redis().await;
    let published: i64 = conn.xlen(format!("{}:events", app.prefix)).await.unwrap();
    assert_eq!(published, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settle_worker_alone_stops_cleanly_on_sigterm() {
    let _heavy = heavy().await;
    let app = control().await;
    app.create_sale(sale_spec("solo", 100, 2, 2)).await;
    let t = app.admit("solo-1", "solo");
    assert_eq!(
        app.reserve("solo", Some(&t), Some("k"), r#"{"qty":1}"#)
            .await
            .0,
        202
    );
    let mut worker = OriginProcess::spawn(bin(), &app, &["settle"], &[]);
    let s = sale(&app, "solo").await;
    wait_drained(&app, &s, &worker).await;
    assert_eq!(postgres_holds(&app, "solo").await.len(), 1);
    worker.sigterm();
    let (status, took) = worker.exit_within(Duration::from_secs(10)).await;
    assert!(
        status.success() && took < Duration::from_secs(3),
        "{status:?} {took:?}:\n{}",
        worker.log()
    );
}
