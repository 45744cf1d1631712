//! From a [`Partition`] to graphs: one GraphDef per data-worker stage and one for training,
//! joined by fused DWSend / DWRecv nodes.
//!
//! - Stage `i` sends every tensor that a later stage or the training graph reads from it
//!   through one `DWSend` node, in a stable order (topological position, then output index).
//! - A consumer graph gets one `DWRecv` per producing stage; its output `k` is the producer's
//!   crossing tensor `k`, so every consumer of a stage sees the same indices.
//! - Shared (input-independent) nodes are copied into every graph that needs them.
//! - Names the training program runs or fetches keep resolving in the training graph:
//!   `MakeIterator` and table initializers become NoOps (the data worker runs the real ones when
//!   it loads its stage); `IteratorGetNext` becomes an IdentityN over the DWRecv outputs when
//!   all its outputs are plain tensors, a NoOp otherwise.
//! - A control edge from a data-side node to a training node becomes a control edge from the
//!   DWRecv of that node's stage: a step's tensors arrive only after the stage ran the step.
//! - Colocation constraints (`_class: loc:@x`) that point at a node not in the same graph are
//!   dropped from that graph's copy, and counted in the report.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use lode_proto::ops::is_plain;
use lode_proto::tf::attr_value::{attr_value, AttrValue};
use lode_proto::tf::function::FunctionDefLibrary;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::tensor::TensorProto;
use lode_proto::tf::tensor_shape::TensorShapeProto;
use lode_proto::tf::types::DataType;
use lode_proto::view::{self, OutNode};
use protobuf::EnumOrUnknown;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, Tensor};
use crate::partition::{Partition, Place};
use crate::shapes::Shape;
use crate::source_rewrite::SourcePlan;

/// Name prefix of the nodes Lode adds.
pub const LODE_SCOPE: &str = "lode";

#[derive(Debug)]
pub struct Crossing {
    pub tensor: Tensor,
    pub dtype: DataType,
    pub shape: Option<TensorShapeProto>,
}

#[derive(Debug)]
pub struct RecvSpec {
    pub node: String,
    pub from_stage: usize,
    pub tensors: Vec<String>,
}

/// An output graph: unchanged original nodes as their original bytes, the rest as NodeDefs.
#[derive(Debug)]
pub struct OutGraph<'a> {
    pub names: Vec<Cow<'a, str>>,
    pub nodes: Vec<OutNode<'a>>,
    pub library: Option<FunctionDefLibrary>,
}

impl OutGraph<'_> {
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The binary GraphDef.
    pub fn encode(&self, graph: &Graph) -> Result<Vec<u8>> {
        view::encode_graph(
            &self.nodes,
            self.library.as_ref(),
            graph.def.versions.as_ref(),
        )
        .map_err(|source| {
            Error::Proto(lode_proto::Error::Encode {
                what: "GraphDef",
                source,
            })
        })
    }
}

#[derive(Debug)]
pub struct StageOut<'a> {
    pub graph: OutGraph<'a>,
    /// Original nodes in this stage's graph and in no other graph.
    pub nodes: Vec<NodeId>,
    pub send_node: String,
    pub sends: Vec<Crossing>,
    pub recv: Vec<RecvSpec>,
}

#[derive(Debug)]
pub struct Rewritten<'a> {
    pub training: OutGraph<'a>,
    pub training_recv: Vec<RecvSpec>,
    pub stages: Vec<StageOut<'a>>,
    /// Shared nodes that landed in more than one graph.
    pub copied: Vec<NodeId>,
    /// Training-graph names kept as stand-ins: (name, what it became).
    pub stubs: Vec<(String, &'static str)>,
    pub dropped_colocations: usize,
    /// The index-fed source that replaced the input reader, when there was one.
    pub source_rewrite: Option<crate::source_rewrite::SourceRewrite>,
}

/// Which graph a node lives in for the rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Home {
    Stage(usize),
    Training,
}

fn recv_name(s: usize) -> String {
    format!("{LODE_SCOPE}/DWRecv_stage_{s}")
}

fn send_name(s: usize) -> String {
    format!("{LODE_SCOPE}/DWSend_stage_{s}")
}

struct Ctx<'g, 'a> {
    graph: &'g Graph<'a>,
    part: &'g Partition,
    send_index: Vec<FxHashMap<Tensor, usize>>,
    source: Option<SourcePlan>,
}

impl<'a> Ctx<'_, 'a> {
    fn stub_kind(&self, id: NodeId) -> Option<&'static str> {
        let op = self.graph.node(id).op;
        // A data-side NoOp is a group the program may run by name (e.g. a scaffold's
        // `local_init_op` grouping the iterator's initializer): it gets a stand-in too.
        if self.part.table_inits.contains(&id) || op == "MakeIterator" || op == "NoOp" {
            Some("NoOp")
        } else if op == "IteratorToStringHandle" {
            // The handle a from_string_handle program fetches and feeds back (see
            // `string_handle`): in training it names nothing, and a constant serves.
            Some("Const")
        } else if op.starts_with("IteratorGetNext") {
            Some("IdentityN")
        } else {
            None
        }
    }

    /// One original node as it goes into `home`: its own bytes when nothing changes; else a
    /// NodeDef with inputs from other stages rewired to DWRecv outputs.
    fn place_node(
        &self,
        id: NodeId,
        home: Home,
        needed: &mut BTreeSet<usize>,
    ) -> Result<OutNode<'a>> {
        let graph = self.graph;
        let view = graph.node(id);
        let foreign = |src: NodeId| match self.part.place[src] {
            Place::Stage(s) if Home::Stage(s) != home => Some(s),
            _ => None,
        };
        let source_input = self.source.as_ref().and_then(|p| p.rewire.get(&id));
        let changes = source_input.is_some()
            || graph.inputs[id].iter().any(|t| foreign(t.node).is_some())
            || graph.controls[id].iter().any(|&c| foreign(c).is_some());
        if !changes {
            return Ok(OutNode::Raw(view.raw));
        }
        let mut inputs: Vec<String> = Vec::with_capacity(view.inputs.len());
        let mut data = graph.inputs[id].iter();
        let mut controls = BTreeSet::new();
        for (k, raw) in view.inputs.iter().enumerate() {
            if raw.starts_with('^') {
                continue;
            }
            let Some(&t) = data.next() else { break };
            if k == 0 {
                if let Some(input) = source_input {
                    inputs.push(input.clone());
                    continue;
                }
            }
            match foreign(t.node) {
                Some(s) => {
                    needed.insert(s);
                    let index = self.send_index[s].get(&t).copied().unwrap_or_default();
                    inputs.push(format!("{}:{index}", recv_name(s)));
                }
                None => inputs.push((*raw).to_owned()),
            }
        }
        for &c in &graph.controls[id] {
            let name = match foreign(c) {
                Some(_) if home == Home::Training && self.stub_kind(c).is_some() => {
                    graph.node(c).name.to_owned()
                }
                Some(s) => {
                    needed.insert(s);
                    recv_name(s)
                }
                None => graph.node(c).name.to_owned(),
            };
            if controls.insert(name.clone()) {
                inputs.push(format!("^{name}"));
            }
        }
        let bytes = view::with_inputs(view.raw, &inputs).map_err(|e| Error::InvalidGraph {
            reason: format!("node '{}': {e}", view.name),
        })?;
        Ok(OutNode::Encoded(bytes))
    }
}

pub fn rewrite<'a>(
    graph: &Graph<'a>,
    part: &Partition,
    source: Option<SourcePlan>,
) -> Result<Rewritten<'a>> {
    let n = graph.len();
    let stages = part.stage_count();
    let home_of = |id: NodeId| match part.place[id] {
        Place::Stage(s) => Some(Home::Stage(s)),
        Place::Training => Some(Home::Training),
        Place::Shared => None,
    };
    let mut ctx = Ctx {
        graph,
        part,
        send_index: Vec::new(),
        source,
    };
    let removed: HashSet<NodeId> = ctx
        .source
        .as_ref()
        .map(|p| p.removed.clone())
        .unwrap_or_default();

    // Crossing tensors per producing stage.
    let mut crossing: Vec<BTreeSet<Tensor>> = vec![BTreeSet::new(); stages];
    let mut control_readers: Vec<bool> = vec![false; stages];
    for consumer in 0..n {
        let Some(home) = home_of(consumer) else {
            continue;
        };
        for &t in &graph.inputs[consumer] {
            if let Place::Stage(s) = part.place[t.node] {
                if Home::Stage(s) != home {
                    crossing[s].insert(t);
                }
            }
        }
        for &c in &graph.controls[consumer] {
            if let Place::Stage(s) = part.place[c] {
                if Home::Stage(s) != home && ctx.stub_kind(c).is_none() {
                    control_readers[s] = true;
                }
            }
        }
    }
    // IteratorGetNext stand-ins in training read every output of the real one when all are plain.
    let mut get_next_identity: HashSet<NodeId> = HashSet::new();
    for id in 0..n {
        if let Place::Stage(s) = part.place[id] {
            if graph.node(id).op.starts_with("IteratorGetNext")
                && !graph.out_types[id].is_empty()
                && graph.out_types[id].iter().all(|&t| is_plain(t))
            {
                get_next_identity.insert(id);
                for output in 0..graph.out_types[id].len() {
                    let output = u32::try_from(output).unwrap_or(u32::MAX);
                    crossing[s].insert(Tensor { node: id, output });
                }
            }
        }
    }
    let sends: Vec<Vec<Tensor>> = crossing
        .iter()
        .map(|set| {
            let mut v: Vec<Tensor> = set.iter().copied().collect();
            v.sort_by_key(|t| (part.topo_rank[t.node], t.output));
            v
        })
        .collect();
    let wanted: Vec<bool> = part.place.iter().map(|p| *p != Place::Training).collect();
    let shapes = crate::shapes::infer(graph, &part.order, &wanted);
    ctx.send_index = sends
        .iter()
        .map(|v| v.iter().enumerate().map(|(i, &t)| (t, i)).collect())
        .collect();

    // The shared nodes a graph needs: ancestors of its members (never through a stubbed
    // initializer in training); a stage also takes the initializers of the tables it holds.
    let shared_for = |home: Home, members: &[NodeId]| -> BTreeSet<NodeId> {
        let member_set: FxHashSet<NodeId> = members.iter().copied().collect();
        let mut shared: BTreeSet<NodeId> = BTreeSet::new();
        let mut stack: Vec<NodeId> = members.to_vec();
        let push_sources = |id: NodeId, shared: &mut BTreeSet<NodeId>, stack: &mut Vec<NodeId>| {
            let sources = graph.inputs[id]
                .iter()
                .map(|t| t.node)
                .chain(graph.controls[id].iter().copied());
            for s in sources {
                if part.place[s] == Place::Shared
                    && !removed.contains(&s)
                    && !(home == Home::Training && part.table_inits.contains(&s))
                    && shared.insert(s)
                {
                    stack.push(s);
                }
            }
        };
        while let Some(id) = stack.pop() {
            if removed.contains(&id) {
                continue;
            }
            if home == Home::Training && ctx.stub_kind(id).is_some() && !member_set.contains(&id) {
                continue;
            }
            push_sources(id, &mut shared, &mut stack);
        }
        if let Home::Stage(_) = home {
            let mut added = true;
            while added {
                added = false;
                for &init in &part.table_inits {
                    let table = graph.inputs[init].first().map(|t| t.node);
                    if table.is_some_and(|t| shared.contains(&t)) && shared.insert(init) {
                        added = true;
                        let mut stack = vec![init];
                        while let Some(id) = stack.pop() {
                            push_sources(id, &mut shared, &mut stack);
                        }
                    }
                }
            }
        }
        shared
    };

    let mut copied_into: FxHashMap<NodeId, usize> = FxHashMap::default();
    // The original nodes of one graph: its members and the shared nodes they need, placed.
    type Gathered<'a> = (
        Vec<NodeId>,
        Vec<OutNode<'a>>,
        Vec<Cow<'a, str>>,
        BTreeSet<usize>,
    );
    let gather = |home: Home,
                  members: &[NodeId],
                  copied_into: &mut FxHashMap<NodeId, usize>|
     -> Result<Gathered<'a>> {
        let shared = shared_for(home, members);
        for &id in &shared {
            *copied_into.entry(id).or_insert(0) += 1;
        }
        let mut all: Vec<NodeId> = members.iter().copied().chain(shared).collect();
        all.sort_unstable();
        let mut needed = BTreeSet::new();
        let mut out = Vec::with_capacity(all.len() + 8);
        let mut names = Vec::with_capacity(all.len() + 8);
        for &id in &all {
            out.push(ctx.place_node(id, home, &mut needed)?);
            names.push(Cow::Borrowed(graph.node(id).name));
        }
        Ok((all, out, names, needed))
    };
    let mut stage_outs: Vec<StageOut> = Vec::new();
    let mut dropped = 0;
    for s in 0..stages {
        let members: Vec<NodeId> = (0..n)
            .filter(|&i| part.place[i] == Place::Stage(s) && !removed.contains(&i))
            .collect();
        let (all, mut out, mut names, needed) = gather(Home::Stage(s), &members, &mut copied_into)?;
        if let Some(plan) = ctx.source.as_ref().filter(|p| p.stage == s) {
            names.push(Cow::Owned(plan.node.name.clone()));
            out.push(OutNode::Owned(plan.node.clone()));
        }
        let recv = add_recvs(&mut out, &mut names, &needed, &sends, graph, &shapes);
        let crossings: Vec<Crossing> = sends[s]
            .iter()
            .map(|&t| Crossing {
                tensor: t,
                dtype: graph.dtype(t),
                shape: output_shape(&shapes, t),
            })
            .collect();
        if !crossings.is_empty() || control_readers[s] {
            names.push(Cow::Owned(send_name(s)));
            out.push(OutNode::Owned(send_node(
                &send_name(s),
                s,
                &crossings,
                graph,
            )));
        }
        let library = library_for(graph, &all);
        let mut g = OutGraph {
            names,
            nodes: out,
            library,
        };
        dropped += strip_colocations(graph, &mut g, &all)?;
        // The nodes the source replaced are in no graph: plan.json lists them as `replaced`.
        stage_outs.push(StageOut {
            graph: g,
            nodes: all,
            send_node: send_name(s),
            sends: crossings,
            recv,
        });
    }

    // The training graph.
    let members: Vec<NodeId> = (0..n)
        .filter(|&i| part.place[i] == Place::Training)
        .collect();
    let (all, mut out, mut names, mut needed) = gather(Home::Training, &members, &mut copied_into)?;
    let referenced: BTreeSet<NodeId> = members
        .iter()
        .flat_map(|&id| graph.controls[id].iter().copied())
        .filter(|&c| part.place[c] != Place::Training && ctx.stub_kind(c).is_some())
        .collect();
    let mut stubs = Vec::new();
    let present: HashSet<String> = names.iter().map(|n| n.to_string()).collect();
    for id in 0..n {
        if part.place[id] == Place::Training || present.contains(graph.node(id).name) {
            continue;
        }
        let Some(kind) = ctx.stub_kind(id) else {
            continue;
        };
        let original = graph.node(id);
        let mut node = NodeDef::new();
        node.name = original.name.to_owned();
        node.device = original.device.to_owned();
        if kind == "IdentityN" && get_next_identity.contains(&id) {
            let Place::Stage(s) = part.place[id] else {
                continue;
            };
            node.op = "IdentityN".into();
            let mut types = Vec::new();
            for (output, &t) in graph.out_types[id].iter().enumerate() {
                let output = u32::try_from(output).unwrap_or(u32::MAX);
                let k = ctx.send_index[s]
                    .get(&Tensor { node: id, output })
                    .copied()
                    .unwrap_or_default();
                node.input.push(format!("{}:{k}", recv_name(s)));
                types.push(EnumOrUnknown::new(t));
            }
            needed.insert(s);
            node.attr.insert("T".into(), list_types(types));
            stubs.push((node.name.clone(), "IdentityN over DWRecv outputs"));
        } else if kind == "Const" {
            node.op = "Const".into();
            let mut dtype = AttrValue::new();
            dtype.set_type(DataType::DT_STRING);
            node.attr.insert("dtype".into(), dtype);
            let mut value = TensorProto::new();
            value.dtype = EnumOrUnknown::new(DataType::DT_STRING);
            value.tensor_shape = protobuf::MessageField::some(TensorShapeProto::new());
            value.string_val = vec![format!("lode:{}", original.name).into_bytes()];
            let mut attr = AttrValue::new();
            attr.set_tensor(value);
            node.attr.insert("value".into(), attr);
            stubs.push((node.name.clone(), "Const"));
        } else if kind == "NoOp" || referenced.contains(&id) || kind == "IdentityN" {
            node.op = "NoOp".into();
            // Running the stand-in runs the stand-ins (and training nodes) it grouped; control
            // inputs on data-side work are dropped: running a group never waits for a step.
            if original.op == "NoOp" {
                for &c in &graph.controls[id] {
                    if part.place[c] == Place::Training || ctx.stub_kind(c).is_some() {
                        node.input.push(format!("^{}", graph.node(c).name));
                    }
                }
            }
            stubs.push((node.name.clone(), "NoOp"));
        } else {
            continue;
        }
        names.push(Cow::Owned(node.name.clone()));
        out.push(OutNode::Owned(node));
    }
    let training_recv = add_recvs(&mut out, &mut names, &needed, &sends, graph, &shapes);
    let library = library_for(graph, &all);
    let mut training = OutGraph {
        names,
        nodes: out,
        library,
    };
    dropped += strip_colocations(graph, &mut training, &all)?;

    let mut copied: Vec<NodeId> = copied_into
        .into_iter()
        .filter(|&(_, count)| count > 1)
        .map(|(id, _)| id)
        .collect();
    copied.sort_unstable();
    // A stage lists the original nodes it holds alone; copies are listed once, in `copied`.
    let copied_set: HashSet<NodeId> = copied.iter().copied().collect();
    for stage in &mut stage_outs {
        stage.nodes.retain(|id| !copied_set.contains(id));
    }
    let source_rewrite = ctx.source.map(|p| crate::source_rewrite::SourceRewrite {
        node: p.node.name.clone(),
        removed: {
            let mut names: Vec<String> = p
                .removed
                .iter()
                .map(|&id| graph.node(id).name.to_owned())
                .collect();
            names.sort();
            names
        },
    });
    Ok(Rewritten {
        training,
        training_recv,
        stages: stage_outs,
        copied,
        stubs,
        dropped_colocations: dropped,
        source_rewrite,
    })
}

fn add_recvs<'a>(
    nodes: &mut Vec<OutNode<'a>>,
    names: &mut Vec<Cow<'a, str>>,
    needed: &BTreeSet<usize>,
    sends: &[Vec<Tensor>],
    graph: &Graph,
    shapes: &[Vec<Shape>],
) -> Vec<RecvSpec> {
    let mut specs = Vec::new();
    for &s in needed {
        let mut node = NodeDef::new();
        node.name = recv_name(s);
        node.op = "DWRecv".into();
        let types = sends[s]
            .iter()
            .map(|&t| EnumOrUnknown::new(graph.dtype(t)))
            .collect();
        node.attr.insert("T".into(), list_types(types));
        node.attr.insert(
            "shapes".into(),
            list_shapes(sends[s].iter().map(|&t| output_shape(shapes, t))),
        );
        node.attr.insert("from_stage".into(), int_attr(s));
        names.push(Cow::Owned(node.name.clone()));
        nodes.push(OutNode::Owned(node));
        specs.push(RecvSpec {
            node: recv_name(s),
            from_stage: s,
            tensors: sends[s].iter().map(|&t| graph.tensor_name(t)).collect(),
        });
    }
    specs
}

fn send_node(name: &str, stage: usize, crossings: &[Crossing], graph: &Graph) -> NodeDef {
    let mut node = NodeDef::new();
    node.name = name.into();
    node.op = "DWSend".into();
    node.input = crossings
        .iter()
        .map(|c| graph.tensor_name(c.tensor))
        .collect();
    node.attr.insert(
        "T".into(),
        list_types(
            crossings
                .iter()
                .map(|c| EnumOrUnknown::new(c.dtype))
                .collect(),
        ),
    );
    node.attr.insert(
        "shapes".into(),
        list_shapes(crossings.iter().map(|c| c.shape.clone())),
    );
    node.attr.insert("stage".into(), int_attr(stage));
    node
}

fn int_attr(v: usize) -> AttrValue {
    let mut a = AttrValue::new();
    a.set_i(i64::try_from(v).unwrap_or(i64::MAX));
    a
}

fn list_types(types: Vec<EnumOrUnknown<DataType>>) -> AttrValue {
    let mut a = AttrValue::new();
    a.mut_list().type_ = types;
    a
}

fn list_shapes(shapes: impl Iterator<Item = Option<TensorShapeProto>>) -> AttrValue {
    let mut a = AttrValue::new();
    a.mut_list().shape = shapes
        .map(|s| {
            s.unwrap_or_else(|| {
                let mut unknown = TensorShapeProto::new();
                unknown.unknown_rank = true;
                unknown
            })
        })
        .collect();
    a
}

/// The static shape of a data-side tensor, as [`crate::shapes`] inferred it.
pub fn output_shape(shapes: &[Vec<Shape>], t: Tensor) -> Option<TensorShapeProto> {
    let shape = shapes.get(t.node)?.get(usize::try_from(t.output).ok()?)?;
    shape.as_ref().map(|_| crate::shapes::to_proto(shape))
}

/// Drops colocation constraints (`_class: loc:@x`) whose target is not in the graph; returns
/// how many were dropped.
fn strip_colocations(graph: &Graph, out: &mut OutGraph, originals: &[NodeId]) -> Result<usize> {
    let present: HashSet<&str> = out.names.iter().map(|n| n.as_ref()).collect();
    let mut fixes: Vec<(usize, NodeDef, usize)> = Vec::new();
    // `originals` are the first entries of `out.nodes`, in order.
    for (pos, &id) in originals.iter().enumerate() {
        let Some(bytes) = graph.node(id).attr("_class") else {
            continue;
        };
        let targets = view::attr::strings(bytes);
        let missing = targets
            .iter()
            .filter(|s| {
                std::str::from_utf8(s)
                    .ok()
                    .and_then(|s| s.strip_prefix("loc:@"))
                    .is_some_and(|t| !present.contains(t))
            })
            .count();
        if missing == 0 {
            continue;
        }
        let decoded = match &out.nodes[pos] {
            OutNode::Owned(n) => Ok(n.clone()),
            OutNode::Encoded(bytes) => lode_proto::io::decode_binary(bytes),
            OutNode::Raw(_) => graph.node(id).to_node_def(),
        };
        let mut node = decoded.map_err(|source| {
            Error::Proto(lode_proto::Error::Decode {
                path: Default::default(),
                what: "NodeDef",
                offset: 0,
                source,
            })
        })?;
        if let Some(AttrValue {
            value: Some(attr_value::Value::List(list)),
            ..
        }) = node.attr.get_mut("_class")
        {
            list.s.retain(|s| {
                std::str::from_utf8(s)
                    .ok()
                    .and_then(|s| s.strip_prefix("loc:@"))
                    .is_none_or(|t| present.contains(t))
            });
            if list.s.is_empty() {
                node.attr.remove("_class");
            }
        }
        fixes.push((pos, node, missing));
    }
    let mut dropped = 0;
    for (pos, node, missing) in fixes {
        out.nodes[pos] = OutNode::Owned(node);
        dropped += missing;
    }
    Ok(dropped)
}

/// The functions the original nodes `ids` use, transitively, with their gradients.
fn library_for(graph: &Graph, ids: &[NodeId]) -> Option<FunctionDefLibrary> {
    use lode_proto::attr::NodeAttrs;
    let original = graph.def.library.as_ref()?;
    let mut stack: Vec<String> = Vec::new();
    for &id in ids {
        let node = graph.node(id);
        for (_, bytes) in &node.attrs {
            stack.extend(view::attr::functions(bytes).into_iter().map(str::to_owned));
        }
        if graph.library.contains_key(node.op) {
            stack.push(node.op.to_owned());
        }
    }
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    while let Some(name) = stack.pop() {
        if !wanted.insert(name.clone()) {
            continue;
        }
        if let Some(f) = graph.library.get(name.as_str()) {
            for node in &f.node_def {
                stack.extend(
                    node.referenced_functions()
                        .into_iter()
                        .map(|(_, f)| f.to_owned()),
                );
                if graph.library.contains_key(node.op.as_str()) {
                    stack.push(node.op.clone());
                }
            }
            for value in f.attr.values() {
                if let Some(attr_value::Value::Func(func)) = &value.value {
                    stack.push(func.name.clone());
                }
            }
        }
    }
    if wanted.is_empty() {
        return None;
    }
    let mut lib = FunctionDefLibrary::new();
    lib.function = original
        .function
        .iter()
        .filter(|f| {
            f.signature
                .as_ref()
                .is_some_and(|s| wanted.contains(&s.name))
        })
        .cloned()
        .collect();
    lib.gradient = original
        .gradient
        .iter()
        .filter(|g| wanted.contains(&g.function_name))
        .cloned()
        .collect();
    lib.registered_gradients = original.registered_gradients.clone();
    Some(lib)
}

/// Bytes per step of a crossing tensor when its shape and dtype are fully known.
pub fn static_bytes(c: &Crossing) -> Option<u64> {
    let size = lode_proto::ops::element_size(c.dtype)?;
    let shape = c.shape.as_ref()?;
    if shape.unknown_rank {
        return None;
    }
    let mut total = size;
    for d in &shape.dim {
        total = total.checked_mul(u64::try_from(d.size).ok()?)?;
    }
    Some(total)
}

/// Original node names of a stage, for reports.
pub fn stage_names(graph: &Graph, stage: &StageOut) -> Vec<String> {
    stage
        .nodes
        .iter()
        .map(|&i| graph.node(i).name.to_owned())
        .collect()
}

/// Op histogram of a list of nodes.
pub fn op_histogram(graph: &Graph, nodes: &[NodeId]) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for &i in nodes {
        *h.entry(graph.node(i).op.to_owned()).or_insert(0) += 1;
    }
    h
}
