//! The `QueueShard` Durable Object (Wasm only): one of a sale's
//! `queue_shards` objects, holding the entries of the accounts that map to
//! it (`shards::shard_of`). SQLite storage.
//!
//! Role: the only writer of its entries. A join writes here and nowhere
//! else. At `starts_at` an alarm chain draws this shard's pre-queue in
//! bounded steps (`shard_draw`), then tells the coordinator its index; after
//! the start the same chain reports each finished second's arrivals to the
//! coordinator, at most once a second.
//!
//! Invariants kept here:
//! - one entry per account (`sub` is the primary key); a repeated join
//!   returns the stored ticket;
//! - an entry is in the pre-queue iff its arrival stamp (the Worker's, when
//!   believable: `status::arrival_ms`) is before `starts_at` and the draw has
//!   not begun (it begins `DRAW_GRACE_MS` after the start); stamps never
//!   decrease and never fall in a second already reported
//!   (`places::Stamper`);
//! - the draw runs only in the alarm, one bounded step per alarm, its state
//!   stored after each step (an evicted object resumes); no request runs
//!   it, and no request waits longer than one step;
//! - buckets never change once written; the seed is only asked of the
//!   coordinator once the start has come;
//! - admitted people's turns (issue 13 #4): when each was last seen (a
//!   status poll while admitted, told by the Worker) and whether they made
//!   a reservation, reported to the coordinator with the next second's
//!   arrivals; a person whose turn was abandoned joins again at the back
//!   (a new arrival stamp and `seq`) once, never twice for one turn.

use std::cell::Cell;

use serde::Deserialize;
use serde_json::{Value, json};
use token::{Claims, TicketData, TokenType};
use worker::{
    DurableObject, Env, Method, Request, Response, Result, SqlStorage, State, durable_object,
};

use crate::api::error::ApiError;
use crate::api::error::ApiResult;
use crate::api::routes;
use crate::botcheck::join::Refusal;
use crate::draw::hash;
use crate::draw::steps::{self, DrawState, DrawStore, Limits};
use crate::http::keys::ring;
use crate::http::respond::{now_ms, query};
use crate::objects::call::{Meta, TurnRow, call_object, respond, sql_err};
use crate::queue::places::{SecondReport, Stamper};
use crate::queue::shards;
use crate::queue::status::{self, TICKET_TTL_SECS};

/// Joins loaded by one bulk call at most (DEV_MODE hook): the edge's own check.
use crate::api::bodies::BULK_MAX;
use crate::draw::phases::DRAW_GRACE_MS;
/// After the end, arrivals are reported for this long, then the chain stops.
const REPORT_AFTER_END_MS: u64 = 10_000;

#[durable_object]
pub struct QueueShard {
    state: State,
    env: Env,
    meta: Meta,
    stamper: Cell<Stamper>,
    /// Requests served since the object started (reported, for the
    /// benchmark of object calls per poll).
    requests: Cell<u64>,
    /// When the next alarm is known to be due (memory only).
    alarm_at: Cell<Option<u64>>,
}

#[derive(Deserialize)]
struct EntryRow {
    seq: f64,
    ticket: Option<String>,
    ticket_exp: Option<f64>,
    prequeue: f64,
    t_ms: f64,
    salt: Option<String>,
}

#[derive(Deserialize)]
struct SeqLeaf {
    seq: f64,
    leaf: String,
}

#[derive(Deserialize)]
struct LeafRow {
    leaf: String,
}

#[derive(Deserialize)]
struct RankedRow {
    value: String,
    leaf: String,
}

#[derive(Deserialize)]
struct RankedBucketRow {
    vals: String,
    leaves: Option<String>,
}

#[derive(Deserialize)]
struct BucketRow {
    vals: String,
}

#[derive(Deserialize)]
struct StampRow {
    t_ms: f64,
    seq: f64,
}

#[derive(Deserialize)]
struct JoinBody {
    sub: String,
    shard: u32,
    shards: u32,
    starts_at_ms: u64,
    ends_at_ms: Option<u64>,
    /// When the join reached the edge (believed within bounds).
    #[serde(default)]
    arrival_ms: Option<u64>,
    /// Join again at the back: the `seq` of the entry whose turn was
    /// abandoned (the Worker checked it against the coordinator's list).
    #[serde(default)]
    again_seq: Option<u64>,
    /// The issue stamp of the proof-of-work challenge the Worker verified
    /// for this join (bot-checked sales only).
    #[serde(default)]
    bot_iat_ms: Option<u64>,
}

#[derive(Deserialize)]
struct TurnBody {
    sub: String,
}

#[derive(Deserialize)]
struct SeenBody {
    /// `(sub, place, ms)` of admitted people seen polling, and when.
    seen: Vec<(String, u64, u64)>,
}

#[derive(Deserialize)]
struct IatRow {
    iat_ms: f64,
}

#[derive(Deserialize)]
struct BulkBody {
    prefix: String,
    from: u64,
    to: u64,
    shard: u32,
    shards: u32,
    starts_at_ms: u64,
}

/// The shard's SQLite as the draw's store.
struct SqlDraw<'a>(&'a SqlStorage);

impl DrawStore for SqlDraw<'_> {
    type Error = ApiError;

    /// Entrants by their leaf (draw v2: the value is `SHA-256(key ‖ leaf)`).
    fn entrants_after(&mut self, after_seq: u64, limit: usize) -> ApiResult<Vec<(u64, String)>> {
        Ok(self
            .0
            .exec(
                "SELECT seq, leaf FROM entries WHERE prequeue = 1 AND leaf IS NOT NULL AND seq > ?
             ORDER BY seq LIMIT ?",
                Some(vec![(after_seq as f64).into(), (limit as f64).into()]),
            )
            .map_err(sql_err)?
            .to_array::<SeqLeaf>()
            .map_err(sql_err)?
            .into_iter()
            .map(|r| (r.seq as u64, r.leaf))
            .collect())
    }

    /// One statement a run, whatever its length (the items travel as one
    /// JSON text): the rows are appended in `(r, i)` order.
    fn put_run(&mut self, run: u64, items: &[steps::Item]) -> ApiResult<()> {
        self.0
            .exec(
                "DELETE FROM runs WHERE r = ?",
                Some(vec![(run as f64).into()]),
            )
            .map_err(sql_err)?;
        let json = serde_json::to_string(items).unwrap_or_default();
        self.0
            .exec(
                "INSERT INTO runs (r, i, value, leaf)
                 SELECT ?, CAST(j.key AS INTEGER), json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]')
                 FROM json_each(?) AS j",
                Some(vec![(run as f64).into(), json.as_str().into()]),
            )
            .map_err(sql_err)?;
        Ok(())
    }

    fn run_items(&mut self, run: u64, from: u64, limit: usize) -> ApiResult<Vec<steps::Item>> {
        Ok(self
            .0
            .exec(
                "SELECT value, leaf FROM runs WHERE r = ? AND i >= ? ORDER BY i LIMIT ?",
                Some(vec![
                    (run as f64).into(),
                    (from as f64).into(),
                    (limit as f64).into(),
                ]),
            )
            .map_err(sql_err)?
            .to_array::<RankedRow>()
            .map_err(sql_err)?
            .into_iter()
            .map(|r| (r.value, r.leaf))
            .collect())
    }

    /// A bucket keeps its values (what isolates fetch to place people) and
    /// their leaves beside them (what the coordinator's listing reads).
    fn put_bucket(&mut self, index: u64, items: &[steps::Item]) -> ApiResult<()> {
        let vals: Vec<&str> = items.iter().map(|(v, _)| v.as_str()).collect();
        let leaves: Vec<&str> = items.iter().map(|(_, l)| l.as_str()).collect();
        let last = vals.last().copied().unwrap_or_default();
        self.0
            .exec(
                "INSERT OR REPLACE INTO buckets (j, vals, leaves, last) VALUES (?, ?, ?, ?)",
                Some(vec![
                    (index as f64).into(),
                    serde_json::to_string(&vals).unwrap_or_default().into(),
                    serde_json::to_string(&leaves).unwrap_or_default().into(),
                    last.into(),
                ]),
            )
            .map_err(sql_err)?;
        Ok(())
    }
}

/// A fresh 16-byte draw salt (hex) from the CSPRNG.
fn new_salt() -> (String, [u8; 16]) {
    let mut salt = [0u8; 16];
    if getrandom::fill(&mut salt).is_err() {
        // workerd always has crypto.getRandomValues; were it ever missing,
        // a salt from the clock still hides a guessable account's leaf from
        // anyone who cannot guess the millisecond, and costs no join.
        salt[..8].copy_from_slice(&now_ms().to_le_bytes());
    }
    (hex::encode(salt), salt)
}

/// A fresh salt and the leaf it gives `sub` (both hex).
fn new_salt_for(sub: &str) -> (String, String) {
    let (hex_salt, salt) = new_salt();
    (hex_salt, hash::leaf_hex(sub, &salt))
}

/// A synthetic entrant's salt (DEV_MODE bulk hook only):
/// `SHA-256("fs-bulk-salt:" ‖ sale ‖ ":" ‖ account)[..16]`, so a test or
/// benchmark can forge the tickets of entrants it never joined and
/// recompute the whole draw from the published seed. Real joins get CSPRNG
/// salts.
fn bulk_salt_for(sale: &str, sub: &str) -> (String, String) {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(format!("fs-bulk-salt:{sale}:{sub}").as_bytes());
    let mut salt = [0u8; 16];
    salt.copy_from_slice(&h[..16]);
    (hex::encode(salt), hash::leaf_hex(sub, &salt))
}

/// Leaves or ranked entries a page of `/leaves` or `/ranked` holds at most.
const PAGE_MAX: usize = 2_048;

impl QueueShard {
    fn sql(&self) -> SqlStorage {
        self.state.storage().sql()
    }

    fn set(&self, k: &str, v: impl ToString) -> ApiResult<()> {
        self.meta.set(&self.sql(), k, v)
    }

    fn init(&self) -> ApiResult<()> {
        let sql = self.sql();
        self.meta.load(&sql)?;
        for q in [
            "CREATE TABLE IF NOT EXISTS entries (
                sub TEXT PRIMARY KEY,
                seq INTEGER NOT NULL UNIQUE,
                t_ms INTEGER NOT NULL,
                prequeue INTEGER NOT NULL,
                value TEXT,
                ticket TEXT,
                ticket_exp INTEGER,
                salt TEXT,
                leaf TEXT)",
            "CREATE INDEX IF NOT EXISTS entries_leaf ON entries (leaf) WHERE prequeue = 1",
            "CREATE INDEX IF NOT EXISTS entries_arrival ON entries (t_ms) WHERE prequeue = 0",
            // The draw's sorted runs, then its buckets (shard_draw): append-only.
            "CREATE TABLE IF NOT EXISTS runs (
                r INTEGER NOT NULL,
                i INTEGER NOT NULL,
                value TEXT NOT NULL,
                leaf TEXT NOT NULL,
                PRIMARY KEY (r, i)) WITHOUT ROWID",
            "CREATE TABLE IF NOT EXISTS buckets (
                j INTEGER PRIMARY KEY,
                vals TEXT NOT NULL,
                leaves TEXT,
                last TEXT)",
            "CREATE TABLE IF NOT EXISTS turns (
                sub TEXT PRIMARY KEY,
                place INTEGER NOT NULL,
                seen_ms INTEGER NOT NULL,
                held INTEGER NOT NULL DEFAULT 0,
                reported INTEGER NOT NULL DEFAULT 0)",
            // Per account, the issue stamp of the newest challenge it
            // joined with (see `spend_challenge`).
            "CREATE TABLE IF NOT EXISTS challenges (sub TEXT PRIMARY KEY, iat_ms INTEGER NOT NULL)",
        ] {
            sql.exec(q, None).map_err(sql_err)?;
        }
        // Objects created before the draw v2 (salts): the columns are added
        // (an error here means they are there already).
        for q in [
            "ALTER TABLE entries ADD COLUMN salt TEXT",
            "ALTER TABLE entries ADD COLUMN leaf TEXT",
            "ALTER TABLE buckets ADD COLUMN leaves TEXT",
            "ALTER TABLE buckets ADD COLUMN last TEXT",
        ] {
            let _ = sql.exec(q, None);
        }
        let floor = self.meta.u64("stamp_floor").unwrap_or(0);
        self.stamper.set(Stamper { floor_ms: floor });
        Ok(())
    }

    fn draw_state(&self) -> Option<DrawState> {
        self.meta
            .get("draw")
            .and_then(|s| serde_json::from_str(&s).ok())
    }

    fn draw_begun(&self) -> bool {
        self.draw_state().is_some()
    }

    /// Freezes the pre-queue (the draw has begun: later joins are placed
    /// after it), unless it is frozen already. No await before it in a
    /// request or alarm that reads the set.
    fn freeze(&self) -> ApiResult<()> {
        if self.draw_begun() {
            return Ok(());
        }
        self.set(
            "draw",
            serde_json::to_string(&DrawState::start()).unwrap_or_default(),
        )
    }

    /// Settings from the caller (the Worker read them from the origin's
    /// summary). The start is frozen once the draw has begun.
    fn configure(
        &self,
        sale: &str,
        shard: u32,
        shards: u32,
        starts: u64,
        ends: Option<u64>,
    ) -> ApiResult<()> {
        self.set("sale", sale)?;
        self.set("shard", shard)?;
        self.set("shards", shards)?;
        if !self.draw_begun() {
            self.set("starts_at_ms", starts)?;
        }
        match ends {
            Some(e) => self.set("ends_at_ms", e)?,
            None => self.meta.delete(&self.sql(), "ends_at_ms")?,
        }
        Ok(())
    }

    fn starts_at(&self) -> u64 {
        self.meta.u64("starts_at_ms").unwrap_or(u64::MAX)
    }

    fn mint(
        &self,
        sale: &str,
        sub: &str,
        seq: u64,
        t_ms: Option<u64>,
        salt: &str,
        now: u64,
    ) -> ApiResult<(String, u64)> {
        let ring = ring(&self.env, "ADMISSION_TOKEN_KEYS")?;
        let claims = Claims::new(
            TokenType::Ticket,
            sub,
            Some(sale.to_string()),
            now / 1000,
            TICKET_TTL_SECS,
        )
        .with_ticket(TicketData {
            seq,
            place: None,
            shard: self.meta.u64("shard").map(|s| s as u32),
            t_ms,
            salt: Some(salt.to_string()),
        });
        Ok((ring.sign(&claims), claims.exp))
    }

    /// Makes sure an alarm will come by `at` (one storage write when none
    /// is known to be due by then).
    async fn alarm_by(&self, at: u64) -> ApiResult<()> {
        if self.alarm_at.get().is_some_and(|a| a <= at) {
            return Ok(());
        }
        let storage = self.state.storage();
        let current = storage.get_alarm().await.map_err(sql_err)?;
        if let Some(c) = current.filter(|c| *c >= 0).map(|c| c as u64)
            && c <= at
        {
            self.alarm_at.set(Some(c));
            return Ok(());
        }
        let now = now_ms();
        storage
            .set_alarm(at.saturating_sub(now) as i64)
            .await
            .map_err(sql_err)?;
        self.alarm_at.set(Some(at));
        Ok(())
    }

    async fn join(&self, sale: &str, b: JoinBody) -> ApiResult<Value> {
        // The arrival is stamped before anything else (no await before it),
        // from the Worker's stamp when believable (`status::arrival_ms`).
        let now = now_ms();
        let sub = b.sub;
        if sub.is_empty() || sub.len() > 256 {
            return Err(ApiError::new(400, "bad_request", "sub missing"));
        }
        self.configure(sale, b.shard, b.shards, b.starts_at_ms, b.ends_at_ms)?;
        if let Some(iat) = b.bot_iat_ms {
            self.spend_challenge(&sub, iat)?;
        }
        let existing = self
            .sql()
            .exec(
                "SELECT seq, ticket, ticket_exp, prequeue, t_ms, salt FROM entries WHERE sub = ?",
                Some(vec![sub.as_str().into()]),
            )
            .map_err(sql_err)?
            .to_array::<EntryRow>()
            .map_err(sql_err)?
            .into_iter()
            .next();
        if let Some(row) = &existing
            && b.again_seq == Some(row.seq as u64)
        {
            // The abandoned turn is given up for a new arrival, now; the old
            // (t_ms, seq) stays in its reported second, so its place stays
            // taken and nobody else's place moves.
            let mut stamper = self.stamper.get();
            let t = stamper.stamp(status::arrival_ms(now, b.arrival_ms).max(self.starts_at()));
            self.stamper.set(stamper);
            let seq = self.meta.u64("next_seq").unwrap_or(1);
            let salt = row.salt.clone().unwrap_or_else(|| new_salt().0);
            let (ticket, exp) = self.mint(sale, &sub, seq, Some(t), &salt, now)?;
            self.sql()
                .exec(
                    "UPDATE entries SET seq = ?, t_ms = ?, prequeue = 0, ticket = ?, ticket_exp = ?
                     WHERE sub = ?",
                    Some(vec![
                        (seq as f64).into(),
                        (t as f64).into(),
                        ticket.as_str().into(),
                        (exp as f64).into(),
                        sub.as_str().into(),
                    ]),
                )
                .map_err(sql_err)?;
            self.sql()
                .exec(
                    "DELETE FROM turns WHERE sub = ?",
                    Some(vec![sub.as_str().into()]),
                )
                .map_err(sql_err)?;
            self.set("next_seq", seq + 1)?;
            self.alarm_by(now - now % 1000 + 1_100).await?;
            return Ok(json!({"ticket": ticket, "prequeue": false}));
        }
        if let Some(row) = existing {
            let pre = row.prequeue as u64 == 1;
            if let (Some(t), Some(exp)) = (&row.ticket, row.ticket_exp)
                && (exp as u64) > now / 1000 + 3600
            {
                return Ok(json!({"ticket": t, "prequeue": pre}));
            }
            // Bulk-loaded entries have no ticket yet; old ones are renewed.
            let t_ms = (!pre).then_some(row.t_ms as u64);
            let (salt, leaf) = match &row.salt {
                Some(s) => (s.clone(), None),
                // An entry written before salts (v1): its leaf is written
                // with its salt, unless the set is frozen already.
                None => {
                    let (s, l) = new_salt_for(&sub);
                    (s, (!self.draw_begun()).then_some(l))
                }
            };
            let (t, exp) = self.mint(sale, &sub, row.seq as u64, t_ms, &salt, now)?;
            self.sql()
                .exec(
                    "UPDATE entries SET ticket = ?, ticket_exp = ?, salt = ?,
                         leaf = COALESCE(leaf, ?) WHERE sub = ?",
                    Some(vec![
                        t.as_str().into(),
                        (exp as f64).into(),
                        salt.as_str().into(),
                        // NULL, not '', when the set is frozen: the entry
                        // stays out of the draw it was not frozen into.
                        leaf.as_deref().into(),
                        sub.as_str().into(),
                    ]),
                )
                .map_err(sql_err)?;
            return Ok(json!({"ticket": t, "prequeue": pre}));
        }
        let mut stamper = self.stamper.get();
        let t = stamper.stamp(status::arrival_ms(now, b.arrival_ms));
        self.stamper.set(stamper);
        let starts = self.starts_at();
        let pre = t < starts && !self.draw_begun();
        let seq = self.meta.u64("next_seq").unwrap_or(1);
        let (salt, leaf) = new_salt_for(&sub);
        let (ticket, exp) = self.mint(sale, &sub, seq, (!pre).then_some(t), &salt, now)?;
        self.sql()
            .exec(
                "INSERT INTO entries (sub, seq, t_ms, prequeue, ticket, ticket_exp, salt, leaf)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                Some(vec![
                    sub.as_str().into(),
                    (seq as f64).into(),
                    (t as f64).into(),
                    i64::from(pre).into(),
                    ticket.as_str().into(),
                    (exp as f64).into(),
                    salt.as_str().into(),
                    leaf.as_str().into(),
                ]),
            )
            .map_err(sql_err)?;
        self.set("next_seq", seq + 1)?;
        if pre {
            self.set("prequeue", self.meta.u64("prequeue").unwrap_or(0) + 1)?;
            // Counts reach the coordinator within a second; the draw at the start.
            self.alarm_by(starts.min(now + 1_000)).await?;
        } else {
            self.alarm_by(now - now % 1000 + 1_100).await?;
        }
        Ok(json!({"ticket": ticket, "prequeue": pre}))
    }

    /// Spends a proof-of-work challenge of `sub` issued at `iat_ms` (the
    /// Worker verified it): refused as `challenge_reused` unless newer than
    /// the last one this account joined with. A challenge names its account
    /// and every account lives on one shard, so one stamp per account here
    /// remembers all its used challenges, for as long as the entry lives;
    /// the cost is one indexed read and one row write per bot-checked join,
    /// in the request that writes the entry anyway. (A challenge issued
    /// earlier than one already used is refused too: the page fetches a
    /// fresh one for every join.)
    fn spend_challenge(&self, sub: &str, iat_ms: u64) -> ApiResult<()> {
        let sql = self.sql();
        let last = sql
            .exec(
                "SELECT iat_ms FROM challenges WHERE sub = ?",
                Some(vec![sub.into()]),
            )
            .map_err(sql_err)?
            .to_array::<IatRow>()
            .map_err(sql_err)?
            .into_iter()
            .next();
        if last.is_some_and(|r| r.iat_ms as u64 >= iat_ms) {
            return Err(Refusal::Reused.error());
        }
        sql.exec(
            "INSERT OR REPLACE INTO challenges (sub, iat_ms) VALUES (?, ?)",
            Some(vec![sub.into(), (iat_ms as f64).into()]),
        )
        .map_err(sql_err)?;
        Ok(())
    }

    /// DEV_MODE hook (the Worker checks the mode): synthetic pre-queue
    /// entrants `prefix-i` for `i` in `from..to` that map to this shard.
    async fn bulk(&self, sale: &str, b: BulkBody) -> ApiResult<Value> {
        let now = now_ms();
        if b.to < b.from || b.to - b.from > BULK_MAX || !routes::valid_id(&b.prefix) {
            return Err(ApiError::new(
                400,
                "bad_request",
                format!("need a valid prefix and at most {BULK_MAX} entrants per call"),
            ));
        }
        self.configure(sale, b.shard, b.shards, b.starts_at_ms, None)?;
        if now >= self.starts_at() || self.draw_begun() {
            return Err(ApiError::new(
                409,
                "queue_started",
                "the pre-queue is closed",
            ));
        }
        let mut seq = self.meta.u64("next_seq").unwrap_or(1);
        let mut added = 0u64;
        let sql = self.sql();
        for i in b.from..b.to {
            let sub = format!("{}-{i}", b.prefix);
            if shards::shard_of(&sub, b.shards) != b.shard {
                continue;
            }
            let (salt, leaf) = bulk_salt_for(sale, &sub);
            let changed = sql
                .exec(
                    "INSERT OR IGNORE INTO entries (sub, seq, t_ms, prequeue, salt, leaf)
                     VALUES (?, ?, ?, 1, ?, ?)",
                    Some(vec![
                        sub.as_str().into(),
                        (seq as f64).into(),
                        (now as f64).into(),
                        salt.as_str().into(),
                        leaf.as_str().into(),
                    ]),
                )
                .map_err(sql_err)?
                .rows_written();
            if changed > 0 {
                seq += 1;
                added += 1;
            }
        }
        self.set("next_seq", seq)?;
        self.set("prequeue", self.meta.u64("prequeue").unwrap_or(0) + added)?;
        self.alarm_by(self.starts_at().min(now + 1_000)).await?;
        Ok(json!({"added": added, "prequeue": self.meta.u64("prequeue")}))
    }

    fn bucket(&self, url: &worker::Url) -> ApiResult<Value> {
        let Some(DrawState::Done { buckets, .. }) = self.draw_state() else {
            return Err(ApiError::new(409, "not_drawn", "not drawn yet"));
        };
        let j = query(url, "j")
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|j| *j < buckets)
            .ok_or_else(|| ApiError::new(400, "bad_request", "bucket index out of range"))?;
        let row = self
            .sql()
            .exec(
                "SELECT vals FROM buckets WHERE j = ?",
                Some(vec![(j as f64).into()]),
            )
            .map_err(sql_err)?
            .to_array::<BucketRow>()
            .map_err(sql_err)?
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::new(500, "queue_storage", "bucket missing"))?;
        let values: Value = serde_json::from_str(&row.vals).unwrap_or(Value::Null);
        Ok(json!({"shard": self.meta.u64("shard"), "bucket": j, "values": values}))
    }

    /// The page size and cursor of a `/leaves` or `/ranked` request.
    fn page_of(url: &worker::Url) -> ApiResult<(String, usize)> {
        let after = query(url, "after").unwrap_or_default();
        if !after.is_empty() && (after.len() > 128 || !after.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(ApiError::new(400, "bad_request", "after must be hex"));
        }
        let limit = query(url, "limit")
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|l| (1..=PAGE_MAX).contains(l))
            .ok_or_else(|| ApiError::new(400, "bad_request", "limit out of range"))?;
        Ok((after, limit))
    }

    /// The frozen pre-queue's leaves after `after`, ascending (the
    /// coordinator's freeze). Answered only once the set is frozen: a page
    /// read before could miss a join still coming. A request after the
    /// freeze time freezes the set itself (the alarm may be late).
    fn leaves(&self, url: &worker::Url) -> ApiResult<Value> {
        let (after, limit) = Self::page_of(url)?;
        if !self.draw_begun() && now_ms() < self.starts_at().saturating_add(DRAW_GRACE_MS) {
            return Err(ApiError::new(
                409,
                "not_frozen",
                "the entrant set is not frozen yet",
            ));
        }
        self.freeze()?;
        let leaves: Vec<String> = self
            .sql()
            .exec(
                "SELECT leaf FROM entries WHERE prequeue = 1 AND leaf > ? ORDER BY leaf LIMIT ?",
                Some(vec![after.as_str().into(), (limit as f64).into()]),
            )
            .map_err(sql_err)?
            .to_array::<LeafRow>()
            .map_err(sql_err)?
            .into_iter()
            .map(|r| r.leaf)
            .collect();
        Ok(json!({"leaves": leaves}))
    }

    /// The drawn pre-queue's `value ‖ leaf` after `after` (a value), by value
    /// (the coordinator's listing), read from the buckets, which hold both.
    /// Only once this shard's draw is done.
    fn ranked(&self, url: &worker::Url) -> ApiResult<Value> {
        let (after, limit) = Self::page_of(url)?;
        if !matches!(self.draw_state(), Some(DrawState::Done { .. })) {
            return Err(ApiError::new(409, "not_drawn", "not drawn yet"));
        }
        // The buckets that can hold the page: from the one holding the
        // first value past `after`, as many as `limit` values can span.
        let rows = self
            .sql()
            .exec(
                "SELECT vals, leaves FROM buckets WHERE last > ? ORDER BY j LIMIT ?",
                Some(vec![
                    after.as_str().into(),
                    ((limit.div_ceil(crate::draw::index::BUCKET_SIZE) + 1) as f64).into(),
                ]),
            )
            .map_err(sql_err)?
            .to_array::<RankedBucketRow>()
            .map_err(sql_err)?;
        let mut items: Vec<String> = Vec::with_capacity(limit);
        for r in rows {
            let vals: Vec<String> = serde_json::from_str(&r.vals).unwrap_or_default();
            let leaves: Vec<String> = r
                .leaves
                .as_deref()
                .and_then(|l| serde_json::from_str(l).ok())
                .unwrap_or_default();
            if leaves.len() != vals.len() {
                return Err(ApiError::new(
                    500,
                    "queue_storage",
                    "a bucket without its leaves",
                ));
            }
            for (v, l) in vals.into_iter().zip(leaves) {
                if v.as_str() > after.as_str() && items.len() < limit {
                    items.push(format!("{v}{l}"));
                }
            }
        }
        Ok(json!({"items": items}))
    }

    async fn handle(&self, req: &mut Request) -> ApiResult<Value> {
        let sale = req
            .headers()
            .get("x-sale")
            .ok()
            .flatten()
            .filter(|s| routes::valid_id(s))
            .ok_or_else(|| ApiError::new(400, "bad_request", "x-sale missing"))?;
        let url = req.url().map_err(|_| ApiError::not_found())?;
        let bad = |_| ApiError::new(400, "bad_request", "bad body");
        // Isolates' calls (what the benchmark of object calls per poll
        // counts), not the coordinator's (pokes, the draw's page fetches).
        if !matches!(url.path(), "/poke" | "/leaves" | "/ranked") {
            self.requests.set(self.requests.get() + 1);
        }
        match (req.method(), url.path()) {
            (Method::Post, "/join") => {
                let b: JoinBody = req.json().await.map_err(bad)?;
                self.join(&sale, b).await
            }
            (Method::Post, "/bulk") => {
                let b: BulkBody = req.json().await.map_err(bad)?;
                self.bulk(&sale, b).await
            }
            (Method::Post, "/poke") => {
                // The coordinator wakes a shard nobody joined, so it draws
                // (nothing) and reports like the others.
                let b: JoinBody = req.json().await.map_err(bad)?;
                self.configure(&sale, b.shard, b.shards, b.starts_at_ms, b.ends_at_ms)?;
                self.alarm_by(now_ms()).await?;
                Ok(json!({"ok": true}))
            }
            (Method::Post, "/seen") => {
                // A batch of admitted people seen by one isolate.
                let b: SeenBody = req.json().await.map_err(bad)?;
                let now = now_ms();
                for (sub, place, at) in b.seen.iter().take(1_000) {
                    // When the poll was (never later than now).
                    let seen_ms = (*at).min(now);
                    self.sql()
                        .exec(
                            "INSERT INTO turns (sub, place, seen_ms) VALUES (?, ?, ?)
                             ON CONFLICT(sub) DO UPDATE SET place = excluded.place,
                                 seen_ms = MAX(seen_ms, excluded.seen_ms), reported = 0",
                            Some(vec![
                                sub.as_str().into(),
                                (*place as f64).into(),
                                (seen_ms as f64).into(),
                            ]),
                        )
                        .map_err(sql_err)?;
                }
                Ok(json!({"ok": true}))
            }
            (Method::Post, "/held") => {
                let b: TurnBody = req.json().await.map_err(bad)?;
                self.sql()
                    .exec(
                        "UPDATE turns SET held = 1, seen_ms = ?, reported = 0 WHERE sub = ?",
                        Some(vec![(now_ms() as f64).into(), b.sub.as_str().into()]),
                    )
                    .map_err(sql_err)?;
                Ok(json!({"ok": true}))
            }
            (Method::Get, "/bucket") => self.bucket(&url),
            (Method::Get, "/leaves") => self.leaves(&url),
            (Method::Get, "/ranked") => self.ranked(&url),
            (Method::Get, "/state") => Ok(json!({
                "draw": self.draw_state(),
                "prequeue": self.meta.u64("prequeue"),
                "entries": self.meta.u64("next_seq").unwrap_or(1) - 1,
            })),
            _ => Err(ApiError::not_found()),
        }
    }

    async fn coordinator(&self, method: Method, path: &str, body: &Value) -> ApiResult<Value> {
        let sale = self
            .meta
            .get("sale")
            .ok_or_else(|| ApiError::new(500, "queue_storage", "sale unknown"))?;
        // A GET carries no body (fetch refuses one).
        let body = (method != Method::Get).then_some(body);
        call_object(&self.env, "SALE_QUEUE", &sale, &sale, method, path, body).await
    }

    /// One step of the draw. Returns whether the draw is done.
    async fn draw_step(&self) -> ApiResult<bool> {
        let state = self.draw_state().unwrap_or_else(DrawState::start);
        if let DrawState::Done { .. } = state {
            return Ok(true);
        }
        // Freeze the entrant set before the first await.
        self.freeze()?;
        // The key needs the whole frozen set's root and the beacon: the
        // coordinator answers 409 until it has both.
        let key = match self.meta.get("key").and_then(|k| ::draw::from_hex(&k)) {
            Some(k) => k,
            None => {
                let v = self.coordinator(Method::Get, "/key", &json!({})).await?;
                let k = v["key"]
                    .as_str()
                    .and_then(::draw::from_hex)
                    .ok_or_else(|| ApiError::new(502, "queue_error", "no key"))?;
                self.set("key", ::draw::to_hex(&k))?;
                k
            }
        };
        let value = |leaf: &str| hash::value_hex(&key, leaf);
        let sql = self.sql();
        let next = steps::step(&state, &mut SqlDraw(&sql), &value, Limits::default())?;
        self.set("draw", serde_json::to_string(&next).unwrap_or_default())?;
        Ok(next.is_done())
    }

    /// Sends the shard's draw index to the coordinator (once).
    async fn send_index(&self) -> ApiResult<()> {
        if self.meta.flag("index_sent") {
            return Ok(());
        }
        let Some(DrawState::Done { count, .. }) = self.draw_state() else {
            return Ok(());
        };
        let rows = self
            .sql()
            .exec("SELECT vals FROM buckets ORDER BY j", None)
            .map_err(sql_err)?
            .to_array::<BucketRow>()
            .map_err(sql_err)?;
        let firsts: Vec<String> = rows
            .iter()
            .filter_map(|r| serde_json::from_str::<Vec<String>>(&r.vals).ok())
            .filter_map(|v| v.into_iter().next())
            .collect();
        let body = json!({
            "shard": self.meta.u64("shard"),
            "count": count,
            "firsts": firsts,
            "requests": self.requests.get(),
        });
        self.coordinator(Method::Post, "/drawn", &body).await?;
        self.set("index_sent", 1)
    }

    /// Reports counts (before the start) or every finished second's
    /// arrivals (after it) to the coordinator.
    async fn report(&self, now: u64) -> ApiResult<()> {
        let shard = self.meta.u64("shard").unwrap_or(0);
        let starts = self.starts_at();
        if now < starts {
            let body = json!({"shard": shard, "prequeue": self.meta.u64("prequeue").unwrap_or(0),
                              "requests": self.requests.get()});
            self.coordinator(Method::Post, "/report", &body).await?;
            return Ok(());
        }
        let until_ms = now - now % 1000;
        let from_ms = match self.meta.u64("reported_through") {
            Some(s) => (s + 1) * 1000,
            None => starts - starts % 1000,
        };
        if until_ms <= from_ms {
            return Ok(());
        }
        // Later stamps land in the unreported second (before the await).
        let mut stamper = self.stamper.get();
        stamper.reported_until(until_ms / 1000);
        self.stamper.set(stamper);
        self.set("stamp_floor", stamper.floor_ms)?;
        let rows = self
            .sql()
            .exec(
                "SELECT t_ms, seq FROM entries WHERE prequeue = 0 AND t_ms >= ? AND t_ms < ? ORDER BY t_ms, seq",
                Some(vec![(from_ms as f64).into(), (until_ms as f64).into()]),
            )
            .map_err(sql_err)?
            .to_array::<StampRow>()
            .map_err(sql_err)?;
        let mut seconds: Vec<SecondReport> = Vec::new();
        for r in rows {
            let (t, seq) = (r.t_ms as u64, r.seq as u64);
            match seconds.last_mut() {
                Some(s) if s.second == t / 1000 => s.stamps.push((t, seq)),
                _ => seconds.push(SecondReport {
                    shard: shard as u32,
                    second: t / 1000,
                    stamps: vec![(t, seq)],
                }),
            }
        }
        let through = until_ms / 1000 - 1;
        let turns: Vec<(u64, u64, bool)> = self
            .sql()
            .exec(
                "SELECT place, seen_ms, held FROM turns WHERE reported = 0 LIMIT 5000",
                None,
            )
            .map_err(sql_err)?
            .to_array::<TurnRow>()
            .map_err(sql_err)?
            .into_iter()
            .map(|r| (r.place as u64, r.seen_ms as u64, r.held as u64 == 1))
            .collect();
        let body = json!({"shard": shard, "through": through, "seconds": seconds,
                          "requests": self.requests.get(), "turns": turns});
        self.coordinator(Method::Post, "/report", &body).await?;
        // Seen again meanwhile (an await ago) is reported next time: only
        // rows unchanged since the read are marked.
        for (place, seen, _) in &turns {
            self.sql()
                .exec(
                    "UPDATE turns SET reported = 1 WHERE place = ? AND seen_ms = ?",
                    Some(vec![(*place as f64).into(), (*seen as f64).into()]),
                )
                .map_err(sql_err)?;
        }
        self.set("reported_through", through)
    }
}

impl DurableObject for QueueShard {
    fn new(state: State, env: Env) -> Self {
        let s = QueueShard {
            state,
            env,
            meta: Meta::default(),
            stamper: Cell::new(Stamper::default()),
            requests: Cell::new(0),
            alarm_at: Cell::new(None),
        };
        if let Err(e) = s.init() {
            worker::console_error!("queue shard init: {}", e.message);
        }
        s
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        respond(self.handle(&mut req).await)
    }

    async fn alarm(&self) -> Result<Response> {
        self.alarm_at.set(None);
        let now = now_ms();
        let starts = self.starts_at();
        let storage = self.state.storage();
        if now >= starts.saturating_add(DRAW_GRACE_MS) {
            match self.draw_step().await {
                Ok(false) => {
                    // Next step at once: requests queued meanwhile go first.
                    storage.set_alarm(0i64).await?;
                    self.alarm_at.set(Some(now));
                    return Response::ok("drawing");
                }
                Ok(true) => {
                    if let Err(e) = self.send_index().await {
                        worker::console_error!("shard index: {}", e.message);
                    }
                }
                // 409: the key is not known yet (freeze, beacon): next second.
                Err(e) if e.status == 409 => {}
                Err(e) => worker::console_error!("draw step: {}", e.message),
            }
        }
        let reported = self.report(now).await;
        if let Err(e) = &reported {
            worker::console_error!("shard report: {}", e.message);
        }
        let ends = self.meta.u64("ends_at_ms").unwrap_or(u64::MAX);
        let next = if now < starts {
            // Before the start joins re-arm (counts), a failed report is
            // tried again in a second, and the start always comes.
            Some(if reported.is_err() {
                starts.min(now + 1_000)
            } else {
                starts
            })
        } else if now < ends.saturating_add(REPORT_AFTER_END_MS) {
            Some(now - now % 1000 + 1_050)
        } else {
            None
        };
        // A join during this alarm's awaits may have asked for an earlier
        // alarm (its count must be reported): never push that one back.
        let asked = self.alarm_at.get();
        let next = match (next, asked) {
            (Some(n), Some(a)) => Some(n.min(a)),
            (n, a) => n.or(a),
        };
        if let Some(at) = next {
            storage.set_alarm(at.saturating_sub(now) as i64).await?;
            self.alarm_at.set(Some(at));
        }
        Response::ok("ok")
    }
}
