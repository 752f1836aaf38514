//! The connection to the primary that Redis Sentinel names
//! (`REDIS_SENTINEL`), following failovers by itself.
//!
//! `ConnectionManager` (the single-Redis path) reconnects to the same
//! address; after a failover the primary has another address, so this
//! module asks the sentinels again instead.
//!
//! Invariants kept here:
//! - every command goes over one multiplexed connection to a server that
//!   answered `ROLE` = master when it was connected (the `redis` crate's
//!   `Sentinel::async_master_for` checks that), never to a demoted one;
//! - a connection is given up when it breaks (I/O error, dropped),
//!   when the server says it is no longer the writable primary (`READONLY`,
//!   `MASTERDOWN`), or when the watchdog (every [`WATCH_EVERY`]) sees the
//!   sentinels name another primary. From then until a newly named primary
//!   confirms its role, commands fail at once (the API answers 503 with
//!   `Retry-After`) rather than wait on a dead address;
//! - one re-discovery runs at a time, whatever number of requests saw the
//!   failure; each new connection gets the next `generation`;
//! - scripts are called by EVALSHA with the NOSCRIPT fallback of
//!   `redis::Script`, so a new primary that never saw them works at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisError, RedisFuture, RedisResult, ServerErrorKind, TlsMode, Value,
};

/// How often the sentinels are asked whether the primary moved, for the
/// failovers no broken connection reveals (a partitioned or manually
/// demoted primary that keeps its connections open).
pub const WATCH_EVERY: Duration = Duration::from_secs(1);
/// The longest one lookup (sentinels + the primary's `ROLE`) may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
/// Pauses between failed lookups while no primary is known.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Where the sentinels are and which primary to follow.
pub struct SentinelSource {
    sentinel: tokio::sync::Mutex<Sentinel>,
    master: String,
    node: SentinelNodeConnectionInfo,
    config: AsyncConnectionConfig,
}

impl SentinelSource {
    /// `nodes` are `redis[s]://` URLs of sentinels; the first one's
    /// credentials and TLS are used for the primary too.
    pub fn new(nodes: &[String], master: &str, config: AsyncConnectionConfig) -> RedisResult<Self> {
        let first = nodes
            .first()
            .ok_or_else(|| RedisError::from((ErrorKind::InvalidClientConfig, "no sentinel")))?
            .as_str()
            .into_connection_info()?;
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(first.redis_settings().clone().set_db(0));
        if let ConnectionAddr::TcpTls { insecure, .. } = first.addr() {
            node = node.set_tls_mode(if *insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            });
        }
        Ok(SentinelSource {
            sentinel: tokio::sync::Mutex::new(Sentinel::build(nodes.to_vec())?),
            master: master.to_string(),
            node,
            config,
        })
    }

    /// The primary the sentinels name now, confirmed by its own `ROLE`.
    pub async fn primary(&self) -> RedisResult<Client> {
        let lookup = async {
            let mut s = self.sentinel.lock().await;
            s.async_master_for(&self.master, Some(&self.node)).await
        };
        tokio::time::timeout(LOOKUP_TIMEOUT, lookup)
            .await
            .map_err(|_| {
                RedisError::from((
                    ErrorKind::Io,
                    "timed out asking the sentinels for the primary",
                ))
            })?
    }

    /// A new connection of its own to the current primary (the acknowledger
    /// uses one apart from the shared connection, see `crate::reserve::ack`).
    pub async fn connect_primary(&self) -> RedisResult<(String, MultiplexedConnection)> {
        let client = self.primary().await?;
        let addr = client.get_connection_info().addr().to_string();
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok((addr, conn))
    }
}

struct Current {
    generation: u64,
    /// `host:port` of the primary `conn` goes to.
    addr: String,
    /// `None` while the primary is being looked up again.
    conn: Option<MultiplexedConnection>,
}

struct Inner {
    source: SentinelSource,
    current: RwLock<Current>,
    refreshing: AtomicBool,
}

/// The shared connection to the Sentinel-named primary; clones share it.
#[derive(Clone)]
pub struct SentinelConn {
    inner: Arc<Inner>,
}

/// Does this error mean the connection no longer reaches a writable primary?
pub fn lost_primary(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly)
                | ErrorKind::Server(ServerErrorKind::MasterDown)
        )
}

fn no_primary() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "no primary connection: the sentinels are being asked for the current primary",
    ))
}

impl SentinelConn {
    /// Connects to the primary the sentinels name (an error if none can be
    /// reached now) and starts the watchdog, which lives as long as a clone.
    pub async fn connect(source: SentinelSource) -> RedisResult<Self> {
        let (addr, conn) = source.connect_primary().await?;
        tracing::info!(primary = %addr, master = %source.master, "redis: connected via sentinel");
        let inner = Arc::new(Inner {
            source,
            current: RwLock::new(Current {
                generation: 1,
                addr,
                conn: Some(conn),
            }),
            refreshing: AtomicBool::new(false),
        });
        tokio::spawn(watch(Arc::downgrade(&inner)));
        Ok(SentinelConn { inner })
    }

    /// The generation of the connection in use (1, then one more per
    /// re-discovery) and the primary's address.
    pub fn primary(&self) -> (u64, String) {
        let c = self.inner.current.read().expect("not poisoned");
        (c.generation, c.addr.clone())
    }

    /// The connection in use and its generation; while there is none, an
    /// error at once (and a lookup started if none runs).
    fn live(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let (generation, conn) = {
            let c = self.inner.current.read().expect("not poisoned");
            (c.generation, c.conn.clone())
        };
        conn.map(|conn| (generation, conn)).ok_or_else(|| {
            rediscover(&self.inner, generation);
            no_primary()
        })
    }

    /// Notes the outcome of a command sent on generation `generation`.
    fn after<T>(&self, generation: u64, r: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &r
            && lost_primary(e)
        {
            rediscover(&self.inner, generation);
        }
        r
    }
}

/// Drops generation `seen`'s connection and looks the primary up again, in
/// the background, until one answers as master; a no-op when a newer
/// generation is already in use or a lookup is under way.
fn rediscover(inner: &Arc<Inner>, seen: u64) {
    {
        let mut c = inner.current.write().expect("not poisoned");
        if c.generation != seen {
            return;
        }
        c.conn = None;
    }
    if inner.refreshing.swap(true, Ordering::AcqRel) {
        return;
    }
    let weak = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut pause = RETRY_MIN;
        loop {
            let Some(inner) = weak.upgrade() else { return };
            match inner.source.connect_primary().await {
                Ok((addr, conn)) => {
                    let mut c = inner.current.write().expect("not poisoned");
                    c.generation += 1;
                    tracing::warn!(primary = %addr, was = %c.addr, generation = c.generation, "redis: now connected to the primary the sentinels name");
                    c.addr = addr;
                    c.conn = Some(conn);
                    inner.refreshing.store(false, Ordering::Release);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "redis: no primary yet; asking the sentinels again");
                }
            }
            drop(inner);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RETRY_MAX);
        }
    });
}

/// Every [`WATCH_EVERY`]: when the sentinels name another primary than the
/// one in use, switch. Stops when the last connection clone is dropped.
async fn watch(weak: Weak<Inner>) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let Some(inner) = weak.upgrade() else { return };
        if inner.refreshing.load(Ordering::Acquire) {
            continue;
        }
        if let Ok(client) = inner.source.primary().await {
            let named = client.get_connection_info().addr().to_string();
            let (generation, addr) = {
                let c = inner.current.read().expect("not poisoned");
                (c.generation, c.addr.clone())
            };
            if named != addr {
                tracing::warn!(primary = %named, was = %addr, "redis: the sentinels name another primary");
                rediscover(&inner, generation);
            }
        }
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.live()?;
            let r = conn.req_packed_command(cmd).await;
            self.after(generation, r)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.live()?;
            let r = conn.req_packed_commands(pipeline, offset, count).await;
            self.after(generation, r)
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
