//! hyper's I/O traits over glommio's `TcpStream` (notes/platform.md, "hyper 1.x on
//! glommio").
//!
//! Reads go through glommio's preallocated receive buffer and are copied once into
//! hyper's buffer, so no read buffer is zeroed per read and no `unsafe` is needed.
//! Writes go straight to the socket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::{AsyncBufRead, AsyncWrite};
use glommio::net::{Preallocated, TcpStream};

/// Bytes of glommio's receive buffer per connection.
const RECEIVE_BUFFER_BYTES: usize = 64 << 10;

/// One accepted connection, as hyper drives it.
pub struct Io(TcpStream<Preallocated>);

impl Io {
    pub fn new(stream: TcpStream) -> Self {
        Io(stream.buffered_with(Preallocated::new(RECEIVE_BUFFER_BYTES)))
    }
}

impl hyper::rt::Read for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let taken = match Pin::new(&mut self.0).poll_fill_buf(cx) {
            Poll::Ready(Ok(available)) => {
                let n = available.len().min(buf.remaining());
                buf.put_slice(&available[..n]);
                n
            }
            Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
            Poll::Pending => return Poll::Pending,
        };
        Pin::new(&mut self.0).consume(taken);
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
