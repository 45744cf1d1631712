//! What a model holds (`lode inspect`): signatures, variables, iterators, and its tf.data
//! input pipeline traced into the function library.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use lode_proto::attr::NodeAttrs;
use lode_proto::io::Model;
use lode_proto::names::Input;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::meta_graph::{tensor_info, TensorInfo};
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::tensor::TensorProto;
use lode_proto::tf::types::DataType;
use serde::Serialize;

/// Ops that hold model state.
pub const VARIABLE_OPS: &[&str] = &["VariableV2", "Variable", "VarHandleOp"];

/// Ops that create an iterator over a dataset.
const ITERATOR_OPS: &[&str] = &[
    "IteratorV2",
    "Iterator",
    "AnonymousIterator",
    "AnonymousIteratorV2",
    "AnonymousIteratorV3",
    "OneShotIterator",
    "MultiDeviceIterator",
];

const GET_NEXT_OPS: &[&str] = &[
    "IteratorGetNext",
    "IteratorGetNextSync",
    "IteratorGetNextAsOptional",
];

#[derive(Debug, Serialize)]
pub struct Report {
    pub path: String,
    pub format: &'static str,
    /// The selected MetaGraph's tags (SavedModels and MetaGraphs that carry tags).
    pub tags: Option<Vec<String>>,
    /// Every tag set of a SavedModel.
    pub tag_sets: Vec<Vec<String>>,
    pub nodes: usize,
    pub ops: BTreeMap<String, usize>,
    pub functions: Vec<String>,
    pub variables: Vec<String>,
    pub input_pipeline: Pipeline,
    pub signatures: BTreeMap<String, Signature>,
}

#[derive(Debug, Default, Serialize)]
pub struct Pipeline {
    pub iterators: Vec<NodeRef>,
    /// Nodes that bind an iterator to its dataset (`MakeIterator`): the iterator initializers.
    pub initializers: Vec<NodeRef>,
    pub get_next: Vec<NodeRef>,
    /// Dataset ops from the one the iterator reads back to the source, for every iterator.
    pub chains: Vec<Vec<DatasetStep>>,
}

#[derive(Debug, Serialize)]
pub struct NodeRef {
    pub name: String,
    pub op: String,
}

#[derive(Debug, Serialize)]
pub struct DatasetStep {
    pub node: String,
    pub op: String,
    /// Constant inputs other than the upstream dataset (file names, batch size, …), rendered.
    pub args: Vec<String>,
    pub functions: Vec<FunctionUse>,
}

#[derive(Debug, Serialize)]
pub struct FunctionUse {
    pub attr: String,
    pub name: String,
    /// Op histogram of the body, including every function it calls (transitively).
    pub ops: BTreeMap<String, usize>,
    /// Functions reached from this one.
    pub calls: Vec<String>,
    pub found: bool,
}

#[derive(Debug, Serialize)]
pub struct Signature {
    pub method_name: String,
    pub inputs: BTreeMap<String, String>,
    pub outputs: BTreeMap<String, String>,
}

pub fn inspect(model: &Model) -> Report {
    let graph = &model.graph;
    let mut ops = BTreeMap::new();
    for node in &graph.node {
        *ops.entry(node.op.clone()).or_insert(0) += 1;
    }
    let functions: Vec<String> = graph
        .library
        .as_ref()
        .map(|l| {
            let names: BTreeSet<String> = l
                .function
                .iter()
                .filter_map(|f| f.signature.as_ref().map(|s| s.name.clone()))
                .collect();
            names.into_iter().collect()
        })
        .unwrap_or_default();
    let mut variables: Vec<String> = graph
        .node
        .iter()
        .filter(|n| VARIABLE_OPS.contains(&n.op.as_str()))
        .map(|n| n.name.clone())
        .collect();
    variables.sort();
    let signatures = model
        .meta_graph
        .as_ref()
        .map(|m| {
            m.signature_def
                .iter()
                .map(|(name, sig)| {
                    (
                        name.clone(),
                        Signature {
                            method_name: sig.method_name.clone(),
                            inputs: tensor_names(&sig.inputs),
                            outputs: tensor_names(&sig.outputs),
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Report {
        path: model.path.display().to_string(),
        format: model.format.name(),
        tags: model.tags().map(|t| {
            let mut t = t.to_vec();
            t.sort();
            t
        }),
        tag_sets: model.available_tags.clone(),
        nodes: graph.node.len(),
        ops,
        functions,
        variables,
        input_pipeline: pipeline(graph),
        signatures,
    }
}

fn tensor_names(map: &HashMap<String, TensorInfo>) -> BTreeMap<String, String> {
    map.iter()
        .map(|(key, info)| {
            let name = match &info.encoding {
                Some(tensor_info::Encoding::Name(name)) => name.clone(),
                Some(tensor_info::Encoding::CooSparse(coo)) => format!(
                    "sparse({}, {}, {})",
                    coo.indices_tensor_name, coo.values_tensor_name, coo.dense_shape_tensor_name
                ),
                Some(tensor_info::Encoding::CompositeTensor(c)) => {
                    format!("composite({} components)", c.components.len())
                }
                _ => String::new(),
            };
            (key.clone(), name)
        })
        .collect()
}

fn node_ref(node: &NodeDef) -> NodeRef {
    NodeRef {
        name: node.name.clone(),
        op: node.op.clone(),
    }
}

fn is_dataset_op(op: &str) -> bool {
    op.contains("Dataset") && !op.starts_with("Iterator")
}

fn pipeline(graph: &GraphDef) -> Pipeline {
    let by_name: HashMap<&str, &NodeDef> =
        graph.node.iter().map(|n| (n.name.as_str(), n)).collect();
    let library = lode_proto::ops::function_index(graph.library.as_ref());
    let mut out = Pipeline::default();
    for node in &graph.node {
        let op = node.op.as_str();
        if ITERATOR_OPS.contains(&op) {
            out.iterators.push(node_ref(node));
        } else if op == "MakeIterator" {
            out.initializers.push(node_ref(node));
            if let Some(first) = node.input.first() {
                if let Ok(input) = Input::parse(first) {
                    out.chains.push(chain(input.node(), &by_name, &library));
                }
            }
        } else if GET_NEXT_OPS.contains(&op) {
            out.get_next.push(node_ref(node));
        }
    }
    out
}

/// Follows the first (dataset) input of dataset ops from `start` to the source.
fn chain(
    start: &str,
    by_name: &HashMap<&str, &NodeDef>,
    library: &HashMap<&str, &FunctionDef>,
) -> Vec<DatasetStep> {
    let mut steps = Vec::new();
    let mut seen = BTreeSet::new();
    let mut current = by_name.get(start).copied();
    while let Some(node) = current {
        if !seen.insert(node.name.as_str()) {
            break;
        }
        let data_inputs: Vec<&str> = node
            .input
            .iter()
            .filter_map(|i| Input::parse(i).ok())
            .filter(|i| !i.is_control())
            .map(|i| i.node())
            .collect();
        let upstream = data_inputs
            .first()
            .and_then(|n| by_name.get(n).copied())
            .filter(|n| is_dataset_op(&n.op));
        let args = data_inputs
            .iter()
            .skip(usize::from(upstream.is_some()))
            .map(|name| render_arg(name, by_name))
            .collect();
        let functions = node
            .referenced_functions()
            .into_iter()
            .map(|(attr, name)| function_use(attr, name, library))
            .collect();
        steps.push(DatasetStep {
            node: node.name.clone(),
            op: node.op.clone(),
            args,
            functions,
        });
        current = upstream;
    }
    steps
}

fn function_use(attr: &str, name: &str, library: &HashMap<&str, &FunctionDef>) -> FunctionUse {
    let mut ops = BTreeMap::new();
    let mut calls = BTreeSet::new();
    let mut stack = vec![name];
    let mut visited = BTreeSet::new();
    let found = library.contains_key(name);
    while let Some(current) = stack.pop() {
        if !visited.insert(current) {
            continue;
        }
        let Some(function) = library.get(current) else {
            continue;
        };
        for node in &function.node_def {
            *ops.entry(node.op.clone()).or_insert(0) += 1;
            for (_, callee) in node.referenced_functions() {
                calls.insert(callee.to_owned());
                stack.push(callee);
            }
            // A node whose op is a library function is a direct call.
            if library.contains_key(node.op.as_str()) {
                calls.insert(node.op.clone());
                stack.push(node.op.as_str());
            }
        }
    }
    FunctionUse {
        attr: attr.to_owned(),
        name: name.to_owned(),
        ops,
        calls: calls.into_iter().collect(),
        found,
    }
}

/// `name` as an argument of a dataset op: its constant value when it is a small Const.
fn render_arg(name: &str, by_name: &HashMap<&str, &NodeDef>) -> String {
    let Some(node) = by_name.get(name) else {
        return name.to_owned();
    };
    if node.op != "Const" {
        return format!("{name} ({})", node.op);
    }
    match node.attr_tensor("value") {
        Ok(tensor) => render_tensor(tensor).unwrap_or_else(|| format!("{name} (Const)")),
        Err(_) => format!("{name} (Const)"),
    }
}

fn render_tensor(t: &TensorProto) -> Option<String> {
    const MAX_ITEMS: usize = 8;
    let dtype = t.dtype.enum_value().ok()?;
    let items: Vec<String> = match dtype {
        DataType::DT_STRING => t
            .string_val
            .iter()
            .map(|s| format!("{:?}", String::from_utf8_lossy(s)))
            .collect(),
        DataType::DT_INT64 if t.tensor_content.is_empty() => {
            t.int64_val.iter().map(ToString::to_string).collect()
        }
        DataType::DT_INT64 => t
            .tensor_content
            .chunks_exact(8)
            .filter_map(|c| c.try_into().ok().map(i64::from_le_bytes))
            .map(|v| v.to_string())
            .collect(),
        DataType::DT_INT32 => t.int_val.iter().map(ToString::to_string).collect(),
        DataType::DT_BOOL => t.bool_val.iter().map(ToString::to_string).collect(),
        DataType::DT_FLOAT => t.float_val.iter().map(ToString::to_string).collect(),
        _ => return None,
    };
    if items.is_empty() || items.len() > MAX_ITEMS {
        return None;
    }
    let scalar = t.tensor_shape.as_ref().is_none_or(|s| s.dim.is_empty());
    Some(if scalar && items.len() == 1 {
        items[0].clone()
    } else {
        format!("[{}]", items.join(", "))
    })
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "model      {}", self.path);
        let _ = writeln!(out, "format     {}", self.format);
        if let Some(tags) = &self.tags {
            let _ = writeln!(out, "tags       {}", tags.join(","));
        }
        if self.tag_sets.len() > 1 {
            let sets: Vec<String> = self.tag_sets.iter().map(|t| t.join(",")).collect();
            let _ = writeln!(out, "tag sets   {}", sets.join(" | "));
        }
        let _ = writeln!(out, "nodes      {}", self.nodes);
        let _ = writeln!(out, "functions  {}", self.functions.len());
        let _ = writeln!(out, "variables  {}", self.variables.len());
        for v in &self.variables {
            let _ = writeln!(out, "  {v}");
        }
        let _ = writeln!(out, "ops        {} kinds", self.ops.len());
        let mut by_count: Vec<(&String, &usize)> = self.ops.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (op, count) in by_count {
            let _ = writeln!(out, "  {count:>6}  {op}");
        }
        let p = &self.input_pipeline;
        let _ = writeln!(out, "input pipeline");
        if p.iterators.is_empty() && p.chains.is_empty() {
            let _ = writeln!(out, "  none found (no iterator ops at the top level)");
        }
        for it in &p.iterators {
            let _ = writeln!(out, "  iterator     {} ({})", it.name, it.op);
        }
        for it in &p.initializers {
            let _ = writeln!(out, "  initializer  {} ({})", it.name, it.op);
        }
        for it in &p.get_next {
            let _ = writeln!(out, "  get next     {} ({})", it.name, it.op);
        }
        for chain in &p.chains {
            let _ = writeln!(
                out,
                "  dataset chain, from the iterator back to the source:"
            );
            for step in chain {
                let args = if step.args.is_empty() {
                    String::new()
                } else {
                    format!("  args: {}", step.args.join(", "))
                };
                let _ = writeln!(out, "    {} ({}){args}", step.node, step.op);
                for f in &step.functions {
                    let ops: Vec<String> =
                        f.ops.iter().map(|(op, n)| format!("{op}×{n}")).collect();
                    let missing = if f.found { "" } else { " [not in the library]" };
                    let _ = writeln!(
                        out,
                        "      {} = {}{missing}: {}",
                        f.attr,
                        f.name,
                        ops.join(" ")
                    );
                }
            }
        }
        if !self.signatures.is_empty() {
            let _ = writeln!(out, "signatures");
            for (name, sig) in &self.signatures {
                let _ = writeln!(out, "  {name} ({})", sig.method_name);
                for (k, v) in &sig.inputs {
                    let _ = writeln!(out, "    in   {k}: {v}");
                }
                for (k, v) in &sig.outputs {
                    let _ = writeln!(out, "    out  {k}: {v}");
                }
            }
        }
        out
    }
}
