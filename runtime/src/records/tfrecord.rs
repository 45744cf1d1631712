//! TFRecord files: each record is
//! `u64 length (LE) | u32 masked CRC32C of the length bytes | data | u32 masked CRC32C of data`,
//! with TensorFlow's mask `((crc >> 15) | (crc << 17)) + 0xa282ead8` (wrapping).
//!
//! Differences from TensorFlow's `RecordReader`, on damaged files only: TensorFlow takes a
//! file that ends inside a record header as a clean end of file; Lode reports it as a
//! truncated record (under [`OnCorrupt::EndFile`] both yield the same records).

use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::records::{
    open_stream, read_full, OnCorrupt, PositionalFile, ReadStats, ReaderConfig, BUFFER_BYTES,
};

/// Bytes before a record's data: the length and its CRC.
pub const HEADER_BYTES: u64 = 12;
/// Bytes after a record's data: its CRC.
pub const FOOTER_BYTES: u64 = 4;

const MASK_DELTA: u32 = 0xa282_ead8;

/// TensorFlow's masked CRC32C (`crc32c::Mask` in tensorflow/core/lib/hash/crc32c.h).
pub fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    // ((crc >> 15) | (crc << 17)) + 0xa282ead8, wrapping.
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Appends one framed record to `out` (what `tf.io.TFRecordWriter.write` writes).
pub fn encode_record(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// Checks a 12-byte header and returns the data length.
fn parse_header(header: &[u8; 12], path: &Path, record: u64, offset: u64) -> Result<u64> {
    let mut len = [0u8; 8];
    len.copy_from_slice(&header[..8]);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&header[8..]);
    if masked_crc(&len) != u32::from_le_bytes(crc) {
        return Err(Error::BadLengthCrc {
            path: path.to_owned(),
            record,
            offset,
        });
    }
    Ok(u64::from_le_bytes(len))
}

fn check_data(data: &[u8], footer: [u8; 4], path: &Path, record: u64, offset: u64) -> Result<()> {
    if masked_crc(data) != u32::from_le_bytes(footer) {
        return Err(Error::BadDataCrc {
            path: path.to_owned(),
            record,
            offset,
        });
    }
    Ok(())
}

/// Streams the records of one TFRecord file, in order, checking both CRCs of each.
pub struct TfRecordReader {
    path: PathBuf,
    input: Box<dyn Read + Send>,
    on_corrupt: OnCorrupt,
    /// Index of the next record.
    record: u64,
    /// Offset of the next record in the uncompressed stream.
    offset: u64,
    done: bool,
    stats: ReadStats,
}

impl std::fmt::Debug for TfRecordReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TfRecordReader")
            .field("path", &self.path)
            .field("record", &self.record)
            .field("offset", &self.offset)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl TfRecordReader {
    pub fn open(path: impl AsRef<Path>, config: ReaderConfig) -> Result<TfRecordReader> {
        let path = path.as_ref();
        Ok(TfRecordReader {
            input: open_stream(path, config.compression)?,
            path: path.to_owned(),
            on_corrupt: config.on_corrupt,
            record: 0,
            offset: 0,
            done: false,
            stats: ReadStats::default(),
        })
    }

    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// The next record, `None` at the end of the file (or after an error).
    pub fn next_record(&mut self) -> Option<Result<Vec<u8>>> {
        while !self.done {
            let err = match self.read_one() {
                Ok(Some(data)) => {
                    self.stats.records += 1;
                    return Some(Ok(data));
                }
                Ok(None) => break,
                Err(err) => err,
            };
            match (self.on_corrupt, &err) {
                (OnCorrupt::Fail, _) => {
                    self.done = true;
                    return Some(Err(err));
                }
                (OnCorrupt::SkipRecord, Error::BadDataCrc { .. }) => self.stats.skipped(err),
                (OnCorrupt::EndFile | OnCorrupt::SkipRecord, _) => {
                    self.stats.skipped(err);
                    break;
                }
            }
        }
        self.done = true;
        None
    }

    fn read_err(&self, source: std::io::Error) -> Error {
        Error::Read {
            path: self.path.clone(),
            record: self.record,
            offset: self.offset,
            source,
        }
    }

    fn truncated(&self, needed: u64, found: u64) -> Error {
        Error::TruncatedRecord {
            path: self.path.clone(),
            record: self.record,
            offset: self.offset,
            needed,
            found,
        }
    }

    /// Reads one record; on success the position moves past it, and past a record whose data
    /// CRC failed too (its length was good, so the next record is where the length says).
    fn read_one(&mut self) -> Result<Option<Vec<u8>>> {
        let mut header = [0u8; 12];
        let got = read_full(&mut self.input, &mut header).map_err(|e| self.read_err(e))?;
        if got == 0 {
            return Ok(None);
        }
        if got < header.len() {
            return Err(self.truncated(HEADER_BYTES, got as u64));
        }
        let len = parse_header(&header, &self.path, self.record, self.offset)?;
        // Grows with what arrives, so a huge length in a short file cannot exhaust memory.
        let mut data = Vec::new();
        let got = (&mut self.input)
            .take(len)
            .read_to_end(&mut data)
            .map_err(|e| self.read_err(e))? as u64;
        let mut footer = [0u8; 4];
        let got_footer = if got == len {
            read_full(&mut self.input, &mut footer).map_err(|e| self.read_err(e))? as u64
        } else {
            0
        };
        if got < len || got_footer < FOOTER_BYTES {
            // A length near u64::MAX (its CRC can be right) must not overflow the message.
            return Err(self.truncated(len.saturating_add(FOOTER_BYTES), got + got_footer));
        }
        let checked = check_data(&data, footer, &self.path, self.record, self.offset);
        self.record += 1;
        self.offset += HEADER_BYTES + len + FOOTER_BYTES;
        checked.map(|()| Some(data))
    }
}

impl Iterator for TfRecordReader {
    type Item = Result<Vec<u8>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record()
    }
}

/// The record offsets of an uncompressed TFRecord file.
#[derive(Debug, Default)]
pub struct TfRecordIndex {
    /// Byte offset of each record's header, in file order.
    pub offsets: Vec<u64>,
    /// Corruptions met (0 or 1: the index ends at the first, whose records cannot be found).
    pub corrupt: u64,
    pub first_error: Option<Error>,
}

/// The offsets of every record of an uncompressed TFRecord file, failing at the first corrupt
/// header. See [`index_tfrecord_with`].
pub fn index_tfrecord(path: impl AsRef<Path>) -> Result<Vec<u64>> {
    index_tfrecord_with(path, OnCorrupt::Fail).map(|index| index.offsets)
}

/// Indexes an uncompressed TFRecord file by reading only the record headers: every length CRC
/// is checked and every record must fit in the file; data CRCs are checked when a record is
/// read ([`TfRecordFile::read`]). Under [`OnCorrupt::EndFile`] or [`OnCorrupt::SkipRecord`]
/// the index keeps the records before the first corrupt header and counts it.
pub fn index_tfrecord_with(path: impl AsRef<Path>, on_corrupt: OnCorrupt) -> Result<TfRecordIndex> {
    let path = path.as_ref();
    let open_err = |source| Error::Open {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(open_err)?;
    let file_len = file.metadata().map_err(open_err)?.len();
    let mut input = BufReader::with_capacity(BUFFER_BYTES, file);
    let mut index = TfRecordIndex::default();
    let mut offset = 0u64;
    while offset < file_len {
        let record = index.offsets.len() as u64;
        let read_err = |source| Error::Read {
            path: path.to_owned(),
            record,
            offset,
            source,
        };
        let truncated = |needed, found| Error::TruncatedRecord {
            path: path.to_owned(),
            record,
            offset,
            needed,
            found,
        };
        let mut header = [0u8; 12];
        let got = read_full(&mut input, &mut header).map_err(read_err)?;
        let checked = if got < header.len() {
            Err(truncated(HEADER_BYTES, got as u64))
        } else {
            parse_header(&header, path, record, offset).and_then(|len| {
                let rest = file_len - offset - HEADER_BYTES;
                match len.checked_add(FOOTER_BYTES) {
                    Some(needed) if needed <= rest => Ok(needed),
                    _ => Err(truncated(len.saturating_add(FOOTER_BYTES), rest)),
                }
            })
        };
        match checked {
            Ok(skip) => {
                index.offsets.push(offset);
                // `skip` fits in the file, hence in i64.
                let skip_i64 = i64::try_from(skip).map_err(|_| truncated(skip, 0))?;
                input.seek_relative(skip_i64).map_err(read_err)?;
                offset += HEADER_BYTES + skip;
            }
            Err(err) if on_corrupt == OnCorrupt::Fail => return Err(err),
            Err(err) => {
                index.corrupt += 1;
                index.first_error = Some(err);
                break;
            }
        }
    }
    Ok(index)
}

/// An uncompressed TFRecord file read by record offset, from any number of threads.
#[derive(Debug)]
pub struct TfRecordFile {
    path: PathBuf,
    file: PositionalFile,
}

impl TfRecordFile {
    pub fn open(path: impl AsRef<Path>) -> Result<TfRecordFile> {
        let path = path.as_ref();
        Ok(TfRecordFile {
            file: PositionalFile::open(path)?,
            path: path.to_owned(),
        })
    }

    /// Reads the record whose header is at `offset` (from [`index_tfrecord`]), checking both
    /// CRCs; `record` is its index, used only to name it in errors.
    /// Records `first..first + offsets.len()` (consecutive, at their indexed `offsets`) with
    /// one read up to `end` (the next record's offset, or the end of the file); each record's
    /// framing and CRCs are checked on its own, so one bad record does not hide the others.
    pub fn read_span(&self, first: u64, offsets: &[u64], end: Option<u64>) -> Vec<Result<Vec<u8>>> {
        let (Some(&start), Some(&last)) = (offsets.first(), offsets.last()) else {
            return Vec::new();
        };
        let end = end.unwrap_or(self.file.len).min(self.file.len);
        let fallback = || {
            offsets
                .iter()
                .enumerate()
                .map(|(k, &at)| self.read(first + k as u64, at))
                .collect()
        };
        let Ok(len) = usize::try_from(end.saturating_sub(start)) else {
            return fallback();
        };
        if end < last {
            return fallback();
        }
        let mut buf = vec![0u8; len];
        match self.file.read_full_at(&mut buf, start) {
            Ok(got) if got == len => {}
            _ => return fallback(),
        }
        offsets
            .iter()
            .enumerate()
            .map(|(k, &at)| {
                let record = first + k as u64;
                let from = usize::try_from(at - start).unwrap_or(usize::MAX);
                let Some(header) = buf.get(from..from.saturating_add(12)) else {
                    return self.read(record, at);
                };
                let mut h = [0u8; 12];
                h.copy_from_slice(header);
                let data_len = parse_header(&h, &self.path, record, at)?;
                let body = usize::try_from(data_len)
                    .ok()
                    .and_then(|n| Some((from + 12, from.checked_add(12 + n)?)))
                    .and_then(|(a, b)| Some((buf.get(a..b)?, buf.get(b..b.checked_add(4)?)?)));
                let Some((data, footer)) = body else {
                    // Past the span: read it alone (reports truncation precisely).
                    return self.read(record, at);
                };
                let mut f = [0u8; 4];
                f.copy_from_slice(footer);
                check_data(data, f, &self.path, record, at)?;
                Ok(data.to_vec())
            })
            .collect()
    }

    pub fn read(&self, record: u64, offset: u64) -> Result<Vec<u8>> {
        let read_err = |source| Error::Read {
            path: self.path.clone(),
            record,
            offset,
            source,
        };
        let truncated = |needed, found| Error::TruncatedRecord {
            path: self.path.clone(),
            record,
            offset,
            needed,
            found,
        };
        let mut header = [0u8; 12];
        let got = self
            .file
            .read_full_at(&mut header, offset)
            .map_err(read_err)?;
        if got < header.len() {
            return Err(truncated(HEADER_BYTES, got as u64));
        }
        let len = parse_header(&header, &self.path, record, offset)?;
        let rest = self.file.len.saturating_sub(offset + HEADER_BYTES);
        let needed = len.saturating_add(FOOTER_BYTES);
        if needed > rest {
            return Err(truncated(needed, rest));
        }
        // Bounded by the file's length, checked just above.
        let data_len = usize::try_from(len).map_err(|_| truncated(needed, rest))?;
        let mut buf = vec![0u8; data_len + 4];
        let got = self
            .file
            .read_full_at(&mut buf, offset + HEADER_BYTES)
            .map_err(read_err)?;
        if got < buf.len() {
            return Err(truncated(needed, got as u64));
        }
        let mut footer = [0u8; 4];
        footer.copy_from_slice(&buf[data_len..]);
        buf.truncate(data_len);
        check_data(&buf, footer, &self.path, record, offset)?;
        Ok(buf)
    }
}
