//! One run, start to end: the target, the streams, producers and followers, the final
//! tails, the read-back, and the outcome the reports are made from. An interrupt (SIGINT,
//! SIGTERM) ends the load early, skips or abandons the read-back, and still returns the
//! outcome of what was measured; the spawned server is stopped either way.
//!
//! After the load, a server that stops answering holds the run a bounded time: the
//! acknowledgements in flight are waited for `--drain`, the final tails are checked
//! concurrently under one `--drain` deadline (and serve the read-back too), followers end
//! within `--drain` of the producers, and the read-back stops at its first read that
//! waited `--drain`.

use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use net::client::{Address, Bucket, Client, StreamOptions};

use crate::Clock;
use crate::config::{Config, Target};
use crate::consumer::{self, ConsumerOutcome, ReadBack};
use crate::interrupt::{self, Interrupt};
use crate::producer::{self, ProducerOutcome, StreamSpec};
use crate::spawn::{self, Spawned};
use crate::stats::{Intervals, Timeline};
use crate::verify::{Checker, Verdict};

/// What every worker shares.
pub struct Shared {
    pub config: Arc<Config>,
    pub clock: Clock,
    pub timeline: Timeline,
    pub ack_intervals: Intervals,
    pub e2e_intervals: Intervals,
    pub acked_records: AtomicU64,
    pub delivered_records: AtomicU64,
    pub errors: AtomicU64,
    /// Per stream: where its followers may stop (u64::MAX until the producers are done).
    pub final_tails: Vec<AtomicU64>,
    pub producers_done_at: Mutex<Option<Instant>>,
    pub interrupt: Interrupt,
    /// When a worker first noticed the interrupt during the load: the measured window ends
    /// there.
    pub stopped_at: OnceLock<Instant>,
}

impl Shared {
    /// When the load was asked to stop early (the first time any worker looked after the
    /// signal); None while it runs on.
    pub fn stop_requested(&self) -> Option<Instant> {
        self.interrupt.signal()?;
        Some(*self.stopped_at.get_or_init(Instant::now))
    }

    /// The end of the measured window: the end of `--duration`, or the interrupt's if
    /// earlier.
    pub fn window_end(&self) -> Instant {
        self.stopped_at.get().map_or(self.clock.end, |&at| at.min(self.clock.end))
    }
}

/// The read-back after the run.
#[derive(Debug, Default)]
pub struct ReadBackOutcome {
    /// Records and body bytes read, also of streams whose read-back stopped early.
    pub records: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Why a stream's read-back stopped before its tail (its tail could not be checked, a
    /// read failed), one per such stream, naming it: the read-back is incomplete.
    pub errors: Vec<String>,
    /// Per stream, when verifying.
    pub verdicts: Vec<(String, Verdict)>,
}

/// Everything a report shows.
pub struct Outcome {
    pub config: Arc<Config>,
    pub url: String,
    /// When the run's clock started, in Unix nanoseconds.
    pub start_unix_ns: u64,
    /// `--duration`, or less when an interrupt ended the load early.
    pub measured_seconds: f64,
    /// The signal that interrupted the run, if one did (the read-back is then left out).
    pub interrupted: Option<i32>,
    pub ack: Histogram<u64>,
    pub e2e: Histogram<u64>,
    pub ack_intervals: Vec<Histogram<u64>>,
    pub e2e_intervals: Vec<Histogram<u64>>,
    pub warmup_seconds: usize,
    pub acked_per_second: Vec<u64>,
    pub acked_bytes_per_second: Vec<u64>,
    pub delivered_per_second: Vec<u64>,
    pub measured_records: u64,
    pub measured_bytes: u64,
    pub sent_batches: u64,
    pub acked_batches: u64,
    /// Answered with an error, or unanswered by `--drain` ...
    pub failed_batches: u64,
    /// ... of which unanswered (these count in the latencies, the others do not).
    pub unanswered_batches: u64,
    /// Behind schedule at the end (open loop).
    pub unsent_batches: u64,
    /// Never sent because their stream failed (open loop).
    pub abandoned_batches: u64,
    pub delivered: u64,
    pub errors: Vec<String>,
    pub read_back: Option<ReadBackOutcome>,
}

impl Outcome {
    /// Whether verification ran and found a problem in what it read; an interrupted run
    /// has not verified anything, and says so instead.
    pub fn verify_failed(&self) -> bool {
        self.config.verify
            && self.interrupted.is_none()
            && self.read_back.as_ref().is_some_and(|r| r.verdicts.iter().any(|(_, v)| v.failed()))
    }

    /// Whether verification was asked for but could not read every stream to its tail
    /// (and found nothing wrong in what it read): nothing is known about the rest.
    pub fn verify_incomplete(&self) -> bool {
        self.config.verify
            && self.interrupted.is_none()
            && !self.verify_failed()
            && self
                .read_back
                .as_ref()
                .is_none_or(|r| r.verdicts.iter().any(|(_, v)| v.incomplete.is_some()))
    }

    /// Open loop: the batches the schedule called for before the end, each sent, behind
    /// schedule or abandoned with its stream.
    pub fn scheduled_batches(&self) -> Option<u64> {
        matches!(self.config.load, crate::config::Load::Open { .. })
            .then_some(self.sent_batches + self.unsent_batches + self.abandoned_batches)
    }

    /// Whether anything the run asked of the server failed: an append (refused, or
    /// unanswered by the drain), a follower, or the read-back. The figures are still
    /// measurements, but of a run that was not all served.
    pub fn had_errors(&self) -> bool {
        self.failed_batches > 0
            || !self.errors.is_empty()
            || self.read_back.as_ref().is_some_and(|r| !r.errors.is_empty())
    }
}

fn create_streams(client: &Client, config: &Config) -> Result<Vec<StreamSpec>, String> {
    match client.create_bucket(&Bucket::new(config.bucket.clone()), None) {
        Ok(_) => {}
        Err(e) if e.code() == Some("already_exists") => {}
        Err(e) => return Err(format!("create bucket {}: {e}", config.bucket)),
    }
    let options = StreamOptions { class: Some(config.class), ..StreamOptions::default() };
    let mut specs = Vec::with_capacity(config.streams);
    for number in 0..config.streams {
        let address =
            Address::new(config.bucket.clone(), format!("{}-{number}", config.stream_prefix));
        match client.create_stream(&address, &options, None) {
            Ok(_) => {}
            // A stream left by an earlier run with this prefix: its records so far are
            // not this run's, so the run starts at its tail.
            Err(e) if e.code() == Some("already_exists") => {}
            Err(e) => return Err(format!("create stream {address}: {e}")),
        }
        let base_seq =
            client.check_tail(&address).map_err(|e| format!("{address}: check tail: {e}"))?.seq_num;
        let number = u32::try_from(number).map_err(|_| "too many streams".to_owned())?;
        specs.push(StreamSpec { number, address, base_seq });
    }
    Ok(specs)
}

/// Runs the configured load; `on_target` hears the server's URL before the load starts.
/// `interrupt` ends it early.
pub fn run(
    config: Config,
    interrupt: &Interrupt,
    on_target: &mut dyn FnMut(&str),
) -> Result<Outcome, String> {
    let config = Arc::new(config);
    let spawned = match &config.target {
        Target::Spawn { nova_bin, server_args } => {
            Some(Spawned::start(&spawn::nova_bin(nova_bin.as_deref()), server_args)?)
        }
        Target::Url(_) => None,
    };
    let url = match (&config.target, &spawned) {
        (_, Some(s)) => s.url.clone(),
        (Target::Url(url), None) => url.clone(),
        (Target::Spawn { .. }, None) => return Err("no server".into()),
    };
    // A server with auth on (docs/auth.md) takes the token from the environment, as the
    // nova CLI does; a spawned server runs without auth on loopback.
    let new_client = || {
        Client::new(&url)
            .map_err(|e| format!("--url {url}: {e}"))?
            .with_format(config.format)
            .with_token(std::env::var("NOVA_TOKEN").ok())
            .map_err(|e| format!("NOVA_TOKEN: {e}"))
    };
    // Calls outside the load (streams, final tails, the read-back) and the followers'
    // subscriptions wait at most --drain for each read: a server that stopped answering
    // cannot hold the end of a run. After the load, a call that waited that long is not
    // made again (`Client::with_timeouts_repeated`), nor are the followers' idle subscriptions once the
    // producers are done. The producers' sessions have no such limit (what is unanswered
    // when sending stops is counted after --drain), but a connection is tried for at most
    // SESSION_CONNECT_MAX, so reopening a session cannot hold a producer's schedule long.
    let client = new_client()?.with_timeout(Some(config.drain));
    let bounded_client =
        new_client()?.with_timeout(Some(config.drain)).with_timeouts_repeated(false);
    let load_client =
        new_client()?.with_connect_timeout(Some(config.drain.min(SESSION_CONNECT_MAX)));
    let specs = create_streams(&client, &config)?;
    on_target(&url);

    let seconds_max = (config.warmup + config.duration).as_secs() as usize + 120;
    let shared = Shared {
        config: config.clone(),
        clock: Clock::new(config.warmup, config.duration),
        timeline: Timeline::new(seconds_max),
        ack_intervals: Intervals::new(),
        e2e_intervals: Intervals::new(),
        acked_records: AtomicU64::new(0),
        delivered_records: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        final_tails: specs.iter().map(|_| AtomicU64::new(u64::MAX)).collect(),
        producers_done_at: Mutex::new(None),
        interrupt: interrupt.clone(),
        stopped_at: OnceLock::new(),
    };
    let progress = config.progress && std::io::stderr().is_terminal();

    let (producers, consumers, tails) = std::thread::scope(|scope| {
        let shared = &shared;
        let load_client = &load_client;
        let bounded_client = &bounded_client;
        let consumers: Vec<_> = (0..config.consumers)
            .map(|c| {
                let spec = specs[c % specs.len()].clone();
                scope.spawn(move || consumer::follow(shared, bounded_client, &spec))
            })
            .collect();
        let producers: Vec<_> = (0..config.producers)
            .map(|p| {
                let mine: Vec<StreamSpec> = specs
                    .iter()
                    .filter(|s| s.number as usize % config.producers == p)
                    .cloned()
                    .collect();
                let seed = config.seed.wrapping_add(p as u64);
                scope.spawn(move || producer::run(shared, load_client, mine, seed))
            })
            .collect();
        let mut last_print = Instant::now();
        let mut told_stopping = false;
        while !producers.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            if progress && last_print.elapsed() >= Duration::from_secs(1) {
                last_print = Instant::now();
                print_progress(shared);
            }
            if !told_stopping && shared.stop_requested().is_some() {
                told_stopping = true;
                let signal = interrupt::signal_name(interrupt.signal().unwrap_or_default());
                eprintln!(
                    "{}loadgen: {signal}: stopping, collecting the acknowledgements in flight (a second signal quits at once)",
                    if progress { "\n" } else { "" }
                );
            }
        }
        if progress {
            eprintln!();
        }
        let producers: Vec<ProducerOutcome> = producers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect();
        // Followers stop at each stream's tail as it is now.
        *shared.producers_done_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let tails = check_tails(bounded_client, &specs, config.drain);
        for (spec, tail) in specs.iter().zip(&tails) {
            // Unknown (the check failed): followers run to the drain limit rather than stop
            // at once with the end-to-end figures cut short.
            let tail = tail.as_ref().map_or_else(
                |e| {
                    eprintln!("loadgen: {}: final tail: {e}", spec.address);
                    u64::MAX
                },
                |&tail| tail,
            );
            shared.final_tails[spec.number as usize].store(tail, Ordering::Release);
        }
        let consumers: Vec<ConsumerOutcome> = consumers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect();
        (producers, consumers, tails)
    });

    let mut ack = crate::stats::histogram();
    let mut e2e = crate::stats::histogram();
    let mut errors = Vec::new();
    let (mut measured_records, mut measured_bytes) = (0, 0);
    let (mut sent, mut acked, mut failed, mut unanswered, mut unsent, mut abandoned) =
        (0, 0, 0, 0, 0, 0);
    let mut ledgers = Vec::new();
    for p in producers {
        ack.add(&p.ack).map_err(|e| format!("merge histograms: {e:?}"))?;
        measured_records += p.measured_records;
        measured_bytes += p.measured_bytes;
        sent += p.sent_batches;
        acked += p.acked_batches;
        failed += p.failed_batches;
        unanswered += p.unanswered_batches;
        unsent += p.unsent_batches;
        abandoned += p.abandoned_batches;
        errors.extend(p.errors);
        ledgers.extend(p.ledgers);
    }
    let mut delivered = 0;
    for c in consumers {
        e2e.add(&c.e2e).map_err(|e| format!("merge histograms: {e:?}"))?;
        delivered += c.delivered;
        errors.extend(c.error);
    }

    // Interrupted: no read-back. One a signal cut short is not kept either: its counts and
    // verdicts would be of part of the streams.
    let wanted = (config.catch_up || config.verify) && interrupt.signal().is_none();
    let read_back = wanted
        .then(|| read_back_all(&bounded_client, &config, ledgers, &tails, interrupt))
        .filter(|_| interrupt.signal().is_none());

    let clock = shared.clock;
    let seconds = (Instant::now().saturating_duration_since(clock.start).as_secs() as usize + 1)
        .min(seconds_max);
    Ok(Outcome {
        url,
        start_unix_ns: clock.start_unix_ns,
        measured_seconds: shared
            .window_end()
            .saturating_duration_since(clock.measure_from)
            .as_secs_f64(),
        interrupted: interrupt.signal(),
        ack,
        e2e,
        ack_intervals: shared.ack_intervals.take(),
        e2e_intervals: shared.e2e_intervals.take(),
        warmup_seconds: config.warmup.as_secs() as usize,
        acked_per_second: Timeline::snapshot(&shared.timeline.acked_records, seconds),
        acked_bytes_per_second: Timeline::snapshot(&shared.timeline.acked_bytes, seconds),
        delivered_per_second: Timeline::snapshot(&shared.timeline.delivered_records, seconds),
        measured_records,
        measured_bytes,
        sent_batches: sent,
        acked_batches: acked,
        failed_batches: failed,
        unanswered_batches: unanswered,
        unsent_batches: unsent,
        abandoned_batches: abandoned,
        delivered,
        errors,
        read_back,
        config,
    })
}

/// At most this many tails are checked at once.
const TAIL_CHECKS_AT_ONCE: usize = 16;

/// The longest a producer tries one connection for its append session (at most
/// `--drain`): far above a connection's round trip, and short enough that reopening a
/// session while the server's host is unreachable holds the schedule of the producer's
/// other streams only that long per try.
const SESSION_CONNECT_MAX: Duration = Duration::from_secs(1);

/// Each stream's tail now (by `specs` order; an error does not name the stream), checked
/// concurrently under one deadline, `drain` from now: a check not begun by then is not
/// made. A check that waited `drain` is not made again, so a
/// server that stopped answering holds this about `drain`, however many streams there
/// are.
fn check_tails(client: &Client, specs: &[StreamSpec], drain: Duration) -> Vec<Result<u64, String>> {
    let deadline = Instant::now() + drain;
    let next = AtomicUsize::new(0);
    let checkers = specs.len().clamp(1, TAIL_CHECKS_AT_ONCE);
    let checked: Vec<(usize, Result<u64, String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..checkers)
            .map(|_| {
                scope.spawn(|| {
                    let mut checked = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(spec) = specs.get(i) else { break };
                        let tail = if Instant::now() >= deadline {
                            Err(format!("not checked: the tail checks took --drain ({drain:?})"))
                        } else {
                            client
                                .check_tail(&spec.address)
                                .map(|tail| tail.seq_num)
                                .map_err(|e| e.to_string())
                        };
                        checked.push((i, tail));
                    }
                    checked
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut tails: Vec<Result<u64, String>> = specs.iter().map(|_| Err(String::new())).collect();
    for (i, tail) in checked {
        tails[i] = tail;
    }
    tails
}

/// One read-back thread's records, errors and verdicts.
type ReaderResult = (u64, u64, Vec<String>, Vec<(String, Verdict)>);

/// Reads every stream back from its first record of the run to its tail at the end of the
/// load (`tails`, by stream number), on `max(consumers, 1)` threads (at most one per
/// stream), checking each when verifying. A stream whose tail is unknown is not read, and
/// once a read finds the server not answering within `--drain` no other begins: their
/// read-backs, and verdicts, are incomplete.
fn read_back_all(
    client: &Client,
    config: &Config,
    ledgers: Vec<(StreamSpec, crate::verify::Ledger)>,
    tails: &[Result<u64, String>],
    interrupt: &Interrupt,
) -> ReadBackOutcome {
    let readers = config.consumers.max(1).min(ledgers.len().max(1));
    let mut work: Vec<Vec<(StreamSpec, crate::verify::Ledger)>> =
        (0..readers).map(|_| Vec::new()).collect();
    for (i, item) in ledgers.into_iter().enumerate() {
        work[i % readers].push(item);
    }
    let silent = AtomicBool::new(false);
    let started = Instant::now();
    let results: Vec<ReaderResult> = std::thread::scope(|scope| {
        let silent = &silent;
        let handles: Vec<_> = work
            .into_iter()
            .map(|items| {
                scope.spawn(move || {
                    let (mut records, mut bytes) = (0, 0);
                    let mut errors = Vec::new();
                    let mut verdicts = Vec::new();
                    for (spec, ledger) in items {
                        let mut checker = config.verify.then(|| Checker::new(spec.number, ledger));
                        let r = match &tails[spec.number as usize] {
                            Ok(tail) => consumer::read_back(
                                client,
                                &spec,
                                *tail,
                                checker.as_mut(),
                                interrupt,
                                silent,
                                config.drain,
                            ),
                            Err(e) => ReadBack {
                                next_seq_num: spec.base_seq,
                                incomplete: Some(format!("not read: its tail: {e}")),
                                ..ReadBack::default()
                            },
                        };
                        records += r.records;
                        bytes += r.bytes;
                        errors.extend(
                            r.incomplete.as_ref().map(|why| format!("{}: {why}", spec.address)),
                        );
                        if let Some(c) = checker {
                            let verdict = match r.incomplete {
                                None => c.finish(),
                                Some(why) => c.finish_incomplete(r.next_seq_num, why),
                            };
                            verdicts.push((spec.address.to_string(), verdict));
                        }
                    }
                    (records, bytes, errors, verdicts)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let mut out =
        ReadBackOutcome { seconds: started.elapsed().as_secs_f64(), ..Default::default() };
    for (records, bytes, errors, verdicts) in results {
        out.records += records;
        out.bytes += bytes;
        out.errors.extend(errors);
        out.verdicts.extend(verdicts);
    }
    out.errors.sort();
    out.verdicts.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn print_progress(shared: &Shared) {
    let clock = shared.clock;
    let now = Instant::now();
    let elapsed = now.saturating_duration_since(clock.start).as_secs_f64();
    let second = clock.second(now).saturating_sub(1);
    let rate = shared.timeline.acked_records.get(second).map_or(0, |c| c.load(Ordering::Relaxed));
    let phase = if now < clock.measure_from { "warm-up" } else { "measuring" };
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r{phase:>9} {elapsed:6.1}s  acked {:>12} records  {rate:>9} rec/s  delivered {:>12}  errors {}   ",
        shared.acked_records.load(Ordering::Relaxed),
        shared.delivered_records.load(Ordering::Relaxed),
        shared.errors.load(Ordering::Relaxed),
    );
    let _ = err.flush();
}
