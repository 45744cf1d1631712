//! The slice of C's `printf` that `AsString` uses: one flag, a width, a precision and the
//! conversions `d` / `u`, `f`, `e` and `g`, formatted as glibc does (exact decimal expansion,
//! ties to even).

/// A conversion spec `%[flag][width][.precision]conv`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spec {
    /// One of `-`, `+`, ` `, `#`, `0`, or none.
    pub flag: Option<u8>,
    pub width: Option<usize>,
    pub precision: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatConv {
    F,
    E,
    G,
}

impl Spec {
    fn sign(&self, negative: bool) -> &'static str {
        match (negative, self.flag) {
            (true, _) => "-",
            (false, Some(b'+')) => "+",
            (false, Some(b' ')) => " ",
            _ => "",
        }
    }

    /// Pads `sign` + `body` to the width; `zero_ok` says whether '0' pads with zeros.
    fn pad(&self, sign: &str, body: &str, zero_ok: bool) -> Vec<u8> {
        let len = sign.len() + body.len();
        let width = self.width.unwrap_or(0);
        if len >= width {
            return format!("{sign}{body}").into_bytes();
        }
        let fill = width - len;
        let s = match self.flag {
            Some(b'-') => format!("{sign}{body}{}", " ".repeat(fill)),
            Some(b'0') if zero_ok => format!("{sign}{}{body}", "0".repeat(fill)),
            _ => format!("{}{sign}{body}", " ".repeat(fill)),
        };
        s.into_bytes()
    }

    /// `%d` / `%lld` / `%u` / `%llu` of an integer.
    pub(crate) fn int(&self, v: i128) -> Vec<u8> {
        self.pad(self.sign(v < 0), &v.unsigned_abs().to_string(), true)
    }

    /// `%f` / `%e` / `%g` of a double.
    pub(crate) fn float(&self, v: f64, conv: FloatConv) -> Vec<u8> {
        let sign = self.sign(v.is_sign_negative());
        if v.is_nan() {
            return self.pad(sign, "nan", false);
        }
        if v.is_infinite() {
            return self.pad(sign, "inf", false);
        }
        let a = v.abs();
        let alt = self.flag == Some(b'#');
        let body = match conv {
            FloatConv::F => fixed(a, self.precision.unwrap_or(6), alt),
            FloatConv::E => exponential(a, self.precision.unwrap_or(6), alt),
            FloatConv::G => {
                let p = match self.precision {
                    None => 6,
                    Some(0) => 1,
                    Some(p) => p,
                };
                let x = decimal_exponent(a, p - 1);
                let mut s = if x < p as i64 && x >= -4 {
                    fixed(a, usize::try_from(p as i64 - 1 - x).unwrap_or(0), alt)
                } else {
                    exponential(a, p - 1, alt)
                };
                if !alt {
                    s = strip_zeros(&s);
                }
                s
            }
        };
        self.pad(sign, &body, true)
    }
}

fn fixed(a: f64, precision: usize, alt: bool) -> String {
    let mut s = format!("{a:.precision$}");
    if alt && precision == 0 {
        s.push('.');
    }
    s
}

/// The exponent `%e` would print for `a` with `precision` digits after the point.
fn decimal_exponent(a: f64, precision: usize) -> i64 {
    let s = format!("{a:.precision$e}");
    s.rsplit_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0)
}

fn exponential(a: f64, precision: usize, alt: bool) -> String {
    let s = format!("{a:.precision$e}");
    let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i64 = exp.parse().unwrap_or(0);
    let dot = if alt && precision == 0 { "." } else { "" };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{mant}{dot}e{esign}{:02}", exp.unsigned_abs())
}

/// `%g` without '#': drop trailing zeros of the fraction, and the point if nothing is left.
fn strip_zeros(s: &str) -> String {
    let (mant, exp) = match s.find('e') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let mant = if mant.contains('.') {
        mant.trim_end_matches('0').trim_end_matches('.')
    } else {
        mant
    };
    format!("{mant}{exp}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(flag: Option<u8>, width: Option<usize>, precision: Option<usize>) -> Spec {
        Spec {
            flag,
            width,
            precision,
        }
    }

    #[test]
    fn matches_glibc_on_known_answers() {
        // Known answers from glibc's printf.
        let s = spec(None, None, None);
        assert_eq!(s.float(0.0001, FloatConv::G), b"0.0001");
        assert_eq!(s.float(123456.0, FloatConv::G), b"123456");
        assert_eq!(s.float(1234567.0, FloatConv::G), b"1.23457e+06");
        assert_eq!(s.float(-2.5e-7, FloatConv::E), b"-2.500000e-07");
        assert_eq!(s.float(1e100, FloatConv::E), b"1.000000e+100");
        assert_eq!(spec(Some(b'0'), Some(6), None).int(-5), b"-00005");
        assert_eq!(
            spec(Some(b'0'), Some(6), None).float(f64::NAN, FloatConv::F),
            b"   nan"
        );
        assert_eq!(
            spec(Some(b'#'), None, Some(0)).float(1.0, FloatConv::E),
            b"1.e+00"
        );
    }
}
