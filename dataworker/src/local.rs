//! A plan's stages run in this process over given steps, in parallel on a rayon pool
//! (`lode exec`): the stages' own speed, without the runtime around them, and a dump of the
//! last stage's send tensors for comparison with TensorFlow.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

use lode_runtime::convert::encode_tensor;
use lode_runtime::exec::{ExecError, Stage, StepInput};
use lode_runtime::Tensor;

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
    #[error("the loopback connection of --transport loopback: {0}")]
    Loopback(#[source] std::io::Error),
    #[error("step {step}: cannot encode its frame: {source}")]
    Encode {
        step: u64,
        #[source]
        source: lode_transfer::TransferError,
    },
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
    /// The process's CPU over the steps (the loading before them not in it), seconds: the
    /// samples per CPU-second a worker is held to (`peer.py worker-eff`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// The CPU of the pool's threads over the same span, seconds: the steps, the freeing of
    /// their tensors and the pool's own bookkeeping; the rest of `cpu_seconds` is the loop
    /// around them (the steps' record lists, the counting). Over `cpu_seconds`, this run's
    /// steady figure, beside a worker's (its stage and freeing over its CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_threads_cpu_seconds: Option<f64>,
    /// The run's sending, with [`run_steps_sending`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sending: Option<SendingReport>,
}

/// What [`run_steps_sending`] does with each step besides computing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Nothing: the step's tensors are freed as in a plain run.
    None,
    /// Encoded into a frame as a worker does for a receiver on its machine (no checksum),
    /// then the tensors freed.
    Encode,
    /// Encoded, and written to a loopback TCP connection in bursts of a worker's most
    /// ([`crate::worker_state::MAX_BURST`] frames, one vectored write each); a
    /// thread of this process reads and drops them.
    Loopback,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::None => "none",
            Transport::Encode => "encode",
            Transport::Loopback => "loopback",
        }
    }
}

/// The sending side of a [`run_steps_sending`] run, per step.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SendingReport {
    pub transport: &'static str,
    /// The stepping thread's CPU a step: the stages, the freeing, and the encoding and the
    /// send when the transport has them (on loopback the kernel's receiving half of TCP runs
    /// in the sender's system call too). The reading thread's CPU is not in it.
    pub cpu_us_per_step: f64,
    /// The stages' wall time a step.
    pub stage_us_per_step: f64,
    /// The freeing of each step's tensors after its frame is encoded (those the frame does
    /// not send from their own memory), timed as a worker times it; 0 with nothing sent.
    pub free_us_per_step: f64,
    /// The stages and the freeing over the thread's CPU: the worker's steady figure for a
    /// loop that does nothing but compute, encode and send (see `peer.py worker-eff`).
    pub steady: f64,
    pub frames: u64,
    /// The frames' bytes with their 4-byte length prefixes (what loopback writes; all of it
    /// is read back before the run ends).
    pub bytes: u64,
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
    let process_before = lode_proto::cpu::process_cpu();
    let threads_before = pool_cpu(pool);
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
            report.count(&result);
            if let (Some(dir), Some(tensors)) = (dump, &result.tensors) {
                write_dump(dir, s, tensors)?;
            }
        }
    }
    let threads_cpu = pool_cpu(pool).saturating_sub(threads_before);
    if let (Some(before), Some(after)) = (process_before, lode_proto::cpu::process_cpu()) {
        report.cpu_seconds = Some(after.saturating_sub(before).as_secs_f64());
        report.step_threads_cpu_seconds = Some(threads_cpu.as_secs_f64());
    }
    report.set_rates();
    Ok(report)
}

/// The CPU time of the pool's threads so far, summed.
fn pool_cpu(pool: &rayon::ThreadPool) -> std::time::Duration {
    pool.broadcast(|_| lode_runtime::clock::thread_cpu())
        .into_iter()
        .sum()
}

impl LocalReport {
    /// Counts a step run.
    fn count(&mut self, result: &StepResult) {
        self.steps += 1;
        self.samples += result.samples;
        self.skipped_records += result.skipped;
        if !result.produced {
            self.skipped_steps += 1;
        }
    }

    /// The rates over `seconds`.
    fn set_rates(&mut self) {
        if self.seconds > 0.0 {
            self.samples_per_sec = self.samples as f64 / self.seconds;
            self.steps_per_sec = self.steps as f64 / self.seconds;
        }
    }
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
        if let (Some(cpu), Some(threads)) = (self.cpu_seconds, self.step_threads_cpu_seconds) {
            s.push_str(&format!(
                "CPU over the steps: {cpu:.3} s, {threads:.3} s of it in the pool's threads ({:.1}%)\n",
                if cpu > 0.0 { threads / cpu * 100.0 } else { 0.0 }
            ));
        }
        if let Some(dir) = dump {
            s.push_str(&format!("wrote {}\n", dir.display()));
        }
        if let Some(sent) = &self.sending {
            s.push_str(&format!(
                "transport {}: {:.2} us of the thread's CPU a step, the stages {:.2} us, the freeing {:.2} us (stages and freeing over the CPU {:.3}); {} frames, {} bytes\n",
                sent.transport,
                sent.cpu_us_per_step,
                sent.stage_us_per_step,
                sent.free_us_per_step,
                sent.steady,
                sent.frames,
                sent.bytes
            ));
        }
        s
    }
}

/// Runs `steps` through `stages` one after another on the calling thread, doing with each
/// step's send tensors what `transport` says, and reports the thread's CPU a step beside the
/// stages' time: what a worker's stage costs with its frame's encoding and send (a worker's
/// floor, without its leases, answers and bookkeeping), against the same loop with nothing
/// sent. The frames are encoded as for a receiver on this machine; a frame's bytes are the
/// data plane's (length prefix, frame).
pub fn run_steps_sending(
    stages: &[Stage],
    steps: impl Iterator<Item = (u64, Vec<u64>)>,
    transport: Transport,
) -> Result<LocalReport, LocalRunError> {
    use crate::worker_state::MAX_BURST;
    use lode_transfer::codec::{CodecConfig, OwnedFrame, StepEncoder, StepMessage};

    let mut link = match transport {
        Transport::Loopback => Some(LoopbackSink::open().map_err(LocalRunError::Loopback)?),
        Transport::None | Transport::Encode => None,
    };
    let mut encoder = StepEncoder::new(CodecConfig::default());
    let mut burst: Vec<OwnedFrame> = Vec::with_capacity(MAX_BURST);
    let mut report = LocalReport {
        stage: stages.len().saturating_sub(1),
        threads: 1,
        ..LocalReport::default()
    };
    let mut sending = SendingReport {
        transport: transport.name(),
        ..SendingReport::default()
    };
    let mut stage_time = std::time::Duration::ZERO;
    let mut free_time = std::time::Duration::ZERO;
    let started = Instant::now();
    let cpu_before = lode_runtime::clock::thread_cpu();
    for (s, records) in steps {
        let computing = Instant::now();
        let result = run_step(stages, &records, transport != Transport::None)
            .map_err(|source| LocalRunError::Step { step: s, source })?;
        stage_time += computing.elapsed();
        report.count(&result);
        let Some(tensors) = result.tensors else {
            continue;
        };
        let tensors = lode_runtime::exec::stage::owned_tensors(tensors);
        let mut msg = StepMessage {
            job: 0,
            stage: u32::try_from(report.stage).unwrap_or(u32::MAX),
            step: s,
            epoch: 0,
            records,
            tensors,
        };
        let frame = encoder
            .encode_owned_for(&mut msg, true)
            .map_err(|source| LocalRunError::Encode { step: s, source })?;
        let freeing = Instant::now();
        drop(msg);
        free_time += freeing.elapsed();
        sending.frames += 1;
        sending.bytes += 4 + frame.len() as u64;
        burst.push(frame);
        if burst.len() >= MAX_BURST {
            if let Some(link) = &mut link {
                link.write(&burst).map_err(LocalRunError::Loopback)?;
            }
            // As a worker does once the receiver has answered.
            for frame in burst.drain(..) {
                encoder.recycle(frame);
            }
        }
    }
    if let Some(mut link) = link {
        link.write(&burst).map_err(LocalRunError::Loopback)?;
        burst.clear();
        let read = link.close().map_err(LocalRunError::Loopback)?;
        if read != sending.bytes {
            return Err(LocalRunError::Loopback(std::io::Error::other(format!(
                "the reader took {read} of the {} bytes written",
                sending.bytes
            ))));
        }
    }
    let cpu = lode_runtime::clock::thread_cpu().saturating_sub(cpu_before);
    report.seconds = started.elapsed().as_secs_f64();
    if report.steps > 0 {
        let n = report.steps as f64;
        sending.cpu_us_per_step = cpu.as_secs_f64() / n * 1e6;
        sending.stage_us_per_step = stage_time.as_secs_f64() / n * 1e6;
        sending.free_us_per_step = free_time.as_secs_f64() / n * 1e6;
        if sending.cpu_us_per_step > 0.0 {
            sending.steady =
                (sending.stage_us_per_step + sending.free_us_per_step) / sending.cpu_us_per_step;
        }
    }
    report.set_rates();
    report.sending = Some(sending);
    Ok(report)
}

/// A loopback TCP connection whose far end a thread reads and drops.
struct LoopbackSink {
    stream: std::net::TcpStream,
    reader: std::thread::JoinHandle<std::io::Result<u64>>,
}

impl LoopbackSink {
    fn open() -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let stream = std::net::TcpStream::connect(listener.local_addr()?)?;
        stream.set_nodelay(true)?;
        let (mut far, _) = listener.accept()?;
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = vec![0u8; 1 << 18];
            let mut total = 0u64;
            loop {
                match far.read(&mut buf) {
                    Ok(0) => return Ok(total),
                    Ok(n) => total += n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        });
        Ok(LoopbackSink { stream, reader })
    }

    /// Writes the frames as the data plane does (each after its length prefix), in vectored
    /// writes.
    fn write(&mut self, frames: &[lode_transfer::codec::OwnedFrame]) -> std::io::Result<()> {
        use lode_transfer::data_plane::{burst_slices, frame_prefixes};
        use std::io::{IoSlice, Write};
        let prefixes = frame_prefixes(frames).map_err(std::io::Error::other)?;
        let mut slices = burst_slices(frames, &prefixes);
        let mut unsent: &mut [IoSlice<'_>] = &mut slices;
        while !unsent.is_empty() {
            let n = self.stream.write_vectored(unsent)?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut unsent, n);
        }
        Ok(())
    }

    /// Closes the connection and waits for the reader, which must have read every byte.
    fn close(self) -> std::io::Result<u64> {
        self.stream.shutdown(std::net::Shutdown::Write)?;
        drop(self.stream);
        self.reader
            .join()
            .map_err(|_| std::io::Error::other("the loopback reader panicked"))?
    }
}
