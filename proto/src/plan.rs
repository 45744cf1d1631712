//! The plan directory's `plan.json`: what the decoupler writes and what the data workers,
//! the dispatcher and the training side read. Every crate shares these types so that the
//! file has one schema.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The plan format this build writes and reads.
pub const PLAN_VERSION: u32 = 1;

/// The largest plan.json read (a plan lists node names, so it grows with the graph).
pub const MAX_PLAN_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub version: u32,
    pub simple: bool,
    /// The directory the graph's relative data paths (reader files, vocabulary files) resolve
    /// against: the partitioned model's directory unless `lode partition --data-root` said
    /// otherwise. Absent in plans written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_root: Option<String>,
    pub training: TrainingPlan,
    pub stages: Vec<StagePlan>,
    pub copied: Vec<String>,
    pub stubs: BTreeMap<String, String>,
    pub source: Option<Source>,
    pub summary: Summary,
    /// One-shot iterators made initializable before the cut (their dataset factory inlined):
    /// their nodes and `MakeIterator` are new, every other name is the original graph's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inlined: Vec<InlinedIterator>,
    /// The ops without a data-worker kernel that kept data-side nodes in training (the
    /// kernel-aware cut); empty when nothing limited the cut.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_limits: Vec<KernelLimit>,
}

/// A `OneShotIterator` rewritten into an `IteratorV2` of the same name, fed by
/// `make_iterator` from the body of its `dataset_factory` function, inlined as `nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlinedIterator {
    pub iterator: String,
    pub function: String,
    pub make_iterator: String,
    pub nodes: Vec<String>,
}

/// An op the data worker has no kernel for, and what it kept in training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelLimit {
    pub op: String,
    /// The data-side nodes that need the op: they use it, call a function that does, or read
    /// an input-independent node that does.
    pub nodes: Vec<String>,
    /// Nodes kept in training because of this op (its nodes and every data-side node that
    /// depends on them); a node that needs several such ops counts under each.
    pub kept_in_training: usize,
    /// `kept_in_training` over the data-side nodes the cut had before it was limited.
    pub share_of_data_side: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainingPlan {
    pub graph: String,
    pub recv: Vec<RecvPlan>,
}

/// One DWRecv node: the tensors it yields, in output order, all sent by `from_stage`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecvPlan {
    pub node: String,
    pub from_stage: usize,
    pub tensors: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StagePlan {
    pub index: usize,
    pub device: String,
    pub graph: String,
    pub nodes: Vec<String>,
    pub recv: Vec<RecvPlan>,
    pub send: SendPlan,
    /// Ops of the stage (and its functions) that the data worker has no kernel for: op → the
    /// nodes using it. A data worker refuses such a stage at load.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub missing_kernels: BTreeMap<String, Vec<String>>,
}

/// The stage's one DWSend node and its tensors in crossing order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendPlan {
    pub node: String,
    pub tensors: Vec<SendTensor>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendTensor {
    pub tensor: String,
    pub dtype: String,
    /// Dimensions, -1 for unknown; None when even the rank is unknown.
    pub shape: Option<Vec<i64>>,
    pub bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Summary {
    pub nodes: usize,
    pub state: usize,
    pub training_region: usize,
    pub training_graph_nodes: usize,
    pub data_nodes: usize,
    pub shared_nodes: usize,
    pub crossing_tensors: usize,
    pub dropped_colocations: usize,
}

/// The input pipeline as the dispatcher and the data workers need it: the reader and its
/// files, and the dataset transformations between the reader and the iterator.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Source {
    /// `tfrecord`, `text_lines`, `fixed_length`, `tensor_slices` or the op name.
    pub reader: String,
    pub files: Vec<String>,
    pub compression: String,
    pub skip: Option<i64>,
    pub take: Option<i64>,
    pub map_functions: Vec<String>,
    /// `before_map`, `after_map` or `none`.
    pub batching: String,
    pub batch_size: Option<i64>,
    pub drop_remainder: Option<bool>,
    pub shuffle_buffer: Option<i64>,
    pub shuffle_seed: Option<(i64, i64)>,
    /// -1 repeats forever; None when there is no repeat.
    pub repeat: Option<i64>,
    /// The dataset ops from the source to the iterator.
    pub chain: Vec<String>,
    /// The stage node that replaced the reader (`lode/DWSource`), and the nodes it replaced.
    pub replaced_by: Option<String>,
    pub replaced: Vec<String>,
    /// The dataset ops that decide which records make each element, in the order the program
    /// applies them after the reader, with their arguments as TensorFlow evaluates them (the
    /// seeds included). `skip` and `take` above are the leading ones only (applied to the
    /// reader's records before anything else); this list holds everything after them.
    /// Record-wise ops (`map`) do not appear. Empty in plans written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order: Vec<IndexOp>,
    /// The first dataset op whose effect on the order Lode cannot compute on indices
    /// (`filter`, `unbatch`, …): such a pipeline is not decoupled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<UnsupportedOp>,
}

/// A dataset op that changes which records make an element, as the program wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum IndexOp {
    /// Drops the first `count` elements (-1: all of them).
    Skip { count: i64 },
    /// Keeps the first `count` elements (-1: all of them).
    Take { count: i64 },
    /// Repeats the input `count` times (-1: forever).
    Repeat { count: i64 },
    /// TensorFlow's shuffle buffer (`ShuffleDataset` V1–V3; `ShuffleAndRepeatDataset` is a
    /// `Shuffle` followed by a `Repeat`, which yields the same order). `seed` and `seed2` are
    /// the op's inputs (both 0: TensorFlow seeds it at random).
    Shuffle {
        buffer_size: i64,
        seed: i64,
        seed2: i64,
        reshuffle_each_iteration: bool,
    },
    /// Groups `batch_size` consecutive elements; a short last group is kept unless
    /// `drop_remainder`.
    Batch {
        batch_size: i64,
        drop_remainder: bool,
    },
}

/// A node of the dataset chain whose op Lode cannot reproduce on indices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsupportedOp {
    pub node: String,
    pub op: String,
    pub reason: String,
}

impl Source {
    /// Whether `RepeatDataset` comes after the batching in the chain: then every epoch ends
    /// with its own (possibly partial or dropped) last batch, rather than batches running
    /// across the epoch boundary.
    pub fn repeat_after_batch(&self) -> bool {
        let pos = |op: &str| self.chain.iter().position(|c| c == op);
        let batch = self
            .chain
            .iter()
            .position(|c| c.starts_with("BatchDataset") || c == "PaddedBatchDatasetV2");
        match (batch, pos("RepeatDataset")) {
            (Some(b), Some(r)) => r > b,
            _ => true,
        }
    }
}

/// The byte offset of serde_json's (1-based line, 1-based column) error position in `bytes`:
/// the byte it was reading (the last byte, when the data ends early).
fn byte_offset(bytes: &[u8], line: usize, column: usize) -> usize {
    let line_start = bytes
        .split_inclusive(|&b| b == b'\n')
        .take(line.saturating_sub(1))
        .map(<[u8]>::len)
        .sum::<usize>();
    (line_start + column.saturating_sub(1)).min(bytes.len())
}

/// Writes a plan directory atomically: `dir` must be absent or empty, and `files` (paths
/// relative to it; subdirectories are created) go into a temporary sibling that is renamed
/// into place only when complete, so a failed write leaves nothing behind.
pub fn write_dir(dir: &Path, files: &[(&str, &[u8])]) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    if dir.exists() {
        let empty = dir.is_dir() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_none();
        if !empty {
            return Err(Error::InvalidOutput {
                path: dir.to_owned(),
                reason: "exists and is not empty; refusing to write over it (choose another \
                         directory or remove it)"
                    .into(),
            });
        }
    }
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::InvalidOutput {
            path: dir.to_owned(),
            reason: "the path names no directory".into(),
        })?;
    let tmp = parent.join(format!(".{name}.lode-tmp-{}", std::process::id()));
    let result = (|| -> Result<()> {
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        for (file, bytes) in files {
            let path = tmp.join(file);
            if let Some(sub) = path.parent() {
                std::fs::create_dir_all(sub).map_err(io(sub))?;
            }
            std::fs::write(&path, bytes).map_err(io(&path))?;
        }
        if dir.exists() {
            std::fs::remove_dir(dir).map_err(io(dir))?;
        }
        std::fs::rename(&tmp, dir).map_err(io(dir))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// A plan directory read back: `plan.json` and where it lives.
#[derive(Debug, Clone)]
pub struct PlanDir {
    pub dir: PathBuf,
    pub plan: Plan,
}

impl PlanDir {
    /// Reads `DIR/plan.json`, checking its version.
    pub fn open(dir: &Path) -> Result<PlanDir> {
        let path = dir.join("plan.json");
        let bytes = crate::io::read_limited(&path, MAX_PLAN_BYTES)?;
        let plan: Plan = serde_json::from_slice(&bytes).map_err(|e| Error::InvalidModel {
            path: path.clone(),
            reason: format!(
                "not a Lode plan: at byte {}: {e}",
                byte_offset(&bytes, e.line(), e.column())
            ),
        })?;
        if plan.version != PLAN_VERSION {
            return Err(Error::InvalidModel {
                path,
                reason: format!(
                    "plan version {} is not the version this build reads ({PLAN_VERSION})",
                    plan.version
                ),
            });
        }
        Ok(PlanDir {
            dir: dir.to_owned(),
            plan,
        })
    }

    /// The path of a file the plan names (a graph), inside the plan directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The directory relative data paths resolve against: the plan's `data_root`, else the
    /// current directory (what TensorFlow itself would use).
    pub fn data_root(&self) -> PathBuf {
        self.plan
            .data_root
            .as_ref()
            .map_or_else(|| PathBuf::from("."), PathBuf::from)
    }
}
