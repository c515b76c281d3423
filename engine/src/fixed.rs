//! The checks that open every fixed-size header or footer of nova's formats (the chunk
//! header, the transit bundle and settled object footers): magic, format version, CRC,
//! reserved bytes zero, in that order, so every format refuses damage the same way.
//! Each format maps a [`FixedFault`] onto its own corruption variants.

use crate::le::{u16_at, u32_at};

/// Where a format's magic and version sit: its first six bytes.
pub(crate) const MAGIC_AT: usize = 0;
pub(crate) const VERSION_AT: usize = MAGIC_AT + 4;

/// A fixed-size header or footer's shape.
pub(crate) struct Fixed<'a> {
    pub magic: [u8; 4],
    pub version: u16,
    /// The CRC-32 of every byte before this offset is stored at this offset.
    pub crc_at: usize,
    /// `(offset, width)` of every reserved range, which must be zero.
    pub reserved: &'a [(usize, usize)],
}

/// The first check a header or footer failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FixedFault {
    BadMagic { found: [u8; 4] },
    UnknownVersion { version: u16 },
    Crc { stored: u32, computed: u32 },
    ReservedNotZero { offset: u8 },
}

/// The first two checks alone, for a header whose CRC covers more than itself (a slot
/// envelope's covers the chunk that follows it).
pub(crate) fn check_magic_version(
    bytes: &[u8],
    magic: [u8; 4],
    version: u16,
) -> Result<(), FixedFault> {
    let found: [u8; 4] = bytes[MAGIC_AT..VERSION_AT].try_into().expect("4 bytes");
    if found != magic {
        return Err(FixedFault::BadMagic { found });
    }
    let found_version = u16_at(bytes, VERSION_AT);
    if found_version != version {
        return Err(FixedFault::UnknownVersion { version: found_version });
    }
    Ok(())
}

impl Fixed<'_> {
    /// Checks `bytes` (at least `crc_at + 4` long: the caller sliced the header).
    pub(crate) fn check(&self, bytes: &[u8]) -> Result<(), FixedFault> {
        check_magic_version(bytes, self.magic, self.version)?;
        let stored = u32_at(bytes, self.crc_at);
        let computed = crc32fast::hash(&bytes[..self.crc_at]);
        if stored != computed {
            return Err(FixedFault::Crc { stored, computed });
        }
        match self
            .reserved
            .iter()
            .find(|(at, width)| bytes[*at..at + width].iter().any(|&b| b != 0))
        {
            Some(&(offset, _)) => Err(FixedFault::ReservedNotZero {
                offset: u8::try_from(offset).expect("headers and footers are 64 bytes"),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Fixed<'static> =
        Fixed { magic: *b"TEST", version: 3, crc_at: 12, reserved: &[(6, 2)] };

    fn good() -> Vec<u8> {
        let mut bytes = b"TEST\x03\x00\x00\x00abcd".to_vec();
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn checks_in_order() {
        assert_eq!(SHAPE.check(&good()), Ok(()));
        let mut bad = good();
        bad[0] = b'X';
        bad[4] = 9;
        assert_eq!(SHAPE.check(&bad), Err(FixedFault::BadMagic { found: *b"XEST" }), "magic first");
        let mut bad = good();
        bad[4] = 9;
        assert_eq!(
            SHAPE.check(&bad),
            Err(FixedFault::UnknownVersion { version: 9 }),
            "then version"
        );
        let mut bad = good();
        bad[8] ^= 1;
        assert!(matches!(SHAPE.check(&bad), Err(FixedFault::Crc { .. })), "then the CRC");
        let mut bad = good();
        bad[7] = 1;
        let crc = crc32fast::hash(&bad[..12]);
        bad[12..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            SHAPE.check(&bad),
            Err(FixedFault::ReservedNotZero { offset: 6 }),
            "then reserved"
        );
    }
}
