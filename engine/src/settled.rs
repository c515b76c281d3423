//! Settled objects: one stream's records, rewritten from transit bundles into an object
//! of its own under its bucket's prefix, keyed by the stream ID and the first sequence
//! number it holds (docs/format.md, "Settled object"; storage-layout.md, "Settled
//! objects"; docs/decisions/0006).
//!
//! ```text
//! key: <bucket>/<stream ID, 32 lowercase hex>/<first seq_num, 20 decimal digits>
//!
//! object, slots of one stream, contiguous by sequence number:
//! ┌────────┬────────┬───┬──────────┬────────────────────┬────────────┐
//! │ slot 0 │ slot 1 │ … │ slot n-1 │ index: 32 bytes × n │ footer: 64 │
//! └────────┴────────┴───┴──────────┴────────────────────┴────────────┘
//! 0        ^ offset[1] = offset[0] + len[0]   ^ X = Σ len  ^ X + 32·n  ^ X + 32·n + 64
//! slot i: a transit slot (transit.rs: envelope + chunk), first[i+1] = first[i] + count[i]
//!
//! index entry (32 bytes)
//! 0       8     first sequence number
//! 8       8     last record's timestamp (ms)
//! 16      8     slot offset in the object
//! 24      4     record count
//! 28      4     slot length (64 + the chunk's)
//!
//! footer (the last 64 bytes)
//! 0       4     magic "NVSO"
//! 4       2     format version (1)
//! 6       2     reserved, zero
//! 8       16    stream ID
//! 24      8     first sequence number F (the key's)
//! 32      8     record count R: the object holds F .. F + R - 1
//! 40      8     index offset X (= bytes of slots)
//! 48      4     slot count n (>= 1)
//! 52      4     IndexCRC: CRC-32 of the 32·n index bytes
//! 56      4     reserved, zero
//! 60      4     FooterCRC: CRC-32 of bytes 0..60
//! ```
//!
//! All integers are little-endian. The slots are transit slots as they are, so the
//! settler copies verified slots from bundles without re-encoding them (or envelopes a
//! merged chunk of its own), and a ReadPlan client decodes one unit, the slot, from
//! either kind of object. The record holding seq_num `s` or the first stamped at or after
//! `T` is a binary search of the index, then of the chunk's directory.
//!
//! This module only lays out and decodes bytes and names keys; it never does I/O.

use std::fmt;
use std::ops::Range;

use s3::Bytes;

use crate::chunk::{self, ChunkHeader, ENVELOPE_LEN};
use crate::fixed::{self, Fixed, FixedFault};
use crate::ids::StreamId;
use crate::le::{u32_at, u64_at};
use crate::limits::SEQ_NUM_MAX;
use crate::names::BucketName;
use crate::transit::{
    SLOT_LEN_MIN, Slot, SlotCorruption, SlotEnvelope, SlotParts, parse_lower_hex16,
    parse_padded_u64,
};

/// `"NVSO"`: the first four bytes of a settled object's footer.
pub const FOOTER_MAGIC: [u8; 4] = *b"NVSO";
/// The one settled object format version this build reads and writes.
pub const FORMAT_VERSION: u16 = 1;

const ENTRY_FIRST_SEQ_AT: usize = 0;
const ENTRY_LAST_TS_AT: usize = ENTRY_FIRST_SEQ_AT + 8;
const ENTRY_OFFSET_AT: usize = ENTRY_LAST_TS_AT + 8;
const ENTRY_COUNT_AT: usize = ENTRY_OFFSET_AT + 8;
const ENTRY_LEN_AT: usize = ENTRY_COUNT_AT + 4;
/// Bytes of one index entry.
pub const INDEX_ENTRY_LEN: usize = ENTRY_LEN_AT + 4;

const _: () = assert!(INDEX_ENTRY_LEN == 32);

const MAGIC_AT: usize = fixed::MAGIC_AT;
const VERSION_AT: usize = fixed::VERSION_AT;
const RESERVED_A_AT: usize = VERSION_AT + 2;
const STREAM_ID_AT: usize = RESERVED_A_AT + 2;
const FIRST_SEQ_AT: usize = STREAM_ID_AT + 16;
const RECORD_COUNT_AT: usize = FIRST_SEQ_AT + 8;
const INDEX_OFFSET_AT: usize = RECORD_COUNT_AT + 8;
const SLOT_COUNT_AT: usize = INDEX_OFFSET_AT + 8;
const INDEX_CRC_AT: usize = SLOT_COUNT_AT + 4;
const RESERVED_B_AT: usize = INDEX_CRC_AT + 4;
const FOOTER_CRC_AT: usize = RESERVED_B_AT + 4;
/// Bytes of the footer: the last bytes of every settled object.
pub const FOOTER_LEN: usize = FOOTER_CRC_AT + 4;

const _: () = assert!(FOOTER_LEN == 64);

/// Digits of the zero-padded first sequence number in a key: `u64::MAX` has 20.
const SEQ_DIGITS: usize = 20;

/// Why bytes were refused as a settled object, or as its footer, index or one of its
/// slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    #[error("settled object is {len} bytes, shorter than its {needed}-byte footer")]
    FooterTooShort { len: u64, needed: u64 },
    #[error("settled object footer magic is {found:02x?}, not \"NVSO\"")]
    FooterBadMagic { found: [u8; 4] },
    #[error(
        "settled object format version {version} is unknown (this build reads version \
         {FORMAT_VERSION})"
    )]
    FooterUnknownVersion { version: u16 },
    #[error("settled object footer CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    FooterCrc { stored: u32, computed: u32 },
    #[error("settled object footer reserved field at offset {offset} is not zero")]
    FooterReservedNotZero { offset: u8 },
    #[error("settled object footer lists no slots")]
    NoSlots,
    #[error(
        "settled object from seq_num {first_seq_num} for {record_count} records is empty or \
         runs past the largest sequence number"
    )]
    BadSeqRange { first_seq_num: u64, record_count: u64 },
    #[error(
        "settled object footer puts an index of {slot_count} slots at offset {index_offset}, \
         past the largest object"
    )]
    LengthOverflow { index_offset: u64, slot_count: u32 },
    #[error("settled object is {actual} bytes but its footer implies {expected}")]
    LengthMismatch { expected: u64, actual: u64 },
    #[error(
        "settled object footer names stream {footer_stream} from seq_num {footer_first_seq_num} \
         but its key names stream {key_stream} from seq_num {key_first_seq_num}"
    )]
    KeyMismatch {
        footer_stream: StreamId,
        footer_first_seq_num: u64,
        key_stream: StreamId,
        key_first_seq_num: u64,
    },
    #[error("settled object index is {actual} bytes but its footer implies {expected}")]
    IndexLengthMismatch { expected: u64, actual: u64 },
    #[error("settled object index CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    IndexCrc { stored: u32, computed: u32 },
    #[error("settled object index entry {slot} has no records")]
    EntryNoRecords { slot: u32 },
    #[error("settled object index entry {slot} is {len} bytes, below the smallest slot of {min}")]
    EntryTooShort { slot: u32, len: u32, min: u64 },
    #[error(
        "settled object index entry {slot} is at offset {offset}, not at {expected} where the \
         previous slot ends"
    )]
    SlotOutOfPlace { slot: u32, offset: u64, expected: u64 },
    #[error("settled object slots end at offset {end} but the index starts at {index_offset}")]
    SlotsEndMismatch { end: u64, index_offset: u64 },
    #[error(
        "settled object index entry {slot} starts at seq_num {first_seq_num}, not at \
         {expected} where the previous slot ends: slots are contiguous"
    )]
    NotContiguous { slot: u32, first_seq_num: u64, expected: u64 },
    #[error("settled object footer counts {footer} records but its index {index}")]
    CountMismatch { footer: u64, index: u64 },
    #[error(
        "settled object index entry {slot} has last timestamp {last_timestamp}, below the \
         previous slot's {previous}"
    )]
    TimestampDecreases { slot: u32, last_timestamp: u64, previous: u64 },
    #[error("settled object slot at offset {offset}: {source}")]
    Slot { offset: u64, source: SlotCorruption },
    #[error(
        "settled object slot at offset {offset} belongs to stream {found}, not to the \
         object's stream {expected}"
    )]
    StreamMismatch { offset: u64, found: StreamId, expected: StreamId },
    #[error(
        "settled object slot at offset {offset}: the index says {field} {index} but the slot \
         says {slot}"
    )]
    IndexDisagrees { offset: u64, field: &'static str, index: u64, slot: u64 },
    #[error(
        "settled object slot at offset {offset} starts at timestamp {first_timestamp}, below \
         the previous slot's last timestamp {previous}"
    )]
    ChunkTimestampDecreases { offset: u64, first_timestamp: u64, previous: u64 },
}

/// Why [`SettledBuilder::push`] refused a slot. Each is a bug of the caller (the settler
/// feeds one stream's slots in order); the object is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PushRefused {
    #[error("slot refused: {0}")]
    Slot(#[from] SlotCorruption),
    #[error("slot of stream {found} cannot go into a settled object of stream {expected}")]
    WrongStream { found: StreamId, expected: StreamId },
    #[error("slot starts at seq_num {first_seq_num}, not at the object's next seq_num {expected}")]
    NotContiguous { first_seq_num: u64, expected: u64 },
    #[error("slot starts at timestamp {first_timestamp}, below the object's last {previous}")]
    TimestampDecreases { first_timestamp: u64, previous: u64 },
    #[error("settled object already holds {slots} slots, the most one index lists")]
    TooManySlots { slots: u32 },
}

/// Why a string is not a settled object key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("settled key is not <bucket>/<stream id>/<first seq_num>")]
    Shape,
    #[error("settled key's bucket is not a valid bucket name")]
    Bucket,
    #[error("settled key's stream id is not 32 lowercase hex digits")]
    StreamId,
    #[error("settled key's first seq_num is not 20 decimal digits of a sequence number")]
    FirstSeqNum,
}

/// A settled object's key: `<bucket>/<stream ID, 32 lowercase hex>/<first seq_num, 20
/// digits>`. Zero-padding makes a listing of [`stream_prefix`] come back in sequence
/// order; the stream ID (never reused) makes the key unique for the stream's life.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SettledKey {
    pub bucket: BucketName,
    pub stream_id: StreamId,
    pub first_seq_num: u64,
}

impl SettledKey {
    /// Parses a key printed by [`fmt::Display`]; anything else is refused.
    pub fn parse(key: &str) -> Result<Self, KeyError> {
        let mut parts = key.split('/');
        let (Some(bucket), Some(stream), Some(first), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(KeyError::Shape);
        };
        let bucket = BucketName::parse(bucket).map_err(|_| KeyError::Bucket)?;
        let stream_id = StreamId(parse_lower_hex16(stream).ok_or(KeyError::StreamId)?);
        let first_seq_num = parse_padded_u64(first)
            .filter(|&seq| seq <= SEQ_NUM_MAX)
            .ok_or(KeyError::FirstSeqNum)?;
        Ok(Self { bucket, stream_id, first_seq_num })
    }
}

impl fmt::Display for SettledKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{:0width$}",
            self.bucket.as_str(),
            self.stream_id,
            self.first_seq_num,
            width = SEQ_DIGITS
        )
    }
}

/// The prefix of every settled object of one stream: `<bucket>/<stream ID>/`. A listing
/// of it returns the stream's objects in sequence order.
pub fn stream_prefix(bucket: &BucketName, stream_id: StreamId) -> String {
    format!("{}/{stream_id}/", bucket.as_str())
}

/// One entry of a settled object's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub first_seq_num: u64,
    pub record_count: u32,
    pub last_timestamp: u64,
    /// The slot's first byte in the object.
    pub offset: u64,
    /// The slot's length: 64 + the chunk's.
    pub len: u32,
}

impl IndexEntry {
    /// One past the last record's sequence number.
    pub fn end_seq_num(&self) -> u64 {
        self.first_seq_num.saturating_add(u64::from(self.record_count))
    }

    /// The slot's bytes in the object: the range of a GET that fetches it.
    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset.saturating_add(u64::from(self.len))
    }

    /// The chunk's bytes in the object (the slot without its envelope).
    pub fn chunk_range(&self) -> Range<u64> {
        let range = self.range();
        range.start.saturating_add(ENVELOPE_LEN as u64).min(range.end)..range.end
    }

    /// Parses the slot fetched at [`IndexEntry::range`] of an object of `stream_id`, and
    /// checks it is the one this entry describes.
    pub fn parse_slot<'a>(
        &self,
        stream_id: StreamId,
        bytes: &'a [u8],
    ) -> Result<Slot<'a>, Corruption> {
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
        if slot.envelope.stream_id != stream_id {
            return Err(Corruption::StreamMismatch {
                offset,
                found: slot.envelope.stream_id,
                expected: stream_id,
            });
        }
        for (field, index, found) in [
            ("first seq_num", self.first_seq_num, slot.envelope.first_seq_num),
            ("record count", u64::from(self.record_count), u64::from(slot.envelope.record_count)),
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
            first_seq_num: u64_at(bytes, ENTRY_FIRST_SEQ_AT),
            last_timestamp: u64_at(bytes, ENTRY_LAST_TS_AT),
            offset: u64_at(bytes, ENTRY_OFFSET_AT),
            record_count: u32_at(bytes, ENTRY_COUNT_AT),
            len: u32_at(bytes, ENTRY_LEN_AT),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.first_seq_num.to_le_bytes());
        out.extend_from_slice(&self.last_timestamp.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.record_count.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
    }
}

/// A settled object's parsed footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettledFooter {
    pub stream_id: StreamId,
    pub first_seq_num: u64,
    pub record_count: u64,
    /// Where the index starts: the bytes of all slots.
    pub index_offset: u64,
    pub slot_count: u32,
    pub index_crc: u32,
}

impl SettledFooter {
    /// Parses the footer from the last [`FOOTER_LEN`] bytes of `tail`, the end of the
    /// object (a suffix-range GET): magic, version, CRC, reserved fields, at least one
    /// slot, a sequence range that exists, and an object length that fits a u64.
    pub fn parse(tail: &[u8]) -> Result<Self, Corruption> {
        let Some(bytes) = tail.last_chunk::<FOOTER_LEN>() else {
            return Err(Corruption::FooterTooShort {
                len: tail.len() as u64,
                needed: FOOTER_LEN as u64,
            });
        };
        const SHAPE: Fixed<'static> = Fixed {
            magic: FOOTER_MAGIC,
            version: FORMAT_VERSION,
            crc_at: FOOTER_CRC_AT,
            reserved: &[(RESERVED_A_AT, 2), (RESERVED_B_AT, 4)],
        };
        SHAPE.check(bytes).map_err(|fault| match fault {
            FixedFault::BadMagic { found } => Corruption::FooterBadMagic { found },
            FixedFault::UnknownVersion { version } => Corruption::FooterUnknownVersion { version },
            FixedFault::Crc { stored, computed } => Corruption::FooterCrc { stored, computed },
            FixedFault::ReservedNotZero { offset } => Corruption::FooterReservedNotZero { offset },
        })?;
        let footer = Self {
            stream_id: StreamId(bytes[STREAM_ID_AT..FIRST_SEQ_AT].try_into().expect("16 bytes")),
            first_seq_num: u64_at(bytes, FIRST_SEQ_AT),
            record_count: u64_at(bytes, RECORD_COUNT_AT),
            index_offset: u64_at(bytes, INDEX_OFFSET_AT),
            slot_count: u32_at(bytes, SLOT_COUNT_AT),
            index_crc: u32_at(bytes, INDEX_CRC_AT),
        };
        if footer.slot_count == 0 {
            return Err(Corruption::NoSlots);
        }
        let fits = footer.record_count >= 1
            && footer
                .first_seq_num
                .checked_add(footer.record_count - 1)
                .is_some_and(|last| last <= SEQ_NUM_MAX);
        if !fits {
            return Err(Corruption::BadSeqRange {
                first_seq_num: footer.first_seq_num,
                record_count: footer.record_count,
            });
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

    /// One past the last record's sequence number.
    pub fn end_seq_num(&self) -> u64 {
        self.first_seq_num.saturating_add(self.record_count)
    }

    /// Bytes of the index.
    pub fn index_len(&self) -> u64 {
        INDEX_ENTRY_LEN as u64 * u64::from(self.slot_count)
    }

    /// Where the index is in the object.
    pub fn index_range(&self) -> Range<u64> {
        self.index_offset..self.index_offset.saturating_add(self.index_len())
    }

    /// The whole object's length, as this footer lays it out.
    pub fn object_len(&self) -> u64 {
        self.index_range().end.saturating_add(FOOTER_LEN as u64)
    }

    /// The index, when `tail` (the last `tail.len()` bytes of the object, as a suffix GET
    /// returns them) holds all of it; `None` when the index needs a GET of its own.
    pub fn index_in<'a>(&self, tail: &'a [u8]) -> Option<&'a [u8]> {
        let from_end = self.index_len() + FOOTER_LEN as u64;
        let start = usize::try_from((tail.len() as u64).checked_sub(from_end)?).ok()?;
        let len = usize::try_from(self.index_len()).ok()?;
        tail.get(start..start + len)
    }

    /// The object's length (from the store) against the length this footer lays out.
    pub fn check_len(&self, object_len: u64) -> Result<(), Corruption> {
        if object_len != self.object_len() {
            return Err(Corruption::LengthMismatch {
                expected: self.object_len(),
                actual: object_len,
            });
        }
        Ok(())
    }

    /// The footer against the key the object was fetched under.
    pub fn check_key(&self, key: &SettledKey) -> Result<(), Corruption> {
        if self.stream_id != key.stream_id || self.first_seq_num != key.first_seq_num {
            return Err(Corruption::KeyMismatch {
                footer_stream: self.stream_id,
                footer_first_seq_num: self.first_seq_num,
                key_stream: key.stream_id,
                key_first_seq_num: key.first_seq_num,
            });
        }
        Ok(())
    }

    fn write(&self, out: &mut Vec<u8>) {
        let mut bytes = [0u8; FOOTER_LEN];
        bytes[MAGIC_AT..VERSION_AT].copy_from_slice(&FOOTER_MAGIC);
        bytes[VERSION_AT..RESERVED_A_AT].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes[STREAM_ID_AT..FIRST_SEQ_AT].copy_from_slice(self.stream_id.as_bytes());
        bytes[FIRST_SEQ_AT..RECORD_COUNT_AT].copy_from_slice(&self.first_seq_num.to_le_bytes());
        bytes[RECORD_COUNT_AT..INDEX_OFFSET_AT].copy_from_slice(&self.record_count.to_le_bytes());
        bytes[INDEX_OFFSET_AT..SLOT_COUNT_AT].copy_from_slice(&self.index_offset.to_le_bytes());
        bytes[SLOT_COUNT_AT..INDEX_CRC_AT].copy_from_slice(&self.slot_count.to_le_bytes());
        bytes[INDEX_CRC_AT..RESERVED_B_AT].copy_from_slice(&self.index_crc.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..FOOTER_CRC_AT]);
        bytes[FOOTER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&bytes);
    }
}

/// A settled object's parsed index: entries in slot order, which is sequence order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettledIndex {
    entries: Vec<IndexEntry>,
}

impl SettledIndex {
    /// Parses the index bytes the footer describes: their length and CRC, then every
    /// entry: at least one record, a length of at least one slot, slots tiling `[0, index
    /// offset)` in order with no gap and no overlap, sequence numbers contiguous from the
    /// footer's first and adding up to its count, last timestamps never decreasing.
    pub fn parse(footer: &SettledFooter, bytes: &[u8]) -> Result<Self, Corruption> {
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
        let (mut expected_offset, mut expected_seq) = (0u64, footer.first_seq_num);
        for (slot, raw) in (0u32..).zip(bytes.chunks_exact(INDEX_ENTRY_LEN)) {
            let entry = IndexEntry::read(raw);
            if entry.record_count == 0 {
                return Err(Corruption::EntryNoRecords { slot });
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
            if entry.first_seq_num != expected_seq {
                return Err(Corruption::NotContiguous {
                    slot,
                    first_seq_num: entry.first_seq_num,
                    expected: expected_seq,
                });
            }
            // The footer's range fits the sequence numbers, so staying inside it never
            // overflows.
            expected_seq += u64::from(entry.record_count);
            if expected_seq > footer.end_seq_num() {
                return Err(Corruption::CountMismatch {
                    footer: footer.record_count,
                    index: expected_seq - footer.first_seq_num,
                });
            }
            if let Some(previous) = entries.last()
                && entry.last_timestamp < previous.last_timestamp
            {
                return Err(Corruption::TimestampDecreases {
                    slot,
                    last_timestamp: entry.last_timestamp,
                    previous: previous.last_timestamp,
                });
            }
            entries.push(entry);
        }
        if expected_offset != footer.index_offset {
            return Err(Corruption::SlotsEndMismatch {
                end: expected_offset,
                index_offset: footer.index_offset,
            });
        }
        if expected_seq != footer.end_seq_num() {
            return Err(Corruption::CountMismatch {
                footer: footer.record_count,
                index: expected_seq - footer.first_seq_num,
            });
        }
        Ok(Self { entries })
    }

    /// Every entry, in slot (and sequence) order.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// The entry whose slot holds `seq_num`, if this object has it: a binary search.
    pub fn find_seq(&self, seq_num: u64) -> Option<&IndexEntry> {
        let after = self.entries.partition_point(|e| e.first_seq_num <= seq_num);
        let entry = self.entries.get(after.checked_sub(1)?)?;
        (seq_num < entry.end_seq_num()).then_some(entry)
    }

    /// The entry whose slot holds the first record stamped at or after `timestamp`, if
    /// this object has one: the first slot whose last timestamp reaches it.
    pub fn find_time(&self, timestamp: u64) -> Option<&IndexEntry> {
        self.entries.get(self.entries.partition_point(|e| e.last_timestamp < timestamp))
    }

    /// The entries whose slots hold any of `seq_nums`: adjacent slots, so one ranged GET
    /// from the first's offset to the last's end fetches them.
    pub fn covering(&self, seq_nums: Range<u64>) -> &[IndexEntry] {
        if seq_nums.is_empty() {
            return &[];
        }
        let start = self.entries.partition_point(|e| e.end_seq_num() <= seq_nums.start);
        let end = self.entries.partition_point(|e| e.first_seq_num < seq_nums.end);
        &self.entries[start..end.max(start)]
    }
}

/// A whole settled object read from bytes, every slot verified.
#[derive(Clone, Debug)]
pub struct SettledObject<'a> {
    pub footer: SettledFooter,
    pub index: SettledIndex,
    slots: Vec<Slot<'a>>,
}

impl<'a> SettledObject<'a> {
    /// Parses and checks a whole settled object: the footer, the object's length against
    /// it, the index, every slot against its entry and the object's stream, and
    /// timestamps never decreasing from one slot's last record to the next slot's first.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Corruption> {
        let footer = SettledFooter::parse(bytes)?;
        footer.check_len(bytes.len() as u64)?;
        // check_len made every offset below the footer's fit `bytes`, hence usize.
        let index_range = footer.index_range();
        let index = &bytes[index_range.start as usize..index_range.end as usize];
        let index = SettledIndex::parse(&footer, index)?;
        let mut slots: Vec<Slot<'a>> = Vec::with_capacity(index.entries().len());
        for entry in index.entries() {
            let range = entry.range();
            let slot = entry
                .parse_slot(footer.stream_id, &bytes[range.start as usize..range.end as usize])?;
            if let Some(previous) = slots.last() {
                let (first, previous) =
                    (slot.chunk.records.timestamp(0), previous.chunk.header.last_timestamp);
                if first < previous {
                    return Err(Corruption::ChunkTimestampDecreases {
                        offset: entry.offset,
                        first_timestamp: first,
                        previous,
                    });
                }
            }
            slots.push(slot);
        }
        Ok(Self { footer, index, slots })
    }

    /// The slots, in sequence order.
    pub fn slots(&self) -> &[Slot<'a>] {
        &self.slots
    }
}

/// Collects one stream's slots, in sequence order, for one settled object and lays it
/// out: the slots as pushed, then the index and the footer. It never copies a slot; the
/// settler sends the slots' slices in push order, then [`SettledLayout::tail`].
#[derive(Debug)]
pub struct SettledBuilder {
    stream_id: StreamId,
    first_seq_num: u64,
    next_seq_num: u64,
    last_timestamp: u64,
    entries: Vec<IndexEntry>,
    slots_len: u64,
}

impl SettledBuilder {
    /// An empty object of `stream_id` whose first record is `first_seq_num`.
    pub fn new(stream_id: StreamId, first_seq_num: u64) -> Self {
        Self {
            stream_id,
            first_seq_num,
            next_seq_num: first_seq_num,
            last_timestamp: 0,
            entries: Vec::new(),
            slots_len: 0,
        }
    }

    /// Slots pushed so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no slot is in yet.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The sequence number the next slot must start at.
    pub fn next_seq_num(&self) -> u64 {
        self.next_seq_num
    }

    /// The object's length if it were finished now (for the cut toward the target size).
    pub fn object_len(&self) -> u64 {
        self.slots_len + INDEX_ENTRY_LEN as u64 * self.entries.len() as u64 + FOOTER_LEN as u64
    }

    /// Adds one contiguous slot: [`SettledBuilder::push_parts`].
    pub fn push(&mut self, slot: &[u8]) -> Result<(), PushRefused> {
        self.push_parts(SlotParts::of(slot)?)
    }

    /// Adds the next slot (envelope and chunk, as a bundle holds them): it must be of
    /// this stream, start at [`SettledBuilder::next_seq_num`], and not start before the
    /// last timestamp so far. The envelope and the chunk's header are checked and must
    /// agree; the chunk's body is not re-read (debug builds verify the whole slot): the
    /// settler verified it when it read it from its bundle, or it is the shard's own.
    pub fn push_parts(&mut self, slot: SlotParts<'_>) -> Result<(), PushRefused> {
        let envelope = SlotEnvelope::parse(slot.envelope)?;
        if envelope.slot_len() != slot.len() as u64 {
            return Err(SlotCorruption::LengthMismatch {
                expected: envelope.slot_len(),
                actual: slot.len() as u64,
            }
            .into());
        }
        let chunk_bytes = slot.chunk;
        let header =
            ChunkHeader::parse(chunk_bytes).map_err(|source| SlotCorruption::Chunk { source })?;
        envelope.check_agrees(&header)?;
        debug_assert_eq!(
            Slot::parse(&[&slot.envelope[..], slot.chunk].concat()).map(|s| s.envelope),
            Ok(envelope)
        );
        if envelope.stream_id != self.stream_id {
            return Err(PushRefused::WrongStream {
                found: envelope.stream_id,
                expected: self.stream_id,
            });
        }
        if envelope.first_seq_num != self.next_seq_num {
            return Err(PushRefused::NotContiguous {
                first_seq_num: envelope.first_seq_num,
                expected: self.next_seq_num,
            });
        }
        // The first record's timestamp: the first u64 of the chunk's timestamp table,
        // which the length checks above put inside `chunk_bytes`.
        let first_ts_at =
            chunk::HEADER_LEN + header.data_len as usize + 4 * header.record_count as usize;
        let first_timestamp = u64_at(chunk_bytes, first_ts_at);
        if !self.entries.is_empty() && first_timestamp < self.last_timestamp {
            return Err(PushRefused::TimestampDecreases {
                first_timestamp,
                previous: self.last_timestamp,
            });
        }
        if self.entries.len() >= u32::MAX as usize {
            return Err(PushRefused::TooManySlots { slots: u32::MAX });
        }
        let len = u32::try_from(slot.len()).map_err(|_| SlotCorruption::TooLarge {
            chunk_len: u64::from(envelope.chunk_len),
            max: crate::transit::SLOT_LEN_MAX - ENVELOPE_LEN as u64,
        })?;
        self.entries.push(IndexEntry {
            first_seq_num: envelope.first_seq_num,
            record_count: envelope.record_count,
            last_timestamp: header.last_timestamp,
            offset: self.slots_len,
            len,
        });
        self.slots_len += u64::from(len);
        self.next_seq_num = envelope.end_seq_num();
        self.last_timestamp = header.last_timestamp;
        Ok(())
    }

    /// Lays the object out: index and footer after the slots. `None` when no slot was
    /// pushed (an empty object is never written).
    pub fn finish(self) -> Option<SettledLayout> {
        if self.entries.is_empty() {
            return None;
        }
        let mut tail = Vec::with_capacity(INDEX_ENTRY_LEN * self.entries.len() + FOOTER_LEN);
        self.entries.iter().for_each(|entry| entry.write(&mut tail));
        let footer = SettledFooter {
            stream_id: self.stream_id,
            first_seq_num: self.first_seq_num,
            record_count: self.next_seq_num - self.first_seq_num,
            index_offset: self.slots_len,
            slot_count: u32::try_from(self.entries.len()).expect("push caps the slot count"),
            index_crc: crc32fast::hash(&tail),
        };
        footer.write(&mut tail);
        debug_assert_eq!(SettledFooter::parse(&tail), Ok(footer));
        debug_assert_eq!(
            SettledIndex::parse(&footer, &tail[..tail.len() - FOOTER_LEN]).map(|i| i.entries),
            Ok(self.entries.clone())
        );
        Some(SettledLayout { footer, entries: self.entries, tail })
    }
}

/// A finished settled object's layout: where each slot is, and the bytes that end it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettledLayout {
    footer: SettledFooter,
    entries: Vec<IndexEntry>,
    tail: Vec<u8>,
}

impl SettledLayout {
    /// The footer as written.
    pub fn footer(&self) -> &SettledFooter {
        &self.footer
    }

    /// The object's key in `bucket`.
    pub fn key(&self, bucket: BucketName) -> SettledKey {
        SettledKey {
            bucket,
            stream_id: self.footer.stream_id,
            first_seq_num: self.footer.first_seq_num,
        }
    }

    /// The index entries: entry `i` is the slot pushed `i`-th.
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Index and footer: the bytes after the last slot.
    pub fn tail(&self) -> &[u8] {
        &self.tail
    }

    /// The whole object's length.
    pub fn len(&self) -> u64 {
        self.footer.object_len()
    }

    /// Always false: a layout has at least one slot.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The whole object in one 4 KiB-aligned buffer (as `BundleLayout::assemble`), from
    /// the pushed slots in push order.
    ///
    /// # Panics
    /// If a slot is not the length it was pushed with.
    pub fn assemble(&self, slots: &[SlotParts<'_>]) -> Bytes {
        assert_eq!(slots.len(), self.entries.len(), "one slot per push");
        let mut parts = Vec::with_capacity(2 * slots.len() + 1);
        for (slot, entry) in slots.iter().zip(&self.entries) {
            assert_eq!(slot.len() as u64, u64::from(entry.len), "slot at {}", entry.offset);
            parts.push(&slot.envelope[..]);
            parts.push(slot.chunk);
        }
        parts.push(&self.tail);
        crate::aligned::bytes_of(&parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transit::tests::{A, B, slot};
    use proptest::prelude::*;

    fn bucket() -> BucketName {
        BucketName::parse("apps").expect("valid bucket name")
    }

    /// Three slots of stream A: seq 0 (one record), 1-2, 3 (epoch 1).
    fn sample_slots() -> Vec<Vec<u8>> {
        vec![
            slot(A, 0, &[b"hi"], 1_700_000_000_000, 0),
            slot(A, 1, &[b"yo", b"k"], 1_700_000_000_001, 0),
            slot(A, 3, &[b"z"], 1_700_000_000_001, 1),
        ]
    }

    fn build(first: u64, slots: &[Vec<u8>]) -> (SettledLayout, Vec<u8>) {
        let stream = Slot::parse(&slots[0]).expect("valid").envelope.stream_id;
        let mut builder = SettledBuilder::new(stream, first);
        for slot in slots {
            builder.push(slot).expect("contiguous");
        }
        let len = builder.object_len();
        let layout = builder.finish().expect("not empty");
        assert_eq!(layout.len(), len);
        let parts: Vec<SlotParts<'_>> =
            slots.iter().map(|slot| SlotParts::of(slot).expect("whole slots")).collect();
        let bytes = layout.assemble(&parts);
        assert_eq!(bytes.as_ptr() as usize % crate::aligned::ALIGNMENT, 0, "O_DIRECT-ready");
        (layout, bytes.to_vec())
    }

    fn sample_object() -> Vec<u8> {
        build(0, &sample_slots()).1
    }

    fn footer_at(bytes: &[u8]) -> usize {
        bytes.len() - FOOTER_LEN
    }

    fn entry_field(bytes: &[u8], slot: usize, at: usize) -> usize {
        let count = u32_at(bytes, footer_at(bytes) + SLOT_COUNT_AT) as usize;
        footer_at(bytes) - count * INDEX_ENTRY_LEN + slot * INDEX_ENTRY_LEN + at
    }

    fn reseal(bytes: &mut [u8]) {
        let at = footer_at(bytes);
        let count = u32_at(bytes, at + SLOT_COUNT_AT) as usize;
        let index_start = at.saturating_sub(count * INDEX_ENTRY_LEN);
        let index_crc = crc32fast::hash(&bytes[index_start..at]);
        bytes[at + INDEX_CRC_AT..at + RESERVED_B_AT].copy_from_slice(&index_crc.to_le_bytes());
        let crc = crc32fast::hash(&bytes[at..at + FOOTER_CRC_AT]);
        bytes[at + FOOTER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    }

    fn tampered(edit: impl FnOnce(&mut Vec<u8>)) -> Result<(), Corruption> {
        let mut bytes = sample_object();
        edit(&mut bytes);
        reseal(&mut bytes);
        SettledObject::parse(&bytes).map(drop)
    }

    /// An object's bytes from raw entries and slots, bypassing the builder.
    fn raw_object(stream: StreamId, first: u64, count: u64, slots: &[&[u8]]) -> Vec<u8> {
        let mut out: Vec<u8> = slots.concat();
        let mut index = Vec::new();
        let mut offset = 0;
        for slot in slots {
            let parsed = Slot::parse(slot).expect("valid");
            IndexEntry {
                first_seq_num: parsed.envelope.first_seq_num,
                record_count: parsed.envelope.record_count,
                last_timestamp: parsed.chunk.header.last_timestamp,
                offset,
                len: slot.len() as u32,
            }
            .write(&mut index);
            offset += slot.len() as u64;
        }
        let footer = SettledFooter {
            stream_id: stream,
            first_seq_num: first,
            record_count: count,
            index_offset: out.len() as u64,
            slot_count: slots.len() as u32,
            index_crc: crc32fast::hash(&index),
        };
        out.extend_from_slice(&index);
        footer.write(&mut out);
        out
    }

    #[test]
    fn round_trip_and_lookups() {
        let slots = sample_slots();
        let (layout, bytes) = build(0, &slots);
        let object = SettledObject::parse(&bytes).expect("valid");
        assert_eq!(object.footer, *layout.footer());
        assert_eq!(
            (object.footer.stream_id, object.footer.first_seq_num, object.footer.record_count),
            (A, 0, 4)
        );
        assert_eq!(object.index.entries(), layout.entries());
        for (slot, entry) in slots.iter().zip(layout.entries()) {
            let range = entry.range();
            assert_eq!(&bytes[range.start as usize..range.end as usize], slot.as_slice());
            let chunk = entry.chunk_range();
            assert_eq!(&bytes[chunk.start as usize..chunk.end as usize], &slot[ENVELOPE_LEN..]);
        }
        let records: Vec<_> = object
            .slots()
            .iter()
            .flat_map(|s| s.chunk.records.iter().map(|(seq, _, r)| (seq, r.to_vec())))
            .collect();
        assert_eq!(records.len(), 4);
        assert_eq!(records[2], (2, b"\x00k".to_vec()));
        let index = &object.index;
        assert_eq!(index.find_seq(0).map(|e| e.first_seq_num), Some(0));
        assert_eq!(index.find_seq(2).map(|e| e.first_seq_num), Some(1));
        assert_eq!(index.find_seq(3).map(|e| e.first_seq_num), Some(3));
        assert_eq!(index.find_seq(4), None);
        assert_eq!(index.find_time(0).map(|e| e.first_seq_num), Some(0));
        assert_eq!(index.find_time(1_700_000_000_001).map(|e| e.first_seq_num), Some(1));
        assert_eq!(index.find_time(1_700_000_000_002), None);
        let firsts = |r: Range<u64>| -> Vec<u64> {
            index.covering(r).iter().map(|e| e.first_seq_num).collect()
        };
        assert_eq!(firsts(0..1), vec![0]);
        assert_eq!(firsts(2..4), vec![1, 3]);
        assert_eq!(firsts(0..100), vec![0, 1, 3]);
        assert_eq!(firsts(4..9), Vec::<u64>::new());
        assert_eq!(firsts(2..2), Vec::<u64>::new());
        let key = layout.key(bucket());
        assert_eq!(object.footer.check_key(&key), Ok(()));
        // One suffix GET holds the footer and this index.
        let tail = &bytes[bytes.len() - 1000usize.min(bytes.len())..];
        let footer = SettledFooter::parse(tail).expect("footer");
        let parsed = SettledIndex::parse(&footer, footer.index_in(tail).expect("in tail"));
        assert_eq!(parsed.as_ref().map(|i| i.entries()), Ok(layout.entries()));
        assert_eq!(footer.index_in(&bytes[bytes.len() - FOOTER_LEN..]), None);
    }

    #[test]
    fn footer_refusals() {
        let good = sample_object();
        let at = footer_at(&good);
        assert_eq!(
            SettledFooter::parse(&good[at + 1..]),
            Err(Corruption::FooterTooShort { len: 63, needed: 64 })
        );
        assert_eq!(tampered(|b| b[at] = b'X'), Err(Corruption::FooterBadMagic { found: *b"XVSO" }));
        assert_eq!(
            tampered(|b| b[at + VERSION_AT] = 2),
            Err(Corruption::FooterUnknownVersion { version: 2 })
        );
        let mut bad = good.clone();
        bad[at + FIRST_SEQ_AT] ^= 1;
        assert!(matches!(SettledObject::parse(&bad), Err(Corruption::FooterCrc { .. })));
        for (byte, offset) in [(RESERVED_A_AT, RESERVED_A_AT), (RESERVED_B_AT + 3, RESERVED_B_AT)] {
            assert_eq!(
                tampered(|b| b[at + byte] = 1),
                Err(Corruption::FooterReservedNotZero { offset: offset as u8 })
            );
        }
        assert_eq!(
            tampered(|b| b[at + SLOT_COUNT_AT..at + INDEX_CRC_AT].fill(0)),
            Err(Corruption::NoSlots)
        );
        assert_eq!(
            tampered(|b| b[at + RECORD_COUNT_AT..at + INDEX_OFFSET_AT].fill(0)),
            Err(Corruption::BadSeqRange { first_seq_num: 0, record_count: 0 })
        );
        assert_eq!(
            tampered(|b| b[at + FIRST_SEQ_AT..at + RECORD_COUNT_AT].fill(0xFF)),
            Err(Corruption::BadSeqRange { first_seq_num: u64::MAX, record_count: 4 })
        );
        assert!(matches!(
            tampered(|b| b[at + INDEX_OFFSET_AT..at + SLOT_COUNT_AT].fill(0xFF)),
            Err(Corruption::LengthOverflow { .. })
        ));
        assert!(matches!(
            tampered(|b| b[at + INDEX_OFFSET_AT] += 1),
            Err(Corruption::LengthMismatch { .. })
        ));
        let footer = SettledFooter::parse(&good).expect("valid");
        let other = SettledKey { bucket: bucket(), stream_id: B, first_seq_num: 0 };
        assert!(matches!(footer.check_key(&other), Err(Corruption::KeyMismatch { .. })));
        let other = SettledKey { bucket: bucket(), stream_id: A, first_seq_num: 1 };
        assert!(matches!(footer.check_key(&other), Err(Corruption::KeyMismatch { .. })));
    }

    #[test]
    fn index_refusals() {
        let good = sample_object();
        let footer = SettledFooter::parse(&good).expect("valid");
        let index = &good[footer.index_range().start as usize..footer_at(&good)];
        assert_eq!(
            SettledIndex::parse(&footer, &index[..95]),
            Err(Corruption::IndexLengthMismatch { expected: 96, actual: 95 })
        );
        let mut bad = good.clone();
        bad[entry_field(&good, 0, ENTRY_LAST_TS_AT)] ^= 1;
        assert!(matches!(SettledObject::parse(&bad), Err(Corruption::IndexCrc { .. })));
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 1, ENTRY_COUNT_AT);
                b[at..at + 4].fill(0);
            }),
            Err(Corruption::EntryNoRecords { slot: 1 })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 1, ENTRY_LEN_AT);
                b[at..at + 4].copy_from_slice(&64u32.to_le_bytes());
            }),
            Err(Corruption::EntryTooShort { slot: 1, len: 64, min: SLOT_LEN_MIN })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 1, ENTRY_OFFSET_AT);
                b[at] += 1;
            }),
            Err(Corruption::SlotOutOfPlace { slot: 1, offset: 144, expected: 143 })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 1, ENTRY_OFFSET_AT);
                b[at] -= 1;
            }),
            Err(Corruption::SlotOutOfPlace { slot: 1, offset: 142, expected: 143 })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 2, ENTRY_LEN_AT);
                b[at] += 1;
            }),
            Err(Corruption::SlotsEndMismatch {
                end: footer.index_offset + 1,
                index_offset: footer.index_offset
            })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 2, ENTRY_LEN_AT);
                b[at] -= 1;
            }),
            Err(Corruption::SlotsEndMismatch {
                end: footer.index_offset - 1,
                index_offset: footer.index_offset
            })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 2, ENTRY_FIRST_SEQ_AT);
                b[at] = 4;
            }),
            Err(Corruption::NotContiguous { slot: 2, first_seq_num: 4, expected: 3 })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 0, ENTRY_FIRST_SEQ_AT);
                b[at] = 1;
            }),
            Err(Corruption::NotContiguous { slot: 0, first_seq_num: 1, expected: 0 })
        );
        assert_eq!(
            tampered(|b| {
                let at = footer_at(b) + RECORD_COUNT_AT;
                b[at] = 5;
            }),
            Err(Corruption::CountMismatch { footer: 5, index: 4 })
        );
        assert_eq!(
            tampered(|b| {
                let at = footer_at(b) + RECORD_COUNT_AT;
                b[at] = 3;
            }),
            Err(Corruption::CountMismatch { footer: 3, index: 4 })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 2, ENTRY_LAST_TS_AT);
                b[at..at + 8].copy_from_slice(&1_699_999_999_999u64.to_le_bytes());
            }),
            Err(Corruption::TimestampDecreases {
                slot: 2,
                last_timestamp: 1_699_999_999_999,
                previous: 1_700_000_000_001
            })
        );
    }

    #[test]
    fn object_refuses_slots_that_do_not_belong() {
        let good = sample_object();
        let footer = SettledFooter::parse(&good).expect("valid");
        let index = SettledIndex::parse(
            &footer,
            &good[footer.index_range().start as usize..footer_at(&good)],
        )
        .expect("valid");
        let offset = index.entries()[1].offset;
        // A slot of another stream, in an object that is otherwise right.
        let other = slot(B, 0, &[b"hi"], 1, 0);
        assert_eq!(
            SettledObject::parse(&raw_object(A, 0, 1, &[other.as_slice()])).map(drop),
            Err(Corruption::StreamMismatch { offset: 0, found: B, expected: A })
        );
        assert_eq!(
            tampered(|b| {
                let at = entry_field(b, 1, ENTRY_LAST_TS_AT);
                b[at] -= 1;
            }),
            Err(Corruption::IndexDisagrees {
                offset,
                field: "last timestamp",
                index: 1_700_000_000_000,
                slot: 1_700_000_000_001
            })
        );
        assert_eq!(
            tampered(|b| {
                {
                    let at = entry_field(b, 1, ENTRY_COUNT_AT);
                    b[at] = 1;
                }
                {
                    let at = entry_field(b, 2, ENTRY_FIRST_SEQ_AT);
                    b[at] = 2;
                }
                {
                    let at = footer_at(b) + RECORD_COUNT_AT;
                    b[at] = 3;
                }
            }),
            Err(Corruption::IndexDisagrees { offset, field: "record count", index: 1, slot: 2 })
        );
        let mut bad = good.clone();
        bad[offset as usize + 40] ^= 1; // the slot's leader epoch: its CRC catches it
        assert!(matches!(
            SettledObject::parse(&bad),
            Err(Corruption::Slot { offset: o, source: SlotCorruption::Crc { .. } }) if o == offset
        ));
        // Chunks whose timestamps go back across a slot boundary (each chunk valid, the
        // index's last timestamps in order).
        let early = slot(A, 0, &[b"a"], 10, 0);
        let late = crate::transit::tests::sealed(A, 1, &[b"b"], 10, 0);
        let mut builder = chunk::ChunkBuilder::new(A, 1, 4096);
        builder.push_record(b"\x00b", 9).expect("fits");
        builder.push_record(b"\x00c", 11).expect("fits");
        let mut back = builder.seal();
        crate::transit::tests::envelop(&mut back, 0).expect("envelops");
        let back = crate::transit::tests::slot_bytes(&back);
        assert_eq!(
            SettledObject::parse(&raw_object(A, 0, 3, &[early.as_slice(), back])).map(drop),
            Err(Corruption::ChunkTimestampDecreases {
                offset: early.len() as u64,
                first_timestamp: 9,
                previous: 10
            })
        );
        let late = crate::transit::tests::slot_bytes(&late);
        assert_eq!(
            SettledObject::parse(&raw_object(A, 0, 2, &[early.as_slice(), late])).map(drop),
            Ok(())
        );
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let good = sample_object();
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                assert!(SettledObject::parse(&bad).is_err(), "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn builder_refusals() {
        let mut builder = SettledBuilder::new(A, 10);
        assert_eq!(
            builder.push(&slot(A, 11, &[b"a"], 5, 0)),
            Err(PushRefused::NotContiguous { first_seq_num: 11, expected: 10 })
        );
        assert_eq!(
            builder.push(&slot(B, 10, &[b"a"], 5, 0)),
            Err(PushRefused::WrongStream { found: B, expected: A })
        );
        assert_eq!(builder.push(&slot(A, 10, &[b"a", b"b"], 5, 0)), Ok(()));
        assert_eq!(builder.next_seq_num(), 12);
        assert_eq!(
            builder.push(&slot(A, 11, &[b"a"], 5, 0)),
            Err(PushRefused::NotContiguous { first_seq_num: 11, expected: 12 })
        );
        assert_eq!(
            builder.push(&slot(A, 12, &[b"a"], 4, 0)),
            Err(PushRefused::TimestampDecreases { first_timestamp: 4, previous: 5 })
        );
        let good = slot(A, 12, &[b"c"], 5, 0);
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(
            builder.push(&bad),
            Err(PushRefused::Slot(SlotCorruption::BadMagic { .. }))
        ));
        assert!(matches!(
            builder.push(&good[..good.len() - 1]),
            Err(PushRefused::Slot(SlotCorruption::LengthMismatch { .. }))
        ));
        assert!(matches!(
            builder.push(&good[..3]),
            Err(PushRefused::Slot(SlotCorruption::TooShort { .. }))
        ));
        let mut bad = good.clone();
        bad[24] = 13; // the envelope's first seq_num, against the chunk's 12
        assert!(matches!(
            builder.push(&bad),
            Err(PushRefused::Slot(SlotCorruption::ChunkMismatch { field: "first seq_num", .. }))
        ));
        assert_eq!(builder.len(), 1, "refusals leave the builder as it was");
        assert_eq!(builder.push(&good), Ok(()));
        let layout = builder.finish().expect("two slots");
        assert_eq!((layout.footer().first_seq_num, layout.footer().record_count), (10, 3));
        assert!(SettledBuilder::new(A, 0).finish().is_none(), "no empty object");
    }

    #[test]
    fn settled_keys() {
        let key = SettledKey { bucket: bucket(), stream_id: A, first_seq_num: 42 };
        let text = key.to_string();
        assert_eq!(text, "apps/abababababababababababababababab/00000000000000000042");
        assert_eq!(SettledKey::parse(&text), Ok(key.clone()));
        assert!(text.starts_with(&stream_prefix(&bucket(), A)));
        let last = SettledKey { first_seq_num: SEQ_NUM_MAX, ..key.clone() };
        assert_eq!(SettledKey::parse(&last.to_string()), Ok(last));
        // Zero-padding: key order is sequence order.
        let (nine, ten) = (
            SettledKey { first_seq_num: 9, ..key.clone() }.to_string(),
            SettledKey { first_seq_num: 10, ..key }.to_string(),
        );
        assert!(nine < ten);
    }

    #[test]
    fn settled_key_refusals() {
        let id = "abababababababababababababababab";
        let seq = "00000000000000000042";
        let parse = |key: String| SettledKey::parse(&key);
        assert_eq!(parse(format!("apps/{id}")), Err(KeyError::Shape));
        assert_eq!(parse(format!("apps/{id}/{seq}/x")), Err(KeyError::Shape));
        assert_eq!(parse(format!("apps/{id}/{seq}/")), Err(KeyError::Shape));
        assert_eq!(parse(format!("Apps/{id}/{seq}")), Err(KeyError::Bucket));
        assert_eq!(parse(format!("_transit/{id}/{seq}")), Err(KeyError::Bucket));
        assert_eq!(parse(format!("apps/{}/{seq}", id.to_uppercase())), Err(KeyError::StreamId));
        assert_eq!(parse(format!("apps/{}/{seq}", &id[1..])), Err(KeyError::StreamId));
        assert_eq!(parse(format!("apps/{id}/42")), Err(KeyError::FirstSeqNum));
        assert_eq!(parse(format!("apps/{id}/+0000000000000000042")), Err(KeyError::FirstSeqNum));
        assert_eq!(
            parse(format!("apps/{id}/{}", u64::MAX)),
            Err(KeyError::FirstSeqNum),
            "u64::MAX is past the last sequence number"
        );
        assert_eq!(parse(format!("apps/{id}/99999999999999999999")), Err(KeyError::FirstSeqNum));
    }

    #[test]
    fn golden_vectors() {
        let key = SettledKey { bucket: bucket(), stream_id: A, first_seq_num: 0 };
        crate::golden::check(
            "settled_vectors.txt",
            &[
                ("object: A@0, A@1-2, A@3 epoch 1", sample_object()),
                ("key: apps, stream ab x16, first 0", key.to_string().into_bytes()),
            ],
        );
    }

    proptest! {
        #[test]
        fn round_trip(
            first in 0u64..1 << 40,
            chunks in prop::collection::vec(
                (prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6), 0u64..5),
                1..10,
            ),
        ) {
            let (mut seq, mut ts) = (first, 0);
            let slots: Vec<Vec<u8>> = chunks
                .iter()
                .map(|(bodies, step)| {
                    ts += step;
                    let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
                    let bytes = slot(A, seq, &refs, ts, 0);
                    seq += bodies.len() as u64;
                    bytes
                })
                .collect();
            let (layout, bytes) = build(first, &slots);
            let object = SettledObject::parse(&bytes).expect("valid");
            prop_assert_eq!(object.index.entries(), layout.entries());
            prop_assert_eq!(object.footer.end_seq_num(), seq);
            for (slot, (entry, parsed)) in slots.iter().zip(layout.entries().iter().zip(object.slots())) {
                let range = entry.range();
                prop_assert_eq!(&bytes[range.start as usize..range.end as usize], slot.as_slice());
                prop_assert_eq!(parsed.chunk.records, Slot::parse(slot).expect("ok").chunk.records);
                prop_assert_eq!(object.index.find_seq(entry.end_seq_num() - 1), Some(entry));
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            mut body in prop::collection::vec(any::<u8>(), 0..600),
            count in 1u32..6,
            first in any::<u64>(),
            records in any::<u64>(),
            fix in any::<bool>(),
        ) {
            let _ = SettledFooter::parse(&body);
            let _ = SettledObject::parse(&body);
            let _ = SettledKey::parse(&String::from_utf8_lossy(&body));
            let index_len = count as usize * INDEX_ENTRY_LEN;
            if fix && body.len() >= index_len {
                let index_offset = (body.len() - index_len) as u64;
                let footer = SettledFooter {
                    stream_id: A,
                    first_seq_num: first % 1000,
                    record_count: records % 50,
                    index_offset,
                    slot_count: count,
                    index_crc: crc32fast::hash(&body[index_offset as usize..]),
                };
                footer.write(&mut body);
                let _ = SettledObject::parse(&body);
            }
        }
    }
}
