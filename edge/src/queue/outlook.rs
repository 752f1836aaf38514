//! "Will my SKU be there at my turn?" (issue 45; docs/skus.md): for a
//! person still waiting, per SKU of the sale, whether units are likely to be
//! left when they are admitted. Pure: the Worker feeds it the person's place
//! in line and the sale summary's per-SKU figures it already holds in
//! memory (no object or origin call per poll).
//!
//! The estimate: of the `admitted` people so far, the SKU's units taken
//! (held or sold: `units_total - units_available`) say how many units of it
//! an admitted person takes on average, `rate = taken / admitted`. The
//! `ahead` people in front of this person will take about `ahead × rate`
//! more before their turn; the SKU is
//! - `likely` there when what is left covers that with room
//!   (`left ≥ 1.5 × expected`),
//! - `unlikely` when it covers less than three quarters of it
//!   (`left < 0.75 × expected`),
//! - `maybe` in between, `sold_out` when nothing is left, and
//! - `unknown` until [`MIN_ADMITTED`] people have been admitted (too few to
//!   measure a rate).
//!
//! Invariants kept here: a band is only as confident as the figures allow
//! (never `likely` or `unlikely` from fewer than [`MIN_ADMITTED`] admitted
//! people); a SKU with nothing left is `sold_out` whatever the rate; the
//! answer never depends on anything but its inputs.

use serde::Serialize;
use serde_json::Value;

/// Admitted people needed before a rate is measured.
pub const MIN_ADMITTED: u64 = 20;

/// What a person is told about one SKU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Band {
    Likely,
    Maybe,
    Unlikely,
    SoldOut,
    Unknown,
}

/// One SKU's figures from the sale summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuFigures {
    pub id: String,
    pub units_total: u64,
    pub units_available: u64,
}

/// The SKUs of a sale summary (`skus`: `id`, `units_total`,
/// `units_available`); SKUs with unreadable figures are left out.
pub fn figures(summary: &Value) -> Vec<SkuFigures> {
    summary["skus"]
        .as_array()
        .map(|skus| {
            skus.iter()
                .filter_map(|k| {
                    Some(SkuFigures {
                        id: k["id"].as_str()?.to_string(),
                        units_total: k["units_total"].as_u64()?,
                        units_available: k["units_available"].as_u64()?,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The band of one SKU for a person with `ahead` people in front of them,
/// `admitted` people admitted so far.
pub fn band(sku: &SkuFigures, ahead: u64, admitted: u64) -> Band {
    let left = sku.units_available.min(sku.units_total);
    if left == 0 {
        return Band::SoldOut;
    }
    if admitted < MIN_ADMITTED {
        return Band::Unknown;
    }
    let taken = sku.units_total - left;
    // In units × people, to stay in integers: left ≥ 1.5 × ahead × taken /
    // admitted  ⇔  2 × left × admitted ≥ 3 × ahead × taken.
    let have = u128::from(left) * u128::from(admitted);
    let want = u128::from(ahead) * u128::from(taken);
    if 2 * have >= 3 * want {
        Band::Likely
    } else if 4 * have >= 3 * want {
        Band::Maybe
    } else {
        Band::Unlikely
    }
}

/// Every SKU's band, as the status answer carries it:
/// `[{"sku": id, "band": …}, …]`.
pub fn outlook(skus: &[SkuFigures], ahead: u64, admitted: u64) -> Value {
    Value::Array(
        skus.iter()
            .map(|k| serde_json::json!({"sku": k.id, "band": band(k, ahead, admitted)}))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sku(total: u64, available: u64) -> SkuFigures {
        SkuFigures {
            id: "s".into(),
            units_total: total,
            units_available: available,
        }
    }

    #[test]
    fn the_band_follows_what_people_ahead_will_take() {
        // 100 admitted took 50 of 100 units: half a unit each. 50 left.
        let half = sku(100, 50);
        assert_eq!(band(&half, 0, 100), Band::Likely);
        assert_eq!(band(&half, 66, 100), Band::Likely); // expects 33: 50 ≥ 49.5
        assert_eq!(band(&half, 67, 100), Band::Maybe); // expects 33.5
        assert_eq!(band(&half, 133, 100), Band::Maybe); // expects 66.5: 50 ≥ 49.9
        assert_eq!(band(&half, 134, 100), Band::Unlikely); // expects 67
        assert_eq!(band(&half, 10_000, 100), Band::Unlikely);
    }

    #[test]
    fn nothing_left_is_sold_out_and_too_few_admitted_is_unknown() {
        assert_eq!(band(&sku(10, 0), 0, 1_000), Band::SoldOut);
        assert_eq!(band(&sku(10, 0), 5, 0), Band::SoldOut);
        assert_eq!(band(&sku(10, 5), 5, MIN_ADMITTED - 1), Band::Unknown);
        // Nobody wanted it so far: it will be there.
        assert_eq!(band(&sku(10, 10), 1_000_000, 500), Band::Likely);
        // A summary figure above the total is read as the total.
        assert_eq!(band(&sku(10, 99), 1_000, 50), Band::Likely);
    }

    #[test]
    fn a_hot_sku_and_a_cold_one_of_the_same_sale() {
        // 1,000 admitted so far took 450 of the hot SKU's 500 units and 20
        // of the cold one's 500; 300 people ahead.
        let hot = sku(500, 50);
        let cold = sku(500, 480);
        assert_eq!(band(&hot, 300, 1_000), Band::Unlikely); // 135 expected, 50 left
        assert_eq!(band(&cold, 300, 1_000), Band::Likely); // 6 expected
    }

    #[test]
    fn the_summary_gives_the_figures_and_the_outlook_every_sku() {
        let summary = json!({"skus": [
            {"id": "a", "units_total": 10, "units_available": 0},
            {"id": "b", "units_total": 10, "units_available": 10},
            {"id": "c", "units_total": "x", "units_available": 1},
        ]});
        let f = figures(&summary);
        assert_eq!(f.len(), 2);
        assert_eq!(
            outlook(&f, 5, 100),
            json!([{"sku": "a", "band": "sold_out"}, {"sku": "b", "band": "likely"}])
        );
        assert!(figures(&json!({})).is_empty());
    }
}
