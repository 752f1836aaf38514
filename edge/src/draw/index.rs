//! A shard's published draw index: what every holder of a ticket needs
//! of a drawn shard to compute a place, without the shard's whole list.
//!
//! Role: the type both sides share. The draw steps (`draw::steps`) write
//! buckets of [`BUCKET_SIZE`] sorted values and publish their firsts; the
//! places (`queue::places`) count values below a person's value from them.
//! It sits below both so neither imports the other.
//!
//! Invariants kept here: a shard's values are split into buckets of exactly
//! [`BUCKET_SIZE`] values (the last may hold fewer), so bucket `j` starts
//! at rank `j·BUCKET_SIZE`; a bucket that does not match the index is
//! refused, never counted.

use serde::{Deserialize, Serialize};

/// Values per bucket (the last bucket of a shard may hold fewer).
pub const BUCKET_SIZE: usize = 512;

/// One shard's published draw index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ShardIndex {
    /// Values drawn on this shard.
    pub count: u64,
    /// First (smallest) value of each bucket, ascending.
    pub firsts: Vec<String>,
}

impl ShardIndex {
    /// The bucket that holds the values just below or equal to `v`: the last
    /// one whose first value is ≤ `v` (None: every value is above `v`).
    pub fn straddling(&self, v: &str) -> Option<u64> {
        let after = self.firsts.partition_point(|f| f.as_str() <= v);
        after.checked_sub(1).map(|j| j as u64)
    }

    /// Values of this shard below `v`, given bucket `j = straddling(v)` and
    /// its values (ascending). None if the bucket does not fit the index.
    pub fn count_below(&self, v: &str, j: Option<u64>, bucket: &[String]) -> Option<u64> {
        let Some(j) = j else { return Some(0) };
        if bucket.first().map(String::as_str) != self.firsts.get(j as usize).map(String::as_str) {
            return None;
        }
        let within = bucket.partition_point(|x| x.as_str() < v) as u64;
        Some(j * BUCKET_SIZE as u64 + within)
    }
}
