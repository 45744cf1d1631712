//! The dispatcher's settings, validated once so that the state machine can rely on them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::order::{IndexChain, StepOrder};
use crate::{Error, Result};

/// Lode's own order (configs without a chain): whether and how the records of an epoch are
/// permuted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Shuffle {
    /// Records in file order, every epoch.
    Off,
    /// A permutation per epoch derived from `seed` and the epoch number alone.
    Seeded { seed: u64 },
}

/// The settings of one job's dispatcher. Build it with struct syntax, then hand it to
/// [`crate::DispatcherState::new`], which calls [`DispatcherConfig::validate`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatcherConfig {
    /// Records in the dataset (the index's length); record ids are `0..records`.
    pub records: u64,
    /// Records per step.
    pub batch_size: u64,
    /// Drop a short last batch of an epoch instead of emitting it.
    pub drop_remainder: bool,
    pub shuffle: Shuffle,
    /// TensorFlow's order: the program's dataset ops of one epoch (see [`crate::order`]). When
    /// set, it alone decides the records of every step: `batch_size` is then its largest
    /// step, `drop_remainder` false and `shuffle` off ([`DispatcherConfig::for_chain`] builds
    /// such a config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<IndexChain>,
    /// Passes over the data; `None` repeats forever. With a chain, the passes of its trailing
    /// `repeat` (1 when the chain repeats inside).
    pub epochs: Option<u64>,
    /// The program creates its pipeline anew every `restart_every` epochs (an initializable
    /// iterator initialized again, under `lode train`): epoch `e` then has the order of epoch
    /// `e % restart_every`, as TensorFlow's re-created seed generators give it. `None`: every
    /// epoch continues the pipeline's own order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_every: Option<u64>,
    /// How long a worker may hold a leased step before it is leased to another worker.
    pub lease_duration: Duration,
    /// Leases one worker may hold at once (its pipeline depth).
    pub max_leases_per_worker: u32,
    /// Data-worker stages in the plan.
    pub stages: u32,
}

/// Steps one worker may hold at once unless the user says otherwise: a worker leases up to
/// half of them in one request (`WorkerState`), runs a burst, and reports the rest as they
/// are delivered, so that a lease round trip and the journal's write overlap the work. 64, not
/// 32: with a burst being computed, one in flight and a report of delivered steps on its way,
/// 32 often left no room for the next batch, and a worker's short steps went out in bursts of
/// 2 or 3 (wide_deep `--simple`, one worker: 48 against 41 µs of worker CPU per step).
///
/// In practice the receiver's window is the limit: a worker's share of it
/// (`DispatcherState::lease_share`) within this. The window is bounded in bytes and so long
/// for short steps (up to 1024 steps by default), where a lease of hundreds of steps makes
/// its round trip, and the report riding on it, cheap per step; this default lets a lone
/// worker have all of it.
pub const DEFAULT_MAX_LEASES: u32 = 1024;

impl DispatcherConfig {
    /// A config whose order is `chain` over `records` records, for `epochs` passes.
    pub fn for_chain(
        records: u64,
        chain: IndexChain,
        epochs: Option<u64>,
        lease_duration: Duration,
        max_leases_per_worker: u32,
        stages: u32,
    ) -> Result<Self> {
        let batch_size = chain
            .plan(records)
            .map_err(|e| Error::InvalidConfig {
                field: "chain",
                reason: e.to_string(),
            })?
            .max_records_per_element();
        let config = Self {
            records,
            batch_size,
            drop_remainder: false,
            shuffle: Shuffle::Off,
            chain: Some(chain),
            epochs,
            restart_every: None,
            lease_duration,
            max_leases_per_worker,
            stages,
        };
        config.validate()?;
        Ok(config)
    }

    /// The epoch whose order epoch `epoch` has (see [`Self::restart_every`]).
    pub fn order_epoch(&self, epoch: u64) -> u64 {
        self.restart_every
            .filter(|&r| r > 0)
            .map_or(epoch, |r| epoch % r)
    }

    /// Checks every field; the error names the first field that is wrong.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &'static str, reason: String| Error::InvalidConfig { field, reason };
        if let Some(chain) = &self.chain {
            let plan = chain
                .plan(self.records)
                .map_err(|e| invalid("chain", e.to_string()))?;
            if plan.len() == Some(0) {
                return Err(invalid(
                    "chain",
                    "an epoch of the chain has no element".into(),
                ));
            }
            if chain.repeats() && self.epochs != Some(1) {
                return Err(invalid(
                    "epochs",
                    "a chain that repeats inside runs as one epoch".into(),
                ));
            }
            if self.batch_size != plan.max_records_per_element()
                || self.drop_remainder
                || self.shuffle != Shuffle::Off
            {
                return Err(invalid(
                    "chain",
                    "with a chain, batch_size is its largest step, drop_remainder false and \
                     shuffle off"
                        .into(),
                ));
            }
        }
        if self.records == 0 {
            return Err(invalid("records", "the dataset has no records".into()));
        }
        if self.batch_size == 0 {
            return Err(invalid("batch_size", "must be at least 1".into()));
        }
        if self.drop_remainder && self.batch_size > self.records {
            return Err(invalid(
                "batch_size",
                format!(
                    "{} exceeds the {} records and drop_remainder is set: an epoch would have no step",
                    self.batch_size, self.records
                ),
            ));
        }
        match self.epochs {
            Some(0) => {
                return Err(invalid(
                    "epochs",
                    "must be at least 1 (or unset for forever)".into(),
                ))
            }
            Some(e) if e.checked_mul(self.steps_per_epoch()).is_none() => {
                return Err(invalid(
                    "epochs",
                    format!("{e} epochs overflow the step count"),
                ));
            }
            _ => {}
        }
        let lease_ms = self.lease_duration.as_millis();
        if lease_ms == 0 {
            return Err(invalid("lease_duration", "must be at least 1 ms".into()));
        }
        if u64::try_from(lease_ms).is_err() {
            return Err(invalid("lease_duration", "too long".into()));
        }
        if self.max_leases_per_worker == 0 {
            return Err(invalid(
                "max_leases_per_worker",
                "must be at least 1".into(),
            ));
        }
        if self.stages == 0 {
            return Err(invalid("stages", "must be at least 1".into()));
        }
        Ok(())
    }

    /// Steps in every epoch (all epochs have the same number); `u64::MAX` for a chain that
    /// never ends.
    pub fn steps_per_epoch(&self) -> u64 {
        if let Some(chain) = &self.chain {
            return chain
                .plan(self.records)
                .map_or(0, |p| p.len().unwrap_or(u64::MAX));
        }
        if self.batch_size == 0 {
            return 0;
        }
        let full = self.records / self.batch_size;
        if self.drop_remainder || self.records.is_multiple_of(self.batch_size) {
            full
        } else {
            full + 1
        }
    }

    /// Steps in the whole job, `None` when it repeats forever.
    pub fn total_steps(&self) -> Option<u64> {
        self.epochs
            .map(|e| e.saturating_mul(self.steps_per_epoch()))
    }

    /// The incremental order of a chain config (`None` for Lode's own order, which needs no
    /// state, or a chain that does not check).
    pub fn step_order(&self) -> Option<StepOrder> {
        let plan = self.chain.as_ref()?.plan(self.records).ok()?;
        Some(StepOrder::new(plan, self.steps_per_epoch(), self.epochs))
    }

    pub(crate) fn lease_millis(&self) -> u64 {
        u64::try_from(self.lease_duration.as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DispatcherConfig {
        DispatcherConfig {
            records: 10,
            batch_size: 3,
            drop_remainder: false,
            shuffle: Shuffle::Off,
            chain: None,
            epochs: Some(2),
            restart_every: None,
            lease_duration: Duration::from_secs(5),
            max_leases_per_worker: 2,
            stages: 1,
        }
    }

    fn field_of(config: &DispatcherConfig) -> Option<&'static str> {
        match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn validation_names_the_field() {
        assert_eq!(field_of(&sample()), None);
        type Edit = fn(&mut DispatcherConfig);
        let cases: [(&str, Edit); 8] = [
            ("records", |c| c.records = 0),
            ("batch_size", |c| c.batch_size = 0),
            ("batch_size", |c| {
                c.batch_size = 11;
                c.drop_remainder = true;
            }),
            ("epochs", |c| c.epochs = Some(0)),
            ("epochs", |c| c.epochs = Some(u64::MAX)),
            ("lease_duration", |c| {
                c.lease_duration = Duration::from_micros(10)
            }),
            ("max_leases_per_worker", |c| c.max_leases_per_worker = 0),
            ("stages", |c| c.stages = 0),
        ];
        for (field, edit) in cases {
            let mut config = sample();
            edit(&mut config);
            assert_eq!(field_of(&config), Some(field), "{config:?}");
        }
    }

    #[test]
    fn steps_per_epoch_counts_the_short_batch_unless_dropped() {
        let mut config = sample();
        assert_eq!(config.steps_per_epoch(), 4);
        assert_eq!(config.total_steps(), Some(8));
        config.drop_remainder = true;
        assert_eq!(config.steps_per_epoch(), 3);
        config.records = 9;
        assert_eq!(config.steps_per_epoch(), 3);
        config.epochs = None;
        assert_eq!(config.total_steps(), None);
    }
}
