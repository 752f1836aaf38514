//! The outbox's inserts read from a logical replication slot
//! (`OUTBOX_SOURCE=wal`): a publication of the outbox table (inserts
//! only) decoded by the built-in `pgoutput` plugin through PostgreSQL's SQL
//! interface, so no replication connection or extra crate is needed.
//!
//! Invariants kept here: reading never moves the slot (`peek`); the slot
//! is moved (`advance`) only to the commit of a transaction whose events
//! the sink acknowledged, so a crash before that reads them again (same
//! event ids) and nothing confirmed is read twice by a healthy relay;
//! whole transactions are read, never part of one.

use sqlx::PgPool;

use crate::events::sink::OutboxEvent;
use crate::events::wal::pgoutput::{self, Message, Relations};

/// Why the slot cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error(
        "OUTBOX_SOURCE=wal needs the server's wal_level=logical (it is {0}): set it in postgresql.conf and restart PostgreSQL"
    )]
    NotLogical(String),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
    #[error("the slot's changes cannot be read: {0}")]
    Decode(#[from] pgoutput::DecodeError),
}

/// What one read of the slot found.
#[derive(Debug, Default)]
pub struct Changes {
    /// The outbox rows inserted, in commit order.
    pub rows: Vec<OutboxEvent>,
    /// The commit of the last whole transaction read: where the slot may
    /// be advanced once `rows` are acknowledged.
    pub through: Option<String>,
    /// Messages read: as many as were asked for means more may wait.
    pub messages: usize,
}

/// The slot and publication named `name` (`OUTBOX_SLOT`).
#[derive(Debug, Clone)]
pub struct WalSlot {
    pub name: String,
}

impl WalSlot {
    /// Creates the publication and the slot when they are missing; refuses
    /// a server whose WAL carries no logical changes.
    pub async fn prepare(&self, pool: &PgPool) -> Result<(), SlotError> {
        let (level,): (String,) = sqlx::query_as("SHOW wal_level").fetch_one(pool).await?;
        if level != "logical" {
            return Err(SlotError::NotLogical(level));
        }
        let (has_pub,): (bool,) =
            sqlx::query_as("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)")
                .bind(&self.name)
                .fetch_one(pool)
                .await?;
        if !has_pub {
            // An identifier cannot be bound; the name was checked
            // (`configuration`: [a-z0-9_], at most 63).
            let created = sqlx::query(&format!(
                "CREATE PUBLICATION {} FOR TABLE outbox WITH (publish = 'insert')",
                self.name
            ))
            .execute(pool)
            .await;
            // Two relays starting at once: the loser finds it made.
            if let Err(e) = created
                && !is_duplicate(&e)
            {
                return Err(e.into());
            }
        }
        let (has_slot,): (bool,) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM pg_replication_slots
                             WHERE slot_name = $1 AND database = current_database())",
        )
        .bind(&self.name)
        .fetch_one(pool)
        .await?;
        if !has_slot {
            let created = sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
                .bind(&self.name)
                .execute(pool)
                .await;
            if let Err(e) = created
                && !is_duplicate(&e)
            {
                return Err(e.into());
            }
            tracing::info!(slot = %self.name, "outbox replication slot created");
        }
        Ok(())
    }

    /// Reads the outbox rows of whole transactions committed after the
    /// slot's confirmed position, stopping after the transaction in which
    /// about `max_changes` messages were reached. Moves nothing.
    pub async fn peek(
        &self,
        conn: &mut sqlx::PgConnection,
        max_changes: i32,
    ) -> Result<Changes, SlotError> {
        let messages: Vec<(String, Vec<u8>)> = sqlx::query_as(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(
                 $1, NULL, $2, 'proto_version', '1', 'publication_names', $1)",
        )
        .bind(&self.name)
        .bind(max_changes)
        .fetch_all(&mut *conn)
        .await?;
        let mut relations = Relations::default();
        let mut changes = Changes::default();
        let mut open = Vec::new();
        changes.messages = messages.len();
        for (lsn, data) in messages {
            match pgoutput::decode(&data)? {
                Message::Relation {
                    oid,
                    namespace,
                    name,
                    columns,
                } => relations.learn(oid, &namespace, &name, columns),
                Message::Insert { relation, values } => {
                    if let Some(row) = relations.outbox_row(relation, &values)? {
                        open.push(row);
                    }
                }
                Message::Commit => {
                    changes.rows.append(&mut open);
                    changes.through = Some(lsn);
                }
                Message::Begin | Message::Other(_) => {}
            }
        }
        Ok(changes)
    }

    /// Confirms everything up to and including the transaction that
    /// committed at `lsn` (from [`WalSlot::peek`]): the server may recycle
    /// the WAL before it.
    pub async fn advance(&self, conn: &mut sqlx::PgConnection, lsn: &str) -> Result<(), SlotError> {
        sqlx::query("SELECT pg_replication_slot_advance($1, $2::pg_lsn)")
            .bind(&self.name)
            .bind(lsn)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Bytes of WAL the server keeps for this slot (`None`: no such slot).
    pub async fn lag_bytes(&self, pool: &PgPool) -> Result<Option<f64>, SlotError> {
        let lag: Option<(Option<f64>,)> = sqlx::query_as(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::float8
               FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.name)
        .fetch_optional(pool)
        .await?;
        Ok(lag.and_then(|(l,)| l))
    }
}

/// A `CREATE` that lost a race: the object exists.
fn is_duplicate(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "42710" || c == "23505")
}
