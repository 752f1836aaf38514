//! SKUs (issue 45, docs/skus.md) over real HTTP, Redis and Postgres: a sale
//! created the old way is a sale of one SKU that keeps working unnamed and
//! by name; a reservation for a SKU the sale does not sell is refused and
//! changes nothing; a purchase charges the held SKU's price under the SKU's
//! own limit; every event names the SKU; and migration 0014 moves a
//! database filled under the old schema to one SKU per sale, every row kept
//! (and 0015 counts each SKU's held and sold units from its reservations;
//! 0016 keeps the id and name rules off the counters' path).

use std::borrow::Cow;
use std::time::Duration;

use origin::ops::workers::Workers;
use origin::sales::sku::SkuSpec;
use origin::sales::spec::SaleSpec;
use serde_json::{Value, json};
use tests::{AppOptions, TestApp, TestDb, sale_spec};

async fn pay(app: &TestApp, payment: &str, amount: i64) {
    let (s, r) = app
        .payment_event(
            &format!("evt_{payment}"),
            "payment.succeeded",
            payment,
            amount,
        )
        .await;
    assert_eq!((s, r["result"].as_str()), (200, Some("paid")), "{r}");
}

async fn paid_event(app: &TestApp, reservation: &str) -> Value {
    sqlx::query_scalar(
        "SELECT payload FROM outbox WHERE type = 'order.paid' AND payload->>'reservation_id' = $1",
    )
    .bind(reservation)
    .fetch_one(&app.state.pool)
    .await
    .expect("an order.paid event for the reservation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_made_the_old_way_sells_its_one_sku_unnamed_or_by_name() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("solo", 5, 3, 1)).await;
    let (s, summary) = app.get("/api/sales/solo", None).await;
    assert_eq!(s, 200);
    assert_eq!(
        summary["skus"],
        json!([{"id": "solo", "name": "Test sale solo", "price_cents": 4999, "units_total": 5,
                "units_available": 5, "per_user_limit": null, "sold_out": false}]),
        "{summary}"
    );
    let t = app.admit("ana", "solo");
    let (s, b, _) = app
        .reserve("solo", Some(&t), Some("k1"), r#"{"qty":1}"#)
        .await;
    assert_eq!((s, b["sku"].as_str()), (202, Some("solo")), "{b}");
    let (s, b, _) = app
        .reserve("solo", Some(&t), Some("k2"), r#"{"sku":"solo","qty":1}"#)
        .await;
    assert_eq!((s, b["sku"].as_str()), (202, Some("solo")), "{b}");
    let id = b["reservation_id"].as_str().unwrap().to_string();

    // A SKU the sale does not sell: refused before the engine, nothing held.
    // Stock and holds, not the whole keyspace: the settlement worker
    // trims the settled entries of the holds above meanwhile.
    let sale = app.state.sales.get("solo").await.unwrap().unwrap();
    let conn = app.redis().await;
    let stock = |mut conn: origin::reserve::store::RedisConn| {
        let key = sale.shards[0].stock.clone();
        async move {
            redis::cmd("GET")
                .arg(key)
                .query_async::<Option<i64>>(&mut conn)
                .await
                .unwrap()
        }
    };
    let before = (stock(conn.clone()).await, app.redis_hold_ids("solo").await);
    for (body, status, code) in [
        (r#"{"sku":"other","qty":1}"#, 404, "unknown_sku"),
        (r#"{"sku":"SOLO","qty":1}"#, 404, "unknown_sku"),
        (r#"{"sku":7,"qty":1}"#, 422, "invalid_body"),
    ] {
        let (s, b, _) = app.reserve("solo", Some(&t), Some("k3"), body).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}: {b}"
        );
    }
    assert_eq!(
        (stock(conn.clone()).await, app.redis_hold_ids("solo").await),
        before,
        "a refused SKU changes neither stock nor holds"
    );
    assert_eq!(before.0, Some(3), "two of five units held");

    // The purchase charges the SKU's price; the event names the SKU.
    let (s, p) = app.purchase(&id, &t).await;
    assert_eq!((s, p["amount_cents"].as_i64()), (201, Some(4_999)), "{p}");
    pay(&app, p["payment_id"].as_str().unwrap(), 4_999).await;
    let event = paid_event(&app, &id).await;
    assert_eq!(
        (event["sale"].as_str(), event["sku"].as_str()),
        (Some("solo"), Some("solo")),
        "{event}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_sku_sells_at_its_price_under_its_own_limit() {
    let app = TestApp::spawn().await;
    let cfg = app
        .create_sale(SaleSpec {
            units: 0,
            price_cents: 0,
            skus: vec![SkuSpec {
                id: "tee-m".into(),
                name: Some("T-shirt, M".into()),
                units: 4,
                price_cents: 1_500,
                per_user_limit: Some(1),
            }],
            ..sale_spec("tees", 0, 3, 1)
        })
        .await;
    assert_eq!((cfg.units_total, cfg.price_cents), (4, 1_500));
    let (_, summary) = app.get("/api/sales/tees", None).await;
    assert_eq!(summary["skus"][0]["name"], "T-shirt, M", "{summary}");
    assert_eq!(summary["skus"][0]["per_user_limit"], 1, "{summary}");
    let t = app.admit("bo", "tees");
    // The sale allows 3, the SKU 1.
    let (s, b, _) = app
        .reserve("tees", Some(&t), Some("k1"), r#"{"sku":"tee-m","qty":2}"#)
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (422, Some("invalid_qty")),
        "{b}"
    );
    let (s, b, _) = app
        .reserve("tees", Some(&t), Some("k2"), r#"{"qty":1}"#)
        .await;
    assert_eq!((s, b["sku"].as_str()), (202, Some("tee-m")), "{b}");
    let id = b["reservation_id"].as_str().unwrap().to_string();
    let (s, p) = app.purchase(&id, &t).await;
    assert_eq!((s, p["amount_cents"].as_i64()), (201, Some(1_500)), "{p}");
    pay(&app, p["payment_id"].as_str().unwrap(), 1_500).await;
    assert_eq!(paid_event(&app, &id).await["sku"], "tee-m");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0014_moves_every_old_sale_to_one_sku_and_keeps_every_row() {
    let db = TestDb::create().await;
    let pool = origin::ops::db::pg_pool(&db.url, 2).unwrap();
    let all = origin::ops::db::migrator();
    let mut old = origin::ops::db::migrator();
    old.migrations = Cow::Owned(
        all.migrations
            .iter()
            .filter(|m| m.version < 14)
            .cloned()
            .collect(),
    );
    old.run(&pool).await.expect("the schema before SKUs");
    // Two sales as the old schema knew them, one with holds and a payment.
    sqlx::raw_sql(
        "INSERT INTO sales (id, name, price_cents, units_total, per_user_limit, shards, shard_tags,
                            starts_at, hold_seconds, admission_rate, admission_factor)
         VALUES ('old-a', 'Old A', 2500, 10, 2, 1, '{a0}', now(), 600, 10, 2),
                ('old-b', 'Old B', 0, 3, 1, 1, '{b0}', now(), 600, 10, 2);
         INSERT INTO inventory (sale_id, total, held, sold) VALUES ('old-a', 10, 1, 1), ('old-b', 3, 0, 0);
         INSERT INTO reservations (id, sale_id, account, qty, status, shard, home, created_at, expires_at)
         VALUES ('old-a.0.x', 'old-a', 'ann', 1, 'paid', 0, 0, now(), now() + interval '10 min'),
                ('old-a.0.y', 'old-a', 'ben', 1, 'settled', 0, 0, now(), now() + interval '10 min');
         INSERT INTO payments (id, reservation_id, sale_id, account, amount_cents, status)
         VALUES ('pay_x', 'old-a.0.x', 'old-a', 'ann', 2500, 'succeeded');",
    )
    .execute(&pool)
    .await
    .unwrap();
    let count = |table: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!("SELECT count(*) FROM {table}"))
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let before = [
        count("sales").await,
        count("inventory").await,
        count("reservations").await,
        count("payments").await,
    ];

    all.run(&pool).await.expect("migration 0014 applies");

    let after = [
        count("sales").await,
        count("inventory").await,
        count("reservations").await,
        count("payments").await,
    ];
    assert_eq!(before, after, "no row lost");
    type SkuRow = (String, String, i32, String, i64, i32, Option<i32>);
    let skus: Vec<SkuRow> = sqlx::query_as(
        "SELECT sale_id, id, position, name, price_cents, units_total, per_user_limit
           FROM skus ORDER BY sale_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        skus,
        [
            (
                "old-a".into(),
                "old-a".into(),
                0,
                "Old A".into(),
                2500,
                10,
                None
            ),
            (
                "old-b".into(),
                "old-b".into(),
                0,
                "Old B".into(),
                0,
                3,
                None
            ),
        ]
    );
    let positions: Vec<i32> = sqlx::query_scalar("SELECT sku FROM reservations ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(positions, [0, 0], "every old reservation holds the one SKU");
    // Migration 0015: each SKU counts what its reservations hold and sold.
    let counts: Vec<(String, i32, i32)> =
        sqlx::query_as("SELECT sale_id, held, sold FROM skus ORDER BY sale_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(counts, [("old-a".into(), 1, 1), ("old-b".into(), 0, 0)]);
    // The origin loads the migrated sales with their SKU.
    let registry = origin::sales::registry::SaleRegistry::new(pool.clone(), "fs-mig".into());
    let sale = registry.get("old-a").await.unwrap().expect("old-a loads");
    assert_eq!(sale.config.skus.len(), 1);
    assert_eq!(sale.config.skus[0].price_cents, 2500);
    pool.close().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Migration 0016 took the id and name rules off the counters' path (a
/// trigger on INSERT and UPDATE OF id, name instead of CHECKs evaluated on
/// every settlement UPDATE): Postgres still refuses a SKU whose id is not a
/// slug or whose name is empty or too long, on insert and on update, under
/// the old constraint names; a counters-only UPDATE still meets the units
/// guard (skus_units_kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_still_refuses_a_bad_sku_id_or_name_and_the_counters_keep_their_guard() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..AppOptions::default()
    })
    .await;
    app.create_sale(sale_spec("guarded", 5, 2, 1)).await;
    let pool = &app.state.pool;
    let refused = |sql: &'static str| async move {
        match sqlx::query(sql).execute(pool).await {
            Err(sqlx::Error::Database(e)) => (
                e.code().map(|c| c.to_string()),
                e.constraint().map(str::to_string),
            ),
            other => panic!("{sql}: expected a refusal, got {other:?}"),
        }
    };
    let insert = |id: &str, name: &str| {
        format!(
            "INSERT INTO skus (sale_id, id, position, name, price_cents, units_total)
             VALUES ('guarded', '{id}', 7, '{name}', 100, 1)"
        )
    };
    for (sql, constraint) in [
        (insert("Not A Slug", "ok"), "skus_id_check"),
        (insert("-lead", "ok"), "skus_id_check"),
        (insert("fine", ""), "skus_name_check"),
        (insert("fine", &"n".repeat(201)), "skus_name_check"),
    ] {
        let sql: &'static str = Box::leak(sql.into_boxed_str());
        assert_eq!(
            refused(sql).await,
            (Some("23514".to_string()), Some(constraint.to_string())),
            "{sql}"
        );
    }
    assert_eq!(
        refused("UPDATE skus SET id = 'BAD' WHERE sale_id = 'guarded'")
            .await
            .1
            .as_deref(),
        Some("skus_id_check")
    );
    assert_eq!(
        refused("UPDATE skus SET name = '' WHERE sale_id = 'guarded'")
            .await
            .1
            .as_deref(),
        Some("skus_name_check")
    );
    assert_eq!(
        refused("UPDATE skus SET held = held + 6 WHERE sale_id = 'guarded'")
            .await
            .1
            .as_deref(),
        Some("skus_units_kept")
    );
    // A good SKU goes in, and its counters move within its units.
    sqlx::query(&insert("size-42", "Size 42"))
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("UPDATE skus SET held = held + 1 WHERE sale_id = 'guarded' AND id = 'size-42'")
        .execute(pool)
        .await
        .unwrap();
    app.stop().await;
}
