//! TensorFlow's element order, computed on record indices.
//!
//! A `tf.data` pipeline's order depends only on positions and on its random streams, never on
//! the records' contents, as long as every op between the reader and the iterator is one of
//! skip, take, repeat, shuffle and batch (maps are record-wise and do not count). [`IndexChain`]
//! holds those ops as the program wrote them; the walk below runs them on record numbers
//! `0..records` exactly as TensorFlow 2.18's kernels run them on records:
//!
//! - every op makes a new iterator of its input where TensorFlow's does (a `repeat` one per
//!   pass, a shuffle one per iterator of its own), so that each shuffle's seed generator is
//!   asked for seeds as often and in the same order;
//! - a shuffle iterator takes its seeds from the op's [`SeedGenerator`] when it is made, fills
//!   its buffer up to `buffer_size` before every draw, draws `u32 % len` from its Philox stream,
//!   yields that slot and moves the oldest element into it (TensorFlow's ring buffer, written
//!   as a deque: a slot's position is its distance from the oldest element either way);
//! - batch groups consecutive elements, the short last one kept unless `drop_remainder`.
//!
//! The dispatcher's epochs are the passes of a trailing `repeat`: the chain stored in the
//! config stops before it, and `epochs` counts its passes. A pass starts from the seed
//! generators advanced by one iterator per earlier pass, so any epoch can be started without
//! walking the ones before; a chain with a `repeat` inside it is one long epoch.
//!
//! Memory: a walk holds each shuffle's buffer (8 bytes a slot for a shuffle of records, 24 for
//! one of batches, plus the batches' records) and nothing that grows with the dataset; [`StepOrder`]
//! also keeps the batches it computed but the training side has not consumed, up to
//! [`MAX_CACHED_RECORDS`] record numbers.

use std::collections::{BTreeMap, VecDeque};

use lode_proto::plan::IndexOp;
use lode_proto::step::{steps_per_epoch, StepRef};
use serde::{Deserialize, Serialize};

use crate::philox::{Samples, SeedGenerator};

/// Record numbers [`StepOrder`] keeps of computed, unconsumed steps (32 MiB). A step evicted
/// and asked for again is recomputed from the start of its epoch.
pub const MAX_CACHED_RECORDS: usize = 1 << 22;

/// The dataset ops of one epoch, as the program wrote them, and the seed Lode picked for
/// shuffles the program left unseeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexChain {
    pub ops: Vec<IndexOp>,
    /// Seeds the shuffles whose seeds are both 0 (TensorFlow seeds those at random, so its own
    /// order is not reproducible either); picked once per job and kept in the journal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub picked_seed: Option<u64>,
}

/// The seed Lode picked for the unseeded shuffles of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PickedSeed {
    pub seed: u64,
    /// Given (read back from a journal of an earlier run) rather than picked now at random.
    pub recorded: bool,
}

/// 64 random bits from the standard library's per-process hash keys and the clock.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// Why an [`IndexChain`] cannot be walked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainError {
    pub op: usize,
    pub reason: String,
}

impl std::fmt::Display for ChainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "op {}: {}", self.op, self.reason)
    }
}

/// An op of a checked chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `None`: skip everything.
    Skip(Option<u64>),
    /// `None`: take everything.
    Take(Option<u64>),
    /// `None`: forever.
    Repeat(Option<u64>),
    Shuffle {
        buffer: u64,
        seed: u64,
        seed2: u64,
        reshuffle: bool,
    },
    Batch {
        size: u64,
        drop_remainder: bool,
    },
}

/// How many elements a count argument means: -1 is "all" (None), other negatives are refused.
fn count(op: usize, name: &str, value: i64) -> Result<Option<u64>, ChainError> {
    match value {
        -1 => Ok(None),
        v => u64::try_from(v).map(Some).map_err(|_| ChainError {
            op,
            reason: format!("{name} {v} is negative (only -1, meaning all, is)"),
        }),
    }
}

/// The seeds of the shuffle at `index` when the program gave none: two words derived from
/// the picked seed and the op's position (SplitMix64's output function).
fn picked_seeds(picked: u64, index: usize) -> (u64, u64) {
    let base =
        picked ^ (u64::try_from(index).unwrap_or(u64::MAX)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mix64(base ^ 0x5EED_0001), mix64(base ^ 0x5EED_0002))
}

fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A checked chain: what the walk runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    records: u64,
    ops: Vec<Op>,
}

impl IndexChain {
    /// One epoch's chain and the epochs, from the ops as the program wrote them: a trailing
    /// `repeat` (with no other repeat before it) gives the epochs (-1: forever), and the
    /// chain stops before it; `epochs` (`--epochs`) overrides that count, standing for a
    /// trailing repeat. A chain that repeats inside is one epoch whatever `epochs` says; a
    /// chain without a repeat reads the data once unless `epochs` says otherwise.
    pub fn from_program(ops: &[IndexOp], epochs: Option<u64>) -> (IndexChain, Option<u64>) {
        let chain = |ops: &[IndexOp]| IndexChain {
            ops: ops.to_vec(),
            picked_seed: None,
        };
        match ops.split_last() {
            Some((IndexOp::Repeat { count }, rest))
                if !rest.iter().any(|op| matches!(op, IndexOp::Repeat { .. })) =>
            {
                (chain(rest), epochs.or(u64::try_from(*count).ok()))
            }
            _ if ops.iter().any(|op| matches!(op, IndexOp::Repeat { .. })) => (chain(ops), Some(1)),
            _ => (chain(ops), epochs.or(Some(1))),
        }
    }

    /// Seeds the unseeded shuffles, when there are any and no seed is set yet: with
    /// `recorded` (a seed kept from an earlier run), else a new random one.
    pub fn pick_seed(&mut self, recorded: Option<u64>) -> Option<PickedSeed> {
        if !self.needs_picked_seed() || self.picked_seed.is_some() {
            return None;
        }
        let picked = PickedSeed {
            seed: recorded.unwrap_or_else(random_seed),
            recorded: recorded.is_some(),
        };
        self.picked_seed = Some(picked.seed);
        Some(picked)
    }

    /// Whether a shuffle of the chain has no seed of its own.
    pub fn needs_picked_seed(&self) -> bool {
        self.ops.iter().any(|op| {
            matches!(
                op,
                IndexOp::Shuffle {
                    seed: 0,
                    seed2: 0,
                    ..
                }
            )
        })
    }

    /// Whether the chain repeats inside an epoch (then the job is one long epoch).
    pub fn repeats(&self) -> bool {
        self.ops
            .iter()
            .any(|op| matches!(op, IndexOp::Repeat { .. }))
    }

    pub(crate) fn plan(&self, records: u64) -> Result<Plan, ChainError> {
        let mut ops = Vec::with_capacity(self.ops.len());
        let mut batched = false;
        for (i, op) in self.ops.iter().enumerate() {
            ops.push(match *op {
                IndexOp::Skip { count: c } => Op::Skip(count(i, "skip count", c)?),
                IndexOp::Take { count: c } => Op::Take(count(i, "take count", c)?),
                IndexOp::Repeat { count: c } => Op::Repeat(count(i, "repeat count", c)?),
                IndexOp::Shuffle {
                    buffer_size,
                    seed,
                    seed2,
                    reshuffle_each_iteration,
                } => {
                    let buffer = u64::try_from(buffer_size)
                        .ok()
                        .filter(|b| *b > 0)
                        .ok_or_else(|| ChainError {
                            op: i,
                            reason: format!(
                                "shuffle buffer_size {buffer_size} is not positive (Lode does not \
                                 reproduce tf.data.UNKNOWN_CARDINALITY buffers)"
                            ),
                        })?;
                    let (seed, seed2) = if seed == 0 && seed2 == 0 {
                        let picked = self.picked_seed.ok_or_else(|| ChainError {
                            op: i,
                            reason: "the shuffle is unseeded and no seed was picked for it".into(),
                        })?;
                        picked_seeds(picked, i)
                    } else {
                        (seed.cast_unsigned(), seed2.cast_unsigned())
                    };
                    Op::Shuffle {
                        buffer,
                        seed,
                        seed2,
                        reshuffle: reshuffle_each_iteration,
                    }
                }
                IndexOp::Batch {
                    batch_size,
                    drop_remainder,
                } => {
                    if batched {
                        return Err(ChainError {
                            op: i,
                            reason: "a batch of batches is not supported".into(),
                        });
                    }
                    batched = true;
                    let size = u64::try_from(batch_size)
                        .ok()
                        .filter(|b| *b > 0)
                        .ok_or_else(|| ChainError {
                            op: i,
                            reason: format!("batch_size {batch_size} is not positive"),
                        })?;
                    Op::Batch {
                        size,
                        drop_remainder,
                    }
                }
            });
        }
        Ok(Plan { records, ops })
    }
}

impl Plan {
    /// Elements of one epoch; `None` when it never ends.
    pub(crate) fn len(&self) -> Option<u64> {
        let mut n = Some(self.records);
        for op in &self.ops {
            n = match (*op, n) {
                (Op::Skip(None), _) => Some(0),
                (Op::Skip(Some(k)), n) => n.map(|n| n.saturating_sub(k)),
                (Op::Take(None), n) => n,
                (Op::Take(Some(k)), n) => Some(n.map_or(k, |n| n.min(k))),
                (Op::Repeat(_), Some(0)) | (Op::Repeat(Some(0)), _) => Some(0),
                (Op::Repeat(None), _) | (Op::Repeat(Some(_)), None) => None,
                (Op::Repeat(Some(k)), Some(n)) => Some(n.saturating_mul(k)),
                (Op::Shuffle { .. }, n) => n,
                (
                    Op::Batch {
                        size,
                        drop_remainder,
                    },
                    Some(n),
                ) => Some(if drop_remainder {
                    n / size
                } else {
                    n.div_ceil(size)
                }),
                (Op::Batch { .. }, None) => None,
            };
        }
        n
    }

    /// The most records one element holds.
    pub(crate) fn max_records_per_element(&self) -> u64 {
        self.ops
            .iter()
            .find_map(|op| match op {
                Op::Batch { size, .. } => Some(*size),
                _ => None,
            })
            .unwrap_or(1)
    }

    /// A walk over epoch `epoch`: each shuffle's generator is advanced past the one iterator
    /// per earlier epoch it made (a chain without an inner repeat makes exactly one).
    pub(crate) fn walk(&self, epoch: u64) -> Walk {
        let mut cx = Context {
            ops: self.ops.clone(),
            records: self.records,
            gens: self.generators(epoch),
        };
        let top = Iter::make(&mut cx, self.ops.len());
        Walk { cx, top }
    }

    /// Each shuffle's seed generator (by op position) as it stands when epoch `epoch` begins.
    pub(crate) fn generators(&self, epoch: u64) -> Vec<Option<SeedGenerator>> {
        let mut gens: Vec<Option<SeedGenerator>> = self
            .ops
            .iter()
            .map(|op| match *op {
                Op::Shuffle {
                    seed,
                    seed2,
                    reshuffle,
                    ..
                } => Some(SeedGenerator::new(seed, seed2, reshuffle)),
                _ => None,
            })
            .collect();
        for g in gens.iter_mut().flatten() {
            g.skip_iterators(epoch);
        }
        gens
    }
}

/// One element of the stream: a record, or a batch of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Elem {
    Record(u64),
    Batch(Box<[u64]>),
}

impl Elem {
    pub(crate) fn into_records(self) -> Vec<u64> {
        match self {
            Elem::Record(r) => vec![r],
            Elem::Batch(b) => b.into_vec(),
        }
    }
}

/// An iterator of the chain's first `level` ops (level 0: the records).
#[derive(Debug, Clone)]
enum Iter {
    Empty,
    Records {
        next: u64,
        end: u64,
    },
    Skip {
        input: Box<Iter>,
        left: u64,
    },
    Take {
        input: Box<Iter>,
        left: Option<u64>,
    },
    Repeat {
        level: usize,
        input: Option<Box<Iter>>,
        /// Passes begun.
        begun: u64,
        count: Option<u64>,
        /// Whether the current pass yielded anything (an empty input ends a forever repeat).
        yielded: bool,
    },
    Shuffle(Box<ShuffleIter>),
    Batch {
        input: Box<Iter>,
        size: u64,
        drop_remainder: bool,
    },
}

#[derive(Debug, Clone)]
struct ShuffleIter {
    level: usize,
    input: Option<Iter>,
    exhausted: bool,
    capacity: u64,
    buffer: Buffer,
    samples: Samples,
    /// Samples drawn from `samples` ahead of their use, in stream order (see `LOOKAHEAD`).
    ahead: VecDeque<u32>,
}

/// Draws a shuffle of records takes from its stream at once, ahead of use. A draw's slot does
/// not depend on the buffer's contents, only on its length, which stays `buffer_size` while the
/// input lasts; so the slots of the next `LOOKAHEAD` draws are known, and reading them together
/// lets the memory system fetch them in parallel rather than one random slot of a large buffer
/// after another. The order is unchanged: every draw is used in stream order, modulo the
/// buffer's true length at its turn.
const LOOKAHEAD: usize = 32;

/// A shuffle buffer: record numbers alone (8 bytes a slot) before any batch, else elements.
#[derive(Debug, Clone)]
enum Buffer {
    Records(VecDeque<u64>),
    Elems(VecDeque<Elem>),
}

impl Buffer {
    fn len(&self) -> usize {
        match self {
            Buffer::Records(b) => b.len(),
            Buffer::Elems(b) => b.len(),
        }
    }

    fn push(&mut self, e: Elem) {
        match e {
            Elem::Record(r) => match self {
                Buffer::Records(b) => b.push_back(r),
                Buffer::Elems(b) => b.push_back(Elem::Record(r)),
            },
            Elem::Batch(batch) => {
                // Not reached: a buffer of records is made only where no batch comes first.
                if let Buffer::Records(b) = self {
                    *self = Buffer::Elems(b.drain(..).map(Elem::Record).collect());
                }
                if let Buffer::Elems(b) = self {
                    b.push_back(Elem::Batch(batch));
                }
            }
        }
    }

    /// Yields slot `pick` and moves the oldest element into it.
    fn take(&mut self, pick: usize) -> Option<Elem> {
        match self {
            Buffer::Records(b) => {
                b.swap(0, pick);
                b.pop_front().map(Elem::Record)
            }
            Buffer::Elems(b) => {
                b.swap(0, pick);
                b.pop_front()
            }
        }
    }
}

/// Buffer slots reserved up front, at most (a larger buffer grows as it fills).
const RESERVE_SLOTS: u64 = 1 << 20;

impl Iter {
    /// A new iterator of the first `level` ops, made as TensorFlow makes it (inputs first;
    /// a shuffle takes its seeds now).
    fn make(cx: &mut Context, level: usize) -> Iter {
        let Some(op) = level.checked_sub(1).map(|i| cx.ops[i]) else {
            return Iter::Records {
                next: 0,
                end: cx.records,
            };
        };
        let input = |cx: &mut Context| Box::new(Iter::make(cx, level - 1));
        match op {
            Op::Skip(None) | Op::Take(Some(0)) | Op::Repeat(Some(0)) => Iter::Empty,
            Op::Skip(Some(left)) => Iter::Skip {
                input: input(cx),
                left,
            },
            Op::Take(left) => Iter::Take {
                input: input(cx),
                left,
            },
            Op::Repeat(count) => Iter::Repeat {
                level,
                input: None,
                begun: 0,
                count,
                yielded: false,
            },
            Op::Shuffle { buffer, .. } => {
                let reserve = usize::try_from(buffer.min(RESERVE_SLOTS)).unwrap_or(0);
                let batched = cx.ops[..level - 1]
                    .iter()
                    .any(|op| matches!(op, Op::Batch { .. }));
                let (seed, seed2) = cx.gens[level - 1]
                    .as_mut()
                    .map_or((0, 0), SeedGenerator::generate);
                Iter::Shuffle(Box::new(ShuffleIter {
                    level,
                    input: None,
                    exhausted: false,
                    capacity: buffer,
                    buffer: if batched {
                        Buffer::Elems(VecDeque::with_capacity(reserve))
                    } else {
                        Buffer::Records(VecDeque::with_capacity(reserve))
                    },
                    samples: Samples::new(seed, seed2),
                    ahead: VecDeque::with_capacity(2 * LOOKAHEAD + 1),
                }))
            }
            Op::Batch {
                size,
                drop_remainder,
            } => Iter::Batch {
                input: input(cx),
                size,
                drop_remainder,
            },
        }
    }

    fn next(&mut self, cx: &mut Context) -> Option<Elem> {
        match self {
            Iter::Empty => None,
            Iter::Records { next, end } => {
                if next < end {
                    *next += 1;
                    Some(Elem::Record(*next - 1))
                } else {
                    None
                }
            }
            Iter::Skip { input, left } => {
                while *left > 0 {
                    input.next(cx)?;
                    *left -= 1;
                }
                input.next(cx)
            }
            Iter::Take { input, left } => match left {
                Some(0) => None,
                Some(n) => {
                    let e = input.next(cx)?;
                    *n -= 1;
                    Some(e)
                }
                None => input.next(cx),
            },
            Iter::Repeat {
                level,
                input,
                begun,
                count,
                yielded,
            } => loop {
                if input.is_none() {
                    if count.is_some_and(|c| *begun >= c) {
                        return None;
                    }
                    *begun += 1;
                    *yielded = false;
                    *input = Some(Box::new(Iter::make(cx, *level - 1)));
                }
                if let Some(e) = input.as_mut().and_then(|i| i.next(cx)) {
                    *yielded = true;
                    return Some(e);
                }
                *input = None;
                if count.is_none() && !*yielded {
                    return None;
                }
            },
            Iter::Shuffle(s) => s.next(cx),
            Iter::Batch {
                input,
                size,
                drop_remainder,
            } => {
                let mut batch =
                    Vec::with_capacity(usize::try_from(*size).unwrap_or(0).min(1 << 16));
                while u64::try_from(batch.len()).is_ok_and(|n| n < *size) {
                    match input.next(cx) {
                        Some(Elem::Record(r)) => batch.push(r),
                        Some(Elem::Batch(b)) => batch.extend_from_slice(&b),
                        None => break,
                    }
                }
                let full = u64::try_from(batch.len()).is_ok_and(|n| n == *size);
                if batch.is_empty() || (*drop_remainder && !full) {
                    None
                } else {
                    Some(Elem::Batch(batch.into_boxed_slice()))
                }
            }
        }
    }
}

impl ShuffleIter {
    fn next(&mut self, cx: &mut Context) -> Option<Elem> {
        while !self.exhausted && u64::try_from(self.buffer.len()).is_ok_and(|n| n < self.capacity) {
            let input = self
                .input
                .get_or_insert_with(|| Iter::make(cx, self.level - 1));
            match input.next(cx) {
                Some(e) => self.buffer.push(e),
                None => {
                    self.exhausted = true;
                    self.input = None;
                }
            }
        }
        let len = u64::try_from(self.buffer.len()).ok().filter(|n| *n > 0)?;
        self.draw_ahead(len);
        let sample = self.ahead.pop_front()?;
        let pick = usize::try_from(u64::from(sample) % len).ok()?;
        self.buffer.take(pick)
    }

    /// Keeps samples drawn ahead of use: for a large buffer of records, between `LOOKAHEAD`
    /// and twice that many, and reads the slots the new ones will pick (a draw `q` places
    /// ahead picks `sample % len` of a buffer whose front has moved `q` places: today's slot
    /// `q + sample % len`), so that those slots are in cache `LOOKAHEAD` draws before their
    /// turn. Other buffers draw one sample at a time, when none is left.
    fn draw_ahead(&mut self, len: u64) {
        let large = match &self.buffer {
            Buffer::Records(b) => !self.exhausted && b.len() >= 1 << 16,
            Buffer::Elems(_) => false,
        };
        if !large {
            if self.ahead.is_empty() {
                self.ahead.push_back(self.samples.next_u32());
            }
            return;
        }
        if self.ahead.len() > LOOKAHEAD {
            return;
        }
        // Draw first, then read: the reads form one short loop of independent loads, which the
        // processor overlaps; interleaved with the generator's arithmetic they would not be.
        let pending = self.ahead.len();
        let mut slots = [0usize; LOOKAHEAD];
        for (d, slot) in slots.iter_mut().enumerate() {
            let sample = self.samples.next_u32();
            self.ahead.push_back(sample);
            *slot = usize::try_from(u64::from(sample) % len).map_or(0, |p| p + pending + d);
        }
        let Buffer::Records(b) = &self.buffer else {
            return;
        };
        let mut touched = 0u64;
        for slot in slots {
            touched = touched.wrapping_add(b.get(slot).copied().unwrap_or(0));
        }
        std::hint::black_box(touched);
    }
}

/// What every iterator of a walk shares: the chain, the record count and each shuffle's seed
/// generator (by op position), which lives as long as the op's dataset, across its iterators.
#[derive(Debug, Clone)]
struct Context {
    ops: Vec<Op>,
    records: u64,
    gens: Vec<Option<SeedGenerator>>,
}

/// A walk over one epoch of a chain, element by element.
#[derive(Debug, Clone)]
pub(crate) struct Walk {
    cx: Context,
    top: Iter,
}

impl Walk {
    pub(crate) fn next_elem(&mut self) -> Option<Elem> {
        self.top.next(&mut self.cx)
    }
}

/// The batches of a chain's steps, computed in order and kept until consumed: a lease of the
/// next step costs the walk from the previous one, a re-lease a lookup.
#[derive(Debug, Clone)]
pub struct StepOrder {
    plan: Plan,
    per_epoch: u64,
    /// `None`: forever.
    epochs: Option<u64>,
    cursor: Option<Cursor>,
    /// Computed steps by sequence number (`epoch · per_epoch + step`).
    cache: BTreeMap<u64, Vec<u64>>,
    cached_records: usize,
}

#[derive(Debug, Clone)]
struct Cursor {
    epoch: u64,
    /// The next step the walk yields.
    step: u64,
    walk: Walk,
}

/// The cache is derived state: two orders of the same plan are equal whatever they hold.
impl PartialEq for StepOrder {
    fn eq(&self, other: &Self) -> bool {
        self.plan == other.plan && self.per_epoch == other.per_epoch && self.epochs == other.epochs
    }
}

impl Eq for StepOrder {}

impl StepOrder {
    pub(crate) fn new(plan: Plan, per_epoch: u64, epochs: Option<u64>) -> Self {
        Self {
            plan,
            per_epoch,
            epochs,
            cursor: None,
            cache: BTreeMap::new(),
            cached_records: 0,
        }
    }

    /// The records of step `step` of `epoch`; `None` when the job has no such step.
    pub fn batch(&mut self, epoch: u64, step: u64) -> Option<Vec<u64>> {
        if self.epochs.is_some_and(|e| epoch >= e) {
            return None;
        }
        let per_epoch = steps_per_epoch(self.per_epoch).ok()?;
        let seq = StepRef::new(epoch, step, per_epoch).ok()?.global;
        if let Some(b) = self.cache.get(&seq) {
            return Some(b.clone());
        }
        let restart = self
            .cursor
            .as_ref()
            .is_none_or(|c| c.epoch != epoch || c.step > step);
        if restart {
            self.cursor = Some(Cursor {
                epoch,
                step: 0,
                walk: self.plan.walk(epoch),
            });
        }
        let cursor = self.cursor.as_mut()?;
        while cursor.step <= step {
            let records = cursor.walk.next_elem()?.into_records();
            let at = StepRef::new(epoch, cursor.step, per_epoch).ok()?.global;
            cursor.step += 1;
            self.cached_records += records.len();
            self.cache.insert(at, records);
        }
        while self.cached_records > MAX_CACHED_RECORDS && self.cache.len() > 1 {
            if let Some((_, b)) = self.cache.pop_first() {
                self.cached_records -= b.len();
            }
        }
        self.cache.get(&seq).cloned()
    }

    /// Drops the computed steps at or below sequence number `seq` (consumed: never leased again).
    pub(crate) fn forget_through(&mut self, seq: u64) {
        let keep = self.cache.split_off(&(seq.saturating_add(1)));
        for b in std::mem::replace(&mut self.cache, keep).values() {
            self.cached_records -= b.len();
        }
    }
}

#[cfg(test)]
mod tests;
