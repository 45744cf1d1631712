//! Hostile input: truncated, bit-flipped or spliced graphs never make the decoupler panic;
//! they either partition or give an error.

use std::path::PathBuf;

use lode_decoupler::{decouple, Options};
use lode_proto::view::GraphView;
use proptest::prelude::*;
use proptest::test_runner::{FailurePersistence, FileFailurePersistence};

/// Failing cases are saved beside this file (`*.proptest-regressions`, to commit) and replayed
/// first; proptest's default cannot find an integration test's crate root.
fn saved() -> Option<Box<dyn FailurePersistence>> {
    Some(Box::new(FileFailurePersistence::WithSource(
        "proptest-regressions",
    )))
}

fn fixture(rel: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn run(bytes: &[u8], simple: bool) {
    if let Ok(view) = GraphView::parse(bytes) {
        let _ = decouple(
            &view,
            &Options {
                simple,
                stateful_ops: vec![],
                kernels: None,
            },
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: saved(), ..ProptestConfig::default() })]

    #[test]
    fn mangled_fixtures_never_panic(
        which in 0usize..3,
        cut in 0usize..120_000,
        flips in proptest::collection::vec((0usize..120_000, any::<u8>()), 0..6),
        simple in any::<bool>(),
    ) {
        let mut bytes = fixture(["sgd_ref/model.pb", "deepfm/model.pb", "one_shot/model.pb"][which]);
        bytes.truncate(cut.max(1).min(bytes.len()));
        for (at, value) in flips {
            if let Some(b) = bytes.get_mut(at) {
                *b ^= value;
            }
        }
        run(&bytes, simple);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        run(&bytes, false);
    }
}

/// Structural mutations that keep the wire format valid: rewired inputs (any node, any output
/// index, control edges, cycles), swapped ops, GPU devices, dropped attributes.
#[derive(Debug, Clone)]
enum Mutation {
    Input {
        node: usize,
        input: usize,
        to: usize,
        index: u32,
        control: bool,
    },
    Op {
        node: usize,
        op: usize,
    },
    Device {
        node: usize,
    },
    DropAttrs {
        node: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0usize..200, 0usize..4, 0usize..200, 0u32..4, any::<bool>()).prop_map(
            |(node, input, to, index, control)| Mutation::Input {
                node,
                input,
                to,
                index,
                control
            }
        ),
        (0usize..200, 0usize..8).prop_map(|(node, op)| Mutation::Op { node, op }),
        (0usize..200).prop_map(|node| Mutation::Device { node }),
        (0usize..200).prop_map(|node| Mutation::DropAttrs { node }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: saved(), ..ProptestConfig::default() })]

    #[test]
    fn structurally_mutated_graphs_never_panic(mutations in proptest::collection::vec(mutation(), 1..12), simple in any::<bool>()) {
        use protobuf::Message;
        const OPS: [&str; 8] = ["Identity", "IteratorGetNext", "VarHandleOp", "Enter", "NextIteration", "DeserializeSparse", "NoSuchOp", "MakeIterator"];
        let mut g: lode_proto::tf::graph::GraphDef = lode_proto::io::decode_binary(&fixture("sgd_ref/model.pb")).expect("fixture");
        let n = g.node.len();
        for m in mutations {
            match m {
                Mutation::Input { node, input, to, index, control } => {
                    let name = g.node[to % n].name.clone();
                    let node = &mut g.node[node % n];
                    let text = if control { format!("^{name}") } else { format!("{name}:{index}") };
                    if node.input.is_empty() {
                        node.input.push(text);
                    } else {
                        let k = input % node.input.len();
                        node.input[k] = text;
                    }
                }
                Mutation::Op { node, op } => g.node[node % n].op = OPS[op].into(),
                Mutation::Device { node } => g.node[node % n].device = "/device:GPU:0".into(),
                Mutation::DropAttrs { node } => g.node[node % n].attr.clear(),
            }
        }
        let bytes = g.write_to_bytes().expect("encodes");
        run(&bytes, simple);
    }
}

#[test]
fn the_real_fixtures_partition() {
    for rel in [
        "wide_deep/model.pb",
        "deepfm/model.pb",
        "adam_resource/model.pb",
        "sgd_ref/model.pb",
        "one_shot/model.pb",
    ] {
        let bytes = fixture(rel);
        let view = GraphView::parse(&bytes).expect("fixture parses");
        decouple(&view, &Options::default()).unwrap_or_else(|e| panic!("{rel}: {e}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: saved(), ..ProptestConfig::default() })]

    /// A one-shot iterator's dataset factory with rewired inputs (every spelling, names that
    /// do not exist, controls, cycles), swapped ops, dropped attributes or a broken `ret`.
    #[test]
    fn mutated_dataset_factories_never_panic(
        edits in proptest::collection::vec((0usize..32, 0usize..4, 0usize..6, 0usize..32, 0u32..3), 1..8),
        simple in any::<bool>(),
    ) {
        use protobuf::Message;
        const OPS: [&str; 6] = ["Identity", "NoSuchOp", "RepeatDataset", "Const", "OneShotIterator", "Unique"];
        let mut g: lode_proto::tf::graph::GraphDef = lode_proto::io::decode_binary(&fixture("one_shot/model.pb")).expect("fixture");
        let f = g
            .library
            .mut_or_insert_default()
            .function
            .iter_mut()
            .find(|f| f.signature.name.starts_with("_make_dataset_"))
            .expect("the fixture's factory");
        let n = f.node_def.len();
        for (at, kind, what, to, index) in edits {
            let target = f.node_def[to % n].name.clone();
            match kind {
                0 => {
                    let spellings = [
                        format!("{target}:handle:{index}"),
                        format!("{target}:output:{index}"),
                        target.clone(),
                        format!("^{target}"),
                        format!("{target}:{index}"),
                        "missing:output:0".to_owned(),
                    ];
                    let text = spellings[what].clone();
                    let node = &mut f.node_def[at % n];
                    if node.input.is_empty() {
                        node.input.push(text);
                    } else {
                        let k = usize::try_from(index).unwrap_or(0) % node.input.len();
                        node.input[k] = text;
                    }
                }
                1 => f.node_def[at % n].op = OPS[what].into(),
                2 => f.node_def[at % n].attr.clear(),
                _ => {
                    let ret = format!("{target}:handle:{index}");
                    f.ret.values_mut().for_each(|r| r.clone_from(&ret));
                }
            }
        }
        let bytes = g.write_to_bytes().expect("encodes");
        run(&bytes, simple);
    }
}
