//! What an operator asks of a sale (`origin sale create`, `sale update`,
//! `sale end`), checked, and applied: creation writes the Postgres row and
//! the Redis stock split over the shards; a change touches only what may
//! change on a sale that exists.
//!
//! Invariants kept here:
//! - `sale create` never overwrites live Redis stock: it refuses when any of
//!   the sale's keys already exist;
//! - units, shards, the per-user limit and the hold time never change after
//!   creation: Redis stock, holds and per-user counts were laid out by them.

use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use sqlx::PgPool;

use crate::reserve::store::{RedisConn, ShardKeys, choose_tags, ensure_group, master_slot_ranges};
use crate::sales::bounds::{MAX_PER_USER_LIMIT, MAX_PRICE_CENTS, MAX_UNITS};
use crate::sales::placement::Placement;
use crate::sales::sale::{COLUMNS, SaleConfig, load_sale, valid_sale_id, with_skus};
use crate::sales::sku::{SkuSpec, validate_skus};

/// What `origin sale create` asks for.
#[derive(Debug, Clone)]
pub struct SaleSpec {
    pub id: String,
    pub name: String,
    /// The units of a sale of one SKU given the old way (`--units`,
    /// `--price-cents`); 0 when [`SaleSpec::skus`] lists the SKUs.
    pub units: i32,
    pub per_user_limit: i32,
    pub shards: i32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: Option<DateTime<Utc>>,
    pub hold_seconds: i32,
    pub admission_rate: f64,
    pub admission_factor: f64,
    pub price_cents: i64,
    /// Edge queue shards, `1..=MAX_QUEUE_SHARDS`.
    pub queue_shards: i32,
    /// p99 target of the reservation path (ms) for the edge's controller.
    pub admission_p99_ms: f64,
    /// `none`, `pow:<1-32>` or `turnstile` (see [`valid_bot_check`]).
    pub bot_check: String,
    /// A failed bot check gets a shadow place instead of an error.
    pub bot_shadow: bool,
    /// Joins per address per minute, one of [`JOIN_LIMITS`] (0: no limit).
    pub join_limit: i32,
    /// ISO 4217 currency code of the price (see [`valid_currency`]).
    pub currency: String,
    /// Base URL of a drand-style beacon (see [`valid_beacon_url`]), or none.
    pub draw_beacon: Option<String>,
    /// What the sale sells (`--sku`, `--skus`); empty: one SKU of `units`
    /// at `price_cents`, whose id is the sale's and whose name the sale's.
    pub skus: Vec<SkuSpec>,
}

/// Highest proof-of-work difficulty a sale may ask for (the edge's
/// `botcheck::MAX_POW_BITS`).
pub const MAX_POW_BITS: u32 = 32;

/// The per-address join limits a sale may choose (joins per minute; 0 =
/// none): each is a rate-limiting binding of the edge (`JOIN_LIMIT_<n>` in
/// wrangler.toml), which counts across isolates with a limit fixed in
/// configuration, so a sale picks one of them.
pub const JOIN_LIMITS: [i32; 6] = [0, 10, 30, 100, 300, 1000];
/// The default: generous enough for the many people behind one shared
/// address at a drop (a carrier's NAT), while one machine cannot join more
/// than 1,000 accounts a minute.
pub const DEFAULT_JOIN_LIMIT: i32 = 1000;

/// Whether `text` is a bot check the edge knows: `none`, `turnstile` or
/// `pow:<1-32>` (plain decimal, no sign or leading zero).
pub fn valid_bot_check(text: &str) -> bool {
    match text {
        "none" | "turnstile" => true,
        _ => text.strip_prefix("pow:").is_some_and(|b| {
            !b.is_empty()
                && b.len() <= 2
                && !b.starts_with('0')
                && b.bytes().all(|c| c.is_ascii_digit())
                && b.parse::<u32>()
                    .is_ok_and(|n| (1..=MAX_POW_BITS).contains(&n))
        }),
    }
}

/// Whether `code` looks like an ISO 4217 currency code: three ASCII
/// capitals (the page hands it to `Intl.NumberFormat`, which refuses
/// anything else; which codes exist is the shop's business).
pub fn valid_currency(code: &str) -> bool {
    code.len() == 3 && code.bytes().all(|c| c.is_ascii_uppercase())
}

/// Whether `url` can name a draw beacon: an absolute `http` or `https` URL
/// with a host and no query or fragment (the edge appends `/info` and
/// `/public/<round>`), at most 512 bytes.
pub fn valid_beacon_url(url: &str) -> bool {
    url.len() <= 512
        && url::Url::parse(url).is_ok_and(|u| {
            matches!(u.scheme(), "http" | "https")
                && u.host().is_some()
                && u.query().is_none()
                && u.fragment().is_none()
                && u.username().is_empty()
                && u.password().is_none()
        })
}

/// The currency of a sale created without `--currency`.
pub const DEFAULT_CURRENCY: &str = "EUR";

/// Most queue shards a sale may have (the edge's `shards::MAX_SHARDS`).
pub const MAX_QUEUE_SHARDS: i32 = 256;

/// Why a sale could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("invalid sale: {0}")]
    Invalid(String),
    #[error("sale {0:?} already exists")]
    Exists(String),
    #[error("Redis already holds keys for sale {0:?}; refusing to overwrite live stock")]
    RedisKeysExist(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

impl SaleSpec {
    fn validate(&self) -> Result<(), CreateError> {
        let bad = |m: &str| Err(CreateError::Invalid(m.to_string()));
        if !valid_sale_id(&self.id) {
            return bad(
                "--sale must be 1-64 of a-z, 0-9, '-', '_' and start with a letter or digit",
            );
        }
        if self.name.trim().is_empty() || self.name.len() > 200 {
            return bad("--name must be 1-200 characters");
        }
        if self.skus.is_empty() {
            if !(1..=MAX_UNITS).contains(&self.units) {
                return bad(&format!(
                    "--units must be 1-{MAX_UNITS} (or list the SKUs with --sku / --skus)"
                ));
            }
            if !(0..=MAX_PRICE_CENTS).contains(&self.price_cents) {
                return bad(&format!("--price-cents must be 0-{MAX_PRICE_CENTS}"));
            }
        } else if self.units != 0 || self.price_cents != 0 {
            return bad(
                "--units and --price-cents describe a sale of one SKU: give them, or the SKUs (--sku / --skus), not both",
            );
        }
        if !(1..=MAX_PER_USER_LIMIT).contains(&self.per_user_limit) {
            return bad(&format!("--per-user-limit must be 1-{MAX_PER_USER_LIMIT}"));
        }
        let skus = self.sku_specs();
        validate_skus(&skus, self.per_user_limit).map_err(CreateError::Invalid)?;
        let units = self.units_total();
        if !(1..=256).contains(&self.shards) || i64::from(self.shards) > units {
            return bad("--shards must be 1-256 and not more than the sale's units");
        }
        if !(1..=MAX_QUEUE_SHARDS).contains(&self.queue_shards) {
            return bad(&format!(
                "--queue-shards must be 1-{MAX_QUEUE_SHARDS} (edge queue objects)"
            ));
        }
        if !valid_bot_check(&self.bot_check) {
            return bad(&format!(
                "--bot-check must be none, turnstile or pow:<1-{MAX_POW_BITS}> (difficulty bits)"
            ));
        }
        if !JOIN_LIMITS.contains(&self.join_limit) {
            return bad(&format!(
                "--join-limit must be one of {JOIN_LIMITS:?} (joins per address per minute)"
            ));
        }
        if !(1..=MAX_HOLD_SECONDS).contains(&self.hold_seconds) {
            return bad(&format!(
                "--hold-seconds must be 1-{MAX_HOLD_SECONDS} (a day)"
            ));
        }
        if !valid_rate(self.admission_rate) {
            return bad(RATE_MESSAGE);
        }
        if !valid_factor(self.admission_factor) {
            return bad(FACTOR_MESSAGE);
        }
        if !valid_p99(self.admission_p99_ms) {
            return bad(P99_MESSAGE);
        }
        if !valid_currency(&self.currency) {
            return bad("--currency must be an ISO 4217 code such as EUR, USD or VND");
        }
        if self
            .draw_beacon
            .as_deref()
            .is_some_and(|u| !valid_beacon_url(u))
        {
            return bad(
                "--draw-beacon must be an http(s) URL of a drand-style beacon (no query, no credentials)",
            );
        }
        if self.ends_at.is_some_and(|e| e <= self.starts_at) {
            return bad("--ends-at must be after --starts-at");
        }
        Ok(())
    }

    /// The SKUs the sale sells: those listed, or the one SKU of a sale
    /// given the old way (id and name the sale's).
    pub fn sku_specs(&self) -> Vec<SkuSpec> {
        if !self.skus.is_empty() {
            return self.skus.clone();
        }
        vec![SkuSpec {
            id: self.id.clone(),
            name: Some(self.name.clone()),
            units: self.units,
            price_cents: self.price_cents,
            per_user_limit: None,
        }]
    }

    /// Units of all SKUs together (at most [`MAX_UNITS`] once validated).
    pub fn units_total(&self) -> i64 {
        self.sku_specs().iter().map(|s| i64::from(s.units)).sum()
    }
}

/// Longest hold: a day. Postgres computes `hold_seconds * 2` (the active
/// sales' window) and Redis expiry stamps in milliseconds.
pub const MAX_HOLD_SECONDS: i32 = 86_400;
/// Highest admission rate, people per second.
pub const MAX_ADMISSION_RATE: f64 = 1_000_000.0;
/// Highest admission factor (the edge's reservation budget per person).
pub const MAX_ADMISSION_FACTOR: f64 = 100.0;

fn valid_rate(r: f64) -> bool {
    r > 0.0 && r <= MAX_ADMISSION_RATE
}

fn valid_factor(f: f64) -> bool {
    f > 0.0 && f <= MAX_ADMISSION_FACTOR
}

const RATE_MESSAGE: &str =
    "--admission-rate must be a positive number of people per second, at most 1000000";
const FACTOR_MESSAGE: &str = "--admission-factor must be positive, at most 100";

/// A p99 target is a positive number of milliseconds (at most a minute).
fn valid_p99(ms: f64) -> bool {
    ms > 0.0 && ms <= 60_000.0
}

const P99_MESSAGE: &str = "--admission-p99-ms must be a number of milliseconds in (0, 60000]";

/// What may change on a sale that exists (`origin sale update` / `end`).
/// Units, shards, the per-user limit and the hold time are fixed at
/// creation: Redis stock, holds and per-user counts were laid out by them.
#[derive(Debug, Clone, Default)]
pub struct SaleChange {
    pub admission_rate: Option<f64>,
    pub admission_factor: Option<f64>,
    pub ends_at: Option<DateTime<Utc>>,
    /// Always refused: see [`change_sale`].
    pub queue_shards: Option<i32>,
    /// Pause (`true`) or resume (`false`) admission at the edge.
    pub paused: Option<bool>,
    pub admission_p99_ms: Option<f64>,
    /// A new start; only before the sale starts (and only to a later time
    /// than now).
    pub starts_at: Option<DateTime<Utc>>,
    /// `Some(Some(text))` posts a message to every waiting page (checked
    /// by [`valid_message`]), `Some(None)` takes it down.
    pub message: Option<Option<String>>,
    /// Answer failed bot checks with a shadow place (`true`) or an error.
    pub bot_shadow: Option<bool>,
    /// Refuse the change (`ChangeError::Started`) once the sale has
    /// started: the admin API's edits, which may change a sale only before.
    pub before_start_only: bool,
}

/// The Postgres channel a sale change is announced on (its id as payload).
pub const SALE_CHANGED_CHANNEL: &str = "flashsale_sale_changed";

/// The longest operator message, in characters.
pub const MAX_MESSAGE_CHARS: usize = 280;

/// Why a message cannot be posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageError {
    /// More than [`MAX_MESSAGE_CHARS`] characters (how many it has).
    TooLong(usize),
    /// A control character (other than a line break) is in it.
    ControlCharacter,
}

/// The message as stored: trimmed; `None` when blank (no message). Markup
/// is kept as typed: pages show it as text, never as HTML.
pub fn valid_message(text: &str) -> Result<Option<String>, MessageError> {
    // Counted as sent (the admin API's document bounds the text it takes).
    let n = text.chars().count();
    let t = text.trim();
    if n > MAX_MESSAGE_CHARS {
        return Err(MessageError::TooLong(n));
    }
    if t.chars().any(|c| c.is_control() && c != '\n') {
        return Err(MessageError::ControlCharacter);
    }
    Ok((!t.is_empty()).then(|| t.to_string()))
}

/// Why a sale could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error("no sale {0:?}")]
    NotFound(String),
    #[error(
        "sale {0:?} has started: only pause, resume, the admission rate, a message, its end and revokes may change now"
    )]
    Started(String),
    #[error("invalid change: {0}")]
    Invalid(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// Applies `change` to sale `id` in one transaction and returns the sale as
/// it now is. Running origins pick it up within their config TTL (5 s) and
/// the edge from them; ending a sale answers `410 sale_ended` from then on
/// while holds already granted stay payable until they expire.
pub async fn change_sale(
    pool: &PgPool,
    id: &str,
    change: &SaleChange,
) -> Result<SaleConfig, ChangeError> {
    let mut tx = pool.begin().await?;
    let (_, changed) = change_sale_in(&mut tx, id, change).await?;
    tx.commit().await?;
    Ok(changed)
}

/// [`change_sale`] inside the caller's transaction (the admin API writes
/// its audit entry in the same one): the sale before and after.
pub async fn change_sale_in(
    tx: &mut sqlx::PgConnection,
    id: &str,
    change: &SaleChange,
) -> Result<(SaleConfig, SaleConfig), ChangeError> {
    let bad = |m: &str| Err(ChangeError::Invalid(m.to_string()));
    // People may join a sale's queue as soon as it exists, and an account's
    // queue shard depends on the count: changing it would move accounts to
    // shards that never saw them (two places, or none).
    if change.queue_shards.is_some() {
        return bad(
            "--queue-shards is fixed when the sale is created: people may already be in its queue",
        );
    }
    if change.admission_rate.is_none()
        && change.admission_factor.is_none()
        && change.ends_at.is_none()
        && change.paused.is_none()
        && change.admission_p99_ms.is_none()
        && change.starts_at.is_none()
        && change.message.is_none()
        && change.bot_shadow.is_none()
    {
        return bad(
            "nothing to change: give --admission-rate, --admission-factor, --admission-p99-ms, --paused, --bot-shadow or --ends-at",
        );
    }
    if let Some(Some(text)) = &change.message
        && valid_message(text) != Ok(Some(text.clone()))
    {
        return bad("the message must be checked by valid_message first");
    }
    if change.admission_p99_ms.is_some_and(|p| !valid_p99(p)) {
        return bad(P99_MESSAGE);
    }
    if change.admission_rate.is_some_and(|r| !valid_rate(r)) {
        return bad(RATE_MESSAGE);
    }
    if change.admission_factor.is_some_and(|f| !valid_factor(f)) {
        return bad(FACTOR_MESSAGE);
    }
    let current: Option<SaleConfig> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM sales WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let current = current.ok_or_else(|| ChangeError::NotFound(id.to_string()))?;
    let now = Utc::now();
    let started = current.starts_at <= now;
    if started && (change.before_start_only || change.starts_at.is_some()) {
        return Err(ChangeError::Started(id.to_string()));
    }
    if let Some(start) = change.starts_at
        && start <= now
    {
        return bad("a new start must be later than now");
    }
    let starts_at = change.starts_at.unwrap_or(current.starts_at);
    if let Some(end) = change.ends_at
        && end <= starts_at
    {
        return bad(&format!(
            "--ends-at must be after the sale's start ({})",
            starts_at.to_rfc3339()
        ));
    }
    if change.starts_at.is_some()
        && change.ends_at.is_none()
        && current.ends_at.is_some_and(|e| e <= starts_at)
    {
        return bad("the new start is not before the sale's end: give a later end too");
    }
    let changed: SaleConfig = sqlx::query_as(&format!(
        "UPDATE sales SET admission_rate = COALESCE($2, admission_rate),
                          admission_factor = COALESCE($3, admission_factor),
                          ends_at = COALESCE($4, ends_at),
                          paused = COALESCE($5, paused),
                          admission_p99_ms = COALESCE($6, admission_p99_ms),
                          starts_at = COALESCE($7, starts_at),
                          message = CASE WHEN $8 THEN $9 ELSE message END,
                          message_at = CASE WHEN $8 THEN now() ELSE message_at END,
                          bot_shadow = COALESCE($10, bot_shadow)
         WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(change.admission_rate)
    .bind(change.admission_factor)
    .bind(change.ends_at)
    .bind(change.paused)
    .bind(change.admission_p99_ms)
    .bind(change.starts_at)
    .bind(change.message.is_some())
    .bind(change.message.clone().flatten())
    .bind(change.bot_shadow)
    .fetch_one(&mut *tx)
    .await?;
    let changed = with_skus(&mut *tx, vec![changed])
        .await?
        .pop()
        .ok_or_else(|| ChangeError::Invalid(format!("sale {id:?} has no SKUs")))?;
    // A change never touches the SKUs.
    let current = SaleConfig {
        skus: changed.skus.clone(),
        ..current
    };
    // Every origin reloads the sale at commit (`SaleRegistry::follow`),
    // instead of within its config TTL.
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(SALE_CHANGED_CHANNEL)
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tracing::info!(sale = %id, ?change, "sale changed");
    Ok((current, changed))
}

/// Writes the sale to Postgres and initializes its stock in Redis.
pub async fn create_sale(
    pool: &PgPool,
    conn: &mut RedisConn,
    prefix: &str,
    spec: &SaleSpec,
) -> Result<SaleConfig, CreateError> {
    spec.validate()?;
    let skus = spec.sku_specs();
    // Bounded by validate (at most MAX_UNITS).
    let units = i32::try_from(spec.units_total())
        .map_err(|_| CreateError::Invalid(format!("a sale has at most {MAX_UNITS} units")))?;
    // `sales.price_cents` is the first SKU's price: what a reader of the
    // one-SKU columns (an older origin, a report) takes for the sale's price.
    let price_cents = skus[0].price_cents;
    let masters = master_slot_ranges(conn).await?;
    let tags = choose_tags(prefix, &spec.id, spec.shards as u32, &masters);
    let keys: Vec<ShardKeys> = tags.iter().map(|t| ShardKeys::new(prefix, t)).collect();
    for k in &keys {
        let exists: bool = conn.exists(&k.stock).await?;
        if exists {
            return Err(CreateError::RedisKeysExist(spec.id.clone()));
        }
    }
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO sales (id, name, price_cents, units_total, per_user_limit, shards, shard_tags,
                            starts_at, ends_at, hold_seconds, admission_rate, admission_factor,
                            queue_shards, admission_p99_ms, bot_check, join_limit, currency,
                            draw_beacon, bot_shadow)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                 $19)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(&spec.id)
    .bind(&spec.name)
    .bind(price_cents)
    .bind(units)
    .bind(spec.per_user_limit)
    .bind(spec.shards)
    .bind(&tags)
    .bind(spec.starts_at)
    .bind(spec.ends_at)
    .bind(spec.hold_seconds)
    .bind(spec.admission_rate)
    .bind(spec.admission_factor)
    .bind(spec.queue_shards)
    .bind(spec.admission_p99_ms)
    .bind(&spec.bot_check)
    .bind(spec.join_limit)
    .bind(&spec.currency)
    .bind(&spec.draw_beacon)
    .bind(spec.bot_shadow)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(CreateError::Exists(spec.id.clone()));
    }
    sqlx::query("INSERT INTO inventory (sale_id, total) VALUES ($1, $2)")
        .bind(&spec.id)
        .bind(units)
        .execute(&mut *tx)
        .await?;
    // One statement for up to MAX_SKUS rows: arrays, unnested in order.
    sqlx::query(
        "INSERT INTO skus (sale_id, id, position, name, price_cents, units_total, per_user_limit)
         SELECT $1, s.id, s.ord - 1, s.name, s.price, s.units, s.lim
           FROM unnest($2::text[], $3::text[], $4::bigint[], $5::int[], $6::int[])
                WITH ORDINALITY AS s(id, name, price, units, lim, ord)",
    )
    .bind(&spec.id)
    .bind(skus.iter().map(|s| s.id.clone()).collect::<Vec<_>>())
    .bind(
        skus.iter()
            .map(|s| s.display_name().to_string())
            .collect::<Vec<_>>(),
    )
    .bind(skus.iter().map(|s| s.price_cents).collect::<Vec<_>>())
    .bind(skus.iter().map(|s| s.units).collect::<Vec<_>>())
    .bind(skus.iter().map(|s| s.per_user_limit).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    // Redis first, then commit: if Redis fails the sale does not exist at
    // all; if the commit fails the orphan keys are refused by a re-run
    // (RedisKeysExist) and visible to the operator.
    //
    // Each SKU's units go to the shards it is placed on (`Placement`); the
    // other SKUs' keys first (one MSET per shard: one slot), then the
    // shard's own `stock` key (position 0's; 0 where position 0 is not
    // placed), which marks the shard live and is the guard against a second
    // create.
    let placements: Vec<Placement> = skus
        .iter()
        .enumerate()
        .map(|(p, s)| Placement::of(s.units, p as i32, skus.len(), keys.len()))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        let others: Vec<(String, i32)> = skus
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(p, _)| placements[*p].holds(i))
            .map(|(p, s)| (k.stock_of(p as i32), placements[p].units_on(s.units, i)))
            .collect();
        if !others.is_empty() {
            let _: () = redis::cmd("MSET").arg(&others).query_async(conn).await?;
        }
        let units = placements[0].units_on(skus[0].units, i);
        let ok: bool = redis::cmd("SET")
            .arg(&k.stock)
            .arg(units)
            .arg("NX")
            .query_async(conn)
            .await?;
        if !ok {
            return Err(CreateError::RedisKeysExist(spec.id.clone()));
        }
        ensure_group(conn, k).await?;
    }
    tx.commit().await?;
    load_sale(pool, &spec.id)
        .await?
        .ok_or_else(|| CreateError::Invalid("sale vanished after insert".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SaleSpec {
        SaleSpec {
            id: "drop-1".into(),
            name: "Drop".into(),
            units: 10,
            per_user_limit: 2,
            shards: 2,
            starts_at: Utc::now(),
            ends_at: None,
            hold_seconds: 600,
            admission_rate: 50.0,
            admission_factor: 2.0,
            price_cents: 100,
            queue_shards: 1,
            admission_p99_ms: 50.0,
            bot_check: "none".into(),
            bot_shadow: false,
            join_limit: DEFAULT_JOIN_LIMIT,
            currency: DEFAULT_CURRENCY.into(),
            draw_beacon: None,
            skus: Vec::new(),
        }
    }

    #[test]
    fn beacon_urls() {
        for ok in [
            "https://api.drand.sh/52db9ba70e0cc0f6eaf7803dd07447a1f5477735fd3f661792ba94600c84e971",
            "http://127.0.0.1:4000",
            "http://[::1]:4000/beacon/",
        ] {
            assert!(valid_beacon_url(ok), "{ok}");
        }
        let long = format!("https://b.example/{}", "a".repeat(600));
        for bad in [
            "",
            "beacon.example",
            "ftp://beacon.example",
            "https://beacon.example/?round=1",
            "https://beacon.example/#x",
            "https://user:pw@beacon.example",
            long.as_str(),
        ] {
            assert!(!valid_beacon_url(bad), "{bad}");
        }
    }

    #[test]
    fn bot_checks_parse_like_the_edge() {
        for ok in ["none", "turnstile", "pow:1", "pow:16", "pow:32"] {
            assert!(valid_bot_check(ok), "{ok}");
        }
        for bad in [
            "", "pow", "pow:", "pow:0", "pow:33", "pow:016", "pow:+1", "Pow:5", "captcha",
        ] {
            assert!(!valid_bot_check(bad), "{bad}");
        }
    }

    #[test]
    fn bad_sale_specs_are_refused_with_the_flag_named() {
        assert!(spec().validate().is_ok());
        let cases: Vec<(SaleSpec, &str)> = vec![
            (
                SaleSpec {
                    id: "Bad Id".into(),
                    ..spec()
                },
                "--sale",
            ),
            (SaleSpec { units: 0, ..spec() }, "--units"),
            (
                SaleSpec {
                    per_user_limit: 0,
                    ..spec()
                },
                "--per-user-limit",
            ),
            (
                SaleSpec {
                    shards: 11,
                    ..spec()
                },
                "--shards",
            ),
            (
                SaleSpec {
                    shards: 0,
                    ..spec()
                },
                "--shards",
            ),
            (
                SaleSpec {
                    queue_shards: 0,
                    ..spec()
                },
                "--queue-shards",
            ),
            (
                SaleSpec {
                    queue_shards: 257,
                    ..spec()
                },
                "--queue-shards",
            ),
            (
                SaleSpec {
                    hold_seconds: 0,
                    ..spec()
                },
                "--hold-seconds",
            ),
            (
                SaleSpec {
                    bot_check: "pow:40".into(),
                    ..spec()
                },
                "--bot-check",
            ),
            (
                SaleSpec {
                    join_limit: 50,
                    ..spec()
                },
                "--join-limit",
            ),
            (
                SaleSpec {
                    admission_rate: f64::NAN,
                    ..spec()
                },
                "--admission-rate",
            ),
            (
                SaleSpec {
                    admission_factor: -1.0,
                    ..spec()
                },
                "--admission-factor",
            ),
            (
                SaleSpec {
                    admission_p99_ms: 0.0,
                    ..spec()
                },
                "--admission-p99-ms",
            ),
            (
                SaleSpec {
                    price_cents: -1,
                    ..spec()
                },
                "--price-cents",
            ),
            (
                SaleSpec {
                    currency: "eur".into(),
                    ..spec()
                },
                "--currency",
            ),
            (
                SaleSpec {
                    currency: "EURO".into(),
                    ..spec()
                },
                "--currency",
            ),
            (
                SaleSpec {
                    draw_beacon: Some("ftp://beacon.example".into()),
                    ..spec()
                },
                "--draw-beacon",
            ),
            (
                SaleSpec {
                    draw_beacon: Some("https://beacon.example/x?round=1".into()),
                    ..spec()
                },
                "--draw-beacon",
            ),
            (
                SaleSpec {
                    ends_at: Some(Utc::now() - chrono::Duration::hours(1)),
                    ..spec()
                },
                "--ends-at",
            ),
        ];
        for (s, flag) in cases {
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(flag), "{err} should name {flag}");
        }
    }
}
