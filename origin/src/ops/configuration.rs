//! Configuration from the environment (DESIGN.md's operator interface).
//!
//! [`ENV_VARS`] is the one list of every variable the origin reads: the
//! README's configuration table is generated from it (`origin config table`,
//! and a test keeps the two equal), and `origin config check` walks it.
//! Every value is read and checked here, once; all problems are reported
//! together, each naming its variable (and, for key lists, the entry), so
//! the process never starts half-configured.
//!
//! Secrets never reach a log: URLs with passwords, key rings and webhook
//! secrets are held in types whose `Debug` hides them, and the operator's
//! report masks them.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::events::webhooks::schedule::{self, Schedule};
use token::{KeyRing, KeyRingError};

/// What happens when a variable is not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The origin refuses to start without it.
    Required,
    /// Unset is a valid state (the meaning says what it does).
    Unset,
    /// This value is used.
    Value(&'static str),
}

/// One environment variable of the operator interface.
#[derive(Debug, Clone, Copy)]
pub struct EnvVar {
    pub name: &'static str,
    pub default: Fallback,
    /// Masked in every report (passwords inside URLs, keys, secrets).
    pub secret: bool,
    pub meaning: &'static str,
}

/// Every variable the origin reads, in the order operators meet them.
pub const ENV_VARS: &[EnvVar] = &[
    EnvVar {
        name: "DATABASE_URL",
        default: Fallback::Value("postgres://postgres@127.0.0.1:5432/flashsale"),
        secret: true,
        meaning: "Postgres, the truth (`?sslmode=require` etc. as URL parameters); the password is masked in reports",
    },
    EnvVar {
        name: "REDIS_URL",
        default: Fallback::Value("redis://127.0.0.1:6379"),
        secret: true,
        meaning: "one Redis: `redis://[:password@]host:port[/db]`, or `rediss://…` for TLS (server verified against `SSL_CERT_FILE`)",
    },
    EnvVar {
        name: "REDIS_CLUSTER_NODES",
        default: Fallback::Unset,
        secret: true,
        meaning: "comma-separated seeds of a Redis Cluster, each `host:port` or `redis[s]://[user:password@]host:port`; when set, `REDIS_URL` is ignored",
    },
    EnvVar {
        name: "REDIS_SENTINEL",
        default: Fallback::Unset,
        secret: true,
        meaning: "comma-separated Redis Sentinels, each `host:port` or `redis[s]://[user:password@]host:port` (the credentials and TLS serve the sentinels and the primary alike): the origin asks them for `REDIS_SENTINEL_MASTER`'s primary and follows failovers by itself. Set with `REDIS_URL` or `REDIS_CLUSTER_NODES`: a configuration error naming both",
    },
    EnvVar {
        name: "REDIS_SENTINEL_MASTER",
        default: Fallback::Value("mymaster"),
        secret: false,
        meaning: "the primary's name in the sentinels' configuration (`sentinel monitor <name> …`); read only with `REDIS_SENTINEL`",
    },
    EnvVar {
        name: "REDIS_ACK",
        default: Fallback::Value("local"),
        secret: false,
        meaning: "`local`: a hold (cancel, payment confirm) is acknowledged once the primary has it; `wait`: only once `WAIT 1` says a replica has it too, else 503 `not_replicated` (`docs/operations.md` §7). `wait` needs `REDIS_URL` or `REDIS_SENTINEL` (refused with `REDIS_CLUSTER_NODES`)",
    },
    EnvVar {
        name: "REDIS_ACK_TIMEOUT_MS",
        default: Fallback::Value("100"),
        secret: false,
        meaning: "with `REDIS_ACK=wait`: how long one `WAIT` waits for a replica (1 to 5000); past it the requests it covers answer 503 `not_replicated`",
    },
    EnvVar {
        name: "REDIS_ACK_CONNECTIONS",
        default: Fallback::Value("1"),
        secret: false,
        meaning: "with `REDIS_ACK=wait`: dedicated connections, each running one group-commit round (`WAIT`) at a time, side by side (1 to 8; measured in BENCHMARKS.md, \"Durability\")",
    },
    EnvVar {
        name: "REDIS_KEY_PREFIX",
        default: Fallback::Value("fs"),
        secret: false,
        meaning: "prefix of every Redis key, so tenants and tests share one Redis; letters, digits, `-`, `_`, `:`",
    },
    EnvVar {
        name: "USER_TOKEN_KEYS",
        default: Fallback::Required,
        secret: true,
        meaning: "`kid:base64key[,…]` shared with the shop, which mints `user` tokens (`v1` format or JWT HS256 with the `kid` header); the first key signs, all verify; at least 16 bytes each (32 recommended)",
    },
    EnvVar {
        name: "ADMISSION_TOKEN_KEYS",
        default: Fallback::Required,
        secret: true,
        meaning: "`kid:base64key[,…]` for tickets and `admit` tokens (edge and origin only); must share no key with `USER_TOKEN_KEYS`",
    },
    EnvVar {
        name: "PAYMENT_WEBHOOK_SECRET",
        default: Fallback::Unset,
        secret: true,
        meaning: "payment provider webhook secret(s), comma-separated for rotation; unset: webhooks answer 503 `webhook_not_configured`",
    },
    EnvVar {
        name: "ORIGIN_ADDR",
        default: Fallback::Value("127.0.0.1:8080"),
        secret: false,
        meaning: "listen address (the container image sets `0.0.0.0:8080`)",
    },
    EnvVar {
        name: "ORIGIN_METRICS_ADDR",
        default: Fallback::Unset,
        secret: false,
        meaning: "admin listen address for `GET /metrics` and `GET /healthz` (e.g. `0.0.0.0:9090`, for Prometheus inside the cluster); when set, `/metrics` leaves the public listener, and `origin settle` serves it too",
    },
    EnvVar {
        name: "ADMIN_KEYS",
        default: Fallback::Unset,
        secret: true,
        meaning: "operator keys of the admin API and console, `kid:scope:secret[,…]` with scope `read` or `write` (secrets of at least 22 characters; several for rotation); sent as `Authorization: Bearer <secret>`. Unset: no admin listener. The edge takes the same value (its sale metrics need any scope)",
    },
    EnvVar {
        name: "ADMIN_ADDR",
        default: Fallback::Value("127.0.0.1:9091"),
        secret: false,
        meaning: "the admin API's and console's listen address (`/admin/`), when `ADMIN_KEYS` is set; never the public port. The same address as `ORIGIN_METRICS_ADDR` shares that listener",
    },
    EnvVar {
        name: "ADMIN_EDGE_URL",
        default: Fallback::Unset,
        secret: false,
        meaning: "the edge's base URL, where the admin API reads a live sale's queue figures (`GET /api/sales/{sale}/metrics` with the first `read` key of `ADMIN_KEYS`). Unset: the live view has no queue figures",
    },
    EnvVar {
        name: "ADMIN_RATE_PER_S",
        default: Fallback::Value("20"),
        secret: false,
        meaning: "admin API requests per second per client address (bursts of twice that); more are answered 429 `rate_limited` with `Retry-After`",
    },
    EnvVar {
        name: "DATABASE_POOL_SIZE",
        default: Fallback::Value("16"),
        secret: false,
        meaning: "Postgres connections per pool; `serve` has two, its request handlers' and its background workers' (the settler uses one per shard it settles at once while catching up); mind Postgres' `max_connections` × 2 × replicas",
    },
    EnvVar {
        name: "ORIGIN_MAX_IN_FLIGHT",
        default: Fallback::Value("1024"),
        secret: false,
        meaning: "reservation requests in flight before the origin sheds with 429 `overloaded`",
    },
    EnvVar {
        name: "ORIGIN_SHUTDOWN_GRACE_MS",
        default: Fallback::Value("8000"),
        secret: false,
        meaning: "after SIGTERM, time allowed for in-flight requests, the settlement batch and the outbox flush; past it the process exits 1",
    },
    EnvVar {
        name: "ORIGIN_AUTO_MIGRATE",
        default: Fallback::Value("1"),
        secret: false,
        meaning: "`1`: processes apply `migrations/` at start; `0`: they only check and refuse to start while any is pending (run `origin migrate` as a one-off job, so serving roles need no DDL rights)",
    },
    EnvVar {
        name: "SWEEP_INTERVAL_MS",
        default: Fallback::Value("1000"),
        secret: false,
        meaning: "expiry sweep period (expired holds return their units)",
    },
    EnvVar {
        name: "RECONCILE_INTERVAL_MS",
        default: Fallback::Value("60000"),
        secret: false,
        meaning: "reconciler period (Redis compared with Postgres, drift repaired)",
    },
    EnvVar {
        name: "SETTLE_CLAIM_IDLE_MS",
        default: Fallback::Value("30000"),
        secret: false,
        meaning: "settlement entries pending this long on a stopped or dead worker are taken over",
    },
    EnvVar {
        name: "SETTLE_LINGER_MS",
        default: Fallback::Value("50"),
        secret: false,
        meaning: "after a settlement round that found no full batch, wait this long so the next batches fill (fewer, larger Postgres transactions; adds at most this to the settlement lag)",
    },
    EnvVar {
        name: "ORIGIN_WORKERS_NICE",
        default: Fallback::Value("10"),
        secret: false,
        meaning: "how much lower (nice, 0-19) `serve`'s background workers (settlement, sweep, reconciler, relay) run than its request handlers, on their own thread and connections; when CPU is short the customer's request goes first and settlement catches up after (0: same priority)",
    },
    EnvVar {
        name: "ORIGIN_DEV_MODE",
        default: Fallback::Value("0"),
        secret: false,
        meaning: "`1`: the dev payment provider endpoint is served; never in production",
    },
    EnvVar {
        name: "RUST_LOG",
        default: Fallback::Value("info,sqlx=warn"),
        secret: false,
        meaning: "log filter (`tracing` EnvFilter syntax)",
    },
    EnvVar {
        name: "LOG_FORMAT",
        default: Fallback::Value("text"),
        secret: false,
        meaning: "`text` or `json` (one JSON object per line, for log shippers)",
    },
    EnvVar {
        name: "SSL_CERT_FILE",
        default: Fallback::Unset,
        secret: false,
        meaning: "PEM bundle of the CAs trusted for `rediss://` (unset: the system's; the image sets its bundle; a private CA: mount it and point here). Postgres TLS uses `sslrootcert` in `DATABASE_URL`",
    },
    EnvVar {
        name: "HOSTNAME",
        default: Fallback::Value("origin"),
        secret: false,
        meaning: "first part of this process's settlement consumer name (container runtimes set it)",
    },
    EnvVar {
        name: "EVENTS_SINK",
        default: Fallback::Value("redis"),
        secret: false,
        meaning: "where the outbox relay publishes every event (docs/events.md): `redis`, the stream `<prefix>:events`; `kafka`, the topic `KAFKA_TOPIC` on `KAFKA_BROKERS` (created when missing; `acks=all`; a row is marked published only after the broker acknowledged it)",
    },
    EnvVar {
        name: "OUTBOX_SOURCE",
        default: Fallback::Value("table"),
        secret: false,
        meaning: "how the relay finds new outbox rows (docs/events.md): `table`, by polling the table; `wal`, from the database's log through the logical replication slot `OUTBOX_SLOT` (needs `wal_level=logical`; the slot and a publication of the outbox are created when missing; watch `flashsale_outbox_slot_lag_bytes`)",
    },
    EnvVar {
        name: "OUTBOX_SLOT",
        default: Fallback::Value("flashsale_outbox"),
        secret: false,
        meaning: "with `OUTBOX_SOURCE=wal`: the replication slot's and the publication's name (`a-z`, `0-9`, `_`; at most 63). A slot nobody reads keeps WAL on the server: drop it when you stop using it",
    },
    EnvVar {
        name: "FAULT_RELAY_ABORT_AFTER_ACK",
        default: Fallback::Unset,
        secret: false,
        meaning: "fault tests only (`scripts/chaos` row `relay-ack-kill`), never in production: `n`, the process aborts right after the sink acknowledged the relay's `n`th round with events, before it marks them sent",
    },
    EnvVar {
        name: "KAFKA_BROKERS",
        default: Fallback::Unset,
        secret: false,
        meaning: "comma-separated bootstrap brokers, `host:port`; required with `EVENTS_SINK=kafka`",
    },
    EnvVar {
        name: "KAFKA_TOPIC",
        default: Fallback::Value("flashsale.events"),
        secret: false,
        meaning: "the events topic (letters, digits, `.`, `_`, `-`; at most 249); records keyed `<sale>/<sku>` so one SKU's events keep their order",
    },
    EnvVar {
        name: "KAFKA_PARTITIONS",
        default: Fallback::Value("6"),
        secret: false,
        meaning: "partitions of the topic when the relay creates it (an existing topic is used as it is)",
    },
    EnvVar {
        name: "KAFKA_REPLICATION_FACTOR",
        default: Fallback::Value("3"),
        secret: false,
        meaning: "replication factor of the topic when the relay creates it (1 for a one-broker dev setup)",
    },
    EnvVar {
        name: "KAFKA_CLIENT_ID",
        default: Fallback::Value("flashsale-origin"),
        secret: false,
        meaning: "the client id the relay gives the brokers (quotas, broker logs)",
    },
    EnvVar {
        name: "KAFKA_TIMEOUT_MS",
        default: Fallback::Value("10000"),
        secret: false,
        meaning: "a produce, retries included, that takes longer fails; the batch stays in the outbox and is sent again (same event ids)",
    },
    EnvVar {
        name: "WEBHOOK_ALLOW_PRIVATE",
        default: Fallback::Value("0"),
        secret: false,
        meaning: "`1`: webhook endpoints may be plain http and loopback, private or link-local addresses (dev and tests only: the worker must not reach into the shop's network)",
    },
    EnvVar {
        name: "WEBHOOK_TIMEOUT_MS",
        default: Fallback::Value("10000"),
        secret: false,
        meaning: "one webhook attempt, connection included, at most this long; then it counts as failed",
    },
    EnvVar {
        name: "WEBHOOK_RETRY_SCHEDULE",
        default: Fallback::Value(schedule::DEFAULT_SCHEDULE),
        secret: false,
        meaning: "waits between webhook attempts (`ms`, `s`, `m`, `h`, `d`), each with ±20 % jitter; after the last the delivery is dead until `origin webhook replay`",
    },
];

/// Where the speed layer lives.
#[derive(Clone)]
pub enum RedisTarget {
    /// `REDIS_URL`: one Redis.
    Single(String),
    /// `REDIS_CLUSTER_NODES`: seeds of a Redis Cluster, each `host:port` or
    /// a `redis://` URL (with credentials for AUTH).
    Cluster(Vec<String>),
    /// `REDIS_SENTINEL` + `REDIS_SENTINEL_MASTER`: the sentinels (as
    /// `redis://` URLs) and the name of the primary they watch.
    Sentinel { nodes: Vec<String>, master: String },
}

/// When a write the client is told about counts as done (`REDIS_ACK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// Once the primary has it (Redis's own answer).
    Local,
    /// Once `WAIT 1 <timeout>` says a replica has it too (`crate::reserve::ack`),
    /// with `connections` rounds of WAIT side by side at most.
    Wait {
        timeout: Duration,
        connections: usize,
    },
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single(url) => f.debug_tuple("Single").field(&mask_url(url)).finish(),
            RedisTarget::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|n| mask_url(n)).collect::<Vec<_>>())
                .finish(),
            RedisTarget::Sentinel { nodes, master } => f
                .debug_struct("Sentinel")
                .field(
                    "nodes",
                    &nodes.iter().map(|n| mask_url(n)).collect::<Vec<_>>(),
                )
                .field("master", master)
                .finish(),
        }
    }
}

/// A configuration value is missing or malformed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("{var}: {source}")]
    Keys {
        var: &'static str,
        source: KeyRingError,
    },
    #[error("{var} = {value:?}: {why}")]
    Invalid {
        var: &'static str,
        /// Already masked when the variable is secret.
        value: String,
        why: String,
    },
    #[error("{first} and {second} are both set: {why}")]
    Conflict {
        first: &'static str,
        second: &'static str,
        why: &'static str,
    },
    #[error(
        "USER_TOKEN_KEYS key {user_kid:?} and ADMISSION_TOKEN_KEYS key {admission_kid:?} are the same secret: the shop could mint admit tokens"
    )]
    SharedKey {
        user_kid: String,
        admission_kid: String,
    },
}

/// Every problem found in one read of the environment.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(
            f,
            "{n} configuration problem{}",
            if n == 1 { "" } else { "s" }
        )?;
        for e in &self.0 {
            write!(f, "\n  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// How the worker delivers (`WEBHOOK_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// `WEBHOOK_ALLOW_PRIVATE=1`: loopback and private endpoints, plain http
    /// (dev and tests only).
    pub allow_private: bool,
    /// One attempt, connection included, at most this long.
    pub timeout: Duration,
    /// The waits between attempts; after the last, the delivery is dead.
    pub schedule: Schedule,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        WebhookSettings {
            allow_private: false,
            timeout: Duration::from_secs(10),
            schedule: Schedule::parse(schedule::DEFAULT_SCHEDULE).expect("the default parses"),
        }
    }
}

/// Where the outbox relay publishes (`EVENTS_SINK`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventsSink {
    /// The Redis stream `<prefix>:events` (the default).
    RedisStream,
    /// A Kafka topic (issue 46).
    Kafka(KafkaSettings),
}

/// How the relay finds new outbox rows (`OUTBOX_SOURCE`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum OutboxSource {
    /// Polling the table for unpublished rows (the default).
    #[default]
    Table,
    /// The database's log, through the logical replication slot (and
    /// publication) of this name (`crate::events::wal`).
    Wal { slot: String },
}

/// Where and how the relay produces (`KAFKA_*`; the sink is `crate::events::kafka`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    pub topic: String,
    /// Partitions of the topic when the relay creates it.
    pub partitions: i32,
    /// Replication factor of the topic when the relay creates it.
    pub replication: i16,
    pub client_id: String,
    /// A produce (its retries included) that takes longer fails; the relay
    /// tries the batch again later and the rows stay unpublished meanwhile.
    pub timeout: Duration,
}

/// Everything `origin serve` needs. `Debug` shows no secret.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database_url: SecretString,
    pub redis: RedisTarget,
    /// When a client is told about a write (`REDIS_ACK`).
    pub redis_ack: AckMode,
    pub key_prefix: String,
    pub user_keys: KeyRing,
    pub admission_keys: KeyRing,
    /// Webhook secrets, any of which verifies (rotation); empty: webhooks off.
    pub payment_webhook_secrets: Vec<SecretString>,
    pub addr: SocketAddr,
    pub sweep_interval: Duration,
    pub reconcile_interval: Duration,
    /// Settlement entries pending this long on a consumer are taken over.
    pub settle_claim_idle: Duration,
    /// The settler's pause after a round with no full batch (see `Settler::run`).
    pub settle_linger: Duration,
    /// Reservation requests allowed in flight before the origin sheds (429).
    pub max_in_flight: usize,
    /// Where `/metrics` (and `/healthz`) are served apart from the API.
    pub metrics_addr: Option<SocketAddr>,
    /// Postgres connections per pool (`serve`: the handlers' and the
    /// workers' pools each).
    pub pg_pool_size: u32,
    /// How much lower the background workers' thread runs (`crate::ops::workers`).
    pub workers_nice: i32,
    /// After a stop signal: the bound on draining requests and workers.
    pub shutdown_grace: Duration,
    /// Apply migrations at start (else only check that none is pending).
    pub auto_migrate: bool,
    /// Dev-only conveniences (the dev payment provider endpoint).
    pub dev_mode: bool,
    /// Where the outbox relay publishes.
    pub events: EventsSink,
    /// How the outbox relay finds new rows.
    pub outbox_source: OutboxSource,
    /// `FAULT_RELAY_ABORT_AFTER_ACK` (fault tests only).
    pub relay_abort_after_ack: Option<u64>,
    /// How webhooks are delivered (`WEBHOOK_*`).
    pub webhooks: WebhookSettings,
    /// The admin API and console (`ADMIN_*`).
    pub admin: AdminSettings,
}

/// The admin API and console (`ADMIN_*`). `Debug` shows key ids only.
#[derive(Debug, Clone)]
pub struct AdminSettings {
    /// Where the admin listener binds; it runs only when `keys` is not empty.
    pub addr: SocketAddr,
    pub keys: token::AdminKeys,
    /// The edge's base URL (no trailing slash), for a sale's queue figures.
    pub edge_url: Option<String>,
    /// The secret the admin API presents to the edge: the first key's of
    /// `ADMIN_KEYS` (the edge takes the same value).
    pub edge_secret: Option<SecretString>,
    /// Requests per second per client address.
    pub rate_per_s: u32,
}

impl Default for AdminSettings {
    fn default() -> Self {
        AdminSettings {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            keys: token::AdminKeys::default(),
            edge_url: None,
            edge_secret: None,
            rate_per_s: 20,
        }
    }
}

/// `ADMIN_*`, every problem reported.
pub fn admin_settings(errors: &mut Vec<ConfigError>) -> Option<AdminSettings> {
    let text = var_or_default("ADMIN_ADDR");
    let addr = keep(
        errors,
        text.trim()
            .parse::<SocketAddr>()
            .map_err(|_| ConfigError::Invalid {
                var: "ADMIN_ADDR",
                value: text.clone(),
                why: "expected ip:port (e.g. 127.0.0.1:9091)".into(),
            }),
    );
    let keys = keep(
        errors,
        token::AdminKeys::parse(var("ADMIN_KEYS").as_deref()).map_err(|why| ConfigError::Invalid {
            var: "ADMIN_KEYS",
            value: "****".into(),
            why,
        }),
    );
    let edge_url = match var("ADMIN_EDGE_URL") {
        None => Some(None),
        Some(u) => match url::Url::parse(u.trim()) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => {
                Some(Some(u.trim().trim_end_matches('/').to_string()))
            }
            _ => {
                errors.push(ConfigError::Invalid {
                    var: "ADMIN_EDGE_URL",
                    value: u,
                    why: "expected an http(s) URL (e.g. http://127.0.0.1:8787)".into(),
                });
                None
            }
        },
    };
    let rate_per_s = keep(
        errors,
        positive::<u32>("ADMIN_RATE_PER_S", "a positive integer"),
    );
    // Parsed above: the first entry is `kid:scope:secret` or `kid:secret`.
    let edge_secret = var("ADMIN_KEYS").and_then(|raw| {
        let first = raw.split(',').next()?.trim().to_string();
        let secret = first.rsplit_once(':')?.1.to_string();
        Some(SecretString::from(secret))
    });
    Some(AdminSettings {
        addr: addr?,
        keys: keys?,
        edge_secret,
        edge_url: edge_url?,
        rate_per_s: rate_per_s?,
    })
}

fn var(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn default_of(name: &str) -> &'static str {
    ENV_VARS
        .iter()
        .find(|v| v.name == name)
        .and_then(|v| match v.default {
            Fallback::Value(d) => Some(d),
            _ => None,
        })
        .unwrap_or_default()
}

fn var_or_default(name: &'static str) -> String {
    var(name).unwrap_or_else(|| default_of(name).to_string())
}

/// `user:****@host`: the URL with its password (if any) hidden; text that
/// is not a URL at all is hidden whole, since it may be a secret pasted in
/// the wrong place.
pub fn mask_url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut u) if u.has_host() => {
            if u.password().is_some() {
                let _ = u.set_password(Some("****"));
            }
            u.to_string()
        }
        _ if !text.contains('@') && !text.contains("//") => text.to_string(),
        _ => "****".to_string(),
    }
}

/// `DATABASE_URL`, defaulting to the local dev database.
pub fn database_url() -> Result<SecretString, ConfigError> {
    let url = var_or_default("DATABASE_URL");
    match sqlx::postgres::PgConnectOptions::from_str(&url) {
        Ok(_) => Ok(SecretString::from(url)),
        Err(e) => Err(ConfigError::Invalid {
            var: "DATABASE_URL",
            value: mask_url(&url),
            why: format!(
                "not a Postgres URL: {}",
                strip_url_from(&e.to_string(), &url)
            ),
        }),
    }
}

/// Errors of URL parsers may quote the input; never echo a secret.
fn strip_url_from(message: &str, url: &str) -> String {
    message.replace(url, "<url>")
}

/// The seeds of a comma-separated list (`REDIS_CLUSTER_NODES`,
/// `REDIS_SENTINEL`) as `redis://` URLs; each entry `host:port` or a URL.
fn redis_seeds(name: &'static str, list: &str) -> Result<Vec<String>, ConfigError> {
    let mut urls = Vec::new();
    for n in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let url = if n.contains("://") {
            n.to_string()
        } else {
            let ok = n
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(ConfigError::Invalid {
                    var: name,
                    value: mask_url(n),
                    why: "each entry must be host:port or redis://host:port".into(),
                });
            }
            format!("redis://{n}")
        };
        check_redis_url(name, &url)?;
        urls.push(url);
    }
    if urls.is_empty() {
        return Err(ConfigError::Missing(name));
    }
    Ok(urls)
}

/// Where Redis is. Precedence: `REDIS_SENTINEL` together with
/// `REDIS_CLUSTER_NODES` or an explicitly set `REDIS_URL` is an error naming
/// both (two answers to one question); `REDIS_CLUSTER_NODES` wins over
/// `REDIS_URL` (as before Sentinel existed, so existing deployments keep
/// working); else `REDIS_URL` (default local Redis).
pub fn redis_target() -> Result<RedisTarget, ConfigError> {
    if let Some(sentinels) = var("REDIS_SENTINEL") {
        for other in ["REDIS_CLUSTER_NODES", "REDIS_URL"] {
            if var(other).is_some() {
                return Err(ConfigError::Conflict {
                    first: "REDIS_SENTINEL",
                    second: other,
                    why: "the origin reaches Redis through exactly one of them; unset one",
                });
            }
        }
        let nodes = redis_seeds("REDIS_SENTINEL", &sentinels)?;
        let master = var_or_default("REDIS_SENTINEL_MASTER").trim().to_string();
        let ok = !master.is_empty()
            && master.len() <= 128
            && master.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            return Err(ConfigError::Invalid {
                var: "REDIS_SENTINEL_MASTER",
                value: master,
                why: "a primary name as in `sentinel monitor <name>` (visible ASCII, at most 128)"
                    .into(),
            });
        }
        return Ok(RedisTarget::Sentinel { nodes, master });
    }
    if let Some(nodes) = var("REDIS_CLUSTER_NODES") {
        return Ok(RedisTarget::Cluster(redis_seeds(
            "REDIS_CLUSTER_NODES",
            &nodes,
        )?));
    }
    let url = var_or_default("REDIS_URL");
    check_redis_url("REDIS_URL", &url)?;
    Ok(RedisTarget::Single(url))
}

/// The longest `REDIS_ACK_TIMEOUT_MS`: a request waits at most this for a
/// replica before answering 503.
pub const MAX_ACK_TIMEOUT_MS: u64 = 5_000;

/// A whole number from 1 to `max` (`unit` names it in the error).
fn one_to(name: &'static str, max: u64, unit: &str) -> Result<u64, ConfigError> {
    let text = var_or_default(name);
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or(ConfigError::Invalid {
            var: name,
            value: text,
            why: format!("1 to {max}{unit}"),
        })
}

/// The most `REDIS_ACK_CONNECTIONS`.
pub const MAX_ACK_CONNECTIONS: usize = 8;

/// `REDIS_ACK` (+ `REDIS_ACK_TIMEOUT_MS` and `REDIS_ACK_CONNECTIONS` for
/// `wait`); every problem goes to `errors`.
pub fn redis_ack(errors: &mut Vec<ConfigError>) -> Option<AckMode> {
    match var_or_default("REDIS_ACK").trim() {
        "local" => Some(AckMode::Local),
        "wait" => {
            // 0 would make WAIT block forever.
            let timeout = one_to("REDIS_ACK_TIMEOUT_MS", MAX_ACK_TIMEOUT_MS, " milliseconds")
                .map(Duration::from_millis);
            let connections = one_to("REDIS_ACK_CONNECTIONS", MAX_ACK_CONNECTIONS as u64, "");
            Some(AckMode::Wait {
                timeout: keep(errors, timeout)?,
                connections: keep(errors, connections)? as usize,
            })
        }
        other => {
            errors.push(ConfigError::Invalid {
                var: "REDIS_ACK",
                value: other.into(),
                why: "use local or wait".into(),
            });
            None
        }
    }
}

/// `REDIS_ACK=wait` needs one primary per origin connection: on a Cluster a
/// hold's replication would have to be awaited on the primary of each
/// shard's slot, which `crate::reserve::ack` does not do, so the pair is refused.
fn ack_fits_target(ack: AckMode, target: &RedisTarget) -> Result<(), ConfigError> {
    match (ack, target) {
        (AckMode::Wait { .. }, RedisTarget::Cluster(_)) => Err(ConfigError::Conflict {
            first: "REDIS_ACK=wait",
            second: "REDIS_CLUSTER_NODES",
            why: "wait is built for one primary (REDIS_URL or REDIS_SENTINEL); on a Cluster use REDIS_ACK=local",
        }),
        _ => Ok(()),
    }
}

fn check_redis_url(name: &'static str, url: &str) -> Result<(), ConfigError> {
    use redis::IntoConnectionInfo;
    url.into_connection_info()
        .map(|_| ())
        .map_err(|e| ConfigError::Invalid {
            var: name,
            value: mask_url(url),
            why: format!("not a Redis URL: {}", strip_url_from(&e.to_string(), url)),
        })
}

/// `REDIS_KEY_PREFIX` (default `fs`): letters, digits, `-`, `_`, `:` only,
/// because it becomes part of every key and must never contain a hash tag.
pub fn key_prefix() -> Result<String, ConfigError> {
    let prefix = var_or_default("REDIS_KEY_PREFIX");
    let ok = !prefix.is_empty()
        && prefix.len() <= 64
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':'));
    if ok {
        Ok(prefix)
    } else {
        Err(ConfigError::Invalid {
            var: "REDIS_KEY_PREFIX",
            value: prefix,
            why: "use letters, digits, '-', '_' or ':' (at most 64)".into(),
        })
    }
}

/// A `kid:base64key[,…]` key ring from the named variable.
pub fn key_ring(name: &'static str) -> Result<KeyRing, ConfigError> {
    let text = var(name).ok_or(ConfigError::Missing(name))?;
    KeyRing::parse(&text).map_err(|source| ConfigError::Keys { var: name, source })
}

fn webhook_secrets() -> Vec<SecretString> {
    var("PAYMENT_WEBHOOK_SECRET")
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(|x| SecretString::from(x.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn positive<T: FromStr + PartialOrd + Default>(
    name: &'static str,
    why: &str,
) -> Result<T, ConfigError> {
    let text = var_or_default(name);
    text.trim()
        .parse::<T>()
        .ok()
        .filter(|n| *n > T::default())
        .ok_or(ConfigError::Invalid {
            var: name,
            value: text,
            why: why.into(),
        })
}

fn duration_ms(name: &'static str) -> Result<Duration, ConfigError> {
    positive::<u64>(name, "a positive number of milliseconds").map(Duration::from_millis)
}

/// 0 to `max` milliseconds (0 turns the pause off).
fn ms_up_to(name: &'static str, max: u64) -> Result<Duration, ConfigError> {
    let text = var_or_default(name);
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| *n <= max)
        .map(Duration::from_millis)
        .ok_or(ConfigError::Invalid {
            var: name,
            value: text,
            why: format!("0 to {max} milliseconds"),
        })
}

/// A nice increment, 0 to 19.
fn nice(name: &'static str) -> Result<i32, ConfigError> {
    let text = var_or_default(name);
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|n| (0..=19).contains(n))
        .ok_or(ConfigError::Invalid {
            var: name,
            value: text,
            why: "0 to 19".into(),
        })
}

fn flag(name: &'static str) -> Result<bool, ConfigError> {
    match var_or_default(name).trim() {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        other => Err(ConfigError::Invalid {
            var: name,
            value: other.into(),
            why: "use 1/true or 0/false".into(),
        }),
    }
}

/// `ORIGIN_ADDR`: where `serve` listens (and `healthcheck` asks).
pub fn origin_addr() -> Result<SocketAddr, ConfigError> {
    let text = var_or_default("ORIGIN_ADDR");
    text.parse().map_err(|_| ConfigError::Invalid {
        var: "ORIGIN_ADDR",
        value: text,
        why: "expected ip:port (e.g. 0.0.0.0:8080)".into(),
    })
}

/// `ORIGIN_METRICS_ADDR`: the admin listener, if any.
pub fn metrics_addr() -> Result<Option<SocketAddr>, ConfigError> {
    let Some(text) = var("ORIGIN_METRICS_ADDR") else {
        return Ok(None);
    };
    text.trim()
        .parse()
        .map(Some)
        .map_err(|_| ConfigError::Invalid {
            var: "ORIGIN_METRICS_ADDR",
            value: text,
            why: "expected ip:port (e.g. 0.0.0.0:9090)".into(),
        })
}

/// `ORIGIN_AUTO_MIGRATE` (default on): may a process apply migrations?
pub fn auto_migrate() -> Result<bool, ConfigError> {
    flag("ORIGIN_AUTO_MIGRATE")
}

/// The log output format (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `LOG_FORMAT`: `text` (default) or `json`.
pub fn log_format() -> Result<LogFormat, ConfigError> {
    match var_or_default("LOG_FORMAT").trim() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(ConfigError::Invalid {
            var: "LOG_FORMAT",
            value: other.into(),
            why: "use text or json".into(),
        }),
    }
}

fn log_filter() -> Result<(), ConfigError> {
    match var("RUST_LOG") {
        None => Ok(()),
        Some(v) => tracing_subscriber::EnvFilter::try_new(&v)
            .map(|_| ())
            .map_err(|e| ConfigError::Invalid {
                var: "RUST_LOG",
                value: v,
                why: e.to_string(),
            }),
    }
}

/// Collects a result's error and goes on, so one read reports everything.
fn keep<T>(errors: &mut Vec<ConfigError>, r: Result<T, ConfigError>) -> Option<T> {
    r.map_err(|e| errors.push(e)).ok()
}

/// A Kafka topic name as the brokers accept it.
fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The `WEBHOOK_*` variables.
pub fn webhook_settings(errors: &mut Vec<ConfigError>) -> Option<WebhookSettings> {
    let allow_private = keep(errors, flag("WEBHOOK_ALLOW_PRIVATE"));
    let timeout = keep(errors, duration_ms("WEBHOOK_TIMEOUT_MS"));
    let text = var_or_default("WEBHOOK_RETRY_SCHEDULE");
    let schedule = keep(
        errors,
        Schedule::parse(&text).map_err(|why| ConfigError::Invalid {
            var: "WEBHOOK_RETRY_SCHEDULE",
            value: text.clone(),
            why,
        }),
    );
    Some(WebhookSettings {
        allow_private: allow_private?,
        timeout: timeout?,
        schedule: schedule?,
    })
}

/// `EVENTS_SINK` and, for `kafka`, the `KAFKA_*` variables.
fn events_sink(errors: &mut Vec<ConfigError>) -> Option<EventsSink> {
    match var_or_default("EVENTS_SINK").trim() {
        "redis" => Some(EventsSink::RedisStream),
        "kafka" => {
            let brokers: Vec<String> = var("KAFKA_BROKERS")
                .unwrap_or_default()
                .split(',')
                .map(|b| b.trim().to_string())
                .filter(|b| !b.is_empty())
                .collect();
            let bad = brokers.iter().find(|b| {
                !b.rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            });
            if brokers.is_empty() {
                errors.push(ConfigError::Invalid {
                    var: "KAFKA_BROKERS",
                    value: String::new(),
                    why: "EVENTS_SINK=kafka needs the brokers (host:port, comma-separated)".into(),
                });
            } else if let Some(b) = bad {
                errors.push(ConfigError::Invalid {
                    var: "KAFKA_BROKERS",
                    value: b.clone(),
                    why: "each broker is host:port".into(),
                });
            }
            let topic = var_or_default("KAFKA_TOPIC").trim().to_string();
            if !valid_topic(&topic) {
                errors.push(ConfigError::Invalid {
                    var: "KAFKA_TOPIC",
                    value: topic.clone(),
                    why: "a topic is 1 to 249 of letters, digits, '.', '_', '-'".into(),
                });
            }
            let partitions = keep(
                errors,
                positive::<i32>("KAFKA_PARTITIONS", "a positive integer"),
            );
            let replication = keep(
                errors,
                positive::<i16>("KAFKA_REPLICATION_FACTOR", "a positive integer"),
            );
            let timeout = keep(errors, duration_ms("KAFKA_TIMEOUT_MS"));
            let client_id = var_or_default("KAFKA_CLIENT_ID").trim().to_string();
            (!brokers.is_empty() && bad.is_none() && valid_topic(&topic)).then_some(())?;
            Some(EventsSink::Kafka(KafkaSettings {
                brokers,
                topic,
                partitions: partitions?,
                replication: replication?,
                client_id,
                timeout: timeout?,
            }))
        }
        other => {
            errors.push(ConfigError::Invalid {
                var: "EVENTS_SINK",
                value: other.into(),
                why: "use redis or kafka".into(),
            });
            None
        }
    }
}

/// An optional positive integer (unset: `None`).
fn optional_positive(name: &'static str) -> Result<Option<u64>, ConfigError> {
    match var(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(ConfigError::Invalid {
                var: name,
                value: v,
                why: "a positive integer, or unset".into(),
            }),
        },
    }
}

/// `OUTBOX_SOURCE` and, for `wal`, `OUTBOX_SLOT`.
fn outbox_source() -> Result<OutboxSource, ConfigError> {
    match var_or_default("OUTBOX_SOURCE").trim() {
        "table" => Ok(OutboxSource::Table),
        "wal" => {
            let slot = var_or_default("OUTBOX_SLOT").trim().to_string();
            let fits = !slot.is_empty()
                && slot.len() <= 63
                && slot
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if fits {
                Ok(OutboxSource::Wal { slot })
            } else {
                Err(ConfigError::Invalid {
                    var: "OUTBOX_SLOT",
                    value: slot,
                    why: "a slot name is 1 to 63 of a-z, 0-9 and _".into(),
                })
            }
        }
        other => Err(ConfigError::Invalid {
            var: "OUTBOX_SOURCE",
            value: other.into(),
            why: "use table or wal".into(),
        }),
    }
}

impl Settings {
    /// Reads and checks everything `origin serve` needs; every problem at once.
    pub fn from_env() -> Result<Self, ConfigErrors> {
        let mut errs = Vec::new();
        let e = &mut errs;
        let addr = keep(e, origin_addr());
        let database_url = keep(e, database_url());
        let redis = keep(e, redis_target());
        let redis_ack = redis_ack(e);
        if let (Some(ack), Some(target)) = (redis_ack, &redis) {
            keep(e, ack_fits_target(ack, target));
        }
        let key_prefix = keep(e, key_prefix());
        let user_keys = keep(e, key_ring("USER_TOKEN_KEYS"));
        let admission_keys = keep(e, key_ring("ADMISSION_TOKEN_KEYS"));
        let max_in_flight = keep(
            e,
            positive::<usize>("ORIGIN_MAX_IN_FLIGHT", "a positive integer"),
        );
        let shutdown_grace = keep(e, duration_ms("ORIGIN_SHUTDOWN_GRACE_MS"));
        let metrics_addr = keep(e, metrics_addr());
        let pg_pool_size = keep(
            e,
            positive::<u32>("DATABASE_POOL_SIZE", "a positive integer"),
        );
        let sweep_interval = keep(e, duration_ms("SWEEP_INTERVAL_MS"));
        let reconcile_interval = keep(e, duration_ms("RECONCILE_INTERVAL_MS"));
        let settle_claim_idle = keep(e, duration_ms("SETTLE_CLAIM_IDLE_MS"));
        let settle_linger = keep(e, ms_up_to("SETTLE_LINGER_MS", 1_000));
        let workers_nice = keep(e, nice("ORIGIN_WORKERS_NICE"));
        let dev_mode = keep(e, flag("ORIGIN_DEV_MODE"));
        let auto_migrate = keep(e, auto_migrate());
        let events = events_sink(e);
        let webhooks = webhook_settings(e);
        let outbox_source = keep(e, outbox_source());
        let relay_abort_after_ack = keep(e, optional_positive("FAULT_RELAY_ABORT_AFTER_ACK"));
        let admin = admin_settings(e);
        keep(e, log_format());
        keep(e, log_filter());
        if let (Some(u), Some(a)) = (&user_keys, &admission_keys)
            && let Some((user_kid, admission_kid)) = u.shares_secret_with(a)
        {
            e.push(ConfigError::SharedKey {
                user_kid: user_kid.into(),
                admission_kid: admission_kid.into(),
            });
        }
        match (
            addr,
            database_url,
            redis.zip(redis_ack),
            key_prefix,
            user_keys,
            admission_keys,
            max_in_flight,
            shutdown_grace,
            sweep_interval,
            reconcile_interval,
            settle_claim_idle,
            settle_linger,
            dev_mode,
            auto_migrate,
            metrics_addr,
            pg_pool_size,
            workers_nice,
            events
                .zip(webhooks)
                .zip(outbox_source)
                .zip(relay_abort_after_ack)
                .zip(admin),
        ) {
            (
                Some(addr),
                Some(database_url),
                Some((redis, redis_ack)),
                Some(key_prefix),
                Some(user_keys),
                Some(admission_keys),
                Some(max_in_flight),
                Some(shutdown_grace),
                Some(sweep_interval),
                Some(reconcile_interval),
                Some(settle_claim_idle),
                Some(settle_linger),
                Some(dev_mode),
                Some(auto_migrate),
                Some(metrics_addr),
                Some(pg_pool_size),
                Some(workers_nice),
                Some(((((events, webhooks), outbox_source), relay_abort_after_ack), admin)),
            ) if errs.is_empty() => Ok(Settings {
                database_url,
                redis,
                redis_ack,
                key_prefix,
                user_keys,
                admission_keys,
                payment_webhook_secrets: webhook_secrets(),
                addr,
                sweep_interval,
                reconcile_interval,
                settle_claim_idle,
                settle_linger,
                max_in_flight,
                metrics_addr,
                pg_pool_size,
                workers_nice,
                shutdown_grace,
                auto_migrate,
                dev_mode,
                events,
                webhooks,
                outbox_source,
                relay_abort_after_ack,
                admin,
            }),
            _ => Err(ConfigErrors(errs)),
        }
    }

    /// The Postgres URL, for connecting (never for printing).
    pub fn database_url(&self) -> &str {
        self.database_url.expose_secret()
    }
}

/// Where a reported value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Env,
    Default,
    Unset,
}

/// One line of `origin config check`: a variable's effective value, masked.
#[derive(Debug, Clone)]
pub struct Effective {
    pub name: &'static str,
    pub shown: String,
    pub source: Source,
}

fn describe_ring(text: &str) -> String {
    match KeyRing::parse(text) {
        Ok(ring) => {
            let kids = ring.kids();
            format!(
                "kids {} (first signs; secrets hidden)",
                kids.iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        Err(_) => "**** (unreadable)".into(),
    }
}

/// Every variable's effective value as an operator may see it: secrets are
/// masked (URL passwords, keys by kid only, webhook secrets by count).
pub fn effective() -> Vec<Effective> {
    let cluster = var("REDIS_CLUSTER_NODES").is_some();
    let sentinel = var("REDIS_SENTINEL").is_some();
    let wait = var_or_default("REDIS_ACK").trim() == "wait";
    let kafka = var_or_default("EVENTS_SINK").trim() == "kafka";
    ENV_VARS
        .iter()
        .map(|v| {
            let raw = var(v.name);
            let source = match (&raw, v.default) {
                (Some(_), _) => Source::Env,
                (None, Fallback::Value(_)) => Source::Default,
                (None, _) => Source::Unset,
            };
            let value = raw
                .clone()
                .unwrap_or_else(|| default_of(v.name).to_string());
            let mut shown = match v.name {
                _ if source == Source::Unset => match v.default {
                    Fallback::Required => "(not set: required)".into(),
                    _ => "(not set)".into(),
                },
                "USER_TOKEN_KEYS" | "ADMISSION_TOKEN_KEYS" => describe_ring(&value),
                "ADMIN_KEYS" => match token::AdminKeys::parse(Some(&value)) {
                    Ok(k) => format!("{k:?}"),
                    Err(_) => "(malformed)".into(),
                },
                "PAYMENT_WEBHOOK_SECRET" => {
                    let n = webhook_secrets().len();
                    format!("**** ({n} secret{})", if n == 1 { "" } else { "s" })
                }
                "REDIS_CLUSTER_NODES" | "REDIS_SENTINEL" => value
                    .split(',')
                    .map(|n| mask_url(n.trim()))
                    .collect::<Vec<_>>()
                    .join(","),
                _ if v.secret => mask_url(&value),
                _ => value,
            };
            if v.name == "REDIS_URL" && cluster {
                shown.push_str(" (ignored: REDIS_CLUSTER_NODES is set)");
            }
            if v.name == "REDIS_SENTINEL_MASTER" && !sentinel {
                shown.push_str(" (unused: REDIS_SENTINEL is not set)");
            }
            if matches!(v.name, "REDIS_ACK_TIMEOUT_MS" | "REDIS_ACK_CONNECTIONS") && !wait {
                shown.push_str(" (unused: REDIS_ACK is not wait)");
            }
            if v.name.starts_with("KAFKA_") && !kafka {
                shown.push_str(" (unused: EVENTS_SINK is not kafka)");
            }
            Effective {
                name: v.name,
                shown,
                source,
            }
        })
        .collect()
}

/// Things that are allowed but that an operator should know about.
pub fn warnings(settings: &Settings) -> Vec<String> {
    let mut w = Vec::new();
    if settings.dev_mode {
        w.push("ORIGIN_DEV_MODE is on: the dev payment provider endpoint is served (never in production)".into());
    }
    if settings.payment_webhook_secrets.is_empty() {
        w.push("PAYMENT_WEBHOOK_SECRET is not set: payment webhooks are refused (503)".into());
    }
    if settings.addr.ip().is_loopback() {
        w.push(format!(
            "ORIGIN_ADDR {} is loopback-only: nothing outside this host (or container) can reach it",
            settings.addr
        ));
    }
    if settings.redis_ack == AckMode::Local
        && matches!(settings.redis, RedisTarget::Sentinel { .. })
    {
        w.push("REDIS_ACK=local with REDIS_SENTINEL: a failover loses the holds acknowledged in the moment before it that had not reached the replica (REDIS_ACK=wait prevents that)".into());
    }
    if settings.settle_claim_idle < Duration::from_secs(5) {
        w.push("SETTLE_CLAIM_IDLE_MS below 5 s: a slow but live worker's batch may be taken over (safe, but wasted work)".into());
    }
    w
}

/// The README's configuration table (Markdown), generated from [`ENV_VARS`].
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | default | meaning |\n|---|---|---|\n");
    for v in ENV_VARS {
        let default = match v.default {
            Fallback::Required => "**required**".to_string(),
            Fallback::Unset => "unset".to_string(),
            Fallback::Value(d) => format!("`{d}`"),
        };
        out.push_str(&format!("| `{}` | {default} | {} |\n", v.name, v.meaning));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_masked_and_the_rest_kept() {
        assert_eq!(
            mask_url("postgres://app:hunter2@db.internal:5432/shop?sslmode=require"),
            "postgres://app:****@db.internal:5432/shop?sslmode=require"
        );
        assert_eq!(
            mask_url("redis://:s3cret@10.0.0.1:6379"),
            "redis://:****@10.0.0.1:6379"
        );
        assert_eq!(mask_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        // Not a URL but looks like credentials: hide all of it.
        assert_eq!(mask_url("app:hunter2@db"), "****");
    }

    #[test]
    fn settings_debug_shows_no_secret() {
        let s = Settings {
            database_url: SecretString::from("postgres://a:pw-db-secret@h/d".to_string()),
            redis: RedisTarget::Sentinel {
                nodes: vec!["redis://:pw-redis-secret@h:1".into()],
                master: "mymaster".into(),
            },
            redis_ack: AckMode::Local,
            key_prefix: "fs".into(),
            user_keys: KeyRing::from_keys(&[("u1", &[1u8; 32])]).unwrap(),
            admission_keys: KeyRing::from_keys(&[("a1", &[2u8; 32])]).unwrap(),
            payment_webhook_secrets: vec![SecretString::from("whsec-secret".to_string())],
            addr: "127.0.0.1:0".parse().unwrap(),
            sweep_interval: Duration::from_secs(1),
            reconcile_interval: Duration::from_secs(1),
            settle_claim_idle: Duration::from_secs(1),
            settle_linger: Duration::from_millis(50),
            max_in_flight: 1,
            metrics_addr: None,
            pg_pool_size: 1,
            workers_nice: 10,
            shutdown_grace: Duration::from_secs(1),
            auto_migrate: true,
            dev_mode: false,
            events: EventsSink::RedisStream,
            webhooks: Default::default(),
            outbox_source: OutboxSource::Table,
            relay_abort_after_ack: None,
            admin: AdminSettings {
                keys: token::AdminKeys::parse(Some("ops:write:admin-secret-of-22-chars")).unwrap(),
                ..Default::default()
            },
        };
        let text = format!("{s:?}");
        for secret in [
            "pw-db-secret",
            "pw-redis-secret",
            "whsec-secret",
            "AQEB",
            "admin-secret",
        ] {
            assert!(!text.contains(secret), "{secret} leaked in {text}");
        }
        assert!(text.contains("u1") && text.contains("a1"), "{text}");
    }

    #[test]
    fn the_table_lists_every_variable_once() {
        let table = markdown_table();
        for v in ENV_VARS {
            assert_eq!(table.matches(&format!("| `{}` |", v.name)).count(), 1);
        }
    }
}
