//! Defects the chaos runs found (`scripts/chaos`, RELIABILITY.md), each as a
//! test of the contract it breaks. They are `#[ignore]`d while the defect
//! stands, so the suite stays green and the defect stays visible:
//! `cargo test -p tests --test chaos_findings -- --ignored` runs them (and
//! fails until the origin is fixed; then drop the `ignore`).

use tests::{TestApp, sale_spec};

/// DESIGN.md, "Idempotency": a replay with the same body gets the first
/// answer. Once the origin's in-process sold-out flag is set, it answers
/// 410 `sold_out` before the engine (where the key's record is) is asked,
/// so a client retrying a request whose 202 it did not receive is told the
/// sale is sold out while its hold is live — it walks away and the unit
/// only comes back at expiry. (A reuse of the key with another qty gets 410
/// instead of 422 the same way.) Seen in every chaos row that sold out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "defect found by scripts/chaos: the sold-out flag answers a replay before the key's record is read"]
async fn a_replay_after_sell_out_gets_its_first_answer() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("replaysold", 1, 1, 1)).await;
    let a = app.admit("acct-a", "replaysold");
    let body = r#"{"qty":1}"#;
    let (status, first, _) = app.reserve("replaysold", Some(&a), Some("k-a"), body).await;
    assert_eq!(status, 202, "{first}");
    // Another account finds the sale sold out: the flag is set.
    let b = app.admit("acct-b", "replaysold");
    let (status, _, _) = app.reserve("replaysold", Some(&b), Some("k-b"), body).await;
    assert_eq!(status, 410);
    let (status, again, _) = app.reserve("replaysold", Some(&a), Some("k-a"), body).await;
    assert_eq!(
        (status, &again["reservation_id"]),
        (202, &first["reservation_id"]),
        "the replay of a held key must get its first answer: {again}"
    );
}

/// `REDIS_ACK=wait` keeps every hold it acknowledged through a failover
/// (tests/tests/failover.rs), but a hold it refused with 503
/// `not_replicated` still happened on the primary, and the settlement worker
/// (reading the primary's stream, not waiting for a replica) writes it into
/// Postgres. When the primary dies, the promoted replica has neither the
/// hold nor its key record: the client's retry of the same Idempotency-Key
/// makes a second hold (two reservations for one key in Postgres), and the
/// first stays `settled` in Postgres for good — Redis never expires it, so
/// Postgres keeps that unit taken while Redis sells it again (the
/// reconciler sees the hold records disagree and leaves the shard to an
/// operator). Seen in the `redis-failover-wait` row of scripts/chaos.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "defect found by scripts/chaos: a 503 not_replicated hold settles into Postgres and outlives a failover"]
async fn a_refused_hold_does_not_outlive_a_failover_in_postgres() {
    use origin::configuration::AckMode;
    use std::time::{Duration, Instant};
    use tests::{AppOptions, SentinelSetup, TestApp, heavy};

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
    // Settled into Postgres although never acknowledged.
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while rows(&app).await.is_empty() {
        assert!(Instant::now() < deadline, "the refused hold never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let old = setup.primary.port;
    setup.primary.kill();
    setup.wait_for_failover(old, Duration::from_secs(20));
    // The client retries its key until the new primary acknowledges.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, answer, _) = app.reserve("ghost", Some(&token), Some("k1"), body).await;
        if status == 202 {
            break;
        }
        assert_eq!(status, 503, "{answer}");
        assert!(
            Instant::now() < deadline,
            "no 202 after the failover: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows = rows(&app).await;
    app.stop().await;
    assert_eq!(
        rows.len(),
        1,
        "one Idempotency-Key, one reservation in Postgres: {rows:?}"
    );
}
