//! Decoding from a connection ([`crate::codec::stream`]): the same frames, checks and errors
//! as the decoder of a whole frame, whatever the chunks they arrive in.

use super::*;

/// A connection that hands out at most `chunk` bytes per read, so that frames arrive in
/// pieces, split anywhere.
struct Trickle<'a> {
    data: &'a [u8],
    chunk: usize,
}

impl tokio::io::AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = self.data.len().min(self.chunk).min(buf.remaining());
        buf.put_slice(&self.data[..n]);
        self.data = &self.data[n..];
        std::task::Poll::Ready(Ok(()))
    }
}

/// What comes after the frame on the connection: the stream decoder must leave it unread.
const NEXT: &[u8; 4] = b"NEXT";

/// A pool whose memory holds junk values of every dtype the pool keeps, long and short:
/// whatever the stream decoder takes from it must be overwritten completely, or the decode
/// differs.
fn junk_pool() -> TensorPool {
    let pool = TensorPool::new(1 << 22);
    for n in [3, 64, 5000] {
        for dtype in DType::ALL {
            let junk = match TensorData::zeros(dtype, n) {
                TensorData::Int8(v) => TensorData::Int8(v.iter().map(|_| -85).collect()),
                TensorData::UInt8(v) => TensorData::UInt8(v.iter().map(|_| 0xab).collect()),
                TensorData::Int16(v) => TensorData::Int16(v.iter().map(|_| -21_846).collect()),
                TensorData::UInt16(v) => TensorData::UInt16(v.iter().map(|_| 0xabab).collect()),
                TensorData::Float16(v) => TensorData::Float16(v.iter().map(|_| 0x7e01).collect()),
                TensorData::BFloat16(v) => TensorData::BFloat16(v.iter().map(|_| 0x7fc1).collect()),
                TensorData::Int32(v) => TensorData::Int32(v.iter().map(|_| -1).collect()),
                TensorData::UInt32(v) => TensorData::UInt32(v.iter().map(|_| 7).collect()),
                TensorData::Float32(v) => TensorData::Float32(v.iter().map(|_| f32::NAN).collect()),
                TensorData::Int64(v) => TensorData::Int64(v.iter().map(|_| i64::MIN).collect()),
                TensorData::UInt64(v) => TensorData::UInt64(v.iter().map(|_| u64::MAX).collect()),
                TensorData::Float64(v) => TensorData::Float64(v.iter().map(|_| -0.0).collect()),
                TensorData::String(v) => {
                    TensorData::String(v.iter().map(|_| vec![0xab; 7]).collect())
                }
                other => other,
            };
            pool.give(junk);
        }
    }
    // Strings: lists shorter and longer than a frame's, of junk strings longer and shorter
    // than its (the reader clears each buffer, pushes the strings a list lacks and drops the
    // ones it has over).
    for (count, len) in [(1, 300), (3, 0), (40, 5), (2, 1000)] {
        pool.give(TensorData::String(vec![vec![0xab; len]; count]));
    }
    pool
}

/// The stream decoder's answer for `frame` (the data plane's length prefix says its length),
/// read `chunk` bytes at a time, if it is a frame that one decodes (its header parses and
/// says uncompressed); checks that exactly the frame's bytes were read.
pub(super) fn stream_decode(
    frame: &[u8],
    limit: u64,
    chunk: usize,
) -> Option<Result<StepMessage, TransferError>> {
    // As the slice decoder, which refuses every unsummed frame.
    stream_decode_from(frame, limit, chunk, Some(DECODED_WHOLE))
}

/// [`stream_decode`] on a connection whose peer is `unsummed_from` (None: this machine).
pub(super) fn stream_decode_from(
    frame: &[u8],
    limit: u64,
    chunk: usize,
    unsummed_from: Option<&str>,
) -> Option<Result<StepMessage, TransferError>> {
    let head: [u8; HEADER_LEN] = *frame.first_chunk()?;
    let header = FrameHeader::parse(&head, limit).ok()?;
    if !stream::streams(&header) {
        return None;
    }
    let mut wire = frame.to_vec();
    wire.extend_from_slice(NEXT);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut incoming = stream::Incoming::new(Trickle { data: &wire, chunk });
        let mut read = [0u8; HEADER_LEN];
        incoming.read_exact_into(&mut read).await.expect("head");
        assert_eq!(read, head);
        let len = len_u64(frame.len());
        let pool = junk_pool();
        let result = match stream::read_raw_frame(
            &mut incoming,
            &head,
            &header,
            len,
            limit,
            &pool,
            unsummed_from,
        )
        .await
        {
            Ok(msg) => Ok(msg),
            Err(stream::StreamFault::Refused(e)) => Err(e),
            Err(stream::StreamFault::Io(e)) => panic!("a whole frame broke off: {e}"),
        };
        let mut next = [0u8; 4];
        incoming.read_exact_into(&mut next).await.expect("next");
        assert_eq!(
            &next, NEXT,
            "the frame's bytes, no more and no fewer, were read"
        );
        Some(result)
    })
}

/// The stream decoder and the slice decoder agree on `frame`: the same message bit for bit,
/// or the same error.
fn assert_agree(frame: &[u8], limit: u64, chunk: usize) -> Result<(), TestCaseError> {
    let Some(streamed) = stream_decode(frame, limit, chunk) else {
        return Ok(());
    };
    match (streamed, decode_frame(frame, limit)) {
        (Ok(a), Ok(b)) => prop_assert!(a.bitwise_eq(&b), "{:?} != {:?}", a, b),
        (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
        (a, b) => prop_assert!(false, "stream {:?}, slice {:?}", a, b),
    }
    Ok(())
}

#[test]
fn an_unsummed_frame_is_taken_from_this_machine_only() {
    for msg in [
        message(every_dtype()),
        message(vec![noise(100_000), compressible()]),
    ] {
        let mut enc = encoder(Compression::Auto);
        let local = enc.encode_parts_for(&msg, true).expect("encodes").to_vec();
        assert_eq!(local[5], 2, "a local uncompressed frame is unsummed");
        assert_eq!(
            &local[CHECKSUM_AT], &[0u8; 8],
            "and its checksum field is zero"
        );
        let header = FrameHeader::parse(&local, DEFAULT_MAX_MESSAGE_BYTES).expect("parses");
        assert!(!header.summed);
        // Its payload is the summed frame's, byte for byte.
        let summed = encoder(Compression::Off).encode(&msg).expect("encodes");
        assert_eq!(&local[HEADER_LEN..], &summed[HEADER_LEN..]);
        for chunk in [1, 7, 1 << 20] {
            let back = stream_decode_from(&local, DEFAULT_MAX_MESSAGE_BYTES, chunk, None)
                .expect("streams")
                .expect("a peer on this machine may send it");
            assert!(back.bitwise_eq(&msg), "chunk {chunk}");
            let refused = stream_decode_from(
                &local,
                DEFAULT_MAX_MESSAGE_BYTES,
                chunk,
                Some("10.0.0.2:5000"),
            )
            .expect("streams")
            .expect_err("a remote peer may not");
            assert!(
                matches!(&refused, TransferError::Unsummed { from } if from == "10.0.0.2:5000"),
                "{refused}"
            );
        }
        let whole = decode_frame(&local, DEFAULT_MAX_MESSAGE_BYTES).expect_err("decoded whole");
        assert!(matches!(whole, TransferError::Unsummed { .. }), "{whole}");
        // An unsummed frame's checksum field is zero, or its header is damaged.
        let mut marked = local.clone();
        marked[CHECKSUM_AT.start] = 1;
        let damaged = FrameHeader::parse(&marked, DEFAULT_MAX_MESSAGE_BYTES)
            .expect_err("a checksum field in an unsummed frame");
        assert!(
            matches!(damaged, TransferError::UnsummedChecksum { checksum: 1 }),
            "{damaged}"
        );
        // Asked to, the encoder sums local frames too: the same bytes as any summed frame.
        enc.sum_local(true);
        assert_eq!(
            enc.encode_parts_for(&msg, true).expect("encodes").to_vec(),
            summed
        );
        // A remote frame is always summed.
        let mut remote = encoder(Compression::Off);
        assert_eq!(
            remote
                .encode_parts_for(&msg, false)
                .expect("encodes")
                .to_vec(),
            summed
        );
    }
    // Unsummed is the uncompressed form only: LZ4 frames keep their checksum.
    let mut lz4 = encoder(Compression::Lz4);
    let msg = message(vec![compressible()]);
    let frame = lz4.encode_parts_for(&msg, true).expect("encodes").to_vec();
    assert_eq!(frame[5], 1);
    assert!(decode_frame(&frame, DEFAULT_MAX_MESSAGE_BYTES).is_ok());
    // Flag 3 is no flag at all.
    let mut bad = encoder(Compression::Off)
        .encode_parts_for(&msg, true)
        .expect("x")
        .to_vec();
    bad[5] = 3;
    assert!(matches!(
        FrameHeader::parse(&bad, DEFAULT_MAX_MESSAGE_BYTES),
        Err(TransferError::UnknownCompression { flag: 3 })
    ));
}

#[test]
fn a_frame_decoded_from_the_connection_is_the_frame_decoded_from_memory() {
    let msg = message(every_dtype());
    let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
    for chunk in [1, 7, 100, 1 << 20] {
        let back = stream_decode(&frame, DEFAULT_MAX_MESSAGE_BYTES, chunk)
            .expect("an uncompressed frame streams")
            .expect("decodes");
        assert!(back.bitwise_eq(&msg), "chunk {chunk}");
    }
    // Values larger than the connection's buffer are read past it, straight into the tensor.
    let big = message(vec![noise(100_000), compressible()]);
    let frame = encoder(Compression::Off).encode(&big).expect("encodes");
    let back = stream_decode(&frame, DEFAULT_MAX_MESSAGE_BYTES, 1 << 20)
        .expect("streams")
        .expect("decodes");
    assert!(back.bitwise_eq(&big));
    let lz4 = encoder(Compression::Lz4).encode(&big).expect("encodes");
    assert!(
        stream_decode(&lz4, DEFAULT_MAX_MESSAGE_BYTES, 1 << 20).is_none(),
        "an LZ4 frame is read whole"
    );
}

#[test]
fn the_stream_decoder_refuses_each_bad_frame_as_the_slice_decoder_does() {
    let limit = DEFAULT_MAX_MESSAGE_BYTES;
    let mut bad_bool = tensor_header(0, &[2], 2);
    bad_bool.extend_from_slice(&[1, 2]);
    let mut long_strings = tensor_header(13, &[1], 1);
    varint(1 << 40, &mut long_strings);
    let cases = [
        raw_frame(&payload(1, &tensor_header(99, &[1], 1))),
        raw_frame(&payload(1, &tensor_header(11, &[2, 3], 5))),
        raw_frame(&payload(1, &bad_bool)),
        raw_frame(&payload(1, &long_strings)),
        // A declared count far beyond the bytes that follow: refused, nothing allocated.
        raw_frame(&payload(1, &tensor_header(11, &[1 << 40], 1 << 40))),
        raw_frame(&payload(2, &tensor_header(5, &[1], 1))),
        raw_frame(&payload(0, &[0, 0])),
        raw_frame(&[]),
    ];
    for frame in &cases {
        let streamed = stream_decode(frame, limit, 3)
            .expect("streams")
            .expect_err("refused");
        assert_eq!(streamed.to_string(), decode_err(frame).to_string());
    }
    // A damaged payload byte: the checksum is the error, though parsing failed first.
    let mut frame = raw_frame(&payload(1, &tensor_header(11, &[1], 1)));
    frame.extend_from_slice(&[0; 4]);
    let frame = raw_frame(&frame[HEADER_LEN..]);
    let mut damaged = frame.clone();
    damaged[HEADER_LEN + 7] ^= 0x40;
    let streamed = stream_decode(&damaged, limit, 5).expect("streams");
    assert!(matches!(
        streamed,
        Err(TransferError::ChecksumMismatch { .. })
    ));
    // A frame whose length disagrees with its header.
    let mut long = frame.clone();
    long.push(0);
    assert_agree(&long, limit, 2).expect("agree");
    assert_agree(&frame[..frame.len() - 1], limit, 2).expect("agree");
    // The decoded-memory limit: the payload is within it, the tensors' memory is not.
    let msg = message(vec![noise(1000)]);
    let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
    let limit = len_u64(frame.len() - HEADER_LEN);
    let streamed = stream_decode(&frame, limit, 64).expect("streams");
    assert!(
        matches!(streamed, Err(TransferError::DecodedTooLarge { .. })),
        "{streamed:?}"
    );
    assert_agree(&frame, limit, 64).expect("agree");
}

proptest! {
    /// Random messages, split anywhere on the connection: the same message as from memory.
    #[test]
    fn prop_stream_decoding_matches_the_slice_decoder(
        msg in message_strategy(),
        chunk in 1usize..300,
    ) {
        let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
        let back = stream_decode(&frame, DEFAULT_MAX_MESSAGE_BYTES, chunk)
            .expect("streams")
            .expect("decodes");
        prop_assert!(back.bitwise_eq(&msg));
    }

    /// Every bit flip, and mutated payloads re-framed with a valid checksum (so that the parser
    /// sees the damage): the stream decoder says what the slice decoder says, and reads
    /// exactly the frame.
    #[test]
    fn prop_stream_decoding_refuses_what_the_slice_decoder_refuses(
        msg in message_strategy(),
        at in any::<prop::sample::Index>(),
        bit in 0u8..8,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        chunk in 1usize..300,
        limit in prop_oneof![Just(DEFAULT_MAX_MESSAGE_BYTES), 0u64..4096],
    ) {
        let frame = encoder(Compression::Off).encode(&msg).expect("encodes");
        let mut flipped = frame.clone();
        let i = at.index(frame.len());
        flipped[i] ^= 1 << bit;
        assert_agree(&flipped, limit, chunk)?;
        let mut p = frame[HEADER_LEN..].to_vec();
        if !p.is_empty() {
            for (at, byte) in edits {
                let i = at.index(p.len());
                p[i] = byte;
            }
        }
        assert_agree(&raw_frame(&p), limit, chunk)?;
    }
}

proptest! {
    /// The frame's checksum, summed in any pieces, is XXH3-64 of bytes 0..14 and 22.. as the
    /// `xxhash-rust` crate computes it: the same function, independently implemented. Sizes
    /// and cuts cross XXH3's internal boundaries (inputs of 16, 128 and 240 bytes, the streaming
    /// state's 256-byte buffer, blocks of 1 KiB).
    #[test]
    fn prop_the_frame_checksum_is_xxh3(
        bytes in proptest::collection::vec(any::<u8>(), 0..5000),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
    ) {
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        at.push(0);
        at.push(bytes.len());
        at.sort_unstable();
        let mut sum = FrameChecksum::default();
        for pair in at.windows(2) {
            sum.update(&bytes[pair[0]..pair[1]]);
        }
        let mut summed = bytes[..bytes.len().min(14)].to_vec();
        summed.extend_from_slice(bytes.get(HEADER_LEN..).unwrap_or(&[]));
        let reference = xxhash_rust::xxh3::xxh3_64(&summed);
        prop_assert_eq!(sum.value(), reference);
        prop_assert_eq!(frame_checksum(&bytes), reference);
    }
}

#[test]
fn few_missing_bytes_come_through_the_buffer_and_many_straight() {
    let big = stream::DIRECT_READ_MIN + 100;
    let wire: Vec<u8> = (0..4 + 22 + 10 + big + 4)
        .map(|i| u8::try_from(i % 251).expect("under 251"))
        .collect();
    let (prefix, rest) = wire.split_at(4);
    let (small, rest) = rest.split_at(32);
    let segments = [prefix, small, rest].map(<[u8]>::to_vec).into();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut incoming = stream::Incoming::new(Segments { segments, reads: 0 });
        let mut read = Vec::new();
        for len in [4, 22, 10, big, 4] {
            let mut dst = vec![0u8; len];
            incoming.read_exact_into(&mut dst).await.expect("bytes");
            read.extend_from_slice(&dst);
        }
        assert_eq!(read, wire);
        // The prefix (1), the header with the short value after it (1), the large value
        // exactly (1), and the 4 bytes after it (1); a read of exactly each would take 5.
        assert_eq!(incoming.get_mut().reads, 4);
    });
}

/// A read for metadata takes at most `METADATA_READ` bytes (a large tensor's values after it
/// go straight into the tensor's memory), unless the connection's frames are short: then a
/// burst of them comes in as few reads as the buffer allows.
#[test]
fn short_frames_are_read_in_large_pieces() {
    let burst: Vec<u8> = (0..40_000)
        .map(|i| u8::try_from(i % 241).expect("small"))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for (frames, reads) in [(None, 3), (Some(4_000), 1), (Some(100_000), 3)] {
        rt.block_on(async {
            let segments = [burst.clone()].into();
            let mut incoming = stream::Incoming::new(Segments { segments, reads: 0 });
            if let Some(len) = frames {
                incoming.expect_frames_of(len);
            }
            let mut read = Vec::new();
            while read.len() < burst.len() {
                let mut prefix = [0u8; 4];
                incoming.read_exact_into(&mut prefix).await.expect("bytes");
                read.extend_from_slice(&prefix);
            }
            assert_eq!(read, burst);
            assert_eq!(
                incoming.get_mut().reads,
                reads,
                "{} reads of at most {} bytes for frames of {frames:?} bytes",
                reads,
                stream::METADATA_READ
            );
        });
    }
}
