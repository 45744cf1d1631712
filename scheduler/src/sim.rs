//! A discrete-event simulator of a GPU cluster running a job trace under one scheduler.
//!
//! Between events every job trains at a constant rate, so the simulator jumps from event to
//! event: arrivals, completions, the end of a job's profiling, and (for Lode's policies) the
//! scheduling interval. At each event it admits jobs FIFO (strictly: the head of the queue
//! blocks the rest), packing each onto the fullest machine that fits, then lets the scheduler
//! act and recomputes every job's rate from the ground-truth model ([`crate::model`]).
//!
//! Schedulers:
//! - `no-dw-tuned`: no data workers; each job asks for its best CPU-GPU ratio, all on its own
//!   machine(s).
//! - `no-dw-hw`: no data workers; each job gets the hardware CPU-GPU ratio.
//! - `fixed-dw`: data workers of one hand-tuned size (`fixed_dw_cpus`) for every job, as many
//!   as the job's profiled demand asks for, started as CPUs allow and never resized or moved.
//! - Lode (`maxtp`, `srtf`, `fair`): each job is tuned by [`TunerState`] (its observations come
//!   from the model, with noise); the cluster's data workers are allocated by
//!   [`crate::policy::decide`] through the [`Backend`] trait at every event and interval. Data
//!   workers are preemptible: a training worker being admitted may evict them.

use std::collections::{BTreeMap, VecDeque};
use std::str::FromStr;

use serde::Serialize;

use crate::backend::{self, Backend};
use crate::cluster::{ClusterSpec, MachineSpec};
use crate::ids::{JobId, MachineId};
use crate::model::{ModelType, CPU_INTENSIVE_RATIO};
use crate::policy::{DecideConfig, Decision, Feedback, JobView, MachineView, Policy, Snapshot};
use crate::rng::SplitMix64;
use crate::trace::{Trace, TraceJob};
use crate::tuner::{JobConfig, Observation, TunerConfig, TunerEvent, TunerState};
use crate::Error;

/// The schedulers of the paper's cluster experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum SchedulerKind {
    NoDwTuned,
    NoDwHw,
    FixedDw,
    Lode(Policy),
}

impl SchedulerKind {
    /// In the order of the paper's Table 5.
    pub const ALL: [SchedulerKind; 6] = [
        SchedulerKind::NoDwTuned,
        SchedulerKind::NoDwHw,
        SchedulerKind::FixedDw,
        SchedulerKind::Lode(Policy::Fair),
        SchedulerKind::Lode(Policy::MaxTp),
        SchedulerKind::Lode(Policy::Srtf),
    ];

    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::NoDwTuned => "no-dw-tuned",
            SchedulerKind::NoDwHw => "no-dw-hw",
            SchedulerKind::FixedDw => "fixed-dw",
            SchedulerKind::Lode(p) => p.name(),
        }
    }
}

impl FromStr for SchedulerKind {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| Error::UnknownScheduler {
                name: name.to_owned(),
            })
    }
}

/// Settings of one simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub cluster: ClusterSpec,
    /// Lode's scheduling interval in seconds (it also acts at every arrival and completion).
    pub tick_s: f64,
    /// The size of every data worker under `fixed-dw`.
    pub fixed_dw_cpus: u32,
    pub tuner: TunerConfig,
    pub decide: DecideConfig,
    /// Seconds per tuner observation; a job trains only after its profiling.
    pub probe_s: f64,
    /// Relative noise (uniform, ±) on the tuner's observations.
    pub noise: f64,
    /// Seeds the observation noise.
    pub seed: u64,
    /// Host memory of a training worker per GPU.
    pub tw_mem_gb_per_gpu: f64,
    /// Host memory of a data worker per CPU.
    pub dw_mem_gb_per_cpu: f64,
    /// Whether the cluster level first brings every decoupled job to the baseline its tuner
    /// measured (`JobView::floor_throughput`) before the policy's metric orders the rest.
    /// Off reproduces the allocation by metric alone (scheduler/README.md, "Floors").
    pub floors: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            cluster: ClusterSpec::paper(),
            tick_s: 60.0,
            fixed_dw_cpus: 4,
            tuner: TunerConfig::default(),
            decide: DecideConfig::default(),
            probe_s: 10.0,
            noise: 0.03,
            seed: 1,
            tw_mem_gb_per_gpu: 24.0,
            dw_mem_gb_per_cpu: 2.0,
            floors: true,
        }
    }
}

/// One job's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobResult {
    pub job: JobId,
    pub model: &'static str,
    pub gpus: u32,
    pub cpu_intensive: bool,
    pub arrival_s: f64,
    pub start_s: f64,
    pub finish_s: f64,
    pub queue_s: f64,
    pub jct_s: f64,
    /// Run time at the ideal throughput (never starved of data).
    pub ideal_s: f64,
    pub data_workers: bool,
}

/// Cluster utilisation after one event.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UtilSample {
    pub t_s: f64,
    /// GPUs doing useful work (allocated GPUs times their job's throughput fraction) over all.
    pub gpu_busy: f64,
    /// GPUs allocated over all.
    pub gpu_alloc: f64,
    /// CPUs allocated (training workers and data workers) over all.
    pub cpu_alloc: f64,
}

/// The most one machine held at once, over the run (after every event).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct MachinePeak {
    /// GPUs held by training workers.
    pub gpus: u32,
    /// CPUs held by training workers.
    pub tw_cpus: u32,
    /// CPUs held by data workers.
    pub dw_cpus: u32,
    /// CPUs held by both together.
    pub cpus: u32,
}

/// The outcome of simulating one scheduler.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    pub scheduler: &'static str,
    pub jobs: Vec<JobResult>,
    pub timeline: Vec<UtilSample>,
    /// Per machine, in the cluster spec's order.
    pub peaks: Vec<MachinePeak>,
    pub events: u64,
}

impl SimResult {
    pub fn avg_jct_min(&self) -> f64 {
        mean(self.jobs.iter().map(|j| j.jct_s)) / 60.0
    }

    pub fn avg_queue_min(&self) -> f64 {
        mean(self.jobs.iter().map(|j| j.queue_s)) / 60.0
    }

    pub fn makespan_s(&self) -> f64 {
        self.jobs.iter().map(|j| j.finish_s).fold(0.0, f64::max)
    }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / f64::from(n)
    }
}

#[derive(Debug, Clone)]
struct Machine {
    spec: MachineSpec,
    gpus: u32,
    tw_cpus: u32,
    dw_cpus: u32,
    tw_mem: f64,
    dw_mem: f64,
}

impl Machine {
    fn free_cpus(&self, preempt_dw: bool) -> u32 {
        let used = self.tw_cpus + if preempt_dw { 0 } else { self.dw_cpus };
        self.spec.cpus.saturating_sub(used)
    }

    fn free_mem(&self, preempt_dw: bool) -> f64 {
        self.spec.mem_gb - self.tw_mem - if preempt_dw { 0.0 } else { self.dw_mem }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Mode {
    NoDw,
    Dw {
        size: u32,
        /// Machine index of each data worker.
        workers: Vec<usize>,
        /// Workers `fixed-dw` wants; unused by Lode.
        fixed_target: u32,
    },
}

#[derive(Debug, Clone)]
struct Running {
    job: usize,
    /// (machine index, GPUs, CPUs, memory) of each part of the training worker.
    tw: Vec<(usize, u32, u32, f64)>,
    mode: Mode,
    remaining: f64,
    frac: f64,
    start_s: f64,
    train_from_s: f64,
    feedback: Feedback,
    /// Steps/s the job is owed by the cluster allocation (see [`JobView::floor_throughput`]).
    floor: f64,
}

impl Running {
    fn tw_cpus(&self) -> u32 {
        self.tw.iter().map(|p| p.2).sum()
    }

    fn on_tw_machine(&self, m: usize) -> bool {
        self.tw.iter().any(|p| p.0 == m)
    }
}

/// What Lode's tuner concluded for one job.
#[derive(Debug, Clone)]
struct Tuned {
    config: JobConfig,
    /// Production of one data worker, steps/s.
    dw_rate: f64,
    probes: u32,
    /// Steps trained while profiling (the job trains on each probe's configuration).
    profiled_steps: f64,
    /// Steps/s the tuner measured without data workers, on the CPUs the job started with.
    baseline: f64,
}

/// The simulated cluster: machines and running jobs. Lode's policies reach it only through
/// [`Backend`].
#[derive(Debug)]
struct SimCluster<'a> {
    config: &'a SimConfig,
    trace: &'a Trace,
    machines: Vec<Machine>,
    running: Vec<Running>,
    now: f64,
}

impl SimCluster<'_> {
    fn job(&self, r: &Running) -> &TraceJob {
        &self.trace.jobs[r.job]
    }

    fn machine_id(i: usize) -> MachineId {
        MachineId(u32::try_from(i).unwrap_or(u32::MAX))
    }

    /// Chooses machines for a training worker of `gpus` GPUs: parts of at most one machine's
    /// GPUs, each on the fullest machine that fits. `cpus_for(part_gpus, spec)` is the part's
    /// CPUs. With `preempt_dw`, data workers' CPUs and memory count as free.
    fn plan(
        &self,
        gpus: u32,
        cpus_for: &dyn Fn(u32, &MachineSpec) -> u32,
        preempt_dw: bool,
    ) -> Option<Vec<(usize, u32, u32, f64)>> {
        let per_machine = self.config.cluster.max_machine_gpus().max(1);
        let mut left = gpus;
        let mut parts = Vec::new();
        while left > 0 {
            let part = left.min(per_machine);
            let mut best: Option<((u32, u32, usize), usize)> = None;
            for (i, m) in self.machines.iter().enumerate() {
                if parts.iter().any(|p: &(usize, u32, u32, f64)| p.0 == i) {
                    continue;
                }
                let cpus = cpus_for(part, &m.spec);
                let mem = self.config.tw_mem_gb_per_gpu * f64::from(part);
                let fits = m.spec.gpus - m.gpus >= part
                    && m.free_cpus(preempt_dw) >= cpus
                    && m.free_mem(preempt_dw) >= mem;
                if !fits {
                    continue;
                }
                // Fullest first: most GPUs in use, then most CPUs in use, then lowest index.
                let key = (u32::MAX - m.gpus, u32::MAX - (m.tw_cpus + m.dw_cpus), i);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, i));
                }
            }
            let (_, i) = best?;
            let spec = &self.machines[i].spec;
            parts.push((
                i,
                part,
                cpus_for(part, spec),
                self.config.tw_mem_gb_per_gpu * f64::from(part),
            ));
            left -= part;
        }
        Some(parts)
    }

    fn take_tw(&mut self, parts: &[(usize, u32, u32, f64)]) {
        for &(i, g, c, mem) in parts {
            let m = &mut self.machines[i];
            m.gpus += g;
            m.tw_cpus += c;
            m.tw_mem += mem;
        }
    }

    fn dw_mem(&self, size: u32) -> f64 {
        self.config.dw_mem_gb_per_cpu * f64::from(size)
    }

    fn add_worker(&mut self, r: usize, machine: usize) -> bool {
        let Mode::Dw { size, .. } = self.running[r].mode else {
            return false;
        };
        let mem = self.dw_mem(size);
        let m = &mut self.machines[machine];
        if m.free_cpus(false) < size || m.free_mem(false) < mem {
            return false;
        }
        m.dw_cpus += size;
        m.dw_mem += mem;
        if let Mode::Dw { workers, .. } = &mut self.running[r].mode {
            workers.push(machine);
        }
        true
    }

    fn remove_worker(&mut self, r: usize, machine: usize) -> bool {
        let Mode::Dw { size, workers, .. } = &mut self.running[r].mode else {
            return false;
        };
        let Some(pos) = workers.iter().rposition(|&w| w == machine) else {
            return false;
        };
        workers.swap_remove(pos);
        let size = *size;
        let mem = self.dw_mem(size);
        let m = &mut self.machines[machine];
        m.dw_cpus -= size;
        m.dw_mem -= mem;
        true
    }

    /// Evicts data workers from machine `i` until `cpus` CPUs and `mem` GB are free.
    fn evict_for(&mut self, i: usize, cpus: u32, mem: f64) {
        while self.machines[i].free_cpus(false) < cpus || self.machines[i].free_mem(false) < mem {
            // The job with the most workers there gives one up.
            let victim = (0..self.running.len())
                .filter_map(|r| match &self.running[r].mode {
                    Mode::Dw { workers, .. } => {
                        let n = workers.iter().filter(|&&w| w == i).count();
                        (n > 0).then_some((n, r))
                    }
                    Mode::NoDw => None,
                })
                .max();
            match victim {
                Some((_, r)) => {
                    self.remove_worker(r, i);
                }
                None => break,
            }
        }
    }

    /// Recomputes every job's throughput fraction from the model.
    fn refresh_rates(&mut self) {
        for r in 0..self.running.len() {
            let run = &self.running[r];
            let job = &self.trace.jobs[run.job];
            let model = job.model;
            let frac = match &run.mode {
                Mode::NoDw => run
                    .tw
                    .iter()
                    .map(|&(_, g, c, _)| model.no_dw_throughput(g, f64::from(c)))
                    .fold(1.0, f64::min),
                Mode::Dw { size, workers, .. } => {
                    let prod = model.dw_production(
                        job.gpus,
                        workers
                            .iter()
                            .map(|&w| (f64::from(*size), !run.on_tw_machine(w))),
                    );
                    prod.min(model.tw_consumption(job.gpus, f64::from(run.tw_cpus())))
                }
            };
            self.running[r].frac = frac;
        }
    }

    fn rate(&self, r: &Running) -> f64 {
        r.frac / self.job(r).model.step_secs
    }

    /// Gives back everything a job holds: its training worker's parts and its data workers.
    fn release(&mut self, run: &Running) {
        for &(i, g, c, mem) in &run.tw {
            let m = &mut self.machines[i];
            m.gpus -= g;
            m.tw_cpus -= c;
            m.tw_mem -= mem;
        }
        if let Mode::Dw { size, workers, .. } = &run.mode {
            let mem = self.dw_mem(*size);
            for &w in workers {
                let m = &mut self.machines[w];
                m.dw_cpus -= size;
                m.dw_mem -= mem;
            }
        }
    }

    /// `fixed-dw`: starts missing workers one at a time, each to the job furthest below its
    /// fixed count (oldest first on ties), until none fits.
    fn fill_fixed(&mut self) {
        loop {
            let mut best: Option<((f64, f64, usize), usize)> = None;
            for (r, run) in self.running.iter().enumerate() {
                if let Mode::Dw {
                    workers,
                    fixed_target,
                    ..
                } = &run.mode
                {
                    if workers.len() < *fixed_target as usize {
                        #[allow(clippy::cast_precision_loss)]
                        let share = workers.len() as f64 / f64::from(*fixed_target);
                        let key = (share, run.start_s, run.job);
                        if best.as_ref().is_none_or(|(k, _)| {
                            key.0 < k.0 || (key.0 == k.0 && (key.1, key.2) < (k.1, k.2))
                        }) {
                            best = Some((key, r));
                        }
                    }
                }
            }
            let Some((_, r)) = best else { return };
            let Mode::Dw { size, .. } = self.running[r].mode else {
                return;
            };
            let Some(i) = self.place_fixed(r, size) else {
                return;
            };
            if !self.add_worker(r, i) {
                return;
            }
        }
    }

    /// The same placement preferences as Lode's, for one fixed worker.
    fn place_fixed(&self, r: usize, size: u32) -> Option<usize> {
        let mem = self.dw_mem(size);
        let mut distributed = vec![0u32; self.machines.len()];
        let mut remote = vec![0u32; self.machines.len()];
        for run in &self.running {
            if run.tw.len() > 1 {
                for p in &run.tw {
                    distributed[p.0] += 1;
                }
            }
            if let Mode::Dw { workers, .. } = &run.mode {
                for &w in workers {
                    if !run.on_tw_machine(w) {
                        remote[w] += 1;
                    }
                }
            }
        }
        (0..self.machines.len())
            .filter(|&i| {
                self.machines[i].free_cpus(false) >= size && self.machines[i].free_mem(false) >= mem
            })
            .min_by_key(|&i| {
                (
                    !self.running[r].on_tw_machine(i),
                    distributed[i],
                    remote[i],
                    i,
                )
            })
    }

    /// Raises each machine's peak to what it holds now.
    fn record_peaks(&self, peaks: &mut [MachinePeak]) {
        for (p, m) in peaks.iter_mut().zip(&self.machines) {
            p.gpus = p.gpus.max(m.gpus);
            p.tw_cpus = p.tw_cpus.max(m.tw_cpus);
            p.dw_cpus = p.dw_cpus.max(m.dw_cpus);
            p.cpus = p.cpus.max(m.tw_cpus + m.dw_cpus);
        }
    }

    fn sample(&self) -> UtilSample {
        let gpus = f64::from(self.config.cluster.total_gpus().max(1));
        let cpus = f64::from(self.config.cluster.total_cpus().max(1));
        let busy: f64 = self
            .running
            .iter()
            .filter(|r| self.now >= r.train_from_s)
            .map(|r| f64::from(self.job(r).gpus) * r.frac)
            .sum();
        UtilSample {
            t_s: self.now,
            gpu_busy: busy / gpus,
            gpu_alloc: f64::from(self.machines.iter().map(|m| m.gpus).sum::<u32>()) / gpus,
            cpu_alloc: f64::from(
                self.machines
                    .iter()
                    .map(|m| m.tw_cpus + m.dw_cpus)
                    .sum::<u32>(),
            ) / cpus,
        }
    }
}

impl Backend for SimCluster<'_> {
    type Error = Error;

    fn name(&self) -> &'static str {
        "simulator"
    }

    fn snapshot(&mut self) -> Result<Snapshot, Error> {
        let machines = self
            .machines
            .iter()
            .enumerate()
            .map(|(i, m)| MachineView {
                id: Self::machine_id(i),
                dw_cpus: m.spec.cpus.saturating_sub(m.tw_cpus),
                dw_mem_gb: m.spec.mem_gb - m.tw_mem,
                cpu_only: m.spec.is_cpu_only(),
            })
            .collect();
        let mut jobs = Vec::new();
        for r in 0..self.running.len() {
            let now = self.now;
            let rate = self.rate(&self.running[r]);
            let run = &mut self.running[r];
            let Mode::Dw { size, workers, .. } = &run.mode else {
                continue;
            };
            if now < run.train_from_s {
                continue;
            }
            let job = &self.trace.jobs[run.job];
            let mut data_workers = BTreeMap::new();
            for &w in workers {
                *data_workers.entry(Self::machine_id(w)).or_insert(0) += 1;
            }
            let count = u32::try_from(workers.len()).unwrap_or(u32::MAX);
            let gain = run.feedback.observe(count, rate);
            let ideal = 1.0 / job.model.step_secs;
            let tw_cpus = run.tw.iter().map(|p| p.2).sum::<u32>();
            jobs.push(JobView {
                id: job.id,
                gpus: job.gpus,
                remaining_steps: run.remaining,
                tw_machines: run.tw.iter().map(|p| Self::machine_id(p.0)).collect(),
                tw_cpus,
                dw_cpus: *size,
                dw_mem_gb: self.config.dw_mem_gb_per_cpu * f64::from(*size),
                data_workers,
                throughput: rate,
                baseline_throughput: 0.0,
                ideal_throughput: ideal,
                consumption: job.model.tw_consumption(job.gpus, f64::from(tw_cpus)) * ideal,
                gain_per_dw: gain,
                floor_throughput: run.floor,
            });
        }
        Ok(Snapshot { machines, jobs })
    }

    fn apply(&mut self, decisions: &[Decision]) -> Result<(), Error> {
        let index: BTreeMap<JobId, usize> = self
            .running
            .iter()
            .enumerate()
            .map(|(r, run)| (self.trace.jobs[run.job].id, r))
            .collect();
        let machine = |m: MachineId| usize::try_from(m.0).ok();
        // Stop workers first so that their CPUs are free for the starts.
        let mut starts = Vec::new();
        for d in decisions {
            match *d {
                Decision::Remove { job, machine: m } => {
                    if let (Some(&r), Some(i)) = (index.get(&job), machine(m)) {
                        self.remove_worker(r, i);
                    }
                }
                Decision::Migrate { job, from, to } => {
                    if let (Some(&r), Some(i)) = (index.get(&job), machine(from)) {
                        if self.remove_worker(r, i) {
                            starts.push((r, to));
                        }
                    }
                }
                Decision::Add {
                    job, machine: m, ..
                } => {
                    if let Some(&r) = index.get(&job) {
                        starts.push((r, m));
                    }
                }
            }
        }
        for (r, m) in starts {
            if let Some(i) = machine(m).filter(|&i| i < self.machines.len()) {
                self.add_worker(r, i);
            }
        }
        Ok(())
    }
}

/// Profiles a job with the tuner against the model: what Lode's job-level tuning would
/// conclude, and how many observations it took.
fn tune(job: &TraceJob, config: &SimConfig, rng: &mut SplitMix64) -> Result<Tuned, Error> {
    let model: &ModelType = job.model;
    let g = job.gpus;
    let ideal = 1.0 / model.step_secs;
    let hw = config.cluster.hardware_ratio();
    // The default allocation before tuning: the hardware ratio.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let baseline_cpus = (f64::from(g) * hw).floor().max(1.0) as u32;
    let mut tuner = TunerState::new(config.tuner, 1, baseline_cpus)?;
    let mut now = 0.0;
    let mut probes = 0u32;
    let mut profiled_steps = 0.0;
    let mut baseline = 0.0;
    while !tuner.is_settled() && probes < 1_000 {
        let c = tuner.desired().clone();
        let mut jitter = |v: f64| (v * (1.0 + config.noise * rng.uniform(-1.0, 1.0))).max(0.0);
        let tw = f64::from(c.tw_cpus);
        let obs = if c.use_data_workers {
            let stage = c.stages[0];
            let one = model.dw_production(g, [(f64::from(stage.dw_cpus), false)]) * ideal;
            let all = model.dw_production(
                g,
                (0..stage.dw_count).map(|_| (f64::from(stage.dw_cpus), false)),
            ) * ideal;
            let cons = model.tw_consumption(g, tw) * ideal;
            let thr = all.min(cons);
            profiled_steps += thr * config.probe_s;
            Observation {
                stage_production: vec![jitter(one)],
                consumption: jitter(cons),
                throughput: jitter(thr),
                tw_cpu_busy: model.tw_busy(g, tw, thr / ideal),
                data_workers: stage.dw_count,
            }
        } else {
            profiled_steps += model.no_dw_throughput(g, tw) * ideal * config.probe_s;
            Observation {
                stage_production: vec![0.0],
                consumption: jitter(model.tw_consumption(g, tw) * ideal),
                throughput: jitter(model.no_dw_throughput(g, tw) * ideal),
                tw_cpu_busy: 1.0,
                data_workers: 0,
            }
        };
        now += config.probe_s;
        probes += 1;
        for event in tuner.apply(&obs, now)? {
            if let TunerEvent::Baseline { throughput } = event {
                baseline = throughput;
            }
        }
    }
    Ok(Tuned {
        config: tuner.desired().clone(),
        dw_rate: tuner.stage_rates()[0],
        probes,
        profiled_steps,
        baseline,
    })
}

/// Simulates `trace` on `config.cluster` under `kind`.
pub fn simulate(
    trace: &Trace,
    kind: SchedulerKind,
    config: &SimConfig,
) -> Result<SimResult, Error> {
    let machines: Vec<Machine> = config
        .cluster
        .machines
        .iter()
        .map(|spec| Machine {
            spec: *spec,
            gpus: 0,
            tw_cpus: 0,
            dw_cpus: 0,
            tw_mem: 0.0,
            dw_mem: 0.0,
        })
        .collect();
    let mut sim = SimCluster {
        config,
        trace,
        machines,
        running: Vec::new(),
        now: 0.0,
    };
    let hw = config.cluster.hardware_ratio();
    // What one machine can give a training worker; CPU-only machines hold none.
    let max_cpus = config.cluster.max_gpu_machine_cpus().max(1);
    let mut rng = SplitMix64::new(config.seed);

    // How each job asks for its training worker, decided up front (tuning has no side effects).
    let mut asks = Vec::with_capacity(trace.jobs.len());
    for job in &trace.jobs {
        let ask = match kind {
            SchedulerKind::NoDwTuned => Ask::NoDw {
                per_gpu: job.model.best_no_dw_ratio(max_cpus),
            },
            SchedulerKind::NoDwHw => Ask::NoDw {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                per_gpu: hw.floor().max(1.0) as u32,
            },
            SchedulerKind::FixedDw => {
                let size = config.fixed_dw_cpus.max(1);
                // Hand-tuned to the job's profiled best CPU-GPU ratio, in data-worker CPUs.
                let best = f64::from(job.model.best_no_dw_ratio(max_cpus));
                let demand = f64::from(job.gpus)
                    * (best - job.model.tw_cpu_per_gpu).max(1.0)
                    * job.model.local_efficiency();
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let count = (demand / f64::from(size)).ceil().max(1.0) as u32;
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let tw = (f64::from(job.gpus) * job.model.tw_cpu_per_gpu).ceil() as u32;
                Ask::Dw {
                    tw_cpus: tw,
                    job_gpus: job.gpus,
                    size,
                    fixed_target: count,
                    dw_rate: 0.0,
                    probes: 0,
                    profiled_steps: 0.0,
                    floor: 0.0,
                }
            }
            SchedulerKind::Lode(_) => {
                let tuned = tune(job, config, &mut rng)?;
                if tuned.config.use_data_workers {
                    Ask::Dw {
                        tw_cpus: tuned.config.tw_cpus,
                        job_gpus: job.gpus,
                        size: tuned.config.stages[0].dw_cpus.max(1),
                        fixed_target: 0,
                        dw_rate: tuned.dw_rate,
                        probes: tuned.probes,
                        profiled_steps: tuned.profiled_steps,
                        floor: if config.floors { tuned.baseline } else { 0.0 },
                    }
                } else {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let per_gpu = hw.floor().max(1.0) as u32;
                    Ask::NoDw { per_gpu }
                }
            }
        };
        // A job that cannot fit even an empty cluster would block the queue forever.
        if sim.plan(job.gpus, &|g, s| ask.cpus(g, s), false).is_none() {
            return Err(Error::JobTooLarge {
                job: job.id,
                gpus: job.gpus,
            });
        }
        asks.push(ask);
    }

    let lode = match kind {
        SchedulerKind::Lode(p) => Some(p),
        _ => None,
    };
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut next_arrival = 0usize;
    let mut results = Vec::with_capacity(trace.jobs.len());
    let mut timeline = Vec::new();
    let mut peaks = vec![MachinePeak::default(); sim.machines.len()];
    let mut events = 0u64;
    let mut next_tick = config.tick_s;
    // Whether Lode's last round decided nothing.
    let mut quiet = false;
    loop {
        // The next event.
        let mut next = f64::INFINITY;
        if let Some(job) = trace.jobs.get(next_arrival) {
            next = next.min(job.arrival_s);
        }
        for r in &sim.running {
            if r.train_from_s > sim.now {
                next = next.min(r.train_from_s);
            } else if r.frac > 0.0 {
                next = next.min(sim.now + r.remaining / sim.rate(r));
            }
        }
        // Lode acts every tick, but a round that changed nothing while no job trains and no
        // arrival or profiling end is due would be repeated unchanged forever.
        let progress = next.is_finite() || sim.running.iter().any(|r| r.frac > 0.0);
        if lode.is_some() && !sim.running.is_empty() && (progress || !quiet) {
            next = next.min(next_tick);
        }
        if !next.is_finite() {
            break;
        }
        events += 1;
        // Advance every job to it.
        let dt_from = sim.now;
        for r in 0..sim.running.len() {
            let from = dt_from.max(sim.running[r].train_from_s);
            if next > from {
                let rate = sim.rate(&sim.running[r]);
                sim.running[r].remaining -= rate * (next - from);
            }
        }
        sim.now = next;
        if sim.now >= next_tick {
            next_tick = (sim.now / config.tick_s).floor() * config.tick_s + config.tick_s;
        }
        // Completions.
        let mut r = 0;
        while r < sim.running.len() {
            let job = &trace.jobs[sim.running[r].job];
            // Steps are far below 2^53.
            #[allow(clippy::cast_precision_loss)]
            let eps = 1e-9 * (job.steps as f64) + 1e-9;
            if sim.running[r].remaining <= eps && sim.now >= sim.running[r].train_from_s {
                let run = sim.running.swap_remove(r);
                sim.release(&run);
                results.push(JobResult {
                    job: job.id,
                    model: job.model.name,
                    gpus: job.gpus,
                    cpu_intensive: job.model.is_cpu_intensive(CPU_INTENSIVE_RATIO),
                    arrival_s: job.arrival_s,
                    start_s: run.start_s,
                    finish_s: sim.now,
                    queue_s: run.start_s - job.arrival_s,
                    jct_s: sim.now - job.arrival_s,
                    ideal_s: job.ideal_secs(),
                    data_workers: matches!(run.mode, Mode::Dw { .. }),
                });
            } else {
                r += 1;
            }
        }
        // Arrivals.
        while let Some(job) = trace.jobs.get(next_arrival) {
            if job.arrival_s > sim.now {
                break;
            }
            queue.push_back(next_arrival);
            next_arrival += 1;
        }
        // FIFO admission.
        while let Some(&j) = queue.front() {
            let job = &trace.jobs[j];
            let ask = &asks[j];
            // Data workers are stateless: admission may preempt them (fixed-dw restarts its
            // own later; Lode's policy redistributes).
            let preempt = !matches!(ask, Ask::NoDw { .. });
            let Some(parts) = sim.plan(job.gpus, &|g, s| ask.cpus(g, s), preempt) else {
                break;
            };
            queue.pop_front();
            if preempt {
                for &(i, _, c, mem) in &parts {
                    sim.evict_for(i, c, mem);
                }
            }
            sim.take_tw(&parts);
            #[allow(clippy::cast_precision_loss)]
            let steps = job.steps as f64;
            let (mode, train_from_s, gain, remaining, floor) = match *ask {
                Ask::NoDw { .. } => (Mode::NoDw, sim.now, 0.0, steps, 0.0),
                Ask::Dw {
                    size,
                    fixed_target,
                    dw_rate,
                    probes,
                    profiled_steps,
                    floor,
                    ..
                } => (
                    Mode::Dw {
                        size,
                        workers: Vec::new(),
                        fixed_target,
                    },
                    sim.now + f64::from(probes) * config.probe_s,
                    dw_rate,
                    // At least one step is left for after profiling.
                    (steps - profiled_steps).max(1.0),
                    floor,
                ),
            };
            sim.running.push(Running {
                job: j,
                tw: parts,
                mode,
                remaining,
                frac: 0.0,
                start_s: sim.now,
                train_from_s,
                feedback: Feedback::new(gain),
                floor,
            });
        }
        // The scheduler acts.
        match lode {
            Some(policy) => {
                sim.refresh_rates();
                quiet = backend::round(&mut sim, policy, &config.decide)?.is_empty();
            }
            None if kind == SchedulerKind::FixedDw => sim.fill_fixed(),
            None => {}
        }
        sim.refresh_rates();
        sim.record_peaks(&mut peaks);
        timeline.push(sim.sample());
        if next_arrival >= trace.jobs.len() && queue.is_empty() && sim.running.is_empty() {
            break;
        }
    }
    // The loop ends with jobs still running only when none of them can make progress.
    if let Some(run) = sim.running.first() {
        return Err(Error::JobStalled {
            job: trace.jobs[run.job].id,
        });
    }
    if let Some(&j) = queue.front() {
        return Err(Error::JobTooLarge {
            job: trace.jobs[j].id,
            gpus: trace.jobs[j].gpus,
        });
    }
    results.sort_by_key(|r| r.job);
    Ok(SimResult {
        scheduler: kind.name(),
        jobs: results,
        timeline,
        peaks,
        events,
    })
}

/// How a job asks for its training worker, and what it runs with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ask {
    NoDw {
        per_gpu: u32,
    },
    Dw {
        tw_cpus: u32,
        job_gpus: u32,
        size: u32,
        fixed_target: u32,
        dw_rate: f64,
        probes: u32,
        profiled_steps: f64,
        /// Steps/s the job trained at before giving its CPUs up (0 for fixed-dw).
        floor: f64,
    },
}

impl Ask {
    /// CPUs of a training-worker part holding `gpus` GPUs on a machine of `spec`.
    fn cpus(&self, gpus: u32, spec: &MachineSpec) -> u32 {
        match *self {
            Ask::NoDw { per_gpu } => gpus.saturating_mul(per_gpu).min(spec.cpus),
            // Spread the tuned training worker over its parts in proportion to GPUs.
            Ask::Dw {
                tw_cpus, job_gpus, ..
            } => u32::try_from(
                (u64::from(tw_cpus) * u64::from(gpus)).div_ceil(u64::from(job_gpus.max(1))),
            )
            .unwrap_or(u32::MAX)
            .clamp(1, spec.cpus.max(1)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::SyntheticConfig;

    fn small_trace(seed: u64) -> Trace {
        Trace::synthetic(
            seed,
            &SyntheticConfig {
                hours: 2.0,
                ..SyntheticConfig::default()
            },
        )
    }

    #[test]
    fn every_job_finishes_and_nothing_overcommits() {
        let trace = small_trace(4);
        let config = SimConfig::default();
        for kind in SchedulerKind::ALL {
            let r = simulate(&trace, kind, &config).expect("simulates");
            assert_eq!(r.jobs.len(), trace.jobs.len(), "{}", kind.name());
            for s in &r.timeline {
                assert!(s.gpu_alloc <= 1.0 + 1e-9 && s.cpu_alloc <= 1.0 + 1e-9);
                assert!(s.gpu_busy <= s.gpu_alloc + 1e-9);
            }
            for j in &r.jobs {
                assert!(j.queue_s >= 0.0 && j.jct_s >= j.queue_s);
                // No job runs faster than its ideal.
                assert!(j.finish_s - j.start_s >= j.ideal_s * (1.0 - 1e-6), "{j:?}");
            }
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let trace = small_trace(5);
        let config = SimConfig::default();
        let a = simulate(&trace, SchedulerKind::Lode(Policy::MaxTp), &config).expect("runs");
        let b = simulate(&trace, SchedulerKind::Lode(Policy::MaxTp), &config).expect("runs");
        assert_eq!(a, b);
    }

    #[test]
    fn a_lone_job_runs_near_its_ideal_with_data_workers() {
        let trace = Trace::parse_csv("0,0,1,3000,resnet18\n").expect("valid");
        let config = SimConfig::default();
        let lode = simulate(&trace, SchedulerKind::Lode(Policy::MaxTp), &config).expect("runs");
        let hw = simulate(&trace, SchedulerKind::NoDwHw, &config).expect("runs");
        let j = &lode.jobs[0];
        // Profiling plus a few percent.
        assert!(j.jct_s < j.ideal_s * 1.05 + 300.0, "{j:?}");
        // Without data workers, the hardware ratio feeds this model at about 40%.
        assert!(hw.jobs[0].jct_s > 1.5 * j.jct_s);
    }

    #[test]
    fn a_long_multi_gpu_job_never_trains_below_its_baseline() {
        // An 8-GPU ResNet18 job (1 h at ideal speed) under a stream of short single-GPU
        // ResNet18 jobs that want far more CPUs than the cluster has. SRTF ranks the long job
        // last; its floor still gives it at least what it trained at before giving its CPUs
        // up, so it runs no slower than with the hardware ratio and no data workers.
        let mut csv = String::from("0,0,8,24000,resnet18\n");
        for i in 1..=120 {
            csv.push_str(&format!("{i},{},1,8000,resnet18\n", 60 * i));
        }
        let trace = Trace::parse_csv(&csv).expect("valid");
        let config = SimConfig::default();
        let run_s = |kind| {
            let r = simulate(&trace, kind, &config).expect("simulates");
            let j = &r.jobs[0];
            j.finish_s - j.start_s
        };
        let hw = run_s(SchedulerKind::NoDwHw);
        for policy in Policy::ALL {
            let lode = run_s(SchedulerKind::Lode(policy));
            // Profiling trains at the probes' rates for a few minutes.
            assert!(lode <= hw + 600.0, "{policy:?}: {lode:.0} s vs {hw:.0} s");
        }
    }

    #[test]
    fn cpu_only_machines_hold_data_workers_and_never_a_training_worker() {
        // CPU-hungry jobs on one GPU machine and one CPU-only machine: Lode's data workers
        // spill onto the CPU-only machine; the baselines cannot use it.
        let mut csv = String::new();
        for i in 0..6 {
            csv.push_str(&format!("{i},{},1,4000,alexnet\n", 30 * i));
        }
        let trace = Trace::parse_csv(&csv).expect("valid");
        let config = SimConfig {
            cluster: "8gpu64cpu+0gpu64cpu".parse().expect("valid"),
            ..SimConfig::default()
        };
        for kind in SchedulerKind::ALL {
            let r = simulate(&trace, kind, &config).expect("simulates");
            assert_eq!(r.peaks[1].gpus, 0, "{}", kind.name());
            assert_eq!(r.peaks[1].tw_cpus, 0, "{}", kind.name());
            let uses_it = r.peaks[1].dw_cpus > 0;
            let data_workers = !matches!(kind, SchedulerKind::NoDwTuned | SchedulerKind::NoDwHw);
            assert_eq!(uses_it, data_workers, "{}: {:?}", kind.name(), r.peaks);
        }
    }

    #[test]
    fn a_job_that_can_never_train_is_an_error_not_a_missing_row() {
        // One CPU per GPU: `no-dw-hw` gives the job only its training worker's own CPU, so its
        // pipeline has nothing and it never finishes.
        let trace = Trace::parse_csv("0,0,1,50,resnet18\n").expect("valid");
        let config = SimConfig {
            cluster: "4gpu4cpu".parse().expect("valid"),
            ..SimConfig::default()
        };
        let err = simulate(&trace, SchedulerKind::NoDwHw, &config).expect_err("stalls");
        assert!(matches!(err, Error::JobStalled { job: JobId(0) }), "{err}");
        // One CPU per GPU on an 8-GPU machine: under Lode too the job trains at zero, and its
        // rounds, which run every tick, change nothing (this used to loop forever).
        let config = SimConfig {
            cluster: "8gpu8cpu".parse().expect("valid"),
            ..SimConfig::default()
        };
        for policy in Policy::ALL {
            let err = simulate(&trace, SchedulerKind::Lode(policy), &config).expect_err("stalls");
            assert!(matches!(err, Error::JobStalled { job: JobId(0) }), "{err}");
        }
    }

    #[test]
    fn oversized_jobs_are_an_error() {
        let trace = Trace::parse_csv("0,0,128,10,resnet50\n").expect("valid");
        let err = simulate(&trace, SchedulerKind::NoDwHw, &SimConfig::default())
            .expect_err("128 GPUs on 64");
        assert!(matches!(err, Error::JobTooLarge { gpus: 128, .. }));
    }

    #[test]
    fn scheduler_names_round_trip() {
        for k in SchedulerKind::ALL {
            assert_eq!(k.name().parse::<SchedulerKind>().expect("known"), k);
        }
        assert!("nope".parse::<SchedulerKind>().is_err());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    fn arb_cluster() -> impl Strategy<Value = ClusterSpec> {
        // One to three GPU machines and zero to three CPU-only ones, in any order: GPU machines
        // of the paper's shape (4 or 8 GPUs, 8 CPUs per GPU) and CPU-only machines
        // of 8 to 64 CPUs. (On much smaller machines a job may legitimately never train,
        // `Error::JobStalled`: `no-dw-hw` at 1 CPU per GPU leaves its pipeline nothing, a 4-CPU
        // `fixed-dw` worker fits beside no training worker, a tuned job keeps a training worker
        // as large as its machine.)
        (
            proptest::collection::vec(prop_oneof![Just(4u32), Just(8u32)], 1..4),
            proptest::collection::vec(8u32..65, 0..4),
            any::<bool>(),
        )
            .prop_map(|(gpu, cpu, cpu_first)| {
                let gpu = gpu.into_iter().map(|gpus| MachineSpec {
                    gpus,
                    cpus: 8 * gpus,
                    mem_gb: f64::from(8 * gpus) * 8.0,
                });
                let cpu = cpu.into_iter().map(|cpus| MachineSpec {
                    gpus: 0,
                    cpus,
                    mem_gb: f64::from(cpus) * 8.0,
                });
                let machines = if cpu_first {
                    cpu.chain(gpu).collect()
                } else {
                    gpu.chain(cpu).collect()
                };
                ClusterSpec { machines }
            })
    }

    fn arb_trace() -> impl Strategy<Value = Vec<(u32, u64, usize)>> {
        // (arrival s, steps, model index) of one-GPU jobs.
        proptest::collection::vec(
            (0u32..600, 50u64..2_000, 0..crate::model::CATALOGUE.len()),
            1..8,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the cluster and scheduler: no training worker on a CPU-only machine, and no
        /// machine's GPUs or CPUs over-committed at any event.
        #[test]
        fn no_training_worker_on_a_cpu_only_machine_and_no_cpus_over_committed(
            cluster in arb_cluster(),
            jobs in arb_trace(),
            k in 0..SchedulerKind::ALL.len(),
        ) {
            let csv: String = jobs
                .iter()
                .enumerate()
                .map(|(i, (at, steps, m))| {
                    format!("{i},{at},1,{steps},{}\n", crate::model::CATALOGUE[*m].name)
                })
                .collect();
            let trace = Trace::parse_csv(&csv).expect("valid");
            let config = SimConfig { cluster: cluster.clone(), ..SimConfig::default() };
            let kind = SchedulerKind::ALL[k];
            let r = simulate(&trace, kind, &config).expect("one-GPU jobs fit");
            prop_assert_eq!(r.jobs.len(), trace.jobs.len());
            for (spec, peak) in cluster.machines.iter().zip(&r.peaks) {
                if spec.is_cpu_only() {
                    prop_assert_eq!(peak.gpus, 0);
                    prop_assert_eq!(peak.tw_cpus, 0);
                }
                prop_assert!(peak.gpus <= spec.gpus, "{peak:?} on {spec:?}");
                prop_assert!(peak.cpus <= spec.cpus, "{peak:?} on {spec:?}");
            }
        }
    }
}

#[cfg(test)]
mod ordering {
    use super::*;
    use crate::trace::SyntheticConfig;

    fn light_slowdown(r: &SimResult) -> f64 {
        let light: Vec<f64> = r
            .jobs
            .iter()
            .filter(|j| !j.cpu_intensive)
            .map(|j| (j.finish_s - j.start_s) / j.ideal_s)
            .collect();
        #[allow(clippy::cast_precision_loss)]
        let n = light.len().max(1) as f64;
        light.iter().sum::<f64>() / n
    }

    /// What holds of Table 5 under the recalibrated catalogue on the full 8-hour synthetic
    /// trace (seed 3 here to keep the debug build fast; scheduler/README.md has seeds 1–10):
    /// every Lode policy finishes jobs sooner on average than all three baselines and queues
    /// less than `no-dw-tuned`, and MaxTP and SRTF beat Fair. The paper's gains (2.5x, 2.3x),
    /// `fixed-dw < no-dw-hw ≤ no-dw-tuned` and Lode's near-zero queuing do not hold on most
    /// seeds; the README says by which mechanism, and the tests below pin those mechanisms.
    #[test]
    fn lode_beats_every_baseline_and_maxtp_and_srtf_beat_fair() {
        let seed = 3;
        let trace = Trace::synthetic(seed, &SyntheticConfig::default());
        let config = SimConfig {
            seed,
            ..SimConfig::default()
        };
        let run = |k| simulate(&trace, k, &config).expect("simulates");
        let [tuned, hw, fixed, fair, maxtp, srtf] = SchedulerKind::ALL.map(run);
        let jct = SimResult::avg_jct_min;
        for lode in [&fair, &maxtp, &srtf] {
            for base in [&tuned, &hw, &fixed] {
                assert!(
                    jct(lode) < jct(base),
                    "{} {:.1} vs {} {:.1}",
                    lode.scheduler,
                    jct(lode),
                    base.scheduler,
                    jct(base)
                );
            }
            assert!(lode.avg_queue_min() < tuned.avg_queue_min());
        }
        assert!(jct(&maxtp) < jct(&fair) && jct(&srtf) < jct(&fair));
    }

    /// Why `fixed-dw` is the slowest scheduler: one worker size (4 CPUs) for every job. A
    /// recommendation model barely scales inside one process (§5.1), so a 4-CPU worker does
    /// little more than a 1-CPU one, and its hand-tuned CPU count feeds it a fraction of its
    /// ideal even alone on the cluster; a vision model alone runs at its ideal.
    #[test]
    fn fixed_dw_size_starves_models_that_do_not_scale_in_one_process() {
        let config = SimConfig::default();
        let slowdown = |model: &str, kind| {
            let trace = Trace::parse_csv(&format!("0,0,1,20000,{model}\n")).expect("valid");
            let r = simulate(&trace, kind, &config).expect("simulates");
            let j = &r.jobs[0];
            (j.finish_s - j.start_s) / j.ideal_s
        };
        for model in ["wdl", "deepfm", "din"] {
            let fixed = slowdown(model, SchedulerKind::FixedDw);
            let lode = slowdown(model, SchedulerKind::Lode(Policy::MaxTp));
            assert!(fixed > 2.0, "{model}: fixed-dw {fixed:.2}");
            assert!(lode < 1.2, "{model}: maxtp {lode:.2}");
        }
        for model in ["alexnet", "resnet18", "shufflenet_v2"] {
            let fixed = slowdown(model, SchedulerKind::FixedDw);
            assert!(fixed < 1.1, "{model}: fixed-dw {fixed:.2}");
        }
    }

    /// The other side of the "Floors" modelling choice (scheduler/README.md): when the cluster
    /// level allocates by the policy's metric alone, Fair's `(t + Δt) / t_i` ranks last a job
    /// at zero that one worker would bring to its ideal, so light jobs wait with their GPUs
    /// idle while CPUs are short, and Fair falls to about `no-dw-tuned`'s average JCT.
    #[test]
    fn without_floors_fair_starves_light_jobs() {
        let seed = 3;
        let trace = Trace::synthetic(seed, &SyntheticConfig::default());
        let run = |kind, floors| {
            let config = SimConfig {
                seed,
                floors,
                ..SimConfig::default()
            };
            simulate(&trace, kind, &config).expect("simulates")
        };
        let fair = SchedulerKind::Lode(Policy::Fair);
        let tuned = run(SchedulerKind::NoDwTuned, true);
        let with = run(fair, true);
        let without = run(fair, false);
        let gain = |r: &SimResult| tuned.avg_jct_min() / r.avg_jct_min();
        let (lw, lo) = (light_slowdown(&with), light_slowdown(&without));
        assert!(
            lo > lw + 0.3,
            "light jobs: {lw:.2} with floors, {lo:.2} without"
        );
        assert!(
            gain(&with) > 1.3 * gain(&without),
            "{:.2} with floors, {:.2} without",
            gain(&with),
            gain(&without)
        );
    }
}
