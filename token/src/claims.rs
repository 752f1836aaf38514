//! The claims every credential carries, and the constants of the format.
//!
//! Invariant kept here: the field order of [`Claims`] is the serialized
//! order and part of the format (the shared test vectors pin it), so edge
//! and origin read and write the same bytes.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

/// The only format version this crate mints and accepts.
pub const VERSION: &str = "v1";
/// Clock skew tolerated between the minting and the verifying machine.
pub const CLOCK_SKEW_SECS: u64 = 5;

/// Longest account id (`sub`) accepted, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 256;

/// Whether `sub` can be an account id: 1 to [`MAX_SUBJECT_BYTES`] bytes and
/// no control character. Postgres refuses U+0000 in text, so one such id
/// would be a hold the truth layer can never record; the other control
/// characters (line breaks, escapes) have no place in an id that ends up in
/// logs, CSV exports and a shop's systems. Checked in one place, at the
/// door: [`crate::KeyRing::verify`] and the JWT `user` check refuse such a
/// token with [`crate::TokenError::BadSubject`], so neither the edge nor the
/// origin ever sees one.
pub fn valid_subject(sub: &str) -> bool {
    !sub.is_empty() && sub.len() <= MAX_SUBJECT_BYTES && !sub.chars().any(char::is_control)
}

/// What a credential is for. A token of one type is never accepted as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenType {
    /// Minted by the shop at login: who the person is.
    User,
    /// Minted by the edge: the person's place in one sale's queue.
    Ticket,
    /// Minted by the edge: lets one account reserve in one sale until `exp`.
    Admit,
}

impl TokenType {
    /// The `typ` string as it appears in the claims.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenType::User => "user",
            TokenType::Ticket => "ticket",
            TokenType::Admit => "admit",
        }
    }
}

/// Queue data carried by a `ticket`, so a status poll needs no lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TicketData {
    /// Arrival number in the sale's queue (1-based, unique per account).
    pub seq: u64,
    /// Place in line (1-based) once known: drawn at start for the
    /// pre-queue, equal to the arrival order after start. `None` while in
    /// the pre-queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<u64>,
    /// The queue shard (Durable Object) holding the entry (sharded queues).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// Arrival stamp (unix ms, the shard's clock) of an entry that joined
    /// after the start; its FIFO place follows from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_ms: Option<u64>,
    /// The entrant's 16-byte draw salt (32 lowercase hex digits, DESIGN.md
    /// "The draw, v2" step 2): with the account it gives the entrant's leaf,
    /// so the holder can find and check their own entry, and nobody
    /// without it can tell from the published leaves whether they joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub salt: Option<String>,
    /// A shadow ticket (issue 47): handed to a join that failed the bot
    /// check of a sale that asks for it. It answers like a place in line
    /// and is never admitted; no queue shard knows it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
}

/// The claims of every credential. Field order is the serialized order and
/// is part of the format (test vectors pin it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub typ: TokenType,
    /// Account id.
    pub sub: String,
    /// Sale id; absent for `user` tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sale: Option<String>,
    /// Issued at, unix seconds.
    pub iat: u64,
    /// Expires at, unix seconds.
    pub exp: u64,
    /// 128 random bits, base64url: makes every token unique.
    pub jti: String,
    /// Queue data, tickets only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tkt: Option<TicketData>,
}

impl Claims {
    /// Fresh claims valid from `now` for `ttl_secs`, with a random `jti`.
    pub fn new(
        typ: TokenType,
        sub: impl Into<String>,
        sale: Option<String>,
        now: u64,
        ttl_secs: u64,
    ) -> Self {
        Claims {
            typ,
            sub: sub.into(),
            sale,
            iat: now,
            exp: now.saturating_add(ttl_secs),
            jti: random_jti(),
            tkt: None,
        }
    }

    /// Attaches ticket data (for `typ = ticket`).
    pub fn with_ticket(mut self, tkt: TicketData) -> Self {
        self.tkt = Some(tkt);
        self
    }
}

/// 128 random bits from the platform CSPRNG, base64url without padding.
pub fn random_jti() -> String {
    let mut bytes = [0u8; 16];
    // The OS / Web Crypto RNG failing is not something a caller can handle;
    // it means the platform is broken.
    getrandom::fill(&mut bytes).expect("platform CSPRNG unavailable");
    URL_SAFE_NO_PAD.encode(bytes)
}
