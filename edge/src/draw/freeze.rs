//! The freeze of the entrant set for the draw v2 (DESIGN.md "The draw, v2"
//! step 3), at the coordinator, in bounded, resumable steps.
//!
//! Role: every shard keeps its pre-queue leaves sorted (an SQLite index);
//! the coordinator merges them into the one ascending list the Merkle tree
//! is built over — without ever holding it: each step merges what the
//! shards' current pages allow (at most `max_out` leaves), feeds a one-pass
//! [`draw::RootBuilder`], and cuts the merged list into chunks of
//! [`CHUNK`] leaves with their roots (stored for receipts: a chunk and the
//! list of chunk roots give any leaf's audit path, `draw::chunked_audit_path`).
//! Pure: the coordinator fetches pages (`leaves after <cursor>`) for the
//! shards [`Freeze::wants`] names and stores what [`Freeze::merge`] returns.
//!
//! Invariants kept here:
//! - a leaf is merged only when every shard not yet exhausted has a leaf
//!   in hand, so the merged list is exactly the sorted union;
//! - the state stores, per shard, the last leaf merged: pages held in
//!   memory may be dropped at any time (an evicted object) and fetched
//!   again after the cursor, and the result is the same;
//! - a shard is exhausted only when a page shorter than asked came back
//!   and all of it is merged;
//! - every chunk but the last holds exactly [`CHUNK`] leaves; the root is
//!   known only when every shard is exhausted.
//!
//! Leaves are unique across shards (each account lives on one shard; a
//! leaf hashes the account) and within one (one entry per account): pages
//! are "strictly after the cursor".

use std::collections::VecDeque;

use std::marker::PhantomData;

use draw::{Hash, RootBuilder};
use serde::{Deserialize, Serialize};

/// Entries one listing page gives at most (`GET …/draw?from=&limit=`).
pub const LISTING_MAX: u64 = 512;

/// What a freeze merges: fixed-size byte strings ordered as bytes. The
/// entrant set merges leaves ([`Hash`]); the published listing merges
/// `value ‖ leaf` pairs (`[u8; 64]`, ordered by value: values are unique).
pub trait Item: Copy + Ord + AsRef<[u8]> {
    fn from_hex(s: &str) -> Option<Self>;
    fn to_hex(&self) -> String {
        hex::encode(self)
    }
}

impl<const N: usize> Item for [u8; N] {
    fn from_hex(s: &str) -> Option<Self> {
        hex::decode(s).ok()?.try_into().ok()
    }
}

/// Leaves per stored chunk (a power of two: RFC 6962 keeps aligned chunks
/// whole subtrees).
pub const CHUNK: usize = 512;

/// One shard's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Cursor {
    /// The last leaf of this shard merged (hex); `None`: none yet.
    pub after: Option<String>,
    /// All of this shard's leaves are merged.
    pub exhausted: bool,
}

/// The stored state of the freeze.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct Freeze<T = Hash> {
    pub shards: Vec<Cursor>,
    /// Merged leaves not yet in a written chunk (fewer than [`CHUNK`]).
    pub pending: Vec<String>,
    /// Chunks written so far.
    pub chunks: u64,
    /// The root builder's parts (`RootBuilder::parts`), hex.
    pub builder: Vec<(u32, String)>,
    pub merged: u64,
    /// The Merkle root of every leaf, once all are merged.
    pub root: Option<String>,
    #[serde(skip)]
    pub item: PhantomData<T>,
}

/// Leaves in hand for one shard (memory only), ascending: what pages
/// fetched after its cursor brought and the merge has not taken yet.
#[derive(Debug, Clone)]
pub struct Page<T = Hash> {
    pub leaves: VecDeque<T>,
    /// A page came back shorter than asked: nothing follows these.
    pub last: bool,
}

impl<T> Default for Page<T> {
    fn default() -> Self {
        Page {
            leaves: VecDeque::new(),
            last: false,
        }
    }
}

impl<T> Page<T> {
    /// Adds a fetched page (asked after [`Freeze::wants`]' leaf, `asked`
    /// long).
    pub fn extend(&mut self, fetched: Vec<T>, asked: usize) {
        self.last = fetched.len() < asked;
        self.leaves.extend(fetched);
    }
}

/// A shard's page to fetch: leaves strictly after `after` (hex; `None`:
/// from its first leaf).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub shard: usize,
    pub after: Option<String>,
}

/// A chunk to store: its index, its leaves and their root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk<T = Hash> {
    pub index: u64,
    pub leaves: Vec<T>,
    pub root: Hash,
}

/// What a merge step produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged<T = Hash> {
    /// Chunks completed by this step (the last one may be short once done).
    pub chunks: Vec<Chunk<T>>,
    /// Leaves merged by this step.
    pub leaves: usize,
}

fn hex32(s: &str) -> Option<Hash> {
    draw::from_hex(s)
}

impl<T: Item> Freeze<T> {
    /// The freeze of `shards` shards, nothing merged.
    pub fn start(shards: u32) -> Self {
        Freeze {
            shards: vec![Cursor::default(); shards as usize],
            pending: Vec::new(),
            chunks: 0,
            builder: Vec::new(),
            merged: 0,
            root: None,
            item: PhantomData,
        }
    }

    pub fn is_done(&self) -> bool {
        self.root.is_some()
    }

    /// Pages to fetch (all at once) before the next merge: every shard not
    /// exhausted that holds fewer than `low` leaves and may have more,
    /// after the last leaf it holds (or its cursor). With `low` about half
    /// a page, a merge rarely stops for a shard that ran dry.
    pub fn wants(&self, pages: &[Page<T>], low: usize) -> Vec<Want> {
        self.shards
            .iter()
            .enumerate()
            .filter_map(|(k, c)| {
                let p = pages.get(k)?;
                (!c.exhausted && !p.last && p.leaves.len() < low.max(1)).then(|| Want {
                    shard: k,
                    after: p
                        .leaves
                        .back()
                        .map(Item::to_hex)
                        .or_else(|| c.after.clone()),
                })
            })
            .collect()
    }

    /// A shard that must be fetched before anything more can be merged:
    /// not exhausted, nothing in hand, more to come.
    fn blocked(&self, pages: &[Page<T>]) -> bool {
        self.shards
            .iter()
            .zip(pages)
            .any(|(c, p)| !c.exhausted && p.leaves.is_empty() && !p.last)
    }

    fn builder(&self) -> Option<RootBuilder> {
        let stack = self
            .builder
            .iter()
            .map(|(h, x)| Some((*h, hex32(x)?)))
            .collect::<Option<Vec<_>>>()?;
        RootBuilder::resume(self.merged, stack)
    }

    /// Merges at most `max_out` leaves from `pages` (one per shard, in
    /// shard order), as far as they allow; `None` if the stored state is
    /// corrupt (the caller starts the freeze over).
    pub fn merge(&mut self, pages: &mut [Page<T>], max_out: usize) -> Option<Merged<T>> {
        if self.is_done() {
            return Some(Merged {
                chunks: Vec::new(),
                leaves: 0,
            });
        }
        let mut b = self.builder()?;
        let mut pending: Vec<T> = self
            .pending
            .iter()
            .map(|x| T::from_hex(x))
            .collect::<Option<_>>()?;
        let mut out = Merged {
            chunks: Vec::new(),
            leaves: 0,
        };
        while out.leaves < max_out {
            // Shards that ran dry without a short page must be fetched
            // first: their next leaf may be the smallest.
            if pages.len() != self.shards.len() {
                return None;
            }
            for (c, p) in self.shards.iter_mut().zip(pages.iter()) {
                if !c.exhausted && p.leaves.is_empty() && p.last {
                    c.exhausted = true;
                }
            }
            if self.blocked(pages) {
                break;
            }
            let next = (0..self.shards.len())
                .filter(|k| !self.shards[*k].exhausted)
                .min_by_key(|k| pages[*k].leaves.front().copied());
            let Some(k) = next else {
                // Every shard exhausted: the last chunk and the root.
                if !pending.is_empty() {
                    out.chunks.push(Chunk {
                        index: self.chunks,
                        root: draw::root(&pending),
                        leaves: std::mem::take(&mut pending),
                    });
                    self.chunks += 1;
                }
                self.root = Some(draw::to_hex(&b.finish()));
                break;
            };
            let leaf = pages[k].leaves.pop_front()?;
            b.push(leaf.as_ref());
            self.shards[k].after = Some(leaf.to_hex());
            pending.push(leaf);
            out.leaves += 1;
            if pending.len() == CHUNK {
                out.chunks.push(Chunk {
                    index: self.chunks,
                    root: draw::root(&pending),
                    leaves: std::mem::take(&mut pending),
                });
                self.chunks += 1;
            }
        }
        let (merged, stack) = b.parts();
        self.merged = merged;
        self.builder = stack.iter().map(|(h, x)| (*h, draw::to_hex(x))).collect();
        self.pending = pending.iter().map(Item::to_hex).collect();
        Some(out)
    }
}

/// What receipts need of the frozen set, assembled from the stored chunks:
/// the first leaf and the root of every chunk, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkIndex {
    pub entrants: u64,
    pub firsts: Vec<String>,
    pub roots: Vec<String>,
}

impl ChunkIndex {
    /// The chunk that holds `leaf`, if any can.
    pub fn chunk_of(&self, leaf: &str) -> Option<usize> {
        match self.firsts.binary_search_by(|f| f.as_str().cmp(leaf)) {
            Ok(j) => Some(j),
            Err(0) => None,
            Err(j) => Some(j - 1),
        }
    }

    /// The receipt's `(leaf_index, audit_path)` of `leaf`, given the leaves
    /// of its chunk; `None` if it is not in the frozen set.
    pub fn locate(&self, leaf: &Hash, chunk_leaves: &[Hash]) -> Option<(u64, Vec<Hash>)> {
        let j = self.chunk_of(&draw::to_hex(leaf))?;
        let i = chunk_leaves.binary_search(leaf).ok()?;
        let roots: Vec<Hash> = self.roots.iter().map(|r| hex32(r)).collect::<Option<_>>()?;
        let path = draw::chunked_audit_path(chunk_leaves, i, &roots, j)?;
        Some(((j * CHUNK + i) as u64, path))
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs a freeze over in-memory shards: pages of `page` leaves, at most
    /// `max_out` merged a step, pages dropped after every `drop_every`
    /// steps (an evicted coordinator), and a state round trip through JSON
    /// each step. Returns the state and every chunk written.
    fn run(
        shards: &[Vec<Hash>],
        page: usize,
        max_out: usize,
        drop_every: usize,
    ) -> (Freeze, Vec<Chunk>) {
        let mut f = Freeze::start(shards.len() as u32);
        let mut pages = vec![Page::default(); shards.len()];
        let mut chunks = Vec::new();
        for step in 0.. {
            assert!(step < 100_000, "no progress");
            for w in f.wants(&pages, page / 2) {
                let after = w.after.as_deref().and_then(hex32);
                let rest: Vec<Hash> = shards[w.shard]
                    .iter()
                    .filter(|l| after.is_none_or(|a| **l > a))
                    .take(page)
                    .copied()
                    .collect();
                pages[w.shard].extend(rest, page);
            }
            let got = f.merge(&mut pages, max_out).expect("state readable");
            assert!(got.leaves <= max_out);
            chunks.extend(got.chunks);
            f = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
            if f.is_done() {
                break;
            }
            if drop_every > 0 && step % drop_every == drop_every - 1 {
                pages = vec![Page::default(); shards.len()];
            }
        }
        (f, chunks)
    }

    fn sharded(n: usize, k: usize) -> (Vec<Vec<Hash>>, Vec<Hash>) {
        let mut all: Vec<Hash> = (0..n)
            .map(|i| draw::leaf(&format!("acct-{i}"), &[(i % 256) as u8; 16]))
            .collect();
        let mut shards = vec![Vec::new(); k];
        for (i, l) in all.iter().enumerate() {
            shards[(i * 7 + l[0] as usize) % k].push(*l);
        }
        for s in &mut shards {
            s.sort();
        }
        all.sort();
        (shards, all)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn the_freeze_is_the_sorted_union_whatever_the_steps(
            n in 0usize..1_300, k in 1usize..9, page in 3usize..80, max_out in 2usize..700, drop_every in 0usize..4,
        ) {
            let (shards, all) = sharded(n, k);
            let (f, chunks) = run(&shards, page, max_out, drop_every);
            prop_assert_eq!(f.root.clone(), Some(draw::to_hex(&draw::root(&all))));
            prop_assert_eq!(f.merged, n as u64);
            let flat: Vec<Hash> = chunks.iter().flat_map(|c| c.leaves.clone()).collect();
            prop_assert_eq!(&flat, &all);
            for (j, c) in chunks.iter().enumerate() {
                prop_assert_eq!(c.index, j as u64);
                prop_assert_eq!(c.root, draw::root(&c.leaves));
                if j + 1 < chunks.len() {
                    prop_assert_eq!(c.leaves.len(), CHUNK);
                }
            }
        }
    }

    #[test]
    fn every_leaf_gets_its_receipt_from_the_chunk_index() {
        let (shards, all) = sharded(1_500, 5);
        let (f, chunks) = run(&shards, 64, 300, 2);
        let index = ChunkIndex {
            entrants: f.merged,
            firsts: chunks.iter().map(|c| draw::to_hex(&c.leaves[0])).collect(),
            roots: chunks.iter().map(|c| draw::to_hex(&c.root)).collect(),
        };
        let root = draw::from_hex(f.root.as_deref().unwrap()).unwrap();
        for (i, l) in all.iter().enumerate() {
            let j = index.chunk_of(&draw::to_hex(l)).unwrap();
            let (at, path) = index.locate(l, &chunks[j].leaves).unwrap();
            assert_eq!(at, i as u64);
            assert!(draw::verify_audit_path(
                l,
                at,
                all.len() as u64,
                &path,
                &root
            ));
        }
        let stranger = draw::leaf("stranger", &[0u8; 16]);
        let j = index.chunk_of(&draw::to_hex(&stranger)).unwrap_or(0);
        assert!(index.locate(&stranger, &chunks[j].leaves).is_none());
    }

    #[test]
    fn nobody_in_the_pre_queue_freezes_to_the_empty_tree() {
        let (f, chunks) = run(&[vec![], vec![]], 10, 10, 0);
        assert_eq!(f.root, Some(draw::to_hex(&draw::empty_root())));
        assert!(chunks.is_empty());
    }

    #[test]
    fn a_corrupt_state_is_refused() {
        let mut f: Freeze = Freeze::start(2);
        f.merged = 3; // the builder's parts no longer match
        assert!(
            f.merge(&mut [Page::default(), Page::default()], 10)
                .is_none()
        );
    }
}
