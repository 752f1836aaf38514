//! Defects the chaos runs found (`scripts/chaos`, RELIABILITY.md), each as a
//! test of the contract it breaks. They are `#[ignore]`d while the defect
//! stands, so the suite stays green and the defect stays visible:
//! `cargo test -p tests --test chaos_findings -- --ignored` runs them (and
//! fails until the origin is fixed; then drop the `ignore` and move the test
//! where it belongs). Fixed: `a_refused_hold_does_not_outlive_a_failover_in_postgres`
//! (tests/tests/failover.rs).

use tests::{TestApp, sale_spec};

/// DESIGN.md, "Idempotency": a replay with the same body gets the first
/// answer. Once the origin's in-process sold-out flag is set, it answers
/// 410 `sold_out` before the engine (where the key's record is) is asked,
/// so a client retrying a request whose 202 it did not receive is told the
/// sale is sold out while its hold is live — it walks away and the unit
/// only comes back at expiry. (A reuse of the key with another qty gets 410
/// instead of 422 the same way.) Seen in every chaos row that sold out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "defect found by scripts/chaos: the sold-out flag answers a replay before the key's record is read"]
async fn a_replay_after_sell_out_gets_its_first_answer() {
    let app = TestApp::spawn().await;
    app.create_sale(sale_spec("replaysold", 1, 1, 1)).await;
    let a = app.admit("acct-a", "replaysold");
    let body = r#"{"qty":1}"#;
    let (status, first, _) = app.reserve("replaysold", Some(&a), Some("k-a"), body).await;
    assert_eq!(status, 202, "{first}");
    // Another account finds the sale sold out: the flag is set.
    let b = app.admit("acct-b", "replaysold");
    let (status, _, _) = app.reserve("replaysold", Some(&b), Some("k-b"), body).await;
    assert_eq!(status, 410);
    let (status, again, _) = app.reserve("replaysold", Some(&a), Some("k-a"), body).await;
    assert_eq!(
        (status, &again["reservation_id"]),
        (202, &first["reservation_id"]),
        "the replay of a held key must get its first answer: {again}"
    );
}
