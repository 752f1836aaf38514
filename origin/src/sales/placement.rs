//! Where each SKU's stock lives on a sale's shards (issue 45, docs/skus.md).
//!
//! A SKU's units are split over `k` consecutive shards of the sale (in ring
//! order from `position mod n`), `k` chosen from its units: a SKU of 10,000
//! units is on every shard, one of 12 on one. A reservation for a SKU starts
//! on the account's home shard (where both per-account counts live) and
//! spills only to the shards that hold that SKU, so a small SKU near sell-out
//! costs a walk of its own shards, not of the whole sale.
//!
//! Invariants kept here:
//! - the units a SKU has on its shards add up to exactly its units
//!   ([`Placement::units_on`]), so the shards' stock adds up to the sale's;
//! - a sale of one SKU is placed exactly as a sale was before SKUs (every
//!   shard, [`shard_units`]), so its keys, its
//!   reconcile and its rebuild are unchanged;
//! - the placement is a pure function of (units, position, SKU count,
//!   shards), all fixed at `sale create`, so every process (and the cold
//!   rebuild) computes the same one without storing it.
//!
//! Pure: no I/O here.

/// Units of shard `i` when `units` are split over `shards` (the first
/// `units % shards` shards get one more).
pub fn shard_units(units: i32, shards: i32, i: i32) -> i32 {
    units / shards + i32::from(i < units % shards)
}

/// A SKU is given one more shard per this many units (up to every shard).
pub const UNITS_PER_SHARD: i32 = 64;

/// The shards one SKU's stock is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The first shard it is on.
    pub offset: usize,
    /// How many consecutive shards (ring order) it is on: 1..=`shards`.
    pub count: usize,
    /// The sale's shard count.
    pub shards: usize,
}

impl Placement {
    /// The placement of the SKU at `position` with `units` units in a sale
    /// of `skus` SKUs over `shards` shards.
    pub fn of(units: i32, position: i32, skus: usize, shards: usize) -> Self {
        let shards = shards.max(1);
        if skus <= 1 {
            return Placement {
                offset: 0,
                count: shards,
                shards,
            };
        }
        let wanted =
            usize::try_from((units.max(1) + UNITS_PER_SHARD - 1) / UNITS_PER_SHARD).unwrap_or(1);
        Placement {
            offset: usize::try_from(position).unwrap_or(0) % shards,
            count: wanted.clamp(1, shards),
            shards,
        }
    }

    /// Its index among the SKU's shards, when `shard` holds the SKU.
    fn rank(&self, shard: usize) -> Option<usize> {
        let r = (shard + self.shards - self.offset) % self.shards;
        (shard < self.shards && r < self.count).then_some(r)
    }

    /// Whether `shard` holds this SKU (has its stock key).
    pub fn holds(&self, shard: usize) -> bool {
        self.rank(shard).is_some()
    }

    /// The units of a SKU of `units` on `shard` at creation (0 where it is
    /// not placed).
    pub fn units_on(&self, units: i32, shard: usize) -> i32 {
        match self.rank(shard) {
            Some(r) => shard_units(units, self.count as i32, r as i32),
            None => 0,
        }
    }

    /// The shards a spill from `home` tries, in the fixed order every replay
    /// walks (`home+1, home+2, …`), skipping those without the SKU.
    pub fn others(&self, home: usize) -> impl Iterator<Item = usize> + '_ {
        (1..self.shards)
            .map(move |step| (home + step) % self.shards)
            .filter(|s| self.holds(*s))
    }

    /// How many shards a reservation from `home` may find units on,
    /// counting `home` once even when it does not hold the SKU (its empty
    /// stock then spills at once): reserve.lua's "no other shard" check.
    pub fn reachable_from(&self, home: usize) -> usize {
        self.count + usize::from(!self.holds(home))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sku_is_on_every_shard_as_before() {
        for (units, shards) in [(1, 1), (7, 3), (1000, 8), (5, 5)] {
            let p = Placement::of(units, 0, 1, shards);
            for i in 0..shards {
                assert!(p.holds(i));
                assert_eq!(
                    p.units_on(units, i),
                    shard_units(units, shards as i32, i as i32)
                );
            }
        }
    }

    #[test]
    fn shard_count_follows_units_and_units_add_up() {
        let shards = 8;
        for (units, want) in [(12, 1), (64, 1), (65, 2), (300, 5), (10_000, 8)] {
            for position in [0, 3, 7, 9, 999] {
                let p = Placement::of(units, position, 20, shards);
                assert_eq!(p.count, want, "{units} units");
                let on: Vec<usize> = (0..shards).filter(|i| p.holds(*i)).collect();
                assert_eq!(on.len(), want);
                assert!(on.contains(&(position as usize % shards)));
                let total: i32 = (0..shards).map(|i| p.units_on(units, i)).sum();
                assert_eq!(total, units);
                assert!(on.iter().all(|i| p.units_on(units, *i) >= 1));
                assert!(
                    (0..shards)
                        .filter(|i| !p.holds(*i))
                        .all(|i| p.units_on(units, i) == 0)
                );
            }
        }
    }

    #[test]
    fn a_spill_walks_only_the_skus_shards_in_ring_order() {
        // 200 units from position 6 on 8 shards: shards 6, 7, 0, 1.
        let p = Placement::of(200, 6, 20, 8);
        assert_eq!(p.others(7).collect::<Vec<_>>(), vec![0, 1, 6]);
        assert_eq!(p.others(3).collect::<Vec<_>>(), vec![6, 7, 0, 1]);
        assert_eq!(p.reachable_from(7), 4);
        assert_eq!(p.reachable_from(3), 5);
        let single = Placement::of(12, 2, 20, 8);
        assert_eq!(single.others(2).count(), 0);
        assert_eq!(single.reachable_from(2), 1);
        assert_eq!(single.others(5).collect::<Vec<_>>(), vec![2]);
        assert!(!p.holds(99));
    }
}
