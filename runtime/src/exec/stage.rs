//! A stage of a plan, loaded and ready to run steps.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use lode_proto::ops::function_index;
use lode_proto::plan::{PlanDir, RecvPlan, Source};
use lode_proto::step::{steps_per_epoch, StepRef};
use lode_proto::tf::graph::GraphDef;
use lode_proto::tf::node_def::NodeDef;

use super::dataset::Pipeline;
use super::ops::{self, PLUMBING, TABLE_INITIALIZERS};
use super::program::{BuildCtx, Compile, Naming, Program};
use super::source::RecordSource;
use super::value::Value;
use super::{ExecError, Result};
use crate::tensor::Tensor;

/// How a stage runs.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// TensorFlow's `ignore_errors()`: a corrupt record, a malformed line or example is
    /// skipped and counted instead of failing the step. A step left short of a full batch
    /// under `drop_remainder` is skipped as a whole (its index batch cannot borrow records
    /// from the next step as TensorFlow's stream would).
    pub ignore_errors: bool,
    /// Run independent nodes and per-record map functions on the current rayon pool.
    pub parallel: bool,
    /// Overrides the plan's `data_root`.
    pub data_root: Option<PathBuf>,
}

/// What a step consumes.
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    /// Record numbers in the epoch's stream (stage with a source; empty otherwise).
    pub records: &'a [u64],
    /// Tensors sent by earlier stages in this step, by tensor name.
    pub received: &'a HashMap<String, Arc<Tensor>>,
}

/// What a step produced.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// The stage's send tensors in crossing order; None when `ignore_errors` dropped the
    /// step's element.
    pub tensors: Option<Vec<Arc<Tensor>>>,
    /// Records or elements skipped under `ignore_errors`.
    pub skipped: u64,
}

/// A step's send tensors out of their `Arc`s, to be moved into its frame: taken where the
/// stage holds no other reference (the usual case), copied where it does.
pub fn owned_tensors(tensors: Vec<Arc<Tensor>>) -> Vec<Tensor> {
    tensors
        .into_iter()
        .map(|t| Arc::try_unwrap(t).unwrap_or_else(|shared| (*shared).clone()))
        .collect()
}

/// A stage compiled from its graph.
#[derive(Debug)]
pub struct Stage {
    pub index: usize,
    source: Option<(RecordSource, Pipeline)>,
    get_next_outputs: usize,
    recv: Vec<RecvPlan>,
    program: Program,
    /// Send tensor names, in crossing order.
    pub send: Vec<String>,
    options: ExecOptions,
}

fn graph_err(node: &str, reason: impl Into<String>) -> ExecError {
    ExecError::Graph {
        node: node.to_owned(),
        reason: reason.into(),
    }
}

fn data_inputs(node: &NodeDef) -> Vec<String> {
    node.input
        .iter()
        .filter(|i| !i.starts_with('^'))
        .cloned()
        .collect()
}

fn base(name: &str) -> &str {
    name.split(':').next().unwrap_or(name)
}

/// Whether the stage itself handles `op`: its plumbing and the dataset chain.
fn is_handled(op: &str) -> bool {
    PLUMBING.contains(&op) || op.ends_with("Dataset") || op.contains("DatasetV")
}

/// Whether a data worker runs a node of `op` in a stage graph: a kernel of the production
/// registry ([`ops::KERNELS`]), or an op the stage handles itself (plumbing, the dataset chain).
/// What the partitioner keeps on the data side; benchmark ops do not count.
pub fn runs_natively(op: &str) -> bool {
    ops::has_kernel(op) || is_handled(op)
}

/// Ops of a stage graph (and the functions it reaches) that have no kernel: op → nodes.
pub fn unsupported_ops(graph: &GraphDef) -> BTreeMap<String, Vec<String>> {
    let library = function_index(graph.library.as_ref());
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let known = |op: &str| ops::kernel(op).is_some() || is_handled(op);
    for node in &graph.node {
        if !known(&node.op) {
            missing
                .entry(node.op.clone())
                .or_default()
                .push(node.name.clone());
        }
    }
    for (name, f) in &library {
        for node in &f.node_def {
            if !known(&node.op) && !library.contains_key(node.op.as_str()) {
                missing
                    .entry(node.op.clone())
                    .or_default()
                    .push(format!("{name}/{}", node.name));
            }
        }
    }
    missing
}

impl Stage {
    /// Loads stage `index` of the plan: compiles its graph and functions, runs its table
    /// initializers, and indexes its source files.
    pub fn load(plan: &PlanDir, index: usize, options: &ExecOptions) -> Result<Stage> {
        let spec = plan
            .plan
            .stages
            .get(index)
            .ok_or_else(|| ExecError::Input {
                reason: format!(
                    "the plan has {} stage(s); there is no stage {index}",
                    plan.plan.stages.len()
                ),
            })?;
        let path = plan.file(&spec.graph);
        let bytes = lode_proto::io::read_limited(&path, lode_proto::io::MAX_MODEL_BYTES)?;
        let graph: GraphDef = lode_proto::io::decode_binary_file(&path, &bytes, "GraphDef")?;
        let data_root = options
            .data_root
            .clone()
            .unwrap_or_else(|| plan.data_root());
        Stage::from_graph(
            index,
            &graph,
            &spec.send.node,
            &spec.recv,
            plan.plan.source.as_ref(),
            &data_root,
            options,
        )
    }

    /// Compiles a stage from its graph (see [`Stage::load`]).
    pub fn from_graph(
        index: usize,
        graph: &GraphDef,
        send_node: &str,
        recv: &[RecvPlan],
        source: Option<&Source>,
        data_root: &std::path::Path,
        options: &ExecOptions,
    ) -> Result<Stage> {
        let missing = unsupported_ops(graph);
        if !missing.is_empty() {
            return Err(ExecError::MissingKernels { missing });
        }
        let library = function_index(graph.library.as_ref());
        let tables = Mutex::new(HashMap::new());
        let ctx = BuildCtx {
            library: &library,
            data_root,
            tables: &tables,
        };
        let by_name: HashMap<&str, &NodeDef> =
            graph.node.iter().map(|n| (n.name.as_str(), n)).collect();
        let no_externals = HashMap::new();
        let evaluate = |roots: &[String]| -> Result<Vec<Value>> {
            let program = Program::compile(
                &Compile {
                    nodes: &graph.node,
                    naming: Naming::Graph {
                        externals: &no_externals,
                    },
                    args: 0,
                    roots,
                    grappler: true,
                },
                &ctx,
            )?;
            program.run(Vec::new(), false)
        };

        // Tables first: folding a lookup needs the filled table.
        for node in graph
            .node
            .iter()
            .filter(|n| TABLE_INITIALIZERS.contains(&n.op.as_str()))
        {
            let inputs = evaluate(&data_inputs(node))?;
            let built = ops::build(node, &ctx)?
                .ok_or_else(|| graph_err(&node.name, "no kernel for a table initializer"))?;
            let refs: Vec<&Value> = inputs.iter().collect();
            (built.kernel)(&refs).map_err(|source| ExecError::Kernel {
                node: node.name.clone(),
                op: node.op.clone(),
                source: Box::new(source),
            })?;
        }

        let send = by_name
            .get(send_node)
            .ok_or_else(|| graph_err(send_node, "the stage graph has no such DWSend node"))?;
        let roots = data_inputs(send);

        let mut externals = HashMap::new();
        let mut args = 0usize;
        let get_next = graph.node.iter().find(|n| n.op == "IteratorGetNext");
        let mut get_next_outputs = 0;
        let mut pipeline = None;
        if let Some(get_next) = get_next {
            get_next_outputs =
                lode_proto::attr::NodeAttrs::attr_types(get_next, "output_types")?.len();
            externals.insert(get_next.name.clone(), 0);
            args = get_next_outputs;
            let iterator = data_inputs(get_next)
                .first()
                .map(|i| base(i).to_owned())
                .ok_or_else(|| {
                    graph_err(&get_next.name, "IteratorGetNext has no iterator input")
                })?;
            let make = graph
                .node
                .iter()
                .find(|n| {
                    n.op == "MakeIterator"
                        && data_inputs(n).get(1).is_some_and(|i| base(i) == iterator)
                })
                .ok_or_else(|| graph_err(&iterator, "no MakeIterator initializes this iterator"))?;
            let dataset = data_inputs(make)
                .first()
                .cloned()
                .ok_or_else(|| graph_err(&make.name, "MakeIterator has no dataset input"))?;
            let source_node = graph
                .node
                .iter()
                .find(|n| n.op == "DWSource")
                .ok_or_else(|| {
                    graph_err(&get_next.name, "the stage has an iterator but no DWSource")
                })?;
            let source = source.ok_or_else(|| {
                graph_err(&source_node.name, "the plan has no source description")
            })?;
            let p = Pipeline::compile(&by_name, &dataset, &source_node.name, &ctx, &evaluate)?;
            let records = RecordSource::open(source, data_root, options.ignore_errors)?;
            pipeline = Some((records, p));
        }
        for r in recv {
            externals.insert(r.node.clone(), args);
            args += r.tensors.len();
        }
        let program = Program::compile(
            &Compile {
                nodes: &graph.node,
                naming: Naming::Graph {
                    externals: &externals,
                },
                args,
                roots: &roots,
                grappler: true,
            },
            &ctx,
        )?;
        Ok(Stage {
            index,
            source: pipeline,
            get_next_outputs,
            recv: recv.to_vec(),
            program,
            send: roots,
            options: options.clone(),
        })
    }

    /// The stage's record source, when it reads records.
    pub fn records(&self) -> Option<&RecordSource> {
        self.source.as_ref().map(|(r, _)| r)
    }

    /// Records per step (the batch size), when the stage reads records.
    pub fn records_per_step(&self) -> Option<usize> {
        self.source.as_ref().map(|(_, p)| p.records_per_step())
    }

    pub fn drop_remainder(&self) -> bool {
        self.source
            .as_ref()
            .is_some_and(|(_, p)| p.drop_remainder())
    }

    /// The DWRecv nodes whose tensors the stage takes from earlier stages.
    pub fn recv_plan(&self) -> &[RecvPlan] {
        &self.recv
    }

    /// Nodes run per step (constants folded away), for reports.
    pub fn node_count(&self) -> usize {
        self.program.len()
    }

    /// Runs one step.
    pub fn run_step(&self, input: StepInput<'_>) -> Result<StepOutput> {
        let mut args: Vec<Value> = Vec::new();
        let mut skipped = 0u64;
        if let Some((records, pipeline)) = &self.source {
            let mut read = Vec::with_capacity(input.records.len());
            let mut ids = Vec::with_capacity(input.records.len());
            for (&id, read_one) in input.records.iter().zip(records.read_many(input.records)) {
                match read_one {
                    Ok(r) => {
                        read.push(r);
                        ids.push(id);
                    }
                    Err(e) if self.options.ignore_errors && e.is_data_error() => skipped += 1,
                    Err(e) => return Err(e),
                }
            }
            let (mut elements, dropped) = pipeline
                .run(read, self.options.parallel, self.options.ignore_errors)
                .map_err(|e| {
                    let what = match e.record.and_then(|k| ids.get(k).map(|&id| (k, id))) {
                        Some((k, id)) => match records.locate(id) {
                            Some(at) => format!("{at} (record {k} of the step)"),
                            None => format!("record {id}"),
                        },
                        None => describe_records(records, &ids),
                    };
                    ExecError::InRecords {
                        what,
                        source: Box::new(e.error),
                    }
                })?;
            skipped += dropped;
            if elements.is_empty() {
                return Ok(StepOutput {
                    tensors: None,
                    skipped,
                });
            }
            if elements.len() > 1 {
                return Err(ExecError::Input {
                    reason: format!(
                        "{} records make {} elements; a step takes exactly one",
                        input.records.len(),
                        elements.len()
                    ),
                });
            }
            let element = elements.pop().unwrap_or_default();
            if element.len() != self.get_next_outputs {
                return Err(ExecError::Input {
                    reason: format!(
                        "the pipeline yields {} components but IteratorGetNext has {} outputs",
                        element.len(),
                        self.get_next_outputs
                    ),
                });
            }
            args.extend(element);
        }
        for r in &self.recv {
            for name in &r.tensors {
                let t = input.received.get(name).ok_or_else(|| ExecError::Input {
                    reason: format!("tensor {name} from stage {} was not received", r.from_stage),
                })?;
                args.push(Value::Tensor(t.clone()));
            }
        }
        let outs = self.program.run(args, self.options.parallel)?;
        let tensors = outs
            .into_iter()
            .zip(&self.send)
            .map(|(v, name)| match v {
                Value::Tensor(t) => Ok(t),
                other => Err(ExecError::Input {
                    reason: format!("send tensor {name} is {}, not a dense tensor", other.kind()),
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StepOutput {
            tensors: Some(tensors),
            skipped,
        })
    }
}

/// "data/train.csv records 3–34" for a step's records.
fn describe_records(records: &RecordSource, ids: &[u64]) -> String {
    let first = ids.first().and_then(|&i| records.locate(i));
    let last = ids.last().and_then(|&i| records.locate(i));
    match (first, last) {
        (Some(a), Some(b)) if a.file == b.file => {
            format!("{} records {}–{}", a.file, a.record, b.record)
        }
        (Some(a), Some(b)) => format!("{} to {}", a, b),
        _ => "the step's records".into(),
    }
}

/// The records of step `step` in sequential order (no shuffle), as the dispatcher hands them
/// out with shuffling off: each epoch is the source's records in file order; when `repeat`
/// comes after the batching, every epoch ends with its own last batch (dropped when short
/// under `drop_remainder`), otherwise batches run across the epoch boundary. None once the
/// pipeline's repeat count is exhausted. Record numbers are positions within their epoch.
pub fn sequential_records(
    source: &Source,
    epoch_len: u64,
    per_step: u64,
    drop_remainder: bool,
    step: u64,
) -> Option<Vec<u64>> {
    if epoch_len == 0 || per_step == 0 {
        return None;
    }
    // Epochs the pipeline yields: repeat(-1) forever, repeat(n) n times, no repeat once.
    let epochs = match source.repeat {
        Some(r) if r < 0 => None,
        Some(r) => Some(u64::try_from(r).unwrap_or(0)),
        None => Some(1),
    };
    if source.repeat_after_batch() {
        let per_epoch = if drop_remainder {
            epoch_len / per_step
        } else {
            epoch_len.div_ceil(per_step)
        };
        let step = StepRef::from_global(step, steps_per_epoch(per_epoch).ok()?);
        if epochs.is_some_and(|e| step.epoch >= e) {
            return None;
        }
        let start = step.in_epoch * per_step;
        let end = (start + per_step).min(epoch_len);
        Some((start..end).collect())
    } else {
        let total = epochs.map(|e| e.saturating_mul(epoch_len));
        let start = step.checked_mul(per_step)?;
        let mut end = start.checked_add(per_step)?;
        if let Some(total) = total {
            if start >= total || (drop_remainder && end > total) {
                return None;
            }
            end = end.min(total);
        }
        Some((start..end).map(|p| p % epoch_len).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(chain: &[&str], repeat: Option<i64>) -> Source {
        Source {
            chain: chain.iter().map(|s| (*s).to_owned()).collect(),
            repeat,
            ..Source::default()
        }
    }

    #[test]
    fn repeat_after_batch_restarts_each_epoch() {
        let s = source(
            &["TensorSliceDataset", "BatchDatasetV2", "RepeatDataset"],
            Some(-1),
        );
        // 10 records, batches of 4, drop_remainder: 2 steps per epoch.
        assert_eq!(
            sequential_records(&s, 10, 4, true, 0),
            Some(vec![0, 1, 2, 3])
        );
        assert_eq!(
            sequential_records(&s, 10, 4, true, 1),
            Some(vec![4, 5, 6, 7])
        );
        assert_eq!(
            sequential_records(&s, 10, 4, true, 2),
            Some(vec![0, 1, 2, 3])
        );
        // Without drop_remainder the short batch is a step.
        assert_eq!(sequential_records(&s, 10, 4, false, 2), Some(vec![8, 9]));
        assert_eq!(
            sequential_records(&s, 10, 4, false, 3),
            Some(vec![0, 1, 2, 3])
        );
    }

    #[test]
    fn repeat_before_batch_runs_across_the_boundary() {
        let s = source(
            &["TensorSliceDataset", "RepeatDataset", "BatchDatasetV2"],
            Some(2),
        );
        assert_eq!(
            sequential_records(&s, 10, 4, true, 2),
            Some(vec![8, 9, 0, 1])
        );
        assert_eq!(
            sequential_records(&s, 10, 4, true, 4),
            Some(vec![6, 7, 8, 9])
        );
        assert_eq!(sequential_records(&s, 10, 4, true, 5), None);
        assert_eq!(sequential_records(&s, 10, 3, false, 6), Some(vec![8, 9]));
    }

    #[test]
    fn finite_repeat_ends() {
        let s = source(&["TensorSliceDataset", "BatchDatasetV2"], None);
        assert_eq!(
            sequential_records(&s, 8, 4, true, 1),
            Some(vec![4, 5, 6, 7])
        );
        assert_eq!(sequential_records(&s, 8, 4, true, 2), None);
    }
}
