//! The kernel of each op, built from a node's attributes at load time: attributes are read
//! (and checked) once, and the returned closure only runs the kernel.

// Table kernels never panic midway, so a lock poisoned elsewhere still guards a whole table.
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use lode_proto::attr::NodeAttrs;
use lode_proto::tf::attr_value::attr_value::Value as AttrKind;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::types::DataType;
use protobuf::EnumOrUnknown;

use super::program::{BuildCtx, Built, KernelFn};
use super::value::{Value, VariantTensor};
use super::{ExecError, Failure, Result};
use crate::kernels::lookup::{self, HashTable};
use crate::kernels::math::segment::{self, SegmentOp};
use crate::kernels::math::sparse_segment::{self, SparseSegmentOp};
use crate::kernels::math::{self, BinaryOp, Comparison, Reduction, UnaryOp};
use crate::kernels::parsing::{
    self, DecodeCsvAttrs, ParseExampleAttrs, ParseSingleExampleAttrs, SparseParts,
};
use crate::kernels::ragged::{self, NGramAttrs};
use crate::kernels::sparse::{self, SparseCrossAttrs};
use crate::kernels::strings::{self, AsStringAttrs};
use crate::kernels::unicode::{self, DecodeAttrs, Errors};
use crate::kernels::{array, cast, indexing, slicing};
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

/// Builds an op's kernel from a node: reads and checks the node's attributes once, and returns
/// the closure that runs the kernel on each step.
pub type Builder = fn(&NodeDef, &BuildCtx<'_>) -> Result<Built>;

/// One op of a kernel registry and the builder of its kernel.
#[derive(Debug, Clone, Copy)]
pub struct KernelEntry {
    pub op: &'static str,
    pub build: Builder,
}

/// A registry entry (a `const fn`, so that the tables are plain statics).
pub const fn entry(op: &'static str, build: Builder) -> KernelEntry {
    KernelEntry { op, build }
}

/// The production kernel registry: every TensorFlow op a data worker runs natively, once.
/// Everything else is derived from it: [`supported`], [`has_kernel`] (what the partitioner
/// keeps on the data side and what a stage load accepts), `lode kernels`. Lode's own
/// benchmark ops live apart, in [`crate::synthetic::KERNELS`], so that no user graph is
/// planned around them.
pub static KERNELS: &[KernelEntry] = &[
    entry("Const", const_),
    entry("Identity", identity),
    entry("Snapshot", identity),
    entry("StopGradient", identity),
    entry("PreventGradient", identity),
    entry("IdentityN", identity_n),
    entry("NoOp", no_op),
    entry("Add", binary),
    entry("AddV2", binary),
    entry("Sub", binary),
    entry("Mul", binary),
    entry("RealDiv", binary),
    entry("FloorMod", binary),
    entry("FloorDiv", binary),
    entry("Maximum", binary),
    entry("Minimum", binary),
    entry("Neg", neg),
    entry("Abs", abs),
    entry("Equal", comparison),
    entry("NotEqual", comparison),
    entry("Less", comparison),
    entry("LessEqual", comparison),
    entry("Greater", comparison),
    entry("GreaterEqual", comparison),
    entry("LogicalAnd", logical_and),
    entry("LogicalOr", logical_or),
    entry("LogicalNot", logical_not),
    entry("Select", select),
    entry("SelectV2", select_v2),
    entry("Where", where_),
    entry("Sum", reduction),
    entry("Prod", reduction),
    entry("Mean", reduction),
    entry("Max", reduction),
    entry("Min", reduction),
    entry("All", reduction),
    entry("Any", reduction),
    entry("SegmentSum", segment),
    entry("SegmentProd", segment),
    entry("SegmentMax", segment),
    entry("SegmentMin", segment),
    entry("SegmentMean", segment),
    entry("UnsortedSegmentSum", unsorted_segment),
    entry("UnsortedSegmentProd", unsorted_segment),
    entry("UnsortedSegmentMax", unsorted_segment),
    entry("UnsortedSegmentMin", unsorted_segment),
    entry("SparseSegmentSum", sparse_segment_),
    entry("SparseSegmentMean", sparse_segment_),
    entry("SparseSegmentSqrtN", sparse_segment_),
    entry("SparseSegmentSumWithNumSegments", sparse_segment_),
    entry("SparseSegmentMeanWithNumSegments", sparse_segment_),
    entry("SparseSegmentSqrtNWithNumSegments", sparse_segment_),
    entry("Cumsum", cumulative),
    entry("Cumprod", cumulative),
    entry("Log1p", log1p),
    entry("Ceil", unary),
    entry("Floor", unary),
    entry("Sqrt", unary),
    entry("Cast", cast_),
    entry("Reshape", reshape),
    entry("ExpandDims", expand_dims),
    entry("Squeeze", squeeze),
    entry("ConcatV2", concat_v2),
    entry("Pack", pack),
    entry("Unpack", unpack),
    entry("Fill", fill),
    entry("Range", range),
    entry("Shape", shape),
    entry("Size", size),
    entry("Slice", slice),
    entry("StridedSlice", strided_slice),
    entry("GatherV2", gather_v2),
    entry("GatherNd", gather_nd),
    entry("ScatterNd", scatter_nd),
    entry("BroadcastTo", broadcast_to),
    entry("Assert", assert_),
    entry("If", if_),
    entry("StatelessIf", if_),
    entry("Tile", tile),
    entry("Transpose", transpose),
    entry("OneHot", one_hot),
    entry("StringToHashBucketFast", string_to_hash_bucket_fast),
    entry("StringToHashBucketStrong", string_to_hash_bucket_strong),
    entry("StringLower", string_lower),
    entry("StringUpper", string_upper),
    entry("StringJoin", string_join),
    entry("Substr", substr),
    entry("StringToNumber", string_to_number),
    entry("AsString", as_string),
    entry("StringSplitV2", string_split_v2),
    entry("StringNGrams", string_ngrams),
    entry("ReduceJoin", reduce_join),
    entry("UnicodeDecode", unicode_decode),
    entry("UnicodeTranscode", unicode_transcode),
    entry("RaggedTensorToTensor", ragged_tensor_to_tensor),
    entry("RaggedTensorToSparse", ragged_tensor_to_sparse),
    entry("RegexReplace", regex_replace),
    entry("StringLength", string_length),
    entry("StringStrip", string_strip),
    entry("StaticRegexReplace", static_regex_replace),
    entry("RegexFullMatch", regex_full_match),
    entry("StaticRegexFullMatch", static_regex_full_match),
    entry("DecodeCSV", decode_csv),
    entry("ParseExampleV2", parse_example_v2),
    entry("ParseSingleExample", parse_single_example),
    entry("SerializeSparse", serialize_sparse),
    entry("DeserializeSparse", deserialize_sparse),
    entry("Unique", unique_),
    entry("UniqueWithCounts", unique_with_counts),
    entry("Bucketize", bucketize),
    entry("SparseFillEmptyRows", sparse_fill_empty_rows),
    entry("SparseReorder", sparse_reorder),
    entry("SparseSlice", sparse_slice),
    entry("SparseReshape", sparse_reshape),
    entry("SparseToDense", sparse_to_dense),
    entry("DenseBincount", dense_bincount),
    entry("Bincount", bincount),
    entry("SparseCountSparseOutput", sparse_count_sparse_output),
    entry("SparseCross", sparse_cross),
    entry("SparseCrossHashed", sparse_cross_hashed),
    entry("HashTableV2", hash_table_v2),
    entry("LookupTableFindV2", lookup_table_find_v2),
    entry("LookupTableSizeV2", lookup_table_size_v2),
    entry("LookupTableImportV2", lookup_table_import_v2),
    entry(
        "InitializeTableFromTextFileV2",
        initialize_table_from_text_file_v2,
    ),
];

pub(crate) fn built(
    outputs: usize,
    f: impl Fn(&[&Value]) -> KResult + Send + Sync + 'static,
) -> Built {
    let kernel: KernelFn = Arc::new(f);
    Built { kernel, outputs }
}

pub(crate) fn wrap(ts: Vec<Tensor>) -> Vec<Value> {
    ts.into_iter().map(Value::tensor).collect()
}

/// Input `i` as a dense tensor.
pub(crate) fn t<'v>(args: &[&'v Value], i: usize) -> std::result::Result<&'v Tensor, Failure> {
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

pub(crate) fn attr_err(node: &NodeDef, reason: impl Into<String>) -> ExecError {
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

/// The production registry by op (built once).
fn index() -> &'static HashMap<&'static str, &'static KernelEntry> {
    static INDEX: OnceLock<HashMap<&'static str, &'static KernelEntry>> = OnceLock::new();
    INDEX.get_or_init(|| KERNELS.iter().map(|k| (k.op, k)).collect())
}

/// The registry entry of `op`: a production op, or one of Lode's benchmark ops (which only
/// `lode synthetic` plans use).
pub fn kernel(op: &str) -> Option<&'static KernelEntry> {
    index()
        .get(op)
        .copied()
        .or_else(|| crate::synthetic::KERNELS.iter().find(|k| k.op == op))
}

/// Whether `op` is in the production registry (benchmark ops are not).
pub fn has_kernel(op: &str) -> bool {
    index().contains_key(op)
}

/// The ops of the production registry, in registry order.
pub fn supported() -> impl Iterator<Item = &'static str> {
    KERNELS.iter().map(|k| k.op)
}

/// The kernel for `node`, or None when Lode has none for its op.
pub fn build(node: &NodeDef, ctx: &BuildCtx<'_>) -> Result<Option<Built>> {
    kernel(&node.op).map(|k| (k.build)(node, ctx)).transpose()
}
fn const_(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let proto = node.attr_tensor("value")?;
    let tensor =
        Tensor::try_from(proto).map_err(|e| attr_err(node, format!("attribute value: {e}")))?;
    let v = Value::tensor(tensor);
    Ok(built(1, move |_| Ok(vec![v.clone()])))
}

fn identity(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(vec![a.first().map(|v| (*v).clone()).ok_or(
            Failure::Input {
                index: 0,
                reason: "missing",
            },
        )?])
    }))
}

fn identity_n(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let n = node.attr_types("T")?.len();
    Ok(built(n, |a| Ok(a.iter().map(|v| (*v).clone()).collect())))
}

fn no_op(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(0, |_| Ok(Vec::new())))
}

fn binary(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let op = node.op.as_str();
    let op = match op {
        "Add" => BinaryOp::Add,
        "AddV2" => BinaryOp::AddV2,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        "RealDiv" => BinaryOp::RealDiv,
        "FloorMod" => BinaryOp::FloorMod,
        "FloorDiv" => BinaryOp::FloorDiv,
        "Maximum" => BinaryOp::Maximum,
        _ => BinaryOp::Minimum,
    };
    Ok(built(1, move |a| {
        Ok(wrap(math::binary(op, t(a, 0)?, t(a, 1)?)?))
    }))
}

fn unary(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let op = match node.op.as_str() {
        "Ceil" => UnaryOp::Ceil,
        "Floor" => UnaryOp::Floor,
        _ => UnaryOp::Sqrt,
    };
    Ok(built(1, move |a| Ok(wrap(math::unary(op, t(a, 0)?)?))))
}

fn sparse_segment_(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let name = node.op.as_str();
    let with_num = name.ends_with("WithNumSegments");
    let op = match name.trim_end_matches("WithNumSegments") {
        "SparseSegmentSum" => SparseSegmentOp::Sum,
        "SparseSegmentMean" => SparseSegmentOp::Mean,
        _ => SparseSegmentOp::SqrtN,
    };
    Ok(built(1, move |a| {
        let num = if with_num { Some(t(a, 3)?) } else { None };
        Ok(wrap(sparse_segment::sparse_segment(
            op,
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            num,
        )?))
    }))
}

fn abs(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(math::abs(t(a, 0)?)?))))
}

fn neg(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(math::neg(t(a, 0)?)?))))
}

fn comparison(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let op = node.op.as_str();
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
    Ok(built(1, move |a| {
        Ok(wrap(math::compare(op, t(a, 0)?, t(a, 1)?)?))
    }))
}

fn logical_and(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(math::logical_and(t(a, 0)?, t(a, 1)?)?))
    }))
}

fn logical_or(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(math::logical_or(t(a, 0)?, t(a, 1)?)?))
    }))
}

fn logical_not(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(math::logical_not(t(a, 0)?)?))))
}

fn select(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(math::select(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
    }))
}

fn select_v2(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(math::select_v2(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
    }))
}

fn where_(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(math::where_(t(a, 0)?)?))))
}

fn segment_op(node: &NodeDef) -> Result<SegmentOp> {
    let op = node.op.as_str();
    Ok(match op.strip_prefix("Unsorted").unwrap_or(op) {
        "SegmentSum" => SegmentOp::Sum,
        "SegmentProd" => SegmentOp::Prod,
        "SegmentMax" => SegmentOp::Max,
        "SegmentMin" => SegmentOp::Min,
        "SegmentMean" => SegmentOp::Mean,
        _ => return Err(attr_err(node, format!("{op} is not a segment reduction"))),
    })
}

fn segment(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let op = segment_op(node)?;
    Ok(built(1, move |a| {
        Ok(wrap(segment::segment(op, t(a, 0)?, t(a, 1)?)?))
    }))
}

fn unsorted_segment(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let op = segment_op(node)?;
    Ok(built(1, move |a| {
        Ok(wrap(segment::unsorted_segment(
            op,
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
        )?))
    }))
}

fn reduction(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let op = match node.op.as_str() {
        "Sum" => Reduction::Sum,
        "Prod" => Reduction::Prod,
        "Mean" => Reduction::Mean,
        "Max" => Reduction::Max,
        "Min" => Reduction::Min,
        "All" => Reduction::All,
        "Any" => Reduction::Any,
        other => return Err(attr_err(node, format!("{other} is not a reduction"))),
    };
    let keep = bool_or(node, "keep_dims", false)?;
    Ok(built(1, move |a| {
        Ok(wrap(math::reduce(op, t(a, 0)?, t(a, 1)?, keep)?))
    }))
}

/// `Cumsum` and `Cumprod`.
fn cumulative(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let exclusive = bool_or(node, "exclusive", false)?;
    let reverse = bool_or(node, "reverse", false)?;
    let f = match node.op.as_str() {
        "Cumsum" => math::cumsum,
        "Cumprod" => math::cumprod,
        other => return Err(attr_err(node, format!("{other} is not a cumulative op"))),
    };
    Ok(built(1, move |a| {
        Ok(wrap(f(t(a, 0)?, t(a, 1)?, exclusive, reverse)?))
    }))
}

fn log1p(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(math::log1p(t(a, 0)?)?))))
}

fn cast_(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let dst = dtype(node, "DstT")?;
    let truncate = bool_or(node, "Truncate", false)?;
    Ok(built(1, move |a| {
        Ok(wrap(cast::cast(t(a, 0)?, dst, truncate)?))
    }))
}

fn reshape(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(array::reshape(t(a, 0)?, t(a, 1)?)?))))
}

fn expand_dims(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(array::expand_dims(t(a, 0)?, t(a, 1)?)?))
    }))
}

fn squeeze(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let axis = ints_attr(node, "squeeze_dims")?;
    Ok(built(1, move |a| {
        Ok(wrap(array::squeeze(t(a, 0)?, &axis)?))
    }))
}

fn concat_v2(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let n = count(node, "N")?;
    Ok(built(1, move |a| {
        Ok(wrap(array::concat_v2(&ts(a, 0..n)?, t(a, n)?)?))
    }))
}

fn pack(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let n = count(node, "N")?;
    let axis = int_or(node, "axis", 0)?;
    Ok(built(1, move |a| {
        Ok(wrap(array::pack(&ts(a, 0..n)?, axis)?))
    }))
}

fn unpack(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let num = node.attr_int("num")?;
    let axis = int_or(node, "axis", 0)?;
    let n = count(node, "num")?;
    Ok(built(n, move |a| {
        Ok(wrap(array::unpack(t(a, 0)?, num, axis)?))
    }))
}

fn fill(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(array::fill(t(a, 0)?, t(a, 1)?)?))))
}

fn range(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(array::range(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
    }))
}

fn shape(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let out = dtype(node, "out_type")?;
    Ok(built(1, move |a| Ok(wrap(array::shape(t(a, 0)?, out)?))))
}

fn size(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let out = dtype(node, "out_type")?;
    Ok(built(1, move |a| Ok(wrap(array::size(t(a, 0)?, out)?))))
}

fn slice(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(slicing::slice(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
    }))
}

fn strided_slice(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let masks = slicing::StridedSliceMasks {
        begin_mask: int_or(node, "begin_mask", 0)?,
        end_mask: int_or(node, "end_mask", 0)?,
        ellipsis_mask: int_or(node, "ellipsis_mask", 0)?,
        new_axis_mask: int_or(node, "new_axis_mask", 0)?,
        shrink_axis_mask: int_or(node, "shrink_axis_mask", 0)?,
    };
    Ok(built(1, move |a| {
        Ok(wrap(slicing::strided_slice(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            t(a, 3)?,
            &masks,
        )?))
    }))
}

fn gather_v2(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let batch_dims = int_or(node, "batch_dims", 0)?;
    Ok(built(1, move |a| {
        Ok(wrap(slicing::gather_v2(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            batch_dims,
        )?))
    }))
}

fn tile(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(slicing::tile(t(a, 0)?, t(a, 1)?)?))))
}

fn transpose(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(slicing::transpose(t(a, 0)?, t(a, 1)?)?))
    }))
}

fn one_hot(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let axis = int_or(node, "axis", -1)?;
    Ok(built(1, move |a| {
        Ok(wrap(slicing::one_hot(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            t(a, 3)?,
            axis,
        )?))
    }))
}

fn string_to_hash_bucket_fast(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let buckets = node.attr_int("num_buckets")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::string_to_hash_bucket_fast(
            t(a, 0)?,
            buckets,
        )?))
    }))
}

fn string_to_hash_bucket_strong(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let buckets = node.attr_int("num_buckets")?;
    let key = ints_attr(node, "key")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::string_to_hash_bucket_strong(
            t(a, 0)?,
            buckets,
            &key,
        )?))
    }))
}

fn string_lower(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let enc = str_or(node, "encoding", "")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::string_lower(t(a, 0)?, &enc)?))
    }))
}

fn string_upper(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let enc = str_or(node, "encoding", "")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::string_upper(t(a, 0)?, &enc)?))
    }))
}

fn string_join(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let n = count(node, "N")?;
    let sep = bytes_attr(node, "separator", b"")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::string_join(&ts(a, 0..n)?, &sep)?))
    }))
}

fn substr(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let unit = str_or(node, "unit", "BYTE")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::substr(t(a, 0)?, t(a, 1)?, t(a, 2)?, &unit)?))
    }))
}

fn string_to_number(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let out = dtype(node, "out_type")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::string_to_number(t(a, 0)?, out)?))
    }))
}

fn as_string(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let attrs = AsStringAttrs {
        precision: int_or(node, "precision", -1)?,
        scientific: bool_or(node, "scientific", false)?,
        shortest: bool_or(node, "shortest", false)?,
        width: int_or(node, "width", -1)?,
        fill: str_or(node, "fill", "")?,
    };
    Ok(built(1, move |a| {
        Ok(wrap(strings::as_string(t(a, 0)?, &attrs)?))
    }))
}

fn string_ngrams(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let attrs = NGramAttrs {
        separator: bytes_attr(node, "separator", b" ")?,
        ngram_widths: ints_attr(node, "ngram_widths")?,
        left_pad: bytes_attr(node, "left_pad", b"")?,
        right_pad: bytes_attr(node, "right_pad", b"")?,
        pad_width: int_or(node, "pad_width", 0)?,
        preserve_short_sequences: bool_or(node, "preserve_short_sequences", false)?,
    };
    Ok(built(2, move |a| {
        Ok(wrap(ragged::string_ngrams(t(a, 0)?, t(a, 1)?, &attrs)?))
    }))
}

fn reduce_join(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let keep_dims = bool_or(node, "keep_dims", false)?;
    let separator = bytes_attr(node, "separator", b"")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::reduce_join(
            t(a, 0)?,
            t(a, 1)?,
            keep_dims,
            &separator,
        )?))
    }))
}

fn decode_attrs(node: &NodeDef) -> Result<DecodeAttrs> {
    let errors = str_or(node, "errors", "replace")?;
    let encoding = str_or(node, "input_encoding", "")?;
    if encoding != "UTF-8" {
        return Err(attr_err(
            node,
            format!("input_encoding {encoding:?}: only UTF-8 input is supported"),
        ));
    }
    Ok(DecodeAttrs {
        input_encoding: str_or(node, "input_encoding", "")?,
        errors: Errors::parse("UnicodeDecode", &errors)
            .map_err(|e| attr_err(node, e.to_string()))?,
        replacement_char: int_or(node, "replacement_char", 0xfffd)?,
        replace_control_characters: bool_or(node, "replace_control_characters", false)?,
    })
}

fn unicode_decode(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let attrs = decode_attrs(node)?;
    let tsplits = if node.attr.contains_key("Tsplits") {
        dtype(node, "Tsplits")?
    } else {
        DType::Int64
    };
    Ok(built(2, move |a| {
        Ok(wrap(unicode::unicode_decode(t(a, 0)?, &attrs, tsplits)?))
    }))
}

fn unicode_transcode(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let attrs = decode_attrs(node)?;
    let out = str_or(node, "output_encoding", "UTF-8")?;
    if !matches!(out.as_str(), "UTF-8" | "UTF-16-BE" | "UTF-32-BE") {
        return Err(attr_err(
            node,
            format!("output_encoding {out:?} is not supported"),
        ));
    }
    Ok(built(1, move |a| {
        Ok(wrap(unicode::unicode_transcode(t(a, 0)?, &attrs, &out)?))
    }))
}

fn ragged_tensor_to_tensor(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let types: Vec<String> = strings_attr(node, "row_partition_types")?
        .into_iter()
        .map(|s| String::from_utf8_lossy(&s).into_owned())
        .collect();
    let n = count(node, "num_row_partition_tensors")?;
    // Refused at load, not at the first step: only ragged rank 1 is supported.
    let kinds: Vec<&str> = types.iter().map(String::as_str).collect();
    if !matches!(
        kinds.as_slice(),
        ["ROW_SPLITS"] | ["FIRST_DIM_SIZE", "VALUE_ROWIDS"]
    ) || n != kinds.len()
    {
        return Err(attr_err(
            node,
            format!("row_partition_types {kinds:?}: only ragged rank 1 is supported"),
        ));
    }
    Ok(built(1, move |a| {
        Ok(wrap(ragged::ragged_tensor_to_tensor(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            &ts(a, 3..3 + n)?,
            &types,
        )?))
    }))
}

fn ragged_tensor_to_sparse(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let k = count(node, "RAGGED_RANK")?;
    if k != 1 {
        return Err(attr_err(
            node,
            format!("RAGGED_RANK {k}: only ragged rank 1 is supported"),
        ));
    }
    Ok(built(3, move |a| {
        Ok(wrap(ragged::ragged_tensor_to_sparse(
            &ts(a, 0..k)?,
            t(a, k)?,
        )?))
    }))
}

fn string_split_v2(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let maxsplit = int_or(node, "maxsplit", -1)?;
    Ok(built(3, move |a| {
        Ok(wrap(strings::string_split_v2(
            t(a, 0)?,
            t(a, 1)?,
            maxsplit,
        )?))
    }))
}

fn regex_replace(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let global = bool_or(node, "replace_global", true)?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::regex_replace(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            global,
        )?))
    }))
}

fn static_regex_replace(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let pattern = bytes_attr(node, "pattern", b"")?;
    let rewrite = bytes_attr(node, "rewrite", b"")?;
    let global = bool_or(node, "replace_global", true)?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::static_regex_replace(
            "StaticRegexReplace",
            t(a, 0)?,
            &pattern,
            &rewrite,
            global,
        )?))
    }))
}

fn string_length(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let unit = str_or(node, "unit", "BYTE")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::string_length(t(a, 0)?, &unit)?))
    }))
}

fn string_strip(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| Ok(wrap(strings::string_strip(t(a, 0)?)?))))
}

fn regex_full_match(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    const OP: &str = "RegexFullMatch";
    Ok(built(1, |a| {
        let pattern = strings::scalar_string(OP, "pattern", t(a, 1)?)?;
        Ok(wrap(strings::regex_full_match(OP, t(a, 0)?, pattern)?))
    }))
}

fn static_regex_full_match(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let pattern = bytes_attr(node, "pattern", b"")?;
    Ok(built(1, move |a| {
        Ok(wrap(strings::regex_full_match(
            "StaticRegexFullMatch",
            t(a, 0)?,
            &pattern,
        )?))
    }))
}

fn decode_csv(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let n = node.attr_types("OUT_TYPE")?.len();
    let attrs = DecodeCsvAttrs {
        field_delim: bytes_attr(node, "field_delim", b",")?,
        use_quote_delim: bool_or(node, "use_quote_delim", true)?,
        na_value: bytes_attr(node, "na_value", b"")?,
        select_cols: ints_attr(node, "select_cols")?,
    };
    Ok(built(n, move |a| {
        Ok(wrap(parsing::decode_csv(
            t(a, 0)?,
            &ts(a, 1..1 + n)?,
            &attrs,
        )?))
    }))
}

fn parse_example_v2(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
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
    Ok(built(outputs, move |a| {
        Ok(wrap(parsing::parse_example_v2(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            t(a, 3)?,
            t(a, 4)?,
            &ts(a, 5..5 + ndense)?,
            &attrs,
        )?))
    }))
}

fn parse_single_example(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let ndense = node.attr_types("Tdense")?.len();
    let attrs = ParseSingleExampleAttrs {
        num_sparse: node.attr_int("num_sparse")?,
        sparse_keys: strings_attr(node, "sparse_keys")?,
        dense_keys: strings_attr(node, "dense_keys")?,
        sparse_types: dtypes(node, "sparse_types")?,
        dense_shapes: shapes_attr(node, "dense_shapes")?,
    };
    let nsparse = count(node, "num_sparse")?;
    Ok(built(3 * nsparse + ndense, move |a| {
        Ok(wrap(parsing::parse_single_example(
            t(a, 0)?,
            &ts(a, 1..1 + ndense)?,
            &attrs,
        )?))
    }))
}

fn serialize_sparse(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let out = node.attr_type("out_type")?;
    if out != DataType::DT_VARIANT {
        return Err(attr_err(
            node,
            format!("out_type {out:?} is not supported (only DT_VARIANT)"),
        ));
    }
    Ok(built(1, |a| {
        let parts = vec![t(a, 0)?.clone(), t(a, 1)?.clone(), t(a, 2)?.clone()];
        Ok(vec![Value::Variant(Arc::new(VariantTensor {
            shape: vec![3],
            elements: parts,
        }))])
    }))
}

fn deserialize_sparse(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let serialized = node.attr_type("Tserialized")?;
    if serialized != DataType::DT_VARIANT {
        return Err(attr_err(
            node,
            format!("Tserialized {serialized:?} is not supported (only DT_VARIANT)"),
        ));
    }
    let dt = dtype(node, "dtype")?;
    Ok(built(3, move |a| {
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
    }))
}

fn unique_(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let out = dtype(node, "out_idx")?;
    Ok(built(2, move |a| Ok(wrap(sparse::unique(t(a, 0)?, out)?))))
}

fn unique_with_counts(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let out = dtype(node, "out_idx")?;
    Ok(built(3, move |a| {
        Ok(wrap(sparse::unique_with_counts(t(a, 0)?, out)?))
    }))
}

fn bucketize(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let boundaries = floats_attr(node, "boundaries")?;
    Ok(built(1, move |a| {
        Ok(wrap(sparse::bucketize(t(a, 0)?, &boundaries)?))
    }))
}

fn sparse_fill_empty_rows(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(4, |a| {
        Ok(wrap(sparse::sparse_fill_empty_rows(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            t(a, 3)?,
        )?))
    }))
}

fn sparse_reorder(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(2, |a| {
        Ok(wrap(sparse::sparse_reorder(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
    }))
}

fn sparse_slice(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(3, |a| {
        Ok(wrap(sparse::sparse_slice(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            t(a, 3)?,
            t(a, 4)?,
        )?))
    }))
}

fn sparse_reshape(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(2, |a| {
        Ok(wrap(sparse::sparse_reshape(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
    }))
}

fn sparse_to_dense(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let validate = bool_or(node, "validate_indices", true)?;
    Ok(built(1, move |a| {
        Ok(wrap(sparse::sparse_to_dense(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            t(a, 3)?,
            validate,
        )?))
    }))
}

fn dense_bincount(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let binary = bool_or(node, "binary_output", false)?;
    Ok(built(1, move |a| {
        Ok(wrap(sparse::dense_bincount(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            binary,
        )?))
    }))
}

fn bincount(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(sparse::bincount_op(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
    }))
}

fn sparse_count_sparse_output(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let binary = node.attr_bool("binary_output")?;
    let minlength = int_or(node, "minlength", -1)?;
    let maxlength = int_or(node, "maxlength", -1)?;
    Ok(built(3, move |a| {
        Ok(wrap(sparse::sparse_count_sparse_output(
            t(a, 0)?,
            t(a, 1)?,
            t(a, 2)?,
            t(a, 3)?,
            binary,
            minlength,
            maxlength,
        )?))
    }))
}

fn gather_nd(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(indexing::gather_nd(t(a, 0)?, t(a, 1)?)?))
    }))
}

fn scatter_nd(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(indexing::scatter_nd(t(a, 0)?, t(a, 1)?, t(a, 2)?)?))
    }))
}

fn broadcast_to(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        Ok(wrap(indexing::broadcast_to(t(a, 0)?, t(a, 1)?)?))
    }))
}

fn assert_(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let n = node.attr_types("T")?.len();
    let summarize = usize::try_from(int_or(node, "summarize", 3)?).unwrap_or(0);
    Ok(built(0, move |a| {
        indexing::assert(t(a, 0)?, &ts(a, 1..1 + n)?, summarize)?;
        Ok(Vec::new())
    }))
}

/// The function a `func` attribute names.
fn func_attr(node: &NodeDef, name: &str) -> Result<String> {
    match node.attr.get(name).and_then(|a| a.value.as_ref()) {
        Some(AttrKind::Func(f)) => Ok(f.name.clone()),
        _ => Err(attr_err(
            node,
            format!("attribute {name} is not a function"),
        )),
    }
}

/// `If` and `StatelessIf`: both branches compiled at load; each step runs the one the
/// condition picks (TensorFlow's truth of a tensor: a scalar's value, non-zero or
/// non-empty; a non-scalar's having elements).
fn if_(node: &NodeDef, ctx: &BuildCtx<'_>) -> Result<Built> {
    /// Branches nested deeper than this are refused (a branch that holds an `If` of itself
    /// would otherwise recurse until the stack overflows).
    const MAX_IF_DEPTH: usize = 64;
    thread_local! {
        static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    struct Nested;
    impl Drop for Nested {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    if DEPTH.with(|d| {
        d.set(d.get() + 1);
        d.get() > MAX_IF_DEPTH
    }) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        return Err(attr_err(node, "If branches nested too deep"));
    }
    let _nested = Nested;
    let outputs = node.attr_types("Tout")?.len();
    let branch = |attr: &str| -> Result<super::program::Program> {
        let name = func_attr(node, attr)?;
        let f = ctx
            .library
            .get(name.as_str())
            .ok_or_else(|| attr_err(node, format!("{attr} {name} is not in the library")))?;
        super::dataset::compile_function(f, ctx, true)
    };
    let then_branch = Arc::new(branch("then_branch")?);
    let else_branch = Arc::new(branch("else_branch")?);
    let names = (
        func_attr(node, "then_branch")?,
        func_attr(node, "else_branch")?,
    );
    Ok(built(outputs, move |a| {
        let cond = t(a, 0)?;
        let holds = if cond.shape().is_empty() {
            match cond.data() {
                crate::TensorData::Bool(v) => v.first().copied().unwrap_or(false),
                crate::TensorData::String(v) => v.first().is_some_and(|s| !s.is_empty()),
                crate::TensorData::Int32(v) => v.first().is_some_and(|&x| x != 0),
                crate::TensorData::Int64(v) => v.first().is_some_and(|&x| x != 0),
                crate::TensorData::Float32(v) => v.first().is_some_and(|&x| x != 0.0),
                crate::TensorData::Float64(v) => v.first().is_some_and(|&x| x != 0.0),
                _ => {
                    return Err(Failure::Input {
                        index: 0,
                        reason: "a condition of this dtype is not supported",
                    })
                }
            }
        } else {
            cond.num_elements() > 0
        };
        let (program, function) = if holds {
            (&then_branch, &names.0)
        } else {
            (&else_branch, &names.1)
        };
        let args: Vec<Value> = a[1..].iter().map(|v| (*v).clone()).collect();
        program.run(args, false).map_err(|e| Failure::Function {
            function: function.clone(),
            source: Box::new(e),
        })
    }))
}

fn sparse_cross(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let n = count(node, "N")?;
    let nv = node.attr_types("sparse_types")?.len();
    let nd = node.attr_types("dense_types")?.len();
    let attrs = SparseCrossAttrs {
        hashed_output: node.attr_bool("hashed_output")?,
        num_buckets: node.attr_int("num_buckets")?,
        hash_key: node.attr_int("hash_key")?,
    };
    Ok(built(3, move |a| {
        Ok(wrap(sparse::sparse_cross(
            &ts(a, 0..n)?,
            &ts(a, n..n + nv)?,
            &ts(a, n + nv..2 * n + nv)?,
            &ts(a, 2 * n + nv..2 * n + nv + nd)?,
            attrs,
        )?))
    }))
}

fn sparse_cross_hashed(node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    let n = count(node, "N")?;
    let nv = node.attr_types("sparse_types")?.len();
    let nd = node.attr_types("dense_types")?.len();
    let end = 2 * n + nv + nd;
    Ok(built(3, move |a| {
        Ok(wrap(sparse::sparse_cross_hashed(
            &ts(a, 0..n)?,
            &ts(a, n..n + nv)?,
            &ts(a, n + nv..2 * n + nv)?,
            &ts(a, 2 * n + nv..end)?,
            t(a, end)?,
            t(a, end + 1)?,
            t(a, end + 2)?,
        )?))
    }))
}

fn hash_table_v2(node: &NodeDef, ctx: &BuildCtx<'_>) -> Result<Built> {
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
            let table = HashTable::new(key, value).map_err(|e| attr_err(node, e.to_string()))?;
            let cell = Arc::new(RwLock::new(table));
            tables.insert(name, cell.clone());
            cell
        }
    };
    let v = Value::Table(cell);
    Ok(built(1, move |_| Ok(vec![v.clone()])))
}

fn lookup_table_find_v2(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        let table = table_of(a)?;
        let guard = table.read().unwrap_or_else(PoisonError::into_inner);
        Ok(wrap(lookup::lookup_table_find_v2(
            &guard,
            t(a, 1)?,
            t(a, 2)?,
        )?))
    }))
}

fn lookup_table_size_v2(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(1, |a| {
        let table = table_of(a)?;
        let guard = table.read().unwrap_or_else(PoisonError::into_inner);
        Ok(wrap(lookup::lookup_table_size_v2(&guard)?))
    }))
}

fn lookup_table_import_v2(_node: &NodeDef, _ctx: &BuildCtx<'_>) -> Result<Built> {
    Ok(built(0, |a| {
        let table = table_of(a)?;
        let mut guard = table.write().unwrap_or_else(PoisonError::into_inner);
        lookup::lookup_table_import_v2(&mut guard, t(a, 1)?, t(a, 2)?)?;
        Ok(Vec::new())
    }))
}

fn initialize_table_from_text_file_v2(node: &NodeDef, ctx: &BuildCtx<'_>) -> Result<Built> {
    let key_index = node.attr_int("key_index")?;
    let value_index = node.attr_int("value_index")?;
    let vocab_size = int_or(node, "vocab_size", -1)?;
    let delimiter = str_or(node, "delimiter", "\t")?;
    if int_or(node, "offset", 0)? != 0 {
        return Err(attr_err(node, "a non-zero offset is not supported"));
    }
    let root = ctx.data_root.to_owned();
    Ok(built(0, move |a| {
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
    }))
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

#[cfg(test)]
#[path = "ops_tests.rs"]
mod tests;
