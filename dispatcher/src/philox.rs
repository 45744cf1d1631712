//! TensorFlow's random stream for `tf.data` shuffling, bit for bit.
//!
//! - [`Philox`]: Philox4x32-10 (Salmon et al., SC 2011) with TensorFlow's seeding: a 64-bit
//!   `seed` is the key, a 64-bit `seed2` the high half of the 128-bit counter.
//! - [`Samples`]: one 32-bit value at a time from the four of each Philox block, in block
//!   order (TensorFlow's `SingleSampleAdapter`), with `skip`.
//! - [`SeedGenerator`]: how a shuffle op derives the seeds of each new iterator: the op's
//!   seeds every time (`reshuffle_each_iteration=False`), or the next two samples of a stream
//!   seeded by them (`True`), so that each epoch gets its own order.

const W32A: u32 = 0x9E37_79B9;
const W32B: u32 = 0xBB67_AE85;
const M4X32A: u32 = 0xD251_1F53;
const M4X32B: u32 = 0xCD9E_8D57;
const ROUNDS: usize = 10;

/// Philox4x32-10: a counter-based generator, four 32-bit values per block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Philox {
    counter: [u32; 4],
    key: [u32; 2],
}

impl Philox {
    pub fn new(seed: u64, seed2: u64) -> Self {
        let [k0, k1] = halves(seed);
        let [c2, c3] = halves(seed2);
        Self {
            key: [k0, k1],
            counter: [0, 0, c2, c3],
        }
    }

    /// The next block of four values.
    pub fn next_block(&mut self) -> [u32; 4] {
        let mut x = self.counter;
        let mut key = self.key;
        for round in 0..ROUNDS {
            if round > 0 {
                key[0] = key[0].wrapping_add(W32A);
                key[1] = key[1].wrapping_add(W32B);
            }
            let [lo0, hi0] = halves(u64::from(M4X32A) * u64::from(x[0]));
            let [lo1, hi1] = halves(u64::from(M4X32B) * u64::from(x[2]));
            x = [hi1 ^ x[1] ^ key[0], lo1, hi0 ^ x[3] ^ key[1], lo0];
        }
        self.skip_blocks(1);
        x
    }

    /// Moves the 128-bit counter `blocks` blocks ahead.
    pub fn skip_blocks(&mut self, blocks: u64) {
        let mut bytes = [0u8; 16];
        for (chunk, word) in bytes.chunks_exact_mut(4).zip(self.counter) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        let value = u128::from_le_bytes(bytes).wrapping_add(u128::from(blocks));
        for (word, chunk) in self
            .counter
            .iter_mut()
            .zip(value.to_le_bytes().chunks_exact(4))
        {
            *word = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
    }
}

/// The low and the high 32 bits of `x`.
fn halves(x: u64) -> [u32; 2] {
    let b = x.to_le_bytes();
    [
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    ]
}

/// One 32-bit sample at a time from a [`Philox`] stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Samples {
    philox: Philox,
    block: [u32; 4],
    /// The next unused value of `block`; 4 when it is used up.
    used: u8,
}

impl Samples {
    pub fn new(seed: u64, seed2: u64) -> Self {
        Self {
            philox: Philox::new(seed, seed2),
            block: [0; 4],
            used: 4,
        }
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            self.block = self.philox.next_block();
            self.used = 0;
        }
        let v = self.block[usize::from(self.used)];
        self.used += 1;
        v
    }

    /// Skips `n` samples, as if drawn.
    pub fn skip(&mut self, mut n: u64) {
        let unused = 4 - self.used;
        if n <= u64::from(unused) {
            self.used += u8::try_from(n).unwrap_or(unused);
            return;
        }
        n -= u64::from(unused);
        self.used = 4;
        self.philox.skip_blocks(n / 4);
        let rest = u8::try_from(n % 4).unwrap_or(0);
        if rest > 0 {
            self.block = self.philox.next_block();
            self.used = rest;
        }
    }
}

/// Where each new iterator of a shuffle op gets its seeds from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedGenerator {
    /// `reshuffle_each_iteration=False`: the op's seeds for every iterator.
    Fixed { seed: u64, seed2: u64 },
    /// `reshuffle_each_iteration=True`: two samples per iterator from a stream the op's seeds
    /// start.
    Random { stream: Samples },
}

impl SeedGenerator {
    pub fn new(seed: u64, seed2: u64, reshuffle_each_iteration: bool) -> Self {
        if reshuffle_each_iteration {
            Self::Random {
                stream: Samples::new(seed, seed2),
            }
        } else {
            Self::Fixed { seed, seed2 }
        }
    }

    /// The seeds of the next iterator.
    pub fn generate(&mut self) -> (u64, u64) {
        match self {
            Self::Fixed { seed, seed2 } => (*seed, *seed2),
            Self::Random { stream } => {
                let a = stream.next_u32();
                let b = stream.next_u32();
                (u64::from(a), u64::from(b))
            }
        }
    }

    /// Advances by `iterators` generated seed pairs without producing them.
    pub fn skip_iterators(&mut self, iterators: u64) {
        if let Self::Random { stream } = self {
            stream.skip(iterators.saturating_mul(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known answers of Philox4x32-10 from the Random123 distribution's `kat_vectors`
    /// (counter, key → output), which TensorFlow's generator reproduces; the counter's high
    /// half is TensorFlow's `seed2`, the key its `seed`.
    #[test]
    fn philox_known_answers() {
        let mut p = Philox::new(0, 0);
        assert_eq!(
            p.next_block(),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        let mut p = Philox {
            counter: [u32::MAX; 4],
            key: [u32::MAX; 2],
        };
        assert_eq!(
            p.next_block(),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        let mut p = Philox {
            counter: [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            key: [0xa409_3822, 0x299f_31d0],
        };
        assert_eq!(
            p.next_block(),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn the_counter_carries_into_the_high_half() {
        let mut p = Philox::new(1, 0);
        p.counter = [u32::MAX, u32::MAX, 5, 0];
        p.skip_blocks(1);
        assert_eq!(p.counter, [0, 0, 6, 0]);
    }

    #[test]
    fn skipping_equals_drawing() {
        for n in [0u64, 1, 3, 4, 5, 8, 13, 1000] {
            for pre in 0..5 {
                let mut drawn = Samples::new(3, 9);
                let mut skipped = drawn.clone();
                for _ in 0..pre {
                    drawn.next_u32();
                    skipped.next_u32();
                }
                for _ in 0..n {
                    drawn.next_u32();
                }
                skipped.skip(n);
                assert_eq!(drawn.next_u32(), skipped.next_u32(), "pre {pre}, n {n}");
            }
        }
    }
}
