//! Logging and metrics set-up: `tracing` to stderr (filter from `RUST_LOG`),
//! and one Prometheus recorder per process for `GET /metrics`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

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
        let _ = match crate::configuration::log_format() {
            Ok(crate::configuration::LogFormat::Json) => builder.json().try_init(),
            _ => builder.try_init(),
        };
    });
}

/// The process's Prometheus handle; installs the recorder on first use.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .install_recorder()
                .expect("no other metrics recorder is installed")
        })
        .clone()
}
