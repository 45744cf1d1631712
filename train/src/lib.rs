//! lode-train: the training side of a job, what runs beside the user's TensorFlow program (see
//! ../shared/DESIGN.md). It receives each step's fused frames from the data workers (through
//! lode-transfer's receiver), hands them to the program in step order, and reports what the
//! program consumed to the dispatcher. The training-side library that TensorFlow loads
//! (python/native, package `lode-training`, with its C ABI and the DWRecv op) is a thin layer
//! over this crate; `lode train` and `lode consume` wire it to the binary.
//!
//! # Layout
//! - [`consumer`]: [`consumer::Consumer`]: registers with the dispatcher, serves a receiver,
//!   pops complete steps in order, reports the consumed watermark (and resumes from it).
//! - [`hook`]: the session hook's Lode half (`lode train -- PROGRAM`): the program run with
//!   the hook, its graph answered with a job, and the job directory's graph identity.
//! - [`delivery`]: a consumer log read back and held to the job's order (every step once, in
//!   order, with its records; no record twice in an epoch), as `lode run` reports it.
//! - [`emulator`]: the training side emulated (`lode consume`, the consumer of `lode run`): a
//!   consumer that logs each step, digested, and reports it only once the line is written.
//!
//! # Invariants
//! - A step reaches the program once and in step order, and is reported consumed only after
//!   the program (or the emulator's log) has it.
//! - A consumer restarted from the dispatcher's watermark receives exactly the steps not yet
//!   reported.
//!
//! This crate depends on lode-proto, lode-runtime and lode-transfer, never on another service.

pub mod consumer;
pub mod delivery;
pub mod emulator;
#[cfg(unix)]
pub mod hook;
