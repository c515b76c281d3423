//! Byte ranges of a GET: what a caller may ask for, how it reads as an HTTP `Range`
//! header, and how it clips against an object's size. Both backends resolve a range
//! with the same rules, which are S3's: the end is clipped to the object, a start at or
//! past the end is unsatisfiable, a suffix longer than the object is the whole object.

use std::fmt;
use std::ops::Range;

/// The bytes of an object a GET returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ByteRange {
    /// The whole object (an empty object reads as no bytes).
    #[default]
    All,
    /// `start..end`, `end` clipped to the object's size; `start` must be below the size.
    Span(Range<u64>),
    /// From `start` to the end; `start` must be below the size.
    From(u64),
    /// The last `n` bytes, or the whole object when it is shorter (read a footer
    /// without knowing the size); an empty object has no last bytes.
    Last(u64),
}

impl From<Range<u64>> for ByteRange {
    fn from(range: Range<u64>) -> Self {
        ByteRange::Span(range)
    }
}

impl fmt::Display for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ByteRange::All => f.write_str("all"),
            ByteRange::Span(range) => write!(f, "{}..{}", range.start, range.end),
            ByteRange::From(start) => write!(f, "{start}.."),
            ByteRange::Last(n) => write!(f, "last {n}"),
        }
    }
}

/// A range that can never be satisfied, whatever the object: refused before any
/// request (S3 would silently ignore such a `Range` header and send the whole object).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeRule {
    #[error("range {start}..{end} is empty")]
    Empty { start: u64, end: u64 },
    #[error("a suffix range of 0 bytes is empty")]
    EmptySuffix,
}

impl ByteRange {
    /// Refuses ranges that are empty whatever the object's size.
    pub(crate) fn check(&self) -> Result<(), RangeRule> {
        match *self {
            ByteRange::Span(Range { start, end }) if start >= end => {
                Err(RangeRule::Empty { start, end })
            }
            ByteRange::Last(0) => Err(RangeRule::EmptySuffix),
            _ => Ok(()),
        }
    }

    /// The `Range` header value, `None` for the whole object. Call after [`Self::check`].
    pub(crate) fn header(&self) -> Option<String> {
        match self {
            ByteRange::All => None,
            // HTTP ranges are inclusive; `check` made `end > start >= 0`.
            ByteRange::Span(range) => {
                Some(format!("bytes={}-{}", range.start, range.end.saturating_sub(1)))
            }
            ByteRange::From(start) => Some(format!("bytes={start}-")),
            ByteRange::Last(n) => Some(format!("bytes=-{n}")),
        }
    }

    /// The offsets this range selects in an object of `size` bytes, or `None` when it
    /// is unsatisfiable there. Call after [`Self::check`].
    pub(crate) fn resolve(&self, size: u64) -> Option<Range<u64>> {
        match *self {
            ByteRange::All => Some(0..size),
            ByteRange::Span(Range { start, end }) => (start < size).then(|| start..end.min(size)),
            ByteRange::From(start) => (start < size).then_some(start..size),
            ByteRange::Last(n) => (size > 0).then(|| size - n.min(size)..size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_s3() {
        assert_eq!(ByteRange::All.resolve(10), Some(0..10));
        assert_eq!(ByteRange::All.resolve(0), Some(0..0));
        assert_eq!(ByteRange::from(2..5).resolve(10), Some(2..5));
        assert_eq!(ByteRange::from(2..50).resolve(10), Some(2..10));
        assert_eq!(ByteRange::from(10..50).resolve(10), None);
        assert_eq!(ByteRange::From(9).resolve(10), Some(9..10));
        assert_eq!(ByteRange::From(10).resolve(10), None);
        assert_eq!(ByteRange::Last(3).resolve(10), Some(7..10));
        assert_eq!(ByteRange::Last(30).resolve(10), Some(0..10));
        assert_eq!(ByteRange::Last(3).resolve(0), None);
    }

    #[test]
    fn headers_are_inclusive() {
        assert_eq!(ByteRange::All.header(), None);
        assert_eq!(ByteRange::from(0..1).header().as_deref(), Some("bytes=0-0"));
        assert_eq!(ByteRange::from(5..10).header().as_deref(), Some("bytes=5-9"));
        assert_eq!(ByteRange::From(7).header().as_deref(), Some("bytes=7-"));
        assert_eq!(ByteRange::Last(4).header().as_deref(), Some("bytes=-4"));
    }

    #[test]
    fn refuses_empty_ranges() {
        assert_eq!(ByteRange::from(5..5).check(), Err(RangeRule::Empty { start: 5, end: 5 }));
        assert_eq!(
            ByteRange::Span(Range { start: 6, end: 5 }).check(),
            Err(RangeRule::Empty { start: 6, end: 5 })
        );
        assert_eq!(ByteRange::Last(0).check(), Err(RangeRule::EmptySuffix));
        assert_eq!(ByteRange::From(0).check(), Ok(()));
    }
}
