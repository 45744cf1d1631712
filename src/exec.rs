//! `lode exec`: a plan's stages 0..=I run in-process for K steps (`lode_runtime::exec::
//! local`), in the order the dispatcher leases them (TensorFlow's, shuffle included, for
//! plans that describe their chain).

use anyhow::{bail, Context as _};
use lode_dataworker::local::{run_steps, run_steps_sending, Transport};
use lode_dispatcher::DispatcherConfig;
use lode_proto::plan::PlanDir;
use lode_runtime::exec::stage::sequential_records;
use lode_runtime::exec::{ExecOptions, Stage};

use crate::cli::{ExecArgs, OutputFormat, TransportArg};

pub fn run_exec(args: ExecArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let plan = PlanDir::open(&args.plan)?;
    let name = args.plan.display().to_string();
    if args.stage >= plan.plan.stages.len() {
        let stages = plan.plan.stages.len();
        bail!(
            "{name}: --stage {} but the plan has {stages} stage(s)",
            args.stage
        );
    }
    if args.transport.is_some() {
        if args.threads.is_some_and(|t| t != 1) {
            bail!("--transport runs the steps on one thread: --threads must be 1 or left out");
        }
        if args.dump.is_some() {
            bail!("--transport and --dump go separately: the dump keeps every step's tensors");
        }
    }
    let threads = match (args.transport, args.threads) {
        // One thread, the stages' own parallelism off too: its CPU clock sees all the work.
        (Some(_), _) => 1,
        (None, Some(threads)) => threads,
        (None, None) => std::thread::available_parallelism().map_or(1, usize::from),
    };
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the worker threads")?;
    let options = ExecOptions {
        ignore_errors: args.ignore_errors,
        parallel: threads > 1,
        data_root: args.data_root.clone(),
    };
    let stages = (0..=args.stage)
        .map(|i| Stage::load(&plan, i, &options).with_context(|| format!("{name}: stage {i}")))
        .collect::<anyhow::Result<Vec<Stage>>>()?;
    let source = lode_dispatcher::plan_source(&plan)?;
    let first = stages.first().context("the plan has no stages")?;
    let (Some(records), Some(per_step)) = (first.records(), first.records_per_step()) else {
        bail!("{name}: stage 0 reads no records (it has no DWSource)");
    };
    if records.dropped > 0 {
        tracing::warn!(
            dropped = records.dropped,
            first = records.first_dropped.as_deref().unwrap_or(""),
            "corrupt records ended their files while indexing (--ignore-errors)"
        );
    }
    let (epoch_len, drop_remainder) = (records.epoch_len(), first.drop_remainder());
    let wanted = args.start_step..args.start_step.saturating_add(args.steps);
    // The steps are computed as the run takes them: a run of any length holds a few
    // thousand record lists at a time.
    let steps: Box<dyn Iterator<Item = (u64, Vec<u64>)> + Send + '_> = if source.order.is_empty() {
        // A plan written before plan.json described the chain: sequential order.
        Box::new(wanted.map_while(|s| {
            sequential_records(source, epoch_len, per_step as u64, drop_remainder, s)
                .map(|r| (s, r))
        }))
    } else {
        DispatcherConfig::program_steps(source, epoch_len, wanted)
            .with_context(|| format!("{name}: the order"))?
    };
    let report = match args.transport {
        None => run_steps(&stages, steps, &pool, args.dump.as_deref()),
        Some(transport) => run_steps_sending(
            &stages,
            steps,
            match transport {
                TransportArg::None => Transport::None,
                TransportArg::Encode => Transport::Encode,
                TransportArg::Loopback => Transport::Loopback,
            },
        ),
    }
    .with_context(|| name.clone())?;
    if report.steps < args.steps {
        let available = report.steps;
        tracing::warn!(
            available,
            "the pipeline ends before the requested steps (finite repeat)"
        );
    }
    match args.format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string(&report)?)?,
        OutputFormat::Text => out.write_all(report.text(args.dump.as_deref()).as_bytes())?,
    }
    Ok(())
}
