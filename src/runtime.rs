//! The running system on this machine: `lode dispatcher`, `lode worker`, `lode consume`,
//! `lode status` and `lode run` (all of them at once). The services live in the crates; this
//! module loads plans, resolves settings and wires processes together.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use lode_dataworker::exec::source::RecordSource;
use lode_dataworker::service::consumer::receiver_url;
use lode_dataworker::service::receiver::{serve_receiver, ReceiverService};
use lode_dataworker::service::worker::{run_worker, WorkerConfig};
use lode_dataworker::transfer::{ReceiverConfig, SharedReceiver};
use lode_dispatcher::{plan_source, DispatcherConfig, JobId, RunSettings, ServiceConfig};
use lode_proto::plan::PlanDir;
use lode_proto::service::v1::{ConsumedRequest, RegisterConsumerRequest, StatusRequest};
use lode_proto::service::{connect, RpcError};
use lode_proto::tls::{ClientTls, ServerTls};
use serde::Serialize;

use crate::cli::{
    ConsumeArgs, DispatcherArgs, DrainArgs, OutputFormat, RunArgs, ServerTlsArgs, StatusArgs,
    WorkerArgs,
};

/// The server identity of `--tls-cert` and `--tls-key`, when given.
pub fn server_tls(args: &ServerTlsArgs) -> anyhow::Result<Option<ServerTls>> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Ok(Some(ServerTls::from_pem_files(cert, key)?)),
        (None, None) => Ok(None),
        _ => bail!("--tls-cert and --tls-key go together"),
    }
}

/// The trust of `--tls-ca`, when given.
pub fn client_tls(ca: Option<&Path>) -> anyhow::Result<Option<ClientTls>> {
    Ok(ca.map(ClientTls::from_ca_file).transpose()?)
}

/// A fresh random token (hex), from the OS's randomness through std's hasher seeds.
pub fn generate_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for i in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The dispatcher's settings for a plan: the record count comes from indexing the source
/// (relative to `data_root`, else the plan's own data root).
pub fn dispatcher_config(
    plan: &PlanDir,
    data_root: Option<&Path>,
    run: RunSettings,
) -> anyhow::Result<DispatcherConfig> {
    let source = plan_source(plan)?;
    let root = data_root.map_or_else(|| plan.data_root(), Path::to_path_buf);
    let records = RecordSource::open(source, &root, false)
        .with_context(|| format!("{}: cannot index the input", plan.dir.display()))?;
    DispatcherConfig::from_source(source, records.epoch_len(), plan.plan.stages.len(), run)
        .with_context(|| format!("{}: the input pipeline's order", plan.dir.display()))
}

/// The dispatcher service for a plan, saying which seed an unseeded shuffle got.
pub fn service_config(
    plan: &PlanDir,
    job: u64,
    token: &str,
    config: DispatcherConfig,
    journal: &Path,
) -> anyhow::Result<ServiceConfig> {
    let (service, picked) = ServiceConfig::for_plan(plan, JobId(job), token, config, journal)?;
    if let Some(picked) = picked {
        if picked.recorded {
            tracing::info!(
                seed = picked.seed,
                journal = %journal.display(),
                "the input pipeline shuffles without a seed; using the seed its journal recorded"
            );
        } else {
            tracing::warn!(
                seed = picked.seed,
                journal = %journal.display(),
                "the input pipeline shuffles without a seed (TensorFlow would pick one at random \
                 on every run); Lode picked this one and records it in the journal, so that a \
                 restart keeps the order"
            );
        }
    }
    Ok(service)
}

async fn shutdown_signal() {
    let _ = tokio::signal::ctrl_c().await;
}

/// SIGINT, or SIGTERM on Unix.
async fn stop_requested() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

pub fn run_dispatcher(args: DispatcherArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let tls = server_tls(&args.tls)?;
    // Only its own TLS port needs it (a CA with a plaintext port would warn at every scrape).
    let own_ca = match &tls {
        Some(_) => client_tls(args.tls_ca.as_deref())?,
        None => None,
    };
    if tls.is_some() && args.metrics.is_some() && own_ca.is_none() {
        bail!(
            "--metrics with --tls-cert needs --tls-ca (the CA of the dispatcher's certificate): \
             the metrics endpoint reads the job's status through the TLS port"
        );
    }
    let plan = PlanDir::open(&args.plan)?;
    let (token, generated) = match &args.token {
        Some(t) => (t.clone(), false),
        None => (generate_token(), true),
    };
    let config = dispatcher_config(
        &plan,
        args.data_root.as_deref(),
        RunSettings {
            epochs: args.epochs,
            lease_duration: Duration::from_millis(args.lease_ms),
            max_leases_per_worker: args.max_leases,
        },
    )?;
    let mut service = service_config(&plan, args.job, &token, config, &args.journal)?;
    service.tls = tls;
    let rt = runtime()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let url = lode_proto::tls::url(listener.local_addr()?, service.tls.is_some());
        writeln!(out, "dispatcher for job-{} listening on {url}", args.job)?;
        if generated {
            writeln!(out, "token: {token}")?;
        }
        out.flush()?;
        if let Some(file) = &args.addr_file {
            lode_proto::io::write_atomic(file, url.as_bytes())?;
        }
        if let Some(metrics_addr) = &args.metrics {
            let metrics = tokio::net::TcpListener::bind(metrics_addr)
                .await
                .with_context(|| format!("cannot serve metrics on {metrics_addr}"))?;
            writeln!(out, "metrics on http://{}/metrics", metrics.local_addr()?)?;
            out.flush()?;
            let (job, token, url) = (args.job, token.clone(), url.clone());
            tokio::spawn(lode_proto::metrics::serve_metrics(
                metrics,
                move || {
                    let (token, url, ca) = (token.clone(), url.clone(), own_ca.clone());
                    async move {
                        let status = async {
                            let mut c = connect(&url, &token, ca.as_ref()).await.ok()?;
                            c.status(StatusRequest { job_id: job }).await.ok()
                        }
                        .await;
                        status.map_or_else(String::new, |s| {
                            lode_proto::metrics::render_dispatcher(job, s.get_ref())
                        })
                    }
                },
                std::future::pending(),
            ));
        }
        lode_dispatcher::serve(listener, service, shutdown_signal()).await?;
        anyhow::Ok(())
    })
}

pub fn run_worker_command(args: WorkerArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let config = WorkerConfig {
        dispatcher: args.dispatcher.clone(),
        token: args.token.clone(),
        job: args.job,
        name: args
            .name
            .clone()
            .unwrap_or_else(|| format!("pid-{}", std::process::id())),
        threads: args.threads.unwrap_or(1),
        data_root: args.data_root.clone(),
        compression: args
            .compression
            .parse()
            .map_err(|e| anyhow::anyhow!("--compression: {e}"))?,
        stage: args.stage,
        ignore_errors: args.ignore_errors,
        tls: client_tls(args.tls.tls_ca.as_deref())?,
    };
    let rt = runtime()?;
    let summary = rt
        .block_on(run_worker(config, shutdown_signal()))
        .with_context(|| format!("worker of {}", args.dispatcher))?;
    writeln!(
        out,
        "worker {} (stage {}): {} steps, {:?}",
        summary.worker_id, summary.stage, summary.steps, summary.end
    )?;
    Ok(())
}

/// Calls a dispatcher RPC, retrying while the dispatcher is unreachable (restarting from its
/// journal) for up to 30 s.
async fn patient<T, F, Fut>(name: &'static str, rpc: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    lode_proto::service::retry_unreachable(Duration::from_secs(30), rpc)
        .await
        .map_err(|status| RpcError { rpc: name, status }.into())
}

/// What the consumer has not told the dispatcher yet.
#[derive(Debug, Default)]
struct Unreported {
    /// The last consumed step (epoch, step within the epoch).
    watermark: Option<(u64, u64)>,
    /// Time spent training (not waiting for data) since the last report.
    busy: Duration,
}

/// Reports the last consumed step and the busy time since the last report, if a step is
/// unreported.
async fn report_consumed(
    dispatcher: &lode_proto::service::DispatcherClient,
    job: u64,
    unreported: &mut Unreported,
) -> anyhow::Result<()> {
    if let Some((epoch, step)) = unreported.watermark.take() {
        let busy_us =
            u64::try_from(std::mem::take(&mut unreported.busy).as_micros()).unwrap_or(u64::MAX);
        patient("Consumed", || {
            let mut d = dispatcher.clone();
            async move {
                d.consumed(ConsumedRequest {
                    job_id: job,
                    epoch,
                    step,
                    busy_us,
                })
                .await
            }
        })
        .await?;
    }
    Ok(())
}

/// One line of the consumer's log.
#[derive(Debug, Serialize)]
struct LogLine {
    epoch: u64,
    step: u64,
    records: Vec<u64>,
    digest: String,
}

/// A step's digest: TensorFlow's Fingerprint64 over the TensorProto encoding of every tensor
/// of every stage's part, in stage then send order.
fn digest(step: &lode_dataworker::transfer::Step) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    for part in &step.parts {
        for t in &part.tensors {
            let encoded = lode_dataworker::convert::encode_tensor(t)?;
            bytes.extend_from_slice(&(encoded.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&encoded);
        }
    }
    Ok(format!(
        "{:016x}",
        lode_dataworker::hash::fingerprint64(&bytes)
    ))
}

/// What a consumer did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConsumeSummary {
    pub steps: u64,
    pub samples: u64,
    pub seconds: f64,
    pub end_of_data: bool,
}

/// The training-worker emulator: serves a receiver, registers it, consumes complete steps in
/// order at `step_time`, logs each, and reports the watermark.
pub async fn consume(
    args: &ConsumeArgs,
    progress: Option<Arc<std::sync::Mutex<ConsumeSummary>>>,
) -> anyhow::Result<ConsumeSummary> {
    let tls = server_tls(&args.tls)?;
    let ca = client_tls(args.tls_client.tls_ca.as_deref())?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let receiver_addr = receiver_url(
        listener.local_addr()?,
        args.advertise.as_deref(),
        tls.is_some(),
    )
    .map_err(anyhow::Error::msg)?;
    let mut dispatcher = connect(&args.dispatcher, &args.token, ca.as_ref()).await?;
    let reg = dispatcher
        .register_consumer(RegisterConsumerRequest {
            job_id: args.job,
            receiver_addr,
            resume_from: None,
        })
        .await
        .map_err(RpcError::of("RegisterConsumer"))?
        .into_inner();
    let plan: lode_proto::plan::Plan =
        serde_json::from_str(&reg.plan_json).context("the dispatcher's plan")?;
    let per_epoch = reg.steps_per_epoch.max(1);
    let first = reg.first_step.unwrap_or_default();
    let first_global = first.epoch * per_epoch + first.step;
    if let Some(resume) = args.resume_from {
        if resume != first_global {
            bail!(
                "--resume-from {resume}, but the dispatcher's watermark says the next step is {first_global}"
            );
        }
    }
    let stages: BTreeSet<u32> = (0..u32::try_from(plan.stages.len()).unwrap_or(0)).collect();
    if stages.is_empty() {
        bail!("the plan has no data-worker stage");
    }
    let buffer = Arc::new(SharedReceiver::new(ReceiverConfig::new(
        args.job,
        stages,
        first_global,
        args.capacity,
    ))?);
    let service = ReceiverService::new(args.job, &args.token, buffer.clone());
    if let Some(metrics_addr) = &args.metrics {
        let metrics = tokio::net::TcpListener::bind(metrics_addr)
            .await
            .with_context(|| format!("cannot serve metrics on {metrics_addr}"))?;
        tracing::info!(addr = %metrics.local_addr()?, "receiver metrics");
        let (b, job) = (buffer.clone(), args.job);
        tokio::spawn(lode_proto::metrics::serve_metrics(
            metrics,
            move || {
                let text = lode_dataworker::service::metrics::render_prometheus(job, &b.metrics());
                async move { text }
            },
            std::future::pending(),
        ));
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_receiver(listener, service, tls, async {
        let _ = stop_rx.await;
    }));
    // Buffered: every report of the watermark flushes first, so the log always holds every
    // step the dispatcher was told of (a consumer killed later loses only unreported lines,
    // which the restarted consumer receives again).
    let mut log = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&args.log)
            .with_context(|| format!("cannot open {}", args.log.display()))?,
    );
    let mut summary = ConsumeSummary::default();
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut unreported = Unreported::default();
    let step_time = args.step_time;
    let mut done = reg.end_of_data;
    while !done && args.steps.is_none_or(|n| summary.steps < n) {
        let b = buffer.clone();
        let step = tokio::task::spawn_blocking(move || b.pop(Duration::from_millis(200)))
            .await
            .context("the receiver thread")?;
        let Some(step) = step else {
            log.flush()?;
            report_consumed(&dispatcher, args.job, &mut unreported).await?;
            let status = patient("Status", || {
                let mut d = dispatcher.clone();
                async move { d.status(StatusRequest { job_id: args.job }).await }
            })
            .await?;
            done = status.end_of_data;
            continue;
        };
        let training = Instant::now();
        let records = step
            .parts
            .first()
            .map(|p| p.records.clone())
            .unwrap_or_default();
        let line = LogLine {
            epoch: step.epoch,
            step: step.step,
            records,
            digest: digest(&step)?,
        };
        summary.samples += line.records.len() as u64;
        serde_json::to_writer(&mut log, &line)?;
        log.write_all(b"\n")?;
        if !step_time.is_zero() {
            tokio::time::sleep(step_time).await;
        }
        summary.steps += 1;
        let within = step.step % per_epoch;
        unreported.watermark = Some((step.epoch, within));
        unreported.busy += training.elapsed();
        if last_report.elapsed() >= Duration::from_millis(50) {
            log.flush()?;
            report_consumed(&dispatcher, args.job, &mut unreported).await?;
            last_report = Instant::now();
        }
        if let Some(p) = &progress {
            if let Ok(mut p) = p.lock() {
                *p = summary.clone();
                p.seconds = started.elapsed().as_secs_f64();
            }
        }
    }
    log.flush()?;
    report_consumed(&dispatcher, args.job, &mut unreported).await?;
    summary.seconds = started.elapsed().as_secs_f64();
    summary.end_of_data = done;
    let _ = stop_tx.send(());
    let _ = server.await;
    Ok(summary)
}

pub fn run_consume(args: ConsumeArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let rt = runtime()?;
    let summary = rt.block_on(consume(&args, None))?;
    writeln!(
        out,
        "consumed {} steps ({} samples) in {:.2} s{}",
        summary.steps,
        summary.samples,
        summary.seconds,
        if summary.end_of_data {
            ", end of data"
        } else {
            ""
        }
    )?;
    Ok(())
}

pub fn run_drain(args: DrainArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let ca = client_tls(args.tls.tls_ca.as_deref())?;
    let rt = runtime()?;
    rt.block_on(async {
        let mut client = connect(&args.addr, &args.token, ca.as_ref()).await?;
        client
            .drain(lode_proto::service::v1::DrainRequest {
                job_id: args.job,
                worker_id: args.worker,
            })
            .await
            .map_err(RpcError::of("Drain"))
            .with_context(|| format!("cannot drain worker-{}", args.worker))?;
        anyhow::Ok(())
    })?;
    writeln!(out, "worker-{} is draining", args.worker)?;
    Ok(())
}

fn worker_status(status: i32) -> &'static str {
    match lode_proto::service::v1::WorkerStatus::try_from(status) {
        Ok(lode_proto::service::v1::WorkerStatus::Active) => "active",
        Ok(lode_proto::service::v1::WorkerStatus::Draining) => "draining",
        _ => "unknown",
    }
}

pub fn run_status(args: StatusArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let ca = client_tls(args.tls.tls_ca.as_deref())?;
    let rt = runtime()?;
    let status = rt.block_on(async {
        let mut client = connect(&args.addr, &args.token, ca.as_ref()).await?;
        let status = client
            .status(StatusRequest { job_id: args.job })
            .await
            .map_err(RpcError::of("Status"))?
            .into_inner();
        anyhow::Ok(status)
    })?;
    match args.format {
        OutputFormat::Json => {
            let workers: Vec<serde_json::Value> = status
                .workers
                .iter()
                .map(|w| {
                    serde_json::json!({"id": w.id, "name": w.name, "stage": w.stage, "status": worker_status(w.status), "leases": w.leases, "last_seen_ms": w.last_seen_ms})
                })
                .collect();
            let value = serde_json::json!({
                "epoch": status.epoch,
                "watermark": status.watermark.map(|w| serde_json::json!({"epoch": w.epoch, "step": w.step})),
                "end_of_data": status.end_of_data,
                "workers": workers,
                "leases": status.leases.len(),
                "steps_completed": status.steps_completed,
                "steps_per_epoch": status.steps_per_epoch,
                "epochs": status.epochs,
                "steps_computed": status.steps_computed,
                "compute_us": status.compute_us,
                "consumer_busy_us": status.consumer_busy_us,
            });
            serde_json::to_writer_pretty(&mut *out, &value)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            let watermark = status.watermark.map_or_else(
                || "none".to_owned(),
                |w| format!("epoch {} step {}", w.epoch, w.step),
            );
            writeln!(
                out,
                "job-{} epoch {}, watermark {watermark}{}",
                args.job,
                status.epoch,
                if status.end_of_data {
                    ", end of data"
                } else {
                    ""
                }
            )?;
            writeln!(
                out,
                "steps consumed {}, steps per epoch {}",
                status.steps_completed, status.steps_per_epoch
            )?;
            writeln!(out, "workers {}:", status.workers.len())?;
            for w in &status.workers {
                writeln!(
                    out,
                    "  worker-{} {:?} stage {} {} leases {} last seen {} ms",
                    w.id,
                    w.name,
                    w.stage,
                    worker_status(w.status),
                    w.leases,
                    w.last_seen_ms
                )?;
            }
            writeln!(out, "leases {}", status.leases.len())?;
        }
    }
    Ok(())
}

/// `lode run`: partition (when given a model), then a dispatcher and a consumer in this
/// process and `--workers` worker processes, until `--steps` steps are consumed.
pub fn run_run(args: RunArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let tls = server_tls(&args.tls)?;
    let ca = args.tls_client.tls_ca.clone();
    if tls.is_some() != ca.is_some() {
        bail!(
            "lode run takes --tls-cert, --tls-key and --tls-ca together (its consumer and \
             workers check the dispatcher's and receiver's certificate against the CA), or none"
        );
    }
    client_tls(ca.as_deref())?;
    let input = args
        .input
        .clone()
        .unwrap_or_else(|| PathBuf::from("fixtures/wide_deep/model.pb"));
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let plan_dir = if input.join("plan.json").is_file() {
        input.clone()
    } else {
        let dir = scratch.path().join("plan");
        crate::partition_to(&input, args.tags.clone(), &dir)?;
        dir
    };
    let plan = PlanDir::open(&plan_dir)?;
    let token = generate_token();
    let job = 1;
    let config = dispatcher_config(
        &plan,
        None,
        RunSettings {
            epochs: args.epochs,
            lease_duration: Duration::from_secs(10),
            max_leases_per_worker: 3,
        },
    )?;
    let steps_total = args.steps;
    let mut service = service_config(
        &plan,
        job,
        &token,
        config.clone(),
        &scratch.path().join("journal"),
    )?;
    service.tls = tls;
    let rt = runtime()?;
    let exe = std::env::current_exe().context("cannot find the lode executable")?;
    let log = args
        .log
        .clone()
        .unwrap_or_else(|| scratch.path().join("consumer.jsonl"));
    let summary = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = lode_proto::tls::url(listener.local_addr()?, service.tls.is_some());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let dispatcher = tokio::spawn(lode_dispatcher::serve(listener, service, async {
            let _ = stop_rx.await;
        }));
        // Removed (by drop) when the job ends, however it ends.
        let _announced = match &args.announce {
            Some(dir) => {
                let name = args.name.clone().unwrap_or_else(|| {
                    let stem = input
                        .file_stem()
                        .map_or_else(|| "job".into(), |s| s.to_string_lossy().into_owned());
                    format!("{stem}-{}", std::process::id())
                });
                let announcement = lode_scheduler::local::Announcement {
                    name,
                    dispatcher: addr.clone(),
                    job,
                    token: token.clone(),
                };
                Some(announcement.publish(dir)?)
            }
            None => None,
        };
        let mut workers = Vec::new();
        for i in 0..args.workers {
            let mut command = std::process::Command::new(&exe);
            command
                .args(["worker", "--dispatcher", &addr, "--token", &token, "-q"])
                .args(["--name", &format!("worker-{i}")]);
            if let Some(ca) = &ca {
                command.arg("--tls-ca").arg(ca);
            }
            let child = command
                .stdout(std::process::Stdio::null())
                .spawn()
                .context("cannot start a worker process")?;
            workers.push(child);
        }
        let progress = Arc::new(std::sync::Mutex::new(ConsumeSummary::default()));
        let consume_args = ConsumeArgs {
            dispatcher: addr.clone(),
            token: token.clone(),
            job,
            log: log.clone(),
            step_time: args.step_time,
            listen: "127.0.0.1:0".into(),
            advertise: None,
            steps: Some(steps_total),
            resume_from: None,
            capacity: 64,
            metrics: None,
            tls: args.tls.clone(),
            tls_client: args.tls_client.clone(),
        };
        let bar = indicatif::ProgressBar::new(steps_total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let consumer = tokio::spawn({
            let progress = progress.clone();
            async move { consume(&consume_args, Some(progress)).await }
        });
        // SIGINT or SIGTERM ends the job early, as cleanly as its end: workers stopped, the
        // announcement removed.
        let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn({
            let interrupted = interrupted.clone();
            async move {
                stop_requested().await;
                interrupted.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let stopped = || interrupted.load(std::sync::atomic::Ordering::SeqCst);
        while !consumer.is_finished() && !stopped() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let p = progress.lock().map(|p| p.clone()).unwrap_or_default();
            let alive = workers
                .iter_mut()
                .map(|c| c.try_wait().ok().flatten().is_none())
                .filter(|&running| running)
                .count();
            bar.set_position(p.steps);
            bar.set_message(format!(
                "{:.0} samples/s, workers alive {alive}",
                if p.seconds > 0.0 {
                    p.samples as f64 / p.seconds
                } else {
                    0.0
                }
            ));
        }
        bar.finish_and_clear();
        let summary = if stopped() {
            consumer.abort();
            let _ = consumer.await;
            tracing::warn!("interrupted");
            progress.lock().map(|p| p.clone()).unwrap_or_default()
        } else {
            consumer.await.context("the consumer task")??
        };
        for mut w in workers {
            let _ = w.kill();
            let _ = w.wait();
        }
        let _ = stop_tx.send(());
        let _ = dispatcher.await;
        anyhow::Ok(summary)
    })?;
    writeln!(
        out,
        "{}: {} steps, {} samples in {:.2} s ({:.0} samples/s) with {} worker(s); log {}",
        input.display(),
        summary.steps,
        summary.samples,
        summary.seconds,
        if summary.seconds > 0.0 {
            summary.samples as f64 / summary.seconds
        } else {
            0.0
        },
        args.workers,
        if args.log.is_some() {
            log.display().to_string()
        } else {
            "discarded".into()
        }
    )?;
    Ok(())
}
