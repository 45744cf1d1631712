//! Load time of synthetic GraphDefs of 10k, 100k and 1M nodes: file read, binary decode and the
//! graph checks, as `lode inspect` does them. Throughput is in nodes per second; equal
//! throughput at every size shows that loading is linear in the graph's size.
//!
//! Run: `cargo bench -p lode-proto --bench load`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lode_proto::io::{self, LoadOptions};
use lode_proto::tf::attr_value::AttrValue;
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::node_def::NodeDef;
use lode_proto::tf::tensor::TensorProto;
use lode_proto::tf::types::DataType;
use protobuf::{EnumOrUnknown, Message};

/// A graph shaped like real training graphs: name scopes, a type attribute on every node, small
/// constant tensors, two data inputs and now and then a control input.
fn synthetic_graph(nodes: usize) -> GraphDef {
    let mut graph = GraphDef::new();
    graph.node.reserve(nodes);
    let mut float = AttrValue::new();
    float.set_type(DataType::DT_FLOAT);
    for i in 0..nodes {
        let mut node = NodeDef::new();
        node.name = format!("tower_{}/layer_{}/op_{i}", i / 10_000, i / 100);
        node.device = "/device:CPU:0".into();
        if i < 2 || i % 5 == 0 {
            node.op = "Const".into();
            let mut tensor = TensorProto::new();
            tensor.dtype = EnumOrUnknown::new(DataType::DT_FLOAT);
            tensor.float_val = vec![0.5, 1.5];
            let mut value = AttrValue::new();
            value.set_tensor(tensor);
            node.attr.insert("value".into(), value);
            node.attr.insert("dtype".into(), float.clone());
        } else {
            node.op = if i % 2 == 0 { "AddV2" } else { "Mul" }.into();
            node.input.push(graph.node[i - 1].name.clone());
            node.input.push(format!("{}:0", graph.node[i / 2].name));
            if i % 50 == 0 {
                node.input.push(format!("^{}", graph.node[i - 2].name));
            }
            node.attr.insert("T".into(), float.clone());
        }
        graph.node.push(node);
    }
    graph
}

fn load(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("load_graphdef");
    group.sample_size(10);
    for nodes in [10_000usize, 100_000, 1_000_000] {
        let path = dir.path().join(format!("synthetic_{nodes}.pb"));
        let bytes = synthetic_graph(nodes).write_to_bytes().expect("encodes");
        std::fs::write(&path, &bytes).expect("write");
        group.throughput(Throughput::Elements(nodes as u64));
        group.bench_with_input(BenchmarkId::from_parameter(nodes), &path, |b, path| {
            b.iter(|| {
                let model = io::load(path, &LoadOptions::default()).expect("loads");
                assert_eq!(model.graph.node.len(), nodes);
                model
            });
        });
    }
    group.finish();
}

criterion_group!(benches, load);
criterion_main!(benches);
