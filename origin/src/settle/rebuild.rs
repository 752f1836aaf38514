//! The cold rebuild, the reconciler's answer to a shard whose keys are gone
//! (`crate::settle::reconcile::reconcile_sale` finds it).
//!
//! A shard whose keys are gone (Redis restarted without persistence) is
//! rebuilt from Postgres (stock, holds with expiries, per-user counts and
//! spill quota of accounts whose home it is): staged in chunks under keys
//! of the rebuild's own (rebuild_stage.lua), then swapped in with the stock
//! by one short script (rebuild.lua), so no step blocks Redis for long
//! whatever the sale's size, and nothing sees the shard half rebuilt. Holds
//! granted but not yet settled when Redis lost them never reached the truth:
//! those units are for sale again, and no unit Postgres knows is lost.

use std::collections::HashMap;

use chrono::Utc;
use redis::AsyncCommands;
use serde_json::json;
use sqlx::PgPool;

use crate::reserve::engine::{Engine, HoldRecord, IDEMPOTENCY_TTL_SECS, home_shard};
use crate::sales::revoke::revoked_field;
use crate::sales::sale::Sale;
use crate::settle::scan::{HashScan, REBUILD_COLUMNS, RebuildRow, SCAN_CHUNK, key_ttl};

/// A hold or release record still in a surviving shard's stream, as far as
/// a rebuild needs it to restore the hold's Idempotency-Key record.
struct StreamHold {
    id: String,
    shard: usize,
    home: usize,
    idem: String,
    qty: i64,
    requested: i64,
    expires_ms: i64,
    created_ms: i64,
    /// Its SKU's position, in a sale of several SKUs.
    sku: Option<i64>,
}

impl StreamHold {
    fn parse(e: &redis::streams::StreamId, shard: usize) -> Option<Self> {
        let int = |f: &str| e.get::<String>(f).and_then(|v| v.parse::<i64>().ok());
        // A hold record carries the hold record itself (`lua/_lib.lua`
        // `grant_hold`); older ones, and release records, their fields.
        if let Some(rec) = e.get::<String>("rec") {
            let h = HoldRecord::parse(&rec)?;
            return Some(StreamHold {
                id: e.get("id")?,
                shard,
                home: h.home,
                idem: h.idem.filter(|k| !k.is_empty())?,
                qty: h.qty,
                requested: h.requested.unwrap_or(h.qty),
                expires_ms: i64::try_from(h.expires_ms).ok()?,
                created_ms: i64::try_from(h.created_ms).ok()?,
                sku: h.position,
            });
        }
        let created = match e.get::<String>("t")?.as_str() {
            "hold" => int("at")?,
            "release" => int("created")?,
            _ => return None,
        };
        let idem: String = e.get("idem")?;
        if idem.is_empty() {
            return None;
        }
        let qty = int("qty")?;
        Some(StreamHold {
            id: e.get("id")?,
            shard,
            home: usize::try_from(int("home")?).ok()?,
            idem,
            qty,
            requested: int("rq").unwrap_or(qty),
            expires_ms: int("exp")?,
            created_ms: created,
            sku: int("p"),
        })
    }
}

/// Why a cold rebuild stopped: Redis or Postgres failed it. The reconciler
/// reports it as its own (`ReconcileError`), with the same message.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("postgres: {0}")]
    Db(#[from] sqlx::Error),
}

/// Rebuilds every shard of `sale` whose keys are gone; returns them.
///
/// Where each fact comes from:
/// - holds ON a lost shard, and its stock: Postgres (its stream was lost
///   with it, so holds it had not settled are gone and their units are for
///   sale again);
/// - the per-user counts and spill quota of accounts whose HOME is a lost
///   shard: Postgres for their holds on lost shards, and the surviving
///   shards' own hold records for the rest — settled or not, so a lagging
///   settler cannot make a count too low (no waiting on settlement);
/// - Idempotency-Key records of those accounts: the key hash each hold
///   carries (Postgres, the surviving shards' unsettled stream records —
///   also of holds released since — and the surviving hold records), so a
///   retried key gets its first answer, never a second hold.
///
/// - quota on surviving home shards for spilled holds released on a lost
///   shard (their `unquota` note was lost with it): given back when
///   Postgres says the hold is no longer live.
///
/// - take.lua's decision markers on a lost shard: from where each spilled
///   hold landed (Postgres and surviving records), so a replayed spill
///   never decides twice.
///
/// Key records are restored (`SET NX`) before rebuild.lua sets the stock:
/// until then the shard answers UNINITIALIZED, so nothing races them.
/// While a home shard is lost its accounts cannot start a reservation; only
/// a spill already under way when it was lost can still land a hold (then
/// counted if it landed before this rebuild reads the surviving shards).
pub async fn rebuild_sale(
    engine: &Engine,
    pool: &PgPool,
    sale: &Sale,
) -> Result<Vec<usize>, RebuildError> {
    let cfg = &sale.config;
    let mut conn = engine.conn.clone();
    let mut lost = Vec::new();
    for (i, k) in sale.shards.iter().enumerate() {
        let exists: bool = conn.exists(&k.stock).await?;
        if !exists {
            lost.push(i);
        }
    }
    if lost.is_empty() {
        return Ok(lost);
    }
    // Holds on surviving shards, as those shards hold them now. A scan is
    // not a snapshot, and need not be: a hold that comes or goes while it
    // runs is seen or not, as by a read just before or after it, and the
    // whole read was never a snapshot together with Postgres's either.
    let mut surviving: Vec<(String, usize, HoldRecord)> = Vec::new();
    for (i, k) in sale.shards.iter().enumerate() {
        if lost.contains(&i) {
            continue;
        }
        // In chunks, not one HGETALL (~90 ms of Redis per 100,000 holds).
        // HSCAN may return a field twice: the map keeps each hold once.
        let mut holds: HashMap<String, String> = HashMap::new();
        let mut scan = HashScan::new(&k.holds);
        while let Some(chunk) = scan.next(engine).await? {
            holds.extend(chunk);
        }
        for (id, raw) in holds {
            if let Some(h) = HoldRecord::parse(&raw) {
                surviving.push((id, i, h));
            }
        }
    }
    // Holds and releases surviving shards have not settled yet: Postgres
    // does not know them, and a released hold is gone from the records
    // above, yet its Idempotency-Key must still get its first answer.
    let mut unsettled: Vec<StreamHold> = Vec::new();
    for (i, k) in sale.shards.iter().enumerate() {
        if lost.contains(&i) {
            continue;
        }
        // In chunks, not one XRANGE of the whole stream: a backlog of
        // 100,000 entries (Postgres slow or down) held Redis for 47-65 ms,
        // and a debug build's reply went past the connection's 2 s timeout.
        let mut from = "-".to_string();
        loop {
            let page: redis::streams::StreamRangeReply =
                conn.xrange_count(&k.stream, &from, "+", SCAN_CHUNK).await?;
            unsettled.extend(page.ids.iter().filter_map(|e| StreamHold::parse(e, i)));
            match page.ids.last() {
                Some(last) if page.ids.len() == SCAN_CHUNK => from = format!("({}", last.id),
                _ => break,
            }
        }
    }
    let since = Utc::now() - chrono::Duration::seconds(IDEMPOTENCY_TTL_SECS as i64);
    let rows: Vec<RebuildRow> = sqlx::query_as(&format!(
        "SELECT {REBUILD_COLUMNS}
         FROM reservations
         WHERE sale_id = $1 AND (status IN ('settled', 'pending_payment', 'paid')
                                 OR (idem IS NOT NULL AND created_at > $2))"
    ))
    .bind(&cfg.id)
    .bind(since)
    .fetch_all(pool)
    .await?;
    let multi = sale.multi_sku();
    let rows: Vec<RebuildRow> = rows.into_iter().map(|r| r.in_sale(multi)).collect();
    // Revoked admissions (`sales::revoke`) are marked in their home shard's
    // users hash: a rebuilt shard gets its marks back, or a revoked
    // account could hold again.
    let revoked: Vec<String> =
        sqlx::query_scalar("SELECT account FROM revocations WHERE sale_id = $1")
            .bind(&cfg.id)
            .fetch_all(pool)
            .await?;
    let now_ms = Utc::now().timestamp_millis();
    let mut rebuilt = Vec::new();
    for &i in &lost {
        let k = &sale.shards[i];
        let on_shard: Vec<&RebuildRow> = rows
            .iter()
            .filter(|r| r.live() && r.shard as usize == i)
            .collect();
        // Each SKU placed here: its share less its live holds here.
        let stocks: Vec<(i32, i64)> = cfg
            .skus
            .iter()
            .enumerate()
            .filter(|(p, _)| *p == 0 || sale.placements[*p].holds(i))
            .map(|(p, sku)| {
                let p = p as i32;
                let held: i64 = on_shard
                    .iter()
                    .filter(|r| r.sku.unwrap_or(0) == p)
                    .map(|r| i64::from(r.qty))
                    .sum();
                (
                    p,
                    i64::from(sale.placement(p).units_on(sku.units_total, i)) - held,
                )
            })
            .collect();
        let stock = stocks.first().map_or(0, |(_, s)| *s);
        let other_stocks: Vec<_> = stocks[1..].iter().map(|(p, s)| json!([p, s])).collect();
        let holds: Vec<_> = on_shard
            .iter()
            .map(|r| json!([r.id, r.hold_record()]))
            .collect();
        // Every hold of an account whose home is i: (id, account, qty,
        // shard, SKU position in a sale of several).
        let mut owed: Vec<(&str, &str, i64, usize, Option<i64>)> = rows
            .iter()
            .filter(|r| r.live() && r.home as usize == i && lost.contains(&(r.shard as usize)))
            .map(|r| {
                (
                    r.id.as_str(),
                    r.account.as_str(),
                    i64::from(r.qty),
                    r.shard as usize,
                    r.sku.map(i64::from),
                )
            })
            .collect();
        owed.extend(
            surviving
                .iter()
                .filter(|(_, _, h)| h.home == i)
                .map(|(id, s, h)| (id.as_str(), h.account.as_str(), h.qty, *s, h.position)),
        );
        // The sale-wide counts, and each SKU's under the field
        // `lua/_lib.lua` `sku_field` names.
        let mut users: HashMap<String, i64> = HashMap::new();
        for a in revoked
            .iter()
            .filter(|a| home_shard(a, sale.shards.len()) == i)
        {
            users.insert(revoked_field(a), 1);
        }
        let mut quota = Vec::new();
        for (id, account, qty, shard, sku) in &owed {
            *users.entry(account.to_string()).or_default() += qty;
            if let Some(p) = sku {
                *users.entry(format!("{account}\n{p}")).or_default() += qty;
            }
            if *shard != i {
                let mut q = json!({"a": account, "q": qty, "s": shard});
                if let Some(p) = sku {
                    q["p"] = json!(p);
                }
                quota.push(json!([id, q]));
            }
        }
        // Key records: from Postgres, then the surviving holds (newer).
        let mut idem: HashMap<&str, (serde_json::Value, i64)> = HashMap::new();
        for r in rows.iter().filter(|r| r.home as usize == i) {
            let Some(hash) = &r.idem else { continue };
            idem.insert(hash, (r.key_record(), r.created_at.timestamp_millis()));
        }
        for u in unsettled.iter().filter(|u| u.home == i) {
            let mut rec = json!({"st": "held", "id": u.id, "sh": u.shard, "e": u.expires_ms, "q": u.qty,
                             "rq": u.requested});
            if let Some(p) = u.sku {
                rec["p"] = json!(p);
            }
            idem.insert(&u.idem, (rec, u.created_ms));
        }
        for (id, s, h) in surviving.iter().filter(|(_, _, h)| h.home == i) {
            let Some(hash) = &h.idem else { continue };
            let mut rec = json!({"st": "held", "id": id, "sh": s, "e": h.expires_ms, "q": h.qty,
                             "rq": h.requested.unwrap_or(h.qty)});
            if let Some(p) = h.position {
                rec["p"] = json!(p);
            }
            idem.insert(hash, (rec, h.created_ms as i64));
        }
        // take.lua's once-only decisions on this shard for spills from other
        // homes: HELD where a spilled hold landed here, EMPTY where a spill
        // walked past this shard to land further on. Without them a replay
        // of a spill whose quota_commit never ran would decide again: grant
        // the same hold id twice, or give back the quota of a live hold.
        // A spill walks only its SKU's shards (`Placement::others`).
        let n = sale.shards.len();
        let mut markers: Vec<(String, &str, i64)> = Vec::new();
        let spills = rows
            .iter()
            .map(|r| {
                (
                    r.id.as_str(),
                    r.home as usize,
                    r.shard as usize,
                    r.created_at.timestamp_millis(),
                    r.sku.unwrap_or(0),
                )
            })
            .chain(surviving.iter().map(|(id, s, h)| {
                (
                    id.as_str(),
                    h.home,
                    *s,
                    h.created_ms as i64,
                    h.position.and_then(|p| i32::try_from(p).ok()).unwrap_or(0),
                )
            }));
        for (id, home, shard, created_ms, sku) in spills {
            if home == shard || home >= n || shard >= n {
                continue;
            }
            let walked_past = sale
                .placement(sku)
                .others(home)
                .take_while(|s| *s != shard)
                .any(|s| s == i);
            if shard == i {
                markers.push((k.spill_marker(id), "H", created_ms));
            } else if walked_past {
                markers.push((k.spill_marker(id), "E", created_ms));
            }
        }
        let mut pipe = redis::pipe();
        let mut restoring = 0;
        let records = idem
            .iter()
            .map(|(hash, (rec, created_ms))| (k.idem_at(hash), rec.to_string(), *created_ms))
            .chain(
                markers
                    .into_iter()
                    .map(|(key, v, c)| (key, v.to_string(), c)),
            );
        for (key, value, created_ms) in records {
            let ttl = key_ttl(created_ms, now_ms);
            if ttl > 0 {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("NX")
                    .arg("EX")
                    .arg(ttl)
                    .ignore();
                restoring += 1;
            }
        }
        // Redis refuses an empty pipeline ("empty command"): a shard with
        // no key records to restore must still be rebuilt.
        if restoring > 0 {
            let _: () = pipe.query_async(&mut conn).await?;
        }
        let users: Vec<_> = users.into_iter().map(|(a, n)| json!([a, n])).collect();
        // What rebuild.lua must find staged before it swaps the copy in.
        let expiring = on_shard.iter().filter(|r| r.status != "paid").count();
        let counts = [holds.len(), expiring, users.len(), quota.len()];
        let staging = k.rebuild_staging(&uuid::Uuid::new_v4().simple().to_string());
        for chunk in stage_chunks(holds, users, quota, REBUILD_CHUNK) {
            let staged: i64 = engine
                .scripts
                .rebuild_stage
                .key(&k.stock)
                .key(staging.as_slice())
                .arg(chunk.to_string())
                .arg(REBUILD_STAGING_TTL_MS)
                .invoke_async(&mut conn)
                .await?;
            if staged == 0 {
                // Rebuilt meanwhile by another rebuild: rebuild.lua below
                // refuses too, and drops what this one staged.
                break;
            }
        }
        let done: i64 = engine
            .scripts
            .rebuild
            .key(k.all().as_slice())
            .key(staging.as_slice())
            .arg(stock)
            .arg(counts.as_slice())
            .arg(if other_stocks.is_empty() {
                String::new()
            } else {
                serde_json::Value::Array(other_stocks).to_string()
            })
            .invoke_async(&mut conn)
            .await?;
        if done == -1 {
            tracing::warn!(sale = %cfg.id, shard = i, "rebuild: the staged copy was not all there (Redis lost data again, or it expired); the shard stays lost until the next rebuild");
        }
        if done == 1 {
            tracing::warn!(sale = %cfg.id, shard = i, stock, holds = on_shard.len(), keys = idem.len(), "rebuilt shard from Postgres and the surviving shards");
            metrics::counter!("flashsale_rebuilt_shards_total").increment(1);
            rebuilt.push(i);
        }
    }
    return_lost_notes(engine, pool, sale, &lost).await?;
    Ok(rebuilt)
}

/// Entries (holds, account counts, quota) per `lua/rebuild_stage.lua` call:
/// ~10 µs of Redis each, so one call blocks Redis for ~5 ms.
const REBUILD_CHUNK: usize = 500;

/// How long a rebuild's staging keys outlive its last chunk if it never
/// swaps them in (its process died), so such a rebuild leaves nothing
/// behind for long.
const REBUILD_STAGING_TTL_MS: u64 = 600_000;

/// One lost shard's entries in the chunks `lua/rebuild_stage.lua` stages,
/// each at most `size` entries: the holds, then the account counts, then
/// the quota, in the order given. No chunk for a shard with no entries.
fn stage_chunks(
    holds: Vec<serde_json::Value>,
    users: Vec<serde_json::Value>,
    quota: Vec<serde_json::Value>,
    size: usize,
) -> Vec<serde_json::Value> {
    let size = size.max(1);
    let entries = holds
        .into_iter()
        .map(|e| ("holds", e))
        .chain(users.into_iter().map(|e| ("users", e)))
        .chain(quota.into_iter().map(|e| ("quota", e)));
    let empty = || json!({"holds": [], "users": [], "quota": []});
    let mut chunks = Vec::new();
    let mut chunk = empty();
    let mut n = 0;
    for (list, entry) in entries {
        if let Some(l) = chunk[list].as_array_mut() {
            l.push(entry);
        }
        n += 1;
        if n == size {
            chunks.push(std::mem::replace(&mut chunk, empty()));
            n = 0;
        }
    }
    if n > 0 {
        chunks.push(chunk);
    }
    chunks
}

/// A spilled hold released on a lost shard left an `unquota` note there for
/// its home shard's count; if the sweep had not carried it over, the note
/// was lost with the shard. Postgres says which of those holds are no longer
/// live: their quota goes back now (quota_return.lua: at most once per hold
/// id, so a note carried over meanwhile changes nothing). A hold Postgres
/// never heard of keeps its quota: the count stays on the safe side.
async fn return_lost_notes(
    engine: &Engine,
    pool: &PgPool,
    sale: &Sale,
    lost: &[usize],
) -> Result<(), RebuildError> {
    let mut conn = engine.conn.clone();
    for (h, k) in sale.shards.iter().enumerate() {
        if lost.contains(&h) {
            continue;
        }
        let quota: HashMap<String, String> = conn.hgetall(&k.quota).await?;
        let ids: Vec<&String> = quota.keys().collect();
        if ids.is_empty() {
            continue;
        }
        let lost_shards: Vec<i32> = lost.iter().map(|&i| i as i32).collect();
        let over: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM reservations
             WHERE sale_id = $1 AND id = ANY($2) AND shard = ANY($3)
               AND status NOT IN ('settled', 'pending_payment', 'paid')",
        )
        .bind(&sale.config.id)
        .bind(&ids)
        .bind(&lost_shards)
        .fetch_all(pool)
        .await?;
        for id in over {
            if engine.give_back_quota(k, &id).await? {
                tracing::warn!(sale = %sale.config.id, shard = h, hold = %id, "rebuild: returned the quota of a released hold whose note was lost");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{StreamHold, stage_chunks};
    use crate::settle::settler::fixtures::{HOLD_AS_FIELDS, HOLD_AS_REC};
    use redis::Value;
    use redis::streams::StreamId;

    fn entry(kv: &[(&str, &str)]) -> StreamId {
        StreamId {
            id: "1-0".into(),
            map: kv
                .iter()
                .map(|(k, v)| (k.to_string(), Value::BulkString(v.as_bytes().to_vec())))
                .collect(),
            ..Default::default()
        }
    }

    /// A rebuild finds an unsettled hold's Idempotency-Key in its stream
    /// record, whichever layout wrote it (`lua/_lib.lua` `grant_hold` writes
    /// the hold record as `rec`; older origins and `lua/restore.lua` wrote
    /// its fields).
    #[test]
    fn an_unsettled_hold_reads_the_same_from_its_rec_as_from_its_fields() {
        let new = entry(HOLD_AS_REC);
        let old = entry(HOLD_AS_FIELDS);
        for e in [&new, &old] {
            let h = StreamHold::parse(e, 2).expect("an unsettled hold");
            assert_eq!(
                (h.id.as_str(), h.shard, h.home, h.idem.as_str()),
                ("s.1.x", 2, 1, "abc")
            );
            assert_eq!(
                (h.qty, h.requested, h.expires_ms, h.created_ms),
                (2, 3, 1_700_000_060_000, 1_700_000_000_000)
            );
        }
        let no_key = entry(&[
            ("t", "hold"),
            ("id", "s.1.y"),
            ("rec", r#"{"a":"al","q":1,"e":1,"h":1,"c":1,"s":"held"}"#),
        ]);
        assert!(StreamHold::parse(&no_key, 2).is_none(), "no key to restore");
    }

    /// Every entry is staged once, in order, in its own list, and no chunk
    /// is over the size or empty.
    #[test]
    fn a_shards_entries_are_staged_in_chunks_of_at_most_the_size() {
        let list = |tag: &str, n: usize| -> Vec<serde_json::Value> {
            (0..n)
                .map(|i| serde_json::json!(format!("{tag}{i}")))
                .collect()
        };
        let chunks = stage_chunks(list("h", 5), list("u", 3), list("q", 2), 4);
        let sizes: Vec<usize> = chunks
            .iter()
            .map(|c| {
                ["holds", "users", "quota"]
                    .iter()
                    .map(|l| c[*l].as_array().unwrap().len())
                    .sum()
            })
            .collect();
        assert_eq!(sizes, vec![4, 4, 2]);
        for (list_name, tag, n) in [("holds", "h", 5), ("users", "u", 3), ("quota", "q", 2)] {
            let staged: Vec<serde_json::Value> = chunks
                .iter()
                .flat_map(|c| c[list_name].as_array().unwrap().clone())
                .collect();
            assert_eq!(staged, list(tag, n), "{list_name}");
        }
        assert!(stage_chunks(vec![], vec![], vec![], 4).is_empty());
    }
}
