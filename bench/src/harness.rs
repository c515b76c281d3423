//! Timing: each case runs for a fixed wall-clock budget several times over; the best
//! pass counts (the least disturbed by the rest of the machine), and every case is
//! reported as bytes per second and as a ratio to its reference.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// How long to measure each case, and how many passes.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub pass: Duration,
    pub passes: u32,
}

impl Budget {
    pub fn new(quick: bool) -> Self {
        if quick {
            Self { pass: Duration::from_millis(5), passes: 1 }
        } else {
            Self { pass: Duration::from_millis(300), passes: 5 }
        }
    }
}

/// Bytes per second of the best pass of `op`, which processes `bytes` per call.
pub fn throughput(budget: Budget, bytes: u64, mut op: impl FnMut()) -> f64 {
    op(); // warm caches and allocations
    let mut best = 0f64;
    for _ in 0..budget.passes {
        let start = Instant::now();
        let mut calls = 0u64;
        while start.elapsed() < budget.pass || calls == 0 {
            op();
            calls += 1;
        }
        let rate = (bytes * calls) as f64 / start.elapsed().as_secs_f64();
        best = best.max(rate);
    }
    black_box(best)
}

/// One row of a report.
pub struct Row {
    pub case: String,
    pub bytes_per_second: f64,
    pub reference_per_second: f64,
}

/// Prints rows as a markdown table: case, GB/s, reference GB/s, ratio.
pub fn print_table(title: &str, reference: &str, rows: &[Row]) {
    println!("\n### {title}\n");
    println!("| case | GB/s | {reference} GB/s | ratio |");
    println!("|---|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} |",
            row.case,
            row.bytes_per_second / 1e9,
            row.reference_per_second / 1e9,
            row.bytes_per_second / row.reference_per_second
        );
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Percentiles {
    pub p50: u64,
    pub p99: u64,
}

impl Percentiles {
    pub fn of(histogram: &hdrhistogram::Histogram<u64>) -> Self {
        Self { p50: histogram.value_at_quantile(0.50), p99: histogram.value_at_quantile(0.99) }
    }
}
