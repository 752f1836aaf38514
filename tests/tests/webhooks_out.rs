//! Outgoing webhooks (issue 46) against real receivers: each endpoint is
//! `docs/examples/webhook_receiver.py`, which verifies every delivery with
//! the Standard Webhooks reference library (an independent check of the
//! signing), over real HTTP from the running origin's worker.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use origin::events::webhooks::schedule::Schedule;
use origin::events::webhooks::store;
use origin::ops::configuration::WebhookSettings;
use serde_json::Value;
use tests::{AppOptions, TestApp, free_port, repo_root, sale_spec};

/// A receiver process; its verified deliveries are JSON lines in a file.
struct Receiver {
    child: Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    fn start(port: u16, secret: &str, extra: &[&str]) -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("deliveries.jsonl");
        let root = repo_root();
        let child = Command::new(root.join(".tools/venv/bin/python"))
            .arg(root.join("docs/examples/webhook_receiver.py"))
            .args(["--port", &port.to_string(), "--secret", secret])
            .args(extra)
            .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
            .spawn()
            .expect("the receiver starts (scripts/setup installs .tools/venv)");
        let r = Receiver {
            child,
            out,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !r.lines().iter().any(|l| l.get("listening").is_some()) {
            assert!(Instant::now() < deadline, "the receiver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The deliveries it verified and answered 2xx, in arrival order.
    fn accepted(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l.get("type").is_some())
            .collect()
    }

    /// Waits until `n` deliveries were accepted (or 30 s).
    async fn wait_for(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.accepted();
            if got.len() >= n || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn app_options(schedule: &str, timeout: Duration) -> AppOptions {
    AppOptions {
        webhooks: WebhookSettings {
            allow_private: true,
            timeout,
            schedule: Schedule::parse(schedule).unwrap(),
        },
        ..Default::default()
    }
}

/// (status, attempts, last_status, last_error) of every delivery to `endpoint`.
async fn deliveries(
    app: &TestApp,
    endpoint: &str,
) -> Vec<(String, i32, Option<i32>, Option<String>)> {
    sqlx::query_as(
        "SELECT status, attempts, last_status, last_error FROM webhook_deliveries
          WHERE endpoint_id = $1 ORDER BY id",
    )
    .bind(endpoint)
    .fetch_all(&app.state.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_receivers_verified_once_each_in_order_and_filtered() {
    let app = TestApp::spawn_with(app_options("200ms,400ms,1s", Duration::from_secs(5))).await;
    app.create_sale(sale_spec("wh", 20, 2, 2)).await;
    let (p1, p2) = (free_port(), free_port());
    let all = store::add(
        &app.state.pool,
        &format!("http://127.0.0.1:{p1}/hook"),
        None,
    )
    .await
    .unwrap();
    let paid_only = store::add(
        &app.state.pool,
        &format!("http://127.0.0.1:{p2}/hook"),
        store::event_filter(Some("order.paid")).unwrap(),
    )
    .await
    .unwrap();
    // A third of the events fail once at the first receiver (500): they
    // come again on the schedule.
    let r1 = Receiver::start(p1, &all.secret, &["--fail-share", "0.33"]);
    let r2 = Receiver::start(p2, &paid_only.secret, &[]);

    let mut paid = Vec::new();
    let mut cancelled = Vec::new();
    for i in 0..6 {
        let (id, t) = app.reserve_one("wh", &format!("buyer-{i}")).await;
        if i % 2 == 0 {
            let (s, p) = app.purchase(&id, &t).await;
            assert_eq!(s, 201, "{p}");
            let pay = p["payment_id"].as_str().unwrap();
            let (s, r) = app
                .payment_event(&format!("pe_{i}"), "payment.succeeded", pay, 4_999)
                .await;
            assert_eq!(s, 200, "{r}");
            paid.push(id);
        } else {
            assert_eq!(app.cancel(&id, &t).await, 200);
            cancelled.push(id);
        }
    }
    // held ×6, started ×3, paid ×3, cancelled ×3.
    let got = r1.wait_for(15).await;
    assert_eq!(
        got.len(),
        15,
        "{:#?} {:#?}",
        r1.lines(),
        sqlx::query_as::<_, (i64, String, Value, Option<chrono::DateTime<chrono::Utc>>)>(
            "SELECT id, type, payload, published_at FROM outbox ORDER BY id"
        )
        .fetch_all(&app.state.pool)
        .await
        .unwrap()
    );
    assert!(
        r1.lines().iter().all(|l| l.get("rejected").is_none()),
        "every delivery verifies with the reference library: {:#?}",
        r1.lines()
    );
    assert!(
        r1.lines()
            .iter()
            .any(|l| l.get("failed_on_purpose").is_some()),
        "some deliveries failed at first (the share is 1/3 of 15 events)"
    );
    let ids: HashSet<&str> = got.iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), got.len(), "an event accepted twice");
    let mut stories: HashMap<&str, Vec<&str>> = HashMap::new();
    for l in &got {
        stories
            .entry(l["reservation_id"].as_str().unwrap())
            .or_default()
            .push(l["type"].as_str().unwrap());
    }
    for id in &paid {
        assert_eq!(
            stories[id.as_str()],
            ["reservation.held", "payment.started", "order.paid"],
            "{id}"
        );
    }
    for id in &cancelled {
        assert_eq!(
            stories[id.as_str()],
            ["reservation.held", "reservation.cancelled"],
            "{id}"
        );
    }
    let got2 = r2.wait_for(3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(r2.accepted().len(), 3);
    assert!(got2.iter().all(|l| l["type"] == "order.paid"), "{got2:#?}");
    // The worker records each 2xx right after the receiver answered.
    let deadline = Instant::now() + Duration::from_secs(5);
    let d = loop {
        let d = deliveries(&app, &all.id).await;
        if d.len() == 15 && d.iter().all(|(s, ..)| s == "delivered") {
            break d;
        }
        assert!(Instant::now() < deadline, "{d:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(d.iter().any(|(_, attempts, ..)| *attempts == 2), "{d:?}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_dead_letters_then_replay_delivers_and_a_rotated_secret_verifies() {
    let app = TestApp::spawn_with(app_options("100ms,100ms", Duration::from_secs(2))).await;
    app.create_sale(sale_spec("whdead", 5, 1, 1)).await;
    let port = free_port();
    let ep = store::add(&app.state.pool, &format!("http://127.0.0.1:{port}/"), None)
        .await
        .unwrap();
    // Nobody listens: three attempts (the first and two retries), then dead.
    let (id, _) = app.reserve_one("whdead", "dana").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = deliveries(&app, &ep.id).await;
        if d.len() == 1 && d[0].0 == "dead" {
            assert_eq!(d[0].1, 3, "{d:?}");
            assert!(d[0].3.as_deref().is_some_and(|e| !e.is_empty()), "{d:?}");
            break;
        }
        assert!(Instant::now() < deadline, "not dead in time: {d:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = store::list(&app.state.pool).await.unwrap();
    assert_eq!((listed[0].pending, listed[0].dead), (0, 1));

    // The endpoint comes back with the rotated secret only: the old one
    // still signs beside it, the new one verifies.
    let rotated = store::rotate(&app.state.pool, &ep.id, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_ne!(rotated.secret, ep.secret);
    let r = Receiver::start(port, &rotated.secret, &[]);
    assert_eq!(
        store::replay(&app.state.pool, &ep.id, None).await.unwrap(),
        1
    );
    let got = r.wait_for(1).await;
    assert_eq!(got.len(), 1, "{:#?}", r.lines());
    assert_eq!(got[0]["id"], format!("evt_{id}.held"));
    // The worker records the 2xx right after the receiver answered.
    let deadline = Instant::now() + Duration::from_secs(5);
    while deliveries(&app, &ep.id).await[0].0 != "delivered" {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            deliveries(&app, &ep.id).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing dead is left to replay; an unknown endpoint is an error.
    assert_eq!(
        store::replay(&app.state.pool, &ep.id, None).await.unwrap(),
        0
    );
    assert!(matches!(
        store::replay(&app.state.pool, "wh_nope", None).await,
        Err(store::EndpointError::NoSuchEndpoint(_))
    ));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_endpoint_does_not_hold_up_another_and_redirects_are_not_followed() {
    let app = TestApp::spawn_with(app_options("1h", Duration::from_millis(800))).await;
    app.create_sale(sale_spec("whslow", 50, 1, 1)).await;
    let (slow_port, fast_port, redirect_port) = (free_port(), free_port(), free_port());
    let slow = store::add(
        &app.state.pool,
        &format!("http://127.0.0.1:{slow_port}/"),
        None,
    )
    .await
    .unwrap();
    let fast = store::add(
        &app.state.pool,
        &format!("http://127.0.0.1:{fast_port}/"),
        None,
    )
    .await
    .unwrap();
    let redirecting = store::add(
        &app.state.pool,
        &format!("http://127.0.0.1:{redirect_port}/"),
        None,
    )
    .await
    .unwrap();
    let _s = Receiver::start(slow_port, &slow.secret, &["--delay", "30"]);
    let f = Receiver::start(fast_port, &fast.secret, &[]);
    let target_port = free_port();
    let target = Receiver::start(target_port, &fast.secret, &[]);
    let _r = Receiver::start(
        redirect_port,
        &redirecting.secret,
        &["--redirect", &format!("http://127.0.0.1:{target_port}/")],
    );
    let started = Instant::now();
    for i in 0..30 {
        app.reserve_one("whslow", &format!("s-{i}")).await;
    }
    // Every slow delivery times out (800 ms) and waits an hour; the fast
    // endpoint gets all 30 meanwhile, as if the slow one did not exist.
    let got = f.wait_for(30).await;
    assert_eq!(got.len(), 30);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let d = deliveries(&app, &slow.id).await;
    assert!(d.iter().all(|(s, ..)| s == "pending"), "{d:?}");
    // A 302 is a failed delivery; nothing reaches where it points.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = deliveries(&app, &redirecting.id).await;
        if d.len() == 30 && d.iter().all(|(_, a, ..)| *a >= 1) {
            assert!(d.iter().all(|(_, _, st, _)| *st == Some(302)), "{d:?}");
            break;
        }
        assert!(Instant::now() < deadline, "{d:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(target.accepted().is_empty());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allow_private_a_name_resolving_inside_is_refused_at_delivery() {
    let app = TestApp::spawn_with(AppOptions {
        webhooks: WebhookSettings {
            allow_private: false,
            timeout: Duration::from_secs(2),
            schedule: Schedule::parse("1h").unwrap(),
        },
        ..Default::default()
    })
    .await;
    app.create_sale(sale_spec("whguard", 5, 1, 1)).await;
    let port = free_port();
    // Written past the CLI's check (as if the name had resolved outside
    // when it was added, and inside now: DNS rebinding).
    let ep = store::add(&app.state.pool, &format!("https://localhost:{port}/"), None)
        .await
        .unwrap();
    let r = Receiver::start(port, &ep.secret, &[]);
    app.reserve_one("whguard", "gus").await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let d = deliveries(&app, &ep.id).await;
        if let Some((_, 1, None, Some(e))) = d.first() {
            assert!(e.contains("loopback, private"), "{e}");
            break;
        }
        assert!(Instant::now() < deadline, "{d:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(r.lines().iter().all(|l| l.get("listening").is_some()));
    app.stop().await;
}
