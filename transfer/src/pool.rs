//! Memory for received tensors, handed back once the consumer is done with a step.
//!
//! A numeric tensor read from the data plane first needs memory for its `n` values. A fresh
//! allocation is zeroed (safe Rust reads only into initialised memory) and, for a large tensor,
//! faulted in page by page, only for the read to overwrite every byte. Memory of tensors the
//! consumer has copied out and given back ([`TensorPool::give_step`]) skips both: its old
//! values are overwritten instead. Nothing else changes: a tensor taken from the pool is
//! filled completely by the reader, or its frame is refused.
//!
//! A string tensor is one allocation per string. Reading a step of many short strings fresh
//! costs an allocation per string on the receiving thread and a free per string on the
//! consumer's; given back, the strings' buffers are refilled instead ([`TensorPool::take_strings`]).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use lode_runtime::tensor::{DType, TensorData};

use super::receiver::Step;

/// What a receiver's pool keeps at most by default.
pub const DEFAULT_POOL_BYTES: usize = 64 << 20;

/// Tensors' memory to reuse, at most `limit` bytes of capacity; the oldest goes first.
#[derive(Debug)]
pub struct TensorPool {
    limit: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Memory kept, each with its [`held_bytes`].
    free: VecDeque<(TensorData, usize)>,
    bytes: usize,
}

impl Inner {
    /// Takes out what is kept at `at`.
    fn remove(&mut self, at: usize) -> Option<TensorData> {
        let (data, bytes) = self.free.remove(at)?;
        self.bytes -= bytes;
        Some(data)
    }
}

/// The bytes of memory `data` holds (its capacity), for the dtypes the pool keeps: numbers
/// and strings (each string's buffer and the list's own), not booleans (read through bytes
/// and checked).
fn held_bytes(data: &TensorData) -> Option<usize> {
    match data {
        TensorData::Bool(_) => None,
        TensorData::String(v) => Some(v.iter().fold(
            v.capacity().saturating_mul(std::mem::size_of::<Vec<u8>>()),
            |sum, s| sum.saturating_add(s.capacity()),
        )),
        _ => data
            .dtype()
            .byte_width()
            .map(|w| capacity(data).saturating_mul(w)),
    }
}

fn capacity(data: &TensorData) -> usize {
    macro_rules! cap {
        ($($variant:ident),*) => {
            match data {
                $(TensorData::$variant(v) => v.capacity(),)*
                TensorData::String(v) => v.capacity(),
            }
        };
    }
    cap!(
        Bool, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64, Float16, BFloat16, Float32,
        Float64
    )
}

/// Makes `data` exactly `n` values long: shortened, or lengthened with zeros.
fn fit(data: &mut TensorData, n: usize) {
    macro_rules! fit {
        ($($variant:ident),*) => {
            match data {
                $(TensorData::$variant(v) => {
                    if v.len() >= n {
                        v.truncate(n);
                    } else {
                        v.resize(n, Default::default());
                    }
                })*
                TensorData::String(v) => v.resize(n, Vec::new()),
            }
        };
    }
    fit!(
        Bool, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32, UInt64, Float16, BFloat16, Float32,
        Float64
    );
}

impl TensorPool {
    pub fn new(limit: usize) -> Self {
        TensorPool {
            limit,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The pool's contents are plain memory, consistent whatever a panic interrupted.
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `n` values of `dtype` whose contents are unspecified (old values or zeros), for a reader
    /// that overwrites them all: given-back memory of the same dtype and room for `n` if there
    /// is some, otherwise fresh zeros.
    pub fn take(&self, dtype: DType, n: usize) -> TensorData {
        let found = self.remove_first(|d| d.dtype() == dtype && capacity(d) >= n);
        match found {
            Some(mut data) => {
                fit(&mut data, n);
                data
            }
            None => TensorData::zeros(dtype, n),
        }
    }

    /// A given-back string tensor's strings, for a reader that refills them (clears each
    /// before writing it, pushes more when there are fewer than it needs and drops the rest):
    /// the oldest kept of at least `n` strings, otherwise the oldest kept, otherwise none (and
    /// none for `n` = 0, which would only drop them). One pass over what is kept.
    pub fn take_strings(&self, n: usize) -> Vec<Vec<u8>> {
        if n == 0 {
            return Vec::new();
        }
        let mut inner = self.lock();
        let mut shorter = None;
        let mut found = None;
        for (at, (data, _)) in inner.free.iter().enumerate() {
            if let TensorData::String(v) = data {
                if v.len() >= n {
                    found = Some(at);
                    break;
                }
                shorter.get_or_insert(at);
            }
        }
        match found.or(shorter).and_then(|at| inner.remove(at)) {
            Some(TensorData::String(v)) => v,
            _ => Vec::new(),
        }
    }

    /// Takes out the oldest memory kept that `wanted` accepts.
    fn remove_first(&self, wanted: impl Fn(&TensorData) -> bool) -> Option<TensorData> {
        let mut inner = self.lock();
        let at = inner.free.iter().position(|(d, _)| wanted(d))?;
        inner.remove(at)
    }

    /// Keeps `data`'s memory for a later [`Self::take`] or [`Self::take_strings`] (any dtype
    /// but `bool`, and within the limit: the oldest memory kept goes first).
    pub fn give(&self, data: TensorData) {
        let Some(bytes) = held_bytes(&data) else {
            return;
        };
        if bytes == 0 || bytes > self.limit {
            return;
        }
        let mut inner = self.lock();
        while inner.bytes + bytes > self.limit {
            let Some((_, old)) = inner.free.pop_front() else {
                break;
            };
            inner.bytes -= old;
        }
        inner.bytes += bytes;
        inner.free.push_back((data, bytes));
    }

    /// Gives back the memory of every tensor of `step`.
    pub fn give_step(&self, step: Step) {
        for part in step.parts {
            for tensor in part.tensors {
                self.give(tensor.into_data());
            }
        }
    }

    /// The bytes of memory kept now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_given_back_is_taken_again_at_the_asked_length() {
        let pool = TensorPool::new(1 << 20);
        let data = TensorData::Float32(vec![1.5; 1000]);
        pool.give(data);
        assert_eq!(pool.bytes(), 4000);
        // Shorter: the same memory, cut to length.
        let TensorData::Float32(v) = pool.take(DType::Float32, 600) else {
            panic!("a float tensor");
        };
        assert_eq!(v.len(), 600);
        assert!(v.capacity() >= 1000);
        assert_eq!(pool.bytes(), 0);
        // Longer than any kept: fresh zeros.
        pool.give(TensorData::Float32(v));
        assert_eq!(
            pool.take(DType::Float32, 2000),
            TensorData::zeros(DType::Float32, 2000)
        );
        // Another dtype never takes it; the memory stays.
        assert_eq!(
            pool.take(DType::Int32, 10),
            TensorData::zeros(DType::Int32, 10)
        );
        assert_eq!(pool.bytes(), 4000);
    }

    #[test]
    fn the_limit_drops_the_oldest_memory_first() {
        let pool = TensorPool::new(10_000);
        pool.give(TensorData::Int64(vec![1; 500])); // 4000 bytes
        pool.give(TensorData::Int32(vec![2; 1000])); // 4000
        pool.give(TensorData::UInt8(vec![3; 3000])); // 3000: the int64 memory goes
        assert_eq!(pool.bytes(), 7000);
        assert_eq!(
            pool.take(DType::Int64, 1),
            TensorData::zeros(DType::Int64, 1)
        );
        assert!(
            matches!(pool.take(DType::Int32, 1000), TensorData::Int32(v) if v == vec![2; 1000])
        );
        // Over the limit alone, or boolean: not kept.
        pool.give(TensorData::Float64(vec![0.0; 2000]));
        pool.give(TensorData::Bool(vec![true; 10]));
        assert_eq!(pool.bytes(), 3000);
    }

    #[test]
    fn strings_given_back_are_taken_again_with_their_buffers() {
        let pool = TensorPool::new(1 << 20);
        let strings: Vec<Vec<u8>> = (0..4).map(|i| vec![b'a' + i; 100]).collect();
        let list = std::mem::size_of::<Vec<u8>>();
        pool.give(TensorData::String(strings));
        assert_eq!(pool.bytes(), 4 * list + 400);
        pool.give(TensorData::String(vec![b"xy".to_vec(); 2]));
        assert_eq!(pool.bytes(), 4 * list + 400 + 2 * list + 4);
        // At least 3 wanted: the 4 strings, as they were (the reader clears each).
        let taken = pool.take_strings(3);
        assert_eq!(taken.len(), 4);
        assert!(taken.iter().all(|s| s.len() == 100 && s.capacity() >= 100));
        assert_eq!(pool.bytes(), 2 * list + 4);
        // More wanted than any kept has: the oldest kept, then nothing.
        assert_eq!(pool.take_strings(8), vec![b"xy".to_vec(); 2]);
        assert_eq!(pool.bytes(), 0);
        assert!(pool.take_strings(1).is_empty());
        // No strings wanted: what is kept stays.
        pool.give(TensorData::String(vec![b"z".to_vec(); 3]));
        assert!(pool.take_strings(0).is_empty());
        assert_eq!(pool.take_strings(1).len(), 3);
        // Numbers never come back as strings, nor strings as numbers.
        pool.give(TensorData::Int32(vec![7; 8]));
        assert!(pool.take_strings(1).is_empty());
        pool.give(TensorData::String(vec![vec![0; 64]; 8]));
        assert_eq!(
            pool.take(DType::Int64, 8),
            TensorData::zeros(DType::Int64, 8)
        );
        assert!(matches!(pool.take(DType::Int32, 8), TensorData::Int32(v) if v == vec![7; 8]));
        assert_eq!(pool.take_strings(8).len(), 8);
    }
}
