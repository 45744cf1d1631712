//! `lode simulate`: the paper's cluster experiment (GoldMiner §5.6) on the discrete-event
//! simulator of `lode-scheduler` (`lode_scheduler::experiment`).

use lode_scheduler::{experiment, ClusterSpec, SchedulerKind, SimConfig, SyntheticConfig, Trace};

use crate::cli::{OutputFormat, SimPolicyArg, SimulateArgs};

fn schedulers(policy: SimPolicyArg) -> Vec<SchedulerKind> {
    let name = match policy {
        SimPolicyArg::All => return SchedulerKind::ALL.to_vec(),
        SimPolicyArg::NoDwTuned => "no-dw-tuned",
        SimPolicyArg::NoDwHw => "no-dw-hw",
        SimPolicyArg::FixedDw => "fixed-dw",
        SimPolicyArg::Maxtp => "maxtp",
        SimPolicyArg::Srtf => "srtf",
        SimPolicyArg::Fair => "fair",
    };
    SchedulerKind::ALL
        .into_iter()
        .filter(|k| k.name() == name)
        .collect()
}

pub fn run_simulate(args: SimulateArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let cluster: ClusterSpec = args.cluster.parse()?;
    let seed = args.synthetic.unwrap_or(1);
    let trace = match &args.trace {
        Some(path) => experiment::load_trace(path)?,
        None => Trace::synthetic(
            seed,
            &SyntheticConfig {
                cluster_gpus: cluster.total_gpus(),
                ..SyntheticConfig::default()
            },
        ),
    };
    let config = SimConfig {
        cluster,
        seed,
        floors: !args.no_floors,
        ..SimConfig::default()
    };
    let outcome = experiment::run(&trace, &schedulers(args.policy), &config)?;
    if let Some(dir) = &args.out {
        experiment::write_outputs(dir, &trace, &outcome)?;
    }
    match args.format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&outcome.rows)?)?,
        OutputFormat::Text => {
            out.write_all(experiment::text(&trace, &config, &outcome).as_bytes())?
        }
    }
    Ok(())
}
