//! lode-dataworker: the data-worker service (see ../shared/DESIGN.md). A data worker is a
//! stateless process: register with the job's dispatcher, load its stage, then lease → read
//! the records → execute the stage (lode-runtime, on rayon) → push one fused frame a step to
//! the receiver (lode-transfer's data plane) → report. tokio lives in this layer only.
//!
//! # Layout
//! - [`worker`]: the data-worker loop: register, load the stage, lease → read → execute →
//!   push → complete, heartbeat, drain; a thin async shell around
//! - [`worker_state`]: [`worker_state::WorkerState`], the worker's decisions (what to lease,
//!   run, push and report, in batches) as a synchronous state machine with time passed in.
//! - [`metrics`]: the worker's Prometheus exposition.
//! - [`local`]: a plan's stages run in this process over given steps (`lode exec`), as a
//!   worker runs them, optionally with each step's frame encoded and sent over loopback (the
//!   worker's own floor).
//!
//! # Invariants
//! - A step leaves the worker only as its stage computed it from the leased records; a step
//!   the dispatcher no longer leases to this worker is never pushed.
//! - The worker holds at most its lease limit of steps and never blocks a tokio thread on a
//!   kernel.
//!
//! This crate depends on lode-proto, lode-runtime and lode-transfer, never on another service.

pub mod local;
pub mod metrics;
pub mod worker;
pub mod worker_state;

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
    Exec(#[from] lode_runtime::exec::ExecError),
    /// Running a leased step failed: the error names the node (and op) that failed, this
    /// names the step, so that a bad record can be found.
    #[error("stage {stage}, step {step} (epoch {epoch}): {source}")]
    Step {
        stage: u32,
        step: u64,
        epoch: u64,
        #[source]
        source: lode_runtime::exec::ExecError,
    },
    #[error(transparent)]
    Transfer(#[from] lode_transfer::TransferError),
    #[error(transparent)]
    DataPlane(#[from] lode_transfer::data_plane::DataPlaneError),
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
    use crate::ServiceError;
    use lode_runtime::exec::{ExecError, Failure};
    use lode_runtime::kernels::KernelError;

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
