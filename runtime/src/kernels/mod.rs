//! TensorFlow op kernels as pure functions over [`Tensor`]s.
//!
//! Each `pub fn` is one op: it takes the op's input tensors and its attributes as typed
//! arguments and returns the op's outputs in TensorFlow's order, or a [`KernelError`] naming
//! the op, what was wrong and where. Outputs match TensorFlow 2.18.1 exactly; the golden
//! vectors under `fixtures/golden/kernels/` come from `fixtures/gen/golden_kernels.py`.
//!
//! - [`strings`]: hashing, case, strip, join, `ReduceJoin`, substr (bytes or UTF-8 characters),
//!   split, number ↔ string, `RegexReplace` (RE2).
//! - [`lookup`]: `HashTableV2` and the ops that fill and read it.
//! - [`mod@array`]: shape and copy ops (`Reshape`, `ConcatV2`, `Pack`, `Range` …).
//! - [`cast`]: `Cast`, including what TensorFlow's x86-64 kernel does out of range.
//! - [`parsing`]: `DecodeCSV`, `ParseExampleV2`, `ParseSingleExample`, `DeserializeSparse`
//!   (errors name the record or example and the field or key).
//! - [`sparse`]: feature-column ops: `Unique`, `Bucketize`, `SparseFillEmptyRows`,
//!   `SparseReshape`, `SparseToDense`, `SparseReorder`, `SparseSlice`, `DenseBincount`,
//!   `Bincount`, `SparseCountSparseOutput`, `SparseCross(Hashed)`.
//! - [`indexing`]: `GatherNd`, `ScatterNd`, `BroadcastTo`, `Assert`'s check.
//! - [`ragged`]: `RaggedTensorToTensor`, `RaggedTensorToSparse` (ragged rank 1), `StringNGrams`.
//! - [`unicode`]: `UnicodeDecode`, `UnicodeTranscode` (UTF-8 input).
//! - [`math`]: element-wise math with broadcasting, comparisons, logic, `Select`, `Where`,
//!   reductions, segment and sparse-segment reductions, `Cumsum`, `Neg`, `Abs`, `Ceil`,
//!   `Floor`, `Sqrt`, `FloorDiv`. Five float reduction cases differ from TensorFlow in the
//!   last bits (Eigen's summation order is not fully reproduced); the tests list them exactly.
//! - [`slicing`]: `Slice`, `StridedSlice` (every mask), `GatherV2`, `Tile`, `Transpose`,
//!   `OneHot`, `IdentityN`, with TensorFlow's CPU-kernel quirks (rank > 8, uint16 `Tile`).

pub mod array;
pub mod cast;
pub mod indexing;
pub mod lookup;
pub mod parsing;
pub mod ragged;
pub mod slicing;
pub mod strings;
pub mod unicode;

mod number;
mod printf;
mod re2;

#[cfg(test)]
mod tests;

use crate::tensor::{DType, Tensor};

/// Errors of the kernels. Every variant names the op.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// An input has a dtype the op does not take.
    #[error("{op}: input {input} has dtype {actual}, expected {expected}")]
    InputDtype {
        op: &'static str,
        input: &'static str,
        expected: &'static str,
        actual: DType,
    },

    /// An input has a shape the op does not take.
    #[error("{op}: input {input} has shape {shape:?}; {reason}")]
    InputShape {
        op: &'static str,
        input: &'static str,
        shape: Vec<usize>,
        reason: &'static str,
    },

    /// Two inputs whose shapes must agree (or broadcast) do not.
    #[error("{op}: shapes of {left} {left_shape:?} and {right} {right_shape:?} are incompatible")]
    IncompatibleShapes {
        op: &'static str,
        left: &'static str,
        left_shape: Vec<usize>,
        right: &'static str,
        right_shape: Vec<usize>,
    },

    /// An attribute value TensorFlow refuses (or Lode does not support).
    #[error("{op}: attribute {attr} = {value}: {reason}")]
    InvalidAttr {
        op: &'static str,
        attr: &'static str,
        value: String,
        reason: &'static str,
    },

    /// An input's values are refused (an index out of range, a bad pattern …).
    #[error("{op}: input {input}: {reason}")]
    InvalidInput {
        op: &'static str,
        input: &'static str,
        reason: String,
    },

    /// An element of a string tensor is not a number of the requested type.
    #[error("{op}: element {index} ({value:?}) is not a valid {dtype}")]
    NotANumber {
        op: &'static str,
        index: usize,
        value: String,
        dtype: DType,
    },

    /// `Substr`: a position outside `[-len, len]` of its string.
    #[error("{op}: pos {pos} out of range for string {string:?} at index {index}")]
    PosOutOfRange {
        op: &'static str,
        pos: i64,
        string: String,
        index: usize,
    },

    /// A lookup-table error (see [`lookup::TableError`]).
    #[error("{op}: {source}")]
    Table {
        op: &'static str,
        #[source]
        source: lookup::TableError,
    },

    /// Building an output tensor failed (too large).
    #[error("{op}: cannot build the output")]
    Output {
        op: &'static str,
        #[source]
        source: crate::Error,
    },
}

/// The kernels' result type.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// A string for error messages: the bytes, lossily decoded and cut to 64 characters.
pub(crate) fn show(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.chars().count() > 64 {
        let mut cut: String = s.chars().take(64).collect();
        cut.push('…');
        cut
    } else {
        s.into_owned()
    }
}

/// `Tensor::new` for a kernel's output.
pub(crate) fn output(
    op: &'static str,
    shape: Vec<usize>,
    data: crate::TensorData,
) -> Result<Tensor> {
    Tensor::new(shape, data).map_err(|source| KernelError::Output { op, source })
}

/// The values of a string input, or an error naming the input.
pub(crate) fn strings_of<'a>(
    op: &'static str,
    input: &'static str,
    t: &'a Tensor,
) -> Result<&'a [Vec<u8>]> {
    match t.data() {
        crate::TensorData::String(v) => Ok(v),
        _ => Err(KernelError::InputDtype {
            op,
            input,
            expected: "string",
            actual: t.dtype(),
        }),
    }
}

/// The values of an int32 or int64 input, widened to i64, or an error naming the input.
pub(crate) fn int_values(op: &'static str, input: &'static str, t: &Tensor) -> Result<Vec<i64>> {
    match t.data() {
        crate::TensorData::Int32(v) => Ok(v.iter().map(|&x| i64::from(x)).collect()),
        crate::TensorData::Int64(v) => Ok(v.clone()),
        _ => Err(KernelError::InputDtype {
            op,
            input,
            expected: "int32 or int64",
            actual: t.dtype(),
        }),
    }
}

/// NumPy-style broadcasting of two shapes (what TensorFlow's `BCast` computes).
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, slot) in out.iter_mut().enumerate() {
        let da = (i + a.len()).checked_sub(rank).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
        *slot = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// For each element of `out_shape` (row-major), the flat index of the element of an input of
/// `in_shape` that broadcasts to it. `in_shape` must broadcast to `out_shape`.
pub(crate) fn broadcast_index(in_shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let n: usize = out_shape.iter().product();
    let rank = out_shape.len();
    let offset = rank - in_shape.len();
    // Strides of the input, 0 along broadcast dimensions.
    let mut strides = vec![0usize; rank];
    let mut acc = 1usize;
    for j in (0..in_shape.len()).rev() {
        strides[offset + j] = if in_shape[j] == 1 { 0 } else { acc };
        acc *= in_shape[j];
    }
    let mut idx = Vec::with_capacity(n);
    let mut counter = vec![0usize; rank];
    for _ in 0..n {
        idx.push(counter.iter().zip(&strides).map(|(c, s)| c * s).sum());
        for d in (0..rank).rev() {
            counter[d] += 1;
            if counter[d] < out_shape[d] {
                break;
            }
            counter[d] = 0;
        }
    }
    idx
}

pub mod math;
pub mod sparse;
