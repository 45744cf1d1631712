//! The data worker's network side (tokio + tonic; kernels stay on rayon):
//!
//! - [`receiver`]: the `lode.v1.Receiver` endpoint over a [`SharedReceiver`]: data workers push
//!   step frames, later stages fetch their inputs, the consumer pops complete steps in order.
//! - [`data_plane`]: step frames over TCP (inside TLS when the receiver serves TLS) on the
//!   receiver's port (hello with job and token, then length-prefixed frames, one answer each):
//!   the workers' push path.
//! - [`worker`]: the data-worker loop: register, load the stage, lease → read → execute →
//!   push → complete, heartbeat, drain; a thin async shell around
//! - [`worker_state`]: [`worker_state::WorkerState`], the worker's decisions (what to lease,
//!   run, push and report, in batches) as a synchronous state machine with time passed in.
//!
//! [`SharedReceiver`]: crate::transfer::SharedReceiver

pub mod consumer;
pub mod data_plane;
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
}

impl ServiceError {
    pub(crate) fn rpc(rpc: &'static str) -> impl FnOnce(tonic::Status) -> ServiceError {
        move |status| ServiceError::Rpc(lode_proto::service::RpcError { rpc, status })
    }
}
