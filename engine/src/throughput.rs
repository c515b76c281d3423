//! The per-stream throughput cap: a token bucket over content bytes
//! (`throughput_max_bytes_per_second`, producers.md). An append over the cap is refused
//! with a retry hint, never delayed: the server holds no unbounded queue for it.

use crate::error::{Error, Result};

/// A token bucket holding at most one second of the rate.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    /// Bytes per second; 0 = unlimited.
    rate: u64,
    tokens: f64,
    updated_ms: u64,
}

impl TokenBucket {
    /// A full bucket for `rate` bytes per second (0 = unlimited).
    pub fn new(rate: u64, now_ms: u64) -> Self {
        Self { rate, tokens: rate as f64, updated_ms: now_ms }
    }

    /// Changes the rate (ReconfigureStream); the bucket keeps what it holds, capped.
    pub fn set_rate(&mut self, rate: u64, now_ms: u64) {
        self.refill(now_ms);
        // A stream that was unlimited starts its cap with a full bucket, as a new one does.
        self.tokens = if self.rate == 0 { rate as f64 } else { self.tokens.min(rate as f64) };
        self.rate = rate;
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed_ms = now_ms.saturating_sub(self.updated_ms);
        self.updated_ms = self.updated_ms.max(now_ms);
        self.tokens =
            (self.tokens + self.rate as f64 * elapsed_ms as f64 / 1000.0).min(self.rate as f64);
    }

    /// Whether `bytes` may pass now. Checking takes nothing; [`TokenBucket::take`] does,
    /// once every other check of the append has passed.
    ///
    /// A batch larger than one second of the rate passes when the bucket is full, and
    /// leaves it in debt: otherwise it could never pass at all.
    pub fn check(&mut self, bytes: u64, now_ms: u64) -> Result<()> {
        if self.rate == 0 {
            return Ok(());
        }
        self.refill(now_ms);
        let full = self.tokens >= self.rate as f64;
        if self.tokens >= bytes as f64 || full {
            return Ok(());
        }
        let missing = bytes.min(self.rate) as f64 - self.tokens;
        let retry_after_ms = (missing * 1000.0 / self.rate as f64).ceil().max(1.0) as u64;
        Err(Error::ThroughputExceeded { limit_bytes_per_second: self.rate, retry_after_ms })
    }

    /// Takes `bytes` (after a successful [`TokenBucket::check`]).
    pub fn take(&mut self, bytes: u64) {
        if self.rate != 0 {
            self.tokens -= bytes as f64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_always_passes() {
        let mut bucket = TokenBucket::new(0, 0);
        assert_eq!(bucket.check(u64::MAX, 0), Ok(()));
    }

    #[test]
    fn refuses_over_the_rate_with_a_hint_and_refills() {
        let mut bucket = TokenBucket::new(1000, 0);
        bucket.check(600, 0).expect("fits");
        bucket.take(600);
        let err = bucket.check(600, 0).expect_err("400 left");
        assert_eq!(
            err,
            Error::ThroughputExceeded { limit_bytes_per_second: 1000, retry_after_ms: 200 }
        );
        assert_eq!(err.retry_after_ms(), Some(200));
        bucket.check(600, 200).expect("refilled 200 bytes in 200 ms");
    }

    #[test]
    fn a_batch_larger_than_a_second_passes_when_full_then_leaves_debt() {
        let mut bucket = TokenBucket::new(1000, 0);
        bucket.check(5000, 0).expect("full bucket");
        bucket.take(5000);
        assert!(bucket.check(1, 1000).is_err(), "still 3000 bytes in debt after a second");
        bucket.check(1, 5000).expect("debt repaid and refilled");
    }

    #[test]
    fn capping_an_unlimited_stream_starts_full() {
        let mut bucket = TokenBucket::new(0, 0);
        bucket.set_rate(100, 0);
        bucket.check(100, 0).expect("full");
        bucket.take(100);
        assert!(bucket.check(1, 0).is_err());
    }

    #[test]
    fn lowering_the_rate_caps_the_tokens() {
        let mut bucket = TokenBucket::new(1000, 0);
        bucket.set_rate(10, 0);
        assert!(bucket.check(11, 0).is_ok(), "full bucket passes one oversize batch");
        bucket.take(11);
        assert!(bucket.check(1, 0).is_err());
    }
}
