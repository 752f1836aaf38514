//! The independent check of a finished draw (issue 15 #6): everything the
//! edge publishes, re-derived from scratch, the first discrepancy named.
//!
//! Role: pure verification over parsed documents — the `origin audit draw`
//! command downloads them, and the tests tamper with them. What it proves
//! when it passes:
//! - the seed is the one committed to before anyone joined
//!   (`SHA-256(seed) = commitment`);
//! - the listing holds exactly the committed entrant set: its leaves,
//!   sorted and without repeats, have the published Merkle root and count;
//! - the key is `SHA-256(seed ‖ entrants_root ‖ beacon)` for the published
//!   beacon value (an auditor who trusts the beacon checks that value
//!   against the beacon itself);
//! - every value is `SHA-256(key ‖ leaf)`, and places are ranks of values:
//!   1..n in listing order, values strictly ascending.
//!
//! And for one entrant's receipt: their leaf is `SHA-256("fs-leaf:" ‖
//! account ‖ ":" ‖ hex(salt))`, it is in the committed tree at the index
//! given (RFC 6962 audit path), and the listing has it at their place.

use crate::{Hash, key, leaf, root, value, verify_audit_path};

/// One row of the published listing: `{place, leaf, value}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub place: u64,
    pub leaf: Hash,
    pub value: Hash,
}

/// What the edge publishes about a finished draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub commitment: Hash,
    pub seed: Vec<u8>,
    pub entrants: u64,
    pub entrants_root: Hash,
    /// The beacon's randomness the key was made with (empty: the sale named
    /// no beacon, or it did not answer in time).
    pub beacon: Vec<u8>,
    pub key: Hash,
    /// The whole listing, in the order published (by place).
    pub entries: Vec<Entry>,
}

/// An entrant's receipt (`GET /api/sales/{sale}/queue/receipt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub leaf: Hash,
    pub salt: [u8; 16],
    pub leaf_index: u64,
    pub audit_path: Vec<Hash>,
    pub place: u64,
}

/// The first thing that does not add up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Discrepancy {
    #[error("the seed does not match the commitment published before the sale")]
    Commitment,
    #[error("the listing has {listed} entries, the summary says {published} entrants")]
    EntrantCount { published: u64, listed: u64 },
    #[error("the listing's places are not 1..n in order: entry {index} has place {place}")]
    PlaceOrder { index: u64, place: u64 },
    #[error("leaf {leaf} is listed twice (places {first} and {second})")]
    DuplicateLeaf {
        leaf: String,
        first: u64,
        second: u64,
    },
    #[error("the listed leaves do not have the published entrants_root")]
    EntrantsRoot,
    #[error("the key is not SHA-256(seed ‖ entrants_root ‖ beacon)")]
    Key,
    #[error("the value at place {place} is not SHA-256(key ‖ leaf)")]
    Value { place: u64 },
    #[error("place {place} has a value not above place {prev}'s: places are not ranks of values")]
    Rank { place: u64, prev: u64 },
    #[error("the receipt's leaf is not this account's with this salt")]
    ReceiptLeaf,
    #[error("the receipt's audit path does not lead to entrants_root")]
    ReceiptPath,
    #[error("the listing does not have the receipt's leaf at place {place}")]
    ReceiptPlace { place: u64 },
}

/// Checks a whole published draw.
pub fn audit(p: &Published) -> Result<(), Discrepancy> {
    if crate::commitment(&p.seed) != crate::to_hex(&p.commitment) {
        return Err(Discrepancy::Commitment);
    }
    let listed = p.entries.len() as u64;
    if listed != p.entrants {
        return Err(Discrepancy::EntrantCount {
            published: p.entrants,
            listed,
        });
    }
    for (i, e) in p.entries.iter().enumerate() {
        if e.place != i as u64 + 1 {
            return Err(Discrepancy::PlaceOrder {
                index: i as u64,
                place: e.place,
            });
        }
    }
    // The committed set: the listing's leaves sorted (the tree's order).
    let mut by_leaf: Vec<(&Hash, u64)> = p.entries.iter().map(|e| (&e.leaf, e.place)).collect();
    by_leaf.sort();
    for w in by_leaf.windows(2) {
        if w[0].0 == w[1].0 {
            let (first, second) = (w[0].1.min(w[1].1), w[0].1.max(w[1].1));
            return Err(Discrepancy::DuplicateLeaf {
                leaf: crate::to_hex(w[0].0),
                first,
                second,
            });
        }
    }
    let leaves: Vec<&Hash> = by_leaf.iter().map(|(l, _)| *l).collect();
    if root(&leaves) != p.entrants_root {
        return Err(Discrepancy::EntrantsRoot);
    }
    if key(&p.seed, &p.entrants_root, &p.beacon) != p.key {
        return Err(Discrepancy::Key);
    }
    let mut prev: Option<&Entry> = None;
    for e in &p.entries {
        if value(&p.key, &e.leaf) != e.value {
            return Err(Discrepancy::Value { place: e.place });
        }
        if let Some(b) = prev
            && e.value <= b.value
        {
            return Err(Discrepancy::Rank {
                place: e.place,
                prev: b.place,
            });
        }
        prev = Some(e);
    }
    Ok(())
}

/// Checks one entrant's receipt against a draw that passed [`audit`].
pub fn audit_receipt(p: &Published, account: &str, r: &Receipt) -> Result<(), Discrepancy> {
    if leaf(account, &r.salt) != r.leaf {
        return Err(Discrepancy::ReceiptLeaf);
    }
    if !verify_audit_path(
        &r.leaf,
        r.leaf_index,
        p.entrants,
        &r.audit_path,
        &p.entrants_root,
    ) {
        return Err(Discrepancy::ReceiptPath);
    }
    let at = r
        .place
        .checked_sub(1)
        .and_then(|i| p.entries.get(i as usize));
    if at.is_none_or(|e| e.leaf != r.leaf) {
        return Err(Discrepancy::ReceiptPlace { place: r.place });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{audit_path, commitment, from_hex, to_hex};

    /// A draw of `n` entrants made the way the edge makes it.
    fn draw(n: usize, beacon: &[u8]) -> (Published, Vec<(String, [u8; 16])>) {
        let seed = [42u8; 32];
        let people: Vec<(String, [u8; 16])> = (0..n)
            .map(|i| (format!("acct-{i}"), [(i % 251) as u8; 16]))
            .collect();
        let mut leaves: Vec<Hash> = people.iter().map(|(a, s)| leaf(a, s)).collect();
        leaves.sort();
        let entrants_root = root(&leaves);
        let k = key(&seed, &entrants_root, beacon);
        let mut entries: Vec<Entry> = leaves
            .iter()
            .map(|l| Entry {
                place: 0,
                leaf: *l,
                value: value(&k, l),
            })
            .collect();
        entries.sort_by_key(|a| a.value);
        for (i, e) in entries.iter_mut().enumerate() {
            e.place = i as u64 + 1;
        }
        let p = Published {
            commitment: from_hex(&commitment(&seed)).unwrap(),
            seed: seed.to_vec(),
            entrants: n as u64,
            entrants_root,
            beacon: beacon.to_vec(),
            key: k,
            entries,
        };
        (p, people)
    }

    fn receipt_of(p: &Published, who: &(String, [u8; 16])) -> Receipt {
        let l = leaf(&who.0, &who.1);
        let mut leaves: Vec<Hash> = p.entries.iter().map(|e| e.leaf).collect();
        leaves.sort();
        let idx = leaves.binary_search(&l).unwrap();
        Receipt {
            leaf: l,
            salt: who.1,
            leaf_index: idx as u64,
            audit_path: audit_path(&leaves, idx).unwrap(),
            place: p.entries.iter().find(|e| e.leaf == l).unwrap().place,
        }
    }

    #[test]
    fn an_honest_draw_and_every_receipt_pass() {
        for beacon in [&b""[..], &[9u8; 32][..]] {
            let (p, people) = draw(300, beacon);
            assert_eq!(audit(&p), Ok(()));
            for who in &people {
                assert_eq!(audit_receipt(&p, &who.0, &receipt_of(&p, who)), Ok(()));
            }
        }
        let (p, _) = draw(0, b"");
        assert_eq!(audit(&p), Ok(()), "a sale nobody joined before the start");
    }

    #[test]
    fn a_swapped_pair_fails() {
        let (mut p, _) = draw(300, b"");
        p.entries.swap(10, 11);
        p.entries[10].place = 11;
        p.entries[11].place = 12;
        assert_eq!(
            audit(&p),
            Err(Discrepancy::Rank {
                place: 12,
                prev: 11
            })
        );
        // Swapping only the values keeps ranks ascending but breaks values.
        let (mut p, _) = draw(300, b"");
        let (a, b) = (p.entries[10].value, p.entries[11].value);
        p.entries[10].value = b;
        p.entries[11].value = a;
        assert_eq!(audit(&p), Err(Discrepancy::Value { place: 11 }));
    }

    #[test]
    fn an_injected_leaf_fails() {
        let (mut p, _) = draw(300, b"");
        let extra = leaf("sybil", &[0u8; 16]);
        p.entries.push(Entry {
            place: 301,
            leaf: extra,
            value: value(&p.key, &extra),
        });
        // With the count left alone, the count gives it away…
        assert_eq!(
            audit(&p),
            Err(Discrepancy::EntrantCount {
                published: 300,
                listed: 301
            })
        );
        // …and with the count bumped too, the root does.
        p.entrants = 301;
        p.entries.sort_by_key(|a| a.value);
        for (i, e) in p.entries.iter_mut().enumerate() {
            e.place = i as u64 + 1;
        }
        assert_eq!(audit(&p), Err(Discrepancy::EntrantsRoot));
    }

    #[test]
    fn another_seed_or_beacon_fails() {
        let (mut p, _) = draw(300, &[7u8; 32]);
        p.seed[0] ^= 1;
        assert_eq!(audit(&p), Err(Discrepancy::Commitment));
        let (mut p, _) = draw(300, &[7u8; 32]);
        p.beacon[0] ^= 1;
        assert_eq!(audit(&p), Err(Discrepancy::Key));
        let (mut p, _) = draw(300, &[7u8; 32]);
        p.beacon.clear();
        assert_eq!(audit(&p), Err(Discrepancy::Key), "the beacon left out");
    }

    #[test]
    fn a_duplicate_leaf_or_misnumbered_place_is_named() {
        let (mut p, _) = draw(50, b"");
        p.entries[20].leaf = p.entries[5].leaf;
        assert_eq!(
            audit(&p),
            Err(Discrepancy::DuplicateLeaf {
                leaf: to_hex(&p.entries[5].leaf),
                first: 6,
                second: 21
            })
        );
        let (mut p, _) = draw(50, b"");
        p.entries[3].place = 7;
        assert_eq!(
            audit(&p),
            Err(Discrepancy::PlaceOrder { index: 3, place: 7 })
        );
    }

    #[test]
    fn a_receipt_for_someone_else_or_elsewhere_fails() {
        let (p, people) = draw(100, b"");
        let r = receipt_of(&p, &people[3]);
        assert_eq!(
            audit_receipt(&p, &people[4].0, &r),
            Err(Discrepancy::ReceiptLeaf)
        );
        let mut moved = r.clone();
        moved.place = if r.place == 1 { 2 } else { r.place - 1 };
        assert_eq!(
            audit_receipt(&p, &people[3].0, &moved),
            Err(Discrepancy::ReceiptPlace { place: moved.place })
        );
        let mut bent = r.clone();
        bent.leaf_index = (r.leaf_index + 1) % 100;
        assert_eq!(
            audit_receipt(&p, &people[3].0, &bent),
            Err(Discrepancy::ReceiptPath)
        );
    }
}
