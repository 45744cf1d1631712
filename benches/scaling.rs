//! Scaling of the whole runtime with the number of data workers, on a fixed-latency stage.
//!
//! Each case writes a synthetic plan (`lode synthetic`: every step sleeps `latency` on its data
//! worker, so one worker's ideal is `1 / latency` steps/s whatever this machine's core count)
//! and runs the real runtime in this process: the dispatcher service with its journal on disk,
//! the consumer (`lode consume`'s emulator, step time 0, logging every step) and `n` data workers
//! (`run_worker`, one registration, connection, rayon pool and lease loop each). After a warm-up
//! (every worker has delivered about two steps), the steps the consumer receives in order are
//! counted over a fixed window.
//!
//! Reported per worker count: steps/s, the ideal `n / latency`, the fraction of it reached, and
//! the fraction of `n` times the one-worker rate measured in the same run (linear scaling).
//!
//! A plain `harness = false` main: each case is a whole distributed run with its own setup.
//! Run with `cargo bench -p lode --bench scaling` (`-- --quick` for shorter windows;
//! `LODE_BENCH_WORKERS=1,8,64`, `LODE_BENCH_LATENCY_MS=100` and `LODE_BENCH_SECS=10` override
//! the defaults).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use std::sync::atomic::{AtomicBool, Ordering};

use lode_dataworker::worker::{run_worker, WorkerConfig};
use lode_dispatcher::{plan_source, DispatcherConfig, JobId, RunSettings, ServiceConfig};
use lode_proto::plan::PlanDir;
use lode_runtime::exec::source::RecordSource;
use lode_runtime::synthetic::SyntheticSpec;
use lode_train::consumer::ConsumerConfig;
use lode_train::emulator::{emulate, ConsumeSummary, EmulatorConfig};
use lode_transfer::Compression;

const TOKEN: &str = "bench-token";
const JOB: u64 = 1;
const BATCH: u64 = 8;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let latency = Duration::from_millis(env_or("LODE_BENCH_LATENCY_MS", 100));
    let window = Duration::from_secs(env_or("LODE_BENCH_SECS", if quick { 4 } else { 10 }));
    let counts: Vec<usize> = std::env::var("LODE_BENCH_WORKERS")
        .unwrap_or_else(|_| "1,8,16,32,64".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .filter(|&c| c > 0)
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "fixed-latency stage: {latency:?} per step, batch {BATCH}, window {window:?}, {} cores",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    println!("workers  steps/s  ideal  of ideal  of linear");
    let mut one: Option<f64> = None;
    for &n in &counts {
        let rate = rt.block_on(run_case(n, latency, window))?;
        if n == 1 {
            one = Some(rate);
        }
        #[allow(clippy::cast_precision_loss)]
        let ideal = n as f64 / latency.as_secs_f64();
        #[allow(clippy::cast_precision_loss)]
        let linear = one.map_or_else(
            || "-".to_owned(),
            |r| format!("{:.1}%", 100.0 * rate / (r * n as f64)),
        );
        println!(
            "{n:>7}  {rate:>7.1}  {ideal:>5.0}  {:>7.1}%  {linear:>9}",
            100.0 * rate / ideal
        );
    }
    Ok(())
}

/// One run with `n` workers; returns the consumer's steps/s over the window.
async fn run_case(n: usize, latency: Duration, window: Duration) -> anyhow::Result<f64> {
    let tmp = tempfile::tempdir()?;
    // Enough records that the epoch outlasts warm-up and window with a wide margin.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let steps = ((n as f64 / latency.as_secs_f64()) * (window.as_secs_f64() + 30.0) * 2.0) as u64;
    let spec = SyntheticSpec {
        records: steps.max(100) * BATCH,
        batch: BATCH,
        latency,
        spin: false,
        width: 16,
        epochs: 1,
        parallelism: 1,
        values: Default::default(),
    };
    let plan_dir = tmp.path().join("plan");
    spec.write(&plan_dir)?;
    let plan = PlanDir::open(&plan_dir)?;
    let source = plan_source(&plan)?;
    let records = RecordSource::open(source, &plan.data_root(), false)?.epoch_len();
    let run = RunSettings {
        epochs: None,
        lease_duration: Duration::from_secs(30),
        max_leases_per_worker: 3,
    };
    let config = DispatcherConfig::from_source(source, records, plan.plan.stages.len(), run)?;
    let journal = tmp.path().join("journal");
    let (service, _) = ServiceConfig::for_plan(&plan, JobId(JOB), TOKEN, config, &journal)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = format!("http://{}", listener.local_addr()?);
    // Workers stop first, then the dispatcher (a worker's RPC to a stopped dispatcher fails).
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (stop_workers_tx, stop_workers_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let dispatcher = tokio::spawn(lode_dispatcher::serve(
        listener,
        service,
        stopped(stop_rx.clone()),
    ));
    let progress = Arc::new(Mutex::new(ConsumeSummary::default()));
    let mut consumer_config = ConsumerConfig::new(&addr, TOKEN, JOB);
    consumer_config.capacity = u64::try_from(4 * n).unwrap_or(u64::MAX).max(64);
    let emulator = EmulatorConfig {
        consumer: consumer_config,
        log: tmp.path().join("consumer.jsonl"),
        step_time: Duration::ZERO,
        steps: None,
        end_job: false,
        expect_first: None,
        metrics: None,
    };
    let stop_consumer = Arc::new(AtomicBool::new(false));
    let consumer = tokio::task::spawn_blocking({
        let (progress, stop) = (progress.clone(), stop_consumer.clone());
        move || emulate(&emulator, Some(&progress), &|| stop.load(Ordering::SeqCst))
    });
    let mut workers = Vec::new();
    for i in 0..n {
        let config = WorkerConfig {
            dispatcher: addr.clone(),
            token: TOKEN.into(),
            job: JOB,
            name: format!("bench-{i}"),
            threads: 1,
            data_root: None,
            compression: Compression::Off,
            stage: None,
            ignore_errors: false,
            tls: None,
            stats: Arc::default(),
        };
        workers.push(tokio::spawn(run_worker(
            config,
            stopped(stop_workers_rx.clone()),
        )));
    }
    let consumed = || progress.lock().map(|p| p.steps).unwrap_or(0);
    let warm = u64::try_from(2 * n).unwrap_or(u64::MAX);
    let started = Instant::now();
    while consumed() < warm {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "{n} workers: no warm-up after 120 s ({} steps)",
            consumed()
        );
        anyhow::ensure!(
            !consumer.is_finished(),
            "the consumer stopped during warm-up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (t0, s0) = (Instant::now(), consumed());
    tokio::time::sleep(window).await;
    let (t1, s1) = (Instant::now(), consumed());
    let _ = stop_workers_tx.send(true);
    for w in workers {
        w.await.context("a worker task")??;
    }
    stop_consumer.store(true, Ordering::SeqCst);
    consumer.await.context("the consumer thread")??;
    let _ = stop_tx.send(true);
    dispatcher.await.context("the dispatcher task")??;
    #[allow(clippy::cast_precision_loss)]
    Ok((s1 - s0) as f64 / (t1 - t0).as_secs_f64())
}
