//! Lease throughput and latency of a dispatcher on loopback under many concurrent workers.
//!
//! One job of 10M records in batches of 32, repeating forever, with long leases and heartbeats
//! so that nothing expires during a run. 64 workers (tokio tasks, each registered and on its
//! own connection) loop Lease → Complete as fast as they can, `k` steps per request (one
//! `Lease` with `max_steps = k`, one `Complete` listing the k steps; `k = 1` is the one-step
//! protocol); a consumer task reports the contiguous prefix of completed steps as consumed
//! every 10 ms, as the training side would, with a receiver's window of 1024 steps (a
//! training side's default capacity of short steps; `LODE_BENCH_WINDOW=<steps>`), which the
//! dispatcher shares out among the workers as their lease limits: 16 steps each for 64. "steps/s" counts leased steps; the latencies are
//! per request. Workers that loop as fast as they can measure the most the dispatcher
//! serves, and their latency is mostly queueing (64 requests always waiting on 2 cores);
//! `LODE_BENCH_RATE=<steps/s>` (default `0,60000`: 0 is flat out) paces the workers instead,
//! staggered, so that together they offer that many steps a second, as workers with real work
//! between leases do: its latencies are what a worker waits at that load.
//!
//! The journal lives on an ordinary disk: a temporary directory under Cargo's target directory
//! (`LODE_BENCH_DIR=<dir>` to choose another; `LODE_BENCH_SHM=1` adds a run on `/dev/shm` for
//! comparison). The cost of a bare `write` + `fdatasync` of a journal-sized line is measured in
//! each place; since Lease and Complete are answered without one (see the crate docs,
//! "Durability"), only registrations, the consumer's reports and ticks pay it.
//!
//! This is a plain `harness = false` main rather than a criterion group: what matters is the
//! aggregate rate of many concurrent clients and the tail of the per-request latency, which
//! criterion's one-routine-at-a-time model does not express.
//!
//! Run with `cargo bench -p lode-dispatcher --bench lease` (`-- --quick` for 2 s per case;
//! `LODE_BENCH_SECS=<n>`, `LODE_BENCH_WORKERS=<n>` and `LODE_BENCH_STEPS=<k,k,...>` (steps per
//! request, default `1,16`) override the defaults;
//! `LODE_BENCH_ORDER=sequential|shuffle` serves TensorFlow's order of `batch(32)` or of
//! `shuffle(1_000_000).batch(32)` instead of Lode's own permutation).

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use lode_dispatcher::service::endpoint_of;
use lode_dispatcher::{
    serve, DispatcherConfig, IndexChain, JobId, ServiceConfig, Shuffle, PROTOCOL_VERSION,
};
use lode_proto::plan::IndexOp;
use lode_proto::service::v1::{self, lease_response::Outcome};
use lode_proto::service::{connect, DispatcherClient};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

const JOB: u64 = 1;
const TOKEN: &str = "bench-token";
const RECORDS: u64 = 10_000_000;
const BATCH: u64 = 32;
/// Each worker may hold two requests' worth of steps (a batch being completed while the next is
/// leased), at least 4 as before batches.
fn max_leases(k: u32) -> u32 {
    (2 * k).max(4)
}
const DEFAULT_WORKERS: usize = 64;
const WARMUP: Duration = Duration::from_millis(500);
const CONSUME_EVERY: Duration = Duration::from_millis(10);

/// The receiver's window the consumer reports, in steps: a training side's receiver of short
/// steps holds up to 1024 (`lode_transfer::receiver::DEFAULT_CAPACITY`). Without
/// a report the dispatcher assumes 64, and 64 workers would lease at most a few steps each.
fn window() -> u64 {
    std::env::var("LODE_BENCH_WINDOW")
        .ok()
        .and_then(|w| w.parse().ok())
        .filter(|&w| w > 0)
        .unwrap_or(1024)
}

/// `LODE_BENCH_ORDER`: `lode` (Lode's own seeded permutation, the default), `sequential`
/// (TensorFlow's order of `batch(32)`) or `shuffle` (TensorFlow's order of
/// `shuffle(1_000_000).batch(32)`).
fn dispatcher_config(k: u32) -> DispatcherConfig {
    let order = std::env::var("LODE_BENCH_ORDER").unwrap_or_default();
    if order == "sequential" || order == "shuffle" {
        let mut ops = Vec::new();
        if order == "shuffle" {
            ops.push(IndexOp::Shuffle {
                buffer_size: 1_000_000,
                seed: 7,
                seed2: 42,
                reshuffle_each_iteration: true,
            });
        }
        ops.push(IndexOp::Batch {
            batch_size: i64::try_from(BATCH).expect("small"),
            drop_remainder: false,
        });
        let chain = IndexChain {
            ops,
            picked_seed: None,
        };
        return DispatcherConfig::for_chain(
            RECORDS,
            chain,
            None,
            Duration::from_secs(3_600),
            max_leases(k),
            1,
        )
        .expect("config");
    }
    DispatcherConfig {
        records: RECORDS,
        batch_size: BATCH,
        drop_remainder: false,
        shuffle: Shuffle::Seeded { seed: 42 },
        chain: None,
        epochs: None,
        restart_every: None,
        lease_duration: Duration::from_secs(3_600),
        max_leases_per_worker: max_leases(k),
        stages: 1,
    }
}

/// What one worker saw inside the measured window.
#[derive(Debug, Default)]
struct WorkerStats {
    lease_us: Vec<u64>,
    complete_us: Vec<u64>,
    granted: u64,
    waits: u64,
}

/// What one case measured.
#[derive(Debug)]
struct CaseResult {
    name: String,
    secs: f64,
    granted: u64,
    waits: u64,
    lease_us: Vec<u64>,
    complete_us: Vec<u64>,
    consumed_reports: u64,
    watermark: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    // Nearest rank; the float is in [0, len) so the conversion cannot overflow.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

async fn worker(
    endpoint: String,
    start: Instant,
    end: Instant,
    done: mpsc::UnboundedSender<u64>,
    per_epoch: u64,
    k: u32,
    pace: Option<(Duration, Duration)>,
) -> WorkerStats {
    let mut client = connect(&endpoint, TOKEN, None).await.expect("connect");
    let worker_id = client
        .register(v1::RegisterRequest {
            job_id: JOB,
            protocol_version: PROTOCOL_VERSION,
            stage: 0,
            worker_name: "bench-worker".into(),
        })
        .await
        .expect("register")
        .into_inner()
        .worker_id;
    let mut stats = WorkerStats::default();
    // Paced: one request every `period`, this worker's first at `offset` past the start.
    let mut ticks = pace.map(|(period, offset)| {
        let mut t = tokio::time::interval_at((start - WARMUP + offset).into(), period);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        if let Some(t) = &mut ticks {
            t.tick().await;
        }
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        let measured = t0 >= start;
        let outcome = client
            .lease(v1::LeaseRequest {
                job_id: JOB,
                worker_id,
                max_steps: k,
                ..Default::default()
            })
            .await
            .expect("lease")
            .into_inner()
            .outcome
            .expect("an outcome");
        if measured {
            stats.lease_us.push(micros(t0.elapsed()));
        }
        let steps = match outcome {
            Outcome::Lease(lease) => vec![lease],
            Outcome::Leases(batch) => batch.into_leases().expect("a batch a worker can read"),
            Outcome::Wait(wait) => {
                if measured {
                    stats.waits += 1;
                }
                tokio::time::sleep(Duration::from_millis(wait.retry_after_ms)).await;
                continue;
            }
            other => panic!("the endless job answered {other:?}"),
        };
        let t1 = Instant::now();
        let mut request = v1::CompleteRequest {
            job_id: JOB,
            worker_id,
            stage: 0,
            epoch: 0,
            step: 0,
            compute_us: 0,
            steps: Vec::new(),
        };
        if k > 1 {
            // In runs, as a worker reports.
            for l in &steps {
                let done = v1::CompletedStep {
                    epoch: l.epoch,
                    step: l.step,
                    compute_us: 0,
                    deadline_ms: l.deadline_ms,
                    run_steps: 0,
                };
                lode_proto::runs::push_completed(&mut request.steps, done);
            }
        } else if let Some(lease) = steps.first() {
            (request.stage, request.epoch, request.step) = (lease.stage, lease.epoch, lease.step);
        }
        client.complete(request).await.expect("complete");
        if measured {
            stats.granted += steps.len() as u64;
            stats.complete_us.push(micros(t1.elapsed()));
        }
        for lease in &steps {
            let _ = done.send(lease.epoch * per_epoch + lease.step);
        }
    }
    stats
}

/// Reports the contiguous prefix of completed steps as consumed; returns the reports sent
/// and the last watermark (as a global sequence number).
async fn consumer(
    mut client: DispatcherClient,
    mut done: mpsc::UnboundedReceiver<u64>,
    per_epoch: u64,
) -> (u64, u64) {
    let mut pending = BTreeSet::new();
    let mut next = 0u64;
    let mut reported = None;
    let mut reports = 0;
    let window = window();
    let mut tick = tokio::time::interval(CONSUME_EVERY);
    loop {
        tokio::select! {
            seq = done.recv() => match seq {
                Some(seq) => { pending.insert(seq); }
                None => break,
            },
            _ = tick.tick() => {
                while pending.remove(&next) {
                    next += 1;
                }
                if next > 0 && reported != Some(next - 1) {
                    let last = next - 1;
                    client
                        .consumed(v1::ConsumedRequest {
                            job_id: JOB,
                            epoch: last / per_epoch,
                            step: last % per_epoch,
                            busy_us: 0,
                            end_job: false,
                            window,
                        })
                        .await
                        .expect("consumed");
                    reported = Some(last);
                    reports += 1;
                }
            }
        }
    }
    (reports, reported.unwrap_or(0))
}

async fn run_case(
    name: &str,
    journal_dir: &Path,
    workers: usize,
    k: u32,
    rate: u64,
    secs: Duration,
) -> CaseResult {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = endpoint_of(listener.local_addr().expect("local addr"));
    let dispatcher = dispatcher_config(k);
    let per_epoch = dispatcher.steps_per_epoch();
    let mut config = ServiceConfig::new(
        JobId(JOB),
        TOKEN,
        dispatcher,
        r#"{"version":1}"#.to_owned(),
        vec![b"stage 0".to_vec()],
        journal_dir,
    );
    // Workers never heartbeat here; a long interval keeps them from being declared lost.
    config.heartbeat_interval = Duration::from_secs(3_600);
    let (shutdown, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, config, async {
        let _ = stopped.await;
    }));

    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let consumer_client = connect(&endpoint, TOKEN, None).await.expect("connect");
    let consumer = tokio::spawn(consumer(consumer_client, done_rx, per_epoch));

    // Registration of 64 workers costs 64 fsyncs (each one is durable before its answer);
    // start the clock after it.
    let start = Instant::now()
        + WARMUP
        + Duration::from_millis(20) * u32::try_from(workers).unwrap_or(u32::MAX);
    let end = start + secs;
    // Each worker asks for k steps every `period`, so that together they offer `rate`.
    #[allow(clippy::cast_precision_loss)]
    let period =
        (rate > 0).then(|| Duration::from_secs_f64(f64::from(k) * workers as f64 / rate as f64));
    let tasks: Vec<_> = (0..workers)
        .map(|i| {
            #[allow(clippy::cast_precision_loss)]
            let pace = period.map(|p| (p, p.mul_f64(i as f64 / workers as f64)));
            tokio::spawn(worker(
                endpoint.clone(),
                start,
                end,
                done_tx.clone(),
                per_epoch,
                k,
                pace,
            ))
        })
        .collect();
    drop(done_tx);
    let mut result = CaseResult {
        name: name.to_owned(),
        secs: secs.as_secs_f64(),
        granted: 0,
        waits: 0,
        lease_us: Vec::new(),
        complete_us: Vec::new(),
        consumed_reports: 0,
        watermark: 0,
    };
    for task in tasks {
        let stats = task.await.expect("worker task");
        result.granted += stats.granted;
        result.waits += stats.waits;
        result.lease_us.extend(stats.lease_us);
        result.complete_us.extend(stats.complete_us);
    }
    let (reports, watermark) = consumer.await.expect("consumer task");
    result.consumed_reports = reports;
    result.watermark = watermark;
    let _ = shutdown.send(());
    server
        .await
        .expect("server task")
        .expect("server stopped cleanly");
    result.lease_us.sort_unstable();
    result.complete_us.sort_unstable();
    result
}

/// The median time of appending a journal-sized line and `fdatasync`ing it, in `dir`.
fn fsync_cost(dir: &Path) -> Duration {
    let path = dir.join("fsync-probe");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("probe file");
    let line = format!("{}\n", "x".repeat(180));
    let mut times = Vec::new();
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        let t0 = Instant::now();
        file.write_all(line.as_bytes()).expect("write");
        file.sync_data().expect("fdatasync");
        times.push(t0.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    times.sort_unstable();
    times[times.len() / 2]
}

fn print_result(r: &CaseResult, k: u32, offered: u64, fsync: Duration) {
    #[allow(clippy::cast_precision_loss)]
    let rate = r.granted as f64 / r.secs;
    println!(
        "{:<10} {:>4} {:>8} {:>10.0} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10.1}",
        r.name,
        k,
        if offered == 0 {
            "max".to_owned()
        } else {
            offered.to_string()
        },
        rate,
        r.waits,
        percentile(&r.lease_us, 50.0),
        percentile(&r.lease_us, 99.0),
        r.lease_us.last().copied().unwrap_or(0),
        percentile(&r.complete_us, 50.0),
        percentile(&r.complete_us, 99.0),
        r.watermark,
        fsync.as_secs_f64() * 1e6,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let secs = std::env::var("LODE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 2 } else { 5 });
    let workers = std::env::var("LODE_BENCH_WORKERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_WORKERS);
    let batches: Vec<u32> = std::env::var("LODE_BENCH_STEPS")
        .unwrap_or_else(|_| "1,16".into())
        .split(',')
        .filter_map(|k| k.trim().parse().ok())
        .filter(|k| *k > 0)
        .collect();
    let rates: Vec<u64> = std::env::var("LODE_BENCH_RATE")
        .unwrap_or_else(|_| "0,60000".into())
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    // An ordinary disk: Cargo's target directory unless told otherwise (never a tmpfs).
    let base = std::env::var_os("LODE_BENCH_DIR").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        Into::into,
    );
    std::fs::create_dir_all(&base).expect("bench dir");
    let disk = tempfile::tempdir_in(&base).expect("tempdir");
    let shm =
        std::env::var_os("LODE_BENCH_SHM").and_then(|_| tempfile::tempdir_in("/dev/shm").ok());
    let mut cases = vec![("disk", disk.path().to_owned())];
    if let Some(shm) = &shm {
        cases.push(("/dev/shm", shm.path().to_owned()));
    }
    println!(
        "lease bench: {workers} workers, {RECORDS} records, batch {BATCH}, max_leases max(2k, 4), receiver's window {} steps, {secs} s per case, order {}, journal under {}",
        window(),
        std::env::var("LODE_BENCH_ORDER").unwrap_or_else(|_| "lode".into()),
        base.display()
    );
    println!(
        "{:<10} {:>4} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "journal",
        "k",
        "offered",
        "steps/s",
        "waits",
        "lease p50",
        "lease p99",
        "lease max",
        "compl p50",
        "compl p99",
        "watermark",
        "fsync µs"
    );
    println!(
        "{:<10} {:>4} {:>8} {:>10} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "", "", "steps/s", "", "", "µs", "µs", "µs", "µs", "µs", "", "(median)"
    );
    for (name, dir) in cases {
        for &k in &batches {
            for &rate in &rates {
                let fsync = fsync_cost(&dir);
                let case = dir.join(format!("k{k}-r{rate}"));
                let result = runtime.block_on(run_case(
                    name,
                    &case,
                    workers,
                    k,
                    rate,
                    Duration::from_secs(secs),
                ));
                print_result(&result, k, rate, fsync);
            }
        }
    }
}
