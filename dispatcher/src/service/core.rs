//! What the service keeps behind its lock: the state machine, its journal and the little the
//! service derives from the journal, with the one function that changes the state.

use std::collections::BTreeSet;
use std::path::Path;

use lode_proto::step::steps_per_epoch;
use tonic::Status;

use crate::journal::{Batch, Journal, JournalError, Record, Snapshot, JOURNAL_FILE};
use crate::service::ServeError;
use crate::{
    Command, DispatcherConfig, DispatcherState, Error, Event, JobId, StageId, StepId, Time,
    WorkerId, WorkerStatus,
};

/// Why [`Core::apply`] refused a command.
#[derive(Debug)]
pub(crate) enum ApplyError {
    /// The state machine refused it; nothing changed.
    State(Error),
    /// A journal write failed (now or earlier): the service accepts no more changes.
    JournalFailed,
}

impl From<ApplyError> for Status {
    fn from(err: ApplyError) -> Self {
        match err {
            ApplyError::State(err) => err.into(),
            ApplyError::JournalFailed => Status::unavailable(
                "the dispatcher's journal failed; it accepts no changes until it restarts",
            ),
        }
    }
}

/// The state machine, its journal and what the service derives from the journal's events.
#[derive(Debug)]
pub(crate) struct Core {
    state: DispatcherState,
    journal: Journal,
    /// Workers removed by a drain (rather than lost): their lease request is answered
    /// `drained`, their heartbeat `draining`.
    drained: BTreeSet<WorkerId>,
    /// Where data workers push step messages; empty until the consumer registered.
    receiver_addr: String,
    /// Steps the consumer's receiver buffers ahead (its `window`), which a stage's workers
    /// share as leases; not journaled (a restarted dispatcher assumes
    /// [`super::DEFAULT_RECEIVER_WINDOW`] until the training side registers again).
    receiver_window: u64,
    /// The next worker id to hand out: above every id the journal ever registered.
    next_worker: u64,
    /// A journal write failed: the live state may be ahead of the file, so nothing more is
    /// accepted; a restart replays the file and continues from what was answered.
    failed: bool,
    /// Compact the journal once it has grown this much since the last compaction (0: never;
    /// see [`Core::compact_every`]).
    compact_bytes: u64,
    /// The journal's growth at which the next compaction is due.
    compact_due: u64,
    /// Queue counters for the scheduler; not journaled (they restart at zero).
    pub(crate) counters: Counters,
    /// Names workers registered with; not journaled.
    pub(crate) names: std::collections::BTreeMap<WorkerId, String>,
    /// Each worker's share of `counters`; not journaled. Pruned with `names`.
    pub(crate) worker_counters: std::collections::BTreeMap<WorkerId, WorkerCounters>,
    /// Who has been answered end of data (the training side; workers), for
    /// [`Core::finished`]; not journaled (a restarted dispatcher tells them again).
    told_end: ToldEnd,
    /// When [`Core::tick`] last ran; not journaled.
    last_tick: Option<Time>,
}

/// Who knows the job ended.
#[derive(Debug, Default)]
struct ToldEnd {
    consumer: bool,
    workers: BTreeSet<WorkerId>,
}

/// One worker's step completions and their compute time, for the live scheduler's sizing.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WorkerCounters {
    pub(crate) steps_computed: u64,
    pub(crate) compute_us: u64,
}

/// What the scheduler reads as rates: monotonic within one dispatcher process.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub(crate) steps_computed: u64,
    pub(crate) compute_us: u64,
    pub(crate) consumer_busy_us: u64,
    pub(crate) journal_compactions: u64,
}

/// A core rebuilt from its journal.
#[derive(Debug)]
pub(crate) struct Restored {
    pub(crate) core: Core,
    /// The last time the journal holds, where the dispatcher's clock resumes.
    pub(crate) resume_at: Time,
}

impl Core {
    /// Opens the journal in `dir` and replays it.
    pub(crate) fn open(
        dir: &Path,
        job: JobId,
        config: &DispatcherConfig,
    ) -> Result<Restored, ServeError> {
        // Replayed as the journal is read: the memory this takes is the state's, however long
        // the job ran.
        let path = dir.join(JOURNAL_FILE);
        let mut state = DispatcherState::new(config.clone())?;
        let mut events = 0usize;
        let mut resume_at = Time(0);
        let mut receiver_addr = String::new();
        let mut drained = BTreeSet::new();
        let mut next_worker = 1;
        let mut first = true;
        let per_epoch = config.steps_per_epoch();
        let reopened = Journal::open_replaying(dir, job, config, |line, batch| {
            resume_at = resume_at.max(batch.at);
            let corrupt = |reason: String| {
                ServeError::Journal(JournalError::Corrupt {
                    path: path.clone(),
                    line,
                    reason,
                })
            };
            let opens = std::mem::take(&mut first) && batch.records.len() == 1;
            for record in batch.records {
                let snapshot = match record {
                    Record::Consumer {
                        receiver_addr: addr,
                    } => {
                        receiver_addr = addr;
                        continue;
                    }
                    Record::Snapshot(snapshot) => snapshot,
                    record => {
                        record.each_event(per_epoch, |event| {
                            observe(&event, &mut drained, &mut next_worker);
                            state
                                .replay_event(events, &event)
                                .map_err(|err| match err {
                                    Error::Journal { reason, .. } => {
                                        corrupt(format!("the event does not replay: {reason}"))
                                    }
                                    other => ServeError::Dispatcher(other),
                                })?;
                            events += 1;
                            Ok::<(), ServeError>(())
                        })?;
                        continue;
                    }
                };
                if !opens {
                    return Err(corrupt(
                        "a snapshot that is not the only record of the first batch".into(),
                    ));
                }
                let Snapshot {
                    state: saved,
                    receiver_addr: addr,
                    drained: gone,
                    next_worker: next,
                } = *snapshot;
                state =
                    DispatcherState::restore(config.clone(), saved).map_err(|err| match err {
                        Error::Snapshot { reason } => {
                            corrupt(format!("the snapshot does not restore: {reason}"))
                        }
                        other => ServeError::Dispatcher(other),
                    })?;
                receiver_addr = addr;
                drained = gone.into_iter().collect();
                // Never below an id the state knows, whatever the line says.
                let known = state.workers().map(|(w, _)| w).chain(state.retired());
                next_worker = known.fold(next.max(1), |n, w| n.max(w.0.saturating_add(1)));
            }
            Ok::<(), ServeError>(())
        })?;
        let journal = reopened.journal;
        tracing::info!(
            journal = %journal.path().display(),
            events,
            resume_at = %resume_at,
            "journal replayed"
        );
        Ok(Restored {
            core: Core {
                state,
                journal,
                drained,
                receiver_addr,
                receiver_window: super::DEFAULT_RECEIVER_WINDOW,
                last_tick: None,
                next_worker,
                failed: false,
                compact_bytes: 0,
                compact_due: 0,
                counters: Counters::default(),
                names: std::collections::BTreeMap::new(),
                worker_counters: std::collections::BTreeMap::new(),
                told_end: ToldEnd::default(),
            },
            resume_at,
        })
    }

    /// The one way the dispatcher's state changes: applies `command` at `now`, and appends the
    /// events it produced to the journal before the caller may answer.
    pub(crate) fn apply(&mut self, command: Command, now: Time) -> Result<Vec<Event>, ApplyError> {
        if self.failed {
            return Err(ApplyError::JournalFailed);
        }
        let events = self.state.apply(command, now).map_err(ApplyError::State)?;
        if !events.is_empty() {
            for event in &events {
                observe(event, &mut self.drained, &mut self.next_worker);
            }
            let records = Record::of_events(&events, self.state.steps_per_epoch());
            self.write(now, records)?;
            self.compact_if_due(now)?;
        }
        Ok(events)
    }

    /// Counts `steps` completions of `worker` and their compute time, for the scheduler.
    pub(crate) fn count_completed(&mut self, worker: WorkerId, steps: u64, compute_us: u64) {
        self.counters.steps_computed = self.counters.steps_computed.saturating_add(steps);
        self.counters.compute_us = self.counters.compute_us.saturating_add(compute_us);
        let mine = self.worker_counters.entry(worker).or_default();
        mine.steps_computed = mine.steps_computed.saturating_add(steps);
        mine.compute_us = mine.compute_us.saturating_add(compute_us);
    }

    /// The training side was answered end of data.
    pub(crate) fn told_consumer_end(&mut self) {
        self.told_end.consumer = true;
    }

    /// `worker` was answered end of data.
    pub(crate) fn told_worker_end(&mut self, worker: WorkerId) {
        self.told_end.workers.insert(worker);
    }

    /// The job is over and everyone in it knows: end of data, the training side told, and
    /// every worker still registered told (lost and drained workers are no longer registered).
    pub(crate) fn finished(&self) -> bool {
        self.state.is_end_of_data()
            && self.told_end.consumer
            && self
                .state
                .workers()
                .all(|(worker, _)| self.told_end.workers.contains(&worker))
    }

    /// Records where data workers push step messages.
    pub(crate) fn register_consumer(
        &mut self,
        receiver_addr: String,
        window: Option<u64>,
        now: Time,
    ) -> Result<(), ApplyError> {
        if self.failed {
            return Err(ApplyError::JournalFailed);
        }
        self.receiver_window = window.unwrap_or(super::DEFAULT_RECEIVER_WINDOW);
        // A new training side (or a reopened job) has not been told anything yet.
        self.told_end = ToldEnd::default();
        if receiver_addr != self.receiver_addr {
            self.write(
                now,
                vec![Record::Consumer {
                    receiver_addr: receiver_addr.clone(),
                }],
            )?;
            self.receiver_addr = receiver_addr;
            self.compact_if_due(now)?;
        }
        Ok(())
    }

    /// Appends to the journal; the caller acknowledges only after [`Core::sync_point`]
    /// reaches the journal's written offset (group commit, see `journal::SyncPoint`).
    fn write(&mut self, at: Time, records: Vec<Record>) -> Result<(), ApplyError> {
        if let Err(err) = self.journal.append_unsynced(&Batch { at, records }) {
            tracing::error!(cause = %err, "journal append failed; refusing further changes until restart");
            self.failed = true;
            return Err(ApplyError::JournalFailed);
        }
        Ok(())
    }

    /// Compacts the journal when it is due. Called once a change is whole: written, and
    /// taken into the state and everything derived from it, which the snapshot holds.
    fn compact_if_due(&mut self, at: Time) -> Result<(), ApplyError> {
        if self.compact_bytes > 0 && self.journal.grown() >= self.compact_due {
            self.compact(at)?;
        }
        Ok(())
    }

    /// Compacts the journal once it has grown by `bytes` since its last compaction (or
    /// since it was opened: a long journal is compacted at the first change after a
    /// restart), or by four times the compacted journal's size if that is more, so that a
    /// large state is not rewritten over and over. 0 never compacts. A journal an older build
    /// wrote is compacted at the first change, so that its header names the format its lines
    /// are written in from then on.
    pub(crate) fn compact_every(&mut self, bytes: u64) {
        self.compact_bytes = bytes;
        self.compact_due = if self.journal.format_on_file() < crate::journal::JOURNAL_FORMAT {
            0
        } else {
            self.due_after_compaction()
        };
    }

    fn due_after_compaction(&self) -> u64 {
        self.compact_bytes
            .max(self.journal.compacted().saturating_mul(4))
    }

    /// Replaces the journal by a snapshot of the state (see [`Journal::compact`]). A failure
    /// that leaves the old journal in use is logged and tried again after as much growth
    /// again; one that broke the journal refuses every later change.
    fn compact(&mut self, at: Time) -> Result<(), ApplyError> {
        let before = self.journal.grown();
        let started = std::time::Instant::now();
        let snapshot = Snapshot {
            state: self.state.snapshot(),
            receiver_addr: self.receiver_addr.clone(),
            drained: self.drained.iter().copied().collect(),
            next_worker: self.next_worker,
        };
        match self.journal.compact(at, snapshot) {
            Ok(()) => {
                self.compact_due = self.due_after_compaction();
                self.counters.journal_compactions =
                    self.counters.journal_compactions.saturating_add(1);
                tracing::info!(
                    journal = %self.journal.path().display(),
                    replaced_bytes = before,
                    bytes = self.journal.compacted(),
                    took_ms = started.elapsed().as_secs_f64() * 1e3,
                    "journal compacted (the dispatcher's lock held meanwhile)"
                );
                Ok(())
            }
            Err(err) if self.journal.sync_point().has_failed() => {
                tracing::error!(cause = %err, "journal compaction failed after its rename; refusing further changes until restart");
                self.failed = true;
                Err(ApplyError::JournalFailed)
            }
            Err(err) => {
                self.compact_due = before.saturating_add(self.compact_bytes);
                tracing::warn!(cause = %err, "journal compaction failed; the journal stays as it was and grows on");
                Ok(())
            }
        }
    }

    /// Hands journal writes to a thread of their own (see [`Journal::write_behind`]).
    pub(crate) fn write_behind(&mut self) -> Result<(), JournalError> {
        self.journal.write_behind()
    }

    /// The journal's durability point: sync to `written()` before answering a change.
    pub(crate) fn sync_point(&self) -> std::sync::Arc<crate::journal::SyncPoint> {
        self.journal.sync_point()
    }

    pub(crate) fn state(&self) -> &DispatcherState {
        &self.state
    }

    /// The journal file's length now: what a restart would read.
    pub(crate) fn journal_bytes(&self) -> u64 {
        self.journal
            .compacted()
            .saturating_add(self.journal.grown())
    }

    pub(crate) fn receiver_addr(&self) -> &str {
        &self.receiver_addr
    }

    /// The receiver's window now, as the training side last reported it (see
    /// `ConsumedRequest.window`): the workers' lease shares follow it from their next answer.
    /// Not journaled: after a restart the window is what the consumer registers or reports
    /// next.
    pub(crate) fn set_receiver_window(&mut self, window: u64) {
        self.receiver_window = window;
    }

    /// `worker`'s lease limit now: its share of the receiver's window (see
    /// [`DispatcherState::lease_share`]); the limit per worker for an unknown worker.
    pub(crate) fn lease_limit(&self, worker: WorkerId) -> u32 {
        match self.state.worker(worker) {
            Some(info) => self.state.lease_share(info.stage, self.receiver_window),
            None => self.state.config().max_leases_per_worker,
        }
    }

    pub(crate) fn is_drained(&self, worker: WorkerId) -> bool {
        self.drained.contains(&worker)
    }

    /// A fresh worker id (never registered in this job, not even before a restart).
    pub(crate) fn allocate_worker(&mut self) -> WorkerId {
        let id = WorkerId(self.next_worker);
        self.next_worker = self.next_worker.saturating_add(1);
        id
    }

    /// The stage with the fewest active workers (the lowest such stage on a tie).
    pub(crate) fn least_staffed_stage(&self) -> StageId {
        let stages = self.state.config().stages;
        let mut counts = vec![0usize; usize::try_from(stages).unwrap_or(0)];
        for (_, info) in self.state.workers() {
            if info.status == WorkerStatus::Active {
                if let Some(n) = usize::try_from(info.stage.0)
                    .ok()
                    .and_then(|i| counts.get_mut(i))
                {
                    *n += 1;
                }
            }
        }
        let best = counts
            .iter()
            .enumerate()
            .min_by_key(|(i, n)| (**n, *i))
            .map_or(0, |(i, _)| i);
        StageId(u32::try_from(best).unwrap_or(0))
    }

    /// Expires leases due at `now`, then declares lost every worker silent for longer than
    /// `silence_ms`, unless the dispatcher itself was stalled: when more than half of
    /// `silence_ms` passed since the last tick (a slow journal sync, a starved process), the
    /// heartbeats that arrived meanwhile may not be applied yet, and every worker would look
    /// silent. The next tick, on time, decides.
    pub(crate) fn tick(&mut self, now: Time, silence_ms: u64) -> Result<(), ApplyError> {
        self.apply(Command::Tick, now)?;
        let previous = self.last_tick.replace(now);
        if previous.is_some_and(|t| now.as_millis().saturating_sub(t.as_millis()) > silence_ms / 2)
        {
            return Ok(());
        }
        let silent: Vec<(WorkerId, Time)> = self
            .state
            .workers()
            .filter(|(_, info)| {
                now.as_millis().saturating_sub(info.last_seen.as_millis()) > silence_ms
            })
            .map(|(worker, info)| (worker, info.last_seen))
            .collect();
        for (worker, last_seen) in silent {
            let events = self.apply(Command::WorkerLost { worker }, now)?;
            let revoked = events
                .iter()
                .filter(|e| matches!(e, Event::LeaseRevoked { .. }))
                .count();
            tracing::warn!(%worker, %last_seen, %now, revoked, "worker lost: no heartbeat");
        }
        Ok(())
    }

    /// The first step the training side has not consumed: the one after the watermark.
    pub(crate) fn first_unconsumed(&self) -> StepId {
        let per_epoch = self.state.steps_per_epoch();
        match self.state.watermark() {
            None => StepId::new(0, 0),
            Some(w) => w
                .numbered(per_epoch)
                .and_then(|s| s.next(steps_per_epoch(per_epoch).ok()?))
                .map_or_else(|| StepId::new(w.epoch.0.saturating_add(1), 0), StepId::from),
        }
    }

    /// Steps consumed so far (through the watermark).
    pub(crate) fn steps_consumed(&self) -> u64 {
        let per_epoch = self.state.steps_per_epoch();
        self.state.watermark().map_or(0, |w| {
            w.numbered(per_epoch)
                .map_or(u64::MAX, |s| s.global.saturating_add(1))
        })
    }
}

/// What the service derives from each event, live and on replay alike.
fn observe(event: &Event, drained: &mut BTreeSet<WorkerId>, next_worker: &mut u64) {
    match event {
        Event::WorkerRegistered { worker, .. } => {
            *next_worker = (*next_worker).max(worker.0.saturating_add(1));
        }
        Event::WorkerDrained { worker } => {
            drained.insert(*worker);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Shuffle, PROTOCOL_VERSION};

    fn config() -> DispatcherConfig {
        DispatcherConfig {
            records: 10,
            batch_size: 3,
            drop_remainder: false,
            shuffle: Shuffle::Off,
            chain: None,
            epochs: None,
            restart_every: None,
            lease_duration: Duration::from_secs(60),
            max_leases_per_worker: 2,
            stages: 2,
        }
    }

    /// The core of the journal in `dir` under [`config`].
    fn open(dir: &Path) -> Core {
        Core::open(dir, JobId(1), &config()).expect("open").core
    }

    fn register(core: &mut Core, stage: StageId, at: u64) -> WorkerId {
        let worker = core.allocate_worker();
        let command = Command::RegisterWorker {
            worker,
            stage,
            protocol_version: PROTOCOL_VERSION,
        };
        core.apply(command, Time(at)).expect("register");
        worker
    }

    /// A tick late by more than half the silence (the dispatcher itself stalled) declares no
    /// one lost; the next one on time does, of those still silent.
    #[test]
    fn a_stalled_dispatcher_declares_no_one_lost_until_it_ticks_on_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut core = open(dir.path());
        let quiet = register(&mut core, StageId(0), 0);
        let late = register(&mut core, StageId(0), 0);
        core.tick(Time(100), 1_000).expect("tick");
        // Stalled from 100 to 2,000 ms: both look silent.
        core.tick(Time(2_000), 1_000).expect("tick");
        assert!(
            core.state().worker(quiet).is_some(),
            "not lost at a late tick"
        );
        assert!(
            core.state().worker(late).is_some(),
            "not lost at a late tick"
        );
        // The heartbeat that waited behind the stall arrives; the next tick is on time.
        core.apply(Command::Heartbeat { worker: late }, Time(2_010))
            .expect("heartbeat");
        core.tick(Time(2_100), 1_000).expect("tick");
        assert!(core.state().worker(quiet).is_none(), "still silent: lost");
        assert!(core.state().worker(late).is_some(), "heard from: kept");
    }

    #[test]
    fn a_silent_worker_is_lost_its_leases_return_and_the_journal_agrees() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut core = open(dir.path());
        assert_eq!(core.least_staffed_stage(), StageId(0));
        let quiet = register(&mut core, StageId(0), 0);
        assert_eq!(core.least_staffed_stage(), StageId(1));
        let chatty = register(&mut core, StageId(0), 0);
        core.apply(Command::RequestLease { worker: quiet }, Time(0))
            .expect("lease");
        core.apply(Command::Heartbeat { worker: chatty }, Time(4_000))
            .expect("heartbeat");

        core.tick(Time(5_000), 5_000).expect("tick");
        assert!(
            core.state().worker(quiet).is_some(),
            "silent for exactly the limit"
        );
        core.tick(Time(5_001), 5_000).expect("tick");
        assert!(core.state().worker(quiet).is_none(), "lost");
        assert!(core.state().worker(chatty).is_some());
        assert!(core.state().leases().is_empty(), "its lease went back");
        let live = core.state().clone();
        drop(core);

        let restored = Core::open(dir.path(), JobId(1), &config()).expect("reopen");
        assert_eq!(restored.core.state(), &live);
        assert_eq!(restored.resume_at, Time(5_001));
        let mut core = restored.core;
        assert!(core.allocate_worker().0 > chatty.0, "ids are never reused");
    }

    #[test]
    fn a_compacting_core_stays_small_and_restarts_with_all_it_knew() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut core = open(dir.path());
        core.compact_every(2048);
        core.register_consumer("http://127.0.0.1:7".into(), None, Time(0))
            .expect("consumer");
        let gone = register(&mut core, StageId(1), 0);
        core.apply(Command::Drain { worker: gone }, Time(0))
            .expect("drain");
        assert!(core.is_drained(gone));
        let workers = [
            register(&mut core, StageId(0), 0),
            register(&mut core, StageId(1), 0),
        ];
        let worker = workers[1];
        let file = dir.path().join(JOURNAL_FILE);
        let mut largest = 0;
        for at in 1..=400 {
            let mut step = StepId::new(0, 0);
            for (stage, worker) in (0..).map(StageId).zip(workers) {
                let events = core
                    .apply(Command::RequestLease { worker }, Time(at))
                    .expect("lease");
                let Some(Event::LeaseGranted { step: leased, .. }) = events.first().cloned() else {
                    panic!("no grant: {events:?}");
                };
                step = leased;
                let command = Command::Complete {
                    worker,
                    stage,
                    step,
                };
                core.apply(command, Time(at)).expect("complete");
            }
            core.apply(Command::Consumed { watermark: step }, Time(at))
                .expect("consume");
            largest = largest.max(std::fs::metadata(&file).expect("stat").len());
        }
        // The file never held more than its header and snapshot, the growth at which the
        // next compaction is due (4x the snapshot's size, which is above 2 KB) and one
        // request's line.
        let compacted = core.journal.compacted();
        assert_eq!(core.compact_due, 2048.max(4 * compacted));
        // What the status answer reports: the file's length, and how often it was compacted.
        let now = std::fs::metadata(&file).expect("stat").len();
        assert_eq!(core.journal_bytes(), now);
        assert!(
            core.counters.journal_compactions > 5,
            "{}",
            core.counters.journal_compactions
        );
        assert!(largest <= compacted + core.compact_due + 256, "{largest}");
        let second = std::fs::read_to_string(&file).expect("read");
        assert!(second
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("\"Snapshot\"")));
        let live = core.state().clone();
        drop(core);

        let mut core = open(dir.path());
        assert_eq!(core.state(), &live);
        assert_eq!(core.receiver_addr(), "http://127.0.0.1:7");
        assert!(core.is_drained(gone));
        assert!(core.allocate_worker().0 > worker.0, "ids are never reused");
    }

    #[test]
    fn a_compaction_in_the_consumers_registration_keeps_its_address() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut core = open(dir.path());
        // Due at once: the header alone is more than a byte.
        core.compact_every(1);
        core.register_consumer("http://127.0.0.1:7".into(), None, Time(0))
            .expect("consumer");
        assert!(core.journal.compacted() > 0, "it compacted");
        drop(core);
        assert_eq!(open(dir.path()).receiver_addr(), "http://127.0.0.1:7");
    }

    #[test]
    fn a_journal_an_older_build_wrote_is_compacted_at_the_first_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut core = open(dir.path());
        let worker = register(&mut core, StageId(0), 0);
        drop(core);
        // Line 1 as format 2 said it (formats 2 and 3 differ only in the snapshot record).
        let file = dir.path().join(JOURNAL_FILE);
        let text = std::fs::read_to_string(&file).expect("read");
        let (first, rest) = text.split_once('\n').expect("lines");
        let json = first
            .split_once(' ')
            .expect("crc")
            .1
            .replace("\"format\":3", "\"format\":2");
        let line = format!("{:08x} {json}", crc32c::crc32c(json.as_bytes()));
        std::fs::write(&file, format!("{line}\n{rest}")).expect("write");

        let mut core = open(dir.path());
        assert_eq!(core.journal.format_on_file(), 2);
        core.compact_every(super::super::DEFAULT_COMPACT_BYTES);
        core.apply(Command::Heartbeat { worker }, Time(5))
            .expect("heartbeat");
        assert_eq!(
            core.journal.format_on_file(),
            crate::journal::JOURNAL_FORMAT
        );
        let live = core.state().clone();
        drop(core);
        let text = std::fs::read_to_string(&file).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("\"format\":3"), "{}", lines[0]);
        assert!(lines[1].contains("\"Snapshot\""), "{}", lines[1]);
        assert_eq!(open(dir.path()).state(), &live);
    }

    #[test]
    fn a_snapshot_after_other_records_is_corruption_naming_its_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut core = open(dir.path());
        register(&mut core, StageId(0), 0);
        let snapshot = Snapshot {
            state: core.state().snapshot(),
            receiver_addr: String::new(),
            drained: vec![],
            next_worker: 2,
        };
        core.write(Time(1), vec![Record::Snapshot(Box::new(snapshot))])
            .expect("write");
        drop(core);
        let err = Core::open(dir.path(), JobId(1), &config()).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("line 3") && text.contains("snapshot"),
            "{text}"
        );
    }
}
