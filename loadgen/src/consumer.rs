//! Consumers: subscribers that follow a stream's tail during the run (end-to-end latency),
//! and the read-back after it (catch-up throughput, and verification).
//!
//! End-to-end latency is a record's delivery to the subscriber minus the intended send
//! time its body carries (payload.rs), both on the run's clock.
//!
//! Both read through a client whose every read waits at most `--drain` and that never
//! repeats a call that timed out (`Client::with_timeouts_repeated`): once the producers are done, a server
//! that stops answering ends a follower within `--drain`, and the read-back at the first
//! read that waited that long. The read-back reads plain pages up to the tail measured
//! at the end of the load, never waiting for records: what is missing below that tail
//! (trimmed, lost) is reported, not waited for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use net::client::{Client, Format, ReadOptions, Start, SubscriptionEvent};

use crate::Backoff;
use crate::interrupt::Interrupt;
use crate::payload::Payload;
use crate::producer::StreamSpec;
use crate::run::Shared;
use crate::stats::Series;
use crate::verify::Checker;

pub struct ConsumerOutcome {
    pub e2e: Histogram<u64>,
    pub delivered: u64,
    pub error: Option<String>,
}

/// Follows `spec` from its first record until it has seen the stream's final tail (set in
/// `shared.final_tails` once the producers are done). `client`'s reads wait at most
/// `--drain`: a subscription that waited that long (an idle stream against a server
/// whose heartbeats are further apart, or a server that stopped answering) is opened
/// again where it was while the producers run, and ends the follower once they are done.
/// One that failed and may work again (its connection cut, the server stopping or
/// starting: [`net::client::Error::transient`]) is opened again where it was after a
/// growing wait, under the same bound.
pub fn follow(shared: &Shared, client: &Client, spec: &StreamSpec) -> ConsumerOutcome {
    let clock = shared.clock;
    let drain = shared.config.drain;
    let mut series = Series::new(&shared.e2e_intervals);
    let mut delivered = 0;
    let sse = client.format() == Format::Json;
    let final_tail = &shared.final_tails[spec.number as usize];
    let reached = |next: u64| next >= final_tail.load(Ordering::Acquire);
    let producers_done_for =
        || shared.producers_done_at.lock().unwrap_or_else(|e| e.into_inner()).map(|t| t.elapsed());
    // A read that waited --drain is not the end while the producers run (an idle stream,
    // or a server stalled for a while), nor in the --drain after them: the final tails
    // are known only once checked, so a follower at its tail may time out before then.
    let may_wait = || producers_done_for().is_none_or(|done_for| done_for <= drain);
    let mut next_seq = spec.base_seq;
    let mut backoff = Backoff::new();
    let error = 'follow: loop {
        let options = ReadOptions::from_seq_num(next_seq);
        let subscription = match client.subscribe(&spec.address, &options, sse) {
            Ok(subscription) => subscription,
            Err(e) if e.timed_out() && may_wait() => continue,
            Err(e) if e.transient() && may_wait() => {
                std::thread::sleep(backoff.next_wait());
                continue;
            }
            Err(e) => break Some(format!("{}: subscribe: {e}", spec.address)),
        };
        for event in subscription {
            match event {
                Ok(SubscriptionEvent::Records { records, .. }) => {
                    backoff = Backoff::new();
                    let now_ns = clock.unix_ns(Instant::now());
                    for r in &records {
                        let Some(p) = Payload::parse(&r.body) else { continue };
                        if p.stream != spec.number {
                            continue;
                        }
                        let latency_us = now_ns.saturating_sub(p.sent_unix_ns) / 1000;
                        series.record(
                            clock.second_of_unix(p.sent_unix_ns),
                            latency_us,
                            clock.measured_unix(p.sent_unix_ns),
                        );
                    }
                    delivered += records.len() as u64;
                    shared.delivered_records.fetch_add(records.len() as u64, Ordering::Relaxed);
                    shared.timeline.delivered(clock.second(Instant::now()), records.len() as u64);
                    if let Some(last) = records.last() {
                        next_seq = last.seq_num + 1;
                    }
                }
                Ok(SubscriptionEvent::Heartbeat { .. }) => {}
                // Nothing came for --drain: done if at the final tail, else go on where
                // it was while it may wait.
                Err(e) if e.timed_out() && reached(next_seq) => break 'follow None,
                Err(e) if e.timed_out() && may_wait() => continue 'follow,
                Err(e) if e.transient() && may_wait() => {
                    std::thread::sleep(backoff.next_wait());
                    continue 'follow;
                }
                Err(e) => break 'follow Some(format!("{}: subscription: {e}", spec.address)),
            }
            if reached(next_seq) {
                break 'follow None;
            }
            if producers_done_for().is_some_and(|t| t > drain) {
                break 'follow Some(format!(
                    "{}: the subscription did not reach the tail within {drain:?} of the end (--drain)",
                    spec.address
                ));
            }
        }
        // The server ended the subscription (it has no bound): nothing more will come.
        break None;
    };
    ConsumerOutcome { e2e: series.finish(), delivered, error }
}

/// What the read-back of one stream found.
#[derive(Clone, Debug, Default)]
pub struct ReadBack {
    pub records: u64,
    pub bytes: u64,
    /// Where the read got to: every record of the stream below it was read (or had been
    /// trimmed away); the tail when it completed.
    pub next_seq_num: u64,
    /// Why it stopped before the tail, if it did (the stream not named): the records
    /// from `next_seq_num` on were not read.
    pub incomplete: Option<String>,
}

/// Reads `spec` from its first record up to `tail` (exclusive) in plain pages that never
/// wait for records, feeding `checker`. It ends at `tail` even where the stream holds
/// less below it (trimmed records are skipped by the server, a page's `next_seq_num`
/// jumping over them): the checker then finds them lost. It stops early, saying why in
/// [`ReadBack::incomplete`] with the counts read so far, when a read fails, when
/// `interrupt` is set, or when `silent` says another read found the server not answering
/// within the client's timeout (which this one sets when it finds so), so a stalled
/// server holds the read-back at most one read's timeout.
pub fn read_back(
    client: &Client,
    spec: &StreamSpec,
    tail: u64,
    mut checker: Option<&mut Checker>,
    interrupt: &Interrupt,
    silent: &AtomicBool,
    drain: Duration,
) -> ReadBack {
    let mut out = ReadBack { next_seq_num: spec.base_seq, ..ReadBack::default() };
    let address = &spec.address;
    while out.next_seq_num < tail {
        let next = out.next_seq_num;
        if let Some(signal) = interrupt.signal() {
            let signal = crate::interrupt::signal_name(signal);
            out.incomplete = Some(format!("interrupted ({signal})"));
            break;
        }
        if silent.load(Ordering::Relaxed) {
            out.incomplete = Some(format!(
                "not read from seq_num {next}: another read found the server not answering within {drain:?} (--drain)"
            ));
            break;
        }
        let options = ReadOptions {
            start: Start::SeqNum(next),
            // The server cuts a page at its own limits.
            count: Some(tail - next),
            ..ReadOptions::default()
        };
        let page = match client.read(address, &options) {
            Ok(page) => page,
            Err(e) => {
                if e.timed_out() {
                    silent.store(true, Ordering::Relaxed);
                }
                out.incomplete = Some(format!("read from seq_num {next}: {e}"));
                break;
            }
        };
        for r in page.records.iter().filter(|r| r.seq_num < tail) {
            out.records += 1;
            out.bytes += r.body.len() as u64;
            if let Some(c) = checker.as_deref_mut() {
                c.record(r.seq_num, &r.body);
            }
        }
        if page.next_seq_num <= next {
            out.incomplete = Some(format!(
                "the read from seq_num {next} came back empty, below the tail {tail} checked at the end of the load"
            ));
            break;
        }
        out.next_seq_num = page.next_seq_num.min(tail);
    }
    out
}
