//! plan.json, report.txt and partition.dot, and writing a plan directory atomically.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::partition::{Partition, Place};
use crate::rewrite::{self, Rewritten};
use crate::source::Source;

pub use lode_proto::plan::{
    Plan, RecvPlan, SendPlan, SendTensor, StagePlan, Summary, TrainingPlan, PLAN_VERSION,
};

fn recv_plans(specs: &[rewrite::RecvSpec]) -> Vec<RecvPlan> {
    specs
        .iter()
        .map(|r| RecvPlan {
            node: r.node.clone(),
            from_stage: r.from_stage,
            tensors: r.tensors.clone(),
        })
        .collect()
}

pub fn build(
    graph: &Graph,
    part: &Partition,
    out: &Rewritten,
    mut source: Option<Source>,
    simple: bool,
) -> Plan {
    if let (Some(source), Some(rewrite)) = (source.as_mut(), out.source_rewrite.as_ref()) {
        source.replaced_by = Some(rewrite.node.clone());
        source.replaced = rewrite.removed.clone();
    }
    let stages: Vec<StagePlan> = out
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| StagePlan {
            index: i,
            device: part.stage_devices[i].name().into(),
            graph: format!("stage_{i}.pb"),
            nodes: rewrite::stage_names(graph, s),
            recv: recv_plans(&s.recv),
            missing_kernels: Default::default(),
            send: SendPlan {
                node: s.send_node.clone(),
                tensors: s
                    .sends
                    .iter()
                    .map(|c| SendTensor {
                        tensor: graph.tensor_name(c.tensor),
                        dtype: format!("{:?}", c.dtype),
                        shape: c
                            .shape
                            .as_ref()
                            .filter(|s| !s.unknown_rank)
                            .map(|s| s.dim.iter().map(|d| d.size).collect()),
                        bytes: rewrite::static_bytes(c),
                    })
                    .collect(),
            },
        })
        .collect();
    let data_nodes = part
        .place
        .iter()
        .filter(|p| matches!(p, Place::Stage(_)))
        .count();
    let shared_nodes = part
        .place
        .iter()
        .filter(|p| matches!(p, Place::Shared))
        .count();
    Plan {
        version: PLAN_VERSION,
        simple,
        data_root: None,
        training: TrainingPlan {
            graph: "training.pb".into(),
            recv: recv_plans(&out.training_recv),
        },
        summary: Summary {
            nodes: graph.len(),
            state: part.state.len(),
            training_region: part.training_region,
            training_graph_nodes: out.training.len(),
            data_nodes,
            shared_nodes,
            crossing_tensors: stages.iter().map(|s| s.send.tensors.len()).sum(),
            dropped_colocations: out.dropped_colocations,
        },
        stages,
        copied: out
            .copied
            .iter()
            .map(|&i| graph.node(i).name.to_owned())
            .collect(),
        stubs: out
            .stubs
            .iter()
            .map(|(name, what)| (name.clone(), (*what).to_owned()))
            .collect(),
        source,
        inlined: Vec::new(),
        kernel_limits: kernel_limits(graph, part),
    }
}

fn kernel_limits(graph: &Graph, part: &Partition) -> Vec<lode_proto::plan::KernelLimit> {
    let cut = &part.kernel_cut;
    cut.limits
        .iter()
        .map(|l| lode_proto::plan::KernelLimit {
            op: l.op.clone(),
            nodes: l
                .users
                .iter()
                .map(|&i| graph.node(i).name.to_owned())
                .collect(),
            kept_in_training: l.kept,
            share_of_data_side: share(l.kept, cut.data_side_before),
        })
        .collect()
}

/// `part / whole`, 0 for an empty whole.
fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    // Node counts are far below 2^52: exact as f64.
    #[allow(clippy::cast_precision_loss)]
    let ratio = part as f64 / whole as f64;
    ratio
}

pub fn report(graph: &Graph, part: &Partition, out: &Rewritten, plan: &Plan) -> String {
    let mut r = String::new();
    let s = &plan.summary;
    let _ = writeln!(
        r,
        "Lode partition report ({})",
        if plan.simple {
            "simple cut at IteratorGetNext"
        } else {
            "full cut"
        }
    );
    let _ = writeln!(r);
    let _ = writeln!(r, "nodes                     {}", s.nodes);
    let _ = writeln!(r, "model state (variables)   {}", s.state);
    let _ = writeln!(r, "training region T         {}", s.training_region);
    let _ = writeln!(r, "data-side nodes           {}", s.data_nodes);
    let _ = writeln!(
        r,
        "shared (copied) nodes     {} ({} in several graphs)",
        s.shared_nodes,
        plan.copied.len()
    );
    let _ = writeln!(r, "training graph nodes      {}", s.training_graph_nodes);
    let _ = writeln!(r, "stages                    {}", plan.stages.len());
    let _ = writeln!(r, "crossing tensors          {}", s.crossing_tensors);
    if s.dropped_colocations > 0 {
        let _ = writeln!(
            r,
            "colocations dropped       {} (their target is in another graph)",
            s.dropped_colocations
        );
    }
    if !part.pulled.is_empty() {
        let _ = writeln!(
            r,
            "pulled to the data side   {} (so that no variant or resource crosses)",
            part.pulled.len()
        );
    }
    kernel_section(&mut r, part, plan);
    for (stage, st) in plan.stages.iter().zip(&out.stages) {
        let _ = writeln!(r);
        let _ = writeln!(
            r,
            "stage {} ({}): {} nodes, {} graph nodes",
            stage.index,
            stage.device,
            stage.nodes.len(),
            st.graph.len()
        );
        for (op, count) in rewrite::op_histogram(graph, &st.nodes) {
            let _ = writeln!(r, "  {count:>5}  {op}");
        }
        let total: Option<u64> = stage.send.tensors.iter().map(|t| t.bytes).sum();
        let _ = writeln!(
            r,
            "  sends {} tensors{}",
            stage.send.tensors.len(),
            total
                .map(|b| format!(", {b} bytes per step"))
                .unwrap_or_else(|| ", bytes per step unknown (some shapes are dynamic)".into())
        );
        const LISTED: usize = 200;
        if stage.send.tensors.len() > LISTED {
            let _ = writeln!(
                r,
                "    (the first {LISTED}; plan.json lists all {})",
                stage.send.tensors.len()
            );
        }
        for t in stage.send.tensors.iter().take(LISTED) {
            let shape = t
                .shape
                .as_ref()
                .map(|d| format!("{d:?}"))
                .unwrap_or_else(|| "?".into());
            let bytes = t
                .bytes
                .map(|b| format!("{b} B"))
                .unwrap_or_else(|| "? B".into());
            let _ = writeln!(r, "    {}  {} {shape}  {bytes}", t.tensor, t.dtype);
        }
    }
    if !plan.stubs.is_empty() {
        let _ = writeln!(r);
        let _ = writeln!(
            r,
            "training-graph stand-ins (names the program runs keep resolving):"
        );
        for (name, what) in &plan.stubs {
            let _ = writeln!(r, "  {name}: {what}");
        }
    }
    r
}

/// Which ops limited the cut, and what each kept in training.
fn kernel_section(r: &mut String, part: &Partition, plan: &Plan) {
    if plan.kernel_limits.is_empty() {
        return;
    }
    let cut = &part.kernel_cut;
    let _ = writeln!(r);
    let _ = writeln!(
        r,
        "ops without a data-worker kernel limited the cut: {} of {} data-side nodes ({:.1}%) stay in training",
        cut.kept,
        cut.data_side_before,
        100.0 * share(cut.kept, cut.data_side_before)
    );
    for limit in &plan.kernel_limits {
        let shown: Vec<&str> = limit.nodes.iter().take(3).map(String::as_str).collect();
        let more = limit.nodes.len().saturating_sub(3);
        let _ = writeln!(
            r,
            "  {}: {} node(s) ({:.1}%) kept; needed by {}{}",
            limit.op,
            limit.kept_in_training,
            100.0 * limit.share_of_data_side,
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    if plan.kernel_limits.len() > 1 {
        let _ = writeln!(
            r,
            "  (a node that needs several of these ops counts under each)"
        );
    }
}

/// Graphs above this many nodes get a region-level DOT: a drawing of a million nodes helps
/// no one, and writing it costs more than the partition itself.
pub const DOT_NODE_LIMIT: usize = 20_000;

pub fn dot(graph: &Graph, part: &Partition) -> String {
    if graph.len() > DOT_NODE_LIMIT {
        return summary_dot(graph, part);
    }
    let mut d = String::from(
        "digraph partition {\n  rankdir=LR;\n  node [shape=box, style=filled, fontsize=9];\n",
    );
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    for s in 0..part.stage_count() {
        let _ = writeln!(
            d,
            "  subgraph cluster_stage_{s} {{\n    label=\"stage {s} ({})\";",
            part.stage_devices[s].name()
        );
        for i in (0..graph.len()).filter(|&i| part.place[i] == Place::Stage(s)) {
            let _ = writeln!(
                d,
                "    \"{}\" [fillcolor=\"#9ecae1\", label=\"{}\\n{}\"];",
                quote(graph.node(i).name),
                quote(graph.node(i).name),
                graph.node(i).op
            );
        }
        d.push_str("  }\n");
    }
    let state: std::collections::HashSet<usize> = part.state.iter().copied().collect();
    for i in 0..graph.len() {
        let color = match part.place[i] {
            Place::Stage(_) => continue,
            Place::Shared => "#c7e9c0",
            Place::Training if state.contains(&i) => "#fb6a4a",
            Place::Training => "#fdd0a2",
        };
        let _ = writeln!(
            d,
            "  \"{}\" [fillcolor=\"{color}\", label=\"{}\\n{}\"];",
            quote(graph.node(i).name),
            quote(graph.node(i).name),
            graph.node(i).op
        );
    }
    for i in 0..graph.len() {
        for t in &graph.inputs[i] {
            let _ = writeln!(
                d,
                "  \"{}\" -> \"{}\";",
                quote(graph.node(t.node).name),
                quote(graph.node(i).name)
            );
        }
        for &c in &graph.controls[i] {
            let _ = writeln!(
                d,
                "  \"{}\" -> \"{}\" [style=dashed];",
                quote(graph.node(c).name),
                quote(graph.node(i).name)
            );
        }
    }
    d.push_str("}\n");
    d
}

/// One box per region (shared, each stage, training) with node counts, and edges labelled
/// with the number of edges between regions.
fn summary_dot(graph: &Graph, part: &Partition) -> String {
    // Regions: 0 shared, 1 training, 2 + s stage s.
    let region = |p: Place| match p {
        Place::Shared => 0,
        Place::Training => 1,
        Place::Stage(s) => 2 + s,
    };
    let label = |r: usize| match r {
        0 => "shared (copied)".to_owned(),
        1 => "training".to_owned(),
        s => format!("stage {} ({})", s - 2, part.stage_devices[s - 2].name()),
    };
    let regions = 2 + part.stage_count();
    let mut counts = vec![0usize; regions];
    let mut edges = vec![0usize; regions * regions];
    for i in 0..graph.len() {
        let to = region(part.place[i]);
        counts[to] += 1;
        for t in &graph.inputs[i] {
            let from = region(part.place[t.node]);
            if from != to {
                edges[from * regions + to] += 1;
            }
        }
    }
    let mut d = format!(
        "digraph partition {{\n  label=\"{} nodes: more than {DOT_NODE_LIMIT}, so regions only\";\n  node [shape=box, style=filled];\n",
        graph.len()
    );
    for (r, &n) in counts.iter().enumerate().filter(|(_, &n)| n > 0) {
        let color = match r {
            0 => "#c7e9c0",
            1 => "#fdd0a2",
            _ => "#9ecae1",
        };
        let _ = writeln!(
            d,
            "  r{r} [fillcolor=\"{color}\", label=\"{}\\n{n} nodes\"];",
            label(r)
        );
    }
    for from in 0..regions {
        for to in 0..regions {
            let n = edges[from * regions + to];
            if n > 0 {
                let _ = writeln!(d, "  r{from} -> r{to} [label=\"{n} edges\"];");
            }
        }
    }
    d.push_str("}\n");
    d
}

/// Writes the plan directory: everything goes to a temporary sibling first, which is renamed
/// into place only when complete, so a failed run leaves no partial directory.
pub fn write_dir(
    dir: &Path,
    graphs: &[(String, Vec<u8>)],
    plan: &Plan,
    report: &str,
    dot: &str,
) -> Result<()> {
    let json = serde_json::to_vec_pretty(plan).map_err(|e| Error::Output {
        path: dir.join("plan.json"),
        reason: e.to_string(),
    })?;
    let mut files: Vec<(&str, &[u8])> = graphs
        .iter()
        .map(|(file, bytes)| (file.as_str(), bytes.as_slice()))
        .collect();
    files.push(("plan.json", &json));
    files.push(("report.txt", report.as_bytes()));
    files.push(("partition.dot", dot.as_bytes()));
    Ok(lode_proto::plan::write_dir(dir, &files)?)
}
