//! Positions in a stream: a sequence number with the timestamp of the record there.

/// A record's position, or a stream's tail: `(next_seq_num, last_timestamp)`.
///
/// An empty stream's tail is `(0, 0)` (streams.md, "The tail").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Position {
    /// The sequence number (for a tail: the number the next record will get).
    pub seq_num: u64,
    /// Milliseconds (for a tail: the timestamp of the last record).
    pub timestamp: u64,
}

/// A stream's tail: the number the next record gets, and the last record's timestamp.
pub type Tail = Position;
