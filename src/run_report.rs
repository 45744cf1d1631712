//! What `lode run` prints at its end: the cut, the workers, the rate, and whether every record
//! arrived once (the consumer's log held to the dispatcher's order).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

use anyhow::Context as _;
use lode_dispatcher::{Batches, DispatcherConfig, StepId};
use lode_proto::plan::PlanDir;
use lode_proto::tf::graph::GraphDef;
use lode_train::delivery::{check_log, Delivery};
use lode_train::emulator::ConsumeSummary;

/// The distinct ops of a stage graph, its nodes' and its functions'.
fn stage_ops(plan: &PlanDir, graph: &str) -> anyhow::Result<BTreeSet<String>> {
    let path = plan.file(graph);
    let bytes = lode_proto::io::read_limited(&path, lode_proto::io::MAX_MODEL_BYTES)?;
    let graph: GraphDef = lode_proto::io::decode_binary_file(&path, &bytes, "a stage graph")?;
    let mut ops: BTreeSet<String> = graph.node.iter().map(|n| n.op.clone()).collect();
    for f in &graph.library.function {
        ops.extend(f.node_def.iter().map(|n| n.op.clone()));
    }
    // The fused send is Lode's own, not a TensorFlow kernel.
    ops.remove("DWSend");
    ops.remove("DWRecv");
    Ok(ops)
}

/// One line: how much of the graph the data workers run, in which stages, with how many
/// distinct kernels, and how many tensors cross to the training graph.
pub fn describe_cut(plan: &PlanDir) -> anyhow::Result<String> {
    let s = &plan.plan.summary;
    let mut stages = Vec::new();
    for stage in &plan.plan.stages {
        let ops = stage_ops(plan, &stage.graph)
            .with_context(|| format!("{}: stage {}", plan.dir.display(), stage.index))?;
        stages.push(format!(
            "stage {} on {}: {} nodes, {} distinct ops",
            stage.index,
            stage.device,
            stage.nodes.len(),
            ops.len()
        ));
    }
    let simple = if plan.plan.simple { " (--simple)" } else { "" };
    Ok(format!(
        "cut{simple}: {} of the graph's {} nodes move to the data workers; {} stage(s) ({}, copied constants included); {} tensor(s) cross to the training graph",
        s.data_nodes,
        s.nodes,
        plan.plan.stages.len(),
        stages.join("; "),
        s.crossing_tensors,
    ))
}

/// The consumer's log held to the job's order.
pub fn check_delivery(log: &Path, config: &DispatcherConfig) -> anyhow::Result<Delivery> {
    let per_epoch = config.steps_per_epoch();
    let mut batches = Batches::new(config.clone());
    Ok(check_log(log, per_epoch, &mut |epoch, step| {
        batches.of(StepId::new(epoch, step)).ok()
    })?)
}

/// One line on delivery: exactly once, in order, with each epoch's share of its records; or
/// the first thing wrong.
pub fn describe_delivery(d: &Delivery, records_per_epoch: u64) -> String {
    let whole = d
        .per_epoch
        .values()
        .filter(|n| **n == records_per_epoch)
        .count();
    let mut epochs = vec![format!(
        "{whole} whole epoch(s) of {records_per_epoch} records"
    )];
    epochs.extend(
        d.per_epoch
            .iter()
            .filter(|(_, n)| **n != records_per_epoch)
            .map(|(epoch, n)| format!("{n} records of epoch {epoch}")),
    );
    match &d.problem {
        None => format!(
            "delivery: every step once and in order with the records of TensorFlow's order, no record twice in an epoch: {} records, {}",
            d.records,
            epochs.join(", ")
        ),
        Some(problem) => format!("delivery: NOT exactly once: {problem}"),
    }
}

/// The whole report, a few lines.
#[allow(clippy::too_many_arguments)]
pub fn write_report(
    out: &mut dyn Write,
    input: &Path,
    cut: &str,
    workers: usize,
    alive: usize,
    summary: &ConsumeSummary,
    delivery: &str,
    kept: &str,
) -> std::io::Result<()> {
    let rate = if summary.seconds > 0.0 {
        summary.samples as f64 / summary.seconds
    } else {
        0.0
    };
    writeln!(out, "{}", input.display())?;
    writeln!(out, "  {cut}")?;
    writeln!(
        out,
        "  workers: {workers} started, {alive} still serving at the end"
    )?;
    writeln!(
        out,
        "  consumed: {} steps, {} samples in {:.2} s ({rate:.0} samples/s)",
        summary.steps, summary.samples, summary.seconds
    )?;
    writeln!(out, "  {delivery}")?;
    writeln!(out, "  {kept}")
}
