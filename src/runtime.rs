//! The running system on this machine: `lode dispatcher`, `lode worker`, `lode consume`,
//! `lode drain`, `lode status` and `lode run` (all of them at once). The services live in the
//! crates; this module loads plans, resolves settings and wires processes together.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context as _};
use lode_dataworker::worker::{run_worker_rejoining, WorkerConfig};
use lode_dispatcher::{plan_source, DispatcherConfig, DispatcherThread, JobId, RunSettings};
use lode_dispatcher::{ServiceConfig, DEFAULT_MAX_LEASES};
use lode_proto::plan::PlanDir;
use lode_proto::process::{generate_token, stop_flag, stop_requested};
use lode_proto::service::v1::{DrainRequest, StatusRequest};
use lode_proto::service::{connect, RpcError};
use lode_proto::tls::{ClientTls, ServerTls};
use lode_runtime::exec::source::RecordSource;
use lode_scheduler::local::{Announcement, Published, WorkerCommand};
use lode_train::consumer::ConsumerConfig;
use lode_train::emulator::{emulate, ConsumeSummary, EmulatorConfig};

use crate::cli::{ConsumeArgs, DispatcherArgs, DrainArgs, OutputFormat, RunArgs, ServerTlsArgs};
use crate::cli::{StatusArgs, WorkerArgs};

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

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
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

/// A job run by this process: its dispatcher on a thread, its local worker processes and its
/// announcement. Dropping it kills the workers, then stops the dispatcher and withdraws the
/// announcement.
#[derive(Debug)]
pub struct LocalJob {
    pub url: String,
    pub token: String,
    pub workers: Vec<Child>,
    _dispatcher: DispatcherThread,
    _announced: Option<Published>,
}

impl LocalJob {
    /// Worker processes still running.
    pub fn workers_alive(&mut self) -> usize {
        self.workers
            .iter_mut()
            .map(|c| c.try_wait())
            .filter(|w| matches!(w, Ok(None)))
            .count()
    }

    /// Serves `service` on a loopback port; announced in `announce` as `name` when given.
    pub fn start(
        service: ServiceConfig,
        announce: Option<&Path>,
        name: &str,
    ) -> anyhow::Result<LocalJob> {
        LocalJob::start_on(service, "127.0.0.1:0", None, announce, name)
    }

    /// Serves `service` on `listen`. [`LocalJob::url`] is the address this machine dials (a
    /// loopback one when `listen` binds every interface); the announcement carries `advertise`
    /// (`HOST`, the bound port) when given, the address other machines dial.
    pub fn start_on(
        service: ServiceConfig,
        listen: &str,
        advertise: Option<&str>,
        announce: Option<&Path>,
        name: &str,
    ) -> anyhow::Result<LocalJob> {
        let listener = std::net::TcpListener::bind(listen)
            .with_context(|| format!("the dispatcher cannot listen on {listen}"))?;
        let (bound, tls) = (listener.local_addr()?, service.tls.is_some());
        let url = lode_proto::tls::url(local_address(bound), tls);
        let announced_url = match advertise {
            Some(host) => lode_train::consumer::receiver_url(bound, Some(host), tls)
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            None => url.clone(),
        };
        let (job, token) = (service.job_id.0, service.token.clone());
        let dispatcher = DispatcherThread::spawn(listener, service)?;
        let announced = announce
            .map(|dir| {
                let (name, dispatcher) = (name.to_owned(), announced_url.clone());
                let token = token.clone();
                Announcement {
                    name,
                    dispatcher,
                    job,
                    token,
                }
                .publish(dir)
            })
            .transpose()?;
        Ok(LocalJob {
            url,
            token,
            workers: Vec::new(),
            _dispatcher: dispatcher,
            _announced: announced,
        })
    }

    /// Starts one more worker process.
    pub fn spawn_worker(&mut self, command: &WorkerCommand<'_>) -> anyhow::Result<()> {
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", command.exe.display()))?;
        self.workers.push(child);
        Ok(())
    }
}

/// The address this machine dials for a server bound to `bound`: the loopback address of its
/// family in place of an unspecified one (`0.0.0.0`, `[::]`).
fn local_address(bound: std::net::SocketAddr) -> std::net::SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, bound.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, bound.port()).into(),
        _ => bound,
    }
}

impl Drop for LocalJob {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
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
    let run = RunSettings {
        epochs: args.epochs,
        lease_duration: Duration::from_millis(args.lease_ms),
        max_leases_per_worker: args.max_leases,
    };
    let config = dispatcher_config(&plan, args.data_root.as_deref(), run)?;
    let (mut service, _) =
        ServiceConfig::for_plan(&plan, JobId(args.job), &token, config, &args.journal)?;
    service.tls = tls;
    service.stop_at_end = !args.keep_serving;
    service.journal_compact_bytes = args.journal_compact;
    service.heartbeat_interval = Duration::from_millis(args.heartbeat_ms);
    service.missed_heartbeats = args.missed_heartbeats;
    runtime()?.block_on(async {
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
            let (job, token, url, pending) =
                (args.job, token.clone(), url.clone(), std::future::pending());
            let metrics = lode_proto::metrics::serve_dispatcher_metrics(
                metrics, job, url, token, own_ca, pending,
            );
            tokio::spawn(metrics);
        }
        lode_dispatcher::serve(listener, service, stop_requested()).await?;
        anyhow::Ok(())
    })
}

pub fn run_worker_command(args: WorkerArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let name = args.name.clone();
    let config = WorkerConfig {
        dispatcher: args.dispatcher.clone(),
        token: args.token.clone(),
        job: args.job,
        name: name.unwrap_or_else(|| format!("pid-{}", std::process::id())),
        threads: args.threads.unwrap_or(1),
        data_root: args.data_root.clone(),
        compression: args
            .compression
            .parse()
            .map_err(|e| anyhow::anyhow!("--compression: {e}"))?,
        stage: args.stage,
        ignore_errors: args.ignore_errors,
        tls: client_tls(args.tls.tls_ca.as_deref())?,
        stats: Arc::default(),
    };
    // One thread for the worker's network side: its CPU work runs on rayon, and a second
    // runtime thread only adds cross-thread wake-ups to every step (measured: README).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    if let Some(metrics_addr) = &args.metrics {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(metrics_addr))
            .with_context(|| format!("cannot serve metrics on {metrics_addr}"))?;
        writeln!(out, "metrics on http://{}/metrics", listener.local_addr()?)?;
        out.flush()?;
        let (job, stats) = (args.job, config.stats.clone());
        // Served on the worker's one runtime thread between its steps (a scrape is rare and
        // short); it stops with the runtime.
        rt.spawn(lode_proto::metrics::serve_metrics(
            listener,
            move || {
                let text = lode_dataworker::metrics::render_worker(job, &stats);
                async move { text }
            },
            std::future::pending(),
        ));
    }
    let summary = rt
        .block_on(run_worker_rejoining(config, stop_requested()))
        .with_context(|| format!("worker of {}", args.dispatcher))?;
    let rejoined = match summary.rejoined {
        0 => String::new(),
        1 => ", registered again once after being declared lost".to_owned(),
        n => format!(", registered again {n} times after being declared lost"),
    };
    writeln!(
        out,
        "worker {} (stage {}): {} steps, {:?}{rejoined}",
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
    consumer.capacity_bytes = args.capacity_bytes;
    consumer.resume_from = args.rewind_to;
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

pub fn run_consume(args: ConsumeArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let config = emulator_config(&args)?;
    let stop = stop_flag().context("cannot start the signal watcher")?;
    let summary = emulate(&config, None, &|| stop.load(Ordering::SeqCst))?;
    let end = if summary.end_of_data {
        ", end of data"
    } else if summary.ended_job {
        ", the job ended here"
    } else {
        ""
    };
    let (steps, samples, seconds) = (summary.steps, summary.samples, summary.seconds);
    let (duplicates, stale) = (summary.dropped_duplicates, summary.dropped_stale);
    writeln!(
        out,
        "consumed {steps} steps ({samples} samples) in {seconds:.2} s{end}; \
         dropped {duplicates} duplicate and {stale} stale step messages"
    )?;
    Ok(())
}

pub fn run_drain(args: DrainArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let ca = client_tls(args.tls.tls_ca.as_deref())?;
    runtime()?.block_on(async {
        let mut client = connect(&args.addr, &args.token, ca.as_ref()).await?;
        let request = DrainRequest {
            job_id: args.job,
            worker_id: args.worker,
        };
        client
            .drain(request)
            .await
            .map_err(RpcError::of("Drain"))
            .with_context(|| format!("cannot drain worker-{}", args.worker))?;
        anyhow::Ok(())
    })?;
    writeln!(out, "worker-{} is draining", args.worker)?;
    Ok(())
}

pub fn run_status(args: StatusArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let ca = client_tls(args.tls.tls_ca.as_deref())?;
    let status = runtime()?.block_on(async {
        let mut client = connect(&args.addr, &args.token, ca.as_ref()).await?;
        let request = StatusRequest { job_id: args.job };
        let status = client
            .status(request)
            .await
            .map_err(RpcError::of("Status"))?;
        anyhow::Ok(status.into_inner())
    })?;
    match args.format {
        OutputFormat::Json => {
            let json = lode_proto::status::to_json(&status);
            writeln!(out, "{}", serde_json::to_string_pretty(&json)?)?;
        }
        OutputFormat::Text => {
            out.write_all(lode_proto::status::to_text(args.job, &status).as_bytes())?
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
    let client = client_tls(ca.as_deref())?;
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
    let stages = plan.plan.stages.len();
    let workers = args.workers.unwrap_or(stages.max(2));
    if workers < stages {
        bail!(
            "{}: the plan has {stages} data-worker stages and every stage needs a worker: give \
             --workers {stages} or more (got {workers})",
            input.display()
        );
    }
    let run = RunSettings {
        epochs: args.epochs,
        lease_duration: Duration::from_secs(10),
        max_leases_per_worker: DEFAULT_MAX_LEASES,
    };
    let config = dispatcher_config(&plan, None, run)?;
    let cut = crate::run_report::describe_cut(&plan)?;
    let records_per_epoch = config.records;
    let order = config.clone();
    let journal = (args.journal.clone()).unwrap_or_else(|| scratch.path().join("journal"));
    let (mut service, _) =
        ServiceConfig::for_plan(&plan, JobId(1), &generate_token(), config, &journal)?;
    service.tls = tls.clone();
    service.journal_compact_bytes = args.journal_compact;
    let log = (args.log.clone()).unwrap_or_else(|| scratch.path().join("consumer.jsonl"));
    let stem = input.file_stem().map(|s| s.to_string_lossy().into_owned());
    let name = (args.name.clone()).unwrap_or_else(|| {
        format!(
            "{}-{}",
            stem.as_deref().unwrap_or("job"),
            std::process::id()
        )
    });
    // Dropped (workers killed, dispatcher stopped, announcement withdrawn) however `run` ends.
    let mut job = LocalJob::start(service, args.announce.as_deref(), &name)?;
    let exe = std::env::current_exe().context("cannot find the lode executable")?;
    let (url, token) = (job.url.clone(), job.token.clone());
    for i in 0..workers {
        let name = format!("worker-{i}");
        let command = WorkerCommand {
            tls_ca: ca.as_deref(),
            ..WorkerCommand::new(&exe, &url, &token, 1, &name)
        };
        job.spawn_worker(&command)?;
    }
    let mut consumer = ConsumerConfig::new(&job.url, &job.token, 1);
    (consumer.server_tls, consumer.client_tls) = (tls, client);
    let emulator = EmulatorConfig {
        consumer,
        log: log.clone(),
        step_time: args.step_time,
        steps: Some(args.steps),
        // `lode run` stops its own processes; a job left open can be resumed from its
        // journal (`--journal`).
        end_job: false,
        expect_first: None,
        metrics: None,
    };
    // SIGINT or SIGTERM ends the job early, as cleanly as its end: the consumer reports what
    // it logged, workers are stopped, the announcement removed.
    let stop = stop_flag().context("cannot start the signal watcher")?;
    let progress = Arc::new(Mutex::new(ConsumeSummary::default()));
    let consumer = std::thread::spawn({
        let (progress, stop) = (progress.clone(), stop.clone());
        move || emulate(&emulator, Some(&progress), &|| stop.load(Ordering::SeqCst))
    });
    let bar = indicatif::ProgressBar::new(args.steps);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    while !consumer.is_finished() {
        std::thread::sleep(Duration::from_millis(200));
        let p = progress.lock().map(|p| p.clone()).unwrap_or_default();
        let alive = job.workers_alive();
        let rate = if p.seconds > 0.0 {
            p.samples as f64 / p.seconds
        } else {
            0.0
        };
        bar.set_position(p.steps);
        bar.set_message(format!("{rate:.0} samples/s, workers alive {alive}"));
    }
    bar.finish_and_clear();
    let summary = consumer
        .join()
        .map_err(|_| anyhow::anyhow!("the consumer thread panicked"))??;
    if stop.load(Ordering::SeqCst) {
        tracing::warn!("interrupted");
    }
    let alive = job.workers_alive();
    drop(job);
    let kept = |given: bool, path: &Path| {
        if given {
            path.display().to_string()
        } else {
            "discarded".into()
        }
    };
    let delivery = crate::run_report::check_delivery(&log, &order)?;
    crate::run_report::write_report(
        out,
        &input,
        &cut,
        workers,
        alive,
        &summary,
        &crate::run_report::describe_delivery(&delivery, records_per_epoch),
        &format!(
            "log {}; journal {}",
            kept(args.log.is_some(), &log),
            kept(args.journal.is_some(), &journal)
        ),
    )?;
    if !delivery.exactly_once() {
        bail!("the job's delivery broke its exactly-once rule (above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::local_address;

    #[test]
    fn a_server_on_every_interface_is_dialed_on_loopback() {
        let dial = |s: &str| local_address(s.parse().expect("an address")).to_string();
        assert_eq!(dial("0.0.0.0:7070"), "127.0.0.1:7070");
        assert_eq!(dial("[::]:7070"), "[::1]:7070");
        assert_eq!(dial("10.1.2.3:7070"), "10.1.2.3:7070");
    }
}
