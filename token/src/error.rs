//! Why a token is refused: one variant, and one stable code, per reason.
//!
//! Invariant kept here: every way a token can be refused has its own
//! [`TokenError`] variant and code, so callers answer each with a distinct
//! error code (DESIGN.md: "each with its own error").

/// Why a token was refused. Each variant maps to its own error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is malformed")]
    Malformed,
    #[error("token is signed with an unknown key id")]
    UnknownKid,
    #[error("token signature does not match")]
    BadSignature,
    #[error("token is of the wrong type")]
    WrongType,
    #[error("token is for another sale")]
    WrongSale,
    #[error("token has expired")]
    Expired,
    #[error("token is not valid yet")]
    NotYetValid,
    /// A JWT whose `alg` is not HS256 (`none` included): refused before any
    /// key is looked at, so the header cannot choose how it is checked.
    #[error("token algorithm is not accepted (only HS256)")]
    AlgRefused,
    /// A well-signed token whose account id (`sub`) is empty, longer than
    /// 256 bytes or holds a control character (`claims::valid_subject`).
    #[error("token names an account id that is empty, too long or holds a control character")]
    BadSubject,
}

impl TokenError {
    /// Stable machine-readable code, used in API error bodies.
    pub fn code(self) -> &'static str {
        match self {
            TokenError::Malformed => "token_malformed",
            TokenError::UnknownKid => "token_unknown_kid",
            TokenError::BadSignature => "token_bad_signature",
            TokenError::WrongType => "token_wrong_type",
            TokenError::WrongSale => "token_wrong_sale",
            TokenError::Expired => "token_expired",
            TokenError::NotYetValid => "token_not_yet_valid",
            TokenError::AlgRefused => "token_alg_refused",
            TokenError::BadSubject => "token_bad_subject",
        }
    }

    /// Parses a code back (used by the test vectors).
    pub fn from_code(code: &str) -> Option<Self> {
        ALL_ERRORS.iter().copied().find(|e| e.code() == code)
    }
}

const ALL_ERRORS: [TokenError; 9] = [
    TokenError::Malformed,
    TokenError::UnknownKid,
    TokenError::BadSignature,
    TokenError::WrongType,
    TokenError::WrongSale,
    TokenError::Expired,
    TokenError::NotYetValid,
    TokenError::AlgRefused,
    TokenError::BadSubject,
];
