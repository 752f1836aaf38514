//! `REDIS_ACK=wait`: a write a client is told about (a hold's 202, a
//! cancel's 200, a payment's confirm) counts only once a replica has it, so
//! a primary killed right after the answer loses nothing it acknowledged.
//! The settlement worker asks the same of every stream entry before it
//! commits it to Postgres (`crate::settle::settler`), so Postgres only ever
//! learns what survives a failover.
//!
//! # Design: group commit on a connection of its own
//!
//! `WAIT n timeout` blocks the connection it is sent on until replicas
//! reach *that connection's* last write. The origin's requests share one
//! multiplexed connection (`crate::reserve::store`), so a `WAIT` there would stall
//! every request behind it, and per-request `WAIT`s would serialise them.
//! Instead one task, the acknowledger, owns a dedicated connection
//! (`store::connect_dedicated`, which never reconnects behind its back) and
//! runs rounds: it takes every fact queued since the last round, sends in
//! one pipeline one `lua/ack.lua` per shard involved (which checks that the
//! primary shows each fact, then writes a barrier `INCR`) and then
//! `WAIT 1 <REDIS_ACK_TIMEOUT_MS>`, and wakes every request of the round.
//! Requests arriving meanwhile form the next round, so under load one
//! `WAIT` covers many requests, and the shared connection never waits.
//! `REDIS_ACK_CONNECTIONS` runs that many such round-runners side by side
//! (each on its own connection), so a round need not wait for the previous
//! one's `WAIT` to end.
//!
//! Why this is sound (the invariant): a request asks only after its write
//! was answered, so the primary applied it before the round's barrier; the
//! replication stream is one ordered log, so a replica that has the barrier
//! has the write, whichever connection made it. Both halves of a round go
//! over one TCP connection (a dedicated `MultiplexedConnection` fails rather
//! than reconnect), so the `WAIT` is about the barrier just written. And
//! the barrier script checks that the very primary the `WAIT` is about
//! shows the fact: after a failover the hold may be on the dead primary
//! only; then the answer is `NotShown`, never a false acknowledgement.
//!
//! A request whose round fails answers 503 `not_replicated` (with
//! `Retry-After`); its write may still be on the primary. The reservation
//! protocol makes that safe: a retry with the same Idempotency-Key replays
//! the first hold (and waits for it again), never a second one.
//!
//! Cluster: facts of shards on several primaries would need one round per
//! primary; configuration refuses `REDIS_ACK=wait` with
//! `REDIS_CLUSTER_NODES` instead.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, RedisError, Value};
use tokio::sync::{mpsc, oneshot};

use crate::ops::configuration::RedisTarget;
use crate::reserve::store::{self, ShardKeys};

/// The barrier script (`lua/ack.lua`), loaded on each new connection.
pub const ACK_LUA: &str = include_str!("../../../lua/ack.lua");
/// Facts one round takes at most (the rest wait for the next).
pub const MAX_ROUND: usize = 1024;

/// What a client is about to be told about a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FactKind {
    /// It exists (a 202: new or replayed).
    Held,
    /// It is gone (a cancel).
    Gone,
    /// It is paid (a payment's confirm).
    Paid,
    /// A settlement entry about it is in the shard's stream (the settler is
    /// about to commit it).
    Entry,
    /// A replay's 202: the Idempotency-Key record that answers it names the
    /// hold (the hold itself may be released since). See [`Fact::replayed`].
    Replayed,
}

impl FactKind {
    fn arg(self) -> &'static str {
        match self {
            FactKind::Held => "held",
            FactKind::Gone => "gone",
            FactKind::Paid => "paid",
            FactKind::Entry => "entry",
            FactKind::Replayed => "replay",
        }
    }
}

/// One fact about one hold on one shard.
#[derive(Debug, Clone)]
pub struct Fact {
    barrier: String,
    holds: String,
    stream: String,
    /// The hold id; for [`FactKind::Entry`], `"<entry id> <hold id>"`.
    id: String,
    kind: FactKind,
    /// For [`FactKind::Replayed`]: the Idempotency-Key record's key.
    record: Option<String>,
}

impl Fact {
    /// `kind` about hold `hold_id` (for a stream entry use [`Fact::entry`]).
    pub fn new(keys: &ShardKeys, hold_id: &str, kind: FactKind) -> Self {
        Fact {
            barrier: keys.ack.clone(),
            holds: keys.holds.clone(),
            stream: keys.stream.clone(),
            id: hold_id.to_string(),
            kind,
            record: None,
        }
    }

    /// A replay of an Idempotency-Key whose record (`record`, a key of the
    /// account's home shard, whose `keys` these are) names hold `hold_id`:
    /// the replay repeats what that record says, so that record is what a
    /// replica must have. Checking the hold instead never passed once the
    /// hold was released (issue 43 #3: 503 `not_replicated` forever).
    pub fn replayed(keys: &ShardKeys, record: &str, hold_id: &str) -> Self {
        let mut f = Fact::new(keys, hold_id, FactKind::Replayed);
        f.record = Some(record.to_string());
        f
    }

    /// The settlement entry `entry_id` about hold `hold_id` is in the
    /// shard's stream.
    pub fn entry(keys: &ShardKeys, entry_id: &str, hold_id: &str) -> Self {
        let mut f = Fact::new(keys, hold_id, FactKind::Entry);
        f.id = format!("{entry_id} {hold_id}");
        f
    }
}

impl Fact {
    /// The events stream `stream` (the outbox relay's Redis sink) holds
    /// entry `entry_id` for event `event_id`: the relay marks a batch
    /// published only once a replica has its last entry (and so every
    /// earlier one: one replication log). `barrier` is the round's counter.
    pub fn event(stream: &str, barrier: &str, entry_id: &str, event_id: &str) -> Self {
        Fact {
            barrier: barrier.to_string(),
            holds: stream.to_string(),
            stream: stream.to_string(),
            id: format!("{entry_id} {event_id}"),
            kind: FactKind::Entry,
            record: None,
        }
    }
}

/// Why a write was not acknowledged. The write may exist on the primary
/// all the same: the client is told to retry (503), and retries are
/// idempotent.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AckError {
    #[error("no replica confirmed the write within {timeout_ms} ms")]
    NotReplicated { timeout_ms: u64 },
    #[error("the primary does not show the write (replaced by a failover, or undone meanwhile)")]
    NotShown,
    #[error("the replication check could not run: {0}")]
    Redis(RedisError),
    #[error("the acknowledger has stopped")]
    Stopped,
}

struct Pending {
    fact: Fact,
    done: oneshot::Sender<Result<(), AckError>>,
}

/// The handle requests use; cheap to clone. The task behind it ends when
/// the last handle is dropped.
#[derive(Clone)]
pub struct Acker {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Acker {
    /// Starts the acknowledger for `target` (a single Redis or Sentinel):
    /// `connections` tasks, each with its own connection (made on its first
    /// round and again after any failed round), each running one round at
    /// a time; while one waits for its `WAIT`, the next takes what has
    /// queued since (`REDIS_ACK_CONNECTIONS`).
    pub fn start(target: RedisTarget, timeout: Duration, connections: usize) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..connections.max(1) {
            tokio::spawn(run(target.clone(), timeout, rx.clone()));
        }
        Acker { tx }
    }

    /// Resolves once a replica has `fact` (and the primary shows it).
    pub async fn confirm(&self, fact: Fact) -> Result<(), AckError> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Pending { fact, done })
            .map_err(|_| AckError::Stopped)?;
        wait.await.unwrap_or(Err(AckError::Stopped))
    }

    /// Resolves once a replica has every one of `facts` (and the primary
    /// shows each); the first failure otherwise. They are queued together,
    /// so they usually share one round.
    pub async fn confirm_all(&self, facts: Vec<Fact>) -> Result<(), AckError> {
        let mut waits = Vec::with_capacity(facts.len());
        for fact in facts {
            let (done, wait) = oneshot::channel();
            self.tx
                .send(Pending { fact, done })
                .map_err(|_| AckError::Stopped)?;
            waits.push(wait);
        }
        for wait in waits {
            wait.await.unwrap_or(Err(AckError::Stopped))?;
        }
        Ok(())
    }
}

/// One round-runner: takes what has queued (waiting for the first if
/// nothing has), runs the round, answers every request of it.
async fn run(
    target: RedisTarget,
    timeout: Duration,
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Pending>>>,
) {
    let mut conn: Option<MultiplexedConnection> = None;
    let mut round: Vec<Pending> = Vec::new();
    loop {
        let taken = rx.lock().await.recv_many(&mut round, MAX_ROUND).await;
        if taken == 0 {
            return;
        }
        let started = Instant::now();
        let facts: Vec<&Fact> = round.iter().map(|p| &p.fact).collect();
        let outcome = one_round(&target, timeout, &mut conn, &facts).await;
        metrics::histogram!("flashsale_redis_ack_round_seconds")
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("flashsale_redis_ack_rounds_total").increment(1);
        if let Err(e) = &outcome {
            tracing::warn!(error = %e, facts = round.len(), "redis ack: round failed; its requests answer 503");
        }
        for (i, p) in round.drain(..).enumerate() {
            let r = match &outcome {
                Ok((_, replicas)) if *replicas < 1 => Err(AckError::NotReplicated {
                    timeout_ms: timeout.as_millis() as u64,
                }),
                Ok((shown, _)) if !shown[i] => Err(AckError::NotShown),
                Ok(_) => Ok(()),
                Err(e) => Err(AckError::Redis(e.clone())),
            };
            let label = match &r {
                Ok(()) => "replicated",
                Err(AckError::NotReplicated { .. }) => "not_replicated",
                Err(AckError::NotShown) => "not_shown",
                Err(_) => "error",
            };
            metrics::counter!("flashsale_redis_ack_total", "outcome" => label).increment(1);
            let _ = p.done.send(r);
        }
    }
}

/// One round: per shard, ack.lua (check + barrier); then `WAIT 1`, all in
/// one pipeline on `conn`. Returns whether the primary showed each fact
/// (in `facts` order) and how many replicas reached the barrier. Any error
/// drops the connection, so the next round starts on a fresh one.
async fn one_round(
    target: &RedisTarget,
    timeout: Duration,
    conn: &mut Option<MultiplexedConnection>,
    facts: &[&Fact],
) -> Result<(Vec<bool>, i64), RedisError> {
    let sha = redis::Script::new(ACK_LUA).get_hash().to_string();
    if conn.is_none() {
        // Its answers may take the whole WAIT timeout.
        let mut c = store::connect_dedicated(target, timeout + Duration::from_secs(2)).await?;
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(ACK_LUA)
            .query_async(&mut c)
            .await?;
        *conn = Some(c);
    }
    let c = conn.as_mut().expect("connected above");
    // Facts grouped per shard (one slot per script call), in a fixed order.
    let mut shards: BTreeMap<(&str, &str, &str), Vec<usize>> = BTreeMap::new();
    for (i, f) in facts.iter().enumerate() {
        shards
            .entry((f.barrier.as_str(), f.holds.as_str(), f.stream.as_str()))
            .or_default()
            .push(i);
    }
    let mut pipe = redis::pipe();
    for ((barrier, holds, stream), idx) in &shards {
        // A replay's record goes in KEYS (4, 5, …) and its fact names it by
        // position, so the script touches only the keys it declares.
        let records: Vec<&str> = idx
            .iter()
            .filter_map(|&i| facts[i].record.as_deref())
            .collect();
        let call = pipe
            .cmd("EVALSHA")
            .arg(&sha)
            .arg(3 + records.len())
            .arg(barrier)
            .arg(holds)
            .arg(stream)
            .arg(&records);
        let mut n = 3;
        for &i in idx {
            let f = facts[i];
            call.arg(f.kind.arg());
            if f.record.is_some() {
                n += 1;
                call.arg(format!("{n} {}", f.id));
            } else {
                call.arg(&f.id);
            }
        }
    }
    pipe.cmd("WAIT").arg(1).arg(timeout.as_millis() as u64);
    let answers: Vec<Value> = match pipe.query_async(c).await {
        Ok(a) => a,
        Err(e) => {
            // A broken connection, or NOSCRIPT (SCRIPT FLUSH): the next round
            // connects again and loads the script again.
            *conn = None;
            return Err(e);
        }
    };
    let mut shown = vec![false; facts.len()];
    let mut answers = answers.into_iter();
    for idx in shards.values() {
        let flags: Vec<i64> = match answers.next() {
            Some(v) => redis::from_redis_value(v)?,
            None => return Err(short_answer()),
        };
        for (&i, flag) in idx.iter().zip(flags) {
            shown[i] = flag == 1;
        }
    }
    let replicas: i64 = match answers.next() {
        Some(v) => redis::from_redis_value(v)?,
        None => return Err(short_answer()),
    };
    Ok((shown, replicas))
}

fn short_answer() -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "the ack pipeline answered fewer replies than it sent commands",
    ))
}
