//! Bearer credentials on the origin. The origin never trusts the edge
//! blindly: every reservation call carries an `admit` token that is verified
//! again here (invariant 5: no reservation without a valid admit token for
//! that account and sale).

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use token::{Claims, Expect, KeyRing, TokenError, TokenType};

use crate::http::error::ApiError;
use crate::ops::clock::now_secs;

/// The bearer token of a request, or `TokenMissing`.
pub fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(AUTHORIZATION)
        .ok_or(ApiError::TokenMissing)?
        .to_str()
        .map_err(|_| ApiError::Token(TokenError::Malformed))?;
    let (scheme, token) = value.split_once(' ').ok_or(ApiError::TokenMissing)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(ApiError::TokenMissing);
    }
    Ok(token.trim())
}

/// An `admit` token for exactly `sale`.
pub fn admit_for_sale(keys: &KeyRing, headers: &HeaderMap, sale: &str) -> Result<Claims, ApiError> {
    let token = bearer(headers)?;
    Ok(keys.verify(
        token,
        Expect {
            typ: TokenType::Admit,
            sale: Some(sale),
        },
        now_secs(),
    )?)
}

/// Who may look at, pay for or cancel a reservation: its account, with an
/// `admit` token for the reservation's sale or with a `user` token (the
/// product's `v1` format or a shop's JWT, see [`KeyRing::verify_user`]).
pub fn account_for_reservation(
    admission: &KeyRing,
    users: &KeyRing,
    headers: &HeaderMap,
    sale: &str,
) -> Result<String, ApiError> {
    account_for_reservation_at(admission, users, headers, sale, now_secs())
}

fn account_for_reservation_at(
    admission: &KeyRing,
    users: &KeyRing,
    headers: &HeaderMap,
    sale: &str,
    now: u64,
) -> Result<String, ApiError> {
    let token = bearer(headers)?;
    // A JWT can only be a user token (a shop's). Otherwise the unverified
    // type only picks the ring; the ring then verifies the signature and
    // insists on that very type.
    if !token::is_v1(token) {
        return Ok(users.verify_user(token, now)?.sub);
    }
    let claims = match token::peek_type(token) {
        Some(TokenType::User) => users.verify_user(token, now)?,
        Some(TokenType::Admit) => admission.verify(
            token,
            Expect {
                typ: TokenType::Admit,
                sale: Some(sale),
            },
            now,
        )?,
        Some(TokenType::Ticket) => return Err(TokenError::WrongType.into()),
        None => return Err(TokenError::Malformed.into()),
    };
    Ok(claims.sub)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    /// The PyJWT-minted vectors of the token crate (a shop's library).
    fn jwt_vectors() -> serde_json::Value {
        serde_json::from_str(include_str!("../../../token/tests/jwt_vectors.json")).unwrap()
    }

    fn with_bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
        h
    }

    #[test]
    fn a_shops_jwt_user_token_opens_its_reservations() {
        let v = jwt_vectors();
        let users = KeyRing::parse(v["keys"].as_str().unwrap()).unwrap();
        let admission = KeyRing::from_keys(&[("a1", &[3u8; 32])]).unwrap();
        for case in v["valid"].as_array().unwrap() {
            let got = account_for_reservation_at(
                &admission,
                &users,
                &with_bearer(case["token"].as_str().unwrap()),
                "drop-1",
                case["now"].as_u64().unwrap(),
            );
            assert_eq!(
                got.ok().as_deref(),
                case["sub"].as_str(),
                "{}",
                case["name"]
            );
        }
        for case in v["refused"].as_array().unwrap() {
            let token = case["token"].as_str().unwrap();
            let got = account_for_reservation_at(
                &admission,
                &users,
                &with_bearer(token),
                "drop-1",
                case["now"].as_u64().unwrap(),
            );
            let code = match got {
                Err(ApiError::Token(e)) => e.code(),
                other => panic!("{}: {other:?}", case["name"]),
            };
            assert_eq!(code, case["error"].as_str().unwrap(), "{}", case["name"]);
        }
    }
}
