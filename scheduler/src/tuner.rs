//! Job-level tuning (GoldMiner §3.4.1): a state machine fed with queue observations that
//! decides whether a job uses data workers, how big one data worker is (per stage), and how
//! many CPUs its training worker keeps.
//!
//! Protocol: the caller runs the job with [`TunerState::desired`], observes it for an
//! interval, and passes the [`Observation`] to [`TunerState::apply`] with the time; the tuner
//! answers with events and a new desired configuration. Phases:
//!
//! 1. **Baseline**: the job runs without data workers; its throughput is the reference.
//! 2. **Size**, stage by stage: one data worker of 1 CPU, then 2, 3, … while each CPU adds at
//!    least `linear_threshold` of the average per-CPU rate so far (near-linear speedup). Sizing stops at
//!    the ideal queue state (the stage produces as fast as the training worker consumes) or at
//!    the first sub-linear step, keeping the last linear size; never above `max_dw_cpus`.
//! 3. **Check benefit**: enough workers of that size to feed the job; if its throughput does
//!    not reach `fallback_ratio` of the baseline within `fallback_after_s`, the job falls back
//!    to running without data workers.
//! 4. **Shrink the training worker** while throughput and the training worker's consumption
//!    both hold (halving steps, backing off one step on a drop): throughput alone holds when
//!    the probe workers cannot feed the job in full. Shrunk CPUs go to a reserve the job keeps until the cluster scheduler
//!    claims them ([`TunerState::release_reserve`]): they are returned lazily, so that a drop
//!    can be undone without waiting for the cluster.
//! 5. **Steady**: the cluster scheduler owns the data-worker count. When more data workers
//!    stopped helping and the training worker's CPUs are busy, the training worker grows by one
//!    CPU (from the reserve first).

use serde::Serialize;

use crate::Error;

/// Thresholds of the tuner.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TunerConfig {
    /// One more CPU in a data worker must add at least this fraction of the average per-CPU
    /// rate of the smaller size. Robust to observation noise up to about ±3%.
    pub linear_threshold: f64,
    /// Production within this fraction of consumption is the ideal queue state.
    pub ideal_tolerance: f64,
    /// Data workers must reach this fraction of the baseline throughput…
    pub fallback_ratio: f64,
    /// …within this many seconds, or the job falls back.
    pub fallback_after_s: f64,
    /// Throughput "holds" while it stays within this fraction of the reference.
    pub hold_tolerance: f64,
    pub max_dw_cpus: u32,
    pub min_tw_cpus: u32,
    /// The training worker's CPU counts as busy above this utilisation.
    pub tw_busy_threshold: f64,
    /// Upper bound on the data workers the check-benefit phase asks for, per stage.
    pub max_probe_workers: u32,
}

impl Default for TunerConfig {
    fn default() -> Self {
        Self {
            linear_threshold: 0.6,
            ideal_tolerance: 0.03,
            fallback_ratio: 0.95,
            fallback_after_s: 120.0,
            hold_tolerance: 0.03,
            max_dw_cpus: 16,
            min_tw_cpus: 1,
            tw_busy_threshold: 0.9,
            max_probe_workers: 64,
        }
    }
}

/// One interval's queue metrics. Rates are batches (steps) per second.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observation {
    /// Each stage's own production rate (what its data workers put in its output queue).
    pub stage_production: Vec<f64>,
    /// The rate the training worker would consume at if never starved.
    pub consumption: f64,
    /// The rate the job actually trained at.
    pub throughput: f64,
    /// Utilisation of the training worker's CPUs, 0 to 1.
    pub tw_cpu_busy: f64,
    /// Data workers running now, all stages together.
    pub data_workers: u32,
}

/// Data-worker size and count of one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StageConfig {
    pub dw_cpus: u32,
    pub dw_count: u32,
}

/// What the job should run with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobConfig {
    pub use_data_workers: bool,
    pub tw_cpus: u32,
    pub stages: Vec<StageConfig>,
}

/// Where the tuner is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Phase {
    Baseline,
    Size { stage: usize, cpus: u32 },
    CheckBenefit { since_s: f64 },
    ShrinkTw { step: u32 },
    Steady,
    FellBack,
}

/// What the tuner concluded from one observation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum TunerEvent {
    Baseline {
        throughput: f64,
    },
    StageSized {
        stage: usize,
        dw_cpus: u32,
        /// Production of one worker of that size.
        rate: f64,
        reason: SizeReason,
    },
    DataWorkersHelp {
        baseline: f64,
        with_data_workers: f64,
    },
    FellBack {
        baseline: f64,
        with_data_workers: f64,
    },
    TwResized {
        from: u32,
        to: u32,
    },
    /// The desired configuration changed; run the job with it.
    Configure(JobConfig),
}

/// Why a stage's data-worker size stopped growing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SizeReason {
    IdealQueueState,
    SubLinear,
    MaxSize,
}

/// The job-level tuner of one job.
#[derive(Debug, Clone)]
pub struct TunerState {
    config: TunerConfig,
    phase: Phase,
    desired: JobConfig,
    baseline_tw_cpus: u32,
    baseline: f64,
    last_rate: f64,
    stage_rates: Vec<f64>,
    reference: f64,
    /// The training worker's consumption when the shrinking started.
    reference_consumption: f64,
    reserve: u32,
    last_s: Option<f64>,
    last_steady: Option<(u32, f64)>,
}

impl TunerState {
    /// A tuner for a job of `stages` data-worker stages whose training worker starts with
    /// `tw_cpus` CPUs (its profiled allocation without data workers).
    pub fn new(config: TunerConfig, stages: usize, tw_cpus: u32) -> Result<Self, Error> {
        if stages == 0 {
            return Err(Error::NoStages);
        }
        if config.max_dw_cpus == 0 {
            return Err(Error::TunerConfig {
                field: "max_dw_cpus",
            });
        }
        Ok(Self {
            config,
            phase: Phase::Baseline,
            desired: JobConfig {
                use_data_workers: false,
                tw_cpus,
                stages: vec![
                    StageConfig {
                        dw_cpus: 0,
                        dw_count: 0
                    };
                    stages
                ],
            },
            baseline_tw_cpus: tw_cpus,
            baseline: 0.0,
            last_rate: 0.0,
            stage_rates: vec![0.0; stages],
            reference: 0.0,
            reference_consumption: 0.0,
            reserve: 0,
            last_s: None,
            last_steady: None,
        })
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The throughput measured without data workers (0 before the first observation).
    pub fn baseline(&self) -> f64 {
        self.baseline
    }

    pub fn desired(&self) -> &JobConfig {
        &self.desired
    }

    /// Whether the search is over (steady with data workers, or fallen back).
    pub fn is_settled(&self) -> bool {
        matches!(self.phase, Phase::Steady | Phase::FellBack)
    }

    /// Production of one data worker of the chosen size, per stage (0 until sized).
    pub fn stage_rates(&self) -> &[f64] {
        &self.stage_rates
    }

    /// CPUs shrunk off the training worker and not yet handed back to the cluster.
    pub fn reserve(&self) -> u32 {
        self.reserve
    }

    /// Hands the reserve to the cluster scheduler; returns how many CPUs.
    pub fn release_reserve(&mut self) -> u32 {
        std::mem::take(&mut self.reserve)
    }

    fn validate(&self, obs: &Observation, now_s: f64) -> Result<(), Error> {
        let rates = [
            ("consumption", obs.consumption),
            ("throughput", obs.throughput),
            ("tw_cpu_busy", obs.tw_cpu_busy),
        ];
        for (field, value) in rates.into_iter().chain(
            obs.stage_production
                .iter()
                .map(|v| ("stage_production", *v)),
        ) {
            if !value.is_finite() || value < 0.0 {
                return Err(Error::BadObservation { field, value });
            }
        }
        if obs.stage_production.len() != self.desired.stages.len() {
            return Err(Error::StageCount {
                expected: self.desired.stages.len(),
                got: obs.stage_production.len(),
            });
        }
        if !now_s.is_finite() {
            return Err(Error::BadObservation {
                field: "now_s",
                value: now_s,
            });
        }
        if let Some(last_s) = self.last_s {
            if now_s < last_s {
                return Err(Error::TimeWentBackwards { last_s, now_s });
            }
        }
        Ok(())
    }

    /// Feeds one observation of the job running with [`Self::desired`] at time `now_s`.
    pub fn apply(&mut self, obs: &Observation, now_s: f64) -> Result<Vec<TunerEvent>, Error> {
        self.validate(obs, now_s)?;
        self.last_s = Some(now_s);
        let before = self.desired.clone();
        let mut events = Vec::new();
        match self.phase {
            Phase::Baseline => {
                self.baseline = obs.throughput;
                events.push(TunerEvent::Baseline {
                    throughput: obs.throughput,
                });
                self.start_sizing(0);
            }
            Phase::Size { stage, cpus } => self.size_step(stage, cpus, obs, now_s, &mut events),
            Phase::CheckBenefit { since_s } => {
                if obs.throughput >= self.config.fallback_ratio * self.baseline {
                    events.push(TunerEvent::DataWorkersHelp {
                        baseline: self.baseline,
                        with_data_workers: obs.throughput,
                    });
                    self.reference = obs.throughput;
                    self.reference_consumption = obs.consumption;
                    let step = (self.desired.tw_cpus / 2).max(1);
                    self.shrink_by(step, &mut events);
                } else if now_s - since_s >= self.config.fallback_after_s {
                    events.push(TunerEvent::FellBack {
                        baseline: self.baseline,
                        with_data_workers: obs.throughput,
                    });
                    self.phase = Phase::FellBack;
                    self.reserve = 0;
                    self.desired = JobConfig {
                        use_data_workers: false,
                        tw_cpus: self.baseline_tw_cpus,
                        stages: vec![
                            StageConfig {
                                dw_cpus: 0,
                                dw_count: 0
                            };
                            self.desired.stages.len()
                        ],
                    };
                }
            }
            Phase::ShrinkTw { step } => {
                // Both must hold: a job the probe workers cannot feed in full trains at the
                // same data-bound rate with half the training worker, but could not consume
                // more later, when the cluster gives it the workers it lacks.
                let keep = 1.0 - self.config.hold_tolerance;
                let holds = obs.throughput >= keep * self.reference
                    && obs.consumption >= keep * self.reference_consumption;
                if holds {
                    self.shrink_by(step, &mut events);
                } else {
                    // Undo the last shrink from the reserve, then try half the step.
                    let from = self.desired.tw_cpus;
                    let back = step.min(self.reserve);
                    self.reserve -= back;
                    self.desired.tw_cpus += back;
                    events.push(TunerEvent::TwResized {
                        from,
                        to: self.desired.tw_cpus,
                    });
                    let half = step / 2;
                    if half == 0 {
                        self.settle();
                    } else {
                        self.shrink_by(half, &mut events);
                    }
                }
            }
            Phase::Steady => self.steady_step(obs, &mut events),
            Phase::FellBack => {}
        }
        if self.desired != before {
            events.push(TunerEvent::Configure(self.desired.clone()));
        }
        Ok(events)
    }

    fn start_sizing(&mut self, stage: usize) {
        self.phase = Phase::Size { stage, cpus: 1 };
        self.desired.use_data_workers = true;
        self.desired.stages[stage] = StageConfig {
            dw_cpus: 1,
            dw_count: 1,
        };
    }

    fn size_step(
        &mut self,
        stage: usize,
        cpus: u32,
        obs: &Observation,
        now_s: f64,
        events: &mut Vec<TunerEvent>,
    ) {
        let rate = obs.stage_production.get(stage).copied().unwrap_or(0.0);
        let ideal = rate >= obs.consumption * (1.0 - self.config.ideal_tolerance);
        let decided = if cpus == 1 {
            if ideal {
                Some((1, rate, SizeReason::IdealQueueState))
            } else if rate <= 0.0 {
                // Nothing produced: no size is linear; the benefit check will fall back.
                Some((1, rate, SizeReason::SubLinear))
            } else {
                None
            }
        } else if rate - self.last_rate
            < self.config.linear_threshold * self.last_rate / f64::from(cpus - 1)
        {
            Some((cpus - 1, self.last_rate, SizeReason::SubLinear))
        } else if ideal {
            Some((cpus, rate, SizeReason::IdealQueueState))
        } else {
            None
        };
        let decided = match decided {
            None if cpus >= self.config.max_dw_cpus => Some((cpus, rate, SizeReason::MaxSize)),
            other => other,
        };
        match decided {
            None => {
                self.last_rate = rate;
                self.phase = Phase::Size {
                    stage,
                    cpus: cpus + 1,
                };
                self.desired.stages[stage].dw_cpus = cpus + 1;
            }
            Some((dw_cpus, rate, reason)) => {
                events.push(TunerEvent::StageSized {
                    stage,
                    dw_cpus,
                    rate,
                    reason,
                });
                self.stage_rates[stage] = rate;
                self.desired.stages[stage].dw_cpus = dw_cpus;
                if stage + 1 < self.desired.stages.len() {
                    self.start_sizing(stage + 1);
                } else {
                    for (s, r) in self.desired.stages.iter_mut().zip(&self.stage_rates) {
                        s.dw_count =
                            workers_for(obs.consumption, *r, self.config.max_probe_workers);
                    }
                    self.phase = Phase::CheckBenefit { since_s: now_s };
                }
            }
        }
    }

    fn shrink_by(&mut self, step: u32, events: &mut Vec<TunerEvent>) {
        let step = step.min(self.desired.tw_cpus.saturating_sub(self.config.min_tw_cpus));
        if step == 0 {
            self.settle();
            return;
        }
        let from = self.desired.tw_cpus;
        self.desired.tw_cpus -= step;
        self.reserve += step;
        events.push(TunerEvent::TwResized {
            from,
            to: self.desired.tw_cpus,
        });
        self.phase = Phase::ShrinkTw { step };
    }

    fn settle(&mut self) {
        self.phase = Phase::Steady;
        self.last_steady = None;
    }

    fn steady_step(&mut self, obs: &Observation, events: &mut Vec<TunerEvent>) {
        let previous = self.last_steady.replace((obs.data_workers, obs.throughput));
        let Some((workers, throughput)) = previous else {
            return;
        };
        let more_workers = obs.data_workers > workers;
        let no_gain = obs.throughput < throughput * (1.0 + self.config.hold_tolerance);
        if more_workers && no_gain && obs.tw_cpu_busy >= self.config.tw_busy_threshold {
            let from = self.desired.tw_cpus;
            self.reserve = self.reserve.saturating_sub(1);
            self.desired.tw_cpus += 1;
            events.push(TunerEvent::TwResized {
                from,
                to: self.desired.tw_cpus,
            });
        }
    }
}

/// Workers of production `rate` each needed to reach `consumption`.
fn workers_for(consumption: f64, rate: f64, max: u32) -> u32 {
    if rate <= 0.0 {
        return 1;
    }
    let n = (consumption / rate)
        .ceil()
        .clamp(1.0, f64::from(max.max(1)));
    // Clamped to [1, max] above, so the conversion is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = n as u32;
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// A synthetic job: `rate(k)` is one stage's production with a worker of `k` CPUs,
    /// consumption is `cons` when the training worker has at least `tw_need` CPUs, and the
    /// baseline (no data workers) trains at `baseline`.
    struct Curve<'a> {
        rate: &'a dyn Fn(u32) -> f64,
        cons: f64,
        tw_need: u32,
        baseline: f64,
        noise: f64,
        /// Cap on the production of all workers together.
        cap: f64,
    }

    impl Curve<'_> {
        fn observe(&self, c: &JobConfig, rng: &mut SplitMix64) -> Observation {
            let mut jitter = |v: f64| v * (1.0 + self.noise * rng.uniform(-1.0, 1.0));
            let cons = self.cons * (f64::from(c.tw_cpus) / f64::from(self.tw_need)).min(1.0);
            if !c.use_data_workers {
                return Observation {
                    stage_production: vec![0.0; c.stages.len()],
                    consumption: jitter(cons),
                    throughput: jitter(self.baseline),
                    tw_cpu_busy: 1.0,
                    data_workers: 0,
                };
            }
            let prods: Vec<f64> = c
                .stages
                .iter()
                .map(|s| jitter((self.rate)(s.dw_cpus)))
                .collect();
            let all: f64 = c
                .stages
                .iter()
                .map(|s| f64::from(s.dw_count) * (self.rate)(s.dw_cpus))
                .fold(f64::INFINITY, f64::min);
            let thr = all.min(cons).min(self.cap);
            Observation {
                stage_production: prods,
                consumption: jitter(cons),
                throughput: jitter(thr),
                tw_cpu_busy: (f64::from(self.tw_need) / f64::from(c.tw_cpus)).min(1.0),
                data_workers: c.stages.iter().map(|s| s.dw_count).sum(),
            }
        }

        /// Runs the tuner to a settled state; returns it and all its events.
        fn tune(&self, stages: usize, tw: u32, seed: u64) -> (TunerState, Vec<TunerEvent>) {
            let mut t = TunerState::new(TunerConfig::default(), stages, tw).expect("valid");
            let mut rng = SplitMix64::new(seed);
            let mut events = Vec::new();
            let mut now = 0.0;
            while !t.is_settled() {
                let obs = self.observe(t.desired(), &mut rng);
                now += 10.0;
                events.extend(t.apply(&obs, now).expect("valid observation"));
                assert!(now < 10_000.0, "tuner did not settle: {:?}", t.phase());
            }
            (t, events)
        }
    }

    fn sized(events: &[TunerEvent]) -> Vec<(u32, SizeReason)> {
        events
            .iter()
            .filter_map(|e| match e {
                TunerEvent::StageSized {
                    dw_cpus, reason, ..
                } => Some((*dw_cpus, *reason)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn linear_curve_grows_to_the_ideal_queue_state() {
        // 0.1 steps/s per CPU, consumption 0.55: 6 CPUs produce 0.6 ≥ 0.55.
        let rate = |k: u32| 0.1 * f64::from(k);
        let c = Curve {
            rate: &rate,
            cons: 0.55,
            tw_need: 2,
            baseline: 0.3,
            noise: 0.0,
            cap: f64::INFINITY,
        };
        let (t, events) = c.tune(1, 8, 1);
        assert_eq!(sized(&events), vec![(6, SizeReason::IdealQueueState)]);
        assert_eq!(t.phase(), Phase::Steady);
        assert!(t.desired().use_data_workers);
    }

    #[test]
    fn linear_curve_without_an_ideal_state_stops_at_max_size() {
        let rate = |k: u32| 0.01 * f64::from(k);
        let c = Curve {
            rate: &rate,
            cons: 10.0,
            tw_need: 1,
            baseline: 0.1,
            noise: 0.0,
            cap: f64::INFINITY,
        };
        let (t, events) = c.tune(1, 4, 1);
        assert_eq!(sized(&events), vec![(16, SizeReason::MaxSize)]);
        // 10 / 0.16 = 63 workers to feed it.
        assert_eq!(t.desired().stages[0].dw_count, 63);
    }

    #[test]
    fn sublinear_curve_stops_at_the_knee() {
        // Linear to 4 CPUs, then each CPU adds 30% of one.
        let rate = |k: u32| {
            let k = f64::from(k);
            0.1 * (k.min(4.0) + 0.3 * (k - 4.0).max(0.0))
        };
        let c = Curve {
            rate: &rate,
            cons: 2.0,
            tw_need: 2,
            baseline: 0.5,
            noise: 0.0,
            cap: f64::INFINITY,
        };
        let (t, events) = c.tune(1, 16, 1);
        assert_eq!(sized(&events), vec![(4, SizeReason::SubLinear)]);
        // 2.0 / 0.4 = 5 workers.
        assert_eq!(t.desired().stages[0].dw_count, 5);
    }

    #[test]
    fn saturating_curve_stops_where_the_speedup_fades() {
        // 1 - e^{-k/2}: gains fade fast; sizing must stop within a few CPUs.
        let rate = |k: u32| 1.0 - (-f64::from(k) / 2.0).exp();
        let c = Curve {
            rate: &rate,
            cons: 5.0,
            tw_need: 1,
            baseline: 1.0,
            noise: 0.0,
            cap: f64::INFINITY,
        };
        let (_, events) = c.tune(1, 8, 1);
        let s = sized(&events);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].1, SizeReason::SubLinear);
        assert!((1..=3).contains(&s[0].0), "{s:?}");
    }

    #[test]
    fn noisy_linear_curve_lands_near_the_knee() {
        let rate = |k: u32| {
            let k = f64::from(k);
            0.05 * (k.min(6.0) + 0.2 * (k - 6.0).max(0.0))
        };
        for seed in 0..20 {
            let c = Curve {
                rate: &rate,
                cons: 3.0,
                tw_need: 2,
                baseline: 0.5,
                noise: 0.03,
                cap: f64::INFINITY,
            };
            let (t, events) = c.tune(1, 16, seed);
            let s = sized(&events);
            assert!((6..=7).contains(&s[0].0), "seed {seed}: {s:?}");
            assert_eq!(t.phase(), Phase::Steady);
        }
    }

    #[test]
    fn falls_back_when_data_workers_do_not_match_the_baseline() {
        // However many workers, production tops out at 0.2 (a network bottleneck); the baseline
        // trains at 0.5.
        let rate = |k: u32| 0.05 * f64::from(k);
        let c = Curve {
            rate: &rate,
            cons: 1.0,
            tw_need: 1,
            baseline: 0.5,
            noise: 0.0,
            cap: 0.2,
        };
        let (t, events) = c.tune(1, 8, 1);
        assert_eq!(t.phase(), Phase::FellBack);
        assert!(!t.desired().use_data_workers);
        assert_eq!(t.desired().tw_cpus, 8);
        assert!(events
            .iter()
            .any(|e| matches!(e, TunerEvent::FellBack { .. })));
    }

    #[test]
    fn shrinks_the_training_worker_while_throughput_holds() {
        let rate = |k: u32| 0.25 * f64::from(k);
        let c = Curve {
            rate: &rate,
            cons: 1.0,
            tw_need: 3,
            baseline: 0.6,
            noise: 0.0,
            cap: f64::INFINITY,
        };
        let (mut t, _) = c.tune(1, 16, 1);
        assert_eq!(t.desired().tw_cpus, 3);
        // 13 CPUs went to the reserve, handed back lazily on request.
        assert_eq!(t.reserve(), 13);
        assert_eq!(t.release_reserve(), 13);
        assert_eq!(t.reserve(), 0);
    }

    /// A job whose probe workers feed only half its consumption (the workers together are
    /// capped): halving the training worker leaves the data-bound throughput where it was, but
    /// its consumption falls, so the tuner stops at what the training worker needs.
    #[test]
    fn does_not_shrink_a_data_bound_job_below_its_training_need() {
        let rate = |k: u32| 0.25 * f64::from(k);
        let c = Curve {
            rate: &rate,
            cons: 1.0,
            tw_need: 4,
            baseline: 0.3,
            noise: 0.0,
            cap: 0.5,
        };
        let (t, _) = c.tune(1, 16, 1);
        assert_eq!(t.phase(), Phase::Steady);
        assert!(t.desired().tw_cpus >= 4, "{:?}", t.desired());
    }

    #[test]
    fn grows_the_training_worker_when_more_workers_stop_helping() {
        let rate = |k: u32| 0.25 * f64::from(k);
        let c = Curve {
            rate: &rate,
            cons: 1.0,
            tw_need: 3,
            baseline: 0.6,
            noise: 0.0,
            cap: f64::INFINITY,
        };
        let (mut t, _) = c.tune(1, 16, 1);
        let tw = t.desired().tw_cpus;
        let obs = |workers: u32, throughput: f64, busy: f64| Observation {
            stage_production: vec![0.25],
            consumption: 1.0,
            throughput,
            tw_cpu_busy: busy,
            data_workers: workers,
        };
        t.apply(&obs(4, 0.8, 1.0), 1000.0).expect("valid");
        // One more worker, no gain, busy training worker: grow by one.
        let e = t.apply(&obs(5, 0.8, 1.0), 1010.0).expect("valid");
        assert!(e.contains(&TunerEvent::TwResized {
            from: tw,
            to: tw + 1
        }));
        // More workers that help: no change.
        let e = t.apply(&obs(6, 1.0, 1.0), 1020.0).expect("valid");
        assert!(e.is_empty(), "{e:?}");
        // More workers, no gain, idle training worker: no change.
        let e = t.apply(&obs(7, 1.0, 0.5), 1030.0).expect("valid");
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn multi_stage_jobs_are_sized_stage_by_stage() {
        let cons = 1.0;
        let rate0 = |k: u32| 0.1 * f64::from(k.min(3));
        let rate1 = |k: u32| 0.5 * f64::from(k);
        let mut t = TunerState::new(TunerConfig::default(), 2, 8).expect("valid");
        let mut now = 0.0;
        let mut events = Vec::new();
        while !t.is_settled() {
            let c = t.desired().clone();
            let p0 = if c.stages[0].dw_count > 0 {
                rate0(c.stages[0].dw_cpus)
            } else {
                0.0
            };
            let p1 = if c.stages[1].dw_count > 0 {
                rate1(c.stages[1].dw_cpus)
            } else {
                0.0
            };
            let thr = if c.use_data_workers {
                (f64::from(c.stages[0].dw_count) * p0)
                    .min(f64::from(c.stages[1].dw_count) * p1)
                    .min(cons)
            } else {
                0.4
            };
            let obs = Observation {
                stage_production: vec![p0, p1],
                consumption: cons,
                throughput: thr,
                tw_cpu_busy: 1.0,
                data_workers: c.stages.iter().map(|s| s.dw_count).sum(),
            };
            now += 10.0;
            events.extend(t.apply(&obs, now).expect("valid"));
            assert!(now < 5_000.0);
        }
        assert_eq!(
            sized(&events),
            vec![(3, SizeReason::SubLinear), (2, SizeReason::IdealQueueState)]
        );
        let stages = &t.desired().stages;
        assert_eq!((stages[0].dw_cpus, stages[0].dw_count), (3, 4));
        assert_eq!((stages[1].dw_cpus, stages[1].dw_count), (2, 1));
    }

    #[test]
    fn rejects_bad_observations() {
        let mut t = TunerState::new(TunerConfig::default(), 1, 4).expect("valid");
        let good = Observation {
            stage_production: vec![0.0],
            consumption: 1.0,
            throughput: 0.5,
            tw_cpu_busy: 1.0,
            data_workers: 0,
        };
        let nan = Observation {
            throughput: f64::NAN,
            ..good.clone()
        };
        assert!(matches!(
            t.apply(&nan, 0.0),
            Err(Error::BadObservation {
                field: "throughput",
                ..
            })
        ));
        let stages = Observation {
            stage_production: vec![],
            ..good.clone()
        };
        assert!(matches!(
            t.apply(&stages, 0.0),
            Err(Error::StageCount {
                expected: 1,
                got: 0
            })
        ));
        t.apply(&good, 10.0).expect("valid");
        assert!(matches!(
            t.apply(&good, 5.0),
            Err(Error::TimeWentBackwards { .. })
        ));
        assert!(TunerState::new(TunerConfig::default(), 0, 4).is_err());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn arbitrary_observations_keep_the_configuration_sane(
                tw in 1u32..64,
                stages in 1usize..3,
                obs in proptest::collection::vec(
                    (0.0f64..10.0, 0.0f64..10.0, 0.0f64..10.0, 0.0f64..1.0, 0u32..100), 1..80),
            ) {
                let config = TunerConfig::default();
                let mut t = TunerState::new(config, stages, tw).expect("valid");
                let mut now = 0.0;
                for (p, c, thr, busy, n) in obs {
                    now += 10.0;
                    let o = Observation {
                        stage_production: vec![p; stages],
                        consumption: c,
                        throughput: thr,
                        tw_cpu_busy: busy,
                        data_workers: n,
                    };
                    t.apply(&o, now).expect("valid input is accepted");
                    let d = t.desired();
                    prop_assert!(d.tw_cpus >= config.min_tw_cpus.min(tw));
                    for s in &d.stages {
                        prop_assert!(s.dw_cpus <= config.max_dw_cpus);
                        prop_assert!(s.dw_count <= config.max_probe_workers);
                    }
                    if !d.use_data_workers {
                        prop_assert_eq!(t.reserve(), 0);
                    }
                    // CPUs are never created: held plus reserve never exceed the start,
                    // except for growth in the steady phase.
                    if !matches!(t.phase(), Phase::Steady) {
                        prop_assert!(d.tw_cpus + t.reserve() <= tw);
                    }
                }
            }
        }
    }
}
