//! hyper's I/O traits over glommio's `TcpStream` (notes/platform.md, "hyper 1.x on
//! glommio").
//!
//! Reads go straight from the socket into hyper's buffer, whose unfilled part is handed
//! to `recv(2)` as it is: no receive buffer of our own, no copy out of it, and nothing
//! zeroed per read. (Reading through glommio's preallocated buffer instead cost a copy of
//! every received byte, 4% of the shard's core under binary appends.) Writes go straight
//! to the socket, and their progress is noted ([`Progress`]) for the connection's idle
//! watchdog.
//!
//! Writes are vectored, so hyper queues a response's body as the buffer it is (its
//! `Queue` strategy) instead of copying it behind the head in a buffer of its own (its
//! `Flatten` strategy, which also kept that buffer's capacity, as large as the largest
//! page the connection ever answered, for the connection's life): a read page goes from
//! the engine's bytes to the socket with no copy on the way, and it is dropped (giving
//! back what it held of the shard's response memory) once the socket has taken all of it.

use std::cell::Cell;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd as _, RawFd};
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

    /// One `sendmsg(2)` over every buffer, not waiting. glommio has no vectored write of
    /// its own (its `poll_write_vectored` would write the first buffer alone); when the
    /// socket is full, its write of the first buffer waits for room, as its `poll_write`
    /// does, and what that write takes is a valid partial write of them all. (A send of
    /// ours that succeeds does not cancel a glommio write timeout that a wait armed:
    /// nova sets none on its sockets.)
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = match send_vectored(this.stream.as_raw_fd(), bufs) {
            Some(sent) => Poll::Ready(sent),
            None => {
                let first = bufs.iter().find(|buf| !buf.is_empty()).map_or(&[][..], |buf| buf);
                Pin::new(&mut this.stream).poll_write(cx, first)
            }
        };
        this.progress.wrote(poll)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_close(cx)
    }
}

/// `sendmsg(2)` of `bufs` in order, not blocking: `None` when the socket has no room
/// (EAGAIN) or interrupted, else what it took or its error.
fn send_vectored(fd: RawFd, bufs: &[io::IoSlice<'_>]) -> Option<io::Result<usize>> {
    // SAFETY: a zeroed msghdr is a valid empty one; `IoSlice` is ABI-compatible with
    // `iovec` on Unix (its documented guarantee), and the kernel only reads the buffers.
    let sent = unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = bufs.as_ptr().cast_mut().cast::<libc::iovec>();
        message.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
        libc::sendmsg(fd, &message, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    match usize::try_from(sent) {
        Ok(sent) => Some(Ok(sent)),
        Err(_) => {
            let error = io::Error::last_os_error();
            let retry =
                matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted);
            (!retry).then_some(Err(error))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, Read as _};
    use std::os::fd::AsRawFd as _;
    use std::os::unix::net::UnixStream;

    use super::send_vectored;

    #[test]
    fn a_vectored_send_writes_every_buffer_in_order_and_says_when_the_socket_is_full() {
        let (sender, mut receiver) = UnixStream::pair().unwrap();
        sender.set_nonblocking(true).unwrap();
        let pieces: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 1000 + usize::from(i)]).collect();
        let slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
        let sent = send_vectored(sender.as_raw_fd(), &slices).unwrap().unwrap();
        assert_eq!(sent, pieces.iter().map(Vec::len).sum::<usize>());
        let mut got = vec![0; sent];
        receiver.read_exact(&mut got).unwrap();
        assert_eq!(got, pieces.concat());

        // Fill the socket: a full one answers None (wait for room), never an error.
        let big = vec![7u8; 1 << 20];
        let mut queued = 0;
        let full = loop {
            match send_vectored(sender.as_raw_fd(), &[IoSlice::new(&big)]) {
                Some(Ok(n)) => queued += n,
                Some(Err(error)) => panic!("a full socket is not an error: {error}"),
                None => break true,
            }
            if queued > 1 << 30 {
                break false;
            }
        };
        assert!(full, "1 GiB went into a socket nobody reads");
        drop(receiver);
        let error = send_vectored(sender.as_raw_fd(), &[IoSlice::new(&big)]).unwrap().unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe, "a closed peer is an error");
    }
}
