//! `lode scheduler --backend kubernetes`: the thin kube layer around
//! `lode_scheduler::kubernetes`'s pure round.
//!
//! Each round ([`Scheduler::round`]) lists nodes, pods, LodeJobs, LodePools and the pools'
//! Deployments; reads each running job's dispatcher (its Status RPC, with the token from the
//! job's Secret); builds [`ClusterFacts`]; calls [`ClusterView::round`] (the same `decide` as
//! the simulator and the local backend); and acts on each pool whose `spec.scaler` is `lode`
//! (an `external` pool is sized by its autoscaler and left alone), in this order:
//! 1. every pod to drain first: Lode's `Drain` on its worker, then the pod annotated
//!    `controller.kubernetes.io/pod-deletion-cost` so that the ReplicaSet removes exactly it
//!    (a migration deletes the drained pod instead, to be rescheduled under the new affinity);
//! 2. the preferred node affinity on the pool's Deployment template, when it changed (a merge
//!    patch of that field only: the controller's server-side apply does not own it);
//! 3. the pool's `spec.replicas` through the LodePool's `scale` subresource, when it changed.
//!
//! Every decision is an Event on its LodeJob and an `info` log line.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use lode_proto::service::v1::StatusResponse;
use lode_scheduler::kubernetes::{
    AfterDrain, ClusterFacts, ClusterView, DispatcherCounters, JobFacts, KubePlan, NodeFacts,
    PoolFacts, PoolPlan, PreferredNode, WorkerPodFacts, DRAINED_POD_DELETION_COST,
    POD_DELETION_COST_ANNOTATION,
};
use lode_scheduler::{DecideConfig, Policy};
use serde_json::json;
use tracing::{info, warn};

use crate::plan::{secret_name, Token, JOB_LABEL};
use crate::types::{LodeJob, LodePool, Scaler};

/// The label of a pod's stage (on data-worker pods).
pub const STAGE_LABEL: &str = "lode.dev/stage";
/// The extended resource a node's and a pod's GPUs are counted by.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The Events' reporting component.
pub const COMPONENT: &str = "lode-scheduler";

/// The scheduler's settings.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Schedule LodeJobs in one namespace, or all (`None`). Nodes are always cluster-wide.
    pub namespace: Option<String>,
    pub policy: Policy,
    pub decide: DecideConfig,
    /// Time between rounds.
    pub interval: Duration,
    /// Stop after this many rounds (`None`: until shut down).
    pub rounds: Option<u64>,
    /// Labels a node must carry to hold data workers (empty: every node).
    pub node_selector: BTreeMap<String, String>,
}

/// A job's dispatcher, as the scheduler talks to it. A trait so that tests answer for it.
pub trait Dispatchers: Send + Sync + 'static {
    /// The Status RPC of job `job_id` at `url`.
    fn status<'a>(
        &'a self,
        url: &'a str,
        job_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<StatusResponse, String>>;
    /// The Drain RPC of worker `worker_id` of job `job_id` at `url`.
    fn drain<'a>(
        &'a self,
        url: &'a str,
        job_id: u64,
        worker_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// The real dispatchers: Lode's RPCs over gRPC, each within a timeout.
#[derive(Debug, Clone)]
pub struct GrpcDispatchers {
    pub tls: Option<lode_proto::tls::ClientTls>,
    pub timeout: Duration,
}

impl GrpcDispatchers {
    async fn within<T>(
        &self,
        url: &str,
        call: impl std::future::Future<Output = Result<T, String>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "{url} did not answer within {} ms",
                self.timeout.as_millis()
            )),
        }
    }
}

impl Dispatchers for GrpcDispatchers {
    fn status<'a>(
        &'a self,
        url: &'a str,
        job_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<StatusResponse, String>> {
        Box::pin(self.within(url, async move {
            let mut client = lode_proto::service::connect(url, token.expose(), self.tls.as_ref())
                .await
                .map_err(|e| e.to_string())?;
            let request = lode_proto::service::v1::StatusRequest { job_id };
            let answer = client.status(request).await.map_err(|status| {
                lode_proto::service::RpcError::of("Status")(status).to_string()
            })?;
            Ok(answer.into_inner())
        }))
    }

    fn drain<'a>(
        &'a self,
        url: &'a str,
        job_id: u64,
        worker_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.within(url, async move {
            let mut client = lode_proto::service::connect(url, token.expose(), self.tls.as_ref())
                .await
                .map_err(|e| e.to_string())?;
            let request = lode_proto::service::v1::DrainRequest { job_id, worker_id };
            client
                .drain(request)
                .await
                .map_err(|status| lode_proto::service::RpcError::of("Drain")(status).to_string())?;
            Ok(())
        }))
    }
}

/// The scheduler's errors: a failed API call, named.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action}")]
pub struct Error {
    pub action: String,
    #[source]
    pub source: kube::Error,
}

fn kube_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error { action, source }
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundReport {
    pub plan: KubePlan,
    /// The pools acted on (`scaler: lode`), by name.
    pub acted: Vec<String>,
    /// Calls that failed this round (the next round tries again), as lines.
    pub failures: Vec<String>,
}

/// Where a job's dispatcher is and how to reach it.
struct JobAccess {
    namespace: String,
    name: String,
    url: String,
    job_id: u64,
    token: Token,
}

/// The scheduler: its client, its dispatchers and its measurement state across rounds.
pub struct Scheduler {
    client: Client,
    config: SchedulerConfig,
    dispatchers: Arc<dyn Dispatchers>,
    view: ClusterView,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A quantity (`500m`, `2`, `1.5`, `1Gi`, `512M`) in its base unit, or `None`.
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        _ => return None,
    };
    let v = value * scale;
    (v.is_finite() && v >= 0.0).then_some(v)
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn millicores(q: &str) -> u64 {
    quantity(q).map_or(0, |v| (v * 1000.0).ceil() as u64)
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn bytes(q: &str) -> u64 {
    quantity(q).map_or(0, |v| v.ceil() as u64)
}

type Resources = BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

fn resource(map: Option<&Resources>, key: &str) -> Option<String> {
    map.and_then(|m| m.get(key)).map(|q| q.0.clone())
}

/// A pod's requests: (CPU millicores, memory bytes, GPUs), over its containers.
fn pod_requests(pod: &Pod) -> (u64, u64, u32) {
    let mut out = (0, 0, 0u32);
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
        out.0 += resource(requests, "cpu").map_or(0, |q| millicores(&q));
        out.1 += resource(requests, "memory").map_or(0, |q| bytes(&q));
        let gpus = resource(limits, GPU_RESOURCE).or_else(|| resource(requests, GPU_RESOURCE));
        out.2 += gpus.map_or(0, |q| u32::try_from(bytes(&q)).unwrap_or(u32::MAX));
    }
    out
}

fn finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

fn labels_match(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The cluster's facts from what was listed and read (no I/O: a pure function, tested as such).
pub fn facts_of(
    nodes: &[Node],
    pods: &[Pod],
    jobs: &[LodeJob],
    pools: &[LodePool],
    counters: &BTreeMap<String, DispatcherCounters>,
) -> ClusterFacts {
    let is_worker = |p: &Pod| {
        let labels = p.labels();
        labels.contains_key(JOB_LABEL) && labels.contains_key(STAGE_LABEL)
    };
    let node_facts = nodes
        .iter()
        .map(|n| {
            let name = n.name_any();
            let allocatable = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
            let (mut cpu, mut mem) = (0, 0);
            for p in pods.iter().filter(|p| !finished(p) && !is_worker(p)) {
                if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()) {
                    let (c, m, _) = pod_requests(p);
                    cpu += c;
                    mem += m;
                }
            }
            NodeFacts {
                allocatable_cpu_millicores: resource(allocatable, "cpu")
                    .map_or(0, |q| millicores(&q)),
                allocatable_memory_bytes: resource(allocatable, "memory").map_or(0, |q| bytes(&q)),
                other_cpu_requests_millicores: cpu,
                other_memory_requests_bytes: mem,
                gpus: resource(allocatable, GPU_RESOURCE)
                    .map_or(0, |q| u32::try_from(bytes(&q)).unwrap_or(u32::MAX)),
                labels: n.labels().clone(),
                schedulable: !n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                name,
            }
        })
        .collect();
    let mut job_facts = Vec::new();
    for job in jobs {
        let ns = job.namespace().unwrap_or_default();
        let name = job.name_any();
        let training = pods.iter().find(|p| {
            p.namespace().as_deref() == Some(ns.as_str())
                && !finished(p)
                && p.metadata.deletion_timestamp.is_none()
                && labels_match(&job.spec.training_selector, p.labels())
        });
        let (training_cpu, _, training_gpus) = training.map(pod_requests).unwrap_or_default();
        let mut job_pools = Vec::new();
        for pool in pools
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(ns.as_str()) && p.spec.job == name)
        {
            let stage = pool.spec.stage;
            let stage_pods = pods
                .iter()
                .filter(|p| {
                    p.namespace().as_deref() == Some(ns.as_str())
                        && !finished(p)
                        && p.labels().get(JOB_LABEL) == Some(&name)
                        && p.labels().get(STAGE_LABEL) == Some(&stage.to_string())
                })
                .map(|p| WorkerPodFacts {
                    name: p.name_any(),
                    node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                    terminating: p.metadata.deletion_timestamp.is_some(),
                })
                .collect();
            job_pools.push(PoolFacts {
                stage,
                name: pool.name_any(),
                worker_cpu_millicores: millicores(&job.spec.workers.cpu),
                worker_memory_bytes: bytes(&job.spec.workers.memory),
                min_workers: u32::try_from(pool.spec.min_replicas).unwrap_or(0),
                max_workers: u32::try_from(pool.spec.max_replicas).unwrap_or(0),
                pods: stage_pods,
            });
        }
        job_pools.sort_by_key(|p| p.stage);
        let id = key(&ns, &name);
        job_facts.push(JobFacts {
            training_node: training.and_then(|p| p.spec.as_ref()?.node_name.clone()),
            training_gpus,
            training_cpu_millicores: training_cpu,
            pools: job_pools,
            counters: counters.get(&id).cloned(),
            name: id,
        });
    }
    ClusterFacts {
        nodes: node_facts,
        jobs: job_facts,
    }
}

/// The `preferredDuringSchedulingIgnoredDuringExecution` terms of `affinity`.
pub fn affinity_json(affinity: &[PreferredNode]) -> serde_json::Value {
    let terms: Vec<serde_json::Value> = affinity
        .iter()
        .map(|p| {
            json!({
                "weight": p.weight,
                "preference": {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [p.node]}
                ]},
            })
        })
        .collect();
    json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}})
}

/// Every object `api` lists (with a label selector when given).
async fn listed<K>(api: Api<K>, labels: Option<&str>, action: &str) -> Result<Vec<K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = labels.map_or_else(ListParams::default, |l| ListParams::default().labels(l));
    Ok(api.list(&params).await.map_err(kube_error(action))?.items)
}

impl Scheduler {
    pub fn new(client: Client, config: SchedulerConfig, dispatchers: Arc<dyn Dispatchers>) -> Self {
        let view = ClusterView::with_node_selector(config.node_selector.clone());
        Scheduler {
            client,
            config,
            dispatchers,
            view,
        }
    }

    fn namespaced<K>(&self, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// One round at time `at_s` (seconds on the scheduler's clock, for the dispatchers' rates).
    pub async fn round(&mut self, at_s: f64) -> Result<RoundReport, Error> {
        let ns = self.config.namespace.as_deref();
        let nodes = listed(Api::<Node>::all(self.client.clone()), None, "list nodes").await?;
        let pods = listed(self.namespaced::<Pod>(None), None, "list pods").await?;
        let jobs = listed(self.namespaced::<LodeJob>(ns), None, "list lodejobs").await?;
        let pools = listed(self.namespaced::<LodePool>(ns), None, "list lodepools").await?;
        let managed = Some(crate::controller::MANAGED_BY);
        let deployments = listed(
            self.namespaced::<Deployment>(ns),
            managed,
            "list deployments",
        )
        .await?;
        let mut failures = Vec::new();
        let mut access = BTreeMap::new();
        let mut counters = BTreeMap::new();
        for job in &jobs {
            let (namespace, name) = (job.namespace().unwrap_or_default(), job.name_any());
            let Some(url) = job.status.as_ref().and_then(|s| s.dispatcher.clone()) else {
                continue;
            };
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
            let secret = match secrets.get_opt(&secret_name(&name)).await {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    failures.push(format!("{namespace}/{name}: cannot read its token: {e}"));
                    continue;
                }
            };
            let Some(token) = Token::from_secret(&secret) else {
                continue;
            };
            let job_id = job.spec.job_id;
            match self.dispatchers.status(&url, job_id, &token).await {
                Ok(status) => {
                    counters.insert(
                        key(&namespace, &name),
                        DispatcherCounters::from_status(&status, at_s),
                    );
                }
                Err(e) => failures.push(format!("{namespace}/{name}: {url}: {e}")),
            }
            access.insert(
                key(&namespace, &name),
                JobAccess {
                    namespace,
                    name,
                    url,
                    job_id,
                    token,
                },
            );
        }
        let facts = facts_of(&nodes, &pods, &jobs, &pools, &counters);
        let (_, _, plan) = self
            .view
            .round(&facts, self.config.policy, &self.config.decide);
        let (mut acted, mut acted_jobs) = (Vec::new(), std::collections::BTreeSet::new());
        for pool_plan in &plan.pools {
            let Some(job) = access.get(&pool_plan.job) else {
                continue;
            };
            let pool = pools.iter().find(|p| {
                p.namespace().as_deref() == Some(job.namespace.as_str())
                    && p.name_any() == pool_plan.pool
            });
            let Some(pool) = pool.filter(|p| p.spec.scaler == Scaler::Lode) else {
                continue;
            };
            let deployment = deployments.iter().find(|d| {
                d.namespace().as_deref() == Some(job.namespace.as_str())
                    && d.name_any() == pool_plan.pool
            });
            if let Err(e) = self.apply_pool(job, pool, deployment, pool_plan).await {
                failures.push(format!("{}: {e}", pool_plan.pool));
            }
            acted.push(pool_plan.pool.clone());
            acted_jobs.insert(pool_plan.job.clone());
        }
        // A decision is told only for the jobs it acted on (not for `external` pools).
        for event in plan.events.iter().filter(|e| acted_jobs.contains(&e.job)) {
            info!(job = %event.job, reason = event.reason, "{}", event.message);
            if let Some(job) = access.get(&event.job) {
                if let Err(e) = self.post_event(job, event.reason, &event.message).await {
                    failures.push(format!("{}: {e}: {}", event.job, e.source));
                }
            }
        }
        for f in &failures {
            warn!(cause = %f, "a scheduler call failed; the next round tries again");
        }
        Ok(RoundReport {
            plan,
            acted,
            failures,
        })
    }

    async fn apply_pool(
        &self,
        job: &JobAccess,
        pool: &LodePool,
        deployment: Option<&Deployment>,
        plan: &PoolPlan,
    ) -> Result<(), String> {
        let failed = |e: Error| format!("{e}: {}", e.source);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &job.namespace);
        for order in &plan.drain {
            if let Some(worker) = order.worker_id {
                let drained = self
                    .dispatchers
                    .drain(&job.url, job.job_id, worker, &job.token)
                    .await;
                if let Err(e) = drained {
                    // Not drained: nothing else changes this round for this pool.
                    return Err(format!("cannot drain {} (worker {worker}): {e}", order.pod));
                }
            }
            info!(job = %job.name, pod = %order.pod, then = ?order.then, "drained");
            match order.then {
                AfterDrain::ScaleIn => {
                    let patch = json!({"metadata": {"annotations": {
                        POD_DELETION_COST_ANNOTATION: DRAINED_POD_DELETION_COST.to_string()
                    }}});
                    pods.patch(&order.pod, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(kube_error(format!("annotate pod {}", order.pod)))
                        .map_err(failed)?;
                }
                AfterDrain::Replace => {
                    pods.delete(&order.pod, &DeleteParams::default())
                        .await
                        .map_err(kube_error(format!("delete pod {}", order.pod)))
                        .map_err(failed)?;
                }
            }
        }
        let wanted = affinity_json(&plan.affinity);
        let current = deployment
            .and_then(|d| d.spec.as_ref()?.template.spec.as_ref()?.affinity.as_ref())
            .and_then(|a| serde_json::to_value(a).ok());
        if deployment.is_some() && current.as_ref() != Some(&wanted) {
            let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &job.namespace);
            let patch = json!({"spec": {"template": {"spec": {"affinity": wanted}}}});
            deployments
                .patch(&plan.pool, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(kube_error(format!("set the affinity of {}", plan.pool)))
                .map_err(failed)?;
        }
        let replicas = i32::try_from(plan.replicas).unwrap_or(i32::MAX);
        if pool.spec.replicas != replicas {
            let pools: Api<LodePool> = Api::namespaced(self.client.clone(), &job.namespace);
            let patch = json!({"spec": {"replicas": replicas}});
            pools
                .patch_scale(&plan.pool, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(kube_error(format!("scale {}", plan.pool)))
                .map_err(failed)?;
            info!(pool = %plan.pool, from = pool.spec.replicas, to = replicas, "scaled");
        }
        Ok(())
    }

    async fn post_event(&self, job: &JobAccess, reason: &str, message: &str) -> Result<(), Error> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", job.name)),
                namespace: Some(job.namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("lode.dev/v1alpha1".into()),
                kind: Some("LodeJob".into()),
                name: Some(job.name.clone()),
                namespace: Some(job.namespace.clone()),
                ..ObjectReference::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some("Normal".into()),
            reporting_component: Some(COMPONENT.into()),
            reporting_instance: Some(COMPONENT.into()),
            action: Some("Schedule".into()),
            event_time: Some(MicroTime(now)),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &job.namespace)
            .create(&PostParams::default(), &event)
            .await
            .map_err(kube_error(format!("post an Event on {}", job.name)))?;
        Ok(())
    }
}

/// Runs rounds every `config.interval` until `shutdown` resolves or `config.rounds` are done;
/// writes one line per round to `out`.
pub async fn run(
    client: Client,
    config: SchedulerConfig,
    dispatchers: Arc<dyn Dispatchers>,
    shutdown: impl std::future::Future<Output = ()>,
    out: &mut dyn std::io::Write,
) -> Result<(), Error> {
    let interval = config.interval;
    let rounds = config.rounds;
    info!(namespace = ?config.namespace, policy = ?config.policy, "scheduler starting");
    let mut scheduler = Scheduler::new(client, config, dispatchers);
    let start = std::time::Instant::now();
    tokio::pin!(shutdown);
    let mut done = 0u64;
    loop {
        let report = scheduler.round(start.elapsed().as_secs_f64()).await;
        match report {
            Ok(r) => {
                let changed = r
                    .plan
                    .pools
                    .iter()
                    .filter(|p| p.replicas != p.active || !p.drain.is_empty())
                    .count();
                let _ = writeln!(
                    out,
                    "round {done}: {} pool(s), {changed} changed, {} event(s), {} failure(s)",
                    r.plan.pools.len(),
                    r.plan.events.len(),
                    r.failures.len()
                );
            }
            Err(e) => warn!(cause = %e.source, "round failed: {e}"),
        }
        done += 1;
        if rounds.is_some_and(|n| done >= n) {
            break;
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(interval) => {}
        }
    }
    info!("scheduler stopped");
    Ok(())
}

#[cfg(test)]
mod tests;
