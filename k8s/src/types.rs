//! The custom resources: `LodeJob` (what the user writes) and `LodePool` (one per job and stage,
//! made by the controller, scalable through its `scale` subresource), and the validation of a
//! job's spec.
//!
//! Who sets a pool's size: `spec.scaler` of the job, copied onto each pool. With `lode` (the
//! default) Lode's scheduler writes the pools' `spec.replicas`; with `external` an autoscaler
//! (HPA, KEDA, `kubectl scale`) does and Lode's scheduler leaves the pool alone. Either way the
//! controller only sets a new pool to its minimum and clamps a pool's size into
//! `[min, max]`: it never moves a size that is already within bounds, so the two writers do not
//! fight. The field is the contract; whichever writer it names wins.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of Lode's resources.
pub const GROUP: &str = "lode.dev";
/// Their version.
pub const VERSION: &str = "v1alpha1";

/// A training job fed by Lode's data workers: its training pod runs `lode train` (which serves
/// the job's dispatcher in-process), and the controller gives it a token, a Service for the
/// dispatcher and a pool of data workers per stage of the cut.
// kube's `printcolumn(...)` repeats the same keys once per column, by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "lode.dev",
    version = "v1alpha1",
    kind = "LodeJob",
    namespaced,
    status = "LodeJobStatus",
    derive = "PartialEq",
    shortname = "lj",
    doc = "A TensorFlow training job whose input pipeline runs on Lode's data workers",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Stages", type_ = "integer", json_path = ".status.stageCount"),
    printcolumn(
        name = "Consumed",
        type_ = "integer",
        json_path = ".status.queue.consumption",
        description = "steps the training side consumed"
    ),
    printcolumn(
        name = "Dispatcher",
        type_ = "string",
        json_path = ".status.dispatcher",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LodeJobSpec {
    /// Labels of the training pod, the one that runs the program under `lode train`; the
    /// dispatcher's Service selects it.
    pub training_selector: BTreeMap<String, String>,
    /// The port `lode train`'s dispatcher listens on in the training pod.
    #[serde(default = "default_dispatcher_port")]
    pub dispatcher_port: i32,
    /// The job's id at its dispatcher (`lode train` serves job 1).
    #[serde(default = "default_job_id")]
    pub job_id: u64,
    /// The data workers' pods.
    pub workers: WorkerSpec,
    /// Data workers per stage when a stage has no entry of its own in `stages`.
    #[serde(default)]
    pub min_workers: i32,
    #[serde(default = "default_max_workers")]
    pub max_workers: i32,
    /// Per-stage bounds that override `minWorkers` / `maxWorkers`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageBounds>,
    /// Policy hint for Lode's scheduler: a higher priority is served first.
    #[serde(default)]
    pub priority: i32,
    /// Policy hint for Lode's scheduler: the job's share under Fair.
    #[serde(default = "default_weight")]
    pub weight: i32,
    /// Who sets each pool's size within its bounds.
    #[serde(default)]
    pub scaler: Scaler,
    /// A Secret (`kubernetes.io/tls`: `tls.crt`, `tls.key`, `ca.crt`) whose CA the data workers
    /// trust for the dispatcher; the dispatcher is then reached over `https://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret: Option<String>,
}

/// The data workers' pod template, in the few fields Lode needs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSpec {
    /// The image holding the `lode` binary (its entrypoint).
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// CPU per worker, a Kubernetes quantity (`1`, `500m`); requested and the limit.
    pub cpu: String,
    /// Memory per worker, a Kubernetes quantity (`1Gi`); requested and the limit.
    pub memory: String,
    /// Kernel threads per worker (default: the CPUs the worker's cgroup allows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// The input's files, when the graph reads files: a PersistentVolumeClaim mounted
    /// read-only, the workers' `--data-root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataVolume>,
    /// The ServiceAccount the worker pods run as (default: the namespace's `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
}

/// Where the workers read the job's input files.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolume {
    pub claim_name: String,
    /// The mount path, also the workers' `--data-root`.
    pub mount_path: String,
}

/// One stage's bounds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageBounds {
    pub stage: u32,
    pub min_workers: i32,
    pub max_workers: i32,
}

/// The writer of a pool's `spec.replicas` (see the module doc).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Scaler {
    /// Lode's scheduler.
    #[default]
    Lode,
    /// An autoscaler through the pool's `scale` subresource.
    External,
}

/// What the controller last saw of the job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LodeJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The URL the data workers dial for the dispatcher (the Service's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatcher: Option<String>,
    /// Stages of the cut, as the dispatcher reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_count: Option<u32>,
    /// One entry per stage's pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageStatus>,
    /// The dispatcher's queue counters, as last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
}

/// The job's phase.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Waiting for the dispatcher's first answer (the training pod is not up yet).
    Pending,
    /// The dispatcher answers and the job has data left.
    Running,
    /// The dispatcher said end of data: the pools are scaled to zero.
    Finished,
    /// The dispatcher answered before but does not now; nothing is removed meanwhile.
    DispatcherUnreachable,
    /// The spec is invalid (the `Valid` condition names the field); nothing is made.
    Invalid,
    /// The last reconcile failed (the `Reconciled` condition names the cause).
    Error,
}

/// One stage's pool.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    pub stage: u32,
    /// The LodePool's name.
    pub pool: String,
    /// Its `spec.replicas`.
    pub desired: i32,
    /// Its Deployment's ready replicas.
    pub ready: i32,
    /// Workers of this stage registered at the dispatcher.
    pub registered: u32,
}

/// The counters the scheduler reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// Steps computed by the data workers since the dispatcher started.
    pub production: u64,
    /// Steps the training side consumed.
    pub consumption: u64,
    /// The last step consumed (absent before the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<Watermark>,
    pub epoch: u64,
    pub steps_per_epoch: u64,
    pub end_of_data: bool,
}

/// `(epoch, step)` of a step.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub struct Watermark {
    pub epoch: u64,
    pub step: u64,
}

/// A stage's data-worker pool, made by the controller; `kubectl scale`, HPA and KEDA drive it
/// through its `scale` subresource.
// kube's `printcolumn(...)` repeats the same keys once per column, by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "lode.dev",
    version = "v1alpha1",
    kind = "LodePool",
    namespaced,
    status = "LodePoolStatus",
    derive = "PartialEq",
    shortname = "lp",
    doc = "One stage's data-worker pool of a LodeJob",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Job", type_ = "string", json_path = ".spec.job"),
    printcolumn(name = "Stage", type_ = "integer", json_path = ".spec.stage"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Scaler", type_ = "string", json_path = ".spec.scaler")
)]
#[serde(rename_all = "camelCase")]
pub struct LodePoolSpec {
    /// The LodeJob's name.
    pub job: String,
    pub stage: u32,
    /// Data workers wanted; the controller keeps it within `[minReplicas, maxReplicas]`.
    pub replicas: i32,
    pub min_replicas: i32,
    pub max_replicas: i32,
    pub scaler: Scaler,
}

/// The pool's Deployment as last seen.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LodePoolStatus {
    pub replicas: i32,
    pub ready_replicas: i32,
    /// The workers' label selector (the scale subresource's `labelSelectorPath`).
    pub selector: String,
}

/// A problem with a spec, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct SpecError {
    pub field: String,
    pub problem: String,
}

fn default_dispatcher_port() -> i32 {
    7070
}
fn default_job_id() -> u64 {
    1
}
fn default_max_workers() -> i32 {
    8
}
fn default_weight() -> i32 {
    1
}

/// The longest LodeJob name: the longest name made from it (`NAME-lode-dispatcher`, a
/// Service's DNS-1035 label) must fit in 63 characters.
pub const MAX_JOB_NAME: usize = 63 - "-lode-dispatcher".len();

/// The most workers a stage may ask for (a bound against typos like `maxWorkers: 10000`).
pub const MAX_STAGE_WORKERS: i32 = 1024;

impl LodeJobSpec {
    /// The bounds of `stage`: its own entry in `stages`, else the job's defaults.
    pub fn bounds(&self, stage: u32) -> (i32, i32) {
        self.stages
            .iter()
            .find(|b| b.stage == stage)
            .map_or((self.min_workers, self.max_workers), |b| {
                (b.min_workers, b.max_workers)
            })
    }

    /// Every problem with the spec of the job named `name`, each naming its field.
    pub fn validate(&self, name: &str) -> Vec<SpecError> {
        let mut errors = Vec::new();
        let mut bad = |field: &str, problem: String| {
            errors.push(SpecError {
                field: field.to_owned(),
                problem,
            })
        };
        if name.len() > MAX_JOB_NAME {
            bad(
                "metadata.name",
                format!("at most {MAX_JOB_NAME} characters (the names made from it must fit a DNS label)"),
            );
        }
        if !is_dns_label(name) {
            bad(
                "metadata.name",
                "must be a DNS-1035 label (lower-case letters, digits, '-', starting with a letter)".into(),
            );
        }
        if self.training_selector.is_empty() {
            bad(
                "spec.trainingSelector",
                "must name at least one label of the training pod".into(),
            );
        }
        for (key, value) in &self.training_selector {
            if key.is_empty() || key.len() > 253 || value.len() > 63 {
                bad(
                    "spec.trainingSelector",
                    format!("{key:?}={value:?} is not a valid label"),
                );
            }
        }
        if !(1..=65535).contains(&self.dispatcher_port) {
            bad(
                "spec.dispatcherPort",
                format!("{} is not a port (1..=65535)", self.dispatcher_port),
            );
        }
        if self.workers.image.trim().is_empty() {
            bad("spec.workers.image", "must not be empty".into());
        }
        if !is_quantity(&self.workers.cpu) {
            bad(
                "spec.workers.cpu",
                format!(
                    "{:?} is not a Kubernetes quantity (e.g. 1, 500m)",
                    self.workers.cpu
                ),
            );
        }
        if !is_quantity(&self.workers.memory) {
            bad(
                "spec.workers.memory",
                format!(
                    "{:?} is not a Kubernetes quantity (e.g. 1Gi)",
                    self.workers.memory
                ),
            );
        }
        if let Some(policy) = &self.workers.image_pull_policy {
            if !["Always", "IfNotPresent", "Never"].contains(&policy.as_str()) {
                bad(
                    "spec.workers.imagePullPolicy",
                    format!("{policy:?} is not Always, IfNotPresent or Never"),
                );
            }
        }
        if self.workers.threads == Some(0) {
            bad("spec.workers.threads", "must be at least 1".into());
        }
        if let Some(data) = &self.workers.data {
            if !is_dns_subdomain(&data.claim_name) {
                bad(
                    "spec.workers.data.claimName",
                    format!("{:?} is not a claim's name", data.claim_name),
                );
            }
            if !data.mount_path.starts_with('/') {
                bad(
                    "spec.workers.data.mountPath",
                    format!("{:?} is not an absolute path", data.mount_path),
                );
            }
        }
        if let Some(secret) = &self.tls_secret {
            if !is_dns_subdomain(secret) {
                bad(
                    "spec.tlsSecret",
                    format!("{secret:?} is not a Secret's name"),
                );
            }
        }
        let mut check_bounds = |field: &str, min: i32, max: i32| {
            if min < 0 {
                bad(field, format!("minimum {min} is negative"));
            }
            if max < min {
                bad(field, format!("maximum {max} is below the minimum {min}"));
            }
            if max > MAX_STAGE_WORKERS {
                bad(field, format!("maximum {max} exceeds {MAX_STAGE_WORKERS}"));
            }
        };
        check_bounds(
            "spec.minWorkers/maxWorkers",
            self.min_workers,
            self.max_workers,
        );
        for (i, b) in self.stages.iter().enumerate() {
            check_bounds(&format!("spec.stages[{i}]"), b.min_workers, b.max_workers);
        }
        for (i, b) in self.stages.iter().enumerate() {
            if self.stages[..i].iter().any(|o| o.stage == b.stage) {
                bad(
                    &format!("spec.stages[{i}].stage"),
                    format!("stage {} is listed twice", b.stage),
                );
            }
        }
        if self.weight < 1 {
            bad("spec.weight", format!("{} must be at least 1", self.weight));
        }
        errors
    }
}

/// A DNS-1035 label: `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[b.len() - 1] != b'-'
}

/// A DNS-1123 subdomain (the names of most objects).
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// A Kubernetes quantity: a positive decimal number with an optional suffix (`m`, `k`, `M`,
/// `G`, `T`, `P`, `E`, `Ki` … `Ei`); exponent forms (`1e3`) are refused for simplicity.
pub fn is_quantity(s: &str) -> bool {
    const SUFFIXES: [&str; 14] = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let well_formed = !number.is_empty()
        && number.matches('.').count() <= 1
        && number != "."
        && number.bytes().any(|c| c != b'0' && c != b'.');
    well_formed && SUFFIXES.contains(&suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample_spec() -> LodeJobSpec {
        LodeJobSpec {
            training_selector: BTreeMap::from([("app".to_owned(), "train".to_owned())]),
            dispatcher_port: 7070,
            job_id: 1,
            workers: WorkerSpec {
                image: "lode:0.1.0".into(),
                image_pull_policy: None,
                cpu: "1".into(),
                memory: "1Gi".into(),
                threads: None,
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

    #[test]
    fn a_sound_spec_has_no_errors() {
        assert_eq!(sample_spec().validate("wide-deep"), vec![]);
    }

    #[test]
    fn each_problem_names_its_field() {
        let mut spec = sample_spec();
        spec.workers.image = " ".into();
        spec.workers.cpu = "lots".into();
        spec.max_workers = 0;
        spec.dispatcher_port = 0;
        spec.stages = vec![
            StageBounds {
                stage: 1,
                min_workers: 2,
                max_workers: 1,
            },
            StageBounds {
                stage: 1,
                min_workers: 0,
                max_workers: 1,
            },
        ];
        let fields: Vec<String> = spec
            .validate("Bad_Name")
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.dispatcherPort",
                "spec.workers.image",
                "spec.workers.cpu",
                "spec.minWorkers/maxWorkers",
                "spec.stages[0]",
                "spec.stages[1].stage",
            ]
        );
    }

    #[test]
    fn a_long_name_is_refused_before_its_derived_names_overflow() {
        let name = format!("a{}", "b".repeat(MAX_JOB_NAME));
        let errors = sample_spec().validate(&name);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "metadata.name");
        assert!(sample_spec().validate(&name[..MAX_JOB_NAME]).is_empty());
    }

    #[test]
    fn quantities_take_kubernetes_suffixes_only() {
        for good in ["1", "500m", "0.5", "1Gi", "512Mi", "2k"] {
            assert!(is_quantity(good), "{good}");
        }
        for bad in ["", "0", "-1", "1gb", "1..2", ".", "1 Gi", "Gi"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn per_stage_bounds_override_the_defaults() {
        let mut spec = sample_spec();
        spec.stages = vec![StageBounds {
            stage: 1,
            min_workers: 2,
            max_workers: 6,
        }];
        assert_eq!(spec.bounds(0), (1, 4));
        assert_eq!(spec.bounds(1), (2, 6));
    }
}
