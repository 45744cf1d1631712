//! Proto ↔ domain conversions of the service, and the mapping of the core's errors to gRPC
//! status codes.

use lode_proto::service::v1;
use tonic::{Code, Status};

use crate::{Error, Lease, StageId, StepId, Time, WorkerId, WorkerInfo, WorkerStatus};

/// The deliberate mapping of the core's errors to gRPC codes. A client decides from the code
/// alone whether to retry, re-register or give up:
/// - `FAILED_PRECONDITION`: the request was valid once but the job has moved on (the lease
///   expired and went elsewhere, the worker is draining or retired, the watermark is ahead of
///   what was leased, the worker speaks another protocol). Retrying it unchanged will fail.
/// - `NOT_FOUND`: the worker id is unknown (never registered, or lost): register again.
/// - `INVALID_ARGUMENT`: the request can never be right in this job (a stage or step outside
///   the plan, a report for another stage than the worker's).
/// - `ALREADY_EXISTS`: a worker id registered twice.
/// - `RESOURCE_EXHAUSTED` / `UNAVAILABLE`: retryable (the worker's lease limit; no step ready).
/// - `OUT_OF_RANGE`: the stage has finished every step.
/// - `INTERNAL`: a bug or a broken config or journal on the dispatcher's side.
impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let code = match &err {
            Error::ProtocolMismatch { .. }
            | Error::WorkerRetired { .. }
            | Error::NotHeld { .. }
            | Error::Draining { .. }
            | Error::WatermarkAhead { .. }
            | Error::EndNotAtWatermark { .. } => Code::FailedPrecondition,
            Error::UnknownWorker { .. } => Code::NotFound,
            Error::UnknownStage { .. }
            | Error::WrongStage { .. }
            | Error::StepOutOfRange { .. } => Code::InvalidArgument,
            Error::WorkerExists { .. } => Code::AlreadyExists,
            Error::LeaseLimit { .. } => Code::ResourceExhausted,
            Error::NoStepReady { .. } => Code::Unavailable,
            Error::StageFinished { .. } => Code::OutOfRange,
            Error::InvalidConfig { .. }
            | Error::Journal { .. }
            | Error::Snapshot { .. }
            | Error::Invariant { .. } => Code::Internal,
        };
        Status::new(code, err.to_string())
    }
}

/// The stage a worker asked for at registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StageChoice {
    /// `-1`: the dispatcher chooses.
    Any,
    Stage(StageId),
}

impl TryFrom<i32> for StageChoice {
    type Error = Status;

    fn try_from(stage: i32) -> Result<Self, Status> {
        match stage {
            -1 => Ok(Self::Any),
            s => u32::try_from(s)
                .map(|s| Self::Stage(StageId(s)))
                .map_err(|_| {
                    Status::invalid_argument(format!(
                        "stage: {s} is neither a stage number nor -1 (let the dispatcher choose)"
                    ))
                }),
        }
    }
}

pub(crate) fn step_ref(step: StepId) -> v1::StepRef {
    v1::StepRef {
        epoch: step.epoch.0,
        step: step.step.0,
    }
}

pub(crate) fn worker_entry(worker: WorkerId, info: &WorkerInfo) -> v1::WorkerEntry {
    let status = match info.status {
        WorkerStatus::Active => v1::WorkerStatus::Active,
        WorkerStatus::Draining => v1::WorkerStatus::Draining,
    };
    v1::WorkerEntry {
        id: worker.0,
        stage: info.stage.0,
        status: status.into(),
        leases: u32::try_from(info.lease_count()).unwrap_or(u32::MAX),
        last_seen_ms: info.last_seen.as_millis(),
        name: String::new(),
        steps_computed: 0,
        compute_us: 0,
    }
}

pub(crate) fn lease_entry(stage: StageId, step: StepId, lease: Lease) -> v1::LeaseEntry {
    v1::LeaseEntry {
        stage: stage.0,
        epoch: step.epoch.0,
        step: step.step.0,
        worker: lease.worker.0,
        deadline_ms: lease.deadline.as_millis(),
    }
}

pub(crate) fn step_lease(
    stage: StageId,
    step: StepId,
    records: Vec<u64>,
    deadline: Time,
    now: Time,
) -> v1::StepLease {
    let mut lease = v1::StepLease {
        stage: stage.0,
        epoch: step.epoch.0,
        step: step.step.0,
        records: Vec::new(),
        deadline_ms: deadline.as_millis(),
        now_ms: now.as_millis(),
        // Set by the caller, which knows the state's generation.
        generation: 0,
        records_from: 0,
        records_count: 0,
        // Set by `StepLeases::from_leases` when the lease joins a run.
        run_steps: 0,
    };
    lease.set_records(records);
    lease
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_choice_accepts_minus_one_and_stage_numbers_only() {
        assert_eq!(StageChoice::try_from(-1).ok(), Some(StageChoice::Any));
        assert_eq!(
            StageChoice::try_from(2).ok(),
            Some(StageChoice::Stage(StageId(2)))
        );
        let err = StageChoice::try_from(-2).expect_err("negative");
        assert_eq!(err.code(), Code::InvalidArgument);
    }

    #[test]
    fn rejections_map_to_non_retryable_codes_and_retryables_to_retryable_ones() {
        let worker = WorkerId(1);
        let stage = StageId(0);
        let step = StepId::new(0, 0);
        let cases = [
            Error::ProtocolMismatch {
                worker,
                expected: 1,
                got: 2,
            },
            Error::WorkerExists { worker },
            Error::WorkerRetired { worker },
            Error::UnknownWorker { worker },
            Error::UnknownStage { stage, stages: 1 },
            Error::WrongStage {
                worker,
                stage,
                registered: StageId(1),
            },
            Error::StepOutOfRange { step },
            Error::NotHeld {
                worker,
                stage,
                step,
            },
            Error::Draining { worker },
            Error::WatermarkAhead { watermark: step },
            Error::LeaseLimit { worker, limit: 1 },
            Error::NoStepReady { stage },
        ];
        let retryable = [Code::Unavailable, Code::ResourceExhausted];
        for err in cases {
            let status = Status::from(err.clone());
            assert_eq!(status.message(), err.to_string());
            assert_eq!(
                err.is_retryable(),
                retryable.contains(&status.code()),
                "{err}: {:?}",
                status.code()
            );
            if err.is_rejection() {
                assert!(
                    matches!(
                        status.code(),
                        Code::FailedPrecondition
                            | Code::NotFound
                            | Code::InvalidArgument
                            | Code::AlreadyExists
                    ),
                    "{err}: {:?}",
                    status.code()
                );
            }
        }
    }
}
