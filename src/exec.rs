//! `lode exec`: a plan's stages 0..=I run in-process for K steps, in the order the dispatcher
//! leases them (TensorFlow's, shuffle included, for plans that describe their chain).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use lode_dataworker::convert::encode_tensor;
use lode_dataworker::exec::stage::sequential_records;
use lode_dataworker::exec::{ExecOptions, Stage, StepInput};
use lode_dataworker::Tensor;
use lode_dispatcher::{DispatcherConfig, IndexChain};
use lode_proto::plan::{PlanDir, Source};
use rayon::prelude::*;
use serde::Serialize;

use crate::cli::{ExecArgs, OutputFormat};

#[derive(Debug, Serialize)]
struct ExecReport {
    stage: usize,
    steps: u64,
    /// Steps whose element `--ignore-errors` dropped.
    skipped_steps: u64,
    /// Records or elements skipped under `--ignore-errors`.
    skipped_records: u64,
    samples: u64,
    seconds: f64,
    samples_per_sec: f64,
    steps_per_sec: f64,
    threads: usize,
}

/// One step's result: the records it took and whether it produced stage I's send tensors
/// (kept only when they are to be dumped).
struct StepResult {
    samples: u64,
    skipped: u64,
    produced: bool,
    tensors: Option<Vec<Arc<Tensor>>>,
}

fn run_step(stages: &[Stage], records: &[u64], keep: bool) -> anyhow::Result<StepResult> {
    let mut received: HashMap<String, Arc<Tensor>> = HashMap::new();
    let mut skipped = 0;
    let mut last = None;
    for stage in stages {
        let out = stage.run_step(StepInput {
            records,
            received: &received,
        })?;
        skipped += out.skipped;
        let Some(tensors) = out.tensors else {
            return Ok(StepResult {
                samples: 0,
                skipped,
                produced: false,
                tensors: None,
            });
        };
        for (name, t) in stage.send.iter().zip(&tensors) {
            received.insert(name.clone(), t.clone());
        }
        last = Some(tensors);
    }
    Ok(StepResult {
        samples: records.len() as u64 - skipped.min(records.len() as u64),
        skipped,
        produced: last.is_some(),
        tensors: last.filter(|_| keep),
    })
}

/// The records of global steps `wanted` as the dispatcher leases them: the chain of
/// `source.order` over `epoch_len` records, epoch after epoch.
fn chain_steps(
    source: &Source,
    epoch_len: u64,
    wanted: std::ops::Range<u64>,
) -> anyhow::Result<Vec<(u64, Vec<u64>)>> {
    let (mut chain, epochs) = IndexChain::from_program(&source.order, None);
    if let Some(picked) = chain.pick_seed(None) {
        tracing::warn!(
            seed = picked.seed,
            "the input pipeline shuffles without a seed (TensorFlow would pick one at random); \
             this run uses a seed Lode picked"
        );
    }
    // The lease settings play no part in the order.
    let config =
        DispatcherConfig::for_chain(epoch_len, chain, epochs, Duration::from_secs(1), 1, 1)?;
    // An empty epoch has no step to walk.
    let Ok(per_epoch) = lode_proto::step::steps_per_epoch(config.steps_per_epoch()) else {
        return Ok(Vec::new());
    };
    let mut order = config.step_order().context("the chain has no order")?;
    Ok(wanted
        .map_while(|s| {
            let step = lode_proto::step::StepRef::from_global(s, per_epoch);
            order.batch(step.epoch, step.in_epoch).map(|r| (s, r))
        })
        .collect())
}

pub fn run_exec(args: ExecArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let plan = PlanDir::open(&args.plan)?;
    let plan_name = args.plan.display().to_string();
    if args.stage >= plan.plan.stages.len() {
        bail!(
            "{plan_name}: --stage {} but the plan has {} stage(s)",
            args.stage,
            plan.plan.stages.len()
        );
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
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
        .map(|i| Stage::load(&plan, i, &options).with_context(|| format!("{plan_name}: stage {i}")))
        .collect::<anyhow::Result<Vec<Stage>>>()?;
    let source = plan
        .plan
        .source
        .as_ref()
        .with_context(|| format!("{plan_name}: the plan has no input source to read"))?;
    let first = stages
        .first()
        .with_context(|| format!("{plan_name}: the plan has no stages"))?;
    let (Some(records), Some(per_step)) = (first.records(), first.records_per_step()) else {
        bail!("{plan_name}: stage 0 reads no records (it has no DWSource)");
    };
    if records.dropped > 0 {
        tracing::warn!(
            dropped = records.dropped,
            first = records.first_dropped.as_deref().unwrap_or(""),
            "corrupt records ended their files while indexing (--ignore-errors)"
        );
    }
    let epoch_len = records.epoch_len();
    let drop_remainder = first.drop_remainder();
    let wanted = args.start_step..args.start_step.saturating_add(args.steps);
    let steps: Vec<(u64, Vec<u64>)> = if source.order.is_empty() {
        // A plan written before plan.json described the chain: sequential order.
        wanted
            .map_while(|s| {
                sequential_records(source, epoch_len, per_step as u64, drop_remainder, s)
                    .map(|r| (s, r))
            })
            .collect()
    } else {
        chain_steps(source, epoch_len, wanted).with_context(|| format!("{plan_name}: the order"))?
    };
    if (steps.len() as u64) < args.steps {
        tracing::warn!(
            available = steps.len(),
            "the pipeline ends before the requested steps (finite repeat)"
        );
    }
    if let Some(dir) = &args.dump {
        if dir.exists()
            && std::fs::read_dir(dir)
                .map(|mut d| d.next().is_some())
                .unwrap_or(true)
        {
            bail!(
                "{}: the dump directory exists and is not empty",
                dir.display()
            );
        }
    }

    let started = Instant::now();
    let results: Vec<anyhow::Result<(u64, StepResult)>> = pool.install(|| {
        steps
            .par_iter()
            .map(|(s, records)| {
                run_step(&stages, records, args.dump.is_some())
                    .map(|r| (*s, r))
                    .with_context(|| format!("{plan_name}: step {s}"))
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut report = ExecReport {
        stage: args.stage,
        steps: 0,
        skipped_steps: 0,
        skipped_records: 0,
        samples: 0,
        seconds,
        samples_per_sec: 0.0,
        steps_per_sec: 0.0,
        threads,
    };
    let mut done = Vec::new();
    for r in results {
        let (s, result) = r?;
        report.steps += 1;
        report.samples += result.samples;
        report.skipped_records += result.skipped;
        if !result.produced {
            report.skipped_steps += 1;
        }
        done.push((s, result));
    }
    if seconds > 0.0 {
        report.samples_per_sec = report.samples as f64 / seconds;
        report.steps_per_sec = report.steps as f64 / seconds;
    }
    if let Some(dir) = &args.dump {
        for (s, result) in &done {
            let Some(tensors) = &result.tensors else {
                continue;
            };
            let step_dir = dir.join(format!("step_{s}"));
            std::fs::create_dir_all(&step_dir)
                .with_context(|| format!("cannot create {}", step_dir.display()))?;
            for (k, t) in tensors.iter().enumerate() {
                let bytes = encode_tensor(t)?;
                let path = step_dir.join(format!("{k}.pb"));
                lode_proto::io::write_atomic(&path, &bytes)?;
            }
        }
    }
    match args.format {
        OutputFormat::Json => {
            serde_json::to_writer(&mut *out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            writeln!(
                out,
                "stage {}: {} steps, {} samples in {:.3} s: {:.0} samples/s, {:.1} steps/s ({} thread{})",
                report.stage,
                report.steps,
                report.samples,
                report.seconds,
                report.samples_per_sec,
                report.steps_per_sec,
                threads,
                if threads == 1 { "" } else { "s" }
            )?;
            if report.skipped_records > 0 || report.skipped_steps > 0 {
                writeln!(
                    out,
                    "skipped under --ignore-errors: {} records or elements, {} steps",
                    report.skipped_records, report.skipped_steps
                )?;
            }
            if let Some(dir) = &args.dump {
                writeln!(out, "wrote {}", dir.display())?;
            }
        }
    }
    Ok(())
}
