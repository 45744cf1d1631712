//! The journal's tests: the record format, recovery from torn and corrupt lines, compaction,
//! write-behind and seed picking.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::config::Shuffle;
use crate::ids::{StageId, StepId, WorkerId};
use crate::state::{Event, GrantedBatch};

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
        (0u64..2, 0u32..2, step.clone(), 0u64..2, any::<u32>()).prop_map(|(w, s, step, d, crc)| {
            Event::LeaseGranted {
                worker: WorkerId(w),
                stage: StageId(s),
                step,
                deadline: Time(d),
                batch: GrantedBatch::Crc(crc),
            }
        }),
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
