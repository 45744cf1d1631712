//! `lode scheduler`: settings for the live scheduler of `lode_scheduler::local`.

use anyhow::Context as _;
use lode_scheduler::local::{run_local, LocalConfig, ReportFormat};
use lode_scheduler::Policy;

use crate::cli::{OutputFormat, PolicyArg, SchedulerArgs};

pub fn run_scheduler(args: SchedulerArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let budget = args.max_workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
    });
    let config = LocalConfig {
        jobs_dir: args.jobs,
        budget,
        exe: std::env::current_exe().context("cannot find the lode executable")?,
        tls_ca: args.tls.tls_ca,
        tune: args.tune,
        policy: match args.policy {
            PolicyArg::Maxtp => Policy::MaxTp,
            PolicyArg::Srtf => Policy::Srtf,
            PolicyArg::Fair => Policy::Fair,
        },
        interval: args.interval,
        rounds: args.rounds,
        format: match args.format {
            OutputFormat::Json => ReportFormat::Json,
            OutputFormat::Text => ReportFormat::Text,
        },
    };
    Ok(run_local(&config, out)?)
}
