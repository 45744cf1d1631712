//! String kernels: `StringToHashBucketFast`, `StringToHashBucketStrong`, `StringLower`,
//! `StringUpper`, `StringStrip`, `StringJoin`, `Substr`, `StringToNumber`, `AsString`,
//! `StringSplitV2`, `RegexReplace` (RE2 semantics on the `regex` crate, see `super::re2`).

use std::num::NonZeroU64;

use super::printf::{FloatConv, Spec};
use super::{
    broadcast_index, broadcast_shapes, int_values, number, output, show, strings_of, KernelError,
    Result,
};
use crate::hash::to_hash_bucket_fast;
use crate::tensor::{checked_num_elements, DType, Tensor, TensorData};

fn num_buckets_attr(op: &'static str, num_buckets: i64) -> Result<NonZeroU64> {
    u64::try_from(num_buckets)
        .ok()
        .and_then(NonZeroU64::new)
        .ok_or(KernelError::InvalidAttr {
            op,
            attr: "num_buckets",
            value: num_buckets.to_string(),
            reason: "must be at least 1",
        })
}

fn hash_buckets(input: &Tensor, f: impl Fn(&[u8]) -> u64, op: &'static str) -> Result<Tensor> {
    let strings = strings_of(op, "input", input)?;
    // A bucket is below num_buckets <= i64::MAX, so the cast is lossless.
    let out = strings.iter().map(|s| f(s) as i64).collect();
    output(op, input.shape().to_vec(), TensorData::Int64(out))
}

/// `StringToHashBucketFast`: `Fingerprint64(s) % num_buckets`, int64, same shape.
pub fn string_to_hash_bucket_fast(input: &Tensor, num_buckets: i64) -> Result<Vec<Tensor>> {
    const OP: &str = "StringToHashBucketFast";
    let n = num_buckets_attr(OP, num_buckets)?;
    Ok(vec![hash_buckets(
        input,
        |s| to_hash_bucket_fast(s, n),
        OP,
    )?])
}

/// `StringToHashBucketStrong`: `SipHash-2-4(key, s) % num_buckets`, with the two int64 key
/// attributes read as the two 64-bit halves of the 128-bit key.
pub fn string_to_hash_bucket_strong(
    input: &Tensor,
    num_buckets: i64,
    key: &[i64],
) -> Result<Vec<Tensor>> {
    const OP: &str = "StringToHashBucketStrong";
    let n = num_buckets_attr(OP, num_buckets)?;
    let &[k0, k1] = key else {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "key",
            value: format!("{key:?}"),
            reason: "must have 2 elements",
        });
    };
    let (k0, k1) = (k0 as u64, k1 as u64);
    Ok(vec![hash_buckets(
        input,
        |s| siphash24(k0, k1, s) % n.get(),
        OP,
    )?])
}

/// SipHash-2-4 (Aumasson and Bernstein), as highwayhash's `SipHash` computes it.
pub(crate) fn siphash24(k0: u64, k1: u64, data: &[u8]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let compress = |m: u64, v: &mut [u64; 4]| {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    };
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        compress(u64::from_le_bytes(b), &mut v);
    }
    let mut last = [0u8; 8];
    let rem = chunks.remainder();
    last[..rem.len()].copy_from_slice(rem);
    last[7] = data.len().to_le_bytes()[0];
    compress(u64::from_le_bytes(last), &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

fn check_encoding(op: &'static str, encoding: &str) -> Result<()> {
    if encoding.is_empty() {
        Ok(())
    } else {
        Err(KernelError::InvalidAttr {
            op,
            attr: "encoding",
            value: format!("{encoding:?}"),
            reason: "only \"\" (ASCII case mapping) is supported",
        })
    }
}

/// An elementwise string op: `f` of every string of `input`, in its shape.
fn map_strings(
    op: &'static str,
    input: &Tensor,
    f: impl Fn(&[u8]) -> Vec<u8>,
) -> Result<Vec<Tensor>> {
    let strings = strings_of(op, "input", input)?;
    let out = strings.iter().map(|s| f(s)).collect();
    Ok(vec![output(
        op,
        input.shape().to_vec(),
        TensorData::String(out),
    )?])
}

fn map_bytes(op: &'static str, input: &Tensor, f: fn(&u8) -> u8) -> Result<Vec<Tensor>> {
    map_strings(op, input, |s| s.iter().map(f).collect())
}

/// `StringLower` with `encoding=""`: ASCII A-Z mapped, every other byte kept.
pub fn string_lower(input: &Tensor, encoding: &str) -> Result<Vec<Tensor>> {
    check_encoding("StringLower", encoding)?;
    map_bytes("StringLower", input, u8::to_ascii_lowercase)
}

/// `StringUpper` with `encoding=""`: ASCII a-z mapped, every other byte kept.
pub fn string_upper(input: &Tensor, encoding: &str) -> Result<Vec<Tensor>> {
    check_encoding("StringUpper", encoding)?;
    map_bytes("StringUpper", input, u8::to_ascii_uppercase)
}

/// `StringJoin`: elementwise join with `separator`. Scalars broadcast; every non-scalar input
/// must have the same shape (no other broadcasting, as in TensorFlow).
pub fn string_join(inputs: &[&Tensor], separator: &[u8]) -> Result<Vec<Tensor>> {
    const OP: &str = "StringJoin";
    let mut shape: Option<&[usize]> = None;
    let mut columns = Vec::with_capacity(inputs.len());
    for t in inputs {
        columns.push(strings_of(OP, "inputs", t)?);
        if t.shape().is_empty() {
            continue;
        }
        match shape {
            None => shape = Some(t.shape()),
            Some(s) if s == t.shape() => {}
            Some(s) => {
                return Err(KernelError::IncompatibleShapes {
                    op: OP,
                    left: "inputs",
                    left_shape: s.to_vec(),
                    right: "inputs",
                    right_shape: t.shape().to_vec(),
                })
            }
        }
    }
    if inputs.is_empty() {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "N",
            value: "0".into(),
            reason: "must be at least 1",
        });
    }
    let shape = shape.unwrap_or(&[]).to_vec();
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = Vec::new();
        for (j, col) in columns.iter().enumerate() {
            if j > 0 {
                s.extend_from_slice(separator);
            }
            s.extend_from_slice(if col.len() == 1 && inputs[j].shape().is_empty() {
                &col[0]
            } else {
                &col[i]
            });
        }
        out.push(s);
    }
    Ok(vec![output(OP, shape, TensorData::String(out))?])
}

/// Whether a byte continues a UTF-8 character (`10xxxxxx`).
fn is_trail_byte(b: u8) -> bool {
    b & 0xc0 == 0x80
}

/// TensorFlow's `ForwardNUTF8CharPositions`: from byte `pos`, `n` characters forward (each a
/// byte and the trail bytes after it), stopping at the end.
fn forward_utf8_chars(s: &[u8], mut pos: usize, n: i64) -> usize {
    let mut counted = 0i64;
    while counted < n && pos < s.len() {
        pos += 1;
        while pos < s.len() && is_trail_byte(s[pos]) {
            pos += 1;
        }
        counted += 1;
    }
    pos
}

/// `Substr`: `len` units from `pos` (negative `pos` counts from the end). With
/// `unit="BYTE"` a negative `len` takes the rest; with `"UTF8_CHAR"` positions count
/// characters as TensorFlow does (bytes that are not UTF-8 trail bytes) and a negative `len`
/// takes nothing. `pos` and `len` have one shape, which broadcasts with `input`'s; a `pos`
/// outside `[-size, size]` is an error naming the string and its index.
pub fn substr(input: &Tensor, pos: &Tensor, len: &Tensor, unit: &str) -> Result<Vec<Tensor>> {
    const OP: &str = "Substr";
    let utf8 = match unit {
        "BYTE" => false,
        "UTF8_CHAR" => true,
        _ => {
            return Err(KernelError::InvalidAttr {
                op: OP,
                attr: "unit",
                value: format!("{unit:?}"),
                reason: "must be \"BYTE\" or \"UTF8_CHAR\"",
            })
        }
    };
    let strings = strings_of(OP, "input", input)?;
    if pos.dtype() != len.dtype() {
        return Err(KernelError::InputDtype {
            op: OP,
            input: "len",
            expected: pos.dtype().name(),
            actual: len.dtype(),
        });
    }
    let positions = int_values(OP, "pos", pos)?;
    let lengths = int_values(OP, "len", len)?;
    if pos.shape() != len.shape() {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "pos",
            left_shape: pos.shape().to_vec(),
            right: "len",
            right_shape: len.shape().to_vec(),
        });
    }
    let shape = broadcast_shapes(input.shape(), pos.shape()).ok_or_else(|| {
        KernelError::IncompatibleShapes {
            op: OP,
            left: "input",
            left_shape: input.shape().to_vec(),
            right: "pos",
            right_shape: pos.shape().to_vec(),
        }
    })?;
    checked_num_elements(DType::String, &shape)
        .map_err(|source| KernelError::Output { op: OP, source })?;
    let si = broadcast_index(input.shape(), &shape);
    let pi = broadcast_index(pos.shape(), &shape);
    let mut out = Vec::with_capacity(si.len());
    for (i, (&s_idx, &p_idx)) in si.iter().zip(&pi).enumerate() {
        let s = &strings[s_idx];
        let size = if utf8 {
            s.iter().filter(|&&b| !is_trail_byte(b)).count() as i64
        } else {
            s.len() as i64
        };
        let p = positions[p_idx];
        let start = if p < 0 { p + size } else { p };
        if !(0..=size).contains(&start) {
            return Err(KernelError::PosOutOfRange {
                op: OP,
                pos: p,
                string: show(s),
                index: i,
            });
        }
        let l = lengths[p_idx];
        if utf8 {
            let from = forward_utf8_chars(s, 0, start);
            let to = forward_utf8_chars(s, from, l);
            out.push(s[from..to].to_vec());
            continue;
        }
        let avail = size - start;
        let take = if l < 0 { avail } else { l.min(avail) };
        let from = usize::try_from(start).unwrap_or(0);
        let to = usize::try_from(start + take).unwrap_or(from);
        out.push(s[from..to].to_vec());
    }
    Ok(vec![output(OP, shape, TensorData::String(out))?])
}

/// `StringToNumber` to float32, float64, int32 or int64 with TensorFlow's parsers: ints are
/// optional spaces, an optional '-', digits, optional spaces; floats follow
/// double-conversion (hex integers, "inf"/"nan" in any case, spaces around, under 32 bytes).
pub fn string_to_number(input: &Tensor, out_type: DType) -> Result<Vec<Tensor>> {
    const OP: &str = "StringToNumber";
    let strings = strings_of(OP, "string_tensor", input)?;
    let bad = |index: usize| KernelError::NotANumber {
        op: OP,
        index,
        value: show(&strings[index]),
        dtype: out_type,
    };
    let data = match out_type {
        DType::Float32 => TensorData::Float32(
            strings
                .iter()
                .enumerate()
                .map(|(i, s)| number::parse_f32(s).ok_or_else(|| bad(i)))
                .collect::<Result<_>>()?,
        ),
        DType::Float64 => TensorData::Float64(
            strings
                .iter()
                .enumerate()
                .map(|(i, s)| number::parse_f64(s).ok_or_else(|| bad(i)))
                .collect::<Result<_>>()?,
        ),
        DType::Int32 => TensorData::Int32(
            strings
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    number::parse_int(s, i32::MIN.into(), i32::MAX.into())
                        .and_then(|v| i32::try_from(v).ok())
                        .ok_or_else(|| bad(i))
                })
                .collect::<Result<_>>()?,
        ),
        DType::Int64 => TensorData::Int64(
            strings
                .iter()
                .enumerate()
                .map(|(i, s)| number::parse_int(s, i64::MIN, i64::MAX).ok_or_else(|| bad(i)))
                .collect::<Result<_>>()?,
        ),
        other => {
            return Err(KernelError::InvalidAttr {
                op: OP,
                attr: "out_type",
                value: other.name().into(),
                reason: "must be float, double, int32 or int64",
            })
        }
    };
    Ok(vec![output(OP, input.shape().to_vec(), data)?])
}

/// The largest `width` and `precision` [`as_string`] accepts.
pub const MAX_WIDTH: i64 = 4096;

/// `AsString`'s attributes (TensorFlow's defaults via [`Default`]).
#[derive(Debug, Clone, Default)]
pub struct AsStringAttrs {
    /// Digits after the point (`-1`: printf's default).
    pub precision: i64,
    pub scientific: bool,
    pub shortest: bool,
    /// Minimum width (`-1`: none).
    pub width: i64,
    /// One printf flag: "", " ", "+", "-", "0" or "#".
    pub fill: String,
}

impl AsStringAttrs {
    /// TensorFlow's defaults: precision -1, width -1, no flags.
    pub fn tf_default() -> AsStringAttrs {
        AsStringAttrs {
            precision: -1,
            width: -1,
            ..AsStringAttrs::default()
        }
    }
}

/// `AsString`: each number printed with the C format TensorFlow builds from the attributes
/// (`%f` by default for floats, `%e` with `scientific`, `%g` with `shortest`; `%d` for
/// integers; "true"/"false" for bools).
pub fn as_string(input: &Tensor, attrs: &AsStringAttrs) -> Result<Vec<Tensor>> {
    const OP: &str = "AsString";
    let attr_err = |attr, value: String, reason| KernelError::InvalidAttr {
        op: OP,
        attr,
        value,
        reason,
    };
    if attrs.fill.len() > 1 {
        return Err(attr_err(
            "fill",
            format!("{:?}", attrs.fill),
            "must be one or fewer characters",
        ));
    }
    let flag = attrs.fill.bytes().next();
    if let Some(f) = flag {
        if !matches!(f, b' ' | b'+' | b'-' | b'0' | b'#') {
            return Err(attr_err(
                "fill",
                format!("{:?}", attrs.fill),
                "fill argument not supported",
            ));
        }
    }
    if attrs.scientific && attrs.shortest {
        return Err(attr_err(
            "scientific",
            "true".into(),
            "cannot select both scientific and shortest notation",
        ));
    }
    // TensorFlow takes any width or precision; Lode bounds them so that a hostile graph
    // cannot ask for gigabytes per element.
    for (attr, v) in [("width", attrs.width), ("precision", attrs.precision)] {
        if v > MAX_WIDTH {
            return Err(attr_err(
                attr,
                v.to_string(),
                "Lode limits width and precision to 4096",
            ));
        }
    }
    let spec = Spec {
        flag,
        width: usize::try_from(attrs.width).ok(),
        precision: usize::try_from(attrs.precision).ok(),
    };
    let is_float = matches!(input.dtype(), DType::Float32 | DType::Float64);
    if spec.precision.is_some() && !is_float {
        return Err(attr_err(
            "precision",
            attrs.precision.to_string(),
            "precision not supported for integer and bool inputs",
        ));
    }
    let conv = if attrs.shortest {
        FloatConv::G
    } else if attrs.scientific {
        FloatConv::E
    } else {
        FloatConv::F
    };
    if (attrs.scientific || attrs.shortest) && !is_float {
        return Err(attr_err(
            "scientific",
            "true".into(),
            "scientific and shortest apply to floats only",
        ));
    }
    fn ints<T: Copy + Into<i128>>(v: &[T], spec: &Spec) -> Vec<Vec<u8>> {
        v.iter().map(|&x| spec.int(x.into())).collect()
    }
    let out = match input.data() {
        TensorData::Int8(v) => ints(v, &spec),
        TensorData::Int16(v) => ints(v, &spec),
        TensorData::Int32(v) => ints(v, &spec),
        TensorData::Int64(v) => ints(v, &spec),
        TensorData::UInt8(v) => ints(v, &spec),
        TensorData::UInt16(v) => ints(v, &spec),
        TensorData::UInt32(v) => ints(v, &spec),
        TensorData::UInt64(v) => ints(v, &spec),
        // TensorFlow's kernels run with denormals treated as zero, so a float32 subnormal
        // prints as a zero of its sign (1e-40 gives "0.000000e+00").
        TensorData::Float32(v) => v
            .iter()
            .map(|&x| {
                let x = if x.is_subnormal() {
                    0.0f32.copysign(x)
                } else {
                    x
                };
                spec.float(f64::from(x), conv)
            })
            .collect(),
        TensorData::Float64(v) => v.iter().map(|&x| spec.float(x, conv)).collect(),
        TensorData::Bool(v) => v
            .iter()
            .map(|&b| {
                if b {
                    b"true".to_vec()
                } else {
                    b"false".to_vec()
                }
            })
            .collect(),
        _ => {
            return Err(KernelError::InputDtype {
                op: OP,
                input: "input",
                expected: "an integer, float, double or bool",
                actual: input.dtype(),
            })
        }
    };
    Ok(vec![output(
        OP,
        input.shape().to_vec(),
        TensorData::String(out),
    )?])
}

/// C's `isspace` in the "C" locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// TensorFlow's `SplitV2`, which follows Python's `str.split`.
fn split_v2<'a>(s: &'a [u8], sep: &[u8], maxsplit: i64) -> Vec<&'a [u8]> {
    if maxsplit == 0 {
        return vec![s];
    }
    let mut result = Vec::new();
    let mut text = s;
    let mut splits = 0i64;
    if sep.is_empty() {
        let skip = |t: &'a [u8]| &t[t.iter().position(|&b| !is_space(b)).unwrap_or(t.len())..];
        text = skip(text);
        while !text.is_empty() {
            let end = text.iter().position(|&b| is_space(b)).unwrap_or(text.len());
            result.push(&text[..end]);
            text = skip(&text[end..]);
            splits += 1;
            if maxsplit > 0 && splits == maxsplit {
                result.push(text);
                return result;
            }
        }
        return result;
    }
    while let Some(p) = text.windows(sep.len()).position(|w| w == sep) {
        result.push(&text[..p]);
        text = &text[p + sep.len()..];
        splits += 1;
        if maxsplit > 0 && splits == maxsplit {
            break;
        }
    }
    result.push(text);
    result
}

/// `StringSplitV2`: splits each string of a vector on `sep` (a scalar; "" splits on runs of
/// whitespace), at most `maxsplit` times (`-1`: no limit). Returns the sparse triple
/// `indices` (int64 `[n, 2]`), `values` (string `[n]`) and `shape` (int64 `[2]`).
pub fn string_split_v2(input: &Tensor, sep: &Tensor, maxsplit: i64) -> Result<Vec<Tensor>> {
    const OP: &str = "StringSplitV2";
    let strings = strings_of(OP, "input", input)?;
    let seps = strings_of(OP, "sep", sep)?;
    if input.shape().len() != 1 {
        return Err(KernelError::InputShape {
            op: OP,
            input: "input",
            shape: input.shape().to_vec(),
            reason: "must be a vector",
        });
    }
    if !sep.shape().is_empty() {
        return Err(KernelError::InputShape {
            op: OP,
            input: "sep",
            shape: sep.shape().to_vec(),
            reason: "must be a scalar",
        });
    }
    let mut indices = Vec::new();
    let mut values = Vec::new();
    let mut max_entries = 0usize;
    for (row, s) in strings.iter().enumerate() {
        let parts = split_v2(s, &seps[0], maxsplit);
        max_entries = max_entries.max(parts.len());
        for (col, p) in parts.into_iter().enumerate() {
            indices.push(row as i64);
            indices.push(col as i64);
            values.push(p.to_vec());
        }
    }
    let n = values.len();
    Ok(vec![
        output(OP, vec![n, 2], TensorData::Int64(indices))?,
        output(OP, vec![n], TensorData::String(values))?,
        output(
            OP,
            vec![2],
            TensorData::Int64(vec![strings.len() as i64, max_entries as i64]),
        )?,
    ])
}

// ------------------------------------------------------------------------- RegexReplace

/// `RegexReplace`: replaces the first match (with `replace_global`, every match) of the RE2
/// `pattern` (a string scalar) in each string by `rewrite` (a string scalar in which `\0` …
/// `\9` stand for the match and its groups and `\\` for a backslash; `$` is literal), with
/// RE2's `Replace` / `GlobalReplace` semantics, quirks included:
/// - a rewrite naming a group the pattern does not have leaves every string unchanged;
/// - a malformed rewrite (`\` before anything but a digit or `\`) leaves the string unchanged
///   with `Replace`, while `GlobalReplace` writes it up to the bad escape for each match;
/// - an empty match right after the previous match is skipped, advancing one UTF-8
///   character (one byte where the bytes are not valid UTF-8).
///
/// An invalid pattern (RE2's syntax, see the `re2` module) is an error naming it.
pub fn regex_replace(
    input: &Tensor,
    pattern: &Tensor,
    rewrite: &Tensor,
    replace_global: bool,
) -> Result<Vec<Tensor>> {
    const OP: &str = "RegexReplace";
    strings_of(OP, "input", input)?;
    for (name, t) in [("pattern", pattern), ("rewrite", rewrite)] {
        strings_of(OP, name, t)?;
        if !t.shape().is_empty() {
            return Err(KernelError::InputShape {
                op: OP,
                input: name,
                shape: t.shape().to_vec(),
                reason: "must be a scalar",
            });
        }
    }
    let (Some(pattern), Some(rewrite)) = (
        strings_of(OP, "pattern", pattern)?.first(),
        strings_of(OP, "rewrite", rewrite)?.first(),
    ) else {
        return Err(KernelError::InvalidInput {
            op: OP,
            input: "pattern",
            reason: "pattern and rewrite must hold one string".into(),
        });
    };
    static_regex_replace(OP, input, pattern, rewrite, replace_global)
}

/// `RegexReplace` with the pattern and rewrite given (`StaticRegexReplace` has them as
/// attributes); `op` names the op in errors.
pub fn static_regex_replace(
    op: &'static str,
    input: &Tensor,
    pattern: &[u8],
    rewrite: &[u8],
    replace_global: bool,
) -> Result<Vec<Tensor>> {
    let strings = strings_of(op, "input", input)?;
    let regex = super::re2::compile(pattern).map_err(|why| invalid_pattern(op, pattern, &why))?;
    let out = strings
        .iter()
        .map(|s| super::re2::replace(&regex, s, rewrite, replace_global))
        .collect();
    Ok(vec![output(
        op,
        input.shape().to_vec(),
        TensorData::String(out),
    )?])
}

fn invalid_pattern(op: &'static str, pattern: &[u8], why: &str) -> KernelError {
    KernelError::InvalidInput {
        op,
        input: "pattern",
        reason: format!("invalid pattern {:?}: {why}", show(pattern)),
    }
}

/// `RegexFullMatch` / `StaticRegexFullMatch`: whether each string matches `pattern` (RE2
/// syntax) as a whole (`RE2::FullMatch`).
pub fn regex_full_match(op: &'static str, input: &Tensor, pattern: &[u8]) -> Result<Vec<Tensor>> {
    let strings = strings_of(op, "input", input)?;
    let regex =
        super::re2::compile_full(pattern).map_err(|why| invalid_pattern(op, pattern, &why))?;
    let out = strings.iter().map(|s| regex.is_match(s)).collect();
    Ok(vec![output(
        op,
        input.shape().to_vec(),
        TensorData::Bool(out),
    )?])
}

/// The one string of a scalar string input (`RegexFullMatch`'s pattern).
pub fn scalar_string<'a>(op: &'static str, input: &'static str, t: &'a Tensor) -> Result<&'a [u8]> {
    let v = strings_of(op, input, t)?;
    match (v, t.shape()) {
        ([one], []) => Ok(one),
        _ => Err(KernelError::InputShape {
            op,
            input,
            shape: t.shape().to_vec(),
            reason: "must be a scalar",
        }),
    }
}

/// `StringLength`: bytes per string, or with `unit` `UTF8_CHAR` the UTF-8 characters, counted
/// as TensorFlow does (bytes that are not continuation bytes, so invalid UTF-8 still counts).
pub fn string_length(input: &Tensor, unit: &str) -> Result<Vec<Tensor>> {
    const OP: &str = "StringLength";
    let strings = strings_of(OP, "input", input)?;
    let chars = match unit {
        "BYTE" => false,
        "UTF8_CHAR" => true,
        other => {
            return Err(KernelError::InvalidAttr {
                op: OP,
                attr: "unit",
                value: other.to_owned(),
                reason: "must be BYTE or UTF8_CHAR",
            })
        }
    };
    let lengths = strings
        .iter()
        .map(|s| {
            let n = if chars {
                s.iter().filter(|&&b| b & 0xc0 != 0x80).count()
            } else {
                s.len()
            };
            i32::try_from(n).unwrap_or(i32::MAX)
        })
        .collect();
    Ok(vec![output(
        OP,
        input.shape().to_vec(),
        TensorData::Int32(lengths),
    )?])
}

/// `StringStrip`: leading and trailing ASCII whitespace removed (`absl::StripAsciiWhitespace`:
/// space, `\t`, `\n`, `\v`, `\f`, `\r`).
pub fn string_strip(input: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "StringStrip";
    let strings = strings_of(OP, "input", input)?;
    let space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let out = strings
        .iter()
        .map(|s| {
            let start = s.iter().position(|b| !space(b)).unwrap_or(s.len());
            let end = s.iter().rposition(|b| !space(b)).map_or(start, |e| e + 1);
            s[start..end.max(start)].to_vec()
        })
        .collect();
    Ok(vec![output(
        OP,
        input.shape().to_vec(),
        TensorData::String(out),
    )?])
}

/// `ReduceJoin`: the strings along `reduction_indices` joined with `separator`. Within an
/// output element the first listed dimension varies fastest, as in TensorFlow's kernel
/// (`reduction_indices = [1, 0]` of `[[a, b], [c, d]]` is `a,b,c,d`; `[0, 1]` is `a,c,b,d`).
/// An empty list joins nothing (each string alone); `keep_dims` keeps reduced dims as 1.
pub fn reduce_join(
    inputs: &Tensor,
    reduction_indices: &Tensor,
    keep_dims: bool,
    separator: &[u8],
) -> Result<Vec<Tensor>> {
    const OP: &str = "ReduceJoin";
    let strings = strings_of(OP, "inputs", inputs)?;
    let shape = inputs.shape();
    let rank = i64::try_from(shape.len()).unwrap_or(i64::MAX);
    let mut axes: Vec<usize> = Vec::new();
    for &a in &int_values(OP, "reduction_indices", reduction_indices)? {
        let d = if a < 0 { a + rank } else { a };
        let d = usize::try_from(d)
            .ok()
            .filter(|&d| d < shape.len())
            .ok_or_else(|| KernelError::InvalidInput {
                op: OP,
                input: "reduction_indices",
                reason: format!(
                    "Invalid reduction dimension {a} for input with {rank} dimension(s)"
                ),
            })?;
        if axes.contains(&d) {
            return Err(KernelError::InvalidInput {
                op: OP,
                input: "reduction_indices",
                reason: format!("Duplicate reduction dimension {a}"),
            });
        }
        axes.push(d);
    }
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let out_count: usize = kept.iter().map(|&d| shape[d]).product();
    let join_count: usize = axes.iter().map(|&d| shape[d]).product();
    let mut out = Vec::with_capacity(out_count);
    for o in 0..out_count {
        let mut base = 0usize;
        let mut rest = o;
        for &d in kept.iter().rev() {
            base += (rest % shape[d]) * strides[d];
            rest /= shape[d];
        }
        let mut joined = Vec::new();
        for j in 0..join_count {
            let mut offset = base;
            let mut rest = j;
            for &d in &axes {
                offset += (rest % shape[d]) * strides[d];
                rest /= shape[d];
            }
            if j > 0 {
                joined.extend_from_slice(separator);
            }
            joined.extend_from_slice(&strings[offset]);
        }
        out.push(joined);
    }
    let out_shape: Vec<usize> = (0..shape.len())
        .filter_map(|d| {
            if axes.contains(&d) {
                keep_dims.then_some(1)
            } else {
                Some(shape[d])
            }
        })
        .collect();
    Ok(vec![output(OP, out_shape, TensorData::String(out))?])
}
