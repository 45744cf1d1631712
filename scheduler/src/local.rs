//! The live scheduler on this machine (`lode scheduler`): the local backend and the job
//! announcements it follows.
//!
//! Jobs started with `lode run --announce DIR` publish `DIR/<name>.json` (dispatcher address,
//! job id, token). Every round the scheduler reads the directory, asks each job's dispatcher
//! for its counters (`Status`), turns two readings into rates and a `JobView`
//! (`lode_scheduler::live`), runs the same pure `decide` as the simulator under the chosen
//! policy, prints the decisions with the values that made them, and carries them out: an added
//! worker is a new `lode worker` process for that job, a removed one is drained (it finishes
//! what it holds, delivers it and exits). Workers the scheduler started are drained when it
//! stops.
//!
//! The local machine is one `MachineView` whose data-worker budget is `--max-workers`
//! one-CPU workers, counting the workers jobs started themselves.
//!
//! With `--tune` the job-level tuner runs first for each job (`lode_scheduler::live_tuner`):
//! while it reads a job, the backend starts and drains the probe workers the tuner asks for
//! (`--threads K --stage S`, one at a time), logs every tuning decision with the speedup it
//! measured, and hands the job to the policy only once its worker size is known; the workers
//! the scheduler then adds have that many threads, and the budget counts threads. A job's own
//! workers (those it started itself, one thread each as `lode run` starts them) are its
//! baseline and are never drained.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use lode_proto::service::v1::{self, DrainRequest, StatusRequest};
use lode_proto::service::{connect, DispatcherClient};
use lode_proto::tls::ClientTls;
use serde::{Deserialize, Serialize};

use crate::live::{LiveJob, QueueReading};
use crate::live_tuner::{LiveTuner, TuningRecord, Want, WorkerCounters};
use crate::policy::{JobView, MachineView};
use crate::{
    decide, Backend, DecideConfig, Decision, JobId, MachineId, Policy, Snapshot, TunerConfig,
};

/// Largest announcement file read.
const MAX_ANNOUNCEMENT_BYTES: u64 = 64 * 1024;
/// How long one RPC to a job's dispatcher may take before the job is skipped for the round.
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Names of workers the scheduler starts begin with this.
const WORKER_PREFIX: &str = "sched-";
/// Names of the tuner's probe workers begin with this. Names are `sched-<n>-<job>` and
/// `sched-probe-<n>-<job>`, the counter first, so that no job name makes one look like the
/// other.
const PROBE_PREFIX: &str = "sched-probe-";
/// The one machine of the local backend.
const LOCAL: MachineId = MachineId(0);

/// A running job, as `lode run --announce` publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Announcement {
    pub name: String,
    /// `http://host:port` of the job's dispatcher (`https://` when it serves TLS).
    pub dispatcher: String,
    pub job: u64,
    pub token: String,
}

/// A published announcement; the file is removed when this is dropped.
#[derive(Debug)]
pub struct Published(PathBuf);

impl Drop for Published {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Announcement {
    /// Writes `DIR/<name>.json` atomically, readable by this user only.
    pub fn publish(&self, dir: &Path) -> Result<Published, LocalError> {
        if !valid_name(&self.name) {
            return Err(LocalError::JobName {
                name: self.name.clone(),
            });
        }
        std::fs::create_dir_all(dir).map_err(|e| LocalError::Announcement {
            path: dir.to_owned(),
            reason: format!("cannot create the jobs directory: {e}"),
        })?;
        let path = dir.join(format!("{}.json", self.name));
        if path.exists() {
            return Err(LocalError::AlreadyAnnounced { path });
        }
        let tmp = dir.join(format!(".{}.json.{}", self.name, std::process::id()));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let write = || -> std::io::Result<()> {
            let mut file = options.open(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(self)?)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            LocalError::Announcement {
                path: path.clone(),
                reason: format!("cannot announce the job: {e}"),
            }
        })?;
        Ok(Published(path))
    }

    /// Reads an announcement file.
    pub fn read(path: &Path) -> Result<Announcement, LocalError> {
        let bytes = lode_proto::io::read_limited(path, MAX_ANNOUNCEMENT_BYTES)?;
        let a: Announcement =
            serde_json::from_slice(&bytes).map_err(|e| LocalError::Announcement {
                path: path.to_owned(),
                reason: format!("not a job announcement: {e}"),
            })?;
        if !valid_name(&a.name) {
            return Err(LocalError::Announcement {
                path: path.to_owned(),
                reason: format!("job name {:?} is not valid", a.name),
            });
        }
        Ok(a)
    }
}

/// Why the local backend, or an announcement, failed (a job's trouble only skips the job).
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{}: cannot read the jobs directory: {source}", dir.display())]
    JobsDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the jobs directory does not exist", dir.display())]
    NoJobsDir { dir: PathBuf },
    #[error(
        "job name {name:?}: use 1 to 128 letters, digits, '-', '_' or '.', not starting with '.'"
    )]
    JobName { name: String },
    #[error("{}: {reason}", path.display())]
    Announcement { path: PathBuf, reason: String },
    #[error("{}: a job of this name is already announced", path.display())]
    AlreadyAnnounced { path: PathBuf },
    #[error(transparent)]
    Read(#[from] lode_proto::Error),
    #[error("--tls-ca: {0}")]
    Tls(#[from] lode_proto::tls::TlsError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("--interval must be above 0")]
    Interval,
    #[error("cannot write the round report: {0}")]
    Report(#[source] std::io::Error),
}

/// Why one job gave no reading this round.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{0} timed out")]
    Timeout(&'static str),
    #[error(transparent)]
    Connect(#[from] lode_proto::service::ClientError),
    #[error(transparent)]
    Rpc(#[from] lode_proto::service::RpcError),
}

/// A job the backend follows.
#[derive(Debug)]
struct Tracked {
    announcement: Announcement,
    live: LiveJob,
    client: Option<DispatcherClient>,
    /// Its workers at the last reading.
    workers: Vec<v1::WorkerEntry>,
    /// Workers drained by the scheduler that may still be listed as active.
    drained: BTreeSet<u64>,
    /// Whether the last reading succeeded.
    seen: bool,
    /// Data-worker stages of the job's plan (from its dispatcher).
    stages: u32,
    /// With `--tune`: the job-level tuner, its current probe worker (name, stage, threads),
    /// and whether the scheduler's workers were withdrawn after a fallback.
    tuner: Option<LiveTuner>,
    probe: Option<(String, usize, u32)>,
    withdrawn: bool,
}

impl Tracked {
    /// Active workers not being drained by the scheduler.
    fn active(&self) -> impl Iterator<Item = &v1::WorkerEntry> {
        self.workers
            .iter()
            .filter(|w| !self.drained.contains(&w.id))
    }
}

/// The name of the `seq`-th worker the scheduler starts for `job`.
fn worker_name(probe: bool, seq: u64, job: &str) -> String {
    let prefix = if probe { PROBE_PREFIX } else { WORKER_PREFIX };
    format!("{prefix}{seq}-{job}")
}

/// Whether the scheduler started this worker to serve the job (not a probe, not the job's own).
fn is_allocated(w: &v1::WorkerEntry) -> bool {
    w.name.starts_with(WORKER_PREFIX) && !w.name.starts_with(PROBE_PREFIX)
}

#[derive(Debug)]
struct Spawned {
    job: String,
    name: String,
    threads: u32,
    child: Child,
}

/// `lode worker` processes on this machine.
#[derive(Debug)]
pub struct LocalBackend {
    rt: tokio::runtime::Runtime,
    jobs_dir: PathBuf,
    budget: u32,
    exe: PathBuf,
    /// `--tls-ca`: trusted for https dispatchers, and handed to the workers started.
    tls: Option<(PathBuf, ClientTls)>,
    clock: Instant,
    jobs: BTreeMap<String, Tracked>,
    ids: BTreeMap<String, JobId>,
    spawned: Vec<Spawned>,
    spawn_seq: u64,
    /// Apply the job-level tuner (`--tune`).
    tune: bool,
    /// Tuning decisions made while reading the jobs this round: (job, record).
    tuning: Vec<(String, TuningRecord)>,
}

impl LocalBackend {
    pub fn new(
        jobs_dir: &Path,
        budget: u32,
        exe: PathBuf,
        tls_ca: Option<&Path>,
        tune: bool,
    ) -> Result<Self, LocalError> {
        if !jobs_dir.is_dir() {
            return Err(LocalError::NoJobsDir {
                dir: jobs_dir.to_owned(),
            });
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(LocalError::Runtime)?;
        let tls = match tls_ca {
            Some(ca) => Some((ca.to_owned(), ClientTls::from_ca_file(ca)?)),
            None => None,
        };
        Ok(Self {
            rt,
            jobs_dir: jobs_dir.to_owned(),
            budget,
            exe,
            tls,
            clock: Instant::now(),
            jobs: BTreeMap::new(),
            ids: BTreeMap::new(),
            spawned: Vec::new(),
            spawn_seq: 0,
            tune,
            tuning: Vec::new(),
        })
    }

    /// The job of an id, for reports.
    fn name_of(&self, id: JobId) -> &str {
        self.ids
            .iter()
            .find(|(_, &j)| j == id)
            .map_or("?", |(n, _)| n.as_str())
    }

    /// Reads the directory: new announcements are followed, removed ones dropped.
    fn scan(&mut self) -> Result<(), LocalError> {
        let entries = std::fs::read_dir(&self.jobs_dir).map_err(|source| LocalError::JobsDir {
            dir: self.jobs_dir.clone(),
            source,
        })?;
        let mut present = BTreeSet::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let file = entry.file_name().to_string_lossy().into_owned();
            if file.starts_with('.') || path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let announcement = match Announcement::read(&path) {
                Ok(a) => a,
                Err(err) => {
                    tracing::warn!(file = %path.display(), "skipped: {err:#}");
                    continue;
                }
            };
            present.insert(announcement.name.clone());
            if self
                .jobs
                .get(&announcement.name)
                .is_some_and(|t| t.announcement == announcement)
            {
                continue;
            }
            let next = JobId(u64::try_from(self.ids.len()).unwrap_or(u64::MAX) + 1);
            let id = *self.ids.entry(announcement.name.clone()).or_insert(next);
            tracing::info!(job = %announcement.name, dispatcher = %announcement.dispatcher, "following job");
            self.jobs.insert(
                announcement.name.clone(),
                Tracked {
                    announcement,
                    live: LiveJob::new(id),
                    client: None,
                    workers: Vec::new(),
                    drained: BTreeSet::new(),
                    seen: false,
                    stages: 1,
                    tuner: None,
                    probe: None,
                    withdrawn: false,
                },
            );
        }
        self.jobs.retain(|name, _| present.contains(name));
        Ok(())
    }

    /// Reads one job's counters; `None` (logged) when its dispatcher does not answer.
    fn read(&mut self, name: &str) -> Option<(QueueReading, Vec<v1::WorkerEntry>)> {
        let at_s = self.clock.elapsed().as_secs_f64();
        let tracked = self.jobs.get_mut(name)?;
        let a = tracked.announcement.clone();
        let mut client = tracked.client.clone();
        let tls = self.tls.as_ref().map(|(_, tls)| tls);
        let status = self.rt.block_on(async {
            let mut c = match client.take() {
                Some(c) => c,
                None => tokio::time::timeout(RPC_TIMEOUT, connect(&a.dispatcher, &a.token, tls))
                    .await
                    .map_err(|_| ReadError::Timeout("connecting"))??,
            };
            let status =
                tokio::time::timeout(RPC_TIMEOUT, c.status(StatusRequest { job_id: a.job }))
                    .await
                    .map_err(|_| ReadError::Timeout("Status"))?
                    .map_err(lode_proto::service::RpcError::of("Status"))?
                    .into_inner();
            Ok::<_, ReadError>((c, status))
        });
        let (c, status) = match status {
            Ok(ok) => ok,
            Err(err) => {
                tracing::warn!(job = %name, "no reading this round: {err:#}");
                tracked.client = None;
                tracked.seen = false;
                return None;
            }
        };
        tracked.client = Some(c);
        tracked.seen = true;
        tracked.stages = status.stages.max(1);
        if status.end_of_data {
            // Finished: nothing to plan; its workers leave by themselves.
            tracked.workers.clear();
            return None;
        }
        let active: Vec<v1::WorkerEntry> = status
            .workers
            .iter()
            .filter(|w| w.status == v1::WorkerStatus::Active as i32)
            .cloned()
            .collect();
        let listed: BTreeSet<u64> = active.iter().map(|w| w.id).collect();
        tracked.drained.retain(|id| listed.contains(id));
        let workers = active
            .iter()
            .filter(|w| !tracked.drained.contains(&w.id))
            .count();
        let remaining = (status.epochs > 0).then(|| {
            status
                .epochs
                .saturating_mul(status.steps_per_epoch)
                .saturating_sub(status.steps_consumed)
        });
        let reading = QueueReading {
            at_s,
            steps_consumed: status.steps_consumed,
            steps_computed: status.steps_computed,
            compute_us: status.compute_us,
            consumer_busy_us: status.consumer_busy_us,
            workers: u32::try_from(workers).unwrap_or(u32::MAX),
            remaining_steps: remaining,
        };
        Some((reading, active))
    }

    /// Starts a `lode worker` of `threads` threads for the job (on `stage`, or where the
    /// dispatcher puts it); a probe's name begins with [`PROBE_PREFIX`]. Returns the worker's
    /// name.
    fn spawn_worker(
        &mut self,
        name: &str,
        threads: u32,
        stage: Option<usize>,
        probe: bool,
    ) -> Option<String> {
        let tracked = self.jobs.get(name)?;
        self.spawn_seq += 1;
        let a = &tracked.announcement;
        let worker_name = worker_name(probe, self.spawn_seq, &a.name);
        let child = WorkerCommand {
            stage,
            threads: threads.max(1),
            tls_ca: self.tls.as_ref().map(|(ca, _)| ca.as_path()),
            ..WorkerCommand::new(&self.exe, &a.dispatcher, &a.token, a.job, &worker_name)
        }
        .spawn();
        match child {
            Ok(child) => {
                tracing::info!(job = %name, worker = %worker_name, threads, pid = child.id(), "worker started");
                self.spawned.push(Spawned {
                    job: name.to_owned(),
                    name: worker_name.clone(),
                    threads: threads.max(1),
                    child,
                });
                Some(worker_name)
            }
            Err(err) => {
                tracing::error!(job = %name, "cannot start a worker: {err}");
                None
            }
        }
    }

    /// Threads of a listed worker: as started by the scheduler, else one (a job's own workers
    /// run with `lode run`'s default of one thread).
    fn threads_of(&self, worker: &v1::WorkerEntry) -> u32 {
        self.spawned
            .iter()
            .find(|s| s.name == worker.name)
            .map_or(1, |s| s.threads)
    }

    /// Drains one active worker of the job: the newest one the scheduler started, else the
    /// newest; with `--tune`, only workers the scheduler allocated (never a probe or the
    /// job's own). Returns its id.
    fn drain_worker(&mut self, name: &str) -> Option<u64> {
        let tune = self.tune;
        let tracked = self.jobs.get(name)?;
        let pick = tracked
            .active()
            .filter(|w| !tune || is_allocated(w))
            .max_by_key(|w| (w.name.starts_with(WORKER_PREFIX), w.id))?
            .id;
        self.drain_id(name, pick)
    }

    /// Drains the job's worker `pick`. Returns its id once the dispatcher took the drain.
    fn drain_id(&mut self, name: &str, pick: u64) -> Option<u64> {
        let tracked = self.jobs.get_mut(name)?;
        let a = tracked.announcement.clone();
        let client = tracked.client.clone()?;
        let answer = self.rt.block_on(async move {
            let mut c = client;
            tokio::time::timeout(
                RPC_TIMEOUT,
                c.drain(DrainRequest {
                    job_id: a.job,
                    worker_id: pick,
                }),
            )
            .await
        });
        match answer {
            Ok(Ok(_)) => {
                tracked.drained.insert(pick);
                tracing::info!(job = %name, worker = pick, "worker draining");
                Some(pick)
            }
            Ok(Err(status)) => {
                tracing::warn!(job = %name, worker = pick, %status, "drain refused");
                None
            }
            Err(_) => {
                tracing::warn!(job = %name, worker = pick, "drain timed out");
                None
            }
        }
    }

    /// With `--tune`: feeds the job's tuner its latest rates and probe counters, carries out
    /// what it wants (a probe of another size, a withdrawal after a fallback), and returns the
    /// job's view once it is tuned, with the worker threads that stay outside the plan.
    fn tune_job(&mut self, name: &str, now_s: f64) -> (Option<JobView>, u32) {
        let Some(tracked) = self.jobs.get_mut(name) else {
            return (None, 0);
        };
        if tracked.tuner.is_none() {
            let stages = usize::try_from(tracked.stages).unwrap_or(1);
            match LiveTuner::new(stages, TunerConfig::default()) {
                Ok(t) => tracked.tuner = Some(t),
                Err(err) => tracing::error!(job = %name, "cannot tune: {err}"),
            }
        }
        let probe = tracked.probe.as_ref().and_then(|(probe, ..)| {
            tracked
                .active()
                .find(|w| &w.name == probe)
                .map(|w| WorkerCounters {
                    steps_computed: w.steps_computed,
                    compute_us: w.compute_us,
                })
        });
        let allocated =
            u32::try_from(tracked.active().filter(|w| is_allocated(w)).count()).unwrap_or(u32::MAX);
        let rates = tracked.live.rates();
        let Some(tuner) = tracked.tuner.as_mut() else {
            return (None, 0);
        };
        let records = tuner
            .observe(now_s, &rates, probe, allocated)
            .unwrap_or_else(|err| {
                tracing::warn!(job = %name, "tuning skipped this round: {err}");
                Vec::new()
            });
        let want = tuner.want();
        for r in records {
            tracing::info!(
                job = %name,
                kind = r.kind,
                stage = ?r.stage,
                threads = ?r.threads,
                rate = r.rate,
                speedup = ?r.speedup,
                "tuning decision: {}",
                r.decision
            );
            self.tuning.push((name.to_owned(), r));
        }
        match want {
            Want::Measure => {}
            Want::Probe { stage, threads } => {
                let current = tracked.probe.as_ref().map(|(_, s, t)| (*s, *t));
                if current != Some((stage, threads)) {
                    self.stop_probe(name);
                    let started = self.spawn_worker(name, threads, Some(stage), true);
                    if let Some(t) = self.jobs.get_mut(name) {
                        t.probe = started.map(|w| (w, stage, threads));
                    }
                }
            }
            Want::Allocate { .. } => self.stop_probe(name),
            Want::FellBack => {
                self.stop_probe(name);
                if self.jobs.get(name).is_some_and(|t| !t.withdrawn) {
                    let ours: Vec<u64> = self.jobs.get(name).map_or_else(Vec::new, |t| {
                        t.active()
                            .filter(|w| is_allocated(w))
                            .map(|w| w.id)
                            .collect()
                    });
                    for id in ours {
                        self.drain_id(name, id);
                    }
                    if let Some(t) = self.jobs.get_mut(name) {
                        t.withdrawn = true;
                    }
                }
            }
        }
        let Some(tracked) = self.jobs.get(name) else {
            return (None, 0);
        };
        let view = tracked
            .tuner
            .as_ref()
            .and_then(|t| t.view(&tracked.live, LOCAL, allocated));
        let outside = tracked
            .active()
            .filter(|w| view.is_none() || !is_allocated(w))
            .map(|w| self.threads_of(w))
            .fold(0u32, u32::saturating_add);
        (view, outside)
    }

    /// Stops the job's probe worker: drained when its dispatcher lists it, else (not
    /// registered yet) its process is killed, before it takes a lease.
    fn stop_probe(&mut self, name: &str) {
        let Some((probe, ..)) = self.jobs.get_mut(name).and_then(|t| t.probe.take()) else {
            return;
        };
        let listed = self
            .jobs
            .get(name)
            .and_then(|t| t.active().find(|w| w.name == probe).map(|w| w.id));
        match listed {
            Some(id) => {
                self.drain_id(name, id);
            }
            None => {
                if let Some(s) = self.spawned.iter_mut().find(|s| s.name == probe) {
                    let _ = s.child.kill();
                    let _ = s.child.wait();
                }
            }
        }
    }

    /// Reaps workers that exited.
    fn reap(&mut self) {
        self.spawned
            .retain_mut(|s| matches!(s.child.try_wait(), Ok(None)));
    }

    /// Drains the workers the scheduler started, waits for them up to `grace`, then kills the
    /// rest.
    pub fn shutdown(&mut self, grace: Duration) {
        self.reap();
        let names: Vec<String> = self.spawned.iter().map(|s| s.job.clone()).collect();
        for name in names {
            if let Some((_, workers)) = self.read(&name) {
                if let Some(t) = self.jobs.get_mut(&name) {
                    t.workers = workers;
                }
            }
            let ours: Vec<u64> = self.jobs.get(&name).map_or_else(Vec::new, |t| {
                t.active()
                    .filter(|w| w.name.starts_with(WORKER_PREFIX))
                    .map(|w| w.id)
                    .collect()
            });
            for id in ours {
                self.drain_id(&name, id);
            }
        }
        let deadline = Instant::now() + grace;
        while !self.spawned.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            self.reap();
        }
        for s in &mut self.spawned {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
        self.spawned.clear();
    }
}

impl Backend for LocalBackend {
    type Error = LocalError;

    fn name(&self) -> &'static str {
        "local"
    }

    fn snapshot(&mut self) -> Result<Snapshot, LocalError> {
        self.reap();
        self.scan()?;
        let names: Vec<String> = self.jobs.keys().cloned().collect();
        let mut jobs = Vec::new();
        let mut unplanned = 0u32;
        for name in names {
            let Some((reading, workers)) = self.read(&name) else {
                continue;
            };
            let Some(tracked) = self.jobs.get_mut(&name) else {
                continue;
            };
            tracked.workers = workers;
            tracked.live.observe(reading);
            if self.tune {
                let (view, outside) = self.tune_job(&name, reading.at_s);
                jobs.extend(view);
                unplanned = unplanned.saturating_add(outside);
                continue;
            }
            match tracked.live.view(LOCAL) {
                Some(view) => jobs.push(view),
                // Not measured yet: its workers stay where they are and use the budget.
                None => unplanned = unplanned.saturating_add(reading.workers),
            }
        }
        Ok(Snapshot {
            machines: vec![MachineView {
                id: LOCAL,
                dw_cpus: self.budget.saturating_sub(unplanned),
                dw_mem_gb: f64::from(self.budget),
                // The training processes run here too.
                cpu_only: false,
            }],
            jobs,
        })
    }

    fn apply(&mut self, decisions: &[Decision]) -> Result<(), LocalError> {
        for d in decisions {
            match d {
                Decision::Remove { job, .. } => {
                    let name = self.name_of(*job).to_owned();
                    self.drain_worker(&name);
                }
                Decision::Add { job, cpus, .. } => {
                    let name = self.name_of(*job).to_owned();
                    self.spawn_worker(&name, *cpus, None, false);
                }
                // One machine: nothing to move between.
                Decision::Migrate { .. } => {}
            }
        }
        Ok(())
    }
}

/// One job in a round's report.
#[derive(Debug, Serialize)]
struct JobLine {
    name: String,
    job: u64,
    workers: u32,
    /// Steps/s one worker produces (per second of compute).
    per_worker: Option<f64>,
    /// Steps/s the training side can consume (per second of busy time).
    consumption: Option<f64>,
    /// Steps/s consumed over the last interval.
    throughput: f64,
}

/// One decision in a round's report.
#[derive(Debug, Serialize)]
struct DecisionLine {
    action: &'static str,
    job: String,
    metric: Option<f64>,
    /// Threads of an added worker.
    threads: Option<u32>,
}

/// One job-level tuning decision in a round's report (`--tune`).
#[derive(Debug, Serialize)]
struct TuningLine {
    job: String,
    #[serde(flatten)]
    record: TuningRecord,
}

#[derive(Debug, Serialize)]
struct RoundLine {
    round: u64,
    policy: &'static str,
    jobs: Vec<JobLine>,
    tuning: Vec<TuningLine>,
    decisions: Vec<DecisionLine>,
}

/// How one `lode worker` process is started on this machine: by the local backend, by
/// `lode run` and by `lode train`. The token travels in the environment (`LODE_TOKEN`), never
/// in argv, where every user of the machine could read it.
#[derive(Debug, Clone)]
pub struct WorkerCommand<'a> {
    pub exe: &'a Path,
    pub dispatcher: &'a str,
    pub token: &'a str,
    pub job: u64,
    pub name: &'a str,
    pub threads: u32,
    /// A fixed stage (None: the dispatcher picks one).
    pub stage: Option<usize>,
    pub tls_ca: Option<&'a Path>,
    /// Where relative data paths resolve (None: the plan's data root).
    pub data_root: Option<&'a Path>,
    /// A file the worker's output and logs are appended to (None: discarded, errors only).
    pub log: Option<&'a Path>,
}

impl<'a> WorkerCommand<'a> {
    /// A one-thread worker of `job`, quiet, its output discarded.
    pub fn new(
        exe: &'a Path,
        dispatcher: &'a str,
        token: &'a str,
        job: u64,
        name: &'a str,
    ) -> Self {
        WorkerCommand {
            exe,
            dispatcher,
            token,
            job,
            name,
            threads: 1,
            stage: None,
            tls_ca: None,
            data_root: None,
            log: None,
        }
    }

    /// Starts the process.
    pub fn spawn(&self) -> std::io::Result<Child> {
        let mut command = std::process::Command::new(self.exe);
        command
            .args(["worker", "--dispatcher", self.dispatcher])
            .args(["--job", &self.job.to_string()])
            .args(["--threads", &self.threads.max(1).to_string()])
            .args(["--name", self.name]);
        if let Some(stage) = self.stage {
            command.args(["--stage", &stage.to_string()]);
        }
        if let Some(ca) = self.tls_ca {
            command.arg("--tls-ca").arg(ca);
        }
        if let Some(root) = self.data_root {
            command.arg("--data-root").arg(root);
        }
        match self.log {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                command.stdout(file.try_clone()?).stderr(file);
            }
            None => {
                command
                    .arg("-q")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
            }
        }
        command
            .env("LODE_TOKEN", self.token)
            .stdin(Stdio::null())
            .spawn()
    }
}

/// What `lode scheduler` runs with, validated by [`run_local`].
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Where jobs publish their announcements.
    pub jobs_dir: PathBuf,
    /// Data-worker threads this machine gives to jobs.
    pub budget: u32,
    /// The `lode` executable started as `lode worker`.
    pub exe: PathBuf,
    /// A CA for https dispatchers, handed to the workers started too.
    pub tls_ca: Option<PathBuf>,
    /// Apply the job-level tuner first.
    pub tune: bool,
    pub policy: Policy,
    /// Time between rounds (above zero).
    pub interval: Duration,
    /// Stop after this many rounds (`None`: until Ctrl-C).
    pub rounds: Option<u64>,
    pub format: ReportFormat,
}

/// How a round's report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportFormat {
    Text,
    /// One JSON object a line.
    Json,
}

/// The live scheduler on this machine: a round every `interval` (read the jobs, decide, report
/// to `out`, carry the decisions out) until `rounds` or Ctrl-C; then the workers it started are
/// drained.
pub fn run_local(config: &LocalConfig, out: &mut dyn std::io::Write) -> Result<(), LocalError> {
    if config.interval.is_zero() {
        return Err(LocalError::Interval);
    }
    let policy = config.policy;
    let mut backend = LocalBackend::new(
        &config.jobs_dir,
        config.budget,
        config.exe.clone(),
        config.tls_ca.as_deref(),
        config.tune,
    )?;
    let decide_config = DecideConfig::default();
    let mut round = 0u64;
    let result = (|| -> Result<(), LocalError> {
        loop {
            round += 1;
            let snapshot = backend.snapshot()?;
            let decisions = decide(policy, &snapshot, &decide_config);
            let line = RoundLine {
                round,
                policy: policy.name(),
                jobs: backend
                    .jobs
                    .iter()
                    .filter(|(_, t)| t.seen)
                    .map(|(name, t)| {
                        let r = t.live.rates();
                        JobLine {
                            name: name.clone(),
                            job: t.announcement.job,
                            workers: t.live.workers(),
                            per_worker: r.per_worker,
                            consumption: r.consumption,
                            throughput: r.throughput,
                        }
                    })
                    .collect(),
                tuning: std::mem::take(&mut backend.tuning)
                    .into_iter()
                    .map(|(job, record)| TuningLine { job, record })
                    .collect(),
                decisions: decisions
                    .iter()
                    .map(|d| {
                        let (action, job, metric, threads) = match d {
                            Decision::Add {
                                job, metric, cpus, ..
                            } => ("add", job, Some(*metric), Some(*cpus)),
                            Decision::Remove { job, .. } => ("remove", job, None, None),
                            Decision::Migrate { job, .. } => ("migrate", job, None, None),
                        };
                        DecisionLine {
                            action,
                            job: backend.name_of(*job).to_owned(),
                            metric,
                            threads,
                        }
                    })
                    .collect(),
            };
            report(out, config.format, &line).map_err(LocalError::Report)?;
            for d in &line.decisions {
                tracing::info!(round, action = d.action, job = %d.job, metric = ?d.metric, "decision");
            }
            backend.apply(&decisions)?;
            if config.rounds.is_some_and(|n| round >= n) {
                return Ok(());
            }
            let interrupted = backend.rt.block_on(async {
                tokio::select! {
                    () = tokio::time::sleep(config.interval) => false,
                    _ = tokio::signal::ctrl_c() => true,
                }
            });
            if interrupted {
                return Ok(());
            }
        }
    })();
    backend.shutdown(Duration::from_secs(15));
    result
}

fn fmt_rate(r: Option<f64>) -> String {
    r.map_or_else(|| "unmeasured".into(), |r| format!("{r:.1} steps/s"))
}

/// `lode scheduler`.
fn report(
    out: &mut dyn std::io::Write,
    format: ReportFormat,
    line: &RoundLine,
) -> std::io::Result<()> {
    match format {
        ReportFormat::Json => {
            serde_json::to_writer(&mut *out, line)?;
            writeln!(out)?;
        }
        ReportFormat::Text => {
            let jobs: Vec<String> = line
                .jobs
                .iter()
                .map(|j| {
                    format!(
                        "{} ({} worker(s); one worker {}, consumption {}, throughput {:.1} steps/s)",
                        j.name,
                        j.workers,
                        fmt_rate(j.per_worker),
                        fmt_rate(j.consumption),
                        j.throughput
                    )
                })
                .collect();
            writeln!(
                out,
                "round {} ({}): {}",
                line.round,
                line.policy,
                if jobs.is_empty() {
                    "no job announced".into()
                } else {
                    jobs.join("; ")
                }
            )?;
            for t in &line.tuning {
                writeln!(out, "  tune {}: {}", t.job, t.record.describe())?;
            }
            for d in &line.decisions {
                let threads = match d.threads {
                    Some(t) if t > 1 => format!(" of {t} threads"),
                    _ => String::new(),
                };
                match d.metric {
                    Some(m) => writeln!(
                        out,
                        "  {} a worker{threads}: {} ({} {m:.4})",
                        d.action, d.job, line.policy
                    )?,
                    None => writeln!(out, "  {} a worker: {}", d.action, d.job)?,
                }
            }
        }
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_names_tell_probes_from_allocated_workers_whatever_the_job_name() {
        let entry = |name: String| v1::WorkerEntry {
            name,
            ..v1::WorkerEntry::default()
        };
        for job in ["a", "probe-1", "x-probe-2", "sched-probe-3"] {
            assert!(is_allocated(&entry(worker_name(false, 7, job))), "{job}");
            assert!(!is_allocated(&entry(worker_name(true, 8, job))), "{job}");
        }
        // A job's own workers are never the scheduler's.
        assert!(!is_allocated(&entry("worker-0".into())));
    }

    #[test]
    fn announcements_round_trip_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = Announcement {
            name: "job-a".into(),
            dispatcher: "http://127.0.0.1:1".into(),
            job: 3,
            token: "secret".into(),
        };
        let published = a.publish(dir.path()).expect("publish");
        let path = dir.path().join("job-a.json");
        assert_eq!(Announcement::read(&path).expect("read"), a);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let twice = a.publish(dir.path()).expect_err("taken");
        assert!(twice.to_string().contains("already announced"), "{twice}");
        drop(published);
        assert!(!path.exists(), "removed when the job ends");

        let mut bad = a.clone();
        bad.name = "../escape".into();
        assert!(bad.publish(dir.path()).is_err());
        std::fs::write(dir.path().join("x.json"), "{\"name\": 1}").expect("write");
        let err = Announcement::read(&dir.path().join("x.json")).expect_err("bad");
        assert!(
            format!("{err:#}").contains("not a job announcement"),
            "{err:#}"
        );
    }
}
