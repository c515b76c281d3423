//! hyper's I/O traits over glommio's `TcpStream` (notes/platform.md, "hyper 1.x on
//! glommio").
//!
//! Reads go straight from the socket into hyper's buffer, whose unfilled part is handed
//! to `recv(2)` as it is: no receive buffer of our own, no copy out of it, and nothing
//! zeroed per read. (Reading through glommio's preallocated buffer instead cost a copy of
//! every received byte, 4% of the shard's core under binary appends.) Writes go straight
//! to the socket, and their progress is noted ([`Progress`]) for the connection's idle
//! watchdog.

use std::cell::Cell;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;

/// One accepted connection, as hyper drives it.
pub struct Io {
    stream: TcpStream,
    progress: Rc<Progress>,
}

impl Io {
    pub fn new(stream: TcpStream, progress: Rc<Progress>) -> Self {
        Io { stream, progress }
    }
}

/// When the connection last moved, for its idle watchdog: a write completed (set here),
/// or an answer ended (set by the server); and whether a write is waiting now for the
/// peer to take bytes (its socket buffer full).
pub struct Progress {
    last: Cell<Instant>,
    write_waiting: Cell<bool>,
}

impl Default for Progress {
    /// Moved now: a connection just accepted.
    fn default() -> Self {
        Progress { last: Cell::new(Instant::now()), write_waiting: Cell::new(false) }
    }
}

impl Progress {
    pub fn moved(&self) {
        self.last.set(Instant::now());
    }

    pub fn last(&self) -> Instant {
        self.last.get()
    }

    pub fn write_waiting(&self) -> bool {
        self.write_waiting.get()
    }

    /// A write's outcome: bytes taken are progress. (Not a flush's: hyper flushes on every
    /// wake-up of the connection, with nothing to write or not.)
    fn wrote(&self, poll: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        self.write_waiting.set(poll.is_pending());
        if let Poll::Ready(Ok(1..)) = poll {
            self.moved();
        }
        poll
    }
}

impl hyper::rt::Read for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        // SAFETY: the unfilled bytes are only written, by `recv(2)`: glommio's unbuffered
        // `poll_read` hands the slice to the syscall and never reads it.
        let unfilled = unsafe { &mut *(buf.as_mut() as *mut [MaybeUninit<u8>] as *mut [u8]) };
        let n = ready!(Pin::new(&mut self.stream).poll_read(cx, unfilled))?;
        // SAFETY: `recv(2)` wrote the first `n` of those bytes.
        unsafe { buf.advance(n) };
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.progress.wrote(Pin::new(&mut this.stream).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.progress.wrote(Pin::new(&mut this.stream).poll_write_vectored(cx, bufs))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_close(cx)
    }
}
