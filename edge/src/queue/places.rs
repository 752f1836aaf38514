//! Global places from sharded queues, without a global sort.
//!
//! Role: a person's absolute place in a sale whose queue is spread over
//! shards, computed by whoever holds the person's ticket (an isolate) from
//! immutable, cacheable pieces.
//!
//! Before the start (pre-queue, drawn): each shard `k` has sorted its own
//! draw values into buckets of `BUCKET_SIZE` and published its index (the
//! first value of every bucket and its count). For a value `v`:
//!
//! ```text
//! place(v) = 1 + Σ_k count_k(values < v)
//! count_k(< v) = j·BUCKET_SIZE + |{x in bucket_k[j] : x < v}|
//! ```
//!
//! where `j` is the last bucket of shard `k` whose first value is ≤ `v`
//! (none: 0). That is exactly the rank one object sorting every value would
//! give; each bucket is fetched once per cache, never once per person.
//!
//! After the start (FIFO): each shard stamps arrivals `(t_ms, shard, seq)`
//! with a clock that never runs backwards on that shard, and reports each
//! finished second's stamps to the coordinator. The order of arrivals is
//! `(t_ms, shard, seq)`; an arrival's place is
//!
//! ```text
//! place = prequeue + (arrivals in earlier seconds) + |{a in its second : a < me}| + 1
//! ```
//!
//! exact once every shard has reported that second.
//!
//! Invariants kept here:
//! - the same entrants and seed give the same places under any number of
//!   shards (tested against the one-object draw);
//! - on one shard a later arrival never gets an earlier place (stamps never
//!   decrease and ties are broken by `seq`), so the frontier never admits a
//!   later arrival before an earlier one of the same shard;
//! - across shards, two arrivals can only be inverted by the difference of
//!   the two objects' clocks (see `edge/README.md`).

use serde::{Deserialize, Serialize};

use crate::draw::index::ShardIndex;

/// The global place of `v` given, for every shard, its index and the
/// bucket `straddling(v)` of that shard (empty slice when None). None when
/// a bucket is missing or inconsistent.
pub fn place_of(v: &str, shards: &[(&ShardIndex, &[String])]) -> Option<u64> {
    let mut below = 0u64;
    for (index, bucket) in shards {
        below += index.count_below(v, index.straddling(v), bucket)?;
    }
    Some(below + 1)
}

/// Whether `v` is one of the values of its own shard (the holder of a
/// pre-queue ticket really was drawn there).
pub fn is_member(index: &ShardIndex, v: &str, bucket: &[String]) -> bool {
    index.straddling(v).is_some() && bucket.binary_search_by(|x| x.as_str().cmp(v)).is_ok()
}

// ------------------------------------------------------------------ FIFO

/// An arrival after the start: its position in the global FIFO order is the
/// order of these fields (derived `Ord` compares them in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Arrival {
    pub t_ms: u64,
    pub shard: u32,
    pub seq: u64,
}

/// A shard's arrival clock: never runs backwards, and never stamps into a
/// second the shard has already reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Stamper {
    /// Stamps are at least this (ms).
    pub floor_ms: u64,
}

impl Stamper {
    /// The stamp of an arrival seen at `now_ms`.
    pub fn stamp(&mut self, now_ms: u64) -> u64 {
        let t = now_ms.max(self.floor_ms);
        self.floor_ms = t;
        t
    }

    /// The shard reported every second before `second` (exclusive): later
    /// stamps must land in `second` or after.
    pub fn reported_until(&mut self, second: u64) {
        self.floor_ms = self.floor_ms.max(second.saturating_mul(1000));
    }
}

/// What a shard sends the coordinator for one finished second.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondReport {
    pub shard: u32,
    /// Unix second.
    pub second: u64,
    /// `(t_ms, seq)` of the second's arrivals on that shard.
    pub stamps: Vec<(u64, u64)>,
}

/// One second of arrivals from every shard, as the coordinator serves it
/// (immutable once `complete`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SecondArrivals {
    pub second: u64,
    /// Arrivals in all earlier seconds (after the start), all shards.
    pub before: u64,
    /// Every shard has reported this second.
    pub complete: bool,
    /// The second's arrivals, any order.
    pub arrivals: Vec<Arrival>,
}

impl SecondArrivals {
    /// The place of arrival `me` after `prequeue` drawn places; None if `me`
    /// is not in this second's list (not reported yet, or forged).
    pub fn place_of(&self, prequeue: u64, me: Arrival) -> Option<u64> {
        if me.t_ms / 1000 != self.second || !self.arrivals.contains(&me) {
            return None;
        }
        let earlier = self.arrivals.iter().filter(|a| **a < me).count() as u64;
        Some(prequeue + self.before + earlier + 1)
    }
}

/// Per-shard watermarks: the last second each shard has reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Watermarks {
    /// `through[k]`: shard `k` reported every second `<= through[k]`
    /// (None: nothing yet).
    pub through: Vec<Option<u64>>,
}

impl Watermarks {
    pub fn new(shards: u32) -> Self {
        Watermarks {
            through: vec![None; shards as usize],
        }
    }

    pub fn record(&mut self, shard: u32, through: u64) {
        if let Some(w) = self.through.get_mut(shard as usize) {
            *w = Some(w.map_or(through, |x| x.max(through)));
        }
    }

    /// Every second `<= complete_through()` is reported by every shard.
    pub fn complete_through(&self) -> Option<u64> {
        self.through
            .iter()
            .copied()
            .try_fold(u64::MAX, |m, w| w.map(|w| m.min(w)))
            .filter(|m| *m != u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draw::hash::{draw_order, leaf_hex, value_hex};
    use crate::draw::steps::{Limits, MemShard, run_to_end};
    use crate::queue::shards::shard_of;
    use std::collections::HashMap;

    /// Draws `accounts` over `n` shards and returns each account's place
    /// computed the way an isolate does (index + straddling buckets).
    fn leaf(a: &str) -> String {
        leaf_hex(a, &[a.len() as u8; 16])
    }

    fn sharded_places(key: &draw::Hash, accounts: &[String], n: u32) -> HashMap<String, u64> {
        let mut shards = vec![MemShard::default(); n as usize];
        for a in accounts {
            shards[shard_of(a, n) as usize].join(leaf(a));
        }
        let value = |l: &str| value_hex(key, l);
        for s in &mut shards {
            run_to_end(s, &value, Limits::default()).unwrap();
        }
        let indexes: Vec<ShardIndex> = shards.iter().map(MemShard::index).collect();
        let empty: Vec<String> = Vec::new();
        accounts
            .iter()
            .map(|a| {
                let v = value(&leaf(a));
                let parts: Vec<(&ShardIndex, &[String])> = indexes
                    .iter()
                    .zip(&shards)
                    .map(|(ix, s)| {
                        let b = ix
                            .straddling(&v)
                            .map(|j| s.buckets[j as usize].as_slice())
                            .unwrap_or(&empty);
                        (ix, b)
                    })
                    .collect();
                let own = shard_of(a, n) as usize;
                let own_bucket = indexes[own]
                    .straddling(&v)
                    .map(|j| shards[own].buckets[j as usize].as_slice())
                    .unwrap_or(&empty);
                assert!(is_member(&indexes[own], &v, own_bucket), "{a} drawn");
                (a.clone(), place_of(&v, &parts).unwrap())
            })
            .collect()
    }

    #[test]
    fn the_same_5000_entrants_under_1_and_16_shards_get_identical_places() {
        let key = [42u8; 32];
        let accounts: Vec<String> = (0..5_000).map(|i| format!("acct-{i}")).collect();
        let one = sharded_places(&key, &accounts, 1);
        let sixteen = sharded_places(&key, &accounts, 16);
        assert_eq!(one, sixteen);
        // And both are the single object's draw.
        let leaves: Vec<String> = accounts.iter().map(|a| leaf(a)).collect();
        for d in draw_order(&key, &leaves) {
            let a = &accounts[leaves.iter().position(|l| *l == d.leaf).unwrap()];
            assert_eq!(sixteen[a], d.place, "{a}");
        }
        let mut places: Vec<u64> = sixteen.values().copied().collect();
        places.sort_unstable();
        assert_eq!(places, (1..=5_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_wrong_or_missing_bucket_gives_no_place() {
        let key = [1u8; 32];
        let mut s = MemShard::default();
        for i in 0..2_000 {
            s.join(leaf(&format!("a-{i}")));
        }
        run_to_end(&mut s, &|l: &str| value_hex(&key, l), Limits::default()).unwrap();
        let ix = s.index();
        let v = value_hex(&key, &leaf("a-7"));
        let j = ix.straddling(&v).unwrap() as usize;
        let wrong = (j + 1) % s.buckets.len();
        assert_eq!(place_of(&v, &[(&ix, &s.buckets[wrong])]), None);
        assert!(place_of(&v, &[(&ix, &s.buckets[j])]).is_some());
        assert!(!is_member(
            &ix,
            &value_hex(&key, &leaf("stranger")),
            &s.buckets[j]
        ));
        // A value below every bucket counts zero there.
        assert_eq!(ix.straddling(&"0".repeat(64)), None);
        assert_eq!(place_of(&"0".repeat(64), &[(&ix, &[])]), Some(1));
    }

    #[test]
    fn stamps_never_run_backwards_and_respect_reported_seconds() {
        let mut s = Stamper::default();
        assert_eq!(s.stamp(5_000), 5_000);
        assert_eq!(s.stamp(4_000), 5_000, "clock went back: stamp holds");
        s.reported_until(7);
        assert_eq!(s.stamp(6_500), 7_000, "second 6 is reported: into 7");
        assert_eq!(s.stamp(7_200), 7_200);
    }

    /// Never admit a later arrival before an earlier one on the same shard:
    /// with a jittery clock, places on one shard follow seq order.
    #[test]
    fn never_a_later_arrival_before_an_earlier_one_on_the_same_shard() {
        let shards = 4u32;
        let mut stampers = vec![Stamper::default(); shards as usize];
        let mut seqs = vec![0u64; shards as usize];
        let mut all: Vec<Arrival> = Vec::new();
        let mut clock = 100_000u64;
        for i in 0..4_000u64 {
            let k = (i * 7 % u64::from(shards)) as u32;
            // Each object's clock wobbles up to ±40 ms around the true time.
            let skew = (i * 37 % 81) as i64 - 40;
            let now = (clock as i64 + skew) as u64;
            let t = stampers[k as usize].stamp(now);
            seqs[k as usize] += 1;
            all.push(Arrival {
                t_ms: t,
                shard: k,
                seq: seqs[k as usize],
            });
            clock += 3;
            if i % 300 == 299 {
                // Shards report the finished seconds now and then.
                for st in &mut stampers {
                    st.reported_until(clock.saturating_sub(1_000) / 1000);
                }
            }
        }
        // Reports per second, then places as the isolates compute them.
        let mut by_second: std::collections::BTreeMap<u64, Vec<Arrival>> = Default::default();
        for a in &all {
            by_second.entry(a.t_ms / 1000).or_default().push(*a);
        }
        let mut before = 0;
        let mut place = HashMap::new();
        for (second, arrivals) in &by_second {
            let sec = SecondArrivals {
                second: *second,
                before,
                complete: true,
                arrivals: arrivals.clone(),
            };
            for a in arrivals {
                place.insert(*a, sec.place_of(10, *a).unwrap());
            }
            before += arrivals.len() as u64;
        }
        let mut places: Vec<u64> = place.values().copied().collect();
        places.sort_unstable();
        assert_eq!(places, (11..=4_010).collect::<Vec<_>>(), "a permutation");
        for k in 0..shards {
            let mine: Vec<&Arrival> = all.iter().filter(|a| a.shard == k).collect();
            for w in mine.windows(2) {
                assert!(
                    place[w[0]] < place[w[1]],
                    "shard {k}: seq {} placed after seq {}",
                    w[0].seq,
                    w[1].seq
                );
            }
        }
        // A forged arrival (not in the report) gets no place.
        let sec = SecondArrivals {
            second: 100,
            ..Default::default()
        };
        let ghost = Arrival {
            t_ms: 100_500,
            shard: 0,
            seq: 1,
        };
        assert_eq!(sec.place_of(0, ghost), None);
    }

    #[test]
    fn watermarks_complete_when_every_shard_reported() {
        let mut w = Watermarks::new(3);
        assert_eq!(w.complete_through(), None);
        w.record(0, 10);
        w.record(1, 12);
        assert_eq!(w.complete_through(), None);
        w.record(2, 11);
        assert_eq!(w.complete_through(), Some(10));
        w.record(0, 9);
        assert_eq!(w.complete_through(), Some(10), "never backwards");
        w.record(7, 99); // unknown shard: ignored
        assert_eq!(w.complete_through(), Some(10));
    }
}
