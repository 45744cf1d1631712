//! One-shot iterators (`make_one_shot_iterator`, fixtures/one_shot): `lode partition` inlines
//! the iterator's dataset factory, so the plan finds its source as for an initializable
//! iterator and stays a cover of the original graph, and its stage runs in `lode exec`,
//! yielding exactly the batches of the initializable `adam_resource` program over the same
//! records. Equality with TensorFlow's own tensors and losses is checked under the pinned
//! TensorFlow by tests/conformance (exec_equivalence.py, partition_equivalence.py).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use lode_proto::plan::Plan;
use lode_proto::tf::graph::GraphDef;

use crate::support::{fixtures, lode, ok};

fn partition(model: &str, plan: &Path) -> Plan {
    ok(&lode(&[
        "partition",
        fixtures()
            .join(model)
            .join("model.pb")
            .to_str()
            .expect("UTF-8"),
        "-o",
        plan.to_str().expect("UTF-8"),
    ]));
    serde_json::from_slice(&std::fs::read(plan.join("plan.json")).expect("plan.json"))
        .expect("a plan")
}

fn graph(path: &Path) -> GraphDef {
    lode_proto::io::decode_binary(&std::fs::read(path).expect("read a graph")).expect("a GraphDef")
}

#[test]
fn a_one_shot_plan_finds_its_source_and_covers_the_original_graph() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = partition("one_shot", &tmp.path().join("plan"));
    let reference = partition("adam_resource", &tmp.path().join("reference"));
    let original = graph(&fixtures().join("one_shot/model.pb"));

    let [inlined] = plan.inlined.as_slice() else {
        panic!("one inlined iterator expected: {:?}", plan.inlined);
    };
    assert_eq!(inlined.iterator, "OneShotIterator");
    assert!(
        inlined.function.starts_with("_make_dataset_"),
        "{inlined:?}"
    );
    assert_eq!(inlined.make_iterator, "OneShotIterator/lode_make_iterator");
    assert_eq!(
        plan.summary.nodes,
        original.node.len() + inlined.nodes.len() + 1
    );

    // The source is found inside the factory, exactly as for the initializable program.
    let source = plan.source.as_ref().expect("a source");
    let want = reference.source.as_ref().expect("a reference source");
    assert_eq!(source.reader, "tfrecord");
    assert_eq!(source.files, vec!["data/train.tfrecord"]);
    assert_eq!(source.chain, want.chain);
    assert_eq!(
        (source.batch_size, source.drop_remainder, source.repeat),
        (Some(32), Some(true), Some(-1))
    );
    assert_eq!(source.batching, want.batching);
    assert_eq!(source.replaced_by.as_deref(), Some("lode/DWSource"));
    assert!(source
        .replaced
        .iter()
        .all(|n| n.starts_with("OneShotIterator/dataset_factory/")));

    // Cover: every original node once (a stage, the training graph or copied); every new
    // name is one the plan says it added.
    let training = graph(&tmp.path().join("plan/training.pb"));
    let in_training: HashSet<&str> = training.node.iter().map(|n| n.name.as_str()).collect();
    let added: HashSet<&str> = inlined
        .nodes
        .iter()
        .chain([&inlined.make_iterator])
        .map(String::as_str)
        .collect();
    let names: HashSet<&str> = original.node.iter().map(|n| n.name.as_str()).collect();
    let mut stage_of: HashMap<&str, usize> = HashMap::new();
    for stage in &plan.stages {
        for name in &stage.nodes {
            assert!(stage_of.insert(name, stage.index).is_none(), "{name} twice");
            assert!(
                names.contains(name.as_str()) || added.contains(name.as_str()),
                "{name} is neither original nor inlined"
            );
        }
    }
    assert_eq!(stage_of.get("OneShotIterator"), Some(&0));
    assert_eq!(stage_of.get(inlined.make_iterator.as_str()), Some(&0));
    let copied: HashSet<&str> = plan.copied.iter().map(String::as_str).collect();
    for n in &original.node {
        let name = n.name.as_str();
        let places = usize::from(stage_of.contains_key(name))
            + usize::from(in_training.contains(name) && !plan.stubs.contains_key(name));
        assert!(
            copied.contains(name) || places == 1,
            "{name} ({}) is in {places} places",
            n.op
        );
    }
    // The program's names resolve; nothing refers to the one-shot form or its factory.
    assert!(plan.stubs.contains_key("IteratorGetNext"));
    assert!(plan.stubs.contains_key(inlined.make_iterator.as_str()));
    for file in
        std::iter::once("training.pb".to_owned()).chain(plan.stages.iter().map(|s| s.graph.clone()))
    {
        let g = graph(&tmp.path().join("plan").join(&file));
        assert!(g.node.iter().all(|n| n.op != "OneShotIterator"), "{file}");
        assert!(
            g.library
                .function
                .iter()
                .all(|f| f.signature.name != inlined.function),
            "{file} still carries the factory"
        );
    }
}

#[test]
fn a_one_shot_stage_yields_the_batches_of_the_initializable_program() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // 256 records in batches of 32: ten steps cross the epoch boundary.
    let steps = "10";
    let mut dumps = Vec::new();
    for model in ["one_shot", "adam_resource"] {
        let plan = tmp.path().join(format!("plan-{model}"));
        partition(model, &plan);
        let dump = tmp.path().join(format!("dump-{model}"));
        ok(&lode(&[
            "exec",
            plan.to_str().expect("UTF-8"),
            "--stage",
            "0",
            "--steps",
            steps,
            "--dump",
            dump.to_str().expect("UTF-8"),
        ]));
        dumps.push(dump);
    }
    for step in 0..10 {
        let dir = |d: &Path| d.join(format!("step_{step}"));
        let mut files: Vec<_> = std::fs::read_dir(dir(&dumps[0]))
            .expect("a dumped step")
            .map(|e| e.expect("entry").file_name())
            .collect();
        files.sort();
        assert_eq!(files.len(), 2, "x and y at step {step}");
        for f in files {
            assert_eq!(
                std::fs::read(dir(&dumps[0]).join(&f)).expect("read"),
                std::fs::read(dir(&dumps[1]).join(&f)).expect("read"),
                "step {step} tensor {f:?}"
            );
        }
    }
}

#[test]
fn a_missing_or_broken_factory_is_one_line_naming_iterator_and_function() {
    use lode_proto::io::{encode_graph, GraphEncoding};
    let tmp = tempfile::tempdir().expect("tempdir");
    let original = graph(&fixtures().join("one_shot/model.pb"));
    let factory = |g: &mut GraphDef| -> String {
        let f = g
            .library
            .mut_or_insert_default()
            .function
            .iter_mut()
            .find(|f| f.signature.name.starts_with("_make_dataset_"))
            .expect("the fixture's factory");
        let name = f.signature.name.clone();
        f.node_def[0].input.push("nowhere:output:0".into());
        name
    };
    let mut missing = original.clone();
    let mut name = String::new();
    missing
        .library
        .mut_or_insert_default()
        .function
        .retain(|f| {
            let keep = !f.signature.name.starts_with("_make_dataset_");
            if !keep {
                name.clone_from(&f.signature.name);
            }
            keep
        });
    let mut broken = original.clone();
    let broken_name = factory(&mut broken);
    for (label, g, function, why) in [
        ("missing", missing, name, "no function of that name"),
        ("broken", broken, broken_name, "nowhere"),
    ] {
        let model = tmp.path().join(format!("{label}.pb"));
        let bytes = encode_graph(&g, GraphEncoding::Binary).expect("encodes");
        std::fs::write(&model, bytes).expect("write");
        let out = lode(&[
            "partition",
            model.to_str().expect("UTF-8"),
            "-o",
            tmp.path().join(label).to_str().expect("UTF-8"),
        ]);
        let err = crate::support::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{label}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{label}: one line: {err}"
        );
        for needle in ["'OneShotIterator'", function.as_str(), why] {
            assert!(
                err.contains(needle),
                "{label}: {needle:?} missing from: {err}"
            );
        }
        assert!(
            !tmp.path().join(label).exists(),
            "{label}: no plan is written"
        );
    }
}
