//! The `origin` binary: parses the command line and runs it.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of the C library's allocator. The container image is a
/// static musl binary, and musl's allocator serialises a multi-threaded
/// server: in one `scripts/bench` run the musl build reached 0.50× the glibc
/// build's peak, with p99 at half the peak 109 ms against 17 ms. The same
/// allocator in both builds makes the image perform like what is benchmarked.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = origin::ops::cli::Cli::parse();
    match origin::ops::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
