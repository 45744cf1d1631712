//! The running system on this machine: `lode dispatcher`, `lode worker`, `lode consume`,
//! `lode status` and `lode run` (all of them at once). The services live in the crates; this
//! module loads plans, resolves settings and wires processes together.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use lode_dataworker::exec::source::RecordSource;
use lode_dataworker::service::consumer::ConsumerConfig;
use lode_dataworker::service::emulator::{emulate, ConsumeSummary, EmulatorConfig};
use lode_dataworker::service::worker::{run_worker, WorkerConfig};
use lode_dispatcher::{plan_source, DispatcherConfig, JobId, RunSettings, ServiceConfig};
use lode_proto::plan::PlanDir;
use lode_proto::service::v1::StatusRequest;
use lode_proto::service::{connect, RpcError};
use lode_proto::tls::{ClientTls, ServerTls};

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
    service.stop_at_end = !args.keep_serving;
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
        lode_dispatcher::serve(listener, service, stop_requested()).await?;
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
        .block_on(run_worker(config, stop_requested()))
        .with_context(|| format!("worker of {}", args.dispatcher))?;
    writeln!(
        out,
        "worker {} (stage {}): {} steps, {:?}",
        summary.worker_id, summary.stage, summary.steps, summary.end
    )?;
    Ok(())
}

/// The emulator's settings for `lode consume`'s arguments.
pub fn emulator_config(args: &ConsumeArgs) -> anyhow::Result<EmulatorConfig> {
    let mut consumer = ConsumerConfig::new(&args.dispatcher, &args.token, args.job);
    consumer.listen.clone_from(&args.listen);
    consumer.advertise.clone_from(&args.advertise);
    consumer.server_tls = server_tls(&args.tls)?;
    consumer.client_tls = client_tls(args.tls_client.tls_ca.as_deref())?;
    consumer.capacity = args.capacity;
    Ok(EmulatorConfig {
        consumer,
        log: args.log.clone(),
        step_time: args.step_time,
        steps: args.steps,
        end_job: !args.leave_open,
        expect_first: args.resume_from,
        metrics: args.metrics.clone(),
    })
}

/// A flag that SIGINT or SIGTERM sets, watched by a thread of its own.
fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the signal watcher")?;
    let set = flag.clone();
    std::thread::Builder::new()
        .name("lode-signals".into())
        .spawn(move || {
            rt.block_on(stop_requested());
            set.store(true, Ordering::SeqCst);
        })
        .context("cannot start the signal watcher")?;
    Ok(flag)
}

pub fn run_consume(args: ConsumeArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let config = emulator_config(&args)?;
    let stop = stop_flag()?;
    let summary = emulate(&config, None, &|| stop.load(Ordering::SeqCst))?;
    writeln!(
        out,
        "consumed {} steps ({} samples) in {:.2} s{}",
        summary.steps,
        summary.samples,
        summary.seconds,
        if summary.end_of_data {
            ", end of data"
        } else if summary.ended_job {
            ", the job ended here"
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
                "steps_consumed": status.steps_consumed,
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
                status.steps_consumed, status.steps_per_epoch
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
            max_leases_per_worker: lode_dispatcher::DEFAULT_MAX_LEASES,
        },
    )?;
    let steps_total = args.steps;
    let journal = args
        .journal
        .clone()
        .unwrap_or_else(|| scratch.path().join("journal"));
    let mut service = service_config(&plan, job, &token, config.clone(), &journal)?;
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
                .args(["worker", "--dispatcher", &addr, "-q"])
                // Never in argv, where every user of the machine can read it.
                .env("LODE_TOKEN", &token)
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
        let mut consumer_config = ConsumerConfig::new(&addr, &token, job);
        consumer_config.server_tls = server_tls(&args.tls)?;
        consumer_config.client_tls = client_tls(ca.as_deref())?;
        consumer_config.capacity = 64;
        let emulator = EmulatorConfig {
            consumer: consumer_config,
            log: log.clone(),
            step_time: args.step_time,
            steps: Some(steps_total),
            // `lode run` stops its own processes; a job left open can be resumed from its
            // journal (`--journal`).
            end_job: false,
            expect_first: None,
            metrics: None,
        };
        let bar = indicatif::ProgressBar::new(steps_total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        // SIGINT or SIGTERM ends the job early, as cleanly as its end: the consumer reports
        // what it logged, workers are stopped, the announcement removed.
        let interrupted = Arc::new(AtomicBool::new(false));
        tokio::spawn({
            let interrupted = interrupted.clone();
            async move {
                stop_requested().await;
                interrupted.store(true, Ordering::SeqCst);
            }
        });
        let consumer = tokio::task::spawn_blocking({
            let (progress, interrupted) = (progress.clone(), interrupted.clone());
            move || {
                emulate(&emulator, Some(&progress), &|| {
                    interrupted.load(Ordering::SeqCst)
                })
            }
        });
        let stopped = || interrupted.load(Ordering::SeqCst);
        while !consumer.is_finished() {
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
        let summary = consumer.await.context("the consumer thread")??;
        if stopped() {
            tracing::warn!("interrupted");
        }
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
        "{}: {} steps, {} samples in {:.2} s ({:.0} samples/s) with {} worker(s); log {}; journal {}",
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
        },
        if args.journal.is_some() {
            journal.display().to_string()
        } else {
            "discarded".into()
        }
    )?;
    Ok(())
}
