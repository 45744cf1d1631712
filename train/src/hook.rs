//! The training side's session hook, Lode's half (`lode train -- PROGRAM`).
//!
//! The program runs as a child with a `sitecustomize` that loads the training-side package's
//! session hook (python/lode/_hook.py). When the program creates its session, the hook sends
//! its graph over a Unix socket ([`GraphRequest`], one JSON line); the caller's `start`
//! decides: it starts a job and answers with the training graph and the job's address
//! ([`Accepted`]), or refuses ([`Refusal`]), and the program then runs unchanged (or stops,
//! for a refusal that must not pass silently). When the program exits, [`run_program`]
//! returns its status and the jobs.
//!
//! # Jobs of one program
//! A TF2 program may iterate several datasets (Keras `fit` with `validation_data`, then
//! `evaluate` on another): each request of kind [`RequestKind::Dataset`] that `start`
//! accepts is a job of its own, numbered in the order of the requests ([`JobIndex`] 1, 2, …;
//! a refused request takes no number), at most [`MAX_JOBS`]. A TF1 session's graph is one job
//! per program: after a [`RequestKind::Session`] job every graph runs unchanged, and a
//! session's graph after a dataset's job runs unchanged too (one kind of job per program: the
//! session hook serves one session graph, and a TF1 program's datasets are in that graph).
//! The policy is [`admit`].
//!
//! A job directory remembers which graph its journal belongs to ([`GraphId`]), so a journal is
//! never resumed by another program's graph; a restarted program meets its graphs in the same
//! order, so each job's directory meets its own graph again.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lode_proto::view::GraphView;
use serde::{Deserialize, Serialize};

/// The file in a job directory naming the graph its journal belongs to.
pub const GRAPH_ID_FILE: &str = "graph.json";

/// The largest graph request read from the socket.
pub const MAX_REQUEST_BYTES: u64 = 64 << 10;

/// How often the program's exit is polled.
const POLL: Duration = Duration::from_millis(50);

/// The most jobs one program starts (each costs a dispatcher, its workers and a receiver in
/// the program): a program that makes datasets in a loop runs the later ones unchanged.
pub const MAX_JOBS: u64 = 16;

/// Which of a program's jobs: 1 for the first graph Lode serves, 2 for the next, and so on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct JobIndex(pub u64);

impl JobIndex {
    pub const FIRST: JobIndex = JobIndex(1);

    pub fn is_first(self) -> bool {
        self == JobIndex::FIRST
    }
}

impl std::fmt::Display for JobIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {}", self.0)
    }
}

/// Whether a request of `kind` may start a job, given the kind of the program's first job
/// (None: no job yet) and how many it has: the new job's index, or why the graph runs
/// unchanged (see the module documentation).
pub fn admit(
    first: Option<RequestKind>,
    started: u64,
    kind: RequestKind,
) -> Result<JobIndex, String> {
    match (first, kind) {
        (None, _) => Ok(JobIndex::FIRST),
        (Some(RequestKind::Session), _) => Err(
            "one job per program for a TF1 session's graph: a second graph runs unchanged".into(),
        ),
        (Some(RequestKind::Dataset), RequestKind::Session) => Err(
            "a TF1 session's graph after a TF2 dataset's job is not served (one kind of job per \
             program): it runs unchanged"
                .into(),
        ),
        (Some(RequestKind::Dataset), RequestKind::Dataset) if started >= MAX_JOBS => Err(format!(
            "a dataset beyond the program's {MAX_JOBS} jobs is not served: it runs unchanged"
        )),
        (Some(RequestKind::Dataset), RequestKind::Dataset) => Ok(JobIndex(started + 1)),
    }
}

/// The jobs a program's requests started, in order, and the kind of the first.
struct Jobs<J> {
    first: Option<RequestKind>,
    started: Vec<J>,
}

/// Why a program could not be run with the hook.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("no program to run after --")]
    NoProgram,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {program:?}: {source}")]
    Start {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("waiting for the program: {0}")]
    Wait(#[source] std::io::Error),
}

/// What the session hook sends.
#[derive(Debug, Clone, Deserialize)]
pub struct GraphRequest {
    /// A binary GraphDef the hook exported.
    pub graph: PathBuf,
    /// The program's working directory: relative data paths resolve against it.
    pub cwd: PathBuf,
    /// Where the graph comes from (absent: a TF1 session's graph).
    #[serde(default)]
    pub kind: RequestKind,
}

/// The two ways a program meets its pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    /// A TF1 session's graph: each run of the iterator's initializer re-creates the pipeline
    /// (its seed generators too), so every pass has the first pass's order.
    #[default]
    Session,
    /// A TF2 `tf.data.Dataset` iterated by the program (python/lode/_tf2.py): the dataset's
    /// own graph, wrapped in an iterator. Each new iterator of the same dataset draws the next
    /// seeds from the dataset's seed generators, so pass `k` has epoch `k`'s order.
    Dataset,
}

/// How the training process reaches its job (the training side's `JobConfig`).
#[derive(Debug, Clone, Serialize)]
pub struct JobAddress {
    pub dispatcher: String,
    pub token: String,
    pub job: u64,
    pub patience_secs: u64,
    /// Steps of one pass of the program's iterator (None: its pipeline repeats forever).
    pub pass_steps: Option<u64>,
    pub endless: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// Where the training process's receiver listens (default: a free loopback port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `HOST[:PORT]` workers on other machines dial for the receiver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
}

/// A graph trained on Lode: what the hook swaps in.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// The training graph (DWRecv in place of the pipeline).
    pub training: PathBuf,
    /// Stand-ins of the program's `MakeIterator` nodes: they become DWIteratorInit.
    pub iterator_inits: Vec<String>,
    pub job: JobAddress,
    /// Said once on the program's stderr.
    pub message: String,
}

/// Why a graph is not trained on Lode; `always` refusals stop the program even without
/// `--strict` (running it unchanged would hide a mistake, e.g. a stale journal).
#[derive(Debug)]
pub struct Refusal {
    pub reason: String,
    pub always: bool,
}

impl<E: std::fmt::Display> From<E> for Refusal {
    fn from(e: E) -> Self {
        Refusal {
            reason: format!("{e}; the program runs unchanged on its local pipeline"),
            always: false,
        }
    }
}

/// The answer to the hook, one JSON line.
#[derive(Debug, Serialize)]
struct Reply {
    ok: bool,
    /// Stop the program (status 2) rather than run it unchanged.
    fatal: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    training: Option<PathBuf>,
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

    fn accepted(a: Accepted) -> Self {
        Reply {
            ok: true,
            fatal: false,
            reason: None,
            training: Some(a.training),
            iterator_inits: a.iterator_inits,
            job: Some(a.job),
            message: Some(a.message),
        }
    }
}

/// The identity of a graph for the stale-journal check: every node's name, op and inputs
/// (attribute maps are left out: TensorFlow does not serialize them in a fixed order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphId {
    pub nodes: usize,
    pub fingerprint: String,
}

impl GraphId {
    pub fn of(view: &GraphView<'_>) -> GraphId {
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
                lode_runtime::hash::fingerprint64(joined.as_bytes())
            ),
        }
    }

    /// Refuses (always) when job directory `dir` holds the journal of another graph.
    pub fn check(&self, dir: &Path) -> Result<(), Refusal> {
        let Ok(previous) = std::fs::read(dir.join(GRAPH_ID_FILE)) else {
            return Ok(());
        };
        let previous: Option<GraphId> = serde_json::from_slice(&previous).ok();
        if previous.as_ref() == Some(self) {
            return Ok(());
        }
        Err(Refusal {
            reason: format!(
                "{}: this job directory holds the journal of another graph ({}; this \
                 program's graph is {} nodes, fingerprint {}): remove it or give another \
                 --journal",
                dir.display(),
                previous.map_or_else(
                    || "unreadable".to_owned(),
                    |p| format!("{} nodes, fingerprint {}", p.nodes, p.fingerprint)
                ),
                self.nodes,
                self.fingerprint
            ),
            always: true,
        })
    }

    /// Records in job directory `dir` that its journal belongs to this graph.
    pub fn record(&self, dir: &Path) -> Result<(), lode_proto::Error> {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        lode_proto::io::write_atomic(&dir.join(GRAPH_ID_FILE), &bytes)
    }
}

/// How a program is run under the hook.
#[derive(Debug, Clone)]
pub struct ProgramConfig {
    /// The program and its arguments.
    pub program: Vec<String>,
    /// A private directory for the socket, the `sitecustomize` and the hook's exports.
    pub scratch: PathBuf,
    /// Every refusal stops the program.
    pub strict: bool,
}

/// Runs the program with the hook; `start` answers each graph [`admit`] lets start a job,
/// given the job's index (the others run unchanged). SIGINT reaches the program from the
/// terminal; SIGTERM is passed on as a kill. Returns the program's status and what `start`
/// returned for each job it started, in order.
pub fn run_program<J, F>(
    config: &ProgramConfig,
    start: F,
) -> Result<(ExitStatus, Vec<J>), HookError>
where
    J: Send + 'static,
    F: Fn(&GraphRequest, JobIndex) -> Result<(J, Accepted), Refusal> + Send + 'static,
{
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| HookError::Io { path, source }
    };
    let boot = config.scratch.join("boot");
    std::fs::create_dir_all(&boot).map_err(io(&boot))?;
    let site = boot.join("sitecustomize.py");
    std::fs::write(&site, SITECUSTOMIZE).map_err(io(&site))?;
    let socket = config.scratch.join("lode.sock");
    let listener = UnixListener::bind(&socket).map_err(io(&socket))?;
    let jobs: Arc<Mutex<Jobs<J>>> = Arc::new(Mutex::new(Jobs {
        first: None,
        started: Vec::new(),
    }));
    {
        let (jobs, strict) = (jobs.clone(), config.strict);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = answer(stream, strict, &jobs, &start) {
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
    let (program, rest) = config.program.split_first().ok_or(HookError::NoProgram)?;
    let mut child = Command::new(program)
        .args(rest)
        .env("PYTHONPATH", python_path)
        .env("LODE_TRAIN_SOCKET", &socket)
        .env("LODE_TRAIN_DIR", &config.scratch)
        .env("LODE_TRAIN_STRICT", if config.strict { "1" } else { "0" })
        .spawn()
        .map_err(|source| HookError::Start {
            program: program.clone(),
            source,
        })?;
    let status = wait_interruptibly(&mut child).map_err(HookError::Wait)?;
    let mut jobs = jobs.lock().unwrap_or_else(PoisonError::into_inner);
    Ok((status, std::mem::take(&mut jobs.started)))
}

/// Answers one hook connection (requests are answered one at a time: the jobs' lock is held
/// while `start` runs, so that indices follow the order of the requests).
fn answer<J, F>(
    stream: UnixStream,
    strict: bool,
    jobs: &Mutex<Jobs<J>>,
    start: &F,
) -> std::io::Result<()>
where
    F: Fn(&GraphRequest, JobIndex) -> Result<(J, Accepted), Refusal>,
{
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST_BYTES)).read_line(&mut line)?;
    let reply = match serde_json::from_str::<GraphRequest>(&line) {
        Err(e) => Reply::refused(format!("lode train: a malformed request: {e}"), true),
        Ok(request) => {
            let mut jobs = jobs.lock().unwrap_or_else(PoisonError::into_inner);
            let started = u64::try_from(jobs.started.len()).unwrap_or(u64::MAX);
            match admit(jobs.first, started, request.kind) {
                Err(reason) => Reply::refused(reason, strict),
                Ok(index) => match start(&request, index) {
                    Ok((j, accepted)) => {
                        jobs.first.get_or_insert(request.kind);
                        jobs.started.push(j);
                        Reply::accepted(accepted)
                    }
                    Err(Refusal { reason, always }) => Reply::refused(reason, always || strict),
                },
            }
        }
    };
    let mut stream = stream;
    let mut bytes = serde_json::to_vec(&reply).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    stream.write_all(&bytes)
}

/// Waits for the program; SIGINT (which the terminal also sends the program) and SIGTERM do
/// not stop the caller before the program: SIGTERM is passed on as a kill.
fn wait_interruptibly(child: &mut Child) -> std::io::Result<ExitStatus> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let term = Arc::new(AtomicBool::new(false));
    {
        let term = term.clone();
        rt.spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut sigterm) = signal(SignalKind::terminate()) else {
                return;
            };
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = sigterm.recv() => term.store(true, Ordering::SeqCst),
                }
            }
        });
    }
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if term.load(Ordering::SeqCst) {
            let _ = child.kill();
        }
        // The signal task runs only inside block_on (a current-thread runtime).
        rt.block_on(async { tokio::time::sleep(POLL).await });
    }
}

/// Loads the training-side package's hook into the program (written to a directory put first
/// on its PYTHONPATH).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(nodes: &[(&str, &str)]) -> Vec<u8> {
        use protobuf::Message as _;
        let mut g = lode_proto::tf::graph::GraphDef::new();
        for (name, op) in nodes {
            let mut n = lode_proto::tf::node_def::NodeDef::new();
            n.name = (*name).into();
            n.op = (*op).into();
            g.node.push(n);
        }
        g.write_to_bytes().expect("encode")
    }

    #[test]
    fn a_job_directory_refuses_another_graphs_journal_always() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = graph(&[("x", "Const"), ("y", "Identity")]);
        let b = graph(&[("x", "Const")]);
        let id_a = GraphId::of(&GraphView::parse(&a).expect("view"));
        let id_b = GraphId::of(&GraphView::parse(&b).expect("view"));
        assert_ne!(id_a, id_b);
        id_a.check(dir.path())
            .expect("a fresh directory takes any graph");
        id_a.record(dir.path()).expect("record");
        id_a.check(dir.path()).expect("the same graph resumes");
        let refusal = id_b.check(dir.path()).expect_err("another graph");
        assert!(refusal.always);
        assert!(refusal.reason.contains("2 nodes"), "{}", refusal.reason);
    }

    fn no_jobs() -> Mutex<Jobs<JobIndex>> {
        Mutex::new(Jobs {
            first: None,
            started: Vec::new(),
        })
    }

    /// A `start` that accepts every graph (its job is its index) but one named `refused.pb`.
    fn accept(request: &GraphRequest, index: JobIndex) -> Result<(JobIndex, Accepted), Refusal> {
        if request.graph.ends_with("refused.pb") {
            return Err(Refusal {
                reason: "refused".into(),
                always: false,
            });
        }
        let job = JobAddress {
            dispatcher: "http://127.0.0.1:1".into(),
            token: "t".into(),
            job: index.0,
            patience_secs: 1,
            pass_steps: Some(4),
            endless: false,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            listen: None,
            advertise: None,
        };
        let accepted = Accepted {
            training: format!("training-{}.pb", index.0).into(),
            iterator_inits: Vec::new(),
            job,
            message: format!("training on Lode: {index}"),
        };
        Ok((index, accepted))
    }

    /// Sends one request line through `answer` and returns the reply.
    fn ask<F>(
        jobs: &Mutex<Jobs<JobIndex>>,
        strict: bool,
        line: &str,
        start: &F,
    ) -> serde_json::Value
    where
        F: Fn(&GraphRequest, JobIndex) -> Result<(JobIndex, Accepted), Refusal>,
    {
        let (a, mut b) = UnixStream::pair().expect("pair");
        b.write_all(format!("{line}\n").as_bytes()).expect("write");
        answer(a, strict, jobs, start).expect("answers");
        let mut reply = String::new();
        BufReader::new(&b).read_line(&mut reply).expect("read");
        serde_json::from_str(&reply).expect("json")
    }

    const SESSION: &str = r#"{"graph": "g.pb", "cwd": "."}"#;
    const DATASET: &str = r#"{"graph": "d.pb", "cwd": ".", "kind": "dataset"}"#;

    #[test]
    fn a_malformed_request_is_a_fatal_refusal_and_a_second_session_graph_runs_unchanged() {
        let jobs = no_jobs();
        let reply = ask(&jobs, false, "not json", &accept);
        assert_eq!(
            (reply["ok"].as_bool(), reply["fatal"].as_bool()),
            (Some(false), Some(true))
        );
        let first = ask(&jobs, false, SESSION, &accept);
        assert_eq!(first["job"]["job"].as_u64(), Some(1), "{first}");
        for line in [SESSION, DATASET] {
            let reply = ask(&jobs, false, line, &accept);
            assert_eq!(reply["ok"].as_bool(), Some(false), "{reply}");
            assert_eq!(reply["fatal"].as_bool(), Some(false), "{reply}");
            assert!(
                reply["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("one job per program"),
                "{reply}"
            );
        }
        // Under --strict the program stops rather than run a second graph unchanged.
        let strict = ask(&jobs, true, SESSION, &accept);
        assert_eq!(strict["fatal"].as_bool(), Some(true), "{strict}");
        assert_eq!(jobs.lock().expect("lock").started, vec![JobIndex(1)]);
    }

    #[test]
    fn each_dataset_of_a_program_is_a_job_of_its_own_in_the_order_of_the_requests() {
        let jobs = no_jobs();
        let refused = r#"{"graph": "refused.pb", "cwd": ".", "kind": "dataset"}"#;
        let mut indices = Vec::new();
        for line in [DATASET, refused, DATASET, DATASET] {
            let reply = ask(&jobs, false, line, &accept);
            indices.push(reply["job"]["job"].as_u64());
        }
        // A refused dataset takes no number: the next accepted one is the next job.
        assert_eq!(indices, vec![Some(1), None, Some(2), Some(3)]);
        let second = ask(&jobs, false, DATASET, &accept);
        assert_eq!(
            second["training"].as_str(),
            Some("training-4.pb"),
            "{second}"
        );
        // A TF1 session's graph after them runs unchanged: one kind of job per program.
        let session = ask(&jobs, false, SESSION, &accept);
        assert_eq!(session["ok"].as_bool(), Some(false), "{session}");
        assert!(
            session["reason"]
                .as_str()
                .unwrap_or("")
                .contains("TF1 session"),
            "{session}"
        );
        let started = jobs.lock().expect("lock").started.clone();
        assert_eq!(started, (1..=4).map(JobIndex).collect::<Vec<_>>());
    }

    #[test]
    fn a_program_starts_at_most_max_jobs() {
        assert_eq!(admit(None, 0, RequestKind::Dataset), Ok(JobIndex(1)));
        assert_eq!(admit(None, 0, RequestKind::Session), Ok(JobIndex(1)));
        let last = admit(
            Some(RequestKind::Dataset),
            MAX_JOBS - 1,
            RequestKind::Dataset,
        );
        assert_eq!(last, Ok(JobIndex(MAX_JOBS)));
        let beyond = admit(Some(RequestKind::Dataset), MAX_JOBS, RequestKind::Dataset);
        assert!(beyond.is_err_and(|why| why.contains("16 jobs")));
        assert!(admit(Some(RequestKind::Session), 1, RequestKind::Dataset).is_err());
    }

    #[test]
    fn a_request_names_its_kind_and_a_session_request_needs_none() {
        let session: GraphRequest =
            serde_json::from_str(r#"{"graph": "g.pb", "cwd": "."}"#).expect("session");
        assert_eq!(session.kind, RequestKind::Session);
        let dataset: GraphRequest =
            serde_json::from_str(r#"{"graph": "g.pb", "cwd": ".", "kind": "dataset"}"#)
                .expect("dataset");
        assert_eq!(dataset.kind, RequestKind::Dataset);
        let bad =
            serde_json::from_str::<GraphRequest>(r#"{"graph": "g", "cwd": ".", "kind": "x"}"#);
        assert!(bad.is_err(), "an unknown kind is a malformed request");
    }
}
