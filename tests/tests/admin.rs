//! The admin API (issue 47) against a real origin, Postgres and Redis:
//! keys and scopes, the writes and their audit entries (applied and
//! refused), the append-only audit log, and the live view as JSON and as
//! Server-Sent Events.

use std::time::Duration;

use chrono::Utc;
use reqwest::Method;
use serde_json::{Value, json};
use tests::{ADMIN_READ_KEY, ADMIN_WRITE_KEY, AppOptions, TestApp, sale_spec};

const W: Option<&str> = Some(ADMIN_WRITE_KEY);
const R: Option<&str> = Some(ADMIN_READ_KEY);

async fn audit(app: &TestApp, sale: &str) -> Vec<Value> {
    let (s, b) = app
        .admin(Method::GET, &format!("audit?sale={sale}"), R, None)
        .await;
    assert_eq!(s, 200, "{b}");
    b["entries"].as_array().unwrap().clone()
}

/// The sale row as Postgres has it (what the API must not have changed).
async fn row(app: &TestApp, sale: &str) -> (bool, f64, Option<String>, chrono::DateTime<Utc>) {
    sqlx::query_as("SELECT paused, admission_rate, message, starts_at FROM sales WHERE id = $1")
        .bind(sale)
        .fetch_one(&app.state.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_before_anything_and_a_read_key_cannot_write() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("keys", 10, 1, 1)).await;
    let before = row(&app, "keys").await;
    // No key, a wrong key, a key as Basic: 401 with WWW-Authenticate.
    for auth in [
        None,
        Some("Bearer not-a-key-at-all-0000000000"),
        Some("Basic x"),
    ] {
        let mut req = app
            .client
            .post(format!("{}/admin/api/sales/keys/pause", app.admin_addr));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), 401, "{auth:?}");
        assert_eq!(res.headers()["www-authenticate"], "Bearer");
        let b: Value = res.json().await.unwrap();
        assert_eq!(b["error"]["code"], "admin_key_required");
    }
    let (s, b) = app.admin(Method::GET, "sales", None, None).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (401, Some("admin_key_required"))
    );
    // A read key reads, and is refused a write.
    let (s, b) = app.admin(Method::GET, "sales", R, None).await;
    assert_eq!(s, 200, "{b}");
    assert!(
        b["sales"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["sale"] == "keys")
    );
    let (s, b) = app.admin(Method::POST, "sales/keys/pause", R, None).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("admin_scope")),
        "{b}"
    );
    assert_eq!(row(&app, "keys").await, before, "nothing changed");
    // Each refused write is in the audit log, by key id where one was known.
    let entries = audit(&app, "keys").await;
    assert_eq!(entries.len(), 4, "{entries:#?}");
    assert_eq!(entries[0]["key_id"], "viewer");
    assert_eq!(entries[0]["error"], "admin_scope");
    for e in &entries[1..] {
        assert_eq!(e["key_id"], Value::Null);
        assert_eq!(e["error"], "admin_key_required");
    }
    assert!(
        entries
            .iter()
            .all(|e| e["refused"] == true && e["action"] == "pause")
    );
    // The public port serves no admin route.
    let (s, _) = app.get("/admin/api/sales", R).await;
    assert_eq!(s, 404);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_over_its_rate_is_answered_429_with_retry_after() {
    let app = TestApp::spawn_with(AppOptions {
        admin_rate_per_s: 2,
        ..AppOptions::default()
    })
    .await;
    let mut statuses = Vec::new();
    let mut retry = None;
    for _ in 0..8 {
        let res = app
            .client
            .get(format!("{}/admin/api/sales", app.admin_addr))
            .bearer_auth(ADMIN_READ_KEY)
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
        if res.status() == 429 {
            retry = res.headers().get("retry-after").cloned();
        }
    }
    assert_eq!(&statuses[..4], &[200; 4], "a burst of twice the rate");
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(retry.is_some_and(|r| r.to_str().unwrap().parse::<u64>().unwrap() >= 1));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_rate_message_and_end_reach_the_summary_at_once_with_their_audit_entries() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("steer", 10, 1, 1)).await;
    // Warm the origin's caches: the change must not wait for their TTL.
    let (_, s) = app.get("/api/sales/steer", None).await;
    assert_eq!(
        (s["paused"].as_bool(), s["message"].clone()),
        (Some(false), Value::Null)
    );

    let (st, b) = app.admin(Method::POST, "sales/steer/pause", W, None).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["after"]["paused"], true);
    let (_, s) = app.get("/api/sales/steer", None).await;
    assert_eq!(s["paused"], true, "the public summary says so at once");

    let (st, _) = app
        .admin(
            Method::POST,
            "sales/steer/rate",
            W,
            Some(json!({"rate": 7.5})),
        )
        .await;
    assert_eq!(st, 200);
    let text = "<b>Size 42</b> is sold out & <script>alert(1)</script>";
    let (st, b) = app
        .admin(
            Method::POST,
            "sales/steer/message",
            W,
            Some(json!({"text": text})),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    let (_, s) = app.get("/api/sales/steer", None).await;
    assert_eq!(s["admission_rate"], 7.5);
    assert_eq!(
        s["message"], text,
        "markup is kept as typed (pages show text)"
    );
    assert!(s["message_at"].is_string());

    let (st, _) = app.admin(Method::POST, "sales/steer/resume", W, None).await;
    assert_eq!(st, 200);
    let (st, _) = app
        .admin(
            Method::POST,
            "sales/steer/message",
            W,
            Some(json!({"text": ""})),
        )
        .await;
    assert_eq!(st, 200);
    let (_, s) = app.get("/api/sales/steer", None).await;
    assert_eq!(
        (s["paused"].as_bool(), s["message"].clone()),
        (Some(false), Value::Null)
    );

    let (st, _) = app.admin(Method::POST, "sales/steer/end", W, None).await;
    assert_eq!(st, 200);
    let (_, s) = app.get("/api/sales/steer", None).await;
    assert_eq!(s["phase"], "ended");

    // Newest first, each by key id, with before and after.
    let entries = audit(&app, "steer").await;
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["end", "message", "resume", "message", "rate", "pause"]
    );
    for e in &entries {
        assert_eq!(e["key_id"], "operator");
        assert_eq!(e["refused"], false);
        assert!(e["before"].is_object() && e["after"].is_object(), "{e}");
    }
    assert_eq!(entries[5]["before"]["paused"], false);
    assert_eq!(entries[5]["after"]["paused"], true);
    assert_eq!(entries[4]["request"], json!({"rate": 7.5}));
    assert_eq!(entries[4]["after"]["admission_rate"], 7.5);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_writes_are_refused_clearly_change_nothing_and_are_audited() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("live", 10, 1, 1)).await;
    let mut later = sale_spec("later", 10, 1, 1);
    later.starts_at = Utc::now() + chrono::Duration::hours(1);
    app.create_sale(later).await;
    let live_before = row(&app, "live").await;

    let long = "x".repeat(281);
    let cases: Vec<(Method, &str, Option<Value>, u16, &str)> = vec![
        (
            Method::POST,
            "sales/live/message",
            Some(json!({"text": long})),
            400,
            "message_too_long",
        ),
        (
            Method::POST,
            "sales/live/message",
            Some(json!({"txt": "hi"})),
            400,
            "invalid_change",
        ),
        (
            Method::POST,
            "sales/live/rate",
            Some(json!({"rate": -1})),
            400,
            "invalid_change",
        ),
        (
            Method::POST,
            "sales/live/rate",
            Some(json!({"rate": "fast"})),
            400,
            "invalid_change",
        ),
        (Method::POST, "sales/live/rate", None, 400, "invalid_change"),
        (
            Method::PATCH,
            "sales/live",
            Some(json!({"admission_rate": 3})),
            409,
            "sale_started",
        ),
        (
            Method::PATCH,
            "sales/live",
            Some(json!({"starts_at": (Utc::now() + chrono::Duration::hours(2)).to_rfc3339()})),
            409,
            "sale_started",
        ),
        (
            Method::POST,
            "sales/nope/pause",
            None,
            404,
            "sale_not_found",
        ),
        (
            Method::POST,
            "sales/Not%20A%20Sale/pause",
            None,
            404,
            "sale_not_found",
        ),
    ];
    for (method, path, body, status, code) in cases {
        let (s, b) = app.admin(method.clone(), path, W, body.clone()).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (status, Some(code)),
            "{method} {path} {body:?}: {b}"
        );
    }
    // Not JSON at all.
    let res = app
        .client
        .post(format!("{}/admin/api/sales/live/message", app.admin_addr))
        .bearer_auth(ADMIN_WRITE_KEY)
        .body("{text:")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    assert_eq!(
        res.json::<Value>().await.unwrap()["error"]["code"],
        "malformed_json"
    );
    assert_eq!(row(&app, "live").await, live_before, "nothing changed");

    let refused = audit(&app, "live").await;
    assert_eq!(refused.len(), 8, "{refused:#?}");
    assert!(
        refused
            .iter()
            .all(|e| e["refused"] == true && e["after"].is_null())
    );
    assert_eq!(refused[0]["error"], "malformed_json");
    assert_eq!(refused[0]["request"]["unparsed"], "{text:");
    assert_eq!(audit(&app, "nope").await[0]["error"], "sale_not_found");

    // Before its start, a sale's start may move, and only to the future.
    let new_start = (Utc::now() + chrono::Duration::hours(3)).trunc_subsecs(0);
    let (s, b) = app
        .admin(
            Method::PATCH,
            "sales/later",
            W,
            Some(json!({"starts_at": new_start.to_rfc3339(), "admission_rate": 12})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (_, _, _, starts) = row(&app, "later").await;
    assert_eq!(starts, new_start);
    let (s, b) = app
        .admin(
            Method::PATCH,
            "sales/later",
            W,
            Some(json!({"starts_at": (Utc::now() - chrono::Duration::hours(1)).to_rfc3339()})),
        )
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (400, Some("invalid_change")),
        "{b}"
    );
    let (s, b) = app
        .admin(Method::PATCH, "sales/later", W, Some(json!({"units": 5})))
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (400, Some("invalid_change")),
        "{b}"
    );
    assert_eq!(row(&app, "later").await.3, new_start);
    app.stop().await;
}

use chrono::SubsecRound;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_pages_newest_first_and_postgres_refuses_to_change_it() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("log", 10, 1, 1)).await;
    for i in 0..5 {
        let (s, _) = app
            .admin(
                Method::POST,
                "sales/log/rate",
                W,
                Some(json!({"rate": 10 + i})),
            )
            .await;
        assert_eq!(s, 200);
    }
    let (_, first) = app
        .admin(Method::GET, "audit?sale=log&limit=2", R, None)
        .await;
    let ids: Vec<i64> = first["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids[0] > ids[1], "newest first");
    assert_eq!(first["entries"][0]["request"]["rate"], 14);
    let next = first["next_before"].as_i64().unwrap();
    let (_, rest) = app
        .admin(
            Method::GET,
            &format!("audit?sale=log&limit=10&before={next}"),
            R,
            None,
        )
        .await;
    assert_eq!(rest["entries"].as_array().unwrap().len(), 3);
    assert_eq!(rest["next_before"], Value::Null);
    for bad in ["audit?limit=0", "audit?limit=501", "audit?before=x"] {
        let (s, b) = app.admin(Method::GET, bad, R, None).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (400, Some("invalid_change")),
            "{bad}"
        );
    }
    // Append-only, whoever asks.
    for sql in [
        "UPDATE audit_log SET key_id = 'someone-else'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
    ] {
        let e = sqlx::query(sql).execute(&app.state.pool).await.unwrap_err();
        assert!(e.to_string().contains("append-only"), "{sql}: {e}");
    }
    assert_eq!(audit(&app, "log").await.len(), 5);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_counts_holds_and_streams_a_frame_a_second() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("watch", 50, 5, 2)).await;
    let (s, f) = app.admin(Method::GET, "sales/watch/live", R, None).await;
    assert_eq!(s, 200, "{f}");
    assert_eq!(f["sale"], "watch");
    assert_eq!(f["units_total"], 50);
    assert_eq!(f["queue"], Value::Null);
    assert!(
        f["queue_error"]
            .as_str()
            .unwrap()
            .contains("ADMIN_EDGE_URL"),
        "a figure it cannot read is null with the reason: {f}"
    );
    let (s, _) = app.admin(Method::GET, "sales/none/live", R, None).await;
    assert_eq!(s, 404);

    // The stream: frames a second apart, and holds made meanwhile show.
    let res = app
        .client
        .get(format!(
            "{}/admin/api/sales/watch/live/stream",
            app.admin_addr
        ))
        .bearer_auth(ADMIN_READ_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let mut res = res;
    let mut frames: Vec<Value> = Vec::new();
    let mut buf = String::new();
    let mut held = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while frames.len() < 4 {
        let chunk = tokio::time::timeout_at(deadline, res.chunk())
            .await
            .expect("frames keep coming")
            .unwrap()
            .expect("the stream stays open");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                assert!(event.contains("event: frame"), "{event}");
                frames.push(serde_json::from_str(data).unwrap());
                // Between frames, some holds.
                if held < 6 {
                    for _ in 0..3 {
                        app.reserve_one("watch", &format!("a{held}")).await;
                        held += 1;
                    }
                }
            }
        }
    }
    let at = |f: &Value| chrono::DateTime::parse_from_rfc3339(f["at"].as_str().unwrap()).unwrap();
    for w in frames.windows(2) {
        let gap = (at(&w[1]) - at(&w[0])).num_milliseconds();
        assert!((500..=2_500).contains(&gap), "frames {gap} ms apart");
    }
    let rates: Vec<f64> = frames
        .iter()
        .filter_map(|f| f["holds_per_s"].as_f64())
        .collect();
    assert!(rates.iter().any(|r| *r > 0.0), "holds/s moved: {rates:?}");
    let last = frames.last().unwrap();
    assert_eq!(last["units_left"], 44, "{last}");
    assert_eq!(
        last["skus"][0]["units_left"], 44,
        "per SKU too: {}",
        last["skus"]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_account_gets_no_new_hold_but_keeps_what_it_holds() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("rev", 20, 3, 4)).await;
    let t = app.admit("buyer", "rev");
    let (s, first, _) = app
        .reserve("rev", Some(&t), Some("k1"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202, "{first}");
    let (s, b) = app
        .admin(
            Method::POST,
            "sales/rev/revoke",
            W,
            Some(json!({"account": "buyer"})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["after"]["new"], true);
    assert_eq!(
        b["after"]["edge"], "not_configured",
        "no ADMIN_EDGE_URL here"
    );
    // No new hold, on whichever shard; the first hold's replay still answers it.
    let (s, e, _) = app
        .reserve("rev", Some(&t), Some("k2"), r#"{"qty":1}"#)
        .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (403, Some("admission_revoked")),
        "{e}"
    );
    let (s, again, _) = app
        .reserve("rev", Some(&t), Some("k1"), r#"{"qty":1}"#)
        .await;
    assert_eq!(s, 202);
    assert_eq!(again["reservation_id"], first["reservation_id"]);
    // Others are not touched, and nothing was released.
    let (s, _, _) = app
        .reserve(
            "rev",
            Some(&app.admit("other", "rev")),
            Some("k"),
            r#"{"qty":2}"#,
        )
        .await;
    assert_eq!(s, 202);
    let (_, summary) = app.get("/api/sales/rev", None).await;
    assert_eq!(summary["units_available"], 17);
    // Again: nothing more changes.
    let (s, b) = app
        .admin(
            Method::POST,
            "sales/rev/revoke",
            W,
            Some(json!({"account": "buyer"})),
        )
        .await;
    assert_eq!((s, b["after"]["new"].as_bool()), (200, Some(false)));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM revocations WHERE sale_id = 'rev'")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    // Bad input: refused, audited, nothing recorded.
    for (path, body, status, code) in [
        (
            "sales/rev/revoke",
            json!({"account": ""}),
            400,
            "invalid_change",
        ),
        (
            "sales/rev/revoke",
            json!({"who": "x"}),
            400,
            "invalid_change",
        ),
        (
            "sales/gone/revoke",
            json!({"account": "x"}),
            404,
            "sale_not_found",
        ),
    ] {
        let (s, b) = app.admin(Method::POST, path, W, Some(body)).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (status, Some(code)),
            "{path}: {b}"
        );
    }
    let entries = audit(&app, "rev").await;
    let got: Vec<(&str, Option<&str>)> = entries
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["error"].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("revoke", Some("invalid_change")),
            ("revoke", Some("invalid_change")),
            ("revoke", None),
            ("revoke", None)
        ]
    );
    assert_eq!(
        entries[3]["after"],
        json!({"account": "buyer", "revoked": true})
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_elsewhere_reaches_this_origin_at_once_not_within_its_config_ttl() {
    // As another origin's admin API or `origin sale update` would: straight
    // to Postgres, nothing said to this process but the NOTIFY at commit.
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("elsewhere", 10, 1, 1)).await;
    let (_, s) = app.get("/api/sales/elsewhere", None).await;
    assert_eq!(s["paused"], false, "the config is cached now");
    let change = origin::sales::spec::SaleChange {
        paused: Some(true),
        ..Default::default()
    };
    origin::sales::spec::change_sale(&app.state.pool, "elsewhere", &change)
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let (_, s) = app.get("/api/sales/elsewhere", None).await;
        if s["paused"] == true {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_millis(2_500),
            "not seen within 2.5 s (the config TTL alone is 5 s, plus the summary's 1 s)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_is_created_from_the_create_flags_as_json_with_its_audit_entry() {
    let app = TestApp::spawn().await;
    let starts = (Utc::now() + chrono::Duration::hours(2)).to_rfc3339();
    let body = json!({
        "sale": "made-here", "name": "Sizes", "starts_at": starts,
        "sku": ["s41:3:12900", "s42:2:12900:1"], "per_user_limit": 2, "shards": 2,
        "bot_shadow": true,
    });
    let (s, b) = app
        .admin(Method::POST, "sales", R, Some(body.clone()))
        .await;
    assert_eq!((s, b["error"]["code"].as_str()), (403, Some("admin_scope")));
    let (s, b) = app
        .admin(Method::POST, "sales", W, Some(body.clone()))
        .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["sale"], "made-here");
    assert_eq!(b["units_total"], 5);
    assert_eq!(b["bot_shadow"], true);
    assert_eq!(b["skus"].as_array().unwrap().len(), 2);
    let (_, summary) = app.get("/api/sales/made-here", None).await;
    assert_eq!(summary["phase"], "upcoming");
    assert_eq!(summary["units_available"], 5, "Redis stock laid out");
    assert_eq!(summary["join_limit"], 1000, "the CLI's defaults");
    // Again: refused, nothing changed.
    let (s, b) = app.admin(Method::POST, "sales", W, Some(body)).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("sale_exists")),
        "{b}"
    );
    for (bad, says) in [
        (
            json!({"sale": "x1", "name": "n", "starts_at": "now", "shards": 1}),
            "units",
        ),
        (
            json!({"sale": "x2", "name": "n", "starts_at": "soon", "units": 1, "shards": 1}),
            "RFC 3339",
        ),
        (
            json!({"sale": "x3", "name": "n", "starts_at": "now", "units": 1, "colour": "red"}),
            "colour",
        ),
        (
            json!({"sale": "x4", "name": "n", "starts_at": "now", "skus": "/etc/passwd"}),
            "no file",
        ),
        (json!(["not", "an", "object"]), "object"),
    ] {
        let (s, b) = app.admin(Method::POST, "sales", W, Some(bad.clone())).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (400, Some("invalid_change")),
            "{bad}: {b}"
        );
        assert!(
            b["error"]["message"].as_str().unwrap().contains(says),
            "{bad}: {b}"
        );
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sales WHERE id LIKE 'x%'")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    let entries = audit(&app, "made-here").await;
    let got: Vec<(&str, Option<&str>)> = entries
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["error"].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("create", Some("sale_exists")),
            ("create", None),
            ("create", Some("admin_scope"))
        ]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_shard_keeps_its_revoked_accounts_revoked() {
    let app = TestApp::spawn_with(AppOptions {
        reconcile_interval: Duration::from_secs(3_600),
        ..AppOptions::default()
    })
    .await;
    app.create_sale(sale_spec("lost", 20, 2, 2)).await;
    let (s, _) = app
        .admin(
            Method::POST,
            "sales/lost/revoke",
            W,
            Some(json!({"account": "eve"})),
        )
        .await;
    assert_eq!(s, 200);
    // Redis loses every key of the sale (a cold restart).
    let keys = app.keys_matching(&format!("{}*", app.prefix)).await;
    assert!(!keys.is_empty());
    let mut conn = app.redis().await;
    for k in keys {
        let _: () = redis::AsyncCommands::del(&mut conn, k).await.unwrap();
    }
    let sale = app.state.sales.get("lost").await.unwrap().unwrap();
    let rebuilt = origin::settle::rebuild::rebuild_sale(&app.state.engine, &app.state.pool, &sale)
        .await
        .unwrap();
    assert_eq!(rebuilt, vec![0, 1]);
    let (s, b, _) = app
        .reserve(
            "lost",
            Some(&app.admit("eve", "lost")),
            Some("k"),
            r#"{"qty":1}"#,
        )
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("admission_revoked")),
        "{b}"
    );
    let (s, _, _) = app
        .reserve(
            "lost",
            Some(&app.admit("bob", "lost")),
            Some("k"),
            r#"{"qty":1}"#,
        )
        .await;
    assert_eq!(s, 202, "others sell");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_addr_equal_to_the_metrics_addr_serves_both_on_one_listener() {
    let app = TestApp::spawn_with(AppOptions {
        admin_on_metrics_addr: true,
        ..Default::default()
    })
    .await;
    let c = reqwest::Client::new();
    // What ORIGIN_METRICS_ADDR serves, keyless as on its own listener.
    let m = c
        .get(format!("{}/metrics", app.admin_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(m.status(), 200);
    assert!(
        m.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain"),
        "Prometheus text"
    );
    let h = c
        .get(format!("{}/healthz", app.admin_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200);
    // The admin API beside them keeps its gate.
    let url = format!("{}/admin/api/sales", app.admin_addr);
    let no_key = c.get(&url).send().await.unwrap();
    assert_eq!(no_key.status(), 401);
    let read = c
        .get(&url)
        .bearer_auth(ADMIN_READ_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    let unknown = c
        .get(format!("{}/nowhere", app.admin_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
}
