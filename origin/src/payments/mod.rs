//! Purchase and payment: a held unit becomes a sale.
//!
//! - `purchase` (`crate::http::routes::payments`) opens one payment per
//!   reservation: the reservation row is locked (`FOR UPDATE`), so two
//!   concurrent purchases produce one payment (the second gets the
//!   first's), and a partial unique index keeps at most one open
//!   (pending/succeeded) payment per reservation anyway. An
//!   `Idempotency-Key` is one purchase of one reservation: reused for
//!   another reservation it gets `422 idempotency_key_reused`.
//! - The provider's webhook is bounded before it is authenticated (64 KiB
//!   body, at most `webhook::MAX_SIGNATURES` `v1` candidates), then
//!   verified (`webhook`), deduplicated by the provider's event id
//!   (`processed_messages`), and applied in one transaction (`saga`).
//!
//! Imports flow one way: `saga` → `webhook` (the event type);
//! `provider` stands alone.

pub mod provider;
pub mod saga;
pub mod webhook;
