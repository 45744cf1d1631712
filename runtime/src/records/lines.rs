//! Text lines as TensorFlow's `TextLineDataset` splits them (its `BufferedInputStream::ReadLine`):
//! a line ends at `\n`, which is dropped; every `\r` in the line is dropped too, wherever it
//! is; and the text after the last `\n` is a line only if something is left of it once its
//! `\r`s are gone. Checked with TensorFlow 2.18.1 (see the tests).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::records::{
    open_stream, OnCorrupt, PositionalFile, ReadStats, ReaderConfig, BUFFER_BYTES,
};

/// Turns the bytes of one line as read (with its `\n`, if any) into the line TensorFlow
/// yields, or `None` for a final piece that holds only `\r`s.
fn finish_line(mut raw: Vec<u8>) -> Option<Vec<u8>> {
    let ended = raw.last() == Some(&b'\n');
    if ended {
        raw.pop();
    }
    raw.retain(|&b| b != b'\r');
    (ended || !raw.is_empty()).then_some(raw)
}

/// Streams the lines of one text file.
pub struct LineReader {
    path: PathBuf,
    input: BufReader<Box<dyn std::io::Read + Send>>,
    on_corrupt: OnCorrupt,
    line: u64,
    offset: u64,
    done: bool,
    stats: ReadStats,
}

impl std::fmt::Debug for LineReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineReader")
            .field("path", &self.path)
            .field("line", &self.line)
            .field("offset", &self.offset)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl LineReader {
    pub fn open(path: impl AsRef<Path>, config: ReaderConfig) -> Result<LineReader> {
        let path = path.as_ref();
        Ok(LineReader {
            input: BufReader::with_capacity(BUFFER_BYTES, open_stream(path, config.compression)?),
            path: path.to_owned(),
            on_corrupt: config.on_corrupt,
            line: 0,
            offset: 0,
            done: false,
            stats: ReadStats::default(),
        })
    }

    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// The next line, `None` at the end of the file (or after an error). Only reading or
    /// decompressing can fail; under a skipping [`OnCorrupt`] such a failure ends the file.
    pub fn next_line(&mut self) -> Option<Result<Vec<u8>>> {
        if self.done {
            return None;
        }
        let mut raw = Vec::new();
        match self.input.read_until(b'\n', &mut raw) {
            Ok(_) => {
                self.offset += raw.len() as u64;
                let line = finish_line(raw);
                match line {
                    Some(line) => {
                        self.line += 1;
                        self.stats.records += 1;
                        Some(Ok(line))
                    }
                    None => {
                        self.done = true;
                        None
                    }
                }
            }
            Err(source) => {
                self.done = true;
                let err = Error::Read {
                    path: self.path.clone(),
                    record: self.line,
                    offset: self.offset + raw.len() as u64,
                    source,
                };
                match self.on_corrupt {
                    OnCorrupt::Fail => Some(Err(err)),
                    OnCorrupt::EndFile | OnCorrupt::SkipRecord => {
                        self.stats.skipped(err);
                        None
                    }
                }
            }
        }
    }
}

impl Iterator for LineReader {
    type Item = Result<Vec<u8>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_line()
    }
}

/// The byte offset where each line of an uncompressed text file starts, with lines counted
/// as [`LineReader`] counts them.
pub fn index_lines(path: impl AsRef<Path>) -> Result<Vec<u64>> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|source| Error::Open {
        path: path.to_owned(),
        source,
    })?;
    let mut input = BufReader::with_capacity(BUFFER_BYTES, file);
    let mut offsets = Vec::new();
    let mut offset = 0u64;
    loop {
        let start = offset;
        // Scans the buffer in place rather than copying every line out.
        let mut ended = false;
        let mut only_cr = true;
        while !ended {
            let buf = input.fill_buf().map_err(|source| Error::Read {
                path: path.to_owned(),
                record: offsets.len() as u64,
                offset,
                source,
            })?;
            if buf.is_empty() {
                break;
            }
            let (used, found) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            let body = if found { &buf[..used - 1] } else { buf };
            only_cr &= body.iter().all(|&b| b == b'\r');
            ended = found;
            input.consume(used);
            offset += used as u64;
        }
        if offset == start {
            break;
        }
        if ended || !only_cr {
            offsets.push(start);
        }
        if !ended {
            break;
        }
    }
    Ok(offsets)
}

/// An uncompressed text file read by line offset, from any number of threads.
#[derive(Debug)]
pub struct LineFile {
    path: PathBuf,
    file: PositionalFile,
}

impl LineFile {
    pub fn open(path: impl AsRef<Path>) -> Result<LineFile> {
        let path = path.as_ref();
        Ok(LineFile {
            file: PositionalFile::open(path)?,
            path: path.to_owned(),
        })
    }

    /// Reads the line starting at `offset` (from [`index_lines`]); `line` is its index, used
    /// only to name it in errors.
    /// Lines `first..first + offsets.len()` at once, where `offsets` are their indexed start
    /// offsets (consecutive lines): one read of the bytes from the first offset to the end of
    /// the last line (the next line's offset `end`, or the end of the file).
    pub fn read_span(&self, first: u64, offsets: &[u64], end: Option<u64>) -> Result<Vec<Vec<u8>>> {
        let (Some(&start), Some(&last)) = (offsets.first(), offsets.last()) else {
            return Ok(Vec::new());
        };
        let end = end.unwrap_or(self.file.len).min(self.file.len);
        let no_line = |k: usize| Error::NoLineAt {
            path: self.path.clone(),
            record: first + k as u64,
            offset: offsets.get(k).copied().unwrap_or(start),
        };
        if end < last || last < start {
            return Err(no_line(offsets.len() - 1));
        }
        let len = usize::try_from(end - start).map_err(|_| no_line(0))?;
        let mut buf = vec![0u8; len];
        let got = self
            .file
            .read_full_at(&mut buf, start)
            .map_err(|source| Error::Read {
                path: self.path.clone(),
                record: first,
                offset: start,
                source,
            })?;
        buf.truncate(got);
        let mut lines = Vec::with_capacity(offsets.len());
        for (k, &at) in offsets.iter().enumerate() {
            let from = usize::try_from(at - start).map_err(|_| no_line(k))?;
            let to = match offsets.get(k + 1) {
                Some(&next) => usize::try_from(next - start).map_err(|_| no_line(k))?,
                None => buf.len(),
            };
            let raw = buf.get(from..to).ok_or_else(|| no_line(k))?.to_vec();
            lines.push(finish_line(raw).ok_or_else(|| no_line(k))?);
        }
        Ok(lines)
    }

    pub fn read(&self, line: u64, offset: u64) -> Result<Vec<u8>> {
        let mut raw = Vec::new();
        let mut chunk = vec![0u8; 4096];
        let mut at = offset;
        loop {
            let got = self
                .file
                .read_full_at(&mut chunk, at)
                .map_err(|source| Error::Read {
                    path: self.path.clone(),
                    record: line,
                    offset: at,
                    source,
                })?;
            let piece = &chunk[..got];
            if let Some(i) = piece.iter().position(|&b| b == b'\n') {
                raw.extend_from_slice(&piece[..=i]);
                break;
            }
            raw.extend_from_slice(piece);
            if got < chunk.len() {
                break;
            }
            at += got as u64;
            // Long lines: read bigger pieces, so a line costs O(log length) reads.
            if chunk.len() < BUFFER_BYTES {
                chunk.resize(chunk.len() * 2, 0);
            }
        }
        finish_line(raw).ok_or_else(|| Error::NoLineAt {
            path: self.path.clone(),
            record: line,
            offset,
        })
    }
}
