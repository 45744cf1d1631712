//! Synthetic jobs: a one-stage plan whose step costs a fixed, known time.
//!
//! Benchmarks and the scheduler's live tests need pipelines whose cost is known exactly, so
//! that throughput can be compared with an ideal: `lode synthetic` writes a plan directory whose
//! stage batches `batch` records of a generated TFRecord file and runs one
//! [`FIXED_LATENCY_OP`] node per step, which takes `latency` (sleeping, or spinning on the CPU
//! with `spin`) and returns a `[batch, width]` tensor derived from the records: floats with 16
//! bits of a record's hash each (LZ4 saves almost nothing on them), or, with
//! [`SyntheticValues::Ids`], int64 feature ids hashed into [`ID_BUCKETS`] buckets as a parsed
//! categorical column carries them (partly repetitive bytes: LZ4 saves about a third).
//! Everything else (dispatcher, leases, transfer, receiver) is the real runtime.
//!
//! A sleeping stage models a data worker whose CPU time per step is `latency` without using this
//! machine's CPUs, so that many workers (or two jobs of different appetite) can share a small
//! machine; a spinning one really uses a core for `latency`.
//!
//! With `parallelism` P above 1, a step's work is P equal parts of `latency / P` run on the
//! worker's kernel threads (its rayon pool), so a worker of `k` threads takes
//! `ceil(P / k) · latency / P` per step: a pipeline whose speedup per worker is linear up to P
//! threads and flat beyond, known exactly, for the live scheduler's worker sizing.
//!
//! The plan is written like `lode partition` writes one: into a temporary sibling directory,
//! renamed into place at the end; an existing non-empty directory is refused.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lode_proto::plan::{
    Plan, RecvPlan, SendPlan, SendTensor, Source, StagePlan, Summary, TrainingPlan, PLAN_VERSION,
};
use lode_proto::tf::graph::GraphDef;
use protobuf::Message;

use crate::exec::ops::{attr_err, built, entry, t, wrap, KernelEntry};
use crate::exec::program::{BuildCtx, Built};
use crate::hash::fingerprint64;
use crate::records::tfrecord::encode_record;
use crate::tensor::{Tensor, TensorData};
use lode_proto::attr::NodeAttrs;
use lode_proto::tf::node_def::NodeDef;

/// The op of the synthetic stage's work node (Lode's own; TensorFlow has no such op).
pub const FIXED_LATENCY_OP: &str = "LodeFixedLatency";

/// The file of generated records, relative to the plan directory.
pub const RECORDS_FILE: &str = "data/records.tfrecord";

/// Largest accepted latency per step.
pub const MAX_LATENCY: Duration = Duration::from_secs(60);
/// Largest accepted output width (values per record).
pub const MAX_WIDTH: u64 = 1 << 20;
/// Largest accepted record count.
pub const MAX_RECORDS: u64 = 1 << 32;
/// Largest accepted number of parallel parts per step.
pub const MAX_PARALLELISM: u64 = 1024;

/// The buckets [`SyntheticValues::Ids`] hashes into (as a hashed categorical column does).
pub const ID_BUCKETS: u64 = 10_000;

/// What a synthetic step's values are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyntheticValues {
    /// float32, 16 bits of the record's hash each: hardly compressible.
    #[default]
    Floats,
    /// int64 feature ids in [0, [`ID_BUCKETS`]) drawn from the record's hash: compressible.
    Ids,
}

impl SyntheticValues {
    /// The name the stage's `values` attribute and `lode synthetic --values` use.
    pub fn name(self) -> &'static str {
        match self {
            SyntheticValues::Floats => "floats",
            SyntheticValues::Ids => "ids",
        }
    }

    fn dtype(self) -> &'static str {
        match self {
            SyntheticValues::Floats => "DT_FLOAT",
            SyntheticValues::Ids => "DT_INT64",
        }
    }

    fn width_bytes(self) -> u64 {
        match self {
            SyntheticValues::Floats => 4,
            SyntheticValues::Ids => 8,
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [SyntheticValues::Floats, SyntheticValues::Ids]
            .into_iter()
            .find(|v| v.name() == name)
    }
}

/// What a synthetic plan looks like.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    /// Records in the generated file (one epoch).
    pub records: u64,
    /// Records per step.
    pub batch: u64,
    /// Time one step's work takes.
    pub latency: Duration,
    /// Spin on the CPU for `latency` instead of sleeping.
    pub spin: bool,
    /// Values per record in the step's output.
    pub width: u64,
    /// Passes over the records (the plan's repeat count).
    pub epochs: u64,
    /// Equal parts a step's work splits into, run in parallel on the worker's threads.
    pub parallelism: u64,
    /// What the step's values are.
    pub values: SyntheticValues,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        Self {
            records: 100_000,
            batch: 32,
            latency: Duration::from_millis(100),
            spin: false,
            width: 16,
            epochs: 1,
            parallelism: 1,
            values: SyntheticValues::Floats,
        }
    }
}

/// Why a synthetic plan could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SyntheticError {
    #[error("{field} is {value}; {reason}")]
    Spec {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error(transparent)]
    Plan(#[from] lode_proto::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SyntheticError + '_ {
    move |source| SyntheticError::Io {
        path: path.to_owned(),
        source,
    }
}

impl SyntheticSpec {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), SyntheticError> {
        let bad = |field, value: String, reason| {
            Err(SyntheticError::Spec {
                field,
                value,
                reason,
            })
        };
        if self.batch == 0 || self.batch > self.records {
            return bad(
                "batch",
                self.batch.to_string(),
                "it must be at least 1 and at most the record count",
            );
        }
        if self.records > MAX_RECORDS {
            return bad("records", self.records.to_string(), "at most 2^32 records");
        }
        if self.width == 0 || self.width > MAX_WIDTH {
            return bad(
                "width",
                self.width.to_string(),
                "it must be between 1 and 2^20",
            );
        }
        if self.latency > MAX_LATENCY {
            return bad(
                "latency",
                format!("{:?}", self.latency),
                "at most 60 s per step",
            );
        }
        if self.epochs == 0 {
            return bad("epochs", "0".into(), "at least one epoch");
        }
        if self.parallelism == 0 || self.parallelism > MAX_PARALLELISM {
            return bad(
                "parallelism",
                self.parallelism.to_string(),
                "it must be between 1 and 1024",
            );
        }
        if i64::try_from(self.epochs).is_err() {
            return bad("epochs", self.epochs.to_string(), "too many epochs");
        }
        Ok(())
    }

    /// Steps per epoch (partial last batches are dropped).
    pub fn steps_per_epoch(&self) -> u64 {
        self.records / self.batch.max(1)
    }

    fn latency_us(&self) -> u64 {
        u64::try_from(self.latency.as_micros()).unwrap_or(u64::MAX)
    }

    /// The stage graph (text form first: it is the readable definition).
    pub fn stage_graph(&self) -> GraphDef {
        let text = self.stage_graph_text();
        lode_proto::text::parse::<GraphDef>(&text)
            .unwrap_or_else(|e| unreachable!("the synthetic stage template parses: {e}\n{text}"))
    }

    fn stage_graph_text(&self) -> String {
        let b = self.batch;
        let w = self.width;
        let strings = format!(
            r#"attr {{ key: "output_types" value {{ list {{ type: DT_STRING }} }} }}
  attr {{ key: "output_shapes" value {{ list {{ shape {{ dim {{ size: {b} }} }} }} }} }}"#
        );
        format!(
            r#"node {{
  name: "batch_size" op: "Const"
  attr {{ key: "dtype" value {{ type: DT_INT64 }} }}
  attr {{ key: "value" value {{ tensor {{ dtype: DT_INT64 tensor_shape {{ }} int64_val: {b} }} }} }}
}}
node {{
  name: "drop_remainder" op: "Const"
  attr {{ key: "dtype" value {{ type: DT_BOOL }} }}
  attr {{ key: "value" value {{ tensor {{ dtype: DT_BOOL tensor_shape {{ }} bool_val: true }} }} }}
}}
node {{
  name: "lode/DWSource" op: "DWSource"
  attr {{ key: "reader" value {{ s: "tfrecord" }} }}
  attr {{ key: "compression" value {{ s: "" }} }}
  attr {{ key: "output_types" value {{ list {{ type: DT_STRING }} }} }}
  attr {{ key: "output_shapes" value {{ list {{ shape {{ }} }} }} }}
}}
node {{
  name: "batch" op: "BatchDatasetV2"
  input: "lode/DWSource" input: "batch_size" input: "drop_remainder"
  attr {{ key: "parallel_copy" value {{ b: false }} }}
  {strings}
}}
node {{
  name: "iterator" op: "IteratorV2"
  attr {{ key: "container" value {{ s: "" }} }}
  attr {{ key: "shared_name" value {{ s: "" }} }}
  {strings}
}}
node {{ name: "make_iterator" op: "MakeIterator" input: "batch" input: "iterator" }}
node {{
  name: "get_next" op: "IteratorGetNext" input: "iterator"
  {strings}
}}
node {{
  name: "work" op: "{FIXED_LATENCY_OP}" input: "get_next"
  attr {{ key: "latency_us" value {{ i: {latency} }} }}
  attr {{ key: "spin" value {{ b: {spin} }} }}
  attr {{ key: "width" value {{ i: {w} }} }}
  attr {{ key: "parallelism" value {{ i: {parallelism} }} }}
  attr {{ key: "values" value {{ s: "{values}" }} }}
}}
node {{
  name: "lode/DWSend_stage_0" op: "DWSend" input: "work"
  attr {{ key: "T" value {{ list {{ type: {dtype} }} }} }}
  attr {{ key: "shapes" value {{ list {{ shape {{ dim {{ size: {b} }} dim {{ size: {w} }} }} }} }} }}
  attr {{ key: "stage" value {{ i: 0 }} }}
}}
"#,
            latency = self.latency_us(),
            spin = self.spin,
            parallelism = self.parallelism,
            values = self.values.name(),
            dtype = self.values.dtype(),
        )
    }

    /// The plan.json of the synthetic job; `data_root` is where `data/` lives.
    pub fn plan(&self, data_root: &Path) -> Plan {
        let batch = i64::try_from(self.batch).unwrap_or(i64::MAX);
        let width = i64::try_from(self.width).unwrap_or(i64::MAX);
        let send = SendPlan {
            node: "lode/DWSend_stage_0".into(),
            tensors: vec![SendTensor {
                tensor: "work:0".into(),
                dtype: self.values.dtype().into(),
                shape: Some(vec![batch, width]),
                bytes: Some(
                    self.batch
                        .saturating_mul(self.width)
                        .saturating_mul(self.values.width_bytes()),
                ),
            }],
        };
        Plan {
            version: PLAN_VERSION,
            simple: false,
            data_root: Some(data_root.display().to_string()),
            training: TrainingPlan {
                graph: String::new(),
                recv: vec![RecvPlan {
                    node: "lode/DWRecv_stage_0".into(),
                    from_stage: 0,
                    tensors: vec!["work:0".into()],
                }],
            },
            stages: vec![StagePlan {
                index: 0,
                device: "CPU".into(),
                graph: "stage_0.pb".into(),
                nodes: vec!["work".into()],
                recv: Vec::new(),
                send,
                missing_kernels: Default::default(),
            }],
            copied: Vec::new(),
            stubs: Default::default(),
            source: Some(Source {
                reader: "tfrecord".into(),
                files: vec![RECORDS_FILE.into()],
                compression: String::new(),
                batching: "before_map".into(),
                batch_size: Some(batch),
                drop_remainder: Some(true),
                repeat: Some(i64::try_from(self.epochs).unwrap_or(i64::MAX)),
                chain: vec![
                    "TFRecordDataset".into(),
                    "BatchDatasetV2".into(),
                    "RepeatDataset".into(),
                ],
                replaced_by: Some("lode/DWSource".into()),
                ..Source::default()
            }),
            summary: Summary {
                nodes: 9,
                data_nodes: 9,
                crossing_tensors: 1,
                ..Summary::default()
            },
            inlined: Vec::new(),
            kernel_limits: Vec::new(),
        }
    }

    /// Writes the plan directory `dir`: plan.json, stage_0.pb and the records, atomically
    /// ([`lode_proto::plan::write_dir`]).
    pub fn write(&self, dir: &Path) -> Result<(), SyntheticError> {
        self.validate()?;
        let mut records = Vec::new();
        for i in 0..self.records {
            encode_record(format!("record-{i}").as_bytes(), &mut records);
        }
        let graph = self
            .stage_graph()
            .write_to_bytes()
            .map_err(|e| SyntheticError::Io {
                path: dir.join("stage_0.pb"),
                source: std::io::Error::other(e),
            })?;
        // data_root is where the directory will be, as an absolute path.
        let root = absolute(dir).map_err(io_err(dir))?;
        let json =
            serde_json::to_vec_pretty(&self.plan(&root)).map_err(|e| SyntheticError::Io {
                path: dir.join("plan.json"),
                source: std::io::Error::other(e),
            })?;
        lode_proto::plan::write_dir(
            dir,
            &[
                (RECORDS_FILE, &records),
                ("stage_0.pb", &graph),
                ("plan.json", &json),
            ],
        )?;
        Ok(())
    }
}

fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    if path.is_absolute() {
        Ok(path.to_owned())
    } else {
        Ok(std::env::current_dir()?.join(path))
    }
}

/// Lode's benchmark kernels: outside the production registry (`exec::ops::KERNELS`), so that
/// the partitioner never plans a user graph around them, but found by a stage load.
pub static KERNELS: &[KernelEntry] = &[entry(FIXED_LATENCY_OP, build_fixed_latency)];

fn build_fixed_latency(node: &NodeDef, _ctx: &BuildCtx<'_>) -> crate::exec::Result<Built> {
    let latency_us = node.attr_int("latency_us")?;
    let width = node.attr_int("width")?;
    let latency = u64::try_from(latency_us)
        .ok()
        .map(std::time::Duration::from_micros)
        .filter(|l| *l <= MAX_LATENCY)
        .ok_or_else(|| attr_err(node, "latency_us must be in [0, 60 s]"))?;
    let width = u64::try_from(width)
        .ok()
        .filter(|w| (1..=MAX_WIDTH).contains(w))
        .and_then(|w| usize::try_from(w).ok())
        .ok_or_else(|| attr_err(node, "width must be in [1, 2^20]"))?;
    let spin = node.attr_bool("spin")?;
    // Plans written before `parallelism` existed have one part.
    let parallelism = if node.attr.contains_key("parallelism") {
        u64::try_from(node.attr_int("parallelism")?)
            .ok()
            .filter(|p| (1..=MAX_PARALLELISM).contains(p))
            .and_then(|p| usize::try_from(p).ok())
            .ok_or_else(|| attr_err(node, "parallelism must be in [1, 1024]"))?
    } else {
        1
    };
    // Plans written before `values` existed have floats.
    let values = if node.attr.contains_key("values") {
        SyntheticValues::from_name(node.attr_str("values")?)
            .ok_or_else(|| attr_err(node, "values must be \"floats\" or \"ids\""))?
    } else {
        SyntheticValues::Floats
    };
    Ok(built(1, move |a| {
        Ok(wrap(vec![fixed_latency_of(
            t(a, 0)?,
            latency,
            spin,
            width,
            parallelism,
            values,
        )?]))
    }))
}

/// The work of [`FIXED_LATENCY_OP`]: takes `latency` (sleeping, or spinning when `spin`), in
/// `parallelism` equal parts on the current rayon pool, and returns `[n, width]` floats, row `i`
/// derived from record `i`'s bytes alone.
pub fn fixed_latency(
    records: &Tensor,
    latency: Duration,
    spin: bool,
    width: usize,
    parallelism: usize,
) -> crate::kernels::Result<Tensor> {
    fixed_latency_of(
        records,
        latency,
        spin,
        width,
        parallelism,
        SyntheticValues::Floats,
    )
}

/// [`fixed_latency`] with values of the kind `kind`.
pub fn fixed_latency_of(
    records: &Tensor,
    latency: Duration,
    spin: bool,
    width: usize,
    parallelism: usize,
    kind: SyntheticValues,
) -> crate::kernels::Result<Tensor> {
    use rayon::prelude::*;
    let started = Instant::now();
    let values = crate::kernels::strings_of(FIXED_LATENCY_OP, "records", records)?;
    let n = values.len().saturating_mul(width);
    let data = match kind {
        SyntheticValues::Floats => {
            let mut out = Vec::with_capacity(n);
            for v in values {
                let h = fingerprint64(v);
                for j in 0..width {
                    let bits = h.rotate_left([0, 16, 32, 48][j % 4]) & 0xffff;
                    // 16 bits convert to f32 exactly.
                    #[allow(clippy::cast_precision_loss)]
                    out.push(bits as f32 / 65_535.0 + (j / 4) as f32);
                }
            }
            TensorData::Float32(out)
        }
        SyntheticValues::Ids => {
            let mut out = Vec::with_capacity(n);
            for v in values {
                // xorshift64* from the record's hash (never zero: xorshift would stay there).
                let mut x = fingerprint64(v) | 1;
                for _ in 0..width {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    let id = x.wrapping_mul(0x2545_f491_4f6c_dd1d) % ID_BUCKETS;
                    out.push(i64::try_from(id).unwrap_or(0));
                }
            }
            TensorData::Int64(out)
        }
    };
    let rest = latency.saturating_sub(started.elapsed());
    let parts = parallelism.max(1);
    let part = rest / u32::try_from(parts).unwrap_or(u32::MAX);
    let take = |_: usize| {
        if spin {
            let begun = Instant::now();
            let mut x = 0u64;
            while begun.elapsed() < part {
                for _ in 0..256 {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                }
                std::hint::black_box(x);
            }
        } else if !part.is_zero() {
            std::thread::sleep(part);
        }
    };
    if parts == 1 {
        take(0);
    } else {
        (0..parts).into_par_iter().for_each(take);
    }
    crate::kernels::output(FIXED_LATENCY_OP, vec![values.len(), width], data)
}

impl std::fmt::Display for SyntheticSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} records, {} steps per epoch of {} records, {} epoch(s), {:?} per step ({}, {} part(s)), {} {}",
            self.records,
            self.steps_per_epoch(),
            self.batch,
            self.epochs,
            self.latency,
            if self.spin { "spinning" } else { "sleeping" },
            self.parallelism,
            self.width,
            self.values.name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{ExecOptions, Stage, StepInput};
    use lode_proto::plan::PlanDir;

    fn spec(latency_ms: u64) -> SyntheticSpec {
        SyntheticSpec {
            records: 100,
            batch: 8,
            latency: Duration::from_millis(latency_ms),
            spin: false,
            width: 3,
            epochs: 2,
            parallelism: 1,
            values: SyntheticValues::Floats,
        }
    }

    #[test]
    fn plan_runs_in_the_executor_and_takes_its_latency() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("plan");
        spec(30).write(&dir).expect("write");
        let plan = PlanDir::open(&dir).expect("plan");
        assert_eq!(plan.plan.stages.len(), 1);
        let stage = Stage::load(&plan, 0, &ExecOptions::default()).expect("load");
        assert_eq!(stage.records_per_step(), Some(8));
        assert_eq!(stage.records().expect("records").epoch_len(), 100);
        let records: Vec<u64> = (16..24).collect();
        let started = Instant::now();
        let out = stage
            .run_step(StepInput {
                records: &records,
                received: &Default::default(),
            })
            .expect("run");
        assert!(started.elapsed() >= Duration::from_millis(30));
        let tensors = out.tensors.expect("tensors");
        assert_eq!(tensors.len(), 1);
        assert_eq!(tensors[0].shape(), &[8, 3]);
        // Row i depends on record 16 + i only.
        let direct = fixed_latency(
            &Tensor::new(vec![1], TensorData::String(vec![b"record-17".to_vec()])).expect("tensor"),
            Duration::ZERO,
            false,
            3,
            1,
        )
        .expect("direct");
        let TensorData::Float32(all) = tensors[0].data() else {
            panic!("float output")
        };
        let TensorData::Float32(one) = direct.data() else {
            panic!("float output")
        };
        assert_eq!(&all[3..6], &one[..]);
    }

    #[test]
    fn an_ids_plan_sends_int64_ids_in_their_buckets_row_by_record() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("plan");
        let spec = SyntheticSpec {
            values: SyntheticValues::Ids,
            width: 64,
            ..spec(0)
        };
        spec.write(&dir).expect("write");
        let plan = PlanDir::open(&dir).expect("plan");
        assert_eq!(plan.plan.stages[0].send.tensors[0].dtype, "DT_INT64");
        assert_eq!(plan.plan.stages[0].send.tensors[0].bytes, Some(8 * 64 * 8));
        let stage = Stage::load(&plan, 0, &ExecOptions::default()).expect("load");
        let records: Vec<u64> = (0..8).collect();
        let out = stage
            .run_step(StepInput {
                records: &records,
                received: &Default::default(),
            })
            .expect("run");
        let tensors = out.tensors.expect("tensors");
        assert_eq!(tensors[0].shape(), &[8, 64]);
        let TensorData::Int64(all) = tensors[0].data() else {
            panic!("int64 output")
        };
        assert!(all.iter().all(|&id| (0..10_000).contains(&id)), "{all:?}");
        // Spread over the buckets, not one value.
        let distinct: std::collections::BTreeSet<i64> = all.iter().copied().collect();
        assert!(
            distinct.len() > 400,
            "{} distinct ids of 512",
            distinct.len()
        );
        let one = fixed_latency_of(
            &Tensor::new(vec![1], TensorData::String(vec![b"record-3".to_vec()])).expect("tensor"),
            Duration::ZERO,
            false,
            64,
            1,
            SyntheticValues::Ids,
        )
        .expect("direct");
        let TensorData::Int64(row) = one.data() else {
            panic!("int64 output")
        };
        assert_eq!(&all[3 * 64..4 * 64], &row[..]);
    }

    #[test]
    fn spinning_uses_the_cpu_for_the_latency() {
        let records = Tensor::new(
            vec![2],
            TensorData::String(vec![b"a".to_vec(), b"b".to_vec()]),
        )
        .expect("tensor");
        let started = Instant::now();
        let out = fixed_latency(&records, Duration::from_millis(20), true, 5, 1).expect("run");
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert_eq!(out.shape(), &[2, 5]);
        let err = fixed_latency(&out, Duration::ZERO, false, 1, 1).expect_err("float input");
        assert!(err.to_string().contains("expected string"), "{err}");
    }

    /// Parts share the latency: on one thread they run one after another and take it all;
    /// the output does not depend on how the work was split.
    #[test]
    fn parallel_parts_take_the_latency_on_one_thread_and_give_the_same_rows() {
        let records = Tensor::new(
            vec![2],
            TensorData::String(vec![b"a".to_vec(), b"b".to_vec()]),
        )
        .expect("tensor");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        let started = Instant::now();
        let split = pool
            .install(|| fixed_latency(&records, Duration::from_millis(20), false, 4, 4))
            .expect("run");
        assert!(started.elapsed() >= Duration::from_millis(19));
        let whole = fixed_latency(&records, Duration::ZERO, false, 4, 1).expect("run");
        assert_eq!(split, whole);
    }

    #[test]
    fn bad_specs_and_targets_are_refused() {
        // Each change to a valid spec, and what the refusal must say ("" when any refusal will do).
        type Change = fn(&mut SyntheticSpec);
        let cases: [(Change, &str); 7] = [
            (|s| s.parallelism = 0, "parallelism is 0"),
            (|s| s.parallelism = 1025, "parallelism"),
            (|s| s.batch = 0, "batch is 0"),
            (|s| s.batch = 101, ""),
            (|s| s.width = 0, "width"),
            (|s| s.latency = Duration::from_secs(61), "latency"),
            (|s| s.epochs = 0, ""),
        ];
        for (change, says) in cases {
            let mut s = spec(1);
            change(&mut s);
            let err = s.validate().expect_err("refused").to_string();
            assert!(err.contains(says), "{says}: {err}");
        }

        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("taken");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("mine.txt"), "keep me").expect("write");
        let err = spec(1).write(&dir).expect_err("non-empty");
        assert!(err.to_string().contains("refusing"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("mine.txt")).expect("kept"),
            "keep me"
        );
        // Nothing left behind beside it.
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty());
    }
}
