//! The simulator's ground truth: how fast a job trains given the CPUs it has.
//!
//! Throughput is expressed as a fraction `f` of the job's ideal throughput (the GPUs never wait
//! for data), so `f = 1` means `1 / step_secs` steps per second. The scheduler never reads these
//! curves; it only sees the throughput they produce (queue metrics), as a live scheduler would.
//!
//! Per model type (each number's source is in scheduler/README.md, "Catalogue"):
//! - `best_fit_ratio` `r*`: the CPUs per GPU at which the job, without Lode's data workers,
//!   reaches its ideal throughput (GoldMiner Fig. 1's best-fit CPU-GPU ratio). The effective
//!   pre-processing CPUs per GPU it needs ([`ModelType::cpu_per_gpu`]) follow from it.
//! - A per-process curve: a process with `k` CPUs does the work of `min(k, knee) +
//!   beta * max(0, k - knee)` effective CPUs (the input pipeline's parallelism inside one
//!   process stops scaling linearly past `knee` threads).
//! - `scaling_gap` `γ`: the pipeline's scaling across processes is near-linear but not quite
//!   (§5.1): the production fraction `p` of linearly scaled CPUs becomes `p / (1 + k·p)` with
//!   `k = γ / (1 − γ)`, so at the CPUs that linear scaling would need for the ideal (`p = 1`)
//!   the job reaches `1 − γ` of it.
//! - `tw_cpu_per_gpu`: CPUs the training worker needs for itself (the training loop, its own
//!   ops); with fewer, it cannot consume at the ideal rate.
//! - `remote_efficiency`: a data worker on another machine than its training worker delivers
//!   this fraction of a local one (serialisation and network).
//! - Without Lode's data workers the pipeline runs on the training worker's own CPUs beyond what
//!   it keeps for itself: inside its process at `in_process_efficiency` per CPU (tf.data's own
//!   thread pool, no per-process knee, sharing the process with training), or, for the models
//!   that barely scale inside one process (`local_data_workers`), in local data-worker
//!   processes of `knee` CPUs on the same CPUs, as the paper's `no-dw` baselines run them.

use serde::Serialize;

/// Models whose best-fit CPU-GPU ratio is above this are CPU-intensive: the ratio of the
/// paper's production cluster, which GoldMiner uses to split Table 1's models in two.
pub const CPU_INTENSIVE_RATIO: f64 = 12.0;

/// One model archetype with its own CPU appetite and data-worker scaling curve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelType {
    pub name: &'static str,
    /// Seconds per training step when the GPUs never wait for data.
    pub step_secs: f64,
    /// CPUs per GPU at which the job reaches its ideal throughput without Lode's data workers.
    pub best_fit_ratio: f64,
    /// Shortfall from linear scaling across processes at the CPUs linear scaling would need.
    pub scaling_gap: f64,
    pub knee: f64,
    pub beta: f64,
    pub tw_cpu_per_gpu: f64,
    pub remote_efficiency: f64,
    pub in_process_efficiency: f64,
    /// Whether the pipeline barely scales inside one process, so that running it without
    /// Lode means local data-worker processes of `knee` CPUs on the job's own CPUs.
    pub local_data_workers: bool,
}

/// How a model's pipeline scales inside one process, and where it runs without Lode.
#[derive(Debug, Clone, Copy)]
struct ProcessScaling {
    knee: f64,
    beta: f64,
    local_data_workers: bool,
}

/// Scales linearly to 8 threads in one process (assumed: the paper's initial data worker of
/// 8 CPUs, §3.4.1/§5.5), and runs in the training process without Lode.
const IN_PROCESS: ProcessScaling = ProcessScaling {
    knee: 8.0,
    beta: 0.3,
    local_data_workers: false,
};

/// "Nearly zero speedup when using more CPUs" in one process (§5.1): without Lode it runs in
/// local data-worker processes, as the paper's no-dw baselines run it.
const LOCAL_WORKERS: ProcessScaling = ProcessScaling {
    knee: 1.0,
    beta: 0.05,
    local_data_workers: true,
};

/// A catalogue entry: name, step time (s), best-fit ratio, scaling gap, process scaling. The
/// training worker's own CPU per GPU and the efficiencies are the same for every model
/// (assumed; see scheduler/README.md).
const fn model(
    name: &'static str,
    step_secs: f64,
    best_fit_ratio: f64,
    scaling_gap: f64,
    process: ProcessScaling,
) -> ModelType {
    ModelType {
        name,
        step_secs,
        best_fit_ratio,
        scaling_gap,
        knee: process.knee,
        beta: process.beta,
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.9,
        in_process_efficiency: 0.9,
        local_data_workers: process.local_data_workers,
    }
}

/// The built-in catalogue: GoldMiner's Table 1 models, four below the CPU-intensive ratio and
/// six above it (sources in scheduler/README.md, "Catalogue").
pub const CATALOGUE: &[ModelType] = &[
    model("bert", 0.40, 4.0, 0.05, IN_PROCESS),
    model("vgg16", 0.30, 9.0, 0.05, IN_PROCESS),
    model("inception_v3", 0.30, 10.0, 0.05, IN_PROCESS),
    model("resnet50", 0.25, 11.0, 0.05, IN_PROCESS),
    model("din", 0.08, 16.0, 0.11, LOCAL_WORKERS),
    model("resnet18", 0.15, 21.0, 0.14, IN_PROCESS),
    model("deepfm", 0.05, 28.0, 0.05, LOCAL_WORKERS),
    model("shufflenet_v2", 0.12, 37.0, 0.05, IN_PROCESS),
    model("wdl", 0.05, 48.0, 0.17, LOCAL_WORKERS),
    model("alexnet", 0.10, 64.0, 0.05, IN_PROCESS),
];

/// Looks a model type up by name in the catalogue.
pub fn model_by_name(name: &str) -> Option<&'static ModelType> {
    CATALOGUE.iter().find(|m| m.name == name)
}

impl ModelType {
    /// Effective CPUs delivered by one process holding `cpus` CPUs.
    pub fn effective(&self, cpus: f64) -> f64 {
        let cpus = cpus.max(0.0);
        cpus.min(self.knee) + self.beta * (cpus - self.knee).max(0.0)
    }

    /// `k` of the scaling curve `p / (1 + k·p)`: `1 − γ` of linear at `p = 1`.
    fn gap_k(&self) -> f64 {
        let gap = self.scaling_gap.clamp(0.0, 0.49);
        gap / (1.0 - gap)
    }

    fn shape(&self, p: f64) -> f64 {
        let p = p.max(0.0);
        p / (1.0 + self.gap_k() * p)
    }

    /// Effective pre-processing CPUs per GPU of linear scaling that the ideal would take
    /// without the scaling gap (`d`), derived from the best-fit ratio: at `best_fit_ratio` CPUs
    /// per GPU without Lode's data workers the job reaches exactly its ideal.
    pub fn cpu_per_gpu(&self) -> f64 {
        (self.best_fit_ratio - self.tw_cpu_per_gpu).max(0.0)
            * self.local_efficiency()
            * (1.0 - self.gap_k())
    }

    /// Effective data-worker CPUs per GPU that bring the job to its ideal (workers at or below
    /// their knee, all local): the linear need with the scaling gap paid.
    pub fn ideal_dw_cpus_per_gpu(&self) -> f64 {
        (self.best_fit_ratio - self.tw_cpu_per_gpu).max(0.0) * self.local_efficiency()
    }

    /// Effective CPUs per CPU of the pipeline without Lode's data workers.
    pub fn local_efficiency(&self) -> f64 {
        if self.local_data_workers {
            // Local processes of `knee` CPUs each, all on the linear part of their curve.
            1.0
        } else {
            self.in_process_efficiency
        }
    }

    /// Whether the model's best-fit CPU-GPU ratio is above `threshold` (CPU-intensive).
    pub fn is_cpu_intensive(&self, threshold: f64) -> bool {
        self.best_fit_ratio > threshold
    }

    /// Production fraction of data workers: each `(cpus, remote)` is one worker.
    pub fn dw_production(&self, gpus: u32, workers: impl IntoIterator<Item = (f64, bool)>) -> f64 {
        let demand = f64::from(gpus.max(1)) * self.cpu_per_gpu();
        let effective: f64 = workers
            .into_iter()
            .map(|(cpus, remote)| {
                let e = self.effective(cpus);
                if remote {
                    e * self.remote_efficiency
                } else {
                    e
                }
            })
            .sum();
        if demand <= 0.0 {
            return if effective > 0.0 { f64::INFINITY } else { 0.0 };
        }
        self.shape(effective / demand)
    }

    /// Consumption fraction of a training worker holding `tw_cpus` CPUs and doing no
    /// pre-processing itself.
    pub fn tw_consumption(&self, gpus: u32, tw_cpus: f64) -> f64 {
        let need = f64::from(gpus.max(1)) * self.tw_cpu_per_gpu;
        (tw_cpus / need).clamp(0.0, 1.0)
    }

    /// Busy fraction of the training worker's own CPUs (1 when it has no more than it needs).
    pub fn tw_busy(&self, gpus: u32, tw_cpus: f64, throughput: f64) -> f64 {
        if tw_cpus <= 0.0 {
            return 1.0;
        }
        let need = f64::from(gpus.max(1)) * self.tw_cpu_per_gpu * throughput.clamp(0.0, 1.0);
        (need / tw_cpus).clamp(0.0, 1.0)
    }

    /// Throughput fraction without Lode's data workers: the job holds `cpus` CPUs, keeps what
    /// its training worker needs and pre-processes with the rest (in its own process, or in
    /// local data-worker processes for the models that barely scale inside one).
    pub fn no_dw_throughput(&self, gpus: u32, cpus: f64) -> f64 {
        let g = f64::from(gpus.max(1));
        let own = g * self.tw_cpu_per_gpu;
        if cpus <= own {
            return 0.0;
        }
        let d = self.cpu_per_gpu();
        if d <= 0.0 {
            return 1.0;
        }
        let per_gpu = (cpus - own) / g;
        self.shape(per_gpu * self.local_efficiency() / d).min(1.0)
    }

    /// The CPU-GPU ratio a careful user would pick without data workers: the fewest whole CPUs
    /// per GPU reaching the ideal, or, when no ratio up to `max_ratio` does, the fewest
    /// reaching 98% of the best throughput there.
    pub fn best_no_dw_ratio(&self, max_ratio: u32) -> u32 {
        let at = |r: u32| self.no_dw_throughput(1, f64::from(r));
        if let Some(r) = (1..=max_ratio).find(|&r| at(r) >= 1.0 - 1e-9) {
            return r;
        }
        let best = (1..=max_ratio).map(at).fold(0.0, f64::max);
        (1..=max_ratio)
            .find(|&r| at(r) >= 0.98 * best)
            .unwrap_or(max_ratio)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 1's split (GoldMiner §5.1): six CPU-intensive models, four not.
    #[test]
    fn the_catalogue_is_table_1_split_at_the_production_ratio() {
        let heavy: Vec<&str> = CATALOGUE
            .iter()
            .filter(|m| m.is_cpu_intensive(CPU_INTENSIVE_RATIO))
            .map(|m| m.name)
            .collect();
        assert_eq!(
            heavy,
            [
                "din",
                "resnet18",
                "deepfm",
                "shufflenet_v2",
                "wdl",
                "alexnet"
            ]
        );
        assert_eq!(CATALOGUE.len(), 10);
    }

    /// Fig. 1: best-fit ratios up to 64 CPUs per GPU; at 8 CPUs per GPU only Bert fits, and
    /// the CPU-intensive models run more than 90% slower (step time at least 1.9x).
    #[test]
    fn best_fit_ratios_and_the_hardware_ratio_match_fig_1() {
        for m in CATALOGUE {
            let r = m.best_no_dw_ratio(64);
            assert!(
                (f64::from(r) - m.best_fit_ratio).abs() < 1.0 + 1e-9,
                "{}: {r}",
                m.name
            );
            let at_8 = m.no_dw_throughput(1, 8.0);
            assert_eq!(at_8 >= 1.0 - 1e-9, m.name == "bert", "{}: {at_8}", m.name);
            if m.is_cpu_intensive(CPU_INTENSIVE_RATIO) {
                assert!(1.0 / at_8 > 1.9, "{}: {at_8}", m.name);
            }
        }
        assert!(CATALOGUE.iter().any(|m| m.best_no_dw_ratio(64) == 64));
    }

    /// §5.1: at the CPUs linear scaling would need, data workers fall short of linear by 11%
    /// (DIN), 14% (ResNet18) and 17% (WDL), the largest gaps; the rest scale closer.
    #[test]
    fn data_workers_scale_within_the_gaps_of_section_5_1() {
        for m in CATALOGUE {
            // Workers at the knee (and one smaller) holding exactly the CPUs that linear
            // scaling needs for the ideal.
            let d = m.cpu_per_gpu();
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let full = (d / m.knee).floor() as usize;
            let rest = d - m.knee * (d / m.knee).floor();
            let workers = (0..full).map(|_| (m.knee, false)).chain([(rest, false)]);
            let p = m.dw_production(1, workers);
            let linear = 1.0;
            let gap = 1.0 - p / linear;
            let named = match m.name {
                "din" => Some(0.11),
                "resnet18" => Some(0.14),
                "wdl" => Some(0.17),
                _ => None,
            };
            match named {
                Some(g) => assert!((gap - g).abs() < 0.02, "{}: {gap:.3}", m.name),
                None => assert!(gap < 0.11, "{}: {gap:.3}", m.name),
            }
        }
    }

    /// §5.1: the recommendation models get nearly no speedup from more CPUs in one process,
    /// which is why the no-dw baselines run them in local data workers.
    #[test]
    fn recommendation_models_barely_scale_inside_one_process() {
        for m in CATALOGUE {
            let one_process = m.effective(16.0) / m.effective(1.0);
            assert_eq!(
                one_process < 2.0,
                m.local_data_workers,
                "{}: {one_process:.2}",
                m.name
            );
            assert_eq!(
                m.local_data_workers,
                matches!(m.name, "wdl" | "deepfm" | "din")
            );
        }
    }

    #[test]
    fn effective_is_linear_then_sublinear() {
        let m = model_by_name("alexnet").expect("in catalogue");
        assert_eq!(m.effective(2.0), 2.0);
        assert_eq!(m.effective(8.0), 8.0);
        assert!((m.effective(10.0) - 8.6).abs() < 1e-9);
    }

    #[test]
    fn production_is_monotone() {
        for m in CATALOGUE {
            let mut last = 0.0;
            for n in 1..80 {
                let p = m.dw_production(1, (0..n).map(|_| (2.0, false)));
                assert!(p >= last, "{}", m.name);
                last = p;
            }
        }
    }

    #[test]
    fn remote_workers_deliver_less() {
        let m = model_by_name("resnet50").expect("in catalogue");
        assert!(m.dw_production(1, [(4.0, true)]) < m.dw_production(1, [(4.0, false)]));
    }
}
