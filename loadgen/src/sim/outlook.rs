//! The "At your turn" bands checked against what happened (issue 45,
//! docs/skus.md): while the simulated sale runs, the simulator tells a
//! sample of the people still waiting what the queue page would tell them
//! about the SKU they want (`edge::queue::outlook::band`, the very function
//! the Worker runs, fed what the Worker is fed: the summary read once a
//! second, the people ahead, the people admitted so far); when each person's
//! turn comes, whether that SKU was there for them. The report gives, per
//! band, how often the SKU was there.
//!
//! Pure: the direct mode records what it told and what happened; this
//! module only counts. What "there" means is decided here, once: the
//! person's first wish answered 202 (units held); "gone" when it answered
//! 410 (`sku_sold_out`, or `sold_out` for the whole sale), or when the
//! person was never admitted because the sale sold out before their turn.
//! A limit refusal, an error, or a run cut short before their turn says
//! nothing about stock and is left out.

use edge::queue::outlook::Band;
use serde_json::{Value, json};

/// What a person's turn showed of the SKU they wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Not known (yet): still waiting, or an answer that says nothing
    /// about stock.
    Unknown,
    /// Their first wish was held.
    There,
    /// Their first wish was sold out, or the sale was before their turn.
    Gone,
}

impl Turn {
    /// Stored per person in an `AtomicU8` while the sale runs.
    pub(crate) fn code(self) -> u8 {
        match self {
            Turn::Unknown => 0,
            Turn::There => 1,
            Turn::Gone => 2,
        }
    }

    pub(crate) fn from_code(code: u8) -> Self {
        match code {
            1 => Turn::There,
            2 => Turn::Gone,
            _ => Turn::Unknown,
        }
    }
}

/// One thing the page would have told a waiting person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Told {
    /// The person's place in the queue.
    pub(crate) person: usize,
    /// Position of the SKU they want.
    pub(crate) sku: usize,
    pub(crate) band: Band,
}

const BANDS: [(Band, &str); 5] = [
    (Band::Likely, "likely"),
    (Band::Maybe, "maybe"),
    (Band::Unlikely, "unlikely"),
    (Band::SoldOut, "sold_out"),
    (Band::Unknown, "unknown"),
];

/// Up to `at_most` places spread evenly over the people waiting
/// (`first..end`), the first and the last of them included.
pub(crate) fn sample(first: usize, end: usize, at_most: usize) -> Vec<usize> {
    let waiting = end.saturating_sub(first);
    if waiting == 0 || at_most == 0 {
        return Vec::new();
    }
    if waiting <= at_most {
        return (first..end).collect();
    }
    let mut places: Vec<usize> = (0..at_most)
        .map(|i| first + i * (waiting - 1) / (at_most - 1).max(1))
        .collect();
    places.dedup();
    places
}

/// Per band: how many times it was told, how many of those ended known
/// (`judged`), and the share of those whose SKU was there. `hot` (a SKU
/// position) is also counted on its own, as the SKU most people want.
pub(crate) fn tally(told: &[Told], turn: impl Fn(usize) -> Turn, hot: Option<usize>) -> Value {
    let count = |filter: &dyn Fn(&Told) -> bool| -> Value {
        let mut out = serde_json::Map::new();
        for (band, name) in BANDS {
            let (mut n, mut there, mut gone) = (0u64, 0u64, 0u64);
            for t in told.iter().filter(|t| t.band == band && filter(t)) {
                n += 1;
                match turn(t.person) {
                    Turn::There => there += 1,
                    Turn::Gone => gone += 1,
                    Turn::Unknown => {}
                }
            }
            let judged = there + gone;
            out.insert(
                name.to_string(),
                json!({
                    "told": n,
                    "judged": judged,
                    "there": there,
                    "share_there": (judged > 0).then(|| there as f64 / judged as f64),
                }),
            );
        }
        Value::Object(out)
    };
    let mut people: Vec<usize> = told.iter().map(|t| t.person).collect();
    people.sort_unstable();
    people.dedup();
    let mut report = json!({
        "told": told.len(),
        "people": people.len(),
        "bands": count(&|_| true),
    });
    if let Some(hot) = hot {
        report["hot_sku_bands"] = count(&|t| t.sku == hot);
        report["other_sku_bands"] = count(&|t| t.sku != hot);
    }
    report
}

/// Judged answers a band needs before the run is held to it.
pub(crate) const MIN_JUDGED: u64 = 50;

/// What the bands promise, as the run checks it: of the people told
/// `likely`, at least 75 % found their SKU at their turn; of those told
/// `unlikely`, at most 25 %; and `maybe` falls between the two. Each part
/// applies only to bands judged at least [`MIN_JUDGED`] times. `None` when
/// every applicable part holds, else what failed.
pub(crate) fn broken_promise(report: &Value) -> Option<String> {
    let share = |band: &str| {
        let b = &report["bands"][band];
        (b["judged"].as_u64().unwrap_or(0) >= MIN_JUDGED)
            .then(|| b["share_there"].as_f64())
            .flatten()
    };
    let (likely, maybe, unlikely) = (share("likely"), share("maybe"), share("unlikely"));
    let mut broken = Vec::new();
    if let Some(l) = likely.filter(|l| *l < 0.75) {
        broken.push(format!(
            "only {:.0} % of `likely` found their SKU",
            l * 100.0
        ));
    }
    if let Some(u) = unlikely.filter(|u| *u > 0.25) {
        broken.push(format!("{:.0} % of `unlikely` found their SKU", u * 100.0));
    }
    if let (Some(m), Some(l)) = (maybe, likely)
        && m > l
    {
        broken.push(format!(
            "`maybe` ({m:.2}) came true more often than `likely` ({l:.2})"
        ));
    }
    if let (Some(m), Some(u)) = (maybe, unlikely)
        && m < u
    {
        broken.push(format!(
            "`maybe` ({m:.2}) came true less often than `unlikely` ({u:.2})"
        ));
    }
    (!broken.is_empty()).then(|| broken.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(person: usize, sku: usize, band: Band) -> Told {
        Told { person, sku, band }
    }

    #[test]
    fn the_sample_spreads_over_the_line_and_keeps_both_ends() {
        assert_eq!(sample(5, 5, 10), Vec::<usize>::new());
        assert_eq!(sample(5, 8, 10), vec![5, 6, 7]);
        let s = sample(100, 1_100, 5);
        assert_eq!(s, vec![100, 349, 599, 849, 1_099]);
        assert_eq!(sample(0, 1_000, 1), vec![0]);
        assert!(sample(0, 1_000_000, 100).len() == 100);
    }

    #[test]
    fn each_band_counts_what_happened_to_the_people_it_was_told_to() {
        let told = vec![
            told(1, 0, Band::Likely),
            told(1, 0, Band::Likely), // told twice: counted twice
            told(2, 3, Band::Likely),
            told(3, 0, Band::Unlikely),
            told(4, 0, Band::Unlikely),
            told(5, 2, Band::Maybe), // never judged
        ];
        let turn = |p: usize| match p {
            1 | 3 => Turn::There,
            2 | 4 => Turn::Gone,
            _ => Turn::Unknown,
        };
        let r = tally(&told, turn, Some(0));
        assert_eq!(r["told"], 6);
        assert_eq!(r["people"], 5);
        let likely = &r["bands"]["likely"];
        assert_eq!(
            (likely["told"].as_u64(), likely["there"].as_u64()),
            (Some(3), Some(2))
        );
        assert!((likely["share_there"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(r["bands"]["unlikely"]["share_there"], 0.5);
        assert_eq!(r["bands"]["maybe"]["judged"], 0);
        assert_eq!(r["bands"]["maybe"]["share_there"], Value::Null);
        assert_eq!(r["hot_sku_bands"]["likely"]["told"], 2);
        assert_eq!(r["hot_sku_bands"]["likely"]["share_there"], 1.0);
        assert_eq!(r["other_sku_bands"]["likely"]["share_there"], 0.0);
    }

    #[test]
    fn the_run_holds_the_bands_to_their_promise_once_judged_enough() {
        let report = |likely: (u64, f64), maybe: (u64, f64), unlikely: (u64, f64)| {
            json!({"bands": {
                "likely": {"judged": likely.0, "share_there": likely.1},
                "maybe": {"judged": maybe.0, "share_there": maybe.1},
                "unlikely": {"judged": unlikely.0, "share_there": unlikely.1},
            }})
        };
        assert_eq!(
            broken_promise(&report((672, 0.97), (681, 0.42), (6663, 0.0))),
            None
        );
        let b = broken_promise(&report((100, 0.6), (100, 0.42), (100, 0.3))).unwrap();
        assert!(
            b.contains("only 60 % of `likely`") && b.contains("30 % of `unlikely`"),
            "{b}"
        );
        let b = broken_promise(&report((100, 0.8), (100, 0.9), (100, 0.0))).unwrap();
        assert!(b.contains("`maybe` (0.90) came true more often"), "{b}");
        // Too few judged: no verdict on that band.
        assert_eq!(
            broken_promise(&report((49, 0.1), (10, 0.9), (49, 0.9))),
            None
        );
        assert_eq!(broken_promise(&json!({})), None);
    }

    #[test]
    fn a_turn_survives_its_code() {
        for t in [Turn::Unknown, Turn::There, Turn::Gone] {
            assert_eq!(Turn::from_code(t.code()), t);
        }
    }
}
