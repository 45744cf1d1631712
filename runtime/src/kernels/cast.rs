//! `Cast` between bool, the integer types, half, bfloat16, float and double, as TensorFlow 2.18.1's x86-64
//! CPU kernel computes it.
//!
//! - int → int wraps (two's complement), int → float rounds to nearest even, anything → bool
//!   is `x != 0`, bool → anything is 0 or 1.
//! - Kernels run with denormals flushed to zero: a float subnormal reads as ±0 (so it casts
//!   to `false`), and a float result that would be subnormal is ±0.
//! - float → int truncates toward zero. For int32 and int64 a NaN or out-of-range value gives
//!   the type's minimum (`cvttss2si`'s "integer indefinite"); uint64 and uint32 follow the
//!   two-conversion sequence `t1 | (t2 & (t1 >> (bits - 1)))`, with `t1 = cvtt(x)` and
//!   `t2 = cvtt(x - 2^(bits-1))`; int8, int16, uint8 and uint16 saturate the int32 truncation
//!   (double → uint8 goes through a saturated uint16 read back as int16, so values above
//!   32767 give 0). Those narrow, out-of-range results are what TensorFlow's vectorized loop
//!   produces; its scalar loop (tensors of a few elements, and the last elements of some
//!   lengths) wraps instead, so TensorFlow itself gives different answers for the same value
//!   depending on the tensor's length. In-range values agree everywhere.
//! - `truncate` (double → float only) clears the 29 low mantissa bits before rounding.
//! - → half (float16): Eigen's `float_to_half_rtne` (round to nearest even, half subnormals
//!   kept, beyond 65520 infinity, NaN → `0x7e00` with the sign); ints and doubles go through
//!   float first, as Eigen's `half(float(x))`. → bfloat16 likewise with Eigen's
//!   `float_to_bfloat16_rtne` (NaN → `0x7fc0` with the sign).

// Cast's job is narrowing: every `as` below is the conversion TensorFlow performs.
#![allow(clippy::cast_possible_truncation)]

use super::{output, KernelError, Result};
use crate::tensor::{DType, Tensor, TensorData};

/// One source element, read exactly.
#[derive(Clone, Copy)]
enum Num {
    Int(i128),
    F32(f32),
    F64(f64),
}

fn daz32(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

fn daz64(x: f64) -> f64 {
    if x.is_subnormal() {
        0.0f64.copysign(x)
    } else {
        x
    }
}

/// `cvtt` to a signed integer of `bits` bits: truncation, or the minimum for NaN and
/// out-of-range values.
fn cvtt(x: f64, bits: u32) -> i64 {
    let t = x.trunc();
    let lim = 2f64.powi(bits as i32 - 1);
    if t.is_nan() || t < -lim || t >= lim {
        i64::MIN >> (64 - bits)
    } else {
        t as i64
    }
}

/// Eigen's `float_to_half_rtne`: float bits → half bits, round to nearest even.
fn f32_to_f16(x: f32) -> u16 {
    const F32_INFINITY: u32 = 255 << 23;
    const F16_MAX: u32 = (127 + 16) << 23;
    const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
    let bits = x.to_bits();
    let sign = bits & 0x8000_0000;
    let u = bits ^ sign;
    let o: u32 = if u >= F16_MAX {
        if u > F32_INFINITY {
            0x7e00
        } else {
            0x7c00
        }
    } else if u < (113 << 23) {
        // A half subnormal or zero: the float addition aligns the mantissa and rounds.
        let sum = f32::from_bits(u) + f32::from_bits(DENORM_MAGIC);
        sum.to_bits().wrapping_sub(DENORM_MAGIC)
    } else {
        let mant_odd = (u >> 13) & 1;
        let v = u
            .wrapping_add((15u32.wrapping_sub(127)) << 23)
            .wrapping_add(0xfff)
            .wrapping_add(mant_odd);
        v >> 13
    };
    (o | (sign >> 16)) as u16
}

/// Eigen's `float_to_bfloat16_rtne`: the high 16 bits rounded to nearest even; NaN is the
/// quiet NaN `0x7fc0` with the input's sign.
fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return if x.is_sign_negative() { 0xffc0 } else { 0x7fc0 };
    }
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7fff + lsb) >> 16) as u16
}

/// Half bits → float (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal half: m · 2^-24, exact as a float.
            let v = m as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        (31, 0) => sign | 0x7f80_0000,
        (31, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// float → unsigned of `bits` (32 or 64) bits, as the vectorized loop computes it.
fn to_unsigned(x: Num, bits: u32) -> u64 {
    let half = 2f64.powi(bits as i32 - 1);
    let (t1, t2) = match x {
        Num::F32(v) => (
            cvtt(f64::from(v), bits),
            cvtt(f64::from(v - half as f32), bits),
        ),
        Num::F64(v) => (cvtt(v, bits), cvtt(v - half, bits)),
        Num::Int(_) => (0, 0),
    };
    let r = t1 | (t2 & (t1 >> (bits - 1)));
    if bits == 64 {
        r as u64
    } else {
        u64::from(r as u32)
    }
}

fn read(d: &TensorData) -> Option<Vec<Num>> {
    fn ints<T: Copy + Into<i128>>(v: &[T]) -> Vec<Num> {
        v.iter().map(|&x| Num::Int(x.into())).collect()
    }
    Some(match d {
        TensorData::Bool(v) => v.iter().map(|&b| Num::Int(b.into())).collect(),
        TensorData::Int8(v) => ints(v),
        TensorData::Int16(v) => ints(v),
        TensorData::Int32(v) => ints(v),
        TensorData::Int64(v) => ints(v),
        TensorData::UInt8(v) => ints(v),
        TensorData::UInt16(v) => ints(v),
        TensorData::UInt32(v) => ints(v),
        TensorData::UInt64(v) => ints(v),
        TensorData::Float32(v) => v.iter().map(|&x| Num::F32(daz32(x))).collect(),
        TensorData::Float64(v) => v.iter().map(|&x| Num::F64(daz64(x))).collect(),
        TensorData::Float16(v) => v.iter().map(|&x| Num::F32(daz32(f16_to_f32(x)))).collect(),
        TensorData::BFloat16(v) => v
            .iter()
            .map(|&x| Num::F32(daz32(f32::from_bits(u32::from(x) << 16))))
            .collect(),
        _ => return None,
    })
}

/// The int32 truncation saturated to `[lo, hi]`, for narrow float → int casts.
fn narrow(x: Num, lo: i64, hi: i64) -> i64 {
    let f = match x {
        Num::F32(v) => f64::from(v),
        Num::F64(v) => v,
        Num::Int(_) => 0.0,
    };
    cvtt(f, 32).clamp(lo, hi)
}

/// `Cast(x, DstT, Truncate)`.
pub fn cast(x: &Tensor, dst: DType, truncate: bool) -> Result<Vec<Tensor>> {
    const OP: &str = "Cast";
    let unsupported = |what: &'static str, dtype: DType| KernelError::InputDtype {
        op: OP,
        input: what,
        expected: "bool, an integer type, half, bfloat16, float or double",
        actual: dtype,
    };
    let vals = read(x.data()).ok_or(unsupported("x", x.dtype()))?;
    // An identity cast keeps the tensor as it is (subnormals included).
    if dst == x.dtype() {
        return Ok(vec![x.clone()]);
    }
    macro_rules! ints {
        ($variant:ident, $t:ty, $float:expr) => {
            TensorData::$variant(
                vals.iter()
                    .map(|&n| match n {
                        Num::Int(i) => i as $t,
                        f => {
                            let conv: fn(Num) -> $t = $float;
                            conv(f)
                        }
                    })
                    .collect(),
            )
        };
    }
    let f64_dst = matches!(x.data(), TensorData::Float64(_));
    let data = match dst {
        DType::Bool => TensorData::Bool(
            vals.iter()
                .map(|&n| match n {
                    Num::Int(i) => i != 0,
                    Num::F32(v) => v != 0.0,
                    Num::F64(v) => v != 0.0,
                })
                .collect(),
        ),
        DType::Int8 => ints!(Int8, i8, |f| narrow(f, -128, 127) as i8),
        DType::Int16 => ints!(Int16, i16, |f| narrow(f, -32768, 32767) as i16),
        DType::UInt16 => ints!(UInt16, u16, |f| narrow(f, 0, 65535) as u16),
        DType::UInt8 if f64_dst => ints!(UInt8, u8, |f| {
            let v = narrow(f, 0, 65535);
            if v > 32767 {
                0
            } else {
                v.min(255) as u8
            }
        }),
        DType::UInt8 => ints!(UInt8, u8, |f| narrow(f, 0, 255) as u8),
        DType::Int32 => ints!(Int32, i32, |f| match f {
            Num::F32(v) => cvtt(f64::from(v), 32) as i32,
            Num::F64(v) => cvtt(v, 32) as i32,
            Num::Int(_) => 0,
        }),
        DType::Int64 => ints!(Int64, i64, |f| match f {
            Num::F32(v) => cvtt(f64::from(v), 64),
            Num::F64(v) => cvtt(v, 64),
            Num::Int(_) => 0,
        }),
        DType::UInt32 => ints!(UInt32, u32, |f| to_unsigned(f, 32) as u32),
        DType::UInt64 => ints!(UInt64, u64, |f| to_unsigned(f, 64)),
        DType::Float32 => TensorData::Float32(
            vals.iter()
                .map(|&n| match n {
                    Num::Int(i) => i as f32,
                    Num::F32(v) => v,
                    Num::F64(v) => {
                        let v = if truncate {
                            f64::from_bits(v.to_bits() & !((1u64 << 29) - 1))
                        } else {
                            v
                        };
                        daz32(v as f32)
                    }
                })
                .collect(),
        ),
        DType::Float64 => TensorData::Float64(
            vals.iter()
                .map(|&n| match n {
                    Num::Int(i) => i as f64,
                    Num::F32(v) => f64::from(v),
                    Num::F64(v) => v,
                })
                .collect(),
        ),
        DType::Float16 => TensorData::Float16(
            vals.iter()
                .map(|&n| match n {
                    Num::Int(i) => f32_to_f16(i as f32),
                    Num::F32(v) => f32_to_f16(v),
                    Num::F64(v) => f32_to_f16(daz32(v as f32)),
                })
                .collect(),
        ),
        // Float → bfloat16 is integer arithmetic on the bits: subnormals are kept.
        DType::BFloat16 if matches!(x.data(), TensorData::Float32(_)) => match x.data() {
            TensorData::Float32(v) => {
                TensorData::BFloat16(v.iter().map(|&f| f32_to_bf16(f)).collect())
            }
            _ => return Err(unsupported("x", x.dtype())),
        },
        DType::BFloat16 => TensorData::BFloat16(
            vals.iter()
                .map(|&n| match n {
                    Num::Int(i) => f32_to_bf16(i as f32),
                    Num::F32(v) => f32_to_bf16(v),
                    Num::F64(v) => f32_to_bf16(daz32(v as f32)),
                })
                .collect(),
        ),
        other => return Err(unsupported("DstT", other)),
    };
    Ok(vec![output(OP, x.shape().to_vec(), data)?])
}
