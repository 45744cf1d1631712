//! The crate's one error type. Every variant names what failed, where and why.

use std::path::PathBuf;

/// Errors of the data worker's foundations: tensors, their protos and record readers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A TensorProto's dtype has no dense representation in Lode (complex, quantized,
    /// resource, variant, float8, int4 …) or is not a dtype at all.
    #[error("unsupported dtype {dtype} in a TensorProto")]
    UnsupportedDtype { dtype: String },

    /// A TensorProto's shape has a negative (unknown) dimension.
    #[error("dimension {index} of a TensorProto's shape is {size}; a tensor needs sizes >= 0")]
    InvalidDim { index: usize, size: i64 },

    /// The product of the dimensions does not fit in TensorFlow's int64 element count.
    #[error("shape {dims:?} has more elements than TensorFlow's int64 element count can hold")]
    ElementCountOverflow { dims: Vec<i64> },

    /// The tensor would need more memory than [`crate::tensor::MAX_TENSOR_BYTES`].
    #[error(
        "a {dtype} tensor of shape {shape:?} needs {bytes} bytes, over the limit of {limit} bytes"
    )]
    TooLarge {
        dtype: &'static str,
        shape: Vec<usize>,
        bytes: u128,
        limit: u64,
    },

    /// `tensor_content` does not hold exactly one packed value per element.
    #[error(
        "tensor_content of a {dtype} tensor with {elements} elements has {actual} bytes, \
         expected {expected}"
    )]
    ContentSize {
        dtype: &'static str,
        elements: usize,
        expected: u128,
        actual: usize,
    },

    /// A string tensor's `tensor_content` (varint32 lengths, then the bytes) is malformed.
    #[error("tensor_content of a string tensor with {elements} elements is malformed: {reason}")]
    StringContent {
        elements: usize,
        reason: &'static str,
    },

    /// A bool tensor's `tensor_content` holds a byte other than 0 or 1 (TensorFlow refuses it).
    #[error(
        "tensor_content of a bool tensor holds byte {value} at element {index}; expected 0 or 1"
    )]
    InvalidBool { index: usize, value: u8 },

    /// Values given to [`crate::Tensor::new`] do not match the shape.
    #[error("shape {shape:?} has {expected} elements but {actual} values were given")]
    ShapeMismatch {
        shape: Vec<usize>,
        expected: u128,
        actual: usize,
    },

    /// Bytes that should hold a TensorProto do not parse as one.
    #[error("bytes are not a TensorProto")]
    ProtoDecode {
        #[source]
        source: protobuf::Error,
    },

    /// A tensor could not be written as a TensorProto (over protobuf's 2 GiB limit).
    #[error("cannot encode a {dtype} tensor of shape {shape:?} as a TensorProto")]
    ProtoEncode {
        dtype: &'static str,
        shape: Vec<usize>,
        #[source]
        source: protobuf::Error,
    },

    /// A compression type other than TensorFlow's "", "ZLIB" and "GZIP".
    #[error("unsupported compression type {compression:?}; expected \"\", \"ZLIB\" or \"GZIP\"")]
    UnknownCompression { compression: String },

    /// A record file could not be opened.
    #[error("cannot open {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Reading (or decompressing) a record file failed at a byte offset of the
    /// (uncompressed) stream.
    #[error("cannot read {} at record {record}, byte offset {offset}", path.display())]
    Read {
        path: PathBuf,
        record: u64,
        offset: u64,
        #[source]
        source: std::io::Error,
    },

    /// A TFRecord's length field does not match its masked CRC32C.
    #[error(
        "corrupted record {record} of {} at byte offset {offset}: the length's CRC does not match",
        path.display()
    )]
    BadLengthCrc {
        path: PathBuf,
        record: u64,
        offset: u64,
    },

    /// A TFRecord's data does not match its masked CRC32C.
    #[error(
        "corrupted record {record} of {} at byte offset {offset}: the data's CRC does not match",
        path.display()
    )]
    BadDataCrc {
        path: PathBuf,
        record: u64,
        offset: u64,
    },

    /// The file ends inside a record.
    #[error(
        "truncated record {record} of {} at byte offset {offset}: needed {needed} bytes, \
         found {found}",
        path.display()
    )]
    TruncatedRecord {
        path: PathBuf,
        record: u64,
        offset: u64,
        needed: u64,
        found: u64,
    },

    /// No line starts at an offset given for random access (a stale or foreign index).
    #[error("no line {record} at byte offset {offset} of {}: the file ends there", path.display())]
    NoLineAt {
        path: PathBuf,
        record: u64,
        offset: u64,
    },
}

impl Error {
    /// Whether the error is damage in a record file (what TensorFlow reports as DataLoss and
    /// what its `ignore_errors` skips), as opposed to a file that cannot be opened or a bad
    /// argument.
    pub fn is_corrupt_record(&self) -> bool {
        matches!(
            self,
            Error::BadLengthCrc { .. }
                | Error::BadDataCrc { .. }
                | Error::TruncatedRecord { .. }
                | Error::Read { .. }
        )
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
