//! The worker state machine's tests: leases within the limit, batches and paced reports,
//! bursts, parking on a full receiver, revocation, expiry; and the property test over random
//! commands.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn step(global: u64, expires: Instant) -> HeldStep {
    HeldStep {
        epoch: 0,
        step: global,
        global,
        records: vec![global],
        expires,
        deadline_ms: global,
        generation: 0,
    }
}

/// A worker of limit 32 with 125 µs steps (bursts of 8) and a 1 s round trip, holding
/// steps 0..32.
fn holding_32(t0: Instant) -> WorkerState {
    let mut w = WorkerState::new(32);
    w.step_time = Some(1.25e-4);
    w.round_trip = Some(1.0);
    w.leased(
        (0..32)
            .map(|g| step(g, t0 + Duration::from_secs(10)))
            .collect(),
        Duration::from_secs(1),
    );
    w
}

/// Runs queued steps (125 µs each) until the burst takes no more.
fn run_burst(w: &mut WorkerState, now: Instant) {
    while w.next_step(now).is_some() {
        w.computed(Duration::from_micros(125));
    }
}

#[test]
fn the_burst_holds_two_milliseconds_of_short_steps_and_one_long_one() {
    let mut w = WorkerState::new(1024);
    assert_eq!(w.burst_size(), 1, "no step measured yet");
    for (step_us, burst) in [
        (300, 6),
        (100, 20),
        (50, MAX_BURST),
        (1, MAX_BURST),
        (999, 2),
        (1_999, 1),
        (5_000, 1),
    ] {
        w.step_time = Some(Duration::from_micros(step_us).as_secs_f64());
        assert_eq!(w.burst_size(), burst, "steps of {step_us} µs");
    }
    // A quarter of the lease limit at most: the worker's share of the receiver's window.
    w.step_time = Some(Duration::from_micros(50).as_secs_f64());
    for (limit, burst) in [(64, 16), (32, 8), (4, 1), (1, 1)] {
        w.set_max_leases(limit);
        assert_eq!(w.burst_size(), burst, "a limit of {limit}");
    }
}

/// Short steps are run back to back and go out together; the next burst runs while
/// their answers are awaited, and the answers are taken in the order sent.
#[test]
fn short_steps_go_out_in_bursts_answered_in_order() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let mut w = WorkerState::new(32);
    w.leased(
        (0..5).map(|g| step(g, far)).collect(),
        Duration::from_millis(1),
    );
    let first = w.next_step(t0).expect("step 0");
    w.computed(Duration::from_micros(500));
    assert_eq!(first.global, 0);
    assert_eq!(w.burst_size(), 4, "2 ms of 500 µs steps");
    assert!(!w.burst_due(t0), "room left and steps queued");
    for g in 1..4 {
        assert_eq!(w.next_step(t0).map(|s| s.global), Some(g));
        w.computed(Duration::from_micros(500));
    }
    assert_eq!(w.next_step(t0), None, "the burst is full");
    assert!(w.burst_due(t0));
    assert!(w.may_push(t0));
    w.sent();
    assert_eq!(w.in_flight().collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(w.burst().count(), 0);
    // The next burst runs while the answers are awaited; with nothing more queued it is
    // due at once.
    assert_eq!(w.next_step(t0).map(|s| s.global), Some(4));
    w.computed(Duration::from_micros(500));
    assert!(w.burst_due(t0), "nothing more may join it now");
    w.sent();
    assert_eq!(
        w.burst().collect::<Vec<_>>(),
        [4],
        "one burst's answers at a time"
    );
    for g in 0..4 {
        let answer = if g == 2 {
            PushAnswer::Retry(Duration::from_millis(5))
        } else {
            PushAnswer::Taken
        };
        w.pushed(answer, t0);
        assert_eq!(w.in_flight().next(), (g < 3).then_some(g + 1));
    }
    assert!(w.is_parked(2));
    assert_eq!(
        w.delivered.iter().map(|d| d.global).collect::<Vec<_>>(),
        [0, 1, 3]
    );
    assert_eq!(w.outstanding(), 5, "3 delivered, 1 parked, 1 in the burst");
}

/// The dispatcher lowers the limit when another worker joins: what is held stays, the
/// batches shrink, and nothing is leased until the worker holds less.
#[test]
fn a_lower_lease_limit_holds_back_leases_until_the_worker_holds_less() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let mut w = WorkerState::new(64);
    w.step_time = Some(1e-4);
    w.round_trip = Some(1.0);
    assert_eq!(w.batch_size(), 32);
    assert_eq!(w.next_lease(t0), Some(32));
    w.leased(
        (0..32).map(|g| step(g, far)).collect(),
        Duration::from_millis(1),
    );
    w.set_max_leases(16);
    assert_eq!(w.batch_size(), 8);
    assert_eq!(w.next_lease(t0), None, "32 held, 16 allowed");
    assert_eq!(w.outstanding(), 32, "what was leased stays");
    w.set_max_leases(48);
    assert_eq!(
        w.next_lease(t0),
        None,
        "room for 16, but 32 queued is enough work"
    );
    w.set_max_leases(1024);
    assert_eq!(w.batch_size(), MAX_BATCH);
    assert_eq!(
        w.next_lease(t0),
        Some(MAX_BATCH),
        "the largest batches again"
    );
}

/// Steps waiting for company in a report count against the lease limit: when they keep
/// the next batch from being leased, the report goes out at once.
#[test]
fn a_report_goes_out_early_when_its_steps_keep_the_next_batch_from_being_leased() {
    let t0 = Instant::now();
    let mut w = holding_32(t0);
    assert_eq!(w.batch_size(), 16);
    let burst = |w: &mut WorkerState| {
        run_burst(w, t0);
        assert!(w.burst_due(t0));
    };
    burst(&mut w);
    w.sent();
    burst(&mut w);
    for _ in 0..8 {
        assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
    }
    assert_eq!(
        w.next_report(t0),
        None,
        "8 of 16 delivered, 16 queued: wait"
    );
    w.sent();
    burst(&mut w);
    assert_eq!((w.queued.len(), w.outstanding()), (8, 32));
    assert_eq!(
        w.next_report(t0).map(|r| r.len()),
        Some(8),
        "8 queued and no room to lease: report now"
    );
}

/// Delivered steps ride with the next lease as its report: they do not hold the lease
/// back, and no report of its own goes out for them.
#[test]
fn delivered_steps_ride_with_the_next_lease() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let mut w = holding_32(t0);
    run_burst(&mut w, t0);
    w.sent();
    run_burst(&mut w, t0);
    for _ in 0..8 {
        assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
    }
    w.sent();
    run_burst(&mut w, t0);
    for _ in 0..8 {
        assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
    }
    assert_eq!((w.queued.len(), w.outstanding()), (8, 32));
    assert_eq!(w.next_lease(t0), None, "no room while they count");
    let (max, report) = w
        .next_lease_carrying(t0)
        .expect("room once they are reported");
    assert_eq!(max, 16);
    assert_eq!(
        report.iter().map(|d| d.global).collect::<Vec<_>>(),
        (0..16).collect::<Vec<_>>()
    );
    assert!(w.is_reporting());
    assert_eq!(w.next_report(t0), None, "the report is on its way");
    w.reported();
    w.leased(
        (32..48).map(|g| step(g, far)).collect(),
        Duration::from_millis(1),
    );
    assert_eq!(w.outstanding(), 32, "16 reported, 16 leased");
    // With a report in flight, a lease carries nothing.
    let mut v = WorkerState::new(32);
    v.leased(vec![step(0, far)], Duration::from_millis(1));
    assert_eq!(v.next_step(t0).map(|s| s.global), Some(0));
    v.computed(Duration::from_micros(100));
    v.sent();
    assert_eq!(v.pushed(PushAnswer::Taken, t0), PushNext::Done);
    assert_eq!(v.take_report().map(|r| r.len()), Some(1));
    assert_eq!(v.next_lease_carrying(t0), Some((16, Vec::new())));
}

#[test]
fn an_expired_lease_leaves_its_burst_and_the_rest_goes_out() {
    let t0 = Instant::now();
    let mut w = WorkerState::new(32);
    w.step_time = Some(1e-4);
    w.leased(
        vec![
            step(0, t0 + Duration::from_secs(10)),
            step(1, t0 + Duration::from_millis(5)),
            step(2, t0 + Duration::from_secs(10)),
        ],
        Duration::from_millis(1),
    );
    for _ in 0..3 {
        w.next_step(t0).expect("a step");
    }
    let late = t0 + Duration::from_millis(6);
    assert!(w.may_push(late));
    assert_eq!(w.burst().collect::<Vec<_>>(), [0, 2]);
    assert_eq!(w.abandoned(), 1);
    w.sent();
    // The connection is lost; by the time it is back, step 2's lease ended too.
    let mut w2 = w.clone();
    w2.pushing[1].0.expires = late;
    assert!(w2.may_resend(late + Duration::from_millis(1)));
    assert_eq!(w2.in_flight().collect::<Vec<_>>(), [0]);
    w.pushing.iter_mut().for_each(|(s, _)| s.expires = late);
    assert!(!w.may_resend(late), "nothing left to send again");
    assert!(!w.awaits_answer());
    assert_eq!(w.abandoned(), 3);
}

#[test]
fn k_grows_with_the_round_trip_over_the_step_time() {
    let t0 = Instant::now();
    let mut w = WorkerState::new(64);
    assert_eq!(w.batch_size(), 1, "nothing measured yet");
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(
        vec![step(0, t0 + Duration::from_secs(10))],
        Duration::from_millis(1),
    );
    let s = w.next_step(t0).expect("a step");
    assert_eq!(s.global, 0);
    w.computed(Duration::from_micros(500));
    // 1 ms round trip over 0.5 ms steps at a 5% share: 40 steps.
    assert_eq!(w.batch_size(), 32, "capped at half the limit");
    let mut w = WorkerState::new(256);
    w.round_trip = Some(0.001);
    w.step_time = Some(0.0005);
    assert_eq!(w.batch_size(), 40);
    w.step_time = Some(1.0);
    assert_eq!(w.batch_size(), 1, "long steps: one at a time");
}

#[test]
fn an_expired_lease_is_neither_run_nor_pushed() {
    let t0 = Instant::now();
    let mut w = WorkerState::new(4);
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(
        vec![
            step(0, t0 + Duration::from_millis(5)),
            step(1, t0 + Duration::from_millis(50)),
        ],
        Duration::from_millis(1),
    );
    let later = t0 + Duration::from_millis(10);
    let s = w.next_step(later).expect("the live one");
    assert_eq!(s.global, 1, "step 0 expired while queued");
    assert!(!w.may_push(t0 + Duration::from_millis(60)));
    assert_eq!(w.next_report(later), None);
    assert_eq!(w.abandoned(), 2);
    assert_eq!(w.outstanding(), 0);
}

/// The job ended (heartbeat or lease answer): held and running steps are void, and the
/// worker finishes at once, without waiting to report the delivered one.
#[test]
fn the_job_ending_voids_what_is_held_and_the_worker_finishes_after_its_report() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let mut w = WorkerState::new(4);
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(
        vec![step(0, far), step(1, far), step(2, far)],
        Duration::from_millis(1),
    );
    w.next_step(t0).expect("step 0");
    w.computed(Duration::from_micros(100));
    w.sent();
    w.pushed(PushAnswer::Taken, t0);
    w.next_step(t0).expect("step 1 runs");
    w.job_ended();
    assert_eq!(w.abandoned(), 2, "step 1 (running) and step 2 (queued)");
    assert_eq!(w.next_step(t0), None);
    assert_eq!(w.next_lease(t0), None, "nothing more is leased");
    assert_eq!(
        w.finished(),
        Some(End::EndOfData),
        "step 0's report is moot: the dispatcher may be gone"
    );
}

#[test]
fn delivered_steps_wait_for_company_until_a_batch_or_the_delay() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let mut w = WorkerState::new(32);
    w.round_trip = Some(0.001);
    w.step_time = Some(0.0001);
    assert_eq!(w.batch_size(), 16);
    assert_eq!(w.next_lease(t0), Some(16));
    w.leased(
        (0..16).map(|g| step(g, far)).collect(),
        Duration::from_millis(1),
    );
    let deliver = |w: &mut WorkerState, at: Instant| {
        w.next_step(at).expect("a queued step");
        w.computed(Duration::from_micros(100));
        w.sent();
        assert_eq!(w.pushed(PushAnswer::Taken, at), PushNext::Done);
    };
    for _ in 0..3 {
        deliver(&mut w, t0);
    }
    assert_eq!(w.next_report(t0), None, "3 of 16, with work queued: wait");
    let delay = w.report_delay();
    assert!(
        delay > Duration::from_micros(3190) && delay < Duration::from_micros(3210),
        "two batches' time, 2 × 16 × 100 µs: {delay:?}"
    );
    assert_eq!(w.wakeup(), Some(t0 + delay), "the delay's end is a wakeup");
    assert_eq!(w.next_report(t0 + delay / 2), None, "not due yet");
    let report = w.next_report(t0 + delay).expect("due after the delay");
    assert_eq!(
        report.iter().map(|d| d.global).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    w.reported();
    let t1 = t0 + delay;
    for _ in 0..12 {
        deliver(&mut w, t1);
    }
    assert_eq!(w.next_report(t1), None, "12 of 16, one step still queued");
    deliver(&mut w, t1);
    let report = w
        .next_report(t1)
        .expect("nothing queued or running: at once");
    assert_eq!(report.len(), 13);
    w.reported();
    // A whole batch goes at once, with work still queued.
    assert_eq!(w.next_lease(t1), Some(16));
    w.leased(
        (16..32).map(|g| step(g, far)).collect(),
        Duration::from_millis(1),
    );
    deliver(&mut w, t1);
    assert_eq!(
        w.next_lease(t1),
        Some(16),
        "15 queued: lease the next batch"
    );
    w.leased(
        (32..48).map(|g| step(g, far)).collect(),
        Duration::from_millis(1),
    );
    for _ in 0..14 {
        deliver(&mut w, t1);
    }
    assert_eq!(
        w.next_report(t1),
        None,
        "17 queued: holding 15 blocks no lease"
    );
    deliver(&mut w, t1);
    assert_eq!(
        w.next_report(t1),
        None,
        "a batch's worth waits for the next lease request"
    );
    deliver(&mut w, t1);
    let (max, report) = w
        .next_lease_carrying(t1)
        .expect("15 queued: the next batch is leased");
    assert_eq!(
        (max, report.len()),
        (16, 17),
        "the request carries the delivered steps"
    );
}

#[test]
fn a_report_holds_at_most_the_dispatchers_limit_per_request() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let mut w = WorkerState::new(4096);
    let n = MAX_REPORT + 10;
    w.leased(
        (0..u64::try_from(n).expect("small"))
            .map(|g| step(g, far))
            .collect(),
        Duration::from_millis(1),
    );
    for _ in 0..n {
        w.next_step(t0).expect("a queued step");
        w.computed(Duration::from_micros(10));
        w.sent();
        assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
    }
    let first = w.take_report().expect("a report");
    assert_eq!(first.len(), MAX_REPORT);
    assert_eq!(first[0].global, 0);
    w.reported();
    let rest = w.next_report(t0).expect("the rest, due at once");
    assert_eq!(rest.len(), 10);
    assert_eq!(rest[0].global, u64::try_from(MAX_REPORT).expect("small"));
}

#[test]
fn two_batches_worth_of_delivered_steps_go_out_without_waiting_for_a_lease() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let k = usize::try_from(MAX_BATCH).expect("small");
    let mut w = WorkerState::new(4 * MAX_BATCH);
    w.round_trip = Some(1.0);
    // 50 µs steps: the hold horizon (150 ms, 3,000 steps) is past the limit.
    w.step_time = Some(0.00005);
    assert_eq!(w.batch_size(), MAX_BATCH);
    // More than two batches held, with room for another under the limit.
    let held = u64::try_from(2 * k + 88).expect("small");
    w.leased(
        (0..held).map(|g| step(g, far)).collect(),
        Duration::from_millis(1),
    );
    for delivered in 1..=2 * k {
        w.next_step(t0).expect("a queued step");
        w.computed(Duration::from_micros(50));
        w.sent();
        assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
        if delivered < 2 * k {
            assert_eq!(w.next_report(t0), None, "{delivered} delivered");
        }
    }
    assert_eq!(
        w.next_report(t0).map(|r| r.len()),
        Some(2 * k),
        "two batches' worth, 88 steps still queued"
    );
}

#[test]
fn the_next_step_runs_while_the_receiver_answers_the_one_before() {
    let t0 = Instant::now();
    let mut w = WorkerState::new(8);
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(
        vec![
            step(0, t0 + Duration::from_secs(10)),
            step(1, t0 + Duration::from_secs(10)),
            step(2, t0 + Duration::from_millis(20)),
        ],
        Duration::from_millis(1),
    );
    w.next_step(t0).expect("step 0");
    w.computed(Duration::from_micros(40));
    assert!(w.may_push(t0));
    w.sent();
    assert!(w.awaits_answer());
    let s = w
        .next_step(t0)
        .expect("step 1 runs while step 0's answer is awaited");
    assert_eq!(s.global, 1);
    assert_eq!(w.outstanding(), 3, "step 0 still counts until its answer");
    w.sent();
    assert!(
        w.may_push(t0),
        "step 1 stays running: one answer is awaited at a time"
    );
    let pause = Duration::from_millis(5);
    assert_eq!(w.pushed(PushAnswer::Retry(pause), t0), PushNext::Parked);
    assert!(!w.awaits_answer() && w.is_parked(0));
    assert_eq!(w.outstanding(), 3, "a parked step still counts");
    assert_eq!(w.wakeup(), Some(t0 + pause), "its pause ends first");
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
    assert_eq!(w.next_report(t0), None, "1 of k = 4, step 2 queued");
    let s = w
        .next_step(t0 + pause)
        .expect("step 0 again, before step 2");
    assert_eq!(s.global, 0);
    assert!(
        !w.is_parked(0),
        "it comes back computed: the shell sends its frame"
    );
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Taken, t0 + pause), PushNext::Done);
    let report = w
        .next_report(t0 + pause)
        .expect("due: step 1 has waited longer than the delay");
    assert_eq!(report.iter().map(|d| d.global).collect::<Vec<_>>(), [1, 0]);
    assert_eq!(report[1].compute_us, 40, "step 0's compute, measured once");
    // A step whose lease ends while its answer is awaited is not sent again.
    w.next_step(t0).expect("step 2");
    w.sent();
    assert!(!w.may_resend(t0 + Duration::from_millis(30)));
    assert!(!w.awaits_answer());
    assert_eq!(w.abandoned(), 1);
}

/// The hang this rule removes: a worker waiting on `RETRY` for step 77 while it holds
/// step 60, the one the receiver waits for (returned after a rewind or a lost worker).
#[test]
fn a_step_the_receiver_cannot_take_yet_holds_up_none_of_the_others() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let pause = Duration::from_millis(20);
    let mut w = WorkerState::new(8);
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(
        vec![step(77, far), step(78, t0 + Duration::from_millis(30))],
        Duration::from_millis(1),
    );
    assert_eq!(w.next_step(t0).map(|s| s.global), Some(77));
    w.computed(Duration::from_micros(40));
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Retry(pause), t0), PushNext::Parked);
    assert!(w.next_lease(t0).is_some());
    w.leased(vec![step(60, far)], Duration::from_millis(1));
    assert_eq!(
        w.next_step(t0).map(|s| s.global),
        Some(60),
        "the returned step runs first, though leased last"
    );
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
    assert_eq!(
        w.next_step(t0).map(|s| s.global),
        Some(78),
        "77 still waits"
    );
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Retry(pause), t0), PushNext::Parked);
    assert_eq!(w.next_step(t0), None, "both wait for their pause");
    assert!(w.wakeup().is_some_and(|t| t <= t0 + pause));
    assert_eq!(w.next_step(t0 + pause).map(|s| s.global), Some(77));
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Taken, t0 + pause), PushNext::Done);
    // 78's lease ends before it could be sent again: dropped, never sent.
    assert_eq!(w.next_step(t0 + Duration::from_millis(40)), None);
    assert!(!w.is_parked(78));
    assert_eq!(w.abandoned(), 1);
    assert_eq!(w.outstanding(), 2, "60 and 77 delivered, to be reported");
}

#[test]
fn a_fresh_step_comes_with_its_records_and_a_parked_one_without() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let mut w = WorkerState::new(8);
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(vec![step(5, far)], Duration::from_millis(1));
    let fresh = w.next_step(t0).expect("queued");
    assert_eq!(fresh.records, vec![5], "the stage reads them");
    w.computed(Duration::from_micros(40));
    w.sent();
    let pause = Duration::from_millis(20);
    assert_eq!(w.pushed(PushAnswer::Retry(pause), t0), PushNext::Parked);
    let back = w.next_step(t0 + pause).expect("its pause ended");
    assert_eq!(back.global, 5);
    assert!(
        back.records.is_empty(),
        "sent again from its kept frame, never run again: {:?}",
        back.records
    );
}

/// A burst answered `RETRY` past the receiver's window: the next burst's steps above a
/// waiting step are parked unsent, each until the latest pause below it ends; a lower step
/// (the one the receiver may wait for) still goes out.
#[test]
fn steps_past_a_refused_one_wait_unsent() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut w = holding_32(t0);
    run_burst(&mut w, t0);
    assert!(w.burst().eq(0..8));
    assert!(w.may_push(t0));
    assert!(w.hold_back(t0).is_empty(), "nothing parked yet");
    w.sent();
    run_burst(&mut w, t0);
    assert!(w.burst().eq(8..16));
    for (answer, next) in [
        (PushAnswer::Taken, PushNext::Done),
        (PushAnswer::Taken, PushNext::Done),
        (PushAnswer::Retry(ms(1)), PushNext::Parked),
        (PushAnswer::Retry(ms(2)), PushNext::Parked),
        (PushAnswer::Taken, PushNext::Done),
        (PushAnswer::Retry(ms(3)), PushNext::Parked),
        (PushAnswer::Retry(ms(3)), PushNext::Parked),
        (PushAnswer::Retry(ms(4)), PushNext::Parked),
    ] {
        assert_eq!(w.pushed(answer, t0), next);
    }
    // Steps 2, 3, 5, 6 and 7 wait; the burst 8..16 is above all of them.
    let held = w.hold_back(t0);
    assert_eq!(held, (8..16).collect::<Vec<_>>());
    assert!(held.iter().all(|&g| w.is_parked(g)));
    assert_eq!(w.burst().count(), 0, "nothing left to send");
    assert_eq!(
        w.outstanding(),
        32,
        "3 delivered, 13 parked, 16 queued: all still held"
    );
    // At 1 ms step 2's pause ended; 3's has not: a burst above 3 waits for the latest
    // pause below each of its steps, one below 3 goes.
    let now = t0 + ms(1);
    assert_eq!(w.next_step(now).map(|s| s.global), Some(2));
    assert!(w.may_push(now));
    assert!(w.hold_back(now).is_empty(), "2 is below every waiting step");
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Taken, now), PushNext::Done);
    assert_eq!(
        w.next_step(now).map(|s| s.global),
        Some(16),
        "the queue's lowest"
    );
    w.computed(Duration::from_micros(125));
    assert!(w.may_push(now));
    assert_eq!(w.hold_back(now), [16]);
    assert_eq!(
        w.parked[&16].not_before,
        t0 + ms(4),
        "until 7's pause, the latest below it"
    );
    // Once every pause ended, the parked steps come back lowest first.
    let later = t0 + ms(4);
    let mut order = Vec::new();
    while let Some(s) = w.next_step(later) {
        order.push(s.global);
        w.computed(Duration::from_micros(125));
    }
    assert_eq!(order, [3, 5, 6, 7, 8, 9, 10, 11]);
    assert!(w.hold_back(later).is_empty(), "no pause is running");
}

/// A receiver registered (or the training side rewound): every lease was revoked. The
/// worker drops its queued and parked steps of the older generation, which frees its lease
/// limit for the steps the new receiver waits for; the step being sent finishes.
#[test]
fn steps_of_an_older_lease_generation_are_dropped_and_free_the_limit() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(600);
    let mut w = WorkerState::new(3);
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(
        vec![step(70, far), step(71, far), step(72, far)],
        Duration::from_millis(1),
    );
    w.next_step(t0).expect("70");
    w.computed(Duration::from_micros(40));
    w.sent();
    w.next_step(t0)
        .expect("71 runs while 70's answer is awaited");
    assert_eq!(
        w.pushed(PushAnswer::Retry(Duration::from_millis(20)), t0),
        PushNext::Parked
    );
    assert_eq!(w.outstanding(), 3);
    assert_eq!(w.next_lease(t0), None, "the limit is full");
    w.void_before(1);
    assert!(
        !w.is_parked(70) && w.queued.is_empty(),
        "70 (parked) and 72 (queued) dropped"
    );
    assert_eq!(w.abandoned(), 2);
    assert_eq!(w.outstanding(), 1, "71, being computed, finishes");
    assert!(w.may_push(t0));
    assert_eq!(w.next_lease(t0), Some(1), "room again");
    let mut fresh = step(60, far);
    fresh.generation = 1;
    w.leased(vec![fresh], Duration::from_millis(1));
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
    assert_eq!(w.next_step(t0).map(|s| s.global), Some(60));
    // A lease answer of a newer generation voids the older steps by itself too.
    let mut w = WorkerState::new(4);
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(vec![step(80, far)], Duration::from_millis(1));
    let mut newer = step(60, far);
    newer.generation = 2;
    w.leased(vec![newer], Duration::from_millis(1));
    assert_eq!(w.queued.iter().map(|q| q.global).collect::<Vec<_>>(), [60]);
    // A grant of an older generation answered late (the heartbeat told the newer one
    // first) is void on arrival; a re-grant of a held step from then does not demote it.
    let mut stale = step(61, far);
    stale.generation = 1;
    let mut old_copy = step(60, far);
    old_copy.generation = 1;
    w.leased(vec![stale, old_copy], Duration::from_millis(1));
    assert_eq!(w.queued.iter().map(|q| q.global).collect::<Vec<_>>(), [60]);
    assert_eq!(w.queued[0].generation, 2);
    assert_eq!(w.abandoned(), 3, "80, then 61 and the old copy of 60");
    w.void_before(2);
    assert_eq!(w.queued.len(), 1, "nothing below 2 is held");
}

/// Queued steps are searched for expired ones from the earliest expiry on, not before:
/// a later grant with an earlier expiry still counts.
#[test]
fn a_queued_step_expires_at_its_own_deadline_whatever_was_leased_before() {
    let t0 = Instant::now();
    let mut w = WorkerState::new(8);
    w.leased(
        vec![step(5, t0 + Duration::from_secs(10))],
        Duration::from_millis(1),
    );
    let soon = t0 + Duration::from_millis(5);
    w.leased(vec![step(1, soon)], Duration::from_millis(1));
    assert_eq!(w.next_step(soon).map(|s| s.global), Some(5), "1 expired");
    assert_eq!(w.abandoned(), 1);
}

#[test]
fn a_draining_worker_finishes_what_it_holds_then_asks_once_and_ends() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let mut w = WorkerState::new(3);
    assert_eq!(w.next_lease(t0), Some(1));
    w.leased(vec![step(0, far)], Duration::from_millis(1));
    w.set_draining(true);
    let s = w.next_step(t0).expect("held step runs");
    assert_eq!(s.global, 0);
    assert_eq!(w.next_lease(t0), None, "nothing new while it holds a step");
    w.computed(Duration::from_millis(1));
    assert!(w.may_push(t0));
    w.sent();
    assert_eq!(w.pushed(PushAnswer::Taken, t0), PushNext::Done);
    assert_eq!(w.next_lease(t0), None, "its report is still to be answered");
    let report = w.next_report(t0).expect("report");
    assert_eq!(report.len(), 1);
    w.reported();
    assert_eq!(
        w.next_lease(t0),
        Some(1),
        "holding nothing, it asks to learn it is drained"
    );
    assert_eq!(w.finished(), None);
    w.ended(End::Drained);
    assert_eq!(w.finished(), Some(End::Drained));
}

#[derive(Debug, Clone)]
enum Op {
    /// Time passes.
    Advance(u64),
    /// The shell acts on whatever the state asks for.
    AskLease,
    /// The lease answer: `n` fresh steps (capped at what was asked), or a wait.
    Grant {
        n: u32,
        lease_ms: u64,
        /// Steps below every step held (returned by a lost worker, or after a rewind).
        low: bool,
    },
    Wait(u64),
    EndOfData,
    Run {
        compute_us: u64,
    },
    /// The burst's frames go out (after the awaited answers, as the shell does).
    Send,
    /// The receiver answers the oldest awaited step, or the connection is lost (the shell
    /// sends every awaited frame again before the next answer).
    Answer(u8),
    AskReport,
    Reported,
    Drain(bool),
    /// Every lease is revoked at once: the generation goes up, and the worker hears it.
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..40).prop_map(Op::Advance),
        4 => Just(Op::AskLease),
        4 => (0u32..80, 1u64..100, any::<bool>()).prop_map(|(n, lease_ms, low)| Op::Grant { n, lease_ms, low }),
        1 => (1u64..50).prop_map(Op::Wait),
        1 => Just(Op::EndOfData),
        4 => (1u64..20_000).prop_map(|compute_us| Op::Run { compute_us }),
        3 => Just(Op::Send),
        4 => (0u8..5).prop_map(Op::Answer),
        3 => Just(Op::AskReport),
        3 => Just(Op::Reported),
        1 => any::<bool>().prop_map(Op::Drain),
        1 => Just(Op::Reset),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Under any interleaving of answers: never more than the lease limit outstanding, at
    /// most what was asked is held per lease, no step reported before the receiver took
    /// it (and each at most once), no expired lease pushed, the lowest runnable step runs
    /// first, a parked step is not sent again before its pause ends, a step above one
    /// is held back with it, and the worker ends only once it holds nothing.
    #[test]
    fn the_worker_keeps_its_rules(max_leases in 1u32..40, ops in proptest::collection::vec(op(), 0..300)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut w = WorkerState::new(max_leases);
        let mut asked: Option<u32> = None;
        let mut next_global = 1_000_000u64;
        let mut next_low = 1_000_000u64;
        let mut generation = 0u64;
        // Parked (answered `RETRY`): when each may be sent again.
        let mut parked: std::collections::BTreeMap<u64, Instant> = std::collections::BTreeMap::new();
        let mut taken: BTreeSet<u64> = BTreeSet::new();
        let mut reported: BTreeSet<u64> = BTreeSet::new();
        let mut in_report: Vec<Delivered> = Vec::new();
        // The burst: run, not yet sent.
        let mut running: Vec<HeldStep> = Vec::new();
        // Sent, answers awaited in order; `resend` once the connection was lost.
        let mut pushing: VecDeque<HeldStep> = VecDeque::new();
        let mut resend = false;
        let limit = usize::try_from(max_leases).expect("small");
        for op in ops {
            match op {
                Op::Advance(ms) => now += Duration::from_millis(ms),
                Op::AskLease => {
                    if let Some(max) = w.next_lease(now) {
                        prop_assert!(asked.is_none(), "two lease requests in flight");
                        prop_assert!(max >= 1);
                        // Within the limit, or one step beyond it when everything held is
                        // parked (the dispatcher grants that one only if it was returned).
                        let within = w.outstanding() + usize::try_from(max).expect("small") <= limit;
                        let parked_ask = max == 1 && w.beyond == 1 && w.all_parked();
                        prop_assert!(within || parked_ask || w.outstanding() == 0);
                        asked = Some(max);
                    }
                }
                Op::Grant { n, lease_ms, low } => {
                    if let Some(max) = asked.take() {
                        let n = n.min(max);
                        let steps = (0..n).map(|_| {
                            let global = if low {
                                next_low -= 1;
                                next_low
                            } else {
                                next_global += 1;
                                next_global
                            };
                            HeldStep {
                                generation,
                                ..step(global, now + Duration::from_millis(lease_ms))
                            }
                        }).collect();
                        w.leased(steps, Duration::from_micros(300));
                    }
                }
                Op::Wait(ms) => {
                    if asked.take().is_some() {
                        w.wait(Duration::from_millis(ms), now);
                    }
                }
                Op::EndOfData => {
                    if asked.take().is_some() {
                        // As the shell does: the job is over, what is held is void.
                        w.job_ended();
                        running.clear();
                        pushing.clear();
                        parked.clear();
                    }
                }
                Op::Run { compute_us } => {
                    let room = running.len() < w.burst_size();
                    let next = w.next_step(now);
                    prop_assert!(room || next.is_none(), "ran a step past a full burst");
                    {
                        if let Some(s) = next {
                            prop_assert!(s.expires > now, "ran an expired lease");
                            if let Some(not_before) = parked.remove(&s.global) {
                                prop_assert!(not_before <= now, "sent {} again before its pause ended", s.global);
                            }
                            prop_assert!(w.queued.iter().all(|q| q.global > s.global), "ran {} before a lower queued step", s.global);
                            prop_assert!(
                                w.parked.values().all(|p| p.not_before > now || p.step.global > s.global),
                                "ran {} before a lower parked step whose pause ended", s.global
                            );
                            parked.retain(|g, _| w.is_parked(*g));
                            w.computed(Duration::from_micros(compute_us));
                            running.push(s);
                            prop_assert!(running.len() <= MAX_BURST);
                            if running.len() >= w.burst_size() {
                                prop_assert!(w.burst_due(now), "a full burst is not due");
                            }
                        }
                    }
                    prop_assert!(w.burst().eq(running.iter().map(|s| s.global)));
                }
                Op::Send => {
                    if !pushing.is_empty() || running.is_empty() {
                        continue;
                    }
                    let live = w.may_push(now);
                    running.retain(|s| s.expires > now);
                    prop_assert_eq!(live, !running.is_empty());
                    prop_assert!(w.burst().eq(running.iter().map(|s| s.global)), "the burst kept an expired lease");
                    if live {
                        // A step above a parked one whose pause has not ended waits with
                        // it, until the latest such pause below it ends.
                        parked.retain(|g, _| w.is_parked(*g));
                        let expected: Vec<(u64, Instant)> = running
                            .iter()
                            .filter_map(|s| {
                                parked
                                    .iter()
                                    .filter(|&(&g, &until)| g < s.global && until > now)
                                    .map(|(_, &until)| until)
                                    .max()
                                    .map(|until| (s.global, until))
                            })
                            .collect();
                        let held = w.hold_back(now);
                        prop_assert!(held.iter().copied().eq(expected.iter().map(|e| e.0)), "held back {:?}, expected {:?}", held, expected);
                        for (g, until) in expected {
                            prop_assert!(w.is_parked(g), "{} held back and not parked", g);
                            prop_assert!(w.wakeup().is_some_and(|t| t <= until), "a held step's pause is not a wakeup");
                            parked.insert(g, until);
                        }
                        running.retain(|s| !held.contains(&s.global));
                        prop_assert!(w.burst().eq(running.iter().map(|s| s.global)), "the burst kept a held step");
                        w.sent();
                        prop_assert_eq!(w.awaits_answer(), !running.is_empty());
                        pushing = running.drain(..).collect();
                        resend = false;
                    }
                }
                Op::Answer(answer) => {
                    if !pushing.is_empty() {
                        if resend {
                            let live = w.may_resend(now);
                            pushing.retain(|s| s.expires > now);
                            prop_assert_eq!(live, !pushing.is_empty());
                            prop_assert_eq!(w.awaits_answer(), live);
                            prop_assert!(w.in_flight().eq(pushing.iter().map(|s| s.global)), "resent an expired lease");
                            if !live {
                                continue;
                            }
                            resend = false;
                        }
                        let Some(s) = pushing.front().cloned() else { continue };
                        let pause = Duration::from_millis(5);
                        let answer = match answer {
                            0 | 1 => PushAnswer::Taken,
                            2 => PushAnswer::Retry(pause),
                            3 => PushAnswer::Rejected,
                            _ => {
                                // The connection dropped before the answer came.
                                resend = true;
                                continue;
                            }
                        };
                        pushing.pop_front();
                        if answer == PushAnswer::Taken {
                            taken.insert(s.global);
                        }
                        match w.pushed(answer, now) {
                            PushNext::Parked => {
                                prop_assert!(w.is_parked(s.global));
                                prop_assert!(w.wakeup().is_some_and(|t| t <= now + pause), "a parked step's pause is not a wakeup");
                                parked.insert(s.global, now + pause);
                            }
                            PushNext::Done => prop_assert_eq!(answer, PushAnswer::Taken),
                            PushNext::Drop => prop_assert!(answer != PushAnswer::Taken),
                        }
                        prop_assert_eq!(w.awaits_answer(), !pushing.is_empty());
                    }
                }
                Op::AskReport => {
                    let waiting = !w.delivered.is_empty() && w.reporting == 0;
                    let due = w.report_due();
                    let report = w.next_report(now);
                    if report.is_none() && waiting {
                        // Held back for company: its deadline is named, and kept.
                        let due = due.expect("a waiting report has a deadline");
                        prop_assert!(due > now, "a due report was held");
                        prop_assert!(w.wakeup().is_some_and(|t| t <= due), "the report's deadline is not a wakeup");
                    }
                    if let Some(report) = report {
                        prop_assert!(in_report.is_empty(), "two reports in flight");
                        for d in &report {
                            prop_assert!(taken.contains(&d.global), "reported {} before the receiver took it", d.global);
                            prop_assert!(reported.insert(d.global), "reported {} twice", d.global);
                        }
                        in_report = report;
                    }
                }
                Op::Reported => {
                    if !in_report.is_empty() {
                        in_report.clear();
                        w.reported();
                    }
                }
                Op::Drain(on) => w.set_draining(on),
                Op::Reset => {
                    generation += 1;
                    w.void_before(generation);
                    prop_assert!(w.queued.iter().all(|q| q.generation == generation), "a revoked step stays queued");
                    prop_assert!(w.parked.values().all(|p| p.step.generation == generation), "a revoked step stays parked");
                    parked.retain(|g, _| w.is_parked(*g));
                }
            }
            prop_assert!(w.outstanding() <= limit + 1, "{} outstanding > {} + 1", w.outstanding(), limit);
            match w.finished() {
                // Drained: everything held was delivered and reported first.
                Some(End::Drained) => {
                    prop_assert_eq!(w.outstanding(), 0);
                    prop_assert!(running.is_empty() && pushing.is_empty() && in_report.is_empty());
                }
                // End of data: nothing more runs or is pushed (reports are moot).
                Some(End::EndOfData) => {
                    prop_assert!(running.is_empty() && pushing.is_empty());
                    prop_assert_eq!(w.next_step(now), None);
                    prop_assert_eq!(w.next_lease(now), None);
                }
                None => {}
            }
        }
    }
}

/// A slow worker holds only what it computes within the horizon (at least two steps), so the
/// steps it holds are done about as soon as a fast peer's; a fast one keeps the dispatcher's
/// limit, and one not measured yet too.
#[test]
fn a_slow_worker_holds_few_steps_and_leases_no_more() {
    let mut w = WorkerState::new(10);
    assert_eq!(w.held_limit(), 10, "no step measured yet");
    for (step_ms, held) in [(1, 10), (15, 10), (20, 8), (80, 2), (500, MIN_HELD)] {
        w.step_time = Some(Duration::from_millis(step_ms).as_secs_f64());
        assert_eq!(w.held_limit(), held, "steps of {step_ms} ms");
    }
    // Holding two steps, with a 20 ms lease round trip (which alone would have it lease five
    // at a time): an 80 ms worker asks for none more, a 20 ms one for more.
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(10);
    let holding_two = |step_s: f64| {
        let mut w = WorkerState::new(10);
        w.step_time = Some(step_s);
        w.round_trip = Some(0.02);
        w.leased(vec![step(0, far), step(1, far)], Duration::from_millis(20));
        w
    };
    assert_eq!(
        holding_two(0.08).next_lease(t0),
        None,
        "the slow worker holds its horizon"
    );
    assert_eq!(
        holding_two(0.02).next_lease(t0),
        Some(4),
        "the fast worker leases on"
    );
}
