//! A subscription as an iterator: history, then live records, heartbeats with the tail
//! when idle, and the end when a bound is reached (streams.md "Subscriptions"). Binary
//! framing by default (records frames sent as the chunk holds them), Server-Sent Events
//! on request. A deleted stream ends it with a not_found error.

use std::io::{self, BufRead};
use std::time::Duration;

use engine::framing::{self, Frame};
use serde_json::Value;

use super::http::{self, Server, Streaming};
use super::{
    Address, Error, Position, ReadOptions, Record, Result, StreamId, api_error_frame, push_records,
    read_failure, read_frame, records_from_json,
};

/// The `Accept` of a binary subscription (a plain binary `Accept` reads one page).
pub const SUBSCRIBE_MEDIA_TYPE: &str = "application/x-nova-records; subscribe=true";

/// What a subscription delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubscriptionEvent {
    /// Records in order, with the tail when they were read.
    Records { records: Vec<Record>, tail: Position },
    /// Nothing new for a while; the tail.
    Heartbeat { tail: Position },
}

/// An open subscription; iterate it. It ends (None) after a bound is reached; an error is
/// the last item.
pub struct Subscription {
    stream: Streaming,
    sse: bool,
    frame: Vec<u8>,
    /// The records of a binary page read so far, until its page end.
    page: Vec<Record>,
    /// The frame bytes of `page`, held to [`http::RESPONSE_BODY_BYTES_MAX`].
    page_bytes: u64,
    done: bool,
    /// The seq_num after the last record delivered: where to resume.
    next_seq_num: Option<u64>,
    /// The stream followed, as the server named it.
    stream_id: Option<StreamId>,
}

impl Subscription {
    pub(super) fn open(
        server: &Server,
        address: &Address,
        options: &ReadOptions,
        sse: bool,
        resume_after: Option<u64>,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let options = ReadOptions { wait_seconds: None, ..*options };
        let path = format!("{}/records?{}", address.path(), options.query());
        let accept = if sse { "text/event-stream" } else { SUBSCRIBE_MEDIA_TYPE };
        let resume = resume_after.map(|n| n.to_string());
        let mut headers = vec![("accept", accept)];
        if sse {
            // SSE bytes are text: ask for base64 so any record reads back exactly.
            headers.push(("nova-encoding", "base64"));
        }
        if let Some(resume) = &resume {
            headers.push(("last-event-id", resume));
        }
        let stream =
            http::open(server, "GET", &path, &headers, None, timeout).map_err(|error| {
                read_failure(format!("subscribe to {address} on {}", server.authority), error)
            })?;
        if stream.status != 200 {
            let response = stream
                .finish()
                .map_err(|error| read_failure(format!("subscribe to {address}"), error))?;
            return Err(Error::from_response(&response));
        }
        let stream_id = stream.header(crate::api::STREAM_ID_HEADER).and_then(StreamId::from_hex);
        Ok(Self {
            stream_id,
            stream,
            sse,
            frame: Vec::new(),
            page: Vec::new(),
            page_bytes: 0,
            done: false,
            next_seq_num: None,
        })
    }

    /// Whether it comes as Server-Sent Events (JSON), not in the binary framing.
    pub fn over_sse(&self) -> bool {
        self.sse
    }

    /// The sequence number after the last record delivered (resume with
    /// [`super::Client::resume`] from one before it).
    pub fn next_seq_num(&self) -> Option<u64> {
        self.next_seq_num
    }

    /// The stream followed: resume with it as [`ReadOptions::stream_id`] to stay on it,
    /// never on a stream created at its address since.
    pub fn stream_id(&self) -> Option<StreamId> {
        self.stream_id
    }

    fn next_binary(&mut self) -> Result<Option<SubscriptionEvent>> {
        loop {
            let more = read_frame(&mut self.stream.body, &mut self.frame)
                .map_err(|error| read_failure("read a subscription".into(), error))?;
            if !more {
                return Err(ended_early("frame"));
            }
            let (frame, _) = framing::decode_frame(&self.frame)
                .map_err(|e| Error::Protocol(format!("a subscription frame is corrupt: {e}")))?
                .ok_or_else(|| Error::Protocol("a subscription frame is cut short".into()))?;
            return match frame {
                // A page's records frames, then its page end with the tail.
                Frame::Records(run) => {
                    self.page_bytes += self.frame.len() as u64;
                    if self.page_bytes > http::RESPONSE_BODY_BYTES_MAX {
                        return Err(Error::Protocol(format!(
                            "a subscription page of more than {} bytes",
                            http::RESPONSE_BODY_BYTES_MAX
                        )));
                    }
                    push_records(&run, &mut self.page)?;
                    continue;
                }
                Frame::PageEnd { next_seq_num, tail } => {
                    self.page_bytes = 0;
                    if self.page.is_empty() {
                        continue;
                    }
                    self.next_seq_num = Some(next_seq_num);
                    Ok(Some(SubscriptionEvent::Records {
                        records: std::mem::take(&mut self.page),
                        tail: Position { seq_num: tail.seq_num, timestamp: tail.timestamp },
                    }))
                }
                Frame::Heartbeat(tail) => Ok(Some(SubscriptionEvent::Heartbeat {
                    tail: Position { seq_num: tail.seq_num, timestamp: tail.timestamp },
                })),
                Frame::End => Ok(None),
                Frame::Error(text) => Err(api_error_frame(text)),
                Frame::Ack { .. } => {
                    Err(Error::Protocol("a subscription sent an append session's ack".into()))
                }
            };
        }
    }

    fn next_sse(&mut self) -> Result<Option<SubscriptionEvent>> {
        loop {
            let body: &mut dyn BufRead = &mut self.stream.body;
            let event = http::next_event(body)
                .map_err(|error| read_failure("read a subscription".into(), error))?
                .ok_or_else(|| ended_early("event"))?;
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            return match event.event.as_str() {
                "batch" => {
                    let records = records_from_json(&data)?;
                    if let Some(last) = records.last() {
                        let next = last.seq_num.checked_add(1).ok_or_else(|| {
                            Error::Protocol(format!("a record numbered {}", last.seq_num))
                        })?;
                        self.next_seq_num = Some(next);
                    }
                    Ok(Some(SubscriptionEvent::Records {
                        records,
                        tail: Position::from_json(&data["tail"])?,
                    }))
                }
                "ping" => Ok(Some(SubscriptionEvent::Heartbeat {
                    tail: Position::from_json(&data["tail"])?,
                })),
                "end" => Ok(None),
                "error" => Err(api_error_frame(&event.data)),
                _ => continue,
            };
        }
    }
}

impl Iterator for Subscription {
    type Item = Result<SubscriptionEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = if self.sse { self.next_sse() } else { self.next_binary() };
        match next {
            Ok(Some(event)) => Some(Ok(event)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(error) => {
                self.done = true;
                Some(Err(error))
            }
        }
    }
}

/// The connection closed before the subscription's end: a failure of the connection
/// (the server stopped, or a proxy cut it), which a caller may resume from
/// [`Subscription::next_seq_num`].
fn ended_early(what: &str) -> Error {
    Error::Io {
        what: "read a subscription".into(),
        error: io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the connection closed before the subscription's end {what}"),
        ),
    }
}
