//! The job-level tuner ([`TunerState`], GoldMiner §3.4.1) applied to a live job: its readings
//! turned into the tuner's observations, and its desired configuration into what a backend
//! runs ([`Want`]). Pure: the backend starts and drains the workers and reports back.
//!
//! How each phase maps onto a live job:
//! - **Baseline**: the job as it was started, on its own workers (those it launched itself; the
//!   scheduler never drains them). Its throughput and consumption come from the job's counters
//!   ([`QueueRates`]).
//! - **Size**, stage by stage: the backend runs one *probe* worker of `k` threads on that stage
//!   ([`Want::Probe`]); its production is its own steps per second of compute, from its
//!   per-worker counters ([`WorkerCounters`]), once it has computed [`MIN_PROBE_STEPS`] steps.
//!   Every probe's measurement is recorded with its speedup over one thread
//!   ([`TuningRecord`]), and the tuner moves to `k + 1` threads while each thread adds at least
//!   `linear_threshold` of the average per-thread rate so far.
//! - **Check benefit**: the job enters the cluster allocation with its sizes
//!   ([`Want::Allocate`], [`LiveTuner::view`]); if its throughput does not reach
//!   `fallback_ratio` of the baseline within `fallback_after_s`, it falls back
//!   ([`Want::FellBack`]): the scheduler's workers are withdrawn and it keeps its own. Since the
//!   job's own workers stay, data workers "do not pay" here when the job trains slower with
//!   them than without (they compete with it for the machine).
//! - **The training side's CPU share** is not set: the local backend cannot (the training loop
//!   runs in the job's own process). The tuner starts with one training CPU and a minimum of
//!   one, so the shrink phase settles at once and never asks for a change.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ids::MachineId;
use crate::live::{LiveJob, QueueRates};
use crate::policy::JobView;
use crate::tuner::{Observation, Phase, SizeReason, TunerConfig, TunerEvent, TunerState};
use crate::Error;

/// Steps a probe worker must have computed before its rate counts: fewer make the rate of a
/// worker that just started (its first step warms caches and connections) too noisy.
pub const MIN_PROBE_STEPS: u64 = 8;
/// Seconds a probe may take to compute [`MIN_PROBE_STEPS`] steps; past them it counts as
/// producing nothing (a worker that cannot start or run the stage), so the search ends and the
/// benefit check decides.
pub const PROBE_TIMEOUT_S: f64 = 60.0;

/// One worker's step completions and their compute time (the dispatcher's per-worker counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerCounters {
    pub steps_computed: u64,
    pub compute_us: u64,
}

impl WorkerCounters {
    /// Steps per second of compute, once [`MIN_PROBE_STEPS`] steps are in.
    pub fn rate(&self) -> Option<f64> {
        if self.steps_computed < MIN_PROBE_STEPS || self.compute_us == 0 {
            return None;
        }
        #[allow(clippy::cast_precision_loss)]
        let (steps, us) = (self.steps_computed as f64, self.compute_us as f64);
        Some(steps / (us / 1e6))
    }
}

/// What the backend should run for a job's tuning now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// Run the job as it is (its own workers) and keep reading it.
    Measure,
    /// Run one probe worker of `threads` threads on `stage` (replacing any other probe).
    Probe { stage: usize, threads: u32 },
    /// Tuned: no probe; the cluster policy allocates workers of these sizes (one per stage).
    Allocate { threads: Vec<u32> },
    /// Data workers did not pay: none of the scheduler's; the job keeps its own.
    FellBack,
}

/// One tuning decision with the measurement behind it, for the scheduler's log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TuningRecord {
    /// `baseline`, `probe`, `sized`, `helps` or `fell-back`.
    pub kind: &'static str,
    pub stage: Option<usize>,
    pub threads: Option<u32>,
    /// Steps/s measured: one worker's production (`probe`, `sized`), else the job's throughput.
    pub rate: f64,
    /// The rate over one thread's (`probe`, `sized`), or the throughput over the baseline
    /// (`helps`, `fell-back`).
    pub speedup: Option<f64>,
    /// What the tuner decided from it.
    pub decision: String,
}

/// The job-level tuner of one live job.
#[derive(Debug, Clone)]
pub struct LiveTuner {
    state: TunerState,
    /// Per stage: threads → the rate measured for one worker of that size.
    measured: Vec<BTreeMap<u32, f64>>,
    /// The probe being measured (stage, threads) and when it was first wanted.
    probe_since: Option<(usize, u32, f64)>,
}

impl LiveTuner {
    /// A tuner for a job of `stages` data-worker stages.
    pub fn new(stages: usize, config: TunerConfig) -> Result<Self, Error> {
        let config = TunerConfig {
            min_tw_cpus: 1,
            ..config
        };
        Ok(Self {
            // One training CPU, the minimum: the backend cannot set the training side's share.
            state: TunerState::new(config, stages, 1)?,
            measured: vec![BTreeMap::new(); stages],
            probe_since: None,
        })
    }

    pub fn want(&self) -> Want {
        let desired = self.state.desired();
        match self.state.phase() {
            Phase::Baseline => Want::Measure,
            Phase::Size { stage, cpus } => Want::Probe {
                stage,
                threads: cpus,
            },
            Phase::CheckBenefit { .. } | Phase::ShrinkTw { .. } | Phase::Steady => Want::Allocate {
                threads: desired.stages.iter().map(|s| s.dw_cpus.max(1)).collect(),
            },
            Phase::FellBack => Want::FellBack,
        }
    }

    /// Whether the search is over (steady with data workers, or fallen back).
    pub fn is_settled(&self) -> bool {
        self.state.is_settled()
    }

    /// Feeds one round: the job's rates, the current probe's counters (when a probe runs) and
    /// the scheduler's workers of the job (probes excluded). Returns the decisions made, each
    /// with the measurement it came from; nothing while a measurement is missing.
    pub fn observe(
        &mut self,
        now_s: f64,
        rates: &QueueRates,
        probe: Option<WorkerCounters>,
        workers: u32,
    ) -> Result<Vec<TuningRecord>, Error> {
        let Some(consumption) = rates.consumption else {
            return Ok(Vec::new());
        };
        let stages = self.measured.len();
        let sized = self.state.stage_rates().to_vec();
        let obs = match self.state.phase() {
            Phase::Baseline => Observation {
                stage_production: vec![0.0; stages],
                consumption,
                throughput: rates.throughput,
                tw_cpu_busy: 1.0,
                data_workers: 0,
            },
            Phase::Size { stage, cpus } => {
                let since = match self.probe_since {
                    Some((s, c, t)) if (s, c) == (stage, cpus) => t,
                    _ => {
                        self.probe_since = Some((stage, cpus, now_s));
                        now_s
                    }
                };
                let rate = match probe.and_then(|p| p.rate()) {
                    Some(rate) => rate,
                    None if now_s - since >= PROBE_TIMEOUT_S => 0.0,
                    None => return Ok(Vec::new()),
                };
                self.measured[stage].insert(cpus, rate);
                let mut production = sized;
                production[stage] = rate;
                Observation {
                    stage_production: production,
                    consumption,
                    throughput: rates.throughput,
                    tw_cpu_busy: 1.0,
                    data_workers: 1,
                }
            }
            Phase::CheckBenefit { .. } => Observation {
                stage_production: sized,
                consumption,
                throughput: rates.throughput,
                tw_cpu_busy: 1.0,
                data_workers: workers,
            },
            // Settled: the steady phase only resizes the training side, which this backend
            // cannot set.
            Phase::ShrinkTw { .. } | Phase::Steady | Phase::FellBack => return Ok(Vec::new()),
        };
        let phase = self.state.phase();
        let events = self.state.apply(&obs, now_s)?;
        Ok(self.records(phase, &obs, &events))
    }

    fn speedup(&self, stage: usize, threads: u32) -> Option<f64> {
        let one = *self.measured.get(stage)?.get(&1)?;
        let rate = *self.measured.get(stage)?.get(&threads)?;
        (one > 0.0).then(|| rate / one)
    }

    fn records(&self, phase: Phase, obs: &Observation, events: &[TunerEvent]) -> Vec<TuningRecord> {
        let mut out = Vec::new();
        if let Phase::Size { stage, cpus } = phase {
            let next = match self.state.phase() {
                Phase::Size { stage: s, cpus: c } if s == stage => format!("trying {c} threads"),
                _ => "sizing over".to_owned(),
            };
            out.push(TuningRecord {
                kind: "probe",
                stage: Some(stage),
                threads: Some(cpus),
                rate: obs.stage_production[stage],
                speedup: self.speedup(stage, cpus),
                decision: next,
            });
        }
        for event in events {
            match *event {
                TunerEvent::Baseline { throughput } => out.push(TuningRecord {
                    kind: "baseline",
                    stage: None,
                    threads: None,
                    rate: throughput,
                    speedup: None,
                    decision: format!(
                        "the job's own workers train it at {throughput:.1} steps/s \
                         (consumption {:.1}); probing one worker of 1 thread",
                        obs.consumption
                    ),
                }),
                TunerEvent::StageSized {
                    stage,
                    dw_cpus,
                    rate,
                    reason,
                } => {
                    let why = match reason {
                        SizeReason::IdealQueueState => "it feeds the training side alone",
                        SizeReason::SubLinear => "one more thread adds too little",
                        SizeReason::MaxSize => "the largest size tried",
                    };
                    out.push(TuningRecord {
                        kind: "sized",
                        stage: Some(stage),
                        threads: Some(dw_cpus),
                        rate,
                        speedup: self.speedup(stage, dw_cpus),
                        decision: format!("stage {stage}: workers of {dw_cpus} thread(s): {why}"),
                    });
                }
                TunerEvent::DataWorkersHelp {
                    baseline,
                    with_data_workers,
                } => out.push(TuningRecord {
                    kind: "helps",
                    stage: None,
                    threads: None,
                    rate: with_data_workers,
                    speedup: (baseline > 0.0).then(|| with_data_workers / baseline),
                    decision: "data workers pay: the policy allocates them from now on".into(),
                }),
                TunerEvent::FellBack {
                    baseline,
                    with_data_workers,
                } => out.push(TuningRecord {
                    kind: "fell-back",
                    stage: None,
                    threads: None,
                    rate: with_data_workers,
                    speedup: (baseline > 0.0).then(|| with_data_workers / baseline),
                    decision: "data workers do not pay: withdrawn; the job keeps its own".into(),
                }),
                TunerEvent::TwResized { .. } | TunerEvent::Configure(_) => {}
            }
        }
        out
    }

    /// The job as the policies see it once tuned ([`Want::Allocate`]): the scheduler's workers
    /// of the tuned size, each adding one worker's measured production, on top of the baseline
    /// its own workers give it. `None` before that, or while the job's rates are unmeasured.
    pub fn view(&self, job: &LiveJob, machine: MachineId, workers: u32) -> Option<JobView> {
        let Want::Allocate { threads } = self.want() else {
            return None;
        };
        let consumption = job.rates().consumption?;
        let rates = self.state.stage_rates();
        // A job's next worker goes to one stage; with several stages, it adds the slowest
        // stage's rate over the stage count (an approximation: the policy sees one size).
        #[allow(clippy::cast_precision_loss)]
        let gain = rates.iter().copied().fold(f64::INFINITY, f64::min) / rates.len() as f64;
        let gain = if gain.is_finite() { gain } else { 0.0 };
        let baseline = self.state.baseline().min(consumption);
        Some(JobView {
            id: job.id,
            gpus: 1,
            remaining_steps: job.remaining_steps(),
            tw_machines: vec![machine],
            tw_cpus: 1,
            dw_cpus: threads.iter().copied().max().unwrap_or(1),
            dw_mem_gb: 0.0,
            data_workers: BTreeMap::from([(machine, workers)]),
            throughput: baseline + f64::from(workers) * gain,
            baseline_throughput: baseline,
            ideal_throughput: consumption,
            consumption,
            gain_per_dw: gain,
            // Its own workers stay: it never falls below what it had.
            floor_throughput: 0.0,
        })
    }
}

impl TuningRecord {
    /// One line for the log: what was measured and what was decided.
    pub fn describe(&self) -> String {
        let what = match (self.stage, self.threads) {
            (Some(s), Some(t)) => format!("stage {s}, {t} thread(s): "),
            _ => String::new(),
        };
        let speedup = self
            .speedup
            .map_or_else(String::new, |s| format!(" ({s:.2}x)"));
        format!(
            "{} {what}{:.1} steps/s{speedup}: {}",
            self.kind, self.rate, self.decision
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::JobId;
    use crate::live::QueueReading;

    /// A job whose worker of `k` threads makes `rate(k)` steps/s per second of compute, fed by
    /// the test as a backend would be: the test plays the processes, the tuner decides.
    struct Sim<'a> {
        rate: &'a dyn Fn(u32) -> f64,
        consumption: f64,
        own: f64,
    }

    impl Sim<'_> {
        fn rates(&self, throughput: f64) -> QueueRates {
            QueueRates {
                throughput,
                per_worker: Some(self.own),
                consumption: Some(self.consumption),
            }
        }

        /// Runs the tuner until settled; returns it and every record.
        fn tune(&self, stages: usize) -> (LiveTuner, Vec<TuningRecord>) {
            let mut t = LiveTuner::new(stages, TunerConfig::default()).expect("valid");
            let mut records = Vec::new();
            let mut now = 0.0;
            let mut workers = 0;
            while !t.is_settled() && now < 1e4 {
                now += 2.0;
                let (probe, throughput) = match t.want() {
                    Want::Measure => (None, self.own),
                    Want::Probe { threads, .. } => {
                        // Too few steps at first: the probe just started.
                        let early = WorkerCounters {
                            steps_computed: 3,
                            compute_us: 100_000,
                        };
                        assert!(t
                            .observe(now, &self.rates(self.own), Some(early), 0)
                            .expect("valid")
                            .is_empty());
                        let r = (self.rate)(threads);
                        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                        let probe = WorkerCounters {
                            steps_computed: 40,
                            compute_us: (40.0 / r * 1e6) as u64,
                        };
                        (Some(probe), self.own + r)
                    }
                    Want::Allocate { threads } => {
                        workers = 2;
                        (None, self.own + 2.0 * (self.rate)(threads[0]))
                    }
                    Want::FellBack => break,
                };
                let rates = self.rates(throughput.min(self.consumption));
                records.extend(t.observe(now, &rates, probe, workers).expect("valid"));
            }
            (t, records)
        }
    }

    /// Linear to two threads, flat beyond: sized at two from the measured speedups, each
    /// probe recorded with its speedup over one thread.
    #[test]
    fn sizes_a_worker_from_measured_speedups() {
        let rate = |k: u32| 25.0 * f64::from(k.min(2));
        let sim = Sim {
            rate: &rate,
            consumption: 200.0,
            own: 25.0,
        };
        let (t, records) = sim.tune(1);
        assert_eq!(t.want(), Want::Allocate { threads: vec![2] });
        let kinds: Vec<(&str, Option<u32>)> = records.iter().map(|r| (r.kind, r.threads)).collect();
        assert_eq!(
            kinds,
            [
                ("baseline", None),
                ("probe", Some(1)),
                ("probe", Some(2)),
                ("probe", Some(3)),
                ("sized", Some(2)),
                ("helps", None),
            ]
        );
        let speedup = |threads| {
            records
                .iter()
                .find(|r| r.kind == "probe" && r.threads == Some(threads))
                .and_then(|r| r.speedup)
                .expect("measured")
        };
        assert!((speedup(1) - 1.0).abs() < 0.01);
        assert!((speedup(2) - 2.0).abs() < 0.01);
        assert!((speedup(3) - 2.0).abs() < 0.01);
        let sized = &records[4];
        assert!((sized.rate - 50.0).abs() < 0.1, "{sized:?}");
        assert!(sized.decision.contains("adds too little"), "{sized:?}");
    }

    /// The policy sees the job with its own workers as the baseline and each of the
    /// scheduler's workers adding one measured worker's production.
    #[test]
    fn the_tuned_view_adds_measured_workers_to_the_baseline() {
        let rate = |k: u32| 25.0 * f64::from(k.min(2));
        let sim = Sim {
            rate: &rate,
            consumption: 200.0,
            own: 25.0,
        };
        let (t, _) = sim.tune(1);
        let mut job = LiveJob::new(JobId(3));
        let reading = |at_s: f64, consumed: u64| QueueReading {
            at_s,
            steps_consumed: consumed,
            steps_computed: consumed,
            compute_us: consumed * 40_000,
            consumer_busy_us: consumed * 5_000,
            workers: 3,
            remaining_steps: Some(1_000),
        };
        job.observe(reading(0.0, 0));
        job.observe(reading(1.0, 25));
        let v = t.view(&job, MachineId(0), 2).expect("tuned");
        assert_eq!((v.dw_cpus, v.dw_count()), (2, 2));
        assert!((v.baseline_throughput - 25.0).abs() < 0.5, "{v:?}");
        assert!((v.gain_per_dw - 50.0).abs() < 0.5, "{v:?}");
        assert!((v.projected(3) - 175.0).abs() < 1.0, "{v:?}");
        assert!(
            (v.projected(5) - 200.0).abs() < 1.0,
            "capped at consumption: {v:?}"
        );
    }

    /// A probe that never computes its first steps counts as producing nothing once
    /// [`PROBE_TIMEOUT_S`] passed: sized at one thread, then the benefit check waits for the
    /// throughput to reach the baseline and gives up after `fallback_after_s`.
    #[test]
    fn falls_back_when_data_workers_do_not_pay() {
        let mut t = LiveTuner::new(1, TunerConfig::default()).expect("valid");
        let rates = |throughput| QueueRates {
            throughput,
            per_worker: Some(20.0),
            consumption: Some(100.0),
        };
        t.observe(0.0, &rates(20.0), None, 0).expect("valid");
        let stuck = WorkerCounters {
            steps_computed: 3,
            compute_us: 1_000_000,
        };
        assert!(t
            .observe(10.0, &rates(20.0), Some(stuck), 0)
            .expect("valid")
            .is_empty());
        assert_eq!(
            t.want(),
            Want::Probe {
                stage: 0,
                threads: 1
            }
        );
        let records = t
            .observe(10.0 + PROBE_TIMEOUT_S, &rates(20.0), Some(stuck), 0)
            .expect("valid");
        assert_eq!(records[0].rate, 0.0);
        assert!(matches!(t.want(), Want::Allocate { .. }));
        // The job trains slower with the scheduler's worker (the machine is contended).
        t.observe(80.0, &rates(15.0), None, 1).expect("valid");
        assert!(matches!(t.want(), Want::Allocate { .. }));
        let records = t.observe(200.0, &rates(15.0), None, 1).expect("valid");
        assert_eq!(t.want(), Want::FellBack);
        let last = records.last().expect("a record");
        assert_eq!(last.kind, "fell-back");
        assert!((last.speedup.expect("ratio") - 0.75).abs() < 0.01);
    }

    /// Two stages are sized one after the other, each by its own probe.
    #[test]
    fn sizes_every_stage_in_turn() {
        let mut t = LiveTuner::new(2, TunerConfig::default()).expect("valid");
        let rates = QueueRates {
            throughput: 10.0,
            per_worker: Some(10.0),
            consumption: Some(1_000.0),
        };
        t.observe(0.0, &rates, None, 0).expect("valid");
        // Stage 0 scales to 3 threads, stage 1 not at all.
        let per_thread = [10.0, 30.0];
        let mut now = 0.0;
        let mut seen = Vec::new();
        while let Want::Probe { stage, threads } = t.want() {
            now += 1.0;
            seen.push((stage, threads));
            let r = per_thread[stage] * f64::from(if stage == 0 { threads.min(3) } else { 1 });
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let probe = WorkerCounters {
                steps_computed: 100,
                compute_us: (100.0 / r * 1e6) as u64,
            };
            t.observe(now, &rates, Some(probe), 0).expect("valid");
        }
        assert_eq!(seen, [(0, 1), (0, 2), (0, 3), (0, 4), (1, 1), (1, 2)]);
        assert_eq!(
            t.want(),
            Want::Allocate {
                threads: vec![3, 1]
            }
        );
    }
}
