//! Unicode kernels over UTF-8 input: `UnicodeDecode` (code points as a ragged int32
//! tensor) and `UnicodeTranscode` (to UTF-8, UTF-16-BE or UTF-32-BE). Invalid input follows
//! TensorFlow's ICU converter with `errors`: `replace` puts `replacement_char` for each maximal ill-formed subpart
//! (the Unicode "best practice" ICU implements), `ignore` drops it, `strict` fails with
//! TensorFlow's message. `replace_control_characters` replaces U+0000–U+001F as well.

use super::{output, strings_of, KernelError, Result};
use crate::tensor::{DType, Tensor, TensorData};

/// How ill-formed input is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Errors {
    Strict,
    Replace,
    Ignore,
}

/// The decoding attributes `UnicodeDecode` and `UnicodeTranscode` share.
#[derive(Debug, Clone)]
pub struct DecodeAttrs {
    pub input_encoding: String,
    pub errors: Errors,
    pub replacement_char: i64,
    pub replace_control_characters: bool,
}

impl Errors {
    /// The attribute's value as TensorFlow spells it.
    pub fn parse(op: &'static str, s: &str) -> Result<Self> {
        match s {
            "strict" => Ok(Errors::Strict),
            "replace" => Ok(Errors::Replace),
            "ignore" => Ok(Errors::Ignore),
            other => Err(KernelError::InvalidAttr {
                op,
                attr: "errors",
                value: other.to_owned(),
                reason: "must be strict, replace or ignore",
            }),
        }
    }
}

/// The length of the maximal well-formed prefix of a UTF-8 sequence starting at `s[0]`, and
/// its code point when the whole sequence is well formed.
fn next_char(s: &[u8]) -> (usize, Option<u32>) {
    let b0 = s[0];
    let (len, min_second, max_second, init) = match b0 {
        0x00..=0x7f => return (1, Some(u32::from(b0))),
        0xc2..=0xdf => (2, 0x80, 0xbf, u32::from(b0 & 0x1f)),
        0xe0 => (3, 0xa0, 0xbf, u32::from(b0 & 0x0f)),
        0xe1..=0xec | 0xee..=0xef => (3, 0x80, 0xbf, u32::from(b0 & 0x0f)),
        0xed => (3, 0x80, 0x9f, u32::from(b0 & 0x0f)),
        0xf0 => (4, 0x90, 0xbf, u32::from(b0 & 0x07)),
        0xf1..=0xf3 => (4, 0x80, 0xbf, u32::from(b0 & 0x07)),
        0xf4 => (4, 0x80, 0x8f, u32::from(b0 & 0x07)),
        _ => return (1, None),
    };
    let mut cp = init;
    for k in 1..len {
        let Some(&b) = s.get(k) else {
            return (k, None);
        };
        let ok = if k == 1 {
            (min_second..=max_second).contains(&b)
        } else {
            (0x80..=0xbf).contains(&b)
        };
        if !ok {
            return (k, None);
        }
        cp = (cp << 6) | u32::from(b & 0x3f);
    }
    (len, Some(cp))
}

fn decode(op: &'static str, s: &[u8], attrs: &DecodeAttrs) -> Result<Vec<i32>> {
    let replacement = i32::try_from(attrs.replacement_char).unwrap_or(0xfffd);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let (n, cp) = next_char(&s[i..]);
        match cp {
            Some(c) if attrs.replace_control_characters && c < 0x20 => out.push(replacement),
            Some(c) => out.push(i32::try_from(c).unwrap_or(replacement)),
            None => match attrs.errors {
                Errors::Replace => out.push(replacement),
                Errors::Ignore => {}
                Errors::Strict => {
                    return Err(KernelError::InvalidInput {
                        op,
                        input: "input",
                        reason: "Invalid formatting on input string".into(),
                    })
                }
            },
        }
        i += n;
    }
    Ok(out)
}

fn check_encoding(op: &'static str, enc: &str) -> Result<()> {
    if enc == "UTF-8" {
        Ok(())
    } else {
        Err(KernelError::InvalidAttr {
            op,
            attr: "input_encoding",
            value: enc.to_owned(),
            reason: "only UTF-8 input is supported",
        })
    }
}

/// `UnicodeDecode`: the code points of every string (flattened), as row splits and values.
pub fn unicode_decode(input: &Tensor, attrs: &DecodeAttrs, tsplits: DType) -> Result<Vec<Tensor>> {
    const OP: &str = "UnicodeDecode";
    check_encoding(OP, &attrs.input_encoding)?;
    let strings = strings_of(OP, "input", input)?;
    let mut splits = vec![0i64];
    let mut chars = Vec::new();
    for s in strings {
        chars.extend(decode(OP, s, attrs)?);
        splits.push(i64::try_from(chars.len()).unwrap_or(i64::MAX));
    }
    let ns = splits.len();
    let splits = if tsplits == DType::Int32 {
        TensorData::Int32(
            splits
                .into_iter()
                .map(|x| i32::try_from(x).unwrap_or(i32::MAX))
                .collect(),
        )
    } else {
        TensorData::Int64(splits)
    };
    let n = chars.len();
    Ok(vec![
        output(OP, vec![ns], splits)?,
        output(OP, vec![n], TensorData::Int32(chars))?,
    ])
}

/// `UnicodeTranscode` from UTF-8 to `output_encoding` (UTF-8, UTF-16-BE or UTF-32-BE).
pub fn unicode_transcode(
    input: &Tensor,
    attrs: &DecodeAttrs,
    output_encoding: &str,
) -> Result<Vec<Tensor>> {
    const OP: &str = "UnicodeTranscode";
    check_encoding(OP, &attrs.input_encoding)?;
    let strings = strings_of(OP, "input", input)?;
    let mut out = Vec::with_capacity(strings.len());
    for s in strings {
        let cps = decode(OP, s, attrs)?;
        let mut bytes = Vec::with_capacity(s.len() * 2);
        for cp in cps {
            let c = u32::try_from(cp)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{fffd}');
            match output_encoding {
                "UTF-8" => {
                    let mut buf = [0u8; 4];
                    bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                "UTF-16-BE" => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        bytes.extend_from_slice(&unit.to_be_bytes());
                    }
                }
                "UTF-32-BE" => bytes.extend_from_slice(&u32::from(c).to_be_bytes()),
                other => {
                    return Err(KernelError::InvalidAttr {
                        op: OP,
                        attr: "output_encoding",
                        value: other.to_owned(),
                        reason: "must be UTF-8, UTF-16-BE or UTF-32-BE",
                    })
                }
            }
        }
        out.push(bytes);
    }
    Ok(vec![output(
        OP,
        input.shape().to_vec(),
        TensorData::String(out),
    )?])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(errors: Errors) -> DecodeAttrs {
        DecodeAttrs {
            input_encoding: "UTF-8".into(),
            errors,
            replacement_char: 0xfffd,
            replace_control_characters: false,
        }
    }

    /// Known answers from TensorFlow 2.18.1: `tf.strings.unicode_decode(b"a\xe2\x82z\xff",
    /// "UTF-8")` is `[97, 65533, 122, 65533]` (the truncated 3-byte sequence is one maximal
    /// subpart), with errors="ignore" `[97, 122]`, with errors="strict" an error.
    #[test]
    fn ill_formed_input_per_maximal_subpart() {
        let s = b"a\xe2\x82z\xff";
        assert_eq!(
            decode("UnicodeDecode", s, &attrs(Errors::Replace)).expect("decodes"),
            vec![97, 0xfffd, 122, 0xfffd]
        );
        assert_eq!(
            decode("UnicodeDecode", s, &attrs(Errors::Ignore)).expect("decodes"),
            vec![97, 122]
        );
        assert!(decode("UnicodeDecode", s, &attrs(Errors::Strict)).is_err());
        assert_eq!(
            decode("UnicodeDecode", "é日🙂".as_bytes(), &attrs(Errors::Strict)).expect("ok"),
            vec![0xe9, 0x65e5, 0x1f642]
        );
    }
}
