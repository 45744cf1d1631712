//! Fuzzing Lode's readers of untrusted input on stable Rust (issue 14 item 3).
//!
//! Each reader gets real files of the fixtures (or, for the journal and the data-plane frame,
//! files Lode itself wrote) mutated by proptest: bit flips, byte overwrites, truncations,
//! splices of one part over another, insertions and length-field inflation (a 10-byte varint
//! or a little-endian u64/u32 of a huge value written over a length). Every case must come back
//! as a value or an error. Checksums (TFRecord CRCs, journal line CRCs, the frame CRC) are
//! recomputed after mutation in half the cases, so that those reach the parsing behind them.
//! No panic, no allocation beyond [`ALLOC_BOUND`], and (checked by the
//! campaign finishing) no hang.
//!
//! In CI each reader runs [`CI_CASES`] cases (a few seconds each in a debug build). A longer
//! campaign sets `LODE_FUZZ_CASES` (see "Fuzzing" in docs/architecture.md):
//!
//! ```sh
//! LODE_FUZZ_CASES=1000000 LODE_FUZZ_SEED=1 cargo test --release --test fuzz -- --test-threads 1
//! ```
//!
//! Cases are drawn from a seeded generator (`LODE_FUZZ_SEED`, default 0): a run is repeatable,
//! and a campaign explores new cases with a new seed. `LODE_FUZZ_REPLAY=FILE` replays one
//! GraphDef through the readers (`replay_graphdef`), printing the heap each held.
//!
//! Readers: GraphDef, MetaGraphDef and SavedModel files (`lode_proto::io::load`, and for a
//! GraphDef the view and the whole partition), TFRecord files (indexing and streaming),
//! plan.json (`PlanDir::open` and loading stage 0 of a real plan), the dispatcher journal
//! (`Journal::open` and replay), and data-plane step frames (`decode_frame`).

// A counting allocator needs `unsafe impl GlobalAlloc`; it only forwards to the system
// allocator and counts.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Cases per reader in CI.
pub const CI_CASES: u32 = 1000;

/// The most heap one case may hold at once beyond what was live before it, besides 64 bytes
/// per input byte. Lode's readers size their buffers by what arrived, never by a length
/// field; the one exception is rust-protobuf, which reserves up to `READ_RAW_BYTES_MAX_ALLOC`
/// (10,000,000) elements of a packed repeated field before checking the field's length against
/// the data: 80 MB for int64/double, freed at once with the error. The campaign found it
/// (a GraphDef with an inflated packed `int64_val` length held 80,069,925 bytes).
pub const ALLOC_BOUND: usize = 96 << 20;

struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn charge(size: usize) {
    // `try_with`: allocations while the thread's locals are torn down are not counted.
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(size);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn refund(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        refund(layout.size());
        // SAFETY: the caller's contract is passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        charge(layout.size());
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        refund(layout.size());
        charge(new_size);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns the most heap it held at once on this thread beyond what was live
/// when it started.
fn peak_during(f: impl FnOnce()) -> usize {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    f();
    PEAK.with(Cell::get).saturating_sub(start)
}

/// The seed of the case generator: `LODE_FUZZ_SEED`, or 0 (so that CI runs the same cases
/// every time; a campaign passes its own seed).
fn seed() -> u64 {
    std::env::var("LODE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Cases per reader: `LODE_FUZZ_CASES`, or [`CI_CASES`].
fn cases() -> u32 {
    std::env::var("LODE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CI_CASES)
}

/// One change to a seed file. Positions are taken modulo the length at the time.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    Overwrite {
        at: usize,
        byte: u8,
    },
    Truncate {
        at: usize,
    },
    /// Copies `len` bytes from `from` over the bytes at `to`.
    Splice {
        from: usize,
        to: usize,
        len: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    /// Writes a huge length over the bytes at `at`: a 10-byte varint (protobuf), or a
    /// little-endian u64 or u32 (TFRecord, frames).
    Inflate {
        at: usize,
        form: u8,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        (at, any::<u8>()).prop_map(|(at, byte)| Mutation::Overwrite { at, byte }),
        at.prop_map(|at| Mutation::Truncate { at }),
        (at, at, 1usize..256).prop_map(|(from, to, len)| Mutation::Splice { from, to, len }),
        (at, proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (at, 0u8..3).prop_map(|(at, form)| Mutation::Inflate { at, form }),
    ]
}

fn apply(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in mutations {
        let n = b.len().max(1);
        match *m {
            Mutation::FlipBit { at, bit } => {
                if let Some(x) = b.get_mut(at % n) {
                    *x ^= 1 << bit;
                }
            }
            Mutation::Overwrite { at, byte } => {
                if let Some(x) = b.get_mut(at % n) {
                    *x = byte;
                }
            }
            Mutation::Truncate { at } => b.truncate(at % n),
            Mutation::Splice { from, to, len } => {
                let from = from % n;
                let end = (from + len).min(b.len());
                let piece = b.get(from..end).map(<[u8]>::to_vec).unwrap_or_default();
                let to = to % n;
                for (k, x) in piece.into_iter().enumerate() {
                    if let Some(slot) = b.get_mut(to + k) {
                        *slot = x;
                    }
                }
            }
            Mutation::Insert { at, ref bytes } => {
                let at = (at % n).min(b.len());
                b.splice(at..at, bytes.iter().copied());
            }
            Mutation::Inflate { at, form } => {
                let huge: Vec<u8> = match form {
                    0 => vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                    1 => (u64::MAX / 3).to_le_bytes().to_vec(),
                    _ => 0x7fff_fff0u32.to_le_bytes().to_vec(),
                };
                let at = at % n;
                for (k, x) in huge.into_iter().enumerate() {
                    if let Some(slot) = b.get_mut(at + k) {
                        *slot = x;
                    }
                }
            }
        }
    }
    b
}

/// Recomputes a format's checksums after mutation, so that half the cases reach past them.
type Repair = fn(&mut [u8]);

/// Runs `cases()` mutated variants of `seeds` through `read`, checking the allocation bound;
/// with `repair`, half the variants get their checksums recomputed first.
fn fuzz(name: &str, seeds: Vec<Vec<u8>>, repair: Option<Repair>, read: impl Fn(&[u8])) {
    let cases = cases();
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed().to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &key),
    );
    let strategy = (
        0..seeds.len(),
        proptest::collection::vec(mutation(), 1..5),
        any::<bool>(),
    );
    let worst = Cell::new(0usize);
    let result = runner.run(&strategy, |(which, mutations, repaired)| {
        let mut bytes = apply(&seeds[which], &mutations);
        if let (Some(repair), true) = (repair, repaired) {
            repair(&mut bytes);
        }
        let peak = peak_during(|| read(&bytes));
        worst.set(worst.get().max(peak));
        prop_assert!(
            peak <= ALLOC_BOUND + 64 * bytes.len(),
            "{name}: {peak} bytes held at once for a {}-byte input",
            bytes.len()
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    println!(
        "{name}: {cases} cases (seed {}), no panic; most heap held at once {} bytes",
        seed(),
        worst.get()
    );
}

/// A data-plane frame's checksum (bytes 14..22) over bytes 0..14 and the payload.
fn repair_frame(frame: &mut [u8]) {
    use lode_transfer::codec::{frame_checksum, HEADER_LEN};
    if frame.len() >= HEADER_LEN {
        let sum = frame_checksum(frame);
        frame[14..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
    }
}

/// Each TFRecord's masked CRCs of its length and data, as far as the lengths lead.
fn repair_tfrecord(file: &mut [u8]) {
    use lode_runtime::records::tfrecord::masked_crc;
    let mut at = 0usize;
    while let Some(head) = file.get(at..at + 8) {
        let mut len = [0u8; 8];
        len.copy_from_slice(head);
        let crc = masked_crc(&len);
        let Some(slot) = file.get_mut(at + 8..at + 12) else {
            return;
        };
        slot.copy_from_slice(&crc.to_le_bytes());
        let Some(end) = usize::try_from(u64::from_le_bytes(len))
            .ok()
            .and_then(|n| (at + 12).checked_add(n))
        else {
            return;
        };
        let Some(data) = file.get(at + 12..end) else {
            return;
        };
        let crc = masked_crc(data);
        let Some(slot) = file.get_mut(end..end + 4) else {
            return;
        };
        slot.copy_from_slice(&crc.to_le_bytes());
        at = end + 4;
    }
}

/// Each journal line's `CRC ` prefix over its JSON.
fn repair_journal(file: &mut [u8]) {
    for line in file.split_mut(|&b| b == b'\n') {
        if line.len() > 9 && line[8] == b' ' {
            let crc = format!("{:08x}", crc32c::crc32c(&line[9..]));
            line[..8].copy_from_slice(crc.as_bytes());
        }
    }
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn fixture(rel: &str) -> Vec<u8> {
    let path = fixtures().join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A scratch directory on tmpfs when there is one (the journal syncs on every open).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().expect("tempdir")
}

fn load_model(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    let _ = lode_proto::io::load(&path, &lode_proto::io::LoadOptions::default());
}

#[test]
fn fuzz_graphdef() {
    let dir = scratch();
    let seeds = vec![
        fixture("sgd_ref/model.pb"),
        fixture("text_segments/model.pb"),
    ];
    fuzz("GraphDef", seeds, None, |bytes| {
        load_model(dir.path(), "model.pb", bytes);
        if let Ok(view) = lode_proto::view::GraphView::parse(bytes) {
            let _ = lode_decoupler::decouple(
                &view,
                &lode_decoupler::Options {
                    kernels: Some(lode_runtime::exec::stage::runs_natively),
                    ..lode_decoupler::Options::default()
                },
            );
        }
    });
}

/// A model file of one form, loaded as `lode inspect` loads it.
fn fuzz_model(name: &str, fixture_file: &str, file_name: &str) {
    let dir = scratch();
    fuzz(name, vec![fixture(fixture_file)], None, |bytes| {
        load_model(dir.path(), file_name, bytes);
    });
}

#[test]
fn fuzz_metagraphdef() {
    fuzz_model("MetaGraphDef", "sgd_ref/model.meta", "model.meta");
}

#[test]
fn fuzz_saved_model() {
    fuzz_model(
        "SavedModel",
        "tf2_module/saved_model/saved_model.pb",
        "saved_model.pb",
    );
}

#[test]
fn fuzz_tfrecord() {
    use lode_runtime::records::tfrecord::{index_tfrecord_with, TfRecordReader};
    use lode_runtime::records::{OnCorrupt, ReaderConfig};
    let dir = scratch();
    let path = dir.path().join("data.tfrecord");
    let seeds = vec![fixture("adam_resource/data/train.tfrecord")];
    fuzz("TFRecord", seeds, Some(repair_tfrecord), |bytes| {
        std::fs::write(&path, bytes).expect("write");
        for on_corrupt in [OnCorrupt::Fail, OnCorrupt::SkipRecord] {
            let _ = index_tfrecord_with(&path, on_corrupt);
            if let Ok(reader) = TfRecordReader::open(
                &path,
                ReaderConfig {
                    on_corrupt,
                    ..ReaderConfig::default()
                },
            ) {
                for record in reader {
                    if record.is_err() && on_corrupt == OnCorrupt::Fail {
                        break;
                    }
                }
            }
        }
    });
}

#[test]
fn fuzz_plan_json() {
    use lode_proto::plan::PlanDir;
    use lode_runtime::exec::{ExecOptions, Stage};
    // A real plan of sgd_ref, whose plan.json is then mutated.
    let dir = scratch();
    let plan_dir = dir.path().join("plan");
    let model = fixtures().join("sgd_ref/model.pb");
    let bytes = std::fs::read(&model).expect("fixture");
    let view = lode_proto::view::GraphView::parse(&bytes).expect("view");
    let mut decoupled =
        lode_decoupler::decouple(&view, &lode_decoupler::Options::default()).expect("plan");
    decoupled.plan.data_root = Some(fixtures().join("sgd_ref").display().to_string());
    lode_decoupler::plan::write_dir(
        &plan_dir,
        &decoupled.graphs,
        &decoupled.plan,
        &decoupled.report,
        &decoupled.dot,
    )
    .expect("write plan");
    let seeds = vec![std::fs::read(plan_dir.join("plan.json")).expect("plan.json")];
    let path = plan_dir.join("plan.json");
    fuzz("plan.json", seeds, None, |bytes| {
        std::fs::write(&path, bytes).expect("write");
        if let Ok(plan) = PlanDir::open(&plan_dir) {
            let _ = Stage::load(&plan, 0, &ExecOptions::default());
        }
    });
}

#[test]
fn fuzz_journal() {
    use lode_dispatcher::journal::{Batch, Journal, Record, Snapshot};
    use lode_dispatcher::WorkerId;
    use lode_dispatcher::{
        Command, DispatcherConfig, DispatcherState, JobId, Shuffle, StageId, StepId, Time,
    };
    let config = DispatcherConfig {
        records: 10,
        batch_size: 3,
        drop_remainder: false,
        shuffle: Shuffle::Seeded { seed: 7 },
        chain: None,
        epochs: Some(2),
        restart_every: None,
        lease_duration: std::time::Duration::from_millis(100),
        max_leases_per_worker: 2,
        stages: 1,
    };
    let dir = scratch();
    let path = dir.path().join(lode_dispatcher::journal::JOURNAL_FILE);
    let mut seeds = Vec::new();
    for compacted in [false, true] {
        let _ = std::fs::remove_file(&path);
        // A real history, journaled as the service journals it: registrations, runs of
        // grants, a run of completions, a watermark and the run of retirements it caused; the
        // second seed is compacted after the registrations.
        let mut rec = Journal::open(dir.path(), JobId(1), &config).expect("create");
        let mut state = DispatcherState::new(config.clone()).expect("state");
        let commands = (1..4)
            .map(|w| Command::RegisterWorker {
                worker: WorkerId(w),
                stage: StageId(0),
                protocol_version: lode_dispatcher::PROTOCOL_VERSION,
            })
            .chain([
                Command::RequestLeases {
                    worker: WorkerId(1),
                    max: 2,
                },
                Command::RequestLeases {
                    worker: WorkerId(2),
                    max: 2,
                },
                Command::CompleteSteps {
                    worker: WorkerId(2),
                    stage: StageId(0),
                    steps: vec![StepId::new(0, 2), StepId::new(0, 3)],
                },
                Command::Consumed {
                    watermark: StepId::new(0, 1),
                },
            ]);
        for (at, command) in (1..).zip(commands) {
            if compacted && at == 4 {
                let snapshot = Snapshot {
                    state: state.snapshot(),
                    receiver_addr: "127.0.0.1:1".into(),
                    drained: vec![],
                    next_worker: 4,
                };
                rec.journal.compact(Time(3), snapshot).expect("compact");
            }
            let events = state.apply(command, Time(at)).expect("apply");
            let mut records = Record::of_events(&events, config.steps_per_epoch());
            records.push(Record::Consumer {
                receiver_addr: "127.0.0.1:1".into(),
            });
            rec.journal
                .append(&Batch {
                    at: Time(at),
                    records,
                })
                .expect("append");
        }
        drop(rec);
        seeds.push(std::fs::read(&path).expect("journal"));
    }
    for (seed, kind) in seeds
        .iter()
        .flat_map(|s| ["\"Granted\"", "\"Completed\"", "\"Retired\""].map(|k| (s, k)))
    {
        let text = String::from_utf8_lossy(seed);
        assert!(text.contains(kind), "the seed holds no {kind} run: {text}");
    }
    fuzz("journal", seeds, Some(repair_journal), |bytes| {
        std::fs::write(&path, bytes).expect("write");
        if let Ok(rec) = Journal::open(dir.path(), JobId(1), &config) {
            // Replayed as the dispatcher replays: a snapshot restored, every other record
            // event by event, to the first refusal.
            let mut state = DispatcherState::new(config.clone()).expect("state");
            let mut index = 0;
            let _ = rec.batches.into_iter().try_for_each(|(_, b)| {
                b.records.into_iter().try_for_each(|r| match r {
                    Record::Snapshot(snapshot) => {
                        state = DispatcherState::restore(config.clone(), snapshot.state)?;
                        Ok(())
                    }
                    r => r.each_event(config.steps_per_epoch(), |e| {
                        index += 1;
                        state.replay_event(index - 1, &e)
                    }),
                })
            });
        }
    });
}

#[test]
fn fuzz_data_plane_frame() {
    use lode_runtime::{Tensor, TensorData};
    use lode_transfer::codec::{decode_frame, CodecConfig, Compression, StepEncoder, StepMessage};
    /// The decoder's limit in this harness: a frame may declare at most this much.
    const LIMIT: u64 = 16 << 20;
    let message = StepMessage {
        job: 1,
        stage: 0,
        step: 41,
        epoch: 1,
        records: (0..32).collect(),
        tensors: vec![
            Tensor::new(
                vec![32, 4],
                TensorData::Float32((0..128).map(|i| i as f32).collect()),
            )
            .expect("tensor"),
            Tensor::new(
                vec![3],
                TensorData::String(vec![b"a".to_vec(), b"bc".to_vec(), Vec::new()]),
            )
            .expect("tensor"),
            Tensor::new(vec![2, 2], TensorData::Int64(vec![1, -2, 3, i64::MIN])).expect("tensor"),
        ],
    };
    let seeds = [Compression::Off, Compression::Lz4]
        .into_iter()
        .map(|compression| {
            StepEncoder::new(CodecConfig {
                compression,
                max_message_bytes: LIMIT,
            })
            .encode(&message)
            .expect("encodes")
        })
        .collect();
    fuzz("data-plane frame", seeds, Some(repair_frame), |bytes| {
        let _ = decode_frame(bytes, LIMIT);
    });
}

/// Replays one input (`LODE_FUZZ_REPLAY=FILE`) through the GraphDef readers, printing the heap
/// each held at once: for looking into a case the campaign reports.
#[test]
fn replay_graphdef() {
    let Ok(file) = std::env::var("LODE_FUZZ_REPLAY") else {
        return;
    };
    let bytes = std::fs::read(&file).expect("replay file");
    let dir = scratch();
    let peak = peak_during(|| load_model(dir.path(), "model.pb", &bytes));
    println!("load: {peak} bytes");
    let mut view = None;
    let peak = peak_during(|| view = lode_proto::view::GraphView::parse(&bytes).ok());
    println!("view: {peak} bytes ({})", view.is_some());
    if let Some(view) = view {
        let peak = peak_during(|| {
            let r = lode_decoupler::decouple(
                &view,
                &lode_decoupler::Options {
                    kernels: Some(lode_runtime::exec::stage::runs_natively),
                    ..lode_decoupler::Options::default()
                },
            );
            println!(
                "decouple: {:?}",
                r.as_ref().map(|_| ()).map_err(ToString::to_string)
            );
        });
        println!("decouple: {peak} bytes");
    }
}
