//! The binary framing (`application/x-nova-records`): the fast path of Append, Read and
//! Subscribe (http-api.md, "Binary framing"). It carries stored records (record.rs) as
//! they are, so the server validates them where they land and copies them once into a
//! chunk, and sends chunk bytes back without re-encoding.
//!
//! An append request body:
//!
//! ```text
//! offset  size     field
//! 0       1        framing version (1)
//! 1       1        flags: bit 0 timestamp present, bit 1 match_seq_num present,
//!                  bit 2 fencing token present; bits 3-7 reserved, zero
//! 2       1        fencing token length T (zero unless bit 2)
//! 3       1        reserved, zero
//! 4       4        record count N
//! 8       8        match_seq_num (zero unless bit 1)
//! 16      8        timestamp, i64 ms (zero unless bit 0): the batch's offered stamp
//! 24      T        fencing token, UTF-8
//! 24+T    4·N      stored length of each record, u32
//! ...     Σ        the stored records back to back; the body ends exactly here
//! ```
//!
//! One offered timestamp per batch, not per record: nova stamps a batch once, with the
//! largest stamp its records offer (decisions.md), so a binary client sends that maximum.
//!
//! A read or subscription response is a sequence of frames, `u32 length` (of what
//! follows) then `u8 kind`:
//!
//! ```text
//! kind 1  records    u64 first seq_num, u32 count N, u32 base offset,
//!                    4·N end offsets, 8·N timestamps, the stored records
//!                    (exactly a chunk's directory and data for those records, sent as is)
//! kind 2  heartbeat  u64 tail seq_num, u64 tail timestamp
//! kind 3  page end   u64 next seq_num, u64 tail seq_num, u64 tail timestamp
//! kind 4  end        (nothing): a subscription bound was reached
//! kind 5  error      the JSON error object of http-api.md, UTF-8
//! ```
//!
//! All integers little-endian.
//!
//! A body may arrive in pieces (HTTP hands it over in the reads it came in): a
//! [`FramedBody`] keeps them as they are and [`Pieces`] reads the records across them, so
//! joining them is never a copy of the records.

use std::borrow::Cow;

use s3::Bytes;

use crate::chunk::{self, Records};
use crate::le::{u32_at, u64_at};
use crate::pieces::Pieces;
use crate::position::{Position, Tail};
use crate::record;

/// The one framing version this build speaks.
pub const VERSION: u8 = 1;
/// Bytes before an append's fencing token.
pub const APPEND_PREFIX_LEN: usize = 24;
/// The largest frame a decoder accepts: a page's 16 MiB of content, its framing and
/// directory fit well below it, and it bounds what a malformed length makes us buffer.
pub const FRAME_LEN_MAX: u32 = 64 << 20;

const FLAG_TIMESTAMP: u8 = 1 << 0;
const FLAG_MATCH_SEQ_NUM: u8 = 1 << 1;
const FLAG_FENCING_TOKEN: u8 = 1 << 2;
const FLAGS_RESERVED: u8 = !(FLAG_TIMESTAMP | FLAG_MATCH_SEQ_NUM | FLAG_FENCING_TOKEN);

/// Frame kinds. Persisted on the wire: never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Records = 1,
    Heartbeat = 2,
    PageEnd = 3,
    End = 4,
    Error = 5,
    Ack = 6,
}

/// Bytes before a records frame's tables: length, kind, first seq_num, count, base.
pub const RECORDS_FRAME_HEADER_LEN: usize = 4 + 1 + 8 + 4 + 4;

/// Why framed bytes were refused. Every one is the sender's mistake (invalid_argument
/// for a request, corruption for a response).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("framed body is {len} bytes, shorter than the {needed} bytes its prefix needs")]
    TooShort { len: u64, needed: u64 },
    #[error("framing version {version} is unknown (this build speaks version {VERSION})")]
    UnknownVersion { version: u8 },
    #[error("append flags {flags:#04x} set reserved bits")]
    ReservedFlags { flags: u8 },
    #[error("append prefix reserved byte is {value}, not zero")]
    ReservedByte { value: u8 },
    #[error("append carries a {len}-byte fencing token but its flag is not set")]
    TokenWithoutFlag { len: u8 },
    #[error("append field {field} is {value} but its flag is not set")]
    ValueWithoutFlag { field: &'static str, value: u64 },
    #[error("fencing token is not valid UTF-8")]
    TokenNotUtf8,
    #[error("append announces {count} records but {available} bytes cannot hold their lengths")]
    LengthsOverrun { count: u32, available: u64 },
    #[error("record lengths add up to {lengths} bytes but {data} bytes of records follow")]
    DataLengthMismatch { lengths: u64, data: u64 },
    #[error("frame length {len} is over the limit of {FRAME_LEN_MAX}")]
    FrameTooLong { len: u32 },
    #[error("frame kind {kind} is unknown")]
    UnknownKind { kind: u8 },
    #[error("{kind:?} frame payload is {len} bytes, not {expected}")]
    PayloadLength { kind: FrameKind, len: u64, expected: u64 },
    #[error("records frame: {0}")]
    Records(#[from] chunk::Corruption),
    #[error("error frame is not valid UTF-8")]
    ErrorNotUtf8,
}

/// What an append may carry besides its records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendConditions<'a> {
    /// Apply only if the first record would be numbered exactly this.
    pub match_seq_num: Option<u64>,
    /// Must equal the stream's fencing token.
    pub fencing_token: Option<&'a str>,
    /// The batch's offered timestamp (ms).
    pub timestamp: Option<i64>,
}

/// An append body as it arrived, in one piece or several, none of them copied to join
/// them, except the head (prefix, token and lengths, a few bytes per record) when it is
/// split between pieces: then it is gathered into a first piece of its own. A body
/// shorter than its head is joined whole (it is refused anyway, with the same error as
/// in one piece).
#[derive(Clone, Debug, Default)]
pub struct FramedBody {
    pieces: Vec<Bytes>,
}

impl FramedBody {
    pub fn from_pieces(pieces: impl IntoIterator<Item = Bytes>) -> Self {
        let mut pieces: Vec<Bytes> = pieces.into_iter().filter(|p| !p.is_empty()).collect();
        if pieces.len() > 1 {
            let len: usize = pieces.iter().map(Bytes::len).sum();
            let head = match Pieces::over(&pieces).take(APPEND_PREFIX_LEN) {
                Some(prefix) => {
                    let count = u64::from(u32_at(&prefix, 4));
                    APPEND_PREFIX_LEN as u64 + u64::from(prefix[2]) + 4 * count
                }
                None => u64::MAX,
            };
            if head > len as u64 {
                pieces = vec![pieces.concat().into()];
            } else if pieces[0].len() < head as usize {
                pieces = split_after(pieces, head as usize);
            }
        }
        Self { pieces }
    }

    /// The body's length in bytes.
    pub fn len(&self) -> usize {
        self.pieces.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}

impl From<Bytes> for FramedBody {
    fn from(bytes: Bytes) -> Self {
        Self::from_pieces([bytes])
    }
}

impl From<Vec<u8>> for FramedBody {
    fn from(bytes: Vec<u8>) -> Self {
        Self::from_pieces([Bytes::from(bytes)])
    }
}

/// `pieces` with their first `head` bytes gathered into a first piece of their own.
fn split_after(pieces: Vec<Bytes>, head: usize) -> Vec<Bytes> {
    let mut first = Vec::with_capacity(head);
    let mut out = vec![Bytes::new()];
    for piece in pieces {
        let wanted = head - first.len();
        if wanted == 0 {
            out.push(piece);
        } else if piece.len() <= wanted {
            first.extend_from_slice(&piece);
        } else {
            first.extend_from_slice(&piece[..wanted]);
            out.push(piece.slice(wanted..));
        }
    }
    out[0] = first.into();
    out
}

/// A decoded append request: conditions, and the records still in their framed form,
/// borrowed from the request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendFrame<'a> {
    pub conditions: AppendConditions<'a>,
    /// Each record's stored length, little-endian u32: exactly what
    /// [`chunk::ChunkBuilder::push_batch`] takes.
    pub lengths: &'a [u8],
    /// The stored records back to back.
    pub data: Pieces<'a>,
}

impl<'a> AppendFrame<'a> {
    /// Decodes an append body in one piece; see [`AppendFrame::decode_body`].
    pub fn decode(body: &'a [u8]) -> Result<Self, FramingError> {
        Self::decode_pieces(body, &[])
    }

    /// Decodes an append body. Checks the framing only; the records themselves are
    /// validated by [`crate::batch`].
    pub fn decode_body(body: &'a FramedBody) -> Result<Self, FramingError> {
        match body.pieces.split_first() {
            Some((first, rest)) => Self::decode_pieces(first, rest),
            None => Self::decode(&[]),
        }
    }

    /// `first` holds the whole head whenever the body is as long as its head says
    /// ([`FramedBody`] makes it so); errors count the whole body.
    fn decode_pieces(first: &'a [u8], rest: &'a [Bytes]) -> Result<Self, FramingError> {
        let len = Pieces::new(first, rest).len();
        let Some(prefix) = first.first_chunk::<APPEND_PREFIX_LEN>() else {
            return Err(FramingError::TooShort {
                len: len as u64,
                needed: APPEND_PREFIX_LEN as u64,
            });
        };
        let [version, flags, token_len, reserved] = [prefix[0], prefix[1], prefix[2], prefix[3]];
        if version != VERSION {
            return Err(FramingError::UnknownVersion { version });
        }
        if flags & FLAGS_RESERVED != 0 {
            return Err(FramingError::ReservedFlags { flags });
        }
        if reserved != 0 {
            return Err(FramingError::ReservedByte { value: reserved });
        }
        let count = u32_at(prefix, 4);
        let match_seq_num = u64_at(prefix, 8);
        let timestamp = u64_at(prefix, 16);
        if flags & FLAG_FENCING_TOKEN == 0 && token_len != 0 {
            return Err(FramingError::TokenWithoutFlag { len: token_len });
        }
        for (flag, field, value) in [
            (FLAG_MATCH_SEQ_NUM, "match_seq_num", match_seq_num),
            (FLAG_TIMESTAMP, "timestamp", timestamp),
        ] {
            if flags & flag == 0 && value != 0 {
                return Err(FramingError::ValueWithoutFlag { field, value });
            }
        }
        let after = &first[APPEND_PREFIX_LEN..];
        let token_len = usize::from(token_len);
        if len < APPEND_PREFIX_LEN + token_len {
            return Err(FramingError::TooShort {
                len: len as u64,
                needed: (APPEND_PREFIX_LEN + token_len) as u64,
            });
        }
        let (token, after) = after.split_at(token_len);
        let fencing_token = if flags & FLAG_FENCING_TOKEN != 0 {
            Some(std::str::from_utf8(token).map_err(|_| FramingError::TokenNotUtf8)?)
        } else {
            None
        };
        let lengths_len = u64::from(count) * 4;
        let available = (len - APPEND_PREFIX_LEN - token_len) as u64;
        if available < lengths_len {
            return Err(FramingError::LengthsOverrun { count, available });
        }
        let (lengths, data) = after.split_at(lengths_len as usize);
        let data = Pieces::new(data, rest);
        let total: u64 = lengths.chunks_exact(4).map(|l| u64::from(u32_at(l, 0))).sum();
        if total != data.len() as u64 {
            return Err(FramingError::DataLengthMismatch {
                lengths: total,
                data: data.len() as u64,
            });
        }
        Ok(Self {
            conditions: AppendConditions {
                match_seq_num: (flags & FLAG_MATCH_SEQ_NUM != 0).then_some(match_seq_num),
                fencing_token,
                timestamp: (flags & FLAG_TIMESTAMP != 0).then_some(timestamp as i64),
            },
            lengths,
            data,
        })
    }

    /// How many records.
    pub fn record_count(&self) -> usize {
        self.lengths.len() / 4
    }

    /// The stored records, each borrowed where it lies in one piece of the body.
    pub fn records(&self) -> impl Iterator<Item = Cow<'a, [u8]>> + 'a {
        let mut data = self.data;
        self.lengths.chunks_exact(4).map(move |length| {
            data.take(u32_at(length, 0) as usize).expect("the lengths add up to the data")
        })
    }
}

/// Builds an append body record by record.
#[derive(Clone, Debug, Default)]
pub struct AppendBuilder {
    lengths: Vec<u8>,
    data: Vec<u8>,
}

impl AppendBuilder {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a record by its headers and body.
    pub fn push<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        headers: &[(N, V)],
        body: &[u8],
    ) -> Result<(), record::EncodeError> {
        let before = self.data.len();
        record::encode(headers, body, &mut self.data)?;
        let stored = u32::try_from(self.data.len() - before).map_err(|_| {
            self.data.truncate(before);
            record::EncodeError::FieldTooLong { len: body.len() }
        })?;
        self.lengths.extend_from_slice(&stored.to_le_bytes());
        Ok(())
    }

    /// Records so far.
    pub fn len(&self) -> usize {
        self.lengths.len() / 4
    }

    /// Whether no record was added.
    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// Stored-record bytes so far.
    pub fn stored_bytes(&self) -> usize {
        self.data.len()
    }

    /// The stored records, one slice each, in order.
    pub fn records(&self) -> impl Iterator<Item = &[u8]> {
        let mut data = self.data.as_slice();
        self.lengths.chunks_exact(4).map(move |length| {
            let len = crate::le::u32_at(length, 0) as usize;
            let (record, rest) = data.split_at(len);
            data = rest;
            record
        })
    }

    /// Empties the batch, keeping its buffers for the next one.
    pub fn clear(&mut self) {
        self.lengths.clear();
        self.data.clear();
    }

    /// Bytes of the body [`AppendBuilder::finish`] makes with these conditions.
    pub fn framed_len(&self, conditions: &AppendConditions<'_>) -> usize {
        APPEND_PREFIX_LEN
            + conditions.fencing_token.map_or(0, str::len)
            + self.lengths.len()
            + self.data.len()
    }

    /// The body, with the conditions in its prefix.
    ///
    /// # Panics
    /// If the fencing token is over 255 bytes (the domain limit is 36; check it first).
    pub fn finish(&self, conditions: &AppendConditions<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.framed_len(conditions));
        self.finish_into(conditions, &mut out);
        out
    }

    /// [`AppendBuilder::finish`] into the end of `out` (a reused request buffer).
    ///
    /// # Panics
    /// If the fencing token is over 255 bytes (the domain limit is 36; check it first).
    pub fn finish_into(&self, conditions: &AppendConditions<'_>, out: &mut Vec<u8>) {
        let token = conditions.fencing_token.unwrap_or("");
        let token_len = u8::try_from(token.len()).expect("fencing tokens are checked to be short");
        let mut flags = 0;
        if conditions.timestamp.is_some() {
            flags |= FLAG_TIMESTAMP;
        }
        if conditions.match_seq_num.is_some() {
            flags |= FLAG_MATCH_SEQ_NUM;
        }
        if conditions.fencing_token.is_some() {
            flags |= FLAG_FENCING_TOKEN;
        }
        out.reserve(self.framed_len(conditions));
        out.extend_from_slice(&[VERSION, flags, token_len, 0]);
        out.extend_from_slice(
            &u32::try_from(self.len()).expect("a batch is far below 4 Gi records").to_le_bytes(),
        );
        out.extend_from_slice(&conditions.match_seq_num.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&conditions.timestamp.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(token.as_bytes());
        out.extend_from_slice(&self.lengths);
        out.extend_from_slice(&self.data);
    }
}

/// One decoded response frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Records, validated (directory and every stored record).
    Records(Records<'a>),
    /// The stream's tail, sent when a subscription is idle.
    Heartbeat(Tail),
    /// The end of a read page: where to continue, and the tail.
    PageEnd { next_seq_num: u64, tail: Tail },
    /// A subscription bound was reached.
    End,
    /// An error, as the JSON object of http-api.md.
    Error(&'a str),
    /// An append session's acknowledgement of its next batch: where it landed, and the
    /// tail at the ack.
    Ack { start: Position, end: Position, tail: Tail },
}

/// The fixed part of a records frame for `records`; the frame is this, then the run's
/// end-offset table, timestamp table and data, each sent as is (a vectored write).
pub fn records_frame_header(records: &Records<'_>) -> [u8; RECORDS_FRAME_HEADER_LEN] {
    let payload = 1
        + 8
        + 4
        + 4
        + records.ends_bytes().len()
        + records.timestamps_bytes().len()
        + records.data().len();
    let mut header = [0u8; RECORDS_FRAME_HEADER_LEN];
    header[0..4]
        .copy_from_slice(&u32::try_from(payload).expect("pages are far below 4 GiB").to_le_bytes());
    header[4] = FrameKind::Records as u8;
    header[5..13].copy_from_slice(&records.first_seq_num().to_le_bytes());
    header[13..17].copy_from_slice(&(records.len() as u32).to_le_bytes());
    header[17..21].copy_from_slice(&records.base().to_le_bytes());
    header
}

/// Appends a records frame.
pub fn encode_records(records: &Records<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(&records_frame_header(records));
    out.extend_from_slice(records.ends_bytes());
    out.extend_from_slice(records.timestamps_bytes());
    out.extend_from_slice(records.data());
}

fn encode_fixed(kind: FrameKind, fields: &[u64], out: &mut Vec<u8>) {
    out.extend_from_slice(&(1 + 8 * fields.len() as u32).to_le_bytes());
    out.push(kind as u8);
    fields.iter().for_each(|field| out.extend_from_slice(&field.to_le_bytes()));
}

/// Appends a heartbeat frame.
pub fn encode_heartbeat(tail: Tail, out: &mut Vec<u8>) {
    encode_fixed(FrameKind::Heartbeat, &[tail.seq_num, tail.timestamp], out);
}

/// Appends a page-end frame.
pub fn encode_page_end(next_seq_num: u64, tail: Tail, out: &mut Vec<u8>) {
    encode_fixed(FrameKind::PageEnd, &[next_seq_num, tail.seq_num, tail.timestamp], out);
}

/// Appends an end frame.
pub fn encode_end(out: &mut Vec<u8>) {
    encode_fixed(FrameKind::End, &[], out);
}

/// Appends an error frame carrying a JSON error object.
pub fn encode_error(json: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(
        &(1 + u32::try_from(json.len()).expect("error bodies are small")).to_le_bytes(),
    );
    out.push(FrameKind::Error as u8);
    out.extend_from_slice(json.as_bytes());
}

/// Appends an ack frame (an append session's acknowledgement of its next batch).
pub fn encode_ack(start: Position, end: Position, tail: Tail, out: &mut Vec<u8>) {
    let fields = [start, end, tail].map(|p| [p.seq_num, p.timestamp]);
    encode_fixed(FrameKind::Ack, fields.as_flattened(), out);
}

/// The length prefix of one batch of an append session's request body: the body is each
/// batch's append body (the layout [`AppendFrame`] decodes) after its length.
pub fn session_batch_prefix(append_body_len: usize) -> Result<[u8; 4], FramingError> {
    u32::try_from(append_body_len)
        .map(u32::to_le_bytes)
        .map_err(|_| FramingError::FrameTooLong { len: u32::MAX })
}

/// Decodes the first frame of `buf`. `Ok(None)` means the frame is not complete yet
/// (read more bytes); otherwise the frame and how many bytes it took.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Frame<'_>, usize)>, FramingError> {
    let Some(len) = buf.first_chunk::<4>().map(|l| u32::from_le_bytes(*l)) else { return Ok(None) };
    if len > FRAME_LEN_MAX {
        return Err(FramingError::FrameTooLong { len });
    }
    if len == 0 {
        return Err(FramingError::TooShort { len: 0, needed: 1 });
    }
    let total = 4 + len as usize;
    let Some(frame) = buf.get(4..total) else { return Ok(None) };
    let (kind, payload) = (frame[0], &frame[1..]);
    let fixed = |kind: FrameKind, fields: usize| {
        if payload.len() == 8 * fields {
            Ok((0..fields).map(|i| u64_at(payload, 8 * i)).collect::<Vec<_>>())
        } else {
            Err(FramingError::PayloadLength {
                kind,
                len: payload.len() as u64,
                expected: 8 * fields as u64,
            })
        }
    };
    let decoded = match kind {
        1 => Frame::Records(decode_records(payload)?),
        2 => {
            let f = fixed(FrameKind::Heartbeat, 2)?;
            Frame::Heartbeat(Tail { seq_num: f[0], timestamp: f[1] })
        }
        3 => {
            let f = fixed(FrameKind::PageEnd, 3)?;
            Frame::PageEnd { next_seq_num: f[0], tail: Tail { seq_num: f[1], timestamp: f[2] } }
        }
        4 => {
            fixed(FrameKind::End, 0)?;
            Frame::End
        }
        5 => Frame::Error(std::str::from_utf8(payload).map_err(|_| FramingError::ErrorNotUtf8)?),
        6 => {
            let f = fixed(FrameKind::Ack, 6)?;
            let at = |i: usize| Position { seq_num: f[i], timestamp: f[i + 1] };
            Frame::Ack { start: at(0), end: at(2), tail: at(4) }
        }
        kind => return Err(FramingError::UnknownKind { kind }),
    };
    Ok(Some((decoded, total)))
}

fn decode_records(payload: &[u8]) -> Result<Records<'_>, FramingError> {
    const FIXED: usize = 8 + 4 + 4;
    if payload.len() < FIXED {
        return Err(FramingError::PayloadLength {
            kind: FrameKind::Records,
            len: payload.len() as u64,
            expected: FIXED as u64,
        });
    }
    let (first_seq_num, count, base) =
        (u64_at(payload, 0), u32_at(payload, 8), u32_at(payload, 12));
    let tables = u64::from(count) * chunk::DIR_ENTRY_LEN as u64;
    let rest = &payload[FIXED..];
    if (rest.len() as u64) < tables {
        return Err(FramingError::PayloadLength {
            kind: FrameKind::Records,
            len: payload.len() as u64,
            expected: FIXED as u64 + tables,
        });
    }
    let (ends, rest) = rest.split_at(4 * count as usize);
    let (timestamps, data) = rest.split_at(8 * count as usize);
    let records = Records::new(first_seq_num, base, ends, timestamps, data)?;
    records.validate_records()?;
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::ChunkBuilder;
    use crate::ids::StreamId;
    use proptest::prelude::*;

    fn sample_append(conditions: &AppendConditions<'_>) -> Vec<u8> {
        let mut builder = AppendBuilder::new();
        builder.push::<&[u8], &[u8]>(&[], b"hi").expect("fits");
        builder.push(&[(b"k", b"v")], b"hi").expect("fits");
        builder.finish(conditions)
    }

    #[test]
    fn a_reused_builder_frames_exactly_what_a_fresh_one_does() {
        let conditions =
            AppendConditions { match_seq_num: Some(7), fencing_token: Some("t"), timestamp: None };
        let mut reused = AppendBuilder::new();
        reused.push::<&[u8], &[u8]>(&[], b"an earlier, longer batch").expect("fits");
        reused.clear();
        assert!(reused.is_empty() && reused.stored_bytes() == 0);
        reused.push::<&[u8], &[u8]>(&[], b"hi").expect("fits");
        reused.push(&[(b"k", b"v")], b"hi").expect("fits");
        let fresh = sample_append(&conditions);
        let mut out = b"kept".to_vec();
        reused.finish_into(&conditions, &mut out);
        assert_eq!(&out[..4], b"kept", "finish_into appends");
        assert_eq!(out[4..], fresh[..]);
        assert_eq!(reused.framed_len(&conditions), fresh.len());
        let frame = AppendFrame::decode(&fresh).expect("valid");
        assert!(frame.records().eq(reused.records()), "records() are the framed records");
    }

    #[test]
    fn append_round_trip() {
        let conditions = AppendConditions {
            match_seq_num: Some(42),
            fencing_token: Some("writer-1"),
            timestamp: Some(-5),
        };
        let body = sample_append(&conditions);
        let frame = AppendFrame::decode(&body).expect("valid");
        assert_eq!(frame.conditions, conditions);
        assert_eq!(frame.record_count(), 2);
        let records: Vec<Vec<u8>> = frame.records().map(Cow::into_owned).collect();
        assert_eq!(records, [vec![0x00, b'h', b'i'], vec![1, 1, 1, 1, b'k', b'v', b'h', b'i']]);
        let bare = sample_append(&AppendConditions::default());
        assert_eq!(
            AppendFrame::decode(&bare).expect("valid").conditions,
            AppendConditions::default()
        );
    }

    #[test]
    fn append_golden_vectors() {
        let full = AppendConditions {
            match_seq_num: Some(7),
            fencing_token: Some("t1"),
            timestamp: Some(1000),
        };
        let mut session = Vec::new();
        for conditions in [AppendConditions { match_seq_num: Some(7), ..Default::default() }, full]
        {
            let body = sample_append(&conditions);
            session.extend_from_slice(&session_batch_prefix(body.len()).expect("small"));
            session.extend_from_slice(&body);
        }
        crate::golden::check(
            "append_vectors.txt",
            &[
                ("bare, seed records", sample_append(&AppendConditions::default())),
                ("match 7, token t1, timestamp 1000", sample_append(&full)),
                ("session body: match 7, then match 7, token t1, timestamp 1000", session),
            ],
        );
    }

    #[test]
    fn append_refusals() {
        let good = sample_append(&AppendConditions::default());
        let refuse = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut body = good.clone();
            edit(&mut body);
            AppendFrame::decode(&body).expect_err("refused")
        };
        assert_eq!(refuse(&|b| b.truncate(23)), FramingError::TooShort { len: 23, needed: 24 });
        assert_eq!(refuse(&|b| b[0] = 2), FramingError::UnknownVersion { version: 2 });
        assert_eq!(refuse(&|b| b[1] = 0x08), FramingError::ReservedFlags { flags: 0x08 });
        assert_eq!(refuse(&|b| b[3] = 1), FramingError::ReservedByte { value: 1 });
        assert_eq!(refuse(&|b| b[2] = 1), FramingError::TokenWithoutFlag { len: 1 });
        assert_eq!(
            refuse(&|b| b[8] = 3),
            FramingError::ValueWithoutFlag { field: "match_seq_num", value: 3 }
        );
        assert_eq!(
            refuse(&|b| b[16] = 3),
            FramingError::ValueWithoutFlag { field: "timestamp", value: 3 }
        );
        assert!(matches!(
            refuse(&|b| b[4..8].copy_from_slice(&u32::MAX.to_le_bytes())),
            FramingError::LengthsOverrun { .. }
        ));
        assert_eq!(
            refuse(&|b| b.push(0)),
            FramingError::DataLengthMismatch { lengths: 11, data: 12 }
        );
        assert_eq!(
            refuse(&|b| {
                b.pop();
            }),
            FramingError::DataLengthMismatch { lengths: 11, data: 10 }
        );
        // A token flag with bytes that are not UTF-8.
        let mut body =
            sample_append(&AppendConditions { fencing_token: Some("ab"), ..Default::default() });
        body[APPEND_PREFIX_LEN] = 0xFF;
        assert_eq!(AppendFrame::decode(&body), Err(FramingError::TokenNotUtf8));
        // A token longer than the body.
        let mut body =
            sample_append(&AppendConditions { fencing_token: Some("ab"), ..Default::default() });
        body.truncate(APPEND_PREFIX_LEN + 1);
        assert!(matches!(AppendFrame::decode(&body), Err(FramingError::TooShort { .. })));
    }

    fn sample_records() -> crate::chunk::SealedChunk {
        let mut builder = ChunkBuilder::new(StreamId([1; 16]), 10, 4096);
        for (i, body) in [&b"a"[..], b"bb", b"ccc"].iter().enumerate() {
            let mut stored = Vec::new();
            record::encode::<&[u8], &[u8]>(&[], body, &mut stored).expect("fits");
            builder.push_record(&stored, 50 + i as u64).expect("fits");
        }
        builder.seal()
    }

    #[test]
    fn response_frames_round_trip() {
        let chunk = sample_records();
        let part = chunk.records().slice(1..3);
        let tail = Tail { seq_num: 13, timestamp: 52 };
        let mut out = Vec::new();
        encode_records(&part, &mut out);
        encode_heartbeat(tail, &mut out);
        encode_page_end(13, tail, &mut out);
        encode_end(&mut out);
        encode_error(r#"{"code":"not_found"}"#, &mut out);
        let (start, end) =
            (Position { seq_num: 11, timestamp: 50 }, Position { seq_num: 13, timestamp: 50 });
        encode_ack(start, end, tail, &mut out);
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some((frame, used)) = decode_frame(&out[at..]).expect("valid") {
            frames.push(frame);
            at += used;
        }
        assert_eq!(at, out.len());
        assert_eq!(
            frames,
            [
                Frame::Records(part),
                Frame::Heartbeat(tail),
                Frame::PageEnd { next_seq_num: 13, tail },
                Frame::End,
                Frame::Error(r#"{"code":"not_found"}"#),
                Frame::Ack { start, end, tail },
            ]
        );
        // Every proper prefix of a frame is "not yet complete", never an error.
        let mut one = Vec::new();
        encode_records(&part, &mut one);
        for cut in 0..one.len() {
            assert_eq!(decode_frame(&one[..cut]), Ok(None), "prefix of {cut} bytes");
        }
    }

    #[test]
    fn response_golden_vectors() {
        let chunk = sample_records();
        let mut records = Vec::new();
        encode_records(&chunk.records().slice(1..3), &mut records);
        let mut control = Vec::new();
        encode_heartbeat(Tail { seq_num: 13, timestamp: 52 }, &mut control);
        encode_page_end(13, Tail { seq_num: 13, timestamp: 52 }, &mut control);
        encode_end(&mut control);
        let mut ack = Vec::new();
        let at = |seq_num, timestamp| Position { seq_num, timestamp };
        encode_ack(at(11, 50), at(13, 50), at(13, 52), &mut ack);
        crate::golden::check(
            "frame_vectors.txt",
            &[
                ("records 11..13", records),
                ("heartbeat, page end, end", control),
                ("ack 11..13, tail 13 at 52", ack),
            ],
        );
    }

    #[test]
    fn response_refusals() {
        let frame = |kind: u8, payload: &[u8]| {
            let mut out = (1 + payload.len() as u32).to_le_bytes().to_vec();
            out.push(kind);
            out.extend_from_slice(payload);
            out
        };
        assert_eq!(decode_frame(&frame(9, &[])), Err(FramingError::UnknownKind { kind: 9 }));
        assert!(matches!(
            decode_frame(&frame(2, &[0; 15])),
            Err(FramingError::PayloadLength { .. })
        ));
        assert!(matches!(decode_frame(&frame(4, &[0])), Err(FramingError::PayloadLength { .. })));
        assert_eq!(decode_frame(&frame(5, &[0xFF])), Err(FramingError::ErrorNotUtf8));
        assert!(matches!(
            decode_frame(&frame(6, &[0; 40])),
            Err(FramingError::PayloadLength { .. })
        ));
        assert_eq!(decode_frame(&[0, 0, 0, 0]), Err(FramingError::TooShort { len: 0, needed: 1 }));
        assert_eq!(
            decode_frame(&(FRAME_LEN_MAX + 1).to_le_bytes()),
            Err(FramingError::FrameTooLong { len: FRAME_LEN_MAX + 1 })
        );
        // A records frame whose record is corrupt.
        let mut payload = Vec::new();
        payload.extend_from_slice(&0u64.to_le_bytes());
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&0u32.to_le_bytes());
        payload.extend_from_slice(&2u32.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes());
        payload.extend_from_slice(&[0x80, 0]);
        assert!(matches!(
            decode_frame(&frame(1, &payload)),
            Err(FramingError::Records(chunk::Corruption::Record { index: 0, .. }))
        ));
        // A records frame whose tables run past its payload.
        assert!(matches!(
            decode_frame(&frame(1, &payload[..20])),
            Err(FramingError::PayloadLength { .. })
        ));
    }

    proptest! {
        #[test]
        fn append_property_round_trip(
            bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..100), 0..20),
            match_seq_num in prop::option::of(any::<u64>()),
            timestamp in prop::option::of(any::<i64>()),
            token in prop::option::of("[a-z0-9-]{0,36}"),
        ) {
            let mut builder = AppendBuilder::new();
            for body in &bodies {
                builder.push(&[(b"h", body.as_slice())], body).expect("fits");
            }
            let conditions = AppendConditions { match_seq_num, timestamp, fencing_token: token.as_deref() };
            let body = builder.finish(&conditions);
            let frame = AppendFrame::decode(&body).expect("valid");
            prop_assert_eq!(frame.conditions, conditions);
            let decoded: Vec<Vec<u8>> =
                frame.records().map(|r| record::decode(&r).expect("valid").body().to_vec()).collect();
            prop_assert_eq!(decoded, bodies);
        }

        /// A body in pieces, however cut, decodes as it does whole: the same conditions,
        /// lengths and records, or the same refusal.
        #[test]
        fn a_body_in_pieces_decodes_as_it_does_whole(
            bodies in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..12),
            token in prop::option::of("[a-z]{0,20}"),
            cut_at in prop::collection::vec(0usize..400, 0..6),
            garbage in prop::collection::vec(any::<u8>(), 0..60),
            garble in any::<bool>(),
        ) {
            let mut builder = AppendBuilder::new();
            for body in &bodies {
                builder.push::<&[u8], &[u8]>(&[], body).expect("fits");
            }
            let conditions = AppendConditions { fencing_token: token.as_deref(), ..Default::default() };
            let whole = if garble { garbage } else { builder.finish(&conditions) };
            let mut cuts: Vec<usize> = cut_at.into_iter().map(|c| c.min(whole.len())).collect();
            cuts.sort_unstable();
            let shared = Bytes::from(whole.clone());
            let mut pieces = Vec::new();
            let mut at = 0;
            for cut in cuts.into_iter().chain([whole.len()]) {
                pieces.push(shared.slice(at..cut));
                at = cut;
            }
            let body = FramedBody::from_pieces(pieces);
            prop_assert_eq!(body.len(), whole.len());
            prop_assert_eq!(AppendFrame::decode_body(&body), AppendFrame::decode(&whole));
            if let Ok(frame) = AppendFrame::decode_body(&body) {
                let decoded: Vec<Vec<u8>> = frame.records().map(Cow::into_owned).collect();
                let expected: Vec<Vec<u8>> =
                    AppendFrame::decode(&whole).expect("valid").records().map(Cow::into_owned).collect();
                prop_assert_eq!(decoded, expected);
            }
        }

        #[test]
        fn arbitrary_frames_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_frame(&bytes);
            let _ = AppendFrame::decode(&bytes);
        }
    }
}
