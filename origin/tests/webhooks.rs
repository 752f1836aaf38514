//! The payment webhook against a real `origin` binary whose Postgres fails
//! in the middle of an event: a failure that says nothing about the payment
//! must make the provider deliver again (5xx), never decide the payment.

use std::path::Path;

use origin::ops::workers::Workers;
use origin::payments::webhook::sign_webhook;
use serde_json::{Value, json};
use tests::{AppOptions, OriginProcess, TestApp, sale_spec};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_origin"))
}

async fn post_webhook(addr: &str, body: &str) -> (u16, Value) {
    let sig = sign_webhook(tests::WEBHOOK_SECRET, tests::now_secs(), body.as_bytes());
    let res = reqwest::Client::new()
        .post(format!("{addr}/webhooks/payments"))
        .header("content-type", "application/json")
        .header("Payment-Signature", sig)
        .body(body.to_string())
        .send()
        .await
        .expect("request sent");
    (
        res.status().as_u16(),
        res.json().await.unwrap_or(Value::Null),
    )
}

/// Issue 43 #4: the webhook reaches an origin that has not loaded the sale
/// yet (another replica, or one just restarted), and that load fails
/// (Postgres cannot read the sales table for a moment). Before the fix the
/// failure read as "no such sale": the good payment was recorded as
/// `refund_required`, the buyer refunded and the unit lost, and no
/// redelivery could undo it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_loading_the_sale_makes_the_provider_retry_and_decides_nothing() {
    let app = TestApp::spawn_with(AppOptions {
        workers: Workers {
            settle: true,
            ..Workers::NONE
        },
        ..AppOptions::default()
    })
    .await;
    app.create_sale(sale_spec("flaky", 2, 1, 1)).await;
    let (id, _, pay) = app.reserve_and_purchase("flaky", "finn").await;

    // A second origin (no request has made it load the sale yet).
    let other = OriginProcess::start(
        bin(),
        &app,
        &[("PAYMENT_WEBHOOK_SECRET", tests::WEBHOOK_SECRET)],
    )
    .await;
    sqlx::raw_sql("ALTER TABLE sales RENAME TO sales_away")
        .execute(&app.state.pool)
        .await
        .unwrap();
    let body = json!({"id": "evt_ok", "type": "payment.succeeded",
                      "data": {"payment_id": pay, "amount_cents": 4_999}})
    .to_string();
    let (s, r) = post_webhook(&other.addr, &body).await;
    sqlx::raw_sql("ALTER TABLE sales_away RENAME TO sales")
        .execute(&app.state.pool)
        .await
        .unwrap();
    assert!(
        s >= 500,
        "a failure loading the sale is the provider's cue to retry, not a verdict: {s} {r}"
    );
    let (status, refund): (String, bool) =
        sqlx::query_as("SELECT status, refund_required FROM payments WHERE id = $1")
            .bind(&pay)
            .fetch_one(&app.state.pool)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), refund),
        ("pending", false),
        "nothing decided"
    );
    let outcomes = tests::outbox_events(&app.state.pool, &tests::PAYMENT_OUTCOMES).await;
    assert_eq!(outcomes, 0, "no event for a payment not decided");

    // The provider delivers the same event again: now it sells.
    let (s, r) = post_webhook(&other.addr, &body).await;
    assert_eq!((s, r["result"].as_str()), (200, Some("paid")), "{r}");
    let status: String = sqlx::query_scalar("SELECT status FROM reservations WHERE id = $1")
        .bind(&id)
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    assert_eq!(status, "paid");
    app.stop().await;
}
