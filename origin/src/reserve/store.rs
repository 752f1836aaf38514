//! The speed layer's plumbing: one connection type for a single Redis or a
//! Redis Cluster, the key layout, and the choice of shard hash tags (the
//! scripts that run on those keys are `crate::reserve::scripts`).
//!
//! Invariants kept here:
//! - every key of a shard carries the shard's hash tag, so each script (which
//!   only ever receives one shard's keys) touches one cluster slot;
//! - a sale's shard tags are chosen once, at `sale create`, and stored in
//!   Postgres, so every process computes the same keys.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::ops::configuration::RedisTarget;
use crate::reserve::failover::{SentinelConn, SentinelSource};

/// A connection to any deployment shape; the code path above it is the same.
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The primary Redis Sentinel names, followed across failovers.
    Sentinel(SentinelConn),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
            RedisConn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
            RedisConn::Sentinel(c) => c.get_db(),
        }
    }
}

/// How long one Redis answer may take before the request fails (503).
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(2_000);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

fn sentinel_source(
    nodes: &[String],
    master: &str,
    response_timeout: Duration,
) -> redis::RedisResult<SentinelSource> {
    SentinelSource::new(
        nodes,
        master,
        redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(response_timeout))
            .set_connection_timeout(Some(CONNECT_TIMEOUT)),
    )
}

/// Connects to Redis. For a single Redis the manager reconnects by itself
/// after an outage, so the origin serves again once Redis is back; through
/// Sentinel the connection follows the primary to its new address after a
/// failover (`crate::reserve::failover`).
pub async fn connect(target: &RedisTarget) -> redis::RedisResult<RedisConn> {
    match target {
        RedisTarget::Single(url) => {
            let client = redis::Client::open(url.as_str())?;
            let config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500));
            Ok(RedisConn::Single(
                client.get_connection_manager_with_config(config).await?,
            ))
        }
        RedisTarget::Cluster(nodes) => {
            let urls: Vec<String> = nodes
                .iter()
                .map(|n| {
                    if n.contains("://") {
                        n.clone()
                    } else {
                        format!("redis://{n}")
                    }
                })
                .collect();
            let client = redis::cluster::ClusterClient::builder(urls)
                .response_timeout(RESPONSE_TIMEOUT)
                .connection_timeout(CONNECT_TIMEOUT)
                .retries(2)
                .build()?;
            Ok(RedisConn::Cluster(client.get_async_connection().await?))
        }
        RedisTarget::Sentinel { nodes, master } => Ok(RedisConn::Sentinel(
            SentinelConn::connect(sentinel_source(nodes, master, RESPONSE_TIMEOUT)?).await?,
        )),
    }
}

/// A plain connection of its own to the (current) primary, which never
/// reconnects by itself: two commands sent on it in turn went over one TCP
/// connection or the second failed — what `WAIT` needs (`crate::reserve::ack`).
/// `response_timeout` must exceed the longest command sent on it.
pub async fn connect_dedicated(
    target: &RedisTarget,
    response_timeout: Duration,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(CONNECT_TIMEOUT));
    match target {
        RedisTarget::Single(url) => {
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection_with_config(&config)
                .await
        }
        RedisTarget::Sentinel { nodes, master } => {
            let source = sentinel_source(nodes, master, response_timeout)?;
            Ok(source.connect_primary().await?.1)
        }
        RedisTarget::Cluster(_) => Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a dedicated connection needs one primary (REDIS_URL or REDIS_SENTINEL)",
        ))),
    }
}

/// The keys of one shard, all under the shard's hash tag. Their order is the
/// `KEYS[1..7]` layout documented in `lua/_lib.lua`.
#[derive(Debug, Clone)]
pub struct ShardKeys {
    base: String,
    pub stock: String,
    pub holds: String,
    pub exp: String,
    pub users: String,
    pub quota: String,
    pub stream: String,
    pub unquota: String,
    /// Settlement entries that could not be read (parked, not lost).
    pub dead_letter: String,
    /// The barrier counter `REDIS_ACK=wait` writes before its `WAIT`
    /// (`lua/ack.lua`).
    pub ack: String,
}

impl ShardKeys {
    pub fn new(prefix: &str, tag: &str) -> Self {
        let base = format!("{prefix}:{{{tag}}}");
        ShardKeys {
            stock: format!("{base}:stock"),
            holds: format!("{base}:holds"),
            exp: format!("{base}:exp"),
            users: format!("{base}:users"),
            quota: format!("{base}:quota"),
            stream: format!("{base}:stream"),
            unquota: format!("{base}:unquota"),
            dead_letter: format!("{base}:dlq"),
            ack: format!("{base}:ack"),
            base,
        }
    }

    /// The stock key of the SKU at `position` on this shard: `stock` for
    /// position 0 (the key a sale had before SKUs; it also marks the shard
    /// as live, so it exists on every shard), `stock:<position>` otherwise,
    /// as `lua/_lib.lua` `stock_key` names it. Same hash tag, same slot.
    pub fn stock_of(&self, position: i32) -> String {
        if position == 0 {
            self.stock.clone()
        } else {
            format!("{}:{position}", self.stock)
        }
    }

    /// `KEYS[1..7]` in script order.
    pub fn all(&self) -> [&str; 7] {
        [
            &self.stock,
            &self.holds,
            &self.exp,
            &self.users,
            &self.quota,
            &self.stream,
            &self.unquota,
        ]
    }

    /// The idempotency record of (account, Idempotency-Key) on this shard.
    pub fn idem(&self, account: &str, key: &str) -> String {
        self.idem_at(&idem_hash(account, key))
    }

    /// The idempotency record named by its hash (as holds and Postgres keep
    /// it, so a cold rebuild can restore the record).
    pub fn idem_at(&self, hash: &str) -> String {
        format!("{}:idem:{hash}", self.base)
    }

    /// The staging keys of one rebuild of this shard (holds, exp, users,
    /// quota; `lua/rebuild_stage.lua`), named by the rebuild's `token` so two
    /// rebuilds at once never mix their copies. Under the shard's hash tag,
    /// so `lua/rebuild.lua` can swap them in within one cluster slot.
    pub fn rebuild_staging(&self, token: &str) -> [String; 4] {
        ["holds", "exp", "users", "quota"].map(|k| format!("{}:rebuild:{token}:{k}", self.base))
    }

    /// take.lua's once-only decision for a spilled hold on this shard.
    pub fn spill_marker(&self, hold_id: &str) -> String {
        format!("{}:spill:{hold_id}", self.base)
    }
}

/// The hash naming (account, Idempotency-Key)'s record: 16 bytes of
/// SHA-256, hex. Holds carry it (and Postgres keeps it) so a cold rebuild
/// can restore the record without knowing the key itself.
pub fn idem_hash(account: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(account.as_bytes());
    h.update([0u8]);
    h.update(key.as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// The cluster slot of a hash tag (CRC16/XMODEM mod 16384, as Redis does).
pub fn slot_of(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384
}

/// Chooses one hash tag per shard. On a single Redis the plain
/// `<prefix>/<sale>/<i>` is used. On a cluster, shard `i` is steered to
/// master `i mod M` (masters ordered by their first slot) by trying suffixes
/// until the tag's slot belongs to that master: naive suffixes can land
/// 9/4/3 on three masters; this lands as evenly as the shard count allows.
pub fn choose_tags(
    prefix: &str,
    sale: &str,
    shards: u32,
    masters: &[Vec<(u16, u16)>],
) -> Vec<String> {
    (0..shards)
        .map(|i| {
            let plain = format!("{prefix}/{sale}/{i}");
            if masters.len() < 2 {
                return plain;
            }
            let ranges = &masters[i as usize % masters.len()];
            (0u32..)
                .map(|k| format!("{plain}.{k}"))
                .find(|tag| {
                    let s = slot_of(tag);
                    ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&s))
                })
                .expect("every master owns at least one slot")
        })
        .collect()
}

/// The slot ranges of each master, ordered by their lowest slot; empty for a
/// single Redis.
pub async fn master_slot_ranges(conn: &mut RedisConn) -> redis::RedisResult<Vec<Vec<(u16, u16)>>> {
    if !matches!(conn, RedisConn::Cluster(_)) {
        return Ok(vec![]);
    }
    // CLUSTER SLOTS: [[start, end, [host, port, id], replicas…], …]
    let raw: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
    let mut by_master: std::collections::BTreeMap<String, Vec<(u16, u16)>> = Default::default();
    for entry in raw {
        let Value::Array(parts) = entry else { continue };
        if parts.len() < 3 {
            continue;
        }
        let lo: u16 = redis::from_redis_value(parts[0].clone())?;
        let hi: u16 = redis::from_redis_value(parts[1].clone())?;
        let Value::Array(node) = &parts[2] else {
            continue;
        };
        let host: String = redis::from_redis_value(node[0].clone())?;
        let port: u16 = redis::from_redis_value(node[1].clone())?;
        by_master
            .entry(format!("{host}:{port}"))
            .or_default()
            .push((lo, hi));
    }
    let mut masters: Vec<Vec<(u16, u16)>> = by_master.into_values().collect();
    for m in &mut masters {
        m.sort();
    }
    masters.sort_by_key(|m| m[0].0);
    Ok(masters)
}

/// The consumer group every settlement worker joins.
pub const GROUP: &str = "settlement";

/// Creates the shard's settlement consumer group (and stream) unless it
/// exists: at `sale create`, and by a settler that finds it missing.
pub async fn ensure_group(conn: &mut RedisConn, keys: &ShardKeys) -> redis::RedisResult<()> {
    use redis::AsyncCommands;
    let r: redis::RedisResult<()> = conn.xgroup_create_mkstream(&keys.stream, GROUP, "0").await;
    match r {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_reference_values() {
        // Reference values from the Redis Cluster specification.
        assert_eq!(slot_of("123456789"), 0x31C3);
        assert_eq!(slot_of("foo"), 12182);
    }

    #[test]
    fn tags_spread_over_masters() {
        let masters = vec![vec![(0, 5460)], vec![(5461, 10922)], vec![(10923, 16383)]];
        let tags = choose_tags("fs", "drop", 6, &masters);
        let mut counts = [0; 3];
        for t in &tags {
            let s = slot_of(t);
            counts[masters
                .iter()
                .position(|m| m.iter().any(|(a, b)| (*a..=*b).contains(&s)))
                .unwrap()] += 1;
        }
        assert_eq!(counts, [2, 2, 2]);
        assert_eq!(
            choose_tags("fs", "drop", 2, &[]),
            vec!["fs/drop/0", "fs/drop/1"]
        );
    }

    #[test]
    fn every_shard_key_shares_the_tag() {
        let k = ShardKeys::new("p", "p/s/0");
        for key in k.all().iter().copied().chain([
            k.idem("a", "b").as_str(),
            k.spill_marker("h").as_str(),
            k.ack.as_str(),
        ]) {
            assert!(key.contains("{p/s/0}"), "{key}");
        }
    }
}
