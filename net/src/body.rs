//! The response body: a whole buffer, or a stream of chunks from a bounded channel (a
//! subscription's events). The channel's bound is what bounds a subscriber's memory.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_lite::Stream;
use http_body::{Frame, SizeHint};

pub enum Body {
    Full(Option<Bytes>),
    Stream(flume::r#async::RecvStream<'static, Bytes>),
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Body::Full(Some(bytes.into()))
    }

    pub fn empty() -> Self {
        Body::Full(None)
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(events) => {
                Pin::new(events).poll_next(cx).map(|next| next.map(|b| Ok(Frame::data(b))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Stream(_) => SizeHint::default(),
        }
    }
}
