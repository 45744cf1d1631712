//! Constant folding of the scalar arguments of dataset ops (seeds, buffer sizes, counts, batch
//! sizes, `drop_remainder`), with TensorFlow's semantics.
//!
//! TensorFlow 2.18 writes some of them as small input-independent subgraphs rather than as
//! `Const`s: `shuffle(buffer, seed=S)` passes `seed2` through
//! `SelectV2(LogicalAnd(Equal(seed, 0), Equal(seed2, 0)), 2**31 - 1, seed2)`. [`scalar`]
//! evaluates such a subgraph exactly (integers wrap at their width as TensorFlow's kernels do;
//! division by zero, an op it does not know, a non-scalar or anything fed is "unknown").

use lode_proto::attr::NodeAttrs;
use lode_proto::tf::tensor::TensorProto;
use lode_proto::tf::types::DataType;

use crate::graph::{Graph, Tensor};

/// Subgraph depth followed at most (a guard against hostile graphs; seeds need 4).
const MAX_DEPTH: usize = 32;

/// A folded scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    I64(i64),
    I32(i32),
    Bool(bool),
}

impl Scalar {
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Scalar::I64(v) => Some(v),
            Scalar::I32(v) => Some(i64::from(v)),
            Scalar::Bool(_) => None,
        }
    }

    pub fn as_bool(self) -> Option<bool> {
        match self {
            Scalar::Bool(b) => Some(b),
            _ => None,
        }
    }

    fn of_type(self, dtype: DataType) -> Option<Scalar> {
        Some(match dtype {
            DataType::DT_INT64 => Scalar::I64(match self {
                Scalar::I64(v) => v,
                Scalar::I32(v) => i64::from(v),
                Scalar::Bool(b) => i64::from(b),
            }),
            // A narrowing cast keeps the low 32 bits, as static_cast does.
            DataType::DT_INT32 => Scalar::I32(match self {
                Scalar::I64(v) => i32::from_le_bytes(v.to_le_bytes()[..4].try_into().ok()?),
                Scalar::I32(v) => v,
                Scalar::Bool(b) => i32::from(b),
            }),
            DataType::DT_BOOL => Scalar::Bool(match self {
                Scalar::I64(v) => v != 0,
                Scalar::I32(v) => v != 0,
                Scalar::Bool(b) => b,
            }),
            _ => return None,
        })
    }
}

/// The value of tensor `t` when it is a scalar that does not depend on any input.
pub fn scalar(graph: &Graph, t: Tensor) -> Option<Scalar> {
    eval(graph, t, 0)
}

/// The value of a `Const` tensor proto holding one element.
pub fn const_scalar(t: &TensorProto) -> Option<Scalar> {
    let first8 = || -> Option<[u8; 8]> { t.tensor_content.get(..8)?.try_into().ok() };
    let first4 = || -> Option<[u8; 4]> { t.tensor_content.get(..4)?.try_into().ok() };
    match t.dtype.enum_value().ok()? {
        DataType::DT_INT64 => t
            .int64_val
            .first()
            .copied()
            .or_else(|| first8().map(i64::from_le_bytes))
            .map(Scalar::I64),
        DataType::DT_INT32 => t
            .int_val
            .first()
            .copied()
            .or_else(|| first4().map(i32::from_le_bytes))
            .map(Scalar::I32),
        DataType::DT_BOOL => t
            .bool_val
            .first()
            .copied()
            .or_else(|| t.tensor_content.first().map(|b| *b != 0))
            .map(Scalar::Bool),
        _ => None,
    }
}

fn eval(graph: &Graph, t: Tensor, depth: usize) -> Option<Scalar> {
    if depth > MAX_DEPTH || t.output != 0 {
        return None;
    }
    let node = graph.node(t.node);
    let arg = |k: usize| {
        graph.inputs[t.node]
            .get(k)
            .and_then(|&input| eval(graph, input, depth + 1))
    };
    let ints = |f: fn(i64, i64) -> Option<i64>, g: fn(i32, i32) -> Option<i32>| {
        Some(match (arg(0)?, arg(1)?) {
            (Scalar::I64(a), Scalar::I64(b)) => Scalar::I64(f(a, b)?),
            (Scalar::I32(a), Scalar::I32(b)) => Scalar::I32(g(a, b)?),
            _ => return None,
        })
    };
    let compare = |f: fn(std::cmp::Ordering) -> bool| {
        let ordering = match (arg(0)?, arg(1)?) {
            (Scalar::I64(a), Scalar::I64(b)) => a.cmp(&b),
            (Scalar::I32(a), Scalar::I32(b)) => a.cmp(&b),
            (Scalar::Bool(a), Scalar::Bool(b)) => a.cmp(&b),
            _ => return None,
        };
        Some(Scalar::Bool(f(ordering)))
    };
    let logic =
        |f: fn(bool, bool) -> bool| Some(Scalar::Bool(f(arg(0)?.as_bool()?, arg(1)?.as_bool()?)));
    match node.op {
        "Const" => {
            let def = node.to_node_def().ok()?;
            let value = def.attr_tensor("value").ok()?;
            let elements: i64 = value
                .tensor_shape
                .as_ref()
                .map_or(1, |s| s.dim.iter().map(|d| d.size).product());
            if elements != 1 {
                return None;
            }
            const_scalar(value)
        }
        "Identity" | "Snapshot" | "StopGradient" | "Reshape" | "Squeeze" => arg(0),
        "Cast" => {
            let def = node.to_node_def().ok()?;
            arg(0)?.of_type(def.attr_type("DstT").ok()?)
        }
        "Equal" => compare(|o| o.is_eq()),
        "NotEqual" => compare(|o| o.is_ne()),
        "Less" => compare(|o| o.is_lt()),
        "LessEqual" => compare(|o| o.is_le()),
        "Greater" => compare(|o| o.is_gt()),
        "GreaterEqual" => compare(|o| o.is_ge()),
        "LogicalAnd" => logic(|a, b| a && b),
        "LogicalOr" => logic(|a, b| a || b),
        "LogicalNot" => Some(Scalar::Bool(!arg(0)?.as_bool()?)),
        "Select" | "SelectV2" => {
            if arg(0)?.as_bool()? {
                arg(1)
            } else {
                arg(2)
            }
        }
        "Add" | "AddV2" => ints(
            |a, b| Some(a.wrapping_add(b)),
            |a, b| Some(a.wrapping_add(b)),
        ),
        "Sub" => ints(
            |a, b| Some(a.wrapping_sub(b)),
            |a, b| Some(a.wrapping_sub(b)),
        ),
        "Mul" => ints(
            |a, b| Some(a.wrapping_mul(b)),
            |a, b| Some(a.wrapping_mul(b)),
        ),
        "Maximum" => ints(|a, b| Some(a.max(b)), |a, b| Some(a.max(b))),
        "Minimum" => ints(|a, b| Some(a.min(b)), |a, b| Some(a.min(b))),
        "FloorDiv" => ints(floor_div_i64, floor_div_i32),
        "FloorMod" => ints(floor_mod_i64, floor_mod_i32),
        "Neg" => Some(match arg(0)? {
            Scalar::I64(v) => Scalar::I64(v.wrapping_neg()),
            Scalar::I32(v) => Scalar::I32(v.wrapping_neg()),
            Scalar::Bool(_) => return None,
        }),
        _ => None,
    }
}

fn floor_div_i64(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    Some(if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    })
}

fn floor_div_i32(a: i32, b: i32) -> Option<i32> {
    let q = a.checked_div(b)?;
    Some(if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    })
}

fn floor_mod_i64(a: i64, b: i64) -> Option<i64> {
    let r = a.checked_rem(b)?;
    Some(if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    })
}

fn floor_mod_i32(a: i32, b: i32) -> Option<i32> {
    let r = a.checked_rem(b)?;
    Some(if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_division_rounds_down() {
        assert_eq!(floor_div_i64(-7, 2), Some(-4));
        assert_eq!(floor_mod_i64(-7, 2), Some(1));
        assert_eq!(floor_mod_i64(7, -2), Some(-1));
        assert_eq!(floor_div_i32(7, 0), None);
        assert_eq!(floor_div_i64(i64::MIN, -1), None);
    }

    #[test]
    fn casts_narrow_like_static_cast() {
        assert_eq!(
            Scalar::I64(0x1_0000_0005).of_type(DataType::DT_INT32),
            Some(Scalar::I32(5))
        );
        assert_eq!(
            Scalar::I32(-1).of_type(DataType::DT_INT64),
            Some(Scalar::I64(-1))
        );
        assert_eq!(
            Scalar::I64(2).of_type(DataType::DT_BOOL),
            Some(Scalar::Bool(true))
        );
    }
}
