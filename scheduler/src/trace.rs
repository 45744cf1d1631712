//! Job traces: the CSV format, and Philly-like synthetic traces.
//!
//! # CSV format
//!
//! One job per line, comma-separated, in this column order:
//!
//! ```text
//! job,arrival_s,gpus,steps,model
//! 0,12.5,1,15000,resnet50
//! 1,40,8,3200,alexnet
//! ```
//!
//! - `job`: unique non-negative integer id.
//! - `arrival_s`: submission time in seconds from the start of the trace (finite, ≥ 0).
//! - `gpus`: GPUs of the training worker (≥ 1); more than one machine holds spans machines.
//! - `steps`: training steps to run (≥ 1); a job's duration is `steps × step_secs` of its model
//!   when never starved of data.
//! - `model`: a model type of the built-in catalogue ([`crate::model::CATALOGUE`]), which
//!   fixes its CPU appetite and data-worker scaling curve.
//!
//! A first line starting with `job` is a header; empty lines and lines starting with `#` are
//! ignored. Lines need not be sorted; jobs are run in arrival order (ties by id).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde::Serialize;

use crate::ids::JobId;
use crate::model::{model_by_name, ModelType, CATALOGUE, CPU_INTENSIVE_RATIO};
use crate::rng::SplitMix64;
use crate::Error;

/// One job of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceJob {
    pub id: JobId,
    pub arrival_s: f64,
    pub gpus: u32,
    pub steps: u64,
    pub model: &'static ModelType,
}

impl TraceJob {
    /// Run time in seconds at the ideal throughput.
    pub fn ideal_secs(&self) -> f64 {
        // Steps are far below 2^53 in any trace, so the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        let steps = self.steps as f64;
        steps * self.model.step_secs
    }
}

/// A trace sorted by arrival time.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
}

/// What is wrong with one line of a trace CSV.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TraceProblem {
    #[error("expected 5 columns (job,arrival_s,gpus,steps,model), found {got}")]
    Columns { got: usize },
    #[error("column {column}: {value:?} is not a valid value")]
    Value { column: &'static str, value: String },
    #[error("unknown model {name:?} (known: {known})")]
    UnknownModel { name: String, known: String },
    #[error("job id {job} appears twice")]
    DuplicateJob { job: u64 },
}

impl Trace {
    /// Parses the CSV format described in the module docs.
    pub fn parse_csv(text: &str) -> Result<Self, Error> {
        let mut jobs = Vec::new();
        let mut seen = BTreeSet::new();
        let mut first = true;
        for (n, raw) in text.lines().enumerate() {
            let line = n + 1;
            let row = raw.trim();
            if row.is_empty() || row.starts_with('#') {
                continue;
            }
            if std::mem::take(&mut first) && row.starts_with("job") {
                continue;
            }
            let err = |problem| Error::Trace { line, problem };
            let cols: Vec<&str> = row.split(',').map(str::trim).collect();
            let [id, arrival, gpus, steps, model] = cols[..] else {
                return Err(err(TraceProblem::Columns { got: cols.len() }));
            };
            let value = |column: &'static str, value: &str| {
                err(TraceProblem::Value {
                    column,
                    value: value.to_owned(),
                })
            };
            let id_n: u64 = id.parse().map_err(|_| value("job", id))?;
            let arrival_s: f64 = arrival
                .parse()
                .ok()
                .filter(|a: &f64| a.is_finite() && *a >= 0.0)
                .ok_or_else(|| value("arrival_s", arrival))?;
            let gpus_n: u32 = gpus
                .parse()
                .ok()
                .filter(|g| *g > 0)
                .ok_or_else(|| value("gpus", gpus))?;
            let steps_n: u64 = steps
                .parse()
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| value("steps", steps))?;
            let model = model_by_name(model).ok_or_else(|| {
                err(TraceProblem::UnknownModel {
                    name: model.to_owned(),
                    known: CATALOGUE
                        .iter()
                        .map(|m| m.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            })?;
            if !seen.insert(id_n) {
                return Err(err(TraceProblem::DuplicateJob { job: id_n }));
            }
            jobs.push(TraceJob {
                id: JobId(id_n),
                arrival_s,
                gpus: gpus_n,
                steps: steps_n,
                model,
            });
        }
        let mut trace = Self { jobs };
        trace.sort();
        Ok(trace)
    }

    fn sort(&mut self) {
        self.jobs
            .sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s).then(a.id.cmp(&b.id)));
    }

    /// Writes the trace in the CSV format, header included.
    pub fn to_csv(&self) -> String {
        let mut s = String::from("job,arrival_s,gpus,steps,model\n");
        for j in &self.jobs {
            // Writing to a String cannot fail.
            let _ = writeln!(
                s,
                "{},{:.3},{},{},{}",
                j.id.0, j.arrival_s, j.gpus, j.steps, j.model.name
            );
        }
        s
    }

    /// The first `n` jobs (a reduced trace for quick runs).
    pub fn truncated(&self, n: usize) -> Self {
        Self {
            jobs: self.jobs.iter().take(n).cloned().collect(),
        }
    }
}

/// Parameters of a synthetic Philly-like trace (see scheduler/README.md for the reasoning).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SyntheticConfig {
    /// Jobs arrive during this many hours.
    pub hours: f64,
    /// Offered GPU load: the jobs' GPU-time at their ideal throughput over the cluster's
    /// GPU-time during `hours`. Jobs are drawn until it is reached, which sets the arrival rate
    /// (seeds then differ in job mix and timing, not in how loaded the cluster is).
    pub target_load: f64,
    /// GPUs of the cluster the load is relative to.
    pub cluster_gpus: u32,
    /// GPU counts and their weights.
    pub gpu_weights: Vec<(u32, f64)>,
    /// Standalone (ideal) duration: log-normal with this median (minutes) and sigma, clipped.
    pub median_minutes: f64,
    pub sigma: f64,
    pub min_minutes: f64,
    pub max_minutes: f64,
    /// Fraction of jobs drawn from the CPU-intensive model types.
    pub cpu_intensive_fraction: f64,
    /// Best-fit CPU-GPU ratio above which a model type is CPU-intensive.
    pub cpu_intensive_ratio: f64,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        Self {
            hours: 8.0,
            target_load: 0.6,
            cluster_gpus: 64,
            gpu_weights: vec![(1, 0.65), (2, 0.17), (4, 0.12), (8, 0.05), (16, 0.01)],
            median_minutes: 25.0,
            sigma: 0.8,
            min_minutes: 3.0,
            max_minutes: 180.0,
            cpu_intensive_fraction: 0.5,
            cpu_intensive_ratio: CPU_INTENSIVE_RATIO,
        }
    }
}

impl Trace {
    /// A synthetic trace: Philly-like GPU counts and heavy-tailed durations translated into
    /// steps of the job's model type, half the jobs (by default) of CPU-intensive model types,
    /// drawn until the offered load is reached; arrivals are a Poisson process over the
    /// window conditioned on that number of jobs (sorted uniform times). Same seed, same trace.
    pub fn synthetic(seed: u64, config: &SyntheticConfig) -> Self {
        let mut rng = SplitMix64::new(seed ^ 0x4c4f_4445);
        let (heavy, light): (Vec<&'static ModelType>, Vec<&'static ModelType>) = CATALOGUE
            .iter()
            .partition(|m| m.is_cpu_intensive(config.cpu_intensive_ratio));
        let weights: Vec<f64> = config.gpu_weights.iter().map(|(_, w)| *w).collect();
        let horizon = config.hours * 3600.0;
        let budget = config.target_load * f64::from(config.cluster_gpus) * horizon;
        let mut jobs = Vec::new();
        let mut offered = 0.0;
        let mut id = 0u64;
        while offered < budget && jobs.len() < 1_000_000 {
            let pool = if rng.next_f64() < config.cpu_intensive_fraction && !heavy.is_empty() {
                &heavy
            } else if !light.is_empty() {
                &light
            } else {
                &heavy
            };
            let model = pool[rng.weighted(&vec![1.0; pool.len()])];
            let gpus = config
                .gpu_weights
                .get(rng.weighted(&weights))
                .map_or(1, |(g, _)| *g);
            let minutes = (config.median_minutes * (config.sigma * rng.normal()).exp())
                .clamp(config.min_minutes, config.max_minutes);
            let steps = (minutes * 60.0 / model.step_secs).ceil().max(1.0);
            // Clamped to at most max_minutes of steps above, far below u64::MAX.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let steps = steps as u64;
            let job = TraceJob {
                id: JobId(id),
                arrival_s: 0.0,
                gpus,
                steps,
                model,
            };
            offered += f64::from(gpus) * job.ideal_secs();
            jobs.push(job);
            id += 1;
        }
        let mut times: Vec<f64> = jobs.iter().map(|_| rng.next_f64() * horizon).collect();
        times.sort_by(f64::total_cmp);
        for (job, t) in jobs.iter_mut().zip(times) {
            job.arrival_s = t;
        }
        let mut trace = Self { jobs };
        trace.sort();
        trace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trips() {
        let t = Trace::synthetic(3, &SyntheticConfig::default());
        let back = Trace::parse_csv(&t.to_csv()).expect("own output parses");
        assert_eq!(back.jobs.len(), t.jobs.len());
        for (a, b) in t.jobs.iter().zip(&back.jobs) {
            assert_eq!(
                (a.id, a.gpus, a.steps, a.model.name),
                (b.id, b.gpus, b.steps, b.model.name)
            );
            assert!((a.arrival_s - b.arrival_s).abs() < 1e-3);
        }
    }

    #[test]
    fn synthetic_is_seeded_and_half_cpu_intensive() {
        let c = SyntheticConfig::default();
        let a = Trace::synthetic(1, &c);
        assert_eq!(a, Trace::synthetic(1, &c));
        assert_ne!(a, Trace::synthetic(2, &c));
        let heavy = a
            .jobs
            .iter()
            .filter(|j| j.model.is_cpu_intensive(CPU_INTENSIVE_RATIO))
            .count();
        let share = heavy as f64 / a.jobs.len() as f64;
        assert!((0.35..0.65).contains(&share), "{share}");
        assert!(a.jobs.iter().all(|j| j.arrival_s < 8.0 * 3600.0));
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        let cases = [
            (
                "job,arrival_s,gpus,steps,model\n0,1,1,10,resnet50\n1,2,1\n",
                3,
                "expected 5 columns",
            ),
            ("0,x,1,10,resnet50\n", 1, "arrival_s"),
            ("# c\n\n0,1,0,10,resnet50\n", 3, "gpus"),
            ("0,1,1,10,resnet50\n0,2,1,10,resnet50\n", 2, "twice"),
            ("0,1,1,10,nope\n", 1, "unknown model"),
            ("0,-1,1,10,resnet50\n", 1, "arrival_s"),
            ("0,1,1,0,resnet50\n", 1, "steps"),
        ];
        for (text, line, what) in cases {
            let err = Trace::parse_csv(text).expect_err(text);
            let msg = err.to_string();
            assert!(msg.contains(&format!("line {line}")), "{msg}");
            assert!(msg.contains(what), "{msg}");
        }
    }

    #[test]
    fn sorts_by_arrival() {
        let t = Trace::parse_csv("1,20,1,10,resnet50\n0,10,2,10,alexnet\n").expect("valid");
        assert_eq!(t.jobs[0].id, JobId(0));
    }
}
