//! The input pipeline as the dispatcher needs it: the reader and its files, and the dataset
//! transformations between the reader and the iterator, read from the dataset op chain that
//! feeds `MakeIterator` (following `FlatMapDataset` into its function for the reader).
//!
//! `Source::order` lists the ops that decide which records make each element (skip, take,
//! repeat, shuffle, batch) in program order, with their scalar arguments folded exactly
//! ([`crate::fold`]); the leading skips and takes become the reader's own `skip`/`take`. An op
//! whose effect on the order depends on the records' values, or on the files before they are
//! read, or an argument that does not fold, is recorded in `Source::unsupported` (and
//! `decouple` refuses the graph, naming it).

use std::collections::HashMap;

use lode_proto::attr::NodeAttrs;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::tensor::TensorProto;

use crate::fold::{self, Scalar};
use crate::graph::{Graph, NodeId};

pub use lode_proto::plan::{IndexOp, Source, UnsupportedOp};

/// Ops that read files (or name them, or make the records); everything from the chain's start
/// up to the last of these is the reader.
pub const READER_OPS: &[&str] = &[
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
    "RangeDataset",
];

/// Ops the dispatcher's index batches stand for: they leave the stage graph.
pub const INDEX_OPS: &[&str] = &[
    "RepeatDataset",
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2",
    "SkipDataset",
    "TakeDataset",
];

/// Ops after the reader that change no element's place: record-wise work, prefetching,
/// options. (`IgnoreErrorsDataset` right after a reader is the reader's corrupt-record policy.)
const ORDER_NEUTRAL_OPS: &[&str] = &[
    "MapDataset",
    "ParallelMapDataset",
    "ParallelMapDatasetV2",
    "PrefetchDataset",
    "ModelDataset",
    "OptimizeDataset",
    "OptimizeDatasetV2",
    "OptionsDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "ExperimentalMaxIntraOpParallelismDataset",
    "ExperimentalPrivateThreadPoolDataset",
    "AssertCardinalityDataset",
    "AssertNextDataset",
    "IgnoreErrorsDataset",
    "CacheDataset",
    "CacheDatasetV2",
];

/// The dataset chain feeding the graph's first `MakeIterator`, source first. A chain that
/// loops back on itself (only a hostile graph does) is no chain: `None`.
pub fn chain(graph: &Graph) -> Option<(NodeId, Vec<NodeId>)> {
    let make = (0..graph.len()).find(|&i| graph.node(i).op == "MakeIterator")?;
    let mut chain = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut current = graph.inputs[make].first().map(|t| t.node);
    while let Some(id) = current {
        if !graph.node(id).op.contains("Dataset") {
            break;
        }
        if !seen.insert(id) {
            return None;
        }
        chain.push(id);
        current = graph.inputs[id].first().map(|t| t.node);
    }
    chain.reverse();
    Some((make, chain))
}

/// Leading skips and takes folded into one skip then one take (-1: none / all).
#[derive(Debug, Clone, Copy)]
struct Leading {
    skip: i64,
    take: Option<i64>,
}

impl Leading {
    fn skip(&mut self, k: i64) {
        if k < 0 {
            self.take = Some(0);
            return;
        }
        self.skip = self.skip.saturating_add(k);
        if let Some(t) = &mut self.take {
            *t = t.saturating_sub(k).max(0);
        }
    }

    fn take(&mut self, k: i64) {
        if k >= 0 {
            self.take = Some(self.take.map_or(k, |t| t.min(k)));
        }
    }
}

pub fn describe(graph: &Graph) -> Option<Source> {
    let (_, chain) = chain(graph)?;
    let mut source = Source {
        batching: "none".into(),
        ..Source::default()
    };
    let reader_end = chain
        .iter()
        .rposition(|&id| READER_OPS.contains(&graph.node(id).op));
    let mut leading = Leading {
        skip: 0,
        take: None,
    };
    let mut in_leading = true;
    let mut mapped = false;
    for (pos, &id) in chain.iter().enumerate() {
        let Ok(node) = graph.node(id).to_node_def() else {
            continue;
        };
        let input = |k: usize| graph.inputs[id].get(k).copied();
        let folded = |k: usize| input(k).and_then(|t| fold::scalar(graph, t));
        let int = |k: usize| folded(k).and_then(Scalar::as_i64);
        let arg = |k: usize| input(k).and_then(|t| const_tensor(graph, t.node));
        source.chain.push(node.op.clone());
        let after_reader = reader_end.is_none_or(|r| pos > r);
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
                // Interleaving several files changes the record order unless it takes one
                // file at a time.
                let cycle = match node.op.as_str() {
                    "InterleaveDataset" => graph.inputs[id].len().checked_sub(2),
                    "ParallelInterleaveDatasetV4" => graph.inputs[id].len().checked_sub(5),
                    _ => None,
                }
                .and_then(int);
                if node.op != "FlatMapDataset" && source.files.len() > 1 && cycle != Some(1) {
                    source.unsupported.get_or_insert(UnsupportedOp {
                        node: node.name.clone(),
                        op: node.op.clone(),
                        reason: "it interleaves several files (cycle_length is not 1); Lode reads \
                                 them one after another"
                            .into(),
                    });
                }
            }
            "SkipDataset" | "TakeDataset" | "RepeatDataset" if after_reader => {
                let Some(count) = int(1) else {
                    refuse_unfolded(&mut source, &node, "count");
                    continue;
                };
                match node.op.as_str() {
                    "SkipDataset" if in_leading => leading.skip(count),
                    "TakeDataset" if in_leading => leading.take(count),
                    "SkipDataset" => source.order.push(IndexOp::Skip { count }),
                    "TakeDataset" => source.order.push(IndexOp::Take { count }),
                    _ => {
                        in_leading = false;
                        source.repeat = Some(count);
                        source.order.push(IndexOp::Repeat { count });
                    }
                }
            }
            "ShuffleDataset"
            | "ShuffleDatasetV2"
            | "ShuffleDatasetV3"
            | "ShuffleAndRepeatDataset"
            | "ShuffleAndRepeatDatasetV2"
                if after_reader =>
            {
                in_leading = false;
                let Some(shuffle) = shuffle_op(graph, id, &node) else {
                    refuse_unfolded(&mut source, &node, "buffer size or seed");
                    continue;
                };
                if let IndexOp::Shuffle {
                    buffer_size,
                    seed,
                    seed2,
                    ..
                } = shuffle
                {
                    source.shuffle_buffer.get_or_insert(buffer_size);
                    source.shuffle_seed.get_or_insert((seed, seed2));
                }
                source.order.push(shuffle);
                if node.op.starts_with("ShuffleAndRepeat") {
                    let Some(count) = int(4) else {
                        refuse_unfolded(&mut source, &node, "count");
                        continue;
                    };
                    source.repeat = Some(count);
                    source.order.push(IndexOp::Repeat { count });
                }
            }
            "BatchDataset" | "BatchDatasetV2" | "PaddedBatchDatasetV2" => {
                in_leading = false;
                let size = int(1);
                // PaddedBatchDatasetV2's drop_remainder is its last input.
                let drop_at = match node.op.as_str() {
                    "BatchDataset" => None,
                    "BatchDatasetV2" => Some(2),
                    _ => graph.inputs[id].len().checked_sub(1),
                };
                let drop = match drop_at {
                    None => Some(false),
                    Some(k) => folded(k).and_then(Scalar::as_bool),
                };
                source.batch_size = size;
                source.drop_remainder = drop_at.and(drop);
                source.batching = if mapped { "after_map" } else { "before_map" }.into();
                match (size, drop) {
                    (Some(batch_size), Some(drop_remainder)) if after_reader => {
                        source.order.push(IndexOp::Batch {
                            batch_size,
                            drop_remainder,
                        })
                    }
                    _ if after_reader => {
                        refuse_unfolded(&mut source, &node, "batch size or drop_remainder")
                    }
                    _ => {}
                }
            }
            op if op.contains("MapDataset") && !op.contains("FlatMap") => {
                if let Ok(f) = node.attr_func("f") {
                    source.map_functions.push(f.name.clone());
                }
                mapped = true;
            }
            op if after_reader && !ORDER_NEUTRAL_OPS.contains(&op) => {
                source.unsupported.get_or_insert(UnsupportedOp {
                    node: node.name.clone(),
                    op: op.to_owned(),
                    reason: "it changes which records make an element depending on more than \
                             their positions, which Lode's dispatcher does not reproduce"
                        .into(),
                });
            }
            // Between the file names and the reader: a shuffle or repeat of the files
            // (`list_files(shuffle=True)`), a skip or take of them, ...
            op if !after_reader
                && !READER_OPS.contains(&op)
                && !ORDER_NEUTRAL_OPS.contains(&op) =>
            {
                source.unsupported.get_or_insert(UnsupportedOp {
                    node: node.name.clone(),
                    op: op.to_owned(),
                    reason: "it acts on the files before the reader reads them, and Lode reads \
                             the files once each, in the order the graph names them"
                        .into(),
                });
            }
            _ => {}
        }
    }
    source.skip = (leading.skip != 0).then_some(leading.skip);
    source.take = leading.take;
    Some(source)
}

/// Records the first index op whose argument does not fold: the order cannot be reproduced.
fn refuse_unfolded(source: &mut Source, node: &NodeDef, what: &str) {
    source.unsupported.get_or_insert_with(|| UnsupportedOp {
        node: node.name.clone(),
        op: node.op.clone(),
        reason: format!("its {what} is not a constant Lode can evaluate"),
    });
}

/// A shuffle op's buffer size, seeds and reshuffling, from its inputs or its seed generator.
fn shuffle_op(graph: &Graph, id: NodeId, node: &NodeDef) -> Option<IndexOp> {
    let input = |k: usize| graph.inputs[id].get(k).copied();
    let int = |k: usize| input(k).and_then(|t| fold::scalar(graph, t)?.as_i64());
    let reshuffle_attr = node.attr_bool("reshuffle_each_iteration").unwrap_or(true);
    // A seed generator resource (V2, or V3 / ShuffleAndRepeatV2 with a real one) holds the
    // seeds and the reshuffling; `DummySeedGenerator` means "the op's own".
    let generator_at = match node.op.as_str() {
        "ShuffleDatasetV2" => Some(2),
        "ShuffleDatasetV3" => Some(4),
        "ShuffleAndRepeatDatasetV2" => Some(5),
        _ => None,
    };
    let generator = generator_at
        .and_then(input)
        .map(|t| t.node)
        .filter(|&g| graph.node(g).op != "DummySeedGenerator");
    let (seed, seed2, reshuffle) = match generator {
        Some(g) => {
            let op = graph.node(g).op;
            if op != "AnonymousSeedGenerator" {
                return None;
            }
            let gen = |k: usize| graph.inputs[g].get(k).and_then(|&t| fold::scalar(graph, t));
            (gen(0)?.as_i64()?, gen(1)?.as_i64()?, gen(2)?.as_bool()?)
        }
        None if node.op == "ShuffleDatasetV2" => return None,
        None => (int(2)?, int(3)?, reshuffle_attr),
    };
    Some(IndexOp::Shuffle {
        buffer_size: int(1)?,
        seed,
        seed2,
        reshuffle_each_iteration: reshuffle,
    })
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

#[cfg(test)]
mod tests {
    use lode_proto::tf::attr_value::AttrValue;
    use lode_proto::tf::graph::GraphDef;
    use lode_proto::tf::tensor::TensorProto;
    use lode_proto::tf::types::DataType;
    use lode_proto::view::GraphView;
    use protobuf::{EnumOrUnknown, Message};

    use super::*;
    use crate::test_graphs::node;

    fn int64(name: &str, v: i64) -> NodeDef {
        let mut n = node(name, "Const", &[]);
        let mut t = TensorProto::new();
        t.dtype = EnumOrUnknown::new(DataType::DT_INT64);
        t.int64_val = vec![v];
        let mut a = AttrValue::new();
        a.set_tensor(t);
        n.attr.insert("value".into(), a);
        n.attr.insert("dtype".into(), int64_type());
        n
    }

    fn int64_type() -> AttrValue {
        let mut a = AttrValue::new();
        a.set_type(DataType::DT_INT64);
        a
    }

    /// `range(10)` → the ops given (each reading the previous one and the named constants) →
    /// MakeIterator, described.
    fn describe_chain(ops: &[(&str, &str, &[&str])], extra: Vec<NodeDef>) -> Source {
        let mut g = GraphDef::new();
        for (name, v) in [("start", 0), ("stop", 10), ("step", 1)] {
            g.node.push(int64(name, v));
        }
        g.node.extend(extra);
        g.node
            .push(node("range", "RangeDataset", &["start", "stop", "step"]));
        let mut last = "range".to_owned();
        for (name, op, args) in ops {
            let mut inputs = vec![last.as_str()];
            inputs.extend_from_slice(args);
            g.node.push(node(name, op, &inputs));
            last = (*name).to_owned();
        }
        g.node.push(node("it", "IteratorV2", &[]));
        g.node
            .push(node("MakeIterator", "MakeIterator", &[&last, "it"]));
        let bytes = g.write_to_bytes().expect("encodes");
        let view = GraphView::parse(&bytes).expect("view");
        let graph = Graph::new(&view).expect("graph");
        describe(&graph).expect("a chain")
    }

    #[test]
    fn a_filter_is_refused_by_name() {
        let source = describe_chain(
            &[
                ("keep", "FilterDataset", &[]),
                ("batch", "BatchDataset", &["b"]),
            ],
            vec![int64("b", 4)],
        );
        let bad = source.unsupported.expect("refused");
        assert_eq!(
            (bad.node.as_str(), bad.op.as_str()),
            ("keep", "FilterDataset")
        );
    }

    #[test]
    fn arguments_fold_through_arithmetic_and_leading_skips_compose() {
        let source = describe_chain(
            &[
                ("skip", "SkipDataset", &["two"]),
                ("take", "TakeDataset", &["five"]),
                ("skip2", "SkipDataset", &["one"]),
                ("repeat", "RepeatDataset", &["sum"]),
            ],
            vec![int64("two", 2), int64("five", 5), int64("one", 1), {
                let mut sum = node("sum", "AddV2", &["two", "five"]);
                sum.attr.insert("T".into(), int64_type());
                sum
            }],
        );
        // skip(2).take(5).skip(1) == skip(3).take(4); the repeat count 2 + 5 is folded.
        assert_eq!((source.skip, source.take), (Some(3), Some(4)));
        assert_eq!(source.order, vec![IndexOp::Repeat { count: 7 }]);
        assert_eq!(source.unsupported, None);
    }

    #[test]
    fn a_shuffle_of_the_files_before_the_reader_is_refused() {
        let source = describe_chain(
            &[
                ("files", "ShuffleDataset", &["b", "b", "b"]),
                ("read", "FlatMapDataset", &[]),
            ],
            vec![int64("b", 4)],
        );
        let bad = source.unsupported.expect("refused");
        assert_eq!(
            (bad.node.as_str(), bad.op.as_str()),
            ("files", "ShuffleDataset")
        );
    }

    #[test]
    fn an_argument_that_does_not_fold_is_refused() {
        let source = describe_chain(
            &[("repeat", "RepeatDataset", &["fed"])],
            vec![{
                let mut fed = node("fed", "Placeholder", &[]);
                fed.attr.insert("dtype".into(), int64_type());
                fed
            }],
        );
        assert!(source.unsupported.is_some());
    }

    #[test]
    fn a_dataset_chain_that_loops_is_no_chain() {
        // `a` reads `b` and `b` reads `a`: following first inputs never reaches a source.
        let mut g = GraphDef::new();
        g.node.push(int64("n", 2));
        g.node.push(node("a", "RepeatDataset", &["b", "n"]));
        g.node.push(node("b", "TakeDataset", &["a", "n"]));
        g.node.push(node("it", "IteratorV2", &[]));
        g.node
            .push(node("MakeIterator", "MakeIterator", &["a", "it"]));
        let bytes = g.write_to_bytes().expect("encodes");
        let view = GraphView::parse(&bytes).expect("view");
        let graph = Graph::new(&view).expect("graph");
        assert_eq!(chain(&graph), None);
        assert!(describe(&graph).is_none());
    }
}
