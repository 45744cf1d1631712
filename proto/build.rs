//! Generates the rust-protobuf code for Lode's TensorFlow schemas with the pure-Rust .proto
//! parser, so that no system `protoc` is needed. This is the one path that regenerates them.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from("protos/lode/tf");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("protos/lode/tf is part of the crate")
        .map(|entry| entry.expect("readable protos/lode/tf entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .collect();
    inputs.sort();
    protobuf_codegen::Codegen::new()
        .pure()
        .include("protos")
        .inputs(&inputs)
        .cargo_out_dir("tf")
        .run_from_script();
    println!("cargo:rerun-if-changed=protos");
}
