//! `HashTableV2` and the ops that fill and read it: `LookupTableImportV2`,
//! `LookupTableFindV2`, `LookupTableSizeV2`, `InitializeTableFromTextFileV2`.
//!
//! TensorFlow's `HashTable` is initialized once: a second import (or text-file init) succeeds
//! only if it brings exactly the entries already there. Duplicate keys within one
//! initialization are fine when they carry the same value and an error otherwise.

use rustc_hash::FxHashMap;
use std::path::PathBuf;

use super::{number, output, show, KernelError, Result};
use crate::tensor::{DType, Tensor, TensorData};

/// TensorFlow's `TextFileIndex::WHOLE_LINE`.
pub const WHOLE_LINE: i64 = -2;
/// TensorFlow's `TextFileIndex::LINE_NUMBER`.
pub const LINE_NUMBER: i64 = -1;

/// Errors of lookup tables.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The table was read before anything initialized it.
    #[error("table not initialized")]
    NotInitialized,
    /// A key or value tensor does not have the table's dtype.
    #[error("{what} has dtype {actual}, the table's is {expected}")]
    Dtype {
        what: &'static str,
        expected: DType,
        actual: DType,
    },
    /// Keys and values of an import differ in shape.
    #[error("keys have shape {keys:?} but values have shape {values:?}")]
    ImportShape {
        keys: Vec<usize>,
        values: Vec<usize>,
    },
    /// The default value is empty (TensorFlow uses its first element).
    #[error("default_value has shape {default:?} and no element")]
    DefaultShape { default: Vec<usize> },
    /// One key given two different values.
    #[error("key {key} has value {old} and cannot also take value {new}")]
    DuplicateKey {
        key: String,
        old: String,
        new: String,
    },
    /// A second initialization with entries that differ from the first.
    #[error("table was already initialized with different data")]
    AlreadyInitialized,
    /// A key/value dtype the table does not support.
    #[error("unsupported {what} dtype {dtype}")]
    UnsupportedDtype { what: &'static str, dtype: DType },
    /// An attribute of the text-file initializer that TensorFlow refuses.
    #[error("{attr} = {value}: {reason}")]
    TextAttr {
        attr: &'static str,
        value: i64,
        reason: &'static str,
    },
    /// The vocabulary file cannot be read.
    #[error("cannot read vocabulary file {}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The vocabulary file holds no line.
    #[error("vocabulary file {} is empty", path.display())]
    EmptyFile { path: PathBuf },
    /// An empty line (TensorFlow refuses them).
    #[error("empty line {line} in vocabulary file {}", path.display())]
    EmptyLine { path: PathBuf, line: usize },
    /// A line with fewer columns than the key or value index needs.
    #[error("line {line} of {} has {found} columns, expected at least {expected}", path.display())]
    Columns {
        path: PathBuf,
        line: usize,
        expected: usize,
        found: usize,
    },
    /// A field that does not parse as the table's dtype.
    #[error("field {field:?} in line {line} of {} is not a valid {dtype}", path.display())]
    Field {
        path: PathBuf,
        line: usize,
        field: String,
        dtype: DType,
    },
    /// The file has fewer lines than `vocab_size`.
    #[error("vocab_size of {} is {expected} but the file has {found} lines", path.display())]
    VocabSize {
        path: PathBuf,
        expected: i64,
        found: usize,
    },
}

/// One key or value, compared as TensorFlow compares them (floats by value).
#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    Bytes(Vec<u8>),
}

impl Scalar {
    fn show(&self) -> String {
        match self {
            Scalar::Int(v) => v.to_string(),
            Scalar::Float(v) => v.to_string(),
            Scalar::Bool(v) => v.to_string(),
            Scalar::Bytes(b) => show(b),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Int(i64),
    Bytes(Vec<u8>),
}

fn scalars(d: &TensorData) -> Vec<Scalar> {
    match d {
        TensorData::Int32(v) => v.iter().map(|&x| Scalar::Int(x.into())).collect(),
        TensorData::Int64(v) => v.iter().map(|&x| Scalar::Int(x)).collect(),
        TensorData::Float32(v) => v.iter().map(|&x| Scalar::Float(x.into())).collect(),
        TensorData::Float64(v) => v.iter().map(|&x| Scalar::Float(x)).collect(),
        TensorData::Bool(v) => v.iter().map(|&x| Scalar::Bool(x)).collect(),
        TensorData::String(v) => v.iter().map(|x| Scalar::Bytes(x.clone())).collect(),
        _ => Vec::new(),
    }
}

fn key_of(s: Scalar) -> Key {
    match s {
        Scalar::Bytes(b) => Key::Bytes(b),
        Scalar::Int(i) => Key::Int(i),
        // Unreachable for the key dtypes a table accepts (int32, int64, string).
        Scalar::Float(f) => Key::Int(f.to_bits() as i64),
        Scalar::Bool(b) => Key::Int(b.into()),
    }
}

// A float table's values were read as f32, so narrowing them back is exact.
#[allow(clippy::cast_possible_truncation)]
fn build(dtype: DType, vals: Vec<Scalar>) -> TensorData {
    match dtype {
        DType::Int32 => TensorData::Int32(
            vals.into_iter()
                .map(|s| match s {
                    Scalar::Int(i) => i32::try_from(i).unwrap_or_default(),
                    _ => 0,
                })
                .collect(),
        ),
        DType::Int64 => TensorData::Int64(
            vals.into_iter()
                .map(|s| match s {
                    Scalar::Int(i) => i,
                    _ => 0,
                })
                .collect(),
        ),
        DType::Float32 => TensorData::Float32(
            vals.into_iter()
                .map(|s| match s {
                    Scalar::Float(f) => f as f32,
                    _ => 0.0,
                })
                .collect(),
        ),
        DType::Float64 => TensorData::Float64(
            vals.into_iter()
                .map(|s| match s {
                    Scalar::Float(f) => f,
                    _ => 0.0,
                })
                .collect(),
        ),
        DType::Bool => TensorData::Bool(
            vals.into_iter()
                .map(|s| matches!(s, Scalar::Bool(true)))
                .collect(),
        ),
        _ => TensorData::String(
            vals.into_iter()
                .map(|s| match s {
                    Scalar::Bytes(b) => b,
                    _ => Vec::new(),
                })
                .collect(),
        ),
    }
}

/// A `HashTableV2`: keys int32, int64 or string; values int32, int64, float, double, bool or
/// string.
#[derive(Debug, Clone)]
pub struct HashTable {
    key_dtype: DType,
    value_dtype: DType,
    /// Fx-hashed: looked up for every element; its keys come from the graph, not the records.
    map: FxHashMap<Key, Scalar>,
    initialized: bool,
}

fn table_err(op: &'static str) -> impl Fn(TableError) -> KernelError {
    move |source| KernelError::Table { op, source }
}

impl HashTable {
    /// `HashTableV2(key_dtype, value_dtype)`: an empty, uninitialized table.
    pub fn new(key_dtype: DType, value_dtype: DType) -> Result<HashTable> {
        let err = table_err("HashTableV2");
        if !matches!(key_dtype, DType::Int32 | DType::Int64 | DType::String) {
            return Err(err(TableError::UnsupportedDtype {
                what: "key",
                dtype: key_dtype,
            }));
        }
        if !matches!(
            value_dtype,
            DType::Int32
                | DType::Int64
                | DType::Float32
                | DType::Float64
                | DType::Bool
                | DType::String
        ) {
            return Err(err(TableError::UnsupportedDtype {
                what: "value",
                dtype: value_dtype,
            }));
        }
        Ok(HashTable {
            key_dtype,
            value_dtype,
            map: FxHashMap::default(),
            initialized: false,
        })
    }

    /// TensorFlow's `HashTable::DoPrepare` + `DoInsert`, or `AreEntriesSame` on an
    /// initialized table.
    fn initialize(&mut self, pairs: Vec<(Scalar, Scalar)>) -> Result<(), TableError> {
        if self.initialized {
            let same = pairs.len() == self.map.len()
                && pairs
                    .iter()
                    .all(|(k, v)| self.map.get(&key_of(k.clone())) == Some(v));
            return if same {
                Ok(())
            } else {
                Err(TableError::AlreadyInitialized)
            };
        }
        let mut map = FxHashMap::with_capacity_and_hasher(pairs.len(), Default::default());
        for (k, v) in pairs {
            let shown = k.show();
            match map.entry(key_of(k)) {
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(v);
                }
                std::collections::hash_map::Entry::Occupied(e) => {
                    if *e.get() != v {
                        return Err(TableError::DuplicateKey {
                            key: shown,
                            old: e.get().show(),
                            new: v.show(),
                        });
                    }
                }
            }
        }
        self.map = map;
        self.initialized = true;
        Ok(())
    }

    fn check_dtype(
        &self,
        what: &'static str,
        t: &Tensor,
        expected: DType,
    ) -> Result<(), TableError> {
        if t.dtype() == expected {
            Ok(())
        } else {
            Err(TableError::Dtype {
                what,
                expected,
                actual: t.dtype(),
            })
        }
    }
}

/// `LookupTableImportV2`: inserts `keys[i] → values[i]` (same shapes).
pub fn lookup_table_import_v2(
    table: &mut HashTable,
    keys: &Tensor,
    values: &Tensor,
) -> Result<Vec<Tensor>> {
    let err = table_err("LookupTableImportV2");
    table
        .check_dtype("keys", keys, table.key_dtype)
        .map_err(&err)?;
    table
        .check_dtype("values", values, table.value_dtype)
        .map_err(&err)?;
    if keys.shape() != values.shape() {
        return Err(err(TableError::ImportShape {
            keys: keys.shape().to_vec(),
            values: values.shape().to_vec(),
        }));
    }
    let pairs = scalars(keys.data())
        .into_iter()
        .zip(scalars(values.data()))
        .collect();
    table.initialize(pairs).map_err(&err)?;
    Ok(Vec::new())
}

/// `LookupTableFindV2`: the value of each key, or the first element of `default_value` (as
/// TensorFlow does, even when it has one element per key) where the key is absent. Output
/// shape = keys' shape.
pub fn lookup_table_find_v2(
    table: &HashTable,
    keys: &Tensor,
    default_value: &Tensor,
) -> Result<Vec<Tensor>> {
    const OP: &str = "LookupTableFindV2";
    let err = table_err(OP);
    table
        .check_dtype("keys", keys, table.key_dtype)
        .map_err(&err)?;
    table
        .check_dtype("default_value", default_value, table.value_dtype)
        .map_err(&err)?;
    if !table.initialized {
        return Err(err(TableError::NotInitialized));
    }
    // TensorFlow's HashTable::Find takes `default_value.flat<V>()(0)` whatever its shape.
    let Some(default) = scalars(default_value.data()).into_iter().next() else {
        return Err(err(TableError::DefaultShape {
            default: default_value.shape().to_vec(),
        }));
    };
    let vals = scalars(keys.data())
        .into_iter()
        .map(|k| table.map.get(&key_of(k)).unwrap_or(&default).clone())
        .collect();
    Ok(vec![output(
        OP,
        keys.shape().to_vec(),
        build(table.value_dtype, vals),
    )?])
}

/// `LookupTableSizeV2`: the number of entries, an int64 scalar.
pub fn lookup_table_size_v2(table: &HashTable) -> Result<Vec<Tensor>> {
    Ok(vec![output(
        "LookupTableSizeV2",
        Vec::new(),
        TensorData::Int64(vec![table.map.len() as i64]),
    )?])
}

/// `InitializeTableFromTextFileV2`: one entry per line of the file (`\n` or `\r\n` ends a
/// line). `key_index` / `value_index`: [`LINE_NUMBER`] (-1, needs int64), [`WHOLE_LINE`]
/// (-2) or a column of the line split on `delimiter` (one byte). `vocab_size` > 0 reads only
/// that many lines and needs the file to have them; -1 reads all. On a table that is already
/// initialized the file must still be readable, and the table is left unchanged.
pub fn initialize_table_from_text_file_v2(
    table: &mut HashTable,
    filename: &Tensor,
    key_index: i64,
    value_index: i64,
    vocab_size: i64,
    delimiter: &str,
) -> Result<Vec<Tensor>> {
    const OP: &str = "InitializeTableFromTextFileV2";
    let err = table_err(OP);
    let names = super::strings_of(OP, "filename", filename)?;
    if !filename.shape().is_empty() {
        return Err(KernelError::InputShape {
            op: OP,
            input: "filename",
            shape: filename.shape().to_vec(),
            reason: "must be a scalar",
        });
    }
    for (attr, index, dtype) in [
        ("key_index", key_index, table.key_dtype),
        ("value_index", value_index, table.value_dtype),
    ] {
        if index < WHOLE_LINE {
            return Err(err(TableError::TextAttr {
                attr,
                value: index,
                reason: "must be -2 (whole line), -1 (line number) or a column >= 0",
            }));
        }
        if index == LINE_NUMBER && dtype != DType::Int64 {
            return Err(err(TableError::TextAttr {
                attr,
                value: index,
                reason: "line numbers need an int64 dtype",
            }));
        }
    }
    if delimiter.len() != 1 {
        return Err(KernelError::InvalidAttr {
            op: OP,
            attr: "delimiter",
            value: format!("{delimiter:?}"),
            reason: "must be exactly one character",
        });
    }
    if vocab_size < -1 || vocab_size == 0 {
        return Err(err(TableError::TextAttr {
            attr: "vocab_size",
            value: vocab_size,
            reason: "must be -1 or positive",
        }));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&names[0]).into_owned());
    let bytes = std::fs::read(&path).map_err(|source| {
        err(TableError::File {
            path: path.clone(),
            source,
        })
    })?;
    if bytes.is_empty() {
        return Err(err(TableError::EmptyFile { path }));
    }
    // TensorFlow opens the file, then leaves an initialized table as it is, even when the
    // file now holds other entries (unlike LookupTableImportV2, which refuses them).
    if table.initialized {
        return Ok(Vec::new());
    }
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if bytes.ends_with(b"\n") {
        lines.pop();
    }
    if vocab_size > 0 {
        let want = usize::try_from(vocab_size).unwrap_or(usize::MAX);
        if lines.len() < want {
            return Err(err(TableError::VocabSize {
                path,
                expected: vocab_size,
                found: lines.len(),
            }));
        }
        lines.truncate(want);
    }
    let delim = delimiter.as_bytes();
    let field =
        |line_no: usize, line: &[u8], index: i64, dtype: DType| -> Result<Scalar, TableError> {
            if index == LINE_NUMBER {
                return Ok(Scalar::Int(line_no as i64));
            }
            let text: &[u8] = if index == WHOLE_LINE {
                line
            } else {
                let cols = split_on(line, delim);
                let col = usize::try_from(index).unwrap_or(usize::MAX);
                if col >= cols.len() {
                    return Err(TableError::Columns {
                        path: path.clone(),
                        line: line_no,
                        expected: col.saturating_add(1),
                        found: cols.len(),
                    });
                }
                cols[col]
            };
            let bad = || TableError::Field {
                path: path.clone(),
                line: line_no,
                field: show(text),
                dtype,
            };
            Ok(match dtype {
                DType::String => Scalar::Bytes(text.to_vec()),
                DType::Int64 => {
                    Scalar::Int(number::parse_int(text, i64::MIN, i64::MAX).ok_or_else(bad)?)
                }
                DType::Int32 => Scalar::Int(
                    number::parse_int(text, i32::MIN.into(), i32::MAX.into()).ok_or_else(bad)?,
                ),
                DType::Float32 => Scalar::Float(number::parse_f32(text).ok_or_else(bad)?.into()),
                DType::Float64 => Scalar::Float(number::parse_f64(text).ok_or_else(bad)?),
                _ => return Err(bad()),
            })
        };
    let mut pairs = Vec::with_capacity(lines.len());
    for (line_no, raw) in lines.into_iter().enumerate() {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if line.is_empty() {
            return Err(err(TableError::EmptyLine {
                path,
                line: line_no,
            }));
        }
        let k = field(line_no, line, key_index, table.key_dtype).map_err(&err)?;
        let v = field(line_no, line, value_index, table.value_dtype).map_err(&err)?;
        pairs.push((k, v));
    }
    table.initialize(pairs).map_err(&err)?;
    Ok(Vec::new())
}

/// `absl::StrSplit(line, delimiter)`: every occurrence splits, empty fields kept.
fn split_on<'a>(line: &'a [u8], delim: &[u8]) -> Vec<&'a [u8]> {
    if delim.is_empty() {
        return vec![line];
    }
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(p) = rest.windows(delim.len()).position(|w| w == delim) {
        out.push(&rest[..p]);
        rest = &rest[p + delim.len()..];
    }
    out.push(rest);
    out
}
