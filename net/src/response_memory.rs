//! A shard's budget of response bytes (`--http-response-memory-bytes`): read pages and
//! subscription pages, each held from when it is made until the socket has taken its
//! last byte (the [`Hold`] travels inside the body's [`crate::body::Chunk`]), so what
//! slow or stalled clients keep in the server is bounded per shard, not per connection.
//!
//! A page is read cut to what is free, counted in content bytes; encoded it is larger,
//! so one that does not fit once encoded is read again from the same start, cut in
//! proportion to what is free ([`ResponseMemory::refit`]), never held outside the
//! bound. A read that cannot be cut to fit (one record, under [`PAGE_BYTES_MIN`] free,
//! or [`CUTS_MAX`] cuts that did not) is refused (`resource_exhausted`, Retry-After):
//! it never waits while something of the budget could be its own. A subscription waits
//! for room instead, holding nothing while it waits (its queued pages drain as its
//! client reads them, whatever else waits). A page larger than the whole budget is held
//! alone, when nothing else is, so the budget never makes a page impossible.
//!
//! Single-threaded by design (`Rc`, `Cell`): one per shard, on its executor.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use engine::notify::Notify;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// Bytes a read or subscription page needs free to be read at all: below this, a read is
/// refused and a subscription waits. (A page is cut to what is free, so this is also the
/// smallest page the budget cuts one to.)
pub const PAGE_BYTES_MIN: u64 = 64 << 10;

/// Times a page is cut and read again before it is refused (a read) or waited for whole
/// (a subscription): a cut scales to what is free, so one nearly always does.
const CUTS_MAX: u32 = 3;

/// What a page read again is cut to: at most this many records and content bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub records: u64,
    pub bytes: u64,
}

/// What becomes of a page that did not fit once encoded ([`ResponseMemory::refit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refit {
    /// Read it again from its start, cut to this.
    Cut(Cut),
    /// Too little is free to cut it to: a read is refused, a subscription waits until
    /// [`PAGE_BYTES_MIN`] is free and reads a page cut to what is free then.
    Floor,
    /// It cannot be cut (one record, or cut [`CUTS_MAX`] times already): a read is
    /// refused, a subscription waits until it fits whole.
    Whole,
}

pub struct ResponseMemory {
    limit: u64,
    held: Cell<u64>,
    /// Notified whenever bytes are given back.
    freed: Notify,
    metrics: Arc<Metrics>,
    shard: usize,
}

impl ResponseMemory {
    pub fn new(limit: u64, metrics: Arc<Metrics>, shard: usize) -> Rc<Self> {
        Rc::new(Self { limit, held: Cell::new(0), freed: Notify::new(), metrics, shard })
    }

    /// Bytes not held now.
    pub fn available(&self) -> u64 {
        self.limit.saturating_sub(self.held.get())
    }

    fn fits(&self, bytes: u64) -> bool {
        bytes <= self.available() || self.held.get() == 0
    }

    /// Holds `bytes` if they fit, or if nothing is held at all.
    pub fn try_hold(self: &Rc<Self>, bytes: u64) -> Option<Hold> {
        if !self.fits(bytes) {
            return None;
        }
        self.held.set(self.held.get() + bytes);
        self.metrics.response_bytes_held(self.shard, bytes);
        Some(Hold { memory: Rc::clone(self), bytes })
    }

    /// The room a page may take now: at most `wanted`, or a refusal when less than
    /// [`PAGE_BYTES_MIN`] is free while something is held.
    pub fn page_bytes(&self, wanted: u64) -> Result<u64, ApiError> {
        if self.fits(PAGE_BYTES_MIN.min(wanted)) {
            Ok(wanted.min(self.available().max(PAGE_BYTES_MIN)))
        } else {
            Err(self.refusal(PAGE_BYTES_MIN))
        }
    }

    /// A page of `records` records and `content` content bytes came to `encoded` bytes
    /// and did not fit, after `cuts` cuts: how it is read again. A cut scales its records
    /// and its content both to nine tenths of what is free over what it came to (so
    /// records of very different sizes shrink it too, and its encoding's fixed part
    /// rarely takes it past), and always leaves out at least one record.
    pub fn refit(&self, records: u64, content: u64, encoded: u64, cuts: u32) -> Refit {
        let free = self.available();
        if records <= 1 || cuts >= CUTS_MAX {
            return Refit::Whole;
        }
        if free < PAGE_BYTES_MIN {
            return Refit::Floor;
        }
        let scale = |n: u64| {
            let scaled = u128::from(n) * u128::from(free) * 9 / (10 * u128::from(encoded));
            u64::try_from(scaled).unwrap_or(n).max(1)
        };
        Refit::Cut(Cut { records: scale(records).min(records - 1), bytes: scale(content) })
    }

    /// Resolves once `bytes` would fit (or nothing is held). Nothing is reserved: a
    /// waiter then takes them with [`ResponseMemory::try_hold`], which may still fail.
    pub async fn room_for(&self, bytes: u64) {
        loop {
            let seen = self.freed.generation();
            if self.fits(bytes) {
                return;
            }
            self.freed.changed(seen).await;
        }
    }

    /// The refusal of a request that needs `bytes` more than fit now.
    pub fn refusal(&self, bytes: u64) -> ApiError {
        let mut error = ApiError::from_code(
            engine::Code::ResourceExhausted,
            format!(
                "this shard holds {} bytes of responses not yet taken by their clients, and \
                 {bytes} more would pass its limit of {} bytes (--http-response-memory-bytes); \
                 retry shortly",
                self.held.get(),
                self.limit
            ),
        );
        error.retry_after_seconds = Some(1);
        error
    }
}

/// Bytes of a shard's response memory, given back when dropped.
pub struct Hold {
    memory: Rc<ResponseMemory>,
    bytes: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let memory = &self.memory;
        memory.held.set(memory.held.get() - self.bytes);
        memory.metrics.response_bytes_released(memory.shard, self.bytes);
        memory.freed.notify();
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    fn memory(limit: u64) -> Rc<ResponseMemory> {
        ResponseMemory::new(limit, Arc::new(Metrics::new(1)), 0)
    }

    #[test]
    fn holds_within_the_limit_and_gives_back_on_drop() {
        let memory = memory(1 << 20);
        let a = memory.try_hold(600 << 10).expect("fits");
        assert_eq!(memory.available(), 424 << 10);
        assert!(memory.try_hold(500 << 10).is_none(), "past the limit");
        let error = memory.refusal(500 << 10);
        assert_eq!(error.retry_after_seconds, Some(1));
        let message = error.to_json()["message"].as_str().unwrap().to_owned();
        assert!(message.contains("--http-response-memory-bytes"), "{message}");
        assert!(message.contains("1048576") && message.contains("614400"), "{message}");
        let b = memory.try_hold(424 << 10).expect("exactly the rest fits");
        assert_eq!(memory.available(), 0);
        drop(a);
        drop(b);
        assert_eq!(memory.available(), 1 << 20);
    }

    #[test]
    fn a_page_larger_than_the_budget_is_held_alone() {
        let memory = memory(1 << 20);
        let alone = memory.try_hold(3 << 20).expect("nothing else is held");
        assert!(memory.try_hold(1).is_none(), "nothing beside it");
        drop(alone);
        let small = memory.try_hold(1).expect("fits");
        assert!(memory.try_hold(3 << 20).is_none(), "not beside anything");
        drop(small);
    }

    #[test]
    fn pages_are_cut_to_what_is_free_and_refused_below_the_floor() {
        let memory = memory(1 << 20);
        assert_eq!(memory.page_bytes(16 << 20).unwrap(), 1 << 20);
        assert_eq!(memory.page_bytes(1000).unwrap(), 1000);
        let most = memory.try_hold((1 << 20) - (100 << 10)).unwrap();
        assert_eq!(memory.page_bytes(16 << 20).unwrap(), 100 << 10);
        let more = memory.try_hold(50 << 10).unwrap();
        assert!(memory.page_bytes(16 << 20).is_err(), "50 KiB free is under the floor");
        assert_eq!(memory.page_bytes(1000).unwrap(), 1000, "a page that small still fits");
        drop((most, more));
    }

    #[test]
    fn a_page_that_did_not_fit_is_cut_in_proportion_to_what_is_free() {
        let memory = memory(1 << 20);
        let most = memory.try_hold(768 << 10).unwrap();
        // 256 KiB free: a page of 100 records, 480 KiB of content, that came to 512 KiB
        // is read again as 45 records and 216 KiB (nine tenths of half).
        let cut = memory.refit(100, 480 << 10, 512 << 10, 0);
        assert_eq!(cut, Refit::Cut(Cut { records: 45, bytes: 216 << 10 }));
        // Always fewer records, never none.
        let cut = memory.refit(2, 300 << 10, 256 << 10, 0);
        assert_eq!(cut, Refit::Cut(Cut { records: 1, bytes: 270 << 10 }));
        assert_eq!(memory.refit(3, 3, 100 << 20, 0), Refit::Cut(Cut { records: 1, bytes: 1 }));
        // One record cannot be cut, nor a page cut as often as cuts go.
        assert_eq!(memory.refit(1, 500 << 10, 512 << 10, 0), Refit::Whole);
        assert_eq!(memory.refit(100, 480 << 10, 512 << 10, 3), Refit::Whole);
        // Under the floor nothing is cut to.
        let more = memory.try_hold(200 << 10).unwrap();
        assert_eq!(memory.refit(100, 480 << 10, 512 << 10, 0), Refit::Floor);
        drop((most, more));
    }

    #[test]
    fn a_wait_for_room_ends_when_enough_is_given_back() {
        let memory = memory(1 << 20);
        let first = memory.try_hold(512 << 10).unwrap();
        let second = memory.try_hold(512 << 10).unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let mut room = pin!(memory.room_for(600 << 10));
        assert!(room.as_mut().poll(&mut cx).is_pending());
        drop(first);
        assert!(room.as_mut().poll(&mut cx).is_pending(), "512 KiB free is not 600");
        drop(second);
        assert_eq!(room.as_mut().poll(&mut cx), Poll::Ready(()));
    }
}
