//! Dense tensors: a dtype, a shape and the values in row-major order.
//!
//! The conversion to and from TensorFlow's `TensorProto` is in [`crate::convert`].

use crate::error::{Error, Result};

/// The most memory one tensor may take (2 GiB). A TensorProto can describe a huge tensor in a
/// few bytes (a large shape and one fill value), so conversion checks this before allocating.
/// String elements count as `size_of::<Vec<u8>>()` bytes each plus their contents.
pub const MAX_TENSOR_BYTES: u64 = 1 << 31;

/// The element types Lode's kernels work on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Bool,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    /// IEEE half precision, kept as its 16 bits.
    Float16,
    /// bfloat16, kept as its 16 bits.
    BFloat16,
    Float32,
    Float64,
    /// Byte strings (TensorFlow strings are not necessarily UTF-8).
    String,
}

impl DType {
    /// Every dtype, for exhaustive tests.
    pub const ALL: [DType; 14] = [
        DType::Bool,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::UInt8,
        DType::UInt16,
        DType::UInt32,
        DType::UInt64,
        DType::Float16,
        DType::BFloat16,
        DType::Float32,
        DType::Float64,
        DType::String,
    ];

    /// TensorFlow's name for the dtype (`DataTypeString`: "float", "half", "int32" …).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::Int8 => "int8",
            DType::Int16 => "int16",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::UInt8 => "uint8",
            DType::UInt16 => "uint16",
            DType::UInt32 => "uint32",
            DType::UInt64 => "uint64",
            DType::Float16 => "half",
            DType::BFloat16 => "bfloat16",
            DType::Float32 => "float",
            DType::Float64 => "double",
            DType::String => "string",
        }
    }

    /// Bytes per element in memory and in `tensor_content` (`None` for strings, whose size
    /// varies).
    pub fn byte_width(self) -> Option<usize> {
        match self {
            DType::Bool | DType::Int8 | DType::UInt8 => Some(1),
            DType::Int16 | DType::UInt16 | DType::Float16 | DType::BFloat16 => Some(2),
            DType::Int32 | DType::UInt32 | DType::Float32 => Some(4),
            DType::Int64 | DType::UInt64 | DType::Float64 => Some(8),
            DType::String => None,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor's values in row-major order, one vector per dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    Bool(Vec<bool>),
    Int8(Vec<i8>),
    Int16(Vec<i16>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    UInt8(Vec<u8>),
    UInt16(Vec<u16>),
    UInt32(Vec<u32>),
    UInt64(Vec<u64>),
    Float16(Vec<u16>),
    BFloat16(Vec<u16>),
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    String(Vec<Vec<u8>>),
}

impl TensorData {
    /// The dtype of the values.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::Bool(_) => DType::Bool,
            TensorData::Int8(_) => DType::Int8,
            TensorData::Int16(_) => DType::Int16,
            TensorData::Int32(_) => DType::Int32,
            TensorData::Int64(_) => DType::Int64,
            TensorData::UInt8(_) => DType::UInt8,
            TensorData::UInt16(_) => DType::UInt16,
            TensorData::UInt32(_) => DType::UInt32,
            TensorData::UInt64(_) => DType::UInt64,
            TensorData::Float16(_) => DType::Float16,
            TensorData::BFloat16(_) => DType::BFloat16,
            TensorData::Float32(_) => DType::Float32,
            TensorData::Float64(_) => DType::Float64,
            TensorData::String(_) => DType::String,
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            TensorData::Bool(v) => v.len(),
            TensorData::Int8(v) => v.len(),
            TensorData::Int16(v) => v.len(),
            TensorData::Int32(v) => v.len(),
            TensorData::Int64(v) => v.len(),
            TensorData::UInt8(v) => v.len(),
            TensorData::UInt16(v) | TensorData::Float16(v) | TensorData::BFloat16(v) => v.len(),
            TensorData::UInt32(v) => v.len(),
            TensorData::UInt64(v) => v.len(),
            TensorData::Float32(v) => v.len(),
            TensorData::Float64(v) => v.len(),
            TensorData::String(v) => v.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zeros (empty strings, `false`) of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> TensorData {
        match dtype {
            DType::Bool => TensorData::Bool(vec![false; n]),
            DType::Int8 => TensorData::Int8(vec![0; n]),
            DType::Int16 => TensorData::Int16(vec![0; n]),
            DType::Int32 => TensorData::Int32(vec![0; n]),
            DType::Int64 => TensorData::Int64(vec![0; n]),
            DType::UInt8 => TensorData::UInt8(vec![0; n]),
            DType::UInt16 => TensorData::UInt16(vec![0; n]),
            DType::UInt32 => TensorData::UInt32(vec![0; n]),
            DType::UInt64 => TensorData::UInt64(vec![0; n]),
            DType::Float16 => TensorData::Float16(vec![0; n]),
            DType::BFloat16 => TensorData::BFloat16(vec![0; n]),
            DType::Float32 => TensorData::Float32(vec![0.0; n]),
            DType::Float64 => TensorData::Float64(vec![0.0; n]),
            DType::String => TensorData::String(vec![Vec::new(); n]),
        }
    }

    /// Equality that compares floats by their bits, so NaNs (and -0.0 against 0.0) are told
    /// apart exactly as TensorFlow's bytes would be.
    pub fn bitwise_eq(&self, other: &TensorData) -> bool {
        match (self, other) {
            (TensorData::Float32(a), TensorData::Float32(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (TensorData::Float64(a), TensorData::Float64(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            _ => self == other,
        }
    }
}

/// A dense tensor. Invariant: the number of values equals the product of the shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: TensorData,
}

impl Tensor {
    /// A tensor of `shape` holding `data` in row-major order.
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Tensor> {
        let expected = num_elements_u128(&shape);
        if expected != data.len() as u128 {
            return Err(Error::ShapeMismatch {
                shape,
                expected,
                actual: data.len(),
            });
        }
        Ok(Tensor { shape, data })
    }

    /// A rank-0 tensor.
    pub fn scalar(data: TensorData) -> Result<Tensor> {
        Tensor::new(Vec::new(), data)
    }

    /// A tensor of zeros (empty strings, `false`), checked against [`MAX_TENSOR_BYTES`].
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Result<Tensor> {
        let n = checked_num_elements(dtype, &shape)?;
        Ok(Tensor {
            data: TensorData::zeros(dtype, n),
            shape,
        })
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether `other` has this tensor's shape. Compared element by element in line: batching
    /// compares every element's shape, and shapes are a few dimensions, for which a call to
    /// `memcmp` (what slice equality becomes) cost 12% of a `--simple` stage's time.
    #[inline]
    pub fn same_shape(&self, other: &Tensor) -> bool {
        let (a, b) = (&self.shape, &other.shape);
        a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| x == y)
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    pub fn into_data(self) -> TensorData {
        self.data
    }

    pub fn num_elements(&self) -> usize {
        self.data.len()
    }

    /// Equality with floats compared by their bits (see [`TensorData::bitwise_eq`]).
    pub fn bitwise_eq(&self, other: &Tensor) -> bool {
        self.shape == other.shape && self.data.bitwise_eq(&other.data)
    }
}

/// The product of `shape` without overflow (u128 holds any product of a few usizes that
/// matters here; it saturates for absurd ranks).
fn num_elements_u128(shape: &[usize]) -> u128 {
    shape
        .iter()
        .try_fold(1u128, |acc, &d| acc.checked_mul(d as u128))
        .unwrap_or(u128::MAX)
}

/// The element count of `shape`, refusing tensors over [`MAX_TENSOR_BYTES`] (string contents
/// are not known yet here and are checked by the caller when they are).
pub(crate) fn checked_num_elements(dtype: DType, shape: &[usize]) -> Result<usize> {
    let n = num_elements_u128(shape);
    let width = dtype.byte_width().unwrap_or(std::mem::size_of::<Vec<u8>>()) as u128;
    let bytes = n.saturating_mul(width);
    match usize::try_from(n) {
        Ok(n) if bytes <= u128::from(MAX_TENSOR_BYTES) => Ok(n),
        _ => Err(Error::TooLarge {
            dtype: dtype.name(),
            shape: shape.to_vec(),
            bytes,
            limit: MAX_TENSOR_BYTES,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_the_element_count() {
        assert!(Tensor::new(vec![2, 3], TensorData::Int32(vec![0; 6])).is_ok());
        let err = Tensor::new(vec![2, 3], TensorData::Int32(vec![0; 5])).expect_err("refused");
        assert!(matches!(
            err,
            Error::ShapeMismatch {
                expected: 6,
                actual: 5,
                ..
            }
        ));
        // A rank-0 tensor has one element; a zero dimension makes it empty.
        assert!(Tensor::scalar(TensorData::Bool(vec![true])).is_ok());
        assert!(Tensor::new(vec![4, 0], TensorData::String(vec![])).is_ok());
    }

    #[test]
    fn zeros_refuses_huge_shapes_instead_of_allocating() {
        let err = Tensor::zeros(DType::Float32, vec![1 << 20, 1 << 20]).expect_err("refused");
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        let err = Tensor::zeros(DType::Int8, vec![usize::MAX, usize::MAX, 2]).expect_err("refused");
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        let t = Tensor::zeros(DType::String, vec![2, 2]).expect("valid");
        assert_eq!(t.data(), &TensorData::String(vec![Vec::new(); 4]));
    }

    #[test]
    fn bitwise_eq_tells_nans_and_signed_zeros_apart() {
        let nan = Tensor::scalar(TensorData::Float32(vec![f32::NAN])).expect("valid");
        assert!(nan.bitwise_eq(&nan.clone()));
        assert_ne!(nan, nan.clone());
        let pz = Tensor::scalar(TensorData::Float64(vec![0.0])).expect("valid");
        let nz = Tensor::scalar(TensorData::Float64(vec![-0.0])).expect("valid");
        assert_eq!(pz, nz);
        assert!(!pz.bitwise_eq(&nz));
    }

    #[test]
    fn every_dtype_has_a_tensorflow_name_and_zeros() {
        for dtype in DType::ALL {
            assert_eq!(TensorData::zeros(dtype, 3).dtype(), dtype);
            assert!(!dtype.name().is_empty());
        }
    }
}

/// Proptest strategies for tensors of every dtype, shared by this crate's property tests and,
/// through the `strategies` feature, by the crates above it (the codec's round trips).
#[cfg(any(test, feature = "strategies"))]
pub mod strategies {
    use proptest::prelude::*;

    use super::{DType, Tensor, TensorData};

    /// `n` values of `dtype`: floats as arbitrary bit patterns (NaN payloads, signed zeros,
    /// subnormals), strings of arbitrary bytes up to 19 long.
    pub fn data_strategy(dtype: DType, n: usize) -> BoxedStrategy<TensorData> {
        use proptest::collection::vec;
        match dtype {
            DType::Bool => vec(any::<bool>(), n).prop_map(TensorData::Bool).boxed(),
            DType::Int8 => vec(any::<i8>(), n).prop_map(TensorData::Int8).boxed(),
            DType::Int16 => vec(any::<i16>(), n).prop_map(TensorData::Int16).boxed(),
            DType::Int32 => vec(any::<i32>(), n).prop_map(TensorData::Int32).boxed(),
            DType::Int64 => vec(any::<i64>(), n).prop_map(TensorData::Int64).boxed(),
            DType::UInt8 => vec(any::<u8>(), n).prop_map(TensorData::UInt8).boxed(),
            DType::UInt16 => vec(any::<u16>(), n).prop_map(TensorData::UInt16).boxed(),
            DType::UInt32 => vec(any::<u32>(), n).prop_map(TensorData::UInt32).boxed(),
            DType::UInt64 => vec(any::<u64>(), n).prop_map(TensorData::UInt64).boxed(),
            DType::Float16 => vec(any::<u16>(), n).prop_map(TensorData::Float16).boxed(),
            DType::BFloat16 => vec(any::<u16>(), n).prop_map(TensorData::BFloat16).boxed(),
            DType::Float32 => vec(any::<u32>().prop_map(f32::from_bits), n)
                .prop_map(TensorData::Float32)
                .boxed(),
            DType::Float64 => vec(any::<u64>().prop_map(f64::from_bits), n)
                .prop_map(TensorData::Float64)
                .boxed(),
            DType::String => vec(vec(any::<u8>(), 0..20), n)
                .prop_map(TensorData::String)
                .boxed(),
        }
    }

    /// Tensors of every dtype, rank 0 to 3, dimensions below `max_dim`.
    pub fn tensor_strategy(max_dim: usize) -> impl Strategy<Value = Tensor> {
        (
            proptest::sample::select(DType::ALL.to_vec()),
            proptest::collection::vec(0usize..max_dim, 0..4),
        )
            .prop_flat_map(|(dtype, shape)| {
                let n = shape.iter().product();
                data_strategy(dtype, n).prop_map(move |data| {
                    Tensor::new(shape.clone(), data).expect("strategy matches the shape")
                })
            })
    }
}
