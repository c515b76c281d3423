//! The engine's error type: specific variants carrying the numbers, and a coarse
//! [`Code`] (the canonical gRPC names of `spec/http-api.md`) that tells a caller what
//! kind of failure it is and whether a retry can help.
//!
//! Messages are lowercase and name the field, the offending value and the limit, so a
//! caller can fix the request from the message alone. The details a response carries
//! beside the message (`tail`, `next_seq_num`, `fencing_token`, `Retry-After`) come from
//! the accessors ([`Error::tail`], ...), never from parsing a message.
//!
//! This module never decides when an error happens (the rules live in `names`,
//! `options`, `timestamp` and the data path) and never maps a [`Code`] to an HTTP status:
//! that happens in exactly one place, in `net`.

use crate::ids::StreamId;
use crate::journal::JournalError;
use crate::limits::SEQ_NUM_MAX;
use crate::meta::MetaError;
use crate::names::{BucketName, BucketNameRule, StreamKey, StreamKeyRule};
use crate::position::Tail;

/// The coarse kind of an error, as the public API reports it.
///
/// `#[repr(u8)]` with explicit values: these may be persisted or sent; never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Code {
    InvalidArgument = 1,
    Unauthenticated = 2,
    PermissionDenied = 3,
    NotFound = 4,
    AlreadyExists = 5,
    FailedPrecondition = 6,
    OutOfRange = 7,
    ResourceExhausted = 8,
    Internal = 9,
    Unavailable = 10,
}

impl Code {
    /// Every code.
    pub const ALL: [Code; 10] = [
        Code::InvalidArgument,
        Code::Unauthenticated,
        Code::PermissionDenied,
        Code::NotFound,
        Code::AlreadyExists,
        Code::FailedPrecondition,
        Code::OutOfRange,
        Code::ResourceExhausted,
        Code::Internal,
        Code::Unavailable,
    ];

    /// The code whose wire name is `name`.
    pub fn from_name(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|code| code.as_str() == name)
    }

    /// The snake-case wire name (`invalid_argument`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::FailedPrecondition => "failed_precondition",
            Code::OutOfRange => "out_of_range",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
        }
    }

    /// Whether the same request may succeed if simply sent again later.
    pub const fn is_retryable(self) -> bool {
        matches!(self, Code::ResourceExhausted | Code::Unavailable)
    }
}

/// Every error the engine reports.
///
/// Grouped by [`Code`]; [`Error::code`] matches every variant by name (no wildcard), so a
/// new variant cannot compile without a decision about its kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    // ---- InvalidArgument: names and options -------------------------------------------
    /// A bucket name breaks a rule of buckets.md. `name` is a printable excerpt.
    #[error("invalid bucket name {name:?}: {rule}")]
    InvalidBucketName { name: String, rule: BucketNameRule },

    /// A stream key breaks a rule of buckets.md. `key` is a printable excerpt (lossy when
    /// the key was not UTF-8).
    #[error("invalid stream key {key:?}: {rule}")]
    InvalidStreamKey { key: String, rule: StreamKeyRule },

    /// An option value that is not one of the accepted words (or otherwise malformed).
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidOptionValue { field: &'static str, value: String, reason: String },

    /// A numeric option outside its range (options.rs, docs/decisions/0002).
    #[error("{field} {value} is out of range: it must be between {min} and {max}")]
    OptionOutOfRange { field: &'static str, value: u64, min: u64, max: u64 },

    /// ReconfigureStream tried to change an option fixed at creation.
    #[error("{field} is fixed at creation and cannot be changed by reconfigure")]
    OptionImmutable { field: &'static str },

    /// Uncapped timestamping together with age retention, at create or update, for a
    /// stream or a bucket's defaults (records.md, Timestamps). The field names are the
    /// wire names of where the combination was found; `from_bucket` names the bucket
    /// default a stream's create took one of them from (the request did not send it).
    #[error(
        "{uncapped_field} cannot be combined with {age_field} {retention_max_age_ms}: \
         age retention reads record time as wall-clock time{}",
        from_bucket.map_or(String::new(), |field| format!(
            " (the stream would take the bucket's {field})"
        ))
    )]
    UncappedWithAgeRetention {
        uncapped_field: &'static str,
        age_field: &'static str,
        retention_max_age_ms: u64,
        from_bucket: Option<&'static str>,
    },

    /// A bucket's opaque location is longer than nova stores.
    #[error("location is {len} bytes, over the limit of {limit}")]
    LocationTooLong { len: usize, limit: usize },

    // ---- InvalidArgument: appends ------------------------------------------------------
    /// Under `client-require`, a record of the batch offers no timestamp.
    #[error(
        "record {index} carries no timestamp, but the stream's timestamping mode \
         client-require needs one on every record"
    )]
    TimestampRequired { index: u32 },

    /// Under `arrival`, a record of the batch offers a timestamp.
    #[error(
        "record {index} carries a timestamp, but the stream's timestamping mode arrival \
         stamps records itself"
    )]
    TimestampNotAllowed { index: u32 },

    /// An append with no records.
    #[error("a batch must carry at least one record")]
    EmptyBatch,

    /// A batch whose chunk would not fit one journal entry (a segment): the server's
    /// `--journal-segment-bytes` is set below what this batch needs.
    #[error(
        "batch needs a {chunk_bytes}-byte journal entry, over the largest entry of {limit} \
         bytes (raise --journal-segment-bytes)"
    )]
    BatchTooLargeForJournal { chunk_bytes: u64, limit: u64 },

    /// A batch its leader could never hold: its bytes are over the shard's whole memory
    /// budget, so no retry would ever find room (unlike a budget that is full now).
    #[error(
        "batch needs {bytes} bytes of its leader's memory, over the whole budget of \
         {budget_bytes} bytes (raise --shard-memory-bytes)"
    )]
    BatchOverMemoryBudget { bytes: u64, budget_bytes: u64 },

    /// A stored record in an append that is not well-formed (records.md, "Codec").
    #[error("record {index} is malformed: {source}")]
    MalformedRecord { index: u32, source: crate::record::Corruption },

    /// An append with more records than a batch may carry.
    #[error("batch has {count} records, over the batch limit of {limit}")]
    TooManyRecords { count: u64, limit: u32 },

    /// An append whose content bytes exceed the batch cap.
    #[error("batch is {bytes} content bytes, over the batch limit of {limit}")]
    BatchTooLarge { bytes: u64, limit: u64 },

    /// A record whose content bytes exceed the record cap (inclusive: `size == limit` is
    /// accepted).
    #[error("record {index} is {size} content bytes, over the record limit of {limit}")]
    RecordTooLarge { index: u32, size: u64, limit: u32 },

    /// A record with more headers than allowed.
    #[error("record {index} has {count} headers, over the limit of {limit}")]
    TooManyHeaders { index: u32, count: usize, limit: usize },

    /// A header with an empty name.
    #[error("record {index} header {header} has an empty name; header names are non-empty")]
    EmptyHeaderName { index: u32, header: u32 },

    /// A fencing token longer than allowed.
    #[error("{field} is {len} bytes, over the limit of {limit} for a fencing token")]
    FencingTokenTooLong { field: &'static str, len: usize, limit: usize },

    /// A fencing token that is not UTF-8.
    #[error("fencing token is not valid UTF-8")]
    FencingTokenNotUtf8,

    /// A creation token longer than allowed.
    #[error("creation token is {len} bytes, over the limit of {limit}")]
    CreationTokenTooLong { len: usize, limit: usize },

    /// A list page `limit` of 0 or above the page cap.
    #[error("limit {limit} is out of range: a list page holds between 1 and {max} entries")]
    ListLimitOutOfRange { limit: u64, max: u32 },

    /// A read bound that is present but unusable (0 for `count`/`bytes`, `wait` above
    /// the cap). Build with [`Error::read_bound_zero`] or [`Error::read_wait_too_long`].
    #[error("read {field} {value} is invalid: {reason}")]
    InvalidReadBound { field: &'static str, value: u64, reason: &'static str },

    /// An append that would number a record past [`SEQ_NUM_MAX`] (streams.md).
    #[error(
        "appending {count} records at seq_num {next_seq_num} would number past the last \
         seq_num {SEQ_NUM_MAX}"
    )]
    SeqNumOverflow { next_seq_num: u64, count: u64 },

    // ---- NotFound -----------------------------------------------------------------------
    #[error("bucket {bucket:?} not found")]
    BucketNotFound { bucket: String },

    #[error("stream {key:?} not found in bucket {bucket:?}")]
    StreamNotFound { bucket: String, key: String },

    /// A lookup by stream ID (the engine's, never a client's) found no stream that ever
    /// had the ID.
    #[error("stream id {id} not found")]
    StreamIdNotFound { id: StreamId },

    // ---- AlreadyExists ------------------------------------------------------------------
    #[error("bucket {bucket:?} already exists")]
    BucketAlreadyExists { bucket: String },

    #[error("stream {key:?} already exists in bucket {bucket:?}")]
    StreamAlreadyExists { bucket: String, key: String },

    // ---- FailedPrecondition -------------------------------------------------------------
    /// DeleteBucket while streams still live in it.
    #[error("bucket {bucket:?} still holds streams; delete them first")]
    BucketNotEmpty { bucket: String },

    /// `match_seq_num` differs from the number the first record would get.
    #[error("match_seq_num {match_seq_num} does not match the next seq_num {next_seq_num}")]
    SeqNumMismatch { match_seq_num: u64, next_seq_num: u64 },

    /// An append (`field` = `fencing_token`) or Fence (`expected`) carried a token other
    /// than the stream's current one.
    #[error("{field} does not match the stream's current fencing token {current:?}")]
    FencingTokenMismatch { field: &'static str, current: String },

    /// An append without a token on a stream whose producer policy is `fenced`.
    #[error(
        "the stream's producer policy is fenced: an append must carry the current \
         fencing token {current:?}"
    )]
    FencingTokenMissing { current: String },

    // ---- OutOfRange ---------------------------------------------------------------------
    /// A start position past the tail (streams.md); carries the tail.
    #[error("start {start} is past the tail {}", tail.seq_num)]
    PastTail { start: u64, tail: Tail },

    // ---- ResourceExhausted --------------------------------------------------------------
    /// An append over the stream's `throughput_max_bytes_per_second`.
    #[error(
        "stream throughput is over its limit of {limit_bytes_per_second} bytes per second; \
         retry after {retry_after_ms} ms"
    )]
    ThroughputExceeded { limit_bytes_per_second: u64, retry_after_ms: u64 },

    /// The leader's memory budget is full.
    #[error(
        "the leader's memory budget of {budget_bytes} bytes is full; retry after \
         {retry_after_ms} ms"
    )]
    MemoryBudgetExhausted { budget_bytes: u64, retry_after_ms: u64 },

    // ---- Unavailable / Internal ---------------------------------------------------------
    /// Something the request needs is not serving (yet): recovery, a store, a leader.
    #[error("{what} is unavailable")]
    Unavailable { what: String },

    /// A control-plane verb lost its metadata race `attempts` times in a row to
    /// concurrent changes of the same rows; nothing was changed, and a retry may succeed.
    #[error("{op} lost to concurrent changes {attempts} times in a row; retry")]
    Contended { op: &'static str, attempts: u32 },

    /// A broken invariant or an unexpected failure below the engine.
    #[error("internal error: {message}")]
    Internal { message: String },

    /// A binary-framing request body that is not well-formed (framing.rs).
    #[error("binary framing: {0}")]
    Framing(#[from] crate::framing::FramingError),

    /// Stored bytes (a chunk from the journal or object storage) failed their checks.
    /// Never the caller's fault: the data at rest is damaged.
    #[error("stored chunk is corrupt: {0}")]
    CorruptChunk(#[from] crate::chunk::Corruption),

    /// A slot (envelope and chunk) fetched from object storage failed its checks
    /// (transit.rs): a ranged GET of one slot, or a slot handed to a bundle or settled
    /// object builder.
    #[error("stored slot is corrupt: {0}")]
    CorruptSlot(#[from] crate::transit::SlotCorruption),

    /// A transit bundle, its footer or its index failed their checks (transit.rs).
    #[error("stored transit bundle is corrupt: {0}")]
    CorruptBundle(#[from] crate::transit::Corruption),

    /// A settled object, its footer or its index failed their checks (settled.rs).
    #[error("stored settled object is corrupt: {0}")]
    CorruptSettled(#[from] crate::settled::Corruption),

    /// The uploader refused a chunk handed to it (uploader.rs): its slot does not
    /// envelope, or its request's chunks overlap by sequence number. A caller's bug.
    #[error("chunk refused by the uploader: {0}")]
    UploadRefused(#[from] crate::transit::PushRefused),

    /// The object store refused an object's PUT (a transit bundle, a settled object) for
    /// a reason retrying will not fix (an invalid key or size, or a different object
    /// already under its key).
    #[error("object {key} could not be written: {reason}")]
    ObjectWriteFailed { key: String, reason: String },

    /// A ref could not be written: the object it names was marked dead by the auditor
    /// (it went unreferenced for a while). The chunks must be written anew.
    #[error("objects {objects} are marked dead; their chunks must be written anew")]
    ObjectDead { objects: String },

    /// The metadata store failed or refused a transaction. Callers turn the conflicts
    /// they expect (a taken address, a lost race) into their own variants first.
    #[error(transparent)]
    Meta(#[from] crate::meta::MetaError),

    /// The shard's express journal failed or refused (journal/mod.rs). After an i/o
    /// failure the journal accepts no more appends until it is reopened.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
}

impl Error {
    /// The coarse kind of this error.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidBucketName { .. }
            | Error::InvalidStreamKey { .. }
            | Error::InvalidOptionValue { .. }
            | Error::OptionOutOfRange { .. }
            | Error::OptionImmutable { .. }
            | Error::UncappedWithAgeRetention { .. }
            | Error::LocationTooLong { .. }
            | Error::TimestampRequired { .. }
            | Error::TimestampNotAllowed { .. }
            | Error::EmptyBatch
            | Error::MalformedRecord { .. }
            | Error::BatchTooLargeForJournal { .. }
            | Error::BatchOverMemoryBudget { .. }
            | Error::TooManyRecords { .. }
            | Error::BatchTooLarge { .. }
            | Error::RecordTooLarge { .. }
            | Error::TooManyHeaders { .. }
            | Error::EmptyHeaderName { .. }
            | Error::FencingTokenTooLong { .. }
            | Error::FencingTokenNotUtf8
            | Error::CreationTokenTooLong { .. }
            | Error::ListLimitOutOfRange { .. }
            | Error::InvalidReadBound { .. }
            | Error::SeqNumOverflow { .. } => Code::InvalidArgument,
            Error::BucketNotFound { .. }
            | Error::StreamNotFound { .. }
            | Error::StreamIdNotFound { .. } => Code::NotFound,
            Error::BucketAlreadyExists { .. } | Error::StreamAlreadyExists { .. } => {
                Code::AlreadyExists
            }
            Error::BucketNotEmpty { .. }
            | Error::SeqNumMismatch { .. }
            | Error::FencingTokenMismatch { .. }
            | Error::FencingTokenMissing { .. } => Code::FailedPrecondition,
            Error::PastTail { .. } => Code::OutOfRange,
            Error::ThroughputExceeded { .. } | Error::MemoryBudgetExhausted { .. } => {
                Code::ResourceExhausted
            }
            Error::Unavailable { .. } | Error::Contended { .. } => Code::Unavailable,
            Error::Internal { .. }
            | Error::CorruptChunk(_)
            | Error::CorruptSlot(_)
            | Error::CorruptBundle(_)
            | Error::CorruptSettled(_)
            | Error::UploadRefused(_)
            | Error::ObjectWriteFailed { .. }
            | Error::ObjectDead { .. } => Code::Internal,
            Error::Framing(_) => Code::InvalidArgument,
            Error::Meta(meta) => match meta {
                MetaError::Conflict { .. } => Code::FailedPrecondition,
                MetaError::Io { .. } | MetaError::Closed => Code::Unavailable,
                MetaError::Invalid(_) | MetaError::Corrupt { .. } => Code::Internal,
            },
            Error::Journal(journal) => match journal {
                JournalError::Io { .. } | JournalError::Stopped { .. } => Code::Unavailable,
                JournalError::WriteInFlight
                | JournalError::EntryTooLarge { .. }
                | JournalError::NoEntry { .. }
                | JournalError::Corrupt { .. }
                | JournalError::Damaged { .. }
                | JournalError::InvalidOption { .. } => Code::Internal,
            },
        }
    }

    /// Whether the same request may succeed if simply sent again later.
    pub fn is_retryable(&self) -> bool {
        self.code().is_retryable()
    }

    /// The stream's tail, for errors whose response carries it (`out_of_range`).
    pub fn tail(&self) -> Option<Tail> {
        match self {
            Error::PastTail { tail, .. } => Some(*tail),
            _ => None,
        }
    }

    /// The stream's next sequence number, for a `match_seq_num` mismatch.
    pub fn next_seq_num(&self) -> Option<u64> {
        match self {
            Error::SeqNumMismatch { next_seq_num, .. } => Some(*next_seq_num),
            _ => None,
        }
    }

    /// The stream's current fencing token, for fencing refusals.
    pub fn fencing_token(&self) -> Option<&str> {
        match self {
            Error::FencingTokenMismatch { current, .. }
            | Error::FencingTokenMissing { current } => Some(current),
            _ => None,
        }
    }

    /// How long the caller should wait before retrying (the `Retry-After` hint).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Error::ThroughputExceeded { retry_after_ms, .. }
            | Error::MemoryBudgetExhausted { retry_after_ms, .. } => Some(*retry_after_ms),
            _ => None,
        }
    }

    /// `count`, `bytes` or `limit` sent as 0: a bound is omitted to leave it unbounded.
    pub fn read_bound_zero(field: &'static str) -> Self {
        Error::InvalidReadBound {
            field,
            value: 0,
            reason: "a bound of 0 is not allowed; omit it to leave the read unbounded",
        }
    }

    /// `wait` above [`crate::limits::READ_WAIT_SECONDS_MAX`].
    pub fn read_wait_too_long(wait_seconds: u64) -> Self {
        // The reason is a literal, so keep it in step with the limit at compile time.
        const _: () = assert!(crate::limits::READ_WAIT_SECONDS_MAX == 60);
        Error::InvalidReadBound {
            field: "wait",
            value: wait_seconds,
            reason: "a read waits at most 60 seconds",
        }
    }

    pub fn bucket_not_found(bucket: &BucketName) -> Self {
        Error::BucketNotFound { bucket: bucket.as_str().to_owned() }
    }

    pub fn stream_not_found(bucket: &BucketName, key: &StreamKey) -> Self {
        Error::StreamNotFound { bucket: bucket.as_str().to_owned(), key: key.as_str().to_owned() }
    }

    pub fn bucket_already_exists(bucket: &BucketName) -> Self {
        Error::BucketAlreadyExists { bucket: bucket.as_str().to_owned() }
    }

    pub fn stream_already_exists(bucket: &BucketName, key: &StreamKey) -> Self {
        Error::StreamAlreadyExists {
            bucket: bucket.as_str().to_owned(),
            key: key.as_str().to_owned(),
        }
    }

    pub fn bucket_not_empty(bucket: &BucketName) -> Self {
        Error::BucketNotEmpty { bucket: bucket.as_str().to_owned() }
    }

    pub fn unavailable(what: impl Into<String>) -> Self {
        Error::Unavailable { what: what.into() }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Error::Internal { message: message.into() }
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{
        BATCH_BYTES_MAX, BATCH_RECORDS_MAX, CREATION_TOKEN_BYTES_MAX, FENCING_TOKEN_BYTES_MAX,
        HEADERS_PER_RECORD_MAX, LIST_PAGE_MAX, RECORD_BYTES_MAX_DEFAULT,
    };

    #[test]
    fn every_code_is_found_by_its_name() {
        for code in Code::ALL {
            assert_eq!(Code::from_name(code.as_str()), Some(code));
        }
        assert_eq!(Code::from_name("unknown"), None);
    }

    /// One example of every variant, with its code and words its message must contain.
    fn examples() -> Vec<(Error, Code, &'static [&'static str])> {
        let tail = Tail { seq_num: 10, timestamp: 99 };
        vec![
            (
                Error::InvalidBucketName {
                    name: "ab".into(),
                    rule: BucketNameRule::Length { len: 2 },
                },
                Code::InvalidArgument,
                &["bucket name", "\"ab\"", "2", "3", "63"],
            ),
            (
                Error::InvalidStreamKey {
                    key: String::new(),
                    rule: StreamKeyRule::Length { len: 0 },
                },
                Code::InvalidArgument,
                &["stream key", "512"],
            ),
            (
                Error::InvalidOptionValue {
                    field: "class",
                    value: "gold".into(),
                    reason: "accepted values are standard, express".into(),
                },
                Code::InvalidArgument,
                &["class", "gold", "standard, express"],
            ),
            (
                Error::OptionOutOfRange { field: "batch_max_bytes", value: 0, min: 1, max: 7 },
                Code::InvalidArgument,
                &["batch_max_bytes 0", "between 1 and 7"],
            ),
            (
                Error::OptionImmutable { field: "timestamping_mode" },
                Code::InvalidArgument,
                &["timestamping_mode", "fixed at creation"],
            ),
            (
                Error::UncappedWithAgeRetention {
                    uncapped_field: "timestamping_uncapped",
                    age_field: "retention_max_age_ms",
                    retention_max_age_ms: 60_000,
                    from_bucket: None,
                },
                Code::InvalidArgument,
                &["timestamping_uncapped", "retention_max_age_ms 60000:"],
            ),
            (
                Error::UncappedWithAgeRetention {
                    uncapped_field: "timestamping_uncapped",
                    age_field: "retention_max_age_ms",
                    retention_max_age_ms: 60_000,
                    from_bucket: Some("default_retention_max_age_ms"),
                },
                Code::InvalidArgument,
                &[
                    "wall-clock time (the stream would take the bucket's default_retention_max_age_ms)",
                ],
            ),
            (
                Error::LocationTooLong { len: 300, limit: 256 },
                Code::InvalidArgument,
                &["location", "300", "256"],
            ),
            (
                Error::TimestampRequired { index: 4 },
                Code::InvalidArgument,
                &["record 4", "client-require"],
            ),
            (
                Error::TimestampNotAllowed { index: 0 },
                Code::InvalidArgument,
                &["record 0", "arrival"],
            ),
            (Error::EmptyBatch, Code::InvalidArgument, &["at least one record"]),
            (
                Error::TooManyRecords { count: 100_001, limit: BATCH_RECORDS_MAX },
                Code::InvalidArgument,
                &["100001", "100000"],
            ),
            (
                Error::BatchTooLarge { bytes: BATCH_BYTES_MAX + 1, limit: BATCH_BYTES_MAX },
                Code::InvalidArgument,
                &["104857601", "104857600"],
            ),
            (
                Error::RecordTooLarge {
                    index: 3,
                    size: 1_048_577,
                    limit: RECORD_BYTES_MAX_DEFAULT,
                },
                Code::InvalidArgument,
                &["record 3 is 1048577 content bytes, over the record limit of 1048576"],
            ),
            (
                Error::TooManyHeaders { index: 1, count: 101, limit: HEADERS_PER_RECORD_MAX },
                Code::InvalidArgument,
                &["record 1", "101 headers", "100"],
            ),
            (
                Error::EmptyHeaderName { index: 2, header: 5 },
                Code::InvalidArgument,
                &["record 2 header 5", "empty name"],
            ),
            (
                Error::FencingTokenTooLong {
                    field: "fencing_token",
                    len: 37,
                    limit: FENCING_TOKEN_BYTES_MAX,
                },
                Code::InvalidArgument,
                &["fencing token", "37", "36"],
            ),
            (Error::FencingTokenNotUtf8, Code::InvalidArgument, &["fencing token", "utf-8"]),
            (
                Error::CreationTokenTooLong { len: 65, limit: CREATION_TOKEN_BYTES_MAX },
                Code::InvalidArgument,
                &["creation token", "65", "64"],
            ),
            (
                Error::ListLimitOutOfRange { limit: 1001, max: LIST_PAGE_MAX },
                Code::InvalidArgument,
                &["limit 1001", "1000"],
            ),
            (Error::read_bound_zero("count"), Code::InvalidArgument, &["read count 0", "omit"]),
            (Error::read_wait_too_long(61), Code::InvalidArgument, &["read wait 61", "60"]),
            (
                Error::SeqNumOverflow { next_seq_num: u64::MAX - 2, count: 3 },
                Code::InvalidArgument,
                &["3 records", "18446744073709551613", "18446744073709551614"],
            ),
            (
                Error::BucketNotFound { bucket: "apps".into() },
                Code::NotFound,
                &["bucket \"apps\" not found"],
            ),
            (
                Error::StreamNotFound { bucket: "apps".into(), key: "orders/eu".into() },
                Code::NotFound,
                &["\"orders/eu\"", "\"apps\"", "not found"],
            ),
            (
                Error::StreamIdNotFound { id: StreamId([0xab; 16]) },
                Code::NotFound,
                &["stream id abababababababababababababababab not found"],
            ),
            (
                Error::BucketAlreadyExists { bucket: "apps".into() },
                Code::AlreadyExists,
                &["\"apps\" already exists"],
            ),
            (
                Error::StreamAlreadyExists { bucket: "apps".into(), key: "orders".into() },
                Code::AlreadyExists,
                &["\"orders\" already exists", "\"apps\""],
            ),
            (
                Error::BucketNotEmpty { bucket: "apps".into() },
                Code::FailedPrecondition,
                &["\"apps\"", "streams"],
            ),
            (
                Error::SeqNumMismatch { match_seq_num: 5, next_seq_num: 7 },
                Code::FailedPrecondition,
                &["match_seq_num 5", "next seq_num 7"],
            ),
            (
                Error::FencingTokenMismatch { field: "expected", current: "writer-2".into() },
                Code::FailedPrecondition,
                &["expected does not match", "\"writer-2\""],
            ),
            (
                Error::FencingTokenMissing { current: "writer-2".into() },
                Code::FailedPrecondition,
                &["fenced", "\"writer-2\""],
            ),
            (Error::PastTail { start: 11, tail }, Code::OutOfRange, &["start 11", "tail 10"]),
            (
                Error::ThroughputExceeded { limit_bytes_per_second: 1000, retry_after_ms: 250 },
                Code::ResourceExhausted,
                &["1000 bytes per second", "250 ms"],
            ),
            (
                Error::MemoryBudgetExhausted { budget_bytes: 1 << 30, retry_after_ms: 50 },
                Code::ResourceExhausted,
                &["1073741824", "50 ms"],
            ),
            (Error::unavailable("recovery"), Code::Unavailable, &["recovery is unavailable"]),
            (
                Error::Contended { op: "create stream", attempts: 32 },
                Code::Unavailable,
                &["create stream", "32 times", "retry"],
            ),
            (Error::internal("chunk cursor ran backwards"), Code::Internal, &["cursor ran"]),
            (
                Error::MalformedRecord {
                    index: 4,
                    source: crate::record::Corruption::ReservedBits { flag: 0x80 },
                },
                Code::InvalidArgument,
                &["record 4", "0x80", "reserved"],
            ),
            (
                Error::BatchTooLargeForJournal { chunk_bytes: 300 << 20, limit: 256 << 20 },
                Code::InvalidArgument,
                &["314572800", "268435456", "--journal-segment-bytes"],
            ),
            (
                Error::BatchOverMemoryBudget { bytes: 17 << 20, budget_bytes: 16 << 20 },
                Code::InvalidArgument,
                &["17825792", "16777216", "whole budget", "--shard-memory-bytes"],
            ),
            (
                Error::Framing(crate::framing::FramingError::UnknownVersion { version: 9 }),
                Code::InvalidArgument,
                &["framing version 9"],
            ),
            (
                Error::CorruptChunk(crate::chunk::Corruption::UnknownVersion { version: 2 }),
                Code::Internal,
                &["corrupt", "version 2"],
            ),
            (
                Error::CorruptSlot(crate::transit::SlotCorruption::Crc {
                    stored: 0x1234_5678,
                    computed: 0x9abc_def0,
                }),
                Code::Internal,
                &["slot", "corrupt", "0x12345678", "0x9abcdef0"],
            ),
            (
                Error::CorruptBundle(crate::transit::Corruption::SlotsEndMismatch {
                    end: 4097,
                    index_offset: 4096,
                }),
                Code::Internal,
                &["transit bundle", "corrupt", "4097", "4096"],
            ),
            (
                Error::CorruptSettled(crate::settled::Corruption::NotContiguous {
                    slot: 2,
                    first_seq_num: 9,
                    expected: 7,
                }),
                Code::Internal,
                &["settled object", "corrupt", "entry 2", "seq_num 9", "7"],
            ),
            (
                Error::UploadRefused(crate::transit::PushRefused::TooManySlots { slots: 7 }),
                Code::Internal,
                &["refused by the uploader", "7 slots"],
            ),
            (
                Error::ObjectWriteFailed { key: "_transit/x".into(), reason: "invalid key".into() },
                Code::Internal,
                &["object _transit/x", "invalid key"],
            ),
            (
                Error::Meta(MetaError::Conflict { check: 0, key: b"a/b".to_vec(), found: None }),
                Code::FailedPrecondition,
                &["check 0", "a/b"],
            ),
            (Error::Meta(MetaError::Closed), Code::Unavailable, &["closed"]),
            (
                Error::Meta(MetaError::Io { op: "commit", message: "disk full".into() }),
                Code::Unavailable,
                &["commit", "disk full"],
            ),
            (
                Error::Meta(MetaError::Corrupt { message: "bad row".into() }),
                Code::Internal,
                &["bad row"],
            ),
            (
                Error::Journal(JournalError::Io {
                    op: "syncing",
                    path: "/data/journal/00000000000000000000.journal".into(),
                    message: "input/output error".into(),
                }),
                Code::Unavailable,
                &["journal", "syncing", "00000000000000000000.journal", "input/output error"],
            ),
            (
                Error::Journal(JournalError::Stopped { cause: "disk gone".into() }),
                Code::Unavailable,
                &["journal is stopped", "disk gone"],
            ),
            (
                Error::Journal(JournalError::WriteInFlight),
                Code::Internal,
                &["journal write", "in flight"],
            ),
            (
                Error::Journal(JournalError::EntryTooLarge { bytes: 8192, limit: 4096 }),
                Code::Internal,
                &["8192", "4096"],
            ),
            (
                Error::Journal(JournalError::NoEntry { lsn: 4096, head: 8192 }),
                Code::Internal,
                &["lsn 4096", "head 8192"],
            ),
            (
                Error::Journal(JournalError::Corrupt { lsn: 4096, reason: "bad crc".into() }),
                Code::Internal,
                &["lsn 4096", "corrupt", "bad crc"],
            ),
            (
                Error::Journal(JournalError::Damaged {
                    path: "/data/journal".into(),
                    reason: "a segment is missing".into(),
                }),
                Code::Internal,
                &["/data/journal", "a segment is missing"],
            ),
            (
                Error::Journal(JournalError::InvalidOption {
                    field: "segment_bytes",
                    value: 7,
                    reason: "too small",
                }),
                Code::Internal,
                &["segment_bytes 7", "too small"],
            ),
        ]
    }

    #[test]
    fn every_variant_has_its_code_and_a_lowercase_message_naming_the_values() {
        for (error, code, words) in examples() {
            assert_eq!(error.code(), code, "{error:?}");
            let message = error.to_string();
            let first = message.chars().next().expect("messages are never empty");
            assert!(!first.is_uppercase(), "message starts uppercase: {message}");
            assert!(!message.ends_with('.'), "message ends with a period: {message}");
            let lower = message.to_lowercase();
            for word in words {
                assert!(lower.contains(&word.to_lowercase()), "{message:?} lacks {word:?}");
            }
        }
    }

    #[test]
    fn record_too_large_message_is_exact() {
        let error = Error::RecordTooLarge { index: 3, size: 1_048_577, limit: 1_048_576 };
        assert_eq!(
            error.to_string(),
            "record 3 is 1048577 content bytes, over the record limit of 1048576"
        );
    }

    #[test]
    fn accessors_answer_only_for_their_variants() {
        let tail = Tail { seq_num: 10, timestamp: 99 };
        for (error, _, _) in examples() {
            let expect_tail = matches!(error, Error::PastTail { .. });
            let expect_next = matches!(error, Error::SeqNumMismatch { .. });
            let expect_token = matches!(
                error,
                Error::FencingTokenMismatch { .. } | Error::FencingTokenMissing { .. }
            );
            let expect_retry = matches!(
                error,
                Error::ThroughputExceeded { .. } | Error::MemoryBudgetExhausted { .. }
            );
            assert_eq!(error.tail().is_some(), expect_tail, "{error:?}");
            assert_eq!(error.next_seq_num().is_some(), expect_next, "{error:?}");
            assert_eq!(error.fencing_token().is_some(), expect_token, "{error:?}");
            assert_eq!(error.retry_after_ms().is_some(), expect_retry, "{error:?}");
            assert_eq!(error.is_retryable(), expect_retry || error.code() == Code::Unavailable);
        }
        assert_eq!(Error::PastTail { start: 11, tail }.tail(), Some(tail));
        assert_eq!(
            Error::SeqNumMismatch { match_seq_num: 5, next_seq_num: 7 }.next_seq_num(),
            Some(7)
        );
        assert_eq!(
            Error::FencingTokenMismatch { field: "expected", current: "a".into() }.fencing_token(),
            Some("a")
        );
        assert_eq!(Error::FencingTokenMissing { current: String::new() }.fencing_token(), Some(""));
        let exhausted = Error::ThroughputExceeded { limit_bytes_per_second: 1, retry_after_ms: 9 };
        assert_eq!(exhausted.retry_after_ms(), Some(9));
        let memory = Error::MemoryBudgetExhausted { budget_bytes: 1, retry_after_ms: 8 };
        assert_eq!(memory.retry_after_ms(), Some(8));
    }

    #[test]
    fn constructors_from_names_carry_the_address() {
        let bucket = BucketName::parse("apps").expect("valid bucket name");
        let key = StreamKey::parse("orders/eu").expect("valid stream key");
        assert_eq!(
            Error::stream_not_found(&bucket, &key),
            Error::StreamNotFound { bucket: "apps".into(), key: "orders/eu".into() }
        );
        assert_eq!(
            Error::stream_already_exists(&bucket, &key),
            Error::StreamAlreadyExists { bucket: "apps".into(), key: "orders/eu".into() }
        );
        assert_eq!(
            Error::bucket_not_found(&bucket),
            Error::BucketNotFound { bucket: "apps".into() }
        );
        assert_eq!(
            Error::bucket_already_exists(&bucket),
            Error::BucketAlreadyExists { bucket: "apps".into() }
        );
        assert_eq!(
            Error::bucket_not_empty(&bucket),
            Error::BucketNotEmpty { bucket: "apps".into() }
        );
    }

    #[test]
    fn code_wire_names_and_values_are_stable() {
        let codes = [
            (Code::InvalidArgument, 1, "invalid_argument"),
            (Code::Unauthenticated, 2, "unauthenticated"),
            (Code::PermissionDenied, 3, "permission_denied"),
            (Code::NotFound, 4, "not_found"),
            (Code::AlreadyExists, 5, "already_exists"),
            (Code::FailedPrecondition, 6, "failed_precondition"),
            (Code::OutOfRange, 7, "out_of_range"),
            (Code::ResourceExhausted, 8, "resource_exhausted"),
            (Code::Internal, 9, "internal"),
            (Code::Unavailable, 10, "unavailable"),
        ];
        for (code, value, name) in codes {
            assert_eq!(code as u8, value);
            assert_eq!(code.as_str(), name);
        }
    }
}
