//! The request bodies of the origin's endpoints, read without any I/O.
//!
//! Role: turn the bytes a client sent into the typed request an endpoint
//! acts on, or into the one refusal that names what is wrong with them.
//! Keeping this pure lets the property tests below throw hostile input at
//! every body without a server, Redis or Postgres.
//!
//! Invariants kept here:
//! - no input panics;
//! - every refusal is an [`ApiError`] whose code says which rule failed, so
//!   a client (and a test) can tell "not JSON" from "JSON of the wrong
//!   shape" from "a value out of range".

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::http::error::ApiError;
use crate::payments::webhook::Event;
use crate::sales::sku::{Sku, SkuChoice};

/// Why a body is not the one asked for, before any value is looked at.
enum Shape {
    /// Not one JSON text: not UTF-8, a syntax error, trailing bytes.
    NotJson,
    /// JSON, but not of the shape the endpoint reads.
    Wrong(String),
}

/// Reads `body` as a `T` whose JSON shape `shape_ok` approves first.
///
/// Three steps, because serde alone answers wrongly for hostile bytes: it
/// reports a type error (`0:` → "expected struct") before it finds that the
/// rest is not JSON; it skips an unknown field's string without checking
/// its UTF-8; and a derived struct also takes a JSON array, fields by
/// position (`[1]` was a reservation of 1). So the whole body is decoded
/// into a [`Value`] (UTF-8 and syntax), its shape checked, and only then
/// the typed read done, which still refuses duplicate fields.
fn read<T: DeserializeOwned>(body: &[u8], shape_ok: fn(&Value) -> bool) -> Result<T, Shape> {
    let text = std::str::from_utf8(body).map_err(|_| Shape::NotJson)?;
    let value: Value = serde_json::from_str(text).map_err(|_| Shape::NotJson)?;
    if !shape_ok(&value) {
        return Err(Shape::Wrong("not the expected JSON object".into()));
    }
    serde_json::from_str(text).map_err(|e| Shape::Wrong(e.to_string()))
}

/// A reservation's body.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct ReserveBody {
    /// The SKU to hold units of (its `id` in the sale summary's `skus`);
    /// may be left out only when the sale has exactly one SKU.
    #[serde(default)]
    #[schema(example = "size-42")]
    sku: Option<String>,
    /// Units to hold: 1 to the sale's per-user limit (and the SKU's, if it
    /// has one). Read as any JSON number, so a qty too large for an `i64`
    /// is `invalid_qty` like any other out of range, and a fraction
    /// `invalid_body`.
    #[schema(value_type = i64, minimum = 1)]
    qty: serde_json::Number,
}

/// What a reservation body `{"sku": id, "qty": n}` asks for, checked
/// against the sale's SKUs and its per-user `limit`: `400 malformed_json`
/// when the bytes are not JSON, `422 invalid_body` when the JSON is not
/// that object (`n` not an integer, `sku` not a string), `404 unknown_sku`
/// for a SKU the sale does not sell, `422 sku_required` when `sku` is left
/// out of a sale of several SKUs, `422 invalid_qty` when `n` is outside
/// `1..=limit` (the lower of the sale's and the SKU's).
///
/// `find` names the SKU (`Sale::sku`: by an index of the ids, as a sale may
/// sell 1,000; `sku::resolve` over a slice in the tests).
pub fn reservation_request<'a>(
    body: &[u8],
    find: impl FnOnce(Option<&str>) -> Result<&'a Sku, SkuChoice>,
    limit: i32,
) -> Result<(&'a Sku, i64), ApiError> {
    let parsed: ReserveBody = read(body, Value::is_object).map_err(|e| match e {
        Shape::NotJson => ApiError::bad_request("malformed_json", "the body is not valid JSON"),
        Shape::Wrong(why) => ApiError::unprocessable(
            "invalid_body",
            format!("body must be {{\"sku\": \"<id>\", \"qty\": n}}: {why}"),
        ),
    })?;
    if parsed.qty.is_f64() {
        return Err(ApiError::unprocessable(
            "invalid_body",
            "body must be {\"sku\": \"<id>\", \"qty\": n}: qty is a whole number",
        ));
    }
    let sku = find(parsed.sku.as_deref()).map_err(|e| match e {
        SkuChoice::Unknown => ApiError::not_found("unknown_sku", "this sale sells no such SKU"),
        SkuChoice::Required => ApiError::unprocessable(
            "sku_required",
            "this sale sells several SKUs: name one as \"sku\"",
        ),
    })?;
    let limit = sku.per_user_limit.map_or(limit, |l| l.min(limit));
    match parsed.qty.as_i64() {
        Some(q) if (1..=i64::from(limit)).contains(&q) => Ok((sku, q)),
        _ => Err(ApiError::unprocessable(
            "invalid_qty",
            format!("qty must be between 1 and the per-user limit ({limit})"),
        )),
    }
}

/// A payment provider's event (the webhook's body, once its signature
/// holds): `400 malformed_event` for anything that is not one, down to
/// `data` being an object.
pub fn payment_event(body: &[u8]) -> Result<Event, ApiError> {
    read(body, |v| {
        v.is_object() && v.get("data").is_some_and(Value::is_object)
    })
    .map_err(|e| {
        let why = match e {
            Shape::NotJson => "the body is not valid JSON".to_string(),
            Shape::Wrong(why) => why,
        };
        ApiError::bad_request("malformed_event", format!("not a payment event: {why}"))
    })
}

/// What the dev provider is asked to report for a payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevOutcome {
    /// `payment.succeeded` (the default: an empty body).
    Succeeded,
    /// `payment.failed`.
    Failed,
}

impl DevOutcome {
    /// The word in the event type: `payment.<word>`.
    pub fn as_str(self) -> &'static str {
        match self {
            DevOutcome::Succeeded => "succeeded",
            DevOutcome::Failed => "failed",
        }
    }
}

/// The dev provider's body.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct DevComplete {
    /// `succeeded` (the default) or `failed`.
    #[schema(pattern = "^(succeeded|failed)$")]
    outcome: Option<String>,
}

/// The dev provider's `{"outcome": "succeeded" | "failed"}` (an empty body
/// or no `outcome`: succeeded): `400 malformed_json`, `422 invalid_body`
/// (not that object, `outcome` not a string), `422 invalid_outcome`.
pub fn dev_outcome(body: &[u8]) -> Result<DevOutcome, ApiError> {
    if body.is_empty() {
        return Ok(DevOutcome::Succeeded);
    }
    // `null` is not "no outcome": a client that sends it means something.
    let shape_ok = |v: &Value| v.is_object() && v.get("outcome").is_none_or(Value::is_string);
    let c: DevComplete = read(body, shape_ok).map_err(|e| match e {
        Shape::NotJson => ApiError::bad_request("malformed_json", "the body is not valid JSON"),
        Shape::Wrong(why) => ApiError::unprocessable(
            "invalid_body",
            format!("body must be {{\"outcome\": \"succeeded\" | \"failed\"}}: {why}"),
        ),
    })?;
    match c.outcome.as_deref() {
        None | Some("succeeded") => Ok(DevOutcome::Succeeded),
        Some("failed") => Ok(DevOutcome::Failed),
        Some(_) => Err(ApiError::unprocessable(
            "invalid_outcome",
            "outcome is succeeded or failed",
        )),
    }
}

#[cfg(test)]
mod tests {
    //! Hostile input, 10^5 cases a property: arbitrary bytes, arbitrary
    //! JSON, and valid bodies with one byte changed. The oracle for JSON
    //! input is the value that was generated, not a second parse.

    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    const CASES: u32 = 100_000;

    fn code<T>(r: Result<T, ApiError>) -> Option<&'static str> {
        r.err().map(|e| e.code())
    }

    fn sku(id: &str, position: i32, per_user_limit: Option<i32>) -> Sku {
        Sku {
            id: id.into(),
            name: id.into(),
            price_cents: 100,
            units_total: 10,
            per_user_limit,
            position,
        }
    }

    /// The qty of a body for a sale of one SKU, `only`.
    fn reservation_qty(body: &[u8], limit: i32) -> Result<i64, ApiError> {
        let one = [sku("only", 0, None)];
        reservation_request(body, |n| crate::sales::sku::resolve(&one, n), limit).map(|(_, q)| q)
    }

    #[test]
    fn a_reservation_names_a_sku_of_the_sale() {
        let one = [sku("only", 0, None)];
        let three = [sku("s", 0, None), sku("m", 1, Some(1)), sku("l", 2, None)];
        let ask = |body: &[u8], skus: &[Sku]| {
            reservation_request(body, |n| crate::sales::sku::resolve(skus, n), 3)
                .map(|(s, q)| (s.id.clone(), q))
                .map_err(|e| e.code())
        };
        assert_eq!(ask(br#"{"qty": 2}"#, &one), Ok(("only".into(), 2)));
        assert_eq!(
            ask(br#"{"sku": null, "qty": 2}"#, &one),
            Ok(("only".into(), 2))
        );
        assert_eq!(
            ask(br#"{"sku": "only", "qty": 3}"#, &one),
            Ok(("only".into(), 3))
        );
        assert_eq!(
            ask(br#"{"sku": "l", "qty": 3}"#, &three),
            Ok(("l".into(), 3))
        );
        for (body, skus, want) in [
            (
                &br#"{"sku": "other", "qty": 1}"#[..],
                &one[..],
                "unknown_sku",
            ),
            (br#"{"sku": "ONLY", "qty": 1}"#, &one, "unknown_sku"),
            (br#"{"qty": 1}"#, &three, "sku_required"),
            (br#"{"sku": 1, "qty": 1}"#, &one, "invalid_body"),
            (br#"{"sku": ["s"], "qty": 1}"#, &three, "invalid_body"),
            (br#"{"sku": "s"}"#, &three, "invalid_body"),
            // The SKU's own limit (1) is below the sale's (3).
            (br#"{"sku": "m", "qty": 2}"#, &three, "invalid_qty"),
            (br#"{"sku": "s", "qty": 4}"#, &three, "invalid_qty"),
            // An unknown SKU is named before a qty out of range.
            (br#"{"sku": "x", "qty": 0}"#, &three, "unknown_sku"),
        ] {
            assert_eq!(
                ask(body, skus),
                Err(want),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// Whether the bytes are one JSON text (what `malformed_json` is not).
    fn is_json(b: &[u8]) -> bool {
        std::str::from_utf8(b).is_ok_and(|s| serde_json::from_str::<Value>(s).is_ok())
    }

    #[test]
    fn a_json_array_is_not_a_reservation_body() {
        // serde's derived structs accept fields by position: `[1]` was held.
        assert_eq!(code(reservation_qty(b"[1]", 2)), Some("invalid_body"));
        assert_eq!(code(reservation_qty(b" [2] ", 2)), Some("invalid_body"));
    }

    #[test]
    fn invalid_utf8_is_malformed_json() {
        // serde_json skips an unknown field's string without decoding it.
        let body = b"{\"qty\": 1, \"note\": \"\xff\xfe\"}";
        assert_eq!(code(reservation_qty(body, 2)), Some("malformed_json"));
        let event = b"{\"id\":\"e\",\"type\":\"payment.succeeded\",\"x\":\"\xc3\",\"data\":{\"payment_id\":\"p\",\"amount_cents\":1}}";
        assert_eq!(code(payment_event(event)), Some("malformed_event"));
        assert_eq!(
            code(dev_outcome(b"{\"x\":\"\xff\"}")),
            Some("malformed_json")
        );
    }

    #[test]
    fn non_json_bytes_are_malformed_json() {
        for body in [
            &b""[..],
            b"qty=1",
            b"\x00",
            b"{\"qty\":1}x",
            b"{\"qty\":1",
            b"\xef\xbb\xbf{}",
        ] {
            assert_eq!(
                code(reservation_qty(body, 2)),
                Some("malformed_json"),
                "{body:?}"
            );
        }
    }

    #[test]
    fn reservation_bodies_get_the_code_of_their_fault() {
        assert_eq!(reservation_qty(br#"{"qty": 2}"#, 2).unwrap(), 2);
        assert_eq!(
            reservation_qty(br#"{"qty": 1, "extra": [1]}"#, 2).unwrap(),
            1
        );
        for (body, want) in [
            (&br#"{}"#[..], "invalid_body"),
            (br#"{"qty": "1"}"#, "invalid_body"),
            (br#"{"qty": 1.5}"#, "invalid_body"),
            (br#"{"qty": null}"#, "invalid_body"),
            (br#"{"qty": 1, "qty": 1}"#, "invalid_body"),
            (br#"1"#, "invalid_body"),
            (br#"{"qty": 0}"#, "invalid_qty"),
            (br#"{"qty": 3}"#, "invalid_qty"),
            (br#"{"qty": -9223372036854775808}"#, "invalid_qty"),
            (br#"{"qty": 18446744073709551615}"#, "invalid_qty"),
        ] {
            assert_eq!(
                code(reservation_qty(body, 2)),
                Some(want),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_payment_event_is_an_object_all_the_way_down() {
        let ok =
            br#"{"id":"e1","type":"payment.succeeded","data":{"payment_id":"p","amount_cents":5}}"#;
        let e = payment_event(ok).unwrap();
        assert_eq!(
            (e.id.as_str(), e.kind.as_str(), e.data.amount_cents),
            ("e1", "payment.succeeded", 5)
        );
        for body in [
            &br#"["e1","payment.succeeded",{"payment_id":"p","amount_cents":5}]"#[..],
            br#"{"id":"e1","type":"payment.succeeded","data":["p",5]}"#,
            br#"{"id":"e1","type":"payment.succeeded"}"#,
            b"not json",
        ] {
            assert_eq!(
                code(payment_event(body)),
                Some("malformed_event"),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn dev_outcomes_get_the_code_of_their_fault() {
        assert_eq!(dev_outcome(b"").unwrap(), DevOutcome::Succeeded);
        assert_eq!(dev_outcome(b"{}").unwrap(), DevOutcome::Succeeded);
        assert_eq!(
            dev_outcome(br#"{"outcome":"failed"}"#).unwrap(),
            DevOutcome::Failed
        );
        for (body, want) in [
            (&br#"["failed"]"#[..], "invalid_body"),
            (br#"{"outcome": 1}"#, "invalid_body"),
            (br#""failed""#, "invalid_body"),
            (br#"{"outcome": "paid"}"#, "invalid_outcome"),
            (b"{", "malformed_json"),
        ] {
            assert_eq!(
                code(dev_outcome(body)),
                Some(want),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// Any JSON value, a few levels deep, biased to the names the bodies use.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-5i64..12).prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("JSON numbers are finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::from),
            prop_oneof![
                Just("succeeded"),
                Just("failed"),
                Just("payment.succeeded"),
                Just("only")
            ]
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("qty".to_string()),
                        Just("sku".to_string()),
                        Just("outcome".to_string()),
                        Just("id".to_string()),
                        Just("type".to_string()),
                        Just("data".to_string()),
                        Just("payment_id".to_string()),
                        Just("amount_cents".to_string()),
                        "\\PC{0,6}"
                    ],
                    inner,
                    0..5,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Bytes near a valid body: `valid` with one byte replaced, inserted or
    /// removed.
    fn near(valid: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
        (any::<prop::sample::Index>(), any::<u8>(), 0..3u8).prop_map(move |(i, b, how)| {
            let mut v = valid.to_vec();
            let i = i.index(v.len());
            match how {
                0 => v[i] = b,
                1 => v.insert(i, b),
                _ => {
                    v.remove(i);
                }
            }
            v
        })
    }

    fn expected_qty(v: &Value, limit: i32) -> Result<i64, &'static str> {
        let obj = v.as_object().ok_or("invalid_body")?;
        let n = obj
            .get("qty")
            .and_then(Value::as_number)
            .ok_or("invalid_body")?;
        if n.is_f64() {
            return Err("invalid_body");
        }
        match obj.get("sku") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "only" => {}
            Some(Value::String(_)) => return Err("unknown_sku"),
            Some(_) => return Err("invalid_body"),
        }
        match n.as_i64() {
            Some(q) if (1..=i64::from(limit)).contains(&q) => Ok(q),
            _ => Err("invalid_qty"),
        }
    }

    fn expected_event(v: &Value) -> bool {
        let text = |v: &Value, k: &str| v.get(k).is_some_and(Value::is_string);
        v.is_object()
            && text(v, "id")
            && text(v, "type")
            && v.get("data").is_some_and(|d| {
                d.is_object()
                    && text(d, "payment_id")
                    && d.get("amount_cents").is_some_and(|a| a.is_i64())
            })
    }

    fn expected_outcome(v: &Value) -> Result<DevOutcome, &'static str> {
        let obj = v.as_object().ok_or("invalid_body")?;
        match obj.get("outcome") {
            None => Ok(DevOutcome::Succeeded),
            Some(Value::String(s)) if s == "succeeded" => Ok(DevOutcome::Succeeded),
            Some(Value::String(s)) if s == "failed" => Ok(DevOutcome::Failed),
            Some(Value::String(_)) => Err("invalid_outcome"),
            Some(_) => Err("invalid_body"),
        }
    }

    /// The checks shared by every byte-level property of the reservation
    /// body: no panic, a known code, `malformed_json` for what is not JSON,
    /// and an accepted qty in range.
    fn check_reservation_bytes(body: &[u8], limit: i32) -> Result<(), TestCaseError> {
        match reservation_qty(body, limit) {
            Ok(q) => {
                prop_assert!(is_json(body));
                prop_assert!((1..=i64::from(limit)).contains(&q));
            }
            Err(e) => {
                prop_assert!(
                    matches!(
                        e.code(),
                        "malformed_json" | "invalid_body" | "invalid_qty" | "unknown_sku"
                    ),
                    "{}",
                    e.code()
                );
                prop_assert_eq!(e.code() == "malformed_json", !is_json(body));
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        #[test]
        fn reservation_any_bytes(body in prop::collection::vec(any::<u8>(), 0..40), limit in 1i32..10) {
            check_reservation_bytes(&body, limit)?;
        }

        #[test]
        fn reservation_near_valid_bytes(body in near(br#"{"qty": 2, "note": "caf\u00e9"}"#), limit in 1i32..10) {
            check_reservation_bytes(&body, limit)?;
        }

        #[test]
        fn reservation_any_json(v in prop_oneof![
            json_value(),
            (json_value(), json_value()).prop_map(|(q, extra)| json!({"qty": q, "extra": extra})),
        ], limit in 1i32..10) {
            let body = serde_json::to_vec(&v).unwrap();
            prop_assert_eq!(reservation_qty(&body, limit).map_err(|e| e.code()), expected_qty(&v, limit));
        }

        #[test]
        fn payment_event_any_bytes(body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..60),
            near(br#"{"id":"e","type":"payment.failed","data":{"payment_id":"p","amount_cents":1}}"#),
        ]) {
            if let Err(e) = payment_event(&body) {
                prop_assert_eq!(e.code(), "malformed_event");
            } else {
                prop_assert!(is_json(&body));
            }
        }

        #[test]
        fn payment_event_any_json(v in prop_oneof![
            json_value(),
            (json_value(), json_value(), json_value(), json_value())
                .prop_map(|(id, t, p, a)| json!({"id": id, "type": t, "data": {"payment_id": p, "amount_cents": a}})),
        ]) {
            let body = serde_json::to_vec(&v).unwrap();
            prop_assert_eq!(payment_event(&body).is_ok(), expected_event(&v));
        }

        #[test]
        fn dev_outcome_any_bytes(body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            near(br#"{"outcome": "failed"}"#),
        ]) {
            match dev_outcome(&body) {
                Ok(_) => prop_assert!(body.is_empty() || is_json(&body)),
                Err(e) => {
                    prop_assert!(matches!(e.code(), "malformed_json" | "invalid_body" | "invalid_outcome"), "{}", e.code());
                    prop_assert_eq!(e.code() == "malformed_json", !is_json(&body));
                }
            }
        }

        #[test]
        fn dev_outcome_any_json(v in prop_oneof![
            json_value(),
            json_value().prop_map(|o| json!({"outcome": o})),
        ]) {
            let body = serde_json::to_vec(&v).unwrap();
            prop_assert_eq!(dev_outcome(&body).map_err(|e| e.code()), expected_outcome(&v));
        }
    }
}
