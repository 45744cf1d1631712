//! The tonic handlers: check the token and job, decode, change the state through
//! [`Core::apply`] (which journals before returning), encode.

// tonic's handlers return `tonic::Status` by value; helpers that produce one do the same
// rather than box it only to unbox it at the handler.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lode_proto::service::v1::{self, dispatcher_server::Dispatcher, lease_response::Outcome};
use prost::bytes::Bytes;
use std::collections::BTreeSet;
use tokio::sync::Mutex;

use tonic::{Request, Response, Status};

use super::clock::Clock;
use super::convert::{self, StageChoice};
use super::core::{ApplyError, Core};
use super::{
    FINISHED_RETRY_AFTER, LEASE_RETRY_AFTER, MAX_ADDR_BYTES, MAX_MESSAGE_BYTES,
    MAX_STEPS_PER_REQUEST, MAX_WORKERS_PER_JOB, MAX_WORKER_NAME_BYTES,
};
use crate::{
    Command, Error, Event, GrantedBatch, JobId, StageId, StepId, Time, WorkerId, WorkerStatus,
};

/// The dispatcher's gRPC service for one job. Cheap to clone: clones share one [`Core`].
#[derive(Clone)]
pub(crate) struct DispatcherService {
    inner: Arc<Inner>,
}

struct Inner {
    job: JobId,
    token: String,
    plan_json: String,
    /// Per stage; `Bytes` so that each registration shares it rather than copying it.
    stage_graphs: Vec<Bytes>,
    heartbeat_interval: Duration,
    lease_duration_ms: u64,
    steps_per_epoch: u64,
    /// The most steps one `Lease` answer carries: [`MAX_STEPS_PER_REQUEST`], fewer when the
    /// job's batches are so large that as many would not fit a message.
    max_steps: u32,
    /// A worker silent for longer than this is lost.
    silence_ms: u64,
    clock: Arc<dyn Clock>,
    /// Where the clock resumes: the journal's last time.
    resume_at: Time,
    core: Arc<Mutex<Core>>,
    /// [`Core::finished`], as of the last change.
    finished: tokio::sync::watch::Sender<bool>,
}

/// What a change must reach before it is answered (the crate docs' "Durability" says why
/// each request gets the one it gets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// The journal is on disk through the change's line (`fdatasync`, shared by group commit).
    Synced,
    /// The change's line is written to the file (the page cache): it survives a kill of the
    /// process at any instant; what an OS crash may take is bounded by the next synced change
    /// or tick, and is recomputed (see the crate docs).
    Written,
}

/// What [`DispatcherService::new`] needs beyond the core.
pub(crate) struct Parts {
    pub(crate) job: JobId,
    pub(crate) token: String,
    pub(crate) plan_json: String,
    pub(crate) stage_graphs: Vec<Bytes>,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) missed_heartbeats: u32,
    pub(crate) clock: Arc<dyn Clock>,
}

impl fmt::Debug for DispatcherService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DispatcherService")
            .field("job", &self.inner.job)
            .finish_non_exhaustive()
    }
}

impl DispatcherService {
    pub(crate) fn new(parts: Parts, core: Core, resume_at: Time) -> Self {
        let interval = u64::try_from(parts.heartbeat_interval.as_millis()).unwrap_or(u64::MAX);
        let config = core.state().config();
        let lease_duration_ms =
            u64::try_from(config.lease_duration.as_millis()).unwrap_or(u64::MAX);
        let steps_per_epoch = config.steps_per_epoch();
        // A lease answer carries at most 10 bytes a record, plus a little per step.
        let per_step = config.batch_size.saturating_mul(10).saturating_add(64);
        let fit = u64::try_from(MAX_MESSAGE_BYTES).unwrap_or(u64::MAX) / per_step.max(1);
        let max_steps = u32::try_from(fit)
            .unwrap_or(u32::MAX)
            .clamp(1, MAX_STEPS_PER_REQUEST);
        Self {
            inner: Arc::new(Inner {
                job: parts.job,
                token: parts.token,
                plan_json: parts.plan_json,
                stage_graphs: parts.stage_graphs,
                heartbeat_interval: parts.heartbeat_interval,
                lease_duration_ms,
                steps_per_epoch,
                max_steps,
                silence_ms: interval.saturating_mul(u64::from(parts.missed_heartbeats)),
                clock: parts.clock,
                resume_at,
                finished: tokio::sync::watch::Sender::new(core.finished()),
                core: Arc::new(Mutex::new(core)),
            }),
        }
    }

    /// Whether the job is finished and everyone in it knows (see [`Core::finished`]).
    pub(crate) fn finished(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.finished.subscribe()
    }

    /// The dispatcher's clock: the journal's last time plus the time since the service started.
    fn now(&self) -> Time {
        let elapsed = u64::try_from(self.inner.clock.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.inner.resume_at.saturating_add_millis(elapsed)
    }

    /// Runs `change` on the core under the lock and answers as `durability` says (see the
    /// crate docs, "Durability"). The time is read under the lock, so the journal's times never
    /// go backwards. The change runs to its end even if the caller is dropped: a journaled
    /// change is never half done.
    ///
    /// The change runs inline, on this task: it touches in-memory state and appends one short
    /// line to the page cache, and a hop to a blocking thread while holding the lock would
    /// make every other request wait for that thread to be scheduled. A
    /// [`Durability::Synced`] change then waits, after the lock is released, on a blocking
    /// thread until the journal is on disk through its line (one `fdatasync` shared by every
    /// change written before it: group commit).
    async fn mutate<T, F>(&self, durability: Durability, change: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&mut Core, Time) -> Result<T, Status> + Send + 'static,
    {
        let mut core = self.inner.core.lock().await;
        let now = self.now();
        let result = change(&mut core, now);
        let finished = core.finished();
        self.inner.finished.send_if_modified(|was| {
            let changed = *was != finished;
            *was = finished;
            changed
        });
        if durability == Durability::Written {
            return result;
        }
        let sync = core.sync_point();
        // The lock goes here; the journal lines this change wrote are still to be synced.
        drop(core);
        let offset = sync.written();
        let synced = tokio::task::spawn_blocking(move || sync.sync_to(offset))
            .await
            .map_err(|err| Status::internal(format!("dispatcher task failed: {err}")))?;
        if let Err(err) = synced {
            tracing::error!(cause = %err, "journal sync failed; refusing further changes until restart");
            return Err(Status::unavailable(
                "the dispatcher's journal failed; it accepts no changes until it restarts",
            ));
        }
        result
    }

    /// Reads the core under the lock.
    async fn read<T>(&self, read: impl FnOnce(&Core, Time) -> T) -> T {
        let core = self.inner.core.lock().await;
        read(&core, self.now())
    }

    /// Waits until no change is in flight (the last journal write is on disk).
    pub(crate) async fn quiesce(&self) {
        let sync = self.inner.core.lock().await.sync_point();
        let _ = tokio::task::spawn_blocking(move || sync.sync_to(sync.written())).await;
    }

    /// Expires leases and declares silent workers lost; called by the ticker.
    pub(crate) async fn tick(&self) -> Result<(), Status> {
        let silence_ms = self.inner.silence_ms;
        // Synced: the ticker's sync is also the periodic one that bounds what an OS crash can
        // take of the changes answered without one.
        self.mutate(Durability::Synced, move |core, now| {
            core.tick(now, silence_ms).map_err(Status::from)
        })
        .await
    }

    /// Checks the token, then the job, before anything else: a refused request touches no
    /// state.
    fn authorize<T>(
        &self,
        rpc: &'static str,
        request: &Request<T>,
        job_id: u64,
    ) -> Result<(), Status> {
        lode_proto::service::authorize(
            request,
            rpc,
            &self.inner.token,
            (self.inner.job.0, job_id),
            "dispatcher",
        )
    }
}

#[tonic::async_trait]
impl Dispatcher for DispatcherService {
    async fn register(
        &self,
        request: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterResponse>, Status> {
        self.authorize("Register", &request, request.get_ref().job_id)?;
        let req = request.into_inner();
        let choice = StageChoice::try_from(req.stage)?;
        if req.worker_name.len() > MAX_WORKER_NAME_BYTES {
            return Err(Status::invalid_argument(format!(
                "worker_name: longer than {MAX_WORKER_NAME_BYTES} bytes"
            )));
        }
        let protocol_version = req.protocol_version;
        let name = req.worker_name.clone();
        let (worker, stage, receiver_addr, max_leases) = self
            .mutate(Durability::Synced, move |core, now| {
                if core.state().workers().count() >= MAX_WORKERS_PER_JOB {
                    return Err(Status::resource_exhausted(format!(
                        "the job has {MAX_WORKERS_PER_JOB} workers, the most a job may have"
                    )));
                }
                let stage = match choice {
                    StageChoice::Any => core.least_staffed_stage(),
                    StageChoice::Stage(stage) => stage,
                };
                let worker = core.allocate_worker();
                let command = Command::RegisterWorker {
                    worker,
                    stage,
                    protocol_version,
                };
                core.apply(command, now)?;
                core.names.insert(worker, name);
                // Names of workers lost or gone are dropped here, so the map stays bounded.
                let live: BTreeSet<WorkerId> = core.state().workers().map(|(w, _)| w).collect();
                core.names.retain(|w, _| live.contains(w));
                core.worker_counters.retain(|w, _| live.contains(w));
                Ok((
                    worker,
                    stage,
                    core.receiver_addr().to_owned(),
                    core.lease_limit(worker),
                ))
            })
            .await
            .inspect_err(|status| {
                tracing::warn!(name = ?req.worker_name, cause = %status.message(), "registration refused");
            })?;
        tracing::info!(%worker, %stage, name = ?req.worker_name, "worker registered");
        let stage_graph = usize::try_from(stage.0)
            .ok()
            .and_then(|i| self.inner.stage_graphs.get(i))
            .cloned()
            .ok_or_else(|| Status::internal(format!("{stage} has no graph")))?;
        Ok(Response::new(v1::RegisterResponse {
            worker_id: worker.0,
            stage: stage.0,
            plan_json: self.inner.plan_json.clone(),
            stage_graph,
            receiver_addr,
            lease_duration_ms: self.inner.lease_duration_ms,
            heartbeat_interval_ms: u64::try_from(self.inner.heartbeat_interval.as_millis())
                .unwrap_or(u64::MAX),
            max_leases,
            steps_per_epoch: self.inner.steps_per_epoch,
        }))
    }

    async fn lease(
        &self,
        request: Request<v1::LeaseRequest>,
    ) -> Result<Response<v1::LeaseResponse>, Status> {
        self.authorize("Lease", &request, request.get_ref().job_id)?;
        let req = request.into_inner();
        let worker = WorkerId(req.worker_id);
        // 0 and 1 ask for one step, answered as `lease` (the protocol before batches).
        let batched = req.max_steps > 1;
        let max = req.max_steps.clamp(1, self.inner.max_steps);
        let completed = report_steps(&req.completed)?;
        let stage = StageId(req.stage);
        let (outcome, max_leases, refused) = self
            .mutate(Durability::Written, move |core, now| {
                // The report first: the steps it completes no longer count against the
                // worker's limit when the lease is granted. A drained worker holds nothing.
                let refused = if completed.is_empty() || core.is_drained(worker) {
                    Vec::new()
                } else {
                    complete_steps(core, now, worker, stage, &completed)?
                };
                let outcome = lease_outcome(core, now, worker, max, batched)?;
                Ok((outcome, core.lease_limit(worker), refused))
            })
            .await?;
        Ok(Response::new(v1::LeaseResponse {
            outcome: Some(outcome),
            max_leases,
            refused,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<v1::HeartbeatRequest>,
    ) -> Result<Response<v1::HeartbeatResponse>, Status> {
        self.authorize("Heartbeat", &request, request.get_ref().job_id)?;
        let worker = WorkerId(request.into_inner().worker_id);
        let (draining, receiver_addr, end_of_data, generation) = self
            .mutate(Durability::Written, move |core, now| {
                let addr = core.receiver_addr().to_owned();
                let generation = core.state().generation();
                if core.is_drained(worker) {
                    return Ok((true, addr, false, generation));
                }
                core.apply(Command::Heartbeat { worker }, now)?;
                let draining = core
                    .state()
                    .worker(worker)
                    .is_some_and(|info| info.status == WorkerStatus::Draining);
                let end_of_data = core.state().is_end_of_data();
                if end_of_data {
                    core.told_worker_end(worker);
                }
                Ok((draining, addr, end_of_data, generation))
            })
            .await?;
        Ok(Response::new(v1::HeartbeatResponse {
            draining,
            receiver_addr,
            end_of_data,
            generation,
        }))
    }

    async fn complete(
        &self,
        request: Request<v1::CompleteRequest>,
    ) -> Result<Response<v1::CompleteResponse>, Status> {
        self.authorize("Complete", &request, request.get_ref().job_id)?;
        let req = request.into_inner();
        let worker = WorkerId(req.worker_id);
        let stage = StageId(req.stage);
        if req.steps.is_empty() {
            // One step, refused as a whole when the worker does not hold it (the protocol
            // before batches).
            let command = Command::Complete {
                worker,
                stage,
                step: StepId::new(req.epoch, req.step),
            };
            let compute_us = req.compute_us;
            self.mutate(Durability::Written, move |core, now| {
                core.apply(command, now)?;
                core.count_completed(worker, 1, compute_us);
                Ok(())
            })
            .await?;
            return Ok(Response::new(v1::CompleteResponse::default()));
        }
        let steps = report_steps(&req.steps)?;
        let refused = self
            .mutate(Durability::Written, move |core, now| {
                complete_steps(core, now, worker, stage, &steps)
            })
            .await?;
        Ok(Response::new(v1::CompleteResponse { refused }))
    }

    async fn consumed(
        &self,
        request: Request<v1::ConsumedRequest>,
    ) -> Result<Response<v1::ConsumedResponse>, Status> {
        self.authorize("Consumed", &request, request.get_ref().job_id)?;
        let req = request.into_inner();
        let watermark = StepId::new(req.epoch, req.step);
        let (busy_us, end_job, window) = (req.busy_us, req.end_job, req.window);
        let (events, end_of_data) = self
            .mutate(Durability::Synced, move |core, now| {
                if window > 0 {
                    core.set_receiver_window(window);
                }
                let mut events = match core.apply(Command::Consumed { watermark }, now) {
                    Ok(events) => events,
                    // After a crash that lost grants answered without a sync, the training side
                    // may have consumed steps this dispatcher no longer remembers leasing; they
                    // are leased again (and dropped by the receiver) within moments, so the
                    // report is retryable rather than refused.
                    Err(ApplyError::State(err @ Error::WatermarkAhead { .. })) => {
                        return Err(Status::unavailable(err.to_string()));
                    }
                    Err(err) => return Err(err.into()),
                };
                core.counters.consumer_busy_us =
                    core.counters.consumer_busy_us.saturating_add(busy_us);
                if end_job {
                    events.extend(core.apply(Command::EndJob { last: watermark }, now)?);
                }
                let end_of_data = core.state().is_end_of_data();
                if end_of_data {
                    core.told_consumer_end();
                }
                Ok((events, end_of_data))
            })
            .await?;
        match events.last() {
            Some(Event::EndOfData { last }) => {
                tracing::info!(%last, "end of data: the training side consumed the last step");
            }
            Some(Event::JobEnded { last }) => {
                tracing::info!(%last, "end of data: the training side ended the job");
            }
            _ => {}
        }
        Ok(Response::new(v1::ConsumedResponse { end_of_data }))
    }

    async fn register_consumer(
        &self,
        request: Request<v1::RegisterConsumerRequest>,
    ) -> Result<Response<v1::RegisterConsumerResponse>, Status> {
        self.authorize("RegisterConsumer", &request, request.get_ref().job_id)?;
        let request = request.into_inner();
        let resume = request.resume_from.map(|s| StepId::new(s.epoch, s.step));
        let addr = request.receiver_addr;
        // 0: not said (an older training side); the default is assumed.
        let window = Some(request.window).filter(|&w| w > 0);
        if addr.is_empty() || addr.len() > MAX_ADDR_BYTES {
            return Err(Status::invalid_argument(format!(
                "receiver_addr: must be 1 to {MAX_ADDR_BYTES} bytes"
            )));
        }
        tracing::info!(receiver = ?addr, "consumer registered");
        let (first_step, end_of_data) = self
            .mutate(Durability::Synced, move |core, now| {
                core.register_consumer(addr, window, now)?;
                if let Some(next) = resume {
                    core.apply(Command::Rewind { next }, now)?;
                }
                // The new receiver holds nothing: what the last one buffered is redone.
                core.apply(Command::ReceiverReset, now)?;
                let end_of_data = core.state().is_end_of_data();
                if end_of_data {
                    core.told_consumer_end();
                }
                Ok((core.first_unconsumed(), end_of_data))
            })
            .await?;
        Ok(Response::new(v1::RegisterConsumerResponse {
            first_step: Some(convert::step_ref(first_step)),
            plan_json: self.inner.plan_json.clone(),
            end_of_data,
            steps_per_epoch: self.inner.steps_per_epoch,
        }))
    }

    async fn drain(
        &self,
        request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        self.authorize("Drain", &request, request.get_ref().job_id)?;
        let worker = WorkerId(request.into_inner().worker_id);
        self.mutate(Durability::Synced, move |core, now| {
            if !core.is_drained(worker) {
                core.apply(Command::Drain { worker }, now)?;
            }
            Ok(())
        })
        .await?;
        tracing::info!(%worker, "worker draining");
        Ok(Response::new(v1::DrainResponse {}))
    }

    async fn status(
        &self,
        request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        self.authorize("Status", &request, request.get_ref().job_id)?;
        let status = self
            .read(|core, now| {
                let state = core.state();
                let epoch = core.first_unconsumed().epoch.0;
                v1::StatusResponse {
                    epoch,
                    watermark: state.watermark().map(convert::step_ref),
                    end_of_data: state.is_end_of_data(),
                    workers: state
                        .workers()
                        .map(|(worker, info)| {
                            let mut entry = convert::worker_entry(worker, info);
                            entry.name = core.names.get(&worker).cloned().unwrap_or_default();
                            if let Some(c) = core.worker_counters.get(&worker) {
                                entry.steps_computed = c.steps_computed;
                                entry.compute_us = c.compute_us;
                            }
                            entry
                        })
                        .collect(),
                    leases: state
                        .leases()
                        .into_iter()
                        .map(|(stage, step, lease)| convert::lease_entry(stage, step, lease))
                        .collect(),
                    steps_consumed: core.steps_consumed(),
                    steps_per_epoch: state.steps_per_epoch(),
                    now_ms: now.as_millis(),
                    epochs: state.config().epochs.unwrap_or(0),
                    steps_computed: core.counters.steps_computed,
                    compute_us: core.counters.compute_us,
                    consumer_busy_us: core.counters.consumer_busy_us,
                    stages: state.config().stages,
                    journal_bytes: core.journal_bytes(),
                    journal_compactions: core.counters.journal_compactions,
                }
            })
            .await;
        Ok(Response::new(status))
    }
}

/// A report's steps as (step, compute µs, grant deadline ms), its runs unfolded, within the
/// limit of a request.
#[allow(clippy::result_large_err)] // tonic's handlers answer with a `Status` as it is
fn report_steps(steps: &[v1::CompletedStep]) -> Result<Vec<(StepId, u64, u64)>, Status> {
    if steps.len() > usize::try_from(MAX_STEPS_PER_REQUEST).unwrap_or(usize::MAX) {
        return Err(Status::invalid_argument(format!(
            "steps: {} exceed the {MAX_STEPS_PER_REQUEST}-step limit of a request",
            steps.len()
        )));
    }
    let steps = lode_proto::runs::expand_completed(steps)
        .map_err(|e| Status::invalid_argument(format!("steps: {e}")))?;
    Ok(steps
        .iter()
        .map(|s| (StepId::new(s.epoch, s.step), s.compute_us, s.deadline_ms))
        .collect())
}

/// Completes `steps` (step, compute µs, grant deadline ms) of `worker`'s `stage`, as a
/// report lists them; the ones it does not hold (any more) and the training side has not
/// consumed are returned, refused.
fn complete_steps(
    core: &mut Core,
    now: Time,
    worker: WorkerId,
    stage: StageId,
    steps: &[(StepId, u64, u64)],
) -> Result<Vec<v1::StepRef>, Status> {
    // A report that names the grant it was delivered under completes only that
    // grant (see `CompletedStep.deadline_ms`).
    let current = |step: StepId, deadline_ms: u64| {
        deadline_ms == 0
            || core
                .state()
                .lease(stage, step)
                .is_some_and(|l| l.worker == worker && l.deadline.as_millis() == deadline_ms)
    };
    let listed: Vec<StepId> = steps
        .iter()
        .filter(|(step, _, deadline_ms)| current(*step, *deadline_ms))
        .map(|(step, _, _)| *step)
        .collect();
    let command = Command::CompleteSteps {
        worker,
        stage,
        steps: listed,
    };
    let events = core.apply(command, now)?;
    let done: BTreeSet<StepId> = events
        .iter()
        .filter_map(|e| match e {
            Event::StepCompleted { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    // The compute counters measure the worker (the scheduler's per-worker rate):
    // a step the training side consumed before its report came was computed and
    // delivered by this worker all the same, so it counts, though its lease is gone.
    let watermark = core.state().watermark();
    let (computed, compute_us) = steps
        .iter()
        .filter(|(step, _, _)| done.contains(step) || watermark.is_some_and(|w| *step <= w))
        .fold((0u64, 0u64), |(n, sum), (_, us, _)| {
            (n + 1, sum.saturating_add(*us))
        });
    core.count_completed(worker, computed, compute_us);
    // A step the training side consumed first is not refused: its report is moot, not wrong.
    // (A worker on short steps reports hundreds of steps a lease request, mostly after the
    // watermark passed them: listing them all made every lease answer carry the whole report
    // back, to be decoded and dropped.)
    Ok(steps
        .iter()
        .filter(|(step, _, _)| !done.contains(step) && watermark.is_none_or(|w| *step > w))
        .map(|(step, _, _)| convert::step_ref(*step))
        .collect())
}

/// The outcome of a lease request (see `Dispatcher::lease`), within `worker`'s share of the
/// receiver's window.
fn lease_outcome(
    core: &mut Core,
    now: Time,
    worker: WorkerId,
    max: u32,
    batched: bool,
) -> Result<Outcome, Status> {
    let wait = |pause: std::time::Duration| {
        Outcome::Wait(v1::Wait {
            retry_after_ms: u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
        })
    };
    if core.is_drained(worker) {
        return Ok(Outcome::Drained(v1::Drained {}));
    }
    if core.state().is_end_of_data() {
        core.told_worker_end(worker);
        return Ok(Outcome::EndOfData(v1::EndOfData {}));
    }
    // Expiry happens on ticks only: tick first, so that a step whose deadline
    // passed since the last background tick is leased again now.
    core.apply(Command::Tick, now)?;
    // Within its share of the receiver's window: a worker over it (another one joined)
    // leases nothing until it holds less, except a returned step (a lost worker's, which the
    // training side is likely waiting for, while every other worker sits on steps the full
    // window parks): one at a time, so a worker holds at most its share plus what was
    // returned. Otherwise the answer tells it its limit and a pause (a worker asks at its
    // limit only when everything it holds is parked).
    let max = match core.state().worker(worker) {
        Some(info) => {
            let held = u32::try_from(info.lease_count()).unwrap_or(u32::MAX);
            let limit = core.lease_limit(worker);
            if held >= limit {
                if !core.state().has_returned(info.stage) {
                    return Ok(wait(LEASE_RETRY_AFTER));
                }
                1
            } else {
                max.min(limit - held)
            }
        }
        None => max,
    };
    match core.apply(Command::RequestLeases { worker, max }, now) {
        Ok(events) => {
            let generation = core.state().generation();
            let mut steps: Vec<v1::StepLease> = events
                .into_iter()
                .filter_map(|event| match event {
                    Event::LeaseGranted {
                        stage,
                        step,
                        deadline,
                        batch: GrantedBatch::Records(records),
                        ..
                    } => Some(Ok(v1::StepLease {
                        generation,
                        ..convert::step_lease(stage, step, records, deadline, now)
                    })),
                    // A grant made now has its ids; only one read back from the journal
                    // lacks them.
                    Event::LeaseGranted { step, .. } => Some(Err(Status::internal(format!(
                        "the grant of {step} came without its records"
                    )))),
                    _ => None,
                })
                .collect::<Result<_, Status>>()?;
            if batched {
                // Consecutive steps granted together travel as runs.
                Ok(Outcome::Leases(v1::StepLeases::from_leases(steps)))
            } else {
                steps
                    .pop()
                    .map(Outcome::Lease)
                    .ok_or_else(|| Status::internal("a lease request granted no lease"))
            }
        }
        Err(ApplyError::State(
            Error::NoStepReady { .. } | Error::LeaseLimit { .. } | Error::Draining { .. },
        )) => Ok(wait(LEASE_RETRY_AFTER)),
        Err(ApplyError::State(Error::StageFinished { .. })) => {
            if core.state().is_end_of_data() {
                core.told_worker_end(worker);
                return Ok(Outcome::EndOfData(v1::EndOfData {}));
            }
            // Every step of the stage is done, and not yet every step consumed: one may come
            // back (a receiver restart returns what it held, a rewind what it passes), and
            // this worker is who would redo it. Ended, it would leave a restarted training
            // side waiting for steps no one computes. It waits; the end of data ends it (its
            // heartbeat says so).
            Ok(wait(FINISHED_RETRY_AFTER))
        }
        // The tick above may have drained it (its last lease expired).
        Err(ApplyError::State(Error::UnknownWorker { .. })) if core.is_drained(worker) => {
            Ok(Outcome::Drained(v1::Drained {}))
        }
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod tests {
    use lode_proto::service::constant_time_eq;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"token", b"token"));
        assert!(!constant_time_eq(b"token", b"tokem"));
        assert!(!constant_time_eq(b"token", b"token2"));
        assert!(constant_time_eq(b"", b""));
    }
}
