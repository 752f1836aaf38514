//! A queue shard's logic (plain Rust, host-tested): the entries of the
//! accounts that map to one of a sale's `QueueShard` objects
//! (`queue::shards::shard_of`), over the objects' SQL ([`Sql`]). The
//! object (`objects::queue_shard`) only reads requests, keeps the clock
//! and the alarm, and calls the coordinator; every decision is here.
//!
//! Role: the only writer of its entries. A join writes here and nowhere
//! else. At `starts_at` the object's alarm chain draws this shard's
//! pre-queue in bounded steps ([`Entries::draw_step`]), then tells the
//! coordinator its index ([`Entries::index_report`]); after the start the
//! same chain reports each finished second's arrivals
//! ([`Entries::report`]), at most once a second.
//!
//! Invariants kept here:
//! - one entry per account (`sub` is the primary key); a repeated join
//!   returns the stored ticket;
//! - an entry is in the pre-queue iff its arrival stamp (the Worker's, when
//!   believable: `status::arrival_ms`) is before `starts_at` and the draw
//!   has not begun (it begins `DRAW_GRACE_MS` after the start); stamps
//!   never decrease and never fall in a second already reported
//!   (`places::Stamper`);
//! - a proof-of-work challenge is spent once per account: one newer than
//!   the last it joined with, or the join is refused (`challenge_reused`);
//! - the draw runs only in the alarm, one bounded step per call, its state
//!   stored after each step (an evicted object resumes); no request runs
//!   it; the pre-queue's leaves are served only once the set is frozen;
//! - buckets never change once written;
//! - admitted people's turns (issue 13 #4): when each was last seen and
//!   until when a hold they made through the edge may exist (the latest
//!   end among their holds: each hold's `expires_at`, or the time it was
//!   cancelled through the edge, which is remembered so a replayed grant
//!   cannot revive it), reported to the coordinator with the
//!   next second's arrivals (only rows unchanged since the report was read
//!   are marked reported); a person whose turn was abandoned joins again
//!   at the back (a new arrival stamp and `seq`) once, never twice for one
//!   turn.

use std::cell::Cell;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use token::{Claims, KeyRing, TicketData, TokenType};

use crate::admission::turns;
use crate::api::bodies::BULK_MAX;
use crate::api::error::{ApiError, ApiResult};
use crate::api::routes;
use crate::botcheck::join::Refusal;
use crate::draw::hash;
use crate::draw::index::BUCKET_SIZE;
use crate::draw::phases::DRAW_GRACE_MS;
use crate::draw::steps::{self, DrawState, DrawStore, Limits};
use crate::queue::places::{SecondReport, Stamper};
use crate::queue::shards;
use crate::queue::status::{self, TICKET_TTL_SECS};
use crate::store::sql::{Meta, Sql};

/// After the end, arrivals are reported for this long, then the chain stops.
pub const REPORT_AFTER_END_MS: u64 = 10_000;
/// Leaves or ranked entries a page of `/leaves` or `/ranked` holds at most.
pub const PAGE_MAX: usize = 2_048;
/// Seen reports one `/seen` call records at most.
const SEEN_MAX: usize = 1_000;

/// A join (or a poke: the coordinator wakes a shard nobody joined, with
/// the same settings and `sub: "-"`), as the Worker sends it.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct JoinBody {
    pub sub: String,
    pub shard: u32,
    pub shards: u32,
    pub starts_at_ms: u64,
    pub ends_at_ms: Option<u64>,
    /// When the join reached the edge (believed within bounds).
    #[serde(default)]
    pub arrival_ms: Option<u64>,
    /// Join again at the back: the `seq` of the entry whose turn was
    /// abandoned (the Worker checked it against the coordinator's list).
    #[serde(default)]
    pub again_seq: Option<u64>,
    /// The issue stamp of the proof-of-work challenge the Worker verified
    /// for this join (bot-checked sales only).
    #[serde(default)]
    pub bot_iat_ms: Option<u64>,
}

/// The DEV_MODE bulk hook's body: synthetic pre-queue entrants.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct BulkBody {
    pub prefix: String,
    pub from: u64,
    pub to: u64,
    pub shard: u32,
    pub shards: u32,
    pub starts_at_ms: u64,
}

/// A batch of admitted people seen polling by one isolate.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SeenBody {
    /// `(sub, place, ms)` of admitted people seen polling, and when.
    pub seen: Vec<(String, u64, u64)>,
}

/// One account's hold (the `/held` body: it made a reservation; the
/// `/released` body: it cancelled one). A body of an older Worker names the
/// account only: a hold without id whose end is bounded by
/// `turns::MAX_HOLD_MS`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct TurnBody {
    pub sub: String,
    /// The origin's `reservation_id`.
    #[serde(default)]
    pub reservation: Option<String>,
    /// The hold's `expires_at` (unix ms), when the answer carried one.
    #[serde(default)]
    pub until_ms: Option<u64>,
}

/// Held or cancelled reservations remembered per account this long after
/// their end: a replayed `202` (the origin repeats the first answer of an
/// `Idempotency-Key`, the edge remembers such keys for an hour) must not
/// revive a hold already cancelled.
const HOLD_MEMORY_MS: u64 = 3_600_000;

/// What a join answers, and when the alarm must come by at the latest.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    pub answer: Value,
    pub alarm_by: Option<u64>,
}

/// A report read for the coordinator, to be marked sent once it took it
/// ([`Entries::report_sent`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The body of `POST /report`.
    pub body: Value,
    /// The last second reported (none before the start: counts only).
    pub through: Option<u64>,
    /// The turns it carries: (place, seen ms, held until ms; 0: no hold).
    pub turns: Vec<(u64, u64, u64)>,
}

#[derive(Deserialize)]
struct PlaceOnly {
    place: f64,
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
struct IatRow {
    iat_ms: f64,
}

/// One admitted person's turn as the `turns` table stores it (SQLite
/// numbers come back as `f64` from Durable Object storage).
#[derive(Deserialize)]
pub(crate) struct TurnRow {
    pub place: f64,
    pub seen_ms: f64,
    pub held_until_ms: f64,
}

/// The shard's SQL as the draw's store.
struct SqlDraw<'a, S>(&'a S);

impl<S: Sql> DrawStore for SqlDraw<'_, S> {
    type Error = ApiError;

    /// Entrants by their leaf (draw v2: the value is `SHA-256(key ‖ leaf)`).
    fn entrants_after(&mut self, after_seq: u64, limit: usize) -> ApiResult<Vec<(u64, String)>> {
        let rows: Vec<SeqLeaf> = self.0.rows(
            "SELECT seq, leaf FROM entries WHERE prequeue = 1 AND leaf IS NOT NULL AND seq > ?
             ORDER BY seq LIMIT ?",
            &[after_seq.into(), limit.into()],
        )?;
        Ok(rows.into_iter().map(|r| (r.seq as u64, r.leaf)).collect())
    }

    /// One statement a run, whatever its length (the items travel as one
    /// JSON text): the rows are appended in `(r, i)` order.
    fn put_run(&mut self, run: u64, items: &[steps::Item]) -> ApiResult<()> {
        self.0.exec("DELETE FROM runs WHERE r = ?", &[run.into()])?;
        let json = serde_json::to_string(items).unwrap_or_default();
        self.0.exec(
            "INSERT INTO runs (r, i, value, leaf)
             SELECT ?, CAST(j.key AS INTEGER), json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]')
             FROM json_each(?) AS j",
            &[run.into(), json.into()],
        )?;
        Ok(())
    }

    fn run_items(&mut self, run: u64, from: u64, limit: usize) -> ApiResult<Vec<steps::Item>> {
        let rows: Vec<RankedRow> = self.0.rows(
            "SELECT value, leaf FROM runs WHERE r = ? AND i >= ? ORDER BY i LIMIT ?",
            &[run.into(), from.into(), limit.into()],
        )?;
        Ok(rows.into_iter().map(|r| (r.value, r.leaf)).collect())
    }

    /// A bucket keeps its values (what isolates fetch to place people) and
    /// their leaves beside them (what the coordinator's listing reads).
    fn put_bucket(&mut self, index: u64, items: &[steps::Item]) -> ApiResult<()> {
        let vals: Vec<&str> = items.iter().map(|(v, _)| v.as_str()).collect();
        let leaves: Vec<&str> = items.iter().map(|(_, l)| l.as_str()).collect();
        let last = vals.last().copied().unwrap_or_default();
        self.0.exec(
            "INSERT OR REPLACE INTO buckets (j, vals, leaves, last) VALUES (?, ?, ?, ?)",
            &[
                index.into(),
                serde_json::to_string(&vals).unwrap_or_default().into(),
                serde_json::to_string(&leaves).unwrap_or_default().into(),
                last.into(),
            ],
        )?;
        Ok(())
    }
}

/// A fresh 16-byte draw salt (hex) from the CSPRNG.
fn new_salt(now: u64) -> (String, [u8; 16]) {
    let mut salt = [0u8; 16];
    if getrandom::fill(&mut salt).is_err() {
        // workerd always has crypto.getRandomValues; were it ever missing,
        // a salt from the clock still hides a guessable account's leaf from
        // anyone who cannot guess the millisecond, and costs no join.
        salt[..8].copy_from_slice(&now.to_le_bytes());
    }
    (hex::encode(salt), salt)
}

/// A fresh salt and the leaf it gives `sub` (both hex).
fn new_salt_for(sub: &str, now: u64) -> (String, String) {
    let (hex_salt, salt) = new_salt(now);
    (hex_salt, hash::leaf_hex(sub, &salt))
}

/// A synthetic entrant's salt (DEV_MODE bulk hook only):
/// `SHA-256("fs-bulk-salt:" ‖ sale ‖ ":" ‖ account)[..16]`, so a test or
/// benchmark can forge the tickets of entrants it never joined and
/// recompute the whole draw from the published seed. Real joins get CSPRNG
/// salts.
pub fn bulk_salt_for(sale: &str, sub: &str) -> (String, String) {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(format!("fs-bulk-salt:{sale}:{sub}").as_bytes());
    let mut salt = [0u8; 16];
    salt.copy_from_slice(&h[..16]);
    (hex::encode(salt), hash::leaf_hex(sub, &salt))
}

/// The page size and cursor of a `/leaves` or `/ranked` request (its
/// `after` and `limit` query parameters).
pub fn page_of(after: Option<String>, limit: Option<String>) -> ApiResult<(String, usize)> {
    let after = after.unwrap_or_default();
    if !after.is_empty() && (after.len() > 128 || !after.bytes().all(|b| b.is_ascii_hexdigit())) {
        return Err(ApiError::new(400, "bad_request", "after must be hex"));
    }
    let limit = limit
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|l| (1..=PAGE_MAX).contains(l))
        .ok_or_else(|| ApiError::new(400, "bad_request", "limit out of range"))?;
    Ok((after, limit))
}

/// Whether a request to `path` counts as an isolate's call (what the
/// benchmark of object calls per poll counts), not the coordinator's
/// (pokes, the draw's page fetches).
pub fn counts_as_isolate_call(path: &str) -> bool {
    !matches!(path, "/poke" | "/leaves" | "/ranked")
}

/// Whether the alarm at `now` runs a draw step: once the grace after the
/// start has passed.
pub fn draw_due(now: u64, starts_at_ms: u64) -> bool {
    now >= starts_at_ms.saturating_add(DRAW_GRACE_MS)
}

/// When the alarm that ran at `now` comes next: before the start at the
/// start (in a second when the report failed, so it is tried again), then
/// each second until `REPORT_AFTER_END_MS` after the end; never later than
/// an alarm a join asked for meanwhile (`asked`).
pub fn next_alarm(
    now: u64,
    starts: u64,
    ends: u64,
    reported: bool,
    asked: Option<u64>,
) -> Option<u64> {
    let next = if now < starts {
        // Before the start joins re-arm (counts), a failed report is
        // tried again in a second, and the start always comes.
        Some(if reported {
            starts
        } else {
            starts.min(now + 1_000)
        })
    } else if now < ends.saturating_add(REPORT_AFTER_END_MS) {
        Some(now - now % 1000 + 1_050)
    } else {
        None
    };
    match (next, asked) {
        (Some(n), Some(a)) => Some(n.min(a)),
        (n, a) => n.or(a),
    }
}

/// A queue shard's entries and draw over its SQL storage.
pub struct Entries<S> {
    sql: S,
    meta: Meta,
    stamper: Cell<Stamper>,
}

impl<S: Sql> Entries<S> {
    /// The shard over `sql`, its tables created if needed and its settings
    /// loaded.
    pub fn open(sql: S) -> ApiResult<Self> {
        let e = Entries {
            sql,
            meta: Meta::default(),
            stamper: Cell::new(Stamper::default()),
        };
        e.init()?;
        Ok(e)
    }

    /// The shard over `sql` without touching it (an object whose storage
    /// failed at start answers errors, not a panic).
    pub fn unopened(sql: S) -> Self {
        Entries {
            sql,
            meta: Meta::default(),
            stamper: Cell::new(Stamper::default()),
        }
    }

    fn set(&self, k: &str, v: impl ToString) -> ApiResult<()> {
        self.meta.set(&self.sql, k, v)
    }

    fn init(&self) -> ApiResult<()> {
        let sql = &self.sql;
        self.meta.load(sql)?;
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
            // The draw's sorted runs, then its buckets (draw::steps): append-only.
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
            // The holds each account made (or cancelled) through the edge:
            // `until_ms` is when the hold can no longer exist.
            "CREATE TABLE IF NOT EXISTS holds (
                sub TEXT NOT NULL,
                id TEXT NOT NULL,
                until_ms INTEGER NOT NULL,
                released INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (sub, id)) WITHOUT ROWID",
            // Per account, the issue stamp of the newest challenge it
            // joined with (see `spend_challenge`).
            "CREATE TABLE IF NOT EXISTS challenges (sub TEXT PRIMARY KEY, iat_ms INTEGER NOT NULL)",
        ] {
            sql.exec(q, &[])?;
        }
        // Objects created before the draw v2 (salts): the columns are added
        // (an error here means they are there already).
        for q in [
            "ALTER TABLE entries ADD COLUMN salt TEXT",
            "ALTER TABLE entries ADD COLUMN leaf TEXT",
            "ALTER TABLE buckets ADD COLUMN leaves TEXT",
            "ALTER TABLE buckets ADD COLUMN last TEXT",
            // Objects created before holds had an end (issue 44 #2).
            "ALTER TABLE turns ADD COLUMN held_until_ms INTEGER NOT NULL DEFAULT 0",
            // Objects created before revokes (issue 47).
            "ALTER TABLE turns ADD COLUMN revoked INTEGER NOT NULL DEFAULT 0",
        ] {
            let _ = sql.exec(q, &[]);
        }
        // A turn stored as held before ends were recorded: held for the
        // longest a hold can live from when it was last reported (its
        // `seen_ms` is at least the hold's time), as a hold of no id.
        sql.exec(
            "INSERT OR IGNORE INTO holds (sub, id, until_ms)
                 SELECT sub, '', seen_ms + ? FROM turns WHERE held = 1 AND held_until_ms = 0",
            &[turns::MAX_HOLD_MS.into()],
        )?;
        sql.exec(
            "UPDATE turns SET held_until_ms = seen_ms + ? WHERE held = 1 AND held_until_ms = 0",
            &[turns::MAX_HOLD_MS.into()],
        )?;
        let floor = self.meta.u64("stamp_floor").unwrap_or(0);
        self.stamper.set(Stamper { floor_ms: floor });
        Ok(())
    }

    /// The sale this shard belongs to (once a caller named it).
    pub fn sale(&self) -> Option<String> {
        self.meta.get("sale")
    }

    /// This shard's number.
    pub fn shard(&self) -> Option<u64> {
        self.meta.u64("shard")
    }

    /// The sale's start (never, until a caller gave it).
    pub fn starts_at(&self) -> u64 {
        self.meta.u64("starts_at_ms").unwrap_or(u64::MAX)
    }

    /// The sale's end (never, when it has none).
    pub fn ends_at(&self) -> u64 {
        self.meta.u64("ends_at_ms").unwrap_or(u64::MAX)
    }

    /// The draw's stored state (none: not begun).
    pub fn draw_state(&self) -> Option<DrawState> {
        self.meta
            .get("draw")
            .and_then(|s| serde_json::from_str(&s).ok())
    }

    fn draw_begun(&self) -> bool {
        self.draw_state().is_some()
    }

    /// Freezes the pre-queue (the draw has begun: later joins are placed
    /// after it), unless it is frozen already. The object calls nothing
    /// that awaits before it in a request or alarm that reads the set.
    pub fn freeze(&self) -> ApiResult<()> {
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
    pub fn configure(
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
            None => self.meta.delete(&self.sql, "ends_at_ms")?,
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn mint(
        &self,
        ring: &KeyRing,
        sale: &str,
        sub: &str,
        seq: u64,
        t_ms: Option<u64>,
        salt: &str,
        now: u64,
    ) -> (String, u64) {
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
            shard: self.shard().map(|s| s as u32),
            t_ms,
            salt: Some(salt.to_string()),
            shadow: false,
        });
        (ring.sign(&claims), claims.exp)
    }

    /// A join at `now` (the object's clock, read before anything else):
    /// the stored ticket for a repeated join, a new entry otherwise, a new
    /// arrival for the abandoned turn named by `again_seq`. `ring` is the
    /// admission key ring (asked for only when a ticket is minted).
    pub fn join(
        &self,
        sale: &str,
        b: JoinBody,
        now: u64,
        ring: impl Fn() -> ApiResult<Rc<KeyRing>>,
    ) -> ApiResult<Joined> {
        let sub = b.sub;
        if sub.is_empty() || sub.len() > 256 {
            return Err(ApiError::new(400, "bad_request", "sub missing"));
        }
        self.configure(sale, b.shard, b.shards, b.starts_at_ms, b.ends_at_ms)?;
        if let Some(iat) = b.bot_iat_ms {
            self.spend_challenge(&sub, iat)?;
        }
        let existing: Option<EntryRow> = self.sql.first(
            "SELECT seq, ticket, ticket_exp, prequeue, t_ms, salt FROM entries WHERE sub = ?",
            &[sub.as_str().into()],
        )?;
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
            let salt = row.salt.clone().unwrap_or_else(|| new_salt(now).0);
            let (ticket, exp) = self.mint(&*ring()?, sale, &sub, seq, Some(t), &salt, now);
            self.sql.exec(
                "UPDATE entries SET seq = ?, t_ms = ?, prequeue = 0, ticket = ?, ticket_exp = ?
                 WHERE sub = ?",
                &[
                    seq.into(),
                    t.into(),
                    ticket.as_str().into(),
                    exp.into(),
                    sub.as_str().into(),
                ],
            )?;
            self.sql
                .exec("DELETE FROM turns WHERE sub = ?", &[sub.as_str().into()])?;
            self.set("next_seq", seq + 1)?;
            return Ok(Joined {
                answer: json!({"ticket": ticket, "prequeue": false}),
                alarm_by: Some(now - now % 1000 + 1_100),
            });
        }
        if let Some(row) = existing {
            let pre = row.prequeue as u64 == 1;
            if let (Some(t), Some(exp)) = (&row.ticket, row.ticket_exp)
                && (exp as u64) > now / 1000 + 3600
            {
                return Ok(Joined {
                    answer: json!({"ticket": t, "prequeue": pre}),
                    alarm_by: None,
                });
            }
            // Bulk-loaded entries have no ticket yet; old ones are renewed.
            let t_ms = (!pre).then_some(row.t_ms as u64);
            let (salt, leaf) = match &row.salt {
                Some(s) => (s.clone(), None),
                // An entry written before salts (v1): its leaf is written
                // with its salt, unless the set is frozen already.
                None => {
                    let (s, l) = new_salt_for(&sub, now);
                    (s, (!self.draw_begun()).then_some(l))
                }
            };
            let (t, exp) = self.mint(&*ring()?, sale, &sub, row.seq as u64, t_ms, &salt, now);
            self.sql.exec(
                "UPDATE entries SET ticket = ?, ticket_exp = ?, salt = ?,
                     leaf = COALESCE(leaf, ?) WHERE sub = ?",
                &[
                    t.as_str().into(),
                    exp.into(),
                    salt.as_str().into(),
                    // NULL, not '', when the set is frozen: the entry
                    // stays out of the draw it was not frozen into.
                    leaf.as_deref().into(),
                    sub.as_str().into(),
                ],
            )?;
            return Ok(Joined {
                answer: json!({"ticket": t, "prequeue": pre}),
                alarm_by: None,
            });
        }
        let mut stamper = self.stamper.get();
        let t = stamper.stamp(status::arrival_ms(now, b.arrival_ms));
        self.stamper.set(stamper);
        let starts = self.starts_at();
        let pre = t < starts && !self.draw_begun();
        let seq = self.meta.u64("next_seq").unwrap_or(1);
        let (salt, leaf) = new_salt_for(&sub, now);
        let (ticket, exp) = self.mint(&*ring()?, sale, &sub, seq, (!pre).then_some(t), &salt, now);
        self.sql.exec(
            "INSERT INTO entries (sub, seq, t_ms, prequeue, ticket, ticket_exp, salt, leaf)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            &[
                sub.as_str().into(),
                seq.into(),
                t.into(),
                pre.into(),
                ticket.as_str().into(),
                exp.into(),
                salt.as_str().into(),
                leaf.as_str().into(),
            ],
        )?;
        self.set("next_seq", seq + 1)?;
        let alarm_by = if pre {
            self.set("prequeue", self.meta.u64("prequeue").unwrap_or(0) + 1)?;
            // Counts reach the coordinator within a second; the draw at the start.
            starts.min(now + 1_000)
        } else {
            now - now % 1000 + 1_100
        };
        Ok(Joined {
            answer: json!({"ticket": ticket, "prequeue": pre}),
            alarm_by: Some(alarm_by),
        })
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
        let last: Option<IatRow> = self
            .sql
            .first("SELECT iat_ms FROM challenges WHERE sub = ?", &[sub.into()])?;
        if last.is_some_and(|r| r.iat_ms as u64 >= iat_ms) {
            return Err(Refusal::Reused.error());
        }
        self.sql.exec(
            "INSERT OR REPLACE INTO challenges (sub, iat_ms) VALUES (?, ?)",
            &[sub.into(), iat_ms.into()],
        )?;
        Ok(())
    }

    /// DEV_MODE hook (the Worker checks the mode): synthetic pre-queue
    /// entrants `prefix-i` for `i` in `from..to` that map to this shard.
    /// Answers the body and when the alarm must come by.
    pub fn bulk(&self, sale: &str, b: BulkBody, now: u64) -> ApiResult<(Value, u64)> {
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
        for i in b.from..b.to {
            let sub = format!("{}-{i}", b.prefix);
            if shards::shard_of(&sub, b.shards) != b.shard {
                continue;
            }
            let (salt, leaf) = bulk_salt_for(sale, &sub);
            let changed = self.sql.exec(
                "INSERT OR IGNORE INTO entries (sub, seq, t_ms, prequeue, salt, leaf)
                 VALUES (?, ?, ?, 1, ?, ?)",
                &[
                    sub.as_str().into(),
                    seq.into(),
                    now.into(),
                    salt.as_str().into(),
                    leaf.as_str().into(),
                ],
            )?;
            if changed > 0 {
                seq += 1;
                added += 1;
            }
        }
        self.set("next_seq", seq)?;
        self.set("prequeue", self.meta.u64("prequeue").unwrap_or(0) + added)?;
        Ok((
            json!({"added": added, "prequeue": self.meta.u64("prequeue")}),
            self.starts_at().min(now + 1_000),
        ))
    }

    /// Records admitted people seen polling (at most 1,000 a call), each
    /// never later than `now`; a turn seen again is reported again.
    pub fn seen(&self, b: &SeenBody, now: u64) -> ApiResult<Value> {
        for (sub, place, at) in b.seen.iter().take(SEEN_MAX) {
            // When the poll was (never later than now).
            let seen_ms = (*at).min(now);
            self.sql.exec(
                "INSERT INTO turns (sub, place, seen_ms) VALUES (?, ?, ?)
                 ON CONFLICT(sub) DO UPDATE SET place = excluded.place,
                     seen_ms = MAX(seen_ms, excluded.seen_ms), reported = 0",
                &[sub.as_str().into(), (*place).into(), seen_ms.into()],
            )?;
        }
        Ok(json!({"ok": true}))
    }

    /// Records that `b.sub` made a reservation (a hold that may still
    /// exist keeps the turn until its end, `turns::hold_end`). It may come
    /// before the person's first seen report (issue 44 #2: a fast buyer):
    /// then the row waits with place 0 (unknown), is not reported, and the
    /// first `/seen` gives it its place and keeps its hold. A hold already
    /// cancelled stays cancelled (a replayed `202`).
    pub fn held(&self, b: &TurnBody, now: u64) -> ApiResult<Value> {
        let sub = b.sub.as_str();
        let until = turns::hold_end(b.until_ms, now);
        let id = b.reservation.as_deref().unwrap_or("");
        self.forget_old_holds(sub, now)?;
        self.sql.exec(
            "INSERT INTO holds (sub, id, until_ms) VALUES (?, ?, ?)
             ON CONFLICT(sub, id) DO UPDATE SET until_ms = excluded.until_ms WHERE released = 0",
            &[sub.into(), id.into(), until.into()],
        )?;
        self.sql.exec(
            "INSERT INTO turns (sub, place, seen_ms, held) VALUES (?, 0, ?, 1)
             ON CONFLICT(sub) DO UPDATE SET held = 1,
                 seen_ms = MAX(seen_ms, excluded.seen_ms), reported = 0",
            &[sub.into(), now.into()],
        )?;
        self.hold_ends_at(sub)?;
        Ok(json!({"ok": true}))
    }

    /// Records that `b.sub` cancelled a reservation through the edge: that
    /// hold ends now, and the turn is protected only as long as another
    /// hold of theirs may exist; then the ordinary idleness rule applies,
    /// counted from now at the earliest. A cancel with no turn known
    /// records the hold's end only (a later `/held` replay cannot revive it).
    /// A hold of unknown id (stored before ids, or from an older Worker) is
    /// taken to be the one cancelled: per-user limits are mostly one, and
    /// keeping it would protect an unused turn for up to a day.
    pub fn released(&self, b: &TurnBody, now: u64) -> ApiResult<Value> {
        let sub = b.sub.as_str();
        let id = b.reservation.as_deref().unwrap_or("");
        self.forget_old_holds(sub, now)?;
        for other in [id, ""] {
            self.sql.exec(
                "INSERT INTO holds (sub, id, until_ms, released) VALUES (?, ?, ?, 1)
                 ON CONFLICT(sub, id) DO UPDATE SET released = 1,
                     until_ms = MIN(until_ms, excluded.until_ms)",
                &[sub.into(), other.into(), now.into()],
            )?;
        }
        self.hold_ends_at(sub)?;
        Ok(json!({"ok": true}))
    }

    /// Ends `b.sub`'s admission (an operator's revoke, or the origin's
    /// after a purchase): the turn is reported revoked with the next
    /// report, and the coordinator passes it on at once. A person not yet
    /// seen while admitted gets a row of place 0, reported once their
    /// first `/seen` gives it a place. For good: nothing un-revokes.
    pub fn revoke(&self, b: &TurnBody, now: u64) -> ApiResult<Value> {
        self.sql.exec(
            "INSERT INTO turns (sub, place, seen_ms, revoked) VALUES (?, 0, ?, 1)
             ON CONFLICT(sub) DO UPDATE SET revoked = 1, reported = 0",
            &[b.sub.as_str().into(), now.into()],
        )?;
        let place = self
            .sql
            .first::<TurnRow>(
                "SELECT place, seen_ms, held_until_ms FROM turns WHERE sub = ?",
                &[b.sub.as_str().into()],
            )?
            .map_or(0, |r| r.place as u64);
        Ok(json!({"revoked": true, "place": (place > 0).then_some(place)}))
    }

    /// Holds (and cancels) that ended long ago say nothing any more.
    fn forget_old_holds(&self, sub: &str, now: u64) -> ApiResult<()> {
        self.sql.exec(
            "DELETE FROM holds WHERE sub = ? AND until_ms < ?",
            &[sub.into(), now.saturating_sub(HOLD_MEMORY_MS).into()],
        )?;
        Ok(())
    }

    /// The turn's protection: the latest end among the account's holds
    /// (reported again when it changed).
    fn hold_ends_at(&self, sub: &str) -> ApiResult<()> {
        self.sql.exec(
            "UPDATE turns SET reported = 0, held_until_ms =
                 COALESCE((SELECT MAX(until_ms) FROM holds WHERE sub = ?), 0)
             WHERE sub = ?",
            &[sub.into(), sub.into()],
        )?;
        Ok(())
    }

    /// Bucket `j` of the drawn pre-queue (what isolates place people by).
    pub fn bucket(&self, j: Option<u64>) -> ApiResult<Value> {
        let Some(DrawState::Done { buckets, .. }) = self.draw_state() else {
            return Err(ApiError::new(409, "not_drawn", "not drawn yet"));
        };
        let j = j
            .filter(|j| *j < buckets)
            .ok_or_else(|| ApiError::new(400, "bad_request", "bucket index out of range"))?;
        let row: BucketRow = self
            .sql
            .first("SELECT vals FROM buckets WHERE j = ?", &[j.into()])?
            .ok_or_else(|| ApiError::new(500, "queue_storage", "bucket missing"))?;
        let values: Value = serde_json::from_str(&row.vals).unwrap_or(Value::Null);
        Ok(json!({"shard": self.shard(), "bucket": j, "values": values}))
    }

    /// The frozen pre-queue's leaves after `after`, ascending (the
    /// coordinator's freeze). Answered only once the set is frozen: a page
    /// read before could miss a join still coming. A request after the
    /// freeze time freezes the set itself (the alarm may be late).
    pub fn leaves(&self, (after, limit): (String, usize), now: u64) -> ApiResult<Value> {
        if !self.draw_begun() && now < self.starts_at().saturating_add(DRAW_GRACE_MS) {
            return Err(ApiError::new(
                409,
                "not_frozen",
                "the entrant set is not frozen yet",
            ));
        }
        self.freeze()?;
        let rows: Vec<LeafRow> = self.sql.rows(
            "SELECT leaf FROM entries WHERE prequeue = 1 AND leaf > ? ORDER BY leaf LIMIT ?",
            &[after.as_str().into(), limit.into()],
        )?;
        let leaves: Vec<String> = rows.into_iter().map(|r| r.leaf).collect();
        Ok(json!({"leaves": leaves}))
    }

    /// The drawn pre-queue's `value ‖ leaf` after `after` (a value), by value
    /// (the coordinator's listing), read from the buckets, which hold both.
    /// Only once this shard's draw is done.
    pub fn ranked(&self, (after, limit): (String, usize)) -> ApiResult<Value> {
        if !matches!(self.draw_state(), Some(DrawState::Done { .. })) {
            return Err(ApiError::new(409, "not_drawn", "not drawn yet"));
        }
        // The buckets that can hold the page: from the one holding the
        // first value past `after`, as many as `limit` values can span.
        let rows: Vec<RankedBucketRow> = self.sql.rows(
            "SELECT vals, leaves FROM buckets WHERE last > ? ORDER BY j LIMIT ?",
            &[
                after.as_str().into(),
                (limit.div_ceil(BUCKET_SIZE) + 1).into(),
            ],
        )?;
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

    /// The shard's state (`GET /state`).
    pub fn state(&self) -> Value {
        json!({
            "draw": self.draw_state(),
            "prequeue": self.meta.u64("prequeue"),
            "entries": self.meta.u64("next_seq").unwrap_or(1) - 1,
        })
    }

    /// The draw's key, once the coordinator gave it.
    pub fn key(&self) -> Option<::draw::Hash> {
        self.meta.get("key").and_then(|k| ::draw::from_hex(&k))
    }

    /// Stores the draw's key (the coordinator's answer to `GET /key`).
    pub fn set_key(&self, key: &::draw::Hash) -> ApiResult<()> {
        self.set("key", ::draw::to_hex(key))
    }

    /// One bounded step of the draw with `key`. Returns whether the draw is
    /// done. The entrant set is frozen first.
    pub fn draw_step(&self, key: &::draw::Hash) -> ApiResult<bool> {
        let state = self.draw_state().unwrap_or_else(DrawState::start);
        if let DrawState::Done { .. } = state {
            return Ok(true);
        }
        self.freeze()?;
        let value = |leaf: &str| hash::value_hex(key, leaf);
        let next = steps::step(&state, &mut SqlDraw(&self.sql), &value, Limits::default())?;
        self.set("draw", serde_json::to_string(&next).unwrap_or_default())?;
        Ok(next.is_done())
    }

    /// Whether the draw is done (its state says so).
    pub fn drawn(&self) -> bool {
        matches!(self.draw_state(), Some(DrawState::Done { .. }))
    }

    /// The body of `POST /drawn` for the coordinator: the shard's draw
    /// index, once drawn and not yet sent (`None` otherwise).
    pub fn index_report(&self, requests: u64) -> ApiResult<Option<Value>> {
        if self.meta.flag("index_sent") {
            return Ok(None);
        }
        let Some(DrawState::Done { count, .. }) = self.draw_state() else {
            return Ok(None);
        };
        let rows: Vec<BucketRow> = self.sql.rows("SELECT vals FROM buckets ORDER BY j", &[])?;
        let firsts: Vec<String> = rows
            .iter()
            .filter_map(|r| serde_json::from_str::<Vec<String>>(&r.vals).ok())
            .filter_map(|v| v.into_iter().next())
            .collect();
        Ok(Some(json!({
            "shard": self.shard(),
            "count": count,
            "firsts": firsts,
            "requests": requests,
        })))
    }

    /// Records that the coordinator took the index.
    pub fn index_sent(&self) -> ApiResult<()> {
        self.set("index_sent", 1)
    }

    /// What to report to the coordinator at `now`: counts before the start,
    /// after it every finished second's arrivals since the last report and
    /// the turns changed since (`None`: no finished second to report and
    /// no revoke waiting: a revoke does not wait for its second to end).
    /// Stamps taken from here on land in the unreported second.
    pub fn report(&self, now: u64, requests: u64) -> ApiResult<Option<Report>> {
        let shard = self.shard().unwrap_or(0);
        let starts = self.starts_at();
        if now < starts {
            let body = json!({"shard": shard, "prequeue": self.meta.u64("prequeue").unwrap_or(0),
                              "requests": requests});
            return Ok(Some(Report {
                body,
                through: None,
                turns: Vec::new(),
            }));
        }
        let until_ms = now - now % 1000;
        let from_ms = match self.meta.u64("reported_through") {
            Some(s) => (s + 1) * 1000,
            None => starts - starts % 1000,
        };
        if until_ms <= from_ms {
            // No second has ended since the last report, but a revoke is
            // told now: the turn passes on a second sooner (issue 47).
            return self.revoke_report(shard, now, requests);
        }
        // Later stamps land in the unreported second (before the object's
        // await on the coordinator).
        let mut stamper = self.stamper.get();
        stamper.reported_until(until_ms / 1000);
        self.stamper.set(stamper);
        self.set("stamp_floor", stamper.floor_ms)?;
        let rows: Vec<StampRow> = self.sql.rows(
            "SELECT t_ms, seq FROM entries WHERE prequeue = 0 AND t_ms >= ? AND t_ms < ? ORDER BY t_ms, seq",
            &[from_ms.into(), until_ms.into()],
        )?;
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
        let turns = self.unreported_turns(false)?;
        let revoked: Vec<u64> = self
            .sql
            .rows::<PlaceOnly>(
                "SELECT place FROM turns WHERE reported = 0 AND place > 0 AND revoked = 1
                 LIMIT 5000",
                &[],
            )?
            .into_iter()
            .map(|r| r.place as u64)
            .collect();
        let body = json!({"shard": shard, "through": through, "seconds": seconds,
                          "requests": requests, "turns": turns, "revoked": revoked,
                          "at_ms": now});
        Ok(Some(Report {
            body,
            through: Some(through),
            turns,
        }))
    }

    /// Turns with a place changed since the last report (place, seen ms,
    /// held until ms), at most 5,000; `revoked_only`: the revoked ones.
    fn unreported_turns(&self, revoked_only: bool) -> ApiResult<Vec<(u64, u64, u64)>> {
        Ok(self
            .sql
            .rows::<TurnRow>(
                "SELECT place, seen_ms, held_until_ms FROM turns
                 WHERE reported = 0 AND place > 0 AND (? = 0 OR revoked = 1) LIMIT 5000",
                &[u64::from(revoked_only).into()],
            )?
            .into_iter()
            .map(|r| (r.place as u64, r.seen_ms as u64, r.held_until_ms as u64))
            .collect())
    }

    /// A report of the revoked turns alone (their places and rows), made
    /// between two seconds' reports; none when no revoke waits.
    fn revoke_report(&self, shard: u64, now: u64, requests: u64) -> ApiResult<Option<Report>> {
        let turns = self.unreported_turns(true)?;
        if turns.is_empty() {
            return Ok(None);
        }
        let revoked: Vec<u64> = turns.iter().map(|t| t.0).collect();
        let body = json!({"shard": shard, "seconds": [], "requests": requests,
                          "turns": turns, "revoked": revoked, "at_ms": now});
        Ok(Some(Report {
            body,
            through: None,
            turns,
        }))
    }

    /// Records that the coordinator took `report`. A turn seen again
    /// meanwhile (an await ago) is reported next time: only rows unchanged
    /// since the read are marked.
    pub fn report_sent(&self, report: &Report) -> ApiResult<()> {
        for (place, seen, until) in &report.turns {
            self.sql.exec(
                "UPDATE turns SET reported = 1 WHERE place = ? AND seen_ms = ? AND held_until_ms = ?",
                &[(*place).into(), (*seen).into(), (*until).into()],
            )?;
        }
        match report.through {
            Some(through) => self.set("reported_through", through),
            None => Ok(()),
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::draw::index::ShardIndex;
    use crate::queue::places::place_of;
    use crate::store::sqlite::MemSql;
    use token::{Claims, Expect};

    const SALE: &str = "drop";
    const START: u64 = 1_800_000_000_000;

    fn keys() -> ApiResult<Rc<KeyRing>> {
        Ok(Rc::new(KeyRing::from_keys(&[("a1", &[7u8; 32])]).unwrap()))
    }

    fn shard() -> Entries<MemSql> {
        Entries::open(MemSql::new()).unwrap()
    }

    fn body(sub: &str, arrival: u64) -> JoinBody {
        JoinBody {
            sub: sub.into(),
            shard: 0,
            shards: 1,
            starts_at_ms: START,
            ends_at_ms: Some(START + 3_600_000),
            arrival_ms: Some(arrival),
            again_seq: None,
            bot_iat_ms: None,
        }
    }

    fn ticket(j: &Joined, now: u64) -> Claims {
        let t = j.answer["ticket"].as_str().unwrap();
        let expect = Expect {
            typ: TokenType::Ticket,
            sale: Some(SALE),
        };
        keys().unwrap().verify(t, expect, now / 1000).unwrap()
    }

    #[test]
    fn one_entry_per_account_and_a_repeated_join_gets_its_ticket() {
        let s = shard();
        let now = START - 60_000;
        let first = s.join(SALE, body("alice", now), now, keys).unwrap();
        assert_eq!(first.answer["prequeue"], true);
        // Counts reach the coordinator within a second.
        assert_eq!(first.alarm_by, Some(now + 1_000));
        let again = s.join(SALE, body("alice", now + 5), now + 5, keys).unwrap();
        assert_eq!(again.answer, first.answer, "the stored ticket, unchanged");
        assert_eq!(again.alarm_by, None);
        s.join(SALE, body("bob", now + 9), now + 9, keys).unwrap();
        assert_eq!(s.state()["entries"], 2);
        assert_eq!(s.state()["prequeue"], 2);
        let t = ticket(&first, now).tkt.unwrap();
        assert_eq!((t.seq, t.place, t.t_ms, t.shard), (1, None, None, Some(0)));
        assert!(t.salt.is_some());
    }

    #[test]
    fn after_the_start_or_the_freeze_a_join_is_an_arrival() {
        let s = shard();
        let late = s
            .join(SALE, body("late", START + 1_500), START + 1_500, keys)
            .unwrap();
        assert_eq!(late.answer["prequeue"], false);
        assert_eq!(late.alarm_by, Some(START + 2_100));
        assert_eq!(
            ticket(&late, START + 1_500).tkt.unwrap().t_ms,
            Some(START + 1_500)
        );
        // Stamped before the start but after the draw began: after it too.
        let t = shard();
        t.configure(SALE, 0, 1, START, None).unwrap();
        t.freeze().unwrap();
        let j = t
            .join(SALE, body("x", START - 10), START - 10, keys)
            .unwrap();
        assert_eq!(j.answer["prequeue"], false);
    }

    #[test]
    fn a_challenge_is_spent_once_per_account() {
        let s = shard();
        let now = START - 60_000;
        let mut b = body("alice", now);
        b.bot_iat_ms = Some(100);
        s.join(SALE, b.clone(), now, keys).unwrap();
        let reused = s.join(SALE, b.clone(), now + 1, keys).unwrap_err();
        assert_eq!(reused.code, "challenge_reused");
        b.bot_iat_ms = Some(99);
        assert_eq!(
            s.join(SALE, b.clone(), now + 2, keys).unwrap_err().code,
            "challenge_reused"
        );
        b.bot_iat_ms = Some(101);
        s.join(SALE, b, now + 3, keys).unwrap();
    }

    #[test]
    fn an_abandoned_turn_joins_again_at_the_back_once() {
        let s = shard();
        let first = s
            .join(SALE, body("alice", START + 100), START + 100, keys)
            .unwrap();
        let seq = ticket(&first, START + 100).tkt.unwrap().seq;
        s.seen(
            &SeenBody {
                seen: vec![("alice".into(), 1, START + 200)],
            },
            START + 300,
        )
        .unwrap();
        let now = START + 60_000;
        let mut b = body("alice", now);
        b.again_seq = Some(seq);
        let again = s.join(SALE, b.clone(), now, keys).unwrap();
        let t = ticket(&again, now).tkt.unwrap();
        assert_eq!(t.seq, seq + 1, "a new arrival number");
        assert_eq!(t.t_ms, Some(now));
        assert_eq!(again.answer["prequeue"], false);
        // The turn is gone from the shard's report.
        let r = s.report(now + 2_000, 0).unwrap().unwrap();
        assert!(r.turns.is_empty());
        // The same request twice is a repeated join, not a third arrival.
        let twice = s.join(SALE, b, now + 5, keys).unwrap();
        assert_eq!(twice.answer, again.answer);
    }

    #[test]
    fn the_draw_runs_in_bounded_steps_and_places_match_one_global_sort() {
        let s = shard();
        let before = START - 60_000;
        let mut leaves = Vec::new();
        for i in 0..1_300 {
            let j = s
                .join(
                    SALE,
                    body(&format!("acct-{i}"), before + i),
                    before + i,
                    keys,
                )
                .unwrap();
            let t = ticket(&j, before).tkt.unwrap();
            leaves.push(hash::leaf_of_ticket(&format!("acct-{i}"), &t.salt.unwrap()).unwrap());
        }
        // Leaves are served only once the set is frozen.
        let page = page_of(None, Some("2048".into())).unwrap();
        assert_eq!(
            s.leaves(page.clone(), START).unwrap_err().code,
            "not_frozen"
        );
        let frozen = s.leaves(page, START + DRAW_GRACE_MS).unwrap();
        let mut sorted = leaves.clone();
        sorted.sort();
        assert_eq!(frozen["leaves"], json!(sorted));
        // A join now is not in the draw.
        let j = s
            .join(SALE, body("late", START + 4_000), START + 4_000, keys)
            .unwrap();
        assert_eq!(j.answer["prequeue"], false);
        assert_eq!(
            s.ranked(page_of(None, Some("10".into())).unwrap())
                .unwrap_err()
                .code,
            "not_drawn"
        );
        let key = [3u8; 32];
        let mut steps = 0;
        while !s.draw_step(&key).unwrap() {
            steps += 1;
            assert!(steps < 1_000, "the draw ends");
        }
        assert!(steps > 1, "more than one bounded step");
        let index_body = s.index_report(7).unwrap().unwrap();
        assert_eq!(index_body["count"], 1_300);
        let index = ShardIndex {
            count: 1_300,
            firsts: serde_json::from_value(index_body["firsts"].clone()).unwrap(),
        };
        s.index_sent().unwrap();
        assert_eq!(s.index_report(7).unwrap(), None, "sent once");
        // Every place computed from the shard's buckets is the rank one
        // object sorting every value gives.
        for d in hash::draw_order(&key, &leaves).iter().step_by(97) {
            let j = index.straddling(&d.value);
            let b = s.bucket(j).unwrap();
            let vals: Vec<String> = serde_json::from_value(b["values"].clone()).unwrap();
            assert_eq!(place_of(&d.value, &[(&index, &vals)]), Some(d.place));
        }
        // The listing's pages: value ‖ leaf ascending, after a cursor.
        let all = s.ranked((String::new(), PAGE_MAX)).unwrap();
        let items: Vec<String> = serde_json::from_value(all["items"].clone()).unwrap();
        assert_eq!(items.len(), PAGE_MAX.min(1_300));
        assert!(items.windows(2).all(|w| w[0] < w[1]));
        let after = items[9][..64].to_string();
        let next = s.ranked((after, 5)).unwrap();
        assert_eq!(next["items"], json!(items[10..15]));
        assert_eq!(s.bucket(Some(99)).unwrap_err().status, 400);
    }

    /// Issue 44 #2: a fast buyer reserves before their first seen report
    /// reaches the shard (reports are batched ≥ 2 s, and the page stops
    /// polling once it holds a reservation). The hold must still keep the
    /// turn: `/held` before any `/seen` is remembered, and the turn is
    /// reported held once its place is known.
    #[test]
    fn a_reservation_before_the_first_seen_report_keeps_the_turn() {
        let s = shard();
        s.join(SALE, body("a", START + 100), START + 100, keys)
            .unwrap();
        s.held(&hold("a", None, None), START + 1_100).unwrap();
        let r = s.report(START + 1_500, 1).unwrap().unwrap();
        assert!(r.turns.is_empty(), "no place known yet: nothing to report");
        s.report_sent(&r).unwrap();
        s.seen(
            &SeenBody {
                seen: vec![("a".into(), 1, START + 1_000)],
            },
            START + 1_600,
        )
        .unwrap();
        let r = s.report(START + 2_500, 1).unwrap().unwrap();
        assert_eq!(
            r.turns,
            vec![(1, START + 1_100, START + 1_100 + turns::MAX_HOLD_MS)],
            "held (an older Worker's body: no end known, bounded), kept"
        );
    }

    fn hold(sub: &str, id: Option<&str>, until_ms: Option<u64>) -> TurnBody {
        TurnBody {
            sub: sub.into(),
            reservation: id.map(str::to_string),
            until_ms,
        }
    }

    /// Issue 44 #2 (leftover): the turn is protected until the hold's
    /// `expires_at`, and a cancel through the edge ends it at once — unless
    /// another hold of the person may still exist; a replayed grant of a
    /// cancelled hold does not revive it.
    #[test]
    fn a_hold_protects_until_its_expiry_and_a_cancel_ends_it() {
        let s = shard();
        s.join(SALE, body("a", START + 100), START + 100, keys)
            .unwrap();
        let seen = |at: u64| {
            s.seen(
                &SeenBody {
                    seen: vec![("a".into(), 1, at)],
                },
                at,
            )
            .unwrap()
        };
        let turns_at = |now: u64| {
            let r = s.report(now, 0).unwrap().unwrap();
            s.report_sent(&r).unwrap();
            r.turns
        };
        seen(START + 500);
        let expires = START + 600_000;
        s.held(&hold("a", Some("r1"), Some(expires)), START + 1_100)
            .unwrap();
        assert_eq!(turns_at(START + 2_000), vec![(1, START + 1_100, expires)]);
        // A second hold ending later, then the first cancelled: the second
        // still protects.
        s.held(&hold("a", Some("r2"), Some(expires + 5_000)), START + 2_100)
            .unwrap();
        s.released(&hold("a", Some("r1"), None), START + 3_100)
            .unwrap();
        assert_eq!(
            turns_at(START + 4_000),
            vec![(1, START + 2_100, expires + 5_000)]
        );
        // Both cancelled: the protection ends at the last cancel.
        s.released(&hold("a", Some("r2"), None), START + 4_100)
            .unwrap();
        assert_eq!(
            turns_at(START + 5_000),
            vec![(1, START + 2_100, START + 4_100)]
        );
        // The first grant replayed (same reservation): still cancelled.
        s.held(&hold("a", Some("r1"), Some(expires)), START + 5_100)
            .unwrap();
        assert_eq!(
            turns_at(START + 6_000),
            vec![(1, START + 5_100, START + 4_100)]
        );
        // A grant's end never reaches past the origin's bound on holds.
        s.held(&hold("a", Some("r3"), Some(u64::MAX / 2)), START + 6_100)
            .unwrap();
        assert_eq!(
            turns_at(START + 7_000),
            vec![(1, START + 6_100, START + 6_100 + turns::MAX_HOLD_MS)]
        );
    }

    /// Objects stored before holds had an end (a `held` flag only) keep
    /// working: such a turn is held for the longest a hold can live from
    /// its last report, not forever, and a cancel ends it.
    #[test]
    fn a_turn_held_before_ends_were_recorded_is_bounded() {
        let sql = MemSql::new();
        sql.exec(
            "CREATE TABLE turns (sub TEXT PRIMARY KEY, place INTEGER NOT NULL,
                 seen_ms INTEGER NOT NULL, held INTEGER NOT NULL DEFAULT 0,
                 reported INTEGER NOT NULL DEFAULT 0)",
            &[],
        )
        .unwrap();
        sql.exec(
            "INSERT INTO turns (sub, place, seen_ms, held, reported) VALUES ('a', 1, ?, 1, 0)",
            &[(START + 1_000).into()],
        )
        .unwrap();
        let s = Entries::open(sql).unwrap();
        s.configure(SALE, 0, 1, START, None).unwrap();
        let r = s.report(START + 2_000, 0).unwrap().unwrap();
        assert_eq!(
            r.turns,
            vec![(1, START + 1_000, START + 1_000 + turns::MAX_HOLD_MS)]
        );
        s.report_sent(&r).unwrap();
        s.released(&hold("a", Some("r"), None), START + 3_000)
            .unwrap();
        let r = s.report(START + 4_000, 0).unwrap().unwrap();
        assert_eq!(r.turns, vec![(1, START + 1_000, START + 3_000)]);
    }

    #[test]
    fn each_finished_second_is_reported_once_with_the_turns_seen() {
        let s = shard();
        s.join(SALE, body("a", START + 100), START + 100, keys)
            .unwrap();
        s.join(SALE, body("b", START + 900), START + 900, keys)
            .unwrap();
        s.join(SALE, body("c", START + 1_200), START + 1_200, keys)
            .unwrap();
        assert_eq!(
            s.report(START + 999, 0).unwrap(),
            None,
            "no second finished"
        );
        let r = s.report(START + 1_500, 3).unwrap().unwrap();
        assert_eq!(r.through, Some(START / 1000));
        let seconds = &r.body["seconds"];
        assert_eq!(
            seconds[0]["stamps"],
            json!([[START + 100, 1], [START + 900, 2]])
        );
        s.report_sent(&r).unwrap();
        // An arrival stamped (by the Worker) in a reported second lands in
        // the unreported one, never before the shard's last stamp.
        let d = s
            .join(SALE, body("d", START + 700), START + 1_600, keys)
            .unwrap();
        assert_eq!(
            ticket(&d, START + 1_600).tkt.unwrap().t_ms,
            Some(START + 1_200)
        );
        s.seen(
            &SeenBody {
                seen: vec![("a".into(), 1, START + 1_700)],
            },
            START + 1_800,
        )
        .unwrap();
        let r = s.report(START + 2_100, 3).unwrap().unwrap();
        assert_eq!(
            r.body["seconds"][0]["stamps"],
            json!([[START + 1_200, 3], [START + 1_200, 4]])
        );
        assert_eq!(r.turns, vec![(1, START + 1_700, 0)]);
        // Seen again before the coordinator answered: reported again later.
        s.seen(
            &SeenBody {
                seen: vec![("a".into(), 1, START + 1_900)],
            },
            START + 2_150,
        )
        .unwrap();
        s.report_sent(&r).unwrap();
        s.held(&hold("a", Some("r"), Some(START + 60_000)), START + 2_200)
            .unwrap();
        let r = s.report(START + 3_100, 3).unwrap().unwrap();
        assert_eq!(r.turns, vec![(1, START + 2_200, START + 60_000)]);
        s.report_sent(&r).unwrap();
        let r = s.report(START + 4_100, 3).unwrap().unwrap();
        assert!(r.turns.is_empty(), "reported once");
    }

    #[test]
    fn a_revoked_turn_is_reported_revoked_once_its_place_is_known() {
        let s = shard();
        s.join(SALE, body("a", START + 100), START + 100, keys)
            .unwrap();
        s.join(SALE, body("b", START + 200), START + 200, keys)
            .unwrap();
        // Revoked before any poll while admitted: no place to report yet.
        let v = s.revoke(&hold("b", None, None), START + 1_100).unwrap();
        assert_eq!(v, json!({"revoked": true, "place": null}));
        s.seen(
            &SeenBody {
                seen: vec![("a".into(), 1, START + 1_200)],
            },
            START + 1_300,
        )
        .unwrap();
        let r = s.report(START + 2_100, 0).unwrap().unwrap();
        assert_eq!(r.body["revoked"], json!([]), "a was not revoked");
        s.report_sent(&r).unwrap();
        // b's first poll gives the row its place: reported revoked then.
        s.seen(
            &SeenBody {
                seen: vec![("b".into(), 2, START + 2_200)],
            },
            START + 2_300,
        )
        .unwrap();
        let r = s.report(START + 3_100, 0).unwrap().unwrap();
        assert_eq!(r.body["revoked"], json!([2]));
        assert_eq!(r.body["at_ms"], START + 3_100);
        s.report_sent(&r).unwrap();
        // a, seen and then revoked: reported with the next report, once.
        let v = s.revoke(&hold("a", None, None), START + 3_200).unwrap();
        assert_eq!(v["place"], 1);
        let r = s.report(START + 4_100, 0).unwrap().unwrap();
        assert_eq!(r.body["revoked"], json!([1]));
        s.report_sent(&r).unwrap();
        let r = s.report(START + 5_100, 0).unwrap().unwrap();
        assert_eq!(r.body["revoked"], json!([]), "once");
    }

    #[test]
    fn a_revoke_is_reported_at_once_not_when_the_second_ends() {
        let s = shard();
        s.join(SALE, body("a", START + 100), START + 100, keys)
            .unwrap();
        s.join(SALE, body("b", START + 200), START + 200, keys)
            .unwrap();
        s.seen(
            &SeenBody {
                seen: vec![("a".into(), 1, START + 1_200)],
            },
            START + 1_300,
        )
        .unwrap();
        let r = s.report(START + 2_050, 0).unwrap().unwrap();
        s.report_sent(&r).unwrap();
        // Second 2 has not ended: nothing to say but the revoke, said now.
        s.revoke(&hold("a", None, None), START + 2_400).unwrap();
        let r = s.report(START + 2_410, 0).unwrap().expect("a report now");
        assert_eq!(r.body["revoked"], json!([1]));
        assert_eq!(r.body["seconds"], json!([]), "no second is cut short");
        assert_eq!(r.through, None, "the watermark does not move");
        s.report_sent(&r).unwrap();
        assert!(s.report(START + 2_420, 0).unwrap().is_none(), "once");
        // The second's own report still comes, whole.
        let r = s.report(START + 3_010, 0).unwrap().unwrap();
        assert_eq!(r.through, Some(START / 1000 + 2));
        assert_eq!(r.body["revoked"], json!([]));
    }

    #[test]
    fn before_the_start_the_report_is_a_count() {
        let s = shard();
        s.join(SALE, body("a", START - 5), START - 5, keys).unwrap();
        let r = s.report(START - 1, 2).unwrap().unwrap();
        assert_eq!(r.body, json!({"shard": 0, "prequeue": 1, "requests": 2}));
        assert_eq!(r.through, None);
    }

    #[test]
    fn bulk_loads_this_shards_entrants_before_the_start_only() {
        let s = shard();
        let b = |shard| BulkBody {
            prefix: "bot".into(),
            from: 0,
            to: 100,
            shard,
            shards: 2,
            starts_at_ms: START,
        };
        let (v, at) = s.bulk(SALE, b(1), START - 10_000).unwrap();
        let mine = (0..100)
            .filter(|i| shards::shard_of(&format!("bot-{i}"), 2) == 1)
            .count();
        assert_eq!(v["added"], mine as u64);
        assert_eq!(at, START - 9_000);
        let (again, _) = s.bulk(SALE, b(1), START - 9_000).unwrap();
        assert_eq!(again["added"], 0, "idempotent");
        assert_eq!(s.bulk(SALE, b(1), START).unwrap_err().code, "queue_started");
    }

    #[test]
    fn the_alarm_comes_each_second_and_never_after_one_asked_for() {
        assert_eq!(
            next_alarm(START - 5_000, START, u64::MAX, true, None),
            Some(START)
        );
        assert_eq!(
            next_alarm(START - 5_000, START, u64::MAX, false, None),
            Some(START - 4_000)
        );
        assert_eq!(
            next_alarm(START + 1_234, START, u64::MAX, true, None),
            Some(START + 2_050)
        );
        assert_eq!(
            next_alarm(START + 1_234, START, u64::MAX, true, Some(START + 1_500)),
            Some(START + 1_500)
        );
        let end = START + 60_000;
        assert_eq!(
            next_alarm(end + REPORT_AFTER_END_MS, START, end, true, None),
            None
        );
        assert!(!draw_due(START + DRAW_GRACE_MS - 1, START));
        assert!(draw_due(START + DRAW_GRACE_MS, START));
        assert!(counts_as_isolate_call("/join"));
        assert!(!counts_as_isolate_call("/leaves"));
    }

    #[test]
    fn pages_are_bounded_and_hex() {
        assert!(page_of(Some("zz".into()), Some("5".into())).is_err());
        assert!(page_of(None, Some("0".into())).is_err());
        assert!(page_of(None, Some((PAGE_MAX + 1).to_string())).is_err());
        assert!(page_of(None, None).is_err());
        assert_eq!(
            page_of(Some("ab".into()), Some("5".into())).unwrap(),
            ("ab".into(), 5)
        );
    }
}
