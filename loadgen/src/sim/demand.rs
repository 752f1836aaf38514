//! What the simulated crowd wants in a sale of several SKUs (issue 45): the
//! SKUs the simulator creates (`--skus`, `--units` split over them), each
//! person's first wish (`--hot-share`), and the second try of a person whose
//! wish answered 410 `sku_sold_out` (`--second-choice`).
//!
//! Pure: no I/O, and the randomness comes from the caller's generator, so
//! the tests below can check the distributions from a fixed seed.

use rand::Rng;

/// Units of each SKU when `total` units are split over `skus` SKUs as
/// evenly as possible: every SKU gets `total / skus`, and the first
/// `total % skus` SKUs (the hot one first) one more.
pub(crate) fn split_units(total: i32, skus: usize) -> Vec<i32> {
    let n = skus.max(1) as i32;
    (0..n)
        .map(|i| total / n + i32::from(i < total % n))
        .collect()
}

/// The id of the SKU at `position` in a sale of `skus` SKUs: `sku-07` (as
/// many digits as the last position needs).
pub(crate) fn sku_id(position: usize, skus: usize) -> String {
    let width = skus.saturating_sub(1).max(1).to_string().len();
    format!("sku-{position:0width$}")
}

/// How first wishes fall over the SKUs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Demand {
    pub(crate) skus: usize,
    /// Share of people whose first wish is SKU 0; the rest wish uniformly
    /// among the others. `1 / skus` is uniform demand.
    pub(crate) hot_share: f64,
}

impl Demand {
    /// `hot_share` unset: every SKU equally wished.
    pub(crate) fn new(skus: usize, hot_share: Option<f64>) -> Self {
        let skus = skus.max(1);
        Demand {
            skus,
            hot_share: hot_share.unwrap_or(1.0 / skus as f64).clamp(0.0, 1.0),
        }
    }

    /// One person's first wish (a position).
    pub(crate) fn wish(&self, rng: &mut impl Rng) -> usize {
        if self.skus == 1 || rng.random_bool(self.hot_share) {
            0
        } else {
            rng.random_range(1..self.skus)
        }
    }
}

/// The second try of a person whose wish `wish` answered `sku_sold_out`:
/// with probability `p`, one SKU drawn uniformly among those that are
/// neither the wish nor known to be sold out (`known_sold_out`, by
/// position); `None` (the person leaves) otherwise, or when no such SKU is
/// left.
pub(crate) fn second_choice(
    wish: usize,
    known_sold_out: &[bool],
    p: f64,
    rng: &mut impl Rng,
) -> Option<usize> {
    if !rng.random_bool(p.clamp(0.0, 1.0)) {
        return None;
    }
    let open: Vec<usize> = (0..known_sold_out.len())
        .filter(|&s| s != wish && !known_sold_out[s])
        .collect();
    if open.is_empty() {
        return None;
    }
    Some(open[rng.random_range(0..open.len())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn units_split_as_evenly_as_possible() {
        let u = split_units(2_000, 20);
        assert_eq!(u, vec![100; 20]);
        let u = split_units(1_003, 20);
        assert_eq!(u.iter().sum::<i32>(), 1_003);
        assert_eq!(&u[..3], &[51, 51, 51]);
        assert!(u[3..].iter().all(|&x| x == 50));
        assert_eq!(split_units(1_000, 1), vec![1_000]);
        assert_eq!(split_units(5, 5), vec![1; 5]);
    }

    #[test]
    fn sku_ids_are_slugs_of_one_width() {
        assert_eq!(sku_id(0, 20), "sku-00");
        assert_eq!(sku_id(19, 20), "sku-19");
        assert_eq!(sku_id(0, 1), "sku-0");
        assert_eq!(sku_id(7, 1000), "sku-007");
    }

    /// Half the wishes on SKU 0, the other half uniform over the 19 others.
    #[test]
    fn hot_share_takes_its_share_and_the_rest_is_uniform() {
        let d = Demand::new(20, Some(0.5));
        let mut rng = StdRng::seed_from_u64(45);
        let n = 200_000;
        let mut counts = [0u32; 20];
        for _ in 0..n {
            counts[d.wish(&mut rng)] += 1;
        }
        let hot = f64::from(counts[0]) / f64::from(n);
        assert!((hot - 0.5).abs() < 0.01, "hot share {hot}");
        let each = 0.5 / 19.0;
        for (p, c) in counts.iter().enumerate().skip(1) {
            let share = f64::from(*c) / f64::from(n);
            assert!(
                (share - each).abs() < 0.15 * each,
                "SKU {p}: {share} against {each}"
            );
        }
    }

    #[test]
    fn no_hot_share_is_uniform_and_one_sku_is_always_wished() {
        let d = Demand::new(4, None);
        assert!((d.hot_share - 0.25).abs() < 1e-12);
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = [0u32; 4];
        for _ in 0..40_000 {
            counts[d.wish(&mut rng)] += 1;
        }
        for c in counts {
            assert!((f64::from(c) / 40_000.0 - 0.25).abs() < 0.02, "{counts:?}");
        }
        let one = Demand::new(1, Some(0.1));
        assert!((0..1_000).all(|_| one.wish(&mut rng) == 0));
        let all_hot = Demand::new(20, Some(1.0));
        assert!((0..1_000).all(|_| all_hot.wish(&mut rng) == 0));
    }

    /// The second try never names the wish or a SKU known sold out, is
    /// taken with probability `p`, and is uniform over what is left.
    #[test]
    fn second_choice_avoids_known_sold_out_and_follows_p() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut known = vec![false; 6];
        known[0] = true;
        known[2] = true;
        let n = 60_000;
        let mut counts = [0u32; 6];
        let mut left = 0u32;
        for _ in 0..n {
            match second_choice(0, &known, 0.5, &mut rng) {
                Some(s) => counts[s] += 1,
                None => left += 1,
            }
        }
        assert_eq!(counts[0], 0, "never the wish");
        assert_eq!(counts[2], 0, "never a SKU known sold out");
        let tried = f64::from(n - left) / f64::from(n);
        assert!((tried - 0.5).abs() < 0.01, "tried {tried}");
        for s in [1, 3, 4, 5] {
            let share = f64::from(counts[s]) / f64::from(n - left);
            assert!((share - 0.25).abs() < 0.02, "SKU {s}: {share}");
        }
        // Wish not (yet) known sold out: still never retried.
        let fresh = vec![false; 3];
        assert!((0..1_000).all(|_| second_choice(1, &fresh, 1.0, &mut rng) != Some(1)));
    }

    #[test]
    fn no_second_choice_when_nothing_is_left_or_p_is_zero() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut known = vec![true; 20];
        known[4] = false; // the wish itself: not a second choice
        assert!((0..1_000).all(|_| second_choice(4, &known, 1.0, &mut rng).is_none()));
        assert!((0..1_000).all(|_| second_choice(0, &[false; 1], 1.0, &mut rng).is_none()));
        let open = vec![false; 20];
        assert!((0..1_000).all(|_| second_choice(0, &open, 0.0, &mut rng).is_none()));
        assert!((0..1_000).all(|_| second_choice(0, &open, 1.0, &mut rng).is_some()));
    }
}
