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

use crate::rewrite::LODE_SCOPE;

/// Ops the dispatcher's index batches stand for.
const INDEX_OPS: &[&str] = &[
    "RepeatDataset",
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2",
    "SkipDataset",
    "TakeDataset",
];

/// Ops that read files (or name them); everything from the chain's start up to the last of
/// these is the reader.
const READER_OPS: &[&str] = &[
    "TensorSliceDataset",
    "TensorDataset",
    "TFRecordDataset",
    "TFRecordDatasetV2",
    "TextLineDataset",
    "TextLineDatasetV2",
    "FixedLengthRecordDatasetV2",
    "FlatMapDataset",
    "InterleaveDataset",
    "ParallelInterleaveDatasetV4",
];

#[derive(Debug, Default)]
pub struct SourceRewrite {
    pub node: String,
    pub removed: Vec<String>,
}

fn base(input: &str) -> &str {
    input
        .trim_start_matches('^')
        .split(':')
        .next()
        .unwrap_or(input)
}

/// Rewrites `nodes` in place when they hold a `MakeIterator` and its dataset chain.
pub fn index_fed_source(
    nodes: &mut Vec<NodeDef>,
    reader: &str,
    compression: &str,
) -> Option<SourceRewrite> {
    let by_name: HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    let make = nodes.iter().position(|n| n.op == "MakeIterator")?;
    // The chain, from the iterator back to the source.
    let mut chain = Vec::new();
    let mut current = nodes[make].input.first().map(|i| base(i).to_owned());
    while let Some(name) = current {
        let &id = by_name.get(&name)?;
        if !nodes[id].op.contains("Dataset") {
            break;
        }
        chain.push(id);
        current = nodes[id].input.first().map(|i| base(i).to_owned());
    }
    chain.reverse(); // source first
    let last_reader = chain
        .iter()
        .rposition(|&id| READER_OPS.contains(&nodes[id].op.as_str()))?;
    let mut removed: HashSet<usize> = chain[..=last_reader].iter().copied().collect();
    removed.extend(
        chain
            .iter()
            .copied()
            .filter(|&id| INDEX_OPS.contains(&nodes[id].op.as_str())),
    );

    let record_node = &nodes[chain[last_reader]];
    let mut source = NodeDef::new();
    source.name = format!("{LODE_SCOPE}/DWSource");
    source.op = "DWSource".into();
    source.device = record_node.device.clone();
    for key in ["output_types", "output_shapes"] {
        if let Some(v) = record_node.attr.get(key) {
            source.attr.insert(key.into(), v.clone());
        }
    }
    let mut text = |key: &str, value: &str| {
        let mut a = AttrValue::new();
        a.set_s(value.as_bytes().to_vec());
        source.attr.insert(key.into(), a);
    };
    text("reader", reader);
    text("compression", compression);

    // Rewire each kept chain op (and MakeIterator) to the nearest kept op upstream.
    let mut upstream = source.name.clone();
    for &id in &chain {
        if removed.contains(&id) {
            continue;
        }
        if let Some(first) = nodes[id].input.first_mut() {
            *first = upstream.clone();
        }
        upstream = nodes[id].name.clone();
    }
    if let Some(first) = nodes[make].input.first_mut() {
        *first = upstream;
    }

    // Drop the removed ops, then whatever only they used (their constants), transitively.
    let mut dead: HashSet<String> = removed.iter().map(|&id| nodes[id].name.clone()).collect();
    loop {
        let mut used: HashSet<&str> = HashSet::new();
        for n in nodes.iter().filter(|n| !dead.contains(&n.name)) {
            used.extend(n.input.iter().map(|i| base(i)));
        }
        let more: Vec<String> = nodes
            .iter()
            .filter(|n| !dead.contains(&n.name) && !used.contains(n.name.as_str()))
            .filter(|n| {
                // Only nodes that fed the removed ops, never a stage's real outputs.
                matches!(n.op.as_str(), "Const" | "Identity" | "Reshape")
                    && nodes.iter().any(|m| {
                        dead.contains(&m.name) && m.input.iter().any(|i| base(i) == n.name)
                    })
            })
            .map(|n| n.name.clone())
            .collect();
        if more.is_empty() {
            break;
        }
        dead.extend(more);
    }
    let mut removed_names: Vec<String> = dead.iter().cloned().collect();
    removed_names.sort();
    nodes.retain(|n| !dead.contains(&n.name));
    nodes.push(source);
    Some(SourceRewrite {
        node: format!("{LODE_SCOPE}/DWSource"),
        removed: removed_names,
    })
}
