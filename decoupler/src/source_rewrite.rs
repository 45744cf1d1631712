//! Replaces a stage's input reader with an index-fed source.
//!
//! On a data worker, records arrive by index batch from the dispatcher: which records make
//! step s of epoch e is decided there, so shuffling, repetition, skip and take happen in the
//! index batches, and reading happens in Lode's reader. In the stage graph, the dataset chain
//! that feeds `MakeIterator` loses its reader ops (file-name slices, the reader dataset or the
//! flat_map that reads each file) and its Repeat / Shuffle / Skip / Take ops; a `DWSource`
//! node takes their place and yields the leased records in order. Map, batch and filter ops
//! stay where they were, so the per-record work runs as the program defined it.

use std::collections::{HashMap, HashSet};

use lode_proto::tf::attr_value::AttrValue;
use lode_proto::tf::node_def::NodeDef;

use crate::graph::{Graph, NodeId};
use crate::partition::{Partition, Place};
use crate::rewrite::LODE_SCOPE;
use crate::source::{INDEX_OPS, READER_OPS};

#[derive(Debug, Default)]
pub struct SourceRewrite {
    pub node: String,
    pub removed: Vec<String>,
}

/// How the stage that holds `MakeIterator` changes.
#[derive(Debug, Clone)]
pub struct SourcePlan {
    pub stage: usize,
    /// The `DWSource` node to add.
    pub node: NodeDef,
    /// Original nodes that leave the stage graph.
    pub removed: HashSet<NodeId>,
    /// New first input of the chain ops (and MakeIterator) whose upstream was removed.
    pub rewire: HashMap<NodeId, String>,
}

/// Plans the replacement for the graph's first `MakeIterator`, when it sits in a stage.
pub fn plan(
    graph: &Graph,
    part: &Partition,
    reader: &str,
    compression: &str,
) -> Option<SourcePlan> {
    let (make, chain) = crate::source::chain(graph)?;
    let Place::Stage(stage) = part.place[make] else {
        return None;
    };
    let last_reader = chain
        .iter()
        .rposition(|&id| READER_OPS.contains(&graph.node(id).op))?;
    let mut removed: HashSet<NodeId> = chain[..=last_reader].iter().copied().collect();
    removed.extend(
        chain
            .iter()
            .copied()
            .filter(|&id| INDEX_OPS.contains(&graph.node(id).op)),
    );

    let record_node = graph.node(chain[last_reader]);
    let mut node = NodeDef::new();
    node.name = format!("{LODE_SCOPE}/DWSource");
    node.op = "DWSource".into();
    node.device = record_node.device.to_owned();
    for key in ["output_types", "output_shapes"] {
        if let Some(bytes) = record_node.attr(key) {
            if let Ok(value) = lode_proto::view::decode_attr(bytes) {
                node.attr.insert(key.into(), value);
            }
        }
    }
    for (key, value) in [("reader", reader), ("compression", compression)] {
        let mut a = AttrValue::new();
        a.set_s(value.as_bytes().to_vec());
        node.attr.insert(key.into(), a);
    }

    // Each kept chain op (and MakeIterator) reads the nearest kept op upstream.
    let mut rewire = HashMap::new();
    let mut upstream = node.name.clone();
    let mut upstream_changed = true;
    for &id in &chain {
        if removed.contains(&id) {
            upstream_changed = true;
            continue;
        }
        if upstream_changed {
            rewire.insert(id, upstream.clone());
        }
        upstream = graph.node(id).name.to_owned();
        upstream_changed = false;
    }
    if upstream_changed {
        rewire.insert(make, upstream);
    }

    // Whatever fed only removed nodes goes too, transitively: file-name constants, counts, and
    // the input-independent subgraphs that compute seeds (all folded into plan.json).
    loop {
        let more: Vec<NodeId> = removed
            .iter()
            .flat_map(|&r| {
                graph.inputs[r]
                    .iter()
                    .map(|t| t.node)
                    .chain(graph.controls[r].iter().copied())
            })
            .filter(|src| !removed.contains(src))
            .filter(|&src| {
                part.place[src] == Place::Shared
                    || matches!(graph.node(src).op, "Const" | "Identity" | "Reshape")
            })
            .filter(|&src| graph.consumers[src].iter().all(|c| removed.contains(c)))
            .collect();
        if more.is_empty() {
            break;
        }
        removed.extend(more);
    }
    Some(SourcePlan {
        stage,
        node,
        removed,
        rewire,
    })
}
