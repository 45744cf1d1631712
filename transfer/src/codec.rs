//! The step message and its frame: what a data worker sends for one step of one stage.
//!
//! # Frame
//! ```text
//! offset size  field
//!      0    4  magic "LODE"
//!      4    1  format version (FORMAT_VERSION = 2)
//!      5    1  compression: 0 = none, 1 = LZ4 block (lz4_flex, no size prefix),
//!              2 = none and unsummed (the checksum field must be zero; nothing is summed)
//!      6    8  uncompressed payload length, u64 little-endian
//!     14    8  checksum: XXH3-64 (seed 0, default secret) of bytes 0..14 followed by the
//!              payload as sent, u64 little-endian
//!     22    …  payload: exactly `length` bytes when uncompressed; when LZ4, the rest of
//!              the frame, decompressing to exactly `length` bytes
//! ```
//! The checksum is over the bytes as sent, so damage is caught before anything is
//! decompressed. A sender on the receiver's own machine (a loopback connection) leaves it out
//! of uncompressed frames (flag 2): the bytes never leave the machine's memory, where the
//! kernel's own copy does not sum them either, and the two XXH3 passes over every byte were
//! a fifth of the transfer's CPU (see the goodput figures in docs/benchmarks.md). A receiver takes an
//! unsummed frame only on its data plane and only from a loopback peer
//! ([`TransferError::Unsummed`] otherwise), and says so in its welcome: a sender leaves the
//! checksum out only when both ends see loopback (`DataPlaneClient::is_loopback`);
//! `StepEncoder::sum_local` keeps the checksum on loopback too. The decoder still checks every
//! length, count and the frame's end.
//!
//! Format version 1 carried a CRC32C in bytes 14..18; version 2 carries XXH3-64 because a
//! frame's checksum is computed over every byte on both sides, and where the `crc32`
//! instruction sums 20 GB/s, XXH3 (AVX2, chosen at run time by `twox-hash`) sums 33 (Zen 3
//! EPYC, 256 KiB in cache, 2026-11-27); damage goes undetected with probability 2^-64 per
//! frame, as for any 64-bit hash of good dispersion, where a CRC32C's is 2^-32 (it also
//! guarantees every burst of up to 32 bits, which TCP's and the link's own checks already
//! cover in transit).
//!
//! # Payload (bincode 2, standard configuration: little-endian, varint integers)
//! Written by hand (one pass, no call per integer) and read by bincode.
//! ```text
//! job u64, stage u32, step u64, epoch u64, tensor count u64, then per tensor:
//!   dtype tag u8 (see dtype_tag), rank u64, dims u64 × rank, value count u64, values:
//!     numbers: count × width bytes, little-endian, written as one block (f16/bf16 as bits)
//!     bool:    count bytes, each 0 or 1
//!     string:  per element a length u64 then that many bytes (any bytes, not only UTF-8)
//! ```
//! The value count repeats what the shape implies so that a mismatch is detected rather than
//! guessed around.
//!
//! # Limits
//! A decoder refuses, before allocating, a payload whose declared length exceeds its
//! `max_message_bytes` ([`DEFAULT_MAX_MESSAGE_BYTES`] unless configured), an LZ4 payload that
//! claims more than [`MAX_LZ4_RATIO`] times its compressed size, and a message whose decoded
//! tensors would take more than `max_message_bytes` of memory by [`decoded_size`]'s count. Each
//! collection is grown as its elements are actually read, so a large declared count in a small
//! payload costs nothing. The encoder applies the same limits, so whatever an encoder with a
//! given limit produces, a decoder with the same limit accepts.
//!
//! # Automatic compression
//! With [`Compression::Auto`] the encoder probes the first [`AUTO_PROBE_MESSAGES`] messages of
//! every window of [`AUTO_RECHECK_INTERVAL`] messages: it compresses each, sends whichever of
//! the compressed and raw payload is smaller, and adds up both sizes and the time compressing
//! took. When LZ4 saved less than [`AUTO_MIN_SAVING_PERCENT`]% over the probed messages, the
//! rest of the window goes uncompressed. Otherwise what is faster on the link decides: the
//! sender reports how each burst went ([`StepEncoder::observe_link`]: its bytes and the time
//! blocked on the network), and [`auto::AutoState`] weighs the compression time against the
//! link time it saves, tries the other setting when that promises a gain and keeps what the
//! trial measured faster (see [`auto`] for the rules). Before the sender's first report the
//! saving alone decides (LZ4). [`StepEncoder::chosen`] says what it chose. A sender whose
//! receiver is on the same machine ([`StepEncoder::encode_parts_for`] with `local`) sends raw
//! frames under `auto`: on loopback the bytes cost a memory copy, and compressing them costs
//! more.
//!
//! # Frames in parts
//! [`StepEncoder::encode_parts`] gives the same bytes as [`StepEncoder::encode_into`] as a list
//! of pieces: the header, metadata and strings in one owned buffer, and, for an uncompressed
//! frame on a little-endian machine, each numeric tensor's values borrowed from the tensor
//! itself (their memory already is their little-endian wire form). A transport writes the
//! pieces with one vectored write, so the values are copied only into the socket.

use bincode::de::read::BorrowReader;
use bincode::de::{BorrowDecode, BorrowDecoder};
use bincode::error::DecodeError;

use super::error::TransferError;
use lode_runtime::tensor::{DType, Tensor, TensorData};

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"LODE";

/// The frame format this build writes and reads.
pub const FORMAT_VERSION: u8 = 2;

/// The compression byte of an uncompressed frame sent without its checksum (see the module
/// docs).
const UNSUMMED_FLAG: u8 = 2;

/// Where an unsummed frame is said to come from when it is refused for being decoded whole.
pub(crate) const DECODED_WHOLE: &str = "a frame decoded whole";

/// Bytes before the payload: magic, version, compression flag, length, checksum.
pub const HEADER_LEN: usize = 22;

/// Where the header holds the compression flag (and whether the frame is summed).
const FLAG_AT: usize = 5;

/// Where the header holds the checksum; the bytes before it are summed with the payload.
const CHECKSUM_AT: std::ops::Range<usize> = 14..HEADER_LEN;

/// The default most bytes a message may take (256 MiB), both as its uncompressed payload and
/// as decoded tensors in memory. Large enough for a batch of 256 224×224×3 float32 images;
/// configurable per encoder and decoder.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 256 << 20;

/// The most an LZ4 block can expand: a match-length continuation byte stands for at most 255
/// bytes of output, and nothing in the format stands for more per input byte.
pub const MAX_LZ4_RATIO: u64 = 255;

/// Slack on top of [`MAX_LZ4_RATIO`] for the smallest blocks.
const LZ4_RATIO_SLACK: u64 = 64;

/// What one string element counts for in memory besides its contents (a `Vec<u8>`).
pub const STRING_OVERHEAD_BYTES: u64 = 24;

/// What one tensor counts for in memory besides its values (its dtype, shape vector and
/// bookkeeping), plus 8 bytes per dimension.
pub const TENSOR_OVERHEAD_BYTES: u64 = 64;

/// Messages compressed to measure the ratio at the start of every automatic-compression
/// window.
pub const AUTO_PROBE_MESSAGES: u64 = 8;

/// Messages per automatic-compression window: the choice is re-checked this often.
pub const AUTO_RECHECK_INTERVAL: u64 = 256;

/// LZ4 is chosen when it makes the probed payloads at least this much smaller.
pub const AUTO_MIN_SAVING_PERCENT: u64 = 10;

/// The frame's bincode configuration: little-endian, varint integers, no bincode limit (the
/// codec bounds every allocation itself).
const WIRE: bincode::config::Configuration = bincode::config::standard();

/// The messages of one step from one stage: every tensor the stage sends to the next one.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMessage {
    pub job: u64,
    pub stage: u32,
    /// The global step number (counted across epochs), the receiver's delivery order.
    pub step: u64,
    pub epoch: u64,
    /// The records the step was made from (its index batch), for the consumer's log.
    pub records: Vec<u64>,
    pub tensors: Vec<Tensor>,
}

impl StepMessage {
    /// Equality with floats compared by their bits (see [`Tensor::bitwise_eq`]).
    pub fn bitwise_eq(&self, other: &StepMessage) -> bool {
        self.job == other.job
            && self.stage == other.stage
            && self.step == other.step
            && self.epoch == other.epoch
            && self.records == other.records
            && self.tensors.len() == other.tensors.len()
            && self
                .tensors
                .iter()
                .zip(&other.tensors)
                .all(|(a, b)| a.bitwise_eq(b))
    }
}

/// A job's compression setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Never compress (fast networks, incompressible data).
    Off,
    /// Compress every message with LZ4 (a message LZ4 does not shrink is sent raw).
    Lz4,
    /// Measure and choose; see the module documentation for the rule.
    #[default]
    Auto,
}

impl Compression {
    pub fn name(self) -> &'static str {
        match self {
            Compression::Off => "off",
            Compression::Lz4 => "lz4",
            Compression::Auto => "auto",
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" | "none" => Ok(Compression::Off),
            "lz4" => Ok(Compression::Lz4),
            "auto" => Ok(Compression::Auto),
            other => Err(format!(
                "unknown compression {other:?}; expected off, lz4 or auto"
            )),
        }
    }
}

/// How one frame's payload is stored (the frame's compression byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameCompression {
    None,
    Lz4,
}

impl FrameCompression {
    fn flag(self) -> u8 {
        match self {
            FrameCompression::None => 0,
            FrameCompression::Lz4 => 1,
        }
    }

    fn from_flag(flag: u8) -> Result<Self, TransferError> {
        match flag {
            0 => Ok(FrameCompression::None),
            1 => Ok(FrameCompression::Lz4),
            flag => Err(TransferError::UnknownCompression { flag }),
        }
    }
}

/// Settings of an encoder or decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodecConfig {
    pub compression: Compression,
    /// See the module documentation's Limits.
    pub max_message_bytes: u64,
}

impl Default for CodecConfig {
    fn default() -> Self {
        CodecConfig {
            compression: Compression::Auto,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

/// Payload sizes measured by automatic compression in its latest probe, and the time
/// compressing them took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AutoProbe {
    pub messages: u64,
    pub raw_bytes: u64,
    pub lz4_bytes: u64,
    /// The time LZ4 took over the probed payloads, in nanoseconds.
    pub compress_ns: u64,
}

/// Encodes a job's step messages into frames. Keeps a scratch buffer and the automatic
/// compression state, so use one per job (per sending connection).
#[derive(Debug)]
pub struct StepEncoder {
    config: CodecConfig,
    scratch: Vec<u8>,
    /// Messages encoded so far (drives the automatic-compression windows).
    encoded: u64,
    /// The probe in progress.
    probe: AutoProbe,
    /// The latest finished probe.
    last_probe: Option<AutoProbe>,
    /// What automatic compression compresses with outside probes (None before the first).
    auto_choice: Option<FrameCompression>,
    /// Automatic compression's windows of link samples and its trials.
    link: auto::AutoState,
    /// Whether frames for a receiver on this machine keep their checksum (see the module
    /// docs); false unless [`StepEncoder::sum_local`] says so.
    sum_local: bool,
    /// What [`StepEncoder::encode_parts_for`] reserves for a frame's owned bytes.
    parts_hint: usize,
    /// Buffers of frames sent and answered ([`StepEncoder::recycle`]), empty, for the next
    /// frames' owned bytes.
    spare: Vec<Vec<u8>>,
}

/// The most buffers [`StepEncoder::recycle`] keeps: two bursts' worth.
const SPARE_FRAMES: usize = 64;

/// The largest buffer [`StepEncoder::recycle`] keeps (a larger one is freed).
const SPARE_BUFFER_BYTES: usize = 1 << 20;

impl StepEncoder {
    pub fn new(config: CodecConfig) -> Self {
        StepEncoder {
            config,
            scratch: Vec::new(),
            encoded: 0,
            probe: AutoProbe::default(),
            last_probe: None,
            auto_choice: None,
            link: auto::AutoState::new(),
            sum_local: false,
            parts_hint: 0,
            spare: Vec::new(),
        }
    }

    /// Takes back a frame whose receiver has answered: its tensors are freed, and its buffer
    /// (up to [`SPARE_FRAMES`] of them, none over [`SPARE_BUFFER_BYTES`]) holds the owned bytes
    /// of a later frame, so that a worker's frames, alike from step to step, are written into
    /// memory already in use instead of a new allocation each.
    pub fn recycle(&mut self, frame: OwnedFrame) {
        let OwnedFrame { mut owned, .. } = frame;
        if self.spare.len() < SPARE_FRAMES && owned.capacity() <= SPARE_BUFFER_BYTES {
            owned.clear();
            self.spare.push(owned);
        }
    }

    /// Keeps the frame checksum in frames for a receiver on this machine too (by default
    /// [`StepEncoder::encode_parts_for`] leaves it out of uncompressed local frames).
    pub fn sum_local(&mut self, yes: bool) {
        self.sum_local = yes;
    }

    pub fn config(&self) -> &CodecConfig {
        &self.config
    }

    /// What the encoder compresses with outside probes: `None` only while
    /// [`Compression::Auto`] has not finished its first probe. (With [`Compression::Lz4`], a
    /// message that LZ4 does not shrink is still sent raw.)
    pub fn chosen(&self) -> Option<FrameCompression> {
        match self.config.compression {
            Compression::Off => Some(FrameCompression::None),
            Compression::Lz4 => Some(FrameCompression::Lz4),
            Compression::Auto => self.auto_choice,
        }
    }

    /// The latest finished probe of automatic compression, if any.
    pub fn last_probe(&self) -> Option<AutoProbe> {
        self.last_probe
    }

    /// Automatic compression's state: its setting, windows and trials.
    pub fn auto_state(&self) -> &auto::AutoState {
        &self.link
    }

    /// Says that this encoder's sender will report how its bursts went
    /// ([`StepEncoder::observe_link`]): automatic compression then starts from raw frames and
    /// lets the link decide (see [`auto`]).
    pub fn expect_link_reports(&mut self) {
        self.link.expect_reports();
    }

    /// Tells automatic compression how a burst of this encoder's frames went at `now` (see
    /// [`auto`]); the new setting when this changed it. Nothing under `off` and `lz4`.
    pub fn observe_link(
        &mut self,
        sample: auto::LinkSample,
        now: std::time::Instant,
    ) -> Option<FrameCompression> {
        if self.config.compression != Compression::Auto {
            return None;
        }
        let changed = self.link.observe(sample, now, self.last_probe.as_ref())?;
        self.auto_choice = Some(changed);
        Some(changed)
    }

    /// Encodes `msg` into a new frame.
    pub fn encode(&mut self, msg: &StepMessage) -> Result<Vec<u8>, TransferError> {
        let mut out = Vec::new();
        self.encode_into(msg, &mut out)?;
        Ok(out)
    }

    /// Encodes `msg` into `out` (cleared first; reuse it to avoid reallocating) and says how
    /// the payload was stored.
    pub fn encode_into(
        &mut self,
        msg: &StepMessage,
        out: &mut Vec<u8>,
    ) -> Result<FrameCompression, TransferError> {
        let limit = self.limit_for(decoded_size(msg))?;
        let probing = self.probing();
        let compress = match self.config.compression {
            Compression::Off => false,
            Compression::Lz4 => true,
            Compression::Auto => probing || self.auto_choice == Some(FrameCompression::Lz4),
        };
        out.clear();
        let stored = if compress {
            self.scratch.clear();
            self.scratch.reserve(size_hint(msg, usize::MAX));
            write_payload(msg, &mut self.scratch);
            check_payload_len(self.scratch.len(), limit)?;
            let raw_len = self.scratch.len();
            let max = lz4_flex::block::get_maximum_output_size(raw_len);
            out.resize(HEADER_LEN + max, 0);
            let started = probing.then(std::time::Instant::now);
            let n = lz4_flex::block::compress_into(&self.scratch, &mut out[HEADER_LEN..])
                .map_err(|source| TransferError::Compress { source })?;
            // A probe that only measures sends its frame raw.
            let measuring = probing && self.link.measures_only();
            if let Some(started) = started {
                self.record_probe(raw_len, n, started.elapsed());
            }
            if n < raw_len && !measuring {
                out.truncate(HEADER_LEN + n);
                FrameCompression::Lz4
            } else {
                out.truncate(HEADER_LEN);
                out.extend_from_slice(&self.scratch);
                FrameCompression::None
            }
        } else {
            out.reserve(HEADER_LEN + size_hint(msg, usize::MAX));
            out.resize(HEADER_LEN, 0);
            write_payload(msg, out);
            check_payload_len(out.len() - HEADER_LEN, limit)?;
            FrameCompression::None
        };
        let raw_len = match stored {
            FrameCompression::None => out.len() - HEADER_LEN,
            FrameCompression::Lz4 => self.scratch.len(),
        };
        write_header(out, stored, len_u64(raw_len));
        self.encoded += 1;
        Ok(stored)
    }

    /// Encodes `msg` into a frame in parts (see the module documentation's Frames in parts):
    /// the same bytes as [`StepEncoder::encode_into`], with an uncompressed frame's numeric
    /// values borrowed from `msg` rather than copied.
    pub fn encode_parts<'m>(
        &mut self,
        msg: &'m StepMessage,
    ) -> Result<FrameParts<'m>, TransferError> {
        self.encode_parts_for(msg, false)
    }

    /// [`StepEncoder::encode_parts`] for a receiver on this machine when `local`: then
    /// [`Compression::Auto`] sends the frame raw without probing (over loopback, compression
    /// costs CPU and saves no bandwidth that matters); `off` and `lz4` are kept as configured;
    /// and an uncompressed frame goes unsummed (flag 2, no checksum: see the module docs)
    /// unless [`StepEncoder::sum_local`] was set.
    pub fn encode_parts_for<'m>(
        &mut self,
        msg: &'m StepMessage,
        local: bool,
    ) -> Result<FrameParts<'m>, TransferError> {
        let uncompressed = match self.config.compression {
            Compression::Off => true,
            Compression::Lz4 => false,
            Compression::Auto => {
                local || (!self.probing() && self.auto_choice == Some(FrameCompression::None))
            }
        };
        if !uncompressed || !cfg!(target_endian = "little") {
            let mut owned = Vec::new();
            self.encode_into(msg, &mut owned)?;
            return Ok(FrameParts {
                owned,
                borrowed: Vec::new(),
                borrowed_len: 0,
            });
        }
        // A recycled frame's buffer if there is one, with room for the last frame's owned
        // bytes and an eighth more: a job's steps are alike, and sizing this frame exactly
        // would take a pass over its strings before the one that writes them.
        let mut owned = self.spare.pop().unwrap_or_default();
        owned.reserve(self.parts_hint.max(HEADER_LEN + 64));
        owned.resize(HEADER_LEN, 0);
        let mut parts = FrameParts {
            owned,
            borrowed: Vec::new(),
            borrowed_len: 0,
        };
        // A message past the limit is refused once written (it is in memory already, and
        // its frame's owned part is no larger).
        let decoded = write_payload(msg, &mut parts);
        let limit = self.limit_for(decoded)?;
        let payload_len = parts.len() - HEADER_LEN;
        check_payload_len(payload_len, limit)?;
        self.parts_hint = parts.owned.len().saturating_add(parts.owned.len() / 8);
        let unsummed = local && !self.sum_local;
        let header = &mut parts.owned[..HEADER_LEN];
        header[..4].copy_from_slice(&MAGIC);
        header[4] = FORMAT_VERSION;
        header[FLAG_AT] = if unsummed {
            UNSUMMED_FLAG
        } else {
            FrameCompression::None.flag()
        };
        header[6..14].copy_from_slice(&len_u64(payload_len).to_le_bytes());
        self.encoded += 1;
        if !unsummed {
            let sum = checksum(parts.slices());
            parts.owned[CHECKSUM_AT].copy_from_slice(&sum.to_le_bytes());
        }
        Ok(parts)
    }

    /// [`StepEncoder::encode_parts_for`] into a frame that owns its pieces, so that the step's
    /// tensors can be freed at once, while their memory is warm, rather than when the
    /// receiver's answer comes: the tensors whose values the frame sends from their own
    /// memory are moved out of `msg` into the frame; the others stay in `msg`, for the caller
    /// to drop.
    pub fn encode_owned_for(
        &mut self,
        msg: &mut StepMessage,
        local: bool,
    ) -> Result<OwnedFrame, TransferError> {
        let parts = self.encode_parts_for(msg, local)?;
        if parts.borrowed.is_empty() {
            // Every value was copied (the common case for small steps): nothing to take.
            return Ok(OwnedFrame {
                owned: parts.owned,
                kept: Vec::new(),
                kept_len: 0,
            });
        }
        // Which tensors the frame borrows, by their memory (a borrowed piece is a tensor's
        // whole value bytes, in the tensors' order).
        let mut pieces = parts.borrowed.iter().peekable();
        let borrowed: Vec<bool> = msg
            .tensors
            .iter()
            .map(|t| {
                let lent = wire_bytes(t.data()).is_some_and(|bytes| {
                    pieces
                        .peek()
                        .is_some_and(|&&(_, piece)| std::ptr::eq(piece, bytes))
                });
                if lent {
                    pieces.next();
                }
                lent
            })
            .collect();
        if pieces.next().is_some() {
            // Not a tensor's bytes (cannot happen): the frame is copied whole instead.
            return Ok(OwnedFrame {
                owned: parts.to_vec(),
                kept: Vec::new(),
                kept_len: 0,
            });
        }
        let FrameParts {
            owned,
            borrowed: pieces,
            borrowed_len,
        } = parts;
        let at: Vec<usize> = pieces.into_iter().map(|(at, _)| at).collect();
        let mut kept = Vec::with_capacity(at.len());
        let mut rest = Vec::with_capacity(msg.tensors.len() - at.len());
        for (t, lent) in std::mem::take(&mut msg.tensors).into_iter().zip(borrowed) {
            if lent {
                kept.push(t);
            } else {
                rest.push(t);
            }
        }
        msg.tensors = rest;
        Ok(OwnedFrame {
            owned,
            kept: at.into_iter().zip(kept).collect(),
            kept_len: borrowed_len,
        })
    }

    /// The message limit, once a message of `decoded` bytes (see [`decoded_size`]) is known to
    /// fit it.
    fn limit_for(&self, decoded: u64) -> Result<u64, TransferError> {
        let limit = self.config.max_message_bytes;
        if decoded > limit {
            return Err(TransferError::MessageTooLarge {
                bytes: decoded,
                limit,
            });
        }
        Ok(limit)
    }

    /// Whether `auto` compresses this message to measure what compression gains.
    fn probing(&self) -> bool {
        self.config.compression == Compression::Auto
            && self.encoded % AUTO_RECHECK_INTERVAL < self.probe_messages()
    }

    /// Messages a probe takes: fewer while it only measures (see [`auto`]).
    fn probe_messages(&self) -> u64 {
        if self.link.measures_only() && self.last_probe.is_some() {
            auto::AUTO_LINK_PROBE_MESSAGES
        } else {
            AUTO_PROBE_MESSAGES
        }
    }

    fn record_probe(&mut self, raw: usize, lz4: usize, took: std::time::Duration) {
        self.probe.messages += 1;
        self.probe.raw_bytes += len_u64(raw);
        // A message LZ4 does not shrink is sent raw, so it costs its raw size.
        self.probe.lz4_bytes += len_u64(lz4.min(raw));
        self.probe.compress_ns = self
            .probe
            .compress_ns
            .saturating_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        if self.probe.messages >= self.probe_messages() {
            let worth_it = auto::worth_compressing(&self.probe);
            self.auto_choice = Some(self.link.probed(worth_it));
            self.last_probe = Some(self.probe);
            self.probe = AutoProbe::default();
        }
    }
}

/// A frame as pieces in wire order (see [`StepEncoder::encode_parts`]).
#[derive(Debug)]
pub struct FrameParts<'m> {
    /// The header, metadata, strings and small values.
    owned: Vec<u8>,
    /// Borrowed values, each with the offset in `owned` where it goes (ascending).
    borrowed: Vec<(usize, &'m [u8])>,
    /// The borrowed pieces' bytes.
    borrowed_len: usize,
}

impl<'m> FrameParts<'m> {
    /// The frame's length in bytes.
    pub fn len(&self) -> usize {
        self.owned.len() + self.borrowed_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces in order, as one vectored write takes them (none empty).
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        interleave(&self.owned, self.borrowed.iter().copied())
    }

    fn push_borrowed(&mut self, bytes: &'m [u8]) {
        self.borrowed.push((self.owned.len(), bytes));
        self.borrowed_len += bytes.len();
    }
}

/// A frame as pieces in wire order, for a vectored write: [`FrameParts`], [`OwnedFrame`].
pub trait Frame {
    /// The frame's length in bytes.
    fn frame_len(&self) -> usize;
    /// The pieces in order (none empty).
    fn pieces(&self) -> impl Iterator<Item = &[u8]>;

    /// The frame in one buffer (for tests and for transports without vectored writes).
    fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.frame_len());
        for piece in self.pieces() {
            out.extend_from_slice(piece);
        }
        out
    }
}

impl Frame for FrameParts<'_> {
    fn frame_len(&self) -> usize {
        self.len()
    }

    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        self.slices()
    }
}

impl Frame for OwnedFrame {
    fn frame_len(&self) -> usize {
        self.len()
    }

    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        self.slices()
    }
}

impl<F: Frame> Frame for &F {
    fn frame_len(&self) -> usize {
        (**self).frame_len()
    }

    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        (**self).pieces()
    }
}

/// `owned` with the `borrowed` pieces put in at their offsets (ascending), as one vectored
/// write takes them (none empty).
fn interleave<'a>(
    owned: &'a [u8],
    borrowed: impl Iterator<Item = (usize, &'a [u8])> + 'a,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut from = 0;
    borrowed
        .map(Some)
        .chain(std::iter::once(None))
        .flat_map(move |piece| {
            let to = piece.map_or(owned.len(), |(at, _)| at);
            let before = owned.get(from..to).unwrap_or_default();
            from = to;
            [before, piece.map_or(&[][..], |(_, values)| values)]
        })
        .filter(|b| !b.is_empty())
}

/// The frame's checksum over its pieces in order, summed as a receiver sums them (the
/// checksum's own field is skipped).
fn checksum<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut sum = FrameChecksum::default();
    for piece in pieces {
        sum.update(piece);
    }
    sum.value()
}

/// A frame that owns its pieces (see [`StepEncoder::encode_owned_for`]): what a worker
/// keeps of a step until the receiver has taken it.
#[derive(Debug)]
pub struct OwnedFrame {
    /// The header, metadata, strings and small values.
    owned: Vec<u8>,
    /// The tensors whose values are sent from their own memory, each with the offset in
    /// `owned` where they go (ascending).
    kept: Vec<(usize, Tensor)>,
    /// The kept values' bytes.
    kept_len: usize,
}

impl OwnedFrame {
    /// The frame's length in bytes.
    pub fn len(&self) -> usize {
        self.owned.len() + self.kept_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces in order, as one vectored write takes them (none empty).
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        interleave(
            &self.owned,
            self.kept
                .iter()
                .map(|(at, t)| (*at, wire_bytes(t.data()).unwrap_or_default())),
        )
    }

    /// Whether the frame goes without a checksum (only to a receiver on this machine).
    pub fn is_unsummed(&self) -> bool {
        self.owned.get(FLAG_AT) == Some(&UNSUMMED_FLAG)
    }

    /// Gives an unsummed frame its checksum, for a receiver that is not on this machine (it
    /// was encoded for one that was, and the receiver moved): the bytes
    /// [`StepEncoder::encode_parts_for`] gives for a receiver elsewhere, uncompressed.
    pub fn sum(&mut self) {
        if !self.is_unsummed() {
            return;
        }
        self.owned[FLAG_AT] = FrameCompression::None.flag();
        let sum = checksum(self.slices());
        self.owned[CHECKSUM_AT].copy_from_slice(&sum.to_le_bytes());
    }
}

/// A numeric tensor's values as their little-endian wire bytes, when their memory already is
/// that (little-endian machines; bools are one byte, 0 or 1, in memory as on the wire).
fn wire_bytes(data: &TensorData) -> Option<&[u8]> {
    use zerocopy::IntoBytes;
    if !cfg!(target_endian = "little") {
        return None;
    }
    Some(match data {
        TensorData::Bool(v) => v.as_bytes(),
        TensorData::Int8(v) => v.as_bytes(),
        TensorData::UInt8(v) => v.as_bytes(),
        TensorData::Int16(v) => v.as_bytes(),
        TensorData::UInt16(v) | TensorData::Float16(v) | TensorData::BFloat16(v) => v.as_bytes(),
        TensorData::Int32(v) => v.as_bytes(),
        TensorData::UInt32(v) => v.as_bytes(),
        TensorData::Float32(v) => v.as_bytes(),
        TensorData::Int64(v) => v.as_bytes(),
        TensorData::UInt64(v) => v.as_bytes(),
        TensorData::Float64(v) => v.as_bytes(),
        TensorData::String(_) => return None,
    })
}

/// A numeric tensor's values of at least this many bytes are borrowed into a frame in parts;
/// smaller ones are copied next to their metadata. A vectored write pays per piece (the
/// kernel walks each one, and takes at most 1024 per call): a step of many small tensors
/// (wide_deep's full cut: 68 tensors, 185 bytes each on average) goes out as one piece
/// instead of 137, while a large tensor's values are still never copied in user space.
pub const BORROW_MIN_BYTES: usize = 2048;

/// Where the payload encoder puts bytes: a contiguous frame (`Vec<u8>`) or a frame in parts.
trait PayloadSink<'m> {
    /// The owned bytes; the encoder appends to them.
    fn owned(&mut self) -> &mut Vec<u8>;
    /// A numeric tensor's values in their wire form.
    fn values(&mut self, bytes: &'m [u8]);
}

impl<'m> PayloadSink<'m> for Vec<u8> {
    fn owned(&mut self) -> &mut Vec<u8> {
        self
    }

    fn values(&mut self, bytes: &'m [u8]) {
        self.extend_from_slice(bytes);
    }
}

impl<'m> PayloadSink<'m> for FrameParts<'m> {
    fn owned(&mut self) -> &mut Vec<u8> {
        &mut self.owned
    }

    /// Values of [`BORROW_MIN_BYTES`] or more are borrowed, smaller ones copied.
    fn values(&mut self, bytes: &'m [u8]) {
        if bytes.len() >= BORROW_MIN_BYTES {
            self.push_borrowed(bytes);
        } else {
            self.owned.extend_from_slice(bytes);
        }
    }
}

/// Appends `v` as the wire's variable-length integer (bincode 2's standard varint): below
/// 251 one byte; else a marker byte (251, 252, 253) and the value as u16, u32 or u64,
/// little-endian. u32 fields use the same form (a u32 never needs the u64 marker).
#[inline(always)]
fn put_varint(out: &mut Vec<u8>, v: u64) {
    if let Some(byte) = u8::try_from(v).ok().filter(|&b| b < 251) {
        out.push(byte);
    } else if let Ok(v) = u16::try_from(v) {
        out.push(251);
        out.extend_from_slice(&v.to_le_bytes());
    } else if let Ok(v) = u32::try_from(v) {
        out.push(252);
        out.extend_from_slice(&v.to_le_bytes());
    } else {
        out.push(253);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Reads one of the four forms [`put_varint`] writes from the start of `bytes`: the value and
/// the bytes it took. `None` when `bytes` holds none of them whole (too short, or a first
/// byte of 254 or 255): the caller then asks bincode, whose answer (a value, or the error) is
/// the wire format's. Where this gives a value, bincode gives the same one.
pub(crate) fn get_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let (&first, rest) = bytes.split_first()?;
    match first {
        0..=250 => Some((u64::from(first), 1)),
        251 => Some((u64::from(u16::from_le_bytes(*rest.first_chunk()?)), 3)),
        252 => Some((u64::from(u32::from_le_bytes(*rest.first_chunk()?)), 5)),
        253 => Some((u64::from_le_bytes(*rest.first_chunk()?), 9)),
        _ => None,
    }
}

/// Writes `msg`'s payload (see the module documentation) into `sink`: the one encoder of the
/// wire format, byte for byte what bincode 2's standard configuration writes for it (the
/// decoder is bincode's; the tests hold the two together). Written by hand because bincode's
/// writer is called once per integer and per string, which cost a wide_deep step more than
/// its checksum.
///
/// Returns `msg`'s [`decoded_size`], counted on the way (a second pass over a cut's hundreds
/// of strings a step cost the worker about 1% of its CPU).
fn write_payload<'m>(msg: &'m StepMessage, sink: &mut impl PayloadSink<'m>) -> u64 {
    let out = sink.owned();
    put_varint(out, msg.job);
    put_varint(out, u64::from(msg.stage));
    put_varint(out, msg.step);
    put_varint(out, msg.epoch);
    put_varint(out, len_u64(msg.records.len()));
    for &r in &msg.records {
        put_varint(out, r);
    }
    put_varint(out, len_u64(msg.tensors.len()));
    let mut decoded = len_u64(msg.records.len()).saturating_mul(8);
    for t in &msg.tensors {
        decoded = decoded.saturating_add(write_tensor(t, sink));
    }
    decoded
}

/// Appends the wire form of `tensors` to `out`: each as a frame's payload carries it (dtype,
/// shape, value count, values), one after another. What the training-side emulator digests.
pub fn write_tensors<'m>(tensors: impl IntoIterator<Item = &'m Tensor>, out: &mut Vec<u8>) {
    for t in tensors {
        write_tensor(t, out);
    }
}

/// One tensor of a payload (see [`write_payload`]); returns what it counts for in
/// [`decoded_size`].
fn write_tensor<'m>(t: &'m Tensor, sink: &mut impl PayloadSink<'m>) -> u64 {
    let out = sink.owned();
    out.push(dtype_tag(t.dtype()));
    put_varint(out, len_u64(t.shape().len()));
    for &d in t.shape() {
        put_varint(out, len_u64(d));
    }
    put_varint(out, len_u64(t.num_elements()));
    if let Some(values) = wire_bytes(t.data()) {
        sink.values(values);
        return tensor_decoded(t, 0);
    }
    let out = sink.owned();
    match t.data() {
        TensorData::String(v) => {
            return tensor_decoded(t, write_strings(v, out));
        }
        // A big-endian machine: the values are converted.
        TensorData::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        TensorData::Int8(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        TensorData::UInt8(v) => out.extend_from_slice(v),
        TensorData::Int16(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        TensorData::UInt16(v) | TensorData::Float16(v) | TensorData::BFloat16(v) => {
            out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        }
        TensorData::Int32(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        TensorData::UInt32(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        TensorData::Float32(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        TensorData::Int64(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        TensorData::UInt64(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
        TensorData::Float64(v) => out.extend(v.iter().flat_map(|x| x.to_le_bytes())),
    }
    tensor_decoded(t, 0)
}

/// Appends strings as the payload carries them (each its length, then its bytes); returns
/// their bytes. A tensor of short strings (each under 251 bytes, so that its length takes one
/// byte) is written into room made for all of it at once: no capacity check or length update
/// per string.
fn write_strings(v: &[Vec<u8>], out: &mut Vec<u8>) -> usize {
    let (bytes, longest) = v.iter().fold((0usize, 0usize), |(sum, max), s| {
        (sum + s.len(), max.max(s.len()))
    });
    if longest >= 251 {
        for s in v {
            put_varint(out, len_u64(s.len()));
            out.extend_from_slice(s);
        }
        return bytes;
    }
    let start = out.len();
    out.resize(start + bytes + v.len(), 0);
    let mut room = &mut out[start..];
    for s in v {
        let (len, rest) = std::mem::take(&mut room).split_at_mut(1);
        len[0] = s.len().to_le_bytes()[0]; // the whole length: under 251, checked above
        let (value, rest) = rest.split_at_mut(s.len());
        copy_short(value, s);
        room = rest;
    }
    bytes
}

/// `to.copy_from_slice(from)`, with fixed-size moves for 4 to 16 bytes (two that overlap)
/// instead of a call to `memcpy`.
#[inline(always)]
fn copy_short(to: &mut [u8], from: &[u8]) {
    let n = from.len();
    if (8..=16).contains(&n) {
        let (head, tail) = (n - 8, 8);
        to[..8].copy_from_slice(&from[..8]);
        to[head..head + tail].copy_from_slice(&from[head..]);
    } else if (4..8).contains(&n) {
        to[..4].copy_from_slice(&from[..4]);
        to[n - 4..n].copy_from_slice(&from[n - 4..]);
    } else {
        to.copy_from_slice(from);
    }
}

/// Decodes frames. Keeps a decompression buffer between calls.
#[derive(Debug)]
pub struct StepDecoder {
    max_message_bytes: u64,
    scratch: Vec<u8>,
}

impl StepDecoder {
    /// A decoder refusing messages over `max_message_bytes` (see the module documentation).
    pub fn new(max_message_bytes: u64) -> Self {
        StepDecoder {
            max_message_bytes,
            scratch: Vec::new(),
        }
    }

    pub fn max_message_bytes(&self) -> u64 {
        self.max_message_bytes
    }

    /// Decodes one frame. Never panics and never allocates past the limits, whatever `frame`
    /// holds.
    pub fn decode(&mut self, frame: &[u8]) -> Result<StepMessage, TransferError> {
        self.decode_inner(frame, None)
    }

    /// [`StepDecoder::decode`] with the frame's checksum already computed as its bytes arrived
    /// (while they were in cache), rather than in a pass of its own. `sum` must have seen
    /// exactly `frame`; if it saw another length, the checksum is computed here.
    pub fn decode_summed(
        &mut self,
        frame: &[u8],
        sum: &FrameChecksum,
    ) -> Result<StepMessage, TransferError> {
        let known = (sum.seen == frame.len()).then(|| sum.value());
        self.decode_inner(frame, known)
    }

    fn decode_inner(
        &mut self,
        frame: &[u8],
        checksum: Option<u64>,
    ) -> Result<StepMessage, TransferError> {
        let header = FrameHeader::parse(frame, self.max_message_bytes)?;
        // Only the data plane's streamed reader takes unsummed frames (from loopback peers).
        if !header.summed {
            return Err(TransferError::Unsummed {
                from: DECODED_WHOLE.to_owned(),
            });
        }
        let body = &frame[HEADER_LEN..];
        let body_len = len_u64(body.len());
        match header.compression {
            FrameCompression::None => {
                if body_len < header.payload_len {
                    return Err(TransferError::Truncated {
                        needed: header.payload_len + len_u64(HEADER_LEN),
                        actual: len_u64(frame.len()),
                    });
                }
                if body_len > header.payload_len {
                    return Err(TransferError::TrailingBytes {
                        extra: body_len - header.payload_len,
                        after: "the declared payload",
                    });
                }
            }
            FrameCompression::Lz4 => {
                let most = body_len
                    .saturating_mul(MAX_LZ4_RATIO)
                    .saturating_add(LZ4_RATIO_SLACK);
                if header.payload_len > most {
                    return Err(TransferError::ImplausibleRatio {
                        declared: header.payload_len,
                        compressed: body_len,
                        max_ratio: MAX_LZ4_RATIO,
                    });
                }
            }
        }
        let actual = checksum.unwrap_or_else(|| frame_checksum(frame));
        if actual != header.checksum {
            return Err(TransferError::ChecksumMismatch {
                expected: header.checksum,
                actual,
            });
        }
        let payload: &[u8] = match header.compression {
            FrameCompression::None => body,
            FrameCompression::Lz4 => {
                // `payload_len` is at most the limit and at most MAX_LZ4_RATIO times the bytes
                // received, checked above.
                let len = usize::try_from(header.payload_len).map_err(|_| {
                    TransferError::DeclaredTooLarge {
                        declared: header.payload_len,
                        limit: self.max_message_bytes,
                    }
                })?;
                self.scratch.clear();
                self.scratch.resize(len, 0);
                let n = lz4_flex::block::decompress_into(body, &mut self.scratch).map_err(
                    |source| TransferError::Decompress {
                        compressed: body_len,
                        source,
                    },
                )?;
                if n != len {
                    return Err(TransferError::DecompressedLength {
                        declared: header.payload_len,
                        actual: len_u64(n),
                    });
                }
                &self.scratch
            }
        };
        decode_payload(payload, self.max_message_bytes)
    }
}

impl Default for StepDecoder {
    fn default() -> Self {
        StepDecoder::new(DEFAULT_MAX_MESSAGE_BYTES)
    }
}

/// Decodes one frame with a fresh decoder (see [`StepDecoder::decode`]).
pub fn decode_frame(frame: &[u8], max_message_bytes: u64) -> Result<StepMessage, TransferError> {
    StepDecoder::new(max_message_bytes).decode(frame)
}

/// The memory `msg`'s tensors count for against `max_message_bytes`: the values' bytes,
/// [`STRING_OVERHEAD_BYTES`] per string element, and [`TENSOR_OVERHEAD_BYTES`] plus 8 bytes
/// per dimension for each tensor. Independent of the machine, so sender and receiver agree.
pub fn decoded_size(msg: &StepMessage) -> u64 {
    sizes(msg, usize::MAX).0
}

/// The stable wire tag of each dtype. Tags are never reused; new dtypes get new numbers.
pub fn dtype_tag(dtype: DType) -> u8 {
    match dtype {
        DType::Bool => 0,
        DType::Int8 => 1,
        DType::Int16 => 2,
        DType::Int32 => 3,
        DType::Int64 => 4,
        DType::UInt8 => 5,
        DType::UInt16 => 6,
        DType::UInt32 => 7,
        DType::UInt64 => 8,
        DType::Float16 => 9,
        DType::BFloat16 => 10,
        DType::Float32 => 11,
        DType::Float64 => 12,
        DType::String => 13,
    }
}

fn dtype_from_tag(tag: u8) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dtype_tag(d) == tag)
}

fn tensor_overhead(rank: usize) -> u64 {
    TENSOR_OVERHEAD_BYTES.saturating_add(len_u64(rank).saturating_mul(8))
}

/// What tensor `t` counts for in [`decoded_size`], its strings' bytes given (0 for numbers):
/// the one formula of the encoder's two ways to count it.
fn tensor_decoded(t: &Tensor, string_bytes: usize) -> u64 {
    let count = len_u64(t.num_elements());
    let values = match t.dtype() {
        DType::String => count
            .saturating_mul(STRING_OVERHEAD_BYTES)
            .saturating_add(len_u64(string_bytes)),
        dtype => count.saturating_mul(len_u64(dtype.byte_width().unwrap_or(1))),
    };
    tensor_overhead(t.shape().len()).saturating_add(values)
}

/// usize → u64, lossless on every platform Rust supports (usize is at most 64 bits there).
fn len_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn check_payload_len(len: usize, limit: u64) -> Result<(), TransferError> {
    let bytes = len_u64(len);
    if bytes > limit {
        return Err(TransferError::MessageTooLarge { bytes, limit });
    }
    Ok(())
}

/// A close upper bound of the payload's size, to reserve once, leaving out numeric values of
/// `borrowed_from` bytes or more (a frame in parts borrows them; `usize::MAX` counts all).
fn size_hint(msg: &StepMessage, borrowed_from: usize) -> usize {
    sizes(msg, borrowed_from).1
}

/// [`decoded_size`] and [`size_hint`] of `msg` together, in one pass over its strings (a
/// frame's encoder needs both, and a cut's string columns hold hundreds of them a step).
fn sizes(msg: &StepMessage, borrowed_from: usize) -> (u64, usize) {
    let records = msg.records.len();
    let mut decoded = len_u64(records).saturating_mul(8);
    let mut hint = 48 + 9 * records;
    for t in &msg.tensors {
        let (string_bytes, hint_values) = match t.data() {
            TensorData::String(v) => {
                let bytes: usize = v.iter().map(Vec::len).sum();
                (bytes, bytes.saturating_add(9 * v.len()))
            }
            data => {
                let width = t.dtype().byte_width().unwrap_or(1);
                let bytes = data.len().saturating_mul(width);
                (0, if bytes >= borrowed_from { 0 } else { bytes })
            }
        };
        decoded = decoded.saturating_add(tensor_decoded(t, string_bytes));
        hint = hint.saturating_add(1 + 9 * (t.shape().len() + 2) + hint_values);
    }
    (decoded, hint)
}

/// Fills in the header of `out`, whose payload (as sent) starts at [`HEADER_LEN`].
fn write_header(out: &mut [u8], compression: FrameCompression, payload_len: u64) {
    out[..4].copy_from_slice(&MAGIC);
    out[4] = FORMAT_VERSION;
    out[FLAG_AT] = compression.flag();
    out[6..14].copy_from_slice(&payload_len.to_le_bytes());
    let sum = frame_checksum(out);
    out[CHECKSUM_AT].copy_from_slice(&sum.to_le_bytes());
}

/// Decodes a whole payload; the error of a failed check is the codec's own, not bincode's.
fn decode_payload(payload: &[u8], limit: u64) -> Result<StepMessage, TransferError> {
    let mut ctx = DecodeCtx {
        limit,
        used: 0,
        failure: None,
    };
    match bincode::borrow_decode_from_slice_with_context::<_, WireDecoded, _>(
        payload, WIRE, &mut ctx,
    ) {
        Ok((WireDecoded(msg), read)) if read == payload.len() => Ok(msg),
        Ok((_, read)) => Err(TransferError::TrailingBytes {
            extra: len_u64(payload.len() - read),
            after: "the last tensor of the payload",
        }),
        Err(source) => Err(ctx
            .failure
            .take()
            .unwrap_or(TransferError::Decode { source })),
    }
}

/// What decoding carries besides the bytes: the memory budget and the codec's own error when a
/// check fails (bincode's error type cannot carry it).
struct DecodeCtx {
    limit: u64,
    used: u64,
    failure: Option<TransferError>,
}

struct WireDecoded(StepMessage);

/// Counts `bytes` of decoded memory against the limit.
fn charge(ctx: &mut DecodeCtx, bytes: u64) -> Result<(), DecodeError> {
    ctx.used = ctx.used.saturating_add(bytes);
    if ctx.used > ctx.limit {
        ctx.failure = Some(TransferError::DecodedTooLarge {
            bytes: ctx.used,
            limit: ctx.limit,
        });
        return Err(DecodeError::Other("decoded step message too large"));
    }
    Ok(())
}

fn failed(ctx: &mut DecodeCtx, err: TransferError) -> DecodeError {
    ctx.failure = Some(err);
    DecodeError::Other("invalid step message")
}

/// Capacity to reserve for a declared element count: never more than `cap` up front, so a
/// hostile count only costs what the payload actually holds.
fn initial_capacity(declared: u64, cap: usize) -> usize {
    usize::try_from(declared).map_or(cap, |n| n.min(cap))
}

impl<'de, 'c> BorrowDecode<'de, &'c mut DecodeCtx> for WireDecoded {
    fn borrow_decode<D: BorrowDecoder<'de, Context = &'c mut DecodeCtx>>(
        d: &mut D,
    ) -> Result<Self, DecodeError> {
        let job = u64::borrow_decode(d)?;
        let stage = u32::borrow_decode(d)?;
        let step = u64::borrow_decode(d)?;
        let epoch = u64::borrow_decode(d)?;
        let nrecords = u64::borrow_decode(d)?;
        charge(d.context(), nrecords.saturating_mul(8))?;
        let mut records = Vec::with_capacity(initial_capacity(nrecords, 4096));
        for _ in 0..nrecords {
            records.push(u64::borrow_decode(d)?);
        }
        let count = u64::borrow_decode(d)?;
        let mut tensors = Vec::with_capacity(initial_capacity(count, 256));
        for index in 0..count {
            let index = usize::try_from(index).unwrap_or(usize::MAX);
            tensors.push(decode_tensor(d, index)?);
        }
        Ok(WireDecoded(StepMessage {
            job,
            stage,
            step,
            epoch,
            records,
            tensors,
        }))
    }
}

fn decode_tensor<'de, 'c, D: BorrowDecoder<'de, Context = &'c mut DecodeCtx>>(
    d: &mut D,
    tensor: usize,
) -> Result<Tensor, DecodeError> {
    let tag = u8::borrow_decode(d)?;
    let Some(dtype) = dtype_from_tag(tag) else {
        return Err(failed(
            d.context(),
            TransferError::UnknownDtype { tensor, tag },
        ));
    };
    let rank = u64::borrow_decode(d)?;
    charge(
        d.context(),
        TENSOR_OVERHEAD_BYTES.saturating_add(rank.saturating_mul(8)),
    )?;
    let mut dims = Vec::with_capacity(initial_capacity(rank, 8));
    for _ in 0..rank {
        dims.push(u64::borrow_decode(d)?);
    }
    let count = u64::borrow_decode(d)?;
    let expected = value_count(&dims);
    let shape = checked_shape(tensor, &dims, count).map_err(|err| failed(d.context(), err))?;
    let data = match dtype.byte_width() {
        None => decode_strings(d, count)?,
        Some(width) => {
            let bytes = count.saturating_mul(len_u64(width));
            charge(d.context(), bytes)?;
            // Within the limit, so within usize; take_bytes fails if the payload is shorter.
            let len = usize::try_from(bytes).map_err(|_| DecodeError::LimitExceeded)?;
            let raw = d.borrow_reader().take_bytes(len)?;
            decode_numbers(dtype, raw, tensor).map_err(|err| failed(d.context(), err))?
        }
    };
    Tensor::new(shape, data).map_err(|_| {
        failed(
            d.context(),
            TransferError::ValueCountMismatch {
                tensor,
                shape: dims,
                expected,
                actual: count,
            },
        )
    })
}

/// The number of values `dims` imply (saturating at `u128::MAX`).
fn value_count(dims: &[u64]) -> u128 {
    dims.iter()
        .try_fold(1u128, |acc, &x| acc.checked_mul(u128::from(x)))
        .unwrap_or(u128::MAX)
}

/// A tensor's shape from its wire dimensions, checked against its declared value count; both
/// decoders (from memory and from a connection) refuse with the same errors.
fn checked_shape(tensor: usize, dims: &[u64], count: u64) -> Result<Vec<usize>, TransferError> {
    let expected = value_count(dims);
    if expected != u128::from(count) {
        return Err(TransferError::ValueCountMismatch {
            tensor,
            shape: dims.to_vec(),
            expected,
            actual: count,
        });
    }
    dims.iter()
        .map(|&dim| usize::try_from(dim).map_err(|_| TransferError::DimOutOfRange { tensor, dim }))
        .collect()
}

fn decode_strings<'de, 'c, D: BorrowDecoder<'de, Context = &'c mut DecodeCtx>>(
    d: &mut D,
    count: u64,
) -> Result<TensorData, DecodeError> {
    let mut out = Vec::with_capacity(initial_capacity(count, 1024));
    for _ in 0..count {
        let len = u64::borrow_decode(d)?;
        charge(d.context(), STRING_OVERHEAD_BYTES.saturating_add(len))?;
        let len = usize::try_from(len).map_err(|_| DecodeError::LimitExceeded)?;
        out.push(d.borrow_reader().take_bytes(len)?.to_vec());
    }
    Ok(TensorData::String(out))
}

/// Little-endian bytes (exactly count × width of them) to values, in one pass.
fn decode_numbers(dtype: DType, raw: &[u8], tensor: usize) -> Result<TensorData, TransferError> {
    fn le<T, const N: usize>(raw: &[u8], from: impl Fn([u8; N]) -> T) -> Vec<T> {
        raw.as_chunks::<N>().0.iter().map(|c| from(*c)).collect()
    }
    Ok(match dtype {
        DType::Bool => {
            if let Some(index) = raw.iter().position(|&b| b > 1) {
                return Err(TransferError::InvalidBool {
                    tensor,
                    index,
                    value: raw[index],
                });
            }
            TensorData::Bool(raw.iter().map(|&b| b == 1).collect())
        }
        DType::Int8 => TensorData::Int8(le(raw, i8::from_le_bytes)),
        DType::UInt8 => TensorData::UInt8(raw.to_vec()),
        DType::Int16 => TensorData::Int16(le(raw, i16::from_le_bytes)),
        DType::UInt16 => TensorData::UInt16(le(raw, u16::from_le_bytes)),
        DType::Float16 => TensorData::Float16(le(raw, u16::from_le_bytes)),
        DType::BFloat16 => TensorData::BFloat16(le(raw, u16::from_le_bytes)),
        DType::Int32 => TensorData::Int32(le(raw, i32::from_le_bytes)),
        DType::UInt32 => TensorData::UInt32(le(raw, u32::from_le_bytes)),
        DType::Float32 => TensorData::Float32(le(raw, f32::from_le_bytes)),
        DType::Int64 => TensorData::Int64(le(raw, i64::from_le_bytes)),
        DType::UInt64 => TensorData::UInt64(le(raw, u64::from_le_bytes)),
        DType::Float64 => TensorData::Float64(le(raw, f64::from_le_bytes)),
        // Strings have no width and are decoded by decode_strings.
        DType::String => TensorData::String(Vec::new()),
    })
}

#[path = "codec_stream.rs"]
pub mod stream;

#[path = "codec_auto.rs"]
pub mod auto;

#[path = "codec_header.rs"]
mod header;
pub use header::{frame_checksum, FrameChecksum, FrameHeader};

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
