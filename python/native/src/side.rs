//! The training side of one job of a process: the job's [`Consumer`] and the rules that turn
//! TensorFlow's runs into Lode's steps. No FFI here; [`crate::ffi`] wraps it, one side per
//! job.
//!
//! # Steps and runs
//! Every DWRecv node of one `session.run` takes the same step: the first DWRecv of a run
//! (TensorFlow's step id) pops the next step, and the others of that run take their stage's
//! part of it. A step is consumed once its run has finished: when the training package says so
//! ([`TrainingSide::run_finished`], after `session.run` returns) or, at the latest, when a DWRecv
//! of a later run asks for data.
//!
//! # Iterator passes
//! Each run of the iterator's initializer (its stand-in op calls [`TrainingSide::iterator_init`])
//! starts a new pass through the pipeline, as TensorFlow's iterator does, which ends
//! (OutOfRange) after the pipeline's own steps: its `repeat` count times the steps of an
//! epoch. Pass `k` takes the job's steps `k·L .. (k+1)·L` (L the pass length): the job's epochs
//! run on across passes, so that a pass that was read to its end is followed by the next
//! without a restart of the data order (the workers are already computing it), and epoch `e`'s
//! order is TensorFlow's `e`-th iteration of the pipeline. A pass left before its end makes the
//! job skip to the next pass's first step. A pipeline that repeats forever has one pass; its
//! re-initialization restarts the job at step 0. The first initialization after a checkpoint
//! was restored keeps the restored position, so that a restarted program receives the step
//! after its checkpoint, as an uninterrupted run would.
//!
//! # TF2 iterators and their checkpoints
//! A TF2 program's iterator is a stand-in dataset (python/lode/_tf2.py) whose elements are
//! the job's step numbers: a new iterator begins its pass ([`TrainingSide::pass_begin`], the
//! pass's first step becoming part of the iterator's own state), and each element says which
//! step it is before its DWRecv runs ([`TrainingSide::seek`]). TensorFlow's checkpoint of the
//! iterator thus holds the position; an iterator restored from one yields the step after it,
//! and the receiver moves there.

use std::sync::Arc;
use std::time::Duration;

use lode_proto::tls::{ClientTls, ServerTls};
use lode_train::consumer::{Consumer, ConsumerConfig, ConsumerError, Next};
use lode_transfer::Step;

/// The environment variables a process without explicit configuration reads.
pub const ENV_DISPATCHER: &str = "LODE_DISPATCHER";
pub const ENV_TOKEN: &str = "LODE_TOKEN";
pub const ENV_JOB: &str = "LODE_JOB";
pub const ENV_TLS_CA: &str = "LODE_TLS_CA";
pub const ENV_TLS_CERT: &str = "LODE_TLS_CERT";
pub const ENV_TLS_KEY: &str = "LODE_TLS_KEY";
pub const ENV_PATIENCE: &str = "LODE_PATIENCE_SECS";

/// Why the training side failed.
#[derive(Debug, thiserror::Error)]
pub enum SideError {
    #[error(
        "no Lode job is configured in this process: set {ENV_DISPATCHER} (the job's dispatcher \
         URL) and {ENV_TOKEN} (its token), or run the program under `lode train`"
    )]
    NotConfigured,
    #[error("job {job} is not one of a program's jobs (1 to {max})")]
    NoSuchJob { job: i64, max: u64 },
    #[error(
        "job {job} of this process is not connected: the package connects each job it is given \
         (lode_connect) before its ops run"
    )]
    NotConnected { job: u64 },
    #[error("{var}={value:?}: {why}")]
    BadSetting {
        var: &'static str,
        value: String,
        why: String,
    },
    #[error("the configuration is not valid JSON: {0}")]
    BadConfig(#[from] serde_json::Error),
    #[error("{0}")]
    Tls(#[from] lode_proto::tls::TlsError),
    #[error(transparent)]
    Consumer(#[from] ConsumerError),
    #[error("step {step} has no tensors from stage {stage} (its parts: {parts:?})")]
    NoPart {
        step: u64,
        stage: u32,
        parts: Vec<u32>,
    },
}

/// How the process reaches its job.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct JobConfig {
    pub dispatcher: String,
    pub token: String,
    #[serde(default = "default_job")]
    pub job: u64,
    #[serde(default)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The receiver's TLS identity (it then registers as https://).
    #[serde(default)]
    pub tls_cert: Option<std::path::PathBuf>,
    #[serde(default)]
    pub tls_key: Option<std::path::PathBuf>,
    /// Seconds an unreachable dispatcher is retried before DWRecv fails.
    #[serde(default = "default_patience")]
    pub patience_secs: u64,
    /// Steps buffered ahead, at most (the window is also bounded in bytes: see
    /// `lode_transfer::receiver`).
    #[serde(default = "default_capacity")]
    pub capacity: u64,
    /// Steps of one pass of the program's iterator, when the dispatcher runs on across passes
    /// (`lode train`); absent, the dispatcher's own job length is one pass.
    #[serde(default)]
    pub pass_steps: Option<u64>,
    /// The program's pipeline repeats forever (one endless pass).
    #[serde(default)]
    pub endless: bool,
    /// Where the receiver listens (default: a free loopback port); `0.0.0.0:0` in a pod.
    #[serde(default)]
    pub listen: Option<String>,
    /// `HOST[:PORT]` data workers dial for the receiver (e.g. the pod IP).
    #[serde(default)]
    pub advertise: Option<String>,
}

fn default_job() -> u64 {
    1
}
fn default_patience() -> u64 {
    30
}
fn default_capacity() -> u64 {
    lode_transfer::receiver::DEFAULT_CAPACITY
}

impl JobConfig {
    /// The job named by the `LODE_*` environment variables.
    pub fn from_env() -> Result<Self, SideError> {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        let (Some(dispatcher), Some(token)) = (var(ENV_DISPATCHER), var(ENV_TOKEN)) else {
            return Err(SideError::NotConfigured);
        };
        let number = |name: &'static str, default: u64| match var(name) {
            None => Ok(default),
            Some(v) => v.parse::<u64>().map_err(|e| SideError::BadSetting {
                var: name,
                why: e.to_string(),
                value: v,
            }),
        };
        Ok(JobConfig {
            dispatcher,
            token,
            job: number(ENV_JOB, default_job())?,
            tls_ca: var(ENV_TLS_CA).map(Into::into),
            tls_cert: var(ENV_TLS_CERT).map(Into::into),
            tls_key: var(ENV_TLS_KEY).map(Into::into),
            patience_secs: number(ENV_PATIENCE, default_patience())?,
            capacity: default_capacity(),
            pass_steps: None,
            endless: false,
            listen: None,
            advertise: None,
        })
    }

    fn consumer_config(&self) -> Result<ConsumerConfig, SideError> {
        let mut c = ConsumerConfig::new(&self.dispatcher, &self.token, self.job);
        c.client_tls = self
            .tls_ca
            .as_deref()
            .map(ClientTls::from_ca_file)
            .transpose()?;
        c.server_tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls::from_pem_files(cert, key)?),
            _ => None,
        };
        c.patience = Duration::from_secs(self.patience_secs.max(1));
        c.capacity = self.capacity.max(1);
        if let Some(listen) = &self.listen {
            c.listen.clone_from(listen);
        }
        c.advertise.clone_from(&self.advertise);
        Ok(c)
    }
}

/// What a DWRecv receives.
#[derive(Debug)]
pub enum Received {
    /// Stage part `part` of `step`.
    Part {
        step: Arc<Step>,
        part: usize,
    },
    EndOfData,
}

/// The training side of one job of the process (see the module documentation).
#[derive(Debug)]
pub struct TrainingSide {
    consumer: Consumer,
    /// Steps of one pass of the iterator; None when the pipeline repeats forever.
    pass_steps: Option<u64>,
    /// The pass in progress.
    pass: u64,
    /// The step of the run in progress (or just finished) and the run's id.
    current: Option<(i64, Arc<Step>)>,
    /// A checkpoint was restored and no initializer has run since.
    restored: bool,
    /// The initializer has run at least once.
    initialized: bool,
}

impl TrainingSide {
    pub fn connect(config: &JobConfig) -> Result<Self, SideError> {
        let consumer = Consumer::start(config.consumer_config()?)?;
        let pass_steps = match (config.endless, config.pass_steps) {
            (true, _) => None,
            (false, Some(n)) => Some(n),
            (false, None) => consumer.job_steps()?,
        };
        Ok(TrainingSide {
            consumer,
            pass_steps,
            pass: 0,
            current: None,
            restored: false,
            initialized: false,
        })
    }

    /// Stage `stage`'s tensors of the step of run `run` (see the module documentation),
    /// waiting for the step until `cancelled()`.
    pub fn recv(
        &mut self,
        run: i64,
        stage: u32,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Received, SideError> {
        if let Some(step) = self.current_of(run) {
            return part_of(step, stage);
        }
        if self.pass_ended() {
            return Ok(Received::EndOfData);
        }
        match self.consumer.next(cancelled)? {
            Next::EndOfData => Ok(Received::EndOfData),
            Next::Step(step) => part_of(self.begin(run, step), stage),
        }
    }

    /// [`Self::recv`] without waiting: None when the run needs a step that is not complete
    /// yet (the caller then waits with [`Self::recv`], off TensorFlow's op threads). The end
    /// of the data is known here only at the end of a pass; otherwise `recv` finds it.
    pub fn try_recv(&mut self, run: i64, stage: u32) -> Result<Option<Received>, SideError> {
        if let Some(step) = self.current_of(run) {
            return part_of(step, stage).map(Some);
        }
        if self.pass_ended() {
            return Ok(Some(Received::EndOfData));
        }
        match self.consumer.try_next() {
            None => Ok(None),
            Some(step) => part_of(self.begin(run, step), stage).map(Some),
        }
    }

    /// The step run `run` took already, if it did; else the previous run has finished (a
    /// later run asks for data), and its step is consumed.
    fn current_of(&mut self, run: i64) -> Option<Arc<Step>> {
        match &self.current {
            Some((id, step)) if *id == run => Some(step.clone()),
            _ => {
                self.run_finished();
                None
            }
        }
    }

    /// The current pass has delivered all its steps.
    fn pass_ended(&self) -> bool {
        self.pass_end()
            .is_some_and(|end| self.consumer.next_step() >= end)
    }

    /// Run `run` takes `step`.
    fn begin(&mut self, run: i64, step: Step) -> Arc<Step> {
        let step = Arc::new(step);
        self.current = Some((run, step.clone()));
        step
    }

    /// The run that took the current step has finished: the step is consumed.
    pub fn run_finished(&mut self) {
        if let Some((_, step)) = self.current.take() {
            self.consumer.consumed(step.step);
            // The ops copied its tensors into TensorFlow's: the memory serves later steps.
            if let Ok(step) = Arc::try_unwrap(step) {
                self.consumer.recycle(step);
            }
        }
    }

    /// The next step the program receives: the number of steps this pass consumed so far,
    /// which a checkpoint saves.
    pub fn position(&self) -> u64 {
        match &self.current {
            Some((_, step)) => step.step.saturating_add(1),
            None => self.consumer.next_step(),
        }
    }

    /// The first step after the current pass, when passes end.
    fn pass_end(&self) -> Option<u64> {
        self.pass_steps
            .map(|n| self.pass.saturating_add(1).saturating_mul(n))
    }

    /// The program's iterator initializer ran (see the module documentation).
    pub fn iterator_init(&mut self) -> Result<(), SideError> {
        self.run_finished();
        let first = !std::mem::replace(&mut self.initialized, true);
        if std::mem::take(&mut self.restored) {
            return Ok(());
        }
        let next = self.consumer.next_step();
        let (pass, start) = pass_start(self.pass_steps, self.pass, next, first);
        self.pass = pass;
        if start != next {
            self.consumer.resume(start)?;
        }
        Ok(())
    }

    /// A checkpoint that had consumed every step before `next` was restored.
    pub fn resume(&mut self, next: u64) -> Result<(), SideError> {
        self.current = None;
        self.restored = true;
        self.pass = pass_of(self.pass_steps, next);
        self.consumer.resume(next)?;
        Ok(())
    }

    /// A new iterator of a TF2 dataset begins the next pass, as [`Self::iterator_init`]
    /// starts it; returns the pass's first step, which the iterator carries in its state.
    pub fn pass_begin(&mut self) -> Result<u64, SideError> {
        self.iterator_init()?;
        Ok(self.consumer.next_step())
    }

    /// The program's iterator yields job step `step` next (see the module documentation):
    /// the previous element's run has finished, and a receiver elsewhere (the iterator was
    /// restored from a checkpoint) moves to `step`, in that step's pass.
    pub fn seek(&mut self, step: u64) -> Result<(), SideError> {
        self.run_finished();
        if self.consumer.next_step() == step {
            return Ok(());
        }
        self.pass = pass_of(self.pass_steps, step);
        self.consumer.resume(step)?;
        Ok(())
    }

    /// Reports the consumed watermark now.
    pub fn flush(&self) -> Result<(), SideError> {
        Ok(self.consumer.flush()?)
    }
}

/// Stage `stage`'s part of `step`.
fn part_of(step: Arc<Step>, stage: u32) -> Result<Received, SideError> {
    let part = step
        .parts
        .iter()
        .position(|p| p.stage == stage)
        .ok_or_else(|| SideError::NoPart {
            step: step.step,
            stage,
            parts: step.parts.iter().map(|p| p.stage).collect(),
        })?;
    Ok(Received::Part { step, part })
}

/// The pass job step `step` belongs to (passes of `pass_steps` steps; None: one endless pass).
fn pass_of(pass_steps: Option<u64>, step: u64) -> u64 {
    pass_steps.map_or(0, |n| step / n.max(1))
}

/// Where an initialization of the iterator starts reading: `(pass, first step)`, given the
/// pass length (None: endless), the pass in progress, the next step the receiver delivers and
/// whether this is the first initialization (see the module documentation).
fn pass_start(pass_steps: Option<u64>, pass: u64, next: u64, first: bool) -> (u64, u64) {
    match pass_steps {
        None => (0, 0),
        Some(n) if first => (pass, pass.saturating_mul(n)),
        Some(n) => {
            let pass = next.div_ceil(n.max(1));
            (pass, pass.saturating_mul(n))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{pass_of, pass_start};

    #[test]
    fn a_step_belongs_to_the_pass_its_iterator_read_it_in() {
        assert_eq!(pass_of(Some(8), 0), 0);
        assert_eq!(pass_of(Some(8), 7), 0);
        assert_eq!(pass_of(Some(8), 8), 1);
        assert_eq!(pass_of(Some(8), 61), 7);
        // A restored step of an endless pipeline is in its one pass.
        assert_eq!(pass_of(None, 61), 0);
        // A zero-length pass (an empty dataset) divides by nothing.
        assert_eq!(pass_of(Some(0), 5), 5);
    }

    #[test]
    fn a_restored_step_then_a_new_iterator_starts_the_pass_after_it() {
        // Restored at step 13 of 8-step passes (pass 1), read to 16: the next iterator's pass.
        let pass = pass_of(Some(8), 13);
        assert_eq!(pass_start(Some(8), pass, 16, false), (2, 16));
        // Left at step 14: the next iterator skips to pass 2 as well.
        assert_eq!(pass_start(Some(8), pass, 14, false), (2, 16));
    }

    #[test]
    fn a_pass_read_to_its_end_is_followed_by_the_next_without_a_restart() {
        // 8 steps a pass: after pass 0 the receiver is at step 8, where pass 1 starts.
        assert_eq!(pass_start(Some(8), 0, 8, false), (1, 8));
        assert_eq!(pass_start(Some(8), 4, 40, false), (5, 40));
    }

    #[test]
    fn a_pass_left_early_skips_to_the_next_pass() {
        assert_eq!(pass_start(Some(8), 0, 3, false), (1, 8));
        assert_eq!(pass_start(Some(8), 1, 9, false), (2, 16));
    }

    #[test]
    fn the_first_initialization_starts_the_pass_in_progress_from_its_beginning() {
        // A program restarted without a checkpoint reads from step 0, as TensorFlow does.
        assert_eq!(pass_start(Some(8), 0, 13, true), (0, 0));
        assert_eq!(pass_start(Some(8), 0, 0, true), (0, 0));
    }

    #[test]
    fn an_endless_pipeline_restarts_at_step_zero_when_initialized_again() {
        assert_eq!(pass_start(None, 0, 57, false), (0, 0));
        assert_eq!(pass_start(None, 0, 57, true), (0, 0));
    }
}
