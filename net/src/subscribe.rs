//! Subscriptions (streams.md "Subscriptions", decisions.md), over Server-Sent Events
//! (`Accept: text/event-stream`) or the binary framing (`Accept:
//! application/x-nova-records; subscribe=true`): history from the start position, then
//! every new record as it becomes durable, in order, with no gap and no duplicate (each
//! page starts at the last page's `next_seq_num`).
//!
//! SSE events: `batch` (`id:` the last seq_num in it), `ping` with the tail when idle for
//! the heartbeat interval, `end` when a bound (`count`, `bytes`, `until`) is reached,
//! `error` (a deleted stream ends with not_found). Binary frames (framing.rs): records
//! frames as the chunk holds them, each page closed by a page-end frame with the tail,
//! heartbeat frames with the tail, an end frame, an error frame. `Last-Event-ID` resumes
//! right after the sequence number it names and wins over `seq_num`. A start past the
//! tail is an ordinary 416 before any event. Pages after the first never create the
//! stream, so deleting it ends the subscription, and a token revoked or expired since
//! the subscription began ends it with unauthenticated.
//!
//! Memory is bounded per subscriber and per shard. Events go through a channel of
//! [`EVENTS_QUEUED_MAX`] events of at most one page each (1 MiB of content for SSE,
//! [`BINARY_PAGE_BYTES_MAX`] for the binary framing); a subscriber that does not read
//! leaves the task waiting on the channel, not buffering. With the page hyper is
//! writing and the one the task waits to queue, that is six pages: 24 MiB for the
//! binary framing, and for SSE 6 MiB of content, whose JSON may be several times that
//! (a control byte is six characters escaped). Every page is also held in the shard's
//! response memory (`--http-response-memory-bytes`, response_memory.rs) until its
//! client has taken it: a page is read cut to what is free, and when too little is, the
//! subscription waits for room (sending heartbeats with the last tail it saw), holding
//! nothing more. A page that does not fit once encoded is let go and read again from
//! its start, cut to fit or once there is room, so nothing is ever held outside the
//! budget, and no record is skipped or sent twice.

use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use engine::framing;
use engine::ids::StreamId;
use engine::names::{BucketName, StreamKey};
use engine::position::Tail;
use engine::shard::{ReadReply, ReadRequest};
use engine::stream::ReadStart;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response};
use serde_json::{Value, json};

use crate::api::{self, Shared};
use crate::auth::Caller;
use crate::body::{Body, Chunk};
use crate::error::{ApiError, position};
use crate::response_memory::{Cut, PAGE_BYTES_MIN, Refit};
use crate::wire::{self, Encoding};

/// When an idle subscription's heartbeat is due: somewhat before `--sse-heartbeat-ms`
/// (a tenth of it, at most 250 ms), so the read that waits for records and the send
/// after it end within it, and a client never goes longer than it without an event.
fn heartbeat_due(interval: std::time::Duration) -> std::time::Duration {
    interval - (interval / 10).min(std::time::Duration::from_millis(250))
}

/// Events queued for one subscriber before its task waits.
pub const EVENTS_QUEUED_MAX: usize = 4;
/// Content bytes of one binary subscription page (a subscriber holds at most six: see
/// the module docs).
pub const BINARY_PAGE_BYTES_MAX: u64 = 4 << 20;

/// How a subscription's events are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Sse(Encoding),
    Binary,
}

/// What is left of a subscription's bounds.
///
/// `bytes` bounds the whole subscription, and only its first record may alone exceed it
/// (streams.md, decisions.md). Each page is read with what is left as its byte budget,
/// but the engine returns a page's first record even when it alone exceeds the page's
/// budget, so a page after the first record delivered is checked with [`Left::fits`].
#[derive(Clone, Copy, Debug)]
struct Left {
    count: Option<u64>,
    bytes: Option<u64>,
    until: Option<u64>,
    /// A record has been delivered, so no other record may exceed what is left.
    delivered: bool,
}

impl Left {
    fn exhausted(&self) -> bool {
        self.count == Some(0) || self.bytes == Some(0)
    }

    /// Whether every record of `page` may be delivered: the first record of the
    /// subscription always may, any later one only within what is left of `bytes`.
    fn fits(&self, page: &ReadReply) -> bool {
        !self.delivered || self.bytes.is_none_or(|bytes| page.content_bytes <= bytes)
    }

    fn take(&mut self, page: &ReadReply) {
        self.count = self.count.map(|c| c.saturating_sub(page.record_count));
        self.bytes = self.bytes.map(|b| b.saturating_sub(page.content_bytes));
        self.delivered |= page.record_count > 0;
    }

    fn request(
        &self,
        wire: Wire,
        start: ReadStart,
        clamp: bool,
        wait: Option<std::time::Duration>,
    ) -> ReadRequest {
        let binary = wire == Wire::Binary;
        let mut limits = api::page_limits(self.count, self.bytes, self.until, binary);
        if binary {
            limits.bytes = limits.bytes.min(BINARY_PAGE_BYTES_MAX);
        }
        ReadRequest { start, clamp, limits, wait }
    }
}

pub async fn subscribe(
    shared: &Rc<Shared>,
    caller: &Caller,
    bucket: &BucketName,
    key: &StreamKey,
    request: &Request<Incoming>,
    binary: bool,
) -> Result<Response<Body>, ApiError> {
    let wire = if binary { Wire::Binary } else { Wire::Sse(api::encoding(request)?) };
    let params = api::read_params(request, &api::READ_PARAMS)?;
    if request.headers().get_all("last-event-id").iter().nth(1).is_some() {
        return Err(ApiError::invalid("header Last-Event-ID is given twice"));
    }
    let resume = match request.headers().get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| api::plain_number::<u64>(v.trim(), false))
                .ok_or_else(|| {
                    ApiError::invalid(format!(
                        "header Last-Event-ID must be the last seq_num delivered, not {value:?}"
                    ))
                })?,
        ),
    };
    let start = match resume {
        Some(last) => ReadStart::SeqNum(last.saturating_add(1)),
        None => params.start,
    };
    let left =
        Left { count: params.count, bytes: params.bytes, until: params.until, delivered: false };
    // The first page is read before the response starts, so a start past the tail (or
    // a shard without room for it) is an ordinary HTTP error.
    let mut request = left.request(wire, start, params.clamp, None);
    request.limits.bytes = shared.responses.page_bytes(request.limits.bytes)?;
    let first = api::read_page(shared, bucket, key, params.stream, request).await?;
    let stream = first.stream;
    let (events, receiver) = flume::bounded(EVENTS_QUEUED_MAX);
    let subscription = Subscription {
        shared: Rc::clone(shared),
        bucket: bucket.clone(),
        key: key.clone(),
        stream,
        caller: caller.clone(),
        wire,
        left,
        events,
    };
    glommio::spawn_local(subscription.run(first)).detach();
    let mut response = Response::new(Body::stream(receiver));
    let headers = response.headers_mut();
    let media = if binary { api::RECORDS_MEDIA_TYPE } else { "text/event-stream" };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(api::STREAM_ID_HEADER, api::stream_id_header(stream));
    Ok(response)
}

struct Subscription {
    shared: Rc<Shared>,
    bucket: BucketName,
    key: StreamKey,
    /// The stream followed: once it is deleted, a stream created at its address is
    /// another, and the subscription ends with NotFound rather than follow that one.
    stream: StreamId,
    /// Checked again before each page: a revoked or expired token ends the subscription.
    caller: Caller,
    wire: Wire,
    left: Left,
    events: flume::Sender<Chunk>,
}

fn event(name: &str, id: Option<u64>, data: &Value) -> Bytes {
    let id = id.map(|id| format!("id: {id}\n")).unwrap_or_default();
    Bytes::from(format!("event: {name}\n{id}data: {data}\n\n"))
}

impl Subscription {
    /// Sends one event; false when the subscriber is gone.
    async fn send(&self, event: impl Into<Chunk>) -> bool {
        self.events.send_async(event.into()).await.is_ok()
    }

    /// Whether the subscription should end now: the node stops, or the client is gone.
    fn over(&self) -> bool {
        self.shared.stopping.is_set() || self.events.is_disconnected()
    }

    /// Waits until `bytes` of the shard's response memory would fit, sending a heartbeat
    /// with `tail` (the last the subscription saw) whenever it has sent nothing for the
    /// heartbeat interval. False when the subscription should end instead.
    async fn room_for(&self, bytes: u64, tail: Tail, last_event: &mut Instant) -> bool {
        use futures_lite::future::or;
        let heartbeat = heartbeat_due(self.shared.settings.heartbeat);
        loop {
            if self.over() {
                return false;
            }
            let due = heartbeat.saturating_sub(last_event.elapsed());
            let room = async {
                self.shared.responses.room_for(bytes).await;
                true
            };
            let stop = async {
                self.shared.stopping.wait().await;
                false
            };
            let beat = async {
                glommio::timer::sleep(due).await;
                false
            };
            if or(room, or(stop, beat)).await {
                return true;
            }
            if last_event.elapsed() >= heartbeat {
                if !self.send(self.heartbeat(tail)).await {
                    return false;
                }
                *last_event = Instant::now();
            }
        }
    }

    /// When the node stops (not the subscriber gone), says so with an `unavailable`
    /// error, so a subscriber tells a stop from a cut connection and resumes elsewhere
    /// or later from the last record it has, as it would from a cut.
    async fn stopped(&self) {
        if self.shared.stopping.is_set() && !self.events.is_disconnected() {
            let error = ApiError::from_code(
                engine::Code::Unavailable,
                "the server is stopping: resume after the last record delivered",
            );
            self.send(self.error(&error)).await;
        }
    }

    fn error(&self, error: &ApiError) -> Bytes {
        match self.wire {
            Wire::Sse(_) => event("error", None, &error.to_json()),
            Wire::Binary => {
                let mut out = Vec::new();
                framing::encode_error(&error.to_json().to_string(), &mut out);
                Bytes::from(out)
            }
        }
    }

    /// The page's records as one event (SSE) or as the records frames the page holds.
    fn records(&self, page: ReadReply) -> Result<Bytes, wire::Unwritable> {
        match self.wire {
            Wire::Sse(encoding) => {
                let records = wire::records_json(&page.frames, encoding)?;
                let last = page.next_seq_num.saturating_sub(1);
                let data = json!({"records": records, "tail": position(page.tail)});
                Ok(event("batch", Some(last), &data))
            }
            Wire::Binary => {
                // Closed by a page end, as a read's page is: it carries the tail, so the
                // subscriber can tell how far behind it is.
                let mut frames = page.frames;
                framing::encode_page_end(page.next_seq_num, page.tail, &mut frames);
                Ok(Bytes::from(frames))
            }
        }
    }

    fn heartbeat(&self, tail: Tail) -> Bytes {
        match self.wire {
            Wire::Sse(_) => event("ping", None, &json!({"tail": position(tail)})),
            Wire::Binary => {
                let mut out = Vec::with_capacity(21);
                framing::encode_heartbeat(tail, &mut out);
                Bytes::from(out)
            }
        }
    }

    fn end(&self, next_seq_num: u64, tail: Tail) -> Bytes {
        match self.wire {
            Wire::Sse(_) => {
                event("end", None, &json!({"next_seq_num": next_seq_num, "tail": position(tail)}))
            }
            Wire::Binary => {
                let mut out = Vec::with_capacity(5);
                framing::encode_end(&mut out);
                Bytes::from(out)
            }
        }
    }

    async fn run(mut self, first: ReadReply) {
        let heartbeat = heartbeat_due(self.shared.settings.heartbeat);
        let mut page = first;
        let mut last_event = Instant::now();
        // Cuts of the page being read again, since one was last delivered.
        let mut cuts = 0;
        loop {
            let (next_seq_num, tail, reached_until) =
                (page.next_seq_num, page.tail, page.reached_until);
            // Where the next read starts, the room it waits for first, and what it is cut
            // to (a page let go is read again cut to fit, or as the same records once
            // their bytes fit, however far the stream has grown since).
            let (mut resume, mut room, mut cut) = (next_seq_num, PAGE_BYTES_MIN, None);
            if page.record_count > 0 && !self.left.fits(&page) {
                // Past the page's byte budget only with its first record (stream.rs
                // `Leader::page`), so the page is that one record: the subscription ends
                // before it.
                debug_assert_eq!(page.record_count, 1, "only a page's first record overruns");
                let first_seq_num = next_seq_num - page.record_count;
                self.send(self.end(first_seq_num, tail)).await;
                return;
            }
            if page.record_count > 0 {
                let (first_seq_num, page_records, content) =
                    (next_seq_num - page.record_count, page.record_count, page.content_bytes);
                let mut left = self.left;
                left.take(&page);
                match self.records(page) {
                    Ok(records) => match self.shared.responses.try_hold(records.len() as u64) {
                        Some(hold) => {
                            (self.left, cuts) = (left, 0);
                            if !self.send(Chunk::held(records, hold)).await {
                                return;
                            }
                            last_event = Instant::now();
                        }
                        // Encoded, the page is larger than what is free (its cut counted
                        // content, or others took the room while it was read): it is let
                        // go and read again from where it began: cut to fit what is free
                        // now; or, with too little free, once at least the floor is; or,
                        // one record (or cut as often as cuts go), as itself once as much
                        // is free.
                        None => {
                            let bytes = records.len() as u64;
                            resume = first_seq_num;
                            match self.shared.responses.refit(page_records, content, bytes, cuts) {
                                Refit::Cut(fit) => cut = Some(fit),
                                Refit::Floor => {}
                                Refit::Whole => {
                                    // Slack for a tail of more digits in the page's JSON.
                                    room = bytes + 64;
                                    cut = Some(Cut { records: page_records, bytes: content });
                                }
                            }
                            cuts += 1;
                        }
                    },
                    // The page ends before the first record JSON cannot carry: it is read
                    // again, cut to the records before it; the page from it fails.
                    Err(wire::Unwritable { records_before, .. }) if records_before > 0 => {
                        resume = first_seq_num;
                        cut = Some(Cut { records: records_before, bytes: content });
                    }
                    Err(unwritable) => {
                        self.send(self.error(&unwritable.error)).await;
                        return;
                    }
                }
            }
            let delivered = resume == next_seq_num;
            if delivered && (reached_until || self.left.exhausted()) {
                self.send(self.end(next_seq_num, tail)).await;
                return;
            }
            if last_event.elapsed() >= heartbeat {
                if !self.send(self.heartbeat(tail)).await {
                    return;
                }
                last_event = Instant::now();
            }
            if !self.room_for(room, tail, &mut last_event).await {
                self.stopped().await;
                return;
            }
            // A stopping node answers a waiting read at once, so this wait never holds
            // up a graceful stop.
            let wait = heartbeat.saturating_sub(last_event.elapsed());
            let wait = Some(wait).filter(|w| !w.is_zero());
            let mut next = self.left.request(self.wire, ReadStart::SeqNum(resume), false, wait);
            // After the wait for room, at least that much is free (or nothing is held).
            next.limits.bytes = next.limits.bytes.min(self.shared.responses.available().max(room));
            if let Some(cut) = cut {
                next.limits.records = next.limits.records.min(cut.records);
                next.limits.bytes = next.limits.bytes.min(cut.bytes.max(1));
            }
            let read =
                self.shared.client.read_existing(&self.bucket, &self.key, self.stream, next).await;
            // The caller's token is checked again before anything read since goes out.
            let still = match &self.shared.auth {
                Some(auth) => auth.still_valid(&self.caller, api::now_ms()),
                None => Ok(()),
            };
            page = match (read, still) {
                (Ok(page), Ok(())) => page,
                (_, Err(error)) => {
                    self.send(self.error(&error)).await;
                    return;
                }
                (Err(error), Ok(())) => {
                    self.send(self.error(&ApiError::from_engine(&error))).await;
                    return;
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::heartbeat_due;

    #[test]
    fn a_heartbeat_is_due_before_its_interval_is_out() {
        assert_eq!(heartbeat_due(Duration::from_secs(15)), Duration::from_millis(14_750));
        assert_eq!(heartbeat_due(Duration::from_millis(200)), Duration::from_millis(180));
        assert_eq!(heartbeat_due(Duration::from_millis(100)), Duration::from_millis(90));
    }
}
