//! Object keys: the one rule both backends enforce, so a key that works on the local
//! directory works on S3 and back.
//!
//! A key is `/`-separated segments of `A-Z a-z 0-9 - _ .`, at most [`KEY_BYTES_MAX`]
//! bytes, each segment 1 to [`SEGMENT_BYTES_MAX`] bytes and neither `.` nor `..`. The
//! character set is deliberately narrow: such keys need no URL escaping on any S3
//! server, name files on any filesystem, and leave `~` free for the local backend's own
//! names (its object and temporary files), so no key can ever collide with them.
//!
//! This module only checks strings; it never builds keys (the engine does).

use std::fmt;

/// Longest key, in bytes. S3 allows 1,024 bytes for the whole key, which includes the
/// S3 backend's prefix ([`PREFIX_BYTES_MAX`]).
pub const KEY_BYTES_MAX: usize = 512;
/// Longest segment, in bytes: the local backend adds a one-byte marker and a filesystem
/// name is at most 255 bytes.
pub const SEGMENT_BYTES_MAX: usize = 200;
/// Longest S3 key prefix, in bytes, so that prefix, `/` and key fit S3's 1,024 bytes.
pub const PREFIX_BYTES_MAX: usize = 256;
const _: () = assert!(PREFIX_BYTES_MAX + 1 + KEY_BYTES_MAX <= 1024);
// The local backend's file name is the segment plus a one-byte marker.
const _: () = assert!(SEGMENT_BYTES_MAX < 255);

/// How much of an offending key an error quotes: a refused key may be huge.
const EXCERPT_CHARS_MAX: usize = 80;

/// The key rule a string broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRule {
    /// Empty, or longer than the limit.
    Length { len: usize, max: usize },
    /// A segment is empty: a leading, trailing or doubled `/`.
    EmptySegment { index: usize },
    /// A segment is `.` or `..`.
    DotSegment { index: usize },
    /// A segment is longer than [`SEGMENT_BYTES_MAX`].
    SegmentLength { index: usize, len: usize },
    /// A byte outside `A-Z a-z 0-9 - _ . /`.
    Character { offset: usize, byte: u8 },
}

impl fmt::Display for KeyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KeyRule::Length { len, max } => write!(f, "a key is 1 to {max} bytes, not {len}"),
            KeyRule::EmptySegment { index } => write!(
                f,
                "segment {index} is empty (keys have no leading, trailing or doubled '/')"
            ),
            KeyRule::DotSegment { index } => write!(f, "segment {index} is '.' or '..'"),
            KeyRule::SegmentLength { index, len } => {
                write!(f, "segment {index} is {len} bytes, more than {SEGMENT_BYTES_MAX}")
            }
            KeyRule::Character { offset, byte } => write!(
                f,
                "byte {offset} is {byte:#04x} {:?}; keys use only A-Z a-z 0-9 - _ . and '/'",
                char::from(byte)
            ),
        }
    }
}

fn allowed(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.')
}

/// Checks `key` against the key rule.
pub fn check_key(key: &str) -> Result<(), KeyRule> {
    check_segments(key, KEY_BYTES_MAX)
}

/// Checks an S3 key prefix: the key rule with [`PREFIX_BYTES_MAX`].
pub(crate) fn check_prefix(prefix: &str) -> Result<(), KeyRule> {
    check_segments(prefix, PREFIX_BYTES_MAX)
}

fn check_segments(key: &str, max: usize) -> Result<(), KeyRule> {
    let bytes = key.as_bytes();
    if bytes.is_empty() || bytes.len() > max {
        return Err(KeyRule::Length { len: bytes.len(), max });
    }
    check_characters(key)?;
    for (index, segment) in key.split('/').enumerate() {
        match segment {
            "" => return Err(KeyRule::EmptySegment { index }),
            "." | ".." => return Err(KeyRule::DotSegment { index }),
            _ if segment.len() > SEGMENT_BYTES_MAX => {
                return Err(KeyRule::SegmentLength { index, len: segment.len() });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks a list prefix: any string of key characters up to [`KEY_BYTES_MAX`] (empty
/// allowed); segments may be partial, since a prefix only bounds a scan, but no leading
/// or doubled `/`.
pub(crate) fn check_scan_bound(text: &str) -> Result<(), KeyRule> {
    if text.len() > KEY_BYTES_MAX {
        return Err(KeyRule::Length { len: text.len(), max: KEY_BYTES_MAX });
    }
    check_characters(text)?;
    if let Some(index) = text.split('/').enumerate().find_map(|(index, segment)| {
        // Only the last segment may be empty: "a/" is a fine prefix, "/a" and "a//b" are not.
        (segment.is_empty() && index + 1 < text.split('/').count()).then_some(index)
    }) {
        return Err(KeyRule::EmptySegment { index });
    }
    Ok(())
}

fn check_characters(text: &str) -> Result<(), KeyRule> {
    match text.bytes().enumerate().find(|&(_, byte)| !(allowed(byte) || byte == b'/')) {
        Some((offset, byte)) => Err(KeyRule::Character { offset, byte }),
        None => Ok(()),
    }
}

/// The part of `key` an error message quotes.
pub(crate) fn excerpt(key: &str) -> String {
    if key.chars().count() <= EXCERPT_CHARS_MAX {
        key.to_owned()
    } else {
        let mut short: String = key.chars().take(EXCERPT_CHARS_MAX).collect();
        short.push('…');
        short
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_keys_nova_makes() {
        for key in [
            "a",
            "transit/0000000000000001",
            "my-bucket/0123abcd/00000000000000000042",
            "a.b_c-D/9",
        ] {
            assert_eq!(check_key(key), Ok(()), "{key}");
        }
        assert_eq!(check_key(&"k".repeat(SEGMENT_BYTES_MAX)), Ok(()));
        let longest = vec!["s".repeat(SEGMENT_BYTES_MAX); 2].join("/");
        assert!(longest.len() <= KEY_BYTES_MAX);
        assert_eq!(check_key(&longest), Ok(()));
    }

    #[test]
    fn refuses_each_rule() {
        assert_eq!(check_key(""), Err(KeyRule::Length { len: 0, max: KEY_BYTES_MAX }));
        let long = vec!["s"; KEY_BYTES_MAX / 2 + 1].join("/");
        assert_eq!(check_key(&long), Err(KeyRule::Length { len: long.len(), max: KEY_BYTES_MAX }));
        assert_eq!(check_key("/a"), Err(KeyRule::EmptySegment { index: 0 }));
        assert_eq!(check_key("a/"), Err(KeyRule::EmptySegment { index: 1 }));
        assert_eq!(check_key("a//b"), Err(KeyRule::EmptySegment { index: 1 }));
        assert_eq!(check_key("a/../b"), Err(KeyRule::DotSegment { index: 1 }));
        assert_eq!(check_key("."), Err(KeyRule::DotSegment { index: 0 }));
        assert_eq!(
            check_key(&"k".repeat(SEGMENT_BYTES_MAX + 1)),
            Err(KeyRule::SegmentLength { index: 0, len: SEGMENT_BYTES_MAX + 1 })
        );
        assert_eq!(check_key("a b"), Err(KeyRule::Character { offset: 1, byte: b' ' }));
        assert_eq!(check_key("a~"), Err(KeyRule::Character { offset: 1, byte: b'~' }));
        assert_eq!(check_key("é"), Err(KeyRule::Character { offset: 0, byte: 0xc3 }));
        assert_eq!(check_key("a\0"), Err(KeyRule::Character { offset: 1, byte: 0 }));
        assert!(check_key("a\\b").is_err());
    }

    #[test]
    fn scan_bounds_may_be_partial() {
        for bound in ["", "a", "a/", "a/b", "a/.", "a/b-"] {
            assert_eq!(check_scan_bound(bound), Ok(()), "{bound:?}");
        }
        assert_eq!(check_scan_bound("/a"), Err(KeyRule::EmptySegment { index: 0 }));
        assert_eq!(check_scan_bound("a//"), Err(KeyRule::EmptySegment { index: 1 }));
        assert!(check_scan_bound("a*").is_err());
    }

    #[test]
    fn excerpts_are_bounded() {
        assert_eq!(excerpt("short"), "short");
        assert_eq!(excerpt(&"x".repeat(10_000)).chars().count(), EXCERPT_CHARS_MAX + 1);
    }
}
