//! lode-decoupler: cuts a TensorFlow training graph into a training-worker graph and
//! data-worker stage graphs (GoldMiner §3.2, Algorithm 1, made safe for real graphs).
//!
//! # Layout
//! - `graph`: an indexed view of a GraphDef (edges both ways, output dtypes from TensorFlow's
//!   op registry).
//! - `kernels`: the kernel-aware cut: data-side nodes the data worker cannot run stay in
//!   training.
//! - `partition`: the cut: model state, training region, data region, shared nodes, stages.
//! - `rewrite`: stage and training GraphDefs with fused DWSend / DWRecv nodes and stand-ins.
//! - `shapes`: static shapes of data-side tensors (exact rules only).
//! - `source`: the input pipeline's description for the dispatcher.
//! - `source_rewrite`: the stage's reader replaced by an index-fed `DWSource`.
//! - `plan`: plan.json, report.txt, partition.dot, and the atomic plan-directory writer.
//!
//! # Invariants
//! - Cover: every original node is in exactly one stage or the training graph, or is a shared
//!   (input-independent) node copied into the graphs that need it.
//! - No stage holds a model variable or anything downstream of one.
//! - With `Options::kernels`, every stage node (and every function it calls) has a kernel: the
//!   plan always runs.
//! - Only plain tensors cross (no DT_VARIANT, DT_RESOURCE or reference types).
//! - Every name of the original graph that stays meaningful for the training program resolves
//!   in the training graph.

pub mod error;
pub mod graph;
pub mod kernels;
pub mod partition;
pub mod plan;
pub mod rewrite;
pub mod shapes;
pub mod source;
pub mod source_rewrite;

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

/// Partitions a graph and builds the plan (no I/O).
pub fn decouple(def: &GraphView, options: &Options) -> Result<Decoupled> {
    let graph = graph::Graph::new(def)?;
    let part = partition::partition(&graph, options)?;
    let source = source::describe(&graph);
    let source_plan = source
        .as_ref()
        .filter(|s| !s.reader.is_empty())
        .and_then(|s| source_rewrite::plan(&graph, &part, &s.reader, &s.compression));
    let rewritten = rewrite::rewrite(&graph, &part, source_plan)?;
    let plan = plan::build(&graph, &part, &rewritten, source, options.simple);
    let report = plan::report(&graph, &part, &rewritten, &plan);
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
