//! Configuration from the environment (DESIGN.md's operator interface).
//!
//! Every value is read and checked here, once, with an error that names the
//! variable (and, for key lists, the entry) that is wrong — the process
//! never starts half-configured.

use std::net::SocketAddr;
use std::time::Duration;

use token::{KeyRing, KeyRingError};

/// Where the speed layer lives.
#[derive(Debug, Clone)]
pub enum RedisTarget {
    /// `REDIS_URL`: one Redis.
    Single(String),
    /// `REDIS_CLUSTER_NODES`: seed `host:port` list of a Redis Cluster.
    Cluster(Vec<String>),
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
        value: String,
        why: String,
    },
}

/// Everything `origin serve` needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database_url: String,
    pub redis: RedisTarget,
    pub key_prefix: String,
    pub user_keys: KeyRing,
    pub admission_keys: KeyRing,
    pub payment_webhook_secret: Option<String>,
    pub addr: SocketAddr,
    pub sweep_interval: Duration,
    pub reconcile_interval: Duration,
    /// Settlement entries pending this long on a consumer are taken over.
    pub settle_claim_idle: Duration,
    /// Reservation requests allowed in flight before the origin sheds (429).
    pub max_in_flight: usize,
    /// Dev-only conveniences (the dev payment provider endpoint).
    pub dev_mode: bool,
}

fn var(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `DATABASE_URL`, defaulting to the local dev database.
pub fn database_url() -> String {
    var("DATABASE_URL").unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/flashsale".into())
}

/// `REDIS_CLUSTER_NODES` if set, else `REDIS_URL` (default local Redis).
pub fn redis_target() -> Result<RedisTarget, ConfigError> {
    if let Some(nodes) = var("REDIS_CLUSTER_NODES") {
        let list: Vec<String> = nodes
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        for n in &list {
            let ok = n
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(ConfigError::Invalid {
                    var: "REDIS_CLUSTER_NODES",
                    value: n.clone(),
                    why: "each entry must be host:port".into(),
                });
            }
        }
        if list.is_empty() {
            return Err(ConfigError::Missing("REDIS_CLUSTER_NODES"));
        }
        return Ok(RedisTarget::Cluster(list));
    }
    Ok(RedisTarget::Single(
        var("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
    ))
}

/// `REDIS_KEY_PREFIX` (default `fs`): letters, digits, `-`, `_`, `:` only,
/// because it becomes part of every key and must never contain a hash tag.
pub fn key_prefix() -> Result<String, ConfigError> {
    let prefix = var("REDIS_KEY_PREFIX").unwrap_or_else(|| "fs".into());
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

fn duration_ms(name: &'static str, default_ms: u64) -> Result<Duration, ConfigError> {
    match var(name) {
        None => Ok(Duration::from_millis(default_ms)),
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
            .ok_or(ConfigError::Invalid {
                var: name,
                value: v,
                why: "a positive number of milliseconds".into(),
            }),
    }
}

impl Settings {
    /// Reads everything `origin serve` needs.
    pub fn from_env() -> Result<Self, ConfigError> {
        let addr_text = var("ORIGIN_ADDR").unwrap_or_else(|| "127.0.0.1:8080".into());
        let addr = addr_text.parse().map_err(|_| ConfigError::Invalid {
            var: "ORIGIN_ADDR",
            value: addr_text.clone(),
            why: "expected ip:port".into(),
        })?;
        let max_in_flight = match var("ORIGIN_MAX_IN_FLIGHT") {
            None => 1024,
            Some(v) => v
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or(ConfigError::Invalid {
                    var: "ORIGIN_MAX_IN_FLIGHT",
                    value: v,
                    why: "a positive integer".into(),
                })?,
        };
        Ok(Settings {
            database_url: database_url(),
            redis: redis_target()?,
            key_prefix: key_prefix()?,
            user_keys: key_ring("USER_TOKEN_KEYS")?,
            admission_keys: key_ring("ADMISSION_TOKEN_KEYS")?,
            payment_webhook_secret: var("PAYMENT_WEBHOOK_SECRET"),
            addr,
            sweep_interval: duration_ms("SWEEP_INTERVAL_MS", 1_000)?,
            reconcile_interval: duration_ms("RECONCILE_INTERVAL_MS", 60_000)?,
            settle_claim_idle: duration_ms("SETTLE_CLAIM_IDLE_MS", 30_000)?,
            max_in_flight,
            dev_mode: var("ORIGIN_DEV_MODE").is_some_and(|v| v == "1" || v == "true"),
        })
    }
}
