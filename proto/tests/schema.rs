//! Lode's own .proto files against TensorFlow's schema: every field of every message reachable
//! from GraphDef, MetaGraphDef and SavedModel has TensorFlow's number, name, type, label and
//! type name, and every enum TensorFlow's values. The expected facts come from TensorFlow
//! 2.18.1's generated descriptors (fixtures/gen/schema.py wrote fixtures/tf_schema.json), so
//! fields no fixture happens to use are checked too.

use std::path::PathBuf;

use lode_proto::tf;
use protobuf::reflect::{FileDescriptor, MessageDescriptor};
use serde_json::Value;

fn lode_files() -> Vec<FileDescriptor> {
    vec![
        tf::attr_value::file_descriptor().clone(),
        tf::full_type::file_descriptor().clone(),
        tf::function::file_descriptor().clone(),
        tf::graph::file_descriptor().clone(),
        tf::graph_debug_info::file_descriptor().clone(),
        tf::meta_graph::file_descriptor().clone(),
        tf::node_def::file_descriptor().clone(),
        tf::op_def::file_descriptor().clone(),
        tf::resource_handle::file_descriptor().clone(),
        tf::saved_model::file_descriptor().clone(),
        tf::saved_object_graph::file_descriptor().clone(),
        tf::saver::file_descriptor().clone(),
        tf::structured::file_descriptor().clone(),
        tf::tensor::file_descriptor().clone(),
        tf::tensor_shape::file_descriptor().clone(),
        tf::trackable_object_graph::file_descriptor().clone(),
        tf::types::file_descriptor().clone(),
        tf::variable::file_descriptor().clone(),
        tf::versions::file_descriptor().clone(),
    ]
}

fn tensorflow_schema() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tf_schema.json");
    let text = std::fs::read_to_string(&path).expect("fixtures/tf_schema.json");
    serde_json::from_str(&text).expect("tf_schema.json is JSON")
}

fn find_message(files: &[FileDescriptor], name: &str) -> Option<MessageDescriptor> {
    files
        .iter()
        .find_map(|f| f.message_by_full_name(&format!(".{name}")))
}

#[test]
fn every_message_matches_tensorflow() {
    let schema = tensorflow_schema();
    assert_eq!(schema["tensorflow"], "2.18.1");
    let files = lode_files();
    let messages = schema["messages"].as_object().expect("messages");
    let mut problems = Vec::new();
    let mut checked_fields = 0;
    for (name, fields) in messages {
        if name.starts_with("google.protobuf.") {
            continue; // well-known types come from rust-protobuf itself
        }
        let Some(lode) = find_message(&files, name) else {
            problems.push(format!("{name}: not declared by Lode"));
            continue;
        };
        let lode_fields: Vec<Value> = lode
            .proto()
            .field
            .iter()
            .map(|f| {
                serde_json::json!([
                    f.number(),
                    f.name(),
                    f.type_() as i32,
                    f.label() as i32,
                    f.type_name().trim_start_matches('.'),
                ])
            })
            .collect();
        let mut want: Vec<Value> = fields.as_array().expect("field list").clone();
        let mut got = lode_fields;
        let key = |v: &Value| v[0].as_i64().unwrap_or_default();
        want.sort_by_key(key);
        got.sort_by_key(key);
        if want != got {
            problems.push(format!(
                "{name}:\n  TensorFlow {want:?}\n  Lode       {got:?}"
            ));
        }
        checked_fields += want.len();
        let syntax = schema["syntax"][name].as_str().unwrap_or_default();
        let lode_syntax = lode.file_descriptor().proto().syntax();
        let lode_syntax = if lode_syntax.is_empty() {
            "proto2"
        } else {
            lode_syntax
        };
        if syntax != lode_syntax {
            problems.push(format!(
                "{name}: TensorFlow declares it {syntax}, Lode {lode_syntax}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked_fields > 300, "only {checked_fields} fields checked");
}

#[test]
fn every_enum_matches_tensorflow() {
    let schema = tensorflow_schema();
    let files = lode_files();
    for (name, values) in schema["enums"].as_object().expect("enums") {
        let lode = files
            .iter()
            .find_map(|f| f.enum_by_full_name(&format!(".{name}")))
            .unwrap_or_else(|| panic!("{name}: not declared by Lode"));
        let mut got: Vec<Value> = lode
            .values()
            .map(|v| serde_json::json!([v.name(), v.value()]))
            .collect();
        got.sort_by_key(ToString::to_string);
        let mut want = values.as_array().expect("values").clone();
        want.sort_by_key(ToString::to_string);
        assert_eq!(got, want, "{name}");
    }
}
