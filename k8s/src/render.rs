//! `lode controller --render`: the objects the controller would make for a LodeJob read from a
//! file, given a dispatcher's status (or none), as a YAML stream — a dry run without a cluster.
//!
//! A job read from a file has no uid; its owner references then carry [`RENDER_UID`], and its
//! namespace defaults to `default`. The rendered Secret holds a fresh token, as the real one
//! would.

use kube::ResourceExt as _;

use crate::plan::{self, Child, DispatcherReading, DispatcherView, Observed, Token};
use crate::types::LodeJob;

/// The uid given to a job rendered from a file (it has none until the API server stores it).
pub const RENDER_UID: &str = "00000000-0000-0000-0000-000000000000";

/// Why a job cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("not a LodeJob (lode.dev/v1alpha1)")]
    Job {
        #[source]
        source: serde_yaml::Error,
    },
    #[error("the dispatcher status is not valid JSON of its fields (stages, epoch, watermark, endOfData, stepsConsumed, stepsPerEpoch, stepsComputed, workersPerStage)")]
    Status {
        #[source]
        source: serde_json::Error,
    },
    #[error("apiVersion/kind {found:?} is not lode.dev/v1alpha1 LodeJob")]
    WrongKind { found: String },
    #[error("invalid LodeJob spec: {errors}")]
    Invalid { errors: String },
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("cannot write YAML")]
    Yaml {
        #[source]
        source: serde_yaml::Error,
    },
}

/// Reads a LodeJob from YAML text (one document).
pub fn parse_job(text: &str) -> Result<LodeJob, RenderError> {
    let value: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|source| RenderError::Job { source })?;
    let api_version = value
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or("");
    if api_version != "lode.dev/v1alpha1" || kind != "LodeJob" {
        return Err(RenderError::WrongKind {
            found: format!("{api_version}/{kind}"),
        });
    }
    serde_yaml::from_value(value).map_err(|source| RenderError::Job { source })
}

/// Reads a dispatcher status (the JSON of [`DispatcherReading`]).
pub fn parse_status(text: &str) -> Result<DispatcherReading, RenderError> {
    serde_json::from_str(text).map_err(|source| RenderError::Status { source })
}

/// The objects the controller would make for `job`, as a YAML stream.
pub fn render(job: LodeJob, status: Option<DispatcherReading>) -> Result<String, RenderError> {
    yaml_stream(render_objects(job, status)?).map_err(|source| RenderError::Yaml { source })
}

/// The objects the controller would make for `job`, as JSON values (`--format json`).
pub fn render_objects(
    mut job: LodeJob,
    status: Option<DispatcherReading>,
) -> Result<Vec<serde_json::Value>, RenderError> {
    let errors = job.spec.validate(&job.name_any());
    if !errors.is_empty() {
        let errors = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        return Err(RenderError::Invalid { errors });
    }
    job.metadata
        .uid
        .get_or_insert_with(|| RENDER_UID.to_owned());
    job.metadata
        .namespace
        .get_or_insert_with(|| "default".to_owned());
    let view = status.map_or(DispatcherView::NotAsked, DispatcherView::Reading);
    let plan = plan::plan(
        &job,
        &Observed::default(),
        &view,
        k8s_openapi::jiff::Timestamp::now(),
        &mut Token::generate,
    )?;
    Ok(plan
        .desired
        .iter()
        .filter(|c| !matches!(c, Child::PoolStatus { .. }))
        .map(Child::to_json)
        .collect())
}

/// One YAML document as JSON (for callers that do not depend on a YAML parser).
pub fn yaml_to_json(text: &str) -> Result<serde_json::Value, serde_yaml::Error> {
    serde_yaml::from_str(text)
}

/// Values as a YAML stream of documents, each opened by `---`.
pub fn yaml_stream(
    values: impl IntoIterator<Item = serde_json::Value>,
) -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for value in values {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&value)?);
    }
    Ok(out)
}
