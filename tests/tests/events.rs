//! Every change a shop acts on leaves as an event (issue 46, migration
//! 0017): holds, cancellations, expiries, purchases started, payments
//! failed and paid, over real HTTP against real Redis and Postgres, read
//! back from the events stream the relay publishes to.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use origin::events::relay::relay_wal_once;
use origin::events::sink::RedisStreamSink;
use origin::events::wal::slot::{SlotError, WalSlot};
use origin::ops::configuration::OutboxSource;
use origin::ops::workers::Workers;
use redis::AsyncCommands;
use serde_json::Value;
use tests::postgres::PostgresServer;
use tests::{AppOptions, TestApp, sale_spec};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_of_a_reservation_leaves_once_in_order_naming_sale_sku_and_reservation() {
    let app = TestApp::spawn().await;
    each_change_leaves_once_in_order(&app).await;
    app.stop().await;
}

/// The same story with the relay reading the outbox's inserts from a
/// logical replication slot (`OUTBOX_SOURCE=wal`) on a Postgres of the
/// test's own: the same events, once each, in order; the slot confirmed
/// past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_wal_slot_each_change_leaves_once_in_order_and_the_slot_is_confirmed() {
    let pg = PostgresServer::start_logical();
    let app = TestApp::spawn_with(wal_options(&pg, Workers::ALL)).await;
    each_change_leaves_once_in_order(&app).await;
    // Confirmed past every event: nothing is read again.
    let pending = unconfirmed(&app).await;
    assert_eq!(pending, 0, "changes left unconfirmed in the slot");
    app.stop().await;
}

/// An app on `pg`'s server whose relay reads the slot `flashsale_outbox`.
fn wal_options(pg: &PostgresServer, workers: Workers) -> AppOptions {
    AppOptions {
        workers,
        outbox_source: OutboxSource::Wal {
            slot: "flashsale_outbox".into(),
        },
        pg_admin_url: Some(pg.admin_url()),
        ..Default::default()
    }
}

async fn each_change_leaves_once_in_order(app: &TestApp) {
    let mut spec = sale_spec("ev", 10, 2, 1);
    spec.hold_seconds = 3;
    app.create_sale(spec).await;

    // Cancelled.
    let (a, ta) = app.reserve_one("ev", "ann").await;
    // Purchase started, payment failed; then started again and paid.
    let (b, tb) = app.reserve_one("ev", "bob").await;
    // Left to expire (3 s holds, the sweep runs every 200 ms).
    let (c, _) = app.reserve_one("ev", "cat").await;

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
    let seen = wait_for_events(app, 9).await;
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
    assert_eq!(stream_events(app).await.len(), 9);
    let unsent: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_eq!(unsent, 0);
}

/// Hundreds of holds settled in batches by the running settler, racing
/// each other: each hold Postgres keeps has exactly one `reservation.held`
/// event, and no event names a hold Postgres does not keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_holds_each_leave_exactly_one_held_event() {
    let app = TestApp::spawn().await;
    racing_holds_leave_one_held_event_each(&app).await;
    app.stop().await;
}

/// The same through the WAL slot: batch rows of hundreds of holds decoded
/// from the log, each hold announced once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_the_wal_slot_racing_holds_each_leave_exactly_one_held_event() {
    let pg = PostgresServer::start_logical();
    let app = TestApp::spawn_with(wal_options(&pg, Workers::ALL)).await;
    racing_holds_leave_one_held_event_each(&app).await;
    app.stop().await;
}

async fn racing_holds_leave_one_held_event_each(app: &TestApp) {
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
    let seen = wait_for_events(app, 300).await;
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
}

/// A relay that stops after the sink acknowledged but before it marked
/// the rows and moved the slot (a crash) leaves the slot where it was
/// confirmed: the next relay sends the same events again, same ids, and
/// loses none; one that stops after marking but before moving the slot
/// sends nothing again. Then the slot is confirmed and reads empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_relay_killed_before_it_confirms_resumes_where_the_slot_was_confirmed() {
    let pg = PostgresServer::start_logical();
    let app = TestApp::spawn_with(wal_options(
        &pg,
        Workers {
            relay: false,
            ..Workers::ALL
        },
    ))
    .await;
    let slot = WalSlot {
        name: "flashsale_outbox".into(),
    };
    slot.prepare(&app.state.pool).await.unwrap();
    let sink = RedisStreamSink {
        conn: app.redis().await,
        stream: format!("{}:events", app.prefix),
        acker: None,
    };
    app.create_sale(sale_spec("evwal", 10, 1, 1)).await;
    let mut holds = Vec::new();
    for who in ["ann", "bob", "cat"] {
        holds.push(app.reserve_one("evwal", who).await.0);
    }
    // Settled (the outbox rows commit with the holds): three held events
    // wait in the slot.
    settled(&app, 3).await;

    // Killed after the sink acknowledged: published, not marked, not confirmed.
    let r = relay_wal_once(&app.state.pool, &sink, &slot, true)
        .await
        .unwrap();
    assert_eq!(r.events, 3);
    let first = stream_events(&app).await;
    assert_eq!(first.len(), 3);
    assert!(
        unpublished(&app).await > 0,
        "nothing marked before the crash"
    );

    // The next relay: the same three again, same ids; now marked and confirmed.
    let r = relay_wal_once(&app.state.pool, &sink, &slot, false)
        .await
        .unwrap();
    assert_eq!(r.events, 3);
    let again = stream_events(&app).await;
    assert_eq!(again.len(), 6);
    let ids = |s: &[Seen]| s.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    assert_eq!(
        ids(&again[3..]),
        ids(&first),
        "sent again with the same ids"
    );
    let expected: HashSet<String> = holds.iter().map(|h| format!("evt_{h}.held")).collect();
    assert_eq!(ids(&first).into_iter().collect::<HashSet<_>>(), expected);
    assert_eq!(unpublished(&app).await, 0);
    let r = relay_wal_once(&app.state.pool, &sink, &slot, false)
        .await
        .unwrap();
    assert_eq!(r.events, 0, "a confirmed slot reads nothing again");

    // Marked but not confirmed (a relay killed between its commit and the
    // slot's advance, played by marking a new row by hand): read again
    // from the slot, not sent again, then confirmed.
    app.reserve_one("evwal", "dan").await;
    settled(&app, 4).await;
    sqlx::query("UPDATE outbox SET published_at = now() WHERE published_at IS NULL")
        .execute(&app.state.pool)
        .await
        .unwrap();
    let r = relay_wal_once(&app.state.pool, &sink, &slot, false)
        .await
        .unwrap();
    assert_eq!(r.events, 0, "a row already marked is not sent again");
    assert_eq!(stream_events(&app).await.len(), 6);
    let pending = unconfirmed(&app).await;
    assert_eq!(pending, 0, "the slot was moved past what was read");
    app.stop().await;
}

/// `OUTBOX_SOURCE=wal` on a server without logical WAL (the shared one
/// runs `wal_level=replica`) is refused with what to change, and creates
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_source_refuses_a_server_without_logical_wal() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..Default::default()
    })
    .await;
    let level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_ne!(
        level, "logical",
        "this test needs the shared server as it is"
    );
    let err = WalSlot {
        name: "flashsale_outbox".into(),
    }
    .prepare(&app.state.pool)
    .await
    .unwrap_err();
    assert!(matches!(err, SlotError::NotLogical(_)), "{err}");
    assert!(err.to_string().contains("wal_level=logical"), "{err}");
    let publications: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_publication")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_eq!(publications, 0);
    app.stop().await;
}

/// Waits until `n` holds of `evwal` are in Postgres.
async fn settled(app: &TestApp, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let kept: i64 =
            sqlx::query_scalar("SELECT count(*) FROM reservations WHERE sale_id = 'evwal'")
                .fetch_one(&app.state.pool)
                .await
                .unwrap();
        if kept == n {
            return;
        }
        assert!(Instant::now() < deadline, "{kept} of {n} holds settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Messages the slot `flashsale_outbox` holds past its confirmed position.
async fn unconfirmed(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(
             'flashsale_outbox', NULL, NULL, 'proto_version', '1',
             'publication_names', 'flashsale_outbox')",
    )
    .fetch_one(&app.state.pool)
    .await
    .unwrap()
}

async fn unpublished(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(&app.state.pool)
        .await
        .unwrap()
}
