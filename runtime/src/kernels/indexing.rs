//! Index-driven copies that feature columns and ragged/sparse conversions emit: `GatherNd`,
//! `ScatterNd`, `BroadcastTo`, and `Assert`'s check. They only move values, so every dtype
//! is bit-exact by construction; what must match TensorFlow 2.18.1 is the validation and its
//! messages (an index outside the params is `indices[i,j] = [a, b] does not index into param
//! shape [x,y]`, as TensorFlow writes it).

use super::sparse::take;
use super::{broadcast_index, broadcast_shapes, int_values, output, KernelError, Result};
use crate::tensor::{Tensor, TensorData};

fn invalid(op: &'static str, input: &'static str, reason: impl Into<String>) -> KernelError {
    KernelError::InvalidInput {
        op,
        input,
        reason: reason.into(),
    }
}

/// TensorFlow's `TensorShape::DebugString` dims: `[2,3]`.
fn dims(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(","))
}

/// `SliceDebugString`: the multi-index of flat position `i` of `shape`, `[i,j]`.
fn position(shape: &[usize], mut i: usize) -> String {
    let mut idx = vec![0usize; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = i % n;
            i /= n;
        }
    }
    let parts: Vec<String> = idx.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(","))
}

/// `GatherNd`: for each index tuple (the last dimension of `indices`), the slice of `params`
/// it names. The output shape is `indices.shape[:-1] + params.shape[k:]`.
pub fn gather_nd(params: &Tensor, indices: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "GatherNd";
    let idx = int_values(OP, "indices", indices)?;
    let pshape = params.shape();
    let ishape = indices.shape();
    if pshape.is_empty() {
        return Err(invalid(OP, "params", "params must be at least a vector"));
    }
    let Some((&k, outer)) = ishape.split_last() else {
        return Err(invalid(OP, "indices", "indices must be at least a vector"));
    };
    if k > pshape.len() {
        return Err(invalid(
            OP,
            "indices",
            format!(
                "index innermost dimension length must be <= params rank; saw: {k} vs. {}",
                pshape.len()
            ),
        ));
    }
    let slice: usize = pshape[k..].iter().product();
    let count: usize = outer.iter().product();
    let mut shape = outer.to_vec();
    shape.extend_from_slice(&pshape[k..]);
    crate::tensor::checked_num_elements(params.dtype(), &shape)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let mut flat = Vec::with_capacity(count.saturating_mul(slice));
    for (n, tuple) in idx.chunks(k.max(1)).take(count).enumerate() {
        let tuple = if k == 0 { &[][..] } else { tuple };
        let mut offset = 0usize;
        let mut ok = true;
        for (d, &v) in tuple.iter().enumerate() {
            match usize::try_from(v).ok().filter(|&v| v < pshape[d]) {
                Some(v) => offset = offset * pshape[d] + v,
                None => ok = false,
            }
        }
        if !ok {
            let shown: Vec<String> = tuple.iter().map(ToString::to_string).collect();
            return Err(invalid(
                OP,
                "indices",
                format!(
                    "indices{} = [{}] does not index into param shape {}",
                    position(outer, n),
                    shown.join(", "),
                    dims(pshape)
                ),
            ));
        }
        let start = offset * slice;
        flat.extend(start..start + slice);
    }
    if k == 0 {
        flat = (0..count).flat_map(|_| 0..slice).collect();
    }
    Ok(vec![output(OP, shape, take(params.data(), &flat))?])
}

/// `BroadcastTo`: `input` broadcast to `shape` (NumPy rules; the input may not be larger).
pub fn broadcast_to(input: &Tensor, shape: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "BroadcastTo";
    let want = int_values(OP, "shape", shape)?;
    let mut out = Vec::with_capacity(want.len());
    for &d in &want {
        out.push(
            usize::try_from(d)
                .map_err(|_| invalid(OP, "shape", format!("Dimension {d} must be >= 0")))?,
        );
    }
    let incompatible = || {
        invalid(
            OP,
            "shape",
            format!(
                "Incompatible shapes: {} vs. {}",
                dims(input.shape()),
                dims(&out)
            ),
        )
    };
    if input.shape().len() > out.len() {
        return Err(incompatible());
    }
    match broadcast_shapes(input.shape(), &out) {
        Some(b) if b == out => {}
        _ => return Err(incompatible()),
    }
    crate::tensor::checked_num_elements(input.dtype(), &out)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let idx = broadcast_index(input.shape(), &out);
    Ok(vec![output(OP, out, take(input.data(), &idx))?])
}

/// `ScatterNd`: zeros of `shape` with each update added at the slice its index tuple names
/// (updates to the same slice add up, in index order).
pub fn scatter_nd(indices: &Tensor, updates: &Tensor, shape: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "ScatterNd";
    let idx = int_values(OP, "indices", indices)?;
    let want = int_values(OP, "shape", shape)?;
    let mut oshape = Vec::with_capacity(want.len());
    for &d in &want {
        oshape.push(
            usize::try_from(d)
                .map_err(|_| invalid(OP, "shape", format!("Dimension {d} must be >= 0")))?,
        );
    }
    let ishape = indices.shape();
    let Some((&k, outer)) = ishape.split_last() else {
        return Err(invalid(
            OP,
            "indices",
            "Indices shape must have rank at least one.",
        ));
    };
    if k > oshape.len() {
        return Err(invalid(
            OP,
            "indices",
            format!(
                "Dimensions [0,{k}) of indices[shape={}] = {k} must match dimensions [0,{}) of updates[shape={}]",
                dims(ishape),
                outer.len(),
                dims(updates.shape())
            ),
        ));
    }
    let slice: usize = oshape[k..].iter().product();
    let count: usize = outer.iter().product();
    let mut expected = outer.to_vec();
    expected.extend_from_slice(&oshape[k..]);
    if updates.shape() != expected.as_slice() {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "updates",
            left_shape: updates.shape().to_vec(),
            right: "indices",
            right_shape: ishape.to_vec(),
        });
    }
    crate::tensor::checked_num_elements(updates.dtype(), &oshape)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let total: usize = oshape.iter().product();
    let mut targets = Vec::with_capacity(count);
    for (n, tuple) in idx.chunks(k.max(1)).take(count).enumerate() {
        let tuple = if k == 0 { &[][..] } else { tuple };
        let mut offset = 0usize;
        for (d, &v) in tuple.iter().enumerate() {
            let Some(v) = usize::try_from(v).ok().filter(|&v| v < oshape[d]) else {
                let shown: Vec<String> = tuple.iter().map(ToString::to_string).collect();
                return Err(invalid(
                    OP,
                    "indices",
                    format!(
                        "indices{} = [{}] does not index into shape {}",
                        position(outer, n),
                        shown.join(", "),
                        dims(&oshape)
                    ),
                ));
            };
            offset = offset * oshape[d] + v;
        }
        targets.push(offset * slice);
    }
    macro_rules! scatter {
        ($variant:ident, $v:expr, $add:expr) => {{
            let mut out = vec![Default::default(); total];
            for (n, &start) in targets.iter().enumerate() {
                for j in 0..slice {
                    let o: &mut _ = &mut out[start + j];
                    *o = $add(*o, $v[n * slice + j]);
                }
            }
            TensorData::$variant(out)
        }};
    }
    let data = match updates.data() {
        TensorData::Float32(v) => scatter!(Float32, v, |a: f32, b: f32| a + b),
        TensorData::Float64(v) => scatter!(Float64, v, |a: f64, b: f64| a + b),
        TensorData::Int32(v) => scatter!(Int32, v, i32::wrapping_add),
        TensorData::Int64(v) => scatter!(Int64, v, i64::wrapping_add),
        TensorData::Bool(v) => scatter!(Bool, v, |a: bool, b: bool| a || b),
        _ => {
            return Err(KernelError::InputDtype {
                op: OP,
                input: "updates",
                expected: "float, double, int32, int64 or bool",
                actual: updates.dtype(),
            })
        }
    };
    Ok(vec![output(OP, oshape, data)?])
}

/// One data tensor of a failed `Assert`, as TensorFlow's `SummarizeValue` shows it: up to
/// `summarize` elements, space-separated, in brackets (`...` when cut).
fn summarize(t: &Tensor, summarize: usize) -> String {
    let n = t.num_elements();
    let shown = n.min(summarize);
    let mut parts: Vec<String> = Vec::with_capacity(shown);
    for i in 0..shown {
        parts.push(match t.data() {
            TensorData::String(v) => String::from_utf8_lossy(&v[i]).into_owned(),
            TensorData::Bool(v) => v[i].to_string(),
            TensorData::Int32(v) => v[i].to_string(),
            TensorData::Int64(v) => v[i].to_string(),
            TensorData::Float32(v) => v[i].to_string(),
            TensorData::Float64(v) => v[i].to_string(),
            other => format!("{:?}", other.dtype()),
        });
    }
    let more = if shown < n { "..." } else { "" };
    format!("[{}{more}]", parts.join(" "))
}

/// `Assert`: nothing when `condition` (a bool scalar) holds, else TensorFlow's
/// `assertion failed: [..] [..]` with each data tensor summarized.
pub fn assert(condition: &Tensor, data: &[&Tensor], summarize_n: usize) -> Result<()> {
    const OP: &str = "Assert";
    let TensorData::Bool(c) = condition.data() else {
        return Err(KernelError::InputDtype {
            op: OP,
            input: "condition",
            expected: "bool",
            actual: condition.dtype(),
        });
    };
    let [holds] = c.as_slice() else {
        return Err(invalid(
            OP,
            "condition",
            format!("In[0] should be a scalar: {}", dims(condition.shape())),
        ));
    };
    if *holds {
        return Ok(());
    }
    let shown: Vec<String> = data.iter().map(|t| summarize(t, summarize_n)).collect();
    Err(invalid(
        OP,
        "condition",
        format!("assertion failed: {}", shown.join(" ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i32s(shape: Vec<usize>, v: Vec<i32>) -> Tensor {
        Tensor::new(shape, TensorData::Int32(v)).expect("tensor")
    }

    #[test]
    fn gather_nd_takes_slices_and_names_a_bad_index_as_tensorflow() {
        let params = i32s(vec![2, 2], vec![1, 2, 3, 4]);
        let got = gather_nd(&params, &i32s(vec![2, 1], vec![1, 0])).expect("gathers");
        assert_eq!(got[0].shape(), &[2, 2]);
        assert_eq!(got[0].data(), &TensorData::Int32(vec![3, 4, 1, 2]));
        let got = gather_nd(&params, &i32s(vec![1, 2], vec![1, 1])).expect("gathers");
        assert_eq!(got[0].data(), &TensorData::Int32(vec![4]));
        let err = gather_nd(&params, &i32s(vec![2, 1, 1], vec![1, -1])).expect_err("refuses");
        // TensorFlow 2.18.1: "indices[1,0] = [-1] does not index into param shape [2,2]".
        assert!(
            err.to_string()
                .ends_with("indices[1,0] = [-1] does not index into param shape [2,2]"),
            "{err}"
        );
    }

    #[test]
    fn broadcast_to_repeats_and_refuses_as_tensorflow() {
        let got = broadcast_to(&i32s(vec![2], vec![1, 2]), &i32s(vec![2], vec![2, 2]))
            .expect("broadcasts");
        assert_eq!(got[0].data(), &TensorData::Int32(vec![1, 2, 1, 2]));
        let err = broadcast_to(&i32s(vec![3], vec![1, 2, 3]), &i32s(vec![2], vec![2, 2]))
            .expect_err("refuses");
        assert!(
            err.to_string()
                .ends_with("Incompatible shapes: [3] vs. [2,2]"),
            "{err}"
        );
    }

    #[test]
    fn assert_summarizes_its_data() {
        let no = Tensor::new(vec![], TensorData::Bool(vec![false])).expect("t");
        let s = Tensor::new(vec![], TensorData::String(vec![b"x is".to_vec()])).expect("t");
        let v = i32s(vec![2], vec![1, 2]);
        let err = assert(&no, &[&s, &v], 3).expect_err("fails");
        // TensorFlow 2.18.1: "assertion failed: [x is] [1 2]".
        assert!(
            err.to_string().ends_with("assertion failed: [x is] [1 2]"),
            "{err}"
        );
    }
}
