//! `loadgen`: the flash-sale simulator and the benchmark clients.
//!
//! Everything it sends goes to loopback addresses only, and every run is
//! bounded in request count and time.

#![recursion_limit = "256"]

mod bench;
mod chaos;
mod loopback;
mod sim;

use clap::{Parser, Subcommand};

/// The origin's allocator (`origin/src/main.rs`): `bench-settle` runs the
/// product's settlement worker in this process, and measured it under the C
/// library's allocator (malloc and free were a fifth of the worker's CPU).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "loadgen",
    about = "Flash-sale simulator and benchmark clients (loopback only)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulates a whole sale over HTTP and checks the invariants at the end.
    Sale(sim::args::SaleArgs),
    /// Open-loop load on the origin's reservation endpoint at a fixed rate;
    /// prints achieved rate and latency percentiles as JSON.
    BenchOrigin(bench::open_loop::BenchOriginArgs),
    /// Reservation latency (p50/p99/p999) from 10 % to 100 % of a peak,
    /// beside a calibration route at each rate; JSON and an SVG chart.
    LatencyCurve(bench::curve::LatencyCurveArgs),
    /// Settlement throughput, batched against row-at-a-time, in one run.
    BenchSettle(bench::settle::BenchSettleArgs),
    /// The outbox relay to Kafka against a plain producer of the same
    /// messages to the same broker, in one run (scripts/bench-events).
    BenchRelay(bench::relay::BenchRelayArgs),
    /// The commit-to-sink lag of events during a sale, per window, from the
    /// origin's histogram (scripts/bench-events).
    EventsLag(bench::lag::EventsLagArgs),
    /// Prints admit tokens (one per line) for load tools such as wrk.
    Tokens(bench::tokens::TokensArgs),
    /// One chart and table of several edge-mode sale reports (e.g. the
    /// outage scenario with a fixed and with an adaptive admission rate).
    Compare(sim::edge::CompareArgs),
    /// Fault-injection runs (scripts/chaos): load with a recorded history,
    /// then the check of that history against Redis and Postgres.
    #[command(subcommand)]
    Chaos(chaos::command::ChaosCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The open-loop latency clients run on one thread: they share the
    // machine's cores with the origin, Redis and Postgres, and on a
    // multi-threaded runtime every answer woke another thread (a context
    // switch per request): the client cost more CPU per request than the
    // origin (BENCHMARKS.md, issue 16).
    let mut builder = match cli.command {
        Command::BenchOrigin(_) | Command::LatencyCurve(_) => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(async move {
        match cli.command {
            Command::Sale(a) if a.edge.edge.is_some() => sim::edge::run(a).await,
            Command::Sale(a) => sim::direct::run(a).await,
            Command::BenchOrigin(a) => bench::open_loop::bench_origin(a).await,
            Command::LatencyCurve(a) => bench::curve::latency_curve(a).await,
            Command::BenchSettle(a) => bench::settle::bench_settle(a).await,
            Command::BenchRelay(a) => bench::relay::bench_relay(a).await,
            Command::EventsLag(a) => bench::lag::run(a).await,
            Command::Tokens(a) => bench::tokens::tokens(a),
            Command::Compare(a) => sim::edge::compare(a),
            Command::Chaos(c) => chaos::command::run(c).await,
        }
    });
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
