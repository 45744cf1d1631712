//! Scenario and property tests of the lease table and its journal.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use crate::*;

fn config(stages: u32) -> DispatcherConfig {
    DispatcherConfig {
        records: 10,
        batch_size: 3,
        drop_remainder: false,
        shuffle: Shuffle::Seeded { seed: 7 },
        chain: None,
        epochs: Some(2),
        restart_every: None,
        lease_duration: Duration::from_millis(100),
        max_leases_per_worker: 2,
        stages,
    }
}

const W1: WorkerId = WorkerId(1);
const W2: WorkerId = WorkerId(2);
const S0: StageId = StageId(0);
const S1: StageId = StageId(1);

fn t(ms: u64) -> Time {
    Time::from_millis(ms)
}

/// Registers `worker` for `stage`; the events.
fn register(state: &mut DispatcherState, worker: WorkerId, stage: StageId) -> Vec<Event> {
    let command = Command::RegisterWorker {
        worker,
        stage,
        protocol_version: PROTOCOL_VERSION,
    };
    state.apply(command, t(0)).expect("register")
}

/// Requests a lease and returns the granted step and records.
fn lease(state: &mut DispatcherState, worker: WorkerId, now: u64) -> Result<(StepId, Vec<u64>)> {
    let events = state.apply(Command::RequestLease { worker }, t(now))?;
    match events.as_slice() {
        [Event::LeaseGranted {
            step,
            batch: GrantedBatch::Records(records),
            ..
        }] => Ok((*step, records.clone())),
        other => panic!("unexpected events {other:?}"),
    }
}

fn complete(
    state: &mut DispatcherState,
    worker: WorkerId,
    stage: StageId,
    step: StepId,
) -> Result<Vec<Event>> {
    state.apply(
        Command::Complete {
            worker,
            stage,
            step,
        },
        t(0),
    )
}

#[test]
fn leases_in_order_and_relets_an_expired_step_first_with_the_same_batch() {
    let mut state = DispatcherState::new(config(1)).expect("config");
    register(&mut state, W1, S0);
    register(&mut state, W2, S0);
    let (a, records_a) = lease(&mut state, W1, 0).expect("lease");
    let (b, _) = lease(&mut state, W2, 50).expect("lease");
    assert_eq!((a, b), (StepId::new(0, 0), StepId::new(0, 1)));
    assert_eq!(records_a, index_batch(state.config(), a).expect("batch"));

    // At 100 ms W1's lease expires, W2's (deadline 150 ms) does not.
    let events = state.apply(Command::Tick, t(100)).expect("tick");
    assert_eq!(
        events,
        vec![Event::LeaseExpired {
            worker: W1,
            stage: S0,
            step: a
        }]
    );
    // The expired step goes out again before step 2, with the identical batch.
    assert_eq!(
        lease(&mut state, W2, 100).expect("re-lease"),
        (a, records_a)
    );

    // W1 reports the step it lost: rejected, nothing changes.
    let before = state.clone();
    let err = complete(&mut state, W1, S0, a).expect_err("not held");
    assert!(err.is_rejection() && !err.is_retryable(), "{err}");
    assert_eq!(state, before);
    // W2 holds two leases: the limit.
    let err = lease(&mut state, W2, 100).expect_err("limit");
    assert!(err.is_retryable(), "{err}");

    complete(&mut state, W2, S0, a).expect("complete");
    // Completing twice is a rejection: each step completes once.
    assert!(complete(&mut state, W2, S0, a)
        .expect_err("twice")
        .is_rejection());
    assert_eq!(
        lease(&mut state, W1, 200).expect("lease").0,
        StepId::new(0, 2)
    );
}

#[test]
fn a_lost_workers_leases_go_to_others_and_its_id_is_never_reused() {
    let mut state = DispatcherState::new(config(1)).expect("config");
    register(&mut state, W1, S0);
    let (a, _) = lease(&mut state, W1, 0).expect("lease");
    let (b, _) = lease(&mut state, W1, 0).expect("lease");
    let events = state
        .apply(Command::WorkerLost { worker: W1 }, t(10))
        .expect("lost");
    assert_eq!(
        events,
        vec![
            Event::LeaseRevoked {
                worker: W1,
                stage: S0,
                step: a
            },
            Event::LeaseRevoked {
                worker: W1,
                stage: S0,
                step: b
            },
            Event::WorkerLost { worker: W1 },
        ]
    );
    assert!(complete(&mut state, W1, S0, a)
        .expect_err("gone")
        .is_rejection());
    let again = Command::RegisterWorker {
        worker: W1,
        stage: S0,
        protocol_version: PROTOCOL_VERSION,
    };
    assert_eq!(
        state.apply(again, t(10)),
        Err(Error::WorkerRetired { worker: W1 })
    );
    register(&mut state, W2, S0);
    assert_eq!(lease(&mut state, W2, 20).expect("lease").0, a);
    assert_eq!(lease(&mut state, W2, 20).expect("lease").0, b);
}

#[test]
fn a_draining_worker_finishes_what_it_holds_then_goes() {
    let mut state = DispatcherState::new(config(1)).expect("config");
    register(&mut state, W1, S0);
    let (a, _) = lease(&mut state, W1, 0).expect("lease");
    let events = state
        .apply(Command::Drain { worker: W1 }, t(1))
        .expect("drain");
    assert_eq!(events, vec![Event::WorkerDraining { worker: W1 }]);
    assert_eq!(state.apply(Command::Drain { worker: W1 }, t(1)), Ok(vec![]));
    assert_eq!(
        lease(&mut state, W1, 2),
        Err(Error::Draining { worker: W1 })
    );
    let events = complete(&mut state, W1, S0, a).expect("complete");
    assert_eq!(
        events,
        vec![
            Event::StepCompleted {
                worker: W1,
                stage: S0,
                step: a
            },
            Event::WorkerDrained { worker: W1 },
        ]
    );
    assert!(state.worker(W1).is_none());
}

#[test]
fn a_later_stage_leases_only_what_the_stage_before_completed() {
    let mut state = DispatcherState::new(config(2)).expect("config");
    register(&mut state, W1, S0);
    register(&mut state, W2, S1);
    assert_eq!(
        lease(&mut state, W2, 0),
        Err(Error::NoStepReady { stage: S1 })
    );
    let (a, records) = lease(&mut state, W1, 0).expect("lease");
    assert_eq!(
        lease(&mut state, W2, 0),
        Err(Error::NoStepReady { stage: S1 })
    );
    complete(&mut state, W1, S0, a).expect("complete");
    assert_eq!(lease(&mut state, W2, 0).expect("lease"), (a, records));
    let wrong = complete(&mut state, W2, S0, a).expect_err("stage");
    assert!(matches!(wrong, Error::WrongStage { .. }), "{wrong}");
}

#[test]
fn consumed_steps_are_never_leased_again_and_the_end_is_signalled() {
    let mut c = config(1);
    c.epochs = Some(1); // 4 steps
    let mut state = DispatcherState::new(c).expect("config");
    register(&mut state, W1, S0);
    register(&mut state, W2, S0);
    let (a, _) = lease(&mut state, W1, 0).expect("lease");
    let (b, _) = lease(&mut state, W2, 0).expect("lease");
    state.apply(Command::Tick, t(1000)).expect("tick");
    // Both returned; the training side nevertheless got step 1 (a slow worker delivered it
    // before its report), so only step 0 is leased again.
    assert_eq!(
        state.apply(
            Command::Consumed {
                watermark: StepId::new(0, 3)
            },
            t(1000)
        ),
        Err(Error::WatermarkAhead {
            watermark: StepId::new(0, 3)
        })
    );
    state
        .apply(Command::Consumed { watermark: b }, t(1000))
        .expect("consumed");
    assert_eq!(state.watermark(), Some(b));
    assert_eq!(
        state.apply(Command::Consumed { watermark: a }, t(1000)),
        Ok(vec![])
    );
    let (c2, _) = lease(&mut state, W1, 1000).expect("lease");
    assert_eq!(c2, StepId::new(0, 2));
    let (d, _) = lease(&mut state, W2, 1000).expect("lease");
    complete(&mut state, W1, S0, c2).expect("complete");
    // Consuming the last step retires W2's lease of it and ends the data.
    let events = state
        .apply(Command::Consumed { watermark: d }, t(1001))
        .expect("consumed");
    assert_eq!(
        events,
        vec![
            Event::WatermarkAdvanced { watermark: d },
            Event::LeaseRetired {
                worker: W2,
                stage: S0,
                step: d
            },
            Event::EndOfData { last: d },
        ]
    );
    assert!(state.is_end_of_data());
    let done = lease(&mut state, W1, 1002).expect_err("finished");
    assert_eq!(done, Error::StageFinished { stage: S0 });
    assert!(!done.is_retryable() && !done.is_rejection());
}

#[test]
fn hostile_commands_are_rejected_without_change() {
    let mut state = DispatcherState::new(config(2)).expect("config");
    register(&mut state, W1, S0);
    lease(&mut state, W1, 0).expect("lease");
    let before = state.clone();
    let bad = [
        Command::RegisterWorker {
            worker: W2,
            stage: S0,
            protocol_version: 99,
        },
        Command::RegisterWorker {
            worker: W2,
            stage: StageId(9),
            protocol_version: PROTOCOL_VERSION,
        },
        Command::RegisterWorker {
            worker: W1,
            stage: S0,
            protocol_version: PROTOCOL_VERSION,
        },
        Command::Heartbeat { worker: W2 },
        Command::RequestLease { worker: W2 },
        Command::Complete {
            worker: W1,
            stage: S0,
            step: StepId::new(u64::MAX, u64::MAX),
        },
        Command::Complete {
            worker: W1,
            stage: S0,
            step: StepId::new(1, 0),
        },
        Command::Complete {
            worker: W1,
            stage: StageId(u32::MAX),
            step: StepId::new(0, 0),
        },
        Command::Consumed {
            watermark: StepId::new(7, 0),
        },
        Command::Consumed {
            watermark: StepId::new(0, 1),
        },
        Command::Drain { worker: W2 },
        Command::WorkerLost { worker: W2 },
    ];
    for command in bad {
        let err = state.apply(command.clone(), t(5)).expect_err("rejected");
        assert!(err.is_rejection(), "{command:?}: {err}");
        assert_eq!(state, before, "{command:?}");
    }
}

#[test]
fn replay_refuses_a_journal_of_another_seed_or_an_impossible_event() {
    let mut state = DispatcherState::new(config(1)).expect("config");
    let mut journal = register(&mut state, W1, S0);
    journal.extend(
        state
            .apply(Command::RequestLease { worker: W1 }, t(0))
            .expect("lease"),
    );
    assert_eq!(
        DispatcherState::replay(config(1), &journal).as_ref(),
        Ok(&state)
    );

    let mut reseeded = config(1);
    reseeded.shuffle = Shuffle::Seeded { seed: 8 };
    assert!(matches!(
        DispatcherState::replay(reseeded, &journal),
        Err(Error::Journal { index: 1, .. })
    ));

    let mut bad = journal.clone();
    bad.push(Event::StepCompleted {
        worker: W2,
        stage: S0,
        step: StepId::new(0, 0),
    });
    assert!(matches!(
        DispatcherState::replay(config(1), &bad),
        Err(Error::Journal { index: 2, .. })
    ));
}

#[test]
fn events_round_trip_through_json() {
    let grant = |batch| Event::LeaseGranted {
        worker: W1,
        stage: S0,
        step: StepId::new(1, 2),
        deadline: t(5),
        batch,
    };
    let events = vec![
        grant(GrantedBatch::Records(vec![3, 1])),
        Event::EndOfData {
            last: StepId::new(1, 3),
        },
    ];
    let text = serde_json::to_string(&events).expect("serialize");
    let back: Vec<Event> = serde_json::from_str(&text).expect("deserialize");
    // A grant keeps its batch's CRC only: the CRC-32C of the ids as little-endian u64s.
    let crc = crc32c::crc32c(&[3u64.to_le_bytes(), 1u64.to_le_bytes()].concat());
    assert_eq!(GrantedBatch::crc_of(&[3, 1]), crc);
    assert_eq!(back, vec![grant(GrantedBatch::Crc(crc)), events[1].clone()]);
    let written = format!("\"batch\":{crc}");
    assert!(text.contains(&written), "{text}");
    assert_eq!(serde_json::to_string(&back).expect("serialize again"), text);
    // A format-1 line lists the ids, under `records`.
    let old = text.replace(&written, "\"records\":[3,1]");
    let back: Vec<Event> = serde_json::from_str(&old).expect("format 1");
    assert_eq!(back, events);
    // Neither a CRC beyond 32 bits nor anything else is a batch.
    for bad in [
        "\"batch\":4294967296",
        "\"batch\":\"3,1\"",
        "\"batch\":[-1]",
    ] {
        let text = text.replace(&written, bad);
        assert!(serde_json::from_str::<Vec<Event>>(&text).is_err(), "{bad}");
    }
}

#[test]
fn a_replay_checks_each_grant_by_its_crc_and_by_its_ids() {
    let mut state = DispatcherState::new(config(1)).expect("state");
    let mut journal = register(&mut state, W1, S0);
    journal.extend(
        state
            .apply(Command::RequestLeases { worker: W1, max: 2 }, t(0))
            .expect("lease"),
    );
    // As a journal gives them back: CRCs, not ids.
    let read_back: Vec<Event> =
        serde_json::from_str(&serde_json::to_string(&journal).expect("serialize"))
            .expect("deserialize");
    assert!(read_back.iter().any(|e| matches!(
        e,
        Event::LeaseGranted {
            batch: GrantedBatch::Crc(_),
            ..
        }
    )));
    assert_eq!(
        DispatcherState::replay(config(1), &read_back).as_ref(),
        Ok(&state)
    );
    // Another order (another seed) is refused by the CRC as by the ids.
    let mut reseeded = config(1);
    reseeded.shuffle = Shuffle::Seeded { seed: 8 };
    for events in [&journal, &read_back] {
        assert!(matches!(
            DispatcherState::replay(reseeded.clone(), events),
            Err(Error::Journal { index: 1, .. })
        ));
    }
}

// ---- property tests ----

/// A random action. A `worker` below [`LIVE`] names the `worker % n`-th live worker (when any
/// is alive); other values are raw ids, mostly of strangers or of retired workers.
#[derive(Debug, Clone)]
enum Op {
    /// Register a fresh id, or (`fresh == false`) re-register `worker`'s id.
    Register {
        fresh: bool,
        worker: u64,
        stage: u32,
    },
    Heartbeat(u64),
    Request(u64),
    /// Lease up to `max` steps in one request.
    RequestBatch {
        worker: u64,
        max: u32,
    },
    /// Report in one request the held leases picked by the bits of `mask`, plus, when `stray`,
    /// a step the worker does not hold.
    CompleteBatch {
        worker: u64,
        mask: u8,
        stray: bool,
    },
    /// A new receiver registered (what the old one buffered is redone).
    ReceiverReset,
    /// The training side restarted from a checkpoint before `step` of `epoch`.
    Rewind {
        epoch: u64,
        step: u64,
    },
    /// The training side ends the job at its watermark (or, `stray`, at another step).
    EndJob {
        stray: bool,
    },
    /// Complete the `nth` lease the worker holds (or a step it does not hold when it holds none).
    CompleteHeld {
        worker: u64,
        nth: usize,
    },
    /// A report of an arbitrary, probably not held, step.
    CompleteAny {
        worker: u64,
        stage: u32,
        epoch: u64,
        step: u64,
    },
    ConsumeAny {
        epoch: u64,
        step: u64,
    },
    /// The training side reports the step after the watermark (whether or not it completed:
    /// a worker may deliver before it reports).
    ConsumeNext,
    Drain(u64),
    Lost(u64),
    /// Move time forward by this many milliseconds and tick.
    Tick(u64),
}

const LIVE: u64 = 6;

fn op() -> impl Strategy<Value = Op> {
    let w = 0u64..LIVE + 2;
    prop_oneof![
        6 => (prop::bool::weighted(0.9), w.clone(), 0u32..5)
            .prop_map(|(fresh, worker, stage)| Op::Register { fresh, worker, stage }),
        1 => w.clone().prop_map(Op::Heartbeat),
        8 => w.clone().prop_map(Op::Request),
        4 => (w.clone(), 0u32..6).prop_map(|(worker, max)| Op::RequestBatch { worker, max }),
        4 => (w.clone(), any::<u8>(), prop::bool::weighted(0.2))
            .prop_map(|(worker, mask, stray)| Op::CompleteBatch { worker, mask, stray }),
        8 => (w.clone(), 0usize..3).prop_map(|(worker, nth)| Op::CompleteHeld { worker, nth }),
        1 => (w.clone(), 0u32..3, 0u64..4, 0u64..12)
            .prop_map(|(worker, stage, epoch, step)| Op::CompleteAny { worker, stage, epoch, step }),
        1 => (0u64..3, 0u64..12).prop_map(|(epoch, step)| Op::ConsumeAny { epoch, step }),
        2 => Just(Op::ConsumeNext),
        1 => w.clone().prop_map(Op::Drain),
        1 => w.prop_map(Op::Lost),
        2 => (0u64..150).prop_map(Op::Tick),
        1 => Just(Op::ReceiverReset),
        1 => (0u64..3, 0u64..12).prop_map(|(epoch, step)| Op::Rewind { epoch, step }),
        1 => prop::bool::weighted(0.2).prop_map(|stray| Op::EndJob { stray }),
    ]
}

fn job_config() -> impl Strategy<Value = DispatcherConfig> {
    (
        1u64..40,
        1u64..8,
        any::<bool>(),
        proptest::option::of(any::<u64>()),
        1u64..4,
        20u64..200,
        1u32..4,
        1u32..4,
    )
        .prop_map(
            |(records, batch_size, drop, seed, epochs, lease_ms, max_leases, stages)| {
                DispatcherConfig {
                    records,
                    batch_size,
                    drop_remainder: drop && batch_size <= records,
                    shuffle: seed.map_or(Shuffle::Off, |seed| Shuffle::Seeded { seed }),
                    chain: None,
                    epochs: Some(epochs),
                    restart_every: None,
                    lease_duration: Duration::from_millis(lease_ms),
                    max_leases_per_worker: max_leases,
                    stages,
                }
            },
        )
}

/// Drives random ops: resolves worker choices against the live state and hands out fresh ids.
#[derive(Debug, Default)]
struct Driver {
    next_id: u64,
    now: u64,
}

impl Driver {
    fn pick(state: &DispatcherState, worker: u64) -> WorkerId {
        let live: Vec<WorkerId> = state.workers().map(|(w, _)| w).collect();
        match usize::try_from(worker) {
            Ok(k) if worker < LIVE && !live.is_empty() => live[k % live.len()],
            _ => WorkerId(worker),
        }
    }

    /// The command for `op` against the current state (time moves on a `Tick`).
    fn command(&mut self, state: &DispatcherState, op: &Op) -> Command {
        match *op {
            Op::Register {
                fresh,
                worker,
                stage,
            } => {
                let worker = if fresh {
                    self.next_id += 1;
                    WorkerId(self.next_id - 1)
                } else {
                    Self::pick(state, worker)
                };
                Command::RegisterWorker {
                    worker,
                    // Mostly a stage of the plan, sometimes one that does not exist.
                    stage: StageId(if stage == 4 {
                        99
                    } else {
                        stage % state.config().stages
                    }),
                    protocol_version: PROTOCOL_VERSION,
                }
            }
            Op::Heartbeat(w) => Command::Heartbeat {
                worker: Self::pick(state, w),
            },
            Op::Request(w) => Command::RequestLease {
                worker: Self::pick(state, w),
            },
            Op::RequestBatch { worker, max } => Command::RequestLeases {
                worker: Self::pick(state, worker),
                max,
            },
            Op::CompleteBatch {
                worker,
                mask,
                stray,
            } => {
                let worker = Self::pick(state, worker);
                let stage = state.worker(worker).map_or(S0, |info| info.stage);
                let mut steps: Vec<StepId> = state
                    .leases_of(worker)
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << (i % 8)) != 0)
                    .map(|(_, step)| step)
                    .collect();
                if stray {
                    steps.push(StepId::new(0, 0));
                }
                Command::CompleteSteps {
                    worker,
                    stage,
                    steps,
                }
            }
            Op::CompleteHeld { worker, nth } => {
                let worker = Self::pick(state, worker);
                let held = state.leases_of(worker);
                let stage = state.worker(worker).map_or(S0, |info| info.stage);
                let step = if held.is_empty() {
                    StepId::new(0, 0)
                } else {
                    held[nth % held.len()]
                };
                Command::Complete {
                    worker,
                    stage,
                    step,
                }
            }
            Op::CompleteAny {
                worker,
                stage,
                epoch,
                step,
            } => Command::Complete {
                worker: Self::pick(state, worker),
                stage: StageId(stage),
                step: StepId::new(epoch, step),
            },
            Op::ConsumeAny { epoch, step } => Command::Consumed {
                watermark: StepId::new(epoch, step),
            },
            Op::ConsumeNext => {
                let per_epoch = state.config().steps_per_epoch();
                let watermark = match state.watermark() {
                    None => StepId::new(0, 0),
                    Some(w) if w.step.0 + 1 == per_epoch => StepId::new(w.epoch.0 + 1, 0),
                    Some(w) => StepId::new(w.epoch.0, w.step.0 + 1),
                };
                Command::Consumed { watermark }
            }
            Op::Drain(w) => Command::Drain {
                worker: Self::pick(state, w),
            },
            Op::Lost(w) => Command::WorkerLost {
                worker: Self::pick(state, w),
            },
            Op::Tick(dt) => {
                self.now += dt;
                Command::Tick
            }
            Op::ReceiverReset => Command::ReceiverReset,
            Op::Rewind { epoch, step } => Command::Rewind {
                next: StepId::new(epoch, step),
            },
            Op::EndJob { stray } => {
                let last = state.watermark().unwrap_or(StepId::new(0, 0));
                let last = if stray {
                    StepId::new(last.epoch.0, last.step.0 + 1)
                } else {
                    last
                };
                Command::EndJob { last }
            }
        }
    }
}

/// Applies a command, checking that a refusal changes nothing and is never an internal error.
fn apply_checked(
    state: &mut DispatcherState,
    command: Command,
    now: u64,
) -> std::result::Result<Vec<Event>, TestCaseError> {
    let before = state.clone();
    match state.apply(command.clone(), t(now)) {
        Ok(events) => {
            if let Err(reason) = state.check_invariants() {
                prop_assert!(false, "{:?} broke an invariant: {}", command, reason);
            }
            Ok(events)
        }
        Err(err) => {
            prop_assert!(
                !matches!(err, Error::Invariant { .. }),
                "{command:?}: {err}"
            );
            prop_assert!(
                err.is_rejection()
                    || err.is_retryable()
                    || matches!(err, Error::StageFinished { .. }),
                "{err}"
            );
            prop_assert_eq!(
                &*state,
                &before,
                "{:?} was refused but changed the state",
                command
            );
            Ok(Vec::new())
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The journal rebuilds the live state after any command sequence, including hostile and
    /// stale commands; a refused command changes nothing.
    #[test]
    fn replay_equals_live_state(
        config in job_config(),
        forever: bool,
        ops in proptest::collection::vec(op(), 0..150),
    ) {
        let config = DispatcherConfig { epochs: if forever { None } else { config.epochs }, ..config };
        let mut state = DispatcherState::new(config.clone()).expect("valid config");
        let mut journal = Vec::new();
        let mut driver = Driver::default();
        for op in &ops {
            let command = driver.command(&state, op);
            journal.extend(apply_checked(&mut state, command, driver.now)?);
            if journal.len() % 16 == 0 {
                prop_assert_eq!(&DispatcherState::replay(config.clone(), &journal).expect("replay"), &state);
            }
        }
        let replayed = DispatcherState::replay(config, &journal).expect("replay");
        prop_assert_eq!(replayed, state);
    }

    /// A compacted journal's snapshot, taken anywhere in any command sequence, restores the
    /// state exactly (through its JSON), and the restored state answers every later command
    /// with the live state's events.
    #[test]
    fn a_snapshot_restores_the_state_and_what_follows_alike(
        config in job_config(),
        forever: bool,
        ops in proptest::collection::vec(op(), 0..150),
        cut in 0usize..150,
    ) {
        let config = DispatcherConfig { epochs: if forever { None } else { config.epochs }, ..config };
        let mut live = DispatcherState::new(config.clone()).expect("valid config");
        let mut driver = Driver::default();
        let cut = cut.min(ops.len());
        for op in &ops[..cut] {
            let command = driver.command(&live, op);
            apply_checked(&mut live, command, driver.now)?;
        }
        let json = serde_json::to_string(&live.snapshot()).expect("to json");
        let snapshot: StateSnapshot = serde_json::from_str(&json).expect("from json");
        let mut restored = DispatcherState::restore(config, snapshot).expect("restore");
        prop_assert_eq!(&restored, &live);
        for op in &ops[cut..] {
            let command = driver.command(&live, op);
            let now = t(driver.now);
            let expected = live.apply(command.clone(), now);
            let got = restored.apply(command, now);
            prop_assert_eq!(format!("{got:?}"), format!("{expected:?}"));
            prop_assert_eq!(&restored, &live);
        }
    }

    /// Issue 5's invariant at the state-machine level: under crashes, expiries, drains and new
    /// workers, with a training side that consumes in order what the last stage completed,
    /// every step of every epoch completes exactly once per stage, its batch never changes,
    /// and the training side consumes every step in order.
    #[test]
    fn every_step_completes_once_and_is_consumed_in_order(
        config in job_config(),
        ops in proptest::collection::vec(op(), 0..150),
    ) {
        let mut state = DispatcherState::new(config.clone()).expect("valid config");
        let per_epoch = config.steps_per_epoch();
        let total = config.total_steps().expect("finite job");
        let last_stage = StageId(config.stages - 1);
        let mut completions: BTreeMap<(StageId, StepId), u32> = BTreeMap::new();
        let mut batches: BTreeMap<StepId, Vec<u64>> = BTreeMap::new();
        let mut consumed: Vec<StepId> = Vec::new();
        let mut next_consume = 0u64;
        let mut driver = Driver::default();
        let mut now = 0;

        let mut record = |events: Vec<Event>, completions: &mut BTreeMap<(StageId, StepId), u32>| -> std::result::Result<(), TestCaseError> {
            for event in events {
                match event {
                    Event::StepCompleted { stage, step, .. } => *completions.entry((stage, step)).or_default() += 1,
                    Event::LeaseGranted { step, batch: GrantedBatch::Records(records), .. } => {
                        let first = batches.entry(step).or_insert_with(|| records.clone());
                        prop_assert_eq!(&*first, &records, "a re-lease changed the batch of {}", step);
                    }
                    Event::WatermarkAdvanced { watermark } => consumed.push(watermark),
                    _ => {}
                }
            }
            Ok(())
        };
        // The training side: consume, in order, every step the last stage has completed.
        let consume = |state: &mut DispatcherState, next: &mut u64, now: u64| -> std::result::Result<Vec<Event>, TestCaseError> {
            let mut events = Vec::new();
            while *next < total {
                let step = StepId::new(*next / per_epoch, *next % per_epoch);
                if !state.is_completed(last_stage, step) {
                    break;
                }
                events.extend(apply_checked(state, Command::Consumed { watermark: step }, now)?);
                *next += 1;
            }
            Ok(events)
        };

        // Only the modelled training side below reports consumption here.
        // A receiver reset redoes completed steps on purpose (its own test below).
        let ops = ops.iter().filter(|op| {
            !matches!(
                op,
                Op::ConsumeAny { .. }
                    | Op::ConsumeNext
                    | Op::ReceiverReset
                    | Op::Rewind { .. }
                    | Op::EndJob { .. }
            )
        });
        for op in ops {
            let command = driver.command(&state, op);
            now = driver.now;
            let events = apply_checked(&mut state, command, now)?;
            record(events, &mut completions)?;
            let events = consume(&mut state, &mut next_consume, now)?;
            record(events, &mut completions)?;
        }

        // Recovery: fresh workers for every stage run the job to its end.
        let fresh: Vec<WorkerId> = (0..config.stages).map(|s| WorkerId(1000 + u64::from(s))).collect();
        for (s, worker) in fresh.iter().enumerate() {
            let stage = StageId(u32::try_from(s).expect("few stages"));
            let register = Command::RegisterWorker { worker: *worker, stage, protocol_version: PROTOCOL_VERSION };
            record(apply_checked(&mut state, register, now)?, &mut completions)?;
        }
        let budget = 4 * total * u64::from(config.stages) + 100;
        for _ in 0..budget {
            if state.is_end_of_data() {
                break;
            }
            now += 1000; // past every deadline: what stragglers hold comes back
            record(apply_checked(&mut state, Command::Tick, now)?, &mut completions)?;
            for worker in &fresh {
                record(apply_checked(&mut state, Command::RequestLeases { worker: *worker, max: 3 }, now)?, &mut completions)?;
                let stage = state.worker(*worker).map_or(S0, |info| info.stage);
                let steps = state.leases_of(*worker);
                record(apply_checked(&mut state, Command::CompleteSteps { worker: *worker, stage, steps }, now)?, &mut completions)?;
            }
            let events = consume(&mut state, &mut next_consume, now)?;
            record(events, &mut completions)?;
        }
        prop_assert!(state.is_end_of_data(), "the job did not finish");

        let all: Vec<StepId> = (0..total).map(|n| StepId::new(n / per_epoch, n % per_epoch)).collect();
        prop_assert_eq!(&consumed, &all, "consumed out of order or incompletely");
        for stage in (0..config.stages).map(StageId) {
            for step in &all {
                prop_assert_eq!(completions.get(&(stage, *step)).copied(), Some(1), "{} {}", stage, step);
            }
        }
        // Stage 0's batches of each epoch cover the records exactly once.
        let kept = per_epoch.min(config.records / config.batch_size) * config.batch_size
            + if config.drop_remainder { 0 } else { config.records % config.batch_size };
        for epoch in 0..config.epochs.unwrap_or(0) {
            let mut records: Vec<u64> = batches.range(StepId::new(epoch, 0)..StepId::new(epoch + 1, 0)).flat_map(|(_, r)| r.clone()).collect();
            records.sort_unstable();
            let distinct: BTreeSet<u64> = records.iter().copied().collect();
            prop_assert_eq!(records.len() as u64, kept);
            prop_assert_eq!(distinct.len() as u64, kept);
        }
    }

    /// A batched lease grants between one and `max` steps, never beyond the worker's lease
    /// limit, returned steps first and otherwise consecutive steps in order; every step of a
    /// batch has the same deadline and expires on its own; a batched report completes exactly
    /// the listed steps the worker holds.
    #[test]
    fn batched_leases_respect_the_limit_and_come_in_order(
        config in job_config(),
        ops in proptest::collection::vec(op(), 0..150),
    ) {
        let mut state = DispatcherState::new(config.clone()).expect("valid config");
        let mut driver = Driver::default();
        let limit = usize::try_from(config.max_leases_per_worker).expect("small");
        for op in &ops {
            let command = driver.command(&state, op);
            let before = state.clone();
            let events = apply_checked(&mut state, command.clone(), driver.now)?;
            for (worker, info) in state.workers() {
                prop_assert!(info.lease_count() <= limit, "{} holds {} > {}", worker, info.lease_count(), limit);
            }
            match command {
                Command::RequestLeases { worker, max } if !events.is_empty() => {
                    let granted: Vec<StepId> = events.iter().filter_map(|e| match e {
                        Event::LeaseGranted { worker: w, step, .. } if *w == worker => Some(*step),
                        _ => None,
                    }).collect();
                    prop_assert_eq!(granted.len(), events.len(), "only grants, all to the asker");
                    prop_assert!(granted.len() <= usize::try_from(max.max(1)).expect("small"));
                    let deadlines: BTreeSet<Time> = events.iter().filter_map(|e| match e {
                        Event::LeaseGranted { deadline, .. } => Some(*deadline),
                        _ => None,
                    }).collect();
                    prop_assert_eq!(deadlines.len(), 1);
                    let mut sorted = granted.clone();
                    sorted.sort();
                    prop_assert_eq!(&sorted, &granted, "granted out of order");
                    // One by one, the same steps would have been granted.
                    let mut one_by_one = before.clone();
                    for step in &granted {
                        let events = one_by_one.apply(Command::RequestLease { worker }, t(driver.now)).expect("grantable");
                        let same = matches!(events.first(), Some(Event::LeaseGranted { step: s, .. }) if s == step);
                        prop_assert!(same, "one by one, {} was not next", step);
                    }
                    prop_assert_eq!(one_by_one, state.clone());
                }
                Command::CompleteSteps { worker, steps, .. } if !events.is_empty() => {
                    let held: BTreeSet<StepId> = before.leases_of(worker).into_iter().collect();
                    let done: BTreeSet<StepId> = events.iter().filter_map(|e| match e {
                        Event::StepCompleted { step, .. } => Some(*step),
                        _ => None,
                    }).collect();
                    let listed: BTreeSet<StepId> = steps.into_iter().collect();
                    let expected: BTreeSet<StepId> = listed.intersection(&held).copied().collect();
                    prop_assert_eq!(done, expected);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn a_receiver_reset_leases_completed_unconsumed_steps_again_with_the_same_batches() {
    let config = DispatcherConfig {
        records: 64,
        batch_size: 8,
        drop_remainder: true,
        shuffle: Shuffle::Seeded { seed: 3 },
        chain: None,
        epochs: Some(1),
        restart_every: None,
        lease_duration: std::time::Duration::from_secs(10),
        max_leases_per_worker: 4,
        stages: 1,
    };
    let mut state = DispatcherState::new(config).expect("valid");
    let w = WorkerId(1);
    state
        .apply(
            Command::RegisterWorker {
                worker: w,
                stage: S0,
                protocol_version: PROTOCOL_VERSION,
            },
            t(0),
        )
        .expect("register");
    let mut first = Vec::new();
    for _ in 0..3 {
        for e in state
            .apply(Command::RequestLease { worker: w }, t(1))
            .expect("lease")
        {
            if let Event::LeaseGranted {
                step,
                batch: GrantedBatch::Records(records),
                ..
            } = e
            {
                first.push((step, records));
            }
        }
    }
    for (step, _) in &first {
        state
            .apply(
                Command::Complete {
                    worker: w,
                    stage: S0,
                    step: *step,
                },
                t(2),
            )
            .expect("complete");
    }
    state
        .apply(
            Command::Consumed {
                watermark: first[0].0,
            },
            t(3),
        )
        .expect("consume the first");
    let events = state.apply(Command::ReceiverReset, t(4)).expect("reset");
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(
        events[0],
        Event::LeasesReset,
        "nothing was leased; the generation goes up"
    );
    assert_eq!(state.generation(), 1);
    // The two unconsumed steps come back first, with the same records.
    for (step, records) in &first[1..] {
        let again = state
            .apply(Command::RequestLease { worker: w }, t(5))
            .expect("lease");
        assert!(
            again.iter().any(|e| matches!(e, Event::LeaseGranted { step: s, batch, .. } if s == step && batch.records() == Some(records))),
            "{again:?}"
        );
    }
}

/// The restart hang of issue 17: a worker pushed a step to the old receiver and its (batched)
/// Complete arrives after a new receiver registered. The step must not count as delivered.
#[test]
fn a_lease_held_across_a_receiver_reset_cannot_complete_and_is_leased_again() {
    let mut c = config(1);
    c.max_leases_per_worker = 4;
    let mut state = DispatcherState::new(c).expect("valid");
    let (w, v) = (WorkerId(1), WorkerId(2));
    for worker in [w, v] {
        state
            .apply(
                Command::RegisterWorker {
                    worker,
                    stage: S0,
                    protocol_version: PROTOCOL_VERSION,
                },
                t(0),
            )
            .expect("register");
    }
    let granted = state
        .apply(Command::RequestLeases { worker: w, max: 2 }, t(1))
        .expect("lease");
    let held = state.leases_of(w);
    assert_eq!(held.len(), 2, "{granted:?}");
    let events = state.apply(Command::ReceiverReset, t(2)).expect("reset");
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::LeaseRevoked { worker, .. } if *worker == w))
            .count(),
        2,
        "{events:?}"
    );
    assert!(state.leases_of(w).is_empty());
    // The late report changes nothing: neither step is complete.
    state
        .apply(
            Command::CompleteSteps {
                worker: w,
                stage: S0,
                steps: held.clone(),
            },
            t(3),
        )
        .expect("a batch with stale steps is not an error");
    for step in &held {
        assert!(
            !state.is_completed(S0, *step),
            "{step} completed after the reset"
        );
    }
    // Another worker gets the same steps again, first.
    state
        .apply(Command::RequestLeases { worker: v, max: 2 }, t(4))
        .expect("lease again");
    assert_eq!(state.leases_of(v), held);
}

#[test]
fn a_rewind_moves_the_watermark_to_a_checkpoint_and_leases_from_it_again() {
    let mut c = config(1);
    c.epochs = Some(1); // 4 steps of 3 records (the last holds 1)
    let mut state = DispatcherState::new(c).expect("config");
    register(&mut state, W1, S0);
    let mut granted = BTreeMap::new();
    for _ in 0..2 {
        let (s, records) = lease(&mut state, W1, 0).expect("lease");
        complete(&mut state, W1, S0, s).expect("complete");
        granted.insert(s, records);
    }
    let (held, _) = lease(&mut state, W1, 0).expect("lease");
    state
        .apply(
            Command::Consumed {
                watermark: StepId::new(0, 1),
            },
            t(1),
        )
        .expect("consumed");
    // The program restarts from a checkpoint taken after step 0: step 1 comes again, with the
    // same records, and the lease W1 held is revoked first (replay must accept the order).
    let events = state
        .apply(
            Command::Rewind {
                next: StepId::new(0, 1),
            },
            t(2),
        )
        .expect("rewind");
    assert_eq!(
        events,
        vec![
            Event::LeaseRevoked {
                worker: W1,
                stage: S0,
                step: held
            },
            Event::LeasesReset,
            Event::Rewound {
                next: StepId::new(0, 1)
            },
        ]
    );
    assert_eq!(state.watermark(), Some(StepId::new(0, 0)));
    assert_eq!(state.generation(), 1, "every lease was revoked at once");
    let (again, records) = lease(&mut state, W1, 3).expect("lease");
    assert_eq!(again, StepId::new(0, 1));
    assert_eq!(Some(&records), granted.get(&again));
    // Forwards too, up to one past the last step, which ends the data.
    let events = state
        .apply(
            Command::Rewind {
                next: StepId::new(1, 0),
            },
            t(4),
        )
        .expect("rewind to the end");
    assert!(matches!(events.last(), Some(Event::EndOfData { last }) if *last == StepId::new(0, 3)));
    assert!(state.is_end_of_data());
    assert_eq!(
        state.apply(
            Command::Rewind {
                next: StepId::new(1, 1)
            },
            t(5)
        ),
        Err(Error::StepOutOfRange {
            step: StepId::new(1, 1)
        })
    );
    let mut journal = Vec::new();
    let mut live = DispatcherState::new(state.config().clone()).expect("config");
    for command in [
        Command::RegisterWorker {
            worker: W1,
            stage: S0,
            protocol_version: PROTOCOL_VERSION,
        },
        Command::RequestLease { worker: W1 },
        Command::Rewind {
            next: StepId::new(0, 0),
        },
        Command::RequestLease { worker: W1 },
    ] {
        journal.extend(live.apply(command, t(6)).expect("apply"));
    }
    let replayed = DispatcherState::replay(live.config().clone(), &journal).expect("replay");
    assert_eq!(replayed, live);
}

/// A snapshot describing no state the events could build is refused with what is wrong, and
/// restoring never panics; the unbroken snapshot restores.
#[test]
fn a_snapshot_no_run_of_events_could_build_is_refused() {
    let mut state = DispatcherState::new(config(2)).expect("config");
    register(&mut state, W1, S0);
    register(&mut state, W2, S1);
    let (a, _) = lease(&mut state, W1, 0).expect("lease");
    lease(&mut state, W1, 0).expect("lease");
    complete(&mut state, W1, S0, a).expect("complete");
    let good = state.snapshot();
    assert_eq!(
        DispatcherState::restore(config(2), good.clone()).expect("restores"),
        state
    );
    assert_eq!(good.stages[0].completed, vec![0]);
    assert_eq!(good.stages[0].leases, vec![(1, W1, t(100))]);

    type Break = fn(&mut StateSnapshot);
    let broken: [(&str, Break); 12] = [
        ("number of stages", |s| {
            s.stages.pop();
        }),
        ("unknown stage", |s| s.workers[1].stage = StageId(2)),
        ("worker listed twice", |s| {
            s.workers.push(s.workers[0].clone());
        }),
        ("also registered", |s| s.retired.push(W2)),
        ("unknown worker", |s| s.stages[0].leases[0].1 = WorkerId(9)),
        ("another stage", |s| s.stages[0].leases[0].1 = W2),
        ("leased step listed twice", |s| {
            s.stages[0].leases.push((1, W1, t(5)));
        }),
        ("at or past its stage's next", |s| s.stages[0].next = 1),
        ("past the job's end", |s| s.stages[0].next = 99),
        ("both pending, leased or completed", |s| {
            s.stages[0].pending.push(1);
        }),
        ("at or before the watermark", |s| s.watermark = Some(0)),
        ("more leases than its limit", |s| {
            s.stages[0].next = 4;
            s.stages[0].leases.extend([(2, W1, t(1)), (3, W1, t(1))]);
        }),
    ];
    // The last lease generation restores, and a reset past it is refused, not a panic.
    let last = StateSnapshot {
        generation: u64::MAX,
        ..good.clone()
    };
    let mut state = DispatcherState::restore(config(2), last).expect("restores");
    for worker in [W1, W2] {
        state
            .apply(Command::WorkerLost { worker }, t(1))
            .expect("lost");
    }
    assert!(matches!(
        state.apply(Command::ReceiverReset, t(1)),
        Err(Error::Invariant { .. })
    ));
    assert_eq!(state.generation(), u64::MAX);
    for (what, break_it) in broken {
        let mut snapshot = good.clone();
        break_it(&mut snapshot);
        match DispatcherState::restore(config(2), snapshot) {
            Err(Error::Snapshot { reason }) => {
                assert!(reason.contains(what), "{what}: refused as {reason:?}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

/// The grants among `events`: (worker, step, records).
fn grants(events: &[Event]) -> Vec<(WorkerId, StepId, Vec<u64>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::LeaseGranted {
                worker,
                step,
                batch: GrantedBatch::Records(records),
                ..
            } => Some((*worker, *step, records.clone())),
            _ => None,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Stale leases (issue 45): a worker cut off holding `held` steps is declared lost; its
    /// steps go to another worker with the same batches, lowest first; its late messages
    /// (the report of the steps it held, a heartbeat, a lease request, a registration under
    /// its old id) are refused without changing anything, before or after the other worker
    /// completed `early` of them and the training side consumed them; the host, registered
    /// again under a new id, gets fresh steps only, never one it was revoked. Every step
    /// completes once, and the journal replays to the live state.
    #[test]
    fn a_lost_workers_late_messages_change_nothing_and_it_comes_back_with_fresh_leases(
        held in 1u32..=4,
        early in 0u32..=4,
        consume: bool,
    ) {
        let early = early.min(held) as usize;
        let config = DispatcherConfig {
            records: 60,
            batch_size: 3,
            epochs: Some(1),
            lease_duration: Duration::from_secs(10),
            max_leases_per_worker: 4,
            ..config(1)
        };
        let (old, other, new) = (W1, W2, WorkerId(3));
        let mut state = DispatcherState::new(config.clone()).expect("config");
        let mut journal = Vec::new();
        journal.extend(register(&mut state, old, S0));
        journal.extend(register(&mut state, other, S0));
        let events = state
            .apply(Command::RequestLeases { worker: old, max: held }, t(0))
            .expect("lease");
        journal.extend(events.clone());
        let first = grants(&events);
        prop_assert_eq!(first.len(), held as usize);

        let events = state.apply(Command::WorkerLost { worker: old }, t(1_000)).expect("lost");
        journal.extend(events.clone());
        let revoked: Vec<StepId> = events
            .iter()
            .filter_map(|e| match e {
                Event::LeaseRevoked { step, .. } => Some(*step),
                _ => None,
            })
            .collect();
        prop_assert_eq!(&revoked, &first.iter().map(|g| g.1).collect::<Vec<_>>());

        let late: Vec<(Command, &str)> = vec![
            (Command::CompleteSteps { worker: old, stage: S0, steps: revoked.clone() }, "report"),
            (Command::Complete { worker: old, stage: S0, step: revoked[0] }, "report of one"),
            (Command::Heartbeat { worker: old }, "heartbeat"),
            (Command::RequestLeases { worker: old, max: 4 }, "lease request"),
            (
                Command::RegisterWorker { worker: old, stage: S0, protocol_version: PROTOCOL_VERSION },
                "registration under its old id",
            ),
        ];
        let refuse_late = |state: &mut DispatcherState| -> std::result::Result<(), TestCaseError> {
            for (command, what) in &late {
                let before = state.clone();
                let err = state.apply(command.clone(), t(2_000)).expect_err(what);
                prop_assert!(err.is_rejection(), "{}: {}", what, err);
                prop_assert_eq!(&*state, &before, "{} changed the state", what);
            }
            Ok(())
        };
        refuse_late(&mut state)?;

        // The other worker gets the revoked steps first, with the same batches.
        let events = state
            .apply(Command::RequestLeases { worker: other, max: held }, t(2_000))
            .expect("lease");
        journal.extend(events.clone());
        let again = grants(&events);
        prop_assert_eq!(
            again.iter().map(|g| (g.1, g.2.clone())).collect::<Vec<_>>(),
            first.iter().map(|g| (g.1, g.2.clone())).collect::<Vec<_>>()
        );
        let (early_steps, rest) = revoked.split_at(early);
        let complete_steps = |state: &mut DispatcherState, steps: &[StepId], journal: &mut Vec<Event>| {
            if !steps.is_empty() {
                let command = Command::CompleteSteps { worker: other, stage: S0, steps: steps.to_vec() };
                journal.extend(state.apply(command, t(2_100)).expect("complete"));
            }
        };
        complete_steps(&mut state, early_steps, &mut journal);
        if consume && !early_steps.is_empty() {
            let watermark = *early_steps.last().expect("a step");
            journal.extend(state.apply(Command::Consumed { watermark }, t(2_200)).expect("consume"));
        }
        refuse_late(&mut state)?;
        complete_steps(&mut state, rest, &mut journal);
        refuse_late(&mut state)?;

        // The host comes back under a new id: the steps after the revoked ones, none of those.
        journal.extend(register(&mut state, new, S0));
        let events = state
            .apply(Command::RequestLeases { worker: new, max: 4 }, t(3_000))
            .expect("lease");
        journal.extend(events.clone());
        let fresh = grants(&events);
        prop_assert!(!fresh.is_empty());
        for (_, step, _) in &fresh {
            prop_assert!(!revoked.contains(step), "step {:?} leased again to the new id", step);
            prop_assert!(*step > *revoked.last().expect("a step"));
        }
        let mut completions: BTreeMap<StepId, Vec<WorkerId>> = BTreeMap::new();
        for event in &journal {
            if let Event::StepCompleted { worker, step, .. } = event {
                completions.entry(*step).or_default().push(*worker);
            }
        }
        for step in &revoked {
            prop_assert_eq!(completions.get(step), Some(&vec![other]), "step {:?}", step);
        }
        prop_assert_eq!(DispatcherState::replay(config, &journal).expect("replay"), state);
    }
}
