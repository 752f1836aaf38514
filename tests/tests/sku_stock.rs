//! Per-SKU stock (issue 45, docs/skus.md) over real HTTP, Redis and
//! Postgres: a sale of several SKUs keeps every unit of each SKU apart
//! (its own keys on the shards it is placed on), both per-account limits
//! together, under a race of many clients on one Redis and on the 3-master
//! cluster; every refusal has its own code; a cancel gives the unit back to
//! its own SKU; settlement records each hold's SKU; a lost shard is rebuilt
//! per SKU, and drift on one SKU's stock is repaired on that key alone.

use std::collections::{HashMap, HashSet};

use futures::StreamExt;
use origin::ops::configuration::RedisTarget;
use origin::ops::workers::Workers;
use origin::sales::sale::Sale;
use origin::sales::sku::SkuSpec;
use origin::sales::spec::SaleSpec;
use redis::AsyncCommands;
use serde_json::Value;
use tests::{AppOptions, RedisCluster, TestApp, sale_spec};

fn sku(id: &str, units: i32, limit: Option<i32>) -> SkuSpec {
    SkuSpec {
        id: id.into(),
        name: None,
        units,
        price_cents: 1_000 + i64::from(units),
        per_user_limit: limit,
    }
}

/// A sale of `skus` over `shards` shards, sale-wide limit `limit`.
fn spec(id: &str, skus: Vec<SkuSpec>, limit: i32, shards: i32) -> SaleSpec {
    SaleSpec {
        units: 0,
        price_cents: 0,
        skus,
        ..sale_spec(id, 0, limit, shards)
    }
}

/// The race's SKUs: a hot one on every shard, SKUs on 1 or 2 shards, some
/// with their own limit (below the sale's 3).
fn race_skus() -> Vec<SkuSpec> {
    vec![
        sku("hot", 400, None),
        sku("mid", 100, Some(2)),
        sku("s1", 12, Some(1)),
        sku("s2", 30, None),
        sku("s3", 65, Some(1)),
        sku("s4", 5, None),
    ]
}

/// What the race's 202s granted.
#[derive(Default)]
struct Granted {
    /// Per (account, SKU id).
    by_account_sku: HashMap<(String, String), i64>,
    per_sku: HashMap<String, i64>,
    ids: HashSet<String>,
    refusals: HashMap<String, usize>,
}

/// 6,000 requests from 2,000 accounts (3 each, qty 1 or 2, distinct keys),
/// half of them for the hot SKU, the rest spread over the others, 256 at a
/// time: spills, partial fills, both limits and sell-outs meet concurrency.
async fn race(app: &TestApp, sale: &str) -> Granted {
    let _heavy = tests::heavy().await;
    let skus = race_skus();
    let ids: Vec<String> = skus.iter().map(|s| s.id.clone()).collect();
    // qty 1 or 2, never above the SKU's own limit (that is a 422).
    let max_qty: HashMap<String, i64> = skus
        .iter()
        .map(|s| {
            (
                s.id.clone(),
                i64::from(s.per_user_limit.unwrap_or(2).min(2)),
            )
        })
        .collect();
    let requests: Vec<(String, String, String, i64)> = (0..2_000)
        .flat_map(|a| {
            let ids = ids.clone();
            (0..3).map(move |k| {
                // An account's third request repeats its second's SKU (the
                // SKU limits must be met), with its own qty and key.
                let n = a * 3 + k.min(1);
                // Half the wishes for the hot SKU, the rest round the others.
                let sku = if n % 2 == 0 {
                    ids[0].clone()
                } else {
                    ids[1 + (n / 2) % (ids.len() - 1)].clone()
                };
                (
                    format!("acct-{a}"),
                    format!("key-{k}"),
                    sku,
                    1 + (n % 3 == 0) as i64,
                )
            })
        })
        .collect();
    let tokens: HashMap<String, String> = (0..2_000)
        .map(|a| {
            let acct = format!("acct-{a}");
            let t = app.admit(&acct, sale);
            (acct, t)
        })
        .collect();
    let results: Vec<(String, String, u16, Value)> = futures::stream::iter(requests)
        .map(|(acct, key, sku, qty)| {
            let token = tokens[&acct].clone();
            let qty = qty.min(max_qty[&sku]);
            async move {
                let body = format!(r#"{{"sku":"{sku}","qty":{qty}}}"#);
                let (status, body, _) = app.reserve(sale, Some(&token), Some(&key), &body).await;
                (acct, sku, status, body)
            }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    let mut out = Granted::default();
    for (acct, sku, status, body) in results {
        match status {
            202 => {
                assert_eq!(body["sku"].as_str(), Some(sku.as_str()), "{body}");
                let q = body["qty"].as_i64().unwrap();
                *out.by_account_sku.entry((acct, sku.clone())).or_default() += q;
                *out.per_sku.entry(sku).or_default() += q;
                assert!(
                    out.ids
                        .insert(body["reservation_id"].as_str().unwrap().to_string())
                );
            }
            409 | 410 => {
                let code = body["error"]["code"].as_str().unwrap().to_string();
                assert!(
                    [
                        "per_user_limit",
                        "sku_per_user_limit",
                        "sku_sold_out",
                        "sold_out"
                    ]
                    .contains(&code.as_str()),
                    "{body}"
                );
                *out.refusals.entry(code).or_default() += 1;
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    out
}

/// The invariants after the race, from the answers and from Redis: each
/// SKU sold exactly its units, no account over either limit, and on every
/// shard each SKU's stock and holds add up to its share there, the
/// accounts' counts (sale-wide and per SKU) equal to their holds.
async fn check_after_race(app: &TestApp, sale: &Sale, g: &Granted) {
    let skus = race_skus();
    for s in &skus {
        assert_eq!(
            g.per_sku.get(&s.id).copied().unwrap_or(0),
            i64::from(s.units),
            "{}: every unit sold, none twice ({:?})",
            s.id,
            g.refusals
        );
    }
    let mut per_account: HashMap<&str, i64> = HashMap::new();
    for ((acct, id), q) in &g.by_account_sku {
        *per_account.entry(acct).or_default() += q;
        let limit = skus.iter().find(|s| &s.id == id).unwrap().per_user_limit;
        assert!(
            *q <= i64::from(limit.unwrap_or(3)),
            "{acct} holds {q} of {id}"
        );
    }
    assert!(
        per_account.values().all(|q| *q <= 3),
        "sale-wide limit kept"
    );
    assert!(
        g.refusals.get("sku_sold_out").copied().unwrap_or(0) > 0,
        "a SKU sold out while others were left: {:?}",
        g.refusals
    );
    assert!(
        g.refusals.get("sku_per_user_limit").copied().unwrap_or(0) > 0,
        "the SKU limits were met: {:?}",
        g.refusals
    );

    let mut conn = app.redis().await;
    let mut held_ids = HashSet::new();
    let mut counted: HashMap<String, i64> = HashMap::new();
    let mut from_holds: HashMap<String, i64> = HashMap::new();
    for (i, k) in sale.shards.iter().enumerate() {
        let holds: HashMap<String, String> = conn.hgetall(&k.holds).await.unwrap();
        let mut held_here = vec![0i64; skus.len()];
        for (id, raw) in holds {
            let h: Value = serde_json::from_str(&raw).unwrap();
            let p = h["p"]
                .as_i64()
                .expect("a hold of a multi-SKU sale names its SKU") as usize;
            let q = h["q"].as_i64().unwrap();
            held_here[p] += q;
            let home = h["h"].as_u64().unwrap() as usize;
            let acct = h["a"].as_str().unwrap();
            assert_eq!(
                home,
                origin::reserve::engine::home_shard(acct, sale.shards.len())
            );
            *from_holds.entry(acct.to_string()).or_default() += q;
            *from_holds.entry(format!("{acct}\n{p}")).or_default() += q;
            held_ids.insert(id);
        }
        for (p, s) in skus.iter().enumerate() {
            let placement = sale.placement(p as i32);
            let stock: Option<i64> = conn.get(k.stock_of(p as i32)).await.unwrap();
            if placement.holds(i) {
                assert_eq!(
                    stock.unwrap() + held_here[p],
                    i64::from(placement.units_on(s.units, i)),
                    "shard {i}, {}: stock + held = share",
                    s.id
                );
                assert_eq!(stock, Some(0), "{} sold out on shard {i}", s.id);
            } else {
                assert_eq!(held_here[p], 0, "{} held on a shard it is not on", s.id);
                if p > 0 {
                    assert_eq!(stock, None, "{} has no key where it is not placed", s.id);
                }
            }
        }
        let users: HashMap<String, i64> = conn.hgetall(&k.users).await.unwrap();
        for (field, n) in users {
            *counted.entry(field).or_default() += n;
        }
    }
    assert_eq!(held_ids, g.ids, "every 202 has a hold, every hold a 202");
    assert_eq!(
        counted, from_holds,
        "every count equals its holds, no stray quota"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_over_six_skus_on_one_redis_sells_each_skus_units_exactly() {
    let app = TestApp::spawn().await;
    app.create_sale(spec("mrace", race_skus(), 3, 4)).await;
    let sale = app.state.sales.get("mrace").await.unwrap().unwrap();
    // Placed by units: the hot SKU everywhere, the small ones on one shard.
    let on: Vec<usize> = sale.placements.iter().map(|p| p.count).collect();
    assert_eq!(on, [4, 2, 1, 1, 2, 1]);
    let g = race(&app, "mrace").await;
    check_after_race(&app, &sale, &g).await;

    // The whole sale is sold out now: the plain code, and the summary says
    // so per SKU.
    let t = app.admit("late", "mrace");
    let (s, b, _) = app
        .reserve("mrace", Some(&t), Some("k"), r#"{"sku":"s4","qty":1}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (410, Some("sold_out")),
        "{b}"
    );
    let (_, summary) = app.get("/api/sales/mrace", None).await;
    assert_eq!(summary["sold_out"], true, "{summary}");
    assert!(
        summary["skus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k["sold_out"] == true && k["units_available"] == 0),
        "{summary}"
    );

    // Settlement records each hold under its SKU.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let per_sku: Vec<(i32, i64)> = loop {
        let rows: Vec<(i32, i64)> = sqlx::query_as(
            "SELECT sku, sum(qty)::bigint FROM reservations WHERE sale_id = 'mrace'
             AND status = 'settled' GROUP BY sku ORDER BY sku",
        )
        .fetch_all(&app.state.pool)
        .await
        .unwrap();
        if rows.iter().map(|(_, q)| q).sum::<i64>() == 612 {
            break rows;
        }
        assert!(std::time::Instant::now() < deadline, "settled: {rows:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let want: Vec<(i32, i64)> = race_skus()
        .iter()
        .enumerate()
        .map(|(p, s)| (p as i32, i64::from(s.units)))
        .collect();
    assert_eq!(per_sku, want);
    let inventory: Vec<(i32, i32, i32)> = sqlx::query_as(
        "SELECT position, held, sold FROM skus WHERE sale_id = 'mrace' ORDER BY position",
    )
    .fetch_all(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(
        inventory,
        want.iter()
            .map(|(p, q)| (*p, *q as i32, 0))
            .collect::<Vec<_>>(),
        "each SKU's inventory holds its units"
    );
    app.stop().await;
}

/// Postgres is the last guard per SKU: when Redis offers a SKU more units
/// than it has (drift), settlement refuses the holds past the SKU's units
/// although the sale as a whole still has units, and releases them in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_hold_past_its_skus_units_even_when_the_sale_has_units() {
    let app = TestApp::spawn().await;
    app.create_sale(spec(
        "guard",
        vec![sku("few", 2, None), sku("many", 50, None)],
        5,
        1,
    ))
    .await;
    let sale = app.state.sales.get("guard").await.unwrap().unwrap();
    // Redis drifts: two units of "few" that do not exist.
    let mut conn = app.redis().await;
    let _: i64 = conn.incr(sale.shards[0].stock_of(0), 2).await.unwrap();
    let mut ids = Vec::new();
    for a in 0..4 {
        let t = app.admit(&format!("g{a}"), "guard");
        let (s, b, _) = app
            .reserve("guard", Some(&t), Some("k"), r#"{"sku":"few","qty":1}"#)
            .await;
        assert_eq!(s, 202, "{b}");
        ids.push(b["reservation_id"].as_str().unwrap().to_string());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let statuses: Vec<String> = loop {
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT status FROM reservations WHERE id = ANY($1) ORDER BY created_at",
        )
        .bind(&ids)
        .fetch_all(&app.state.pool)
        .await
        .unwrap();
        if rows.len() == 4 {
            break rows;
        }
        assert!(std::time::Instant::now() < deadline, "settled: {rows:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(statuses, ["settled", "settled", "rejected", "rejected"]);
    let few: (i32, i32) =
        sqlx::query_as("SELECT held, sold FROM skus WHERE sale_id = 'guard' AND id = 'few'")
            .fetch_one(&app.state.pool)
            .await
            .unwrap();
    assert_eq!(few, (2, 0));
    let inventory: (i32, i32) =
        sqlx::query_as("SELECT held, total FROM inventory WHERE sale_id = 'guard'")
            .fetch_one(&app.state.pool)
            .await
            .unwrap();
    assert_eq!(inventory, (2, 52));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_over_six_skus_on_a_three_master_cluster_sells_each_skus_units_exactly() {
    let cluster = RedisCluster::start();
    let app = TestApp::spawn_with(AppOptions {
        redis: RedisTarget::Cluster(cluster.seeds()),
        workers: Workers::NONE,
        ..Default::default()
    })
    .await;
    app.create_sale(spec("crace", race_skus(), 3, 4)).await;
    let sale = app.state.sales.get("crace").await.unwrap().unwrap();
    let g = race(&app, "crace").await;
    check_after_race(&app, &sale, &g).await;
    // Each SKU key sits in its shard's slot: on the same master as the
    // shard's own stock key.
    let sub_keys = cluster.keys_per_node(&format!("{}:*:stock:*", app.prefix));
    let placed: usize = sale.placements.iter().skip(1).map(|p| p.count).sum();
    assert_eq!(sub_keys.iter().sum::<usize>(), placed, "{sub_keys:?}");
    app.stop().await;
}

/// Every refusal of a sale of several SKUs has its own code and changes
/// nothing; a cancelled unit goes back to its own SKU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sku_refusal_has_its_code_and_a_cancel_returns_the_unit_to_its_sku() {
    // No workers: the snapshot below compares the whole keyspace.
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..Default::default()
    })
    .await;
    app.create_sale(spec(
        "codes",
        vec![sku("a", 2, Some(1)), sku("b", 2, None)],
        3,
        2,
    ))
    .await;
    let ana = app.admit("ana", "codes");
    let bob = app.admit("bob", "codes");
    let cid = app.admit("cid", "codes");
    let code = |r: &(u16, Value, reqwest::header::HeaderMap)| {
        (r.0, r.1["error"]["code"].as_str().map(str::to_string))
    };
    let r = app
        .reserve("codes", Some(&ana), Some("k1"), r#"{"sku":"a","qty":1}"#)
        .await;
    assert_eq!((r.0, r.1["sku"].as_str()), (202, Some("a")), "{}", r.1);
    let ana_a = r.1["reservation_id"].as_str().unwrap().to_string();
    let snapshot = app.redis_snapshot().await;
    for (key, body, want) in [
        ("k2", r#"{"sku":"a","qty":1}"#, (409, "sku_per_user_limit")),
        (
            "k1",
            r#"{"sku":"b","qty":1}"#,
            (422, "idempotency_key_reused"),
        ),
        ("k3", r#"{"qty":1}"#, (422, "sku_required")),
        ("k4", r#"{"sku":"c","qty":1}"#, (404, "unknown_sku")),
        ("k5", r#"{"sku":"b","qty":4}"#, (422, "invalid_qty")),
    ] {
        let r = app.reserve("codes", Some(&ana), Some(key), body).await;
        assert_eq!(
            code(&r),
            (want.0, Some(want.1.to_string())),
            "{body}: {}",
            r.1
        );
    }
    assert_eq!(
        app.redis_snapshot().await,
        snapshot,
        "refusals change nothing"
    );
    // The key's replay with its own SKU is its first answer.
    let r = app
        .reserve("codes", Some(&ana), Some("k1"), r#"{"sku":"a","qty":1}"#)
        .await;
    assert_eq!(r.1["reservation_id"].as_str(), Some(ana_a.as_str()));

    let r = app
        .reserve("codes", Some(&bob), Some("k1"), r#"{"sku":"a","qty":1}"#)
        .await;
    assert_eq!(r.0, 202, "{}", r.1);
    // a is gone, b is not: this SKU's code.
    let r = app
        .reserve("codes", Some(&cid), Some("k1"), r#"{"sku":"a","qty":1}"#)
        .await;
    assert_eq!(code(&r), (410, Some("sku_sold_out".into())), "{}", r.1);
    let (_, summary) = app.get("/api/sales/codes", None).await;
    assert_eq!(
        (
            summary["skus"][0]["sold_out"].as_bool(),
            summary["skus"][1]["units_available"].as_i64(),
            summary["sold_out"].as_bool()
        ),
        (Some(true), Some(2), Some(false)),
        "{summary}"
    );

    // Ana's cancel gives her unit back to a, not to b.
    assert_eq!(app.cancel(&ana_a, &ana).await, 200);
    app.state.summaries.invalidate_all();
    let (_, summary) = app.get("/api/sales/codes", None).await;
    assert_eq!(
        (
            summary["skus"][0]["units_available"].as_i64(),
            summary["skus"][1]["units_available"].as_i64()
        ),
        (Some(1), Some(2)),
        "{summary}"
    );
    let r = app
        .reserve("codes", Some(&cid), Some("k2"), r#"{"sku":"a","qty":1}"#)
        .await;
    assert_eq!(r.0, 202, "{}", r.1);

    // b sells out too: now the whole sale is, and the answer says so.
    let r = app
        .reserve("codes", Some(&ana), Some("k6"), r#"{"sku":"b","qty":2}"#)
        .await;
    assert_eq!((r.0, r.1["qty"].as_i64()), (202, Some(2)), "{}", r.1);
    let r = app
        .reserve("codes", Some(&bob), Some("k2"), r#"{"sku":"b","qty":1}"#)
        .await;
    assert_eq!(code(&r), (410, Some("sold_out".into())), "{}", r.1);
    app.stop().await;
}

/// A lost shard of a sale of several SKUs comes back from Postgres with
/// each SKU's stock, holds and counts (per SKU and sale-wide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shard_is_rebuilt_per_sku() {
    let app = TestApp::spawn().await;
    app.create_sale(spec(
        "lost",
        vec![
            sku("x", 100, Some(2)),
            sku("y", 70, None),
            sku("z", 3, None),
        ],
        4,
        2,
    ))
    .await;
    let sale = app.state.sales.get("lost").await.unwrap().unwrap();
    let mut granted = 0;
    for a in 0..12 {
        let t = app.admit(&format!("p{a}"), "lost");
        for (k, body) in [
            ("k1", r#"{"sku":"x","qty":2}"#),
            ("k2", r#"{"sku":"y","qty":1}"#),
            ("k3", r#"{"sku":"z","qty":1}"#),
        ] {
            let (s, b, _) = app.reserve("lost", Some(&t), Some(k), body).await;
            if s == 202 {
                granted += b["qty"].as_i64().unwrap();
            }
        }
    }
    assert_eq!(granted, 12 * 3 + 3);
    // Settled, then Redis keeps nothing of the sale: every key is gone.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while origin::settle::settler::lag(&app.state.engine, &sale)
        .await
        .unwrap()
        > 0
    {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let mut conn = app.redis().await;
    let before: Vec<(String, Vec<u8>)> = app
        .redis_snapshot()
        .await
        .into_iter()
        .filter(|(k, _)| !k.ends_with(":stream") && !k.contains(":idem:") && !k.contains(":spill:"))
        .collect();
    for k in app.keys_matching(&format!("{}:*", app.prefix)).await {
        let _: i64 = conn.del(&k).await.unwrap();
    }
    let rebuilt = origin::settle::rebuild::rebuild_sale(&app.state.engine, &app.state.pool, &sale)
        .await
        .unwrap();
    assert_eq!(rebuilt, vec![0, 1]);
    let after: Vec<(String, Vec<u8>)> = app
        .redis_snapshot()
        .await
        .into_iter()
        .filter(|(k, _)| !k.ends_with(":stream") && !k.contains(":idem:") && !k.contains(":spill:"))
        .collect();
    let keys = |v: &[(String, Vec<u8>)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&after), keys(&before), "the same keys come back");
    for (p, s) in ["x", "y", "z"].iter().enumerate() {
        let mut stock = 0;
        for k in &sale.shards {
            let v: Option<i64> = conn.get(k.stock_of(p as i32)).await.unwrap();
            stock += v.unwrap_or(0);
        }
        let want = [100 - 24, 70 - 12, 0][p];
        assert_eq!(stock, want, "{s}");
    }
    // The counts came back: p5 (2 of x, 1 of y) is at x's own limit, and
    // 2 more units of y would pass the sale's 4.
    let t = app.admit("p5", "lost");
    let (s, b, _) = app
        .reserve("lost", Some(&t), Some("again-x"), r#"{"sku":"x","qty":1}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("sku_per_user_limit")),
        "{b}"
    );
    let (s, b, _) = app
        .reserve("lost", Some(&t), Some("again-y"), r#"{"sku":"y","qty":2}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("per_user_limit")),
        "{b}"
    );
    app.stop().await;
}

/// The reconciler compares and repairs each SKU's stock key on its own:
/// drift on one SKU's key (the sale's total drifting with it) is found
/// there, repaired from Postgres, and a key of another SKU that did not
/// drift is left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_repairs_each_skus_stock_on_its_own() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..Default::default()
    })
    .await;
    app.create_sale(spec(
        "drift",
        vec![sku("x", 100, None), sku("y", 70, None)],
        4,
        2,
    ))
    .await;
    let sale = app.state.sales.get("drift").await.unwrap().unwrap();
    for a in 0..6 {
        let t = app.admit(&format!("d{a}"), "drift");
        for (k, body) in [
            ("k1", r#"{"sku":"x","qty":2}"#),
            ("k2", r#"{"sku":"y","qty":1}"#),
        ] {
            let (s, b, _) = app.reserve("drift", Some(&t), Some(k), body).await;
            assert_eq!(s, 202, "{b}");
        }
    }
    let settler = app.state.settler();
    for s in 0..2 {
        while settler.settle_shard(&sale, s).await.unwrap().entries > 0 {}
    }
    let report =
        origin::settle::reconcile::reconcile_sale(&app.state.engine, &app.state.pool, &sale, true)
            .await
            .unwrap();
    assert_eq!(
        (report.drift, report.repaired_shards.len()),
        (0, 0),
        "{report:?}"
    );
    // y's key on the shard where it holds most drifts up by 3.
    let mut conn = app.redis().await;
    let y = sale.placement(1);
    let shard = (0..2).find(|i| y.holds(*i)).unwrap();
    let key = sale.shards[shard].stock_of(1);
    let before: i64 = conn.get(&key).await.unwrap();
    let x_before: i64 = conn.get(&sale.shards[shard].stock).await.unwrap();
    let _: i64 = conn.incr(&key, 3).await.unwrap();
    let report =
        origin::settle::reconcile::reconcile_sale(&app.state.engine, &app.state.pool, &sale, true)
            .await
            .unwrap();
    assert_eq!(
        (report.drift, report.repaired_shards.clone()),
        (3, vec![shard]),
        "{report:?}"
    );
    assert_eq!(
        conn.get::<_, i64>(&key).await.unwrap(),
        before,
        "y repaired"
    );
    assert_eq!(
        conn.get::<_, i64>(&sale.shards[shard].stock).await.unwrap(),
        x_before,
        "x untouched"
    );
    app.stop().await;
}
