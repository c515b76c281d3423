//! The response body: a whole buffer, or a stream of chunks from a bounded channel (a
//! subscription's events). The channel's bound is what bounds a subscriber's memory; a
//! page's [`Hold`] on its shard's response memory rides in its [`Chunk`], so it is given
//! back when hyper has written the last byte (its writes are vectored, `io.rs`: it
//! queues the chunk as it is and drops it once written, never copies it).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures_lite::Stream;
use http_body::{Frame, SizeHint};

use crate::response_memory::Hold;

/// Bytes of a response, and what they hold of the shard's response memory.
pub struct Chunk {
    bytes: Bytes,
    _hold: Option<Hold>,
}

impl Chunk {
    pub fn held(bytes: Bytes, hold: Hold) -> Self {
        Chunk { bytes, _hold: Some(hold) }
    }
}

impl From<Bytes> for Chunk {
    fn from(bytes: Bytes) -> Self {
        Chunk { bytes, _hold: None }
    }
}

impl Buf for Chunk {
    fn remaining(&self) -> usize {
        self.bytes.remaining()
    }

    fn chunk(&self) -> &[u8] {
        self.bytes.chunk()
    }

    fn advance(&mut self, cnt: usize) {
        self.bytes.advance(cnt);
    }
}

pub enum Body {
    Full(Option<Chunk>),
    /// The events, and the channel again, to empty it when the body is dropped.
    Stream(flume::r#async::RecvStream<'static, Chunk>, flume::Receiver<Chunk>),
}

impl Body {
    /// A body of the chunks `events` brings, until its senders are gone.
    pub fn stream(events: flume::Receiver<Chunk>) -> Self {
        Body::Stream(events.clone().into_stream(), events)
    }

    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Body::Full(Some(Chunk::from(bytes.into())))
    }

    /// A whole body that holds `hold` of its shard's response memory until written.
    pub fn held(bytes: impl Into<Bytes>, hold: Hold) -> Self {
        Body::Full(Some(Chunk::held(bytes.into(), hold)))
    }

    pub fn empty() -> Self {
        Body::Full(None)
    }
}

impl http_body::Body for Body {
    type Data = Chunk;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Chunk>, Infallible>>> {
        match self.get_mut() {
            Body::Full(chunk) => Poll::Ready(chunk.take().map(|c| Ok(Frame::data(c)))),
            Body::Stream(events, _) => {
                Pin::new(events).poll_next(cx).map(|next| next.map(|c| Ok(Frame::data(c))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(chunk)) => SizeHint::with_exact(chunk.remaining() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Stream(..) => SizeHint::default(),
        }
    }
}

impl Drop for Body {
    /// A subscriber gone (or a stop) gives back at once what its queued pages hold: a
    /// channel's items outlive its receivers until taken out.
    fn drop(&mut self) {
        if let Body::Stream(_, events) = self {
            while events.try_recv().is_ok() {}
        }
    }
}
