//! The `lode` command line: wiring of Lode's crates behind one binary.
//!
//! # Layout
//! - `cli`: clap argument types, nothing else.
//! - `exec`: `lode exec` (the stages run by `lode_dataworker::local` in the order
//!   `lode_dispatcher` leases).
//! - `runtime`: `lode dispatcher`, `worker`, `consume`, `drain`, `status` and `run`, and
//!   [`runtime::LocalJob`] (a dispatcher on a thread with local worker processes), which
//!   `lode run` and `lode train` share.
//! - `run_report`: what `lode run` prints at its end (the cut, the workers, the rate, and the
//!   consumer's log held to the dispatcher's order).
//! - `simulate`: `lode simulate` (`lode_scheduler::experiment`).
//! - `scheduler`: `lode scheduler` (`lode_scheduler::local`).
//! - `controller`: `lode controller` (`lode_k8s`): the controller, `--render`, `--print-crd`.
//! - `train`: `lode train` (the session hook of `lode_train::hook`, answered
//!   with a job cut by `lode_decoupler`).
//! - [`run`]: dispatches a parsed command; `main` only parses, sets up logging and exits.
//!
//! Logic lives in the crates; what stays here turns arguments into the crates' settings and
//! wires crates that do not know each other (the cut needs the data worker's kernels, a job
//! needs a dispatcher and workers).
//!
//! # Invariants
//! - Exit status 0 on success, 2 on any error; errors are one line naming the file and the
//!   problem.
//! - Nothing the user gave is overwritten: outputs are written atomically and never onto the
//!   input.

pub mod cli;
pub mod controller;
pub mod exec;
pub mod run_report;
pub mod runtime;
pub mod scheduler;
pub mod simulate;
pub mod train;

use anyhow::Context as _;
use lode_proto::io::{self, GraphEncoding, LoadOptions};

use crate::cli::{
    Command, ConvertArgs, GraphFormat, InspectArgs, ModelArgs, OutputFormat, PartitionArgs,
};

/// Whether a command's standard output is a report of work it did (which `-q` silences),
/// rather than the answer it was asked for (an inspection, a status, a table, an address).
pub fn reports_work(command: &Command) -> bool {
    matches!(
        command,
        Command::Convert(_)
            | Command::Partition(_)
            | Command::Consume(_)
            | Command::Run(_)
            | Command::Drain(_)
            | Command::Synthetic(_)
    )
}

/// Runs one command, writing its output to `out`.
pub fn run(command: Command, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match command {
        Command::Inspect(args) => run_inspect(args, out),
        Command::Convert(args) => run_convert(args, out),
        Command::Partition(args) => run_partition(args, out),
        Command::Exec(args) => exec::run_exec(args, out),
        Command::Dispatcher(args) => runtime::run_dispatcher(args, out),
        Command::Worker(args) => runtime::run_worker_command(args, out),
        Command::Consume(args) => runtime::run_consume(args, out),
        Command::Status(args) => runtime::run_status(args, out),
        Command::Run(args) => runtime::run_run(args, out),
        Command::Drain(args) => runtime::run_drain(args, out),
        Command::Simulate(args) => simulate::run_simulate(args, out),
        Command::Synthetic(args) => run_synthetic(args, out),
        Command::Kernels(args) => run_kernels(args, out),
        Command::Scheduler(args) => scheduler::run_scheduler(args, out),
        Command::Controller(args) => controller::run_controller(args, out),
        Command::Train(args) => train::run_train(args, out),
    }
}

fn load(args: &ModelArgs) -> anyhow::Result<io::Model> {
    let options = LoadOptions {
        tags: args.tags.clone(),
    };
    tracing::debug!(path = %args.model.display(), "loading model");
    Ok(io::load(&args.model, &options)?)
}

fn run_inspect(args: InspectArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let model = load(&args.model)?;
    let report = lode_decoupler::inspect::inspect(&model);
    match args.format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Text => out.write_all(report.to_text().as_bytes())?,
    }
    Ok(())
}

fn run_convert(args: ConvertArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let model = load(&args.model)?;
    let encoding = match args.to {
        GraphFormat::Pb => GraphEncoding::Binary,
        GraphFormat::Pbtxt => GraphEncoding::Text,
    };
    let bytes = io::write_graph(&model, &args.model.model, &args.output, encoding)?;
    let (output, nodes) = (args.output.display(), model.graph.node.len());
    writeln!(out, "wrote {output} ({nodes} nodes, {bytes} bytes)")?;
    Ok(())
}

/// Partitions `model` into `dir` with default options (what `lode run MODEL` does first).
pub fn partition_to(
    model: &std::path::Path,
    tags: Option<Vec<String>>,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let args = PartitionArgs {
        model: ModelArgs {
            model: model.to_owned(),
            tags,
        },
        output: dir.to_owned(),
        simple: false,
        stateful_ops: Vec::new(),
        strict_kernels: false,
        data_root: None,
        format: OutputFormat::Text,
    };
    run_partition(args, &mut std::io::sink())
}

/// The data worker's kernels, as the decoupler's cut takes them.
pub const KERNELS: lode_decoupler::kernels::KernelCheck = lode_runtime::exec::stage::runs_natively;

/// What the data worker has no kernel for, as the decoupler records it.
pub const MISSING: lode_decoupler::kernels::MissingKernels =
    lode_runtime::exec::stage::unsupported_ops;

fn run_partition(args: PartitionArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let options = LoadOptions {
        tags: args.model.tags.clone(),
    };
    let (path, bytes) = io::load_graph_bytes(&args.model.model, &options)?;
    let decouple_options = lode_decoupler::Options {
        simple: args.simple,
        stateful_ops: args.stateful_ops.clone(),
        // Strict: cut as if every op ran, then refuse below what the workers cannot run.
        kernels: (!args.strict_kernels).then_some(KERNELS),
    };
    let data_root = match &args.data_root {
        Some(dir) => std::fs::canonicalize(dir)
            .with_context(|| format!("{}: the data root is not a directory", dir.display()))?,
        None => io::default_data_root(&args.model.model)?,
    };
    let (decoupled, missing) =
        lode_decoupler::decouple_file(&path, &bytes, &decouple_options, &data_root, MISSING)?;
    lode_decoupler::plan::write_dir(
        &args.output,
        &decoupled.graphs,
        &decoupled.plan,
        &decoupled.report,
        &decoupled.dot,
    )?;
    match args.format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&decoupled.plan)?)?,
        OutputFormat::Text => {
            out.write_all(decoupled.report.as_bytes())?;
            writeln!(out, "\nwrote {}", args.output.display())?;
        }
    }
    // Without --strict-kernels the cut keeps what workers cannot run in training, so a
    // missing kernel here would be the cut's own bug: refused all the same.
    if missing > 0 {
        let strict = if args.strict_kernels {
            " (without --strict-kernels those nodes stay in training)"
        } else {
            ""
        };
        return Err(NegativeAnswer(format!(
            "{}: the plan was written, but {missing} op(s) of its stages have no data-worker \
             kernel (listed in the report); data workers will refuse those stages{strict}",
            args.output.display(),
        ))
        .into());
    }
    Ok(())
}

/// A command answered "no" (e.g. unsupported ops found): exit status 1, not 2.
#[derive(Debug)]
pub struct NegativeAnswer(pub String);

impl std::fmt::Display for NegativeAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NegativeAnswer {}

/// `lode kernels`: the ops data workers run natively (the production kernel registry).
fn run_kernels(args: cli::KernelsArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    if let Some(dir) = &args.coverage {
        return run_coverage(dir, args.format, out);
    }
    let ops: Vec<&str> = lode_runtime::exec::ops::supported().collect();
    match args.format {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &ops)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            for op in &ops {
                writeln!(out, "{op}")?;
            }
        }
    }
    Ok(())
}

/// `lode kernels --coverage DIR`: every construct graph of DIR cut with the data worker's
/// kernels (decoupler's `coverage`).
fn run_coverage(
    dir: &std::path::Path,
    format: OutputFormat,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let options = lode_decoupler::Options {
        kernels: Some(KERNELS),
        ..lode_decoupler::Options::default()
    };
    let report = lode_decoupler::coverage::check_dir(dir, &options)?;
    match format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?,
        OutputFormat::Text => out.write_all(report.text().as_bytes())?,
    }
    if !report.problems.is_empty() {
        return Err(NegativeAnswer(format!(
            "{}: {} construct(s) neither native nor a documented exception",
            dir.display(),
            report.problems.len()
        ))
        .into());
    }
    Ok(())
}

/// `lode synthetic`: writes a fixed-latency one-stage plan.
fn run_synthetic(args: cli::SyntheticArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let spec = lode_runtime::synthetic::SyntheticSpec {
        records: args.records,
        batch: args.batch,
        latency: args.latency,
        spin: args.spin,
        width: args.width,
        epochs: args.epochs,
        parallelism: args.parallelism,
        values: match args.values {
            cli::SyntheticValuesArg::Floats => lode_runtime::synthetic::SyntheticValues::Floats,
            cli::SyntheticValuesArg::Ids => lode_runtime::synthetic::SyntheticValues::Ids,
        },
    };
    spec.write(&args.output)?;
    writeln!(out, "wrote {}: {spec}", args.output.display())?;
    Ok(())
}
