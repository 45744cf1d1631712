//! The `tf.data` chain between the stage's `DWSource` and its iterator, run on one step's
//! records: map functions (per element, in parallel on rayon) and batching with TensorFlow's
//! semantics. The reader, `skip`, `take`, `shuffle` and `repeat` are gone from the stage
//! graph: the index batch already says which records make the step.

use std::collections::HashMap;
use std::sync::Arc;

use lode_proto::attr::NodeAttrs;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::node_def::NodeDef;
use rayon::prelude::*;

use super::program::{BuildCtx, Compile, Naming, Program};
use super::value::{Value, VariantTensor};
use super::{ExecError, Failure, Result};
use crate::kernels::array;
use crate::tensor::{DType, Tensor, TensorData};

/// One element of a dataset: its components.
pub type Element = Vec<Value>;

enum Transform {
    Map {
        node: String,
        op: String,
        function: String,
        program: Program,
        captured: Vec<Value>,
    },
    Batch {
        node: String,
        size: usize,
        drop_remainder: bool,
    },
}

/// The compiled chain.
pub struct Pipeline {
    transforms: Vec<Transform>,
    /// Records per output element (the batch size, 1 without batching).
    records_per_element: usize,
    drop_remainder: bool,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("transforms", &self.transforms.len())
            .field("records_per_element", &self.records_per_element)
            .finish()
    }
}

/// An element-level failure: which input element (record) of the step it concerns.
#[derive(Debug)]
pub struct ElementError {
    /// The step's record (position in the index batch) the error is about, when known.
    pub record: Option<usize>,
    pub error: ExecError,
}

fn ds_err(node: &NodeDef, reason: impl Into<String>) -> ExecError {
    ExecError::Dataset {
        node: node.name.clone(),
        op: node.op.clone(),
        reason: reason.into(),
    }
}

/// A function body compiled as a program over its arguments; `grappler`: TensorFlow runs
/// grappler's rewrites on it (see [`Compile::grappler`]): not on a tf.data function's body.
pub fn compile_function(f: &FunctionDef, ctx: &BuildCtx<'_>, grappler: bool) -> Result<Program> {
    let signature = f.signature.as_ref().ok_or_else(|| ExecError::Graph {
        node: "(function)".into(),
        reason: "a library function has no signature".into(),
    })?;
    let args: Vec<String> = signature.input_arg.iter().map(|a| a.name.clone()).collect();
    let roots = signature
        .output_arg
        .iter()
        .map(|a| {
            f.ret.get(&a.name).cloned().ok_or_else(|| ExecError::Graph {
                node: signature.name.clone(),
                reason: format!("output {} has no return value", a.name),
            })
        })
        .collect::<Result<Vec<String>>>()?;
    Program::compile(
        &Compile {
            nodes: &f.node_def,
            naming: Naming::Function { args: &args },
            args: args.len(),
            roots: &roots,
            grappler,
        },
        ctx,
    )
    .map_err(|e| match e {
        ExecError::MissingKernels { .. } => e,
        other => ExecError::Graph {
            node: signature.name.clone(),
            reason: format!("in function {}: {other}", signature.name),
        },
    })
}

impl Pipeline {
    /// Compiles the chain from `source_name` (the DWSource node) to `dataset`, the node that
    /// feeds `MakeIterator`. `evaluate` computes a captured input (it must not depend on
    /// the step's data).
    pub fn compile(
        graph: &HashMap<&str, &NodeDef>,
        dataset: &str,
        source_name: &str,
        ctx: &BuildCtx<'_>,
        evaluate: &dyn Fn(&[String]) -> Result<Vec<Value>>,
    ) -> Result<Pipeline> {
        let mut chain = Vec::new();
        let mut current = dataset.split(':').next().unwrap_or(dataset).to_owned();
        while current != source_name {
            let node = graph
                .get(current.as_str())
                .ok_or_else(|| ExecError::Graph {
                    node: current.clone(),
                    reason: "the dataset chain names a node that is not in the stage graph".into(),
                })?;
            chain.push(*node);
            if chain.len() > 1000 {
                return Err(ds_err(node, "the dataset chain does not reach DWSource"));
            }
            let input = node
                .input
                .iter()
                .find(|i| !i.starts_with('^'))
                .ok_or_else(|| ds_err(node, "the dataset has no input dataset"))?;
            current = input.split(':').next().unwrap_or(input).to_owned();
        }
        chain.reverse();
        let mut transforms = Vec::new();
        let mut records_per_element = 1usize;
        let mut drop_remainder = false;
        let mut batched = false;
        for node in chain {
            let data_inputs: Vec<String> = node
                .input
                .iter()
                .filter(|i| !i.starts_with('^'))
                .cloned()
                .collect();
            match node.op.as_str() {
                "MapDataset" | "ParallelMapDataset" | "ParallelMapDatasetV2" => {
                    let f = node.attr_func("f")?;
                    let body = ctx.library.get(f.name.as_str()).ok_or_else(|| {
                        ds_err(node, format!("function {} is not in the library", f.name))
                    })?;
                    // tf.data runs its functions as written: no grappler rewrite (an `x / c`
                    // in a map is an exact division in TensorFlow 1 and 2 alike).
                    let program = compile_function(body, ctx, false)?;
                    let ncaptured = node.attr_types("Targuments")?.len();
                    let captured_names = data_inputs.get(1..1 + ncaptured).ok_or_else(|| {
                        ds_err(node, "fewer captured inputs than Targuments lists")
                    })?;
                    let captured = evaluate(captured_names)?;
                    transforms.push(Transform::Map {
                        node: node.name.clone(),
                        op: node.op.clone(),
                        function: f.name.clone(),
                        program,
                        captured,
                    });
                }
                "BatchDataset" | "BatchDatasetV2" => {
                    if batched {
                        return Err(ds_err(node, "batching twice is not supported"));
                    }
                    let values = evaluate(&data_inputs[1..])?;
                    let size = values
                        .first()
                        .and_then(Value::as_tensor)
                        .and_then(|t| {
                            crate::kernels::int_values("BatchDataset", "batch_size", t).ok()
                        })
                        .and_then(|v| v.first().copied())
                        .and_then(|v| usize::try_from(v).ok())
                        .filter(|&v| v > 0)
                        .ok_or_else(|| ds_err(node, "batch_size must be a positive constant"))?;
                    let drop = match values.get(1).and_then(Value::as_tensor).map(Tensor::data) {
                        Some(crate::TensorData::Bool(b)) => b.first().copied().unwrap_or(false),
                        None => false,
                        Some(_) => return Err(ds_err(node, "drop_remainder must be a bool")),
                    };
                    batched = true;
                    records_per_element = size;
                    drop_remainder = drop;
                    transforms.push(Transform::Batch {
                        node: node.name.clone(),
                        size,
                        drop_remainder: drop,
                    });
                }
                "PrefetchDataset"
                | "ModelDataset"
                | "OptimizeDataset"
                | "OptimizeDatasetV2"
                | "MaxIntraOpParallelismDataset"
                | "PrivateThreadPoolDataset" => {}
                _ => {
                    return Err(ds_err(
                        node,
                        "this dataset transformation cannot run on a data worker (supported: \
                         map, batch, prefetch; filter, padded batch, unbatch and \
                         interleave change which records make a step)",
                    ))
                }
            }
        }
        Ok(Pipeline {
            transforms,
            records_per_element,
            drop_remainder,
        })
    }

    /// Records that make one step.
    pub fn records_per_step(&self) -> usize {
        self.records_per_element
    }

    pub fn drop_remainder(&self) -> bool {
        self.drop_remainder
    }

    /// Runs the chain on the step's records (one scalar string each). Returns the elements
    /// that come out (one for a full step), or the first element-level error with the
    /// record it concerns. With `ignore_errors`, erroring elements are dropped instead and
    /// counted in the second value.
    pub fn run(
        &self,
        records: Vec<Vec<u8>>,
        parallel: bool,
        ignore_errors: bool,
    ) -> std::result::Result<(Vec<Element>, u64), ElementError> {
        let mut dropped = 0u64;
        // origin[i]: the records element i was made from.
        let mut origin: Vec<std::ops::Range<usize>> =
            (0..records.len()).map(|i| i..i + 1).collect();
        let mut elements: Vec<Element> = Vec::with_capacity(records.len());
        for r in records {
            let t = Tensor::new(Vec::new(), crate::TensorData::String(vec![r])).map_err(|e| {
                ElementError {
                    record: None,
                    error: ExecError::Input {
                        reason: e.to_string(),
                    },
                }
            })?;
            elements.push(vec![Value::tensor(t)]);
        }
        for transform in &self.transforms {
            match transform {
                Transform::Map {
                    node,
                    op,
                    function,
                    program,
                    captured,
                } => {
                    let run_one = |el: Element| {
                        let mut args = el;
                        args.extend(captured.iter().cloned());
                        program.run(args, false)
                    };
                    let results: Vec<Result<Element>> = if parallel && elements.len() > 1 {
                        elements.into_par_iter().map(run_one).collect()
                    } else {
                        elements.into_iter().map(run_one).collect()
                    };
                    let mut kept = Vec::with_capacity(results.len());
                    let mut kept_origin = Vec::with_capacity(results.len());
                    for (r, o) in results.into_iter().zip(origin) {
                        match r {
                            Ok(el) => {
                                kept.push(el);
                                kept_origin.push(o);
                            }
                            Err(e) if ignore_errors && e.is_data_error() => dropped += 1,
                            Err(e) => {
                                let record = e.record_in(&o);
                                return Err(ElementError {
                                    record,
                                    error: ExecError::Kernel {
                                        node: node.clone(),
                                        op: op.clone(),
                                        source: Box::new(Failure::Function {
                                            function: function.clone(),
                                            source: Box::new(e),
                                        }),
                                    },
                                });
                            }
                        }
                    }
                    elements = kept;
                    origin = kept_origin;
                }
                Transform::Batch {
                    node,
                    size,
                    drop_remainder,
                } => {
                    let mut batched = Vec::new();
                    let mut batched_origin = Vec::new();
                    let mut rest = elements.into_iter();
                    let mut o = origin.into_iter();
                    loop {
                        let group: Vec<Element> = rest.by_ref().take(*size).collect();
                        let spans: Vec<_> = o.by_ref().take(*size).collect();
                        if group.is_empty() || (*drop_remainder && group.len() < *size) {
                            break;
                        }
                        let span =
                            spans.first().map_or(0, |r| r.start)..spans.last().map_or(0, |r| r.end);
                        batched.push(stack(node, group).map_err(|error| ElementError {
                            record: None,
                            error,
                        })?);
                        batched_origin.push(span);
                    }
                    elements = batched;
                    origin = batched_origin;
                }
            }
        }
        Ok((elements, dropped))
    }
}

impl ExecError {
    /// The step record an error inside a map function is about: the batch element it names,
    /// offset into the records the element was made from.
    fn record_in(&self, origin: &std::ops::Range<usize>) -> Option<usize> {
        if origin.len() == 1 {
            return Some(origin.start);
        }
        let within = match self {
            ExecError::Kernel { source, .. } => source.record()?,
            _ => return None,
        };
        let at = origin.start + within;
        (at < origin.end).then_some(at)
    }
}

/// Stacks elements component by component along a new first dimension, as `batch` does:
/// every element's component must have the same dtype and shape. The elements are taken: a
/// string component's values move into the batch, unless another holder shares the
/// element's tensor (each string is an allocation of its own: cloning them and freeing the
/// originals took some 8% of a deepfm `--simple` step in `lode exec`).
fn stack(node: &str, group: Vec<Element>) -> Result<Element> {
    let first = group.first().ok_or_else(|| ExecError::Input {
        reason: "an empty batch".into(),
    })?;
    // None: a string component, moved out of the elements below once all are checked.
    let mut out: Vec<Option<Value>> = Vec::with_capacity(first.len());
    for (c, component) in first.iter().enumerate() {
        let err = |reason: String| ExecError::Dataset {
            node: node.to_owned(),
            op: "BatchDatasetV2".into(),
            reason,
        };
        match component {
            Value::Tensor(_) => {
                let parts: Vec<&Tensor> = group
                    .iter()
                    .map(|el| el.get(c).and_then(Value::as_tensor))
                    .collect::<Option<_>>()
                    .ok_or_else(|| {
                        err(format!("component {c} is not a tensor in every element"))
                    })?;
                let shape = parts[0].shape();
                if let Some((i, p)) = parts
                    .iter()
                    .enumerate()
                    .find(|(_, p)| !p.same_shape(parts[0]))
                {
                    return Err(err(format!(
                        "cannot batch tensors of different shapes: component {c} has shape \
                         {shape:?} in element 0 and {:?} in element {i}",
                        p.shape()
                    )));
                }
                if parts.iter().all(|p| p.dtype() == DType::String) {
                    out.push(None);
                    continue;
                }
                let packed = array::pack(&parts, 0).map_err(|e| err(e.to_string()))?;
                out.push(Some(Value::tensor(
                    packed
                        .into_iter()
                        .next()
                        .ok_or_else(|| err("pack gave nothing".into()))?,
                )));
            }
            Value::Variant(v0) => {
                let mut elements = Vec::new();
                for el in &group {
                    match el.get(c) {
                        Some(Value::Variant(v)) if v.shape == v0.shape => {
                            elements.extend(v.elements.iter().cloned());
                        }
                        _ => {
                            return Err(err(format!(
                                "component {c}: variant tensors of different shapes"
                            )))
                        }
                    }
                }
                let mut shape = vec![group.len()];
                shape.extend(&v0.shape);
                out.push(Some(Value::Variant(Arc::new(VariantTensor {
                    shape,
                    elements,
                }))));
            }
            Value::Table(_) => return Err(err(format!("component {c} is a table handle"))),
        }
    }
    if out.iter().all(Option::is_some) {
        return Ok(out.into_iter().flatten().collect());
    }
    // Every element's string components, checked above, in the elements' order: for each
    // one its batch's shape and values.
    let n = group.len();
    let mut moved: Vec<_> = out
        .iter()
        .enumerate()
        .map(|(c, v)| {
            v.is_none().then(|| {
                let mut dims = vec![n];
                if let Some(Value::Tensor(t)) = group[0].get(c) {
                    dims.extend(t.shape());
                }
                let values = Vec::with_capacity(dims.iter().product());
                (dims, values)
            })
        })
        .collect();
    for element in group {
        for (value, slot) in element.into_iter().zip(moved.iter_mut()) {
            // Not a string component, or (checked above) a tensor in every element.
            let (Some((_, strings)), Value::Tensor(t)) = (slot, value) else {
                continue;
            };
            match Arc::try_unwrap(t) {
                Ok(t) => {
                    if let TensorData::String(v) = t.into_data() {
                        strings.extend(v);
                    }
                }
                Err(shared) => {
                    if let TensorData::String(v) = shared.data() {
                        strings.extend(v.iter().cloned());
                    }
                }
            }
        }
    }
    out.into_iter()
        .zip(moved)
        .map(|(v, strings)| match (v, strings) {
            (Some(v), _) => Ok(v),
            (None, strings) => {
                let (dims, values) = strings.unwrap_or_default();
                Tensor::new(dims, TensorData::String(values))
                    .map(Value::tensor)
                    .map_err(|e| ExecError::Dataset {
                        node: node.to_owned(),
                        op: "BatchDatasetV2".into(),
                        reason: e.to_string(),
                    })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x / c` with a constant `c`: a session's graph (grappler) multiplies by the
    /// reciprocal, a tf.data function divides exactly, as TensorFlow runs each. 58 / 15 is
    /// where they differ in float32.
    #[test]
    fn a_tf_data_function_divides_exactly_and_a_graph_by_the_reciprocal() {
        use lode_proto::tf::attr_value::AttrValue;
        use lode_proto::tf::op_def::{op_def::ArgDef, OpDef};
        use lode_proto::tf::types::DataType;
        use protobuf::EnumOrUnknown;

        let mut f = FunctionDef::new();
        let mut sig = OpDef::new();
        sig.name = "divide".into();
        for (name, out) in [("x", false), ("y", true)] {
            let mut arg = ArgDef::new();
            arg.name = name.into();
            arg.type_ = EnumOrUnknown::new(DataType::DT_FLOAT);
            if out {
                sig.output_arg.push(arg);
            } else {
                sig.input_arg.push(arg);
            }
        }
        f.signature = Some(sig).into();
        let mut c = NodeDef::new();
        c.name = "c".into();
        c.op = "Const".into();
        let mut dtype = AttrValue::new();
        dtype.set_type(DataType::DT_FLOAT);
        c.attr.insert("dtype".into(), dtype.clone());
        let mut value = AttrValue::new();
        value.set_tensor(crate::convert::to_proto_fields(
            &Tensor::new(vec![], TensorData::Float32(vec![15.0])).expect("tensor"),
        ));
        c.attr.insert("value".into(), value);
        let mut div = NodeDef::new();
        div.name = "div".into();
        div.op = "RealDiv".into();
        div.input = vec!["x".into(), "c:output:0".into()];
        div.attr.insert("T".into(), dtype.clone());
        // Grappler keeps a fetched division as it is: the function returns what reads it.
        let mut out = NodeDef::new();
        out.name = "out".into();
        out.op = "Identity".into();
        out.input = vec!["div:z:0".into()];
        out.attr.insert("T".into(), dtype);
        f.node_def = vec![c, div, out];
        f.ret.insert("y".into(), "out:output:0".into());

        let library = HashMap::new();
        let tables = std::sync::Mutex::new(HashMap::new());
        let ctx = BuildCtx {
            library: &library,
            data_root: std::path::Path::new("."),
            tables: &tables,
        };
        let x = || {
            vec![Value::tensor(
                Tensor::new(vec![1], TensorData::Float32(vec![58.0])).expect("tensor"),
            )]
        };
        let value = |grappler: bool| -> f32 {
            let program = compile_function(&f, &ctx, grappler).expect("compiles");
            let out = program.run(x(), false).expect("runs");
            match out[0].as_tensor().map(Tensor::data) {
                Some(TensorData::Float32(v)) => v[0],
                other => panic!("not a float tensor: {other:?}"),
            }
        };
        assert_eq!(value(false).to_bits(), (58.0f32 / 15.0).to_bits());
        assert_eq!(value(true).to_bits(), (58.0f32 * (1.0f32 / 15.0)).to_bits());
        assert_ne!(value(false).to_bits(), value(true).to_bits());
    }

    fn strings(v: &[&[u8]]) -> Value {
        Value::tensor(
            Tensor::new(
                vec![v.len()],
                TensorData::String(v.iter().map(|s| s.to_vec()).collect()),
            )
            .expect("tensor"),
        )
    }

    fn ints(v: &[i64]) -> Value {
        Value::tensor(Tensor::new(vec![v.len()], TensorData::Int64(v.to_vec())).expect("tensor"))
    }

    fn heap_of(value: &Value) -> Vec<*const u8> {
        match value.as_tensor().map(Tensor::data) {
            Some(TensorData::String(v)) => v.iter().map(|s| s.as_ptr()).collect(),
            _ => Vec::new(),
        }
    }

    /// A batch is each component's values in the elements' order, along a new first
    /// dimension; a string component's strings are moved (the batch holds the very
    /// allocations the elements held), unless another holder shares the element's tensor,
    /// whose copy is then left as it was.
    #[test]
    fn a_batch_moves_its_strings_and_copies_shared_ones() {
        let shared = strings(&[b"kept", b"too"]);
        let group = vec![
            vec![ints(&[1, 2]), strings(&[b"a", b"bc"]), shared.clone()],
            vec![ints(&[3, 4]), strings(&[b"", b"def"]), shared.clone()],
            vec![
                ints(&[5, 6]),
                strings(&[b"g", b"h"]),
                strings(&[b"x", b"y"]),
            ],
        ];
        let moved: Vec<*const u8> = group
            .iter()
            .flat_map(|el| heap_of(&el[1]))
            .filter(|p| !p.is_null())
            .collect();
        let batch = stack("batch", group).expect("stacks");
        assert_eq!(batch.len(), 3);
        let t = |c: usize| batch[c].as_tensor().expect("a tensor");
        assert_eq!(t(0).shape(), &[3, 2]);
        assert_eq!(t(0).data(), &TensorData::Int64(vec![1, 2, 3, 4, 5, 6]));
        assert_eq!(t(1).shape(), &[3, 2]);
        let expected: Vec<Vec<u8>> = [&b"a"[..], b"bc", b"", b"def", b"g", b"h"]
            .iter()
            .map(|s| s.to_vec())
            .collect();
        assert_eq!(t(1).data(), &TensorData::String(expected));
        for p in heap_of(&batch[1]).iter().filter(|p| !p.is_null()) {
            assert!(moved.contains(p), "a string of the batch was copied");
        }
        let expected: Vec<Vec<u8>> = [&b"kept"[..], b"too", b"kept", b"too", b"x", b"y"]
            .iter()
            .map(|s| s.to_vec())
            .collect();
        assert_eq!(t(2).data(), &TensorData::String(expected));
        assert_eq!(
            shared.as_tensor().map(Tensor::data),
            Some(&TensorData::String(vec![b"kept".to_vec(), b"too".to_vec()]))
        );
    }

    /// Elements that cannot be batched are refused before anything is moved: a string
    /// component of two shapes, and strings against numbers (named as `Pack` names them).
    #[test]
    fn an_unbatchable_group_is_refused_naming_the_component() {
        let err = stack(
            "batch",
            vec![vec![strings(&[b"a"])], vec![strings(&[b"a", b"b"])]],
        )
        .expect_err("two shapes");
        assert!(
            err.to_string()
                .contains("cannot batch tensors of different shapes: component 0"),
            "{err}"
        );
        let err =
            stack("batch", vec![vec![strings(&[b"a"])], vec![ints(&[1])]]).expect_err("two dtypes");
        assert!(err.to_string().contains("Pack"), "{err}");
        let err = stack("batch", Vec::new()).expect_err("nothing to batch");
        assert!(err.to_string().contains("an empty batch"), "{err}");
    }
}
