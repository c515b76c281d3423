//! The journal's two persisted layouts: the 64-byte entry envelope written in front of
//! every chunk, and the epoch record (docs/format.md, "Journal").
//!
//! ```text
//! entry envelope (64 bytes, then the chunk, then zeros to a multiple of 4 KiB)
//! offset  size  field
//! 0       4     magic "NVJE"
//! 4       2     format version (1)
//! 6       1     flags: bit 0 = the last entry of its group; bits 1-7 reserved, zero
//! 7       1     reserved, zero
//! 8       8     lsn: this entry's journal position
//! 16      8     epoch: the journal open that wrote it
//! 24      8     prev_lsn: the previous entry's lsn (u64::MAX: none)
//! 32      4     prev_crc: the previous entry's envelope CRC (0: none)
//! 36      4     chunk length L
//! 40      4     the chunk's HeaderCRC (its bytes 60..64)
//! 44      16    reserved, zero
//! 60      4     EnvelopeCRC: CRC-32 of bytes 0..60
//!
//! epoch record (one 4 KiB slot of the `epoch` file; slot = epoch % 2)
//! 0       4     magic "NVEP"
//! 4       2     format version (1)
//! 6       2     reserved, zero
//! 8       8     epoch
//! 16      4     CRC-32 of bytes 0..16
//! 20      4076  zero
//! ```
//!
//! All integers are little-endian. This module only encodes and decodes; which entry may
//! follow which (the chain, the epochs) is the recovery's rule (`recovery.rs`).

use crate::chunk::ENVELOPE_LEN;
use crate::fixed::{self, Fixed, FixedFault};
use crate::le::{u16_at, u32_at, u64_at};

/// `"NVJE"`: the first four bytes of every journal entry.
pub const MAGIC: [u8; 4] = *b"NVJE";
/// The one journal entry format version this build reads and writes.
pub const FORMAT_VERSION: u16 = 1;
/// `"NVEP"`: the first four bytes of an epoch record slot.
pub const EPOCH_MAGIC: [u8; 4] = *b"NVEP";
/// The one epoch record format version this build reads and writes.
pub const EPOCH_FORMAT_VERSION: u16 = 1;

/// Flag bit: this entry closes its group; recovery keeps a group only when its last entry,
/// carrying this bit, is there.
pub const FLAG_GROUP_END: u8 = 0x01;
/// `prev_lsn` of the journal's very first entry.
pub const NO_PREV_LSN: u64 = u64::MAX;

const MAGIC_AT: usize = fixed::MAGIC_AT;
const VERSION_AT: usize = fixed::VERSION_AT;
const FLAGS_AT: usize = VERSION_AT + 2;
const RESERVED_A_AT: usize = FLAGS_AT + 1;
const LSN_AT: usize = RESERVED_A_AT + 1;
const EPOCH_AT: usize = LSN_AT + 8;
const PREV_LSN_AT: usize = EPOCH_AT + 8;
const PREV_CRC_AT: usize = PREV_LSN_AT + 8;
const CHUNK_LEN_AT: usize = PREV_CRC_AT + 4;
const CHUNK_CRC_AT: usize = CHUNK_LEN_AT + 4;
const RESERVED_B_AT: usize = CHUNK_CRC_AT + 4;
const CRC_AT: usize = 60;

const _: () = assert!(CRC_AT + 4 == ENVELOPE_LEN, "the envelope fills the chunk's front reserve");
const _: () = assert!(RESERVED_B_AT < CRC_AT);

const EPOCH_VERSION_AT: usize = 4;
const EPOCH_RESERVED_AT: usize = EPOCH_VERSION_AT + 2;
const EPOCH_VALUE_AT: usize = EPOCH_RESERVED_AT + 2;
const EPOCH_CRC_AT: usize = EPOCH_VALUE_AT + 8;
/// Bytes of an epoch record that carry anything; the rest of its 4 KiB slot is zero.
pub const EPOCH_RECORD_LEN: usize = EPOCH_CRC_AT + 4;

/// Where an entry's predecessor is and what its envelope was: the link that makes a stale
/// entry unable to follow anything but the exact envelope it was written after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub lsn: u64,
    pub crc: u32,
}

/// A decoded entry envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub lsn: u64,
    pub epoch: u64,
    /// `None` only for the journal's first entry.
    pub prev: Option<Link>,
    pub chunk_len: u32,
    pub chunk_header_crc: u32,
    pub group_end: bool,
}

/// Why 64 bytes are not an envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// All zero: space never written (preallocated) or zeroed.
    #[error("no entry: the bytes are zero")]
    Unwritten,
    #[error("entry magic is {found:02x?}, not \"NVJE\"")]
    BadMagic { found: [u8; 4] },
    #[error(
        "entry format version {version} is unknown (this build reads version {FORMAT_VERSION})"
    )]
    UnknownVersion { version: u16 },
    #[error("entry envelope CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("entry envelope reserved bits are set")]
    Reserved,
    #[error("entry envelope has prev_lsn {prev_lsn} but prev_crc {prev_crc:#010x}")]
    BadLink { prev_lsn: u64, prev_crc: u32 },
}

impl Envelope {
    /// Writes the envelope over all 64 bytes of `out` and returns its CRC (the next
    /// entry's `prev_crc`).
    pub fn write(&self, out: &mut [u8; ENVELOPE_LEN]) -> u32 {
        out.fill(0);
        out[MAGIC_AT..VERSION_AT].copy_from_slice(&MAGIC);
        out[VERSION_AT..FLAGS_AT].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[FLAGS_AT] = if self.group_end { FLAG_GROUP_END } else { 0 };
        out[LSN_AT..EPOCH_AT].copy_from_slice(&self.lsn.to_le_bytes());
        out[EPOCH_AT..PREV_LSN_AT].copy_from_slice(&self.epoch.to_le_bytes());
        let (prev_lsn, prev_crc) = self.prev.map_or((NO_PREV_LSN, 0), |link| (link.lsn, link.crc));
        out[PREV_LSN_AT..PREV_CRC_AT].copy_from_slice(&prev_lsn.to_le_bytes());
        out[PREV_CRC_AT..CHUNK_LEN_AT].copy_from_slice(&prev_crc.to_le_bytes());
        out[CHUNK_LEN_AT..CHUNK_CRC_AT].copy_from_slice(&self.chunk_len.to_le_bytes());
        out[CHUNK_CRC_AT..RESERVED_B_AT].copy_from_slice(&self.chunk_header_crc.to_le_bytes());
        let crc = crc32fast::hash(&out[..CRC_AT]);
        out[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        crc
    }

    /// Decodes and checks an envelope; returns it with its CRC.
    ///
    /// The version is checked before the CRC: an envelope of a newer format is reported
    /// as such (the journal refuses to open rather than cut it), whatever its CRC layout.
    pub fn parse(bytes: &[u8; ENVELOPE_LEN]) -> Result<(Self, u32), EnvelopeError> {
        if bytes.iter().all(|&b| b == 0) {
            return Err(EnvelopeError::Unwritten);
        }
        // Reserved bits are checked below with the flags (bits, not whole bytes).
        const SHAPE: Fixed<'static> =
            Fixed { magic: MAGIC, version: FORMAT_VERSION, crc_at: CRC_AT, reserved: &[] };
        let stored = u32_at(bytes, CRC_AT);
        SHAPE.check(bytes).map_err(|fault| match fault {
            FixedFault::BadMagic { found } => EnvelopeError::BadMagic { found },
            FixedFault::UnknownVersion { version } => EnvelopeError::UnknownVersion { version },
            FixedFault::Crc { stored, computed } => EnvelopeError::Crc { stored, computed },
            FixedFault::ReservedNotZero { .. } => unreachable!("no reserved ranges given"),
        })?;
        if bytes[FLAGS_AT] & !FLAG_GROUP_END != 0
            || bytes[RESERVED_A_AT] != 0
            || bytes[RESERVED_B_AT..CRC_AT].iter().any(|&b| b != 0)
        {
            return Err(EnvelopeError::Reserved);
        }
        let (prev_lsn, prev_crc) = (u64_at(bytes, PREV_LSN_AT), u32_at(bytes, PREV_CRC_AT));
        let prev = match (prev_lsn, prev_crc) {
            (NO_PREV_LSN, 0) => None,
            (NO_PREV_LSN, _) => return Err(EnvelopeError::BadLink { prev_lsn, prev_crc }),
            (lsn, crc) => Some(Link { lsn, crc }),
        };
        let envelope = Self {
            lsn: u64_at(bytes, LSN_AT),
            epoch: u64_at(bytes, EPOCH_AT),
            prev,
            chunk_len: u32_at(bytes, CHUNK_LEN_AT),
            chunk_header_crc: u32_at(bytes, CHUNK_CRC_AT),
            group_end: bytes[FLAGS_AT] & FLAG_GROUP_END != 0,
        };
        Ok((envelope, stored))
    }
}

/// Writes an epoch record into the first [`EPOCH_RECORD_LEN`] bytes of `out`, zeroing
/// the rest.
pub fn write_epoch(epoch: u64, out: &mut [u8]) {
    out.fill(0);
    out[..EPOCH_VERSION_AT].copy_from_slice(&EPOCH_MAGIC);
    out[EPOCH_VERSION_AT..EPOCH_RESERVED_AT].copy_from_slice(&EPOCH_FORMAT_VERSION.to_le_bytes());
    out[EPOCH_VALUE_AT..EPOCH_CRC_AT].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32fast::hash(&out[..EPOCH_CRC_AT]);
    out[EPOCH_CRC_AT..EPOCH_RECORD_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// Why a slot of the epoch file holds no epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    #[error("epoch slot is {len} bytes, shorter than a record")]
    TooShort { len: usize },
    #[error("epoch slot is zero: never written")]
    Unwritten,
    #[error("epoch slot has no epoch record (bad magic or reserved bytes)")]
    NotARecord,
    #[error("epoch record version {version} is unknown")]
    UnknownVersion { version: u16 },
    #[error("epoch record CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
}

/// Reads the epoch record at the start of `slot`.
pub fn parse_epoch(slot: &[u8]) -> Result<u64, EpochError> {
    let Some(record) = slot.first_chunk::<EPOCH_RECORD_LEN>() else {
        return Err(EpochError::TooShort { len: slot.len() });
    };
    if record.iter().all(|&b| b == 0) {
        return Err(EpochError::Unwritten);
    }
    if record[..EPOCH_VERSION_AT] != EPOCH_MAGIC
        || record[EPOCH_RESERVED_AT..EPOCH_VALUE_AT].iter().any(|&b| b != 0)
    {
        return Err(EpochError::NotARecord);
    }
    let version = u16_at(record, EPOCH_VERSION_AT);
    if version != EPOCH_FORMAT_VERSION {
        return Err(EpochError::UnknownVersion { version });
    }
    let stored = u32_at(record, EPOCH_CRC_AT);
    let computed = crc32fast::hash(&record[..EPOCH_CRC_AT]);
    if stored != computed {
        return Err(EpochError::Crc { stored, computed });
    }
    Ok(u64_at(record, EPOCH_VALUE_AT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{Chunk, ChunkBuilder};
    use crate::ids::StreamId;
    use proptest::prelude::*;

    fn sample() -> Envelope {
        Envelope {
            lsn: 8192,
            epoch: 3,
            prev: Some(Link { lsn: 4096, crc: 0xdead_beef }),
            chunk_len: 79,
            chunk_header_crc: 0xdcf2_1dfb,
            group_end: true,
        }
    }

    fn encoded(envelope: &Envelope) -> [u8; ENVELOPE_LEN] {
        let mut bytes = [0xEE; ENVELOPE_LEN];
        envelope.write(&mut bytes);
        bytes
    }

    /// Recomputes the CRC so a test reaches the checks behind it.
    fn reseal(bytes: &mut [u8; ENVELOPE_LEN]) {
        let crc = crc32fast::hash(&bytes[..CRC_AT]);
        bytes[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn write_parse_round_trip() {
        let envelope = sample();
        let bytes = encoded(&envelope);
        let (parsed, crc) = Envelope::parse(&bytes).expect("valid");
        assert_eq!(parsed, envelope);
        assert_eq!(crc, crc32fast::hash(&bytes[..CRC_AT]));
        let first = Envelope { prev: None, group_end: false, ..envelope };
        assert_eq!(Envelope::parse(&encoded(&first)).expect("valid").0, first);
    }

    #[test]
    fn refusals() {
        let good = encoded(&sample());
        assert_eq!(Envelope::parse(&[0; ENVELOPE_LEN]), Err(EnvelopeError::Unwritten));
        let mut bad = good;
        bad[0] = b'X';
        assert!(matches!(Envelope::parse(&bad), Err(EnvelopeError::BadMagic { .. })));
        let mut bad = good;
        bad[VERSION_AT] = 2;
        assert_eq!(Envelope::parse(&bad), Err(EnvelopeError::UnknownVersion { version: 2 }));
        let mut bad = good;
        bad[LSN_AT] ^= 1;
        assert!(matches!(Envelope::parse(&bad), Err(EnvelopeError::Crc { .. })));
        for at in [FLAGS_AT, RESERVED_A_AT, RESERVED_B_AT, CRC_AT - 1] {
            let mut bad = good;
            bad[at] |= 0x80;
            reseal(&mut bad);
            assert_eq!(Envelope::parse(&bad), Err(EnvelopeError::Reserved), "byte {at}");
        }
        let mut bad = encoded(&Envelope { prev: None, ..sample() });
        bad[PREV_CRC_AT] = 1;
        reseal(&mut bad);
        assert!(matches!(Envelope::parse(&bad), Err(EnvelopeError::BadLink { .. })));
    }

    #[test]
    fn epoch_record_round_trip_and_refusals() {
        let mut slot = vec![0xEE; 4096];
        write_epoch(7, &mut slot);
        assert_eq!(parse_epoch(&slot), Ok(7));
        assert!(slot[EPOCH_RECORD_LEN..].iter().all(|&b| b == 0));
        assert_eq!(parse_epoch(&[0; 4096]), Err(EpochError::Unwritten));
        assert_eq!(parse_epoch(&slot[..10]), Err(EpochError::TooShort { len: 10 }));
        let mut bad = slot.clone();
        bad[EPOCH_VALUE_AT] ^= 1;
        assert!(matches!(parse_epoch(&bad), Err(EpochError::Crc { .. })));
        let mut bad = slot.clone();
        bad[0] = b'X';
        assert_eq!(parse_epoch(&bad), Err(EpochError::NotARecord));
        let mut bad = slot;
        bad[EPOCH_VERSION_AT] = 9;
        assert_eq!(parse_epoch(&bad), Err(EpochError::UnknownVersion { version: 9 }));
    }

    /// The entry exactly as the journal writes it: envelope, chunk, zero padding.
    fn entry(envelope: Envelope, chunk: ChunkBuilder) -> Vec<u8> {
        let mut sealed = chunk.seal();
        let envelope = Envelope {
            chunk_len: sealed.bytes().len() as u32,
            chunk_header_crc: u32::from_le_bytes(
                sealed.bytes()[60..64].try_into().expect("4 bytes"),
            ),
            ..envelope
        };
        envelope.write(sealed.envelope_mut());
        sealed.padded().to_vec()
    }

    #[test]
    fn golden_vectors() {
        let mut one = ChunkBuilder::new(StreamId([0xAB; 16]), 0, 4096);
        one.push_record(&[0x00, b'h', b'i'], 1_700_000_000_000).expect("fits");
        let first = Envelope {
            lsn: 0,
            epoch: 1,
            prev: None,
            chunk_len: 0,
            chunk_header_crc: 0,
            group_end: true,
        };
        let first_entry = entry(first, one);
        let (_, first_crc) =
            Envelope::parse(first_entry.first_chunk().expect("64 bytes")).expect("valid");
        let mut two = ChunkBuilder::new(StreamId([0xAB; 16]), 1, 8192);
        two.push_record(&[0x00, b'y', b'o'], 1_700_000_000_001).expect("fits");
        two.push_record(&vec![0x00; 4100], 1_700_000_000_001).expect("fits");
        let second = Envelope {
            lsn: 4096,
            epoch: 2,
            prev: Some(Link { lsn: 0, crc: first_crc }),
            chunk_len: 0,
            chunk_header_crc: 0,
            group_end: false,
        };
        let second_entry = entry(second, two);
        for bytes in [&first_entry, &second_entry] {
            assert!(bytes.len().is_multiple_of(4096));
            let (envelope, _) =
                Envelope::parse(bytes.first_chunk().expect("64 bytes")).expect("ok");
            let chunk = &bytes[ENVELOPE_LEN..ENVELOPE_LEN + envelope.chunk_len as usize];
            assert_eq!(Chunk::parse(chunk).map(drop), Ok(()));
        }
        let mut slot = vec![0; 4096];
        write_epoch(2, &mut slot);
        crate::golden::check(
            "journal_vectors.txt",
            &[
                ("entry: one record at lsn 0, epoch 1, group end", first_entry),
                ("entry: two records at lsn 4096, epoch 2, chained, mid-group", second_entry),
                ("epoch record 2", slot[..EPOCH_RECORD_LEN].to_vec()),
            ],
        );
    }

    proptest! {
        #[test]
        fn envelope_round_trip(
            lsn in any::<u64>(),
            epoch in any::<u64>(),
            prev in prop::option::of((0..u64::MAX, any::<u32>())),
            chunk_len in any::<u32>(),
            chunk_header_crc in any::<u32>(),
            group_end in any::<bool>(),
        ) {
            let envelope = Envelope {
                lsn,
                epoch,
                prev: prev.map(|(lsn, crc)| Link { lsn, crc }),
                chunk_len,
                chunk_header_crc,
                group_end,
            };
            prop_assert_eq!(Envelope::parse(&encoded(&envelope)).map(|(e, _)| e), Ok(envelope));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::array::uniform32(any::<u8>()), fix in any::<bool>()) {
            let mut envelope = [0u8; ENVELOPE_LEN];
            envelope[..32].copy_from_slice(&bytes);
            envelope[32..].copy_from_slice(&bytes);
            if fix {
                envelope[..4].copy_from_slice(&MAGIC);
                envelope[4..6].copy_from_slice(&1u16.to_le_bytes());
                reseal(&mut envelope);
            }
            let _ = Envelope::parse(&envelope);
            let _ = parse_epoch(&bytes);
        }
    }
}
