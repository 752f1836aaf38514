//! Ending an account's admission to a sale (issue 47): the operator's
//! revoke. Three steps, each idempotent, in this order:
//!
//! 1. [`record`]: the `revocations` row, in the caller's transaction (the
//!    admin API writes its audit entry in the same one);
//! 2. [`mark`]: the account's home shard in Redis gets the `<account>\nr`
//!    field of its users hash, which `lua/reserve.lua` reads in the same
//!    call that would grant a hold: no new hold for the account, at no
//!    extra round trip for anyone else; a replay of an earlier hold still
//!    answers that hold;
//! 3. [`tell_edge`]: the edge's `POST /api/sales/{sale}/revoke` ends the
//!    turn in the account's queue shard, and the coordinator passes it on
//!    at once.
//!
//! Invariants kept here: a revoke never releases units or changes a hold
//! (holds already made stay payable until they expire: the revoke is of
//! the admission, not of what was bought); a repeated revoke changes
//! nothing more.

use redis::AsyncCommands;
use secrecy::{ExposeSecret, SecretString};
use sqlx::PgConnection;

use crate::reserve::engine::home_shard;
use crate::reserve::store::RedisConn;
use crate::sales::sale::Sale;

/// Records the revoke; whether it is new.
pub async fn record(tx: &mut PgConnection, sale: &str, account: &str) -> Result<bool, sqlx::Error> {
    let n = sqlx::query(
        "INSERT INTO revocations (sale_id, account) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(sale)
    .bind(account)
    .execute(tx)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// The users-hash field of a revoked account (`lua/_lib.lua` `revoked_field`).
pub fn revoked_field(account: &str) -> String {
    format!("{account}\nr")
}

/// Marks the account on its home shard: `reserve.lua` refuses it new holds.
pub async fn mark(conn: &RedisConn, sale: &Sale, account: &str) -> Result<(), redis::RedisError> {
    let home = &sale.shards[home_shard(account, sale.shards.len())];
    let mut c = conn.clone();
    let _: () = c.hset(&home.users, revoked_field(account), 1).await?;
    Ok(())
}

/// What the edge said to a revoke.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeAnswer {
    /// The account's queue shard ended the turn.
    PassedOn,
    /// `ADMIN_EDGE_URL` is not set: the turn ends when its holder stops
    /// polling (30 s) or its window closes; the origin refuses new holds.
    NotConfigured,
    /// The edge could not be told (why): the same as not configured until
    /// the revoke is sent again (it is idempotent).
    Failed(String),
}

/// Tells the edge to end the account's turn.
pub async fn tell_edge(
    edge: Option<(&str, &SecretString)>,
    sale: &str,
    account: &str,
) -> EdgeAnswer {
    let Some((base, secret)) = edge else {
        return EdgeAnswer::NotConfigured;
    };
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    let sent = client
        .post(format!("{base}/api/sales/{sale}/revoke"))
        .bearer_auth(secret.expose_secret())
        .json(&serde_json::json!({ "account": account }))
        .send()
        .await;
    match sent {
        Ok(r) if r.status().is_success() => EdgeAnswer::PassedOn,
        Ok(r) => EdgeAnswer::Failed(format!("the edge answered {}", r.status())),
        Err(e) => EdgeAnswer::Failed(format!("the edge: {}", e.without_url())),
    }
}
