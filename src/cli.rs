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
    /// What to print: a summary (text) or plan.json (json).
    #[arg(long, value_enum, default_value_t = OutputFormat::Text, env = "LODE_FORMAT")]
    pub format: OutputFormat,
}
