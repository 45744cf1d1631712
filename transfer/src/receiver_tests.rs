//! Tests of the receiver: the delivery rule, each answer to an offer, metrics on a fake clock,
//! the reorder-buffer property, and the blocking wrapper on real threads (which wait on the
//! wrapper's condition variables and on joins, never on sleeps).

use std::sync::Arc;
use std::thread;

use proptest::prelude::*;

use super::*;
use lode_runtime::tensor::{DType, Tensor, TensorData};

const JOB: u64 = 11;

fn msg(stage: u32, step: u64) -> StepMessage {
    StepMessage {
        job: JOB,
        stage,
        step,
        epoch: step / 100,
        records: Vec::new(),
        tensors: vec![Tensor::scalar(TensorData::Int64(vec![
            i64::from(stage) * 1_000_000 + i64::try_from(step).unwrap_or(-1),
        ]))
        .expect("scalar")],
    }
}

fn receiver(stages: &[u32], first: u64, capacity: u64, t0: Instant) -> ReceiverState {
    ReceiverState::new(
        ReceiverConfig::new(JOB, stages.iter().copied(), first, capacity),
        t0,
    )
    .expect("valid config")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_step_is_delivered_once_every_stage_is_there() {
    let t0 = Instant::now();
    let mut r = receiver(&[0, 1, 2], 0, 4, t0);
    assert_eq!(r.offer(msg(2, 0), t0), Offer::Accepted);
    assert_eq!(r.offer(msg(0, 0), t0), Offer::Accepted);
    assert_eq!(r.pop(t0), None, "stage 1 is missing");
    assert!(!r.is_ready());
    assert_eq!(r.offer(msg(1, 0), t0), Offer::Accepted);
    assert!(r.is_ready());
    let step = r.pop(t0).expect("complete");
    assert_eq!(step.step, 0);
    assert_eq!(
        step.parts.iter().map(|m| m.stage).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "parts in stage order"
    );
    assert_eq!(step.parts[1], msg(1, 0));
    assert_eq!(r.pop(t0), None);
    assert_eq!(r.next_step(), 1);
}

#[test]
fn steps_come_out_in_order_whatever_order_they_complete_in() {
    let t0 = Instant::now();
    let mut r = receiver(&[0], 5, 8, t0);
    for step in [8, 6, 7] {
        assert_eq!(r.offer(msg(0, step), t0), Offer::Accepted);
    }
    assert_eq!(r.pop(t0), None, "step 5 is missing");
    assert_eq!(r.depth(), 3);
    assert_eq!(r.offer(msg(0, 5), t0), Offer::Accepted);
    let popped: Vec<u64> = std::iter::from_fn(|| r.pop(t0)).map(|s| s.step).collect();
    assert_eq!(popped, vec![5, 6, 7, 8]);
    assert_eq!(r.depth(), 0);
}

#[test]
fn duplicates_stale_and_rejections_are_dropped_and_counted() {
    let t0 = Instant::now();
    let mut r = receiver(&[0, 1], 10, 4, t0);
    assert_eq!(r.offer(msg(0, 10), t0), Offer::Accepted);
    assert_eq!(r.offer(msg(0, 10), t0), Offer::Duplicate);
    assert_eq!(
        r.offer(msg(0, 9), t0),
        Offer::Stale,
        "before the first step"
    );
    assert_eq!(r.offer(msg(1, 10), t0), Offer::Accepted);
    assert_eq!(r.pop(t0).map(|s| s.step), Some(10));
    assert_eq!(r.offer(msg(1, 10), t0), Offer::Stale, "already delivered");
    let mut other_job = msg(0, 11);
    other_job.job = 12;
    assert_eq!(
        r.offer(other_job, t0),
        Offer::Rejected(RejectReason::WrongJob {
            expected: JOB,
            got: 12
        })
    );
    assert_eq!(
        r.offer(msg(5, 11), t0),
        Offer::Rejected(RejectReason::UnknownStage { stage: 5 })
    );
    assert_eq!(r.offer(msg(0, 11), t0), Offer::Accepted);
    let mut wrong_epoch = msg(1, 11);
    wrong_epoch.epoch = 9;
    assert_eq!(
        r.offer(wrong_epoch, t0),
        Offer::Rejected(RejectReason::EpochMismatch {
            step: 11,
            expected: 0,
            got: 9
        })
    );
    let m = r.metrics(t0);
    assert_eq!(
        (m.accepted, m.duplicates, m.stale, m.rejected, m.delivered),
        (3, 1, 2, 3, 1)
    );
    assert_eq!((m.depth, m.ready, m.buffered_messages), (1, 0, 1));
}

#[test]
fn steps_past_the_window_are_too_far_ahead_until_it_moves() {
    let t0 = Instant::now();
    let mut r = receiver(&[0, 1], 0, 2, t0);
    assert_eq!(r.offer(msg(0, 1), t0), Offer::Accepted);
    assert_eq!(r.offer(msg(0, 2), t0), Offer::TooFarAhead);
    // The next step is always inside the window: the buffer cannot deadlock.
    assert_eq!(r.offer(msg(0, 0), t0), Offer::Accepted);
    assert_eq!(r.offer(msg(1, 0), t0), Offer::Accepted);
    assert_eq!(r.depth(), 2);
    assert_eq!(r.offer(msg(1, 2), t0), Offer::TooFarAhead);
    assert_eq!(r.pop(t0).map(|s| s.step), Some(0));
    assert_eq!(r.offer(msg(1, 2), t0), Offer::Accepted);
    assert_eq!(r.offer(msg(0, 2), t0), Offer::Accepted);
    assert_eq!(r.metrics(t0).too_far_ahead, 2);
    assert_eq!(r.classify(&msg(0, u64::MAX)), Offer::TooFarAhead);
}

/// A message of `stage` for `step` whose values are `bytes` bytes of int8.
fn sized(stage: u32, step: u64, bytes: usize) -> StepMessage {
    StepMessage {
        tensors: vec![Tensor::new(vec![bytes], TensorData::Int8(vec![1; bytes])).expect("valid")],
        ..msg(stage, step)
    }
}

#[test]
fn the_window_is_bounded_in_bytes_by_the_mean_steps_size() {
    let t0 = Instant::now();
    let config = ReceiverConfig {
        capacity_bytes: 64 << 10,
        ..ReceiverConfig::new(JOB, [0, 1], 0, 1000)
    };
    let mut r = ReceiverState::new(config, t0).expect("valid config");
    assert_eq!(r.window(), INITIAL_WINDOW, "no step's size known yet");
    assert_eq!(r.classify(&sized(0, 64, 100)), Offer::TooFarAhead);
    assert_eq!(r.offer(sized(0, 63, 100), t0), Offer::Accepted);
    // Both stages' messages of 100 values: a step of two messages of (100 + 64 + 8) bytes
    // (see `decoded_size`): 65,536 / 344 = 190 steps.
    assert_eq!(decoded_size(&sized(0, 0, 100)), 172);
    assert_eq!(r.window(), 190);
    assert_eq!(r.metrics(t0).window, 190);
    assert_eq!(r.offer(sized(1, 189, 100), t0), Offer::Accepted);
    assert_eq!(r.offer(sized(1, 190, 100), t0), Offer::TooFarAhead);
    // Large messages shrink it, to MIN_WINDOW at the least; what it holds stays, and the next
    // step is always inside it.
    for step in 0..MIN_WINDOW {
        assert_eq!(r.offer(sized(0, step, 100_000), t0), Offer::Accepted);
    }
    assert_eq!(r.window(), MIN_WINDOW);
    assert_eq!(r.depth(), 10, "steps 0..8, 63 and 189");
    assert_eq!(r.offer(sized(1, 63, 100), t0), Offer::TooFarAhead);
    assert_eq!(r.offer(sized(1, 0, 100), t0), Offer::Accepted);
    assert_eq!(r.pop(t0).map(|s| s.step), Some(0));
    // Never past `capacity`, however small the steps.
    let mut small = receiver(&[0], 0, 100, t0);
    assert_eq!(small.window(), 64, "min(capacity, INITIAL_WINDOW)");
    assert_eq!(small.offer(sized(0, 0, 1), t0), Offer::Accepted);
    assert_eq!(small.window(), 100);
    assert_eq!(initial_window(16), 16);
}

#[test]
fn the_last_possible_step_is_delivered_once() {
    let t0 = Instant::now();
    let mut r = receiver(&[3], u64::MAX - 1, 5, t0);
    assert_eq!(r.offer(msg(3, u64::MAX), t0), Offer::Accepted);
    assert_eq!(r.offer(msg(3, u64::MAX - 1), t0), Offer::Accepted);
    assert_eq!(r.pop(t0).map(|s| s.step), Some(u64::MAX - 1));
    assert_eq!(r.pop(t0).map(|s| s.step), Some(u64::MAX));
    assert_eq!(r.pop(t0), None);
    assert_eq!(r.offer(msg(3, u64::MAX), t0), Offer::Stale);
}

#[test]
fn invalid_configurations_are_refused() {
    let t0 = Instant::now();
    let no_stages = ReceiverConfig::new(JOB, [], 0, 4);
    assert!(matches!(
        ReceiverState::new(no_stages, t0),
        Err(TransferError::NoStages)
    ));
    let no_room = ReceiverConfig::new(JOB, [0], 0, 0);
    assert!(matches!(
        ReceiverState::new(no_room, t0),
        Err(TransferError::ZeroCapacity)
    ));
    let mut tiny_window = ReceiverConfig::new(JOB, [0], 0, 1);
    tiny_window.rate_window = Duration::from_nanos(3);
    assert!(matches!(
        ReceiverState::new(tiny_window, t0),
        Err(TransferError::RateWindowTooShort { .. })
    ));
}

#[test]
fn waiting_times_are_from_completion_to_pop() {
    let t0 = Instant::now();
    let mut r = receiver(&[0, 1], 0, 8, t0);
    // Step 0 completes at 10 ms (its second message) and is popped at 40 ms: 30 ms.
    assert_eq!(r.offer(msg(0, 0), t0), Offer::Accepted);
    assert_eq!(r.offer(msg(1, 0), t0 + ms(10)), Offer::Accepted);
    // Step 1 completes at 20 ms and is popped at 30 ms but can only go after step 0.
    assert_eq!(r.offer(msg(0, 1), t0 + ms(20)), Offer::Accepted);
    assert_eq!(r.offer(msg(1, 1), t0 + ms(20)), Offer::Accepted);
    assert_eq!(r.pop(t0 + ms(40)).map(|s| s.step), Some(0));
    assert_eq!(r.pop(t0 + ms(50)).map(|s| s.step), Some(1));
    let m = r.metrics(t0 + ms(50));
    assert_eq!(m.max_wait, ms(30));
    assert_eq!(m.mean_wait, ms(30));
    assert_eq!(m.delivered, 2);
}

/// A step past the window is asked to wait about as long as the consumer takes to move the
/// window up to it, in whole milliseconds within [1 ms, 250 ms]; 20 ms before any step was
/// delivered.
#[test]
fn the_pause_before_a_retry_follows_the_consumers_rate() {
    let t0 = Instant::now();
    let mut r = receiver(&[0], 0, 4, t0);
    assert_eq!(r.classify(&msg(0, 9)), Offer::TooFarAhead);
    assert_eq!(
        r.retry_after(9, t0),
        MAX_RETRY_AFTER,
        "no rate measured yet"
    );
    // 2,000 steps a second for 2 s: one step every 500 µs.
    for i in 0..4000u64 {
        let at = t0 + Duration::from_micros(500 * i);
        assert_eq!(r.offer(msg(0, i), at), Offer::Accepted);
        assert!(r.pop(at).is_some());
    }
    let now = t0 + ms(2000);
    // The window is 4000..4004: step 4004 fits after 1 pop (0.5 ms, rounded up to 1 ms),
    // 4009 after 6 (3 ms), 4100 after 97 (48.5 ms, 49), 5000 after 997 (at most 250 ms).
    assert_eq!(r.retry_after(4004, now), ms(1));
    assert_eq!(r.retry_after(4009, now), ms(3));
    assert_eq!(r.retry_after(4010, now), ms(4), "3.5 ms rounded up");
    assert_eq!(r.retry_after(4100, now), ms(49));
    assert_eq!(r.retry_after(5000, now), LONGEST_RETRY_AFTER);
    assert_eq!(r.retry_after(u64::MAX, now), LONGEST_RETRY_AFTER);
    assert_eq!(LONGEST_RETRY_AFTER, ms(250));
    // A consumer that stopped: the rate decays as its window empties, the pause grows with
    // it, and once no delivery is left in the window the rate is unknown again.
    assert_eq!(
        r.retry_after(4004, now + Duration::from_secs(11)),
        MAX_RETRY_AFTER
    );
    assert_eq!(MIN_RETRY_AFTER, ms(1));
}

#[test]
fn rates_are_over_the_sliding_window() {
    let t0 = Instant::now();
    let mut config = ReceiverConfig::new(JOB, [0], 0, 1000);
    config.rate_window = Duration::from_secs(10);
    let mut r = ReceiverState::new(config, t0).expect("valid");
    assert_eq!(r.metrics(t0).enqueue_rate, 0.0);
    // 20 steps per second for 30 s, each popped 25 ms after it completes.
    for i in 0..600u64 {
        let at = t0 + ms(50 * i);
        assert_eq!(r.offer(msg(0, i), at), Offer::Accepted);
        assert!(r.pop(at + ms(25)).is_some());
    }
    let now = t0 + ms(30_000);
    let m = r.metrics(now);
    assert!((m.enqueue_rate - 20.0).abs() < 0.5, "{}", m.enqueue_rate);
    assert!((m.dequeue_rate - 20.0).abs() < 0.5, "{}", m.dequeue_rate);
    assert_eq!(m.mean_wait, ms(25));
    // Early on, the rate is over the time elapsed, not the whole window.
    let mut early = receiver(&[0], 0, 100, t0);
    for i in 0..10u64 {
        assert_eq!(early.offer(msg(0, i), t0 + ms(100 * i)), Offer::Accepted);
    }
    let rate = early.metrics(t0 + ms(1000)).enqueue_rate;
    assert!((rate - 10.0).abs() < 0.01, "{rate}");
    // Once the producers stop, the rates fall to zero within one window.
    let later = r.metrics(now + Duration::from_secs(11));
    assert_eq!((later.enqueue_rate, later.dequeue_rate), (0.0, 0.0));
}

// --- The reorder-buffer property ------------------------------------------------------------

/// Messages of `steps` steps from `stages` stages, some sent twice, in a random order, with
/// random pops interleaved: a message refused as too far ahead goes to the back of the queue
/// (a retry later). The popped steps must be exactly 0..steps in order, each once; the depth
/// never exceeds the capacity; every extra copy is counted as a duplicate or stale.
fn run_reorder_scenario(
    stages: u32,
    capacity: u64,
    mut arrivals: std::collections::VecDeque<(u32, u64)>,
    pops: &[bool],
) -> Result<(), TestCaseError> {
    let steps = arrivals.iter().map(|&(_, s)| s + 1).max().unwrap_or(0);
    let copies = len(arrivals.len());
    let t0 = Instant::now();
    let mut r = receiver(&(0..stages).collect::<Vec<_>>(), 0, capacity, t0);
    let mut popped = Vec::new();
    let mut tick = 0u64;
    let mut refused_in_a_row = 0usize;
    let mut pops = pops.iter().copied().cycle();
    while let Some((stage, step)) = arrivals.pop_front() {
        tick += 1;
        let now = t0 + ms(tick);
        match r.offer(msg(stage, step), now) {
            Offer::TooFarAhead => {
                arrivals.push_back((stage, step));
                refused_in_a_row += 1;
            }
            Offer::Rejected(reason) => prop_assert!(false, "rejected: {reason:?}"),
            Offer::Closed => prop_assert!(false, "closed, though nothing closed it"),
            Offer::Accepted | Offer::Duplicate | Offer::Stale => refused_in_a_row = 0,
        }
        prop_assert!(r.depth() <= usize::try_from(capacity).unwrap_or(usize::MAX));
        // Pop at random, and always when every queued message was refused (the consumer must
        // make room or nothing moves).
        if pops.next().unwrap_or(true) || refused_in_a_row > arrivals.len() {
            while let Some(step) = r.pop(now) {
                popped.push(step.step);
                refused_in_a_row = 0;
            }
        }
    }
    while let Some(step) = r.pop(t0 + ms(tick + 1)) {
        popped.push(step.step);
    }
    prop_assert_eq!(popped, (0..steps).collect::<Vec<_>>());
    let m = r.metrics(t0 + ms(tick + 1));
    prop_assert_eq!(m.accepted, steps * u64::from(stages));
    prop_assert_eq!(
        m.accepted + m.duplicates + m.stale,
        copies,
        "every copy that was not refused is accepted, a duplicate or stale"
    );
    prop_assert_eq!((m.depth, m.buffered_messages, m.ready), (0, 0, 0));
    Ok(())
}

fn len(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn scenario() -> impl Strategy<Value = (u32, u64, Vec<(u32, u64)>, Vec<bool>)> {
    (1u32..4, 1u64..6, 0u64..25).prop_flat_map(|(stages, capacity, steps)| {
        let all: Vec<(u32, u64)> = (0..steps)
            .flat_map(|step| (0..stages).map(move |stage| (stage, step)))
            .collect();
        let n = all.len();
        (
            Just(stages),
            Just(capacity),
            // Every message once, plus random ones again.
            (Just(all.clone()), proptest::sample::subsequence(all, 0..=n))
                .prop_map(|(mut once, again)| {
                    once.extend(again);
                    once
                })
                .prop_shuffle(),
            proptest::collection::vec(any::<bool>(), 1..16),
        )
    })
}

proptest! {
    #[test]
    fn prop_reorder_buffer_delivers_each_step_once_in_order(
        (stages, capacity, arrivals, pops) in scenario()
    ) {
        run_reorder_scenario(stages, capacity, arrivals.into(), &pops)?;
    }
}

proptest! {
    /// Stale leases (issue 45), the receiver's side: steps `first .. first + n` were leased to
    /// a worker that was then cut off and declared lost, and leased again to another. Both
    /// copies of each step reach the receiver, in any order (`old_first`: the old worker's
    /// late frame came before the new copy), with `popped` steps delivered before the late
    /// frames came. Exactly one copy of each step is taken; every other is dropped as a
    /// duplicate (its step still buffered) or as stale (already delivered), and counted; the
    /// steps come out once each, in order.
    #[test]
    fn prop_a_revoked_leases_late_frames_are_dropped_and_counted_never_delivered_twice(
        first in 0u64..50,
        n in 1u64..12,
        popped in 0u64..12,
        old_first in proptest::collection::vec(any::<bool>(), 12),
    ) {
        let t0 = Instant::now();
        let popped = popped.min(n);
        let mut r = receiver(&[0], first, 64, t0);
        let steps: Vec<u64> = (first..first + n).collect();
        let mut delivered = Vec::new();
        // The copies that came before the consumer took `popped` steps: the new worker's of
        // every step, and the old one's where it came first.
        for (i, &step) in steps.iter().enumerate() {
            let expected_second = if old_first[i] { Offer::Duplicate } else { Offer::Accepted };
            if old_first[i] {
                prop_assert_eq!(r.offer(msg(0, step), t0), Offer::Accepted);
            }
            prop_assert_eq!(r.offer(msg(0, step), t0), expected_second);
        }
        for _ in 0..popped {
            delivered.push(r.pop(t0).expect("a complete step").step);
        }
        // The old worker's late frames of the others.
        for (i, &step) in steps.iter().enumerate() {
            if !old_first[i] {
                let expected = if step < first + popped { Offer::Stale } else { Offer::Duplicate };
                prop_assert_eq!(r.offer(msg(0, step), t0), expected, "late frame of step {}", step);
            }
        }
        delivered.extend(std::iter::from_fn(|| r.pop(t0)).map(|s| s.step));
        prop_assert_eq!(&delivered, &steps);
        let m = r.metrics(t0);
        let late_after_pops = steps
            .iter()
            .enumerate()
            .filter(|&(i, &s)| !old_first[i] && s < first + popped)
            .count() as u64;
        prop_assert_eq!(m.accepted, n);
        prop_assert_eq!(m.delivered, n);
        prop_assert_eq!(m.stale, late_after_pops);
        prop_assert_eq!(m.duplicates + m.stale, n, "every second copy dropped and counted");
    }
}

// --- The blocking wrapper ---------------------------------------------------------------------

const LONG: Duration = Duration::from_secs(60);

fn shared(stages: &[u32], capacity: u64) -> Arc<SharedReceiver> {
    Arc::new(
        SharedReceiver::new(ReceiverConfig::new(
            JOB,
            stages.iter().copied(),
            0,
            capacity,
        ))
        .expect("valid config"),
    )
}

#[test]
fn try_push_and_try_pop_do_not_block() {
    let r = shared(&[0], 1);
    assert_eq!(r.try_pop(), None);
    assert_eq!(r.try_push(msg(0, 1)), Offer::TooFarAhead);
    assert_eq!(r.try_push(msg(0, 0)), Offer::Accepted);
    assert_eq!(r.try_push(msg(0, 0)), Offer::Duplicate);
    assert_eq!(r.try_pop().map(|s| s.step), Some(0));
    assert_eq!(r.next_step(), 1);
    let m = r.metrics();
    assert_eq!((m.too_far_ahead, m.duplicates, m.delivered), (1, 1, 1));
}

#[test]
fn a_recycled_step_lends_its_memory_to_the_next_of_its_shape() {
    let r = shared(&[0, 1], 4);
    assert_eq!(r.try_push(msg(0, 0)), Offer::Accepted);
    assert_eq!(r.try_push(msg(1, 0)), Offer::Accepted);
    let step = r.try_pop().expect("complete");
    r.recycle(step);
    // Two int64 scalars' memory, taken again by reads of that dtype only.
    assert_eq!(r.pool().bytes(), 16);
    assert!(matches!(r.pool().take(DType::Int64, 1), TensorData::Int64(v) if v.len() == 1));
    assert_eq!(r.pool().bytes(), 8);
    assert_eq!(
        r.pool().take(DType::Float32, 1),
        TensorData::zeros(DType::Float32, 1)
    );
    assert_eq!(r.pool().bytes(), 8);
}

#[test]
fn a_blocked_push_goes_through_once_the_consumer_makes_room() {
    let r = shared(&[0], 1);
    assert_eq!(r.try_push(msg(0, 0)), Offer::Accepted);
    let pusher = {
        let r = Arc::clone(&r);
        // Step 1 is outside the one-step window until step 0 is popped.
        thread::spawn(move || r.push(msg(0, 1), LONG))
    };
    assert_eq!(r.pop(LONG).map(|s| s.step), Some(0));
    assert_eq!(pusher.join().expect("pusher"), Offer::Accepted);
    assert_eq!(r.pop(LONG).map(|s| s.step), Some(1));
}

#[test]
fn a_blocked_pop_returns_once_the_step_is_complete() {
    let r = shared(&[0, 1], 4);
    let popper = {
        let r = Arc::clone(&r);
        thread::spawn(move || r.pop(LONG))
    };
    assert_eq!(r.push(msg(1, 0), LONG), Offer::Accepted);
    assert_eq!(r.push(msg(0, 0), LONG), Offer::Accepted);
    let step = popper.join().expect("popper").expect("a step");
    assert_eq!((step.step, step.parts.len()), (0, 2));
}

/// Waits until `waiters` counts one thread waiting.
fn until_waiting(waiters: &AtomicUsize) {
    while waiters.load(Ordering::Relaxed) == 0 {
        thread::yield_now();
    }
}

/// A pop on its own thread, waiting (counted) with no timeout: its step comes on the channel.
fn waiting_pop(r: &Arc<SharedReceiver>) -> std::sync::mpsc::Receiver<Option<u64>> {
    let (popped, pops) = std::sync::mpsc::channel();
    let waiting = Arc::clone(r);
    thread::spawn(move || popped.send(waiting.pop(Duration::MAX).map(|s| s.step)));
    until_waiting(&r.poppers_waiting);
    pops
}

/// A push or a pop signals only when its waiter count is not zero: one that is counted while
/// it waits (with no timeout to rescue it) is woken by the call that lets it go on.
#[test]
fn counted_waiters_are_woken_without_a_timeout() {
    let r = shared(&[0], 1);
    let pops = waiting_pop(&r);
    assert_eq!(r.try_push(msg(0, 0)), Offer::Accepted);
    assert_eq!(pops.recv_timeout(LONG).expect("the pop was woken"), Some(0));
    assert_eq!(r.poppers_waiting.load(Ordering::Relaxed), 0);

    // Step 2 is outside the one-step window until step 1 is popped.
    assert_eq!(r.try_push(msg(0, 1)), Offer::Accepted);
    let (pushed, pushes) = std::sync::mpsc::channel();
    {
        let r = Arc::clone(&r);
        thread::spawn(move || pushed.send(r.push(msg(0, 2), Duration::MAX)));
    }
    until_waiting(&r.pushers_waiting);
    assert_eq!(r.try_pop().map(|s| s.step), Some(1));
    assert_eq!(
        pushes.recv_timeout(LONG).expect("the push was woken"),
        Offer::Accepted
    );
    assert_eq!(r.pushers_waiting.load(Ordering::Relaxed), 0);
    assert_eq!(r.try_pop().map(|s| s.step), Some(2));
}

#[test]
fn timeouts_give_up_with_the_current_answer() {
    let r = shared(&[0], 1);
    assert_eq!(r.push(msg(0, 3), ms(1)), Offer::TooFarAhead);
    assert_eq!(r.pop(ms(1)), None);
}

/// Three stage threads send 300 steps, each in its own order within the window, through a
/// four-step buffer; one consumer thread pops them. Backpressure keeps the depth bounded, and
/// the consumer sees every step once, in order.
#[test]
fn producers_and_a_consumer_on_threads_deliver_every_step_in_order() {
    const STEPS: u64 = 300;
    const CAPACITY: u64 = 4;
    let r = shared(&[0, 1, 2], CAPACITY);
    let producers: Vec<_> = (0..3u32)
        .map(|stage| {
            let r = Arc::clone(&r);
            thread::spawn(move || {
                let mut answers = Vec::new();
                for chunk in (0..STEPS).collect::<Vec<_>>().chunks(4) {
                    // Stage 0 ascending, stage 1 descending within the window, stage 2 sends
                    // every message twice.
                    let order: Vec<u64> = match stage {
                        1 => chunk.iter().rev().copied().collect(),
                        _ => chunk.to_vec(),
                    };
                    for step in order {
                        answers.push(r.push(msg(stage, step), LONG));
                        if stage == 2 {
                            answers.push(r.push(msg(stage, step), LONG));
                        }
                    }
                }
                answers
            })
        })
        .collect();
    let consumer = {
        let r = Arc::clone(&r);
        thread::spawn(move || {
            let mut steps = Vec::new();
            let mut max_depth = 0;
            while let Some(step) = r.pop(LONG) {
                max_depth = max_depth.max(r.metrics().depth);
                steps.push(step.step);
                if step.step + 1 == STEPS {
                    break;
                }
            }
            (steps, max_depth)
        })
    };
    for (stage, producer) in producers.into_iter().enumerate() {
        let answers = producer.join().expect("producer");
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Offer::Accepted | Offer::Duplicate | Offer::Stale)),
            "stage {stage}: {answers:?}"
        );
    }
    let (steps, max_depth) = consumer.join().expect("consumer");
    assert_eq!(steps, (0..STEPS).collect::<Vec<_>>());
    assert!(max_depth <= 4, "{max_depth}");
    let m = r.metrics();
    assert_eq!(m.accepted, 3 * STEPS);
    assert_eq!(m.duplicates + m.stale, STEPS, "stage 2's second copies");
    assert_eq!((m.depth, m.delivered), (0, STEPS));
}

#[test]
fn a_closed_receiver_takes_nothing_and_a_waiting_push_is_told_at_once() {
    let t0 = Instant::now();
    let mut r = receiver(&[0], 0, 2, t0);
    assert_eq!(r.offer(msg(0, 0), t0), Offer::Accepted);
    r.close();
    for step in [0, 1, 5] {
        assert_eq!(r.offer(msg(0, step), t0), Offer::Closed, "step {step}");
    }
    assert_eq!(r.metrics(t0).accepted, 1);

    let shared = Arc::new(SharedReceiver::new(ReceiverConfig::new(JOB, [0], 0, 1)).expect("valid"));
    let waiting = {
        let shared = shared.clone();
        // Beyond the window: it waits for room (for up to an hour) until the close.
        thread::spawn(move || shared.push(msg(0, 3), Duration::from_secs(3600)))
    };
    while shared.metrics().too_far_ahead == 0 {
        thread::yield_now();
    }
    shared.close();
    assert_eq!(waiting.join().expect("joined"), Offer::Closed);
}

/// A batch is offered in order as single offers would be, under one lock: a waiting pop is
/// woken by it, and the offers stop after the first rejection (the sender's connection ends
/// there), leaving the messages after it unoffered.
#[test]
fn a_batch_is_offered_in_order_and_stops_after_a_rejection() {
    let r = shared(&[0], 2);
    let pops = waiting_pop(&r);
    let mut other_job = msg(0, 1);
    other_job.job = JOB + 1;
    let offers = r.try_push_all([msg(0, 0), msg(0, 0), msg(0, 5), other_job, msg(0, 1)]);
    assert_eq!(
        offers,
        vec![
            Offer::Accepted,
            Offer::Duplicate,
            Offer::TooFarAhead,
            Offer::Rejected(RejectReason::WrongJob {
                expected: JOB,
                got: JOB + 1
            }),
        ]
    );
    assert_eq!(pops.recv_timeout(LONG).expect("the pop was woken"), Some(0));
    assert_eq!(
        r.try_pop(),
        None,
        "step 1 came after the rejection: not offered"
    );
    let m = r.metrics();
    assert_eq!(
        (m.duplicates, m.too_far_ahead, m.rejected, m.delivered),
        (1, 1, 1, 1)
    );
    assert_eq!(r.try_push_all([msg(0, 1)]), vec![Offer::Accepted]);
    r.close();
    assert_eq!(
        r.try_push_all([msg(0, 2), msg(0, 3)]),
        vec![Offer::Closed],
        "nothing after a closed answer"
    );
    assert_eq!(r.try_push_all(Vec::new()), Vec::new());
}
