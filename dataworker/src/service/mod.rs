//! The data worker's network side (tokio + tonic; kernels stay on rayon):
//!
//! - [`receiver`]: the `lode.v1.Receiver` endpoint over a [`SharedReceiver`]: data workers push
//!   step frames, later stages fetch their inputs, the consumer pops complete steps in order.
//! - [`data_plane`]: step frames over TCP (inside TLS when the receiver serves TLS) on the
//!   receiver's port (hello with job and token, then length-prefixed frames, one answer each):
//!   the workers' push path.
//! - [`emulator`]: the training side emulated (`lode consume`): a consumer that logs each
//!   step, digested, and reports it only once the line is written.
//! - [`hook`]: the session hook's Lode half (`lode train`): a program run with the hook, its
//!   graph answered with a job, and the job directory's graph identity.
//! - [`metrics`]: the receiver's Prometheus exposition.
//! - [`worker`]: the data-worker loop: register, load the stage, lease → read → execute →
//!   push → complete, heartbeat, drain; a thin async shell around
//! - [`worker_state`]: [`worker_state::WorkerState`], the worker's decisions (what to lease,
//!   run, push and report, in batches) as a synchronous state machine with time passed in.
//!
//! [`SharedReceiver`]: crate::transfer::SharedReceiver

pub mod consumer;
pub mod data_plane;
pub mod emulator;
#[cfg(unix)]
pub mod hook;
pub mod metrics;
pub mod receiver;
pub mod worker;
pub mod worker_state;

/// Step messages and frames for the receiver's and the data plane's tests.
#[cfg(test)]
pub(crate) mod test_frames {
    use crate::transfer::{CodecConfig, StepEncoder, StepMessage};
    use crate::{Tensor, TensorData};

    /// A one-tensor step of `job`'s `stage` holding records `2·step` and `2·step + 1`.
    pub(crate) fn message(job: u64, stage: u32, step: u64) -> StepMessage {
        StepMessage {
            job,
            stage,
            step,
            epoch: 0,
            records: vec![step * 2, step * 2 + 1],
            tensors: vec![Tensor::new(vec![2], TensorData::Int64(vec![7, 8])).expect("tensor")],
        }
    }

    pub(crate) fn frame(msg: &StepMessage) -> Vec<u8> {
        StepEncoder::new(CodecConfig::default())
            .encode(msg)
            .expect("encodes")
    }
}

/// Errors of the service layer.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Client(#[from] lode_proto::service::ClientError),
    #[error(transparent)]
    Rpc(#[from] lode_proto::service::RpcError),
    #[error("the dispatcher sent an unusable {what}: {reason}")]
    BadAnswer { what: &'static str, reason: String },
    #[error(transparent)]
    Exec(#[from] crate::exec::ExecError),
    /// Running a leased step failed: the error names the node (and op) that failed, this
    /// names the step, so that a bad record can be found.
    #[error("stage {stage}, step {step} (epoch {epoch}): {source}")]
    Step {
        stage: u32,
        step: u64,
        epoch: u64,
        #[source]
        source: crate::exec::ExecError,
    },
    #[error(transparent)]
    Transfer(#[from] crate::transfer::TransferError),
    #[error(transparent)]
    DataPlane(#[from] data_plane::DataPlaneError),
    #[error("cannot serve on {addr}")]
    Serve {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("a worker thread failed: {0}")]
    Join(String),
    /// The dispatcher said the job's data ended while a step waited for its receiver: the
    /// step is void (the worker loop ends on it, it never leaves the worker).
    #[error("the job's data ended")]
    JobEnded,
    /// The dispatcher no longer knows this worker: it declared it lost after it was silent for
    /// longer than the dispatcher waits (a paused or overloaded process, a partition), and
    /// leased its steps again. The worker may register again under a new id
    /// ([`worker::run_worker_rejoining`] does).
    #[error(
        "the dispatcher no longer knows worker {worker_id} ({rpc}: {reason}): it was declared \
         lost, silent for longer than the dispatcher waits for a heartbeat"
    )]
    Lost {
        worker_id: u64,
        rpc: &'static str,
        reason: String,
    },
}

impl ServiceError {
    pub(crate) fn rpc(rpc: &'static str) -> impl FnOnce(tonic::Status) -> ServiceError {
        move |status| ServiceError::Rpc(lode_proto::service::RpcError { rpc, status })
    }

    /// [`ServiceError::Lost`] for an RPC the dispatcher refused because it does not know
    /// `worker_id` (`NOT_FOUND`: only an unknown worker is answered so); anything else as it
    /// is.
    pub(crate) fn lost_if_unknown(self, worker_id: u64) -> ServiceError {
        match self {
            ServiceError::Rpc(e) if e.status.code() == tonic::Code::NotFound => {
                ServiceError::Lost {
                    worker_id,
                    rpc: e.rpc,
                    reason: e.status.message().to_owned(),
                }
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ServiceError;
    use crate::exec::{ExecError, Failure};
    use crate::kernels::KernelError;

    /// Only the dispatcher's NOT_FOUND (it answers an unknown worker so, nothing else) makes
    /// an RPC's refusal the worker's loss; the message names the worker, the RPC and the
    /// dispatcher's words.
    #[test]
    fn not_found_from_the_dispatcher_is_the_workers_loss_and_nothing_else_is() {
        let refused = |code| {
            ServiceError::rpc("Lease")(tonic::Status::new(code, "worker-3 is not registered"))
        };
        let lost = refused(tonic::Code::NotFound).lost_if_unknown(3);
        assert!(
            matches!(&lost, ServiceError::Lost { worker_id: 3, rpc: "Lease", reason }
                if reason == "worker-3 is not registered"),
            "{lost:?}"
        );
        assert_eq!(
            lost.to_string(),
            "the dispatcher no longer knows worker 3 (Lease: worker-3 is not registered): it \
             was declared lost, silent for longer than the dispatcher waits for a heartbeat"
        );
        for code in [
            tonic::Code::FailedPrecondition,
            tonic::Code::Unavailable,
            tonic::Code::InvalidArgument,
        ] {
            let other = refused(code).lost_if_unknown(3);
            assert!(matches!(other, ServiceError::Rpc(_)), "{code:?}: {other:?}");
        }
        assert!(matches!(
            ServiceError::JobEnded.lost_if_unknown(3),
            ServiceError::JobEnded
        ));
    }

    /// A worker's failed step names the stage, the step and its epoch, then the node and op,
    /// then the kernel's message (TensorFlow's own for an out-of-range index).
    #[test]
    fn a_failed_step_names_stage_step_node_and_tensorflows_message() {
        let source = ExecError::Kernel {
            node: "emb/GatherV2".into(),
            op: "GatherV2".into(),
            source: Box::new(Failure::Kernel(KernelError::InvalidInput {
                op: "GatherV2",
                input: "indices",
                reason: "indices[0] = 19 is not in [0, 19)".into(),
            })),
        };
        let err = ServiceError::Step {
            stage: 0,
            step: 7,
            epoch: 2,
            source,
        };
        assert_eq!(
            err.to_string(),
            "stage 0, step 7 (epoch 2): node emb/GatherV2 (GatherV2): GatherV2: input indices: \
             indices[0] = 19 is not in [0, 19)"
        );
    }
}
