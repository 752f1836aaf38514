//! The reservation engine: decides atomically in Redis whether an account
//! gets units, over a sale's sharded stock.
//!
//! # Routing and the per-user limit across shards
//!
//! Redis Cluster refuses a script that touches two hash slots, and each
//! shard is its own slot. So the account's count cannot be read from every
//! shard at once. Instead each account has ONE home shard,
//! `home = fnv1a(account) mod N`, and its count (units held, pending and
//! bought) lives only there:
//!
//! 1. `reserve.lua` runs on the home shard: idempotency, the limit check
//!    against the home count, and — when the home shard has stock — the
//!    whole hold (stock, count, hold record, expiry, settlement record) in one
//!    atomic script. Accounts hash uniformly, so the start shard is uniformly
//!    random across requests, and deterministic per account, which is what
//!    makes Idempotency-Key replays land on the record they need.
//! 2. When the home shard is empty, the same script reserves the account's
//!    quota there (count += qty, a quota record under the new hold id) and
//!    answers SPILL. The origin then walks the other shards in a fixed order
//!    (`home+1, home+2, …`) with `take.lua`, which grants from that shard
//!    without any per-user check — the quota is already counted.
//! 3. `quota_commit.lua` records on the home shard where the hold landed (and
//!    gives back quota not granted on a partial fill); if every shard was
//!    empty, `quota_return.lua` gives the quota back and the sale is sold out.
//!
//! Why the limit holds: the home count is raised *before* any unit is
//! granted anywhere and lowered only *after* the hold is gone (release on
//! the home shard itself, or via the `unquota` note another shard leaves and
//! the sweep carries over with `quota_return.lua`, at most once per hold id).
//! So at every instant count ≥ units the account holds, and the check
//! `count + qty ≤ limit` is atomic on the home shard. A crash between steps
//! can only leave the count too high (the safe side), never too low.
//!
//! Why one key never yields two holds: `take.lua` decides once per hold id
//! per shard (a marker), and every replay walks the shards in the same
//! order, so the first shard that said HELD is the only one that ever can.
//!
//! Why a replay never counts less than it holds: the key's record keeps the
//! first request's qty; a replay with another qty is refused (422) before
//! anything changes, and a replay of an unfinished spill continues it with
//! the first qty, which is what the home shard counted.
//!
//! SKUs (issue 45): a reservation names one SKU of the sale. Its stock is
//! that SKU's key on each shard it is placed on
//! (`crate::sales::placement`); the spill walks only those shards, so
//! spill-over stays inside the SKU; the home shard counts the account's
//! units of the SKU beside its sale-wide count and checks both limits in the
//! same script, so both hold across shards for the same reason the
//! sale-wide one does. A one-SKU sale passes no position and works exactly
//! as before SKUs.
//!
//! Time comes from Redis (`TIME` inside each script), so origins with skewed
//! clocks agree on when holds expire.

use redis::{RedisError, Value};
use serde::Serialize;

use crate::reserve::ack::{AckError, Acker, Fact, FactKind};
use crate::reserve::scripts::Scripts;
use crate::reserve::store::{self, RedisConn, ShardKeys};
use crate::sales::placement::Placement;
use crate::sales::sale::Sale;

/// How long an Idempotency-Key's answer is remembered.
pub const IDEMPOTENCY_TTL_SECS: u64 = 24 * 3600;
/// How long a finished spill's decision markers outlive it (see
/// [`Engine::retire_markers`]): longer than any replay can take to walk
/// the shards (at most a 2 s Redis timeout per shard, 256 shards).
pub const SPILL_MARKER_AFTER_SECS: u64 = 600;
/// Expired holds a reservation reclaims on demand in one go.
pub const RECLAIM_BATCH: u32 = 64;

/// The account's home shard: FNV-1a of the account id, stable across
/// processes and releases (it decides where the account's count lives).
pub fn home_shard(account: &str, shards: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in account.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % shards as u64) as usize
}

/// A granted hold.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Hold {
    pub reservation_id: String,
    pub sale: String,
    pub qty: i64,
    pub shard: usize,
    pub expires_ms: u64,
    /// This answer repeats the first one for the same Idempotency-Key.
    #[serde(skip)]
    pub replay: bool,
}

/// What a reservation attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Held(Hold),
    /// The account already has `used` units; `qty` more would pass the limit.
    Limit {
        used: i64,
    },
    /// The account already has `used` units of this SKU; `qty` more would
    /// pass the SKU's own limit.
    SkuLimit {
        used: i64,
    },
    /// The account's admission to the sale was revoked (issue 47).
    Revoked,
    /// The SKU asked for has no unit left on any of its shards (in a one-SKU
    /// sale: the sale is sold out).
    SoldOut,
    /// A shard's keys are gone (Redis lost data): the sale must be rebuilt.
    Uninitialized,
    /// The Idempotency-Key's hold existed and has since been released.
    Gone {
        reservation_id: String,
    },
    /// The Idempotency-Key was used for a request with another qty or
    /// another SKU: one key is one request, so this one is refused and
    /// changes nothing.
    KeyReused {
        first_qty: i64,
    },
}

/// A reservation id: `<sale>.<home shard>.<uuid>`; self-describing so any
/// process finds the hold's home shard without a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationId<'a> {
    pub sale: &'a str,
    pub home: usize,
}

impl<'a> ReservationId<'a> {
    pub fn parse(id: &'a str) -> Option<Self> {
        let mut parts = id.split('.');
        let (Some(sale), Some(home), Some(uuid), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let home: usize = home.parse().ok()?;
        if !crate::sales::sale::valid_sale_id(sale)
            || uuid.len() != 32
            || !uuid.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return None;
        }
        Some(ReservationId { sale, home })
    }

    pub fn new_id(sale: &str, home: usize) -> String {
        format!("{sale}.{home}.{}", uuid::Uuid::now_v7().simple())
    }
}

fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Int(i)) => *i,
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        Some(Value::Int(i)) => i.to_string(),
        _ => String::new(),
    }
}

fn held(r: &[Value], sale: &str, replay: bool) -> Hold {
    Hold {
        reservation_id: text(r.get(1)),
        sale: sale.to_string(),
        shard: int(r.get(2)) as usize,
        expires_ms: int(r.get(3)) as u64,
        qty: int(r.get(4)),
        replay,
    }
}

/// The origin's handle on the speed layer.
pub struct Engine {
    pub conn: RedisConn,
    pub scripts: Scripts,
    /// `REDIS_ACK=wait`: what a client is told waits for a replica.
    pub acker: Option<Acker>,
}

/// One reservation request, as the engine's steps need it.
#[derive(Debug, Clone)]
pub struct ReserveCall<'a> {
    pub sale: &'a Sale,
    pub account: &'a str,
    /// The qty this request asks for.
    pub qty: i64,
    /// The account's home shard.
    pub home: usize,
    /// Names the (account, Idempotency-Key) record; see [`store::idem_hash`].
    pub idem: String,
    /// The SKU's position as the scripts get it (`None`: a one-SKU sale).
    pub position: Option<i32>,
    /// The shards the SKU's stock is on.
    pub placement: Placement,
    /// The SKU's own per-account limit, if it has one.
    pub sku_limit: Option<i32>,
}

impl<'a> ReserveCall<'a> {
    /// A request for `qty` units of the SKU at `position` (0 in a one-SKU
    /// sale).
    pub fn new(
        sale: &'a Sale,
        position: i32,
        account: &'a str,
        qty: i64,
        idempotency_key: &str,
    ) -> Self {
        let sku_limit = usize::try_from(position)
            .ok()
            .and_then(|p| sale.config.skus.get(p))
            .and_then(|s| s.per_user_limit);
        ReserveCall {
            sale,
            account,
            qty,
            home: home_shard(account, sale.shards.len()),
            idem: store::idem_hash(account, idempotency_key),
            position: sale.script_position(position),
            placement: sale.placement(position),
            sku_limit,
        }
    }

    /// The position as a script argument ('' in a one-SKU sale).
    fn position_arg(&self) -> String {
        self.position.map(|p| p.to_string()).unwrap_or_default()
    }

    fn home_keys(&self) -> &'a ShardKeys {
        &self.sale.shards[self.home]
    }

    fn hold_ms(&self) -> u64 {
        u64::try_from(self.sale.config.hold_seconds).unwrap_or(1) * 1000
    }
}

/// What the home shard decided (reserve.lua).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HomeStep {
    /// Final: held there, a replay, a refusal.
    Done(Outcome),
    /// The home shard is empty: `qty` units of quota are counted there under
    /// `hold_id`; the other shards are tried next ([`Engine::take`]).
    Spill { hold_id: String, qty: i64 },
}

/// What one other shard said to a spill (take.lua).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Took {
    Held(Hold),
    Empty,
    /// This shard granted the hold earlier and it has been released since.
    Gone,
    Uninitialized,
}

impl Engine {
    /// Before a client is told `kind` about hold `id` on the shard of
    /// `keys`: with `REDIS_ACK=wait`, waits until a replica has it
    /// (`crate::reserve::ack`); with `local`, at once.
    pub async fn acknowledge(
        &self,
        keys: &ShardKeys,
        id: &str,
        kind: FactKind,
    ) -> Result<(), AckError> {
        match &self.acker {
            None => Ok(()),
            Some(acker) => acker.confirm(Fact::new(keys, id, kind)).await,
        }
    }

    /// Before a replay's 202 is sent: with `REDIS_ACK=wait`, waits until a
    /// replica has the Idempotency-Key record the answer repeats
    /// ([`Fact::replayed`]); the hold it names may be released since.
    pub async fn acknowledge_replay(
        &self,
        sale: &Sale,
        account: &str,
        idempotency_key: &str,
        hold_id: &str,
    ) -> Result<(), AckError> {
        let Some(acker) = &self.acker else {
            return Ok(());
        };
        let call = ReserveCall::new(sale, 0, account, 1, idempotency_key);
        let home = call.home_keys();
        let record = home.idem_at(&call.idem);
        acker.confirm(Fact::replayed(home, &record, hold_id)).await
    }

    /// One reservation attempt; see the module doc for the protocol. The
    /// steps are public so tests can stop between them, as a crash would.
    pub async fn reserve(
        &self,
        sale: &Sale,
        position: i32,
        account: &str,
        qty: i64,
        idempotency_key: &str,
    ) -> Result<Outcome, RedisError> {
        let call = ReserveCall::new(sale, position, account, qty, idempotency_key);
        match self.reserve_home(&call).await? {
            HomeStep::Done(outcome) => Ok(outcome),
            HomeStep::Spill { hold_id, qty } => self.spill(&call, &hold_id, qty).await,
        }
    }

    /// Step 1: reserve.lua on the home shard.
    pub async fn reserve_home(&self, call: &ReserveCall<'_>) -> Result<HomeStep, RedisError> {
        let cfg = &call.sale.config;
        let hk = call.home_keys();
        let new_id = ReservationId::new_id(&cfg.id, call.home);
        let mut conn = self.conn.clone();
        let r: Vec<Value> = self
            .scripts
            .reserve
            .key(hk.all().as_slice())
            .key(hk.idem_at(&call.idem))
            .arg(call.account)
            .arg(call.qty)
            .arg(cfg.per_user_limit)
            .arg(call.hold_ms())
            .arg(&new_id)
            .arg(call.home)
            .arg(&cfg.id)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg(RECLAIM_BATCH)
            .arg(call.placement.reachable_from(call.home))
            .arg(&call.idem)
            .arg(call.position_arg())
            .arg(call.sku_limit.map(|l| l.to_string()).unwrap_or_default())
            .invoke_async(&mut conn)
            .await?;
        Ok(match int(r.first()) {
            1 => HomeStep::Done(Outcome::Held(held(&r, &cfg.id, false))),
            2 => HomeStep::Done(Outcome::Held(held(&r, &cfg.id, true))),
            // SPILL, or PENDING: a replay continues the first request's
            // spill with the first request's qty, as counted at home.
            3 | 4 => HomeStep::Spill {
                hold_id: text(r.get(1)),
                qty: int(r.get(2)),
            },
            5 => HomeStep::Done(Outcome::Limit {
                used: int(r.get(1)),
            }),
            6 => HomeStep::Done(Outcome::SoldOut),
            9 => HomeStep::Done(Outcome::KeyReused {
                first_qty: int(r.get(1)),
            }),
            11 => HomeStep::Done(Outcome::Revoked),
            10 => HomeStep::Done(Outcome::SkuLimit {
                used: int(r.get(1)),
            }),
            _ => HomeStep::Done(Outcome::Uninitialized),
        })
    }

    /// Steps 2–3: walks the SKU's other shards in a fixed order (`home+1,
    /// …`, skipping shards without the SKU) with take.lua, then records where
    /// the hold landed (quota_commit.lua) or gives the quota back
    /// (quota_return.lua) when every shard was empty.
    pub async fn spill(
        &self,
        call: &ReserveCall<'_>,
        hold_id: &str,
        qty: i64,
    ) -> Result<Outcome, RedisError> {
        let walk: Vec<usize> = call.placement.others(call.home).collect();
        for (i, &shard) in walk.iter().enumerate() {
            match self.take(call, hold_id, qty, shard).await? {
                Took::Held(hold) => {
                    self.commit_quota(call, hold_id, &hold, qty).await?;
                    self.retire_markers(call, hold_id, &walk[..=i]);
                    return Ok(Outcome::Held(hold));
                }
                Took::Empty => continue,
                Took::Gone => {
                    return Ok(Outcome::Gone {
                        reservation_id: hold_id.to_string(),
                    });
                }
                Took::Uninitialized => return Ok(Outcome::Uninitialized),
            }
        }
        self.return_quota(call, hold_id).await?;
        self.retire_markers(call, hold_id, &walk);
        Ok(Outcome::SoldOut)
    }

    /// A finished spill's decision markers on the `walked` shards live on for [`SPILL_MARKER_AFTER_SECS`], not for the day they
    /// were written with (issue 43 #9). They matter while the key's record
    /// says the spill is unfinished, which it no longer does (held: replays
    /// answer from it; returned: a retry spills anew under a new hold id),
    /// except to a replay already walking the shards, which takes seconds.
    /// Near sell-out every attempt spills over every shard, and day-long
    /// markers grew with attempts × shards. Sent after the answer, one
    /// command per shard (each marker is in its own shard's slot); a spill
    /// that never finishes (a crash) keeps its markers for the day, as its
    /// pending record may be replayed that long.
    fn retire_markers(&self, call: &ReserveCall<'_>, hold_id: &str, walked: &[usize]) {
        let markers: Vec<String> = walked
            .iter()
            .map(|&shard| call.sale.shards[shard].spill_marker(hold_id))
            .collect();
        if markers.is_empty() {
            return;
        }
        let mut conn = self.conn.clone();
        tokio::spawn(async move {
            for marker in markers {
                let shortened: redis::RedisResult<i64> = redis::cmd("EXPIRE")
                    .arg(&marker)
                    .arg(SPILL_MARKER_AFTER_SECS)
                    .arg("LT")
                    .query_async(&mut conn)
                    .await;
                if let Err(e) = shortened {
                    tracing::debug!(error = %e, %marker, "spill marker keeps its day-long expiry");
                }
            }
        });
    }

    /// take.lua on `shard` for a spilled hold of `qty` units (the quota).
    pub async fn take(
        &self,
        call: &ReserveCall<'_>,
        hold_id: &str,
        qty: i64,
        shard: usize,
    ) -> Result<Took, RedisError> {
        let sk = &call.sale.shards[shard];
        let mut conn = self.conn.clone();
        let r: Vec<Value> = self
            .scripts
            .take
            .key(sk.all().as_slice())
            .key(sk.spill_marker(hold_id))
            .arg(call.account)
            .arg(qty)
            .arg(call.hold_ms())
            .arg(hold_id)
            .arg(shard)
            .arg(call.home)
            .arg(&call.sale.config.id)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg(RECLAIM_BATCH)
            .arg(&call.idem)
            .arg(call.position_arg())
            .invoke_async(&mut conn)
            .await?;
        Ok(match int(r.first()) {
            1 => Took::Held(held(&r, &call.sale.config.id, false)),
            6 => Took::Empty,
            8 => Took::Gone,
            _ => Took::Uninitialized,
        })
    }

    /// quota_commit.lua: on the home shard, where the spilled hold landed.
    pub async fn commit_quota(
        &self,
        call: &ReserveCall<'_>,
        hold_id: &str,
        hold: &Hold,
        requested: i64,
    ) -> Result<(), RedisError> {
        let hk = call.home_keys();
        let mut conn = self.conn.clone();
        let _: i64 = self
            .scripts
            .quota_commit
            .key(&hk.users)
            .key(&hk.quota)
            .key(hk.idem_at(&call.idem))
            .arg(call.account)
            .arg(hold_id)
            .arg(hold.qty)
            .arg(hold.shard)
            .arg(hold.expires_ms)
            .arg(IDEMPOTENCY_TTL_SECS)
            .arg(requested)
            .arg(call.position_arg())
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// quota_return.lua: every shard was empty; the quota goes back.
    pub async fn return_quota(
        &self,
        call: &ReserveCall<'_>,
        hold_id: &str,
    ) -> Result<(), RedisError> {
        let hk = call.home_keys();
        let mut conn = self.conn.clone();
        let _: i64 = self
            .scripts
            .quota_return
            .key(&hk.users)
            .key(&hk.quota)
            .key(hk.idem_at(&call.idem))
            .arg(hold_id)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// quota_return.lua without a key record: gives back the quota the
    /// `home` shard counted for spilled hold `hold_id` (at most once per
    /// hold id); whether there was any to give back.
    pub async fn give_back_quota(
        &self,
        home: &ShardKeys,
        hold_id: &str,
    ) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        let returned: i64 = self
            .scripts
            .quota_return
            .key(&home.users)
            .key(&home.quota)
            .arg(hold_id)
            .invoke_async(&mut conn)
            .await?;
        Ok(returned == 1)
    }

    /// Finds a live hold in Redis: its shard and record. A spilled hold is
    /// found through its home shard's quota record, which says where it
    /// landed; when the process that spilled it stopped before recording
    /// that (quota_commit), every other shard is asked, so a crash never
    /// hides a hold from cancel, purchase or the webhook.
    pub async fn find_hold(
        &self,
        sale: &Sale,
        id: &str,
        home: usize,
    ) -> Result<Option<(usize, HoldRecord)>, RedisError> {
        use redis::AsyncCommands;
        let Some(hk) = sale.shards.get(home) else {
            return Ok(None);
        };
        let mut conn = self.conn.clone();
        let raw: Option<String> = conn.hget(&hk.holds, id).await?;
        if let Some(raw) = raw {
            return Ok(HoldRecord::parse(&raw).map(|r| (home, r)));
        }
        let quota: Option<String> = conn.hget(&hk.quota, id).await?;
        let Some(quota) = quota.and_then(|q| serde_json::from_str::<QuotaRecord>(&q).ok()) else {
            return Ok(None);
        };
        let candidates: Vec<usize> = match quota.s {
            Some(shard) => vec![shard],
            None => (1..sale.shards.len())
                .map(|step| (home + step) % sale.shards.len())
                .collect(),
        };
        for shard in candidates {
            let Some(sk) = sale.shards.get(shard) else {
                continue;
            };
            let raw: Option<String> = conn.hget(&sk.holds, id).await?;
            if let Some(r) = raw.and_then(|r| HoldRecord::parse(&r)) {
                return Ok(Some((shard, r)));
            }
        }
        Ok(None)
    }

    /// Gives a hold's units back (`reason`: cancelled | rejected | expired).
    pub async fn release(
        &self,
        keys: &ShardKeys,
        shard: usize,
        id: &str,
        reason: &str,
    ) -> Result<Released, RedisError> {
        let mut conn = self.conn.clone();
        let r: Vec<Value> = self
            .scripts
            .release
            .key(keys.all().as_slice())
            .arg(id)
            .arg(reason)
            .arg(shard)
            .arg("0")
            .invoke_async(&mut conn)
            .await?;
        Ok(match int(r.first()) {
            1 => Released::Now { qty: int(r.get(1)) },
            2 => Released::Paid,
            _ => Released::NotHeld,
        })
    }

    /// Whether any of `shards` of `sale` has lost its keys (Redis lost
    /// data; the cold rebuild restores it). A hold not found there may still
    /// exist in Postgres: no verdict about it until the rebuild.
    pub async fn any_lost(&self, sale: &Sale, shards: &[usize]) -> Result<bool, RedisError> {
        let mut conn = self.conn.clone();
        for k in shards.iter().filter_map(|&i| sale.shards.get(i)) {
            let exists: bool = redis::cmd("EXISTS")
                .arg(&k.stock)
                .query_async(&mut conn)
                .await?;
            if !exists {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether (account, Idempotency-Key) has a record on the account's
    /// home shard, i.e. the key was used: one GET, no script (the sold-out
    /// path asks it before answering 410, so a replay gets its first answer).
    pub async fn key_recorded(
        &self,
        sale: &Sale,
        account: &str,
        idempotency_key: &str,
    ) -> Result<bool, RedisError> {
        let home = &sale.shards[home_shard(account, sale.shards.len())];
        let mut conn = self.conn.clone();
        let record: Option<Vec<u8>> = redis::cmd("GET")
            .arg(home.idem(account, idempotency_key))
            .query_async(&mut conn)
            .await?;
        Ok(record.is_some())
    }

    /// Whether the sale's shards can still sell: some shard has stock or
    /// reclaimable (expired) holds, none has, or none has and a shard lost
    /// its keys (Redis lost data; a missing stock key is not an empty one,
    /// issue 43 #7: it read as sold out, 410, until the rebuild).
    ///
    /// `sku`: the SKU at that position only; `None`: any SKU of the sale
    /// (the sale is sold out only when every SKU is). Read by
    /// [`SkuStock::read`]: a call or two per shard, not per SKU. Expired
    /// holds count for every SKU of their shard (the index is per shard): a
    /// SKU may read as selling until a reservation reclaims them, never the
    /// other way round.
    pub async fn stock_state(
        &self,
        sale: &Sale,
        sku: Option<i32>,
    ) -> Result<StockState, RedisError> {
        let stock = SkuStock::read(&self.conn, sale).await?;
        let any = match sku {
            Some(p) => usize::try_from(p).is_ok_and(|p| stock.selling(p)),
            None => (0..stock.available.len()).any(|p| stock.selling(p)),
        };
        Ok(if any {
            StockState::Selling
        } else if stock.lost {
            StockState::Lost
        } else {
            StockState::Empty
        })
    }
}

/// Each SKU's units in Redis ([`SkuStock::read`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkuStock {
    /// By position: the units on the stock keys of the SKU's shards.
    pub available: Vec<i64>,
    /// By position: whether one of the SKU's shards has expired holds a
    /// reservation would reclaim (units about to be back on sale).
    pub expiring: Vec<bool>,
    /// A stock key is gone (Redis lost data): the figures are not the truth
    /// until the rebuild.
    pub lost: bool,
}

impl SkuStock {
    /// Every SKU's units in Redis: one MGET (every stock key placed on the
    /// shard, one slot) and one ZCOUNT (expired holds) per shard, however
    /// many SKUs. Only reads, so any connection will do (the CLI's too).
    pub async fn read(conn: &RedisConn, sale: &Sale) -> Result<SkuStock, RedisError> {
        let mut conn = conn.clone();
        // Redis's clock, as the scripts that expire holds use it.
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let now = secs * 1000 + micros / 1000;
        let n = sale.placements.len();
        let mut out = SkuStock {
            available: vec![0; n],
            expiring: vec![false; n],
            lost: false,
        };
        for (i, k) in sale.shards.iter().enumerate() {
            let here: Vec<usize> = (0..n).filter(|p| sale.placements[*p].holds(i)).collect();
            let mut mget = redis::cmd("MGET");
            mget.arg(&k.stock);
            for p in &here {
                mget.arg(k.stock_of(*p as i32));
            }
            let stocks: Vec<Option<i64>> = mget.query_async(&mut conn).await?;
            out.lost |= stocks.iter().any(Option::is_none);
            let expired: i64 = redis::cmd("ZCOUNT")
                .arg(&k.exp)
                .arg("-inf")
                .arg(now)
                .query_async(&mut conn)
                .await?;
            for (p, stock) in here.iter().zip(&stocks[1..]) {
                out.available[*p] += stock.unwrap_or(0).max(0);
                out.expiring[*p] |= expired > 0;
            }
        }
        Ok(out)
    }

    /// Whether the SKU at `position` can still sell: units on its keys, or
    /// expired holds on its shards that a reservation would reclaim.
    pub fn selling(&self, position: usize) -> bool {
        self.available.get(position).is_some_and(|a| *a > 0)
            || self.expiring.get(position).copied().unwrap_or(false)
    }

    /// Whether the SKU at `position` is known to be sold out: not selling,
    /// and no stock key lost (a lost key is not an empty one).
    pub fn sold_out(&self, position: usize) -> bool {
        !self.lost && !self.selling(position)
    }
}

/// What [`Engine::stock_state`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockState {
    /// Some shard has stock or expired holds to reclaim.
    Selling,
    /// Every shard is empty: sold out.
    Empty,
    /// No shard that has its keys can sell, and some shard lost them: not
    /// known until the rebuild.
    Lost,
}

/// What `release` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    Now { qty: i64 },
    NotHeld,
    Paid,
}

/// A hold as stored in Redis (`lua/_lib.lua`).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct HoldRecord {
    #[serde(rename = "a")]
    pub account: String,
    #[serde(rename = "q")]
    pub qty: i64,
    #[serde(rename = "e")]
    pub expires_ms: u64,
    #[serde(rename = "h")]
    pub home: usize,
    #[serde(rename = "c")]
    pub created_ms: u64,
    #[serde(rename = "s")]
    pub status: String,
    /// The Idempotency-Key's hash (holds granted before it was kept: none).
    #[serde(rename = "k", default)]
    pub idem: Option<String>,
    /// The qty the request asked for (a partial fill holds less).
    #[serde(rename = "r", default)]
    pub requested: Option<i64>,
    /// Its SKU's position, in a sale of several SKUs (none in a one-SKU
    /// sale).
    #[serde(rename = "p", default)]
    pub position: Option<i64>,
}

impl HoldRecord {
    pub fn parse(raw: &str) -> Option<Self> {
        serde_json::from_str(raw).ok()
    }
}

#[derive(Debug, serde::Deserialize)]
struct QuotaRecord {
    #[serde(default)]
    s: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_shard_is_stable_and_spread() {
        assert_eq!(home_shard("alice", 4), home_shard("alice", 4));
        let mut counts = [0usize; 4];
        for i in 0..4000 {
            counts[home_shard(&format!("acct-{i}"), 4)] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }

    #[test]
    fn reservation_ids_round_trip() {
        let id = ReservationId::new_id("drop-1", 3);
        assert_eq!(
            ReservationId::parse(&id),
            Some(ReservationId {
                sale: "drop-1",
                home: 3
            })
        );
        for bad in [
            "",
            "x",
            "drop.1",
            "drop.x.0123",
            "Drop.1.0193a0b0c0d0e0f00112233445566778",
            "a.1.2.3",
        ] {
            assert_eq!(ReservationId::parse(bad), None, "{bad}");
        }
    }
}
