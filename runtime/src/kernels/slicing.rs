//! Slicing and re-arranging kernels: `Slice`, `StridedSlice`, `GatherV2`, `Tile`, `Transpose`,
//! `OneHot`, `IdentityN`.
//!
//! These kernels only move values, so every dtype comes out bit-exact by construction. What
//! they must match is TensorFlow's validation and index arithmetic (`ValidateStridedSliceOp`'s
//! sparse → dense spec, clamping and masks), including quirks of its CPU kernels that the
//! golden vectors pin down:
//! - `Slice` and `StridedSlice` on an input of rank > 8 fail ("Unhandled input dimensions")
//!   unless the slice is the identity, is empty, or takes whole rows of dimension 0 whose byte
//!   size is a multiple of 64 (`EIGEN_MAX_ALIGN_BYTES`; a string element counts 24 bytes);
//! - a `StridedSlice` shrink axis ignores the begin and end masks and allows any stride > 0;
//! - `Tile` has no uint16 kernel: it fails when it would have to copy, not otherwise;
//! - `Transpose` keeps the low 32 bits of int64 `perm` entries before checking them;
//! - `GatherV2` checks the indices only when the output is not empty.
//!
//! TensorFlow 2.18.1 aborts the process on a negative `Transpose` perm entry and on a
//! `GatherV2` axis of -2^63; both are errors here.

use super::{output, KernelError, Result};
use crate::tensor::{checked_num_elements, DType, Tensor, TensorData, MAX_TENSOR_BYTES};

/// The slice kernels' rank limit outside their identity and dimension-0 fast paths.
const MAX_GENERAL_RANK: usize = 8;
/// `EIGEN_MAX_ALIGN_BYTES` of TensorFlow 2.18.1's x86-64 build (found with the rank-9 goldens).
const EIGEN_MAX_ALIGN_BYTES: usize = 64;
/// `sizeof(tstring)`, what a string element counts for that alignment.
const TSTRING_BYTES: usize = 24;

fn invalid(op: &'static str, input: &'static str, reason: impl Into<String>) -> KernelError {
    KernelError::InvalidInput {
        op,
        input,
        reason: reason.into(),
    }
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The values of an integer input whose dtype is one of `allowed`, widened to i64.
fn index_values(
    op: &'static str,
    input: &'static str,
    t: &Tensor,
    allowed: &[DType],
    expected: &'static str,
) -> Result<Vec<i64>> {
    let values = match t.data() {
        TensorData::Int16(v) if allowed.contains(&DType::Int16) => {
            v.iter().map(|&x| i64::from(x)).collect()
        }
        TensorData::Int32(v) if allowed.contains(&DType::Int32) => {
            v.iter().map(|&x| i64::from(x)).collect()
        }
        TensorData::Int64(v) if allowed.contains(&DType::Int64) => v.clone(),
        _ => {
            return Err(KernelError::InputDtype {
                op,
                input,
                expected,
                actual: t.dtype(),
            })
        }
    };
    Ok(values)
}

const INT32_64: &[DType] = &[DType::Int32, DType::Int64];
const INT16_32_64: &[DType] = &[DType::Int16, DType::Int32, DType::Int64];

fn same_dtype(op: &'static str, input: &'static str, t: &Tensor, like: &Tensor) -> Result<()> {
    if t.dtype() == like.dtype() {
        Ok(())
    } else {
        Err(KernelError::InputDtype {
            op,
            input,
            expected: like.dtype().name(),
            actual: t.dtype(),
        })
    }
}

/// Row-major strides (in elements) of `shape`; saturating, as they only matter for shapes
/// whose element count fits in memory.
fn row_major_strides(shape: &[usize]) -> Vec<i128> {
    let mut out = vec![1i128; shape.len()];
    let mut acc = 1i128;
    for (s, &d) in out.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(i128::try_from(d).unwrap_or(i128::MAX));
    }
    out
}

fn product(dims: &[usize]) -> usize {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .unwrap_or(usize::MAX)
}

/// TensorFlow's `IsInnerDimsSizeAligned`: whether one row of dimension 0 fills whole
/// alignment units (what lets its slice kernels share the input's buffer for any rank).
fn rows_aligned(t: &Tensor) -> bool {
    match t.shape().first() {
        Some(&rows) if rows > 0 => {
            let width = t.dtype().byte_width().unwrap_or(TSTRING_BYTES);
            (t.num_elements() / rows)
                .saturating_mul(width)
                .is_multiple_of(EIGEN_MAX_ALIGN_BYTES)
        }
        _ => false,
    }
}

fn rank_unsupported(op: &'static str, rank: usize) -> KernelError {
    invalid(
        op,
        "input",
        format!(
            "TensorFlow's CPU kernel does not handle rank {rank} here (Unimplemented: at most \
             {MAX_GENERAL_RANK} unless the slice is the identity or aligned whole rows)"
        ),
    )
}

// ---------------------------------------------------------------------------- copying

/// An element type, with the heap bytes it owns (a string's contents).
trait Elem: Clone {
    fn heap_bytes(&self) -> u64 {
        0
    }
}

macro_rules! plain_elem {
    ($($t:ty),*) => {$(impl Elem for $t {})*};
}
plain_elem!(bool, i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

impl Elem for Vec<u8> {
    fn heap_bytes(&self) -> u64 {
        u64::try_from(self.len()).unwrap_or(u64::MAX)
    }
}

/// Where an output's values come from: contiguous runs `(start, len)` of the input's flat
/// values, in output order.
trait Runs {
    /// Calls `f` on each run in order, stopping at the first `false`; whether all ran.
    fn each(&self, f: &mut dyn FnMut(usize, usize) -> bool) -> bool;
}

/// A strided view of an input: the output element at multi-index `i` (row-major over
/// `counts`) is input element `base + Σ i[d] · steps[d]`.
struct View {
    base: i128,
    steps: Vec<i128>,
    counts: Vec<usize>,
}

impl Runs for View {
    fn each(&self, f: &mut dyn FnMut(usize, usize) -> bool) -> bool {
        if self.counts.contains(&0) {
            return true;
        }
        // A last dimension of step 1 is copied as runs; otherwise element by element.
        let (run, outer) = match (self.steps.last(), self.counts.last()) {
            (Some(1), Some(&n)) => (n, self.counts.len() - 1),
            _ => (1, self.counts.len()),
        };
        let mut index = vec![0usize; outer];
        let mut offset = self.base;
        loop {
            let Ok(start) = usize::try_from(offset) else {
                return false;
            };
            if !f(start, run) {
                return false;
            }
            let mut d = outer;
            loop {
                if d == 0 {
                    return true;
                }
                d -= 1;
                index[d] += 1;
                offset = offset.saturating_add(self.steps[d]);
                if index[d] < self.counts[d] {
                    break;
                }
                let span = i128::try_from(index[d]).unwrap_or(i128::MAX);
                offset = offset.saturating_sub(self.steps[d].saturating_mul(span));
                index[d] = 0;
            }
        }
    }
}

/// Copies the runs out of `v` (`total` values in all), refusing string contents over
/// [`MAX_TENSOR_BYTES`].
fn take<T: Elem>(v: &[T], total: usize, runs: &dyn Runs) -> Result<Vec<T>, &'static str> {
    let mut out = Vec::with_capacity(total);
    let mut heap = 0u64;
    let mut failure = "an index is out of range (internal error)";
    let complete = runs.each(&mut |start, len| {
        let Some(chunk) = start.checked_add(len).and_then(|end| v.get(start..end)) else {
            return false;
        };
        heap = chunk
            .iter()
            .fold(heap, |h, x| h.saturating_add(x.heap_bytes()));
        if heap > MAX_TENSOR_BYTES {
            failure = "the output's strings would exceed the tensor size limit";
            return false;
        }
        out.extend_from_slice(chunk);
        true
    });
    if complete {
        Ok(out)
    } else {
        Err(failure)
    }
}

fn take_data(data: &TensorData, total: usize, runs: &dyn Runs) -> Result<TensorData, &'static str> {
    Ok(match data {
        TensorData::Bool(v) => TensorData::Bool(take(v, total, runs)?),
        TensorData::Int8(v) => TensorData::Int8(take(v, total, runs)?),
        TensorData::Int16(v) => TensorData::Int16(take(v, total, runs)?),
        TensorData::Int32(v) => TensorData::Int32(take(v, total, runs)?),
        TensorData::Int64(v) => TensorData::Int64(take(v, total, runs)?),
        TensorData::UInt8(v) => TensorData::UInt8(take(v, total, runs)?),
        TensorData::UInt16(v) => TensorData::UInt16(take(v, total, runs)?),
        TensorData::UInt32(v) => TensorData::UInt32(take(v, total, runs)?),
        TensorData::UInt64(v) => TensorData::UInt64(take(v, total, runs)?),
        TensorData::Float16(v) => TensorData::Float16(take(v, total, runs)?),
        TensorData::BFloat16(v) => TensorData::BFloat16(take(v, total, runs)?),
        TensorData::Float32(v) => TensorData::Float32(take(v, total, runs)?),
        TensorData::Float64(v) => TensorData::Float64(take(v, total, runs)?),
        TensorData::String(v) => TensorData::String(take(v, total, runs)?),
    })
}

/// The tensor of `shape` whose values are `runs` of `data`.
fn build(
    op: &'static str,
    shape: Vec<usize>,
    data: &TensorData,
    runs: &dyn Runs,
) -> Result<Tensor> {
    let total = checked_num_elements(data.dtype(), &shape)
        .map_err(|source| KernelError::Output { op, source })?;
    let values = take_data(data, total, runs).map_err(|reason| invalid(op, "output", reason))?;
    output(op, shape, values)
}

// ------------------------------------------------------------------------------ Slice

/// `Slice`: `size[i]` elements from `begin[i]` along each dimension (`size[i] == -1`: to the
/// end). `begin` and `size` are int32 or int64 vectors of the input's rank, of one dtype.
pub fn slice(input: &Tensor, begin: &Tensor, size: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Slice";
    let rank = input.shape().len();
    let b = index_values(OP, "begin", begin, INT32_64, "int32 or int64")?;
    same_dtype(OP, "size", size, begin)?;
    let s = index_values(OP, "size", size, INT32_64, "int32 or int64")?;
    if begin.shape().len() != 1 || size.shape().len() != 1 || b.len() != rank || s.len() != rank {
        return Err(invalid(
            OP,
            "begin",
            format!(
                "begin and size must be vectors of length {rank} (the input's rank), got shapes \
                 {:?} and {:?}",
                begin.shape(),
                size.shape()
            ),
        ));
    }
    let mut counts = Vec::with_capacity(rank);
    let (mut identity, mut dim0) = (true, true);
    for (i, ((&d, &bi), &si)) in input.shape().iter().zip(&b).zip(&s).enumerate() {
        let dim = to_i64(d);
        let si = if si == -1 {
            dim.checked_sub(bi).unwrap_or(i64::MIN)
        } else {
            si
        };
        let ok = if dim == 0 {
            bi == 0 && si == 0
        } else {
            (0..=dim).contains(&bi) && si >= 0 && bi.checked_add(si).is_some_and(|e| e <= dim)
        };
        if !ok {
            return Err(invalid(
                OP,
                "begin",
                format!("begin[{i}] = {bi} with size {si} is out of range for dimension {dim}"),
            ));
        }
        counts.push(usize::try_from(si).unwrap_or(0));
        let take_all = bi == 0 && si == dim;
        identity &= take_all;
        dim0 &= i == 0 || take_all;
    }
    if identity {
        return Ok(vec![input.clone()]);
    }
    if rank > MAX_GENERAL_RANK && product(&counts) > 0 && !(dim0 && rows_aligned(input)) {
        return Err(rank_unsupported(OP, rank));
    }
    let steps = row_major_strides(input.shape());
    let base = b.iter().zip(&steps).fold(0i128, |acc, (&bi, &st)| {
        acc.saturating_add(i128::from(bi) * st)
    });
    let view = View {
        base,
        steps,
        counts: counts.clone(),
    };
    Ok(vec![build(OP, counts, input.data(), &view)?])
}

// ----------------------------------------------------------------------- StridedSlice

/// `StridedSlice`'s mask attributes (TensorFlow reads each as an int32; bit `i` refers to
/// entry `i` of `begin`/`end`/`strides`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StridedSliceMasks {
    pub begin_mask: i64,
    pub end_mask: i64,
    pub ellipsis_mask: i64,
    pub new_axis_mask: i64,
    pub shrink_axis_mask: i64,
}

/// Where a dimension of the final shape comes from.
#[derive(Debug, Clone, Copy)]
enum FinalDim {
    /// A processed input dimension.
    Dim(usize),
    /// A new axis of size 1.
    NewAxis,
    /// A shrunk input dimension (left out).
    Shrink,
}

fn mask_bits(attr: &'static str, value: i64) -> Result<u64> {
    i32::try_from(value)
        .map(|m| u64::from(u32::from_le_bytes(m.to_le_bytes())))
        .map_err(|_| KernelError::InvalidAttr {
            op: "StridedSlice",
            attr,
            value: value.to_string(),
            reason: "must fit in an int32",
        })
}

fn bit(mask: u64, i: usize) -> bool {
    i < 64 && (mask >> i) & 1 == 1
}

/// `StridedSlice` with TensorFlow's full semantics: negative indices count from the end,
/// out-of-range `begin`/`end` are clamped, a masked `begin`/`end` means "from the start" or
/// "to the end" in the stride's direction, one ellipsis stands for the dimensions not
/// named, a new axis inserts a dimension of 1 and a shrink axis takes one index (which must
/// be in range) and drops the dimension. `begin`, `end` and `strides` are int16, int32 or
/// int64 vectors of one dtype and length (below 32).
pub fn strided_slice(
    input: &Tensor,
    begin: &Tensor,
    end: &Tensor,
    strides: &Tensor,
    masks: &StridedSliceMasks,
) -> Result<Vec<Tensor>> {
    const OP: &str = "StridedSlice";
    let begin_mask = mask_bits("begin_mask", masks.begin_mask)?;
    let end_mask = mask_bits("end_mask", masks.end_mask)?;
    let ellipsis_mask = mask_bits("ellipsis_mask", masks.ellipsis_mask)?;
    let new_axis_mask = mask_bits("new_axis_mask", masks.new_axis_mask)?;
    let shrink_axis_mask = mask_bits("shrink_axis_mask", masks.shrink_axis_mask)?;
    const EXPECTED: &str = "int16, int32 or int64";
    let b = index_values(OP, "begin", begin, INT16_32_64, EXPECTED)?;
    same_dtype(OP, "end", end, begin)?;
    same_dtype(OP, "strides", strides, begin)?;
    let e = index_values(OP, "end", end, INT16_32_64, EXPECTED)?;
    let s = index_values(OP, "strides", strides, INT16_32_64, EXPECTED)?;
    let n = s.len();
    if begin.shape().len() != 1
        || end.shape().len() != 1
        || strides.shape().len() != 1
        || b.len() != n
        || e.len() != n
        || n >= 32
    {
        return Err(invalid(
            OP,
            "begin",
            format!(
                "begin, end and strides must be vectors of one length below 32, got shapes \
                 {:?}, {:?} and {:?}",
                begin.shape(),
                end.shape(),
                strides.shape()
            ),
        ));
    }
    if ellipsis_mask & ellipsis_mask.wrapping_sub(1) != 0 {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "ellipsis_mask",
            value: masks.ellipsis_mask.to_string(),
            reason: "multiple ellipses in a slice spec are not allowed",
        });
    }

    // The sparse spec: the entries as given, with an ellipsis appended if there is none.
    let mut ellipsis = ellipsis_mask;
    let mut sparse_dims = n;
    let mut seen = false;
    let mut new_axes_after_ellipsis = 0i64;
    for i in 0..n {
        if seen && bit(new_axis_mask, i) {
            new_axes_after_ellipsis += 1;
        }
        seen |= bit(ellipsis, i);
    }
    if !seen {
        ellipsis |= 1 << n;
        sparse_dims += 1;
    }

    // The dense spec: one entry per input dimension.
    let shape = input.shape();
    let rank = shape.len();
    let mut dbegin = vec![0i64; rank];
    let mut dend = vec![0i64; rank];
    let mut dstride = vec![0i64; rank];
    let mut dbegin_masked = vec![false; rank];
    let mut dend_masked = vec![false; rank];
    let mut dshrink = vec![false; rank];
    let mut final_dims = Vec::new();
    let mut full = 0usize;
    for i in 0..sparse_dims {
        if bit(ellipsis, i) {
            let next = (to_i64(rank) - to_i64(sparse_dims - i) + 1 + new_axes_after_ellipsis)
                .min(to_i64(rank));
            while to_i64(full) < next {
                dstride[full] = 1;
                dbegin_masked[full] = true;
                dend_masked[full] = true;
                final_dims.push(FinalDim::Dim(full));
                full += 1;
            }
        } else if bit(new_axis_mask, i) {
            final_dims.push(FinalDim::NewAxis);
        } else {
            if full == rank {
                let reason = if rank == 0 {
                    "attempting to slice a scalar input".to_string()
                } else {
                    format!("index out of range using input dim {full}; input has only {rank} dims")
                };
                return Err(invalid(OP, "begin", reason));
            }
            let (Some(&bi), Some(&ei), Some(&si)) = (b.get(i), e.get(i), s.get(i)) else {
                return Err(invalid(
                    OP,
                    "begin",
                    "spec entry out of range (internal error)",
                ));
            };
            dbegin[full] = bi;
            dend[full] = ei;
            dstride[full] = si;
            dbegin_masked[full] = bit(begin_mask, i);
            dend_masked[full] = bit(end_mask, i);
            if bit(shrink_axis_mask, i) {
                final_dims.push(FinalDim::Shrink);
                dshrink[full] = true;
            } else {
                final_dims.push(FinalDim::Dim(full));
            }
            full += 1;
        }
    }

    // Canonical begin/end and the size of each processed dimension.
    let mut counts = Vec::with_capacity(rank);
    let (mut identity, mut slice_dim0) = (true, true);
    for i in 0..rank {
        let dim = to_i64(shape[i]);
        let stride = dstride[i];
        if stride == 0 {
            return Err(invalid(
                OP,
                "strides",
                format!("strides[{i}] must be non-zero"),
            ));
        }
        let (bi, ei) = if dshrink[i] {
            if stride < 0 {
                return Err(invalid(
                    OP,
                    "strides",
                    "only stride 1 allowed on non-range indexing (a negative stride on a \
                     shrink axis)",
                ));
            }
            let fwd = if dbegin[i] < 0 {
                dim + dbegin[i]
            } else {
                dbegin[i]
            };
            if fwd < 0 || fwd >= dim {
                return Err(invalid(
                    OP,
                    "begin",
                    format!("slice index {fwd} of dimension {i} out of bounds"),
                ));
            }
            (fwd, fwd + 1)
        } else {
            // The valid range of an index in the stride's direction.
            let (lo, hi) = if stride > 0 { (0, dim) } else { (-1, dim - 1) };
            let canonical = |x: i64, masked: bool, is_end: bool| {
                if masked {
                    if (stride > 0) == is_end {
                        hi
                    } else {
                        lo
                    }
                } else {
                    (if x < 0 { dim + x } else { x }).clamp(lo, hi)
                }
            };
            (
                canonical(dbegin[i], dbegin_masked[i], false),
                canonical(dend[i], dend_masked[i], true),
            )
        };
        dbegin[i] = bi;
        dend[i] = ei;
        let take_all = stride == 1 && bi == 0 && ei == dim;
        identity &= take_all;
        slice_dim0 &= (i == 0 && stride == 1) || take_all;
        let interval = ei - bi;
        let size = if interval == 0 || ((interval < 0) != (stride < 0)) {
            0
        } else {
            interval / stride + i64::from(interval % stride != 0)
        };
        counts.push(usize::try_from(size).unwrap_or(0));
    }
    let final_shape: Vec<usize> = final_dims
        .iter()
        .filter_map(|d| match *d {
            FinalDim::Dim(k) => counts.get(k).copied(),
            FinalDim::NewAxis => Some(1),
            FinalDim::Shrink => None,
        })
        .collect();

    if identity {
        return Ok(vec![output(OP, final_shape, input.data().clone())?]);
    }
    if rank > MAX_GENERAL_RANK && product(&counts) > 0 && !(slice_dim0 && rows_aligned(input)) {
        return Err(rank_unsupported(OP, rank));
    }
    let in_strides = row_major_strides(shape);
    let base = dbegin
        .iter()
        .zip(&in_strides)
        .fold(0i128, |acc, (&bi, &st)| {
            acc.saturating_add(i128::from(bi) * st)
        });
    let steps = dstride
        .iter()
        .zip(&in_strides)
        .map(|(&s, &st)| i128::from(s).saturating_mul(st))
        .collect();
    let view = View {
        base,
        steps,
        counts,
    };
    Ok(vec![build(OP, final_shape, input.data(), &view)?])
}

// --------------------------------------------------------------------------- GatherV2

/// Runs of a gather: for each batch, outer index and index, one row of `inner` values.
struct GatherRuns<'a> {
    batch: usize,
    outer: usize,
    limit: usize,
    inner: usize,
    indices: &'a [usize],
}

impl Runs for GatherRuns<'_> {
    fn each(&self, f: &mut dyn FnMut(usize, usize) -> bool) -> bool {
        let per_batch = self.indices.len().checked_div(self.batch).unwrap_or(0);
        for b in 0..self.batch {
            let Some(batch_indices) = self.indices.get(b * per_batch..(b + 1) * per_batch) else {
                return false;
            };
            for o in 0..self.outer {
                for &i in batch_indices {
                    let row = (b * self.outer + o) * self.limit + i;
                    if !f(row * self.inner, self.inner) {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// `GatherV2`: slices of `params` along `axis` (int32/int64 scalar, negative counts from the
/// end) at `indices` (int16/int32/int64, each in `[0, params.shape[axis])` — out of range is
/// an error, as on TensorFlow's CPU). With `batch_dims` (negative counts from the rank of
/// `indices`), the first `batch_dims` dimensions of params and indices are batch dimensions
/// gathered pairwise.
pub fn gather_v2(
    params: &Tensor,
    indices: &Tensor,
    axis: &Tensor,
    batch_dims: i64,
) -> Result<Vec<Tensor>> {
    const OP: &str = "GatherV2";
    let batch_attr = i32::try_from(batch_dims).map_err(|_| KernelError::InvalidAttr {
        op: OP,
        attr: "batch_dims",
        value: batch_dims.to_string(),
        reason: "must fit in an int32",
    })?;
    let idx = index_values(OP, "indices", indices, INT16_32_64, "int16, int32 or int64")?;
    let pshape = params.shape();
    let ishape = indices.shape();
    let (prank, irank) = (to_i64(pshape.len()), to_i64(ishape.len()));
    if pshape.is_empty() {
        return Err(invalid(
            OP,
            "params",
            "params must be at least 1 dimensional",
        ));
    }
    let axis_values = index_values(OP, "axis", axis, INT32_64, "int32 or int64")?;
    let (true, &[a]) = (axis.shape().is_empty(), axis_values.as_slice()) else {
        return Err(KernelError::InputShape {
            op: OP,
            input: "axis",
            shape: axis.shape().to_vec(),
            reason: "must be a scalar",
        });
    };
    let min_rank = if a < 0 {
        a.checked_neg()
    } else {
        a.checked_add(1)
    };
    let Some(axis) = min_rank
        .filter(|&m| m <= prank)
        .and_then(|_| usize::try_from(if a < 0 { prank + a } else { a }).ok())
    else {
        return Err(invalid(
            OP,
            "axis",
            format!("axis {a} is out of range for params of rank {prank}"),
        ));
    };
    let mut bd = i64::from(batch_attr);
    if bd != 0 {
        if bd < -irank || bd > irank {
            return Err(KernelError::InvalidAttr {
                op: OP,
                attr: "batch_dims",
                value: batch_dims.to_string(),
                reason: "must be in [-rank(indices), rank(indices)]",
            });
        }
        if bd < 0 {
            bd += irank;
        }
        if bd >= prank {
            return Err(KernelError::InvalidAttr {
                op: OP,
                attr: "batch_dims",
                value: batch_dims.to_string(),
                reason: "must be less than rank(params)",
            });
        }
        if to_i64(axis) < bd {
            return Err(KernelError::InvalidAttr {
                op: OP,
                attr: "batch_dims",
                value: batch_dims.to_string(),
                reason: "must be less than or equal to axis",
            });
        }
    }
    let bd = usize::try_from(bd).unwrap_or(0);
    if pshape.get(..bd) != ishape.get(..bd) {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "params",
            left_shape: pshape.to_vec(),
            right: "indices",
            right_shape: ishape.to_vec(),
        });
    }
    let limit = pshape[axis];
    let index_max = match indices.dtype() {
        DType::Int16 => i64::from(i16::MAX),
        DType::Int32 => i64::from(i32::MAX),
        _ => i64::MAX,
    };
    if to_i64(limit) > index_max {
        return Err(invalid(
            OP,
            "indices",
            format!(
                "params.shape[{axis}] = {limit} is too large for {} indexing",
                indices.dtype()
            ),
        ));
    }
    let out_shape: Vec<usize> = pshape[..axis]
        .iter()
        .chain(&ishape[bd..])
        .chain(&pshape[axis + 1..])
        .copied()
        .collect();
    let batch = product(&pshape[..bd]);
    let outer = product(&pshape[bd..axis]);
    let inner = product(&pshape[axis + 1..]);
    let total = checked_num_elements(params.dtype(), &out_shape)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    if total == 0 {
        // TensorFlow returns before looking at the indices.
        return Ok(vec![output(
            OP,
            out_shape,
            TensorData::zeros(params.dtype(), 0),
        )?]);
    }
    let rows = idx
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < limit)
                .ok_or_else(|| {
                    invalid(
                        OP,
                        "indices",
                        format!("indices[{k}] = {i} is not in [0, {limit})"),
                    )
                })
        })
        .collect::<Result<Vec<usize>>>()?;
    let runs = GatherRuns {
        batch,
        outer,
        limit,
        inner,
        indices: &rows,
    };
    Ok(vec![build(OP, out_shape, params.data(), &runs)?])
}

// ------------------------------------------------------------------------------- Tile

/// `Tile`: the input repeated `multiples[i]` times along dimension `i` (`multiples` an
/// int32/int64 vector of the input's rank, each >= 0).
pub fn tile(input: &Tensor, multiples: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Tile";
    let m = index_values(OP, "multiples", multiples, INT32_64, "int32 or int64")?;
    let shape = input.shape();
    let rank = shape.len();
    if multiples.shape().len() != 1 || m.len() != rank {
        return Err(KernelError::InputShape {
            op: OP,
            input: "multiples",
            shape: multiples.shape().to_vec(),
            reason: "must be a vector as long as the input's rank",
        });
    }
    if rank == 0 {
        return Ok(vec![input.clone()]);
    }
    let mut reps = Vec::with_capacity(rank);
    let mut out_shape = Vec::with_capacity(rank);
    for (i, (&mi, &d)) in m.iter().zip(shape).enumerate() {
        let r = usize::try_from(mi).map_err(|_| {
            invalid(
                OP,
                "multiples",
                format!("multiples[{i}] = {mi} must be >= 0"),
            )
        })?;
        let dim = d
            .checked_mul(r)
            .filter(|&x| i64::try_from(x).is_ok())
            .ok_or_else(|| invalid(OP, "multiples", format!("dimension {i} overflows")))?;
        reps.push(r);
        out_shape.push(dim);
    }
    if out_shape == shape {
        return Ok(vec![input.clone()]);
    }
    let total = checked_num_elements(input.dtype(), &out_shape)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    if total == 0 {
        return Ok(vec![output(
            OP,
            out_shape,
            TensorData::zeros(input.dtype(), 0),
        )?]);
    }
    if input.dtype() == DType::UInt16 {
        return Err(KernelError::InputDtype {
            op: OP,
            input: "input",
            expected: "a dtype other than uint16 (TensorFlow has no uint16 Tile kernel)",
            actual: DType::UInt16,
        });
    }
    // Dimension i of the output is (repetition, index) with steps (0, stride_i).
    let in_strides = row_major_strides(shape);
    let mut counts = Vec::with_capacity(2 * rank);
    let mut steps = Vec::with_capacity(2 * rank);
    for ((&r, &d), &st) in reps.iter().zip(shape).zip(&in_strides) {
        counts.extend([r, d]);
        steps.extend([0, st]);
    }
    let view = View {
        base: 0,
        steps,
        counts,
    };
    Ok(vec![build(OP, out_shape, input.data(), &view)?])
}

// -------------------------------------------------------------------------- Transpose

/// The low 32 bits of `v` as an int32: what TensorFlow's `Transpose` makes of an int64 perm
/// entry.
fn low_i32(v: i64) -> i32 {
    let [a, b, c, d, ..] = v.to_le_bytes();
    i32::from_le_bytes([a, b, c, d])
}

/// `Transpose`: output dimension `i` is input dimension `perm[i]` (`perm` an int32/int64
/// permutation of `0..rank`).
pub fn transpose(x: &Tensor, perm: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Transpose";
    if perm.shape().len() != 1 {
        return Err(KernelError::InputShape {
            op: OP,
            input: "perm",
            shape: perm.shape().to_vec(),
            reason: "must be a vector",
        });
    }
    let p: Vec<i32> = index_values(OP, "perm", perm, INT32_64, "int32 or int64")?
        .into_iter()
        .map(low_i32)
        .collect();
    let shape = x.shape();
    let rank = shape.len();
    if p.len() != rank {
        return Err(invalid(
            OP,
            "perm",
            format!("expected a vector of size {rank}, got {}", p.len()),
        ));
    }
    let in_strides = row_major_strides(shape);
    let mut seen = vec![false; rank];
    let mut out_shape = Vec::with_capacity(rank);
    let mut steps = Vec::with_capacity(rank);
    for &d in &p {
        let Some(k) = usize::try_from(d).ok().filter(|&k| k < rank) else {
            return Err(invalid(
                OP,
                "perm",
                format!("{d} is out of range [0 .. {rank})"),
            ));
        };
        seen[k] = true;
        out_shape.push(shape[k]);
        steps.push(in_strides[k]);
    }
    if let Some(missing) = seen.iter().position(|&s| !s) {
        return Err(invalid(
            OP,
            "perm",
            format!("{missing} is missing from {p:?}"),
        ));
    }
    if p.iter()
        .enumerate()
        .all(|(i, &d)| usize::try_from(d) == Ok(i))
    {
        return Ok(vec![x.clone()]);
    }
    let view = View {
        base: 0,
        steps,
        counts: out_shape.clone(),
    };
    Ok(vec![build(OP, out_shape, x.data(), &view)?])
}

// ----------------------------------------------------------------------------- OneHot

/// The one-hot values: `on` where `indices[p, s] == k`, else `off`, in (p, k, s) order.
fn one_hot_values<T: Elem>(
    on: &T,
    off: &T,
    indices: &[i64],
    (prefix, depth, suffix): (usize, usize, usize),
) -> Result<Vec<T>, &'static str> {
    let total = prefix.saturating_mul(depth).saturating_mul(suffix);
    let per = on.heap_bytes().max(off.heap_bytes());
    if per.saturating_mul(u64::try_from(total).unwrap_or(u64::MAX)) > MAX_TENSOR_BYTES {
        return Err("the output's strings would exceed the tensor size limit");
    }
    let mut out = Vec::with_capacity(total);
    for p in 0..prefix {
        let Some(row) = indices.get(p * suffix..(p + 1) * suffix) else {
            return Err("an index is out of range (internal error)");
        };
        for k in 0..depth {
            let k = to_i64(k);
            out.extend(row.iter().map(|&i| if i == k { on } else { off }).cloned());
        }
    }
    Ok(out)
}

/// `OneHot`: a `depth`-long one-hot encoding of each index (uint8, int8, int32 or int64),
/// inserted as dimension `axis` (-1: last); out-of-range and negative indices give rows of
/// `off_value`. `depth` is an int32 scalar, `on_value` and `off_value` scalars of one dtype.
pub fn one_hot(
    indices: &Tensor,
    depth: &Tensor,
    on_value: &Tensor,
    off_value: &Tensor,
    axis: i64,
) -> Result<Vec<Tensor>> {
    const OP: &str = "OneHot";
    let idx: Vec<i64> = match indices.data() {
        TensorData::UInt8(v) => v.iter().map(|&x| i64::from(x)).collect(),
        TensorData::Int8(v) => v.iter().map(|&x| i64::from(x)).collect(),
        TensorData::Int32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        TensorData::Int64(v) => v.clone(),
        _ => {
            return Err(KernelError::InputDtype {
                op: OP,
                input: "indices",
                expected: "uint8, int8, int32 or int64",
                actual: indices.dtype(),
            })
        }
    };
    let ishape = indices.shape();
    let out_rank = ishape.len() + 1;
    let axis = match i32::try_from(axis) {
        Ok(-1) => ishape.len(),
        Ok(a) => usize::try_from(a)
            .ok()
            .filter(|&a| a < out_rank)
            .ok_or_else(|| KernelError::InvalidAttr {
                op: OP,
                attr: "axis",
                value: axis.to_string(),
                reason: "must be -1 or in [0, rank(indices) + 1)",
            })?,
        Err(_) => {
            return Err(KernelError::InvalidAttr {
                op: OP,
                attr: "axis",
                value: axis.to_string(),
                reason: "must fit in an int32",
            })
        }
    };
    for (name, t) in [
        ("depth", depth),
        ("on_value", on_value),
        ("off_value", off_value),
    ] {
        if !t.shape().is_empty() {
            return Err(KernelError::InputShape {
                op: OP,
                input: name,
                shape: t.shape().to_vec(),
                reason: "must be a scalar",
            });
        }
    }
    let TensorData::Int32(d) = depth.data() else {
        return Err(KernelError::InputDtype {
            op: OP,
            input: "depth",
            expected: "int32",
            actual: depth.dtype(),
        });
    };
    same_dtype(OP, "off_value", off_value, on_value)?;
    let Some(depth) = d.first().and_then(|&d| usize::try_from(d).ok()) else {
        return Err(invalid(
            OP,
            "depth",
            format!("depth must be non-negative, got {d:?}"),
        ));
    };
    let mut out_shape = ishape.to_vec();
    out_shape.insert(axis, depth);
    checked_num_elements(on_value.dtype(), &out_shape)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let prefix = product(&ishape[..axis]);
    let suffix = product(&ishape[axis..]);
    let dims = (prefix, depth, suffix);
    macro_rules! pairs {
        ($($variant:ident),*) => {
            match (on_value.data(), off_value.data()) {
                $((TensorData::$variant(on), TensorData::$variant(off)) => {
                    match (on.first(), off.first()) {
                        (Some(on), Some(off)) => {
                            one_hot_values(on, off, &idx, dims).map(TensorData::$variant)
                        }
                        _ => Err("on_value and off_value must hold one value"),
                    }
                })*
                _ => Err("on_value and off_value must have one dtype"),
            }
        };
    }
    let data = pairs!(
        Bool, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64, Float16, BFloat16, Float32,
        Float64, String
    )
    .map_err(|reason| invalid(OP, "on_value", reason))?;
    Ok(vec![output(OP, out_shape, data)?])
}

// -------------------------------------------------------------------------- IdentityN

/// `IdentityN`: its inputs, unchanged (at least one, as TensorFlow's `T` attribute requires).
pub fn identity_n(inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    if inputs.is_empty() {
        return Err(KernelError::InvalidAttr {
            op: "IdentityN",
            attr: "T",
            value: "[]".into(),
            reason: "must list at least one dtype",
        });
    }
    Ok(inputs.iter().map(|&t| t.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(shape: Vec<usize>, v: Vec<i32>) -> Tensor {
        Tensor::new(shape, TensorData::Int32(v)).expect("sized")
    }

    #[test]
    fn view_copies_runs_and_elements() {
        let x = ints(vec![2, 3], vec![0, 1, 2, 3, 4, 5]);
        let t = transpose(&x, &ints(vec![2], vec![1, 0])).expect("ok");
        assert_eq!(t[0].data(), &TensorData::Int32(vec![0, 3, 1, 4, 2, 5]));
        let t = tile(&x, &ints(vec![2], vec![1, 2])).expect("ok");
        assert_eq!(t[0].shape(), &[2, 6]);
        assert_eq!(
            t[0].data(),
            &TensorData::Int32(vec![0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5])
        );
    }

    #[test]
    fn low_i32_keeps_the_low_bits() {
        assert_eq!(low_i32((1 << 32) + 1), 1);
        assert_eq!(low_i32(-1), -1);
        assert_eq!(low_i32(1 << 31), i32::MIN);
    }
}
