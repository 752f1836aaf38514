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
use origin::ops::configuration::{AckMode, RedisTarget};
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
        if Instant::now() >= deadline {
            // Seen once in CI (1 of 10 runs): say what settlement waits on.
            let sale = app.state.sales.get("fo").await.unwrap().unwrap();
            let lag = origin::settle::settler::lag(&app.state.engine, &sale).await;
            let replication = setup.replication_of(new);
            panic!(
                "{missing} acknowledged holds not settled into Postgres 15 s after the \
                 retries; settlement lag {lag:?}; the new primary {new}: {replication}"
            );
        }
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
        connections: 2,
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

/// A primary on a TCP port (replicas can follow it) and an origin on it
/// with `REDIS_ACK=wait`, 50 ms, one ack connection.
async fn waiting_origin() -> (RedisServer, TestApp) {
    let primary = RedisServer::start_on_free_cluster_port(&["--appendonly", "no"]);
    let app = TestApp::spawn_with(AppOptions {
        redis: RedisTarget::Single(primary.url()),
        redis_ack: AckMode::Wait {
            timeout: Duration::from_millis(50),
            connections: 1,
        },
        ..Default::default()
    })
    .await;
    (primary, app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_and_no_replica_the_answer_is_503_and_a_retry_replays_the_one_hold() {
    let (primary, app) = waiting_origin().await;
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
    // Retries `key` as a client told 503 does, until a replica has
    // acknowledged it (10 s at most; until then every answer is 503
    // not_replicated); returns the 202's body and headers.
    let acknowledged = |key: &'static str| {
        let reserve = &reserve;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (status, body, headers) = reserve(key).await;
                if status == 202 {
                    return (body, headers);
                }
                assert_eq!(body["error"]["code"], "not_replicated", "{body}");
                assert!(
                    Instant::now() < deadline,
                    "replica never acknowledged {key}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let (body, headers) = acknowledged("k1").await;
    // The first request's hold, acknowledged now: no second one.
    assert_eq!(body["reservation_id"], first.as_str(), "{body}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(app.redis_hold_ids("nr").await.len(), 1);
    // A new key with the replica attached. Its WAIT has 50 ms, which a
    // replica on a loaded machine can miss (seen once in CI): then it is
    // retried like k1. However often it is retried, the key makes one hold.
    acknowledged("k2").await;
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

/// The barrier script (`lua/ack.lua`) never acknowledges what the primary
/// does not show, whatever the replica says: after a failover a hold may
/// exist only on the dead primary, and WAIT on the new one proves nothing
/// about it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acknowledger_confirms_only_what_the_primary_shows() {
    use origin::reserve::ack::{AckError, Acker, Fact, FactKind};
    use redis::AsyncCommands;
    let primary = RedisServer::start_on_free_cluster_port(&["--appendonly", "no"]);
    let _replica = RedisServer::start_on_free_cluster_port(&[
        "--replicaof",
        "127.0.0.1",
        &primary.port.to_string(),
    ]);
    let target = RedisTarget::Single(primary.url());
    // The timeout bounds how long a round waits for the replica's WAIT;
    // this test is about what the primary shows, not about time. With 500 ms
    // the round below once timed out (NotReplicated for all five) while the
    // other tests of this file started their servers (2026-12-04).
    let acker = Acker::start(target.clone(), Duration::from_secs(5), 2);
    let keys = origin::reserve::store::ShardKeys::new("ackt", "ackt/s/0");
    let mut conn = origin::reserve::store::connect(&target).await.unwrap();
    let _: () = conn
        .hset(&keys.holds, "h1", r#"{"a":"x","q":1,"s":"held"}"#)
        .await
        .unwrap();
    let _: () = conn
        .hset(&keys.holds, "h2", r#"{"a":"x","q":1,"s":"paid"}"#)
        .await
        .unwrap();
    let fact = |id: &str, kind| Fact::new(&keys, id, kind);
    // The replica may still be syncing: the first answers can be NotReplicated.
    let deadline = Instant::now() + Duration::from_secs(10);
    while acker.confirm(fact("h1", FactKind::Held)).await.is_err() {
        assert!(Instant::now() < deadline, "the replica never acknowledged");
    }
    let (a, b, c, d, e) = tokio::join!(
        acker.confirm(fact("h2", FactKind::Paid)),
        acker.confirm(fact("h3", FactKind::Gone)),
        acker.confirm(fact("h3", FactKind::Held)),
        acker.confirm(fact("h1", FactKind::Paid)),
        acker.confirm(fact("h1", FactKind::Gone)),
    );
    assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
    for not in [c, d, e] {
        assert!(matches!(not, Err(AckError::NotShown)), "{not:?}");
    }
}

/// A payment's confirm is acknowledged like a hold: with no replica the
/// webhook answers 503 `not_replicated`, the confirm is undone (the hold
/// `held` again, in the expiry index) and nothing is recorded, so the
/// provider's redelivery of the same event, once a replica is back, pays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_payment_confirm_no_replica_has_is_undone_and_redelivery_pays() {
    use redis::AsyncCommands;
    let (primary, app) = waiting_origin().await;
    let replica_of = |port: u16| {
        RedisServer::start_on_free_cluster_port(&["--replicaof", "127.0.0.1", &port.to_string()])
    };
    let replica = replica_of(primary.port);
    app.create_sale(sale_spec("pw", 5, 2, 1)).await;
    let token = app.admit("pia", "pw");
    let deadline = Instant::now() + Duration::from_secs(10);
    let id = loop {
        let (status, body, _) = app
            .reserve("pw", Some(&token), Some("k"), r#"{"qty":1}"#)
            .await;
        if status == 202 {
            break body["reservation_id"].as_str().unwrap().to_string();
        }
        assert!(Instant::now() < deadline, "never acknowledged: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, p) = app.purchase(&id, &token).await;
    assert_eq!(status, 201, "{p}");
    let event = serde_json::json!({"id": "evt_w1", "type": "payment.succeeded",
        "data": {"payment_id": p["payment_id"], "amount_cents": 4_999}})
    .to_string();
    let sign = || {
        Some(origin::payments::webhook::sign_webhook(
            tests::WEBHOOK_SECRET,
            tests::now_secs(),
            event.as_bytes(),
        ))
    };
    let s = app.state.sales.get("pw").await.unwrap().unwrap();
    let mut conn = app.redis().await;
    let hold_status = async |conn: &mut origin::reserve::store::RedisConn| {
        let raw: String = conn.hget(&s.shards[0].holds, &id).await.unwrap();
        serde_json::from_str::<Value>(&raw).unwrap()["s"]
            .as_str()
            .unwrap()
            .to_string()
    };

    drop(replica);
    let (status, body) = app.webhook(&event, sign()).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "not_replicated", "{body}");
    assert_eq!(
        hold_status(&mut conn).await,
        "held",
        "the confirm is undone"
    );
    let in_expiry: Option<f64> = conn.zscore(&s.shards[0].exp, &id).await.unwrap();
    assert!(in_expiry.is_some(), "back in the expiry index");
    let (pay, res): (String, String) = sqlx::query_as(
        "SELECT p.status, r.status FROM payments p JOIN reservations r ON r.id = p.reservation_id WHERE r.id = $1",
    )
    .bind(&id)
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert_eq!((pay.as_str(), res.as_str()), ("pending", "pending_payment"));

    let _replica = replica_of(primary.port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = app.webhook(&event, sign()).await;
        if status == 200 {
            assert_eq!(body["result"], "paid", "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "never paid: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(hold_status(&mut conn).await, "paid");
    app.stop().await;
}

/// Found by scripts/chaos (the `redis-failover-wait` row, RELIABILITY.md):
/// `REDIS_ACK=wait` keeps every hold it acknowledged through a failover,
/// but a hold it refused with 503 `not_replicated` still happened on the
/// primary, and the settlement worker (reading the primary's stream without
/// waiting for a replica) wrote it into Postgres. When the primary died, the
/// promoted replica had neither the hold nor its key record: the client's
/// retry of the same Idempotency-Key made a second hold (two reservations
/// for one key in Postgres), and the first stayed `settled` for good. The
/// settler now commits a batch only once a replica has its entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_hold_does_not_outlive_a_failover_in_postgres() {
    let _heavy = heavy().await;
    let mut setup = SentinelSetup::start(2, 3);
    let app = TestApp::spawn_with(AppOptions {
        redis: setup.target(),
        redis_ack: AckMode::Wait {
            timeout: Duration::from_millis(100),
            connections: 1,
        },
        ..Default::default()
    })
    .await;
    app.create_sale(sale_spec("ghost", 10, 2, 1)).await;
    let token = app.admit("alice", "ghost");
    let body = r#"{"qty":1}"#;

    setup.cut_replicas_off();
    let (status, answer, _) = app.reserve("ghost", Some(&token), Some("k1"), body).await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (503, &"not_replicated".into())
    );
    let rows = |app: &TestApp| {
        let pool = app.state.pool.clone();
        async move {
            sqlx::query_as::<_, (String, String)>(
                "SELECT id, status FROM reservations WHERE sale_id = 'ghost' ORDER BY id",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    // The settler has its chance to write the refused hold (it writes a
    // hold within milliseconds when it may).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let before_kill = rows(&app).await;

    let old = setup.primary.port;
    setup.primary.kill();
    setup.wait_for_failover(old, Duration::from_secs(20));
    // The client retries its key until the new primary acknowledges.
    let deadline = Instant::now() + Duration::from_secs(30);
    let held = loop {
        let (status, answer, _) = app.reserve("ghost", Some(&token), Some("k1"), body).await;
        if status == 202 {
            break answer["reservation_id"].as_str().unwrap().to_string();
        }
        assert_eq!(status, 503, "{answer}");
        assert!(
            Instant::now() < deadline,
            "no 202 after the failover: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Settling waits for a replica of the new primary. Under load the
    // sentinels may fail over once more (a false "down"), and the demoted
    // node rejoins as a replica only after the failover timeout (4 s) and a
    // resync: time the settler must wait, not a reason to fail.
    let deadline = Instant::now() + Duration::from_secs(30);
    while rows(&app).await.iter().all(|(id, _)| *id != held) {
        assert!(
            Instant::now() < deadline,
            "the acknowledged hold never settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = rows(&app).await;
    app.stop().await;
    assert_eq!(
        before_kill,
        vec![],
        "a hold no replica had was written to Postgres"
    );
    assert_eq!(
        rows,
        vec![(held, "settled".to_string())],
        "one Idempotency-Key, one reservation in Postgres"
    );
}

/// With `REDIS_ACK=wait` the settler writes to Postgres only what a replica
/// has: with none, a hold (refused 503) stays out of Postgres, its entry
/// pending; once a replica has caught up it settles, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_the_settler_commits_a_hold_only_once_a_replica_has_it() {
    let (primary, app) = waiting_origin().await;
    app.create_sale(sale_spec("sw", 10, 2, 1)).await;
    let token = app.admit("sam", "sw");
    let (status, body, _) = app
        .reserve("sw", Some(&token), Some("k"), r#"{"qty":1}"#)
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("not_replicated"))
    );
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM reservations")
            .fetch_one(&app.state.pool)
            .await
            .unwrap()
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(count().await, 0, "settled although no replica has it");
    let _replica = RedisServer::start_on_free_cluster_port(&[
        "--replicaof",
        "127.0.0.1",
        &primary.port.to_string(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count().await == 0 {
        assert!(Instant::now() < deadline, "never settled once replicated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The client's retry with its key replays the one hold, now replicated.
    // Each answer waits for its own `WAIT` (50 ms here), which a loaded
    // machine can miss (the replica not scheduled in time): then 503 again,
    // and the client retries, as the answer tells it to.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body, _) = app
            .reserve("sw", Some(&token), Some("k"), r#"{"qty":1}"#)
            .await;
        if status == 202 {
            break;
        }
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (503, Some("not_replicated")),
            "{body}"
        );
        assert!(Instant::now() < deadline, "no 202 once replicated: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(count().await, 1);
    app.stop().await;
}

/// With `REDIS_ACK=wait` the relay marks an event published on the Redis
/// stream only once a replica has it. It used to mark on the primary's
/// word: `scripts/chaos`' redis-failover-wait row lost 20 events that way
/// (2026-12-06; they were marked, and the failover took them from the
/// stream). With no replica the event stays unpublished (and is sent
/// again, same id); once a replica has caught up, it is marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_the_relay_marks_an_event_published_only_once_a_replica_has_it() {
    let (primary, app) = waiting_origin().await;
    sqlx::query(
        "INSERT INTO outbox (event_id, type, payload)
         VALUES ('evt_w', 'order.paid', '{\"sale\": \"ew\"}')",
    )
    .execute(&app.state.pool)
    .await
    .unwrap();
    let unpublished = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(&app.state.pool)
            .await
            .unwrap()
    };
    // The relay has run (it is on the stream) but has not marked it.
    let mut conn = app.redis().await;
    let stream = format!("{}:events", app.prefix);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n: usize = redis::AsyncCommands::xlen(&mut conn, &stream)
            .await
            .unwrap();
        if n > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the relay never published");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(unpublished().await, 1, "marked although no replica has it");
    let _replica = RedisServer::start_on_free_cluster_port(&[
        "--replicaof",
        "127.0.0.1",
        &primary.port.to_string(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while unpublished().await > 0 {
        assert!(Instant::now() < deadline, "never marked once replicated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}

/// Issue 43 #3: with `REDIS_ACK=wait`, a replay of a key whose hold has
/// been released since (cancelled here; expired or rejected alike) was
/// checked as "the hold exists", which it never will again: 503
/// `not_replicated` forever, and the client retried for a day. The replay's
/// answer comes from the key's record, so that record is what a replica
/// must show: the replay gets its first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_replay_after_the_hold_is_released_gets_its_first_answer() {
    let (primary, app) = waiting_origin().await;
    let _replica = RedisServer::start_on_free_cluster_port(&[
        "--replicaof",
        "127.0.0.1",
        &primary.port.to_string(),
    ]);
    app.create_sale(sale_spec("gonekey", 10, 2, 2)).await;
    let token = app.admit("gina", "gonekey");
    // Until a replica acknowledges (it may still be syncing), 503 not_replicated.
    let until_acknowledged = |key: &'static str| {
        let (app, token) = (&app, token.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (status, body, headers) = app
                    .reserve("gonekey", Some(&token), Some(key), r#"{"qty":1}"#)
                    .await;
                if status == 202 {
                    return (body, headers);
                }
                assert_eq!(
                    (status, &body["error"]["code"]),
                    (503, &Value::from("not_replicated")),
                    "{body}"
                );
                assert!(
                    Instant::now() < deadline,
                    "{key} never acknowledged: {body}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let (first, _) = until_acknowledged("k1").await;
    let id = first["reservation_id"].as_str().unwrap().to_string();
    // A cancel answered 503 `not_replicated` has released the hold all the
    // same: its retry finds no hold (404 before the settler wrote the row,
    // 409 after). Either way the hold is gone from Redis.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut told_503 = false;
    loop {
        let code = app.cancel(&id, &token).await;
        if code == 200 || (told_503 && (code == 404 || code == 409)) {
            break;
        }
        assert_eq!(code, 503);
        told_503 = true;
        assert!(
            Instant::now() < deadline,
            "the cancel was never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(app.redis_hold_ids("gonekey").await.is_empty());
    let (again, headers) = until_acknowledged("k1").await;
    assert_eq!(again["reservation_id"], first["reservation_id"], "{again}");
    assert_eq!(headers["idempotent-replayed"], "true");
    app.stop().await;
}
