//! Sparse and feature-column kernels: `Unique`, `UniqueWithCounts`, `Bucketize`,
//! `SparseFillEmptyRows`, `SparseReshape`, `SparseToDense`, `DenseBincount`.
//!
//! A sparse tensor is TensorFlow's triple: `indices` (int64 `[nnz, rank]`), `values`
//! (`[nnz]`) and `dense_shape` (int64 `[rank]`). What TensorFlow 2.18.1 checks is checked
//! here; what it leaves unchecked (e.g. `SparseReshape` does not bound its indices) is left
//! unchecked, so the outputs agree for every input TensorFlow accepts.
//!
//! Input values TensorFlow refuses (an index out of range, unsorted boundaries, a negative
//! count) are reported as [`KernelError::InvalidAttr`] naming the input and the element.

use rustc_hash::FxHashMap;
use std::hash::Hash;

use super::{int_values, output, KernelError, Result};
use crate::tensor::{checked_num_elements, DType, Tensor, TensorData};

mod cross;
pub use cross::{sparse_cross, sparse_cross_hashed, SparseCrossAttrs};

/// Builds the same `TensorData` variant from two of the same dtype, or `None` if they
/// differ: `$body` sees both vectors as `$a` and `$b`.
macro_rules! zip_variant {
    ($x:expr, $y:expr, ($a:ident, $b:ident) => $body:expr) => {
        match ($x, $y) {
            (TensorData::Bool($a), TensorData::Bool($b)) => Some(TensorData::Bool($body)),
            (TensorData::Int8($a), TensorData::Int8($b)) => Some(TensorData::Int8($body)),
            (TensorData::Int16($a), TensorData::Int16($b)) => Some(TensorData::Int16($body)),
            (TensorData::Int32($a), TensorData::Int32($b)) => Some(TensorData::Int32($body)),
            (TensorData::Int64($a), TensorData::Int64($b)) => Some(TensorData::Int64($body)),
            (TensorData::UInt8($a), TensorData::UInt8($b)) => Some(TensorData::UInt8($body)),
            (TensorData::UInt16($a), TensorData::UInt16($b)) => Some(TensorData::UInt16($body)),
            (TensorData::UInt32($a), TensorData::UInt32($b)) => Some(TensorData::UInt32($body)),
            (TensorData::UInt64($a), TensorData::UInt64($b)) => Some(TensorData::UInt64($body)),
            (TensorData::Float16($a), TensorData::Float16($b)) => Some(TensorData::Float16($body)),
            (TensorData::BFloat16($a), TensorData::BFloat16($b)) => {
                Some(TensorData::BFloat16($body))
            }
            (TensorData::Float32($a), TensorData::Float32($b)) => Some(TensorData::Float32($body)),
            (TensorData::Float64($a), TensorData::Float64($b)) => Some(TensorData::Float64($body)),
            (TensorData::String($a), TensorData::String($b)) => Some(TensorData::String($body)),
            _ => None,
        }
    };
}

/// Element `i` of `a ++ b` for each `i` of `idx` (every `i < a.len() + b.len()`), or `None`
/// if `a` and `b` have different dtypes.
pub(crate) fn take_concat(a: &TensorData, b: &TensorData, idx: &[usize]) -> Option<TensorData> {
    fn pick<T: Clone>(a: &[T], b: &[T], idx: &[usize]) -> Vec<T> {
        idx.iter()
            .map(|&i| match a.get(i) {
                Some(x) => x.clone(),
                None => b[i - a.len()].clone(),
            })
            .collect()
    }
    zip_variant!(a, b, (x, y) => pick(x, y, idx))
}

/// Element `i` of `a` for each `i` of `idx`.
pub(crate) fn take(a: &TensorData, idx: &[usize]) -> TensorData {
    take_concat(a, a, idx).unwrap_or_else(|| TensorData::zeros(a.dtype(), 0))
}

/// An input value TensorFlow refuses.
fn bad_value(
    op: &'static str,
    input: &'static str,
    value: String,
    reason: &'static str,
) -> KernelError {
    KernelError::InvalidAttr {
        op,
        attr: input,
        value,
        reason,
    }
}

fn shape_error(
    op: &'static str,
    input: &'static str,
    t: &Tensor,
    reason: &'static str,
) -> KernelError {
    KernelError::InputShape {
        op,
        input,
        shape: t.shape().to_vec(),
        reason,
    }
}

fn int64s<'a>(op: &'static str, input: &'static str, t: &'a Tensor) -> Result<&'a [i64]> {
    match t.data() {
        TensorData::Int64(v) => Ok(v),
        _ => Err(KernelError::InputDtype {
            op,
            input,
            expected: "int64",
            actual: t.dtype(),
        }),
    }
}

/// A tensor of `dtype` (int32 or int64) holding `values`.
fn index_tensor(
    op: &'static str,
    attr: &'static str,
    dtype: DType,
    shape: Vec<usize>,
    values: Vec<i64>,
) -> Result<Tensor> {
    let data = match dtype {
        DType::Int64 => TensorData::Int64(values),
        DType::Int32 => TensorData::Int32(
            values
                .into_iter()
                .map(i32::try_from)
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| KernelError::InvalidAttr {
                    op,
                    attr,
                    value: dtype.name().into(),
                    reason: "a value does not fit in int32",
                })?,
        ),
        other => {
            return Err(KernelError::InvalidAttr {
                op,
                attr,
                value: other.name().into(),
                reason: "must be int32 or int64",
            })
        }
    };
    output(op, shape, data)
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A dimension from an int64 shape value, refusing negatives.
fn dims_of(op: &'static str, input: &'static str, sizes: &[i64]) -> Result<Vec<usize>> {
    sizes
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                bad_value(
                    op,
                    input,
                    format!("{sizes:?}"),
                    "dimensions must be non-negative",
                )
            })
        })
        .collect()
}

// ------------------------------------------------------------------------------- Unique

/// The groups of equal elements in order of first occurrence: the position of each group's
/// first element, each element's group, and each group's size. A `None` key (NaN) equals
/// nothing, not even itself.
///
/// The map only finds a key's group (the order is the keys'), so its hasher is FxHash: with
/// std's SipHash the hashing was about a sixth of deepfm's full cut (`Unique` over a batch's ids).
fn groups<K: Hash + Eq>(keys: impl Iterator<Item = Option<K>>) -> (Vec<usize>, Vec<i64>, Vec<i64>) {
    let mut seen: FxHashMap<K, usize> = FxHashMap::default();
    seen.reserve(keys.size_hint().0);
    let (mut first, mut idx, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    for (i, key) in keys.enumerate() {
        let next = first.len();
        let g = match key {
            Some(k) => *seen.entry(k).or_insert(next),
            None => next,
        };
        if g == next {
            first.push(i);
            counts.push(0);
        }
        counts[g] += 1;
        idx.push(to_i64(g));
    }
    (first, idx, counts)
}

/// Float bits as a key: ±0 are one key and a NaN is no key (TensorFlow's hash map compares
/// with `==`).
fn float_key(bits: u64, is_zero: bool, is_nan: bool) -> Option<u64> {
    match (is_zero, is_nan) {
        (true, _) => Some(0),
        (_, true) => None,
        _ => Some(bits),
    }
}

fn half_key(bits: u16, exp_bits: u32) -> Option<u64> {
    let magnitude = bits & 0x7fff;
    let exp_mask = 0x7fffu16 & !((1u16 << (15 - exp_bits)) - 1);
    let is_nan = magnitude & exp_mask == exp_mask && magnitude & !exp_mask != 0;
    float_key(u64::from(bits), magnitude == 0, is_nan)
}

fn unique_groups(op: &'static str, x: &Tensor) -> Result<(Vec<usize>, Vec<i64>, Vec<i64>)> {
    if x.shape().len() != 1 {
        return Err(shape_error(op, "x", x, "unique expects a 1D vector"));
    }
    fn ints<T: Copy + Into<i128>>(v: &[T]) -> (Vec<usize>, Vec<i64>, Vec<i64>) {
        groups(v.iter().map(|&x| Some(x.into())))
    }
    Ok(match x.data() {
        TensorData::Bool(v) => groups(v.iter().map(|&x| Some(x))),
        TensorData::Int8(v) => ints(v),
        TensorData::Int16(v) => ints(v),
        TensorData::Int32(v) => ints(v),
        TensorData::Int64(v) => ints(v),
        TensorData::UInt8(v) => ints(v),
        TensorData::UInt16(v) => ints(v),
        TensorData::UInt32(v) => ints(v),
        TensorData::UInt64(v) => ints(v),
        TensorData::Float16(v) => groups(v.iter().map(|&x| half_key(x, 5))),
        TensorData::BFloat16(v) => groups(v.iter().map(|&x| half_key(x, 8))),
        TensorData::Float32(v) => groups(
            v.iter()
                .map(|&x| float_key(u64::from(x.to_bits()), x == 0.0, x.is_nan())),
        ),
        TensorData::Float64(v) => groups(
            v.iter()
                .map(|&x| float_key(x.to_bits(), x == 0.0, x.is_nan())),
        ),
        TensorData::String(v) => groups(v.iter().map(|x| Some(x.as_slice()))),
    })
}

/// `Unique`: the distinct elements of a vector in order of first occurrence (`y`), and for
/// each element its position in `y` (`idx`, of dtype `out_idx`). Floats compare with `==`:
/// 0.0 and -0.0 are one element, every NaN is its own.
pub fn unique(x: &Tensor, out_idx: DType) -> Result<Vec<Tensor>> {
    const OP: &str = "Unique";
    let (first, idx, _) = unique_groups(OP, x)?;
    let n = first.len();
    Ok(vec![
        output(OP, vec![n], take(x.data(), &first))?,
        index_tensor(OP, "out_idx", out_idx, x.shape().to_vec(), idx)?,
    ])
}

/// `UniqueWithCounts`: `Unique`'s `y` and `idx`, and how often each element of `y` occurs.
pub fn unique_with_counts(x: &Tensor, out_idx: DType) -> Result<Vec<Tensor>> {
    const OP: &str = "UniqueWithCounts";
    let (first, idx, counts) = unique_groups(OP, x)?;
    let n = first.len();
    Ok(vec![
        output(OP, vec![n], take(x.data(), &first))?,
        index_tensor(OP, "out_idx", out_idx, x.shape().to_vec(), idx)?,
        index_tensor(OP, "out_idx", out_idx, vec![n], counts)?,
    ])
}

// ---------------------------------------------------------------------------- Bucketize

/// `Bucketize`: for each element, the number of boundaries `<=` it (`std::upper_bound` over
/// the float boundaries), as int32. Integers are compared after conversion to float, as
/// C++'s `value < boundary` converts them (int64 16777217 is 16777216.0); doubles compare
/// with the boundaries widened. A NaN is past every boundary.
// `!(v < b)` is `std::upper_bound`'s test, NaN included: not the same as `v >= b`.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn bucketize(input: &Tensor, boundaries: &[f32]) -> Result<Vec<Tensor>> {
    const OP: &str = "Bucketize";
    if boundaries.windows(2).any(|w| w[1] < w[0]) {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "boundaries",
            value: format!("{boundaries:?}"),
            reason: "Expected sorted boundaries",
        });
    }
    let upper = |v: f32| boundaries.partition_point(|&b| !(v < b));
    // The conversions below are C++'s usual arithmetic conversions (round to nearest).
    #[allow(clippy::cast_precision_loss)]
    let buckets: Vec<usize> = match input.data() {
        TensorData::Int32(v) => v.iter().map(|&x| upper(x as f32)).collect(),
        TensorData::Int64(v) => v.iter().map(|&x| upper(x as f32)).collect(),
        TensorData::Float32(v) => v.iter().map(|&x| upper(x)).collect(),
        TensorData::Float64(v) => v
            .iter()
            .map(|&x| boundaries.partition_point(|&b| !(x < f64::from(b))))
            .collect(),
        _ => {
            return Err(KernelError::InputDtype {
                op: OP,
                input: "input",
                expected: "int32, int64, float or double",
                actual: input.dtype(),
            })
        }
    };
    let data = buckets
        .into_iter()
        .map(|b| i32::try_from(b).unwrap_or(i32::MAX))
        .collect();
    Ok(vec![output(
        OP,
        input.shape().to_vec(),
        TensorData::Int32(data),
    )?])
}

// ------------------------------------------------------------------ SparseFillEmptyRows

/// `SparseFillEmptyRows`: adds `(row, 0, …, 0) = default_value` for every row of the
/// sparse tensor without entries. Outputs `output_indices`, `output_values`,
/// `empty_row_indicator` and `reverse_index_map` (each input entry's position in the
/// output). Entries are grouped by row, keeping their order within a row (they are not
/// sorted); if no row is empty and the rows are already in order, the input is returned.
pub fn sparse_fill_empty_rows(
    indices: &Tensor,
    values: &Tensor,
    dense_shape: &Tensor,
    default_value: &Tensor,
) -> Result<Vec<Tensor>> {
    const OP: &str = "SparseFillEmptyRows";
    if dense_shape.shape().len() != 1 {
        return Err(shape_error(
            OP,
            "dense_shape",
            dense_shape,
            "must be a vector",
        ));
    }
    if indices.shape().len() != 2 {
        return Err(shape_error(OP, "indices", indices, "must be a matrix"));
    }
    if values.shape().len() != 1 {
        return Err(shape_error(OP, "values", values, "must be a vector"));
    }
    if indices.shape()[0] != values.shape()[0] {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "indices",
            left_shape: indices.shape().to_vec(),
            right: "values",
            right_shape: values.shape().to_vec(),
        });
    }
    if !default_value.shape().is_empty() {
        return Err(shape_error(
            OP,
            "default_value",
            default_value,
            "must be a scalar",
        ));
    }
    if default_value.dtype() != values.dtype() {
        return Err(KernelError::InputDtype {
            op: OP,
            input: "default_value",
            expected: values.dtype().name(),
            actual: default_value.dtype(),
        });
    }
    let shape = int64s(OP, "dense_shape", dense_shape)?;
    let ind = int64s(OP, "indices", indices)?;
    if shape.is_empty() {
        return Err(shape_error(
            OP,
            "dense_shape",
            dense_shape,
            "Dense shape cannot be empty",
        ));
    }
    let rank = indices.shape()[1];
    if shape.len() != rank {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "dense_shape",
            left_shape: dense_shape.shape().to_vec(),
            right: "indices",
            right_shape: indices.shape().to_vec(),
        });
    }
    dims_of(OP, "dense_shape", shape)?;
    let n = indices.shape()[0];
    let dense_rows = usize::try_from(shape[0]).unwrap_or(0);
    let bool_out = |v: Vec<bool>| output(OP, vec![v.len()], TensorData::Bool(v));
    if dense_rows == 0 {
        if n != 0 {
            return Err(bad_value(
                OP,
                "indices",
                format!("dense_shape[0] = 0, indices.shape[0] = {n}"),
                "a sparse tensor with no rows has no entries",
            ));
        }
        return Ok(vec![
            output(OP, vec![0, rank], TensorData::Int64(Vec::new()))?,
            output(OP, vec![0], TensorData::zeros(values.dtype(), 0))?,
            bool_out(Vec::new())?,
            output(OP, vec![0], TensorData::Int64(Vec::new()))?,
        ]);
    }
    // Entries per row; also whether the rows are already in order.
    let mut per_row = vec![0usize; dense_rows];
    let mut rows = Vec::with_capacity(n);
    let mut ordered = true;
    let mut last = 0usize;
    for i in 0..n {
        let r = ind[i * rank];
        let row = usize::try_from(r)
            .ok()
            .filter(|&row| row < dense_rows)
            .ok_or_else(|| {
                bad_value(
                    OP,
                    "indices",
                    format!("indices({i}, 0) = {r}, dense_shape[0] = {dense_rows}"),
                    "row index out of range",
                )
            })?;
        per_row[row] += 1;
        ordered &= row >= last;
        last = row;
        rows.push(row);
    }
    let empty: Vec<bool> = per_row.iter().map(|&c| c == 0).collect();
    if ordered && !empty.contains(&true) {
        let identity = (0..n).map(to_i64).collect();
        return Ok(vec![
            indices.clone(),
            values.clone(),
            bool_out(empty)?,
            output(OP, vec![n], TensorData::Int64(identity))?,
        ]);
    }
    // Start of each row in the output (an empty row holds one default entry).
    let mut start = Vec::with_capacity(dense_rows);
    let mut total = 0usize;
    for &c in &per_row {
        start.push(total);
        total += c.max(1);
    }
    checked_num_elements(DType::Int64, &[total, rank])
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let mut out_indices = vec![0i64; total * rank];
    // Which input value each output takes; `n` is the default value.
    let mut source = vec![n; total];
    let mut filled = vec![0usize; dense_rows];
    let mut reverse = Vec::with_capacity(n);
    for (i, &row) in rows.iter().enumerate() {
        let at = start[row] + filled[row];
        filled[row] += 1;
        out_indices[at * rank..(at + 1) * rank].copy_from_slice(&ind[i * rank..(i + 1) * rank]);
        source[at] = i;
        reverse.push(to_i64(at));
    }
    for (row, _) in empty.iter().enumerate().filter(|(_, &e)| e) {
        out_indices[start[row] * rank] = to_i64(row);
    }
    let out_values = take_concat(values.data(), default_value.data(), &source).ok_or(
        KernelError::InputDtype {
            op: OP,
            input: "default_value",
            expected: values.dtype().name(),
            actual: default_value.dtype(),
        },
    )?;
    Ok(vec![
        output(OP, vec![total, rank], TensorData::Int64(out_indices))?,
        output(OP, vec![total], out_values)?,
        bool_out(empty)?,
        output(OP, vec![n], TensorData::Int64(reverse))?,
    ])
}

// ------------------------------------------------------------------------ SparseReshape

/// `SparseReshape`: the same entries in a sparse tensor of `new_shape` (which may hold one
/// -1). Indices are not checked against the input shape (TensorFlow does not check them:
/// they are linearized and split again with wrapping int64 arithmetic).
pub fn sparse_reshape(
    input_indices: &Tensor,
    input_shape: &Tensor,
    new_shape: &Tensor,
) -> Result<Vec<Tensor>> {
    const OP: &str = "SparseReshape";
    if input_indices.shape().len() != 2 {
        return Err(shape_error(
            OP,
            "input_indices",
            input_indices,
            "must be a matrix",
        ));
    }
    if input_shape.shape().len() != 1 {
        return Err(shape_error(
            OP,
            "input_shape",
            input_shape,
            "must be a vector",
        ));
    }
    if new_shape.shape().len() != 1 {
        return Err(shape_error(OP, "new_shape", new_shape, "must be a vector"));
    }
    let ind = int64s(OP, "input_indices", input_indices)?;
    let in_shape = int64s(OP, "input_shape", input_shape)?;
    let target = int64s(OP, "new_shape", new_shape)?;
    let (nnz, in_rank) = (input_indices.shape()[0], input_indices.shape()[1]);
    if in_rank != in_shape.len() {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "input_indices",
            left_shape: input_indices.shape().to_vec(),
            right: "input_shape",
            right_shape: input_shape.shape().to_vec(),
        });
    }
    dims_of(OP, "input_shape", in_shape)?;
    let overflow = || {
        bad_value(
            OP,
            "input_shape",
            format!("{in_shape:?}"),
            "too many elements",
        )
    };
    let dense_size = in_shape
        .iter()
        .try_fold(1i64, |a, &d| a.checked_mul(d))
        .ok_or_else(overflow)?;
    let mut unknown = None;
    let mut product = 1i64;
    let mut out_shape = Vec::with_capacity(target.len());
    for (d, &size) in target.iter().enumerate() {
        if size == -1 {
            if unknown.is_some() {
                return Err(bad_value(
                    OP,
                    "new_shape",
                    format!("{target:?}"),
                    "only one output dimension may be -1",
                ));
            }
            unknown = Some(d);
            out_shape.push(1);
        } else if size < 0 {
            return Err(bad_value(
                OP,
                "new_shape",
                format!("{target:?}"),
                "sizes must be non-negative or -1",
            ));
        } else {
            product = product.checked_mul(size).ok_or_else(overflow)?;
            out_shape.push(size);
        }
    }
    if let Some(u) = unknown {
        if product <= 0 {
            return Err(bad_value(
                OP,
                "new_shape",
                format!("{target:?}"),
                "cannot infer the missing size for an empty tensor unless all specified sizes are non-zero",
            ));
        }
        let missing = dense_size / product;
        if missing * product != dense_size {
            return Err(bad_value(
                OP,
                "new_shape",
                format!("{target:?}"),
                "the dense size is not a multiple of the specified sizes",
            ));
        }
        out_shape[u] = missing;
    }
    let out_size = out_shape.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
    if out_size != Some(dense_size) {
        return Err(bad_value(
            OP,
            "new_shape",
            format!("{target:?}"),
            "the new shape does not have as many elements as the input shape",
        ));
    }
    if nnz > 0 && dense_size == 0 {
        return Err(bad_value(
            OP,
            "input_indices",
            format!("{nnz} entries"),
            "a sparse tensor with entries cannot have an empty shape",
        ));
    }
    let out_rank = out_shape.len();
    let shape_out = output(OP, vec![out_rank], TensorData::Int64(out_shape.clone()))?;
    if in_shape == out_shape.as_slice() {
        return Ok(vec![input_indices.clone(), shape_out]);
    }
    let strides = |dims: &[i64]| {
        let mut s = vec![1i64; dims.len()];
        for d in (0..dims.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1].wrapping_mul(dims[d + 1]);
        }
        s
    };
    let (in_strides, out_strides) = (strides(in_shape), strides(&out_shape));
    checked_num_elements(DType::Int64, &[nnz, out_rank])
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let mut out = Vec::with_capacity(nnz * out_rank);
    for row in ind.chunks_exact(in_rank.max(1)).take(nnz) {
        let mut id = row
            .iter()
            .zip(&in_strides)
            .fold(0i64, |a, (&x, &s)| a.wrapping_add(x.wrapping_mul(s)));
        for &s in &out_strides {
            // Every stride is positive here: the dense size is non-zero.
            out.push(id.checked_div(s).unwrap_or(0));
            id = id.checked_rem(s).unwrap_or(0);
        }
    }
    if in_rank == 0 {
        out = vec![0; nnz * out_rank];
    }
    Ok(vec![
        output(OP, vec![nnz, out_rank], TensorData::Int64(out))?,
        shape_out,
    ])
}

// ------------------------------------------------------------------------ SparseToDense

/// `SparseToDense`: a dense tensor of `output_shape` filled with `default_value`, with
/// `sparse_values` (one per index, or a scalar for all) written at `sparse_indices` (a
/// scalar, a vector of 1-D indices, or a matrix of indices). With `validate_indices` the
/// indices must be in bounds and strictly increasing; without, later entries overwrite
/// earlier ones, and an out-of-bounds index is still an error.
pub fn sparse_to_dense(
    sparse_indices: &Tensor,
    output_shape: &Tensor,
    sparse_values: &Tensor,
    default_value: &Tensor,
    validate_indices: bool,
) -> Result<Vec<Tensor>> {
    const OP: &str = "SparseToDense";
    let ind_rank = sparse_indices.shape().len();
    if ind_rank > 2 {
        return Err(shape_error(
            OP,
            "sparse_indices",
            sparse_indices,
            "must be a scalar, vector, or matrix",
        ));
    }
    let num_elems = sparse_indices.shape().first().copied().unwrap_or(1);
    let num_dims = sparse_indices.shape().get(1).copied().unwrap_or(1);
    if output_shape.shape().len() != 1 || output_shape.num_elements() != num_dims {
        return Err(shape_error(
            OP,
            "output_shape",
            output_shape,
            "must be a vector with one element per index dimension",
        ));
    }
    let scalar_values = sparse_values.shape().is_empty();
    if !scalar_values && sparse_values.num_elements() != num_elems {
        return Err(shape_error(
            OP,
            "sparse_values",
            sparse_values,
            "must be a scalar or hold one value per index",
        ));
    }
    if !default_value.shape().is_empty() {
        return Err(shape_error(
            OP,
            "default_value",
            default_value,
            "must be a scalar",
        ));
    }
    if sparse_indices.dtype() != output_shape.dtype() {
        return Err(KernelError::InputDtype {
            op: OP,
            input: "output_shape",
            expected: sparse_indices.dtype().name(),
            actual: output_shape.dtype(),
        });
    }
    let ind = int_values(OP, "sparse_indices", sparse_indices)?;
    let shape = int_values(OP, "output_shape", output_shape)?;
    let dims = dims_of(OP, "output_shape", &shape)?;
    let n = checked_num_elements(sparse_values.dtype(), &dims)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let mut source = vec![0usize; n];
    let mut previous: Option<&[i64]> = None;
    for (i, index) in ind
        .chunks_exact(num_dims.max(1))
        .take(num_elems)
        .enumerate()
    {
        let index = if num_dims == 0 { &[][..] } else { index };
        let in_bounds = index.iter().zip(&shape).all(|(&x, &d)| (0..d).contains(&x));
        if !in_bounds {
            return Err(bad_value(
                OP,
                "sparse_indices",
                format!("indices[{i}] = {index:?}, shape {shape:?}"),
                "index out of bounds",
            ));
        }
        if validate_indices {
            if let Some(p) = previous {
                if p >= index {
                    return Err(bad_value(
                        OP,
                        "sparse_indices",
                        format!("indices[{i}] = {index:?}"),
                        "indices out of order or repeated",
                    ));
                }
            }
            previous = Some(index);
        }
        let flat = index.iter().zip(&dims).fold(0usize, |a, (&x, &d)| {
            a * d + usize::try_from(x).unwrap_or(0)
        });
        source[flat] = if scalar_values { 1 } else { i + 1 };
    }
    let data = take_concat(default_value.data(), sparse_values.data(), &source).ok_or(
        KernelError::InputDtype {
            op: OP,
            input: "default_value",
            expected: sparse_values.dtype().name(),
            actual: default_value.dtype(),
        },
    )?;
    Ok(vec![output(OP, dims, data)?])
}

// ------------------------------------------------------------------------ DenseBincount

/// The bincount's weights and output: int32, int64, float or double, added with the
/// element type's `+` (wrapping for integers, as the C++ does in practice).
trait Weight: Copy {
    const ONE: Self;
    fn add(self, other: Self) -> Self;
}

macro_rules! weight_int {
    ($($t:ty),*) => {$(
        impl Weight for $t {
            const ONE: Self = 1;
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
        }
    )*};
}
weight_int!(i32, i64);

impl Weight for f32 {
    const ONE: Self = 1.0;
    fn add(self, other: Self) -> Self {
        self + other
    }
}

impl Weight for f64 {
    const ONE: Self = 1.0;
    fn add(self, other: Self) -> Self {
        self + other
    }
}

/// Counts `values` (each row of `rows` rows) into `rows * size` bins, in input order.
fn bincount<T: Weight + Default>(
    values: &[i64],
    rows: usize,
    size: usize,
    weights: Option<&[T]>,
    binary: bool,
) -> Vec<T> {
    let mut out = vec![T::default(); rows * size];
    let per_row = values.len().checked_div(rows).unwrap_or(0);
    for (i, &v) in values.iter().enumerate() {
        let Some(bin) = usize::try_from(v).ok().filter(|&b| b < size) else {
            continue;
        };
        let slot = &mut out[(i.checked_div(per_row).unwrap_or(0)) * size + bin];
        *slot = match (binary, weights) {
            (true, _) => T::ONE,
            (false, Some(w)) => slot.add(w[i]),
            (false, None) => slot.add(T::ONE),
        };
    }
    out
}

/// `DenseBincount`: for a vector, how often each value in `[0, size)` occurs (weighted by
/// `weights` if it is not empty; 1 for "present" with `binary_output`); for a matrix, the
/// same per row. Values `>= size` are ignored; a negative value is an error. Float weights
/// are added in input order, which is TensorFlow's order with one intra-op thread.
pub fn dense_bincount(
    input: &Tensor,
    size: &Tensor,
    weights: &Tensor,
    binary_output: bool,
) -> Result<Vec<Tensor>> {
    const OP: &str = "DenseBincount";
    let rank = input.shape().len();
    if rank > 2 {
        return Err(shape_error(OP, "input", input, "must be at most rank 2"));
    }
    if !size.shape().is_empty() {
        return Err(shape_error(OP, "size", size, "must be a scalar"));
    }
    let values = int_values(OP, "input", input)?;
    let size_v = int_values(OP, "size", size)?;
    let size_v = size_v.first().copied().unwrap_or(0);
    let bins = usize::try_from(size_v)
        .map_err(|_| bad_value(OP, "size", size_v.to_string(), "must be non-negative"))?;
    let weighted = weights.num_elements() != 0;
    if weights.shape() != input.shape() && weighted {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "weights",
            left_shape: weights.shape().to_vec(),
            right: "input",
            right_shape: input.shape().to_vec(),
        });
    }
    if let Some(&v) = values.iter().find(|&&v| v < 0) {
        return Err(bad_value(
            OP,
            "input",
            v.to_string(),
            "must be non-negative",
        ));
    }
    let rows = if rank == 2 { input.shape()[0] } else { 1 };
    let dims = if rank == 2 {
        vec![rows, bins]
    } else {
        vec![bins]
    };
    checked_num_elements(weights.dtype(), &dims)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let w = |weighted: bool| weighted && !binary_output;
    let w = w(weighted);
    macro_rules! count {
        ($variant:ident, $x:expr) => {
            TensorData::$variant(bincount(
                &values,
                rows,
                bins,
                w.then_some($x.as_slice()),
                binary_output,
            ))
        };
    }
    let data = match weights.data() {
        TensorData::Int32(x) => count!(Int32, x),
        TensorData::Int64(x) => count!(Int64, x),
        TensorData::Float32(x) => count!(Float32, x),
        TensorData::Float64(x) => count!(Float64, x),
        _ => {
            return Err(KernelError::InputDtype {
                op: OP,
                input: "weights",
                expected: "int32, int64, float or double",
                actual: weights.dtype(),
            })
        }
    };
    Ok(vec![output(OP, dims, data)?])
}

/// `Bincount`: how often each value of `arr` (any shape, int32) in `[0, size)` occurs,
/// weighted by `weights` (same number of elements) unless it is empty; the output has
/// `weights`' dtype. Values `>= size` are ignored; errors are TensorFlow's messages.
pub fn bincount_op(arr: &Tensor, size: &Tensor, weights: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Bincount";
    if !size.shape().is_empty() {
        return Err(shape_error(OP, "size", size, "must be a scalar"));
    }
    let size_v = int_values(OP, "size", size)?.first().copied().unwrap_or(0);
    let bins = usize::try_from(size_v).map_err(|_| KernelError::InvalidInput {
        op: OP,
        input: "size",
        reason: format!("size ({size_v}) must be non-negative"),
    })?;
    let values = int_values(OP, "arr", arr)?;
    let weighted = weights.num_elements() != 0;
    if weighted && weights.num_elements() != values.len() {
        return Err(KernelError::InvalidInput {
            op: OP,
            input: "weights",
            reason: "Input indices and weights must have the same size.".into(),
        });
    }
    if values.iter().any(|&v| v < 0) {
        return Err(KernelError::InvalidInput {
            op: OP,
            input: "arr",
            reason: "Input arr must be non-negative!".into(),
        });
    }
    checked_num_elements(weights.dtype(), &[bins])
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let rows = usize::from(!values.is_empty());
    macro_rules! count {
        ($variant:ident, $x:expr) => {{
            let mut v = bincount(
                &values,
                rows,
                bins,
                weighted.then_some($x.as_slice()),
                false,
            );
            v.resize(bins, Default::default());
            TensorData::$variant(v)
        }};
    }
    let data = match weights.data() {
        TensorData::Int32(x) => count!(Int32, x),
        TensorData::Int64(x) => count!(Int64, x),
        TensorData::Float32(x) => count!(Float32, x),
        TensorData::Float64(x) => count!(Float64, x),
        _ => {
            return Err(KernelError::InputDtype {
                op: OP,
                input: "weights",
                expected: "int32, int64, float or double",
                actual: weights.dtype(),
            })
        }
    };
    Ok(vec![output(OP, vec![bins], data)?])
}

/// The checked parts of a sparse tensor: indices `[n, rank]` (int64), values `[n]`, and the
/// dense shape `[rank]`.
fn sparse_parts<'a>(
    op: &'static str,
    indices: &'a Tensor,
    values: &Tensor,
    shape: &'a Tensor,
) -> Result<(&'a [i64], usize, &'a [i64])> {
    let idx = int64s(op, "input_indices", indices)?;
    let dims = int64s(op, "input_shape", shape)?;
    let [n, rank] = indices.shape() else {
        return Err(shape_error(
            op,
            "input_indices",
            indices,
            "Input indices should be a matrix",
        ));
    };
    if values.shape() != [*n] {
        return Err(shape_error(
            op,
            "input_values",
            values,
            "Input values should be a vector",
        ));
    }
    if shape.shape() != [*rank] {
        return Err(shape_error(
            op,
            "input_shape",
            shape,
            "Input shape should be a vector of the indices' rank",
        ));
    }
    Ok((idx, *rank, dims))
}

/// `SparseReorder`: the entries sorted into row-major order of their indices (a stable sort:
/// entries with equal indices keep their order). Indices outside the shape are sorted like
/// any other, as TensorFlow does.
pub fn sparse_reorder(indices: &Tensor, values: &Tensor, shape: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "SparseReorder";
    // TensorFlow reorders without checking the indices against the shape.
    let (idx, rank, _) = sparse_parts(OP, indices, values, shape)?;
    let n = values.num_elements();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| idx[a * rank..(a + 1) * rank].cmp(&idx[b * rank..(b + 1) * rank]));
    let new_idx: Vec<i64> = order
        .iter()
        .flat_map(|&i| idx[i * rank..(i + 1) * rank].iter().copied())
        .collect();
    Ok(vec![
        output(OP, vec![n, rank], TensorData::Int64(new_idx))?,
        output(OP, vec![n], take(values.data(), &order))?,
    ])
}

/// `SparseSlice`: the entries inside `[start, start + size)` in every dimension, their
/// indices shifted by `start`; the output shape is each dimension's part of the slice that
/// lies inside the input's shape.
pub fn sparse_slice(
    indices: &Tensor,
    values: &Tensor,
    shape: &Tensor,
    start: &Tensor,
    size: &Tensor,
) -> Result<Vec<Tensor>> {
    const OP: &str = "SparseSlice";
    let (idx, rank, dims) = sparse_parts(OP, indices, values, shape)?;
    let start = int64s(OP, "start", start)?;
    let size = int64s(OP, "size", size)?;
    if start.len() != rank || size.len() != rank {
        return Err(KernelError::InvalidInput {
            op: OP,
            input: "start",
            reason: format!(
                "Expected start and size to be vectors of the input's rank {rank}, got {} and {}",
                start.len(),
                size.len()
            ),
        });
    }
    if let Some(d) = (0..rank).find(|&d| start[d] < 0 || size[d] < 0) {
        return Err(KernelError::InvalidInput {
            op: OP,
            input: "start",
            reason: format!(
                "start[{d}] = {} and size[{d}] = {} must be non-negative",
                start[d], size[d]
            ),
        });
    }
    let out_dims: Vec<i64> = (0..rank)
        .map(|d| {
            if start[d] >= dims[d] {
                0
            } else {
                start[d].saturating_add(size[d]).min(dims[d]) - start[d]
            }
        })
        .collect();
    let n = values.num_elements();
    let mut keep = Vec::new();
    let mut new_idx = Vec::new();
    for (i, row) in idx.chunks(rank.max(1)).take(n).enumerate() {
        let inside = (0..rank).all(|d| {
            row[d] >= start[d] && row[d] < start[d].saturating_add(size[d]) && row[d] < dims[d]
        });
        if inside {
            keep.push(i);
            new_idx.extend((0..rank).map(|d| row[d] - start[d]));
        }
    }
    let k = keep.len();
    Ok(vec![
        output(OP, vec![k, rank], TensorData::Int64(new_idx))?,
        output(OP, vec![k], take(values.data(), &keep))?,
        output(OP, vec![rank], TensorData::Int64(out_dims))?,
    ])
}

/// `SparseCountSparseOutput`: per row (the first index; one row for a 1-D input) how often
/// each value occurs (weighted, or 1 for "present" with `binary_output`), as a sparse tensor
/// sorted by value within each row. Values below 0, or at or above a positive `maxlength`,
/// are ignored; the dense width is `maxlength` when positive, else
/// `max(largest value + 1, minlength)`. The output has `weights`' dtype (`output_type`).
pub fn sparse_count_sparse_output(
    indices: &Tensor,
    values: &Tensor,
    dense_shape: &Tensor,
    weights: &Tensor,
    binary_output: bool,
    minlength: i64,
    maxlength: i64,
) -> Result<Vec<Tensor>> {
    const OP: &str = "SparseCountSparseOutput";
    let idx = int64s(OP, "indices", indices)?;
    let vals = int_values(OP, "values", values)?;
    let dims = int64s(OP, "dense_shape", dense_shape)?;
    let [n, rank] = indices.shape() else {
        return Err(shape_error(
            OP,
            "indices",
            indices,
            "Input indices must be a 2-dimensional tensor",
        ));
    };
    if *n != vals.len() {
        return Err(KernelError::InvalidInput {
            op: OP,
            input: "values",
            reason: format!(
                "Number of values must match first dimension of indices. Got {} values, indices shape: [{n},{rank}]",
                vals.len()
            ),
        });
    }
    let weighted = weights.num_elements() != 0;
    if weighted && weights.shape() != values.shape() {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "weights",
            left_shape: weights.shape().to_vec(),
            right: "values",
            right_shape: values.shape().to_vec(),
        });
    }
    let is_1d = dims.len() == 1;
    if !is_1d && *rank == 0 {
        return Err(shape_error(
            OP,
            "indices",
            indices,
            "indices of a batched input need the batch dimension",
        ));
    }
    let batches = if is_1d {
        1
    } else {
        dims.first().copied().unwrap_or(0)
    };
    if batches < 0 {
        return Err(KernelError::InvalidInput {
            op: OP,
            input: "dense_shape",
            reason: format!("Cannot have a negative batch count: {batches}"),
        });
    }
    // Per row that has values: value → the positions holding it (rows without values take
    // no memory, however large the dense shape says the batch is).
    let mut rows: std::collections::BTreeMap<i64, std::collections::BTreeMap<i64, Vec<usize>>> =
        std::collections::BTreeMap::new();
    let mut max_value = 0i64;
    for (i, &v) in vals.iter().enumerate() {
        let b = if is_1d { 0 } else { idx[i * rank] };
        if !(0..batches).contains(&b) {
            return Err(KernelError::InvalidInput {
                op: OP,
                input: "indices",
                reason: format!(
                    "Indices value along the first dimension must be in [0, {batches}), got {b}"
                ),
            });
        }
        let row = rows.entry(b).or_default();
        if v >= 0 && (maxlength <= 0 || v < maxlength) {
            row.entry(v).or_default().push(i);
            max_value = max_value.max(v);
        }
    }
    let width = if maxlength > 0 {
        maxlength
    } else {
        max_value.saturating_add(1).max(minlength)
    };
    let mut out_idx = Vec::new();
    let mut order: Vec<&[usize]> = Vec::new();
    for (&b, row) in &rows {
        for (&v, positions) in row {
            if !is_1d {
                out_idx.push(b);
            }
            out_idx.push(v);
            order.push(positions);
        }
    }
    macro_rules! counts {
        ($variant:ident, $t:ty, $w:expr) => {{
            let w: Option<&[$t]> = $w;
            TensorData::$variant(
                order
                    .iter()
                    .map(|ps| match (binary_output, w) {
                        (true, _) => <$t as Weight>::ONE,
                        (false, Some(w)) => ps
                            .iter()
                            .fold(<$t>::default(), |acc, &p| Weight::add(acc, w[p])),
                        (false, None) => ps.iter().fold(<$t>::default(), |acc, _| {
                            Weight::add(acc, <$t as Weight>::ONE)
                        }),
                    })
                    .collect(),
            )
        }};
    }
    let data = match weights.data() {
        TensorData::Int32(x) => counts!(Int32, i32, weighted.then_some(x.as_slice())),
        TensorData::Int64(x) => counts!(Int64, i64, weighted.then_some(x.as_slice())),
        TensorData::Float32(x) => counts!(Float32, f32, weighted.then_some(x.as_slice())),
        TensorData::Float64(x) => counts!(Float64, f64, weighted.then_some(x.as_slice())),
        _ => {
            return Err(KernelError::InputDtype {
                op: OP,
                input: "weights",
                expected: "int32, int64, float or double",
                actual: weights.dtype(),
            })
        }
    };
    let k = order.len();
    let out_rank = if is_1d { 1 } else { 2 };
    let shape = if is_1d {
        vec![width]
    } else {
        vec![batches, width]
    };
    Ok(vec![
        output(OP, vec![k, out_rank], TensorData::Int64(out_idx))?,
        output(OP, vec![k], data)?,
        output(OP, vec![out_rank], TensorData::Int64(shape))?,
    ])
}
