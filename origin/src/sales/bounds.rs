//! The bounds every sale and SKU is checked against, below every module
//! that checks them (`spec`, `sku`) and the sale they describe (`sale`),
//! so those import them without importing each other.
//!
//! Invariant kept here: every number an operator gives is bounded by the
//! arithmetic it meets (issue 43 #6).

/// Most units a sale may have: inventory counts are int4, and the
/// settlement's conditional update adds a batch's units (at most 1,000
/// entries × [`MAX_PER_USER_LIMIT`]) to held + sold, which must stay below
/// 2^31 (issue 43 #6: every number an operator gives is bounded by the
/// arithmetic it meets).
pub const MAX_UNITS: i32 = 1_000_000_000;
/// Most units one account may hold and buy in a sale.
pub const MAX_PER_USER_LIMIT: i32 = 1_000_000;
/// Highest price of a unit, in the currency's minor unit: price × qty
/// stays below 2^53 (exact in every JSON reader) at any allowed qty.
pub const MAX_PRICE_CENTS: i64 = 1_000_000_000;
/// Sale ids travel in URLs, keys and reservation ids: keep them plain.
pub fn valid_sale_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sale_ids() {
        assert!(valid_sale_id("drop-1"));
        assert!(!valid_sale_id("Drop"));
        assert!(!valid_sale_id("-x"));
        assert!(!valid_sale_id("a.b"));
        assert!(!valid_sale_id(""));
        assert!(!valid_sale_id(&"a".repeat(65)));
    }
}
