//! How the S3 backend spends time on a request: a timeout per attempt that grows with the
//! bytes moved, a bounded number of attempts, capped exponential backoff with jitter
//! between them, and the multipart sizes. aws-sdk-s3's own retries are off: its
//! defaults (3 attempts, 1 s initial backoff) are too slow for appends that wait on a
//! PUT, and one policy in one place is easier to reason about.
//!
//! This module decides when to try again; it never decides what is worth retrying
//! (the caller classifies each failure as transient or final).

use std::future::Future;
use std::time::{Duration, Instant};

use crate::error::Cause;

/// The S3 backend's timing and sizing knobs; [`Default`] is every knob's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferPolicy {
    /// Time one attempt may take before its bytes are counted (`--s3-attempt-timeout-ms`).
    pub attempt_timeout: Duration,
    /// Slowest transfer an attempt is allowed: it gets one more second per this many
    /// bytes it sends or receives (`--s3-transfer-bytes-per-second-min`).
    pub transfer_bytes_per_second_min: u64,
    /// Attempts per request, the first included (`--s3-attempts-max`).
    pub attempts_max: u32,
    /// Backoff ceiling before the second attempt; doubles per attempt
    /// (`--s3-backoff-initial-ms`).
    pub backoff_initial: Duration,
    /// Largest backoff ceiling (`--s3-backoff-max-ms`).
    pub backoff_max: Duration,
    /// Objects larger than this are written with a multipart upload
    /// (`--s3-multipart-threshold-bytes`).
    pub multipart_threshold_bytes: u64,
    /// Size of each part but the last (`--s3-multipart-part-bytes`).
    pub multipart_part_bytes: u64,
    /// Parts of one upload in flight at once (`--s3-multipart-concurrency`).
    pub multipart_concurrency: usize,
}

/// S3's smallest part (every part but the last).
pub(crate) const PART_BYTES_MIN: u64 = 5 << 20;
/// S3's largest part.
pub(crate) const PART_BYTES_MAX: u64 = 5 << 30;
/// S3's most parts in one upload.
pub(crate) const PARTS_MAX: u64 = 10_000;
/// S3's largest single PUT.
pub(crate) const SINGLE_PUT_BYTES_MAX: u64 = 5 << 30;

impl Default for TransferPolicy {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_millis(tuning::S3_ATTEMPT_TIMEOUT_MS.default),
            transfer_bytes_per_second_min: tuning::S3_TRANSFER_BYTES_PER_SECOND_MIN.default,
            attempts_max: count(tuning::S3_ATTEMPTS_MAX.default),
            backoff_initial: Duration::from_millis(tuning::S3_BACKOFF_INITIAL_MS.default),
            backoff_max: Duration::from_millis(tuning::S3_BACKOFF_MAX_MS.default),
            multipart_threshold_bytes: tuning::S3_MULTIPART_THRESHOLD_BYTES.default,
            multipart_part_bytes: tuning::S3_MULTIPART_PART_BYTES.default,
            multipart_concurrency: count(tuning::S3_MULTIPART_CONCURRENCY.default) as usize,
        }
    }
}

/// A count knob as a `u32`; the knobs' ranges are far below `u32::MAX`.
fn count(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

impl TransferPolicy {
    /// Every knob from its environment variable, else its default; refused when a value
    /// is out of its range.
    pub fn from_env() -> Result<Self, tuning::TuningError> {
        let ms = |knob: tuning::Knob| knob.resolve(None).map(Duration::from_millis);
        let policy = Self {
            attempt_timeout: ms(tuning::S3_ATTEMPT_TIMEOUT_MS)?,
            transfer_bytes_per_second_min: tuning::S3_TRANSFER_BYTES_PER_SECOND_MIN
                .resolve(None)?,
            attempts_max: count(tuning::S3_ATTEMPTS_MAX.resolve(None)?),
            backoff_initial: ms(tuning::S3_BACKOFF_INITIAL_MS)?,
            backoff_max: ms(tuning::S3_BACKOFF_MAX_MS)?,
            multipart_threshold_bytes: tuning::S3_MULTIPART_THRESHOLD_BYTES.resolve(None)?,
            multipart_part_bytes: tuning::S3_MULTIPART_PART_BYTES.resolve(None)?,
            multipart_concurrency: count(tuning::S3_MULTIPART_CONCURRENCY.resolve(None)?) as usize,
        };
        policy.check().map_err(|message| tuning::TuningError { message })?;
        Ok(policy)
    }

    /// Refuses combinations S3 or this backend cannot work with; the message names the
    /// knob.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.attempts_max == 0 {
            return Err("--s3-attempts-max: at least one attempt".into());
        }
        if self.attempt_timeout.is_zero() {
            return Err("--s3-attempt-timeout-ms: must be above 0".into());
        }
        if self.transfer_bytes_per_second_min == 0 {
            return Err("--s3-transfer-bytes-per-second-min: must be above 0".into());
        }
        if self.backoff_initial > self.backoff_max {
            return Err(format!(
                "--s3-backoff-initial-ms ({} ms) is above --s3-backoff-max-ms ({} ms)",
                self.backoff_initial.as_millis(),
                self.backoff_max.as_millis()
            ));
        }
        if !(PART_BYTES_MIN..=PART_BYTES_MAX).contains(&self.multipart_part_bytes) {
            return Err(format!(
                "--s3-multipart-part-bytes: S3 parts are {PART_BYTES_MIN} to {PART_BYTES_MAX} \
                 bytes, not {}",
                self.multipart_part_bytes
            ));
        }
        if !(self.multipart_part_bytes..=SINGLE_PUT_BYTES_MAX)
            .contains(&self.multipart_threshold_bytes)
        {
            return Err(format!(
                "--s3-multipart-threshold-bytes ({}) must be from --s3-multipart-part-bytes \
                 ({}) to {SINGLE_PUT_BYTES_MAX}, S3's largest single PUT",
                self.multipart_threshold_bytes, self.multipart_part_bytes
            ));
        }
        if self.multipart_concurrency == 0 {
            return Err("--s3-multipart-concurrency: at least one part at a time".into());
        }
        Ok(())
    }

    /// The timeout of one attempt that moves `bytes` bytes: the base, plus the time
    /// those bytes take at the slowest rate allowed.
    pub(crate) fn attempt_timeout_for(&self, bytes: u64) -> Duration {
        let transfer_ms =
            u128::from(bytes) * 1000 / u128::from(self.transfer_bytes_per_second_min.max(1));
        self.attempt_timeout
            .saturating_add(Duration::from_millis(u64::try_from(transfer_ms).unwrap_or(u64::MAX)))
    }

    /// The pause before retry `retry` (0 before the second attempt): "equal jitter", a
    /// random point in the upper half of a ceiling that doubles from `backoff_initial`
    /// up to `backoff_max`. Half fixed keeps a failing store from being hammered; half
    /// random spreads concurrent retries apart.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let ceiling = self
            .backoff_initial
            .saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .min(self.backoff_max);
        let half = ceiling / 2;
        let jitter_nanos = u64::try_from((ceiling - half).as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(fastrand::u64(0..=jitter_nanos))
    }
}

/// How one attempt ended, when it did not succeed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// May succeed if tried again (network, timeout, 5xx, throttling).
    Transient(String),
    /// Will not succeed if tried again.
    Final(Cause),
}

/// What a retried request came to, and whether an attempt before the last one may have
/// taken effect on the store without our hearing of it (a create-only put needs this to
/// tell its own write from someone else's).
pub(crate) struct Retried<T> {
    pub result: Result<T, Cause>,
    /// Attempts that failed transiently: each may have been applied by the store.
    pub unclear_attempts: u32,
}

/// Runs `attempt` until it succeeds, fails for good, or the policy's attempts are spent;
/// each attempt is cut off after `timeout` (`None`: the attempt times itself).
pub(crate) async fn retry<T, F, Fut>(
    policy: &TransferPolicy,
    timeout: Option<Duration>,
    mut attempt: F,
) -> Retried<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let started = Instant::now();
    let mut last = String::from("no attempt made");
    for n in 0..policy.attempts_max {
        if n > 0 {
            tokio::time::sleep(policy.backoff(n - 1)).await;
        }
        let unclear_attempts = n;
        let ended = match timeout {
            Some(limit) => tokio::time::timeout(limit, attempt()).await.map_err(|_| limit),
            None => Ok(attempt().await),
        };
        match ended {
            Ok(Ok(value)) => return Retried { result: Ok(value), unclear_attempts },
            Ok(Err(Failure::Final(cause))) => {
                return Retried { result: Err(cause), unclear_attempts };
            }
            Ok(Err(Failure::Transient(why))) => last = why,
            Err(limit) => last = format!("the attempt timed out after {} ms", limit.as_millis()),
        }
    }
    Retried {
        result: Err(Cause::Exhausted {
            attempts: policy.attempts_max,
            elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            last,
        }),
        unclear_attempts: policy.attempts_max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> TransferPolicy {
        TransferPolicy {
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(100),
            ..TransferPolicy::default()
        }
    }

    #[test]
    fn defaults_pass_their_own_check() {
        assert_eq!(TransferPolicy::default().check(), Ok(()));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_in_the_upper_half() {
        let policy = policy();
        for _ in 0..1000 {
            for (retry, ceiling_ms) in [(0, 10), (1, 20), (2, 40), (3, 80), (4, 100), (40, 100)] {
                let pause = policy.backoff(retry);
                let ceiling = Duration::from_millis(ceiling_ms);
                assert!(pause >= ceiling / 2 && pause <= ceiling, "retry {retry}: {pause:?}");
            }
        }
    }

    #[test]
    fn attempt_timeout_grows_with_bytes() {
        let policy = TransferPolicy {
            attempt_timeout: Duration::from_millis(500),
            transfer_bytes_per_second_min: 1 << 20,
            ..TransferPolicy::default()
        };
        assert_eq!(policy.attempt_timeout_for(0), Duration::from_millis(500));
        assert_eq!(policy.attempt_timeout_for(2 << 20), Duration::from_millis(2500));
    }

    #[test]
    fn check_refuses_what_s3_cannot_do() {
        let bad = [
            TransferPolicy { attempts_max: 0, ..TransferPolicy::default() },
            TransferPolicy { multipart_part_bytes: 1 << 20, ..TransferPolicy::default() },
            TransferPolicy {
                multipart_part_bytes: 8 << 20,
                multipart_threshold_bytes: 6 << 20,
                ..TransferPolicy::default()
            },
            TransferPolicy { multipart_concurrency: 0, ..TransferPolicy::default() },
            TransferPolicy { backoff_initial: Duration::from_secs(9), ..policy() },
        ];
        for policy in bad {
            assert!(policy.check().is_err(), "{policy:?}");
        }
    }

    #[test]
    fn retry_stops_at_final_failures_and_counts_unclear_attempts() {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
        let policy = TransferPolicy { attempts_max: 4, ..policy() };
        let mut calls = 0;
        let done = runtime.block_on(retry(&policy, Some(Duration::from_secs(5)), || {
            calls += 1;
            let this = calls;
            async move {
                match this {
                    1 | 2 => Err(Failure::Transient("flaky".into())),
                    _ => Ok(this),
                }
            }
        }));
        assert_eq!(done.result.ok(), Some(3));
        assert_eq!(done.unclear_attempts, 2);

        let mut calls = 0;
        let gave_up = runtime.block_on(retry(&policy, Some(Duration::from_secs(5)), || {
            calls += 1;
            async { Err::<(), _>(Failure::Transient("down".into())) }
        }));
        assert_eq!(calls, 4);
        match gave_up.result {
            Err(Cause::Exhausted { attempts: 4, last, .. }) => assert_eq!(last, "down"),
            other => panic!("expected exhaustion, got {other:?}"),
        }

        let stopped = runtime.block_on(retry(&policy, Some(Duration::from_secs(5)), || async {
            Err::<(), _>(Failure::Final(Cause::NotFound))
        }));
        assert!(matches!(stopped.result, Err(Cause::NotFound)));
    }

    #[test]
    fn a_slow_attempt_is_cut_off_and_retried() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        let policy = TransferPolicy { attempts_max: 2, ..policy() };
        let mut calls = 0;
        let done = runtime.block_on(retry(&policy, Some(Duration::from_millis(50)), || {
            calls += 1;
            let this = calls;
            async move {
                if this == 1 {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                Ok::<_, Failure>(this)
            }
        }));
        assert_eq!(done.result.ok(), Some(2));
        assert_eq!(done.unclear_attempts, 1);
    }
}
