//! Runs of consecutive steps in lease answers and reports (protocol 7).
//!
//! A worker on short steps leases hundreds of consecutive steps a request and reports as many
//! back. Listed one by one, each costs a message of nine fields to encode, send and decode;
//! but a batch's steps are granted together, so they share their stage, epoch, deadline, time
//! and generation, and an unshuffled pipeline's records follow on from step to step. A run
//! says all of that once: `StepLease.run_steps` and `CompletedStep.run_steps` (see
//! lode.proto). The dispatcher folds a batch into runs ([`v1::StepLeases::from_leases`]); the
//! worker unfolds it ([`v1::StepLeases::into_leases`]), and the other way round for reports
//! ([`push_completed`], [`expand_completed`]). Whatever a peer sends, unfolding never makes
//! more than [`MAX_STEPS_PER_REQUEST`] steps, and never wraps a step number or a record id.

use crate::service::{v1, MAX_STEPS_PER_REQUEST};

/// A batch (or report) in run form that no worker (or dispatcher) can unfold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("a run of {steps} steps lists its records: a run's records come as ranges")]
    Listed { steps: u64 },
    #[error("the runs stand for more than the {MAX_STEPS_PER_REQUEST}-step limit of a request")]
    TooMany,
    #[error("a run of {steps} steps from step {step} passes the largest step number")]
    StepOverflow { step: u64, steps: u64 },
    #[error(
        "a run of {steps} steps of {count} records from record {from} passes the largest record id"
    )]
    RecordOverflow { from: u64, count: u64, steps: u64 },
}

/// The most steps one request's runs may stand for, as a count.
fn limit() -> u64 {
    u64::from(MAX_STEPS_PER_REQUEST)
}

/// Room for the steps that runs of `lens` stand for, once they are within a request's limit.
fn unfolded_room<T>(lens: impl Iterator<Item = u64>) -> Result<Vec<T>, RunError> {
    let total = lens.fold(0u64, u64::saturating_add);
    if total > limit() {
        return Err(RunError::TooMany);
    }
    Ok(Vec::with_capacity(usize::try_from(total).unwrap_or(0)))
}

/// Checks that a run of `steps` from `step` ends within the step numbers.
fn check_steps(step: u64, steps: u64) -> Result<(), RunError> {
    match step.checked_add(steps - 1) {
        Some(_) => Ok(()),
        None => Err(RunError::StepOverflow { step, steps }),
    }
}

impl v1::CompletedStep {
    /// How many steps this report entry stands for: its run's length, at least 1.
    pub fn run_len(&self) -> u64 {
        self.run_steps.max(1)
    }
}

impl v1::StepLease {
    /// How many steps this lease stands for: its run's length, at least 1.
    pub fn run_len(&self) -> u64 {
        self.run_steps.max(1)
    }

    /// Whether `next`, a lease of one step, is the step after this lease's run, granted with
    /// it, with its records following on from the run's: then it can join the run.
    fn continued_by(&self, next: &v1::StepLease) -> bool {
        let len = self.run_len();
        let follows = || {
            self.step.checked_add(len) == Some(next.step)
                && len
                    .checked_mul(self.records_count)
                    .and_then(|n| self.records_from.checked_add(n))
                    == Some(next.records_from)
        };
        next.run_len() == 1
            && len < limit()
            && self.records.is_empty()
            && next.records.is_empty()
            && self.records_count > 0
            && next.records_count == self.records_count
            && (
                next.stage,
                next.epoch,
                next.deadline_ms,
                next.now_ms,
                next.generation,
            ) == (
                self.stage,
                self.epoch,
                self.deadline_ms,
                self.now_ms,
                self.generation,
            )
            && follows()
    }
}

impl v1::StepLeases {
    /// The batch of `leases` (in the order granted), each that continues the one before
    /// joined to its run.
    pub fn from_leases(leases: impl IntoIterator<Item = v1::StepLease>) -> Self {
        let mut steps: Vec<v1::StepLease> = Vec::new();
        for lease in leases {
            match steps.last_mut() {
                Some(run) if run.continued_by(&lease) => run.run_steps = run.run_len() + 1,
                _ => steps.push(lease),
            }
        }
        v1::StepLeases { steps }
    }

    /// The batch's leases one step each, in order: every run unfolded into its steps, each
    /// with its own range of records.
    pub fn into_leases(self) -> Result<Vec<v1::StepLease>, RunError> {
        let mut out = unfolded_room(self.steps.iter().map(v1::StepLease::run_len))?;
        for lease in self.steps {
            let steps = lease.run_len();
            if steps == 1 {
                out.push(v1::StepLease {
                    run_steps: 0,
                    ..lease
                });
                continue;
            }
            if !lease.records.is_empty() {
                return Err(RunError::Listed { steps });
            }
            let (step, from, count) = (lease.step, lease.records_from, lease.records_count);
            check_steps(step, steps)?;
            // The last step's range must end within u64 too.
            if steps
                .checked_mul(count)
                .and_then(|n| from.checked_add(n))
                .is_none()
            {
                return Err(RunError::RecordOverflow { from, count, steps });
            }
            for k in 0..steps {
                out.push(v1::StepLease {
                    step: step + k,
                    records_from: from + k * count,
                    run_steps: 0,
                    ..lease.clone()
                });
            }
        }
        Ok(out)
    }
}

/// Adds `step`, one delivered step, to `report`: to the last entry's run when it is the step
/// after it, of the same epoch and grant deadline.
pub fn push_completed(report: &mut Vec<v1::CompletedStep>, step: v1::CompletedStep) {
    if let Some(run) = report.last_mut() {
        let len = run.run_len();
        if step.run_len() == 1
            && len < limit()
            && run.epoch == step.epoch
            && run.deadline_ms == step.deadline_ms
            && run.step.checked_add(len) == Some(step.step)
        {
            run.run_steps = len + 1;
            run.compute_us = run.compute_us.saturating_add(step.compute_us);
            return;
        }
    }
    report.push(step);
}

/// A report's entries one step each, in order: every run unfolded into its steps, its
/// compute time shared out between them (the first ones take the remainder, so the sum is
/// the run's).
pub fn expand_completed(report: &[v1::CompletedStep]) -> Result<Vec<v1::CompletedStep>, RunError> {
    let mut out = unfolded_room(report.iter().map(v1::CompletedStep::run_len))?;
    for entry in report {
        let (step, steps) = (entry.step, entry.run_len());
        check_steps(step, steps)?;
        let (each, extra) = (entry.compute_us / steps, entry.compute_us % steps);
        for k in 0..steps {
            out.push(v1::CompletedStep {
                step: step + k,
                compute_us: each + u64::from(k < extra),
                run_steps: 0,
                ..*entry
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn lease(step: u64, from: u64, count: u64) -> v1::StepLease {
        v1::StepLease {
            stage: 0,
            epoch: 3,
            step,
            records: Vec::new(),
            deadline_ms: 5_000,
            now_ms: 100,
            generation: 2,
            records_from: from,
            records_count: count,
            run_steps: 0,
        }
    }

    #[test]
    fn a_batch_of_consecutive_steps_travels_as_one_run() {
        let leases: Vec<v1::StepLease> =
            (0..512).map(|k| lease(10 + k, 320 + 32 * k, 32)).collect();
        let batch = v1::StepLeases::from_leases(leases.clone());
        assert_eq!(batch.steps.len(), 1);
        assert_eq!(batch.steps[0].run_steps, 512);
        let listed = v1::StepLeases {
            steps: leases.clone(),
        };
        assert!(
            batch.encoded_len() * 100 < listed.encoded_len(),
            "{}",
            batch.encoded_len()
        );
        let back = v1::StepLeases::decode(batch.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(back.into_leases(), Ok(leases));
    }

    #[test]
    fn a_run_breaks_where_the_steps_or_their_grant_differ() {
        let mut other_deadline = lease(3, 96, 32);
        other_deadline.deadline_ms += 1;
        let mut listed = lease(5, 0, 0);
        listed.records = vec![7, 2];
        let leases = vec![
            lease(0, 0, 32),
            lease(1, 32, 32),
            lease(2, 64, 32),
            // Another grant's deadline: neither joins the run before nor takes the next.
            other_deadline,
            lease(4, 128, 32),
            // Listed records (a shuffled pipeline), and the step after them.
            listed,
            lease(6, 192, 32),
            // A gap in the steps, then one in the records, then another batch size.
            lease(8, 256, 32),
            lease(9, 999, 32),
            lease(10, 1031, 16),
        ];
        let batch = v1::StepLeases::from_leases(leases.clone());
        let runs: Vec<(u64, u64)> = batch.steps.iter().map(|l| (l.step, l.run_len())).collect();
        assert_eq!(
            runs,
            [
                (0, 3),
                (3, 1),
                (4, 1),
                (5, 1),
                (6, 1),
                (8, 1),
                (9, 1),
                (10, 1)
            ]
        );
        assert_eq!(batch.into_leases(), Ok(leases));
    }

    #[test]
    fn runs_no_worker_can_unfold_say_why() {
        let mut listed = lease(0, 0, 0);
        listed.records = vec![1, 2];
        listed.run_steps = 2;
        let unfold = |l: v1::StepLease| v1::StepLeases { steps: vec![l] }.into_leases();
        assert_eq!(unfold(listed), Err(RunError::Listed { steps: 2 }));

        let mut past_last_step = lease(u64::MAX - 1, 0, 1);
        past_last_step.run_steps = 3;
        assert_eq!(
            unfold(past_last_step),
            Err(RunError::StepOverflow {
                step: u64::MAX - 1,
                steps: 3
            })
        );

        let mut past_last_record = lease(0, u64::MAX - 10, 4);
        past_last_record.run_steps = 3;
        let err = unfold(past_last_record).expect_err("overflows");
        assert_eq!(
            err.to_string(),
            format!(
                "a run of 3 steps of 4 records from record {} passes the largest record id",
                u64::MAX - 10
            )
        );

        // A few fields may not stand for more steps than a request's limit, however split.
        let mut huge = lease(0, 0, 1);
        huge.run_steps = u64::MAX;
        assert_eq!(unfold(huge), Err(RunError::TooMany));
        let mut half = lease(0, 0, 1);
        half.run_steps = limit() / 2 + 1;
        let two = v1::StepLeases {
            steps: vec![half.clone(), half],
        };
        assert_eq!(two.into_leases(), Err(RunError::TooMany));
    }

    fn done(epoch: u64, step: u64, compute_us: u64, deadline_ms: u64) -> v1::CompletedStep {
        v1::CompletedStep {
            epoch,
            step,
            compute_us,
            deadline_ms,
            run_steps: 0,
        }
    }

    #[test]
    fn a_report_folds_consecutive_steps_of_one_grant() {
        let steps = [
            done(0, 7, 40, 900),
            done(0, 8, 41, 900),
            done(0, 9, 45, 900),
            done(0, 10, 50, 901),
            done(1, 11, 50, 901),
            done(1, 13, 50, 901),
        ];
        let mut report = Vec::new();
        for s in steps {
            push_completed(&mut report, s);
        }
        let runs: Vec<(u64, u64, u64, u64)> = report
            .iter()
            .map(|s| (s.epoch, s.step, s.run_steps, s.compute_us))
            .collect();
        assert_eq!(
            runs,
            [
                (0, 7, 3, 126),
                (0, 10, 0, 50),
                (1, 11, 0, 50),
                (1, 13, 0, 50)
            ]
        );
        let back = expand_completed(&report).expect("unfolds");
        let shared: Vec<(u64, u64, u64)> = back
            .iter()
            .map(|s| (s.step, s.compute_us, s.deadline_ms))
            .collect();
        assert_eq!(
            shared,
            [
                (7, 42, 900),
                (8, 42, 900),
                (9, 42, 900),
                (10, 50, 901),
                (11, 50, 901),
                (13, 50, 901)
            ]
        );
        let mut huge = done(0, 0, 0, 0);
        huge.run_steps = limit() + 1;
        assert_eq!(expand_completed(&[huge]), Err(RunError::TooMany));
        let mut wraps = done(0, u64::MAX, 0, 0);
        wraps.run_steps = 2;
        assert_eq!(
            expand_completed(&[wraps]),
            Err(RunError::StepOverflow {
                step: u64::MAX,
                steps: 2
            })
        );
    }

    proptest! {
        /// Any batch folds into runs and unfolds into the same leases, in the same order.
        #[test]
        fn leases_fold_and_unfold_to_themselves(
            spec in prop::collection::vec((0u64..3, 0u64..3, 1u64..40, any::<bool>(), 0u64..2), 0..200),
        ) {
            let mut leases = Vec::new();
            let (mut step, mut record) = (0u64, 0u64);
            for (step_gap, record_gap, count, listed, deadline) in spec {
                step += step_gap;
                record += record_gap;
                let mut l = lease(step, record, count);
                l.deadline_ms += deadline;
                if listed {
                    l.records = (0..count).map(|i| (record + i) * 7 % 11).collect();
                    l.records_from = 0;
                    l.records_count = 0;
                }
                leases.push(l);
                step += 1;
                record += count;
            }
            let batch = v1::StepLeases::from_leases(leases.clone());
            prop_assert!(batch.steps.len() <= leases.len());
            let back = v1::StepLeases::decode(batch.encode_to_vec().as_slice()).expect("decodes");
            prop_assert_eq!(back.into_leases(), Ok(leases));
        }

        /// A report folds and unfolds to the same steps, deadlines and total compute time.
        #[test]
        fn reports_fold_and_unfold_to_the_same_steps(
            spec in prop::collection::vec((0u64..3, 0u64..1000, 0u64..2, any::<bool>()), 0..300),
        ) {
            let mut steps = Vec::new();
            let (mut epoch, mut step) = (0u64, 0u64);
            for (gap, us, deadline, next_epoch) in spec {
                if next_epoch {
                    epoch += 1;
                }
                step += gap;
                steps.push(done(epoch, step, us, deadline));
                step += 1;
            }
            let mut report = Vec::new();
            for s in &steps {
                push_completed(&mut report, *s);
            }
            let back = expand_completed(&report).expect("unfolds");
            let key = |s: &v1::CompletedStep| (s.epoch, s.step, s.deadline_ms);
            prop_assert_eq!(back.iter().map(key).collect::<Vec<_>>(), steps.iter().map(key).collect::<Vec<_>>());
            let sum = |v: &[v1::CompletedStep]| v.iter().map(|s| s.compute_us).sum::<u64>();
            prop_assert_eq!(sum(&back), sum(&steps));
        }
    }
}
