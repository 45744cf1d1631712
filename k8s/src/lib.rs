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
//! - [`rbac`]: the one list of API calls the controller makes, from which its RBAC rules are
//!   derived and against which `deploy/rbac.yaml` is checked.
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
