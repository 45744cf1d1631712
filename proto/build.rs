//! Generates the rust-protobuf code for Lode's TensorFlow schemas with the pure-Rust .proto
//! parser, so that no system `protoc` is needed. This is the one path that regenerates them.
//!
//! Then generates the prost + tonic code for Lode's service protocol
//! (`protos/lode/service/`): protox, a pure-Rust protobuf compiler, builds the descriptor set
//! that tonic-build would otherwise ask `protoc` for.

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
    // Cargo sets CARGO_FEATURE_SERVICE for a build with the `service` feature.
    if std::env::var_os("CARGO_FEATURE_SERVICE").is_some() {
        service();
    }
    println!("cargo:rerun-if-changed=protos");
}

/// The service protocol, into `OUT_DIR/service/lode.v1.rs`.
fn service() {
    let descriptors = protox::compile(["lode/service/lode.proto"], ["protos"])
        .unwrap_or_else(|err| panic!("protos/lode/service/lode.proto: {err}"));
    let out =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("service");
    std::fs::create_dir_all(&out).expect("OUT_DIR/service is writable");
    tonic_build::configure()
        .out_dir(&out)
        // The stage graph is shared by every registration of its stage: no copy per answer.
        // Step frames are decoded straight from the received buffer and encoded without a
        // copy of the worker's frame.
        .bytes([
            ".lode.v1.RegisterResponse.stage_graph",
            ".lode.v1.PushRequest.frame",
            ".lode.v1.FetchResponse.frame",
        ])
        .compile_fds(descriptors)
        .expect("tonic-build writes the service code");
}
