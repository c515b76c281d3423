//! The Rust client of nova's HTTP API (http-api.md), used by the `nova` CLI, the load
//! generator and the HTTP benchmark. Blocking, on std threads: share one [`Client`]
//! between threads (its keep-alive connections are pooled), and give each producer thread
//! its own [`AppendSession`].
//!
//! - Every verb: buckets, streams, append, read, check tail, fence, trim, and
//!   [`Client::ensure_bucket`].
//! - Appends and reads speak the binary framing (`application/x-nova-records`) by
//!   default, JSON with [`Format::Json`].
//! - [`AppendSession`]: batches on one connection (a writer and a reader thread, at most
//!   `in_flight_max` unacknowledged), acknowledgements in order: in the binary framing
//!   one append session request, whose batches in flight become durable together; in
//!   JSON a request per batch, pipelined.
//! - [`Subscription`]: an iterator over a subscription, binary framing by default, SSE on
//!   request.
//! - Retries only what is safe: reads, metadata reads, and appends that carry
//!   `match_seq_num` (which land once or are refused), when the connection failed, the
//!   server was unavailable, or it answered with `Retry-After` (waited out, up to
//!   [`RETRY_AFTER_MAX`]). Anything else that fails on the way is returned, never
//!   resent: a plain append may have landed. A guarded append whose retry is refused
//!   with the tail it would itself have made fails with its outcome unknown, never as
//!   a refusal.
//! - Bounds the waits: each read and write ([`Client::with_timeout`]), each connect
//!   ([`Client::with_connect_timeout`]), and a whole call, retries included
//!   ([`Client::with_deadline`]).
//!
//! Never here: sequencing, stamping or checking records beyond their encoding; the server
//! is the authority for every limit.

/// The longest `Retry-After` a retry waits out; a longer one is waited this long.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(30);

/// The longest wait between attempts of a call that failed transiently: the backoff
/// doubles from 50 ms up to this.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

pub mod http;
mod session;
mod subscription;

use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use engine::framing::{self, AppendBuilder, AppendConditions, Frame};
pub use engine::ids::StreamId;
use engine::limits::FENCING_TOKEN_BYTES_MAX;
use engine::options::{OptionScope, ProducerPolicy, StorageClass, TimestampingMode};
use serde_json::{Map, Value, json};

pub use http::{
    Event, Response, Server, Streaming, encode_segment, next_event, open, open_on, read_response,
    request,
};
pub use session::{AppendSession, SessionAck};
pub use subscription::{SUBSCRIBE_MEDIA_TYPE, Subscription, SubscriptionEvent};

/// The binary framing's media type.
pub const RECORDS_MEDIA_TYPE: &str = "application/x-nova-records";
/// Idle keep-alive connections a [`Client`] keeps.
const POOL_MAX: usize = 16;

/// How appends and reads travel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// `application/x-nova-records` (the default: no re-encoding on either side).
    #[default]
    Binary,
    /// JSON, bodies as UTF-8 text when they are, else base64 (`Nova-Encoding: base64`).
    Json,
}

/// Why a call failed.
#[derive(Debug)]
pub enum Error {
    /// The server answered with an error (http-api.md "Errors").
    Api(ApiError),
    /// The server could not be reached, or the connection failed during the call: an
    /// append may or may not have landed.
    Io { what: String, error: io::Error },
    /// The server's answer was not what the API says.
    Protocol(String),
    /// The caller's input, refused before anything was sent.
    Invalid(String),
    /// A guarded append whose earlier attempt's outcome is unknown, and whose last attempt
    /// failed in a way that does not show it did not land (refused with the tail that
    /// attempt would have made, fenced, or past a tail another writer moved): it may have
    /// landed, and sending it again cannot tell. Read it back.
    Ambiguous(String),
}

/// An error answer: its status, code, message and whole JSON body (with the details:
/// `next_seq_num`, `fencing_token`, `tail`).
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub body: Value,
    /// From `Retry-After`, on resource_exhausted.
    pub retry_after_seconds: Option<u64>,
}

impl Error {
    /// The API error code (`not_found`, `failed_precondition`, ...), if the server answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api(api) => Some(&api.code),
            _ => None,
        }
    }

    /// Whether a failed append may still have landed: the connection failed, or the
    /// answer was not one the API gives, or the server failed inside (`internal`,
    /// `unknown`) or stopped serving its stream (`unavailable`: a failed journal answers
    /// the appends it had sequenced so, and only its recovery decides their fate).
    /// Every other answered error is a refusal: nothing of the batch landed; so is one
    /// that says so (`"not_appended": true`: an append session's end at a server's stop).
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Error::Io { .. } | Error::Protocol(_) | Error::Ambiguous(_) => true,
            Error::Api(api) => {
                matches!(api.code.as_str(), "internal" | "unknown" | "unavailable")
                    && api.body["not_appended"].as_bool() != Some(true)
            }
            Error::Invalid(_) => false,
        }
    }

    /// Whether this refusal of an append guarded by `match_seq_num`, whose success would
    /// have made the tail `made`, shows that none of its attempts landed: a tail below
    /// `made` (tails never go back, and one attempt landing makes it `made` at least), or
    /// a stream that is gone (with whatever landed on it). Not `invalid_argument`: some of
    /// its checks (a clock-dependent stamp, limits set by server flags) may refuse a retry
    /// of an attempt that landed.
    fn shows_guarded_not_landed(&self, made: u64) -> bool {
        match self.code() {
            Some("failed_precondition") => self.next_seq_num().is_some_and(|next| next < made),
            Some("not_found") => true,
            _ => false,
        }
    }

    /// The stream's next sequence number, on a refused `match_seq_num`.
    pub fn next_seq_num(&self) -> Option<u64> {
        match self {
            Error::Api(api) => api.body["next_seq_num"].as_u64(),
            _ => None,
        }
    }

    /// Whether resending the same request could succeed and is harmless for a call that
    /// is safe to repeat: the connection failed, the server was unavailable, or it asked
    /// for the request again later (`Retry-After`: a shard's memory full, a throttle).
    pub fn transient(&self) -> bool {
        match self {
            Error::Io { .. } => true,
            Error::Api(api) => api.status == 503 || api.retry_after_seconds.is_some(),
            _ => false,
        }
    }

    /// Whether the call failed because the server did not answer within the client's
    /// timeout ([`Client::with_timeout`]) or the call's deadline
    /// ([`Client::with_deadline`]).
    pub fn timed_out(&self) -> bool {
        matches!(self, Error::Io { error, .. }
            if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }

    /// How long the server asked to wait before the request is sent again, at most
    /// [`RETRY_AFTER_MAX`].
    pub fn retry_after(&self) -> Duration {
        match self {
            Error::Api(ApiError { retry_after_seconds: Some(seconds), .. }) => {
                Duration::from_secs(*seconds).min(RETRY_AFTER_MAX)
            }
            _ => Duration::ZERO,
        }
    }

    fn from_response(response: &Response) -> Error {
        let body = response.json();
        match (body["code"].as_str(), body["message"].as_str()) {
            (Some(code), Some(message)) => Error::Api(ApiError {
                status: response.status,
                code: code.to_owned(),
                message: message.to_owned(),
                retry_after_seconds: response.header("retry-after").and_then(|v| v.parse().ok()),
                body,
            }),
            // A gateway between (a proxy, a load balancer) that could not reach the
            // server, or gave up waiting for it: as a failed connection, transient and
            // with an append's outcome unknown.
            _ if matches!(response.status, 502..=504) => Error::Io {
                what: format!("reach the server (a gateway answered HTTP {})", response.status),
                error: io::Error::other(engine::names::excerpt(
                    &response.text(),
                    ERROR_BODY_CHARS_MAX,
                )),
            },
            _ => Error::Protocol(format!(
                "HTTP {} without an error body: {}",
                response.status,
                engine::names::excerpt(&response.text(), ERROR_BODY_CHARS_MAX)
            )),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api(api) => write!(f, "{}: {}", api.code, api.message),
            // A blocking socket's read or write only ends this way at its timeout.
            Error::Io { what, error } if self.timed_out() => {
                write!(f, "{what}: the server did not answer within the client's timeout ({error})")
            }
            Error::Io { what, error } => write!(f, "{what}: {error}"),
            Error::Protocol(why) => write!(f, "unexpected answer from the server: {why}"),
            Error::Invalid(why) | Error::Ambiguous(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {}

/// How much of an answer that is not nova's an error message quotes, in characters.
const ERROR_BODY_CHARS_MAX: usize = 200;

/// A failure reading an answer: the server's bytes broke the protocol (`InvalidData`: a
/// malformed or oversized body, which sending again would not mend), or the connection
/// failed.
pub(super) fn read_failure(what: String, error: io::Error) -> Error {
    if error.kind() == io::ErrorKind::InvalidData {
        Error::Protocol(format!("{what}: {error}"))
    } else {
        Error::Io { what, error }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

fn protocol(what: &str, value: &Value) -> Error {
    Error::Protocol(format!("{what} is missing or malformed in {value}"))
}

/// A stream's address, `nova://bucket/key` (the key may hold `/`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address {
    pub bucket: String,
    pub key: String,
}

impl Address {
    pub fn new(bucket: impl Into<String>, key: impl Into<String>) -> Self {
        Self { bucket: bucket.into(), key: key.into() }
    }

    /// Parses `nova://bucket/key`.
    pub fn parse(text: &str) -> Result<Self> {
        let rest = text.strip_prefix("nova://").ok_or_else(|| {
            Error::Invalid(format!("{text:?} is not an address like nova://bucket/key"))
        })?;
        match rest.split_once('/') {
            Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() => {
                Ok(Self::new(bucket, key))
            }
            _ => Err(Error::Invalid(format!(
                "{text:?} names no bucket and key: write nova://bucket/key"
            ))),
        }
    }

    /// `/v1/streams/{bucket}/{key}`, each segment percent-encoded.
    pub fn path(&self) -> String {
        format!("/v1/streams/{}/{}", encode_segment(&self.bucket), encode_segment(&self.key))
    }
}

impl std::str::FromStr for Address {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nova://{}/{}", self.bucket, self.key)
    }
}

/// A stream's options (buckets.md): `None` leaves the value to the bucket's default (on
/// create) or unchanged (on reconfigure). Records read from the server have every field.
/// The engine's reconfigure patch, field for field.
pub use engine::options::StreamOptionsPatch as StreamOptions;

const NUMBER_OPTIONS: [&str; 6] = [
    "retention_max_age_ms",
    "retention_max_bytes",
    "batch_max_bytes",
    "batch_max_records",
    "batch_max_delay_ms",
    "throughput_max_bytes_per_second",
];

fn option_numbers(options: &StreamOptions) -> [Option<u64>; 6] {
    [
        options.retention_max_age_ms,
        options.retention_max_bytes,
        options.batch_max_bytes,
        options.batch_max_records,
        options.batch_max_delay_ms,
        options.throughput_max_bytes_per_second,
    ]
}

/// The fields of `options` that are set, named with `prefix` (`default_` for a bucket).
fn options_to_json(options: &StreamOptions, prefix: &str, out: &mut Map<String, Value>) {
    let mut put = |field: &str, value: Value| {
        out.insert(format!("{prefix}{field}"), value);
    };
    if let Some(class) = options.class {
        put("class", json!(class.as_str()));
    }
    if let Some(policy) = options.producer_policy {
        put("producer_policy", json!(policy.as_str()));
    }
    if let Some(mode) = options.timestamping_mode {
        put("timestamping_mode", json!(mode.as_str()));
    }
    if let Some(uncapped) = options.timestamping_uncapped {
        put("timestamping_uncapped", json!(uncapped));
    }
    for (field, value) in NUMBER_OPTIONS.iter().zip(option_numbers(options)) {
        if let Some(value) = value {
            put(field, json!(value));
        }
    }
}

/// Options as the server sends them (every field present), named with `prefix`.
fn options_from_json(value: &Value, prefix: &str, scope: OptionScope) -> Result<StreamOptions> {
    let get = |field: &str| &value[format!("{prefix}{field}").as_str()];
    let text = |field: &str| -> Result<&str> {
        get(field).as_str().ok_or_else(|| protocol(&format!("{prefix}{field}"), value))
    };
    let bad = |e: engine::Error| Error::Protocol(e.to_string());
    let number = |field: &str| get(field).as_u64();
    Ok(StreamOptions {
        class: Some(StorageClass::parse_in(text("class")?, scope).map_err(bad)?),
        producer_policy: Some(
            ProducerPolicy::parse_in(text("producer_policy")?, scope).map_err(bad)?,
        ),
        timestamping_mode: Some(
            TimestampingMode::parse_in(text("timestamping_mode")?, scope).map_err(bad)?,
        ),
        timestamping_uncapped: get("timestamping_uncapped").as_bool(),
        retention_max_age_ms: number("retention_max_age_ms"),
        retention_max_bytes: number("retention_max_bytes"),
        batch_max_bytes: number("batch_max_bytes"),
        batch_max_records: number("batch_max_records"),
        batch_max_delay_ms: number("batch_max_delay_ms"),
        throughput_max_bytes_per_second: number("throughput_max_bytes_per_second"),
    })
}

/// A bucket: its name, location, auto-creation flags and stream defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub name: String,
    pub location: String,
    pub create_on_append: bool,
    pub create_on_read: bool,
    pub defaults: StreamOptions,
    /// Set on records read from the server.
    pub created_at_ms: Option<u64>,
}

impl Bucket {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), ..Self::default() }
    }

    fn config_json(&self) -> Map<String, Value> {
        let mut out = Map::new();
        if !self.location.is_empty() {
            out.insert("location".into(), json!(self.location));
        }
        if self.create_on_append {
            out.insert("create_stream_on_append".into(), json!(true));
        }
        if self.create_on_read {
            out.insert("create_stream_on_read".into(), json!(true));
        }
        options_to_json(&self.defaults, "default_", &mut out);
        out
    }

    fn from_json(value: &Value) -> Result<Self> {
        Ok(Self {
            name: value["name"].as_str().ok_or_else(|| protocol("name", value))?.to_owned(),
            location: value["location"].as_str().unwrap_or_default().to_owned(),
            create_on_append: value["create_stream_on_append"].as_bool().unwrap_or(false),
            create_on_read: value["create_stream_on_read"].as_bool().unwrap_or(false),
            defaults: options_from_json(value, "default_", OptionScope::BucketDefaults)?,
            created_at_ms: value["created_at_ms"].as_u64(),
        })
    }
}

/// A position in a stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    pub seq_num: u64,
    pub timestamp: u64,
}

impl Position {
    fn from_json(value: &Value) -> Result<Self> {
        Ok(Self {
            seq_num: value["seq_num"].as_u64().ok_or_else(|| protocol("seq_num", value))?,
            timestamp: value["timestamp"].as_u64().ok_or_else(|| protocol("timestamp", value))?,
        })
    }
}

/// A stream record as the server keeps it, with its tail and trim watermark when it came
/// from GetStream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    pub address: Address,
    /// 32 hex digits.
    pub id: String,
    pub created_at_ms: u64,
    pub options: StreamOptions,
    pub tail: Option<Position>,
    pub trim_seq_num: Option<u64>,
}

impl StreamInfo {
    fn from_json(value: &Value) -> Result<Self> {
        let text = |field: &str| -> Result<String> {
            Ok(value[field].as_str().ok_or_else(|| protocol(field, value))?.to_owned())
        };
        Ok(Self {
            address: Address::new(text("bucket")?, text("key")?),
            id: text("id")?,
            created_at_ms: value["created_at_ms"].as_u64().unwrap_or(0),
            options: options_from_json(value, "", OptionScope::Stream)?,
            tail: value.get("tail").map(Position::from_json).transpose()?,
            trim_seq_num: value["trim_seq_num"].as_u64(),
        })
    }
}

/// One page of a listing; `next` is where the next page starts, None on the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// An append's acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The first record's position.
    pub start: Position,
    /// One past the last record.
    pub end: Position,
    pub tail: Position,
}

impl Ack {
    fn from_json(value: &Value) -> Result<Self> {
        Ok(Self {
            start: Position::from_json(&value["start"])?,
            end: Position::from_json(&value["end"])?,
            tail: Position::from_json(&value["tail"])?,
        })
    }
}

/// What an append may carry besides its records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conditions {
    /// Apply only if the first record would be numbered exactly this. Such an append is
    /// retried after a failed connection: it lands once or is refused. A retry refused
    /// with `next_seq_num` equal to this plus the batch's records may mean the first
    /// attempt landed before its answer was lost: [`Client::append`] then fails with
    /// [`Error::Ambiguous`] (its outcome unknown); read the records back to tell it from
    /// another writer's batch.
    pub match_seq_num: Option<u64>,
    pub fencing_token: Option<String>,
}

impl Conditions {
    fn check(&self) -> Result<()> {
        match &self.fencing_token {
            Some(token) if token.len() > FENCING_TOKEN_BYTES_MAX => Err(Error::Invalid(format!(
                "fencing token is {} bytes, over the limit of {FENCING_TOKEN_BYTES_MAX}",
                token.len()
            ))),
            _ => Ok(()),
        }
    }
}

/// A batch of records, kept in the binary framing's form (each record encoded once, as
/// the server stores it). Reuse one with [`Batch::clear`]: pushing allocates nothing once
/// its buffers have grown.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The one encoder of the framing (engine::framing), with its golden vectors.
    builder: AppendBuilder,
    timestamp: Option<i64>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a record.
    pub fn push<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        headers: &[(N, V)],
        body: &[u8],
    ) -> Result<()> {
        let index = self.len();
        self.builder.push(headers, body).map_err(|e| Error::Invalid(format!("record {index}: {e}")))
    }

    /// The batch's offered timestamp (ms); the server stamps the batch once (decisions.md).
    pub fn set_timestamp(&mut self, timestamp: Option<i64>) {
        self.timestamp = timestamp;
    }

    pub fn len(&self) -> usize {
        self.builder.len()
    }

    pub fn is_empty(&self) -> bool {
        self.builder.is_empty()
    }

    /// Encoded bytes of the records.
    pub fn stored_bytes(&self) -> usize {
        self.builder.stored_bytes()
    }

    pub fn clear(&mut self) {
        self.builder.clear();
        self.timestamp = None;
    }

    /// The stored records, one slice each.
    fn records(&self) -> impl Iterator<Item = &[u8]> {
        self.builder.records()
    }

    fn framing_conditions<'a>(&self, conditions: &'a Conditions) -> AppendConditions<'a> {
        AppendConditions {
            match_seq_num: conditions.match_seq_num,
            fencing_token: conditions.fencing_token.as_deref(),
            timestamp: self.timestamp,
        }
    }

    /// Length of the framed body with these conditions.
    fn framed_len(&self, conditions: &Conditions) -> usize {
        self.builder.framed_len(&self.framing_conditions(conditions))
    }

    /// Appends the framed body (framing.rs) to `out`.
    fn write_framed(&self, conditions: &Conditions, out: &mut Vec<u8>) -> Result<()> {
        // Checked first: the encoder takes a fencing token only within the limit.
        conditions.check()?;
        self.builder.finish_into(&self.framing_conditions(conditions), out);
        Ok(())
    }

    /// The JSON body, and whether it is base64.
    fn to_json(&self, conditions: &Conditions) -> Result<(Vec<u8>, bool)> {
        conditions.check()?;
        let mut decoded = Vec::with_capacity(self.len());
        for stored in self.records() {
            decoded.push(
                engine::record::decode(stored)
                    .map_err(|e| Error::Invalid(format!("a batch record is corrupt: {e}")))?,
            );
        }
        let utf8 = |bytes: &[u8]| std::str::from_utf8(bytes).is_ok();
        let text =
            decoded.iter().all(|r| utf8(r.body()) && r.headers().all(|(n, v)| utf8(n) && utf8(v)));
        let encode = |bytes: &[u8]| -> Value {
            if text { json!(String::from_utf8_lossy(bytes)) } else { json!(BASE64.encode(bytes)) }
        };
        let records: Vec<Value> = decoded
            .iter()
            .map(|r| {
                let headers: Vec<Value> =
                    r.headers().map(|(n, v)| json!([encode(n), encode(v)])).collect();
                let mut record = json!({"body": encode(r.body()), "headers": headers});
                if let Some(ts) = self.timestamp {
                    record["timestamp"] = json!(ts);
                }
                record
            })
            .collect();
        let mut body = json!({"records": records});
        if let Some(n) = conditions.match_seq_num {
            body["match_seq_num"] = json!(n);
        }
        if let Some(token) = &conditions.fencing_token {
            body["fencing_token"] = json!(token);
        }
        Ok((body.to_string().into_bytes(), !text))
    }
}

/// A record read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq_num: u64,
    pub timestamp: u64,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// Where a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    SeqNum(u64),
    /// The first record stamped at or after this (ms).
    Timestamp(u64),
    /// This many records before the tail.
    TailOffset(u64),
}

impl Default for Start {
    fn default() -> Self {
        Start::SeqNum(0)
    }
}

/// A read's start and bounds (streams.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    pub start: Start,
    pub count: Option<u64>,
    pub bytes: Option<u64>,
    /// Stop before the first record stamped at or after this (ms).
    pub until: Option<u64>,
    /// A start past the tail reads from the tail instead of failing.
    pub clamp: bool,
    /// Long poll: wait up to this many seconds for records when none are readable.
    pub wait_seconds: Option<u64>,
    /// Read this stream only (`stream_id`): not_found once its address names another (it
    /// was deleted and created anew) or none. A resumed subscription stays on the stream
    /// it followed with [`Subscription::stream_id`].
    pub stream_id: Option<StreamId>,
}

impl ReadOptions {
    pub fn from_seq_num(seq_num: u64) -> Self {
        Self { start: Start::SeqNum(seq_num), ..Self::default() }
    }

    fn query(&self) -> String {
        let mut query = match self.start {
            Start::SeqNum(n) => format!("seq_num={n}"),
            Start::Timestamp(t) => format!("timestamp={t}"),
            Start::TailOffset(k) => format!("tail_offset={k}"),
        };
        for (name, value) in [
            ("count", self.count),
            ("bytes", self.bytes),
            ("until", self.until),
            ("wait", self.wait_seconds),
        ] {
            if let Some(value) = value {
                query.push_str(&format!("&{name}={value}"));
            }
        }
        if self.clamp {
            query.push_str("&clamp=true");
        }
        if let Some(stream) = self.stream_id {
            query.push_str(&format!("&stream_id={stream}"));
        }
        query
    }
}

/// One page of a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPage {
    pub records: Vec<Record>,
    /// Where the next page starts.
    pub next_seq_num: u64,
    pub tail: Position,
}

/// Decodes the records of binary frames into `out`; the page end, if one came.
fn decode_frames(bytes: &[u8], out: &mut Vec<Record>) -> Result<Option<(u64, Position)>> {
    let mut at = 0;
    let mut end = None;
    while at < bytes.len() {
        let (frame, used) = framing::decode_frame(&bytes[at..])
            .map_err(|e| Error::Protocol(format!("a read page is corrupt: {e}")))?
            .ok_or_else(|| Error::Protocol("a read page ends inside a frame".into()))?;
        at += used;
        match frame {
            Frame::Records(run) => push_records(&run, out)?,
            Frame::PageEnd { next_seq_num, tail } => {
                end = Some((
                    next_seq_num,
                    Position { seq_num: tail.seq_num, timestamp: tail.timestamp },
                ));
            }
            Frame::Error(text) => return Err(api_error_frame(text)),
            Frame::Ack { .. } => {
                return Err(Error::Protocol("a read page holds an append session's ack".into()));
            }
            Frame::Heartbeat(_) | Frame::End => {}
        }
    }
    Ok(end)
}

fn push_records(run: &engine::chunk::Records<'_>, out: &mut Vec<Record>) -> Result<()> {
    for (seq_num, timestamp, stored) in run.iter() {
        let record = engine::record::decode(stored)
            .map_err(|e| Error::Protocol(format!("record {seq_num} is corrupt: {e}")))?;
        out.push(Record {
            seq_num,
            timestamp,
            headers: record.headers().map(|(n, v)| (n.to_vec(), v.to_vec())).collect(),
            body: record.body().to_vec(),
        });
    }
    Ok(())
}

pub(super) fn api_error_frame(text: &str) -> Error {
    let body: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    match (body["code"].as_str(), body["message"].as_str()) {
        (Some(code), Some(message)) => Error::Api(ApiError {
            // A frame has no HTTP status: the one its code maps to (0 for a code unknown
            // here).
            status: engine::Code::from_name(code)
                .map_or(0, |code| crate::error::status_of(code).as_u16()),
            code: code.to_owned(),
            message: message.to_owned(),
            // An append session's error frame says it in the body (no header to say it in).
            retry_after_seconds: body["retry_after_seconds"].as_u64(),
            body,
        }),
        _ => Error::Protocol(format!("an error frame that is not an error object: {text}")),
    }
}

/// Records of a JSON page with base64 bytes.
fn records_from_json(page: &Value) -> Result<Vec<Record>> {
    let bytes = |value: &Value| -> Result<Vec<u8>> {
        let text = value.as_str().ok_or_else(|| protocol("a record's bytes", page))?;
        BASE64.decode(text).map_err(|e| Error::Protocol(format!("base64 in a page: {e}")))
    };
    let mut out = Vec::new();
    for record in page["records"].as_array().ok_or_else(|| protocol("records", page))? {
        let mut headers = Vec::new();
        for pair in record["headers"].as_array().into_iter().flatten() {
            headers.push((bytes(&pair[0])?, bytes(&pair[1])?));
        }
        out.push(Record {
            seq_num: record["seq_num"].as_u64().ok_or_else(|| protocol("seq_num", record))?,
            timestamp: record["timestamp"].as_u64().ok_or_else(|| protocol("timestamp", record))?,
            headers,
            body: bytes(&record["body"])?,
        });
    }
    Ok(out)
}

/// A kept-alive connection.
struct Conn {
    reader: BufReader<DeadlineSocket>,
}

impl Conn {
    /// A connection whose every read and write waits at most `timeout` (None: no limit),
    /// tried for at most what is left until `until`.
    fn connect(
        server: &Server,
        timeout: Option<Duration>,
        until: Option<Instant>,
    ) -> io::Result<Conn> {
        let stream = http::connect(server, DeadlineSocket::limit(timeout, until)?)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(timeout)?;
        stream.set_write_timeout(timeout)?;
        Ok(Conn {
            reader: BufReader::with_capacity(64 << 10, DeadlineSocket { stream, timeout, until }),
        })
    }

    /// The connection's reads and writes end by `until` from now on (one call's).
    fn until(&mut self, until: Option<Instant>) -> io::Result<()> {
        let socket = self.reader.get_mut();
        if until.is_none() && socket.until.is_some() {
            // The last call's deadline cut the socket's timeouts: back to the client's.
            socket.stream.set_read_timeout(socket.timeout)?;
            socket.stream.set_write_timeout(socket.timeout)?;
        }
        socket.until = until;
        Ok(())
    }

    /// Whether the server closed it (or sent something unasked) while it sat idle.
    fn is_stale(&self) -> bool {
        let stream = &self.reader.get_ref().stream;
        if !self.reader.buffer().is_empty() || stream.set_nonblocking(true).is_err() {
            return true;
        }
        let mut probe = [0u8; 1];
        let stale =
            !matches!(stream.peek(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
        stale || stream.set_nonblocking(false).is_err()
    }
}

/// A pooled connection's socket: each read and write waits at most the client's timeout,
/// and none past the deadline of the call it serves.
struct DeadlineSocket {
    stream: TcpStream,
    timeout: Option<Duration>,
    until: Option<Instant>,
}

impl DeadlineSocket {
    /// How long one wait may last: `timeout`, cut to what is left until `until`; an error
    /// once nothing is.
    fn limit(timeout: Option<Duration>, until: Option<Instant>) -> io::Result<Option<Duration>> {
        let Some(until) = until else { return Ok(timeout) };
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(deadline_passed());
        }
        Ok(Some(timeout.map_or(left, |timeout| timeout.min(left))))
    }

    /// Sets the socket's next wait with `set`: the client's timeout, or what is left of
    /// the deadline when that is shorter (true).
    fn clip(&self, set: fn(&TcpStream, Option<Duration>) -> io::Result<()>) -> io::Result<bool> {
        let Some(until) = self.until else { return Ok(false) };
        let limit = DeadlineSocket::limit(self.timeout, Some(until))?;
        set(&self.stream, limit)?;
        Ok(limit != self.timeout)
    }
}

fn deadline_passed() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the call's deadline passed")
}

/// A wait's failure, said as the deadline's when the deadline is what ended it.
fn ended(error: io::Error, clipped: bool) -> io::Error {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut if clipped => deadline_passed(),
        _ => error,
    }
}

impl Read for DeadlineSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let clipped = self.clip(TcpStream::set_read_timeout)?;
        self.stream.read(buf).map_err(|error| ended(error, clipped))
    }
}

impl Write for DeadlineSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let clipped = self.clip(TcpStream::set_write_timeout)?;
        self.stream.write(buf).map_err(|error| ended(error, clipped))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// A client of one nova server. Cheap to share between threads (`&Client`); calls reuse
/// up to 16 idle keep-alive connections.
pub struct Client {
    server: Server,
    format: Format,
    attempts: u32,
    backoff: Duration,
    /// Each read and write on a pooled connection waits at most this long.
    timeout: Option<Duration>,
    /// A call, its attempts and the waits between them included, ends within this long.
    deadline: Option<Duration>,
    /// Whether a safe call that timed out is made again.
    timeouts_repeated: bool,
    idle: Mutex<Vec<Conn>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server)
            .field("format", &self.format)
            .finish()
    }
}

impl Client {
    /// A client of the server at `http://HOST:PORT`; binary framing, 3 attempts for safe
    /// calls.
    pub fn new(url: &str) -> Result<Self> {
        Ok(Self {
            server: Server::parse(url).map_err(Error::Invalid)?,
            format: Format::Binary,
            attempts: 3,
            backoff: Duration::from_millis(50),
            timeout: None,
            deadline: None,
            timeouts_repeated: true,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// JSON or the binary framing for appends and reads.
    pub fn with_format(mut self, format: Format) -> Self {
        self.format = format;
        self
    }

    /// Attempts for a call that is safe to repeat (at least 1); the wait between them
    /// starts at 50 ms and doubles, up to [`BACKOFF_MAX`].
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// Each read and write of a call waits at most `timeout` (None, the default: as long
    /// as it takes), so a server that stops answering ends the call with an
    /// [`Error::Io`] (retried like any, when the call is safe to repeat) instead of
    /// holding it. A read with `wait` (a long poll) needs a timeout above its wait.
    /// Append sessions and subscriptions keep it too, on connections of their own: a
    /// session's batch unanswered that long fails it, and a subscription, whose idle
    /// reads wait for the server's heartbeats, needs a timeout above their interval
    /// (`--sse-heartbeat-ms`, 15 s at most). A zero timeout is none.
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout.filter(|timeout| !timeout.is_zero());
        self
    }

    /// Each call ends within `deadline` (None, the default: no bound but the timeouts),
    /// its connection, its attempts and the waits between them included: a call whose
    /// deadline passes fails with an [`Error::Io`] that [`Error::timed_out`], and a retry
    /// is not begun unless as long as the last attempt took is left after its wait (the
    /// last failure is returned). The per-read `timeout` bounds a server that stops
    /// answering; this bounds one that answers too slowly, or a call's retries. Append
    /// sessions and subscriptions, which last as long as their caller wants, are not
    /// bounded by it, nor is resolving the server's name. [`Client::ensure_bucket`] is
    /// two calls, each with the deadline. A read with `wait` (a long poll) needs a
    /// deadline above its wait. A zero deadline is none.
    pub fn with_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.deadline = deadline.filter(|deadline| !deadline.is_zero());
        self
    }

    /// Whether a call safe to repeat is made again after it timed out (the default) or
    /// fails then: with `false`, a server that stopped answering holds a call one
    /// timeout, not one per attempt (the load generator's end of a run).
    pub fn with_timeouts_repeated(mut self, repeated: bool) -> Self {
        self.timeouts_repeated = repeated;
        self
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Every call carries `token` as `Authorization: Bearer <token>` (docs/auth.md).
    pub fn with_token(mut self, token: Option<String>) -> Result<Self> {
        self.server = self.server.with_token(token).map_err(Error::Invalid)?;
        Ok(self)
    }

    /// Each connection (a call's, a session's, a subscription's) is tried for at most
    /// `timeout`, whatever the call's own timeout: an append session, which may have none
    /// (a batch waits as long as the server holds it), still fails fast on a server that
    /// is down and whose host drops connection attempts.
    /// A zero timeout is none.
    pub fn with_connect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.server = self.server.with_connect_timeout(timeout);
        self
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// An idle pooled connection, or a new one; its waits end by `until`.
    fn take_conn(&self, until: Option<Instant>) -> io::Result<Conn> {
        loop {
            let idle = self.idle.lock().map(|mut idle| idle.pop()).unwrap_or(None);
            match idle {
                Some(conn) if conn.is_stale() => continue,
                Some(mut conn) => {
                    conn.until(until)?;
                    return Ok(conn);
                }
                None => return Conn::connect(&self.server, self.timeout, until),
            }
        }
    }

    /// When a call begun now must have ended ([`Client::with_deadline`]).
    fn call_until(&self) -> Option<Instant> {
        self.deadline.map(|deadline| Instant::now() + deadline)
    }

    fn put_conn(&self, conn: Conn) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < POOL_MAX
        {
            idle.push(conn);
        }
    }

    /// One request on a kept-alive connection, ended by `until`; an error status is an
    /// [`Error::Api`].
    fn send_once(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        until: Option<Instant>,
    ) -> Result<Response> {
        let io_error = |error: io::Error| Error::Io {
            what: format!("{method} {path} on {}", self.server.authority),
            error,
        };
        let mut conn = self.take_conn(until).map_err(io_error)?;
        let mut out = Vec::with_capacity(256 + body.map_or(0, <[u8]>::len));
        http::encode_head(
            &mut out,
            method,
            path,
            &self.server,
            headers,
            body.map(<[u8]>::len).or((method != "GET").then_some(0)),
        );
        out.extend_from_slice(body.unwrap_or_default());
        let written = conn.reader.get_mut().write_all(&out);
        // A server may answer before it read the whole body (over its limit): the answer
        // counts, not the failed write.
        let answer = read_response(&mut conn.reader, method);
        match (answer, written) {
            (Ok((response, reusable)), _) => {
                if reusable {
                    self.put_conn(conn);
                }
                if (200..300).contains(&response.status) {
                    Ok(response)
                } else {
                    Err(Error::from_response(&response))
                }
            }
            (Err(error), Ok(())) => {
                Err(read_failure(format!("{method} {path} on {}", self.server.authority), error))
            }
            (Err(_), Err(error)) => Err(io_error(error)),
        }
    }

    /// A request, repeated while it fails transiently when `safe` (no side effects, or
    /// guarded by match_seq_num); an error status is an [`Error::Api`].
    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        safe: bool,
    ) -> Result<Response> {
        let until = self.call_until();
        self.retrying(safe, until, || self.send_once(method, path, headers, body, until))
    }

    /// Runs `attempt` until it succeeds, fails for good, or the attempts are spent (one
    /// when it is not `safe` to repeat): after a transient failure it waits the backoff,
    /// doubled each time, or the server's `Retry-After` when that is longer. No attempt
    /// begins unless as long as the last one took is left of `until` after that wait.
    fn retrying<T>(
        &self,
        safe: bool,
        until: Option<Instant>,
        mut attempt: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        let attempts = if safe { self.attempts } else { 1 };
        let mut backoff = self.backoff;
        let mut tried = 1;
        loop {
            let began = Instant::now();
            let error = match attempt() {
                Err(error)
                    if tried < attempts
                        && error.transient()
                        && (self.timeouts_repeated || !error.timed_out()) =>
                {
                    error
                }
                other => return other,
            };
            // Not begun unless it has as long as the last attempt took left after the
            // wait: one begun with a moment left would only time out, its failure
            // standing in for the last one's answer.
            let wait = backoff.max(error.retry_after());
            if until.is_some_and(|until| Instant::now() + wait + began.elapsed() >= until) {
                return Err(error);
            }
            std::thread::sleep(wait);
            backoff = (backoff * 2).min(BACKOFF_MAX);
            tried += 1;
        }
    }

    /// Any JSON call: the answer's JSON (`Null` for 204). What the CLI prints with `--json`.
    pub fn call_json(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        self.call_json_status(method, path, body).map(|(answer, _)| answer)
    }

    /// [`Client::call_json`], with the answer's HTTP status: a create's 201, or 200 where
    /// it converged on what the same creation token made before (decisions.md).
    pub fn call_json_status(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(Value, u16)> {
        let text = body.map(Value::to_string);
        let safe = method == "GET";
        let response = self.call(method, path, &[], text.as_deref().map(str::as_bytes), safe)?;
        if response.body.is_empty() {
            return Ok((Value::Null, response.status));
        }
        let answer = serde_json::from_slice(&response.body)
            .map_err(|e| Error::Protocol(format!("{method} {path} answered with bad JSON: {e}")))?;
        Ok((answer, response.status))
    }

    // ---- Buckets ------------------------------------------------------------------

    /// ListBuckets: up to `limit` buckets after `start_after`, in name order.
    pub fn list_buckets(
        &self,
        start_after: Option<&str>,
        limit: Option<u64>,
    ) -> Result<Page<Bucket>> {
        let mut query = Vec::new();
        if let Some(after) = start_after {
            query.push(format!("start_after={}", encode_segment(after)));
        }
        if let Some(limit) = limit {
            query.push(format!("limit={limit}"));
        }
        let page = self.call_json("GET", &format!("/v1/buckets?{}", query.join("&")), None)?;
        let items = page["buckets"]
            .as_array()
            .ok_or_else(|| protocol("buckets", &page))?
            .iter()
            .map(Bucket::from_json)
            .collect::<Result<_>>()?;
        Ok(Page { items, next: next(&page) })
    }

    /// CreateBucket; with a creation token, the same call again returns the bucket.
    pub fn create_bucket(&self, bucket: &Bucket, creation_token: Option<&str>) -> Result<Bucket> {
        let mut body = bucket.config_json();
        if let Some(token) = creation_token {
            body.insert("creation_token".into(), json!(token));
        }
        let record =
            self.call_json("POST", &bucket_path(&bucket.name), Some(&Value::Object(body)))?;
        Bucket::from_json(&record)
    }

    pub fn get_bucket(&self, name: &str) -> Result<Bucket> {
        Bucket::from_json(&self.call_json("GET", &bucket_path(name), None)?)
    }

    /// UpdateBucket: the whole configuration (unset defaults take the domain default).
    pub fn update_bucket(&self, bucket: &Bucket) -> Result<Bucket> {
        let body = Value::Object(bucket.config_json());
        Bucket::from_json(&self.call_json("PUT", &bucket_path(&bucket.name), Some(&body))?)
    }

    pub fn delete_bucket(&self, name: &str) -> Result<()> {
        self.call_json("DELETE", &bucket_path(name), None).map(drop)
    }

    /// Create-or-join (buckets.md): creates the bucket with this configuration, or joins
    /// the one already there as it is, never changing what another tool configured. The
    /// bucket as stored: a caller that needs a setting checks it there.
    pub fn ensure_bucket(&self, bucket: &Bucket) -> Result<Bucket> {
        match self.create_bucket(bucket, None) {
            Err(error) if error.code() == Some("already_exists") => self.get_bucket(&bucket.name),
            other => other,
        }
    }

    // ---- Streams ------------------------------------------------------------------

    pub fn create_stream(
        &self,
        address: &Address,
        options: &StreamOptions,
        creation_token: Option<&str>,
    ) -> Result<StreamInfo> {
        let mut body = Map::new();
        options_to_json(options, "", &mut body);
        if let Some(token) = creation_token {
            body.insert("creation_token".into(), json!(token));
        }
        StreamInfo::from_json(&self.call_json(
            "POST",
            &address.path(),
            Some(&Value::Object(body)),
        )?)
    }

    /// GetStream: the record with its tail and trim watermark.
    pub fn get_stream(&self, address: &Address) -> Result<StreamInfo> {
        StreamInfo::from_json(&self.call_json("GET", &address.path(), None)?)
    }

    /// ReconfigureStream: the options that are set change (0 means unbounded).
    pub fn reconfigure_stream(
        &self,
        address: &Address,
        patch: &StreamOptions,
    ) -> Result<StreamInfo> {
        let mut body = Map::new();
        options_to_json(patch, "", &mut body);
        StreamInfo::from_json(&self.call_json(
            "PATCH",
            &address.path(),
            Some(&Value::Object(body)),
        )?)
    }

    pub fn delete_stream(&self, address: &Address) -> Result<()> {
        self.call_json("DELETE", &address.path(), None).map(drop)
    }

    /// ListStreams of a bucket, by key prefix, in key order.
    pub fn list_streams(
        &self,
        bucket: &str,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<u64>,
    ) -> Result<Page<StreamInfo>> {
        let mut query = vec![format!("prefix={}", encode_segment(prefix))];
        if let Some(after) = start_after {
            query.push(format!("start_after={}", encode_segment(after)));
        }
        if let Some(limit) = limit {
            query.push(format!("limit={limit}"));
        }
        let path = format!("/v1/streams/{}?{}", encode_segment(bucket), query.join("&"));
        let page = self.call_json("GET", &path, None)?;
        let items = page["streams"]
            .as_array()
            .ok_or_else(|| protocol("streams", &page))?
            .iter()
            .map(StreamInfo::from_json)
            .collect::<Result<_>>()?;
        Ok(Page { items, next: next(&page) })
    }

    // ---- Records ------------------------------------------------------------------

    /// Appends one batch. Retried after a failed connection only when it carries
    /// `match_seq_num`.
    pub fn append(&self, address: &Address, batch: &Batch, conditions: &Conditions) -> Result<Ack> {
        let path = format!("{}/records", address.path());
        let (body, headers) = match self.format {
            Format::Binary => {
                let mut body = Vec::with_capacity(batch.framed_len(conditions));
                batch.write_framed(conditions, &mut body)?;
                (body, vec![("content-type", RECORDS_MEDIA_TYPE)])
            }
            Format::Json => {
                let (body, base64) = batch.to_json(conditions)?;
                let mut headers = vec![("content-type", "application/json")];
                if base64 {
                    headers.push(("nova-encoding", "base64"));
                }
                (body, headers)
            }
        };
        let response = match conditions.match_seq_num {
            None => self.call("POST", &path, &headers, Some(&body), false)?,
            Some(expected) => {
                let made = expected.saturating_add(batch.len() as u64);
                self.append_guarded(&path, &headers, &body, made)?
            }
        };
        Ack::from_json(&response.json())
    }

    /// An append guarded by `match_seq_num`, sent again while it fails transiently. Once
    /// an attempt's outcome was unknown, a later refusal is an answer only when it shows
    /// that no attempt landed ([`Error::shows_guarded_not_landed`]): a refusal with the
    /// tail the batch itself made, a fencing refusal (checked before `match_seq_num`), or
    /// a tail another writer moved past it all leave the first attempt's fate open, so
    /// the call fails with [`Error::Ambiguous`] for the caller to read the records back.
    /// A last failure whose own outcome is unknown is returned as it is (it says so, and
    /// stays transient: sending a guarded append again is safe).
    fn append_guarded(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        made: u64,
    ) -> Result<Response> {
        let (mut unknown, until) = (None, self.call_until());
        let answer = self.retrying(true, until, || {
            let answer = self.send_once("POST", path, headers, Some(body), until);
            // A connection refused sent nothing.
            if let Err(error) = &answer
                && error.outcome_unknown()
                && !matches!(&error, Error::Io { error, .. }
                    if error.kind() == io::ErrorKind::ConnectionRefused)
            {
                unknown = Some(error.to_string());
            }
            answer
        });
        match (answer, unknown) {
            (Err(last), Some(earlier))
                if !last.outcome_unknown() && !last.shows_guarded_not_landed(made) =>
            {
                Err(Error::Ambiguous(format!(
                    "POST {path}: an attempt's outcome is unknown ({earlier}), and the last \
                     ended with {last}, which does not show that it did not land (this batch \
                     would have made the tail {made}); it may have landed: read it back"
                )))
            }
            (answer, _) => answer,
        }
    }

    /// Reads one page (long polls with `wait_seconds`).
    pub fn read(&self, address: &Address, options: &ReadOptions) -> Result<ReadPage> {
        let path = format!("{}/records?{}", address.path(), options.query());
        match self.format {
            Format::Binary => {
                let response =
                    self.call("GET", &path, &[("accept", RECORDS_MEDIA_TYPE)], None, true)?;
                let mut records = Vec::new();
                let (next_seq_num, tail) = decode_frames(&response.body, &mut records)?
                    .ok_or_else(|| Error::Protocol("a read page without its page end".into()))?;
                Ok(ReadPage { records, next_seq_num, tail })
            }
            Format::Json => {
                let response =
                    self.call("GET", &path, &[("nova-encoding", "base64")], None, true)?;
                let page = response.json();
                Ok(ReadPage {
                    records: records_from_json(&page)?,
                    next_seq_num: page["next_seq_num"]
                        .as_u64()
                        .ok_or_else(|| protocol("next_seq_num", &page))?,
                    tail: Position::from_json(&page["tail"])?,
                })
            }
        }
    }

    /// CheckTail: the next sequence number and the last timestamp.
    pub fn check_tail(&self, address: &Address) -> Result<Position> {
        let answer = self.call_json("GET", &format!("{}/tail", address.path()), None)?;
        Position::from_json(&answer["tail"])
    }

    /// Fence: sets the stream's fencing token, if it is `expected` (when given).
    pub fn fence(
        &self,
        address: &Address,
        token: &str,
        expected: Option<&str>,
    ) -> Result<Position> {
        let mut body = json!({"fencing_token": token});
        if let Some(expected) = expected {
            body["expected"] = json!(expected);
        }
        let answer = self.call_json("POST", &format!("{}/fence", address.path()), Some(&body))?;
        Position::from_json(&answer["tail"])
    }

    /// Trim to a sequence number or a timestamp; the new watermark.
    pub fn trim(&self, address: &Address, to: Start) -> Result<u64> {
        let body = match to {
            Start::SeqNum(n) => json!({"seq_num": n}),
            Start::Timestamp(t) => json!({"timestamp": t}),
            Start::TailOffset(_) => {
                return Err(Error::Invalid("trim goes to a seq_num or a timestamp".into()));
            }
        };
        let answer = self.call_json("POST", &format!("{}/trim", address.path()), Some(&body))?;
        answer["trim_seq_num"].as_u64().ok_or_else(|| protocol("trim_seq_num", &answer))
    }

    /// ReadPlan, as the server's JSON.
    pub fn plan(&self, address: &Address, options: &ReadOptions) -> Result<Value> {
        self.call_json("GET", &format!("{}/plan?{}", address.path(), options.query()), None)
    }

    /// An append session on its own connection: see [`AppendSession`].
    pub fn append_session(&self, address: &Address, in_flight_max: usize) -> Result<AppendSession> {
        AppendSession::open(&self.server, address, self.format, in_flight_max, self.timeout)
    }

    /// A subscription from `options` (its `wait_seconds` is ignored): over the binary
    /// framing, or Server-Sent Events (JSON) when `sse` or the client speaks JSON.
    pub fn subscribe(
        &self,
        address: &Address,
        options: &ReadOptions,
        sse: bool,
    ) -> Result<Subscription> {
        self.open_subscription(address, options, sse, None)
    }

    /// A subscription that resumes right after `last_seq_num` (`Last-Event-ID`).
    pub fn resume(
        &self,
        address: &Address,
        options: &ReadOptions,
        sse: bool,
        last_seq_num: u64,
    ) -> Result<Subscription> {
        self.open_subscription(address, options, sse, Some(last_seq_num))
    }

    fn open_subscription(
        &self,
        address: &Address,
        options: &ReadOptions,
        sse: bool,
        last_seq_num: Option<u64>,
    ) -> Result<Subscription> {
        let sse = sse || self.format == Format::Json;
        // Opening is a read: safe to repeat (not bounded by the deadline: see
        // `with_deadline`).
        self.retrying(true, None, || {
            Subscription::open(&self.server, address, options, sse, last_seq_num, self.timeout)
        })
    }
}

fn bucket_path(name: &str) -> String {
    format!("/v1/buckets/{}", encode_segment(name))
}

fn next(page: &Value) -> Option<String> {
    page["next"].as_str().filter(|n| !n.is_empty()).map(str::to_owned)
}

/// Reads exactly one frame (`u32` length, then that many bytes) into `buf`; false at a
/// clean end of the stream before any byte.
pub(super) fn read_frame(reader: &mut dyn io::BufRead, buf: &mut Vec<u8>) -> io::Result<bool> {
    buf.clear();
    buf.resize(4, 0);
    let mut got = 0;
    while got < 4 {
        let n = reader.read(&mut buf[got..4])?;
        if n == 0 {
            return if got == 0 {
                Ok(false)
            } else {
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a frame length cut short"))
            };
        }
        got += n;
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len > framing::FRAME_LEN_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame length {len} is over the limit of {}", framing::FRAME_LEN_MAX),
        ));
    }
    buf.resize(4 + len as usize, 0);
    reader.read_exact(&mut buf[4..])?;
    Ok(true)
}
