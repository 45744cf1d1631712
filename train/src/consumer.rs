//! The training side's consumer: a receiver registered with a job's dispatcher, delivering the
//! job's steps in order to a caller that blocks for each, and reporting what was consumed.
//!
//! This is what the training process runs (through the training-side package's C ABI, and
//! `lode consume`'s emulator): [`Consumer`] owns a small tokio runtime of its own, so that its
//! callers (TensorFlow's op threads, a command's main thread) stay synchronous.
//!
//! # Delivery
//! [`Consumer::next`] returns the next step in step order, each exactly once (the receiver's
//! reorder and dedup rule), or [`Next::EndOfData`] once the dispatcher says every step of the
//! job was consumed. While it waits it flushes the consumed watermark (the dispatcher ends the
//! data only when the last step is reported) and asks the dispatcher for the end of data; a
//! dispatcher that cannot be reached for [`ConsumerConfig::patience`] is an error, never a hang.
//!
//! # Watermark
//! [`Consumer::consumed`] records the last consumed step; a background task reports it to the
//! dispatcher (the newest only, one report in flight, at most one per [`REPORT_INTERVAL`]), and
//! [`Consumer::flush`] reports it synchronously. A report is never ahead of what the caller
//! said it consumed.
//!
//! # Restart
//! [`Consumer::resume`] re-registers from a checkpoint's step: the dispatcher moves its
//! watermark there (`RegisterConsumer.resume_from`) and a fresh receiver starts at it. The old
//! receiver is closed first: registering makes the dispatcher lease every step again for the
//! new receiver, and a worker that learns the new address late must not have a step counted
//! as delivered by the old one (it would be reported complete and never leased again, and the
//! new receiver would wait for it forever). A closed receiver answers no frame; the worker
//! reconnects to the address the dispatcher names now.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lode_proto::service::v1::{ConsumedRequest, RegisterConsumerRequest, StatusRequest};
use lode_proto::service::{connect, retry_unreachable, ClientError, DispatcherClient, RpcError};
use lode_proto::step::{steps_per_epoch, StepError, StepRef};
use lode_proto::tls::{ClientTls, ServerTls};
use tokio::sync::{oneshot, watch};

use lode_transfer::receiver::{initial_window, DEFAULT_CAPACITY, DEFAULT_CAPACITY_BYTES};
use lode_transfer::service::{serve_receiver, ReceiverService};
use lode_transfer::{ReceiverConfig, ReceiverMetrics, SharedReceiver, Step, TransferError};

/// How long one wait for the next step lasts before the dispatcher is asked for the end of data.
const POLL: Duration = Duration::from_millis(100);

/// The least time between two background watermark reports. Each report is an RPC that the
/// dispatcher answers after its journal is synced, so one per step would cost a round trip and
/// an `fdatasync` per step; the watermark only frees the dispatcher's memory of delivered steps
/// and feeds the scheduler's rates, which a few milliseconds of lag do not change. The reports
/// that must not wait ([`Consumer::flush`], the end of the job) are synchronous and unpaced.
pub const REPORT_INTERVAL: Duration = Duration::from_millis(5);

/// Settings of a [`Consumer`].
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The dispatcher's URL (`http://host:port`, or `https://` with `client_tls`).
    pub dispatcher: String,
    pub token: String,
    pub job: u64,
    /// Where the receiver listens (`127.0.0.1:0` for any free loopback port).
    pub listen: String,
    /// `HOST[:PORT]` workers dial instead of the bound address (see [`receiver_url`]).
    pub advertise: Option<String>,
    /// The receiver's TLS identity; it then registers as `https://`.
    pub server_tls: Option<ServerTls>,
    /// Trust for an `https://` dispatcher.
    pub client_tls: Option<ClientTls>,
    /// Steps buffered ahead of the one being consumed, at most (see `capacity_bytes`).
    pub capacity: u64,
    /// About the most bytes of steps buffered: the receiver's window is this over its mean
    /// step's size, within `capacity` steps (see [`lode_transfer::receiver`]).
    pub capacity_bytes: u64,
    /// The first global step to receive, when restarting from a checkpoint.
    pub resume_from: Option<u64>,
    /// How long an unreachable dispatcher is retried before a call fails.
    pub patience: Duration,
}

impl ConsumerConfig {
    /// Plaintext on a loopback port, a window of at most [`DEFAULT_CAPACITY`] steps and
    /// about [`DEFAULT_CAPACITY_BYTES`], 30 s of patience.
    pub fn new(dispatcher: impl Into<String>, token: impl Into<String>, job: u64) -> Self {
        ConsumerConfig {
            dispatcher: dispatcher.into(),
            token: token.into(),
            job,
            listen: "127.0.0.1:0".into(),
            advertise: None,
            server_tls: None,
            client_tls: None,
            capacity: DEFAULT_CAPACITY,
            capacity_bytes: DEFAULT_CAPACITY_BYTES,
            resume_from: None,
            patience: Duration::from_secs(30),
        }
    }
}

/// Why the consumer failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("cannot start the consumer's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Address(String),
    #[error("cannot reach the dispatcher at {url}")]
    Connect {
        url: String,
        #[source]
        source: ClientError,
    },
    #[error("dispatcher at {url}: {source}")]
    Rpc {
        url: String,
        #[source]
        source: Box<RpcError>,
    },
    #[error("the dispatcher at {url} serves a plan that is not valid JSON")]
    Plan {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the job's plan has no data-worker stage")]
    NoStage,
    #[error("the dispatcher's first step: {0}")]
    Step(#[from] StepError),
    #[error(transparent)]
    Receiver(#[from] TransferError),
    #[error("cancelled while waiting for the next step")]
    Cancelled,
}

/// What [`Consumer::next`] found.
#[derive(Debug)]
pub enum Next {
    Step(Step),
    /// Every step of the job has been consumed.
    EndOfData,
}

/// A receiver being served, and how to stop it.
#[derive(Debug)]
struct Served {
    buffer: Arc<SharedReceiver>,
    /// Both `None` before the first registration and once stopped.
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

/// The consumed watermark as the background reporter sees it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Watermark {
    /// The last consumed global step, if any.
    consumed: Option<u64>,
    /// Time spent between deliveries since the receiver was served (the training side's busy
    /// time), cumulative: a report sends what was not sent before.
    busy_us: u64,
    /// The receiver's window when the step was consumed (0: not known yet).
    window: u64,
}

/// The training side of one job (see the module documentation).
#[derive(Debug)]
pub struct Consumer {
    config: ConsumerConfig,
    rt: tokio::runtime::Runtime,
    dispatcher: DispatcherClient,
    plan_json: String,
    per_epoch: NonZeroU64,
    stages: BTreeSet<u32>,
    served: Served,
    watermark: watch::Sender<Watermark>,
    /// The last watermark the dispatcher acknowledged.
    reported: Arc<tokio::sync::Mutex<Reported>>,
    delivered_at: Mutex<Option<Instant>>,
}

impl Consumer {
    /// Connects to the dispatcher, serves a receiver and registers it (from
    /// `config.resume_from` when set).
    pub fn start(config: ConsumerConfig) -> Result<Self, ConsumerError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lode-consumer")
            .enable_all()
            .build()
            .map_err(ConsumerError::Runtime)?;
        let url = config.dispatcher.clone();
        let dispatcher = rt
            .block_on(connect(&url, &config.token, config.client_tls.as_ref()))
            .map_err(|source| ConsumerError::Connect {
                url: url.clone(),
                source,
            })?;
        let (watermark, _) = watch::channel(Watermark::default());
        let reported = Arc::new(tokio::sync::Mutex::new(Reported::default()));
        let mut consumer = Consumer {
            served: Served {
                buffer: Arc::new(SharedReceiver::new(ReceiverConfig::new(
                    config.job,
                    [0],
                    0,
                    1,
                ))?),
                stop: None,
                server: None,
            },
            config,
            rt,
            dispatcher,
            plan_json: String::new(),
            per_epoch: NonZeroU64::MIN,
            stages: BTreeSet::new(),
            watermark,
            reported,
            delivered_at: Mutex::new(None),
        };
        consumer.register(None)?;
        consumer.spawn_reporter();
        if let Some(next) = consumer.config.resume_from {
            consumer.resume(next)?;
        }
        Ok(consumer)
    }

    /// Serves a fresh receiver and registers it, from `resume` when given (which needs the
    /// epoch length, known after the first registration).
    fn register(&mut self, resume: Option<u64>) -> Result<(), ConsumerError> {
        // The receiver served now answers nothing more before the dispatcher hears of the new
        // one: registering leases every step again, so a step the old receiver took after that
        // would count as delivered, and be reported, though the new one never sees it.
        self.served.buffer.close();
        let config = &self.config;
        let listen_error = |source| ConsumerError::Listen {
            addr: config.listen.clone(),
            source,
        };
        let listener = self
            .rt
            .block_on(tokio::net::TcpListener::bind(&config.listen))
            .map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        let request = RegisterConsumerRequest {
            job_id: config.job,
            receiver_addr: receiver_url(
                bound,
                config.advertise.as_deref(),
                config.server_tls.is_some(),
            )
            .map_err(ConsumerError::Address)?,
            resume_from: resume.map(|g| StepRef::from_global(g, self.per_epoch).to_wire()),
            // The workers share it as leases, so that they are not too far ahead together. It
            // grows (or shrinks) as the receiver learns its steps' size: each report says it.
            window: initial_window(config.capacity),
        };
        let reg = self.call("RegisterConsumer", |mut d| {
            let request = request.clone();
            async move { d.register_consumer(request).await }
        })?;
        if self.plan_json.is_empty() {
            let plan: lode_proto::plan::Plan =
                serde_json::from_str(&reg.plan_json).map_err(|source| ConsumerError::Plan {
                    url: self.config.dispatcher.clone(),
                    source,
                })?;
            self.stages = (0..u32::try_from(plan.stages.len()).unwrap_or(0)).collect();
            if self.stages.is_empty() {
                return Err(ConsumerError::NoStage);
            }
            self.plan_json = reg.plan_json;
        }
        self.per_epoch = steps_per_epoch(reg.steps_per_epoch)?;
        let first_global =
            StepRef::from_wire(reg.first_step.unwrap_or_default(), self.per_epoch)?.global;
        self.serve(listener, first_global)?;
        self.reported.blocking_lock().end_of_data = reg.end_of_data;
        Ok(())
    }

    /// Replaces the served receiver with a fresh one starting at `first_global`.
    fn serve(
        &mut self,
        listener: tokio::net::TcpListener,
        first_global: u64,
    ) -> Result<(), ConsumerError> {
        let buffer = Arc::new(SharedReceiver::new(ReceiverConfig {
            capacity_bytes: self.config.capacity_bytes,
            ..ReceiverConfig::new(
                self.config.job,
                self.stages.iter().copied(),
                first_global,
                self.config.capacity,
            )
        })?);
        let service = ReceiverService::new(self.config.job, &self.config.token, buffer.clone());
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let tls = self.config.server_tls.clone();
        let server = self.rt.spawn(async move {
            let stopped = async {
                let _ = stop_rx.await;
            };
            if let Err(e) = serve_receiver(listener, service, tls, stopped).await {
                tracing::warn!(cause = %e, "the consumer's receiver stopped");
            }
        });
        let old = std::mem::replace(
            &mut self.served,
            Served {
                buffer,
                stop: Some(stop_tx),
                server: Some(server),
            },
        );
        self.stop_served(old);
        *self.reported.blocking_lock() = Reported {
            step: first_global.checked_sub(1),
            busy_us: 0,
            end_of_data: false,
        };
        self.watermark.send_replace(Watermark {
            consumed: first_global.checked_sub(1),
            busy_us: 0,
            window: 0,
        });
        Ok(())
    }

    /// Stops serving `served` (its connections drain for up to 5 s).
    fn stop_served(&self, mut served: Served) {
        if let Some(stop) = served.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = served.server.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(5), server).await });
        }
    }

    /// Calls a dispatcher RPC, retrying while it is unreachable for the configured patience.
    fn call<T, F, Fut>(&self, rpc: &'static str, call: F) -> Result<T, ConsumerError>
    where
        F: Fn(DispatcherClient) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let d = self.dispatcher.clone();
        self.rt
            .block_on(retry_unreachable(self.config.patience, || call(d.clone())))
            .map_err(|status| ConsumerError::Rpc {
                url: self.config.dispatcher.clone(),
                source: Box::new(RpcError { rpc, status }),
            })
    }

    /// Runs `call` to its end, or until `cancelled()` (looked at every [`POLL`]).
    fn until_cancelled<T>(
        &self,
        cancelled: &dyn Fn() -> bool,
        call: impl std::future::Future<Output = Result<T, ConsumerError>>,
    ) -> Result<T, ConsumerError> {
        self.rt.block_on(async {
            tokio::pin!(call);
            loop {
                tokio::select! {
                    answer = &mut call => return answer,
                    () = tokio::time::sleep(POLL) => {
                        if cancelled() {
                            return Err(ConsumerError::Cancelled);
                        }
                    }
                }
            }
        })
    }

    /// Reports the newest watermark whenever it changes, one report at a time and at most one
    /// per [`REPORT_INTERVAL`] (what changes meanwhile goes in the next).
    fn spawn_reporter(&self) {
        let mut changes = self.watermark.subscribe();
        let (d, job, per_epoch, reported, patience) = (
            self.dispatcher.clone(),
            self.config.job,
            self.per_epoch,
            self.reported.clone(),
            self.config.patience,
        );
        self.rt.spawn(async move {
            while changes.changed().await.is_ok() {
                let started = tokio::time::Instant::now();
                let mark = *changes.borrow_and_update();
                if let Err(e) = report(&d, job, per_epoch, mark, &reported, patience).await {
                    tracing::warn!(cause = %e, "cannot report the consumed watermark");
                }
                tokio::time::sleep_until(started + REPORT_INTERVAL).await;
            }
        });
    }

    /// The plan the dispatcher serves (plan.json's text).
    pub fn plan_json(&self) -> &str {
        &self.plan_json
    }

    /// Steps per epoch: global step = epoch · steps_per_epoch + step within the epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        self.per_epoch.get()
    }

    /// The job's length in steps as the dispatcher runs it; None when it repeats forever.
    pub fn job_steps(&self) -> Result<Option<u64>, ConsumerError> {
        let job_id = self.config.job;
        let status = self.call("Status", |mut d| async move {
            d.status(StatusRequest { job_id }).await
        })?;
        Ok(match status.epochs {
            0 => None,
            e => Some(e.saturating_mul(status.steps_per_epoch)),
        })
    }

    /// The next global step [`Self::next`] delivers.
    pub fn next_step(&self) -> u64 {
        self.served.buffer.next_step()
    }

    pub fn metrics(&self) -> ReceiverMetrics {
        self.served.buffer.metrics()
    }

    /// Blocks until the next step is complete, the job's data ends, or `cancelled()` says
    /// to stop (checked every `POLL`).
    pub fn next(&self, cancelled: &dyn Fn() -> bool) -> Result<Next, ConsumerError> {
        loop {
            if cancelled() {
                return Err(ConsumerError::Cancelled);
            }
            if let Some(step) = self.served.buffer.pop(POLL) {
                return Ok(Next::Step(step));
            }
            // Both calls give way to `cancelled()`: a dispatcher stopped with the training
            // side would otherwise hold it for the full patience.
            let mark = *self.watermark.borrow();
            self.until_cancelled(cancelled, async {
                report(
                    &self.dispatcher,
                    self.config.job,
                    self.per_epoch,
                    mark,
                    &self.reported,
                    self.config.patience,
                )
                .await
                .map_err(|source| ConsumerError::Rpc {
                    url: self.config.dispatcher.clone(),
                    source: Box::new(source),
                })
            })?;
            let end_of_data = self.reported.blocking_lock().end_of_data || {
                let job_id = self.config.job;
                let d = self.dispatcher.clone();
                let status = self.until_cancelled(cancelled, async {
                    retry_unreachable(self.config.patience, || {
                        let mut d = d.clone();
                        async move { d.status(StatusRequest { job_id }).await }
                    })
                    .await
                    .map_err(|status| ConsumerError::Rpc {
                        url: self.config.dispatcher.clone(),
                        source: Box::new(RpcError {
                            rpc: "Status",
                            status,
                        }),
                    })
                })?;
                status.end_of_data
            };
            if end_of_data {
                // A step completed just before the status answer is still delivered.
                return Ok(self
                    .served
                    .buffer
                    .try_pop()
                    .map_or(Next::EndOfData, Next::Step));
            }
        }
    }

    /// The next step if it is complete now, without waiting.
    pub fn try_next(&self) -> Option<Step> {
        self.served.buffer.try_pop()
    }

    /// Records that the training side consumed `global` (and every step before it), having
    /// trained for `busy` since its last report (a caller that measures its own busy time);
    /// the background reporter tells the dispatcher.
    pub fn consumed_after(&self, global: u64, busy: Duration) {
        let busy = u64::try_from(busy.as_micros()).unwrap_or(u64::MAX);
        let window = self.served.buffer.window();
        self.watermark.send_modify(|w| {
            if w.consumed.is_none_or(|c| c < global) {
                w.consumed = Some(global);
                w.busy_us = w.busy_us.saturating_add(busy);
                w.window = window;
            }
        });
    }

    /// Serves the receiver's metrics (Prometheus text, `GET /metrics`) on `addr` until the
    /// consumer is dropped; returns the bound address. The metrics are those of the receiver
    /// serving now (a later [`Self::resume`] serves a new one, which this does not follow).
    pub fn serve_metrics(&self, addr: &str) -> Result<SocketAddr, ConsumerError> {
        let listen_error = |source| ConsumerError::Listen {
            addr: addr.to_owned(),
            source,
        };
        let listener = self
            .rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        let (buffer, job) = (self.served.buffer.clone(), self.config.job);
        self.rt.spawn(lode_proto::metrics::serve_metrics(
            listener,
            move || {
                let text = lode_transfer::metrics::render_prometheus(job, &buffer.metrics());
                async move { text }
            },
            std::future::pending(),
        ));
        Ok(bound)
    }

    /// Gives back a delivered step the training side is done with (it copied the tensors
    /// out): their memory receives later steps' values, with no zeroing and no page faults.
    /// Optional: a step simply dropped frees its memory.
    pub fn recycle(&self, step: Step) {
        self.served.buffer.recycle(step);
    }

    /// Records that the training side consumed `global` (and every step before it); the
    /// background reporter tells the dispatcher.
    pub fn consumed(&self, global: u64) {
        let now = Instant::now();
        let busy = self
            .delivered_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(now)
            .map_or(0, |t| {
                u64::try_from(now.duration_since(t).as_micros()).unwrap_or(u64::MAX)
            });
        let window = self.served.buffer.window();
        self.watermark.send_modify(|w| {
            if w.consumed.is_none_or(|c| c < global) {
                w.consumed = Some(global);
                w.busy_us = w.busy_us.saturating_add(busy);
                w.window = window;
            }
        });
    }

    /// Reports the newest watermark now, if the dispatcher has not acknowledged it yet.
    pub fn flush(&self) -> Result<(), ConsumerError> {
        self.flush_within(self.config.patience)
    }

    /// [`Self::flush`], retrying an unreachable dispatcher for at most `window` (a consumer
    /// that is stopping does not wait the full patience for a dispatcher that is gone).
    pub fn flush_within(&self, window: Duration) -> Result<(), ConsumerError> {
        let mark = *self.watermark.borrow();
        self.rt
            .block_on(report(
                &self.dispatcher,
                self.config.job,
                self.per_epoch,
                mark,
                &self.reported,
                window,
            ))
            .map_err(|source| ConsumerError::Rpc {
                url: self.config.dispatcher.clone(),
                source: Box::new(source),
            })
    }

    /// Ends the job at the last step consumed: the dispatcher tells every worker end of data
    /// (and, if it stops at the end of its job, exits). Returns the step the job ended after,
    /// or None when nothing was consumed (then nothing is ended). A later consumer reopens the
    /// job with `resume_from`.
    pub fn end_job(&self) -> Result<Option<u64>, ConsumerError> {
        self.flush()?;
        let Some(global) = self.watermark.borrow().consumed else {
            return Ok(None);
        };
        let at = StepRef::from_global(global, self.per_epoch).to_wire();
        let job_id = self.config.job;
        let answer = self.call("Consumed", |mut d| async move {
            d.consumed(ConsumedRequest {
                job_id,
                epoch: at.epoch,
                step: at.step,
                busy_us: 0,
                end_job: true,
                window: 0,
            })
            .await
        })?;
        self.reported.blocking_lock().end_of_data |= answer.end_of_data;
        Ok(Some(global))
    }

    /// Restarts delivery at global step `next` (a checkpoint consumed every step before it):
    /// the dispatcher's watermark moves there and a fresh receiver takes the steps from it.
    pub fn resume(&mut self, next: u64) -> Result<(), ConsumerError> {
        if next == self.next_step() {
            return Ok(());
        }
        self.register(Some(next))
    }
}

/// How long a dropped consumer retries its last report.
const DROP_PATIENCE: Duration = Duration::from_secs(1);

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.flush_within(DROP_PATIENCE);
        let served = Served {
            buffer: self.served.buffer.clone(),
            stop: self.served.stop.take(),
            server: self.served.server.take(),
        };
        self.stop_served(served);
    }
}

/// What the dispatcher has acknowledged.
#[derive(Debug, Default, Clone, Copy)]
struct Reported {
    /// The last consumed global step.
    step: Option<u64>,
    /// The busy time (cumulative, as [`Watermark::busy_us`] counts it) reported so far: the
    /// protocol's `busy_us` is the time since the last report, so each report sends the
    /// difference.
    busy_us: u64,
    /// The dispatcher answered that the job's data ended (a dispatcher that stops at the end
    /// of its job may be gone after that answer, so it is not asked again).
    end_of_data: bool,
}

/// Sends `mark` to the dispatcher unless it acknowledged it (or a later one) already. Reports
/// are one at a time (the lock is held across the call), so that no busy time is sent twice.
async fn report(
    dispatcher: &DispatcherClient,
    job: u64,
    per_epoch: NonZeroU64,
    mark: Watermark,
    reported: &tokio::sync::Mutex<Reported>,
    patience: Duration,
) -> Result<(), RpcError> {
    let Some(global) = mark.consumed else {
        return Ok(());
    };
    let mut done = reported.lock().await;
    if done.step.is_some_and(|r| r >= global) {
        return Ok(());
    }
    let at = StepRef::from_global(global, per_epoch).to_wire();
    let busy_us = mark.busy_us.saturating_sub(done.busy_us);
    let answer = retry_unreachable(patience, || {
        let mut d = dispatcher.clone();
        async move {
            d.consumed(ConsumedRequest {
                job_id: job,
                epoch: at.epoch,
                step: at.step,
                busy_us,
                end_job: false,
                window: mark.window,
            })
            .await
        }
    })
    .await
    .map_err(RpcError::of("Consumed"))?;
    done.step = Some(global);
    done.busy_us = done.busy_us.max(mark.busy_us);
    done.end_of_data |= answer.end_of_data;
    Ok(())
}

/// The address workers dial for a receiver bound to `bound`: `advertise` (`HOST` or
/// `HOST:PORT`, the port defaulting to the bound one) when given, else the bound address, which
/// must then name one interface: an address bound to every interface (`0.0.0.0`, `[::]`) is not
/// one a worker on another machine can dial.
pub fn receiver_url(
    bound: SocketAddr,
    advertise: Option<&str>,
    tls: bool,
) -> Result<String, String> {
    let Some(advertise) = advertise.map(str::trim) else {
        if bound.ip().is_unspecified() {
            return Err(format!(
                "--listen binds every interface ({bound}), which is no address a data worker \
                 can dial: give --advertise HOST[:PORT], the name or address workers reach this \
                 machine by"
            ));
        }
        return Ok(lode_proto::tls::url(bound, tls));
    };
    let bad = |why: &str| format!("--advertise {advertise:?}: {why}");
    if advertise.is_empty()
        || advertise.contains("://")
        || advertise.contains('/')
        || advertise.contains(char::is_whitespace)
    {
        return Err(bad("expected HOST or HOST:PORT, without a scheme or path"));
    }
    // An IPv6 literal needs brackets; its colons are not a port.
    let has_port = match advertise.rsplit_once(':') {
        Some((host, _)) if advertise.starts_with('[') => host.ends_with(']'),
        Some((host, _)) => !host.contains(':'),
        None => false,
    };
    if advertise.parse::<std::net::Ipv6Addr>().is_ok() {
        return Err(bad("write an IPv6 address in brackets, e.g. [2001:db8::1]"));
    }
    let with_port = if has_port {
        let (_, port) = advertise.rsplit_once(':').unwrap_or_default();
        match port.parse::<u16>() {
            Ok(p) if p > 0 => advertise.to_owned(),
            _ => return Err(bad("the port must be a number from 1 to 65535")),
        }
    } else {
        format!("{advertise}:{}", bound.port())
    };
    Ok(lode_proto::tls::url(with_port, tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receiver_is_registered_at_an_address_workers_can_dial() {
        let any: SocketAddr = "0.0.0.0:7001".parse().expect("addr");
        let any6: SocketAddr = "[::]:7001".parse().expect("addr");
        let local: SocketAddr = "127.0.0.1:7001".parse().expect("addr");
        let url = receiver_url;
        assert_eq!(
            url(local, None, false).as_deref(),
            Ok("http://127.0.0.1:7001")
        );
        assert_eq!(
            url(local, None, true).as_deref(),
            Ok("https://127.0.0.1:7001")
        );
        for bound in [any, any6] {
            let err = url(bound, None, false).expect_err("every interface");
            assert!(
                err.contains("--advertise") && err.contains(&bound.to_string()),
                "{err}"
            );
        }
        assert_eq!(
            url(any, Some("trainer-3"), false).as_deref(),
            Ok("http://trainer-3:7001")
        );
        assert_eq!(
            url(any, Some("trainer-3.svc:9000"), true).as_deref(),
            Ok("https://trainer-3.svc:9000")
        );
        assert_eq!(
            url(any, Some("10.0.0.5"), false).as_deref(),
            Ok("http://10.0.0.5:7001")
        );
        assert_eq!(
            url(any6, Some("[2001:db8::1]"), false).as_deref(),
            Ok("http://[2001:db8::1]:7001")
        );
        assert_eq!(
            url(any6, Some("[2001:db8::1]:9"), false).as_deref(),
            Ok("http://[2001:db8::1]:9")
        );
        for (bad, why) in [
            ("", "HOST or HOST:PORT"),
            ("http://trainer-3", "without a scheme"),
            ("trainer-3/x", "without a scheme or path"),
            ("trainer 3", "HOST or HOST:PORT"),
            ("trainer-3:0", "port"),
            ("trainer-3:http", "port"),
            ("trainer-3:70000", "port"),
            ("2001:db8::1", "brackets"),
        ] {
            let err = url(any, Some(bad), false).expect_err(bad);
            assert!(
                err.contains(why) && err.contains("--advertise"),
                "{bad}: {err}"
            );
        }
    }
}
