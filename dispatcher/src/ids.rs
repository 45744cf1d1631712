//! Newtype ids and the dispatcher's notion of time.

use std::fmt;

use lode_proto::step::{steps_per_epoch, StepRef};
use serde::{Deserialize, Serialize};

/// A training job; one dispatcher serves one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub u64);

/// A data worker, as named by the service layer at registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub u64);

/// A data-worker stage of the plan, numbered from 0 (the stage that reads records).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StageId(pub u32);

/// A pass over the dataset, numbered from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Epoch(pub u64);

/// A step within an epoch, numbered from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Step(pub u64);

/// A step of the job as the protocol and the journal name it: `(epoch, step)`, ordered as the
/// training side consumes them, not yet checked against the job. Its global number, and the
/// way back, go through [`lode_proto::step::StepRef`] (the one checked conversion).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StepId {
    pub epoch: Epoch,
    pub step: Step,
}

impl StepId {
    pub fn new(epoch: u64, step: u64) -> Self {
        Self {
            epoch: Epoch(epoch),
            step: Step(step),
        }
    }

    /// This step in both numberings in a job of `per_epoch` steps an epoch; None when the
    /// epoch has no such step or the step no global number.
    pub fn numbered(self, per_epoch: u64) -> Option<StepRef> {
        let per = steps_per_epoch(per_epoch).ok()?;
        StepRef::new(self.epoch.0, self.step.0, per).ok()
    }

    /// The step of global number `global`; None when an epoch has no steps.
    pub fn from_global(global: u64, per_epoch: u64) -> Option<StepId> {
        let per = steps_per_epoch(per_epoch).ok()?;
        Some(StepRef::from_global(global, per).into())
    }
}

impl From<StepRef> for StepId {
    fn from(s: StepRef) -> Self {
        StepId::new(s.epoch, s.in_epoch)
    }
}

/// A point in time in milliseconds since an origin the service layer chooses (a monotonic
/// clock). The state machine never reads a clock: every command that needs time carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Time(pub u64);

impl Time {
    pub fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating: a deadline past the end of time never expires.
    pub fn saturating_add_millis(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job-{}", self.0)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker-{}", self.0)
    }
}

impl fmt::Display for StageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stage-{}", self.0)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} step {}", self.epoch, self.step)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
