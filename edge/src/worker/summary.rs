//! `GET /api/sales/{sale}` at the edge (Wasm only): the origin's summary
//! with the queue's figures and the draw as the coordinator publishes them.
//!
//! Invariant kept here: the queue figures are best effort (the summary
//! stands without them) and never behind a place someone was just told is
//! admitted (the frontier is extrapolated as polls extrapolate it).

use serde_json::json;
use worker::{Env, Response};

use crate::api::error::ApiResult;
use crate::api::summary::says_sold_out;
use crate::draw::hash;
use crate::http::origin::origin_summary;
use crate::http::respond::{internal, json_response, now_ms};
use crate::http::sold_out::set_sold_out;
use crate::worker::snapshot::snapshot_within;

/// The summary of `sale`, cached 1 s by browsers and the CDN.
pub(crate) async fn summary(env: &Env, sale: &str) -> ApiResult<Response> {
    let (mut body, stale) = origin_summary(env, sale).await?;
    if says_sold_out(&body) {
        set_sold_out(sale).await;
    }
    // Queue figures are best effort: the summary stands without them.
    if let Ok(s) = snapshot_within(env, sale, 900).await {
        // The frontier people are admitted by (extrapolated from the
        // snapshot's checkpoint, as their polls are), so the figure is never
        // behind a place someone was just told is admitted.
        let admitted = crate::queue::status::frontier_at(&s, now_ms());
        body["queue"] = json!({
            "shards": s.shards,
            "entries": s.entries,
            "prequeue": s.prequeue,
            "placed": s.placed,
            "admitted": admitted,
            "waiting": s.placed.saturating_sub(admitted),
            "drawn": s.drawn,
            // The admission controller's current rate (the sale's
            // `admission_rate` is its ceiling), and whether it is held.
            "admission_rate": s.rate,
            "paused": s.paused,
            "frozen": s.frozen,
            // Places of people who arrived before this (unix ms) are final.
            "places_final_through_ms": s.fifo_through_ms,
            "do_requests": s.do_requests,
            "coordinator_requests": s.coordinator_requests,
        });
        // The draw as the coordinator publishes it (DESIGN.md "The draw,
        // v2"): each part once known.
        let mut d = s.draw.clone();
        if !d.is_object() {
            d = json!({"commitment": s.commitment, "method": hash::METHOD});
        }
        d["audit"] = json!(format!("/api/sales/{sale}/draw"));
        d["receipt"] = json!(format!("/api/sales/{sale}/queue/receipt"));
        body["draw"] = d;
    }
    body["stale"] = json!(stale);
    json_response(200, &body, "public, max-age=1").map_err(internal)
}
