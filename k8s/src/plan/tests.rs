use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DeploymentStatus;
use proptest::prelude::*;

use super::*;
use crate::types::{LodeJobSpec, Scaler, StageBounds, WorkerSpec};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

pub(crate) fn spec() -> LodeJobSpec {
    LodeJobSpec {
        training_selector: BTreeMap::from([("app".to_owned(), "train".to_owned())]),
        dispatcher_port: 7070,
        job_id: 1,
        workers: WorkerSpec {
            image: "lode:0.1.0".into(),
            image_pull_policy: None,
            cpu: "1".into(),
            memory: "1Gi".into(),
            threads: Some(2),
            data: None,
            service_account_name: None,
        },
        min_workers: 1,
        max_workers: 4,
        stages: vec![],
        priority: 0,
        weight: 1,
        scaler: Scaler::Lode,
        tls_secret: None,
    }
}

pub(crate) fn job(spec: LodeJobSpec) -> LodeJob {
    let mut job = LodeJob::new("wide-deep", spec);
    job.metadata.namespace = Some("ml".into());
    job.metadata.uid = Some("6f1c-uid".into());
    job.metadata.generation = Some(3);
    job
}

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn reading(stages: u32) -> DispatcherView {
    DispatcherView::Reading(DispatcherReading {
        stages,
        epoch: 0,
        watermark: Some(Watermark { epoch: 0, step: 41 }),
        end_of_data: false,
        steps_consumed: 42,
        steps_per_epoch: 100,
        steps_computed: 50,
        workers_per_stage: BTreeMap::from([(0, 1)]),
    })
}

fn plan_of(job: &LodeJob, observed: &Observed, view: &DispatcherView) -> Plan {
    let mut calls = 0;
    let plan = plan(job, observed, view, now(), &mut || {
        calls += 1;
        Token::from_test(TOKEN)
    });
    let plan = plan.unwrap_or_else(|e| panic!("plan: {e}"));
    assert!(calls <= 1, "a token is drawn at most once per plan");
    assert_eq!(
        calls == 1,
        observed.secret.is_none() && job.spec.validate("wide-deep").is_empty(),
        "a token is drawn exactly when the job has no Secret"
    );
    plan
}

/// The world after the plan's writes and deletions, as the API server would hold it (plus a
/// Deployment status as if its pods were up, when `ready`).
fn apply(job: &mut LodeJob, observed: &mut Observed, plan: &Plan, ready: bool) {
    for write in &plan.writes {
        let json = write.to_json();
        match write {
            Child::Secret(_) => observed.secret = serde_json::from_value(json).ok(),
            Child::Service(_) => observed.service = serde_json::from_value(json).ok(),
            Child::Pool(p) => {
                let old = observed
                    .pools
                    .iter()
                    .position(|o| o.name_any() == p.name_any());
                let mut new: LodePool =
                    serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
                if let Some(i) = old {
                    new.status = observed.pools[i].status.clone();
                    observed.pools[i] = new;
                } else {
                    observed.pools.push(new);
                }
            }
            Child::PoolStatus { name, status } => {
                let pool = observed.pools.iter_mut().find(|p| &p.name_any() == name);
                pool.unwrap_or_else(|| panic!("status of a missing pool {name}"))
                    .status = Some(status.clone());
            }
            Child::Deployment(d) => {
                let mut new: Deployment =
                    serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
                let replicas = d.spec.as_ref().and_then(|s| s.replicas);
                new.status = Some(DeploymentStatus {
                    replicas,
                    ready_replicas: if ready { replicas } else { Some(0) },
                    ..DeploymentStatus::default()
                });
                observed
                    .deployments
                    .retain(|o| o.name_any() != d.name_any());
                observed.deployments.push(new);
            }
        }
    }
    for gone in &plan.deletes {
        match gone.kind {
            ChildKind::Pool => observed.pools.retain(|p| p.name_any() != gone.name),
            ChildKind::Deployment => observed.deployments.retain(|d| d.name_any() != gone.name),
            _ => panic!("the planner deletes only pools and Deployments"),
        }
    }
    if let Some(status) = &plan.status {
        job.status = Some(status.clone());
    }
}

fn condition<'a>(status: &'a LodeJobStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no condition {type_}"))
}

#[test]
fn a_new_job_gets_its_token_secret_and_service_first() {
    let job = job(spec());
    let plan = plan_of(&job, &Observed::default(), &DispatcherView::NotAsked);
    let kinds: Vec<(ChildKind, String)> =
        plan.writes.iter().map(|c| (c.kind(), c.name())).collect();
    assert_eq!(
        kinds,
        [
            (ChildKind::Secret, "wide-deep-lode-token".to_owned()),
            (ChildKind::Service, "wide-deep-lode-dispatcher".to_owned()),
        ]
    );
    let Child::Secret(secret) = &plan.writes[0] else {
        panic!("first write is the Secret")
    };
    assert_eq!(Token::from_secret(secret), Some(Token::from_test(TOKEN)));
    let Child::Service(service) = &plan.writes[1] else {
        panic!("second write is the Service")
    };
    let spec = service.spec.as_ref().unwrap_or_else(|| panic!("no spec"));
    assert_eq!(spec.selector.as_ref(), Some(&job.spec.training_selector));
    assert_eq!(spec.ports.as_ref().map(|p| p[0].port), Some(7070));
    let status = plan
        .status
        .unwrap_or_else(|| panic!("a new job's status is written"));
    assert_eq!(status.phase, Some(Phase::Pending));
    assert_eq!(status.observed_generation, Some(3));
    assert_eq!(
        status.dispatcher.as_deref(),
        Some("http://wide-deep-lode-dispatcher.ml.svc:7070")
    );
    assert_eq!(
        condition(&status, condition::DISPATCHER_REACHABLE).status,
        "Unknown"
    );
}

#[test]
fn each_stage_the_dispatcher_reports_gets_a_pool_and_its_deployment() {
    let job = job(spec());
    let plan = plan_of(&job, &Observed::default(), &reading(2));
    let names: Vec<(ChildKind, String)> = plan
        .writes
        .iter()
        .filter(|c| matches!(c.kind(), ChildKind::Pool | ChildKind::Deployment))
        .map(|c| (c.kind(), c.name()))
        .collect();
    assert_eq!(
        names,
        [
            (ChildKind::Pool, "wide-deep-lode-stage-0".to_owned()),
            (ChildKind::Deployment, "wide-deep-lode-stage-0".to_owned()),
            (ChildKind::Pool, "wide-deep-lode-stage-1".to_owned()),
            (ChildKind::Deployment, "wide-deep-lode-stage-1".to_owned()),
        ]
    );
    let deployment = plan
        .writes
        .iter()
        .find_map(|c| match c {
            Child::Deployment(d) if d.name_any().ends_with("stage-1") => Some(d),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no stage-1 Deployment"));
    let spec = deployment
        .spec
        .as_ref()
        .unwrap_or_else(|| panic!("no spec"));
    assert_eq!(spec.replicas, Some(1), "a new pool starts at its minimum");
    let pod = spec
        .template
        .spec
        .as_ref()
        .unwrap_or_else(|| panic!("no pod spec"));
    let container = &pod.containers[0];
    assert_eq!(
        container.args.as_deref().unwrap_or_default(),
        [
            "worker",
            "--dispatcher",
            "http://wide-deep-lode-dispatcher.ml.svc:7070",
            "--job",
            "1",
            "--stage",
            "1",
            "--name",
            "$(POD_NAME)",
            "--threads",
            "2"
        ]
    );
    let token_env = &container.env.as_deref().unwrap_or_default()[0];
    assert_eq!(token_env.name, "LODE_TOKEN");
    assert_eq!(token_env.value, None);
    let key = token_env
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("LODE_TOKEN is not from the Secret"));
    assert_eq!(
        (key.name.as_str(), key.key.as_str()),
        ("wide-deep-lode-token", TOKEN_KEY)
    );
    let status = plan.status.unwrap_or_else(|| panic!("no status"));
    assert_eq!(status.phase, Some(Phase::Running));
    assert_eq!(status.stage_count, Some(2));
    let queue = status.queue.unwrap_or_else(|| panic!("no queue counters"));
    assert_eq!(
        (queue.production, queue.consumption, queue.epoch),
        (50, 42, 0)
    );
    assert_eq!(queue.watermark, Some(Watermark { epoch: 0, step: 41 }));
}

#[test]
fn a_second_plan_from_what_the_first_made_changes_nothing() {
    let mut job = job(spec());
    let mut observed = Observed::default();
    // Three rounds: the Secret and Service, then the pools, then the pools' status.
    for view in [DispatcherView::NotAsked, reading(2), reading(2), reading(2)] {
        let plan = plan_of(&job, &observed, &view);
        apply(&mut job, &mut observed, &plan, true);
    }
    let plan = plan_of(&job, &observed, &reading(2));
    assert_eq!(plan.writes, vec![], "writes");
    assert_eq!(plan.deletes, vec![], "deletes");
    assert_eq!(plan.status, None, "status");
}

#[test]
fn a_size_set_by_the_scheduler_stays_and_one_out_of_bounds_is_clamped() {
    let mut job = job(spec());
    let mut observed = Observed::default();
    for view in [DispatcherView::NotAsked, reading(1)] {
        let plan = plan_of(&job, &observed, &view);
        apply(&mut job, &mut observed, &plan, true);
    }
    observed.pools[0].spec.replicas = 3;
    let plan = plan_of(&job, &observed, &reading(1));
    let replicas: Vec<i32> = plan
        .desired
        .iter()
        .filter_map(|c| match c {
            Child::Pool(p) => Some(p.spec.replicas),
            Child::Deployment(d) => d.spec.as_ref().and_then(|s| s.replicas),
            _ => None,
        })
        .collect();
    assert_eq!(
        replicas,
        [3, 3],
        "the pool keeps 3 and its Deployment follows"
    );
    assert!(
        plan.writes.iter().all(|c| c.kind() != ChildKind::Pool),
        "a size within bounds is not rewritten"
    );
    observed.pools[0].spec.replicas = 100;
    let plan = plan_of(&job, &observed, &reading(1));
    let pool = plan.writes.iter().find_map(|c| match c {
        Child::Pool(p) => Some(p.spec.replicas),
        _ => None,
    });
    assert_eq!(pool, Some(4), "clamped to maxWorkers");
}

#[test]
fn an_unreachable_dispatcher_keeps_every_pool_and_says_why() {
    let mut job = job(spec());
    let mut observed = Observed::default();
    for view in [DispatcherView::NotAsked, reading(2), reading(2)] {
        let plan = plan_of(&job, &observed, &view);
        apply(&mut job, &mut observed, &plan, true);
    }
    let view = DispatcherView::Unreachable {
        cause: "cannot connect to http://wide-deep-lode-dispatcher.ml.svc:7070".into(),
    };
    let plan = plan_of(&job, &observed, &view);
    assert_eq!(plan.deletes, vec![]);
    assert_eq!(plan.writes, vec![], "the pools stay as they are");
    let status = plan.status.unwrap_or_else(|| panic!("the status changes"));
    assert_eq!(status.phase, Some(Phase::DispatcherUnreachable));
    let c = condition(&status, condition::DISPATCHER_REACHABLE);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "DispatcherUnreachable")
    );
    assert!(c.message.contains("cannot connect"), "{}", c.message);
    assert_eq!(status.stages.len(), 2);
    assert_eq!(
        status.queue,
        job.status.as_ref().and_then(|s| s.queue.clone()),
        "last counters kept"
    );
}

#[test]
fn fewer_stages_delete_the_extra_pools_and_end_of_data_scales_to_zero() {
    let mut job = job(spec());
    let mut observed = Observed::default();
    for view in [DispatcherView::NotAsked, reading(3)] {
        let plan = plan_of(&job, &observed, &view);
        apply(&mut job, &mut observed, &plan, true);
    }
    let plan = plan_of(&job, &observed, &reading(1));
    let gone: Vec<(ChildKind, &str)> = plan
        .deletes
        .iter()
        .map(|d| (d.kind, d.name.as_str()))
        .collect();
    assert_eq!(
        gone,
        [
            (ChildKind::Pool, "wide-deep-lode-stage-1"),
            (ChildKind::Pool, "wide-deep-lode-stage-2"),
            (ChildKind::Deployment, "wide-deep-lode-stage-1"),
            (ChildKind::Deployment, "wide-deep-lode-stage-2"),
        ]
    );
    let DispatcherView::Reading(mut done) = reading(1) else {
        unreachable!()
    };
    done.end_of_data = true;
    let plan = plan_of(&job, &observed, &DispatcherView::Reading(done));
    let sizes: Vec<i32> = plan
        .writes
        .iter()
        .filter_map(|c| match c {
            Child::Pool(p) if p.name_any().ends_with("stage-0") => Some(p.spec.replicas),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, [0]);
    assert_eq!(plan.status.and_then(|s| s.phase), Some(Phase::Finished));
}

#[test]
fn an_invalid_spec_makes_nothing_and_names_the_field() {
    let mut bad = spec();
    bad.workers.memory = "a lot".into();
    let job = job(bad);
    let plan = plan_of(&job, &Observed::default(), &reading(2));
    assert_eq!(
        (plan.desired.len(), plan.writes.len(), plan.deletes.len()),
        (0, 0, 0)
    );
    let status = plan.status.unwrap_or_else(|| panic!("no status"));
    assert_eq!(status.phase, Some(Phase::Invalid));
    let c = condition(&status, condition::VALID);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(
        c.message.starts_with("spec.workers.memory: "),
        "{}",
        c.message
    );
}

#[test]
fn a_condition_keeps_its_transition_time_while_its_status_holds() {
    let mut job = job(spec());
    let mut observed = Observed::default();
    let plan = plan_of(&job, &observed, &reading(1));
    apply(&mut job, &mut observed, &plan, true);
    let first = job.status.clone().unwrap_or_default();
    let later = super::plan(
        &job,
        &observed,
        &reading(1),
        Timestamp::from_second(1_900_000_000).unwrap_or(now()),
        &mut || Token::from_test(TOKEN),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let status = later.status.unwrap_or(first.clone());
    assert_eq!(
        condition(&status, condition::VALID).last_transition_time,
        condition(&first, condition::VALID).last_transition_time
    );
}

#[test]
fn a_failure_is_recorded_once_in_the_reconciled_condition() {
    let mut job = job(spec());
    let status = failed_status(&job, "ApplyFailed", "apply Deployment x: 409", now())
        .unwrap_or_else(|| panic!("a first failure changes the status"));
    let c = condition(&status, condition::RECONCILED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "ApplyFailed")
    );
    assert_eq!(status.phase, Some(Phase::Error));
    job.status = Some(status);
    assert_eq!(
        failed_status(&job, "ApplyFailed", "apply Deployment x: 409", now()),
        None
    );
}

#[test]
fn the_token_is_redacted_from_debug() {
    let mut job = job(spec());
    let mut observed = Observed::default();
    let plan = plan_of(&job, &observed, &reading(1));
    apply(&mut job, &mut observed, &plan, true);
    assert!(observed.secret.is_some());
    // The token as text, and as the bytes a derived Debug of the Secret's data would print.
    let bytes = format!("{:?}", ByteString(TOKEN.as_bytes().to_vec()));
    let bytes = bytes
        .trim_start_matches("ByteString(")
        .trim_end_matches(')');
    for debug in [format!("{plan:?}"), format!("{observed:?}")] {
        assert!(!debug.contains(TOKEN), "{debug}");
        assert!(!debug.contains(bytes), "{debug}");
        assert!(
            debug.contains("wide-deep-lode-token"),
            "the Secret is still named"
        );
    }
    assert!(format!("{:?}", Token::from_test(TOKEN)).contains("redacted"));
}

#[test]
fn subset_compares_only_what_is_wanted() {
    let have = serde_json::json!({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}, "f": "x"});
    assert!(is_subset(
        &serde_json::json!({"b": {"c": [1, {"d": 2}]}}),
        &have
    ));
    assert!(
        !is_subset(&serde_json::json!({"b": {"c": [1]}}), &have),
        "array lengths differ"
    );
    assert!(!is_subset(&serde_json::json!({"a": 2}), &have));
    assert!(!is_subset(&serde_json::json!({"g": null}), &have));
}

fn view_strategy() -> impl Strategy<Value = DispatcherView> {
    prop_oneof![
        Just(DispatcherView::NotAsked),
        Just(DispatcherView::Unreachable {
            cause: "timed out".into()
        }),
        (0u32..4, any::<bool>(), 0u64..1000).prop_map(|(stages, end, consumed)| {
            DispatcherView::Reading(DispatcherReading {
                stages,
                end_of_data: end,
                steps_consumed: consumed,
                steps_computed: consumed + 3,
                ..DispatcherReading::default()
            })
        }),
    ]
}

fn spec_strategy() -> impl Strategy<Value = LodeJobSpec> {
    (
        0i32..4,
        0i32..5,
        proptest::collection::vec((0u32..4, 0i32..3, 0i32..4), 0..3),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(min, extra, stages, tls, external)| {
            let mut s = spec();
            s.min_workers = min;
            s.max_workers = min + extra;
            let mut seen = Vec::new();
            for (stage, lo, more) in stages {
                if !seen.contains(&stage) {
                    seen.push(stage);
                    s.stages.push(StageBounds {
                        stage,
                        min_workers: lo,
                        max_workers: lo + more,
                    });
                }
            }
            s.tls_secret = tls.then(|| "wide-deep-tls".to_owned());
            s.scaler = if external {
                Scaler::External
            } else {
                Scaler::Lode
            };
            s
        })
}

proptest! {
    /// Whatever sequence of dispatcher answers and outside resizes a job goes through: every
    /// object carries the job's owner reference, pool sizes stay within bounds (zero after end
    /// of data), the token appears only in the Secret, and planning again from what a plan made
    /// changes nothing.
    #[test]
    fn plans_are_owned_bounded_secret_and_idempotent(
        spec in spec_strategy(),
        views in proptest::collection::vec(view_strategy(), 1..6),
        resizes in proptest::collection::vec(-2i32..12, 6),
    ) {
        let mut job = job(spec);
        let mut observed = Observed::default();
        for (view, resize) in views.iter().zip(&resizes) {
            if let Some(pool) = observed.pools.first_mut() {
                pool.spec.replicas = *resize;
            }
            let plan = plan_of(&job, &observed, view);
            let finished = matches!(view, DispatcherView::Reading(r) if r.end_of_data);
            for child in &plan.desired {
                if child.kind() != ChildKind::PoolStatus {
                    let owners = child.owner_references();
                    prop_assert_eq!(owners.len(), 1, "{} has one owner", child.name());
                    prop_assert_eq!(owners[0].uid.as_str(), "6f1c-uid");
                    prop_assert_eq!(owners[0].controller, Some(true));
                    prop_assert_eq!(owners[0].kind.as_str(), "LodeJob");
                }
                let text = child.to_json().to_string();
                if child.kind() != ChildKind::Secret {
                    prop_assert!(!text.contains(TOKEN), "the token leaked into {}", child.name());
                }
                if let Child::Pool(p) = child {
                    let (min, max) = job.spec.bounds(p.spec.stage);
                    if finished {
                        prop_assert_eq!(p.spec.replicas, 0);
                    } else {
                        prop_assert!((min..=max).contains(&p.spec.replicas));
                    }
                }
            }
            if let Some(status) = &plan.status {
                prop_assert!(!serde_json::to_string(status).unwrap_or_default().contains(TOKEN));
            }
            apply(&mut job, &mut observed, &plan, true);
            // Once more (the pools' status follows their creation), then a fixed point.
            let again = plan_of(&job, &observed, view);
            apply(&mut job, &mut observed, &again, true);
            let fixed = plan_of(&job, &observed, view);
            prop_assert_eq!(&fixed.writes, &vec![]);
            prop_assert_eq!(&fixed.deletes, &vec![]);
            prop_assert_eq!(&fixed.status, &None);
        }
    }
}
