//! Every fixed limit of `spec/limits.md`, and the few that are server flags.
//!
//! Sizes are content bytes (body plus every header name and value); encoding overhead
//! never counts. The numbers that are flags live in [`Limits`] with these defaults; the
//! `tuning` crate owns the flags themselves.

/// 1 MiB: the default per-record cap, inclusive (decisions.md). The flag is
/// [`tuning::RECORD_BYTES_MAX`], which owns the default.
pub const RECORD_BYTES_MAX_DEFAULT: u32 = tuning::RECORD_BYTES_MAX.default as u32;
const _: () = assert!(tuning::RECORD_BYTES_MAX.max <= u32::MAX as u64, "the record cap is a u32");
/// 100 MiB of content per batch.
pub const BATCH_BYTES_MAX: u64 = 100 << 20;
/// Records per batch.
pub const BATCH_RECORDS_MAX: u32 = 100_000;
/// Headers per record.
pub const HEADERS_PER_RECORD_MAX: usize = 100;
/// Bytes of UTF-8 in a fencing token.
pub const FENCING_TOKEN_BYTES_MAX: usize = 36;
/// Bytes in a creation token.
pub const CREATION_TOKEN_BYTES_MAX: usize = 64;
/// Entries in one page of ListBuckets or ListStreams (also the default).
pub const LIST_PAGE_MAX: u32 = 1000;
/// Records in one JSON read page.
pub const READ_PAGE_RECORDS_MAX_JSON: u32 = 1000;
/// Content bytes in one JSON read page.
pub const READ_PAGE_BYTES_MAX_JSON: u64 = 1 << 20;
/// Records in one binary-framing read page.
pub const READ_PAGE_RECORDS_MAX_BINARY: u32 = 100_000;
/// Content bytes in one binary-framing read page.
pub const READ_PAGE_BYTES_MAX_BINARY: u64 = 16 << 20;
/// Seconds a read may wait for new records.
pub const READ_WAIT_SECONDS_MAX: u32 = 60;
/// The largest sequence number a record may take (`u64::MAX - 1`, streams.md).
pub const SEQ_NUM_MAX: u64 = u64::MAX - 1;

/// The limits that a server flag may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Content bytes of one record, inclusive.
    pub record_bytes_max: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self { record_bytes_max: RECORD_BYTES_MAX_DEFAULT }
    }
}
