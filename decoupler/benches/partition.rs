//! `lode partition`'s work on synthetic training graphs of 10k, 100k and 1M nodes: load the
//! file, partition, rewrite and write the plan directory.
//!
//! The graph: an iterator with four outputs, then a data-side half (a chain of math over the
//! iterator's outputs), then a training half (math mixing variables with the last 16 data-side
//! tensors, so 16 tensors cross).
//!
//! Run: `cargo bench -p lode-decoupler --bench partition`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lode_proto::io::{load_graph_bytes, LoadOptions};
use lode_proto::tf::attr_value::AttrValue;
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::types::DataType;
use protobuf::{EnumOrUnknown, Message};

fn ty(t: DataType) -> AttrValue {
    let mut a = AttrValue::new();
    a.set_type(t);
    a
}

fn synthetic(nodes: usize) -> GraphDef {
    let mut g = GraphDef::new();
    let float = ty(DataType::DT_FLOAT);
    let mut types = AttrValue::new();
    types.mut_list().type_ = vec![EnumOrUnknown::new(DataType::DT_FLOAT); 4];
    let mut shapes = AttrValue::new();
    shapes.mut_list().shape = vec![Default::default(); 4];
    let mut push = |name: String, op: &str, inputs: Vec<String>, attrs: Vec<(&str, AttrValue)>| {
        let mut n = NodeDef::new();
        n.name = name;
        n.op = op.into();
        n.input = inputs;
        for (k, v) in attrs {
            n.attr.insert(k.into(), v);
        }
        g.node.push(n);
    };
    push(
        "iterator".into(),
        "IteratorV2",
        vec![],
        vec![
            ("output_types", types.clone()),
            ("output_shapes", shapes.clone()),
        ],
    );
    push(
        "get_next".into(),
        "IteratorGetNext",
        vec!["iterator".into()],
        vec![("output_types", types), ("output_shapes", shapes)],
    );
    let half = nodes / 2;
    let mut data: Vec<String> = (0..4).map(|i| format!("get_next:{i}")).collect();
    for i in 0..half {
        let name = format!("features/block_{}/op_{i}", i / 100);
        let a = data[data.len() - 1].clone();
        let b = data[(i * 7) % data.len()].clone();
        push(
            name.clone(),
            if i % 2 == 0 { "AddV2" } else { "Mul" },
            vec![a, b],
            vec![("T", float.clone())],
        );
        data.push(name);
    }
    let mut model: Vec<String> = Vec::new();
    for i in 0..(nodes - half - 2) {
        let name = format!("model/layer_{}/op_{i}", i / 100);
        if i % 10 == 0 {
            let shape = {
                let mut a = AttrValue::new();
                a.set_shape(Default::default());
                a
            };
            push(
                format!("{name}/var"),
                "VarHandleOp",
                vec![],
                vec![("dtype", float.clone()), ("shape", shape)],
            );
            push(
                name.clone(),
                "ReadVariableOp",
                vec![format!("{name}/var")],
                vec![("dtype", float.clone())],
            );
        } else {
            let a = model.last().cloned().unwrap_or_else(|| data[0].clone());
            // The model reads the feature section's last 16 outputs, as real models read a
            // handful of feature tensors.
            let b = data[data.len() - 1 - (i % 16)].clone();
            push(
                name.clone(),
                "AddV2",
                vec![a, b],
                vec![("T", float.clone())],
            );
        }
        model.push(name);
    }
    g
}

fn partition(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("partition");
    group.sample_size(10);
    for nodes in [10_000usize, 100_000, 1_000_000] {
        let path = dir.path().join(format!("synthetic_{nodes}.pb"));
        std::fs::write(&path, synthetic(nodes).write_to_bytes().expect("encodes")).expect("write");
        group.throughput(Throughput::Elements(nodes as u64));
        let mut run = 0;
        group.bench_with_input(BenchmarkId::from_parameter(nodes), &path, |b, path| {
            b.iter(|| {
                let (_, bytes) = load_graph_bytes(path, &LoadOptions::default()).expect("loads");
                let view = lode_proto::view::GraphView::parse(&bytes).expect("parses");
                let out = lode_decoupler::decouple(&view, &lode_decoupler::Options::default())
                    .expect("partitions");
                run += 1;
                let plan_dir = dir.path().join(format!("plan_{nodes}_{run}"));
                lode_decoupler::plan::write_dir(
                    &plan_dir,
                    &out.graphs,
                    &out.plan,
                    &out.report,
                    &out.dot,
                )
                .expect("writes");
                std::fs::remove_dir_all(&plan_dir).expect("cleanup");
            });
        });
    }
    group.finish();
}

criterion_group!(benches, partition);
criterion_main!(benches);
