//! The dispatcher's journal: an append-only file of what it applied, so that a restart
//! rebuilds the same state.
//!
//! # Format
//! `DIR/journal.jsonl` holds one record per line, `CRC JSON\n`, where CRC is the CRC-32C of
//! the JSON text as 8 lowercase hex digits. JSON so that a person can read it with `cut` and
//! `jq`; a CRC per line so that a torn or flipped line is told apart from a valid one.
//! - Line 1 is the [`Header`]: the format, the job and the [`DispatcherConfig`]. A journal is
//!   only reopened under the same job and config; the events would mean another data order
//!   otherwise.
//! - Every later line is a [`Batch`]: the records one request produced and the time it was
//!   applied. A batch is written with one `write`; [`SyncPoint::sync_to`] makes it durable
//!   (group commit) for the requests that must be durable before their answer (the crate
//!   docs' "Durability" says which).
//! - Format 2 (format 1 is still read): a grant keeps its step's batch as a CRC of its record
//!   ids, which a replay recomputes from the config and checks (see [`crate::GrantedBatch`]);
//!   grants of consecutive steps to one worker, and retirements of consecutive steps, go as
//!   one [`Record::Granted`] or [`Record::Retired`] each (a lease request of 512 steps is one
//!   record, not 512). Format 1 listed every grant's ids and wrote one record an event.
//! - Format 3 (formats 1 and 2 are still read): completions of consecutive steps go as one
//!   [`Record::Completed`] each too, a run goes on across an epoch's end (a format-2 run,
//!   which never reaches one, reads the same), and a journal may be compacted. Once the lines appended
//!   since the last compaction pass a size ([`crate::service::DEFAULT_COMPACT_BYTES`]), the
//!   service rewrites the journal as its header and one batch holding a [`Record::Snapshot`]
//!   of its state ([`Journal::compact`]): the file, and what a restart reads, stay in
//!   proportion to the state, not to the job's history.
//!
//! # Recovery
//! A crash mid-write leaves a torn last line: without its newline, or failing its CRC or its
//! parse. [`Journal::open`] truncates such a last line away (its request was never answered)
//! and says so in [`Recovered::torn`]; a bad line anywhere else is corruption, an error naming
//! the file and line. A crash during a compaction leaves the old journal whole, or the new
//! one, and perhaps a [`COMPACTING_FILE`] beside it, which opening removes. Nothing in a
//! journal can make opening it panic.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::config::DispatcherConfig;
use crate::ids::{JobId, StageId, StepId, Time, WorkerId};
use crate::order::PickedSeed;
use crate::state::{Event, GrantedBatch, StateSnapshot};

/// The journal's file name inside the journal directory.
pub const JOURNAL_FILE: &str = "journal.jsonl";

/// Where [`Journal::compact`] writes the compacted journal before renaming it over
/// [`JOURNAL_FILE`]; a leftover (a crash before the rename) is removed on open.
pub const COMPACTING_FILE: &str = "journal.jsonl.compacting";

/// The journal format this build writes. Format 2 keeps a grant's batch as its CRC (see
/// [`crate::GrantedBatch`]) where format 1 listed its record ids; format 3 may open with a
/// [`Record::Snapshot`].
pub const JOURNAL_FORMAT: u32 = 3;

/// The oldest format this build reads. A journal of an older format is read and appended to
/// as it is (its header keeps its format; its later records are written as this build writes
/// them), so a job survives the upgrade; a build that reads only the older format refuses
/// those later lines. The service compacts it at its first change (unless compaction is off),
/// which rewrites it in this build's format.
pub const OLDEST_JOURNAL_FORMAT: u32 = 1;

/// The longest line read or written. A batch is at most one lease's records (bounded by the
/// service's batch-size limit) and a few small events, far below this; a longer "line" is
/// corruption, and reading it must not exhaust memory.
pub const MAX_LINE_BYTES: u64 = 256 << 20;

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

/// The records of one request, applied at `at` on the dispatcher's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub at: Time,
    pub records: Vec<Record>,
}

/// The errors of opening, reading and appending to a journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("journal {} line {line}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    #[error("journal {} has format {found}; this build reads formats {OLDEST_JOURNAL_FORMAT} to {JOURNAL_FORMAT}", path.display())]
    Format { path: PathBuf, found: u32 },
    #[error("journal {} belongs to {found}, not {expected}", path.display())]
    OtherJob {
        path: PathBuf,
        found: JobId,
        expected: JobId,
    },
    #[error(
        "journal {} was written with another dispatcher config (differs in: {}); restart with \
         the config it was written with, or move the journal away to start the job afresh",
        path.display(),
        fields.join(", ")
    )]
    ConfigMismatch { path: PathBuf, fields: Vec<String> },
    #[error("journal {}: a batch of {bytes} bytes exceeds the {MAX_LINE_BYTES}-byte line limit", path.display())]
    TooLarge { path: PathBuf, bytes: usize },
}

/// A torn last line that [`Journal::open`] cut away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Its line number (1-based).
    pub line: u64,
    /// The bytes removed.
    pub bytes: u64,
    pub reason: String,
}

/// A journal opened for appending, with what it already held.
#[derive(Debug)]
pub struct Recovered {
    pub journal: Journal,
    /// Every batch, with its line number, in file order.
    pub batches: Vec<(u64, Batch)>,
    pub torn: Option<TornTail>,
}

/// A journal opened for appending whose batches went, one at a time, to the caller (see
/// [`Journal::open_replaying`]).
#[derive(Debug)]
pub struct Reopened {
    pub journal: Journal,
    pub torn: Option<TornTail>,
}

/// An open journal; every [`Journal::append`] is durable when it returns, an
/// [`Journal::append_unsynced`] once a later [`SyncPoint::sync_to`] covers it.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    /// What line 1 says (the format this build writes, once compacted).
    header: Header,
    sync: std::sync::Arc<SyncPoint>,
    /// After [`Journal::write_behind`]: lines go to the writer thread, in order.
    writer: Option<std::sync::mpsc::SyncSender<ToWriter>>,
    /// Bytes of the lines after the header and the snapshot (the file's whole length when
    /// opened): what a compaction would save.
    grown: u64,
    /// The last compaction's header and snapshot lines, in bytes (0 before the first).
    compacted: u64,
    /// The format line 1 says: an older one for a journal an older build wrote, until its
    /// first compaction rewrites it.
    format_on_file: u32,
}

/// What the writer thread is handed, in order.
#[derive(Debug)]
enum ToWriter {
    Line(String),
    /// From now on, lines go to this file (a compaction renamed it over the journal).
    Switch(File),
}

/// The most lines waiting for the writer thread. When the disk falls this far behind, an
/// append waits for room: the dispatcher slows to its disk rather than queue without bound.
pub const WRITE_BEHIND_LINES: usize = 4096;

/// The most bytes the writer thread gathers into one `write`.
const WRITE_BEHIND_BYTES: usize = 1 << 20;

/// Durability, shared outside the service's lock so that concurrent requests share one
/// `fdatasync` (group commit): a request appends its line under the lock, then waits, after
/// releasing it, until the file is synced at least to the end of its line. Lines are
/// sequential, so a sync that covers a line covers every line before it.
#[derive(Debug)]
pub struct SyncPoint {
    /// The journal's file; a compaction replaces it (under `synced`'s lock, then its own).
    file: std::sync::Mutex<File>,
    /// Bytes appended so far (written, or queued for the writer thread): the offset the
    /// last appended line ends at.
    written: std::sync::atomic::AtomicU64,
    /// Bytes the file holds (`write` returned for them); a condvar wakes waiters.
    on_file: std::sync::Mutex<u64>,
    written_out: std::sync::Condvar,
    /// Bytes known to be on disk; the lock also serializes the syncs.
    synced: std::sync::Mutex<u64>,
    /// A sync failed: nothing after it can be trusted to be on disk.
    failed: std::sync::atomic::AtomicBool,
}

impl SyncPoint {
    /// The offset everything written so far ends at.
    pub fn written(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn has_failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Records that the file now holds `bytes` more (the writer thread's `write` returned).
    fn wrote(&self, bytes: u64) {
        let mut on_file = self
            .on_file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *on_file = on_file.saturating_add(bytes);
        self.written_out.notify_all();
    }

    /// A write failed: nothing after it reaches the file.
    fn fail(&self) {
        self.failed.store(true, std::sync::atomic::Ordering::SeqCst);
        let _guard = self
            .on_file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.written_out.notify_all();
    }

    /// Waits until the file holds at least `offset` bytes; returns what it holds.
    fn wait_on_file(&self, offset: u64) -> std::io::Result<u64> {
        let mut on_file = self
            .on_file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *on_file < offset {
            if self.has_failed() {
                return Err(std::io::Error::other("a journal write failed"));
            }
            on_file = self
                .written_out
                .wait(on_file)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        Ok(*on_file)
    }

    /// Returns once the file is on disk at least up to `offset`, syncing if nobody has yet.
    pub fn sync_to(&self, offset: u64) -> std::io::Result<()> {
        self.wait_on_file(offset)?;
        let mut synced = self
            .synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *synced >= offset {
            return Ok(());
        }
        // Everything on the file before this sync starts is covered by it.
        let target = self.wait_on_file(offset)?;
        let file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = file.sync_data() {
            self.failed.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(e);
        }
        *synced = target.max(*synced);
        Ok(())
    }
}

/// Gives a config whose chain shuffles unseeded a seed: the one its journal in `dir` recorded
/// (so that a restarted dispatcher keeps the order), else a new random one, which the journal
/// then records in its header. `None` when the chain needs none.
pub fn pick_seed(
    config: &mut DispatcherConfig,
    dir: &Path,
) -> Result<Option<PickedSeed>, JournalError> {
    let Some(chain) = config.chain.as_mut() else {
        return Ok(None);
    };
    if !chain.needs_picked_seed() || chain.picked_seed.is_some() {
        return Ok(None);
    }
    let path = dir.join(JOURNAL_FILE);
    let recorded = match File::open(&path) {
        Ok(file) => {
            let mut first = Vec::new();
            BufReader::new(file)
                .take(MAX_LINE_BYTES)
                .read_until(b'\n', &mut first)
                .map_err(|source| JournalError::Io {
                    path: path.clone(),
                    source,
                })?;
            first
                .strip_suffix(b"\n")
                .and_then(|body| check_line(body).ok())
                .and_then(|text| serde_json::from_str::<Header>(&text).ok())
                .and_then(|h| h.config.chain?.picked_seed)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(source) => return Err(JournalError::Io { path, source }),
    };
    Ok(chain.pick_seed(recorded))
}

impl Journal {
    /// Opens (or creates) the journal in `dir` for `job` under `config`: checks the header,
    /// reads every batch, truncates a torn last line, and positions for appending. Holds every
    /// batch at once: for tests and small journals; a dispatcher replays with
    /// [`Journal::open_replaying`].
    pub fn open(
        dir: &Path,
        job: JobId,
        config: &DispatcherConfig,
    ) -> Result<Recovered, JournalError> {
        let mut batches = Vec::new();
        let reopened = Self::open_replaying(dir, job, config, |line, batch| {
            batches.push((line, batch));
            Ok::<(), JournalError>(())
        })?;
        Ok(Recovered {
            journal: reopened.journal,
            batches,
            torn: reopened.torn,
        })
    }

    /// [`Journal::open`], handing each batch to `replay` as it is read (in file order, with
    /// its line number) instead of holding them all: the memory a restart takes is the
    /// state's, not the journal's. A long job's journal grows by a few hundred bytes a step,
    /// and holding it whole (its text, then its parsed batches) took about twice its size.
    /// The file changes (a torn last line cut away, a header written) only after every batch
    /// was read and taken: an error from `replay` or from the file leaves it as it was.
    pub fn open_replaying<E: From<JournalError>>(
        dir: &Path,
        job: JobId,
        config: &DispatcherConfig,
        mut replay: impl FnMut(u64, Batch) -> Result<(), E>,
    ) -> Result<Reopened, E> {
        let path = dir.join(JOURNAL_FILE);
        let io_err = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let leftover = dir.join(COMPACTING_FILE);
        remove_leftover(&leftover).map_err(|source| JournalError::Io {
            path: leftover.clone(),
            source,
        })?;
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io_err)?;
        let sync_file = file.try_clone().map_err(io_err)?;
        let mut journal = Journal {
            path,
            file,
            header: Header {
                format: JOURNAL_FORMAT,
                job,
                config: config.clone(),
            },
            grown: 0,
            compacted: 0,
            format_on_file: JOURNAL_FORMAT,
            sync: std::sync::Arc::new(SyncPoint {
                file: std::sync::Mutex::new(sync_file),
                written: std::sync::atomic::AtomicU64::new(0),
                on_file: std::sync::Mutex::new(0),
                written_out: std::sync::Condvar::new(),
                synced: std::sync::Mutex::new(0),
                failed: std::sync::atomic::AtomicBool::new(false),
            }),
            writer: None,
        };
        // Check everything before changing the file: a refused journal is left as it was.
        // The first good line is the header; every later one a batch.
        let mut header = None;
        let scan = journal.scan(|line, text| {
            if header.is_some() {
                replay(line, journal.parse::<Batch>(line, &text)?)
            } else {
                header = Some(journal.check_header(line, &text, job, config)?);
                Ok(())
            }
        })?;
        let mut torn = None;
        if let Some(bad) = scan.torn {
            let removed = scan.end.saturating_sub(bad.offset);
            tracing::warn!(
                journal = %journal.path.display(),
                line = bad.line,
                bytes = removed,
                reason = %bad.reason,
                "truncating a torn last journal line (a crash mid-write; its request was never answered)"
            );
            journal.truncate(bad.offset)?;
            torn = Some(TornTail {
                line: bad.line,
                bytes: removed,
                reason: bad.reason,
            });
        }
        match header {
            Some(format) => journal.format_on_file = format,
            None => journal.write_header(job, config)?,
        }
        // What is in the file now is on disk (checked, truncated or synced above).
        let end = journal
            .file
            .metadata()
            .map_err(|source| journal.io(source))?
            .len();
        journal.grown = end;
        journal
            .sync
            .written
            .store(end, std::sync::atomic::Ordering::SeqCst);
        *journal
            .sync
            .on_file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = end;
        *journal
            .sync
            .synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = end;
        Ok(Reopened { journal, torn })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `batch` as one line and waits until it is on disk.
    pub fn append(&mut self, batch: &Batch) -> Result<(), JournalError> {
        let end = self.append_unsynced(batch)?;
        self.sync.sync_to(end).map_err(|source| self.io(source))
    }

    /// Appends `batch` as one line without waiting for the disk; returns the offset that
    /// [`SyncPoint::sync_to`] must reach before the change may be acknowledged.
    pub fn append_unsynced(&mut self, batch: &Batch) -> Result<u64, JournalError> {
        if self.sync.has_failed() {
            return Err(self.io(std::io::Error::other("an earlier journal sync failed")));
        }
        let line = self.encode(batch)?;
        let bytes = line.len() as u64;
        let end = self
            .sync
            .written
            .fetch_add(bytes, std::sync::atomic::Ordering::SeqCst)
            + bytes;
        self.grown = self.grown.saturating_add(bytes);
        match &self.writer {
            Some(writer) => {
                if writer.send(ToWriter::Line(line)).is_err() {
                    self.sync.fail();
                    return Err(self.io(std::io::Error::other("the journal writer stopped")));
                }
            }
            None => {
                if let Err(source) = self.file.write_all(line.as_bytes()) {
                    self.sync.fail();
                    return Err(self.io(source));
                }
                self.sync.wrote(bytes);
            }
        }
        Ok(end)
    }

    /// From now on, appended lines are written by a thread of their own, in order, gathered
    /// into one `write` when several are waiting: [`Journal::append_unsynced`] returns without
    /// waiting for the file, so a `write` held up behind an `fdatasync` (the kernel keeps a page
    /// stable while it is written back) holds up nobody who does not need the disk.
    /// [`SyncPoint::sync_to`] waits for the thread before it syncs. A process killed before the
    /// thread wrote a line loses it, as an OS crash loses unsynced lines; the crate docs
    /// ("Durability") say why only answers that may be lost are given before a sync.
    pub fn write_behind(&mut self) -> Result<(), JournalError> {
        if self.writer.is_some() {
            return Ok(());
        }
        let mut file = self.file.try_clone().map_err(|source| self.io(source))?;
        let sync = self.sync.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel::<ToWriter>(WRITE_BEHIND_LINES);
        std::thread::Builder::new()
            .name("lode-journal".into())
            .spawn(move || {
                let mut buf = Vec::new();
                let mut next = rx.recv().ok();
                while let Some(first) = next.take() {
                    buf.clear();
                    match first {
                        ToWriter::Switch(to) => {
                            file = to;
                            next = rx.recv().ok();
                            continue;
                        }
                        ToWriter::Line(line) => buf.extend_from_slice(line.as_bytes()),
                    }
                    // Gather what else waits, up to a switch (it is next round's first).
                    while buf.len() < WRITE_BEHIND_BYTES {
                        match rx.try_recv() {
                            Ok(ToWriter::Line(more)) => buf.extend_from_slice(more.as_bytes()),
                            Ok(switch) => {
                                next = Some(switch);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    if let Err(err) = file.write_all(&buf) {
                        tracing::error!(cause = %err, "journal write failed; the dispatcher accepts no more changes");
                        sync.fail();
                        return;
                    }
                    sync.wrote(buf.len() as u64);
                    if next.is_none() {
                        next = rx.recv().ok();
                    }
                }
            })
            .map_err(|source| self.io(source))?;
        self.writer = Some(tx);
        Ok(())
    }

    /// The journal's durability point (see [`SyncPoint`]).
    pub fn sync_point(&self) -> std::sync::Arc<SyncPoint> {
        self.sync.clone()
    }

    /// Bytes of the lines after the header and the last snapshot (all of the file's when it
    /// was opened): what [`Journal::compact`] would replace.
    pub fn grown(&self) -> u64 {
        self.grown
    }

    /// The last compaction's header and snapshot lines, in bytes; 0 before the first.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// The format the file's header says: [`JOURNAL_FORMAT`] unless an older build wrote it
    /// and it was not compacted since.
    pub fn format_on_file(&self) -> u32 {
        self.format_on_file
    }

    /// Replaces the journal by its header and one batch at `at` holding `snapshot`, which
    /// must be what every line so far built. Everything appended before is synced first; the
    /// compacted journal is written beside the journal ([`COMPACTING_FILE`]), synced, and
    /// renamed over it, and the directory synced: a crash at any instant leaves either the
    /// old journal (and perhaps a leftover that the next open removes) or the new one, and
    /// both replay to the same state. Appends from then on go to the new file.
    ///
    /// A failure before the rename leaves the old journal in use, whole: the caller may go on
    /// and try again later. A failure after it (syncing the directory, taking the new file
    /// into use) fails the journal like a failed write: [`SyncPoint::has_failed`] says so.
    pub fn compact(&mut self, at: Time, snapshot: Snapshot) -> Result<(), JournalError> {
        if self.sync.has_failed() {
            return Err(self.io(io::Error::other("an earlier journal write failed")));
        }
        let mut text = self.encode(&self.header)?;
        text.push_str(&self.encode(&Batch {
            at,
            records: vec![Record::Snapshot(Box::new(snapshot))],
        })?);
        // Until the rename, the old file is the journal: everything appended so far must be
        // on it, and on disk, for a crash before the rename to lose nothing answered.
        let end = self.sync.written();
        self.sync.sync_to(end).map_err(|source| self.io(source))?;
        let temp = self.path.with_file_name(COMPACTING_FILE);
        let written = remove_leftover(&temp).and_then(|()| {
            let mut file = OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .open(&temp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&temp, &self.path)?;
            Ok(file)
        });
        let file = match written {
            Ok(file) => file,
            Err(source) => {
                let _ = std::fs::remove_file(&temp);
                return Err(JournalError::Io { path: temp, source });
            }
        };
        // The new file is the journal now: a failure from here on fails the journal.
        let switched = self.sync_dir().and_then(|()| {
            let (for_sync, for_writer) = file
                .try_clone()
                .and_then(|a| Ok((a, file.try_clone()?)))
                .map_err(|source| self.io(source))?;
            if let Some(writer) = &self.writer {
                writer
                    .send(ToWriter::Switch(for_writer))
                    .map_err(|_| self.io(io::Error::other("the journal writer stopped")))?;
            }
            *self
                .sync
                .file
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = for_sync;
            Ok(())
        });
        if let Err(err) = switched {
            self.sync.fail();
            return Err(err);
        }
        self.file = file;
        self.grown = 0;
        self.compacted = text.len() as u64;
        self.format_on_file = JOURNAL_FORMAT;
        Ok(())
    }

    /// Reads the file line by line, handing every complete line whose CRC holds to `good` (its
    /// number and JSON text) as it is read, and finds a torn last line.
    fn scan<E: From<JournalError>>(
        &self,
        mut good: impl FnMut(u64, String) -> Result<(), E>,
    ) -> Result<Scan, E> {
        let mut reader = BufReader::new(&self.file);
        let mut out = Scan::default();
        // A bad line is torn if it is the last one, corruption if another follows it.
        let mut suspect: Option<Bad> = None;
        let mut buf = Vec::new();
        let mut line = 0u64;
        loop {
            buf.clear();
            let n = (&mut reader)
                .take(MAX_LINE_BYTES.saturating_add(1))
                .read_until(b'\n', &mut buf)
                .map_err(|source| JournalError::Io {
                    path: self.path.clone(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            line += 1;
            if let Some(bad) = suspect.take() {
                return Err(self.corrupt(bad.line, bad.reason).into());
            }
            let offset = out.end;
            out.end = out.end.saturating_add(n as u64);
            let verdict = match buf.strip_suffix(b"\n") {
                None if buf.len() as u64 > MAX_LINE_BYTES => {
                    return Err(self
                        .corrupt(
                            line,
                            format!("longer than the {MAX_LINE_BYTES}-byte line limit"),
                        )
                        .into());
                }
                None => Err("no newline at its end".to_owned()),
                Some(body) => check_line(body),
            };
            match verdict {
                Ok(text) => good(line, text)?,
                Err(reason) => {
                    suspect = Some(Bad {
                        line,
                        offset,
                        reason,
                    })
                }
            }
        }
        out.torn = suspect;
        Ok(out)
    }

    fn check_header(
        &self,
        line: u64,
        text: &str,
        job: JobId,
        config: &DispatcherConfig,
    ) -> Result<u32, JournalError> {
        // The format first, alone: a later format may have changed the rest of the header.
        #[derive(Deserialize)]
        struct Format {
            format: u32,
        }
        let Format { format } = self.parse(line, text)?;
        if !(OLDEST_JOURNAL_FORMAT..=JOURNAL_FORMAT).contains(&format) {
            return Err(JournalError::Format {
                path: self.path.clone(),
                found: format,
            });
        }
        let header: Header = self.parse(line, text)?;
        if header.job != job {
            return Err(JournalError::OtherJob {
                path: self.path.clone(),
                found: header.job,
                expected: job,
            });
        }
        if header.config != *config {
            return Err(JournalError::ConfigMismatch {
                path: self.path.clone(),
                fields: differing_fields(&header.config, config),
            });
        }
        Ok(format)
    }

    fn write_header(&mut self, job: JobId, config: &DispatcherConfig) -> Result<(), JournalError> {
        let header = Header {
            format: JOURNAL_FORMAT,
            job,
            config: config.clone(),
        };
        let line = self.encode(&header)?;
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.sync_all())
            .map_err(|source| self.io(source))?;
        self.sync_dir()
    }

    fn truncate(&mut self, len: u64) -> Result<(), JournalError> {
        self.file
            .set_len(len)
            .and_then(|()| self.file.sync_all())
            .map_err(|source| self.io(source))
    }

    /// Makes the file's directory entry durable (a new journal must survive a crash too).
    fn sync_dir(&self) -> Result<(), JournalError> {
        #[cfg(unix)]
        if let Some(dir) = self.path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|source| self.io(source))?;
        }
        Ok(())
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<String, JournalError> {
        let json = serde_json::to_string(value).map_err(|e| JournalError::Io {
            path: self.path.clone(),
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        })?;
        let line = format!("{:08x} {json}\n", crc32c::crc32c(json.as_bytes()));
        if line.len() as u64 > MAX_LINE_BYTES {
            return Err(JournalError::TooLarge {
                path: self.path.clone(),
                bytes: line.len(),
            });
        }
        Ok(line)
    }

    fn parse<T: DeserializeOwned>(&self, line: u64, text: &str) -> Result<T, JournalError> {
        serde_json::from_str(text)
            .map_err(|e| self.corrupt(line, format!("not a journal record: {e}")))
    }

    fn corrupt(&self, line: u64, reason: String) -> JournalError {
        JournalError::Corrupt {
            path: self.path.clone(),
            line,
            reason,
        }
    }

    fn io(&self, source: io::Error) -> JournalError {
        JournalError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// Removes a compaction's leftover at `path`, if any (a crash before its rename).
fn remove_leftover(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::warn!(file = %path.display(), "removed a compaction's leftover (a crash before it finished; the journal is whole)");
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[derive(Debug, Default)]
struct Scan {
    /// The bad last line, if any.
    torn: Option<Bad>,
    /// The file's length.
    end: u64,
}

#[derive(Debug)]
struct Bad {
    line: u64,
    offset: u64,
    reason: String,
}

/// The JSON text of a line body (`CRC JSON`, without the newline) whose CRC holds.
fn check_line(body: &[u8]) -> Result<String, String> {
    let (crc, json) = match (body.get(..8), body.get(8), body.get(9..)) {
        (Some(crc), Some(b' '), Some(json)) => (crc, json),
        _ => return Err("not `CRC JSON`".to_owned()),
    };
    let crc = std::str::from_utf8(crc)
        .ok()
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .ok_or_else(|| "the CRC is not 8 hex digits".to_owned())?;
    let actual = crc32c::crc32c(json);
    if actual != crc {
        return Err(format!(
            "CRC mismatch (line says {crc:08x}, content has {actual:08x})"
        ));
    }
    String::from_utf8(json.to_vec()).map_err(|_| "not UTF-8".to_owned())
}

/// The top-level fields in which two configs differ, for the mismatch error.
fn differing_fields(a: &DispatcherConfig, b: &DispatcherConfig) -> Vec<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return vec!["(unknown)".to_owned()];
    };
    let mut fields: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(b.keys().filter(|k| !a.contains_key(*k)).cloned())
        .collect();
    fields.sort();
    fields
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::config::Shuffle;

    fn config() -> DispatcherConfig {
        DispatcherConfig {
            records: 10,
            batch_size: 3,
            drop_remainder: false,
            shuffle: Shuffle::Seeded { seed: 7 },
            chain: None,
            epochs: Some(2),
            restart_every: None,
            lease_duration: Duration::from_millis(100),
            max_leases_per_worker: 2,
            stages: 1,
        }
    }

    fn batch(at: u64, worker: u64) -> Batch {
        Batch {
            at: Time(at),
            records: vec![Record::Event(Event::WorkerRegistered {
                worker: WorkerId(worker),
                stage: StageId(0),
                at: Time(at),
            })],
        }
    }

    fn open(dir: &Path) -> Result<Recovered, JournalError> {
        Journal::open(dir, JobId(1), &config())
    }

    fn file_of(dir: &Path) -> PathBuf {
        dir.join(JOURNAL_FILE)
    }

    /// A journal in `dir` holding `batch(1, 1)` to `batch(3, 3)`; its file.
    fn three_batches(dir: &Path) -> PathBuf {
        let mut rec = open(dir).expect("create");
        for at in 1..=3 {
            rec.journal.append(&batch(at, at)).expect("append");
        }
        file_of(dir)
    }

    #[test]
    fn appended_batches_read_back_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rec = open(dir.path()).expect("create");
        assert!(rec.batches.is_empty() && rec.torn.is_none());
        rec.journal.append(&batch(1, 1)).expect("append");
        rec.journal.append(&batch(2, 2)).expect("append");
        drop(rec);
        let mut rec = open(dir.path()).expect("reopen");
        assert_eq!(rec.batches, vec![(2, batch(1, 1)), (3, batch(2, 2))]);
        rec.journal
            .append(&batch(3, 3))
            .expect("append after reopen");
        drop(rec);
        assert_eq!(open(dir.path()).expect("reopen").batches.len(), 3);
    }

    /// The events `records` stand for, in order, in epochs of `per_epoch` steps.
    fn events_of(records: Vec<Record>, per_epoch: u64) -> Vec<Event> {
        let mut out = Vec::new();
        for r in records {
            r.each_event(per_epoch, |e| {
                out.push(e);
                Ok::<(), ()>(())
            })
            .expect("collect");
        }
        out
    }

    #[test]
    fn runs_of_grants_retirements_and_completions_are_one_record_each() {
        let (w, s) = (WorkerId(1), StageId(0));
        let grant = |step, deadline, crc| Event::LeaseGranted {
            worker: w,
            stage: s,
            step: StepId::new(0, step),
            deadline: Time(deadline),
            batch: GrantedBatch::Crc(crc),
        };
        let retire = |worker, step| Event::LeaseRetired {
            worker: WorkerId(worker),
            stage: s,
            step: StepId::new(0, step),
        };
        let complete = |epoch, step| Event::StepCompleted {
            worker: w,
            stage: s,
            step: StepId::new(epoch, step),
        };
        let events = vec![
            grant(4, 9, 40),
            grant(5, 9, 50),
            grant(6, 9, 60),
            // Another deadline, then a gap: new records.
            grant(7, 10, 70),
            grant(9, 10, 90),
            Event::WatermarkAdvanced {
                watermark: StepId::new(0, 6),
            },
            retire(1, 4),
            retire(1, 5),
            retire(2, 6),
            // A run goes on into the next epoch (of 10 steps here); a gap breaks it.
            complete(0, 8),
            complete(0, 9),
            complete(1, 0),
            complete(1, 1),
            complete(1, 3),
            complete(1, 4),
        ];
        let records = Record::of_events(&events, 10);
        assert_eq!(
            records,
            vec![
                Record::Granted(GrantRun {
                    worker: w,
                    stage: s,
                    first: StepId::new(0, 4),
                    deadline: Time(9),
                    batches: vec![
                        GrantedBatch::Crc(40),
                        GrantedBatch::Crc(50),
                        GrantedBatch::Crc(60)
                    ],
                }),
                Record::Event(grant(7, 10, 70)),
                Record::Event(grant(9, 10, 90)),
                Record::Event(events[5].clone()),
                Record::Retired(StepRun {
                    worker: w,
                    stage: s,
                    first: StepId::new(0, 4),
                    count: 2,
                }),
                Record::Event(retire(2, 6)),
                Record::Completed(StepRun {
                    worker: w,
                    stage: s,
                    first: StepId::new(0, 8),
                    count: 4,
                }),
                Record::Completed(StepRun {
                    worker: w,
                    stage: s,
                    first: StepId::new(1, 3),
                    count: 2,
                }),
            ]
        );
        assert_eq!(events_of(records.clone(), 10), events);
        // In epochs of 9 steps, step 9 of epoch 0 is no step: the runs break around it.
        let nine = Record::of_events(&events, 9);
        assert_eq!(nine.len(), records.len() + 2, "{nine:?}");
        assert_eq!(events_of(nine, 9), events);
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        let step = (
            0u64..2,
            prop_oneof![0u64..6, Just(u64::MAX - 1), Just(u64::MAX)],
        )
            .prop_map(|(e, s)| StepId::new(e, s));
        prop_oneof![
            (0u64..2, 0u32..2, step.clone(), 0u64..2, any::<u32>()).prop_map(
                |(w, s, step, d, crc)| Event::LeaseGranted {
                    worker: WorkerId(w),
                    stage: StageId(s),
                    step,
                    deadline: Time(d),
                    batch: GrantedBatch::Crc(crc),
                }
            ),
            (0u64..2, 0u32..2, step.clone()).prop_map(|(w, s, step)| Event::LeaseRetired {
                worker: WorkerId(w),
                stage: StageId(s),
                step,
            }),
            (0u64..2, 0u32..2, step.clone()).prop_map(|(w, s, step)| Event::StepCompleted {
                worker: WorkerId(w),
                stage: StageId(s),
                step,
            }),
            (0u64..2, 0u32..2, step).prop_map(|(w, s, step)| Event::LeaseExpired {
                worker: WorkerId(w),
                stage: StageId(s),
                step,
            }),
        ]
    }

    proptest! {
        /// Whatever the events and the epochs' length (none, one step, shorter or longer
        /// than the steps the events name, the most), their records stand for exactly them,
        /// in order, through the journal's JSON too, and no two adjacent records could have
        /// been one run.
        #[test]
        fn records_stand_for_their_events(
            events in prop::collection::vec(arb_event(), 0..40),
            per_epoch in prop_oneof![Just(0u64), Just(1), Just(3), Just(6), Just(u64::MAX)],
        ) {
            let records = Record::of_events(&events, per_epoch);
            prop_assert!(records.len() <= events.len());
            let text = serde_json::to_string(&records).expect("serialize");
            let back: Vec<Record> = serde_json::from_str(&text).expect("deserialize");
            prop_assert_eq!(&back, &records);
            prop_assert_eq!(events_of(back, per_epoch), events.clone());
            for pair in records.windows(2) {
                let mut both = Vec::new();
                for r in pair {
                    both.extend(events_of(vec![r.clone()], per_epoch));
                }
                prop_assert_eq!(Record::of_events(&both, per_epoch).len(), 2, "{:?}", pair);
            }
        }

        /// Appends and compactions in any order, with or without the writer thread: a reopen
        /// reads the last compaction's snapshot and exactly the batches appended after it.
        #[test]
        fn a_reopen_reads_the_last_snapshot_and_what_followed(
            behind: bool,
            ops in prop::collection::vec(0u8..8, 0..40),
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut rec = open(dir.path()).expect("create");
            if behind {
                rec.journal.write_behind().expect("writer thread");
            }
            let mut expected = Vec::new();
            for (n, op) in (1..).zip(ops) {
                if op == 0 {
                    let snapshot = Snapshot { next_worker: n, ..snapshot_of(&[]) };
                    rec.journal.compact(Time(n), snapshot.clone()).expect("compact");
                    expected = vec![Batch {
                        at: Time(n),
                        records: vec![Record::Snapshot(Box::new(snapshot))],
                    }];
                } else {
                    rec.journal.append_unsynced(&batch(n, n)).expect("append");
                    expected.push(batch(n, n));
                }
            }
            let sync = rec.journal.sync_point();
            sync.sync_to(sync.written()).expect("sync");
            drop(rec);
            let got: Vec<Batch> = open(dir.path())
                .expect("reopen")
                .batches
                .into_iter()
                .map(|(_, b)| b)
                .collect();
            prop_assert_eq!(got, expected);
            prop_assert!(!dir.path().join(COMPACTING_FILE).exists());
        }
    }

    #[test]
    fn a_replay_takes_each_batch_as_it_is_read_and_its_refusal_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = three_batches(dir.path());
        // A torn last line, which a successful open cuts away.
        let mut torn = std::fs::read(&path).expect("read");
        torn.extend_from_slice(b"0123abcd {\"at\":4,\"rec");
        std::fs::write(&path, &torn).expect("write");

        // Refused at the second batch: the first was taken, the third never read, and the
        // file keeps its torn line (nothing changes before every batch was taken).
        let mut taken = Vec::new();
        let err = Journal::open_replaying(dir.path(), JobId(1), &config(), |line, b| {
            if line == 3 {
                return Err(JournalError::Corrupt {
                    path: PathBuf::from("replay"),
                    line,
                    reason: "refused".into(),
                });
            }
            taken.push((line, b));
            Ok(())
        })
        .expect_err("refused");
        assert!(
            matches!(err, JournalError::Corrupt { line: 3, .. }),
            "{err}"
        );
        assert_eq!(taken, vec![(2, batch(1, 1))]);
        assert_eq!(std::fs::read(&path).expect("read"), torn);

        // Taken whole: every batch in order, then the torn line is cut.
        let mut taken = Vec::new();
        let reopened = Journal::open_replaying(dir.path(), JobId(1), &config(), |line, b| {
            taken.push((line, b));
            Ok::<(), JournalError>(())
        })
        .expect("replayed");
        let expected: Vec<(u64, Batch)> = (1..=3).map(|at| (at + 1, batch(at, at))).collect();
        assert_eq!(taken, expected);
        assert_eq!(reopened.torn.map(|t| t.line), Some(5));
        assert!(std::fs::read(&path).expect("read").len() < torn.len());
    }

    #[test]
    fn one_sync_covers_every_line_written_before_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rec = open(dir.path()).expect("create");
        let sync = rec.journal.sync_point();
        let start = sync.written();
        let first = rec.journal.append_unsynced(&batch(1, 1)).expect("append");
        let second = rec.journal.append_unsynced(&batch(2, 2)).expect("append");
        assert!(start < first && first < second);
        assert_eq!(sync.written(), second);
        assert_eq!(
            std::fs::metadata(file_of(dir.path())).expect("stat").len(),
            second,
            "offsets are file positions"
        );
        // Syncing to the first line's end syncs the second too (group commit) ...
        sync.sync_to(first).expect("sync");
        assert_eq!(*sync.synced.lock().expect("lock"), second);
        // ... so a later request for the second returns without another sync.
        sync.sync_to(second).expect("already synced");
        drop(rec);
        assert_eq!(open(dir.path()).expect("reopen").batches.len(), 2);
    }

    #[test]
    fn written_behind_lines_reach_the_file_in_order_before_a_sync_returns() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rec = open(dir.path()).expect("create");
        rec.journal.write_behind().expect("writer thread");
        let sync = rec.journal.sync_point();
        let mut ends = Vec::new();
        for at in 1..=200 {
            ends.push(rec.journal.append_unsynced(&batch(at, at)).expect("append"));
        }
        assert!(ends.windows(2).all(|w| w[0] < w[1]));
        let last = *ends.last().expect("appended");
        sync.sync_to(last).expect("sync");
        assert_eq!(
            std::fs::metadata(file_of(dir.path())).expect("stat").len(),
            last
        );
        drop(rec);
        let rec = open(dir.path()).expect("reopen");
        let expected: Vec<(u64, Batch)> = (1..=200).map(|at| (at + 1, batch(at, at))).collect();
        assert_eq!(rec.batches, expected);
    }

    /// A snapshot standing for `batches`.
    fn snapshot_of(batches: &[Batch]) -> Snapshot {
        let mut state = crate::DispatcherState::new(config()).expect("config");
        for batch in batches {
            for record in batch.records.clone() {
                record
                    .each_event(config().steps_per_epoch(), |e| state.apply_event(&e))
                    .expect("applies");
            }
        }
        Snapshot {
            state: state.snapshot(),
            receiver_addr: "http://127.0.0.1:9".into(),
            drained: vec![],
            next_worker: 2,
        }
    }

    /// `batch(1, 1)`, then worker 1's heartbeats at 2 to `n`: a long history, a small state.
    fn heartbeats(n: u64) -> Vec<Batch> {
        let beat = |at| Batch {
            at: Time(at),
            records: vec![Record::Event(Event::WorkerHeartbeat {
                worker: WorkerId(1),
                at: Time(at),
            })],
        };
        std::iter::once(batch(1, 1))
            .chain((2..=n).map(beat))
            .collect()
    }

    /// The journal's lines, without their CRCs.
    fn lines(dir: &Path) -> Vec<String> {
        std::fs::read_to_string(file_of(dir))
            .expect("read")
            .lines()
            .map(|l| l.split_once(' ').expect("crc").1.to_owned())
            .collect()
    }

    #[test]
    fn a_compacted_journal_is_its_header_and_snapshot_and_appends_follow_them() {
        for behind in [false, true] {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut rec = open(dir.path()).expect("create");
            if behind {
                rec.journal.write_behind().expect("writer thread");
            }
            let history = heartbeats(50);
            for batch in &history {
                rec.journal.append_unsynced(batch).expect("append");
            }
            let grown = rec.journal.grown();
            assert!(grown > 50 * 60, "{grown}");
            let snapshot = snapshot_of(&history);
            rec.journal
                .compact(Time(50), snapshot.clone())
                .expect("compact");
            assert_eq!(rec.journal.grown(), 0);
            let compacted = std::fs::metadata(file_of(dir.path())).expect("stat").len();
            assert_eq!(rec.journal.compacted(), compacted);
            assert!(compacted < grown / 4, "{compacted} of {grown}");
            let sync = rec.journal.sync_point();
            let end = rec.journal.append_unsynced(&batch(51, 2)).expect("append");
            sync.sync_to(end).expect("sync");
            drop(rec);
            assert!(!dir.path().join(COMPACTING_FILE).exists());
            let header: Header = serde_json::from_str(&lines(dir.path())[0]).expect("header");
            assert_eq!(header.format, JOURNAL_FORMAT);
            let rec = open(dir.path()).expect("reopen");
            let compacted = Batch {
                at: Time(50),
                records: vec![Record::Snapshot(Box::new(snapshot))],
            };
            assert_eq!(
                rec.batches,
                vec![(2, compacted), (3, batch(51, 2))],
                "write behind: {behind}"
            );
        }
    }

    #[test]
    fn a_compaction_that_fails_before_its_rename_leaves_the_journal_in_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = three_batches(dir.path());
        let mut rec = open(dir.path()).expect("reopen");
        // A directory where the compacted file goes: it can be neither removed nor written.
        let blocker = dir.path().join(COMPACTING_FILE);
        std::fs::create_dir(&blocker).expect("mkdir");
        std::fs::write(blocker.join("x"), b"x").expect("fill");
        let before = std::fs::read(&path).expect("read");
        let err = rec
            .journal
            .compact(Time(3), snapshot_of(&[]))
            .expect_err("cannot compact");
        assert!(err.to_string().contains(COMPACTING_FILE), "{err}");
        assert!(!rec.journal.sync_point().has_failed());
        assert_eq!(std::fs::read(&path).expect("read"), before);
        rec.journal.append(&batch(4, 4)).expect("append goes on");
        drop(rec);
        // A leftover that cannot be removed stops the open, naming it.
        let err = open(dir.path()).expect_err("blocked");
        assert!(err.to_string().contains(COMPACTING_FILE), "{err}");
        std::fs::remove_dir_all(&blocker).expect("rm");
        let rec = open(dir.path()).expect("reopen");
        let expected: Vec<(u64, Batch)> = (1..=4).map(|at| (at + 1, batch(at, at))).collect();
        assert_eq!(rec.batches, expected);
    }

    #[test]
    fn a_leftover_of_a_crashed_compaction_is_removed_and_the_journal_read_as_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        three_batches(dir.path());
        let leftover = dir.path().join(COMPACTING_FILE);
        std::fs::write(&leftover, b"0000 {\"format\":3,").expect("leftover");
        let rec = open(dir.path()).expect("reopen");
        assert!(!leftover.exists());
        assert_eq!(rec.batches.len(), 3);
    }

    #[test]
    fn a_torn_last_line_is_truncated_and_appending_continues() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rec = open(dir.path()).expect("create");
        rec.journal.append(&batch(1, 1)).expect("append");
        drop(rec);
        let path = file_of(dir.path());
        let good = std::fs::read(&path).expect("read");
        // A crash mid-write: half of the next line, without its newline.
        let mut torn = good.clone();
        let next = {
            let j = open(dir.path()).expect("reopen").journal;
            j.encode(&batch(2, 2)).expect("encode")
        };
        torn.extend_from_slice(&next.as_bytes()[..next.len() / 2]);
        std::fs::write(&path, &torn).expect("write torn");

        let mut rec = open(dir.path()).expect("a torn tail is not an error");
        let cut = rec.torn.clone().expect("torn tail reported");
        assert_eq!(cut.line, 3);
        assert_eq!(cut.bytes, (next.len() / 2) as u64);
        assert_eq!(rec.batches, vec![(2, batch(1, 1))]);
        assert_eq!(std::fs::read(&path).expect("read"), good, "truncated back");
        rec.journal.append(&batch(2, 2)).expect("append");
        drop(rec);
        let rec = open(dir.path()).expect("reopen");
        assert_eq!(rec.batches, vec![(2, batch(1, 1)), (3, batch(2, 2))]);
        assert!(rec.torn.is_none());
    }

    #[test]
    fn a_complete_last_line_with_a_bad_crc_is_torn_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rec = open(dir.path()).expect("create");
        rec.journal.append(&batch(1, 1)).expect("append");
        drop(rec);
        let path = file_of(dir.path());
        let mut bytes = std::fs::read(&path).expect("read");
        let len = bytes.len();
        bytes[len - 3] ^= 0x01;
        std::fs::write(&path, &bytes).expect("write");
        let rec = open(dir.path()).expect("torn tail");
        assert!(rec.batches.is_empty());
        assert!(rec.torn.expect("torn").reason.contains("CRC"));
    }

    #[test]
    fn a_bad_line_before_the_end_is_an_error_naming_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = three_batches(dir.path());
        let text = std::fs::read_to_string(&path).expect("read");
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines[2] = lines[2].replace("Registered", "Registerex");
        std::fs::write(&path, lines.join("\n") + "\n").expect("write");
        let err = open(dir.path()).expect_err("corrupt");
        assert!(
            matches!(&err, JournalError::Corrupt { line: 3, .. }),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(JOURNAL_FILE) && msg.contains("line 3"),
            "{msg}"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let cases: [&[u8]; 6] = [
            b"\n\n",
            b"zzzzzzzz {}\n00000000 {}\n",
            b"\xff\xfe\xfd\n\x00\n",
            b"1 2\n3 4\n",
            b"00000000 \n\n",
            b"        \n \n",
        ];
        for garbage in cases {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::write(file_of(dir.path()), garbage).expect("write");
            let err = open(dir.path()).expect_err("garbage refused");
            assert!(
                matches!(err, JournalError::Corrupt { line: 1, .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn a_journal_of_another_config_or_job_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(open(dir.path()).expect("create"));
        let mut other = config();
        other.shuffle = Shuffle::Seeded { seed: 8 };
        other.batch_size = 4;
        let err = Journal::open(dir.path(), JobId(1), &other).expect_err("other config");
        match &err {
            JournalError::ConfigMismatch { fields, .. } => {
                assert_eq!(fields, &["batch_size", "shuffle"]);
            }
            other => panic!("unexpected {other}"),
        }
        assert!(err.to_string().contains("batch_size, shuffle"), "{err}");
        let err = Journal::open(dir.path(), JobId(2), &config()).expect_err("other job");
        assert!(matches!(err, JournalError::OtherJob { .. }), "{err}");
    }

    #[test]
    fn a_torn_header_starts_afresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(file_of(dir.path()), b"1234abcd {\"form").expect("write");
        let rec = open(dir.path()).expect("fresh");
        assert_eq!(rec.torn.as_ref().map(|t| t.line), Some(1));
        drop(rec);
        let rec = open(dir.path()).expect("reopen");
        assert!(rec.torn.is_none() && rec.batches.is_empty());
    }

    /// An unseeded shuffle gets a random seed on the first run; the journal's header keeps it
    /// and a restart reads it back, so the config matches and the order stays.
    #[test]
    fn a_picked_seed_survives_a_restart() {
        use crate::order::IndexChain;
        use lode_proto::plan::IndexOp;

        let unseeded = || {
            let chain = IndexChain {
                ops: vec![IndexOp::Shuffle {
                    buffer_size: 4,
                    seed: 0,
                    seed2: 0,
                    reshuffle_each_iteration: true,
                }],
                picked_seed: None,
            };
            DispatcherConfig {
                batch_size: 1,
                shuffle: Shuffle::Off,
                chain: Some(chain),
                ..config()
            }
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let mut first = unseeded();
        assert!(matches!(
            first.validate(),
            Err(crate::Error::InvalidConfig { field: "chain", .. })
        ));
        let picked = pick_seed(&mut first, dir.path())
            .expect("pick")
            .expect("needed");
        assert!(!picked.recorded);
        first.validate().expect("seeded now");
        drop(Journal::open(dir.path(), JobId(1), &first).expect("create"));

        let mut again = unseeded();
        let read = pick_seed(&mut again, dir.path())
            .expect("pick")
            .expect("needed");
        assert_eq!((read.seed, read.recorded), (picked.seed, true));
        assert_eq!(again, first);
        let mut rec = Journal::open(dir.path(), JobId(1), &again).expect("the same config reopens");
        // A compaction rewrites the header with the seed in it.
        let state = crate::DispatcherState::new(again.clone()).expect("state");
        let snapshot = Snapshot {
            state: state.snapshot(),
            receiver_addr: String::new(),
            drained: vec![],
            next_worker: 1,
        };
        rec.journal.compact(Time(1), snapshot).expect("compact");
        drop(rec);
        let mut after = unseeded();
        let read = pick_seed(&mut after, dir.path())
            .expect("pick")
            .expect("needed");
        assert_eq!((read.seed, read.recorded), (picked.seed, true));
        // A seeded chain needs none.
        assert_eq!(pick_seed(&mut again, dir.path()).expect("pick"), None);
    }
}
