//! Deterministic index batches: `(epoch, step)` to the record ids of that step.
//!
//! A config with a chain takes TensorFlow's order ([`crate::order`]); this module is Lode's
//! own order, used without one. Its shuffled order is a keyed pseudo-random permutation evaluated one position at a time
//! (a Feistel network on the next even power of two above the record count, with cycle
//! walking back into `0..records`). Unlike a Fisher–Yates shuffle it needs no O(records)
//! table per epoch, so a re-lease, a restart or a billion-record index costs O(batch) per step,
//! and the answer depends on nothing but the config, the seed and the step.

use crate::config::{DispatcherConfig, Shuffle};
use crate::ids::StepId;
use crate::{Error, Result};

/// The records of each step as the dispatcher leases them: a chain's order walked once, step
/// after step ([`crate::StepOrder`]), or Lode's own order computed per step. What the state
/// machine grants, and what a consumer's log is held to (`lode run`).
#[derive(Debug, Clone)]
pub struct Batches {
    config: DispatcherConfig,
    order: Option<crate::StepOrder>,
}

impl Batches {
    pub fn new(config: DispatcherConfig) -> Self {
        let order = config.step_order();
        Self { config, order }
    }

    /// The record ids of `step`; an error for a step the job does not have.
    pub fn of(&mut self, step: StepId) -> Result<Vec<u64>> {
        batch_in(&self.config, self.order.as_mut(), step)
    }
}

/// The record ids of `step` from a chain config's incremental `order`, or from Lode's own
/// order without one: the one rule [`Batches`] and the state machine follow.
pub(crate) fn batch_in(
    config: &DispatcherConfig,
    order: Option<&mut crate::StepOrder>,
    step: StepId,
) -> Result<Vec<u64>> {
    match order {
        Some(order) => order
            .batch(config.order_epoch(step.epoch.0), step.step.0)
            .ok_or(Error::StepOutOfRange { step }),
        None => index_batch(config, step),
    }
}

/// The record ids of `id`, in the order the training side sees them.
///
/// A short last batch is emitted unless `drop_remainder` is set, in which case that step does
/// not exist. Errors for a step outside the configured epochs.
///
/// With a chain this walks its epoch from the start: the dispatcher itself keeps a
/// [`crate::StepOrder`] instead, which walks each step once.
pub fn index_batch(config: &DispatcherConfig, id: StepId) -> Result<Vec<u64>> {
    let out_of_range = || Error::StepOutOfRange { step: id };
    let per_epoch = config.steps_per_epoch();
    if id.step.0 >= per_epoch || config.epochs.is_some_and(|e| id.epoch.0 >= e) {
        return Err(out_of_range());
    }
    let epoch = config.order_epoch(id.epoch.0);
    if let Some(mut order) = config.step_order() {
        return order.batch(epoch, id.step.0).ok_or_else(out_of_range);
    }
    let start = id
        .step
        .0
        .checked_mul(config.batch_size)
        .ok_or_else(out_of_range)?;
    let end = start.saturating_add(config.batch_size).min(config.records);
    Ok(match config.shuffle {
        Shuffle::Off => (start..end).collect(),
        Shuffle::Seeded { seed } => {
            let perm = Permutation::new(config.records, seed, epoch);
            (start..end).map(|p| perm.at(p)).collect()
        }
    })
}

const ROUNDS: usize = 6;

/// A bijection on `0..n` chosen by `(seed, epoch)`.
#[derive(Debug, Clone)]
pub(crate) struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

impl Permutation {
    pub(crate) fn new(n: u64, seed: u64, epoch: u64) -> Self {
        let bits = if n <= 1 {
            0
        } else {
            u64::BITS - (n - 1).leading_zeros()
        };
        let half_bits = bits.div_ceil(2).max(1);
        let mut rng = SplitMix64::new(seed ^ mix64(epoch.wrapping_add(0xD1B5_4A32_D192_ED03)));
        let mut keys = [0; ROUNDS];
        for key in &mut keys {
            *key = rng.next_u64();
        }
        Self { n, half_bits, keys }
    }

    /// The record at position `p` (`p < n`); positions outside return themselves.
    pub(crate) fn at(&self, p: u64) -> u64 {
        if p >= self.n {
            return p;
        }
        // Cycle walking: the Feistel network permutes 0..2^(2·half_bits) ⊇ 0..n, and the cycle
        // through p contains p itself, so re-applying it reaches a value below n.
        let mut x = p;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut left = (x >> self.half_bits) & mask;
        let mut right = x & mask;
        for key in self.keys {
            let next = left ^ (mix64(right ^ key) & mask);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }
}

/// SplitMix64's output function (Steele, Lea, Flood 2014): a strong 64-bit mixer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64: 64 bits of state, one mix per draw. For reproducible keys, not cryptography.
#[derive(Debug, Clone)]
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn config(
        records: u64,
        batch_size: u64,
        drop_remainder: bool,
        shuffle: Shuffle,
    ) -> DispatcherConfig {
        DispatcherConfig {
            records,
            batch_size,
            drop_remainder,
            shuffle,
            chain: None,
            epochs: Some(3),
            restart_every: None,
            lease_duration: Duration::from_secs(1),
            max_leases_per_worker: 1,
            stages: 1,
        }
    }

    fn epoch_batches(config: &DispatcherConfig, epoch: u64) -> Vec<Vec<u64>> {
        (0..config.steps_per_epoch())
            .map(|s| index_batch(config, StepId::new(epoch, s)).expect("step in range"))
            .collect()
    }

    #[test]
    fn unshuffled_batches_are_consecutive_and_the_last_is_short() {
        let c = config(10, 4, false, Shuffle::Off);
        assert_eq!(
            epoch_batches(&c, 1),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
        );
        let c = config(10, 4, true, Shuffle::Off);
        assert_eq!(
            epoch_batches(&c, 0),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert!(index_batch(&c, StepId::new(0, 2)).is_err());
        assert!(index_batch(&c, StepId::new(3, 0)).is_err());
    }

    /// Pins the shuffled order: it is part of the journal's contract (a restarted dispatcher,
    /// or one built by a later version, must re-lease identical batches). Values produced by this
    /// implementation when it was written; a change here is a breaking change of the journal.
    #[test]
    fn shuffled_order_is_pinned() {
        let c = config(10, 5, false, Shuffle::Seeded { seed: 42 });
        assert_eq!(epoch_batches(&c, 0), PINNED_EPOCH0);
        assert_ne!(epoch_batches(&c, 1), PINNED_EPOCH0);
    }

    const PINNED_EPOCH0: [[u64; 5]; 2] = [[6, 4, 0, 1, 2], [5, 3, 7, 9, 8]];

    #[test]
    fn shuffle_moves_records_and_differs_by_epoch_and_seed() {
        let a = config(1000, 1000, false, Shuffle::Seeded { seed: 1 });
        let b = config(1000, 1000, false, Shuffle::Seeded { seed: 2 });
        let identity: Vec<u64> = (0..1000).collect();
        let a0 = epoch_batches(&a, 0).concat();
        assert_ne!(a0, identity);
        assert_ne!(a0, epoch_batches(&a, 1).concat());
        assert_ne!(a0, epoch_batches(&b, 0).concat());
        // Not a near-identity: most records leave their place.
        let fixed = a0
            .iter()
            .enumerate()
            .filter(|(i, r)| *i as u64 == **r)
            .count();
        assert!(fixed < 20, "{fixed} fixed points");
    }

    #[test]
    fn permutation_is_a_bijection_at_the_edges() {
        for n in [1u64, 2, 3, 4, 5, 63, 64, 65, 1 << 12] {
            let p = Permutation::new(n, 7, 3);
            let image: BTreeSet<u64> = (0..n).map(|i| p.at(i)).collect();
            assert_eq!(image, (0..n).collect(), "n = {n}");
        }
        // The largest domain does not overflow.
        let p = Permutation::new(u64::MAX, 1, 1);
        assert!(p.at(u64::MAX - 1) < u64::MAX);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_epoch_partitions_the_records(
            records in 1u64..300,
            batch_size in 1u64..40,
            drop_remainder: bool,
            shuffled: bool,
            seed: u64,
            epoch in 0u64..3,
        ) {
            let drop_remainder = drop_remainder && batch_size <= records;
            let shuffle = if shuffled { Shuffle::Seeded { seed } } else { Shuffle::Off };
            let c = config(records, batch_size, drop_remainder, shuffle);
            let batches = epoch_batches(&c, epoch);
            let kept = if drop_remainder { records / batch_size * batch_size } else { records };
            let all: Vec<u64> = batches.concat();
            let distinct: BTreeSet<u64> = all.iter().copied().collect();
            prop_assert_eq!(all.len() as u64, kept);
            prop_assert_eq!(distinct.len() as u64, kept);
            prop_assert!(all.iter().all(|r| *r < records));
            if !shuffled || !drop_remainder {
                // Without dropping, or without shuffling, the epoch covers exactly 0..kept or all.
                let expected: BTreeSet<u64> = if shuffled { (0..records).collect() } else { (0..kept).collect() };
                prop_assert_eq!(distinct, expected);
            }
            for (s, batch) in batches.iter().enumerate() {
                let short = s as u64 + 1 == c.steps_per_epoch() && !drop_remainder && records % batch_size != 0;
                let len = if short { records % batch_size } else { batch_size };
                prop_assert_eq!(batch.len() as u64, len);
            }
            prop_assert_eq!(epoch_batches(&c, epoch), batches);
        }
    }
}
