//! The input pipeline as the dispatcher needs it: the reader and its files, and the dataset
//! transformations between the reader and the iterator, read from the dataset op chain that
//! feeds `MakeIterator` (following `FlatMapDataset` into its function for the reader).

use std::collections::HashMap;

use lode_proto::attr::NodeAttrs;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::tensor::TensorProto;
use lode_proto::tf::types::DataType;

use crate::graph::Graph;

pub use lode_proto::plan::Source;

pub fn describe(graph: &Graph) -> Option<Source> {
    let make = (0..graph.len()).find(|&i| graph.node(i).op == "MakeIterator")?;
    let mut chain = Vec::new();
    let mut current = graph.inputs[make].first().map(|t| t.node);
    while let Some(id) = current {
        if !graph.node(id).op.contains("Dataset") {
            break;
        }
        chain.push(id);
        current = graph.inputs[id].first().map(|t| t.node);
    }
    chain.reverse();
    let mut source = Source {
        batching: "none".into(),
        ..Source::default()
    };
    let mut mapped = false;
    for &id in &chain {
        let Ok(node) = graph.node(id).to_node_def() else {
            continue;
        };
        let arg = |k: usize| {
            graph.inputs[id]
                .get(k)
                .and_then(|t| const_tensor(graph, t.node))
        };
        source.chain.push(node.op.clone());
        match node.op.as_str() {
            "TFRecordDataset" | "TFRecordDatasetV2" => {
                source.reader = "tfrecord".into();
                source.files = arg(0).map(|t| strings(&t)).unwrap_or_default();
                source.compression = arg(1)
                    .map(|t| strings(&t))
                    .and_then(|s| s.into_iter().next())
                    .unwrap_or_default();
            }
            "TextLineDataset" | "TextLineDatasetV2" => {
                source.reader = "text_lines".into();
                source.files = arg(0).map(|t| strings(&t)).unwrap_or_default();
                source.compression = arg(1)
                    .map(|t| strings(&t))
                    .and_then(|s| s.into_iter().next())
                    .unwrap_or_default();
            }
            "TensorSliceDataset" => {
                source.reader = "tensor_slices".into();
                source.files = arg(0).map(|t| strings(&t)).unwrap_or_default();
            }
            "FlatMapDataset" | "InterleaveDataset" | "ParallelInterleaveDatasetV4" => {
                if let Ok(f) = node.attr_func("f") {
                    if let Some(body) = graph.library.get(f.name.as_str()) {
                        if let Some((reader, compression)) = reader_in(body) {
                            source.reader = reader;
                            source.compression = compression;
                        }
                    }
                }
            }
            "SkipDataset" => source.skip = arg(1).and_then(|t| first_int(&t)),
            "TakeDataset" => source.take = arg(1).and_then(|t| first_int(&t)),
            "RepeatDataset" => source.repeat = arg(1).and_then(|t| first_int(&t)),
            "ShuffleDataset"
            | "ShuffleDatasetV2"
            | "ShuffleDatasetV3"
            | "ShuffleAndRepeatDatasetV2" => {
                source.shuffle_buffer = arg(1).and_then(|t| first_int(&t));
                source.shuffle_seed = arg(2)
                    .and_then(|t| first_int(&t))
                    .zip(arg(3).and_then(|t| first_int(&t)));
            }
            "BatchDataset" | "BatchDatasetV2" | "PaddedBatchDatasetV2" => {
                source.batch_size = arg(1).and_then(|t| first_int(&t));
                source.drop_remainder = node
                    .op
                    .ends_with("V2")
                    .then(|| arg(2).and_then(|t| t.bool_val.first().copied()))
                    .flatten();
                source.batching = if mapped { "after_map" } else { "before_map" }.into();
            }
            op if op.contains("MapDataset") => {
                if let Ok(f) = node.attr_func("f") {
                    source.map_functions.push(f.name.clone());
                }
                mapped = true;
            }
            _ => {}
        }
    }
    Some(source)
}

/// The reader op inside a flat_map body, and its compression argument.
fn reader_in(body: &FunctionDef) -> Option<(String, String)> {
    let by_name: HashMap<&str, &NodeDef> =
        body.node_def.iter().map(|n| (n.name.as_str(), n)).collect();
    for node in &body.node_def {
        let reader = match node.op.as_str() {
            "TFRecordDataset" | "TFRecordDatasetV2" => "tfrecord",
            "TextLineDataset" | "TextLineDatasetV2" => "text_lines",
            "FixedLengthRecordDatasetV2" => "fixed_length",
            _ => continue,
        };
        let compression = node
            .input
            .get(1)
            .map(|i| i.split(':').next().unwrap_or(i))
            .and_then(|name| by_name.get(name))
            .and_then(|n| n.attr_tensor("value").ok())
            .map(strings)
            .and_then(|s| s.into_iter().next())
            .unwrap_or_default();
        return Some((reader.into(), compression));
    }
    None
}

/// The constant a node holds, looking through Identity and Reshape.
fn const_tensor(graph: &Graph, mut id: usize) -> Option<TensorProto> {
    for _ in 0..8 {
        let node = graph.node(id);
        match node.op {
            "Const" => return node.to_node_def().ok()?.attr_tensor("value").ok().cloned(),
            "Identity" | "Reshape" => id = graph.inputs[id].first()?.node,
            _ => return None,
        }
    }
    None
}

fn strings(t: &TensorProto) -> Vec<String> {
    t.string_val
        .iter()
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn first_int(t: &TensorProto) -> Option<i64> {
    match t.dtype.enum_value().ok()? {
        DataType::DT_INT64 => t.int64_val.first().copied().or_else(|| {
            t.tensor_content
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(i64::from_le_bytes)
        }),
        DataType::DT_INT32 => t.int_val.first().map(|&v| i64::from(v)),
        _ => None,
    }
}
