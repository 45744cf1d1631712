//! `reconcile` through kube's real `Client` over a `tower_test` mock: a verifier task plays the
//! API server, asserting each request it expects (method, path, query, body) and answering it
//! (kube-rs's documented pattern, as in its controller-rs example). Every request is also
//! checked against the RBAC call list (`rbac::CONTROLLER_CALLS`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::Client;
use serde_json::{json, Value};

use super::*;
use crate::plan::tests::{job, spec};
use crate::rbac::{allows, CONTROLLER_CALLS};

const NS: &str = "ml";
const SECRETS: &str = "/api/v1/namespaces/ml/secrets";
const SERVICES: &str = "/api/v1/namespaces/ml/services";
const POOLS: &str = "/apis/lode.dev/v1alpha1/namespaces/ml/lodepools";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/ml/deployments";
const JOB_STATUS: &str = "/apis/lode.dev/v1alpha1/namespaces/ml/lodejobs/wide-deep/status";
const TOKEN: &str = "feedfacefeedfacefeedfacefeedface";

type Check = Box<dyn Fn(&Value) + Send>;

/// One request the API server expects, and its answer.
struct Expect {
    method: Method,
    path: String,
    /// `key=value` pairs the query must hold.
    query: Vec<String>,
    /// `key` the query must not hold.
    not_query: Vec<&'static str>,
    check: Check,
    status: u16,
    answer: Value,
}

impl Expect {
    fn list(path: &str, items: Vec<Value>) -> Expect {
        Expect {
            method: Method::GET,
            path: path.to_owned(),
            query: vec!["labelSelector=lode.dev%2Fjob%3Dwide-deep".into()],
            not_query: vec![],
            check: Box::new(|_| {}),
            status: 200,
            answer: json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
        }
    }

    /// A server-side apply of `path/name`, forced or not, by the controller's field manager.
    fn apply(
        path: &str,
        name: &str,
        force: bool,
        check: impl Fn(&Value) + Send + 'static,
    ) -> Expect {
        let mut query = vec!["fieldManager=lode-controller".to_owned()];
        let mut not_query = vec![];
        if force {
            query.push("force=true".into());
        } else {
            not_query.push("force");
        }
        Expect {
            method: Method::PATCH,
            path: format!("{path}/{name}"),
            query,
            not_query,
            check: Box::new(check),
            status: 200,
            answer: Value::Null, // the request's body, with metadata the server adds
        }
    }

    fn status(check: impl Fn(&Value) + Send + 'static) -> Expect {
        let mut e = Expect::apply(
            "/apis/lode.dev/v1alpha1/namespaces/ml/lodejobs",
            "wide-deep/status",
            true,
            check,
        );
        e.check = Box::new({
            let check = e.check;
            move |body: &Value| {
                assert_eq!(body["kind"], "LodeJob");
                assert_eq!(body["metadata"]["name"], "wide-deep");
                check(&body["status"]);
            }
        });
        assert_eq!(e.path, JOB_STATUS);
        e
    }

    fn delete(path: &str, name: &str) -> Expect {
        Expect {
            method: Method::DELETE,
            path: format!("{path}/{name}"),
            query: vec![],
            not_query: vec![],
            check: Box::new(|body| assert_eq!(body["propagationPolicy"], "Background")),
            status: 200,
            answer: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
        }
    }

    /// The same request answered with an error status.
    fn failing(mut self, code: u16, reason: &str) -> Expect {
        self.status = code;
        self.answer = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{reason} (from the test's API server)"), "reason": reason, "code": code,
        });
        self
    }
}

/// (verb, group, resource) of a request, as RBAC sees it.
pub(crate) fn rbac_of(method: &Method, path: &str, query: &str) -> (String, String, String) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("not an API path: {path}"),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] => rest,
        rest => rest,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => panic!("unexpected path {path}"),
    };
    let verb = match (method.as_str(), named) {
        ("GET", false) if query.contains("watch=true") => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        (m, _) => panic!("unexpected method {m}"),
    };
    (verb.to_owned(), group.to_owned(), resource)
}

/// A request's method, path and query, asserted to be one of `calls` (named `list`).
pub(crate) fn allowed(
    request: &Request<Body>,
    calls: &[crate::rbac::ApiCall],
    list: &str,
) -> (Method, String, String) {
    let (method, path, query) = (
        request.method().clone(),
        request.uri().path().to_owned(),
        request.uri().query().unwrap_or("").to_owned(),
    );
    let (verb, group, resource) = rbac_of(&method, &path, &query);
    assert!(
        allows(calls, &verb, &group, &resource),
        "{verb} {group}/{resource} ({method} {path}) is not in rbac::{list}"
    );
    (method, path, query)
}

/// A request's body as JSON (`null` when empty); `what` names the request in a failure.
pub(crate) async fn json_body(body: Body, what: &str) -> Value {
    let bytes = body
        .collect_bytes()
        .await
        .unwrap_or_else(|e| panic!("{what} body: {e}"));
    if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{what} body: {e}"))
    }
}

/// Plays the API server through `script`; returns the applied objects' paths, in order.
async fn serve(
    mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    script: Vec<Expect>,
) -> Vec<String> {
    let mut applied = Vec::new();
    for (i, expect) in script.into_iter().enumerate() {
        let Some((request, send)) = handle.next_request().await else {
            panic!("request {i} ({} {}) never came", expect.method, expect.path)
        };
        let (method, path, query) = allowed(&request, CONTROLLER_CALLS, "CONTROLLER_CALLS");
        assert_eq!(
            (&method, path.as_str()),
            (&expect.method, expect.path.as_str()),
            "request {i}"
        );
        for q in &expect.query {
            assert!(
                query.split('&').any(|kv| kv == q),
                "request {i} {path}: query {query:?} lacks {q}"
            );
        }
        for q in &expect.not_query {
            assert!(
                !query.split('&').any(|kv| kv.starts_with(&format!("{q}="))),
                "request {i} {path}: query {query:?} has {q}"
            );
        }
        if method == Method::PATCH {
            assert_eq!(
                request
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok()),
                Some("application/apply-patch+yaml"),
                "request {i}: server-side apply"
            );
        }
        let body = json_body(request.into_body(), &format!("request {i}")).await;
        (expect.check)(&body);
        let answer = if expect.answer.is_null() && path.ends_with("/status") {
            // The whole object, as the API server answers a status write.
            let mut whole = serde_json::to_value(job(spec())).unwrap_or_default();
            whole["status"] = body["status"].clone();
            whole
        } else if expect.answer.is_null() {
            let mut echoed = body.clone();
            echoed["metadata"]["uid"] = json!(format!("uid-{i}"));
            echoed["metadata"]["resourceVersion"] = json!("2");
            echoed
        } else {
            expect.answer.clone()
        };
        if method == Method::PATCH && expect.status == 200 {
            applied.push(path.clone());
        }
        let response = Response::builder()
            .status(expect.status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&answer).unwrap_or_default()))
            .unwrap_or_else(|e| panic!("response: {e}"));
        send.send_response(response);
    }
    if let Some((request, _)) = handle.next_request().await {
        panic!("unexpected request {} {}", request.method(), request.uri());
    }
    applied
}

/// A dispatcher that answers from a queue and records what it was asked.
#[derive(Default)]
struct FakeDispatcher {
    answers: Mutex<VecDeque<Result<DispatcherReading, String>>>,
    asked: Mutex<Vec<(String, u64, String)>>,
}

impl DispatcherStatus for FakeDispatcher {
    fn status<'a>(
        &'a self,
        url: &'a str,
        job_id: u64,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<DispatcherReading, String>> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).push((
            url.to_owned(),
            job_id,
            token.expose().to_owned(),
        ));
        let answer = self
            .answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
            .unwrap_or_else(|| Err("the fake dispatcher has no answer queued".into()));
        Box::pin(async move { answer })
    }
}

struct Harness {
    ctx: Arc<Context>,
    dispatcher: Arc<FakeDispatcher>,
    server: tokio::task::JoinHandle<Vec<String>>,
}

impl Harness {
    fn new(script: Vec<Expect>, answers: Vec<Result<DispatcherReading, String>>) -> Harness {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, NS);
        let dispatcher = Arc::new(FakeDispatcher {
            answers: Mutex::new(answers.into()),
            asked: Mutex::default(),
        });
        let mut ctx = Context::new(client, ControllerConfig::default(), dispatcher.clone());
        ctx.now =
            Box::new(|| Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH));
        Harness {
            ctx: Arc::new(ctx),
            dispatcher,
            server: tokio::spawn(serve(handle, script)),
        }
    }

    async fn reconcile(&self, job: &LodeJob) -> Result<Action, Error> {
        tokio::time::timeout(
            Duration::from_secs(20),
            reconcile(Arc::new(job.clone()), self.ctx.clone()),
        )
        .await
        .unwrap_or_else(|_| panic!("reconcile hung: a request went unanswered"))
    }

    /// Ends the run: the script must be used up, with no request beyond it. Returns the paths
    /// applied.
    async fn finish(self) -> (Vec<String>, Vec<(String, u64, String)>) {
        let asked = self
            .dispatcher
            .asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        drop(self.ctx);
        let applied = match self.server.await {
            Ok(applied) => applied,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        (applied, asked)
    }
}

fn reading(stages: u32) -> DispatcherReading {
    DispatcherReading {
        stages,
        epoch: 1,
        watermark: Some(Watermark { epoch: 1, step: 9 }),
        end_of_data: false,
        steps_consumed: 110,
        steps_per_epoch: 100,
        steps_computed: 120,
        workers_per_stage: [(0, 1)].into(),
    }
}

/// The objects (as JSON items) and status a job has once it is fully reconciled with `stages`
/// stages: the planner's own output, as the API server would return it.
fn settled(job: &mut LodeJob, stages: u32) -> (Vec<Value>, Vec<Value>, Vec<Value>, Vec<Value>) {
    let mut observed = Observed::default();
    let views = [
        DispatcherView::NotAsked,
        DispatcherView::Reading(reading(stages)),
        DispatcherView::Reading(reading(stages)),
    ];
    for view in &views {
        let planned = plan::plan(job, &observed, view, Timestamp::UNIX_EPOCH, &mut || {
            Token::from_test(TOKEN)
        })
        .unwrap_or_else(|e| panic!("{e}"));
        for child in &planned.writes {
            let value = child.to_json();
            match child {
                Child::Secret(_) => observed.secret = serde_json::from_value(value).ok(),
                Child::Service(_) => observed.service = serde_json::from_value(value).ok(),
                Child::Pool(_) => observed
                    .pools
                    .push(serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))),
                Child::PoolStatus { name, status } => {
                    for p in &mut observed.pools {
                        if &p.name_any() == name {
                            p.status = Some(status.clone());
                        }
                    }
                }
                Child::Deployment(_) => {
                    let mut d: Deployment =
                        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"));
                    let replicas = d.spec.as_ref().and_then(|s| s.replicas);
                    d.status = Some(k8s_openapi::api::apps::v1::DeploymentStatus {
                        replicas,
                        ready_replicas: replicas,
                        ..Default::default()
                    });
                    observed.deployments.push(d);
                }
            }
        }
        if let Some(status) = planned.status {
            job.status = Some(status);
        }
    }
    fn items<T: serde::Serialize>(objects: &[T]) -> Vec<Value> {
        objects
            .iter()
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .collect()
    }
    (
        items(observed.secret.as_slice()),
        items(observed.service.as_slice()),
        items(&observed.pools),
        items(&observed.deployments),
    )
}

fn owned_by_the_job(body: &Value) {
    let owners = body["metadata"]["ownerReferences"]
        .as_array()
        .unwrap_or_else(|| panic!("no ownerReferences in {body}"));
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0]["kind"], "LodeJob");
    assert_eq!(owners[0]["uid"], "6f1c-uid");
    assert_eq!(owners[0]["controller"], true);
}

#[tokio::test]
async fn a_new_job_gets_a_token_secret_and_a_service_and_waits_for_its_dispatcher() {
    let job = job(spec());
    let token = Arc::new(Mutex::new(String::new()));
    let seen = token.clone();
    let script = vec![
        Expect::list(SECRETS, vec![]),
        Expect::list(SERVICES, vec![]),
        Expect::list(POOLS, vec![]),
        Expect::list(DEPLOYMENTS, vec![]),
        Expect::apply(SECRETS, "wide-deep-lode-token", true, move |body| {
            owned_by_the_job(body);
            assert_eq!(body["kind"], "Secret");
            assert_eq!(body["immutable"], true);
            let value = body["data"]["token"]
                .as_str()
                .unwrap_or_else(|| panic!("no token"));
            *seen.lock().unwrap_or_else(|e| e.into_inner()) = value.to_owned();
        }),
        Expect::apply(SERVICES, "wide-deep-lode-dispatcher", true, |body| {
            owned_by_the_job(body);
            assert_eq!(body["spec"]["selector"], json!({"app": "train"}));
            assert_eq!(body["spec"]["ports"][0]["port"], 7070);
        }),
        Expect::status(|status| {
            assert_eq!(status["phase"], "Pending");
            assert_eq!(status["observedGeneration"], 3);
            assert_eq!(
                status["dispatcher"],
                "http://wide-deep-lode-dispatcher.ml.svc:7070"
            );
        }),
    ];
    let h = Harness::new(script, vec![]);
    let action = h.reconcile(&job).await;
    assert_eq!(action.ok(), Some(Action::requeue(Duration::from_secs(15))));
    let (applied, asked) = h.finish().await;
    assert_eq!(applied.len(), 3);
    assert_eq!(asked, vec![], "no token yet: the dispatcher is not asked");
    let token = token.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        token.len() >= 32,
        "a base64 token of 32 hex digits: {token}"
    );
}

#[tokio::test]
async fn the_dispatchers_stages_become_pools_and_a_second_reconcile_writes_nothing() {
    let mut job = job(spec());
    let (secret, service, _, _) = settled(&mut job, 0);
    // The job as it stands after its first reconcile (Secret, Service, no stages known yet).
    if let Some(s) = job.status.as_mut() {
        s.stage_count = None;
        s.queue = None;
    }
    let pool = |stage: u32| {
        move |body: &Value| {
            owned_by_the_job(body);
            assert_eq!(body["kind"], "LodePool");
            assert_eq!(body["spec"]["stage"], stage);
            assert_eq!(
                body["spec"]["replicas"], 1,
                "a new pool starts at its minimum"
            );
            assert_eq!(body["spec"]["scaler"], "lode");
        }
    };
    let deployment = |stage: u32| {
        move |body: &Value| {
            owned_by_the_job(body);
            let container = &body["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(body["spec"]["replicas"], 1);
            assert_eq!(container["args"][6], stage.to_string());
            assert_eq!(
                container["env"][0]["valueFrom"]["secretKeyRef"],
                json!({"name": "wide-deep-lode-token", "key": "token", "optional": false})
            );
            assert!(
                !body.to_string().contains(TOKEN),
                "the token stays in its Secret"
            );
        }
    };
    let script = vec![
        Expect::list(SECRETS, secret.clone()),
        Expect::list(SERVICES, service.clone()),
        Expect::list(POOLS, vec![]),
        Expect::list(DEPLOYMENTS, vec![]),
        Expect::apply(POOLS, "wide-deep-lode-stage-0", true, pool(0)),
        Expect::apply(DEPLOYMENTS, "wide-deep-lode-stage-0", true, deployment(0)),
        Expect::apply(POOLS, "wide-deep-lode-stage-1", true, pool(1)),
        Expect::apply(DEPLOYMENTS, "wide-deep-lode-stage-1", true, deployment(1)),
        Expect::status(|status| {
            assert_eq!(status["phase"], "Running");
            assert_eq!(status["stageCount"], 2);
            assert_eq!(
                status["queue"],
                json!({"production": 120, "consumption": 110, "watermark": {"epoch": 1, "step": 9},
                       "epoch": 1, "stepsPerEpoch": 100, "endOfData": false})
            );
            let reachable = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "DispatcherReachable"))
                .cloned()
                .unwrap_or_default();
            assert_eq!(reachable["status"], "True");
        }),
    ];
    let h = Harness::new(script, vec![Ok(reading(2))]);
    assert!(h.reconcile(&job).await.is_ok());
    let (_, asked) = h.finish().await;
    assert_eq!(
        asked,
        vec![(
            "http://wide-deep-lode-dispatcher.ml.svc:7070".to_owned(),
            1,
            TOKEN.to_owned()
        )],
        "the dispatcher is asked at the Service with the Secret's token"
    );

    // Once everything stands as planned, a reconcile only reads.
    let mut job = self::job(spec());
    let (secret, service, pools, deployments) = settled(&mut job, 2);
    let script = vec![
        Expect::list(SECRETS, secret),
        Expect::list(SERVICES, service),
        Expect::list(POOLS, pools),
        Expect::list(DEPLOYMENTS, deployments),
    ];
    let h = Harness::new(script, vec![Ok(reading(2))]);
    assert!(h.reconcile(&job).await.is_ok());
    let (applied, _) = h.finish().await;
    assert_eq!(applied, Vec::<String>::new());
}

#[tokio::test]
async fn a_scaled_pool_moves_its_deployment_and_an_out_of_bounds_size_is_clamped() {
    let mut job = job(spec());
    let (secret, service, mut pools, deployments) = settled(&mut job, 1);
    pools[0]["spec"]["replicas"] = json!(3); // the scheduler (or `kubectl scale`) set 3
    let script = vec![
        Expect::list(SECRETS, secret.clone()),
        Expect::list(SERVICES, service.clone()),
        Expect::list(POOLS, pools.clone()),
        Expect::list(DEPLOYMENTS, deployments.clone()),
        Expect::apply(DEPLOYMENTS, "wide-deep-lode-stage-0", true, |body| {
            assert_eq!(body["spec"]["replicas"], 3);
        }),
        Expect::status(|status| assert_eq!(status["stages"][0]["desired"], 3)),
    ];
    let h = Harness::new(script, vec![Ok(reading(1))]);
    assert!(h.reconcile(&job).await.is_ok());
    h.finish().await;

    pools[0]["spec"]["replicas"] = json!(50);
    let script = vec![
        Expect::list(SECRETS, secret),
        Expect::list(SERVICES, service),
        Expect::list(POOLS, pools),
        Expect::list(DEPLOYMENTS, deployments),
        // Forced: the controller moves the size back within [1, 4].
        Expect::apply(POOLS, "wide-deep-lode-stage-0", true, |body| {
            assert_eq!(body["spec"]["replicas"], 4);
        }),
        Expect::apply(DEPLOYMENTS, "wide-deep-lode-stage-0", true, |body| {
            assert_eq!(body["spec"]["replicas"], 4);
        }),
        Expect::status(|status| assert_eq!(status["stages"][0]["desired"], 4)),
    ];
    let h = Harness::new(script, vec![Ok(reading(1))]);
    assert!(h.reconcile(&job).await.is_ok());
    h.finish().await;
}

#[tokio::test]
async fn a_new_worker_image_updates_each_deployment_and_nothing_else() {
    let mut job = job(spec());
    let (secret, service, pools, deployments) = settled(&mut job, 2);
    job.spec.workers.image = "lode:0.2.0".into();
    job.metadata.generation = Some(4);
    let image = |body: &Value| {
        owned_by_the_job(body);
        assert_eq!(
            body["spec"]["template"]["spec"]["containers"][0]["image"],
            "lode:0.2.0"
        );
        assert_eq!(body["spec"]["replicas"], 1, "the size is kept");
    };
    let script = vec![
        Expect::list(SECRETS, secret),
        Expect::list(SERVICES, service),
        Expect::list(POOLS, pools),
        Expect::list(DEPLOYMENTS, deployments),
        Expect::apply(DEPLOYMENTS, "wide-deep-lode-stage-0", true, image),
        Expect::apply(DEPLOYMENTS, "wide-deep-lode-stage-1", true, image),
        Expect::status(|status| assert_eq!(status["observedGeneration"], 4)),
    ];
    let h = Harness::new(script, vec![Ok(reading(2))]);
    assert!(h.reconcile(&job).await.is_ok());
    let (applied, _) = h.finish().await;
    assert_eq!(applied.len(), 3);
}

#[tokio::test]
async fn fewer_stages_delete_the_extra_pool_and_its_deployment() {
    let mut job = job(spec());
    let (secret, service, pools, deployments) = settled(&mut job, 2);
    let script = vec![
        Expect::list(SECRETS, secret),
        Expect::list(SERVICES, service),
        Expect::list(POOLS, pools),
        Expect::list(DEPLOYMENTS, deployments),
        Expect::delete(POOLS, "wide-deep-lode-stage-1"),
        Expect::delete(DEPLOYMENTS, "wide-deep-lode-stage-1"),
        Expect::status(|status| {
            assert_eq!(status["stageCount"], 1);
            assert_eq!(status["stages"].as_array().map(Vec::len), Some(1));
        }),
    ];
    let h = Harness::new(script, vec![Ok(reading(1))]);
    assert!(h.reconcile(&job).await.is_ok());
    h.finish().await;
}

#[tokio::test]
async fn a_conflict_on_apply_fails_the_reconcile_names_the_cause_and_backs_off() {
    let mut job = job(spec());
    let (secret, service, pools, deployments) = settled(&mut job, 1);
    // The bounds change: the pool's spec is applied again, unforced (its size is unchanged).
    job.spec.max_workers = 6;
    job.metadata.generation = Some(4);
    let script = vec![
        Expect::list(SECRETS, secret),
        Expect::list(SERVICES, service),
        Expect::list(POOLS, pools),
        Expect::list(DEPLOYMENTS, deployments),
        Expect::apply(POOLS, "wide-deep-lode-stage-0", false, |body| {
            assert_eq!(body["spec"]["maxReplicas"], 6);
        })
        .failing(409, "Conflict"),
        Expect::status(|status| {
            assert_eq!(status["phase"], "Error");
            let reconciled = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Reconciled"))
                .cloned()
                .unwrap_or_default();
            assert_eq!(reconciled["status"], "False");
            assert_eq!(reconciled["reason"], "ApplyFailed");
            let message = reconciled["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("apply Pool wide-deep-lode-stage-0")
                    && message.contains("Conflict"),
                "{message}"
            );
        }),
    ];
    let h = Harness::new(script, vec![Ok(reading(1))]);
    let err = h
        .reconcile(&job)
        .await
        .err()
        .unwrap_or_else(|| panic!("a 409 fails the reconcile"));
    assert_eq!(err.reason(), "ApplyFailed");
    let first = error_policy(Arc::new(job.clone()), &err, h.ctx.clone());
    let second = error_policy(Arc::new(job.clone()), &err, h.ctx.clone());
    assert_eq!(first, Action::requeue(Duration::from_secs(1)));
    assert_eq!(second, Action::requeue(Duration::from_secs(2)));
    h.finish().await;
}

#[tokio::test]
async fn an_unavailable_api_server_backs_off_then_creates_each_object_once() {
    let job = job(spec());
    let mut script = Vec::new();
    for _ in 0..2 {
        script.push(Expect::list(SECRETS, vec![]).failing(503, "ServiceUnavailable"));
        script.push(
            Expect::status(|status| assert_eq!(status["phase"], "Error"))
                .failing(503, "ServiceUnavailable"),
        );
    }
    script.extend([
        Expect::list(SECRETS, vec![]),
        Expect::list(SERVICES, vec![]),
        Expect::list(POOLS, vec![]),
        Expect::list(DEPLOYMENTS, vec![]),
        Expect::apply(SECRETS, "wide-deep-lode-token", true, |_| {}),
        Expect::apply(SERVICES, "wide-deep-lode-dispatcher", true, |_| {}),
        Expect::status(|status| assert_eq!(status["phase"], "Pending")),
    ]);
    let h = Harness::new(script, vec![]);
    let arc = Arc::new(job.clone());
    let mut delays = Vec::new();
    for _ in 0..2 {
        let err = h
            .reconcile(&job)
            .await
            .err()
            .unwrap_or_else(|| panic!("503 fails"));
        assert_eq!(err.reason(), "ListFailed");
        delays.push(error_policy(arc.clone(), &err, h.ctx.clone()));
    }
    assert_eq!(
        delays,
        [
            Action::requeue(Duration::from_secs(1)),
            Action::requeue(Duration::from_secs(2))
        ]
    );
    assert!(h.reconcile(&job).await.is_ok());
    // A success resets the backoff.
    assert_eq!(h.ctx.backoff.failed("ml/wide-deep"), Duration::from_secs(1));
    let (applied, _) = h.finish().await;
    let mut unique = applied.clone();
    unique.dedup();
    assert_eq!(applied, unique, "no object applied twice");
    assert_eq!(applied.len(), 3);
}

#[tokio::test]
async fn an_invalid_spec_creates_nothing_and_its_condition_names_the_field() {
    let mut bad = spec();
    bad.workers.cpu = "two".into();
    let job = job(bad);
    let script = vec![
        Expect::list(SECRETS, vec![]),
        Expect::list(SERVICES, vec![]),
        Expect::list(POOLS, vec![]),
        Expect::list(DEPLOYMENTS, vec![]),
        Expect::status(|status| {
            assert_eq!(status["phase"], "Invalid");
            let valid = &status["conditions"][0];
            assert_eq!(
                (valid["type"].as_str(), valid["status"].as_str()),
                (Some("Valid"), Some("False"))
            );
            assert_eq!(valid["reason"], "InvalidSpec");
            assert!(
                valid["message"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("spec.workers.cpu: "),
                "{}",
                valid["message"]
            );
        }),
    ];
    let h = Harness::new(script, vec![]);
    assert!(h.reconcile(&job).await.is_ok());
    let (applied, asked) = h.finish().await;
    assert_eq!(
        applied,
        [JOB_STATUS.to_owned()],
        "only the status is written"
    );
    assert_eq!(asked, vec![]);
}

#[tokio::test]
async fn a_silent_dispatcher_is_reported_and_nothing_is_deleted() {
    let mut job = job(spec());
    let (secret, service, pools, deployments) = settled(&mut job, 2);
    let script = vec![
        Expect::list(SECRETS, secret),
        Expect::list(SERVICES, service),
        Expect::list(POOLS, pools),
        Expect::list(DEPLOYMENTS, deployments),
        Expect::status(|status| {
            assert_eq!(status["phase"], "DispatcherUnreachable");
            let c = status["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "DispatcherReachable"))
                .cloned()
                .unwrap_or_default();
            assert_eq!(c["status"], "False");
            assert_eq!(
                c["message"],
                "http://wide-deep-lode-dispatcher.ml.svc:7070 did not answer within 3000 ms"
            );
            assert_eq!(
                status["stages"].as_array().map(Vec::len),
                Some(2),
                "both pools kept"
            );
        }),
    ];
    let h = Harness::new(
        script,
        vec![Err(
            "http://wide-deep-lode-dispatcher.ml.svc:7070 did not answer within 3000 ms".into(),
        )],
    );
    assert!(h.reconcile(&job).await.is_ok());
    let (applied, _) = h.finish().await;
    assert_eq!(applied, [JOB_STATUS.to_owned()]);
}

#[tokio::test]
async fn a_job_being_deleted_is_left_to_the_garbage_collector() {
    let mut job = job(spec());
    job.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::UNIX_EPOCH,
    ));
    let h = Harness::new(vec![], vec![]);
    assert_eq!(h.reconcile(&job).await.ok(), Some(Action::await_change()));
    let (applied, asked) = h.finish().await;
    assert_eq!((applied.len(), asked.len()), (0, 0));
}

#[tokio::test]
async fn a_dispatcher_that_does_not_listen_is_a_cause_not_a_crash() {
    let dispatcher = GrpcDispatcher {
        tls: None,
        timeout: Duration::from_secs(5),
    };
    // A port bound and closed again: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://127.0.0.1:{port}");
    let cause = dispatcher
        .status(&url, 1, &Token::from_test(TOKEN))
        .await
        .err()
        .unwrap_or_else(|| panic!("nothing listens at {url}"));
    assert!(cause.contains(&format!("127.0.0.1:{port}")), "{cause}");
    assert!(!cause.contains(TOKEN));
}

/// The whole controller (`run`): its watches and the first reconcile of a job listed at start,
/// against an API server that answers lists with that job, holds watches open, and echoes
/// applies. Every request must be one RBAC allows; the Secret and Service are applied once;
/// the controller stops on its shutdown signal.
#[tokio::test]
async fn the_controller_watches_within_its_rbac_reconciles_once_and_shuts_down() {
    use bytes::Bytes;
    use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
    use std::convert::Infallible;

    type Answer = BoxBody<Bytes, Infallible>;
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Answer>>();
    let client = Client::new(service, NS);
    let status_written = Arc::new(tokio::sync::Notify::new());
    let written = status_written.clone();
    let server = tokio::spawn(async move {
        let mut seen: Vec<(String, String)> = Vec::new();
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().clone();
            let path = request.uri().path().to_owned();
            let query = request.uri().query().unwrap_or("").to_owned();
            let (verb, group, resource) = rbac_of(&method, &path, &query);
            assert!(
                allows(CONTROLLER_CALLS, &verb, &group, &resource),
                "{verb} {group}/{resource} ({method} {path}?{query}) is not in rbac::CONTROLLER_CALLS"
            );
            if verb == "watch" && resource != "lodejobs" {
                assert!(
                    query
                        .contains("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dlode-controller"),
                    "the watch of {resource} selects the controller's objects: {query}"
                );
            }
            seen.push((verb.clone(), path.clone()));
            let bytes = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let json = |v: Value| -> Answer {
                Full::new(Bytes::from(serde_json::to_vec(&v).unwrap_or_default())).boxed()
            };
            let answer = match verb.as_str() {
                // A watch that stays open and quiet.
                "watch" => BodyExt::boxed(StreamBody::new(futures::stream::pending::<
                    Result<http_body::Frame<Bytes>, Infallible>,
                >())),
                "list" if resource == "lodejobs" => {
                    let mut job = serde_json::to_value(job(spec())).unwrap_or_default();
                    job["metadata"]["resourceVersion"] = json!("5");
                    json(
                        json!({"apiVersion": "lode.dev/v1alpha1", "kind": "LodeJobList",
                                "metadata": {"resourceVersion": "5"}, "items": [job]}),
                    )
                }
                "list" => json(json!({"apiVersion": "v1", "kind": "List",
                                      "metadata": {"resourceVersion": "5"}, "items": []})),
                "patch" if resource == "lodejobs/status" => {
                    let mut whole = serde_json::to_value(job(spec())).unwrap_or_default();
                    whole["status"] = body["status"].clone();
                    written.notify_one();
                    json(whole)
                }
                "patch" => json(body),
                other => panic!("unexpected {other} {path}"),
            };
            let response = Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(answer)
                .unwrap_or_else(|e| panic!("{e}"));
            send.send_response(response);
        }
        seen
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run(
        client,
        ControllerConfig::default(),
        Arc::new(FakeDispatcher::default()),
        async move {
            let _ = stopped.await;
        },
    ));
    tokio::time::timeout(Duration::from_secs(30), status_written.notified())
        .await
        .unwrap_or_else(|_| panic!("the job's status was never written"));
    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(30), controller)
        .await
        .unwrap_or_else(|_| panic!("the controller did not stop on its shutdown signal"));
    assert!(matches!(result, Ok(Ok(()))), "{result:?}");
    let seen = match server.await {
        Ok(seen) => seen,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    let applied: Vec<&str> = seen
        .iter()
        .filter(|(verb, _)| verb == "patch")
        .map(|(_, path)| path.as_str())
        .collect();
    assert_eq!(
        applied,
        [
            "/api/v1/namespaces/ml/secrets/wide-deep-lode-token",
            "/api/v1/namespaces/ml/services/wide-deep-lode-dispatcher",
            JOB_STATUS,
        ]
    );
    let watched: std::collections::BTreeSet<&str> = seen
        .iter()
        .filter(|(verb, _)| verb == "watch")
        .map(|(_, path)| path.as_str())
        .collect();
    assert_eq!(
        watched.into_iter().collect::<Vec<_>>(),
        [
            "/api/v1/secrets",
            "/api/v1/services",
            "/apis/apps/v1/deployments",
            "/apis/lode.dev/v1alpha1/lodejobs",
            "/apis/lode.dev/v1alpha1/lodepools",
        ]
    );
}
