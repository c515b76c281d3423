//! The chunk: a run of one stream's consecutive stored records with their directory,
//! built in place in a 4 KiB-aligned buffer (storage-layout.md, "Chunk").
//!
//! ```text
//! offset        size  field
//! 0             4     magic "NVCK"
//! 4             2     format version (1)
//! 6             2     reserved, zero
//! 8             16    stream ID
//! 24            8     first sequence number
//! 32            4     record count (>= 1)
//! 36            4     data length D (bytes of stored records)
//! 40            8     last record's timestamp (ms)
//! 48            4     DataCRC: CRC-32 of the data
//! 52            4     DirectoryCRC: CRC-32 of the end-offset and timestamp tables
//! 56            4     reserved, zero
//! 60            4     HeaderCRC: CRC-32 of bytes 0..60
//! 64            D     data: the stored records back to back (record.rs)
//! 64+D          4·N   end offsets: u32 per record, relative to the data's start
//! 64+D+4N       8·N   timestamps: u64 ms per record, non-decreasing
//! total = 64 + D + 12·N
//! ```
//!
//! All integers are little-endian. Record `i` spans `[end[i-1], end[i])` of the data
//! (`end[-1] = 0`), so it is found in O(1); its sequence number is `first + i`; the first
//! record stamped at or after `T` is a binary search over the timestamp table.
//!
//! The directory sits after the data so a shard can copy each batch's stored records
//! into the buffer exactly once as they arrive and write the directory when the chunk is
//! cut, without knowing the final count in advance.
//!
//! [`Records`] is the one view of "records with a directory" used everywhere: over an
//! open [`ChunkBuilder`], a sealed or parsed chunk, a sub-range of either (to answer a
//! read), and a binary-framing records frame (framing.rs), whose tables are the chunk's
//! own bytes sent as they are.

use crate::aligned::AlignedBuf;
use crate::fixed::{self, Fixed, FixedFault};
use crate::ids::StreamId;
use crate::le::{u32_at, u64_at};
use crate::limits::SEQ_NUM_MAX;
use crate::pieces::Pieces;
use crate::record;

/// `"NVCK"`: the first four bytes of every chunk.
pub const MAGIC: [u8; 4] = *b"NVCK";
/// The one chunk format version this build reads and writes.
pub const FORMAT_VERSION: u16 = 1;

const MAGIC_AT: usize = fixed::MAGIC_AT;
const VERSION_AT: usize = fixed::VERSION_AT;
const RESERVED_A_AT: usize = VERSION_AT + 2;
const STREAM_ID_AT: usize = RESERVED_A_AT + 2;
const FIRST_SEQ_AT: usize = STREAM_ID_AT + 16;
const COUNT_AT: usize = FIRST_SEQ_AT + 8;
const DATA_LEN_AT: usize = COUNT_AT + 4;
const LAST_TS_AT: usize = DATA_LEN_AT + 4;
const DATA_CRC_AT: usize = LAST_TS_AT + 8;
const DIR_CRC_AT: usize = DATA_CRC_AT + 4;
const RESERVED_B_AT: usize = DIR_CRC_AT + 4;
const HEADER_CRC_AT: usize = RESERVED_B_AT + 4;
/// Bytes of the fixed header; the data starts here.
pub const HEADER_LEN: usize = HEADER_CRC_AT + 4;
/// Directory bytes per record: a u32 end offset and a u64 timestamp.
pub const DIR_ENTRY_LEN: usize = END_LEN + TS_LEN;
const END_LEN: usize = 4;
const TS_LEN: usize = 8;

const _: () = assert!(HEADER_LEN == 64, "the header is one cache line and documented as 64 bytes");
const _: () = assert!(HEADER_LEN.is_multiple_of(8));

/// Why a chunk (or a records frame) was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    #[error("chunk is {len} bytes, shorter than its {needed}-byte header")]
    TooShort { len: u64, needed: u64 },
    #[error("chunk magic is {found:02x?}, not \"NVCK\"")]
    BadMagic { found: [u8; 4] },
    #[error(
        "chunk format version {version} is unknown (this build reads version {FORMAT_VERSION})"
    )]
    UnknownVersion { version: u16 },
    #[error("chunk header reserved field at offset {offset} is not zero")]
    ReservedNotZero { offset: u8 },
    #[error("chunk header CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderCrc { stored: u32, computed: u32 },
    #[error("chunk has no records")]
    NoRecords,
    #[error("chunk length is {actual} bytes but its header implies {expected}")]
    LengthMismatch { expected: u64, actual: u64 },
    #[error("chunk directory CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    DirectoryCrc { stored: u32, computed: u32 },
    #[error("chunk data CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    DataCrc { stored: u32, computed: u32 },
    #[error("record {index} has an empty or backward extent (end offset {end} after {start})")]
    BadEndOffset { index: u32, start: u32, end: u32 },
    #[error("records end at offset {end} but the data is {data_len} bytes")]
    DataLengthMismatch { end: u64, data_len: u64 },
    #[error("record {index} timestamp {timestamp} is below the previous {previous}")]
    TimestampDecreases { index: u32, timestamp: u64, previous: u64 },
    #[error("chunk header says the last timestamp is {header} but the directory says {directory}")]
    LastTimestampMismatch { header: u64, directory: u64 },
    #[error(
        "records from {first_seq_num} for {count} records run past the largest sequence number"
    )]
    SeqNumOverflow { first_seq_num: u64, count: u32 },
    #[error("record {index}: {source}")]
    Record { index: u32, source: record::Corruption },
}

/// Consecutive records with their directory: end offsets and timestamps as the chunk
/// stores them (little-endian tables), and the stored records they frame.
///
/// Offsets are in the coordinates of the chunk they came from: `data[0]` is at offset
/// `base`, so a sub-range shares the tables and data of its chunk without rewriting
/// anything. Invariants (checked by [`Records::new`], kept by every constructor): end
/// offsets strictly increase from `base`, the last one is `base + data.len()`,
/// timestamps never decrease, and the sequence numbers do not pass `u64::MAX - 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Records<'a> {
    first_seq_num: u64,
    base: u32,
    ends: &'a [u8],
    timestamps: &'a [u8],
    data: &'a [u8],
}

impl<'a> Records<'a> {
    /// Checks the directory against the data and builds the view. Stored records are
    /// not decoded here; [`Records::validate_records`] does that.
    pub fn new(
        first_seq_num: u64,
        base: u32,
        ends: &'a [u8],
        timestamps: &'a [u8],
        data: &'a [u8],
    ) -> Result<Self, Corruption> {
        let count = ends.len() / END_LEN;
        if !ends.len().is_multiple_of(END_LEN) || timestamps.len() != count * TS_LEN {
            return Err(Corruption::LengthMismatch {
                expected: (count * DIR_ENTRY_LEN) as u64,
                actual: (ends.len() + timestamps.len()) as u64,
            });
        }
        let count_u32 = u32::try_from(count).map_err(|_| Corruption::LengthMismatch {
            expected: u64::from(u32::MAX),
            actual: count as u64,
        })?;
        if count > 0 && (count as u64 - 1) > SEQ_NUM_MAX - first_seq_num.min(SEQ_NUM_MAX) {
            return Err(Corruption::SeqNumOverflow { first_seq_num, count: count_u32 });
        }
        let mut start = base;
        for index in 0..count {
            let end = u32_at(ends, index * END_LEN);
            if end <= start {
                return Err(Corruption::BadEndOffset { index: index as u32, start, end });
            }
            start = end;
        }
        let expected_end = u64::from(base) + data.len() as u64;
        if count > 0 && u64::from(start) != expected_end || count == 0 && !data.is_empty() {
            return Err(Corruption::DataLengthMismatch {
                end: u64::from(start),
                data_len: expected_end,
            });
        }
        let mut previous = 0;
        for index in 0..count {
            let timestamp = u64_at(timestamps, index * TS_LEN);
            if timestamp < previous {
                return Err(Corruption::TimestampDecreases {
                    index: index as u32,
                    timestamp,
                    previous,
                });
            }
            previous = timestamp;
        }
        Ok(Self { first_seq_num, base, ends, timestamps, data })
    }

    /// Decodes every stored record strictly (records.md). Reads of untrusted bytes call
    /// this once; the records' accessors then never see corrupt framing.
    pub fn validate_records(&self) -> Result<(), Corruption> {
        (0..self.len()).try_for_each(|index| {
            record::decode(self.record(index))
                .map(drop)
                .map_err(|source| Corruption::Record { index: index as u32, source })
        })
    }

    /// How many records.
    #[inline]
    pub fn len(&self) -> usize {
        self.ends.len() / END_LEN
    }

    /// Whether there are no records.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The sequence number of the first record.
    #[inline]
    pub fn first_seq_num(&self) -> u64 {
        self.first_seq_num
    }

    /// One past the last record's sequence number.
    #[inline]
    pub fn end_seq_num(&self) -> u64 {
        self.first_seq_num + self.len() as u64
    }

    /// The offset of `data[0]` in the chunk's data.
    #[inline]
    pub fn base(&self) -> u32 {
        self.base
    }

    /// The end-offset table, as stored (little-endian u32 per record).
    #[inline]
    pub fn ends_bytes(&self) -> &'a [u8] {
        self.ends
    }

    /// The timestamp table, as stored (little-endian u64 per record).
    #[inline]
    pub fn timestamps_bytes(&self) -> &'a [u8] {
        self.timestamps
    }

    /// The stored records back to back.
    #[inline]
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    #[inline]
    fn end(&self, index: usize) -> u32 {
        u32_at(self.ends, index * END_LEN)
    }

    /// Where record `index` starts (for `index == len()`, where the records end).
    #[inline]
    fn start(&self, index: usize) -> u32 {
        if index == 0 { self.base } else { self.end(index - 1) }
    }

    /// Record `index`'s stored bytes (decode with [`record::decode`]).
    ///
    /// # Panics
    /// If `index >= len()`.
    #[inline]
    pub fn record(&self, index: usize) -> &'a [u8] {
        let (start, end) = (self.start(index) - self.base, self.end(index) - self.base);
        &self.data[start as usize..end as usize]
    }

    /// Record `index`'s timestamp in ms.
    #[inline]
    pub fn timestamp(&self, index: usize) -> u64 {
        u64_at(self.timestamps, index * TS_LEN)
    }

    /// The index of the record numbered `seq_num`, if it is here.
    #[inline]
    pub fn index_of(&self, seq_num: u64) -> Option<usize> {
        let index = seq_num.checked_sub(self.first_seq_num)?;
        (index < self.len() as u64).then_some(index as usize)
    }

    /// The index of the first record stamped at or after `timestamp` (`len()` if none):
    /// a binary search over the timestamp table, never a scan.
    pub fn first_at_or_after(&self, timestamp: u64) -> usize {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let mid = low + (high - low) / 2;
            if self.timestamp(mid) < timestamp { low = mid + 1 } else { high = mid }
        }
        low
    }

    /// The records `range` of this run, sharing its bytes.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Records<'a> {
        assert!(range.start <= range.end && range.end <= self.len(), "{range:?} of {}", self.len());
        if range.is_empty() {
            return Records {
                first_seq_num: self.first_seq_num + range.start as u64,
                base: self.start(range.start),
                ends: &[],
                timestamps: &[],
                data: &[],
            };
        }
        let base = self.start(range.start);
        let end = self.end(range.end - 1);
        Records {
            first_seq_num: self.first_seq_num + range.start as u64,
            base,
            ends: &self.ends[range.start * END_LEN..range.end * END_LEN],
            timestamps: &self.timestamps[range.start * TS_LEN..range.end * TS_LEN],
            data: &self.data[(base - self.base) as usize..(end - self.base) as usize],
        }
    }

    /// Iterates `(seq_num, timestamp, stored bytes)`.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u64, u64, &'a [u8])> + '_ {
        (0..self.len()).map(|i| (self.first_seq_num + i as u64, self.timestamp(i), self.record(i)))
    }
}

/// The parsed fixed header of a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub stream_id: StreamId,
    pub first_seq_num: u64,
    pub record_count: u32,
    pub data_len: u32,
    pub last_timestamp: u64,
    pub data_crc: u32,
    pub directory_crc: u32,
}

impl ChunkHeader {
    /// Parses and checks the 64-byte header (magic, version, reserved fields, CRC).
    pub fn parse(bytes: &[u8]) -> Result<Self, Corruption> {
        let Some(header) = bytes.first_chunk::<HEADER_LEN>() else {
            return Err(Corruption::TooShort {
                len: bytes.len() as u64,
                needed: HEADER_LEN as u64,
            });
        };
        const SHAPE: Fixed<'static> = Fixed {
            magic: MAGIC,
            version: FORMAT_VERSION,
            crc_at: HEADER_CRC_AT,
            reserved: &[(RESERVED_A_AT, 2), (RESERVED_B_AT, 4)],
        };
        SHAPE.check(header).map_err(|fault| match fault {
            FixedFault::BadMagic { found } => Corruption::BadMagic { found },
            FixedFault::UnknownVersion { version } => Corruption::UnknownVersion { version },
            FixedFault::Crc { stored, computed } => Corruption::HeaderCrc { stored, computed },
            FixedFault::ReservedNotZero { offset } => Corruption::ReservedNotZero { offset },
        })?;
        let parsed = Self {
            stream_id: StreamId(header[STREAM_ID_AT..FIRST_SEQ_AT].try_into().expect("16 bytes")),
            first_seq_num: u64_at(header, FIRST_SEQ_AT),
            record_count: u32_at(header, COUNT_AT),
            data_len: u32_at(header, DATA_LEN_AT),
            last_timestamp: u64_at(header, LAST_TS_AT),
            data_crc: u32_at(header, DATA_CRC_AT),
            directory_crc: u32_at(header, DIR_CRC_AT),
        };
        if parsed.record_count == 0 {
            return Err(Corruption::NoRecords);
        }
        Ok(parsed)
    }

    /// The chunk's total length: header, data and directory.
    pub fn chunk_len(&self) -> u64 {
        HEADER_LEN as u64
            + u64::from(self.data_len)
            + DIR_ENTRY_LEN as u64 * u64::from(self.record_count)
    }

    fn write(&self, out: &mut [u8; HEADER_LEN]) {
        out.fill(0);
        out[MAGIC_AT..VERSION_AT].copy_from_slice(&MAGIC);
        out[VERSION_AT..RESERVED_A_AT].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[STREAM_ID_AT..FIRST_SEQ_AT].copy_from_slice(self.stream_id.as_bytes());
        out[FIRST_SEQ_AT..COUNT_AT].copy_from_slice(&self.first_seq_num.to_le_bytes());
        out[COUNT_AT..DATA_LEN_AT].copy_from_slice(&self.record_count.to_le_bytes());
        out[DATA_LEN_AT..LAST_TS_AT].copy_from_slice(&self.data_len.to_le_bytes());
        out[LAST_TS_AT..DATA_CRC_AT].copy_from_slice(&self.last_timestamp.to_le_bytes());
        out[DATA_CRC_AT..DIR_CRC_AT].copy_from_slice(&self.data_crc.to_le_bytes());
        out[DIR_CRC_AT..RESERVED_B_AT].copy_from_slice(&self.directory_crc.to_le_bytes());
        let crc = crc32fast::hash(&out[..HEADER_CRC_AT]);
        out[HEADER_CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A chunk read from bytes: its header and its records.
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    pub header: ChunkHeader,
    pub records: Records<'a>,
}

impl<'a> Chunk<'a> {
    /// Parses a chunk of exactly `bytes.len()` bytes, checking every CRC, the directory
    /// and every stored record. Untrusted bytes (object storage, the journal) come in
    /// through here and nowhere else.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Corruption> {
        let header = ChunkHeader::parse(bytes)?;
        if header.chunk_len() != bytes.len() as u64 {
            return Err(Corruption::LengthMismatch {
                expected: header.chunk_len(),
                actual: bytes.len() as u64,
            });
        }
        let data_end = HEADER_LEN + header.data_len as usize;
        let (data, directory) = (&bytes[HEADER_LEN..data_end], &bytes[data_end..]);
        let computed = crc32fast::hash(directory);
        if computed != header.directory_crc {
            return Err(Corruption::DirectoryCrc { stored: header.directory_crc, computed });
        }
        let computed = crc32fast::hash(data);
        if computed != header.data_crc {
            return Err(Corruption::DataCrc { stored: header.data_crc, computed });
        }
        let (ends, timestamps) = directory.split_at(END_LEN * header.record_count as usize);
        let records = Records::new(header.first_seq_num, 0, ends, timestamps, data)?;
        let last = records.timestamp(records.len() - 1);
        if last != header.last_timestamp {
            return Err(Corruption::LastTimestampMismatch {
                header: header.last_timestamp,
                directory: last,
            });
        }
        records.validate_records()?;
        Ok(Self { header, records })
    }
}

/// Bytes reserved in front of every chunk in its buffer for the journal entry envelope
/// an express chunk is written with, so that adding the envelope never copies the chunk
/// (a transit slot envelope is the same size, but written apart: see `transit.rs`).
pub const ENVELOPE_LEN: usize = 64;

/// Memory a chunk is built in: 4 KiB-aligned, of fixed capacity, owned. `AlignedBuf` is
/// `Send` (for chunks that cross to the uploader); the shard also builds in glommio's
/// `DmaBuffer` (for chunks its journal writes with O_DIRECT), which is not.
pub trait ChunkStorage {
    /// The whole buffer, readable.
    fn storage(&self) -> &[u8];
    /// The whole buffer, writable.
    fn storage_mut(&mut self) -> &mut [u8];
}

impl ChunkStorage for AlignedBuf {
    fn storage(&self) -> &[u8] {
        self.as_slice()
    }

    fn storage_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// A chunk whose records are all in and whose directory and header are written: ready
/// for the journal (its envelope, chunk and padding) and the uploader (its chunk bytes).
#[derive(Debug)]
pub struct SealedChunk<B: ChunkStorage = AlignedBuf> {
    buf: B,
    header: ChunkHeader,
}

impl<B: ChunkStorage> SealedChunk<B> {
    /// The chunk's bytes, exactly `header().chunk_len()` long.
    pub fn bytes(&self) -> &[u8] {
        &self.buf.storage()[ENVELOPE_LEN..self.end()]
    }

    fn end(&self) -> usize {
        // chunk_len fits the buffer: the builder checked every byte against its capacity.
        ENVELOPE_LEN + self.header.chunk_len() as usize
    }

    /// The envelope in front of the chunk, for the writer that sends it somewhere.
    pub fn envelope_mut(&mut self) -> &mut [u8; ENVELOPE_LEN] {
        self.buf.storage_mut().first_chunk_mut().expect("buffers are at least 4 KiB")
    }

    /// Envelope, chunk and zero padding to a multiple of 4 KiB: what an O_DIRECT write
    /// of this chunk sends.
    pub fn padded(&self) -> &[u8] {
        &self.buf.storage()[..crate::aligned::round_up(self.end())]
    }

    /// The header as written.
    pub fn header(&self) -> &ChunkHeader {
        &self.header
    }

    /// The records, trusted (this process wrote them).
    pub fn records(&self) -> Records<'_> {
        let data_start = ENVELOPE_LEN + HEADER_LEN;
        let data_end = data_start + self.header.data_len as usize;
        let ends_end = data_end + END_LEN * self.header.record_count as usize;
        let bytes = self.buf.storage();
        Records {
            first_seq_num: self.header.first_seq_num,
            base: 0,
            ends: &bytes[data_end..ends_end],
            timestamps: &bytes[ends_end..self.end()],
            data: &bytes[data_start..data_end],
        }
    }

    /// The buffer, as storage.
    pub fn storage(&self) -> &B {
        &self.buf
    }

    /// Gives up the buffer, to recycle it for another chunk.
    pub fn into_storage(self) -> B {
        self.buf
    }

    /// The same chunk in another storage type holding the same buffer (unwrapping a
    /// storage enum). `f` must hand back the very bytes it was given.
    pub(crate) fn map_storage<C: ChunkStorage>(self, f: impl FnOnce(B) -> C) -> SealedChunk<C> {
        let header = self.header;
        let buf = f(self.buf);
        debug_assert!(buf.storage().len() >= ENVELOPE_LEN + header.chunk_len() as usize);
        SealedChunk { buf, header }
    }
}

impl SealedChunk<AlignedBuf> {
    /// A sealed chunk in a fresh aligned buffer, copied from the bytes of a chunk that
    /// was verified when it was read or written by this process (`header` is theirs).
    pub fn copy_of(chunk: &[u8], header: ChunkHeader) -> Self {
        debug_assert_eq!(chunk.len() as u64, header.chunk_len());
        SealedChunk { buf: AlignedBuf::copied_at(ENVELOPE_LEN, chunk), header }
    }
}

/// The records of a chunk already verified by [`Chunk::parse`] (`bytes` is exactly the
/// chunk, `header` its parsed header): the view a chunk read back from storage serves.
pub fn verified_records<'a>(bytes: &'a [u8], header: &ChunkHeader) -> Records<'a> {
    let data_end = HEADER_LEN + header.data_len as usize;
    let ends_end = data_end + END_LEN * header.record_count as usize;
    debug_assert_eq!(bytes.len(), data_end + DIR_ENTRY_LEN * header.record_count as usize);
    Records::new(
        header.first_seq_num,
        0,
        &bytes[data_end..ends_end],
        &bytes[ends_end..],
        &bytes[HEADER_LEN..data_end],
    )
    .expect("Chunk::parse verified this directory when the chunk was read")
}

/// The chunk could not take the records: its buffer is full. Seal it and start another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("chunk buffer of {capacity} bytes cannot take {records} more records of {bytes} bytes")]
pub struct ChunkFull {
    pub capacity: usize,
    pub records: usize,
    pub bytes: usize,
}

/// Builds one chunk in place: stored records are copied once into the aligned buffer
/// as they arrive; the directory is kept beside it and written when the chunk is sealed.
///
/// Buffer layout: `[envelope: 64][header: 64][data ...][directory when sealed][padding]`.
pub struct ChunkBuilder<B: ChunkStorage = AlignedBuf> {
    buf: B,
    stream_id: StreamId,
    first_seq_num: u64,
    ends: Vec<u8>,
    timestamps: Vec<u8>,
    data_len: usize,
    data_crc: crc32fast::Hasher,
    last_timestamp: u64,
}

impl ChunkBuilder<AlignedBuf> {
    /// An empty chunk for `stream_id` whose first record will be `first_seq_num`, in a
    /// fresh buffer of at least `capacity` bytes (envelope, header, data and directory).
    pub fn new(stream_id: StreamId, first_seq_num: u64, capacity: usize) -> Self {
        let buf = AlignedBuf::with_capacity(capacity.max(Self::capacity_for(1, 1)));
        Self::with_buffer(buf, stream_id, first_seq_num)
    }
}

impl<B: ChunkStorage> ChunkBuilder<B> {
    /// An empty chunk built in `buf`, a fresh or recycled buffer (a sealed chunk's, via
    /// [`SealedChunk::into_storage`]): the hot path reuses buffers instead of allocating
    /// and faulting in fresh pages for every chunk. Old bytes in it are overwritten.
    pub fn with_buffer(buf: B, stream_id: StreamId, first_seq_num: u64) -> Self {
        Self {
            buf,
            stream_id,
            first_seq_num,
            ends: Vec::new(),
            timestamps: Vec::new(),
            data_len: 0,
            data_crc: crc32fast::Hasher::new(),
            last_timestamp: 0,
        }
    }

    /// The buffer capacity needed for a chunk of `records` records and `data_len` bytes
    /// of stored records, envelope included.
    pub const fn capacity_for(records: usize, data_len: usize) -> usize {
        ENVELOPE_LEN + HEADER_LEN + data_len + DIR_ENTRY_LEN * records
    }

    /// Records so far.
    /// The buffer the chunk is built in.
    pub fn storage(&self) -> &B {
        &self.buf
    }

    pub fn len(&self) -> usize {
        self.ends.len() / END_LEN
    }

    /// Whether no record is in yet.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of stored records so far.
    pub fn data_len(&self) -> usize {
        self.data_len
    }

    /// The sequence number of the first record.
    pub fn first_seq_num(&self) -> u64 {
        self.first_seq_num
    }

    /// The sequence number the next record will take.
    pub fn next_seq_num(&self) -> u64 {
        self.first_seq_num + self.len() as u64
    }

    /// Whether `records` more records of `bytes` stored bytes fit.
    pub fn fits(&self, records: usize, bytes: usize) -> bool {
        self.capacity_with(records, bytes) <= self.capacity()
    }

    /// The buffer capacity this chunk needs with `records` more records of `bytes`
    /// stored bytes.
    pub fn capacity_with(&self, records: usize, bytes: usize) -> usize {
        Self::capacity_for(self.len() + records, self.data_len + bytes)
    }

    /// The buffer's capacity.
    pub fn capacity(&self) -> usize {
        self.buf.storage().len()
    }

    /// Moves the records in so far into `larger`, a fresh buffer, and builds on there: a
    /// chunk that starts small and grows costs what it holds, not what it may come to.
    ///
    /// # Panics
    /// If `larger` is not larger than the buffer it replaces.
    pub fn grow_into(&mut self, mut larger: B) {
        assert!(larger.storage().len() > self.capacity(), "a chunk buffer only grows");
        let data = ENVELOPE_LEN + HEADER_LEN..ENVELOPE_LEN + HEADER_LEN + self.data_len;
        larger.storage_mut()[data.clone()].copy_from_slice(&self.buf.storage()[data]);
        self.buf = larger;
    }

    /// Appends one batch: `lengths` holds each record's stored length (little-endian
    /// u32, as the binary framing carries it), `data` the stored records back to back,
    /// all stamped `timestamp`. The data is copied once, with one `memcpy` per piece.
    ///
    /// The caller has validated the records and sequenced the batch; a timestamp below
    /// the previous one, or lengths that do not add up to `data`, are bugs and stop the
    /// process.
    pub fn push_batch(
        &mut self,
        lengths: &[u8],
        data: Pieces<'_>,
        timestamp: u64,
    ) -> Result<(), ChunkFull> {
        let records = lengths.len() / END_LEN;
        assert!(lengths.len().is_multiple_of(END_LEN), "lengths are whole u32s");
        assert!(timestamp >= self.last_timestamp, "timestamps never decrease in a stream");
        if !self.fits(records, data.len()) {
            return Err(ChunkFull {
                capacity: self.buf.storage().len(),
                records,
                bytes: data.len(),
            });
        }
        let mut at = ENVELOPE_LEN + HEADER_LEN + self.data_len;
        for piece in data.iter() {
            self.buf.storage_mut()[at..at + piece.len()].copy_from_slice(piece);
            self.data_crc.update(piece);
            at += piece.len();
        }
        let (ends_at, timestamps_at) = (self.ends.len(), self.timestamps.len());
        self.ends.resize(ends_at + lengths.len(), 0);
        self.timestamps.resize(timestamps_at + records * TS_LEN, 0);
        let stamp = timestamp.to_le_bytes();
        let mut end = self.data_len;
        let entries = self.ends[ends_at..]
            .chunks_exact_mut(END_LEN)
            .zip(self.timestamps[timestamps_at..].chunks_exact_mut(TS_LEN));
        for (length, (end_out, timestamp_out)) in lengths.chunks_exact(END_LEN).zip(entries) {
            let length = u32::from_le_bytes(length.try_into().expect("4 bytes")) as usize;
            assert!(length > 0, "a stored record has at least its flag byte");
            end += length;
            // fits() bounded data_len + data.len() by the buffer, which is far below 4 GiB
            // for any configured chunk size; the u32 conversion cannot truncate.
            end_out.copy_from_slice(&(end as u32).to_le_bytes());
            timestamp_out.copy_from_slice(&stamp);
        }
        assert_eq!(end, self.data_len + data.len(), "record lengths add up to the batch data");
        self.data_len = end;
        self.last_timestamp = timestamp;
        Ok(())
    }

    /// Appends one stored record stamped `timestamp`.
    pub fn push_record(&mut self, stored: &[u8], timestamp: u64) -> Result<(), ChunkFull> {
        let length = u32::try_from(stored.len()).map_err(|_| ChunkFull {
            capacity: self.buf.storage().len(),
            records: 1,
            bytes: stored.len(),
        })?;
        self.push_batch(&length.to_le_bytes(), stored.into(), timestamp)
    }

    /// The records in so far, served to readers from this buffer without copying.
    pub fn records(&self) -> Records<'_> {
        let data_start = ENVELOPE_LEN + HEADER_LEN;
        Records {
            first_seq_num: self.first_seq_num,
            base: 0,
            ends: &self.ends,
            timestamps: &self.timestamps,
            data: &self.buf.storage()[data_start..data_start + self.data_len],
        }
    }

    /// Writes the directory after the data and the header in front, and hands back the
    /// finished chunk.
    ///
    /// # Panics
    /// If the chunk is empty: an empty chunk is never written.
    pub fn seal(mut self) -> SealedChunk<B> {
        assert!(!self.is_empty(), "an empty chunk is never sealed");
        let chunk_start = ENVELOPE_LEN;
        let data_end = chunk_start + HEADER_LEN + self.data_len;
        let total = data_end + self.ends.len() + self.timestamps.len();
        let record_count =
            u32::try_from(self.len()).expect("a chunk buffer holds under 4 Gi records");
        let bytes = self.buf.storage_mut();
        bytes[data_end..data_end + self.ends.len()].copy_from_slice(&self.ends);
        bytes[data_end + self.ends.len()..total].copy_from_slice(&self.timestamps);
        let header = ChunkHeader {
            stream_id: self.stream_id,
            first_seq_num: self.first_seq_num,
            record_count,
            data_len: u32::try_from(self.data_len)
                .expect("a chunk buffer holds under 4 GiB of data"),
            last_timestamp: self.last_timestamp,
            data_crc: self.data_crc.clone().finalize(),
            directory_crc: crc32fast::hash(&bytes[data_end..total]),
        };
        header.write(
            bytes[chunk_start..chunk_start + HEADER_LEN].first_chunk_mut().expect("64-byte header"),
        );
        // A recycled buffer holds older bytes: zero the envelope (its writer fills it)
        // and the padding an O_DIRECT write sends, so what lands on disk is this chunk.
        bytes[..ENVELOPE_LEN].fill(0);
        bytes[total..crate::aligned::round_up(total)].fill(0);
        let sealed = SealedChunk { buf: self.buf, header };
        debug_assert_eq!(Chunk::parse(sealed.bytes()).map(|c| c.header), Ok(header));
        sealed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ID: StreamId = StreamId(*b"0123456789abcdef");

    fn stored(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        record::encode::<&[u8], &[u8]>(&[], body, &mut out).expect("fits");
        out
    }

    /// A batch in framing form: little-endian lengths and the records back to back.
    fn batch(bodies: &[&[u8]]) -> (Vec<u8>, Vec<u8>) {
        let (mut lengths, mut data) = (Vec::new(), Vec::new());
        for body in bodies {
            let record = stored(body);
            lengths.extend_from_slice(&(record.len() as u32).to_le_bytes());
            data.extend_from_slice(&record);
        }
        (lengths, data)
    }

    fn sample() -> SealedChunk {
        let mut builder = ChunkBuilder::new(ID, 7, 4096);
        builder.push_record(&[0x00, b'h', b'i'], 100).expect("fits");
        builder.push_record(&[0x01, 0x01, 0x01, 0x01, b'k', b'v', b'h', b'i'], 105).expect("fits");
        let (lengths, data) = batch(&[b"a", b"bc", b""]);
        builder.push_batch(&lengths, data[..].into(), 105).expect("fits");
        builder.seal()
    }

    #[test]
    fn a_batch_in_pieces_frames_the_same_chunk_as_in_one() {
        let (lengths, data) = batch(&[b"abc", b"defgh", b"", b"ij"]);
        let mut whole = ChunkBuilder::new(ID, 0, 4096);
        whole.push_batch(&lengths, data[..].into(), 5).expect("fits");
        let shared = s3::Bytes::from(data.clone());
        let rest = [shared.slice(3..7), shared.slice(7..7), shared.slice(7..)];
        let mut pieces = ChunkBuilder::new(ID, 0, 4096);
        pieces.push_batch(&lengths, Pieces::new(&data[..3], &rest), 5).expect("fits");
        assert_eq!(pieces.seal().bytes(), whole.seal().bytes());
    }

    #[test]
    fn a_chunk_grown_through_buffers_seals_the_same_as_one_built_large() {
        let record = [0x00; 1500];
        let mut large = ChunkBuilder::new(ID, 3, 64 << 10);
        let mut grown = ChunkBuilder::new(ID, 3, 4096);
        for i in 0..20u8 {
            let (lengths, data) = batch(&[&record[..100 + usize::from(i)], b"x"]);
            large.push_batch(&lengths, data[..].into(), u64::from(i)).expect("fits");
            if !grown.fits(2, data.len()) {
                let needed = grown.capacity_with(2, data.len());
                grown.grow_into(AlignedBuf::with_capacity(needed.max(2 * grown.capacity())));
            }
            grown.push_batch(&lengths, data[..].into(), u64::from(i)).expect("grown to fit");
        }
        assert!(grown.capacity() < large.capacity(), "it grew only as far as it needed");
        assert_eq!(grown.records().len(), 40, "records are served while it grows");
        assert_eq!(grown.seal().bytes(), large.seal().bytes());
    }

    /// Recomputes every CRC from the header's fields so a test reaches the check behind
    /// the CRCs.
    fn reseal(bytes: &mut [u8]) {
        let data_len = u32_at(bytes, DATA_LEN_AT) as usize;
        let data_end = (HEADER_LEN + data_len).min(bytes.len());
        let data_crc = crc32fast::hash(&bytes[HEADER_LEN..data_end]);
        let dir_crc = crc32fast::hash(&bytes[data_end..]);
        bytes[DATA_CRC_AT..DIR_CRC_AT].copy_from_slice(&data_crc.to_le_bytes());
        bytes[DIR_CRC_AT..RESERVED_B_AT].copy_from_slice(&dir_crc.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..HEADER_CRC_AT]);
        bytes[HEADER_CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    }

    fn tampered(edit: impl FnOnce(&mut Vec<u8>)) -> Result<(), Corruption> {
        let mut bytes = sample().bytes().to_vec();
        edit(&mut bytes);
        reseal(&mut bytes);
        Chunk::parse(&bytes).map(drop)
    }

    #[test]
    fn build_seal_parse() {
        let sealed = sample();
        assert_eq!(sealed.bytes().len() as u64, sealed.header().chunk_len());
        assert_eq!(sealed.padded().len(), 4096);
        let chunk = Chunk::parse(sealed.bytes()).expect("valid");
        assert_eq!(chunk.header.stream_id, ID);
        assert_eq!(chunk.header.record_count, 5);
        assert_eq!(chunk.header.last_timestamp, 105);
        let records: Vec<_> = chunk.records.iter().map(|(s, t, r)| (s, t, r.to_vec())).collect();
        assert_eq!(
            records,
            vec![
                (7, 100, b"\x00hi".to_vec()),
                (8, 105, b"\x01\x01\x01\x01kvhi".to_vec()),
                (9, 105, b"\x00a".to_vec()),
                (10, 105, b"\x00bc".to_vec()),
                (11, 105, b"\x00".to_vec()),
            ]
        );
        assert_eq!(chunk.records, sealed.records());
        assert_eq!(chunk.records.end_seq_num(), 12);
    }

    #[test]
    fn builder_serves_records_before_seal() {
        let mut builder = ChunkBuilder::new(ID, 0, 4096);
        assert!(builder.records().is_empty());
        builder.push_record(&stored(b"x"), 1).expect("fits");
        assert_eq!(builder.records().record(0), b"\x00x");
        assert_eq!(builder.next_seq_num(), 1);
        assert_eq!(builder.data_len(), 2);
    }

    #[test]
    fn recycled_buffer_builds_an_identical_chunk() {
        let first = sample();
        let expected = first.bytes().to_vec();
        let mut dirty = first.into_storage();
        dirty.as_mut_slice().fill(0xEE);
        let mut builder = ChunkBuilder::with_buffer(dirty, ID, 7);
        builder.push_record(&[0x00, b'h', b'i'], 100).expect("fits");
        builder.push_record(&[0x01, 0x01, 0x01, 0x01, b'k', b'v', b'h', b'i'], 105).expect("fits");
        let (lengths, data) = batch(&[b"a", b"bc", b""]);
        builder.push_batch(&lengths, data[..].into(), 105).expect("fits");
        let sealed = builder.seal();
        assert_eq!(sealed.bytes(), expected);
        let padded = sealed.padded();
        assert!(padded[..ENVELOPE_LEN].iter().all(|&b| b == 0), "the envelope is zeroed");
        assert!(
            padded[ENVELOPE_LEN + expected.len()..].iter().all(|&b| b == 0),
            "padding is zeroed"
        );
    }

    #[test]
    fn lookups() {
        let sealed = sample();
        let records = sealed.records();
        assert_eq!(records.index_of(6), None);
        assert_eq!(records.index_of(7), Some(0));
        assert_eq!(records.index_of(11), Some(4));
        assert_eq!(records.index_of(12), None);
        assert_eq!(records.first_at_or_after(0), 0);
        assert_eq!(records.first_at_or_after(100), 0);
        assert_eq!(records.first_at_or_after(101), 1);
        assert_eq!(records.first_at_or_after(105), 1);
        assert_eq!(records.first_at_or_after(106), 5);
    }

    #[test]
    fn slices_share_bytes_and_keep_coordinates() {
        let sealed = sample();
        let all = sealed.records();
        let middle = all.slice(1..4);
        assert_eq!(middle.first_seq_num(), 8);
        assert_eq!(middle.len(), 3);
        assert_eq!(middle.base(), 3);
        assert_eq!(middle.record(0), all.record(1));
        assert_eq!(middle.record(2), all.record(3));
        // A slice's tables and data are a valid run on their own (what a records frame
        // carries): rebuilding from them gives the same view.
        let rebuilt = Records::new(
            8,
            middle.base(),
            middle.ends_bytes(),
            middle.timestamps_bytes(),
            middle.data(),
        )
        .expect("valid run");
        assert_eq!(rebuilt, middle);
        let inner = middle.slice(1..2);
        assert_eq!((inner.first_seq_num(), inner.record(0)), (9, all.record(2)));
        let empty = all.slice(5..5);
        assert!(empty.is_empty());
        assert_eq!(empty.first_seq_num(), 12);
    }

    #[test]
    fn chunk_full_leaves_the_builder_unchanged() {
        let mut builder = ChunkBuilder::new(ID, 0, 4096);
        let big = vec![0u8; 4096 - ENVELOPE_LEN - HEADER_LEN - DIR_ENTRY_LEN];
        builder.push_record(&big, 1).expect("fits");
        let err = builder.push_record(&[0, 1, 2], 1).expect_err("full");
        assert_eq!(err.capacity, 4096);
        assert_eq!(builder.len(), 1);
        assert!(!builder.fits(1, 100));
        assert_eq!(Chunk::parse(builder.seal().bytes()).expect("valid").records.len(), 1);
    }

    #[test]
    #[should_panic(expected = "timestamps never decrease")]
    fn decreasing_timestamp_is_a_bug() {
        let mut builder = ChunkBuilder::new(ID, 0, 4096);
        builder.push_record(&stored(b"a"), 5).expect("fits");
        let _ = builder.push_record(&stored(b"b"), 4);
    }

    #[test]
    fn refuses_short_and_bad_header() {
        let good = sample().bytes().to_vec();
        assert_eq!(
            Chunk::parse(&good[..63]).map(drop),
            Err(Corruption::TooShort { len: 63, needed: 64 })
        );
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(Chunk::parse(&bad), Err(Corruption::BadMagic { .. })));
        let mut bad = good.clone();
        bad[HEADER_CRC_AT] ^= 1;
        assert!(matches!(Chunk::parse(&bad), Err(Corruption::HeaderCrc { .. })));
        let mut bad = good.clone();
        bad[FIRST_SEQ_AT] ^= 1;
        assert!(matches!(Chunk::parse(&bad), Err(Corruption::HeaderCrc { .. })));
    }

    #[test]
    fn refuses_unknown_version_and_reserved_bits() {
        assert_eq!(tampered(|b| b[VERSION_AT] = 2), Err(Corruption::UnknownVersion { version: 2 }));
        assert_eq!(
            tampered(|b| b[RESERVED_A_AT] = 1),
            Err(Corruption::ReservedNotZero { offset: RESERVED_A_AT as u8 })
        );
        assert_eq!(
            tampered(|b| b[RESERVED_B_AT + 3] = 1),
            Err(Corruption::ReservedNotZero { offset: RESERVED_B_AT as u8 })
        );
    }

    #[test]
    fn refuses_inconsistent_lengths() {
        assert_eq!(tampered(|b| b[COUNT_AT..DATA_LEN_AT].fill(0)), Err(Corruption::NoRecords));
        assert!(matches!(tampered(|b| b.push(0)), Err(Corruption::LengthMismatch { .. })));
        assert!(matches!(
            tampered(|b| b[DATA_LEN_AT] += 1),
            Err(Corruption::LengthMismatch { .. })
        ));
    }

    #[test]
    fn refuses_crc_mismatches() {
        let good = sample().bytes().to_vec();
        let mut bad = good.clone();
        bad[HEADER_LEN + 1] ^= 0x20;
        assert!(matches!(Chunk::parse(&bad), Err(Corruption::DataCrc { .. })));
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(matches!(Chunk::parse(&bad), Err(Corruption::DirectoryCrc { .. })));
    }

    fn directory_at(bytes: &[u8]) -> usize {
        HEADER_LEN + u32_at(bytes, DATA_LEN_AT) as usize
    }

    #[test]
    fn refuses_bad_directory() {
        // Record 1's end offset equal to record 0's: an empty extent.
        assert_eq!(
            tampered(|b| {
                let at = directory_at(b);
                b.copy_within(at..at + 4, at + 4);
            }),
            Err(Corruption::BadEndOffset { index: 1, start: 3, end: 3 })
        );
        // The last end offset short of the data.
        assert!(matches!(
            tampered(|b| {
                let at = directory_at(b) + 4 * 4;
                b[at] -= 1;
            }),
            Err(Corruption::BadEndOffset { .. } | Corruption::DataLengthMismatch { .. })
        ));
        // A decreasing timestamp.
        assert_eq!(
            tampered(|b| {
                let at = directory_at(b) + 5 * 4 + 8;
                b[at..at + 8].copy_from_slice(&99u64.to_le_bytes());
            }),
            Err(Corruption::TimestampDecreases { index: 1, timestamp: 99, previous: 100 })
        );
        // The header's last timestamp disagreeing with the table.
        assert_eq!(
            tampered(|b| b[LAST_TS_AT] = 104),
            Err(Corruption::LastTimestampMismatch { header: 104, directory: 105 })
        );
    }

    #[test]
    fn refuses_sequence_overflow() {
        assert!(matches!(
            tampered(|b| b[FIRST_SEQ_AT..COUNT_AT].copy_from_slice(&(u64::MAX - 3).to_le_bytes())),
            Err(Corruption::SeqNumOverflow { count: 5, .. })
        ));
        // Exactly up to u64::MAX - 1 is fine.
        assert_eq!(
            tampered(|b| b[FIRST_SEQ_AT..COUNT_AT].copy_from_slice(&(u64::MAX - 5).to_le_bytes())),
            Ok(())
        );
    }

    #[test]
    fn refuses_corrupt_stored_record() {
        assert_eq!(
            tampered(|b| b[HEADER_LEN + 3] = 0x40),
            Err(Corruption::Record {
                index: 1,
                source: record::Corruption::ReservedBits { flag: 0x40 }
            })
        );
    }

    #[test]
    fn golden_vectors() {
        let mut one = ChunkBuilder::new(StreamId([0xAB; 16]), 0, 4096);
        one.push_record(&[0x00, b'h', b'i'], 1_700_000_000_000).expect("fits");
        crate::golden::check(
            "chunk_vectors.txt",
            &[
                ("seed records at 7", sample().bytes().to_vec()),
                ("one record at 0", one.seal().bytes().to_vec()),
            ],
        );
    }

    proptest! {
        #[test]
        fn round_trip(
            first in 0u64..1 << 40,
            batches in prop::collection::vec(
                (prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 1..20), 0u64..1000),
                1..10,
            ),
        ) {
            let mut builder = ChunkBuilder::new(ID, first, 1 << 20);
            let mut expected = Vec::new();
            let mut timestamp = 0;
            for (bodies, step) in &batches {
                timestamp += step;
                let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
                let (lengths, data) = batch(&refs);
                builder.push_batch(&lengths, data[..].into(), timestamp).expect("fits");
                expected.extend(bodies.iter().map(|b| (timestamp, stored(b))));
            }
            let sealed = builder.seal();
            let chunk = Chunk::parse(sealed.bytes()).expect("valid");
            prop_assert_eq!(chunk.records.len(), expected.len());
            for (i, (seq, ts, bytes)) in chunk.records.iter().enumerate() {
                prop_assert_eq!(seq, first + i as u64);
                prop_assert_eq!((ts, bytes.to_vec()), expected[i].clone());
            }
            for probe in 0..=timestamp + 1 {
                let linear = expected.iter().position(|(ts, _)| *ts >= probe).unwrap_or(expected.len());
                prop_assert_eq!(chunk.records.first_at_or_after(probe), linear);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..300), fix in any::<bool>()) {
            if fix && bytes.len() >= HEADER_LEN {
                bytes[..4].copy_from_slice(&MAGIC);
                bytes[4..6].copy_from_slice(&1u16.to_le_bytes());
                reseal(&mut bytes);
            }
            let _ = Chunk::parse(&bytes);
        }
    }
}
