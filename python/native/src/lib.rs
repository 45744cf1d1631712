//! lode-training: Lode's training side as a C library, loaded into the user's TensorFlow
//! process by the `lode` Python package. The DWRecv op (a thin C++ kernel compiled against the
//! installed TensorFlow) and the package's session hook call it.
//!
//! # Layout
//! - [`side`]: [`side::TrainingSide`], the process's consumer of one of its jobs (dataworker's
//!   [`Consumer`](lode_train::consumer::Consumer): receiver, reorder, dedup,
//!   watermark) and the rules mapping TensorFlow runs, iterator initializations and a TF2
//!   stand-in's step numbers (its pass's first step, a restored iterator's seek) to steps.
//! - [`ffi`]: the C ABI (`extern "C"`), the only unsafe code of Lode with [`interrupt`]; every
//!   block states why it is sound. One side per job of the program (a TF2 program's validation
//!   and test datasets are jobs of their own), each call naming its job.
//! - [`interrupt`]: a SIGINT handler chained before the program's, so that Ctrl-C ends a wait.
//!
//! # Invariants
//! - All DWRecv nodes of one `session.run` of a job receive the same step; consecutive runs
//!   receive consecutive steps, in the job's order, each once. Jobs do not share steps.
//! - A step is reported consumed only after the run that used it has finished.
//! - No call blocks without a way out: waiting for data observes the kernel's cancellation,
//!   and an unreachable dispatcher fails the call after the configured patience.

pub mod ffi;
pub mod interrupt;
pub mod side;
