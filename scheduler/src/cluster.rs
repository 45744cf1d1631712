//! Cluster specs: `[N x] G gpu C cpu [M gb]` groups joined by `+`.
//!
//! Examples: `8x8gpu64cpu` (the paper's cluster: 8 machines of 8 GPUs and 64 CPUs),
//! `8x8gpu64cpu512gb`, `4x8gpu96cpu+4x4gpu32cpu256gb`, `8x8gpu64cpu+4x0gpu64cpu` (four CPU-only
//! machines: data-worker capacity, as the paper's "pure CPU machines with 64 vCPUs"). Spaces
//! and case are ignored. Memory defaults to 8 GB per CPU. A group may have 0 GPUs but not 0
//! machines or 0 CPUs, and at least one machine must have GPUs.

use std::str::FromStr;

use serde::Serialize;

use crate::Error;

/// Memory per CPU when a spec leaves it out.
pub const DEFAULT_GB_PER_CPU: f64 = 8.0;

/// One machine's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MachineSpec {
    pub gpus: u32,
    pub cpus: u32,
    pub mem_gb: f64,
}

impl MachineSpec {
    /// No GPUs: only data workers run here.
    pub fn is_cpu_only(&self) -> bool {
        self.gpus == 0
    }
}

/// The machines of a cluster, in spec order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterSpec {
    pub machines: Vec<MachineSpec>,
}

impl ClusterSpec {
    /// The paper's §5.6 cluster: 8 machines × (8 GPUs, 64 CPUs).
    pub fn paper() -> Self {
        Self {
            machines: vec![
                MachineSpec {
                    gpus: 8,
                    cpus: 64,
                    mem_gb: 64.0 * DEFAULT_GB_PER_CPU,
                };
                8
            ],
        }
    }

    /// The machines that can hold training workers (those with GPUs).
    pub fn gpu_machines(&self) -> impl Iterator<Item = &MachineSpec> {
        self.machines.iter().filter(|m| !m.is_cpu_only())
    }

    pub fn total_gpus(&self) -> u32 {
        self.machines.iter().map(|m| m.gpus).sum()
    }

    pub fn total_cpus(&self) -> u32 {
        self.machines.iter().map(|m| m.cpus).sum()
    }

    /// CPUs per GPU over the machines with GPUs (the hardware ratio): what a training worker
    /// finds beside its GPUs. CPU-only machines are left out, because no training worker runs
    /// there; without data workers their CPUs serve no job.
    pub fn hardware_ratio(&self) -> f64 {
        let cpus: u32 = self.gpu_machines().map(|m| m.cpus).sum();
        f64::from(cpus) / f64::from(self.total_gpus().max(1))
    }

    /// The largest GPU count of one machine.
    pub fn max_machine_gpus(&self) -> u32 {
        self.machines.iter().map(|m| m.gpus).max().unwrap_or(0)
    }

    /// The largest CPU count of one machine with GPUs (the most a training worker's part can
    /// hold).
    pub fn max_gpu_machine_cpus(&self) -> u32 {
        self.gpu_machines().map(|m| m.cpus).max().unwrap_or(0)
    }
}

impl FromStr for ClusterSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<Self, Error> {
        let bad = |group: &str, reason: &'static str| Error::ClusterSpec {
            spec: spec.to_owned(),
            group: group.to_owned(),
            reason,
        };
        let cleaned: String = spec
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_lowercase();
        let mut machines = Vec::new();
        for group in cleaned.split('+') {
            let (count, rest) = match group.split_once('x') {
                Some((n, rest)) => (
                    n.parse::<u32>()
                        .map_err(|_| bad(group, "machine count before 'x' is not a number"))?,
                    rest,
                ),
                None => (1, group),
            };
            let (gpus, rest) =
                number_before(rest, "gpu").ok_or_else(|| bad(group, "expected <G>gpu"))?;
            let (cpus, rest) =
                number_before(rest, "cpu").ok_or_else(|| bad(group, "expected <C>cpu"))?;
            let (mem_gb, rest) = match number_before(rest, "gb") {
                Some((m, rest)) => (f64::from(m), rest),
                None => (f64::from(cpus) * DEFAULT_GB_PER_CPU, rest),
            };
            if !rest.is_empty() {
                return Err(bad(group, "unexpected text after the machine shape"));
            }
            if count == 0 {
                return Err(bad(group, "the machine count must be positive"));
            }
            // 0 GPUs is a CPU-only machine; a machine without CPUs can run nothing.
            if cpus == 0 {
                return Err(bad(group, "CPUs must be positive"));
            }
            if count > 10_000 {
                return Err(bad(group, "more than 10000 machines in one group"));
            }
            machines.extend(std::iter::repeat_n(
                MachineSpec { gpus, cpus, mem_gb },
                count as usize,
            ));
        }
        if machines.iter().all(MachineSpec::is_cpu_only) {
            return Err(bad(&cleaned, "no machine has GPUs, so no job could train"));
        }
        Ok(Self { machines })
    }
}

/// Splits `"64cpu..."` into `(64, "...")` for the unit `cpu`.
fn number_before<'a>(s: &'a str, unit: &str) -> Option<(u32, &'a str)> {
    let digits = s.chars().take_while(char::is_ascii_digit).count();
    let (n, rest) = s.split_at(digits);
    let rest = rest.strip_prefix(unit)?;
    Some((n.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_paper_cluster() {
        let c: ClusterSpec = "8x8gpu64cpu".parse().expect("valid");
        assert_eq!(c, ClusterSpec::paper());
        assert_eq!(c.total_gpus(), 64);
        assert_eq!(c.hardware_ratio(), 8.0);
    }

    #[test]
    fn parses_groups_and_memory() {
        let c: ClusterSpec = " 2x8GPU96cpu + 4gpu32cpu256gb".parse().expect("valid");
        assert_eq!(c.machines.len(), 3);
        assert_eq!(c.machines[0].mem_gb, 768.0);
        assert_eq!(c.machines[2].gpus, 4);
        assert_eq!(c.machines[2].mem_gb, 256.0);
    }

    #[test]
    fn cpu_only_machines_are_data_worker_capacity() {
        let c: ClusterSpec = "8x8gpu64cpu+4x0gpu64cpu".parse().expect("valid");
        assert_eq!(c.machines.len(), 12);
        assert_eq!(c.machines.iter().filter(|m| m.is_cpu_only()).count(), 4);
        assert_eq!(c.total_gpus(), 64);
        assert_eq!(c.total_cpus(), 768);
        // The hardware ratio is what a training worker finds beside its GPUs.
        assert_eq!(c.hardware_ratio(), 8.0);
        assert_eq!(c.max_gpu_machine_cpus(), 64);
        assert_eq!(c.machines[11].mem_gb, 512.0);
    }

    #[test]
    fn zero_machines_or_cpus_are_refused_naming_the_group_and_the_part() {
        let message = |spec: &str| spec.parse::<ClusterSpec>().expect_err(spec).to_string();
        let m = message("8x8gpu64cpu+0x0gpu64cpu");
        assert!(
            m.contains("\"0x0gpu64cpu\"") && m.contains("machine count"),
            "{m}"
        );
        let m = message("8x8gpu64cpu+2x0gpu0cpu");
        assert!(
            m.contains("\"2x0gpu0cpu\"") && m.contains("CPUs must be positive"),
            "{m}"
        );
        let m = message("4x0gpu64cpu");
        assert!(m.contains("no machine has GPUs"), "{m}");
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "8x",
            "8x8gpu",
            "8x8gpu64",
            "0x8gpu64cpu",
            "8x8gpu64cpuzz",
            "ax8gpu64cpu",
        ] {
            assert!(bad.parse::<ClusterSpec>().is_err(), "{bad:?}");
        }
    }
}
