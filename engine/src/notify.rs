//! `Notify`: wakes every task of one shard waiting for a stream to change (new durable
//! records, deletion) or for work to appear (the flusher).
//!
//! Single-threaded by design (`Rc`, `Cell`): it lives on its shard's executor and is
//! never touched from another thread. No lost wake-ups: a waiter takes the generation
//! *before* it checks its condition, and [`Notify::changed`] completes as soon as the
//! generation has moved past it, even if the notification happened in between.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A generation counter with waiters.
#[derive(Default)]
pub struct Notify {
    generation: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

impl Notify {
    pub fn new() -> Self {
        Self::default()
    }

    /// The current generation: take it before checking the condition you wait on.
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// Wakes every waiter.
    pub fn notify(&self) {
        self.generation.set(self.generation.get() + 1);
        for waker in self.waiters.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Completes once the generation differs from `seen`.
    pub fn changed(&self, seen: u64) -> Changed<'_> {
        Changed { notify: self, seen }
    }
}

/// The future of [`Notify::changed`].
pub struct Changed<'a> {
    notify: &'a Notify,
    seen: u64,
}

impl Future for Changed<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.notify.generation.get() != self.seen {
            return Poll::Ready(());
        }
        let mut waiters = self.notify.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_notification_between_check_and_wait_is_not_lost() {
        let notify = Notify::new();
        let seen = notify.generation();
        notify.notify(); // lands after the waiter checked its condition, before it waits
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let mut changed = std::pin::pin!(notify.changed(seen));
        assert!(changed.as_mut().poll(&mut Context::from_waker(&waker)).is_ready());
    }

    #[test]
    fn waiters_are_woken_once_per_notification() {
        let notify = Notify::new();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let mut changed = std::pin::pin!(notify.changed(notify.generation()));
        let mut cx = Context::from_waker(&waker);
        assert!(changed.as_mut().poll(&mut cx).is_pending());
        assert!(changed.as_mut().poll(&mut cx).is_pending(), "re-polling registers once");
        notify.notify();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(changed.as_mut().poll(&mut cx).is_ready());
    }
}
