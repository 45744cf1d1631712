//! Record readers for the inputs a data worker leases: TFRecord files and text lines.
//!
//! - [`tfrecord`]: TFRecord framing with both CRC32C checks, streaming (any compression) and
//!   random access by byte offset (uncompressed), plus the index that finds the offsets.
//! - [`lines`]: text lines split as TensorFlow's `TextLineDataset` splits them, streaming and
//!   random access, plus the index.
//!
//! Compression follows TensorFlow's readers: `""`, `"ZLIB"` or `"GZIP"` for the whole file.
//! A GZIP file may hold several members (all are read, as TensorFlow does); a ZLIB file's
//! first stream is read and anything after it is ignored (as TensorFlow does). Byte offsets
//! in errors are offsets into the uncompressed stream. Compressed files cannot be indexed:
//! their records are reached by streaming.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::str::FromStr;

use flate2::read::{MultiGzDecoder, ZlibDecoder};

use crate::error::{Error, Result};

pub mod lines;
pub mod tfrecord;

/// Buffer size for file and decompressor reads.
const BUFFER_BYTES: usize = 256 * 1024;

/// Whole-file compression, named as TensorFlow's readers name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    None,
    Zlib,
    Gzip,
}

impl FromStr for Compression {
    type Err = Error;

    /// TensorFlow's `compression_type` strings, matched exactly: `""`, `"ZLIB"`, `"GZIP"`.
    fn from_str(s: &str) -> Result<Compression> {
        match s {
            "" => Ok(Compression::None),
            "ZLIB" => Ok(Compression::Zlib),
            "GZIP" => Ok(Compression::Gzip),
            other => Err(Error::UnknownCompression {
                compression: other.to_owned(),
            }),
        }
    }
}

/// What a reader does when it meets a corrupt record (bad CRC, truncation, a stream that does
/// not decompress).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnCorrupt {
    /// Return the error; the reader then ends.
    #[default]
    Fail,
    /// Count the corruption and end the file, keeping what was read before it. This is what
    /// TensorFlow's `ignore_errors()` gives on `TFRecordDataset` and `TextLineDataset`: the
    /// reader moves on to the next file after a DataLoss error (checked with TensorFlow 2.18.1:
    /// a bad CRC in record 1 of 3 yields only record 0).
    EndFile,
    /// Count and skip just the corrupt record when its length was intact (a bad data CRC),
    /// and go on with the next one; otherwise (bad length CRC, truncation, decompression
    /// failure) there is no next record to find, so end the file as [`OnCorrupt::EndFile`].
    SkipRecord,
}

/// How to read a record file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReaderConfig {
    pub compression: Compression,
    pub on_corrupt: OnCorrupt,
}

/// What a reader has seen so far.
#[derive(Debug, Default)]
pub struct ReadStats {
    /// Records (or lines) returned.
    pub records: u64,
    /// Corruptions skipped under [`OnCorrupt::EndFile`] or [`OnCorrupt::SkipRecord`].
    pub corrupt: u64,
    /// The first skipped corruption, for the log.
    pub first_error: Option<Error>,
}

impl ReadStats {
    fn skipped(&mut self, err: Error) {
        self.corrupt += 1;
        self.first_error.get_or_insert(err);
    }
}

/// Opens `path` as a decompressed byte stream.
fn open_stream(path: &Path, compression: Compression) -> Result<Box<dyn Read + Send>> {
    let file = File::open(path).map_err(|source| Error::Open {
        path: path.to_owned(),
        source,
    })?;
    let file = BufReader::with_capacity(BUFFER_BYTES, file);
    Ok(match compression {
        Compression::None => Box::new(file),
        Compression::Zlib => Box::new(ZlibDecoder::new(file)),
        Compression::Gzip => Box::new(MultiGzDecoder::new(file)),
    })
}

/// Reads until `buf` is full or the stream ends; returns how many bytes were read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A file read at byte offsets through `&self`, so that many threads can share one handle.
#[derive(Debug)]
struct PositionalFile {
    file: File,
    len: u64,
}

impl PositionalFile {
    fn open(path: &Path) -> Result<PositionalFile> {
        let open_err = |source| Error::Open {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        Ok(PositionalFile { file, len })
    }

    /// Reads from `offset` until `buf` is full or the file ends; returns the count.
    fn read_full_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            let at = offset + filled as u64;
            match self.read_at(&mut buf[filled..], at) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }

    #[cfg(unix)]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.file, buf, offset)
    }

    #[cfg(windows)]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::os::windows::fs::FileExt::seek_read(&self.file, buf, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_names_are_tensorflows_exactly() {
        assert_eq!("".parse::<Compression>().ok(), Some(Compression::None));
        assert_eq!("ZLIB".parse::<Compression>().ok(), Some(Compression::Zlib));
        assert_eq!("GZIP".parse::<Compression>().ok(), Some(Compression::Gzip));
        for bad in ["gzip", "zlib", "NONE", "SNAPPY", " GZIP"] {
            assert!(
                matches!(
                    bad.parse::<Compression>(),
                    Err(Error::UnknownCompression { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_missing_file_is_an_open_error_naming_it() {
        let err = open_stream(Path::new("/nonexistent/lode/x.tfrecord"), Compression::None)
            .err()
            .expect("no such file");
        assert!(
            err.to_string().contains("/nonexistent/lode/x.tfrecord"),
            "{err}"
        );
        assert!(!err.is_corrupt_record());
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod reader_tests;
