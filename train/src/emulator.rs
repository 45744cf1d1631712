//! The training side emulated (`lode consume`, and the consumer of `lode run`): a [`Consumer`]
//! whose caller takes each step for a fixed time, logs it (epoch, step, records and a digest of
//! its tensors) and reports it consumed.
//!
//! # The log and the watermark
//! A step is reported consumed only after its log line is on disk (flushed, not synced: the
//! line survives the process, which is what a kill tests), so a consumer killed at any instant
//! has logged every step the dispatcher counts as consumed; a restarted consumer receives the
//! unreported ones again. Lines are flushed in groups (every [`REPORT_EVERY`], and whenever the
//! next step is not ready yet), so a step costs no write of its own.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::consumer::{Consumer, ConsumerConfig, ConsumerError, Next};
use lode_transfer::Step;

/// Logged steps are flushed and reported at least this often while steps keep coming.
pub const REPORT_EVERY: Duration = Duration::from_millis(50);

/// How long a consumer told to stop retries its last report: what it logged is on disk, and a
/// dispatcher stopped with it (SIGTERM to the whole job) would otherwise keep it for the full
/// patience. An unreported step is delivered again to the next consumer.
pub const STOP_PATIENCE: Duration = Duration::from_secs(2);

/// What the emulator does.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    pub consumer: ConsumerConfig,
    /// The log, appended to (one JSON object a line).
    pub log: PathBuf,
    /// Time each step "trains" before the next is taken.
    pub step_time: Duration,
    /// Stop after this many steps (else at the end of the data).
    pub steps: Option<u64>,
    /// Having taken `steps`, end the job there (`Consumer::end_job`): the dispatcher tells
    /// every worker end of data, so the whole job stops with the training side.
    pub end_job: bool,
    /// The global step the caller expects to receive first (a restart's check); the
    /// dispatcher's watermark decides it, and a mismatch is an error.
    pub expect_first: Option<u64>,
    /// Serve the receiver's metrics here (`GET /metrics`).
    pub metrics: Option<String>,
}

/// What a consumer did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConsumeSummary {
    pub steps: u64,
    pub samples: u64,
    pub seconds: f64,
    pub end_of_data: bool,
    /// The job was ended here (see [`EmulatorConfig::end_job`]).
    pub ended_job: bool,
    /// Step messages the receiver dropped as duplicates (a second copy of a buffered step's
    /// message: a step leased again after its first worker was lost, both copies sent).
    pub dropped_duplicates: u64,
    /// Step messages the receiver dropped as stale (of a step already delivered: e.g. the late
    /// frames of a lost worker's revoked leases).
    pub dropped_stale: u64,
}

/// Why the emulator stopped short.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    #[error("{}: cannot write the consumer log", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("expected to resume at step {expected}, but the dispatcher's watermark says the next step is {next}")]
    ResumeMismatch { expected: u64, next: u64 },
}

/// One line of the log.
#[derive(Debug, Serialize)]
struct LogLine<'a> {
    epoch: u64,
    /// The global step.
    step: u64,
    records: &'a [u64],
    digest: String,
    /// When the step arrived, in microseconds since the consumer started: the gaps between
    /// lines are the training side's stalls (the cluster harness reads them).
    at_us: u64,
}

/// A step's digest: TensorFlow's Fingerprint64 over the wire form of every tensor of every
/// stage's part (dtype, shape and values, as a frame's payload carries them:
/// [`lode_transfer::codec::write_tensors`]), in stage then send order. `scratch` holds the
/// bytes (kept between steps, so that digesting allocates nothing once it has grown).
pub fn digest(step: &Step, scratch: &mut Vec<u8>) -> String {
    scratch.clear();
    for part in &step.parts {
        lode_transfer::codec::write_tensors(&part.tensors, scratch);
    }
    format!("{:016x}", lode_runtime::hash::fingerprint64(scratch))
}

/// Runs the emulator until the data ends, `config.steps` were taken, or `cancelled()` (then
/// what was logged is reported, and the summary says what was done). `progress`, when given,
/// holds the summary so far after every step.
pub fn emulate(
    config: &EmulatorConfig,
    progress: Option<&Mutex<ConsumeSummary>>,
    cancelled: &dyn Fn() -> bool,
) -> Result<ConsumeSummary, EmulatorError> {
    let consumer = Consumer::start(config.consumer.clone())?;
    if let Some(addr) = &config.metrics {
        let bound = consumer.serve_metrics(addr)?;
        tracing::info!(addr = %bound, "receiver metrics");
    }
    if let Some(expected) = config.expect_first {
        let next = consumer.next_step();
        if next != expected {
            return Err(EmulatorError::ResumeMismatch { expected, next });
        }
    }
    let log_error = |source| EmulatorError::Log {
        path: config.log.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&config.log)
        .map_err(log_error)?;
    let mut log = Log {
        out: std::io::BufWriter::new(file),
        logged: None,
        busy: Duration::ZERO,
        last_report: Instant::now(),
    };
    let mut summary = ConsumeSummary::default();
    let mut scratch = Vec::new();
    let started = Instant::now();
    let result = (|| -> Result<(), EmulatorError> {
        while config.steps.is_none_or(|n| summary.steps < n) {
            let step = match consumer.try_next() {
                Some(step) => step,
                None => {
                    // About to wait: what is logged is reported first.
                    log.report(&consumer).map_err(log_error)?;
                    match consumer.next(cancelled) {
                        Ok(Next::Step(step)) => step,
                        Ok(Next::EndOfData) => {
                            summary.end_of_data = true;
                            break;
                        }
                        Err(ConsumerError::Cancelled) => break,
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            let training = Instant::now();
            let records = step.parts.first().map_or(&[][..], |p| &p.records[..]);
            let line = LogLine {
                epoch: step.epoch,
                step: step.step,
                records,
                digest: digest(&step, &mut scratch),
                at_us: u64::try_from(training.duration_since(started).as_micros())
                    .unwrap_or(u64::MAX),
            };
            serde_json::to_writer(&mut log.out, &line)
                .map_err(|e| log_error(std::io::Error::other(e)))?;
            log.out.write_all(b"\n").map_err(log_error)?;
            if !config.step_time.is_zero() {
                std::thread::sleep(config.step_time);
            }
            summary.steps += 1;
            summary.samples += u64::try_from(records.len()).unwrap_or(u64::MAX);
            log.logged = Some(step.step);
            consumer.recycle(step);
            log.busy += training.elapsed();
            if log.last_report.elapsed() >= REPORT_EVERY {
                log.report(&consumer).map_err(log_error)?;
            }
            if let Some(p) = progress {
                if let Ok(mut p) = p.lock() {
                    *p = summary.clone();
                    p.seconds = started.elapsed().as_secs_f64();
                }
            }
            if cancelled() {
                break;
            }
        }
        Ok(())
    })();
    let reported = log.report(&consumer).map_err(log_error);
    let flushed = if cancelled() {
        // A stop was asked for: the last report is a courtesy (the lines are on disk, and a
        // step the dispatcher was not told of is delivered again to the next consumer).
        if let Err(e) = consumer.flush_within(STOP_PATIENCE) {
            tracing::warn!(cause = %e, "stopping without reporting the last steps consumed");
        }
        Ok(())
    } else {
        consumer.flush()
    };
    result?;
    reported?;
    flushed?;
    let reached = config.steps.is_some_and(|n| summary.steps >= n);
    if config.end_job && reached && !summary.end_of_data {
        summary.ended_job = consumer.end_job()?.is_some();
    }
    summary.seconds = started.elapsed().as_secs_f64();
    let dropped = consumer.metrics();
    summary.dropped_duplicates = dropped.duplicates;
    summary.dropped_stale = dropped.stale;
    Ok(summary)
}

/// The log and what of it the dispatcher has not been told.
struct Log {
    out: std::io::BufWriter<std::fs::File>,
    /// The last logged global step not reported yet.
    logged: Option<u64>,
    /// Time spent "training" since the last report.
    busy: Duration,
    last_report: Instant,
}

impl Log {
    /// Flushes the log, then hands the last logged step to the consumer's reporter.
    fn report(&mut self, consumer: &Consumer) -> std::io::Result<()> {
        self.out.flush()?;
        if let Some(global) = self.logged.take() {
            consumer.consumed_after(global, std::mem::take(&mut self.busy));
        }
        self.last_report = Instant::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lode_runtime::{Tensor, TensorData};
    use lode_transfer::StepMessage;

    fn step_of(tensors: Vec<Tensor>) -> Step {
        Step {
            step: 7,
            epoch: 0,
            parts: vec![StepMessage {
                job: 1,
                stage: 0,
                step: 7,
                epoch: 0,
                records: vec![1, 2],
                tensors,
            }],
        }
    }

    fn t(shape: Vec<usize>, data: TensorData) -> Tensor {
        Tensor::new(shape, data).expect("a valid tensor")
    }

    fn strings(v: &[&str]) -> TensorData {
        TensorData::String(v.iter().map(|s| s.as_bytes().to_vec()).collect())
    }

    #[test]
    fn a_digest_tells_apart_what_training_would_see_differently() {
        let mut scratch = Vec::new();
        let mut d = |tensors| digest(&step_of(tensors), &mut scratch);
        let base = d(vec![t(
            vec![2, 3],
            TensorData::Int64(vec![1, 2, 3, 4, 5, 6]),
        )]);
        assert_eq!(base.len(), 16, "{base}");
        // The same tensors, digested again (the scratch reused): the same digest.
        let again = d(vec![t(
            vec![2, 3],
            TensorData::Int64(vec![1, 2, 3, 4, 5, 6]),
        )]);
        assert_eq!(again, base);
        let others = [
            // One value.
            d(vec![t(
                vec![2, 3],
                TensorData::Int64(vec![1, 2, 3, 4, 5, 7]),
            )]),
            // The shape only.
            d(vec![t(
                vec![3, 2],
                TensorData::Int64(vec![1, 2, 3, 4, 5, 6]),
            )]),
            // The dtype only (the same bytes).
            d(vec![t(
                vec![2, 3],
                TensorData::UInt64(vec![1, 2, 3, 4, 5, 6]),
            )]),
            // Split into two tensors.
            d(vec![
                t(vec![1, 3], TensorData::Int64(vec![1, 2, 3])),
                t(vec![1, 3], TensorData::Int64(vec![4, 5, 6])),
            ]),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(other, &base, "variant {i}");
        }
        // Strings: where one ends and the next begins counts.
        assert_ne!(
            d(vec![t(vec![2], strings(&["ab", "c"]))]),
            d(vec![t(vec![2], strings(&["a", "bc"]))])
        );
    }
}
