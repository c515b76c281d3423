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
    /// Each waiting [`Changed`]'s key and waker. A `Changed` dropped before a
    /// notification (a long poll or a subscription page whose wait ran out) takes its
    /// entry out, so an idle stream's list holds only futures still waiting.
    waiters: RefCell<Vec<(u64, Waker)>>,
    next_key: Cell<u64>,
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
        // Taken out before waking: a waker may run code that registers again.
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for (_, waker) in waiters {
            waker.wake();
        }
    }

    /// Completes once the generation differs from `seen`.
    pub fn changed(&self, seen: u64) -> Changed<'_> {
        Changed { notify: self, seen, key: None }
    }
}

/// The future of [`Notify::changed`].
pub struct Changed<'a> {
    notify: &'a Notify,
    seen: u64,
    /// Its entry in the waiters, once it has waited.
    key: Option<u64>,
}

impl Future for Changed<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.notify.generation.get() != this.seen {
            return Poll::Ready(());
        }
        let mut waiters = this.notify.waiters.borrow_mut();
        match this.key {
            // Polled again before a notification: its entry is still there.
            Some(key) => {
                if let Some((_, waker)) = waiters.iter_mut().find(|(k, _)| *k == key)
                    && !waker.will_wake(cx.waker())
                {
                    waker.clone_from(cx.waker());
                }
            }
            None => {
                let key = this.notify.next_key.get();
                this.notify.next_key.set(key + 1);
                waiters.push((key, cx.waker().clone()));
                this.key = Some(key);
            }
        }
        Poll::Pending
    }
}

impl Drop for Changed<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            // Gone already when a notification took the list.
            self.notify.waiters.borrow_mut().retain(|(k, _)| *k != key);
        }
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
        assert_eq!(notify.waiters.borrow().len(), 1);
        notify.notify();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(changed.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn a_wait_given_up_leaves_no_waker_behind() {
        let notify = Notify::new();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        // Long polls that time out on an idle stream, one after the other.
        for _ in 0..1000 {
            let mut changed = std::pin::pin!(notify.changed(notify.generation()));
            assert!(changed.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(notify.waiters.borrow().len(), 0);
        // Two waits of one task: giving up one keeps the other's wake-up.
        let seen = notify.generation();
        let mut kept = Box::pin(notify.changed(seen));
        let mut given_up = Box::pin(notify.changed(seen));
        assert!(kept.as_mut().poll(&mut cx).is_pending());
        assert!(given_up.as_mut().poll(&mut cx).is_pending());
        drop(given_up);
        notify.notify();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(kept.as_mut().poll(&mut cx).is_ready());
    }
}
