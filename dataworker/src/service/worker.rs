//! The data-worker loop: register with the job's dispatcher, load the stage it assigns, then
//! lease → read the records (or fetch the earlier stage's tensors) → execute on rayon → push
//! one frame to the receiver over its data plane ([`super::data_plane`]) → report the step
//! complete; heartbeat meanwhile; stop at end of data, when drained, or on shutdown.
//!
//! A step is reported complete only after the receiver accepted its frame (or already had
//! it), so a worker killed at any point loses nothing: its lease expires or its silence gets
//! it declared lost, and the step is leased again and recomputed from the same index batch.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lode_proto::plan::Plan;
use lode_proto::service::v1::lease_response::Outcome;
use lode_proto::service::v1::{
    CompleteRequest, FetchRequest, HeartbeatRequest, LeaseRequest, PushStatus, RegisterRequest,
};
use lode_proto::service::{
    connect, connect_receiver, retry_unreachable, ReceiverClient, MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
};
use lode_proto::tf::graph::GraphDef;
use lode_proto::tls::ClientTls;

use super::data_plane::{DataPlaneClient, DataPlaneError};
use super::ServiceError;
use crate::exec::{ExecOptions, Stage, StepInput};
use crate::tensor::Tensor;
use crate::transfer::{CodecConfig, Compression, StepDecoder, StepEncoder, StepMessage};

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
    pub worker_id: u64,
    pub stage: u32,
    pub steps: u64,
    pub end: WorkerEnd,
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
    /// When the dispatcher last answered (registration or heartbeat).
    heard: std::time::Instant,
}

/// The receiver address the dispatcher last named (empty until a consumer registered), or an
/// error once the dispatcher has not answered for [`RECONNECT_WINDOW`]: the job is gone, and a
/// worker waiting for a receiver would otherwise wait forever.
#[allow(clippy::result_large_err)] // the worker's error, as its async callers return it
fn named_receiver(shared: &Mutex<Shared>) -> Result<String, ServiceError> {
    let (addr, heard) = shared
        .lock()
        .map(|s| (s.receiver_addr.clone(), s.heard))
        .map_err(|_| bad("worker", "shared state poisoned"))?;
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
    tracing::info!(worker_id, stage = stage_index, "registered");
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

    let shared = Arc::new(Mutex::new(Shared {
        receiver_addr: reg.receiver_addr.clone(),
        draining: false,
        heard: std::time::Instant::now(),
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
                            if !answer.receiver_addr.is_empty() {
                                s.receiver_addr = answer.receiver_addr;
                            }
                        }
                    }
                    Err(status) => tracing::warn!(%status, "heartbeat failed"),
                }
            }
        })
    };

    let mut encoder = StepEncoder::new(CodecConfig {
        compression: config.compression,
        max_message_bytes: MAX_MESSAGE_BYTES as u64,
    });
    // gRPC for `Fetch`; the data plane for pushes.
    let mut receiver: Option<(String, ReceiverClient)> = None;
    let mut plane: Option<(String, DataPlaneClient)> = None;
    let mut steps = 0u64;
    let steps_per_epoch = reg.steps_per_epoch.max(1);
    tokio::pin!(shutdown);
    let lease_rpc = {
        let dispatcher = dispatcher.clone();
        let job = config.job;
        move || {
            let dispatcher = dispatcher.clone();
            async move {
                retrying("Lease", || {
                    let mut d = dispatcher.clone();
                    async move {
                        d.lease(LeaseRequest {
                            job_id: job,
                            worker_id,
                        })
                        .await
                    }
                })
                .await
            }
        }
    };
    // The next lease, asked for while the current step runs (lease-ahead), so that a step's
    // lease round trip and the dispatcher's journal sync overlap the work of the one before.
    let mut next_lease: Option<tokio::task::JoinHandle<Result<_, ServiceError>>> = None;
    // Completions in flight: a step is reported after its frame was taken, without holding up
    // the next step; all are awaited before the worker stops.
    let mut completions = tokio::task::JoinSet::new();
    let end = loop {
        let pending = next_lease.take();
        let lease = tokio::select! {
            () = &mut shutdown => break WorkerEnd::Shutdown,
            answer = async {
                match pending {
                    Some(handle) => handle
                        .await
                        .map_err(|e| ServiceError::Join(e.to_string()))?,
                    None => lease_rpc().await,
                }
            } => answer?,
        };
        let lease = match lease.outcome {
            Some(Outcome::Lease(lease)) => lease,
            Some(Outcome::Wait(wait)) => {
                let pause = Duration::from_millis(wait.retry_after_ms.clamp(1, 1000));
                tokio::select! {
                    () = &mut shutdown => break WorkerEnd::Shutdown,
                    () = tokio::time::sleep(pause) => continue,
                }
            }
            Some(Outcome::EndOfData(_)) => break WorkerEnd::EndOfData,
            Some(Outcome::Drained(_)) => break WorkerEnd::Drained,
            None => return Err(bad("lease", "no outcome")),
        };
        // The lease's deadline on this machine's clock (the dispatcher's clock is not ours).
        let expires = std::time::Instant::now()
            + Duration::from_millis(lease.deadline_ms.saturating_sub(lease.now_ms));
        let global = lease
            .epoch
            .saturating_mul(steps_per_epoch)
            .saturating_add(lease.step);
        // Inputs from earlier stages, held by the receiver until the step is complete.
        let mut received: HashMap<String, Arc<Tensor>> = HashMap::new();
        for r in stage.recv_plan() {
            let client = receiver_client(&shared, &mut receiver, &config.token, tls).await?;
            let from = u32::try_from(r.from_stage).map_err(|e| bad("plan", e))?;
            let answer = client
                .clone()
                .fetch(FetchRequest {
                    job_id: config.job,
                    stage: from,
                    step: global,
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
            let names = send_names.get(&from).cloned().unwrap_or_default();
            for (name, t) in names.into_iter().zip(msg.tensors) {
                received.insert(name, Arc::new(t));
            }
        }
        // The dispatcher counts a step as held until its completion arrives: with at most one
        // completion on its way, this step and the one leased ahead stay within the three
        // leases a worker may hold (beyond them the answer is Wait, a pause of 100 ms).
        while completions.len() > 1 {
            completions.join_next().await;
        }
        let draining = shared.lock().map(|s| s.draining).unwrap_or(false);
        if !draining {
            next_lease = Some(tokio::spawn(lease_rpc()));
        }
        let records = lease.records.clone();
        let run_stage = stage.clone();
        let computing = std::time::Instant::now();
        let run_pool = pool.clone();
        let output = tokio::task::spawn_blocking(move || {
            run_pool.install(|| {
                run_stage.run_step(StepInput {
                    records: &records,
                    received: &received,
                })
            })
        })
        .await
        .map_err(|e| ServiceError::Join(e.to_string()))?
        .map_err(|source| ServiceError::Step {
            stage: stage_index,
            step: global,
            epoch: lease.epoch,
            source,
        })?;
        let compute_us = u64::try_from(computing.elapsed().as_micros()).unwrap_or(u64::MAX);
        let tensors: Vec<Tensor> = output
            .tensors
            .unwrap_or_default()
            .into_iter()
            .map(|t| Arc::try_unwrap(t).unwrap_or_else(|shared| (*shared).clone()))
            .collect();
        let msg = StepMessage {
            job: config.job,
            stage: stage_index,
            step: global,
            epoch: lease.epoch,
            records: lease.records,
            tensors,
        };
        let frame = encoder.encode_parts(&msg)?;
        // Push until taken; backpressure answers RETRY; an unreachable receiver (a consumer
        // restarting) is retried, at the address the heartbeat last reported.
        let mut delivered = false;
        let mut abandoned = false;
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            let client =
                data_plane_client(&shared, &mut plane, config.job, &config.token, tls).await?;
            let answer = match client.push_parts(&frame).await {
                Ok(answer) => answer,
                Err(e) if e.is_unreachable() && started.elapsed() < RECONNECT_WINDOW => {
                    tracing::debug!(cause = %e, "receiver unavailable; retrying");
                    plane = None;
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_millis(500));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            match answer.status {
                PushStatus::Accepted | PushStatus::Duplicate => {
                    delivered = true;
                    break;
                }
                PushStatus::Retry => {
                    if std::time::Instant::now() >= expires {
                        // The receiver is waiting for an earlier step, and our lease has gone
                        // back to the dispatcher: drop this frame (whoever holds the step now
                        // delivers it) and lease again, perhaps that earlier step.
                        tracing::debug!(step = global, "lease expired under backpressure");
                        abandoned = true;
                        break;
                    }
                    let pause = Duration::from_millis(answer.retry_after_ms.clamp(1, 1000));
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
                PushStatus::Rejected | PushStatus::Unspecified => {
                    tracing::error!(step = global, reason = %answer.reason, "the receiver refused the step");
                    break;
                }
            }
        }
        if abandoned {
            continue;
        }
        if !delivered {
            break WorkerEnd::Shutdown;
        }
        let complete = CompleteRequest {
            job_id: config.job,
            worker_id,
            stage: stage_index,
            epoch: lease.epoch,
            step: lease.step,
            compute_us,
        };
        let client = dispatcher.clone();
        completions.spawn(async move {
            if let Err(status) = retrying("Complete", || {
                let mut d = client.clone();
                let request = complete;
                async move { d.complete(request).await }
            })
            .await
            {
                // The lease expired and went elsewhere, or the training side consumed the step
                // before this report arrived (its watermark retired the lease): the receiver
                // has the step either way, so this is routine, not a warning.
                let routine = matches!(
                    &status,
                    ServiceError::Rpc(e) if e.status.code() == tonic::Code::FailedPrecondition
                );
                if routine {
                    tracing::debug!(%status, step = global, "complete refused");
                } else {
                    tracing::warn!(%status, step = global, "complete refused");
                }
            }
        });
        while completions.try_join_next().is_some() {}
        steps += 1;
        if shared.lock().map(|s| s.draining).unwrap_or(false) {
            tracing::info!("draining: finishing held steps");
        }
    };
    // A lease asked for ahead and not taken expires at the dispatcher (or, once drained or at
    // end of data, was never granted).
    if let Some(handle) = next_lease {
        handle.abort();
    }
    while completions.join_next().await.is_some() {}
    heartbeat.abort();
    tracing::info!(worker_id, steps, ?end, "worker stops");
    Ok(WorkerSummary {
        worker_id,
        stage: stage_index,
        steps,
        end,
    })
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
