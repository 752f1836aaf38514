//! Change capture from Postgres (`OUTBOX_SOURCE=wal`, issue 46): the
//! relay learns of outbox rows from the database's log through a logical
//! replication slot instead of polling the table. `pgoutput` decodes
//! (pure); `slot` reads and confirms (I/O). The relay
//! (`events::relay::relay_wal_once`) publishes what a read found, then
//! confirms it.

pub mod pgoutput;
pub mod slot;
