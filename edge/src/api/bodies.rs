//! The request bodies the edge itself reads, parsed without the runtime
//! (host-tested): the join (`POST /api/sales/{sale}/queue`, the bot-check
//! proof, see [`crate::botcheck::join::parse_body`]) and the dev-mode hooks
//! (`POST /api/dev/token`, `POST /api/dev/sales/{sale}/bulk`). Reservation,
//! purchase and dev-payment bodies are not read here: the edge forwards
//! them, and the origin checks them (origin/src/bodies.rs).
//!
//! Invariants kept here:
//! - no input panics, and every body is bounded before it is parsed;
//! - each refusal has its own code: `400 malformed_json` for bytes that are
//!   not one JSON text (invalid UTF-8 included), `422 invalid_body` for JSON
//!   of the wrong shape (an array where an object is due, a field of the
//!   wrong type), then the endpoint's own codes for values out of range;
//! - an object is an object: serde's derived structs would also take a
//!   JSON array (fields by position), so shapes are checked by hand.

use serde_json::{Map, Value};

use crate::api::error::ApiError;
use crate::api::routes;
use crate::botcheck::join::{self, Proof, Refusal};

/// Longest dev-hook body read (they are a few dozen bytes).
pub const MAX_DEV_BODY_LEN: usize = 1024;
/// Most bytes of a reservation body the edge forwards to the origin.
pub const MAX_FORWARDED_BODY_LEN: usize = 16 * 1024;

/// The refusal of a body over `max` bytes: 413 `body_too_large`.
pub fn body_too_large(max: usize) -> ApiError {
    ApiError::new(
        413,
        "body_too_large",
        format!("request body too large (at most {max} bytes)"),
    )
}

/// A body read in chunks, refused as soon as it passes `max` bytes (and,
/// before a byte is read, when its `Content-Length` says it will): a large
/// body is never held whole in the isolate's memory (issue 44 #7: bodies
/// were read whole, then measured).
#[derive(Debug)]
pub struct Limited {
    max: usize,
    bytes: Vec<u8>,
}

impl Limited {
    /// A reader for a body of at most `max` bytes whose declared length is
    /// `content_length` (the header's value, if any); 413 when it declares
    /// more.
    pub fn new(max: usize, content_length: Option<&str>) -> Result<Self, ApiError> {
        let declared = content_length.and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > max as u64) {
            return Err(body_too_large(max));
        }
        Ok(Limited {
            max,
            bytes: Vec::new(),
        })
    }

    /// Adds a chunk; 413 once the body passes `max`.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), ApiError> {
        if self.bytes.len() + chunk.len() > self.max {
            return Err(body_too_large(self.max));
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Most synthetic entrants one bulk call may load.
pub const BULK_MAX: u64 = 50_000;

fn malformed(shape: &str) -> ApiError {
    ApiError::new(400, "malformed_json", format!("body must be {shape}"))
}

fn invalid(shape: &str) -> ApiError {
    ApiError::new(422, "invalid_body", format!("body must be {shape}"))
}

/// The JSON object a body holds: `malformed_json` for what is not JSON
/// (or is longer than `max`), `invalid_body` for JSON that is no object.
fn object(body: &[u8], max: usize, shape: &str) -> Result<Map<String, Value>, ApiError> {
    if body.len() > max {
        return Err(malformed(shape));
    }
    let text = std::str::from_utf8(body).map_err(|_| malformed(shape))?;
    match serde_json::from_str::<Value>(text).map_err(|_| malformed(shape))? {
        Value::Object(m) => Ok(m),
        _ => Err(invalid(shape)),
    }
}

/// A join body: the bot-check proof it carries (empty: none). Refusals are
/// the bot check's: `400 malformed_json`, `400 bad_nonce`.
pub fn join(body: &[u8]) -> Result<Proof, ApiError> {
    join::parse_body(body).map_err(Refusal::error)
}

/// `POST /api/dev/token`: `{"name": "<account>"}`, the name trimmed and a
/// valid id ([`routes::valid_id`]), else `422 invalid_name`.
pub fn dev_token_name(body: &[u8]) -> Result<String, ApiError> {
    const SHAPE: &str = "{\"name\": \"...\"}";
    let obj = object(body, MAX_DEV_BODY_LEN, SHAPE)?;
    let Some(Value::String(name)) = obj.get("name") else {
        return Err(invalid(SHAPE));
    };
    let name = name.trim();
    if !routes::valid_id(name) {
        return Err(ApiError::new(
            422,
            "invalid_name",
            "name: 1-64 letters, digits, - or _",
        ));
    }
    Ok(name.to_string())
}

/// A dev bulk load: synthetic entrants `prefix-i` for `i` in `from..to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bulk {
    pub prefix: String,
    pub from: u64,
    pub to: u64,
}

/// `POST /api/dev/sales/{sale}/bulk`: `{"prefix", "from", "to"}` with a
/// valid id as prefix and `from <= to <= from + BULK_MAX`, else
/// `422 bad_request`.
pub fn dev_bulk(body: &[u8]) -> Result<Bulk, ApiError> {
    const SHAPE: &str = "{\"prefix\": \"...\", \"from\": n, \"to\": n}";
    let obj = object(body, MAX_DEV_BODY_LEN, SHAPE)?;
    let (Some(Value::String(prefix)), Some(from), Some(to)) = (
        obj.get("prefix"),
        obj.get("from").and_then(Value::as_u64),
        obj.get("to").and_then(Value::as_u64),
    ) else {
        return Err(invalid(SHAPE));
    };
    if to < from || to - from > BULK_MAX || !routes::valid_id(prefix) {
        return Err(ApiError::new(
            422,
            "bad_request",
            format!("a valid prefix and at most {BULK_MAX} entrants per call"),
        ));
    }
    Ok(Bulk {
        prefix: prefix.clone(),
        from,
        to,
    })
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    //! Hostile input, 10^5 cases a property: arbitrary bytes, arbitrary
    //! JSON and valid bodies with one byte changed; the oracle for JSON
    //! input is the generated value.

    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const CASES: u32 = 100_000;

    #[test]
    fn a_body_over_its_limit_is_refused_by_its_length_or_while_read() {
        assert_eq!(
            Limited::new(16, Some("17")).unwrap_err().code,
            "body_too_large",
            "declared too long: refused before a byte is read"
        );
        assert!(Limited::new(16, Some("not a number")).is_ok());
        let mut l = Limited::new(16, None).unwrap();
        l.push(&[b'a'; 10]).unwrap();
        l.push(&[b'b'; 6]).unwrap();
        let e = l.push(b"c").unwrap_err();
        assert_eq!((e.status, e.code.as_str()), (413, "body_too_large"));
        let mut l = Limited::new(16, Some("3")).unwrap();
        l.push(b"abc").unwrap();
        assert_eq!(l.into_bytes(), b"abc");
    }

    fn is_json(b: &[u8]) -> bool {
        std::str::from_utf8(b).is_ok_and(|s| serde_json::from_str::<Value>(s).is_ok())
    }

    fn code<T>(r: Result<T, ApiError>) -> Option<String> {
        r.err().map(|e| e.code)
    }

    #[test]
    fn dev_bodies_get_the_code_of_their_fault() {
        assert_eq!(dev_token_name(br#"{"name": " alice "}"#).unwrap(), "alice");
        assert_eq!(
            dev_bulk(br#"{"prefix": "p", "from": 0, "to": 10}"#).unwrap(),
            Bulk {
                prefix: "p".into(),
                from: 0,
                to: 10
            }
        );
        for (r, want) in [
            (code(dev_token_name(br#"["alice"]"#)), "invalid_body"),
            (code(dev_token_name(br#"{"name": 1}"#)), "invalid_body"),
            (code(dev_token_name(br#"{"name": "a b"}"#)), "invalid_name"),
            (
                code(dev_token_name(b"{\"name\": \"\xff\"}")),
                "malformed_json",
            ),
            (code(dev_token_name(b"name=alice")), "malformed_json"),
            (code(dev_bulk(br#"["p", 0, 10]"#)), "invalid_body"),
            (
                code(dev_bulk(br#"{"prefix": "p", "from": -1, "to": 10}"#)),
                "invalid_body",
            ),
            (
                code(dev_bulk(br#"{"prefix": "x", "from": 0, "to": 1000000000}"#)),
                "bad_request",
            ),
            (
                code(dev_bulk(br#"{"prefix": "", "from": 0, "to": 1}"#)),
                "bad_request",
            ),
            (code(dev_bulk(b"{")), "malformed_json"),
        ] {
            assert_eq!(r.as_deref(), Some(want));
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-3i64..60_000).prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::from),
            "[a-z0-9_-]{0,70}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("name".to_string()),
                        Just("prefix".to_string()),
                        Just("from".to_string()),
                        Just("to".to_string()),
                        Just("challenge".to_string()),
                        Just("nonce".to_string()),
                        Just("turnstile".to_string()),
                        "\\PC{0,6}"
                    ],
                    inner,
                    0..5,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

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

    fn bytes(valid: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![prop::collection::vec(any::<u8>(), 0..48), near(valid)]
    }

    /// Shared byte-level checks: a known code, and `malformed_json` for
    /// what is not JSON. The dev hooks keep it for exactly that; the join
    /// (DESIGN.md "Bot check at join") also answers it for JSON that is not
    /// its object, and treats a blank body as no proof.
    fn check(
        r: Result<(), ApiError>,
        body: &[u8],
        codes: &[&str],
        join: bool,
    ) -> Result<(), TestCaseError> {
        let json = is_json(body) || (join && body.iter().all(u8::is_ascii_whitespace));
        match r {
            Ok(()) => prop_assert!(json),
            Err(e) => {
                prop_assert!(codes.contains(&e.code.as_str()), "{}", e.code);
                if join {
                    prop_assert!(json || e.code == "malformed_json", "{}", e.code);
                } else {
                    prop_assert_eq!(e.code == "malformed_json", !json);
                }
            }
        }
        Ok(())
    }

    fn expected_join(v: &Value) -> Result<Proof, &'static str> {
        let obj = v.as_object().ok_or("malformed_json")?;
        let text = |k: &str| match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err("malformed_json"),
        };
        let nonce = match obj.get("nonce") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(n) => Some(n.as_u64().ok_or("bad_nonce")?.to_string()),
        };
        Ok(Proof {
            challenge: text("challenge")?,
            nonce,
            turnstile: text("turnstile")?,
        })
    }

    fn expected_name(v: &Value) -> Result<String, &'static str> {
        match v.as_object().ok_or("invalid_body")?.get("name") {
            Some(Value::String(s)) if routes::valid_id(s.trim()) => Ok(s.trim().to_string()),
            Some(Value::String(_)) => Err("invalid_name"),
            _ => Err("invalid_body"),
        }
    }

    fn expected_bulk(v: &Value) -> Result<Bulk, &'static str> {
        let obj = v.as_object().ok_or("invalid_body")?;
        let prefix = obj
            .get("prefix")
            .and_then(Value::as_str)
            .ok_or("invalid_body")?;
        let from = obj
            .get("from")
            .and_then(Value::as_u64)
            .ok_or("invalid_body")?;
        let to = obj
            .get("to")
            .and_then(Value::as_u64)
            .ok_or("invalid_body")?;
        if from <= to && to - from <= BULK_MAX && routes::valid_id(prefix) {
            Ok(Bulk {
                prefix: prefix.into(),
                from,
                to,
            })
        } else {
            Err("bad_request")
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        #[test]
        fn join_any_bytes(body in bytes(br#"{"challenge": "c1.k.x.y", "nonce": 17}"#)) {
            check(join(&body).map(drop), &body, &["malformed_json", "bad_nonce"], true)?;
        }

        #[test]
        fn join_any_json(v in prop_oneof![
            json_value(),
            (json_value(), json_value(), json_value())
                .prop_map(|(c, n, t)| json!({"challenge": c, "nonce": n, "turnstile": t})),
        ]) {
            let body = serde_json::to_vec(&v).unwrap();
            prop_assert_eq!(join(&body).map_err(|e| e.code), expected_join(&v).map_err(str::to_string));
        }

        #[test]
        fn dev_token_any_bytes(body in bytes(br#"{"name": "alice"}"#)) {
            check(dev_token_name(&body).map(drop), &body, &["malformed_json", "invalid_body", "invalid_name"], false)?;
        }

        #[test]
        fn dev_token_any_json(v in prop_oneof![json_value(), json_value().prop_map(|n| json!({"name": n}))]) {
            let body = serde_json::to_vec(&v).unwrap();
            prop_assume!(body.len() <= MAX_DEV_BODY_LEN);
            prop_assert_eq!(dev_token_name(&body).map_err(|e| e.code), expected_name(&v).map_err(str::to_string));
        }

        #[test]
        fn dev_bulk_any_bytes(body in bytes(br#"{"prefix": "p", "from": 0, "to": 10}"#)) {
            check(dev_bulk(&body).map(drop), &body, &["malformed_json", "invalid_body", "bad_request"], false)?;
        }

        #[test]
        fn dev_bulk_any_json(v in prop_oneof![
            json_value(),
            (json_value(), json_value(), json_value()).prop_map(|(p, f, t)| json!({"prefix": p, "from": f, "to": t})),
            ("[a-z]{0,3}", 0u64..100, 0u64..60_000).prop_map(|(p, f, n)| json!({"prefix": p, "from": f, "to": f + n})),
        ]) {
            let body = serde_json::to_vec(&v).unwrap();
            prop_assume!(body.len() <= MAX_DEV_BODY_LEN);
            prop_assert_eq!(dev_bulk(&body).map_err(|e| e.code), expected_bulk(&v).map_err(str::to_string));
        }
    }
}
