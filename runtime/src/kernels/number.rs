//! TensorFlow's string → number parsers (`tensorflow/core/platform/numbers.cc`):
//! `safe_strto32` / `safe_strto64` and `safe_strtof` / `safe_strtod`, the latter being
//! double-conversion's `StringToDoubleConverter` with ALLOW_HEX, leading and trailing spaces
//! and case-insensitive "inf" / "nan".

/// C's `isspace` in the "C" locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn trim_spaces(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| !is_space(b)).unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|&b| !is_space(b))
        .map_or(start, |e| e + 1);
    &s[start..end]
}

/// `safe_strto64` (and `safe_strto32` with `min`/`max` of int32): optional spaces, an optional
/// '-' (no '+'), decimal digits, optional spaces; nothing else.
pub(crate) fn parse_int(s: &[u8], min: i64, max: i64) -> Option<i64> {
    let s = trim_spaces(s);
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: i128 = 0;
    for &d in digits {
        v = v * 10 + i128::from(d - b'0');
        if v > i128::from(max) + 1 {
            return None;
        }
    }
    let v = if neg { -v } else { v };
    if v < i128::from(min) || v > i128::from(max) {
        return None;
    }
    i64::try_from(v).ok()
}

/// TensorFlow's `kFastToBufferSize`: `safe_strtod` refuses strings of this length or longer.
const FAST_TO_BUFFER_SIZE: usize = 32;

/// What a float string denotes, before rounding to a width.
enum FloatText<'a> {
    /// A decimal literal (ASCII, accepted by Rust's float parser), sign included.
    Decimal(&'a str),
    /// A hexadecimal integer.
    Hex {
        negative: bool,
        value: u128,
    },
    Inf {
        negative: bool,
    },
    Nan {
        negative: bool,
    },
    /// Only spaces: double-conversion's "empty string value", 0.0.
    Blank,
}

fn classify(s: &[u8]) -> Option<FloatText<'_>> {
    if s.is_empty() || s.len() >= FAST_TO_BUFFER_SIZE {
        return None;
    }
    let t = trim_spaces(s);
    if t.is_empty() {
        return Some(FloatText::Blank);
    }
    let (negative, body) = match t[0] {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if body.eq_ignore_ascii_case(b"inf") {
        return Some(FloatText::Inf { negative });
    }
    if body.eq_ignore_ascii_case(b"nan") {
        return Some(FloatText::Nan { negative });
    }
    if body.len() > 2 && body[0] == b'0' && (body[1] == b'x' || body[1] == b'X') {
        let mut value: u128 = 0;
        for &c in &body[2..] {
            let d = (c as char).to_digit(16)?;
            value = value.checked_mul(16)?.checked_add(u128::from(d))?;
        }
        return Some(FloatText::Hex { negative, value });
    }
    // digits [. digits] [(e|E) [sign] digits], at least one mantissa digit.
    let mut i = 0;
    let int_digits = body.iter().take_while(|b| b.is_ascii_digit()).count();
    i += int_digits;
    let mut frac_digits = 0;
    if body.get(i) == Some(&b'.') {
        i += 1;
        frac_digits = body[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        i += frac_digits;
    }
    if int_digits + frac_digits == 0 {
        return None;
    }
    if matches!(body.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(body.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let exp_digits = body[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if exp_digits == 0 {
            return None;
        }
        i += exp_digits;
    }
    if i != body.len() {
        return None;
    }
    std::str::from_utf8(t).ok().map(FloatText::Decimal)
}

/// `safe_strtod`.
pub(crate) fn parse_f64(s: &[u8]) -> Option<f64> {
    Some(match classify(s)? {
        FloatText::Decimal(d) => d.parse::<f64>().ok()?,
        FloatText::Hex { negative, value } => signed(value as f64, negative),
        FloatText::Inf { negative } => signed(f64::INFINITY, negative),
        FloatText::Nan { negative } => signed(f64::NAN, negative),
        FloatText::Blank => 0.0,
    })
}

/// `safe_strtof`. TensorFlow runs kernels with denormals flushed to zero, so a result in
/// float32's subnormal range becomes a zero of the same sign ("1e-40" gives 0.0; doubles keep
/// their subnormals, "4.9e-324" gives 5e-324).
pub(crate) fn parse_f32(s: &[u8]) -> Option<f32> {
    let v = match classify(s)? {
        FloatText::Decimal(d) => d.parse::<f32>().ok()?,
        FloatText::Hex { negative, value } => signed(value as f32, negative),
        FloatText::Inf { negative } => signed(f32::INFINITY, negative),
        FloatText::Nan { negative } => signed(f32::NAN, negative),
        FloatText::Blank => 0.0,
    };
    Some(if v.is_subnormal() {
        0.0f32.copysign(v)
    } else {
        v
    })
}

fn signed<T: std::ops::Neg<Output = T>>(v: T, negative: bool) -> T {
    if negative {
        -v
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_follow_safe_strto() {
        assert_eq!(parse_int(b" -12 ", i64::MIN, i64::MAX), Some(-12));
        assert_eq!(parse_int(b"+1", i64::MIN, i64::MAX), None);
        assert_eq!(parse_int(b"- 1", i64::MIN, i64::MAX), None);
        assert_eq!(parse_int(b"", i64::MIN, i64::MAX), None);
        assert_eq!(
            parse_int(b"-9223372036854775808", i64::MIN, i64::MAX),
            Some(i64::MIN)
        );
        assert_eq!(parse_int(b"9223372036854775808", i64::MIN, i64::MAX), None);
        assert_eq!(parse_int(&[b'9'; 500], i64::MIN, i64::MAX), None);
    }

    #[test]
    fn floats_follow_double_conversion() {
        assert_eq!(parse_f64(b"0x1f"), Some(31.0));
        assert_eq!(parse_f64(b" "), Some(0.0));
        assert_eq!(parse_f64(b""), None);
        assert_eq!(parse_f64(b"infinity"), None);
        assert_eq!(parse_f32(b"-1e-40").map(f32::to_bits), Some(0x8000_0000));
        assert_eq!(parse_f64(&[b'1'; 32]), None);
        assert_eq!(parse_f64(&[0xff, b'1']), None);
    }
}
