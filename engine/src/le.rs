//! Little-endian field access for the byte formats: every persisted or wire integer is
//! little-endian (docs/format.md). Callers check lengths first; an index past the slice
//! is a bug in the caller's bounds check, and panics.

/// The `u16` at byte `at`.
#[inline]
pub(crate) fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().expect("a 2-byte slice"))
}

/// The `u32` at byte `at`.
#[inline]
pub(crate) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("a 4-byte slice"))
}

/// The `u64` at byte `at`.
#[inline]
pub(crate) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("an 8-byte slice"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_little_endian() {
        let bytes = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(super::u16_at(&bytes, 1), 0x0302);
        assert_eq!(super::u32_at(&bytes, 0), 0x0403_0201);
        assert_eq!(super::u64_at(&bytes, 1), 0x0908_0706_0504_0302);
    }
}
