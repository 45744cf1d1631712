//! Math kernels: element-wise binary ops with NumPy broadcasting (`Add`, `AddV2`, `Sub`,
//! `Mul`, `RealDiv`, `FloorMod`, `Maximum`, `Minimum`), comparisons, logical ops, `Select`,
//! `SelectV2`, `Where`, the reductions `Sum`, `Prod`, `Mean`, `Cumsum`, and `Neg`.
//!
//! Floats follow TensorFlow 2.18.1's x86-64 CPU kernels bit for bit:
//! - kernels run with denormals flushed to zero: a subnormal input reads as ±0 and a
//!   subnormal result is ±0 (see [`super::cast`]);
//! - integer arithmetic wraps (two's complement); integer `FloorMod` by zero is an error;
//! - a reduction combines in Eigen's order as far as it is known: along the innermost axis
//!   with 8 (float) or 4 (double) lanes of AVX packets in several accumulators (see
//!   `accumulation`), along other axes sequentially. Most golden cases match bit for bit;
//!   the exceptions are listed in the kernel tests (`INEXACT`): 1–2 ulps for some
//!   innermost runs of tens to a hundred elements, and more for long float runs (a
//!   cancelling sum of 9000 floats differs by about 30 ulps), whose order is not found yet.

// Float ↔ count conversions (a Mean's divisor) are the ones TensorFlow performs.
#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

pub mod segment;
pub mod sparse_segment;

use super::{broadcast_index, broadcast_shapes, output, KernelError, Result};
use crate::tensor::{DType, Tensor, TensorData};

// ------------------------------------------------------------------------ element types

/// A float element type as TensorFlow's kernels compute with it (flush-to-zero).
trait Float: Copy + PartialOrd + std::fmt::Debug {
    /// Lanes in one AVX packet.
    const LANES: usize;
    const ZERO: Self;
    const ONE: Self;
    /// The quiet NaN TensorFlow's mean of nothing gives (positive).
    const NAN: Self;
    const INFINITY: Self;
    const NEG_INFINITY: Self;
    fn daz(self) -> Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    /// `fmod` without flushing subnormals.
    fn raw_rem(self, o: Self) -> Self;
    fn is_nan(self) -> bool;
    fn from_count(n: usize) -> Self;
    /// Rounding down, up and the square root of the flushed value, flushed.
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn sqrt(self) -> Self;
}

macro_rules! float_impl {
    ($t:ty, $lanes:expr) => {
        impl Float for $t {
            const LANES: usize = $lanes;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NAN: Self = <$t>::NAN;
            const INFINITY: Self = <$t>::INFINITY;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            fn daz(self) -> Self {
                if self.is_subnormal() {
                    (0.0 as $t).copysign(self)
                } else {
                    self
                }
            }
            fn add(self, o: Self) -> Self {
                (self.daz() + o.daz()).daz()
            }
            fn mul(self, o: Self) -> Self {
                (self.daz() * o.daz()).daz()
            }
            fn sub(self, o: Self) -> Self {
                (self.daz() - o.daz()).daz()
            }
            fn div(self, o: Self) -> Self {
                (self.daz() / o.daz()).daz()
            }
            fn raw_rem(self, o: Self) -> Self {
                // glibc's fmod tests the divisor for zero with a float comparison, which
                // flush-to-zero makes true for a subnormal; the rest is integer arithmetic.
                if o.daz() == 0.0 {
                    self % 0.0
                } else {
                    self % o
                }
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn from_count(n: usize) -> Self {
                n as $t
            }
            fn floor(self) -> Self {
                self.daz().floor().daz()
            }
            fn ceil(self) -> Self {
                self.daz().ceil().daz()
            }
            fn sqrt(self) -> Self {
                self.daz().sqrt().daz()
            }
        }
    };
}
float_impl!(f32, 8);
float_impl!(f64, 4);

/// An integer element type: wrapping arithmetic.
trait Int: Copy + Ord + Default + std::fmt::Debug {
    const ONE: Self;
    const MIN: Self;
    const MAX: Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// `FloorMod`: the remainder with the divisor's sign; `None` for a zero divisor.
    fn floor_mod(self, o: Self) -> Option<Self>;
    /// `FloorDiv`: the quotient rounded toward negative infinity; `None` for a zero divisor.
    fn floor_div(self, o: Self) -> Option<Self>;
    fn to_i128(self) -> i128;
    /// The low bits of `v` (wrapping).
    fn from_i128(v: i128) -> Self;
}

macro_rules! int_impl {
    ($($t:ty),*) => {$(
        impl Int for $t {
            const ONE: Self = 1;
            const MIN: Self = <$t>::MIN;
            const MAX: Self = <$t>::MAX;
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[allow(unused_comparisons)]
            fn floor_mod(self, o: Self) -> Option<Self> {
                if o == 0 {
                    return None;
                }
                let r = self.wrapping_rem(o);
                Some(if r != 0 && ((r < 0) != (o < 0)) { r.wrapping_add(o) } else { r })
            }
            #[allow(unused_comparisons)]
            fn floor_div(self, o: Self) -> Option<Self> {
                if o == 0 {
                    return None;
                }
                let q = self.wrapping_div(o);
                Some(if ((self < 0) != (o < 0)) && q.wrapping_mul(o) != self {
                    q.wrapping_sub(1)
                } else {
                    q
                })
            }
            fn to_i128(self) -> i128 {
                i128::from(self)
            }
            fn from_i128(v: i128) -> Self {
                v as $t
            }
        }
    )*};
}
int_impl!(i8, i16, i32, i64, u8, u16, u32, u64);

/// Dispatches `$body` over the vectors of two inputs of the same integer or float dtype:
/// `$int` for integers (with `$a`, `$b` the slices), `$float` for floats; other dtypes (or
/// a mismatch) fall to `$other`.
macro_rules! numeric2 {
    ($x:expr, $y:expr, ($a:ident, $b:ident, $wrap:ident) => int: $int:expr, float: $float:expr, other: $other:expr) => {
        match ($x, $y) {
            (TensorData::Int8($a), TensorData::Int8($b)) => {
                let $wrap = TensorData::Int8;
                $int
            }
            (TensorData::Int16($a), TensorData::Int16($b)) => {
                let $wrap = TensorData::Int16;
                $int
            }
            (TensorData::Int32($a), TensorData::Int32($b)) => {
                let $wrap = TensorData::Int32;
                $int
            }
            (TensorData::Int64($a), TensorData::Int64($b)) => {
                let $wrap = TensorData::Int64;
                $int
            }
            (TensorData::UInt8($a), TensorData::UInt8($b)) => {
                let $wrap = TensorData::UInt8;
                $int
            }
            (TensorData::UInt16($a), TensorData::UInt16($b)) => {
                let $wrap = TensorData::UInt16;
                $int
            }
            (TensorData::UInt32($a), TensorData::UInt32($b)) => {
                let $wrap = TensorData::UInt32;
                $int
            }
            (TensorData::UInt64($a), TensorData::UInt64($b)) => {
                let $wrap = TensorData::UInt64;
                $int
            }
            (TensorData::Float32($a), TensorData::Float32($b)) => {
                let $wrap = TensorData::Float32;
                $float
            }
            (TensorData::Float64($a), TensorData::Float64($b)) => {
                let $wrap = TensorData::Float64;
                $float
            }
            _ => $other,
        }
    };
}

/// The shapes of a binary op's inputs broadcast together, and each output element's
/// source in `x` and in `y`.
fn broadcast2(
    op: &'static str,
    x: &Tensor,
    y: &Tensor,
) -> Result<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let shape =
        broadcast_shapes(x.shape(), y.shape()).ok_or_else(|| KernelError::IncompatibleShapes {
            op,
            left: "x",
            left_shape: x.shape().to_vec(),
            right: "y",
            right_shape: y.shape().to_vec(),
        })?;
    let ix = broadcast_index(x.shape(), &shape);
    let iy = broadcast_index(y.shape(), &shape);
    Ok((shape, ix, iy))
}

fn zip<T: Copy, U>(a: &[T], b: &[T], ia: &[usize], ib: &[usize], f: impl Fn(T, T) -> U) -> Vec<U> {
    ia.iter().zip(ib).map(|(&i, &j)| f(a[i], b[j])).collect()
}

fn dtype_error(
    op: &'static str,
    input: &'static str,
    expected: &'static str,
    t: &Tensor,
) -> KernelError {
    KernelError::InputDtype {
        op,
        input,
        expected,
        actual: t.dtype(),
    }
}

fn same_dtype(op: &'static str, x: &Tensor, y: &Tensor) -> Result<()> {
    if x.dtype() == y.dtype() {
        Ok(())
    } else {
        Err(KernelError::InputDtype {
            op,
            input: "y",
            expected: x.dtype().name(),
            actual: y.dtype(),
        })
    }
}

// ------------------------------------------------------------------ binary arithmetic

/// The element-wise arithmetic ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `Add` (strings concatenate).
    Add,
    /// `AddV2`: `Add` without strings.
    AddV2,
    Sub,
    Mul,
    /// `RealDiv`: floats only.
    RealDiv,
    /// `FloorMod`: the remainder with the divisor's sign (`fmod` then `+ y` for floats).
    FloorMod,
    /// `FloorDiv`: the quotient rounded down (`floor(x / y)` for floats).
    FloorDiv,
    /// `Maximum`: a NaN operand gives NaN.
    Maximum,
    /// `Minimum`: a NaN operand gives NaN.
    Minimum,
}

impl BinaryOp {
    fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "Add",
            BinaryOp::AddV2 => "AddV2",
            BinaryOp::Sub => "Sub",
            BinaryOp::Mul => "Mul",
            BinaryOp::RealDiv => "RealDiv",
            BinaryOp::FloorMod => "FloorMod",
            BinaryOp::FloorDiv => "FloorDiv",
            BinaryOp::Maximum => "Maximum",
            BinaryOp::Minimum => "Minimum",
        }
    }
}

fn int_op<T: Int>(op: BinaryOp, a: T, b: T) -> Option<T> {
    Some(match op {
        BinaryOp::Add | BinaryOp::AddV2 => a.add(b),
        BinaryOp::Sub => a.sub(b),
        BinaryOp::Mul => a.mul(b),
        BinaryOp::RealDiv => return None,
        BinaryOp::FloorMod => return a.floor_mod(b),
        BinaryOp::FloorDiv => return a.floor_div(b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    })
}

fn float_op<T: Float>(op: BinaryOp, a: T, b: T) -> T {
    match op {
        BinaryOp::Add | BinaryOp::AddV2 => a.add(b),
        BinaryOp::Sub => a.sub(b),
        BinaryOp::Mul => a.mul(b),
        BinaryOp::RealDiv => a.div(b),
        BinaryOp::FloorDiv => a.div(b).floor(),
        BinaryOp::FloorMod => {
            // `std::fmod` is computed in software: it sees and returns subnormals as they
            // are; only the comparisons and the addition run under flush-to-zero.
            let r = a.raw_rem(b);
            if r.daz() != T::ZERO && ((b.daz() < T::ZERO) != (r.daz() < T::ZERO)) {
                r.add(b)
            } else {
                r
            }
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            let (a, b) = (a.daz(), b.daz());
            if a.is_nan() {
                a
            } else if b.is_nan() {
                b
            } else if (op == BinaryOp::Maximum && a > b) || (op == BinaryOp::Minimum && a < b) {
                a
            } else {
                // Equal operands (0.0 and -0.0) give the second.
                b
            }
        }
    }
}

/// An element-wise arithmetic op over `x` and `y` (same dtype, broadcast together).
pub fn binary(op: BinaryOp, x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    let name = op.name();
    same_dtype(name, x, y)?;
    let (shape, ix, iy) = broadcast2(name, x, y)?;
    let data = numeric2!(x.data(), y.data(), (a, b, wrap) =>
        int: {
            let mut out = Vec::with_capacity(ix.len());
            for (&i, &j) in ix.iter().zip(&iy) {
                match int_op(op, a[i], b[j]) {
                    Some(v) => out.push(v),
                    None if matches!(op, BinaryOp::FloorMod | BinaryOp::FloorDiv) => {
                        return Err(KernelError::InvalidAttr {
                            op: name,
                            attr: "y",
                            value: "0".into(),
                            reason: "Integer division by zero",
                        })
                    }
                    None => return Err(dtype_error(name, "x", "float or double", x)),
                }
            }
            wrap(out)
        },
        float: wrap(zip(a, b, &ix, &iy, |p, q| float_op(op, p, q))),
        other: match (x.data(), y.data(), op) {
            (TensorData::String(a), TensorData::String(b), BinaryOp::Add) => {
                TensorData::String(zip_ref(a, b, &ix, &iy))
            }
            _ => return Err(dtype_error(name, "x", "an integer or float dtype", x)),
        }
    );
    Ok(vec![output(name, shape, data)?])
}

fn zip_ref(a: &[Vec<u8>], b: &[Vec<u8>], ia: &[usize], ib: &[usize]) -> Vec<Vec<u8>> {
    ia.iter()
        .zip(ib)
        .map(|(&i, &j)| [a[i].as_slice(), b[j].as_slice()].concat())
        .collect()
}

/// `Add`.
pub fn add(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    binary(BinaryOp::Add, x, y)
}

/// `AddV2`.
pub fn add_v2(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    binary(BinaryOp::AddV2, x, y)
}

/// `Sub`.
pub fn sub(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    binary(BinaryOp::Sub, x, y)
}

/// `Mul`.
pub fn mul(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    binary(BinaryOp::Mul, x, y)
}

/// `RealDiv`.
pub fn real_div(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    binary(BinaryOp::RealDiv, x, y)
}

/// `FloorMod`.
pub fn floor_mod(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    binary(BinaryOp::FloorMod, x, y)
}

/// `Maximum`.
pub fn maximum(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    binary(BinaryOp::Maximum, x, y)
}

/// `Minimum`.
pub fn minimum(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    binary(BinaryOp::Minimum, x, y)
}

// -------------------------------------------------------------------------- comparisons

/// The comparison ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    Equal,
    NotEqual,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
}

impl Comparison {
    fn name(self) -> &'static str {
        match self {
            Comparison::Equal => "Equal",
            Comparison::NotEqual => "NotEqual",
            Comparison::Less => "Less",
            Comparison::LessEqual => "LessEqual",
            Comparison::Greater => "Greater",
            Comparison::GreaterEqual => "GreaterEqual",
        }
    }

    fn apply<T: PartialOrd + ?Sized>(self, a: &T, b: &T) -> bool {
        match self {
            Comparison::Equal => a == b,
            Comparison::NotEqual => a != b,
            Comparison::Less => a < b,
            Comparison::LessEqual => a <= b,
            Comparison::Greater => a > b,
            Comparison::GreaterEqual => a >= b,
        }
    }
}

/// A comparison of `x` and `y` (same dtype, broadcast together), as bools. `Equal` and
/// `NotEqual` also take bools and strings. Floats compare after flushing subnormals.
pub fn compare(op: Comparison, x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    let name = op.name();
    same_dtype(name, x, y)?;
    let (shape, ix, iy) = broadcast2(name, x, y)?;
    let equality = matches!(op, Comparison::Equal | Comparison::NotEqual);
    let out = numeric2!(x.data(), y.data(), (a, b, _wrap) =>
        int: zip(a, b, &ix, &iy, |p, q| op.apply(&p, &q)),
        float: zip(a, b, &ix, &iy, |p, q| op.apply(&p.daz(), &q.daz())),
        other: match (x.data(), y.data()) {
            (TensorData::Bool(a), TensorData::Bool(b)) if equality => {
                zip(a, b, &ix, &iy, |p, q| op.apply(&p, &q))
            }
            (TensorData::String(a), TensorData::String(b)) if equality => ix
                .iter()
                .zip(&iy)
                .map(|(&i, &j)| op.apply(a[i].as_slice(), b[j].as_slice()))
                .collect(),
            _ => return Err(dtype_error(name, "x", "a numeric dtype", x)),
        }
    );
    Ok(vec![output(name, shape, TensorData::Bool(out))?])
}

// ------------------------------------------------------------------------------ logical

fn bools<'a>(op: &'static str, input: &'static str, t: &'a Tensor) -> Result<&'a [bool]> {
    match t.data() {
        TensorData::Bool(v) => Ok(v),
        _ => Err(dtype_error(op, input, "bool", t)),
    }
}

fn logical2(
    op: &'static str,
    x: &Tensor,
    y: &Tensor,
    f: fn(bool, bool) -> bool,
) -> Result<Vec<Tensor>> {
    let (a, b) = (bools(op, "x", x)?, bools(op, "y", y)?);
    let (shape, ix, iy) = broadcast2(op, x, y)?;
    Ok(vec![output(
        op,
        shape,
        TensorData::Bool(zip(a, b, &ix, &iy, f)),
    )?])
}

/// `LogicalAnd`.
pub fn logical_and(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    logical2("LogicalAnd", x, y, |p, q| p && q)
}

/// `LogicalOr`.
pub fn logical_or(x: &Tensor, y: &Tensor) -> Result<Vec<Tensor>> {
    logical2("LogicalOr", x, y, |p, q| p || q)
}

/// `LogicalNot`.
pub fn logical_not(x: &Tensor) -> Result<Vec<Tensor>> {
    let a = bools("LogicalNot", "x", x)?;
    Ok(vec![output(
        "LogicalNot",
        x.shape().to_vec(),
        TensorData::Bool(a.iter().map(|&v| !v).collect()),
    )?])
}

// ------------------------------------------------------------------------ Select, Where

/// Element `src[i]` of `t` where `pick[i]`, else of `e` (same dtype).
fn choose(
    t: &TensorData,
    e: &TensorData,
    pick: &[bool],
    it: &[usize],
    ie: &[usize],
) -> Option<TensorData> {
    let n = t.len();
    let idx: Vec<usize> = pick
        .iter()
        .zip(it.iter().zip(ie))
        .map(|(&p, (&i, &j))| if p { i } else { n + j })
        .collect();
    super::sparse::take_concat(t, e, &idx)
}

/// `SelectV2`: `condition ? t : e`, the three broadcast together.
pub fn select_v2(condition: &Tensor, t: &Tensor, e: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "SelectV2";
    let c = bools(OP, "condition", condition)?;
    same_dtype(OP, t, e)?;
    let incompatible = |l: &Tensor, r: &Tensor| KernelError::IncompatibleShapes {
        op: OP,
        left: "condition",
        left_shape: l.shape().to_vec(),
        right: "t/e",
        right_shape: r.shape().to_vec(),
    };
    let te = broadcast_shapes(t.shape(), e.shape()).ok_or_else(|| incompatible(t, e))?;
    let shape =
        broadcast_shapes(condition.shape(), &te).ok_or_else(|| incompatible(condition, t))?;
    let ic = broadcast_index(condition.shape(), &shape);
    let pick: Vec<bool> = ic.iter().map(|&i| c[i]).collect();
    let data = choose(
        t.data(),
        e.data(),
        &pick,
        &broadcast_index(t.shape(), &shape),
        &broadcast_index(e.shape(), &shape),
    )
    .ok_or_else(|| dtype_error(OP, "e", "t's dtype", e))?;
    Ok(vec![output(OP, shape, data)?])
}

/// `Select`: `t` and `e` of one shape; `condition` of that shape, a scalar, or a vector
/// choosing whole rows of `t`'s first dimension.
pub fn select(condition: &Tensor, t: &Tensor, e: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Select";
    let c = bools(OP, "condition", condition)?;
    same_dtype(OP, t, e)?;
    if t.shape() != e.shape() {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "t",
            left_shape: t.shape().to_vec(),
            right: "e",
            right_shape: e.shape().to_vec(),
        });
    }
    let n = t.num_elements();
    let pick: Vec<bool> = if condition.shape() == t.shape() {
        c.to_vec()
    } else if condition.shape().is_empty() {
        vec![c[0]; n]
    } else if condition.shape().len() == 1 && t.shape().first() == Some(&c.len()) {
        let row = n.checked_div(c.len()).unwrap_or(0);
        (0..n).map(|i| c[i / row.max(1)]).collect()
    } else {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "condition",
            left_shape: condition.shape().to_vec(),
            right: "t",
            right_shape: t.shape().to_vec(),
        });
    };
    let all: Vec<usize> = (0..n).collect();
    let data = choose(t.data(), e.data(), &pick, &all, &all)
        .ok_or_else(|| dtype_error(OP, "e", "t's dtype", e))?;
    Ok(vec![output(OP, t.shape().to_vec(), data)?])
}

/// `Where` (one input): the coordinates of the true (non-zero) elements, row-major, as an
/// int64 `[n, rank]` matrix.
pub fn where_(input: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Where";
    fn nz<T: PartialEq + Default>(v: &[T]) -> Vec<bool> {
        v.iter().map(|x| *x != T::default()).collect()
    }
    let truth = match input.data() {
        TensorData::Bool(v) => v.clone(),
        TensorData::Int8(v) => nz(v),
        TensorData::Int16(v) => nz(v),
        TensorData::Int32(v) => nz(v),
        TensorData::Int64(v) => nz(v),
        TensorData::UInt8(v) => nz(v),
        TensorData::UInt16(v) => nz(v),
        TensorData::UInt32(v) => nz(v),
        TensorData::UInt64(v) => nz(v),
        TensorData::Float32(v) => v.iter().map(|x| x.daz() != 0.0).collect(),
        TensorData::Float64(v) => v.iter().map(|x| x.daz() != 0.0).collect(),
        _ => return Err(dtype_error(OP, "input", "bool or a numeric dtype", input)),
    };
    let shape = input.shape();
    let rank = shape.len();
    if rank == 0 || rank > 8 {
        return Err(KernelError::InputShape {
            op: OP,
            input: "condition",
            shape: shape.to_vec(),
            reason: "WhereOp handles ranks 1 to 8",
        });
    }
    let mut coords = Vec::new();
    let mut count = 0;
    for (flat, _) in truth.iter().enumerate().filter(|(_, &t)| t) {
        let start = coords.len();
        let mut rest = flat;
        coords.resize(start + rank, 0i64);
        for d in (0..rank).rev() {
            coords[start + d] = i64::try_from(rest % shape[d]).unwrap_or(0);
            rest /= shape[d];
        }
        count += 1;
    }
    Ok(vec![output(
        OP,
        vec![count, rank],
        TensorData::Int64(coords),
    )?])
}

// --------------------------------------------------------------------------- reductions

/// The reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    Sum,
    Prod,
    Mean,
    /// `Max`: a NaN propagates (TensorFlow's `MaxReducer<T, PropagateNaN>`); -inf (or the
    /// type's least value) over nothing.
    Max,
    /// `Min`: as `Max`, with +inf (or the type's greatest value) over nothing.
    Min,
    /// `All` of a bool tensor; true over nothing.
    All,
    /// `Any` of a bool tensor; false over nothing.
    Any,
}

impl Reduction {
    fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "Sum",
            Reduction::Prod => "Prod",
            Reduction::Mean => "Mean",
            Reduction::Max => "Max",
            Reduction::Min => "Min",
            Reduction::All => "All",
            Reduction::Any => "Any",
        }
    }
}

/// How TensorFlow's build accumulates an innermost run: `accumulators` packet
/// accumulators fed in turn, combined pairwise (`(p0 + p1) + (p2 + p3)`) before
/// (`late == false`) or after the remaining whole packets are added into `p0`.
#[derive(Clone, Copy)]
struct Accumulation {
    accumulators: usize,
    late: bool,
}

/// The accumulation of each reducer and dtype, found by fitting TensorFlow 2.18.1's
/// outputs (golden cases), not read from its source. The fit is not complete: a float
/// `Prod` over 123 elements matches two accumulators while one over 37 matches one, so
/// some innermost reductions still differ from TensorFlow in their last bits.
fn accumulation(op: Reduction, lanes: usize) -> Accumulation {
    let (accumulators, late) = match (op, lanes) {
        (Reduction::Prod, 8) => (1, false),
        (Reduction::Prod, _) => (4, true),
        (_, 8) => (4, false),
        (_, _) => (2, true),
    };
    Accumulation { accumulators, late }
}

/// Eigen's vectorized `InnerMostDimReducer` over `xs[first..first + n]`, with `op` the
/// reducer's binary op and `init` its identity, accumulated as `how` says; the remaining
/// elements go sequentially into a scalar and the result is `scalar + hsum(p0)`, the
/// horizontal sum folding the upper half of the lanes onto the lower half.
fn inner_reduce<T: Float>(
    xs: &[T],
    first: usize,
    n: usize,
    init: T,
    op: fn(T, T) -> T,
    how: Accumulation,
) -> T {
    let p = T::LANES;
    // Eigen's tree reduction: a run longer than `LEAF_SIZE` packets is split in two halves
    // (the split aligned to a packet boundary of the whole tensor), each reduced the same way,
    // and the halves combined in a scalar accumulator.
    const LEAF_SIZE: usize = 1024;
    if n > p * LEAF_SIZE {
        let split = (first + n.div_ceil(2)).div_ceil(p) * p;
        let left = (split - first).min(n);
        let mut accum = op(init, inner_reduce(xs, first, left, init, op, how));
        if left < n {
            accum = op(accum, inner_reduce(xs, split, n - left, init, op, how));
        }
        return accum;
    }
    let k = how.accumulators;
    let xs = &xs[first..first + n];
    let mut acc = vec![vec![init; p]; k];
    let lanes = |a: &[T], b: &[T]| -> Vec<T> { a.iter().zip(b).map(|(&x, &y)| op(x, y)).collect() };
    let blocks = n / (k * p) * k * p;
    for block in xs[..blocks].chunks_exact(k * p) {
        for (a, packet) in acc.iter_mut().zip(block.chunks_exact(p)) {
            for (a, &x) in a.iter_mut().zip(packet) {
                *a = op(*a, x);
            }
        }
    }
    let combine = |acc: &mut Vec<Vec<T>>| {
        if acc.len() == 4 {
            acc[0] = lanes(&acc[0], &acc[1]);
            acc[2] = lanes(&acc[2], &acc[3]);
            acc[0] = lanes(&acc[0], &acc[2]);
        } else if acc.len() == 2 {
            acc[0] = lanes(&acc[0], &acc[1]);
        }
    };
    if !how.late {
        combine(&mut acc);
    }
    let whole = n / p * p;
    for packet in xs[blocks..whole].chunks_exact(p) {
        for (a, &x) in acc[0].iter_mut().zip(packet) {
            *a = op(*a, x);
        }
    }
    if how.late {
        combine(&mut acc);
    }
    let scalar = xs[whole..].iter().fold(init, |a, &x| op(a, x));
    let lanes = &mut acc[0];
    let mut width = p;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] = op(lanes[l], lanes[l + width]);
        }
    }
    op(scalar, lanes[0])
}

/// TensorFlow's `ReductionHelper::Simplify`: size-1 dimensions dropped, runs of reduced
/// and of kept dimensions merged. Returns the dimensions and whether the first is reduced.
fn simplify(shape: &[usize], reduced: &[bool]) -> (Vec<usize>, bool) {
    let mut dims: Vec<usize> = Vec::new();
    let mut flags: Vec<bool> = Vec::new();
    for (&d, &r) in shape.iter().zip(reduced) {
        if d == 1 {
            continue;
        }
        if flags.last() == Some(&r) {
            if let Some(last) = dims.last_mut() {
                *last *= d;
            }
        } else {
            dims.push(d);
            flags.push(r);
        }
    }
    let first = flags.first().copied().unwrap_or(false);
    (dims, first)
}

/// Reduces `xs` (of simplified `dims`, the first reduced iff `reduce_first`) in TensorFlow's
/// order. `inner` reduces a contiguous run; `seq` folds one element into an accumulator.
fn reduce_in_order<T: Copy>(
    xs: &[T],
    dims: &[usize],
    reduce_first: bool,
    init: T,
    seq: fn(T, T) -> T,
    inner: &dyn Fn(&[T], usize, usize) -> T,
) -> Vec<T> {
    let reduced_at = |i: usize| i.is_multiple_of(2) == reduce_first;
    match (dims.len(), reduce_first) {
        (0, _) | (1, false) => xs.to_vec(),
        (1, true) => vec![inner(xs, 0, xs.len())],
        (2, true) => {
            let (x, y) = (dims[0], dims[1]);
            (0..y)
                .map(|j| (0..x).fold(init, |a, i| seq(a, xs[i * y + j])))
                .collect()
        }
        (2, false) => {
            let (x, y) = (dims[0], dims[1]);
            (0..x).map(|i| inner(xs, i * y, y)).collect()
        }
        (3, false) => {
            let (x, y, z) = (dims[0], dims[1], dims[2]);
            let mut out = Vec::with_capacity(x * z);
            for i in 0..x {
                for k in 0..z {
                    out.push((0..y).fold(init, |a, j| seq(a, xs[(i * y + j) * z + k])));
                }
            }
            out
        }
        (3, true) => {
            // Eigen's GenericDimReducer: the last reduced dimension outermost.
            let (x, y, z) = (dims[0], dims[1], dims[2]);
            (0..y)
                .map(|j| {
                    let mut a = init;
                    for k in 0..z {
                        for i in 0..x {
                            a = seq(a, xs[(i * y + j) * z + k]);
                        }
                    }
                    a
                })
                .collect()
        }
        _ => {
            // Transposed so that the reduced dimensions come last, then reduced row by row.
            let kept: Vec<usize> = (0..dims.len()).filter(|&i| !reduced_at(i)).collect();
            let red: Vec<usize> = (0..dims.len()).filter(|&i| reduced_at(i)).collect();
            let mut strides = vec![1usize; dims.len()];
            for i in (0..dims.len().saturating_sub(1)).rev() {
                strides[i] = strides[i + 1] * dims[i + 1];
            }
            let offsets = |axes: &[usize]| -> Vec<usize> {
                let mut offs = vec![0usize];
                for &a in axes {
                    let stride = strides[a];
                    offs = offs
                        .iter()
                        .flat_map(|&o| (0..dims[a]).map(move |i| o + i * stride))
                        .collect();
                }
                offs
            };
            let (ko, ro) = (offsets(&kept), offsets(&red));
            let mut transposed = Vec::with_capacity(xs.len());
            for &k in &ko {
                transposed.extend(ro.iter().map(|&r| xs[k + r]));
            }
            let m = ro.len();
            (0..ko.len())
                .map(|i| inner(&transposed, i * m, m))
                .collect()
        }
    }
}

/// The axes of a reduction as a mask over `rank` dimensions.
fn reduction_mask(op: &'static str, axis: &Tensor, rank: usize) -> Result<Vec<bool>> {
    let axes: Vec<i64> = match axis.data() {
        TensorData::Int32(v) => v.iter().map(|&a| i64::from(a)).collect(),
        TensorData::Int64(v) => v.clone(),
        _ => return Err(dtype_error(op, "reduction_indices", "int32 or int64", axis)),
    };
    if axis.shape().len() > 1 {
        return Err(KernelError::InputShape {
            op,
            input: "reduction_indices",
            shape: axis.shape().to_vec(),
            reason: "must be a scalar or a vector",
        });
    }
    let mut mask = vec![false; rank];
    let r = i64::try_from(rank).unwrap_or(i64::MAX);
    for &a in &axes {
        let bad = |reason| KernelError::InvalidAttr {
            op,
            attr: "reduction_indices",
            value: format!("{axes:?}"),
            reason,
        };
        if a < -r || a >= r {
            return Err(bad("axis out of range for the rank"));
        }
        let d = usize::try_from(if a < 0 { a + r } else { a }).unwrap_or(0);
        if mask[d] {
            return Err(bad("Axes contains duplicate dimension"));
        }
        mask[d] = true;
    }
    Ok(mask)
}

fn reduce_int<T: Int>(
    op: Reduction,
    xs: &[T],
    dims: &[usize],
    first: bool,
    count: usize,
) -> Vec<T> {
    let (init, f): (T, fn(T, T) -> T) = match op {
        Reduction::Prod => (T::ONE, T::mul),
        Reduction::Max => (T::MIN, Ord::max),
        Reduction::Min => (T::MAX, Ord::min),
        _ => (T::default(), T::add),
    };
    let inner = move |v: &[T], s: usize, n: usize| v[s..s + n].iter().fold(init, |a, &x| f(a, x));
    if op == Reduction::Mean {
        // TensorFlow's integer mean does not overflow: the sum is exact.
        let wide: Vec<i128> = xs.iter().map(|&x| x.to_i128()).collect();
        let add: fn(i128, i128) -> i128 = i128::wrapping_add;
        let inner =
            move |v: &[i128], s: usize, n: usize| v[s..s + n].iter().fold(0, |a, &x| add(a, x));
        let sums = reduce_in_order(&wide, dims, first, 0, add, &inner);
        let c = i128::try_from(count).unwrap_or(i128::MAX).max(1);
        return sums.into_iter().map(|s| T::from_i128(s / c)).collect();
    }
    reduce_in_order(xs, dims, first, init, f, &inner)
}

fn reduce_float<T: Float>(
    op: Reduction,
    xs: &[T],
    dims: &[usize],
    first: bool,
    count: usize,
) -> Vec<T> {
    let (init, f): (T, fn(T, T) -> T) = match op {
        Reduction::Prod => (T::ONE, T::mul),
        Reduction::Max => (T::NEG_INFINITY, |a, b| float_op(BinaryOp::Maximum, a, b)),
        Reduction::Min => (T::INFINITY, |a, b| float_op(BinaryOp::Minimum, a, b)),
        _ => (T::ZERO, T::add),
    };
    let how = accumulation(op, T::LANES);
    let inner = move |v: &[T], s: usize, n: usize| inner_reduce(v, s, n, init, f, how);
    let out = reduce_in_order(xs, dims, first, init, f, &inner);
    match op {
        Reduction::Mean if count == 0 => vec![T::NAN; out.len()],
        Reduction::Mean => {
            let c = T::from_count(count);
            out.into_iter().map(|s| s.div(c)).collect()
        }
        _ => out,
    }
}

/// `Sum`, `Prod` or `Mean` of `input` over the axes in `reduction_indices` (int32/int64,
/// scalar or vector, negative from the end, no duplicates), keeping reduced dimensions as
/// 1 with `keep_dims`. `Mean` divides the sum by the reduced count (integer division for
/// integers).
pub fn reduce(
    op: Reduction,
    input: &Tensor,
    reduction_indices: &Tensor,
    keep_dims: bool,
) -> Result<Vec<Tensor>> {
    let name = op.name();
    let shape = input.shape();
    let mask = reduction_mask(name, reduction_indices, shape.len())?;
    let out_shape: Vec<usize> = shape
        .iter()
        .zip(&mask)
        .filter_map(|(&d, &r)| match (r, keep_dims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let count: usize = shape
        .iter()
        .zip(&mask)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product();
    let out_count: usize = out_shape.iter().product();
    let (dims, first) = simplify(shape, &mask);
    macro_rules! ints {
        ($v:expr, $w:expr) => {
            $w(if out_count == 0 {
                Vec::new()
            } else {
                if op == Reduction::Mean && count == 0 {
                    return Err(KernelError::InvalidAttr {
                        op: name,
                        attr: "reduction_indices",
                        value: format!("{:?}", reduction_indices.data()),
                        reason: "integer mean over no elements",
                    });
                }
                reduce_int(op, $v, &dims, first, count)
            })
        };
    }
    let data = match input.data() {
        TensorData::Int8(v) => ints!(v, TensorData::Int8),
        TensorData::Int16(v) => ints!(v, TensorData::Int16),
        TensorData::Int32(v) => ints!(v, TensorData::Int32),
        TensorData::Int64(v) => ints!(v, TensorData::Int64),
        TensorData::UInt8(v) => ints!(v, TensorData::UInt8),
        TensorData::UInt16(v) => ints!(v, TensorData::UInt16),
        TensorData::UInt32(v) => ints!(v, TensorData::UInt32),
        TensorData::UInt64(v) => ints!(v, TensorData::UInt64),
        TensorData::Float32(v) => TensorData::Float32(if out_count == 0 {
            Vec::new()
        } else {
            reduce_float(op, v, &dims, first, count)
        }),
        TensorData::Float64(v) => TensorData::Float64(if out_count == 0 {
            Vec::new()
        } else {
            reduce_float(op, v, &dims, first, count)
        }),
        TensorData::Bool(v) if matches!(op, Reduction::All | Reduction::Any) => {
            let (init, f): (bool, fn(bool, bool) -> bool) = if op == Reduction::All {
                (true, |a, b| a && b)
            } else {
                (false, |a, b| a || b)
            };
            let inner = move |v: &[bool], s: usize, n: usize| {
                v[s..s + n].iter().fold(init, |a, &x| f(a, x))
            };
            TensorData::Bool(if out_count == 0 {
                Vec::new()
            } else {
                reduce_in_order(v, &dims, first, init, f, &inner)
            })
        }
        _ if matches!(op, Reduction::All | Reduction::Any) => {
            return Err(dtype_error(name, "input", "bool", input))
        }
        _ => {
            return Err(dtype_error(
                name,
                "input",
                "an integer or float dtype",
                input,
            ))
        }
    };
    // A reduction over no elements leaves one identity per output.
    let data = if data.len() != out_count {
        fill_identity(op, input.dtype(), out_count)
    } else {
        data
    };
    Ok(vec![output(name, out_shape, data)?])
}

fn fill_identity(op: Reduction, dtype: DType, n: usize) -> TensorData {
    let z = TensorData::zeros(dtype, n);
    match (op, z) {
        (Reduction::Prod, TensorData::Float32(_)) => TensorData::Float32(vec![1.0; n]),
        (Reduction::Prod, TensorData::Float64(_)) => TensorData::Float64(vec![1.0; n]),
        (Reduction::Mean, TensorData::Float32(_)) => TensorData::Float32(vec![f32::NAN; n]),
        (Reduction::Mean, TensorData::Float64(_)) => TensorData::Float64(vec![f64::NAN; n]),
        (Reduction::Max, TensorData::Float32(_)) => TensorData::Float32(vec![f32::NEG_INFINITY; n]),
        (Reduction::Max, TensorData::Float64(_)) => TensorData::Float64(vec![f64::NEG_INFINITY; n]),
        (Reduction::Min, TensorData::Float32(_)) => TensorData::Float32(vec![f32::INFINITY; n]),
        (Reduction::Min, TensorData::Float64(_)) => TensorData::Float64(vec![f64::INFINITY; n]),
        (Reduction::All, TensorData::Bool(_)) => TensorData::Bool(vec![true; n]),
        (_, z) => z,
    }
}

/// `Sum`.
pub fn sum(input: &Tensor, axis: &Tensor, keep_dims: bool) -> Result<Vec<Tensor>> {
    reduce(Reduction::Sum, input, axis, keep_dims)
}

/// `Prod`.
pub fn prod(input: &Tensor, axis: &Tensor, keep_dims: bool) -> Result<Vec<Tensor>> {
    reduce(Reduction::Prod, input, axis, keep_dims)
}

/// `Mean`.
pub fn mean(input: &Tensor, axis: &Tensor, keep_dims: bool) -> Result<Vec<Tensor>> {
    reduce(Reduction::Mean, input, axis, keep_dims)
}

// ------------------------------------------------------------------------------- Cumsum

fn scan<T: Copy>(
    xs: &[T],
    shape: &[usize],
    axis: usize,
    exclusive: bool,
    reverse: bool,
    zero: T,
    add: fn(T, T) -> T,
) -> Vec<T> {
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut out = xs.to_vec();
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * len + k) * inner + i;
            let mut acc = zero;
            for step in 0..len {
                let k = if reverse { len - 1 - step } else { step };
                if exclusive {
                    out[at(k)] = acc;
                    acc = add(acc, xs[at(k)]);
                } else {
                    acc = add(acc, xs[at(k)]);
                    out[at(k)] = acc;
                }
            }
        }
    }
    out
}

/// `Cumsum`: running sums along `axis` (a scalar), from the end with `reverse`, each
/// excluding its own element with `exclusive`.
pub fn cumsum(x: &Tensor, axis: &Tensor, exclusive: bool, reverse: bool) -> Result<Vec<Tensor>> {
    cumulative(false, x, axis, exclusive, reverse)
}

/// `Cumprod`: running products, as [`cumsum`] (an exclusive product starts at 1).
pub fn cumprod(x: &Tensor, axis: &Tensor, exclusive: bool, reverse: bool) -> Result<Vec<Tensor>> {
    cumulative(true, x, axis, exclusive, reverse)
}

fn cumulative(
    prod: bool,
    x: &Tensor,
    axis: &Tensor,
    exclusive: bool,
    reverse: bool,
) -> Result<Vec<Tensor>> {
    let op: &'static str = if prod { "Cumprod" } else { "Cumsum" };
    let a: i64 = match axis.data() {
        TensorData::Int32(v) if axis.shape().is_empty() => i64::from(v[0]),
        TensorData::Int64(v) if axis.shape().is_empty() => v[0],
        TensorData::Int32(_) | TensorData::Int64(_) => {
            return Err(KernelError::InputShape {
                op,
                input: "axis",
                shape: axis.shape().to_vec(),
                reason: "must be a scalar",
            })
        }
        _ => return Err(dtype_error(op, "axis", "int32 or int64", axis)),
    };
    let shape = x.shape();
    let r = i64::try_from(shape.len()).unwrap_or(i64::MAX);
    if a < -r || a >= r {
        return Err(KernelError::InvalidAttr {
            op,
            attr: "axis",
            value: a.to_string(),
            reason: "axis out of range for the rank",
        });
    }
    let ax = usize::try_from(if a < 0 { a + r } else { a }).unwrap_or(0);
    macro_rules! go {
        ($v:expr, $w:expr, $zero:expr, $one:expr, $add:expr, $mul:expr) => {
            $w(if prod {
                scan($v, shape, ax, exclusive, reverse, $one, $mul)
            } else {
                scan($v, shape, ax, exclusive, reverse, $zero, $add)
            })
        };
    }
    macro_rules! int {
        ($v:expr, $w:expr) => {
            go!($v, $w, 0, 1, Int::add, Int::mul)
        };
    }
    let data = match x.data() {
        TensorData::Int8(v) => int!(v, TensorData::Int8),
        TensorData::Int16(v) => int!(v, TensorData::Int16),
        TensorData::Int32(v) => int!(v, TensorData::Int32),
        TensorData::Int64(v) => int!(v, TensorData::Int64),
        TensorData::UInt8(v) => int!(v, TensorData::UInt8),
        TensorData::UInt16(v) => int!(v, TensorData::UInt16),
        TensorData::UInt32(v) => int!(v, TensorData::UInt32),
        TensorData::UInt64(v) => int!(v, TensorData::UInt64),
        TensorData::Float32(v) => go!(v, TensorData::Float32, 0.0, 1.0, Float::add, Float::mul),
        TensorData::Float64(v) => go!(v, TensorData::Float64, 0.0, 1.0, Float::add, Float::mul),
        _ => return Err(dtype_error(op, "x", "an integer or float dtype", x)),
    };
    Ok(vec![output(op, shape.to_vec(), data)?])
}

// ------------------------------------------------------------------- Ceil, Floor, Sqrt

/// Element-wise float functions that IEEE arithmetic rounds exactly (as Eigen's SSE/AVX
/// `pceil`, `pfloor`, `psqrt` do), on flushed inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Ceil,
    Floor,
    Sqrt,
}

impl UnaryOp {
    /// TensorFlow's op name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Ceil => "Ceil",
            UnaryOp::Floor => "Floor",
            UnaryOp::Sqrt => "Sqrt",
        }
    }

    fn apply<T: Float>(self, x: T) -> T {
        match self {
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Sqrt => x.sqrt(),
        }
    }
}

/// `Abs`: integers wrap (`|MIN|` is `MIN`); floats clear the sign bit (an AND, which
/// flush-to-zero does not touch, so subnormals and NaN payloads pass through).
pub fn abs(x: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Abs";
    let data = match x.data() {
        TensorData::Int8(v) => TensorData::Int8(v.iter().map(|a| a.wrapping_abs()).collect()),
        TensorData::Int16(v) => TensorData::Int16(v.iter().map(|a| a.wrapping_abs()).collect()),
        TensorData::Int32(v) => TensorData::Int32(v.iter().map(|a| a.wrapping_abs()).collect()),
        TensorData::Int64(v) => TensorData::Int64(v.iter().map(|a| a.wrapping_abs()).collect()),
        TensorData::Float16(v) => TensorData::Float16(v.iter().map(|a| a & 0x7fff).collect()),
        TensorData::BFloat16(v) => TensorData::BFloat16(v.iter().map(|a| a & 0x7fff).collect()),
        TensorData::Float32(v) => TensorData::Float32(v.iter().map(|a| a.abs()).collect()),
        TensorData::Float64(v) => TensorData::Float64(v.iter().map(|a| a.abs()).collect()),
        _ => return Err(dtype_error(OP, "x", "a signed integer or float dtype", x)),
    };
    Ok(vec![output(OP, x.shape().to_vec(), data)?])
}

/// `Ceil`, `Floor` or `Sqrt` of a float or double tensor.
pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Vec<Tensor>> {
    let name = op.name();
    let data = match x.data() {
        TensorData::Float32(v) => TensorData::Float32(v.iter().map(|&a| op.apply(a)).collect()),
        TensorData::Float64(v) => TensorData::Float64(v.iter().map(|&a| op.apply(a)).collect()),
        _ => return Err(dtype_error(name, "x", "float or double", x)),
    };
    Ok(vec![output(name, x.shape().to_vec(), data)?])
}

// -------------------------------------------------------------------------------- Log1p

/// Eigen's `plog` for float (`plog_impl_float`): `frexp`, a shift to
/// `[sqrt(1/2), sqrt(2))`, a (3,3) rational approximation of `log(1 + x)` and `e·ln 2`,
/// with multiply and add kept apart (TensorFlow's build has no FMA).
// Eigen's coefficients, as it writes them.
#[allow(clippy::excessive_precision)]
fn eigen_log_f32(x: f32) -> f32 {
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x.is_nan() || x < 0.0 {
        // Eigen ORs an all-ones mask into invalid lanes.
        return f32::from_bits(0xffff_ffff);
    }
    if x == f32::INFINITY {
        return x;
    }
    let bits = x.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 126;
    let m = f32::from_bits((bits & 0x807f_ffff) | (126 << 23));
    let (m, e) = if m < std::f32::consts::FRAC_1_SQRT_2 {
        ((m - 1.0).add(m), e as f32 - 1.0)
    } else {
        (m - 1.0, e as f32)
    };
    const ALPHA: [f32; 3] = [0.18256296349849254, 1.0000000190281063, 1.0000000190281136];
    const BETA: [f32; 4] = [
        0.049616247954120038,
        0.59923249590823520,
        1.4999999999999927,
        1.0,
    ];
    let p = ALPHA[1..]
        .iter()
        .fold(ALPHA[0], |acc, &c| acc.mul(m).add(c))
        .mul(m);
    let q = BETA[1..].iter().fold(BETA[0], |acc, &c| acc.mul(m).add(c));
    e.mul(std::f32::consts::LN_2).add(p.div(q))
}

/// `Log1p`. Float follows Eigen's vectorized `generic_log1p` (`x` itself where `1 + x`
/// rounds to 1 or the log is infinite, else `x · log(1 + x) / ((1 + x) − 1)`) for whole
/// packets of 8 and the C library's `log1pf` for the last `len % 8` elements, as
/// TensorFlow's executor splits them; double is the C library's `log1p` throughout.
pub fn log1p(x: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Log1p";
    let data = match x.data() {
        TensorData::Float32(v) => TensorData::Float32(
            v.iter()
                .enumerate()
                .map(|(i, &x)| {
                    // Eigen evaluates whole packets of 8 and the last `len % 8` elements
                    // one by one, with the C library's `log1pf`.
                    if i >= v.len() / 8 * 8 {
                        // glibc returns a tiny (even subnormal) `x` as it is.
                        return x.ln_1p();
                    }
                    let x = x.daz();
                    let xp1 = x.add(1.0);
                    if xp1 == 1.0 {
                        return x;
                    }
                    let log = eigen_log_f32(xp1);
                    if xp1 == log {
                        return x;
                    }
                    x.mul(log.div(xp1.sub(1.0)))
                })
                .collect(),
        ),
        TensorData::Float64(v) => TensorData::Float64(v.iter().map(|&x| x.ln_1p()).collect()),
        _ => return Err(dtype_error(OP, "x", "float or double", x)),
    };
    Ok(vec![output(OP, x.shape().to_vec(), data)?])
}

/// `Neg` for bfloat16, half, float, double, int8, int16, int32 and int64. Integers wrap
/// (`-MIN` is `MIN`, as two's-complement negation in TensorFlow's kernel); floats flip the
/// sign bit, so NaN payloads and subnormals pass through unflushed (Eigen's `pnegate` and the
/// scalar `-x` are both an XOR, which flush-to-zero does not touch).
pub fn neg(x: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Neg";
    let data = match x.data() {
        TensorData::Int8(v) => TensorData::Int8(v.iter().map(|a| a.wrapping_neg()).collect()),
        TensorData::Int16(v) => TensorData::Int16(v.iter().map(|a| a.wrapping_neg()).collect()),
        TensorData::Int32(v) => TensorData::Int32(v.iter().map(|a| a.wrapping_neg()).collect()),
        TensorData::Int64(v) => TensorData::Int64(v.iter().map(|a| a.wrapping_neg()).collect()),
        TensorData::Float16(v) => TensorData::Float16(v.iter().map(|a| a ^ 0x8000).collect()),
        TensorData::BFloat16(v) => TensorData::BFloat16(v.iter().map(|a| a ^ 0x8000).collect()),
        TensorData::Float32(v) => TensorData::Float32(
            v.iter()
                .map(|a| f32::from_bits(a.to_bits() ^ (1 << 31)))
                .collect(),
        ),
        TensorData::Float64(v) => TensorData::Float64(
            v.iter()
                .map(|a| f64::from_bits(a.to_bits() ^ (1 << 63)))
                .collect(),
        ),
        _ => {
            return Err(dtype_error(
                OP,
                "x",
                "bfloat16, half, float, double, int8, int16, int32 or int64",
                x,
            ))
        }
    };
    Ok(vec![output(OP, x.shape().to_vec(), data)?])
}
