//! Property tests for the loaders: nothing from outside makes them panic, and every GraphDef
//! survives binary → text → binary.

use std::path::PathBuf;

use lode_proto::io::{self, decode_binary, LoadOptions};
use lode_proto::text;
use lode_proto::tf::attr_value::{attr_value, AttrValue, NameAttrList};
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::meta_graph::MetaGraphDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::saved_model::SavedModel;
use lode_proto::tf::tensor::TensorProto;
use lode_proto::tf::tensor_shape::{tensor_shape_proto, TensorShapeProto};
use lode_proto::tf::types::DataType;
use proptest::prelude::*;
use proptest::test_runner::{FailurePersistence, FileFailurePersistence};
use protobuf::{EnumOrUnknown, Message};

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

/// Feeds bytes to every loader entry point; only the absence of panics is checked here.
fn exercise(bytes: &[u8]) {
    let _ = decode_binary::<GraphDef>(bytes);
    let _ = decode_binary::<MetaGraphDef>(bytes);
    let _ = decode_binary::<SavedModel>(bytes);
    if let Ok(s) = std::str::from_utf8(bytes) {
        let _ = text::parse::<GraphDef>(s);
        let _ = text::parse::<SavedModel>(s);
    }
}

fn load_from_file(bytes: &[u8], name: &str) -> Result<io::Model, lode_proto::Error> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write");
    io::load(&path, &LoadOptions::default())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: saved(), ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        exercise(&bytes);
        let _ = load_from_file(&bytes, "model.pb");
    }

    #[test]
    fn random_text_never_panics(s in "[a-z_{}<>:\\[\\],\"'0-9 .\\n\\\\-]{0,400}") {
        exercise(s.as_bytes());
        let _ = load_from_file(s.as_bytes(), "model.pbtxt");
    }

    #[test]
    fn truncated_or_flipped_fixtures_never_panic(cut in 0usize..30_000, flips in proptest::collection::vec((0usize..30_000, any::<u8>()), 0..8)) {
        let mut bytes = fixture("sgd_ref/model.pb");
        bytes.truncate(cut.min(bytes.len()));
        for (at, value) in flips {
            if let Some(b) = bytes.get_mut(at) {
                *b ^= value;
            }
        }
        exercise(&bytes);
        let _ = load_from_file(&bytes, "model.meta");
    }

    #[test]
    fn mangled_text_fixtures_never_panic(cut in 0usize..50_000, at in 0usize..50_000, junk in "[{}:\"\\\\<>\\[\\]a-z0-9 ]{0,6}") {
        let text = String::from_utf8(fixture("sgd_ref/model.pbtxt")).expect("UTF-8 fixture");
        let mut chars: Vec<char> = text.chars().take(cut).collect();
        let at = at.min(chars.len());
        chars.splice(at..at, junk.chars());
        let mangled: String = chars.into_iter().collect();
        exercise(mangled.as_bytes());
    }

    #[test]
    fn any_graph_survives_binary_text_binary(graph in graph_strategy()) {
        let binary = graph.write_to_bytes().expect("encodes");
        let decoded: GraphDef = decode_binary(&binary).expect("decodes its own encoding");
        let printed = text::print(&decoded);
        let reparsed: GraphDef = text::parse(&printed).map_err(|e| TestCaseError::fail(format!("{e}\n{printed}")))?;
        // Compare through the deterministic printer: maps are unordered in memory, and NaN
        // never equals itself, but the printed forms must agree exactly.
        prop_assert_eq!(text::print(&reparsed), printed);
        let rebinary = reparsed.write_to_bytes().expect("encodes");
        let again: GraphDef = decode_binary(&rebinary).expect("decodes");
        prop_assert_eq!(text::print(&again), text::print(&decoded));
    }
}

fn attr_strategy() -> impl Strategy<Value = AttrValue> {
    let leaf = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(attr_value::Value::S),
        any::<i64>().prop_map(attr_value::Value::I),
        any::<f32>().prop_map(attr_value::Value::F),
        any::<bool>().prop_map(attr_value::Value::B),
        (0i32..140).prop_map(|t| attr_value::Value::Type(EnumOrUnknown::from_i32(t))),
        proptest::collection::vec(-1i64..1000, 0..4).prop_map(|dims| {
            let mut shape = TensorShapeProto::new();
            shape.dim = dims
                .into_iter()
                .map(|size| {
                    let mut d = tensor_shape_proto::Dim::new();
                    d.size = size;
                    d
                })
                .collect();
            attr_value::Value::Shape(shape)
        }),
        (
            proptest::collection::vec(any::<f32>(), 0..5),
            proptest::collection::vec(any::<u8>(), 0..16)
        )
            .prop_map(|(floats, content)| {
                let mut t = TensorProto::new();
                t.dtype = EnumOrUnknown::new(DataType::DT_FLOAT);
                t.float_val = floats;
                t.tensor_content = content;
                attr_value::Value::Tensor(t)
            }),
        "[a-z_]{1,10}".prop_map(attr_value::Value::Placeholder),
        ("[a-z_]{1,10}", any::<i64>()).prop_map(|(name, i)| {
            let mut f = NameAttrList::new();
            f.name = name;
            let mut v = AttrValue::new();
            v.set_i(i);
            f.attr.insert("N".into(), v);
            attr_value::Value::Func(f)
        }),
        (
            proptest::collection::vec(any::<i64>(), 0..4),
            proptest::collection::vec(any::<f32>(), 0..4)
        )
            .prop_map(|(i, f)| {
                let mut list = attr_value::ListValue::new();
                list.i = i;
                list.f = f;
                attr_value::Value::List(list)
            }),
    ];
    (leaf, proptest::option::of((1u32..50, any::<u64>()))).prop_map(|(value, unknown)| {
        let mut attr = AttrValue::new();
        attr.value = Some(value);
        if let Some((n, v)) = unknown {
            // Field numbers from 20 up are unused by AttrValue: a future TensorFlow's fields.
            attr.mut_unknown_fields().add_varint(20 + n, v);
        }
        attr
    })
}

fn node_strategy() -> impl Strategy<Value = NodeDef> {
    (
        "[A-Za-z][A-Za-z0-9_/]{0,12}",
        "[A-Z][A-Za-z0-9]{0,10}",
        proptest::collection::vec("\\^?[a-z]{1,5}(:[0-9])?", 0..4),
        "(/device:(CPU|GPU):0)?",
        proptest::collection::btree_map("[a-z_]{1,8}", attr_strategy(), 0..4),
    )
        .prop_map(|(name, op, input, device, attrs)| {
            let mut n = NodeDef::new();
            n.name = name;
            n.op = op;
            n.input = input;
            n.device = device;
            n.attr = attrs.into_iter().collect();
            n
        })
}

fn graph_strategy() -> impl Strategy<Value = GraphDef> {
    (
        proptest::collection::vec(node_strategy(), 0..6),
        any::<i32>(),
        proptest::option::of(any::<u32>()),
    )
        .prop_map(|(nodes, producer, unknown)| {
            let mut g = GraphDef::new();
            g.node = nodes;
            g.versions.mut_or_insert_default().producer = producer;
            if let Some(v) = unknown {
                g.mut_unknown_fields().add_fixed32(99, v);
                g.mut_unknown_fields()
                    .add_length_delimited(98, v.to_le_bytes().to_vec());
            }
            g
        })
}

#[test]
fn every_fixture_graph_survives_text() {
    for rel in [
        "wide_deep/model.pb",
        "deepfm/model.pb",
        "adam_resource/model.pb",
        "sgd_ref/model.pb",
    ] {
        let graph: GraphDef = decode_binary(&fixture(rel)).expect("fixture decodes");
        let printed = text::print(&graph);
        let back: GraphDef = text::parse(&printed).expect("Lode reads what it prints");
        assert_eq!(back, graph, "{rel}");
    }
}
