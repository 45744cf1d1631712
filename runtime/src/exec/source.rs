//! The records behind a plan's `source`: every file indexed once when the stage loads, then
//! records read by their number in the epoch's stream (after `skip`, capped by `take`).
//!
//! Uncompressed files are read at their indexed offsets, so a step reads only its records.
//! A compressed file cannot be indexed: it is read whole at load and its records are kept in
//! memory.

use std::path::{Path, PathBuf};

use lode_proto::plan::Source;

use super::{ExecError, Result};
use crate::records::lines::{index_lines, LineFile, LineReader};
use crate::records::tfrecord::{index_tfrecord_with, TfRecordFile, TfRecordReader};
use crate::records::{Compression, OnCorrupt, ReaderConfig};

enum Records {
    TfRecord {
        file: TfRecordFile,
        offsets: Vec<u64>,
    },
    Lines {
        file: LineFile,
        offsets: Vec<u64>,
    },
    Memory(Vec<Vec<u8>>),
}

impl Records {
    fn len(&self) -> u64 {
        match self {
            Records::TfRecord { offsets, .. } | Records::Lines { offsets, .. } => {
                offsets.len() as u64
            }
            Records::Memory(r) => r.len() as u64,
        }
    }
}

struct SourceFile {
    /// The path as the graph names it (for messages).
    name: String,
    records: Records,
}

/// Where a record lives, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordAt {
    pub file: String,
    /// The record's number in its file, counting from 0.
    pub record: u64,
}

impl std::fmt::Display for RecordAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} record {}", self.file, self.record)
    }
}

/// The indexed input of a stage.
pub struct RecordSource {
    files: Vec<SourceFile>,
    /// `starts[i]`: the stream position of file i's first record.
    starts: Vec<u64>,
    skip: u64,
    /// Records per epoch (after skip and take).
    epoch_len: u64,
    /// Corrupt records dropped while indexing (ignore_errors), with the first error.
    pub dropped: u64,
    pub first_dropped: Option<String>,
}

impl std::fmt::Debug for RecordSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSource")
            .field("files", &self.files.len())
            .field("epoch_len", &self.epoch_len)
            .finish()
    }
}

fn dataset_err(reason: String) -> ExecError {
    ExecError::Dataset {
        node: "lode/DWSource".into(),
        op: "DWSource".into(),
        reason,
    }
}

impl RecordSource {
    /// Indexes the files of `source`, resolving relative names against `root`. With
    /// `ignore_errors`, a corrupt record ends its file (TensorFlow's `ignore_errors()`),
    /// counted in [`RecordSource::dropped`].
    pub fn open(source: &Source, root: &Path, ignore_errors: bool) -> Result<RecordSource> {
        let compression: Compression = source.compression.parse().map_err(ExecError::record)?;
        let on_corrupt = if ignore_errors {
            OnCorrupt::EndFile
        } else {
            OnCorrupt::Fail
        };
        let mut files = Vec::new();
        let mut dropped = 0u64;
        let mut first_dropped = None;
        for name in &source.files {
            let path: PathBuf = if Path::new(name).is_absolute() {
                PathBuf::from(name)
            } else {
                root.join(name)
            };
            let records = match (source.reader.as_str(), compression) {
                ("tfrecord", Compression::None) => {
                    let index =
                        index_tfrecord_with(&path, on_corrupt).map_err(ExecError::record)?;
                    dropped += index.corrupt;
                    if let Some(e) = index.first_error {
                        first_dropped.get_or_insert(e.to_string());
                    }
                    Records::TfRecord {
                        file: TfRecordFile::open(&path).map_err(ExecError::record)?,
                        offsets: index.offsets,
                    }
                }
                ("text_lines", Compression::None) => Records::Lines {
                    offsets: index_lines(&path).map_err(ExecError::record)?,
                    file: LineFile::open(&path).map_err(ExecError::record)?,
                },
                ("tfrecord", _) => {
                    let config = ReaderConfig {
                        compression,
                        on_corrupt,
                    };
                    let mut reader =
                        TfRecordReader::open(&path, config).map_err(ExecError::record)?;
                    let mut all = Vec::new();
                    while let Some(r) = reader.next_record() {
                        all.push(r.map_err(ExecError::record)?);
                    }
                    dropped += reader.stats().corrupt;
                    if let Some(e) = &reader.stats().first_error {
                        first_dropped.get_or_insert(e.to_string());
                    }
                    Records::Memory(all)
                }
                ("text_lines", _) => {
                    let config = ReaderConfig {
                        compression,
                        on_corrupt,
                    };
                    let mut reader = LineReader::open(&path, config).map_err(ExecError::record)?;
                    let mut all = Vec::new();
                    while let Some(r) = reader.next_line() {
                        all.push(r.map_err(ExecError::record)?);
                    }
                    dropped += reader.stats().corrupt;
                    Records::Memory(all)
                }
                (other, _) => {
                    return Err(dataset_err(format!(
                        "the reader {other:?} is not supported (tfrecord and text_lines are)"
                    )))
                }
            };
            files.push(SourceFile {
                name: name.clone(),
                records,
            });
        }
        let mut starts = Vec::with_capacity(files.len());
        let mut total = 0u64;
        for f in &files {
            starts.push(total);
            total += f.records.len();
        }
        let skip = u64::try_from(source.skip.unwrap_or(0).max(0)).unwrap_or(0);
        let mut epoch_len = total.saturating_sub(skip);
        if let Some(take) = source.take.filter(|&t| t >= 0) {
            epoch_len = epoch_len.min(u64::try_from(take).unwrap_or(u64::MAX));
        }
        Ok(RecordSource {
            files,
            starts,
            skip,
            epoch_len,
            dropped,
            first_dropped,
        })
    }

    /// Records in one epoch.
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// Where record `id` of the epoch lives.
    pub fn locate(&self, id: u64) -> Option<RecordAt> {
        let (file, within) = self.position(id)?;
        Some(RecordAt {
            file: self.files[file].name.clone(),
            record: within,
        })
    }

    fn position(&self, id: u64) -> Option<(usize, u64)> {
        if id >= self.epoch_len {
            return None;
        }
        let pos = id + self.skip;
        let file = self.starts.partition_point(|&s| s <= pos).checked_sub(1)?;
        Some((file, pos - self.starts[file]))
    }

    /// Records `ids` of the epoch, each read or failed on its own; runs of consecutive
    /// records in one uncompressed file are read with one system call.
    pub fn read_many(&self, ids: &[u64]) -> Vec<Result<Vec<u8>>> {
        let mut out = Vec::with_capacity(ids.len());
        let mut k = 0;
        while k < ids.len() {
            let Some((file, within)) = self.position(ids[k]) else {
                out.push(self.read(ids[k]));
                k += 1;
                continue;
            };
            // The run of ids that follow on in the same file.
            let mut n = 1;
            while k + n < ids.len()
                && ids[k + n] == ids[k] + n as u64
                && self.position(ids[k + n]).is_some_and(|(f, _)| f == file)
            {
                n += 1;
            }
            let Ok(at) = usize::try_from(within) else {
                out.push(self.read(ids[k]));
                k += 1;
                continue;
            };
            match &self.files[file].records {
                Records::TfRecord { file, offsets } => {
                    let span = &offsets[at..at + n];
                    let end = offsets.get(at + n).copied();
                    out.extend(
                        file.read_span(within, span, end)
                            .into_iter()
                            .map(|r| r.map_err(ExecError::record)),
                    );
                }
                Records::Lines { file, offsets } => {
                    let span = &offsets[at..at + n];
                    let end = offsets.get(at + n).copied();
                    match file.read_span(within, span, end) {
                        Ok(lines) => out.extend(lines.into_iter().map(Ok)),
                        Err(_) => out.extend(ids[k..k + n].iter().map(|&id| self.read(id))),
                    }
                }
                Records::Memory(_) => out.extend(ids[k..k + n].iter().map(|&id| self.read(id))),
            }
            k += n;
        }
        out
    }

    /// Record `id` of the epoch.
    pub fn read(&self, id: u64) -> Result<Vec<u8>> {
        let (file, within) = self.position(id).ok_or_else(|| ExecError::Input {
            reason: format!(
                "record {id} is past the end of the epoch ({} records)",
                self.epoch_len
            ),
        })?;
        let at = usize::try_from(within).map_err(|_| ExecError::Input {
            reason: format!("record {id} is out of range"),
        })?;
        match &self.files[file].records {
            Records::TfRecord { file, offsets } => {
                file.read(within, offsets[at]).map_err(ExecError::record)
            }
            Records::Lines { file, offsets } => {
                file.read(within, offsets[at]).map_err(ExecError::record)
            }
            Records::Memory(all) => Ok(all[at].clone()),
        }
    }
}
