//! The paper's cluster experiment (GoldMiner §5.6) as one call: a trace run under each
//! requested scheduler, with `no-dw-tuned` always simulated as the reference, summarized as
//! Table 5 rows; and the files `lode simulate --out DIR` writes.

use std::path::{Path, PathBuf};

use crate::report::{jobs_csv, summarize, table, utilisation_svg, Summary};
use crate::sim::{simulate, SchedulerKind, SimConfig, SimResult};
use crate::trace::Trace;
use crate::Error;

/// Why an experiment's files could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Trace {
        path: PathBuf,
        #[source]
        source: Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Simulation(#[from] Error),
}

/// A trace CSV file; errors name the file and the line.
pub fn load_trace(path: &Path) -> Result<Trace, ExperimentError> {
    let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Read {
        path: path.to_owned(),
        source,
    })?;
    Trace::parse_csv(&text).map_err(|source| ExperimentError::Trace {
        path: path.to_owned(),
        source,
    })
}

/// What an experiment produced: one result and one Table 5 row per scheduler asked for.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub results: Vec<SimResult>,
    pub rows: Vec<Summary>,
}

/// Runs `trace` under each of `schedulers` (gains relative to `no-dw-tuned`).
pub fn run(
    trace: &Trace,
    schedulers: &[SchedulerKind],
    config: &SimConfig,
) -> Result<Outcome, ExperimentError> {
    tracing::info!(
        jobs = trace.jobs.len(),
        schedulers = schedulers.len(),
        "simulating"
    );
    let baseline = simulate(trace, SchedulerKind::NoDwTuned, config)?;
    let mut results = Vec::with_capacity(schedulers.len());
    for &kind in schedulers {
        let started = std::time::Instant::now();
        let result = if kind == SchedulerKind::NoDwTuned {
            baseline.clone()
        } else {
            simulate(trace, kind, config)?
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
    Ok(Outcome { results, rows })
}

/// Writes `utilisation.svg`, `jobs.csv`, `trace.csv` (the trace that ran, in the input format)
/// and `summary.json` into `dir`, created if missing.
pub fn write_outputs(dir: &Path, trace: &Trace, outcome: &Outcome) -> Result<(), ExperimentError> {
    let write = |name: &str, body: String| {
        let path = dir.join(name);
        std::fs::write(&path, body).map_err(|source| ExperimentError::Write { path, source })
    };
    std::fs::create_dir_all(dir).map_err(|source| ExperimentError::Write {
        path: dir.to_owned(),
        source,
    })?;
    write("utilisation.svg", utilisation_svg(&outcome.results))?;
    write("jobs.csv", jobs_csv(&outcome.results))?;
    write("trace.csv", trace.to_csv())?;
    let summary = serde_json::to_string_pretty(&outcome.rows).unwrap_or_default() + "\n";
    write("summary.json", summary)
}

/// The text summary: the trace and cluster, then Table 5.
pub fn text(trace: &Trace, config: &SimConfig, outcome: &Outcome) -> String {
    let cluster = &config.cluster;
    let cpu_only: Vec<_> = cluster
        .machines
        .iter()
        .filter(|m| m.is_cpu_only())
        .collect();
    let extra = if cpu_only.is_empty() {
        String::new()
    } else {
        format!(
            " ({} of them on {} CPU-only machines)",
            cpu_only.iter().map(|m| m.cpus).sum::<u32>(),
            cpu_only.len()
        )
    };
    format!(
        "{} jobs on {} GPUs / {} CPUs{extra}\n{}",
        trace.jobs.len(),
        cluster.total_gpus(),
        cluster.total_cpus(),
        table(&outcome.rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(floors: bool) -> SimConfig {
        SimConfig {
            cluster: "8x8gpu64cpu".parse().expect("spec"),
            seed: 1,
            floors,
            ..SimConfig::default()
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
        let err = load_trace(&path).expect_err("bad line");
        let msg = format!("{err}");
        assert!(msg.contains("t.csv") && msg.contains("line 3"), "{msg}");
        let err = load_trace(&dir.path().join("missing.csv")).expect_err("missing");
        assert!(format!("{err}").contains("missing.csv"));
    }

    #[test]
    fn rows_and_out_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.csv");
        std::fs::write(&path, "0,0,1,3000,alexnet\n1,30,2,2000,bert\n").expect("write");
        let trace = load_trace(&path).expect("trace");
        let outcome = run(
            &trace,
            &[SchedulerKind::Lode(crate::Policy::Srtf)],
            &config(true),
        )
        .expect("runs");
        assert_eq!(outcome.rows.len(), 1);
        assert_eq!(outcome.rows[0].scheduler, "srtf");
        assert!(outcome.rows[0].avg_jct_min > 0.0);
        let out = dir.path().join("out");
        write_outputs(&out, &trace, &outcome).expect("writes");
        for f in ["utilisation.svg", "jobs.csv", "trace.csv", "summary.json"] {
            assert!(out.join(f).is_file(), "{f}");
        }
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("summary.json")).expect("read"))
                .expect("json");
        assert_eq!(summary[0]["scheduler"], "srtf");
        assert!(text(&trace, &config(true), &outcome).starts_with("2 jobs on 64 GPUs / 512 CPUs\n"));
        let more = SimConfig {
            cluster: "8x8gpu64cpu+2x0gpu32cpu".parse().expect("spec"),
            ..config(true)
        };
        assert!(text(&trace, &more, &outcome)
            .starts_with("2 jobs on 64 GPUs / 576 CPUs (64 of them on 2 CPU-only machines)\n"));
    }
}
