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
//!   name, `MachineId` = position): data workers may
//!   use its allocatable CPU and memory less what pods other than Lode's data workers request
//!   (training pods included), less what data workers hold that the policy does not plan
//!   (draining ones, and those of jobs not yet measured). A node without GPUs is `cpu_only`.
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
mod tests {
    use super::*;
    use crate::policy::{decide, plan, target, DecideConfig};

    const GIB: u64 = 1 << 30;

    fn node(name: &str, alloc_m: u64, other_m: u64, gpus: u32) -> NodeFacts {
        NodeFacts {
            name: name.to_owned(),
            allocatable_cpu_millicores: alloc_m,
            allocatable_memory_bytes: 256 * GIB,
            other_cpu_requests_millicores: other_m,
            other_memory_requests_bytes: 0,
            gpus,
            labels: BTreeMap::new(),
            schedulable: true,
        }
    }

    fn pod(name: &str, node: Option<&str>) -> WorkerPodFacts {
        WorkerPodFacts {
            name: name.to_owned(),
            node: node.map(str::to_owned),
            terminating: false,
        }
    }

    fn pool(stage: u32, name: &str, cpu_m: u64, pods: Vec<WorkerPodFacts>) -> PoolFacts {
        PoolFacts {
            stage,
            name: name.to_owned(),
            worker_cpu_millicores: cpu_m,
            worker_memory_bytes: GIB,
            min_workers: 0,
            max_workers: 0,
            pods,
        }
    }

    /// A job's counters after `secs` of training with its pods' workers each making `rate`
    /// steps/s of compute and the training side consuming at most `consume` steps/s of busy
    /// time (single-stage unless the pools say otherwise: every stage computes every step).
    fn counters(job: &JobFacts, secs: f64, rate: f64, consume: f64) -> DispatcherCounters {
        let per_stage: Vec<usize> = job.pools.iter().map(|p| p.pods.len()).collect();
        #[allow(clippy::cast_precision_loss)]
        let production = per_stage
            .iter()
            .map(|n| *n as f64 * rate)
            .fold(f64::INFINITY, f64::min);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let steps = (production.min(consume) * secs) as u64;
        let mut workers = Vec::new();
        let mut id = 1;
        for pool in &job.pools {
            let n = u64::try_from(pool.pods.len()).unwrap_or(1).max(1);
            for p in &pool.pods {
                let mine = steps / n;
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss
                )]
                let us = (mine as f64 / rate * 1e6) as u64;
                workers.push(DispatcherWorker {
                    id,
                    name: p.name.clone(),
                    stage: pool.stage,
                    draining: false,
                    steps_computed: mine,
                    compute_us: us,
                });
                id += 1;
            }
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        DispatcherCounters {
            at_s: secs,
            steps_consumed: steps,
            steps_computed: workers.iter().map(|w| w.steps_computed).sum(),
            compute_us: workers.iter().map(|w| w.compute_us).sum(),
            consumer_busy_us: (steps as f64 / consume * 1e6) as u64,
            steps_per_epoch: 1_000_000,
            epochs: 1,
            epoch: 0,
            end_of_data: false,
            workers,
        }
    }

    /// Two jobs with different appetites: `a` has one 4-CPU worker making 25 steps/s for a
    /// training side that takes 100 (it wants four); `b` has three 2-CPU workers of 100 steps/s
    /// each for a training side that takes 100 (one would do). Their training pods are on
    /// `gpu-a` and `gpu-b`; `cpu-1` is a CPU-only node. `free_m` is what data workers may use
    /// on each node beyond the workers already there.
    fn two_jobs(free_m: [u64; 3]) -> (ClusterFacts, [(f64, f64); 2]) {
        let a = JobFacts {
            name: "ml/a".to_owned(),
            training_node: Some("gpu-a".to_owned()),
            training_gpus: 4,
            training_cpu_millicores: 4_000,
            pools: vec![pool(
                0,
                "a-stage-0",
                4_000,
                vec![pod("a-0-x1", Some("gpu-a"))],
            )],
            counters: None,
        };
        let b = JobFacts {
            name: "ml/b".to_owned(),
            training_node: Some("gpu-b".to_owned()),
            training_gpus: 1,
            training_cpu_millicores: 1_000,
            pools: vec![pool(
                0,
                "b-stage-0",
                2_000,
                vec![
                    pod("b-0-x1", Some("gpu-b")),
                    pod("b-0-x2", Some("gpu-b")),
                    pod("b-0-x3", Some("gpu-b")),
                ],
            )],
            counters: None,
        };
        // Allocatable 64 CPUs; everything not free for data workers is other pods' requests
        // (the Lode workers already there are not "other").
        let facts = ClusterFacts {
            nodes: vec![
                node("gpu-a", 64_000, 64_000 - free_m[0] - 4_000, 8),
                node("gpu-b", 64_000, 64_000 - free_m[1] - 6_000, 8),
                node("cpu-1", 64_000, 64_000 - free_m[2], 0),
            ],
            jobs: vec![a, b],
        };
        (facts, [(25.0, 100.0), (100.0, 100.0)])
    }

    /// Reads the facts twice, 10 s apart, as two scheduler rounds would.
    fn observe(
        facts: &ClusterFacts,
        rates: &[(f64, f64)],
    ) -> (ClusterView, ClusterFacts, ObservedSnapshot) {
        let mut view = ClusterView::new();
        let mut round = facts.clone();
        for (job, (rate, consume)) in round.jobs.iter_mut().zip(rates) {
            job.counters = Some(counters(job, 0.0, *rate, *consume));
        }
        let first = view.snapshot(&round);
        assert!(
            first.snapshot.jobs.is_empty(),
            "one reading measures nothing"
        );
        for (job, (rate, consume)) in round.jobs.iter_mut().zip(rates) {
            job.counters = Some(counters(job, 10.0, *rate, *consume));
        }
        let observed = view.snapshot(&round);
        (view, round, observed)
    }

    fn decided_count(observed: &ObservedSnapshot, decisions: &[Decision], job: JobId) -> u32 {
        let view = observed
            .snapshot
            .jobs
            .iter()
            .find(|j| j.id == job)
            .expect("measured");
        let adds = decisions
            .iter()
            .filter(|d| matches!(d, Decision::Add { job: j, .. } if *j == job))
            .count();
        let removes = decisions
            .iter()
            .filter(|d| matches!(d, Decision::Remove { job: j, .. } if *j == job))
            .count();
        u32::try_from(view.dw_count() as usize + adds - removes).expect("small")
    }

    #[test]
    fn the_snapshot_counts_in_millicores_and_marks_cpu_only_nodes() {
        let (facts, rates) = two_jobs([8_000, 0, 16_000]);
        let (_, _, observed) = observe(&facts, &rates);
        let s = &observed.snapshot;
        assert_eq!(observed.nodes, ["cpu-1", "gpu-a", "gpu-b"]);
        let cpus: Vec<(u32, bool)> = s.machines.iter().map(|m| (m.dw_cpus, m.cpu_only)).collect();
        // Free capacity plus the Lode workers already there.
        assert_eq!(cpus, [(16_000, true), (12_000, false), (6_000, false)]);
        let a = &s.jobs[0];
        assert_eq!((a.dw_cpus, a.tw_cpus, a.gpus), (4_000, 4_000, 4));
        assert_eq!(a.tw_machines, [MachineId(1)]);
        assert!((a.gain_per_dw - 25.0).abs() < 0.5, "{a:?}");
        assert!((a.consumption - 100.0).abs() < 1.0, "{a:?}");
        assert_eq!(s.jobs[1].data_workers.get(&MachineId(2)), Some(&3));
    }

    #[test]
    fn replicas_and_affinities_are_what_decide_chose_under_every_policy() {
        // Ample room, then tight room (the CPU-only node holds one 4-CPU worker, gpu-a none).
        for free in [[32_000, 8_000, 64_000], [0, 0, 4_000]] {
            let (facts, rates) = two_jobs(free);
            let (view, round, observed) = observe(&facts, &rates);
            let config = DecideConfig::default();
            for policy in Policy::ALL {
                let decisions = decide(policy, &observed.snapshot, &config);
                let p = plan(policy, &observed.snapshot, &config);
                assert_eq!(p.decisions, decisions);
                let k = view.plan_pools(&round, &observed, policy, &p);
                let t = target(policy, &observed.snapshot, &config);
                for (name, training) in [("ml/a", "gpu-a"), ("ml/b", "gpu-b")] {
                    let id = observed.jobs[name];
                    let pools: Vec<&PoolPlan> = k.pools.iter().filter(|p| p.job == name).collect();
                    assert_eq!(pools.len(), 1);
                    assert_eq!(
                        pools[0].replicas,
                        decided_count(&observed, &decisions, id),
                        "{policy:?} {free:?} {name}: {decisions:?}"
                    );
                    let mut want = vec![training.to_owned()];
                    for m in &t.jobs[&id].order {
                        let n = observed.node(*m).expect("a node").to_owned();
                        if !want.contains(&n) {
                            want.push(n);
                        }
                    }
                    let got: Vec<String> =
                        pools[0].affinity.iter().map(|t| t.node.clone()).collect();
                    assert_eq!(got, want, "{policy:?} {free:?} {name}");
                    // Every node decide adds a worker on is preferred.
                    for d in &decisions {
                        if let Decision::Add { job, machine, .. }
                        | Decision::Migrate {
                            job, to: machine, ..
                        } = d
                        {
                            if *job == id {
                                assert!(got
                                    .iter()
                                    .any(|n| Some(n.as_str()) == observed.node(*machine)));
                            }
                        }
                    }
                    let weights: Vec<i32> = pools[0].affinity.iter().map(|t| t.weight).collect();
                    assert_eq!(weights.first(), Some(&100));
                    assert!(weights.windows(2).all(|w| w[0] > w[1] || w[1] == 1));
                }
            }
        }
    }

    #[test]
    fn with_room_a_grows_to_four_and_b_drains_two_of_its_three() {
        let (facts, rates) = two_jobs([32_000, 8_000, 64_000]);
        let (view, round, observed) = observe(&facts, &rates);
        for policy in Policy::ALL {
            let p = plan(policy, &observed.snapshot, &DecideConfig::default());
            let k = view.plan_pools(&round, &observed, policy, &p);
            let a = k.pools.iter().find(|p| p.job == "ml/a").expect("a");
            let b = k.pools.iter().find(|p| p.job == "ml/b").expect("b");
            assert_eq!((a.active, a.replicas), (1, 4), "{policy:?}");
            assert!(a.drain.is_empty());
            assert_eq!((b.active, b.replicas), (3, 1), "{policy:?}");
            // The two drained are named with their dispatcher ids, and removed by the scale-in.
            let drained: Vec<(&str, Option<u64>, AfterDrain)> = b
                .drain
                .iter()
                .map(|d| (d.pod.as_str(), d.worker_id, d.then))
                .collect();
            assert_eq!(
                drained,
                [
                    ("b-0-x1", Some(1), AfterDrain::ScaleIn),
                    ("b-0-x2", Some(2), AfterDrain::ScaleIn)
                ]
            );
            let reasons: Vec<(&str, &str)> = k
                .events
                .iter()
                .map(|e| (e.job.as_str(), e.reason))
                .collect();
            assert_eq!(reasons, [("ml/a", "ScaledOut"), ("ml/b", "ScaledIn")]);
            let msg = &k.events[1].message;
            assert!(
                msg.starts_with(policy.name())
                    && msg.contains("1 workers")
                    && msg.contains("drain b-0-x1 on gpu-b"),
                "{msg}"
            );
        }
    }

    #[test]
    fn a_worker_on_another_node_moves_home_by_drain_and_replace() {
        // Job a's one worker sits on the CPU-only node while its training node has room: MaxTP
        // moves it home; with Deployments that is a drain, then the pod's deletion.
        let (mut facts, rates) = two_jobs([32_000, 8_000, 64_000]);
        facts.jobs[0].pools[0].pods = vec![pod("a-0-x1", Some("cpu-1"))];
        facts.nodes[0].other_cpu_requests_millicores = 0;
        facts.nodes[2].other_cpu_requests_millicores = 64_000 - 4_000 - 4_000;
        let rates = [(25.0, 25.5), rates[1]];
        let (view, round, observed) = observe(&facts, &rates);
        let p = plan(Policy::MaxTp, &observed.snapshot, &DecideConfig::default());
        assert!(
            p.decisions
                .iter()
                .any(|d| matches!(d, Decision::Migrate { .. })),
            "{:?}",
            p.decisions
        );
        let k = view.plan_pools(&round, &observed, Policy::MaxTp, &p);
        let a = k.pools.iter().find(|p| p.job == "ml/a").expect("a");
        assert_eq!((a.active, a.replicas), (1, 1));
        assert_eq!(a.affinity[0].node, "gpu-a");
        assert_eq!(a.drain.len(), 1);
        assert_eq!(a.drain[0].then, AfterDrain::Replace);
        assert_eq!(a.drain[0].node.as_deref(), Some("cpu-1"));
        assert_eq!(k.events[0].reason, "Rebalanced");
    }

    #[test]
    fn an_unmeasured_job_is_held_and_its_workers_keep_their_cpus() {
        let (mut facts, _) = two_jobs([0, 0, 8_000]);
        facts.jobs[1].pools[0].min_workers = 2;
        let mut view = ClusterView::new();
        let observed = view.snapshot(&facts);
        assert!(observed.snapshot.jobs.is_empty());
        // b's three workers are not planned, so their CPUs are not the policy's to give.
        let gpu_b = observed.machine("gpu-b").expect("node");
        assert_eq!(observed.snapshot.machines[gpu_b.0 as usize].dw_cpus, 0);
        let p = plan(Policy::Fair, &observed.snapshot, &DecideConfig::default());
        let k = view.plan_pools(&facts, &observed, Policy::Fair, &p);
        let counts: Vec<(u32, u32)> = k.pools.iter().map(|p| (p.active, p.replicas)).collect();
        assert_eq!(counts, [(1, 1), (3, 3)]);
        assert!(k.events.is_empty());
        // A job with no worker at all gets one, so that it can be measured.
        facts.jobs[0].pools[0].pods.clear();
        let observed = view.snapshot(&facts);
        let k = view.plan_pools(&facts, &observed, Policy::Fair, &p);
        assert_eq!((k.pools[0].active, k.pools[0].replicas), (0, 1));
        assert_eq!(k.events[0].reason, "Held");
    }

    #[test]
    fn a_node_selector_keeps_data_workers_to_matching_nodes() {
        let (mut facts, rates) = two_jobs([32_000, 8_000, 64_000]);
        for n in &mut facts.nodes {
            if n.name != "gpu-b" {
                n.labels.insert("pool".to_owned(), "data".to_owned());
            }
        }
        let mut view = ClusterView::with_node_selector(BTreeMap::from([(
            "pool".to_owned(),
            "data".to_owned(),
        )]));
        let mut round = facts.clone();
        for at in [0.0, 10.0] {
            for (job, (rate, consume)) in round.jobs.iter_mut().zip(&rates) {
                job.counters = Some(counters(job, at, *rate, *consume));
            }
            view.snapshot(&round);
        }
        let (observed, _, k) = view.round(&round, Policy::MaxTp, &DecideConfig::default());
        assert_eq!(observed.nodes, ["cpu-1", "gpu-a"]);
        // b's three workers sit on a node data workers may not use: they are planned away,
        // and b's one worker goes to a matching node.
        let b = k.pools.iter().find(|p| p.job == "ml/b").expect("b");
        assert_eq!((b.active, b.replicas, b.drain.len()), (3, 1, 2));
        assert!(
            b.affinity.iter().skip(1).all(|t| t.node != "gpu-b"),
            "{b:?}"
        );
    }

    #[test]
    fn stages_are_split_so_the_slowest_stage_is_fed() {
        // Stage 0 makes 30 steps/s per worker, stage 1 10: three stage-1 workers per stage-0.
        assert_eq!(split_by_stage(8, &[30.0, 10.0]), [2, 6]);
        assert_eq!(split_by_stage(1, &[30.0, 10.0]), [1, 0]);
        assert_eq!(split_by_stage(2, &[30.0, 10.0]), [1, 1]);
        assert_eq!(split_by_stage(0, &[5.0]), [0]);
        assert!(split_by_stage(3, &[]).is_empty());
    }

    #[test]
    fn status_answers_become_counters() {
        let status = v1::StatusResponse {
            steps_consumed: 7,
            steps_computed: 9,
            compute_us: 11,
            consumer_busy_us: 13,
            steps_per_epoch: 100,
            epochs: 2,
            workers: vec![v1::WorkerEntry {
                id: 4,
                stage: 1,
                status: v1::WorkerStatus::Draining as i32,
                name: "p".to_owned(),
                steps_computed: 3,
                compute_us: 5,
                ..Default::default()
            }],
            ..Default::default()
        };
        let c = DispatcherCounters::from_status(&status, 2.5);
        assert_eq!(c.remaining_steps(), Some(193));
        assert_eq!(
            c.workers,
            [DispatcherWorker {
                id: 4,
                name: "p".to_owned(),
                stage: 1,
                draining: true,
                steps_computed: 3,
                compute_us: 5
            }]
        );
        assert_eq!((c.at_s, c.steps_computed, c.consumer_busy_us), (2.5, 9, 13));
    }

    #[test]
    fn long_event_messages_are_cut_at_a_character_boundary() {
        let m = truncate("é".repeat(MAX_EVENT_MESSAGE_BYTES));
        assert!(m.len() <= MAX_EVENT_MESSAGE_BYTES && m.ends_with("..."));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        struct ArbPool {
            cpu_m: u64,
            min: u32,
            max: u32,
            /// Node index per pod (`None`: Pending), and whether it is terminating.
            pods: Vec<(Option<usize>, bool)>,
        }

        fn arb_pool() -> impl Strategy<Value = ArbPool> {
            (
                1u64..16,
                0u32..3,
                0u32..7,
                proptest::collection::vec(
                    (
                        proptest::option::weighted(0.85, 0usize..4),
                        proptest::bool::weighted(0.1),
                    ),
                    0..6,
                ),
            )
                .prop_map(|(cpu, min, max, pods)| ArbPool {
                    cpu_m: cpu * 500,
                    min,
                    max,
                    pods,
                })
        }

        fn arb_job() -> impl Strategy<Value = (Vec<ArbPool>, usize, f64, f64)> {
            (
                proptest::collection::vec(arb_pool(), 1..3),
                0usize..4,
                1.0f64..200.0,
                1.0f64..500.0,
            )
        }

        fn build(
            nodes: &[(u64, u64, bool, bool)],
            jobs: &[(Vec<ArbPool>, usize, f64, f64)],
        ) -> ClusterFacts {
            let names: Vec<String> = (0..nodes.len()).map(|i| format!("n{i}")).collect();
            ClusterFacts {
                nodes: nodes
                    .iter()
                    .enumerate()
                    .map(|(i, &(alloc, other, gpu, ok))| NodeFacts {
                        schedulable: ok,
                        ..node(
                            &names[i],
                            alloc * 1_000,
                            (other * 1_000).min(alloc * 1_000),
                            if gpu { 8 } else { 0 },
                        )
                    })
                    .collect(),
                jobs: jobs
                    .iter()
                    .enumerate()
                    .map(|(j, (pools, tn, _, _))| JobFacts {
                        name: format!("ns/j{j}"),
                        training_node: names.get(*tn).cloned(),
                        training_gpus: 1,
                        training_cpu_millicores: 1_000,
                        pools: pools
                            .iter()
                            .enumerate()
                            .map(|(s, p)| PoolFacts {
                                min_workers: p.min,
                                max_workers: p.max,
                                pods: p
                                    .pods
                                    .iter()
                                    .enumerate()
                                    .map(|(k, (n, term))| WorkerPodFacts {
                                        name: format!("j{j}-s{s}-{k}"),
                                        node: n.and_then(|n| names.get(n).cloned()),
                                        terminating: *term,
                                    })
                                    .collect(),
                                ..pool(
                                    u32::try_from(s).unwrap_or(0),
                                    &format!("j{j}-s{s}"),
                                    p.cpu_m,
                                    Vec::new(),
                                )
                            })
                            .collect(),
                        counters: None,
                    })
                    .collect(),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]

            /// Whatever the cluster: a pool shrinks below its active pods only with exactly
            /// that many of them named to drain first; no pod is named twice or drained when it
            /// is not active; replicas respect the pool's bounds; and a measured job's pools
            /// without bounds add up to what decide gives it.
            #[test]
            fn a_scale_in_names_its_pods_first_and_counts_follow_decide(
                nodes in proptest::collection::vec((1u64..64, 0u64..64, any::<bool>(), proptest::bool::weighted(0.9)), 1..5),
                jobs in proptest::collection::vec(arb_job(), 1..4),
                p in 0usize..3,
            ) {
                let policy = Policy::ALL[p];
                let facts = build(&nodes, &jobs);
                let rates: Vec<(f64, f64)> = jobs.iter().map(|j| (j.2, j.3)).collect();
                let mut view = ClusterView::new();
                let mut round = facts.clone();
                for (job, (rate, consume)) in round.jobs.iter_mut().zip(&rates) {
                    job.counters = Some(counters(job, 0.0, *rate, *consume));
                }
                view.snapshot(&round);
                for (job, (rate, consume)) in round.jobs.iter_mut().zip(&rates) {
                    job.counters = Some(counters(job, 10.0, *rate, *consume));
                }
                let observed = view.snapshot(&round);
                let plan = plan(policy, &observed.snapshot, &DecideConfig::default());
                let k = view.plan_pools(&round, &observed, policy, &plan);
                let mut named = BTreeSet::new();
                for (job, facts_job) in jobs.iter().zip(&round.jobs) {
                    let pools: Vec<&PoolPlan> = k.pools.iter().filter(|p| p.job == facts_job.name).collect();
                    prop_assert_eq!(pools.len(), facts_job.pools.len());
                    for (pp, pf) in pools.iter().zip(&facts_job.pools) {
                        let active: BTreeSet<&str> = active_pods(pf, facts_job.counters.as_ref())
                            .iter().map(|p| p.name.as_str()).collect();
                        prop_assert_eq!(pp.active as usize, active.len());
                        let scale_in = pp.drain.iter().filter(|d| d.then == AfterDrain::ScaleIn).count();
                        prop_assert_eq!(scale_in, pp.active.saturating_sub(pp.replicas) as usize, "{:?}", pp);
                        for d in &pp.drain {
                            prop_assert!(active.contains(d.pod.as_str()), "{:?}", d);
                            prop_assert!(named.insert(d.pod.clone()), "named twice: {:?}", d);
                        }
                        prop_assert!(pp.replicas >= pf.min_workers);
                        if pf.max_workers >= pf.min_workers && pf.max_workers > 0 {
                            prop_assert!(pp.replicas <= pf.max_workers);
                        }
                    }
                    let id = observed.jobs[&facts_job.name];
                    let unbounded = job.0.iter().all(|p| p.min == 0 && p.max == 0);
                    if unbounded && observed.snapshot.jobs.iter().any(|j| j.id == id) {
                        let total: u32 = pools.iter().map(|p| p.replicas).sum();
                        prop_assert_eq!(total, decided_count(&observed, &plan.decisions, id));
                    }
                }
            }
        }
    }
}
