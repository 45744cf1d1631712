//! The kernel-aware cut on a graph TensorFlow wrote (fixtures/text_segments), with a kernel
//! check that lacks `Max` and `SegmentSum`: each stays in training with what depends on it on
//! the data side, and the plan says how much each kept.

use std::collections::HashSet;
use std::path::PathBuf;

use lode_decoupler::{decouple, Options};
use lode_proto::view::GraphView;

fn without_max_and_segment_sum(op: &str) -> bool {
    !matches!(op, "Max" | "SegmentSum")
}

#[test]
fn nodes_without_a_kernel_and_their_dependents_stay_in_training() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/text_segments/model.pb");
    let bytes = std::fs::read(&path).expect("fixture");
    let view = GraphView::parse(&bytes).expect("view");
    let all = decouple(&view, &Options::default()).expect("cut");
    let limited = decouple(
        &view,
        &Options {
            kernels: Some(without_max_and_segment_sum),
            ..Options::default()
        },
    )
    .expect("cut");
    assert!(all.plan.kernel_limits.is_empty());
    let stage = |plan: &lode_proto::plan::Plan| -> HashSet<String> {
        plan.stages
            .iter()
            .flat_map(|s| s.nodes.iter().cloned())
            .collect()
    };
    let (before, after) = (stage(&all.plan), stage(&limited.plan));
    let kept: HashSet<&String> = before.difference(&after).collect();
    assert!(after.is_subset(&before));
    let ops: Vec<&str> = limited
        .plan
        .kernel_limits
        .iter()
        .map(|l| l.op.as_str())
        .collect();
    assert_eq!(ops, ["Max", "SegmentSum"]);
    let max = &limited.plan.kernel_limits[0];
    assert_eq!(
        max.nodes,
        ["StringSplit/RaggedFromValueRowIds/RowPartitionFromValueRowIds/bincount/Max"]
    );
    // The Max, and what reads it on the data side: the bincount built from it and the row
    // partition's checks.
    assert!(max.kept_in_training > 1, "{max:?}");
    assert!(
        kept.iter().any(|n| n.ends_with("bincount/DenseBincount")),
        "{kept:?}"
    );
    let segment_sum = &limited.plan.kernel_limits[1];
    assert_eq!(segment_sum.kept_in_training, 1);
    // Each op's count is what it keeps alone (the two do not overlap here); the stages also
    // lose the input-independent nodes only the kept nodes read.
    let counted: usize = limited
        .plan
        .kernel_limits
        .iter()
        .map(|l| l.kept_in_training)
        .sum();
    assert!(kept.len() >= counted, "{} < {counted}", kept.len());
    let data_side = (max.kept_in_training as f64) / max.share_of_data_side;
    assert!((data_side - data_side.round()).abs() < 1e-9);
    assert!(limited
        .report
        .contains("ops without a data-worker kernel limited the cut"));
}

/// A graph whose data-side node `call` calls function `f0`, which calls `f1` … `f{n-1}`, whose
/// body uses `Expm1`.
fn calling_graph(n: usize) -> Vec<u8> {
    use lode_proto::tf::attr_value::AttrValue;
    use lode_proto::tf::function::FunctionDef;
    use lode_proto::tf::graph::GraphDef;
    use lode_proto::tf::node_def::NodeDef;
    use lode_proto::tf::op_def::op_def::ArgDef;
    use lode_proto::tf::types::DataType;
    use protobuf::EnumOrUnknown;
    let node = |name: &str, op: &str, inputs: &[&str]| {
        let mut d = NodeDef::new();
        d.name = name.into();
        d.op = op.into();
        d.input = inputs.iter().map(|s| (*s).to_owned()).collect();
        d
    };
    let ty = |t: DataType| {
        let mut a = AttrValue::new();
        a.set_type(t);
        a
    };
    let mut types = AttrValue::new();
    types.mut_list().type_ = vec![EnumOrUnknown::new(DataType::DT_FLOAT)];
    let mut shapes = AttrValue::new();
    shapes.mut_list().shape = vec![Default::default()];
    let mut g = GraphDef::new();
    let mut it = node("iterator", "IteratorV2", &[]);
    it.attr.insert("output_types".into(), types.clone());
    it.attr.insert("output_shapes".into(), shapes.clone());
    let mut next = node("get_next", "IteratorGetNext", &["iterator"]);
    next.attr.insert("output_types".into(), types);
    next.attr.insert("output_shapes".into(), shapes);
    let mut var = node("var", "VarHandleOp", &[]);
    var.attr.insert("dtype".into(), ty(DataType::DT_FLOAT));
    let mut read = node("read", "ReadVariableOp", &["var"]);
    read.attr.insert("dtype".into(), ty(DataType::DT_FLOAT));
    let mut add = node("add", "AddV2", &["call", "read"]);
    add.attr.insert("T".into(), ty(DataType::DT_FLOAT));
    g.node = vec![it, next, var, read, node("call", "f0", &["get_next"]), add];
    for i in 0..n {
        let mut f = FunctionDef::new();
        let sig = f.signature.mut_or_insert_default();
        sig.name = format!("f{i}");
        let arg = |name: &str| {
            let mut a = ArgDef::new();
            a.name = name.into();
            a.type_ = EnumOrUnknown::new(DataType::DT_FLOAT);
            a
        };
        sig.input_arg.push(arg("x"));
        sig.output_arg.push(arg("y"));
        let op = if i + 1 == n {
            "Expm1".to_owned()
        } else {
            format!("f{}", i + 1)
        };
        f.node_def.push(node("n", &op, &["x"]));
        f.ret.insert("y".into(), "n:y:0".into());
        g.library.mut_or_insert_default().function.push(f);
    }
    protobuf::Message::write_to_bytes(&g).expect("encodes")
}

fn without_expm1(op: &str) -> bool {
    op != "Expm1"
}

/// A function body op without a kernel makes the calling node unrunnable, through any chain
/// of calls; a chain deeper than the cut follows is unrunnable too (and costs no stack).
#[test]
fn a_called_function_without_a_kernel_keeps_its_caller_in_training() {
    for (n, op) in [(3, "Expm1"), (10_000, lode_decoupler::kernels::TOO_DEEP)] {
        let bytes = calling_graph(n);
        let view = GraphView::parse(&bytes).expect("view");
        let out = decouple(
            &view,
            &Options {
                kernels: Some(without_expm1),
                ..Options::default()
            },
        )
        .expect("cut");
        let limits = &out.plan.kernel_limits;
        assert_eq!(limits.len(), 1, "{limits:?}");
        assert_eq!(
            (limits[0].op.as_str(), limits[0].nodes.as_slice()),
            (op, &["call".to_owned()][..])
        );
        assert!(out
            .plan
            .stages
            .iter()
            .all(|s| !s.nodes.contains(&"call".to_owned())));
    }
}

fn without_iterator_get_next(op: &str) -> bool {
    op != "IteratorGetNext"
}

/// When nothing of the input pipeline can run on a data worker, the plan has no stage and
/// the training graph is the whole graph (it runs, unchanged, on the training side).
#[test]
fn a_pipeline_without_kernels_leaves_no_stage() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/sgd_ref/model.pb");
    let bytes = std::fs::read(&path).expect("fixture");
    let view = GraphView::parse(&bytes).expect("view");
    let out = decouple(
        &view,
        &Options {
            kernels: Some(without_iterator_get_next),
            ..Options::default()
        },
    );
    let out = out.expect("cut");
    assert_eq!(out.plan.kernel_limits[0].op, "IteratorGetNext");
    assert!(out.plan.stages.is_empty(), "{:?}", out.plan.stages);
}
