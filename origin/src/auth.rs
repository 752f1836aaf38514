//! Bearer credentials on the origin. The origin never trusts the edge
//! blindly: every reservation call carries an `admit` token that is verified
//! again here (invariant 5: no reservation without a valid admit token for
//! that account and sale).

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use token::{Claims, Expect, KeyRing, TokenError, TokenType};

use crate::error::ApiError;

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

/// Unix seconds now.
pub fn now_secs() -> u64 {
    crate::reservations::now_ms() / 1000
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
/// `admit` token for the reservation's sale or with a `user` token.
pub fn account_for_reservation(
    admission: &KeyRing,
    users: &KeyRing,
    headers: &HeaderMap,
    sale: &str,
) -> Result<String, ApiError> {
    let token = bearer(headers)?;
    let now = now_secs();
    // The unverified type only picks the ring; the ring then verifies the
    // signature and insists on that very type.
    let claims = match token::peek_type(token) {
        Some(TokenType::User) => users.verify(
            token,
            Expect {
                typ: TokenType::User,
                sale: None,
            },
            now,
        )?,
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
