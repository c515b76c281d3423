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
