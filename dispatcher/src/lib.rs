//! lode-dispatcher: owns one job's data order and hands it out to data workers.
//!
//! The core is pure code with no I/O: a deterministic map from `(epoch, step)` to an index
//! batch, and a lease table written as a synchronous state machine with time passed in
//! (`DispatcherState::apply(command, now) -> Result<Vec<Event>>`). The gRPC service and the
//! journal file wrap it: they decode a request, apply it, journal the returned events and
//! answer. [`serve`] is the entry point a binary calls.
//!
//! # Layout
//! - [`ids`]: newtype ids (`JobId`, `WorkerId`, `StageId`, `Epoch`, `Step`, `StepId`) and `Time`;
//!   a `StepId` is numbered through `lode_proto::step::StepRef`, the one step conversion.
//! - [`config`]: [`DispatcherConfig`], validated with errors that name the field.
//! - [`from_plan`]: a plan directory's source and stage graphs turned into a
//!   [`DispatcherConfig`] and a [`ServiceConfig`], every number checked; the lease order
//!   computed without a job (`DispatcherConfig::program_steps`, for `lode exec`).
//! - [`batch`]: [`index_batch`], the records of a step: TensorFlow's order for a config with a
//!   chain, else Lode's own (a seeded per-epoch permutation).
//! - [`order`]: TensorFlow's order on indices: [`IndexChain`] (skip, take, repeat, shuffle,
//!   batch in program order), its walk, and [`StepOrder`], which computes each step once and
//!   keeps it until consumed.
//! - [`philox`]: TensorFlow's Philox4x32-10 stream and shuffle seed generators, bit for bit.
//! - [`state`]: [`DispatcherState`], its [`Command`]s and [`Event`]s, and journal replay.
//! - [`journal`]: the append-only, CRC-checked JSON-lines file of applied events, with torn-tail
//!   recovery.
//! - [`service`]: the tonic service (`lode.v1.Dispatcher`, see `lode_proto::service`),
//!   [`serve`] and [`ServiceConfig`], [`DispatcherThread`] (a dispatcher on a thread of its
//!   own), the injected [`Clock`], the lease-expiry ticker and the named limits.
//!
//! # Invariants
//! - `index_batch(config, step)` depends on the config and the step alone, and a re-leased or
//!   replayed step gets the identical batch on every run and machine. Lode's own order
//!   partitions an epoch's records (each once, less a dropped remainder); a chain yields what
//!   TensorFlow's pipeline yields, element for element (an unseeded shuffle's picked seed is
//!   part of the config, so the journal keeps it).
//! - Each `(stage, epoch, step)` completes at most once, and only from the worker that holds
//!   its lease; a report of a step the worker does not hold is rejected.
//! - A step at or below the consumed watermark is never leased again; steps are first leased in
//!   order; a returned (expired or revoked) step is leased again before any new one.
//! - Stage `k > 0` leases a step only after stage `k - 1` completed it.
//! - A draining worker gets no new lease and is removed once it holds none.
//! - A rejected command changes nothing; an accepted one changes exactly what its events say,
//!   so [`DispatcherState::replay`] of the journal equals the live state.
//! - No command sequence panics: commands come from the network.
//! - The service answers a request only after the events it caused are written to the
//!   journal, and fsync'ed first where "Durability" below says so; a request with a missing or
//!   wrong token, or for another job, changes nothing.
//!
//! # Durability
//! The journal is one append-only file written in the order the state changed, so whatever a
//! crash leaves of it is a prefix of the event history (a torn last line is cut away on open),
//! and every prefix replays to a state the dispatcher really was in. The question is which
//! answers may run ahead of the disk, i.e. which facts may be forgotten after a crash without
//! breaking exactly-once delivery per epoch. The receiver (the training side's DWRecv) is what
//! makes delivery exactly-once: it delivers steps in order and drops any step it holds or has
//! delivered; the dispatcher's job is that every step of the epoch is leased until delivered,
//! always with the identical batch. Hence:
//!
//! - **Recomputable, answered once journaled (no `fdatasync`)**: `Lease`, `Complete`,
//!   `Heartbeat`. A lease is a function of the journal's epoch and watermark: a forgotten grant
//!   puts the step back in the never-leased range, so it is leased again with the identical
//!   batch ([`index_batch`] depends on the config and step alone); the worker that held it
//!   finds its `Complete` refused (routine) and the receiver drops its duplicate push. A
//!   forgotten completion makes the step leased again and pushed again, which the receiver
//!   drops; a completion need not be durable before delivery, since delivery is what the
//!   consumer's watermark records. A forgotten heartbeat is a worker seen slightly earlier.
//! - **Durable before the answer (one group-committed `fdatasync`)**: `Register` (a worker id
//!   handed out must never be handed out again), `Consumed` (the training side may act on the
//!   acknowledged watermark: a consumer restarted without a checkpoint continues after it),
//!   `RegisterConsumer` (a rewind to a checkpoint must not be forgotten, or the steps after the
//!   checkpoint would never be leased again), `Drain` (the scheduler acts on it), and every
//!   tick. A sync covers every line written before it, so a durable watermark implies that
//!   the grants it depends on are durable too.
//!
//! The service hands journal lines to a writer thread of their own ([`Journal::write_behind`]),
//! which writes them in order, several in one `write`, so that a `write` held up behind an
//! `fdatasync` holds up no request under the lock. A SIGKILL of the dispatcher or an OS crash
//! at any instant therefore leaves a prefix that holds every line up to the last synced answer,
//! and may lack any of the unsynced lines after it; those are exactly the answers listed as
//! recomputable above. The ticker syncs every [`service::TICK_INTERVAL`], which bounds that
//! window. The crash-point test
//! (`service/crash_tests.rs`) replays every prefix of recorded journals, torn lines included,
//! against
//! a receiver and workers that remember more than the journal, and checks that every step of
//! every epoch is delivered exactly once, in order, with its batch.
//!
//! # Compaction
//! The journal grows with the job's history (about 30 bytes a step), and a restart replays all
//! of it. Once it has grown by [`service::ServiceConfig::journal_compact_bytes`] (64 MiB by
//! default, or four times the last snapshot if that is more), the service replaces it by its
//! header and one [`journal::Record::Snapshot`] of the state, under its lock, between two
//! requests ([`journal::Journal::compact`]): everything appended before is synced, the new
//! file is written beside the old one, synced, renamed over it, and the directory synced. A
//! crash at any instant leaves the old journal whole (a leftover beside it is removed on open)
//! or the new one, and both replay to the same state; since the rename follows a sync of
//! everything before it, a compaction is a sync point too. A snapshot is checked on replay as
//! events are: [`DispatcherState::restore`] refuses any snapshot no run of events could have
//! built. The crash-point test runs with a compacting journal as well, every compaction
//! included, and a kill while the new file is half written.

pub mod batch;
pub mod config;
pub mod from_plan;
pub mod ids;
pub mod journal;
pub mod order;
pub mod philox;
pub mod service;
pub mod state;

#[cfg(test)]
mod tests;

pub use batch::{index_batch, Batches};
pub use config::{DispatcherConfig, Shuffle, DEFAULT_MAX_LEASES};
pub use from_plan::{plan_source, PlanConfigError, ProgramSteps, RunSettings};
pub use ids::{Epoch, JobId, StageId, Step, StepId, Time, WorkerId};
pub use journal::{pick_seed, Journal, JournalError};
pub use order::{IndexChain, PickedSeed, StepOrder};
pub use service::{
    serve, Clock, DispatcherThread, ManualClock, MonotonicClock, ServeError, ServiceConfig,
};
pub use state::{
    Command, DispatcherState, Event, GrantedBatch, Lease, StageSnapshot, StateSnapshot, WorkerInfo,
    WorkerSnapshot, WorkerStatus, MIN_LEASE_SHARE, PROTOCOL_VERSION,
};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the dispatcher core.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid dispatcher config: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error("{worker} speaks protocol version {got}, the dispatcher {expected}")]
    ProtocolMismatch {
        worker: WorkerId,
        expected: u32,
        got: u32,
    },
    #[error("{worker} is already registered")]
    WorkerExists { worker: WorkerId },
    #[error("{worker} was drained or lost; register under a new id")]
    WorkerRetired { worker: WorkerId },
    #[error("{worker} is not registered")]
    UnknownWorker { worker: WorkerId },
    #[error("{stage} does not exist; the plan has {stages} stage(s)")]
    UnknownStage { stage: StageId, stages: u32 },
    #[error("{worker} is registered for {registered}, not {stage}")]
    WrongStage {
        worker: WorkerId,
        stage: StageId,
        registered: StageId,
    },
    #[error("{step} is outside the job")]
    StepOutOfRange { step: StepId },
    #[error("{worker} does not hold {step} of {stage}")]
    NotHeld {
        worker: WorkerId,
        stage: StageId,
        step: StepId,
    },
    #[error("{worker} is draining and gets no new lease")]
    Draining { worker: WorkerId },
    #[error("{worker} already holds {limit} lease(s)")]
    LeaseLimit { worker: WorkerId, limit: u32 },
    #[error("no step of {stage} is ready to lease yet")]
    NoStepReady { stage: StageId },
    #[error("every step of {stage} is done")]
    StageFinished { stage: StageId },
    #[error("watermark {watermark} is ahead of every step leased to the last stage")]
    WatermarkAhead { watermark: StepId },
    #[error("the job can end only at the training side's watermark: asked to end after {last}, watermark {}", watermark.map_or_else(|| "none".to_owned(), |w| w.to_string()))]
    EndNotAtWatermark {
        last: StepId,
        watermark: Option<StepId>,
    },
    #[error("journal event {index}: {reason}")]
    Journal { index: usize, reason: &'static str },
    /// A compacted journal's snapshot describes no state the events could have built.
    #[error("journal snapshot: {reason}")]
    Snapshot { reason: &'static str },
    /// A bug in this crate: `apply` emitted an event that its own checks refuse. The events
    /// before it in the same command were applied but are not returned; tests pin that this
    /// never happens.
    #[error("internal invariant broken (a bug in lode-dispatcher): {reason}")]
    Invariant { reason: &'static str },
}

impl Error {
    /// The same request may succeed later (after a completion, a tick or an upstream stage).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::LeaseLimit { .. } | Self::NoStepReady { .. })
    }

    /// The request itself is refused (wrong, stale or hostile); the state is unchanged and
    /// repeating it will not help.
    pub fn is_rejection(&self) -> bool {
        matches!(
            self,
            Self::ProtocolMismatch { .. }
                | Self::WorkerExists { .. }
                | Self::WorkerRetired { .. }
                | Self::UnknownWorker { .. }
                | Self::UnknownStage { .. }
                | Self::WrongStage { .. }
                | Self::StepOutOfRange { .. }
                | Self::NotHeld { .. }
                | Self::Draining { .. }
                | Self::WatermarkAhead { .. }
                | Self::EndNotAtWatermark { .. }
        )
    }
}
