//! The `lode` command line (clap derive). Parsing only: `lib.rs` does the work.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "lode",
    version,
    about = "Decouple the input pipeline of TensorFlow training graphs onto elastic data workers"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); also LODE_LOG / RUST_LOG filters.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what a model holds: format, nodes, ops, functions, variables, input pipeline,
    /// signatures.
    Inspect(InspectArgs),
    /// Write a model's GraphDef as binary (.pb) or text (.pbtxt).
    Convert(ConvertArgs),
    /// Cut a training graph into a training-worker graph and data-worker stage graphs.
    Partition(PartitionArgs),
    /// Run a plan's data-worker stages in-process for a number of steps, in sequential order;
    /// dump the send tensors or report the throughput.
    Exec(ExecArgs),
    /// Simulate a GPU cluster's jobs under Lode's schedulers and the paper's baselines.
    Simulate(crate::simulate::SimulateArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// Binary GraphDef.
    Pb,
    /// Text GraphDef.
    Pbtxt,
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A GraphDef (.pb/.pbtxt), a MetaGraphDef (.meta) or a SavedModel directory.
    pub model: PathBuf,
    /// SavedModel tag set to select, comma-separated (e.g. `serve` or `train,gpu`); needed when
    /// the SavedModel holds several MetaGraphs.
    #[arg(long, value_delimiter = ',', env = "LODE_TAGS")]
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Output encoding.
    #[arg(long, value_enum)]
    pub to: GraphFormat,
    /// Output file; written atomically, never over the input.
    #[arg(short, long)]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct PartitionArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The plan directory to create (must not exist, or be empty).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Cut at IteratorGetNext (the tf.data boundary) instead of the maximal stateless region.
    #[arg(long)]
    pub simple: bool,
    /// An op to treat as model state besides VariableV2, Variable and VarHandleOp (repeatable).
    #[arg(long = "stateful-op", value_name = "OP")]
    pub stateful_ops: Vec<String>,
    /// The directory the graph's relative data paths (input files, vocabularies) resolve
    /// against, recorded in plan.json; default: the directory holding the model file (for a
    /// SavedModel directory, the directory holding it).
    #[arg(long, value_name = "DIR")]
    pub data_root: Option<PathBuf>,
    /// What to print: a summary (text) or plan.json (json).
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// A plan directory written by `lode partition`.
    pub plan: PathBuf,
    /// Run stages 0..=STAGE; STAGE's send tensors are dumped or counted.
    #[arg(long, default_value_t = 0)]
    pub stage: usize,
    /// Steps to run.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// The first step (steps count from 0 across epochs).
    #[arg(long, default_value_t = 0)]
    pub start_step: u64,
    /// Worker threads (rayon); default: one per core.
    #[arg(long, env = "LODE_THREADS")]
    pub threads: Option<usize>,
    /// Write each step's send tensors as binary TensorProtos DIR/step_<s>/<k>.pb.
    #[arg(long, value_name = "DIR")]
    pub dump: Option<PathBuf>,
    /// Where the graph's relative data paths resolve (default: the plan's data_root).
    #[arg(long, value_name = "DIR")]
    pub data_root: Option<PathBuf>,
    /// Skip and count corrupt records and malformed lines or examples, as TensorFlow's
    /// `ignore_errors()` does, instead of failing.
    #[arg(long)]
    pub ignore_errors: bool,
    /// Report format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
}
