//! Array kernels: `Identity`, `Reshape`, `ExpandDims`, `Squeeze`, `ConcatV2`, `Pack`,
//! `Unpack`, `Fill`, `Range`, `Shape`, `Size`. `Cast` is in [`super::cast`].

use std::ops::Range;

use super::{int_values, output, KernelError, Result};
use crate::tensor::{checked_num_elements, DType, Tensor, TensorData};

/// Applies `$body` to the vector inside any `TensorData`, rebuilding the same variant.
macro_rules! map_vec {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            TensorData::Bool($v) => TensorData::Bool($body),
            TensorData::Int8($v) => TensorData::Int8($body),
            TensorData::Int16($v) => TensorData::Int16($body),
            TensorData::Int32($v) => TensorData::Int32($body),
            TensorData::Int64($v) => TensorData::Int64($body),
            TensorData::UInt8($v) => TensorData::UInt8($body),
            TensorData::UInt16($v) => TensorData::UInt16($body),
            TensorData::UInt32($v) => TensorData::UInt32($body),
            TensorData::UInt64($v) => TensorData::UInt64($body),
            TensorData::Float16($v) => TensorData::Float16($body),
            TensorData::BFloat16($v) => TensorData::BFloat16($body),
            TensorData::Float32($v) => TensorData::Float32($body),
            TensorData::Float64($v) => TensorData::Float64($body),
            TensorData::String($v) => TensorData::String($body),
        }
    };
}

/// Concatenates `parts[i].1` of `parts[i].0`, all of `dtype` (checked by the caller).
fn gather_chunks(dtype: DType, parts: &[(&TensorData, Range<usize>)]) -> TensorData {
    let total = parts.iter().map(|(_, r)| r.len()).sum();
    map_vec!(TensorData::zeros(dtype, 0), out => {
        let mut out = out;
        out.reserve(total);
        for (data, range) in parts {
            // Every part has `dtype`, so the variant matches; a mismatch would add nothing.
            if let Some(src) = same_variant(&out, data) {
                out.extend_from_slice(&src[range.clone()]);
            }
        }
        out
    })
}

/// The vector inside `data` if it is the same variant as `like`'s.
fn same_variant<'a, T: 'static>(_like: &Vec<T>, data: &'a TensorData) -> Option<&'a [T]> {
    let any: &dyn std::any::Any = match data {
        TensorData::Bool(v) => v,
        TensorData::Int8(v) => v,
        TensorData::Int16(v) => v,
        TensorData::Int32(v) => v,
        TensorData::Int64(v) => v,
        TensorData::UInt8(v) => v,
        TensorData::UInt16(v) | TensorData::Float16(v) | TensorData::BFloat16(v) => v,
        TensorData::UInt32(v) => v,
        TensorData::UInt64(v) => v,
        TensorData::Float32(v) => v,
        TensorData::Float64(v) => v,
        TensorData::String(v) => v,
    };
    any.downcast_ref::<Vec<T>>().map(Vec::as_slice)
}

/// Normalizes `axis` into `[0, rank)` (negative counts from the end).
fn norm_axis(op: &'static str, attr: &'static str, axis: i64, rank: usize) -> Result<usize> {
    let a = if axis < 0 {
        usize::try_from(axis.unsigned_abs())
            .ok()
            .and_then(|m| rank.checked_sub(m))
    } else {
        usize::try_from(axis).ok()
    };
    if let Some(a) = a.filter(|&a| a < rank) {
        Ok(a)
    } else {
        Err(KernelError::InvalidAttr {
            op,
            attr,
            value: axis.to_string(),
            reason: "axis out of range for the rank",
        })
    }
}

/// `Identity`.
pub fn identity(input: &Tensor) -> Result<Vec<Tensor>> {
    Ok(vec![input.clone()])
}

/// `Reshape`: `shape` (int32/int64 vector) may hold one -1, inferred as TensorFlow does
/// (zero-sized dimensions left out of the products when the new shape has a zero).
pub fn reshape(tensor: &Tensor, shape: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Reshape";
    if shape.shape().len() != 1 {
        return Err(KernelError::InputShape {
            op: OP,
            input: "shape",
            shape: shape.shape().to_vec(),
            reason: "must be a vector",
        });
    }
    let sizes = int_values(OP, "shape", shape)?;
    let mut unknown = None;
    let mut product: u128 = 1;
    let mut has_zero = false;
    for (i, &s) in sizes.iter().enumerate() {
        match s {
            -1 if unknown.is_none() => unknown = Some(i),
            -1 => {
                return Err(KernelError::InvalidAttr {
                    op: OP,
                    attr: "shape",
                    value: format!("{sizes:?}"),
                    reason: "only one size may be -1",
                })
            }
            s if s < 0 => {
                return Err(KernelError::InvalidAttr {
                    op: OP,
                    attr: "shape",
                    value: format!("{sizes:?}"),
                    reason: "sizes must be >= 0 or -1",
                })
            }
            0 => has_zero = true,
            s => product = product.saturating_mul(s as u128),
        }
    }
    let mut dims: Vec<usize> = sizes
        .iter()
        .map(|&s| usize::try_from(s).unwrap_or(0))
        .collect();
    let count_mismatch = || KernelError::IncompatibleShapes {
        op: OP,
        left: "tensor",
        left_shape: tensor.shape().to_vec(),
        right: "shape",
        right_shape: sizes
            .iter()
            .map(|&s| usize::try_from(s).unwrap_or(0))
            .collect(),
    };
    if let Some(u) = unknown {
        let input: u128 = tensor
            .shape()
            .iter()
            .filter(|&&d| d > 0 || !has_zero)
            .fold(1u128, |a, &d| a.saturating_mul(d as u128));
        let missing = input / product;
        if missing * product != input {
            return Err(count_mismatch());
        }
        dims[u] = usize::try_from(missing).map_err(|_| count_mismatch())?;
    }
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(count_mismatch)?;
    if n != tensor.num_elements() {
        return Err(count_mismatch());
    }
    Ok(vec![output(OP, dims, tensor.data().clone())?])
}

/// `ExpandDims`: inserts a 1 at `axis` (one element, in `[-rank-1, rank]`).
pub fn expand_dims(input: &Tensor, axis: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "ExpandDims";
    let a = int_values(OP, "axis", axis)?;
    let &[a] = a.as_slice() else {
        return Err(KernelError::InputShape {
            op: OP,
            input: "axis",
            shape: axis.shape().to_vec(),
            reason: "must hold a single value",
        });
    };
    let at = norm_axis(OP, "axis", a, input.shape().len() + 1)?;
    let mut dims = input.shape().to_vec();
    dims.insert(at, 1);
    Ok(vec![output(OP, dims, input.data().clone())?])
}

/// `Squeeze`: drops the size-1 dimensions listed in `axis` (all of them if empty).
pub fn squeeze(input: &Tensor, axis: &[i64]) -> Result<Vec<Tensor>> {
    const OP: &str = "Squeeze";
    let rank = input.shape().len();
    let mut drop = vec![false; rank];
    for &a in axis {
        let d = norm_axis(OP, "axis", a, rank)?;
        if input.shape()[d] != 1 {
            return Err(KernelError::InvalidAttr {
                op: OP,
                attr: "axis",
                value: a.to_string(),
                reason: "that dimension is not of size 1",
            });
        }
        drop[d] = true;
    }
    let dims = input
        .shape()
        .iter()
        .enumerate()
        .filter(|&(i, &d)| if axis.is_empty() { d != 1 } else { !drop[i] })
        .map(|(_, &d)| d)
        .collect();
    Ok(vec![output(OP, dims, input.data().clone())?])
}

/// Joins `values` (one dtype) into a tensor of `out_dims`: for each index of the dimensions
/// before `axis`, the next contiguous chunk of every value in turn (ConcatV2 and Pack).
fn join(op: &'static str, values: &[&Tensor], axis: usize, out_dims: Vec<usize>) -> Result<Tensor> {
    let dtype = values[0].dtype();
    let outer: usize = out_dims[..axis].iter().product();
    let chunks: Vec<usize> = values
        .iter()
        .map(|t| t.num_elements().checked_div(outer).unwrap_or(0))
        .collect();
    let mut parts = Vec::with_capacity(outer * values.len());
    for o in 0..outer {
        for (t, &c) in values.iter().zip(&chunks) {
            parts.push((t.data(), o * c..(o + 1) * c));
        }
    }
    output(op, out_dims, gather_chunks(dtype, &parts))
}

fn same_dtype(op: &'static str, values: &[&Tensor]) -> Result<()> {
    let dtype = values[0].dtype();
    match values.iter().find(|t| t.dtype() != dtype) {
        Some(t) => Err(KernelError::InputDtype {
            op,
            input: "values",
            expected: dtype.name(),
            actual: t.dtype(),
        }),
        None => Ok(()),
    }
}

/// `ConcatV2`: at least two tensors of one rank (>= 1), equal except along `axis`.
pub fn concat_v2(values: &[&Tensor], axis: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "ConcatV2";
    if values.len() < 2 {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "N",
            value: values.len().to_string(),
            reason: "must be at least 2",
        });
    }
    same_dtype(OP, values)?;
    let a = int_values(OP, "axis", axis)?;
    let &[a] = a.as_slice() else {
        return Err(KernelError::InputShape {
            op: OP,
            input: "axis",
            shape: axis.shape().to_vec(),
            reason: "must be a scalar",
        });
    };
    let first = values[0].shape();
    if first.is_empty() {
        return Err(KernelError::InputShape {
            op: OP,
            input: "values",
            shape: Vec::new(),
            reason: "cannot concatenate scalars (use Pack)",
        });
    }
    let axis = norm_axis(OP, "axis", a, first.len())?;
    let mut dims = first.to_vec();
    for t in &values[1..] {
        let s = t.shape();
        let compatible = s.len() == first.len()
            && s.iter()
                .zip(first)
                .enumerate()
                .all(|(i, (x, y))| i == axis || x == y);
        if !compatible {
            return Err(KernelError::IncompatibleShapes {
                op: OP,
                left: "values[0]",
                left_shape: first.to_vec(),
                right: "values[i]",
                right_shape: s.to_vec(),
            });
        }
        dims[axis] += s[axis];
    }
    Ok(vec![join(OP, values, axis, dims)?])
}

/// `Pack`: stacks tensors of one shape along a new `axis` (in `[-rank-1, rank]`).
pub fn pack(values: &[&Tensor], axis: i64) -> Result<Vec<Tensor>> {
    const OP: &str = "Pack";
    let Some(first) = values.first() else {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "N",
            value: "0".into(),
            reason: "must be at least 1",
        });
    };
    same_dtype(OP, values)?;
    if let Some(t) = values.iter().find(|t| !t.same_shape(first)) {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "values[0]",
            left_shape: first.shape().to_vec(),
            right: "values[i]",
            right_shape: t.shape().to_vec(),
        });
    }
    let axis = norm_axis(OP, "axis", axis, first.shape().len() + 1)?;
    let mut dims = first.shape().to_vec();
    dims.insert(axis, values.len());
    Ok(vec![join(OP, values, axis, dims)?])
}

/// `Unpack`: `num` tensors, the slices of `value` along `axis`.
pub fn unpack(value: &Tensor, num: i64, axis: i64) -> Result<Vec<Tensor>> {
    const OP: &str = "Unpack";
    let rank = value.shape().len();
    let axis = norm_axis(OP, "axis", axis, rank)?;
    let n = value.shape()[axis];
    if usize::try_from(num).ok() != Some(n) {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "num",
            value: num.to_string(),
            reason: "must equal the size of value along axis",
        });
    }
    let outer: usize = value.shape()[..axis].iter().product();
    let inner: usize = value.shape()[axis + 1..].iter().product();
    let mut dims = value.shape().to_vec();
    dims.remove(axis);
    (0..n)
        .map(|k| {
            let parts: Vec<_> = (0..outer)
                .map(|o| {
                    let start = (o * n + k) * inner;
                    (value.data(), start..start + inner)
                })
                .collect();
            output(OP, dims.clone(), gather_chunks(value.dtype(), &parts))
        })
        .collect()
}

/// A "scalar" argument as TensorFlow accepts it: rank 0, or a vector of one element.
fn one_element(op: &'static str, input: &'static str, t: &Tensor) -> Result<()> {
    if t.shape().len() <= 1 && t.num_elements() == 1 {
        Ok(())
    } else {
        Err(KernelError::InputShape {
            op,
            input,
            shape: t.shape().to_vec(),
            reason: "must be a scalar",
        })
    }
}

/// `Fill`: a tensor of shape `dims` holding `value` everywhere.
pub fn fill(dims: &Tensor, value: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Fill";
    if dims.shape().len() != 1 {
        return Err(KernelError::InputShape {
            op: OP,
            input: "dims",
            shape: dims.shape().to_vec(),
            reason: "must be a vector",
        });
    }
    one_element(OP, "value", value)?;
    let d = int_values(OP, "dims", dims)?;
    let shape = d
        .iter()
        .map(|&x| usize::try_from(x))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| KernelError::InvalidAttr {
            op: OP,
            attr: "dims",
            value: format!("{d:?}"),
            reason: "dimensions must be >= 0",
        })?;
    let n = checked_num_elements(value.dtype(), &shape)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let data = map_vec!(value.data(), v => v.iter().cycle().take(n).cloned().collect());
    Ok(vec![output(OP, shape, data)?])
}

/// `Range` for int32, int64, float and double: `start + i * delta` for
/// `i < size`, `size` computed as TensorFlow does (`ceil(|(limit - start) / delta|)` in the
/// dtype for floats, exact for ints).
// `size` is finite and >= 0 where it is cast to u128 (the cast saturates).
#[allow(clippy::cast_possible_truncation)]
pub fn range(start: &Tensor, limit: &Tensor, delta: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "Range";
    for (name, t) in [("start", start), ("limit", limit), ("delta", delta)] {
        one_element(OP, name, t)?;
        if t.dtype() != start.dtype() {
            return Err(KernelError::InputDtype {
                op: OP,
                input: name,
                expected: start.dtype().name(),
                actual: t.dtype(),
            });
        }
    }
    let bad = |reason| KernelError::InvalidAttr {
        op: OP,
        attr: "delta",
        value: format!("{:?}", delta.data()),
        reason,
    };
    macro_rules! check {
        ($s:expr, $l:expr, $d:expr, $zero:expr) => {
            if $d == $zero {
                return Err(bad("requires delta != 0"));
            }
            if $d > $zero && $s > $l {
                return Err(bad("requires start <= limit when delta > 0"));
            }
            if $d < $zero && $s < $l {
                return Err(bad("requires start >= limit when delta < 0"));
            }
        };
    }
    let too_large = |n: u128| -> Result<usize> {
        usize::try_from(n)
            .ok()
            .filter(|&n| checked_num_elements(start.dtype(), &[n]).is_ok())
            .ok_or(bad("the range has too many elements"))
    };
    let data = match (start.data(), limit.data(), delta.data()) {
        (TensorData::Int32(s), TensorData::Int32(l), TensorData::Int32(d)) => {
            let (s, l, d) = (i128::from(s[0]), i128::from(l[0]), i128::from(d[0]));
            check!(s, l, d, 0);
            let n = too_large(((l - s).abs() + d.abs() - 1) as u128 / d.unsigned_abs())?;
            // Every value lies in [start, limit), so it fits.
            TensorData::Int32(
                (0..n as i128)
                    .map(|i| i32::try_from(s + i * d).unwrap_or_default())
                    .collect(),
            )
        }
        (TensorData::Int64(s), TensorData::Int64(l), TensorData::Int64(d)) => {
            let (s, l, d) = (i128::from(s[0]), i128::from(l[0]), i128::from(d[0]));
            check!(s, l, d, 0);
            let n = too_large(((l - s).abs() + d.abs() - 1) as u128 / d.unsigned_abs())?;
            TensorData::Int64(
                (0..n as i128)
                    .map(|i| i64::try_from(s + i * d).unwrap_or_default())
                    .collect(),
            )
        }
        (TensorData::Float32(s), TensorData::Float32(l), TensorData::Float32(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            check!(s, l, d, 0.0);
            let size = ((l - s) / d).abs().ceil();
            if !size.is_finite() {
                return Err(bad("the range has too many elements"));
            }
            let n = too_large(size as u128)?;
            TensorData::Float32((0..n).map(|i| s + i as f32 * d).collect())
        }
        (TensorData::Float64(s), TensorData::Float64(l), TensorData::Float64(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            check!(s, l, d, 0.0);
            let size = ((l - s) / d).abs().ceil();
            if !size.is_finite() {
                return Err(bad("the range has too many elements"));
            }
            let n = too_large(size as u128)?;
            TensorData::Float64((0..n).map(|i| s + i as f64 * d).collect())
        }
        _ => {
            return Err(KernelError::InputDtype {
                op: OP,
                input: "start",
                expected: "int32, int64, float or double",
                actual: start.dtype(),
            })
        }
    };
    let n = data.len();
    Ok(vec![output(OP, vec![n], data)?])
}

fn int_tensor(op: &'static str, values: Vec<usize>, out_type: DType) -> Result<Tensor> {
    let n = values.len();
    let data = match out_type {
        DType::Int32 => TensorData::Int32(
            values
                .iter()
                .map(|&v| i32::try_from(v))
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| KernelError::InvalidAttr {
                    op,
                    attr: "out_type",
                    value: "int32".into(),
                    reason: "a value does not fit in int32",
                })?,
        ),
        DType::Int64 => TensorData::Int64(values.iter().map(|&v| v as i64).collect()),
        other => {
            return Err(KernelError::InvalidAttr {
                op,
                attr: "out_type",
                value: other.name().into(),
                reason: "must be int32 or int64",
            })
        }
    };
    output(op, vec![n], data)
}

/// `Shape`: the dimensions as an int32 or int64 vector.
pub fn shape(input: &Tensor, out_type: DType) -> Result<Vec<Tensor>> {
    Ok(vec![int_tensor("Shape", input.shape().to_vec(), out_type)?])
}

/// `Size`: the element count as an int32 or int64 scalar.
pub fn size(input: &Tensor, out_type: DType) -> Result<Vec<Tensor>> {
    let t = int_tensor("Size", vec![input.num_elements()], out_type)?;
    Ok(vec![output("Size", Vec::new(), t.into_data())?])
}
