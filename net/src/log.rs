//! The server's log: lines on stderr, written by a thread of its own.
//!
//! A shard never writes to stderr itself. A log reader that stops reading (a pipe to a
//! stuck collector) fills the pipe, and a write into a full pipe blocks: on a shard that
//! would stop every request it owns. A shard hands its line to a bounded queue instead;
//! past `--log-queue-lines` waiting, lines are dropped and counted
//! (`nova_log_lines_dropped_total`), and the writer says how many when it can write again.
//! A reader that went away (EPIPE) costs nothing either: the writer ignores the error.
//!
//! Before [`start`] (and in the CLI, which never starts it) a line is written at once, on
//! the calling thread.

use std::io::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

enum Message {
    Line(String),
    /// Answered once every line queued before it is written.
    Flush(flume::Sender<()>),
}

static QUEUE: OnceLock<flume::Sender<Message>> = OnceLock::new();
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Starts the writer thread, with room for `queue_lines` lines waiting. Once per
/// process; a second call keeps the first writer.
pub fn start(queue_lines: usize) -> std::io::Result<()> {
    let (sender, receiver) = flume::bounded(queue_lines.max(1));
    if QUEUE.set(sender).is_err() {
        return Ok(());
    }
    std::thread::Builder::new().name("nova-log".into()).spawn(move || {
        let mut reported = 0;
        for message in receiver {
            match message {
                Message::Line(line) => {
                    let dropped = DROPPED.load(Ordering::Relaxed);
                    if dropped > reported {
                        write_now(format_args!(
                            "nova log: {} line{} dropped (the log was not read fast enough; \
                             --log-queue-lines)",
                            dropped - reported,
                            if dropped - reported == 1 { "" } else { "s" }
                        ));
                        reported = dropped;
                    }
                    write_now(format_args!("{line}"));
                }
                Message::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    })?;
    Ok(())
}

/// Logs one line: queued for the writer if it runs (dropped and counted if the queue is
/// full), else written at once.
pub fn line(args: std::fmt::Arguments<'_>) {
    match QUEUE.get() {
        Some(queue) => {
            if let Err(flume::TrySendError::Full(_)) =
                queue.try_send(Message::Line(args.to_string()))
            {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
        None => write_now(args),
    }
}

/// Waits until the lines queued so far are written, for at most `patience`: at exit, a
/// log nobody reads must not keep the process from ending.
pub fn flush(patience: Duration) {
    let Some(queue) = QUEUE.get() else { return };
    let (done, written) = flume::bounded(1);
    if queue.send_timeout(Message::Flush(done), patience).is_ok() {
        let _ = written.recv_timeout(patience);
    }
}

/// Lines dropped because the queue was full, since the process started.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// A line on stderr that never panics: `eprintln!` panics when the reader went away.
fn write_now(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}
