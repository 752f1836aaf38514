//! The one guard every client of loadgen passes before it sends anything:
//! its targets are on this machine.
//!
//! Invariant: no `loadgen` command sends a request to a host that is not a
//! loopback address (`localhost`, `127.0.0.0/8`, `::1`).

/// Refuses any target that is not on this machine.
pub fn ensure_loopback(url: &str) -> anyhow::Result<()> {
    let host = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split(['/', ':']).next())
        .unwrap_or_default();
    anyhow::ensure!(
        host == "localhost" || host.starts_with("127.") || host == "[" || host == "::1",
        "{url}: loadgen only targets loopback addresses"
    );
    Ok(())
}
