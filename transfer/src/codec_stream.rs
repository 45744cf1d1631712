//! Decoding an uncompressed frame straight from a connection: each numeric tensor's values are
//! read from the socket into the tensor's own memory, so a frame's bytes cross user space once
//! (the kernel's copy) instead of twice (into a frame buffer, then out of it into the tensors).
//!
//! The frame and its checks are [`super`]'s: the same layout, the same limits, the same
//! errors in the same cases, and the checksum still covers every byte. Only the order of the
//! checks differs where it cannot be the same: the payload is parsed as it arrives, before the
//! checksum is known, so when a check fails mid-frame the rest of the frame is read and summed
//! first, and a checksum that does not match is the error reported (as
//! [`super::StepDecoder`] reports it before parsing anything). A declared count allocates only
//! what the frame's remaining bytes could fill, within the decoder's limit.
//!
//! Values are read in place on little-endian machines only (there, a number's memory is its
//! wire form); elsewhere, and for LZ4 frames, the receiver reads the whole frame and decodes it
//! with [`super::StepDecoder`].

use bincode::error::DecodeError;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{
    dtype_from_tag, len_u64, DecodeCtx, FrameChecksum, FrameCompression, FrameHeader, StepMessage,
    HEADER_LEN, STRING_OVERHEAD_BYTES, TENSOR_OVERHEAD_BYTES, WIRE,
};
use crate::{TensorPool, TransferError};
use lode_runtime::tensor::{DType, Tensor, TensorData};

/// Bytes the connection's buffer holds: metadata and small frames are read through it.
const BUFFER_BYTES: usize = 64 << 10;

/// The most one read for a frame's metadata takes: the next tensor's values may follow it,
/// and up to this many of them are copied through the buffer (a burst of small tensors in
/// a frame of up to this size still comes in one read).
pub(crate) const METADATA_READ: usize = 16 << 10;

/// The least of a value's bytes, missing from the buffer, that are read straight into their
/// destination; fewer come through the buffer (see [`Incoming::read_exact_into`]).
pub(crate) const DIRECT_READ_MIN: usize = 4 << 10;

/// The most a tensor's values are read in one go before they are summed: small enough that
/// the checksum reads them from cache.
const SUM_CHUNK: usize = 256 << 10;

/// The read side of a connection: a buffer over the stream, kept across frames (the next
/// frame's first bytes may arrive with this one's last).
#[derive(Debug)]
pub struct Incoming<S> {
    stream: S,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// The most one read for metadata takes (see [`Incoming::expect_frames_of`]).
    metadata_read: usize,
}

impl<S: AsyncRead + Unpin> Incoming<S> {
    pub fn new(stream: S) -> Self {
        Incoming {
            stream,
            buf: vec![0; BUFFER_BYTES].into_boxed_slice(),
            pos: 0,
            end: 0,
            metadata_read: METADATA_READ,
        }
    }

    /// Says how long the connection's frames are (the last one's length): while they are
    /// shorter than [`METADATA_READ`], a read for metadata takes up to the buffer's room, so
    /// that a burst of them comes in a few reads (no frame of theirs has values to read
    /// straight into a tensor's memory); otherwise at most [`METADATA_READ`].
    pub fn expect_frames_of(&mut self, len: usize) {
        self.metadata_read = if len < METADATA_READ {
            BUFFER_BYTES
        } else {
            METADATA_READ
        };
    }

    /// The stream, to write answers on.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Bytes received and not yet taken.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }

    /// The last `n` bytes taken from the buffer (valid until the buffer is next filled).
    fn taken_tail(&self, n: usize) -> &[u8] {
        &self.buf[self.pos.saturating_sub(n)..self.pos]
    }

    /// Reads whatever the stream has into the buffer's free end, at most `most` bytes (at
    /// least one); 0 at the end of the stream.
    async fn fill(&mut self, most: usize) -> std::io::Result<usize> {
        let most = most.clamp(1, self.buf.len());
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < most {
            // Too little room at the end for the read: the unread bytes (a piece of a
            // frame) move to the front.
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        let stop = self.end.saturating_add(most).min(self.buf.len());
        let n = self.stream.read(&mut self.buf[self.end..stop]).await?;
        self.end += n;
        Ok(n)
    }

    /// Waits until at least `n` bytes (at most the buffer's size) are buffered, reading at
    /// most [`METADATA_READ`] at a time (unless the frames are short, see
    /// [`Incoming::expect_frames_of`]): what comes after the wanted bytes may be a large
    /// tensor's values, better read straight into the tensor than copied through here.
    async fn want(&mut self, n: usize) -> std::io::Result<()> {
        let n = n.min(self.buf.len());
        while self.end - self.pos < n {
            if self.pos > 0 && self.buf.len() - self.pos < n {
                self.buf.copy_within(self.pos..self.end, 0);
                self.end -= self.pos;
                self.pos = 0;
            }
            if self.fill(self.metadata_read.max(n)).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    /// Fills `dst` exactly: the buffered bytes first, then the rest, straight from the stream
    /// when it is `DIRECT_READ_MIN` (4 KiB) or more bytes, else through the buffer (one read that
    /// also brings what follows: a burst's next length prefix and header, or the rest of a
    /// small value, would otherwise each cost a system call of a few bytes).
    pub async fn read_exact_into(&mut self, dst: &mut [u8]) -> std::io::Result<()> {
        let have = self.buffered().len().min(dst.len());
        dst[..have].copy_from_slice(&self.buf[self.pos..self.pos + have]);
        self.consume(have);
        let rest = &mut dst[have..];
        if rest.is_empty() {
            return Ok(());
        }
        if rest.len() >= DIRECT_READ_MIN {
            return self.stream.read_exact(rest).await.map(|_| ());
        }
        self.want(rest.len()).await?;
        rest.copy_from_slice(&self.buf[self.pos..self.pos + rest.len()]);
        self.consume(rest.len());
        Ok(())
    }

    /// A little-endian u32 (a frame's length prefix).
    pub async fn read_u32_le(&mut self) -> std::io::Result<u32> {
        let mut b = [0u8; 4];
        self.read_exact_into(&mut b).await?;
        Ok(u32::from_le_bytes(b))
    }

    /// Appends `n` bytes to `out`, growing it by at most `chunk` ahead of what arrived, and
    /// sums them into `sum`.
    pub async fn read_summed(
        &mut self,
        n: usize,
        out: &mut Vec<u8>,
        chunk: usize,
        sum: &mut FrameChecksum,
    ) -> std::io::Result<()> {
        let target = out.len() + n;
        while out.len() < target {
            let start = out.len();
            let want = (target - start).min(chunk.max(1));
            let have = self.buffered().len().min(want);
            if have > 0 {
                out.extend_from_slice(&self.buf[self.pos..self.pos + have]);
                self.consume(have);
            } else {
                out.reserve(want);
                let got = (&mut self.stream).take(len_u64(want)).read_buf(out).await?;
                if got == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
            sum.update(&out[start..]);
        }
        Ok(())
    }
}

/// Why a frame read from a connection failed.
#[derive(Debug)]
pub enum StreamFault {
    /// The connection broke or ended mid-frame: nothing more can be read from it.
    Io(std::io::Error),
    /// The frame was read to its end and is refused (the connection is still in step).
    Refused(TransferError),
}

impl From<std::io::Error> for StreamFault {
    fn from(e: std::io::Error) -> Self {
        StreamFault::Io(e)
    }
}

/// Whether a frame with this header is decoded from the stream (uncompressed, on a
/// little-endian machine); otherwise the caller reads it whole and decodes it.
pub fn streams(header: &FrameHeader) -> bool {
    cfg!(target_endian = "little") && header.compression == FrameCompression::None
}

/// Reads the payload of a frame whose `header` (already read: `head` holds its bytes) says it
/// is uncompressed, `len` bytes long in all (the connection's length prefix), and decodes it
/// as it arrives, within `limit` (the decoder's `max_message_bytes`). An unsummed frame (no
/// checksum: see the codec's docs) is taken only when `unsummed_from` is None (the peer is on
/// this machine); else it is refused as coming from there. On success, or on a
/// [`StreamFault::Refused`], exactly the frame's bytes were read.
pub async fn read_raw_frame<S: AsyncRead + Unpin>(
    incoming: &mut Incoming<S>,
    head: &[u8; HEADER_LEN],
    header: &FrameHeader,
    len: u64,
    limit: u64,
    pool: &TensorPool,
    unsummed_from: Option<&str>,
) -> Result<StepMessage, StreamFault> {
    let body = len.saturating_sub(len_u64(HEADER_LEN));
    let mut reader = Payload {
        incoming,
        pool,
        left: body,
        sum: FrameChecksum::default(),
        summing: header.summed,
        unsummed: 0,
        ctx: DecodeCtx {
            limit,
            used: 0,
            failure: None,
        },
    };
    reader.sum.update(head);
    // An unsummed frame from elsewhere, or a length that disagrees with the header, is
    // refused before anything is decoded or summed, as `StepDecoder` refuses it.
    let refused = if let (false, Some(from)) = (header.summed, unsummed_from) {
        Some(TransferError::Unsummed {
            from: from.to_owned(),
        })
    } else if body < header.payload_len {
        Some(TransferError::Truncated {
            needed: header.payload_len + len_u64(HEADER_LEN),
            actual: len,
        })
    } else if body > header.payload_len {
        Some(TransferError::TrailingBytes {
            extra: body - header.payload_len,
            after: "the declared payload",
        })
    } else {
        None
    };
    if let Some(refused) = refused {
        reader.drain().await?;
        return Err(StreamFault::Refused(refused));
    }
    let parsed = reader.message().await?;
    // Whatever was parsed, the frame is read to its end and its checksum comes first.
    let trailing = reader.left;
    reader.drain().await?;
    let actual = reader.checksum();
    if header.summed && actual != header.checksum {
        return Err(StreamFault::Refused(TransferError::ChecksumMismatch {
            expected: header.checksum,
            actual,
        }));
    }
    match parsed {
        Ok(_) if trailing > 0 => Err(StreamFault::Refused(TransferError::TrailingBytes {
            extra: trailing,
            after: "the last tensor of the payload",
        })),
        Ok(msg) => Ok(msg),
        Err(e) => Err(StreamFault::Refused(e)),
    }
}

/// The payload being read: at most `left` more bytes, each summed in the order it arrived.
/// Bytes taken from the connection's buffer are summed together, the last `unsummed` of them
/// at a time, before the buffer is next filled (which may move or overwrite them), before
/// bytes read past the buffer are summed, and at the frame's end: a frame of many small
/// values (a 32-row step of 26 string columns holds some 900) is summed in a few calls
/// instead of two per value.
struct Payload<'a, S> {
    incoming: &'a mut Incoming<S>,
    /// Where numeric tensors' memory comes from.
    pool: &'a TensorPool,
    left: u64,
    sum: FrameChecksum,
    /// False for an unsummed frame: nothing is summed.
    summing: bool,
    /// Bytes taken from the buffer and not yet summed: the buffer's last taken ones.
    unsummed: usize,
    ctx: DecodeCtx,
}

/// The result of parsing: the connection's own fault ends the read; a refusal is returned once
/// the frame was read to its end.
type Parsed<T> = Result<Result<T, TransferError>, std::io::Error>;

/// `?` for the inner (refusal) result of a [`Parsed`].
macro_rules! refuse {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        }
    };
}

/// String `i`'s buffer in `out`, emptied: a given-back one's (strings are read in order, so
/// `i` is at most `out.len()`), else a new one.
fn string_slot(out: &mut Vec<Vec<u8>>, i: u64) -> &mut Vec<u8> {
    let at = usize::try_from(i).unwrap_or(usize::MAX);
    if at >= out.len() {
        out.push(Vec::new());
    }
    let s = &mut out[at];
    s.clear();
    s
}

impl<S: AsyncRead + Unpin> Payload<'_, S> {
    /// Takes `n` buffered bytes (summed later, see [`Payload`]).
    fn take(&mut self, n: usize) {
        let n = n.min(self.incoming.buffered().len());
        self.incoming.consume(n);
        self.unsummed += n;
        self.left -= len_u64(n);
    }

    /// Sums the bytes taken from the buffer and not yet summed.
    fn sum_taken(&mut self) {
        if !self.summing {
            self.unsummed = 0;
        } else if self.unsummed > 0 {
            self.sum.update(self.incoming.taken_tail(self.unsummed));
            self.unsummed = 0;
        }
    }

    /// The checksum of everything taken so far.
    fn checksum(&mut self) -> u64 {
        self.sum_taken();
        self.sum.value()
    }

    /// Reads and sums the rest of the frame, discarding it.
    async fn drain(&mut self) -> std::io::Result<()> {
        while self.left > 0 {
            if self.incoming.buffered().is_empty() {
                self.sum_taken();
                if self.incoming.fill(usize::MAX).await? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
            let n = usize::try_from(self.left)
                .unwrap_or(usize::MAX)
                .min(self.incoming.buffered().len());
            self.take(n);
        }
        Ok(())
    }

    /// The payload's end came before `needed` more bytes: bincode's error, as the slice
    /// decoder gives it.
    fn short(&self, needed: u64) -> TransferError {
        TransferError::Decode {
            source: DecodeError::UnexpectedEnd {
                additional: usize::try_from(needed.saturating_sub(self.left)).unwrap_or(usize::MAX),
            },
        }
    }

    /// Decodes a u64 (bincode's varint) from the buffer: by hand when it is buffered whole in
    /// a form the encoder writes, otherwise through bincode. A step of short strings holds one
    /// per string.
    async fn varint(&mut self) -> Parsed<u64> {
        let most = usize::try_from(self.left).unwrap_or(usize::MAX).min(9);
        let window = self.incoming.buffered();
        if let Some((v, used)) = super::get_varint(&window[..most.min(window.len())]) {
            self.take(used);
            return Ok(Ok(v));
        }
        self.value::<u64>().await
    }

    /// Decodes one bincode value (an integer: at most 17 bytes) from the buffer.
    async fn value<T: bincode::Decode<()>>(&mut self) -> Parsed<T> {
        let most = usize::try_from(self.left).unwrap_or(usize::MAX).min(17);
        if self.incoming.buffered().len() < most {
            self.sum_taken();
            self.incoming.want(most).await?;
        }
        let window = &self.incoming.buffered()[..most];
        match bincode::decode_from_slice::<T, _>(window, WIRE) {
            Ok((v, used)) => {
                self.take(used);
                Ok(Ok(v))
            }
            Err(source) => Ok(Err(TransferError::Decode { source })),
        }
    }

    fn charge(&mut self, bytes: u64) -> Result<(), TransferError> {
        super::charge(&mut self.ctx, bytes).map_err(|source| {
            self.ctx
                .failure
                .take()
                .unwrap_or(TransferError::Decode { source })
        })
    }

    /// Fills `dst` from the payload: from the buffer when it holds them all, otherwise
    /// straight from the stream past what is buffered, summing it a chunk at a time.
    async fn bytes_into(&mut self, dst: &mut [u8]) -> Parsed<()> {
        let needed = len_u64(dst.len());
        if needed > self.left {
            return Ok(Err(self.short(needed)));
        }
        if let Some(buffered) = self.incoming.buffered().get(..dst.len()) {
            dst.copy_from_slice(buffered);
            self.take(dst.len());
            return Ok(Ok(()));
        }
        self.sum_taken();
        if self.summing {
            for piece in dst.chunks_mut(SUM_CHUNK) {
                self.incoming.read_exact_into(piece).await?;
                self.sum.update(piece);
            }
        } else {
            self.incoming.read_exact_into(dst).await?;
        }
        self.left -= needed;
        Ok(Ok(()))
    }

    async fn message(&mut self) -> Parsed<StepMessage> {
        let job = refuse!(self.varint().await?);
        let stage = refuse!(self.value::<u32>().await?);
        let step = refuse!(self.varint().await?);
        let epoch = refuse!(self.varint().await?);
        let nrecords = refuse!(self.varint().await?);
        refuse!(self.charge(nrecords.saturating_mul(8)));
        let mut records = Vec::with_capacity(super::initial_capacity(nrecords, 4096));
        for _ in 0..nrecords {
            records.push(refuse!(self.varint().await?));
        }
        let count = refuse!(self.varint().await?);
        let mut tensors = Vec::with_capacity(super::initial_capacity(count, 256));
        for index in 0..count {
            let index = usize::try_from(index).unwrap_or(usize::MAX);
            tensors.push(refuse!(self.tensor(index).await?));
        }
        Ok(Ok(StepMessage {
            job,
            stage,
            step,
            epoch,
            records,
            tensors,
        }))
    }

    async fn tensor(&mut self, tensor: usize) -> Parsed<Tensor> {
        let tag = refuse!(self.value::<u8>().await?);
        let Some(dtype) = dtype_from_tag(tag) else {
            return Ok(Err(TransferError::UnknownDtype { tensor, tag }));
        };
        let rank = refuse!(self.varint().await?);
        refuse!(self.charge(TENSOR_OVERHEAD_BYTES.saturating_add(rank.saturating_mul(8))));
        let mut dims = Vec::with_capacity(super::initial_capacity(rank, 8));
        for _ in 0..rank {
            dims.push(refuse!(self.varint().await?));
        }
        let count = refuse!(self.varint().await?);
        let expected = super::value_count(&dims);
        let mismatch = |dims: Vec<u64>| TransferError::ValueCountMismatch {
            tensor,
            shape: dims,
            expected,
            actual: count,
        };
        let shape = refuse!(super::checked_shape(tensor, &dims, count));
        let data = match dtype.byte_width() {
            None => refuse!(self.strings(count).await?),
            Some(width) => {
                let bytes = count.saturating_mul(len_u64(width));
                refuse!(self.charge(bytes));
                if bytes > self.left {
                    return Ok(Err(self.short(bytes)));
                }
                // At most the frame's remaining bytes, so within memory's reach.
                let n = usize::try_from(count).unwrap_or(usize::MAX);
                refuse!(self.numbers(dtype, n, tensor).await?)
            }
        };
        Ok(Tensor::new(shape, data).map_err(|_| mismatch(dims)))
    }

    /// `count` strings, written into the buffers of a given-back string tensor where the
    /// pool has one (see [`TensorPool::take_strings`]).
    async fn strings(&mut self, count: u64) -> Parsed<TensorData> {
        let mut out = self
            .pool
            .take_strings(usize::try_from(count).unwrap_or(usize::MAX));
        let reused = out.len();
        out.reserve(super::initial_capacity(count, 1024).saturating_sub(reused));
        let mut i = 0;
        while i < count {
            // As many strings as the buffer holds whole, without an await each; the next
            // one, split across reads (or refused), the long way below.
            i = refuse!(self.buffered_strings(&mut out, i, count));
            if i == count {
                break;
            }
            let len = refuse!(self.varint().await?);
            refuse!(self.charge(STRING_OVERHEAD_BYTES.saturating_add(len)));
            if len > self.left {
                return Ok(Err(self.short(len)));
            }
            // Within the frame's remaining bytes, so within memory's reach.
            let n = usize::try_from(len).unwrap_or(usize::MAX);
            let s = string_slot(&mut out, i);
            if let Some(buffered) = self.incoming.buffered().get(..n) {
                s.extend_from_slice(buffered);
                self.take(n);
            } else {
                s.resize(n, 0);
                refuse!(self.bytes_into(s).await?);
            }
            i += 1;
        }
        out.truncate(usize::try_from(count).unwrap_or(usize::MAX));
        Ok(Ok(TensorData::String(out)))
    }

    /// Strings `from`.. of `count` into `out` while the buffer holds each one whole (its
    /// length in a form the encoder writes, then its bytes, within the payload): what
    /// [`Payload::strings`]'s loop does for them, charged in the same order, with a cursor
    /// over the buffer instead of an await and a bincode call per string. Returns the index of
    /// the first string not taken.
    fn buffered_strings(
        &mut self,
        out: &mut Vec<Vec<u8>>,
        from: u64,
        count: u64,
    ) -> Result<u64, TransferError> {
        let window = self.incoming.buffered();
        // The payload's bytes within the buffer: nothing past the frame is read here.
        let window = &window[..window
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX))];
        let mut at = 0;
        let mut i = from;
        let mut refused = None;
        while i < count {
            let rest = &window[at..];
            let Some((len, used)) = super::get_varint(&rest[..rest.len().min(9)]) else {
                break;
            };
            let Some(bytes) = usize::try_from(len)
                .ok()
                .and_then(|n| rest.get(used..used.checked_add(n)?))
            else {
                break;
            };
            at += used;
            if let Err(source) =
                super::charge(&mut self.ctx, STRING_OVERHEAD_BYTES.saturating_add(len))
            {
                refused = Some(
                    self.ctx
                        .failure
                        .take()
                        .unwrap_or(TransferError::Decode { source }),
                );
                break;
            }
            string_slot(out, i).extend_from_slice(bytes);
            at += bytes.len();
            i += 1;
        }
        self.take(at);
        refused.map_or(Ok(i), Err)
    }

    /// `n` values of `dtype`, read into their own memory (see the module docs), taken from
    /// the pool.
    async fn numbers(&mut self, dtype: DType, n: usize, tensor: usize) -> Parsed<TensorData> {
        macro_rules! read {
            ($($variant:ident),*) => {{
                let mut data = self.pool.take(dtype, n);
                match &mut data {
                    $(TensorData::$variant(v) => {
                        refuse!(self.bytes_into(bytemuck::cast_slice_mut(v)).await?)
                    })*
                    TensorData::Bool(_) | TensorData::String(_) => {}
                }
                data
            }};
        }
        Ok(Ok(match dtype {
            DType::Bool => {
                let mut raw = vec![0u8; n];
                refuse!(self.bytes_into(&mut raw).await?);
                refuse!(super::decode_numbers(DType::Bool, &raw, tensor))
            }
            // Strings have no width: `tensor` reads them.
            DType::String => TensorData::String(Vec::new()),
            _ => read!(
                Int8, UInt8, Int16, UInt16, Float16, BFloat16, Int32, UInt32, Float32, Int64,
                UInt64, Float64
            ),
        }))
    }
}
