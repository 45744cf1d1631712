//! A plan directory (`plan.json` and its stage graphs) turned into the dispatcher's settings:
//! [`DispatcherConfig::from_source`] for the order, [`ServiceConfig::for_plan`] for the
//! service. Every number the plan gives is converted with a check, and a value the dispatcher
//! cannot use is an error naming the plan's field; nothing falls back silently.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lode_proto::plan::{PlanDir, Source};

use crate::journal::{pick_seed, JournalError};
use crate::order::{IndexChain, PickedSeed};
use crate::{DispatcherConfig, Error, JobId, ServiceConfig, Shuffle};

/// Why a plan gives no dispatcher settings.
#[derive(Debug, thiserror::Error)]
pub enum PlanConfigError {
    #[error("{}: {field}: {reason}", dir.display())]
    Field {
        dir: PathBuf,
        field: &'static str,
        reason: String,
    },
    #[error("{}: {source}", dir.display())]
    Config {
        dir: PathBuf,
        #[source]
        source: Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// The settings a plan's source does not give: how long to run and how to lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSettings {
    /// Passes over the data; `None`: what the program says (its repeat), forever when it
    /// repeats without a count.
    pub epochs: Option<u64>,
    pub lease_duration: Duration,
    pub max_leases_per_worker: u32,
}

impl DispatcherConfig {
    /// The order of `source` (a plan's input) over `records` records (its indexed length) for
    /// a job of `stages` stages: TensorFlow's chain when the plan records it, else the plan's
    /// summary fields (batch, shuffle, repeat) in Lode's own order.
    pub fn from_source(
        source: &Source,
        records: u64,
        stages: usize,
        run: RunSettings,
    ) -> Result<Self, Error> {
        let stages = u32::try_from(stages).map_err(|_| Error::InvalidConfig {
            field: "stages",
            reason: format!("{stages} stages is more than a job can have"),
        })?;
        if !source.order.is_empty() {
            // TensorFlow's order: the chain as the program wrote it.
            let (chain, epochs) = IndexChain::from_program(&source.order, run.epochs);
            return DispatcherConfig::for_chain(
                records,
                chain,
                epochs,
                run.lease_duration,
                run.max_leases_per_worker,
                stages,
            );
        }
        let epochs = match (run.epochs, source.repeat) {
            (Some(e), _) => Some(e),
            (None, Some(r)) if r < 0 => None,
            (None, Some(r)) => Some(u64::try_from(r).map_err(|_| Error::InvalidConfig {
                field: "source.repeat",
                reason: format!("{r} is not a repeat count"),
            })?),
            (None, None) => Some(1),
        };
        let batch_size =
            match source.batch_size {
                None => 1,
                Some(b) => u64::try_from(b).ok().filter(|b| *b > 0).ok_or_else(|| {
                    Error::InvalidConfig {
                        field: "source.batch_size",
                        reason: format!("{b} is not a batch size"),
                    }
                })?,
            };
        let shuffle = match (source.shuffle_buffer, source.shuffle_seed) {
            // The two seeds' bits, as one: the pair is what the program gave.
            (Some(_), Some((a, b))) => Shuffle::Seeded {
                seed: a.cast_unsigned().rotate_left(32) ^ b.cast_unsigned(),
            },
            (Some(_), None) => Shuffle::Seeded { seed: 0 },
            (None, _) => Shuffle::Off,
        };
        let config = DispatcherConfig {
            records,
            batch_size,
            drop_remainder: source.drop_remainder.unwrap_or(false),
            shuffle,
            chain: None,
            epochs,
            restart_every: None,
            lease_duration: run.lease_duration,
            max_leases_per_worker: run.max_leases_per_worker,
            stages,
        };
        config.validate()?;
        Ok(config)
    }
}

/// `(global step, records)` pairs, computed as they are taken (see
/// [`DispatcherConfig::program_steps`]).
pub type ProgramSteps = Box<dyn Iterator<Item = (u64, Vec<u64>)> + Send>;

impl DispatcherConfig {
    /// The records of global steps `wanted`, in the order a job over `records` records of
    /// `source` leases them (TensorFlow's chain, epoch after epoch), as `(global step,
    /// records)`, computed as they are taken; they end early where a finite pipeline does.
    /// Runs the order without a job: what `lode exec` computes. An unseeded shuffle takes a
    /// seed picked here (logged).
    pub fn program_steps(
        source: &Source,
        records: u64,
        wanted: std::ops::Range<u64>,
    ) -> Result<ProgramSteps, Error> {
        let (mut chain, epochs) = IndexChain::from_program(&source.order, None);
        if let Some(picked) = chain.pick_seed(None) {
            tracing::warn!(
                seed = picked.seed,
                "the input pipeline shuffles without a seed (TensorFlow would pick one at \
                 random); this run uses a seed Lode picked"
            );
        }
        // The lease settings play no part in the order.
        let config =
            DispatcherConfig::for_chain(records, chain, epochs, Duration::from_secs(1), 1, 1)?;
        // An empty epoch has no step to walk.
        let Ok(per_epoch) = lode_proto::step::steps_per_epoch(config.steps_per_epoch()) else {
            return Ok(Box::new(std::iter::empty()));
        };
        let Some(mut order) = config.step_order() else {
            return Err(Error::InvalidConfig {
                field: "source.order",
                reason: "the chain gives no order".into(),
            });
        };
        Ok(Box::new(wanted.map_while(move |s| {
            let step = lode_proto::step::StepRef::from_global(s, per_epoch);
            order.batch(step.epoch, step.in_epoch).map(|r| (s, r))
        })))
    }
}

impl ServiceConfig {
    /// The service of job `job` for the plan in `plan`: its plan.json and stage graphs, served
    /// to workers, with `config`'s order and the journal in `journal`. An unseeded shuffle
    /// gets its seed here (the journal's, when it recorded one); it is logged, and returned.
    pub fn for_plan(
        plan: &PlanDir,
        job: JobId,
        token: &str,
        mut config: DispatcherConfig,
        journal: &Path,
    ) -> Result<(ServiceConfig, Option<PickedSeed>), PlanConfigError> {
        let picked = pick_seed(&mut config, journal)?;
        if let Some(picked) = &picked {
            if picked.recorded {
                tracing::info!(
                    seed = picked.seed,
                    journal = %journal.display(),
                    "the input pipeline shuffles without a seed; using the seed its journal recorded"
                );
            } else {
                tracing::warn!(
                    seed = picked.seed,
                    journal = %journal.display(),
                    "the input pipeline shuffles without a seed (TensorFlow would pick one at \
                     random on every run); Lode picked this one and records it in the journal, \
                     so that a restart keeps the order"
                );
            }
        }
        let read = |path: PathBuf| {
            std::fs::read(&path).map_err(|source| PlanConfigError::Read { path, source })
        };
        let plan_json = String::from_utf8(read(plan.dir.join("plan.json"))?).map_err(|_| {
            PlanConfigError::Field {
                dir: plan.dir.clone(),
                field: "plan.json",
                reason: "not UTF-8".into(),
            }
        })?;
        let graphs = plan
            .plan
            .stages
            .iter()
            .map(|s| read(plan.file(&s.graph)))
            .collect::<Result<Vec<_>, _>>()?;
        let service = ServiceConfig::new(job, token, config, plan_json, graphs, journal);
        Ok((service, picked))
    }
}

/// The source of a plan, or an error naming the plan.
pub fn plan_source(plan: &PlanDir) -> Result<&Source, PlanConfigError> {
    plan.plan
        .source
        .as_ref()
        .ok_or_else(|| PlanConfigError::Field {
            dir: plan.dir.clone(),
            field: "source",
            reason: "the plan has no input source".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunSettings {
        RunSettings {
            epochs: None,
            lease_duration: Duration::from_secs(10),
            max_leases_per_worker: 3,
        }
    }

    fn source() -> Source {
        Source {
            reader: "tfrecord".into(),
            files: vec!["a.tfrecord".into()],
            batching: "before_map".into(),
            ..Source::default()
        }
    }

    #[test]
    fn summary_fields_become_lodes_order_with_checked_numbers() {
        let mut s = source();
        s.batch_size = Some(32);
        s.repeat = Some(3);
        s.shuffle_buffer = Some(100);
        s.shuffle_seed = Some((-1, 5));
        let c = DispatcherConfig::from_source(&s, 1000, 2, run()).expect("config");
        assert_eq!(
            (c.batch_size, c.epochs, c.stages, c.records),
            (32, Some(3), 2, 1000)
        );
        assert_eq!(
            c.shuffle,
            Shuffle::Seeded {
                seed: u64::MAX.rotate_left(32) ^ 5
            }
        );
        // --epochs wins over the program's repeat; a negative repeat is forever.
        let c = DispatcherConfig::from_source(
            &s,
            1000,
            1,
            RunSettings {
                epochs: Some(7),
                ..run()
            },
        )
        .expect("config");
        assert_eq!(c.epochs, Some(7));
        s.repeat = Some(-1);
        let c = DispatcherConfig::from_source(&s, 1000, 1, run()).expect("config");
        assert_eq!(c.epochs, None);
    }

    #[test]
    fn an_unusable_batch_size_is_an_error_naming_the_field() {
        for b in [0, -4] {
            let mut s = source();
            s.batch_size = Some(b);
            let err = DispatcherConfig::from_source(&s, 10, 1, run()).expect_err("refused");
            assert!(err.to_string().contains("source.batch_size"), "{b}: {err}");
        }
    }
}
