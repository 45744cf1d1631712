//! Tests of the step codec: round trips, the frame layout, one test per decoding error, the
//! automatic compression rule, and property tests on random tensors and hostile bytes.

use proptest::prelude::*;

use super::*;
use crate::TensorPool;

fn tensor(shape: Vec<usize>, data: TensorData) -> Tensor {
    Tensor::new(shape, data).expect("valid tensor")
}

fn message(tensors: Vec<Tensor>) -> StepMessage {
    StepMessage {
        job: 7,
        stage: 2,
        step: 1_000_001,
        epoch: 3,
        records: Vec::new(),
        tensors,
    }
}

fn encoder(compression: Compression) -> StepEncoder {
    StepEncoder::new(CodecConfig {
        compression,
        ..CodecConfig::default()
    })
}

fn roundtrip(msg: &StepMessage, compression: Compression) -> StepMessage {
    let frame = encoder(compression).encode(msg).expect("encodes");
    decode_frame(&frame, DEFAULT_MAX_MESSAGE_BYTES).expect("decodes")
}

/// One tensor of every dtype with the values that are easy to lose: NaN payloads, signed
/// zeros, infinities, subnormals, extremes, empty and non-UTF-8 strings.
fn every_dtype() -> Vec<Tensor> {
    vec![
        tensor(vec![3], TensorData::Bool(vec![true, false, true])),
        tensor(vec![4], TensorData::Int8(vec![i8::MIN, -1, 0, i8::MAX])),
        tensor(
            vec![2, 2],
            TensorData::Int16(vec![i16::MIN, -2, 3, i16::MAX]),
        ),
        tensor(vec![3], TensorData::Int32(vec![i32::MIN, 0, i32::MAX])),
        tensor(vec![3], TensorData::Int64(vec![i64::MIN, -1, i64::MAX])),
        tensor(vec![3], TensorData::UInt8(vec![0, 128, 255])),
        tensor(vec![2], TensorData::UInt16(vec![0, u16::MAX])),
        tensor(vec![2], TensorData::UInt32(vec![1, u32::MAX])),
        tensor(vec![2], TensorData::UInt64(vec![0, u64::MAX])),
        // 0x7e01: a half NaN with a payload; 0x8000: -0.0.
        tensor(vec![3], TensorData::Float16(vec![0x7e01, 0x8000, 0x3c00])),
        tensor(vec![3], TensorData::BFloat16(vec![0x7fc1, 0x8000, 0xff80])),
        tensor(
            vec![7],
            TensorData::Float32(vec![
                f32::from_bits(0x7fc0_0001),
                f32::from_bits(0xff80_0001), // signalling NaN, negative
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::from_bits(1), // smallest subnormal
                f32::MAX,
            ]),
        ),
        tensor(
            vec![4],
            TensorData::Float64(vec![
                f64::from_bits(0x7ff8_0000_dead_beef),
                -0.0,
                f64::from_bits(1),
                f64::MIN,
            ]),
        ),
        tensor(
            vec![2, 2],
            TensorData::String(vec![
                Vec::new(),
                b"plain".to_vec(),
                vec![0xff, 0xfe, 0x00, 0x80],
                "ünïcødé".as_bytes().to_vec(),
            ]),
        ),
    ]
}

#[test]
fn every_dtype_round_trips_bit_exactly_in_every_mode() {
    let msg = message(every_dtype());
    for compression in [Compression::Off, Compression::Lz4, Compression::Auto] {
        let back = roundtrip(&msg, compression);
        assert!(back.bitwise_eq(&msg), "{compression}: {back:?}");
    }
}

#[test]
fn empty_tensors_scalars_and_empty_messages_round_trip() {
    let mut tensors = Vec::new();
    for dtype in DType::ALL {
        tensors.push(Tensor::zeros(dtype, vec![0]).expect("empty"));
        tensors.push(Tensor::zeros(dtype, vec![3, 0, 2]).expect("empty"));
        tensors.push(Tensor::zeros(dtype, vec![]).expect("scalar"));
    }
    let msg = message(tensors);
    assert!(roundtrip(&msg, Compression::Off).bitwise_eq(&msg));
    assert!(roundtrip(&msg, Compression::Lz4).bitwise_eq(&msg));
    let empty = message(Vec::new());
    assert!(roundtrip(&empty, Compression::Lz4).bitwise_eq(&empty));
}

#[test]
fn header_layout_is_as_documented() {
    let msg = message(every_dtype());
    let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
    assert_eq!(&frame[..4], b"LODE");
    assert_eq!(frame[4], FORMAT_VERSION);
    assert_eq!(frame[5], 0);
    let header = FrameHeader::parse(&frame, DEFAULT_MAX_MESSAGE_BYTES).expect("header");
    assert_eq!(header.payload_len, len_u64(frame.len() - HEADER_LEN));
    let mut summed = frame[..14].to_vec();
    summed.extend_from_slice(&frame[HEADER_LEN..]);
    assert_eq!(header.checksum, xxhash_rust::xxh3::xxh3_64(&summed));
    assert_eq!(&frame[14..22], &header.checksum.to_le_bytes());
    // The payload starts with the bincode varints of job, stage and step (252: a u32 follows).
    assert_eq!(&frame[HEADER_LEN..HEADER_LEN + 2], &[7, 2]);
    assert_eq!(frame[HEADER_LEN + 2], 252);
}

#[test]
fn numbers_are_little_endian_blocks() {
    let msg = message(vec![tensor(vec![2], TensorData::Float32(vec![1.0, -2.5]))]);
    let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
    let mut expected = Vec::new();
    expected.extend_from_slice(&1.0f32.to_le_bytes());
    expected.extend_from_slice(&(-2.5f32).to_le_bytes());
    assert!(frame.ends_with(&expected));
}

#[test]
fn large_compressible_tensors_compress_and_round_trip() {
    let zeros = tensor(vec![1 << 20], TensorData::Float32(vec![0.0; 1 << 20]));
    let msg = message(vec![zeros]);
    let mut enc = encoder(Compression::Lz4);
    let frame = enc.encode(&msg).expect("encodes");
    assert_eq!(frame[5], 1, "stored as LZ4");
    assert!(frame.len() < (4 << 20) / 200, "{} bytes", frame.len());
    // Nearly the format's maximum ratio: the plausibility check must let it through.
    let back = decode_frame(&frame, DEFAULT_MAX_MESSAGE_BYTES).expect("decodes");
    assert!(back.bitwise_eq(&msg));
}

#[test]
fn lz4_mode_sends_incompressible_payloads_raw() {
    let msg = message(vec![noise(4096)]);
    let mut out = Vec::new();
    let stored = encoder(Compression::Lz4)
        .encode_into(&msg, &mut out)
        .expect("encodes");
    assert_eq!(stored, FrameCompression::None);
    assert_eq!(out[5], 0);
    assert!(decode_frame(&out, DEFAULT_MAX_MESSAGE_BYTES)
        .expect("decodes")
        .bitwise_eq(&msg));
}

/// Bytes from a xorshift generator: LZ4 cannot shrink them.
fn noise(n: usize) -> Tensor {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let bytes = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect();
    tensor(vec![n], TensorData::UInt8(bytes))
}

fn compressible() -> Tensor {
    tensor(vec![4096], TensorData::Int64(vec![5; 4096]))
}

#[test]
fn auto_chooses_after_the_probe_and_rechecks_every_window() {
    let mut enc = encoder(Compression::Auto);
    let zeros = message(vec![compressible()]);
    let random = message(vec![noise(4096)]);
    for _ in 0..AUTO_PROBE_MESSAGES - 1 {
        enc.encode(&zeros).expect("encodes");
        assert_eq!(enc.chosen(), None, "still probing");
    }
    enc.encode(&zeros).expect("encodes");
    assert_eq!(enc.chosen(), Some(FrameCompression::Lz4));
    let probe = enc.last_probe().expect("probed");
    assert_eq!(probe.messages, AUTO_PROBE_MESSAGES);
    assert!(probe.lz4_bytes * 10 < probe.raw_bytes);
    // Incompressible data after the choice is compressed (and sent raw) until the next window.
    for _ in AUTO_PROBE_MESSAGES..AUTO_RECHECK_INTERVAL {
        enc.encode(&random).expect("encodes");
        assert_eq!(enc.chosen(), Some(FrameCompression::Lz4));
    }
    for _ in 0..AUTO_PROBE_MESSAGES {
        enc.encode(&random).expect("encodes");
    }
    assert_eq!(enc.chosen(), Some(FrameCompression::None));
    let frame = enc.encode(&zeros).expect("encodes");
    assert_eq!(frame[5], 0, "not compressed outside a probe once off");
}

#[test]
fn auto_sends_raw_to_a_local_receiver_and_other_settings_stay() {
    let zeros = message(vec![compressible()]);
    let mut auto = encoder(Compression::Auto);
    let local = auto
        .encode_parts_for(&zeros, true)
        .expect("encodes")
        .to_vec();
    assert_eq!(
        local[5], UNSUMMED_FLAG,
        "raw (and unsummed) to a local receiver, even while probing"
    );
    assert!(
        stream_decode_from(&local, DEFAULT_MAX_MESSAGE_BYTES, 1 << 20, None)
            .expect("streams")
            .expect("decodes")
            .bitwise_eq(&zeros)
    );
    let remote = auto
        .encode_parts_for(&zeros, false)
        .expect("encodes")
        .to_vec();
    assert_eq!(
        remote[5],
        FrameCompression::Lz4.flag(),
        "a remote one gets the probe"
    );
    let mut lz4 = encoder(Compression::Lz4);
    let frame = lz4
        .encode_parts_for(&zeros, true)
        .expect("encodes")
        .to_vec();
    assert_eq!(frame[5], FrameCompression::Lz4.flag(), "lz4 stays lz4");
}

#[test]
fn auto_needs_a_ten_percent_saving() {
    // Half compressible, half noise saves about half: LZ4. Mostly noise saves under 10%: off.
    let mut enc = encoder(Compression::Auto);
    let half = message(vec![
        noise(4096),
        tensor(vec![512], TensorData::Int64(vec![0; 512])),
    ]);
    for _ in 0..AUTO_PROBE_MESSAGES {
        enc.encode(&half).expect("encodes");
    }
    assert_eq!(enc.chosen(), Some(FrameCompression::Lz4));
    let mut enc = encoder(Compression::Auto);
    let mostly_noise = message(vec![
        noise(4096),
        tensor(vec![40], TensorData::Int64(vec![0; 40])),
    ]);
    for _ in 0..AUTO_PROBE_MESSAGES {
        enc.encode(&mostly_noise).expect("encodes");
    }
    assert_eq!(enc.chosen(), Some(FrameCompression::None));
    let probe = enc.last_probe().expect("probed");
    assert!(probe.lz4_bytes * 100 > probe.raw_bytes * 90, "{probe:?}");
}

#[test]
fn fixed_modes_report_their_choice() {
    assert_eq!(
        encoder(Compression::Off).chosen(),
        Some(FrameCompression::None)
    );
    assert_eq!(
        encoder(Compression::Lz4).chosen(),
        Some(FrameCompression::Lz4)
    );
    assert_eq!("lz4".parse::<Compression>(), Ok(Compression::Lz4));
    assert!("zstd".parse::<Compression>().is_err());
}

/// The payload as bincode 2 itself writes it, field by field: the reference the hand-written
/// encoder must match byte for byte.
fn bincode_payload(msg: &StepMessage) -> Vec<u8> {
    fn put<T: bincode::Encode>(out: &mut Vec<u8>, v: T) {
        bincode::encode_into_std_write(v, out, WIRE).expect("vec write");
    }
    let mut out = Vec::new();
    put(&mut out, msg.job);
    put(&mut out, msg.stage);
    put(&mut out, msg.step);
    put(&mut out, msg.epoch);
    put(&mut out, msg.records.len() as u64);
    for &r in &msg.records {
        put(&mut out, r);
    }
    put(&mut out, msg.tensors.len() as u64);
    for t in &msg.tensors {
        put(&mut out, dtype_tag(t.dtype()));
        put(&mut out, t.shape().len() as u64);
        for &d in t.shape() {
            put(&mut out, d as u64);
        }
        put(&mut out, t.num_elements() as u64);
        match t.data() {
            TensorData::String(v) => {
                for s in v {
                    put(&mut out, s.len() as u64);
                    out.extend_from_slice(s);
                }
            }
            data => out.extend_from_slice(wire_bytes(data).expect("little-endian")),
        }
    }
    out
}

#[test]
fn varints_are_bincodes_at_every_width_boundary() {
    for v in [
        0,
        1,
        250,
        251,
        252,
        u64::from(u16::MAX),
        u64::from(u16::MAX) + 1,
        u64::from(u32::MAX),
        u64::from(u32::MAX) + 1,
        u64::MAX,
    ] {
        let mut ours = Vec::new();
        put_varint(&mut ours, v);
        let mut theirs = Vec::new();
        varint(v, &mut theirs);
        assert_eq!(ours, theirs, "varint of {v}");
        if let Ok(small) = u32::try_from(v) {
            let mut as_u32 = Vec::new();
            bincode::encode_into_std_write(small, &mut as_u32, WIRE).expect("vec write");
            assert_eq!(ours, as_u32, "a u32 field of {small}");
        }
    }
}

#[test]
fn varints_read_by_hand_at_every_width_boundary() {
    for v in [
        0,
        250,
        251,
        0xffff,
        0x1_0000,
        0xffff_ffff,
        0x1_0000_0000,
        u64::MAX,
    ] {
        let mut bytes = Vec::new();
        put_varint(&mut bytes, v);
        let used = bytes.len();
        bytes.extend_from_slice(&[9; 9]);
        assert_eq!(get_varint(&bytes), Some((v, used)), "varint of {v}");
        // Cut short: left to bincode.
        assert_eq!(get_varint(&bytes[..used - 1]), None, "{v} cut short");
    }
    // A u128's marker and the invalid byte: left to bincode, which refuses them for a u64.
    for first in [254u8, 255] {
        let mut bytes = vec![first];
        bytes.extend_from_slice(&[0; 16]);
        assert_eq!(get_varint(&bytes), None);
        assert!(bincode::decode_from_slice::<u64, _>(&bytes, WIRE).is_err());
    }
}

proptest! {
    /// Where the hand reader gives a value, bincode gives the same value from the same bytes.
    #[test]
    fn prop_varints_read_by_hand_are_bincodes(
        bytes in proptest::collection::vec(any::<u8>(), 0..12),
        marker in 249u8..=255,
    ) {
        let mut with_marker = vec![marker];
        with_marker.extend_from_slice(&bytes);
        for input in [&bytes[..], &with_marker[..]] {
            if let Some((v, used)) = get_varint(input) {
                let theirs = bincode::decode_from_slice::<u64, _>(input, WIRE);
                prop_assert_eq!(theirs.ok(), Some((v, used)));
            }
        }
    }
}

#[test]
fn strings_of_every_short_length_are_bincodes() {
    // Lengths 0 to 250 take the short strings' path (one length byte each, every copy size
    // around the fixed-size moves); with one of 251 the tensor takes the general path.
    let short: Vec<Vec<u8>> = (0..=250u8).map(|n| (0..n).collect()).collect();
    let mut long = short.clone();
    long.push(vec![7; 251]);
    for values in [short, long] {
        let n = values.len();
        let msg = message(vec![tensor(vec![n], TensorData::String(values))]);
        let reference = bincode_payload(&msg);
        let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
        assert_eq!(&frame[HEADER_LEN..], &reference[..]);
        let parts = encoder(Compression::Off)
            .encode_parts(&msg)
            .expect("encodes")
            .to_vec();
        assert_eq!(&parts[HEADER_LEN..], &reference[..]);
        let back = decode_frame(&parts, DEFAULT_MAX_MESSAGE_BYTES).expect("decodes");
        assert!(back.bitwise_eq(&msg));
    }
}

#[test]
fn the_payload_is_bincodes_with_long_strings_and_wide_integers() {
    let long = |n: usize| (0..251u8).cycle().take(n).collect::<Vec<u8>>();
    let mut msg = message(vec![
        tensor(
            vec![4],
            TensorData::String(vec![long(250), long(251), long(70_000), Vec::new()]),
        ),
        tensor(vec![3], TensorData::Int64(vec![i64::MIN, -1, i64::MAX])),
        tensor(vec![2, 0], TensorData::Float32(Vec::new())),
        tensor(vec![1024], TensorData::Int32((0..1024).collect())),
    ]);
    msg.job = u64::MAX;
    msg.stage = u32::MAX;
    msg.step = u64::from(u32::MAX) + 1;
    msg.epoch = 251;
    msg.records = vec![0, 250, 65_536, u64::MAX];
    let reference = bincode_payload(&msg);
    let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
    assert_eq!(&frame[HEADER_LEN..], &reference[..]);
    let parts = encoder(Compression::Off)
        .encode_parts(&msg)
        .expect("encodes");
    assert_eq!(&parts.to_vec()[HEADER_LEN..], &reference[..]);
    // The 4 KiB Int32 block (the last tensor) is borrowed, the rest copied: two pieces.
    let pieces: Vec<&[u8]> = parts.slices().collect();
    assert_eq!(pieces.len(), 2);
    assert_eq!(pieces[1].len(), 4096);
}

// --- Building hostile frames -------------------------------------------------------------

fn varint(v: u64, out: &mut Vec<u8>) {
    bincode::encode_into_std_write(v, out, WIRE).expect("vec write");
}

/// A well-formed frame (magic, version, valid checksum) around any payload bytes.
fn frame_of(payload: &[u8], compression: FrameCompression, declared: u64) -> Vec<u8> {
    let mut out = vec![0; HEADER_LEN];
    out.extend_from_slice(payload);
    write_header(&mut out, compression, declared);
    out
}

fn raw_frame(payload: &[u8]) -> Vec<u8> {
    frame_of(payload, FrameCompression::None, len_u64(payload.len()))
}

/// A payload header (job, stage, step, epoch, no records, tensor count) followed by `rest`.
fn payload(tensors: u64, rest: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    for v in [7, 2, 1, 0, 0, tensors] {
        varint(v, &mut p);
    }
    p.extend_from_slice(rest);
    p
}

/// A tensor's header: tag, shape, value count.
fn tensor_header(tag: u8, dims: &[u64], count: u64) -> Vec<u8> {
    let mut p = vec![tag];
    varint(len_u64(dims.len()), &mut p);
    for &d in dims {
        varint(d, &mut p);
    }
    varint(count, &mut p);
    p
}

fn decode_err(frame: &[u8]) -> TransferError {
    decode_frame(frame, DEFAULT_MAX_MESSAGE_BYTES).expect_err("refused")
}

fn valid_frame() -> Vec<u8> {
    encoder(Compression::Off)
        .encode(&message(every_dtype()))
        .expect("encodes")
}

#[test]
fn bad_magic() {
    let mut frame = valid_frame();
    frame[0] = b'X';
    assert!(matches!(decode_err(&frame), TransferError::BadMagic { .. }));
    assert!(matches!(decode_err(b"PK"), TransferError::BadMagic { .. }));
    assert!(matches!(
        decode_err(b"LO"),
        TransferError::Truncated {
            needed: 22,
            actual: 2
        }
    ));
    assert!(matches!(decode_err(b""), TransferError::Truncated { .. }));
}

#[test]
fn unknown_version_and_compression_flag() {
    // Version 1 (a CRC32C in bytes 14..18) is no longer read, nor any later one.
    for version in [1, 3] {
        let mut frame = valid_frame();
        frame[4] = version;
        assert!(matches!(
            decode_err(&frame),
            TransferError::UnsupportedVersion { version: v, supported: 2 } if v == version
        ));
    }
    let mut frame = valid_frame();
    frame[5] = 9;
    assert!(matches!(
        decode_err(&frame),
        TransferError::UnknownCompression { flag: 9 }
    ));
}

#[test]
fn truncated_and_overlong_frames() {
    let frame = valid_frame();
    assert!(matches!(
        decode_err(&frame[..10]),
        TransferError::Truncated { needed: 22, .. }
    ));
    assert!(matches!(
        decode_err(&frame[..frame.len() - 1]),
        TransferError::Truncated { .. }
    ));
    let mut long = frame.clone();
    long.push(0);
    assert!(matches!(
        decode_err(&long),
        TransferError::TrailingBytes { extra: 1, .. }
    ));
}

#[test]
fn declared_length_over_the_limit_is_refused_before_allocating() {
    let frame = valid_frame();
    let err = decode_frame(&frame, 16).expect_err("over the limit");
    assert!(matches!(
        err,
        TransferError::DeclaredTooLarge { limit: 16, .. }
    ));
    let huge = frame_of(b"", FrameCompression::Lz4, u64::MAX);
    assert!(matches!(
        decode_err(&huge),
        TransferError::DeclaredTooLarge {
            declared: u64::MAX,
            ..
        }
    ));
    // Within the limit but far beyond what 10 LZ4 bytes can expand to.
    let claim = frame_of(&[0; 10], FrameCompression::Lz4, 100 << 20);
    assert!(matches!(
        decode_err(&claim),
        TransferError::ImplausibleRatio { compressed: 10, .. }
    ));
}

#[test]
fn damaged_bytes_fail_the_checksum() {
    let mut frame = valid_frame();
    let last = frame.len() - 1;
    frame[last] ^= 0x10;
    assert!(matches!(
        decode_err(&frame),
        TransferError::ChecksumMismatch { .. }
    ));
}

#[test]
fn lz4_payloads_that_do_not_decompress() {
    // A token promising 15+ literals that are not there.
    let garbage = frame_of(&[0xf0, 0xff, 0xff, 1, 2], FrameCompression::Lz4, 300);
    assert!(matches!(
        decode_err(&garbage),
        TransferError::Decompress { compressed: 5, .. }
    ));
    let payload = payload(0, &[]);
    let compressed = lz4_flex::block::compress(&payload);
    let longer = frame_of(
        &compressed,
        FrameCompression::Lz4,
        len_u64(payload.len() + 1),
    );
    assert!(matches!(
        decode_err(&longer),
        TransferError::DecompressedLength { .. }
    ));
    let shorter = frame_of(
        &compressed,
        FrameCompression::Lz4,
        len_u64(payload.len() - 1),
    );
    assert!(matches!(
        decode_err(&shorter),
        TransferError::Decompress { .. }
    ));
}

#[test]
fn payloads_that_do_not_decode() {
    // Ends inside a tensor.
    let p = payload(1, &tensor_header(11, &[4], 4));
    assert!(matches!(
        decode_err(&raw_frame(&p)),
        TransferError::Decode { .. }
    ));
    // A varint marker byte of 255 is not a valid u64 encoding.
    let p = payload(0, &[]);
    let mut bad = p[..4].to_vec();
    bad.push(255);
    assert!(matches!(
        decode_err(&raw_frame(&bad)),
        TransferError::Decode { .. }
    ));
    // Bytes after the last tensor.
    let mut p = payload(0, &[]);
    p.push(0);
    assert!(matches!(
        decode_err(&raw_frame(&p)),
        TransferError::TrailingBytes { extra: 1, .. }
    ));
}

#[test]
fn unknown_dtype() {
    let mut t = tensor_header(42, &[1], 1);
    t.push(0);
    let p = payload(1, &t);
    assert!(matches!(
        decode_err(&raw_frame(&p)),
        TransferError::UnknownDtype { tensor: 0, tag: 42 }
    ));
}

#[test]
fn value_count_must_match_the_shape() {
    let mut t = tensor_header(dtype_tag(DType::Int32), &[2, 3], 5);
    t.extend_from_slice(&[0; 20]);
    let p = payload(1, &t);
    match decode_err(&raw_frame(&p)) {
        TransferError::ValueCountMismatch {
            tensor: 0,
            shape,
            expected: 6,
            actual: 5,
        } => assert_eq!(shape, vec![2, 3]),
        other => panic!("{other:?}"),
    }
    // An overflowing shape product is a mismatch, not an overflow.
    let t = tensor_header(1, &[u64::MAX, u64::MAX, u64::MAX], 0);
    assert!(matches!(
        decode_err(&raw_frame(&payload(1, &t))),
        TransferError::ValueCountMismatch { .. }
    ));
}

#[test]
fn bools_must_be_zero_or_one() {
    let mut t = tensor_header(dtype_tag(DType::Bool), &[3], 3);
    t.extend_from_slice(&[1, 0, 2]);
    assert!(matches!(
        decode_err(&raw_frame(&payload(1, &t))),
        TransferError::InvalidBool {
            tensor: 0,
            index: 2,
            value: 2
        }
    ));
}

#[test]
fn huge_declared_counts_cost_nothing() {
    // Counts of tensors, dimensions, values and strings far beyond the payload: each fails as
    // soon as the bytes run out (or the memory budget does), without reserving for the count.
    let cases = [
        payload(u64::MAX, &[]),
        payload(1, &tensor_header(13, &[1 << 60], 1 << 60)),
        payload(1, &tensor_header(12, &[1 << 40], 1 << 40)),
        payload(1, &{
            let mut t = vec![11];
            varint(1 << 62, &mut t);
            t
        }),
    ];
    for p in cases {
        let err = decode_err(&raw_frame(&p));
        assert!(
            matches!(
                err,
                TransferError::Decode { .. } | TransferError::DecodedTooLarge { .. }
            ),
            "{err:?}"
        );
    }
}

#[test]
fn a_frames_sizes_are_the_documented_memory_and_a_bound_of_its_payload() {
    let strings = tensor(
        vec![3],
        TensorData::String(vec![b"ab".to_vec(), Vec::new(), vec![7; 300]]),
    );
    let small = tensor(vec![2, 2], TensorData::Int64(vec![1, -2, 3, -4]));
    let large = tensor(vec![1024], TensorData::Float32(vec![0.5; 1024]));
    let mut msg = message(vec![strings, small, large]);
    msg.records = vec![3, 1 << 40, 0];
    // 8 per record; per tensor 64 plus 8 per dimension; 24 per string plus its bytes.
    let expected = 8 * msg.records.len() as u64
        + (64 + 8)
        + 3 * 24
        + 302
        + (64 + 16)
        + 4 * 8
        + (64 + 8)
        + 1024 * 4;
    assert_eq!(decoded_size(&msg), expected);
    assert_eq!(sizes(&msg, usize::MAX).0, expected);
    // The reserve covers the payload, and leaves out only the values a frame borrows.
    let mut whole = Vec::new();
    // The encoder counts the same size as it writes.
    assert_eq!(write_payload(&msg, &mut whole), expected);
    let all = size_hint(&msg, usize::MAX);
    assert!(all >= whole.len(), "{all} < {}", whole.len());
    let borrowing = size_hint(&msg, BORROW_MIN_BYTES);
    assert_eq!(all - borrowing, 1024 * 4);
    assert_eq!(sizes(&msg, BORROW_MIN_BYTES), (expected, borrowing));
}

#[test]
fn decoded_memory_is_bounded_like_the_encoder_bounds_it() {
    // 2,000 empty strings: a payload of about 2 KB, but 48 KB of Vec<u8>s in memory.
    let strings = tensor(vec![2000], TensorData::String(vec![Vec::new(); 2000]));
    let msg = message(vec![strings]);
    let need = decoded_size(&msg);
    assert!(need > 48_000);
    let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
    assert!(frame.len() < 2_100);
    let err = decode_frame(&frame, 10_000).expect_err("over the memory limit");
    assert!(matches!(
        err,
        TransferError::DecodedTooLarge { limit: 10_000, .. }
    ));
    // An encoder with the same limit refuses the message up front.
    let mut small = StepEncoder::new(CodecConfig {
        compression: Compression::Off,
        max_message_bytes: 10_000,
    });
    assert!(matches!(
        small.encode(&msg),
        Err(TransferError::MessageTooLarge {
            bytes,
            limit: 10_000
        }) if bytes == need
    ));
    // And so does a frame in parts (which counts the size as it writes the frame).
    assert!(matches!(
        small.encode_parts_for(&msg, true),
        Err(TransferError::MessageTooLarge {
            bytes,
            limit: 10_000
        }) if bytes == need
    ));
    // At exactly the decoded size both sides agree.
    let mut exact = StepEncoder::new(CodecConfig {
        compression: Compression::Lz4,
        max_message_bytes: need,
    });
    let frame = exact.encode(&msg).expect("fits exactly");
    assert!(decode_frame(&frame, need)
        .expect("decodes")
        .bitwise_eq(&msg));
}

#[test]
fn errors_about_frames_are_told_apart_from_local_ones() {
    assert!(decode_err(b"nope").is_bad_frame());
    assert!(!TransferError::ZeroCapacity.is_bad_frame());
    assert!(!TransferError::MessageTooLarge { bytes: 2, limit: 1 }.is_bad_frame());
}

// --- Properties ---------------------------------------------------------------------------

fn tensor_strategy() -> impl Strategy<Value = Tensor> {
    lode_runtime::tensor::strategies::tensor_strategy(5)
}

fn message_strategy() -> impl Strategy<Value = StepMessage> {
    (
        any::<u64>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        proptest::collection::vec(any::<u64>(), 0..40),
        proptest::collection::vec(tensor_strategy(), 0..6),
    )
        .prop_map(|(job, stage, step, epoch, records, tensors)| StepMessage {
            job,
            stage,
            step,
            epoch,
            records,
            tensors,
        })
}

fn compression_strategy() -> impl Strategy<Value = Compression> {
    proptest::sample::select(vec![Compression::Off, Compression::Lz4, Compression::Auto])
}

proptest! {
    #[test]
    fn prop_random_messages_round_trip(
        msg in message_strategy(),
        compression in compression_strategy(),
    ) {
        let mut enc = encoder(compression);
        let mut dec = StepDecoder::default();
        // Twice through the same encoder and decoder: reused buffers must not leak state.
        for _ in 0..2 {
            let frame = enc.encode(&msg).expect("encodes");
            let back = dec.decode(&frame).expect("decodes");
            prop_assert!(back.bitwise_eq(&msg), "{:?} != {:?}", back, msg);
        }
    }

    /// A frame in parts is byte for byte the contiguous frame, whatever the compression
    /// setting (two encoders in step, so that automatic compression probes alike).
    #[test]
    fn prop_frames_in_parts_are_the_same_bytes(
        msg in message_strategy(),
        compression in compression_strategy(),
    ) {
        let mut whole = encoder(compression);
        let mut parted = encoder(compression);
        for _ in 0..(AUTO_PROBE_MESSAGES + 2) {
            let frame = whole.encode(&msg).expect("encodes");
            let parts = parted.encode_parts(&msg).expect("encodes");
            prop_assert_eq!(parts.len(), frame.len());
            prop_assert_eq!(parts.to_vec(), frame);
        }
    }

    /// A frame that owns its pieces is byte for byte the frame in parts, local or not, and
    /// takes from the message exactly the tensors the frame in parts borrows (two encoders
    /// in step; some messages get blocks large enough to be borrowed).
    #[test]
    fn prop_owned_frames_are_the_frames_in_parts(
        msg in message_strategy(),
        compression in compression_strategy(),
        big in proptest::sample::select(vec![0usize, 2048, 5000]),
        local in any::<bool>(),
    ) {
        let mut msg = msg;
        if big > 0 {
            msg.tensors.insert(0, noise(big));
            msg.tensors.push(tensor(vec![big / 4], TensorData::Int32(vec![-3; big / 4])));
        }
        let mut parted = encoder(compression);
        let mut owning = encoder(compression);
        for _ in 0..(AUTO_PROBE_MESSAGES + 2) {
            let parts = parted.encode_parts_for(&msg, local).expect("encodes");
            let mut taken = msg.clone();
            let owned = owning.encode_owned_for(&mut taken, local).expect("encodes");
            prop_assert_eq!(owned.len(), parts.len());
            prop_assert_eq!(owned.to_vec(), parts.to_vec());
            prop_assert_eq!(owned.kept.len(), parts.borrowed.len());
            prop_assert_eq!(taken.tensors.len() + owned.kept.len(), msg.tensors.len());
            for ((_, kept), (_, lent)) in owned.kept.iter().zip(&parts.borrowed) {
                prop_assert_eq!(wire_bytes(kept.data()), Some(*lent));
            }
        }
    }

    /// Whatever the message, the hand-written encoder writes what bincode writes.
    #[test]
    fn prop_payloads_are_bincodes(msg in message_strategy()) {
        let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
        prop_assert_eq!(&frame[HEADER_LEN..], &bincode_payload(&msg)[..]);
        // The size the encoder counts as it writes is the documented one.
        let mut payload = Vec::new();
        prop_assert_eq!(write_payload(&msg, &mut payload), decoded_size(&msg));
    }

    #[test]
    fn prop_random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_frame(&bytes, DEFAULT_MAX_MESSAGE_BYTES);
        let mut framed = MAGIC.to_vec();
        framed.extend_from_slice(&bytes);
        let _ = decode_frame(&framed, DEFAULT_MAX_MESSAGE_BYTES);
    }

    /// Random payloads behind a valid header and checksum reach the payload decoder.
    #[test]
    fn prop_random_payloads_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        lz4 in any::<bool>(),
        declared in 0u64..4096,
    ) {
        let _ = decode_frame(&raw_frame(&bytes), DEFAULT_MAX_MESSAGE_BYTES);
        if lz4 {
            let frame = frame_of(&bytes, FrameCompression::Lz4, declared);
            let _ = decode_frame(&frame, DEFAULT_MAX_MESSAGE_BYTES);
        }
    }

    /// Mutated valid payloads (re-framed with a valid checksum) decode or fail cleanly.
    #[test]
    fn prop_mutated_payloads_never_panic(
        msg in message_strategy(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
        let mut p = frame[HEADER_LEN..].to_vec();
        for (at, byte) in edits {
            let i = at.index(p.len());
            p[i] = byte;
        }
        if truncate {
            p.truncate(cut.index(p.len() + 1));
        }
        let _ = decode_frame(&raw_frame(&p), DEFAULT_MAX_MESSAGE_BYTES);
        let compressed = lz4_flex::block::compress(&p);
        let _ = decode_frame(
            &frame_of(&compressed, FrameCompression::Lz4, len_u64(p.len())),
            DEFAULT_MAX_MESSAGE_BYTES,
        );
    }

    /// Every single-bit flip and every truncation of a valid frame is an error.
    #[test]
    fn prop_flipped_or_truncated_frames_are_rejected(
        msg in message_strategy(),
        compression in compression_strategy(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
        cut in any::<prop::sample::Index>(),
    ) {
        let frame = encoder(compression).encode(&msg).expect("encodes");
        let mut flipped = frame.clone();
        let i = at.index(frame.len());
        flipped[i] ^= 1 << bit;
        prop_assert!(decode_frame(&flipped, DEFAULT_MAX_MESSAGE_BYTES).is_err(), "flip at {}", i);
        let cut = cut.index(frame.len());
        prop_assert!(decode_frame(&frame[..cut], DEFAULT_MAX_MESSAGE_BYTES).is_err(), "cut at {}", cut);
    }
}

#[test]
fn frames_in_parts_borrow_numeric_values_and_match_every_dtype() {
    let msg = message(every_dtype());
    let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
    let parts = encoder(Compression::Off)
        .encode_parts(&msg)
        .expect("encodes");
    assert_eq!(parts.to_vec(), frame);
    let back = decode_frame(&parts.to_vec(), DEFAULT_MAX_MESSAGE_BYTES).expect("decodes");
    assert!(back.bitwise_eq(&msg));
    // Small values are copied next to their metadata: one piece for the whole frame.
    assert!(msg
        .tensors
        .iter()
        .all(|t| t.num_elements() * 8 < BORROW_MIN_BYTES));
    assert_eq!(parts.slices().count(), 1, "small values are copied");
    if cfg!(target_endian = "little") {
        // Large values are pieces of their own, the tensors' memory itself.
        let n = BORROW_MIN_BYTES / 4;
        let large = message(vec![
            tensor(vec![n], TensorData::Float32(vec![0.25; n])),
            tensor(vec![2], TensorData::Int64(vec![7, 8])),
            tensor(vec![n - 1], TensorData::Float32(vec![0.5; n - 1])),
        ]);
        let parts = encoder(Compression::Off)
            .encode_parts(&large)
            .expect("encodes");
        assert_eq!(
            parts.to_vec(),
            encoder(Compression::Off).encode(&large).expect("encodes")
        );
        let slices: Vec<&[u8]> = parts.slices().collect();
        assert_eq!(slices.len(), 3, "metadata, the large values, the rest");
        let TensorData::Float32(values) = large.tensors[0].data() else {
            panic!("float32");
        };
        assert_eq!(slices[1].as_ptr(), values.as_ptr().cast::<u8>(), "borrowed");
        assert_eq!(slices[1].len(), BORROW_MIN_BYTES);
    }
    let big = message(vec![tensor(
        vec![1 << 20],
        TensorData::Float32(vec![0.5; 1 << 20]),
    )]);
    let limited = StepEncoder::new(CodecConfig {
        compression: Compression::Off,
        max_message_bytes: 1 << 20,
    })
    .encode_parts(&big);
    assert!(
        matches!(limited, Err(TransferError::MessageTooLarge { .. })),
        "the limit holds in parts too"
    );
}

#[test]
fn checksums_summed_in_pieces_match_and_catch_damage() {
    let msg = message(every_dtype());
    let frame = encoder(Compression::Lz4).encode(&msg).expect("encodes");
    for piece in [1, 3, 14, 15, 21, 22, 23, 64, 241, frame.len()] {
        let mut sum = FrameChecksum::default();
        for chunk in frame.chunks(piece) {
            sum.update(chunk);
        }
        let header = FrameHeader::parse(&frame, DEFAULT_MAX_MESSAGE_BYTES).expect("header");
        assert_eq!(sum.value(), header.checksum, "pieces of {piece}");
        let back = StepDecoder::default()
            .decode_summed(&frame, &sum)
            .expect("decodes");
        assert!(back.bitwise_eq(&msg));
    }
    // A sum over damaged bytes is refused like the damage itself.
    let mut damaged = frame.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    let mut sum = FrameChecksum::default();
    sum.update(&damaged);
    assert!(matches!(
        StepDecoder::default().decode_summed(&damaged, &sum),
        Err(TransferError::ChecksumMismatch { .. })
    ));
    // A sum of another length is not trusted: the decoder computes its own.
    let mut short = FrameChecksum::default();
    short.update(&frame[..10]);
    assert!(StepDecoder::default().decode_summed(&frame, &short).is_ok());
}

/// Every proper prefix of a frame, and a frame with bytes after it, is refused: reading stops
/// at nothing short of the whole message, in both compressions.
#[test]
fn every_cut_and_every_extension_of_a_frame_is_refused() {
    for compression in [Compression::Off, Compression::Lz4] {
        let frame = encoder(compression)
            .encode(&message(every_dtype()))
            .expect("encodes");
        for cut in 0..frame.len() {
            assert!(
                decode_frame(&frame[..cut], DEFAULT_MAX_MESSAGE_BYTES).is_err(),
                "{compression:?}: cut at {cut} decodes"
            );
        }
        for extra in [&b"\0"[..], b"garbage", &frame[..HEADER_LEN]] {
            let longer = [frame.as_slice(), extra].concat();
            assert!(
                decode_frame(&longer, DEFAULT_MAX_MESSAGE_BYTES).is_err(),
                "{compression:?}: {} bytes after the frame decode",
                extra.len()
            );
        }
    }
}

#[path = "codec_stream_tests.rs"]
mod from_connection;
use from_connection::stream_decode_from;

#[test]
fn an_owned_frame_keeps_the_borrowed_tensors_and_leaves_the_rest_to_be_freed() {
    // Strings and small values are copied; the 100,000-byte and 4096-value blocks are
    // sent from their own memory, so the frame takes them.
    let tensors = vec![
        every_dtype().remove(0),
        noise(100_000),
        tensor(
            vec![2],
            TensorData::String(vec![b"ab".to_vec(), Vec::new()]),
        ),
        compressible(),
        tensor(vec![1], TensorData::Float32(vec![1.5])),
    ];
    let msg = message(tensors.clone());
    let parts = encoder(Compression::Off)
        .encode_parts_for(&msg, true)
        .expect("encodes")
        .to_vec();
    let mut taken = msg.clone();
    let owned = encoder(Compression::Off)
        .encode_owned_for(&mut taken, true)
        .expect("encodes");
    assert_eq!(owned.to_vec(), parts);
    assert_eq!(owned.len(), parts.len());
    assert!(owned.is_unsummed());
    assert_eq!(owned.kept.len(), 2);
    assert!(owned.kept[0].1.bitwise_eq(&tensors[1]));
    assert!(owned.kept[1].1.bitwise_eq(&tensors[3]));
    let left: Vec<&Tensor> = [0, 2, 4].iter().map(|&i| &tensors[i]).collect();
    assert_eq!(taken.tensors.len(), left.len());
    for (a, b) in taken.tensors.iter().zip(left) {
        assert!(a.bitwise_eq(b));
    }
    // Compressed, the frame copies everything and takes nothing.
    let mut whole = msg.clone();
    let lz4 = encoder(Compression::Lz4)
        .encode_owned_for(&mut whole, true)
        .expect("encodes");
    assert!(lz4.kept.is_empty());
    assert_eq!(whole.tensors.len(), tensors.len());
    assert!(decode_frame(&lz4.to_vec(), DEFAULT_MAX_MESSAGE_BYTES)
        .expect("decodes")
        .bitwise_eq(&msg));
}

#[test]
fn an_unsummed_owned_frame_summed_is_the_frame_for_a_receiver_elsewhere() {
    for tensors in [
        every_dtype(),
        vec![noise(100_000), compressible()],
        Vec::new(),
    ] {
        let msg = message(tensors);
        let remote = encoder(Compression::Off)
            .encode_parts_for(&msg, false)
            .expect("encodes")
            .to_vec();
        let mut owned = encoder(Compression::Off)
            .encode_owned_for(&mut msg.clone(), true)
            .expect("encodes");
        assert!(owned.is_unsummed());
        assert_ne!(owned.to_vec(), remote);
        owned.sum();
        assert!(!owned.is_unsummed());
        assert_eq!(owned.to_vec(), remote);
        let back = decode_frame(&owned.to_vec(), DEFAULT_MAX_MESSAGE_BYTES).expect("decodes");
        assert!(back.bitwise_eq(&msg));
        // Summing a summed frame changes nothing.
        owned.sum();
        assert_eq!(owned.to_vec(), remote);
    }
}

#[test]
fn the_frame_checksum_has_xxh3_check_values() {
    // XXH3-64 of no bytes (the xxHash reference's value), and of "123456789" (both crates
    // agree): bytes shorter than the header are summed whole, none of them is the field.
    assert_eq!(frame_checksum(&[]), 0x2d06_8005_38d3_94c2);
    assert_eq!(frame_checksum(b"123456789"), 0x72dc_b18b_67a1_7dff);
    // A whole megabyte, summed in pieces of every size: the same value.
    let big: Vec<u8> = (0..1u32 << 20)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .take(1 << 20)
        .collect();
    let mut summed = big[..14].to_vec();
    summed.extend_from_slice(&big[HEADER_LEN..]);
    let reference = xxhash_rust::xxh3::xxh3_64(&summed);
    for piece in [1usize, 7, 64, 1000, 4096, 65_536, big.len()] {
        let mut sum = FrameChecksum::default();
        big.chunks(piece).for_each(|c| sum.update(c));
        assert_eq!(sum.value(), reference, "pieces of {piece}");
    }
}

/// A connection whose bytes arrive in `segments` (each read returns at most what is left of
/// the current one), counting its reads.
struct Segments {
    segments: std::collections::VecDeque<Vec<u8>>,
    reads: usize,
}

impl tokio::io::AsyncRead for Segments {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.reads += 1;
        if let Some(front) = self.segments.front_mut() {
            let n = front.len().min(buf.remaining());
            buf.put_slice(&front[..n]);
            front.drain(..n);
            if front.is_empty() {
                self.segments.pop_front();
            }
        }
        std::task::Poll::Ready(Ok(()))
    }
}

/// Bytes missing from the buffer come through it in one read when they are few (a length
/// prefix, a header, a short value: the read also brings what follows), and straight into
/// their destination, exactly, from `DIRECT_READ_MIN` on.
#[test]
fn a_recycled_frame_buffer_carries_the_next_frame_and_nothing_of_the_last() {
    let long = message(vec![
        tensor(
            vec![3],
            TensorData::String(vec![
                b"a longer string".to_vec(),
                b"xy".to_vec(),
                Vec::new(),
            ]),
        ),
        tensor(vec![2], TensorData::Float32(vec![1.5, -2.0])),
    ]);
    let short = message(vec![tensor(vec![1], TensorData::Int32(vec![7]))]);
    let mut fresh = encoder(Compression::Off);
    let mut recycling = encoder(Compression::Off);
    let first = recycling
        .encode_owned_for(&mut long.clone(), false)
        .expect("encodes");
    let buffer = first.owned.as_ptr();
    recycling.recycle(first);
    // The next frame is written into the same memory, and is the frame a fresh encoder
    // writes: a shorter frame keeps none of the longer one's bytes.
    let second = recycling
        .encode_owned_for(&mut short.clone(), false)
        .expect("encodes");
    assert_eq!(second.owned.as_ptr(), buffer);
    let expected = fresh
        .encode_owned_for(&mut short.clone(), false)
        .expect("encodes");
    assert_eq!(second.to_vec(), expected.to_vec());
    assert!(decode_frame(&second.to_vec(), DEFAULT_MAX_MESSAGE_BYTES)
        .expect("decodes")
        .bitwise_eq(&short));
    // At most SPARE_FRAMES buffers are kept, and none over SPARE_BUFFER_BYTES.
    for _ in 0..SPARE_FRAMES + 5 {
        let frame = recycling
            .encode_owned_for(&mut long.clone(), false)
            .expect("encodes");
        recycling.recycle(frame);
        let frame = recycling
            .encode_owned_for(&mut long.clone(), false)
            .expect("encodes");
        let other = StepEncoder::new(CodecConfig::default())
            .encode_owned_for(&mut long.clone(), false)
            .expect("encodes");
        recycling.recycle(frame);
        recycling.recycle(other);
    }
    assert_eq!(recycling.spare.len(), SPARE_FRAMES);
    let mut big = OwnedFrame {
        owned: Vec::with_capacity(SPARE_BUFFER_BYTES + 1),
        kept: Vec::new(),
        kept_len: 0,
    };
    big.owned.push(0);
    let mut roomy = encoder(Compression::Off);
    roomy.recycle(big);
    assert!(roomy.spare.is_empty());
}
