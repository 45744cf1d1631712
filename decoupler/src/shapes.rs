//! Static shapes of data-side tensors, so that DWSend/DWRecv carry them and the report can
//! say how many bytes cross per step.
//!
//! A GraphDef rarely records shapes, but a data-side region starts at IteratorGetNext, whose
//! `output_shapes` are known, and feature transformations mostly keep or rebuild shapes in
//! simple ways. This pass follows only rules that are exact: element-wise ops (with NumPy
//! broadcasting), Reshape/ExpandDims/ConcatV2 with constant arguments, Squeeze, Pack, Shape,
//! Const, and the per-element string and lookup ops. Anything else is unknown; a dimension
//! that is not known statically is -1.

use lode_proto::attr::NodeAttrs;
use lode_proto::tf::attr_value::{attr_value, AttrValue};
use lode_proto::tf::tensor::TensorProto;
use lode_proto::tf::tensor_shape::TensorShapeProto;
use lode_proto::tf::types::DataType;
use lode_proto::view;

use crate::graph::{Graph, NodeId};

/// Dimensions of one tensor (-1 unknown); None when even the rank is unknown.
pub type Shape = Option<Vec<i64>>;

/// Ops whose output 0 has the shape of input 0.
const SAME_AS_INPUT: &[&str] = &[
    "Identity",
    "Cast",
    "Neg",
    "Abs",
    "Exp",
    "Log",
    "Log1p",
    "Sigmoid",
    "Tanh",
    "Relu",
    "Sqrt",
    "Rsqrt",
    "Square",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "IsNan",
    "IsInf",
    "LogicalNot",
    "StringToHashBucketFast",
    "StringToHashBucketStrong",
    "StringToHashBucket",
    "Bucketize",
    "StringLower",
    "StringUpper",
    "StringStrip",
    "AsString",
    "StringToNumber",
    "StopGradient",
    "ZerosLike",
    "OnesLike",
    "Snapshot",
    "CheckNumerics",
    "RegexReplace",
    "StaticRegexReplace",
];

/// Element-wise ops over two or three inputs, with broadcasting.
const BROADCAST: &[&str] = &[
    "Add",
    "AddV2",
    "Sub",
    "Mul",
    "RealDiv",
    "Div",
    "DivNoNan",
    "FloorDiv",
    "FloorMod",
    "Mod",
    "Maximum",
    "Minimum",
    "Pow",
    "SquaredDifference",
    "Equal",
    "NotEqual",
    "Less",
    "LessEqual",
    "Greater",
    "GreaterEqual",
    "LogicalAnd",
    "LogicalOr",
    "SelectV2",
];

/// Infers output shapes for the nodes `wanted` marks (and what they need), in topological
/// order. `shapes[id][k]` is output k's shape.
pub fn infer(graph: &Graph, order: &[NodeId], wanted: &[bool]) -> Vec<Vec<Shape>> {
    let mut shapes: Vec<Vec<Shape>> = vec![Vec::new(); graph.len()];
    for &id in order {
        if !wanted[id] {
            continue;
        }
        let outputs = graph.out_types[id].len();
        let mut out: Vec<Shape> = vec![None; outputs];
        if outputs > 0 {
            infer_node(graph, id, &shapes, &mut out);
        }
        shapes[id] = out;
    }
    shapes
}

fn input_shape(graph: &Graph, shapes: &[Vec<Shape>], id: NodeId, k: usize) -> Shape {
    let t = graph.inputs[id].get(k)?;
    shapes[t.node]
        .get(usize::try_from(t.output).ok()?)
        .cloned()
        .flatten()
}

fn const_ints(graph: &Graph, id: NodeId, k: usize) -> Option<Vec<i64>> {
    let t = graph.inputs[id].get(k)?;
    let node = graph.node(t.node);
    if node.op != "Const" {
        return None;
    }
    let def = node.to_node_def().ok()?;
    ints(def.attr_tensor("value").ok()?)
}

fn ints(t: &TensorProto) -> Option<Vec<i64>> {
    match t.dtype.enum_value().ok()? {
        DataType::DT_INT32 if t.tensor_content.is_empty() => {
            Some(t.int_val.iter().map(|&v| i64::from(v)).collect())
        }
        DataType::DT_INT32 => Some(
            t.tensor_content
                .chunks_exact(4)
                .filter_map(|c| c.try_into().ok().map(i32::from_le_bytes))
                .map(i64::from)
                .collect(),
        ),
        DataType::DT_INT64 if t.tensor_content.is_empty() => Some(t.int64_val.clone()),
        DataType::DT_INT64 => Some(
            t.tensor_content
                .chunks_exact(8)
                .filter_map(|c| c.try_into().ok().map(i64::from_le_bytes))
                .collect(),
        ),
        _ => None,
    }
}

fn proto_dims(shape: &TensorShapeProto) -> Shape {
    (!shape.unknown_rank).then(|| shape.dim.iter().map(|d| d.size).collect())
}

fn attr_shapes(bytes: &[u8]) -> Vec<Shape> {
    match view::decode_attr(bytes) {
        Ok(AttrValue {
            value: Some(attr_value::Value::List(list)),
            ..
        }) => list.shape.iter().map(proto_dims).collect(),
        _ => Vec::new(),
    }
}

fn broadcast(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let x = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let y = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (x, y) {
            (1, y) => y,
            (x, 1) => x,
            (x, y) if x == y => x,
            (-1, y) => y,
            (x, -1) => x,
            _ => return None, // incompatible: leave unknown rather than guess
        };
    }
    Some(out)
}

fn elements(shape: &[i64]) -> Option<i64> {
    shape.iter().try_fold(
        1i64,
        |acc, &d| if d < 0 { None } else { acc.checked_mul(d) },
    )
}

fn infer_node(graph: &Graph, id: NodeId, shapes: &[Vec<Shape>], out: &mut [Shape]) {
    let node = graph.node(id);
    let op = node.op;
    let input = |k| input_shape(graph, shapes, id, k);
    if let Some(recorded) = node
        .attr("_output_shapes")
        .or_else(|| node.attr("output_shapes"))
    {
        let recorded = attr_shapes(recorded);
        if recorded.len() == out.len() {
            out.clone_from_slice(&recorded);
            return;
        }
    }
    out[0] = match op {
        _ if SAME_AS_INPUT.contains(&op) => input(0),
        "LookupTableFindV2" | "LookupTableFind" => input(1),
        _ if BROADCAST.contains(&op) => {
            let count = graph.inputs[id].len();
            let mut acc = input(0);
            for k in 1..count {
                acc = match (acc, input(k)) {
                    (Some(a), Some(b)) => broadcast(&a, &b),
                    _ => None,
                };
            }
            acc
        }
        "Const" => node
            .to_node_def()
            .ok()
            .and_then(|d| {
                d.attr_tensor("value")
                    .ok()
                    .and_then(|t| t.tensor_shape.as_ref().and_then(proto_dims))
            })
            .or(Some(Vec::new())),
        "Shape" => input(0).map(|s| vec![i64::try_from(s.len()).unwrap_or(-1)]),
        "Size" | "Rank" => Some(Vec::new()),
        "Reshape" => const_ints(graph, id, 1).map(|mut dims| {
            if let Some(pos) = dims.iter().position(|&d| d == -1) {
                let known: Option<i64> = dims
                    .iter()
                    .filter(|&&d| d != -1)
                    .try_fold(1i64, |a, &d| a.checked_mul(d));
                if let (Some(total), Some(known)) = (input(0).as_deref().and_then(elements), known)
                {
                    if known > 0 && total % known == 0 {
                        dims[pos] = total / known;
                    }
                }
            }
            dims
        }),
        "ExpandDims" => match (
            input(0),
            const_ints(graph, id, 1).and_then(|a| a.first().copied()),
        ) {
            (Some(mut s), Some(axis)) => {
                let rank = i64::try_from(s.len()).unwrap_or(0);
                let at = if axis < 0 { axis + rank + 1 } else { axis };
                usize::try_from(at).ok().filter(|&a| a <= s.len()).map(|a| {
                    s.insert(a, 1);
                    s
                })
            }
            _ => None,
        },
        "Squeeze" => input(0).and_then(|s| {
            let dims = node
                .attr("squeeze_dims")
                .or_else(|| node.attr("axis"))
                .and_then(|b| view::decode_attr(b).ok())
                .and_then(|a| match a.value {
                    Some(attr_value::Value::List(l)) => Some(l.i),
                    _ => None,
                })
                .unwrap_or_default();
            let rank = i64::try_from(s.len()).ok()?;
            if dims.is_empty() {
                return s
                    .iter()
                    .all(|&d| d != -1)
                    .then(|| s.iter().copied().filter(|&d| d != 1).collect());
            }
            let drop: Vec<usize> = dims
                .iter()
                .map(|&d| usize::try_from(if d < 0 { d + rank } else { d }).ok())
                .collect::<Option<_>>()?;
            Some(
                s.iter()
                    .enumerate()
                    .filter(|(i, _)| !drop.contains(i))
                    .map(|(_, &d)| d)
                    .collect(),
            )
        }),
        "Pack" => {
            let count = graph.inputs[id].len();
            let first = input(0);
            let same = (1..count).all(|k| input(k) == first);
            let axis = node.attr("axis").and_then(view::attr::int).unwrap_or(0);
            match first.filter(|_| same) {
                Some(mut s) => {
                    let rank = i64::try_from(s.len()).unwrap_or(0);
                    let at = if axis < 0 { axis + rank + 1 } else { axis };
                    usize::try_from(at).ok().filter(|&a| a <= s.len()).map(|a| {
                        s.insert(a, i64::try_from(count).unwrap_or(-1));
                        s
                    })
                }
                None => None,
            }
        }
        "ConcatV2" => {
            let count = graph.inputs[id].len().saturating_sub(1);
            let axis = const_ints(graph, id, count).and_then(|a| a.first().copied());
            let parts: Option<Vec<Vec<i64>>> = (0..count).map(&input).collect();
            match (parts, axis) {
                (Some(parts), Some(axis)) if !parts.is_empty() => {
                    let rank = parts[0].len();
                    let a = usize::try_from(if axis < 0 {
                        axis + i64::try_from(rank).unwrap_or(0)
                    } else {
                        axis
                    })
                    .ok();
                    a.filter(|&a| a < rank && parts.iter().all(|p| p.len() == rank))
                        .map(|a| {
                            let mut s = parts[0].clone();
                            s[a] = parts
                                .iter()
                                .try_fold(
                                    0i64,
                                    |acc, p| if p[a] < 0 { None } else { Some(acc + p[a]) },
                                )
                                .unwrap_or(-1);
                            for (i, d) in s.iter_mut().enumerate() {
                                if i != a && parts.iter().any(|p| p[i] != *d) {
                                    *d = -1;
                                }
                            }
                            s
                        })
                }
                _ => None,
            }
        }
        "Unique" => {
            if out.len() > 1 {
                out[1] = input(0);
            }
            Some(vec![-1])
        }
        _ => None,
    };
}

/// The shape as a TensorShapeProto (unknown rank when None).
pub fn to_proto(shape: &Shape) -> TensorShapeProto {
    let mut p = TensorShapeProto::new();
    match shape {
        Some(dims) => {
            p.dim = dims
                .iter()
                .map(|&size| {
                    let mut d = lode_proto::tf::tensor_shape::tensor_shape_proto::Dim::new();
                    d.size = size;
                    d
                })
                .collect();
        }
        None => p.unknown_rank = true,
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[32, 1], &[10]), Some(vec![32, 10]));
        assert_eq!(broadcast(&[-1, 10], &[32, 1]), Some(vec![32, 10]));
        assert_eq!(broadcast(&[], &[3]), Some(vec![3]));
        assert_eq!(broadcast(&[2], &[3]), None);
    }
}
