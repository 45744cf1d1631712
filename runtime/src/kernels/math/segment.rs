//! Segment reductions: `SegmentSum`, `SegmentProd`, `SegmentMax`, `SegmentMin`, `SegmentMean`
//! (sorted segment ids) and `UnsortedSegmentSum`, `UnsortedSegmentProd`, `UnsortedSegmentMax`,
//! `UnsortedSegmentMin`, as TensorFlow 2.18's CPU kernels compute them
//! (`segment_reduction_ops_impl.h`):
//! - sorted: the output has `last id + 1` rows; a run of one row is copied as is, a longer run
//!   is reduced row after row; a row no id names holds 0 (1 for a product); ids that decrease
//!   or are negative are an error.
//! - unsorted: the output has `num_segments` rows, each starting at the reduction's identity
//!   (0, 1, the type's lowest or highest finite value); rows of the data are folded in in index order; a
//!   negative id drops its row; an id at or past `num_segments` is an error.
//! - a float maximum (minimum) does not propagate NaN: `acc < x ? x : acc`.

use super::{dtype_error, output, Float, Int, KernelError, Result};
use crate::tensor::{Tensor, TensorData};

/// The reductions of the segment ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentOp {
    Sum,
    Prod,
    Max,
    Min,
    /// Sorted ids only.
    Mean,
}

impl SegmentOp {
    fn name(self, sorted: bool) -> &'static str {
        match (self, sorted) {
            (SegmentOp::Sum, true) => "SegmentSum",
            (SegmentOp::Prod, true) => "SegmentProd",
            (SegmentOp::Max, true) => "SegmentMax",
            (SegmentOp::Min, true) => "SegmentMin",
            (SegmentOp::Mean, _) => "SegmentMean",
            (SegmentOp::Sum, false) => "UnsortedSegmentSum",
            (SegmentOp::Prod, false) => "UnsortedSegmentProd",
            (SegmentOp::Max, false) => "UnsortedSegmentMax",
            (SegmentOp::Min, false) => "UnsortedSegmentMin",
        }
    }
}

/// An element type the segment ops reduce: the reducer, its identity, and the value of a
/// sorted op's empty segment.
trait Element: Copy {
    fn reducer(op: SegmentOp) -> fn(Self, Self) -> Self;
    fn identity(op: SegmentOp) -> Self;
    fn empty(op: SegmentOp) -> Self;
    fn mean(sum: Self, count: usize) -> Self;
}

fn float_reducer<T: Float>(op: SegmentOp) -> fn(T, T) -> T {
    match op {
        SegmentOp::Sum | SegmentOp::Mean => T::add,
        SegmentOp::Prod => T::mul,
        // Eigen's MaxReducer/cwiseMax without NaN propagation: `acc < x ? x : acc`, so a NaN
        // is kept only while nothing compares above (below) it.
        // Flushed to zero like every float op under TensorFlow's denormal mode.
        SegmentOp::Max => |acc, x| {
            let (acc, x) = (acc.daz(), x.daz());
            if acc < x {
                x
            } else {
                acc
            }
        },
        SegmentOp::Min => |acc, x| {
            let (acc, x) = (acc.daz(), x.daz());
            if x < acc {
                x
            } else {
                acc
            }
        },
    }
}

macro_rules! float_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            fn reducer(op: SegmentOp) -> fn(Self, Self) -> Self {
                float_reducer::<$t>(op)
            }
            fn identity(op: SegmentOp) -> Self {
                match op {
                    SegmentOp::Prod => 1.0,
                    // `lowest()` and `highest()`, not infinities, as TensorFlow's reducers.
                    SegmentOp::Max => <$t>::MIN,
                    SegmentOp::Min => <$t>::MAX,
                    SegmentOp::Sum | SegmentOp::Mean => 0.0,
                }
            }
            fn empty(op: SegmentOp) -> Self {
                if op == SegmentOp::Prod { 1.0 } else { 0.0 }
            }
            fn mean(sum: Self, count: usize) -> Self {
                sum.div(<$t as Float>::from_count(count))
            }
        }
    )*};
}
float_element!(f32, f64);

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            fn reducer(op: SegmentOp) -> fn(Self, Self) -> Self {
                match op {
                    SegmentOp::Sum | SegmentOp::Mean => <$t as Int>::add,
                    SegmentOp::Prod => <$t as Int>::mul,
                    SegmentOp::Max => Ord::max,
                    SegmentOp::Min => Ord::min,
                }
            }
            fn identity(op: SegmentOp) -> Self {
                match op {
                    SegmentOp::Prod => 1,
                    SegmentOp::Max => <$t>::MIN,
                    SegmentOp::Min => <$t>::MAX,
                    SegmentOp::Sum | SegmentOp::Mean => 0,
                }
            }
            fn empty(op: SegmentOp) -> Self {
                if op == SegmentOp::Prod { 1 } else { 0 }
            }
            fn mean(sum: Self, count: usize) -> Self {
                let count = <$t>::try_from(count).unwrap_or(<$t>::MAX);
                if count == 0 { sum } else { sum.wrapping_div(count) }
            }
        }
    )*};
}
int_element!(i8, i16, i32, i64, u8, u16, u32, u64);

/// Integer ids (int32 or int64) as i64.
fn ids_of(op: &'static str, input: &'static str, t: &Tensor) -> Result<Vec<i64>> {
    match t.data() {
        TensorData::Int32(v) => Ok(v.iter().map(|&x| i64::from(x)).collect()),
        TensorData::Int64(v) => Ok(v.clone()),
        _ => Err(dtype_error(op, input, "int32 or int64", t)),
    }
}

fn invalid(op: &'static str, input: &'static str, reason: String) -> KernelError {
    KernelError::InvalidInput { op, input, reason }
}

/// Dispatches a generic function over the numeric dtypes of `$data`.
macro_rules! numeric {
    ($op:expr, $data:expr, $f:ident ( $($arg:expr),* )) => {
        match $data.data() {
            TensorData::Float32(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::Float32(v), s)),
            TensorData::Float64(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::Float64(v), s)),
            TensorData::Int8(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::Int8(v), s)),
            TensorData::Int16(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::Int16(v), s)),
            TensorData::Int32(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::Int32(v), s)),
            TensorData::Int64(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::Int64(v), s)),
            TensorData::UInt8(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::UInt8(v), s)),
            TensorData::UInt16(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::UInt16(v), s)),
            TensorData::UInt32(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::UInt32(v), s)),
            TensorData::UInt64(v) => $f(v, $($arg),*).map(|(v, s)| (TensorData::UInt64(v), s)),
            _ => Err(dtype_error($op, "data", "a real number dtype", $data)),
        }
    };
}

/// `SegmentSum` and the other sorted segment reductions of `data` by `segment_ids`.
pub fn segment(op: SegmentOp, data: &Tensor, segment_ids: &Tensor) -> Result<Vec<Tensor>> {
    let name = op.name(true);
    let ids = ids_of(name, "segment_ids", segment_ids)?;
    if segment_ids.shape().len() != 1 {
        return Err(KernelError::InputShape {
            op: name,
            input: "segment_ids",
            shape: segment_ids.shape().to_vec(),
            reason: "segment_ids should be a vector",
        });
    }
    let Some((&rows_in, rest)) = data.shape().split_first() else {
        return Err(KernelError::InputShape {
            op: name,
            input: "data",
            shape: Vec::new(),
            reason: "the data must have at least one dimension",
        });
    };
    if ids.len() != rows_in {
        return Err(invalid(
            name,
            "segment_ids",
            format!(
                "segment_ids should be the same size as dimension 0 of input: {} vs {rows_in}",
                ids.len()
            ),
        ));
    }
    let width: usize = rest.iter().product();
    let (values, rows) = numeric!(name, data, sorted_rows(op, &ids, width))?;
    let mut shape = vec![rows];
    shape.extend_from_slice(rest);
    Ok(vec![output(name, shape, values)?])
}

fn sorted_rows<T: Element>(
    xs: &[T],
    op: SegmentOp,
    ids: &[i64],
    width: usize,
) -> Result<(Vec<T>, usize)> {
    let name = op.name(true);
    let Some(&last) = ids.last() else {
        return Ok((Vec::new(), 0));
    };
    let rows = last
        .checked_add(1)
        .and_then(|r| usize::try_from(r).ok())
        .ok_or_else(|| invalid(name, "segment_ids", "segment ids must be >= 0".into()))?;
    let len = rows
        .checked_mul(width)
        .filter(|&n| n <= xs.len().max(rows))
        .ok_or_else(|| {
            invalid(
                name,
                "segment_ids",
                format!("the last segment id {last} asks for more rows than the data has"),
            )
        })?;
    let mut out = vec![T::empty(op); len];
    let f = T::reducer(op);
    let mut start = 0;
    while start < ids.len() {
        let id = ids[start];
        let mut end = start + 1;
        while end < ids.len() && ids[end] == id {
            end += 1;
        }
        let row = usize::try_from(id).ok().filter(|&r| r < rows).ok_or_else(|| {
            invalid(
                name,
                "segment_ids",
                format!(
                    "Segment id {id} out of range [0, {rows}), possibly because 'segment_ids' input is not sorted"
                ),
            )
        })?;
        if end < ids.len() && ids[end] < id {
            return Err(invalid(
                name,
                "segment_ids",
                "segment ids are not increasing".into(),
            ));
        }
        let target = &mut out[row * width..(row + 1) * width];
        if end - start == 1 {
            target.copy_from_slice(&xs[start * width..end * width]);
        } else {
            target.fill(T::identity(op));
            for r in start..end {
                for (o, &x) in target.iter_mut().zip(&xs[r * width..(r + 1) * width]) {
                    *o = f(*o, x);
                }
            }
            if op == SegmentOp::Mean {
                for o in target.iter_mut() {
                    *o = T::mean(*o, end - start);
                }
            }
        }
        start = end;
    }
    Ok((out, rows))
}

/// `UnsortedSegmentSum` and the other unsorted segment reductions.
pub fn unsorted_segment(
    op: SegmentOp,
    data: &Tensor,
    segment_ids: &Tensor,
    num_segments: &Tensor,
) -> Result<Vec<Tensor>> {
    let name = op.name(false);
    let ids = ids_of(name, "segment_ids", segment_ids)?;
    let n = ids_of(name, "num_segments", num_segments)?;
    let ([segments], []) = (n.as_slice(), num_segments.shape()) else {
        return Err(KernelError::InputShape {
            op: name,
            input: "num_segments",
            shape: num_segments.shape().to_vec(),
            reason: "num_segments should be a scalar",
        });
    };
    let segments = usize::try_from(*segments).map_err(|_| {
        invalid(
            name,
            "num_segments",
            format!("Input num_segments == {segments} must not be negative."),
        )
    })?;
    let prefix = segment_ids.shape();
    if !data.shape().starts_with(prefix) {
        return Err(KernelError::IncompatibleShapes {
            op: name,
            left: "data",
            left_shape: data.shape().to_vec(),
            right: "segment_ids",
            right_shape: prefix.to_vec(),
        });
    }
    let rest = &data.shape()[prefix.len()..];
    let width: usize = rest.iter().product();
    // Bounded by the data: a huge num_segments is refused rather than allocated.
    if segments.saturating_mul(width)
        > data.num_elements().max(1).saturating_mul(1 << 10) + (1 << 20)
    {
        return Err(invalid(
            name,
            "num_segments",
            format!(
                "{segments} segments of {width} values is more than Lode allocates for this data"
            ),
        ));
    }
    let (values, _) = numeric!(name, data, unsorted_rows(op, &ids, segments, width))?;
    let mut shape = vec![segments];
    shape.extend_from_slice(rest);
    Ok(vec![output(name, shape, values)?])
}

fn unsorted_rows<T: Element>(
    xs: &[T],
    op: SegmentOp,
    ids: &[i64],
    segments: usize,
    width: usize,
) -> Result<(Vec<T>, usize)> {
    let name = op.name(false);
    let mut out = vec![T::identity(op); segments * width];
    let f = T::reducer(op);
    for (i, &id) in ids.iter().enumerate() {
        if id < 0 {
            continue;
        }
        let row = usize::try_from(id)
            .ok()
            .filter(|&r| r < segments)
            .ok_or_else(|| {
                invalid(
                    name,
                    "segment_ids",
                    format!("segment_ids[{i}] = {id} is out of range [0, {segments})"),
                )
            })?;
        for (o, &x) in out[row * width..(row + 1) * width]
            .iter_mut()
            .zip(&xs[i * width..(i + 1) * width])
        {
            *o = f(*o, x);
        }
    }
    Ok((out, segments))
}
