//! The HTTP server: one listener per shard on the same address (SO_REUSEPORT, so the
//! kernel spreads connections and accepting is shared-nothing),
//! hyper's HTTP/1.1 with keep-alive on each accepted connection, at most
//! `--http-connections-max` connections per shard (the permit is taken before a
//! connection is accepted), and a graceful stop: when the node stops, each shard stops
//! accepting, lets every connection finish the request in hand (hyper's graceful
//! shutdown), serves one request on each connection the kernel had already queued for
//! it, and returns once all are closed.
//!
//! It never touches a stream itself: every verb goes through the node's `Client`, which
//! routes it to the stream's leader shard.

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use engine::node::{Service, ServiceContext};
use glommio::net::{TcpListener, TcpStream};
use glommio::sync::{Semaphore, StaticPermit};
use glommio::timer::Timer;
use http_body::{Frame, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;

use crate::api::{self, Settings, Shared};
use crate::auth::{Auth, CallerCache};
use crate::body::{Body, Chunk};
use crate::io::{Io, Progress};
use crate::metrics::{Closed, Metrics};
use crate::response_memory::ResponseMemory;

/// The server's configuration.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub connections_max: u64,
    pub settings: Settings,
    /// None: auth is off.
    pub auth: Option<Arc<Auth>>,
}

impl ServerConfig {
    /// Every knob at its default, listening on `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        ServerConfig {
            listen,
            connections_max: tuning::HTTP_CONNECTIONS_MAX.default,
            auth: None,
            settings: Settings {
                body_bytes_max: tuning::HTTP_BODY_BYTES_MAX.default,
                json_body_bytes_max: tuning::HTTP_JSON_BODY_BYTES_MAX.default,
                body_memory_bytes: tuning::HTTP_BODY_MEMORY_BYTES.default,
                session_in_flight_max: tuning::HTTP_SESSION_IN_FLIGHT_MAX.default,
                response_memory_bytes: tuning::HTTP_RESPONSE_MEMORY_BYTES.default,
                head_bytes_max: tuning::HTTP_HEAD_BYTES_MAX.default,
                idle_timeout: Duration::from_millis(tuning::HTTP_IDLE_TIMEOUT_MS.default),
                shutdown_idle: Duration::from_millis(tuning::HTTP_SHUTDOWN_IDLE_MS.default),
                peer_gone: Duration::from_millis(tuning::HTTP_PEER_GONE_MS.default),
                log_slow: Duration::from_millis(tuning::HTTP_LOG_SLOW_MS.default),
                log_lines_per_second: tuning::HTTP_LOG_LINES_PER_SECOND.default,
                heartbeat: Duration::from_millis(tuning::SSE_HEARTBEAT_MS.default),
            },
        }
    }
}

/// The node service that serves HTTP on every shard. Each shard reports on `bound` once
/// its listener is bound (or why it could not be).
pub fn service(
    config: ServerConfig,
    metrics: Arc<Metrics>,
    bound: flume::Sender<Result<(), String>>,
) -> Service {
    Arc::new(move |context: ServiceContext| {
        Box::pin(serve_shard(context, config.clone(), Arc::clone(&metrics), bound.clone()))
    })
}

enum Next<T> {
    Ready(T),
    Stopping,
}

async fn until_stopping<T>(context: &ServiceContext, work: impl Future<Output = T>) -> Next<T> {
    futures_lite::future::or(async { Next::Ready(work.await) }, async {
        context.stopping.wait().await;
        Next::Stopping
    })
    .await
}

/// Connections the kernel queues for a shard's `accept` (glommio's own `bind` uses 1024).
const LISTEN_BACKLOG: i32 = 1024;

/// A shard's listener on `address`: SO_REUSEPORT, so every shard listens on the one
/// port, and SO_REUSEADDR, so a restart finds its port free while the connections the
/// last run closed wait out TIME_WAIT. (glommio's `TcpListener::bind` sets only the
/// first: a server restarted within a minute of closing connections found its own port
/// "in use".) The accepted connections inherit both. Also a second handle on the same
/// socket, for taking what is queued when the node stops ([`serve_queued`]).
fn listen(address: SocketAddr) -> std::io::Result<(TcpListener, socket2::Socket)> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::{FromRawFd as _, IntoRawFd as _};
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    let queue = socket.try_clone()?;
    // SAFETY: a bound, listening socket whose descriptor the listener now owns alone.
    Ok((unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) }, queue))
}

/// Serves the connections the kernel queued for this shard before the node stopped,
/// one request each (as every connection gets once stopping: hyper's graceful
/// shutdown). Closing the listener with them queued would reset them, and a client
/// whose request sat in the queue could not tell whether it was taken. Each takes a
/// connection permit, as any other; at most a backlog's worth are taken, so a client
/// that keeps connecting does not hold the stop.
async fn serve_queued(queue: &socket2::Socket, permits: &Rc<Semaphore>, shared: &Rc<Shared>) {
    use std::os::fd::{FromRawFd as _, IntoRawFd as _};
    if let Err(error) = queue.set_nonblocking(true) {
        crate::log_line!("nova cannot take queued connections on shard {}: {error}", shared.shard);
        return;
    }
    for _ in 0..LISTEN_BACKLOG {
        // Taken before its permit, so that the listener closes as soon as the queue is
        // empty, not once a connection has given a permit back.
        let socket = match queue.accept() {
            Ok((socket, _)) => socket,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return,
            // Reset by its client before it was taken: the next one.
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionAborted => continue,
            Err(error) => {
                crate::log_line!("nova accept failed on shard {}: {error}", shared.shard);
                return;
            }
        };
        let Ok(permit) = permits.acquire_static_permit(1).await else { return };
        // SAFETY: a connected socket whose descriptor the stream now owns alone.
        let stream = unsafe { TcpStream::from_raw_fd(socket.into_raw_fd()) };
        glommio::spawn_local(connection(Rc::clone(shared), stream, permit)).detach();
    }
}

async fn serve_shard(
    context: ServiceContext,
    config: ServerConfig,
    metrics: Arc<Metrics>,
    bound: flume::Sender<Result<(), String>>,
) {
    // The issued tokens are in memory before the first request is taken.
    match &config.auth {
        Some(auth) => {
            if let Err(error) = auth.load(context.client.control()).await {
                let _ = bound
                    .send(Err(format!("shard {} cannot load the tokens: {error}", context.shard)));
                return;
            }
        }
        // Tokens were issued here, so auth was on before: say that it is off now.
        None if context.shard == 0 => {
            if let Ok((tokens, _)) = context.client.control().tokens_page(None).await
                && !tokens.is_empty()
            {
                crate::log_line!(
                    "nova: WARNING: this data directory holds issued tokens, but authentication \
                     is off (no --root-token-file): every request is allowed"
                );
            }
        }
        None => {}
    }
    let (listener, queue) = match listen(config.listen) {
        Ok(listening) => {
            let _ = bound.send(Ok(()));
            listening
        }
        Err(error) => {
            let _ = bound.send(Err(format!(
                "shard {} cannot listen on {}: {error}",
                context.shard, config.listen
            )));
            return;
        }
    };
    let responses = ResponseMemory::new(
        config.settings.response_memory_bytes,
        Arc::clone(&metrics),
        context.shard,
    );
    let shared = Rc::new(Shared {
        client: context.client.clone(),
        settings: config.settings.clone(),
        metrics,
        shard: context.shard,
        stopping: context.stopping.clone(),
        boot: boot_id(),
        next_request: Cell::new(0),
        log_budget: api::LogBudget::default(),
        auth: config.auth.clone(),
        body_memory: Rc::new(Semaphore::new(config.settings.body_memory_bytes)),
        responses,
    });
    let permits = Rc::new(Semaphore::new(config.connections_max));
    loop {
        let permit = match until_stopping(&context, permits.acquire_static_permit(1)).await {
            Next::Ready(Ok(permit)) => permit,
            Next::Ready(Err(_)) | Next::Stopping => break,
        };
        let stream = match until_stopping(&context, listener.accept()).await {
            Next::Ready(Ok(stream)) => stream,
            Next::Ready(Err(error)) => {
                // Out of file descriptors, or a connection reset before it was accepted:
                // say so, and give the system a moment instead of spinning.
                crate::log_line!("nova accept failed on shard {}: {error}", context.shard);
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Next::Stopping => break,
        };
        glommio::spawn_local(connection(Rc::clone(&shared), stream, permit)).detach();
    }
    drop(listener);
    serve_queued(&queue, &permits, &shared).await;
    drop(queue);
    // Every connection gives its permit back when it closes.
    let _ = permits.acquire(config.connections_max).await;
}

async fn connection(shared: Rc<Shared>, stream: TcpStream, permit: StaticPermit) {
    shared.metrics.connection_opened(shared.shard);
    let _ = stream.set_nodelay(true);
    keep_alive_probes(&stream, shared.settings.peer_gone);
    let handler = Rc::clone(&shared);
    // The connection's last caller, so a kept-alive connection's token is checked once.
    let callers = Rc::new(CallerCache::default());
    let activity = Rc::new(Activity {
        answering: Cell::new(0),
        requested: Cell::new(false),
        progress: Rc::default(),
    });
    let io = Io::new(stream, Rc::clone(&activity.progress));
    let requests = Rc::clone(&activity);
    let service = service_fn(move |request| {
        let answering = Answering::begin(&requests);
        let stopping = handler.stopping.clone();
        let answer = api::handle(Rc::clone(&handler), Rc::clone(&callers), request);
        async move {
            let mut response = answer.await?;
            // Once the node is stopping, every answer is its connection's last (hyper
            // closes after it), also one hyper writes in the poll that read its request,
            // before the graceful shutdown below could be asked for.
            if stopping.is_set() {
                let close = hyper::header::HeaderValue::from_static("close");
                response.headers_mut().insert(hyper::header::CONNECTION, close);
            }
            Ok::<_, Infallible>(response.map(|body| Answer { body, _answering: answering }))
        }
    });
    // Err: closed by the watchdog, and why. The connection (its socket) is closed at the
    // end of this block, before it is counted: whoever sees the count sees the close.
    let result = {
        let mut connection =
            pin!(http1::Builder::new().keep_alive(true).serve_connection(io, service));
        let stopping = shared.stopping.clone();
        let mut stop = pin!(stopping.wait());
        let (mut stopped, mut shutting_down) = (false, false);
        let mut watchdog = Watchdog::new(shared.settings.idle_timeout);
        std::future::poll_fn(|cx| {
            if !stopped && stop.as_mut().poll(cx).is_ready() {
                stopped = true;
                // One that sends no request, or whose client stopped reading, is the
                // watchdog's, sooner.
                watchdog.shorten(shared.settings.shutdown_idle);
            }
            // hyper closes a connection between requests now, or after the request in
            // hand. It would also close one that has not read a byte yet, though its
            // first request may be on its way (just accepted, or queued at the stop): that
            // one is told once its first request has come, and the answer to that request
            // closes it anyway (the service's `connection: close`).
            if stopped && !shutting_down && activity.requested.get() {
                shutting_down = true;
                connection.as_mut().graceful_shutdown();
            }
            if let Poll::Ready(result) = connection.as_mut().poll(cx) {
                return Poll::Ready(Ok(result));
            }
            watchdog.poll_idle(&activity, cx).map(|()| {
                Err(if activity.progress.write_waiting() { Closed::Stalled } else { Closed::Idle })
            })
        })
        .await
    };
    if let Ok(Err(error)) = &result
        && !error.is_incomplete_message()
    {
        crate::log_line!("nova connection on shard {} ended: {error}", shared.shard);
    }
    shared.metrics.connection_closed(shared.shard, result.err().unwrap_or(Closed::Ended));
    drop(permit);
}

/// What a connection is doing, for its idle watchdog: how many requests are being
/// answered (from the call into the service until hyper has taken the whole response
/// body, so a subscription or a long poll counts throughout), and its [`Progress`]: when
/// it last moved (a write completed, an answer ended, or it was accepted) and whether a
/// write waits for the client to take bytes.
struct Activity {
    answering: Cell<u32>,
    /// A request has come (see `connection`'s graceful shutdown).
    requested: Cell<bool>,
    progress: Rc<Progress>,
}

impl Activity {
    /// How long until the connection has been idle for `timeout`; None once it has. Idle
    /// is nothing moving: no request being answered and no write since the last answer,
    /// or a write waiting on a client that has taken no byte for the timeout (a request
    /// being answered or not: hyper may hold the end of an answer it has already taken).
    fn idle_in(&self, timeout: Duration) -> Option<Duration> {
        if self.answering.get() > 0 && !self.progress.write_waiting() {
            return Some(timeout);
        }
        timeout.checked_sub(self.progress.last().elapsed()).filter(|left| !left.is_zero())
    }
}

/// A request being answered; see [`Activity`].
struct Answering(Rc<Activity>);

impl Answering {
    fn begin(activity: &Rc<Activity>) -> Self {
        activity.answering.set(activity.answering.get() + 1);
        activity.requested.set(true);
        Answering(Rc::clone(activity))
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.set(self.0.answering.get() - 1);
        self.0.progress.moved();
    }
}

/// A response body that holds its request's [`Answering`] until hyper drops it: written
/// whole, or the connection gone.
struct Answer {
    body: Body,
    _answering: Answering,
}

impl http_body::Body for Answer {
    type Data = Chunk;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Chunk>, Infallible>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Closes a connection idle for `--http-idle-timeout-ms`: one with no request being
/// answered since its last answer (or since it was accepted), or whose client has taken
/// no byte of an answer for that long. A client sending a head byte by byte is idle too,
/// and so is a subscriber that stopped reading, so neither holds a connection permit and
/// its memory for good.
struct Watchdog {
    timer: Timer,
    /// When the timer is due; checked against the clock first, because polling a glommio
    /// timer registers it with the reactor again, on every wake-up of the connection.
    due: Instant,
    armed: bool,
    timeout: Duration,
}

impl Watchdog {
    fn new(timeout: Duration) -> Self {
        Watchdog {
            timer: Timer::new(timeout),
            due: Instant::now() + timeout,
            armed: false,
            timeout,
        }
    }

    /// Makes the timeout `timeout` when that is shorter, from the next poll on.
    fn shorten(&mut self, timeout: Duration) {
        if timeout < self.timeout {
            self.timeout = timeout;
            // Armed, so the next poll measures against it, even on a connection not
            // polled before (whose timer still counts the old timeout).
            self.armed = true;
            self.due = Instant::now();
        }
    }

    /// Ready once the connection has been idle for the timeout; else Pending, with the
    /// task woken when it may have been.
    fn poll_idle(&mut self, activity: &Activity, cx: &mut Context<'_>) -> Poll<()> {
        if self.armed && Instant::now() < self.due {
            return Poll::Pending;
        }
        loop {
            if self.armed {
                let Some(left) = activity.idle_in(self.timeout) else { return Poll::Ready(()) };
                self.timer.reset(left);
                self.due = Instant::now() + left;
            }
            self.armed = true;
            if Pin::new(&mut self.timer).poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

/// TCP keepalive on a connection, so a peer that vanished without a word (a host gone,
/// a network cut) is found within `peer_gone` and its connection permit and memory given
/// back: a quiet connection is probed from half of it on, six probes over the other half;
/// and bytes sent but not acknowledged by the peer for `peer_gone` drop it too (keepalive
/// probes only a quiet connection; without this, retransmissions would take about 15
/// minutes). A request may be answered for as long as its client likes without a byte
/// moving (an append session between batches), which the idle watchdog counts as busy:
/// this is what finds such a connection's peer gone. A client that is there but reads
/// slowly acknowledges what it received (its window closes; the watchdog's write stall
/// covers it).
fn keep_alive_probes(stream: &TcpStream, peer_gone: Duration) {
    use std::os::fd::AsRawFd as _;
    const PROBES: u64 = 6;
    let seconds =
        |d: Duration| libc::c_int::try_from(d.as_secs().max(1)).unwrap_or(libc::c_int::MAX);
    let fd = stream.as_raw_fd();
    let options = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, seconds(peer_gone / 2)),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, seconds(peer_gone / 2 / PROBES as u32)),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, PROBES as libc::c_int),
        (
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            libc::c_int::try_from(peer_gone.as_millis()).unwrap_or(libc::c_int::MAX),
        ),
    ];
    for (level, name, value) in options {
        // SAFETY: setsockopt(2) on a socket this connection owns, with a live c_int.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&raw const value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

/// A per-process number that tells request ids of different runs apart.
fn boot_id() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ (d.as_secs() as u32));
    nanos ^ std::process::id().rotate_left(16)
}
