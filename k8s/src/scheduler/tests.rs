//! The scheduler's rounds through kube's real `Client` over a `tower_test` mock API server
//! that answers lists from a fixed cluster, records every write, and checks each request
//! against `rbac::SCHEDULER_CALLS`; the dispatchers are a fake that answers per round and logs
//! its Drain calls into the same ordered log.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use lode_proto::service::v1::{StatusResponse, WorkerEntry, WorkerStatus};
use lode_scheduler::kubernetes::ClusterView;
use serde_json::{json, Value};

use super::*;
use crate::controller::tests::{allowed, json_body};
use crate::rbac::SCHEDULER_CALLS;

const TOKEN: &str = "feedfacefeedfacefeedfacefeedface";

/// Everything that happened, in order: `METHOD path` of each write, `drain URL WORKER`.
type Log = Arc<Mutex<Vec<(String, Value)>>>;

fn push(log: &Log, line: String, body: Value) {
    log.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((line, body));
}

fn taken(log: &Log) -> Vec<(String, Value)> {
    std::mem::take(&mut *log.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A cluster's objects as the API server would list them.
#[derive(Default, Clone)]
struct Cluster {
    nodes: Vec<Value>,
    pods: Vec<Value>,
    jobs: Vec<Value>,
    pools: Vec<Value>,
    deployments: Vec<Value>,
}

fn list(items: &[Value]) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
}

async fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    cluster: Cluster,
    log: Log,
) {
    while let Some((request, send)) = handle.next_request().await {
        let (method, path, query) = allowed(&request, SCHEDULER_CALLS, "SCHEDULER_CALLS");
        let body = json_body(request.into_body(), &format!("{method} {path}")).await;
        let answer = match (method.as_str(), path.as_str()) {
            ("GET", "/api/v1/nodes") => list(&cluster.nodes),
            ("GET", "/api/v1/pods") => list(&cluster.pods),
            ("GET", "/apis/lode.dev/v1alpha1/lodejobs") => list(&cluster.jobs),
            ("GET", "/apis/lode.dev/v1alpha1/lodepools") => list(&cluster.pools),
            ("GET", "/apis/apps/v1/deployments") => {
                assert!(query.contains("labelSelector="), "{query}");
                list(&cluster.deployments)
            }
            ("GET", p) if p.ends_with("-lode-token") => json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": p.rsplit('/').next(), "namespace": "ml"},
                "data": {"token": "ZmVlZGZhY2VmZWVkZmFjZWZlZWRmYWNlZmVlZGZhY2U="},
            }),
            ("GET", p) => panic!("unexpected read {p}"),
            (m, p) => {
                push(&log, format!("{m} {p}"), body.clone());
                if p.ends_with("/scale") {
                    json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                           "metadata": {"name": "x", "namespace": "ml"},
                           "spec": {"replicas": body["spec"]["replicas"]}})
                } else if m == "DELETE" {
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
                } else {
                    let mut echoed = body.clone();
                    echoed["metadata"]["name"] = json!("echoed");
                    echoed
                }
            }
        };
        let response = Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&answer).unwrap_or_default()))
            .unwrap_or_else(|e| panic!("response: {e}"));
        send.send_response(response);
    }
}

/// Dispatchers answering from a queue per URL, logging drains.
struct FakeDispatchers {
    answers: Mutex<BTreeMap<String, VecDeque<StatusResponse>>>,
    log: Log,
}

impl Dispatchers for FakeDispatchers {
    fn status<'a>(
        &'a self,
        url: &'a str,
        _job_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<StatusResponse, String>> {
        assert_eq!(token.expose(), TOKEN, "the token from the job's Secret");
        let answer = (self.answers.lock().unwrap_or_else(|e| e.into_inner()))
            .get_mut(url)
            .and_then(VecDeque::pop_front)
            .ok_or_else(|| format!("{url}: no answer queued"));
        Box::pin(async move { answer })
    }

    fn drain<'a>(
        &'a self,
        url: &'a str,
        _job_id: u64,
        worker_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), String>> {
        assert_eq!(token.expose(), TOKEN);
        push(&self.log, format!("drain {url} {worker_id}"), Value::Null);
        Box::pin(async { Ok(()) })
    }
}

fn node(name: &str, gpus: u32, cpu: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
           "spec": {}, "status": {"allocatable": {"cpu": cpu, "memory": "64Gi", "nvidia.com/gpu": gpus.to_string()}}})
}

fn pod(name: &str, node: &str, labels: Value, cpu: &str, gpus: u32) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "ml", "labels": labels},
           "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
               "requests": {"cpu": cpu, "memory": "1Gi"},
               "limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
           "status": {"phase": "Running"}})
}

fn worker_pod(job: &str, i: u32, node: &str) -> Value {
    pod(
        &format!("{job}-w{i}"),
        node,
        json!({"lode.dev/job": job, "lode.dev/stage": "0"}),
        "1",
        0,
    )
}

fn lodejob(name: &str) -> Value {
    json!({"apiVersion": "lode.dev/v1alpha1", "kind": "LodeJob",
           "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
           "spec": {"trainingSelector": {"app": format!("{name}-train")}, "dispatcherPort": 7070,
                    "workers": {"image": "lode:test", "cpu": "1", "memory": "1Gi"},
                    "minWorkers": 1, "maxWorkers": 16},
           "status": {"dispatcher": format!("http://{name}:7070")}})
}

fn pool(job: &str, replicas: i32, max: i32, scaler: &str) -> Value {
    json!({"apiVersion": "lode.dev/v1alpha1", "kind": "LodePool",
           "metadata": {"name": format!("{job}-lode-stage-0"), "namespace": "ml"},
           "spec": {"job": job, "stage": 0, "replicas": replicas, "minReplicas": 1,
                    "maxReplicas": max, "scaler": scaler}})
}

fn deployment(job: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": format!("{job}-lode-stage-0"), "namespace": "ml"},
           "spec": {"selector": {"matchLabels": {"lode.dev/job": job}},
                    "template": {"spec": {"containers": [{"name": "worker"}]}}}})
}

/// A reading: `consumed` steps consumed and computed, `compute_s` of worker time (spread over
/// `workers`, named as their pods), `busy_s` of the training side's busy time.
fn reading(consumed: u64, compute_s: u64, busy_s: u64, workers: &[(&str, u64)]) -> StatusResponse {
    reading_of(consumed, compute_s, busy_s, workers, 1_000_000)
}

/// [`reading`] of a job of one epoch of `per_epoch` steps.
fn reading_of(
    consumed: u64,
    compute_s: u64,
    busy_s: u64,
    workers: &[(&str, u64)],
    per_epoch: u64,
) -> StatusResponse {
    let n = workers.len().max(1) as u64;
    StatusResponse {
        steps_consumed: consumed,
        steps_computed: consumed,
        compute_us: compute_s * 1_000_000,
        consumer_busy_us: busy_s * 1_000_000,
        steps_per_epoch: per_epoch,
        epochs: 1,
        stages: 1,
        workers: workers
            .iter()
            .map(|(name, id)| WorkerEntry {
                id: *id,
                name: (*name).to_owned(),
                stage: 0,
                status: WorkerStatus::Active as i32,
                steps_computed: consumed / n,
                compute_us: compute_s * 1_000_000 / n,
                ..WorkerEntry::default()
            })
            .collect(),
        ..StatusResponse::default()
    }
}

fn scheduler(
    cluster: Cluster,
    answers: BTreeMap<String, VecDeque<StatusResponse>>,
    policy: Policy,
) -> (Scheduler, Log) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let log: Log = Arc::default();
    tokio::spawn(serve(handle, cluster, log.clone()));
    let dispatchers = Arc::new(FakeDispatchers {
        answers: Mutex::new(answers),
        log: log.clone(),
    });
    let config = SchedulerConfig {
        namespace: None,
        policy,
        decide: DecideConfig::default(),
        interval: Duration::from_secs(1),
        rounds: None,
        node_selector: BTreeMap::new(),
    };
    (
        Scheduler::new(Client::new(service, "ml"), config, dispatchers),
        log,
    )
}

/// Two jobs on one GPU node with two CPU-only nodes of 4 CPUs for data workers, both waiting
/// on data (their one worker busy all the time): `hungry` consumes 100 steps/s and has a
/// million steps to go, `short` consumes 20 steps/s and has 2800 to go. MaxTP gives more to
/// the job a worker speeds up most, SRTF to the one that finishes first, Fair splits evenly.
fn two_jobs() -> (Cluster, BTreeMap<String, VecDeque<StatusResponse>>) {
    let cluster = Cluster {
        nodes: vec![
            node("gpu-0", 8, "16"),
            node("cpu-0", 0, "4"),
            node("cpu-1", 0, "4"),
        ],
        pods: vec![
            pod(
                "hungry-train",
                "gpu-0",
                json!({"app": "hungry-train"}),
                "4",
                4,
            ),
            pod(
                "short-train",
                "gpu-0",
                json!({"app": "short-train"}),
                "4",
                4,
            ),
            worker_pod("hungry", 0, "cpu-0"),
            worker_pod("short", 0, "cpu-1"),
        ],
        jobs: vec![lodejob("hungry"), lodejob("short")],
        pools: vec![pool("hungry", 1, 16, "lode"), pool("short", 1, 16, "lode")],
        deployments: vec![deployment("hungry"), deployment("short")],
    };
    let answers = BTreeMap::from([
        (
            "http://hungry:7070".to_owned(),
            VecDeque::from([
                reading(0, 0, 0, &[("hungry-w0", 1)]),
                reading(1000, 10, 1, &[("hungry-w0", 1)]),
            ]),
        ),
        (
            "http://short:7070".to_owned(),
            VecDeque::from([
                reading_of(0, 0, 0, &[("short-w0", 1)], 3000),
                reading_of(200, 10, 1, &[("short-w0", 1)], 3000),
            ]),
        ),
    ]);
    (cluster, answers)
}

/// The facts of `two_jobs`, written out by hand: what the kube layer must read from the cluster.
fn two_jobs_facts(round: usize) -> ClusterFacts {
    let node = |name: &str, gpus, cpu: u64, other: u64, other_mem: u64| NodeFacts {
        name: name.into(),
        allocatable_cpu_millicores: cpu,
        allocatable_memory_bytes: 64 << 30,
        other_cpu_requests_millicores: other,
        other_memory_requests_bytes: other_mem,
        gpus,
        labels: BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_owned())]),
        schedulable: true,
    };
    let (_, answers) = two_jobs();
    let job = |name: &str, worker_node: &str| JobFacts {
        name: format!("ml/{name}"),
        training_node: Some("gpu-0".into()),
        training_gpus: 4,
        training_cpu_millicores: 4000,
        pools: vec![PoolFacts {
            stage: 0,
            name: format!("{name}-lode-stage-0"),
            worker_cpu_millicores: 1000,
            worker_memory_bytes: 1 << 30,
            min_workers: 1,
            max_workers: 16,
            pods: vec![WorkerPodFacts {
                name: format!("{name}-w0"),
                node: Some(worker_node.into()),
                terminating: false,
            }],
        }],
        counters: Some(DispatcherCounters::from_status(
            &answers[&format!("http://{name}:7070")][round],
            10.0 * round as f64,
        )),
    };
    ClusterFacts {
        nodes: vec![
            node("gpu-0", 8, 16_000, 8000, 2 << 30),
            node("cpu-0", 0, 4000, 0, 0),
            node("cpu-1", 0, 4000, 0, 0),
        ],
        jobs: vec![job("hungry", "cpu-0"), job("short", "cpu-1")],
    }
}

#[tokio::test]
async fn replicas_and_affinities_are_what_decide_chose_under_each_policy() {
    for policy in [Policy::MaxTp, Policy::Srtf, Policy::Fair] {
        let (cluster, answers) = two_jobs();
        let (mut scheduler, log) = scheduler(cluster, answers, policy);
        // The same snapshot, built by hand, through the pure round.
        let mut expected_view = ClusterView::new();
        let config = DecideConfig::default();
        for round in 0..2 {
            let report = scheduler
                .round(10.0 * round as f64)
                .await
                .unwrap_or_else(|e| panic!("{policy:?} round {round}: {e}"));
            assert!(report.failures.is_empty(), "{:?}", report.failures);
            let facts = two_jobs_facts(round);
            let (_, _, expected) = expected_view.round(&facts, policy, &config);
            assert_eq!(report.plan, expected, "{policy:?} round {round}");
            let writes = taken(&log);
            for p in &expected.pools {
                let path = format!(
                    "/apis/lode.dev/v1alpha1/namespaces/ml/lodepools/{}/scale",
                    p.pool
                );
                let scaled: Vec<&Value> = writes
                    .iter()
                    .filter(|(line, _)| *line == format!("PATCH {path}"))
                    .map(|(_, body)| body)
                    .collect();
                if p.replicas == 1 {
                    assert!(
                        scaled.is_empty(),
                        "{policy:?}: {} kept at 1, yet scaled",
                        p.pool
                    );
                } else {
                    assert_eq!(
                        scaled.len(),
                        1,
                        "{policy:?} round {round}: {} scaled once",
                        p.pool
                    );
                    assert_eq!(
                        scaled[0]["spec"]["replicas"], p.replicas,
                        "{policy:?} {}",
                        p.pool
                    );
                }
                let deployment =
                    format!("PATCH /apis/apps/v1/namespaces/ml/deployments/{}", p.pool);
                let set = writes
                    .iter()
                    .find(|(line, _)| *line == deployment)
                    .unwrap_or_else(|| panic!("{policy:?}: no affinity set on {}", p.pool));
                assert_eq!(
                    set.1["spec"]["template"]["spec"]["affinity"],
                    affinity_json(&p.affinity),
                    "{policy:?} {}",
                    p.pool
                );
                assert_eq!(p.affinity.first().map(|a| a.node.as_str()), Some("gpu-0"));
            }
            if round == 1 {
                let want = |job: &str| {
                    expected
                        .pools
                        .iter()
                        .find(|p| p.job == job)
                        .map(|p| p.replicas)
                        .unwrap_or(0)
                };
                let (hungry, short) = (want("ml/hungry"), want("ml/short"));
                match policy {
                    Policy::MaxTp => assert!(hungry > short, "{policy:?}: {hungry} vs {short}"),
                    Policy::Srtf => assert!(short > hungry, "{policy:?}: {hungry} vs {short}"),
                    Policy::Fair => assert_eq!(hungry, short, "{policy:?}"),
                }
                let events = writes
                    .iter()
                    .filter(|(line, _)| line == "POST /api/v1/namespaces/ml/events")
                    .count();
                assert_eq!(
                    events,
                    expected.events.len(),
                    "{policy:?}: one Event per decision"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_scale_in_drains_before_it_shrinks_and_an_external_pool_is_left_alone() {
    // Two pods in a pool of at most one: one is drained, marked, then the pool shrinks. The
    // same shape under `scaler: external` is its autoscaler's business.
    let mut cluster = Cluster {
        nodes: vec![node("gpu-0", 8, "16"), node("cpu-0", 0, "16")],
        ..Cluster::default()
    };
    for job in ["lean", "auto"] {
        cluster.pods.push(pod(
            &format!("{job}-train"),
            "gpu-0",
            json!({"app": format!("{job}-train")}),
            "4",
            4,
        ));
        cluster.pods.push(worker_pod(job, 0, "cpu-0"));
        cluster.pods.push(worker_pod(job, 1, "cpu-0"));
        cluster.jobs.push(lodejob(job));
        cluster.deployments.push(deployment(job));
    }
    cluster.pools.push(pool("lean", 2, 1, "lode"));
    cluster.pools.push(pool("auto", 2, 1, "external"));
    let answers = BTreeMap::from([
        (
            "http://lean:7070".to_owned(),
            VecDeque::from([reading(0, 0, 0, &[("lean-w0", 7), ("lean-w1", 8)])]),
        ),
        (
            "http://auto:7070".to_owned(),
            VecDeque::from([reading(0, 0, 0, &[("auto-w0", 3), ("auto-w1", 4)])]),
        ),
    ]);
    let (mut scheduler, log) = scheduler(cluster, answers, Policy::MaxTp);
    let report = scheduler.round(0.0).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.acted, vec!["lean-lode-stage-0".to_owned()]);
    let writes = taken(&log);
    let lines: Vec<&str> = writes.iter().map(|(l, _)| l.as_str()).collect();
    let drain = lines
        .iter()
        .position(|l| l.starts_with("drain http://lean:7070 "))
        .unwrap_or_else(|| panic!("no drain: {lines:?}"));
    let drained_id: u64 = lines[drain]
        .rsplit(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{}", lines[drain]));
    let drained_pod = if drained_id == 7 {
        "lean-w0"
    } else {
        "lean-w1"
    };
    let mark = lines
        .iter()
        .position(|l| *l == format!("PATCH /api/v1/namespaces/ml/pods/{drained_pod}"))
        .unwrap_or_else(|| panic!("the drained pod is not marked: {lines:?}"));
    assert_eq!(
        writes[mark].1["metadata"]["annotations"][POD_DELETION_COST_ANNOTATION],
        DRAINED_POD_DELETION_COST.to_string()
    );
    let scale = lines
        .iter()
        .position(|l| {
            *l == "PATCH /apis/lode.dev/v1alpha1/namespaces/ml/lodepools/lean-lode-stage-0/scale"
        })
        .unwrap_or_else(|| panic!("the pool is not scaled: {lines:?}"));
    assert_eq!(writes[scale].1["spec"]["replicas"], 1);
    assert!(
        drain < mark && mark < scale,
        "drain, mark, then shrink: {lines:?}"
    );
    assert!(
        lines.iter().all(|l| !l.contains("auto")),
        "an external pool is not touched: {lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("drain")).count(),
        1,
        "{lines:?}"
    );
}

#[test]
fn quantities_read_as_kubernetes_writes_them() {
    assert_eq!(millicores("500m"), 500);
    assert_eq!(millicores("2"), 2000);
    assert_eq!(millicores("1.5"), 1500);
    assert_eq!(bytes("1Gi"), 1 << 30);
    assert_eq!(bytes("512M"), 512_000_000);
    assert_eq!(quantity("12x"), None);
    assert_eq!(quantity(""), None);
}
