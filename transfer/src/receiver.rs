//! The receiving side of a transfer (DWRecv): a reorder and deduplication buffer that delivers
//! whole steps in step order, with a bound on how far ahead senders may run.
//!
//! [`ReceiverState`] is a synchronous state machine: time comes in as an argument and nothing
//! blocks. [`SharedReceiver`] wraps it for threads: a blocking push that waits while the buffer
//! is full (backpressure) and a blocking pop.
//!
//! # Delivery rule
//! A step is complete when a message from every expected stage is buffered; [`ReceiverState::pop`]
//! delivers the next step (starting at the configured first step) only when it is complete,
//! so steps come out strictly in order, each exactly once.
//!
//! # Capacity
//! The buffer holds steps `next .. next + window` (where `next` is the next step to deliver),
//! partial or complete; a message for a later step is answered [`Offer::TooFarAhead`] and the
//! sender retries later, after about the time the consumer takes to move the window up to the
//! step ([`ReceiverState::retry_after`]). The next step itself is always inside the window,
//! so whichever messages are missing for it can always be accepted: a full buffer never
//! deadlocks.
//!
//! The window is bounded in steps and in bytes ([`ReceiverState::window`]): it is
//! `capacity_bytes` over the mean step's size (the [`decoded_size`] of its messages, a moving
//! average of those accepted), within [`MIN_WINDOW`] and `capacity` steps; before any message
//! arrived it is [`initial_window`]. Short steps so get a long window (a worker leases, and
//! reports, hundreds of them in one request), while large ones are held to about
//! `capacity_bytes`. A window that shrinks keeps what it holds: only later offers are
//! refused. At most `capacity` steps, `capacity × stages` messages, are buffered.
//!
//! # Metrics
//! Rates are counted over a sliding window of `rate_window` (default [`DEFAULT_RATE_WINDOW`])
//! split into [`RATE_BUCKETS`] buckets: a rate is the events in the buckets that overlap the
//! last `rate_window` (the current bucket counts up to `now`) divided by the time those buckets
//! cover (shorter just after the start). The enqueue rate counts steps becoming complete, the
//! dequeue rate steps popped. Waiting times (from a step's completion to its pop) are over all
//! delivered steps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::codec::{decoded_size, StepMessage};
use super::error::TransferError;
use super::pool::{TensorPool, DEFAULT_POOL_BYTES};

/// The default length of the rate metrics' sliding window.
pub const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(10);

/// Buckets of the rate metrics' sliding window.
pub const RATE_BUCKETS: usize = 10;

/// The shortest pause [`ReceiverState::retry_after`] asks of a sender (the answer's unit).
pub const MIN_RETRY_AFTER: Duration = Duration::from_millis(1);

/// The pause [`ReceiverState::retry_after`] asks of a sender before the consumer's rate is
/// known (nothing delivered over the rate window).
pub const MAX_RETRY_AFTER: Duration = Duration::from_millis(20);

/// The longest pause [`ReceiverState::retry_after`] computes from the consumer's rate. A
/// refused frame crosses the network again at every retry: a slow consumer's pause is its own
/// time to reach the step (at 10 ms a step, 10 steps past the window wait 100 ms and are
/// sent again once, not five times at 20 ms), bounded so that a rate that fell since it was
/// measured costs a step at most this much.
pub const LONGEST_RETRY_AFTER: Duration = Duration::from_millis(250);

/// The receiver's default bound in steps ([`ReceiverConfig::capacity`]).
pub const DEFAULT_CAPACITY: u64 = 1024;

/// The receiver's default bound in bytes ([`ReceiverConfig::capacity_bytes`]): what 64 steps
/// of 4 MiB hold, so that steps up to that size keep the 64-step window of old.
pub const DEFAULT_CAPACITY_BYTES: u64 = 256 << 20;

/// The window before any step's size is known (within `capacity`): what the dispatcher
/// assumes of a receiver that said nothing, too.
pub const INITIAL_WINDOW: u64 = 64;

/// The shortest window, however large the steps (within `capacity`): room for the next
/// steps of a few workers.
pub const MIN_WINDOW: u64 = 8;

/// Weight of a new message in the moving average of message sizes.
const SIZE_WEIGHT: f64 = 1.0 / 16.0;

/// The window of a receiver of `capacity` steps before it knows its steps' size.
pub fn initial_window(capacity: u64) -> u64 {
    capacity.min(INITIAL_WINDOW)
}

/// What a receiver accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// Messages of other jobs are rejected.
    pub job: u64,
    /// The stages whose messages together make a step complete.
    pub stages: BTreeSet<u32>,
    /// The first step to deliver; earlier steps are stale.
    pub first_step: u64,
    /// Steps buffered at most, counted from the next to deliver (see the module documentation).
    pub capacity: u64,
    /// About the most step bytes the window holds (see the module documentation).
    pub capacity_bytes: u64,
    /// The sliding window of the rate metrics.
    pub rate_window: Duration,
}

impl ReceiverConfig {
    /// A configuration with the default rate window and [`DEFAULT_CAPACITY_BYTES`].
    pub fn new(
        job: u64,
        stages: impl IntoIterator<Item = u32>,
        first_step: u64,
        capacity: u64,
    ) -> Self {
        ReceiverConfig {
            job,
            stages: stages.into_iter().collect(),
            first_step,
            capacity,
            capacity_bytes: DEFAULT_CAPACITY_BYTES,
            rate_window: DEFAULT_RATE_WINDOW,
        }
    }
}

/// The answer to an offered message.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Buffered.
    Accepted,
    /// A message of the same stage and step is already buffered; this one was dropped.
    Duplicate,
    /// The step is beyond the buffer's window: the sender must retry later (backpressure).
    TooFarAhead,
    /// The step was already delivered (or precedes the first step); dropped.
    Stale,
    /// The message does not belong here; dropped.
    Rejected(RejectReason),
    /// The receiver was closed: a newer one replaced it (the training side registered again,
    /// and the dispatcher leased every step again for the new one). Nothing is taken, and the
    /// sender must not count the step as delivered: it goes to the receiver named now.
    Closed,
}

/// Why a message was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    WrongJob {
        expected: u64,
        got: u64,
    },
    UnknownStage {
        stage: u32,
    },
    /// Messages of one step must agree on its epoch (the dispatcher maps each global step to
    /// one epoch); the first buffered message of the step sets it.
    EpochMismatch {
        step: u64,
        expected: u64,
        got: u64,
    },
}

/// A delivered step: one message from each expected stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub step: u64,
    pub epoch: u64,
    /// In increasing stage order.
    pub parts: Vec<StepMessage>,
}

/// A snapshot of a receiver's queue state, for the scheduler and for logs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiverMetrics {
    /// The next step to deliver.
    pub next_step: u64,
    /// Steps buffered, partial or complete (at most `capacity`).
    pub depth: usize,
    /// How many steps ahead of the next the receiver accepts now ([`ReceiverState::window`]).
    pub window: u64,
    /// Complete steps buffered.
    pub ready: usize,
    pub buffered_messages: usize,
    pub capacity: u64,
    /// Steps becoming complete per second over the rate window.
    pub enqueue_rate: f64,
    /// Steps popped per second over the rate window.
    pub dequeue_rate: f64,
    pub rate_window: Duration,
    /// Messages accepted since the start.
    pub accepted: u64,
    /// Steps delivered since the start.
    pub delivered: u64,
    /// Mean time from a delivered step's completion to its pop.
    pub mean_wait: Duration,
    /// Longest time from a delivered step's completion to its pop.
    pub max_wait: Duration,
    /// Messages dropped as duplicates.
    pub duplicates: u64,
    /// Messages dropped as stale.
    pub stale: u64,
    /// Offers answered [`Offer::TooFarAhead`] ([`SharedReceiver::push`] counts a push that
    /// waits once).
    pub too_far_ahead: u64,
    /// Messages rejected.
    pub rejected: u64,
}

/// A step being assembled.
#[derive(Debug)]
struct Pending {
    epoch: u64,
    /// Indexed like `ReceiverState::stages`.
    parts: Vec<Option<StepMessage>>,
    present: usize,
    completed_at: Option<Instant>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    accepted: u64,
    delivered: u64,
    duplicates: u64,
    stale: u64,
    too_far_ahead: u64,
    rejected: u64,
}

/// The receiver's state machine. See the module documentation.
#[derive(Debug)]
pub struct ReceiverState {
    config: ReceiverConfig,
    /// The expected stages, sorted.
    stages: Vec<u32>,
    next: u64,
    /// Step `u64::MAX` was delivered; nothing can follow.
    exhausted: bool,
    /// Replaced by a newer receiver: every offer is answered [`Offer::Closed`].
    closed: bool,
    pending: BTreeMap<u64, Pending>,
    ready: usize,
    buffered_messages: usize,
    /// The moving average of accepted messages' [`decoded_size`], once one was accepted.
    message_bytes: Option<f64>,
    counters: Counters,
    enqueued: RateMeter,
    dequeued: RateMeter,
    wait_total: Duration,
    wait_max: Duration,
}

impl ReceiverState {
    /// A receiver started at `now` (the origin of its rate windows).
    pub fn new(config: ReceiverConfig, now: Instant) -> Result<Self, TransferError> {
        if config.stages.is_empty() {
            return Err(TransferError::NoStages);
        }
        if config.capacity == 0 {
            return Err(TransferError::ZeroCapacity);
        }
        let meter = RateMeter::new(config.rate_window, now)?;
        Ok(ReceiverState {
            stages: config.stages.iter().copied().collect(),
            next: config.first_step,
            exhausted: false,
            closed: false,
            pending: BTreeMap::new(),
            ready: 0,
            buffered_messages: 0,
            message_bytes: None,
            counters: Counters::default(),
            enqueued: meter.clone(),
            dequeued: meter,
            wait_total: Duration::ZERO,
            wait_max: Duration::ZERO,
            config,
        })
    }

    pub fn config(&self) -> &ReceiverConfig {
        &self.config
    }

    /// The next step to deliver.
    pub fn next_step(&self) -> u64 {
        self.next
    }

    /// Steps buffered, partial or complete.
    pub fn depth(&self) -> usize {
        self.pending.len()
    }

    /// How many steps from the next one the receiver accepts now: `capacity_bytes` over the
    /// mean step's bytes, within [`MIN_WINDOW`] and `capacity` ([`initial_window`] before any
    /// message was accepted). See the module documentation.
    pub fn window(&self) -> u64 {
        let capacity = self.config.capacity;
        let Some(message) = self.message_bytes else {
            return initial_window(capacity);
        };
        let step = (message * self.stages.len() as f64).max(1.0);
        let fits = (self.config.capacity_bytes as f64 / step).floor();
        // Saturating: a float beyond u64 converts to u64::MAX, NaN to 0 (clamped below).
        #[allow(clippy::cast_possible_truncation)]
        let fits = fits as u64;
        fits.clamp(MIN_WINDOW.min(capacity), capacity)
    }

    /// Whether [`ReceiverState::pop`] would deliver a step now.
    pub fn is_ready(&self) -> bool {
        !self.exhausted
            && self
                .pending
                .first_key_value()
                .is_some_and(|(&step, p)| step == self.next && p.completed_at.is_some())
    }

    /// What [`ReceiverState::offer`] would answer for `msg`, without changing anything.
    pub fn classify(&self, msg: &StepMessage) -> Offer {
        if self.closed {
            return Offer::Closed;
        }
        if msg.job != self.config.job {
            return Offer::Rejected(RejectReason::WrongJob {
                expected: self.config.job,
                got: msg.job,
            });
        }
        let Ok(slot) = self.stages.binary_search(&msg.stage) else {
            return Offer::Rejected(RejectReason::UnknownStage { stage: msg.stage });
        };
        if self.exhausted || msg.step < self.next {
            return Offer::Stale;
        }
        if msg.step - self.next >= self.window() {
            return Offer::TooFarAhead;
        }
        match self.pending.get(&msg.step) {
            Some(p) if p.parts[slot].is_some() => Offer::Duplicate,
            Some(p) if p.epoch != msg.epoch => Offer::Rejected(RejectReason::EpochMismatch {
                step: msg.step,
                expected: p.epoch,
                got: msg.epoch,
            }),
            _ => Offer::Accepted,
        }
    }

    /// How long a sender should wait before it offers `step` again, after it was answered
    /// [`Offer::TooFarAhead`] at `now`: the time the consumer takes, at its dequeue rate over
    /// the rate window, to deliver the steps between the window's end and `step`, rounded up
    /// to whole milliseconds, within [`MIN_RETRY_AFTER`] and [`LONGEST_RETRY_AFTER`];
    /// [`MAX_RETRY_AFTER`] before any step was delivered. A fixed pause would be far too long
    /// for a fast consumer (20 ms is hundreds of short steps, so the step comes back long after
    /// the window passed it and the consumer waits for it) and too short for a slow one (the
    /// frame is refused and sent again many times).
    pub fn retry_after(&self, step: u64, now: Instant) -> Duration {
        let window_end = self.next.saturating_add(self.window());
        let pops = step.saturating_sub(window_end).saturating_add(1);
        let rate = self.dequeued.rate(now);
        if rate.is_nan() || rate <= 0.0 {
            return MAX_RETRY_AFTER;
        }
        let millis = (pops as f64 * 1000.0 / rate).ceil();
        Duration::try_from_secs_f64(millis / 1000.0)
            .unwrap_or(LONGEST_RETRY_AFTER)
            .clamp(MIN_RETRY_AFTER, LONGEST_RETRY_AFTER)
    }

    /// Offers a received message at time `now`. Only an [`Offer::Accepted`] message is kept.
    pub fn offer(&mut self, msg: StepMessage, now: Instant) -> Offer {
        let verdict = self.classify(&msg);
        self.count(verdict);
        if verdict == Offer::Accepted {
            self.insert(msg, now);
        }
        verdict
    }

    fn count(&mut self, verdict: Offer) {
        let c = &mut self.counters;
        match verdict {
            Offer::Accepted => c.accepted += 1,
            Offer::Duplicate => c.duplicates += 1,
            Offer::TooFarAhead => c.too_far_ahead += 1,
            Offer::Stale => c.stale += 1,
            Offer::Rejected(_) => c.rejected += 1,
            Offer::Closed => {}
        }
    }

    /// Refuses every later offer ([`Offer::Closed`]): a newer receiver replaced this one. What
    /// is buffered stays, and is never delivered by the new one.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Buffers a message `classify` accepted.
    fn insert(&mut self, msg: StepMessage, now: Instant) {
        let Ok(slot) = self.stages.binary_search(&msg.stage) else {
            return;
        };
        let stages = self.stages.len();
        let pending = self.pending.entry(msg.step).or_insert_with(|| Pending {
            epoch: msg.epoch,
            parts: (0..stages).map(|_| None).collect(),
            present: 0,
            completed_at: None,
        });
        let bytes = decoded_size(&msg) as f64;
        self.message_bytes = Some(match self.message_bytes {
            Some(mean) => mean + SIZE_WEIGHT * (bytes - mean),
            None => bytes,
        });
        pending.parts[slot] = Some(msg);
        pending.present += 1;
        self.buffered_messages += 1;
        if pending.present == stages {
            pending.completed_at = Some(now);
            self.ready += 1;
            self.enqueued.record(now);
        }
    }

    /// Delivers the next step if it is complete.
    pub fn pop(&mut self, now: Instant) -> Option<Step> {
        if !self.is_ready() {
            return None;
        }
        let (step, pending) = self.pending.pop_first()?;
        let completed_at = pending.completed_at.unwrap_or(now);
        let wait = now.saturating_duration_since(completed_at);
        self.wait_total = self.wait_total.saturating_add(wait);
        self.wait_max = self.wait_max.max(wait);
        self.counters.delivered += 1;
        self.ready -= 1;
        self.buffered_messages -= pending.present;
        self.dequeued.record(now);
        match self.next.checked_add(1) {
            Some(next) => self.next = next,
            None => self.exhausted = true,
        }
        Some(Step {
            step,
            epoch: pending.epoch,
            parts: pending.parts.into_iter().flatten().collect(),
        })
    }

    /// The queue state at `now`.
    /// A copy of the buffered message of `stage` for `step`, if it is here (what a later
    /// stage's worker fetches as its input).
    pub fn peek(&self, stage: u32, step: u64) -> Option<StepMessage> {
        let slot = self.stages.iter().position(|&s| s == stage)?;
        self.pending.get(&step)?.parts.get(slot)?.clone()
    }

    pub fn metrics(&self, now: Instant) -> ReceiverMetrics {
        let c = self.counters;
        let mean_wait = if c.delivered == 0 {
            Duration::ZERO
        } else {
            let nanos = self.wait_total.as_nanos() / u128::from(c.delivered);
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        };
        ReceiverMetrics {
            next_step: self.next,
            depth: self.pending.len(),
            window: self.window(),
            ready: self.ready,
            buffered_messages: self.buffered_messages,
            capacity: self.config.capacity,
            enqueue_rate: self.enqueued.rate(now),
            dequeue_rate: self.dequeued.rate(now),
            rate_window: self.config.rate_window,
            accepted: c.accepted,
            delivered: c.delivered,
            mean_wait,
            max_wait: self.wait_max,
            duplicates: c.duplicates,
            stale: c.stale,
            too_far_ahead: c.too_far_ahead,
            rejected: c.rejected,
        }
    }
}

/// Events per second over a sliding window of [`RATE_BUCKETS`] buckets.
#[derive(Debug, Clone)]
struct RateMeter {
    start: Instant,
    bucket: Duration,
    /// (bucket index since `start`, events in it), at `index % RATE_BUCKETS`.
    slots: [(u64, u64); RATE_BUCKETS],
    /// The latest bucket index seen: time never goes back for the meter.
    latest: u64,
}

impl RateMeter {
    fn new(window: Duration, start: Instant) -> Result<Self, TransferError> {
        let buckets = u32::try_from(RATE_BUCKETS).unwrap_or(u32::MAX);
        let bucket = window / buckets;
        if bucket.is_zero() {
            return Err(TransferError::RateWindowTooShort { window });
        }
        Ok(RateMeter {
            start,
            bucket,
            slots: [(0, 0); RATE_BUCKETS],
            latest: 0,
        })
    }

    fn index(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_nanos();
        let index = u64::try_from(elapsed / self.bucket.as_nanos()).unwrap_or(u64::MAX);
        index.max(self.latest)
    }

    fn record(&mut self, now: Instant) {
        let index = self.index(now);
        self.latest = index;
        let slot = &mut self.slots[slot_of(index)];
        if slot.0 != index {
            *slot = (index, 0);
        }
        slot.1 += 1;
    }

    fn rate(&self, now: Instant) -> f64 {
        let index = self.index(now);
        let oldest = index.saturating_sub(len_u64(RATE_BUCKETS) - 1);
        let events: u64 = self
            .slots
            .iter()
            .filter(|(i, _)| (oldest..=index).contains(i))
            .map(|&(_, n)| n)
            .sum();
        // Nanoseconds from the start of the oldest bucket counted to `now`.
        let elapsed = now.saturating_duration_since(self.start).as_nanos();
        let span =
            elapsed.saturating_sub(self.bucket.as_nanos().saturating_mul(u128::from(oldest)));
        if span == 0 {
            return 0.0;
        }
        events as f64 / (span as f64 / 1e9)
    }
}

fn slot_of(index: u64) -> usize {
    usize::try_from(index % len_u64(RATE_BUCKETS)).unwrap_or(0)
}

fn len_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A [`ReceiverState`] shared between threads (the transport's handlers push, the consumer
/// pops), on the real clock. Pushes wait while the buffer is full, so the bound on buffered
/// steps is the backpressure senders feel.
///
/// A condition variable's signal is a system call even when no one waits, so each counts its
/// waiters, and a push or a pop signals only when someone waits. The counts change and are
/// read only under the state's lock, which a waiter holds from its check to its wait: no
/// wake-up is lost.
#[derive(Debug)]
pub struct SharedReceiver {
    state: Mutex<ReceiverState>,
    /// Signalled when the window moves (a step was popped).
    not_full: Condvar,
    /// Pushes waiting on `not_full`.
    pushers_waiting: AtomicUsize,
    /// Signalled when the next step may have become complete.
    ready: Condvar,
    /// Pops waiting on `ready`.
    poppers_waiting: AtomicUsize,
    /// Memory of delivered steps the consumer gave back ([`Self::recycle`]).
    pool: TensorPool,
}

impl SharedReceiver {
    pub fn new(config: ReceiverConfig) -> Result<Self, TransferError> {
        Ok(SharedReceiver {
            state: Mutex::new(ReceiverState::new(config, Instant::now())?),
            not_full: Condvar::new(),
            pushers_waiting: AtomicUsize::new(0),
            ready: Condvar::new(),
            poppers_waiting: AtomicUsize::new(0),
            pool: TensorPool::new(DEFAULT_POOL_BYTES),
        })
    }

    /// Takes back a delivered step the consumer is done with: its tensors' memory receives
    /// later frames' values.
    pub fn recycle(&self, step: Step) {
        self.pool.give_step(step);
    }

    /// The memory [`Self::recycle`] gave back.
    pub fn pool(&self) -> &TensorPool {
        &self.pool
    }

    /// The state machine's methods never panic midway, so a lock poisoned by a panic elsewhere
    /// still guards a consistent state.
    fn lock(&self) -> MutexGuard<'_, ReceiverState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Offers `msg`, waiting up to `timeout` while its step is too far ahead. Returns the final
    /// answer: [`Offer::TooFarAhead`] only if the timeout passed (the message is dropped; the
    /// sender retries).
    pub fn push(&self, msg: StepMessage, timeout: Duration) -> Offer {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.lock();
        let mut waited = false;
        loop {
            let now = Instant::now();
            if state.classify(&msg) != Offer::TooFarAhead {
                let verdict = state.offer(msg, now);
                if state.is_ready() && self.poppers_waiting.load(Ordering::Relaxed) > 0 {
                    self.ready.notify_all();
                }
                return verdict;
            }
            if !waited {
                state.count(Offer::TooFarAhead);
                waited = true;
            }
            state = match wait(&self.not_full, &self.pushers_waiting, state, deadline, now) {
                Some(state) => state,
                None => return Offer::TooFarAhead,
            };
        }
    }

    /// Closes the receiver (see [`ReceiverState::close`]); a push waiting for room is answered
    /// [`Offer::Closed`] at once.
    pub fn close(&self) {
        self.lock().close();
        self.not_full.notify_all();
    }

    /// Offers `msg` without waiting ([`Self::try_push_all`] of one message).
    pub fn try_push(&self, msg: StepMessage) -> Offer {
        // One message gets one answer.
        self.try_push_all([msg]).pop().unwrap_or(Offer::TooFarAhead)
    }

    /// Offers `msgs` in order without waiting, as [`Self::try_push`] offers each, under one
    /// lock and with at most one signal to a waiting pop: a burst's frames cost the consumer
    /// one wake-up, not one each. Stops after the first [`Offer::Rejected`] or
    /// [`Offer::Closed`] (the sender's connection ends there): the answers are those of the
    /// messages offered, in order, and the rest are dropped unoffered.
    pub fn try_push_all(&self, msgs: impl IntoIterator<Item = StepMessage>) -> Vec<Offer> {
        let mut state = self.lock();
        let now = Instant::now();
        let mut offers = Vec::new();
        for msg in msgs {
            let offer = if state.classify(&msg) == Offer::TooFarAhead {
                state.count(Offer::TooFarAhead);
                Offer::TooFarAhead
            } else {
                state.offer(msg, now)
            };
            let last = matches!(offer, Offer::Rejected(_) | Offer::Closed);
            offers.push(offer);
            if last {
                break;
            }
        }
        if state.is_ready() && self.poppers_waiting.load(Ordering::Relaxed) > 0 {
            self.ready.notify_all();
        }
        offers
    }

    /// See [`ReceiverState::retry_after`], now.
    pub fn retry_after(&self, step: u64) -> Duration {
        self.lock().retry_after(step, Instant::now())
    }

    /// Delivers the next step, waiting up to `timeout` for it to be complete.
    pub fn pop(&self, timeout: Duration) -> Option<Step> {
        let deadline = Instant::now().checked_add(timeout);
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            if let Some(step) = state.pop(now) {
                if self.pushers_waiting.load(Ordering::Relaxed) > 0 {
                    self.not_full.notify_all();
                }
                return Some(step);
            }
            state = wait(&self.ready, &self.poppers_waiting, state, deadline, now)?;
        }
    }

    /// Delivers the next step if it is complete, without waiting.
    /// See [`ReceiverState::peek`].
    pub fn peek(&self, stage: u32, step: u64) -> Option<StepMessage> {
        self.lock().peek(stage, step)
    }

    pub fn try_pop(&self) -> Option<Step> {
        self.pop(Duration::ZERO)
    }

    /// The queue state now.
    pub fn metrics(&self) -> ReceiverMetrics {
        self.lock().metrics(Instant::now())
    }

    /// The next step to deliver.
    pub fn next_step(&self) -> u64 {
        self.lock().next_step()
    }

    /// How many steps from the next one it accepts now ([`ReceiverState::window`]).
    pub fn window(&self) -> u64 {
        self.lock().window()
    }
}

/// Waits on `signal` until `deadline` (forever when `None`), counted in `waiters` for as long
/// as the wait lasts (see [`SharedReceiver`]). None, without waiting, once the deadline has
/// passed at `now`.
fn wait<'a>(
    signal: &Condvar,
    waiters: &AtomicUsize,
    state: MutexGuard<'a, ReceiverState>,
    deadline: Option<Instant>,
    now: Instant,
) -> Option<MutexGuard<'a, ReceiverState>> {
    let left = deadline.map(|d| d.saturating_duration_since(now));
    if left.is_some_and(|left| left.is_zero()) {
        return None;
    }
    waiters.fetch_add(1, Ordering::Relaxed);
    let state = match left {
        None => signal.wait(state).unwrap_or_else(PoisonError::into_inner),
        Some(left) => {
            signal
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0
        }
    };
    waiters.fetch_sub(1, Ordering::Relaxed);
    Some(state)
}

#[cfg(test)]
#[path = "receiver_tests.rs"]
mod tests;
