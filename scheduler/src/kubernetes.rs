//! The Kubernetes backend's pure half: what the scheduler observes on a cluster, turned into
//! the [`Snapshot`] that [`crate::decide`] takes, and the policy's [`Plan`] turned into what to
//! set on each data-worker pool. No client, no I/O: the kube calls around it (reading nodes,
//! pods, LodeJobs and the dispatchers; patching pools, annotating pods, draining workers,
//! posting Events) belong to the crate that talks to the API server.
//!
//! # Observed facts ([`ClusterFacts`])
//! Units are Kubernetes' own, so that the API's quantities go in without rounding: CPU in
//! millicores (`500m` = 500, `2` = 2000), memory in bytes. The snapshot counts CPUs in
//! millicores too (one `dw_cpus` unit = 1m); `decide` ranks and places the same under any
//! common unit, so nothing is rounded to whole CPUs.
//!
//! # Snapshot ([`ClusterView::snapshot`])
//! - A machine per schedulable node that matches the view's node selector, if any (sorted by
//!   name, `MachineId` = position): data workers may use its allocatable CPU and memory less
//!   what pods other than Lode's data workers request (training pods included), less what data
//!   workers hold that the policy does not plan (draining ones, and those of jobs not yet
//!   measured). A node without GPUs is `cpu_only`.
//! - A job per LodeJob whose dispatcher has been read twice with something computed and
//!   consumed in between: its rates come from [`LiveJob`], exactly as the local backend's.
//!   One unit of `decide`'s allocation is one data-worker pod of any stage; a job of `S` stages
//!   whose stage `s` makes `r_s` steps/s per worker gains `1 / Σ 1/r_s` steps/s per pod when
//!   its pods are split in proportion (the split [`split_by_stage`] makes), and its throughput
//!   now is its slowest stage's `n_s · r_s`. The worker size is the largest stage's CPU request.
//!
//! # Plan ([`ClusterView::plan_pools`])
//! Per pool: the replica count (the job's target count split by stage, clamped to the pool's
//! min/max), a preferred node affinity (the training pod's node first, then the machines in
//! the order the policy's placement chose them, weights 100 down), and for a scale-in the pods
//! to drain first. Applying a pool's plan, in this order:
//! 1. Lode's `Drain` on each drained pod's worker; annotate the pod
//!    [`POD_DELETION_COST_ANNOTATION`] = [`DRAINED_POD_DELETION_COST`] so that the ReplicaSet
//!    removes exactly it when the count drops.
//! 2. For [`AfterDrain::ScaleIn`], set the replicas (the drained pods go); for
//!    [`AfterDrain::Replace`] (a migration: the count stays), delete the pod once drained, so
//!    that its replacement is scheduled under the new affinity.
//! 3. Set the affinity and the replicas of pools that grow.
//!
//! Replicas count active pods only (not terminating, not draining at the dispatcher). A drained
//! pod that is still there after its worker exited (its pool grew meanwhile, so the ReplicaSet
//! kept it) is deleted by the applying side; the ReplicaSet then converges to the count set.
//!
//! A job not measured yet is held: each pool keeps its active pods, at least one (so that it
//! can be measured) and its min, at most its max.
//!
//! # Invariants
//! - A pool's replicas drop below its active pods only with exactly that many of its active
//!   pods named to drain first (property test).
//! - For a measured job with no min/max in the way, the replicas of its pools add up to the
//!   number of workers `decide` gives it: its current workers plus adds less removals.

use std::collections::{BTreeMap, BTreeSet};

use lode_proto::service::v1;
use serde::Serialize;

use crate::ids::{JobId, MachineId};
use crate::live::{LiveJob, QueueReading};
use crate::policy::{Decision, JobView, MachineView, Plan, Policy, Snapshot};

/// The annotation by which a ReplicaSet chooses which pods a scale-in removes (lowest first).
pub const POD_DELETION_COST_ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";
/// The cost given to a drained pod: below any other, so that it is the one removed.
pub const DRAINED_POD_DELETION_COST: i32 = i32::MIN;
/// The weight of the first preferred node (Kubernetes allows 1..=100).
pub const FIRST_AFFINITY_WEIGHT: i32 = 100;
/// How much each later preferred node weighs less than the one before (never below 1).
pub const AFFINITY_WEIGHT_STEP: i32 = 10;
/// Longest Event message (Kubernetes truncates at 1024 bytes).
pub const MAX_EVENT_MESSAGE_BYTES: usize = 1024;

const BYTES_PER_GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Everything the scheduler read from the cluster this round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterFacts {
    pub nodes: Vec<NodeFacts>,
    pub jobs: Vec<JobFacts>,
}

/// One node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeFacts {
    /// `metadata.name`.
    pub name: String,
    /// `status.allocatable.cpu`, millicores.
    pub allocatable_cpu_millicores: u64,
    /// `status.allocatable.memory`, bytes.
    pub allocatable_memory_bytes: u64,
    /// Sum of `resources.requests.cpu` (millicores) of the containers of every pod bound to
    /// this node that is not a Lode data worker and not finished (phase neither `Succeeded`
    /// nor `Failed`): training pods, dispatchers, everything else.
    pub other_cpu_requests_millicores: u64,
    /// The same for `resources.requests.memory`, bytes.
    pub other_memory_requests_bytes: u64,
    /// `status.allocatable["nvidia.com/gpu"]` (or the cluster's GPU resource); 0 for a
    /// CPU-only node.
    pub gpus: u32,
    /// `metadata.labels` (matched against [`ClusterView::with_node_selector`]).
    pub labels: BTreeMap<String, String>,
    /// Ready and not `spec.unschedulable`: only such nodes get data workers; workers on other
    /// nodes are planned away.
    pub schedulable: bool,
}

/// One LodeJob.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JobFacts {
    /// `namespace/name` of the LodeJob (Events go on it).
    pub name: String,
    /// `spec.nodeName` of the training pod; `None` while it is not scheduled.
    pub training_node: Option<String>,
    /// GPUs the training pod requests (0 counts as 1 for MaxTP's GPUs' worth).
    pub training_gpus: u32,
    /// CPU the training pod requests, millicores (SRTF counts it in the job's CPUs).
    pub training_cpu_millicores: u64,
    /// One per stage of the job's cut.
    pub pools: Vec<PoolFacts>,
    /// The job's dispatcher, read this round; `None` when it did not answer.
    pub counters: Option<DispatcherCounters>,
}

/// One stage's data-worker pool (a Deployment, or whatever owns the stage's pods).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PoolFacts {
    /// The stage it serves (the dispatcher's `WorkerEntry.stage`).
    pub stage: u32,
    /// The pool object's name: what the replica count is set on.
    pub name: String,
    /// `resources.requests.cpu` of one worker pod, millicores.
    pub worker_cpu_millicores: u64,
    /// `resources.requests.memory` of one worker pod, bytes.
    pub worker_memory_bytes: u64,
    /// The LodeJob's bounds for this pool (`max_workers` 0 = no bound).
    pub min_workers: u32,
    pub max_workers: u32,
    /// Its pods that exist now.
    pub pods: Vec<WorkerPodFacts>,
}

/// One data-worker pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkerPodFacts {
    /// `metadata.name`; the worker registers with the dispatcher under this name.
    pub name: String,
    /// `spec.nodeName`; `None` while Pending.
    pub node: Option<String>,
    /// `metadata.deletionTimestamp` is set: already going.
    pub terminating: bool,
}

/// A job's dispatcher counters (its `Status` RPC), read at `at_s`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DispatcherCounters {
    /// When it was read, seconds on the scheduler's clock (monotonic).
    pub at_s: f64,
    /// Steps consumed by the training side (through the watermark).
    pub steps_consumed: u64,
    /// Step completions over every stage, and the workers' compute time for them (µs).
    pub steps_computed: u64,
    pub compute_us: u64,
    /// The training side's busy time (µs).
    pub consumer_busy_us: u64,
    pub steps_per_epoch: u64,
    /// Epochs of the job; 0 when it repeats forever.
    pub epochs: u64,
    /// The epoch of the first step not yet consumed.
    pub epoch: u64,
    pub end_of_data: bool,
    /// The registered workers.
    pub workers: Vec<DispatcherWorker>,
}

/// One worker as the dispatcher lists it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DispatcherWorker {
    pub id: u64,
    /// The name it registered with (its pod's name).
    pub name: String,
    pub stage: u32,
    pub draining: bool,
    /// Its step completions and their compute time (µs) since the dispatcher started.
    pub steps_computed: u64,
    pub compute_us: u64,
}

impl DispatcherCounters {
    /// The counters of a `Status` answer read at `at_s`.
    pub fn from_status(status: &v1::StatusResponse, at_s: f64) -> Self {
        Self {
            at_s,
            steps_consumed: status.steps_consumed,
            steps_computed: status.steps_computed,
            compute_us: status.compute_us,
            consumer_busy_us: status.consumer_busy_us,
            steps_per_epoch: status.steps_per_epoch,
            epochs: status.epochs,
            epoch: status.epoch,
            end_of_data: status.end_of_data,
            workers: status
                .workers
                .iter()
                .map(|w| DispatcherWorker {
                    id: w.id,
                    name: w.name.clone(),
                    stage: w.stage,
                    draining: w.status == v1::WorkerStatus::Draining as i32,
                    steps_computed: w.steps_computed,
                    compute_us: w.compute_us,
                })
                .collect(),
        }
    }

    /// Steps still to consume; `None` when the job repeats forever.
    fn remaining_steps(&self) -> Option<u64> {
        (self.epochs > 0).then(|| {
            self.epochs
                .saturating_mul(self.steps_per_epoch)
                .saturating_sub(self.steps_consumed)
        })
    }
}

/// Per-stage production per worker, from the per-worker counters of two readings.
#[derive(Debug, Clone, PartialEq, Default)]
struct StageMeter {
    /// Worker id → (steps computed, compute µs) at the last reading.
    last: BTreeMap<u64, (u64, u64)>,
    /// Steps per second of compute of one worker of this stage.
    rate: Option<f64>,
}

impl StageMeter {
    fn observe<'a>(&mut self, workers: impl Iterator<Item = &'a DispatcherWorker>) {
        let (mut steps, mut us) = (0u64, 0u64);
        let mut now = BTreeMap::new();
        for w in workers {
            // A worker seen before adds what it did since; a new one (or one whose counters
            // went back: the dispatcher restarted) starts its measurement now.
            if let Some(&(s0, u0)) = self.last.get(&w.id) {
                if w.steps_computed >= s0 && w.compute_us >= u0 {
                    steps += w.steps_computed - s0;
                    us += w.compute_us - u0;
                }
            }
            now.insert(w.id, (w.steps_computed, w.compute_us));
        }
        if steps > 0 && us > 0 {
            #[allow(clippy::cast_precision_loss)]
            let rate = steps as f64 / (us as f64 / 1e6);
            self.rate = Some(rate);
        }
        self.last = now;
    }
}

#[derive(Debug, Clone)]
struct JobMeter {
    live: LiveJob,
    stages: BTreeMap<u32, StageMeter>,
}

/// The Kubernetes backend's measurement state across rounds: job ids and each job's meters.
#[derive(Debug, Default)]
pub struct ClusterView {
    ids: BTreeMap<String, JobId>,
    next_id: u64,
    meters: BTreeMap<JobId, JobMeter>,
    /// Labels a node must carry to hold data workers (empty: every node); the pools' pod
    /// templates carry the same `nodeSelector`.
    node_selector: BTreeMap<String, String>,
}

/// A [`Snapshot`] with the names behind its ids.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedSnapshot {
    pub snapshot: Snapshot,
    /// Node name of each `MachineId` (by position).
    pub nodes: Vec<String>,
    /// Each LodeJob's id, measured or not.
    pub jobs: BTreeMap<String, JobId>,
    /// Steps/s of one worker of each stage, per measured job (stage order).
    stage_rates: BTreeMap<JobId, Vec<f64>>,
}

impl ObservedSnapshot {
    pub fn machine(&self, node: &str) -> Option<MachineId> {
        self.nodes
            .iter()
            .position(|n| n == node)
            .and_then(|i| u32::try_from(i).ok())
            .map(MachineId)
    }

    pub fn node(&self, m: MachineId) -> Option<&str> {
        usize::try_from(m.0)
            .ok()
            .and_then(|i| self.nodes.get(i))
            .map(String::as_str)
    }
}

/// The pods of a pool that the policy counts: not terminating, not draining at the dispatcher.
fn active_pods<'a>(
    pool: &'a PoolFacts,
    counters: Option<&DispatcherCounters>,
) -> Vec<&'a WorkerPodFacts> {
    let draining: BTreeSet<&str> = counters
        .map(|c| {
            c.workers
                .iter()
                .filter(|w| w.draining)
                .map(|w| w.name.as_str())
                .collect()
        })
        .unwrap_or_default();
    pool.pods
        .iter()
        .filter(|p| !p.terminating && !draining.contains(p.name.as_str()))
        .collect()
}

fn saturate(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[allow(clippy::cast_precision_loss)]
fn gib(bytes: u64) -> f64 {
    bytes as f64 / BYTES_PER_GIB
}

impl ClusterView {
    pub fn new() -> Self {
        Self::default()
    }

    /// Only nodes whose labels include every pair of `selector` hold data workers (a cluster
    /// that keeps them off, say, its control-plane or its inference nodes).
    pub fn with_node_selector(selector: BTreeMap<String, String>) -> Self {
        Self {
            node_selector: selector,
            ..Self::default()
        }
    }

    fn eligible(&self, node: &NodeFacts) -> bool {
        node.schedulable
            && self
                .node_selector
                .iter()
                .all(|(k, v)| node.labels.get(k) == Some(v))
    }

    /// One round over this round's facts: the snapshot, `decide`'s plan over it, and what to
    /// set on each pool.
    pub fn round(
        &mut self,
        facts: &ClusterFacts,
        policy: Policy,
        config: &crate::DecideConfig,
    ) -> (ObservedSnapshot, Plan, KubePlan) {
        let observed = self.snapshot(facts);
        let plan = crate::policy::plan(policy, &observed.snapshot, config);
        let pools = self.plan_pools(facts, &observed, policy, &plan);
        (observed, plan, pools)
    }

    fn id_of(&mut self, name: &str) -> JobId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = JobId(self.next_id);
        self.next_id += 1;
        self.ids.insert(name.to_owned(), id);
        id
    }

    /// Takes this round's facts: updates each job's meters and builds the snapshot.
    pub fn snapshot(&mut self, facts: &ClusterFacts) -> ObservedSnapshot {
        let mut nodes: Vec<&NodeFacts> = facts.nodes.iter().filter(|n| self.eligible(n)).collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes.dedup_by(|a, b| a.name == b.name);
        let index: BTreeMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        let mut free_cpu: Vec<u64> = nodes
            .iter()
            .map(|n| {
                n.allocatable_cpu_millicores
                    .saturating_sub(n.other_cpu_requests_millicores)
            })
            .collect();
        let mut free_mem: Vec<u64> = nodes
            .iter()
            .map(|n| {
                n.allocatable_memory_bytes
                    .saturating_sub(n.other_memory_requests_bytes)
            })
            .collect();
        let machine = |i: usize| MachineId(u32::try_from(i).unwrap_or(u32::MAX));

        let mut jobs = Vec::new();
        let mut ids = BTreeMap::new();
        let mut stage_rates = BTreeMap::new();
        let present: BTreeSet<&str> = facts.jobs.iter().map(|j| j.name.as_str()).collect();
        self.ids.retain(|name, _| present.contains(name.as_str()));
        let live_ids: BTreeSet<JobId> = self.ids.values().copied().collect();
        self.meters.retain(|id, _| live_ids.contains(id));
        for job in &facts.jobs {
            let id = self.id_of(&job.name);
            ids.insert(job.name.clone(), id);
            let view = self.measure(id, job, &index, machine);
            // What the policy does not plan still holds CPUs: draining and terminating pods,
            // and every pod of a job it does not plan.
            for pool in &job.pools {
                let active: BTreeSet<&str> = active_pods(pool, job.counters.as_ref())
                    .into_iter()
                    .map(|p| p.name.as_str())
                    .collect();
                for pod in &pool.pods {
                    let planned = view.is_some() && active.contains(pod.name.as_str());
                    let on = pod.node.as_deref().and_then(|n| index.get(n));
                    if let (false, Some(&i)) = (planned, on) {
                        free_cpu[i] = free_cpu[i].saturating_sub(pool.worker_cpu_millicores);
                        free_mem[i] = free_mem[i].saturating_sub(pool.worker_memory_bytes);
                    }
                }
            }
            if let Some((view, rates)) = view {
                stage_rates.insert(id, rates);
                jobs.push(view);
            }
        }
        let machines = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| MachineView {
                id: machine(i),
                dw_cpus: saturate(free_cpu[i]),
                dw_mem_gb: gib(free_mem[i]),
                cpu_only: n.gpus == 0,
            })
            .collect();
        ObservedSnapshot {
            snapshot: Snapshot { machines, jobs },
            nodes: nodes.iter().map(|n| n.name.clone()).collect(),
            jobs: ids,
            stage_rates,
        }
    }

    /// Feeds a job's counters to its meters; its view and per-stage rates once measured.
    fn measure(
        &mut self,
        id: JobId,
        job: &JobFacts,
        index: &BTreeMap<&str, usize>,
        machine: impl Fn(usize) -> MachineId,
    ) -> Option<(JobView, Vec<f64>)> {
        let counters = job.counters.as_ref()?;
        let meter = self.meters.entry(id).or_insert_with(|| JobMeter {
            live: LiveJob::new(id),
            stages: BTreeMap::new(),
        });
        let mut pools: Vec<&PoolFacts> = job.pools.iter().collect();
        pools.sort_by_key(|p| p.stage);
        let active: Vec<Vec<&WorkerPodFacts>> = pools
            .iter()
            .map(|p| active_pods(p, Some(counters)))
            .collect();
        let running: u32 = active
            .iter()
            .flatten()
            .filter(|p| p.node.as_deref().is_some_and(|n| index.contains_key(n)))
            .count()
            .try_into()
            .unwrap_or(u32::MAX);
        meter.live.observe(QueueReading {
            at_s: counters.at_s,
            steps_consumed: counters.steps_consumed,
            steps_computed: counters.steps_computed,
            compute_us: counters.compute_us,
            consumer_busy_us: counters.consumer_busy_us,
            workers: running,
            remaining_steps: counters.remaining_steps(),
        });
        for pool in &pools {
            meter
                .stages
                .entry(pool.stage)
                .or_default()
                .observe(counters.workers.iter().filter(|w| w.stage == pool.stage));
        }
        if counters.end_of_data || pools.is_empty() {
            return None;
        }
        let rates = meter.live.rates();
        let consumption = rates.consumption?;
        let average = rates.per_worker?;
        // Each stage's own rate, or the job's average over its stages while a stage has none.
        let stage_rates: Vec<f64> = pools
            .iter()
            .map(|p| {
                meter
                    .stages
                    .get(&p.stage)
                    .and_then(|m| m.rate)
                    .unwrap_or(average)
            })
            .collect();
        if stage_rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
            return None;
        }
        let gain = 1.0 / stage_rates.iter().map(|r| 1.0 / r).sum::<f64>();
        // What the workers the snapshot counts (those on its machines) make, so that the
        // throughput goes with `data_workers`.
        let throughput = active
            .iter()
            .zip(&stage_rates)
            .map(|(pods, r)| {
                #[allow(clippy::cast_precision_loss)]
                let n = pods
                    .iter()
                    .filter(|p| p.node.as_deref().is_some_and(|n| index.contains_key(n)))
                    .count() as f64;
                n * r
            })
            .fold(f64::INFINITY, f64::min);
        let mut data_workers = BTreeMap::new();
        for pod in active.iter().flatten() {
            if let Some(&i) = pod.node.as_deref().and_then(|n| index.get(n)) {
                *data_workers.entry(machine(i)).or_insert(0u32) += 1;
            }
        }
        let tw_machines = job
            .training_node
            .as_deref()
            .and_then(|n| index.get(n))
            .map(|&i| vec![machine(i)])
            .unwrap_or_default();
        let dw_cpus = pools
            .iter()
            .map(|p| saturate(p.worker_cpu_millicores))
            .max()
            .unwrap_or(0)
            .max(1);
        let dw_mem = pools
            .iter()
            .map(|p| p.worker_memory_bytes)
            .max()
            .unwrap_or(0);
        let view = JobView {
            id,
            gpus: job.training_gpus.max(1),
            remaining_steps: meter.live.remaining_steps(),
            tw_machines,
            tw_cpus: saturate(job.training_cpu_millicores),
            dw_cpus,
            dw_mem_gb: gib(dw_mem),
            data_workers,
            throughput: if throughput.is_finite() {
                throughput
            } else {
                0.0
            },
            baseline_throughput: 0.0,
            ideal_throughput: consumption,
            consumption,
            gain_per_dw: gain,
            // As the local backend: a decoupled job trains at zero without a worker, so one
            // worker's worth is owed first.
            floor_throughput: gain.min(consumption),
        };
        Some((view, stage_rates))
    }

    /// What to set on each pool for the policy's plan over `observed` (built from `facts`).
    pub fn plan_pools(
        &self,
        facts: &ClusterFacts,
        observed: &ObservedSnapshot,
        policy: Policy,
        plan: &Plan,
    ) -> KubePlan {
        let mut out = KubePlan::default();
        for job in &facts.jobs {
            let Some(&id) = observed.jobs.get(&job.name) else {
                continue;
            };
            let view = observed.snapshot.jobs.iter().find(|j| j.id == id);
            let (pools, event) = match (view, observed.stage_rates.get(&id)) {
                (Some(view), Some(rates)) => plan_job(job, view, rates, observed, policy, plan),
                _ => hold_job(job),
            };
            out.pools.extend(pools);
            out.events.extend(event);
        }
        out
    }
}

/// What to do with one pool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolPlan {
    /// `namespace/name` of the LodeJob.
    pub job: String,
    pub stage: u32,
    /// The pool object's name.
    pub pool: String,
    /// Active pods now (not terminating, not draining).
    pub active: u32,
    /// The replica count to set.
    pub replicas: u32,
    /// `preferredDuringSchedulingIgnoredDuringExecution` node terms, most preferred first.
    pub affinity: Vec<PreferredNode>,
    /// Pods to drain before anything else is changed, with what follows the drain.
    pub drain: Vec<DrainOrder>,
    /// Set when the pool's min or max moved the count away from the policy's.
    pub clamped: Option<u32>,
}

/// One preferred node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PreferredNode {
    pub node: String,
    /// 1..=100.
    pub weight: i32,
}

/// One pod to drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrainOrder {
    pub pod: String,
    pub node: Option<String>,
    /// The dispatcher's id of its worker (`Drain`'s `worker_id`); `None` when it has not
    /// registered (a Pending pod: nothing to drain, it is only the one removed).
    pub worker_id: Option<u64>,
    pub then: AfterDrain,
}

/// What follows a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AfterDrain {
    /// The pool shrinks: mark the pod with [`DRAINED_POD_DELETION_COST`], then lower the
    /// replicas.
    ScaleIn,
    /// The worker moves: delete the pod once drained; the pool recreates it under the new
    /// affinity.
    Replace,
}

/// An Event on a LodeJob (type `Normal`), also the text of the scheduler's log line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobEvent {
    pub job: String,
    /// `ScaledOut`, `ScaledIn`, `Rebalanced` or `Held`.
    pub reason: &'static str,
    pub message: String,
}

/// Everything the backend applies this round.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct KubePlan {
    pub pools: Vec<PoolPlan>,
    pub events: Vec<JobEvent>,
}

/// Splits `total` workers over stages of per-worker rates `rates`: each next worker goes to the
/// stage that produces least now (`n_s · r_s`, the lowest stage on ties), which keeps the job's
/// throughput `min n_s · r_s` as high as `total` workers allow.
pub fn split_by_stage(total: u32, rates: &[f64]) -> Vec<u32> {
    let mut n = vec![0u32; rates.len()];
    if rates.is_empty() {
        return n;
    }
    for _ in 0..total {
        let mut best = 0;
        for s in 1..rates.len() {
            if f64::from(n[s]) * rates[s] < f64::from(n[best]) * rates[best] {
                best = s;
            }
        }
        n[best] += 1;
    }
    n
}

fn clamp_to_pool(want: u32, pool: &PoolFacts) -> u32 {
    let max = if pool.max_workers == 0 {
        u32::MAX
    } else {
        pool.max_workers
    };
    want.max(pool.min_workers).min(max.max(pool.min_workers))
}

fn worker_ids(job: &JobFacts) -> BTreeMap<&str, u64> {
    job.counters
        .iter()
        .flat_map(|c| c.workers.iter())
        .map(|w| (w.name.as_str(), w.id))
        .collect()
}

/// A job the policy does not plan: each pool keeps its active pods, at least one and its min.
fn hold_job(job: &JobFacts) -> (Vec<PoolPlan>, Option<JobEvent>) {
    let mut pools = Vec::new();
    let mut changed = Vec::new();
    let ids = worker_ids(job);
    let terms: Vec<PreferredNode> = job
        .training_node
        .iter()
        .map(|n| PreferredNode {
            node: n.clone(),
            weight: FIRST_AFFINITY_WEIGHT,
        })
        .collect();
    for pool in &job.pools {
        let pods = active_pods(pool, job.counters.as_ref());
        let active = u32::try_from(pods.len()).unwrap_or(u32::MAX);
        let ended = job.counters.as_ref().is_some_and(|c| c.end_of_data);
        let want = if ended { active } else { active.max(1) };
        let replicas = clamp_to_pool(want, pool);
        // Above the pool's max: the extra pods are drained like any scale-in.
        let drain = scale_in(&pods, replicas, &mut BTreeMap::new(), &terms, &ids);
        if replicas != active {
            let mut line = format!(
                "{} (stage {}): {active} -> {replicas} workers",
                pool.name, pool.stage
            );
            for d in &drain {
                line.push_str(&format!("; drain {}", d.pod));
            }
            changed.push(line);
        }
        pools.push(PoolPlan {
            job: job.name.clone(),
            stage: pool.stage,
            pool: pool.name.clone(),
            active,
            replicas,
            affinity: terms.clone(),
            drain,
            clamped: None,
        });
    }
    let event = (!changed.is_empty()).then(|| JobEvent {
        job: job.name.clone(),
        reason: "Held",
        message: truncate(format!(
            "not measured yet (its dispatcher needs two readings with steps computed and consumed); {}",
            changed.join("; ")
        )),
    });
    (pools, event)
}

/// The affinity of a job's pools: its training pod's node, then the policy's placement order.
fn affinity(
    job: &JobFacts,
    order: &[MachineId],
    observed: &ObservedSnapshot,
) -> Vec<PreferredNode> {
    let mut names: Vec<&str> = Vec::new();
    for name in job
        .training_node
        .as_deref()
        .into_iter()
        .chain(order.iter().filter_map(|m| observed.node(*m)))
    {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let mut weight = FIRST_AFFINITY_WEIGHT;
    names
        .into_iter()
        .map(|node| {
            let term = PreferredNode {
                node: node.to_owned(),
                weight,
            };
            weight = (weight - AFFINITY_WEIGHT_STEP).max(1);
            term
        })
        .collect()
}

/// The pods to drain for a pool going from `active` pods to `replicas`: Pending pods first
/// (they hold nothing), then pods on nodes where the job has more workers than the policy's
/// target (`surplus`, consumed), then the least preferred nodes, then by name.
fn scale_in(
    active: &[&WorkerPodFacts],
    replicas: u32,
    surplus: &mut BTreeMap<String, u32>,
    terms: &[PreferredNode],
    ids: &BTreeMap<&str, u64>,
) -> Vec<DrainOrder> {
    let excess = active.len().saturating_sub(replicas as usize);
    let rank = |node: Option<&str>| {
        node.and_then(|n| terms.iter().position(|t| t.node == n))
            .unwrap_or(usize::MAX)
    };
    let mut candidates = active.to_vec();
    candidates.sort_by_key(|p| {
        let on_surplus = p
            .node
            .as_ref()
            .is_some_and(|n| surplus.get(n).is_some_and(|s| *s > 0));
        (
            p.node.is_some(),
            !on_surplus,
            std::cmp::Reverse(rank(p.node.as_deref())),
            p.name.clone(),
        )
    });
    let mut drain = Vec::with_capacity(excess);
    for pod in candidates.into_iter().take(excess) {
        if let Some(s) = pod.node.as_ref().and_then(|n| surplus.get_mut(n)) {
            *s = s.saturating_sub(1);
        }
        drain.push(DrainOrder {
            pod: pod.name.clone(),
            node: pod.node.clone(),
            worker_id: ids.get(pod.name.as_str()).copied(),
            then: AfterDrain::ScaleIn,
        });
    }
    drain
}

fn plan_job(
    job: &JobFacts,
    view: &JobView,
    rates: &[f64],
    observed: &ObservedSnapshot,
    policy: Policy,
    plan: &Plan,
) -> (Vec<PoolPlan>, Option<JobEvent>) {
    let empty = crate::policy::JobTarget::default();
    let target = plan.target.jobs.get(&view.id).unwrap_or(&empty);
    let terms = affinity(job, &target.order, observed);
    // Where the job has more workers than its target: the nodes decide removes or moves from.
    let mut surplus: BTreeMap<String, u32> = BTreeMap::new();
    for (m, have) in &view.data_workers {
        let need = target.placement.get(m).copied().unwrap_or(0);
        if let (Some(node), true) = (observed.node(*m), *have > need) {
            surplus.insert(node.to_owned(), have - need);
        }
    }
    let ids = worker_ids(job);
    let mut pools: Vec<&PoolFacts> = job.pools.iter().collect();
    pools.sort_by_key(|p| p.stage);
    let split = split_by_stage(target.count(), rates);
    let mut plans = Vec::new();
    let mut chosen: BTreeSet<String> = BTreeSet::new();
    for (pool, &want) in pools.iter().zip(&split) {
        let active = active_pods(pool, job.counters.as_ref());
        let replicas = clamp_to_pool(want, pool);
        let n_active = u32::try_from(active.len()).unwrap_or(u32::MAX);
        let drain = scale_in(&active, replicas, &mut surplus, &terms, &ids);
        chosen.extend(drain.iter().map(|d| d.pod.clone()));
        plans.push(PoolPlan {
            job: job.name.clone(),
            stage: pool.stage,
            pool: pool.name.clone(),
            active: n_active,
            replicas,
            affinity: terms.clone(),
            drain,
            clamped: (replicas != want).then_some(want),
        });
    }
    // Migrations: a worker on a node still over its target is drained and replaced.
    let mut moves = plan
        .decisions
        .iter()
        .filter(|d| matches!(d, Decision::Migrate { job, .. } if *job == view.id))
        .count();
    for (plan_entry, pool) in plans.iter_mut().zip(&pools) {
        for pod in active_pods(pool, job.counters.as_ref()) {
            if moves == 0 {
                break;
            }
            let Some(node) = pod.node.as_ref() else {
                continue;
            };
            let over = surplus.get_mut(node).filter(|s| **s > 0);
            if let (Some(s), false) = (over, chosen.contains(&pod.name)) {
                *s -= 1;
                moves -= 1;
                chosen.insert(pod.name.clone());
                plan_entry.drain.push(DrainOrder {
                    pod: pod.name.clone(),
                    node: Some(node.clone()),
                    worker_id: ids.get(pod.name.as_str()).copied(),
                    then: AfterDrain::Replace,
                });
            }
        }
    }
    let event = job_event(job, view.id, &plans, policy, plan);
    (plans, event)
}

fn job_event(
    job: &JobFacts,
    id: JobId,
    plans: &[PoolPlan],
    policy: Policy,
    plan: &Plan,
) -> Option<JobEvent> {
    let grows = plans.iter().any(|p| p.replicas > p.active);
    let shrinks = plans.iter().any(|p| p.replicas < p.active);
    let moves = plans
        .iter()
        .any(|p| p.drain.iter().any(|d| d.then == AfterDrain::Replace));
    if !(grows || shrinks || moves) {
        return None;
    }
    let reason = match (grows, shrinks, moves) {
        (true, false, false) => "ScaledOut",
        (false, true, false) => "ScaledIn",
        _ => "Rebalanced",
    };
    let metrics: Vec<String> = plan
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Add { job, metric, .. } if *job == id => Some(format!("{metric:.4}")),
            _ => None,
        })
        .collect();
    let mut parts = Vec::new();
    for p in plans {
        let mut part = format!(
            "{} (stage {}): {} -> {} workers",
            p.pool, p.stage, p.active, p.replicas
        );
        if let Some(want) = p.clamped {
            part.push_str(&format!(
                " (the policy's {want}, held by the pool's min/max)"
            ));
        }
        for d in &p.drain {
            let what = match d.then {
                AfterDrain::ScaleIn => "scale-in",
                AfterDrain::Replace => "move",
            };
            part.push_str(&format!(
                "; drain {} on {} ({what})",
                d.pod,
                d.node.as_deref().unwrap_or("no node")
            ));
        }
        parts.push(part);
    }
    let prefer: Vec<&str> = plans
        .first()
        .map(|p| p.affinity.iter().map(|t| t.node.as_str()).collect())
        .unwrap_or_default();
    let mut message = format!("{}: {}", policy.name(), parts.join("; "));
    if !metrics.is_empty() {
        message.push_str(&format!(
            "; added for {} {}",
            policy.name(),
            metrics.join(", ")
        ));
    }
    if !prefer.is_empty() {
        message.push_str(&format!("; preferred nodes {}", prefer.join(", ")));
    }
    Some(JobEvent {
        job: job.name.clone(),
        reason,
        message: truncate(message),
    })
}

/// Cuts a message to [`MAX_EVENT_MESSAGE_BYTES`] at a character boundary.
fn truncate(mut message: String) -> String {
    if message.len() > MAX_EVENT_MESSAGE_BYTES {
        let mut end = MAX_EVENT_MESSAGE_BYTES - 3;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

#[cfg(test)]
mod tests;
