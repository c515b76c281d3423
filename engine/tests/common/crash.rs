//! The crash-test harness every kill -9 test shares: the test re-executes its own binary
//! as a child (selected by an environment variable), reads what the child acknowledges
//! on stdout, kills it with SIGKILL at a random moment, and hands every line back; a
//! seeded generator makes the moment replayable.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::pin::pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a child may take to acknowledge its first operation.
const FIRST_ACK_WAIT_MAX: Duration = Duration::from_secs(60);
/// How long one future may stay pending in [`block_on`] before the test fails.
const STALL_LIMIT: Duration = Duration::from_secs(60);

/// xorshift64*: enough randomness for kill timing, and replayable from its seed.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `seed_env` when set, else from the clock; prints the seed
    /// so a failing run can be replayed.
    pub fn seeded(seed_env: &str) -> Self {
        let seed = std::env::var(seed_env).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0x9e37_79b9, |d| d.as_nanos() as u64)
        });
        println!("replay with {seed_env}={seed}");
        Self(seed | 1)
    }

    /// A generator from a known seed (a child's, passed by its parent).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// A number in `0..bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

/// A waker that records that it fired, then unparks its thread: a driver checks its own
/// flag before every park, so no wake-up is lost to a nested wait taking the thread's
/// unpark token (the same driver as the library's `test_support`).
struct WakeFlag {
    thread: thread::Thread,
    woken: AtomicBool,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// Runs a future to completion on this thread; a future pending for a minute fails the
/// test (a stall, not a slow machine).
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    let flag = Arc::new(WakeFlag { thread: thread::current(), woken: AtomicBool::new(true) });
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + STALL_LIMIT;
    loop {
        while !flag.woken.swap(false, Ordering::SeqCst) {
            let now = Instant::now();
            assert!(now < deadline, "a future stalled for {STALL_LIMIT:?}");
            thread::park_timeout(deadline - now);
        }
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
    }
}

/// Runs this test binary's test `test_name` as a child with `envs`, until `run_for`
/// after the first parsed line for which `is_ack` holds; then SIGKILLs and reaps it and
/// returns every line `parse` accepted, in order (those printed before it died too).
/// `parse` returns `None` for lines that are not the test's (and may panic on a line
/// that is the test's but malformed).
pub fn run_and_kill<T: Send + 'static>(
    test_name: &str,
    envs: &[(&str, String)],
    parse: fn(&str) -> Option<T>,
    is_ack: fn(&T) -> bool,
    run_for: Duration,
) -> Vec<T> {
    let mut command = Command::new(std::env::current_exe().expect("the test binary's path"));
    command.args(["--exact", test_name, "--nocapture", "--test-threads", "1"]);
    for (name, value) in envs {
        command.env(name, value);
    }
    let mut child =
        command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("start the child");
    let stdout = child.stdout.take().expect("stdout is piped");
    let (lines, received) = flume::bounded::<T>(4096);
    let reader = thread::spawn(move || {
        // Ends at EOF, which the kill brings.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(parsed) = parse(&line)
                && lines.send(parsed).is_err()
            {
                break;
            }
        }
    });
    let mut got = Vec::new();
    let first_ack_by = Instant::now() + FIRST_ACK_WAIT_MAX;
    loop {
        let left = first_ack_by.checked_duration_since(Instant::now()).unwrap_or_default();
        let line = received.recv_timeout(left).expect("the child acknowledges something");
        let acked = is_ack(&line);
        got.push(line);
        if acked {
            break;
        }
    }
    let kill_at = Instant::now() + run_for;
    // Bounded by time: receiving stops at the kill moment.
    while let Some(left) = kill_at.checked_duration_since(Instant::now()) {
        match received.recv_timeout(left) {
            Ok(line) => got.push(line),
            Err(flume::RecvTimeoutError::Timeout) => break,
            Err(flume::RecvTimeoutError::Disconnected) => {
                panic!("the child exited before the kill")
            }
        }
    }
    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
    // SAFETY: `pid` is our own child, not yet waited for, so it names that process.
    let killed = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill: {}", std::io::Error::last_os_error());
    let status = child.wait().expect("reap the child");
    assert!(!status.success(), "the child was killed: {status:?}");
    got.extend(received.iter());
    reader.join().expect("the reader thread panicked");
    got
}
