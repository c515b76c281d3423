//! hyper's I/O traits over glommio's `TcpStream` (notes/platform.md, "hyper 1.x on
//! glommio").
//!
//! Reads go straight from the socket into hyper's buffer, whose unfilled part is handed
//! to `recv(2)` as it is: no receive buffer of our own, no copy out of it, and nothing
//! zeroed per read. (Reading through glommio's preallocated buffer instead cost a copy of
//! every received byte, 4% of the shard's core under binary appends.) Writes go straight
//! to the socket.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;

/// One accepted connection, as hyper drives it.
pub struct Io(TcpStream);

impl Io {
    pub fn new(stream: TcpStream) -> Self {
        Io(stream)
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
        let n = ready!(Pin::new(&mut self.0).poll_read(cx, unfilled))?;
        // SAFETY: `recv(2)` wrote the first `n` of those bytes.
        unsafe { buf.advance(n) };
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}
