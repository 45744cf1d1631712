//! `lode simulate`: the paper's cluster experiment (GoldMiner §5.6) on the discrete-event
//! simulator of `lode-scheduler`.
//!
//! Runs a trace (a CSV file, or a seeded synthetic one) under each requested scheduler and
//! prints a Table 5-like summary: average JCT, JCT gain over `no-dw-tuned` (which is always
//! simulated, as the reference), and average queuing delay. With `--out DIR` it also writes
//! `utilisation.svg` (GPU and CPU utilisation over time per scheduler), `jobs.csv` (per-job
//! results), `summary.json` and `trace.csv` (the trace that ran, in the input format).

use std::path::Path;

use anyhow::Context as _;
use lode_scheduler::report::{jobs_csv, summarize, table, utilisation_svg};
use lode_scheduler::{simulate, ClusterSpec, SchedulerKind, SimConfig, SyntheticConfig, Trace};

use crate::cli::{OutputFormat, SimPolicyArg, SimulateArgs};

impl SimPolicyArg {
    fn schedulers(self) -> Vec<SchedulerKind> {
        let name = match self {
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
}

fn load_trace(path: &Path) -> anyhow::Result<Trace> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Trace::parse_csv(&text).with_context(|| format!("{}", path.display()))
}

/// Runs `lode simulate`, writing the summary to `out`.
pub fn run_simulate(args: SimulateArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let cluster: ClusterSpec = args.cluster.parse()?;
    let seed = args.synthetic.unwrap_or(1);
    let trace = match &args.trace {
        Some(path) => load_trace(path)?,
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
    let wanted = args.policy.schedulers();
    tracing::info!(
        jobs = trace.jobs.len(),
        schedulers = wanted.len(),
        "simulating"
    );
    let baseline = simulate(&trace, SchedulerKind::NoDwTuned, &config)?;
    let mut results = Vec::with_capacity(wanted.len());
    for kind in wanted {
        let started = std::time::Instant::now();
        let result = if kind == SchedulerKind::NoDwTuned {
            baseline.clone()
        } else {
            simulate(&trace, kind, &config)?
        };
        tracing::info!(
            scheduler = kind.name(),
            secs = started.elapsed().as_secs_f64(),
            events = result.events,
            "simulated"
        );
        results.push(result);
    }
    let rows = summarize(&results, &baseline);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let write = |name: &str, body: String| -> anyhow::Result<()> {
            let path = dir.join(name);
            std::fs::write(&path, body).with_context(|| format!("cannot write {}", path.display()))
        };
        write("utilisation.svg", utilisation_svg(&results))?;
        write("jobs.csv", jobs_csv(&results))?;
        write("trace.csv", trace.to_csv())?;
        write("summary.json", serde_json::to_string_pretty(&rows)? + "\n")?;
    }
    match args.format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &rows)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            writeln!(
                out,
                "{} jobs on {} GPUs / {} CPUs",
                trace.jobs.len(),
                config.cluster.total_gpus(),
                config.cluster.total_cpus()
            )?;
            out.write_all(table(&rows).as_bytes())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(trace: Option<std::path::PathBuf>) -> SimulateArgs {
        SimulateArgs {
            trace,
            synthetic: None,
            cluster: "8x8gpu64cpu".to_owned(),
            policy: SimPolicyArg::Srtf,
            format: OutputFormat::Json,
            no_floors: false,
            out: None,
        }
    }

    #[test]
    fn a_bad_trace_line_names_the_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.csv");
        std::fs::write(
            &path,
            "job,arrival_s,gpus,steps,model\n0,0,1,10,resnet50\n1,0,x,10,bert\n",
        )
        .expect("write");
        let err = run_simulate(args(Some(path.clone())), &mut Vec::new()).expect_err("bad line");
        let msg = format!("{err:#}");
        assert!(msg.contains("t.csv") && msg.contains("line 3"), "{msg}");
        let missing = dir.path().join("missing.csv");
        let err = run_simulate(args(Some(missing)), &mut Vec::new()).expect_err("missing");
        assert!(format!("{err:#}").contains("missing.csv"));
    }

    #[test]
    fn json_rows_and_out_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "0,0,1,3000,alexnet\n1,30,2,2000,bert\n").expect("write");
        let mut a = args(Some(path));
        a.out = Some(dir.path().join("out"));
        let mut buf = Vec::new();
        run_simulate(a, &mut buf).expect("runs");
        let rows: serde_json::Value = serde_json::from_slice(&buf).expect("json");
        assert_eq!(rows[0]["scheduler"], "srtf");
        for key in ["avg_jct_min", "jct_gain", "avg_queue_min"] {
            assert!(rows[0][key].is_number(), "{key}");
        }
        for f in ["utilisation.svg", "jobs.csv", "trace.csv", "summary.json"] {
            assert!(dir.path().join("out").join(f).is_file(), "{f}");
        }
    }
    #[test]
    fn no_floors_reaches_the_simulator() {
        // A long 8-GPU job among short jobs that want more CPUs than the cluster has: SRTF
        // ranks it last, and only its floor keeps it training (scheduler/README.md, "Floors").
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.csv");
        let mut csv = String::from("0,0,8,24000,resnet18\n");
        for i in 1..=120 {
            csv.push_str(&format!("{i},{},1,8000,resnet18\n", 60 * i));
        }
        std::fs::write(&path, csv).expect("write");
        let jct = |no_floors| {
            let mut a = args(Some(path.clone()));
            a.no_floors = no_floors;
            let mut buf = Vec::new();
            run_simulate(a, &mut buf).expect("runs");
            let rows: serde_json::Value = serde_json::from_slice(&buf).expect("json");
            rows[0]["avg_jct_min"].as_f64().expect("number")
        };
        let (with, without) = (jct(false), jct(true));
        assert!((with - without).abs() > 0.01 * with, "{with} vs {without}");
    }
}
