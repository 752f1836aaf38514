//! `loadgen chaos …`: the subcommands and what each runs.

use clap::{Args, Subcommand};

use crate::chaos::check;
use crate::chaos::load;
use crate::chaos::report;
use crate::chaos::row::RowArgs;

#[derive(Subcommand)]
pub enum ChaosCommand {
    /// Steady load on one sale, every request recorded (JSON lines).
    Run(load::RunArgs),
    /// Waits until settlement has drained and every unpaid hold has
    /// expired, in Redis and in Postgres (bounded).
    Wait(WaitArgs),
    /// Checks a history against Redis and Postgres; writes the row.
    Check(check::CheckArgs),
    /// Writes the row of a fault that could not be injected, saying why.
    Skip(SkipArgs),
    /// Writes the table of several rows (Markdown); fails if any row broke
    /// an invariant.
    Report(report::ReportArgs),
}

#[derive(Args)]
pub struct WaitArgs {
    #[arg(long, default_value = "chaos")]
    sale: String,
    #[arg(long, default_value_t = 120)]
    max_seconds: u64,
}

#[derive(Args)]
pub struct SkipArgs {
    #[command(flatten)]
    row: RowArgs,
    /// Why the row did not run.
    #[arg(long)]
    reason: String,
}

pub async fn run(cmd: ChaosCommand) -> anyhow::Result<()> {
    match cmd {
        ChaosCommand::Run(a) => load::run(a).await,
        ChaosCommand::Wait(a) => {
            check::wait_quiet(&a.sale, std::time::Duration::from_secs(a.max_seconds)).await
        }
        ChaosCommand::Check(a) => check::run(a).await,
        ChaosCommand::Skip(a) => a.row.write(None, Some(a.reason)),
        ChaosCommand::Report(a) => report::run(a),
    }
}
