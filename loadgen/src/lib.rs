//! nova's load generator: producers that append on a fixed schedule (open loop) or as
//! fast as acknowledgements come back (closed loop), consumers that follow the tail, a
//! read-back that measures catch-up throughput and verifies every acknowledged record,
//! and reports (summary table, JSON, HdrHistogram log, SVG or HTML).
//!
//! It speaks to the server only through `net::client` (the Rust client), as users do. It
//! never reaches into a server's data directory, and nothing here asserts a time: the
//! figures are measurements, the verification is the only pass or fail.
//!
//! Latency is measured from the intended send time (the schedule's, in open loop), so a
//! stall of the server or of loadgen itself shows in the figures instead of silently
//! delaying the next send (coordinated omission).

pub mod config;
pub mod consumer;
pub mod interrupt;
pub mod payload;
pub mod producer;
pub mod report;
pub mod run;
pub mod spawn;
pub mod stats;
pub mod verify;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The wait between tries to get a failed connection back (a producer reopening its
/// append session, a follower its subscription): 20 ms, doubled after each failed try
/// up to 500 ms, back to 20 ms once it works.
#[derive(Clone, Copy, Debug)]
pub struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(20);
    const MAX: Duration = Duration::from_millis(500);

    pub fn new() -> Self {
        Backoff(Self::FIRST)
    }

    /// The wait before the next try; the one after it is longer.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (wait * 2).min(Self::MAX);
        wait
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Nanoseconds since the Unix epoch, now.
pub fn unix_now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The run's clock: one monotonic base mapped once to Unix time, so intended send times
/// written into records and delivery times compare on one scale.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub start: Instant,
    pub start_unix_ns: u64,
    /// Measuring starts here (after the warm-up) ...
    pub measure_from: Instant,
    /// ... and sending stops here.
    pub end: Instant,
}

impl Clock {
    pub fn new(warmup: Duration, duration: Duration) -> Self {
        let start = Instant::now();
        Self {
            start,
            start_unix_ns: unix_now_ns(),
            measure_from: start + warmup,
            end: start + warmup + duration,
        }
    }

    pub fn unix_ns(&self, at: Instant) -> u64 {
        self.start_unix_ns + at.saturating_duration_since(self.start).as_nanos() as u64
    }

    /// The second of the run `at` falls in.
    pub fn second(&self, at: Instant) -> usize {
        at.saturating_duration_since(self.start).as_secs() as usize
    }

    pub fn second_of_unix(&self, unix_ns: u64) -> usize {
        (unix_ns.saturating_sub(self.start_unix_ns) / 1_000_000_000) as usize
    }

    pub fn measured(&self, at: Instant) -> bool {
        at >= self.measure_from && at < self.end
    }

    pub fn measured_unix(&self, unix_ns: u64) -> bool {
        unix_ns >= self.unix_ns(self.measure_from) && unix_ns < self.unix_ns(self.end)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Backoff;

    #[test]
    fn a_backoff_doubles_up_to_its_cap() {
        let mut backoff = Backoff::new();
        let waits: Vec<u64> = (0..7).map(|_| backoff.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [20, 40, 80, 160, 320, 500, 500]);
        assert_eq!(Backoff::new().next_wait(), Duration::from_millis(20));
    }
}
