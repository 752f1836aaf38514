//! One queue shard's pre-queue draw, in bounded, resumable steps.
//!
//! Role: at `starts_at` every shard turns its own pre-queue entrants into
//! immutable buckets of sorted draw values (`BUCKET_SIZE` each). Nothing
//! here writes a place per entrant: a person's global place is computed
//! later, from every shard's buckets (see [`crate::queue::places`]).
//!
//! The draw is a small state machine ([`DrawState`]) advanced by [`step`]
//! against a [`DrawStore`] (SQLite in the Durable Object, memory on the
//! host). Each step does a bounded amount of work (`Limits`), and the state
//! is stored after each step, so an evicted object resumes where it was.
//! The phases, an external merge sort:
//!
//! 1. `Values`: entrants in `seq` order, `values_per_step` at a time, get
//!    their draw value from the value function (draw v2:
//!    `hash::value_hex(key, leaf)`, the entrant given by its leaf); each
//!    step's `(value, entrant)` pairs are sorted and written as one *run*;
//! 2. `Merge`: the runs are merged (a cursor per run), `buckets_per_step`
//!    buckets of `BUCKET_SIZE` per step, reading from each run only a few
//!    rows at a time;
//! 3. `Done`: the count and the first value of every bucket (the shard's
//!    index) are what the coordinator is told.
//!
//! Why runs and not an index on the value: every write here is an append
//! (a run, a bucket), so the storage a step dirties is proportional to what
//! it adds. Updating each entrant's row with its value kept a B-tree index
//! in random order, and every step of 500 then rewrote most of that index's
//! pages: at 200,000 entrants over 16 shards in `wrangler dev`, each
//! object's commit after a step blocked every request for ~30 ms, one step
//! per shard per second, polls waiting up to 5 s (issue 20).
//!
//! Invariants kept here:
//! - every pre-queue entrant's value is in exactly one bucket, buckets are
//!   sorted and contiguous (bucket `j` holds ranks `j·B .. j·B + len`);
//! - a step never does more than its limit of work (values: one run of
//!   `values_per_step`; merge: `buckets_per_step` buckets, reading at most
//!   `MERGE_CHUNK` rows of a run at a time), and re-running a step from the
//!   same stored state writes the same rows (idempotent resume: runs and
//!   buckets are written by their index);
//! - equal values (a SHA-256 collision of two accounts) are not supported:
//!   the order among them is the order of their runs.

use serde::{Deserialize, Serialize};

use crate::draw::index::{BUCKET_SIZE, ShardIndex};

/// Rows of a run read at a time while merging.
pub const MERGE_CHUNK: usize = 64;

/// A drawn entrant: its draw value and the entrant (v2: its leaf).
pub type Item = (String, String);

/// Where a shard's draw is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum DrawState {
    /// Values computed for entrants up to `after_seq`, written as sorted
    /// runs of the lengths in `runs`.
    Values {
        after_seq: u64,
        valued: u64,
        #[serde(default)]
        runs: Vec<u64>,
    },
    /// Buckets `0..next_bucket` written; `cursors[r]` items of run `r`
    /// merged into them.
    Merge {
        runs: Vec<u64>,
        cursors: Vec<u64>,
        next_bucket: u64,
        written: u64,
    },
    /// All written: `count` values in `buckets` buckets.
    Done { count: u64, buckets: u64 },
}

impl DrawState {
    /// The state of a draw that has not started.
    pub fn start() -> Self {
        DrawState::Values {
            after_seq: 0,
            valued: 0,
            runs: Vec::new(),
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, DrawState::Done { .. })
    }
}

/// Work per step. The defaults keep one step well under 100 ms in an
/// object (measured: `scripts/bench-edge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub values_per_step: usize,
    pub buckets_per_step: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            values_per_step: 1_024,
            buckets_per_step: 2,
        }
    }
}

/// The storage a shard's draw reads and writes.
pub trait DrawStore {
    type Error;
    /// Pre-queue entrants `(seq, entrant)` with `seq > after_seq`, ascending
    /// by `seq`, at most `limit`.
    fn entrants_after(
        &mut self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String)>, Self::Error>;
    /// Writes run `run` (items ascending by value). Writing the same run
    /// again replaces it.
    fn put_run(&mut self, run: u64, items: &[Item]) -> Result<(), Self::Error>;
    /// Items `from..from + limit` of run `run` (fewer at its end).
    fn run_items(&mut self, run: u64, from: u64, limit: usize) -> Result<Vec<Item>, Self::Error>;
    /// Writes bucket `index` (its items, ascending by value). Writing the
    /// same bucket again replaces it.
    fn put_bucket(&mut self, index: u64, items: &[Item]) -> Result<(), Self::Error>;
}

/// Advances the draw by one bounded step. `value` maps an entrant to its
/// draw value (v2: `|leaf| draw::value_hex(key, leaf)`).
pub fn step<S: DrawStore>(
    state: &DrawState,
    store: &mut S,
    value: &dyn Fn(&str) -> String,
    limits: Limits,
) -> Result<DrawState, S::Error> {
    match state {
        DrawState::Values {
            after_seq,
            valued,
            runs,
        } => {
            let rows = store.entrants_after(*after_seq, limits.values_per_step.max(1))?;
            let Some(last) = rows.last().map(|(s, _)| *s) else {
                return Ok(DrawState::Merge {
                    cursors: vec![0; runs.len()],
                    runs: runs.clone(),
                    next_bucket: 0,
                    written: 0,
                });
            };
            let mut items: Vec<Item> = rows.into_iter().map(|(_, e)| (value(&e), e)).collect();
            items.sort_unstable();
            store.put_run(runs.len() as u64, &items)?;
            let mut runs = runs.clone();
            runs.push(items.len() as u64);
            Ok(DrawState::Values {
                after_seq: last,
                valued: valued + items.len() as u64,
                runs,
            })
        }
        DrawState::Merge {
            runs,
            cursors,
            next_bucket,
            written,
        } => merge_step(store, runs, cursors, *next_bucket, *written, limits),
        DrawState::Done { .. } => Ok(state.clone()),
    }
}

/// One merge step: up to `buckets_per_step` buckets from the runs' heads.
fn merge_step<S: DrawStore>(
    store: &mut S,
    runs: &[u64],
    cursors: &[u64],
    mut next: u64,
    mut written: u64,
    limits: Limits,
) -> Result<DrawState, S::Error> {
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, VecDeque};
    let mut cursors = cursors.to_vec();
    cursors.resize(runs.len(), 0);
    // A run's unmerged items read so far, and where its reading stopped.
    let mut heads: Vec<VecDeque<Item>> = vec![VecDeque::new(); runs.len()];
    let mut read_to = cursors.clone();
    // Reads the next chunk of run `r` once its read items are used up.
    fn refill<S: DrawStore>(
        store: &mut S,
        runs: &[u64],
        r: usize,
        heads: &mut [VecDeque<Item>],
        read_to: &mut [u64],
    ) -> Result<(), S::Error> {
        if heads[r].is_empty() && read_to[r] < runs[r] {
            let want = MERGE_CHUNK.min((runs[r] - read_to[r]) as usize);
            let got = store.run_items(r as u64, read_to[r], want)?;
            read_to[r] += got.len() as u64;
            heads[r].extend(got);
        }
        Ok(())
    }
    let mut heap = BinaryHeap::new();
    for r in 0..runs.len() {
        refill(store, runs, r, &mut heads, &mut read_to)?;
        if let Some(front) = heads[r].front() {
            heap.push(Reverse((front.0.clone(), r)));
        }
    }
    for _ in 0..limits.buckets_per_step.max(1) {
        let mut bucket: Vec<Item> = Vec::with_capacity(BUCKET_SIZE);
        while bucket.len() < BUCKET_SIZE {
            let Some(Reverse((_, r))) = heap.pop() else {
                break;
            };
            let item = heads[r].pop_front().expect("a run in the heap has a head");
            cursors[r] += 1;
            bucket.push(item);
            refill(store, runs, r, &mut heads, &mut read_to)?;
            if let Some(front) = heads[r].front() {
                heap.push(Reverse((front.0.clone(), r)));
            }
        }
        if bucket.is_empty() {
            return Ok(DrawState::Done {
                count: written,
                buckets: next,
            });
        }
        store.put_bucket(next, &bucket)?;
        next += 1;
        written += bucket.len() as u64;
        if bucket.len() < BUCKET_SIZE {
            return Ok(DrawState::Done {
                count: written,
                buckets: next,
            });
        }
    }
    if heap.is_empty() {
        return Ok(DrawState::Done {
            count: written,
            buckets: next,
        });
    }
    Ok(DrawState::Merge {
        runs: runs.to_vec(),
        cursors,
        next_bucket: next,
        written,
    })
}

/// A shard held in memory: the host's [`DrawStore`] (tests, benchmark).
#[derive(Debug, Default, Clone)]
pub struct MemShard {
    /// `(seq, entrant)` in seq order.
    pub entrants: Vec<(u64, String)>,
    /// The sorted runs the values phase wrote.
    pub runs: Vec<Vec<Item>>,
    /// Each bucket's values, ascending.
    pub buckets: Vec<Vec<String>>,
    /// Each bucket's entrants, in the order of its values.
    pub bucket_entrants: Vec<Vec<String>>,
}

impl MemShard {
    pub fn join(&mut self, entrant: impl Into<String>) {
        let seq = self.entrants.len() as u64 + 1;
        self.entrants.push((seq, entrant.into()));
    }

    /// The shard's index once drawn: first value of each bucket.
    pub fn index(&self) -> ShardIndex {
        ShardIndex {
            count: self.buckets.iter().map(|b| b.len() as u64).sum(),
            firsts: self
                .buckets
                .iter()
                .filter_map(|b| b.first().cloned())
                .collect(),
        }
    }

    /// Bytes held (strings' heap plus containers), an estimate for the
    /// memory figure of the benchmark.
    pub fn approx_bytes(&self) -> usize {
        let s = std::mem::size_of::<String>();
        let strings = |v: &Vec<String>| v.iter().map(|x| x.capacity() + s).sum::<usize>();
        self.entrants
            .iter()
            .map(|(_, a)| a.capacity() + s + 8)
            .sum::<usize>()
            + self
                .runs
                .iter()
                .flatten()
                .map(|(v, e)| v.capacity() + e.capacity() + 2 * s)
                .sum::<usize>()
            + self.buckets.iter().map(strings).sum::<usize>()
            + self.bucket_entrants.iter().map(strings).sum::<usize>()
    }
}

impl DrawStore for MemShard {
    type Error = std::convert::Infallible;

    fn entrants_after(
        &mut self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<(u64, String)>, Self::Error> {
        let from = self.entrants.partition_point(|(s, _)| *s <= after_seq);
        Ok(self.entrants[from..].iter().take(limit).cloned().collect())
    }

    fn put_run(&mut self, run: u64, items: &[Item]) -> Result<(), Self::Error> {
        let r = run as usize;
        if self.runs.len() <= r {
            self.runs.resize(r + 1, Vec::new());
        }
        self.runs[r] = items.to_vec();
        Ok(())
    }

    fn run_items(&mut self, run: u64, from: u64, limit: usize) -> Result<Vec<Item>, Self::Error> {
        Ok(self
            .runs
            .get(run as usize)
            .map(|r| r.iter().skip(from as usize).take(limit).cloned().collect())
            .unwrap_or_default())
    }

    fn put_bucket(&mut self, index: u64, items: &[Item]) -> Result<(), Self::Error> {
        let i = index as usize;
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, Vec::new());
            self.bucket_entrants.resize(i + 1, Vec::new());
        }
        self.buckets[i] = items.iter().map(|(v, _)| v.clone()).collect();
        self.bucket_entrants[i] = items.iter().map(|(_, e)| e.clone()).collect();
        Ok(())
    }
}

/// Runs a draw to the end (host helper); returns the number of steps.
pub fn run_to_end<S: DrawStore>(
    store: &mut S,
    value: &dyn Fn(&str) -> String,
    limits: Limits,
) -> Result<(DrawState, u64), S::Error> {
    let mut state = DrawState::start();
    let mut steps = 0;
    while !state.is_done() {
        state = step(&state, store, value, limits)?;
        steps += 1;
    }
    Ok((state, steps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::draw::hash::value_hex;

    fn shard(n: usize) -> MemShard {
        let mut s = MemShard::default();
        for i in 0..n {
            s.join(format!("acct-{i}"));
        }
        s
    }

    #[test]
    fn buckets_hold_every_value_sorted_and_contiguous() {
        let key = [0xab; 32];
        let value = |a: &str| value_hex(&key, a);
        for n in [0usize, 1, 511, 512, 513, 5_000] {
            let mut s = shard(n);
            let (state, _) = run_to_end(&mut s, &value, Limits::default()).unwrap();
            assert_eq!(
                state,
                DrawState::Done {
                    count: n as u64,
                    buckets: n.div_ceil(BUCKET_SIZE) as u64
                }
            );
            let all: Vec<String> = s.buckets.iter().flatten().cloned().collect();
            let mut want: Vec<String> = (0..n).map(|i| value(&format!("acct-{i}"))).collect();
            want.sort();
            assert_eq!(all, want, "n = {n}");
            for b in &s.buckets[..s.buckets.len().saturating_sub(1)] {
                assert_eq!(b.len(), BUCKET_SIZE);
            }
        }
    }

    #[test]
    fn buckets_carry_each_value_with_its_entrant() {
        let key = [0x11; 32];
        let value = |a: &str| value_hex(&key, a);
        let mut s = shard(1_500);
        run_to_end(&mut s, &value, Limits::default()).unwrap();
        for (vals, ents) in s.buckets.iter().zip(&s.bucket_entrants) {
            assert_eq!(vals.len(), ents.len());
            for (v, e) in vals.iter().zip(ents) {
                assert_eq!(*v, value(e));
            }
        }
    }

    #[test]
    fn steps_are_bounded_and_resumable() {
        let key = [0xcd; 32];
        let value = |a: &str| value_hex(&key, a);
        let limits = Limits {
            values_per_step: 300,
            buckets_per_step: 2,
        };
        let mut s = shard(5_000);
        let mut state = DrawState::start();
        let mut steps = 0;
        while !state.is_done() {
            let before_runs = s.runs.len();
            let before_buckets = s.buckets.len();
            // Resume: the state goes through JSON (what the object stores)
            // and a step is re-run from a stored state before moving on.
            let stored: DrawState =
                serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
            let again = step(&stored, &mut s.clone(), &value, limits).unwrap();
            state = step(&stored, &mut s, &value, limits).unwrap();
            assert_eq!(again, state, "a re-run step gives the same state");
            assert!(s.runs.len() - before_runs <= 1);
            assert!(s.runs.iter().all(|r| r.len() <= 300));
            assert!(s.buckets.len() - before_buckets <= 2);
            steps += 1;
        }
        // 5,000 / 300 value steps (+1 empty), 10 buckets / 2 per step.
        assert_eq!(steps, 17 + 1 + 5);
        assert_eq!(s.buckets.len(), 10);
    }

    /// A store that counts what each step reads and writes.
    struct Counting {
        inner: MemShard,
        rows_read: usize,
        largest_read: usize,
    }

    impl DrawStore for Counting {
        type Error = std::convert::Infallible;
        fn entrants_after(&mut self, a: u64, l: usize) -> Result<Vec<(u64, String)>, Self::Error> {
            self.inner.entrants_after(a, l)
        }
        fn put_run(&mut self, r: u64, items: &[Item]) -> Result<(), Self::Error> {
            self.inner.put_run(r, items)
        }
        fn run_items(&mut self, r: u64, f: u64, l: usize) -> Result<Vec<Item>, Self::Error> {
            let got = self.inner.run_items(r, f, l)?;
            self.rows_read += got.len();
            self.largest_read = self.largest_read.max(got.len());
            Ok(got)
        }
        fn put_bucket(&mut self, i: u64, items: &[Item]) -> Result<(), Self::Error> {
            self.inner.put_bucket(i, items)
        }
    }

    #[test]
    fn a_merge_step_reads_a_few_rows_of_each_run_not_whole_runs() {
        let key = [0x5a; 32];
        let value = |a: &str| value_hex(&key, a);
        // 100 runs of 1,024: reading whole runs would be 102,400 rows a step.
        let mut s = Counting {
            inner: shard(102_400),
            rows_read: 0,
            largest_read: 0,
        };
        let mut state = DrawState::start();
        while matches!(state, DrawState::Values { .. }) {
            state = step(&state, &mut s, &value, Limits::default()).unwrap();
        }
        let mut worst = 0;
        while !state.is_done() {
            s.rows_read = 0;
            state = step(&state, &mut s, &value, Limits::default()).unwrap();
            worst = worst.max(s.rows_read);
        }
        assert_eq!(s.largest_read, MERGE_CHUNK);
        // Every run's first chunk, plus what two buckets consume.
        assert!(
            worst <= 100 * MERGE_CHUNK + 2 * BUCKET_SIZE,
            "{worst} rows in one step"
        );
        let all: Vec<String> = s.inner.buckets.iter().flatten().cloned().collect();
        assert_eq!(all.len(), 102_400);
        assert!(all.windows(2).all(|w| w[0] < w[1]));
    }
}
