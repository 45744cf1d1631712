//! A frame's header, parsed and checked, and its checksum computed as the frame's bytes arrive
//! (the format is in the parent module's documentation).

use std::hash::Hasher as _;

use twox_hash::XxHash3_64 as Xxh3;

use super::{
    len_u64, FrameCompression, TransferError, CHECKSUM_AT, FLAG_AT, FORMAT_VERSION, HEADER_LEN,
    MAGIC, UNSUMMED_FLAG,
};

/// A frame's checksum computed piece by piece as its bytes arrive: bytes 0..14 and the payload
/// after the header, as the header's checksum covers them (see [`super::StepDecoder::decode_summed`]).
#[derive(Clone, Default)]
pub struct FrameChecksum {
    sum: Xxh3,
    /// Frame bytes seen so far.
    pub(super) seen: usize,
}

impl std::fmt::Debug for FrameChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameChecksum")
            .field("seen", &self.seen)
            .field("value", &format_args!("{:#018x}", self.value()))
            .finish()
    }
}

impl FrameChecksum {
    /// Adds the frame's next `bytes` (the checksum field itself, bytes 14..22, is skipped).
    pub fn update(&mut self, bytes: &[u8]) {
        let start = self.seen;
        self.seen = start.saturating_add(bytes.len());
        for (from, to) in [(0, CHECKSUM_AT.start), (CHECKSUM_AT.end, usize::MAX)] {
            let lo = from.max(start);
            let hi = to.min(self.seen);
            if lo < hi {
                self.sum.write(&bytes[lo - start..hi - start]);
            }
        }
    }

    /// The checksum of what was seen.
    pub fn value(&self) -> u64 {
        self.sum.finish()
    }
}

/// The checksum a frame's header should hold for its bytes (the field itself is skipped): for
/// tools and tests that build or repair frames by hand.
pub fn frame_checksum(frame: &[u8]) -> u64 {
    let mut sum = FrameChecksum::default();
    sum.update(frame);
    sum.value()
}

/// A frame's header, checked for magic, version, compression flag, length and limit (not yet
/// for the checksum, which needs the payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u8,
    pub compression: FrameCompression,
    /// The uncompressed payload's length.
    pub payload_len: u64,
    pub checksum: u64,
    /// False for an unsummed frame (flag 2): `checksum` is zero and means nothing.
    pub summed: bool,
}

impl FrameHeader {
    /// Reads and checks the header at the start of `frame`.
    pub fn parse(frame: &[u8], max_message_bytes: u64) -> Result<FrameHeader, TransferError> {
        let magic_seen = &frame[..frame.len().min(MAGIC.len())];
        if magic_seen != &MAGIC[..magic_seen.len()] {
            return Err(TransferError::BadMagic {
                found: magic_seen.to_vec(),
            });
        }
        let Some(header) = frame.first_chunk::<HEADER_LEN>() else {
            return Err(TransferError::Truncated {
                needed: len_u64(HEADER_LEN),
                actual: len_u64(frame.len()),
            });
        };
        let version = header[4];
        if version != FORMAT_VERSION {
            return Err(TransferError::UnsupportedVersion {
                version,
                supported: FORMAT_VERSION,
            });
        }
        let (compression, summed) = match header[FLAG_AT] {
            UNSUMMED_FLAG => (FrameCompression::None, false),
            flag => (FrameCompression::from_flag(flag)?, true),
        };
        let mut len = [0u8; 8];
        len.copy_from_slice(&header[6..14]);
        let payload_len = u64::from_le_bytes(len);
        if payload_len > max_message_bytes {
            return Err(TransferError::DeclaredTooLarge {
                declared: payload_len,
                limit: max_message_bytes,
            });
        }
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&header[CHECKSUM_AT]);
        let checksum = u64::from_le_bytes(sum);
        if !summed && checksum != 0 {
            return Err(TransferError::UnsummedChecksum { checksum });
        }
        Ok(FrameHeader {
            version,
            compression,
            payload_len,
            checksum,
            summed,
        })
    }
}
