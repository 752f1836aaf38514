//! The verifiable draw, v2 (DESIGN.md "The draw, v2"): the arithmetic that
//! the edge runs and that anyone can re-run from what is published. Pure
//! (no I/O, no clock, no randomness source): the same code builds for the
//! edge (wasm32) and the origin's auditor, so the two cannot disagree.
//!
//! - `leaf = SHA-256("fs-leaf:" ‖ account ‖ ":" ‖ hex(salt))`, a 16-byte
//!   random salt per entrant, so a guessable account id does not reveal
//!   whether (or where) it joined;
//! - the entrant set is committed by an RFC 6962 Merkle tree over the leaves
//!   sorted ascending (leaf hash `SHA-256(0x00 ‖ leaf)`, node hash
//!   `SHA-256(0x01 ‖ left ‖ right)`, the largest power of two below `n`
//!   splits), built here in one pass with O(log n) memory ([`RootBuilder`]),
//!   with audit paths ([`audit_path`]) every entrant can check
//!   ([`verify_audit_path`]);
//! - `key = SHA-256(seed ‖ entrants_root ‖ beacon)`, `value = SHA-256(key ‖
//!   leaf)`; places are ranks of `value`, ascending.
//!
//! Invariants: nothing here depends on arrival order (fairness), and no one
//! who knows the seed before the freeze can place an account: the key also
//! needs the root of the frozen set and the beacon published after it.

pub mod audit;

use sha2::{Digest, Sha256};

/// A 32-byte hash.
pub type Hash = [u8; 32];

fn sha256(parts: &[&[u8]]) -> Hash {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// `hex(SHA-256(seed))`: published before anyone joins.
pub fn commitment(seed: &[u8]) -> String {
    hex::encode(sha256(&[seed]))
}

/// An entrant's leaf: `SHA-256("fs-leaf:" ‖ account ‖ ":" ‖ hex(salt))`.
pub fn leaf(account: &str, salt: &[u8; 16]) -> Hash {
    sha256(&[
        b"fs-leaf:",
        account.as_bytes(),
        b":",
        hex::encode(salt).as_bytes(),
    ])
}

/// RFC 6962 leaf hash: `SHA-256(0x00 ‖ leaf)`. (Leaves are byte strings
/// in RFC 6962; the draw's are 32 bytes.)
pub fn leaf_hash(leaf: &[u8]) -> Hash {
    sha256(&[&[0u8], leaf])
}

/// RFC 6962 interior node hash: `SHA-256(0x01 ‖ left ‖ right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    sha256(&[&[1u8], left, right])
}

/// The Merkle tree hash of an empty list: `SHA-256("")`.
pub fn empty_root() -> Hash {
    sha256(&[])
}

/// The largest power of two strictly below `n` (n ≥ 2): RFC 6962's split.
fn split(n: usize) -> usize {
    debug_assert!(n >= 2);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// The RFC 6962 Merkle tree hash of `leaves`, in the order given (the draw
/// gives them sorted ascending). Recursive and simple: the reference the
/// one-pass [`RootBuilder`] is tested against.
pub fn root<L: AsRef<[u8]>>(leaves: &[L]) -> Hash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaf_hash(leaves[0].as_ref()),
        n => {
            let k = split(n);
            node_hash(&root(&leaves[..k]), &root(&leaves[k..]))
        }
    }
}

/// Builds the root in one pass over the leaves, keeping at most one pending
/// subtree per power of two (≤ 64 hashes): the coordinator can stream a
/// million leaves merged from its shards without holding them.
#[derive(Debug, Default, Clone)]
pub struct RootBuilder {
    /// Complete subtrees, largest first: (height, hash); heights strictly
    /// decrease, exactly the binary digits of `count`.
    stack: Vec<(u32, Hash)>,
    count: u64,
}

impl RootBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the next leaf (callers add them sorted ascending).
    pub fn push(&mut self, leaf: &[u8]) {
        let mut node = (0u32, leaf_hash(leaf));
        while let Some(&(h, left)) = self.stack.last() {
            if h != node.0 {
                break;
            }
            self.stack.pop();
            node = (h + 1, node_hash(&left, &node.1));
        }
        self.stack.push(node);
        self.count += 1;
    }

    /// Leaves added so far.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// What to store to resume later: the leaf count and the pending
    /// complete subtrees `(height, hash)`, largest first.
    pub fn parts(&self) -> (u64, &[(u32, Hash)]) {
        (self.count, &self.stack)
    }

    /// A builder resumed from [`RootBuilder::parts`]; `None` unless the
    /// subtrees are exactly the binary digits of `count` (largest first),
    /// so a corrupted store cannot make a wrong root silently.
    pub fn resume(count: u64, stack: Vec<(u32, Hash)>) -> Option<Self> {
        let mut digits: Vec<u32> = (0..64).rev().filter(|b| count >> b & 1 == 1).collect();
        digits.dedup();
        let heights: Vec<u32> = stack.iter().map(|(h, _)| *h).collect();
        (heights == digits).then_some(RootBuilder { stack, count })
    }

    /// The root of everything pushed. RFC 6962 splits at the largest power
    /// of two, so the complete subtrees fold from the right.
    pub fn finish(&self) -> Hash {
        let mut it = self.stack.iter().rev();
        let Some(&(_, mut acc)) = it.next() else {
            return empty_root();
        };
        for (_, left) in it {
            acc = node_hash(left, &acc);
        }
        acc
    }
}

/// The audit path of leaf `index` in the tree of `leaves` (RFC 6962 §2.1.1):
/// sibling hashes from the bottom up.
pub fn audit_path<L: AsRef<[u8]>>(leaves: &[L], index: usize) -> Option<Vec<Hash>> {
    if index >= leaves.len() {
        return None;
    }
    let mut path = Vec::new();
    collect_path(leaves, index, &mut path);
    Some(path)
}

fn collect_path<L: AsRef<[u8]>>(leaves: &[L], index: usize, path: &mut Vec<Hash>) {
    let n = leaves.len();
    if n <= 1 {
        return;
    }
    let k = split(n);
    if index < k {
        collect_path(&leaves[..k], index, path);
        path.push(root(&leaves[k..]));
    } else {
        collect_path(&leaves[k..], index - k, path);
        path.push(root(&leaves[..k]));
    }
}

/// The Merkle tree hash over `nodes` that are already subtree hashes (the
/// roots of consecutive aligned chunks of the leaves): RFC 6962 splits a
/// list at the largest power of two below its length, so with chunks of a
/// power-of-two size every chunk but the last is a whole subtree, and the
/// tree of the leaves is this tree over its chunks' roots. `None` if empty.
pub fn root_of_nodes(nodes: &[Hash]) -> Option<Hash> {
    match nodes.len() {
        0 => None,
        1 => Some(nodes[0]),
        n => {
            let k = split(n);
            Some(node_hash(
                &root_of_nodes(&nodes[..k])?,
                &root_of_nodes(&nodes[k..])?,
            ))
        }
    }
}

fn collect_node_path(nodes: &[Hash], index: usize, path: &mut Vec<Hash>) {
    let n = nodes.len();
    if n <= 1 {
        return;
    }
    let k = split(n);
    let sibling = if index < k {
        collect_node_path(&nodes[..k], index, path);
        root_of_nodes(&nodes[k..])
    } else {
        collect_node_path(&nodes[k..], index - k, path);
        root_of_nodes(&nodes[..k])
    };
    path.extend(sibling);
}

/// The audit path of one leaf from what a chunked store keeps: the leaves
/// of its own chunk (`chunk_leaves`, the leaf at `index_in_chunk`) and the
/// roots of every chunk (`chunk_roots`, this one at `chunk`). Every chunk
/// but the last must hold the same power-of-two number of leaves. Equal to
/// [`audit_path`] over all the leaves (tested), without holding them.
pub fn chunked_audit_path<L: AsRef<[u8]>>(
    chunk_leaves: &[L],
    index_in_chunk: usize,
    chunk_roots: &[Hash],
    chunk: usize,
) -> Option<Vec<Hash>> {
    if chunk >= chunk_roots.len() {
        return None;
    }
    let mut path = audit_path(chunk_leaves, index_in_chunk)?;
    collect_node_path(chunk_roots, chunk, &mut path);
    Some(path)
}

/// Checks that `leaf` is at `index` of a tree of `size` leaves with `root`,
/// given its bottom-up audit path (RFC 9162 §2.1.3.2). What an entrant's
/// browser and the auditor run; constant work per level, no tree needed.
pub fn verify_audit_path(leaf: &[u8], index: u64, size: u64, path: &[Hash], root: &Hash) -> bool {
    if index >= size {
        return false;
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut r = leaf_hash(leaf);
    for p in path {
        if snode == 0 {
            return false;
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            if fnode & 1 == 0 {
                while fnode & 1 == 0 && fnode != 0 {
                    fnode >>= 1;
                    snode >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    snode == 0 && r == *root
}

/// `key = SHA-256(seed ‖ entrants_root ‖ beacon)`; `beacon` is empty when
/// the sale names none (or it did not answer in time).
pub fn key(seed: &[u8], entrants_root: &Hash, beacon: &[u8]) -> Hash {
    sha256(&[seed, entrants_root, beacon])
}

/// An entrant's draw value: `SHA-256(key ‖ leaf)`; places are ranks of
/// values, ascending.
pub fn value(key: &Hash, leaf: &Hash) -> Hash {
    sha256(&[key, leaf])
}

/// The drand-style round whose publication time is the first at or after
/// `starts_at` (unix seconds): round `r` is published at
/// `genesis + (r − 1) × period`. `None` for a period of 0.
pub fn beacon_round(genesis: u64, period: u64, starts_at: u64) -> Option<u64> {
    if period == 0 {
        return None;
    }
    if starts_at <= genesis {
        return Some(1);
    }
    Some((starts_at - genesis).div_ceil(period) + 1)
}

/// Lowercase hex, as JSON carries hashes.
pub fn to_hex(h: &Hash) -> String {
    hex::encode(h)
}

/// Parses 64 hex digits into a hash.
pub fn from_hex(s: &str) -> Option<Hash> {
    let v = hex::decode(s).ok()?;
    v.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_the_largest_power_of_two_below() {
        for (n, k) in [(2, 1), (3, 2), (4, 2), (5, 4), (8, 4), (9, 8), (1000, 512)] {
            assert_eq!(split(n), k, "n={n}");
        }
    }

    #[test]
    fn beacon_rounds() {
        // Round 1 at genesis, round r at genesis + (r-1)·period.
        assert_eq!(beacon_round(1000, 30, 900), Some(1));
        assert_eq!(beacon_round(1000, 30, 1000), Some(1));
        assert_eq!(beacon_round(1000, 30, 1001), Some(2));
        assert_eq!(beacon_round(1000, 30, 1030), Some(2));
        assert_eq!(beacon_round(1000, 30, 1031), Some(3));
        assert_eq!(beacon_round(1000, 0, 1031), None);
    }

    #[test]
    fn hex_round_trip() {
        let h = leaf("alice", &[7u8; 16]);
        assert_eq!(from_hex(&to_hex(&h)), Some(h));
        assert_eq!(from_hex("00"), None);
        assert_eq!(from_hex(&"z".repeat(64)), None);
    }
}
