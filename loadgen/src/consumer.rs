//! Consumers: subscribers that follow a stream's tail during the run (end-to-end latency),
//! and the read-back after it (catch-up throughput, and verification).
//!
//! End-to-end latency is a record's delivery to the subscriber minus the intended send
//! time its body carries (payload.rs), both on the run's clock.

use std::sync::atomic::Ordering;
use std::time::Instant;

use hdrhistogram::Histogram;
use net::client::{Client, Format, ReadOptions, Start, SubscriptionEvent};

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
/// `shared.final_tails` once the producers are done).
pub fn follow(shared: &Shared, client: &Client, spec: &StreamSpec) -> ConsumerOutcome {
    let clock = shared.clock;
    let mut series = Series::new(&shared.e2e_intervals);
    let mut delivered = 0;
    let mut error = None;
    let sse = client.format() == Format::Json;
    let final_tail = &shared.final_tails[spec.number as usize];
    let reached = |next: u64| next >= final_tail.load(Ordering::Acquire);
    match client.subscribe(&spec.address, &ReadOptions::from_seq_num(spec.base_seq), sse) {
        Err(e) => error = Some(format!("{}: subscribe: {e}", spec.address)),
        Ok(subscription) => {
            let mut next_seq = spec.base_seq;
            for event in subscription {
                match event {
                    Ok(SubscriptionEvent::Records { records, .. }) => {
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
                        shared
                            .timeline
                            .delivered(clock.second(Instant::now()), records.len() as u64);
                        if let Some(last) = records.last() {
                            next_seq = last.seq_num + 1;
                        }
                    }
                    Ok(SubscriptionEvent::Heartbeat { .. }) => {}
                    Err(e) => {
                        error = Some(format!("{}: subscription: {e}", spec.address));
                        break;
                    }
                }
                if reached(next_seq) {
                    break;
                }
                let done_at = shared.producers_done_at.lock().unwrap_or_else(|e| e.into_inner());
                let drain = shared.config.drain;
                if done_at.is_some_and(|t| t.elapsed() > drain) {
                    error = Some(format!(
                        "{}: the subscription did not reach the tail within {drain:?} of the end (--drain)",
                        spec.address
                    ));
                    break;
                }
            }
        }
    }
    ConsumerOutcome { e2e: series.finish(), delivered, error }
}

/// What a read-back found.
#[derive(Clone, Debug, Default)]
pub struct ReadBack {
    pub records: u64,
    pub bytes: u64,
}

/// Reads `spec` from its first record up to `tail` (exclusive), feeding `checker`; gives
/// up when `interrupt` is set.
pub fn read_back(
    client: &Client,
    spec: &StreamSpec,
    tail: u64,
    mut checker: Option<&mut Checker>,
    interrupt: &Interrupt,
) -> Result<ReadBack, String> {
    let mut out = ReadBack::default();
    if tail <= spec.base_seq {
        return Ok(out);
    }
    let options = ReadOptions {
        start: Start::SeqNum(spec.base_seq),
        count: Some(tail - spec.base_seq),
        ..ReadOptions::default()
    };
    let sse = client.format() == Format::Json;
    let subscription = client
        .subscribe(&spec.address, &options, sse)
        .map_err(|e| format!("{}: read back: {e}", spec.address))?;
    for event in subscription {
        if let Some(signal) = interrupt.signal() {
            let signal = crate::interrupt::signal_name(signal);
            return Err(format!("{}: read back: interrupted ({signal})", spec.address));
        }
        match event {
            Ok(SubscriptionEvent::Records { records, .. }) => {
                for r in &records {
                    out.records += 1;
                    out.bytes += r.body.len() as u64;
                    if let Some(c) = checker.as_deref_mut() {
                        c.record(r.seq_num, &r.body);
                    }
                }
            }
            Ok(SubscriptionEvent::Heartbeat { .. }) => {}
            Err(e) => return Err(format!("{}: read back: {e}", spec.address)),
        }
    }
    Ok(out)
}
