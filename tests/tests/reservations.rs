//! The reservation path against real Redis (single and a 3-master cluster)
//! and real Postgres, over real HTTP: races, idempotency, expiry, bad input,
//! Redis outages.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use origin::ops::configuration::RedisTarget;
use origin::ops::workers::Workers;
use redis::AsyncCommands;
use serde_json::Value;
use tests::{AppOptions, RaceResult, RedisCluster, RedisServer, TestApp, race, sale_spec};
use token::{Claims, KeyRing, TokenType};

/// The settlement worker consumes the streams; these tests look at them.
const NO_SETTLE: Workers = Workers {
    settle: false,
    sweep: true,
    reconcile: false,
    relay: true,
};

/// What Redis holds for the sale after the race, checked against the answers.
async fn check_redis_after_race(app: &TestApp, sale: &str, r: &RaceResult) {
    let total: i64 = r.granted.values().sum();
    assert_eq!(total, 1_000, "every unit sold, none twice");
    assert!(r.granted.values().all(|q| *q <= 2), "per-user limit kept");
    assert_eq!(r.refusals.values().sum::<usize>() + r.ids.len(), 20_000);
    let cfg = app.state.sales.get(sale).await.unwrap().unwrap();
    let mut conn = app.redis().await;
    let mut held_ids = HashSet::new();
    let mut held_units = 0i64;
    let mut per_user: HashMap<String, i64> = HashMap::new();
    let mut stream_holds = HashSet::new();
    for k in &cfg.shards {
        let stock: i64 = conn.get(&k.stock).await.unwrap();
        assert_eq!(stock, 0, "sold out means every shard is empty");
        let holds: HashMap<String, String> = conn.hgetall(&k.holds).await.unwrap();
        for (id, raw) in holds {
            let h: Value = serde_json::from_str(&raw).unwrap();
            held_units += h["q"].as_i64().unwrap();
            held_ids.insert(id);
        }
        let users: HashMap<String, i64> = conn.hgetall(&k.users).await.unwrap();
        for (a, n) in users {
            *per_user.entry(a).or_default() += n;
        }
        let entries: redis::streams::StreamRangeReply = conn.xrange_all(&k.stream).await.unwrap();
        for e in entries.ids {
            let t: String = e.get("t").unwrap();
            assert_eq!(t, "hold");
            let id: String = e.get("id").unwrap();
            assert!(stream_holds.insert(id), "one stream record per hold");
        }
    }
    assert_eq!(held_units, 1_000);
    assert_eq!(held_ids, r.ids, "every 202 has a hold, every hold a 202");
    assert_eq!(stream_holds, r.ids, "every hold has its settlement record");
    for (acct, n) in &r.granted {
        assert_eq!(
            per_user.get(acct),
            Some(n),
            "count of {acct} matches its holds"
        );
    }
    assert_eq!(per_user.values().sum::<i64>(), 1_000, "no stray quota left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_on_one_redis_sells_exactly_the_units() {
    let app = TestApp::spawn_with(AppOptions {
        workers: NO_SETTLE,
        ..Default::default()
    })
    .await;
    let r = race(&app, "race").await;
    check_redis_after_race(&app, "race", &r).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_on_a_three_master_cluster_sells_exactly_the_units() {
    let cluster = RedisCluster::start();
    let app = TestApp::spawn_with(AppOptions {
        redis: RedisTarget::Cluster(cluster.seeds()),
        workers: NO_SETTLE,
        ..Default::default()
    })
    .await;
    let r = race(&app, "crace").await;
    check_redis_after_race(&app, "crace", &r).await;
    let spread = cluster.keys_per_node(&format!("{}:*:stock", app.prefix));
    assert_eq!(spread.iter().sum::<usize>(), 4);
    assert!(
        spread.iter().filter(|n| **n > 0).count() >= 2,
        "shards spread over at least 2 masters: {spread:?}"
    );
    // 4 shards on 3 masters: the slot-aware tags give 2/1/1.
    assert!(spread.iter().all(|n| *n <= 2), "{spread:?}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_fifty_times_concurrently_is_one_hold() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("idem", 10, 2, 2)).await;
    let token = app.admit("alice", "idem");
    let answers: Vec<(u16, Value, reqwest::header::HeaderMap)> = futures::future::join_all(
        (0..50).map(|_| app.reserve("idem", Some(&token), Some("same-key"), r#"{"qty":1}"#)),
    )
    .await;
    let ids: HashSet<String> = answers
        .iter()
        .map(|(s, b, _)| {
            assert_eq!(*s, 202, "{b}");
            b["reservation_id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids.len(), 1, "one reservation for one key");
    let replays = answers
        .iter()
        .filter(|(_, _, h)| h.get("idempotent-replayed").is_some())
        .count();
    assert_eq!(replays, 49);
    let (_, summary) = app.get("/api/sales/idem", None).await;
    assert_eq!(summary["units_available"], 9);
    // A different key is a different reservation; the limit still applies.
    let (s, _, _) = app
        .reserve("idem", Some(&token), Some("k2"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202);
    let (s, b, _) = app
        .reserve("idem", Some(&token), Some("k3"), r#"{"qty":1}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("per_user_limit"))
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_replayed_during_spill_is_one_hold_on_another_shard() {
    // No reconciler: it would rightly repair the stock this test empties
    // behind the product's back (its first pass runs at start, and could
    // land between the tampering and the requests).
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers {
            reconcile: false,
            ..Workers::ALL
        },
        ..AppOptions::default()
    })
    .await;
    let cfg = app.create_sale(sale_spec("spill", 4, 2, 2)).await;
    let home = origin::reserve::engine::home_shard("bob", 2);
    let hk = origin::reserve::store::ShardKeys::new(&app.prefix, &cfg.shard_tags[home]);
    let other = origin::reserve::store::ShardKeys::new(&app.prefix, &cfg.shard_tags[1 - home]);
    let mut conn = app.redis().await;
    // Empty bob's home shard behind the product's back, to force the spill.
    let _: () = conn.set(&hk.stock, 0).await.unwrap();
    let token = app.admit("bob", "spill");
    let answers = futures::future::join_all(
        (0..50).map(|_| app.reserve("spill", Some(&token), Some("k"), r#"{"qty":2}"#)),
    )
    .await;
    let ids: HashSet<&str> = answers
        .iter()
        .map(|(s, b, _)| {
            assert_eq!(*s, 202, "{b}");
            b["reservation_id"].as_str().unwrap()
        })
        .collect();
    assert_eq!(ids.len(), 1);
    let holds: HashMap<String, String> = conn.hgetall(&other.holds).await.unwrap();
    assert_eq!(holds.len(), 1, "one hold, on the other shard");
    let stock: i64 = conn.get(&other.stock).await.unwrap();
    assert_eq!(stock, 0);
    let count: i64 = conn.hget(&hk.users, "bob").await.unwrap();
    assert_eq!(count, 2, "bob's count lives on his home shard");
    // His limit is reached, across shards.
    let (s, b, _) = app
        .reserve("spill", Some(&token), Some("k2"), r#"{"qty":1}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("per_user_limit"))
    );
    // Cancel gives the units back and, via the sweep, bob's count.
    let id = ids.into_iter().next().unwrap().to_string();
    assert_eq!(app.cancel(&id, &token).await, 200);
    let stock: i64 = conn.get(&other.stock).await.unwrap();
    assert_eq!(stock, 2);
    let mut count: Option<i64> = Some(2);
    for _ in 0..100 {
        count = conn.hget(&hk.users, "bob").await.unwrap();
        if count.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(count, None, "quota given back on the home shard");
    let (s, _, _) = app
        .reserve("spill", Some(&token), Some("k3"), r#"{"qty":2}"#)
        .await;
    assert_eq!(s, 202);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holds_sell_again_without_the_sweep() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers {
            settle: false,
            sweep: false,
            reconcile: false,
            relay: true,
        },
        ..Default::default()
    })
    .await;
    let mut spec = sale_spec("exp", 3, 2, 1);
    spec.hold_seconds = 2;
    app.create_sale(spec).await;
    let a = app.admit("ann", "exp");
    let b = app.admit("ben", "exp");
    let c = app.admit("cat", "exp");
    assert_eq!(
        app.reserve("exp", Some(&a), Some("1"), r#"{"qty":2}"#)
            .await
            .0,
        202
    );
    let (s, _, _) = app
        .reserve("exp", Some(&a), Some("2"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 409, "ann is at her limit while she holds 2");
    assert_eq!(
        app.reserve("exp", Some(&b), Some("1"), r#"{"qty":1}"#)
            .await
            .0,
        202
    );
    let (s, body, _) = app
        .reserve("exp", Some(&c), Some("1"), r#"{"qty":1}"#)
        .await;
    assert_eq!((s, body["error"]["code"].as_str()), (410, Some("sold_out")));
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    // No sweep runs: the reservation itself reclaims the expired holds.
    let (s, body, _) = app
        .reserve("exp", Some(&c), Some("2"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202, "{body}");
    let (s, body, _) = app
        .reserve("exp", Some(&a), Some("3"), r#"{"qty":2}"#)
        .await;
    assert_eq!(
        s, 202,
        "ann's count came back with her expired holds: {body}"
    );
    let (_, summary) = app.get("/api/sales/exp", None).await;
    assert_eq!(summary["units_available"], 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_status_and_changes_nothing() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("bad", 10, 2, 2)).await;
    app.create_sale(sale_spec("other", 10, 2, 2)).await;
    let good = app.admit("eve", "bad");
    let now = tests::now_secs();
    let expired = app.admission_keys.sign(&Claims {
        iat: now - 600,
        exp: now - 300,
        ..Claims::new(TokenType::Admit, "eve", Some("bad".into()), now, 1)
    });
    let forged = KeyRing::from_keys(&[("adm1", &[0x13; 32])])
        .unwrap()
        .sign(&Claims::new(
            TokenType::Admit,
            "eve",
            Some("bad".into()),
            now,
            120,
        ));
    let other_sale = app.admit("eve", "other");
    let for_nope = app.admit("eve", "nope");
    let user = app.user("eve");
    let before = app.redis_snapshot().await;
    // (sale, token, Idempotency-Key, body, status, code)
    type Case<'a> = (
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        ("bad", None, Some("k"), r#"{"qty":1}"#, 401, "token_missing"),
        (
            "bad",
            Some("garbage"),
            Some("k"),
            r#"{"qty":1}"#,
            401,
            "token_malformed",
        ),
        (
            "bad",
            Some(&forged),
            Some("k"),
            r#"{"qty":1}"#,
            401,
            "token_bad_signature",
        ),
        (
            "bad",
            Some(&expired),
            Some("k"),
            r#"{"qty":1}"#,
            401,
            "token_expired",
        ),
        (
            "bad",
            Some(&user),
            Some("k"),
            r#"{"qty":1}"#,
            401,
            "token_unknown_kid",
        ),
        (
            "bad",
            Some(&other_sale),
            Some("k"),
            r#"{"qty":1}"#,
            403,
            "token_wrong_sale",
        ),
        (
            "bad",
            Some(&good),
            Some("k"),
            r#"{"qty":0}"#,
            422,
            "invalid_qty",
        ),
        (
            "bad",
            Some(&good),
            Some("k"),
            r#"{"qty":3}"#,
            422,
            "invalid_qty",
        ),
        (
            "bad",
            Some(&good),
            Some("k"),
            r#"{"qty":-1}"#,
            422,
            "invalid_qty",
        ),
        (
            "bad",
            Some(&good),
            Some("k"),
            r#"{"qty":"1"}"#,
            422,
            "invalid_body",
        ),
        (
            "bad",
            Some(&good),
            Some("k"),
            r#"{"qty":1"#,
            400,
            "malformed_json",
        ),
        ("bad", Some(&good), Some("k"), "", 400, "malformed_json"),
        // Issue 17's defects, through HTTP: a JSON array was a body of
        // fields by position, and non-JSON bytes were invalid_body.
        ("bad", Some(&good), Some("k"), "[1]", 422, "invalid_body"),
        ("bad", Some(&good), Some("k"), "0:", 400, "malformed_json"),
        (
            "bad",
            Some(&good),
            None,
            r#"{"qty":1}"#,
            400,
            "idempotency_key_missing",
        ),
        // The token is checked before the sale is looked up (no Postgres
        // for a token of another sale): a token for a sale nobody sells
        // reaches the lookup and its 404; another sale's token is 403.
        (
            "nope",
            Some(&for_nope),
            Some("k"),
            r#"{"qty":1}"#,
            404,
            "sale_not_found",
        ),
        (
            "NOT..valid",
            Some(&good),
            Some("k"),
            r#"{"qty":1}"#,
            403,
            "token_wrong_sale",
        ),
    ];
    for (sale, token, key, body, status, code) in cases {
        let (s, b, _) = app.reserve(sale, token, key, body).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (status, Some(code)),
            "{sale} {body} {key:?}"
        );
        assert!(b["error"]["message"].is_string());
    }
    // Another account's token on a reservation: 403; unknown ids: 404.
    let (s, b, _) = app
        .reserve("bad", Some(&good), Some("real"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202);
    let id = b["reservation_id"].as_str().unwrap();
    let mallory = app.admit("mallory", "bad");
    let (s, b) = app
        .get(&format!("/api/reservations/{id}"), Some(&mallory))
        .await;
    assert_eq!((s, b["error"]["code"].as_str()), (403, Some("forbidden")));
    let (s, b) = app
        .get(&format!("/api/reservations/{id}"), Some(&app.user("eve")))
        .await;
    assert_eq!((s, b["status"].as_str()), (200, Some("held")));
    let (s, _) = app.get("/api/reservations/nonsense", Some(&good)).await;
    assert_eq!(s, 404);
    assert_eq!(app.cancel(id, &good).await, 200);
    // Streams and idempotency records legitimately moved (the one real
    // reservation and its cancel); everything else is as it was.
    let steady = |snap: Vec<(String, Vec<u8>)>| -> Vec<(String, Vec<u8>)> {
        snap.into_iter()
            .filter(|(k, _)| !k.ends_with(":stream") && !k.contains(":idem:"))
            .collect()
    };
    assert_eq!(
        steady(app.redis_snapshot().await),
        steady(before),
        "refused requests change nothing (and a cancelled hold leaves stock as it was)"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_then_serves_again() {
    let mut redis = RedisServer::start(&["--appendonly", "yes", "--appendfsync", "always"]);
    let app = TestApp::spawn_with(AppOptions {
        redis: RedisTarget::Single(redis.url()),
        ..Default::default()
    })
    .await;
    app.create_sale(sale_spec("down", 10, 5, 2)).await;
    let t = app.admit("dan", "down");
    assert_eq!(
        app.reserve("down", Some(&t), Some("1"), r#"{"qty":1}"#)
            .await
            .0,
        202
    );
    redis.kill();
    let (s, b, h) = app
        .reserve("down", Some(&t), Some("2"), r#"{"qty":1}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (503, Some("redis_unavailable"))
    );
    assert!(h.get("retry-after").is_some());
    let (s, b) = app.get("/readyz", None).await;
    assert_eq!(s, 503);
    assert_eq!(b["checks"]["redis"], "unavailable");
    assert_eq!(b["checks"]["postgres"], "ok");
    assert!(b["error"]["message"].as_str().unwrap().contains("redis"));
    redis.restart();
    let mut status = 0;
    for _ in 0..50 {
        status = app
            .reserve("down", Some(&t), Some("2"), r#"{"qty":1}"#)
            .await
            .0;
        if status == 202 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 202, "serves again once Redis is back");
    assert_eq!(app.get("/readyz", None).await.0, 200);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_script_flush() {
    let redis = RedisServer::start(&[]);
    let app = TestApp::spawn_with(AppOptions {
        redis: RedisTarget::Single(redis.url()),
        ..Default::default()
    })
    .await;
    app.create_sale(sale_spec("flush", 10, 5, 1)).await;
    let t = app.admit("fay", "flush");
    assert_eq!(
        app.reserve("flush", Some(&t), Some("1"), r#"{"qty":1}"#)
            .await
            .0,
        202
    );
    let mut conn = app.redis().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        app.reserve("flush", Some(&t), Some("2"), r#"{"qty":1}"#)
            .await
            .0,
        202
    );
    app.stop().await;
}

/// Issue 21 #1: one Idempotency-Key is one request. For each of many
/// accounts, sixteen concurrent requests share a key with qty 1 and 2 while
/// the account's home shard is empty (so the first one spills): one hold,
/// the qty of the request that came first, every request with the other
/// qty refused 422 — and no account ever holds more than its limit, nor
/// more than its home shard counts, even after more keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_another_qty_is_refused_and_never_passes_the_limit() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers {
            reconcile: false,
            ..Workers::ALL
        },
        ..AppOptions::default()
    })
    .await;
    let cfg = app.create_sale(sale_spec("reqty", 400, 2, 2)).await;
    let sale = app.state.sales.get("reqty").await.unwrap().unwrap();
    let mut conn = app.redis().await;
    // Accounts whose home is shard 0, which is emptied behind the product's
    // back so that every first request spills to shard 1.
    let accounts: Vec<String> = (0..)
        .map(|i| format!("acct{i}"))
        .filter(|a| origin::reserve::engine::home_shard(a, 2) == 0)
        .take(24)
        .collect();
    let hk = origin::reserve::store::ShardKeys::new(&app.prefix, &cfg.shard_tags[0]);
    let _: () = conn.set(&hk.stock, 0).await.unwrap();
    for acct in &accounts {
        let token = app.admit(acct, "reqty");
        let answers = futures::future::join_all((0..16).map(|i| {
            let body = if i % 2 == 0 {
                r#"{"qty":1}"#
            } else {
                r#"{"qty":2}"#
            };
            app.reserve("reqty", Some(&token), Some("one-key"), body)
        }))
        .await;
        let mut ids = HashSet::new();
        let mut granted_qty = HashSet::new();
        for (i, (s, b, _)) in answers.iter().enumerate() {
            match s {
                202 => {
                    ids.insert(b["reservation_id"].as_str().unwrap().to_string());
                    granted_qty.insert(if i % 2 == 0 { 1 } else { 2 });
                }
                422 => assert_eq!(b["error"]["code"], "idempotency_key_reused", "{b}"),
                _ => panic!("unexpected answer {s} {b}"),
            }
        }
        assert_eq!(ids.len(), 1, "one key, one reservation: {answers:?}");
        assert_eq!(
            granted_qty.len(),
            1,
            "{acct}: only requests with the first request's body are answered 202"
        );
        // More keys until the limit says no.
        for k in 0..3 {
            app.reserve(
                "reqty",
                Some(&token),
                Some(&format!("more{k}")),
                r#"{"qty":1}"#,
            )
            .await;
        }
    }
    let mut units: HashMap<String, i64> = HashMap::new();
    for k in &sale.shards {
        let holds: HashMap<String, String> = conn.hgetall(&k.holds).await.unwrap();
        for raw in holds.values() {
            let h: Value = serde_json::from_str(raw).unwrap();
            *units
                .entry(h["a"].as_str().unwrap().to_string())
                .or_default() += h["q"].as_i64().unwrap();
        }
    }
    for acct in &accounts {
        let held = units.get(acct).copied().unwrap_or(0);
        assert!(held <= 2, "{acct} holds {held} units at limit 2");
        let count: i64 = conn.hget(&hk.users, acct).await.unwrap();
        assert_eq!(
            count, held,
            "{acct}: the home count is exactly what it holds"
        );
    }
    // Sequentially: a replay with the same body is the same answer, with
    // another body it is refused and changes nothing.
    let token = app.admit("solo", "reqty");
    let (s, b, _) = app
        .reserve("reqty", Some(&token), Some("solo-key"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202, "{b}");
    let id = b["reservation_id"].as_str().unwrap().to_string();
    for _ in 0..100 {
        if origin::settle::settler::lag(&app.state.engine, &sale)
            .await
            .unwrap()
            == 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = app.redis_snapshot().await;
    let (s, b, _) = app
        .reserve("reqty", Some(&token), Some("solo-key"), r#"{"qty":2}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    assert_eq!(
        app.redis_snapshot().await,
        before,
        "a refused replay changes nothing"
    );
    let (s, b, h) = app
        .reserve("reqty", Some(&token), Some("solo-key"), r#"{"qty":1}"#)
        .await;
    assert_eq!((s, b["reservation_id"].as_str()), (202, Some(id.as_str())));
    assert!(h.get("idempotent-replayed").is_some());
    app.stop().await;
}

/// Issue 21 #7: a process that stops between take.lua (the hold granted on
/// another shard) and quota_commit (where it landed, recorded at home) must
/// not hide the hold: cancel, status and purchase still find it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_take_and_quota_commit_hides_no_hold() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers {
            reconcile: false,
            ..Workers::ALL
        },
        ..AppOptions::default()
    })
    .await;
    let cfg = app.create_sale(sale_spec("crashspill", 9, 2, 3)).await;
    let sale = app.state.sales.get("crashspill").await.unwrap().unwrap();
    let home = origin::reserve::engine::home_shard("dora", 3);
    let hk = origin::reserve::store::ShardKeys::new(&app.prefix, &cfg.shard_tags[home]);
    let mut conn = app.redis().await;
    let _: () = conn.set(&hk.stock, 0).await.unwrap();
    // Run the engine's steps as the request would, and stop after take.lua.
    let call = origin::reserve::engine::ReserveCall::new(&sale, 0, "dora", 2, "k");
    let engine = &app.state.engine;
    let origin::reserve::engine::HomeStep::Spill { hold_id, qty } =
        engine.reserve_home(&call).await.unwrap()
    else {
        panic!("the home shard is empty: the request spills");
    };
    let shard = (home + 2) % 3;
    let _: () = conn
        .set(&sale.shards[(home + 1) % 3].stock, 0)
        .await
        .unwrap();
    let took = engine.take(&call, &hold_id, qty, shard).await.unwrap();
    assert!(
        matches!(took, origin::reserve::engine::Took::Held(_)),
        "{took:?}"
    );
    // The process is gone. The hold is still found (live: held, or already
    // settled by the settler running beside this test):
    let token = app.admit("dora", "crashspill");
    let (s, b) = app
        .get(&format!("/api/reservations/{hold_id}"), Some(&token))
        .await;
    assert_eq!(s, 200, "{b}");
    assert!(
        matches!(b["status"].as_str(), Some("held" | "settled")),
        "a live hold: {b}"
    );
    let found = engine.find_hold(&sale, &hold_id, home).await.unwrap();
    assert_eq!(
        found.map(|(s, _)| s),
        Some(shard),
        "found on the shard that holds it"
    );
    let stock_before: i64 = conn.get(&sale.shards[shard].stock).await.unwrap();
    assert_eq!(app.cancel(&hold_id, &token).await, 200, "cancel finds it");
    let stock_after: i64 = conn.get(&sale.shards[shard].stock).await.unwrap();
    assert_eq!(stock_after, stock_before + 2, "its units are back");
    // And dora's quota comes back on her home shard (via the sweep).
    let mut count: Option<i64> = Some(2);
    for _ in 0..100 {
        count = conn.hget(&hk.users, "dora").await.unwrap();
        if count.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(count, None, "no quota left counted for a hold that is gone");
    app.stop().await;
}

/// Issue 22 #2 (invariant 8, the origin's own guard): with a small
/// `max_in_flight`, a burst is shed with 429 + `Retry-After`, and a shed
/// request changed nothing — no hold, no count, no key record — so its
/// retry with the same Idempotency-Key is a fresh reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_past_max_in_flight_is_shed_with_429_and_changes_nothing() {
    let _heavy = tests::heavy().await;
    let app = TestApp::spawn_with(AppOptions {
        max_in_flight: 2,
        workers: Workers::NONE,
        ..AppOptions::default()
    })
    .await;
    app.create_sale(sale_spec("shed", 1_000, 1, 4)).await;
    let sale = app.state.sales.get("shed").await.unwrap().unwrap();
    let answers: Vec<(String, u16, Value, Option<String>)> =
        futures::future::join_all((0..300).map(|a| {
            let app = &app;
            async move {
                let acct = format!("s{a}");
                let t = app.admit(&acct, "shed");
                let (s, b, h) = app
                    .reserve("shed", Some(&t), Some("k"), r#"{"qty":1}"#)
                    .await;
                let retry = h
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_string());
                (acct, s, b, retry)
            }
        }))
        .await;
    let shed: Vec<&String> = answers
        .iter()
        .filter(|(_, s, _, _)| *s == 429)
        .map(|(a, _, b, retry)| {
            assert_eq!(b["error"]["code"], "overloaded", "{b}");
            let secs: u64 = retry.as_deref().expect("Retry-After").parse().unwrap();
            assert!(secs >= 1);
            a
        })
        .collect();
    let held = answers.iter().filter(|(_, s, _, _)| *s == 202).count();
    assert_eq!(held + shed.len(), 300, "only 202 or 429");
    assert!(
        !shed.is_empty(),
        "300 at once past 2 in flight: some are shed"
    );
    assert_eq!(app.redis_hold_ids("shed").await.len(), held);
    let mut conn = app.redis().await;
    let mut stock = 0;
    for k in &sale.shards {
        stock += conn.get::<_, i64>(&k.stock).await.unwrap();
    }
    assert_eq!(stock, 1_000 - held as i64, "only the accepted took units");
    for acct in &shed {
        let home = &sale.shards[origin::reserve::engine::home_shard(acct, 4)];
        let count: Option<i64> = conn.hget(&home.users, acct.as_str()).await.unwrap();
        let key: bool = conn.exists(home.idem(acct, "k")).await.unwrap();
        assert_eq!(
            (count, key),
            (None, false),
            "{acct} was shed: nothing counted"
        );
    }
    // Retried one at a time, the shed requests are fresh reservations.
    for acct in shed.iter().take(20) {
        let t = app.admit(acct, "shed");
        let (s, b, h) = app
            .reserve("shed", Some(&t), Some("k"), r#"{"qty":1}"#)
            .await;
        assert_eq!(s, 202, "{b}");
        assert!(h.get("idempotent-replayed").is_none());
    }
    app.stop().await;
}

/// Found by scripts/chaos (every row that sold out): DESIGN.md,
/// "Idempotency": a replay with the same body gets the first answer. The
/// origin's in-process sold-out flag answered 410 `sold_out` before the
/// key's record was read, so a client retrying a request whose 202 it did
/// not receive was told the sale is sold out while its hold was live (and
/// a reuse with another qty got 410 instead of 422). Now a fresh flag costs
/// one read of the request's own key record, and only a key without one
/// gets 410.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_sell_out_gets_its_first_answer() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("replaysold", 1, 2, 1)).await;
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
    // A reuse of the key with another qty: 422, not 410.
    let (status, reused, _) = app
        .reserve("replaysold", Some(&a), Some("k-a"), r#"{"qty":2}"#)
        .await;
    assert_eq!(
        (status, reused["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{reused}"
    );
    // A key never used still gets 410 at once.
    let (status, _, _) = app
        .reserve("replaysold", Some(&b), Some("k-b2"), body)
        .await;
    assert_eq!(status, 410);
    app.stop().await;
}

/// Issue 43 #2, at the door: an account id Postgres can never record (it
/// holds U+0000) or that has no place in an id (other control characters,
/// over 256 bytes) is refused with its own code, and nothing is held.
/// Before: the admit token of `a\0b` got 202, and the hold was retried by
/// settlement forever, stalling every sale after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_id_with_a_control_character_is_refused_at_the_door() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("door", 10, 2, 1)).await;
    let long = "a".repeat(257);
    for sub in ["a\u{0}b", "line\nbreak", "esc\u{1b}[0m", long.as_str()] {
        let token = app.admit(sub, "door");
        let (s, b, _) = app
            .reserve("door", Some(&token), Some("k"), r#"{"qty":1}"#)
            .await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (401, Some("token_bad_subject")),
            "{sub:?}: {b}"
        );
        let user = app.user(sub);
        let (s, b) = app
            .get(
                &format!("/api/reservations/door.0.{}", "ab".repeat(16)),
                Some(&user),
            )
            .await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (401, Some("token_bad_subject")),
            "{b}"
        );
    }
    assert!(app.redis_hold_ids("door").await.is_empty(), "nothing held");
    app.stop().await;
}

/// Sells out `sale` (one unit per shard, one account each) and returns
/// once a request for it has been answered 410 (the sold-out flag is set).
async fn sell_out(app: &TestApp, sale: &str, shards: usize) {
    for i in 0..shards {
        let t = app.admit(&format!("buyer-{i}"), sale);
        let (s, b, _) = app.reserve(sale, Some(&t), Some("k"), r#"{"qty":1}"#).await;
        assert_eq!(s, 202, "{b}");
    }
    let t = app.admit("late", sale);
    let (s, _, _) = app
        .reserve(sale, Some(&t), Some("k0"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 410);
}

/// Calls of one command since the server started (`INFO commandstats`).
async fn command_calls(conn: &mut origin::reserve::store::RedisConn, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Issue 43 #7: once the sold-out flag is stale (older than 1 s), one
/// request per sale asks Redis whether units came back, not every request
/// of that moment (each asked every shard: 2N calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_sold_out_flag_is_checked_once_not_by_every_request() {
    let server = RedisServer::start(&[]);
    let app = TestApp::spawn_with(AppOptions {
        redis: RedisTarget::Single(server.url()),
        workers: Workers::NONE,
        ..Default::default()
    })
    .await;
    app.create_sale(sale_spec("stale", 8, 1, 8)).await;
    sell_out(&app, "stale", 8).await;
    let tokens: Vec<String> = (0..100)
        .map(|i| app.admit(&format!("crowd-{i}"), "stale"))
        .collect();
    // Connections warm, then the flag goes stale.
    futures::future::join_all((0..100).map(|_| app.get("/healthz", None))).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut conn = app.redis().await;
    let before = command_calls(&mut conn, "zcount").await;
    let answers = {
        let app = &app;
        futures::future::join_all(tokens.iter().enumerate().map(|(i, t)| {
            let key = format!("k{i}");
            async move {
                app.reserve("stale", Some(t), Some(&key), r#"{"qty":1}"#)
                    .await
                    .0
            }
        }))
        .await
    };
    assert!(answers.iter().all(|s| *s == 410), "{answers:?}");
    let checks = command_calls(&mut conn, "zcount").await - before;
    assert!(
        checks <= 16,
        "100 requests in the stale moment asked {checks} shard questions (8 per check; one check per second at most)"
    );
    app.stop().await;
}

/// Issue 43 #7: a shard that lost its keys is not "empty". While the flag
/// is stale, the check that finds a lost shard answers 503 (selling is
/// unknown until the rebuild), never 410 `sold_out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shard_is_never_read_as_sold_out() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..Default::default()
    })
    .await;
    app.create_sale(sale_spec("lostsold", 2, 1, 2)).await;
    sell_out(&app, "lostsold", 2).await;
    let sale = app.state.sales.get("lostsold").await.unwrap().unwrap();
    let names = app
        .keys_matching(&format!(
            "{}*",
            sale.shards[1].stock.trim_end_matches("stock")
        ))
        .await;
    assert!(!names.is_empty());
    let mut conn = app.redis().await;
    let _: () = conn.del(names).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let t = app.admit("after-loss", "lostsold");
    let (s, b, h) = app
        .reserve("lostsold", Some(&t), Some("k"), r#"{"qty":1}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (503, Some("sale_unavailable")),
        "a lost shard is unknown, not sold out: {b}"
    );
    assert!(h.contains_key("retry-after"));
    app.stop().await;
}

/// Issue 43 #9: a finished spill's decision markers no longer live a day.
/// Near sell-out every attempt spills over every shard; each marker kept
/// its day-long expiry, so memory grew with attempts × shards. Once the
/// spill is finished (landed, or every shard empty), they expire within
/// minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_spills_markers_expire_within_minutes() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..AppOptions::default()
    })
    .await;
    let cfg = app.create_sale(sale_spec("markers", 8, 4, 4)).await;
    let sale = app.state.sales.get("markers").await.unwrap().unwrap();
    let home = origin::reserve::engine::home_shard("mia", 4);
    let mut conn = app.redis().await;
    // Her home shard and the next are empty: her hold lands two shards on.
    for step in 0..2 {
        let _: () = conn
            .set(&sale.shards[(home + step) % 4].stock, 0)
            .await
            .unwrap();
    }
    let token = app.admit("mia", "markers");
    let (s, b, _) = app
        .reserve("markers", Some(&token), Some("k1"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202, "{b}");
    let id = b["reservation_id"].as_str().unwrap().to_string();
    // Then every shard empty: a spill over all of them, sold out.
    for shard in 0..4 {
        let _: () = conn.set(&sale.shards[shard].stock, 0).await.unwrap();
    }
    let _: () = redis::cmd("DEL")
        .arg(&sale.shards[(home + 2) % 4].exp)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (s, _, _) = app
        .reserve("markers", Some(&token), Some("k2"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 410);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let markers = app.keys_matching(&format!("{}*spill*", app.prefix)).await;
    assert!(
        markers.len() >= 2 + 3,
        "the two spills' markers: {markers:?}"
    );
    for m in &markers {
        let ttl: i64 = conn.ttl(m).await.unwrap();
        assert!(
            (1..=600).contains(&ttl),
            "{m} expires in {ttl} s, not within 10 minutes"
        );
    }
    let _ = (cfg, id);
    app.stop().await;
}

/// Issue 43 #9: during a cold rebuild the decision markers of a lost shard
/// are restored before its holds go live. A spill replayed in that window
/// found "HELD here" and no hold, and was told its live hold was released
/// (410 `reservation_released`); it must be told to retry (503), and after
/// the rebuild get its hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spill_replayed_while_its_shard_is_rebuilt_is_not_told_released() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..AppOptions::default()
    })
    .await;
    let cfg = app.create_sale(sale_spec("midrebuild", 9, 2, 3)).await;
    let sale = app.state.sales.get("midrebuild").await.unwrap().unwrap();
    let home = origin::reserve::engine::home_shard("rosa", 3);
    let mut conn = app.redis().await;
    let _: () = conn.set(&sale.shards[home].stock, 0).await.unwrap();
    // The request's steps up to take.lua; the process dies before quota_commit.
    let call = origin::reserve::engine::ReserveCall::new(&sale, 0, "rosa", 1, "k");
    let engine = &app.state.engine;
    let origin::reserve::engine::HomeStep::Spill { hold_id, qty } =
        engine.reserve_home(&call).await.unwrap()
    else {
        panic!("the home shard is empty: the request spills");
    };
    let shard = (home + 1) % 3;
    let took = engine.take(&call, &hold_id, qty, shard).await.unwrap();
    assert!(
        matches!(took, origin::reserve::engine::Took::Held(_)),
        "{took:?}"
    );
    // The hold's shard loses its data; the rebuild has written the marker
    // back but not yet swapped the holds and stock in.
    let marker = sale.shards[shard].spill_marker(&hold_id);
    let lost = app
        .keys_matching(&format!(
            "{}*",
            sale.shards[shard].stock.trim_end_matches("stock")
        ))
        .await;
    let lost: Vec<String> = lost.into_iter().filter(|k| *k != marker).collect();
    let _: () = conn.del(lost).await.unwrap();
    let _: () = conn.set(&marker, "H").await.unwrap();
    let token = app.admit("rosa", "midrebuild");
    let (s, b, _) = app
        .reserve("midrebuild", Some(&token), Some("k"), r#"{"qty":1}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (503, Some("sale_unavailable")),
        "not known until the rebuild, not released: {b}"
    );
    let _ = cfg;
    app.stop().await;
}

/// Invariant 5 (issue 43, test audit): a `ticket` (the queue place the edge
/// mints with the admission keys) is never an `admit` token, on any route
/// of the origin that takes one: 401 `token_wrong_type`, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_is_refused_as_an_admit_token_on_every_route() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..AppOptions::default()
    })
    .await;
    app.create_sale(sale_spec("tickets", 5, 2, 1)).await;
    let admit = app.admit("tia", "tickets");
    let (s, b, _) = app
        .reserve("tickets", Some(&admit), Some("k"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202, "{b}");
    let id = b["reservation_id"].as_str().unwrap().to_string();
    let now = tests::now_secs();
    let ticket = app.admission_keys.sign(
        &Claims::new(TokenType::Ticket, "tia", Some("tickets".into()), now, 600).with_ticket(
            token::TicketData {
                seq: 1,
                place: Some(1),
                ..Default::default()
            },
        ),
    );
    let before = app.redis_snapshot().await;
    let (s, b, _) = app
        .reserve("tickets", Some(&ticket), Some("k2"), r#"{"qty":1}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (401, Some("token_wrong_type")),
        "reserve: {b}"
    );
    let (s, b) = app
        .get(&format!("/api/reservations/{id}"), Some(&ticket))
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (401, Some("token_wrong_type")),
        "show: {b}"
    );
    let (s, b) = app.purchase(&id, &ticket).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (401, Some("token_wrong_type")),
        "purchase: {b}"
    );
    assert_eq!(app.cancel(&id, &ticket).await, 401, "cancel");
    assert_eq!(app.redis_snapshot().await, before, "nothing changed");
    app.stop().await;
}

/// Invariant 2 under the hardest load one account can make (issue 43 test
/// audit): 64 concurrent requests with distinct keys, qty 1-3, its home
/// shard empty (every request spills over the other 7), limit 3. The
/// account never holds more than 3 units on all shards together, and its
/// count on its home shard is exactly what it holds.
async fn one_account_floods_eight_shards(app: &TestApp, sale: &str) {
    app.create_sale(sale_spec(sale, 80, 3, 8)).await;
    let cfg = app.state.sales.get(sale).await.unwrap().unwrap();
    let home = origin::reserve::engine::home_shard("flood", 8);
    let mut conn = app.redis().await;
    let _: () = conn.set(&cfg.shards[home].stock, 0).await.unwrap();
    let token = app.admit("flood", sale);
    let answers = futures::future::join_all((0..64).map(|i| {
        let (token, key, body) = (
            token.clone(),
            format!("k{i}"),
            format!(r#"{{"qty":{}}}"#, i % 3 + 1),
        );
        async move { app.reserve(sale, Some(&token), Some(&key), &body).await }
    }))
    .await;
    let mut granted = 0;
    for (s, b, _) in &answers {
        match s {
            202 => granted += b["qty"].as_i64().unwrap(),
            409 => assert_eq!(b["error"]["code"], "per_user_limit", "{b}"),
            other => panic!("unexpected {other}: {b}"),
        }
    }
    assert!(
        (1..=3).contains(&granted),
        "granted {granted} units, limit 3"
    );
    let mut held = 0;
    for k in &cfg.shards {
        let holds: HashMap<String, String> = conn.hgetall(&k.holds).await.unwrap();
        for raw in holds.values() {
            let h: Value = serde_json::from_str(raw).unwrap();
            if h["a"] == "flood" {
                held += h["q"].as_i64().unwrap();
            }
        }
    }
    assert_eq!(held, granted, "Redis holds what the answers said");
    let count: Option<i64> = conn.hget(&cfg.shards[home].users, "flood").await.unwrap();
    assert_eq!(count.unwrap_or(0), held, "the home count is what it holds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_account_flooding_eight_shards_never_passes_its_limit() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..Default::default()
    })
    .await;
    one_account_floods_eight_shards(&app, "flood1").await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_account_flooding_eight_shards_of_a_cluster_never_passes_its_limit() {
    let cluster = RedisCluster::start();
    let app = TestApp::spawn_with(AppOptions {
        redis: RedisTarget::Cluster(cluster.seeds()),
        workers: Workers::NONE,
        ..Default::default()
    })
    .await;
    one_account_floods_eight_shards(&app, "floodc").await;
    app.stop().await;
}
