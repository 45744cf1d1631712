//! lode-runtime: Lode's native TensorFlow runtime, what a data worker computes for each step
//! (see ../shared/DESIGN.md): tensors and their TensorProto form, the record readers a step
//! reads its leased records with, TensorFlow's op kernels and the stage executor. It is
//! synchronous compute: no tokio, tonic or hyper in its tree; parallel work runs on rayon. The
//! services (the data worker, the training side) and the wire between them build on it.
//!
//! # Layout
//! - [`tensor`]: [`Tensor`], [`DType`], [`TensorData`]: dense, row-major, strings as bytes,
//!   float16/bfloat16 as their bits.
//! - [`convert`]: Tensor ↔ `TensorProto` with TensorFlow's `Tensor::FromProto` rules
//!   (`tensor_content`, typed fields, the fill-with-last rule) and `tf.io.serialize_tensor`'s
//!   bytes.
//! - [`records`]: TFRecord (both CRC32C checks) and text-line readers, with "" / "ZLIB" /
//!   "GZIP" compression, offset indexes for random access to uncompressed files, and an
//!   `ignore_errors`-style policy that skips and counts corrupt records.
//! - [`hash`]: `Fingerprint64` (FarmHash `farmhashna::Hash64`) and `StringToHashBucketFast`.
//! - [`kernels`]: TensorFlow ops as pure functions over tensors (strings, lookup tables,
//!   array basics, `Cast`, parsing, sparse and feature-column ops, math), checked against
//!   golden vectors from TensorFlow 2.18.1.
//! - [`exec`]: the stage executor: a stage graph compiled once (its op registry in
//!   `exec::ops`, one table from which every list of kernels is derived), run per step on the
//!   records of an index batch (map functions, batching, the ops after the iterator), in
//!   parallel on rayon.
//! - [`synthetic`]: synthetic one-stage plans whose step takes a fixed time (benchmarks, the
//!   scheduler's live tests).
//! - [`clock`]: the calling thread's CPU clock.
//! - [`error`]: the crate's [`Error`].
//!
//! # Invariants
//! - A tensor's value count equals the product of its shape ([`Tensor::new`] checks it).
//! - Tensor → TensorProto → Tensor is the identity for every dtype, bit for bit (NaN payloads
//!   included), through `tensor_content` and through the typed fields.
//! - A TensorProto is read as TensorFlow 2.18 reads it; what TensorFlow refuses is an error
//!   here, and nothing is allocated past [`tensor::MAX_TENSOR_BYTES`].
//! - A record reader never returns data whose CRCs do not match; every corruption error names
//!   the file, the record index and the byte offset.
//! - Lines and hashes are those TensorFlow produces (golden values from TensorFlow 2.18.1).
//! - Nothing read from outside (protos, record files) panics.
//!
//! This crate depends on lode-proto and on nothing else of Lode's.

pub mod clock;
pub mod convert;
pub mod error;
pub mod exec;
pub mod hash;
pub mod kernels;
pub mod records;
pub mod synthetic;
pub mod tensor;

pub use error::{Error, Result};
pub use tensor::{DType, Tensor, TensorData};
