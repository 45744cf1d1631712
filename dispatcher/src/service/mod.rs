//! The dispatcher's gRPC service (`lode.v1.Dispatcher`) around [`crate::DispatcherState`].
//!
//! [`serve`] opens the journal, replays it, and serves one job on a listener it is given until
//! the shutdown future completes; then it stops accepting, lets the requests in flight finish,
//! and returns once the last journal write is on disk.
//!
//! Every request is checked before it can touch state: the token first (`UNAUTHENTICATED`),
//! then the job id (`PERMISSION_DENIED`). A handler then changes the state only through
//! `Core::apply`, which journals the events (one line per request, handed to the journal's
//! writer thread, which writes lines in order; at most
//! [`crate::journal::WRITE_BEHIND_LINES`] wait for it) before the handler answers; the requests that must be durable first (registration, watermark, consumer,
//! drain, ticks) also wait for an `fdatasync` shared with every request before them, while
//! `Lease`, `Complete` and `Heartbeat`, whose loss a restart recomputes, do not (see the
//! crate docs, "Durability").
//!
//! Connections come through `lode_proto::accept` (the one accept loop). With
//! [`ServiceConfig::tls`] the port serves TLS only: every accepted connection completes a
//! handshake (on its own task, within [`lode_proto::tls::HANDSHAKE_TIMEOUT`], holding one of
//! the [`MAX_CONNECTIONS`] permits) before gRPC sees a byte of it; one that does not is logged
//! and closed.
//!
//! A background task ticks every [`TICK_INTERVAL`]: it expires leases whose deadline passed
//! and declares lost every worker silent for `missed_heartbeats` heartbeat intervals; its
//! sync is the periodic one that bounds what an OS crash can take of the unsynced answers.
//!
//! # Limits
//! Every bound is a named constant: [`MAX_MESSAGE_BYTES`], [`MAX_WORKERS_PER_JOB`],
//! [`MAX_CONNECTIONS`], [`MAX_CONCURRENT_REQUESTS_PER_CONNECTION`], [`MAX_BATCH_RECORDS`],
//! [`MAX_ADDR_BYTES`], [`MAX_WORKER_NAME_BYTES`], [`MAX_STEPS_PER_REQUEST`].

mod clock;
mod convert;
mod core;
#[cfg(test)]
mod crash_tests;
mod rpc;

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lode_proto::accept::{self, Limited};
use lode_proto::service::v1::dispatcher_server::DispatcherServer;
use lode_proto::tls::{ServerStream, ServerTls};
use prost::bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Server;

pub use self::clock::{Clock, ManualClock, MonotonicClock};
use self::core::Core;
use self::rpc::{DispatcherService, Parts};
use crate::journal::JournalError;
use crate::{DispatcherConfig, JobId};

pub use lode_proto::service::{MAX_MESSAGE_BYTES, PROTOCOL_VERSION};

/// The most workers registered at once in one job (every stage together).
pub const MAX_WORKERS_PER_JOB: usize = 1024;

/// The most connections served at once: every worker of a full job, plus room for the training
/// side, the scheduler and reconnects. Further connections wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 2 * MAX_WORKERS_PER_JOB;

/// The most requests in flight on one connection (a worker's lease, heartbeat and reports).
pub const MAX_CONCURRENT_REQUESTS_PER_CONNECTION: usize = 32;

/// The most records in one step (shared with the worker, which expands a lease's range).
pub use lode_proto::service::MAX_BATCH_RECORDS;

/// The most steps one `Lease` grants or one `Complete` reports (with [`MAX_BATCH_RECORDS`]
/// records a step an answer stays far below [`MAX_MESSAGE_BYTES`] only for small batches, so
/// a worker's `max_leases` is the limit that matters in practice).
pub use lode_proto::service::MAX_STEPS_PER_REQUEST;

/// The longest receiver address accepted.
pub const MAX_ADDR_BYTES: usize = 1024;

/// The longest worker name accepted (it is only logged).
pub const MAX_WORKER_NAME_BYTES: usize = 256;

/// How often the background task expires leases and looks for silent workers.
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);

/// The training side's receiver window the dispatcher assumes until one registers with its
/// own (`RegisterConsumerRequest.window`): the consumers' default.
pub const DEFAULT_RECEIVER_WINDOW: u64 = 64;

/// What a lease answer tells a worker to wait when there is nothing to lease yet.
pub const LEASE_RETRY_AFTER: Duration = Duration::from_millis(100);

/// What a lease answer tells a worker to wait when its stage is done but the training side
/// has not consumed every step: a step may still come back (the receiver restarts, or the
/// training side rewinds), and the stage's workers stay to redo it until the end of data.
pub const FINISHED_RETRY_AFTER: Duration = Duration::from_millis(250);

/// The heartbeat interval [`ServiceConfig::new`] sets. Short, so that a worker that stops
/// making progress (a cut link, a frozen or dead host, whose connections stay open) is
/// declared lost, and its leases go to another, about a second after it fell silent rather
/// than at a lease deadline: with [`DEFAULT_MISSED_HEARTBEATS`], 1 s. A heartbeat is a small
/// RPC and a short journal line (not synced): five a second per worker.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(DEFAULT_HEARTBEAT_MS);

/// [`DEFAULT_HEARTBEAT_INTERVAL`] in milliseconds.
pub const DEFAULT_HEARTBEAT_MS: u64 = 200;

/// Missed heartbeats after which [`ServiceConfig::new`]'s service declares a worker lost.
pub const DEFAULT_MISSED_HEARTBEATS: u32 = 5;

/// The journal's growth after which [`ServiceConfig::new`]'s service compacts it (see
/// [`crate::journal::Journal::compact`]): at about 30 bytes a step, some two million steps.
pub const DEFAULT_COMPACT_BYTES: u64 = 64 << 20;

/// Room for everything in a registration answer besides the plan and the stage graph.
const REGISTER_OVERHEAD_BYTES: usize = 64 << 10;

/// Everything [`serve`] needs to serve one job.
#[derive(Clone)]
pub struct ServiceConfig {
    pub job_id: JobId,
    /// The job's secret; every request must carry it as `authorization: Bearer <token>`.
    pub token: String,
    pub dispatcher: DispatcherConfig,
    /// The plan directory's plan.json, handed verbatim to workers and the consumer.
    pub plan_json: String,
    /// Each stage's GraphDef file, by stage number.
    pub stage_graphs: Vec<Vec<u8>>,
    /// Where the journal lives; created if missing. A restart with the same directory
    /// continues the job.
    pub journal_dir: PathBuf,
    /// Compact the journal once it grew by this many bytes since its last compaction (0:
    /// never; see [`crate::journal::Journal::compact`]).
    pub journal_compact_bytes: u64,
    /// How often workers are told to heartbeat.
    pub heartbeat_interval: Duration,
    /// A worker silent for this many heartbeat intervals is lost and its leases re-leased.
    pub missed_heartbeats: u32,
    pub clock: Arc<dyn Clock>,
    /// Serve TLS only (every connection must complete a handshake), or plaintext when None.
    pub tls: Option<ServerTls>,
    /// Stop serving, as if `shutdown` had completed, once the job is finished: at end of data
    /// (the last step consumed, or the training side ended the job) with the training side and
    /// every registered worker told so (see [`serve`]).
    pub stop_at_end: bool,
}

impl ServiceConfig {
    /// A config with the default heartbeat settings and the real clock.
    pub fn new(
        job_id: JobId,
        token: impl Into<String>,
        dispatcher: DispatcherConfig,
        plan_json: String,
        stage_graphs: Vec<Vec<u8>>,
        journal_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            job_id,
            token: token.into(),
            dispatcher,
            plan_json,
            stage_graphs,
            journal_dir: journal_dir.into(),
            journal_compact_bytes: DEFAULT_COMPACT_BYTES,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            missed_heartbeats: DEFAULT_MISSED_HEARTBEATS,
            clock: Arc::new(MonotonicClock::new()),
            tls: None,
            stop_at_end: false,
        }
    }

    /// Checks every field; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<(), ServeError> {
        let invalid =
            |field: &'static str, reason: String| ServeError::InvalidConfig { field, reason };
        self.dispatcher.validate()?;
        if self.token.is_empty() || !self.token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "token",
                "must be non-empty visible ASCII (it travels in gRPC metadata)".into(),
            ));
        }
        if self.dispatcher.batch_size > MAX_BATCH_RECORDS {
            return Err(invalid(
                "dispatcher.batch_size",
                format!(
                    "{} exceeds the {MAX_BATCH_RECORDS}-record limit of a step",
                    self.dispatcher.batch_size
                ),
            ));
        }
        let stages = usize::try_from(self.dispatcher.stages).unwrap_or(usize::MAX);
        if self.stage_graphs.len() != stages {
            return Err(invalid(
                "stage_graphs",
                format!(
                    "{} graph(s) for {} stage(s)",
                    self.stage_graphs.len(),
                    self.dispatcher.stages
                ),
            ));
        }
        for (stage, graph) in self.stage_graphs.iter().enumerate() {
            let size = self
                .plan_json
                .len()
                .saturating_add(graph.len())
                .saturating_add(REGISTER_OVERHEAD_BYTES);
            if size > MAX_MESSAGE_BYTES {
                return Err(invalid(
                    "stage_graphs",
                    format!(
                        "stage {stage}: the plan ({} bytes) and its graph ({} bytes) exceed the \
                         {MAX_MESSAGE_BYTES}-byte message limit",
                        self.plan_json.len(),
                        graph.len()
                    ),
                ));
            }
        }
        if self.heartbeat_interval.as_millis() == 0 {
            return Err(invalid(
                "heartbeat_interval",
                "must be at least 1 ms".into(),
            ));
        }
        if self.missed_heartbeats == 0 {
            return Err(invalid("missed_heartbeats", "must be at least 1".into()));
        }
        Ok(())
    }
}

impl fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let graph_bytes: Vec<usize> = self.stage_graphs.iter().map(Vec::len).collect();
        f.debug_struct("ServiceConfig")
            .field("job_id", &self.job_id)
            .field("token", &"<redacted>")
            .field("dispatcher", &self.dispatcher)
            .field("plan_json_bytes", &self.plan_json.len())
            .field("stage_graph_bytes", &graph_bytes)
            .field("journal_dir", &self.journal_dir)
            .field("journal_compact_bytes", &self.journal_compact_bytes)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("missed_heartbeats", &self.missed_heartbeats)
            .field("clock", &self.clock)
            .field("tls", &self.tls)
            .field("stop_at_end", &self.stop_at_end)
            .finish()
    }
}

/// Why [`serve`] could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid service config: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    #[error(transparent)]
    Dispatcher(#[from] crate::Error),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("the listener has no local address")]
    Listener(#[source] io::Error),
    #[error("the gRPC server failed")]
    Transport(#[source] tonic::transport::Error),
    #[error("a dispatcher task failed")]
    Task(#[source] tokio::task::JoinError),
    #[error("cannot start the dispatcher's thread")]
    Thread(#[source] io::Error),
}

/// A dispatcher serving on a thread of its own (its own one-thread runtime), for a process
/// whose main thread does other work (`lode train`). Dropping it stops it as [`stop`] does.
///
/// [`stop`]: DispatcherThread::stop
#[derive(Debug)]
pub struct DispatcherThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServeError>>>,
}

impl DispatcherThread {
    /// Serves `config` on `listener` (see [`serve`]) until stopped.
    pub fn spawn(
        listener: std::net::TcpListener,
        config: ServiceConfig,
    ) -> Result<Self, ServeError> {
        listener
            .set_nonblocking(true)
            .map_err(ServeError::Listener)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lode-dispatcher".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .map_err(ServeError::Thread)?;
                rt.block_on(async move {
                    let listener = TcpListener::from_std(listener).map_err(ServeError::Listener)?;
                    serve(listener, config, async {
                        let _ = stopped.await;
                    })
                    .await
                })
            })
            .map_err(ServeError::Thread)?;
        Ok(DispatcherThread {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops serving (draining, as on any shutdown) and waits for the thread; returns how
    /// serving ended.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.end()
    }

    fn end(&mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take().map(std::thread::JoinHandle::join) {
            None => Ok(()),
            Some(Ok(outcome)) => outcome,
            Some(Err(_)) => {
                tracing::error!("the dispatcher's thread panicked");
                Ok(())
            }
        }
    }
}

impl Drop for DispatcherThread {
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            tracing::warn!(cause = %e, "the dispatcher stopped with an error");
        }
    }
}

/// Serves one job's dispatcher on `listener` until `shutdown` completes, then drains: stops
/// accepting, finishes the requests in flight, stops the ticker, and returns once the last
/// journal write is durable.
///
/// With [`ServiceConfig::stop_at_end`] it also stops once the job is finished: end of data,
/// the training side told so (a `Consumed` or `RegisterConsumer` answer saying end of data),
/// and every registered worker told so by a `Lease` answer (a worker that never asks again is
/// declared lost after its silence, which also counts).
pub async fn serve(
    listener: TcpListener,
    config: ServiceConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    config.validate()?;
    let addr = listener.local_addr().map_err(ServeError::Listener)?;
    let ServiceConfig {
        job_id,
        token,
        dispatcher,
        plan_json,
        stage_graphs,
        journal_dir,
        journal_compact_bytes,
        heartbeat_interval,
        missed_heartbeats,
        clock,
        tls,
        stop_at_end,
    } = config;
    // Reading and replaying the journal is file I/O: keep it off the async workers.
    let mut restored =
        tokio::task::spawn_blocking(move || Core::open(&journal_dir, job_id, &dispatcher))
            .await
            .map_err(ServeError::Task)??;
    restored.core.write_behind()?;
    restored.core.compact_every(journal_compact_bytes);
    let parts = Parts {
        job: job_id,
        token,
        plan_json,
        stage_graphs: stage_graphs.into_iter().map(Bytes::from).collect(),
        heartbeat_interval,
        missed_heartbeats,
        clock,
    };
    let service = DispatcherService::new(parts, restored.core, restored.resume_at);
    tracing::info!(job = %job_id, %addr, tls = tls.is_some(), resume_at = %restored.resume_at, "dispatcher serving");

    let (stop_ticker, ticker_stopped) = oneshot::channel();
    let ticker = tokio::spawn(run_ticker(service.clone(), ticker_stopped));
    let (incoming, acceptor) = limited_incoming(listener, MAX_CONNECTIONS, tls);
    let server = DispatcherServer::new(service.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let served = Server::builder()
        .concurrency_limit_per_connection(MAX_CONCURRENT_REQUESTS_PER_CONNECTION)
        .add_service(server)
        .serve_with_incoming_shutdown(incoming, until_finished(&service, stop_at_end, shutdown))
        .await;
    // The ticker stops between ticks; the accept loop stops once the server dropped its end.
    let _ = stop_ticker.send(());
    let ticked = ticker.await;
    let accepted = acceptor.await;
    service.quiesce().await;
    tracing::info!(job = %job_id, %addr, "dispatcher stopped");
    served.map_err(ServeError::Transport)?;
    ticked.map_err(ServeError::Task)?;
    accepted.map_err(ServeError::Task)
}

/// `shutdown`, or, with `stop_at_end`, the job's end as well (whichever comes first).
fn until_finished(
    service: &DispatcherService,
    stop_at_end: bool,
    shutdown: impl Future<Output = ()> + Send,
) -> impl Future<Output = ()> + Send {
    let mut finished = service.finished();
    async move {
        let finished = async {
            if !stop_at_end || finished.wait_for(|done| *done).await.is_err() {
                std::future::pending::<()>().await;
            }
            tracing::info!("the job is finished: the training side and every worker know");
        };
        tokio::select! {
            () = shutdown => {}
            () = finished => {}
        }
    }
}

/// Ticks every [`TICK_INTERVAL`] until `stop`; a tick in progress finishes first.
async fn run_ticker(service: DispatcherService, mut stop: oneshot::Receiver<()>) {
    let mut interval = tokio::time::interval(TICK_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = interval.tick() => {}
        }
        match service.tick().await {
            Ok(()) => failing = false,
            // Logged once per run of failures, not every 100 ms.
            Err(status) if !failing => {
                failing = true;
                tracing::error!(cause = %status.message(), "dispatcher tick failed");
            }
            Err(_) => {}
        }
    }
}

/// Accepts connections while fewer than `limit` are open (`lode_proto::accept`), handing
/// them to the server; with `tls`, only once their handshake completed (on the connection's
/// own task, so a slow or silent peer holds up nobody but its permit). The loop stops once the
/// server dropped its end.
fn limited_incoming(
    listener: TcpListener,
    limit: usize,
    tls: Option<ServerTls>,
) -> (
    ReceiverStream<io::Result<Limited<ServerStream>>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::channel(1);
    let closed = tx.clone();
    let handle = move |stream, peer, permit| {
        let (tls, tx) = (tls.clone(), tx.clone());
        async move {
            if let Some(stream) = accept::secure(stream, peer, tls.as_ref()).await {
                let _ = tx.send(Ok(Limited::new(stream, permit))).await;
            }
        }
    };
    let stop = async move { closed.closed().await };
    let acceptor = tokio::spawn(accept::accept_loop(listener, limit, stop, handle));
    (ReceiverStream::new(rx), acceptor)
}

/// The address a client should dial for a plaintext listener bound to `addr`.
pub fn endpoint_of(addr: SocketAddr) -> String {
    lode_proto::tls::url(addr, false)
}
