//! Lode on Kubernetes: the `LodeJob` and `LodePool` custom resources, the pure planner that
//! turns a job into the objects it needs, and the controller that applies them.
//!
//! # Layout
//! - [`types`]: the resources (`LodeJob`, `LodePool` with its `scale` subresource), generated
//!   into CRDs by [`crds`], and the validation of a spec (errors name the field).
//! - [`plan`]: `plan(job, observed children, dispatcher view, now) -> Plan` — desired objects,
//!   the writes and deletions that differ from what is observed, and the status. No I/O.
//! - [`controller`]: kube-rs's `Controller` around the planner: lists the job's children, asks
//!   the dispatcher (through [`controller::DispatcherStatus`]), applies the plan with
//!   server-side apply under one field manager, writes the status subresource.
//! - [`render`]: the objects a job would get, as YAML, without a cluster (`lode controller
//!   --render`).
//! - [`scheduler`]: `lode scheduler --backend kubernetes`, the kube calls around
//!   `lode_scheduler::kubernetes`'s pure round (this crate depends on `lode-scheduler`; both are
//!   libraries below the `lode` binary, and the scheduler crate knows nothing of kube).
//! - [`rbac`]: the one list of API calls the controller makes (and the scheduler's), from which
//!   their RBAC rules are derived and against which `deploy/rbac.yaml` is checked.
//!
//! # Invariants
//! - Every object the controller makes carries the LodeJob's controller owner reference, so
//!   deleting the job deletes them all; there are no finalizers.
//! - The job's token exists only in its Secret: made once from fresh randomness, referenced
//!   everywhere else by `secretKeyRef`, never in a spec, an argument, a log or a `Debug`.
//! - Reconciling an unchanged job writes nothing; a pool's size stays within its bounds.
//! - A dispatcher that does not answer deletes nothing; an invalid spec makes nothing.

pub mod controller;
pub mod plan;
pub mod rbac;
pub mod render;
pub mod scheduler;
pub mod types;

pub use controller::{run, ControllerConfig, Error};
pub use types::{LodeJob, LodeJobSpec, LodeJobStatus, LodePool};

/// The CRDs of Lode's resources, in the order they are installed.
pub fn crds(
) -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt as _;
    vec![types::LodeJob::crd(), types::LodePool::crd()]
}

/// The CRDs as one YAML stream (what `deploy/crds.yaml` holds).
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let values: Result<Vec<_>, _> = crds().iter().map(serde_json::to_value).collect();
    render::yaml_stream(values.map_err(<serde_yaml::Error as serde::de::Error>::custom)?)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
        path.trim_start_matches('.')
            .split('.')
            .try_fold(value, |v, key| v.get(key))
    }

    /// A LodeJob and a LodePool with every field set, as JSON.
    fn full_objects() -> (Value, Value) {
        let mut job = crate::plan::tests::job(crate::plan::tests::spec());
        job.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        job.status = Some(crate::types::LodeJobStatus {
            phase: Some(crate::types::Phase::Running),
            dispatcher: Some("http://x".into()),
            stage_count: Some(1),
            queue: Some(crate::types::QueueStatus::default()),
            ..Default::default()
        });
        let mut pool = crate::types::LodePool::new(
            "p",
            crate::types::LodePoolSpec {
                job: "j".into(),
                stage: 0,
                replicas: 1,
                min_replicas: 0,
                max_replicas: 2,
                scaler: crate::types::Scaler::Lode,
            },
        );
        pool.status = Some(crate::types::LodePoolStatus::default());
        (
            serde_json::to_value(&job).unwrap_or_default(),
            serde_json::to_value(&pool).unwrap_or_default(),
        )
    }

    #[test]
    fn every_printer_column_and_scale_path_names_a_field() {
        let (job, pool) = full_objects();
        let crds = super::crds();
        for (crd, object) in crds.iter().zip([&job, &pool]) {
            let version = &crd.spec.versions[0];
            for column in version.additional_printer_columns.iter().flatten() {
                assert!(
                    at(object, &column.json_path).is_some(),
                    "{}: column {} ({}) names no field",
                    crd.spec.names.kind,
                    column.name,
                    column.json_path
                );
            }
            if let Some(scale) = version.subresources.as_ref().and_then(|s| s.scale.as_ref()) {
                assert_eq!(crd.spec.names.kind, "LodePool");
                for path in [&scale.spec_replicas_path, &scale.status_replicas_path]
                    .into_iter()
                    .chain(scale.label_selector_path.as_ref())
                {
                    assert!(
                        at(object, path).is_some(),
                        "scale path {path} names no field"
                    );
                }
            }
        }
        let scaled = crds
            .iter()
            .filter(|c| {
                c.spec.versions[0]
                    .subresources
                    .as_ref()
                    .is_some_and(|s| s.scale.is_some())
            })
            .count();
        assert_eq!(scaled, 1, "the LodePool is scalable");
    }
}
