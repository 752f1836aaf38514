//! Every change a shop acts on leaves as an event (issue 46, migration
//! 0017): holds, cancellations, expiries, purchases started, payments
//! failed and paid, over real HTTP against real Redis and Postgres, read
//! back from the events stream the relay publishes to.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::Value;
use tests::{TestApp, sale_spec};

/// One event as a consumer of the Redis stream reads it.
#[derive(Debug, Clone)]
struct Seen {
    id: String,
    kind: String,
    data: Value,
}

async fn stream_events(app: &TestApp) -> Vec<Seen> {
    let mut conn = app.redis().await;
    let reply: redis::streams::StreamRangeReply = conn
        .xrange_all(format!("{}:events", app.prefix))
        .await
        .unwrap();
    reply
        .ids
        .iter()
        .map(|e| Seen {
            id: e.get("event_id").unwrap(),
            kind: e.get("type").unwrap(),
            data: serde_json::from_str(&e.get::<String>("payload").unwrap()).unwrap(),
        })
        .collect()
}

/// The stream once it holds at least `n` events (the relay polls).
async fn wait_for_events(app: &TestApp, n: usize) -> Vec<Seen> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = stream_events(app).await;
        if seen.len() >= n || Instant::now() > deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The types of `reservation`'s events, in stream order.
fn story(seen: &[Seen], reservation: &str) -> Vec<String> {
    seen.iter()
        .filter(|e| e.data["reservation_id"] == reservation)
        .map(|e| e.kind.clone())
        .collect()
}

async fn reserve(app: &TestApp, sale: &str, acct: &str) -> (String, String) {
    let t = app.admit(acct, sale);
    let (s, b, _) = app.reserve(sale, Some(&t), Some("k"), r#"{"qty":1}"#).await;
    assert_eq!(s, 202, "{b}");
    (b["reservation_id"].as_str().unwrap().to_string(), t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_of_a_reservation_leaves_once_in_order_naming_sale_sku_and_reservation() {
    let app = TestApp::spawn().await;
    let mut spec = sale_spec("ev", 10, 2, 1);
    spec.hold_seconds = 3;
    app.create_sale(spec).await;

    // Cancelled.
    let (a, ta) = reserve(&app, "ev", "ann").await;
    // Purchase started, payment failed; then started again and paid.
    let (b, tb) = reserve(&app, "ev", "bob").await;
    // Left to expire (3 s holds, the sweep runs every 200 ms).
    let (c, _) = reserve(&app, "ev", "cat").await;

    let (s, p) = app.purchase(&b, &tb).await;
    assert_eq!(s, 201, "{p}");
    let pay1 = p["payment_id"].as_str().unwrap().to_string();
    assert_eq!(app.cancel(&a, &ta).await, 200);
    let (s, r) = app
        .payment_event("pe_1", "payment.failed", &pay1, 4_999)
        .await;
    assert_eq!(s, 200, "{r}");
    let (s, p) = app.purchase(&b, &tb).await;
    assert_eq!(s, 201, "{p}");
    let pay2 = p["payment_id"].as_str().unwrap().to_string();
    let (s, r) = app
        .payment_event("pe_2", "payment.succeeded", &pay2, 4_999)
        .await;
    assert_eq!(s, 200, "{r}");

    // held ×3, cancelled, expired, started ×2, failed, paid.
    let seen = wait_for_events(&app, 9).await;
    assert_eq!(
        story(&seen, &a),
        ["reservation.held", "reservation.cancelled"]
    );
    assert_eq!(
        story(&seen, &b),
        [
            "reservation.held",
            "payment.started",
            "payment.failed",
            "payment.started",
            "order.paid"
        ]
    );
    assert_eq!(
        story(&seen, &c),
        ["reservation.held", "reservation.expired"]
    );
    assert_eq!(seen.len(), 9, "{seen:#?}");

    // Every event names the sale, the SKU and the reservation; ids are
    // unique and say what changed.
    let ids: HashSet<&str> = seen.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), seen.len());
    for e in &seen {
        assert_eq!(e.data["sale"], "ev", "{e:?}");
        assert_eq!(e.data["sku"], "ev", "{e:?}");
        assert!(e.data["reservation_id"].is_string(), "{e:?}");
    }
    let by_id: HashMap<&str, &Seen> = seen.iter().map(|e| (e.id.as_str(), e)).collect();
    let held = by_id[format!("evt_{c}.held").as_str()];
    assert_eq!(
        (held.data["account"].as_str(), held.data["qty"].as_i64()),
        (Some("cat"), Some(1))
    );
    assert_eq!(
        by_id[format!("evt_{c}.expired").as_str()].data["reason"],
        "expired"
    );
    assert_eq!(
        by_id[format!("evt_{a}.cancelled").as_str()].data["reason"],
        "cancelled"
    );
    let failed = by_id[format!("evt_{pay1}.failed").as_str()];
    assert_eq!(failed.data["amount_cents"], 4_999);
    assert!(by_id.contains_key(format!("evt_{pay2}.started").as_str()));

    // Nothing is left in the outbox, and nothing more comes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(stream_events(&app).await.len(), 9);
    let unsent: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_eq!(unsent, 0);
    app.stop().await;
}

/// Hundreds of holds settled in batches by the running settler, racing
/// each other: each hold Postgres keeps has exactly one `reservation.held`
/// event, and no event names a hold Postgres does not keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_holds_each_leave_exactly_one_held_event() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("evrace", 300, 1, 4)).await;
    let tokens: Vec<String> = (0..400)
        .map(|i| app.admit(&format!("acct-{i}"), "evrace"))
        .collect();
    let answers = futures::future::join_all(
        tokens
            .iter()
            .map(|t| app.reserve("evrace", Some(t), Some("k"), r#"{"qty":1}"#)),
    )
    .await;
    let granted = answers.iter().filter(|(s, _, _)| *s == 202).count();
    assert_eq!(granted, 300, "the sale sells exactly its units");
    let seen = wait_for_events(&app, 300).await;
    let held: Vec<&str> = seen
        .iter()
        .filter(|e| e.kind == "reservation.held")
        .map(|e| e.data["reservation_id"].as_str().unwrap())
        .collect();
    let unique: HashSet<&str> = held.iter().copied().collect();
    assert_eq!(held.len(), unique.len(), "a hold announced twice");
    let rows: HashSet<String> =
        sqlx::query_scalar::<_, String>("SELECT id FROM reservations WHERE sale_id = 'evrace'")
            .fetch_all(&app.state.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(rows.len(), 300);
    let announced: HashSet<String> = unique.iter().map(|s| s.to_string()).collect();
    assert_eq!(announced, rows);
    app.stop().await;
}
