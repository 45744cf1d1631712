//! The transfer layer's error type. Decoding errors describe what is wrong with a frame that
//! came from outside; each kind of damage has its own variant so that the service layer can
//! count and report them apart.

/// Errors of the step message codec and of building a receiver.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The frame does not start with [`super::codec::MAGIC`].
    #[error("not a Lode step frame: the first bytes are {found:02x?}, expected \"LODE\"")]
    BadMagic { found: Vec<u8> },

    /// The frame's format version is not one this build reads.
    #[error("step frame format version {version} is not supported (this build reads {supported})")]
    UnsupportedVersion { version: u8, supported: u8 },

    /// The compression flag byte is neither 0 (none), 1 (LZ4 block) nor 2 (none, unsummed).
    #[error("unknown compression flag {flag} in a step frame (expected 0, 1 or 2)")]
    UnknownCompression { flag: u8 },

    /// An unsummed frame (flag 2) where only summed ones are taken: from a peer that is not
    /// on the receiver's machine, or outside the data plane.
    #[error("an unsummed step frame (flag 2) from {from}: only a sender on this machine, over loopback, may leave out the frame checksum")]
    Unsummed { from: String },

    /// An unsummed frame (flag 2) whose checksum field is not zero: a sender that leaves the
    /// checksum out writes zero there, so anything else is a damaged header.
    #[error(
        "an unsummed step frame (flag 2) carries checksum field {checksum:#018x}: it must be zero"
    )]
    UnsummedChecksum { checksum: u64 },

    /// The frame ends before its header, or before the payload its header declares.
    #[error("truncated step frame: needed {needed} bytes, found {actual}")]
    Truncated { needed: u64, actual: u64 },

    /// Bytes follow the end of what was declared or decoded.
    #[error("{extra} unexpected bytes after {after}")]
    TrailingBytes { extra: u64, after: &'static str },

    /// The header declares an uncompressed payload larger than the decoder's limit; nothing
    /// was allocated for it.
    #[error("step frame declares {declared} payload bytes, over the limit of {limit}")]
    DeclaredTooLarge { declared: u64, limit: u64 },

    /// An LZ4 payload declares more bytes than LZ4 can expand its compressed size into: no
    /// valid frame does this, and refusing it keeps a small frame from reserving a large
    /// buffer.
    #[error(
        "LZ4 step frame declares {declared} bytes from {compressed} compressed bytes, \
         more than the format's maximum ratio of {max_ratio}"
    )]
    ImplausibleRatio {
        declared: u64,
        compressed: u64,
        max_ratio: u64,
    },

    /// The frame's checksum does not match its bytes (damage in transit or storage).
    #[error(
        "step frame checksum mismatch: header says {expected:#018x}, bytes give {actual:#018x}"
    )]
    ChecksumMismatch { expected: u64, actual: u64 },

    /// The LZ4 payload is malformed.
    #[error("the LZ4 payload of a step frame ({compressed} bytes) does not decompress")]
    Decompress {
        compressed: u64,
        #[source]
        source: lz4_flex::block::DecompressError,
    },

    /// The LZ4 payload decompresses to a different length than the header declares.
    #[error("the LZ4 payload decompresses to {actual} bytes, the header declares {declared}")]
    DecompressedLength { declared: u64, actual: u64 },

    /// The payload is not a bincode-encoded step message (ends early, bad integer encoding …).
    #[error("the payload of a step frame does not decode")]
    Decode {
        #[source]
        source: bincode::error::DecodeError,
    },

    /// A tensor's dtype tag is not one of [`super::codec::dtype_tag`]'s.
    #[error("tensor {tensor} of a step message has unknown dtype tag {tag}")]
    UnknownDtype { tensor: usize, tag: u8 },

    /// A tensor's value count does not equal the product of its shape.
    #[error(
        "tensor {tensor} of a step message has shape {shape:?} ({expected} elements) \
         but {actual} values"
    )]
    ValueCountMismatch {
        tensor: usize,
        shape: Vec<u64>,
        expected: u128,
        actual: u64,
    },

    /// A dimension does not fit this machine's `usize`.
    #[error("tensor {tensor} of a step message has dimension {dim}, too large for this machine")]
    DimOutOfRange { tensor: usize, dim: u64 },

    /// A bool tensor holds a byte other than 0 or 1.
    #[error("bool tensor {tensor} of a step message holds byte {value} at element {index}")]
    InvalidBool {
        tensor: usize,
        index: usize,
        value: u8,
    },

    /// The decoded tensors would take more memory than the limit (strings count
    /// [`super::codec::STRING_OVERHEAD_BYTES`] each on top of their contents).
    #[error(
        "the decoded step message needs over {bytes} bytes of memory, over the limit of {limit}"
    )]
    DecodedTooLarge { bytes: u64, limit: u64 },

    /// A message to encode is larger than the limit (its payload or its decoded size); the
    /// receiver would refuse it.
    #[error("the step message needs {bytes} bytes, over the limit of {limit}")]
    MessageTooLarge { bytes: u64, limit: u64 },

    /// LZ4 compression failed (cannot happen with the buffer sizes the encoder uses; kept as
    /// an error rather than a panic).
    #[error("LZ4 compression of a step payload failed")]
    Compress {
        #[source]
        source: lz4_flex::block::CompressError,
    },

    /// A receiver was configured without any stage to wait for.
    #[error("a step receiver needs at least one stage")]
    NoStages,

    /// A receiver was configured with room for no steps.
    #[error("a step receiver needs a capacity of at least one step")]
    ZeroCapacity,

    /// A receiver's rate window is shorter than one nanosecond per bucket.
    #[error("a step receiver's rate window of {window:?} is too short")]
    RateWindowTooShort { window: std::time::Duration },
}

impl TransferError {
    /// Whether the error is about a received frame (damaged, hostile or from an incompatible
    /// build) rather than about something this side was asked to do. The service layer
    /// answers these with "invalid argument" and counts them; the sender should not retry the
    /// same bytes.
    pub fn is_bad_frame(&self) -> bool {
        !matches!(
            self,
            TransferError::MessageTooLarge { .. }
                | TransferError::Compress { .. }
                | TransferError::NoStages
                | TransferError::ZeroCapacity
                | TransferError::RateWindowTooShort { .. }
        )
    }
}
