//! The data worker's core: which steps it holds and what to do next, as a synchronous state
//! machine with time passed in (like the dispatcher's `DispatcherState` and the receiver's
//! `ReceiverState`). The async shell in [`super::worker`] performs what it says (lease and
//! report RPCs, the stage run, the push) and tells it what came of each.
//!
//! # Rules
//! - **The lease limit.** A step counts against the worker's `max_leases` from its lease until
//!   the dispatcher answered the report that completes it (the dispatcher counts it until then
//!   too), so [`WorkerState::next_lease`] never asks for more than the room left: never more
//!   than the limit outstanding.
//! - **Batches.** A lease asks for `k` steps and a report carries every delivered step not yet
//!   reported (at most one of each in flight). `k` adapts so that a lease round trip is at
//!   most [`ROUND_TRIP_SHARE`] of the work it buys: `k = ceil(round trip / (share · step
//!   time))`, measured as moving averages, within `1 ..= max(1, max_leases / 2)` (half, so that
//!   the next batch is leased while the current one runs).
//! - **Paced reports.** Delivered steps wait to be reported together, so that a report (an RPC
//!   the dispatcher answers) is not paid per step: a report rides on the next lease request
//!   (one per batch), or goes out on its own once two batches' worth (`2k`) is delivered,
//!   once the oldest has waited the report delay ([`WorkerState::report_delay`]: two batches'
//!   time, within [`REPORT_DELAY`] and [`MAX_REPORT_DELAY`]), once the next batch
//!   is due to be leased and the room left under the lease limit is less than a batch (steps
//!   waiting for company would keep it from being leased, and the worker would run dry), or
//!   at once when the worker has nothing queued or running, is draining, or the dispatcher
//!   said the end.
//!   [`WorkerState::wakeup`] names the delay's end. Held steps still count against the limit,
//!   so at worst a lease waits the report delay for room.
//! - **Bursts.** Steps shorter than [`BURST_TIME`] are computed back to back, up to
//!   `floor(BURST_TIME / step time)` of them (at most [`MAX_BURST`], and at most a quarter of
//!   the lease limit, so that a burst fits the receiver's window), and their frames go out
//!   together in one vectored write: a push (a system call, and waking the receiver) then costs
//!   a burst once instead of every step. A burst goes out early when nothing more may join it
//!   now (nothing queued, no parked step ready), so a burst never waits for a lease. Its
//!   answers (in order) are read after the next burst ran, before that one goes out: one
//!   burst's answers are awaited at a time. A longer step is a burst of one.
//! - **Lowest first.** Held steps run in the order of their global step, whatever order they
//!   were leased in (a step returned by a lost worker or a rewind comes after later ones), so
//!   that the step the receiver waits for is never held behind a later one.
//! - **A full receiver holds up nothing.** A step the receiver answers `RETRY` (too far ahead
//!   of its window) is parked with its frame until the pause ends, and the worker runs its
//!   other steps meanwhile: one of them may be the step the receiver waits for. A worker that
//!   waited on the `RETRY` instead would hold that step until its lease expired. A step above
//!   one whose pause has not ended is parked without being sent
//!   ([`WorkerState::hold_back`]): the receiver would refuse it too. The receiver sizes the
//!   pause from its consumer's rate, so that the step comes back about when the window reaches
//!   it.
//! - **Revoked at once.** When a receiver registers or the training side rewinds, the
//!   dispatcher revokes every lease and its lease generation goes up; lease and heartbeat
//!   answers carry it. The queued and parked steps of an older generation are dropped at once
//!   ([`WorkerState::void_before`]): they are someone else's now, and kept they would fill the
//!   lease limit with steps the receiver may not take for a long time, so that the worker could
//!   not lease the ones it waits for. A step being computed or sent finishes (a stale delivery
//!   is harmless: the receiver drops a duplicate, the dispatcher refuses its report).
//! - **Delivery before report.** A step is reported complete only after the receiver took its
//!   frame (or already had it); a step whose push was refused, or whose lease expired first,
//!   is never reported.
//! - **Expiry.** A lease that expired (on this machine's clock, counted from when the lease
//!   request went out, so it errs early) has gone back to the dispatcher: the step is neither
//!   run nor pushed any more; whoever holds it now delivers it. So a lease must outlast a
//!   step's compute and push (the default lease is 10 s; steps take milliseconds): a step
//!   slower than its lease is dropped by every worker that takes it.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// The share of the work a lease round trip may cost: k steps are leased at once so that one
/// round trip is at most this fraction of the time they take to compute.
pub const ROUND_TRIP_SHARE: f64 = 0.05;

/// The most steps asked for at once, whatever the measurements say (and at most half the
/// worker's lease limit). Short steps reach it: a lease, and the report riding on it, costs
/// the worker about 100 µs of CPU (a gRPC round trip), which 512 steps of 40 µs make half a
/// percent of their work (256 made it 1%, a tenth of what a worker may spend beyond its stage:
/// about 0.2 µs a step on deepfm's CSV cut in paired runs).
pub const MAX_BATCH: u32 = 512;

/// The most compute a burst holds back: short steps are computed back to back until this
/// much (at most [`MAX_BURST`] steps) and sent together (see the module docs: "Bursts").
pub const BURST_TIME: Duration = Duration::from_millis(2);

/// The most steps in one burst (and at most a quarter of the worker's lease limit, its share
/// of the receiver's window, so that bursts fit in it side by side).
pub const MAX_BURST: usize = 32;

/// The most steps in one report: the dispatcher's limit per request.
const MAX_REPORT: usize = lode_proto::service::MAX_STEPS_PER_REQUEST as usize;

/// The shortest report delay: the longest a delivered step waits for others to share its
/// report, when batches are short (see the module docs and [`WorkerState::report_delay`]).
pub const REPORT_DELAY: Duration = Duration::from_millis(2);

/// The longest report delay, however long a batch takes. Long enough for a batch of 256
/// steps of up to about 1 ms (or the largest batch of steps up to 0.5 ms) to carry its report
/// with the next lease, and far below a lease
/// (10 s by default): a step delivered and not yet reported is leased again only once its
/// lease expires.
pub const MAX_REPORT_DELAY: Duration = Duration::from_millis(250);

/// Weight of a new sample in the moving averages of step time and round trip.
const EWMA_WEIGHT: f64 = 0.2;

/// A leased step, as the worker holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldStep {
    pub epoch: u64,
    /// The step within its epoch (what the dispatcher's `StepRef` says).
    pub step: u64,
    /// The step's global number: `epoch · steps_per_epoch + step` (the receiver's order).
    pub global: u64,
    pub records: Vec<u64>,
    /// When the lease ends, on this machine's clock.
    pub expires: Instant,
    /// The lease's deadline on the dispatcher's clock, as granted: it names this grant in the
    /// report, so that a late report of an earlier grant of the step cannot complete this one.
    pub deadline_ms: u64,
    /// The dispatcher's lease generation at the grant (see [`WorkerState::void_before`]).
    pub generation: u64,
}

/// A delivered step waiting to be reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub epoch: u64,
    pub step: u64,
    pub global: u64,
    pub compute_us: u64,
    /// The grant it was delivered under (see [`HeldStep::deadline_ms`]).
    pub deadline_ms: u64,
}

/// What the receiver answered a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushAnswer {
    /// Taken, or already held or delivered: the step may be reported.
    Taken,
    /// The receiver is full: push again after the pause.
    Retry(Duration),
    /// The receiver refused the frame.
    Rejected,
}

/// What the shell does next with the running step after a push answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushNext {
    /// Delivered; it will be reported.
    Done,
    /// Keep the frame: the step is parked and is sent again, by [`WorkerState::next_step`],
    /// once the receiver's pause ended.
    Parked,
    /// Drop the frame: the lease expired (the step is someone else's now) or the receiver
    /// refused it.
    Drop,
}

/// A computed step the receiver could not take yet (see the module docs).
#[derive(Debug, Clone)]
struct Parked {
    step: HeldStep,
    compute: Duration,
    /// Not sent again before this.
    not_before: Instant,
}

/// How the worker ends, once it holds nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    EndOfData,
    Drained,
}

/// The worker's steps and decisions; see the module docs for its rules.
#[derive(Debug, Clone)]
pub struct WorkerState {
    max_leases: usize,
    /// Leased and not started, lowest global step first.
    queued: VecDeque<HeldStep>,
    /// No queued step expires before this (a lower bound: the queue is searched for expired
    /// steps only from then, not at every step).
    queued_expiry: Option<Instant>,
    /// Steps of a lease generation below this were voided ([`Self::void_before`]); every
    /// held step is of this generation or a later one.
    voided_below: u64,
    /// Computed and answered `RETRY`, by global step: sent again from when it may be.
    parked: BTreeMap<u64, Parked>,
    /// The burst: computed and not yet sent, the last one possibly still being computed
    /// (at most [`Self::burst_size`], lowest global step first).
    running: Vec<(HeldStep, Duration)>,
    /// Sent to the receiver, answers not yet read, in the order sent (one burst): the next
    /// burst is computed while the receiver takes this one.
    pushing: VecDeque<(HeldStep, Duration)>,
    /// Delivered, not yet in a report.
    delivered: Vec<Delivered>,
    /// When the oldest of `delivered` was delivered.
    delivered_since: Option<Instant>,
    /// Steps in the report in flight (still counted by the dispatcher).
    reporting: usize,
    lease_in_flight: bool,
    /// After a `Wait` answer: no lease request before this.
    lease_not_before: Option<Instant>,
    end: Option<End>,
    draining: bool,
    step_time: Option<f64>,
    round_trip: Option<f64>,
    /// Steps dropped because their lease expired before they were delivered.
    abandoned: u64,
}

impl WorkerState {
    /// A worker that may hold `max_leases` steps at once (the dispatcher's limit, at least 1).
    pub fn new(max_leases: u32) -> Self {
        Self {
            max_leases: usize::try_from(max_leases.max(1)).unwrap_or(usize::MAX),
            queued: VecDeque::new(),
            queued_expiry: None,
            voided_below: 0,
            parked: BTreeMap::new(),
            running: Vec::new(),
            pushing: VecDeque::new(),
            delivered: Vec::new(),
            delivered_since: None,
            reporting: 0,
            lease_in_flight: false,
            lease_not_before: None,
            end: None,
            draining: false,
            step_time: None,
            round_trip: None,
            abandoned: 0,
        }
    }

    /// The steps the worker may hold at once now (see [`Self::set_max_leases`]).
    pub fn max_leases(&self) -> usize {
        self.max_leases
    }

    /// The dispatcher's lease limit for this worker changed (its share of the training side's
    /// window, which changes as workers join and leave): steps held past a lower limit stay,
    /// and the worker leases again once it holds fewer.
    pub fn set_max_leases(&mut self, max_leases: u32) {
        self.max_leases = usize::try_from(max_leases.max(1)).unwrap_or(usize::MAX);
    }

    /// Steps the dispatcher counts as this worker's: leased and not yet reported back.
    pub fn outstanding(&self) -> usize {
        self.queued.len()
            + self.parked.len()
            + self.running.len()
            + self.pushing.len()
            + self.delivered.len()
            + self.reporting
    }

    /// The moving average of the stage's compute time per step, once one was measured.
    pub fn step_time(&self) -> Option<Duration> {
        self.step_time
            .and_then(|t| Duration::try_from_secs_f64(t).ok())
    }

    /// Steps asked for per lease now (see the module docs).
    pub fn batch_size(&self) -> u32 {
        let cap = u32::try_from(self.max_leases / 2)
            .unwrap_or(u32::MAX)
            .clamp(1, MAX_BATCH);
        let (Some(step), Some(rtt)) = (self.step_time, self.round_trip) else {
            return 1;
        };
        let want = rtt / (ROUND_TRIP_SHARE * step.max(1e-6));
        if !want.is_finite() || want >= f64::from(cap) {
            return cap;
        }
        // In [0, cap): the conversion cannot truncate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let k = want.ceil() as u32;
        k.clamp(1, cap)
    }

    /// The number of steps to ask the dispatcher for now, if a lease request should go out;
    /// the caller sends it and answers with [`Self::leased`], [`Self::wait`] or
    /// [`Self::ended`].
    pub fn next_lease(&mut self, now: Instant) -> Option<u32> {
        self.lease_request(now, 0)
    }

    /// [`Self::next_lease`] with the delivered steps riding along as the request's report
    /// (when no report is in flight): the dispatcher completes them before it grants, so they
    /// do not count against the limit here. The caller answers with [`Self::leased`] (or
    /// [`Self::wait`], ...) and then [`Self::reported`] when the report is not empty.
    pub fn next_lease_carrying(&mut self, now: Instant) -> Option<(u32, Vec<Delivered>)> {
        let carried = if self.reporting == 0 {
            self.delivered.len()
        } else {
            0
        };
        let max = self.lease_request(now, carried)?;
        Some((max, self.take_report().unwrap_or_default()))
    }

    /// A lease request's size, counting `freed` of the held steps as no longer held.
    fn lease_request(&mut self, now: Instant, freed: usize) -> Option<u32> {
        if self.lease_in_flight || self.end.is_some() {
            return None;
        }
        if self.lease_not_before.is_some_and(|t| now < t) {
            return None;
        }
        let outstanding = self.outstanding();
        let max = if self.draining {
            // A draining worker leases nothing new; once it holds nothing, asking is how it
            // learns that it is drained.
            if outstanding > 0 {
                return None;
            }
            1
        } else {
            let room = self
                .max_leases
                .saturating_sub(outstanding.saturating_sub(freed));
            let k = usize::try_from(self.batch_size()).unwrap_or(1);
            // Enough work ahead already, or no room: wait for steps to finish.
            if room == 0 || self.queued.len() >= k {
                return None;
            }
            u32::try_from(k.min(room)).unwrap_or(1)
        };
        self.lease_in_flight = true;
        self.lease_not_before = None;
        Some(max)
    }

    /// The dispatcher granted `steps` (within what was asked) after a `round_trip`.
    pub fn leased(&mut self, steps: Vec<HeldStep>, round_trip: Duration) {
        self.lease_in_flight = false;
        self.round_trip = Some(ewma(self.round_trip, round_trip.as_secs_f64()));
        if let Some(newest) = steps.iter().map(|s| s.generation).max() {
            self.void_before(newest);
        }
        for step in steps {
            // Granted before a revocation the worker already heard of: someone else's now.
            if step.generation < self.voided_below {
                self.abandoned += 1;
                continue;
            }
            // Granted again while an earlier grant of it is queued or running (that one went
            // back): the copy here now runs under the new grant, and reports it. The queue is
            // in global order; the burst and the answers awaited are short.
            let at = self.queued.partition_point(|q| q.global < step.global);
            let held = match self.queued.get_mut(at) {
                Some(q) if q.global == step.global => Some(q),
                _ => self
                    .running
                    .iter_mut()
                    .map(|(h, _)| h)
                    .chain(self.pushing.iter_mut().map(|(h, _)| h))
                    .find(|h| h.global == step.global)
                    .or_else(|| self.parked.get_mut(&step.global).map(|p| &mut p.step)),
            };
            self.queued_expiry = Some(
                self.queued_expiry
                    .map_or(step.expires, |t| t.min(step.expires)),
            );
            if let Some(held) = held {
                held.expires = step.expires;
                held.deadline_ms = step.deadline_ms;
                held.generation = step.generation;
                continue;
            }
            // Beyond the limit would be a dispatcher bug; refuse to hold more than it allows.
            if self.outstanding() < self.max_leases {
                self.queued.insert(at, step);
            }
        }
    }

    /// Nothing to lease now: ask again after `retry_after`.
    pub fn wait(&mut self, retry_after: Duration, now: Instant) {
        self.lease_in_flight = false;
        self.lease_not_before = Some(now + retry_after);
    }

    /// The lease request failed in a way the shell retries: ask again after `retry_after`.
    pub fn lease_failed(&mut self, retry_after: Duration, now: Instant) {
        self.wait(retry_after, now);
    }

    /// The dispatcher answered end of data or drained: lease nothing more.
    pub fn ended(&mut self, end: End) {
        self.lease_in_flight = false;
        self.end = Some(end);
    }

    /// The dispatcher said (in a heartbeat) that the job's data ended: every step held is
    /// void (its lease was revoked or retired), so the queue and the running step are dropped
    /// and nothing more is leased. Delivered steps are still reported (and refused).
    pub fn job_ended(&mut self) {
        let dropped =
            self.queued.len() + self.parked.len() + self.running.len() + self.pushing.len();
        self.abandoned += dropped as u64;
        self.queued.clear();
        self.parked.clear();
        self.running.clear();
        self.pushing.clear();
        self.ended(End::EndOfData);
    }

    /// The dispatcher's lease generation is `generation`: the queued and parked steps granted
    /// in an older one were revoked and are dropped (see the module docs).
    pub fn void_before(&mut self, generation: u64) {
        if generation <= self.voided_below {
            return;
        }
        self.voided_below = generation;
        let before = self.queued.len() + self.parked.len();
        self.queued.retain(|q| q.generation >= generation);
        self.parked.retain(|_, p| p.step.generation >= generation);
        self.abandoned += (before - self.queued.len() - self.parked.len()) as u64;
    }

    /// The dispatcher says the worker is draining.
    pub fn set_draining(&mut self, draining: bool) {
        self.draining = draining;
    }

    /// Steps computed back to back and sent together now (see the module docs: "Bursts"):
    /// 1 until a step time is measured or when steps take [`BURST_TIME`] or more.
    pub fn burst_size(&self) -> usize {
        let Some(step) = self.step_time.filter(|t| *t > 0.0) else {
            return 1;
        };
        let most = MAX_BURST.min(self.max_leases / 4).max(1);
        let fit = BURST_TIME.as_secs_f64() / step;
        if !fit.is_finite() || fit >= most as f64 {
            return most;
        }
        // In [0, most): the conversion cannot truncate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = fit.floor() as usize;
        n.clamp(1, most)
    }

    /// The next step to run, if the burst has room: the lowest of the queued steps and of the
    /// parked ones whose pause ended (expired ones are dropped). A parked step comes back
    /// computed: [`Self::is_parked`] said so until now, and the shell sends the frame it kept
    /// instead of running the stage again.
    pub fn next_step(&mut self, now: Instant) -> Option<HeldStep> {
        if self.running.len() >= self.burst_size() {
            return None;
        }
        let (queued, ready) = self.runnable(now);
        let (mut step, compute) = match (queued, ready) {
            (Some(q), Some(p)) if p < q => self.unpark(p)?,
            (None, Some(p)) => self.unpark(p)?,
            (Some(_), _) => (self.queued.pop_front()?, Duration::ZERO),
            (None, None) => return None,
        };
        // The state's copy goes without the records: only the stage reads them, and a step
        // that comes back (parked) is sent from its kept frame, not run again. A copy with
        // them would be an allocation and a copy of the record ids at every step.
        let records = std::mem::take(&mut step.records);
        self.running.push((step.clone(), compute));
        step.records = records;
        Some(step)
    }

    /// The lowest queued step and the lowest parked one whose pause ended, after dropping
    /// the expired ones.
    fn runnable(&mut self, now: Instant) -> (Option<u64>, Option<u64>) {
        let before = self.queued.len() + self.parked.len();
        if self.queued_expiry.is_some_and(|t| t <= now) {
            self.queued.retain(|q| q.expires > now);
            self.queued_expiry = self.queued.iter().map(|q| q.expires).min();
        }
        self.parked.retain(|_, p| p.step.expires > now);
        self.abandoned += (before - self.queued.len() - self.parked.len()) as u64;
        let ready = self
            .parked
            .values()
            .find(|p| p.not_before <= now)
            .map(|p| p.step.global);
        (self.queued.front().map(|q| q.global), ready)
    }

    /// Whether the burst should be sent now: it is full, or nothing more may join it yet
    /// (nothing queued, no parked step ready), or the worker is draining or ending.
    pub fn burst_due(&mut self, now: Instant) -> bool {
        if self.running.is_empty() {
            return false;
        }
        if self.running.len() >= self.burst_size() || self.draining || self.end.is_some() {
            return true;
        }
        self.runnable(now) == (None, None)
    }

    /// The global steps of the burst, in order.
    pub fn burst(&self) -> impl Iterator<Item = u64> + '_ {
        self.running.iter().map(|(s, _)| s.global)
    }

    /// The global steps whose answers are awaited, in the order sent.
    pub fn in_flight(&self) -> impl Iterator<Item = u64> + '_ {
        self.pushing.iter().map(|(s, _)| s.global)
    }

    fn unpark(&mut self, global: u64) -> Option<(HeldStep, Duration)> {
        self.parked.remove(&global).map(|p| (p.step, p.compute))
    }

    /// Whether `global` is parked: computed, its frame kept for the next send.
    pub fn is_parked(&self, global: u64) -> bool {
        self.parked.contains_key(&global)
    }

    /// The last running step's stage ran in `compute`.
    pub fn computed(&mut self, compute: Duration) {
        if let Some((_, spent)) = self.running.last_mut() {
            *spent = compute;
            self.step_time = Some(ewma(self.step_time, compute.as_secs_f64()));
        }
    }

    /// Whether any step of the burst may be sent now: the ones whose lease expired are
    /// dropped (never sent; [`Self::burst`] names the rest), and this is false when none is
    /// left.
    pub fn may_push(&mut self, now: Instant) -> bool {
        let before = self.running.len();
        self.running.retain(|(s, _)| s.expires > now);
        self.abandoned += (before - self.running.len()) as u64;
        !self.running.is_empty()
    }

    /// Parks the burst's steps that the receiver would answer `RETRY` now: those above a
    /// parked step whose pause has not ended (the receiver's window ended below them when it
    /// answered, and it has not moved far enough since). Each waits, computed, until the
    /// latest pause among the parked steps below it ends, instead of crossing the network to
    /// be refused. Returns their global steps, lowest first: the shell keeps their frames with
    /// the other parked ones.
    pub fn hold_back(&mut self, now: Instant) -> Vec<u64> {
        let waiting: Vec<(u64, Instant)> = self
            .parked
            .values()
            .filter(|p| p.not_before > now)
            .map(|p| (p.step.global, p.not_before))
            .collect();
        if waiting.is_empty() {
            return Vec::new();
        }
        let mut held = Vec::new();
        let mut kept = Vec::with_capacity(self.running.len());
        for (step, compute) in self.running.drain(..) {
            let until = waiting
                .iter()
                .filter(|(below, _)| *below < step.global)
                .map(|&(_, until)| until)
                .max();
            match until {
                Some(not_before) => {
                    held.push(step.global);
                    self.parked.insert(
                        step.global,
                        Parked {
                            step,
                            compute,
                            not_before,
                        },
                    );
                }
                None => kept.push((step, compute)),
            }
        }
        self.running = kept;
        held
    }

    /// Whether any step whose answer is awaited may be sent again now (after a lost
    /// connection): the ones whose lease expired are dropped ([`Self::in_flight`] names the
    /// rest), and this is false when none is left.
    pub fn may_resend(&mut self, now: Instant) -> bool {
        let before = self.pushing.len();
        self.pushing.retain(|(s, _)| s.expires > now);
        self.abandoned += (before - self.pushing.len()) as u64;
        !self.pushing.is_empty()
    }

    /// The burst's frames went out: their answers are awaited (read them, with
    /// [`Self::pushed`], before the next burst goes out), and the next burst may run
    /// meanwhile. Does nothing while other answers are awaited.
    pub fn sent(&mut self) {
        if self.pushing.is_empty() {
            self.pushing = self.running.drain(..).collect();
        }
    }

    /// Whether a sent step's answer is awaited.
    pub fn awaits_answer(&self) -> bool {
        !self.pushing.is_empty()
    }

    /// What the receiver answered the oldest awaited step's push, at `now`.
    pub fn pushed(&mut self, answer: PushAnswer, now: Instant) -> PushNext {
        let Some((step, compute)) = self.pushing.pop_front() else {
            return PushNext::Drop;
        };
        match answer {
            PushAnswer::Taken => {
                self.delivered_since.get_or_insert(now);
                self.delivered.push(Delivered {
                    epoch: step.epoch,
                    step: step.step,
                    global: step.global,
                    compute_us: u64::try_from(compute.as_micros()).unwrap_or(u64::MAX),
                    deadline_ms: step.deadline_ms,
                });
                PushNext::Done
            }
            PushAnswer::Retry(pause) if step.expires > now + pause => {
                self.parked.insert(
                    step.global,
                    Parked {
                        step,
                        compute,
                        not_before: now + pause,
                    },
                );
                PushNext::Parked
            }
            // The receiver waits for an earlier step and our lease ends first: it went back
            // to the dispatcher, whoever holds it now delivers it.
            PushAnswer::Retry(_) => {
                self.abandoned += 1;
                PushNext::Drop
            }
            PushAnswer::Rejected => PushNext::Drop,
        }
    }

    /// The burst and the awaited steps are given up (shutdown, an error): none is pushed
    /// nor reported.
    pub fn drop_running(&mut self) {
        self.running.clear();
        self.pushing.clear();
    }

    /// The delivered steps to report now, if no report is in flight and one is due (see the
    /// module docs: "Paced reports"); the caller answers with [`Self::reported`].
    pub fn next_report(&mut self, now: Instant) -> Option<Vec<Delivered>> {
        if self.reporting > 0 || self.delivered.is_empty() {
            return None;
        }
        let k = usize::try_from(self.batch_size()).unwrap_or(1);
        let due = self.delivered.len() >= k.saturating_mul(2).min(MAX_REPORT)
            || (self.queued.len() < k && self.max_leases.saturating_sub(self.outstanding()) < k)
            || self.report_due().is_some_and(|t| now >= t)
            || (self.queued.is_empty() && self.running.is_empty() && self.pushing.is_empty())
            || self.draining
            || self.end.is_some();
        if !due {
            return None;
        }
        self.take_report()
    }

    /// Every delivered step, due or not, if no report is in flight (a stopping worker's last
    /// report); answered with [`Self::reported`] like [`Self::next_report`].
    pub fn take_report(&mut self) -> Option<Vec<Delivered>> {
        if self.reporting > 0 || self.delivered.is_empty() {
            return None;
        }
        let report = if self.delivered.len() > MAX_REPORT {
            // The rest waits for the next report, due at once (its oldest waited as long).
            let rest = self.delivered.split_off(MAX_REPORT);
            std::mem::replace(&mut self.delivered, rest)
        } else {
            self.delivered_since = None;
            std::mem::take(&mut self.delivered)
        };
        self.reporting = report.len();
        Some(report)
    }

    /// The report in flight was answered (or given up: the dispatcher forgets the leases on
    /// its own when they expire).
    pub fn reported(&mut self) {
        self.reporting = 0;
    }

    /// When the delivered steps' report is due at the latest, if any wait.
    fn report_due(&self) -> Option<Instant> {
        self.delivered_since.map(|t| t + self.report_delay())
    }

    /// The longest a delivered step waits for company now: the time of two batches (so that
    /// the next lease request, one per batch, carries it), within [`REPORT_DELAY`] and
    /// [`MAX_REPORT_DELAY`].
    pub fn report_delay(&self) -> Duration {
        let batches = self
            .step_time
            .map_or(0.0, |t| 2.0 * f64::from(self.batch_size()) * t);
        Duration::try_from_secs_f64(batches)
            .unwrap_or(MAX_REPORT_DELAY)
            .clamp(REPORT_DELAY, MAX_REPORT_DELAY)
    }

    /// Whether a report is in flight.
    pub fn is_reporting(&self) -> bool {
        self.reporting > 0
    }

    /// How the worker ends, once the dispatcher said so and it holds nothing more.
    pub fn finished(&self) -> Option<End> {
        match self.end {
            // Every step is consumed or the job was ended: what is held or unreported is
            // moot (a report would be refused), and the dispatcher may already be gone.
            Some(End::EndOfData) => Some(End::EndOfData),
            end => end.filter(|_| self.outstanding() == 0 && !self.lease_in_flight),
        }
    }

    /// The earliest time at which [`Self::next_lease`], [`Self::next_step`] or
    /// [`Self::next_report`] may change its answer without any other input (a `Wait` ending, a
    /// queued lease expiring, a parked step's pause ending, a report falling due).
    pub fn wakeup(&self) -> Option<Instant> {
        let expiry = self.queued.iter().map(|s| s.expires).min();
        let parked = self.parked.values().map(|p| p.not_before).min();
        let report = self.report_due().filter(|_| self.reporting == 0);
        [self.lease_not_before, expiry, parked, report]
            .into_iter()
            .flatten()
            .min()
    }

    /// Steps dropped because their lease expired before delivery.
    pub fn abandoned(&self) -> u64 {
        self.abandoned
    }
}

fn ewma(old: Option<f64>, sample: f64) -> f64 {
    match old {
        Some(old) => old + EWMA_WEIGHT * (sample - old),
        None => sample,
    }
}

#[cfg(test)]
mod tests {
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
        w.step_time = Some(0.0001);
        assert_eq!(w.batch_size(), MAX_BATCH);
        // More than two batches held, with room for another under the limit.
        let held = u64::try_from(2 * k + 88).expect("small");
        w.leased(
            (0..held).map(|g| step(g, far)).collect(),
            Duration::from_millis(1),
        );
        for delivered in 1..=2 * k {
            w.next_step(t0).expect("a queued step");
            w.computed(Duration::from_micros(100));
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
                            prop_assert!(w.outstanding() + usize::try_from(max).expect("small") <= limit || w.outstanding() == 0);
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
                prop_assert!(w.outstanding() <= limit, "{} outstanding > {}", w.outstanding(), limit);
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
}
