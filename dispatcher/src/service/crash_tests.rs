//! Crash points: the dispatcher killed between every pair of journal writes, and in the middle
//! of every write, with the rest of the job (workers, receiver, consumer) going on.
//!
//! A run of a small two-epoch job is recorded: simulated workers lease (one step or a batch),
//! push to a model receiver, complete; leases expire; workers are lost; the consumer reports
//! its watermark. After every request the world outside the dispatcher (what the workers hold,
//! what the receiver buffered and delivered, the acknowledged watermark) is remembered. Then,
//! for every prefix of the journal (every line boundary, and cuts one byte into a line, half
//! way and just short of its newline, i.e. torn last lines), the dispatcher is restarted from
//! that prefix and paired with
//!
//! - the world at the moment of a SIGKILL there (every answered request's line is in the
//!   prefix: the page cache outlives the process), and
//! - the latest world an OS crash could pair it with: every request answered up to the next
//!   synced one (`Register`, `Consumed`, a tick), whose lines the crash may lose,
//!
//! and the job is run to its end. The receiver model is the real one's delivery rule: in step
//! order, a step it holds or delivered is dropped. Checked: recovery always opens the prefix,
//! the job reaches end of data, every step of every epoch is delivered exactly once and in
//! order with the batch `index_batch` gives it, and a step pushed twice carries the identical
//! records both times.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::core::{ApplyError, Core};
use crate::journal::{COMPACTING_FILE, JOURNAL_FILE};
use crate::{
    index_batch, Command, DispatcherConfig, Epoch, Error, Event, GrantedBatch, JobId, Shuffle,
    Step, StepId, Time, WorkerId, PROTOCOL_VERSION,
};

const LEASE_MS: u64 = 50;

fn config() -> DispatcherConfig {
    DispatcherConfig {
        records: 20,
        batch_size: 3,
        drop_remainder: false,
        shuffle: Shuffle::Seeded { seed: 5 },
        chain: None,
        epochs: Some(2),
        restart_every: None,
        lease_duration: Duration::from_millis(LEASE_MS),
        max_leases_per_worker: 3,
        stages: 1,
    }
}

/// splitmix64: a deterministic stream of choices per seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// The receiving side: delivers in step order, drops what it holds or delivered.
#[derive(Debug, Clone, Default)]
struct Receiver {
    next: u64,
    buffer: BTreeMap<u64, Vec<u64>>,
    delivered: Vec<(u64, Vec<u64>)>,
}

impl Receiver {
    fn push(&mut self, seq: u64, records: &[u64]) {
        let seen = self.buffer.get(&seq).or_else(|| {
            usize::try_from(seq)
                .ok()
                .and_then(|i| self.delivered.get(i))
                .map(|(_, r)| r)
        });
        if let Some(seen) = seen {
            assert_eq!(seen, records, "step {seq} pushed twice with other records");
            return;
        }
        if seq < self.next {
            return;
        }
        self.buffer.insert(seq, records.to_vec());
        while let Some(records) = self.buffer.remove(&self.next) {
            self.delivered.push((self.next, records));
            self.next += 1;
        }
    }
}

#[derive(Debug, Clone)]
struct SimWorker {
    id: WorkerId,
    /// Steps it was granted and has not completed, with whether it pushed them yet.
    held: Vec<(StepId, Vec<u64>, bool)>,
}

/// Everything outside the dispatcher.
#[derive(Debug, Clone)]
struct World {
    now: u64,
    workers: Vec<SimWorker>,
    receiver: Receiver,
    acknowledged: Option<u64>,
}

fn seq_of(step: StepId, per_epoch: u64) -> u64 {
    step.epoch.0 * per_epoch + step.step.0
}

fn step_of(seq: u64, per_epoch: u64) -> StepId {
    StepId {
        epoch: Epoch(seq / per_epoch),
        step: Step(seq % per_epoch),
    }
}

/// The steps granted to `worker` among `events`.
fn granted(events: &[Event], worker: WorkerId) -> Vec<(StepId, Vec<u64>, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::LeaseGranted {
                worker: w,
                step,
                batch: GrantedBatch::Records(records),
                ..
            } if *w == worker => Some((*step, records.clone(), false)),
            _ => None,
        })
        .collect()
}

/// Whether a request is answered only once the journal is synced through it (see the crate
/// docs, "Durability").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Written,
    Synced,
}

/// One request of the recorded run (or of the recovery), applied to `core` and the world.
/// Returns how it is answered, or `None` when it touched nothing.
fn step_world(core: &mut Core, world: &mut World, rng: &mut Rng, batches: bool) -> Option<Answer> {
    let per_epoch = core.state().config().steps_per_epoch();
    let now = Time(world.now);
    match rng.below(10) {
        0 if world.workers.len() < 3 => {
            let worker = core.allocate_worker();
            let command = Command::RegisterWorker {
                worker,
                stage: crate::StageId(0),
                protocol_version: PROTOCOL_VERSION,
            };
            core.apply(command, now).ok()?;
            world.workers.push(SimWorker {
                id: worker,
                held: Vec::new(),
            });
            Some(Answer::Synced)
        }
        1..=3 if !world.workers.is_empty() => {
            let i = usize::try_from(rng.below(world.workers.len() as u64)).ok()?;
            let worker = world.workers[i].id;
            let max = if batches { 1 + rng.below(3) } else { 1 };
            let command = Command::RequestLeases {
                worker,
                max: u32::try_from(max).ok()?,
            };
            let events = core.apply(command, now).ok()?;
            world.workers[i].held.extend(granted(&events, worker));
            Some(Answer::Written)
        }
        4..=6 if !world.workers.is_empty() => {
            // A worker pushes what it holds, then completes the pushed ones in one request
            // (or one each); a kill between the push and the report is the case that matters.
            let i = usize::try_from(rng.below(world.workers.len() as u64)).ok()?;
            let w = &mut world.workers[i];
            for (step, records, pushed) in &mut w.held {
                if rng.below(3) > 0 {
                    world.receiver.push(seq_of(*step, per_epoch), records);
                    *pushed = true;
                }
            }
            let steps: Vec<StepId> = w.held.iter().filter(|h| h.2).map(|h| h.0).collect();
            if steps.is_empty() {
                return None;
            }
            w.held.retain(|h| !h.2);
            let worker = w.id;
            let command = Command::CompleteSteps {
                worker,
                stage: crate::StageId(0),
                steps,
            };
            // Refusals (a lease that went elsewhere or was retired) are routine.
            let _ = core.apply(command, now);
            Some(Answer::Written)
        }
        7 => {
            world.now += rng.below(LEASE_MS);
            let _ = core.apply(Command::Tick, Time(world.now));
            Some(Answer::Synced)
        }
        8 => {
            let last = world.receiver.next.checked_sub(1)?;
            if world.acknowledged.is_some_and(|a| a >= last) {
                return None;
            }
            let watermark = step_of(last, per_epoch);
            match core.apply(Command::Consumed { watermark }, now) {
                Ok(_) => world.acknowledged = Some(last),
                // Ahead of what a restarted dispatcher remembers leasing: the consumer retries
                // (the service answers it UNAVAILABLE) until the lost grants are redone.
                Err(ApplyError::State(Error::WatermarkAhead { .. })) => {}
                Err(err) => panic!("consumed {watermark}: {err:?}"),
            }
            Some(Answer::Synced)
        }
        9 if world.workers.len() > 1 && rng.below(4) == 0 => {
            let i = usize::try_from(rng.below(world.workers.len() as u64)).ok()?;
            let gone = world.workers.remove(i);
            let _ = core.apply(Command::WorkerLost { worker: gone.id }, now);
            Some(Answer::Synced)
        }
        _ => None,
    }
}

/// After a restart: workers first push and report what they held, then the job runs to its
/// end; each round ticks past every deadline once the workers reported what they held, so
/// nothing stays leased to nobody.
fn finish(core: &mut Core, mut world: World, context: &str) -> Receiver {
    let per_epoch = core.state().config().steps_per_epoch();
    for _round in 0..200 {
        if core.state().is_end_of_data() {
            break;
        }
        let now = Time(world.now);
        for w in &mut world.workers {
            let mut steps = Vec::new();
            for (step, records, _) in w.held.drain(..) {
                world.receiver.push(seq_of(step, per_epoch), &records);
                steps.push(step);
            }
            if !steps.is_empty() {
                let command = Command::CompleteSteps {
                    worker: w.id,
                    stage: crate::StageId(0),
                    steps,
                };
                let _ = core.apply(command, now);
            }
        }
        // Past every deadline: what the dispatcher remembers leasing to nobody comes back.
        world.now += LEASE_MS + 1;
        core.apply(Command::Tick, Time(world.now))
            .unwrap_or_else(|err| panic!("{context}: tick: {err:?}"));
        let now = Time(world.now);
        // A worker the restarted dispatcher does not know (lost, or its registration torn
        // away unanswered) registers again under a fresh id.
        for w in &mut world.workers {
            if core.state().worker(w.id).is_none() {
                let id = core.allocate_worker();
                let command = Command::RegisterWorker {
                    worker: id,
                    stage: crate::StageId(0),
                    protocol_version: PROTOCOL_VERSION,
                };
                core.apply(command, now).expect("register again");
                w.id = id;
            }
        }
        if world.workers.is_empty() {
            let id = core.allocate_worker();
            let command = Command::RegisterWorker {
                worker: id,
                stage: crate::StageId(0),
                protocol_version: PROTOCOL_VERSION,
            };
            core.apply(command, now).expect("register");
            world.workers.push(SimWorker {
                id,
                held: Vec::new(),
            });
        }
        for w in &mut world.workers {
            let command = Command::RequestLeases {
                worker: w.id,
                max: 3,
            };
            if let Ok(events) = core.apply(command, now) {
                w.held.extend(granted(&events, w.id));
            }
        }
        if let Some(last) = world.receiver.next.checked_sub(1) {
            let watermark = step_of(last, per_epoch);
            match core.apply(Command::Consumed { watermark }, now) {
                Ok(_) | Err(ApplyError::State(Error::WatermarkAhead { .. })) => {}
                Err(err) => panic!("{context}: consumed {watermark}: {err:?}"),
            }
        }
    }
    assert!(
        core.state().is_end_of_data(),
        "{context}: the job never ended; delivered {} step(s), dispatcher watermark {:?}, leases {:?}",
        world.receiver.delivered.len(),
        core.state().watermark(),
        core.state().leases(),
    );
    world.receiver
}

fn check_exactly_once(config: &DispatcherConfig, receiver: &Receiver, context: &str) {
    let per_epoch = config.steps_per_epoch();
    let total = config.total_steps().expect("finite");
    let seqs: Vec<u64> = receiver.delivered.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        seqs,
        (0..total).collect::<Vec<_>>(),
        "{context}: not every step once in order"
    );
    for (seq, records) in &receiver.delivered {
        let expected = index_batch(config, step_of(*seq, per_epoch)).expect("batch");
        assert_eq!(
            records, &expected,
            "{context}: step {seq} has another batch"
        );
    }
}

/// Line ends of the journal (offsets just past each newline).
fn line_ends(bytes: &[u8]) -> Vec<usize> {
    bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1)
        .collect()
}

/// Restarts the dispatcher from a journal holding `prefix` (and a compaction's leftover
/// holding `leftover`) and runs the job to its end with `world`.
fn restart_at(prefix: &[u8], leftover: Option<&[u8]>, world: &World, context: &str) -> Receiver {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(JOURNAL_FILE), prefix).expect("write prefix");
    let leftover_path = dir.path().join(COMPACTING_FILE);
    if let Some(bytes) = leftover {
        std::fs::write(&leftover_path, bytes).expect("write leftover");
    }
    let restored = Core::open(dir.path(), JobId(1), &config())
        .unwrap_or_else(|err| panic!("{context}: the prefix does not open: {err}"));
    let mut world = world.clone();
    world.now = world.now.max(restored.resume_at.as_millis());
    assert!(
        !leftover_path.exists(),
        "{context}: the leftover was not removed"
    );
    let mut core = restored.core;
    finish(&mut core, world, context)
}

/// A point of the recorded run: after a request, which journal file was current (0 for the
/// first, one more at each compaction) and its length, the world, and how the request was
/// answered.
#[derive(Debug, Clone)]
struct Point {
    file: usize,
    len: usize,
    world: World,
    answer: Answer,
}

/// One recorded run: every journal file it went through (each as it was when a compaction
/// replaced it, the last as the run left it), and the points after each request. With
/// `compact_bytes`, the journal is compacted as the service does it.
fn record(
    seed: u64,
    dir: &Path,
    batches: bool,
    compact_bytes: Option<u64>,
) -> (Vec<Vec<u8>>, Vec<Point>) {
    use std::os::unix::fs::MetadataExt;
    let mut core = Core::open(dir, JobId(1), &config()).expect("open").core;
    if let Some(bytes) = compact_bytes {
        core.compact_every(bytes);
    }
    let path = dir.join(JOURNAL_FILE);
    // A link to the current file keeps it, whole, once a compaction renames another over it.
    let kept = dir.join("kept");
    let stat = |p: &Path| std::fs::metadata(p).expect("stat");
    let len = |p: &Path| usize::try_from(stat(p).len()).expect("len");
    let mut world = World {
        now: 0,
        workers: Vec::new(),
        receiver: Receiver::default(),
        acknowledged: None,
    };
    let mut rng = Rng(seed);
    let mut files = Vec::new();
    let mut points = vec![Point {
        file: 0,
        len: len(&path),
        world: world.clone(),
        answer: Answer::Synced,
    }];
    for _ in 0..160 {
        if core.state().is_end_of_data() {
            break;
        }
        let _ = std::fs::remove_file(&kept);
        std::fs::hard_link(&path, &kept).expect("link");
        if let Some(mut answer) = step_world(&mut core, &mut world, &mut rng, batches) {
            if stat(&path).ino() != stat(&kept).ino() {
                files.push(std::fs::read(&kept).expect("read the replaced journal"));
                // A compaction syncs everything before it.
                answer = Answer::Synced;
            }
            points.push(Point {
                file: files.len(),
                len: len(&path),
                world: world.clone(),
                answer,
            });
        }
    }
    files.push(std::fs::read(&path).expect("read journal"));
    (files, points)
}

fn crash_everywhere(seed: u64, batches: bool, compact_bytes: Option<u64>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (files, points) = record(seed, dir.path(), batches, compact_bytes);
    let context = format!("seed {seed} batches {batches} compaction {compact_bytes:?}");
    if compact_bytes.is_some() {
        assert!(
            files.len() > 2,
            "{context}: the run compacted only {} time(s)",
            files.len() - 1
        );
    }
    let mut recovered = 0;
    for (file, bytes) in files.iter().enumerate() {
        let ends = line_ends(bytes);
        // A compacted file's first two lines (header and snapshot) were whole before it was
        // renamed into place; the first file's header was synced before anything else.
        let first = if file == 0 { ends[0] } else { ends[1] };
        let mut cuts = Vec::new();
        let mut start = first;
        for &end in ends.iter().filter(|&&end| end > first) {
            cuts.push(start);
            let len = end - start;
            cuts.extend([start + 1, start + len / 2, end - 1]);
            start = end;
        }
        cuts.push(bytes.len());
        for cut in cuts {
            // SIGKILL: the world as it was when the last whole line in the prefix was
            // answered (a torn line's request was never answered).
            let killed = points
                .iter()
                .rposition(|p| (p.file, p.len) <= (file, cut))
                .expect("the header is always there");
            // OS crash: the prefix may be as old as the last sync before the world went on,
            // so the world may have gone on up to (not including) the next synced answer.
            let synced_after = points
                .iter()
                .skip(killed + 1)
                .position(|p| p.answer == Answer::Synced)
                .map_or(points.len() - 1, |i| killed + i);
            for (what, at) in [("kill", killed), ("os crash", synced_after)] {
                let context = format!("{context}: {what} at byte {cut} of file {file}");
                let receiver = restart_at(&bytes[..cut], None, &points[at].world, &context);
                check_exactly_once(&config(), &receiver, &context);
                recovered += 1;
            }
        }
        // Killed while writing the next compacted file: the old one is whole beside its
        // leftover, which the restart removes.
        if let Some(next) = files.get(file + 1) {
            let killed = points
                .iter()
                .rposition(|p| p.file == file)
                .expect("a point of every file");
            let partial = &next[..next.len() / 2];
            let context = format!("{context}: kill while compacting file {file}");
            let receiver = restart_at(bytes, Some(partial), &points[killed].world, &context);
            check_exactly_once(&config(), &receiver, &context);
            recovered += 1;
        }
    }
    assert!(recovered > 20, "{context}: too few crash points");
    // The recorded run itself got somewhere, or the test proves little.
    let total = config().total_steps().expect("finite");
    let last = &points.last().expect("points").world;
    assert!(
        last.receiver.next > total / 2,
        "{context}: the run delivered only {} of {total} steps",
        last.receiver.next
    );
}

#[test]
fn exactly_once_holds_when_the_dispatcher_is_killed_at_any_journal_write() {
    for seed in 0..6 {
        crash_everywhere(seed, false, None);
    }
}

#[test]
fn exactly_once_holds_with_batched_leases_at_any_journal_write() {
    for seed in 100..106 {
        crash_everywhere(seed, true, None);
    }
}

#[test]
fn exactly_once_holds_with_a_compacting_journal_at_any_write_and_any_compaction() {
    for seed in 200..206 {
        crash_everywhere(seed, seed % 2 == 0, Some(256));
    }
}

#[test]
fn the_receiver_model_drops_what_it_holds_or_delivered() {
    let mut r = Receiver::default();
    r.push(1, &[1]);
    assert!(r.delivered.is_empty());
    r.push(0, &[0]);
    r.push(1, &[1]);
    r.push(0, &[0]);
    assert_eq!(r.delivered, vec![(0, vec![0]), (1, vec![1])]);
}
