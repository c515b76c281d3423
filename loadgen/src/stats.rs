//! Latency histograms and throughput counters. Each worker records into histograms of its
//! own; they are merged by adding counts (never by averaging percentiles). Per-second
//! interval histograms (for the HdrHistogram log and the report's plots) are added into a
//! shared slot once per second per worker, so no lock is taken per sample.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hdrhistogram::Histogram;

/// Latencies are recorded in microseconds, from 1 µs to an hour, 3 significant digits.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("the bounds are valid constants")
}

/// Interval histograms of one measure, one per second since the run started; shared by
/// every worker.
pub struct Intervals {
    seconds: Mutex<Vec<Histogram<u64>>>,
}

impl Intervals {
    pub fn new() -> Self {
        Self { seconds: Mutex::new(Vec::new()) }
    }

    fn add(&self, second: usize, h: &Histogram<u64>) {
        let mut seconds = self.seconds.lock().unwrap_or_else(|e| e.into_inner());
        while seconds.len() <= second {
            seconds.push(histogram());
        }
        seconds[second].add(h).expect("histograms of the same bounds add");
    }

    pub fn take(&self) -> Vec<Histogram<u64>> {
        std::mem::take(&mut *self.seconds.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Default for Intervals {
    fn default() -> Self {
        Self::new()
    }
}

/// One worker's recorder of one measure: the measured total and the current second.
pub struct Series<'a> {
    /// Samples inside the measured window.
    pub total: Histogram<u64>,
    current: Histogram<u64>,
    current_second: usize,
    intervals: &'a Intervals,
}

impl<'a> Series<'a> {
    pub fn new(intervals: &'a Intervals) -> Self {
        Self { total: histogram(), current: histogram(), current_second: 0, intervals }
    }

    /// Records a latency whose reference time (the intended send time) fell in `second`
    /// of the run; `measured` says whether that time was inside the measured window.
    pub fn record(&mut self, second: usize, latency_us: u64, measured: bool) {
        let latency_us = latency_us.max(1);
        if second != self.current_second {
            self.flush();
            self.current_second = second;
        }
        self.current.saturating_record(latency_us);
        if measured {
            self.total.saturating_record(latency_us);
        }
    }

    fn flush(&mut self) {
        if !self.current.is_empty() {
            self.intervals.add(self.current_second, &self.current);
            self.current.reset();
        }
    }

    /// Adds the last second into the shared intervals; the measured total.
    pub fn finish(mut self) -> Histogram<u64> {
        self.flush();
        std::mem::replace(&mut self.total, histogram())
    }
}

/// Per-second counts shared by every worker (a fixed number of seconds; later ones fold
/// into the last).
pub struct Timeline {
    pub acked_records: Vec<AtomicU64>,
    pub acked_bytes: Vec<AtomicU64>,
    pub delivered_records: Vec<AtomicU64>,
}

impl Timeline {
    pub fn new(seconds: usize) -> Self {
        let zeros = || (0..seconds.max(1)).map(|_| AtomicU64::new(0)).collect();
        Self { acked_records: zeros(), acked_bytes: zeros(), delivered_records: zeros() }
    }

    fn slot(counters: &[AtomicU64], second: usize) -> &AtomicU64 {
        &counters[second.min(counters.len() - 1)]
    }

    pub fn acked(&self, second: usize, records: u64, bytes: u64) {
        Self::slot(&self.acked_records, second).fetch_add(records, Ordering::Relaxed);
        Self::slot(&self.acked_bytes, second).fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn delivered(&self, second: usize, records: u64) {
        Self::slot(&self.delivered_records, second).fetch_add(records, Ordering::Relaxed);
    }

    pub fn snapshot(counters: &[AtomicU64], seconds: usize) -> Vec<u64> {
        counters.iter().take(seconds).map(|c| c.load(Ordering::Relaxed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_merge_by_adding_counts() {
        let intervals = Intervals::new();
        let mut a = Series::new(&intervals);
        let mut b = Series::new(&intervals);
        for us in 1..=100 {
            a.record(0, us, true);
        }
        for us in 1..=100 {
            b.record(1, us * 1000, us > 50);
        }
        let mut total = a.finish();
        total.add(b.finish()).unwrap();
        assert_eq!(total.len(), 150);
        let seconds = intervals.take();
        assert_eq!(seconds.len(), 2);
        assert_eq!(seconds[0].len(), 100);
        assert_eq!(seconds[1].len(), 100);
        assert!(seconds[1].value_at_quantile(0.5) >= 49_000);
    }
}
