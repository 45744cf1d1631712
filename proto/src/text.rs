//! Protobuf text format for any message with a descriptor, written for Lode.
//!
//! rust-protobuf ships a text format, but it prints map entries in hash order, loses `f32`
//! precision by parsing through `f64`, cannot read enum numbers, prints unknown enum values
//! wrongly and cannot read back the unknown fields it prints. TensorFlow users diff and edit
//! `.pbtxt` graphs, so Lode prints deterministically and reads back everything it prints:
//!
//! - fields in field-number order, map entries sorted by key (as TensorFlow's printers do);
//! - floats in the shortest form that reads back to the same bits (`nan`, `inf`, `-inf`);
//! - enum values by name, or by number when the schema does not know the value;
//! - unknown fields as `NUMBER: value` (varint as an integer, fixed32/fixed64 as `0x` hex of
//!   8/16 digits, length-delimited as a quoted string), which [`parse`] turns back into unknown
//!   fields, so a binary → text → binary trip keeps them.
//!
//! The parser also reads what TensorFlow's printers write: `#` comments, `<...>` message
//! delimiters, optional `:` before a message, `[a, b]` lists, adjacent string literals, C
//! escapes in strings, `f` suffixes and `inf`/`nan` spellings, and integer enum values.

use std::fmt::Write as _;

use protobuf::reflect::{
    EnumDescriptor, FieldDescriptor, MessageDescriptor, ReflectFieldRef, ReflectValueBox,
    ReflectValueRef, RuntimeFieldType, RuntimeType,
};
use protobuf::{MessageDyn, MessageFull, UnknownValueRef};

/// How deep messages may nest in text before the parser refuses (mirrors the binary limit).
pub const TEXT_RECURSION_LIMIT: usize = crate::io::RECURSION_LIMIT as usize;

/// A text-format syntax or schema error at a 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct TextError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Prints `message` in text format, two spaces per nesting level, one field per line.
pub fn print(message: &dyn MessageDyn) -> String {
    let mut out = String::new();
    print_message(message, &mut out, 0);
    out
}

/// Parses a text-format message of type `M`.
pub fn parse<M: MessageFull>(text: &str) -> Result<M, TextError> {
    let mut message = M::new();
    merge(&mut message, text)?;
    Ok(message)
}

/// Parses text format into an existing message, merging as protobuf does.
pub fn merge(message: &mut dyn MessageDyn, text: &str) -> Result<(), TextError> {
    let mut parser = Parser {
        lexer: Lexer::new(text),
        depth: 0,
    };
    parser.fields_until(message, None)
}

// ---------------------------------------------------------------------------------------------
// Printing

fn print_message(message: &dyn MessageDyn, out: &mut String, indent: usize) {
    let descriptor = message.descriptor_dyn();
    let mut fields: Vec<FieldDescriptor> = descriptor.fields().collect();
    fields.sort_by_key(FieldDescriptor::number);
    for field in &fields {
        match field.get_reflect(message) {
            ReflectFieldRef::Optional(value) => {
                if let Some(value) = value.value() {
                    print_field(out, indent, field.name(), &value);
                }
            }
            ReflectFieldRef::Repeated(values) => {
                for value in &values {
                    print_field(out, indent, field.name(), &value);
                }
            }
            ReflectFieldRef::Map(map) => {
                let mut entries: Vec<(ReflectValueRef, ReflectValueRef)> =
                    map.into_iter().collect();
                entries.sort_by(|a, b| compare_keys(&a.0, &b.0));
                for (key, value) in entries {
                    pad(out, indent);
                    out.push_str(field.name());
                    out.push_str(" {\n");
                    print_field(out, indent + 1, "key", &key);
                    print_field(out, indent + 1, "value", &value);
                    pad(out, indent);
                    out.push_str("}\n");
                }
            }
        }
    }
    let mut unknown: Vec<(u32, UnknownValueRef)> = message.unknown_fields_dyn().iter().collect();
    unknown.sort_by_key(|(number, _)| *number);
    for (number, value) in unknown {
        pad(out, indent);
        let _ = match value {
            UnknownValueRef::Varint(v) => writeln!(out, "{number}: {v}"),
            UnknownValueRef::Fixed32(v) => writeln!(out, "{number}: 0x{v:08x}"),
            UnknownValueRef::Fixed64(v) => writeln!(out, "{number}: 0x{v:016x}"),
            UnknownValueRef::LengthDelimited(bytes) => {
                let _ = write!(out, "{number}: ");
                quote(bytes, out);
                writeln!(out)
            }
        };
    }
}

fn compare_keys(a: &ReflectValueRef, b: &ReflectValueRef) -> std::cmp::Ordering {
    match (a, b) {
        (ReflectValueRef::String(a), ReflectValueRef::String(b)) => a.cmp(b),
        (ReflectValueRef::I32(a), ReflectValueRef::I32(b)) => a.cmp(b),
        (ReflectValueRef::I64(a), ReflectValueRef::I64(b)) => a.cmp(b),
        (ReflectValueRef::U32(a), ReflectValueRef::U32(b)) => a.cmp(b),
        (ReflectValueRef::U64(a), ReflectValueRef::U64(b)) => a.cmp(b),
        (ReflectValueRef::Bool(a), ReflectValueRef::Bool(b)) => a.cmp(b),
        // Map keys of one map share one type; nothing else can be compared.
        _ => std::cmp::Ordering::Equal,
    }
}

fn pad(out: &mut String, indent: usize) {
    for _ in 0..indent {
        out.push_str("  ");
    }
}

fn print_field(out: &mut String, indent: usize, name: &str, value: &ReflectValueRef) {
    pad(out, indent);
    out.push_str(name);
    let _ = match value {
        ReflectValueRef::Message(m) => {
            out.push_str(" {\n");
            print_message(&**m, out, indent + 1);
            pad(out, indent);
            out.push_str("}\n");
            return;
        }
        ReflectValueRef::Enum(descriptor, number) => match descriptor.value_by_number(*number) {
            Some(value) => writeln!(out, ": {}", value.name()),
            None => writeln!(out, ": {number}"),
        },
        ReflectValueRef::String(s) => {
            out.push_str(": ");
            quote(s.as_bytes(), out);
            writeln!(out)
        }
        ReflectValueRef::Bytes(b) => {
            out.push_str(": ");
            quote(b, out);
            writeln!(out)
        }
        ReflectValueRef::I32(v) => writeln!(out, ": {v}"),
        ReflectValueRef::I64(v) => writeln!(out, ": {v}"),
        ReflectValueRef::U32(v) => writeln!(out, ": {v}"),
        ReflectValueRef::U64(v) => writeln!(out, ": {v}"),
        ReflectValueRef::Bool(v) => writeln!(out, ": {v}"),
        ReflectValueRef::F32(v) => writeln!(out, ": {}", format_f32(*v)),
        ReflectValueRef::F64(v) => writeln!(out, ": {}", format_f64(*v)),
    };
}

/// Shortest decimal that reads back to the same `f32`; exponent form outside [1e-5, 1e16).
pub fn format_f32(v: f32) -> String {
    format_float(
        v,
        v.is_nan(),
        v.is_infinite(),
        v.is_sign_negative(),
        f64::from(v.abs()),
    )
}

/// Shortest decimal that reads back to the same `f64`; exponent form outside [1e-5, 1e16).
pub fn format_f64(v: f64) -> String {
    format_float(
        v,
        v.is_nan(),
        v.is_infinite(),
        v.is_sign_negative(),
        v.abs(),
    )
}

/// Rust's `Display` and `LowerExp` print the shortest digits that read back exactly; the
/// exponent form keeps tiny and huge values short, as TensorFlow's printers do.
fn format_float<F: std::fmt::Display + std::fmt::LowerExp>(
    v: F,
    nan: bool,
    infinite: bool,
    negative: bool,
    magnitude: f64,
) -> String {
    match (nan, infinite, negative) {
        (true, _, _) => "nan".into(),
        (false, true, false) => "inf".into(),
        (false, true, true) => "-inf".into(),
        _ if magnitude != 0.0 && !(1e-5..1e16).contains(&magnitude) => format!("{v:e}"),
        _ => format!("{v}"),
    }
}

/// Quotes bytes as TensorFlow's printers do: printable ASCII as is, the rest as octal escapes.
fn quote(bytes: &[u8], out: &mut String) {
    out.push('"');
    for &b in bytes {
        match b {
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            b'"' => out.push_str("\\\""),
            b'\'' => out.push_str("\\'"),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// Lexing

#[derive(Debug, Clone, PartialEq)]
enum Token {
    /// Identifier, keyword or unsigned number (numbers are kept as written).
    Word(String),
    /// One or more adjacent string literals, unescaped and concatenated.
    Str(Vec<u8>),
    Symbol(char),
    Eof,
}

struct Lexer<'a> {
    text: &'a [u8],
    pos: usize,
    line: usize,
    line_start: usize,
    /// Position of the token last returned by `next`, for errors.
    token_line: usize,
    token_column: usize,
    peeked: Option<(Token, usize, usize)>,
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str) -> Self {
        Lexer {
            text: text.as_bytes(),
            pos: 0,
            line: 1,
            line_start: 0,
            token_line: 1,
            token_column: 1,
            peeked: None,
        }
    }

    fn error(&self, message: impl Into<String>) -> TextError {
        TextError {
            line: self.token_line,
            column: self.token_column,
            message: message.into(),
        }
    }

    fn peek(&mut self) -> Result<&Token, TextError> {
        if self.peeked.is_none() {
            let token = self.lex()?;
            self.peeked = Some(token);
        }
        match &self.peeked {
            Some((token, _, _)) => Ok(token),
            None => Err(self.error("internal: lookahead lost")),
        }
    }

    fn next(&mut self) -> Result<Token, TextError> {
        let (token, line, column) = match self.peeked.take() {
            Some(peeked) => peeked,
            None => self.lex()?,
        };
        self.token_line = line;
        self.token_column = column;
        Ok(token)
    }

    fn skip_space(&mut self) {
        while self.pos < self.text.len() {
            match self.text[self.pos] {
                b'\n' => {
                    self.pos += 1;
                    self.line += 1;
                    self.line_start = self.pos;
                }
                b' ' | b'\t' | b'\r' | 0x0b | 0x0c => self.pos += 1,
                b'#' => {
                    while self.pos < self.text.len() && self.text[self.pos] != b'\n' {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn lex(&mut self) -> Result<(Token, usize, usize), TextError> {
        self.skip_space();
        let line = self.line;
        let column = self.pos - self.line_start + 1;
        let at = |message: String| TextError {
            line,
            column,
            message,
        };
        let Some(&c) = self.text.get(self.pos) else {
            return Ok((Token::Eof, line, column));
        };
        let token = match c {
            b'"' | b'\'' => {
                let mut bytes = Vec::new();
                loop {
                    self.read_string(&mut bytes).map_err(at)?;
                    self.skip_space();
                    match self.text.get(self.pos) {
                        Some(b'"' | b'\'') => continue,
                        _ => break,
                    }
                }
                Token::Str(bytes)
            }
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' => {
                let start = self.pos;
                while self.pos < self.text.len() {
                    let c = self.text[self.pos];
                    let exponent_sign = (c == b'-' || c == b'+')
                        && self.pos > start
                        && matches!(self.text[self.pos - 1], b'e' | b'E')
                        && self.text[start].is_ascii_digit();
                    if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || exponent_sign {
                        self.pos += 1;
                    } else {
                        break;
                    }
                }
                let word = std::str::from_utf8(&self.text[start..self.pos])
                    .map_err(|_| at("invalid UTF-8 in a word".into()))?;
                Token::Word(word.to_owned())
            }
            b'{' | b'}' | b'<' | b'>' | b':' | b'[' | b']' | b',' | b';' | b'-' | b'/' => {
                self.pos += 1;
                Token::Symbol(char::from(c))
            }
            other => return Err(at(format!("unexpected character {:?}", char::from(other)))),
        };
        Ok((token, line, column))
    }

    /// Reads one quoted literal starting at the quote, appending its bytes.
    fn read_string(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        let quote = self.text[self.pos];
        self.pos += 1;
        loop {
            let Some(&c) = self.text.get(self.pos) else {
                return Err("unterminated string".into());
            };
            self.pos += 1;
            match c {
                b'\n' => return Err("newline inside a string".into()),
                c if c == quote => return Ok(()),
                b'\\' => self.read_escape(out)?,
                c => out.push(c),
            }
        }
    }

    fn read_escape(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        let Some(&c) = self.text.get(self.pos) else {
            return Err("unterminated escape".into());
        };
        self.pos += 1;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(0x07),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'v' => out.push(0x0b),
            b'\\' | b'\'' | b'"' | b'?' => out.push(c),
            b'0'..=b'7' => {
                let mut value = u32::from(c - b'0');
                for _ in 0..2 {
                    match self.text.get(self.pos) {
                        Some(&d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            self.pos += 1;
                        }
                        _ => break,
                    }
                }
                out.push(u8::try_from(value).map_err(|_| "octal escape above \\377")?);
            }
            b'x' | b'X' => {
                let mut value = 0u32;
                let mut digits = 0;
                while digits < 2 {
                    match self
                        .text
                        .get(self.pos)
                        .and_then(|d| char::from(*d).to_digit(16))
                    {
                        Some(d) => {
                            value = value * 16 + d;
                            self.pos += 1;
                            digits += 1;
                        }
                        None => break,
                    }
                }
                if digits == 0 {
                    return Err("\\x escape without hex digits".into());
                }
                out.push(u8::try_from(value).map_err(|_| "hex escape too large")?);
            }
            b'u' | b'U' => {
                let count = if c == b'u' { 4 } else { 8 };
                let mut value = 0u32;
                for _ in 0..count {
                    let d = self
                        .text
                        .get(self.pos)
                        .and_then(|d| char::from(*d).to_digit(16))
                        .ok_or("\\u escape needs hex digits")?;
                    value = value.checked_mul(16).ok_or("\\U escape too large")? + d;
                    self.pos += 1;
                }
                let ch = char::from_u32(value).ok_or("\\u escape is not a Unicode scalar")?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
            }
            other => return Err(format!("unknown escape \\{}", char::from(other))),
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing

struct Parser<'a> {
    lexer: Lexer<'a>,
    depth: usize,
}

/// A scalar as written: sign and the word or string that follows.
enum Scalar {
    Word { negative: bool, word: String },
    Str(Vec<u8>),
}

impl Parser<'_> {
    /// Reads fields into `message` until `end` (a closing symbol) or, when `end` is None, EOF.
    fn fields_until(
        &mut self,
        message: &mut dyn MessageDyn,
        end: Option<char>,
    ) -> Result<(), TextError> {
        let descriptor = message.descriptor_dyn();
        loop {
            match (self.lexer.next()?, end) {
                (Token::Eof, None) => return Ok(()),
                (Token::Eof, Some(end)) => {
                    return Err(self.lexer.error(format!(
                        "unexpected end of input: expected '{end}' to close {}",
                        descriptor.name()
                    )))
                }
                (Token::Symbol(c), Some(end)) if c == end => return Ok(()),
                (Token::Symbol(';' | ','), _) => continue,
                (Token::Word(name), _) => self.field(message, &descriptor, &name)?,
                (Token::Symbol('['), _) => {
                    return Err(self.lexer.error(
                        "extension or Any expansion ([...]) is not supported in Lode's text format",
                    ))
                }
                (other, _) => {
                    return Err(self
                        .lexer
                        .error(format!("expected a field name, found {}", describe(&other))))
                }
            }
        }
    }

    fn field(
        &mut self,
        message: &mut dyn MessageDyn,
        descriptor: &MessageDescriptor,
        name: &str,
    ) -> Result<(), TextError> {
        if let Ok(number) = name.parse::<u32>() {
            return self.unknown_field(message, number);
        }
        let Some(field) = descriptor.field_by_name(name) else {
            return Err(self.lexer.error(format!(
                "{} has no field named '{name}'",
                descriptor.full_name()
            )));
        };
        match field.runtime_field_type() {
            RuntimeFieldType::Singular(RuntimeType::Message(_)) => {
                self.optional_colon()?;
                let open = self.open_message()?;
                self.enter()?;
                let result = self.fields_until(field.mut_message(message), Some(open));
                self.depth -= 1;
                result
            }
            RuntimeFieldType::Singular(t) => {
                self.colon(name)?;
                let value = self.value(&t)?;
                field.set_singular_field(message, value);
                Ok(())
            }
            RuntimeFieldType::Repeated(t) => {
                if matches!(t, RuntimeType::Message(_)) {
                    self.optional_colon()?;
                } else {
                    self.colon(name)?;
                }
                if self.lexer.peek()? == &Token::Symbol('[') {
                    self.lexer.next()?;
                    if self.lexer.peek()? == &Token::Symbol(']') {
                        self.lexer.next()?;
                        return Ok(());
                    }
                    loop {
                        let value = self.value(&t)?;
                        field.mut_repeated(message).push(value);
                        match self.lexer.next()? {
                            Token::Symbol(',') => continue,
                            Token::Symbol(']') => return Ok(()),
                            other => {
                                return Err(self.lexer.error(format!(
                                    "expected ',' or ']' in the list of '{name}', found {}",
                                    describe(&other)
                                )))
                            }
                        }
                    }
                }
                let value = self.value(&t)?;
                field.mut_repeated(message).push(value);
                Ok(())
            }
            RuntimeFieldType::Map(key_type, value_type) => {
                self.optional_colon()?;
                let entries = if self.lexer.peek()? == &Token::Symbol('[') {
                    self.lexer.next()?;
                    let mut entries = Vec::new();
                    loop {
                        if self.lexer.peek()? == &Token::Symbol(']') {
                            self.lexer.next()?;
                            break;
                        }
                        entries.push(self.map_entry(&key_type, &value_type)?);
                        if self.lexer.peek()? == &Token::Symbol(',') {
                            self.lexer.next()?;
                        }
                    }
                    entries
                } else {
                    vec![self.map_entry(&key_type, &value_type)?]
                };
                for (key, value) in entries {
                    field.mut_map(message).insert(key, value);
                }
                Ok(())
            }
        }
    }

    fn map_entry(
        &mut self,
        key_type: &RuntimeType,
        value_type: &RuntimeType,
    ) -> Result<(ReflectValueBox, ReflectValueBox), TextError> {
        let open = self.open_message()?;
        self.enter()?;
        let mut key = None;
        let mut value = None;
        loop {
            match self.lexer.next()? {
                Token::Symbol(c) if c == open => break,
                Token::Symbol(';' | ',') => continue,
                Token::Word(w) if w == "key" => {
                    self.colon("key")?;
                    key = Some(self.value(key_type)?);
                }
                Token::Word(w) if w == "value" => {
                    if matches!(value_type, RuntimeType::Message(_)) {
                        self.optional_colon()?;
                    } else {
                        self.colon("value")?;
                    }
                    value = Some(self.value(value_type)?);
                }
                other => {
                    return Err(self.lexer.error(format!(
                        "expected 'key' or 'value' in a map entry, found {}",
                        describe(&other)
                    )))
                }
            }
        }
        self.depth -= 1;
        Ok((
            key.unwrap_or_else(|| default_box(key_type)),
            value.unwrap_or_else(|| default_box(value_type)),
        ))
    }

    fn enter(&mut self) -> Result<(), TextError> {
        self.depth += 1;
        if self.depth > TEXT_RECURSION_LIMIT {
            return Err(self.lexer.error(format!(
                "messages nest deeper than {TEXT_RECURSION_LIMIT} levels"
            )));
        }
        Ok(())
    }

    /// Reads `{` or `<` and returns the matching closer.
    fn open_message(&mut self) -> Result<char, TextError> {
        match self.lexer.next()? {
            Token::Symbol('{') => Ok('}'),
            Token::Symbol('<') => Ok('>'),
            other => Err(self
                .lexer
                .error(format!("expected '{{' or '<', found {}", describe(&other)))),
        }
    }

    fn optional_colon(&mut self) -> Result<(), TextError> {
        if self.lexer.peek()? == &Token::Symbol(':') {
            self.lexer.next()?;
        }
        Ok(())
    }

    fn colon(&mut self, name: &str) -> Result<(), TextError> {
        match self.lexer.next()? {
            Token::Symbol(':') => Ok(()),
            other => Err(self.lexer.error(format!(
                "expected ':' after '{name}', found {}",
                describe(&other)
            ))),
        }
    }

    fn scalar(&mut self) -> Result<Scalar, TextError> {
        let mut negative = false;
        loop {
            match self.lexer.next()? {
                Token::Symbol('-') if !negative => negative = true,
                Token::Word(word) => return Ok(Scalar::Word { negative, word }),
                Token::Str(bytes) if !negative => return Ok(Scalar::Str(bytes)),
                other => {
                    return Err(self
                        .lexer
                        .error(format!("expected a value, found {}", describe(&other))))
                }
            }
        }
    }

    fn value(&mut self, t: &RuntimeType) -> Result<ReflectValueBox, TextError> {
        if let RuntimeType::Message(descriptor) = t {
            let open = self.open_message()?;
            self.enter()?;
            let mut message = descriptor.new_instance();
            let result = self.fields_until(&mut *message, Some(open));
            self.depth -= 1;
            result?;
            return Ok(ReflectValueBox::Message(message));
        }
        let scalar = self.scalar()?;
        let err = |lexer: &Lexer, what: &str| {
            lexer.error(format!(
                "expected {what}, found {}",
                describe_scalar(&scalar)
            ))
        };
        let value = match t {
            RuntimeType::String | RuntimeType::VecU8 => match &scalar {
                Scalar::Str(bytes) => {
                    if matches!(t, RuntimeType::String) {
                        let s = String::from_utf8(bytes.clone())
                            .map_err(|_| self.lexer.error("string field holds invalid UTF-8"))?;
                        ReflectValueBox::String(s)
                    } else {
                        ReflectValueBox::Bytes(bytes.clone())
                    }
                }
                Scalar::Word { .. } => return Err(err(&self.lexer, "a quoted string")),
            },
            RuntimeType::Bool => match &scalar {
                Scalar::Word {
                    negative: false,
                    word,
                } => match word.as_str() {
                    "true" | "True" | "t" | "1" => ReflectValueBox::Bool(true),
                    "false" | "False" | "f" | "0" => ReflectValueBox::Bool(false),
                    _ => return Err(err(&self.lexer, "true or false")),
                },
                _ => return Err(err(&self.lexer, "true or false")),
            },
            RuntimeType::F32 => match float_of(&scalar) {
                Some(Float::Text(text)) => ReflectValueBox::F32(
                    text.parse::<f32>()
                        .map_err(|_| err(&self.lexer, "a float"))?,
                ),
                Some(Float::Special(v)) => {
                    #[allow(clippy::cast_possible_truncation)]
                    let narrowed = v as f32; // only nan and ±inf reach here
                    ReflectValueBox::F32(narrowed)
                }
                None => return Err(err(&self.lexer, "a float")),
            },
            RuntimeType::F64 => match float_of(&scalar) {
                Some(Float::Text(text)) => ReflectValueBox::F64(
                    text.parse::<f64>()
                        .map_err(|_| err(&self.lexer, "a float"))?,
                ),
                Some(Float::Special(v)) => ReflectValueBox::F64(v),
                None => return Err(err(&self.lexer, "a float")),
            },
            RuntimeType::I32 => {
                let v = int_of(&scalar).ok_or_else(|| err(&self.lexer, "an integer"))?;
                ReflectValueBox::I32(
                    i32::try_from(v).map_err(|_| err(&self.lexer, "an int32 in range"))?,
                )
            }
            RuntimeType::I64 => {
                let v = int_of(&scalar).ok_or_else(|| err(&self.lexer, "an integer"))?;
                ReflectValueBox::I64(
                    i64::try_from(v).map_err(|_| err(&self.lexer, "an int64 in range"))?,
                )
            }
            RuntimeType::U32 => {
                let v = int_of(&scalar).ok_or_else(|| err(&self.lexer, "an integer"))?;
                ReflectValueBox::U32(
                    u32::try_from(v).map_err(|_| err(&self.lexer, "a uint32 in range"))?,
                )
            }
            RuntimeType::U64 => {
                let v = int_of(&scalar).ok_or_else(|| err(&self.lexer, "an integer"))?;
                ReflectValueBox::U64(
                    u64::try_from(v).map_err(|_| err(&self.lexer, "a uint64 in range"))?,
                )
            }
            RuntimeType::Enum(descriptor) => {
                ReflectValueBox::Enum(descriptor.clone(), self.enum_value(descriptor, &scalar)?)
            }
            RuntimeType::Message(_) => unreachable!("handled above"),
        };
        Ok(value)
    }

    fn enum_value(&self, descriptor: &EnumDescriptor, scalar: &Scalar) -> Result<i32, TextError> {
        if let Some(v) = int_of(scalar) {
            return i32::try_from(v)
                .map_err(|_| self.lexer.error(format!("enum number {v} out of range")));
        }
        match scalar {
            Scalar::Word {
                negative: false,
                word,
            } => descriptor
                .value_by_name(word)
                .map(|v| v.value())
                .ok_or_else(|| {
                    self.lexer.error(format!(
                        "{} has no value named '{word}'",
                        descriptor.full_name()
                    ))
                }),
            _ => Err(self.lexer.error(format!(
                "expected a {} value, found {}",
                descriptor.full_name(),
                describe_scalar(scalar)
            ))),
        }
    }

    fn unknown_field(
        &mut self,
        message: &mut dyn MessageDyn,
        number: u32,
    ) -> Result<(), TextError> {
        if number == 0 || number > 0x1fff_ffff {
            return Err(self
                .lexer
                .error(format!("field number {number} is out of protobuf's range")));
        }
        self.colon(&number.to_string())?;
        let unknown = message.mut_unknown_fields_dyn();
        match self.scalar()? {
            Scalar::Str(bytes) => unknown.add_length_delimited(number, bytes),
            Scalar::Word {
                negative: false,
                word,
            } if word.starts_with("0x") && (word.len() == 10 || word.len() == 18) => {
                let v = u64::from_str_radix(&word[2..], 16)
                    .map_err(|_| self.lexer.error(format!("bad fixed-width hex '{word}'")))?;
                match u32::try_from(v) {
                    Ok(v32) if word.len() == 10 => unknown.add_fixed32(number, v32),
                    _ => unknown.add_fixed64(number, v),
                }
            }
            Scalar::Word {
                negative: false,
                word,
            } => {
                let v = word.parse::<u64>().map_err(|_| {
                    self.lexer
                        .error(format!("bad unknown-field value '{word}'"))
                })?;
                unknown.add_varint(number, v);
            }
            Scalar::Word { negative: true, .. } => {
                return Err(self
                    .lexer
                    .error("unknown fields hold unsigned varints; a '-' cannot be read back"))
            }
        }
        Ok(())
    }
}

/// The value an absent map key or value stands for.
fn default_box(t: &RuntimeType) -> ReflectValueBox {
    match t {
        RuntimeType::I32 => ReflectValueBox::I32(0),
        RuntimeType::I64 => ReflectValueBox::I64(0),
        RuntimeType::U32 => ReflectValueBox::U32(0),
        RuntimeType::U64 => ReflectValueBox::U64(0),
        RuntimeType::F32 => ReflectValueBox::F32(0.0),
        RuntimeType::F64 => ReflectValueBox::F64(0.0),
        RuntimeType::Bool => ReflectValueBox::Bool(false),
        RuntimeType::String => ReflectValueBox::String(String::new()),
        RuntimeType::VecU8 => ReflectValueBox::Bytes(Vec::new()),
        RuntimeType::Enum(d) => ReflectValueBox::Enum(d.clone(), d.default_value().value()),
        RuntimeType::Message(d) => ReflectValueBox::Message(d.new_instance()),
    }
}

enum Float<'a> {
    Text(std::borrow::Cow<'a, str>),
    Special(f64),
}

fn float_of(scalar: &Scalar) -> Option<Float<'_>> {
    let Scalar::Word { negative, word } = scalar else {
        return None;
    };
    let lower = word.to_ascii_lowercase();
    let sign = if *negative { -1.0 } else { 1.0 };
    match lower.as_str() {
        "inf" | "inff" | "infinity" | "infinityf" => {
            return Some(Float::Special(sign * f64::INFINITY))
        }
        "nan" | "nanf" => return Some(Float::Special(f64::NAN)),
        _ => {}
    }
    if !word.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    if let Some(v) = int_of(scalar) {
        if word.starts_with("0x") || word.starts_with("0X") {
            return Some(Float::Text(v.to_string().into()));
        }
    }
    let body = word
        .strip_suffix(['f', 'F'])
        .filter(|_| !word.starts_with("0x"))
        .unwrap_or(word);
    let text = if *negative {
        format!("-{body}").into()
    } else {
        std::borrow::Cow::Borrowed(body)
    };
    Some(Float::Text(text))
}

/// Decimal, `0x` hex or leading-0 octal integers, with the sign; None when not an integer.
fn int_of(scalar: &Scalar) -> Option<i128> {
    let Scalar::Word { negative, word } = scalar else {
        return None;
    };
    let magnitude = if let Some(hex) = word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()?
    } else if word.len() > 1 && word.starts_with('0') {
        u64::from_str_radix(&word[1..], 8).ok()?
    } else {
        word.parse::<u64>().ok()?
    };
    let v = i128::from(magnitude);
    Some(if *negative { -v } else { v })
}

fn describe(token: &Token) -> String {
    match token {
        Token::Word(w) => format!("'{w}'"),
        Token::Str(_) => "a string".into(),
        Token::Symbol(c) => format!("'{c}'"),
        Token::Eof => "end of input".into(),
    }
}

fn describe_scalar(scalar: &Scalar) -> String {
    match scalar {
        Scalar::Word { negative, word } => {
            format!("'{}{word}'", if *negative { "-" } else { "" })
        }
        Scalar::Str(_) => "a string".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tf::attr_value::AttrValue;
    use crate::tf::graph::GraphDef;
    use crate::tf::node_def::NodeDef;
    use crate::tf::types::DataType;
    use protobuf::{EnumOrUnknown, Message};

    fn node(name: &str) -> NodeDef {
        let mut n = NodeDef::new();
        n.name = name.into();
        n.op = "Const".into();
        n
    }

    #[test]
    fn prints_maps_sorted_and_reads_them_back() {
        let mut n = node("c");
        for key in ["zeta", "alpha", "mid"] {
            let mut v = AttrValue::new();
            v.set_i(7);
            n.attr.insert(key.into(), v);
        }
        let text = print(&n);
        let alpha = text.find("\"alpha\"").expect("alpha printed");
        let mid = text.find("\"mid\"").expect("mid printed");
        let zeta = text.find("\"zeta\"").expect("zeta printed");
        assert!(alpha < mid && mid < zeta, "{text}");
        let back: NodeDef = parse(&text).expect("parses");
        assert_eq!(back, n);
    }

    #[test]
    fn floats_keep_their_bits() {
        let cases = [
            0.1f32,
            1e-30,
            -3.4028235e38,
            f32::MIN_POSITIVE,
            1.0e-45,
            16_777_217.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for f in cases {
            let mut v = AttrValue::new();
            v.set_f(f);
            let back: AttrValue = parse(&print(&v)).expect("parses");
            assert_eq!(
                back.f().to_bits(),
                f.to_bits(),
                "{f:e} printed as {}",
                print(&v)
            );
        }
        let mut v = AttrValue::new();
        v.set_f(f32::NAN);
        let back: AttrValue = parse(&print(&v)).expect("parses");
        assert!(back.f().is_nan());
    }

    #[test]
    fn unknown_enum_values_and_fields_survive() {
        let mut v = AttrValue::new();
        v.value = Some(crate::tf::attr_value::attr_value::Value::Type(
            EnumOrUnknown::from_i32(77),
        ));
        v.mut_unknown_fields().add_varint(99, 5);
        v.mut_unknown_fields().add_fixed32(100, 0xdead_beef);
        v.mut_unknown_fields().add_fixed64(101, 1);
        v.mut_unknown_fields()
            .add_length_delimited(102, b"\x00\xffhi".to_vec());
        let text = print(&v);
        let back: AttrValue = parse(&text).expect("parses");
        assert_eq!(
            back.write_to_bytes().expect("encodes"),
            v.write_to_bytes().expect("encodes"),
            "{text}"
        );
    }

    #[test]
    fn reads_tensorflow_spellings() {
        let text = r#"
            # a comment
            node < name: "a" op: 'Const' attr { key: "dtype" value { type: DT_FLOAT } } >
            node { name: "b" "c" op: "Identity" input: ["a", "^a"] device: "\x41\101\u00e9" }
            node { name: "f" attr { key: "value" value { f: -1.5e-3f } } attr { key: "n" value { type: 3 } } }
            versions { producer: 0x10 }
        "#;
        let g: GraphDef = parse(text).expect("parses");
        assert_eq!(g.node.len(), 3);
        assert_eq!(g.node[1].name, "bc");
        assert_eq!(g.node[1].input, vec!["a", "^a"]);
        assert_eq!(g.node[1].device, "AAé");
        assert_eq!(g.node[2].attr["value"].f(), -1.5e-3);
        assert_eq!(g.node[2].attr["n"].type_(), DataType::DT_INT32);
        assert_eq!(g.versions.producer, 16);
    }

    #[test]
    fn errors_say_where() {
        let err = parse::<GraphDef>("node {\n  name: \"a\"\n  bogus: 1\n}").expect_err("fails");
        assert_eq!((err.line, err.column), (3, 3), "{err}");
        assert!(err.message.contains("bogus"), "{err}");
        let err = parse::<GraphDef>("node { name: \"a\"").expect_err("fails");
        assert!(err.message.contains("end of input"), "{err}");
        let deep = format!(
            "node {{ name: \"n\" attr {{ key: \"x\" value {{ {}",
            "list { func { attr { key: \"y\" value { ".repeat(70)
        );
        let err = parse::<GraphDef>(&deep).expect_err("fails");
        assert!(err.message.contains("nest deeper"), "{err}");
    }
}
