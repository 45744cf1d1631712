//! The data worker's core: which steps it holds and what to do next, as a synchronous state
//! machine with time passed in (like the dispatcher's `DispatcherState` and the receiver's
//! `ReceiverState`). The async shell in [`crate::worker`] performs what it says (lease and
//! report RPCs, the stage run, the push) and tells it what came of each.
//!
//! # Rules
//! - **The lease limit.** A step counts against the worker's `max_leases` from its lease until
//!   the dispatcher answered the report that completes it (the dispatcher counts it until then
//!   too), so [`WorkerState::next_lease`] never asks for more than the room left: never more
//!   than the limit outstanding, but for the one step of "Nothing waits on a lost step".
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
//! - **Nothing waits on a lost step.** When every step the worker holds is parked (the
//!   receiver's window is full) and it has no room to lease, it still asks for one step, at
//!   the dispatcher's pace: the window may be waiting for a step a lost worker held, which
//!   the dispatcher has taken back and grants beyond a worker's share (and only such a
//!   step), one at most (never more than the limit and one outstanding). Otherwise every
//!   worker would sit on parked steps until its leases expired.
//! - **A slow worker holds little.** A worker holds at most what it computes in
//!   [`HOLD_HORIZON`] at its measured step time ([`WorkerState::held_limit`]), so a
//!   straggler's steps are not the ones the training side waits for.
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

/// About the most work, in the worker's own measured step time, that it holds at once (see
/// [`WorkerState::held_limit`]): a slow worker (a throttled CPU, a busy host) holds few steps,
/// so that the training side, which needs steps in order, never waits long on one that sits
/// in a slow worker's queue while its peers could have computed it.
pub const HOLD_HORIZON: Duration = Duration::from_millis(150);

/// The fewest steps [`WorkerState::held_limit`] allows: one computing and one leased ahead,
/// so that a slow step never waits for a lease round trip.
pub const MIN_HELD: usize = 2;

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
    /// Steps the lease request in flight asked for beyond the limit: 1 when everything held
    /// was parked (see the module docs), else 0.
    beyond: usize,
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
            beyond: 0,
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

    /// The steps the worker lets itself hold now: the dispatcher's limit, and at most what it
    /// computes in [`HOLD_HORIZON`] at its measured step time (at least [`MIN_HELD`]). A
    /// worker 4x slower than its peers then holds a quarter as many steps, and the ones it
    /// holds are done about as soon as theirs.
    pub fn held_limit(&self) -> usize {
        let Some(step) = self.step_time.filter(|t| *t > 0.0) else {
            return self.max_leases;
        };
        let steps = HOLD_HORIZON.as_secs_f64() / step;
        if !steps.is_finite() || steps >= self.max_leases as f64 {
            return self.max_leases;
        }
        // Below max_leases (a usize): the conversion cannot truncate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let steps = steps.ceil() as usize;
        steps.max(MIN_HELD).min(self.max_leases)
    }

    /// The dispatcher's lease limit for this worker changed (its share of the training side's
    /// window, which changes as workers join and leave): steps held past a lower limit stay,
    /// and the worker leases again once it holds fewer.
    pub fn set_max_leases(&mut self, max_leases: u32) {
        self.max_leases = usize::try_from(max_leases.max(1)).unwrap_or(usize::MAX);
    }

    /// Whether every step held waits on the receiver's window (parked), none to run or send.
    fn all_parked(&self) -> bool {
        !self.parked.is_empty()
            && self.queued.is_empty()
            && self.running.is_empty()
            && self.pushing.is_empty()
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
        let cap = u32::try_from(self.held_limit() / 2)
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
                .held_limit()
                .saturating_sub(outstanding.saturating_sub(freed));
            let k = usize::try_from(self.batch_size()).unwrap_or(1);
            if room == 0 && self.all_parked() && outstanding <= self.max_leases {
                // Everything held waits for the receiver's window, which waits for a step
                // someone else held (a lost worker's, returned to the dispatcher): ask for
                // one more, which the dispatcher grants beyond the share only when it is
                // such a returned step, and otherwise answers with a pause. One at most:
                // never more than the limit and one outstanding.
                self.lease_in_flight = true;
                self.lease_not_before = None;
                self.beyond = 1;
                return Some(1);
            }
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
        let limit = self.max_leases + std::mem::take(&mut self.beyond);
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
            if self.outstanding() < limit {
                self.queued.insert(at, step);
            }
        }
    }

    /// Nothing to lease now: ask again after `retry_after`.
    pub fn wait(&mut self, retry_after: Duration, now: Instant) {
        self.lease_in_flight = false;
        self.beyond = 0;
        self.lease_not_before = Some(now + retry_after);
    }

    /// The lease request failed in a way the shell retries: ask again after `retry_after`.
    pub fn lease_failed(&mut self, retry_after: Duration, now: Instant) {
        self.wait(retry_after, now);
    }

    /// The dispatcher answered end of data or drained: lease nothing more.
    pub fn ended(&mut self, end: End) {
        self.lease_in_flight = false;
        self.beyond = 0;
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
            || (self.queued.len() < k && self.held_limit().saturating_sub(self.outstanding()) < k)
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
#[path = "worker_state_tests.rs"]
mod tests;
