//! The transfer layer: how one stage's tensors for one step travel to the next stage or to the
//! training worker. A pure library; the gRPC layer around it only moves frames.
//!
//! # Layout
//! - [`codec`]: [`StepMessage`] and its frame ("LODE", version, compression flag, length,
//!   CRC32C, bincode payload, optionally LZ4), [`StepEncoder`] with per-job [`Compression`]
//!   (off, LZ4, or chosen automatically by measuring), frames in parts ([`FrameParts`]: the
//!   tensors' values borrowed, for vectored writes), and [`StepDecoder`], safe on hostile
//!   bytes, which can take a checksum summed as the bytes arrived ([`FrameChecksum`]);
//!   [`codec::stream`] decodes an uncompressed frame straight from a connection, each tensor's
//!   values read into its own memory, with the same checks and errors.
//! - [`receiver`]: DWRecv's reorder and deduplication buffer as a state machine with time
//!   passed in ([`ReceiverState`]), its metrics, and [`SharedReceiver`], the blocking,
//!   thread-safe wrapper whose bounded buffer is the senders' backpressure.
//! - [`pool`]: [`TensorPool`], received tensors' memory given back by the consumer and
//!   reused for the next frames' values (no zeroing, no page faults).
//! - [`error`]: the layer's error type, [`TransferError`].
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
pub mod error;
pub mod pool;
pub mod receiver;

pub use codec::{
    decode_frame, CodecConfig, Compression, Frame, FrameChecksum, FrameCompression, FrameParts,
    OwnedFrame, StepDecoder, StepEncoder, StepMessage,
};
pub use error::TransferError;
pub use pool::{TensorPool, DEFAULT_POOL_BYTES};
pub use receiver::{
    Offer, ReceiverConfig, ReceiverMetrics, ReceiverState, RejectReason, SharedReceiver, Step,
    MAX_RETRY_AFTER, MIN_RETRY_AFTER,
};
