//! Tensor ↔ TensorProto, following TensorFlow's `Tensor::FromProto` and `AsProtoTensorContent`.
//!
//! Reading (`TryFrom<&TensorProto>`), as TensorFlow 2.18 does (checked with
//! `tf.raw_ops.ParseTensor`, which calls `Tensor::FromProto`):
//! - Dimensions must be >= 0 and their product must fit in an int64. `unknown_rank` is
//!   ignored: TensorFlow builds the tensor from `dim` alone (no dims: a scalar).
//! - A tensor with no elements ignores every value field.
//! - A non-empty `tensor_content` wins over the typed fields and must hold exactly one packed
//!   little-endian value per element; a bool byte must be 0 or 1. A string tensor's content is
//!   TensorFlow's string list: every length as a varint32, then the bytes, nothing left over.
//! - Otherwise the dtype's typed field: `bool_val`; `int_val` for int8, int16, int32, uint8
//!   and uint16 (narrowed by keeping the low bits, as C++'s `static_cast` does); `half_val`
//!   for half and bfloat16 (low 16 bits); `int64_val`, `uint32_val`, `uint64_val`,
//!   `float_val`, `double_val`, `string_val`. Other fields are ignored. With `k` values for
//!   `n` elements: `k == 0` gives zeros, `k >= n` takes the first `n`, and `0 < k < n` copies
//!   the `k` values and fills the rest with the last one.
//!
//! Writing (`From<&Tensor>`) gives what `tf.io.serialize_tensor` gives: packed
//! `tensor_content` for every dtype but string, `string_val` for strings.
//! [`to_proto_fields`] writes the typed fields instead (TensorFlow's `AsProtoField`).

use lode_proto::tf::tensor::TensorProto;
use lode_proto::tf::tensor_shape::{tensor_shape_proto, TensorShapeProto};
use lode_proto::tf::types::DataType;
use protobuf::{EnumOrUnknown, Message, MessageField};

use crate::error::{Error, Result};
use crate::tensor::{checked_num_elements, DType, Tensor, TensorData, MAX_TENSOR_BYTES};

impl DType {
    /// The Lode dtype of a TensorProto dtype; reference dtypes and dtypes without a dense
    /// Lode representation are refused.
    pub fn from_proto(dtype: EnumOrUnknown<DataType>) -> Result<DType> {
        let unsupported = || Error::UnsupportedDtype {
            dtype: match dtype.enum_value() {
                Ok(known) => format!("{known:?}"),
                Err(number) => format!("#{number}"),
            },
        };
        let known = dtype.enum_value().map_err(|_| unsupported())?;
        Ok(match known {
            DataType::DT_BOOL => DType::Bool,
            DataType::DT_INT8 => DType::Int8,
            DataType::DT_INT16 => DType::Int16,
            DataType::DT_INT32 => DType::Int32,
            DataType::DT_INT64 => DType::Int64,
            DataType::DT_UINT8 => DType::UInt8,
            DataType::DT_UINT16 => DType::UInt16,
            DataType::DT_UINT32 => DType::UInt32,
            DataType::DT_UINT64 => DType::UInt64,
            DataType::DT_HALF => DType::Float16,
            DataType::DT_BFLOAT16 => DType::BFloat16,
            DataType::DT_FLOAT => DType::Float32,
            DataType::DT_DOUBLE => DType::Float64,
            DataType::DT_STRING => DType::String,
            _ => return Err(unsupported()),
        })
    }

    /// TensorFlow's DataType for this dtype.
    pub fn to_proto(self) -> DataType {
        match self {
            DType::Bool => DataType::DT_BOOL,
            DType::Int8 => DataType::DT_INT8,
            DType::Int16 => DataType::DT_INT16,
            DType::Int32 => DataType::DT_INT32,
            DType::Int64 => DataType::DT_INT64,
            DType::UInt8 => DataType::DT_UINT8,
            DType::UInt16 => DataType::DT_UINT16,
            DType::UInt32 => DataType::DT_UINT32,
            DType::UInt64 => DataType::DT_UINT64,
            DType::Float16 => DataType::DT_HALF,
            DType::BFloat16 => DataType::DT_BFLOAT16,
            DType::Float32 => DataType::DT_FLOAT,
            DType::Float64 => DataType::DT_DOUBLE,
            DType::String => DataType::DT_STRING,
        }
    }
}

/// Parses a binary TensorProto (as written by `tf.io.serialize_tensor`) into a tensor.
pub fn decode_tensor(bytes: &[u8]) -> Result<Tensor> {
    let proto: TensorProto =
        lode_proto::io::decode_binary(bytes).map_err(|source| Error::ProtoDecode { source })?;
    Tensor::try_from(&proto)
}

/// Writes a tensor as a binary TensorProto, byte for byte what `tf.io.serialize_tensor` writes.
/// Fails only for a message over protobuf's 2 GiB limit.
pub fn encode_tensor(tensor: &Tensor) -> Result<Vec<u8>> {
    TensorProto::from(tensor)
        .write_to_bytes()
        .map_err(|source| Error::ProtoEncode {
            dtype: tensor.dtype().name(),
            shape: tensor.shape().to_vec(),
            source,
        })
}

/// The shape of a TensorProto as sizes, checked as TensorFlow's `TensorShape::IsValid` does.
fn shape_from_proto(shape: &TensorShapeProto) -> Result<Vec<usize>> {
    let dims: Vec<i64> = shape.dim.iter().map(|d| d.size).collect();
    let mut sizes = Vec::with_capacity(dims.len());
    let mut product: i64 = 1;
    for (index, &size) in dims.iter().enumerate() {
        let Ok(usize_size) = usize::try_from(size) else {
            return Err(Error::InvalidDim { index, size });
        };
        product = product
            .checked_mul(size)
            .ok_or_else(|| Error::ElementCountOverflow { dims: dims.clone() })?;
        sizes.push(usize_size);
    }
    Ok(sizes)
}

fn shape_to_proto(shape: &[usize]) -> TensorShapeProto {
    let mut proto = TensorShapeProto::new();
    proto.dim = shape
        .iter()
        .map(|&size| {
            let mut dim = tensor_shape_proto::Dim::new();
            // A usize that is a real dimension of an allocated tensor fits in i64.
            dim.size = i64::try_from(size).unwrap_or(i64::MAX);
            dim
        })
        .collect();
    proto
}

/// TensorFlow's `FromProtoField` fill rule over already converted values.
fn fill<T: Clone + Default>(values: impl ExactSizeIterator<Item = T>, n: usize) -> Vec<T> {
    let k = values.len();
    if k == 0 {
        return vec![T::default(); n];
    }
    let mut out: Vec<T> = values.take(n).collect();
    if k < n {
        if let Some(last) = out.last().cloned() {
            out.resize(n, last);
        }
    }
    out
}

/// Unpacks `n` little-endian values of `W` bytes each.
fn unpack<T, const W: usize>(
    content: &[u8],
    n: usize,
    dtype: DType,
    from_le: fn([u8; W]) -> T,
) -> Result<Vec<T>> {
    let expected = (n as u128) * (W as u128);
    if content.len() as u128 != expected {
        return Err(Error::ContentSize {
            dtype: dtype.name(),
            elements: n,
            expected,
            actual: content.len(),
        });
    }
    Ok(content
        .chunks_exact(W)
        .map(|chunk| {
            let mut bytes = [0u8; W];
            bytes.copy_from_slice(chunk);
            from_le(bytes)
        })
        .collect())
}

/// TensorFlow's `DecodeStringList`: `n` varint32 lengths, then the strings' bytes.
fn unpack_strings(content: &[u8], n: usize) -> Result<Vec<Vec<u8>>> {
    let malformed = |reason| Error::StringContent {
        elements: n,
        reason,
    };
    let mut pos = 0usize;
    let mut lengths = Vec::with_capacity(n.min(content.len()));
    for _ in 0..n {
        let mut value: u32 = 0;
        let mut shift = 0u32;
        loop {
            let byte = *content
                .get(pos)
                .ok_or_else(|| malformed("the lengths run past the end"))?;
            pos += 1;
            if shift == 28 && byte > 0x0f {
                return Err(malformed("a length does not fit in a varint32"));
            }
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        let len = usize::try_from(value).map_err(|_| malformed("a length overflows usize"))?;
        lengths.push(len);
    }
    let mut out = Vec::with_capacity(n);
    for len in lengths {
        let end = pos
            .checked_add(len)
            .filter(|&end| end <= content.len())
            .ok_or_else(|| malformed("the strings run past the end"))?;
        out.push(content[pos..end].to_vec());
        pos = end;
    }
    if pos != content.len() {
        return Err(malformed("bytes are left over after the last string"));
    }
    Ok(out)
}

/// The low 8 bits of an int32, as C++'s `static_cast<int8>` keeps them.
fn low_i8(v: i32) -> i8 {
    i8::from_le_bytes([v.to_le_bytes()[0]])
}
fn low_u8(v: i32) -> u8 {
    v.to_le_bytes()[0]
}
fn low_i16(v: i32) -> i16 {
    let b = v.to_le_bytes();
    i16::from_le_bytes([b[0], b[1]])
}
fn low_u16(v: i32) -> u16 {
    let b = v.to_le_bytes();
    u16::from_le_bytes([b[0], b[1]])
}

impl TryFrom<&TensorProto> for Tensor {
    type Error = Error;

    fn try_from(proto: &TensorProto) -> Result<Tensor> {
        let dtype = DType::from_proto(proto.dtype)?;
        let shape = match proto.tensor_shape.as_ref() {
            Some(shape) => shape_from_proto(shape)?,
            None => Vec::new(),
        };
        let n = checked_num_elements(dtype, &shape)?;
        if n == 0 {
            return Tensor::new(shape, TensorData::zeros(dtype, 0));
        }
        let content = proto.tensor_content.as_slice();
        let data = if !content.is_empty() {
            from_content(dtype, content, n)?
        } else {
            if dtype == DType::String {
                check_string_fill(&shape, &proto.string_val, n)?;
            }
            from_fields(dtype, proto, n)
        };
        Tensor::new(shape, data)
    }
}

/// Refuses, before filling, a string tensor whose fill would blow up memory (a long string
/// repeated many times). Strings from `tensor_content` need no check: they are no longer than
/// the proto that holds them.
fn check_string_fill(shape: &[usize], values: &[Vec<u8>], n: usize) -> Result<()> {
    let per_element = std::mem::size_of::<Vec<u8>>() as u128;
    let taken = &values[..values.len().min(n)];
    let repeated = (n - taken.len()) as u128;
    let last = taken.last().map_or(0, |s| s.len() as u128);
    let bytes = taken.iter().map(|s| s.len() as u128).sum::<u128>()
        + repeated * last
        + (n as u128) * per_element;
    if bytes > u128::from(MAX_TENSOR_BYTES) {
        return Err(Error::TooLarge {
            dtype: DType::String.name(),
            shape: shape.to_vec(),
            bytes,
            limit: MAX_TENSOR_BYTES,
        });
    }
    Ok(())
}

fn from_content(dtype: DType, content: &[u8], n: usize) -> Result<TensorData> {
    Ok(match dtype {
        DType::Bool => {
            let bytes = unpack::<u8, 1>(content, n, dtype, u8::from_le_bytes)?;
            if let Some((index, &value)) = bytes.iter().enumerate().find(|(_, &b)| b > 1) {
                return Err(Error::InvalidBool { index, value });
            }
            TensorData::Bool(bytes.into_iter().map(|b| b == 1).collect())
        }
        DType::Int8 => TensorData::Int8(unpack(content, n, dtype, i8::from_le_bytes)?),
        DType::Int16 => TensorData::Int16(unpack(content, n, dtype, i16::from_le_bytes)?),
        DType::Int32 => TensorData::Int32(unpack(content, n, dtype, i32::from_le_bytes)?),
        DType::Int64 => TensorData::Int64(unpack(content, n, dtype, i64::from_le_bytes)?),
        DType::UInt8 => TensorData::UInt8(unpack(content, n, dtype, u8::from_le_bytes)?),
        DType::UInt16 => TensorData::UInt16(unpack(content, n, dtype, u16::from_le_bytes)?),
        DType::UInt32 => TensorData::UInt32(unpack(content, n, dtype, u32::from_le_bytes)?),
        DType::UInt64 => TensorData::UInt64(unpack(content, n, dtype, u64::from_le_bytes)?),
        DType::Float16 => TensorData::Float16(unpack(content, n, dtype, u16::from_le_bytes)?),
        DType::BFloat16 => TensorData::BFloat16(unpack(content, n, dtype, u16::from_le_bytes)?),
        DType::Float32 => TensorData::Float32(unpack(content, n, dtype, f32::from_le_bytes)?),
        DType::Float64 => TensorData::Float64(unpack(content, n, dtype, f64::from_le_bytes)?),
        DType::String => TensorData::String(unpack_strings(content, n)?),
    })
}

fn from_fields(dtype: DType, p: &TensorProto, n: usize) -> TensorData {
    let ints = || p.int_val.iter().copied();
    let halves = || p.half_val.iter().copied().map(low_u16);
    match dtype {
        DType::Bool => TensorData::Bool(fill(p.bool_val.iter().copied(), n)),
        DType::Int8 => TensorData::Int8(fill(ints().map(low_i8), n)),
        DType::Int16 => TensorData::Int16(fill(ints().map(low_i16), n)),
        DType::Int32 => TensorData::Int32(fill(ints(), n)),
        DType::Int64 => TensorData::Int64(fill(p.int64_val.iter().copied(), n)),
        DType::UInt8 => TensorData::UInt8(fill(ints().map(low_u8), n)),
        DType::UInt16 => TensorData::UInt16(fill(ints().map(low_u16), n)),
        DType::UInt32 => TensorData::UInt32(fill(p.uint32_val.iter().copied(), n)),
        DType::UInt64 => TensorData::UInt64(fill(p.uint64_val.iter().copied(), n)),
        DType::Float16 => TensorData::Float16(fill(halves(), n)),
        DType::BFloat16 => TensorData::BFloat16(fill(halves(), n)),
        DType::Float32 => TensorData::Float32(fill(p.float_val.iter().copied(), n)),
        DType::Float64 => TensorData::Float64(fill(p.double_val.iter().copied(), n)),
        DType::String => TensorData::String(fill(p.string_val.iter().cloned(), n)),
    }
}

fn header(tensor: &Tensor) -> TensorProto {
    let mut proto = TensorProto::new();
    proto.dtype = EnumOrUnknown::new(tensor.dtype().to_proto());
    proto.tensor_shape = MessageField::some(shape_to_proto(tensor.shape()));
    proto
}

fn pack<T: Copy, const W: usize>(values: &[T], to_le: fn(T) -> [u8; W]) -> Vec<u8> {
    values.iter().flat_map(|&v| to_le(v)).collect()
}

impl From<&Tensor> for TensorProto {
    /// TensorFlow's `AsProtoTensorContent` (strings in `string_val`), i.e. what
    /// `tf.io.serialize_tensor` writes.
    fn from(tensor: &Tensor) -> TensorProto {
        let mut proto = header(tensor);
        proto.tensor_content = match tensor.data() {
            TensorData::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
            TensorData::Int8(v) => pack(v, i8::to_le_bytes),
            TensorData::Int16(v) => pack(v, i16::to_le_bytes),
            TensorData::Int32(v) => pack(v, i32::to_le_bytes),
            TensorData::Int64(v) => pack(v, i64::to_le_bytes),
            TensorData::UInt8(v) => v.clone(),
            TensorData::UInt16(v) | TensorData::Float16(v) | TensorData::BFloat16(v) => {
                pack(v, u16::to_le_bytes)
            }
            TensorData::UInt32(v) => pack(v, u32::to_le_bytes),
            TensorData::UInt64(v) => pack(v, u64::to_le_bytes),
            TensorData::Float32(v) => pack(v, f32::to_le_bytes),
            TensorData::Float64(v) => pack(v, f64::to_le_bytes),
            TensorData::String(v) => {
                proto.string_val = v.clone();
                Vec::new()
            }
        };
        proto
    }
}

/// The tensor with its values in the dtype's typed field (TensorFlow's `AsProtoField`):
/// int8/int16/uint8/uint16 widened into `int_val`, half and bfloat16 bits into `half_val`.
pub fn to_proto_fields(tensor: &Tensor) -> TensorProto {
    let mut p = header(tensor);
    match tensor.data() {
        TensorData::Bool(v) => p.bool_val = v.clone(),
        TensorData::Int8(v) => p.int_val = v.iter().map(|&x| i32::from(x)).collect(),
        TensorData::Int16(v) => p.int_val = v.iter().map(|&x| i32::from(x)).collect(),
        TensorData::Int32(v) => p.int_val = v.clone(),
        TensorData::Int64(v) => p.int64_val = v.clone(),
        TensorData::UInt8(v) => p.int_val = v.iter().map(|&x| i32::from(x)).collect(),
        TensorData::UInt16(v) => p.int_val = v.iter().map(|&x| i32::from(x)).collect(),
        TensorData::UInt32(v) => p.uint32_val = v.clone(),
        TensorData::UInt64(v) => p.uint64_val = v.clone(),
        TensorData::Float16(v) | TensorData::BFloat16(v) => {
            p.half_val = v.iter().map(|&x| i32::from(x)).collect();
        }
        TensorData::Float32(v) => p.float_val = v.clone(),
        TensorData::Float64(v) => p.double_val = v.clone(),
        TensorData::String(v) => p.string_val = v.clone(),
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn proto(dtype: DataType, dims: &[i64]) -> TensorProto {
        let mut p = TensorProto::new();
        p.dtype = EnumOrUnknown::new(dtype);
        let mut shape = TensorShapeProto::new();
        shape.dim = dims
            .iter()
            .map(|&size| {
                let mut d = tensor_shape_proto::Dim::new();
                d.size = size;
                d
            })
            .collect();
        p.tensor_shape = MessageField::some(shape);
        p
    }

    fn read(p: &TensorProto) -> Tensor {
        Tensor::try_from(p).expect("TensorFlow accepts this proto")
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    // Expected values below come from TensorFlow 2.18.1: each proto was built with
    // tensorflow.core.framework.tensor_pb2 and parsed by tf.raw_ops.ParseTensor (which calls
    // the C++ Tensor::FromProto), in the venv at ~/.cache/lode/tf-2.18.1.

    #[test]
    fn typed_fields_fill_with_the_last_value_and_truncate_extra_ones() {
        let mut p = proto(DataType::DT_INT32, &[5]);
        p.int_val = vec![1, 2];
        assert_eq!(read(&p).data(), &TensorData::Int32(vec![1, 2, 2, 2, 2]));
        let mut p = proto(DataType::DT_INT32, &[2]);
        p.int_val = vec![1, 2, 3];
        assert_eq!(read(&p).data(), &TensorData::Int32(vec![1, 2]));
        let p = proto(DataType::DT_INT32, &[3]);
        assert_eq!(read(&p).data(), &TensorData::Int32(vec![0, 0, 0]));
        let mut p = proto(DataType::DT_STRING, &[3]);
        p.string_val = vec![b"a".to_vec(), b"bc".to_vec()];
        assert_eq!(
            read(&p).data(),
            &TensorData::String(vec![b"a".to_vec(), b"bc".to_vec(), b"bc".to_vec()])
        );
        let mut p = proto(DataType::DT_BOOL, &[3]);
        p.bool_val = vec![true];
        assert_eq!(read(&p).data(), &TensorData::Bool(vec![true; 3]));
        let mut p = proto(DataType::DT_UINT32, &[2]);
        p.uint32_val = vec![4_000_000_000];
        assert_eq!(read(&p).data(), &TensorData::UInt32(vec![4_000_000_000; 2]));
        let mut p = proto(DataType::DT_UINT64, &[2]);
        p.uint64_val = vec![u64::MAX, 3];
        assert_eq!(read(&p).data(), &TensorData::UInt64(vec![u64::MAX, 3]));
    }

    #[test]
    fn narrow_types_keep_the_low_bits_of_int_val_and_half_val() {
        let cases: [(DataType, Vec<i32>, TensorData); 4] = [
            (
                DataType::DT_INT8,
                vec![300, -129],
                TensorData::Int8(vec![44, 127]),
            ),
            (
                DataType::DT_UINT8,
                vec![300, -1],
                TensorData::UInt8(vec![44, 255]),
            ),
            (
                DataType::DT_UINT16,
                vec![70000, -1],
                TensorData::UInt16(vec![4464, 65535]),
            ),
            (
                DataType::DT_INT16,
                vec![40000, -40000],
                TensorData::Int16(vec![-25536, 25536]),
            ),
        ];
        for (dtype, ints, expected) in cases {
            let mut p = proto(dtype, &[2]);
            p.int_val = ints;
            assert_eq!(read(&p).data(), &expected, "{dtype:?}");
        }
        // 0x13c00 keeps 0x3c00 (1.0); -17408 is 0xbc00 (-1.0).
        let mut p = proto(DataType::DT_HALF, &[3]);
        p.half_val = vec![0x3c00, 0x13c00];
        assert_eq!(read(&p).data(), &TensorData::Float16(vec![0x3c00; 3]));
        let mut p = proto(DataType::DT_HALF, &[1]);
        p.half_val = vec![-17408];
        assert_eq!(read(&p).data(), &TensorData::Float16(vec![0xbc00]));
        let mut p = proto(DataType::DT_BFLOAT16, &[2]);
        p.half_val = vec![0x3f80];
        assert_eq!(read(&p).data(), &TensorData::BFloat16(vec![0x3f80; 2]));
    }

    #[test]
    fn values_in_another_dtypes_field_are_ignored() {
        let mut p = proto(DataType::DT_INT32, &[2]);
        p.int64_val = vec![5];
        assert_eq!(read(&p).data(), &TensorData::Int32(vec![0, 0]));
        let mut p = proto(DataType::DT_UINT32, &[2]);
        p.int_val = vec![5];
        assert_eq!(read(&p).data(), &TensorData::UInt32(vec![0, 0]));
    }

    #[test]
    fn tensor_content_wins_and_must_match_the_element_count() {
        let mut p = proto(DataType::DT_INT32, &[1]);
        p.tensor_content = vec![5, 0, 0, 0];
        p.int_val = vec![9];
        assert_eq!(read(&p).data(), &TensorData::Int32(vec![5]));

        let mut p = proto(DataType::DT_INT32, &[2]);
        p.tensor_content = vec![1, 0, 0, 0];
        let err = Tensor::try_from(&p).expect_err("short content");
        assert!(
            matches!(
                err,
                Error::ContentSize {
                    expected: 8,
                    actual: 4,
                    ..
                }
            ),
            "{err}"
        );
        let mut p = proto(DataType::DT_INT32, &[1]);
        p.tensor_content = vec![1, 0, 0, 0, 2, 0, 0, 0];
        assert!(matches!(
            Tensor::try_from(&p),
            Err(Error::ContentSize { .. })
        ));

        let mut p = proto(DataType::DT_HALF, &[1]);
        p.tensor_content = vec![0x00, 0x3c];
        assert_eq!(read(&p).data(), &TensorData::Float16(vec![0x3c00]));
    }

    #[test]
    fn bool_content_bytes_must_be_zero_or_one() {
        let mut p = proto(DataType::DT_BOOL, &[3]);
        p.tensor_content = vec![1, 0, 1];
        assert_eq!(read(&p).data(), &TensorData::Bool(vec![true, false, true]));
        p.tensor_content = vec![1, 0, 2];
        let err = Tensor::try_from(&p).expect_err("byte 2");
        assert!(
            matches!(err, Error::InvalidBool { index: 2, value: 2 }),
            "{err}"
        );
    }

    #[test]
    fn string_content_is_a_varint_length_list_with_nothing_left_over() {
        let mut p = proto(DataType::DT_STRING, &[2]);
        p.tensor_content = b"\x01\x02abc".to_vec();
        assert_eq!(
            read(&p).data(),
            &TensorData::String(vec![b"a".to_vec(), b"bc".to_vec()])
        );
        for bad in [
            &b"\x01\x02abcX"[..],
            b"\x01\x02ab",
            b"\x01",
            b"\xff\xff\xff\xff\x7f\x00x",
        ] {
            p.tensor_content = bad.to_vec();
            assert!(
                matches!(Tensor::try_from(&p), Err(Error::StringContent { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn empty_tensors_ignore_every_value_field() {
        let mut p = proto(DataType::DT_INT32, &[0]);
        p.tensor_content = vec![1, 0, 0, 0];
        assert_eq!(read(&p).shape(), &[0]);
        let mut p = proto(DataType::DT_INT32, &[0, 3]);
        p.int_val = vec![1];
        let t = read(&p);
        assert_eq!((t.shape(), t.num_elements()), (&[0usize, 3][..], 0));
    }

    #[test]
    fn shapes_are_checked_as_tensorflow_does() {
        let mut p = proto(DataType::DT_INT32, &[-1]);
        p.int_val = vec![1];
        assert!(matches!(
            Tensor::try_from(&p),
            Err(Error::InvalidDim { index: 0, size: -1 })
        ));
        let mut p = proto(DataType::DT_INT32, &[1 << 40, 1 << 40]);
        p.int_val = vec![1];
        assert!(matches!(
            Tensor::try_from(&p),
            Err(Error::ElementCountOverflow { .. })
        ));
        // Fits in int64 but not in memory: refused before allocating.
        let mut p = proto(DataType::DT_INT64, &[1 << 30, 1 << 10]);
        p.int64_val = vec![1];
        assert!(matches!(Tensor::try_from(&p), Err(Error::TooLarge { .. })));
        // A long string repeated by the fill rule counts its bytes.
        let mut p = proto(DataType::DT_STRING, &[1 << 20]);
        p.string_val = vec![vec![b'x'; 1 << 12]];
        assert!(matches!(Tensor::try_from(&p), Err(Error::TooLarge { .. })));
        // TensorFlow ignores unknown_rank and builds the tensor from `dim`.
        let mut p = proto(DataType::DT_INT32, &[2]);
        p.tensor_shape.mut_or_insert_default().unknown_rank = true;
        assert_eq!(read(&p).data(), &TensorData::Int32(vec![0, 0]));
        let mut p = proto(DataType::DT_INT32, &[]);
        p.tensor_shape.mut_or_insert_default().unknown_rank = true;
        assert_eq!(read(&p).shape(), &[] as &[usize]);
        // No shape at all is a scalar.
        let mut p = TensorProto::new();
        p.dtype = EnumOrUnknown::new(DataType::DT_INT32);
        p.int_val = vec![7];
        assert_eq!(read(&p).data(), &TensorData::Int32(vec![7]));
    }

    #[test]
    fn unsupported_dtypes_are_errors() {
        for dtype in [
            DataType::DT_INVALID,
            DataType::DT_COMPLEX64,
            DataType::DT_RESOURCE,
            DataType::DT_VARIANT,
            DataType::DT_QINT8,
            DataType::DT_FLOAT_REF,
        ] {
            let p = proto(dtype, &[1]);
            assert!(
                matches!(Tensor::try_from(&p), Err(Error::UnsupportedDtype { .. })),
                "{dtype:?}"
            );
        }
        let mut p = proto(DataType::DT_INT32, &[1]);
        p.dtype = EnumOrUnknown::from_i32(12345);
        let err = Tensor::try_from(&p).expect_err("unknown number");
        assert!(err.to_string().contains("#12345"), "{err}");
    }

    #[test]
    fn encoding_matches_tf_io_serialize_tensor_byte_for_byte() {
        // Hex strings are tf.io.serialize_tensor(t).numpy().hex() from TensorFlow 2.18.1.
        let cases = [
            (
                Tensor::scalar(TensorData::Float32(vec![1.5])),
                "0801120022040000c03f",
            ),
            (
                Tensor::new(vec![2], TensorData::Float16(vec![0x3c00, 0xc000])),
                "08131204120208022204003c00c0",
            ),
            (
                Tensor::new(vec![2, 0], TensorData::Int64(vec![])),
                "08091206120208021200",
            ),
            (
                Tensor::new(vec![1], TensorData::UInt64(vec![u64::MAX])),
                "08171204120208012208ffffffffffffffff",
            ),
            (
                Tensor::scalar(TensorData::String(vec![b"\xff\x00z".to_vec()])),
                "080712004203ff007a",
            ),
            (
                Tensor::new(vec![2], TensorData::BFloat16(vec![0x3f80, 0xbf00])),
                "080e1204120208022204803f00bf",
            ),
            (
                Tensor::new(vec![2], TensorData::Int8(vec![1, 2])),
                "080612041202080222020102",
            ),
            (
                Tensor::new(vec![2], TensorData::Bool(vec![true, false])),
                "080a12041202080222020100",
            ),
            (
                Tensor::new(
                    vec![2],
                    TensorData::String(vec![b"a".to_vec(), b"bc".to_vec()]),
                ),
                "080712041202080242016142026263",
            ),
        ];
        for (tensor, expected) in cases {
            let tensor = tensor.expect("valid tensor");
            let bytes = encode_tensor(&tensor).expect("small tensor encodes");
            assert_eq!(bytes, hex(expected), "{tensor:?}");
            let back = decode_tensor(&bytes).expect("own output decodes");
            assert!(back.bitwise_eq(&tensor));
        }
        assert!(matches!(
            decode_tensor(b"\xff\xff"),
            Err(Error::ProtoDecode { .. })
        ));
    }

    proptest! {
        #[test]
        fn tensor_content_round_trips_for_every_dtype(tensor in crate::tensor::strategies::tensor_strategy(4)) {
            let proto = TensorProto::from(&tensor);
            let back = Tensor::try_from(&proto).expect("own output reads back");
            prop_assert!(back.bitwise_eq(&tensor), "{tensor:?} came back as {back:?}");
            let bytes = encode_tensor(&tensor).expect("small tensor encodes");
            let back = decode_tensor(&bytes).expect("own bytes decode");
            prop_assert!(back.bitwise_eq(&tensor), "{tensor:?} came back as {back:?}");
        }

        #[test]
        fn typed_fields_round_trip_for_every_dtype(tensor in crate::tensor::strategies::tensor_strategy(4)) {
            let proto = to_proto_fields(&tensor);
            let back = Tensor::try_from(&proto).expect("own output reads back");
            prop_assert!(back.bitwise_eq(&tensor), "{tensor:?} came back as {back:?}");
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_tensor(&bytes);
        }
    }

    #[test]
    fn every_dtype_round_trips_through_the_proto_dtype() {
        for dtype in DType::ALL {
            assert_eq!(
                DType::from_proto(EnumOrUnknown::new(dtype.to_proto())).expect("own dtype"),
                dtype
            );
        }
    }
}
