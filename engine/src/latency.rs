//! Latency histograms with fixed buckets: a few adds to record on a shard, plain data to
//! copy into its stats, and what `/metrics` renders as Prometheus histograms.

use std::time::Duration;

/// The buckets' upper bounds in microseconds, from 100 µs to 10 s; slower observations
/// are only in the count (Prometheus' `+Inf` bucket).
pub const BOUNDS_MICROS: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Observations of one latency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    /// Observations above the previous bound and at most this one.
    pub buckets: [u64; BOUNDS_MICROS.len()],
    pub count: u64,
    pub sum_micros: u64,
}

impl Latency {
    pub fn record(&mut self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.count += 1;
        self.sum_micros = self.sum_micros.saturating_add(micros);
        if let Some(bucket) = BOUNDS_MICROS.iter().position(|&bound| micros <= bound) {
            self.buckets[bucket] += 1;
        }
    }

    /// Observations at most each bound (Prometheus' cumulative `le` buckets).
    pub fn cumulative(&self) -> [u64; BOUNDS_MICROS.len()] {
        let mut running = 0;
        self.buckets.map(|n| {
            running += n;
            running
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_whose_bound_they_do_not_pass() {
        let mut latency = Latency::default();
        for micros in [0, 100, 101, 250, 10_000_000, 10_000_001] {
            latency.record(Duration::from_micros(micros));
        }
        assert_eq!(latency.count, 6);
        assert_eq!(latency.sum_micros, 20_000_452);
        assert_eq!(&latency.buckets[..3], &[2, 2, 0]);
        assert_eq!(latency.buckets[15], 1, "10 s is in the last bucket");
        let cumulative = latency.cumulative();
        assert_eq!(cumulative[0], 2);
        assert_eq!(cumulative[1], 4);
        assert_eq!(cumulative[15], 5, "above 10 s only the count has it");
        assert!(cumulative.windows(2).all(|w| w[0] <= w[1]));
    }
}
