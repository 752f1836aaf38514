//! The payment provider boundary: where a buyer is sent to pay. The one
//! provider here is the dev provider, which completes payments by posting
//! signed webhooks like a real provider (`crate::payments::webhook`).

/// The provider boundary. A real provider returns where to send the buyer;
/// the dev provider (local runs) completes payments itself by posting signed
/// webhooks over HTTP, exactly like a real one would.
pub trait PaymentProvider: Send + Sync {
    fn name(&self) -> &'static str;
    /// Where the buyer completes payment `payment_id`, if anywhere.
    fn checkout_url(&self, payment_id: &str) -> Option<String>;
}

/// Local runs: `POST /api/dev/payments/{id}/complete` (dev mode only) or
/// `origin pay simulate`.
pub struct DevProvider;

impl PaymentProvider for DevProvider {
    fn name(&self) -> &'static str {
        "dev"
    }
    fn checkout_url(&self, payment_id: &str) -> Option<String> {
        Some(format!("/api/dev/payments/{payment_id}/complete"))
    }
}
