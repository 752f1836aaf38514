//! The one credential format of the product, shared by the edge (Wasm) and
//! the origin (native).
//!
//! A credential is `v1.<kid>.<payload>.<sig>` where `payload` is the
//! base64url (no padding) JSON of [`Claims`] and `sig` is the base64url
//! HMAC-SHA256 of `v1.<kid>.<payload>` under the key named `kid`.
//! `user` tokens may also be standard JWTs (HS256, `kid` header), so a shop
//! mints them with any JWT library: [`KeyRing::verify_user`] accepts both,
//! [`KeyRing::verify`] (tickets, admit tokens) only `v1`.
//!
//! Invariants kept here (and nowhere else):
//! - a token verifies only if its signature is the HMAC of exactly the bytes
//!   that were signed, compared in constant time (`Mac::verify_slice`);
//! - every way a token can be refused has its own [`TokenError`] variant, so
//!   callers can answer with a distinct error code;
//! - claims are only looked at *after* the signature checks out, so a forged
//!   payload can never steer the verifier;
//! - no I/O and no clock: the caller passes `now`, which keeps this crate
//!   testable with fixed vectors on the host and in Wasm.
//!
//! Layout: [`admin`] (operator keys: `ADMIN_KEYS`), [`claims`] (what a token says), [`error`] (why one is refused),
//! [`jwt`] (the JWT form of `user` tokens), [`keyring`] (signing and
//! verifying); this file only re-exports them, so the crate's users write
//! `token::KeyRing`, `token::Claims` and so on.

pub mod admin;
pub mod claims;
pub mod error;
pub mod jwt;
pub mod keyring;

pub use admin::{AdminKeys, MIN_ADMIN_SECRET_LEN, Scope};
pub use claims::{
    CLOCK_SKEW_SECS, Claims, MAX_SUBJECT_BYTES, TicketData, TokenType, VERSION, random_jti,
    valid_subject,
};
pub use error::TokenError;
pub use jwt::is_v1;
pub use keyring::{Expect, KeyRing, KeyRingError, MIN_KEY_BYTES, peek_type};
