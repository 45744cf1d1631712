//! The op registry's tests: every entry builds, the lists derived from the table agree.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use lode_proto::ops::OpRegistry;

use super::*;

/// The registry is the only list: every other list of ops is derived from it or checked
/// against it here, so they cannot drift apart.
#[test]
fn one_registry_without_duplicates_or_strangers() {
    let mut seen = HashSet::new();
    for k in KERNELS.iter().chain(crate::synthetic::KERNELS) {
        assert!(seen.insert(k.op), "{} is registered twice", k.op);
    }
    let tf = OpRegistry::tensorflow();
    for op in supported() {
        assert!(tf.get(op).is_some(), "{op} is not a TensorFlow 2.18 op");
        assert!(has_kernel(op));
    }
    for k in crate::synthetic::KERNELS {
        assert!(
            tf.get(k.op).is_none(),
            "benchmark op {} is TensorFlow's",
            k.op
        );
        assert!(!has_kernel(k.op), "benchmark op {} is in production", k.op);
        assert!(kernel(k.op).is_some(), "a synthetic stage must still load");
    }
    for op in TABLE_INITIALIZERS {
        assert!(has_kernel(op), "table initializer {op} has no kernel");
    }
    for op in PLUMBING {
        assert!(!has_kernel(op), "plumbing op {op} is also a kernel");
    }
    assert_eq!(supported().count(), KERNELS.len());
}

/// Attribute values the kernels do not support are refused when the stage loads (naming
/// the node), not at the first step: ragged rank 2, a non-UTF-8 input encoding.
#[test]
fn unsupported_attributes_are_refused_at_load() {
    use lode_proto::tf::attr_value::attr_value::ListValue;
    use lode_proto::tf::attr_value::AttrValue;
    let library = HashMap::new();
    let tables = Mutex::new(HashMap::new());
    let ctx = BuildCtx {
        library: &library,
        data_root: std::path::Path::new("."),
        tables: &tables,
    };
    let mut rtt = NodeDef::new();
    rtt.name = "to_tensor".into();
    rtt.op = "RaggedTensorToTensor".into();
    let mut types = AttrValue::new();
    let mut list = ListValue::new();
    list.s = vec![b"ROW_SPLITS".to_vec(), b"ROW_SPLITS".to_vec()];
    types.set_list(list);
    rtt.attr.insert("row_partition_types".into(), types);
    let mut n = AttrValue::new();
    n.set_i(2);
    rtt.attr.insert("num_row_partition_tensors".into(), n);
    let err = build(&rtt, &ctx).expect_err("ragged rank 2 is refused");
    assert!(err.to_string().contains("node to_tensor"), "{err}");
    assert!(err.to_string().contains("ragged rank 1"), "{err}");

    let mut decode = NodeDef::new();
    decode.name = "decode".into();
    decode.op = "UnicodeDecode".into();
    let mut enc = AttrValue::new();
    enc.set_s(b"UTF-16-BE".to_vec());
    decode.attr.insert("input_encoding".into(), enc);
    let err = build(&decode, &ctx).expect_err("UTF-16 input is refused");
    assert!(err.to_string().contains("only UTF-8 input"), "{err}");
}

/// `build` finds exactly the registry's ops: each is built (or refuses its missing
/// attributes), and an op outside the registry has no kernel.
#[test]
fn build_dispatches_through_the_registry() {
    let library = HashMap::new();
    let tables = Mutex::new(HashMap::new());
    let ctx = BuildCtx {
        library: &library,
        data_root: std::path::Path::new("."),
        tables: &tables,
    };
    let node = |op: &str| {
        let mut n = NodeDef::new();
        n.name = "n".into();
        n.op = op.into();
        n
    };
    for k in KERNELS.iter().chain(crate::synthetic::KERNELS) {
        assert!(
            !matches!(build(&node(k.op), &ctx), Ok(None)),
            "{} is registered but not built",
            k.op
        );
    }
    for op in ["Expm1", "SparseSegmentSumGrad", "Identityx", ""] {
        assert!(matches!(build(&node(op), &ctx), Ok(None)), "{op}");
        assert!(!has_kernel(op), "{op}");
    }
}
