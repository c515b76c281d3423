//! Timing: each case runs for a fixed wall-clock budget several times over; the best
//! pass counts (the least disturbed by the rest of the machine), and every case is
//! reported as bytes per second and as a ratio to its reference.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

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
    pub p999: u64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Self {
        Self {
            p50: histogram.value_at_quantile(0.50),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
        }
    }
}

/// What closed-loop producers did in the measured time.
pub struct ClosedLoop {
    /// Operations acknowledged, each timed in `latency` (microseconds).
    pub acked: u64,
    /// Operations the server refused (not timed).
    pub refused: u64,
    /// The longest producer's measured time.
    pub elapsed: Duration,
    pub latency: Histogram<u64>,
}

impl ClosedLoop {
    /// `per_ack` (bytes, records...) times the acknowledged operations, per second.
    pub fn rate(&self, per_ack: u64) -> f64 {
        self.total(per_ack) / self.elapsed.as_secs_f64()
    }

    /// `per_ack` times the acknowledged operations.
    pub fn total(&self, per_ack: u64) -> f64 {
        (self.acked * per_ack) as f64
    }
}

/// What one turn of a closed-loop producer came to.
pub enum Turn {
    /// One operation acknowledged; its latency is the turn's.
    Acked,
    /// One operation acknowledged, this long after it was sent: a pipelined producer's
    /// turn sends one and takes the oldest one's acknowledgement.
    AckedAfter(Duration),
    /// Refused (a throttle, a full server): counted, not timed.
    Refused,
    /// Sent, with nothing acknowledged yet (a pipeline filling): not counted.
    Sent,
}

impl From<bool> for Turn {
    /// A request waited for: `true` when acknowledged, `false` when refused.
    fn from(acked: bool) -> Self {
        if acked { Turn::Acked } else { Turn::Refused }
    }
}

/// How long a closed loop warms up before it measures: at least `min`, then until
/// `warm` says what is measured has reached its steady state (asked every 50 ms), at
/// most `max`.
pub struct Warmup<'a> {
    pub min: Duration,
    pub max: Duration,
    pub warm: &'a dyn Fn() -> bool,
}

impl Warmup<'static> {
    /// Exactly `time`.
    pub fn fixed(time: Duration) -> Self {
        Warmup { min: time, max: time, warm: &|| true }
    }
}

/// Runs `producers` closed loops, each on its own thread calling the operation
/// `make(producer)` returns (one request, waiting for its answer: `true` when
/// acknowledged, `false` when refused; or a [`Turn`]) back to back: through `warmup`,
/// then, once every producer is warm, for `measure`. `at_start` runs just as the
/// measured time starts.
pub fn closed_loop<F, T>(
    producers: usize,
    warmup: Warmup<'_>,
    measure: Duration,
    make: impl Fn(usize) -> F,
    at_start: impl FnOnce(),
) -> ClosedLoop
where
    F: FnMut() -> T + Send + 'static,
    T: Into<Turn>,
{
    let gate = Arc::new(Barrier::new(producers + 1));
    let warm = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..producers)
        .map(|producer| {
            let (mut op, gate, warm) = (make(producer), Arc::clone(&gate), Arc::clone(&warm));
            thread::spawn(move || {
                while !warm.load(Ordering::Relaxed) {
                    op();
                }
                gate.wait();
                let mut latency = Histogram::<u64>::new(3).expect("histogram");
                let (mut acked, mut refused) = (0u64, 0u64);
                let started = Instant::now();
                while started.elapsed() < measure {
                    let sent = Instant::now();
                    let took = match op().into() {
                        Turn::Acked => sent.elapsed(),
                        Turn::AckedAfter(took) => took,
                        Turn::Refused => {
                            refused += 1;
                            continue;
                        }
                        Turn::Sent => continue,
                    };
                    latency.record(took.as_micros() as u64).expect("in range");
                    acked += 1;
                }
                ClosedLoop { acked, refused, elapsed: started.elapsed(), latency }
            })
        })
        .collect();
    let warming = Instant::now();
    thread::sleep(warmup.min);
    while warming.elapsed() < warmup.max && !(warmup.warm)() {
        thread::sleep(Duration::from_millis(50).min(warmup.max.saturating_sub(warming.elapsed())));
    }
    warm.store(true, Ordering::Relaxed);
    gate.wait();
    at_start();
    let mut all = ClosedLoop {
        acked: 0,
        refused: 0,
        elapsed: Duration::ZERO,
        latency: Histogram::<u64>::new(3).expect("histogram"),
    };
    for thread in threads {
        let one = thread.join().expect("producer");
        all.acked += one.acked;
        all.refused += one.refused;
        all.elapsed = all.elapsed.max(one.elapsed);
        all.latency.add(&one.latency).expect("same precision");
    }
    all
}

/// CPU time (user and system, all threads) a process has used so far: `pid`, or this
/// process when `None`. From `/proc/<pid>/stat`, in clock ticks (10 ms here); what a
/// case spends is the difference of two readings around it.
pub fn cpu_time(pid: Option<u32>) -> Duration {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    // The command name (field 2) is in parentheses and may hold spaces: count from after
    // it. utime and stime are fields 14 and 15, the 12th and 13th after the name.
    let after_name = &stat[stat.rfind(')').expect("a stat line names its command") + 1..];
    let ticks: u64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|field| field.parse::<u64>().expect("utime and stime are counts"))
        .sum();
    // SAFETY: sysconf(3) reads a configuration value; no memory is involved.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_second = u64::try_from(per_second).expect("a positive clock tick rate");
    Duration::from_micros(ticks * 1_000_000 / per_second)
}

/// The block device a path lives on, whose bytes written `/proc/diskstats` counts for
/// every process on the machine (the server's journal and objects, their writeback).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disk {
    major: u32,
    minor: u32,
}

impl Disk {
    /// The device holding `path`; `None` on a file system with no device of its own
    /// (tmpfs, overlay), whose writes no device counts.
    pub fn of(path: &std::path::Path) -> Option<Disk> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(path).ok()?.dev();
        let disk = Disk { major: libc::major(dev), minor: libc::minor(dev) };
        (disk.major != 0 && disk.bytes_written().is_some()).then_some(disk)
    }

    /// Bytes written to the device since boot (sectors of 512 bytes, field 10).
    pub fn bytes_written(&self) -> Option<u64> {
        let stats = std::fs::read_to_string("/proc/diskstats").ok()?;
        parse_sectors_written(&stats, self.major, self.minor).map(|sectors| sectors * 512)
    }
}

fn parse_sectors_written(diskstats: &str, major: u32, minor: u32) -> Option<u64> {
    diskstats.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let ours =
            fields.len() > 9 && fields[0].parse() == Ok(major) && fields[1].parse() == Ok(minor);
        ours.then(|| fields[9].parse().ok()).flatten()
    })
}

/// CPU seconds spent per GB (10^9 bytes) moved.
pub fn cpu_per_gb(cpu: Duration, bytes: f64) -> f64 {
    cpu.as_secs_f64() / (bytes / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_writes_are_read_from_the_line_of_the_device() {
        let stats = "\
 253       0 vda 100 0 800 10 200 0 4096 20 0 30 30 0 0 0 0
 253       1 vda1 1 0 8 1 7 0 56 2 0 3 3 0 0 0 0
";
        assert_eq!(parse_sectors_written(stats, 253, 0), Some(4096));
        assert_eq!(parse_sectors_written(stats, 253, 1), Some(56));
        assert_eq!(parse_sectors_written(stats, 8, 0), None);
        // The disk under target/ (where the benches write, on a real disk: they measure
        // it) counts a synced write of 1 MiB.
        let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
        let dir = target.join(format!("disk-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let disk = Disk::of(&dir).expect("target/ is on a device /proc/diskstats counts");
        let before = disk.bytes_written().expect("counted");
        let file = dir.join("written");
        std::fs::write(&file, vec![7u8; 1 << 20]).expect("write");
        std::fs::File::open(&file).and_then(|f| f.sync_all()).expect("sync");
        let written = disk.bytes_written().expect("counted") - before;
        std::fs::remove_dir_all(&dir).expect("remove");
        assert!(written >= 1 << 20, "1 MiB synced, {written} bytes counted");
    }

    #[test]
    fn cpu_time_counts_this_process_spinning_and_not_a_sleeping_child() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep");
        let (mine, childs) = (cpu_time(None), cpu_time(Some(child.id())));
        // Spin until 200 ms are counted: on a busy machine that takes longer than 200 ms
        // of wall time, never less, and a count that stood still would hit the deadline.
        let started = Instant::now();
        let mut spins = 0u64;
        let spent = loop {
            spins = black_box(spins + 1);
            let spent = cpu_time(None) - mine;
            if spent >= Duration::from_millis(200) {
                break spent;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "spinning counted {spent:?}");
        };
        let wall = started.elapsed();
        let child_spent = cpu_time(Some(child.id())) - childs;
        child.kill().expect("kill sleep");
        child.wait().expect("reap sleep");
        // One thread spun: what it counted is within the wall time it took (and a tick of
        // the kernel's accounting). The sleeping child at most what finishing its exec
        // could take, far below the spin.
        assert!(spent <= wall + Duration::from_millis(20), "{spent:?} counted in {wall:?}");
        assert!(child_spent <= Duration::from_millis(50), "sleep counted {child_spent:?}");
        assert_eq!(cpu_per_gb(Duration::from_secs(3), 2e9), 1.5);
    }
}
