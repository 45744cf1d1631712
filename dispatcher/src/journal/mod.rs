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
use crate::ids::{JobId, Time};
use crate::order::PickedSeed;

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

mod record;
#[cfg(test)]
mod tests;

pub use record::{GrantRun, Header, Record, Snapshot, StepRun};

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
