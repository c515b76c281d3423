//! Row encodings of the control plane: buckets, addresses, streams and deleted markers.
//!
//! Every row value is two header bytes and an rkyv archive:
//!
//! ```text
//! +----------------+-------------+--------------------------------------------+
//! | version: u8    | kind: u8    | rkyv archive of the kind's struct (0..)    |
//! +----------------+-------------+--------------------------------------------+
//! VERSION = 0, KIND = VERSION + 1, ARCHIVE = KIND + 1
//! ```
//!
//! - `version` is [`ROW_FORMAT_VERSION`] (stream rows: 1 or [`STREAM_ROW_VERSION`]); a
//!   reader refuses any other, so a layout change is a version bump and never a silent
//!   misread.
//! - `kind` is a [`RowKind`]; a row of another kind than its key promises is corrupt.
//! - The archive is rkyv 0.8 with little-endian integers and 32-bit relative pointers
//!   (the workspace fixes both features), so the bytes are the same on every machine. The
//!   archive is validated (bytecheck) before it is read; it sits at offset 2, so the
//!   reader copies it into an aligned buffer first (rows are small).
//! - Persisted enums are their `#[repr(u8)]` discriminants ([`StorageClass::as_u8`],
//!   ...); 0 is never a value, which lets a create request store "omitted" as 0.
//!
//! The archived structs (`*V1`, `*V2`) are the layout and never change once released:
//! fields are never reordered, retyped or removed. A new field means a new struct under
//! a new version of that kind's rows, and a reader that still reads the old one: a stream
//! row is written as version 2 ([`STREAM_ROW_VERSION`], which added `trim_timestamp`)
//! once its `trim_timestamp` is set, else as version 1, which a build from before
//! version 2 still reads; both are read. Every other kind is version 1.
//!
//! This module owns the bytes of a row and the strict decoding back to domain values
//! (names re-parsed, enums checked). It never reads or writes a store and never decides
//! what a row means for a verb; that is the control plane's.

use std::fmt;

use rkyv::rancor;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

use crate::auth::TokenRecord;
use crate::ids::StreamId;
use crate::names::{BucketName, StreamKey};
use crate::options::{
    BucketConfig, BucketConfigRequest, ProducerPolicy, StorageClass, StreamOptions,
    StreamOptionsRequest, TimestampingMode,
};

/// The version byte every row starts with, but stream rows.
pub(crate) const ROW_FORMAT_VERSION: u8 = 1;
/// The version byte of stream rows: 2 added `trim_timestamp`.
pub(crate) const STREAM_ROW_VERSION: u8 = 2;
const HEADER_BYTES: usize = 2;

/// What a row is: its second byte.
///
/// `#[repr(u8)]` with explicit values: persisted; never renumber, never reuse a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RowKind {
    /// `b/<bucket>`.
    Bucket = 1,
    /// `a/<bucket>/<key>`.
    Address = 2,
    /// `s/<id>`.
    Stream = 3,
    /// `d/<bucket>/<key>`.
    Deleted = 4,
    /// `r/<id><first seq>`.
    Ref = 5,
    /// `t/<token id>`.
    Token = 6,
}

impl RowKind {
    const fn from_u8(value: u8) -> Option<Self> {
        match value {
            1 => Some(RowKind::Bucket),
            2 => Some(RowKind::Address),
            3 => Some(RowKind::Stream),
            4 => Some(RowKind::Deleted),
            5 => Some(RowKind::Ref),
            6 => Some(RowKind::Token),
            _ => None,
        }
    }

    const fn name(self) -> &'static str {
        match self {
            RowKind::Bucket => "bucket",
            RowKind::Address => "address",
            RowKind::Stream => "stream",
            RowKind::Deleted => "deleted marker",
            RowKind::Ref => "ref",
            RowKind::Token => "token",
        }
    }
}

/// Why stored bytes are not a row. Always corruption: the control plane wrote every row.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RowError {
    #[error("row of {len} bytes is shorter than its {HEADER_BYTES}-byte header")]
    Short { len: usize },
    #[error(
        "row format version {version} is unknown (this build reads {ROW_FORMAT_VERSION}, and \
         {STREAM_ROW_VERSION} for stream rows)"
    )]
    UnknownVersion { version: u8 },
    #[error("row kind {kind} is unknown")]
    UnknownKind { kind: u8 },
    #[error("row is a {} row where a {} row belongs", found.name(), expected.name())]
    WrongKind { expected: RowKind, found: RowKind },
    #[error("{} row archive is invalid: {message}", kind.name())]
    Archive { kind: RowKind, message: String },
    #[error("{field} {value} is not a known value")]
    UnknownValue { field: &'static str, value: u64 },
    #[error("{field} is invalid: {message}")]
    Invalid { field: &'static str, message: String },
}

/// A bucket's lifecycle state.
///
/// `#[repr(u8)]` with explicit values: persisted; never renumber, never reuse a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum BucketState {
    Active = 1,
    /// A DeleteBucket is checking that no stream lives in the bucket (docs/decisions/0003).
    Deleting = 2,
}

/// A stream row's lifecycle state.
///
/// `#[repr(u8)]` with explicit values: persisted; never renumber, never reuse a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum StreamState {
    Live = 1,
    /// Tombstoned by DeleteStream: the address no longer leads here; the row stays so
    /// reclamation can find what the stream left behind by its ID.
    Deleted = 2,
}

/// An identity of one incarnation of a bucket name: a name can be deleted and created
/// again, and rows of the old bucket must not be mistaken for the new one's.
pub(crate) type BucketId = [u8; 16];

/// `b/<bucket>`: a bucket and its configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BucketRow {
    pub name: BucketName,
    pub bucket_id: BucketId,
    pub created_at_ms: u64,
    pub state: BucketState,
    pub config: BucketConfig,
    /// The creation token of the CreateBucket that made it, with its request, so that a
    /// retry converges only with the same token and the same requested config.
    pub creation_token: Option<String>,
    pub creation_request: BucketConfigRequest,
}

/// `a/<bucket>/<key>`: the ID of the live stream at the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AddressRow {
    pub id: StreamId,
}

/// `s/<id>`: a stream's configuration and state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamRow {
    pub id: StreamId,
    pub bucket: BucketName,
    pub bucket_id: BucketId,
    pub key: StreamKey,
    pub created_at_ms: u64,
    pub options: StreamOptions,
    pub creation_token: Option<String>,
    /// The request the stream was created with (empty for autocreates).
    pub creation_request: StreamOptionsRequest,
    /// Empty: never set.
    pub fencing_token: String,
    pub trim_seq_num: u64,
    /// The tail's timestamp when the watermark last moved: a stream trimmed to its tail
    /// keeps its tail's timestamp through a restart, so stamps never go back (0 in rows
    /// of version 1, which did not have it).
    pub trim_timestamp: u64,
    /// Reserved for leadership leases (architecture.md, "Scale-out"); 0 until then.
    pub leader_epoch: u64,
    pub state: StreamState,
    /// When the stream was deleted; 0 while live.
    pub deleted_at_ms: u64,
}

/// `d/<bucket>/<key>`: the stream last deleted at an address, so that deleting it again
/// succeeds. Counts only while `bucket_id` is the current bucket's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeletedRow {
    pub id: StreamId,
    pub bucket_id: BucketId,
    pub deleted_at_ms: u64,
}

/// `r/<id><first seq>`: where one durable chunk of a stream is in the object store: the
/// slot (envelope and chunk) at `offset..offset + length` of `object`, in a transit
/// bundle or a settled object. Written before a standard batch is acknowledged and
/// before an express chunk's journal space is given up; rewritten in place (same key,
/// same chunk) when settling moves the chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefRow {
    pub id: StreamId,
    pub first_seq_num: u64,
    pub record_count: u32,
    pub last_timestamp: u64,
    /// Stored-record bytes in the chunk.
    pub data_len: u32,
    /// The object's key in the store.
    pub object: String,
    pub offset: u64,
    pub length: u64,
}

impl RefRow {
    /// One past the chunk's last sequence number.
    pub fn end_seq_num(&self) -> u64 {
        self.first_seq_num + u64::from(self.record_count)
    }
}

// ---- Version 1 archives: the persisted layout. Never change these structs. ------------

#[derive(Archive, Serialize, Deserialize)]
struct RefV1 {
    id: [u8; 16],
    first_seq_num: u64,
    record_count: u32,
    last_timestamp: u64,
    data_len: u32,
    object: String,
    offset: u64,
    length: u64,
}

#[derive(Archive, Serialize, Deserialize)]
struct OptionsV1 {
    class: u8,
    producer_policy: u8,
    timestamping_mode: u8,
    timestamping_uncapped: bool,
    batch_max_bytes: u32,
    batch_max_records: u32,
    batch_max_delay_ms: u32,
    retention_max_age_ms: u64,
    retention_max_bytes: u64,
    throughput_max_bytes_per_second: u64,
}

/// A create request: enums are 0 when omitted.
#[derive(Archive, Serialize, Deserialize)]
struct RequestV1 {
    class: u8,
    producer_policy: u8,
    timestamping_mode: u8,
    timestamping_uncapped: bool,
    retention_max_age_ms: u64,
    retention_max_bytes: u64,
    batch_max_bytes: u64,
    batch_max_records: u64,
    batch_max_delay_ms: u64,
    throughput_max_bytes_per_second: u64,
}

#[derive(Archive, Serialize, Deserialize)]
struct BucketV1 {
    name: String,
    bucket_id: [u8; 16],
    created_at_ms: u64,
    state: u8,
    location: String,
    create_stream_on_append: bool,
    create_stream_on_read: bool,
    defaults: OptionsV1,
    creation_token: Option<String>,
    request_location: String,
    request_create_stream_on_append: bool,
    request_create_stream_on_read: bool,
    request_defaults: RequestV1,
}

#[derive(Archive, Serialize, Deserialize)]
struct AddressV1 {
    id: [u8; 16],
}

#[derive(Archive, Serialize, Deserialize)]
struct StreamV1 {
    id: [u8; 16],
    bucket: String,
    bucket_id: [u8; 16],
    key: String,
    created_at_ms: u64,
    options: OptionsV1,
    creation_token: Option<String>,
    creation_request: RequestV1,
    fencing_token: String,
    trim_seq_num: u64,
    leader_epoch: u64,
    state: u8,
    deleted_at_ms: u64,
}

/// A stream row of version 2: version 1's fields, then `trim_timestamp`.
#[derive(Archive, Serialize, Deserialize)]
struct StreamV2 {
    v1: StreamV1,
    trim_timestamp: u64,
}

/// `expires_at_ms` 0: never.
#[derive(Archive, Serialize, Deserialize)]
struct TokenV1 {
    id: String,
    hash: [u8; 32],
    grants: Vec<String>,
    created_at_ms: u64,
    expires_at_ms: u64,
    description: String,
}

#[derive(Archive, Serialize, Deserialize)]
struct DeletedV1 {
    id: [u8; 16],
    bucket_id: [u8; 16],
    deleted_at_ms: u64,
}

// ---- Encoding ---------------------------------------------------------------------------

/// An archived row struct: serializable into memory with the workspace's rkyv features.
trait Archived:
    for<'a> Serialize<
    rkyv::api::high::HighSerializer<
        AlignedVec,
        rkyv::ser::allocator::ArenaHandle<'a>,
        rancor::Error,
    >,
>
{
}

impl<T> Archived for T where
    T: for<'a> Serialize<
        rkyv::api::high::HighSerializer<
            AlignedVec,
            rkyv::ser::allocator::ArenaHandle<'a>,
            rancor::Error,
        >,
    >
{
}

fn frame<T: Archived>(kind: RowKind, value: &T) -> Vec<u8> {
    frame_version(ROW_FORMAT_VERSION, kind, value)
}

fn frame_version<T: Archived>(version: u8, kind: RowKind, value: &T) -> Vec<u8> {
    // Serializing plain owned data into a growable buffer has no failure mode besides
    // allocation, which aborts anyway.
    let archive =
        rkyv::to_bytes::<rancor::Error>(value).expect("serializing a row into memory cannot fail");
    let mut row = Vec::with_capacity(HEADER_BYTES + archive.len());
    row.push(version);
    row.push(kind as u8);
    row.extend_from_slice(&archive);
    row
}

fn options_v1(options: &StreamOptions) -> OptionsV1 {
    OptionsV1 {
        class: options.class.as_u8(),
        producer_policy: options.producer_policy.as_u8(),
        timestamping_mode: options.timestamping_mode.as_u8(),
        timestamping_uncapped: options.timestamping_uncapped,
        batch_max_bytes: options.batch_max_bytes,
        batch_max_records: options.batch_max_records,
        batch_max_delay_ms: options.batch_max_delay_ms,
        retention_max_age_ms: options.retention_max_age_ms,
        retention_max_bytes: options.retention_max_bytes,
        throughput_max_bytes_per_second: options.throughput_max_bytes_per_second,
    }
}

fn request_v1(request: &StreamOptionsRequest) -> RequestV1 {
    RequestV1 {
        class: request.class.map_or(0, StorageClass::as_u8),
        producer_policy: request.producer_policy.map_or(0, ProducerPolicy::as_u8),
        timestamping_mode: request.timestamping_mode.map_or(0, TimestampingMode::as_u8),
        timestamping_uncapped: request.timestamping_uncapped,
        retention_max_age_ms: request.retention_max_age_ms,
        retention_max_bytes: request.retention_max_bytes,
        batch_max_bytes: request.batch_max_bytes,
        batch_max_records: request.batch_max_records,
        batch_max_delay_ms: request.batch_max_delay_ms,
        throughput_max_bytes_per_second: request.throughput_max_bytes_per_second,
    }
}

impl BucketRow {
    pub(crate) fn encode(&self) -> Vec<u8> {
        frame(
            RowKind::Bucket,
            &BucketV1 {
                name: self.name.as_str().to_owned(),
                bucket_id: self.bucket_id,
                created_at_ms: self.created_at_ms,
                state: self.state as u8,
                location: self.config.location.clone(),
                create_stream_on_append: self.config.create_stream_on_append,
                create_stream_on_read: self.config.create_stream_on_read,
                defaults: options_v1(&self.config.defaults),
                creation_token: self.creation_token.clone(),
                request_location: self.creation_request.location.clone(),
                request_create_stream_on_append: self.creation_request.create_stream_on_append,
                request_create_stream_on_read: self.creation_request.create_stream_on_read,
                request_defaults: request_v1(&self.creation_request.defaults),
            },
        )
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, RowError> {
        let row: BucketV1 = unframe(RowKind::Bucket, bytes)?;
        let state = match row.state {
            1 => BucketState::Active,
            2 => BucketState::Deleting,
            other => {
                return Err(RowError::UnknownValue { field: "bucket state", value: other.into() });
            }
        };
        Ok(BucketRow {
            name: BucketName::parse(&row.name).map_err(invalid("bucket name"))?,
            bucket_id: row.bucket_id,
            created_at_ms: row.created_at_ms,
            state,
            config: BucketConfig {
                location: row.location,
                create_stream_on_append: row.create_stream_on_append,
                create_stream_on_read: row.create_stream_on_read,
                defaults: options_from(&row.defaults)?,
            },
            creation_token: row.creation_token,
            creation_request: BucketConfigRequest {
                location: row.request_location,
                create_stream_on_append: row.request_create_stream_on_append,
                create_stream_on_read: row.request_create_stream_on_read,
                defaults: request_from(&row.request_defaults)?,
            },
        })
    }
}

impl AddressRow {
    pub(crate) fn encode(&self) -> Vec<u8> {
        frame(RowKind::Address, &AddressV1 { id: self.id.0 })
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, RowError> {
        let row: AddressV1 = unframe(RowKind::Address, bytes)?;
        Ok(AddressRow { id: StreamId(row.id) })
    }
}

impl StreamRow {
    pub(crate) fn encode(&self) -> Vec<u8> {
        if self.trim_timestamp == 0 {
            return frame(RowKind::Stream, &self.v1());
        }
        let row = StreamV2 { v1: self.v1(), trim_timestamp: self.trim_timestamp };
        frame_version(STREAM_ROW_VERSION, RowKind::Stream, &row)
    }

    /// The fields version 1 had.
    fn v1(&self) -> StreamV1 {
        StreamV1 {
            id: self.id.0,
            bucket: self.bucket.as_str().to_owned(),
            bucket_id: self.bucket_id,
            key: self.key.as_str().to_owned(),
            created_at_ms: self.created_at_ms,
            options: options_v1(&self.options),
            creation_token: self.creation_token.clone(),
            creation_request: request_v1(&self.creation_request),
            fencing_token: self.fencing_token.clone(),
            trim_seq_num: self.trim_seq_num,
            leader_epoch: self.leader_epoch,
            state: self.state as u8,
            deleted_at_ms: self.deleted_at_ms,
        }
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, RowError> {
        let (version, archive) = header(RowKind::Stream, bytes)?;
        let (row, trim_timestamp) = match version {
            1 => (archived::<StreamV1>(RowKind::Stream, archive)?, 0),
            STREAM_ROW_VERSION => {
                let row = archived::<StreamV2>(RowKind::Stream, archive)?;
                (row.v1, row.trim_timestamp)
            }
            version => return Err(RowError::UnknownVersion { version }),
        };
        let state = match row.state {
            1 => StreamState::Live,
            2 => StreamState::Deleted,
            other => {
                return Err(RowError::UnknownValue { field: "stream state", value: other.into() });
            }
        };
        Ok(StreamRow {
            id: StreamId(row.id),
            bucket: BucketName::parse(&row.bucket).map_err(invalid("bucket name"))?,
            bucket_id: row.bucket_id,
            key: StreamKey::parse(&row.key).map_err(invalid("stream key"))?,
            created_at_ms: row.created_at_ms,
            options: options_from(&row.options)?,
            creation_token: row.creation_token,
            creation_request: request_from(&row.creation_request)?,
            fencing_token: row.fencing_token,
            trim_seq_num: row.trim_seq_num,
            trim_timestamp,
            leader_epoch: row.leader_epoch,
            state,
            deleted_at_ms: row.deleted_at_ms,
        })
    }

    pub(crate) fn is_live(&self) -> bool {
        self.state == StreamState::Live
    }
}

impl DeletedRow {
    pub(crate) fn encode(&self) -> Vec<u8> {
        frame(
            RowKind::Deleted,
            &DeletedV1 {
                id: self.id.0,
                bucket_id: self.bucket_id,
                deleted_at_ms: self.deleted_at_ms,
            },
        )
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, RowError> {
        let row: DeletedV1 = unframe(RowKind::Deleted, bytes)?;
        Ok(DeletedRow {
            id: StreamId(row.id),
            bucket_id: row.bucket_id,
            deleted_at_ms: row.deleted_at_ms,
        })
    }
}

impl RefRow {
    pub(crate) fn encode(&self) -> Vec<u8> {
        frame(
            RowKind::Ref,
            &RefV1 {
                id: self.id.0,
                first_seq_num: self.first_seq_num,
                record_count: self.record_count,
                last_timestamp: self.last_timestamp,
                data_len: self.data_len,
                object: self.object.clone(),
                offset: self.offset,
                length: self.length,
            },
        )
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, RowError> {
        let row: RefV1 = unframe(RowKind::Ref, bytes)?;
        if row.record_count == 0 {
            return Err(RowError::Invalid {
                field: "ref record count",
                message: "a chunk holds at least one record".into(),
            });
        }
        if row.first_seq_num.checked_add(u64::from(row.record_count)).is_none() {
            return Err(RowError::Invalid {
                field: "ref sequence range",
                message: format!("{} + {} overflows", row.first_seq_num, row.record_count),
            });
        }
        Ok(RefRow {
            id: StreamId(row.id),
            first_seq_num: row.first_seq_num,
            record_count: row.record_count,
            last_timestamp: row.last_timestamp,
            data_len: row.data_len,
            object: row.object,
            offset: row.offset,
            length: row.length,
        })
    }
}

/// `t/<token id>`: a token's grants and the SHA-256 of the token, never the token.
pub(crate) fn encode_token(token: &TokenRecord) -> Vec<u8> {
    frame(
        RowKind::Token,
        &TokenV1 {
            id: token.id.clone(),
            hash: token.hash,
            grants: token.grants.iter().map(ToString::to_string).collect(),
            created_at_ms: token.created_at_ms,
            expires_at_ms: token.expires_at_ms.unwrap_or(0),
            description: token.description.clone(),
        },
    )
}

pub(crate) fn decode_token(bytes: &[u8]) -> Result<TokenRecord, RowError> {
    let row: TokenV1 = unframe(RowKind::Token, bytes)?;
    Ok(TokenRecord {
        id: row.id,
        hash: row.hash,
        grants: crate::auth::parse_grants(&row.grants).map_err(invalid("token grants"))?,
        created_at_ms: row.created_at_ms,
        expires_at_ms: (row.expires_at_ms != 0).then_some(row.expires_at_ms),
        description: row.description,
    })
}

// ---- Decoding ---------------------------------------------------------------------------

/// Checks the header and returns the validated, deserialized archive.
fn unframe<T>(expected: RowKind, bytes: &[u8]) -> Result<T, RowError>
where
    T: Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + Deserialize<T, rkyv::rancor::Strategy<rkyv::de::Pool, rancor::Error>>,
{
    match header(expected, bytes)? {
        (ROW_FORMAT_VERSION, archive) => archived(expected, archive),
        (version, _) => Err(RowError::UnknownVersion { version }),
    }
}

/// Checks a row's kind; its version and its archive.
fn header(expected: RowKind, bytes: &[u8]) -> Result<(u8, &[u8]), RowError> {
    let [version, kind, archive @ ..] = bytes else {
        return Err(RowError::Short { len: bytes.len() });
    };
    if !matches!(*version, ROW_FORMAT_VERSION | STREAM_ROW_VERSION) {
        return Err(RowError::UnknownVersion { version: *version });
    }
    let found = RowKind::from_u8(*kind).ok_or(RowError::UnknownKind { kind: *kind })?;
    if found != expected {
        return Err(RowError::WrongKind { expected, found });
    }
    Ok((*version, archive))
}

/// The validated, deserialized archive of a row of kind `kind`.
fn archived<T>(kind: RowKind, archive: &[u8]) -> Result<T, RowError>
where
    T: Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rancor::Error>>
        + Deserialize<T, rkyv::rancor::Strategy<rkyv::de::Pool, rancor::Error>>,
{
    // The archive follows a 2-byte header, so it is misaligned in the stored value; rkyv
    // reads only aligned archives.
    let mut aligned = AlignedVec::<16>::with_capacity(archive.len());
    aligned.extend_from_slice(archive);
    rkyv::from_bytes::<T, rancor::Error>(&aligned)
        .map_err(|error| RowError::Archive { kind, message: error.to_string() })
}

fn invalid(field: &'static str) -> impl FnOnce(crate::Error) -> RowError {
    move |error| RowError::Invalid { field, message: error.to_string() }
}

fn enum_value<T>(field: &'static str, value: u8, from: fn(u8) -> Option<T>) -> Result<T, RowError> {
    from(value).ok_or(RowError::UnknownValue { field, value: value.into() })
}

/// An omitted enum of a request: 0.
fn optional_enum<T>(
    field: &'static str,
    value: u8,
    from: fn(u8) -> Option<T>,
) -> Result<Option<T>, RowError> {
    match value {
        0 => Ok(None),
        _ => enum_value(field, value, from).map(Some),
    }
}

fn options_from(row: &OptionsV1) -> Result<StreamOptions, RowError> {
    Ok(StreamOptions {
        class: enum_value("class", row.class, StorageClass::from_u8)?,
        producer_policy: enum_value(
            "producer_policy",
            row.producer_policy,
            ProducerPolicy::from_u8,
        )?,
        timestamping_mode: enum_value(
            "timestamping_mode",
            row.timestamping_mode,
            TimestampingMode::from_u8,
        )?,
        timestamping_uncapped: row.timestamping_uncapped,
        retention_max_age_ms: row.retention_max_age_ms,
        retention_max_bytes: row.retention_max_bytes,
        batch_max_bytes: row.batch_max_bytes,
        batch_max_records: row.batch_max_records,
        batch_max_delay_ms: row.batch_max_delay_ms,
        throughput_max_bytes_per_second: row.throughput_max_bytes_per_second,
    })
}

fn request_from(row: &RequestV1) -> Result<StreamOptionsRequest, RowError> {
    Ok(StreamOptionsRequest {
        class: optional_enum("class", row.class, StorageClass::from_u8)?,
        producer_policy: optional_enum(
            "producer_policy",
            row.producer_policy,
            ProducerPolicy::from_u8,
        )?,
        timestamping_mode: optional_enum(
            "timestamping_mode",
            row.timestamping_mode,
            TimestampingMode::from_u8,
        )?,
        timestamping_uncapped: row.timestamping_uncapped,
        retention_max_age_ms: row.retention_max_age_ms,
        retention_max_bytes: row.retention_max_bytes,
        batch_max_bytes: row.batch_max_bytes,
        batch_max_records: row.batch_max_records,
        batch_max_delay_ms: row.batch_max_delay_ms,
        throughput_max_bytes_per_second: row.throughput_max_bytes_per_second,
    })
}

impl fmt::Display for RowKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::control::keys;
    use crate::options::BATCH_MAX_BYTES_RANGE;

    fn name(text: &str) -> BucketName {
        BucketName::parse(text).expect("valid bucket name")
    }

    fn key(text: &str) -> StreamKey {
        StreamKey::parse(text).expect("valid stream key")
    }

    fn id(first: u8) -> StreamId {
        StreamId(std::array::from_fn(|index| first.wrapping_add(index as u8)))
    }

    fn bucket_defaults() -> BucketRow {
        BucketRow {
            name: name("apps"),
            bucket_id: [0x11; 16],
            created_at_ms: 1_700_000_000_000,
            state: BucketState::Active,
            config: BucketConfig::default(),
            creation_token: None,
            creation_request: BucketConfigRequest::default(),
        }
    }

    fn every_option() -> StreamOptions {
        StreamOptions {
            class: StorageClass::Express,
            producer_policy: ProducerPolicy::Fenced,
            timestamping_mode: TimestampingMode::Arrival,
            timestamping_uncapped: false,
            retention_max_age_ms: 604_800_000,
            retention_max_bytes: 1 << 40,
            batch_max_bytes: 1 << 20,
            batch_max_records: 5000,
            batch_max_delay_ms: 10,
            throughput_max_bytes_per_second: 50 << 20,
        }
    }

    fn every_request() -> StreamOptionsRequest {
        StreamOptionsRequest {
            class: Some(StorageClass::Express),
            producer_policy: Some(ProducerPolicy::Fenced),
            timestamping_mode: Some(TimestampingMode::Arrival),
            timestamping_uncapped: false,
            retention_max_age_ms: 604_800_000,
            retention_max_bytes: 1 << 40,
            batch_max_bytes: 1 << 20,
            batch_max_records: 5000,
            batch_max_delay_ms: 10,
            throughput_max_bytes_per_second: 50 << 20,
        }
    }

    fn bucket_every_field() -> BucketRow {
        BucketRow {
            name: name("orders-eu-1"),
            bucket_id: [0xb0; 16],
            created_at_ms: 1_700_000_000_123,
            state: BucketState::Deleting,
            config: BucketConfig {
                location: "eu-west".into(),
                create_stream_on_append: true,
                create_stream_on_read: true,
                defaults: every_option(),
            },
            creation_token: Some("token-1".into()),
            creation_request: BucketConfigRequest {
                location: "eu-west".into(),
                create_stream_on_append: true,
                create_stream_on_read: true,
                defaults: every_request(),
            },
        }
    }

    fn stream_live() -> StreamRow {
        StreamRow {
            id: id(0x00),
            bucket: name("apps"),
            bucket_id: [0x11; 16],
            key: key("orders/eu"),
            created_at_ms: 1_700_000_000_456,
            options: StreamOptions::default(),
            creation_token: None,
            creation_request: StreamOptionsRequest::default(),
            fencing_token: String::new(),
            trim_seq_num: 0,
            trim_timestamp: 0,
            leader_epoch: 0,
            state: StreamState::Live,
            deleted_at_ms: 0,
        }
    }

    fn stream_deleted() -> StreamRow {
        StreamRow {
            id: id(0xf0),
            key: key("ключ/🦀"),
            options: every_option(),
            creation_token: Some("retry-me".into()),
            creation_request: every_request(),
            fencing_token: "writer-2".into(),
            trim_seq_num: 1_000_000,
            trim_timestamp: 1_700_000_998_000,
            leader_epoch: 7,
            state: StreamState::Deleted,
            deleted_at_ms: 1_700_000_999_000,
            ..stream_live()
        }
    }

    fn marker() -> DeletedRow {
        DeletedRow { id: id(0xf0), bucket_id: [0x11; 16], deleted_at_ms: 1_700_000_999_000 }
    }

    #[test]
    fn golden_vectors_of_every_key_and_row_kind() {
        let apps = name("apps");
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("key bucket apps", keys::bucket(&apps)),
            ("key address apps orders/eu", keys::address(&apps, &key("orders/eu"))),
            ("key stream 000102..0f", keys::stream(&id(0x00))),
            ("key deleted apps orders/eu", keys::deleted(&apps, &key("orders/eu"))),
            ("bucket domain defaults", bucket_defaults().encode()),
            ("bucket every field deleting", bucket_every_field().encode()),
            ("address", AddressRow { id: id(0x00) }.encode()),
            ("stream live defaults", stream_live().encode()),
            ("stream deleted every field", stream_deleted().encode()),
            (
                "stream deleted every field but trim_timestamp (version 1)",
                StreamRow { trim_timestamp: 0, ..stream_deleted() }.encode(),
            ),
            ("deleted marker", marker().encode()),
            (
                "key ref 000102..0f seq 0x0102030405060708",
                keys::chunk_ref(&id(0x00), 0x0102_0304_0506_0708),
            ),
            ("ref", a_ref().encode()),
            ("key token 0123456789abcdef", keys::token("0123456789abcdef")),
            ("token every field", encode_token(&a_token())),
            (
                "token never expires",
                encode_token(&TokenRecord { expires_at_ms: None, ..a_token() }),
            ),
        ];
        crate::golden::check("control_rows.txt", &cases);
    }

    #[test]
    fn stream_rows_are_version_2_only_once_they_have_a_trim_timestamp() {
        let row = stream_deleted();
        assert_eq!(row.encode()[0], STREAM_ROW_VERSION);
        assert_eq!(StreamRow::decode(&row.encode()), Ok(row.clone()));
        // Without one, the row is exactly version 1's, which an older build reads.
        let untrimmed = StreamRow { trim_timestamp: 0, ..row };
        let old = frame(RowKind::Stream, &untrimmed.v1());
        assert_eq!((untrimmed.encode(), old[0]), (old.clone(), 1));
        assert_eq!(StreamRow::decode(&old), Ok(untrimmed));
    }

    #[test]
    fn rows_round_trip_and_encode_deterministically() {
        let buckets = [bucket_defaults(), bucket_every_field()];
        for row in buckets {
            assert_eq!(row.encode(), row.encode());
            assert_eq!(BucketRow::decode(&row.encode()), Ok(row));
        }
        for row in [stream_live(), stream_deleted()] {
            assert_eq!(row.encode(), row.encode());
            assert_eq!(StreamRow::decode(&row.encode()), Ok(row));
        }
        let address = AddressRow { id: id(9) };
        assert_eq!(AddressRow::decode(&address.encode()), Ok(address));
        assert_eq!(DeletedRow::decode(&marker().encode()), Ok(marker()));
        assert_eq!(RefRow::decode(&a_ref().encode()), Ok(a_ref()));
        assert_eq!(decode_token(&encode_token(&a_token())), Ok(a_token()));
    }

    fn a_token() -> TokenRecord {
        TokenRecord {
            id: "0123456789abcdef".into(),
            hash: std::array::from_fn(|index| index as u8),
            grants: crate::auth::parse_grants(&["bucket:apps:read,write", "stream:logs/eu/:read"])
                .expect("grants"),
            created_at_ms: 1_700_000_000_000,
            expires_at_ms: Some(1_700_003_600_000),
            description: "ci reader".into(),
        }
    }

    fn a_ref() -> RefRow {
        RefRow {
            id: id(0x10),
            first_seq_num: 1000,
            record_count: 3,
            last_timestamp: 1_700_000_000_123,
            data_len: 4096,
            object: "_transit/00000001700000000123-000102030405060708090a0b0c0d0e0f".into(),
            offset: 8192,
            length: 4096 + 64 + 64 + 36,
        }
    }

    #[test]
    fn a_ref_with_no_records_or_an_overflowing_range_is_corrupt() {
        let empty = RefRow { record_count: 0, ..a_ref() };
        let found = RefRow::decode(&empty.encode()).expect_err("no records");
        assert!(found.to_string().contains("record count"), "{found}");
        let overflow = RefRow { first_seq_num: u64::MAX - 1, ..a_ref() };
        let found = RefRow::decode(&overflow.encode()).expect_err("overflow");
        assert!(found.to_string().contains("sequence range"), "{found}");
    }

    #[test]
    fn header_refusals() {
        let row = bucket_defaults().encode();
        assert_eq!(row[0], ROW_FORMAT_VERSION);
        assert_eq!(row[1], RowKind::Bucket as u8);
        assert_eq!(BucketRow::decode(&[]), Err(RowError::Short { len: 0 }));
        assert_eq!(BucketRow::decode(&[1]), Err(RowError::Short { len: 1 }));
        for version in [0u8, 2, 255] {
            let mut bad = row.clone();
            bad[0] = version;
            assert_eq!(BucketRow::decode(&bad), Err(RowError::UnknownVersion { version }));
        }
        for kind in [0u8, 7, 255] {
            let mut bad = row.clone();
            bad[1] = kind;
            assert_eq!(BucketRow::decode(&bad), Err(RowError::UnknownKind { kind }));
        }
        assert_eq!(
            StreamRow::decode(&row),
            Err(RowError::WrongKind { expected: RowKind::Stream, found: RowKind::Bucket })
        );
        assert_eq!(
            AddressRow::decode(&marker().encode()),
            Err(RowError::WrongKind { expected: RowKind::Address, found: RowKind::Deleted })
        );
        let message = BucketRow::decode(&[9, 1]).expect_err("unknown version").to_string();
        assert!(message.contains("version 9"), "{message}");
    }

    #[test]
    fn archive_refusals() {
        let row = stream_deleted().encode();
        // Truncated and extended archives: the root is found from the end, so both
        // misplace it and validation refuses.
        let truncated = &row[..row.len() - 1];
        assert!(matches!(StreamRow::decode(truncated), Err(RowError::Archive { .. })));
        assert!(matches!(StreamRow::decode(&row[..2]), Err(RowError::Archive { .. })));
        let mut extended = row.clone();
        extended.extend_from_slice(&[0; 3]);
        assert!(StreamRow::decode(&extended).is_err());
    }

    #[test]
    fn every_single_byte_change_is_refused_or_decodes_without_panic() {
        let rows = [
            bucket_every_field().encode(),
            stream_deleted().encode(),
            AddressRow { id: id(1) }.encode(),
            marker().encode(),
        ];
        for row in rows {
            for index in 0..row.len() {
                for flip in [0x01u8, 0x80, 0xff] {
                    let mut changed = row.clone();
                    changed[index] ^= flip;
                    // Any outcome but a panic; a decoded value is a different row.
                    let _ = BucketRow::decode(&changed);
                    let _ = StreamRow::decode(&changed);
                    let _ = AddressRow::decode(&changed);
                    let _ = DeletedRow::decode(&changed);
                }
            }
        }
    }

    /// Encodes archive structs directly, to store values the domain types cannot hold.
    fn options_v1_with(class: u8, policy: u8, mode: u8) -> OptionsV1 {
        OptionsV1 {
            class,
            producer_policy: policy,
            timestamping_mode: mode,
            ..options_v1(&StreamOptions::default())
        }
    }

    fn raw_stream(
        options: OptionsV1,
        request_class: u8,
        state: u8,
        bucket: &str,
        key: &str,
    ) -> Vec<u8> {
        let row = stream_live();
        frame(
            RowKind::Stream,
            &StreamV1 {
                id: row.id.0,
                bucket: bucket.into(),
                bucket_id: row.bucket_id,
                key: key.into(),
                created_at_ms: 1,
                options,
                creation_token: None,
                creation_request: RequestV1 {
                    class: request_class,
                    ..request_v1(&StreamOptionsRequest::default())
                },
                fencing_token: String::new(),
                trim_seq_num: 0,
                leader_epoch: 0,
                state,
                deleted_at_ms: 0,
            },
        )
    }

    #[test]
    fn unknown_values_and_bad_names_are_refused() {
        let good = raw_stream(options_v1_with(1, 1, 1), 0, 1, "apps", "k");
        assert!(StreamRow::decode(&good).is_ok());
        let cases = [
            (raw_stream(options_v1_with(0, 1, 1), 0, 1, "apps", "k"), "class", 0),
            (raw_stream(options_v1_with(3, 1, 1), 0, 1, "apps", "k"), "class", 3),
            (raw_stream(options_v1_with(1, 9, 1), 0, 1, "apps", "k"), "producer_policy", 9),
            (raw_stream(options_v1_with(1, 1, 4), 0, 1, "apps", "k"), "timestamping_mode", 4),
            (raw_stream(options_v1_with(1, 1, 1), 7, 1, "apps", "k"), "class", 7),
            (raw_stream(options_v1_with(1, 1, 1), 0, 0, "apps", "k"), "stream state", 0),
            (raw_stream(options_v1_with(1, 1, 1), 0, 3, "apps", "k"), "stream state", 3),
        ];
        for (bytes, field, value) in cases {
            assert_eq!(
                StreamRow::decode(&bytes),
                Err(RowError::UnknownValue { field, value }),
                "{field} {value}"
            );
        }
        let bad_bucket = raw_stream(options_v1_with(1, 1, 1), 0, 1, "Apps", "k");
        assert!(matches!(
            StreamRow::decode(&bad_bucket),
            Err(RowError::Invalid { field: "bucket name", .. })
        ));
        let bad_key = raw_stream(options_v1_with(1, 1, 1), 0, 1, "apps", "a\nb");
        assert!(matches!(
            StreamRow::decode(&bad_key),
            Err(RowError::Invalid { field: "stream key", .. })
        ));
        let archive = BucketV1 {
            name: "apps".into(),
            bucket_id: [0; 16],
            created_at_ms: 0,
            state: 3,
            location: String::new(),
            create_stream_on_append: false,
            create_stream_on_read: false,
            defaults: options_v1(&StreamOptions::default()),
            creation_token: None,
            request_location: String::new(),
            request_create_stream_on_append: false,
            request_create_stream_on_read: false,
            request_defaults: request_v1(&StreamOptionsRequest::default()),
        };
        let bucket = frame(RowKind::Bucket, &archive);
        assert_eq!(
            BucketRow::decode(&bucket),
            Err(RowError::UnknownValue { field: "bucket state", value: 3 })
        );
    }

    #[test]
    fn no_persisted_enum_uses_zero_which_means_omitted() {
        assert_eq!(StorageClass::from_u8(0), None);
        assert_eq!(ProducerPolicy::from_u8(0), None);
        assert_eq!(TimestampingMode::from_u8(0), None);
        assert_eq!(RowKind::from_u8(0), None);
    }

    fn any_options() -> impl Strategy<Value = StreamOptions> {
        (
            prop::sample::select(StorageClass::ALL),
            prop::sample::select(ProducerPolicy::ALL),
            prop::sample::select(TimestampingMode::ALL),
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            BATCH_MAX_BYTES_RANGE,
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
        )
            .prop_map(
                |(class, policy, mode, uncapped, age, bytes, bmb, bmr, delay, rate)| {
                    StreamOptions {
                        class,
                        producer_policy: policy,
                        timestamping_mode: mode,
                        timestamping_uncapped: uncapped,
                        retention_max_age_ms: age,
                        retention_max_bytes: bytes,
                        batch_max_bytes: bmb,
                        batch_max_records: bmr,
                        batch_max_delay_ms: delay,
                        throughput_max_bytes_per_second: rate,
                    }
                },
            )
    }

    fn any_request() -> impl Strategy<Value = StreamOptionsRequest> {
        (
            prop::option::of(prop::sample::select(StorageClass::ALL)),
            prop::option::of(prop::sample::select(ProducerPolicy::ALL)),
            prop::option::of(prop::sample::select(TimestampingMode::ALL)),
            any::<bool>(),
            any::<[u64; 6]>(),
        )
            .prop_map(|(class, policy, mode, uncapped, scalars)| StreamOptionsRequest {
                class,
                producer_policy: policy,
                timestamping_mode: mode,
                timestamping_uncapped: uncapped,
                retention_max_age_ms: scalars[0],
                retention_max_bytes: scalars[1],
                batch_max_bytes: scalars[2],
                batch_max_records: scalars[3],
                batch_max_delay_ms: scalars[4],
                throughput_max_bytes_per_second: scalars[5],
            })
    }

    fn any_bucket_name() -> impl Strategy<Value = BucketName> {
        "[a-z0-9]([a-z0-9-]{1,61})[a-z0-9]".prop_map(|text| name(&text))
    }

    fn any_stream_key() -> impl Strategy<Value = StreamKey> {
        "[^\\p{Cc}]{1,100}"
            .prop_filter_map("a key of at most 512 bytes", |text| StreamKey::parse(&text).ok())
    }

    proptest! {
        #[test]
        fn any_stream_row_round_trips(
            options in any_options(),
            request in any_request(),
            bucket in any_bucket_name(),
            stream_key in any_stream_key(),
            ids in any::<([u8; 16], [u8; 16])>(),
            token in prop::option::of("[a-z0-9]{0,64}"),
            fencing_token in "[ -~]{0,36}",
            numbers in any::<[u64; 5]>(),
            deleted in any::<bool>(),
        ) {
            let row = StreamRow {
                id: StreamId(ids.0),
                bucket,
                bucket_id: ids.1,
                key: stream_key,
                created_at_ms: numbers[0],
                options,
                creation_token: token,
                creation_request: request,
                fencing_token,
                trim_seq_num: numbers[1],
                trim_timestamp: numbers[4],
                leader_epoch: numbers[2],
                state: if deleted { StreamState::Deleted } else { StreamState::Live },
                deleted_at_ms: numbers[3],
            };
            prop_assert_eq!(StreamRow::decode(&row.encode()), Ok(row));
        }

        #[test]
        fn any_bucket_row_round_trips(
            options in any_options(),
            request in any_request(),
            bucket in any_bucket_name(),
            bucket_id in any::<[u8; 16]>(),
            location in "[ -~]{0,256}",
            flags in any::<[bool; 4]>(),
            token in prop::option::of("[a-z0-9]{0,64}"),
            created_at_ms in any::<u64>(),
        ) {
            let row = BucketRow {
                name: bucket,
                bucket_id,
                created_at_ms,
                state: if flags[0] { BucketState::Deleting } else { BucketState::Active },
                config: BucketConfig {
                    location: location.clone(),
                    create_stream_on_append: flags[1],
                    create_stream_on_read: flags[2],
                    defaults: options,
                },
                creation_token: token,
                creation_request: BucketConfigRequest {
                    location,
                    create_stream_on_append: flags[3],
                    create_stream_on_read: flags[1],
                    defaults: request,
                },
            };
            prop_assert_eq!(BucketRow::decode(&row.encode()), Ok(row));
        }

        #[test]
        fn cursors_keep_the_order_of_every_shorter_name(
            name in "[a-c]{0,6}",
            cursor in "[a-c]{0,12}",
            longest in 0usize..7,
        ) {
            prop_assume!(name.len() <= longest);
            let cut = keys::cursor(&cursor, longest);
            prop_assert!(cut.len() <= longest + 1);
            prop_assert_eq!(name.as_bytes() > cursor.as_bytes(), name.as_bytes() > cut);
        }
    }
}
