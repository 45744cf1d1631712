//! The dispatcher's gRPC service end to end: a real server on 127.0.0.1:0, real tonic clients,
//! a manual clock, and a real shutdown signal.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lode_dispatcher::journal::JOURNAL_FILE;
use lode_dispatcher::{
    index_batch, serve, DispatcherConfig, JobId, JournalError, ManualClock, ServeError,
    ServiceConfig, Shuffle, StepId, MIN_LEASE_SHARE, PROTOCOL_VERSION,
};
use lode_proto::service::v1::{self, lease_response::Outcome};
use lode_proto::service::{connect, ClientError, DispatcherClient, MAX_STEPS_PER_REQUEST};
use lode_proto::tls::{ClientTls, ServerTls};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Code;

const JOB: u64 = 7;
const TOKEN: &str = "job-7-secret";
const PLAN: &str = r#"{"version":1,"note":"stand-in plan"}"#;
const LEASE_MS: u64 = 1_000;

fn config(stages: u32) -> DispatcherConfig {
    DispatcherConfig {
        records: 20,
        batch_size: 3,
        drop_remainder: false,
        shuffle: Shuffle::Seeded { seed: 11 },
        chain: None,
        epochs: Some(2),
        restart_every: None,
        lease_duration: Duration::from_millis(LEASE_MS),
        max_leases_per_worker: 2,
        stages,
    }
}

/// One stage, one epoch of two steps of 3 records.
fn two_steps() -> DispatcherConfig {
    let mut small = config(1);
    small.records = 6;
    small.epochs = Some(1);
    small
}

fn graphs(stages: u32) -> Vec<Vec<u8>> {
    (0..stages)
        .map(|s| format!("graph of stage {s}").into_bytes())
        .collect()
}

/// A running dispatcher and the means to stop it.
struct Server {
    endpoint: String,
    clock: Arc<ManualClock>,
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl Server {
    async fn start(dir: &Path, dispatcher: DispatcherConfig) -> Server {
        Server::start_with(dir, dispatcher, None).await
    }

    /// A dispatcher that serves TLS only when `tls` is given (its endpoint is then https).
    async fn start_with(
        dir: &Path,
        dispatcher: DispatcherConfig,
        tls: Option<ServerTls>,
    ) -> Server {
        Server::start_configured(dir, dispatcher, |config| config.tls = tls).await
    }

    /// A dispatcher whose service config `configure` adjusts last.
    async fn start_configured(
        dir: &Path,
        dispatcher: DispatcherConfig,
        configure: impl FnOnce(&mut ServiceConfig),
    ) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let local = listener.local_addr().expect("local addr");
        let clock = Arc::new(ManualClock::new());
        let stages = dispatcher.stages;
        let mut config = ServiceConfig::new(
            JobId(JOB),
            TOKEN,
            dispatcher,
            PLAN.to_owned(),
            graphs(stages),
            dir,
        );
        config.clock = clock.clone();
        configure(&mut config);
        let endpoint = lode_proto::tls::url(local, config.tls.is_some());
        let (shutdown, stopped) = oneshot::channel();
        let task = tokio::spawn(serve(listener, config, async {
            let _ = stopped.await;
        }));
        Server {
            endpoint,
            clock,
            shutdown,
            task,
        }
    }

    async fn client(&self) -> DispatcherClient {
        connect(&self.endpoint, TOKEN, None).await.expect("connect")
    }

    async fn stop(self) {
        let _ = self.shutdown.send(());
        self.task
            .await
            .expect("server task")
            .expect("server stopped cleanly");
    }
}

async fn register(client: &mut DispatcherClient, stage: i32) -> v1::RegisterResponse {
    client
        .register(v1::RegisterRequest {
            job_id: JOB,
            protocol_version: PROTOCOL_VERSION,
            stage,
            worker_name: "test-worker".into(),
        })
        .await
        .expect("register")
        .into_inner()
}

/// Registers the training side's receiver (an address nobody dials here) with `window` steps.
async fn register_consumer(client: &mut DispatcherClient, window: u64) {
    client
        .register_consumer(v1::RegisterConsumerRequest {
            job_id: JOB,
            receiver_addr: "http://127.0.0.1:9".into(),
            resume_from: None,
            window,
        })
        .await
        .expect("consumer");
}

async fn lease(client: &mut DispatcherClient, worker: u64) -> Outcome {
    client
        .lease(v1::LeaseRequest {
            job_id: JOB,
            worker_id: worker,
            max_steps: 0,
            ..Default::default()
        })
        .await
        .expect("lease")
        .into_inner()
        .outcome
        .expect("an outcome")
}

/// A batch's leases one step each (its runs unfolded).
fn unfold(batch: v1::StepLeases) -> Vec<v1::StepLease> {
    batch.into_leases().expect("a batch a worker can read")
}

/// A lease's records, in whichever form they came (listed, or a range).
fn records_of(lease: &v1::StepLease) -> Vec<u64> {
    lease.clone().take_records().expect("a lease's records")
}

async fn leased(client: &mut DispatcherClient, worker: u64) -> v1::StepLease {
    match lease(client, worker).await {
        Outcome::Lease(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

async fn complete(
    client: &mut DispatcherClient,
    worker: u64,
    stage: u32,
    epoch: u64,
    step: u64,
) -> Result<(), tonic::Status> {
    client
        .complete(v1::CompleteRequest {
            job_id: JOB,
            worker_id: worker,
            stage,
            epoch,
            step,
            compute_us: 1_000,
            steps: Vec::new(),
        })
        .await
        .map(drop)
}

async fn consumed(client: &mut DispatcherClient, epoch: u64, step: u64) {
    client
        .consumed(v1::ConsumedRequest {
            job_id: JOB,
            epoch,
            step,
            busy_us: 500,
            end_job: false,
            window: 0,
        })
        .await
        .expect("consumed");
}

/// Reports `steps` (epoch, step, the grant's deadline or 0) of stage 0 completed in one
/// request, 10 µs of compute each; returns the refused ones.
async fn report_steps(
    client: &mut DispatcherClient,
    worker: u64,
    steps: &[(u64, u64, u64)],
) -> Vec<(u64, u64)> {
    let steps = steps
        .iter()
        .map(|&(epoch, step, deadline_ms)| v1::CompletedStep {
            epoch,
            step,
            compute_us: 10,
            deadline_ms,
            run_steps: 0,
        })
        .collect();
    client
        .complete(v1::CompleteRequest {
            job_id: JOB,
            worker_id: worker,
            stage: 0,
            epoch: 0,
            step: 0,
            compute_us: 0,
            steps,
        })
        .await
        .expect("complete")
        .into_inner()
        .refused
        .iter()
        .map(|s| (s.epoch, s.step))
        .collect()
}

/// The part of a status that survives a restart: worker names and the scheduler's counters
/// are not journaled (they restart empty and at zero).
fn durable(mut status: v1::StatusResponse) -> v1::StatusResponse {
    for w in &mut status.workers {
        w.name.clear();
        w.steps_computed = 0;
        w.compute_us = 0;
    }
    status.steps_computed = 0;
    status.compute_us = 0;
    status.consumer_busy_us = 0;
    status.journal_compactions = 0;
    status
}

async fn status(client: &mut DispatcherClient) -> v1::StatusResponse {
    client
        .status(v1::StatusRequest { job_id: JOB })
        .await
        .expect("status")
        .into_inner()
}

fn batch_of(config: &DispatcherConfig, epoch: u64, step: u64) -> Vec<u64> {
    index_batch(config, StepId::new(epoch, step)).expect("step in range")
}

/// An unshuffled job's batch of consecutive steps travels as runs (protocol 7): one per
/// stretch of steps of one epoch and one batch size, each unfolding into the steps and records
/// the dispatcher granted, in order.
#[tokio::test]
async fn consecutive_steps_of_an_unshuffled_job_are_leased_as_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut plain = config(1);
    plain.shuffle = Shuffle::Off;
    plain.records = 20; // 7 steps an epoch: six of 3 records, then one of 2
    plain.max_leases_per_worker = 64;
    let server = Server::start(dir.path(), plain.clone()).await;
    let mut client = server.client().await;
    let w = register(&mut client, 0).await;
    let answer = client
        .lease(v1::LeaseRequest {
            job_id: JOB,
            worker_id: w.worker_id,
            max_steps: 14,
            ..Default::default()
        })
        .await
        .expect("lease")
        .into_inner();
    let Some(Outcome::Leases(batch)) = answer.outcome else {
        panic!("a batch: {answer:?}");
    };
    let runs: Vec<(u64, u64, u64)> = batch
        .steps
        .iter()
        .map(|l| (l.epoch, l.step, l.run_len()))
        .collect();
    // The short last step of each epoch breaks the run (another batch size), and so does the
    // epoch (the next epoch's records start again from 0).
    assert_eq!(runs, [(0, 0, 6), (0, 6, 1), (1, 0, 6), (1, 6, 1)]);
    let steps = unfold(batch);
    assert_eq!(steps.len(), 14);
    for (k, lease) in steps.iter().enumerate() {
        let k = u64::try_from(k).expect("small");
        assert_eq!((lease.epoch, lease.step), (k / 7, k % 7));
        assert_eq!(
            records_of(lease),
            batch_of(&plain, lease.epoch, lease.step),
            "{lease:?}"
        );
    }
}

/// A worker at its share still gets a returned step (a lost or expired lease's, the one the
/// training side is likely waiting for while every other worker's steps are parked on its
/// full window), and only such a step: otherwise a pause.
#[tokio::test]
async fn a_worker_at_its_share_gets_a_returned_step_and_only_that() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut roomy = config(1);
    roomy.records = 3000;
    roomy.max_leases_per_worker = 64;
    let server = Server::start(dir.path(), roomy).await;
    let mut client = server.client().await;
    let first = register(&mut client, 0).await;
    let second = register(&mut client, 0).await;
    register_consumer(&mut client, 8).await;
    let mut ask = async |worker| {
        let answer = client
            .lease(v1::LeaseRequest {
                job_id: JOB,
                worker_id: worker,
                max_steps: 64,
                ..Default::default()
            })
            .await
            .expect("lease")
            .into_inner();
        assert_eq!(answer.max_leases, 4, "two share 8");
        match answer.outcome {
            Some(Outcome::Leases(granted)) => {
                Ok(unfold(granted).iter().map(|l| l.step).collect::<Vec<_>>())
            }
            other => Err(other),
        }
    };
    assert_eq!(ask(second.worker_id).await, Ok(vec![0, 1, 2, 3]));
    server.clock.advance(Duration::from_millis(LEASE_MS / 2));
    assert_eq!(ask(first.worker_id).await, Ok(vec![4, 5, 6, 7]));
    let pause = Some(Outcome::Wait(v1::Wait {
        retry_after_ms: u64::try_from(lode_dispatcher::service::LEASE_RETRY_AFTER.as_millis())
            .expect("small"),
    }));
    assert_eq!(
        ask(first.worker_id).await,
        Err(pause.clone()),
        "at its share, nothing returned"
    );
    // The second worker's leases expire: the first, at its share, gets them one at a time,
    // lowest first.
    server.clock.advance(Duration::from_millis(LEASE_MS / 2));
    assert_eq!(ask(first.worker_id).await, Ok(vec![0]));
    assert_eq!(ask(first.worker_id).await, Ok(vec![1]));
}

/// The workers of a stage share the training side's window as leases: each registration and
/// each lease answer says the worker's share now, and a worker over it leases nothing more.
#[tokio::test]
async fn workers_share_the_receivers_window_as_leases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut roomy = config(1);
    roomy.records = 3000;
    roomy.max_leases_per_worker = 64;
    let server = Server::start(dir.path(), roomy).await;
    let mut client = server.client().await;
    let alone = register(&mut client, 0).await;
    assert_eq!(alone.max_leases, 64, "the default window of 64, alone");
    register_consumer(&mut client, 48).await;
    let batch = |worker| v1::LeaseRequest {
        job_id: JOB,
        worker_id: worker,
        max_steps: 64,
        ..Default::default()
    };
    let answer = client
        .lease(batch(alone.worker_id))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(answer.max_leases, 48, "the consumer's window");
    let Some(Outcome::Leases(granted)) = answer.outcome else {
        panic!("a batch: {answer:?}");
    };
    assert_eq!(
        granted.steps.len(),
        48,
        "shuffled records are listed: no runs"
    );
    let granted = unfold(granted);
    assert_eq!(granted.len(), 48, "at most its share");
    let second = register(&mut client, 0).await;
    assert_eq!(second.max_leases, 24, "two share 48");
    let over = client
        .lease(batch(alone.worker_id))
        .await
        .expect("lease")
        .into_inner();
    assert_eq!(over.max_leases, 24);
    assert_eq!(
        over.outcome,
        Some(Outcome::Wait(v1::Wait {
            retry_after_ms: u64::try_from(lode_dispatcher::service::LEASE_RETRY_AFTER.as_millis())
                .expect("small")
        })),
        "48 held, 24 allowed, nothing returned: nothing more, and a pause (it asks at its \
         limit only when everything it holds is parked)"
    );
    let Some(Outcome::Leases(theirs)) = client
        .lease(batch(second.worker_id))
        .await
        .expect("lease")
        .into_inner()
        .outcome
    else {
        panic!("a batch");
    };
    assert_eq!(unfold(theirs).len(), 24);
    // However many workers, each keeps a few.
    for _ in 0..20 {
        register(&mut client, 0).await;
    }
    assert_eq!(register(&mut client, 0).await.max_leases, MIN_LEASE_SHARE);
}

/// The training side's reports say its window as it changes (a receiver bounded in bytes
/// learns its steps' size): the workers' shares follow from their next answer.
#[tokio::test]
async fn the_window_a_consumed_report_says_sets_the_shares() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut roomy = config(1);
    roomy.records = 3000;
    roomy.max_leases_per_worker = 1024;
    let server = Server::start(dir.path(), roomy).await;
    let mut client = server.client().await;
    let worker = register(&mut client, 0).await;
    register_consumer(&mut client, 64).await;
    let lease = |max_steps| v1::LeaseRequest {
        job_id: JOB,
        worker_id: worker.worker_id,
        max_steps,
        ..Default::default()
    };
    let first = client.lease(lease(4)).await.expect("lease").into_inner();
    assert_eq!(first.max_leases, 64, "the registered window");
    let consumed = |window| v1::ConsumedRequest {
        job_id: JOB,
        epoch: 0,
        step: 0,
        busy_us: 0,
        end_job: false,
        window,
    };
    client.consumed(consumed(512)).await.expect("consumed");
    let second = client.lease(lease(4)).await.expect("lease").into_inner();
    assert_eq!(second.max_leases, 512, "the window reported");
    client.consumed(consumed(0)).await.expect("consumed");
    let third = client.lease(lease(4)).await.expect("lease").into_inner();
    assert_eq!(third.max_leases, 512, "0: unchanged");
    let other = register(&mut client, 0).await;
    assert_eq!(other.max_leases, 256, "two share it");
}

/// A lease request may carry the worker's report: its steps are completed first, so they
/// free room for the grant; steps it does not hold come back refused.
#[tokio::test]
async fn a_lease_carries_a_report_completed_before_the_grant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), config(1)).await;
    let mut client = server.client().await;
    let w = register(&mut client, 0).await;
    assert_eq!(w.max_leases, 2);
    let ask = |completed: Vec<v1::CompletedStep>| v1::LeaseRequest {
        job_id: JOB,
        worker_id: w.worker_id,
        max_steps: 2,
        stage: 0,
        completed,
    };
    let first = client
        .lease(ask(Vec::new()))
        .await
        .expect("lease")
        .into_inner();
    let Some(Outcome::Leases(first)) = first.outcome else {
        panic!("a batch: {first:?}");
    };
    let first = unfold(first);
    assert_eq!(first.iter().map(|s| s.step).collect::<Vec<_>>(), [0, 1]);
    // At its limit: only a report makes room.
    assert!(matches!(
        client
            .lease(ask(Vec::new()))
            .await
            .expect("lease")
            .into_inner()
            .outcome,
        Some(Outcome::Wait(_))
    ));
    let mut report: Vec<v1::CompletedStep> = first
        .iter()
        .map(|s| v1::CompletedStep {
            epoch: s.epoch,
            step: s.step,
            compute_us: 10,
            deadline_ms: s.deadline_ms,
            run_steps: 0,
        })
        .collect();
    report.push(v1::CompletedStep {
        epoch: 0,
        step: 5,
        compute_us: 10,
        deadline_ms: 0,
        run_steps: 0,
    });
    let answer = client.lease(ask(report)).await.expect("lease").into_inner();
    assert_eq!(
        answer.refused,
        [v1::StepRef { epoch: 0, step: 5 }],
        "never leased to it"
    );
    let Some(Outcome::Leases(next)) = answer.outcome else {
        panic!("a batch: {answer:?}");
    };
    let next = unfold(next);
    assert_eq!(next.iter().map(|s| s.step).collect::<Vec<_>>(), [2, 3]);
    let now = status(&mut client).await;
    assert_eq!(now.leases.len(), 2, "0 and 1 are complete");
    assert_eq!((now.steps_computed, now.compute_us), (2, 20));

    // Steps 2 and 3 reported as one run (protocol 7): both complete, their compute time
    // counted whole; a run that stands for more steps than a request may is refused.
    let run = v1::CompletedStep {
        epoch: 0,
        step: 2,
        compute_us: 31,
        deadline_ms: next[0].deadline_ms,
        run_steps: 2,
    };
    assert_eq!(next[0].deadline_ms, next[1].deadline_ms, "one grant");
    let answer = client
        .lease(ask(vec![run]))
        .await
        .expect("lease")
        .into_inner();
    assert!(answer.refused.is_empty(), "{answer:?}");
    let now = status(&mut client).await;
    assert_eq!((now.steps_computed, now.compute_us), (4, 51));
    let too_long = v1::CompletedStep {
        run_steps: u64::from(MAX_STEPS_PER_REQUEST) + 1,
        ..run
    };
    let err = client
        .lease(ask(vec![too_long]))
        .await
        .expect_err("over the limit");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("1024-step limit"),
        "{}",
        err.message()
    );
}

/// A worker whose stage is done waits while the training side has not consumed every step
/// (it is told to ask again, not that the data ended): a receiver restart returns what the
/// receiver held, and this worker leases it again. Only the end of data ends it.
#[tokio::test]
async fn a_finished_stage_keeps_its_workers_until_the_end_of_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), two_steps()).await;
    let mut client = server.client().await;
    let w = register(&mut client, 0).await.worker_id;
    let receiver = |resume_from| v1::RegisterConsumerRequest {
        job_id: JOB,
        receiver_addr: "http://127.0.0.1:9".into(),
        resume_from,
        window: 0,
    };
    client
        .register_consumer(receiver(None))
        .await
        .expect("consumer");
    for step in 0..2 {
        let lease = leased(&mut client, w).await;
        assert_eq!((lease.epoch, lease.step), (0, step));
        complete(&mut client, w, 0, 0, step)
            .await
            .expect("complete");
    }
    // Both steps done, none consumed: wait, do not end.
    let waiting = lease(&mut client, w).await;
    assert_eq!(
        waiting,
        Outcome::Wait(v1::Wait {
            retry_after_ms: 250
        }),
        "the stage is done, the data is not"
    );
    // The training side takes step 0, then restarts: its receiver held step 1, which comes
    // back to this worker.
    consumed(&mut client, 0, 0).await;
    client
        .register_consumer(receiver(Some(v1::StepRef { epoch: 0, step: 1 })))
        .await
        .expect("consumer again");
    let again = leased(&mut client, w).await;
    assert_eq!(
        (again.epoch, again.step),
        (0, 1),
        "redone by the same worker"
    );
    complete(&mut client, w, 0, 0, 1).await.expect("complete");
    consumed(&mut client, 0, 1).await;
    assert!(matches!(lease(&mut client, w).await, Outcome::EndOfData(_)));
}

#[tokio::test]
async fn register_lease_complete_consume_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let small = two_steps();
    let server = Server::start(dir.path(), small.clone()).await;
    let mut client = server.client().await;

    let first = register(&mut client, -1).await;
    assert_eq!(first.stage, 0);
    assert_eq!(first.plan_json, PLAN);
    assert_eq!(&first.stage_graph[..], b"graph of stage 0");
    assert_eq!(first.receiver_addr, "", "no consumer yet");
    assert_eq!(first.lease_duration_ms, LEASE_MS);
    assert_eq!(
        first.heartbeat_interval_ms,
        u64::try_from(lode_dispatcher::service::DEFAULT_HEARTBEAT_INTERVAL.as_millis())
            .expect("small")
    );
    assert_eq!(first.max_leases, 2);

    let consumer = client
        .register_consumer(v1::RegisterConsumerRequest {
            job_id: JOB,
            receiver_addr: "http://127.0.0.1:9".into(),
            resume_from: None,
            window: 0,
        })
        .await
        .expect("consumer")
        .into_inner();
    assert_eq!(consumer.first_step, Some(v1::StepRef { epoch: 0, step: 0 }));
    assert_eq!(consumer.plan_json, PLAN);
    let second = register(&mut client, 0).await;
    assert_ne!(second.worker_id, first.worker_id);
    assert_eq!(second.receiver_addr, "http://127.0.0.1:9");

    let a = leased(&mut client, first.worker_id).await;
    assert_eq!((a.stage, a.epoch, a.step), (0, 0, 0));
    assert_eq!(records_of(&a), batch_of(&small, 0, 0));
    assert_eq!(a.deadline_ms, a.now_ms + LEASE_MS);
    let b = leased(&mut client, second.worker_id).await;
    assert_eq!((b.epoch, b.step), (0, 1));
    assert_eq!(records_of(&b), batch_of(&small, 0, 1));
    // Nothing left to lease while both steps are out.
    assert!(matches!(
        lease(&mut client, first.worker_id).await,
        Outcome::Wait(v1::Wait { retry_after_ms }) if retry_after_ms > 0
    ));

    complete(&mut client, first.worker_id, 0, 0, 0)
        .await
        .expect("complete");
    let twice = complete(&mut client, first.worker_id, 0, 0, 0)
        .await
        .expect_err("completes once");
    assert_eq!(twice.code(), Code::FailedPrecondition, "{twice:?}");
    consumed(&mut client, 0, 0).await;
    let mid = status(&mut client).await;
    assert_eq!(mid.watermark, Some(v1::StepRef { epoch: 0, step: 0 }));
    assert_eq!((mid.steps_consumed, mid.steps_per_epoch), (1, 2));
    assert!(!mid.end_of_data);
    assert_eq!(mid.workers.len(), 2);
    assert_eq!(mid.leases.len(), 1);
    assert_eq!(mid.leases[0].worker, second.worker_id);
    // The scheduler's counters: the refused second completion is not counted.
    assert_eq!(
        (mid.steps_computed, mid.compute_us, mid.consumer_busy_us),
        (1, 1_000, 500)
    );
    assert_eq!(mid.epochs, 1);
    assert_eq!(mid.stages, 1);
    assert!(mid.workers.iter().all(|w| w.name == "test-worker"));
    // Each worker's share of them: the first computed the one step.
    let share = |s: &v1::StatusResponse, id: u64| {
        s.workers
            .iter()
            .find(|w| w.id == id)
            .map(|w| (w.steps_computed, w.compute_us))
    };
    assert_eq!(share(&mid, first.worker_id), Some((1, 1_000)));
    assert_eq!(share(&mid, second.worker_id), Some((0, 0)));

    complete(&mut client, second.worker_id, 0, 0, 1)
        .await
        .expect("complete");
    consumed(&mut client, 0, 1).await;
    assert!(matches!(
        lease(&mut client, first.worker_id).await,
        Outcome::EndOfData(_)
    ));
    let done = status(&mut client).await;
    assert!(done.end_of_data);
    assert_eq!(done.steps_consumed, 2);
    assert!(done.leases.is_empty());
    assert_eq!(
        (done.steps_computed, done.compute_us, done.consumer_busy_us),
        (2, 2_000, 1_000)
    );
    assert_eq!(share(&done, second.worker_id), Some((1, 1_000)));

    // Scale-in: the drained worker learns it from its heartbeat and its lease answer.
    client
        .drain(v1::DrainRequest {
            job_id: JOB,
            worker_id: first.worker_id,
        })
        .await
        .expect("drain");
    let beat = client
        .heartbeat(v1::HeartbeatRequest {
            job_id: JOB,
            worker_id: first.worker_id,
        })
        .await
        .expect("heartbeat")
        .into_inner();
    assert!(beat.draining);
    assert!(matches!(
        lease(&mut client, first.worker_id).await,
        Outcome::Drained(_)
    ));
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn bad_credentials_and_other_jobs_are_rejected_without_touching_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), config(1)).await;
    let mut client = server.client().await;
    let worker = register(&mut client, 0).await.worker_id;
    let held = leased(&mut client, worker).await;
    // A lease is answered before its journal line reaches the file (the writer thread writes
    // it); a registration is answered only once the journal is synced through it, so after
    // one the file holds everything before it.
    register(&mut client, 0).await;
    let before = status(&mut client).await;
    let journal = dir.path().join(JOURNAL_FILE);
    let journal_before = std::fs::read(&journal).expect("journal");

    let mut no_token = v1::dispatcher_client::DispatcherClient::connect(server.endpoint.clone())
        .await
        .expect("connect");
    let mut wrong_token = connect(&server.endpoint, "not-the-token", None)
        .await
        .expect("connect");
    let checks: [(Code, u64); 3] = [
        (Code::Unauthenticated, JOB),
        (Code::Unauthenticated, JOB),
        (Code::PermissionDenied, JOB + 1),
    ];
    for (i, (code, job_id)) in checks.into_iter().enumerate() {
        // The same requests through each kind of bad client.
        macro_rules! each_rpc {
            ($client:expr) => {{
                let c = $client;
                vec![
                    c.register(v1::RegisterRequest {
                        job_id,
                        protocol_version: PROTOCOL_VERSION,
                        stage: -1,
                        worker_name: "intruder".into(),
                    })
                    .await
                    .map(drop),
                    c.lease(v1::LeaseRequest {
                        job_id,
                        worker_id: worker,
                        max_steps: 0,
                        ..Default::default()
                    })
                    .await
                    .map(drop),
                    c.heartbeat(v1::HeartbeatRequest {
                        job_id,
                        worker_id: worker,
                    })
                    .await
                    .map(drop),
                    c.complete(v1::CompleteRequest {
                        job_id,
                        worker_id: worker,
                        stage: 0,
                        epoch: held.epoch,
                        step: held.step,
                        compute_us: 0,
                        steps: Vec::new(),
                    })
                    .await
                    .map(drop),
                    c.consumed(v1::ConsumedRequest {
                        job_id,
                        epoch: 0,
                        step: 0,
                        busy_us: 0,
                        end_job: false,
                        window: 0,
                    })
                    .await
                    .map(drop),
                    c.register_consumer(v1::RegisterConsumerRequest {
                        job_id,
                        receiver_addr: "http://127.0.0.1:9".into(),
                        resume_from: None,
                        window: 0,
                    })
                    .await
                    .map(drop),
                    c.drain(v1::DrainRequest {
                        job_id,
                        worker_id: worker,
                    })
                    .await
                    .map(drop),
                    c.status(v1::StatusRequest { job_id }).await.map(drop),
                ]
            }};
        }
        let results = match i {
            0 => each_rpc!(&mut no_token),
            1 => each_rpc!(&mut wrong_token),
            _ => each_rpc!(&mut client),
        };
        assert_eq!(results.len(), 8);
        for result in results {
            let err = result.expect_err("rejected");
            assert_eq!(err.code(), code, "{err:?}");
        }
    }
    assert_eq!(status(&mut client).await, before, "state unchanged");
    assert_eq!(
        std::fs::read(&journal).expect("journal"),
        journal_before,
        "nothing journaled"
    );
    // The legitimate holder still completes its step.
    complete(&mut client, worker, 0, held.epoch, held.step)
        .await
        .expect("complete");
    drop((client, no_token, wrong_token));
    server.stop().await;
}

/// A file of the test-only TLS material in `proto/testdata/tls/`.
fn testdata(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../proto/testdata/tls")
        .join(file)
}

/// The error chain in one line, as the binary prints it.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

#[tokio::test]
async fn a_tls_dispatcher_serves_clients_that_trust_its_ca_and_no_one_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let identity =
        ServerTls::from_pem_files(&testdata("server.crt"), &testdata("server.key")).expect("id");
    let server = Server::start_with(dir.path(), config(1), Some(identity)).await;
    assert!(server.endpoint.starts_with("https://127.0.0.1:"));
    let ca = ClientTls::from_ca_file(&testdata("ca.crt")).expect("CA");

    // Over TLS, by IP (the certificate's IP SAN) and by name (its DNS SAN).
    let mut client = connect(&server.endpoint, TOKEN, Some(&ca))
        .await
        .expect("connect over TLS");
    let worker = register(&mut client, 0).await.worker_id;
    leased(&mut client, worker).await;
    let by_name = server.endpoint.replacen("127.0.0.1", "localhost", 1);
    let mut named = connect(&by_name, TOKEN, Some(&ca))
        .await
        .expect("connect by name");
    assert_eq!(status(&mut named).await.workers.len(), 1);

    // A plaintext client on the same port is refused before anything looks at its request,
    // and told how to reach the port.
    let plain = server.endpoint.replacen("https://", "http://", 1);
    let mut c = connect(&plain, TOKEN, None)
        .await
        .expect("a plaintext connection is taken, to answer it");
    let register = v1::RegisterRequest {
        job_id: JOB,
        ..Default::default()
    };
    let refusals = [
        c.status(v1::StatusRequest { job_id: JOB })
            .await
            .map(|_| ()),
        c.register(register).await.map(|_| ()),
    ];
    for refused in refusals {
        let refused = refused.expect_err("plaintext");
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        let message = refused.message();
        assert!(
            message.contains("TLS only") && message.contains(&server.endpoint),
            "{refused:?}"
        );
    }
    // A client that trusts another CA refuses the server; not worth retrying.
    let other = ClientTls::from_ca_file(&testdata("other-ca.crt")).expect("other CA");
    let distrust = connect(&server.endpoint, TOKEN, Some(&other))
        .await
        .expect_err("unknown issuer");
    assert!(!distrust.is_unreachable(), "{distrust:?}");
    let text = chain(&distrust);
    assert!(
        text.contains(&server.endpoint) && text.contains("certificate"),
        "{text}"
    );
    // An https address without a CA: a clear error naming the address and the flag.
    let no_ca = connect(&server.endpoint, TOKEN, None)
        .await
        .expect_err("no CA");
    assert!(matches!(no_ca, ClientError::Dial(_)), "{no_ca:?}");
    let text = no_ca.to_string();
    assert!(
        text.contains(&server.endpoint) && text.contains("--tls-ca"),
        "{text}"
    );

    // None of that disturbed the server or the state.
    let after = status(&mut client).await;
    assert_eq!(after.workers.len(), 1);
    assert_eq!(after.leases.len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_worker_of_another_protocol_version_is_refused_naming_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), config(1)).await;
    let mut client = server.client().await;
    let other = PROTOCOL_VERSION + 1;
    let err = client
        .register(v1::RegisterRequest {
            job_id: JOB,
            protocol_version: other,
            stage: 0,
            worker_name: "from the future".into(),
        })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains(&format!("version {other}"))
            && err.message().contains(&PROTOCOL_VERSION.to_string()),
        "{}",
        err.message()
    );
    assert!(status(&mut client).await.workers.is_empty());
    // A stage outside the plan is the caller's mistake.
    let err = client
        .register(v1::RegisterRequest {
            job_id: JOB,
            protocol_version: PROTOCOL_VERSION,
            stage: 5,
            worker_name: String::new(),
        })
        .await
        .expect_err("no stage 5");
    assert_eq!(err.code(), Code::InvalidArgument);
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn an_expired_lease_goes_to_another_worker_with_the_same_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), config(1)).await;
    let mut client = server.client().await;
    let slow = register(&mut client, 0).await.worker_id;
    let fast = register(&mut client, 0).await.worker_id;
    let first = leased(&mut client, slow).await;
    assert_eq!((first.epoch, first.step), (0, 0));

    // Just before the deadline the step is still the slow worker's.
    server.clock.advance(Duration::from_millis(LEASE_MS - 1));
    let next = leased(&mut client, fast).await;
    assert_eq!((next.epoch, next.step), (0, 1));
    // At the deadline it goes out again, before any new step, with the identical batch.
    server.clock.advance(Duration::from_millis(1));
    let again = leased(&mut client, fast).await;
    assert_eq!((again.epoch, again.step), (0, 0));
    assert_eq!(records_of(&again), records_of(&first));
    assert_eq!(again.deadline_ms, LEASE_MS + LEASE_MS);

    let late = complete(&mut client, slow, 0, 0, 0)
        .await
        .expect_err("no longer held");
    assert_eq!(late.code(), Code::FailedPrecondition, "{late:?}");
    complete(&mut client, fast, 0, 0, 0)
        .await
        .expect("the new holder completes");
    drop(client);
    server.stop().await;
}

/// Drives a two-stage job to the middle of its first epoch: completed and consumed steps, an
/// expired and re-leased step, leases outstanding in both stages. Returns the worker ids.
async fn mid_epoch(server: &Server, client: &mut DispatcherClient) -> [u64; 3] {
    let a = register(client, 0).await.worker_id;
    let b = register(client, 0).await.worker_id;
    let c = register(client, 1).await.worker_id;
    register_consumer(client, 0).await;
    assert_eq!(leased(client, a).await.step, 0);
    assert_eq!(leased(client, b).await.step, 1);
    assert_eq!(leased(client, a).await.step, 2);
    complete(client, a, 0, 0, 0).await.expect("complete");
    complete(client, b, 0, 0, 1).await.expect("complete");
    assert_eq!(leased(client, c).await.step, 0);
    complete(client, c, 1, 0, 0).await.expect("complete");
    consumed(client, 0, 0).await;
    // A's step 2 expires; B gets it again.
    server.clock.advance(Duration::from_millis(LEASE_MS));
    let again = leased(client, b).await;
    assert_eq!(
        (again.step, records_of(&again)),
        (2, batch_of(&config(2), 0, 2))
    );
    assert_eq!(leased(client, c).await.step, 1);
    [a, b, c]
}

/// What the job answers next: more leases from every worker, a new worker's registration.
async fn next_answers(client: &mut DispatcherClient, [a, b, c]: [u64; 3]) -> Vec<String> {
    let mut out = Vec::new();
    for worker in [a, b, a, c, b] {
        out.push(format!("{:?}", lease(client, worker).await));
    }
    complete(client, b, 0, 0, 2).await.expect("complete");
    out.push(format!("{:?}", lease(client, c).await));
    out.push(format!("{}", register(client, -1).await.worker_id));
    out.push(format!("{:?}", durable(status(client).await)));
    out
}

#[tokio::test]
async fn a_restart_from_the_journal_mid_epoch_gives_the_same_status_and_next_leases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), config(2)).await;
    let mut client = server.client().await;
    let workers = mid_epoch(&server, &mut client).await;
    let before = status(&mut client).await;
    let held: Vec<(u32, u64, u64)> = before
        .leases
        .iter()
        .map(|l| (l.stage, l.step, l.worker))
        .collect();
    assert_eq!(held, [(0, 2, workers[1]), (1, 1, workers[2])], "{before:?}");
    assert_eq!(before.watermark, Some(v1::StepRef { epoch: 0, step: 0 }));

    // Every answer was journaled before it was sent, and a synced answer (this repeated
    // watermark report changes nothing) waits until the journal holds everything before it on
    // disk: a copy now is what a crash would leave.
    consumed(&mut client, 0, 0).await;
    let copy = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        dir.path().join(JOURNAL_FILE),
        copy.path().join(JOURNAL_FILE),
    )
    .expect("copy journal");
    let expected = next_answers(&mut client, workers).await;
    drop(client);
    server.stop().await;

    let restarted = Server::start(copy.path(), config(2)).await;
    let mut client = restarted.client().await;
    assert_eq!(
        durable(status(&mut client).await),
        durable(before),
        "the same status"
    );
    assert_eq!(
        next_answers(&mut client, workers).await,
        expected,
        "the same next answers, record for record"
    );
    drop(client);
    restarted.stop().await;
}

#[tokio::test]
async fn a_torn_journal_tail_is_cut_and_the_job_continues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), config(1)).await;
    let mut client = server.client().await;
    let worker = register(&mut client, 0).await.worker_id;
    let held = leased(&mut client, worker).await;
    let before = status(&mut client).await;
    drop(client);
    server.stop().await;

    // A crash in the middle of writing the next line.
    let journal = dir.path().join(JOURNAL_FILE);
    let intact = std::fs::read(&journal).expect("journal");
    let mut torn = intact.clone();
    torn.extend_from_slice(b"0badc0de {\"at\":5,\"records\":[{\"Event\":{\"LeaseGr");
    std::fs::write(&journal, &torn).expect("tear");

    let server = Server::start(dir.path(), config(1)).await;
    let mut client = server.client().await;
    assert_eq!(durable(status(&mut client).await), durable(before));
    assert_eq!(
        std::fs::read(&journal).expect("journal"),
        intact,
        "tail cut"
    );
    complete(&mut client, worker, 0, held.epoch, held.step)
        .await
        .expect("the lease survived the restart");
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a_corrupt_or_foreign_journal_stops_the_start_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), config(1)).await;
    let mut client = server.client().await;
    let worker = register(&mut client, 0).await.worker_id;
    leased(&mut client, worker).await;
    drop(client);
    server.stop().await;

    // Another config: refused, naming the field.
    let mut other = config(1);
    other.batch_size = 4;
    let started = Server::start(dir.path(), other).await;
    let err = started.task.await.expect("task").expect_err("refused");
    assert!(
        matches!(&err, ServeError::Journal(JournalError::ConfigMismatch { fields, .. }) if fields == &["batch_size"]),
        "{err}"
    );

    // A flipped byte in a line that is not the last: corruption, named by file and line.
    let journal = dir.path().join(JOURNAL_FILE);
    let text = std::fs::read_to_string(&journal).expect("journal");
    let broken = text.replacen("WorkerRegistered", "WorkerRegisterex", 1);
    std::fs::write(&journal, broken).expect("write");
    let started = Server::start(dir.path(), config(1)).await;
    let err = started.task.await.expect("task").expect_err("refused");
    let message = err.to_string();
    assert!(
        message.contains(JOURNAL_FILE) && message.contains("line 2"),
        "{message}"
    );
}

/// Batches on the wire: one `Lease` grants up to `max_steps` (within the worker's limit), each
/// with its own batch; one `Complete` reports several and lists those not held as refused;
/// an expired step of a batch goes to another worker alone, with the same records.
#[tokio::test]
async fn a_batch_is_leased_and_completed_in_one_request_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut dispatcher = config(1);
    dispatcher.max_leases_per_worker = 3;
    let server = Server::start(dir.path(), dispatcher.clone()).await;
    let mut client = server.client().await;
    let worker = register(&mut client, 0).await.worker_id;
    let answer = client
        .lease(v1::LeaseRequest {
            job_id: JOB,
            worker_id: worker,
            max_steps: 8,
            ..Default::default()
        })
        .await
        .expect("lease")
        .into_inner()
        .outcome;
    let Some(Outcome::Leases(batch)) = answer else {
        panic!("expected a batch, got {answer:?}");
    };
    let batch = unfold(batch);
    let steps: Vec<(u64, u64)> = batch.iter().map(|l| (l.epoch, l.step)).collect();
    assert_eq!(
        steps,
        vec![(0, 0), (0, 1), (0, 2)],
        "three, the worker's limit"
    );
    for lease in &batch {
        assert_eq!(
            records_of(lease),
            batch_of(&dispatcher, lease.epoch, lease.step)
        );
    }

    // Step 1's lease expires and goes to another worker, alone.
    server.clock.advance(Duration::from_millis(LEASE_MS + 1));
    let other = register(&mut client, 0).await.worker_id;
    let relet = leased(&mut client, other).await;
    assert_eq!((relet.epoch, relet.step), (0, 0));
    assert_eq!(records_of(&relet), records_of(&batch[0]));

    // The first worker reports all three (and a step it never held) in one request.
    let refused = report_steps(
        &mut client,
        worker,
        &[(0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0)],
    )
    .await;
    // Every lease of the first worker expired with the clock; only the re-let step 0 is held,
    // by the other worker.
    assert_eq!(refused, vec![(0, 0), (0, 1), (0, 2), (1, 0)]);
    let now = status(&mut client).await;
    assert_eq!(now.leases.len(), 1, "{now:?}");
    assert_eq!(now.steps_computed, 0);

    // Within their deadline, a batch completes in one request.
    let answer = client
        .lease(v1::LeaseRequest {
            job_id: JOB,
            worker_id: worker,
            max_steps: 2,
            ..Default::default()
        })
        .await
        .expect("lease")
        .into_inner()
        .outcome;
    let Some(Outcome::Leases(batch)) = answer else {
        panic!("expected a batch, got {answer:?}");
    };
    let batch = unfold(batch);
    let steps: Vec<(u64, u64)> = batch.iter().map(|l| (l.epoch, l.step)).collect();
    assert_eq!(steps, vec![(0, 1), (0, 2)], "returned steps first");
    let all: Vec<(u64, u64, u64)> = batch.iter().map(|l| (l.epoch, l.step, 0)).collect();
    assert!(report_steps(&mut client, worker, &all).await.is_empty());
    let now = status(&mut client).await;
    assert_eq!(
        (now.leases.len(), now.steps_computed, now.compute_us),
        (1, 2, 20)
    );

    // The training side consumes step 0 before its worker's report comes: the lease is gone
    // with the watermark, and the report is moot, not refused (nothing comes back), and the
    // step was computed and counts.
    consumed(&mut client, 0, 0).await;
    let late = report_steps(&mut client, other, &[(0, 0, relet.deadline_ms)]).await;
    assert_eq!(late, vec![]);
    let now = status(&mut client).await;
    assert_eq!(
        (now.leases.len(), now.steps_computed, now.compute_us),
        (0, 3, 30)
    );
    let mine = now.workers.iter().find(|w| w.id == other).expect("other");
    assert_eq!((mine.steps_computed, mine.compute_us), (1, 10));
    server.stop().await;
}

/// A report names the grant it was delivered under: when the step went back and the same
/// worker was granted it again, a late report of the earlier delivery is refused instead of
/// completing the new grant (whose delivery, perhaps to a new receiver, is still to come).
#[tokio::test]
async fn a_late_report_of_an_earlier_grant_does_not_complete_the_new_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), config(1)).await;
    let mut client = server.client().await;
    let worker = register(&mut client, 0).await.worker_id;
    let first = leased(&mut client, worker).await;
    server.clock.advance(Duration::from_millis(LEASE_MS + 1));
    let second = leased(&mut client, worker).await;
    assert_eq!((second.epoch, second.step), (first.epoch, first.step));
    assert_ne!(second.deadline_ms, first.deadline_ms);
    let grant = |deadline_ms| [(first.epoch, first.step, deadline_ms)];
    let stale = report_steps(&mut client, worker, &grant(first.deadline_ms)).await;
    assert_eq!(stale.len(), 1, "the earlier grant's report is refused");
    assert_eq!(status(&mut client).await.leases.len(), 1, "still leased");
    let current = report_steps(&mut client, worker, &grant(second.deadline_ms)).await;
    assert!(current.is_empty());
    assert!(status(&mut client).await.leases.is_empty());
    server.stop().await;
}

/// Issue 17: the training side ends an endless job at its watermark. What a worker holds is
/// revoked, every answer says end of data, and a dispatcher with `stop_at_end` stops serving
/// once the training side and every worker were told, not before.
#[tokio::test]
async fn the_training_side_ends_the_job_and_the_dispatcher_stops_once_everyone_knows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let endless = DispatcherConfig {
        epochs: None,
        ..config(1)
    };
    let mut server = Server::start_configured(dir.path(), endless, |c| c.stop_at_end = true).await;
    let mut client = server.client().await;
    let worker = register(&mut client, 0).await.worker_id;
    client
        .register_consumer(v1::RegisterConsumerRequest {
            job_id: JOB,
            receiver_addr: "http://127.0.0.1:9".into(),
            resume_from: None,
            window: 0,
        })
        .await
        .expect("register the consumer");
    let first = leased(&mut client, worker).await;
    let second = leased(&mut client, worker).await;
    assert_eq!((first.step, second.step), (0, 1));
    complete(&mut client, worker, 0, 0, 0)
        .await
        .expect("complete step 0");
    consumed(&mut client, 0, 1).await;
    let third = leased(&mut client, worker).await;
    assert_eq!(third.step, 2);

    // Ending anywhere but at the watermark (here behind it) is refused.
    let behind = client
        .consumed(v1::ConsumedRequest {
            job_id: JOB,
            epoch: 0,
            step: 0,
            busy_us: 0,
            end_job: true,
            window: 0,
        })
        .await
        .expect_err("the watermark is at step 1");
    assert_eq!(behind.code(), Code::FailedPrecondition, "{behind:?}");
    let ended = client
        .consumed(v1::ConsumedRequest {
            job_id: JOB,
            epoch: 0,
            step: 1,
            busy_us: 0,
            end_job: true,
            window: 0,
        })
        .await
        .expect("end the job")
        .into_inner();
    assert!(ended.end_of_data);
    let now = status(&mut client).await;
    assert!(now.end_of_data);
    assert!(now.leases.is_empty(), "{:?}", now.leases);
    // Step 2 was revoked: its report is refused, not counted.
    let late = complete(&mut client, worker, 0, 0, 2)
        .await
        .expect_err("revoked");
    assert_eq!(late.code(), Code::FailedPrecondition, "{late:?}");

    // The worker has not been told yet: the dispatcher keeps serving.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut server.task)
            .await
            .is_err(),
        "the dispatcher stopped before its worker knew"
    );
    let beat = client
        .heartbeat(v1::HeartbeatRequest {
            job_id: JOB,
            worker_id: worker,
        })
        .await
        .expect("heartbeat")
        .into_inner();
    assert!(beat.end_of_data);
    tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .expect("the dispatcher stops once everyone knows")
        .expect("server task")
        .expect("stopped cleanly");
}
