//! `lode partition` on the fixtures: the plan directory, the cover, where the wide & deep
//! feature transformations land, CPU and GPU stages, and the errors.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use lode_proto::io::{load, LoadOptions};
use serde_json::Value;

use crate::support::{fixtures, lode, ok, partition_into, stderr};

fn partition(model: &Path, dir: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["--format", "json"];
    args.extend_from_slice(extra);
    let out = ok(&partition_into(model, dir, &args));
    for file in ["training.pb", "plan.json", "report.txt", "partition.dot"] {
        assert!(
            dir.join(file).is_file(),
            "{file} missing in {}",
            dir.display()
        );
    }
    let plan: Value = serde_json::from_str(&out).expect("plan JSON on stdout");
    let on_disk: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).expect("plan.json"))
            .expect("JSON");
    assert_eq!(plan, on_disk, "stdout and plan.json differ");
    plan
}

fn names(plan: &Value, key: &str) -> Vec<String> {
    plan[key]
        .as_array()
        .expect(key)
        .iter()
        .map(|v| v.as_str().expect("string").to_owned())
        .collect()
}

/// The cover, checked from the files alone.
pub(crate) fn check_cover(model: &Path, tags: Option<&str>, dir: &Path, plan: &Value) {
    let original = load(
        model,
        &LoadOptions {
            tags: tags.map(|t| vec![t.to_owned()]),
        },
    )
    .expect("original loads");
    let training =
        load(&dir.join("training.pb"), &LoadOptions::default()).expect("training.pb loads");
    let training_names: HashSet<String> =
        training.graph.node.iter().map(|n| n.name.clone()).collect();
    let stubs: HashSet<String> = plan["stubs"]
        .as_object()
        .expect("stubs")
        .keys()
        .cloned()
        .collect();
    let copied: HashSet<String> = names(plan, "copied").into_iter().collect();
    let replaced: HashSet<String> = if plan["source"]["replaced"].is_array() {
        names(&plan["source"], "replaced").into_iter().collect()
    } else {
        HashSet::new()
    };
    let mut stage_of: HashMap<String, u64> = HashMap::new();
    for stage in plan["stages"].as_array().expect("stages") {
        let graph = dir.join(stage["graph"].as_str().expect("graph"));
        let stage_graph = load(&graph, &LoadOptions::default()).expect("stage graph loads");
        assert!(
            stage_graph
                .graph
                .node
                .iter()
                .all(|n| !["VariableV2", "VarHandleOp", "Variable"].contains(&n.op.as_str())),
            "a variable in {}",
            graph.display()
        );
        assert!(
            stage_graph
                .graph
                .node
                .iter()
                .filter(|n| n.op == "DWSend")
                .count()
                <= 1
        );
        let in_graph: HashSet<&str> = stage_graph
            .graph
            .node
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        for n in stage["nodes"].as_array().expect("nodes") {
            let name = n.as_str().expect("name").to_owned();
            assert!(
                in_graph.contains(name.as_str()),
                "{name} is listed by {} but not in its graph",
                graph.display()
            );
            assert!(
                stage_of
                    .insert(name.clone(), stage["index"].as_u64().expect("index"))
                    .is_none(),
                "{name} in two stages"
            );
        }
    }
    // A name a stage lists that the original graph lacks is one the plan says it inlined
    // (a one-shot iterator's dataset factory and its MakeIterator).
    let original_names: HashSet<&str> = original
        .graph
        .node
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    let mut inlined: HashSet<&str> = HashSet::new();
    for it in plan["inlined"].as_array().into_iter().flatten() {
        inlined.extend(
            it["nodes"]
                .as_array()
                .expect("nodes")
                .iter()
                .filter_map(Value::as_str),
        );
        inlined.extend(it["make_iterator"].as_str());
    }
    for name in stage_of.keys() {
        assert!(
            original_names.contains(name.as_str()) || inlined.contains(name.as_str()),
            "{name} is in a stage but neither in the original graph nor inlined"
        );
    }
    for node in &original.graph.node {
        let in_stage = stage_of.contains_key(&node.name);
        let in_training = training_names.contains(&node.name) && !stubs.contains(&node.name);
        if copied.contains(&node.name) {
            assert!(!in_stage, "{} copied and listed by a stage", node.name);
            assert!(
                !replaced.contains(&node.name),
                "{} copied and replaced",
                node.name
            );
        } else {
            assert_eq!(
                usize::from(in_stage)
                    + usize::from(in_training)
                    + usize::from(replaced.contains(&node.name)),
                1,
                "{} ({}) placed wrongly",
                node.name,
                node.op
            );
        }
    }
    // Every DWRecv in training names tensors that its producer stage sends, in the same order.
    for recv in plan["training"]["recv"].as_array().expect("recv") {
        let from = usize::try_from(recv["from_stage"].as_u64().expect("stage")).expect("small");
        let stage = &plan["stages"][from];
        let sent: Vec<&Value> = stage["send"]["tensors"]
            .as_array()
            .expect("send")
            .iter()
            .map(|t| &t["tensor"])
            .collect();
        let got: Vec<&Value> = recv["tensors"]
            .as_array()
            .expect("tensors")
            .iter()
            .collect();
        assert_eq!(got, sent);
    }
}

#[test]
fn every_tf1_fixture_partitions_into_a_cover() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in [
        "wide_deep",
        "deepfm",
        "adam_resource",
        "sgd_ref",
        "one_shot",
        "text_segments",
    ] {
        for simple in [false, true] {
            let model = fixtures().join(name).join("model.pb");
            let dir = tmp.path().join(format!("{name}-{simple}"));
            let extra: &[&str] = if simple { &["--simple"] } else { &[] };
            let plan = partition(&model, &dir, extra);
            check_cover(&model, None, &dir, &plan);
            assert_eq!(plan["training"]["graph"], "training.pb");
            assert!(
                !plan["training"]["recv"]
                    .as_array()
                    .expect("recv")
                    .is_empty(),
                "{name}: nothing crosses"
            );
        }
    }
    let model = fixtures().join("tf1_savedmodel/saved_model");
    let dir = tmp.path().join("tf1_savedmodel");
    let plan = partition(&model, &dir, &["--tags", "train"]);
    check_cover(&model, Some("train"), &dir, &plan);
}

/// text_segments (fixtures/README.md) holds the two input-side ops issue 14 found without a
/// data-worker kernel: `Max` (tf.strings.split's ragged row ids) and `SegmentSum`
/// (segment_mean's gradient). Both have kernels now, so nothing limits the cut and both run in
/// the stage (tests/conformance/exec_equivalence.py checks their tensors against TensorFlow's).
/// The cut without those kernels is decoupler/tests/kernels.rs; a real graph with an op
/// still lacking one is exec.rs's `ops_without_a_kernel_stay_in_training_or_are_refused_when_strict`.
#[test]
fn max_and_segment_sum_run_on_the_data_worker() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = fixtures().join("text_segments/model.pb");
    let dir = tmp.path().join("plan");
    let plan = partition(&model, &dir, &[]);
    check_cover(&model, None, &dir, &plan);
    assert!(
        plan.get("kernel_limits").is_none(),
        "{}",
        plan["kernel_limits"]
    );
    let stage_nodes = names(&plan["stages"][0], "nodes");
    for op_node in ["bincount/Max", "SegmentMean_grad/SegmentSum"] {
        assert!(
            stage_nodes.iter().any(|n| n.ends_with(op_node)),
            "{op_node} is not in the stage: {stage_nodes:?}"
        );
    }
    ok(&lode(&[
        "exec",
        dir.to_str().expect("path"),
        "--steps",
        "9",
    ]));
    let strict = tmp.path().join("strict");
    ok(&partition_into(&model, &strict, &["--strict-kernels"]));
}

#[test]
fn wide_deep_feature_transformations_go_to_the_data_worker() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = fixtures().join("wide_deep/model.pb");
    let dir = tmp.path().join("plan");
    let plan = partition(&model, &dir, &[]);
    let original = load(&model, &LoadOptions::default()).expect("loads");
    let op_of: HashMap<&str, &str> = original
        .graph
        .node
        .iter()
        .map(|n| (n.name.as_str(), n.op.as_str()))
        .collect();
    let stage_ops: HashSet<&str> = plan["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .flat_map(|s| s["nodes"].as_array().expect("nodes").iter())
        .map(|n| op_of[n.as_str().expect("name")])
        .collect();
    for op in [
        "StringToHashBucketFast",
        "LookupTableFindV2",
        "Bucketize",
        "SparseCross",
        "Unique",
        "DeserializeSparse",
    ] {
        assert!(
            stage_ops.contains(op),
            "{op} is not on the data side: {stage_ops:?}"
        );
    }
    let training = load(&dir.join("training.pb"), &LoadOptions::default()).expect("training.pb");
    let training_ops: HashSet<&str> = training.graph.node.iter().map(|n| n.op.as_str()).collect();
    assert!(
        training_ops.contains("ResourceGather"),
        "embedding gathers stay with their variables"
    );
    assert!(!training_ops.contains("StringToHashBucketFast"));
    assert!(!training_ops.contains("IteratorV2"));
    // The names the program runs still resolve.
    let training_names: HashSet<&str> = training
        .graph
        .node
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    for name in [
        "MakeIterator",
        "init",
        "train_op",
        "loss",
        "IteratorGetNext",
    ] {
        assert!(
            training_names.contains(name),
            "{name} is gone from training.pb"
        );
    }
    // The source description for the dispatcher.
    let source = &plan["source"];
    assert_eq!(source["reader"], "tfrecord");
    assert_eq!(source["batch_size"], 32);
    assert_eq!(source["drop_remainder"], true);
    assert_eq!(source["batching"], "before_map");
    assert_eq!(source["repeat"], -1);
    assert_eq!(source["files"], serde_json::json!(["data/train.tfrecord"]));
    // The reader is replaced by an index-fed source; map and batch stay.
    assert_eq!(source["replaced_by"], "lode/DWSource");
    let stage0 = load(&dir.join("stage_0.pb"), &LoadOptions::default()).expect("stage_0.pb");
    let ops: HashSet<&str> = stage0.graph.node.iter().map(|n| n.op.as_str()).collect();
    assert!(
        ops.contains("DWSource") && ops.contains("DWSend"),
        "{ops:?}"
    );
    for gone in ["TensorSliceDataset", "FlatMapDataset", "RepeatDataset"] {
        assert!(!ops.contains(gone), "{gone} still in stage 0");
    }
    for kept in [
        "BatchDatasetV2",
        "MapDataset",
        "MakeIterator",
        "IteratorGetNext",
    ] {
        assert!(ops.contains(kept), "{kept} missing from stage 0");
    }
}

#[test]
fn the_simple_cut_moves_past_deserialize_sparse() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = partition(
        &fixtures().join("wide_deep/model.pb"),
        &tmp.path().join("plan"),
        &["--simple"],
    );
    let stage = &plan["stages"][0];
    let nodes: Vec<&str> = stage["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n.as_str().expect("name"))
        .collect();
    assert!(
        nodes.iter().any(|n| n.starts_with("DeserializeSparse")),
        "{nodes:?}"
    );
    for t in stage["send"]["tensors"].as_array().expect("send") {
        let dtype = t["dtype"].as_str().expect("dtype");
        assert!(
            !dtype.contains("VARIANT") && !dtype.contains("RESOURCE"),
            "{t}"
        );
    }
    // Nothing past the sparse tensors' reconstruction moved: no hashing on the data side.
    let original = load(
        &fixtures().join("wide_deep/model.pb"),
        &LoadOptions::default(),
    )
    .expect("loads");
    let op_of: HashMap<&str, &str> = original
        .graph
        .node
        .iter()
        .map(|n| (n.name.as_str(), n.op.as_str()))
        .collect();
    assert!(
        nodes.iter().all(|n| op_of[n] != "StringToHashBucketFast"),
        "the simple cut went too far"
    );
}

#[test]
fn deepfm_yields_a_cpu_stage_and_a_gpu_stage() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = partition(
        &fixtures().join("deepfm/model.pb"),
        &tmp.path().join("plan"),
        &[],
    );
    let devices: Vec<&str> = plan["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["device"].as_str().expect("device"))
        .collect();
    assert_eq!(devices[0], "CPU");
    assert!(devices.contains(&"GPU"), "{devices:?}");
    let gpu = plan["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .find(|s| s["device"] == "GPU")
        .expect("GPU stage");
    assert!(
        gpu["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .any(|n| n == "unique_ids"),
        "{gpu}"
    );
    // The GPU stage receives from the CPU stage.
    assert_eq!(gpu["recv"][0]["from_stage"], 0);
}

fn expect_failure(model: &Path, dir: &Path, extra: &[&str], problem: &str) {
    let out = partition_into(model, dir, extra);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(problem), "{}", stderr(&out));
    assert!(!dir.exists(), "a failed run left {}", dir.display());
    let parent = dir.parent().expect("parent");
    let leftovers: Vec<_> = std::fs::read_dir(parent)
        .expect("list")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("lode-tmp"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary directories left: {leftovers:?}"
    );
}

#[test]
fn graphs_that_cannot_be_partitioned_are_refused_cleanly() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A TF2 SavedModel whose train_step takes tensors: nothing to move.
    expect_failure(
        &fixtures().join("tf2_module/saved_model"),
        &tmp.path().join("a"),
        &[],
        "no input pipeline",
    );
    // No variables.
    let no_vars = tmp.path().join("no_vars.pbtxt");
    std::fs::write(&no_vars, "node { name: \"c\" op: \"Const\" attr { key: \"dtype\" value { type: DT_FLOAT } } attr { key: \"value\" value { tensor { dtype: DT_FLOAT float_val: 1 } } } }\n").expect("write");
    expect_failure(&no_vars, &tmp.path().join("b"), &[], "no model state");
    // An op TensorFlow does not know.
    let unknown = tmp.path().join("unknown.pbtxt");
    std::fs::write(&unknown, "node { name: \"v\" op: \"VarHandleOp\" attr { key: \"dtype\" value { type: DT_FLOAT } } attr { key: \"shape\" value { shape { } } } }\nnode { name: \"x\" op: \"MysteryOp\" input: \"v\" }\n").expect("write");
    expect_failure(&unknown, &tmp.path().join("c"), &[], "x (MysteryOp)");
}

#[test]
fn an_existing_plan_directory_is_not_overwritten() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("plan");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join("keep.txt"), b"mine").expect("write");
    let out = lode(&[
        "partition",
        fixtures().join("sgd_ref/model.pb").to_str().expect("path"),
        "-o",
        dir.to_str().expect("path"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("not empty"), "{}", stderr(&out));
    assert_eq!(std::fs::read(dir.join("keep.txt")).expect("kept"), b"mine");
}

/// `lode kernels` lists the production registry: TensorFlow ops only, not Lode's benchmark op.
#[test]
fn kernels_lists_the_registry() {
    let text = ok(&lode(&["kernels"]));
    let ops: Vec<&str> = text.lines().collect();
    for op in [
        "Const",
        "PreventGradient",
        "Max",
        "SegmentSum",
        "ParseExampleV2",
    ] {
        assert!(ops.contains(&op), "{op} missing from {ops:?}");
    }
    assert!(!ops.contains(&"LodeFixedLatency"));
    let json: Value =
        serde_json::from_str(&ok(&lode(&["kernels", "--format", "json"]))).expect("JSON");
    assert_eq!(json.as_array().map(Vec::len), Some(ops.len()));
}
