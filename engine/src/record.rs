//! The stored-record codec: the bytes nova keeps for one record (records.md, "Codec").
//!
//! ```text
//! ┌──────┬───────┬─────────────────────────────┬────────────────┬──────┐
//! │ flag │ count │ (nameLen, valueLen) × count │ names + values │ body │
//! └──────┴───────┴─────────────────────────────┴────────────────┴──────┘
//!         └── header table: only when the record has headers ───┘
//!
//! flag, bits from the least significant
//!   0–1  count width         00 = no headers (the body follows at once), 01 = one byte,
//!                            10 and 11 reserved
//!   2–3  name-length width   00…11 = 1…4 bytes, little-endian
//!   4–5  value-length width  the same scale
//!   6–7  reserved            zero
//! ```
//!
//! The body has no length of its own: the chunk directory (or the binary framing) frames
//! the whole stored record, and the body is what follows the header table. Sequence
//! number and timestamp are not in these bytes either; the chunk directory keeps them.
//!
//! The decoder is strict: every refusal is [`Corruption`], never a panic and never a
//! guess. Decoding a headerless record is a flag check and a slice; a header table is
//! one fixed-width block whose extent is added up, after which names and values are
//! sliced without scanning.
//!
//! This module never checks domain limits (header count, name non-empty, record size):
//! that is [`crate::batch`]'s job. It only knows the format.

use std::fmt;

/// Bits 0–1 of the flag: the width code of the header count.
const COUNT_WIDTH_MASK: u8 = 0b0000_0011;
/// Bits 2–3: the width code of each name length.
const NAME_WIDTH_SHIFT: u32 = 2;
/// Bits 4–5: the width code of each value length.
const VALUE_WIDTH_SHIFT: u32 = 4;
/// Bits 6–7: reserved, always zero in this format version.
const RESERVED_MASK: u8 = 0b1100_0000;
/// Count width code `01`: the count is one byte.
const COUNT_ONE_BYTE: u8 = 0b01;

/// The flag of a record without headers: the body follows at once.
pub const FLAG_HEADERLESS: u8 = 0x00;
/// The most headers the format can carry (the count is one byte). The domain limit is
/// lower ([`crate::limits::HEADERS_PER_RECORD_MAX`]).
pub const HEADERS_MAX: usize = u8::MAX as usize;

/// Why a stored record was refused. Each is corruption: there is one version of this
/// layout, so a refused record is damaged, never merely newer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    #[error("stored record is empty: it has no flag byte")]
    Empty,
    #[error("stored record flag {flag:#04x} sets reserved bits 6-7")]
    ReservedBits { flag: u8 },
    #[error("stored record flag {flag:#04x} uses reserved count width {:#04b}", flag & COUNT_WIDTH_MASK)]
    ReservedCountWidth { flag: u8 },
    #[error(
        "stored record flag {flag:#04x} sets length widths without headers (the headerless flag is 0x00)"
    )]
    HeaderlessWithWidths { flag: u8 },
    #[error("stored record has a one-byte header count of zero")]
    ZeroHeaderCount,
    #[error(
        "stored record header table needs {needed} bytes past the flag but only {available} remain"
    )]
    TableOverrun { needed: u64, available: u64 },
    #[error(
        "stored record headers need {needed} bytes past the header table but only {available} remain"
    )]
    HeadersOverrun { needed: u64, available: u64 },
}

/// Why a record could not be encoded: it does not fit the format at all (the domain
/// limits are far below these and are checked before encoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("a stored record carries at most {HEADERS_MAX} headers, not {count}")]
    TooManyHeaders { count: usize },
    #[error("a header name or value of {len} bytes does not fit a 4-byte length")]
    FieldTooLong { len: usize },
}

/// The smallest width code (0…3 for 1…4 bytes) whose width holds `max_len`.
/// Branch-free: three comparisons summed.
#[inline]
const fn width_code(max_len: u32) -> u8 {
    (max_len > 0xFF) as u8 + (max_len > 0xFFFF) as u8 + (max_len > 0x00FF_FFFF) as u8
}

/// Reads a little-endian unsigned integer of `width` (1…4) bytes at the start of `bytes`.
#[inline]
fn read_uint(bytes: &[u8], width: usize) -> u32 {
    debug_assert!((1..=4).contains(&width) && bytes.len() >= width);
    if let Some(word) = bytes.first_chunk::<4>() {
        // Common case: four bytes are readable, so load a whole word and mask.
        let mask = u32::MAX >> (32 - 8 * width as u32);
        u32::from_le_bytes(*word) & mask
    } else {
        let mut word = [0u8; 4];
        word[..width].copy_from_slice(&bytes[..width]);
        u32::from_le_bytes(word)
    }
}

/// The length of the stored form of a record with these headers and a body of
/// `body_len` bytes.
pub fn encoded_len<N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &[(N, V)], body_len: usize) -> usize {
    if headers.is_empty() {
        return 1 + body_len;
    }
    let (name_width, value_width, content) = widths(headers);
    2 + headers.len() * (name_width + value_width) + content + body_len
}

/// Name width, value width (in bytes) and the header content bytes of a header list.
fn widths<N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &[(N, V)]) -> (usize, usize, usize) {
    let (mut name_max, mut value_max, mut content) = (0usize, 0usize, 0usize);
    for (name, value) in headers {
        let (name, value) = (name.as_ref().len(), value.as_ref().len());
        name_max = name_max.max(name);
        value_max = value_max.max(value);
        content += name + value;
    }
    let code = |len: usize| width_code(u32::try_from(len).unwrap_or(u32::MAX));
    (usize::from(code(name_max)) + 1, usize::from(code(value_max)) + 1, content)
}

/// Appends the stored form of a record to `out`, choosing the smallest length widths
/// that fit this record's longest header name and longest value.
pub fn encode<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    headers: &[(N, V)],
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    if headers.is_empty() {
        out.reserve(1 + body.len());
        out.push(FLAG_HEADERLESS);
        out.extend_from_slice(body);
        return Ok(());
    }
    if headers.len() > HEADERS_MAX {
        return Err(EncodeError::TooManyHeaders { count: headers.len() });
    }
    for (name, value) in headers {
        for field in [name.as_ref(), value.as_ref()] {
            if u32::try_from(field.len()).is_err() {
                return Err(EncodeError::FieldTooLong { len: field.len() });
            }
        }
    }
    let (name_width, value_width, content) = widths(headers);
    out.reserve(2 + headers.len() * (name_width + value_width) + content + body.len());
    let flag = COUNT_ONE_BYTE
        | ((name_width as u8 - 1) << NAME_WIDTH_SHIFT)
        | ((value_width as u8 - 1) << VALUE_WIDTH_SHIFT);
    out.push(flag);
    out.push(headers.len() as u8); // <= HEADERS_MAX, checked above
    for (name, value) in headers {
        out.extend_from_slice(&(name.as_ref().len() as u32).to_le_bytes()[..name_width]);
        out.extend_from_slice(&(value.as_ref().len() as u32).to_le_bytes()[..value_width]);
    }
    for (name, value) in headers {
        out.extend_from_slice(name.as_ref());
        out.extend_from_slice(value.as_ref());
    }
    out.extend_from_slice(body);
    Ok(())
}

/// A decoded view of one stored record. Holds borrowed slices only.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StoredRecord<'a> {
    /// The fixed-width `(nameLen, valueLen)` table; empty for a headerless record.
    table: &'a [u8],
    /// Names and values back to back, in header order.
    header_bytes: &'a [u8],
    body: &'a [u8],
    count: u8,
    name_width: u8,
    value_width: u8,
}

/// Decodes one stored record, refusing every corruption records.md lists.
#[inline]
pub fn decode(bytes: &[u8]) -> Result<StoredRecord<'_>, Corruption> {
    let Some((&flag, rest)) = bytes.split_first() else { return Err(Corruption::Empty) };
    if flag == FLAG_HEADERLESS {
        return Ok(StoredRecord {
            table: &[],
            header_bytes: &[],
            body: rest,
            count: 0,
            name_width: 1,
            value_width: 1,
        });
    }
    decode_with_headers(flag, rest)
}

fn decode_with_headers(flag: u8, rest: &[u8]) -> Result<StoredRecord<'_>, Corruption> {
    if flag & RESERVED_MASK != 0 {
        return Err(Corruption::ReservedBits { flag });
    }
    match flag & COUNT_WIDTH_MASK {
        0 => return Err(Corruption::HeaderlessWithWidths { flag }),
        COUNT_ONE_BYTE => {}
        _ => return Err(Corruption::ReservedCountWidth { flag }),
    }
    let name_width = ((flag >> NAME_WIDTH_SHIFT) & 0b11) + 1;
    let value_width = ((flag >> VALUE_WIDTH_SHIFT) & 0b11) + 1;
    let Some((&count, rest)) = rest.split_first() else {
        return Err(Corruption::TableOverrun { needed: 1, available: 0 });
    };
    if count == 0 {
        return Err(Corruption::ZeroHeaderCount);
    }
    let pair = usize::from(name_width + value_width);
    let table_len = usize::from(count) * pair;
    if rest.len() < table_len {
        return Err(Corruption::TableOverrun {
            needed: 1 + table_len as u64,
            available: 1 + rest.len() as u64,
        });
    }
    let (table, rest) = rest.split_at(table_len);
    // Add up the extent of every name and value in one pass over the fixed-width table.
    let mut header_len: u64 = 0;
    for entry in table.chunks_exact(pair) {
        let (name, value) = entry.split_at(usize::from(name_width));
        header_len +=
            u64::from(read_uint(name, name.len())) + u64::from(read_uint(value, value.len()));
    }
    if (rest.len() as u64) < header_len {
        return Err(Corruption::HeadersOverrun {
            needed: header_len,
            available: rest.len() as u64,
        });
    }
    let (header_bytes, body) = rest.split_at(header_len as usize); // <= rest.len(), checked
    Ok(StoredRecord { table, header_bytes, body, count, name_width, value_width })
}

impl<'a> StoredRecord<'a> {
    /// The body bytes.
    #[inline]
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// How many headers the record carries.
    #[inline]
    pub fn header_count(&self) -> usize {
        usize::from(self.count)
    }

    /// The headers in order, as `(name, value)` slices.
    pub fn headers(&self) -> Headers<'a> {
        Headers {
            table: self.table,
            bytes: self.header_bytes,
            name_width: usize::from(self.name_width),
            value_width: usize::from(self.value_width),
        }
    }

    /// Content bytes: the body plus every header name and value (records.md). The one
    /// size every cap and budget meters; framing never counts.
    #[inline]
    pub fn content_len(&self) -> u64 {
        (self.header_bytes.len() + self.body.len()) as u64
    }
}

impl fmt::Debug for StoredRecord<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredRecord")
            .field("headers", &self.headers().collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// Iterator over a record's headers, slicing each name and value from the table.
#[derive(Clone, Debug)]
pub struct Headers<'a> {
    table: &'a [u8],
    bytes: &'a [u8],
    name_width: usize,
    value_width: usize,
}

impl<'a> Iterator for Headers<'a> {
    type Item = (&'a [u8], &'a [u8]);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.table.is_empty() {
            return None;
        }
        let name_len = read_uint(self.table, self.name_width) as usize;
        let value_len = read_uint(&self.table[self.name_width..], self.value_width) as usize;
        self.table = &self.table[self.name_width + self.value_width..];
        // decode() checked that the lengths sum to at most `bytes.len()`.
        let (name, rest) = self.bytes.split_at(name_len);
        let (value, rest) = rest.split_at(value_len);
        self.bytes = rest;
        Some((name, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.table.len() / (self.name_width + self.value_width);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Headers<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Owned = (Vec<(Vec<u8>, Vec<u8>)>, Vec<u8>);

    fn encoded(headers: &[(&[u8], &[u8])], body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(headers, body, &mut out).expect("fits");
        assert_eq!(out.len(), encoded_len(headers, body.len()));
        out
    }

    fn decoded(bytes: &[u8]) -> Owned {
        let record = decode(bytes).expect("valid");
        let headers = record.headers().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        (headers, record.body().to_vec())
    }

    #[test]
    fn seed_example_headerless() {
        assert_eq!(encoded(&[], b"hi"), [0x00, 0x68, 0x69]);
        let record = decode(&[0x00, 0x68, 0x69]).expect("valid");
        assert_eq!(record.body(), b"hi");
        assert_eq!(record.content_len(), 2);
        assert_eq!(record.header_count(), 0);
    }

    #[test]
    fn seed_example_one_header() {
        let bytes = [0x01, 0x01, 0x01, 0x01, 0x6b, 0x76, 0x68, 0x69];
        assert_eq!(encoded(&[(b"k", b"v")], b"hi"), bytes);
        let record = decode(&bytes).expect("valid");
        assert_eq!(record.content_len(), 4);
        assert_eq!(decoded(&bytes), (vec![(b"k".to_vec(), b"v".to_vec())], b"hi".to_vec()));
    }

    #[test]
    fn widths_are_the_smallest_that_fit() {
        for (len, code) in [(0, 0), (255, 0), (256, 1), (65_535, 1), (65_536, 2), (0xFF_FFFF, 2)] {
            assert_eq!(width_code(len), code, "{len}");
        }
        assert_eq!(width_code(0x0100_0000), 3);
        assert_eq!(width_code(u32::MAX), 3);
        // One 300-byte value pays two-byte value lengths, one-byte name lengths.
        let bytes = encoded(&[(b"k", &[7u8; 300])], b"");
        assert_eq!(bytes[0], 0b0001_0001);
        assert_eq!(&bytes[1..5], &[1, 1, 0x2c, 0x01]);
    }

    #[test]
    fn duplicate_names_keep_order() {
        let headers: [(&[u8], &[u8]); 3] = [(b"a", b"1"), (b"a", b"2"), (b"b", b"")];
        let (decoded_headers, body) = decoded(&encoded(&headers, b"x"));
        let expected: Vec<_> = headers.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        assert_eq!(decoded_headers, expected);
        assert_eq!(body, b"x");
    }

    #[test]
    fn encode_refuses_more_headers_than_the_format_holds() {
        let headers = vec![(b"n".as_slice(), b"v".as_slice()); HEADERS_MAX + 1];
        let mut out = Vec::new();
        assert_eq!(
            encode(&headers, b"", &mut out),
            Err(EncodeError::TooManyHeaders { count: 256 })
        );
        assert!(out.is_empty(), "a refused encode writes nothing");
    }

    #[test]
    fn refuses_empty() {
        assert_eq!(decode(&[]), Err(Corruption::Empty));
    }

    #[test]
    fn refuses_reserved_bits() {
        for flag in [0x41, 0x81, 0xC1, 0x40, 0x80] {
            let err = decode(&[flag, 1, 1, 1, b'k', b'v']).expect_err("reserved");
            assert!(
                matches!(
                    err,
                    Corruption::ReservedBits { .. } | Corruption::HeaderlessWithWidths { .. }
                ),
                "{flag:#x}: {err}"
            );
        }
        assert_eq!(
            decode(&[0x41, 1, 1, 1, b'k', b'v']),
            Err(Corruption::ReservedBits { flag: 0x41 })
        );
    }

    #[test]
    fn refuses_reserved_count_widths() {
        assert_eq!(
            decode(&[0x02, 1, 1, 1, b'k', b'v']),
            Err(Corruption::ReservedCountWidth { flag: 0x02 })
        );
        assert_eq!(
            decode(&[0x03, 1, 1, 1, b'k', b'v']),
            Err(Corruption::ReservedCountWidth { flag: 0x03 })
        );
    }

    #[test]
    fn refuses_zero_count() {
        assert_eq!(decode(&[0x01, 0x00, b'h', b'i']), Err(Corruption::ZeroHeaderCount));
    }

    #[test]
    fn refuses_headerless_flag_with_width_bits() {
        for flag in [0x04, 0x08, 0x0C, 0x10, 0x20, 0x30, 0x3C] {
            assert_eq!(decode(&[flag, b'h', b'i']), Err(Corruption::HeaderlessWithWidths { flag }));
        }
    }

    #[test]
    fn refuses_table_past_the_end() {
        // No count byte.
        assert_eq!(decode(&[0x01]), Err(Corruption::TableOverrun { needed: 1, available: 0 }));
        // Two headers announced, one pair of lengths present.
        assert_eq!(
            decode(&[0x01, 0x02, 0x01, 0x01]),
            Err(Corruption::TableOverrun { needed: 5, available: 3 })
        );
        // Four-byte widths, truncated table.
        assert!(matches!(
            decode(&[0x3D, 0x01, 1, 0, 0, 0, 1]),
            Err(Corruption::TableOverrun { .. })
        ));
    }

    #[test]
    fn refuses_header_bytes_past_the_end() {
        assert_eq!(
            decode(&[0x01, 0x01, 0x01, 0x05, b'k', b'v']),
            Err(Corruption::HeadersOverrun { needed: 6, available: 2 })
        );
        // A 4-byte length near u32::MAX never wraps.
        assert!(matches!(
            decode(&[0x31, 0x01, 0x01, 0xFF, 0xFF, 0xFF, 0xFF, b'k']),
            Err(Corruption::HeadersOverrun { .. })
        ));
    }

    /// Golden vectors beyond the seed's two: every width, many headers. Stored in
    /// `testdata/record_vectors.txt`; regenerate with `NOVA_BLESS=1`.
    #[test]
    fn golden_vectors() {
        let big_name = vec![b'n'; 256];
        let value_3 = vec![b'v'; 65_536];
        let value_4 = vec![b'w'; 0x0100_0000];
        let hundred: Vec<(Vec<u8>, Vec<u8>)> =
            (0..100u32).map(|i| (format!("h{i}").into_bytes(), i.to_le_bytes().to_vec())).collect();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("seed headerless hi", encoded(&[], b"hi")),
            ("seed one header k=v", encoded(&[(b"k", b"v")], b"hi")),
            ("empty body no headers", encoded(&[], b"")),
            ("empty value", encoded(&[(b"k", b"")], b"")),
            ("two-byte name width", encoded(&[(&big_name, b"v")], b"b")),
            ("three-byte value width", encoded(&[(b"k", &value_3)], b"b")),
            ("four-byte value width", encoded(&[(b"k", &value_4)], b"b")),
            ("100 headers", {
                let mut out = Vec::new();
                encode(&hundred, b"body", &mut out).expect("fits");
                out
            }),
        ];
        crate::golden::check("record_vectors.txt", &cases);
    }

    fn arb_record() -> impl Strategy<Value = Owned> {
        let field = |max| prop::collection::vec(any::<u8>(), 0..max);
        let header = (field(300), prop_oneof![field(16), field(70_000)]);
        (prop::collection::vec(header, 0..8), field(2048))
    }

    proptest! {
        #[test]
        fn round_trip((headers, body) in arb_record()) {
            let mut bytes = Vec::new();
            encode(&headers, &body, &mut bytes).expect("fits");
            prop_assert_eq!(bytes.len(), encoded_len(&headers, body.len()));
            let record = decode(&bytes).expect("round trip decodes");
            let content: usize = body.len() + headers.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>();
            prop_assert_eq!(record.content_len(), content as u64);
            prop_assert_eq!(decoded(&bytes), (headers, body));
        }

        /// The fuzz property: arbitrary bytes never panic, and whatever decodes is
        /// self-consistent (its parts add up to the input).
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(record) = decode(&bytes) {
                let framing = if record.header_count() == 0 { 1 } else {
                    2 + record.header_count() * usize::from(record.name_width + record.value_width)
                };
                prop_assert_eq!(record.content_len() as usize + framing, bytes.len());
                prop_assert_eq!(record.headers().count(), record.header_count());
            }
        }

        /// Flipping any byte of a valid record either still decodes consistently or is
        /// refused; it never panics.
        #[test]
        fn mutated_records_never_panic((headers, body) in arb_record(), at in any::<prop::sample::Index>(), xor in 1u8..) {
            let mut bytes = Vec::new();
            encode(&headers, &body, &mut bytes).expect("fits");
            let i = at.index(bytes.len());
            bytes[i] ^= xor;
            if let Ok(record) = decode(&bytes) {
                prop_assert_eq!(record.headers().count(), record.header_count());
            }
        }
    }
}
