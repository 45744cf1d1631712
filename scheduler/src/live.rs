//! Queue metrics of a live job, turned into the [`JobView`] the policies read.
//!
//! A live backend reads each job's dispatcher counters ([`QueueReading`]) every round. Rates
//! come from two readings:
//! - **production per worker**: steps computed per second of the workers' compute time. A
//!   worker held back by the receiver's full window (backpressure) computes nothing meanwhile,
//!   so this is what one worker *can* produce, not what the queue lets it produce now;
//! - **consumption**: steps consumed per second of the training side's busy time (training,
//!   not waiting for data): what the training side can take at most;
//! - **throughput**: steps consumed per second of wall time.
//!
//! The view's `throughput` is the production the current workers can reach (workers × rate);
//! [`JobView::projected`] caps it at consumption, so a job at the ideal queue state (production
//! matches consumption) gets no more workers, and an over-provisioned one keeps only what it
//! needs. Rates stay at their last value while a reading cannot measure them (no step computed
//! or consumed in the interval); a counter that went backwards (the dispatcher restarted)
//! starts the measurement over.
//!
//! A live job's floor (see [`JobView::floor_throughput`]) is one worker's production: a
//! decoupled job has no input pipeline of its own, so without a data worker it would hold its
//! training worker at zero throughput; without the floor, Fair's `(t+Δt)/t_i` would give every
//! worker to a job far below its ideal before a job that one worker brings to its ideal.
//!
//! Without tuning every live worker has one CPU (one kernel thread); with it
//! ([`crate::live_tuner`]) the scheduler's workers have the size the job-level tuner measured.

use std::collections::BTreeMap;

use crate::ids::{JobId, MachineId};
use crate::policy::JobView;

/// One reading of a job's dispatcher counters (see the dispatcher's `Status`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueReading {
    /// When it was read, in seconds on the backend's clock.
    pub at_s: f64,
    /// Steps consumed by the training side (through the watermark).
    pub steps_consumed: u64,
    /// Step completions accepted, over every stage.
    pub steps_computed: u64,
    /// The workers' compute time for those steps.
    pub compute_us: u64,
    /// The training side's reported busy time.
    pub consumer_busy_us: u64,
    /// Active (not draining) workers.
    pub workers: u32,
    /// Steps still to consume; `None` when the job repeats forever.
    pub remaining_steps: Option<u64>,
}

/// The rates a job has shown so far.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct QueueRates {
    /// Steps consumed per second of wall time over the last interval.
    pub throughput: f64,
    /// Steps one worker produces per second of compute.
    pub per_worker: Option<f64>,
    /// Steps the training side consumes per second of busy time.
    pub consumption: Option<f64>,
}

/// A live job's measurement state.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveJob {
    pub id: JobId,
    last: Option<QueueReading>,
    rates: QueueRates,
}

/// Steps assumed left for a job that repeats forever (SRTF ranks it last).
pub const FOREVER_STEPS: f64 = 1e12;

impl LiveJob {
    pub fn new(id: JobId) -> Self {
        Self {
            id,
            last: None,
            rates: QueueRates::default(),
        }
    }

    pub fn rates(&self) -> QueueRates {
        self.rates
    }

    /// Takes a reading; returns the rates known after it.
    pub fn observe(&mut self, now: QueueReading) -> QueueRates {
        if let Some(prev) = self.last {
            let went_back = now.steps_consumed < prev.steps_consumed
                || now.steps_computed < prev.steps_computed
                || now.compute_us < prev.compute_us
                || now.consumer_busy_us < prev.consumer_busy_us
                || now.at_s < prev.at_s;
            if !went_back {
                let dt = now.at_s - prev.at_s;
                #[allow(clippy::cast_precision_loss)]
                let diff = |a: u64, b: u64| (a - b) as f64;
                let consumed = diff(now.steps_consumed, prev.steps_consumed);
                if dt > 0.0 {
                    self.rates.throughput = consumed / dt;
                }
                let compute_s = diff(now.compute_us, prev.compute_us) / 1e6;
                let computed = diff(now.steps_computed, prev.steps_computed);
                if compute_s > 0.0 && computed > 0.0 {
                    self.rates.per_worker = Some(computed / compute_s);
                }
                let busy_s = diff(now.consumer_busy_us, prev.consumer_busy_us) / 1e6;
                if busy_s > 0.0 && consumed > 0.0 {
                    self.rates.consumption = Some(consumed / busy_s);
                }
            }
        }
        self.last = Some(now);
        self.rates
    }

    /// The job as the policies see it, once production and consumption are both measured;
    /// `machine` is where its workers run.
    pub fn view(&self, machine: MachineId) -> Option<JobView> {
        let last = self.last?;
        let per_worker = self.rates.per_worker?;
        let consumption = self.rates.consumption?;
        let remaining = self.remaining_steps();
        Some(JobView {
            id: self.id,
            gpus: 1,
            remaining_steps: remaining,
            tw_machines: vec![machine],
            tw_cpus: 1,
            dw_cpus: 1,
            dw_mem_gb: 0.0,
            data_workers: BTreeMap::from([(machine, last.workers)]),
            throughput: f64::from(last.workers) * per_worker,
            baseline_throughput: 0.0,
            ideal_throughput: consumption,
            consumption,
            gain_per_dw: per_worker,
            // A decoupled job has no input pipeline of its own: with no data worker it holds
            // its training worker at zero throughput. One worker's worth is owed first.
            floor_throughput: per_worker.min(consumption),
        })
    }

    /// Steps still to consume at the last reading ([`FOREVER_STEPS`] for a job that repeats
    /// forever or has no reading yet).
    pub fn remaining_steps(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        self.last
            .and_then(|r| r.remaining_steps)
            .map_or(FOREVER_STEPS, |r| r as f64)
    }

    /// Active workers at the last reading.
    pub fn workers(&self) -> u32 {
        self.last.map_or(0, |r| r.workers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{decide, DecideConfig, Decision, MachineView, Policy, Snapshot};

    fn reading(at_s: f64, consumed: u64, computed: u64, workers: u32) -> QueueReading {
        QueueReading {
            at_s,
            steps_consumed: consumed,
            steps_computed: computed,
            compute_us: 0,
            consumer_busy_us: 0,
            workers,
            remaining_steps: Some(10_000),
        }
    }

    /// A job whose worker takes `step_s` per step and whose training side `train_s`, run for
    /// `secs` with `workers`, production-bound or consumption-bound as the numbers say.
    fn run(job: &mut LiveJob, t0: f64, secs: f64, workers: u32, step_s: f64, train_s: f64) {
        let produce = f64::from(workers) / step_s;
        let consume = 1.0 / train_s;
        let rate = produce.min(consume);
        let last = job.last.unwrap_or(reading(t0, 0, 0, workers));
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let steps = (rate * secs) as u64;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let now = QueueReading {
            at_s: t0 + secs,
            steps_consumed: last.steps_consumed + steps,
            steps_computed: last.steps_computed + steps,
            compute_us: last.compute_us + (steps as f64 * step_s * 1e6) as u64,
            consumer_busy_us: last.consumer_busy_us + (steps as f64 * train_s * 1e6) as u64,
            workers,
            remaining_steps: Some(10_000),
        };
        job.observe(now);
    }

    #[test]
    fn rates_come_from_compute_and_busy_time_not_from_the_capped_flow() {
        let mut a = LiveJob::new(JobId(1));
        a.observe(reading(0.0, 0, 0, 1));
        assert!(a.view(MachineId(0)).is_none(), "nothing measured yet");
        // One worker at 40 ms per step feeding a 10 ms training step: production-bound.
        run(&mut a, 0.0, 10.0, 1, 0.040, 0.010);
        let r = a.rates();
        assert!(
            (r.per_worker.expect("measured") - 25.0).abs() < 0.1,
            "{r:?}"
        );
        assert!(
            (r.consumption.expect("measured") - 100.0).abs() < 0.5,
            "{r:?}"
        );
        assert!((r.throughput - 25.0).abs() < 0.1, "{r:?}");
        let v = a.view(MachineId(0)).expect("view");
        assert!((v.projected(4) - 100.0).abs() < 0.5);
        assert!((v.projected(2) - 50.0).abs() < 0.5);

        // Three workers at 10 ms feeding a 10 ms step: consumption-bound; the flow is 100/s
        // but one worker alone would do.
        let mut b = LiveJob::new(JobId(2));
        b.observe(reading(0.0, 0, 0, 3));
        run(&mut b, 0.0, 10.0, 3, 0.010, 0.010);
        let v = b.view(MachineId(0)).expect("view");
        assert!((v.projected(1) - 100.0).abs() < 0.5, "{v:?}");
    }

    #[test]
    fn policies_move_workers_to_the_job_that_gains_and_off_the_one_that_does_not() {
        let mut a = LiveJob::new(JobId(1));
        a.observe(reading(0.0, 0, 0, 1));
        run(&mut a, 0.0, 10.0, 1, 0.040, 0.010);
        let mut b = LiveJob::new(JobId(2));
        b.observe(reading(0.0, 0, 0, 3));
        run(&mut b, 0.0, 10.0, 3, 0.010, 0.010);
        let m = MachineId(0);
        let snapshot = Snapshot {
            machines: vec![MachineView {
                id: m,
                dw_cpus: 4,
                dw_mem_gb: 0.0,
                cpu_only: false,
            }],
            jobs: vec![a.view(m).expect("a"), b.view(m).expect("b")],
        };
        for policy in Policy::ALL {
            let d = decide(policy, &snapshot, &DecideConfig::default());
            let adds = |j| {
                d.iter()
                    .filter(|x| matches!(x, Decision::Add { job, .. } if *job == j))
                    .count()
            };
            let removes = |j| {
                d.iter()
                    .filter(|x| matches!(x, Decision::Remove { job, .. } if *job == j))
                    .count()
            };
            assert_eq!(
                (removes(JobId(2)), adds(JobId(1))),
                (2, 2),
                "{policy:?}: {d:?}"
            );
            assert_eq!(
                (removes(JobId(1)), adds(JobId(2))),
                (0, 0),
                "{policy:?}: {d:?}"
            );
        }
    }

    #[test]
    fn a_dispatcher_restart_starts_the_measurement_over() {
        let mut a = LiveJob::new(JobId(1));
        a.observe(reading(0.0, 0, 0, 1));
        run(&mut a, 0.0, 10.0, 1, 0.040, 0.010);
        let before = a.rates();
        // Counters back at zero: no rate from this pair; the last rates stand.
        assert_eq!(a.observe(reading(11.0, 0, 0, 1)), before);
        // Idle interval (nothing computed or consumed): per-worker and consumption stand.
        let idle = a.observe(reading(12.0, 0, 0, 1));
        assert_eq!(idle.per_worker, before.per_worker);
        assert_eq!(idle.consumption, before.consumption);
        assert!(idle.throughput.abs() < f64::EPSILON);
    }
}
