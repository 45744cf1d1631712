//! The lease table: a synchronous state machine with time passed in.
//!
//! [`DispatcherState::apply`] checks a [`Command`] against the state without changing it, then
//! emits the [`Event`]s that describe its effect, applying each as it is emitted. Every change
//! of state goes through [`DispatcherState::apply_event`], so the list of applied events (the
//! journal) rebuilds the state exactly ([`DispatcherState::replay`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::batch::batch_in;
use crate::config::DispatcherConfig;
use crate::ids::{StageId, StepId, Time, WorkerId};
use crate::order::StepOrder;
use crate::{Error, Result};

/// The protocol version a data worker must speak to register (the service protocol's, defined
/// beside it in `lode_proto::service` so that workers see the same number).
pub const PROTOCOL_VERSION: u32 = lode_proto::service::PROTOCOL_VERSION;

/// A request to the dispatcher, from a data worker, the training side or the service layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    RegisterWorker {
        worker: WorkerId,
        stage: StageId,
        protocol_version: u32,
    },
    /// Liveness only: it does not extend leases, so that a slow worker's steps still go to
    /// another worker at their deadline. Deciding that a silent worker is lost is the service
    /// layer's (it then sends [`Command::WorkerLost`]).
    Heartbeat { worker: WorkerId },
    /// Lease the next step for the worker's stage: a returned (expired or revoked) step first,
    /// lowest first, otherwise the next step in order. Lease expiry happens on [`Command::Tick`]
    /// only, so the service layer ticks before serving lease requests.
    RequestLease { worker: WorkerId },
    /// Lease up to `max` steps at once, as [`Command::RequestLease`] picks them one after the
    /// other, within the worker's lease limit: at least one, or the error the first would get.
    RequestLeases { worker: WorkerId, max: u32 },
    /// The worker has delivered `step` of `stage`.
    Complete {
        worker: WorkerId,
        stage: StageId,
        step: StepId,
    },
    /// The worker has delivered each of `steps` of `stage`: the ones it holds complete, the
    /// others (a lease that expired and went elsewhere, or that the watermark retired) are
    /// skipped, so one late step does not refuse the rest. An unknown worker, another stage or
    /// a step outside the job refuses the whole command.
    CompleteSteps {
        worker: WorkerId,
        stage: StageId,
        steps: Vec<StepId>,
    },
    /// The training side has consumed every step up to and including `watermark`.
    Consumed { watermark: StepId },
    /// The training side stops after `last`, its watermark: the job ends there (an endless
    /// or longer job is cut short). Every held lease is revoked and nothing more is leased,
    /// so workers are told end of data; a later [`Command::Rewind`] reopens the job.
    EndJob { last: StepId },
    /// Scale-in: no new leases for the worker; it finishes what it holds, then it may go.
    Drain { worker: WorkerId },
    /// The worker is gone (its connection dropped, or it stopped heartbeating); what it held is
    /// leased again.
    WorkerLost { worker: WorkerId },
    /// Expire the leases whose deadline is at or before `now`.
    Tick,
    /// A (new) receiver registered: whatever an earlier receiver buffered is gone, so every
    /// step completed and not yet consumed is leased again (and recomputed identically), and
    /// every held lease is revoked (its step may have gone to the old receiver already).
    ReceiverReset,
    /// The training side restarted from a checkpoint that had consumed every step before
    /// `next` (and none after): the watermark moves to the step before `next`, backwards or
    /// forwards, and every lease and completion after it is dropped, so that the steps from
    /// `next` on are leased again (and recomputed identically). `next` may be one past the
    /// last step of a finite job.
    Rewind { next: StepId },
}

/// A granted step's index batch: its record ids when granted, only their CRC once read back
/// from a journal. The ids are the config's batch for the step, a function of the config and
/// the step alone, so the journal keeps a CRC-32C of them (of the ids as little-endian u64s,
/// one after another) against which a replay checks the batch it recomputes: a grant takes
/// about 11 bytes of a run's line (see [`crate::journal::Record::Granted`]) where its ids took
/// over 200, and a build whose data order differs from the one that wrote the journal is
/// still refused. In JSON, the ids as an array (format 1) or the CRC as a number (format 2,
/// which is what is written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantedBatch {
    Records(Vec<u64>),
    Crc(u32),
}

impl GrantedBatch {
    /// The CRC the journal keeps of `records`.
    pub fn crc_of(records: &[u64]) -> u32 {
        records
            .iter()
            .fold(0, |crc, r| crc32c::crc32c_append(crc, &r.to_le_bytes()))
    }

    /// The CRC of the batch's ids.
    pub fn crc(&self) -> u32 {
        match self {
            GrantedBatch::Records(records) => Self::crc_of(records),
            GrantedBatch::Crc(crc) => *crc,
        }
    }

    /// The batch as the journal keeps it: its CRC.
    pub fn to_crc(&self) -> GrantedBatch {
        GrantedBatch::Crc(self.crc())
    }

    /// The record ids, when this grant still has them (it was made here, not read back).
    pub fn records(&self) -> Option<&[u64]> {
        match self {
            GrantedBatch::Records(records) => Some(records),
            GrantedBatch::Crc(_) => None,
        }
    }

    /// Whether `records` are this batch (by their CRC when only the CRC is known).
    pub fn is(&self, records: &[u64]) -> bool {
        match self {
            GrantedBatch::Records(mine) => mine == records,
            GrantedBatch::Crc(crc) => *crc == Self::crc_of(records),
        }
    }
}

impl Serialize for GrantedBatch {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_u32(self.crc())
    }
}

impl<'de> Deserialize<'de> for GrantedBatch {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = GrantedBatch;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a batch's CRC-32C (a number) or its record ids (an array)")
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
                u32::try_from(v)
                    .map(GrantedBatch::Crc)
                    .map_err(|_| E::custom(format!("a batch's CRC-32C is 32 bits, not {v}")))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut records = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(r) = seq.next_element::<u64>()? {
                    records.push(r);
                }
                Ok(GrantedBatch::Records(records))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A change of state; the journal is the list of applied events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    WorkerRegistered {
        worker: WorkerId,
        stage: StageId,
        at: Time,
    },
    WorkerHeartbeat {
        worker: WorkerId,
        at: Time,
    },
    LeaseGranted {
        worker: WorkerId,
        stage: StageId,
        step: StepId,
        deadline: Time,
        /// The step's index batch. A grant's journal line keeps only its CRC (journals of
        /// format 1 listed the ids, under `records`).
        #[serde(alias = "records")]
        batch: GrantedBatch,
    },
    /// The deadline passed; the step goes back to be leased again.
    LeaseExpired {
        worker: WorkerId,
        stage: StageId,
        step: StepId,
    },
    /// The worker was lost; the step goes back to be leased again.
    LeaseRevoked {
        worker: WorkerId,
        stage: StageId,
        step: StepId,
    },
    /// The training side consumed the step while it was still leased; it is done.
    LeaseRetired {
        worker: WorkerId,
        stage: StageId,
        step: StepId,
    },
    StepCompleted {
        worker: WorkerId,
        stage: StageId,
        step: StepId,
    },
    WatermarkAdvanced {
        watermark: StepId,
    },
    /// The training side ended the job after consuming `last` (see [`Command::EndJob`]).
    JobEnded {
        last: StepId,
    },
    WorkerDraining {
        worker: WorkerId,
    },
    /// A draining worker holds nothing more; it is removed and may exit.
    WorkerDrained {
        worker: WorkerId,
    },
    /// A lost worker is removed (after its leases were revoked).
    WorkerLost {
        worker: WorkerId,
    },
    /// A completed, unconsumed step goes back to be leased again (its receiver was lost).
    StepReturned {
        stage: StageId,
        step: StepId,
    },
    /// The last step of the last epoch has been consumed.
    EndOfData {
        last: StepId,
    },
    /// The training side restarted from a checkpoint: everything before `next` is consumed,
    /// nothing after it is leased or completed (leases were revoked first).
    Rewound {
        next: StepId,
    },
    /// Every lease was revoked at once (a receiver registered, or the training side rewound):
    /// the lease generation goes up, and workers drop what they hold from an older one.
    LeasesReset,
}

/// One leased step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub worker: WorkerId,
    pub deadline: Time,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerStatus {
    Active,
    Draining,
}

/// A registered data worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    pub stage: StageId,
    pub status: WorkerStatus,
    pub last_seen: Time,
    /// The steps it holds, as sequence numbers of its stage.
    leases: BTreeSet<u64>,
}

impl WorkerInfo {
    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }
}

/// The lease table of one stage. Steps are numbered by a sequence number
/// `epoch · steps_per_epoch + step`, so that "in order" is integer order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct StageState {
    /// The next step never leased before.
    next: u64,
    /// Steps that were leased and came back (expired or revoked), to be leased again first.
    pending: BTreeSet<u64>,
    leases: BTreeMap<u64, Lease>,
    /// Steps completed and not yet consumed.
    completed: BTreeSet<u64>,
}

/// The fewest leases [`DispatcherState::lease_share`] gives a worker, however many share the
/// window: enough to lease the next steps while computing.
pub const MIN_LEASE_SHARE: u32 = 4;

/// The dispatcher's state: workers, leases per stage, the consumed watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatcherState {
    config: DispatcherConfig,
    per_epoch: u64,
    total: Option<u64>,
    lease_ms: u64,
    stages: Vec<StageState>,
    workers: BTreeMap<WorkerId, WorkerInfo>,
    /// Workers that drained or were lost; their ids are never accepted again, so that a late
    /// message from a worker given up for dead cannot be mistaken for a live one.
    retired: BTreeSet<WorkerId>,
    /// Sequence number of the last consumed step.
    watermark: Option<u64>,
    end_of_data: bool,
    /// How many times every lease was revoked at once ([`Event::LeasesReset`]).
    generation: u64,
    /// A chain config's steps, walked once and kept until consumed (a cache: it compares equal
    /// for equal configs whatever it holds).
    order: Option<StepOrder>,
}

impl DispatcherState {
    /// A fresh dispatcher: no workers, nothing leased, nothing consumed.
    pub fn new(config: DispatcherConfig) -> Result<Self> {
        config.validate()?;
        let stages = usize::try_from(config.stages).map_err(|_| Error::InvalidConfig {
            field: "stages",
            reason: "too many".into(),
        })?;
        Ok(Self {
            per_epoch: config.steps_per_epoch(),
            total: config.total_steps(),
            lease_ms: config.lease_millis(),
            stages: vec![StageState::default(); stages],
            workers: BTreeMap::new(),
            retired: BTreeSet::new(),
            watermark: None,
            end_of_data: false,
            generation: 0,
            order: config.step_order(),
            config,
        })
    }

    /// Rebuilds the state from a journal. Every event is checked against the state it applies
    /// to, and every granted batch against the config, so that a corrupt journal, or one written
    /// under another dataset or seed, is an error rather than a silently different data order.
    pub fn replay<'a>(
        config: DispatcherConfig,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Self> {
        let mut state = Self::new(config)?;
        for (index, event) in events.into_iter().enumerate() {
            state.replay_event(index, event)?;
        }
        Ok(state)
    }

    /// One step of [`Self::replay`]: checks and applies the journal's event number `index`
    /// (which the error names), for a replay that reads the journal as it goes.
    pub fn replay_event(&mut self, index: usize, event: &Event) -> Result<()> {
        if let Event::LeaseGranted { step, batch, .. } = event {
            if !self.batch(*step).is_ok_and(|records| batch.is(&records)) {
                return Err(Error::Journal {
                    index,
                    reason: "the granted batch differs from the config's batch for that step",
                });
            }
        }
        self.apply_event(event)
            .map_err(|reason| Error::Journal { index, reason })
    }

    pub fn config(&self) -> &DispatcherConfig {
        &self.config
    }

    /// The config's steps per epoch, computed once (a chain's walks its plan).
    pub fn steps_per_epoch(&self) -> u64 {
        self.per_epoch
    }

    /// One step as a single in-process worker and an eager training side take it: lease the
    /// next step of `worker`'s stage, complete it and consume it. The events, in order (the
    /// first is the grant); for one-stage jobs in tests and benchmarks of the order.
    pub fn lease_complete_consume(&mut self, worker: WorkerId, now: Time) -> Result<Vec<Event>> {
        let mut events = self.apply(Command::RequestLease { worker }, now)?;
        let Some(Event::LeaseGranted { stage, step, .. }) = events.first().cloned() else {
            return Err(Error::Invariant {
                reason: "a granted lease did not start with its grant",
            });
        };
        events.extend(self.apply(
            Command::Complete {
                worker,
                stage,
                step,
            },
            now,
        )?);
        events.extend(self.apply(Command::Consumed { watermark: step }, now)?);
        Ok(events)
    }

    /// The records of `step`: the chain's cached walk, or Lode's own order.
    fn batch(&mut self, step: StepId) -> Result<Vec<u64>> {
        batch_in(&self.config, self.order.as_mut(), step)
    }

    /// The last step the training side consumed.
    pub fn watermark(&self) -> Option<StepId> {
        self.watermark.map(|s| self.step_of(s))
    }

    pub fn is_end_of_data(&self) -> bool {
        self.end_of_data
    }

    /// The lease generation (see [`Event::LeasesReset`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn worker(&self, worker: WorkerId) -> Option<&WorkerInfo> {
        self.workers.get(&worker)
    }

    pub fn workers(&self) -> impl Iterator<Item = (WorkerId, &WorkerInfo)> {
        self.workers.iter().map(|(w, info)| (*w, info))
    }

    /// Workers that drained or were lost: their ids are never accepted again.
    pub fn retired(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.retired.iter().copied()
    }

    /// A worker of `stage`'s lease limit when the training side's receiver buffers `window`
    /// steps: the window shared among the stage's active workers (so that their leases
    /// together are not too far ahead of it), at least [`MIN_LEASE_SHARE`], at most the
    /// configured limit per worker.
    pub fn lease_share(&self, stage: StageId, window: u64) -> u32 {
        let max = self.config.max_leases_per_worker;
        let active = self
            .workers
            .values()
            .filter(|w| w.stage == stage && w.status == WorkerStatus::Active)
            .count()
            .max(1);
        let share = window / u64::try_from(active).unwrap_or(u64::MAX);
        u32::try_from(share)
            .unwrap_or(u32::MAX)
            .clamp(MIN_LEASE_SHARE.min(max), max)
    }

    /// The steps `worker` holds, in order.
    pub fn leases_of(&self, worker: WorkerId) -> Vec<StepId> {
        self.workers
            .get(&worker)
            .map(|info| info.leases.iter().map(|s| self.step_of(*s)).collect())
            .unwrap_or_default()
    }

    /// Every lease, by stage then step.
    pub fn leases(&self) -> Vec<(StageId, StepId, Lease)> {
        let mut out = Vec::new();
        for (i, stage) in self.stages.iter().enumerate() {
            let id = StageId(u32::try_from(i).unwrap_or(u32::MAX));
            out.extend(stage.leases.iter().map(|(s, l)| (id, self.step_of(*s), *l)));
        }
        out
    }

    /// The lease of `step` in `stage`, if it is leased.
    pub fn lease(&self, stage: StageId, step: StepId) -> Option<Lease> {
        let seq = self.seq_of(step)?;
        self.stage(stage)?.leases.get(&seq).copied()
    }

    /// Whether `stage` has a returned step (its lease expired or was revoked) waiting to be
    /// leased again: likely the one the training side waits for.
    pub fn has_returned(&self, stage: StageId) -> bool {
        self.stage(stage).is_some_and(|st| !st.pending.is_empty())
    }

    /// Whether `stage` completed `step` and the training side has not consumed it yet.
    pub fn is_completed(&self, stage: StageId, step: StepId) -> bool {
        match (self.stage(stage), self.seq_of(step)) {
            (Some(st), Some(seq)) => st.completed.contains(&seq),
            _ => false,
        }
    }

    /// Applies one command at time `now`. On error nothing changed; on success the returned
    /// events, in order, are what changed (possibly nothing, e.g. a repeated report).
    pub fn apply(&mut self, command: Command, now: Time) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        match command {
            Command::RegisterWorker {
                worker,
                stage,
                protocol_version,
            } => {
                if protocol_version != PROTOCOL_VERSION {
                    return Err(Error::ProtocolMismatch {
                        worker,
                        expected: PROTOCOL_VERSION,
                        got: protocol_version,
                    });
                }
                if self.workers.contains_key(&worker) {
                    return Err(Error::WorkerExists { worker });
                }
                if self.retired.contains(&worker) {
                    return Err(Error::WorkerRetired { worker });
                }
                if self.stage(stage).is_none() {
                    return Err(Error::UnknownStage {
                        stage,
                        stages: self.config.stages,
                    });
                }
                self.emit(
                    &mut out,
                    Event::WorkerRegistered {
                        worker,
                        stage,
                        at: now,
                    },
                )?;
            }
            Command::Heartbeat { worker } => {
                self.known(worker)?;
                self.emit(&mut out, Event::WorkerHeartbeat { worker, at: now })?;
            }
            Command::RequestLease { worker } => self.grant(&mut out, worker, 1, now)?,
            Command::RequestLeases { worker, max } => self.grant(&mut out, worker, max, now)?,
            Command::CompleteSteps {
                worker,
                stage,
                steps,
            } => {
                let info = self.known(worker)?;
                if info.stage != stage {
                    return Err(Error::WrongStage {
                        worker,
                        stage,
                        registered: info.stage,
                    });
                }
                let mut seqs = Vec::with_capacity(steps.len());
                for &step in &steps {
                    seqs.push(self.seq_of(step).ok_or(Error::StepOutOfRange { step })?);
                }
                for (step, seq) in steps.into_iter().zip(seqs) {
                    // Re-read: a step listed twice is held only the first time.
                    let held = self
                        .workers
                        .get(&worker)
                        .is_some_and(|info| info.leases.contains(&seq));
                    if held {
                        self.emit(
                            &mut out,
                            Event::StepCompleted {
                                worker,
                                stage,
                                step,
                            },
                        )?;
                    }
                }
                self.finish_drained(&mut out, [worker])?;
            }
            Command::Complete {
                worker,
                stage,
                step,
            } => {
                let info = self.known(worker)?;
                if info.stage != stage {
                    return Err(Error::WrongStage {
                        worker,
                        stage,
                        registered: info.stage,
                    });
                }
                let seq = self.seq_of(step).ok_or(Error::StepOutOfRange { step })?;
                if !info.leases.contains(&seq) {
                    return Err(Error::NotHeld {
                        worker,
                        stage,
                        step,
                    });
                }
                self.emit(
                    &mut out,
                    Event::StepCompleted {
                        worker,
                        stage,
                        step,
                    },
                )?;
                self.finish_drained(&mut out, [worker])?;
            }
            Command::Consumed { watermark } => {
                let seq = self
                    .seq_of(watermark)
                    .ok_or(Error::StepOutOfRange { step: watermark })?;
                if self.watermark.is_some_and(|w| w >= seq) {
                    // A late or repeated report: the training side only moves forward.
                    return Ok(out);
                }
                if self.stages.last().is_none_or(|last| seq >= last.next) {
                    return Err(Error::WatermarkAhead { watermark });
                }
                self.emit(&mut out, Event::WatermarkAdvanced { watermark })?;
                let mut touched = Vec::new();
                for (stage, step, lease) in self.leases() {
                    if step <= watermark {
                        touched.push(lease.worker);
                        self.emit(
                            &mut out,
                            Event::LeaseRetired {
                                worker: lease.worker,
                                stage,
                                step,
                            },
                        )?;
                    }
                }
                self.finish_drained(&mut out, touched)?;
                if self.total == seq.checked_add(1) {
                    self.emit(&mut out, Event::EndOfData { last: watermark })?;
                }
            }
            Command::EndJob { last } => {
                let seq = self
                    .seq_of(last)
                    .ok_or(Error::StepOutOfRange { step: last })?;
                if self.end_of_data && self.watermark == Some(seq) {
                    return Ok(out); // a repeated request
                }
                if self.watermark != Some(seq) {
                    return Err(Error::EndNotAtWatermark {
                        last,
                        watermark: self.watermark(),
                    });
                }
                let touched = self.revoke_all(&mut out)?;
                self.emit(&mut out, Event::JobEnded { last })?;
                self.finish_drained(&mut out, touched)?;
            }
            Command::Drain { worker } => {
                if self.known(worker)?.status == WorkerStatus::Draining {
                    return Ok(out);
                }
                self.emit(&mut out, Event::WorkerDraining { worker })?;
                self.finish_drained(&mut out, [worker])?;
            }
            Command::WorkerLost { worker } => {
                let info = self.known(worker)?;
                let stage = info.stage;
                let held: Vec<u64> = info.leases.iter().copied().collect();
                for seq in held {
                    let step = self.step_of(seq);
                    self.emit(
                        &mut out,
                        Event::LeaseRevoked {
                            worker,
                            stage,
                            step,
                        },
                    )?;
                }
                self.emit(&mut out, Event::WorkerLost { worker })?;
            }
            Command::ReceiverReset => {
                // A held lease may already have been pushed to the old receiver, with its
                // Complete still on the way (a worker completes in batches): completing it
                // now would retire a step the new receiver never saw. So every lease is
                // revoked; a late Complete is refused as not held, and the step is redone.
                let touched = self.revoke_all(&mut out)?;
                self.emit(&mut out, Event::LeasesReset)?;
                let mut returned = Vec::new();
                for (i, st) in self.stages.iter().enumerate() {
                    let stage = StageId(u32::try_from(i).unwrap_or(u32::MAX));
                    for &seq in &st.completed {
                        returned.push((stage, self.step_of(seq)));
                    }
                }
                for (stage, step) in returned {
                    self.emit(&mut out, Event::StepReturned { stage, step })?;
                }
                self.finish_drained(&mut out, touched)?;
            }
            Command::Rewind { next } => {
                let seq = self
                    .seq_or_end(next)
                    .ok_or(Error::StepOutOfRange { step: next })?;
                let touched = self.revoke_all(&mut out)?;
                self.emit(&mut out, Event::LeasesReset)?;
                self.emit(&mut out, Event::Rewound { next })?;
                self.finish_drained(&mut out, touched)?;
                if let Some(last) = seq.checked_sub(1).filter(|_| self.total == Some(seq)) {
                    let last = self.step_of(last);
                    self.emit(&mut out, Event::EndOfData { last })?;
                }
            }
            Command::Tick => {
                let due = self
                    .stages
                    .iter()
                    .any(|st| st.leases.values().any(|l| l.deadline <= now));
                if !due {
                    return Ok(out);
                }
                let mut touched = Vec::new();
                for (stage, step, lease) in self.leases() {
                    if lease.deadline <= now {
                        touched.push(lease.worker);
                        self.emit(
                            &mut out,
                            Event::LeaseExpired {
                                worker: lease.worker,
                                stage,
                                step,
                            },
                        )?;
                    }
                }
                self.finish_drained(&mut out, touched)?;
            }
        }
        Ok(out)
    }

    /// Revokes every held lease (each step goes back to be leased again); returns the workers
    /// that held them, for [`Self::finish_drained`].
    fn revoke_all(&mut self, out: &mut Vec<Event>) -> Result<Vec<WorkerId>> {
        let mut touched = Vec::new();
        for (stage, step, lease) in self.leases() {
            touched.push(lease.worker);
            self.emit(
                out,
                Event::LeaseRevoked {
                    worker: lease.worker,
                    stage,
                    step,
                },
            )?;
        }
        Ok(touched)
    }

    /// Grants `worker` up to `max` steps of its stage (at least one, or an error and no
    /// change): returned steps first, lowest first, then the next ones in order, within the
    /// worker's lease limit.
    fn grant(&mut self, out: &mut Vec<Event>, worker: WorkerId, max: u32, now: Time) -> Result<()> {
        let info = self.known(worker)?;
        let stage = info.stage;
        if info.status == WorkerStatus::Draining {
            return Err(Error::Draining { worker });
        }
        let limit = self.config.max_leases_per_worker;
        let held = u32::try_from(info.leases.len()).unwrap_or(u32::MAX);
        let room = limit.saturating_sub(held);
        if room == 0 {
            return Err(Error::LeaseLimit { worker, limit });
        }
        let deadline = now.saturating_add_millis(self.lease_ms);
        for n in 0..max.clamp(1, room) {
            let seq = match self.next_leasable(stage) {
                Ok(seq) => seq,
                // The first step's refusal is the answer; later ones end the batch.
                Err(err) if n == 0 => return Err(err),
                Err(_) => break,
            };
            let step = self.step_of(seq);
            let records = self.batch(step)?;
            self.emit(
                out,
                Event::LeaseGranted {
                    worker,
                    stage,
                    step,
                    deadline,
                    batch: GrantedBatch::Records(records),
                },
            )?;
        }
        Ok(())
    }

    /// Applies one event: checks that it fits the current state, then changes the state.
    /// An event that does not fit changes nothing and returns why.
    pub fn apply_event(&mut self, event: &Event) -> Result<(), &'static str> {
        match event {
            Event::WorkerRegistered { worker, stage, at } => {
                if self.workers.contains_key(worker) || self.retired.contains(worker) {
                    return Err("worker registered twice");
                }
                if self.stage(*stage).is_none() {
                    return Err("worker registered for an unknown stage");
                }
                self.workers.insert(
                    *worker,
                    WorkerInfo {
                        stage: *stage,
                        status: WorkerStatus::Active,
                        last_seen: *at,
                        leases: BTreeSet::new(),
                    },
                );
            }
            Event::WorkerHeartbeat { worker, at } => {
                let info = self
                    .workers
                    .get_mut(worker)
                    .ok_or("heartbeat of an unknown worker")?;
                info.last_seen = *at;
            }
            Event::LeaseGranted {
                worker,
                stage,
                step,
                deadline,
                ..
            } => {
                let seq = self
                    .seq_of(*step)
                    .ok_or("lease of a step outside the job")?;
                let info = self
                    .workers
                    .get(worker)
                    .ok_or("lease to an unknown worker")?;
                if info.stage != *stage || info.status != WorkerStatus::Active {
                    return Err("lease to a worker of another stage or draining");
                }
                if u32::try_from(info.leases.len())
                    .map_or(true, |n| n >= self.config.max_leases_per_worker)
                {
                    return Err("lease beyond the worker's limit");
                }
                let fresh = self.fresh_leasable(*stage) == Some(seq);
                let st = self.stage_mut(*stage).ok_or("lease of an unknown stage")?;
                if st.pending.remove(&seq) {
                    // a re-lease
                } else if fresh {
                    st.next = seq.saturating_add(1);
                } else {
                    return Err("lease of a step that is neither returned nor next in order");
                }
                st.leases.insert(
                    seq,
                    Lease {
                        worker: *worker,
                        deadline: *deadline,
                    },
                );
                if let Some(info) = self.workers.get_mut(worker) {
                    info.leases.insert(seq);
                }
            }
            Event::LeaseExpired {
                worker,
                stage,
                step,
            }
            | Event::LeaseRevoked {
                worker,
                stage,
                step,
            } => {
                let seq = self.release(*worker, *stage, *step)?;
                if let Some(st) = self.stage_mut(*stage) {
                    st.pending.insert(seq);
                }
            }
            Event::LeaseRetired {
                worker,
                stage,
                step,
            } => {
                let seq = self.seq_of(*step).ok_or("retired step outside the job")?;
                if self.watermark.is_none_or(|w| seq > w) {
                    return Err("retired a step the training side has not consumed");
                }
                self.release(*worker, *stage, *step)?;
            }
            Event::StepCompleted {
                worker,
                stage,
                step,
            } => {
                let seq = self.release(*worker, *stage, *step)?;
                if let Some(st) = self.stage_mut(*stage) {
                    st.completed.insert(seq);
                }
            }
            Event::StepReturned { stage, step } => {
                let seq = self.seq_of(*step).ok_or("step outside the job")?;
                let st = self.stage_mut(*stage).ok_or("unknown stage")?;
                if !st.completed.remove(&seq) {
                    return Err("the returned step was not completed");
                }
                st.pending.insert(seq);
            }
            Event::WatermarkAdvanced { watermark } => {
                let seq = self.seq_of(*watermark).ok_or("watermark outside the job")?;
                if self.watermark.is_some_and(|w| w >= seq) {
                    return Err("watermark moved backwards");
                }
                if self.stages.last().is_none_or(|last| seq >= last.next) {
                    return Err("watermark ahead of every lease of the last stage");
                }
                self.watermark = Some(seq);
                if let Some(order) = &mut self.order {
                    order.forget_through(seq);
                }
                let after = seq.saturating_add(1);
                for st in &mut self.stages {
                    st.pending = st.pending.split_off(&after);
                    st.completed = st.completed.split_off(&after);
                    st.next = st.next.max(after);
                }
            }
            Event::LeasesReset => {
                if self.stages.iter().any(|st| !st.leases.is_empty()) {
                    return Err("leases reset while steps are leased");
                }
                // Only a snapshot from a file can hold the last generation.
                self.generation = self
                    .generation
                    .checked_add(1)
                    .ok_or("the lease generation is exhausted")?;
            }
            Event::Rewound { next } => {
                let seq = self.seq_or_end(*next).ok_or("rewind outside the job")?;
                if self.stages.iter().any(|st| !st.leases.is_empty()) {
                    return Err("rewind while steps are leased");
                }
                self.watermark = seq.checked_sub(1);
                self.end_of_data = false;
                for st in &mut self.stages {
                    st.pending.clear();
                    st.completed.clear();
                    st.next = seq;
                }
            }
            Event::WorkerDraining { worker } => {
                let info = self
                    .workers
                    .get_mut(worker)
                    .ok_or("drain of an unknown worker")?;
                if info.status != WorkerStatus::Active {
                    return Err("drain of a draining worker");
                }
                info.status = WorkerStatus::Draining;
            }
            Event::WorkerDrained { worker } => {
                let info = self
                    .workers
                    .get(worker)
                    .ok_or("drained an unknown worker")?;
                if info.status != WorkerStatus::Draining || !info.leases.is_empty() {
                    return Err("drained a worker that is not draining or still holds leases");
                }
                self.workers.remove(worker);
                self.retired.insert(*worker);
            }
            Event::WorkerLost { worker } => {
                let info = self.workers.get(worker).ok_or("lost an unknown worker")?;
                if !info.leases.is_empty() {
                    return Err("lost a worker whose leases were not revoked");
                }
                self.workers.remove(worker);
                self.retired.insert(*worker);
            }
            Event::JobEnded { last } => {
                let seq = self.seq_of(*last).ok_or("end of the job outside the job")?;
                if self.watermark != Some(seq) {
                    return Err("the job ended away from the watermark");
                }
                if self.stages.iter().any(|st| !st.leases.is_empty()) {
                    return Err("the job ended while steps are leased");
                }
                self.end_of_data = true;
            }
            Event::EndOfData { last } => {
                let seq = self.seq_of(*last).ok_or("end of data outside the job")?;
                if self.total != seq.checked_add(1) || self.watermark != Some(seq) {
                    return Err("end of data before the last step was consumed");
                }
                self.end_of_data = true;
            }
        }
        Ok(())
    }

    /// Applies `event` and records it; a refusal here is a bug in [`Self::apply`]'s checks.
    fn emit(&mut self, out: &mut Vec<Event>, event: Event) -> Result<()> {
        self.apply_event(&event)
            .map_err(|reason| Error::Invariant { reason })?;
        out.push(event);
        Ok(())
    }

    /// Emits `WorkerDrained` for each draining worker among `workers` that holds nothing more.
    fn finish_drained(
        &mut self,
        out: &mut Vec<Event>,
        workers: impl IntoIterator<Item = WorkerId>,
    ) -> Result<()> {
        let done: BTreeSet<WorkerId> = workers
            .into_iter()
            .filter(|w| {
                self.workers.get(w).is_some_and(|info| {
                    info.status == WorkerStatus::Draining && info.leases.is_empty()
                })
            })
            .collect();
        for worker in done {
            self.emit(out, Event::WorkerDrained { worker })?;
        }
        Ok(())
    }

    /// Removes `worker`'s lease of `step` in `stage`, returning its sequence number.
    fn release(
        &mut self,
        worker: WorkerId,
        stage: StageId,
        step: StepId,
    ) -> Result<u64, &'static str> {
        let seq = self.seq_of(step).ok_or("step outside the job")?;
        let st = self.stage_mut(stage).ok_or("unknown stage")?;
        if st.leases.get(&seq).map(|l| l.worker) != Some(worker) {
            return Err("the worker does not hold that step");
        }
        st.leases.remove(&seq);
        if let Some(info) = self.workers.get_mut(&worker) {
            info.leases.remove(&seq);
        }
        Ok(seq)
    }

    fn known(&self, worker: WorkerId) -> Result<&WorkerInfo> {
        self.workers
            .get(&worker)
            .ok_or(Error::UnknownWorker { worker })
    }

    /// The step to lease next for `stage`: a returned step first, else the next in order.
    fn next_leasable(&self, stage: StageId) -> Result<u64> {
        let st = self.stage(stage).ok_or(Error::UnknownStage {
            stage,
            stages: self.config.stages,
        })?;
        if self.end_of_data {
            return Err(Error::StageFinished { stage });
        }
        if let Some(seq) = st.pending.first() {
            return Ok(*seq);
        }
        if let Some(seq) = self.fresh_leasable(stage) {
            return Ok(seq);
        }
        let exhausted = self.total.is_some_and(|t| st.next >= t);
        if exhausted && st.leases.is_empty() {
            Err(Error::StageFinished { stage })
        } else {
            Err(Error::NoStepReady { stage })
        }
    }

    /// The next never-leased step of `stage`, if it exists and, for a later stage, the stage
    /// before it has completed it (its input exists).
    fn fresh_leasable(&self, stage: StageId) -> Option<u64> {
        let st = self.stage(stage)?;
        if self.total.is_some_and(|t| st.next >= t) {
            return None;
        }
        if stage.0 > 0 {
            let before = self.stage(StageId(stage.0 - 1))?;
            if !before.completed.contains(&st.next) {
                return None;
            }
        }
        Some(st.next)
    }

    fn stage(&self, stage: StageId) -> Option<&StageState> {
        self.stages.get(usize::try_from(stage.0).ok()?)
    }

    fn stage_mut(&mut self, stage: StageId) -> Option<&mut StageState> {
        self.stages.get_mut(usize::try_from(stage.0).ok()?)
    }

    /// The sequence number of `step`, `None` outside the job.
    fn seq_of(&self, step: StepId) -> Option<u64> {
        if self.config.epochs.is_some_and(|e| step.epoch.0 >= e) {
            return None;
        }
        step.numbered(self.per_epoch).map(|s| s.global)
    }

    /// [`Self::seq_of`], also accepting the step one past the last of a finite job.
    fn seq_or_end(&self, step: StepId) -> Option<u64> {
        match self.seq_of(step) {
            Some(seq) => Some(seq),
            None if step.step.0 == 0 && self.config.epochs == Some(step.epoch.0) => {
                step.numbered(self.per_epoch).map(|s| s.global)
            }
            None => None,
        }
    }

    fn step_of(&self, seq: u64) -> StepId {
        // An empty epoch has no steps; its sequence numbers stay in epoch 0.
        StepId::from_global(seq, self.per_epoch).unwrap_or(StepId::new(0, seq))
    }
}

/// The whole of a [`DispatcherState`] but its config, as a compacted journal keeps it (see
/// [`crate::journal::Record::Snapshot`]): what replaying every event before it would build.
/// Steps are sequence numbers (`epoch · steps_per_epoch + step`, under the journal header's
/// config); a worker's own lease set is not kept, since its stage's leases name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateSnapshot {
    pub stages: Vec<StageSnapshot>,
    pub workers: Vec<WorkerSnapshot>,
    pub retired: Vec<WorkerId>,
    pub watermark: Option<u64>,
    pub end_of_data: bool,
    pub generation: u64,
}

/// One stage's lease table in a [`StateSnapshot`]; [`DispatcherState::snapshot`] writes every
/// list in increasing step order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSnapshot {
    pub next: u64,
    pub pending: Vec<u64>,
    /// `(step, worker, deadline)` of each leased step.
    pub leases: Vec<(u64, WorkerId, Time)>,
    pub completed: Vec<u64>,
}

/// One registered worker in a [`StateSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSnapshot {
    pub worker: WorkerId,
    pub stage: StageId,
    pub draining: bool,
    pub last_seen: Time,
}

impl DispatcherState {
    /// The state without its config, for a compacted journal.
    pub fn snapshot(&self) -> StateSnapshot {
        StateSnapshot {
            stages: self
                .stages
                .iter()
                .map(|st| StageSnapshot {
                    next: st.next,
                    pending: st.pending.iter().copied().collect(),
                    leases: st
                        .leases
                        .iter()
                        .map(|(seq, l)| (*seq, l.worker, l.deadline))
                        .collect(),
                    completed: st.completed.iter().copied().collect(),
                })
                .collect(),
            workers: self
                .workers
                .iter()
                .map(|(worker, info)| WorkerSnapshot {
                    worker: *worker,
                    stage: info.stage,
                    draining: info.status == WorkerStatus::Draining,
                    last_seen: info.last_seen,
                })
                .collect(),
            retired: self.retired.iter().copied().collect(),
            watermark: self.watermark,
            end_of_data: self.end_of_data,
            generation: self.generation,
        }
    }

    /// The state `snapshot` describes under `config`. Everything a run of events could not
    /// have built is refused ([`Error::Snapshot`] says what), so that a restored state keeps
    /// every invariant the state machine's checks rely on; a snapshot comes from a file.
    pub fn restore(config: DispatcherConfig, snapshot: StateSnapshot) -> Result<Self> {
        let refuse = |reason| Error::Snapshot { reason };
        let mut state = Self::new(config)?;
        if snapshot.stages.len() != state.stages.len() {
            return Err(refuse("its number of stages differs from the config's"));
        }
        for worker in snapshot.workers {
            let info = WorkerInfo {
                stage: worker.stage,
                status: if worker.draining {
                    WorkerStatus::Draining
                } else {
                    WorkerStatus::Active
                },
                last_seen: worker.last_seen,
                leases: BTreeSet::new(),
            };
            if state.workers.insert(worker.worker, info).is_some() {
                return Err(refuse("a worker listed twice"));
            }
        }
        for worker in snapshot.retired {
            if state.workers.contains_key(&worker) || !state.retired.insert(worker) {
                return Err(refuse("a retired worker listed twice, or also registered"));
            }
        }
        for (index, stage) in snapshot.stages.into_iter().enumerate() {
            let id = StageId(u32::try_from(index).map_err(|_| refuse("too many stages"))?);
            let mut st = StageState {
                next: stage.next,
                ..StageState::default()
            };
            for seq in stage.pending {
                if !st.pending.insert(seq) {
                    return Err(refuse("a pending step listed twice"));
                }
            }
            for seq in stage.completed {
                if !st.completed.insert(seq) {
                    return Err(refuse("a completed step listed twice"));
                }
            }
            for (seq, worker, deadline) in stage.leases {
                let info = state
                    .workers
                    .get_mut(&worker)
                    .ok_or(refuse("a step leased to an unknown worker"))?;
                if info.stage != id {
                    return Err(refuse("a step leased to a worker of another stage"));
                }
                info.leases.insert(seq);
                if st.leases.insert(seq, Lease { worker, deadline }).is_some() {
                    return Err(refuse("a leased step listed twice"));
                }
            }
            state.stages[index] = st;
        }
        state.watermark = snapshot.watermark;
        state.end_of_data = snapshot.end_of_data;
        state.generation = snapshot.generation;
        state.check_invariants().map_err(refuse)?;
        if let (Some(order), Some(seq)) = (&mut state.order, state.watermark) {
            order.forget_through(seq);
        }
        Ok(state)
    }

    /// What every state the events build satisfies (and [`Self::restore`] checks): steps
    /// inside the job and below their stage's next; a step pending, leased or completed at
    /// most one of these; nothing pending or completed at or before the watermark, which is
    /// below every stage's next; leases held by registered workers of their stage, within
    /// their limit, and each worker's lease set its stage's leases naming it; no retired
    /// worker registered.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        let max = usize::try_from(self.config.max_leases_per_worker).unwrap_or(usize::MAX);
        for (index, st) in self.stages.iter().enumerate() {
            if self.total.is_some_and(|t| st.next > t) {
                return Err("a stage's next step is past the job's end");
            }
            if self.watermark.is_some_and(|w| st.next <= w) {
                return Err("a stage's next step is at or before the watermark");
            }
            let below_next = |set: &BTreeSet<u64>| set.last().is_none_or(|s| *s < st.next);
            if !below_next(&st.pending)
                || !below_next(&st.completed)
                || st
                    .leases
                    .last_key_value()
                    .is_some_and(|(s, _)| *s >= st.next)
            {
                return Err("a step at or past its stage's next step");
            }
            let after_watermark =
                |set: &BTreeSet<u64>| set.first().is_none_or(|s| self.watermark < Some(*s));
            if !after_watermark(&st.pending) || !after_watermark(&st.completed) {
                return Err("a step pending or completed at or before the watermark");
            }
            if st.pending.iter().any(|s| st.completed.contains(s))
                || st
                    .leases
                    .keys()
                    .any(|s| st.pending.contains(s) || st.completed.contains(s))
            {
                return Err("a step both pending, leased or completed");
            }
            for (seq, lease) in &st.leases {
                let held = self.workers.get(&lease.worker).is_some_and(|info| {
                    usize::try_from(info.stage.0) == Ok(index) && info.leases.contains(seq)
                });
                if !held {
                    return Err("a lease its worker does not hold");
                }
            }
        }
        for (worker, info) in &self.workers {
            if self.retired.contains(worker) {
                return Err("a retired worker is registered");
            }
            if info.leases.len() > max {
                return Err("a worker holds more leases than its limit");
            }
            let st = self
                .stage(info.stage)
                .ok_or("a worker of an unknown stage")?;
            if info
                .leases
                .iter()
                .any(|seq| st.leases.get(seq).map(|l| l.worker) != Some(*worker))
            {
                return Err("a worker holds a step its stage does not lease to it");
            }
        }
        Ok(())
    }
}
