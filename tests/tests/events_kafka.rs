//! The outbox relay's Kafka sink (issue 46) against a real Kafka-protocol
//! broker (tansu, started here on a free port), read back by an independent
//! client (kcat, librdkafka): every event on the topic with its id and type
//! in headers and its versioned envelope as value, keyed `<sale>/<sku>` in
//! the partition Kafka's own partitioner picks, one key's events in outbox
//! order; the topic created when missing; a broker killed mid-relay and
//! restarted loses nothing (repeats carry the same event id); a relay that
//! dies between the broker's ack and its mark sends the event again with
//! the same id; and the origin's own relay (`EVENTS_SINK=kafka`) puts a
//! real purchase's `order.paid` on the topic.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use origin::events::kafka::{KafkaSink, partition_for};
use origin::events::relay::relay_once;
use origin::ops::configuration::{EventsSink, KafkaSettings};
use origin::ops::workers::Workers;
use serde_json::{Value, json};
use tests::broker::{Consumed, KafkaBroker, consume_all};
use tests::{AppOptions, TestApp, sale_spec};

fn settings(broker: &KafkaBroker, topic: &str, partitions: i32) -> KafkaSettings {
    KafkaSettings {
        brokers: vec![broker.addr()],
        topic: topic.to_string(),
        partitions,
        replication: 1,
        client_id: "flashsale-test".into(),
        timeout: Duration::from_secs(5),
    }
}

/// An app with no background workers: the tests drive the relay.
async fn idle_app() -> TestApp {
    TestApp::spawn_with(AppOptions {
        workers: Workers::NONE,
        ..AppOptions::default()
    })
    .await
}

/// `n` outbox rows as the product writes them, over two sales of three SKUs
/// each (and every seventh without a SKU); `seq` counts per key, so a
/// consumer can check one key's order.
async fn write_events(app: &TestApp, n: usize) -> Vec<String> {
    let mut per_key: HashMap<String, u64> = HashMap::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let sale = ["drop-a", "drop-b"][i % 2];
        let sku = (i % 7 != 0).then(|| format!("size-{}", 40 + i % 3));
        let key = match &sku {
            Some(s) => format!("{sale}/{s}"),
            None => sale.to_string(),
        };
        let seq = per_key.entry(key).or_default();
        *seq += 1;
        let id = format!("evt_test_{i:05}");
        let payload = json!({"sale": sale, "sku": sku, "seq": *seq, "i": i});
        sqlx::query("INSERT INTO outbox (event_id, type, payload) VALUES ($1, $2, $3)")
            .bind(&id)
            .bind(if i % 3 == 0 {
                "order.paid"
            } else {
                "reservation.held"
            })
            .bind(payload)
            .execute(&app.state.pool)
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

async fn unpublished(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(&app.state.pool)
        .await
        .unwrap()
}

/// Every record is what the outbox row says, in the partition of its key,
/// and each key's events come in the order they were written.
fn check_records(records: &[Consumed], partitions: i32) {
    let mut last_seq: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_id: BTreeMap<String, String> = BTreeMap::new();
    for r in records {
        let v = &r.value;
        assert_eq!(v["version"], 1, "{v}");
        assert_eq!(r.headers["event_id"], v["id"].as_str().unwrap(), "{r:?}");
        assert_eq!(
            r.headers["event_type"],
            v["type"].as_str().unwrap(),
            "{r:?}"
        );
        let key = match v["sku"].as_str() {
            Some(sku) => format!("{}/{sku}", v["sale"].as_str().unwrap()),
            None => v["sale"].as_str().unwrap().to_string(),
        };
        assert_eq!(r.key, key, "{r:?}");
        assert_eq!(
            r.partition,
            i64::from(partition_for(key.as_bytes(), partitions)),
            "{key} in the partition Kafka's partitioner picks"
        );
        // A repeat (same id) may come again; otherwise seq only grows.
        let seq = v["data"]["seq"].as_u64().unwrap();
        let id = v["id"].as_str().unwrap().to_string();
        if last_id.get(&key) != Some(&id) {
            let prev = last_seq.get(&key).copied().unwrap_or(0);
            assert!(
                seq > prev || records.iter().filter(|o| o.value["id"] == v["id"]).count() > 1,
                "{key}: event seq {seq} after {prev}: out of order"
            );
            last_seq.insert(key.clone(), seq.max(prev));
        }
        last_id.insert(key, id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_puts_every_event_on_the_topic_keyed_by_sku_in_order() {
    let broker = KafkaBroker::start();
    let app = idle_app().await;
    let ids = write_events(&app, 300).await;
    let s = settings(&broker, "flashsale.events", 3);
    // The topic does not exist yet: the sink creates it.
    let sink = KafkaSink::connect(&s).await.expect("sink connects");
    assert_eq!(sink.partition_count(), 3);
    let mut sent = 0;
    loop {
        let n = relay_once(&app.state.pool, &sink, 100, false)
            .await
            .unwrap();
        if n == 0 {
            break;
        }
        sent += n;
    }
    assert_eq!(sent, 300);
    assert_eq!(unpublished(&app).await, 0);

    let records = consume_all(&broker.addr(), "flashsale.events");
    let got: Vec<&str> = records
        .iter()
        .map(|r| r.headers["event_id"].as_str())
        .collect();
    assert_eq!(got.len(), 300, "each event once: {got:?}");
    assert_eq!(
        got.iter().copied().collect::<HashSet<_>>(),
        ids.iter().map(String::as_str).collect::<HashSet<_>>()
    );
    check_records(&records, 3);
    // Every partition is used: 7 keys over 3 partitions.
    let used: HashSet<i64> = records.iter().map(|r| r.partition).collect();
    assert!(used.len() > 1, "{used:?}");

    // An existing topic is used as it is, whatever KAFKA_PARTITIONS says.
    let again = KafkaSink::connect(&settings(&broker, "flashsale.events", 8))
        .await
        .unwrap();
    assert_eq!(again.partition_count(), 3);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_dying_after_the_ack_sends_the_event_again_with_the_same_id() {
    let broker = KafkaBroker::start();
    let app = idle_app().await;
    write_events(&app, 5).await;
    let sink = KafkaSink::connect(&settings(&broker, "t.die", 2))
        .await
        .unwrap();
    // Published and acknowledged, then the relay "dies" before marking.
    assert_eq!(
        relay_once(&app.state.pool, &sink, 100, true).await.unwrap(),
        5
    );
    assert_eq!(unpublished(&app).await, 5, "nothing marked");
    assert_eq!(
        relay_once(&app.state.pool, &sink, 100, false)
            .await
            .unwrap(),
        5
    );
    assert_eq!(unpublished(&app).await, 0);
    let records = consume_all(&broker.addr(), "t.die");
    assert_eq!(records.len(), 10, "every event twice");
    let mut copies: HashMap<String, Vec<Value>> = HashMap::new();
    for r in &records {
        copies
            .entry(r.headers["event_id"].clone())
            .or_default()
            .push(r.value.clone());
    }
    assert_eq!(copies.len(), 5);
    for (id, values) in copies {
        assert_eq!(values.len(), 2, "{id}");
        assert_eq!(values[0], values[1], "{id}: a repeat is the same event");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_mid_relay_and_restarted_loses_nothing() {
    let mut broker = KafkaBroker::start();
    let app = idle_app().await;
    let ids = write_events(&app, 3_000).await;
    let s = settings(&broker, "t.kill", 3);
    let sink = KafkaSink::connect(&s).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let relay = tokio::spawn(origin::events::relay::run(
        app.state.pool.clone(),
        sink,
        Default::default(),
        stop.clone(),
    ));
    // Kill it once some, not all, are out.
    let deadline = Instant::now() + Duration::from_secs(60);
    while unpublished(&app).await > 2_500 {
        assert!(Instant::now() < deadline, "the relay made no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.kill();
    let left_when_killed = unpublished(&app).await;
    assert!(left_when_killed > 0, "killed mid-relay, not after it");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // At most the batch in flight at the kill was acknowledged and marked;
    // nothing else can be while the broker is down.
    let left_while_down = unpublished(&app).await;
    assert!(
        left_while_down > 0 && left_while_down + 100 >= left_when_killed,
        "{left_while_down} unpublished 2 s after the kill, {left_when_killed} at it"
    );
    broker.restart();
    let deadline = Instant::now() + Duration::from_secs(90);
    while unpublished(&app).await > 0 {
        assert!(
            Instant::now() < deadline,
            "{} events still unpublished 90 s after the restart; broker log:\n{}",
            unpublished(&app).await,
            broker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    relay.await.unwrap();

    let records = consume_all(&broker.addr(), "t.kill");
    let mut seen: HashMap<String, Value> = HashMap::new();
    for r in &records {
        let id = r.headers["event_id"].clone();
        if let Some(first) = seen.get(&id) {
            assert_eq!(first, &r.value, "{id}: a repeat is the same event");
        }
        seen.insert(id, r.value.clone());
    }
    // A consumer that dedupes by id sees each event exactly once.
    assert_eq!(
        seen.keys().cloned().collect::<HashSet<_>>(),
        ids.into_iter().collect::<HashSet<_>>(),
        "every event on the topic"
    );
    check_records(&records, 3);
    eprintln!(
        "broker killed with {left_when_killed} of 3000 unpublished; {} records on the topic for 3000 events",
        records.len()
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origins_relay_puts_a_paid_order_on_the_topic() {
    let broker = KafkaBroker::start();
    let app = TestApp::spawn_with(AppOptions {
        events: EventsSink::Kafka(settings(&broker, "shop.events", 2)),
        ..AppOptions::default()
    })
    .await;
    app.create_sale(sale_spec("kdrop", 10, 2, 1)).await;
    let token = app.admit("alice", "kdrop");
    let (s, b, _) = app
        .reserve("kdrop", Some(&token), Some("k1"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202, "{b}");
    let id = b["reservation_id"].as_str().unwrap().to_string();
    let (s, p) = app.purchase(&id, &token).await;
    assert_eq!(s, 201, "{p}");
    let (s, w) = app
        .payment_event(
            "evt_provider_1",
            "payment.succeeded",
            p["payment_id"].as_str().unwrap(),
            p["amount_cents"].as_i64().unwrap(),
        )
        .await;
    assert_eq!(s, 200, "{w}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let paid = loop {
        let records = consume_all(&broker.addr(), "shop.events");
        if let Some(r) = records
            .iter()
            .find(|r| r.headers["event_type"] == "order.paid")
        {
            break r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no order.paid on the topic: {records:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(paid.value["data"]["reservation_id"], id.as_str());
    assert_eq!(paid.value["sale"], "kdrop");
    assert_eq!(
        paid.key,
        format!("kdrop/{}", paid.value["sku"].as_str().unwrap())
    );
    assert_eq!(unpublished(&app).await, 0);
    app.stop().await;
}
