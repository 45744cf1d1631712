//! End-to-end tests: the real `lode` binary against the fixtures TensorFlow wrote.
//! One test binary (see Cargo.toml); each module is one command or concern.

mod bad_input;
mod cluster;
mod constructs;
mod controller;
mod convert;
mod exec;
mod fixtures;
mod links;
mod one_shot;
mod order;
mod partition;
mod runtime;
mod scheduler;
mod simulate;
mod support;
mod train;
