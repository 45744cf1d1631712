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
