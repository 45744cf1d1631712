//! `lode scheduler`: settings for the live scheduler of `lode_scheduler::local`.

use anyhow::{bail, Context as _};
use lode_scheduler::local::{run_local, LocalConfig, ReportFormat};
use lode_scheduler::Policy;

use crate::cli::{OutputFormat, PolicyArg, SchedulerArgs, SchedulerBackend};

pub fn run_scheduler(args: SchedulerArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let policy = match args.policy {
        PolicyArg::Maxtp => Policy::MaxTp,
        PolicyArg::Srtf => Policy::Srtf,
        PolicyArg::Fair => Policy::Fair,
    };
    let jobs_dir = match (args.backend, args.jobs.clone()) {
        (SchedulerBackend::Kubernetes, _) => return run_kubernetes(args, policy, out),
        (SchedulerBackend::Local, Some(dir)) => dir,
        (SchedulerBackend::Local, None) => bail!("--backend local needs --jobs DIR"),
    };
    let budget = args.max_workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
    });
    let config = LocalConfig {
        jobs_dir,
        budget,
        exe: std::env::current_exe().context("cannot find the lode executable")?,
        tls_ca: args.tls.tls_ca,
        tune: args.tune,
        policy,
        interval: args.interval,
        rounds: args.rounds,
        format: match args.format {
            OutputFormat::Json => ReportFormat::Json,
            OutputFormat::Text => ReportFormat::Text,
        },
    };
    Ok(run_local(&config, out)?)
}

/// `--backend kubernetes`: rounds over the cluster's LodeJobs until SIGINT/SIGTERM or --rounds.
fn run_kubernetes(
    args: SchedulerArgs,
    policy: Policy,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let mut node_selector = std::collections::BTreeMap::new();
    for pair in &args.node_selector {
        let Some((k, v)) = pair.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            bail!("--node-selector {pair:?}: expected KEY=VALUE");
        };
        node_selector.insert(k.to_owned(), v.to_owned());
    }
    let tls = (args.tls.tls_ca.as_deref())
        .map(lode_proto::tls::ClientTls::from_ca_file)
        .transpose()?;
    let config = lode_k8s::scheduler::SchedulerConfig {
        namespace: args.namespace,
        policy,
        decide: lode_scheduler::DecideConfig::default(),
        interval: args.interval,
        rounds: args.rounds,
        node_selector,
    };
    let dispatchers = std::sync::Arc::new(lode_k8s::scheduler::GrpcDispatchers {
        tls,
        timeout: args.dispatcher_timeout,
    });
    crate::runtime::runtime()?.block_on(async {
        let client = lode_k8s::controller::client().await?;
        let stop = lode_proto::process::stop_requested();
        lode_k8s::scheduler::run(client, config, dispatchers, stop, out)
            .await
            .map_err(anyhow::Error::from)
    })
}
