//! The kernel-aware cut (DESIGN.md invariant 7: every plan runs).
//!
//! The data worker runs only the ops it has kernels for; the binary passes that knowledge in
//! as a predicate ([`KernelCheck`], `Options::kernels`), so that this crate never depends on
//! the data worker's. A data-side node the worker cannot run stays in training, and so does
//! every data-side node that depends on it; the crossing edges move with them (the training
//! graph then receives the kept node's inputs).
//!
//! A data-side node cannot run when
//! - its op has no kernel;
//! - a function it calls (a `func` attribute, e.g. a dataset map function, transitively) holds
//!   a node whose op has none, as the stage's copy of the library would;
//! - it reads an input-independent node (copied into the stage, folded at load) that cannot run,
//!   for one of these reasons.
//!
//! Keeping a node in training can leave a data-side node whose output no plain tensor could
//! carry (`DT_VARIANT`, `DT_RESOURCE`) feeding it; that producer stays in training too, until
//! only plain tensors cross.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use lode_proto::attr::NodeAttrs;
use lode_proto::ops::is_plain;
use lode_proto::view;

use crate::graph::{Graph, NodeId};

/// Whether the data worker runs an op (a stage graph's node of that op).
pub type KernelCheck = fn(&str) -> bool;

/// The ops of a stage graph (and of the functions it reaches) that the data worker has no
/// kernel for, each with the nodes that use it.
pub type MissingKernels = fn(&lode_proto::tf::graph::GraphDef) -> BTreeMap<String, Vec<String>>;

/// Checks every stage graph of `decoupled` with `missing`, records what is missing in each
/// stage of the plan (`missing_kernels`) and as a section of the report; returns how many
/// distinct ops are missing.
pub fn record_missing(
    decoupled: &mut crate::Decoupled,
    missing: MissingKernels,
) -> crate::Result<usize> {
    use std::fmt::Write as _;
    let mut all = BTreeSet::new();
    let mut section = String::from("\ndata-worker kernels\n");
    for stage in &mut decoupled.plan.stages {
        let Some((_, bytes)) = decoupled
            .graphs
            .iter()
            .find(|(name, _)| *name == stage.graph)
        else {
            continue;
        };
        let graph: lode_proto::tf::graph::GraphDef =
            lode_proto::io::decode_binary(bytes).map_err(|e| crate::Error::InvalidGraph {
                reason: format!("{}: cannot read back the stage graph: {e}", stage.graph),
            })?;
        stage.missing_kernels = missing(&graph);
        // Writing to a String cannot fail.
        if stage.missing_kernels.is_empty() {
            let _ = writeln!(section, "  stage {}: every op has a kernel", stage.index);
        }
        for (op, nodes) in &stage.missing_kernels {
            all.insert(op.clone());
            let shown: Vec<&str> = nodes.iter().take(3).map(String::as_str).collect();
            let more = nodes.len().saturating_sub(3);
            let _ = writeln!(
                section,
                "  stage {}: NO KERNEL for {op}: {}{}",
                stage.index,
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
        }
    }
    if !decoupled.plan.stages.is_empty() {
        decoupled.report.push_str(&section);
    }
    Ok(all.len())
}

/// The deepest chain of function calls the cut follows.
pub const MAX_CALL_DEPTH: usize = 64;

/// What a chain of calls deeper than [`MAX_CALL_DEPTH`] is reported as.
pub const TOO_DEEP: &str = "(function calls nested too deep)";

/// An op that kept data-side nodes in training.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLimit {
    pub op: String,
    /// Data-side nodes that need the op: they use it, call a function that uses it, or read an
    /// input-independent node that needs it.
    pub users: Vec<NodeId>,
    /// Nodes kept in training because of this op alone (its users and what depends on them);
    /// a node that needs several missing ops counts under each.
    pub kept: usize,
}

/// What the kernel-aware cut changed.
#[derive(Debug, Clone, Default)]
pub struct KernelCut {
    /// Ops that limited the cut, by op name.
    pub limits: Vec<KernelLimit>,
    /// Data-side (input-dependent) nodes before the cut was limited.
    pub data_side_before: usize,
    /// Nodes kept in training, all ops together.
    pub kept: usize,
}

/// Missing ops of each function of the library, memoized (a recursive library is cut short).
struct Functions<'g, 'a> {
    graph: &'g Graph<'a>,
    runs: KernelCheck,
    memo: HashMap<String, BTreeSet<String>>,
}

impl Functions<'_, '_> {
    /// Ops without a kernel in function `name` and every function it reaches; calls nested
    /// deeper than [`MAX_CALL_DEPTH`] count as one missing "op" (a hostile library cannot
    /// exhaust the stack, and the worker would not run such a chain anyway).
    fn missing(&mut self, name: &str, depth: usize) -> BTreeSet<String> {
        if let Some(m) = self.memo.get(name) {
            return m.clone();
        }
        if depth > MAX_CALL_DEPTH {
            return BTreeSet::from([TOO_DEEP.to_owned()]);
        }
        // A recursive call sees what is known so far (nothing): the outer call collects it.
        self.memo.insert(name.to_owned(), BTreeSet::new());
        let mut out = BTreeSet::new();
        let Some(f) = self.graph.library.get(name).copied() else {
            return out;
        };
        let mut called: Vec<String> = Vec::new();
        for node in &f.node_def {
            let is_function = self.graph.library.contains_key(node.op.as_str());
            if is_function {
                called.push(node.op.clone());
            } else if !(self.runs)(&node.op) {
                out.insert(node.op.clone());
            }
            called.extend(
                node.referenced_functions()
                    .into_iter()
                    .map(|(_, f)| f.to_owned()),
            );
        }
        for value in f.attr.values() {
            if let Some(lode_proto::tf::attr_value::attr_value::Value::Func(func)) = &value.value {
                called.push(func.name.clone());
            }
        }
        for callee in called {
            out.extend(self.missing(&callee, depth + 1));
        }
        self.memo.insert(name.to_owned(), out.clone());
        out
    }

    /// Ops without a kernel that a graph node needs itself: its op, the functions it calls.
    fn of_node(&mut self, id: NodeId) -> BTreeSet<String> {
        let node = self.graph.node(id);
        let mut out = BTreeSet::new();
        if !(self.runs)(node.op) {
            out.insert(node.op.to_owned());
        }
        if self.graph.library.contains_key(node.op) {
            out.extend(self.missing(node.op, 0));
        }
        for (_, bytes) in &node.attrs {
            for f in view::attr::functions(bytes) {
                out.extend(self.missing(f, 0));
            }
        }
        out
    }
}

/// Moves the data-side nodes the worker cannot run (and their data-side dependents) out of
/// `dependent`; `training` marks the region downstream of model state, `order` is a
/// topological order of the graph.
pub fn limit(
    graph: &Graph,
    dependent: &mut [bool],
    training: &[bool],
    order: &[NodeId],
    runs: KernelCheck,
) -> KernelCut {
    let mut functions = Functions {
        graph,
        runs,
        memo: HashMap::new(),
    };
    // Input-independent nodes outside training: what they need, with their own inputs (in
    // topological order, so inputs are done first). Training nodes never feed the data side.
    let mut shared: HashMap<NodeId, BTreeSet<String>> = HashMap::new();
    let sources = |id: NodeId| {
        graph.inputs[id]
            .iter()
            .map(|t| t.node)
            .chain(graph.controls[id].iter().copied())
            .collect::<Vec<_>>()
    };
    let mut causes: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
    for &id in order {
        if training[id] {
            continue;
        }
        let mut need = functions.of_node(id);
        for s in sources(id) {
            if !dependent[s] {
                if let Some(m) = shared.get(&s) {
                    need.extend(m.iter().cloned());
                }
            }
        }
        if dependent[id] {
            for op in need {
                causes.entry(op).or_default().push(id);
            }
        } else if !need.is_empty() {
            shared.insert(id, need);
        }
    }
    let data_side_before = dependent.iter().filter(|&&d| d).count();
    let mut limits = Vec::new();
    let mut all_roots = Vec::new();
    for (op, users) in causes {
        let kept = spread(graph, dependent, &users)
            .iter()
            .filter(|&&k| k)
            .count();
        all_roots.extend(users.iter().copied());
        limits.push(KernelLimit { op, users, kept });
    }
    let kept = spread(graph, dependent, &all_roots);
    for (d, k) in dependent.iter_mut().zip(&kept) {
        if *k {
            *d = false;
        }
    }
    KernelCut {
        limits,
        data_side_before,
        kept: kept.iter().filter(|&&k| k).count(),
    }
}

/// The data-side nodes that stay in training when `roots` do: their data-side consumers,
/// transitively, and the data-side producers of any non-plain tensor a kept node reads.
fn spread(graph: &Graph, dependent: &[bool], roots: &[NodeId]) -> Vec<bool> {
    let mut kept = vec![false; graph.len()];
    let mut stack = roots.to_vec();
    while let Some(id) = stack.pop() {
        if kept[id] || !dependent[id] {
            continue;
        }
        kept[id] = true;
        stack.extend(
            graph.consumers[id]
                .iter()
                .copied()
                .filter(|&c| dependent[c] && !kept[c]),
        );
        stack.extend(
            graph.inputs[id]
                .iter()
                .filter(|t| dependent[t.node] && !kept[t.node] && !is_plain(graph.dtype(**t)))
                .map(|t| t.node),
        );
    }
    kept
}
