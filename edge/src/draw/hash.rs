//! The verifiable pre-queue draw (DESIGN.md "The draw, v2"), as the edge
//! runs it: the arithmetic lives in the `draw` crate (shared with the
//! origin's auditor); this module is the edge's use of it with hex strings
//! as they are stored and served.
//!
//! How a place is derived (the documented, public method):
//!
//! 1. When the sale's queue is created the coordinator draws a 32-byte seed
//!    from the platform CSPRNG and publishes only `commitment =
//!    hex(SHA-256(seed))`, with the beacon the sale names (or `none`).
//! 2. Each entrant gets a 16-byte random salt at join (in their ticket);
//!    `leaf = SHA-256("fs-leaf:" ‖ account ‖ ":" ‖ hex(salt))`.
//! 3. At `starts_at` the entrant set freezes: an RFC 6962 Merkle tree over
//!    the sorted leaves of every shard; its root and count are published.
//! 4. `beacon` = the randomness of the first beacon round at or after
//!    `starts_at` (empty when the sale names none or it did not answer).
//! 5. `key = SHA-256(seed ‖ entrants_root ‖ beacon)`, `value = SHA-256(key ‖
//!    leaf)`; places are ranks of value, ascending.
//!
//! Invariants kept here:
//! - the order depends only on the key and the set of leaves, never on
//!   arrival order or time (the input order is irrelevant: we sort);
//! - places are exactly `1..=n`, each used once;
//! - nobody can choose an entry that sorts first: the key needs the seed
//!   (secret until the draw), the frozen set's root (fixed before the key)
//!   and the beacon (unknown to everyone until after the start).

pub use draw::Hash;
use sha2::{Digest, Sha256};

/// Bytes of the secret seed.
pub const SEED_BYTES: usize = 32;

/// The method, as published with every draw.
pub const METHOD: &str = "draw v2: leaf = SHA-256(\"fs-leaf:\" ‖ account ‖ \":\" ‖ hex(salt)); entrants_root = RFC 6962 Merkle root of the sorted leaves; key = SHA-256(seed ‖ entrants_root ‖ beacon); value = SHA-256(key ‖ leaf); place = rank of value, ascending; commitment = hex(SHA-256(seed))";

/// `hex(SHA-256(seed))`, published before anyone joins.
pub fn commitment(seed: &[u8]) -> String {
    draw::commitment(seed)
}

/// Whether `seed_hex` is the seed `commitment_hex` commits to.
pub fn seed_matches(seed_hex: &str, commitment_hex: &str) -> bool {
    hex::decode(seed_hex).is_ok_and(|s| commitment(&s) == commitment_hex)
}

/// A hash as JSON carries it (lowercase hex).
pub fn to_hex_hash(h: &Hash) -> String {
    draw::to_hex(h)
}

/// An entrant's leaf (hex) from their account and salt.
pub fn leaf_hex(account: &str, salt: &[u8; 16]) -> String {
    draw::to_hex(&draw::leaf(account, salt))
}

/// The leaf (hex) of a ticket's holder, from the salt (hex) it carries.
pub fn leaf_of_ticket(account: &str, salt_hex: &str) -> Option<String> {
    let salt: [u8; 16] = hex::decode(salt_hex).ok()?.try_into().ok()?;
    Some(leaf_hex(account, &salt))
}

/// `hex(SHA-256(key ‖ leaf))`: a leaf's draw value. A leaf that is not hex
/// (never stored by the edge) is hashed as its text, so it still gets a
/// value and nothing panics.
pub fn value_hex(key: &Hash, leaf_hex: &str) -> String {
    match draw::from_hex(leaf_hex) {
        Some(l) => draw::to_hex(&draw::value(key, &l)),
        None => hex::encode(
            Sha256::new()
                .chain_update(key)
                .chain_update(leaf_hex)
                .finalize(),
        ),
    }
}

/// One entrant's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drawn {
    pub leaf: String,
    pub value: String,
    /// 1-based place in line.
    pub place: u64,
}

/// Draws the order of `leaves` (given in any order, e.g. arrival order)
/// under `key`: what one object sorting everyone would give, and what the
/// sharded draw must equal.
pub fn draw_order<S: AsRef<str>>(key: &Hash, leaves: &[S]) -> Vec<Drawn> {
    let mut valued: Vec<(String, &str)> = leaves
        .iter()
        .map(|l| (value_hex(key, l.as_ref()), l.as_ref()))
        .collect();
    valued.sort_unstable();
    valued
        .into_iter()
        .enumerate()
        .map(|(i, (value, leaf))| Drawn {
            leaf: leaf.to_string(),
            value,
            place: i as u64 + 1,
        })
        .collect()
}

/// The key of a whole draw over `leaves` (hex, any order): what the
/// coordinator computes from its freeze, for tests and benchmarks.
pub fn key_of(seed: &[u8], leaves: &[String], beacon: &[u8]) -> Hash {
    let mut sorted: Vec<Hash> = leaves.iter().filter_map(|l| draw::from_hex(l)).collect();
    sorted.sort_unstable();
    draw::key(seed, &draw::root(&sorted), beacon)
}

/// How long the coordinator waits for the beacon's round (from when it is
/// due, or from the freeze if later) before drawing without it (DESIGN:
/// 60 s; the Worker var `DRAW_BEACON_WAIT_SECS` can set another, e.g. a
/// short one for the e2e test of a silent beacon).
pub const BEACON_GIVE_UP_MS: u64 = 60_000;

/// The give-up wait from the `DRAW_BEACON_WAIT_SECS` setting: 1..=600 s,
/// anything else (or nothing) is the default 60 s.
pub fn beacon_wait_ms(setting: Option<&str>) -> u64 {
    setting
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|s| (1..=600).contains(s))
        .map_or(BEACON_GIVE_UP_MS, |s| s * 1000)
}

/// What the coordinator does next about the beacon, from what it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeaconNext {
    /// Ask `<url>/info` for the period and genesis.
    Info,
    /// The round is not published before this (unix ms): wait.
    WaitUntil(u64),
    /// Ask `<url>/public/<round>`.
    Fetch(u64),
    /// Waited long enough: draw with an empty beacon, and say so.
    GiveUp,
}

/// `info`: the beacon's `(genesis_time, period)` in seconds once known;
/// `frozen_at_ms`: when the entrant set froze (the wait, `wait_ms`, counts
/// from the later of it and the round's time).
pub fn beacon_next(
    now_ms: u64,
    starts_at_ms: u64,
    frozen_at_ms: u64,
    info: Option<(u64, u64)>,
    wait_ms: u64,
) -> BeaconNext {
    let give_up = |from: u64| now_ms >= from.max(frozen_at_ms) + wait_ms;
    let Some((genesis, period)) = info else {
        return if give_up(frozen_at_ms) {
            BeaconNext::GiveUp
        } else {
            BeaconNext::Info
        };
    };
    let Some(round) = draw::beacon_round(genesis, period, starts_at_ms.div_ceil(1000)) else {
        return BeaconNext::GiveUp;
    };
    let at_ms = genesis
        .saturating_add((round - 1).saturating_mul(period))
        .saturating_mul(1000);
    if give_up(at_ms) {
        BeaconNext::GiveUp
    } else if now_ms < at_ms {
        BeaconNext::WaitUntil(at_ms)
    } else {
        BeaconNext::Fetch(round)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_for(i: u64) -> [u8; 32] {
        // Deterministic seeds so the statistics below are reproducible.
        Sha256::digest(format!("test-seed-{i}").as_bytes()).into()
    }

    /// Entrants' leaves with salts drawn from `d` (a draw's entrants get
    /// fresh salts at every sale).
    fn leaves_for(d: u64, accounts: &[String]) -> Vec<String> {
        accounts
            .iter()
            .map(|a| {
                let s: [u8; 32] = Sha256::digest(format!("salt-{d}-{a}").as_bytes()).into();
                leaf_hex(a, s[..16].try_into().unwrap())
            })
            .collect()
    }

    /// A fixed vector (also checked in Wasm by edge/tests/wasm.rs and
    /// reproducible with any SHA-256 tool).
    #[test]
    fn draw_vector_is_stable() {
        assert_eq!(
            commitment(&[0u8; 32]),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
        let accounts: Vec<String> = (1..=6).map(|i| format!("acct-{i}")).collect();
        let leaves: Vec<String> = accounts.iter().map(|a| leaf_hex(a, &[0u8; 16])).collect();
        let key = key_of(&[0u8; 32], &leaves, b"");
        let order: Vec<usize> = draw_order(&key, &leaves)
            .iter()
            .map(|d| leaves.iter().position(|l| *l == d.leaf).unwrap() + 1)
            .collect();
        assert_eq!(order, VECTOR_ORDER);
        assert_eq!(
            draw::to_hex(&key),
            "0f0ef61620a35c30ae53ca79755b6fd3b884d315de2764da22f4efddda95717d"
        );
    }

    /// The accounts `acct-1..6` (salt 0) in drawn order under seed 0 and no
    /// beacon (key 0f0ef616…; recomputed with Python's hashlib).
    const VECTOR_ORDER: [usize; 6] = [6, 5, 1, 4, 3, 2];

    #[test]
    fn the_beacon_round_is_the_first_at_or_after_the_start_and_waited_for_60_s() {
        // Rounds every 3 s from t = 1000 s: round r at 1000 + 3 (r − 1).
        const W: u64 = BEACON_GIVE_UP_MS;
        let info = Some((1_000, 3));
        let starts = 1_010_500; // 1010.5 s: round 5 (1012 s) is the first after
        assert_eq!(
            beacon_next(1_011_000, starts, 1_011_000, info, W),
            BeaconNext::WaitUntil(1_012_000)
        );
        assert_eq!(
            beacon_next(1_012_000, starts, 1_011_000, info, W),
            BeaconNext::Fetch(5)
        );
        assert_eq!(
            beacon_next(1_071_999, starts, 1_011_000, info, W),
            BeaconNext::Fetch(5)
        );
        assert_eq!(
            beacon_next(1_072_000, starts, 1_011_000, info, W),
            BeaconNext::GiveUp
        );
        // A freeze later than the round: the 60 s count from the freeze.
        assert_eq!(
            beacon_next(1_080_000, starts, 1_030_000, info, W),
            BeaconNext::Fetch(5)
        );
        // No info yet: ask, and give up 60 s after the freeze.
        assert_eq!(
            beacon_next(1_011_000, starts, 1_011_000, None, W),
            BeaconNext::Info
        );
        assert_eq!(
            beacon_next(1_071_000, starts, 1_011_000, None, W),
            BeaconNext::GiveUp
        );
        // A start exactly on a round uses that round.
        assert_eq!(
            beacon_next(1_013_000, 1_012_000, 1_012_000, info, W),
            BeaconNext::Fetch(5)
        );
    }

    #[test]
    fn the_beacon_wait_is_60_s_unless_set_within_bounds() {
        assert_eq!(beacon_wait_ms(None), 60_000);
        assert_eq!(beacon_wait_ms(Some("8")), 8_000);
        for bad in ["0", "601", "-1", "x", ""] {
            assert_eq!(beacon_wait_ms(Some(bad)), 60_000, "{bad}");
        }
        assert_eq!(
            beacon_next(1_008_000, 1_000_000, 1_000_000, None, 8_000),
            BeaconNext::GiveUp
        );
    }

    #[test]
    fn commitment_checks_out() {
        let seed = [7u8; SEED_BYTES];
        let c = commitment(&seed);
        assert_eq!(c.len(), 64);
        assert!(seed_matches(&hex::encode(seed), &c));
        assert!(!seed_matches(&hex::encode([8u8; SEED_BYTES]), &c));
        assert!(!seed_matches("not hex", &c));
    }

    #[test]
    fn places_are_a_permutation_and_ignore_input_order() {
        let accounts: Vec<String> = (0..500).map(|i| format!("acct-{i}")).collect();
        let leaves = leaves_for(1, &accounts);
        let key = key_of(&seed_for(1), &leaves, b"beacon");
        let a = draw_order(&key, &leaves);
        let mut places: Vec<u64> = a.iter().map(|d| d.place).collect();
        places.sort_unstable();
        assert_eq!(places, (1..=500).collect::<Vec<_>>());
        let mut reversed = leaves.clone();
        reversed.reverse();
        assert_eq!(
            a,
            draw_order(&key, &reversed),
            "arrival order is irrelevant"
        );
        let other_beacon = key_of(&seed_for(1), &leaves, b"other");
        assert_ne!(
            a,
            draw_order(&other_beacon, &leaves),
            "another beacon, another order"
        );
        // Each value is checkable from the key and the leaf alone.
        for d in &a {
            assert_eq!(d.value, value_hex(&key, &d.leaf));
        }
    }

    #[test]
    fn a_ticket_salt_gives_the_leaf_and_bad_salts_none() {
        let salt = [9u8; 16];
        assert_eq!(
            leaf_of_ticket("a", &hex::encode(salt)),
            Some(leaf_hex("a", &salt))
        );
        assert_eq!(leaf_of_ticket("a", "zz"), None);
        assert_eq!(leaf_of_ticket("a", "00"), None);
        assert_eq!(value_hex(&[0u8; 32], "not hex").len(), 64);
    }

    /// Pearson chi-square statistic of observed counts against a flat expectation.
    fn chi_square(counts: &[u64], expected: f64) -> f64 {
        counts
            .iter()
            .map(|&o| (o as f64 - expected).powi(2) / expected)
            .sum()
    }

    /// Spearman rank correlation of arrival index (0..n) against place (1..=n).
    fn spearman(places_by_arrival: &[u64]) -> f64 {
        let n = places_by_arrival.len() as f64;
        let d2: f64 = places_by_arrival
            .iter()
            .enumerate()
            .map(|(i, &p)| (i as f64 + 1.0 - p as f64).powi(2))
            .sum();
        1.0 - 6.0 * d2 / (n * (n * n - 1.0))
    }

    const N: usize = 2_000;
    const DRAWS: u64 = 200;
    const BINS: usize = 10;

    /// Runs `DRAWS` draws of `N` entrants with `order` and returns
    /// (chi-square over arrival-decile × place-decile, mean and max |Spearman|,
    /// chi-square of the first arrival's place decile).
    fn statistics(order: impl Fn(u64, &[String]) -> Vec<u64>) -> (f64, f64, f64, f64) {
        let accounts: Vec<String> = (0..N).map(|i| format!("user-{i:05}")).collect();
        let mut table = vec![0u64; BINS * BINS];
        let mut first = vec![0u64; BINS];
        let mut rho_sum = 0.0;
        let mut rho_max: f64 = 0.0;
        for d in 0..DRAWS {
            let places = order(d, &accounts);
            for (arrival, &place) in places.iter().enumerate() {
                let a = arrival * BINS / N;
                let p = (place as usize - 1) * BINS / N;
                table[a * BINS + p] += 1;
            }
            first[(places[0] as usize - 1) * BINS / N] += 1;
            let rho = spearman(&places);
            rho_sum += rho;
            rho_max = rho_max.max(rho.abs());
        }
        let expected = (N as u64 * DRAWS) as f64 / (BINS * BINS) as f64;
        (
            chi_square(&table, expected),
            rho_sum / DRAWS as f64,
            rho_max,
            chi_square(&first, DRAWS as f64 / BINS as f64),
        )
    }

    fn drawn_places(d: u64, accounts: &[String]) -> Vec<u64> {
        // Returns places indexed by arrival (accounts are in arrival order):
        // the whole v2 draw, salts, freeze root, beacon and key included.
        let leaves = leaves_for(d, accounts);
        let beacon = Sha256::digest(format!("beacon-{d}").as_bytes());
        let key = key_of(&seed_for(d), &leaves, &beacon);
        let mut by_leaf = std::collections::HashMap::new();
        for x in draw_order(&key, &leaves) {
            by_leaf.insert(x.leaf, x.place);
        }
        leaves.iter().map(|l| by_leaf[l]).collect()
    }

    /// Fairness (DESIGN invariant 6): 2,000 pre-queue entrants over 200
    /// draws get uniform places, independent of their arrival order.
    #[test]
    fn draw_is_uniform_and_independent_of_arrival() {
        let (chi, rho_mean, rho_max, chi_first) = statistics(drawn_places);
        // 10×10 table, 99 degrees of freedom: the 0.999 quantile is 148.2.
        assert!(chi < 148.2, "arrival × place chi-square {chi}");
        // Under independence one draw's rho has sd 1/sqrt(N-1) ≈ 0.0224; the
        // mean of 200 has sd ≈ 0.0016. Bounds are ~5 sd.
        assert!(rho_mean.abs() < 0.008, "mean Spearman rho {rho_mean}");
        assert!(rho_max < 0.11, "max |Spearman rho| {rho_max}");
        // The first arrival's place: 10 bins, 9 df, 0.999 quantile 27.9.
        assert!(
            chi_first < 27.9,
            "first arrival's place chi-square {chi_first}"
        );
    }

    /// The statistics above can fail: a draw that favours early arrivals
    /// even slightly is caught.
    #[test]
    fn statistics_catch_an_arrival_biased_order() {
        // Swap each entrant with a random one among the next 300: a
        // "mostly shuffled" order that still rewards arriving early.
        let biased = |d: u64, accounts: &[String]| -> Vec<u64> {
            let n = accounts.len();
            let mut order: Vec<usize> = (0..n).collect();
            let key = seed_for(d);
            for (i, leaf) in leaves_for(d, accounts).iter().enumerate() {
                let k = value_hex(&key, leaf);
                let r = u64::from_str_radix(&k[..12], 16).unwrap() as usize;
                let j = (i + r % 300).min(n - 1);
                order.swap(i, j);
            }
            let mut places = vec![0u64; n];
            for (place0, &arrival) in order.iter().enumerate() {
                places[arrival] = place0 as u64 + 1;
            }
            places
        };
        let (chi, rho_mean, _, _) = statistics(biased);
        assert!(
            chi > 148.2 || rho_mean.abs() > 0.008,
            "chi {chi} rho {rho_mean}"
        );
        let (chi_fifo, rho_fifo, _, _) =
            statistics(|_, a: &[String]| (1..=a.len() as u64).collect());
        assert!(chi_fifo > 148.2 && rho_fifo > 0.99);
    }
}
