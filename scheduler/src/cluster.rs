//! Cluster specs: `[N x] G gpu C cpu [M gb]` groups joined by `+`.
//!
//! Examples: `8x8gpu64cpu` (the paper's cluster: 8 machines of 8 GPUs and 64 CPUs),
//! `8x8gpu64cpu512gb`, `4x8gpu96cpu+4x4gpu32cpu256gb`. Spaces and case are ignored. Memory
//! defaults to 8 GB per CPU.

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

    pub fn total_gpus(&self) -> u32 {
        self.machines.iter().map(|m| m.gpus).sum()
    }

    pub fn total_cpus(&self) -> u32 {
        self.machines.iter().map(|m| m.cpus).sum()
    }

    /// CPUs per GPU over the whole cluster (the hardware ratio).
    pub fn hardware_ratio(&self) -> f64 {
        f64::from(self.total_cpus()) / f64::from(self.total_gpus().max(1))
    }

    /// The largest GPU count of one machine.
    pub fn max_machine_gpus(&self) -> u32 {
        self.machines.iter().map(|m| m.gpus).max().unwrap_or(0)
    }
}

impl FromStr for ClusterSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<Self, Error> {
        let bad = |reason: &'static str| Error::ClusterSpec {
            spec: spec.to_owned(),
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
                        .map_err(|_| bad("machine count before 'x' is not a number"))?,
                    rest,
                ),
                None => (1, group),
            };
            let (gpus, rest) = number_before(rest, "gpu").ok_or_else(|| bad("expected <G>gpu"))?;
            let (cpus, rest) = number_before(rest, "cpu").ok_or_else(|| bad("expected <C>cpu"))?;
            let (mem_gb, rest) = match number_before(rest, "gb") {
                Some((m, rest)) => (f64::from(m), rest),
                None => (f64::from(cpus) * DEFAULT_GB_PER_CPU, rest),
            };
            if !rest.is_empty() {
                return Err(bad("unexpected text after the machine shape"));
            }
            if count == 0 || gpus == 0 || cpus == 0 {
                return Err(bad("machine count, GPUs and CPUs must be positive"));
            }
            if count > 10_000 {
                return Err(bad("more than 10000 machines in one group"));
            }
            machines.extend(std::iter::repeat_n(
                MachineSpec { gpus, cpus, mem_gb },
                count as usize,
            ));
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
