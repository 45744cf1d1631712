//! `lode train -- PROGRAM [ARGS...]`: an unmodified TensorFlow program trained on Lode.
//!
//! The program runs as a child with a `sitecustomize` that loads the training-side package's
//! session hook (python/lode/_hook.py). When the program creates its session, the hook sends
//! the graph here over a Unix socket; this process cuts it, starts the job's dispatcher (in
//! process, journal in the job directory) and the local data workers, and answers with the
//! training graph and the job's address. When the program exits, the job ends with it and
//! `lode train` exits with the program's status.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{bail, Context as _};
use lode_proto::plan::PlanDir;
use serde::{Deserialize, Serialize};

use crate::cli::TrainArgs;
use crate::runtime::{dispatcher_config, generate_token, service_config};

/// The file in the job directory naming the graph its journal belongs to.
const GRAPH_ID_FILE: &str = "graph.json";

/// The largest graph request read from the socket.
const MAX_REQUEST_BYTES: u64 = 64 << 10;

/// What the session hook sends.
#[derive(Debug, Deserialize)]
struct Request {
    /// A binary GraphDef the hook exported.
    graph: PathBuf,
    /// The program's working directory: relative data paths resolve against it.
    cwd: PathBuf,
}

/// How the training process reaches its job (the training side's `JobConfig`).
#[derive(Debug, Clone, Serialize)]
struct JobAddress {
    dispatcher: String,
    token: String,
    job: u64,
    patience_secs: u64,
    /// Steps of one pass of the program's iterator (None: its pipeline repeats forever).
    pass_steps: Option<u64>,
    endless: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_ca: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key: Option<PathBuf>,
}

/// The job's TLS: the servers' identity and the files the other processes load.
#[derive(Debug)]
struct TrainTls {
    server: lode_proto::tls::ServerTls,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn train_tls(args: &TrainArgs) -> anyhow::Result<Option<TrainTls>> {
    let absolute = |p: &PathBuf| {
        p.canonicalize()
            .with_context(|| format!("{}: cannot read", p.display()))
    };
    match (
        &args.tls.tls_cert,
        &args.tls.tls_key,
        &args.tls_client.tls_ca,
    ) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), Some(ca)) => {
            crate::runtime::client_tls(Some(ca))?;
            Ok(Some(TrainTls {
                server: lode_proto::tls::ServerTls::from_pem_files(cert, key)?,
                ca: absolute(ca)?,
                cert: absolute(cert)?,
                key: absolute(key)?,
            }))
        }
        _ => bail!(
            "lode train takes --tls-cert, --tls-key and --tls-ca together (its workers and the \
             training process check the dispatcher's and the receiver's certificate against the \
             CA), or none"
        ),
    }
}

/// The answer to the hook.
#[derive(Debug, Serialize)]
struct Reply {
    ok: bool,
    /// Stop the program (status 2) rather than run it unchanged.
    fatal: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    training: Option<PathBuf>,
    /// Stand-ins of the program's `MakeIterator` nodes: they become DWIteratorInit.
    iterator_inits: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<JobAddress>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

impl Reply {
    fn refused(reason: String, fatal: bool) -> Self {
        Reply {
            ok: false,
            fatal,
            reason: Some(reason),
            training: None,
            iterator_inits: Vec::new(),
            job: None,
            message: None,
        }
    }
}

/// The identity of a graph for the stale-journal check: every node's name, op and inputs
/// (attribute maps are left out: TensorFlow does not serialize them in a fixed order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct GraphId {
    nodes: usize,
    fingerprint: String,
}

fn graph_id(view: &lode_proto::view::GraphView<'_>) -> GraphId {
    let mut nodes: Vec<String> = view
        .nodes
        .iter()
        .map(|n| format!("{}\u{0}{}\u{0}{}", n.name, n.op, n.inputs.join("\u{0}")))
        .collect();
    nodes.sort();
    let joined = nodes.join("\u{1}");
    GraphId {
        nodes: nodes.len(),
        fingerprint: format!(
            "{:016x}",
            lode_dataworker::hash::fingerprint64(joined.as_bytes())
        ),
    }
}

/// A running job: the dispatcher's runtime and the local workers.
#[derive(Debug)]
struct Job {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    dispatcher: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    workers: Vec<Child>,
    _announced: Option<lode_scheduler::local::Published>,
}

impl Job {
    fn end(&mut self) {
        for w in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(d) = self.dispatcher.take() {
            match d.join() {
                Ok(Err(e)) => tracing::warn!(cause = %e, "the dispatcher stopped with an error"),
                Err(_) => tracing::warn!("the dispatcher's thread panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// Settings shared by the socket thread.
#[derive(Debug)]
struct Settings {
    workers: usize,
    threads: usize,
    simple: bool,
    strict: bool,
    lease: Duration,
    dir: PathBuf,
    announce: Option<PathBuf>,
    name: String,
    exe: PathBuf,
    tls: Option<TrainTls>,
}

pub fn run_train(args: TrainArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let scratch = tempfile::Builder::new()
        .prefix("lode-train-")
        .tempdir()
        .context("cannot create a scratch directory")?;
    let dir = match &args.journal {
        Some(d) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("{}: cannot create the job directory", d.display()))?;
            d.canonicalize()
                .with_context(|| format!("{}: not a directory", d.display()))?
        }
        None => scratch.path().join("job"),
    };
    std::fs::create_dir_all(&dir)?;
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(std::num::NonZeroUsize::get)
            .unwrap_or(1)
    });
    if workers == 0 && args.announce.is_none() {
        bail!("--workers 0 needs --announce DIR: otherwise no data worker can find the job");
    }
    let settings = Arc::new(Settings {
        workers,
        threads: args.threads.max(1),
        simple: args.simple,
        strict: args.strict,
        lease: Duration::from_millis(args.lease_ms.max(1)),
        dir,
        announce: args.announce.clone(),
        name: args
            .name
            .clone()
            .unwrap_or_else(|| format!("train-{}", std::process::id())),
        exe: std::env::current_exe().context("cannot find the lode binary")?,
        tls: train_tls(&args)?,
    });
    let boot = scratch.path().join("boot");
    std::fs::create_dir_all(&boot)?;
    std::fs::write(boot.join("sitecustomize.py"), SITECUSTOMIZE)?;
    let socket = scratch.path().join("lode.sock");
    let listener = UnixListener::bind(&socket)
        .with_context(|| format!("{}: cannot listen", socket.display()))?;
    let job: Arc<Mutex<Option<Job>>> = Arc::new(Mutex::new(None));
    {
        let (job, settings) = (job.clone(), settings.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = serve_hook(stream, &settings, &job) {
                    tracing::warn!(cause = %e, "a session hook's request failed");
                }
            }
        });
    }
    let python_path = match std::env::var_os("PYTHONPATH") {
        Some(p) if !p.is_empty() => {
            let mut joined = boot.clone().into_os_string();
            joined.push(":");
            joined.push(p);
            joined
        }
        _ => boot.clone().into_os_string(),
    };
    let (program, rest) = args
        .program
        .split_first()
        .context("no program to run after --")?;
    let mut child = Command::new(program)
        .args(rest)
        .env("PYTHONPATH", python_path)
        .env("LODE_TRAIN_SOCKET", &socket)
        .env("LODE_TRAIN_DIR", scratch.path())
        .env("LODE_TRAIN_STRICT", if args.strict { "1" } else { "0" })
        .spawn()
        .with_context(|| format!("cannot start {program:?}"))?;
    let status = wait_interruptibly(&mut child)?;
    if let Some(mut j) = job.lock().unwrap_or_else(PoisonError::into_inner).take() {
        j.end();
    }
    out.flush()?;
    drop(scratch);
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => Err(ProgramExit(code).into()),
        None => {
            use std::os::unix::process::ExitStatusExt as _;
            Err(ProgramExit(128 + status.signal().unwrap_or(0)).into())
        }
    }
}

/// Waits for the program; SIGINT (which the terminal also sends the program) and SIGTERM do
/// not stop `lode train` before the program: SIGTERM is passed on as a kill.
fn wait_interruptibly(child: &mut Child) -> anyhow::Result<std::process::ExitStatus> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let term = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let term = term.clone();
        rt.spawn(async move {
            let mut sigterm =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => return,
                };
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = sigterm.recv() => term.store(true, std::sync::atomic::Ordering::SeqCst),
                }
            }
        });
    }
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if term.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = child.kill();
        }
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
    }
}

/// The program's own non-zero exit status, passed on by `lode train`.
#[derive(Debug)]
pub struct ProgramExit(pub i32);

impl std::fmt::Display for ProgramExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the program exited with status {}", self.0)
    }
}

impl std::error::Error for ProgramExit {}

fn serve_hook(
    stream: UnixStream,
    settings: &Settings,
    job: &Mutex<Option<Job>>,
) -> anyhow::Result<()> {
    use std::io::Read as _;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST_BYTES)).read_line(&mut line)?;
    let reply = match serde_json::from_str::<Request>(&line) {
        Err(e) => Reply::refused(format!("lode train: a malformed request: {e}"), true),
        Ok(request) => {
            let mut guard = job.lock().unwrap_or_else(PoisonError::into_inner);
            if guard.is_some() {
                Reply::refused(
                    "one job per program: a second graph runs unchanged".into(),
                    false,
                )
            } else {
                match start_job(&request, settings) {
                    Ok((j, reply)) => {
                        *guard = Some(j);
                        reply
                    }
                    Err(Refusal { reason, always }) => {
                        Reply::refused(reason, always || settings.strict)
                    }
                }
            }
        }
    };
    let mut stream = stream;
    stream.write_all(&serde_json::to_vec(&reply)?)?;
    stream.write_all(b"\n")?;
    Ok(())
}

/// Why a graph is not trained on Lode; `always` refusals stop the program even without
/// `--strict` (running it unchanged would hide a mistake, e.g. a stale journal).
#[derive(Debug)]
struct Refusal {
    reason: String,
    always: bool,
}

impl<E: Into<anyhow::Error>> From<E> for Refusal {
    fn from(e: E) -> Self {
        let e: anyhow::Error = e.into();
        Refusal {
            reason: format!("{e:#}; the program runs unchanged on its local pipeline"),
            always: false,
        }
    }
}

fn start_job(request: &Request, settings: &Settings) -> Result<(Job, Reply), Refusal> {
    let bytes = std::fs::read(&request.graph)
        .with_context(|| format!("{}: cannot read the graph", request.graph.display()))?;
    let view = lode_proto::view::GraphView::parse(&bytes)
        .with_context(|| format!("{}: not a valid GraphDef", request.graph.display()))?;
    let id = graph_id(&view);
    let id_file = settings.dir.join(GRAPH_ID_FILE);
    if let Ok(previous) = std::fs::read(&id_file) {
        let previous: Option<GraphId> = serde_json::from_slice(&previous).ok();
        if previous.as_ref() != Some(&id) {
            return Err(Refusal {
                reason: format!(
                    "{}: this job directory holds the journal of another graph ({}; this \
                     program's graph is {} nodes, fingerprint {}): remove it or give \
                     another --journal",
                    settings.dir.display(),
                    previous.map_or_else(
                        || "unreadable".to_owned(),
                        |p| format!("{} nodes, fingerprint {}", p.nodes, p.fingerprint)
                    ),
                    id.nodes,
                    id.fingerprint
                ),
                always: true,
            });
        }
    }
    let options = lode_decoupler::Options {
        simple: settings.simple,
        stateful_ops: Vec::new(),
        // The kernel-aware cut: what the workers cannot run stays in training.
        kernels: Some(
            lode_dataworker::exec::stage::runs_natively as lode_decoupler::kernels::KernelCheck,
        ),
    };
    let cwd = request
        .cwd
        .canonicalize()
        .with_context(|| format!("{}: the program's directory", request.cwd.display()))?;
    let (decoupled, missing) = crate::decouple_graph(&request.graph, &bytes, &options, &cwd)?;
    if missing > 0 {
        let ops: Vec<String> = decoupled
            .plan
            .stages
            .iter()
            .flat_map(|s| s.missing_kernels.keys().cloned())
            .collect();
        return Err(Refusal {
            reason: format!(
                "the data workers have no kernel for {}; the program runs unchanged on its \
                 local pipeline",
                ops.join(", ")
            ),
            always: false,
        });
    }
    let plan_dir = settings.dir.join("plan");
    if plan_dir.exists() {
        std::fs::remove_dir_all(&plan_dir)
            .with_context(|| format!("{}: cannot replace the plan", plan_dir.display()))?;
    }
    lode_decoupler::plan::write_dir(
        &plan_dir,
        &decoupled.graphs,
        &decoupled.plan,
        &decoupled.report,
        &decoupled.dot,
    )?;
    lode_proto::io::write_atomic(&id_file, &serde_json::to_vec(&id)?)?;
    let iterator_inits = view
        .nodes
        .iter()
        .filter(|n| n.op == "MakeIterator" && decoupled.plan.stubs.contains_key(n.name))
        .map(|n| n.name.to_owned())
        .collect();
    let plan = PlanDir::open(&plan_dir)?;
    let mut config = dispatcher_config(
        &plan,
        Some(&cwd),
        lode_dispatcher::RunSettings {
            epochs: None,
            lease_duration: settings.lease,
            max_leases_per_worker: lode_dispatcher::DEFAULT_MAX_LEASES,
        },
    )?;
    // The training side ends each pass of the iterator itself (an iterator may be initialized
    // again): the job's order runs on for as many passes as the program asks for.
    let pass_steps = config.total_steps().filter(|&n| n != u64::MAX);
    // Each initialization creates the program's pipeline anew (its seed generators too), so
    // every pass has the first pass's order.
    config.restart_every = config.epochs;
    config.epochs = None;
    let token = generate_token();
    let mut service = service_config(&plan, 1, &token, config, &settings.dir.join("journal"))?;
    service.tls = settings.tls.as_ref().map(|t| t.server.clone());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot listen")?;
    listener.set_nonblocking(true)?;
    let url = lode_proto::tls::url(listener.local_addr()?, settings.tls.is_some());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let dispatcher = std::thread::spawn(move || -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            lode_dispatcher::serve(listener, service, async {
                let _ = stopped.await;
            })
            .await?;
            anyhow::Ok(())
        })
    });
    let log = settings.dir.join("workers.log");
    let mut workers = Vec::new();
    // Each worker takes the least staffed stage: with fewer workers than stages, a stage would
    // have none and the job could not make a step.
    let count = match settings.workers {
        0 => 0,
        n => n.max(decoupled.plan.stages.len()),
    };
    for i in 0..count {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("{}: cannot open", log.display()))?;
        let mut command = Command::new(&settings.exe);
        command.arg("worker");
        if let Some(tls) = &settings.tls {
            command.arg("--tls-ca").arg(&tls.ca);
        }
        let child = command
            .arg("--dispatcher")
            .arg(&url)
            .arg("--threads")
            .arg(settings.threads.to_string())
            .arg("--name")
            .arg(format!("{}-{i}", settings.name))
            .arg("--data-root")
            .arg(&cwd)
            .env("LODE_TOKEN", &token)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("cannot start {}", settings.exe.display()))?;
        workers.push(child);
    }
    let announced = match &settings.announce {
        Some(dir) => Some(
            lode_scheduler::local::Announcement {
                name: settings.name.clone(),
                dispatcher: url.clone(),
                job: 1,
                token: token.clone(),
            }
            .publish(dir)?,
        ),
        None => None,
    };
    let message = format!(
        "training on Lode: {} stage(s), {} local data worker(s), job directory {}",
        decoupled.plan.stages.len(),
        count,
        settings.dir.display()
    );
    let job = Job {
        stop: Some(stop),
        dispatcher: Some(dispatcher),
        workers,
        _announced: announced,
    };
    Ok((
        job,
        Reply {
            ok: true,
            fatal: false,
            reason: None,
            training: Some(plan_dir.join("training.pb")),
            iterator_inits,
            job: Some(JobAddress {
                dispatcher: url,
                token,
                job: 1,
                patience_secs: 30,
                pass_steps,
                endless: pass_steps.is_none(),
                tls_ca: settings.tls.as_ref().map(|t| t.ca.clone()),
                tls_cert: settings.tls.as_ref().map(|t| t.cert.clone()),
                tls_key: settings.tls.as_ref().map(|t| t.key.clone()),
            }),
            message: Some(message),
        },
    ))
}

/// Loads the training-side package's hook into the program (written to a directory that
/// `lode train` puts first on PYTHONPATH).
const SITECUSTOMIZE: &str = r#"# Written by `lode train`: loads Lode's session hook into this program.
import os as _os
import sys as _sys
try:
    import lode._hook as _lode_hook
except Exception as _e:  # the package is missing or broken: never run silently without Lode
    _sys.stderr.write(
        "lode train: cannot load the training-side package `lode` in %s: %s\n"
        "  install it into this Python: pip install ./python (from Lode's repository)\n"
        % (_sys.executable, _e)
    )
    _sys.stderr.flush()
    _os._exit(2)
_lode_hook.install()
"#;
