//! `lode train -- PROGRAM [ARGS...]`: an unmodified TensorFlow program trained on Lode.
//!
//! The program runs under the training side's session hook (`lode_train::hook`). Its graph is
//! cut here, the job's dispatcher started in this process (journal in the job directory) with
//! the local data workers, and the hook answered with the training graph and the job's
//! address. When the program exits, its jobs end with it and `lode train` exits with the
//! program's status.
//!
//! # Several jobs
//! Each dataset a TF2 program iterates is a job of its own (`hook::admit`): job 1 keeps the
//! job directory's own layout (`plan/`, `journal/`, `graph.json`, `workers.log`), so that job
//! directories and restarts from before stay valid; job k > 1 has the same in `job-K/`
//! ([`job_dir`]). Each job has its own dispatcher (`JobId(k)`, so that a worker of one job is
//! refused by another's dispatcher) and its own `--workers N` local workers: a validation or
//! test pipeline runs while the training one waits for it (Keras validates after the epoch's
//! last step), so it needs the same rate not to stall the program; each job's workers compute
//! ahead only as far as its receiver's window, then wait. A fixed `--listen` port is job 1's;
//! a later job listens on the same host at a free port ([`job_listen`]), its workers being
//! local or finding it by its announcement (`--announce`: `NAME-jobK.json`). With
//! `--workers 0` and no `--announce`, the workers elsewhere dial the one address they were
//! given: a second pipeline then runs unchanged on the program's side (status 2 under
//! `--strict`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use lode_dispatcher::{JobId, RunSettings, ServiceConfig, DEFAULT_MAX_LEASES};
use lode_proto::plan::PlanDir;
use lode_scheduler::local::WorkerCommand;
use lode_train::hook::RequestKind;
use lode_train::hook::{self, Accepted, GraphId, GraphRequest, JobAddress, JobIndex, Refusal};

use crate::cli::TrainArgs;
use crate::runtime::{client_tls, dispatcher_config, LocalJob};

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
    let (cert, key, ca) = (
        &args.tls.tls_cert,
        &args.tls.tls_key,
        &args.tls_client.tls_ca,
    );
    match (cert, key, ca) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), Some(ca)) => {
            client_tls(Some(ca))?;
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

/// The program's own non-zero exit status, passed on by `lode train`.
#[derive(Debug)]
pub struct ProgramExit(pub i32);

impl std::fmt::Display for ProgramExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the program exited with status {}", self.0)
    }
}

impl std::error::Error for ProgramExit {}

/// What starting a job needs, shared with the hook's thread.
#[derive(Debug)]
struct Settings {
    workers: usize,
    threads: u32,
    simple: bool,
    lease: Duration,
    journal_compact: u64,
    dir: PathBuf,
    announce: Option<PathBuf>,
    name: String,
    exe: PathBuf,
    tls: Option<TrainTls>,
    token: String,
    listen: String,
    advertise: Option<String>,
}

/// The environment variable a pod's job token comes from (a Secret's `secretKeyRef`).
const TOKEN_VAR: &str = "LODE_TOKEN";

/// The job's token: LODE_TOKEN when set (never shown, even in an error), else a random one.
fn job_token() -> anyhow::Result<String> {
    match std::env::var(TOKEN_VAR) {
        Ok(v) if v.trim().is_empty() => bail!("{TOKEN_VAR} is set but empty"),
        Ok(v) => {
            let token = v.trim();
            if !token.chars().all(|c| c.is_ascii_graphic()) {
                bail!(
                    "{TOKEN_VAR} holds characters other than visible ASCII (it travels in a \
                     request header); its value is not shown"
                );
            }
            Ok(token.to_owned())
        }
        Err(std::env::VarError::NotPresent) => Ok(lode_proto::process::generate_token()),
        Err(std::env::VarError::NotUnicode(_)) => bail!("{TOKEN_VAR} is not valid UTF-8"),
    }
}

/// Whether `listen` (`HOST:PORT`) binds only this machine's loopback interface.
fn is_loopback(listen: &str) -> bool {
    let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
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
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if workers == 0 && args.announce.is_none() && is_loopback(&args.listen) {
        bail!(
            "--workers 0 needs --announce DIR or a --listen address other machines reach              (e.g. 0.0.0.0:7070): otherwise no data worker can find the job"
        );
    }
    let settings = Settings {
        workers,
        threads: u32::try_from(args.threads.max(1)).context("--threads")?,
        simple: args.simple,
        lease: Duration::from_millis(args.lease_ms.max(1)),
        journal_compact: args.journal_compact,
        dir,
        announce: args.announce.clone(),
        name: (args.name.clone()).unwrap_or_else(|| format!("train-{}", std::process::id())),
        exe: std::env::current_exe().context("cannot find the lode binary")?,
        tls: train_tls(&args)?,
        token: job_token()?,
        listen: args.listen.clone(),
        advertise: args.advertise.clone(),
    };
    let program = hook::ProgramConfig {
        program: args.program.clone(),
        scratch: scratch.path().to_owned(),
        strict: args.strict,
    };
    let (status, jobs) =
        hook::run_program(&program, move |request, k| start_job(request, k, &settings))?;
    let served = !jobs.is_empty();
    // The jobs end with the program: workers killed, the dispatchers stopped.
    drop(jobs);
    out.flush()?;
    drop(scratch);
    if args.strict && !served && status.success() {
        // Nothing said no, yet nothing was trained on Lode: the program never created a
        // session on a graph with a pipeline nor iterated a tf.data dataset. (Without
        // --strict the hook says so at the program's exit.)
        bail!(
            "--strict: the program ended without Lode serving an input pipeline (it created no \
             session on a graph with a tf.data pipeline and iterated no tf.data dataset)"
        );
    }
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => Err(ProgramExit(code).into()),
        None => {
            use std::os::unix::process::ExitStatusExt as _;
            Err(ProgramExit(128 + status.signal().unwrap_or(0)).into())
        }
    }
}

/// The directory of the program's job `k` in job directory `dir` (see the module
/// documentation).
pub fn job_dir(dir: &Path, k: JobIndex) -> PathBuf {
    if k.is_first() {
        dir.to_owned()
    } else {
        dir.join(format!("job-{}", k.0))
    }
}

/// Where job `k`'s dispatcher listens: `--listen` for the first, the same host at a free port
/// for later ones (a fixed port serves one job).
pub fn job_listen(listen: &str, k: JobIndex) -> String {
    match listen.rsplit_once(':') {
        Some((host, _)) if !k.is_first() => format!("{host}:0"),
        _ => listen.to_owned(),
    }
}

/// Cuts the program's graph and starts its job `k`, or says why it runs unchanged.
fn start_job(
    request: &GraphRequest,
    k: JobIndex,
    settings: &Settings,
) -> Result<(LocalJob, Accepted), Refusal> {
    if !k.is_first() && settings.workers == 0 && settings.announce.is_none() {
        return Err(Refusal {
            reason: format!(
                "a second input pipeline ({k}) is not served with --workers 0 and no --announce: \
                 the data workers elsewhere dial the first job's address; it runs unchanged on \
                 the program's side"
            ),
            always: false,
        });
    }
    let dir = job_dir(&settings.dir, k);
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("{}: cannot create the job's directory: {e}", dir.display()))?;
    let path = &request.graph;
    let bytes = std::fs::read(path)
        .map_err(|e| format!("{}: cannot read the graph: {e}", path.display()))?;
    let view = lode_proto::view::GraphView::parse(&bytes)
        .map_err(|e| format!("{}: not a valid GraphDef: {e}", path.display()))?;
    let id = GraphId::of(&view);
    id.check(&dir)?;
    let options = lode_decoupler::Options {
        simple: settings.simple,
        stateful_ops: Vec::new(),
        // The kernel-aware cut: what the workers cannot run stays in training.
        kernels: Some(crate::KERNELS),
    };
    let cwd = (request.cwd.canonicalize())
        .map_err(|e| format!("{}: the program's directory: {e}", request.cwd.display()))?;
    let (decoupled, missing) =
        lode_decoupler::decouple_file(path, &bytes, &options, &cwd, crate::MISSING)?;
    if missing > 0 {
        let stages = decoupled.plan.stages.iter();
        let ops: Vec<&str> = stages
            .flat_map(|s| s.missing_kernels.keys())
            .map(String::as_str)
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
    let plan_dir = dir.join("plan");
    if plan_dir.exists() {
        std::fs::remove_dir_all(&plan_dir)
            .map_err(|e| format!("{}: cannot replace the plan: {e}", plan_dir.display()))?;
    }
    let d = &decoupled;
    lode_decoupler::plan::write_dir(&plan_dir, &d.graphs, &d.plan, &d.report, &d.dot)?;
    id.record(&dir)?;
    let iterator_inits = view
        .nodes
        .iter()
        .filter(|n| n.op == "MakeIterator" && decoupled.plan.stubs.contains_key(n.name))
        .map(|n| n.name.to_owned())
        .collect();
    let plan = PlanDir::open(&plan_dir)?;
    let run = RunSettings {
        epochs: None,
        lease_duration: settings.lease,
        max_leases_per_worker: DEFAULT_MAX_LEASES,
    };
    let mut config = dispatcher_config(&plan, Some(&cwd), run).map_err(|e| format!("{e:#}"))?;
    // The training side ends each pass of the iterator itself (an iterator may be initialized
    // again): the job's order runs on for as many passes as the program asks for.
    let pass_steps = config.total_steps().filter(|&n| n != u64::MAX);
    // A TF1 initialization creates the program's pipeline anew (its seed generators too), so
    // every pass has the first pass's order. A TF2 dataset keeps its seed generators across
    // its iterators: pass k is epoch k, the order running on.
    config.restart_every = match request.kind {
        RequestKind::Session => config.epochs,
        RequestKind::Dataset => None,
    };
    config.epochs = None;
    let journal = dir.join("journal");
    let (mut service, _) =
        ServiceConfig::for_plan(&plan, JobId(k.0), &settings.token, config, &journal)?;
    service.tls = settings.tls.as_ref().map(|t| t.server.clone());
    service.journal_compact_bytes = settings.journal_compact;
    let advertise = settings.advertise.as_deref();
    let announce = settings.announce.as_deref();
    let name = if k.is_first() {
        settings.name.clone()
    } else {
        format!("{}-job{}", settings.name, k.0)
    };
    let listen = job_listen(&settings.listen, k);
    let mut job =
        LocalJob::start_on(service, &listen, advertise, announce, &name).map_err(|e| Refusal {
            reason: format!("{e:#}"),
            always: true,
        })?;
    // Each worker takes the least staffed stage: with fewer workers than stages, a stage would
    // have none and the job could not make a step.
    let count = match settings.workers {
        0 => 0,
        n => n.max(decoupled.plan.stages.len()),
    };
    let log = dir.join("workers.log");
    let (url, token) = (job.url.clone(), job.token.clone());
    for i in 0..count {
        let name = format!("{name}-{i}");
        let command = WorkerCommand {
            threads: settings.threads,
            tls_ca: settings.tls.as_ref().map(|t| t.ca.as_path()),
            data_root: Some(&cwd),
            log: Some(&log),
            ..WorkerCommand::new(&settings.exe, &url, &token, k.0, &name)
        };
        job.spawn_worker(&command).map_err(|e| format!("{e:#}"))?;
    }
    let tls_file = |f: fn(&TrainTls) -> &Path| settings.tls.as_ref().map(|t| f(t).to_owned());
    let address = JobAddress {
        dispatcher: url,
        token,
        job: k.0,
        patience_secs: 30,
        pass_steps,
        endless: pass_steps.is_none(),
        tls_ca: tls_file(|t| &t.ca),
        tls_cert: tls_file(|t| &t.cert),
        tls_key: tls_file(|t| &t.key),
        // Workers elsewhere dial the receiver at the advertised host; it listens on every
        // interface for them.
        listen: advertise.map(|_| "0.0.0.0:0".to_owned()),
        advertise: advertise.map(str::to_owned),
    };
    let which = if k.is_first() {
        String::new()
    } else {
        format!("{k} of the program, ")
    };
    let message = format!(
        "training on Lode: {which}{} stage(s), {count} local data worker(s), job directory {}",
        decoupled.plan.stages.len(),
        dir.display()
    );
    let accepted = Accepted {
        training: plan_dir.join("training.pb"),
        iterator_inits,
        job: address,
        message,
    };
    Ok((job, accepted))
}

#[cfg(test)]
mod tests {
    use super::{is_loopback, job_dir, job_listen, start_job, JobIndex, RequestKind, Settings};
    use lode_train::hook::GraphRequest;
    use std::path::Path;
    use std::time::Duration;

    fn remote_workers(dir: &Path, announce: Option<&Path>) -> Settings {
        Settings {
            workers: 0,
            threads: 1,
            simple: false,
            lease: Duration::from_secs(1),
            journal_compact: 0,
            dir: dir.to_owned(),
            announce: announce.map(Path::to_owned),
            name: "wide".into(),
            exe: "lode".into(),
            tls: None,
            token: "t".into(),
            listen: "0.0.0.0:7070".into(),
            advertise: None,
        }
    }

    #[test]
    fn a_second_pipeline_for_workers_that_dial_one_address_runs_unchanged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let request = GraphRequest {
            graph: dir.path().join("missing.pb"),
            cwd: dir.path().to_owned(),
            kind: RequestKind::Dataset,
        };
        let settings = remote_workers(dir.path(), None);
        let refusal = start_job(&request, JobIndex(2), &settings).expect_err("refused");
        assert!(!refusal.always, "{}", refusal.reason);
        assert!(
            refusal.reason.contains("second input pipeline"),
            "{}",
            refusal.reason
        );
        assert!(!dir.path().join("job-2").exists(), "nothing is made for it");
        // With an announcement, job 2 is announced on its own: it gets as far as its graph.
        let settings = remote_workers(dir.path(), Some(&dir.path().join("jobs")));
        let refusal = start_job(&request, JobIndex(2), &settings).expect_err("no graph");
        assert!(
            refusal.reason.contains("cannot read the graph"),
            "{}",
            refusal.reason
        );
        assert!(dir.path().join("job-2").is_dir());
        // The first job is not affected by the rule.
        let settings = remote_workers(dir.path(), None);
        let refusal = start_job(&request, JobIndex(1), &settings).expect_err("no graph");
        assert!(
            refusal.reason.contains("cannot read the graph"),
            "{}",
            refusal.reason
        );
    }

    #[test]
    fn the_first_job_keeps_the_job_directory_and_later_ones_have_their_own() {
        let dir = Path::new("/jobs/wide");
        assert_eq!(job_dir(dir, JobIndex(1)), dir);
        assert_eq!(job_dir(dir, JobIndex(2)), dir.join("job-2"));
        assert_eq!(job_dir(dir, JobIndex(16)), dir.join("job-16"));
    }

    #[test]
    fn a_fixed_port_is_the_first_jobs_and_later_jobs_take_a_free_one_on_the_same_host() {
        assert_eq!(job_listen("0.0.0.0:7070", JobIndex(1)), "0.0.0.0:7070");
        assert_eq!(job_listen("0.0.0.0:7070", JobIndex(2)), "0.0.0.0:0");
        assert_eq!(job_listen("[::]:7070", JobIndex(3)), "[::]:0");
        assert_eq!(job_listen("127.0.0.1:0", JobIndex(2)), "127.0.0.1:0");
        assert_eq!(job_listen("localhost:7070", JobIndex(2)), "localhost:0");
    }

    #[test]
    fn only_loopback_listen_addresses_hide_the_job() {
        for listen in [
            "127.0.0.1:0",
            "127.0.0.9:7070",
            "[::1]:7070",
            "localhost:7070",
        ] {
            assert!(is_loopback(listen), "{listen}");
        }
        for listen in ["0.0.0.0:7070", "[::]:7070", "10.0.0.5:7070", "train-0:7070"] {
            assert!(!is_loopback(listen), "{listen}");
        }
    }
}
