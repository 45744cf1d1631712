//! Parsing kernels: `DecodeCSV`, `ParseExampleV2`, `ParseSingleExample` and
//! `DeserializeSparse`.
//!
//! The first three follow TensorFlow 2.18.1's kernels byte for byte, quirks included, because records
//! that TensorFlow accepts must decode to the same tensors here and records it refuses must
//! be refused:
//!
//! - `DecodeCSV` (`decode_csv_op.cc`): quotes only open a field at its first byte, `""`
//!   escapes a quote inside a quoted field, a quoted field must end with a quote followed by
//!   the delimiter or the end of the record, CR and LF are skipped at the start of a field and
//!   refused inside an unquoted one, and numbers go through `safe_strto*` (`super::number`).
//! - `ParseExampleV2` / `ParseSingleExample` (`example_proto_fast_parsing.cc`): TensorFlow does
//!   not run a protobuf parser but its own fast decoder, which is more lenient in places (a
//!   length that runs past the end of its message is cut to the end, bytes after a list are
//!   ignored, only the first packed run of a list is read, a packed float run whose length is
//!   not a multiple of 4 drops the remainder) and stricter in others (a `Features` message may
//!   hold nothing but map entries, a map entry exactly one key and one value, groups are
//!   refused). `Input` mirrors protobuf's `CodedInputStream` limits so that the same bytes
//!   give the same answer. When a key occurs more than once in a `Features` map the last
//!   occurrence wins. If any key is listed twice in the op's configuration (say as a sparse
//!   and a dense key), no key matches any feature: TensorFlow's `FastParseExample` fails to
//!   build its key index, retries 1000 times, and resets its failure flag after clearing the
//!   index on the last try, so it goes on without error and with an empty index.
//!
//! Errors name the record (CSV) or the example index and the feature key (Example).

use std::borrow::Cow;

use rustc_hash::FxHashMap;

use super::{number, output, show, strings_of, KernelError};
use crate::tensor::{checked_num_elements, DType, Tensor, TensorData};

/// Errors of the parsing kernels: a [`KernelError`] for malformed inputs and attributes, or a
/// problem with one record or example.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error(transparent)]
    Kernel(#[from] KernelError),

    /// A CSV record does not have as many (selected) fields as there are outputs.
    #[error("{op}: expected {expected} fields but record {record} has {actual}")]
    FieldCount {
        op: &'static str,
        record: usize,
        expected: usize,
        actual: usize,
    },

    /// A CSV record breaks the quoting rules.
    #[error("{op}: record {record} ({text:?}): {reason}")]
    Quoting {
        op: &'static str,
        record: usize,
        text: String,
        reason: &'static str,
    },

    /// A CSV field with no default is empty (or the NA value).
    #[error("{op}: field {field} is required but missing in record {record}")]
    MissingField {
        op: &'static str,
        record: usize,
        field: usize,
    },

    /// A CSV field is not a number of its column's type.
    #[error("{op}: field {field} in record {record} ({value:?}) is not a valid {dtype}")]
    BadField {
        op: &'static str,
        record: usize,
        field: usize,
        value: String,
        dtype: DType,
    },

    /// A serialized Example is not one TensorFlow's decoder accepts.
    #[error("{op}: example {example} is not a valid serialized Example")]
    MalformedExample { op: &'static str, example: usize },

    /// A requested feature's value is not a valid `Feature` message.
    #[error("{op}: example {example}, key {key:?}: cannot parse the feature")]
    MalformedFeature {
        op: &'static str,
        example: usize,
        key: String,
    },

    /// A requested feature holds a list kind other than bytes, float or int64.
    #[error("{op}: example {example}, key {key:?}: unsupported feature data type")]
    UnsupportedFeature {
        op: &'static str,
        example: usize,
        key: String,
    },

    /// A requested feature has a different type than configured.
    #[error(
        "{op}: example {example}, key {key:?}: feature has type {actual}, expected {expected}"
    )]
    FeatureType {
        op: &'static str,
        example: usize,
        key: String,
        expected: DType,
        actual: DType,
    },

    /// A fixed-length dense feature has the wrong number of values.
    #[error("{op}: example {example}, key {key:?}: {actual} values, expected {expected}")]
    FeatureSize {
        op: &'static str,
        example: usize,
        key: String,
        expected: usize,
        actual: usize,
    },

    /// A variable-length dense feature's value count is not a multiple of its row size.
    #[error(
        "{op}: example {example}, key {key:?}: {actual} values are not a multiple of {stride}"
    )]
    FeatureStride {
        op: &'static str,
        example: usize,
        key: String,
        stride: usize,
        actual: usize,
    },

    /// `DeserializeSparse`: one of the sparse tensors is malformed.
    #[error("{op}: sparse tensor {element}, {part}: {reason}")]
    SparseElement {
        op: &'static str,
        element: usize,
        part: &'static str,
        reason: &'static str,
    },

    /// A dense feature with no default is missing from an example.
    #[error("{op}: example {example}, key {key:?}: feature is required but could not be found")]
    MissingFeature {
        op: &'static str,
        example: usize,
        key: String,
    },
}

impl ParseError {
    /// The batch element (CSV record or Example) the error is about, if it is about one.
    pub fn record(&self) -> Option<usize> {
        match self {
            ParseError::FieldCount { record, .. }
            | ParseError::Quoting { record, .. }
            | ParseError::MissingField { record, .. }
            | ParseError::BadField { record, .. } => Some(*record),
            ParseError::MalformedExample { example, .. }
            | ParseError::MalformedFeature { example, .. }
            | ParseError::UnsupportedFeature { example, .. }
            | ParseError::FeatureType { example, .. }
            | ParseError::FeatureSize { example, .. }
            | ParseError::FeatureStride { example, .. }
            | ParseError::MissingFeature { example, .. } => Some(*example),
            ParseError::SparseElement { .. } | ParseError::Kernel(_) => None,
        }
    }
}

/// The parsing kernels' result type.
pub type Result<T, E = ParseError> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------- DecodeCSV

/// `DecodeCSV`'s attributes.
#[derive(Debug, Clone)]
pub struct DecodeCsvAttrs {
    /// Exactly one byte.
    pub field_delim: Vec<u8>,
    pub use_quote_delim: bool,
    /// A field equal to this (after unquoting) takes its column's default.
    pub na_value: Vec<u8>,
    /// Strictly increasing, non-negative column indices to keep; empty keeps all.
    pub select_cols: Vec<i64>,
}

impl Default for DecodeCsvAttrs {
    fn default() -> Self {
        DecodeCsvAttrs {
            field_delim: b",".to_vec(),
            use_quote_delim: true,
            na_value: Vec::new(),
            select_cols: Vec::new(),
        }
    }
}

/// One output column being filled.
enum Column {
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Float32(Vec<f32>),
    Float64(Vec<f64>),
    String(Vec<Vec<u8>>),
}

/// `DecodeCSV`: one output per `record_defaults` entry, each of `records`' shape and of its
/// default's dtype. A default with no element makes its column required.
pub fn decode_csv(
    records: &Tensor,
    record_defaults: &[&Tensor],
    attrs: &DecodeCsvAttrs,
) -> Result<Vec<Tensor>> {
    const OP: &str = "DecodeCSV";
    let &[delim] = attrs.field_delim.as_slice() else {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "field_delim",
            value: show(&attrs.field_delim),
            reason: "must be exactly one character",
        }
        .into());
    };
    let select: Vec<usize> = attrs
        .select_cols
        .iter()
        .map(|&c| usize::try_from(c))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| select_error(attrs, "must be non-negative"))?;
    if select.windows(2).any(|w| w[0] >= w[1]) {
        return Err(select_error(attrs, "must be strictly increasing"));
    }
    if !select.is_empty() && select.len() != record_defaults.len() {
        return Err(select_error(attrs, "must have one entry per output"));
    }
    let records_in = strings_of(OP, "records", records)?;
    let mut columns = Vec::with_capacity(record_defaults.len());
    for d in record_defaults {
        if d.shape().len() > 1 || d.num_elements() > 1 {
            return Err(KernelError::InputShape {
                op: OP,
                input: "record_defaults",
                shape: d.shape().to_vec(),
                reason: "each default must have at most one element and rank at most 1",
            }
            .into());
        }
        let n = records_in.len();
        columns.push(match d.dtype() {
            DType::Int32 => Column::Int32(Vec::with_capacity(n)),
            DType::Int64 => Column::Int64(Vec::with_capacity(n)),
            DType::Float32 => Column::Float32(Vec::with_capacity(n)),
            DType::Float64 => Column::Float64(Vec::with_capacity(n)),
            DType::String => Column::String(Vec::with_capacity(n)),
            other => {
                return Err(KernelError::InputDtype {
                    op: OP,
                    input: "record_defaults",
                    expected: "int32, int64, float, double or string",
                    actual: other,
                }
                .into())
            }
        });
    }
    let splitter = CsvSplitter::new(delim, attrs.use_quote_delim, &select);
    // One record's fields, the buffer kept from record to record: unquoted fields borrow the
    // record's bytes, so only a string column's values are copied (once, into the column).
    let mut fields: Vec<Cow<'_, [u8]>> = Vec::with_capacity(columns.len());
    for (record, text) in records_in.iter().enumerate() {
        splitter
            .split(text, &mut fields)
            .map_err(|reason| ParseError::Quoting {
                op: OP,
                record,
                text: show(text),
                reason,
            })?;
        if fields.len() != columns.len() {
            return Err(ParseError::FieldCount {
                op: OP,
                record,
                expected: columns.len(),
                actual: fields.len(),
            });
        }
        for (field, (value, (column, default))) in fields
            .drain(..)
            .zip(columns.iter_mut().zip(record_defaults))
            .enumerate()
        {
            let missing = value.is_empty() || *value == attrs.na_value[..];
            if missing && default.num_elements() == 0 {
                return Err(ParseError::MissingField {
                    op: OP,
                    record,
                    field,
                });
            }
            let bad = |dtype| ParseError::BadField {
                op: OP,
                record,
                field,
                value: show(&value),
                dtype,
            };
            // The column's dtype is the default's, so the default's data matches it.
            match (column, default.data()) {
                (Column::Int32(out), TensorData::Int32(d)) => out.push(if missing {
                    d[0]
                } else {
                    number::parse_int(&value, i64::from(i32::MIN), i64::from(i32::MAX))
                        .and_then(|v| i32::try_from(v).ok())
                        .ok_or_else(|| bad(DType::Int32))?
                }),
                (Column::Int64(out), TensorData::Int64(d)) => out.push(if missing {
                    d[0]
                } else {
                    number::parse_int(&value, i64::MIN, i64::MAX)
                        .ok_or_else(|| bad(DType::Int64))?
                }),
                (Column::Float32(out), TensorData::Float32(d)) => out.push(if missing {
                    d[0]
                } else {
                    number::parse_f32(&value).ok_or_else(|| bad(DType::Float32))?
                }),
                (Column::Float64(out), TensorData::Float64(d)) => out.push(if missing {
                    d[0]
                } else {
                    number::parse_f64(&value).ok_or_else(|| bad(DType::Float64))?
                }),
                (Column::String(out), TensorData::String(d)) => out.push(if missing {
                    d[0].clone()
                } else {
                    value.into_owned()
                }),
                // Columns are built from the defaults' dtypes, so this does not happen.
                (_, other) => {
                    return Err(KernelError::InputDtype {
                        op: OP,
                        input: "record_defaults",
                        expected: "the column's dtype",
                        actual: other.dtype(),
                    }
                    .into())
                }
            }
        }
    }
    columns
        .into_iter()
        .map(|c| {
            let data = match c {
                Column::Int32(v) => TensorData::Int32(v),
                Column::Int64(v) => TensorData::Int64(v),
                Column::Float32(v) => TensorData::Float32(v),
                Column::Float64(v) => TensorData::Float64(v),
                Column::String(v) => TensorData::String(v),
            };
            Ok(output(OP, records.shape().to_vec(), data)?)
        })
        .collect()
}

fn select_error(attrs: &DecodeCsvAttrs, reason: &'static str) -> ParseError {
    KernelError::InvalidAttr {
        op: "DecodeCSV",
        attr: "select_cols",
        value: format!("{:?}", attrs.select_cols),
        reason,
    }
    .into()
}

/// TensorFlow's `DecodeCSVOp::ExtractFields`.
struct CsvSplitter<'a> {
    delim: u8,
    quote: bool,
    /// Sorted column indices to keep; empty keeps all.
    select: &'a [usize],
    /// The bytes that end an unquoted field's scan: the delimiter, CR, LF, and the quote
    /// when quotes are on (one load a byte instead of four comparisons).
    stops: [bool; 256],
}

impl<'a> CsvSplitter<'a> {
    fn new(delim: u8, quote: bool, select: &'a [usize]) -> Self {
        let mut stops = [false; 256];
        for stop in [delim, b'\n', b'\r'] {
            stops[usize::from(stop)] = true;
        }
        if quote {
            stops[usize::from(b'"')] = true;
        }
        CsvSplitter {
            delim,
            quote,
            select,
            stops,
        }
    }

    /// Splits `input` into `out` (cleared first): an unquoted field borrows its bytes, a
    /// quoted one is unescaped into its own.
    fn split<'t>(
        &self,
        input: &'t [u8],
        out: &mut Vec<Cow<'t, [u8]>>,
    ) -> std::result::Result<(), &'static str> {
        out.clear();
        if input.is_empty() {
            return Ok(());
        }
        let wanted = |column: usize, taken: usize| {
            self.select.is_empty() || self.select.get(taken) == Some(&column)
        };
        let n = input.len();
        let mut i = 0;
        let mut column = 0;
        while i < n {
            if input[i] == b'\n' || input[i] == b'\r' {
                i += 1;
                continue;
            }
            let include = wanted(column, out.len());
            let quoted = self.quote && input[i] == b'"';
            let mut field = Cow::Borrowed(&input[..0]);
            if !quoted {
                // An unquoted field is the bytes up to the delimiter, borrowed.
                let start = i;
                i += input[i..]
                    .iter()
                    .position(|&c| self.stops[usize::from(c)])
                    .unwrap_or(n - i);
                // A stop other than the delimiter is a quote (quotes on), CR or LF.
                if i < n && input[i] != self.delim {
                    return Err("unquoted fields cannot have quotes or CR/LF inside");
                }
                if include {
                    field = Cow::Borrowed(&input[start..i]);
                }
                i += 1;
            } else {
                i += 1;
                while i < n - 1 && (input[i] != b'"' || input[i + 1] != self.delim) {
                    if input[i] != b'"' {
                        if include {
                            field.to_mut().push(input[i]);
                        }
                        i += 1;
                    } else {
                        if input[i + 1] != b'"' {
                            return Err("a quote inside a quoted field must be doubled");
                        }
                        if include {
                            field.to_mut().push(b'"');
                        }
                        i += 2;
                    }
                }
                if !(i < n && input[i] == b'"' && (i == n - 1 || input[i + 1] == self.delim)) {
                    return Err(
                        "a quoted field must end with a quote followed by the delimiter or the end",
                    );
                }
                i += 2;
            }
            column += 1;
            if include {
                out.push(field);
                if !self.select.is_empty() && out.len() == self.select.len() {
                    return Ok(());
                }
            }
        }
        if wanted(column, out.len()) && input[n - 1] == self.delim {
            out.push(Cow::Borrowed(&input[..0]));
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------- wire-format input

/// A cursor over protobuf wire data with `CodedInputStream`'s limit semantics: a pushed limit
/// never extends past the enclosing one (a length running past the end is cut to it).
struct Input<'a> {
    buf: &'a [u8],
    pos: usize,
    limit: usize,
}

impl<'a> Input<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Input {
            buf,
            pos: 0,
            limit: buf.len(),
        }
    }

    fn at_end(&self) -> bool {
        self.pos >= self.limit
    }

    fn remaining(&self) -> usize {
        self.limit.saturating_sub(self.pos)
    }

    fn peek(&self) -> Option<u8> {
        (self.pos < self.limit).then(|| self.buf[self.pos])
    }

    /// `ExpectTag` for a one-byte tag: consumes it if it is next.
    fn expect(&mut self, tag: u8) -> bool {
        let hit = self.peek() == Some(tag);
        if hit {
            self.pos += 1;
        }
        hit
    }

    /// `ReadVarint64`: at most 10 bytes, excess high bits dropped.
    fn varint64(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.peek()?;
            self.pos += 1;
            value |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// `ReadVarint32`: a varint of up to 10 bytes, truncated to 32 bits.
    fn varint32(&mut self) -> Option<u32> {
        self.varint64()
            .map(|v| u32::try_from(v & u64::from(u32::MAX)).unwrap_or(u32::MAX))
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.remaining() {
            return None;
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Some(out)
    }

    /// `PushLimit(len)`; returns the limit to restore.
    fn push_limit(&mut self, len: u32) -> usize {
        let old = self.limit;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        self.limit = old.min(self.pos.saturating_add(len));
        old
    }

    fn pop_limit(&mut self, old: usize) {
        self.limit = old;
    }

    /// `SkipExtraneousTag` of the fast parser: groups are refused, and a length-delimited
    /// field that runs past the end skips to the end (the result of `Skip` is ignored).
    fn skip_field(&mut self) -> Option<()> {
        let tag = self.varint32()?;
        match tag & 7 {
            0 => self.varint32().map(drop),
            1 => self.take(8).map(drop),
            2 => {
                let len = self.varint32()?;
                if i32::try_from(len).is_ok() {
                    self.pos += self
                        .remaining()
                        .min(usize::try_from(len).unwrap_or(usize::MAX));
                }
                Some(())
            }
            5 => self.take(4).map(drop),
            _ => None,
        }
    }

    /// `ParseString`: a length and that many bytes, which must be present.
    fn string(&mut self) -> Option<&'a [u8]> {
        let len = self.varint32()?;
        self.take(usize::try_from(len).ok()?)
    }
}

/// The (key, Feature bytes) entries of an Example in wire order, or `None` where TensorFlow's
/// `ParseExample` fails.
fn example_entries(bytes: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut s = Input::new(bytes);
    let mut out = Vec::new();
    while !s.at_end() {
        if !s.expect(0x0a) {
            s.skip_field()?;
            continue;
        }
        let len = s.varint32()?;
        let features = s.push_limit(len);
        while !s.at_end() {
            if !s.expect(0x0a) {
                return None;
            }
            let len = s.varint32()?;
            let entry = s.push_limit(len);
            let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
            for _ in 0..2 {
                match s.varint32()? {
                    0x0a => key = s.string()?,
                    0x12 => value = s.string()?,
                    _ => return None,
                }
            }
            if !s.at_end() {
                return None;
            }
            s.pop_limit(entry);
            out.push((key, value));
        }
        s.pop_limit(features);
    }
    Some(out)
}

/// The list kind a Feature holds: its first byte, as TensorFlow's `ParseDataType` reads it.
fn feature_kind(feature: &[u8]) -> std::result::Result<Option<DType>, ()> {
    match feature.first() {
        None => Ok(None),
        Some(0x0a) => Ok(Some(DType::String)),
        Some(0x12) => Ok(Some(DType::Float32)),
        Some(0x1a) => Ok(Some(DType::Int64)),
        Some(_) => Err(()),
    }
}

/// Parsed feature values.
#[derive(Debug, Clone)]
enum Values {
    Int64(Vec<i64>),
    Float32(Vec<f32>),
    String(Vec<Vec<u8>>),
}

impl Values {
    fn empty(dtype: DType) -> Values {
        match dtype {
            DType::Int64 => Values::Int64(Vec::new()),
            DType::Float32 => Values::Float32(Vec::new()),
            _ => Values::String(Vec::new()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Values::Int64(v) => v.len(),
            Values::Float32(v) => v.len(),
            Values::String(v) => v.len(),
        }
    }

    fn extend_into(&self, out: &mut TensorData) {
        match (self, out) {
            (Values::Int64(v), TensorData::Int64(o)) => o.extend_from_slice(v),
            (Values::Float32(v), TensorData::Float32(o)) => o.extend_from_slice(v),
            (Values::String(v), TensorData::String(o)) => o.extend_from_slice(v),
            _ => {}
        }
    }
}

/// The list of a Feature of `kind` (the Feature's bytes after the kind byte), as the fast
/// parser's `ParseBytesList` / `ParseFloatList` / `ParseInt64List` read it.
fn feature_values(kind: DType, rest: &[u8]) -> Option<Values> {
    let mut s = Input::new(rest);
    let len = s.varint32()?;
    s.push_limit(len);
    match kind {
        DType::String => {
            let mut out = Vec::new();
            while !s.at_end() {
                if !s.expect(0x0a) {
                    return None;
                }
                out.push(s.string()?.to_vec());
            }
            Some(Values::String(out))
        }
        DType::Float32 => {
            let mut out = Vec::new();
            if s.expect(0x0a) {
                let len = s.varint32()?;
                s.push_limit(len);
                let n = usize::try_from(len / 4).ok()?;
                let raw = s.take(n.checked_mul(4)?)?;
                out.extend(
                    raw.chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))),
                );
            } else if s.peek() == Some(0x0d) {
                while !s.at_end() {
                    if !s.expect(0x0d) {
                        return None;
                    }
                    let c = s.take(4)?;
                    out.push(f32::from_le_bytes(c.try_into().ok()?));
                }
            } else if !s.at_end() {
                return None;
            }
            Some(Values::Float32(out))
        }
        _ => {
            let mut out = Vec::new();
            if s.expect(0x0a) {
                let len = s.varint32()?;
                s.push_limit(len);
                while !s.at_end() {
                    out.push(i64::from_ne_bytes(s.varint64()?.to_ne_bytes()));
                }
            } else if s.peek() == Some(0x08) {
                while !s.at_end() {
                    if !s.expect(0x08) {
                        return None;
                    }
                    out.push(i64::from_ne_bytes(s.varint64()?.to_ne_bytes()));
                }
            } else if !s.at_end() {
                return None;
            }
            Some(Values::Int64(out))
        }
    }
}

// ---------------------------------------------------------------------------- ParseExample

/// A dense feature: fixed shape, or variable first dimension (`shape[0] == -1`, padded with
/// the one-element default).
#[derive(Debug, Clone)]
struct DenseSpec<'a> {
    key: &'a [u8],
    dtype: DType,
    variable: bool,
    /// The shape per example (fixed), or per row (variable length: the shape after -1).
    dims: Vec<usize>,
    /// Elements per example (fixed) or per row (variable length).
    stride: usize,
    default: &'a Tensor,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Sparse(usize),
    Dense(usize),
    Ragged(usize),
}

struct Config<'a> {
    op: &'static str,
    sparse: Vec<(&'a [u8], DType)>,
    dense: Vec<DenseSpec<'a>>,
    /// (key, value dtype, row-splits dtype).
    ragged: Vec<(&'a [u8], DType, DType)>,
    /// Fx-hashed: looked up for every feature of every example; its keys are the op's own.
    index: FxHashMap<&'a [u8], Slot>,
    /// `ParseSingleExample`'s decoder skips empty features before anything else.
    single: bool,
}

/// One example's values, per configured key (`None`: not in the example).
struct Parsed {
    sparse: Vec<Option<Values>>,
    dense: Vec<Option<Values>>,
    ragged: Vec<Option<Values>>,
}

fn check_value_dtype(op: &'static str, attr: &'static str, dtype: DType) -> Result<()> {
    if matches!(dtype, DType::Int64 | DType::Float32 | DType::String) {
        Ok(())
    } else {
        Err(KernelError::InvalidAttr {
            op,
            attr,
            value: dtype.to_string(),
            reason: "must be int64, float or string",
        }
        .into())
    }
}

impl<'a> Config<'a> {
    fn new(
        op: &'static str,
        sparse: Vec<(&'a [u8], DType)>,
        dense_keys: Vec<&'a [u8]>,
        dense_defaults: &[&'a Tensor],
        dense_shapes: &[Vec<i64>],
        ragged: Vec<(&'a [u8], DType, DType)>,
        single: bool,
    ) -> Result<Config<'a>> {
        for &(_, t) in &sparse {
            check_value_dtype(op, "sparse_types", t)?;
        }
        for &(_, t, split) in &ragged {
            check_value_dtype(op, "ragged_value_types", t)?;
            if !matches!(split, DType::Int32 | DType::Int64) {
                return Err(KernelError::InvalidAttr {
                    op,
                    attr: "ragged_split_types",
                    value: split.to_string(),
                    reason: "must be int32 or int64",
                }
                .into());
            }
        }
        if dense_keys.len() != dense_defaults.len() || dense_keys.len() != dense_shapes.len() {
            return Err(KernelError::InvalidAttr {
                op,
                attr: "dense_shapes",
                value: format!("{dense_shapes:?}"),
                reason: "dense_keys, dense_defaults and dense_shapes must have the same length",
            }
            .into());
        }
        let mut dense = Vec::with_capacity(dense_keys.len());
        for ((key, &default), shape) in dense_keys.into_iter().zip(dense_defaults).zip(dense_shapes)
        {
            let bad_shape = || KernelError::InvalidAttr {
                op,
                attr: "dense_shapes",
                value: format!("{shape:?}"),
                reason: "only the first dimension may be unknown (-1)",
            };
            let (variable, dims) = match shape.split_first() {
                Some((&-1, rest)) => (true, rest),
                _ => (false, shape.as_slice()),
            };
            let dims: Vec<usize> = dims
                .iter()
                .map(|&d| usize::try_from(d).map_err(|_| bad_shape()))
                .collect::<std::result::Result<_, _>>()?;
            let dtype = default.dtype();
            let stride = checked_num_elements(dtype, &dims).map_err(|_| bad_shape())?;
            check_value_dtype(op, "Tdense", dtype)?;
            let bad_default = |reason| KernelError::InputShape {
                op,
                input: "dense_defaults",
                shape: default.shape().to_vec(),
                reason,
            };
            if variable && default.num_elements() != 1 {
                return Err(bad_default(
                    "a variable-length feature's default must have one element",
                )
                .into());
            }
            if !variable && default.num_elements() > 0 && default.shape() != dims.as_slice() {
                return Err(bad_default("a default must have its feature's shape").into());
            }
            dense.push(DenseSpec {
                key,
                dtype,
                variable,
                dims,
                stride,
                default,
            });
        }
        let mut index: FxHashMap<&[u8], Slot> = FxHashMap::default();
        let slots = sparse
            .iter()
            .enumerate()
            .map(|(i, s)| (s.0, Slot::Sparse(i)))
            .chain(
                dense
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (d.key, Slot::Dense(i))),
            )
            .chain(
                ragged
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.0, Slot::Ragged(i))),
            );
        let mut duplicate = false;
        for (key, slot) in slots {
            duplicate |= index.insert(key, slot).is_some();
        }
        if duplicate {
            // TensorFlow retries building its index 1000 times, then resets its failure flag
            // after clearing the index: no error, and no key matches any feature.
            index.clear();
        }
        Ok(Config {
            op,
            sparse,
            dense,
            ragged,
            index,
            single,
        })
    }

    /// `FastParseSerializedExample` for one example.
    fn parse(&self, example: usize, bytes: &[u8]) -> Result<Parsed> {
        let op = self.op;
        let entries = example_entries(bytes).ok_or(ParseError::MalformedExample { op, example })?;
        let mut parsed = Parsed {
            sparse: vec![None; self.sparse.len()],
            dense: vec![None; self.dense.len()],
            ragged: vec![None; self.ragged.len()],
        };
        // The last occurrence of a key wins: walk backwards and keep the first seen.
        for &(key, feature) in entries.iter().rev() {
            let Some(&slot) = self.index.get(key) else {
                continue;
            };
            let key_name = || show(key);
            let kind = feature_kind(feature).map_err(|()| ParseError::UnsupportedFeature {
                op,
                example,
                key: key_name(),
            })?;
            let (target, expected) = match slot {
                Slot::Sparse(i) => (&mut parsed.sparse[i], self.sparse[i].1),
                Slot::Dense(i) => (&mut parsed.dense[i], self.dense[i].dtype),
                Slot::Ragged(i) => (&mut parsed.ragged[i], self.ragged[i].1),
            };
            let dense = matches!(slot, Slot::Dense(_));
            if kind.is_none() && (dense || self.single) {
                continue;
            }
            if target.is_some() {
                continue;
            }
            let values = match kind {
                None => Values::empty(expected),
                Some(actual) if actual != expected => {
                    return Err(ParseError::FeatureType {
                        op,
                        example,
                        key: key_name(),
                        expected,
                        actual,
                    })
                }
                Some(kind) => feature_values(kind, &feature[1..]).ok_or_else(|| {
                    ParseError::MalformedFeature {
                        op,
                        example,
                        key: key_name(),
                    }
                })?,
            };
            if let Slot::Dense(i) = slot {
                let spec = &self.dense[i];
                let n = values.len();
                match spec.variable {
                    false if n != spec.stride => {
                        return Err(ParseError::FeatureSize {
                            op,
                            example,
                            key: key_name(),
                            expected: spec.stride,
                            actual: n,
                        })
                    }
                    true if spec.stride == 0 || n % spec.stride != 0 => {
                        return Err(ParseError::FeatureStride {
                            op,
                            example,
                            key: key_name(),
                            stride: spec.stride,
                            actual: n,
                        })
                    }
                    _ => {}
                }
            }
            *target = Some(values);
        }
        for (spec, value) in self.dense.iter().zip(&parsed.dense) {
            if value.is_none() && !spec.variable && spec.default.num_elements() == 0 {
                return Err(ParseError::MissingFeature {
                    op,
                    example,
                    key: show(spec.key),
                });
            }
        }
        Ok(parsed)
    }

    /// Batches the examples' values into the op's outputs: sparse indices, values and shapes,
    /// dense values, ragged values and row splits. `batch` is false for a scalar input (no
    /// batch dimension).
    fn assemble(&self, examples: &[Parsed], batch: bool) -> Result<Vec<Tensor>> {
        let op = self.op;
        let n = examples.len();
        let mut indices = Vec::new();
        let mut values = Vec::new();
        let mut shapes = Vec::new();
        for (i, &(_, dtype)) in self.sparse.iter().enumerate() {
            let mut idx = Vec::new();
            let mut vals = TensorData::zeros(dtype, 0);
            let mut max_len = 0usize;
            for (e, ex) in examples.iter().enumerate() {
                let Some(v) = &ex.sparse[i] else { continue };
                max_len = max_len.max(v.len());
                for j in 0..v.len() {
                    if batch {
                        idx.push(to_i64(e));
                    }
                    idx.push(to_i64(j));
                }
                v.extend_into(&mut vals);
            }
            let total = vals.len();
            let width = if batch { 2 } else { 1 };
            indices.push(output(op, vec![total, width], TensorData::Int64(idx))?);
            values.push(output(op, vec![total], vals)?);
            let shape = if batch {
                vec![to_i64(n), to_i64(max_len)]
            } else {
                vec![to_i64(max_len)]
            };
            shapes.push(output(op, vec![shape.len()], TensorData::Int64(shape))?);
        }
        let mut outs: Vec<Tensor> = indices.into_iter().chain(values).chain(shapes).collect();
        for (d, spec) in self.dense.iter().enumerate() {
            outs.push(self.dense_output(d, spec, examples, batch)?);
        }
        let mut ragged_values = Vec::new();
        let mut splits = Vec::new();
        for (i, &(_, dtype, split_dtype)) in self.ragged.iter().enumerate() {
            let mut vals = TensorData::zeros(dtype, 0);
            let mut ends = vec![0usize];
            for ex in examples {
                if let Some(v) = &ex.ragged[i] {
                    v.extend_into(&mut vals);
                }
                ends.push(vals.len());
            }
            if !batch {
                ends.clear();
            }
            let len = vals.len();
            ragged_values.push(output(op, vec![len], vals)?);
            let m = ends.len();
            let data = if split_dtype == DType::Int32 {
                TensorData::Int32(
                    ends.into_iter()
                        .map(|e| i32::try_from(e).unwrap_or(i32::MAX))
                        .collect(),
                )
            } else {
                TensorData::Int64(ends.into_iter().map(to_i64).collect())
            };
            splits.push(output(op, vec![m], data)?);
        }
        outs.extend(ragged_values);
        outs.extend(splits);
        Ok(outs)
    }

    fn dense_output(
        &self,
        d: usize,
        spec: &DenseSpec<'_>,
        examples: &[Parsed],
        batch: bool,
    ) -> Result<Tensor> {
        let op = self.op;
        let mut data = TensorData::zeros(spec.dtype, 0);
        let mut shape: Vec<usize> = if batch { vec![examples.len()] } else { vec![] };
        match spec.variable {
            false => {
                for ex in examples {
                    match &ex.dense[d] {
                        Some(v) => v.extend_into(&mut data),
                        None => append(&mut data, spec.default.data(), 0..spec.stride),
                    }
                }
                shape.extend(spec.dims.iter().copied());
            }
            true => {
                let rows = examples
                    .iter()
                    .map(|ex| ex.dense[d].as_ref().map_or(0, Values::len) / spec.stride.max(1))
                    .max()
                    .unwrap_or(0);
                let width = rows
                    .checked_mul(spec.stride)
                    .ok_or(KernelError::InputShape {
                        op,
                        input: "serialized",
                        shape: vec![examples.len()],
                        reason: "the padded dense output is too large",
                    })?;
                for ex in examples {
                    let have = ex.dense[d].as_ref().map_or(0, Values::len);
                    if let Some(v) = &ex.dense[d] {
                        v.extend_into(&mut data);
                    }
                    for _ in have..width {
                        append(&mut data, spec.default.data(), 0..1);
                    }
                }
                shape.push(rows);
                shape.extend(spec.dims.iter().copied());
            }
        }
        Ok(output(op, shape, data)?)
    }
}

/// `ParseExampleV2`'s attributes (`Tdense` is the dense defaults' dtypes).
#[derive(Debug, Clone, Default)]
pub struct ParseExampleAttrs {
    pub num_sparse: i64,
    pub sparse_types: Vec<DType>,
    pub ragged_value_types: Vec<DType>,
    pub ragged_split_types: Vec<DType>,
    /// Per dense key; a first dimension of -1 makes the feature variable-length.
    pub dense_shapes: Vec<Vec<i64>>,
}

/// `ParseSingleExample`'s attributes: the keys are attributes here, not inputs.
#[derive(Debug, Clone, Default)]
pub struct ParseSingleExampleAttrs {
    pub num_sparse: i64,
    pub sparse_keys: Vec<Vec<u8>>,
    pub dense_keys: Vec<Vec<u8>>,
    pub sparse_types: Vec<DType>,
    pub dense_shapes: Vec<Vec<i64>>,
}

fn key_vector<'a>(op: &'static str, input: &'static str, t: &'a Tensor) -> Result<&'a [Vec<u8>]> {
    let keys = strings_of(op, input, t)?;
    if t.shape().len() != 1 {
        return Err(KernelError::InputShape {
            op,
            input,
            shape: t.shape().to_vec(),
            reason: "must be a vector",
        }
        .into());
    }
    Ok(keys)
}

fn count_mismatch(op: &'static str, attr: &'static str, value: usize) -> ParseError {
    KernelError::InvalidAttr {
        op,
        attr,
        value: value.to_string(),
        reason: "must match the number of keys",
    }
    .into()
}

/// `ParseExampleV2`: decodes a scalar or vector of serialized `tf.train.Example`s. Outputs, in
/// order: per sparse key its indices (`[M, 2]`, or `[M, 1]` for a scalar input), then per
/// sparse key its values, then per sparse key its dense shape; per dense key its values
/// (`[N] + shape`, variable-length features padded to the longest example); per ragged key
/// its values, then per ragged key its row splits (empty for a scalar input).
pub fn parse_example_v2(
    serialized: &Tensor,
    names: &Tensor,
    sparse_keys: &Tensor,
    dense_keys: &Tensor,
    ragged_keys: &Tensor,
    dense_defaults: &[&Tensor],
    attrs: &ParseExampleAttrs,
) -> Result<Vec<Tensor>> {
    const OP: &str = "ParseExampleV2";
    let records = strings_of(OP, "serialized", serialized)?;
    if serialized.shape().len() > 1 {
        return Err(KernelError::InputShape {
            op: OP,
            input: "serialized",
            shape: serialized.shape().to_vec(),
            reason: "must be a scalar or a vector",
        }
        .into());
    }
    strings_of(OP, "names", names)?;
    if names.num_elements() > 0 && names.shape() != serialized.shape() {
        return Err(KernelError::IncompatibleShapes {
            op: OP,
            left: "names",
            left_shape: names.shape().to_vec(),
            right: "serialized",
            right_shape: serialized.shape().to_vec(),
        }
        .into());
    }
    let sparse_keys = key_vector(OP, "sparse_keys", sparse_keys)?;
    let dense_keys = key_vector(OP, "dense_keys", dense_keys)?;
    let ragged_keys = key_vector(OP, "ragged_keys", ragged_keys)?;
    if usize::try_from(attrs.num_sparse).ok() != Some(sparse_keys.len())
        || attrs.sparse_types.len() != sparse_keys.len()
    {
        return Err(count_mismatch(OP, "num_sparse", sparse_keys.len()));
    }
    if attrs.ragged_value_types.len() != ragged_keys.len()
        || attrs.ragged_split_types.len() != ragged_keys.len()
    {
        return Err(count_mismatch(OP, "ragged_value_types", ragged_keys.len()));
    }
    let config = Config::new(
        OP,
        sparse_keys
            .iter()
            .map(Vec::as_slice)
            .zip(attrs.sparse_types.iter().copied())
            .collect(),
        dense_keys.iter().map(Vec::as_slice).collect(),
        dense_defaults,
        &attrs.dense_shapes,
        ragged_keys
            .iter()
            .map(Vec::as_slice)
            .zip(attrs.ragged_value_types.iter().copied())
            .zip(attrs.ragged_split_types.iter().copied())
            .map(|((k, v), s)| (k, v, s))
            .collect(),
        false,
    )?;
    let parsed = records
        .iter()
        .enumerate()
        .map(|(i, r)| config.parse(i, r))
        .collect::<Result<Vec<_>>>()?;
    config.assemble(&parsed, serialized.shape().len() == 1)
}

/// `ParseSingleExample`: one scalar serialized Example; outputs as `ParseExampleV2`'s for a
/// scalar input (sparse indices, values, shapes, then dense values; no ragged keys). Its
/// decoder differs from the batch one in one observable way: a feature with no list set is
/// ignored even by sparse keys, so it does not hide an earlier occurrence of its key.
pub fn parse_single_example(
    serialized: &Tensor,
    dense_defaults: &[&Tensor],
    attrs: &ParseSingleExampleAttrs,
) -> Result<Vec<Tensor>> {
    const OP: &str = "ParseSingleExample";
    let records = strings_of(OP, "serialized", serialized)?;
    if !serialized.shape().is_empty() {
        return Err(KernelError::InputShape {
            op: OP,
            input: "serialized",
            shape: serialized.shape().to_vec(),
            reason: "must be a scalar",
        }
        .into());
    }
    if usize::try_from(attrs.num_sparse).ok() != Some(attrs.sparse_keys.len())
        || attrs.sparse_types.len() != attrs.sparse_keys.len()
    {
        return Err(count_mismatch(OP, "num_sparse", attrs.sparse_keys.len()));
    }
    let config = Config::new(
        OP,
        attrs
            .sparse_keys
            .iter()
            .map(Vec::as_slice)
            .zip(attrs.sparse_types.iter().copied())
            .collect(),
        attrs.dense_keys.iter().map(Vec::as_slice).collect(),
        dense_defaults,
        &attrs.dense_shapes,
        Vec::new(),
        true,
    )?;
    let parsed = records
        .iter()
        .enumerate()
        .map(|(i, r)| config.parse(i, r))
        .collect::<Result<Vec<_>>>()?;
    config.assemble(&parsed, false)
}

// ------------------------------------------------------------------------ DeserializeSparse

/// One serialized sparse tensor as `DeserializeSparse` receives it in a `DT_VARIANT` input:
/// the three tensors its variant elements hold (indices `[nnz, rank]` int64, values `[nnz]`,
/// dense shape `[rank]` int64). Lode's tensors have no variant dtype, so the op's input of
/// shape `batch_shape + [3]` is given as `batch_shape` and one `SparseParts` per batch
/// element, row-major.
#[derive(Debug, Clone, Copy)]
pub struct SparseParts<'a> {
    pub indices: &'a Tensor,
    pub values: &'a Tensor,
    pub shape: &'a Tensor,
}

/// `DeserializeSparse` with `Tserialized = variant` (`deserialize_sparse_variant_op.cc`):
/// stacks the sparse tensors along new leading dimensions `batch_shape`; the dense shape is
/// `batch_shape` followed by the element-wise maximum of the elements' shapes. As in
/// TensorFlow, indices are not checked against their element's shape, and an empty
/// `batch_shape` returns the single element's tensors as they are.
pub fn deserialize_sparse(
    batch_shape: &[usize],
    elements: &[SparseParts<'_>],
    dtype: DType,
) -> Result<Vec<Tensor>> {
    const OP: &str = "DeserializeSparse";
    let count = batch_shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&c| c == elements.len())
        .ok_or(KernelError::InputShape {
            op: OP,
            input: "serialized_sparse",
            shape: batch_shape.to_vec(),
            reason: "needs one sparse tensor per batch element",
        })?;
    let err = |element, part, reason| ParseError::SparseElement {
        op: OP,
        element,
        part,
        reason,
    };
    let shape_of = |i: usize, e: &SparseParts<'_>| -> Result<Vec<i64>> {
        match e.shape.data() {
            TensorData::Int64(v) if e.shape.shape().len() == 1 => Ok(v.clone()),
            TensorData::Int64(_) => Err(err(i, "shape", "must be a vector")),
            _ => Err(err(i, "shape", "must be int64")),
        }
    };
    let check_rows = |i: usize, e: &SparseParts<'_>, rank: usize| -> Result<()> {
        let dims = e.indices.shape();
        if e.indices.dtype() != DType::Int64 {
            return Err(err(i, "indices", "must be int64"));
        }
        if dims.len() != 2 {
            return Err(err(i, "indices", "must be a matrix"));
        }
        if dims[1] != rank {
            return Err(err(i, "indices", "columns must match the shape's length"));
        }
        if e.values.shape().len() != 1 {
            return Err(err(i, "values", "must be a vector"));
        }
        if e.values.dtype() != dtype {
            return Err(err(i, "values", "dtype differs from the requested dtype"));
        }
        if e.values.shape()[0] != dims[0] {
            return Err(err(
                i,
                "values",
                "length differs from the number of index rows",
            ));
        }
        Ok(())
    };
    if batch_shape.is_empty() {
        let e = &elements[0];
        let shape = shape_of(0, e)?;
        check_rows(0, e, shape.len())?;
        return Ok(vec![e.indices.clone(), e.values.clone(), e.shape.clone()]);
    }
    if count == 0 {
        return Err(KernelError::InputShape {
            op: OP,
            input: "serialized_sparse",
            shape: batch_shape.to_vec(),
            reason: "must hold at least one sparse tensor",
        }
        .into());
    }
    let mut dense: Vec<i64> = shape_of(0, &elements[0])?;
    for (i, e) in elements.iter().enumerate().skip(1) {
        let s = shape_of(i, e)?;
        if s.len() != dense.len() {
            return Err(err(
                i,
                "shape",
                "rank differs from the earlier sparse tensors",
            ));
        }
        for (d, x) in dense.iter_mut().zip(s) {
            *d = (*d).max(x);
        }
    }
    let rank = dense.len();
    let out_rank = batch_shape.len() + rank;
    let mut indices: Vec<i64> = Vec::new();
    let mut values = TensorData::zeros(dtype, 0);
    let mut prefix = vec![0usize; batch_shape.len()];
    for (i, e) in elements.iter().enumerate() {
        check_rows(i, e, rank)?;
        if let TensorData::Int64(rows) = e.indices.data() {
            let nnz = e.values.num_elements();
            for r in 0..nnz {
                indices.extend(prefix.iter().map(|&p| to_i64(p)));
                indices.extend_from_slice(&rows[r * rank..(r + 1) * rank]);
            }
        }
        append(&mut values, e.values.data(), 0..e.values.num_elements());
        // Row-major successor of the batch coordinates.
        for (p, &d) in prefix.iter_mut().zip(batch_shape).rev() {
            *p += 1;
            if *p < d {
                break;
            }
            *p = 0;
        }
    }
    let nnz = values.len();
    let mut shape: Vec<i64> = batch_shape.iter().map(|&d| to_i64(d)).collect();
    shape.extend(dense);
    Ok(vec![
        output(OP, vec![nnz, out_rank], TensorData::Int64(indices))?,
        output(OP, vec![nnz], values)?,
        output(OP, vec![out_rank], TensorData::Int64(shape))?,
    ])
}

fn to_i64(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Appends `src[range]` to `out` (same dtype; nothing happens otherwise).
fn append(out: &mut TensorData, src: &TensorData, range: std::ops::Range<usize>) {
    match (out, src) {
        (TensorData::Bool(o), TensorData::Bool(s)) => o.extend_from_slice(&s[range]),
        (TensorData::Int8(o), TensorData::Int8(s)) => o.extend_from_slice(&s[range]),
        (TensorData::Int16(o), TensorData::Int16(s)) => o.extend_from_slice(&s[range]),
        (TensorData::Int32(o), TensorData::Int32(s)) => o.extend_from_slice(&s[range]),
        (TensorData::Int64(o), TensorData::Int64(s)) => o.extend_from_slice(&s[range]),
        (TensorData::UInt8(o), TensorData::UInt8(s)) => o.extend_from_slice(&s[range]),
        (TensorData::UInt16(o), TensorData::UInt16(s)) => o.extend_from_slice(&s[range]),
        (TensorData::UInt32(o), TensorData::UInt32(s)) => o.extend_from_slice(&s[range]),
        (TensorData::UInt64(o), TensorData::UInt64(s)) => o.extend_from_slice(&s[range]),
        (TensorData::Float16(o), TensorData::Float16(s)) => o.extend_from_slice(&s[range]),
        (TensorData::BFloat16(o), TensorData::BFloat16(s)) => o.extend_from_slice(&s[range]),
        (TensorData::Float32(o), TensorData::Float32(s)) => o.extend_from_slice(&s[range]),
        (TensorData::Float64(o), TensorData::Float64(s)) => o.extend_from_slice(&s[range]),
        (TensorData::String(o), TensorData::String(s)) => o.extend_from_slice(&s[range]),
        _ => {}
    }
}
