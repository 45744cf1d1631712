//! Cluster-level allocation (GoldMiner §3.4.2): a pure function from a snapshot of the cluster
//! to the data-worker moves that bring it to the policy's allocation.
//!
//! [`decide`] recomputes the whole data-worker allocation from nothing each round: it repeatedly
//! gives one data worker to the job with the best metric under the policy, updating that job's
//! projected throughput with its last observed speedup per worker ([`Feedback`]), until no job
//! can use one (production matches consumption, no gain, or no machine has room). The target is
//! then diffed with the current placement into removals, migrations and additions.
//!
//! Floors come first: a job whose projected throughput is below its `floor_throughput` (what
//! it trained at on its own CPUs before the job-level tuner gave them up for data workers)
//! ranks before every job at or above its floor, under every policy. The job-level tuner
//! decouples a job only when data workers beat that baseline and shrinks its training worker
//! only while throughput holds; the floor keeps the cluster level from undoing that, so that no
//! job holds its GPUs with nothing to feed them. Within each group the policy's metric orders.
//!
//! Metrics, for a job holding `c` CPUs (training worker plus data workers) at throughput `t`
//! (steps/s) and one more worker of `Δc` CPUs adding `Δt`:
//! - MaxTP: the largest `Δt / t_i · g / Δc`, GPUs' worth of training gained per CPU. `Δt` is
//!   normalised by the job's ideal throughput `t_i` so that steps of different models compare.
//! - SRTF: the smallest `n · (c + Δc) / (t + Δt)`: `n / (t + Δt)` is the time the job still
//!   needs after the allocation and `c + Δc` the CPUs it holds meanwhile, so the metric is the
//!   CPU-seconds the job still needs; the cheapest job to finish goes first.
//! - Fair: the smallest `(t + Δt) / t_i`: the job furthest below its ideal throughput.
//!
//! Placement of one data worker prefers, in order: the training worker's machine; for a remote
//! worker, a CPU-only machine (its CPUs serve only data workers, while a GPU machine's free CPUs
//! are the only local capacity of the jobs training there); machines with
//! fewer distributed jobs (training workers spanning several machines); a machine where the job
//! already has a worker (so equal places do not swap workers back and forth); machines with fewer
//! remote data workers; the lowest machine id. A worker that sits on a worse place than one that
//! has freed up is migrated.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ids::{JobId, MachineId};

/// The cluster-level allocation policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    MaxTp,
    Srtf,
    Fair,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::MaxTp, Policy::Srtf, Policy::Fair];

    pub fn name(self) -> &'static str {
        match self {
            Policy::MaxTp => "maxtp",
            Policy::Srtf => "srtf",
            Policy::Fair => "fair",
        }
    }
}

/// Tolerances of [`decide`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecideConfig {
    /// A job whose throughput is within this fraction of its consumption is at the ideal queue
    /// state and gets no more data workers.
    pub ideal_tolerance: f64,
    /// A worker whose projected gain is below this fraction of the job's ideal throughput is
    /// not worth giving.
    pub min_gain_fraction: f64,
}

impl Default for DecideConfig {
    fn default() -> Self {
        Self {
            ideal_tolerance: 0.02,
            min_gain_fraction: 0.002,
        }
    }
}

/// What data workers may use on one machine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachineView {
    pub id: MachineId,
    /// CPUs not held by training workers or anything else that data workers cannot preempt;
    /// the current data workers' CPUs are counted in. The unit is the backend's, the same for
    /// every machine and job of a snapshot (whole CPUs in the simulator and the local backend,
    /// millicores in the Kubernetes one): `decide`'s rankings do not change with it.
    pub dw_cpus: u32,
    /// Memory in GB under the same rule.
    pub dw_mem_gb: f64,
    /// No GPUs: no training worker runs here, so every data worker here is remote, and remote
    /// workers come here before they take a GPU machine's CPUs.
    pub cpu_only: bool,
}

/// One job as the scheduler sees it: shape, placement and queue metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    pub id: JobId,
    pub gpus: u32,
    pub remaining_steps: f64,
    /// Machines of the training worker (more than one for a distributed job).
    pub tw_machines: Vec<MachineId>,
    pub tw_cpus: u32,
    /// Size of one data worker, from the job-level tuner.
    pub dw_cpus: u32,
    pub dw_mem_gb: f64,
    /// Current data workers: machine → count.
    pub data_workers: BTreeMap<MachineId, u32>,
    /// Steps/s now.
    pub throughput: f64,
    /// Steps/s with no data worker at all.
    pub baseline_throughput: f64,
    /// Steps/s of the job on its ideal standalone allocation (`t_i`).
    pub ideal_throughput: f64,
    /// Steps/s the training worker can consume now: more production than this is wasted.
    pub consumption: f64,
    /// Steps/s the last data worker added (see [`Feedback`]).
    pub gain_per_dw: f64,
    /// Steps/s the job is owed before any job gets a worker for the policy's metric: what it
    /// trained at on its own CPUs before its training worker gave them up for data workers
    /// (the tuner's baseline). 0 when the job gave nothing up.
    pub floor_throughput: f64,
}

impl JobView {
    pub fn dw_count(&self) -> u32 {
        self.data_workers.values().sum()
    }

    /// Projected throughput with `k` data workers: interpolated between the baseline and the
    /// current throughput below the current count, extended with the last observed gain per
    /// worker above it, never above consumption.
    pub fn projected(&self, k: u32) -> f64 {
        let cur = self.dw_count();
        let t = if k <= cur {
            if cur == 0 {
                self.baseline_throughput
            } else {
                self.baseline_throughput
                    + (self.throughput - self.baseline_throughput) * f64::from(k) / f64::from(cur)
            }
        } else {
            self.throughput + f64::from(k - cur) * self.gain_per_dw.max(0.0)
        };
        t.clamp(0.0, self.consumption.max(0.0))
    }
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    pub machines: Vec<MachineView>,
    pub jobs: Vec<JobView>,
}

/// One change of the data-worker placement.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum Decision {
    /// Start one data worker; `metric` is the policy's value that chose it.
    Add {
        job: JobId,
        machine: MachineId,
        cpus: u32,
        metric: f64,
    },
    /// Stop one data worker.
    Remove { job: JobId, machine: MachineId },
    /// Move one data worker to a better place.
    Migrate {
        job: JobId,
        from: MachineId,
        to: MachineId,
    },
}

/// Tracks a job's speedup per data worker from successive observations: the scheduler assumes
/// the last step's speedup until a new observation corrects it.
#[derive(Debug, Clone, PartialEq)]
pub struct Feedback {
    gain: f64,
    last: Option<(u32, f64)>,
}

impl Feedback {
    /// Starts from the tuner's estimate of one worker's production (steps/s).
    pub fn new(initial_gain: f64) -> Self {
        Self {
            gain: initial_gain.max(0.0),
            last: None,
        }
    }

    /// Records the throughput seen with `count` data workers; returns the updated estimate.
    pub fn observe(&mut self, count: u32, throughput: f64) -> f64 {
        if let Some((c0, t0)) = self.last {
            if count != c0 && throughput.is_finite() {
                let slope = (throughput - t0) / (f64::from(count) - f64::from(c0));
                if slope.is_finite() {
                    self.gain = slope.max(0.0);
                }
            }
        }
        if throughput.is_finite() {
            self.last = Some((count, throughput));
        }
        self.gain
    }

    pub fn gain(&self) -> f64 {
        self.gain
    }
}

/// How a job ranks for its next worker; smaller is better. Jobs below their floor come
/// before every job above it; within each group the policy's metric orders them, then the id.
#[derive(Debug, Clone, Copy)]
struct Rank {
    above_floor: bool,
    key: f64,
    id: JobId,
}

impl Rank {
    fn better_than(&self, other: &Rank) -> bool {
        self.above_floor
            .cmp(&other.above_floor)
            .then(self.key.total_cmp(&other.key))
            .then(self.id.cmp(&other.id))
            .is_lt()
    }
}

/// The policy's value for giving job `j` its `k+1`-th worker, as a [`Rank`] and the metric,
/// or `None` when the worker would not help.
fn score(policy: Policy, job: &JobView, k: u32, config: &DecideConfig) -> Option<(Rank, f64)> {
    let t = job.projected(k);
    if t >= job.consumption * (1.0 - config.ideal_tolerance) {
        return None;
    }
    let t_next = job.projected(k + 1);
    let dt = t_next - t;
    let ideal = job.ideal_throughput.max(f64::MIN_POSITIVE);
    // Written so that a NaN gain also counts as no gain.
    let helps = dt > config.min_gain_fraction * ideal;
    if !helps || job.dw_cpus == 0 {
        return None;
    }
    let dc = f64::from(job.dw_cpus);
    let c = f64::from(job.tw_cpus) + f64::from(k) * dc;
    let value = match policy {
        Policy::MaxTp => dt / ideal * f64::from(job.gpus) / dc,
        Policy::Srtf => job.remaining_steps.max(0.0) * (c + dc) / t_next,
        Policy::Fair => t_next / ideal,
    };
    let key = match policy {
        Policy::MaxTp => -value,
        Policy::Srtf | Policy::Fair => value,
    };
    // Written so that a NaN floor counts as none.
    let below_floor = t < job.floor_throughput;
    let rank = Rank {
        above_floor: !below_floor,
        key,
        id: job.id,
    };
    Some((rank, value))
}

/// Ranking of a machine for one data worker of a job; smaller is better: remote, remote on a
/// GPU machine, distributed jobs there, not sticky, remote workers there, the id.
type PlaceKey = (bool, bool, u32, bool, u32, MachineId);

struct Placer<'a> {
    snapshot: &'a Snapshot,
    free_cpus: Vec<u32>,
    free_mem: Vec<f64>,
    distributed: Vec<u32>,
    remote_dws: Vec<u32>,
}

impl<'a> Placer<'a> {
    fn new(snapshot: &'a Snapshot) -> Self {
        let index: BTreeMap<MachineId, usize> = snapshot
            .machines
            .iter()
            .enumerate()
            .map(|(i, m)| (m.id, i))
            .collect();
        let mut distributed = vec![0; snapshot.machines.len()];
        for job in snapshot.jobs.iter().filter(|j| j.tw_machines.len() > 1) {
            for m in &job.tw_machines {
                if let Some(&i) = index.get(m) {
                    distributed[i] += 1;
                }
            }
        }
        Self {
            snapshot,
            free_cpus: snapshot.machines.iter().map(|m| m.dw_cpus).collect(),
            free_mem: snapshot.machines.iter().map(|m| m.dw_mem_gb).collect(),
            distributed,
            remote_dws: vec![0; snapshot.machines.len()],
        }
    }

    /// The best machine for one more worker of `job`, given how many of its workers the target
    /// already put on each machine.
    fn best(&self, job: &JobView, placed: &BTreeMap<MachineId, u32>) -> Option<usize> {
        let mut best: Option<(PlaceKey, usize)> = None;
        for (i, m) in self.snapshot.machines.iter().enumerate() {
            if self.free_cpus[i] < job.dw_cpus || self.free_mem[i] < job.dw_mem_gb {
                continue;
            }
            let remote = !job.tw_machines.contains(&m.id);
            let current = job.data_workers.get(&m.id).copied().unwrap_or(0);
            let sticky = placed.get(&m.id).copied().unwrap_or(0) < current;
            let key = (
                remote,
                remote && !m.cpu_only,
                self.distributed[i],
                !sticky,
                self.remote_dws[i],
                m.id,
            );
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, i));
            }
        }
        best.map(|(_, i)| i)
    }

    fn take(&mut self, job: &JobView, i: usize) {
        self.free_cpus[i] -= job.dw_cpus;
        self.free_mem[i] -= job.dw_mem_gb;
        if !job.tw_machines.contains(&self.snapshot.machines[i].id) {
            self.remote_dws[i] += 1;
        }
    }
}

/// The policy's target placement: job → machine → number of data workers, with the metric
/// value of each worker given (in the order given).
pub fn target(policy: Policy, snapshot: &Snapshot, config: &DecideConfig) -> Target {
    let mut placer = Placer::new(snapshot);
    let mut placed: Vec<BTreeMap<MachineId, u32>> = vec![BTreeMap::new(); snapshot.jobs.len()];
    let mut counts = vec![0u32; snapshot.jobs.len()];
    let mut blocked = vec![false; snapshot.jobs.len()];
    let mut metrics: Vec<Vec<f64>> = vec![Vec::new(); snapshot.jobs.len()];
    let mut orders: Vec<Vec<MachineId>> = vec![Vec::new(); snapshot.jobs.len()];
    // A job's score depends only on its own count, so it is recomputed only when it changes.
    let mut scores: Vec<Option<(Rank, f64)>> = snapshot
        .jobs
        .iter()
        .map(|job| score(policy, job, 0, config))
        .collect();
    loop {
        let mut best: Option<(Rank, f64, usize)> = None;
        for j in 0..snapshot.jobs.len() {
            if blocked[j] {
                continue;
            }
            let Some((rank, value)) = scores[j] else {
                blocked[j] = true;
                continue;
            };
            if best.as_ref().is_none_or(|(b, _, _)| rank.better_than(b)) {
                best = Some((rank, value, j));
            }
        }
        let Some((_, value, j)) = best else { break };
        let job = &snapshot.jobs[j];
        match placer.best(job, &placed[j]) {
            Some(i) => {
                placer.take(job, i);
                let id = snapshot.machines[i].id;
                if !orders[j].contains(&id) {
                    orders[j].push(id);
                }
                *placed[j].entry(id).or_insert(0) += 1;
                counts[j] += 1;
                metrics[j].push(value);
                scores[j] = score(policy, job, counts[j], config);
            }
            None => blocked[j] = true,
        }
    }
    Target {
        jobs: snapshot
            .jobs
            .iter()
            .zip(placed)
            .zip(metrics)
            .zip(orders)
            .map(|(((job, placement), metrics), order)| {
                (
                    job.id,
                    JobTarget {
                        placement,
                        metrics,
                        order,
                    },
                )
            })
            .collect(),
    }
}

/// One job's share of a [`Target`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobTarget {
    pub placement: BTreeMap<MachineId, u32>,
    /// The policy's metric for each worker, in the order they were given.
    pub metrics: Vec<f64>,
    /// The machines of `placement` in the order the placement first chose each one: the
    /// policy's preference order for this job's workers (a backend that can only express
    /// preferences, such as Kubernetes' node affinity, passes it on).
    pub order: Vec<MachineId>,
}

impl JobTarget {
    pub fn count(&self) -> u32 {
        self.placement.values().sum()
    }
}

/// The allocation a policy wants.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Target {
    pub jobs: BTreeMap<JobId, JobTarget>,
}

impl Target {
    pub fn count(&self, job: JobId) -> u32 {
        self.jobs.get(&job).map_or(0, JobTarget::count)
    }
}

/// The moves that take the snapshot's placement to the policy's target: removals first, then
/// migrations, then additions, so that a backend applying them in order frees CPUs before
/// using them.
pub fn decide(policy: Policy, snapshot: &Snapshot, config: &DecideConfig) -> Vec<Decision> {
    plan(policy, snapshot, config).decisions
}

/// [`decide`]'s moves together with the target they lead to, for a backend that also passes
/// the policy's placement order on (Kubernetes).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub target: Target,
    pub decisions: Vec<Decision>,
}

/// [`decide`] with its target: the same decisions, and the target they reach.
pub fn plan(policy: Policy, snapshot: &Snapshot, config: &DecideConfig) -> Plan {
    let target = target(policy, snapshot, config);
    let decisions = moves(snapshot, &target);
    Plan { target, decisions }
}

/// The moves from the snapshot's placement to `target`.
fn moves(snapshot: &Snapshot, target: &Target) -> Vec<Decision> {
    let mut removes = Vec::new();
    let mut migrates = Vec::new();
    let mut adds = Vec::new();
    for job in &snapshot.jobs {
        let empty = JobTarget::default();
        let want = target.jobs.get(&job.id).unwrap_or(&empty);
        let mut surplus = Vec::new();
        let mut deficit = Vec::new();
        let machines: std::collections::BTreeSet<MachineId> = job
            .data_workers
            .keys()
            .chain(want.placement.keys())
            .copied()
            .collect();
        for m in machines {
            let have = job.data_workers.get(&m).copied().unwrap_or(0);
            let need = want.placement.get(&m).copied().unwrap_or(0);
            surplus.extend(std::iter::repeat_n(m, have.saturating_sub(need) as usize));
            deficit.extend(std::iter::repeat_n(m, need.saturating_sub(have) as usize));
        }
        let paired = surplus.len().min(deficit.len());
        for (from, to) in surplus.iter().zip(&deficit) {
            migrates.push(Decision::Migrate {
                job: job.id,
                from: *from,
                to: *to,
            });
        }
        for machine in &surplus[paired..] {
            removes.push(Decision::Remove {
                job: job.id,
                machine: *machine,
            });
        }
        // The metrics of the workers beyond the current count are the ones that chose them.
        let have = usize::try_from(job.dw_count()).unwrap_or(usize::MAX);
        for (n, machine) in deficit[paired..].iter().enumerate() {
            let metric = want
                .metrics
                .get(have.saturating_add(n))
                .or(want.metrics.last())
                .copied()
                .unwrap_or(f64::NAN);
            adds.push(Decision::Add {
                job: job.id,
                machine: *machine,
                cpus: job.dw_cpus,
                metric,
            });
        }
    }
    removes.extend(migrates);
    removes.extend(adds);
    removes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(id: u32, cpus: u32) -> MachineView {
        MachineView {
            id: MachineId(id),
            dw_cpus: cpus,
            dw_mem_gb: 1e6,
            cpu_only: false,
        }
    }

    fn cpu_only(id: u32, cpus: u32) -> MachineView {
        MachineView {
            cpu_only: true,
            ..machine(id, cpus)
        }
    }

    /// A job with no workers yet whose workers each add `gain` of an ideal throughput of 1.
    fn job(id: u64, gpus: u32, remaining: f64, gain: f64, dw_cpus: u32) -> JobView {
        JobView {
            id: JobId(id),
            gpus,
            remaining_steps: remaining,
            tw_machines: vec![MachineId(0)],
            tw_cpus: gpus,
            dw_cpus,
            dw_mem_gb: 0.0,
            data_workers: BTreeMap::new(),
            throughput: 0.0,
            baseline_throughput: 0.0,
            ideal_throughput: 1.0,
            consumption: 1.0,
            gain_per_dw: gain,
            floor_throughput: 0.0,
        }
    }

    fn first_add(decisions: &[Decision]) -> Option<JobId> {
        decisions.iter().find_map(|d| match d {
            Decision::Add { job, .. } => Some(*job),
            _ => None,
        })
    }

    fn one_worker(policy: Policy, snapshot: &Snapshot) -> Option<JobId> {
        // With room for exactly one worker, the policy's first choice is the only add.
        first_add(&decide(policy, snapshot, &DecideConfig::default()))
    }

    // Job 1: 4 GPUs, long (10_000 steps), workers add 0.1 of ideal each (4 CPUs).
    // Job 2: 1 GPU, short (500 steps), workers add 0.2 each (4 CPUs).
    // Job 3: 1 GPU, medium (2_000 steps), already at 0.5 of ideal with 5 workers, gain 0.1.
    fn three_jobs() -> Snapshot {
        let mut j3 = job(3, 1, 2_000.0, 0.1, 4);
        j3.data_workers.insert(MachineId(1), 5);
        j3.throughput = 0.5;
        Snapshot {
            machines: vec![machine(0, 4), machine(1, 20)],
            jobs: vec![job(1, 4, 10_000.0, 0.1, 4), job(2, 1, 500.0, 0.2, 4), j3],
        }
    }

    #[test]
    fn maxtp_picks_most_gpu_throughput_per_cpu() {
        // Job 1: 0.1 * 4 / 4 = 0.1; job 2: 0.2 * 1 / 4 = 0.05; job 3: 0.025.
        let mut s = three_jobs();
        s.machines = vec![machine(0, 4), machine(1, 0)];
        s.jobs[2].data_workers.clear();
        s.jobs[2].throughput = 0.0;
        assert_eq!(one_worker(Policy::MaxTp, &s), Some(JobId(1)));
    }

    #[test]
    fn srtf_picks_least_remaining_cpu_time() {
        // Job 1: 10000 * (4 + 4) / 0.1 = 800k; job 2: 500 * 5 / 0.2 = 12.5k;
        // job 3 (no workers): 2000 * 5 / 0.1 = 100k.
        let mut s = three_jobs();
        s.machines = vec![machine(0, 4), machine(1, 0)];
        s.jobs[2].data_workers.clear();
        s.jobs[2].throughput = 0.0;
        assert_eq!(one_worker(Policy::Srtf, &s), Some(JobId(2)));
    }

    #[test]
    fn fair_equalises_fractions_of_ideal() {
        // Room for six workers in all (job 3's five included). Projected fractions: job 1 0.1k,
        // job 2 0.2k, job 3 0.11k (0.55 over its five). Fair hands them out lowest-next-first:
        // 1 (0.1), 3 (0.11), 1 (0.2), 2 (0.2), 3 (0.22), 1 (0.3).
        let mut s = Snapshot {
            machines: vec![machine(0, 4), machine(1, 20)],
            ..three_jobs()
        };
        s.jobs[2].throughput = 0.55;
        let t = target(Policy::Fair, &s, &DecideConfig::default());
        assert_eq!(
            [t.count(JobId(1)), t.count(JobId(2)), t.count(JobId(3))],
            [3, 1, 2]
        );
    }

    #[test]
    fn each_policy_pins_its_choice_on_one_snapshot() {
        // Three jobs, room for one worker: the three policies choose three different jobs.
        // Job 10: 2 GPUs, 0.3 per 4-CPU worker, 50_000 steps, at 0.
        // Job 11: 1 GPU, 0.4 per worker, 300 steps, at 0.5 already.
        // Job 12: 1 GPU, 0.05 per worker, 4_000 steps, at 0.
        let mut j11 = job(11, 1, 300.0, 0.4, 4);
        j11.throughput = 0.5;
        j11.baseline_throughput = 0.5;
        let s = Snapshot {
            machines: vec![machine(0, 4)],
            jobs: vec![
                job(10, 2, 50_000.0, 0.3, 4),
                j11,
                job(12, 1, 4_000.0, 0.05, 4),
            ],
        };
        // MaxTP: 0.3*2/4 = 0.15 vs 0.4/4 = 0.1 vs 0.0125 → job 10.
        assert_eq!(one_worker(Policy::MaxTp, &s), Some(JobId(10)));
        // SRTF: 50000*6/0.3 = 1e6; 300*5/0.9 = 1667; 4000*5/0.05 = 4e5 → job 11.
        assert_eq!(one_worker(Policy::Srtf, &s), Some(JobId(11)));
        // Fair: 0.3, 0.9, 0.05 → job 12.
        assert_eq!(one_worker(Policy::Fair, &s), Some(JobId(12)));
    }

    #[test]
    fn floors_come_before_the_policys_metric() {
        // Job 1: long, 0.1 per worker, owed 0.3 (three workers). Job 2: short, 0.2 per worker,
        // preferred by SRTF and MaxTP. Room for four workers: job 1 is brought to its floor
        // first under every policy, and the metric decides only what is left.
        let mut j1 = job(1, 1, 50_000.0, 0.1, 4);
        j1.floor_throughput = 0.3;
        let s = Snapshot {
            machines: vec![machine(0, 16)],
            jobs: vec![j1, job(2, 1, 500.0, 0.2, 4)],
        };
        let config = DecideConfig::default();
        for p in Policy::ALL {
            let t = target(p, &s, &config);
            assert_eq!([t.count(JobId(1)), t.count(JobId(2))], [3, 1], "{p:?}");
        }
        // Without the floor, SRTF and MaxTP give job 1 nothing.
        let mut s = s;
        s.jobs[0].floor_throughput = 0.0;
        for p in [Policy::Srtf, Policy::MaxTp] {
            assert_eq!(target(p, &s, &config).count(JobId(1)), 0, "{p:?}");
        }
    }

    #[test]
    fn saturated_jobs_get_nothing() {
        let mut j = job(1, 1, 1_000.0, 0.5, 2);
        j.data_workers.insert(MachineId(0), 2);
        j.throughput = 1.0;
        let s = Snapshot {
            machines: vec![machine(0, 64)],
            jobs: vec![j],
        };
        for p in Policy::ALL {
            assert!(decide(p, &s, &DecideConfig::default()).is_empty(), "{p:?}");
        }
    }

    #[test]
    fn growth_stops_at_consumption() {
        let s = Snapshot {
            machines: vec![machine(0, 64)],
            jobs: vec![job(1, 1, 1_000.0, 0.3, 2)],
        };
        for p in Policy::ALL {
            // 0.3, 0.6, 0.9, then 1.0 (capped): four workers, no fifth.
            assert_eq!(target(p, &s, &DecideConfig::default()).count(JobId(1)), 4);
        }
    }

    #[test]
    fn placement_prefers_the_training_workers_machine() {
        let mut j = job(1, 1, 1_000.0, 0.1, 4);
        j.tw_machines = vec![MachineId(2)];
        let s = Snapshot {
            machines: vec![machine(0, 64), machine(1, 64), machine(2, 8)],
            jobs: vec![j],
        };
        let t = target(Policy::MaxTp, &s, &DecideConfig::default());
        let p = &t.jobs[&JobId(1)].placement;
        assert_eq!(p.get(&MachineId(2)), Some(&2));
        assert_eq!(t.count(JobId(1)), 10);
    }

    #[test]
    fn placement_avoids_machines_of_distributed_jobs() {
        let mut a = job(1, 1, 1_000.0, 0.5, 4);
        a.tw_machines = vec![MachineId(0)];
        let mut dist = job(2, 16, 1_000.0, 0.0, 4);
        dist.tw_machines = vec![MachineId(1), MachineId(2)];
        dist.consumption = 0.0;
        let s = Snapshot {
            machines: vec![
                machine(0, 0),
                machine(1, 64),
                machine(2, 64),
                machine(3, 64),
            ],
            jobs: vec![a, dist],
        };
        let t = target(Policy::MaxTp, &s, &DecideConfig::default());
        assert_eq!(t.jobs[&JobId(1)].placement.get(&MachineId(3)), Some(&2));
    }

    #[test]
    fn workers_go_to_cpu_only_machines_when_the_gpu_machines_cpus_are_full() {
        // Two jobs training on GPU machines 0 and 1, whose CPUs are all held by training
        // workers; machine 2 is CPU-only with room for five 4-CPU workers.
        let mut a = job(1, 1, 1_000.0, 0.2, 4);
        a.tw_machines = vec![MachineId(0)];
        let mut b = job(2, 1, 1_000.0, 0.2, 4);
        b.tw_machines = vec![MachineId(1)];
        let s = Snapshot {
            machines: vec![machine(0, 0), machine(1, 2), cpu_only(2, 20)],
            jobs: vec![a, b],
        };
        for p in Policy::ALL {
            let d = decide(p, &s, &DecideConfig::default());
            let adds: Vec<MachineId> = d
                .iter()
                .filter_map(|d| match d {
                    Decision::Add { machine, .. } => Some(*machine),
                    _ => None,
                })
                .collect();
            assert_eq!(adds, vec![MachineId(2); 5], "{p:?}: {d:?}");
        }
    }

    #[test]
    fn remote_workers_prefer_cpu_only_machines_to_other_jobs_gpu_machines() {
        // Job 1 trains on machine 0 (full). Machine 1 is a GPU machine with free CPUs, machine
        // 2 a CPU-only one: the remote workers go to the CPU-only machine first, and only the
        // rest to the GPU machine.
        let mut a = job(1, 1, 1_000.0, 0.1, 4);
        a.tw_machines = vec![MachineId(0)];
        let s = Snapshot {
            machines: vec![machine(0, 0), machine(1, 64), cpu_only(2, 8)],
            jobs: vec![a],
        };
        // Ten workers wanted: two fill the CPU-only machine, eight go to machine 1 (by id
        // alone all ten would).
        let t = target(Policy::MaxTp, &s, &DecideConfig::default());
        let p = &t.jobs[&JobId(1)].placement;
        assert_eq!(p.get(&MachineId(2)), Some(&2));
        assert_eq!(p.get(&MachineId(1)), Some(&8));
        // With its own machine's CPUs free, the job's first workers stay home.
        let s = Snapshot {
            machines: vec![machine(0, 8), machine(1, 0), cpu_only(2, 8)],
            ..s
        };
        let t = target(Policy::MaxTp, &s, &DecideConfig::default());
        assert_eq!(t.jobs[&JobId(1)].placement.get(&MachineId(0)), Some(&2));
    }

    #[test]
    fn a_remote_worker_migrates_home_when_room_frees_up() {
        let mut j = job(1, 1, 1_000.0, 0.5, 4);
        j.tw_machines = vec![MachineId(0)];
        j.data_workers.insert(MachineId(1), 1);
        j.throughput = 0.5;
        let s = Snapshot {
            machines: vec![machine(0, 16), machine(1, 16)],
            jobs: vec![j],
        };
        let d = decide(Policy::MaxTp, &s, &DecideConfig::default());
        assert!(d.contains(&Decision::Migrate {
            job: JobId(1),
            from: MachineId(1),
            to: MachineId(0)
        }));
    }

    #[test]
    fn equal_places_do_not_churn() {
        let mut j = job(1, 1, 1_000.0, 0.25, 4);
        j.tw_machines = vec![MachineId(9)];
        j.data_workers.insert(MachineId(1), 2);
        j.throughput = 0.5;
        let s = Snapshot {
            machines: vec![machine(0, 16), machine(1, 16), machine(9, 0)],
            jobs: vec![j],
        };
        let d = decide(Policy::MaxTp, &s, &DecideConfig::default());
        assert!(
            d.iter().all(|d| !matches!(d, Decision::Migrate { .. })),
            "{d:?}"
        );
    }

    #[test]
    fn reclaims_workers_for_a_better_job() {
        // Job 1 holds all 4 workers at a poor gain; job 2 arrives with a far better gain.
        let mut j1 = job(1, 1, 1_000.0, 0.05, 4);
        j1.data_workers.insert(MachineId(0), 4);
        j1.throughput = 0.2;
        let s = Snapshot {
            machines: vec![machine(0, 16)],
            jobs: vec![j1, job(2, 1, 1_000.0, 0.4, 4)],
        };
        let d = decide(Policy::MaxTp, &s, &DecideConfig::default());
        let removed = d
            .iter()
            .filter(|d| matches!(d, Decision::Remove { job: JobId(1), .. }))
            .count();
        assert!(removed >= 3, "{d:?}");
        assert!(matches!(
            d.last(),
            Some(Decision::Add { job: JobId(2), .. })
        ));
    }

    #[test]
    fn feedback_corrects_the_assumed_speedup() {
        let mut f = Feedback::new(0.2);
        assert_eq!(f.observe(0, 0.0), 0.2);
        assert!((f.observe(2, 0.3) - 0.15).abs() < 1e-12);
        // Same count: the estimate stands.
        assert!((f.observe(2, 0.31) - 0.15).abs() < 1e-12);
        // More workers, no gain: they stopped helping.
        assert_eq!(f.observe(4, 0.31), 0.0);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn arb_job(id: u64) -> impl Strategy<Value = JobView> {
            (1u32..9, 1.0f64..1e5, 0.0f64..0.5, 1u32..9, 0u32..6, 0u32..3).prop_map(
                move |(gpus, rem, gain, dwc, have, tw)| {
                    let mut j = job(id, gpus, rem, gain, dwc);
                    j.tw_machines = vec![MachineId(tw)];
                    if have > 0 {
                        j.data_workers.insert(MachineId((tw + 1) % 3), have);
                        j.throughput = (f64::from(have) * gain).min(1.0);
                    }
                    j
                },
            )
        }

        proptest! {
            #[test]
            fn target_respects_capacity_and_consumption(
                cpus in proptest::collection::vec(0u32..64, 3),
                cpu_only_machines in proptest::collection::vec(any::<bool>(), 3),
                jobs in (arb_job(1), arb_job(2), arb_job(3), arb_job(4)),
                p in 0usize..3,
            ) {
                let policy = Policy::ALL[p];
                let mut snapshot = Snapshot {
                    machines: cpus.iter().zip(&cpu_only_machines).enumerate().map(|(i, (c, only))| {
                        MachineView { cpu_only: *only, ..machine(u32::try_from(i).unwrap_or(0), *c) }
                    }).collect(),
                    jobs: vec![jobs.0, jobs.1, jobs.2, jobs.3],
                };
                // The snapshot's current workers must fit its machines.
                for m in &mut snapshot.machines {
                    let used: u32 = snapshot.jobs.iter()
                        .map(|j| j.data_workers.get(&m.id).copied().unwrap_or(0) * j.dw_cpus)
                        .sum();
                    m.dw_cpus += used;
                }
                let config = DecideConfig::default();
                let t = target(policy, &snapshot, &config);
                for m in &snapshot.machines {
                    let used: u32 = snapshot.jobs.iter()
                        .map(|j| t.jobs[&j.id].placement.get(&m.id).copied().unwrap_or(0) * j.dw_cpus)
                        .sum();
                    prop_assert!(used <= m.dw_cpus);
                }
                for j in &snapshot.jobs {
                    let k = t.count(j.id);
                    if k > 0 {
                        // The last worker given was still below the ideal queue state.
                        prop_assert!(j.projected(k - 1) < j.consumption * (1.0 - config.ideal_tolerance));
                    }
                }
                // Applying the decisions to the current placement yields the target.
                let decisions = decide(policy, &snapshot, &config);
                let mut now: BTreeMap<JobId, BTreeMap<MachineId, u32>> = snapshot.jobs.iter()
                    .map(|j| (j.id, j.data_workers.clone())).collect();
                for d in decisions {
                    match d {
                        Decision::Add { job, machine, .. } => {
                            *now.entry(job).or_default().entry(machine).or_insert(0) += 1;
                        }
                        Decision::Remove { job, machine } => {
                            let c = now.entry(job).or_default().entry(machine).or_insert(0);
                            prop_assert!(*c > 0);
                            *c -= 1;
                        }
                        Decision::Migrate { job, from, to } => {
                            let c = now.entry(job).or_default().entry(from).or_insert(0);
                            prop_assert!(*c > 0);
                            *c -= 1;
                            *now.entry(job).or_default().entry(to).or_insert(0) += 1;
                        }
                    }
                }
                for j in &snapshot.jobs {
                    let got: BTreeMap<MachineId, u32> = now[&j.id].iter()
                        .filter(|(_, c)| **c > 0).map(|(m, c)| (*m, *c)).collect();
                    prop_assert_eq!(&got, &t.jobs[&j.id].placement);
                }
            }
        }
    }
}
