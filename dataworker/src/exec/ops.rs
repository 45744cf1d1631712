//! The kernel of each op, built from a node's attributes at load time: attributes are read
//! (and checked) once, and the returned closure only runs the kernel.

// Table kernels never panic midway, so a lock poisoned elsewhere still guards a whole table.
use std::sync::{Arc, PoisonError, RwLock};

use lode_proto::attr::NodeAttrs;
use lode_proto::tf::attr_value::attr_value::Value as AttrKind;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::types::DataType;
use protobuf::EnumOrUnknown;

use super::program::{BuildCtx, Built, KernelFn};
use super::value::{Value, VariantTensor};
use super::{ExecError, Failure, Result};
use crate::kernels::lookup::{self, HashTable};
use crate::kernels::math::{self, BinaryOp, Comparison, Reduction};
use crate::kernels::parsing::{
    self, DecodeCsvAttrs, ParseExampleAttrs, ParseSingleExampleAttrs, SparseParts,
};
use crate::kernels::sparse::{self, SparseCrossAttrs};
use crate::kernels::strings::{self, AsStringAttrs};
use crate::kernels::{array, cast, slicing};
use crate::tensor::{DType, Tensor};

type KResult = std::result::Result<Vec<Value>, Failure>;

/// The ops whose nodes only fill a lookup table; the stage runs them once at load.
pub const TABLE_INITIALIZERS: &[&str] = &["LookupTableImportV2", "InitializeTableFromTextFileV2"];

/// Ops that are part of the stage's plumbing rather than computation (handled by the stage).
pub const PLUMBING: &[&str] = &[
    "DWSource",
    "DWRecv",
    "DWSend",
    "IteratorV2",
    "MakeIterator",
    "IteratorGetNext",
    "IteratorToStringHandle",
];

/// Every op [`build`] has a kernel for, for `lode partition`'s up-front report.
pub const SUPPORTED: &[&str] = &[
    "Const",
    "Identity",
    "Snapshot",
    "StopGradient",
    "IdentityN",
    "NoOp",
    "Add",
    "AddV2",
    "Sub",
    "Mul",
    "RealDiv",
    "FloorMod",
    "Maximum",
    "Minimum",
    "Neg",
    "Equal",
    "NotEqual",
    "Less",
    "LessEqual",
    "Greater",
    "GreaterEqual",
    "LogicalAnd",
    "LogicalOr",
    "LogicalNot",
    "Select",
    "SelectV2",
    "Where",
    "Sum",
    "Prod",
    "Mean",
    "Cumsum",
    "Log1p",
    "Cast",
    "Reshape",
    "ExpandDims",
    "Squeeze",
    "ConcatV2",
    "Pack",
    "Unpack",
    "Fill",
    "Range",
    "Shape",
    "Size",
    "Slice",
    "StridedSlice",
    "GatherV2",
    "Tile",
    "Transpose",
    "OneHot",
    "StringToHashBucketFast",
    "StringToHashBucketStrong",
    "StringLower",
    "StringUpper",
    "StringStrip",
    "StringJoin",
    "Substr",
    "StringToNumber",
    "AsString",
    "StringSplitV2",
    "RegexReplace",
    "DecodeCSV",
    "ParseExampleV2",
    "ParseSingleExample",
    "DeserializeSparse",
    "SerializeSparse",
    "Unique",
    "UniqueWithCounts",
    "Bucketize",
    "SparseFillEmptyRows",
    "SparseReshape",
    "SparseToDense",
    "DenseBincount",
    "SparseCross",
    "SparseCrossHashed",
    "HashTableV2",
    "LookupTableFindV2",
    "LookupTableSizeV2",
    "LookupTableImportV2",
    crate::synthetic::FIXED_LATENCY_OP,
    "InitializeTableFromTextFileV2",
];

fn built(outputs: usize, f: impl Fn(&[&Value]) -> KResult + Send + Sync + 'static) -> Built {
    let kernel: KernelFn = Arc::new(f);
    Built { kernel, outputs }
}

fn wrap(ts: Vec<Tensor>) -> Vec<Value> {
    ts.into_iter().map(Value::tensor).collect()
}

/// Input `i` as a dense tensor.
fn t<'v>(args: &[&'v Value], i: usize) -> std::result::Result<&'v Tensor, Failure> {
    match args.get(i) {
        Some(Value::Tensor(t)) => Ok(t),
        Some(_) => Err(Failure::Input {
            index: i,
            reason: "expected a tensor",
        }),
        None => Err(Failure::Input {
            index: i,
            reason: "missing",
        }),
    }
}

/// Inputs `range` as dense tensors.
fn ts<'v>(
    args: &[&'v Value],
    range: std::ops::Range<usize>,
) -> std::result::Result<Vec<&'v Tensor>, Failure> {
    range.map(|i| t(args, i)).collect()
}

fn attr_err(node: &NodeDef, reason: impl Into<String>) -> ExecError {
    ExecError::Graph {
        node: node.name.clone(),
        reason: reason.into(),
    }
}

fn dtype(node: &NodeDef, name: &str) -> Result<DType> {
    let t = node.attr_type(name)?;
    DType::from_proto(EnumOrUnknown::new(t))
        .map_err(|e| attr_err(node, format!("attribute {name}: {e}")))
}

fn dtypes(node: &NodeDef, name: &str) -> Result<Vec<DType>> {
    node.attr_types(name)?
        .into_iter()
        .map(|t| {
            DType::from_proto(EnumOrUnknown::new(t))
                .map_err(|e| attr_err(node, format!("attribute {name}: {e}")))
        })
        .collect()
}

fn count(node: &NodeDef, name: &str) -> Result<usize> {
    let n = node.attr_int(name)?;
    usize::try_from(n).map_err(|_| attr_err(node, format!("attribute {name} = {n} is negative")))
}

fn int_or(node: &NodeDef, name: &str, default: i64) -> Result<i64> {
    if node.attr.contains_key(name) {
        Ok(node.attr_int(name)?)
    } else {
        Ok(default)
    }
}

fn bool_or(node: &NodeDef, name: &str, default: bool) -> Result<bool> {
    if node.attr.contains_key(name) {
        Ok(node.attr_bool(name)?)
    } else {
        Ok(default)
    }
}

fn str_or(node: &NodeDef, name: &str, default: &str) -> Result<String> {
    if node.attr.contains_key(name) {
        Ok(node.attr_str(name)?.to_owned())
    } else {
        Ok(default.to_owned())
    }
}

fn bytes_attr(node: &NodeDef, name: &str, default: &[u8]) -> Result<Vec<u8>> {
    match node.attr.get(name).and_then(|a| a.value.as_ref()) {
        None => Ok(default.to_vec()),
        Some(AttrKind::S(s)) => Ok(s.clone()),
        Some(_) => Err(attr_err(node, format!("attribute {name} is not a string"))),
    }
}

fn list_of<'n>(
    node: &'n NodeDef,
    name: &str,
) -> Result<Option<&'n lode_proto::tf::attr_value::attr_value::ListValue>> {
    match node.attr.get(name).and_then(|a| a.value.as_ref()) {
        None => Ok(None),
        Some(AttrKind::List(l)) => Ok(Some(l)),
        Some(_) => Err(attr_err(node, format!("attribute {name} is not a list"))),
    }
}

fn floats_attr(node: &NodeDef, name: &str) -> Result<Vec<f32>> {
    Ok(list_of(node, name)?
        .map(|l| l.f.clone())
        .unwrap_or_default())
}

fn ints_attr(node: &NodeDef, name: &str) -> Result<Vec<i64>> {
    Ok(list_of(node, name)?
        .map(|l| l.i.clone())
        .unwrap_or_default())
}

fn strings_attr(node: &NodeDef, name: &str) -> Result<Vec<Vec<u8>>> {
    Ok(list_of(node, name)?
        .map(|l| l.s.clone())
        .unwrap_or_default())
}

/// Dims of each shape in a `list(shape)` attribute (-1 for unknown).
fn shapes_attr(node: &NodeDef, name: &str) -> Result<Vec<Vec<i64>>> {
    Ok(node
        .attr_shapes(name)?
        .iter()
        .map(|s| s.dim.iter().map(|d| d.size).collect())
        .collect())
}

/// The kernel for `node`, or None when Lode has none for its op.
pub fn build(node: &NodeDef, ctx: &BuildCtx<'_>) -> Result<Option<Built>> {
    let b = match node.op.as_str() {
        "Const" => {
            let proto = node.attr_tensor("value")?;
            let tensor = Tensor::try_from(proto)
                .map_err(|e| attr_err(node, format!("attribute value: {e}")))?;
            let v = Value::tensor(tensor);
            built(1, move |_| Ok(vec![v.clone()]))
        }
        "Identity" | "Snapshot" | "StopGradient" | "PreventGradient" => built(1, |a| {
            Ok(vec![a.first().map(|v| (*v).clone()).ok_or(
                Failure::Input {
                    index: 0,
                    reason: "missing",
                },
            )?])
        }),
        "IdentityN" => {
            let n = node.attr_types("T")?.len();
            built(n, |a| Ok(a.iter().map(|v| (*v).clone()).collect()))
        }
        "NoOp" => built(0, |_| Ok(Vec::new())),
        op @ ("Add" | "AddV2" | "Sub" | "Mul" | "RealDiv" | "FloorMod" | "Maximum" | "Minimum") => {
            let op = match op {
                "Add" => BinaryOp::Add,
                "AddV2" => BinaryOp::AddV2,
                "Sub" => BinaryOp::Sub,
                "Mul" => BinaryOp::Mul,
                "RealDiv" => BinaryOp::RealDiv,
                "FloorMod" => BinaryOp::FloorMod,
                "Maximum" => BinaryOp::Maximum,
                _ => BinaryOp::Minimum,
            };
            built(1, move |a| Ok(wrap(math::binary(op, t(a, 0)?, t(a, 1)?)?)))
        }
        "Neg" => built(1, |a| Ok(wrap(math::neg(t(a, 0)?)?))),
        op @ ("Equal" | "NotEqual" | "Less" | "LessEqual" | "Greater" | "GreaterEqual") => {
            if !bool_or(node, "incompatible_shape_error", true)? {
                return Err(attr_err(
                    node,
                    "incompatible_shape_error = false is not supported",
                ));
            }
            let op = match op {
                "Equal" => Comparison::Equal,
                "NotEqual" => Comparison::NotEqual,
                "Less" => Comparison::Less,
                "LessEqual" => Comparison::LessEqual,
                "Greater" => Comparison::Greater,
                _ => Comparison::GreaterEqual,
            };
            built(1, move |a| Ok(wrap(math::compare(op, t(a, 0)?, t(a, 1)?)?)))
        }
        "LogicalAnd" => built(1, |a| Ok(wrap(math::logical_and(t(a, 0)?, t(a, 1)?)?))),
        "LogicalOr" => built(1, |a| Ok(wrap(math::logical_or(t(a, 0)?, t(a, 1)?)?))),
        "LogicalNot" => built(1, |a| Ok(wrap(math::logical_not(t(a, 0)?)?))),
        "Select" => built(1, |a| Ok(wrap(math::select(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))),
        "SelectV2" => built(1, |a| {
            Ok(wrap(math::select_v2(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
        }),
        "Where" => built(1, |a| Ok(wrap(math::where_(t(a, 0)?)?))),
        op @ ("Sum" | "Prod" | "Mean") => {
            let op = match op {
                "Sum" => Reduction::Sum,
                "Prod" => Reduction::Prod,
                _ => Reduction::Mean,
            };
            let keep = bool_or(node, "keep_dims", false)?;
            built(1, move |a| {
                Ok(wrap(math::reduce(op, t(a, 0)?, t(a, 1)?, keep)?))
            })
        }
        "Cumsum" => {
            let exclusive = bool_or(node, "exclusive", false)?;
            let reverse = bool_or(node, "reverse", false)?;
            built(1, move |a| {
                Ok(wrap(math::cumsum(t(a, 0)?, t(a, 1)?, exclusive, reverse)?))
            })
        }
        "Log1p" => built(1, |a| Ok(wrap(math::log1p(t(a, 0)?)?))),
        "Cast" => {
            let dst = dtype(node, "DstT")?;
            let truncate = bool_or(node, "Truncate", false)?;
            built(1, move |a| Ok(wrap(cast::cast(t(a, 0)?, dst, truncate)?)))
        }
        "Reshape" => built(1, |a| Ok(wrap(array::reshape(t(a, 0)?, t(a, 1)?)?))),
        "ExpandDims" => built(1, |a| Ok(wrap(array::expand_dims(t(a, 0)?, t(a, 1)?)?))),
        "Squeeze" => {
            let axis = ints_attr(node, "squeeze_dims")?;
            built(1, move |a| Ok(wrap(array::squeeze(t(a, 0)?, &axis)?)))
        }
        "ConcatV2" => {
            let n = count(node, "N")?;
            built(1, move |a| {
                Ok(wrap(array::concat_v2(&ts(a, 0..n)?, t(a, n)?)?))
            })
        }
        "Pack" => {
            let n = count(node, "N")?;
            let axis = int_or(node, "axis", 0)?;
            built(1, move |a| Ok(wrap(array::pack(&ts(a, 0..n)?, axis)?)))
        }
        "Unpack" => {
            let num = node.attr_int("num")?;
            let axis = int_or(node, "axis", 0)?;
            let n = count(node, "num")?;
            built(n, move |a| Ok(wrap(array::unpack(t(a, 0)?, num, axis)?)))
        }
        "Fill" => built(1, |a| Ok(wrap(array::fill(t(a, 0)?, t(a, 1)?)?))),
        "Range" => built(1, |a| Ok(wrap(array::range(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))),
        "Shape" => {
            let out = dtype(node, "out_type")?;
            built(1, move |a| Ok(wrap(array::shape(t(a, 0)?, out)?)))
        }
        "Size" => {
            let out = dtype(node, "out_type")?;
            built(1, move |a| Ok(wrap(array::size(t(a, 0)?, out)?)))
        }
        "Slice" => built(1, |a| {
            Ok(wrap(slicing::slice(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
        }),
        "StridedSlice" => {
            let masks = slicing::StridedSliceMasks {
                begin_mask: int_or(node, "begin_mask", 0)?,
                end_mask: int_or(node, "end_mask", 0)?,
                ellipsis_mask: int_or(node, "ellipsis_mask", 0)?,
                new_axis_mask: int_or(node, "new_axis_mask", 0)?,
                shrink_axis_mask: int_or(node, "shrink_axis_mask", 0)?,
            };
            built(1, move |a| {
                Ok(wrap(slicing::strided_slice(
                    t(a, 0)?,
                    t(a, 1)?,
                    t(a, 2)?,
                    t(a, 3)?,
                    &masks,
                )?))
            })
        }
        "GatherV2" => {
            let batch_dims = int_or(node, "batch_dims", 0)?;
            built(1, move |a| {
                Ok(wrap(slicing::gather_v2(
                    t(a, 0)?,
                    t(a, 1)?,
                    t(a, 2)?,
                    batch_dims,
                )?))
            })
        }
        "Tile" => built(1, |a| Ok(wrap(slicing::tile(t(a, 0)?, t(a, 1)?)?))),
        "Transpose" => built(1, |a| Ok(wrap(slicing::transpose(t(a, 0)?, t(a, 1)?)?))),
        "OneHot" => {
            let axis = int_or(node, "axis", -1)?;
            built(1, move |a| {
                Ok(wrap(slicing::one_hot(
                    t(a, 0)?,
                    t(a, 1)?,
                    t(a, 2)?,
                    t(a, 3)?,
                    axis,
                )?))
            })
        }
        crate::synthetic::FIXED_LATENCY_OP => {
            let latency_us = node.attr_int("latency_us")?;
            let width = node.attr_int("width")?;
            let latency = u64::try_from(latency_us)
                .ok()
                .map(std::time::Duration::from_micros)
                .filter(|l| *l <= crate::synthetic::MAX_LATENCY)
                .ok_or_else(|| attr_err(node, "latency_us must be in [0, 60 s]"))?;
            let width = u64::try_from(width)
                .ok()
                .filter(|w| (1..=crate::synthetic::MAX_WIDTH).contains(w))
                .and_then(|w| usize::try_from(w).ok())
                .ok_or_else(|| attr_err(node, "width must be in [1, 2^20]"))?;
            let spin = node.attr_bool("spin")?;
            // Plans written before `parallelism` existed have one part.
            let parallelism = if node.attr.contains_key("parallelism") {
                u64::try_from(node.attr_int("parallelism")?)
                    .ok()
                    .filter(|p| (1..=crate::synthetic::MAX_PARALLELISM).contains(p))
                    .and_then(|p| usize::try_from(p).ok())
                    .ok_or_else(|| attr_err(node, "parallelism must be in [1, 1024]"))?
            } else {
                1
            };
            built(1, move |a| {
                Ok(wrap(vec![crate::synthetic::fixed_latency(
                    t(a, 0)?,
                    latency,
                    spin,
                    width,
                    parallelism,
                )?]))
            })
        }
        "StringToHashBucketFast" => {
            let buckets = node.attr_int("num_buckets")?;
            built(1, move |a| {
                Ok(wrap(strings::string_to_hash_bucket_fast(
                    t(a, 0)?,
                    buckets,
                )?))
            })
        }
        "StringToHashBucketStrong" => {
            let buckets = node.attr_int("num_buckets")?;
            let key = ints_attr(node, "key")?;
            built(1, move |a| {
                Ok(wrap(strings::string_to_hash_bucket_strong(
                    t(a, 0)?,
                    buckets,
                    &key,
                )?))
            })
        }
        "StringLower" => {
            let enc = str_or(node, "encoding", "")?;
            built(1, move |a| Ok(wrap(strings::string_lower(t(a, 0)?, &enc)?)))
        }
        "StringUpper" => {
            let enc = str_or(node, "encoding", "")?;
            built(1, move |a| Ok(wrap(strings::string_upper(t(a, 0)?, &enc)?)))
        }
        "StringStrip" => built(1, move |a| Ok(wrap(strings::string_strip(t(a, 0)?)?))),
        "StringJoin" => {
            let n = count(node, "N")?;
            let sep = bytes_attr(node, "separator", b"")?;
            built(1, move |a| {
                Ok(wrap(strings::string_join(&ts(a, 0..n)?, &sep)?))
            })
        }
        "Substr" => {
            let unit = str_or(node, "unit", "BYTE")?;
            built(1, move |a| {
                Ok(wrap(strings::substr(t(a, 0)?, t(a, 1)?, t(a, 2)?, &unit)?))
            })
        }
        "StringToNumber" => {
            let out = dtype(node, "out_type")?;
            built(1, move |a| {
                Ok(wrap(strings::string_to_number(t(a, 0)?, out)?))
            })
        }
        "AsString" => {
            let attrs = AsStringAttrs {
                precision: int_or(node, "precision", -1)?,
                scientific: bool_or(node, "scientific", false)?,
                shortest: bool_or(node, "shortest", false)?,
                width: int_or(node, "width", -1)?,
                fill: str_or(node, "fill", "")?,
            };
            built(1, move |a| Ok(wrap(strings::as_string(t(a, 0)?, &attrs)?)))
        }
        "StringSplitV2" => {
            let maxsplit = int_or(node, "maxsplit", -1)?;
            built(3, move |a| {
                Ok(wrap(strings::string_split_v2(
                    t(a, 0)?,
                    t(a, 1)?,
                    maxsplit,
                )?))
            })
        }
        "RegexReplace" => {
            let global = bool_or(node, "replace_global", true)?;
            built(1, move |a| {
                Ok(wrap(strings::regex_replace(
                    t(a, 0)?,
                    t(a, 1)?,
                    t(a, 2)?,
                    global,
                )?))
            })
        }
        "DecodeCSV" => {
            let n = node.attr_types("OUT_TYPE")?.len();
            let attrs = DecodeCsvAttrs {
                field_delim: bytes_attr(node, "field_delim", b",")?,
                use_quote_delim: bool_or(node, "use_quote_delim", true)?,
                na_value: bytes_attr(node, "na_value", b"")?,
                select_cols: ints_attr(node, "select_cols")?,
            };
            built(n, move |a| {
                Ok(wrap(parsing::decode_csv(
                    t(a, 0)?,
                    &ts(a, 1..1 + n)?,
                    &attrs,
                )?))
            })
        }
        "ParseExampleV2" => {
            let ndense = node.attr_types("Tdense")?.len();
            let attrs = ParseExampleAttrs {
                num_sparse: node.attr_int("num_sparse")?,
                sparse_types: dtypes(node, "sparse_types")?,
                ragged_value_types: dtypes(node, "ragged_value_types")?,
                ragged_split_types: dtypes(node, "ragged_split_types")?,
                dense_shapes: shapes_attr(node, "dense_shapes")?,
            };
            let nsparse = count(node, "num_sparse")?;
            let outputs = 3 * nsparse + ndense + 2 * attrs.ragged_value_types.len();
            built(outputs, move |a| {
                Ok(wrap(parsing::parse_example_v2(
                    t(a, 0)?,
                    t(a, 1)?,
                    t(a, 2)?,
                    t(a, 3)?,
                    t(a, 4)?,
                    &ts(a, 5..5 + ndense)?,
                    &attrs,
                )?))
            })
        }
        "ParseSingleExample" => {
            let ndense = node.attr_types("Tdense")?.len();
            let attrs = ParseSingleExampleAttrs {
                num_sparse: node.attr_int("num_sparse")?,
                sparse_keys: strings_attr(node, "sparse_keys")?,
                dense_keys: strings_attr(node, "dense_keys")?,
                sparse_types: dtypes(node, "sparse_types")?,
                dense_shapes: shapes_attr(node, "dense_shapes")?,
            };
            let nsparse = count(node, "num_sparse")?;
            built(3 * nsparse + ndense, move |a| {
                Ok(wrap(parsing::parse_single_example(
                    t(a, 0)?,
                    &ts(a, 1..1 + ndense)?,
                    &attrs,
                )?))
            })
        }
        "SerializeSparse" => {
            let out = node.attr_type("out_type")?;
            if out != DataType::DT_VARIANT {
                return Err(attr_err(
                    node,
                    format!("out_type {out:?} is not supported (only DT_VARIANT)"),
                ));
            }
            built(1, |a| {
                let parts = vec![t(a, 0)?.clone(), t(a, 1)?.clone(), t(a, 2)?.clone()];
                Ok(vec![Value::Variant(Arc::new(VariantTensor {
                    shape: vec![3],
                    elements: parts,
                }))])
            })
        }
        "DeserializeSparse" => {
            let serialized = node.attr_type("Tserialized")?;
            if serialized != DataType::DT_VARIANT {
                return Err(attr_err(
                    node,
                    format!("Tserialized {serialized:?} is not supported (only DT_VARIANT)"),
                ));
            }
            let dt = dtype(node, "dtype")?;
            built(3, move |a| {
                let Some(Value::Variant(v)) = a.first() else {
                    return Err(Failure::Input {
                        index: 0,
                        reason: "expected a variant tensor",
                    });
                };
                let Some((&3, batch)) = v.shape.split_last() else {
                    return Err(Failure::Input {
                        index: 0,
                        reason: "the variant's last dimension must be 3",
                    });
                };
                let elements: Vec<SparseParts<'_>> = v
                    .elements
                    .chunks_exact(3)
                    .map(|c| SparseParts {
                        indices: &c[0],
                        values: &c[1],
                        shape: &c[2],
                    })
                    .collect();
                Ok(wrap(parsing::deserialize_sparse(batch, &elements, dt)?))
            })
        }
        "Unique" => {
            let out = dtype(node, "out_idx")?;
            built(2, move |a| Ok(wrap(sparse::unique(t(a, 0)?, out)?)))
        }
        "UniqueWithCounts" => {
            let out = dtype(node, "out_idx")?;
            built(3, move |a| {
                Ok(wrap(sparse::unique_with_counts(t(a, 0)?, out)?))
            })
        }
        "Bucketize" => {
            let boundaries = floats_attr(node, "boundaries")?;
            built(1, move |a| {
                Ok(wrap(sparse::bucketize(t(a, 0)?, &boundaries)?))
            })
        }
        "SparseFillEmptyRows" => built(4, |a| {
            Ok(wrap(sparse::sparse_fill_empty_rows(
                t(a, 0)?,
                t(a, 1)?,
                t(a, 2)?,
                t(a, 3)?,
            )?))
        }),
        "SparseReshape" => built(2, |a| {
            Ok(wrap(sparse::sparse_reshape(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
        }),
        "SparseToDense" => {
            let validate = bool_or(node, "validate_indices", true)?;
            built(1, move |a| {
                Ok(wrap(sparse::sparse_to_dense(
                    t(a, 0)?,
                    t(a, 1)?,
                    t(a, 2)?,
                    t(a, 3)?,
                    validate,
                )?))
            })
        }
        "DenseBincount" => {
            let binary = bool_or(node, "binary_output", false)?;
            built(1, move |a| {
                Ok(wrap(sparse::dense_bincount(
                    t(a, 0)?,
                    t(a, 1)?,
                    t(a, 2)?,
                    binary,
                )?))
            })
        }
        "SparseCross" => {
            let n = count(node, "N")?;
            let nv = node.attr_types("sparse_types")?.len();
            let nd = node.attr_types("dense_types")?.len();
            let attrs = SparseCrossAttrs {
                hashed_output: node.attr_bool("hashed_output")?,
                num_buckets: node.attr_int("num_buckets")?,
                hash_key: node.attr_int("hash_key")?,
            };
            built(3, move |a| {
                Ok(wrap(sparse::sparse_cross(
                    &ts(a, 0..n)?,
                    &ts(a, n..n + nv)?,
                    &ts(a, n + nv..2 * n + nv)?,
                    &ts(a, 2 * n + nv..2 * n + nv + nd)?,
                    attrs,
                )?))
            })
        }
        "SparseCrossHashed" => {
            let n = count(node, "N")?;
            let nv = node.attr_types("sparse_types")?.len();
            let nd = node.attr_types("dense_types")?.len();
            let end = 2 * n + nv + nd;
            built(3, move |a| {
                Ok(wrap(sparse::sparse_cross_hashed(
                    &ts(a, 0..n)?,
                    &ts(a, n..n + nv)?,
                    &ts(a, n + nv..2 * n + nv)?,
                    &ts(a, 2 * n + nv..end)?,
                    t(a, end)?,
                    t(a, end + 1)?,
                    t(a, end + 2)?,
                )?))
            })
        }
        "HashTableV2" => {
            let key = dtype(node, "key_dtype")?;
            let value = dtype(node, "value_dtype")?;
            let shared = str_or(node, "shared_name", "")?;
            let name = if shared.is_empty() {
                node.name.clone()
            } else {
                shared
            };
            let mut tables = ctx
                .tables
                .lock()
                .map_err(|_| attr_err(node, "the table registry is poisoned"))?;
            let cell = match tables.get(&name) {
                Some(cell) => cell.clone(),
                None => {
                    let table =
                        HashTable::new(key, value).map_err(|e| attr_err(node, e.to_string()))?;
                    let cell = Arc::new(RwLock::new(table));
                    tables.insert(name, cell.clone());
                    cell
                }
            };
            let v = Value::Table(cell);
            built(1, move |_| Ok(vec![v.clone()]))
        }
        "LookupTableFindV2" => built(1, |a| {
            let table = table_of(a)?;
            let guard = table.read().unwrap_or_else(PoisonError::into_inner);
            Ok(wrap(lookup::lookup_table_find_v2(
                &guard,
                t(a, 1)?,
                t(a, 2)?,
            )?))
        }),
        "LookupTableSizeV2" => built(1, |a| {
            let table = table_of(a)?;
            let guard = table.read().unwrap_or_else(PoisonError::into_inner);
            Ok(wrap(lookup::lookup_table_size_v2(&guard)?))
        }),
        "LookupTableImportV2" => built(0, |a| {
            let table = table_of(a)?;
            let mut guard = table.write().unwrap_or_else(PoisonError::into_inner);
            lookup::lookup_table_import_v2(&mut guard, t(a, 1)?, t(a, 2)?)?;
            Ok(Vec::new())
        }),
        "InitializeTableFromTextFileV2" => {
            let key_index = node.attr_int("key_index")?;
            let value_index = node.attr_int("value_index")?;
            let vocab_size = int_or(node, "vocab_size", -1)?;
            let delimiter = str_or(node, "delimiter", "\t")?;
            if int_or(node, "offset", 0)? != 0 {
                return Err(attr_err(node, "a non-zero offset is not supported"));
            }
            let root = ctx.data_root.to_owned();
            built(0, move |a| {
                let table = table_of(a)?;
                let name = t(a, 1)?;
                let resolved = resolve_file(name, &root)?;
                let mut guard = table.write().unwrap_or_else(PoisonError::into_inner);
                lookup::initialize_table_from_text_file_v2(
                    &mut guard,
                    &resolved,
                    key_index,
                    value_index,
                    vocab_size,
                    &delimiter,
                )?;
                Ok(Vec::new())
            })
        }
        _ => return Ok(None),
    };
    Ok(Some(b))
}

/// TensorFlow's default graph optimizer (grappler's constant folding,
/// `ReduceDivToReciprocalMul`) rewrites `x / c` with a constant float `c` into `x * (1 / c)`
/// unless the division's own output is fetched; the training program runs that rewritten
/// graph, so Lode computes the same: the reciprocal once at load, a multiplication per step.
/// None when `c` is not a float tensor.
pub fn real_div_by_constant(c: &Tensor) -> Option<KernelFn> {
    let ones = match c.data() {
        crate::TensorData::Float32(v) => crate::TensorData::Float32(vec![1.0; v.len()]),
        crate::TensorData::Float64(v) => crate::TensorData::Float64(vec![1.0; v.len()]),
        _ => return None,
    };
    let ones = Tensor::new(c.shape().to_vec(), ones).ok()?;
    let reciprocal = math::binary(BinaryOp::RealDiv, &ones, c)
        .ok()?
        .into_iter()
        .next()?;
    let kernel: KernelFn =
        Arc::new(move |a: &[&Value]| Ok(wrap(math::binary(BinaryOp::Mul, t(a, 0)?, &reciprocal)?)));
    Some(kernel)
}

fn table_of<'v>(a: &[&'v Value]) -> std::result::Result<&'v Arc<super::value::TableCell>, Failure> {
    match a.first() {
        Some(Value::Table(cell)) => Ok(cell),
        _ => Err(Failure::Input {
            index: 0,
            reason: "expected a table handle",
        }),
    }
}

/// A scalar file-name tensor with a relative name joined onto `root`.
fn resolve_file(name: &Tensor, root: &std::path::Path) -> std::result::Result<Tensor, Failure> {
    let crate::TensorData::String(v) = name.data() else {
        return Err(Failure::Input {
            index: 1,
            reason: "the file name must be a string",
        });
    };
    let [one] = v.as_slice() else {
        return Err(Failure::Input {
            index: 1,
            reason: "the file name must be a scalar",
        });
    };
    let path = std::path::Path::new(std::str::from_utf8(one).map_err(|_| Failure::Input {
        index: 1,
        reason: "the file name is not UTF-8",
    })?);
    if path.is_absolute() {
        return Ok(name.clone());
    }
    let joined = root.join(path);
    Ok(Tensor::new(
        Vec::new(),
        crate::TensorData::String(vec![joined.to_string_lossy().into_owned().into_bytes()]),
    )?)
}
