//! Test support shared by the library's unit tests: driving futures on the test thread.
//!
//! A test may drive a future from inside another one's poll (a hook that runs a verb in
//! the middle of another), so a wake-up must never be lost to a nested wait: each
//! driver has its own flag, set by its waker and checked before every park. (Parking
//! alone is not enough: the thread's one unpark token can be taken by the nested park.)

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// No test future may take longer than this; a stalled round trip fails the test.
pub(crate) const STALL_LIMIT: Duration = Duration::from_secs(60);

/// A waker that records that it fired, then unparks its thread.
pub(crate) struct WakeFlag {
    thread: Thread,
    woken: AtomicBool,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

impl WakeFlag {
    /// A flag for the current thread, already set (so the first poll happens at once).
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self { thread: thread::current(), woken: AtomicBool::new(true) })
    }

    /// Returns once this flag's waker fired (clearing it); fails the test at `deadline`.
    pub(crate) fn wait(&self, deadline: Instant) {
        while !self.woken.swap(false, Ordering::SeqCst) {
            let now = Instant::now();
            assert!(now < deadline, "a future stalled for {STALL_LIMIT:?}");
            thread::park_timeout(deadline - now);
        }
    }
}

/// Drives a future to completion on this thread. May nest.
pub(crate) fn block_on<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    let flag = WakeFlag::new();
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + STALL_LIMIT;
    loop {
        flag.wait(deadline);
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lost wake-up this module exists to prevent: the outer future is woken while
    /// a nested `block_on` parks; the outer one must still finish at once.
    #[test]
    fn a_wake_during_a_nested_block_on_is_not_lost() {
        let (tx, rx) = flume::bounded::<()>(1);
        let started = Instant::now();
        block_on(async {
            let outer = rx.recv_async();
            let mut outer = pin!(outer);
            // Poll the outer receive once so it registers its waker, then wake it from
            // another thread while a nested block_on is parked.
            std::future::poll_fn(|cx| {
                assert!(outer.as_mut().poll(cx).is_pending());
                Poll::Ready(())
            })
            .await;
            let sender = thread::spawn(move || tx.send(()).expect("receiver alive"));
            block_on(async {
                // Park the thread until the sender ran (its unpark may land here).
                while !sender.is_finished() {
                    thread::park_timeout(Duration::from_millis(1));
                }
            });
            // Return Pending once without arranging a wake: only the sender's earlier
            // wake of the outer future can get it polled again.
            let mut yielded = false;
            std::future::poll_fn(|_| {
                if yielded {
                    return Poll::Ready(());
                }
                yielded = true;
                Poll::Pending
            })
            .await;
            outer.await.expect("sent");
        });
        assert!(started.elapsed() < Duration::from_secs(10), "the outer wake-up was not lost");
    }
}
