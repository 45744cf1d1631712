//! lode-transfer: the wire between a job's stages, how one stage's tensors for one step travel
//! to the next stage or to the training side (see ../shared/DESIGN.md). The data worker sends
//! through it and the training side (DWRecv) receives through it; both build on this crate,
//! never on each other. The codec and the receiver's buffer are synchronous; the endpoints
//! around them (tokio + tonic) only move frames.
//!
//! # Layout
//! - [`codec`]: [`StepMessage`] and its frame ("LODE", version, compression flag, length,
//!   CRC32C, bincode payload, optionally LZ4), [`StepEncoder`] with per-job [`Compression`]
//!   (off, LZ4, or chosen automatically by measuring), frames in parts ([`FrameParts`]: the
//!   tensors' values borrowed, for vectored writes), and [`StepDecoder`], safe on hostile
//!   bytes, which can take a checksum summed as the bytes arrived ([`FrameChecksum`]);
//!   [`codec::stream`] decodes an uncompressed frame straight from a connection, each tensor's
//!   values read into its own memory, with the same checks and errors; [`codec::auto`] is
//!   `auto`'s choice on the link at hand (the sender's samples of each burst weighed against
//!   the probe's compression time; a pure `decide` and its state machine, time passed in).
//! - [`receiver`]: DWRecv's reorder and deduplication buffer as a state machine with time
//!   passed in ([`ReceiverState`]), its metrics, and [`SharedReceiver`], the blocking,
//!   thread-safe wrapper whose bounded buffer is the senders' backpressure.
//! - [`pool`]: [`TensorPool`], received tensors' memory given back by the consumer and
//!   reused for the next frames' values (no zeroing, no page faults).
//! - [`error`]: the layer's error type, [`TransferError`].
//! - [`service`]: the `lode.v1.Receiver` endpoint over a [`SharedReceiver`]: data workers push
//!   step frames, later stages fetch their inputs, the consumer pops complete steps in order.
//! - [`data_plane`]: step frames over TCP (inside TLS when the receiver serves TLS) on the
//!   receiver's port (hello with job and token, then length-prefixed frames, one answer each):
//!   the workers' push path, its server half and its client.
//! - [`metrics`]: the receiver's Prometheus exposition.
//!
//! # Invariants
//! - Encode → decode is the identity for every dtype, bit for bit (NaN payloads, -0.0, empty
//!   tensors, empty and non-UTF-8 strings).
//! - Decoding never panics, whatever the bytes, and allocates at most the configured limit for
//!   the payload (for an LZ4 frame also at most [`codec::MAX_LZ4_RATIO`] times the bytes
//!   received) plus the limit for the decoded tensors; every single-bit flip of a frame is
//!   detected.
//! - Whatever an encoder accepts, a decoder with the same limit accepts.
//! - A frame in parts is byte for byte the frame `encode_into` writes.
//! - The receiver delivers steps strictly in order, each exactly once, only when every expected
//!   stage's message is there, and buffers at most `capacity` steps.

pub mod codec;
pub mod data_plane;
pub mod error;
pub mod metrics;
pub mod pool;
pub mod receiver;
pub mod service;

pub use codec::{
    decode_frame, CodecConfig, Compression, Frame, FrameChecksum, FrameCompression, FrameParts,
    OwnedFrame, StepDecoder, StepEncoder, StepMessage,
};
pub use error::TransferError;
pub use pool::{TensorPool, DEFAULT_POOL_BYTES};
pub use receiver::{
    Offer, ReceiverConfig, ReceiverMetrics, ReceiverState, RejectReason, SharedReceiver, Step,
    LONGEST_RETRY_AFTER, MAX_RETRY_AFTER, MIN_RETRY_AFTER,
};

/// Step messages and frames for the receiver's and the data plane's tests.
#[cfg(test)]
pub(crate) mod test_frames {
    use crate::{CodecConfig, StepEncoder, StepMessage};
    use lode_runtime::{Tensor, TensorData};

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
