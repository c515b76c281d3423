//! Subscriptions over Server-Sent Events (streams.md "Subscriptions", decisions.md):
//! history from the start position, then every new record as it becomes durable, in
//! order, with no gap and no duplicate (each page starts at the last page's
//! `next_seq_num`).
//!
//! Events: `batch` (`id:` the last seq_num in it), `ping` with the tail when idle for the
//! heartbeat interval, `end` when a bound (`count`, `bytes`, `until`) is reached, `error`
//! (a deleted stream ends with not_found). `Last-Event-ID` resumes right after the
//! sequence number it names and wins over `seq_num`. A start past the tail is an
//! ordinary 416 before any event.
//!
//! Memory per subscriber is bounded: events go through a channel of
//! [`EVENTS_QUEUED_MAX`] events of at most one JSON page each; a subscriber that does not
//! read leaves the task waiting on the channel, not buffering.

use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use engine::names::{BucketName, StreamKey};
use engine::shard::{ReadReply, ReadRequest};
use engine::stream::ReadStart;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response};
use serde_json::{Value, json};

use crate::api::{self, Shared};
use crate::body::Body;
use crate::error::{ApiError, position};
use crate::wire::{self, Encoding};

/// Events queued for one subscriber before its task waits.
pub const EVENTS_QUEUED_MAX: usize = 4;

/// What is left of a subscription's bounds.
#[derive(Clone, Copy, Debug)]
struct Left {
    count: Option<u64>,
    bytes: Option<u64>,
    until: Option<u64>,
}

impl Left {
    fn exhausted(&self) -> bool {
        self.count == Some(0) || self.bytes == Some(0)
    }

    fn take(&mut self, page: &ReadReply) {
        self.count = self.count.map(|c| c.saturating_sub(page.record_count));
        self.bytes = self.bytes.map(|b| b.saturating_sub(page.content_bytes));
    }

    fn request(
        &self,
        start: ReadStart,
        clamp: bool,
        wait: Option<std::time::Duration>,
    ) -> ReadRequest {
        ReadRequest {
            start,
            clamp,
            limits: api::page_limits(self.count, self.bytes, self.until, false),
            wait,
        }
    }
}

pub async fn subscribe(
    shared: &Rc<Shared>,
    bucket: &BucketName,
    key: &StreamKey,
    request: &Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let encoding = api::encoding(request)?;
    let params = api::read_params(request)?;
    let resume = match request.headers().get("last-event-id") {
        None => None,
        Some(value) => Some(
            value.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()).ok_or_else(|| {
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
    let left = Left { count: params.count, bytes: params.bytes, until: params.until };
    // The first page is read before the response starts, so a start past the tail is an
    // ordinary HTTP error.
    let first = shared.client.read(bucket, key, left.request(start, params.clamp, None)).await?;
    let (events, receiver) = flume::bounded(EVENTS_QUEUED_MAX);
    let subscription = Subscription {
        shared: Rc::clone(shared),
        bucket: bucket.clone(),
        key: key.clone(),
        encoding,
        left,
        events,
    };
    glommio::spawn_local(subscription.run(first)).detach();
    let mut response = Response::new(Body::Stream(receiver.into_stream()));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

struct Subscription {
    shared: Rc<Shared>,
    bucket: BucketName,
    key: StreamKey,
    encoding: Encoding,
    left: Left,
    events: flume::Sender<Bytes>,
}

fn event(name: &str, id: Option<u64>, data: &Value) -> Bytes {
    let id = id.map(|id| format!("id: {id}\n")).unwrap_or_default();
    Bytes::from(format!("event: {name}\n{id}data: {data}\n\n"))
}

impl Subscription {
    /// Sends one event; false when the subscriber is gone.
    async fn send(&self, bytes: Bytes) -> bool {
        self.events.send_async(bytes).await.is_ok()
    }

    async fn run(mut self, first: ReadReply) {
        let heartbeat = self.shared.settings.heartbeat;
        let mut page = first;
        let mut last_event = Instant::now();
        loop {
            if page.record_count > 0 {
                let records = match wire::records_json(&page.frames, self.encoding) {
                    Ok(records) => records,
                    Err(error) => {
                        self.send(event("error", None, &error.to_json())).await;
                        return;
                    }
                };
                let last = page.next_seq_num.saturating_sub(1);
                let data = json!({"records": records, "tail": position(page.tail)});
                if !self.send(event("batch", Some(last), &data)).await {
                    return;
                }
                last_event = Instant::now();
                self.left.take(&page);
            }
            if page.reached_until || self.left.exhausted() {
                self.send(event(
                    "end",
                    None,
                    &json!({"next_seq_num": page.next_seq_num, "tail": position(page.tail)}),
                ))
                .await;
                return;
            }
            if last_event.elapsed() >= heartbeat {
                if !self.send(event("ping", None, &json!({"tail": position(page.tail)}))).await {
                    return;
                }
                last_event = Instant::now();
            }
            if self.shared.stopping.is_set() || self.events.is_disconnected() {
                return;
            }
            let wait = heartbeat.saturating_sub(last_event.elapsed()).min(api::WAIT_SLICE);
            let wait = Some(wait).filter(|w| !w.is_zero());
            let next = self.left.request(ReadStart::SeqNum(page.next_seq_num), false, wait);
            page = match self.shared.client.read(&self.bucket, &self.key, next).await {
                Ok(page) => page,
                Err(error) => {
                    self.send(event("error", None, &ApiError::from_engine(&error).to_json())).await;
                    return;
                }
            };
        }
    }
}
