//! The cut: which nodes are model state, training, data-worker work, and in which stage.
//!
//! 1. State S: variable ops (and ops named with `--stateful-op`).
//! 2. Training region T: everything reachable downstream of S over data and control edges.
//! 3. Input-dependent nodes: descendants of the input pipeline (dataset, iterator and reader
//!    ops) outside T. With `simple`, only the pipeline itself up to IteratorGetNext.
//! 4. Tensors that would cross the cut as DT_VARIANT or DT_RESOURCE pull their consumer to the
//!    data side (e.g. DeserializeSparse after IteratorGetNext), until only plain tensors cross.
//! 5. With `Options::kernels`, data-side nodes the data worker cannot run stay in training,
//!    with every data-side node that depends on them ([`crate::kernels`]).
//! 6. Input-independent nodes (constants, shapes, lookup tables) are not sent: every graph that
//!    needs one gets a copy, with its ancestors. Lookup-table initializers travel with their
//!    table to the data side, where the worker runs them when it loads its stage.
//! 7. Stages: input-dependent nodes are levelled by device type: a node's stage is the largest
//!    stage of its data-side inputs, plus one when the device type changes (CPU → GPU → CPU …).

use std::collections::{BTreeSet, VecDeque};

use lode_proto::ops::is_plain;

use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, Tensor};
use crate::kernels::{KernelCheck, KernelCut};

/// Ops that hold model state.
pub const VARIABLE_OPS: &[&str] = &["VariableV2", "Variable", "VarHandleOp"];

/// Ops that fill a lookup table; they run on the data worker with their table.
pub const TABLE_INIT_OPS: &[&str] = &[
    "LookupTableImportV2",
    "LookupTableImport",
    "InitializeTableV2",
    "InitializeTable",
    "InitializeTableFromTextFileV2",
    "InitializeTableFromTextFile",
    "InitializeTableFromDataset",
];

/// Nodes of TF1 control-flow frames; the cut never passes through them.
const CONTROL_FLOW_OPS: &[&str] = &[
    "Enter",
    "RefEnter",
    "Exit",
    "RefExit",
    "NextIteration",
    "RefNextIteration",
    "Switch",
    "RefSwitch",
    "Merge",
    "RefMerge",
    "LoopCond",
];

pub fn is_pipeline_op(op: &str) -> bool {
    op.contains("Dataset")
        || op.starts_with("Iterator")
        || op.starts_with("AnonymousIterator")
        || op.starts_with("MultiDeviceIterator")
        || matches!(op, "MakeIterator" | "OneShotIterator" | "DeleteIterator")
        || op.ends_with("ReaderV2")
        || op.starts_with("ReaderRead")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

impl DeviceKind {
    pub fn of(device: &str) -> Self {
        if device.to_ascii_uppercase().contains("GPU") {
            DeviceKind::Gpu
        } else {
            DeviceKind::Cpu
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "CPU",
            DeviceKind::Gpu => "GPU",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Cut at IteratorGetNext (the tf.data boundary) instead of the maximal stateless region.
    pub simple: bool,
    /// Extra ops to treat as model state.
    pub stateful_ops: Vec<String>,
    /// The ops a data worker runs: data-side nodes it cannot run stay in training (see
    /// [`crate::kernels`]). None cuts as if every op had a kernel.
    pub kernels: Option<KernelCheck>,
}

/// Where each node goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Downstream of model state, or needed by nothing on the data side.
    Training,
    /// Input-dependent work of data-worker stage `i`.
    Stage(usize),
    /// Input-independent: copied into every graph that needs it.
    Shared,
}

#[derive(Debug)]
pub struct Partition {
    pub place: Vec<Place>,
    pub stage_devices: Vec<DeviceKind>,
    /// Nodes of the model state.
    pub state: Vec<NodeId>,
    /// Count of nodes in the training region T (downstream of state).
    pub training_region: usize,
    /// Table initializers that run on the data side (stubbed as NoOp in training).
    pub table_inits: BTreeSet<NodeId>,
    /// Consumers pulled to the data side so that no variant or resource crosses.
    pub pulled: Vec<NodeId>,
    /// What the kernel-aware cut kept in training, and why.
    pub kernel_cut: KernelCut,
    /// Topological position of each node (for stable orders).
    pub topo_rank: Vec<usize>,
    /// The nodes in topological order.
    pub order: Vec<NodeId>,
}

impl Partition {
    pub fn stage_count(&self) -> usize {
        self.stage_devices.len()
    }

    /// Whether the node is data-side (a stage node or a shared node some stage needs).
    pub fn is_stage(&self, id: NodeId) -> bool {
        matches!(self.place[id], Place::Stage(_))
    }
}

pub fn partition(graph: &Graph, options: &Options) -> Result<Partition> {
    let n = graph.len();
    let state: Vec<NodeId> = (0..n)
        .filter(|&i| {
            let op = graph.node(i).op;
            VARIABLE_OPS.contains(&op) || options.stateful_ops.iter().any(|s| s == op)
        })
        .collect();
    if state.is_empty() {
        return Err(Error::NoState);
    }
    let training = forward_closure(graph, &state, |_| true);

    let pipeline: Vec<NodeId> = (0..n)
        .filter(|&i| is_pipeline_op(graph.node(i).op) && !training[i])
        .collect();
    if pipeline.is_empty() {
        return Err(Error::NoPipeline);
    }
    // Input-dependent data-side nodes.
    let mut dependent = if options.simple {
        let mut d = vec![false; n];
        for &p in &pipeline {
            d[p] = true;
        }
        d
    } else {
        forward_closure(graph, &pipeline, |i| !training[i])
    };

    // Pull consumers of non-plain crossing tensors to the data side until none is left.
    let mut pulled = Vec::new();
    loop {
        let mut changed = false;
        for consumer in 0..n {
            if dependent[consumer] {
                continue;
            }
            let bad = graph.inputs[consumer]
                .iter()
                .any(|&t| dependent[t.node] && !is_plain(graph.dtype(t)));
            if !bad {
                continue;
            }
            if training[consumer] {
                let t = graph.inputs[consumer]
                    .iter()
                    .find(|&&t| dependent[t.node] && !is_plain(graph.dtype(t)))
                    .copied()
                    .unwrap_or(Tensor {
                        node: consumer,
                        output: 0,
                    });
                return Err(Error::Unplaceable {
                    nodes: vec![graph.node(consumer).name.to_owned()],
                    reason: format!(
                        "it is downstream of model state but reads {} ({:?}) from the input pipeline; only plain tensors can be sent to training",
                        graph.tensor_name(t),
                        graph.dtype(t)
                    ),
                });
            }
            dependent[consumer] = true;
            pulled.push(consumer);
            changed = true;
        }
        if !changed {
            break;
        }
    }

    let order = graph.topological_order();
    let kernel_cut = match options.kernels {
        Some(runs) => crate::kernels::limit(graph, &mut dependent, &training, &order, runs),
        None => KernelCut::default(),
    };
    pulled.retain(|&i| dependent[i]);

    // Table initializers go with their table when a data-side node uses the table.
    let data_side_needs = backward_closure(graph, &dependent);
    let mut table_inits = BTreeSet::new();
    for (i, &in_training) in training.iter().enumerate() {
        let node = graph.node(i);
        if TABLE_INIT_OPS.contains(&node.op) && !in_training {
            if let Some(table) = graph.inputs[i].first() {
                if data_side_needs[table.node] {
                    table_inits.insert(i);
                }
            }
        }
    }

    // The cut must not pass through TF1 control flow.
    for consumer in 0..n {
        if dependent[consumer] {
            continue;
        }
        for t in &graph.inputs[consumer] {
            if dependent[t.node] {
                let (a, b) = (graph.node(t.node), graph.node(consumer));
                if CONTROL_FLOW_OPS.contains(&a.op) || CONTROL_FLOW_OPS.contains(&b.op) {
                    return Err(Error::Unplaceable {
                        nodes: vec![a.name.to_owned(), b.name.to_owned()],
                        reason: "the cut would pass through a TF1 control-flow frame (Enter/Exit/Switch/Merge/NextIteration)".into(),
                    });
                }
            }
        }
    }

    let mut topo_rank = vec![0; n];
    for (rank, &id) in order.iter().enumerate() {
        topo_rank[id] = rank;
    }

    // Stage levels by device kind.
    let mut level: Vec<Option<usize>> = vec![None; n];
    let mut level_kind: Vec<DeviceKind> = Vec::new();
    let source_kind = pipeline
        .first()
        .map(|&p| DeviceKind::of(graph.node(p).device))
        .unwrap_or(DeviceKind::Cpu);
    for &id in &order {
        if !dependent[id] {
            continue;
        }
        let kind = DeviceKind::of(graph.node(id).device);
        let mut lvl = 0usize;
        let mut any_input = false;
        for src in graph.inputs[id]
            .iter()
            .map(|t| t.node)
            .chain(graph.controls[id].iter().copied())
        {
            if let Some(l) = level[src] {
                any_input = true;
                let bump = usize::from(level_kind[l] != kind);
                lvl = lvl.max(l + bump);
            }
        }
        if !any_input && kind != source_kind {
            lvl = 1;
        }
        // Levels alternate kinds: move up until the level's kind matches.
        loop {
            while level_kind.len() <= lvl {
                let next = match level_kind.last() {
                    None => source_kind,
                    Some(DeviceKind::Cpu) => DeviceKind::Gpu,
                    Some(DeviceKind::Gpu) => DeviceKind::Cpu,
                };
                level_kind.push(next);
            }
            if level_kind[lvl] == kind {
                break;
            }
            lvl += 1;
        }
        level[id] = Some(lvl);
    }
    // Drop levels that ended up empty and renumber.
    let mut used = vec![false; level_kind.len()];
    for l in level.iter().flatten() {
        used[*l] = true;
    }
    let mut renumber = vec![0; level_kind.len()];
    let mut stage_devices = Vec::new();
    for (l, &u) in used.iter().enumerate() {
        if u {
            renumber[l] = stage_devices.len();
            stage_devices.push(level_kind[l]);
        }
    }

    let mut place = vec![Place::Training; n];
    for i in 0..n {
        if let Some(l) = level[i] {
            place[i] = Place::Stage(renumber[l]);
        } else if data_side_needs[i] || table_inits.contains(&i) {
            place[i] = Place::Shared;
        }
    }
    // Initializer inputs (keys, values, file names) are shared too.
    for &init in &table_inits {
        for t in &graph.inputs[init] {
            let mut stack = vec![t.node];
            while let Some(s) = stack.pop() {
                if place[s] == Place::Training && !training[s] {
                    place[s] = Place::Shared;
                    stack.extend(graph.inputs[s].iter().map(|t| t.node));
                    stack.extend(graph.controls[s].iter().copied());
                }
            }
        }
    }
    for &s in &state {
        if place[s] != Place::Training {
            return Err(Error::Unplaceable {
                nodes: vec![graph.node(s).name.to_owned()],
                reason: "a model variable ended up on the data side".into(),
            });
        }
    }
    Ok(Partition {
        place,
        stage_devices,
        training_region: training.iter().filter(|&&t| t).count(),
        state,
        table_inits,
        pulled,
        kernel_cut,
        topo_rank,
        order,
    })
}

/// Marks `roots` and every node reachable from them through consumers that pass `allow`.
fn forward_closure(graph: &Graph, roots: &[NodeId], allow: impl Fn(NodeId) -> bool) -> Vec<bool> {
    let mut seen = vec![false; graph.len()];
    let mut queue: VecDeque<NodeId> = VecDeque::new();
    for &r in roots {
        if !seen[r] && allow(r) {
            seen[r] = true;
            queue.push_back(r);
        }
    }
    while let Some(id) = queue.pop_front() {
        for &c in &graph.consumers[id] {
            if !seen[c] && allow(c) {
                seen[c] = true;
                queue.push_back(c);
            }
        }
    }
    seen
}

/// Marks every node that a marked node needs (data and control inputs, transitively).
pub fn backward_closure(graph: &Graph, marked: &[bool]) -> Vec<bool> {
    let mut seen = marked.to_vec();
    let mut stack: Vec<NodeId> = (0..graph.len()).filter(|&i| marked[i]).collect();
    while let Some(id) = stack.pop() {
        let sources = graph.inputs[id]
            .iter()
            .map(|t| t.node)
            .chain(graph.controls[id].iter().copied());
        for s in sources {
            if !seen[s] {
                seen[s] = true;
                stack.push(s);
            }
        }
    }
    seen
}
