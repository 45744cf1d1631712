//! Property test: on random graphs mixing an input pipeline, variables and plain math, the
//! partition is a cover and no stage holds state or anything downstream of it.

use std::collections::{HashMap, HashSet};

use lode_decoupler::{decouple, Options};
use lode_proto::tf::attr_value::AttrValue;
use lode_proto::tf::function::FunctionDef;
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::op_def::op_def::ArgDef;
use lode_proto::tf::types::DataType;
use proptest::prelude::*;
use proptest::test_runner::{FailurePersistence, FileFailurePersistence};
use protobuf::EnumOrUnknown;

/// Failing cases are saved beside this file (`*.proptest-regressions`, to commit) and replayed
/// first; proptest's default cannot find an integration test's crate root.
fn saved() -> Option<Box<dyn FailurePersistence>> {
    Some(Box::new(FileFailurePersistence::WithSource(
        "proptest-regressions",
    )))
}

fn ty(t: DataType) -> AttrValue {
    let mut a = AttrValue::new();
    a.set_type(t);
    a
}

fn node(name: String, op: &str, inputs: Vec<String>) -> NodeDef {
    let mut n = NodeDef::new();
    n.name = name;
    n.op = op.into();
    n.input = inputs;
    n
}

/// Ops of the random part: (op, arity).
const OPS: &[(&str, usize)] = &[("Identity", 1), ("AddV2", 2), ("Mul", 2), ("Neg", 1)];

/// Kernel checks that each lack one op of [`OPS`] (in its order).
const WITHOUT: [fn(&str) -> bool; 4] = [
    |op| op != "Identity",
    |op| op != "AddV2",
    |op| op != "Mul",
    |op| op != "Neg",
];

/// A dataset factory `RangeDataset(start, stop, step) → RepeatDataset` in function-body
/// naming, as `make_one_shot_iterator` writes one.
fn factory(name: &str) -> FunctionDef {
    let mut f = FunctionDef::new();
    let sig = f.signature.mut_or_insert_default();
    sig.name = name.into();
    let mut out = ArgDef::new();
    out.name = "repeatdataset".into();
    out.type_ = EnumOrUnknown::new(DataType::DT_VARIANT);
    sig.output_arg.push(out);
    for (c, v) in [("start", 0), ("stop", 64), ("step", 1), ("count", -1)] {
        let mut k = node(c.into(), "Const", vec![]);
        k.attr.insert("dtype".into(), ty(DataType::DT_INT64));
        let mut t = lode_proto::tf::tensor::TensorProto::new();
        t.dtype = EnumOrUnknown::new(DataType::DT_INT64);
        t.int64_val = vec![v];
        let mut value = AttrValue::new();
        value.set_tensor(t);
        k.attr.insert("value".into(), value);
        f.node_def.push(k);
    }
    let range = node(
        "RangeDataset".into(),
        "RangeDataset",
        vec![
            "start:output:0".into(),
            "stop:output:0".into(),
            "step:output:0".into(),
        ],
    );
    let repeat = node(
        "RepeatDataset".into(),
        "RepeatDataset",
        vec!["RangeDataset:handle:0".into(), "count:output:0".into()],
    );
    f.node_def.push(range);
    f.node_def.push(repeat);
    f.ret
        .insert("repeatdataset".into(), "RepeatDataset:handle:0".into());
    f
}

/// Builds a graph: an iterator with `outputs` float outputs (a one-shot iterator over a
/// factory function when `one_shot`), `vars` resource variables read by ReadVariableOp, two
/// constants, then `picks` random math nodes over everything before them.
fn build(
    outputs: usize,
    vars: usize,
    picks: &[(usize, usize, usize, bool)],
    one_shot: bool,
) -> GraphDef {
    let mut g = GraphDef::new();
    let mut it = node(
        "iterator".into(),
        if one_shot {
            "OneShotIterator"
        } else {
            "IteratorV2"
        },
        vec![],
    );
    if one_shot {
        let mut f = AttrValue::new();
        f.mut_func().name = "factory".into();
        it.attr.insert("dataset_factory".into(), f);
        g.library
            .mut_or_insert_default()
            .function
            .push(factory("factory"));
    }
    let mut types = AttrValue::new();
    types.mut_list().type_ = vec![EnumOrUnknown::new(DataType::DT_FLOAT); outputs];
    it.attr.insert("output_types".into(), types.clone());
    let mut shapes = AttrValue::new();
    shapes.mut_list().shape = vec![Default::default(); outputs];
    it.attr.insert("output_shapes".into(), shapes.clone());
    g.node.push(it);
    let mut next = node(
        "get_next".into(),
        "IteratorGetNext",
        vec!["iterator".into()],
    );
    next.attr.insert("output_types".into(), types);
    next.attr.insert("output_shapes".into(), shapes);
    g.node.push(next);
    let mut tensors: Vec<String> = (0..outputs).map(|i| format!("get_next:{i}")).collect();
    for v in 0..vars {
        let mut h = node(format!("var{v}"), "VarHandleOp", vec![]);
        h.attr.insert("dtype".into(), ty(DataType::DT_FLOAT));
        h.attr.insert("shape".into(), {
            let mut a = AttrValue::new();
            a.set_shape(Default::default());
            a
        });
        g.node.push(h);
        let mut r = node(
            format!("read{v}"),
            "ReadVariableOp",
            vec![format!("var{v}")],
        );
        r.attr.insert("dtype".into(), ty(DataType::DT_FLOAT));
        g.node.push(r);
        tensors.push(format!("read{v}"));
    }
    for c in 0..2 {
        let mut k = node(format!("const{c}"), "Const", vec![]);
        k.attr.insert("dtype".into(), ty(DataType::DT_FLOAT));
        let mut t = lode_proto::tf::tensor::TensorProto::new();
        t.dtype = EnumOrUnknown::new(DataType::DT_FLOAT);
        t.float_val = vec![1.0];
        let mut v = AttrValue::new();
        v.set_tensor(t);
        k.attr.insert("value".into(), v);
        g.node.push(k);
        tensors.push(format!("const{c}"));
    }
    for (i, &(op, a, b, gpu)) in picks.iter().enumerate() {
        let (op, arity) = OPS[op % OPS.len()];
        let mut inputs = vec![tensors[a % tensors.len()].clone()];
        if arity == 2 {
            inputs.push(tensors[b % tensors.len()].clone());
        }
        let mut n = node(format!("n{i}"), op, inputs);
        n.attr.insert("T".into(), ty(DataType::DT_FLOAT));
        if gpu {
            n.device = "/device:GPU:0".into();
        }
        g.node.push(n);
        tensors.push(format!("n{i}"));
    }
    g
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: saved(), ..ProptestConfig::default() })]

    #[test]
    fn partition_is_a_cover_and_stages_hold_no_state(
        outputs in 1usize..4,
        vars in 1usize..3,
        picks in proptest::collection::vec((0usize..8, 0usize..64, 0usize..64, proptest::bool::weighted(0.2)), 1..40),
        simple in any::<bool>(),
        one_shot in any::<bool>(),
        without in proptest::option::of(0usize..OPS.len()),
    ) {
        let g = build(outputs, vars, &picks, one_shot);
        let bytes = protobuf::Message::write_to_bytes(&g).expect("encodes");
        let view = lode_proto::view::GraphView::parse(&bytes).expect("view");
        let out = decouple(&view, &Options { simple, stateful_ops: vec![], kernels: without.map(|w| WITHOUT[w]) }).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let plan = &out.plan;
        // Downstream of state, computed here independently.
        let by_name: HashMap<&str, &NodeDef> = g.node.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut downstream: HashSet<String> = g.node.iter().filter(|n| n.op == "VarHandleOp").map(|n| n.name.clone()).collect();
        loop {
            let before = downstream.len();
            for n in &g.node {
                if n.input.iter().any(|i| downstream.contains(i.trim_start_matches('^').split(':').next().unwrap_or(""))) {
                    downstream.insert(n.name.clone());
                }
            }
            if downstream.len() == before { break; }
        }
        let training_graph: GraphDef = lode_proto::io::decode_binary(&out.graphs[0].1).expect("training graph decodes");
        let training: HashSet<&str> = training_graph.node.iter().map(|n| n.name.as_str()).collect();
        let copied: HashSet<&str> = plan.copied.iter().map(String::as_str).collect();
        // The nodes a one-shot iterator's normalization added, as plan.json lists them.
        prop_assert_eq!(plan.inlined.len(), usize::from(one_shot));
        let inlined: HashSet<&str> = plan.inlined.iter().flat_map(|i| i.nodes.iter().chain([&i.make_iterator])).map(String::as_str).collect();
        let mut stage_of: HashMap<&str, usize> = HashMap::new();
        for stage in &plan.stages {
            for name in &stage.nodes {
                prop_assert!(stage_of.insert(name, stage.index).is_none(), "{name} in two stages");
                prop_assert!(!downstream.contains(name), "{name} is downstream of state but in stage {}", stage.index);
                prop_assert!(by_name.contains_key(name.as_str()) || inlined.contains(name.as_str()), "{name} is neither original nor inlined");
            }
        }
        for name in &inlined {
            let in_training = training.contains(name) && !plan.stubs.contains_key(*name);
            prop_assert!(usize::from(stage_of.contains_key(name)) + usize::from(in_training) == 1, "inlined {name} is not in exactly one place");
        }
        if one_shot {
            prop_assert!(plan.source.as_ref().is_some_and(|s| s.chain == ["RangeDataset", "RepeatDataset"]), "{:?}", plan.source);
        }
        for n in &g.node {
            let in_stage = stage_of.contains_key(n.name.as_str());
            let in_training = training.contains(n.name.as_str());
            let stubbed = plan.stubs.contains_key(&n.name);
            let places = usize::from(in_stage) + usize::from(in_training && !stubbed);
            let copy = copied.contains(n.name.as_str());
            // A copied node is listed once, in `copied` (its copies sit in several graphs);
            // every other node is in exactly one stage's list or in the training graph.
            if copy {
                prop_assert!(!in_stage, "{} is copied but also listed by a stage", n.name);
            } else {
                prop_assert!(places == 1, "{} ({}) is in {} places", n.name, n.op, places);
            }
            if downstream.contains(&n.name) {
                prop_assert!(in_training, "{} is downstream of state but not in training", n.name);
            }
        }
        // The kernel-aware cut: no stage node lacks a kernel or reads (transitively, on the
        // data side) a node that does; whatever the cut kept is accounted for.
        if let Some(w) = without {
            let missing = OPS[w].0;
            let mut needs: HashSet<&str> = HashSet::new();
            for n in &g.node {
                let reads_missing = n.input.iter().any(|i| {
                    let base = i.trim_start_matches('^').split(':').next().unwrap_or("");
                    needs.contains(base) || by_name.get(base).is_some_and(|m| m.op == missing)
                });
                if n.op == missing || reads_missing {
                    needs.insert(n.name.as_str());
                }
            }
            for name in stage_of.keys() {
                prop_assert!(!needs.contains(name), "{name} is in a stage but needs {missing}");
            }
            for limit in &plan.kernel_limits {
                prop_assert_eq!(&limit.op, missing);
                prop_assert!(limit.kept_in_training >= limit.nodes.len());
            }
        }
        // Only plain tensors cross.
        for stage in &plan.stages {
            for t in &stage.send.tensors {
                prop_assert!(!t.dtype.contains("VARIANT") && !t.dtype.contains("RESOURCE") && !t.dtype.contains("_REF"), "{} crosses as {}", t.tensor, t.dtype);
            }
        }
    }
}
