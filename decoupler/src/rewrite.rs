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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use lode_proto::ops::is_plain;
use lode_proto::tf::attr_value::{attr_value, AttrValue};
use lode_proto::tf::function::FunctionDefLibrary;
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::tensor_shape::TensorShapeProto;
use lode_proto::tf::types::DataType;
use protobuf::{EnumOrUnknown, MessageField};

use crate::graph::{Graph, NodeId, Tensor};
use crate::partition::{Partition, Place};

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

#[derive(Debug)]
pub struct StageOut {
    pub graph: GraphDef,
    /// Original nodes in this stage's graph and in no other graph.
    pub nodes: Vec<NodeId>,
    pub send_node: String,
    pub sends: Vec<Crossing>,
    pub recv: Vec<RecvSpec>,
}

#[derive(Debug)]
pub struct Rewritten {
    pub training: GraphDef,
    pub training_recv: Vec<RecvSpec>,
    pub stages: Vec<StageOut>,
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

pub fn rewrite(graph: &Graph, part: &Partition, reader: Option<(&str, &str)>) -> Rewritten {
    let n = graph.len();
    let stages = part.stage_count();
    let home_of = |id: NodeId| match part.place[id] {
        Place::Stage(s) => Some(Home::Stage(s)),
        Place::Training => Some(Home::Training),
        Place::Shared => None,
    };
    let stub_kind = |id: NodeId| -> Option<&'static str> {
        let op = graph.node(id).op.as_str();
        if part.table_inits.contains(&id) || op == "MakeIterator" {
            Some("NoOp")
        } else if op.starts_with("IteratorGetNext") {
            Some("IdentityN")
        } else {
            None
        }
    };

    // Crossing tensors per producing stage, and which consumer homes read them.
    let mut crossing: Vec<BTreeSet<Tensor>> = vec![BTreeSet::new(); stages];
    let mut readers: Vec<BTreeSet<Home>> = vec![BTreeSet::new(); stages];
    let mut control_readers: Vec<BTreeSet<Home>> = vec![BTreeSet::new(); stages];
    for consumer in 0..n {
        let Some(home) = home_of(consumer) else {
            continue;
        };
        if home == Home::Training && stub_kind(consumer).is_some() && !part.is_stage(consumer) {
            // Stubs of shared initializers read nothing.
            continue;
        }
        for &t in &graph.inputs[consumer] {
            if let Place::Stage(s) = part.place[t.node] {
                if Home::Stage(s) != home {
                    crossing[s].insert(t);
                    readers[s].insert(home);
                }
            }
        }
        for &c in &graph.controls[consumer] {
            if let Place::Stage(s) = part.place[c] {
                if Home::Stage(s) != home && stub_kind(c).is_none() {
                    control_readers[s].insert(home);
                }
            }
        }
    }
    // IteratorGetNext stand-ins in training read every plain output of the real one.
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
                readers[s].insert(Home::Training);
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
    let send_index: Vec<HashMap<Tensor, usize>> = sends
        .iter()
        .map(|v| v.iter().enumerate().map(|(i, &t)| (t, i)).collect())
        .collect();
    let recv_name = |s: usize| format!("{LODE_SCOPE}/DWRecv_stage_{s}");
    let send_name = |s: usize| format!("{LODE_SCOPE}/DWSend_stage_{s}");

    // Rewrites one original node for `home`: inputs from other stages go through DWRecv.
    let remap = |id: NodeId, home: Home, needed_recv: &mut BTreeSet<usize>| -> NodeDef {
        let original = graph.node(id);
        let mut node = original.clone();
        node.input.clear();
        for &t in &graph.inputs[id] {
            match part.place[t.node] {
                Place::Stage(s) if Home::Stage(s) != home => {
                    needed_recv.insert(s);
                    let k = send_index[s].get(&t).copied().unwrap_or_default();
                    node.input.push(format!("{}:{k}", recv_name(s)));
                }
                _ => node.input.push(graph.tensor_name(t)),
            }
        }
        let mut controls = BTreeSet::new();
        for &c in &graph.controls[id] {
            let name = match part.place[c] {
                Place::Stage(s) if Home::Stage(s) != home => {
                    if home == Home::Training && stub_kind(c).is_some() {
                        graph.node(c).name.clone()
                    } else {
                        needed_recv.insert(s);
                        recv_name(s)
                    }
                }
                _ => graph.node(c).name.clone(),
            };
            if controls.insert(name.clone()) {
                node.input.push(format!("^{name}"));
            }
        }
        node
    };

    let mut copied_into: HashMap<NodeId, usize> = HashMap::new();
    let mut build =
        |home: Home, members: &[NodeId]| -> (Vec<NodeDef>, BTreeSet<usize>, Vec<NodeId>) {
            let member_set: HashSet<NodeId> = members.iter().copied().collect();
            // Shared ancestors this graph needs (never through a stubbed initializer in training).
            let mut shared: BTreeSet<NodeId> = BTreeSet::new();
            let mut stack: Vec<NodeId> = members.to_vec();
            while let Some(id) = stack.pop() {
                if home == Home::Training && stub_kind(id).is_some() && !member_set.contains(&id) {
                    continue;
                }
                let sources = graph.inputs[id]
                    .iter()
                    .map(|t| t.node)
                    .chain(graph.controls[id].iter().copied());
                for s in sources {
                    if part.place[s] == Place::Shared
                        && !(home == Home::Training && part.table_inits.contains(&s))
                        && shared.insert(s)
                    {
                        stack.push(s);
                    }
                }
            }
            // Tables used by a stage come with their initializers.
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
                                for s in graph.inputs[id]
                                    .iter()
                                    .map(|t| t.node)
                                    .chain(graph.controls[id].iter().copied())
                                {
                                    if part.place[s] == Place::Shared && shared.insert(s) {
                                        stack.push(s);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            for &s in &shared {
                *copied_into.entry(s).or_insert(0) += 1;
            }
            let mut all: Vec<NodeId> = members
                .iter()
                .copied()
                .chain(shared.iter().copied())
                .collect();
            all.sort_unstable();
            let mut needed = BTreeSet::new();
            let nodes = all.iter().map(|&id| remap(id, home, &mut needed)).collect();
            (nodes, needed, all)
        };

    let mut stage_outs: Vec<StageOut> = Vec::new();
    for s in 0..stages {
        let members: Vec<NodeId> = (0..n)
            .filter(|&i| part.place[i] == Place::Stage(s))
            .collect();
        let (mut nodes, needed, all) = build(Home::Stage(s), &members);
        let recv = add_recvs(&mut nodes, &needed, &sends, graph, &recv_name);
        let crossings: Vec<Crossing> = sends[s]
            .iter()
            .map(|&t| Crossing {
                tensor: t,
                dtype: graph.dtype(t),
                shape: output_shape(graph, t),
            })
            .collect();
        if !crossings.is_empty() || !control_readers[s].is_empty() {
            nodes.push(send_node(&send_name(s), s, &crossings, graph));
        }
        let mut stage_graph = GraphDef::new();
        stage_graph.node = nodes;
        let _ = members;
        stage_outs.push(StageOut {
            graph: stage_graph,
            nodes: all,
            send_node: send_name(s),
            sends: crossings,
            recv,
        });
    }

    let members: Vec<NodeId> = (0..n)
        .filter(|&i| part.place[i] == Place::Training)
        .collect();
    let (mut nodes, mut needed, mut all) = build(Home::Training, &members);
    // Stand-ins for data-side names the program runs or fetches, and for control targets.
    let mut stubs = Vec::new();
    let referenced: BTreeSet<NodeId> = members
        .iter()
        .flat_map(|&id| graph.controls[id].iter().copied())
        .filter(|&c| part.place[c] != Place::Training && stub_kind(c).is_some())
        .collect();
    for id in 0..n {
        if part.place[id] == Place::Training {
            continue;
        }
        let Some(kind) = stub_kind(id) else { continue };
        let original = graph.node(id);
        let mut node = NodeDef::new();
        node.name = original.name.clone();
        node.device = original.device.clone();
        let is_identity = kind == "IdentityN" && get_next_identity.contains(&id);
        if is_identity {
            let Place::Stage(s) = part.place[id] else {
                continue;
            };
            node.op = "IdentityN".into();
            let mut types = Vec::new();
            for (output, &t) in graph.out_types[id].iter().enumerate() {
                let output = u32::try_from(output).unwrap_or(u32::MAX);
                let k = send_index[s]
                    .get(&Tensor { node: id, output })
                    .copied()
                    .unwrap_or_default();
                node.input.push(format!("{}:{k}", recv_name(s)));
                types.push(EnumOrUnknown::new(t));
            }
            needed.insert(s);
            node.attr.insert("T".into(), list_types(types));
            stubs.push((node.name.clone(), "IdentityN over DWRecv outputs"));
        } else if kind == "NoOp" || referenced.contains(&id) || kind == "IdentityN" {
            node.op = "NoOp".into();
            stubs.push((node.name.clone(), "NoOp"));
        } else {
            continue;
        }
        all.push(id);
        nodes.push(node);
    }
    let training_recv = add_recvs(&mut nodes, &needed, &sends, graph, &recv_name);
    all.sort_unstable();
    let mut dropped = 0;
    let training = finish_counting(graph, nodes, &mut dropped);
    let mut source_rewrite = None;
    for stage in &mut stage_outs {
        let mut nodes = std::mem::take(&mut stage.graph.node);
        if let Some((reader, compression)) = reader {
            if source_rewrite.is_none() {
                source_rewrite =
                    crate::source_rewrite::index_fed_source(&mut nodes, reader, compression);
            }
        }
        let g = finish_counting(graph, nodes, &mut dropped);
        stage.graph = g;
    }
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
    Rewritten {
        training,
        training_recv,
        stages: stage_outs,
        copied,
        stubs,
        dropped_colocations: dropped,
        source_rewrite,
    }
}

fn add_recvs(
    nodes: &mut Vec<NodeDef>,
    needed: &BTreeSet<usize>,
    sends: &[Vec<Tensor>],
    graph: &Graph,
    recv_name: &dyn Fn(usize) -> String,
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
            list_shapes(sends[s].iter().map(|&t| output_shape(graph, t))),
        );
        node.attr.insert("from_stage".into(), int_attr(s));
        nodes.push(node);
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

/// The static shape of a tensor when the graph records one (`_output_shapes`, or the
/// `output_shapes` of an iterator op).
pub fn output_shape(graph: &Graph, t: Tensor) -> Option<TensorShapeProto> {
    let node = graph.node(t.node);
    let index = usize::try_from(t.output).ok()?;
    for attr in ["_output_shapes", "output_shapes"] {
        if let Some(AttrValue {
            value: Some(attr_value::Value::List(list)),
            ..
        }) = node.attr.get(attr)
        {
            if let Some(shape) = list.shape.get(index) {
                return Some(shape.clone());
            }
        }
    }
    None
}

/// Completes a graph: versions, the library functions its nodes need, and colocation
/// constraints restricted to nodes present in it.
fn finish_counting(graph: &Graph, nodes: Vec<NodeDef>, dropped: &mut usize) -> GraphDef {
    let mut def = GraphDef::new();
    let names: HashSet<String> = nodes.iter().map(|n| n.name.clone()).collect();
    def.node = nodes;
    for node in &mut def.node {
        if let Some(AttrValue {
            value: Some(attr_value::Value::List(list)),
            ..
        }) = node.attr.get_mut("_class")
        {
            let before = list.s.len();
            list.s.retain(|s| {
                std::str::from_utf8(s)
                    .ok()
                    .and_then(|s| s.strip_prefix("loc:@"))
                    .is_none_or(|target| names.contains(target))
            });
            *dropped += before - list.s.len();
            if list.s.is_empty() {
                node.attr.remove("_class");
            }
        }
    }
    def.versions = graph.def.versions.clone();
    def.library = library_for(graph, &def.node);
    def
}

/// The functions `nodes` use, transitively, with their gradients.
fn library_for(graph: &Graph, nodes: &[NodeDef]) -> MessageField<FunctionDefLibrary> {
    use lode_proto::attr::NodeAttrs;
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    let mut stack: Vec<String> = Vec::new();
    let visit = |node: &NodeDef, stack: &mut Vec<String>| {
        for (_, f) in node.referenced_functions() {
            stack.push(f.to_owned());
        }
        if graph.library.contains_key(node.op.as_str()) {
            stack.push(node.op.clone());
        }
    };
    for node in nodes {
        visit(node, &mut stack);
    }
    while let Some(name) = stack.pop() {
        if !wanted.insert(name.clone()) {
            continue;
        }
        if let Some(f) = graph.library.get(name.as_str()) {
            for node in &f.node_def {
                visit(node, &mut stack);
            }
            for value in f.attr.values() {
                if let Some(attr_value::Value::Func(func)) = &value.value {
                    stack.push(func.name.clone());
                }
            }
        }
    }
    let Some(original) = graph.def.library.as_ref() else {
        return MessageField::none();
    };
    if wanted.is_empty() {
        return MessageField::none();
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
    MessageField::some(lib)
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

/// Stage index → original node names, for reports.
pub fn stage_names(graph: &Graph, stage: &StageOut) -> Vec<String> {
    stage
        .nodes
        .iter()
        .map(|&i| graph.node(i).name.clone())
        .collect()
}

/// Op histogram of a list of nodes.
pub fn op_histogram(graph: &Graph, nodes: &[NodeId]) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for &i in nodes {
        *h.entry(graph.node(i).op.clone()).or_insert(0) += 1;
    }
    h
}
