//! Iterators chosen by a string handle (`tf.compat.v1.data.Iterator.from_string_handle`): the
//! program feeds `IteratorFromStringHandle[V2]` the handle of a concrete iterator (fetched with
//! `iterator.string_handle()`), so which dataset `IteratorGetNext` reads is decided only at run
//! time. When the graph has exactly one concrete iterator (one `MakeIterator`), the handle can
//! only name it: this pass, run before the cut, reads `IteratorGetNext` from that iterator
//! directly, so that the cut sees one pipeline. The handle's placeholder and the
//! `IteratorFromStringHandle` node then feed nothing and stay in training, where the program
//! still feeds them; the training graph's `IteratorToStringHandle` is a constant stand-in
//! (see `rewrite`). With several iterators (a training and a validation set switched by the
//! handle) the order depends on what the program feeds: refused, naming the node.

use lode_proto::view::{encode_graph, with_inputs, GraphView, OutNode};

use crate::error::{Error, Result};

const FROM_HANDLE: [&str; 2] = ["IteratorFromStringHandle", "IteratorFromStringHandleV2"];

/// The graph with every `IteratorGetNext` on a string-handle iterator reading the graph's one
/// concrete iterator; `None` when no `IteratorGetNext` reads a string-handle iterator.
pub fn normalize(def: &GraphView) -> Result<Option<Vec<u8>>> {
    let op_of = |name: &str| def.nodes.iter().find(|n| n.name == name).map(|n| n.op);
    let reads_handle = |n: &lode_proto::view::NodeView| {
        n.op.starts_with("IteratorGetNext")
            && n.inputs
                .first()
                .map(|i| node_of(i))
                .and_then(op_of)
                .is_some_and(|op| FROM_HANDLE.contains(&op))
    };
    let Some(first) = def.nodes.iter().find(|n| reads_handle(n)) else {
        return Ok(None);
    };
    let makes: Vec<_> = def
        .nodes
        .iter()
        .filter(|n| n.op == "MakeIterator")
        .collect();
    let iterator = match makes.as_slice() {
        [make] => {
            make.inputs
                .get(1)
                .map(|i| (*i).to_owned())
                .ok_or_else(|| Error::InvalidGraph {
                    reason: format!("{}: MakeIterator without an iterator input", make.name),
                })?
        }
        _ => {
            let handle = node_of(first.inputs.first().copied().unwrap_or_default());
            return Err(Error::UnsupportedPipeline {
                node: handle.to_owned(),
                op: op_of(handle).unwrap_or_default().to_owned(),
                reason: format!(
                    "the string handle may name any of {} iterators, so the data order depends \
                     on what the program feeds; Lode cuts a from_string_handle pipeline only \
                     when the graph has one initializable iterator",
                    makes.len()
                ),
            });
        }
    };
    let mut nodes = Vec::with_capacity(def.nodes.len());
    for node in &def.nodes {
        if !reads_handle(node) {
            nodes.push(OutNode::Raw(node.raw));
            continue;
        }
        let mut inputs: Vec<String> = node.inputs.iter().map(|i| (*i).to_owned()).collect();
        inputs[0].clone_from(&iterator);
        let encoded = with_inputs(node.raw, &inputs).map_err(|e| Error::InvalidGraph {
            reason: format!("{}: cannot rewrite its inputs: {e}", node.name),
        })?;
        nodes.push(OutNode::Encoded(encoded));
    }
    let mut bytes =
        encode_graph(&nodes, def.library.as_ref(), def.versions.as_ref()).map_err(|e| {
            Error::InvalidGraph {
                reason: format!("cannot encode the graph with its handle iterators resolved: {e}"),
            }
        })?;
    for field in &def.other {
        bytes.extend_from_slice(field);
    }
    Ok(Some(bytes))
}

/// The node an input names (`node`, `node:1`, `^node`).
fn node_of(input: &str) -> &str {
    let input = input.trim_start_matches('^');
    input.split(':').next().unwrap_or(input)
}

#[cfg(test)]
mod tests {
    use lode_proto::tf::graph::GraphDef;
    use protobuf::Message as _;

    use super::*;
    use crate::test_graphs::node;

    fn graph(makes: usize) -> Vec<u8> {
        let mut g = GraphDef::new();
        let mut add = |name: &str, op: &str, inputs: &[&str]| g.node.push(node(name, op, inputs));
        for i in 0..makes {
            add(&format!("ds{i}"), "RangeDataset", &[]);
            add(&format!("it{i}"), "IteratorV2", &[]);
            add(
                &format!("make{i}"),
                "MakeIterator",
                &[&format!("ds{i}"), &format!("it{i}")],
            );
        }
        add("handle", "Placeholder", &[]);
        add("from", "IteratorFromStringHandleV2", &["handle"]);
        add("next", "IteratorGetNext", &["from", "^handle"]);
        g.write_to_bytes().expect("encodes")
    }

    #[test]
    fn the_handle_of_the_one_iterator_is_resolved_to_it() {
        let bytes = graph(1);
        let view = GraphView::parse(&bytes).expect("parses");
        let out = normalize(&view).expect("normalizes").expect("rewritten");
        let view = GraphView::parse(&out).expect("parses");
        let next = view.nodes.iter().find(|n| n.name == "next").expect("next");
        assert_eq!(next.inputs, vec!["it0", "^handle"]);
        assert_eq!(view.nodes.len(), 6, "nothing added or removed");
    }

    #[test]
    fn a_graph_without_handle_iterators_is_left_alone() {
        let mut g = GraphDef::new();
        g.node.push(node("next", "IteratorGetNext", &["it"]));
        let bytes = g.write_to_bytes().expect("encodes");
        let view = GraphView::parse(&bytes).expect("parses");
        assert!(normalize(&view).expect("normalizes").is_none());
    }

    #[test]
    fn a_handle_that_may_name_several_iterators_is_refused_naming_the_node() {
        for makes in [0, 2] {
            let bytes = graph(makes);
            let view = GraphView::parse(&bytes).expect("parses");
            match normalize(&view) {
                Err(Error::UnsupportedPipeline { node, op, reason }) => {
                    assert_eq!(
                        (node.as_str(), op.as_str()),
                        ("from", "IteratorFromStringHandleV2")
                    );
                    assert!(reason.contains(&format!("{makes} iterators")), "{reason}");
                }
                other => panic!("{makes} iterators: {other:?}"),
            }
        }
    }
}
