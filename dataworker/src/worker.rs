//! The data-worker loop: register with the job's dispatcher, load the stage it assigns, then
//! lease → read the records (or fetch the earlier stage's tensors) → execute on rayon → push
//! one frame to the receiver over its data plane ([`lode_transfer::data_plane`]) → report the step
//! complete; heartbeat meanwhile; stop at end of data, when drained, or on shutdown.
//!
//! A step is reported complete only after the receiver accepted its frame (or already had
//! it), so a worker killed at any point loses nothing: its lease expires or its silence gets
//! it declared lost, and the step is leased again and recomputed from the same index batch.
//!
//! What to lease (k steps at once, adaptive), run, push and report (in batches) is decided by
//! [`WorkerState`], a synchronous state machine; this file is its async shell: it performs
//! the decisions (one task per lease or report request in flight, the stage as a rayon job,
//! the push inline) and feeds their outcomes back.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lode_proto::plan::Plan;
use lode_proto::service::v1::lease_response::Outcome;
use lode_proto::service::v1::{
    CompleteRequest, CompleteResponse, CompletedStep, FetchRequest, HeartbeatRequest, LeaseRequest,
    LeaseResponse, PushStatus, RegisterRequest, StepLeases,
};
use lode_proto::service::{
    connect, connect_receiver, retry_unreachable, ReceiverClient, MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
};
use lode_proto::tf::graph::GraphDef;
use lode_proto::tls::ClientTls;

use crate::worker_state::{Delivered, End, HeldStep, PushAnswer, PushNext, WorkerState};
use crate::ServiceError;
use lode_runtime::clock::{thread_clock_cost, thread_cpu};
use lode_runtime::exec::stage::owned_tensors;
use lode_runtime::exec::{ExecOptions, Stage, StepInput};
use lode_runtime::tensor::Tensor;
use lode_transfer::codec::auto::LinkSample;
use lode_transfer::data_plane::{DataPlaneClient, DataPlaneError};
use lode_transfer::{CodecConfig, Compression, OwnedFrame, StepDecoder, StepEncoder, StepMessage};

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `http://host:port` of the job's dispatcher (`https://` over TLS).
    pub dispatcher: String,
    /// The CA that signs the dispatcher's and receivers' certificates, for `https://`
    /// addresses; the scheme of each address decides (see [`lode_proto::tls`]).
    pub tls: Option<ClientTls>,
    pub token: String,
    pub job: u64,
    /// Shown in the dispatcher's log.
    pub name: String,
    /// Rayon threads for the stage's kernels.
    pub threads: usize,
    /// Overrides the plan's data root.
    pub data_root: Option<PathBuf>,
    pub compression: Compression,
    /// A fixed stage, or None to let the dispatcher choose.
    pub stage: Option<u32>,
    pub ignore_errors: bool,
    /// Where the worker counts what it does (shared with its metrics endpoint, if any).
    pub stats: Arc<WorkerStats>,
}

/// What a worker has done since it started, over every registration: counters the loop
/// adds to as it goes (relaxed atomics: each is read on its own, by a metrics scrape), and two
/// gauges of its adaptive state. `compute_ns` over `steps_computed`, against the process's
/// CPU per step, splits the worker's cost into the stage and everything else.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Registrations with the dispatcher (more than one after being declared lost).
    pub registrations: AtomicU64,
    /// Steps the stage computed (a step recomputed after its lease expired counts again).
    pub steps_computed: AtomicU64,
    /// The stage's time over those steps (wall time of each step's run), in nanoseconds.
    /// A wait of the stage's thread for a CPU mid-stage would count too: `stage_cpu_ns`
    /// checks that on a sample of the steps.
    pub compute_ns: AtomicU64,
    /// The stage's own CPU time (its thread's CPU clock) on a sample of the steps, one in
    /// [`STAGE_CPU_SAMPLE`], in nanoseconds; `stage_cpu_steps` counts them. Unlike
    /// `compute_ns` it leaves out any wait for a CPU, and reads a little high by the clock's
    /// own system calls (less the least a pair of reads costs). Sampled because the thread's
    /// clock is a system call, where the wall clock is not.
    pub stage_cpu_ns: AtomicU64,
    /// The steps `stage_cpu_ns` timed.
    pub stage_cpu_steps: AtomicU64,
    /// Their wall time (as `compute_ns` counts it), in nanoseconds: over the same steps,
    /// `stage_cpu_ns` against this is the share of the stage's wall time it ran.
    pub stage_cpu_wall_ns: AtomicU64,
    /// Time spent freeing each computed step's tensors once its frame is encoded (those the
    /// frame does not send from their own memory), in nanoseconds: the part of the worker's
    /// cost outside the stage that `lode exec`'s step pays too (it frees each step's tensors).
    pub release_ns: AtomicU64,
    /// Frames written to the receiver's data plane (a frame sent again counts again).
    pub frames_sent: AtomicU64,
    /// Vectored writes of frames (bursts): `frames_sent` over this is the mean burst.
    pub bursts_sent: AtomicU64,
    /// The frames' bytes.
    pub bytes_sent: AtomicU64,
    /// Lease requests to the dispatcher (each may carry a report).
    pub lease_requests: AtomicU64,
    /// Complete requests (reports that went alone).
    pub report_requests: AtomicU64,
    /// Steps reported delivered to the dispatcher.
    pub steps_reported: AtomicU64,
    /// Gauge: the stage's moving-average step time, in nanoseconds (0 before the first).
    pub step_time_ns: AtomicU64,
    /// Gauge: the lease batch k at the last request (what a request asks for when the lease
    /// limit leaves room).
    pub lease_batch: AtomicU64,
    /// Gauge: the lease limit at the last request (the worker's share of the receiver's
    /// window, as the dispatcher last said it).
    pub lease_limit: AtomicU64,
}

impl WorkerStats {
    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn add_duration(counter: &AtomicU64, d: Duration) {
        counter.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// One step in `2^STAGE_CPU_SAMPLE_BITS` has its stage timed by its thread's CPU clock too.
const STAGE_CPU_SAMPLE_BITS: u32 = 6;

/// One step in this many has its stage timed by its thread's CPU clock too
/// ([`WorkerStats::stage_cpu_ns`]).
pub const STAGE_CPU_SAMPLE: u64 = 1 << STAGE_CPU_SAMPLE_BITS;

/// Whether global step `global`'s stage is timed by its thread's CPU clock: one step in
/// [`STAGE_CPU_SAMPLE`], picked by a hash of its number (the top bits of a Fibonacci hash).
/// Not every 64th step computed: that one would always open a burst, right after the send,
/// with colder caches than the rest.
fn cpu_sampled(global: u64) -> bool {
    global.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - STAGE_CPU_SAMPLE_BITS) == 0
}

/// Runs a step's stage on this thread: its output, its wall time and, when `sampled`, its
/// CPU time on this thread (less what the clock's reads count by themselves).
fn timed_stage<T>(sampled: bool, run: impl FnOnce() -> T) -> (T, Duration, Option<Duration>) {
    let before = sampled.then(|| (thread_clock_cost(), thread_cpu()));
    let computing = Instant::now();
    let output = run();
    let wall = computing.elapsed();
    let cpu = before.map(|(cost, at)| thread_cpu().saturating_sub(at).saturating_sub(cost));
    (output, wall, cpu)
}

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerEnd {
    EndOfData,
    Drained,
    Shutdown,
}

/// What a worker did.
#[derive(Debug, Clone)]
pub struct WorkerSummary {
    /// The id of its last registration.
    pub worker_id: u64,
    pub stage: u32,
    /// Steps delivered and reported, over every registration.
    pub steps: u64,
    pub end: WorkerEnd,
    /// How often it registered again after the dispatcher declared it lost
    /// ([`run_worker_rejoining`]).
    pub rejoined: u32,
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn bad(what: &'static str, reason: impl std::fmt::Display) -> ServiceError {
    ServiceError::BadAnswer {
        what,
        reason: reason.to_string(),
    }
}

/// Shared between the loop and its heartbeat task.
#[derive(Debug)]
struct Shared {
    receiver_addr: String,
    draining: bool,
    /// The heartbeat's answer said the job's data ended.
    end_of_data: bool,
    /// The dispatcher's lease generation, as the last heartbeat said (see
    /// `WorkerState::void_before`).
    generation: u64,
    /// When the dispatcher last answered (registration or heartbeat).
    heard: std::time::Instant,
    /// The heartbeat's refusal once the dispatcher no longer knows this worker (it was
    /// declared lost): the loop ends on it with [`ServiceError::Lost`].
    lost: Option<String>,
}

/// The receiver address the dispatcher last named (empty until a consumer registered), or an
/// error once the dispatcher has not answered for [`RECONNECT_WINDOW`]: the job is gone, and a
/// worker waiting for a receiver would otherwise wait forever. [`ServiceError::JobEnded`] once
/// the dispatcher said the data ended.
#[allow(clippy::result_large_err)] // the worker's error, as its async callers return it
fn named_receiver(shared: &Mutex<Shared>) -> Result<String, ServiceError> {
    let (addr, heard, ended) = shared
        .lock()
        .map(|s| (s.receiver_addr.clone(), s.heard, s.end_of_data))
        .map_err(|_| bad("worker", "shared state poisoned"))?;
    if ended {
        return Err(ServiceError::JobEnded);
    }
    if heard.elapsed() > RECONNECT_WINDOW {
        return Err(bad(
            "dispatcher",
            format!(
                "no answer to heartbeats for {} s; the job is gone",
                RECONNECT_WINDOW.as_secs()
            ),
        ));
    }
    Ok(addr)
}

/// Whether a heartbeat said the job's data ended.
fn shared_end_of_data(shared: &Mutex<Shared>) -> bool {
    shared.lock().is_ok_and(|s| s.end_of_data)
}

/// Gives up on a receiver that stayed unreachable for [`RECONNECT_WINDOW`].
#[allow(clippy::result_large_err)] // the worker's error, as its async callers return it
fn still_trying(
    addr: &str,
    failing_since: &mut Option<std::time::Instant>,
) -> Result<(), ServiceError> {
    let since = *failing_since.get_or_insert_with(std::time::Instant::now);
    if since.elapsed() > RECONNECT_WINDOW {
        return Err(bad(
            "receiver",
            format!("{addr} unreachable for {} s", RECONNECT_WINDOW.as_secs()),
        ));
    }
    Ok(())
}

/// Runs a data worker until end of data, drain or `shutdown`.
pub async fn run_worker(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<WorkerSummary, ServiceError> {
    run_registration(config, shutdown).await
}

/// [`run_worker`], registering again whenever the dispatcher declares the worker lost
/// ([`ServiceError::Lost`]: it was silent for longer than the dispatcher waits, e.g. paused,
/// and its steps went to others) after it had delivered steps. Its leases are void by then,
/// so the new registration starts empty; what the old one still pushes the receiver drops
/// as duplicates, and its reports are refused. A registration lost before it delivered
/// anything ends the worker with the error: the worker cannot keep its heartbeat going.
pub async fn run_worker_rejoining(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<WorkerSummary, ServiceError> {
    tokio::pin!(shutdown);
    let (mut earlier, mut rejoined) = (0u64, 0u32);
    loop {
        let before = config.stats.steps_reported.load(Ordering::Relaxed);
        let reported = || {
            config
                .stats
                .steps_reported
                .load(Ordering::Relaxed)
                .saturating_sub(before)
        };
        match run_registration(config.clone(), shutdown.as_mut()).await {
            Ok(mut summary) => {
                summary.steps += earlier;
                summary.rejoined = rejoined;
                return Ok(summary);
            }
            Err(ServiceError::Lost {
                worker_id,
                rpc,
                reason,
            }) if reported() > 0 => {
                tracing::warn!(
                    worker_id,
                    rpc,
                    %reason,
                    "the dispatcher declared this worker lost; registering again"
                );
                earlier += reported();
                rejoined += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// One registration's run: [`run_worker`] (its summary counts this registration's steps).
async fn run_registration(
    config: WorkerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<WorkerSummary, ServiceError> {
    let stats = config.stats.clone();
    let reported_before = stats.steps_reported.load(Ordering::Relaxed);
    let tls = config.tls.as_ref();
    let mut dispatcher = connect(&config.dispatcher, &config.token, tls).await?;
    let reg = dispatcher
        .register(RegisterRequest {
            job_id: config.job,
            protocol_version: PROTOCOL_VERSION,
            stage: config
                .stage
                .and_then(|s| i32::try_from(s).ok())
                .unwrap_or(-1),
            worker_name: config.name.clone(),
        })
        .await
        .map_err(ServiceError::rpc("Register"))?
        .into_inner();
    let worker_id = reg.worker_id;
    let stage_index = reg.stage;
    WorkerStats::add(&stats.registrations, 1);
    tracing::info!(worker_id, stage = stage_index, "registered");
    let shared = Arc::new(Mutex::new(Shared {
        receiver_addr: reg.receiver_addr.clone(),
        draining: false,
        end_of_data: false,
        generation: 0,
        heard: std::time::Instant::now(),
        lost: None,
    }));
    let heartbeat = {
        let mut client = dispatcher.clone();
        let shared = shared.clone();
        let job = config.job;
        let every = Duration::from_millis(reg.heartbeat_interval_ms.max(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match client
                    .heartbeat(HeartbeatRequest {
                        job_id: job,
                        worker_id,
                    })
                    .await
                {
                    Ok(answer) => {
                        let answer = answer.into_inner();
                        if let Ok(mut s) = shared.lock() {
                            s.heard = std::time::Instant::now();
                            s.draining = answer.draining;
                            s.end_of_data |= answer.end_of_data;
                            s.generation = s.generation.max(answer.generation);
                            if !answer.receiver_addr.is_empty() {
                                s.receiver_addr = answer.receiver_addr;
                            }
                        }
                    }
                    Err(status) if status.code() == tonic::Code::NotFound => {
                        if let Ok(mut s) = shared.lock() {
                            s.lost = Some(status.message().to_owned());
                        }
                    }
                    Err(status) => tracing::warn!(%status, "heartbeat failed"),
                }
            }
        })
    };
    // Stopped when the worker stops, also on the error paths: a worker that registers again
    // must not leave the old registration's heartbeat running. Started before the stage
    // loads (which reads its data source and may take seconds on a busy host): the
    // dispatcher declares a worker silent for about a second lost.
    let heartbeat_guard = AbortOnDrop(heartbeat.abort_handle());
    let plan: Plan = serde_json::from_str(&reg.plan_json).map_err(|e| bad("plan", e))?;
    let graph: GraphDef =
        lode_proto::io::decode_binary(&reg.stage_graph).map_err(|e| bad("stage graph", e))?;
    let index = usize::try_from(stage_index).map_err(|e| bad("stage", e))?;
    let spec = plan
        .stages
        .get(index)
        .cloned()
        .ok_or_else(|| bad("stage", format!("the plan has no stage {index}")))?;
    let data_root = config
        .data_root
        .clone()
        .or_else(|| plan.data_root.as_ref().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("."));
    let threads = config.threads.max(1);
    let pool = Arc::new(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| ServiceError::Join(e.to_string()))?,
    );
    let options = ExecOptions {
        ignore_errors: config.ignore_errors,
        parallel: threads > 1,
        data_root: Some(data_root.clone()),
    };
    let source = plan.source.clone();
    let load_pool = pool.clone();
    let stage = tokio::task::spawn_blocking(move || {
        load_pool.install(|| {
            Stage::from_graph(
                index,
                &graph,
                &spec.send.node,
                &spec.recv,
                source.as_ref(),
                &data_root,
                &options,
            )
        })
    })
    .await
    .map_err(|e| ServiceError::Join(e.to_string()))??;
    let stage = Arc::new(stage);
    // Send-list names of every stage, to name a fetched earlier stage's tensors.
    let send_names: HashMap<u32, Vec<String>> = plan
        .stages
        .iter()
        .filter_map(|s| {
            let i = u32::try_from(s.index).ok()?;
            Some((i, s.send.tensors.iter().map(|t| t.tensor.clone()).collect()))
        })
        .collect();

    let mut encoder = StepEncoder::new(CodecConfig {
        compression: config.compression,
        max_message_bytes: MAX_MESSAGE_BYTES as u64,
    });
    // `send_flight` reports every burst to a receiver elsewhere.
    encoder.expect_link_reports();
    let mut out = Outbox {
        encoder,
        plane: None,
        burst: Burst::default(),
        flight: VecDeque::new(),
        flight_sent: false,
        parked: HashMap::new(),
        network_wait: Duration::ZERO,
    };
    let ctx = StepContext {
        job: config.job,
        token: config.token.clone(),
        tls: config.tls.clone(),
        stage_index,
        stage,
        pool,
        single_thread: threads == 1,
        send_names,
        shared: shared.clone(),
        stats: stats.clone(),
    };
    // gRPC for `Fetch`; the data plane (in `out`) for pushes.
    let mut receiver: Option<(String, ReceiverClient)> = None;
    let steps_per_epoch =
        lode_proto::step::steps_per_epoch(reg.steps_per_epoch).map_err(|e| bad("register", e))?;
    let mut state = WorkerState::new(reg.max_leases);
    // Lease and report answers, from the (at most one each) requests in flight: one task per
    // batch, never per step.
    let (answers_tx, mut answers) = tokio::sync::mpsc::channel::<Answer>(2);
    tokio::pin!(shutdown);
    let end = loop {
        let now = Instant::now();
        let (draining, ended, generation, lost) = shared
            .lock()
            .map(|s| (s.draining, s.end_of_data, s.generation, s.lost.clone()))
            .unwrap_or((false, false, 0, None));
        if let Some(reason) = lost {
            return Err(ServiceError::Lost {
                worker_id,
                rpc: "Heartbeat",
                reason,
            });
        }
        state.set_draining(draining);
        state.void_before(generation);
        if ended {
            state.job_ended();
        }
        // What the state dropped (the job ended) is not sent.
        if !state.awaits_answer() {
            out.flight.clear();
        }
        if state.burst().next().is_none() {
            out.burst.clear();
        }
        // A parked step the state dropped (expired, or the job ended) is not sent.
        out.parked.retain(|global, _| state.is_parked(*global));
        while let Ok(answer) = answers.try_recv() {
            absorb(&mut state, answer, steps_per_epoch, Instant::now())?;
        }
        if let Some(end) = state.finished() {
            break match end {
                End::EndOfData => WorkerEnd::EndOfData,
                End::Drained => WorkerEnd::Drained,
            };
        }
        // The step to run next is taken first, so that the lease request below already
        // counts it as started and asks for the steps after it while it runs (lease-ahead).
        let next = state.next_step(now);
        // The delivered steps ride with the lease request as its report (one RPC, not two).
        if let Some((max, report)) = state.next_lease_carrying(now) {
            WorkerStats::add(&stats.steps_reported, report.len());
            WorkerStats::add(&stats.lease_requests, 1);
            stats
                .lease_batch
                .store(u64::from(state.batch_size()), Ordering::Relaxed);
            stats.lease_limit.store(
                u64::try_from(state.max_leases()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            let carried = !report.is_empty();
            let (client, tx, job) = (dispatcher.clone(), answers_tx.clone(), config.job);
            let shared = shared.clone();
            tokio::spawn(async move {
                let asked = Instant::now();
                let request = LeaseRequest {
                    job_id: job,
                    worker_id,
                    max_steps: max,
                    stage: stage_index,
                    completed: completed_steps(&report),
                };
                let answer = retrying("Lease", || {
                    let mut d = client.clone();
                    let request = request.clone();
                    async move { d.lease(request).await }
                })
                .await
                .map_err(|e| e.lost_if_unknown(worker_id));
                // Said at once, for a step waiting on a receiver that is gone with the job
                // (the dispatcher may exit right after this answer).
                if let Ok(LeaseResponse {
                    outcome: Some(Outcome::EndOfData(_)),
                    ..
                }) = &answer
                {
                    if let Ok(mut s) = shared.lock() {
                        s.end_of_data = true;
                    }
                }
                let _ = tx
                    .send(Answer::Lease(answer, asked.elapsed(), carried))
                    .await;
            });
        }
        if let Some(report) = state.next_report(now) {
            WorkerStats::add(&stats.steps_reported, report.len());
            WorkerStats::add(&stats.report_requests, 1);
            let (client, tx, job) = (dispatcher.clone(), answers_tx.clone(), config.job);
            tokio::spawn(async move {
                let request = complete_request(job, worker_id, stage_index, &report);
                let answer = retrying("Complete", || {
                    let mut d = client.clone();
                    let request = request.clone();
                    async move { d.complete(request).await }
                })
                .await
                .map_err(|e| e.lost_if_unknown(worker_id));
                let _ = tx.send(Answer::Report(answer)).await;
            });
        }
        // Run the next step; else send the burst (nothing more may join it now); else read
        // the awaited answers (nothing else to do).
        let acted = if let Some(held) = next {
            Some(
                run_step(
                    &ctx,
                    &mut state,
                    held,
                    &mut receiver,
                    &mut out,
                    &mut shutdown,
                )
                .await,
            )
        } else if !out.burst.is_empty() {
            Some(flush(&ctx, &mut state, &mut out, &mut shutdown).await)
        } else if !out.flight.is_empty() {
            Some(settle(&ctx, &mut state, &mut out, &mut shutdown).await)
        } else {
            None
        };
        if let Some(acted) = acted {
            let going = match acted {
                // The loop's next turn sees the end (what is held is dropped there).
                Err(ServiceError::JobEnded) => true,
                going => going?,
            };
            if !going {
                break WorkerEnd::Shutdown;
            }
            continue;
        }
        // Nothing to run: wait for an answer, a wait or an expiry to end, or a heartbeat's
        // news (draining), whichever comes first.
        let wake = state
            .wakeup()
            .map_or(now + IDLE_POLL, |t| t.min(now + IDLE_POLL));
        tokio::select! {
            () = &mut shutdown => break WorkerEnd::Shutdown,
            answer = answers.recv() => {
                if let Some(answer) = answer {
                    absorb(&mut state, answer, steps_per_epoch, Instant::now())?;
                }
            }
            () = tokio::time::sleep_until(wake.into()) => {}
        }
    };
    // Delivered steps are reported before the worker stops (a report in flight is waited
    // for), or the dispatcher would lease them again at their deadline only for the receiver
    // to drop them. A lease request in flight is not waited for: what it grants expires at
    // the dispatcher (or, once drained or at end of data, was never granted).
    // At end of data nothing is left to report: every step is consumed or void.
    let report_drain = if matches!(end, WorkerEnd::EndOfData) {
        Duration::ZERO
    } else {
        REPORT_DRAIN
    };
    let _ = tokio::time::timeout(report_drain, async {
        loop {
            if state.is_reporting() {
                match answers.recv().await {
                    Some(Answer::Report(_) | Answer::Lease(_, _, true)) => state.reported(),
                    Some(Answer::Lease(_, _, false)) => {}
                    None => break,
                }
                continue;
            }
            let Some(report) = state.take_report() else {
                break;
            };
            WorkerStats::add(&stats.steps_reported, report.len());
            WorkerStats::add(&stats.report_requests, 1);
            let request = complete_request(config.job, worker_id, stage_index, &report);
            if let Err(status) = dispatcher.clone().complete(request).await {
                tracing::debug!(%status, "last complete refused");
            }
            state.reported();
        }
    })
    .await;
    drop(heartbeat_guard);
    let steps = stats
        .steps_reported
        .load(Ordering::Relaxed)
        .saturating_sub(reported_before);
    tracing::info!(
        worker_id,
        steps,
        ?end,
        abandoned = state.abandoned(),
        "worker stops"
    );
    Ok(WorkerSummary {
        worker_id,
        stage: stage_index,
        steps,
        end,
        rejoined: 0,
    })
}

/// How long the idle loop waits before looking at the heartbeat's news again.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// How long a stopping worker waits for its last report to be answered.
const REPORT_DRAIN: Duration = Duration::from_secs(5);

/// An answer from one of the worker's RPC tasks.
enum Answer {
    /// The answer, the round trip, and whether the request carried a report.
    Lease(Result<LeaseResponse, ServiceError>, Duration, bool),
    Report(Result<CompleteResponse, ServiceError>),
}

/// A report of `delivered` steps of `stage` in one request.
fn complete_request(job: u64, worker: u64, stage: u32, delivered: &[Delivered]) -> CompleteRequest {
    CompleteRequest {
        job_id: job,
        worker_id: worker,
        stage,
        epoch: 0,
        step: 0,
        compute_us: 0,
        steps: completed_steps(delivered),
    }
}

/// Delivered steps as a report lists them: consecutive ones of a grant as runs.
fn completed_steps(delivered: &[Delivered]) -> Vec<CompletedStep> {
    let mut report = Vec::new();
    for d in delivered {
        let step = CompletedStep {
            epoch: d.epoch,
            step: d.step,
            compute_us: d.compute_us,
            deadline_ms: d.deadline_ms,
            run_steps: 0,
        };
        lode_proto::runs::push_completed(&mut report, step);
    }
    report
}

/// Feeds an RPC answer to the state.
#[allow(clippy::result_large_err)] // the worker's error, as its async callers return it
fn absorb(
    state: &mut WorkerState,
    answer: Answer,
    steps_per_epoch: std::num::NonZeroU64,
    now: Instant,
) -> Result<(), ServiceError> {
    match answer {
        Answer::Lease(answer, round_trip, carried) => {
            if carried {
                // The report rode with it: answered (or given up) with the lease.
                state.reported();
                if let Ok(a) = &answer {
                    if !a.refused.is_empty() {
                        tracing::debug!(refused = a.refused.len(), "complete refused some steps");
                    }
                }
            }
            let answer = answer?;
            if answer.max_leases > 0 {
                state.set_max_leases(answer.max_leases);
            }
            // A batch's runs unfolded into their steps (a lone lease is one step, or a run).
            let batch = match answer.outcome {
                Some(Outcome::Lease(lease)) => StepLeases { steps: vec![lease] },
                Some(Outcome::Leases(batch)) => batch,
                Some(Outcome::Wait(wait)) => {
                    let pause = Duration::from_millis(wait.retry_after_ms.clamp(1, 1000));
                    state.wait(pause, now);
                    return Ok(());
                }
                Some(Outcome::EndOfData(_)) => {
                    // Nothing the worker holds can still be delivered: the dispatcher answers
                    // end of data only once every step is consumed or the job was ended.
                    state.job_ended();
                    return Ok(());
                }
                Some(Outcome::Drained(_)) => {
                    state.ended(End::Drained);
                    return Ok(());
                }
                None => return Err(bad("lease", "no outcome")),
            };
            let leases = batch.into_leases().map_err(|e| bad("lease", e))?;
            // The deadlines on this machine's clock (the dispatcher's clock is not ours),
            // counted from when the request went out, so a slow answer errs on the safe side.
            let sent = now.checked_sub(round_trip).unwrap_or(now);
            let held = leases
                .into_iter()
                .map(|mut lease| {
                    // A step outside the job's numbering is the dispatcher's error, not a
                    // number to wrap or clamp.
                    let at =
                        lode_proto::step::StepRef::new(lease.epoch, lease.step, steps_per_epoch)
                            .map_err(|e| bad("lease", e))?;
                    Ok(HeldStep {
                        epoch: at.epoch,
                        step: at.in_epoch,
                        global: at.global,
                        expires: sent
                            + Duration::from_millis(lease.deadline_ms.saturating_sub(lease.now_ms)),
                        deadline_ms: lease.deadline_ms,
                        generation: lease.generation,
                        records: lease.take_records().map_err(|e| bad("lease", e))?,
                    })
                })
                .collect::<Result<_, ServiceError>>()?;
            state.leased(held, round_trip);
        }
        Answer::Report(answer) => {
            state.reported();
            match answer {
                Ok(answer) if !answer.refused.is_empty() => {
                    // The lease expired and went elsewhere, or the training side consumed the
                    // step before this report arrived (its watermark retired the lease): the
                    // receiver has the step either way, so this is routine, not a warning.
                    tracing::debug!(
                        refused = answer.refused.len(),
                        "complete refused some steps"
                    );
                }
                Ok(_) => {}
                Err(lost @ ServiceError::Lost { .. }) => return Err(lost),
                Err(status) => tracing::warn!(%status, "complete failed"),
            }
        }
    }
    Ok(())
}

/// What every step needs besides the state.
struct StepContext {
    job: u64,
    token: String,
    tls: Option<ClientTls>,
    stage_index: u32,
    stage: Arc<Stage>,
    pool: Arc<rayon::ThreadPool>,
    /// The stage runs on one thread (no parallel kernels): a short step may run in line.
    single_thread: bool,
    send_names: HashMap<u32, Vec<String>>,
    shared: Arc<Mutex<Shared>>,
    stats: Arc<WorkerStats>,
}

/// A step measured shorter than this is short. A short step runs in line on the worker's
/// runtime thread when the stage has one thread: handing a 40 µs step to a rayon thread and
/// back costs two wake-ups, and the idle rayon thread's spinning (`sched_yield`) besides, more
/// CPU than the step; a longer one goes to rayon so that it never holds up the heartbeat and
/// the RPC tasks. A short step's push answer is read after the next step ran (the receiver
/// takes the frame meanwhile, and the worker does not sleep waiting for it); a longer one's
/// at once.
pub const SHORT_STEP: Duration = Duration::from_millis(1);

/// Whether the worker's steps are short (see [`SHORT_STEP`]); unknown before the first.
fn is_short(state: &WorkerState) -> bool {
    state.step_time().is_some_and(|t| t < SHORT_STEP)
}

/// Runs the state's next step and adds its frame to the burst: fetch its inputs from earlier
/// stages and execute it (or take the frame a parked step kept); the burst goes out (see
/// [`flush`]) when the state says it is due or it holds [`BURST_BYTES`]. False when
/// `shutdown` completed first.
async fn run_step(
    ctx: &StepContext,
    state: &mut WorkerState,
    held: HeldStep,
    receiver: &mut Option<(String, ReceiverClient)>,
    out: &mut Outbox,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<bool, ServiceError> {
    let global = held.global;
    // A parked step was computed before the receiver's `RETRY`: its frame is sent again.
    let pending = match out.parked.remove(&global) {
        Some(pending) => pending,
        // A step back from parking holds no records (the state keeps none, see
        // `WorkerState::next_step`): its frame must be here, never a stage run on nothing.
        None if held.records.is_empty() => {
            return Err(bad(
                "the outbox",
                format!("step {global} came back from parking without its frame"),
            ))
        }
        None => match compute_step(ctx, state, held, receiver, shutdown).await? {
            Some(msg) => encode(ctx, out, msg)?,
            None => return Ok(false),
        },
    };
    out.burst.push(pending);
    if state.burst_due(Instant::now()) || out.burst.bytes >= BURST_BYTES {
        return flush(ctx, state, out, shutdown).await;
    }
    Ok(true)
}

/// Encodes a computed step's frame at once, for the receiver of the current connection (a
/// frame encoded for one on this machine is summed later if it has to go elsewhere), and frees
/// the tensors the frame does not send from their own memory while they are warm: the frame is
/// what the worker keeps until the receiver takes the step.
fn encode(
    ctx: &StepContext,
    out: &mut Outbox,
    mut msg: StepMessage,
) -> Result<Pending, lode_transfer::TransferError> {
    let local = out.plane.as_ref().is_some_and(|(_, c)| c.is_loopback());
    let frame = out.encoder.encode_owned_for(&mut msg, local)?;
    let step = msg.step;
    let releasing = Instant::now();
    drop(msg);
    WorkerStats::add_duration(&ctx.stats.release_ns, releasing.elapsed());
    Ok(Pending { step, frame })
}

/// The most frame bytes a burst holds: past this it goes out whatever its length.
const BURST_BYTES: usize = 2 << 20;

/// Sends the burst, after the answers to the one before are read (one burst's answers are
/// awaited at a time). Steps whose lease expired meanwhile are not sent, nor those the
/// receiver would refuse now ([`WorkerState::hold_back`]). A long step's answer is read at
/// once. False when `shutdown` completed first.
async fn flush(
    ctx: &StepContext,
    state: &mut WorkerState,
    out: &mut Outbox,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<bool, ServiceError> {
    if !settle(ctx, state, out, shutdown).await? {
        return Ok(false);
    }
    if !state.may_push(Instant::now()) {
        tracing::debug!(steps = out.burst.len(), "leases expired before the push");
        out.burst.clear();
        return Ok(true);
    }
    let mut frames = out.burst.take();
    // Steps the receiver would refuse now wait with the parked ones, unsent.
    for global in state.hold_back(Instant::now()) {
        if let Some(at) = frames.iter().position(|m| m.step == global) {
            out.parked.insert(global, frames.remove(at));
        }
    }
    let live: Vec<u64> = state.burst().collect();
    frames.retain(|p| live.contains(&p.step));
    if frames.is_empty() {
        return Ok(true);
    }
    out.flight = frames.into();
    out.flight_sent = false;
    // An unsent burst is sent again, after a reconnection, by `settle`.
    if let Err(e) = send_flight(ctx, out).await? {
        tracing::debug!(cause = %e, "receiver unavailable; retrying");
    }
    state.sent();
    // A long step's answer is read at once: overlapping it with the next step would save
    // little and hold the step's report back a whole step (past the consumer's watermark).
    if !is_short(state) {
        return settle(ctx, state, out, shutdown).await;
    }
    Ok(true)
}

/// Fetches the step's inputs from earlier stages and runs the stage (in line or on rayon);
/// None when `shutdown` completed first.
async fn compute_step(
    ctx: &StepContext,
    state: &mut WorkerState,
    held: HeldStep,
    receiver: &mut Option<(String, ReceiverClient)>,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<Option<StepMessage>, ServiceError> {
    let tls = ctx.tls.as_ref();
    let global = held.global;
    // Inputs from earlier stages, held by the receiver until the step is complete.
    let mut received: HashMap<String, Arc<Tensor>> = HashMap::new();
    for r in ctx.stage.recv_plan() {
        let client = receiver_client(&ctx.shared, receiver, &ctx.token, tls).await?;
        let from = u32::try_from(r.from_stage).map_err(|e| bad("plan", e))?;
        let answer = client
            .clone()
            .fetch(FetchRequest {
                job_id: ctx.job,
                stage: from,
                global_step: global,
            })
            .await
            .map_err(ServiceError::rpc("Fetch"))?
            .into_inner();
        if !answer.found {
            return Err(bad(
                "lease",
                format!("stage {from}'s part of step {global} is not at the receiver"),
            ));
        }
        let msg = StepDecoder::new(MAX_MESSAGE_BYTES as u64).decode(&answer.frame)?;
        let names = ctx.send_names.get(&from).cloned().unwrap_or_default();
        for (name, t) in names.into_iter().zip(msg.tensors) {
            received.insert(name, Arc::new(t));
        }
    }
    let sampled = cpu_sampled(global);
    let (output, compute, cpu) = if ctx.single_thread && is_short(state) {
        timed_stage(sampled, || {
            ctx.stage.run_step(StepInput {
                records: &held.records,
                received: &received,
            })
        })
    } else {
        // The stage runs as a rayon job (no tokio task per step); its answer comes back on
        // a oneshot channel.
        let (done, output) = tokio::sync::oneshot::channel();
        let run_stage = ctx.stage.clone();
        let records = held.records.clone();
        ctx.pool.spawn(move || {
            let timed = timed_stage(sampled, || {
                run_stage.run_step(StepInput {
                    records: &records,
                    received: &received,
                })
            });
            let _ = done.send(timed);
        });
        tokio::select! {
            () = &mut *shutdown => {
                state.drop_running();
                return Ok(None);
            }
            output = output => output.map_err(|_| ServiceError::Join("the stage's rayon job was dropped".into()))?,
        }
    };
    let output = output.map_err(|source| ServiceError::Step {
        stage: ctx.stage_index,
        step: global,
        epoch: held.epoch,
        source,
    })?;
    state.computed(compute);
    WorkerStats::add(&ctx.stats.steps_computed, 1);
    WorkerStats::add_duration(&ctx.stats.compute_ns, compute);
    if let Some(cpu) = cpu {
        WorkerStats::add_duration(&ctx.stats.stage_cpu_ns, cpu);
        WorkerStats::add(&ctx.stats.stage_cpu_steps, 1);
        WorkerStats::add_duration(&ctx.stats.stage_cpu_wall_ns, compute);
    }
    if let Some(t) = state.step_time() {
        ctx.stats.step_time_ns.store(
            u64::try_from(t.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
    let tensors = owned_tensors(output.tensors.unwrap_or_default());
    Ok(Some(StepMessage {
        job: ctx.job,
        stage: ctx.stage_index,
        step: global,
        epoch: held.epoch,
        records: held.records,
        tensors,
    }))
}

/// The sending side of a worker: the frame encoder, the data-plane connection, the burst's
/// frames (the state's `burst`, computed and not sent), the frames whose answers are awaited
/// (the state's `in_flight`, in the order sent) and the steps the receiver answered `RETRY`
/// (the state's parked steps, by global step).
struct Outbox {
    encoder: StepEncoder,
    plane: Option<(String, DataPlaneClient)>,
    burst: Burst,
    /// Kept until each one's answer is read, to be sent again on a new connection.
    flight: VecDeque<Pending>,
    /// Whether `flight` went out on the current connection (false after a lost one).
    flight_sent: bool,
    parked: HashMap<u64, Pending>,
    /// Time blocked reading the receiver's answers since the last burst went out: with the
    /// burst's own write, what automatic compression counts as waiting on the link.
    network_wait: Duration,
}

/// A computed step's frame, kept until the receiver takes the step.
struct Pending {
    /// The global step.
    step: u64,
    frame: OwnedFrame,
}

/// The burst's frames, in the order computed, and their bytes, counted as they join (not
/// summed again at every step).
#[derive(Default)]
struct Burst {
    frames: Vec<Pending>,
    bytes: usize,
}

impl Burst {
    fn push(&mut self, pending: Pending) {
        self.bytes += pending.frame.len();
        self.frames.push(pending);
    }

    fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    fn len(&self) -> usize {
        self.frames.len()
    }

    fn clear(&mut self) {
        self.frames.clear();
        self.bytes = 0;
    }

    /// The frames, leaving the burst empty (with room for as many).
    fn take(&mut self) -> Vec<Pending> {
        self.bytes = 0;
        let room = Vec::with_capacity(self.frames.capacity());
        std::mem::replace(&mut self.frames, room)
    }
}

/// Sends the frames in flight in one vectored write, connecting first. An unreachable
/// receiver is the inner error: the frames stay unsent and the connection is dropped, for the
/// caller to try again.
async fn send_flight(
    ctx: &StepContext,
    out: &mut Outbox,
) -> Result<Result<(), DataPlaneError>, ServiceError> {
    let tls = ctx.tls.as_ref();
    let client = data_plane_client(&ctx.shared, &mut out.plane, ctx.job, &ctx.token, tls).await?;
    if !client.is_loopback() {
        // Encoded for a receiver on this machine, before the connection moved elsewhere.
        for pending in &mut out.flight {
            pending.frame.sum();
        }
    }
    let loopback = client.is_loopback();
    let frames: Vec<&OwnedFrame> = out.flight.iter().map(|p| &p.frame).collect();
    let writing = Instant::now();
    match client.send_frames(&frames).await {
        Ok(()) => {
            let now = Instant::now();
            let bytes: usize = frames.iter().map(|f| f.len()).sum();
            WorkerStats::add(&ctx.stats.bursts_sent, 1);
            WorkerStats::add(&ctx.stats.frames_sent, frames.len());
            WorkerStats::add(&ctx.stats.bytes_sent, bytes);
            out.flight_sent = true;
            // How the burst went, for `auto` to weigh compressing against the link (a local
            // receiver always gets raw frames).
            let waited = std::mem::take(&mut out.network_wait) + (now - writing);
            if !loopback {
                let sample = LinkSample {
                    frames: u64::try_from(frames.len()).unwrap_or(u64::MAX),
                    bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
                    waited,
                };
                if let Some(chosen) = out.encoder.observe_link(sample, now) {
                    let (windows, trials) = out.encoder.auto_state().counts();
                    tracing::debug!(?chosen, windows, trials, "auto compression changed");
                }
            }
            Ok(Ok(()))
        }
        Err(e) if e.is_unreachable() => {
            out.plane = None;
            Ok(Err(e))
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads the receiver's answers to the frames in flight, in order, sending them (again)
/// first when they have not gone out, until each is taken, parked (the receiver answered
/// `RETRY`: its frame waits in the outbox while the worker runs other steps) or dropped (its
/// lease expired, or the receiver refused it). An unreachable receiver (a consumer
/// restarting) is retried at the address the heartbeat last reported. Returns false when
/// `shutdown` completes first.
async fn settle(
    ctx: &StepContext,
    state: &mut WorkerState,
    out: &mut Outbox,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<bool, ServiceError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(10);
    while !out.flight.is_empty() {
        if !out.flight_sent {
            if !state.may_resend(Instant::now()) {
                tracing::debug!(steps = out.flight.len(), "leases expired before the push");
                out.flight.clear();
                return Ok(true);
            }
            let live: Vec<u64> = state.in_flight().collect();
            out.flight.retain(|p| live.contains(&p.step));
            if let Err(e) = send_flight(ctx, out).await? {
                if started.elapsed() >= RECONNECT_WINDOW {
                    return Err(e.into());
                }
                tracing::debug!(cause = %e, "receiver unavailable; retrying");
                if !backoff(ctx, state, shutdown, &mut pause).await? {
                    return Ok(false);
                }
                continue;
            }
        }
        let Some((_, client)) = out.plane.as_mut() else {
            out.flight_sent = false;
            continue;
        };
        let reading = Instant::now();
        let answer = client.read_answer().await;
        out.network_wait += reading.elapsed();
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) if e.is_unreachable() && started.elapsed() < RECONNECT_WINDOW => {
                tracing::debug!(cause = %e, "receiver unavailable; retrying");
                out.plane = None;
                out.flight_sent = false;
                if !backoff(ctx, state, shutdown, &mut pause).await? {
                    return Ok(false);
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let Some(pending) = out.flight.pop_front() else {
            break;
        };
        let global = pending.step;
        let answered = match answer.status {
            PushStatus::Accepted | PushStatus::Duplicate => PushAnswer::Taken,
            PushStatus::Retry => {
                let pause = Duration::from_millis(answer.retry_after_ms.clamp(1, 1000));
                tracing::debug!(
                    step = global,
                    ?pause,
                    "the receiver is full: the step waits"
                );
                PushAnswer::Retry(pause)
            }
            PushStatus::Rejected | PushStatus::Unspecified => {
                tracing::error!(step = global, reason = %answer.reason, "the receiver refused the step");
                PushAnswer::Rejected
            }
        };
        match state.pushed(answered, Instant::now()) {
            PushNext::Done => out.encoder.recycle(pending.frame),
            PushNext::Drop => {
                tracing::debug!(
                    step = global,
                    "step dropped (lease expired under backpressure, or refused)"
                );
                out.encoder.recycle(pending.frame);
            }
            PushNext::Parked => {
                out.parked.insert(global, pending);
            }
        }
    }
    Ok(true)
}

/// Waits `pause` (doubled for the next time, up to 500 ms) before a receiver is tried again;
/// false when `shutdown` completes first. [`ServiceError::JobEnded`] once the job's data
/// ended (the receiver is gone with the job).
async fn backoff(
    ctx: &StepContext,
    state: &mut WorkerState,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
    pause: &mut Duration,
) -> Result<bool, ServiceError> {
    if shared_end_of_data(&ctx.shared) {
        return Err(ServiceError::JobEnded);
    }
    tokio::select! {
        () = &mut *shutdown => {
            state.drop_running();
            return Ok(false);
        }
        () = tokio::time::sleep(*pause) => {}
    }
    *pause = (*pause * 2).min(Duration::from_millis(500));
    Ok(true)
}

/// A connection to the receiver the dispatcher last named: waits until one is named (the
/// consumer may register after the workers) and reachable, and reconnects when the address
/// changed. `connect` dials an address; an error `down` says is "not up (yet, or any more)"
/// is retried, for at most [`RECONNECT_WINDOW`]; any other (a refused token) is returned.
async fn named_connection<'a, C, E, Fut>(
    shared: &Mutex<Shared>,
    cached: &'a mut Option<(String, C)>,
    connect: impl Fn(String) -> Fut,
    down: impl Fn(&E) -> bool,
) -> Result<&'a mut C, ServiceError>
where
    Fut: Future<Output = Result<C, E>>,
    ServiceError: From<E>,
{
    let mut failing_since = None;
    loop {
        let addr = named_receiver(shared)?;
        if addr.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        if cached.as_ref().is_some_and(|(known, _)| *known == addr) {
            break;
        }
        match connect(addr.clone()).await {
            Ok(client) => {
                *cached = Some((addr, client));
                break;
            }
            Err(e) if down(&e) => {
                // Wait for the heartbeat to name another, or for this one to come up.
                still_trying(&addr, &mut failing_since)?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    match cached {
        Some((_, client)) => Ok(client),
        None => Err(bad("receiver", "no connection")),
    }
}

/// The receiver's gRPC client (for `Fetch`), see [`named_connection`].
async fn receiver_client(
    shared: &Mutex<Shared>,
    cached: &mut Option<(String, ReceiverClient)>,
    token: &str,
    tls: Option<&ClientTls>,
) -> Result<ReceiverClient, ServiceError> {
    let client = named_connection(
        shared,
        cached,
        |addr| async move {
            let url = if addr.starts_with("http") {
                addr
            } else {
                format!("http://{addr}")
            };
            connect_receiver(&url, token, tls).await
        },
        lode_proto::service::ClientError::is_unreachable,
    )
    .await?;
    Ok(client.clone())
}

/// The receiver's data plane (for pushes), see [`named_connection`].
async fn data_plane_client<'a>(
    shared: &Mutex<Shared>,
    cached: &'a mut Option<(String, DataPlaneClient)>,
    job: u64,
    token: &str,
    tls: Option<&ClientTls>,
) -> Result<&'a mut DataPlaneClient, ServiceError> {
    named_connection(
        shared,
        cached,
        |addr| async move { DataPlaneClient::connect(&addr, job, token, tls).await },
        DataPlaneError::is_unreachable,
    )
    .await
}

/// How long a worker keeps retrying an RPC whose peer is unreachable (a dispatcher or
/// receiver restarting) before it gives up.
pub const RECONNECT_WINDOW: Duration = Duration::from_secs(30);

/// [`retry_unreachable`] within [`RECONNECT_WINDOW`], naming the RPC in its error.
async fn retrying<T, F, Fut>(name: &'static str, rpc: F) -> Result<T, ServiceError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    retry_unreachable(RECONNECT_WINDOW, rpc)
        .await
        .map_err(ServiceError::rpc(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampled_stage_counts_its_cpu_and_not_its_waits() {
        let (out, wall, cpu) = timed_stage(true, || {
            std::thread::sleep(Duration::from_millis(30));
            7
        });
        assert_eq!(out, 7);
        assert!(wall >= Duration::from_millis(30), "{wall:?}");
        let cpu = cpu.expect("sampled");
        assert!(
            cpu < Duration::from_millis(10),
            "asleep, yet {cpu:?} of CPU"
        );
    }

    #[test]
    fn a_sampled_stage_counts_the_cpu_it_works() {
        let (sum, wall, cpu) = timed_stage(true, || {
            let started = thread_cpu();
            let mut x = 0u64;
            while thread_cpu().saturating_sub(started) < Duration::from_millis(20) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            x
        });
        assert!(sum > 0);
        let cpu = cpu.expect("sampled");
        assert!(cpu >= Duration::from_millis(19), "{cpu:?}");
        // One thread's CPU time cannot pass the wall time it ran in.
        assert!(
            cpu <= wall + Duration::from_millis(1),
            "{cpu:?} over {wall:?}"
        );
    }

    #[test]
    fn one_step_in_sixty_four_is_sampled_and_not_every_sixty_fourth() {
        let sampled: Vec<u64> = (0..64_000).filter(|&g| cpu_sampled(g)).collect();
        assert!((900..1100).contains(&sampled.len()), "{}", sampled.len());
        // Spread over a burst's positions (up to 32 steps), not stuck on one.
        let mut positions = [0u32; 32];
        for g in &sampled {
            positions[usize::try_from(g % 32).expect("small")] += 1;
        }
        assert!(positions.iter().all(|&n| n > 10), "{positions:?}");
    }

    #[test]
    fn an_unsampled_stage_is_timed_by_the_wall_clock_only() {
        let ((), wall, cpu) = timed_stage(false, || std::thread::sleep(Duration::from_millis(5)));
        assert!(wall >= Duration::from_millis(5));
        assert_eq!(cpu, None);
    }
}
