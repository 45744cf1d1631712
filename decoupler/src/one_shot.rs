//! Normalization before the cut: every one-shot iterator becomes the initializable form that
//! the rest of the decoupler handles.
//!
//! `tf.compat.v1.data.make_one_shot_iterator(dataset)` writes a `OneShotIterator` node whose
//! dataset is built, on the first `get_next`, by the library function that its
//! `dataset_factory` attribute names: the dataset ops live in that function's body, not in the
//! graph. Source detection, the partition and the stage executor follow dataset chains in the
//! graph from a `MakeIterator`, so each OneShotIterator is rewritten into what
//! `make_initializable_iterator` writes:
//! - the factory's body, inlined under a prefix no graph node uses (`<iterator>/dataset_factory`,
//!   suffixed `_1`, `_2`… when taken); function-body inputs `node:out_arg:i` become graph names
//!   `node:k` through the op registry's output-arg layout, colocations (`loc:@node`) follow the
//!   renaming, and nodes without a device take the iterator's;
//! - an `IteratorV2` with the OneShotIterator's name, so that `IteratorGetNext`, the string
//!   handle and every name the program uses still resolve, carrying its `shared_name`,
//!   `container`, `output_types`, `output_shapes` (and colocation);
//! - `MakeIterator(dataset, iterator)` named `<iterator>/lode_make_iterator`.
//!
//! A one-shot iterator initializes itself once, before its first element; the initializable
//! form initialized once before the first step yields the same elements in the same order.
//! The factory function stays in the library; no node calls it any more, so the plan's graphs,
//! which carry only the functions their nodes call, drop it.
//!
//! A factory that is missing or malformed is an [`Error::OneShotFactory`] naming the iterator
//! and the function.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use lode_proto::attr::NodeAttrs;
use lode_proto::names::TensorRef;
use lode_proto::ops::{function_index, OpRegistry};
use lode_proto::tf::attr_value::attr_value::Value;
use lode_proto::tf::attr_value::AttrValue;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::view::{encode_graph, GraphView, NodeView, OutNode};

use crate::error::{Error, Result};

pub use lode_proto::plan::InlinedIterator;

/// The op `make_one_shot_iterator` writes.
pub const ONE_SHOT_OP: &str = "OneShotIterator";

/// The scope, under the iterator's name, of the factory's inlined nodes.
const FACTORY_SCOPE: &str = "dataset_factory";

/// The name, under the iterator's name, of the added `MakeIterator`.
const MAKE_ITERATOR: &str = "lode_make_iterator";

/// How many suffixes are tried for a free name before giving up.
const MAX_SUFFIX: usize = 1000;

/// The attributes of a OneShotIterator that its IteratorV2 keeps (the rest is the factory).
const KEPT_ATTRS: &[&str] = &[
    "shared_name",
    "container",
    "output_types",
    "output_shapes",
    "_class",
];

/// A graph whose one-shot iterators were made initializable.
#[derive(Debug)]
pub struct Normalized {
    /// The rewritten GraphDef, binary.
    pub bytes: Vec<u8>,
    /// One entry per OneShotIterator, in graph order.
    pub iterators: Vec<InlinedIterator>,
}

/// Rewrites every OneShotIterator of `def`; `None` when there is none (the graph is cut as it is).
pub fn normalize(def: &GraphView) -> Result<Option<Normalized>> {
    if !def.nodes.iter().any(|n| n.op == ONE_SHOT_OP) {
        return Ok(None);
    }
    let library = function_index(def.library.as_ref());
    let mut names = Names {
        original: def.nodes.iter().map(|n| n.name).collect(),
        added: HashSet::new(),
    };
    let mut nodes = Vec::with_capacity(def.nodes.len() + 16);
    let mut iterators = Vec::new();
    for node in &def.nodes {
        if node.op != ONE_SHOT_OP {
            nodes.push(OutNode::Raw(node.raw));
            continue;
        }
        let inlined = inline(node, &library, &mut names)?;
        iterators.push(InlinedIterator {
            iterator: node.name.to_owned(),
            function: inlined.function,
            make_iterator: inlined.make_iterator.name.clone(),
            nodes: inlined.body.iter().map(|n| n.name.clone()).collect(),
        });
        nodes.extend(inlined.body.into_iter().map(OutNode::Owned));
        nodes.push(OutNode::Owned(inlined.iterator));
        nodes.push(OutNode::Owned(inlined.make_iterator));
    }
    let mut bytes =
        encode_graph(&nodes, def.library.as_ref(), def.versions.as_ref()).map_err(|e| {
            Error::InvalidGraph {
                reason: format!("cannot encode the graph with its one-shot iterators inlined: {e}"),
            }
        })?;
    // Top-level fields Lode does not read travel on unchanged (field order does not matter).
    for field in &def.other {
        bytes.extend_from_slice(field);
    }
    Ok(Some(Normalized { bytes, iterators }))
}

/// The report's section on the rewritten iterators (empty when there were none).
pub fn report(inlined: &[InlinedIterator]) -> String {
    use std::fmt::Write as _;
    let mut r = String::new();
    if inlined.is_empty() {
        return r;
    }
    let _ = writeln!(r, "\none-shot iterators made initializable before the cut:");
    for it in inlined {
        let _ = writeln!(
            r,
            "  {}: IteratorV2, initialized by {}; {} node(s) of {} inlined",
            it.iterator,
            it.make_iterator,
            it.nodes.len(),
            it.function
        );
    }
    r
}

/// Node names in use: the graph's and those added so far.
struct Names<'a> {
    original: HashSet<&'a str>,
    added: HashSet<String>,
}

impl Names<'_> {
    fn taken(&self, name: &str) -> bool {
        self.original.contains(name) || self.added.contains(name)
    }

    /// `base`, or `base_1`, `base_2`… : the first for which every `ok` check passes.
    fn free(&self, base: &str, ok: impl Fn(&str) -> bool) -> Option<String> {
        (0..MAX_SUFFIX)
            .map(|k| match k {
                0 => base.to_owned(),
                k => format!("{base}_{k}"),
            })
            .find(|candidate| ok(candidate))
    }
}

/// What one OneShotIterator becomes.
struct Inlined {
    function: String,
    body: Vec<NodeDef>,
    iterator: NodeDef,
    make_iterator: NodeDef,
}

fn inline(
    node: &NodeView,
    library: &HashMap<&str, &FunctionDef>,
    names: &mut Names,
) -> Result<Inlined> {
    let fail = |function: &str, reason: String| Error::OneShotFactory {
        iterator: node.name.to_owned(),
        function: function.to_owned(),
        reason,
    };
    let def = node
        .to_node_def()
        .map_err(|e| fail("", format!("the node does not decode: {e}")))?;
    if let Some(input) = def.input.iter().find(|i| !i.starts_with('^')) {
        return Err(fail(
            "",
            format!("a OneShotIterator takes no data inputs, but it reads '{input}'"),
        ));
    }
    let name = def
        .attr_func("dataset_factory")
        .map_err(|e| fail("", e.to_string()))?
        .name
        .clone();
    let function = *library.get(name.as_str()).ok_or_else(|| {
        fail(
            &name,
            "the graph's function library has no function of that name".into(),
        )
    })?;
    let signature = function
        .signature
        .as_ref()
        .ok_or_else(|| fail(&name, "the function has no signature".into()))?;
    if !signature.input_arg.is_empty() {
        return Err(fail(
            &name,
            format!(
                "the function takes {} argument(s); a dataset factory takes none",
                signature.input_arg.len()
            ),
        ));
    }
    let [output] = signature.output_arg.as_slice() else {
        return Err(fail(
            &name,
            format!(
                "the function returns {} value(s); a dataset factory returns one dataset",
                signature.output_arg.len()
            ),
        ));
    };
    let ret = function.ret.get(&output.name).ok_or_else(|| {
        fail(
            &name,
            format!("its `ret` maps no tensor to the output '{}'", output.name),
        )
    })?;
    let body = Body::new(function, library).map_err(|reason| fail(&name, reason))?;

    let base = format!("{}/{FACTORY_SCOPE}", node.name);
    let prefix = names
        .free(&base, |p| {
            function
                .node_def
                .iter()
                .all(|n| !names.taken(&format!("{p}/{}", n.name)))
        })
        .ok_or_else(|| fail(&name, format!("no free name scope like '{base}'")))?;
    let make_name = names
        .free(&format!("{}/{MAKE_ITERATOR}", node.name), |n| {
            !names.taken(n)
        })
        .ok_or_else(|| fail(&name, "no free name for the MakeIterator node".into()))?;

    let mut inlined = Vec::with_capacity(function.node_def.len());
    for original in &function.node_def {
        inlined.push(
            body.inline_node(original, &prefix, node.device)
                .map_err(|reason| fail(&name, reason))?,
        );
    }
    let dataset = body
        .graph_tensor(ret, &prefix)
        .map_err(|reason| fail(&name, format!("its `ret` '{ret}': {reason}")))?;
    for n in &inlined {
        names.added.insert(n.name.clone());
    }
    names.added.insert(make_name.clone());

    let mut iterator = NodeDef::new();
    iterator.name = def.name.clone();
    iterator.op = "IteratorV2".into();
    iterator.device = def.device.clone();
    iterator.input = def.input.clone();
    for key in KEPT_ATTRS {
        if let Some(value) = def.attr.get(*key) {
            iterator.attr.insert((*key).into(), value.clone());
        }
    }
    for key in ["shared_name", "container"] {
        iterator
            .attr
            .entry(key.into())
            .or_insert_with(|| string_attr(b""));
    }
    for key in ["output_types", "output_shapes"] {
        if !iterator.attr.contains_key(key) {
            return Err(fail(
                &name,
                format!("the iterator has no '{key}' attribute"),
            ));
        }
    }

    let mut make_iterator = NodeDef::new();
    make_iterator.name = make_name;
    make_iterator.op = "MakeIterator".into();
    make_iterator.device = def.device.clone();
    let dataset_node = TensorRef::parse(&dataset)
        .map(|t| t.node.to_owned())
        .unwrap_or_default();
    make_iterator.input = vec![dataset, def.name.clone()];
    // TensorFlow colocates an initializable iterator's MakeIterator with its dataset.
    let mut class = AttrValue::new();
    class.mut_list().s = vec![format!("loc:@{dataset_node}").into_bytes()];
    make_iterator.attr.insert("_class".into(), class);

    Ok(Inlined {
        function: name,
        body: inlined,
        iterator,
        make_iterator,
    })
}

fn string_attr(s: &[u8]) -> AttrValue {
    let mut value = AttrValue::new();
    value.set_s(s.to_vec());
    value
}

/// A factory function's body, indexed for name translation.
struct Body<'f> {
    nodes: HashMap<&'f str, &'f NodeDef>,
    library: &'f HashMap<&'f str, &'f FunctionDef>,
}

impl<'f> Body<'f> {
    /// Errors name what makes the body unusable.
    fn new(
        function: &'f FunctionDef,
        library: &'f HashMap<&'f str, &'f FunctionDef>,
    ) -> std::result::Result<Self, String> {
        let mut nodes = HashMap::with_capacity(function.node_def.len());
        for n in &function.node_def {
            if n.name.is_empty() || n.op.is_empty() {
                return Err(format!("a body node ('{}') has no name or no op", n.name));
            }
            if nodes.insert(n.name.as_str(), n).is_some() {
                return Err(format!("the body has two nodes named '{}'", n.name));
            }
            if let Some((key, value)) = n.attr.iter().find(|(_, v)| has_placeholder(v)) {
                return Err(format!(
                    "body node '{}' ({}) takes its attribute '{key}' from the function's \
                     attribute '{}', which a dataset factory does not have",
                    n.name,
                    n.op,
                    placeholder_of(value)
                ));
            }
        }
        Ok(Body { nodes, library })
    }

    /// A body node as a graph node under `prefix`.
    fn inline_node(
        &self,
        original: &NodeDef,
        prefix: &str,
        device: &str,
    ) -> std::result::Result<NodeDef, String> {
        let mut node = original.clone();
        node.name = format!("{prefix}/{}", original.name);
        if node.device.is_empty() {
            device.clone_into(&mut node.device);
        }
        node.input = original
            .input
            .iter()
            .map(|input| {
                match input.strip_prefix('^') {
                    Some(control) if self.nodes.contains_key(control) => {
                        Ok(format!("^{prefix}/{control}"))
                    }
                    Some(control) => Err(format!("no body node is named '{control}'")),
                    None => self.graph_tensor(input, prefix),
                }
                .map_err(|reason| {
                    format!(
                        "body node '{}' ({}) reads '{input}': {reason}",
                        original.name, original.op
                    )
                })
            })
            .collect::<std::result::Result<_, _>>()?;
        if let Some(Value::List(list)) = node.attr.get_mut("_class").and_then(|v| v.value.as_mut())
        {
            for entry in &mut list.s {
                let renamed = std::str::from_utf8(entry)
                    .ok()
                    .and_then(|s| s.strip_prefix("loc:@"))
                    .filter(|target| self.nodes.contains_key(target))
                    .map(|target| format!("loc:@{prefix}/{target}"));
                if let Some(renamed) = renamed {
                    *entry = renamed.into_bytes();
                }
            }
        }
        Ok(node)
    }

    /// The graph name of a body tensor `node:out_arg:i`, the node renamed under `prefix`.
    fn graph_tensor(&self, input: &str, prefix: &str) -> std::result::Result<String, String> {
        let parts: Vec<&str> = input.split(':').collect();
        let [node, arg, index] = parts.as_slice() else {
            return Err(if parts.len() == 1 && !self.nodes.contains_key(input) {
                "it names neither a body node's output nor an argument (a dataset factory has none)"
                    .into()
            } else {
                "a function body names tensors 'node:output_arg:index'".into()
            });
        };
        let body_node = self
            .nodes
            .get(node)
            .ok_or_else(|| format!("no body node is named '{node}'"))?;
        let index: usize = index
            .parse()
            .map_err(|_| format!("'{index}' is not an output index"))?;
        let layout = self.layout(body_node)?;
        let range = layout
            .iter()
            .find(|(name, _)| name == arg)
            .map(|(_, range)| range.clone())
            .ok_or_else(|| {
                format!(
                    "{} has no output '{arg}' (its outputs: {})",
                    body_node.op,
                    layout
                        .iter()
                        .map(|(name, _)| name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
        if index >= range.len() {
            return Err(format!(
                "output '{arg}' of '{node}' ({}) has {} element(s), not {}",
                body_node.op,
                range.len(),
                index + 1
            ));
        }
        Ok(match range.start + index {
            0 => format!("{prefix}/{node}"),
            k => format!("{prefix}/{node}:{k}"),
        })
    }

    fn layout(&self, node: &NodeDef) -> std::result::Result<Vec<(String, Range<usize>)>, String> {
        OpRegistry::tensorflow()
            .output_args(node, self.library)
            .map_err(|e| format!("body node '{}': {e}", node.name))
    }
}

fn has_placeholder(value: &AttrValue) -> bool {
    matches!(value.value, Some(Value::Placeholder(_)))
}

fn placeholder_of(value: &AttrValue) -> &str {
    match &value.value {
        Some(Value::Placeholder(p)) => p,
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_graphs::node;
    use lode_proto::tf::function::FunctionDefLibrary;
    use lode_proto::tf::graph::GraphDef;
    use lode_proto::tf::op_def::{op_def::ArgDef, OpDef};
    use lode_proto::tf::types::DataType;
    use protobuf::{EnumOrUnknown, Message};

    fn type_attr(t: DataType) -> AttrValue {
        let mut a = AttrValue::new();
        a.set_type(t);
        a
    }

    fn types_attr(types: &[DataType]) -> AttrValue {
        let mut a = AttrValue::new();
        a.mut_list().type_ = types.iter().map(|&t| EnumOrUnknown::new(t)).collect();
        a
    }

    fn shapes_attr(n: usize) -> AttrValue {
        let mut a = AttrValue::new();
        a.mut_list().shape = vec![Default::default(); n];
        a
    }

    fn int64_const(name: &str, v: i64) -> NodeDef {
        let mut n = node(name, "Const", &[]);
        n.attr.insert("dtype".into(), type_attr(DataType::DT_INT64));
        let mut t = lode_proto::tf::tensor::TensorProto::new();
        t.dtype = EnumOrUnknown::new(DataType::DT_INT64);
        t.int64_val = vec![v];
        let mut value = AttrValue::new();
        value.set_tensor(t);
        n.attr.insert("value".into(), value);
        n
    }

    /// A factory `RangeDataset(0, 10, 1) → RepeatDataset`, with a colocation and a control input.
    fn factory(name: &str) -> FunctionDef {
        let mut f = FunctionDef::new();
        let mut sig = OpDef::new();
        sig.name = name.into();
        let mut out = ArgDef::new();
        out.name = "repeatdataset".into();
        out.type_ = EnumOrUnknown::new(DataType::DT_VARIANT);
        sig.output_arg.push(out);
        f.signature = Some(sig).into();
        f.node_def.push(int64_const("start", 0));
        f.node_def.push(int64_const("stop", 10));
        f.node_def.push(int64_const("step", 1));
        f.node_def.push(int64_const("count", -1));
        let mut range = node(
            "RangeDataset",
            "RangeDataset",
            &["start:output:0", "stop:output:0", "step:output:0"],
        );
        range
            .attr
            .insert("output_types".into(), types_attr(&[DataType::DT_INT64]));
        range.attr.insert("output_shapes".into(), shapes_attr(1));
        f.node_def.push(range);
        let mut repeat = node(
            "RepeatDataset",
            "RepeatDataset",
            &["RangeDataset:handle:0", "count:output:0", "^step"],
        );
        repeat
            .attr
            .insert("output_types".into(), types_attr(&[DataType::DT_INT64]));
        repeat.attr.insert("output_shapes".into(), shapes_attr(1));
        let mut class = AttrValue::new();
        class.mut_list().s = vec![b"loc:@RangeDataset".to_vec()];
        repeat.attr.insert("_class".into(), class);
        f.node_def.push(repeat);
        f.ret
            .insert("repeatdataset".into(), "RepeatDataset:handle:0".into());
        f
    }

    /// A graph with a OneShotIterator over `factory` (when given) and an IteratorGetNext.
    fn graph(function: Option<FunctionDef>, factory_name: &str) -> GraphDef {
        let mut g = GraphDef::new();
        let mut it = node("OneShotIterator", ONE_SHOT_OP, &[]);
        let mut func = AttrValue::new();
        func.mut_func().name = factory_name.into();
        it.attr.insert("dataset_factory".into(), func);
        it.attr
            .insert("output_types".into(), types_attr(&[DataType::DT_INT64]));
        it.attr.insert("output_shapes".into(), shapes_attr(1));
        it.attr.insert("shared_name".into(), string_attr(b""));
        it.device = "/device:CPU:0".into();
        g.node.push(it);
        let mut next = node("IteratorGetNext", "IteratorGetNext", &["OneShotIterator"]);
        next.attr
            .insert("output_types".into(), types_attr(&[DataType::DT_INT64]));
        next.attr.insert("output_shapes".into(), shapes_attr(1));
        g.node.push(next);
        if let Some(f) = function {
            let mut lib = FunctionDefLibrary::new();
            lib.function.push(f);
            g.library = Some(lib).into();
        }
        g
    }

    fn run(g: &GraphDef) -> Result<Option<(GraphDef, Vec<InlinedIterator>)>> {
        let bytes = g.write_to_bytes().expect("encodes");
        let view = GraphView::parse(&bytes).expect("parses");
        Ok(normalize(&view)?.map(|n| {
            let out: GraphDef = lode_proto::io::decode_binary(&n.bytes).expect("decodes");
            (out, n.iterators)
        }))
    }

    fn by_name<'g>(g: &'g GraphDef, name: &str) -> &'g NodeDef {
        g.node
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    #[test]
    fn a_graph_without_one_shot_iterators_is_left_alone() {
        let mut g = graph(Some(factory("f")), "f");
        g.node[0].op = "IteratorV2".into();
        assert!(run(&g).expect("normalizes").is_none());
    }

    #[test]
    fn inlines_the_factory_and_adds_iterator_and_make_iterator() {
        let g = graph(Some(factory("f")), "f");
        let (out, inlined) = run(&g).expect("normalizes").expect("rewritten");
        let p = "OneShotIterator/dataset_factory";
        assert_eq!(inlined.len(), 1);
        assert_eq!(inlined[0].iterator, "OneShotIterator");
        assert_eq!(inlined[0].function, "f");
        assert_eq!(
            inlined[0].make_iterator,
            "OneShotIterator/lode_make_iterator"
        );
        assert_eq!(inlined[0].nodes.len(), 6);
        // Body inputs translated through the output-arg layout; controls and colocations follow.
        let range = by_name(&out, &format!("{p}/RangeDataset"));
        assert_eq!(
            range.input,
            vec![
                format!("{p}/start"),
                format!("{p}/stop"),
                format!("{p}/step")
            ]
        );
        assert_eq!(
            range.device, "/device:CPU:0",
            "empty devices take the iterator's"
        );
        let repeat = by_name(&out, &format!("{p}/RepeatDataset"));
        assert_eq!(
            repeat.input,
            vec![
                format!("{p}/RangeDataset"),
                format!("{p}/count"),
                format!("^{p}/step")
            ]
        );
        let Some(Value::List(class)) = &repeat.attr["_class"].value else {
            panic!("_class is a list");
        };
        assert_eq!(class.s, vec![format!("loc:@{p}/RangeDataset").into_bytes()]);
        // The iterator keeps its name and its element signature; the factory is gone from it.
        let it = by_name(&out, "OneShotIterator");
        assert_eq!(it.op, "IteratorV2");
        assert!(!it.attr.contains_key("dataset_factory"));
        for key in ["shared_name", "container", "output_types", "output_shapes"] {
            assert!(it.attr.contains_key(key), "{key}");
        }
        let make = by_name(&out, "OneShotIterator/lode_make_iterator");
        assert_eq!(make.op, "MakeIterator");
        assert_eq!(
            make.input,
            vec![format!("{p}/RepeatDataset"), "OneShotIterator".to_owned()]
        );
        assert_eq!(
            by_name(&out, "IteratorGetNext").input,
            vec!["OneShotIterator"]
        );
        assert_eq!(out.node.len(), g.node.len() + 6 + 1);
        // The rewritten graph is one the decoupler's graph view accepts (every input resolves).
        let bytes = out.write_to_bytes().expect("encodes");
        let view = GraphView::parse(&bytes).expect("parses");
        crate::graph::Graph::new(&view).expect("a valid graph");
    }

    #[test]
    fn multi_output_args_map_to_flat_indices() {
        let mut f = factory("f");
        // Unique's second output arg `idx` is flat output 1.
        let mut unique = node("u", "Unique", &["stop:output:0"]);
        unique
            .attr
            .insert("T".into(), type_attr(DataType::DT_INT64));
        f.node_def.push(unique);
        let mut id = node("id", "Identity", &["u:idx:0"]);
        id.attr.insert("T".into(), type_attr(DataType::DT_INT32));
        f.node_def.push(id);
        let (out, _) = run(&graph(Some(f), "f"))
            .expect("normalizes")
            .expect("rewritten");
        assert_eq!(
            by_name(&out, "OneShotIterator/dataset_factory/id").input,
            vec!["OneShotIterator/dataset_factory/u:1"]
        );
    }

    #[test]
    fn a_taken_scope_gets_a_suffix() {
        let mut g = graph(Some(factory("f")), "f");
        g.node
            .push(int64_const("OneShotIterator/dataset_factory/count", 3));
        g.node
            .push(int64_const("OneShotIterator/lode_make_iterator", 3));
        let (out, inlined) = run(&g).expect("normalizes").expect("rewritten");
        assert!(inlined[0]
            .nodes
            .iter()
            .all(|n| n.starts_with("OneShotIterator/dataset_factory_1/")));
        assert_eq!(
            inlined[0].make_iterator,
            "OneShotIterator/lode_make_iterator_1"
        );
        let mut seen = HashSet::new();
        assert!(
            out.node.iter().all(|n| seen.insert(n.name.clone())),
            "names are unique"
        );
    }

    fn error(g: &GraphDef) -> String {
        match run(g) {
            Ok(_) => panic!("normalized a bad factory"),
            Err(e @ Error::OneShotFactory { .. }) => e.to_string(),
            Err(e) => panic!("wrong error: {e}"),
        }
    }

    #[test]
    fn bad_factories_are_errors_naming_iterator_and_function() {
        let missing = error(&graph(None, "gone"));
        assert!(
            missing.contains("'OneShotIterator'") && missing.contains("'gone'"),
            "{missing}"
        );
        assert!(missing.contains("no function"), "{missing}");

        let mut g = graph(Some(factory("f")), "f");
        g.node[0].attr.remove("dataset_factory");
        let no_attr = error(&g);
        assert!(no_attr.contains("dataset_factory"), "{no_attr}");

        let mut f = factory("f");
        f.ret.clear();
        assert!(error(&graph(Some(f), "f")).contains("ret"));

        let mut f = factory("f");
        f.node_def[4].input[0] = "nowhere:output:0".into();
        let bad_input = error(&graph(Some(f), "f"));
        assert!(
            bad_input.contains("'f'") && bad_input.contains("nowhere"),
            "{bad_input}"
        );

        let mut f = factory("f");
        f.node_def[5].input[0] = "RangeDataset:output:0".into();
        let bad_arg = error(&graph(Some(f), "f"));
        assert!(
            bad_arg.contains("no output 'output'") && bad_arg.contains("handle"),
            "{bad_arg}"
        );

        let mut f = factory("f");
        f.node_def[5].input[0] = "RangeDataset:handle:1".into();
        assert!(error(&graph(Some(f), "f")).contains("has 1 element"));

        let mut f = factory("f");
        f.node_def[5].input[0] = "RangeDataset".into();
        assert!(error(&graph(Some(f), "f")).contains("output_arg"));

        let mut f = factory("f");
        f.node_def[4].op = "NoSuchDataset".into();
        assert!(error(&graph(Some(f), "f")).contains("NoSuchDataset"));

        let mut f = factory("f");
        let mut arg = ArgDef::new();
        arg.name = "x".into();
        f.signature.mut_or_insert_default().input_arg.push(arg);
        assert!(error(&graph(Some(f), "f")).contains("takes 1 argument"));

        let mut f = factory("f");
        f.node_def.push(int64_const("count", 1));
        assert!(error(&graph(Some(f), "f")).contains("two nodes named 'count'"));

        let mut f = factory("f");
        let mut placeholder = AttrValue::new();
        placeholder.set_placeholder("T".into());
        f.node_def[0].attr.insert("dtype".into(), placeholder);
        assert!(error(&graph(Some(f), "f")).contains("attribute 'T'"));

        let mut g = graph(Some(factory("f")), "f");
        g.node[0].input.push("IteratorGetNext".into());
        assert!(error(&g).contains("takes no data inputs"));
    }

    #[test]
    fn never_panics_on_mangled_bodies() {
        let base = factory("f");
        for i in 0..base.node_def.len() {
            for input in [
                "",
                ":",
                "a:b",
                "a:b:c:d",
                "RangeDataset:handle:x",
                "^",
                "^nope",
            ] {
                let mut f = base.clone();
                f.node_def[i].input.push(input.into());
                let _ = run(&graph(Some(f), "f"));
            }
        }
    }
}
