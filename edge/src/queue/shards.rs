//! Which queue shard an account belongs to.
//!
//! Role: spread a sale's queue over `queue_shards` Durable Objects so joins
//! are not bounded by what one object can commit.
//!
//! Invariants kept here:
//! - an account always maps to the same shard of a sale with the same shard
//!   count (the mapping depends on nothing else: not the seed, not the
//!   time), so one entry — one place — per account still holds;
//! - the mapping is a hash, so no account id can be chosen to land on a
//!   given shard cheaply, and accounts spread within a few percent of even;
//! - shard counts are bounded: `1..=MAX_SHARDS` (anything else is refused
//!   where it is configured and clamped where it is read).

use sha2::{Digest, Sha256};

/// Most shards a sale's queue may have (the origin refuses more).
pub const MAX_SHARDS: u32 = 256;

/// A shard count read from configuration, clamped to `1..=MAX_SHARDS`.
pub fn clamp_shards(n: u64) -> u32 {
    n.clamp(1, u64::from(MAX_SHARDS)) as u32
}

/// The shard (`0..shards`) of `account`.
pub fn shard_of(account: &str, shards: u32) -> u32 {
    let shards = shards.clamp(1, MAX_SHARDS);
    let mut h = Sha256::new();
    h.update(b"fs-shard:");
    h.update(account.as_bytes());
    let d = h.finalize();
    let mut top = [0u8; 8];
    top.copy_from_slice(&d[..8]);
    // Multiply-shift: unbiased enough for 2^64 / 256 and cheaper than `%`.
    ((u128::from(u64::from_be_bytes(top)) * u128::from(shards)) >> 64) as u32
}

/// The Durable Object name of shard `k` of `sale`.
pub fn object_name(sale: &str, k: u32) -> String {
    format!("{sale}#q{k}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_in_range() {
        assert_eq!(shard_of("acct-1", 1), 0);
        for n in [1, 2, 7, 16, 64, 256] {
            for i in 0..200 {
                let a = format!("acct-{i}");
                let k = shard_of(&a, n);
                assert!(k < n);
                assert_eq!(k, shard_of(&a, n), "stable");
            }
        }
        // Hostile counts are clamped, never a panic or a division by zero.
        assert_eq!(shard_of("x", 0), 0);
        assert!(shard_of("x", u32::MAX) < MAX_SHARDS);
        assert_eq!(clamp_shards(0), 1);
        assert_eq!(clamp_shards(10_000), MAX_SHARDS);
        // Fixed vectors (recomputed independently with node's crypto:
        // top 64 bits of SHA-256("fs-shard:" + account) × n >> 64).
        assert_eq!(shard_of("acct-1", 16), 3);
        assert_eq!(shard_of("acct-2", 16), 15);
        assert_eq!(shard_of("acct-1", 7), 1);
        assert_eq!(shard_of("acct-2", 7), 6);
    }

    /// DESIGN: joins spread over shards within 10 % of even.
    #[test]
    fn spreads_within_ten_percent_of_even() {
        for (n, people) in [(8u32, 80_000usize), (16, 160_000), (64, 640_000)] {
            let mut counts = vec![0u64; n as usize];
            for i in 0..people {
                counts[shard_of(&format!("user-{i}"), n) as usize] += 1;
            }
            let even = people as f64 / f64::from(n);
            for (k, c) in counts.iter().enumerate() {
                let dev = (*c as f64 - even).abs() / even;
                assert!(dev < 0.10, "{n} shards: shard {k} has {c} (even {even})");
            }
        }
    }
}
