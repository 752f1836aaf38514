//! The Durable Objects (Wasm only): a sale's queue shards
//! ([`queue_shard`]) and its coordinator ([`sale_queue`]), and how the
//! Worker and the objects call each other ([`call`]), and Durable Object
//! SQL storage as the objects' storage interface ([`storage`]). I/O only:
//! the logic is in `queue::entries` and `queue::coordinator`.

pub mod call;
pub mod queue_shard;
pub mod sale_queue;
pub mod storage;
