//! lode-scheduler: moves data workers to where they help most.
//!
//! GoldMiner's scheduler (SIGMOD 2023, §3.4) in two layers, both pure code with no I/O (only
//! the [`local`] backend talks to processes, files and dispatchers):
//! job-level tuning decides how a job uses data workers from its queue state, and cluster-level
//! allocation shares the cluster's CPUs among jobs under MaxTP, SRTF or Fair. Backends carry
//! the decisions out; the discrete-event simulator is the first, reproducing the paper's
//! cluster experiment (§5.6).
//!
//! # Layout
//! - [`tuner`]: the job-level tuning state machine (`TunerState::apply(observation, now)`).
//! - [`policy`]: `decide(policy, snapshot)`, the cluster-level allocation and placement, and
//!   the speedup [`policy::Feedback`].
//! - [`backend`]: the `Backend` trait and one scheduling `round`.
//! - [`live`]: a live job's dispatcher counters turned into rates and a `JobView` (the local
//!   backend's measurements, pure).
//! - [`kubernetes`]: the Kubernetes backend's pure half: observed nodes, pools, pods and
//!   dispatcher counters → the snapshot; the policy's plan → each pool's replicas, node
//!   affinity and the pods to drain first, and an Event per decision.
//! - [`local`]: the live scheduler on this machine (`lode scheduler`): job announcements, the
//!   local backend (starts and drains `lode worker` processes) and its round loop;
//!   `WorkerCommand`, the one way any Lode process starts a local worker.
//! - [`live_tuner`]: the job-level tuner applied to a live job: probe workers sized from their
//!   measured speedups, the fallback, and the tuned job's `JobView` (pure).
//! - [`sim`]: the discrete-event simulator (a `Backend`) and the paper's baseline schedulers.
//! - [`model`]: the simulator's ground-truth workload model (scaling curves per model type).
//! - [`trace`]: the job trace CSV format and synthetic Philly-like traces.
//! - [`experiment`]: the paper's cluster experiment as one call (`lode simulate`): a trace
//!   under each scheduler, Table 5 rows, and the files it writes.
//! - [`cluster`]: cluster specs such as `8x8gpu64cpu`.
//! - [`report`]: Table 5-like summaries, per-job CSV and the utilisation SVG.
//! - `rng`: a seeded SplitMix64, so that every run is reproducible from its seed.
//!
//! # Invariants
//! - Policies see only what a live scheduler could measure (throughput, consumption, the last
//!   observed speedup per worker); the simulator's curves stay behind the backend.
//! - [`policy::decide`] never plans more data-worker CPUs or memory on a machine than the
//!   snapshot says data workers may use, never gives a worker to a job at the ideal queue
//!   state, and its decisions applied in order turn the current placement into its target.
//! - The simulator never over-commits a machine's GPUs, CPUs or memory, never places a
//!   training worker on a CPU-only machine, and the same trace, configuration and seed give the
//!   same results.
//! - The Kubernetes mapping lowers a pool below its active pods only with exactly that many of
//!   them named to drain first.
//! - No panics on untrusted input: traces, cluster specs and observations are validated with
//!   errors that name the line, field or value.

pub mod backend;
pub mod cluster;
pub mod experiment;
pub mod ids;
pub mod kubernetes;
pub mod live;
pub mod live_tuner;
pub mod local;
pub mod model;
pub mod policy;
pub mod report;
mod rng;
pub mod sim;
pub mod trace;
pub mod tuner;

pub use backend::Backend;
pub use cluster::ClusterSpec;
pub use ids::{JobId, MachineId};
pub use policy::{decide, plan, DecideConfig, Decision, Plan, Policy, Snapshot};
pub use sim::{simulate, SchedulerKind, SimConfig, SimResult};
pub use trace::{SyntheticConfig, Trace};
pub use tuner::{TunerConfig, TunerState};

/// Errors of the scheduler crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cluster spec {spec:?}, group {group:?}: {reason}")]
    ClusterSpec {
        spec: String,
        group: String,
        reason: &'static str,
    },
    #[error("line {line}: {problem}")]
    Trace {
        line: usize,
        #[source]
        problem: trace::TraceProblem,
    },
    #[error("observation field {field} is {value}; expected a finite, non-negative number")]
    BadObservation { field: &'static str, value: f64 },
    #[error("observation has {got} stage rates but the job has {expected} stages")]
    StageCount { expected: usize, got: usize },
    #[error("time went backwards: observation at {now_s} s after one at {last_s} s")]
    TimeWentBackwards { last_s: f64, now_s: f64 },
    #[error("a job needs at least one data-worker stage")]
    NoStages,
    #[error("tuner setting {field} is out of range")]
    TunerConfig { field: &'static str },
    #[error("{job} needs {gpus} GPUs but no set of machines in the cluster can hold it")]
    JobTooLarge { job: JobId, gpus: u32 },
    #[error(
        "{job} can never finish: what it was given trains it at zero throughput (no CPUs beyond \
         its training worker's own) and nothing else will change"
    )]
    JobStalled { job: JobId },
    #[error(
        "unknown scheduler {name:?} (known: no-dw-tuned, no-dw-hw, fixed-dw, maxtp, srtf, fair)"
    )]
    UnknownScheduler { name: String },
}

impl Error {
    /// Whether the input (a trace, a spec, a name) is at fault rather than the program.
    pub fn is_input_error(&self) -> bool {
        !matches!(self, Error::TimeWentBackwards { .. })
    }
}
