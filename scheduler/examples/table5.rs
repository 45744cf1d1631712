//! Prints the Table 5-like summary for synthetic seeds given on the command line:
//! `cargo run --release -p lode-scheduler --example table5 -- 1 2 3`.
//!
//! Knobs (environment): `LOAD`, `MEDIAN_MINUTES`, `SIGMA` change the synthetic trace;
//! `TRACE=FILE` runs a CSV trace instead; `NO_FLOORS=1` allocates by the policy's metric alone
//! (`lode simulate --no-floors`); `DEMAND=1` prints the CPUs every job would need at its ideal
//! speed with data workers; `DETAIL=1` prints slowdowns and utilisation per scheduler;
//! `CLUSTER=SPEC` runs another cluster (`lode simulate --cluster`), e.g.
//! `CLUSTER=8x8gpu64cpu+4x0gpu64cpu` for four CPU-only machines beside the paper's eight.

use std::time::Instant;

use lode_scheduler::report::{summarize, table};
use lode_scheduler::{simulate, SchedulerKind, SimConfig, SyntheticConfig, Trace};

fn main() -> Result<(), lode_scheduler::Error> {
    let seeds: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seeds = if seeds.is_empty() { vec![1] } else { seeds };
    for seed in seeds {
        let started = Instant::now();
        let mut synthetic = SyntheticConfig::default();
        let cluster = match std::env::var("CLUSTER") {
            Ok(spec) => spec.parse()?,
            Err(_) => lode_scheduler::ClusterSpec::paper(),
        };
        // The synthetic trace's load is over the cluster's GPUs, which CPU-only machines do
        // not change.
        synthetic.cluster_gpus = cluster.total_gpus();
        // Calibration knobs, for exploring the workload model.
        let knob = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = knob("LOAD") {
            synthetic.target_load = v;
        }
        if let Some(v) = knob("MEDIAN_MINUTES") {
            synthetic.median_minutes = v;
        }
        if let Some(v) = knob("SIGMA") {
            synthetic.sigma = v;
        }
        let trace = match std::env::var("TRACE") {
            Ok(path) => Trace::parse_csv(&std::fs::read_to_string(path).unwrap_or_default())?,
            Err(_) => Trace::synthetic(seed, &synthetic),
        };
        let config = SimConfig {
            cluster,
            seed,
            floors: std::env::var("NO_FLOORS").is_err(),
            ..SimConfig::default()
        };
        let results = SchedulerKind::ALL
            .iter()
            .map(|k| simulate(&trace, *k, &config))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = summarize(&results, &results[0]);
        let offered: f64 = trace
            .jobs
            .iter()
            .map(|j| f64::from(j.gpus) * j.ideal_secs())
            .sum::<f64>()
            / (synthetic.hours * 3600.0 * f64::from(config.cluster.total_gpus()));
        println!("offered GPU load {offered:.2}");
        if std::env::var("DEMAND").is_ok() {
            // CPUs each job needs at its ideal speed with data workers (local workers at
            // their knee, the scaling gap paid, the training worker's own CPUs), over the
            // cluster's CPUs.
            let cpus: f64 = config
                .cluster
                .machines
                .iter()
                .map(|m| f64::from(m.cpus))
                .sum();
            let need: f64 = trace
                .jobs
                .iter()
                .map(|j| {
                    let m = j.model;
                    f64::from(j.gpus)
                        * (m.ideal_dw_cpus_per_gpu() + m.tw_cpu_per_gpu)
                        * j.ideal_secs()
                })
                .sum();
            println!(
                "CPU demand at ideal speed: {:.2} of the cluster's CPUs",
                need / (synthetic.hours * 3600.0 * cpus)
            );
        }
        if std::env::var("DETAIL").is_ok() {
            for r in &results {
                let n = r.jobs.len() as f64;
                let slow = r
                    .jobs
                    .iter()
                    .map(|j| (j.finish_s - j.start_s) / j.ideal_s)
                    .sum::<f64>()
                    / n;
                let end = r.makespan_s().min(synthetic.hours * 3600.0);
                let win: Vec<_> = r.timeline.windows(2).filter(|w| w[0].t_s < end).collect();
                let avg = |f: &dyn Fn(&lode_scheduler::sim::UtilSample) -> f64| {
                    win.iter()
                        .map(|w| f(&w[0]) * (w[1].t_s.min(end) - w[0].t_s))
                        .sum::<f64>()
                        / end
                };
                println!(
                    "  {:<12} slowdown {:.2} gpu_busy {:.2} gpu_alloc {:.2} cpu_alloc {:.2} makespan {:.1}h",
                    r.scheduler, slow, avg(&|u| u.gpu_busy), avg(&|u| u.gpu_alloc), avg(&|u| u.cpu_alloc),
                    r.makespan_s() / 3600.0
                );
            }
        }
        if std::env::var("BY_MODEL").is_ok() {
            // Mean slowdown (run time over ideal) per model, per scheduler.
            for r in &results {
                let cells: Vec<String> = lode_scheduler::model::CATALOGUE
                    .iter()
                    .map(|m| {
                        let s: Vec<f64> = r
                            .jobs
                            .iter()
                            .filter(|j| j.model == m.name)
                            .map(|j| (j.finish_s - j.start_s) / j.ideal_s)
                            .collect();
                        format!(
                            "{} {:.2}",
                            m.name,
                            s.iter().sum::<f64>() / s.len().max(1) as f64
                        )
                    })
                    .collect();
                println!("  {:<12} {}", r.scheduler, cells.join(" "));
            }
        }
        println!(
            "seed {seed}: {} jobs, {:.2} s\n{}",
            trace.jobs.len(),
            started.elapsed().as_secs_f64(),
            table(&rows)
        );
    }
    Ok(())
}
