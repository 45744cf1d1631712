//! Bad input: one line on stderr naming the file and the problem, exit status 2, no panic.

use std::path::Path;

use crate::support::{fixtures, lode_path, stderr};

fn expect_error(path: &Path, extra: &[&str], problem: &str) {
    let mut args = vec!["inspect"];
    args.extend_from_slice(extra);
    let out = lode_path(&args, path);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit status for {}: {err}",
        path.display()
    );
    assert!(
        !err.contains("panicked"),
        "panic on {}: {err}",
        path.display()
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err}");
    assert!(lines[0].starts_with("lode: error: "), "{err}");
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("file name");
    assert!(lines[0].contains(name), "error does not name {name}: {err}");
    assert!(
        lines[0].contains(problem),
        "error does not say '{problem}': {err}"
    );
    assert!(
        out.stdout.is_empty(),
        "stdout on error: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn truncated_binary_graph() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bytes = std::fs::read(fixtures().join("wide_deep/model.pb")).expect("fixture");
    let path = tmp.path().join("truncated.pb");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("write");
    expect_error(&path, &[], "not a valid binary GraphDef");
}

/// Issue 14: a GraphDef cut inside a node (here: one byte short of the first node's end,
/// where every field read so far is whole) is refused, with the offset, by `lode inspect` and
/// `lode partition`; one cut where TensorFlow's parser also accepts it (before `versions`) loads
/// with a warning that the file may be truncated.
#[test]
fn a_graph_cut_inside_a_node_is_refused_and_one_cut_between_fields_is_flagged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = std::fs::read(fixtures().join("sgd_ref/model.pb")).expect("fixture");
    let mut fields = lode_proto::view::Fields::new(&whole);
    let mut top = Vec::new();
    while let Some(field) = fields.next_field() {
        let (number, value, bytes) = field.expect("the fixture is whole");
        let lode_proto::view::Field::Bytes(body) = value else {
            panic!("field {number} is not length-delimited");
        };
        top.push((number, bytes.len(), bytes.len() - body.len()));
    }
    let (number, node_len, header) = top[0];
    assert_eq!(number, 1, "the first field is a node");
    let cut = node_len - 1;
    let path = dir.path().join("cut.pb");
    std::fs::write(&path, &whole[..cut]).expect("write");
    let at = format!("at byte {header}");
    expect_error(&path, &[], &at);
    let plan = dir.path().join("plan");
    let out = crate::support::partition_into(&path, &plan, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(&at), "{}", stderr(&out));

    let &(number, tail, _) = top.last().expect("fields");
    assert_eq!(number, 4, "TensorFlow writes versions last");
    let path = dir.path().join("unversioned.pb");
    std::fs::write(&path, &whole[..whole.len() - tail]).expect("write");
    let out = lode_path(&["inspect"], &path);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("may be truncated"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn random_bytes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A fixed xorshift stream: reproducible "random" bytes.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect();
    for name in ["random.pb", "random.meta", "random.bin"] {
        let path = tmp.path().join(name);
        std::fs::write(&path, &bytes).expect("write");
        expect_error(&path, &[], "not a valid binary");
    }
}

#[test]
fn text_graph_with_a_syntax_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("broken.pbtxt");
    std::fs::write(&path, "node {\n  name: \"a\"\n  op: \"Const\"\n  attr { key: \"dtype\" value { type: DT_FLOAT }\n").expect("write");
    expect_error(&path, &[], "end of input");
    std::fs::write(&path, "node {\n  name: \"a\"\n  opp: \"Const\"\n}\n").expect("write");
    expect_error(&path, &[], "line 3, column 3");
}

#[test]
fn directory_without_saved_model() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("not_a_model");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("variables.index"), b"x").expect("write");
    expect_error(&dir, &[], "without saved_model.pb");
}

#[test]
fn unknown_tag_set() {
    let model = fixtures().join("tf1_savedmodel/saved_model");
    expect_error(
        &model,
        &["--tags", "gpu"],
        "no MetaGraph has the tags [gpu]",
    );
}

#[test]
fn ambiguous_tag_sets_are_listed() {
    let model = fixtures().join("tf1_savedmodel/saved_model");
    expect_error(&model, &[], "[train] [serve]");
}

#[test]
fn empty_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in ["empty.pb", "empty.pbtxt", "empty.meta"] {
        let path = tmp.path().join(name);
        std::fs::write(&path, b"").expect("write");
        expect_error(&path, &[], "the file is empty");
    }
}

#[test]
fn missing_file() {
    let path = fixtures().join("no_such_model.pb");
    expect_error(&path, &[], "No such file");
}

#[test]
fn graph_with_a_dangling_input() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("dangling.pbtxt");
    std::fs::write(
        &path,
        "node { name: \"a\" op: \"Identity\" input: \"ghost:0\" }\n",
    )
    .expect("write");
    expect_error(&path, &[], "no node is named 'ghost'");
}

/// A plan.json cut short or followed by garbage is refused with exit status 2, naming the file
/// and the byte offset.
#[test]
fn a_truncated_or_extended_plan_json_is_refused_with_its_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = dir.path().join("plan");
    let out = crate::support::partition_into(&fixtures().join("sgd_ref/model.pb"), &plan, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json = std::fs::read(plan.join("plan.json")).expect("plan.json");
    let garbage = [json.as_slice(), b"\n}"].concat();
    for (bytes, at) in [(json[..500].to_vec(), 499), (garbage, json.len() + 1)] {
        std::fs::write(plan.join("plan.json"), &bytes).expect("write");
        let out = crate::support::lode(&["exec", plan.to_str().expect("UTF-8"), "--steps", "1"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("plan.json") && err.contains(&format!("at byte {at}")),
            "{err}"
        );
    }
}
