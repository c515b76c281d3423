//! A producer thread: it owns some streams, one append session per connection of each
//! (its batches in flight on one connection, acknowledged in order), and sends batches on
//! the schedule (open loop) or as acknowledgements free a slot (closed loop).
//!
//! Ack latency is the acknowledgement's arrival on the session's reader thread minus the
//! batch's intended send time: a batch sent late because the session was full or the
//! thread was behind carries that delay in its latency.
//!
//! A producer never waits inside `AppendSession::submit`: it submits only to a connection
//! with a free `--in-flight` slot and otherwise polls for acknowledgements, so the end of
//! the run (or an interrupt) can stop a wait the server would make unbounded. Sending stops
//! at the end; what the open-loop schedule called for before it and could not send counts
//! as behind schedule, and the acknowledgements still due are collected for at most
//! `--drain` (`Config::drain`).
//!
//! A connection whose append session fails (the server restarted, a proxy cut it) is
//! opened again, with a growing wait between tries, for up to `--drain` of outage: a
//! server that comes back within that is sent to again, and the batches its absence held
//! back go out late, with their intended times. An outage lasts until a reopened session
//! has an append acknowledged, so a server that accepts connections and cuts each one
//! still ends it. A stream all of whose connections gave up is dead. Once sending is over,
//! nothing is reopened.
//!
//! Every batch the open-loop schedule calls for before the end is accounted for: sent
//! (then acknowledged or failed), behind schedule, or abandoned with its stream (a dead
//! stream, or one with no connection open at the end, stops sending; the producer keeps
//! the schedule to the end, so what it called for still counts, in the latencies too).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use net::client::{Address, AppendSession, Batch, Client, Conditions, Error, SessionAck};

use crate::Backoff;
use crate::config::{Load, RecordBytes};
use crate::payload::{self, Payload};
use crate::run::Shared;
use crate::stats::Series;
use crate::verify::Ledger;

/// A stream of the run.
#[derive(Clone, Debug)]
pub struct StreamSpec {
    pub number: u32,
    pub address: Address,
    /// The stream's tail when the run started: its records start here.
    pub base_seq: u64,
}

/// What a producer brings back.
pub struct ProducerOutcome {
    pub ack: Histogram<u64>,
    pub ledgers: Vec<(StreamSpec, Ledger)>,
    /// Acknowledged in the measured window (by acknowledgement time).
    pub measured_records: u64,
    pub measured_bytes: u64,
    pub sent_batches: u64,
    pub acked_batches: u64,
    /// Sent and answered with an error (refused, or cut off with their connection), or
    /// unanswered by `--drain`.
    pub failed_batches: u64,
    /// Of the failed: unanswered by `--drain` (the rest were answered with an error).
    pub unanswered_batches: u64,
    /// Batches the schedule called for before the end that were never sent because the
    /// producer was blocked, every slot taken, when the end came (open loop).
    pub unsent_batches: u64,
    /// Batches the schedule called for before the end that were never sent because their
    /// stream had failed (its append session could not be reopened; open loop).
    pub abandoned_batches: u64,
    pub errors: Vec<String>,
}

struct InFlight {
    ticket: u64,
    intended: Instant,
    submitted: Instant,
    index: u64,
    count: u64,
    bytes: u64,
    digests: Vec<u64>,
}

struct Lane {
    session: Option<AppendSession>,
    in_flight: VecDeque<InFlight>,
    /// Its session failed, and no session opened since has had an append acknowledged.
    outage: Option<Outage>,
    /// Its outage outlasted `--drain`: it is not opened again.
    gave_up: bool,
}

impl Lane {
    fn new(session: AppendSession) -> Self {
        Lane { session: Some(session), in_flight: VecDeque::new(), outage: None, gave_up: false }
    }

    /// Whether `submit` on it would not wait: it has a session with a free slot of
    /// `in_flight`. A session reopened in an outage carries one batch at a time until one
    /// is acknowledged: a server that takes connections and cuts them fails one batch per
    /// try, not the backlog.
    fn has_room(&self, in_flight: usize) -> bool {
        let slots = if self.outage.is_some() { 1 } else { in_flight };
        self.session.is_some() && self.in_flight.len() < slots
    }
}

struct Outage {
    since: Instant,
    /// When to try to open the session again.
    retry_at: Instant,
    /// The waits between failed tries.
    backoff: Backoff,
    /// Whether a failed reopen was told as an error (the first of an outage is, and the
    /// last).
    told: bool,
}

impl Outage {
    /// A try failed at `now`: the next waits longer.
    fn wait_more(&mut self, now: Instant) {
        self.retry_at = now + self.backoff.next_wait();
    }
}

struct StreamState {
    spec: StreamSpec,
    lanes: Vec<Lane>,
    next_lane: usize,
    next_due: Instant,
    next_index: u64,
    ledger: Ledger,
    /// Stopped: a session that could not be opened at the start, its own batch refused
    /// before sending, or every connection given up.
    dead: bool,
}

const ERRORS_KEPT: usize = 5;

/// How often a producer with nothing to send but acknowledgements to wait for looks for
/// them. Their times are taken on the sessions' reader threads, so polling costs no
/// accuracy.
const POLL: Duration = Duration::from_micros(50);

/// How long after the end a batch the schedule called for before it may still be sent, as
/// long as a slot is free: a thread woken a little late is not behind schedule, but one
/// still catching up with a backlog stops here.
pub const LATE_SEND_MAX: Duration = Duration::from_millis(100);

impl StreamState {
    /// The stream's next connection, round robin, with a free slot: `submit` on it does not
    /// wait.
    fn free_lane(&self, in_flight: usize) -> Option<usize> {
        let lanes = self.lanes.len();
        (0..lanes)
            .map(|k| (self.next_lane + k) % lanes)
            .find(|&l| self.lanes[l].has_room(in_flight))
    }

    /// Whether it sends no more: dead, or (at the end) with no connection open but in an
    /// outage.
    fn abandoned(&self) -> bool {
        self.dead || self.lanes.iter().all(|l| l.session.is_none() || l.outage.is_some())
    }
}

struct Producer<'a> {
    shared: &'a Shared,
    client: &'a Client,
    series: Series<'a>,
    batch: Batch,
    body: Vec<u8>,
    filler: Vec<u8>,
    rng: u64,
    /// Where the measured window ends: the clock's end, or earlier once interrupted.
    window_end: Instant,
    /// Sessions reopened and given up: the closed loop's wait for a free slot ends on
    /// either as on an acknowledgement.
    lane_changes: u64,
    /// Sending is over: failed sessions are no longer reopened.
    sending_over: bool,
    /// Connections given up told as errors (see [`Producer::error_given_up`]).
    given_up_told: usize,
    out: ProducerOutcome,
}

pub fn run(shared: &Shared, client: &Client, specs: Vec<StreamSpec>, seed: u64) -> ProducerOutcome {
    let config = &shared.config;
    let clock = shared.clock;
    let mut p = Producer {
        shared,
        client,
        series: Series::new(&shared.ack_intervals),
        batch: Batch::new(),
        body: Vec::with_capacity(config.record_bytes.max()),
        filler: payload::filler(config.record_bytes.max()),
        rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        window_end: clock.end,
        lane_changes: 0,
        sending_over: false,
        given_up_told: 0,
        out: ProducerOutcome {
            ack: crate::stats::histogram(),
            ledgers: Vec::new(),
            measured_records: 0,
            measured_bytes: 0,
            sent_batches: 0,
            acked_batches: 0,
            failed_batches: 0,
            unanswered_batches: 0,
            unsent_batches: 0,
            abandoned_batches: 0,
            errors: Vec::new(),
        },
    };
    // Each stream sends a batch every `interval`; streams start spread over one interval.
    let interval = match config.load {
        Load::Open { records_per_second } => Duration::from_secs_f64(
            config.streams as f64 * config.batch as f64 / records_per_second,
        ),
        Load::Closed => Duration::ZERO,
    };
    let mut streams: Vec<StreamState> = specs
        .into_iter()
        .map(|spec| {
            let phase = interval.mul_f64(f64::from(spec.number) / config.streams as f64);
            let mut lanes = Vec::new();
            let mut dead = false;
            for _ in 0..config.connections {
                match client.append_session(&spec.address, config.in_flight) {
                    Ok(session) => lanes.push(Lane::new(session)),
                    Err(e) => {
                        p.error(format!("{}: open an append session: {e}", spec.address));
                        dead = true;
                    }
                }
            }
            StreamState {
                ledger: Ledger::default(),
                spec,
                lanes,
                next_lane: 0,
                next_due: clock.start + phase,
                next_index: 0,
                dead,
            }
        })
        .collect();

    match config.load {
        Load::Open { .. } => {
            p.open_loop(&mut streams, interval);
            let window_end = p.window_end;
            for s in &streams {
                let never_sent = unsent(s.next_due, window_end, interval);
                if s.abandoned() {
                    p.out.abandoned_batches += never_sent;
                } else {
                    p.out.unsent_batches += never_sent;
                }
            }
            p.record_unsent(&streams, interval);
        }
        Load::Closed => p.closed_loop(&mut streams),
    }
    p.collect_in_flight(&mut streams);
    p.out.ack = p.series.finish();
    p.out.ledgers = streams.into_iter().map(|s| (s.spec, s.ledger)).collect();
    p.out
}

impl Producer<'_> {
    fn error(&mut self, text: String) {
        self.shared.errors.fetch_add(1, Ordering::Relaxed);
        if self.out.errors.len() < ERRORS_KEPT {
            self.out.errors.push(text);
        }
    }

    /// A connection given up, which says why its stream stopped: kept whatever errors
    /// came before it, the first [`ERRORS_KEPT`] of them.
    fn error_given_up(&mut self, text: String) {
        self.shared.errors.fetch_add(1, Ordering::Relaxed);
        if self.given_up_told < ERRORS_KEPT {
            self.given_up_told += 1;
            self.out.errors.push(text);
        }
    }

    /// Whether the run was interrupted; the measured window then ends when the first worker
    /// noticed, and the open loop treats that as the end.
    fn stopping(&mut self) -> bool {
        match self.shared.stop_requested() {
            Some(at) => {
                self.window_end = self.window_end.min(at);
                true
            }
            None => false,
        }
    }

    fn measured(&self, at: Instant) -> bool {
        at >= self.shared.clock.measure_from && at < self.window_end
    }

    /// Sends each stream's batches at their scheduled times until the end (of the window:
    /// an interrupt brings it forward). A batch waits for a free slot (every stream of the
    /// producer waits with it) no later than the end: there the producer stops, and [`run`]
    /// counts what the schedule still called for as behind schedule. A batch that could
    /// not be submitted keeps its place in the schedule: it goes out on the reopened
    /// session, or, its stream dead, counts as abandoned with those after it.
    fn open_loop(&mut self, streams: &mut [StreamState], interval: Duration) {
        let in_flight = self.shared.config.in_flight;
        'schedule: loop {
            self.stopping();
            let Some(i) = (0..streams.len())
                .filter(|&i| !streams[i].dead)
                .min_by_key(|&i| streams[i].next_due)
            else {
                // Every stream failed: the schedule still runs to the end, so what it
                // called for counts with the time it waited by then.
                self.wait_for_the_end(streams);
                return;
            };
            let due = streams[i].next_due;
            if due >= self.window_end {
                return;
            }
            // Wait for the schedule, collecting acknowledgements meanwhile (their times
            // were taken on arrival, so collecting late changes no figure).
            loop {
                self.drain(streams);
                let now = Instant::now();
                if now >= due {
                    break;
                }
                // Interrupted: the end is now, before `due`.
                if self.stopping() {
                    return;
                }
                std::thread::sleep((due - now).min(Duration::from_millis(20)));
            }
            let lane = loop {
                if let Some(lane) = streams[i].free_lane(in_flight) {
                    break lane;
                }
                // Blocked: every slot of the stream's connections is taken, or its
                // connections are down and being reopened.
                if streams[i].dead {
                    continue 'schedule;
                }
                self.stopping();
                if Instant::now() >= self.window_end {
                    return;
                }
                std::thread::sleep(POLL);
                self.drain(streams);
            };
            if Instant::now() >= self.window_end + LATE_SEND_MAX {
                return;
            }
            streams[i].next_lane = (lane + 1) % streams[i].lanes.len();
            if self.send(&mut streams[i], lane, due) {
                streams[i].next_due += interval;
            }
        }
    }

    /// Collects acknowledgements until the end of the window (an interrupt brings it
    /// forward).
    fn wait_for_the_end(&mut self, streams: &mut [StreamState]) {
        loop {
            self.drain(streams);
            let now = Instant::now();
            if self.stopping() || now >= self.window_end {
                return;
            }
            std::thread::sleep((self.window_end - now).min(Duration::from_millis(20)));
        }
    }

    fn closed_loop(&mut self, streams: &mut [StreamState]) {
        let end = self.shared.clock.end;
        let in_flight = self.shared.config.in_flight;
        while Instant::now() < end && !self.stopping() {
            let mut live = false;
            for s in streams.iter_mut().filter(|s| !s.dead) {
                live = true;
                for lane in 0..s.lanes.len() {
                    while !s.dead && s.lanes[lane].has_room(in_flight) && Instant::now() < end {
                        self.send(s, lane, Instant::now());
                    }
                }
            }
            if !live {
                return;
            }
            // Wait for any acknowledgement to free a slot, or a session reopened.
            let progress = |p: &Self| p.out.acked_batches + p.out.failed_batches + p.lane_changes;
            let before = progress(self);
            while progress(self) == before && Instant::now() < end && !self.stopping() {
                self.drain(streams);
                if progress(self) == before {
                    std::thread::sleep(POLL);
                }
            }
        }
    }

    /// Batches the schedule called for before the end and never sent (behind schedule, or
    /// abandoned with their stream) still count in the latencies, each with the time it
    /// had waited when sending stopped (a lower bound): otherwise a stall over the end of
    /// the run, or a stream that failed, would leave only the batches that got through in
    /// the percentiles (coordinated omission).
    fn record_unsent(&mut self, streams: &[StreamState], interval: Duration) {
        if interval.is_zero() {
            return;
        }
        let stopped = Instant::now();
        for s in streams {
            let mut intended = s.next_due;
            while intended < self.window_end {
                self.record_waited(intended, stopped);
                intended += interval;
            }
        }
    }

    /// A batch intended at `intended` that had no answer by `now`: its latency is at least
    /// the wait so far.
    fn record_waited(&mut self, intended: Instant, now: Instant) {
        let clock = self.shared.clock;
        let waited = now.saturating_duration_since(intended);
        self.series.record(
            clock.second(intended),
            waited.as_micros() as u64,
            self.measured(intended),
        );
    }

    /// Sending is over: collects the acknowledgements of what is in flight, for at most
    /// `--drain`; what is still unanswered then counts as failed (it may yet land), in
    /// the latencies with the time it waited (a lower bound), and its connection is
    /// closed.
    fn collect_in_flight(&mut self, streams: &mut [StreamState]) {
        self.sending_over = true;
        let drain = self.shared.config.drain;
        let deadline = Instant::now() + drain;
        let waiting = |streams: &[StreamState]| {
            streams.iter().flat_map(|s| &s.lanes).any(|l| !l.in_flight.is_empty())
        };
        loop {
            self.drain(streams);
            if !waiting(streams) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        for s in streams.iter_mut() {
            for lane in &mut s.lanes {
                if lane.in_flight.is_empty() {
                    continue;
                }
                // Closing the connection ends the session's threads; the server may still
                // apply what it read (verification allows both).
                lane.session = None;
                let unanswered = self.unanswered(lane);
                self.out.unanswered_batches += unanswered;
                self.error(format!(
                    "{}: {unanswered} batches unanswered {drain:?} after sending stopped (--drain; counted failed)",
                    s.spec.address
                ));
            }
        }
    }

    /// Counts the batches `lane` still has in flight, whose session is gone, as failed
    /// (they may yet land), in the latencies with the time they waited (a lower bound);
    /// how many.
    fn unanswered(&mut self, lane: &mut Lane) -> u64 {
        let now = Instant::now();
        let unanswered = lane.in_flight.len() as u64;
        for f in std::mem::take(&mut lane.in_flight) {
            self.record_waited(f.intended, now);
        }
        self.out.failed_batches += unanswered;
        unanswered
    }

    /// Collects the acknowledgements that arrived, and reopens the failed sessions whose
    /// wait is over.
    fn drain(&mut self, streams: &mut [StreamState]) {
        // At most one try to reopen a session per pass: each may wait for its connection
        // (up to a second), and the schedule of every stream waits with it.
        let mut tried = false;
        for s in streams.iter_mut() {
            for lane in 0..s.lanes.len() {
                if !tried && s.lanes[lane].session.is_none() && s.lanes[lane].outage.is_some() {
                    tried = self.reopen(s, lane);
                }
                let mut cut = false;
                while let Some(ack) =
                    s.lanes[lane].session.as_mut().and_then(AppendSession::try_recv)
                {
                    cut |= self.on_ack(s, lane, ack);
                }
                // A session goes on after its connection was cut, on a new one, but the
                // server may be gone: the lane waits as for any failed session.
                if cut && !self.sending_over {
                    self.lane_failed(s, lane);
                }
            }
        }
    }

    fn record_len(&mut self) -> usize {
        match self.shared.config.record_bytes {
            RecordBytes::Fixed(n) => n,
            RecordBytes::Uniform { min, max } => {
                // xorshift64*: enough for a size draw, and seeded so a run repeats.
                self.rng ^= self.rng >> 12;
                self.rng ^= self.rng << 25;
                self.rng ^= self.rng >> 27;
                let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
                min + (r % (max - min + 1) as u64) as usize
            }
        }
    }

    /// Frames the stream's next batch, intended for `intended`, and submits it on
    /// connection `lane_no`; whether it went out. One that did not is not counted here:
    /// its session is reopened for it (or the stream is dead), and the caller sends it
    /// again or counts it.
    fn send(&mut self, s: &mut StreamState, lane_no: usize, intended: Instant) -> bool {
        let verify = self.shared.config.verify;
        let sent_unix_ns = self.shared.clock.unix_ns(intended);
        self.batch.clear();
        let mut digests = Vec::new();
        let mut bytes = 0u64;
        let index = s.next_index;
        for i in 0..self.shared.config.batch as u64 {
            let len = self.record_len();
            let p = Payload { stream: s.spec.number, index: index + i, sent_unix_ns };
            p.write(len, &self.filler, &mut self.body);
            if verify {
                digests.push(payload::digest(&self.body));
            }
            bytes += len as u64;
            if let Err(e) = self.batch.push::<&[u8], &[u8]>(&[], &self.body) {
                self.error(format!("{}: frame a record: {e}", s.spec.address));
                s.dead = true;
                return false;
            }
        }
        let count = self.batch.len() as u64;
        let Some(session) = s.lanes.get_mut(lane_no).and_then(|l| l.session.as_mut()) else {
            s.dead = true;
            return false;
        };
        let submitted = Instant::now();
        match session.submit(&self.batch, &Conditions::default()) {
            Ok(ticket) => {
                s.next_index += count;
                s.ledger.sent = s.next_index;
                self.out.sent_batches += 1;
                s.lanes[lane_no].in_flight.push_back(InFlight {
                    ticket,
                    intended,
                    submitted,
                    index,
                    count,
                    bytes,
                    digests,
                });
                true
            }
            Err(e @ Error::Invalid(_)) => {
                // Loadgen's own batch refused before it was sent: every one would be.
                self.error(format!("{}: submit: {e}", s.spec.address));
                s.dead = true;
                false
            }
            Err(e) => {
                self.error(format!("{}: submit: {e}", s.spec.address));
                self.lane_failed(s, lane_no);
                false
            }
        }
    }

    /// The session of connection `lane_no` failed (it refused a batch, or its connection
    /// was cut under one): takes what it has answered and closes it (what it has not
    /// answered is unanswered: a session may have gone on, on a new connection, to a
    /// server that never answers, and waiting for it would hold the producer), then
    /// begins an outage, or goes on with the one a session reopened and failed again
    /// before an acknowledgement was in, and its growing wait. A later
    /// [`Producer::drain`] reopens it.
    fn lane_failed(&mut self, s: &mut StreamState, lane_no: usize) {
        if let Some(mut old) = s.lanes[lane_no].session.take() {
            while let Some(ack) = old.try_recv() {
                self.on_ack(s, lane_no, ack);
            }
        }
        self.unanswered(&mut s.lanes[lane_no]);
        let now = Instant::now();
        let drain = self.shared.config.drain;
        match &mut s.lanes[lane_no].outage {
            Some(outage) if now.duration_since(outage.since) >= drain => {
                let why = "every session reopened failed before an acknowledgement".into();
                self.give_up(s, lane_no, why);
            }
            Some(outage) => outage.wait_more(now),
            outage @ None => {
                *outage = Some(Outage {
                    since: now,
                    retry_at: now,
                    backoff: Backoff::new(),
                    told: false,
                });
            }
        }
    }

    /// Tries to open the failed session of connection `lane` again, once its wait is
    /// over and while the window lasts; whether it tried. After `--drain` of outage
    /// (counted from its first failure, idle time included) the connection is given up,
    /// and with the last of them the stream is dead. Only the first failed try of an
    /// outage and the last are told as errors.
    fn reopen(&mut self, s: &mut StreamState, lane: usize) -> bool {
        let now = Instant::now();
        match &s.lanes[lane].outage {
            Some(outage)
                if !self.sending_over
                    && !s.dead
                    && now >= outage.retry_at
                    && now < self.window_end => {}
            _ => return false,
        }
        let opened = self.client.append_session(&s.spec.address, self.shared.config.in_flight);
        // Connecting may take a while: the rest is measured from its end.
        let now = Instant::now();
        let drain = self.shared.config.drain;
        let l = &mut s.lanes[lane];
        let Some(outage) = l.outage.as_mut() else { return true };
        match opened {
            Ok(session) => {
                l.session = Some(session);
                self.lane_changes += 1;
            }
            Err(e) if now.duration_since(outage.since) >= drain => {
                self.give_up(s, lane, format!("reopen the append session: {e}"));
            }
            Err(e) => {
                outage.wait_more(now);
                if !std::mem::replace(&mut outage.told, true) {
                    self.error(format!(
                        "{}: reopen the append session: {e}; trying again for up to {drain:?} (--drain)",
                        s.spec.address
                    ));
                }
            }
        }
        true
    }

    /// Gives connection `lane` up after `--drain` of outage, for `why`; with the last of
    /// them, the stream is dead.
    fn give_up(&mut self, s: &mut StreamState, lane: usize, why: String) {
        let l = &mut s.lanes[lane];
        l.outage = None;
        l.gave_up = true;
        self.lane_changes += 1;
        s.dead |= s.lanes.iter().all(|l| l.gave_up);
        let drain = self.shared.config.drain;
        self.error_given_up(format!(
            "{}: {why}; gave up after {drain:?} (--drain)",
            s.spec.address
        ));
    }

    /// Takes one acknowledgement; whether it says the connection was cut (or its answer
    /// broke the protocol, which ends the session's connection as well).
    fn on_ack(&mut self, s: &mut StreamState, lane: usize, ack: SessionAck) -> bool {
        let Some(f) = s.lanes[lane].in_flight.pop_front() else {
            self.error(format!("{}: an acknowledgement nothing was waiting for", s.spec.address));
            return false;
        };
        debug_assert_eq!(f.ticket, ack.ticket, "a session acknowledges in submission order");
        let clock = self.shared.clock;
        let arrival = f.submitted + ack.latency;
        match ack.result {
            Ok(a) => {
                s.lanes[lane].outage = None;
                let latency = arrival.saturating_duration_since(f.intended);
                self.series.record(
                    clock.second(f.intended),
                    latency.as_micros() as u64,
                    self.measured(f.intended),
                );
                self.shared.timeline.acked(clock.second(arrival), f.count, f.bytes);
                self.shared.acked_records.fetch_add(f.count, Ordering::Relaxed);
                self.out.acked_batches += 1;
                if self.measured(arrival) {
                    self.out.measured_records += f.count;
                    self.out.measured_bytes += f.bytes;
                }
                if a.end.seq_num.saturating_sub(a.start.seq_num) != f.count {
                    self.error(format!(
                        "{}: a batch of {} records was acknowledged as seq_nums {}..{}",
                        s.spec.address, f.count, a.start.seq_num, a.end.seq_num
                    ));
                }
                let digests =
                    if f.digests.is_empty() { vec![0; f.count as usize] } else { f.digests };
                s.ledger.acked(a.start.seq_num, f.index, digests);
                false
            }
            Err(e) => {
                // Its records may or may not be in the stream: verification allows both.
                self.out.failed_batches += 1;
                self.error(format!("{}: append: {e}", s.spec.address));
                matches!(e, Error::Io { .. } | Error::Protocol(_))
            }
        }
    }
}

/// Batches a stream's schedule called for before `end` that were not sent.
pub fn unsent(next_due: Instant, end: Instant, interval: Duration) -> u64 {
    if interval.is_zero() || next_due >= end {
        return 0;
    }
    ((end - next_due).as_secs_f64() / interval.as_secs_f64()).ceil() as u64
}
