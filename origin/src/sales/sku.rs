//! The SKUs of a sale (issue 45, DESIGN.md "SKUs"): what an operator asks
//! for (`--sku id:units:price[:limit]`, `--skus <file>` in JSON or CSV),
//! checked before anything is written, and which SKU a reservation names.
//!
//! Invariants kept here:
//! - a sale has 1 to [`MAX_SKUS`] SKUs, each id unique in the sale and a
//!   slug like a sale id, each with 1 or more units; the units of all SKUs
//!   add up to at most [`MAX_UNITS`] (the sale's inventory is int4);
//! - a SKU's own per-account limit never exceeds the sale-wide one (it
//!   could never be reached, and an operator who wrote it meant something
//!   else);
//! - a reservation that leaves `sku` out names the sale's only SKU, and is
//!   refused when there are several ([`resolve`]): a request never lands on
//!   a SKU the buyer did not choose.
//!
//! Pure: no I/O here (the file is read by the CLI, rows by `sale`).

use serde::{Deserialize, Serialize};

use crate::sales::bounds::{MAX_PER_USER_LIMIT, MAX_PRICE_CENTS, MAX_UNITS, valid_sale_id};

/// Most SKUs one sale may have.
pub const MAX_SKUS: usize = 1000;

/// A SKU as an operator asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkuSpec {
    pub id: String,
    /// What the queue page shows; the id when not given.
    #[serde(default)]
    pub name: Option<String>,
    pub units: i32,
    pub price_cents: i64,
    /// Units one account may hold and buy of this SKU (the sale-wide limit
    /// always applies too); none: only the sale-wide limit.
    #[serde(default)]
    pub per_user_limit: Option<i32>,
}

impl SkuSpec {
    /// The name the page shows.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

/// A SKU of a loaded sale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Sku {
    pub id: String,
    pub name: String,
    pub price_cents: i64,
    pub units_total: i32,
    pub per_user_limit: Option<i32>,
    /// Its place in the sale (0-based, the order it was given in): reservations
    /// and Redis keys name a SKU by it, as a number is shorter than its id.
    pub position: i32,
}

/// The columns of a [`Sku`], in every query that reads one.
pub(crate) const SKU_COLUMNS: &str = "id, name, price_cents, units_total, per_user_limit, position";

/// Parses one `--sku <id>:<units>:<price_cents>[:<limit>]`.
pub fn parse_sku_flag(text: &str) -> Result<SkuSpec, String> {
    let parts: Vec<&str> = text.split(':').collect();
    if !(3..=4).contains(&parts.len()) {
        return Err(format!(
            "--sku {text:?}: expected <id>:<units>:<price_cents>[:<per_user_limit>]"
        ));
    }
    let number = |field: &str, s: &str| -> Result<i64, String> {
        s.parse::<i64>()
            .map_err(|_| format!("--sku {text:?}: {field} must be a whole number, not {s:?}"))
    };
    let units = number("units", parts[1])?;
    let price_cents = number("price_cents", parts[2])?;
    let per_user_limit = parts
        .get(3)
        .map(|s| number("per_user_limit", s))
        .transpose()?;
    let narrow = |field: &str, n: i64| -> Result<i32, String> {
        i32::try_from(n).map_err(|_| format!("--sku {text:?}: {field} {n} is out of range"))
    };
    Ok(SkuSpec {
        id: parts[0].to_string(),
        name: None,
        units: narrow("units", units)?,
        price_cents,
        per_user_limit: per_user_limit
            .map(|l| narrow("per_user_limit", l))
            .transpose()?,
    })
}

/// Parses a `--skus` file: a JSON array of objects (`id`, `name`, `units`,
/// `price_cents`, `per_user_limit`), or CSV with a header line naming those
/// columns (`name` and `per_user_limit` may be left out or empty). JSON is
/// told apart by its first non-blank character (`[`).
pub fn parse_sku_file(text: &str) -> Result<Vec<SkuSpec>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(text).map_err(|e| format!("--skus (JSON): {e}"));
    }
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let mut skus = Vec::new();
    for (i, row) in reader.deserialize::<CsvRow>().enumerate() {
        // Line 1 is the header.
        let row = row.map_err(|e| format!("--skus (CSV) line {}: {e}", i + 2))?;
        skus.push(SkuSpec {
            id: row.id,
            name: row.name.filter(|n| !n.is_empty()),
            units: row.units,
            price_cents: row.price_cents,
            per_user_limit: row.per_user_limit,
        });
    }
    if skus.is_empty() {
        return Err("--skus (CSV): no SKUs (a header line id,name,units,price_cents[,per_user_limit] and one line per SKU)".into());
    }
    Ok(skus)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CsvRow {
    id: String,
    #[serde(default)]
    name: Option<String>,
    units: i32,
    price_cents: i64,
    #[serde(default)]
    per_user_limit: Option<i32>,
}

/// Checks a sale's SKUs against each other and the sale-wide limit; the
/// message names the SKU and the field.
pub fn validate_skus(skus: &[SkuSpec], sale_limit: i32) -> Result<(), String> {
    if skus.is_empty() || skus.len() > MAX_SKUS {
        return Err(format!(
            "a sale has 1-{MAX_SKUS} SKUs (--sku, repeated, or --skus <file>), not {}",
            skus.len()
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(skus.len());
    let mut total: i64 = 0;
    for s in skus {
        let at = |field: &str, rule: &str| Err(format!("SKU {:?}: {field} {rule}", s.id));
        if !valid_sale_id(&s.id) {
            return at(
                "id",
                "must be 1-64 of a-z, 0-9, '-', '_' and start with a letter or digit",
            );
        }
        if !seen.insert(s.id.as_str()) {
            return at("id", "is given twice");
        }
        let name = s.display_name();
        if name.trim().is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
            return at("name", "must be 1-200 characters, no control characters");
        }
        if !(1..=MAX_UNITS).contains(&s.units) {
            return at("units", &format!("must be 1-{MAX_UNITS}"));
        }
        if !(0..=MAX_PRICE_CENTS).contains(&s.price_cents) {
            return at("price_cents", &format!("must be 0-{MAX_PRICE_CENTS}"));
        }
        if let Some(l) = s.per_user_limit {
            if !(1..=MAX_PER_USER_LIMIT).contains(&l) {
                return at("per_user_limit", &format!("must be 1-{MAX_PER_USER_LIMIT}"));
            }
            if l > sale_limit {
                return at(
                    "per_user_limit",
                    &format!("{l} is above the sale-wide --per-user-limit {sale_limit}"),
                );
            }
        }
        total += i64::from(s.units);
    }
    if total > i64::from(MAX_UNITS) {
        return Err(format!(
            "the SKUs' units add up to {total}; a sale has at most {MAX_UNITS}"
        ));
    }
    Ok(())
}

/// Why a reservation's `sku` names no SKU of the sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkuChoice {
    /// 404 `unknown_sku`.
    Unknown,
    /// 422 `sku_required`: the sale has several SKUs and none was named.
    Required,
}

/// The SKU a reservation is for: the one named, or the only one.
pub fn resolve<'a>(skus: &'a [Sku], named: Option<&str>) -> Result<&'a Sku, SkuChoice> {
    match named {
        Some(id) => skus.iter().find(|s| s.id == id).ok_or(SkuChoice::Unknown),
        None if skus.len() == 1 => Ok(&skus[0]),
        None => Err(SkuChoice::Required),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, units: i32) -> SkuSpec {
        SkuSpec {
            id: id.into(),
            name: None,
            units,
            price_cents: 100,
            per_user_limit: None,
        }
    }

    fn sku(id: &str, position: i32) -> Sku {
        Sku {
            id: id.into(),
            name: id.into(),
            price_cents: 1,
            units_total: 1,
            per_user_limit: None,
            position,
        }
    }

    #[test]
    fn sku_flags_parse_with_and_without_a_limit() {
        assert_eq!(
            parse_sku_flag("size-42:100:12900").unwrap(),
            SkuSpec {
                id: "size-42".into(),
                name: None,
                units: 100,
                price_cents: 12900,
                per_user_limit: None
            }
        );
        assert_eq!(
            parse_sku_flag("vip:10:50000:1").unwrap().per_user_limit,
            Some(1)
        );
        for (bad, field) in [
            ("vip", "expected"),
            ("vip:10", "expected"),
            ("vip:10:1:2:3", "expected"),
            ("vip:ten:1", "units"),
            ("vip:10:1.5", "price_cents"),
            ("vip:10:1:x", "per_user_limit"),
            ("vip:99999999999:1", "units"),
        ] {
            let e = parse_sku_flag(bad).unwrap_err();
            assert!(e.contains(field), "{bad}: {e}");
        }
    }

    #[test]
    fn sku_files_parse_as_json_and_as_csv() {
        let json = r#"[{"id":"s","name":"Small","units":5,"price_cents":100},
                       {"id":"l","units":7,"price_cents":200,"per_user_limit":1}]"#;
        let csv = "id,name,units,price_cents,per_user_limit\n\
                   s, Small ,5,100,\n\
                   l,,7,200,1\n";
        for text in [json, csv] {
            let skus = parse_sku_file(text).unwrap();
            assert_eq!(skus.len(), 2, "{text}");
            assert_eq!(skus[0].display_name(), "Small");
            assert_eq!(skus[1].display_name(), "l");
            assert_eq!(skus[1].per_user_limit, Some(1));
            assert_eq!(skus[0].per_user_limit, None);
        }
        // Columns may come in any order, and optional ones may be left out.
        let skus = parse_sku_file("units,price_cents,id\n3,0,x\n").unwrap();
        assert_eq!(
            skus,
            vec![SkuSpec {
                price_cents: 0,
                ..spec("x", 3)
            }]
        );
    }

    #[test]
    fn sku_files_that_do_not_parse_say_where() {
        for (bad, says) in [
            (
                "[{\"id\":\"s\",\"units\":\"many\",\"price_cents\":1}]",
                "JSON",
            ),
            (
                "[{\"id\":\"s\",\"units\":1,\"price_cents\":1,\"colour\":1}]",
                "colour",
            ),
            ("[{\"id\":\"s\"", "JSON"),
            ("id,units,price_cents\ns,many,1\n", "line 2"),
            ("id,units,price_cents\ns,1,1\nt,1\n", "line 3"),
            ("id,units,price_cents,colour\ns,1,1,red\n", "colour"),
            ("id,units,price_cents,per_user_limit\ns,1,1,x\n", "line 2"),
            ("id,units,price_cents\n", "no SKUs"),
            ("", "no SKUs"),
        ] {
            let e = parse_sku_file(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn bad_skus_are_refused_with_the_sku_and_field_named() {
        assert!(validate_skus(&[spec("a", 1), spec("b", 2)], 5).is_ok());
        let many: Vec<SkuSpec> = (0..=MAX_SKUS).map(|i| spec(&format!("s{i}"), 1)).collect();
        assert!(validate_skus(&many[..MAX_SKUS], 5).is_ok());
        let cases: Vec<(Vec<SkuSpec>, &str)> = vec![
            (vec![], "1-1000 SKUs"),
            (many, "1-1000 SKUs"),
            (vec![spec("Big", 1)], "SKU \"Big\": id"),
            (
                vec![spec("a", 1), spec("a", 1)],
                "SKU \"a\": id is given twice",
            ),
            (vec![spec("a", 0)], "SKU \"a\": units"),
            (vec![spec("a", -3)], "SKU \"a\": units"),
            (
                vec![SkuSpec {
                    price_cents: -1,
                    ..spec("a", 1)
                }],
                "SKU \"a\": price_cents",
            ),
            (
                vec![SkuSpec {
                    per_user_limit: Some(0),
                    ..spec("a", 1)
                }],
                "SKU \"a\": per_user_limit",
            ),
            (
                vec![SkuSpec {
                    per_user_limit: Some(-1),
                    ..spec("a", 1)
                }],
                "SKU \"a\": per_user_limit",
            ),
            (
                vec![SkuSpec {
                    per_user_limit: Some(6),
                    ..spec("a", 1)
                }],
                "above the sale-wide",
            ),
            (
                vec![SkuSpec {
                    name: Some(" ".into()),
                    ..spec("a", 1)
                }],
                "SKU \"a\": name",
            ),
            (
                vec![SkuSpec {
                    name: Some("a\u{0}b".into()),
                    ..spec("a", 1)
                }],
                "SKU \"a\": name",
            ),
            (vec![spec("a", MAX_UNITS), spec("b", 1)], "add up to"),
        ];
        for (skus, says) in cases {
            let e = validate_skus(&skus, 5).unwrap_err();
            assert!(e.contains(says), "{e} should say {says}");
        }
    }

    #[test]
    fn a_reservation_names_its_sku_or_the_only_one() {
        let one = [sku("only", 0)];
        let two = [sku("s", 0), sku("m", 1)];
        assert_eq!(resolve(&one, None).unwrap().id, "only");
        assert_eq!(resolve(&one, Some("only")).unwrap().id, "only");
        assert_eq!(resolve(&one, Some("other")), Err(SkuChoice::Unknown));
        assert_eq!(resolve(&two, Some("m")).unwrap().position, 1);
        assert_eq!(resolve(&two, None), Err(SkuChoice::Required));
        assert_eq!(resolve(&two, Some("l")), Err(SkuChoice::Unknown));
    }
}
