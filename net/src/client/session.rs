//! An append session: batches for one stream pipelined on one keep-alive HTTP/1.1
//! connection, acknowledged in order (producers.md: "appends to one stream from one
//! connection are acknowledged in order"; a producer may pipeline).
//!
//! The caller's thread frames each batch into a request buffer and hands it to a writer
//! thread, which writes whatever is queued and flushes when the queue is empty; a reader
//! thread reads the answers in order. At most `in_flight_max` requests are unacknowledged:
//! [`AppendSession::submit`] waits for an acknowledgement beyond that. Request buffers
//! go back to the caller for reuse, so a steady session allocates nothing per batch.
//!
//! A session never resends: when its connection fails, every batch in flight is answered
//! with [`Error::Io`] (it may or may not have landed) and the session is closed; open a
//! new one, and use `match_seq_num` to make the resend land once. A connection the server
//! closed with nothing in flight (idle past its `--http-idle-timeout-ms`) loses nothing:
//! the next batch goes on a new one.

use std::collections::VecDeque;
use std::io::{BufReader, BufWriter, Write as _};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd as _;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::http::{self, Server};
use super::{Ack, Address, Batch, Conditions, Error, Format, RECORDS_MEDIA_TYPE, Result};

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
    format: Format,
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
    requests: Option<SyncSender<Vec<u8>>>,
    sent: Option<Sender<(u64, Instant)>>,
    acks: Receiver<SessionAck>,
    spare: Receiver<Vec<u8>>,
    stream: TcpStream,
    threads: Vec<JoinHandle<()>>,
}

impl Connection {
    fn open(server: &Server, in_flight_max: usize, timeout: Option<Duration>) -> Result<Self> {
        let io_error =
            |error| Error::Io { what: format!("connect to {}", server.authority), error };
        let stream = TcpStream::connect(&server.authority).map_err(io_error)?;
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
        let writer = std::thread::Builder::new()
            .name("nova-append-writer".into())
            .spawn(move || write_loop(write_half, &requests_rx, &spare_tx))
            .map_err(|error| Error::Io { what: "start the writer thread".into(), error })?;
        let reader = std::thread::Builder::new()
            .name("nova-append-reader".into())
            .spawn(move || read_loop(read_half, &sent_rx, &acks_tx))
            .map_err(|error| Error::Io { what: "start the reader thread".into(), error })?;
        Ok(Connection {
            requests: Some(requests),
            sent: Some(sent),
            acks,
            spare,
            stream,
            threads: vec![writer, reader],
        })
    }

    /// Whether the server has closed the connection (it closes one idle for its
    /// `--http-idle-timeout-ms`), seen without waiting. Asked only with nothing in flight,
    /// when no answer is due and the reader thread is not reading.
    fn closed_by_server(&self) -> bool {
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
        // Closing the channels ends the writer; shutting the socket ends the reader.
        self.requests = None;
        self.sent = None;
        let _ = self.stream.shutdown(Shutdown::Both);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
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
        Ok(Self {
            format,
            path: format!("{}/records", address.path()),
            server: server.clone(),
            timeout,
            in_flight_max,
            in_flight: 0,
            next_ticket: 0,
            ready: VecDeque::new(),
            connection: Connection::open(server, in_flight_max, timeout)?,
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
        if self.in_flight == 0 && self.connection.closed_by_server() {
            // Nothing was in flight on it, so nothing is lost: go on on a new connection.
            self.connection = Connection::open(&self.server, self.in_flight_max, self.timeout)?;
        }
        while self.in_flight >= self.in_flight_max {
            let ack = self.connection.acks.recv().map_err(|_| closed())?;
            self.arrived(&ack);
            self.ready.push_back(ack);
        }
        let mut buffer = self.connection.spare.try_recv().unwrap_or_default();
        buffer.clear();
        match self.format {
            Format::Binary => {
                http::encode_head(
                    &mut buffer,
                    "POST",
                    &self.path,
                    &self.server,
                    &[("content-type", RECORDS_MEDIA_TYPE)],
                    Some(batch.framed_len(conditions)),
                );
                batch.write_framed(conditions, &mut buffer)?;
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
        self.failed |= matches!(ack.result, Err(Error::Io { .. }));
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

/// Writes queued requests, batching what is queued into one flush.
fn write_loop(stream: TcpStream, requests: &Receiver<Vec<u8>>, spare: &SyncSender<Vec<u8>>) {
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
/// as one).
fn lost(kind: std::io::ErrorKind, why: &str) -> Error {
    Error::Io {
        what: "append session (the batch may or may not have landed)".into(),
        error: std::io::Error::new(kind, why.to_owned()),
    }
}
