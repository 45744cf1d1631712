//! lode-decoupler: cuts a TensorFlow training graph into a training-worker graph and
//! data-worker stage graphs (GoldMiner §3.2, Algorithm 1, made safe for real graphs).
//!
//! # Layout
//! - `one_shot`: the first pass: one-shot iterators made initializable (factory inlined).
//! - `graph`: an indexed view of a GraphDef (edges both ways, output dtypes from TensorFlow's
//!   op registry).
//! - `coverage`: per construct graph, whether the kernel-aware cut keeps its whole data side
//!   on the data worker (`lode kernels --coverage`).
//! - `inspect`: what a model holds (`lode inspect`): signatures, variables, iterators and the
//!   input pipeline traced into the function library.
//! - `kernels`: the kernel-aware cut: data-side nodes the data worker cannot run stay in
//!   training; `record_missing` records in a plan what its stages lack (the knowledge of
//!   kernels comes in as functions, from the binary).
//! - [`decouple_file`] cuts a graph file (and records missing kernels); [`decouple`] is the
//!   pipeline of passes over a parsed graph, with no I/O.
//! - `partition`: the cut: model state, training region, data region, shared nodes, stages.
//! - `rewrite`: stage and training GraphDefs with fused DWSend / DWRecv nodes and stand-ins.
//! - `shapes`: static shapes of data-side tensors (exact rules only).
//! - `fold`: exact constant folding of dataset ops' scalar arguments (seeds, sizes, counts).
//! - `source`: the input pipeline's description for the dispatcher: the reader, and the index
//!   ops (skip, take, repeat, shuffle, batch) in program order with their folded arguments.
//! - `source_rewrite`: the stage's reader replaced by an index-fed `DWSource`.
//! - `plan`: plan.json, report.txt, partition.dot, and the atomic plan-directory writer.
//! - `string_handle`: `from_string_handle` iterators resolved to the graph's one iterator.
//!
//! # Invariants
//! - Cover: every original node is in exactly one stage or the training graph, or is a shared
//!   (input-independent) node copied into the graphs that need it, or is one of the nodes the
//!   index-fed source replaced (`source.replaced`: the reader, the index ops and what fed only
//!   them). Other names in the graphs are Lode's own (`lode/…`) or nodes `one_shot` added
//!   (plan.json lists them in `inlined`).
//! - A pipeline whose order Lode cannot reproduce on indices is refused, naming the op.
//! - No stage holds a model variable or anything downstream of one.
//! - With `Options::kernels`, every stage node (and every function it calls) has a kernel: the
//!   plan always runs.
//! - Only plain tensors cross (no DT_VARIANT, DT_RESOURCE or reference types).
//! - Every name of the original graph that stays meaningful for the training program resolves
//!   in the training graph.

pub mod coverage;
pub mod error;
pub mod fold;
pub mod graph;
pub mod inspect;
pub mod kernels;
pub mod one_shot;
pub mod partition;
pub mod plan;
pub mod rewrite;
pub mod shapes;
pub mod source;
pub mod source_rewrite;
pub mod string_handle;

/// NodeDef builders shared by the unit tests.
#[cfg(test)]
pub(crate) mod test_graphs {
    use lode_proto::tf::node_def::NodeDef;

    /// A node of `op` named `name` reading `inputs` (`node`, `node:1`, `^node`).
    pub(crate) fn node(name: &str, op: &str, inputs: &[&str]) -> NodeDef {
        let mut n = NodeDef::new();
        n.name = name.into();
        n.op = op.into();
        n.input = inputs.iter().map(|s| (*s).to_owned()).collect();
        n
    }
}

pub use error::{Error, Result};
pub use partition::Options;

use lode_proto::view::GraphView;

/// Everything `lode partition` produces, in memory: the encoded graphs and the texts.
#[derive(Debug)]
pub struct Decoupled {
    /// `training.pb` then `stage_<i>.pb`, as (file name, binary GraphDef).
    pub graphs: Vec<(String, Vec<u8>)>,
    pub plan: plan::Plan,
    pub report: String,
    pub dot: String,
}

/// Partitions the binary GraphDef `bytes` read from `path` into a plan whose data paths
/// resolve against `data_root`, then records in the plan and report which ops of its stages
/// have no data-worker kernel (`missing`, see [`kernels::record_missing`]). Returns the
/// result and how many distinct ops have none. Errors name `path`.
pub fn decouple_file(
    path: &std::path::Path,
    bytes: &[u8],
    options: &Options,
    data_root: &std::path::Path,
    missing: kernels::MissingKernels,
) -> Result<(Decoupled, usize)> {
    let in_file = |source: Error| Error::InFile {
        path: path.to_owned(),
        source: Box::new(source),
    };
    let view = GraphView::parse(bytes).map_err(|e| {
        in_file(Error::InvalidGraph {
            reason: format!("not a valid binary GraphDef: {e}"),
        })
    })?;
    lode_proto::io::warn_if_unversioned(path, view.versions.is_some());
    let mut decoupled = decouple(&view, options).map_err(in_file)?;
    decoupled.plan.data_root = Some(data_root.display().to_string());
    let count = kernels::record_missing(&mut decoupled, missing).map_err(in_file)?;
    Ok((decoupled, count))
}

/// Partitions a graph and builds the plan (no I/O).
pub fn decouple(def: &GraphView, options: &Options) -> Result<Decoupled> {
    let normalized = one_shot::normalize(def)?;
    let view;
    let def = match &normalized {
        Some(n) => {
            view = GraphView::parse(&n.bytes).map_err(|e| Error::InvalidGraph {
                reason: format!("the graph with its one-shot iterators inlined: {e}"),
            })?;
            &view
        }
        None => def,
    };
    let handled = string_handle::normalize(def)?;
    let handled_view;
    let def = match &handled {
        Some(bytes) => {
            handled_view = GraphView::parse(bytes).map_err(|e| Error::InvalidGraph {
                reason: format!("the graph with its handle iterators resolved: {e}"),
            })?;
            &handled_view
        }
        None => def,
    };
    let graph = graph::Graph::new(def)?;
    let part = partition::partition(&graph, options)?;
    let source = source::describe(&graph);
    if let Some(bad) = source.as_ref().and_then(|s| s.unsupported.clone()) {
        return Err(Error::UnsupportedPipeline {
            node: bad.node,
            op: bad.op,
            reason: bad.reason,
        });
    }
    let source_plan = source
        .as_ref()
        .filter(|s| !s.reader.is_empty())
        .and_then(|s| source_rewrite::plan(&graph, &part, &s.reader, &s.compression));
    let rewritten = rewrite::rewrite(&graph, &part, source_plan)?;
    let mut plan = plan::build(&graph, &part, &rewritten, source, options.simple);
    plan.inlined = normalized
        .as_ref()
        .map(|n| n.iterators.clone())
        .unwrap_or_default();
    let mut report = plan::report(&graph, &part, &rewritten, &plan);
    report.push_str(&one_shot::report(&plan.inlined));
    let dot = plan::dot(&graph, &part);
    let mut graphs = vec![("training.pb".to_owned(), rewritten.training.encode(&graph)?)];
    for (i, stage) in rewritten.stages.iter().enumerate() {
        graphs.push((format!("stage_{i}.pb"), stage.graph.encode(&graph)?));
    }
    Ok(Decoupled {
        graphs,
        plan,
        report,
        dot,
    })
}
