//! Append sessions: one append request (`Content-Type: application/x-nova-records;
//! session=true`) whose body is a stream of batches, each its `u32` length and then an
//! append body in the binary framing, and whose answer is a stream of frames: an ack
//! frame per batch, in order, then an end frame once the body has ended, or an error
//! frame that ends it (`docs/format.md`, "Append sessions").
//!
//! A session is how one producer keeps many batches in flight on one connection: HTTP/1.1
//! answers a connection's requests one at a time, so pipelined requests are acknowledged
//! one acknowledgement latency apart, while a session's batches become durable together
//! (producers.md: a producer may pipeline, and one connection's appends are acknowledged
//! in order).
//!
//! Two tasks serve a session. The reader takes the body apart, and hands each batch to
//! the stream's leader, waiting only until the leader has sequenced it
//! (`Client::append_sequenced`) before taking the next: its batches take their places
//! in the order they came. The acker waits for each batch to be durable, in that order,
//! and writes its ack. A batch refused (a limit, a condition, a fencing token, a framing
//! error) ends the session: the reader takes nothing after it, the acker writes the
//! acks of the batches before it and then the error frame, so a producer knows that
//! every batch after its last ack did not land (or, for an error whose outcome is
//! unknown, `internal` or `unavailable`, may not have).
//!
//! Bounds: at most `--http-session-in-flight-max` batches sequenced and not yet
//! acknowledged (the reader then waits, and TCP slows the producer); a batch's bytes are
//! held in the shard's body memory as they arrive (a session with batches in flight
//! waits for their acks to give theirs back rather than be refused) until it is
//! acknowledged; acks queue in a channel of [`ACK_CHUNKS_QUEUED_MAX`] chunks, so a
//! producer that stops reading them stops its session, not the shard. A batch's length
//! is refused past `--http-body-bytes-max`, as a single append's body is. Inside a batch,
//! bytes that stop coming for `--http-idle-timeout-ms` end the session with an error.
//! Between batches a session may wait as long as its producer likes (one that appends
//! now and then): the server never ends it there, since a batch on its way as it did
//! would meet an ended session. Like a subscription it holds its connection meanwhile,
//! within `--http-connections-max`, and a peer that vanished is found by TCP keepalive
//! (`server.rs`). A node that stops ends every session after the batches it has
//! sequenced are acknowledged, with `unavailable`.

use std::cell::Cell;
use std::rc::Rc;

use bytes::Bytes;
use engine::framing::{self, FramedBody};
use engine::ids::StreamId;
use engine::names::{BucketName, StreamKey};
use engine::node::PendingAck;
use engine::notify::Notify;
use engine::shard::AppendRequest;
use futures_lite::future::or;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response};

use crate::api::{self, BodyMemory, Shared};
use crate::arrived::Arrived;
use crate::auth::Caller;
use crate::body::{Body, Chunk};
use crate::error::ApiError;

/// The request's `Content-Type` parameter that makes an append a session (and the
/// answer's).
pub const SESSION_PARAM: &str = "session=true";
/// Chunks of acks queued for a session's client before its acker waits.
pub const ACK_CHUNKS_QUEUED_MAX: usize = 4;

/// Whether the request's `Content-Type` is the binary framing with `session=true`.
pub fn is_session(request: &Request<Incoming>) -> bool {
    let value = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    value.is_some_and(|media| api::is_records_with(media, SESSION_PARAM))
}

/// Starts a session on the request: its answer (200, the frames streamed) at once.
pub fn open(
    shared: &Rc<Shared>,
    caller: &Caller,
    bucket: &BucketName,
    key: &StreamKey,
    request: Request<Incoming>,
) -> Response<Body> {
    let in_flight_max = usize::try_from(shared.settings.session_in_flight_max).unwrap_or(1).max(1);
    // The batches in flight and the error that may end them.
    let (pending, in_order) = flume::bounded(in_flight_max + 1);
    let (chunks, answer) = flume::bounded(ACK_CHUNKS_QUEUED_MAX);
    let state = Rc::new(State::default());
    let reader = Reader {
        shared: Rc::clone(shared),
        caller: caller.clone(),
        bucket: bucket.clone(),
        key: key.clone(),
        stream: None,
        body: request.into_body(),
        arrived: Arrived::default(),
        pending,
        state: Rc::clone(&state),
    };
    glommio::spawn_local(reader.run()).detach();
    glommio::spawn_local(acknowledge(Rc::clone(shared), in_order, chunks, state)).detach();
    let mut response = Response::new(Body::stream(answer));
    let media = format!("{}; {SESSION_PARAM}", api::RECORDS_MEDIA_TYPE);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(&media).expect("ASCII"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// What the reader hands the acker, in the session's order.
enum Pending {
    /// A sequenced batch, and the body memory its bytes hold until it is acknowledged.
    Batch(PendingAck, BodyMemory),
    /// Why the session ends here: nothing after it was taken.
    Refused(ApiError),
}

/// What the session's two tasks share.
#[derive(Default)]
struct State {
    /// Batches sequenced and not yet acknowledged.
    in_flight: Cell<usize>,
    /// The acker has finished (the answer is over): the reader stops.
    over: Cell<bool>,
    /// Moves when a batch is acknowledged or the acker finishes.
    changed: Notify,
}

impl State {
    /// Waits for the state to move past `seen`; `Stop::Over` once the session is over
    /// or the node stops.
    async fn wait(&self, shared: &Shared, seen: u64) -> Result<(), Stop> {
        if !self.over.get() && !shared.stopping.is_set() {
            or(self.changed.changed(seen), shared.stopping.wait()).await;
        }
        if self.over.get() || shared.stopping.is_set() {
            return Err(Stop::Over);
        }
        Ok(())
    }

    fn acknowledged(&self) {
        self.in_flight.set(self.in_flight.get() - 1);
        self.changed.notify();
    }
}

/// The acker's end, however it comes: the reader learns the session is over.
struct Over(Rc<State>);

impl Drop for Over {
    fn drop(&mut self) {
        self.0.over.set(true);
        self.0.changed.notify();
    }
}

/// The next batch's length prefix, taken. `arrived.len() >= 4`.
fn take_prefix(arrived: &mut Arrived) -> u32 {
    let mut prefix = [0u8; 4];
    let mut at = 0;
    for piece in arrived.take(4) {
        prefix[at..at + piece.len()].copy_from_slice(&piece);
        at += piece.len();
    }
    u32::from_le_bytes(prefix)
}

/// Why the reader stopped filling its buffer.
enum Stop {
    /// The body ended.
    Ended,
    /// The session is over (the acker finished) or the node stops.
    Over,
    /// The session ends with this error.
    Refused(ApiError),
}

struct Reader {
    shared: Rc<Shared>,
    /// Who opened the session: their token is checked again before each batch.
    caller: Caller,
    bucket: BucketName,
    key: StreamKey,
    /// The stream the first batch went to: every later one goes there or nowhere.
    stream: Option<StreamId>,
    body: Incoming,
    arrived: Arrived,
    pending: flume::Sender<Pending>,
    state: Rc<State>,
}

impl Reader {
    async fn run(mut self) {
        let end = self.batches().await;
        if let Some(error) = end {
            // Queued behind every batch taken, so their acks go first.
            let _ = self.pending.send_async(Pending::Refused(error)).await;
        }
    }

    /// Takes batches until the body ends (None) or the session ends with an error.
    async fn batches(&mut self) -> Option<ApiError> {
        let limit = self.shared.append_body_limit();
        for batch in 0u64.. {
            if self.shared.stopping.is_set() {
                return self.stopping();
            }
            match self.fill(4, None).await {
                Ok(()) => {}
                Err(Stop::Ended) if self.arrived.is_empty() => return None,
                Err(Stop::Ended) => return Some(cut_short(batch)),
                Err(stop @ (Stop::Over | Stop::Refused(_))) => return self.stopped(stop, batch),
            }
            let len = take_prefix(&mut self.arrived);
            if u64::from(len) > limit.bytes {
                return Some(ApiError::invalid(format!(
                    "batch {batch} of the session is {len} bytes, over the limit of {} bytes \
                     ({})",
                    limit.bytes, limit.name
                )));
            }
            let mut memory = self.shared.body_memory();
            if let Err(stop) = self.fill(len as usize, Some(&mut memory)).await {
                return self.stopped(stop, batch);
            }
            if let Err(stop) = self.room().await {
                return self.stopped(stop, batch);
            }
            let framed = FramedBody::from_pieces(self.arrived.take(len as usize));
            // A token revoked or expired since the session opened takes no more batches.
            if let Some(auth) = &self.shared.auth
                && let Err(error) = auth.still_valid(&self.caller, api::now_ms())
            {
                return Some(error);
            }
            let request = AppendRequest { framed, offered: None };
            let (bucket, key) = (&self.bucket, &self.key);
            match self.shared.client.append_sequenced(bucket, key, self.stream, request).await {
                Ok((stream, ack)) => {
                    self.stream = Some(stream);
                    self.state.in_flight.set(self.state.in_flight.get() + 1);
                    if self.pending.send_async(Pending::Batch(ack, memory)).await.is_err() {
                        return None;
                    }
                }
                Err(error) => return Some(ApiError::from(error)),
            }
        }
        None
    }

    /// Waits until fewer than `--http-session-in-flight-max` batches of the session are
    /// sequenced and unacknowledged; `Stop::Over` once the session is over or the node
    /// stops, even with room (a batch whose bytes were all buffered must not be
    /// appended after the answer has ended).
    async fn room(&self) -> Result<(), Stop> {
        let max = usize::try_from(self.shared.settings.session_in_flight_max).unwrap_or(usize::MAX);
        loop {
            let seen = self.state.changed.generation();
            if self.state.over.get() || self.shared.stopping.is_set() {
                return Err(Stop::Over);
            }
            if self.state.in_flight.get() < max {
                return Ok(());
            }
            self.state.wait(&self.shared, seen).await?;
        }
    }

    /// Why the session ends once the reader stopped inside batch `batch`.
    fn stopped(&self, stop: Stop, batch: u64) -> Option<ApiError> {
        match stop {
            Stop::Ended => Some(cut_short(batch)),
            Stop::Over => self.stopping(),
            Stop::Refused(mut error) => {
                error.message = format!("batch {batch} of the session: {}", error.message);
                Some(error)
            }
        }
    }

    /// The node stops (unavailable: the producer goes on elsewhere), or the acker has
    /// already ended the session (nothing more to say).
    fn stopping(&self) -> Option<ApiError> {
        self.shared.stopping.is_set().then(|| {
            let mut error = ApiError::from_code(
                engine::Code::Unavailable,
                "the server is stopping: batches of the session after the last acknowledged \
                 one were not appended",
            );
            // Unlike most `unavailable` answers, this one knows: nothing after was taken.
            error.details.insert("not_appended".into(), true.into());
            error
        })
    }

    /// Reads until `n` bytes have arrived. With `memory` they belong to a batch begun:
    /// each byte of it is held in the shard's body memory as it arrives, and a pause of
    /// `--http-idle-timeout-ms` refuses it. Between batches the body may wait for good.
    async fn fill(&mut self, n: usize, mut memory: Option<&mut BodyMemory>) -> Result<(), Stop> {
        enum Event {
            Frame(Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>),
            Stalled,
            Moved,
        }
        let Reader { shared, body, arrived, state, .. } = self;
        let idle = shared.settings.idle_timeout;
        loop {
            if let Some(memory) = memory.as_deref_mut() {
                let due = arrived.len().min(n) as u64 - memory.bytes();
                if due > 0 {
                    hold(shared, state, due, memory).await?;
                }
            }
            if arrived.len() >= n {
                return Ok(());
            }
            if state.over.get() || shared.stopping.is_set() {
                return Err(Stop::Over);
            }
            let seen = state.changed.generation();
            let begun = memory.is_some() || !arrived.is_empty();
            let frame = async { Event::Frame(body.frame().await) };
            let stalled = async {
                if !begun {
                    std::future::pending::<()>().await;
                }
                glommio::timer::sleep(idle).await;
                Event::Stalled
            };
            let moved = async {
                state.wait(shared, seen).await.ok();
                Event::Moved
            };
            match or(frame, or(stalled, moved)).await {
                Event::Moved => {}
                Event::Stalled => {
                    return Err(Stop::Refused(ApiError::invalid(format!(
                        "its bytes stalled: none for {} ms (--http-idle-timeout-ms)",
                        idle.as_millis()
                    ))));
                }
                Event::Frame(None) => return Err(Stop::Ended),
                // Trailers, the only other kind of frame, carry nothing nova reads.
                Event::Frame(Some(Ok(frame))) => {
                    if let Ok(piece) = frame.into_data() {
                        arrived.push(piece);
                    }
                }
                // Between batches, a body that fails is a client gone: nothing is lost.
                Event::Frame(Some(Err(_))) if !begun => return Err(Stop::Ended),
                Event::Frame(Some(Err(error))) => {
                    return Err(Stop::Refused(ApiError::invalid(format!(
                        "reading it failed: {error}"
                    ))));
                }
            }
        }
    }
}

/// `bytes` more of the shard's body memory for a batch's `memory`: waits while batches
/// of the session are in flight (their acks give theirs back), refuses otherwise.
async fn hold(
    shared: &Shared,
    state: &State,
    bytes: u64,
    memory: &mut BodyMemory,
) -> Result<(), Stop> {
    loop {
        let seen = state.changed.generation();
        match shared.hold_body(bytes, memory) {
            Ok(()) => return Ok(()),
            Err(error) if state.in_flight.get() == 0 => return Err(Stop::Refused(error)),
            Err(_) => state.wait(shared, seen).await?,
        }
    }
}

fn cut_short(batch: u64) -> ApiError {
    ApiError::invalid(format!("the session's body ended inside batch {batch}"))
}

/// Writes the acks of the reader's batches in order, then the end frame, or the error
/// frame that ends the session.
async fn acknowledge(
    shared: Rc<Shared>,
    in_order: flume::Receiver<Pending>,
    chunks: flume::Sender<Chunk>,
    state: Rc<State>,
) {
    let _over = Over(Rc::clone(&state));
    let mut out = Vec::new();
    loop {
        let next = match in_order.try_recv() {
            Ok(next) => next,
            Err(flume::TryRecvError::Empty) => {
                // Whatever is ready goes out before waiting for more.
                if !flush(&chunks, &mut out).await {
                    return;
                }
                match in_order.recv_async().await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            }
            Err(flume::TryRecvError::Disconnected) => break,
        };
        let result = match next {
            Pending::Batch(ack, memory) => {
                let mut durable = std::pin::pin!(ack.durable());
                let result = match futures_lite::future::poll_once(&mut durable).await {
                    Some(result) => result,
                    None => {
                        if !flush(&chunks, &mut out).await {
                            return;
                        }
                        durable.await
                    }
                };
                drop(memory);
                state.acknowledged();
                result.map_err(ApiError::from)
            }
            Pending::Refused(error) => Err(error),
        };
        let status = result.as_ref().map_or_else(|error| error.status.as_u16(), |_| 200);
        shared.metrics.session_outcome(shared.shard, status);
        match result {
            Ok(ack) => framing::encode_ack(ack.start, ack.end, ack.tail, &mut out),
            Err(error) => {
                framing::encode_error(&error_json(&error), &mut out);
                flush(&chunks, &mut out).await;
                return;
            }
        }
    }
    // The body ended and every batch is acknowledged.
    framing::encode_end(&mut out);
    flush(&chunks, &mut out).await;
}

/// The error frame's JSON: the API's error object, with `retry_after_seconds` where the
/// answer to a single append would carry `Retry-After`.
fn error_json(error: &ApiError) -> String {
    let mut json = error.to_json();
    if let (Some(seconds), Some(object)) = (error.retry_after_seconds, json.as_object_mut()) {
        object.insert("retry_after_seconds".into(), seconds.into());
    }
    json.to_string()
}

/// Sends what `out` holds; false when the client is gone.
async fn flush(chunks: &flume::Sender<Chunk>, out: &mut Vec<u8>) -> bool {
    if out.is_empty() {
        return !chunks.is_disconnected();
    }
    let bytes = Bytes::from(std::mem::take(out));
    chunks.send_async(Chunk::from(bytes)).await.is_ok()
}
