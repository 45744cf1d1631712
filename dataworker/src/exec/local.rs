//! A plan's stages run in this process over given steps, in parallel on a rayon pool
//! (`lode exec`): the stages' own speed, without the runtime around them, and a dump of the
//! last stage's send tensors for comparison with TensorFlow.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use super::{ExecError, Stage, StepInput};
use crate::convert::encode_tensor;
use crate::Tensor;

/// Why a local run failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalRunError {
    #[error("step {step}: {source}")]
    Step {
        step: u64,
        #[source]
        source: ExecError,
    },
    #[error("{}: the dump directory exists and is not empty", dir.display())]
    DumpNotEmpty { dir: PathBuf },
    #[error("cannot write {}: {source}", path.display())]
    Dump {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What a local run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LocalReport {
    /// The last stage run.
    pub stage: usize,
    pub steps: u64,
    /// Steps whose element `ignore_errors` dropped.
    pub skipped_steps: u64,
    /// Records or elements skipped under `ignore_errors`.
    pub skipped_records: u64,
    pub samples: u64,
    pub seconds: f64,
    pub samples_per_sec: f64,
    pub steps_per_sec: f64,
    pub threads: usize,
}

/// One step's result: the records it took and whether it produced the last stage's send
/// tensors (kept only when they are to be dumped).
struct StepResult {
    samples: u64,
    skipped: u64,
    produced: bool,
    tensors: Option<Vec<Arc<Tensor>>>,
}

/// Runs one step through `stages` in order, each stage receiving what the ones before sent.
fn run_step(stages: &[Stage], records: &[u64], keep: bool) -> Result<StepResult, ExecError> {
    let mut received: HashMap<String, Arc<Tensor>> = HashMap::new();
    let mut skipped = 0;
    let mut last = None;
    for (at, stage) in stages.iter().enumerate() {
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
        // Only a later stage reads them (the last stage's are the step's result, as a
        // worker's are its frame): naming them all would be work a worker does not do.
        if at + 1 < stages.len() {
            for (name, t) in stage.send.iter().zip(&tensors) {
                received.insert(name.clone(), t.clone());
            }
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

/// Steps run at once between two looks at the step iterator: enough to keep every thread
/// busy, few enough that their record lists stay small (a run of any length holds this many).
const STEPS_PER_CHUNK: usize = 4096;

/// Steps per thread run at once when their tensors are kept to be dumped.
const DUMPED_STEPS_PER_THREAD: usize = 4;

/// Runs `steps` (global step, its records) through `stages` on `pool`; with `dump`, writes the
/// last stage's send tensors of step `s` to `dump/step_s/k.pb` (TensorProto). The dump
/// directory must be missing or empty: nothing already there is overwritten.
///
/// The steps are taken from the iterator a chunk at a time (`STEPS_PER_CHUNK`, or a few per
/// thread when dumping) and each chunk runs in parallel, so memory does not grow with the
/// number of steps. `seconds` counts the chunks' runs, not the iterator's work between them.
/// The first failing step (in step order within its chunk) ends the run with its error.
pub fn run_steps(
    stages: &[Stage],
    mut steps: impl Iterator<Item = (u64, Vec<u64>)>,
    pool: &rayon::ThreadPool,
    dump: Option<&Path>,
) -> Result<LocalReport, LocalRunError> {
    if let Some(dir) = dump {
        let non_empty = dir.exists()
            && std::fs::read_dir(dir)
                .map(|mut d| d.next().is_some())
                .unwrap_or(true);
        if non_empty {
            return Err(LocalRunError::DumpNotEmpty {
                dir: dir.to_owned(),
            });
        }
    }
    let chunk_len = if dump.is_some() {
        pool.current_num_threads().max(1) * DUMPED_STEPS_PER_THREAD
    } else {
        STEPS_PER_CHUNK
    };
    let mut report = LocalReport {
        stage: stages.len().saturating_sub(1),
        threads: pool.current_num_threads(),
        ..LocalReport::default()
    };
    loop {
        let chunk: Vec<(u64, Vec<u64>)> = steps.by_ref().take(chunk_len).collect();
        if chunk.is_empty() {
            break;
        }
        let started = Instant::now();
        let results: Vec<Result<(u64, StepResult), LocalRunError>> = pool.install(|| {
            chunk
                .par_iter()
                .map(|(s, records)| {
                    run_step(stages, records, dump.is_some())
                        .map(|r| (*s, r))
                        .map_err(|source| LocalRunError::Step { step: *s, source })
                })
                .collect()
        });
        report.seconds += started.elapsed().as_secs_f64();
        for r in results {
            let (s, result) = r?;
            report.steps += 1;
            report.samples += result.samples;
            report.skipped_records += result.skipped;
            if !result.produced {
                report.skipped_steps += 1;
            }
            if let (Some(dir), Some(tensors)) = (dump, &result.tensors) {
                write_dump(dir, s, tensors)?;
            }
        }
    }
    if report.seconds > 0.0 {
        report.samples_per_sec = report.samples as f64 / report.seconds;
        report.steps_per_sec = report.steps as f64 / report.seconds;
    }
    Ok(report)
}

/// Writes step `s`'s tensors to `dir/step_s/k.pb`.
fn write_dump(dir: &Path, s: u64, tensors: &[Arc<Tensor>]) -> Result<(), LocalRunError> {
    let step_dir = dir.join(format!("step_{s}"));
    std::fs::create_dir_all(&step_dir).map_err(|e| LocalRunError::Dump {
        path: step_dir.clone(),
        source: Box::new(e),
    })?;
    for (k, t) in tensors.iter().enumerate() {
        let path = step_dir.join(format!("{k}.pb"));
        let dump_error = |e: Box<dyn std::error::Error + Send + Sync>| LocalRunError::Dump {
            path: path.clone(),
            source: e,
        };
        let bytes = encode_tensor(t).map_err(|e| dump_error(Box::new(e)))?;
        lode_proto::io::write_atomic(&path, &bytes).map_err(|e| dump_error(Box::new(e)))?;
    }
    Ok(())
}

impl LocalReport {
    /// The report as `lode exec` prints it.
    pub fn text(&self, dump: Option<&Path>) -> String {
        let mut s = format!(
            "stage {}: {} steps, {} samples in {:.3} s: {:.0} samples/s, {:.1} steps/s ({} thread{})\n",
            self.stage,
            self.steps,
            self.samples,
            self.seconds,
            self.samples_per_sec,
            self.steps_per_sec,
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        );
        if self.skipped_records > 0 || self.skipped_steps > 0 {
            s.push_str(&format!(
                "skipped under --ignore-errors: {} records or elements, {} steps\n",
                self.skipped_records, self.skipped_steps
            ));
        }
        if let Some(dir) = dump {
            s.push_str(&format!("wrote {}\n", dir.display()));
        }
        s
    }
}
