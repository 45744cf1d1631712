//! Tests of the record readers against bytes written by TensorFlow and against TensorFlow's
//! observed behaviour.

use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::write::{GzEncoder, ZlibEncoder};
use proptest::prelude::*;

use super::lines::{index_lines, LineFile, LineReader};
use super::tfrecord::{
    encode_record, index_tfrecord, index_tfrecord_with, masked_crc, TfRecordFile, TfRecordReader,
};
use super::{Compression, OnCorrupt, ReaderConfig};
use crate::error::Error;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Three records, b"rec0", b"record-one", b"r2", as written by `tf.io.TFRecordWriter` in
/// TensorFlow 2.18.1. Record 1 starts at byte 20 (its data at 32), record 2 at byte 46.
const TF_FILE: &str = "040000000000000042455204726563305ae2a4d90a00000000000000aea3bf3a7265\
636f72642d6f6e6594f85169020000000000000078270b347232235c7ef8";

fn tf_file() -> Vec<u8> {
    hex(TF_FILE)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write temp file");
    path
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

fn zlib(bytes: &[u8]) -> Vec<u8> {
    let mut enc = ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).expect("zlib");
    enc.finish().expect("zlib")
}

fn config(compression: Compression, on_corrupt: OnCorrupt) -> ReaderConfig {
    ReaderConfig {
        compression,
        on_corrupt,
    }
}

/// Reads every record, returning the records before the first error and that error.
fn read_all(path: &Path, config: ReaderConfig) -> (Vec<Vec<u8>>, Option<Error>, u64) {
    let mut reader = TfRecordReader::open(path, config).expect("open");
    let mut out = Vec::new();
    let mut error = None;
    for item in reader.by_ref() {
        match item {
            Ok(record) => out.push(record),
            Err(err) => error = Some(err),
        }
    }
    (out, error, reader.stats().corrupt)
}

fn records(names: &[&[u8]]) -> Vec<Vec<u8>> {
    names.iter().map(|r| r.to_vec()).collect()
}

#[test]
#[allow(clippy::manual_rotate)] // TensorFlow's formula, spelled as crc32c.h spells it.
fn writer_and_masked_crc_match_tensorflow_bytes() {
    let mut out = Vec::new();
    for r in [&b"rec0"[..], b"record-one", b"r2"] {
        encode_record(r, &mut out);
    }
    assert_eq!(out, tf_file());
    // CRC-32C check value (RFC 3720 B.4: 32 zero bytes give 0x8a9136aa), then masked.
    assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
    let crc = 0x8a91_36aau32;
    assert_eq!(
        masked_crc(&[0u8; 32]),
        ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8)
    );
}

#[test]
fn reads_a_tensorflow_file_in_every_compression() {
    let dir = tempfile::tempdir().expect("tempdir");
    let want = records(&[b"rec0", b"record-one", b"r2"]);
    for (name, bytes, compression) in [
        ("plain", tf_file(), Compression::None),
        ("gz", gzip(&tf_file()), Compression::Gzip),
        ("zl", zlib(&tf_file()), Compression::Zlib),
    ] {
        let path = write(dir.path(), name, &bytes);
        let (got, err, _) = read_all(&path, config(compression, OnCorrupt::Fail));
        assert!(err.is_none(), "{name}: {err:?}");
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn gzip_members_are_all_read_but_zlib_stops_after_its_first_stream() {
    // TensorFlow 2.18.1: TFRecordDataset(compression_type="GZIP") over two concatenated gzip
    // members yields all six records; "ZLIB" over two concatenated zlib streams yields three.
    let dir = tempfile::tempdir().expect("tempdir");
    let want = records(&[b"rec0", b"record-one", b"r2"]);
    let gz = write(
        dir.path(),
        "gz2",
        &[gzip(&tf_file()), gzip(&tf_file())].concat(),
    );
    let (got, err, _) = read_all(&gz, config(Compression::Gzip, OnCorrupt::Fail));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got, [want.clone(), want.clone()].concat());
    let zl = write(
        dir.path(),
        "zl2",
        &[zlib(&tf_file()), zlib(&tf_file())].concat(),
    );
    let (got, err, _) = read_all(&zl, config(Compression::Zlib, OnCorrupt::Fail));
    assert!(err.is_none(), "{err:?}");
    assert_eq!(got, want);
}

#[test]
fn the_wrong_compression_is_a_read_error() {
    // TensorFlow 2.18.1 fails these with "inflate() failed ... incorrect header check".
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, bytes, compression) in [
        ("gz_as_zlib", gzip(&tf_file()), Compression::Zlib),
        ("zlib_as_gz", zlib(&tf_file()), Compression::Gzip),
        ("plain_as_gz", tf_file(), Compression::Gzip),
    ] {
        let path = write(dir.path(), name, &bytes);
        let (got, err, _) = read_all(&path, config(compression, OnCorrupt::Fail));
        assert!(got.is_empty(), "{name}");
        let err = err.expect("error");
        assert!(
            matches!(err, Error::Read { record: 0, .. }),
            "{name}: {err}"
        );
        assert!(err.is_corrupt_record());
    }
}

#[test]
fn corruption_errors_name_file_record_and_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The same damage in TensorFlow 2.18.1 gives DataLossError "corrupted record at 32" (bad
    // data CRC: TensorFlow names the data's offset) or "at 20" (bad length or length CRC), after
    // yielding record 0. Lode names the record's header offset, 20, and the record index, 1.
    type Expect = fn(&Error) -> bool;
    let cases: [(&str, usize, Expect); 3] = [
        ("bad_data", 33, |e| {
            matches!(
                e,
                Error::BadDataCrc {
                    record: 1,
                    offset: 20,
                    ..
                }
            )
        }),
        ("bad_len", 21, |e| {
            matches!(
                e,
                Error::BadLengthCrc {
                    record: 1,
                    offset: 20,
                    ..
                }
            )
        }),
        ("bad_len_crc", 29, |e| {
            matches!(
                e,
                Error::BadLengthCrc {
                    record: 1,
                    offset: 20,
                    ..
                }
            )
        }),
    ];
    for (name, byte, expected) in cases {
        let mut bytes = tf_file();
        bytes[byte] ^= 1;
        let path = write(dir.path(), name, &bytes);
        let (got, err, _) = read_all(&path, config(Compression::None, OnCorrupt::Fail));
        assert_eq!(got, records(&[b"rec0"]), "{name}");
        let err = err.expect("error");
        assert!(expected(&err), "{name}: {err:?}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert!(err.to_string().contains("record 1"), "{err}");
        assert!(err.to_string().contains("offset 20"), "{err}");
    }
}

#[test]
fn truncation_is_an_error_in_the_data_and_in_the_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = tf_file();
    // TensorFlow 2.18.1 reports "truncated record at 46" when the data or footer is cut.
    let path = write(dir.path(), "cut_data", &full[..full.len() - 3]);
    let (got, err, _) = read_all(&path, config(Compression::None, OnCorrupt::Fail));
    assert_eq!(got, records(&[b"rec0", b"record-one"]));
    assert!(
        matches!(
            err,
            Some(Error::TruncatedRecord {
                record: 2,
                offset: 46,
                needed: 6,
                found: 3,
                ..
            })
        ),
        "{err:?}"
    );
    // A cut inside a header: TensorFlow silently ends the file; Lode reports it.
    let path = write(dir.path(), "cut_header", &full[..46 + 5]);
    let (got, err, _) = read_all(&path, config(Compression::None, OnCorrupt::Fail));
    assert_eq!(got, records(&[b"rec0", b"record-one"]));
    assert!(
        matches!(
            err,
            Some(Error::TruncatedRecord {
                record: 2,
                offset: 46,
                needed: 12,
                found: 5,
                ..
            })
        ),
        "{err:?}"
    );
    // A cut gzip stream is a read (decompression) or truncation error, never a panic.
    let gz = gzip(&full);
    let path = write(dir.path(), "cut_gz", &gz[..gz.len() - 10]);
    let (_, err, _) = read_all(&path, config(Compression::Gzip, OnCorrupt::Fail));
    assert!(err.is_some_and(|e| e.is_corrupt_record()));
}

/// Found by the fuzz harness (tests/fuzz): a length near u64::MAX with a correct length CRC
/// overflowed the truncation error's arithmetic (a panic in debug builds).
#[test]
fn a_huge_length_with_a_good_crc_is_a_truncation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let len = u64::MAX - 1;
    let mut file = len.to_le_bytes().to_vec();
    file.extend(crate::records::tfrecord::masked_crc(&len.to_le_bytes()).to_le_bytes());
    file.extend(b"short");
    let path = write(dir.path(), "huge", &file);
    let (got, err, _) = read_all(&path, config(Compression::None, OnCorrupt::Fail));
    assert!(got.is_empty());
    assert!(
        matches!(
            err,
            Some(Error::TruncatedRecord {
                offset: 0,
                needed: u64::MAX,
                found: 5,
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn ignore_errors_policies_skip_and_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut bad_data = tf_file();
    bad_data[33] ^= 1;
    let bad_data = write(dir.path(), "bad_data", &bad_data);
    let mut bad_len = tf_file();
    bad_len[21] ^= 1;
    let bad_len = write(dir.path(), "bad_len", &bad_len);

    // TensorFlow 2.18.1: TFRecordDataset(f).ignore_errors() yields [b"rec0"] for both files.
    for path in [&bad_data, &bad_len] {
        let (got, err, corrupt) = read_all(path, config(Compression::None, OnCorrupt::EndFile));
        assert!(err.is_none());
        assert_eq!((got, corrupt), (records(&[b"rec0"]), 1));
    }
    // SkipRecord keeps going past a record whose length was intact...
    let (got, err, corrupt) = read_all(&bad_data, config(Compression::None, OnCorrupt::SkipRecord));
    assert!(err.is_none());
    assert_eq!((got, corrupt), (records(&[b"rec0", b"r2"]), 1));
    // ...but cannot past a broken length.
    let (got, _, corrupt) = read_all(&bad_len, config(Compression::None, OnCorrupt::SkipRecord));
    assert_eq!((got, corrupt), (records(&[b"rec0"]), 1));

    let mut reader = TfRecordReader::open(&bad_data, config(Compression::None, OnCorrupt::EndFile))
        .expect("open");
    assert_eq!(reader.by_ref().count(), 1);
    assert_eq!(reader.stats().records, 1);
    assert!(matches!(
        reader.stats().first_error,
        Some(Error::BadDataCrc { record: 1, .. })
    ));
}

#[test]
fn index_and_random_access_read_each_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), "plain", &tf_file());
    let offsets = index_tfrecord(&path).expect("index");
    assert_eq!(offsets, [0, 20, 46]);
    let file = TfRecordFile::open(&path).expect("open");
    let want = records(&[b"rec0", b"record-one", b"r2"]);
    // Any order: the dispatcher leases permuted index batches.
    for i in [2usize, 0, 1] {
        assert_eq!(file.read(i as u64, offsets[i]).expect("read"), want[i]);
    }
    // An offset that is not a record start fails the length CRC.
    assert!(matches!(
        file.read(1, 21),
        Err(Error::BadLengthCrc { offset: 21, .. })
    ));
    // A data CRC error surfaces at read time, naming the record.
    let mut bytes = tf_file();
    bytes[33] ^= 1;
    let bad = write(dir.path(), "bad", &bytes);
    assert_eq!(
        index_tfrecord(&bad).expect("headers are intact"),
        [0, 20, 46]
    );
    let file = TfRecordFile::open(&bad).expect("open");
    assert!(matches!(
        file.read(1, 20),
        Err(Error::BadDataCrc {
            record: 1,
            offset: 20,
            ..
        })
    ));
    assert!(file.read(2, 46).is_ok());
}

#[test]
fn index_refuses_records_past_the_end_without_allocating() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A valid header whose length claims far more than the file holds.
    let len = (1u64 << 60).to_le_bytes();
    let mut bytes = len.to_vec();
    bytes.extend_from_slice(&masked_crc(&len).to_le_bytes());
    bytes.extend_from_slice(b"tiny");
    let path = write(dir.path(), "huge", &[tf_file(), bytes].concat());
    let err = index_tfrecord(&path).expect_err("truncated");
    assert!(
        matches!(
            err,
            Error::TruncatedRecord {
                record: 3,
                offset: 64,
                ..
            }
        ),
        "{err}"
    );
    let index = index_tfrecord_with(&path, OnCorrupt::EndFile).expect("lenient");
    assert_eq!((index.offsets, index.corrupt), (vec![0, 20, 46], 1));
    let file = TfRecordFile::open(&path).expect("open");
    assert!(matches!(
        file.read(3, 64),
        Err(Error::TruncatedRecord { .. })
    ));
    // Streaming reads it as truncated too, without reserving 2^60 bytes.
    let (got, err, _) = read_all(&path, config(Compression::None, OnCorrupt::Fail));
    assert_eq!(got.len(), 3);
    assert!(
        matches!(err, Some(Error::TruncatedRecord { record: 3, .. })),
        "{err:?}"
    );
}

proptest! {
    #[test]
    fn written_records_read_back_streaming_and_by_index(
        recs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bytes = Vec::new();
        for r in &recs {
            encode_record(r, &mut bytes);
        }
        let path = write(dir.path(), "p", &bytes);
        let (got, err, _) = read_all(&path, config(Compression::None, OnCorrupt::Fail));
        prop_assert!(err.is_none());
        prop_assert_eq!(&got, &recs);
        let offsets = index_tfrecord(&path).expect("index");
        prop_assert_eq!(offsets.len(), recs.len());
        let file = TfRecordFile::open(&path).expect("open");
        for (i, (&offset, want)) in offsets.iter().zip(&recs).enumerate() {
            prop_assert_eq!(&file.read(i as u64, offset).expect("read"), want);
        }
        let gz = write(dir.path(), "g", &gzip(&bytes));
        let (got, _, _) = read_all(&gz, config(Compression::Gzip, OnCorrupt::Fail));
        prop_assert_eq!(&got, &recs);
    }

    #[test]
    fn damaged_files_never_panic(
        recs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..6),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bytes = Vec::new();
        for r in &recs {
            encode_record(r, &mut bytes);
        }
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        let path = write(dir.path(), "d", &bytes);
        for on_corrupt in [OnCorrupt::Fail, OnCorrupt::EndFile, OnCorrupt::SkipRecord] {
            let (got, _, _) = read_all(&path, config(Compression::None, on_corrupt));
            // Whatever comes back passed both CRCs, so it is one of the written records
            // (a flip that keeps both CRCs valid is a 2^-64 event).
            for g in &got {
                prop_assert!(recs.contains(g));
            }
        }
        let _ = index_tfrecord_with(&path, OnCorrupt::EndFile);
        if let Ok(offsets) = index_tfrecord(&path) {
            let file = TfRecordFile::open(&path).expect("open");
            for (i, &o) in offsets.iter().enumerate() {
                let _ = file.read(i as u64, o);
            }
        }
    }
}

// ---- text lines ----

fn lines_of(path: &Path, compression: Compression) -> Vec<Vec<u8>> {
    LineReader::open(path, config(compression, OnCorrupt::Fail))
        .expect("open")
        .collect::<Result<Vec<_>, _>>()
        .expect("read")
}

/// Inputs and the lines TensorFlow 2.18.1's `tf.data.TextLineDataset` yields for them (the
/// same with compression_type "", "ZLIB" and "GZIP"), from running
/// `[x.numpy() for x in tf.data.TextLineDataset(path, compression_type=c)]` in the venv at
/// ~/.cache/lode/tf-2.18.1. The finding: TensorFlow drops every `\r`, not only one before
/// `\n` ("a\rb\n" gives "ab"), and a final piece made only of `\r`s is no line.
const TF_LINES: &[(&[u8], &[&[u8]])] = &[
    (b"a\r\nb\r\nc", &[b"a", b"b", b"c"]),
    (b"a\nb\r", &[b"a", b"b"]),
    (b"a\rb\nc\r\r\n", &[b"ab", b"c"]),
    (b"\r", &[]),
    (b"", &[]),
    (b"\n", &[b""]),
    (b"\n\n", &[b"", b""]),
    (b"a\nb\n", &[b"a", b"b"]),
    (b"x\r\r", &[b"x"]),
    (b"x\r\n", &[b"x"]),
    (b"a\n\r", &[b"a"]),
    (b"a\n\r\n", &[b"a", b""]),
    (b"\r\n\r\nz", &[b"", b"", b"z"]),
];

#[test]
fn lines_split_as_tensorflows_text_line_dataset() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, (input, want)) in TF_LINES.iter().enumerate() {
        let want: Vec<Vec<u8>> = want.iter().map(|l| l.to_vec()).collect();
        for (compression, bytes) in [
            (Compression::None, input.to_vec()),
            (Compression::Zlib, zlib(input)),
            (Compression::Gzip, gzip(input)),
        ] {
            let path = write(dir.path(), &format!("l{i}"), &bytes);
            assert_eq!(
                lines_of(&path, compression),
                want,
                "{input:?} {compression:?}"
            );
        }
        let path = write(dir.path(), &format!("l{i}"), input);
        let offsets = index_lines(&path).expect("index");
        let file = LineFile::open(&path).expect("open");
        let by_index: Vec<Vec<u8>> = offsets
            .iter()
            .enumerate()
            .map(|(n, &o)| file.read(n as u64, o).expect("read"))
            .collect();
        assert_eq!(by_index, want, "indexed {input:?}");
    }
}

#[test]
fn line_errors_name_the_file_and_are_skippable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gz = gzip(b"one\ntwo\nthree\n".repeat(1000).as_slice());
    let path = write(dir.path(), "cut", &gz[..gz.len() / 2]);
    let result: Result<Vec<_>, _> =
        LineReader::open(&path, config(Compression::Gzip, OnCorrupt::Fail))
            .expect("open")
            .collect();
    let err = result.expect_err("cut gzip");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    let mut reader =
        LineReader::open(&path, config(Compression::Gzip, OnCorrupt::EndFile)).expect("open");
    let n = reader.by_ref().filter(Result::is_ok).count() as u64;
    assert!(n > 0);
    assert_eq!((reader.stats().records, reader.stats().corrupt), (n, 1));

    let plain = write(dir.path(), "p", b"a\nb");
    let file = LineFile::open(&plain).expect("open");
    assert!(matches!(
        file.read(5, 3),
        Err(Error::NoLineAt { offset: 3, .. })
    ));
}

#[test]
fn long_lines_are_read_whole_by_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let long = vec![b'x'; 100_000];
    let bytes = [&b"short\r\n"[..], &long, b"\n", b"tail"].concat();
    let path = write(dir.path(), "long", &bytes);
    let offsets = index_lines(&path).expect("index");
    assert_eq!(offsets, [0, 7, 100_008]);
    let file = LineFile::open(&path).expect("open");
    assert_eq!(file.read(1, 7).expect("read"), long);
    assert_eq!(file.read(2, 100_008).expect("read"), b"tail");
    assert_eq!(lines_of(&path, Compression::None).len(), 3);
}

proptest! {
    #[test]
    fn line_index_agrees_with_streaming(
        bytes in proptest::collection::vec(prop::sample::select(vec![b'a', b'\r', b'\n', 0xff]), 0..200),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(dir.path(), "t", &bytes);
        let streamed = lines_of(&path, Compression::None);
        let offsets = index_lines(&path).expect("index");
        let file = LineFile::open(&path).expect("open");
        let indexed: Vec<Vec<u8>> = offsets
            .iter()
            .enumerate()
            .map(|(n, &o)| file.read(n as u64, o).expect("read"))
            .collect();
        prop_assert_eq!(&indexed, &streamed);
        // The same split, written plainly: split on \n, drop \r, drop an empty last piece.
        let mut want: Vec<Vec<u8>> = bytes
            .split(|&b| b == b'\n')
            .map(|l| l.iter().copied().filter(|&b| b != b'\r').collect())
            .collect();
        if want.last().is_some_and(Vec::is_empty) {
            want.pop();
        }
        prop_assert_eq!(streamed, want);
    }
}

proptest! {
    /// A span read returns what record-by-record reads return, for any run of records,
    /// with one corrupt record in the file failing alone.
    #[test]
    fn span_reads_equal_single_reads(
        payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..12),
        corrupt in any::<prop::sample::Index>(),
        from in any::<prop::sample::Index>(),
        count in 1usize..12,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bytes = Vec::new();
        for p in &payloads {
            encode_record(p, &mut bytes);
        }
        let path = write(dir.path(), "span.tfrecord", &bytes);
        let offsets = index_tfrecord(&path).expect("index");
        // Break the data CRC of one non-empty record.
        let bad = corrupt.index(payloads.len());
        if !payloads[bad].is_empty() {
            let at = usize::try_from(offsets[bad]).expect("small") + 12;
            bytes[at] ^= 0x01;
            std::fs::write(&path, &bytes).expect("rewrite");
        }
        let file = TfRecordFile::open(&path).expect("open");
        let first = from.index(payloads.len());
        let last = (first + count).min(payloads.len());
        let span = file.read_span(first as u64, &offsets[first..last], offsets.get(last).copied());
        for (k, got) in span.into_iter().enumerate() {
            let r = first + k;
            let single = file.read(r as u64, offsets[r]);
            prop_assert_eq!(got.as_ref().ok(), single.as_ref().ok(), "record {}", r);
            prop_assert_eq!(got.is_err(), single.is_err());
        }

        let mut text = Vec::new();
        for p in &payloads {
            text.extend(p.iter().map(|&b| if b == b'\n' { b'x' } else { b }));
            text.extend_from_slice(b"\r\n");
        }
        let path = write(dir.path(), "span.txt", &text);
        let offsets = index_lines(&path).expect("index");
        let file = LineFile::open(&path).expect("open");
        let last = (first + count).min(offsets.len());
        let span = file
            .read_span(first as u64, &offsets[first..last], offsets.get(last).copied())
            .expect("span");
        for (k, got) in span.into_iter().enumerate() {
            let r = first + k;
            prop_assert_eq!(got, file.read(r as u64, offsets[r]).expect("line"));
        }
    }
}

/// A real TFRecord file (a fixture TensorFlow wrote) cut at every record boundary and at a
/// few hundred offsets between: a cut between records reads the records before it; any other
/// cut is an error naming the file, the record and its offset, both streaming and indexing
/// (TensorFlow's reader reports "truncated record at N" for a cut in data or footer; in a
/// header it ends silently, where Lode is stricter).
#[test]
fn a_fixture_cut_anywhere_but_a_record_boundary_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/adam_resource/data/train.tfrecord");
    let whole = std::fs::read(&fixture).expect("fixture");
    let boundaries = index_tfrecord(&fixture).expect("index");
    let step = whole.len() / 300;
    let mut cuts: Vec<usize> = (1..whole.len()).step_by(step).collect();
    for &b in &boundaries {
        let b = usize::try_from(b).expect("small");
        cuts.extend([b.saturating_sub(1), b, b + 1]);
    }
    cuts.retain(|&c| c > 0 && c < whole.len());
    cuts.sort_unstable();
    cuts.dedup();
    assert!(cuts.len() > 300, "{}", cuts.len());
    for cut in cuts {
        let path = write(dir.path(), "cut.tfrecord", &whole[..cut]);
        let before = boundaries.iter().filter(|&&b| b < cut as u64).count();
        let (got, err, _) = read_all(&path, config(Compression::None, OnCorrupt::Fail));
        let indexed = index_tfrecord(&path);
        if boundaries.contains(&(cut as u64)) {
            assert!(err.is_none(), "cut at {cut}: {err:?}");
            assert_eq!(got.len(), before, "cut at {cut}");
            assert_eq!(indexed.expect("index").len(), before);
        } else {
            let record = before - 1;
            let offset = boundaries[record];
            for e in [err.expect("refused"), indexed.expect_err("refused")] {
                assert!(
                    matches!(&e, Error::TruncatedRecord { record: r, offset: o, .. } if *r == record as u64 && *o == offset),
                    "cut at {cut}: {e:?}"
                );
                assert!(e.to_string().contains("cut.tfrecord"), "{e}");
            }
            assert_eq!(got.len(), record, "cut at {cut}");
        }
    }
}
