//! Logging and metrics set-up: `tracing` to stderr (filter from `RUST_LOG`),
//! one Prometheus recorder per process for `GET /metrics`, and the access
//! log: one line per request (method, route, status, latency, request id).
//!
//! Request ids: `x-request-id` from the caller (the edge sets it, from
//! `cf-ray` or its own) is kept, else one is made (UUID); it is echoed on the
//! answer and carried by the request's span, so every log line of a request
//! carries it and edge and origin logs join on it.
//!
//! Latencies are exported as histograms with fixed buckets (not summaries),
//! so p99 can be computed across replicas (`histogram_quantile` over
//! `sum by (le)`).

use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::MatchedPath;
use axum::http::{HeaderName, Request, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use tracing::Span;
use tracing_subscriber::EnvFilter;

/// Histogram buckets (seconds): fine where the reservation path lives
/// (sub-millisecond to 50 ms), coarse beyond.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.007_5, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0,
];

/// The request id header, taken from the edge or made here.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Wraps the API in the request-id and access-log layers.
pub fn access_log<S: Clone + Send + Sync + 'static>(router: axum::Router<S>) -> axum::Router<S> {
    let trace = TraceLayer::new_for_http()
        .make_span_with(|req: &Request<_>| {
            let route = req
                .extensions()
                .get::<MatchedPath>()
                .map_or("unmatched", MatchedPath::as_str)
                .to_string();
            let id = req
                .headers()
                .get(&REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.chars().take(128).collect::<String>())
                .unwrap_or_default();
            tracing::info_span!("request", method = %req.method(), route = %route, request_id = %id)
        })
        .on_request(())
        .on_response(|res: &Response<_>, latency: Duration, span: &Span| {
            let status = res.status().as_u16();
            tracing::info!(target: "access", parent: span, status, latency_ms = latency.as_secs_f64() * 1e3, "request");
            metrics::histogram!("flashsale_http_request_seconds", "status" => status_class(status))
                .record(latency.as_secs_f64());
        })
        .on_failure(());
    router
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(trace)
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

fn status_class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Installs the global subscriber once; later calls do nothing (tests build
/// many apps in one process). `LOG_FORMAT=json` writes one JSON object per
/// line; an unreadable `RUST_LOG` or `LOG_FORMAT` falls back to the default
/// here (`origin config check` and `Settings::from_env` report it).
pub fn init_tracing(default_filter: &str) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let filter =
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Colour codes only for a person at a terminal, never in collected logs.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false);
        let _ = match crate::ops::configuration::log_format() {
            Ok(crate::ops::configuration::LogFormat::Json) => builder.json().try_init(),
            _ => builder.try_init(),
        };
    });
}

/// How often the recorder folds recorded samples into its histograms.
const METRICS_UPKEEP: Duration = Duration::from_secs(1);

/// The process's Prometheus handle; installs the recorder on first use,
/// with its upkeep on a thread of its own.
///
/// The recorder keeps every histogram sample until upkeep (or a scrape)
/// folds it into the buckets; without a clock doing it, an origin nobody
/// scrapes grows by every request it answers (~24 bytes each, measured).
/// A thread, not a task: this runs before any runtime may exist, and
/// the work is a few microseconds a second.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .expect("buckets are not empty")
                .install_recorder()
                .expect("no other metrics recorder is installed");
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(METRICS_UPKEEP);
                        upkeep.run_upkeep();
                    }
                })
                .expect("spawning the metrics upkeep thread");
            handle
        })
        .clone()
}
