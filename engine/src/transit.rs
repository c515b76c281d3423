//! Transit bundles: one immutable object holding the chunks of many streams, written
//! with one PUT so that appends become durable in object storage cheaply, and the slot
//! envelope each chunk travels in (docs/format.md, "Transit bundle"; storage-layout.md,
//! "Slot envelope and transit bundle"; docs/decisions/0006).
//!
//! ```text
//! slot = envelope (64 bytes, the chunk buffer's front reserve) + chunk (L bytes)
//! offset  size  field
//! 0       4     magic "NVSL"
//! 4       2     format version (1)
//! 6       2     reserved, zero
//! 8       16    stream ID
//! 24      8     first sequence number
//! 32      4     record count N (>= 1)
//! 36      4     chunk length L
//! 40      8     leader epoch (0 until leases exist)
//! 48      12    reserved, zero
//! 60      4     SlotCRC: CRC-32 of bytes 0..60 followed by the L chunk bytes
//! 64      L     the chunk (chunk.rs)
//!
//! bundle, slots packed back to back and sorted by (stream ID, first seq_num):
//! ┌────────┬────────┬───┬──────────┬────────────────────┬─────────────┐
//! │ slot 0 │ slot 1 │ … │ slot n-1 │ index: 56 bytes × n │ footer: 64  │
//! └────────┴────────┴───┴──────────┴────────────────────┴─────────────┘
//! 0        ^ offset[1] = offset[0] + len[0]   ^ X = Σ len  ^ X + 56·n   ^ X + 56·n + 64
//!
//! index entry (56 bytes)
//! 0       16    stream ID
//! 16      8     first sequence number
//! 24      8     leader epoch
//! 32      8     last record's timestamp (ms)
//! 40      8     slot offset in the bundle
//! 48      4     record count
//! 52      4     slot length (64 + L)
//!
//! footer (the last 64 bytes)
//! 0       4     magic "NVTB"
//! 4       2     format version (1)
//! 6       2     reserved, zero
//! 8       16    bundle ID (also in the key)
//! 24      8     written at (ms; also in the key)
//! 32      8     index offset X (= bytes of slots)
//! 40      4     slot count n (>= 1)
//! 44      4     IndexCRC: CRC-32 of the 56·n index bytes
//! 48      12    reserved, zero
//! 60      4     FooterCRC: CRC-32 of bytes 0..60
//! ```
//!
//! All integers are little-endian. A reader fetches the footer (and usually the whole
//! index) with one suffix-range GET, then any one slot, or all of one stream's slots,
//! which are adjacent, with one ranged GET.
//!
//! This module only encodes, lays out and decodes bytes: it never does I/O, never draws
//! random IDs or reads the clock (the uploader passes the bundle ID and the time in).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use s3::Bytes;

use crate::chunk::{self, Chunk, ChunkHeader, DIR_ENTRY_LEN, ENVELOPE_LEN};
use crate::fixed::{self, Fixed, FixedFault};
use crate::ids::StreamId;
use crate::le::{u32_at, u64_at};
use crate::limits::SEQ_NUM_MAX;

/// `"NVSL"`: the first four bytes of every slot envelope.
pub const SLOT_MAGIC: [u8; 4] = *b"NVSL";
/// The one slot envelope format version this build reads and writes.
pub const SLOT_FORMAT_VERSION: u16 = 1;
/// `"NVTB"`: the first four bytes of a bundle's footer.
pub const FOOTER_MAGIC: [u8; 4] = *b"NVTB";
/// The one bundle (index and footer) format version this build reads and writes.
pub const BUNDLE_FORMAT_VERSION: u16 = 1;

const MAGIC_AT: usize = fixed::MAGIC_AT;
const VERSION_AT: usize = fixed::VERSION_AT;
const RESERVED_A_AT: usize = VERSION_AT + 2;
const STREAM_ID_AT: usize = RESERVED_A_AT + 2;
const FIRST_SEQ_AT: usize = STREAM_ID_AT + 16;
const COUNT_AT: usize = FIRST_SEQ_AT + 8;
const CHUNK_LEN_AT: usize = COUNT_AT + 4;
const LEADER_EPOCH_AT: usize = CHUNK_LEN_AT + 4;
const RESERVED_B_AT: usize = LEADER_EPOCH_AT + 8;
const SLOT_CRC_AT: usize = RESERVED_B_AT + 12;
/// Bytes of a slot envelope: exactly the reserve every chunk buffer keeps in front of its
/// chunk, so enveloping a chunk never copies it.
pub const SLOT_ENVELOPE_LEN: usize = SLOT_CRC_AT + 4;

const _: () = assert!(SLOT_ENVELOPE_LEN == ENVELOPE_LEN, "the envelope fills the front reserve");

/// The smallest slot: envelope, chunk header, one one-byte record and its directory entry.
pub const SLOT_LEN_MIN: u64 = (SLOT_ENVELOPE_LEN + chunk::HEADER_LEN + 1 + DIR_ENTRY_LEN) as u64;
/// The largest slot: its length is a u32 in the index.
pub const SLOT_LEN_MAX: u64 = u32::MAX as u64;

const ENTRY_STREAM_ID_AT: usize = 0;
const ENTRY_FIRST_SEQ_AT: usize = ENTRY_STREAM_ID_AT + 16;
const ENTRY_LEADER_EPOCH_AT: usize = ENTRY_FIRST_SEQ_AT + 8;
const ENTRY_LAST_TS_AT: usize = ENTRY_LEADER_EPOCH_AT + 8;
const ENTRY_OFFSET_AT: usize = ENTRY_LAST_TS_AT + 8;
const ENTRY_COUNT_AT: usize = ENTRY_OFFSET_AT + 8;
const ENTRY_LEN_AT: usize = ENTRY_COUNT_AT + 4;
/// Bytes of one index entry.
pub const INDEX_ENTRY_LEN: usize = ENTRY_LEN_AT + 4;

const _: () = assert!(INDEX_ENTRY_LEN == 56);

const FOOTER_MAGIC_AT: usize = fixed::MAGIC_AT;
const FOOTER_VERSION_AT: usize = fixed::VERSION_AT;
const FOOTER_RESERVED_A_AT: usize = FOOTER_VERSION_AT + 2;
const BUNDLE_ID_AT: usize = FOOTER_RESERVED_A_AT + 2;
const WRITTEN_AT_AT: usize = BUNDLE_ID_AT + 16;
const INDEX_OFFSET_AT: usize = WRITTEN_AT_AT + 8;
const SLOT_COUNT_AT: usize = INDEX_OFFSET_AT + 8;
const INDEX_CRC_AT: usize = SLOT_COUNT_AT + 4;
const FOOTER_RESERVED_B_AT: usize = INDEX_CRC_AT + 4;
const FOOTER_CRC_AT: usize = FOOTER_RESERVED_B_AT + 12;
/// Bytes of the footer: the last bytes of every bundle.
pub const FOOTER_LEN: usize = FOOTER_CRC_AT + 4;

const _: () = assert!(FOOTER_LEN == 64);

/// The key prefix of every transit bundle. A leading `_` is never part of a bucket name
/// (names.rs), so no settled object (`<bucket>/...`) ever lands under it.
pub const TRANSIT_PREFIX: &str = "_transit/";

/// Whether records `first, first + 1, ..., first + count - 1` stay within the sequence
/// numbers (`count >= 1`).
#[inline]
pub(crate) fn seq_range_fits(first_seq_num: u64, count: u32) -> bool {
    count >= 1
        && first_seq_num.checked_add(u64::from(count) - 1).is_some_and(|last| last <= SEQ_NUM_MAX)
}

/// Why the bytes of one slot (envelope and chunk) were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotCorruption {
    #[error("slot is {len} bytes, shorter than its {needed}-byte envelope")]
    TooShort { len: u64, needed: u64 },
    #[error("slot envelope magic is {found:02x?}, not \"NVSL\"")]
    BadMagic { found: [u8; 4] },
    #[error(
        "slot envelope format version {version} is unknown (this build reads version \
         {SLOT_FORMAT_VERSION})"
    )]
    UnknownVersion { version: u16 },
    #[error("slot is {actual} bytes but its envelope implies {expected}")]
    LengthMismatch { expected: u64, actual: u64 },
    #[error("slot CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("slot envelope reserved field at offset {offset} is not zero")]
    ReservedNotZero { offset: u8 },
    #[error(
        "slot envelope from seq_num {first_seq_num} for {count} records is empty or runs past the largest sequence number"
    )]
    BadSeqRange { first_seq_num: u64, count: u32 },
    #[error("chunk of {chunk_len} bytes does not fit a slot of at most {max} bytes")]
    TooLarge { chunk_len: u64, max: u64 },
    #[error("slot chunk is corrupt: {source}")]
    Chunk { source: chunk::Corruption },
    #[error("slot envelope says stream {envelope} but its chunk says stream {chunk}")]
    StreamMismatch { envelope: StreamId, chunk: StreamId },
    #[error("slot envelope says {field} {envelope} but its chunk says {chunk}")]
    ChunkMismatch { field: &'static str, envelope: u64, chunk: u64 },
}

/// Why bytes were refused as a transit bundle, or as its footer, index or one of its slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    #[error("bundle is {len} bytes, shorter than its {needed}-byte footer")]
    FooterTooShort { len: u64, needed: u64 },
    #[error("bundle footer magic is {found:02x?}, not \"NVTB\"")]
    FooterBadMagic { found: [u8; 4] },
    #[error(
        "bundle format version {version} is unknown (this build reads version \
         {BUNDLE_FORMAT_VERSION})"
    )]
    FooterUnknownVersion { version: u16 },
    #[error("bundle footer CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    FooterCrc { stored: u32, computed: u32 },
    #[error("bundle footer reserved field at offset {offset} is not zero")]
    FooterReservedNotZero { offset: u8 },
    #[error("bundle footer lists no slots")]
    NoSlots,
    #[error(
        "bundle footer puts an index of {slot_count} slots at offset {index_offset}, past \
         the largest object"
    )]
    LengthOverflow { index_offset: u64, slot_count: u32 },
    #[error("bundle is {actual} bytes but its footer implies {expected}")]
    LengthMismatch { expected: u64, actual: u64 },
    #[error(
        "bundle footer names bundle {footer_id} written at {footer_written_at_ms} ms but \
         its key names bundle {key_id} written at {key_written_at_ms} ms"
    )]
    KeyMismatch {
        footer_id: BundleId,
        footer_written_at_ms: u64,
        key_id: BundleId,
        key_written_at_ms: u64,
    },
    #[error("bundle index is {actual} bytes but its footer implies {expected}")]
    IndexLengthMismatch { expected: u64, actual: u64 },
    #[error("bundle index CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    IndexCrc { stored: u32, computed: u32 },
    #[error(
        "bundle index entry {slot} from seq_num {first_seq_num} for {count} records is empty \
         or runs past the largest sequence number"
    )]
    EntryBadSeqRange { slot: u32, first_seq_num: u64, count: u32 },
    #[error("bundle index entry {slot} is {len} bytes, below the smallest slot of {min}")]
    EntryTooShort { slot: u32, len: u32, min: u64 },
    #[error(
        "bundle index entry {slot} is at offset {offset}, not at {expected} where the \
         previous slot ends"
    )]
    SlotOutOfPlace { slot: u32, offset: u64, expected: u64 },
    #[error("bundle slots end at offset {end} but the index starts at {index_offset}")]
    SlotsEndMismatch { end: u64, index_offset: u64 },
    #[error(
        "bundle index entry {slot} is out of order: entries are sorted by stream ID, then \
         first seq_num"
    )]
    EntryOutOfOrder { slot: u32 },
    #[error(
        "bundle index entry {slot} starts at seq_num {first_seq_num}, before the stream's \
         previous slot ends at {previous_end}"
    )]
    SeqOverlap { slot: u32, first_seq_num: u64, previous_end: u64 },
    #[error(
        "bundle index entry {slot} has last timestamp {last_timestamp}, below the stream's \
         previous slot's {previous}"
    )]
    TimestampDecreases { slot: u32, last_timestamp: u64, previous: u64 },
    #[error("bundle slot at offset {offset}: {source}")]
    Slot { offset: u64, source: SlotCorruption },
    #[error(
        "bundle slot at offset {offset}: the index says {field} {index} but the slot says {slot}"
    )]
    IndexDisagrees { offset: u64, field: &'static str, index: u64, slot: u64 },
    #[error(
        "bundle slot at offset {offset}: the index says stream {index} but the slot says stream {slot}"
    )]
    IndexStreamDisagrees { offset: u64, index: StreamId, slot: StreamId },
}

/// Why [`BundleBuilder::push`] refused a slot. Each is a bug of the caller: the bundle is
/// unchanged and the other slots can still go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PushRefused {
    #[error("slot refused: {0}")]
    Slot(#[from] SlotCorruption),
    #[error(
        "slot of stream {stream_id} for seq_nums {first_seq_num}..{end_seq_num} overlaps \
         one already in the bundle ({other_first_seq_num}..{other_end_seq_num})"
    )]
    SeqOverlap {
        stream_id: StreamId,
        first_seq_num: u64,
        end_seq_num: u64,
        other_first_seq_num: u64,
        other_end_seq_num: u64,
    },
    #[error(
        "slot of stream {stream_id} at seq_num {first_seq_num} has last timestamp \
         {last_timestamp}, out of order with the stream's slot at seq_num \
         {other_first_seq_num} (last timestamp {other_last_timestamp})"
    )]
    TimestampOutOfOrder {
        stream_id: StreamId,
        first_seq_num: u64,
        last_timestamp: u64,
        other_first_seq_num: u64,
        other_last_timestamp: u64,
    },
    #[error("bundle already holds {slots} slots, the most one index lists")]
    TooManySlots { slots: u32 },
}

/// Why a string is not a transit bundle key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("transit key does not start with \"{TRANSIT_PREFIX}\"")]
    Prefix,
    #[error("transit key is {len} bytes, not {TRANSIT_KEY_LEN}")]
    Length { len: usize },
    #[error("transit key's write time is not 20 decimal digits of a u64")]
    WrittenAt,
    #[error("transit key has no \"-\" between its write time and bundle ID")]
    Separator,
    #[error("transit key's bundle ID is not 32 lowercase hex digits")]
    BundleId,
}

/// A bundle's identity: 16 random bytes drawn by the uploader, in the key and the footer.
/// Printed as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BundleId(pub [u8; 16]);

impl fmt::Display for BundleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for BundleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BundleId({self})")
    }
}

/// 32 lowercase hex digits as 16 bytes: the canonical spelling in keys, so that a key
/// parsed and printed again is the same key.
pub(crate) fn parse_lower_hex16(hex: &str) -> Option<[u8; 16]> {
    if !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    StreamId::from_hex(hex).map(|id| id.0)
}

/// Exactly 20 decimal digits as a u64: the zero-padded numbers in keys.
pub(crate) fn parse_padded_u64(digits: &str) -> Option<u64> {
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Bytes of every transit key: prefix, 20 digits, `-`, 32 hex digits.
pub const TRANSIT_KEY_LEN: usize = TRANSIT_PREFIX.len() + 20 + 1 + 32;

/// A transit bundle's object key: `_transit/<written at, ms, 20 digits>-<bundle ID, 32
/// hex>`. Unique by the random bundle ID, ordered by write time (a listing from
/// [`TransitKey::listing_floor`] finds every bundle written since), and never reused: the
/// uploader puts it with a create-only condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransitKey {
    pub written_at_ms: u64,
    pub bundle_id: BundleId,
}

impl TransitKey {
    /// Parses a key printed by [`fmt::Display`]; anything else is refused.
    pub fn parse(key: &str) -> Result<Self, KeyError> {
        let rest = key.strip_prefix(TRANSIT_PREFIX).ok_or(KeyError::Prefix)?;
        if key.len() != TRANSIT_KEY_LEN {
            return Err(KeyError::Length { len: key.len() });
        }
        // All bytes checked below are ASCII, so these splits fall on char boundaries.
        let (Some(time), Some(sep), Some(id)) = (rest.get(..20), rest.get(20..21), rest.get(21..))
        else {
            return Err(KeyError::WrittenAt);
        };
        let written_at_ms = parse_padded_u64(time).ok_or(KeyError::WrittenAt)?;
        if sep != "-" {
            return Err(KeyError::Separator);
        }
        let bundle_id = BundleId(parse_lower_hex16(id).ok_or(KeyError::BundleId)?);
        Ok(Self { written_at_ms, bundle_id })
    }

    /// A string below every key of a bundle written at or after `written_at_ms` and above
    /// every key written before it: where a listing resumes (S3's `start-after`).
    pub fn listing_floor(written_at_ms: u64) -> String {
        format!("{TRANSIT_PREFIX}{written_at_ms:020}")
    }
}

impl fmt::Display for TransitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TRANSIT_PREFIX}{:020}-{}", self.written_at_ms, self.bundle_id)
    }
}

/// A decoded slot envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotEnvelope {
    pub stream_id: StreamId,
    pub first_seq_num: u64,
    pub record_count: u32,
    pub chunk_len: u32,
    /// The stream's leader epoch when the chunk was built: of two slots for the same
    /// sequence numbers, the higher epoch's is the stream's (0 until leases exist).
    pub leader_epoch: u64,
    /// SlotCRC: CRC-32 of the envelope's bytes 0..60 followed by the chunk.
    pub crc: u32,
}

impl SlotEnvelope {
    /// Envelope and chunk: the slot's length.
    pub fn slot_len(&self) -> u64 {
        SLOT_ENVELOPE_LEN as u64 + u64::from(self.chunk_len)
    }

    /// One past the last record's sequence number.
    pub fn end_seq_num(&self) -> u64 {
        self.first_seq_num.saturating_add(u64::from(self.record_count))
    }

    /// Writes the envelope of `chunk` (exactly one whole chunk) over all of `out`, and
    /// returns it. The chunk's header is checked (its CRC, and its length against
    /// `chunk.len()`); the rest of the chunk is not read: the SlotCRC is combined from the
    /// chunk's own DataCRC and DirectoryCRC (CRC-32 combination), so it vouches for the
    /// bytes as they were when the records were copied in, at no second pass over them.
    pub fn write(
        out: &mut [u8; ENVELOPE_LEN],
        chunk: &[u8],
        leader_epoch: u64,
    ) -> Result<Self, SlotCorruption> {
        let header =
            ChunkHeader::parse(chunk).map_err(|source| SlotCorruption::Chunk { source })?;
        if header.chunk_len() != chunk.len() as u64 {
            let source = chunk::Corruption::LengthMismatch {
                expected: header.chunk_len(),
                actual: chunk.len() as u64,
            };
            return Err(SlotCorruption::Chunk { source });
        }
        let header_bytes = chunk.first_chunk().expect("ChunkHeader::parse checked the length");
        Self::write_for(out, header_bytes, &header, leader_epoch)
    }

    fn write_for(
        out: &mut [u8; ENVELOPE_LEN],
        header_bytes: &[u8; chunk::HEADER_LEN],
        header: &ChunkHeader,
        leader_epoch: u64,
    ) -> Result<Self, SlotCorruption> {
        let too_large =
            SlotCorruption::TooLarge { chunk_len: header.chunk_len(), max: SLOT_LEN_MAX - 64 };
        let chunk_len = u32::try_from(header.chunk_len()).map_err(|_| too_large)?;
        if SLOT_ENVELOPE_LEN as u64 + u64::from(chunk_len) > SLOT_LEN_MAX {
            return Err(too_large);
        }
        out.fill(0);
        out[MAGIC_AT..VERSION_AT].copy_from_slice(&SLOT_MAGIC);
        out[VERSION_AT..RESERVED_A_AT].copy_from_slice(&SLOT_FORMAT_VERSION.to_le_bytes());
        out[STREAM_ID_AT..FIRST_SEQ_AT].copy_from_slice(header.stream_id.as_bytes());
        out[FIRST_SEQ_AT..COUNT_AT].copy_from_slice(&header.first_seq_num.to_le_bytes());
        out[COUNT_AT..CHUNK_LEN_AT].copy_from_slice(&header.record_count.to_le_bytes());
        out[CHUNK_LEN_AT..LEADER_EPOCH_AT].copy_from_slice(&chunk_len.to_le_bytes());
        out[LEADER_EPOCH_AT..RESERVED_B_AT].copy_from_slice(&leader_epoch.to_le_bytes());
        let crc = combined_crc(&out[..SLOT_CRC_AT], header_bytes, header);
        out[SLOT_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        Ok(Self {
            stream_id: header.stream_id,
            first_seq_num: header.first_seq_num,
            record_count: header.record_count,
            chunk_len,
            leader_epoch,
            crc,
        })
    }

    /// Decodes an envelope on its own: magic, version, reserved fields and the sequence
    /// range. The SlotCRC is not verified (it needs the chunk): [`Slot::parse`] does.
    pub fn parse(bytes: &[u8; ENVELOPE_LEN]) -> Result<Self, SlotCorruption> {
        let envelope = Self::decode(bytes)?;
        Self::check_fields(bytes)?;
        Ok(envelope)
    }

    /// Magic and version, then the fields as they are.
    fn decode(bytes: &[u8; ENVELOPE_LEN]) -> Result<Self, SlotCorruption> {
        fixed::check_magic_version(bytes, SLOT_MAGIC, SLOT_FORMAT_VERSION).map_err(|fault| {
            match fault {
                FixedFault::BadMagic { found } => SlotCorruption::BadMagic { found },
                FixedFault::UnknownVersion { version } => {
                    SlotCorruption::UnknownVersion { version }
                }
                other => unreachable!("magic and version checks only: {other:?}"),
            }
        })?;
        Ok(Self {
            stream_id: StreamId(bytes[STREAM_ID_AT..FIRST_SEQ_AT].try_into().expect("16 bytes")),
            first_seq_num: u64_at(bytes, FIRST_SEQ_AT),
            record_count: u32_at(bytes, COUNT_AT),
            chunk_len: u32_at(bytes, CHUNK_LEN_AT),
            leader_epoch: u64_at(bytes, LEADER_EPOCH_AT),
            crc: u32_at(bytes, SLOT_CRC_AT),
        })
    }

    /// Reserved fields zero and a sequence range that exists.
    fn check_fields(bytes: &[u8; ENVELOPE_LEN]) -> Result<(), SlotCorruption> {
        for (offset, width) in [(RESERVED_A_AT, 2), (RESERVED_B_AT, 12)] {
            if bytes[offset..offset + width].iter().any(|&b| b != 0) {
                return Err(SlotCorruption::ReservedNotZero { offset: offset as u8 });
            }
        }
        let (first_seq_num, count) = (u64_at(bytes, FIRST_SEQ_AT), u32_at(bytes, COUNT_AT));
        if !seq_range_fits(first_seq_num, count) {
            return Err(SlotCorruption::BadSeqRange { first_seq_num, count });
        }
        Ok(())
    }

    /// The envelope's fields against its chunk's header.
    pub(crate) fn check_agrees(&self, header: &ChunkHeader) -> Result<(), SlotCorruption> {
        if self.stream_id != header.stream_id {
            return Err(SlotCorruption::StreamMismatch {
                envelope: self.stream_id,
                chunk: header.stream_id,
            });
        }
        for (field, envelope, chunk) in [
            ("first seq_num", self.first_seq_num, header.first_seq_num),
            ("record count", u64::from(self.record_count), u64::from(header.record_count)),
            ("chunk length", u64::from(self.chunk_len), header.chunk_len()),
        ] {
            if envelope != chunk {
                return Err(SlotCorruption::ChunkMismatch { field, envelope, chunk });
            }
        }
        Ok(())
    }
}

/// CRC-32 of `envelope_head` (bytes 0..60), then the chunk whose header is
/// `header_bytes`, from the chunk's own data and directory CRCs: equal to hashing all
/// the bytes when those CRCs hold, which `ChunkHeader`'s writer and `Chunk::parse` ensure.
fn combined_crc(
    envelope_head: &[u8],
    header_bytes: &[u8; chunk::HEADER_LEN],
    header: &ChunkHeader,
) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(envelope_head);
    crc.update(header_bytes);
    crc.combine(&crc32fast::Hasher::new_with_initial_len(
        header.data_crc,
        u64::from(header.data_len),
    ));
    crc.combine(&crc32fast::Hasher::new_with_initial_len(
        header.directory_crc,
        DIR_ENTRY_LEN as u64 * u64::from(header.record_count),
    ));
    crc.finalize()
}

/// A slot given as its two parts: the envelope and the chunk, which need not lie side by
/// side. A chunk lent from a shard's journal buffer is read where it is, and its envelope
/// is written apart (the bytes in front of it are the journal's).
#[derive(Clone, Copy, Debug)]
pub struct SlotParts<'a> {
    pub envelope: &'a [u8; SLOT_ENVELOPE_LEN],
    pub chunk: &'a [u8],
}

impl<'a> SlotParts<'a> {
    /// The parts of a contiguous slot.
    pub fn of(slot: &'a [u8]) -> Result<Self, SlotCorruption> {
        match slot.split_first_chunk::<SLOT_ENVELOPE_LEN>() {
            Some((envelope, chunk)) => Ok(Self { envelope, chunk }),
            None => Err(SlotCorruption::TooShort {
                len: slot.len() as u64,
                needed: SLOT_ENVELOPE_LEN as u64,
            }),
        }
    }

    /// The slot's length: envelope and chunk.
    pub fn len(&self) -> usize {
        SLOT_ENVELOPE_LEN + self.chunk.len()
    }

    /// Never true: a slot has at least its envelope.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// One slot read from bytes: its envelope and its chunk, both verified.
#[derive(Clone, Copy, Debug)]
pub struct Slot<'a> {
    pub envelope: SlotEnvelope,
    pub chunk: Chunk<'a>,
}

impl<'a> Slot<'a> {
    /// Parses exactly one slot: envelope magic and version, the length the envelope
    /// implies, the whole chunk ([`Chunk::parse`]), the SlotCRC, the envelope's reserved
    /// fields and sequence range, and the envelope against the chunk's header.
    ///
    /// The SlotCRC is checked by combining the chunk's verified CRCs with the envelope's
    /// bytes: the same value as hashing the slot, with one pass over it instead of two.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, SlotCorruption> {
        let Some(head) = bytes.first_chunk::<ENVELOPE_LEN>() else {
            return Err(SlotCorruption::TooShort {
                len: bytes.len() as u64,
                needed: ENVELOPE_LEN as u64,
            });
        };
        let envelope = SlotEnvelope::decode(head)?;
        if envelope.slot_len() != bytes.len() as u64 {
            return Err(SlotCorruption::LengthMismatch {
                expected: envelope.slot_len(),
                actual: bytes.len() as u64,
            });
        }
        let chunk_bytes = &bytes[ENVELOPE_LEN..];
        let chunk = Chunk::parse(chunk_bytes).map_err(|source| SlotCorruption::Chunk { source })?;
        let header_bytes = chunk_bytes.first_chunk().expect("a parsed chunk has its header");
        let computed = combined_crc(&head[..SLOT_CRC_AT], header_bytes, &chunk.header);
        if computed != envelope.crc {
            return Err(SlotCorruption::Crc { stored: envelope.crc, computed });
        }
        SlotEnvelope::check_fields(head)?;
        envelope.check_agrees(&chunk.header)?;
        Ok(Self { envelope, chunk })
    }
}

/// One entry of a bundle's index: where a slot is and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub stream_id: StreamId,
    pub first_seq_num: u64,
    pub record_count: u32,
    pub leader_epoch: u64,
    pub last_timestamp: u64,
    /// The slot's first byte in the bundle.
    pub offset: u64,
    /// The slot's length: 64 + the chunk's.
    pub len: u32,
}

impl IndexEntry {
    /// One past the last record's sequence number.
    pub fn end_seq_num(&self) -> u64 {
        self.first_seq_num.saturating_add(u64::from(self.record_count))
    }

    /// The slot's bytes in the bundle: the range of a GET that fetches it.
    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset.saturating_add(u64::from(self.len))
    }

    /// The chunk's bytes in the bundle (the slot without its envelope).
    pub fn chunk_range(&self) -> Range<u64> {
        let range = self.range();
        range.start.saturating_add(ENVELOPE_LEN as u64).min(range.end)..range.end
    }

    /// Parses the slot fetched at [`IndexEntry::range`] and checks it is the one this
    /// entry describes.
    pub fn parse_slot<'a>(&self, bytes: &'a [u8]) -> Result<Slot<'a>, Corruption> {
        let offset = self.offset;
        if bytes.len() as u64 != u64::from(self.len) {
            return Err(Corruption::IndexDisagrees {
                offset,
                field: "slot length",
                index: u64::from(self.len),
                slot: bytes.len() as u64,
            });
        }
        let slot = Slot::parse(bytes).map_err(|source| Corruption::Slot { offset, source })?;
        if slot.envelope.stream_id != self.stream_id {
            return Err(Corruption::IndexStreamDisagrees {
                offset,
                index: self.stream_id,
                slot: slot.envelope.stream_id,
            });
        }
        for (field, index, found) in [
            ("first seq_num", self.first_seq_num, slot.envelope.first_seq_num),
            ("record count", u64::from(self.record_count), u64::from(slot.envelope.record_count)),
            ("leader epoch", self.leader_epoch, slot.envelope.leader_epoch),
            ("last timestamp", self.last_timestamp, slot.chunk.header.last_timestamp),
        ] {
            if index != found {
                return Err(Corruption::IndexDisagrees { offset, field, index, slot: found });
            }
        }
        Ok(slot)
    }

    fn read(bytes: &[u8]) -> Self {
        Self {
            stream_id: StreamId(
                bytes[ENTRY_STREAM_ID_AT..ENTRY_FIRST_SEQ_AT].try_into().expect("16 bytes"),
            ),
            first_seq_num: u64_at(bytes, ENTRY_FIRST_SEQ_AT),
            leader_epoch: u64_at(bytes, ENTRY_LEADER_EPOCH_AT),
            last_timestamp: u64_at(bytes, ENTRY_LAST_TS_AT),
            offset: u64_at(bytes, ENTRY_OFFSET_AT),
            record_count: u32_at(bytes, ENTRY_COUNT_AT),
            len: u32_at(bytes, ENTRY_LEN_AT),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.stream_id.as_bytes());
        out.extend_from_slice(&self.first_seq_num.to_le_bytes());
        out.extend_from_slice(&self.leader_epoch.to_le_bytes());
        out.extend_from_slice(&self.last_timestamp.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.record_count.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }
}

/// A bundle's parsed footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BundleFooter {
    pub bundle_id: BundleId,
    pub written_at_ms: u64,
    /// Where the index starts: the bytes of all slots.
    pub index_offset: u64,
    pub slot_count: u32,
    pub index_crc: u32,
}

impl BundleFooter {
    /// Parses the footer from the last [`FOOTER_LEN`] bytes of `tail`, the end of a bundle
    /// (a suffix-range GET): magic, version, CRC, reserved fields, at least one slot, and
    /// a bundle length that fits a u64. The object's length is checked against
    /// [`BundleFooter::bundle_len`] by [`BundleFooter::check_len`].
    pub fn parse(tail: &[u8]) -> Result<Self, Corruption> {
        let Some(bytes) = tail.last_chunk::<FOOTER_LEN>() else {
            return Err(Corruption::FooterTooShort {
                len: tail.len() as u64,
                needed: FOOTER_LEN as u64,
            });
        };
        const SHAPE: Fixed<'static> = Fixed {
            magic: FOOTER_MAGIC,
            version: BUNDLE_FORMAT_VERSION,
            crc_at: FOOTER_CRC_AT,
            reserved: &[(FOOTER_RESERVED_A_AT, 2), (FOOTER_RESERVED_B_AT, 12)],
        };
        SHAPE.check(bytes).map_err(|fault| match fault {
            FixedFault::BadMagic { found } => Corruption::FooterBadMagic { found },
            FixedFault::UnknownVersion { version } => Corruption::FooterUnknownVersion { version },
            FixedFault::Crc { stored, computed } => Corruption::FooterCrc { stored, computed },
            FixedFault::ReservedNotZero { offset } => Corruption::FooterReservedNotZero { offset },
        })?;
        let footer = Self {
            bundle_id: BundleId(bytes[BUNDLE_ID_AT..WRITTEN_AT_AT].try_into().expect("16")),
            written_at_ms: u64_at(bytes, WRITTEN_AT_AT),
            index_offset: u64_at(bytes, INDEX_OFFSET_AT),
            slot_count: u32_at(bytes, SLOT_COUNT_AT),
            index_crc: u32_at(bytes, INDEX_CRC_AT),
        };
        if footer.slot_count == 0 {
            return Err(Corruption::NoSlots);
        }
        let tail_len = footer.index_len() + FOOTER_LEN as u64;
        if footer.index_offset.checked_add(tail_len).is_none() {
            return Err(Corruption::LengthOverflow {
                index_offset: footer.index_offset,
                slot_count: footer.slot_count,
            });
        }
        Ok(footer)
    }

    /// Bytes of the index.
    pub fn index_len(&self) -> u64 {
        INDEX_ENTRY_LEN as u64 * u64::from(self.slot_count)
    }

    /// Where the index is in the bundle.
    pub fn index_range(&self) -> Range<u64> {
        self.index_offset..self.index_offset.saturating_add(self.index_len())
    }

    /// The whole bundle's length, as this footer lays it out.
    pub fn bundle_len(&self) -> u64 {
        self.index_range().end.saturating_add(FOOTER_LEN as u64)
    }

    /// The index, when `tail` (the last `tail.len()` bytes of the bundle, as a suffix GET
    /// returns them) holds all of it; `None` when the index needs a GET of its own.
    pub fn index_in<'a>(&self, tail: &'a [u8]) -> Option<&'a [u8]> {
        let from_end = self.index_len() + FOOTER_LEN as u64;
        let start = (tail.len() as u64).checked_sub(from_end)?;
        let start = usize::try_from(start).ok()?;
        let len = usize::try_from(self.index_len()).ok()?;
        tail.get(start..start + len)
    }

    /// The object's length (from the store: HEAD, or a ranged GET's total) against the
    /// length this footer lays out.
    pub fn check_len(&self, object_len: u64) -> Result<(), Corruption> {
        if object_len != self.bundle_len() {
            return Err(Corruption::LengthMismatch {
                expected: self.bundle_len(),
                actual: object_len,
            });
        }
        Ok(())
    }

    /// The footer against the key the bundle was fetched under.
    pub fn check_key(&self, key: &TransitKey) -> Result<(), Corruption> {
        if self.bundle_id != key.bundle_id || self.written_at_ms != key.written_at_ms {
            return Err(Corruption::KeyMismatch {
                footer_id: self.bundle_id,
                footer_written_at_ms: self.written_at_ms,
                key_id: key.bundle_id,
                key_written_at_ms: key.written_at_ms,
            });
        }
        Ok(())
    }

    fn write(&self, out: &mut Vec<u8>) {
        let mut bytes = [0u8; FOOTER_LEN];
        bytes[FOOTER_MAGIC_AT..FOOTER_VERSION_AT].copy_from_slice(&FOOTER_MAGIC);
        bytes[FOOTER_VERSION_AT..FOOTER_RESERVED_A_AT]
            .copy_from_slice(&BUNDLE_FORMAT_VERSION.to_le_bytes());
        bytes[BUNDLE_ID_AT..WRITTEN_AT_AT].copy_from_slice(&self.bundle_id.0);
        bytes[WRITTEN_AT_AT..INDEX_OFFSET_AT].copy_from_slice(&self.written_at_ms.to_le_bytes());
        bytes[INDEX_OFFSET_AT..SLOT_COUNT_AT].copy_from_slice(&self.index_offset.to_le_bytes());
        bytes[SLOT_COUNT_AT..INDEX_CRC_AT].copy_from_slice(&self.slot_count.to_le_bytes());
        bytes[INDEX_CRC_AT..FOOTER_RESERVED_B_AT].copy_from_slice(&self.index_crc.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..FOOTER_CRC_AT]);
        bytes[FOOTER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&bytes);
    }
}

/// A bundle's parsed index: its entries in slot order, which is also (stream ID, first
/// seq_num) order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleIndex {
    entries: Vec<IndexEntry>,
}

impl BundleIndex {
    /// Parses the index bytes the footer describes: their length and CRC, then every
    /// entry: a sequence range that exists, a length of at least one slot, slots tiling
    /// `[0, index offset)` in order with no gap and no overlap, entries sorted by (stream
    /// ID, first seq_num), and within a stream no sequence overlap and no timestamp going
    /// back.
    pub fn parse(footer: &BundleFooter, bytes: &[u8]) -> Result<Self, Corruption> {
        if bytes.len() as u64 != footer.index_len() {
            return Err(Corruption::IndexLengthMismatch {
                expected: footer.index_len(),
                actual: bytes.len() as u64,
            });
        }
        let computed = crc32fast::hash(bytes);
        if computed != footer.index_crc {
            return Err(Corruption::IndexCrc { stored: footer.index_crc, computed });
        }
        let mut entries: Vec<IndexEntry> = Vec::with_capacity(footer.slot_count as usize);
        let mut expected_offset = 0u64;
        for (slot, raw) in (0u32..).zip(bytes.chunks_exact(INDEX_ENTRY_LEN)) {
            let entry = IndexEntry::read(raw);
            if !seq_range_fits(entry.first_seq_num, entry.record_count) {
                return Err(Corruption::EntryBadSeqRange {
                    slot,
                    first_seq_num: entry.first_seq_num,
                    count: entry.record_count,
                });
            }
            if u64::from(entry.len) < SLOT_LEN_MIN {
                return Err(Corruption::EntryTooShort { slot, len: entry.len, min: SLOT_LEN_MIN });
            }
            if entry.offset != expected_offset {
                return Err(Corruption::SlotOutOfPlace {
                    slot,
                    offset: entry.offset,
                    expected: expected_offset,
                });
            }
            expected_offset = entry.offset + u64::from(entry.len);
            if expected_offset > footer.index_offset {
                return Err(Corruption::SlotsEndMismatch {
                    end: expected_offset,
                    index_offset: footer.index_offset,
                });
            }
            if let Some(previous) = entries.last() {
                let key = (entry.stream_id, entry.first_seq_num);
                if key <= (previous.stream_id, previous.first_seq_num) {
                    return Err(Corruption::EntryOutOfOrder { slot });
                }
                if entry.stream_id == previous.stream_id {
                    if entry.first_seq_num < previous.end_seq_num() {
                        return Err(Corruption::SeqOverlap {
                            slot,
                            first_seq_num: entry.first_seq_num,
                            previous_end: previous.end_seq_num(),
                        });
                    }
                    if entry.last_timestamp < previous.last_timestamp {
                        return Err(Corruption::TimestampDecreases {
                            slot,
                            last_timestamp: entry.last_timestamp,
                            previous: previous.last_timestamp,
                        });
                    }
                }
            }
            entries.push(entry);
        }
        if expected_offset != footer.index_offset {
            return Err(Corruption::SlotsEndMismatch {
                end: expected_offset,
                index_offset: footer.index_offset,
            });
        }
        Ok(Self { entries })
    }

    /// Every entry, in slot order.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// The entries of one stream, by sequence number: adjacent slots, so one ranged GET
    /// of [`BundleIndex::stream_range`] fetches them all.
    pub fn stream(&self, stream_id: StreamId) -> &[IndexEntry] {
        let start = self.entries.partition_point(|e| e.stream_id < stream_id);
        let end = self.entries.partition_point(|e| e.stream_id <= stream_id);
        &self.entries[start..end]
    }

    /// The bytes of all of one stream's slots in the bundle, if it has any.
    pub fn stream_range(&self, stream_id: StreamId) -> Option<Range<u64>> {
        let slots = self.stream(stream_id);
        Some(slots.first()?.offset..slots.last()?.range().end)
    }

    /// The entry whose slot holds record `seq_num` of `stream_id`, if this bundle has it:
    /// a binary search.
    pub fn find(&self, stream_id: StreamId, seq_num: u64) -> Option<&IndexEntry> {
        let slots = self.stream(stream_id);
        let after = slots.partition_point(|e| e.first_seq_num <= seq_num);
        let entry = slots.get(after.checked_sub(1)?)?;
        (seq_num < entry.end_seq_num()).then_some(entry)
    }
}

/// A whole bundle read from bytes, every slot verified.
#[derive(Clone, Debug)]
pub struct Bundle<'a> {
    pub footer: BundleFooter,
    pub index: BundleIndex,
    slots: Vec<Slot<'a>>,
}

impl<'a> Bundle<'a> {
    /// Parses and checks a whole bundle (recovery, the settler, tests): the footer, the
    /// object's length against it, the index, and every slot against its entry.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Corruption> {
        let footer = BundleFooter::parse(bytes)?;
        footer.check_len(bytes.len() as u64)?;
        // check_len made every offset below the footer's fit `bytes`, hence usize.
        let index_range = footer.index_range();
        let index = &bytes[index_range.start as usize..index_range.end as usize];
        let index = BundleIndex::parse(&footer, index)?;
        let slots = index
            .entries()
            .iter()
            .map(|entry| {
                let range = entry.range();
                entry.parse_slot(&bytes[range.start as usize..range.end as usize])
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { footer, index, slots })
    }

    /// The slots, in index order.
    pub fn slots(&self) -> &[Slot<'a>] {
        &self.slots
    }
}

/// A slot waiting in a [`BundleBuilder`]: its entry (offset not yet known) and the order
/// it was pushed in.
#[derive(Clone, Copy, Debug)]
struct Pending {
    push: u32,
    entry: IndexEntry,
}

/// Collects slots for one bundle and lays it out: slots sorted by (stream ID, first
/// seq_num), then the index and the footer. It never copies a slot: the uploader sends
/// the slots' own slices in [`BundleLayout::order`], then [`BundleLayout::tail`]
/// (vectored, or concatenated with [`BundleLayout::assemble`]).
#[derive(Debug)]
pub struct BundleBuilder {
    bundle_id: BundleId,
    written_at_ms: u64,
    slots: BTreeMap<(StreamId, u64), Pending>,
    slots_len: u64,
}

impl BundleBuilder {
    /// An empty bundle named `bundle_id` (random, from the uploader) written at
    /// `written_at_ms` (the uploader's clock): both go into the key and the footer.
    pub fn new(bundle_id: BundleId, written_at_ms: u64) -> Self {
        Self { bundle_id, written_at_ms, slots: BTreeMap::new(), slots_len: 0 }
    }

    /// Slots pushed so far.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no slot is in yet.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The bundle's length if it were finished now (for the cut by size).
    pub fn bundle_len(&self) -> u64 {
        self.slots_len + INDEX_ENTRY_LEN as u64 * self.slots.len() as u64 + FOOTER_LEN as u64
    }

    /// Adds one contiguous slot: [`BundleBuilder::push_parts`].
    #[cfg(test)]
    pub fn push(&mut self, slot: &[u8]) -> Result<u32, PushRefused> {
        self.push_parts(SlotParts::of(slot)?)
    }

    /// Adds one slot. Returns its push number (0, 1, ...), which
    /// [`BundleLayout::entry_of`] takes.
    ///
    /// The envelope and the chunk's header are checked and must agree; the chunk's body
    /// is this process's own and is not re-read (debug builds verify the whole slot). A
    /// slot overlapping, by sequence number, one of its stream already in, or out of
    /// timestamp order with one, is refused and the bundle left as it was.
    pub fn push_parts(&mut self, slot: SlotParts<'_>) -> Result<u32, PushRefused> {
        let envelope = SlotEnvelope::parse(slot.envelope)?;
        if envelope.slot_len() != slot.len() as u64 {
            return Err(SlotCorruption::LengthMismatch {
                expected: envelope.slot_len(),
                actual: slot.len() as u64,
            }
            .into());
        }
        let header =
            ChunkHeader::parse(slot.chunk).map_err(|source| SlotCorruption::Chunk { source })?;
        envelope.check_agrees(&header)?;
        debug_assert_eq!(
            Slot::parse(&[&slot.envelope[..], slot.chunk].concat()).map(|s| s.envelope),
            Ok(envelope)
        );
        let len = u32::try_from(slot.len()).map_err(|_| SlotCorruption::TooLarge {
            chunk_len: u64::from(envelope.chunk_len),
            max: SLOT_LEN_MAX - SLOT_ENVELOPE_LEN as u64,
        })?;
        let push = u32::try_from(self.slots.len())
            .ok()
            .filter(|&n| n < u32::MAX)
            .ok_or(PushRefused::TooManySlots { slots: u32::MAX })?;
        let entry = IndexEntry {
            stream_id: envelope.stream_id,
            first_seq_num: envelope.first_seq_num,
            record_count: envelope.record_count,
            leader_epoch: envelope.leader_epoch,
            last_timestamp: header.last_timestamp,
            offset: 0,
            len,
        };
        let key = (entry.stream_id, entry.first_seq_num);
        let before = self.slots.range(..key).next_back().map(|(_, p)| p.entry);
        let after = self.slots.range(key..).next().map(|(_, p)| p.entry);
        for other in [before, after].into_iter().flatten() {
            if other.stream_id != entry.stream_id {
                continue;
            }
            let (low, high) = if other.first_seq_num < entry.first_seq_num {
                (other, entry)
            } else {
                (entry, other)
            };
            if high.first_seq_num < low.end_seq_num() {
                return Err(PushRefused::SeqOverlap {
                    stream_id: entry.stream_id,
                    first_seq_num: entry.first_seq_num,
                    end_seq_num: entry.end_seq_num(),
                    other_first_seq_num: other.first_seq_num,
                    other_end_seq_num: other.end_seq_num(),
                });
            }
            if high.last_timestamp < low.last_timestamp {
                return Err(PushRefused::TimestampOutOfOrder {
                    stream_id: entry.stream_id,
                    first_seq_num: entry.first_seq_num,
                    last_timestamp: entry.last_timestamp,
                    other_first_seq_num: other.first_seq_num,
                    other_last_timestamp: other.last_timestamp,
                });
            }
        }
        self.slots.insert(key, Pending { push, entry });
        self.slots_len += u64::from(len);
        Ok(push)
    }

    /// Lays the bundle out: offsets, index and footer. `None` when no slot was pushed (an
    /// empty bundle is never written).
    pub fn finish(self) -> Option<BundleLayout> {
        if self.slots.is_empty() {
            return None;
        }
        let slot_count = u32::try_from(self.slots.len()).expect("push caps the slot count");
        let mut order = Vec::with_capacity(self.slots.len());
        let mut entries = Vec::with_capacity(self.slots.len());
        let mut offset = 0u64;
        for pending in self.slots.into_values() {
            order.push(pending.push);
            entries.push(IndexEntry { offset, ..pending.entry });
            offset += u64::from(pending.entry.len);
        }
        let mut position_of = vec![0u32; order.len()];
        for (position, &push) in (0u32..).zip(&order) {
            position_of[push as usize] = position;
        }
        let mut tail = Vec::with_capacity(INDEX_ENTRY_LEN * entries.len() + FOOTER_LEN);
        entries.iter().for_each(|entry| entry.write(&mut tail));
        let footer = BundleFooter {
            bundle_id: self.bundle_id,
            written_at_ms: self.written_at_ms,
            index_offset: offset,
            slot_count,
            index_crc: crc32fast::hash(&tail),
        };
        footer.write(&mut tail);
        debug_assert_eq!(BundleFooter::parse(&tail), Ok(footer));
        debug_assert_eq!(
            BundleIndex::parse(&footer, &tail[..tail.len() - FOOTER_LEN]).map(|i| i.entries),
            Ok(entries.clone())
        );
        Some(BundleLayout { footer, order, position_of, entries, tail })
    }
}

/// A finished bundle's layout: which slot goes where, and the bytes that end it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleLayout {
    footer: BundleFooter,
    order: Vec<u32>,
    position_of: Vec<u32>,
    entries: Vec<IndexEntry>,
    tail: Vec<u8>,
}

impl BundleLayout {
    /// The footer as written.
    pub fn footer(&self) -> &BundleFooter {
        &self.footer
    }

    /// The bundle's key.
    pub fn key(&self) -> TransitKey {
        TransitKey { written_at_ms: self.footer.written_at_ms, bundle_id: self.footer.bundle_id }
    }

    /// Push numbers in the order their slots' bytes go into the object.
    pub fn order(&self) -> &[u32] {
        &self.order
    }

    /// The index entries, in object order.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Where the slot pushed as `push` lands.
    ///
    /// # Panics
    /// If `push` is not a push number of this bundle.
    pub fn entry_of(&self, push: u32) -> &IndexEntry {
        &self.entries[self.position_of[push as usize] as usize]
    }

    /// Index and footer: the bytes after the last slot.
    pub fn tail(&self) -> &[u8] {
        &self.tail
    }

    /// The whole bundle's length.
    pub fn len(&self) -> u64 {
        self.footer.bundle_len()
    }

    /// Always false: a layout has at least one slot.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The whole bundle in one 4 KiB-aligned buffer (`AlignedBuf::gathered`, so the
    /// local store writes it with O_DIRECT as it is), from the pushed slots
    /// (`slots[push]`).
    ///
    /// # Panics
    /// If a slot is not the length it was pushed with (a different slice than pushed).
    pub fn assemble(&self, slots: &[SlotParts<'_>]) -> Bytes {
        assert_eq!(slots.len(), self.order.len(), "one slot per push");
        let mut parts = Vec::with_capacity(2 * slots.len() + 1);
        for &push in &self.order {
            let slot = slots[push as usize];
            assert_eq!(slot.len() as u64, u64::from(self.entry_of(push).len), "slot {push}");
            parts.push(&slot.envelope[..]);
            parts.push(slot.chunk);
        }
        parts.push(&self.tail);
        crate::aligned::bytes_of(&parts)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::aligned::AlignedBuf;
    use crate::chunk::{ChunkBuilder, ChunkStorage, SealedChunk};
    use proptest::prelude::*;

    pub(crate) const A: StreamId = StreamId([0xAB; 16]);
    pub(crate) const B: StreamId = StreamId([0xCD; 16]);
    const ID: BundleId = BundleId([
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
        0xff,
    ]);
    const WRITTEN_AT: u64 = 1_700_000_000_123;

    /// Writes the slot envelope of a sealed chunk into its buffer's front reserve: after
    /// this, [`slot_bytes`] is the slot.
    pub(crate) fn envelop<B: ChunkStorage>(
        sealed: &mut SealedChunk<B>,
        leader_epoch: u64,
    ) -> Result<SlotEnvelope, SlotCorruption> {
        let header_bytes: [u8; chunk::HEADER_LEN] =
            *sealed.bytes().first_chunk().expect("a sealed chunk starts with its header");
        let header = *sealed.header();
        SlotEnvelope::write_for(sealed.envelope_mut(), &header_bytes, &header, leader_epoch)
    }

    /// A sealed chunk's slot as it lies in its buffer once [`envelop`]ed: one slice.
    pub(crate) fn slot_bytes<B: ChunkStorage>(sealed: &SealedChunk<B>) -> &[u8] {
        &sealed.padded()[..ENVELOPE_LEN + sealed.bytes().len()]
    }

    /// A sealed chunk of `stream` from `first`, one headerless record per body, all
    /// stamped `timestamp`, enveloped at `epoch`.
    pub(crate) fn sealed(
        stream: StreamId,
        first: u64,
        bodies: &[&[u8]],
        timestamp: u64,
        epoch: u64,
    ) -> SealedChunk {
        let size: usize = bodies.iter().map(|b| b.len() + 1).sum();
        let mut builder = ChunkBuilder::new(
            stream,
            first,
            ChunkBuilder::<AlignedBuf>::capacity_for(bodies.len(), size),
        );
        for body in bodies {
            let mut stored = vec![0x00];
            stored.extend_from_slice(body);
            builder.push_record(&stored, timestamp).expect("fits");
        }
        let mut sealed = builder.seal();
        envelop(&mut sealed, epoch).expect("a sealed chunk envelops");
        sealed
    }

    pub(crate) fn slot(
        stream: StreamId,
        first: u64,
        bodies: &[&[u8]],
        timestamp: u64,
        epoch: u64,
    ) -> Vec<u8> {
        slot_bytes(&sealed(stream, first, bodies, timestamp, epoch)).to_vec()
    }

    /// The golden slot: the chunk "one record at 0" of the chunk vectors, epoch 0.
    fn one_record_slot() -> Vec<u8> {
        slot(A, 0, &[b"hi"], 1_700_000_000_000, 0)
    }

    /// Three slots of two streams, pushed out of order so the layout sorts them.
    fn sample_slots() -> Vec<Vec<u8>> {
        vec![
            slot(B, 5, &[b"b5"], 1_700_000_000_002, 1),
            slot(A, 1, &[b"yo", b"k"], 1_700_000_000_001, 0),
            one_record_slot(),
        ]
    }

    fn build(slots: &[Vec<u8>]) -> (BundleLayout, Vec<u8>) {
        let mut builder = BundleBuilder::new(ID, WRITTEN_AT);
        for (i, slot) in slots.iter().enumerate() {
            assert_eq!(builder.push(slot), Ok(i as u32));
        }
        let layout = builder.finish().expect("not empty");
        let parts: Vec<SlotParts<'_>> =
            slots.iter().map(|slot| SlotParts::of(slot).expect("whole slots")).collect();
        let bytes = layout.assemble(&parts);
        assert_eq!(bytes.as_ptr() as usize % crate::aligned::ALIGNMENT, 0, "O_DIRECT-ready");
        (layout, bytes.to_vec())
    }

    fn sample_bundle() -> Vec<u8> {
        build(&sample_slots()).1
    }

    /// Recomputes a slot's CRC over its bytes, so a test reaches the checks behind it.
    fn reseal_slot(bytes: &mut [u8]) {
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes[..SLOT_CRC_AT]);
        crc.update(&bytes[ENVELOPE_LEN..]);
        let crc = crc.finalize();
        bytes[SLOT_CRC_AT..ENVELOPE_LEN].copy_from_slice(&crc.to_le_bytes());
    }

    fn slot_tampered(edit: impl FnOnce(&mut Vec<u8>)) -> Result<(), SlotCorruption> {
        let mut bytes = one_record_slot();
        edit(&mut bytes);
        reseal_slot(&mut bytes);
        Slot::parse(&bytes).map(drop)
    }

    fn footer_at(bytes: &[u8]) -> usize {
        bytes.len() - FOOTER_LEN
    }

    /// Recomputes the index CRC into the footer, then the footer CRC.
    fn reseal_bundle(bytes: &mut [u8]) {
        let at = footer_at(bytes);
        let count = u32_at(bytes, at + SLOT_COUNT_AT) as usize;
        let index_start = at.saturating_sub(count * INDEX_ENTRY_LEN);
        let index_crc = crc32fast::hash(&bytes[index_start..at]);
        bytes[at + INDEX_CRC_AT..at + FOOTER_RESERVED_B_AT]
            .copy_from_slice(&index_crc.to_le_bytes());
        let crc = crc32fast::hash(&bytes[at..at + FOOTER_CRC_AT]);
        bytes[at + FOOTER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    }

    fn bundle_tampered(edit: impl FnOnce(&mut Vec<u8>)) -> Result<(), Corruption> {
        let mut bytes = sample_bundle();
        edit(&mut bytes);
        reseal_bundle(&mut bytes);
        Bundle::parse(&bytes).map(drop)
    }

    /// Where entry `slot`'s field `at` is in the sample bundle.
    fn entry_field(bytes: &[u8], slot: usize, at: usize) -> usize {
        let count = u32_at(bytes, footer_at(bytes) + SLOT_COUNT_AT) as usize;
        footer_at(bytes) - count * INDEX_ENTRY_LEN + slot * INDEX_ENTRY_LEN + at
    }

    #[test]
    fn slot_round_trip() {
        let mut sealed = sealed(A, 7, &[b"a", b"bc"], 42, 3);
        let envelope = envelop(&mut sealed, 3).expect("envelops");
        let bytes = slot_bytes(&sealed);
        let slot = Slot::parse(bytes).expect("valid");
        assert_eq!(slot.envelope, envelope);
        assert_eq!((envelope.stream_id, envelope.first_seq_num, envelope.record_count), (A, 7, 2));
        assert_eq!((envelope.leader_epoch, envelope.slot_len()), (3, bytes.len() as u64));
        assert_eq!(slot.chunk.header, *sealed.header());
        assert_eq!(slot.chunk.records, sealed.records());
        assert_eq!(SlotEnvelope::parse(bytes.first_chunk().expect("64")), Ok(envelope));
    }

    #[test]
    fn combined_crc_is_the_crc_of_the_bytes() {
        let cases: [&[&[u8]]; 2] = [&[b"x"], &[b"", b"longer body", &[7u8; 5000]]];
        for bodies in cases {
            let sealed = sealed(B, 100, bodies, 9, 0);
            let bytes = slot_bytes(&sealed);
            let mut direct = crc32fast::Hasher::new();
            direct.update(&bytes[..SLOT_CRC_AT]);
            direct.update(&bytes[ENVELOPE_LEN..]);
            assert_eq!(u32_at(bytes, SLOT_CRC_AT), direct.finalize());
        }
    }

    #[test]
    fn write_from_chunk_bytes_equals_envelop() {
        let sealed = sealed(A, 3, &[b"abc"], 5, 9);
        let mut out = [0xEE; ENVELOPE_LEN];
        let envelope = SlotEnvelope::write(&mut out, sealed.bytes(), 9).expect("valid chunk");
        assert_eq!(&out, slot_bytes(&sealed).first_chunk::<ENVELOPE_LEN>().expect("64"));
        assert_eq!(envelope.crc, u32_at(&out, SLOT_CRC_AT));
        // The writer checks the chunk's header and length.
        let mut bad = sealed.bytes().to_vec();
        bad.push(0);
        assert!(matches!(
            SlotEnvelope::write(&mut out, &bad, 9),
            Err(SlotCorruption::Chunk { source: chunk::Corruption::LengthMismatch { .. } })
        ));
        assert!(matches!(
            SlotEnvelope::write(&mut out, &bad[..10], 9),
            Err(SlotCorruption::Chunk { source: chunk::Corruption::TooShort { .. } })
        ));
    }

    #[test]
    fn slot_refusals() {
        let good = one_record_slot();
        assert_eq!(
            Slot::parse(&good[..63]).map(drop),
            Err(SlotCorruption::TooShort { len: 63, needed: 64 })
        );
        assert_eq!(
            slot_tampered(|b| b[0] = b'X'),
            Err(SlotCorruption::BadMagic { found: *b"XVSL" })
        );
        assert_eq!(
            slot_tampered(|b| b[VERSION_AT] = 2),
            Err(SlotCorruption::UnknownVersion { version: 2 })
        );
        assert_eq!(
            slot_tampered(|b| b.truncate(b.len() - 1)),
            Err(SlotCorruption::LengthMismatch { expected: 143, actual: 142 })
        );
        // A flipped envelope field: the CRC catches it.
        let mut bad = good.clone();
        bad[LEADER_EPOCH_AT] ^= 1;
        assert!(matches!(Slot::parse(&bad), Err(SlotCorruption::Crc { .. })));
        let mut bad = good.clone();
        bad[SLOT_CRC_AT] ^= 1;
        assert!(matches!(Slot::parse(&bad), Err(SlotCorruption::Crc { .. })));
        // A flipped chunk byte: the chunk's own CRCs catch it first.
        let mut bad = good.clone();
        bad[ENVELOPE_LEN + chunk::HEADER_LEN + 1] ^= 1;
        assert!(matches!(
            Slot::parse(&bad),
            Err(SlotCorruption::Chunk { source: chunk::Corruption::DataCrc { .. } })
        ));
        for (at, offset) in [(RESERVED_A_AT, RESERVED_A_AT), (SLOT_CRC_AT - 1, RESERVED_B_AT)] {
            assert_eq!(
                slot_tampered(|b| b[at] = 1),
                Err(SlotCorruption::ReservedNotZero { offset: offset as u8 })
            );
        }
        assert_eq!(
            slot_tampered(|b| b[COUNT_AT..CHUNK_LEN_AT].fill(0)),
            Err(SlotCorruption::BadSeqRange { first_seq_num: 0, count: 0 })
        );
        assert_eq!(
            slot_tampered(|b| b[FIRST_SEQ_AT..COUNT_AT].fill(0xFF)),
            Err(SlotCorruption::BadSeqRange { first_seq_num: u64::MAX, count: 1 })
        );
    }

    #[test]
    fn slot_refuses_envelope_chunk_disagreement() {
        let mut wrong = [0xAB; 16];
        wrong[0] = 0xAC;
        assert_eq!(
            slot_tampered(|b| b[STREAM_ID_AT] = 0xAC),
            Err(SlotCorruption::StreamMismatch { envelope: StreamId(wrong), chunk: A })
        );
        assert_eq!(
            slot_tampered(|b| b[FIRST_SEQ_AT] = 4),
            Err(SlotCorruption::ChunkMismatch { field: "first seq_num", envelope: 4, chunk: 0 })
        );
        assert_eq!(
            slot_tampered(|b| b[COUNT_AT] = 2),
            Err(SlotCorruption::ChunkMismatch { field: "record count", envelope: 2, chunk: 1 })
        );
    }

    #[test]
    fn envelop_refuses_a_slot_too_large_for_the_index() {
        let header = ChunkHeader {
            stream_id: A,
            first_seq_num: 0,
            record_count: 1,
            data_len: u32::MAX - 64,
            last_timestamp: 0,
            data_crc: 0,
            directory_crc: 0,
        };
        let mut out = [0; ENVELOPE_LEN];
        assert!(matches!(
            SlotEnvelope::write_for(&mut out, &[0u8; 64], &header, 0),
            Err(SlotCorruption::TooLarge { .. })
        ));
    }

    #[test]
    fn bundle_round_trip_sorts_slots() {
        let slots = sample_slots();
        let (layout, bytes) = build(&slots);
        assert_eq!(layout.order(), &[2, 1, 0], "A@0, A@1, then B@5");
        assert_eq!(layout.len(), bytes.len() as u64);
        let bundle = Bundle::parse(&bytes).expect("valid");
        assert_eq!(bundle.footer, *layout.footer());
        assert_eq!(bundle.index.entries(), layout.entries());
        for (push, slot) in slots.iter().enumerate() {
            let entry = layout.entry_of(push as u32);
            let range = entry.range();
            assert_eq!(&bytes[range.start as usize..range.end as usize], slot.as_slice());
            let chunk = entry.chunk_range();
            assert_eq!(&bytes[chunk.start as usize..chunk.end as usize], &slot[ENVELOPE_LEN..]);
        }
        let streams: Vec<_> = bundle
            .slots()
            .iter()
            .map(|s| (s.envelope.stream_id, s.envelope.first_seq_num))
            .collect();
        assert_eq!(streams, vec![(A, 0), (A, 1), (B, 5)]);
        assert_eq!(bundle.slots()[2].envelope.leader_epoch, 1);
        assert_eq!(layout.key().to_string(), format!("_transit/{WRITTEN_AT:020}-{ID}"));
        assert_eq!(bundle.footer.check_key(&layout.key()), Ok(()));
    }

    #[test]
    fn reader_path_footer_index_slot() {
        let bytes = sample_bundle();
        // One suffix GET of 4 KiB holds the footer and this small index.
        let tail = &bytes[bytes.len().saturating_sub(4096)..];
        let footer = BundleFooter::parse(tail).expect("footer");
        footer.check_len(bytes.len() as u64).expect("length");
        let index =
            BundleIndex::parse(&footer, footer.index_in(tail).expect("in tail")).expect("index");
        // A tail too short for the index says so.
        assert_eq!(footer.index_in(&bytes[bytes.len() - FOOTER_LEN - 1..]), None);
        assert_eq!(index.stream(A).len(), 2);
        assert!(index.stream(StreamId([7; 16])).is_empty());
        assert_eq!(index.stream_range(A), Some(0..index.entries()[1].range().end));
        assert_eq!(index.stream_range(StreamId([7; 16])), None);
        assert_eq!(index.find(A, 2).map(|e| e.first_seq_num), Some(1));
        assert_eq!(index.find(A, 3), None);
        assert_eq!(index.find(B, 4), None);
        let entry = index.find(B, 5).expect("B@5");
        let range = entry.range();
        let slot = entry.parse_slot(&bytes[range.start as usize..range.end as usize]).expect("ok");
        assert_eq!(slot.chunk.records.record(0), b"\x00b5");
        // The wrong slot for an entry is refused: another length, or another stream.
        let other = index.entries()[1].range();
        assert!(matches!(
            entry.parse_slot(&bytes[other.start as usize..other.end as usize]),
            Err(Corruption::IndexDisagrees { field: "slot length", index: 143, slot: 157, .. })
        ));
        let other = index.entries()[0].range();
        assert_eq!(
            entry.parse_slot(&bytes[other.start as usize..other.end as usize]).map(drop),
            Err(Corruption::IndexStreamDisagrees { offset: 300, index: B, slot: A })
        );
    }

    #[test]
    fn footer_refusals() {
        let good = sample_bundle();
        let at = footer_at(&good);
        assert_eq!(
            BundleFooter::parse(&good[at + 1..]),
            Err(Corruption::FooterTooShort { len: 63, needed: 64 })
        );
        assert_eq!(
            bundle_tampered(|b| b[at] = b'X'),
            Err(Corruption::FooterBadMagic { found: *b"XVTB" })
        );
        assert_eq!(
            bundle_tampered(|b| b[at + FOOTER_VERSION_AT] = 7),
            Err(Corruption::FooterUnknownVersion { version: 7 })
        );
        let mut bad = good.clone();
        bad[at + WRITTEN_AT_AT] ^= 1;
        assert!(matches!(Bundle::parse(&bad), Err(Corruption::FooterCrc { .. })));
        for (byte, offset) in [
            (FOOTER_RESERVED_A_AT + 1, FOOTER_RESERVED_A_AT),
            (FOOTER_CRC_AT - 1, FOOTER_RESERVED_B_AT),
        ] {
            assert_eq!(
                bundle_tampered(|b| b[at + byte] = 1),
                Err(Corruption::FooterReservedNotZero { offset: offset as u8 })
            );
        }
        assert_eq!(
            bundle_tampered(|b| b[at + SLOT_COUNT_AT..at + INDEX_CRC_AT].fill(0)),
            Err(Corruption::NoSlots)
        );
        assert!(matches!(
            bundle_tampered(|b| b[at + INDEX_OFFSET_AT..at + SLOT_COUNT_AT].fill(0xFF)),
            Err(Corruption::LengthOverflow { .. })
        ));
        assert!(matches!(
            bundle_tampered(|b| b[at + INDEX_OFFSET_AT] += 1),
            Err(Corruption::LengthMismatch { .. })
        ));
        let footer = BundleFooter::parse(&good).expect("valid");
        let other = TransitKey { written_at_ms: WRITTEN_AT, bundle_id: BundleId([9; 16]) };
        assert!(matches!(footer.check_key(&other), Err(Corruption::KeyMismatch { .. })));
        let other = TransitKey { written_at_ms: WRITTEN_AT + 1, bundle_id: ID };
        assert!(matches!(footer.check_key(&other), Err(Corruption::KeyMismatch { .. })));
    }

    #[test]
    fn index_refusals() {
        let good = sample_bundle();
        let footer = BundleFooter::parse(&good).expect("valid");
        let index = &good[footer.index_range().start as usize..footer_at(&good)];
        assert_eq!(
            BundleIndex::parse(&footer, &index[1..]),
            Err(Corruption::IndexLengthMismatch { expected: 168, actual: 167 })
        );
        let mut bad = good.clone();
        bad[entry_field(&good, 1, ENTRY_LAST_TS_AT)] ^= 1;
        assert!(matches!(Bundle::parse(&bad), Err(Corruption::IndexCrc { .. })));
        assert_eq!(
            bundle_tampered(|b| {
                let at = entry_field(b, 1, ENTRY_COUNT_AT);
                b[at..at + 4].fill(0);
            }),
            Err(Corruption::EntryBadSeqRange { slot: 1, first_seq_num: 1, count: 0 })
        );
        assert_eq!(
            bundle_tampered(|b| {
                let at = entry_field(b, 0, ENTRY_FIRST_SEQ_AT);
                b[at..at + 8].copy_from_slice(&SEQ_NUM_MAX.to_le_bytes());
                let at = entry_field(b, 0, ENTRY_COUNT_AT);
                b[at] = 2;
            }),
            Err(Corruption::EntryBadSeqRange { slot: 0, first_seq_num: SEQ_NUM_MAX, count: 2 })
        );
        assert_eq!(
            bundle_tampered(|b| {
                let at = entry_field(b, 2, ENTRY_LEN_AT);
                b[at..at + 4].copy_from_slice(&100u32.to_le_bytes());
            }),
            Err(Corruption::EntryTooShort { slot: 2, len: 100, min: SLOT_LEN_MIN })
        );
    }

    #[test]
    fn index_refuses_slots_out_of_place() {
        let good = sample_bundle();
        let footer = BundleFooter::parse(&good).expect("valid");
        let first_len = u64::from(u32_at(&good, entry_field(&good, 0, ENTRY_LEN_AT)));
        // Overlapping the previous slot.
        assert_eq!(
            bundle_tampered(|b| {
                let at = entry_field(b, 1, ENTRY_OFFSET_AT);
                b[at] -= 1;
            }),
            Err(Corruption::SlotOutOfPlace { slot: 1, offset: first_len - 1, expected: first_len })
        );
        // A gap after it.
        assert_eq!(
            bundle_tampered(|b| {
                let at = entry_field(b, 1, ENTRY_OFFSET_AT);
                b[at] += 1;
            }),
            Err(Corruption::SlotOutOfPlace { slot: 1, offset: first_len + 1, expected: first_len })
        );
        // The first slot not at 0.
        assert!(matches!(
            bundle_tampered(|b| {
                let at = entry_field(b, 0, ENTRY_OFFSET_AT);
                b[at] = 1;
            }),
            Err(Corruption::SlotOutOfPlace { slot: 0, offset: 1, expected: 0 })
        ));
        // The last slot running into the index: outside the slots' part of the object.
        assert_eq!(
            bundle_tampered(|b| {
                let at = entry_field(b, 2, ENTRY_LEN_AT);
                b[at] += 1;
            }),
            Err(Corruption::SlotsEndMismatch {
                end: footer.index_offset + 1,
                index_offset: footer.index_offset
            })
        );
        // ... or short of it.
        assert_eq!(
            bundle_tampered(|b| {
                let at = entry_field(b, 2, ENTRY_LEN_AT);
                b[at] -= 1;
            }),
            Err(Corruption::SlotsEndMismatch {
                end: footer.index_offset - 1,
                index_offset: footer.index_offset
            })
        );
    }

    /// Builds a bundle's bytes from raw entries and slot bytes, bypassing the builder, so
    /// a test can write an index the builder never would.
    fn raw_bundle(entries: &[IndexEntry], slots: &[&[u8]]) -> Vec<u8> {
        let mut out: Vec<u8> = slots.concat();
        let mut index = Vec::new();
        entries.iter().for_each(|e| e.write(&mut index));
        let footer = BundleFooter {
            bundle_id: ID,
            written_at_ms: WRITTEN_AT,
            index_offset: out.len() as u64,
            slot_count: entries.len() as u32,
            index_crc: crc32fast::hash(&index),
        };
        out.extend_from_slice(&index);
        footer.write(&mut out);
        out
    }

    fn entry(slot: &[u8], offset: u64) -> IndexEntry {
        let parsed = Slot::parse(slot).expect("valid");
        IndexEntry {
            stream_id: parsed.envelope.stream_id,
            first_seq_num: parsed.envelope.first_seq_num,
            record_count: parsed.envelope.record_count,
            leader_epoch: parsed.envelope.leader_epoch,
            last_timestamp: parsed.chunk.header.last_timestamp,
            offset,
            len: slot.len() as u32,
        }
    }

    #[test]
    fn index_refuses_order_and_sequence_violations() {
        let a0 = slot(A, 0, &[b"x", b"y"], 10, 0);
        let a1 = slot(A, 1, &[b"z"], 10, 0);
        let a5 = slot(A, 5, &[b"z"], 9, 0);
        let b0 = slot(B, 0, &[b"w"], 1, 0);
        let layout = |slots: &[&Vec<u8>]| {
            let mut offset = 0;
            let entries: Vec<_> = slots
                .iter()
                .map(|s| {
                    let e = entry(s, offset);
                    offset += s.len() as u64;
                    e
                })
                .collect();
            let refs: Vec<&[u8]> = slots.iter().map(|s| s.as_slice()).collect();
            Bundle::parse(&raw_bundle(&entries, &refs)).map(drop)
        };
        assert_eq!(layout(&[&a0, &b0]), Ok(()), "a valid raw bundle");
        assert_eq!(layout(&[&b0, &a0]), Err(Corruption::EntryOutOfOrder { slot: 1 }));
        assert_eq!(layout(&[&a0, &a0]), Err(Corruption::EntryOutOfOrder { slot: 1 }));
        assert_eq!(
            layout(&[&a0, &a1]),
            Err(Corruption::SeqOverlap { slot: 1, first_seq_num: 1, previous_end: 2 })
        );
        assert_eq!(
            layout(&[&a0, &a5]),
            Err(Corruption::TimestampDecreases { slot: 1, last_timestamp: 9, previous: 10 })
        );
    }

    #[test]
    fn bundle_refuses_slots_disagreeing_with_the_index() {
        let good = sample_bundle();
        let footer = BundleFooter::parse(&good).expect("valid");
        let index = BundleIndex::parse(
            &footer,
            &good[footer.index_range().start as usize..footer_at(&good)],
        )
        .expect("valid");
        let b_offset = index.entries()[2].offset;
        for (at, field) in [
            (ENTRY_FIRST_SEQ_AT, "first seq_num"),
            (ENTRY_LEADER_EPOCH_AT, "leader epoch"),
            (ENTRY_LAST_TS_AT, "last timestamp"),
        ] {
            let result = bundle_tampered(|b| {
                let at = entry_field(b, 2, at);
                b[at] ^= 0x40;
            });
            assert!(
                matches!(result, Err(Corruption::IndexDisagrees { offset, field: f, .. }) if offset == b_offset && f == field),
                "{field}: {result:?}"
            );
        }
        assert!(matches!(
            bundle_tampered(|b| {
                let at = entry_field(b, 2, ENTRY_STREAM_ID_AT);
                b[at] = 0xCE;
            }),
            Err(Corruption::IndexStreamDisagrees { .. })
        ));
        // A corrupt slot names its offset.
        let mut bad = good.clone();
        bad[b_offset as usize + LEADER_EPOCH_AT] ^= 1;
        assert!(matches!(
            Bundle::parse(&bad),
            Err(Corruption::Slot { offset, source: SlotCorruption::Crc { .. } }) if offset == b_offset
        ));
        // A record count that differs in both the index and the envelope reaches the chunk.
        let result = bundle_tampered(|b| {
            {
                let at = entry_field(b, 2, ENTRY_COUNT_AT);
                b[at] = 2;
            }
            b[b_offset as usize + COUNT_AT] = 2;
            let (start, end) = (b_offset as usize, footer.index_offset as usize);
            reseal_slot(&mut b[start..end]);
        });
        assert!(matches!(
            result,
            Err(Corruption::Slot {
                source: SlotCorruption::ChunkMismatch { field: "record count", .. },
                ..
            })
        ));
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let good = sample_bundle();
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                assert!(Bundle::parse(&bad).is_err(), "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn builder_refusals() {
        let mut builder = BundleBuilder::new(ID, WRITTEN_AT);
        assert_eq!(builder.push(&slot(A, 10, &[b"a", b"b", b"c"], 50, 0)), Ok(0));
        assert_eq!(builder.push(&slot(B, 11, &[b"a"], 1, 0)), Ok(1), "other streams are free");
        for (first, count) in [(12, 1), (9, 2), (10, 3), (8, 5)] {
            let bodies = vec![b"o".as_slice(); count];
            assert!(
                matches!(
                    builder.push(&slot(A, first, &bodies, 50, 0)),
                    Err(PushRefused::SeqOverlap {
                        other_first_seq_num: 10,
                        other_end_seq_num: 13,
                        ..
                    })
                ),
                "{first}+{count}"
            );
        }
        assert!(matches!(
            builder.push(&slot(A, 13, &[b"late"], 49, 0)),
            Err(PushRefused::TimestampOutOfOrder { other_first_seq_num: 10, .. })
        ));
        assert!(matches!(
            builder.push(&slot(A, 0, &[b"early"], 51, 0)),
            Err(PushRefused::TimestampOutOfOrder { other_first_seq_num: 10, .. })
        ));
        let mut bad = slot(A, 20, &[b"x"], 60, 0);
        bad[0] = b'X';
        assert!(matches!(
            builder.push(&bad),
            Err(PushRefused::Slot(SlotCorruption::BadMagic { .. }))
        ));
        let good = slot(A, 20, &[b"x"], 60, 0);
        assert!(matches!(
            builder.push(&good[..good.len() - 1]),
            Err(PushRefused::Slot(SlotCorruption::LengthMismatch { .. }))
        ));
        assert!(matches!(
            builder.push(&good[..10]),
            Err(PushRefused::Slot(SlotCorruption::TooShort { .. }))
        ));
        let mut bad = good.clone();
        bad[FIRST_SEQ_AT] = 21;
        assert!(matches!(
            builder.push(&bad),
            Err(PushRefused::Slot(SlotCorruption::ChunkMismatch { field: "first seq_num", .. }))
        ));
        assert_eq!(builder.len(), 2, "refusals leave the builder as it was");
        assert_eq!(builder.push(&good), Ok(2));
        let len = builder.bundle_len();
        let layout = builder.finish().expect("three slots");
        assert_eq!(layout.len(), len);
        assert!(BundleBuilder::new(ID, 0).finish().is_none(), "no empty bundle");
    }

    #[test]
    fn transit_keys() {
        let key = TransitKey { written_at_ms: WRITTEN_AT, bundle_id: ID };
        let text = key.to_string();
        assert_eq!(text, "_transit/00000001700000000123-00112233445566778899aabbccddeeff");
        assert_eq!(text.len(), TRANSIT_KEY_LEN);
        assert_eq!(TransitKey::parse(&text), Ok(key));
        let floor = TransitKey::listing_floor(WRITTEN_AT);
        assert!(floor.as_str() < text.as_str());
        assert!(TransitKey::listing_floor(WRITTEN_AT + 1).as_str() > text.as_str());
        let max = TransitKey { written_at_ms: u64::MAX, bundle_id: BundleId([0xFF; 16]) };
        assert_eq!(TransitKey::parse(&max.to_string()), Ok(max));
    }

    #[test]
    fn transit_key_refusals() {
        let good = TransitKey { written_at_ms: WRITTEN_AT, bundle_id: ID }.to_string();
        let with = |at: usize, text: &str| {
            let mut key = good.clone();
            key.replace_range(at..at + text.len(), text);
            TransitKey::parse(&key)
        };
        assert_eq!(TransitKey::parse(&good[1..]), Err(KeyError::Prefix));
        assert_eq!(TransitKey::parse("transit/x"), Err(KeyError::Prefix));
        assert_eq!(
            TransitKey::parse(&format!("{good}0")),
            Err(KeyError::Length { len: TRANSIT_KEY_LEN + 1 })
        );
        assert_eq!(TransitKey::parse(&good[..good.len() - 1]), Err(KeyError::Length { len: 61 }));
        assert_eq!(with(9, "x"), Err(KeyError::WrittenAt));
        assert_eq!(with(9, "+"), Err(KeyError::WrittenAt));
        assert_eq!(with(9, "99999999999999999999"), Err(KeyError::WrittenAt), "over u64");
        assert_eq!(with(29, "_"), Err(KeyError::Separator));
        assert_eq!(with(30, "A"), Err(KeyError::BundleId), "uppercase is not canonical");
        assert_eq!(with(30, "g"), Err(KeyError::BundleId));
        // A multi-byte character never splits a char boundary into a panic.
        let split = format!("_transit/a{}", "é".repeat(26));
        assert_eq!(split.len(), TRANSIT_KEY_LEN);
        assert_eq!(TransitKey::parse(&split), Err(KeyError::WrittenAt));
    }

    #[test]
    fn golden_vectors() {
        let key = TransitKey { written_at_ms: WRITTEN_AT, bundle_id: ID };
        crate::golden::check(
            "transit_vectors.txt",
            &[
                ("slot: one record at 0, epoch 0", one_record_slot()),
                ("bundle: A@0, A@1-2, B@5 epoch 1", sample_bundle()),
                ("key: bundle 00112233..ff at 1700000000123", key.to_string().into_bytes()),
            ],
        );
    }

    /// A bundle's worth of chunks: per slot, a stream (of three), a sequence gap, records
    /// and a timestamp step, turned into valid slots (sequence numbers and timestamps
    /// increase per stream).
    fn slots_strategy() -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(
            (
                0usize..3,
                0u64..3,
                prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6),
                0u64..5,
                0u64..3,
            ),
            1..12,
        )
        .prop_map(|specs| {
            let mut next = [(0u64, 0u64); 3];
            specs
                .into_iter()
                .map(|(stream, gap, bodies, step, epoch)| {
                    let (seq, ts) = &mut next[stream];
                    *seq += gap;
                    *ts += step;
                    let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
                    let id = StreamId([stream as u8 * 0x40; 16]);
                    let bytes = slot(id, *seq, &refs, *ts, epoch);
                    *seq += bodies.len() as u64;
                    bytes
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn round_trip(slots in slots_strategy(), shuffle in any::<u64>()) {
            // Push in a scrambled order: the layout does not depend on it.
            let mut order: Vec<usize> = (0..slots.len()).collect();
            order.sort_by_key(|&i| (i as u64).wrapping_mul(shuffle | 1).rotate_left(17));
            let pushed: Vec<Vec<u8>> = order.iter().map(|&i| slots[i].clone()).collect();
            let (layout, bytes) = build(&pushed);
            let bundle = Bundle::parse(&bytes).expect("valid");
            prop_assert_eq!(bundle.index.entries(), layout.entries());
            prop_assert_eq!(bundle.slots().len(), slots.len());
            for (push, slot) in pushed.iter().enumerate() {
                let entry = layout.entry_of(push as u32);
                let range = entry.range();
                prop_assert_eq!(&bytes[range.start as usize..range.end as usize], slot.as_slice());
                let parsed = entry.parse_slot(slot).expect("same slot");
                let found = bundle.index.find(entry.stream_id, entry.end_seq_num() - 1);
                prop_assert_eq!(found, Some(entry));
                prop_assert_eq!(parsed.chunk.records, Slot::parse(slot).expect("ok").chunk.records);
            }
            let (sorted, _) = build(&slots);
            prop_assert_eq!(sorted.entries(), layout.entries());
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            mut body in prop::collection::vec(any::<u8>(), 0..600),
            count in 1u32..6,
            fix in any::<bool>(),
        ) {
            let _ = Slot::parse(&body);
            let _ = BundleFooter::parse(&body);
            let _ = Bundle::parse(&body);
            let _ = TransitKey::parse(&String::from_utf8_lossy(&body));
            if body.len() >= ENVELOPE_LEN {
                let _ = SlotEnvelope::parse(body.first_chunk().expect("64"));
                let mut slot = body.clone();
                slot[..4].copy_from_slice(&SLOT_MAGIC);
                slot[4..6].copy_from_slice(&1u16.to_le_bytes());
                let _ = Slot::parse(&slot);
            }
            // A valid footer over random slots and a random index, so the index checks run.
            let index_len = count as usize * INDEX_ENTRY_LEN;
            if fix && body.len() >= index_len {
                let index_offset = (body.len() - index_len) as u64;
                let footer = BundleFooter {
                    bundle_id: ID,
                    written_at_ms: 0,
                    index_offset,
                    slot_count: count,
                    index_crc: crc32fast::hash(&body[index_offset as usize..]),
                };
                footer.write(&mut body);
                let _ = Bundle::parse(&body);
            }
        }
    }
}
