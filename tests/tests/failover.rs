//! Failover and durability (issue 17 part 2): the origin reaches Redis
//! through Sentinel and follows a failover by itself; with `REDIS_ACK=wait`
//! no hold it acknowledged (202) is lost when the primary is killed, and
//! the `local` figure is measured beside it in the same scenario; with no
//! replica, `wait` answers 503 `not_replicated` and a retry with the same
//! Idempotency-Key replays the one hold instead of making a second.
//!
//! Real processes: a primary, replicas (`redis-server --replicaof`) and
//! sentinels on free loopback ports, with short Sentinel timeouts (down
//! after 1 s) so the suite stays within seconds.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use origin::configuration::{AckMode, RedisTarget};
use serde_json::Value;
use tests::{AppOptions, RedisServer, SentinelSetup, TestApp, heavy, sale_spec};

/// 20 reservations of one unit each by `<who>-0..n`, all at once:
/// (account, key, status, body, Retry-After).
async fn burst(
    app: &TestApp,
    sale: &str,
    who: &str,
    n: usize,
) -> Vec<(String, String, u16, Value, Option<String>)> {
    futures::stream::iter(0..n)
        .map(|i| async move {
            let acct = format!("{who}-{i}");
            let key = format!("key-{who}-{i}");
            let token = app.admit(&acct, sale);
            let (status, body, headers) = app
                .reserve(sale, Some(&token), Some(&key), r#"{"qty":1}"#)
                .await;
            let retry = headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            (acct, key, status, body, retry)
        })
        .buffer_unordered(n)
        .collect()
        .await
}

fn granted(results: &[(String, String, u16, Value, Option<String>)]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.2 == 202)
        .map(|r| r.3["reservation_id"].as_str().unwrap().to_string())
        .collect()
}

/// What one kill of the primary came to.
#[derive(Debug)]
struct KillReport {
    /// Holds acknowledged (202) while the replicas had everything.
    acked_in_sync: usize,
    /// Holds acknowledged while no replica could get them.
    acked_cut_off: usize,
    /// Requests answered 503 `not_replicated` (with Retry-After) then.
    refused_cut_off: usize,
    /// Acknowledged holds the new primary does not have.
    lost: usize,
    /// From SIGKILL to the sentinels naming the new primary (printed).
    #[allow(dead_code)]
    failover: Duration,
    /// From SIGKILL to the origin's first 202 on the new primary.
    serving_again: Duration,
}

/// Primary + 2 replicas + 3 sentinels; 20 holds while in sync; then the
/// replicas are cut off and 10 more requests come; then the primary is
/// SIGKILLed. Counts the acknowledged holds the promoted replica lacks,
/// checks the origin serves again by itself, that the retries of the
/// cut-off requests make one hold each, and that every acknowledged hold
/// the new primary has is settled into Postgres.
async fn kill_the_primary(ack: AckMode) -> KillReport {
    let _heavy = heavy().await;
    let mut setup = SentinelSetup::start(2, 3);
    let app = TestApp::spawn_with(AppOptions {
        redis: setup.target(),
        redis_ack: ack,
        ..Default::default()
    })
    .await;
    app.create_sale(sale_spec("fo", 1_000, 2, 4)).await;

    let in_sync = burst(&app, "fo", "a", 20).await;
    assert!(in_sync.iter().all(|r| r.2 == 202), "{in_sync:?}");

    setup.cut_replicas_off();
    let cut_off = burst(&app, "fo", "b", 10).await;
    let refused_cut_off = cut_off
        .iter()
        .filter(|r| r.2 == 503 && r.3["error"]["code"] == "not_replicated" && r.4.is_some())
        .count();

    let old = setup.primary.port;
    let killed = Instant::now();
    setup.primary.kill();
    let new = setup.wait_for_failover(old, Duration::from_secs(20));
    let failover = killed.elapsed();
    assert!(setup.replicas.iter().any(|r| r.port == new));
    assert!(failover < Duration::from_secs(10), "{failover:?}");

    // The origin finds the new primary by itself: keep asking (new keys).
    let mut attempt = 0;
    let serving_again = loop {
        attempt += 1;
        let acct = format!("c-{attempt}");
        let token = app.admit(&acct, "fo");
        let (status, body, _) = app
            .reserve(
                "fo",
                Some(&token),
                Some(&format!("key-{acct}")),
                r#"{"qty":1}"#,
            )
            .await;
        if status == 202 {
            break killed.elapsed();
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "not serving 20 s after the kill: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let on_new: HashSet<String> = app.redis_hold_ids("fo").await;
    let acked: Vec<String> = granted(&in_sync)
        .into_iter()
        .chain(granted(&cut_off))
        .collect();
    let lost = acked.iter().filter(|id| !on_new.contains(*id)).count();

    // The cut-off requests retried with their keys: one hold each, whatever
    // their first answer was.
    let mut retried = Vec::new();
    for (acct, key, ..) in &cut_off {
        let token = app.admit(acct, "fo");
        let (status, body, _) = app
            .reserve("fo", Some(&token), Some(key), r#"{"qty":1}"#)
            .await;
        assert_eq!(status, 202, "{body}");
        retried.push(body["reservation_id"].as_str().unwrap().to_string());
    }
    let per_account = holds_per_account(&app, "fo").await;
    for (acct, ..) in &cut_off {
        assert_eq!(per_account.get(acct), Some(&1), "{acct}: {per_account:?}");
    }

    // Everything the new primary holds of what was acknowledged settles.
    let expected: HashSet<String> = acked
        .iter()
        .filter(|id| on_new.contains(*id))
        .chain(&retried)
        .cloned()
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let rows: Vec<String> = sqlx::query_scalar("SELECT id FROM reservations")
            .fetch_all(&app.state.pool)
            .await
            .unwrap();
        let rows: HashSet<String> = rows.into_iter().collect();
        let missing = expected.difference(&rows).count();
        if missing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} acknowledged holds not settled into Postgres"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.stop().await;
    let report = KillReport {
        acked_in_sync: granted(&in_sync).len(),
        acked_cut_off: granted(&cut_off).len(),
        refused_cut_off,
        lost,
        failover,
        serving_again,
    };
    eprintln!("{ack:?}: {report:?}");
    report
}

/// Live holds per account over every shard of `sale`.
async fn holds_per_account(app: &TestApp, sale: &str) -> HashMap<String, usize> {
    use redis::AsyncCommands;
    let s = app.state.sales.get(sale).await.unwrap().unwrap();
    let mut conn = app.redis().await;
    let mut out = HashMap::new();
    for k in &s.shards {
        let holds: HashMap<String, String> = conn.hgetall(&k.holds).await.unwrap();
        for raw in holds.values() {
            let v: Value = serde_json::from_str(raw).unwrap();
            *out.entry(v["a"].as_str().unwrap().to_string()).or_default() += 1;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_killed_primary_loses_no_acknowledged_hold() {
    let r = kill_the_primary(AckMode::Wait {
        timeout: Duration::from_millis(100),
    })
    .await;
    assert_eq!(r.acked_in_sync, 20);
    // Cut off from every replica, nothing is acknowledged: 503 + Retry-After.
    assert_eq!((r.acked_cut_off, r.refused_cut_off), (0, 10), "{r:?}");
    assert_eq!(r.lost, 0, "{r:?}");
    assert!(r.serving_again < Duration::from_secs(15), "{r:?}");
}

/// The window `wait` closes, measured in the same scenario: with `local`
/// the holds acknowledged while no replica had them die with the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_local_the_holds_acknowledged_past_the_replicas_die_with_the_primary() {
    let r = kill_the_primary(AckMode::Local).await;
    assert_eq!((r.acked_in_sync, r.acked_cut_off), (20, 10), "{r:?}");
    assert_eq!(r.lost, 10, "{r:?}");
    assert!(r.serving_again < Duration::from_secs(15), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_and_no_replica_the_answer_is_503_and_a_retry_replays_the_one_hold() {
    let primary = RedisServer::start_on_free_cluster_port(&["--appendonly", "no"]);
    let app = TestApp::spawn_with(AppOptions {
        redis: RedisTarget::Single(primary.url()),
        redis_ack: AckMode::Wait {
            timeout: Duration::from_millis(50),
        },
        ..Default::default()
    })
    .await;
    app.create_sale(sale_spec("nr", 10, 2, 2)).await;
    let token = app.admit("alice", "nr");
    let reserve = |key: &'static str| {
        let token = token.clone();
        let app = &app;
        async move {
            app.reserve("nr", Some(&token), Some(key), r#"{"qty":1}"#)
                .await
        }
    };

    for _ in 0..2 {
        let (status, body, headers) = reserve("k1").await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "not_replicated", "{body}");
        assert_eq!(headers["retry-after"], "1");
        // The hold exists on the primary, once, however often it is asked.
        assert_eq!(app.redis_hold_ids("nr").await.len(), 1);
    }
    let first = app.redis_hold_ids("nr").await.into_iter().next().unwrap();

    let replica = RedisServer::start_on_free_cluster_port(&[
        "--replicaof",
        "127.0.0.1",
        &primary.port.to_string(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body, headers) = reserve("k1").await;
        if status == 202 {
            // The first request's hold, acknowledged now: no second one.
            assert_eq!(body["reservation_id"], first.as_str(), "{body}");
            assert_eq!(headers["idempotent-replayed"], "true");
            break;
        }
        assert!(Instant::now() < deadline, "replica never acknowledged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.redis_hold_ids("nr").await.len(), 1);
    let (status, body, _) = reserve("k2").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(app.redis_hold_ids("nr").await.len(), 2);

    // A cancel is acknowledged the same way: without a replica, 503.
    drop(replica);
    let code = app
        .client
        .delete(format!("{}/api/reservations/{first}", app.addr))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(code.status().as_u16(), 503);
    let body: Value = code.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_replicated", "{body}");
    app.stop().await;
}
