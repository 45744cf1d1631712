//! The pure planner: from a LodeJob, the objects observed for it and what its dispatcher said,
//! the objects it should have, the writes and deletions that get it there, and its status.
//!
//! What it makes, all owned by the LodeJob (controller owner reference, so deleting the job
//! deletes them; no finalizer, since nothing lies outside that tree):
//! - `NAME-lode-token`, a Secret holding the job's token under `token`. Made once with a fresh
//!   random value and never rewritten; every other object refers to it (`secretKeyRef`), none
//!   carries the value.
//! - `NAME-lode-dispatcher`, a ClusterIP Service selecting the training pod at the dispatcher's
//!   port. The dispatcher runs in-process in the training pod, under `lode train`, as GoldMiner
//!   colocates it with the training worker: the plan only exists once the program has built its
//!   graph, the dispatcher's journal lives beside the program's checkpoint (a training pod
//!   restarted from its checkpoint resumes both together), and there is no second pod whose
//!   placement or failure the job depends on. Data workers find it through this Service.
//! - per stage `NAME-lode-stage-N`: a LodePool (the size, scalable) and a Deployment of that many
//!   data workers (`lode worker --stage N`). Deployments, not bare pods: Kubernetes then restarts
//!   and places workers, and a scale-in removes the pod the scheduler marked with
//!   `controller.kubernetes.io/pod-deletion-cost` after draining it.
//!
//! Stages come from the dispatcher (its Status RPC). Until it answers, no pool is made; when it
//! stops answering, the pools stay as they are (nothing is deleted on a missing answer). A pool
//! is deleted only when the dispatcher reports fewer stages.
//!
//! Idempotence: `writes` holds only the desired objects that differ from what is observed
//! (every desired field equal in the observed object, so fields the API server defaults do not
//! count), and `status` is `None` when the planned status equals the observed one; planning
//! again from the objects a plan produced yields no writes, no deletions and no status.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, EnvVarSource, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec,
    ResourceRequirements, SeccompProfile, Secret, SecretKeySelector, SecretVolumeSource,
    SecurityContext, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};

use crate::types::{
    LodeJob, LodeJobSpec, LodeJobStatus, LodePool, LodePoolSpec, LodePoolStatus, Phase,
    QueueStatus, StageStatus, Watermark,
};

/// Label naming the LodeJob an object belongs to (the controller lists children by it).
pub const JOB_LABEL: &str = "lode.dev/job";
/// Label naming a pool's stage.
pub const STAGE_LABEL: &str = "lode.dev/stage";
/// The Secret's key holding the token.
pub const TOKEN_KEY: &str = "token";
/// Where the TLS Secret is mounted in worker pods.
pub const TLS_MOUNT: &str = "/etc/lode/tls";

/// Condition types the controller sets.
pub mod condition {
    /// The spec passed validation (`False`: reason `InvalidSpec`, the message names the field).
    pub const VALID: &str = "Valid";
    /// The dispatcher answered its Status RPC with the job's token.
    pub const DISPATCHER_REACHABLE: &str = "DispatcherReachable";
    /// The last reconcile applied everything (`False`: the reason names the failed step).
    pub const RECONCILED: &str = "Reconciled";
}

/// A job's token. Its `Debug` is redacted; the value leaves it only into the Secret's data and
/// into the dispatcher client's authorization header.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A fresh random token.
    pub fn generate() -> Token {
        Token(lode_proto::process::generate_token())
    }

    /// The token read back from the job's Secret, if it holds a usable one.
    pub fn from_secret(secret: &Secret) -> Option<Token> {
        let bytes = secret.data.as_ref()?.get(TOKEN_KEY)?;
        let text = std::str::from_utf8(&bytes.0).ok()?;
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| Token(text.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    #[cfg(test)]
    pub(crate) fn from_test(value: &str) -> Token {
        Token(value.to_owned())
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// The objects observed for a job (listed by [`JOB_LABEL`]). Its `Debug` leaves the
/// Secret's data out.
#[derive(Clone, Default)]
pub struct Observed {
    pub secret: Option<Secret>,
    pub service: Option<Service>,
    pub pools: Vec<LodePool>,
    pub deployments: Vec<Deployment>,
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("secret", &self.secret.as_ref().map(RedactedSecret))
            .field("service", &self.service)
            .field("pools", &self.pools)
            .field("deployments", &self.deployments)
            .finish()
    }
}

/// A Secret's `Debug`: its metadata, never its data.
struct RedactedSecret<'a>(&'a Secret);

impl std::fmt::Debug for RedactedSecret<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("metadata", &self.0.metadata)
            .field("data", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// What the dispatcher said this time.
#[derive(Debug, Clone, PartialEq)]
pub enum DispatcherView {
    /// It was not asked (no token yet: the Secret is being made).
    NotAsked,
    /// It did not answer, or refused; the cause as text.
    Unreachable { cause: String },
    /// Its Status answer.
    Reading(DispatcherReading),
}

/// The parts of the dispatcher's `StatusResponse` the controller uses (also the JSON that
/// `lode controller --render --status FILE` reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DispatcherReading {
    pub stages: u32,
    #[serde(default)]
    pub epoch: u64,
    #[serde(default)]
    pub watermark: Option<Watermark>,
    #[serde(default)]
    pub end_of_data: bool,
    #[serde(default)]
    pub steps_consumed: u64,
    #[serde(default)]
    pub steps_per_epoch: u64,
    #[serde(default)]
    pub steps_computed: u64,
    /// Registered workers by stage.
    #[serde(default)]
    pub workers_per_stage: BTreeMap<u32, u32>,
}

/// One object the job should have. (Unboxed: a plan holds a handful, built once per reconcile.)
/// Its `Debug` leaves a Secret's data out.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq)]
pub enum Child {
    Secret(Secret),
    Service(Service),
    Pool(LodePool),
    /// A pool's status subresource (written apart from its spec).
    PoolStatus {
        name: String,
        status: LodePoolStatus,
    },
    Deployment(Deployment),
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Child::Secret(o) => f.debug_tuple("Secret").field(&RedactedSecret(o)).finish(),
            Child::Service(o) => f.debug_tuple("Service").field(o).finish(),
            Child::Pool(o) => f.debug_tuple("Pool").field(o).finish(),
            Child::PoolStatus { name, status } => f
                .debug_struct("PoolStatus")
                .field("name", name)
                .field("status", status)
                .finish(),
            Child::Deployment(o) => f.debug_tuple("Deployment").field(o).finish(),
        }
    }
}

/// The kinds of children, for deletions and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChildKind {
    Secret,
    Service,
    Pool,
    PoolStatus,
    Deployment,
}

impl Child {
    pub fn kind(&self) -> ChildKind {
        match self {
            Child::Secret(_) => ChildKind::Secret,
            Child::Service(_) => ChildKind::Service,
            Child::Pool(_) => ChildKind::Pool,
            Child::PoolStatus { .. } => ChildKind::PoolStatus,
            Child::Deployment(_) => ChildKind::Deployment,
        }
    }

    pub fn name(&self) -> String {
        match self {
            Child::Secret(o) => o.name_any(),
            Child::Service(o) => o.name_any(),
            Child::Pool(o) => o.name_any(),
            Child::PoolStatus { name, .. } => name.clone(),
            Child::Deployment(o) => o.name_any(),
        }
    }

    /// The object as the JSON body of its server-side apply (a pool's status: the status
    /// subresource's body).
    pub fn to_json(&self) -> serde_json::Value {
        let value = match self {
            Child::Secret(o) => serde_json::to_value(o),
            Child::Service(o) => serde_json::to_value(o),
            Child::Pool(o) => serde_json::to_value(o),
            Child::PoolStatus { name, status } => Ok(serde_json::json!({
                "apiVersion": LodePool::api_version(&()),
                "kind": LodePool::kind(&()),
                "metadata": {"name": name},
                "status": status,
            })),
            Child::Deployment(o) => serde_json::to_value(o),
        };
        // These types serialize to JSON without fail (string keys, no non-finite floats).
        value.unwrap_or(serde_json::Value::Null)
    }

    /// Its owner references (a pool's status has none of its own).
    pub fn owner_references(&self) -> &[OwnerReference] {
        let meta = match self {
            Child::Secret(o) => &o.metadata,
            Child::Service(o) => &o.metadata,
            Child::Pool(o) => &o.metadata,
            Child::PoolStatus { .. } => return &[],
            Child::Deployment(o) => &o.metadata,
        };
        meta.owner_references.as_deref().unwrap_or(&[])
    }
}

/// An object to delete.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ChildRef {
    pub kind: ChildKind,
    pub name: String,
}

/// What reconciling a job does.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Every object the job should have now (the Secret only while it is to be made).
    pub desired: Vec<Child>,
    /// Those of `desired` that differ from what is observed: to apply.
    pub writes: Vec<Child>,
    /// Objects to delete.
    pub deletes: Vec<ChildRef>,
    /// The status to write, `None` when it equals the observed one.
    pub status: Option<LodeJobStatus>,
}

/// Why a job cannot be planned at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("the LodeJob has no {field} (objects read from the API server always do)")]
    MissingMetadata { field: &'static str },
}

/// Names of the objects made for job `job`.
pub fn secret_name(job: &str) -> String {
    format!("{job}-lode-token")
}
pub fn service_name(job: &str) -> String {
    format!("{job}-lode-dispatcher")
}
pub fn pool_name(job: &str, stage: u32) -> String {
    format!("{job}-lode-stage-{stage}")
}

/// The URL the data workers (and the controller) dial for the job's dispatcher.
pub fn dispatcher_url(job: &LodeJob) -> String {
    let scheme = if job.spec.tls_secret.is_some() {
        "https"
    } else {
        "http"
    };
    format!(
        "{scheme}://{}.{}.svc:{}",
        service_name(&job.name_any()),
        job.namespace().unwrap_or_else(|| "default".into()),
        job.spec.dispatcher_port
    )
}

/// Plans job `job`. `new_token` is called only when the job has no Secret yet.
pub fn plan(
    job: &LodeJob,
    observed: &Observed,
    dispatcher: &DispatcherView,
    now: Timestamp,
    new_token: &mut dyn FnMut() -> Token,
) -> Result<Plan, PlanError> {
    let name = job
        .metadata
        .name
        .clone()
        .ok_or(PlanError::MissingMetadata {
            field: "metadata.name",
        })?;
    let owner = job
        .controller_owner_ref(&())
        .map(|o| OwnerReference {
            block_owner_deletion: Some(true),
            ..o
        })
        .ok_or(PlanError::MissingMetadata {
            field: "metadata.uid",
        })?;
    let old_status = job.status.clone().unwrap_or_default();
    let mut status = old_status.clone();
    status.observed_generation = job.metadata.generation;
    let generation = job.metadata.generation;

    let errors = job.spec.validate(&name);
    if !errors.is_empty() {
        let message = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        set_condition(
            &mut status.conditions,
            condition::VALID,
            false,
            "InvalidSpec",
            &message,
            now,
            generation,
        );
        status.phase = Some(Phase::Invalid);
        return Ok(Plan {
            desired: Vec::new(),
            writes: Vec::new(),
            deletes: Vec::new(),
            status: (status != old_status).then_some(status),
        });
    }
    set_condition(
        &mut status.conditions,
        condition::VALID,
        true,
        "SpecValid",
        "the spec is valid",
        now,
        generation,
    );

    let ctx = Context {
        job,
        name: &name,
        namespace: job.namespace(),
        owner,
    };
    let mut desired = Vec::new();
    if observed.secret.is_none() {
        desired.push(Child::Secret(ctx.secret(&new_token())));
    }
    desired.push(Child::Service(ctx.service()));

    let finished = matches!(dispatcher, DispatcherView::Reading(r) if r.end_of_data);
    let stages: Vec<u32> = match dispatcher {
        DispatcherView::Reading(r) => (0..r.stages).collect(),
        DispatcherView::NotAsked | DispatcherView::Unreachable { .. } => {
            let mut kept: Vec<u32> = observed.pools.iter().map(|p| p.spec.stage).collect();
            kept.sort_unstable();
            kept.dedup();
            kept
        }
    };
    let mut stage_statuses = Vec::new();
    for &stage in &stages {
        let pool_name = pool_name(&name, stage);
        let old_pool = observed.pools.iter().find(|p| p.name_any() == pool_name);
        let (min, max) = job.spec.bounds(stage);
        let replicas = if finished {
            0
        } else {
            old_pool.map_or(min, |p| p.spec.replicas.clamp(min, max))
        };
        let deployment = observed
            .deployments
            .iter()
            .find(|d| d.name_any() == pool_name);
        let deployment_status = deployment.and_then(|d| d.status.as_ref());
        let pool_status = LodePoolStatus {
            replicas: deployment_status.map_or(0, |s| s.replicas.unwrap_or(0)),
            ready_replicas: deployment_status.map_or(0, |s| s.ready_replicas.unwrap_or(0)),
            selector: ctx.selector_string(stage),
        };
        desired.push(Child::Pool(ctx.pool(stage, replicas, min, max)));
        if old_pool.is_some() {
            // The status subresource of a pool that exists (a new one gets it next time).
            desired.push(Child::PoolStatus {
                name: pool_name.clone(),
                status: pool_status.clone(),
            });
        }
        desired.push(Child::Deployment(ctx.deployment(stage, replicas)));
        let registered = match dispatcher {
            DispatcherView::Reading(r) => r.workers_per_stage.get(&stage).copied().unwrap_or(0),
            _ => old_status
                .stages
                .iter()
                .find(|s| s.stage == stage)
                .map_or(0, |s| s.registered),
        };
        stage_statuses.push(StageStatus {
            stage,
            pool: pool_name,
            desired: replicas,
            ready: pool_status.ready_replicas,
            registered,
        });
    }

    let mut deletes = Vec::new();
    if let DispatcherView::Reading(_) = dispatcher {
        let wanted = |n: &str| stages.iter().any(|&s| pool_name(&name, s) == n);
        for pool in &observed.pools {
            if !wanted(&pool.name_any()) {
                deletes.push(ChildRef {
                    kind: ChildKind::Pool,
                    name: pool.name_any(),
                });
            }
        }
        for d in &observed.deployments {
            if !wanted(&d.name_any()) {
                deletes.push(ChildRef {
                    kind: ChildKind::Deployment,
                    name: d.name_any(),
                });
            }
        }
        deletes.sort();
    }

    status.dispatcher = Some(dispatcher_url(job));
    status.stages = stage_statuses;
    match dispatcher {
        DispatcherView::Reading(r) => {
            status.stage_count = Some(r.stages);
            status.queue = Some(QueueStatus {
                production: r.steps_computed,
                consumption: r.steps_consumed,
                watermark: r.watermark,
                epoch: r.epoch,
                steps_per_epoch: r.steps_per_epoch,
                end_of_data: r.end_of_data,
            });
            status.phase = Some(if finished {
                Phase::Finished
            } else {
                Phase::Running
            });
            set_condition(
                &mut status.conditions,
                condition::DISPATCHER_REACHABLE,
                true,
                "StatusRead",
                "the dispatcher answers its Status RPC",
                now,
                generation,
            );
        }
        DispatcherView::Unreachable { cause } => {
            status.phase = Some(if status.stage_count.is_some() {
                Phase::DispatcherUnreachable
            } else {
                Phase::Pending
            });
            set_condition(
                &mut status.conditions,
                condition::DISPATCHER_REACHABLE,
                false,
                "DispatcherUnreachable",
                cause,
                now,
                generation,
            );
        }
        DispatcherView::NotAsked => {
            status.phase = Some(Phase::Pending);
            set_condition_unknown(
                &mut status.conditions,
                condition::DISPATCHER_REACHABLE,
                "WaitingForToken",
                "the job's token Secret is being made",
                now,
                generation,
            );
        }
    }
    set_condition(
        &mut status.conditions,
        condition::RECONCILED,
        true,
        "Applied",
        "every object is as planned",
        now,
        generation,
    );

    let writes = desired
        .iter()
        .filter(|child| !is_observed(child, observed))
        .cloned()
        .collect();
    Ok(Plan {
        desired,
        writes,
        deletes,
        status: (status != old_status).then_some(status),
    })
}

/// The status after a failed reconcile: the `Reconciled` condition says why (`reason`, e.g.
/// `ApplyFailed`; `message`, the cause), the phase is `Error`. `None` when nothing changes.
pub fn failed_status(
    job: &LodeJob,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Option<LodeJobStatus> {
    let old = job.status.clone().unwrap_or_default();
    let mut status = old.clone();
    set_condition(
        &mut status.conditions,
        condition::RECONCILED,
        false,
        reason,
        message,
        now,
        job.metadata.generation,
    );
    status.phase = Some(Phase::Error);
    (status != old).then_some(status)
}

/// Sets condition `type_`, keeping its transition time when its status does not change.
fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) {
    let value = if ok { "True" } else { "False" };
    put_condition(conditions, type_, value, reason, message, now, generation);
}

fn set_condition_unknown(
    conditions: &mut Vec<Condition>,
    type_: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) {
    put_condition(
        conditions, type_, "Unknown", reason, message, now, generation,
    );
}

fn put_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
    generation: Option<i64>,
) {
    let since = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == value)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    let new = Condition {
        type_: type_.to_owned(),
        status: value.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: since,
        observed_generation: generation,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(old) => *old = new,
        None => conditions.push(new),
    }
}

/// Whether `child` is already as planned: every field it sets equal in the observed object.
fn is_observed(child: &Child, observed: &Observed) -> bool {
    let name = child.name();
    let found = match child.kind() {
        ChildKind::Secret => observed.secret.as_ref().map(serde_json::to_value),
        ChildKind::Service => observed.service.as_ref().map(serde_json::to_value),
        ChildKind::Pool => observed
            .pools
            .iter()
            .find(|p| p.name_any() == name)
            .map(serde_json::to_value),
        ChildKind::PoolStatus => observed
            .pools
            .iter()
            .find(|p| p.name_any() == name)
            .map(|p| {
                serde_json::to_value(p).map(|mut v| {
                    // Compared as its apply body is: kind, version, name and status.
                    if let Some(meta) = v.get_mut("metadata") {
                        *meta = serde_json::json!({"name": name});
                    }
                    v
                })
            }),
        ChildKind::Deployment => observed
            .deployments
            .iter()
            .find(|d| d.name_any() == name)
            .map(serde_json::to_value),
    };
    match found {
        Some(Ok(actual)) => is_subset(&child.to_json(), &actual),
        _ => false,
    }
}

/// Whether every field of `want` is present and equal in `have` (objects: by key, recursively;
/// arrays: same length, element by element; everything else: equal).
pub fn is_subset(want: &serde_json::Value, have: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| is_subset(v, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| is_subset(a, b))
        }
        _ => want == have,
    }
}

/// What every object of one job shares.
struct Context<'a> {
    job: &'a LodeJob,
    name: &'a str,
    namespace: Option<String>,
    owner: OwnerReference,
}

impl Context<'_> {
    fn spec(&self) -> &LodeJobSpec {
        &self.job.spec
    }

    fn labels(&self, component: &str, stage: Option<u32>) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "lode".to_owned()),
            (
                "app.kubernetes.io/component".to_owned(),
                component.to_owned(),
            ),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "lode-controller".to_owned(),
            ),
            (JOB_LABEL.to_owned(), self.name.to_owned()),
        ]);
        if let Some(stage) = stage {
            labels.insert(STAGE_LABEL.to_owned(), stage.to_string());
        }
        labels
    }

    fn selector(&self, stage: u32) -> BTreeMap<String, String> {
        BTreeMap::from([
            (JOB_LABEL.to_owned(), self.name.to_owned()),
            (STAGE_LABEL.to_owned(), stage.to_string()),
        ])
    }

    fn selector_string(&self, stage: u32) -> String {
        self.selector(stage)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn meta(&self, name: String, component: &str, stage: Option<u32>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: self.namespace.clone(),
            labels: Some(self.labels(component, stage)),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }

    fn secret(&self, token: &Token) -> Secret {
        Secret {
            metadata: self.meta(secret_name(self.name), "token", None),
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([(
                TOKEN_KEY.to_owned(),
                ByteString(token.expose().as_bytes().to_vec()),
            )])),
            immutable: Some(true),
            ..Secret::default()
        }
    }

    fn service(&self) -> Service {
        let port = self.spec().dispatcher_port;
        Service {
            metadata: self.meta(service_name(self.name), "dispatcher", None),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                selector: Some(self.spec().training_selector.clone()),
                ports: Some(vec![ServicePort {
                    name: Some("grpc".into()),
                    port,
                    target_port: Some(IntOrString::Int(port)),
                    protocol: Some("TCP".into()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    fn pool(&self, stage: u32, replicas: i32, min: i32, max: i32) -> LodePool {
        let mut pool = LodePool::new(
            &pool_name(self.name, stage),
            LodePoolSpec {
                job: self.name.to_owned(),
                stage,
                replicas,
                min_replicas: min,
                max_replicas: max,
                scaler: self.spec().scaler,
            },
        );
        pool.metadata = self.meta(pool_name(self.name, stage), "data-worker", Some(stage));
        pool
    }

    fn deployment(&self, stage: u32, replicas: i32) -> Deployment {
        let spec = self.spec();
        let workers = &spec.workers;
        let mut args: Vec<String> = [
            "worker",
            "--dispatcher",
            &dispatcher_url(self.job),
            "--job",
            &spec.job_id.to_string(),
            "--stage",
            &stage.to_string(),
            "--name",
            "$(POD_NAME)",
        ]
        .map(str::to_owned)
        .to_vec();
        if let Some(threads) = workers.threads {
            args.extend(["--threads".to_owned(), threads.to_string()]);
        }
        let mut mounts = Vec::new();
        let mut volumes = Vec::new();
        if let Some(data) = &workers.data {
            args.extend(["--data-root".to_owned(), data.mount_path.clone()]);
            mounts.push(VolumeMount {
                name: "data".into(),
                mount_path: data.mount_path.clone(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
            volumes.push(Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: data.claim_name.clone(),
                    read_only: Some(true),
                }),
                ..Volume::default()
            });
        }
        if let Some(secret) = &spec.tls_secret {
            args.extend(["--tls-ca".to_owned(), format!("{TLS_MOUNT}/ca.crt")]);
            mounts.push(VolumeMount {
                name: "tls".into(),
                mount_path: TLS_MOUNT.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
            volumes.push(Volume {
                name: "tls".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.clone()),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            });
        }
        let resources = BTreeMap::from([
            ("cpu".to_owned(), Quantity(workers.cpu.clone())),
            ("memory".to_owned(), Quantity(workers.memory.clone())),
        ]);
        let container = Container {
            name: "worker".into(),
            image: Some(workers.image.clone()),
            image_pull_policy: workers.image_pull_policy.clone(),
            command: Some(vec!["lode".into()]),
            args: Some(args),
            env: Some(vec![
                EnvVar {
                    name: "LODE_TOKEN".into(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: secret_name(self.name),
                            key: TOKEN_KEY.into(),
                            optional: Some(false),
                        }),
                        ..EnvVarSource::default()
                    }),
                    value: None,
                },
                EnvVar {
                    name: "POD_NAME".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.name".into(),
                            api_version: None,
                        }),
                        ..EnvVarSource::default()
                    }),
                    value: None,
                },
            ]),
            resources: Some(ResourceRequirements {
                requests: Some(resources.clone()),
                limits: Some(resources),
                ..ResourceRequirements::default()
            }),
            security_context: Some(SecurityContext {
                run_as_non_root: Some(true),
                read_only_root_filesystem: Some(true),
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    add: None,
                }),
                ..SecurityContext::default()
            }),
            volume_mounts: (!mounts.is_empty()).then_some(mounts),
            ..Container::default()
        };
        let labels = self.labels("data-worker", Some(stage));
        Deployment {
            metadata: self.meta(pool_name(self.name, stage), "data-worker", Some(stage)),
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                selector: LabelSelector {
                    match_labels: Some(self.selector(stage)),
                    match_expressions: None,
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        containers: vec![container],
                        automount_service_account_token: Some(false),
                        enable_service_links: Some(false),
                        service_account_name: workers.service_account_name.clone(),
                        security_context: Some(PodSecurityContext {
                            run_as_non_root: Some(true),
                            seccomp_profile: Some(SeccompProfile {
                                type_: "RuntimeDefault".into(),
                                localhost_profile: None,
                            }),
                            ..PodSecurityContext::default()
                        }),
                        volumes: (!volumes.is_empty()).then_some(volumes),
                        ..PodSpec::default()
                    }),
                },
                ..DeploymentSpec::default()
            }),
            status: None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
