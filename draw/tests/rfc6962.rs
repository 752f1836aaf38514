//! The draw's Merkle tree against the Certificate Transparency reference
//! test data (the eight leaves and tree heads of RFC 6962's reference
//! implementation's tests), plus properties: the one-pass builder equals the
//! recursive definition, every audit path verifies, and any change to the
//! leaf, index, size, path or root makes it fail.

use draw::{RootBuilder, audit_path, from_hex, root, verify_audit_path};
use proptest::prelude::*;

const LEAVES: [&str; 8] = [
    "",
    "00",
    "10",
    "2021",
    "3031",
    "40414243",
    "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
];

/// Root of the first i+1 leaves.
const ROOTS: [&str; 8] = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
];

fn leaves() -> Vec<Vec<u8>> {
    LEAVES.iter().map(|l| hex::decode(l).unwrap()).collect()
}

#[test]
fn roots_match_the_reference_data() {
    let l = leaves();
    for (i, want) in ROOTS.iter().enumerate() {
        assert_eq!(
            hex::encode(root(&l[..=i])),
            *want,
            "root of {} leaves",
            i + 1
        );
        let mut b = RootBuilder::new();
        for leaf in &l[..=i] {
            b.push(leaf);
        }
        assert_eq!(
            hex::encode(b.finish()),
            *want,
            "one-pass root of {} leaves",
            i + 1
        );
    }
    assert_eq!(
        hex::encode(root::<Vec<u8>>(&[])),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

#[test]
fn reference_audit_paths_verify_and_tampering_fails() {
    let l = leaves();
    for n in 1..=l.len() {
        let r = root(&l[..n]);
        for i in 0..n {
            let path = audit_path(&l[..n], i).unwrap();
            assert!(
                verify_audit_path(&l[i], i as u64, n as u64, &path, &r),
                "n={n} i={i}"
            );
            // Wrong index, leaf or root, or an index past the size: refused.
            // (The size itself is public: the verifier takes it from the
            // published `entrants`, not from the receipt.)
            if n > 1 {
                assert!(!verify_audit_path(
                    &l[i],
                    ((i + 1) % n) as u64,
                    n as u64,
                    &path,
                    &r
                ));
            }
            assert!(!verify_audit_path(b"other", i as u64, n as u64, &path, &r));
            assert!(!verify_audit_path(
                &l[i], i as u64, n as u64, &path, &[0u8; 32]
            ));
            assert!(!verify_audit_path(&l[i], n as u64, n as u64, &path, &r));
        }
    }
    assert_eq!(audit_path(&l, 8), None);
    assert_eq!(
        from_hex(ROOTS[0]).map(hex::encode).as_deref(),
        Some(ROOTS[0])
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn one_pass_root_equals_the_definition(seeds in proptest::collection::vec(any::<[u8; 32]>(), 0..300)) {
        let mut b = RootBuilder::new();
        for s in &seeds {
            b.push(s);
        }
        prop_assert_eq!(b.finish(), root(&seeds));
        prop_assert_eq!(b.len(), seeds.len() as u64);
    }

    #[test]
    fn every_audit_path_verifies(seeds in proptest::collection::vec(any::<[u8; 32]>(), 1..70), pick in any::<prop::sample::Index>(), flip in 0usize..32) {
        let r = root(&seeds);
        let i = pick.index(seeds.len());
        let mut path = audit_path(&seeds, i).unwrap();
        prop_assert!(verify_audit_path(&seeds[i], i as u64, seeds.len() as u64, &path, &r));
        if let Some(first) = path.first_mut() {
            first[flip] ^= 1;
            prop_assert!(!verify_audit_path(&seeds[i], i as u64, seeds.len() as u64, &path, &r));
        }
    }
}

proptest! {
    /// A chunked store (the leaves of one chunk, and every chunk's root)
    /// gives the same audit path as the whole tree, and the root over the
    /// chunks' roots is the tree's root, for any size and power-of-two chunk.
    #[test]
    fn chunked_audit_paths_equal_the_whole_trees(n in 1usize..700, shift in 0u32..6, pick in any::<prop::sample::Index>()) {
        let chunk = 1usize << shift;
        let all: Vec<[u8; 32]> = (0..n).map(|i| draw::leaf(&format!("acct-{i}"), &[i as u8; 16])).collect();
        let roots: Vec<[u8; 32]> = all.chunks(chunk).map(root).collect();
        prop_assert_eq!(draw::root_of_nodes(&roots), Some(root(&all)));
        let i = pick.index(n);
        let (j, k) = (i / chunk, i % chunk);
        let mine = &all[j * chunk..((j + 1) * chunk).min(n)];
        let path = draw::chunked_audit_path(mine, k, &roots, j).unwrap();
        prop_assert_eq!(&path, &audit_path(&all, i).unwrap());
        prop_assert!(verify_audit_path(&all[i], i as u64, n as u64, &path, &root(&all)));
    }
}

proptest! {
    /// A builder stopped anywhere and resumed from its stored parts gives
    /// the same root; parts that do not match the count are refused.
    #[test]
    fn a_resumed_builder_gives_the_same_root(n in 0usize..300, cut in any::<prop::sample::Index>()) {
        let all: Vec<[u8; 32]> = (0..n).map(|i| draw::leaf(&format!("a{i}"), &[1u8; 16])).collect();
        let at = if n == 0 { 0 } else { cut.index(n + 1) };
        let mut b = RootBuilder::new();
        for l in &all[..at] {
            b.push(l);
        }
        let (count, stack) = b.parts();
        let mut r = RootBuilder::resume(count, stack.to_vec()).unwrap();
        for l in &all[at..] {
            r.push(l);
        }
        prop_assert_eq!(r.finish(), root(&all));
        if !stack.is_empty() {
            prop_assert!(RootBuilder::resume(count + 1, stack.to_vec()).is_none());
        }
    }
}
