//! Stream identity: the 16-byte ID nova assigns at creation.
//!
//! An address `(bucket, key)` can be reused; an ID never is. Everything nova stores for a
//! stream is keyed by its ID (buckets.md, "Address and ID").

use std::fmt;

/// A stream's 16-byte identity. Printed as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub [u8; 16]);

impl StreamId {
    /// The ID's bytes, as stored in chunk headers and metadata keys.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Parses 32 hex digits (either case).
    pub fn from_hex(hex: &str) -> Option<Self> {
        let digits = hex.as_bytes();
        if digits.len() != 32 {
            return None;
        }
        let mut id = [0u8; 16];
        for (byte, pair) in id.iter_mut().zip(digits.chunks_exact(2)) {
            let high = (pair[0] as char).to_digit(16)?;
            let low = (pair[1] as char).to_digit(16)?;
            *byte = u8::try_from(high << 4 | low).ok()?;
        }
        Some(Self(id))
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamId({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let id = StreamId(*b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\xfe\xff");
        let hex = id.to_string();
        assert_eq!(hex, "000102030405060708090a0b0c0dfeff");
        assert_eq!(StreamId::from_hex(&hex), Some(id));
        assert_eq!(StreamId::from_hex(&hex.to_uppercase()), Some(id));
    }

    #[test]
    fn hex_refuses_bad_input() {
        assert_eq!(StreamId::from_hex(""), None);
        assert_eq!(StreamId::from_hex("00"), None);
        assert_eq!(StreamId::from_hex(&"g".repeat(32)), None);
        assert_eq!(StreamId::from_hex(&"0".repeat(33)), None);
    }
}
