//! Sparse segment reductions: `SparseSegmentSum`, `SparseSegmentMean`, `SparseSegmentSqrtN`
//! and their `WithNumSegments` forms, as TensorFlow 2.18's CPU kernel
//! (`SparseSegmentReductionOpBase`) computes them: row `indices[i]` of `data` is reduced
//! into output row `segment_ids[i]`.
//!
//! - Output rows: `num_segments`, or the last segment id + 1; rows no id names hold 0.
//! - A segment of one row is that row, copied as it is. A longer segment of `n` rows first
//!   adds `n % 8` rows (8 when that is 0, 9 when it is 1) left to right and multiplies the
//!   sum by the scale, then adds each further group of 8 rows (summed left to right first).
//!   The scale is `1 / n` (mean) or `1 / sqrt(n)` (sqrtn) in the data's type when `n < 10`,
//!   else 1, and a segment of 10 rows or more is divided by `n` (or `sqrt(n)`) at the end.
//! - Errors are TensorFlow's, checked in its order: an index outside the data's rows is
//!   `Bad: indices[i] == v out of range [0, rows)`; a segment id outside the output is
//!   `Segment id s out of range [0, rows), possibly because 'segment_ids' input is not
//!   sorted.`; decreasing ids are `segment ids are not increasing`.

use super::{dtype_error, output, Float, Int, KernelError, Result};
use crate::tensor::{Tensor, TensorData};

/// The reductions of the sparse segment ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseSegmentOp {
    Sum,
    Mean,
    SqrtN,
}

impl SparseSegmentOp {
    /// TensorFlow's op name.
    pub fn name(self, with_num_segments: bool) -> &'static str {
        match (self, with_num_segments) {
            (SparseSegmentOp::Sum, false) => "SparseSegmentSum",
            (SparseSegmentOp::Mean, false) => "SparseSegmentMean",
            (SparseSegmentOp::SqrtN, false) => "SparseSegmentSqrtN",
            (SparseSegmentOp::Sum, true) => "SparseSegmentSumWithNumSegments",
            (SparseSegmentOp::Mean, true) => "SparseSegmentMeanWithNumSegments",
            (SparseSegmentOp::SqrtN, true) => "SparseSegmentSqrtNWithNumSegments",
        }
    }
}

/// An element type the ops reduce.
trait Element: Copy {
    const ZERO: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    /// `T(v)` for the scale (floats only; integers only sum).
    fn from_f64(v: f64) -> Self;
}

macro_rules! float_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const ZERO: Self = 0.0;
            fn add(self, o: Self) -> Self {
                Float::add(self, o)
            }
            fn mul(self, o: Self) -> Self {
                Float::mul(self, o)
            }
            fn div(self, o: Self) -> Self {
                Float::div(self, o)
            }
            // The cast of a count or its square root, as C++'s `T(x)`.
            #[allow(clippy::cast_possible_truncation)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    )*};
}
float_element!(f32, f64);

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const ZERO: Self = 0;
            fn add(self, o: Self) -> Self {
                Int::add(self, o)
            }
            fn mul(self, o: Self) -> Self {
                Int::mul(self, o)
            }
            // Integers only sum (TensorFlow registers Mean and SqrtN for floats): the scale is
            // always 1 and nothing is divided.
            fn div(self, _o: Self) -> Self {
                self
            }
            fn from_f64(_v: f64) -> Self {
                1
            }
        }
    )*};
}
int_element!(i8, i16, i32, i64, u8, u16, u32, u64);

fn invalid(op: &'static str, input: &'static str, reason: String) -> KernelError {
    KernelError::InvalidInput { op, input, reason }
}

fn ints(op: &'static str, input: &'static str, t: &Tensor) -> Result<Vec<i64>> {
    match t.data() {
        TensorData::Int32(v) => Ok(v.iter().map(|&x| i64::from(x)).collect()),
        TensorData::Int64(v) => Ok(v.clone()),
        _ => Err(dtype_error(op, input, "int32 or int64", t)),
    }
}

fn vector(op: &'static str, input: &'static str, t: &Tensor, reason: &'static str) -> Result<()> {
    if t.shape().len() == 1 {
        Ok(())
    } else {
        Err(invalid(op, input, reason.into()))
    }
}

/// `SparseSegmentSum` (and Mean, SqrtN; `num_segments` for the `WithNumSegments` forms).
pub fn sparse_segment(
    op: SparseSegmentOp,
    data: &Tensor,
    indices: &Tensor,
    segment_ids: &Tensor,
    num_segments: Option<&Tensor>,
) -> Result<Vec<Tensor>> {
    let name = op.name(num_segments.is_some());
    let mut rows_out: Option<i64> = None;
    if let Some(n) = num_segments {
        if !n.shape().is_empty() {
            return Err(invalid(
                name,
                "num_segments",
                format!("num_segments should be a scalar, not shape {:?}", n.shape()),
            ));
        }
        let v = ints(name, "num_segments", n)?.first().copied().unwrap_or(0);
        if v < 0 {
            return Err(invalid(
                name,
                "num_segments",
                "segment ids must be >= 0".into(),
            ));
        }
        rows_out = Some(v);
    }
    vector(name, "indices", indices, "indices should be a vector.")?;
    vector(
        name,
        "segment_ids",
        segment_ids,
        "segment_ids should be a vector.",
    )?;
    let idx = ints(name, "indices", indices)?;
    let seg = ints(name, "segment_ids", segment_ids)?;
    if idx.len() != seg.len() {
        return Err(invalid(
            name,
            "segment_ids",
            "segment_ids and indices should have same size.".into(),
        ));
    }
    let Some((&rows_in, rest)) = data.shape().split_first() else {
        return Err(KernelError::InputShape {
            op: name,
            input: "data",
            shape: Vec::new(),
            reason: "the data must have at least one dimension",
        });
    };
    let last_plus_one = seg.last().map_or(0, |&s| s.saturating_add(1));
    let rows = match rows_out {
        Some(n) if n < last_plus_one => {
            return Err(invalid(
                name,
                "num_segments",
                "segment ids must be < num_segments".into(),
            ))
        }
        Some(n) => n,
        None => last_plus_one,
    };
    if rows < 0 || (!idx.is_empty() && rows == 0) {
        return Err(invalid(
            name,
            "segment_ids",
            "segment ids must be >= 0".into(),
        ));
    }
    let rows = usize::try_from(rows).unwrap_or(usize::MAX);
    let width: usize = rest.iter().product();
    // Bounded by the data: a huge num_segments is refused rather than allocated.
    if rows.saturating_mul(width) > data.num_elements().max(1).saturating_mul(1 << 10) + (1 << 20) {
        return Err(invalid(
            name,
            "num_segments",
            format!("{rows} segments of {width} values is more than Lode allocates for this data"),
        ));
    }
    let args = Args {
        op,
        name,
        idx: &idx,
        seg: &seg,
        rows,
        rows_in,
        width,
    };
    let values = match data.data() {
        TensorData::Float32(v) => TensorData::Float32(reduce(v, &args)?),
        TensorData::Float64(v) => TensorData::Float64(reduce(v, &args)?),
        d if op == SparseSegmentOp::Sum => match d {
            TensorData::Int8(v) => TensorData::Int8(reduce(v, &args)?),
            TensorData::Int16(v) => TensorData::Int16(reduce(v, &args)?),
            TensorData::Int32(v) => TensorData::Int32(reduce(v, &args)?),
            TensorData::Int64(v) => TensorData::Int64(reduce(v, &args)?),
            TensorData::UInt8(v) => TensorData::UInt8(reduce(v, &args)?),
            TensorData::UInt16(v) => TensorData::UInt16(reduce(v, &args)?),
            TensorData::UInt32(v) => TensorData::UInt32(reduce(v, &args)?),
            TensorData::UInt64(v) => TensorData::UInt64(reduce(v, &args)?),
            _ => return Err(dtype_error(name, "data", "a real number dtype", data)),
        },
        _ => return Err(dtype_error(name, "data", "float or double", data)),
    };
    let mut shape = vec![rows];
    shape.extend_from_slice(rest);
    Ok(vec![output(name, shape, values)?])
}

struct Args<'a> {
    op: SparseSegmentOp,
    name: &'static str,
    idx: &'a [i64],
    seg: &'a [i64],
    rows: usize,
    rows_in: usize,
    width: usize,
}

fn reduce<T: Element>(xs: &[T], a: &Args<'_>) -> Result<Vec<T>> {
    let mut out = vec![T::ZERO; a.rows * a.width];
    let n = a.idx.len();
    if n == 0 {
        return Ok(out);
    }
    let mut start = 0;
    while start < n {
        let id = a.seg[start];
        let mut end = start + 1;
        while end < n && a.seg[end] == id {
            end += 1;
        }
        if end < n && a.seg[end] < id {
            return Err(invalid(
                a.name,
                "segment_ids",
                "segment ids are not increasing".into(),
            ));
        }
        let row = usize::try_from(id)
            .ok()
            .filter(|&r| r < a.rows)
            .ok_or_else(|| {
                invalid(
                    a.name,
                    "segment_ids",
                    format!(
                        "Segment id {id} out of range [0, {}), possibly because 'segment_ids' \
                         input is not sorted.",
                        a.rows
                    ),
                )
            })?;
        let group = &a.idx[start..end];
        let source = |k: usize| -> Result<&[T]> {
            let v = group[k];
            usize::try_from(v)
                .ok()
                .filter(|&r| r < a.rows_in)
                .map(|r| &xs[r * a.width..(r + 1) * a.width])
                .ok_or_else(|| {
                    invalid(
                        a.name,
                        "indices",
                        format!(
                            "Bad: indices[{}] == {v} out of range [0, {})",
                            start + k,
                            a.rows_in
                        ),
                    )
                })
        };
        let target = &mut out[row * a.width..(row + 1) * a.width];
        segment_row(a.op, group.len(), &source, target)?;
        start = end;
    }
    Ok(out)
}

/// One output row from the `num` source rows of its segment, in TensorFlow's order.
fn segment_row<'x, T: Element>(
    op: SparseSegmentOp,
    num: usize,
    source: &dyn Fn(usize) -> Result<&'x [T]>,
    target: &mut [T],
) -> Result<()> {
    if num == 1 {
        target.copy_from_slice(source(0)?);
        return Ok(());
    }
    #[allow(clippy::cast_precision_loss)] // a count of rows, as C++ converts it
    let count = num as f64;
    let scale = if num < 10 {
        match op {
            SparseSegmentOp::Sum => T::from_f64(1.0),
            SparseSegmentOp::Mean => T::from_f64(1.0).div(T::from_f64(count)),
            SparseSegmentOp::SqrtN => T::from_f64(1.0).div(T::from_f64(count.sqrt())),
        }
    } else {
        T::from_f64(1.0)
    };
    let first = match num & 7 {
        0 => 8,
        1 => 9,
        r => r,
    };
    // Every index of a group is checked before any row is read, as TensorFlow's macros do.
    let rows: Vec<&[T]> = (0..first).map(source).collect::<Result<_>>()?;
    for (j, o) in target.iter_mut().enumerate() {
        let mut acc = rows[0][j];
        for r in &rows[1..] {
            acc = acc.add(r[j]);
        }
        *o = acc.mul(scale);
    }
    let mut r = first;
    while r < num {
        let rows: Vec<&[T]> = (r..r + 8).map(source).collect::<Result<_>>()?;
        for (j, o) in target.iter_mut().enumerate() {
            let mut acc = rows[0][j];
            for row in &rows[1..] {
                acc = acc.add(row[j]);
            }
            *o = o.add(acc);
        }
        r += 8;
    }
    if num >= 10 {
        let divisor = match op {
            SparseSegmentOp::Sum => None,
            SparseSegmentOp::Mean => Some(T::from_f64(count)),
            SparseSegmentOp::SqrtN => Some(T::from_f64(count.sqrt())),
        };
        if let Some(d) = divisor {
            for o in target.iter_mut() {
                *o = o.div(d);
            }
        }
    }
    Ok(())
}
