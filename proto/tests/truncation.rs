//! Truncated and trailing-garbage model files are refused wherever TensorFlow's own parser
//! refuses them (the verdicts in fixtures/golden/truncation.json come from TensorFlow 2.18's
//! `ParseFromString`, written by fixtures/gen/golden_truncation.py): by the wire decoder, by
//! the file loader (an error naming the file and the offset), and for GraphDefs by the view
//! `lode partition` reads. A cut TensorFlow accepts leaves a valid, shorter message; a GraphDef
//! cut so is at least flagged (it lacks `versions`).

use std::path::{Path, PathBuf};

use lode_proto::io::{self, decode_binary_at, LoadOptions};
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::meta_graph::MetaGraphDef;
use lode_proto::tf::saved_model::SavedModel;
use lode_proto::view::GraphView;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    file: String,
    message: String,
    len: usize,
    cuts: Vec<(usize, bool)>,
    suffixes: Vec<(String, bool)>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn golden() -> Golden {
    let path = fixtures().join("golden/truncation.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden JSON")
}

/// Whether the wire decoder takes `bytes` as the case's message.
fn decodes(message: &str, bytes: &[u8]) -> bool {
    match message {
        "GraphDef" => decode_binary_at::<GraphDef>(bytes).is_ok(),
        "MetaGraphDef" => decode_binary_at::<MetaGraphDef>(bytes).is_ok(),
        "SavedModel" => decode_binary_at::<SavedModel>(bytes).is_ok(),
        other => panic!("unknown message {other}"),
    }
}

/// The file name the loader needs to read `bytes` as the case's message.
fn file_name(message: &str) -> &'static str {
    match message {
        "GraphDef" => "model.pb",
        "MetaGraphDef" => "model.meta",
        _ => "saved_model.pb",
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Loads `bytes` from a file; on refusal the error must name the file and, for a binary
/// decoding error, the offset.
fn load(dir: &Path, message: &str, bytes: &[u8]) -> Result<io::Model, String> {
    let path = dir.join(file_name(message));
    std::fs::write(&path, bytes).expect("write");
    io::load(&path, &LoadOptions::default()).map_err(|e| {
        let text = e.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        if matches!(e, lode_proto::Error::Decode { .. }) {
            assert!(text.contains("at byte "), "{text}");
        }
        text
    })
}

#[test]
fn truncated_files_are_refused_where_tensorflow_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let golden = golden();
    let mut checked = 0;
    for case in &golden.cases {
        let whole = std::fs::read(fixtures().join(&case.file)).expect("fixture");
        assert_eq!(
            whole.len(),
            case.len,
            "{} changed since its verdicts",
            case.file
        );
        let variants = case
            .cuts
            .iter()
            .map(|&(cut, tf)| (format!("cut at {cut}"), whole[..cut].to_vec(), tf))
            .chain(case.suffixes.iter().map(|(suffix, tf)| {
                let mut v = whole.clone();
                v.extend(hex(suffix));
                (format!("+{suffix}"), v, *tf)
            }));
        for (what, bytes, tf) in variants {
            let label = format!("{} {what}", case.file);
            // The wire decoder agrees with TensorFlow's, both ways.
            assert_eq!(decodes(&case.message, &bytes), tf, "{label}");
            let loaded = load(dir.path(), &case.message, &bytes);
            if !tf {
                assert!(loaded.is_err(), "{label}: TensorFlow refuses, Lode loads");
            } else if case.message == "GraphDef" && bytes.len() < whole.len() {
                // A shorter valid GraphDef: refused as a graph, or flagged as truncated.
                if let Ok(model) = &loaded {
                    assert!(model.graph.versions.is_none(), "{label}: not flagged");
                }
            }
            if case.message == "GraphDef" && !tf {
                assert!(
                    GraphView::parse(&bytes).is_err(),
                    "{label}: the view reads it"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 2500, "{checked} variants");
}

/// The cut that issue 14 found: before the whole input was a decoding limit, an embedded
/// message whose length ran past the end was read as complete.
#[test]
fn a_node_cut_short_is_not_a_smaller_node() {
    let whole = std::fs::read(fixtures().join("sgd_ref/model.pb")).expect("fixture");
    let graph: GraphDef = lode_proto::io::decode_binary(&whole).expect("whole");
    let first = protobuf::Message::compute_size(&graph.node[0]);
    // Tag, a one- or two-byte length, then the node: cut it before its last byte.
    let header = 1 + if first < 128 { 1 } else { 2 };
    let cut = usize::try_from(header + first - 1).expect("small");
    let (offset, _) = decode_binary_at::<GraphDef>(&whole[..cut]).expect_err("refused");
    assert_eq!(offset, header, "the error is where the node's bytes begin");
}
