//! Test harness for the origin's integration tests: each test gets the
//! origin spawned in-process on port 0, a fresh Postgres database and a
//! unique Redis key prefix, so tests run in parallel against the shared
//! local servers without seeing each other. Tests that need a Redis of their
//! own (restart, cluster) start `redis-server` on free loopback ports with
//! [`RedisServer`] / [`RedisCluster`]. `TEST_LOG=1` shows the origin's logs;
//! `TEST_REDIS_LOGS=<dir>` keeps the logs of the Redis servers and sentinels
//! tests start (`redis-<port or socket dir>.log`, `sentinel-<port>.log`).

pub mod broker;
pub mod postgres;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use origin::ops::configuration::{AckMode, EventsSink, RedisTarget, Settings};
use origin::ops::startup::Application;
use origin::ops::state::AppState;
use origin::ops::workers::Workers;
use origin::sales::sale::SaleConfig;
use origin::sales::spec::SaleSpec;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use redis::AsyncCommands;
use serde_json::Value;
use token::{Claims, KeyRing, TokenType};
use tokio_util::sync::CancellationToken;

/// Held (through [`heavy`]) by load-heavy and timing-sensitive tests so
/// that two of them never share the 2 CPU cores at once — also when they
/// live in different test binaries, which cargo runs side by side: an
/// exclusive `flock` on one file of the checkout's `target/`.
pub struct Heavy {
    _file: std::fs::File,
}

/// Waits for the heavy-test lock; held until the returned guard drops
/// (closing the file releases the lock, also when a test panics).
pub async fn heavy() -> Heavy {
    let dir = repo_root().join("target");
    std::fs::create_dir_all(&dir).expect("target/ exists or can be made");
    let path = dir.join(".heavy-tests.lock");
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .expect("heavy-test lock file");
        file.lock().expect("flock");
        Heavy { _file: file }
    })
    .await
    .expect("lock task")
}

/// Local Postgres maintenance URL (trust auth, as on the dev machines and CI).
pub fn pg_admin_url() -> String {
    std::env::var("TEST_PG_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The shared local Redis.
pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A loopback TCP port that was free a moment ago. Only for an address
/// that must stay closed, or a server that cannot be handed a bound socket
/// nor bind port 0 itself (Redis's TLS port): servers the tests start bind
/// port 0 or a Unix socket themselves ([`RedisServer`], [`OriginProcess`]).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `TEST_REDIS_LOGS`: where test-owned Redis servers and sentinels log
/// (unset: nowhere).
fn redis_log_dir() -> Option<String> {
    std::env::var("TEST_REDIS_LOGS")
        .ok()
        .filter(|d| !d.is_empty())
}

/// A free loopback port for a Redis Cluster node, whose cluster bus listens
/// on port + 10000: both must be free, so the port must be ≤ 55535 — which
/// the kernel's ephemeral range (up to 60999) does not promise.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = 20_000 + (rand_u16() % 25_000);
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

fn rand_u16() -> u16 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u16::from_le_bytes([b[0], b[1]])
}

/// A throwaway database; dropped (forcibly) when this value is dropped.
pub struct TestDb {
    pub name: String,
    pub url: String,
    /// The maintenance URL of the server it lives on.
    admin: String,
}

impl TestDb {
    /// One on the shared local Postgres.
    pub async fn create() -> TestDb {
        Self::create_on(&pg_admin_url()).await
    }

    /// One on the server whose maintenance URL is `admin`.
    pub async fn create_on(admin: &str) -> TestDb {
        use sqlx::Connection;
        let name = format!("fs_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(admin)
            .await
            .expect("local Postgres reachable (scripts/setup starts it)");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let url = format!(
            "{}/{name}",
            admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(admin)
        );
        TestDb {
            name,
            url,
            admin: admin.to_string(),
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin = self.admin.clone();
        // A separate thread with its own runtime: Drop may run inside one.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    use sqlx::Connection;
                    if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                        let _ =
                            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                                .execute(&mut c)
                                .await;
                    }
                });
            }
        })
        .join();
    }
}

fn ring_secret(kid: &str) -> [u8; 32] {
    let mut secret = [0u8; 32];
    for (i, b) in kid.bytes().cycle().take(32).enumerate() {
        secret[i] = b.wrapping_add(i as u8);
    }
    secret
}

/// Deterministic-per-run test keys.
pub fn ring(kid: &str) -> KeyRing {
    KeyRing::from_keys(&[(kid, &ring_secret(kid))]).unwrap()
}

/// The same ring as [`ring`], as the `kid:base64key` text of the
/// environment (for running the `origin` binary).
pub fn ring_env(kid: &str) -> String {
    use base64::Engine;
    format!(
        "{kid}:{}",
        base64::engine::general_purpose::STANDARD.encode(ring_secret(kid))
    )
}

pub fn now_secs() -> u64 {
    origin::ops::clock::now_secs()
}

/// The payment webhook secret of every [`TestApp`].
pub const WEBHOOK_SECRET: &str = "whsec_test";

/// The `read` admin key of every [`TestApp`] (`ADMIN_KEYS` id `viewer`).
pub const ADMIN_READ_KEY: &str = "viewer-secret-0123456789abcdef";
/// The `write` admin key of every [`TestApp`] (`ADMIN_KEYS` id `operator`).
pub const ADMIN_WRITE_KEY: &str = "operator-secret-0123456789abcdef";

/// The `ADMIN_KEYS` value of every [`TestApp`].
pub fn admin_keys_value() -> String {
    format!("operator:write:{ADMIN_WRITE_KEY},viewer:read:{ADMIN_READ_KEY}")
}

/// A running origin for one test.
pub struct TestApp {
    pub addr: String,
    pub port: u16,
    /// The admin listener's base URL (`http://127.0.0.1:<port>`).
    pub admin_addr: String,
    pub prefix: String,
    pub db: TestDb,
    pub redis: RedisTarget,
    pub user_keys: KeyRing,
    pub admission_keys: KeyRing,
    pub client: reqwest::Client,
    pub state: AppState,
    stop: CancellationToken,
    handle: Option<tokio::task::JoinHandle<()>>,
}

/// Options for [`TestApp::spawn_with`].
#[derive(Clone)]
pub struct AppOptions {
    pub redis: RedisTarget,
    pub redis_ack: AckMode,
    pub workers: Workers,
    pub max_in_flight: usize,
    pub sweep_interval: Duration,
    pub reconcile_interval: Duration,
    /// Where the outbox relay publishes (the Redis stream unless a test
    /// runs a broker).
    pub events: EventsSink,
    /// How webhooks are delivered: loopback endpoints allowed (the tests'
    /// receivers), and whatever schedule a test needs.
    pub webhooks: origin::ops::configuration::WebhookSettings,
    /// How the relay finds new outbox rows (the table unless a test runs
    /// a Postgres with logical WAL).
    pub outbox_source: origin::ops::configuration::OutboxSource,
    /// The Postgres server the app's database is made on (`None`: the
    /// shared local one).
    pub pg_admin_url: Option<String>,
    /// The edge the admin API reads queue figures from (`ADMIN_EDGE_URL`).
    pub admin_edge_url: Option<String>,
    /// Admin API requests per second per address (`ADMIN_RATE_PER_S`).
    pub admin_rate_per_s: u32,
    /// `ADMIN_ADDR` equal to `ORIGIN_METRICS_ADDR` (one listener for the
    /// admin API, `/metrics` and `/healthz`), on a free loopback port.
    pub admin_on_metrics_addr: bool,
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions {
            redis: RedisTarget::Single(redis_url()),
            redis_ack: AckMode::Local,
            workers: Workers::ALL,
            max_in_flight: 1_000_000,
            sweep_interval: Duration::from_millis(200),
            reconcile_interval: Duration::from_secs(60),
            events: EventsSink::RedisStream,
            webhooks: origin::ops::configuration::WebhookSettings {
                allow_private: true,
                ..Default::default()
            },
            outbox_source: Default::default(),
            pg_admin_url: None,
            admin_edge_url: None,
            admin_rate_per_s: 1_000,
            admin_on_metrics_addr: false,
        }
    }
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(AppOptions::default()).await
    }

    pub async fn spawn_with(opts: AppOptions) -> TestApp {
        if std::env::var("TEST_LOG").is_ok_and(|v| !v.is_empty() && v != "0") {
            origin::ops::telemetry::init_tracing("info,sqlx=warn");
        }
        let db = match &opts.pg_admin_url {
            Some(admin) => TestDb::create_on(admin).await,
            None => TestDb::create().await,
        };
        let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let admin_addr: std::net::SocketAddr = if opts.admin_on_metrics_addr {
            // A port free now (the listener is dropped before the app binds it).
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free loopback port")
        } else {
            "127.0.0.1:0".parse().unwrap()
        };
        let settings = Settings {
            database_url: db.url.clone().into(),
            redis: opts.redis.clone(),
            redis_ack: opts.redis_ack,
            key_prefix: prefix.clone(),
            user_keys: ring("usr1"),
            admission_keys: ring("adm1"),
            payment_webhook_secrets: vec![WEBHOOK_SECRET.to_string().into()],
            addr: "127.0.0.1:0".parse().unwrap(),
            sweep_interval: opts.sweep_interval,
            reconcile_interval: opts.reconcile_interval,
            settle_claim_idle: Duration::from_millis(500),
            settle_linger: Duration::from_millis(50),
            max_in_flight: opts.max_in_flight,
            metrics_addr: opts.admin_on_metrics_addr.then_some(admin_addr),
            pg_pool_size: 16,
            workers_nice: 10,
            shutdown_grace: Duration::from_secs(10),
            auto_migrate: true,
            dev_mode: true,
            events: opts.events.clone(),
            webhooks: opts.webhooks.clone(),
            outbox_source: opts.outbox_source.clone(),
            relay_abort_after_ack: None,
            admin: origin::ops::configuration::AdminSettings {
                addr: admin_addr,
                keys: token::AdminKeys::parse(Some(&admin_keys_value())).unwrap(),
                edge_url: opts.admin_edge_url.clone(),
                edge_secret: Some(ADMIN_WRITE_KEY.to_string().into()),
                rate_per_s: opts.admin_rate_per_s,
            },
        };
        let app = Application::build(settings, opts.workers)
            .await
            .expect("origin builds");
        let port = app.port();
        let admin_port = app.admin_port().expect("the admin listener is bound");
        let state = app.state();
        let stop = CancellationToken::new();
        let s = stop.clone();
        let handle = tokio::spawn(async move {
            app.run_until_stopped(s).await.expect("origin runs");
        });
        let app = TestApp {
            addr: format!("http://127.0.0.1:{port}"),
            port,
            admin_addr: format!("http://127.0.0.1:{admin_port}"),
            prefix,
            db,
            redis: opts.redis,
            user_keys: ring("usr1"),
            admission_keys: ring("adm1"),
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(512)
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            state,
            stop,
            handle: Some(handle),
        };
        app.wait_until_serving().await;
        app
    }

    /// Returns once the origin answers `/healthz`: `run_until_stopped`
    /// starts the workers (their own Redis connections) before it serves,
    /// so a test that breaks Redis right after `spawn` (a failover test
    /// cutting the replicas off) would otherwise race the origin's start.
    async fn wait_until_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = self
                .client
                .get(format!("{}/healthz", self.addr))
                .send()
                .await;
            if answer.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            let ended = self.handle.as_ref().is_none_or(|h| h.is_finished());
            assert!(!ended, "the origin stopped before it served");
            assert!(
                Instant::now() < deadline,
                "the origin did not serve within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the origin and waits for it.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            let _ = h.await;
        }
    }

    /// What a failover to a replica that never had `id` leaves: the hold gone
    /// from Redis with every effect it had there (stock back, the account's
    /// count and spill quota down, its key record and spill marker gone), no
    /// stream record written — while Postgres, where the settler already wrote
    /// it, still has it.
    pub async fn forget_hold(&self, sale: &origin::sales::sale::Sale, id: &str) {
        let mut conn = self.redis().await;
        for (i, k) in sale.shards.iter().enumerate() {
            let raw: Option<String> = conn.hget(&k.holds, id).await.unwrap();
            let Some(raw) = raw else { continue };
            let h = origin::reserve::engine::HoldRecord::parse(&raw).unwrap();
            let home = &sale.shards[h.home];
            let _: () = conn.hdel(&k.holds, id).await.unwrap();
            let _: () = conn.zrem(&k.exp, id).await.unwrap();
            let _: () = conn.incr(&k.stock, h.qty).await.unwrap();
            let _: () = conn.hincr(&home.users, &h.account, -h.qty).await.unwrap();
            // A revoke written after the hold (at its purchase) is not on
            // a replica that never had the hold either.
            let _: () = conn
                .hdel(
                    &home.users,
                    origin::sales::revoke::revoked_field(&h.account),
                )
                .await
                .unwrap();
            let _: () = conn.hdel(&home.quota, id).await.unwrap();
            let _: () = conn
                .del(home.idem_at(h.idem.as_deref().unwrap()))
                .await
                .unwrap();
            if h.home != i {
                let _: () = conn.del(k.spill_marker(id)).await.unwrap();
            }
            return;
        }
        panic!("no hold {id}");
    }

    /// The ids of every hold Redis keeps for `sale`, over all its shards.
    pub async fn redis_hold_ids(&self, sale: &str) -> HashSet<String> {
        let s = self
            .state
            .sales
            .get(sale)
            .await
            .unwrap()
            .expect("sale exists");
        let mut conn = self.redis().await;
        let mut ids = HashSet::new();
        for k in &s.shards {
            let h: HashMap<String, String> = conn.hgetall(&k.holds).await.unwrap();
            ids.extend(h.into_keys());
        }
        ids
    }

    /// A Redis connection of the kind the app uses.
    pub async fn redis(&self) -> origin::reserve::store::RedisConn {
        origin::reserve::store::connect(&self.redis)
            .await
            .expect("redis")
    }

    /// Creates a sale through the product's own `sale create` path.
    pub async fn create_sale(&self, spec: SaleSpec) -> SaleConfig {
        let mut conn = self.redis().await;
        origin::sales::spec::create_sale(&self.state.pool, &mut conn, &self.prefix, &spec)
            .await
            .expect("sale created")
    }

    pub fn admit(&self, sub: &str, sale: &str) -> String {
        self.admission_keys.sign(&Claims::new(
            TokenType::Admit,
            sub,
            Some(sale.to_string()),
            now_secs(),
            120,
        ))
    }

    pub fn user(&self, sub: &str) -> String {
        self.user_keys
            .sign(&Claims::new(TokenType::User, sub, None, now_secs(), 3600))
    }

    /// Admits `account` and holds one unit of `sale` for it (asserting the
    /// 202); returns (reservation id, admission token).
    pub async fn reserve_one(&self, sale: &str, account: &str) -> (String, String) {
        let t = self.admit(account, sale);
        let (s, b, _) = self
            .reserve(sale, Some(&t), Some("k"), r#"{"qty":1}"#)
            .await;
        assert_eq!(s, 202, "{b}");
        (b["reservation_id"].as_str().unwrap().to_string(), t)
    }

    /// POST a reservation; returns (status, body, headers).
    pub async fn reserve(
        &self,
        sale: &str,
        token: Option<&str>,
        key: Option<&str>,
        body: &str,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req = self
            .client
            .post(format!("{}/api/sales/{sale}/reservations", self.addr))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        let res = req.send().await.expect("request sent");
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let body = res.json().await.unwrap_or(Value::Null);
        (status, body, headers)
    }

    /// DELETE (cancel) a reservation; returns the status.
    pub async fn cancel(&self, id: &str, token: &str) -> u16 {
        self.client
            .delete(format!("{}/api/reservations/{id}", self.addr))
            .bearer_auth(token)
            .send()
            .await
            .expect("request sent")
            .status()
            .as_u16()
    }

    /// POST `…/reservations/{id}/purchase`; returns (status, JSON body).
    pub async fn purchase(&self, id: &str, token: &str) -> (u16, Value) {
        let res = self
            .client
            .post(format!("{}/api/reservations/{id}/purchase", self.addr))
            .bearer_auth(token)
            .send()
            .await
            .expect("request sent");
        (
            res.status().as_u16(),
            res.json().await.unwrap_or(Value::Null),
        )
    }

    /// One unit held for `account` in `sale` and a purchase of it started:
    /// (reservation id, the admit token, the payment id). Panics on any
    /// other answer.
    pub async fn reserve_and_purchase(
        &self,
        sale: &str,
        account: &str,
    ) -> (String, String, String) {
        let token = self.admit(account, sale);
        let (s, b, _) = self
            .reserve(sale, Some(&token), Some("k"), r#"{"qty":1}"#)
            .await;
        assert_eq!(s, 202, "{b}");
        let id = b["reservation_id"].as_str().unwrap().to_string();
        let (s, p) = self.purchase(&id, &token).await;
        assert_eq!(s, 201, "{p}");
        let payment = p["payment_id"].as_str().unwrap().to_string();
        (id, token, payment)
    }

    /// POST a payment provider event with `Payment-Signature: sig` (none
    /// when `None`); returns (status, JSON body). The app's webhook secret
    /// is [`WEBHOOK_SECRET`].
    pub async fn webhook(&self, body: &str, sig: Option<String>) -> (u16, Value) {
        let mut req = self
            .client
            .post(format!("{}/webhooks/payments", self.addr))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(s) = sig {
            req = req.header("Payment-Signature", s);
        }
        let res = req.send().await.expect("request sent");
        (
            res.status().as_u16(),
            res.json().await.unwrap_or(Value::Null),
        )
    }

    /// POST the provider event `{id, type: kind, data: {payment_id,
    /// amount_cents}}`, signed with [`WEBHOOK_SECRET`] now; returns (status,
    /// JSON body).
    pub async fn payment_event(
        &self,
        id: &str,
        kind: &str,
        payment: &str,
        amount_cents: i64,
    ) -> (u16, Value) {
        let body = serde_json::json!({"id": id, "type": kind,
                                      "data": {"payment_id": payment, "amount_cents": amount_cents}})
        .to_string();
        let sig =
            origin::payments::webhook::sign_webhook(WEBHOOK_SECRET, now_secs(), body.as_bytes());
        self.webhook(&body, Some(sig)).await
    }

    /// The Prometheus text of `GET /metrics`.
    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.addr))
            .send()
            .await
            .expect("request sent")
            .text()
            .await
            .expect("metrics text")
    }

    /// An admin API call (`/admin/api/<path>`) with the bearer `key`;
    /// returns (status, JSON body).
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, format!("{}/admin/api/{path}", self.admin_addr));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("request sent");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// GET a path; returns (status, JSON body).
    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let mut req = self.client.get(format!("{}{path}", self.addr));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.expect("request sent");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// The names of the keys in this app's Redis that match `pattern`
    /// (other tests' keys too, where that Redis is the shared one), by
    /// `SCAN`: `KEYS` would block every other test's requests for as long as
    /// it walks the whole keyspace.
    pub async fn keys_matching(&self, pattern: &str) -> Vec<String> {
        assert!(
            matches!(self.redis, RedisTarget::Single(_)),
            "keys are listed on a single Redis"
        );
        let mut conn = self.redis().await;
        let opts = redis::ScanOptions::default()
            .with_pattern(pattern)
            .with_count(1000);
        let mut names: Vec<String> = conn
            .scan_options::<String>(opts)
            .await
            .expect("SCAN")
            .map(|name| name.expect("SCAN"))
            .collect()
            .await;
        names.sort();
        names.dedup();
        names
    }

    /// Every key of this app's prefix with its DUMP, sorted: a fingerprint
    /// of the Redis state for "changes nothing" assertions. The events
    /// stream is left out: it is the product's output, not its state, and
    /// the relay appends to it whenever an earlier change is published.
    pub async fn redis_snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let events = format!("{}:events", self.prefix);
        let mut keys = self.keys_matching(&format!("{}:*", self.prefix)).await;
        keys.retain(|k| *k != events);
        let mut conn = self.redis().await;
        let mut out = Vec::new();
        for k in keys {
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .unwrap();
            out.push((k, dump));
        }
        out.sort();
        out
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A sale spec with test defaults: starts now, 600 s holds.
pub fn sale_spec(id: &str, units: i32, per_user_limit: i32, shards: i32) -> SaleSpec {
    SaleSpec {
        id: id.into(),
        name: format!("Test sale {id}"),
        units,
        per_user_limit,
        shards,
        starts_at: Utc::now() - chrono::Duration::seconds(1),
        ends_at: None,
        hold_seconds: 600,
        admission_rate: 100.0,
        admission_factor: 2.0,
        price_cents: 4_999,
        queue_shards: 1,
        admission_p99_ms: 50.0,
        bot_check: "none".into(),
        bot_shadow: false,
        join_limit: origin::sales::spec::DEFAULT_JOIN_LIMIT,
        currency: origin::sales::spec::DEFAULT_CURRENCY.into(),
        draw_beacon: None,
        skus: Vec::new(),
    }
}

/// How many events of the `types` the outbox holds, batch rows (migration
/// 0017) opened into their events.
pub async fn outbox_events(pool: &sqlx::PgPool, types: &[&str]) -> i64 {
    let types: Vec<String> = types.iter().map(|t| t.to_string()).collect();
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox o,
                LATERAL jsonb_array_elements(CASE WHEN o.type = 'batch' THEN o.payload->'events'
                                                  ELSE jsonb_build_array(jsonb_build_object('type', o.type)) END) e
          WHERE e->>'type' = ANY($1)",
    )
    .bind(&types)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The payment outcomes: what a payment provider's answer writes.
pub const PAYMENT_OUTCOMES: [&str; 3] = ["order.paid", "payment.refund_required", "payment.failed"];

pub fn parse_time(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// A `redis-server` owned by a test, in its own directory; killed on drop.
/// [`RedisServer::start`] listens on a Unix socket in that directory (no TCP
/// port to pick, so nothing else can take its address between a kill and a
/// restart); [`RedisServer::start_on_free_cluster_port`] listens on a TCP
/// port (a cluster node) and proves the server there is its own.
pub struct RedisServer {
    /// The TCP port; 0 for a server on its Unix socket.
    pub port: u16,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts one on a Unix socket; `extra` are additional `redis-server`
    /// arguments.
    pub fn start(extra: &[&str]) -> RedisServer {
        Self::start_on(0, extra)
    }

    /// Starts one on TCP `port` (0: on its Unix socket).
    pub fn start_on(port: u16, extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let mut s = RedisServer {
            port,
            dir,
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.restart();
        s
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    pub fn url(&self) -> String {
        if self.port == 0 {
            format!("redis+unix://{}", self.socket().display())
        } else {
            format!("redis://127.0.0.1:{}", self.port)
        }
    }

    /// `redis-cli` arguments that reach this server.
    fn cli(&self) -> Vec<String> {
        if self.port == 0 {
            vec!["-s".into(), self.socket().display().to_string()]
        } else {
            vec![
                "-h".into(),
                "127.0.0.1".into(),
                "-p".into(),
                self.port.to_string(),
            ]
        }
    }

    /// Kills the server abruptly (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts one on a free loopback port for a cluster node (the port and
    /// its bus port + 10000). Redis cannot be handed a bound socket, so the
    /// port is picked, then the server must prove it is the one answering
    /// there (its `process_id`); if another process took the port in
    /// between, it starts again on another.
    pub fn start_on_free_cluster_port(extra: &[&str]) -> RedisServer {
        for _ in 0..10 {
            let mut s = RedisServer {
                port: free_cluster_port(),
                dir: tempfile::tempdir().unwrap(),
                child: None,
                extra: extra.iter().map(|s| s.to_string()).collect(),
            };
            if s.try_start().is_ok() {
                return s;
            }
        }
        panic!("no free port a Redis Cluster node could keep in 10 tries");
    }

    /// Starts (again) on the same address and directory.
    pub fn restart(&mut self) {
        if let Err(e) = self.try_start() {
            panic!("redis-server did not start again at {}: {e}", self.url());
        }
    }

    /// Starts the server and waits until the server answering at its
    /// address is this child (not a process that took the port first).
    fn try_start(&mut self) -> Result<(), String> {
        self.kill();
        let socket = self.socket();
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ]);
        if self.port == 0 {
            let _ = std::fs::remove_file(&socket);
            cmd.arg("--unixsocket")
                .arg(&socket)
                .args(["--unixsocketperm", "700"]);
        }
        if let Some(d) = redis_log_dir() {
            // Named by port; servers on a Unix socket (port 0) by their
            // own directory, so no two share a log.
            let name = match self.port {
                0 => self
                    .dir
                    .path()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                port => port.to_string(),
            };
            cmd.arg("--logfile").arg(format!("{d}/redis-{name}.log"));
        }
        let child = cmd
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (scripts/setup installs it)");
        let mut child = child;
        let result = wait_for_own_redis(&self.cli(), &mut child);
        self.child = Some(child);
        if result.is_err() {
            self.kill();
        }
        result
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    redis_cli_at(&["-h", "127.0.0.1", "-p", &port.to_string()], args)
}

fn redis_cli_at<S: AsRef<std::ffi::OsStr>>(to: &[S], args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(to)
        .args(args)
        .output()
        .expect("redis-cli on PATH");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the Redis answering at `to` is `child` (its `process_id`);
/// an error if the child exits first (its port was taken) or 10 s pass.
fn wait_for_own_redis(to: &[String], child: &mut Child) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let me = format!("process_id:{}", child.id());
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server exited ({status})"));
        }
        if redis_cli_at(to, &["INFO", "server"])
            .lines()
            .any(|l| l.trim() == me)
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err("not answering as the started server after 10 s".into())
}

/// A 3-master Redis Cluster on loopback, created with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_on_free_cluster_port(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                    "--appendonly",
                    "no",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(|s| s.as_str()));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        'wait: while Instant::now() < deadline {
            for n in &nodes {
                if !redis_cli(n.port, &["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                    std::thread::sleep(Duration::from_millis(100));
                    continue 'wait;
                }
            }
            return RedisCluster { nodes };
        }
        panic!("cluster did not reach cluster_state:ok");
    }

    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect()
    }

    /// How many keys matching `pattern` each node holds.
    pub fn keys_per_node(&self, pattern: &str) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|n| {
                redis_cli(n.port, &["--raw", "KEYS", pattern])
                    .lines()
                    .filter(|l| !l.is_empty())
                    .count()
            })
            .collect()
    }
}

/// A Redis Sentinel owned by a test (`redis-sentinel`, or `redis-server
/// --sentinel` where the package is missing), its config file in its own
/// directory (Sentinel rewrites it); killed on drop.
pub struct SentinelServer {
    pub port: u16,
    _dir: tempfile::TempDir,
    child: Option<Child>,
}

impl SentinelServer {
    /// Starts one watching `master` at `127.0.0.1:primary_port` with the
    /// short timeouts the tests need (down after 2.5 s, failover timeout
    /// 4 s). Down after 1 s was too short under the suite's parallel load:
    /// a sentinel that had just switched to the promoted replica found it
    /// silent for 1 s and failed over a second time (sentinel logs of a
    /// failing run), leaving the new primary without a replica for longer
    /// than the test waited.
    fn start(master: &str, primary_port: u16, quorum: usize) -> SentinelServer {
        for _ in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_cluster_port();
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {master} 127.0.0.1 {primary_port} {quorum}\n\
                     sentinel down-after-milliseconds {master} 2500\n\
                     sentinel failover-timeout {master} 4000\n\
                     sentinel parallel-syncs {master} 2\n{log}",
                    dir = dir.path().display(),
                    log = redis_log_dir()
                        .map(|d| format!("logfile {d}/sentinel-{port}.log\n"))
                        .unwrap_or_default()
                ),
            )
            .unwrap();
            let spawn = |bin: &str, extra: &[&str]| {
                Command::new(bin)
                    .arg(&conf)
                    .args(extra)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
            };
            let mut child = spawn("redis-sentinel", &[])
                .or_else(|_| spawn("redis-server", &["--sentinel"]))
                .expect("redis-sentinel or redis-server on PATH (scripts/setup installs them)");
            let to = [
                "-h".into(),
                "127.0.0.1".into(),
                "-p".into(),
                port.to_string(),
            ];
            if wait_for_own_redis(&to, &mut child).is_ok() {
                return SentinelServer {
                    port,
                    _dir: dir,
                    child: Some(child),
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("no free port a sentinel could keep in 10 tries");
    }

    /// `SENTINEL <args…>` on this sentinel, as text lines.
    pub fn ask(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["--raw", "SENTINEL"];
        all.extend(args);
        redis_cli(self.port, &all)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A primary, its replicas (`--replicaof`) and sentinels watching them,
/// all on free loopback ports, for failover tests. Ready when every
/// replica is in sync and every sentinel knows every replica and every
/// other sentinel (so a quorum can vote at once).
pub struct SentinelSetup {
    pub master: String,
    pub primary: RedisServer,
    pub replicas: Vec<RedisServer>,
    pub sentinels: Vec<SentinelServer>,
}

impl SentinelSetup {
    pub fn start(replicas: usize, sentinels: usize) -> SentinelSetup {
        let master = "fsmaster".to_string();
        let primary = RedisServer::start_on_free_cluster_port(&["--appendonly", "no"]);
        let port = primary.port.to_string();
        let replicas: Vec<RedisServer> = (0..replicas)
            .map(|_| {
                RedisServer::start_on_free_cluster_port(&[
                    "--appendonly",
                    "no",
                    "--replicaof",
                    "127.0.0.1",
                    &port,
                ])
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        for r in &replicas {
            while !redis_cli(r.port, &["INFO", "replication"]).contains("master_link_status:up") {
                assert!(Instant::now() < deadline, "replica {} never synced", r.port);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let quorum = sentinels / 2 + 1;
        let sentinels: Vec<SentinelServer> = (0..sentinels)
            .map(|_| SentinelServer::start(&master, primary.port, quorum))
            .collect();
        let setup = SentinelSetup {
            master,
            primary,
            replicas,
            sentinels,
        };
        for s in &setup.sentinels {
            loop {
                let info = s.ask(&["master", &setup.master]);
                let field = |name: &str| {
                    info.iter()
                        .position(|l| l == name)
                        .and_then(|i| info.get(i + 1))
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0)
                };
                if field("num-slaves") == setup.replicas.len()
                    && field("num-other-sentinels") + 1 == setup.sentinels.len()
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel {} never saw the whole setup: {info:?}",
                    s.port
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        setup
    }

    /// Where the origin finds it: `REDIS_SENTINEL` + `REDIS_SENTINEL_MASTER`.
    pub fn target(&self) -> RedisTarget {
        RedisTarget::Sentinel {
            nodes: self
                .sentinels
                .iter()
                .map(|s| format!("redis://127.0.0.1:{}", s.port))
                .collect(),
            master: self.master.clone(),
        }
    }

    /// The port of the primary the (first answering) sentinel names.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            s.ask(&["get-master-addr-by-name", &self.master])
                .get(1)
                .and_then(|p| p.parse().ok())
        })
    }

    /// Waits until the sentinels name a primary other than `old`; its port.
    pub fn wait_for_failover(&self, old: u16, limit: Duration) -> u16 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(p) = self.primary_port().filter(|p| *p != old) {
                return p;
            }
            assert!(Instant::now() < deadline, "no failover within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Cuts every replica off the primary while the primary keeps serving
    /// the connections it has (the origin's, the sentinels'): it starts
    /// asking a password no replica knows and drops the replicas' links,
    /// which then cannot come back. Writes from now on reach no replica.
    pub fn cut_replicas_off(&self) {
        let pw = uuid::Uuid::new_v4().simple().to_string();
        let set = redis_cli(self.primary.port, &["CONFIG", "SET", "requirepass", &pw]);
        assert!(set.contains("OK"), "CONFIG SET requirepass: {set}");
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.primary.port.to_string()])
            .args([
                "--no-auth-warning",
                "-a",
                &pw,
                "CLIENT",
                "KILL",
                "TYPE",
                "replica",
            ])
            .output()
            .expect("redis-cli");
        let killed = String::from_utf8_lossy(&out.stdout);
        assert!(
            killed.trim().parse::<usize>().ok() == Some(self.replicas.len()),
            "CLIENT KILL TYPE replica: {killed}"
        );
        for r in &self.replicas {
            let deadline = Instant::now() + Duration::from_secs(5);
            while redis_cli(r.port, &["INFO", "replication"]).contains("master_link_status:up") {
                assert!(Instant::now() < deadline, "replica {} still linked", r.port);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The server listening on `port` (the primary or a replica).
    /// `INFO replication` of the server on `port`, on one line (for a
    /// failing test's message).
    pub fn replication_of(&self, port: u16) -> String {
        redis_cli(port, &["INFO", "replication"])
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn server(&self, port: u16) -> &RedisServer {
        std::iter::once(&self.primary)
            .chain(&self.replicas)
            .find(|s| s.port == port)
            .expect("a server of this setup")
    }
}

/// The repository root (for scripts and binaries).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// What a [`race`] came to.
pub struct RaceResult {
    /// account -> units granted (sum of qty over 202s)
    pub granted: HashMap<String, i64>,
    pub ids: HashSet<String>,
    pub refusals: HashMap<String, usize>,
}

/// 20,000 requests from 5,000 accounts (4 each, fired together, qty 1 or 2,
/// distinct keys) at a sale of 1,000 units on 4 shards, limit 2, so partial
/// fills and spills meet concurrency; a sampler reads each shard atomically
/// (MULTI: stock and hold records together) and checks that its stock and
/// held units always add up to its share.
pub async fn race(app: &TestApp, sale: &str) -> RaceResult {
    let _heavy = heavy().await;
    let cfg = app.create_sale(sale_spec(sale, 1_000, 2, 4)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let mut conn = app.redis().await;
        let keys: Vec<(origin::reserve::store::ShardKeys, i64)> = cfg
            .shard_tags
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let share = origin::sales::sale::shard_units(1_000, 4, i as i32);
                (
                    origin::reserve::store::ShardKeys::new(&app.prefix, t),
                    i64::from(share),
                )
            })
            .collect();
        tokio::spawn(async move {
            let mut samples = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for (k, share) in &keys {
                    let (stock, holds): (i64, Vec<String>) = redis::pipe()
                        .atomic()
                        .get(&k.stock)
                        .hvals(&k.holds)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    let held: i64 = holds
                        .iter()
                        .map(|raw| {
                            serde_json::from_str::<Value>(raw).unwrap()["q"]
                                .as_i64()
                                .unwrap()
                        })
                        .sum();
                    assert!(
                        stock >= 0 && stock + held == *share,
                        "shard {}: stock {stock} + held {held} != share {share}",
                        k.stock
                    );
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        })
    };
    let requests: Vec<(String, String)> = (0..5_000)
        .flat_map(|a| (0..4).map(move |k| (format!("acct-{a}"), format!("key-{a}-{k}"))))
        .collect();
    let tokens: HashMap<String, String> = (0..5_000)
        .map(|a| {
            let acct = format!("acct-{a}");
            let t = app.admit(&acct, sale);
            (acct, t)
        })
        .collect();
    let results: Vec<(String, u16, Value)> = futures::stream::iter(requests)
        .map(|(acct, key)| {
            let token = tokens[&acct].clone();
            async move {
                let body = if key.ends_with(['1', '3']) {
                    r#"{"qty":2}"#
                } else {
                    r#"{"qty":1}"#
                };
                let (status, body, _) = app.reserve(sale, Some(&token), Some(&key), body).await;
                (acct, status, body)
            }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.expect("every sample: stock + held = share");
    assert!(samples > 0);
    let mut out = RaceResult {
        granted: HashMap::new(),
        ids: HashSet::new(),
        refusals: HashMap::new(),
    };
    for (acct, status, body) in results {
        match status {
            202 => {
                *out.granted.entry(acct).or_default() += body["qty"].as_i64().unwrap();
                assert!(
                    out.ids
                        .insert(body["reservation_id"].as_str().unwrap().to_string())
                );
            }
            409 | 410 => {
                let code = body["error"]["code"].as_str().unwrap().to_string();
                let want = if status == 409 {
                    "per_user_limit"
                } else {
                    "sold_out"
                };
                assert_eq!(code, want);
                *out.refusals.entry(code).or_default() += 1;
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    out
}

/// The port in an origin's "origin listening" log line (text or JSON).
fn listening_port(log: &str) -> Option<u16> {
    let line = log.lines().find(|l| l.contains("origin listening"))?;
    let at = line.find("port")? + "port".len();
    line[at..]
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The real `origin serve` binary as a child process, pointed at a
/// [`TestApp`]'s database, Redis and key prefix (the in-process app there
/// serves only as the test's handle on Postgres and Redis). For what only a
/// real process shows: signals, exit codes, restarts.
pub struct OriginProcess {
    pub addr: String,
    child: tokio::process::Child,
    log: tempfile::NamedTempFile,
}

impl OriginProcess {
    /// Starts `bin serve` with `extra` environment on top of the app's
    /// settings, and waits until `/readyz` answers 200. The process binds
    /// port 0 itself and the port is read from its "origin listening" log
    /// line: never picked here and bound there later (another test could
    /// take it in between).
    pub async fn start(bin: &std::path::Path, app: &TestApp, extra: &[(&str, &str)]) -> Self {
        let mut me = Self::spawn(bin, app, &["serve"], extra);
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Some(port) = listening_port(&me.log()) {
                break port;
            }
            assert!(
                Instant::now() < deadline,
                "origin did not log its port:\n{}",
                me.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        me.addr = format!("http://127.0.0.1:{port}");
        loop {
            let ready = client
                .get(format!("{}/readyz", me.addr))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ready {
                return me;
            }
            assert!(
                Instant::now() < deadline,
                "origin did not become ready:\n{}",
                me.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts `bin ARGS…` with the app's settings (and `extra`); does not wait.
    pub fn spawn(
        bin: &std::path::Path,
        app: &TestApp,
        args: &[&str],
        extra: &[(&str, &str)],
    ) -> Self {
        let log = tempfile::NamedTempFile::new().expect("log file");
        let redis_env = match &app.redis {
            RedisTarget::Single(url) => ("REDIS_URL", url.clone()),
            RedisTarget::Cluster(seeds) => ("REDIS_CLUSTER_NODES", seeds.join(",")),
            RedisTarget::Sentinel { nodes, .. } => ("REDIS_SENTINEL", nodes.join(",")),
        };
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(args)
            .env_clear()
            .env("DATABASE_URL", &app.db.url)
            .env(redis_env.0, redis_env.1)
            .env("REDIS_KEY_PREFIX", &app.prefix)
            .env("USER_TOKEN_KEYS", ring_env("usr1"))
            .env("ADMISSION_TOKEN_KEYS", ring_env("adm1"))
            .env("ORIGIN_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "info,sqlx=warn")
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("log file"))
            .kill_on_drop(true);
        if let RedisTarget::Sentinel { master, .. } = &app.redis {
            cmd.env("REDIS_SENTINEL_MASTER", master);
        }
        let child = cmd.spawn().expect("origin binary starts");
        OriginProcess {
            // Known once `serve` logs its port ([`OriginProcess::start`]).
            addr: String::new(),
            child,
            log,
        }
    }

    /// POSTs a reservation of one unit; returns (status, JSON body).
    pub async fn reserve(&self, sale: &str, token: &str, key: &str) -> (u16, Value) {
        let res = reqwest::Client::new()
            .post(format!("{}/api/sales/{sale}/reservations", self.addr))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .header("content-type", "application/json")
            .body(r#"{"qty":1}"#)
            .send()
            .await
            .expect("request sent");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(Value::Null))
    }

    /// Sends SIGTERM, as an orchestrator stopping the container does.
    pub fn sigterm(&self) {
        let pid = self.child.id().expect("still running");
        let ok = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -TERM {pid}");
    }

    /// Waits for the process to exit (at most `limit`); returns its status
    /// and how long it took.
    pub async fn exit_within(&mut self, limit: Duration) -> (std::process::ExitStatus, Duration) {
        let t0 = Instant::now();
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => (status.expect("wait"), t0.elapsed()),
            Err(_) => panic!(
                "origin still running {limit:?} after being told to stop:\n{}",
                self.log()
            ),
        }
    }

    /// The process's resident memory (kB, `VmRSS` in `/proc`); `None` once
    /// it has exited or off Linux.
    pub fn rss_kb(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    }

    /// What the process logged so far (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

#[cfg(test)]
mod redis_server_tests {
    use super::*;

    /// A server started on a port another Redis already holds must not take
    /// that one for its own (a PING would answer PONG from the other).
    #[test]
    fn a_server_whose_port_is_taken_does_not_pass_for_started() {
        let holder = RedisServer::start_on_free_cluster_port(&[]);
        let mut second = RedisServer {
            port: holder.port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
            extra: Vec::new(),
        };
        let err = second.try_start().expect_err("the port is the holder's");
        assert!(err.contains("exited"), "{err}");
        assert!(second.child.is_none(), "the failed child is reaped");
        // The holder is untouched and still answers as itself.
        let me = format!("process_id:{}", holder.child.as_ref().unwrap().id());
        assert!(redis_cli(holder.port, &["INFO", "server"]).contains(&me));
    }
}
