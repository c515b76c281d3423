//! An append session: batches for one stream on one connection, acknowledged in order
//! (producers.md: "appends to one stream from one connection are acknowledged in
//! order"; a producer may pipeline).
//!
//! In the binary framing (the default) a session is one streamed request (`docs/api.md`,
//! "Append sessions"): each batch goes out as soon as it is submitted, the server
//! sequences them in order and acknowledges each once durable, and every batch in flight
//! becomes durable together, so one session carries what it has in flight per
//! acknowledgement latency. In JSON it is a request per batch, pipelined on one
//! keep-alive connection, which the server answers one at a time.
//!
//! The caller's thread encodes each batch into a buffer and hands it to a writer thread,
//! which writes whatever is queued and flushes when the queue is empty; a reader thread
//! reads the answers in order. At most `in_flight_max` batches are unacknowledged:
//! [`AppendSession::submit`] waits for an acknowledgement beyond that. Buffers go back
//! to the caller for reuse, so a steady session allocates nothing per batch.
//!
//! A streamed session ends at a batch the server refuses: that batch's answer is the
//! error, and every batch submitted after it is answered with the same error code (its
//! message says which batch was refused), because the server took none of them; the
//! next [`AppendSession::submit`] after those answers starts a new request. An error
//! whose outcome is unknown ([`Error::outcome_unknown`]) is passed on to the batches
//! behind it the same way, as unknown.
//!
//! A session never resends: when its connection fails, every batch in flight is answered
//! with [`Error::Io`] ([`Error::Protocol`] when what it read was not an answer the API
//! gives; either way it may or may not have landed) and the session is closed; open a
//! new one, and use `match_seq_num` to make the resend land once. A connection the
//! server closed with nothing in flight (a JSON one idle past its
//! `--http-idle-timeout-ms`; a streamed session at its stop, or with the server gone)
//! loses nothing: the next batch goes on a new one. A streamed session is never ended by
//! the server for being idle, so a producer that appends now and then keeps it.

use std::collections::VecDeque;
use std::io::{BufReader, BufWriter, Write as _};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use engine::framing::{self, Frame};

use super::http::{self, ChunkedBody, Server};
use super::{
    Ack, Address, ApiError, Batch, Conditions, Error, Format, Position, Result, api_error_frame,
    read_frame,
};

/// A streamed session's answer: its head not read yet.
const HEAD_PENDING: u8 = 0;
/// Its head read: the frames are coming.
const ANSWERING: u8 = 1;
/// Its head never came, or was an error answer: the session never began.
const HEAD_FAILED: u8 = 2;
/// Bytes of it came behind the last ack read (an error or an end frame, when no batch
/// is in flight): the server has ended the session.
const MORE_CAME: u8 = 3;

/// A streamed session's request `Content-Type` (the server's `append_session.rs`).
const SESSION_MEDIA_TYPE: &str = "application/x-nova-records; session=true";

/// One acknowledgement, in submission order.
#[derive(Debug)]
pub struct SessionAck {
    /// What [`AppendSession::submit`] returned for the batch.
    pub ticket: u64,
    pub result: Result<Ack>,
    /// From `submit` to the answer's arrival on the reader thread.
    pub latency: Duration,
}

/// Batches pipelined on one connection; see the module docs.
pub struct AppendSession {
    /// The batch before which the server ended the streamed request (refused it): the
    /// batches in flight are behind it, and the next submit starts a new request.
    ended: bool,
    path: String,
    server: Server,
    timeout: Option<Duration>,
    in_flight_max: usize,
    in_flight: usize,
    next_ticket: u64,
    ready: VecDeque<SessionAck>,
    connection: Connection,
    /// An answer was lost on this connection: the session stays closed (module docs).
    failed: bool,
}

/// A session's connection and the two threads that write to it and read from it.
struct Connection {
    format: Format,
    requests: Option<SyncSender<Vec<u8>>>,
    sent: Option<Sender<(u64, Instant)>>,
    acks: Receiver<SessionAck>,
    spare: Receiver<Vec<u8>>,
    stream: TcpStream,
    writer: Option<JoinHandle<()>>,
    reader: Option<JoinHandle<()>>,
    /// Nothing is in flight: the writer is not stuck on a server that stopped reading,
    /// so the connection is closed in order (the last chunk of a streamed request sent
    /// before the socket is shut).
    idle: bool,
    /// Where a streamed session's answer is ([`HEAD_PENDING`], [`ANSWERING`],
    /// [`HEAD_FAILED`], [`MORE_CAME`]): once it has begun (its head read), with nothing
    /// in flight, any byte that came behind the last ack (an end or an error frame) or
    /// the connection's end means the session is over; a head that failed means it
    /// never began.
    answer: Arc<AtomicU8>,
}

impl Connection {
    /// A connection for `format`'s batches to `path`: for the binary framing, the
    /// session's request head is written at once.
    fn open(
        server: &Server,
        path: &str,
        format: Format,
        in_flight_max: usize,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let io_error =
            |error| Error::Io { what: format!("connect to {}", server.authority), error };
        let mut stream = http::connect(server, timeout).map_err(io_error)?;
        if format == Format::Binary {
            let mut head = Vec::with_capacity(256);
            let headers = [("content-type", SESSION_MEDIA_TYPE), ("transfer-encoding", "chunked")];
            http::encode_head(&mut head, "POST", path, server, &headers, None);
            stream.write_all(&head).map_err(io_error)?;
        }
        stream.set_nodelay(true).map_err(io_error)?;
        // Socket options: the halves below share them. The reader reads only while a
        // batch is in flight, so an idle session never times out.
        stream.set_read_timeout(timeout).map_err(io_error)?;
        stream.set_write_timeout(timeout).map_err(io_error)?;
        let write_half = stream.try_clone().map_err(io_error)?;
        let read_half = stream.try_clone().map_err(io_error)?;
        let (requests, requests_rx) = mpsc::sync_channel::<Vec<u8>>(in_flight_max);
        let (spare_tx, spare) = mpsc::sync_channel::<Vec<u8>>(in_flight_max);
        let (sent, sent_rx) = mpsc::channel::<(u64, Instant)>();
        let (acks_tx, acks) = mpsc::channel::<SessionAck>();
        let answer = Arc::new(AtomicU8::new(HEAD_PENDING));
        let reading = Arc::clone(&answer);
        // A streamed request's body ends with the last chunk.
        let last: &'static [u8] = if format == Format::Binary { b"0\r\n\r\n" } else { b"" };
        let writer = std::thread::Builder::new()
            .name("nova-append-writer".into())
            .spawn(move || write_loop(write_half, &requests_rx, &spare_tx, last))
            .map_err(|error| Error::Io { what: "start the writer thread".into(), error })?;
        let reader = std::thread::Builder::new()
            .name("nova-append-reader".into())
            .spawn(move || match format {
                Format::Binary => read_stream(read_half, &sent_rx, &acks_tx, &reading),
                Format::Json => read_loop(read_half, &sent_rx, &acks_tx),
            })
            .map_err(|error| Error::Io { what: "start the reader thread".into(), error })?;
        Ok(Connection {
            requests: Some(requests),
            sent: Some(sent),
            acks,
            spare,
            stream,
            writer: Some(writer),
            reader: Some(reader),
            idle: false,
            answer,
            format,
        })
    }

    /// Whether the server has closed the connection (it closes a JSON one idle for its
    /// `--http-idle-timeout-ms`), or ended the streamed session on it, seen without
    /// waiting. Asked only with nothing in flight, when no answer is due and the reader
    /// thread is not reading; for a streamed session, once its answer has begun (before
    /// that, the bytes waiting are its head).
    fn closed_by_server(&self) -> bool {
        if self.format == Format::Binary {
            match self.answer.load(Ordering::Acquire) {
                ANSWERING => {}
                HEAD_FAILED | MORE_CAME => return true,
                _ => return false,
            }
        }
        let mut probe = [0u8; 1];
        // SAFETY: recv(2) into a live one-byte buffer, on a socket this session owns;
        // MSG_PEEK leaves the byte where it is, MSG_DONTWAIT never blocks.
        let read = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                probe.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        // 0: the server's end of stream; a byte: something no request asked for; an
        // error other than "nothing yet": the connection is gone.
        read >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Closing the channels ends the writer (after its last chunk) and the reader;
        // shutting the socket ends either when it waits on the server.
        self.requests = None;
        self.sent = None;
        if self.idle
            && let Some(writer) = self.writer.take()
        {
            let _ = writer.join();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        for thread in [self.writer.take(), self.reader.take()].into_iter().flatten() {
            let _ = thread.join();
        }
    }
}

impl Drop for AppendSession {
    fn drop(&mut self) {
        self.connection.idle = self.in_flight == 0;
    }
}

impl AppendSession {
    pub(super) fn open(
        server: &Server,
        address: &Address,
        format: Format,
        in_flight_max: usize,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let in_flight_max = in_flight_max.max(1);
        let path = format!("{}/records", address.path());
        Ok(Self {
            connection: Connection::open(server, &path, format, in_flight_max, timeout)?,
            ended: false,
            path,
            server: server.clone(),
            timeout,
            in_flight_max,
            in_flight: 0,
            next_ticket: 0,
            ready: VecDeque::new(),
            failed: false,
        })
    }

    /// Sends a batch; its ticket (0, 1, 2, ... in submission order). Waits while
    /// `in_flight_max` batches are unacknowledged. Refuses a batch only for the caller's
    /// own mistake (an empty batch, a fencing token over 36 bytes).
    pub fn submit(&mut self, batch: &Batch, conditions: &Conditions) -> Result<u64> {
        if batch.is_empty() {
            return Err(Error::Invalid("a batch needs at least one record".into()));
        }
        if self.failed {
            // Its connection failed (module docs): open a new session.
            return Err(closed());
        }
        while self.in_flight >= self.in_flight_max {
            let ack = self.connection.acks.recv().map_err(|_| closed())?;
            self.arrived(&ack);
            self.ready.push_back(ack);
        }
        // Answers that have come count before the checks below.
        while let Ok(ack) = self.connection.acks.try_recv() {
            self.arrived(&ack);
            self.ready.push_back(ack);
        }
        if self.ended {
            // Every batch still in flight is behind the one the server ended the request
            // at: their answers, copies of its error, are on their way.
            self.wait_for_all();
            self.reopen()?;
        } else if self.in_flight == 0 && self.connection.closed_by_server() {
            // Nothing was in flight on it, so nothing is lost: go on on a new connection
            // (a JSON one the server closed idle; a streamed session it ended at its stop,
            // or a connection gone with a server that died).
            self.reopen()?;
        }
        let mut buffer = self.connection.spare.try_recv().unwrap_or_default();
        buffer.clear();
        match self.connection.format {
            Format::Binary => {
                // One chunk of the request body: the batch's length, then the batch.
                let len = batch.framed_len(conditions);
                let prefix = framing::session_batch_prefix(len)
                    .map_err(|e| Error::Invalid(format!("a batch too large to frame: {e}")))?;
                buffer.extend_from_slice(format!("{:x}\r\n", prefix.len() + len).as_bytes());
                buffer.extend_from_slice(&prefix);
                batch.write_framed(conditions, &mut buffer)?;
                buffer.extend_from_slice(b"\r\n");
            }
            Format::Json => {
                let (body, base64) = batch.to_json(conditions)?;
                let mut headers = vec![("content-type", "application/json")];
                if base64 {
                    headers.push(("nova-encoding", "base64"));
                }
                http::encode_head(
                    &mut buffer,
                    "POST",
                    &self.path,
                    &self.server,
                    &headers,
                    Some(body.len()),
                );
                buffer.extend_from_slice(&body);
            }
        }
        let ticket = self.next_ticket;
        // The reader answers every ticket sent here, with an error once the connection
        // is gone, so the count below always comes back down.
        self.connection
            .sent
            .as_ref()
            .ok_or_else(closed)?
            .send((ticket, Instant::now()))
            .map_err(|_| closed())?;
        self.next_ticket += 1;
        self.in_flight += 1;
        if let Some(requests) = &self.connection.requests {
            // A writer that stopped (the connection failed) drops the request; the reader
            // answers it with the failure.
            let _ = requests.send(buffer);
        }
        Ok(ticket)
    }

    /// An acknowledgement came off the connection.
    fn arrived(&mut self, ack: &SessionAck) {
        self.in_flight -= 1;
        match &ack.result {
            // The connection failed, or its answer broke the protocol: either way it is
            // done.
            Err(Error::Io { .. } | Error::Protocol(_)) => self.failed = true,
            Err(_) if self.connection.format == Format::Binary => self.ended = true,
            _ => {}
        }
    }

    /// Moves every acknowledgement still due into `ready`.
    fn wait_for_all(&mut self) {
        while self.in_flight > 0 {
            let Ok(ack) = self.connection.acks.recv() else { return };
            self.arrived(&ack);
            self.ready.push_back(ack);
        }
    }

    /// A new connection (and, in the binary framing, a new request) for what comes next.
    /// Nothing is in flight on the last one.
    fn reopen(&mut self) -> Result<()> {
        let connection = &mut self.connection;
        connection.idle = true;
        *connection = Connection::open(
            &self.server,
            &self.path,
            connection.format,
            self.in_flight_max,
            self.timeout,
        )?;
        self.ended = false;
        Ok(())
    }

    /// Batches sent and not yet returned by [`AppendSession::recv`].
    pub fn pending(&self) -> usize {
        self.in_flight + self.ready.len()
    }

    /// The next acknowledgement in order, waiting for it; None when nothing is pending.
    pub fn recv(&mut self) -> Option<SessionAck> {
        if let Some(ack) = self.ready.pop_front() {
            return Some(ack);
        }
        if self.in_flight == 0 {
            return None;
        }
        let ack = self.connection.acks.recv().ok()?;
        self.arrived(&ack);
        Some(ack)
    }

    /// The next acknowledgement if one has arrived.
    pub fn try_recv(&mut self) -> Option<SessionAck> {
        if let Some(ack) = self.ready.pop_front() {
            return Some(ack);
        }
        match self.connection.acks.try_recv() {
            Ok(ack) => {
                self.arrived(&ack);
                Some(ack)
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
        }
    }

    /// Waits for every pending acknowledgement and closes the connection.
    pub fn finish(mut self) -> Vec<SessionAck> {
        let mut acks = Vec::with_capacity(self.pending());
        while let Some(ack) = self.recv() {
            acks.push(ack);
        }
        acks
    }
}

fn closed() -> Error {
    Error::Io {
        what: "append session".into(),
        error: std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the session is closed"),
    }
}

/// Writes queued requests (or a streamed request's chunks), batching what is queued into
/// one flush; `last` once the session closes.
fn write_loop(
    stream: TcpStream,
    requests: &Receiver<Vec<u8>>,
    spare: &SyncSender<Vec<u8>>,
    last: &[u8],
) {
    let mut out = BufWriter::with_capacity(256 << 10, stream);
    while let Ok(mut request) = requests.recv() {
        loop {
            if out.write_all(&request).is_err() {
                return;
            }
            request.clear();
            let _ = spare.try_send(request);
            match requests.try_recv() {
                Ok(next) => request = next,
                Err(_) => break,
            }
        }
        if out.flush().is_err() {
            return;
        }
    }
    // The session is closing: no more requests on this connection.
    let _ = out.write_all(last);
    let _ = out.flush();
    let _ = out.get_ref().shutdown(Shutdown::Write);
}

/// Reads one answer per ticket, in order; once the connection fails, answers every
/// remaining ticket with the failure.
fn read_loop(stream: TcpStream, sent: &Receiver<(u64, Instant)>, acks: &Sender<SessionAck>) {
    let mut reader = BufReader::with_capacity(64 << 10, stream);
    let mut failure: Option<(std::io::ErrorKind, String)> = None;
    while let Ok((ticket, at)) = sent.recv() {
        let result = match &failure {
            Some((kind, why)) => Err(lost(*kind, why)),
            None => match http::read_response(&mut reader, "POST") {
                Ok((response, reusable)) => {
                    if !reusable {
                        failure = Some((
                            std::io::ErrorKind::ConnectionAborted,
                            "the server closed the connection".into(),
                        ));
                    }
                    if response.status == 200 {
                        Ack::from_json(&response.json())
                    } else {
                        Err(Error::from_response(&response))
                    }
                }
                Err(error) => {
                    let why = error.to_string();
                    let lost = lost(error.kind(), &why);
                    failure = Some((error.kind(), why));
                    // Nothing more goes out on it (after a timeout the writer would go
                    // on sending what is queued, batches then reported as lost).
                    let _ = reader.get_ref().shutdown(Shutdown::Both);
                    Err(lost)
                }
            },
        };
        if acks.send(SessionAck { ticket, result, latency: at.elapsed() }).is_err() {
            return;
        }
    }
}

/// A batch whose answer never came; `kind` is the connection's failure (a timeout shows
/// as one), or `InvalidData` for an answer the API does not give (a protocol error).
fn lost(kind: std::io::ErrorKind, why: &str) -> Error {
    super::read_failure(
        "append session (the batch may or may not have landed)".into(),
        std::io::Error::new(kind, why.to_owned()),
    )
}

/// Why a streamed session's answer holds no next ack.
#[derive(Clone)]
enum Cut {
    /// An error frame, or an error answer to the whole request.
    Refused(ApiError),
    /// The connection failed, or the answer was not one the API gives.
    Lost(std::io::ErrorKind, String),
}

impl Cut {
    fn lost(error: &std::io::Error) -> Self {
        Cut::Lost(error.kind(), error.to_string())
    }

    fn from_error(error: Error) -> Self {
        match error {
            Error::Api(api) => Cut::Refused(api),
            Error::Io { error, .. } => Cut::lost(&error),
            other => Cut::Lost(std::io::ErrorKind::InvalidData, other.to_string()),
        }
    }

    /// The answer of the batch the session ended at.
    fn answer(&self) -> Error {
        match self {
            Cut::Refused(error) => Error::Api(error.clone()),
            Cut::Lost(kind, why) => lost(*kind, why),
        }
    }

    /// The answer of a batch behind batch `ticket`, where the session ended.
    fn behind(&self, ticket: u64) -> Error {
        let Cut::Refused(error) = self else { return self.answer() };
        let mut error = error.clone();
        error.message = if Error::Api(error.clone()).outcome_unknown() {
            format!(
                "batch {ticket} before this one in the session failed, so this one may or may \
                 not have landed: {}",
                error.message
            )
        } else {
            format!(
                "not appended: the server refused batch {ticket} before this one in the \
                 session, and took nothing after it: {}",
                error.message
            )
        };
        Error::Api(error)
    }
}

/// Reads a streamed session's answer: its head at once (its state then set, for
/// [`Connection::closed_by_server`]), then one ack frame per ticket, in order, saying
/// before each ack goes to the caller whether more of the answer came behind it (read
/// in the same gulp, it is in no socket a peek could see). Once the answer ends (an
/// error frame, an error answer, a failed connection), answers every remaining ticket
/// from how it ended.
fn read_stream(
    stream: TcpStream,
    sent: &Receiver<(u64, Instant)>,
    acks: &Sender<SessionAck>,
    state: &AtomicU8,
) {
    let socket = stream.try_clone().ok();
    let mut answer = open_answer(BufReader::with_capacity(64 << 10, stream));
    state.store(if answer.is_ok() { ANSWERING } else { HEAD_FAILED }, Ordering::Release);
    let mut frame = Vec::new();
    // The batch the session ended at, and why.
    let mut ended: Option<(u64, Cut)> = None;
    while let Ok((ticket, at)) = sent.recv() {
        let result = match &ended {
            Some((first, cut)) => Err(cut.behind(*first)),
            None => {
                let next = match &mut answer {
                    Ok(body) => next_ack(body, &mut frame).inspect(|_| {
                        let more = if body.has_unread() { MORE_CAME } else { ANSWERING };
                        state.store(more, Ordering::Release);
                    }),
                    Err(cut) => Err(cut.clone()),
                };
                next.map_err(|cut| {
                    if matches!(cut, Cut::Lost(..))
                        && let Some(socket) = &socket
                    {
                        // Nothing more goes out on it.
                        let _ = socket.shutdown(Shutdown::Both);
                    }
                    let error = cut.answer();
                    ended = Some((ticket, cut));
                    error
                })
            }
        };
        if acks.send(SessionAck { ticket, result, latency: at.elapsed() }).is_err() {
            return;
        }
    }
}

/// A streamed session's answer head; its body, the frames, to read as they come.
fn open_answer(mut reader: BufReader<TcpStream>) -> std::result::Result<ChunkedBody, Cut> {
    use std::io::BufRead as _;
    let mut line = String::new();
    if reader.read_line(&mut line).map_err(|e| Cut::lost(&e))? == 0 {
        let closed = "the server closed the connection";
        return Err(Cut::Lost(std::io::ErrorKind::UnexpectedEof, closed.into()));
    }
    let (status, headers) = http::read_head(&mut reader, &mut line).map_err(|e| Cut::lost(&e))?;
    if status != 200 {
        let answer = http::Streaming::after_head(reader, "POST", status, headers);
        let response = answer.finish().map_err(|e| Cut::lost(&e))?;
        return Err(Cut::from_error(Error::from_response(&response)));
    }
    let session = headers.iter().any(|(name, media)| {
        name == "content-type"
            && media.split(';').skip(1).any(|p| p.trim().eq_ignore_ascii_case("session=true"))
    });
    if !session || !http::is_chunked(&headers) {
        let why = "the server answered an append session as something else (a server older \
                   than append sessions?)";
        return Err(Cut::Lost(std::io::ErrorKind::InvalidData, why.into()));
    }
    Ok(ChunkedBody::new(reader))
}

/// The next ack of a streamed session's answer.
fn next_ack(body: &mut ChunkedBody, frame: &mut Vec<u8>) -> std::result::Result<Ack, Cut> {
    let cut_short = || {
        let why = "the session's answer ended before this batch's ack";
        Cut::Lost(std::io::ErrorKind::UnexpectedEof, why.into())
    };
    if !read_frame(body, frame).map_err(|e| Cut::lost(&e))? {
        return Err(cut_short());
    }
    let invalid = |why: String| Cut::Lost(std::io::ErrorKind::InvalidData, why);
    match framing::decode_frame(frame) {
        Ok(Some((Frame::Ack { start, end, tail }, _))) => {
            let at = |p: engine::position::Position| Position {
                seq_num: p.seq_num,
                timestamp: p.timestamp,
            };
            Ok(Ack { start: at(start), end: at(end), tail: at(tail) })
        }
        Ok(Some((Frame::Error(text), _))) => Err(Cut::from_error(api_error_frame(text))),
        Ok(Some((Frame::End, _))) => Err(cut_short()),
        Ok(Some((Frame::Records(_) | Frame::Heartbeat(_) | Frame::PageEnd { .. }, _))) => {
            Err(invalid("an append session's answer holds a read's frame".into()))
        }
        Ok(None) => Err(invalid("an append session's frame is cut short".into())),
        Err(e) => Err(invalid(format!("an append session's frame is corrupt: {e}"))),
    }
}
