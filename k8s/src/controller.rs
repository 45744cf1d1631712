//! The controller: kube-rs's `Controller` watching LodeJobs and the objects they own, and a
//! `reconcile` that lists a job's children, asks its dispatcher, calls the pure planner and
//! applies what it planned.
//!
//! Writes are server-side applies under one field manager ([`ControllerConfig::field_manager`],
//! `lode-controller` by default). They are forced (this controller is the one writer of the
//! objects it makes) except a LodePool's spec, which the scheduler or an autoscaler also writes
//! (`spec.replicas`, through the scale subresource): that apply is forced only when the planner
//! moves the size (a new pool, a size out of bounds, end of data), so a size someone set after
//! the controller listed the pool comes back as a 409 conflict and a retry, never as an
//! overwrite. The job's status goes through its status subresource, written only when it
//! changed.
//!
//! Failures requeue the job with an exponential backoff per job ([`Backoff`]) and, when the API
//! server takes it, set the `Reconciled` condition to `False` with a reason naming the step
//! that failed (`ListFailed`, `ApplyFailed`, `DeleteFailed`, `StatusFailed`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::plan::{
    self, Child, ChildKind, DispatcherReading, DispatcherView, Observed, PlanError, Token,
    JOB_LABEL,
};
use crate::types::{LodeJob, LodeJobStatus, LodePool, Watermark};

/// The default field manager of every write.
pub const FIELD_MANAGER: &str = "lode-controller";
/// The label the controller's objects carry; its watches select by it.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by=lode-controller";

/// The controller's settings.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Watch one namespace, or all (`None`).
    pub namespace: Option<String>,
    pub field_manager: String,
    /// How often a healthy job is reconciled again (its dispatcher's counters are read then).
    pub resync: Duration,
    /// How long the dispatcher has to answer its Status RPC.
    pub dispatcher_timeout: Duration,
    /// The first retry's delay after a failure; each further failure doubles it.
    pub backoff_base: Duration,
    /// The longest retry delay.
    pub backoff_max: Duration,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            namespace: None,
            field_manager: FIELD_MANAGER.to_owned(),
            resync: Duration::from_secs(15),
            dispatcher_timeout: Duration::from_secs(3),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
        }
    }
}

/// The controller's errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action}")]
    Kube {
        /// What was being done (`apply Deployment wide-deep-lode-stage-0`), for logs and the
        /// `Reconciled` condition.
        action: String,
        reason: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("cannot configure the Kubernetes client (in a pod: its ServiceAccount; elsewhere: KUBECONFIG or ~/.kube/config)")]
    Config {
        #[source]
        source: kube::Error,
    },
    #[error("the LodeJob CRD is not served ({hint})")]
    NoCrd {
        hint: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// The `Reconciled` condition's reason for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube { reason, .. } => reason,
            Error::Plan(_) => "PlanFailed",
            Error::NoCrd { .. } => "NoCrd",
            Error::Config { .. } => "NoClient",
        }
    }

    /// The failure as one line: the action and the API server's answer.
    pub fn message(&self) -> String {
        match self {
            Error::Kube { action, source, .. } => format!("{action}: {source}"),
            other => other.to_string(),
        }
    }
}

/// Asks a job's dispatcher for its status. A trait so that tests answer for it.
pub trait DispatcherStatus: Send + Sync + 'static {
    /// The dispatcher at `url` for job `job_id`, authenticated with `token`; `Err` carries the
    /// cause as text (it goes into the `DispatcherReachable` condition).
    fn status<'a>(
        &'a self,
        url: &'a str,
        job_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<DispatcherReading, String>>;
}

/// The real dispatcher client: Lode's Status RPC over gRPC, within a timeout.
#[derive(Debug, Clone)]
pub struct GrpcDispatcher {
    pub tls: Option<lode_proto::tls::ClientTls>,
    pub timeout: Duration,
}

impl DispatcherStatus for GrpcDispatcher {
    fn status<'a>(
        &'a self,
        url: &'a str,
        job_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<DispatcherReading, String>> {
        Box::pin(async move {
            let call = async {
                let mut client =
                    lode_proto::service::connect(url, token.expose(), self.tls.as_ref())
                        .await
                        .map_err(|e| error_chain(&e))?;
                let request = lode_proto::service::v1::StatusRequest { job_id };
                let answer = client.status(request).await.map_err(|status| {
                    lode_proto::service::RpcError::of("Status")(status).to_string()
                })?;
                Ok(reading_of(&answer.into_inner()))
            };
            match tokio::time::timeout(self.timeout, call).await {
                Ok(result) => result,
                Err(_) => Err(format!(
                    "{url} did not answer within {} ms",
                    self.timeout.as_millis()
                )),
            }
        })
    }
}

/// The parts of a `StatusResponse` the planner uses.
pub fn reading_of(status: &lode_proto::service::v1::StatusResponse) -> DispatcherReading {
    let mut workers_per_stage = std::collections::BTreeMap::new();
    for w in &status.workers {
        *workers_per_stage.entry(w.stage).or_insert(0) += 1;
    }
    DispatcherReading {
        stages: status.stages,
        epoch: status.epoch,
        watermark: status.watermark.map(|w| Watermark {
            epoch: w.epoch,
            step: w.step,
        }),
        end_of_data: status.end_of_data,
        steps_consumed: status.steps_consumed,
        steps_per_epoch: status.steps_per_epoch,
        steps_computed: status.steps_computed,
        workers_per_stage,
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text
}

/// Per-job retry delays: `base × 2^(failures − 1)`, at most `max`; a success resets it.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a failure of `key` and returns the delay before its retry.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Forgets `key`'s failures.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// What `reconcile` needs besides the job.
pub struct Context {
    pub client: Client,
    pub config: ControllerConfig,
    pub dispatcher: Arc<dyn DispatcherStatus>,
    pub backoff: Backoff,
    /// The clock (tests pass a fixed one).
    pub now: Box<dyn Fn() -> Timestamp + Send + Sync>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(
        client: Client,
        config: ControllerConfig,
        dispatcher: Arc<dyn DispatcherStatus>,
    ) -> Context {
        let backoff = Backoff::new(config.backoff_base, config.backoff_max);
        Context {
            client,
            config,
            dispatcher,
            backoff,
            now: Box::new(Timestamp::now),
        }
    }
}

fn key(job: &LodeJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

/// Reconciles one job (see the module doc).
pub async fn reconcile(job: Arc<LodeJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    if job.meta().deletion_timestamp.is_some() {
        // The garbage collector deletes the owned objects; nothing of ours to clean.
        return Ok(Action::await_change());
    }
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    match reconcile_inner(&job, &ctx, &ns).await {
        Ok(action) => {
            ctx.backoff.succeeded(&key(&job));
            Ok(action)
        }
        Err(err) => {
            // Best effort: the API server may be the thing that failed.
            if let Some(status) =
                plan::failed_status(&job, err.reason(), &err.message(), (ctx.now)())
            {
                let jobs: Api<LodeJob> = Api::namespaced(ctx.client.clone(), &ns);
                if let Err(e) =
                    write_status(&jobs, &job.name_any(), &status, &ctx.config.field_manager).await
                {
                    warn!(job = %key(&job), cause = %e, "cannot record the failure in the status");
                }
            }
            Err(err)
        }
    }
}

async fn reconcile_inner(job: &LodeJob, ctx: &Context, ns: &str) -> Result<Action, Error> {
    let name = job.name_any();
    let client = &ctx.client;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let pools: Api<LodePool> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let observed = Observed {
        secret: list(&secrets, &name)
            .await?
            .into_iter()
            .find(|s| s.name_any() == plan::secret_name(&name)),
        service: list(&services, &name)
            .await?
            .into_iter()
            .find(|s| s.name_any() == plan::service_name(&name)),
        pools: list(&pools, &name).await?,
        deployments: list(&deployments, &name).await?,
    };

    let view = if !job.spec.validate(&name).is_empty() {
        DispatcherView::NotAsked
    } else {
        match observed.secret.as_ref().and_then(Token::from_secret) {
            None => DispatcherView::NotAsked,
            Some(token) => {
                let url = plan::dispatcher_url(job);
                match ctx.dispatcher.status(&url, job.spec.job_id, &token).await {
                    Ok(reading) => DispatcherView::Reading(reading),
                    Err(cause) => {
                        info!(job = %key(job), %cause, "the dispatcher does not answer");
                        DispatcherView::Unreachable { cause }
                    }
                }
            }
        }
    };

    let planned = plan::plan(job, &observed, &view, (ctx.now)(), &mut Token::generate)?;
    let manager = &ctx.config.field_manager;
    for child in &planned.writes {
        let action = format!("apply {:?} {}", child.kind(), child.name());
        let body = child.to_json();
        let result = match child {
            Child::Secret(_) => apply(&secrets, &child.name(), &body, manager, true).await,
            Child::Service(_) => apply(&services, &child.name(), &body, manager, true).await,
            Child::Pool(pool) => {
                let moved = observed
                    .pools
                    .iter()
                    .find(|p| p.name_any() == child.name())
                    .is_none_or(|p| p.spec.replicas != pool.spec.replicas);
                apply(&pools, &child.name(), &body, manager, moved).await
            }
            Child::PoolStatus { name, .. } => {
                let params = PatchParams::apply(manager).force();
                pools
                    .patch_status(name, &params, &Patch::Apply(&body))
                    .await
                    .map(drop)
            }
            Child::Deployment(_) => apply(&deployments, &child.name(), &body, manager, true).await,
        };
        result.map_err(|source| Error::Kube {
            action: action.clone(),
            reason: "ApplyFailed",
            source,
        })?;
        info!(job = %key(job), object = %child.name(), kind = ?child.kind(), "applied");
    }
    for gone in &planned.deletes {
        let params = DeleteParams::background();
        let result = match gone.kind {
            ChildKind::Pool => pools.delete(&gone.name, &params).await.map(drop),
            ChildKind::Deployment => deployments.delete(&gone.name, &params).await.map(drop),
            // The planner deletes only pools and their Deployments.
            ChildKind::Secret | ChildKind::Service | ChildKind::PoolStatus => Ok(()),
        };
        match result {
            Ok(()) => info!(job = %key(job), object = %gone.name, kind = ?gone.kind, "deleted"),
            // Already gone: what the deletion wanted.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(Error::Kube {
                    action: format!("delete {:?} {}", gone.kind, gone.name),
                    reason: "DeleteFailed",
                    source,
                })
            }
        }
    }
    if let Some(status) = &planned.status {
        let jobs: Api<LodeJob> = Api::namespaced(client.clone(), ns);
        write_status(&jobs, &name, status, manager)
            .await
            .map_err(|source| Error::Kube {
                action: format!("write the status of LodeJob {name}"),
                reason: "StatusFailed",
                source,
            })?;
    }
    Ok(Action::requeue(ctx.config.resync))
}

async fn list<K>(api: &Api<K>, job: &str) -> Result<Vec<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let params = ListParams::default().labels(&format!("{JOB_LABEL}={job}"));
    api.list(&params)
        .await
        .map(|l| l.items)
        .map_err(|source| Error::Kube {
            action: format!(
                "list {} of LodeJob {job}",
                K::plural(&K::DynamicType::default())
            ),
            reason: "ListFailed",
            source,
        })
}

async fn apply<K>(
    api: &Api<K>,
    name: &str,
    body: &serde_json::Value,
    manager: &str,
    force: bool,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut params = PatchParams::apply(manager);
    if force {
        params = params.force();
    }
    api.patch(name, &params, &Patch::Apply(body))
        .await
        .map(drop)
}

async fn write_status(
    jobs: &Api<LodeJob>,
    name: &str,
    status: &LodeJobStatus,
    manager: &str,
) -> Result<(), kube::Error> {
    let body = serde_json::json!({
        "apiVersion": LodeJob::api_version(&()),
        "kind": LodeJob::kind(&()),
        "metadata": {"name": name},
        "status": status,
    });
    jobs.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(drop)
}

/// A failed reconcile's retry: the job's next backoff delay.
pub fn error_policy(job: Arc<LodeJob>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&key(&job));
    warn!(job = %key(&job), cause = %err.message(), retry_in_ms = delay.as_millis(), "reconcile failed");
    Action::requeue(delay)
}

/// A client from the environment: the pod's ServiceAccount in a cluster, else the kubeconfig.
pub async fn client() -> Result<Client, Error> {
    Client::try_default()
        .await
        .map_err(|source| Error::Config { source })
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    dispatcher: Arc<dyn DispatcherStatus>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let jobs: Api<LodeJob> = match &config.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match jobs.list(&ListParams::default().limit(1)).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(Error::NoCrd {
                hint: "install it with `kubectl apply -f deploy/crds.yaml`",
                source: kube::Error::Api(status),
            })
        }
        Err(source) => return Err(Error::Kube {
            action:
                "list LodeJobs at start-up (is the API server reachable, and does RBAC allow it?)"
                    .into(),
            reason: "ListFailed",
            source,
        }),
    }
    fn owned<K>(client: &Client, ns: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let ns = config.namespace.clone();
    let ns = ns.as_deref();
    let children = watcher::Config::default().labels(MANAGED_BY);
    info!(namespace = ns.unwrap_or("(all)"), field_manager = %config.field_manager, "controller starting");
    let ctx = Arc::new(Context::new(client.clone(), config, dispatcher));
    Controller::new(jobs, watcher::Config::default())
        .owns(owned::<Secret>(&client, ns), children.clone())
        .owns(owned::<Service>(&client, ns), children.clone())
        .owns(owned::<LodePool>(&client, ns), children.clone())
        .owns(owned::<Deployment>(&client, ns), children)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((job, _)) => tracing::debug!(job = %job, "reconciled"),
                Err(err) => warn!(cause = %error_chain(&err), "controller"),
            }
        })
        .await;
    info!("controller stopped");
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
