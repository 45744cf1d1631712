//! The journal's records: the [`Header`] line, and the [`Record`]s a [`super::Batch`] holds
//! (events, runs of grants, completions and retirements, snapshots), with their expansion back
//! into the state's events.

use serde::{Deserialize, Serialize};

use crate::config::DispatcherConfig;
use crate::ids::{JobId, StageId, StepId, Time, WorkerId};
use crate::state::{Event, GrantedBatch, StateSnapshot};

/// The first line: what the journal was written for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub format: u32,
    pub job: JobId,
    pub config: DispatcherConfig,
}

/// One journaled change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A change of the dispatcher's state, as [`crate::DispatcherState::apply`] returned it.
    Event(Event),
    /// The training side registered where data workers push step messages.
    Consumer { receiver_addr: String },
    /// `LeaseGranted` events of consecutive steps, in one record (format 2): what a lease
    /// request of many steps grants.
    Granted(GrantRun),
    /// `LeaseRetired` events of consecutive steps, in one record (format 2): what a
    /// watermark's advance retires.
    Retired(StepRun),
    /// `StepCompleted` events of consecutive steps, in one record (format 3): what a worker's
    /// report of several steps completes, when the training side has not consumed them yet
    /// (a training side slower than its workers: every step).
    Completed(StepRun),
    /// Everything the records before it built (format 3): the only record of a compacted
    /// journal's first batch. Boxed: every other record is small.
    Snapshot(Box<Snapshot>),
}

/// The service's state at a compaction: the state machine's, and what the service derives
/// from the journal's records besides it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub state: StateSnapshot,
    /// Where data workers push step messages (the last [`Record::Consumer`]); empty if none.
    pub receiver_addr: String,
    /// Workers removed by a drain rather than lost.
    pub drained: Vec<WorkerId>,
    /// The next worker id to hand out: above every id ever registered in the job.
    pub next_worker: u64,
}

/// Grants of `first` and the steps after it (one a batch, in order; runs go on across an
/// epoch's end in format 3) to one
/// worker of one stage with one deadline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRun {
    pub worker: WorkerId,
    pub stage: StageId,
    pub first: StepId,
    pub deadline: Time,
    pub batches: Vec<GrantedBatch>,
}

/// Events of one kind (the record's) for `count` steps from `first` (on across an epoch's
/// end), of one worker of one stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRun {
    pub worker: WorkerId,
    pub stage: StageId,
    pub first: StepId,
    pub count: u64,
}

impl Record {
    /// `events` as records, in order: runs of grants, of retirements and of completions
    /// (consecutive steps, one worker and stage; one deadline for grants) as one record each,
    /// every other event (and a run of one) as itself; grants with their batches' CRCs.
    pub fn of_events(events: &[Event], per_epoch: u64) -> Vec<Record> {
        let mut out: Vec<Record> = Vec::with_capacity(events.len().min(8));
        for event in events {
            let record = Record::run_of(event);
            let unjoined = match out.last_mut() {
                Some(last) => last.join(record, per_epoch).err(),
                None => Some(record),
            };
            out.extend(unjoined);
        }
        out.into_iter()
            .map(|record| record.unless_single(per_epoch))
            .collect()
    }

    /// A run of `event` alone, when it can start one; else the event as its record.
    fn run_of(event: &Event) -> Record {
        match event {
            &Event::LeaseGranted {
                worker,
                stage,
                step,
                deadline,
                ref batch,
            } => Record::Granted(GrantRun {
                worker,
                stage,
                first: step,
                deadline,
                batches: vec![batch.to_crc()],
            }),
            &Event::LeaseRetired {
                worker,
                stage,
                step,
            } => Record::Retired(StepRun::one(worker, stage, step)),
            &Event::StepCompleted {
                worker,
                stage,
                step,
            } => Record::Completed(StepRun::one(worker, stage, step)),
            other => Record::Event(other.clone()),
        }
    }

    /// Adds `next` (a run of one step, see [`Record::run_of`]) to this run when it is the
    /// run's next step; else gives it back.
    fn join(&mut self, next: Record, per_epoch: u64) -> Result<(), Record> {
        match (self, next) {
            (Record::Granted(run), Record::Granted(next))
                if (run.worker, run.stage, run.deadline)
                    == (next.worker, next.stage, next.deadline)
                    && nth(run.first, run.batches.len(), per_epoch) == next.first =>
            {
                run.batches.extend(next.batches);
                Ok(())
            }
            (Record::Retired(run), Record::Retired(next))
            | (Record::Completed(run), Record::Completed(next))
                if run.is_followed_by(&next, per_epoch) =>
            {
                run.count += next.count;
                Ok(())
            }
            (_, next) => Err(next),
        }
    }

    /// A run of one step as the event it stands for; any other record as it is.
    fn unless_single(self, per_epoch: u64) -> Record {
        match self {
            Record::Granted(run) if run.batches.len() == 1 => match run.batches.first().cloned() {
                Some(batch) => Record::Event(run.event(0, batch, per_epoch)),
                None => Record::Granted(run),
            },
            Record::Retired(run) if run.count == 1 => Record::Event(run.retired(0, per_epoch)),
            Record::Completed(run) if run.count == 1 => Record::Event(run.completed(0, per_epoch)),
            other => other,
        }
    }

    /// Hands the events this record stands for to `f`, in order (none for `Consumer` or
    /// `Snapshot`, which a replay takes as they are), until `f` fails. A run's steps past the
    /// last a step number can hold are given as that last one, which no state accepts.
    pub fn each_event<E>(
        self,
        per_epoch: u64,
        mut f: impl FnMut(Event) -> Result<(), E>,
    ) -> Result<(), E> {
        match self {
            Record::Event(event) => f(event),
            Record::Consumer { .. } | Record::Snapshot(_) => Ok(()),
            Record::Granted(run) => {
                let head = GrantRun {
                    batches: Vec::new(),
                    ..run
                };
                (0..)
                    .zip(run.batches)
                    .try_for_each(|(n, batch)| f(head.event(n, batch, per_epoch)))
            }
            Record::Retired(run) => (0..run.count).try_for_each(|n| f(run.retired(n, per_epoch))),
            Record::Completed(run) => {
                (0..run.count).try_for_each(|n| f(run.completed(n, per_epoch)))
            }
        }
    }
}

impl GrantRun {
    /// The grant of the run's step `n` (counted from `first`), with `batch`.
    fn event(&self, n: impl TryInto<u64>, batch: GrantedBatch, per_epoch: u64) -> Event {
        Event::LeaseGranted {
            worker: self.worker,
            stage: self.stage,
            step: nth(self.first, n, per_epoch),
            deadline: self.deadline,
            batch,
        }
    }
}

impl StepRun {
    /// A run of `step` alone.
    fn one(worker: WorkerId, stage: StageId, step: StepId) -> StepRun {
        StepRun {
            worker,
            stage,
            first: step,
            count: 1,
        }
    }

    /// Whether `next` continues this run: the same worker and stage, from this run's next
    /// step on.
    fn is_followed_by(&self, next: &StepRun, per_epoch: u64) -> bool {
        (self.worker, self.stage) == (next.worker, next.stage)
            && nth(self.first, self.count, per_epoch) == next.first
    }

    /// The retirement of the run's step `n` (counted from `first`).
    fn retired(&self, n: impl TryInto<u64>, per_epoch: u64) -> Event {
        Event::LeaseRetired {
            worker: self.worker,
            stage: self.stage,
            step: nth(self.first, n, per_epoch),
        }
    }

    /// The completion of the run's step `n` (counted from `first`).
    fn completed(&self, n: impl TryInto<u64>, per_epoch: u64) -> Event {
        Event::StepCompleted {
            worker: self.worker,
            stage: self.stage,
            step: nth(self.first, n, per_epoch),
        }
    }
}

/// The step `n` steps after `first`, on into the next epochs of `per_epoch` steps (format
/// 3; a format-2 run never reaches its epoch's end, so it reads the same). A step outside that
/// numbering (an epoch of no steps, a step past its epoch's end), or one past the last
/// global step number: `n` steps on in `first`'s epoch, saturating, a step no state accepts.
/// A run joins exactly the step this gives, so its record expands to the same events.
fn nth(first: StepId, n: impl TryInto<u64>, per_epoch: u64) -> StepId {
    let n = n.try_into().unwrap_or(u64::MAX);
    first
        .numbered(per_epoch)
        .and_then(|s| s.global.checked_add(n))
        .and_then(|global| StepId::from_global(global, per_epoch))
        .unwrap_or(StepId {
            epoch: first.epoch,
            step: crate::ids::Step(first.step.0.saturating_add(n)),
        })
}
