//! The simulator's ground truth: how fast a job trains given the CPUs it has.
//!
//! Throughput is expressed as a fraction `f` of the job's ideal throughput (the GPUs never wait
//! for data), so `f = 1` means `1 / step_secs` steps per second. The scheduler never reads these
//! curves; it only sees the throughput they produce (queue metrics), as a live scheduler would.
//!
//! Per model type:
//! - `cpu_per_gpu` (`d`): effective pre-processing CPUs needed per GPU for `f = 1`.
//! - A per-process curve: a process with `k` CPUs does the work of `min(k, knee) +
//!   beta * max(0, k - knee)` effective CPUs (the input pipeline's parallelism stops scaling
//!   linearly past `knee` threads).
//! - Optional `saturation` `S`: the production fraction `p` becomes `S * (1 - exp(-p / S))`, a
//!   pipeline that stops scaling with more workers (a shared source, a lock, network).
//! - `tw_cpu_per_gpu`: CPUs the training worker needs for itself (the training loop, its own
//!   ops); with fewer, it cannot consume at the ideal rate.
//! - `remote_efficiency`: a data worker on another machine than its training worker delivers
//!   this fraction of a local one (serialisation and network).
//! - `in_process_efficiency`: pre-processing inside the training worker (no data workers) scales
//!   linearly (tf.data's own thread pool, no per-process knee) but shares the process with
//!   training, so each CPU delivers this fraction of an effective CPU.

use serde::Serialize;

/// One model archetype with its own CPU appetite and data-worker scaling curve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelType {
    pub name: &'static str,
    /// Seconds per training step when the GPUs never wait for data.
    pub step_secs: f64,
    pub cpu_per_gpu: f64,
    pub knee: f64,
    pub beta: f64,
    pub saturation: Option<f64>,
    pub tw_cpu_per_gpu: f64,
    pub remote_efficiency: f64,
    pub in_process_efficiency: f64,
}

/// The built-in catalogue: four archetypes below the 8:1 hardware ratio, four above it.
/// Parameters are calibration choices (see scheduler/README.md), not measurements.
pub const CATALOGUE: &[ModelType] = &[
    ModelType {
        name: "bert",
        step_secs: 0.40,
        cpu_per_gpu: 1.5,
        knee: 4.0,
        beta: 0.3,
        saturation: None,
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.9,
        in_process_efficiency: 0.9,
    },
    ModelType {
        name: "speech",
        step_secs: 0.30,
        cpu_per_gpu: 3.0,
        knee: 4.0,
        beta: 0.3,
        saturation: None,
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.9,
        in_process_efficiency: 0.9,
    },
    ModelType {
        name: "resnet",
        step_secs: 0.25,
        cpu_per_gpu: 4.5,
        knee: 6.0,
        beta: 0.3,
        saturation: None,
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.9,
        in_process_efficiency: 0.9,
    },
    ModelType {
        name: "ctr",
        step_secs: 0.10,
        cpu_per_gpu: 6.0,
        knee: 2.0,
        beta: 0.4,
        saturation: None,
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.85,
        in_process_efficiency: 0.9,
    },
    ModelType {
        name: "resnet-aug",
        step_secs: 0.25,
        cpu_per_gpu: 11.0,
        knee: 8.0,
        beta: 0.3,
        saturation: Some(1.3),
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.9,
        in_process_efficiency: 0.9,
    },
    ModelType {
        name: "video",
        step_secs: 0.50,
        cpu_per_gpu: 12.0,
        knee: 4.0,
        beta: 0.3,
        saturation: Some(1.3),
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.9,
        in_process_efficiency: 0.9,
    },
    ModelType {
        name: "ctr-feature",
        step_secs: 0.10,
        cpu_per_gpu: 13.0,
        knee: 2.0,
        beta: 0.4,
        saturation: Some(1.3),
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.85,
        in_process_efficiency: 0.9,
    },
    ModelType {
        name: "detection",
        step_secs: 0.60,
        cpu_per_gpu: 15.0,
        knee: 6.0,
        beta: 0.3,
        saturation: Some(1.3),
        tw_cpu_per_gpu: 1.0,
        remote_efficiency: 0.9,
        in_process_efficiency: 0.9,
    },
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

    fn shape(&self, p: f64) -> f64 {
        match self.saturation {
            Some(s) if s > 0.0 => s * (1.0 - (-p / s).exp()),
            _ => p,
        }
    }

    /// Whether the job's best CPU-GPU ratio without data workers is above the hardware ratio
    /// (CPU-intensive).
    pub fn is_cpu_intensive(&self, hardware_ratio: f64) -> bool {
        f64::from(self.best_no_dw_ratio(64)) > hardware_ratio
    }

    /// Production fraction of data workers: each `(cpus, remote)` is one worker.
    pub fn dw_production(&self, gpus: u32, workers: impl IntoIterator<Item = (f64, bool)>) -> f64 {
        let demand = f64::from(gpus.max(1)) * self.cpu_per_gpu;
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

    /// Throughput fraction without data workers: the training worker holds `cpus` CPUs,
    /// keeps what it needs for itself and pre-processes with the rest.
    pub fn no_dw_throughput(&self, gpus: u32, cpus: f64) -> f64 {
        let g = f64::from(gpus.max(1));
        let own = g * self.tw_cpu_per_gpu;
        if cpus <= own {
            return 0.0;
        }
        let per_gpu = (cpus - own) / g;
        let p = self.shape(per_gpu * self.in_process_efficiency / self.cpu_per_gpu);
        p.min(1.0)
    }

    /// The CPU-GPU ratio a careful user would pick without data workers: the fewest CPUs per
    /// GPU reaching 98% of the best throughput reachable with up to `max_ratio` per GPU.
    pub fn best_no_dw_ratio(&self, max_ratio: u32) -> u32 {
        let best = (1..=max_ratio)
            .map(|r| self.no_dw_throughput(1, f64::from(r)))
            .fold(0.0, f64::max);
        (1..=max_ratio)
            .find(|&r| self.no_dw_throughput(1, f64::from(r)) >= 0.98 * best)
            .unwrap_or(max_ratio)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_the_catalogue_is_cpu_intensive_at_8_to_1() {
        let n = CATALOGUE.iter().filter(|m| m.is_cpu_intensive(8.0)).count();
        assert_eq!(n * 2, CATALOGUE.len());
    }

    #[test]
    fn effective_is_linear_then_sublinear() {
        let m = model_by_name("video").expect("in catalogue");
        assert_eq!(m.effective(2.0), 2.0);
        assert_eq!(m.effective(4.0), 4.0);
        assert!((m.effective(6.0) - 4.6).abs() < 1e-9);
    }

    #[test]
    fn production_saturates_and_is_monotone() {
        for m in CATALOGUE {
            let mut last = 0.0;
            for n in 1..40 {
                let p = m.dw_production(1, (0..n).map(|_| (2.0, false)));
                assert!(p >= last, "{}", m.name);
                last = p;
            }
        }
    }

    #[test]
    fn remote_workers_deliver_less() {
        let m = model_by_name("resnet").expect("in catalogue");
        assert!(m.dw_production(1, [(4.0, true)]) < m.dw_production(1, [(4.0, false)]));
    }

    #[test]
    fn best_ratio_is_below_the_cap_for_light_models() {
        let m = model_by_name("bert").expect("in catalogue");
        assert!(m.best_no_dw_ratio(64) <= 4);
        let heavy = model_by_name("video").expect("in catalogue");
        assert!(heavy.best_no_dw_ratio(64) > 8);
    }
}
