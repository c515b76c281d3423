//! Crash test over HTTP: producers append to a real `nova serve` child over real
//! sockets, the test kills the server with SIGKILL at a random moment, starts it again on
//! the same data directory and object store, and checks every stream: each batch the
//! server answered 200 is there — whole, once, at the position its answer named — no
//! batch is there in part, sequence numbers run from 0 without a hole, and timestamps
//! never decrease. Several rounds on one directory, each round's producers going on with
//! the same streams. The engine's own crash test (engine/tests/node_crash.rs) kills a
//! node in process; this one covers what the HTTP layer adds: that a 200 never goes out
//! before the engine's acknowledgement, over both wire formats and both storage classes.
//!
//! Streams 0 and 1 are express, 2 and 3 standard. Even streams are written through a
//! pipelined binary append session (several batches in flight when the kill comes), odd
//! ones with one JSON append at a time.
//!
//! Even rounds run with a bundle cut at every request and a 4 KiB floor for writing one
//! stream's cut as its settled object, so that most chunks go that way (decision 0010);
//! odd rounds with the defaults, so mostly into transit bundles.
//!
//! `NOVA_HTTP_CRASH_SEED` replays a failing run's kill moments.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Nova, Store};
use engine::options::StorageClass;
use net::client::{
    Ack, Address, Batch, Bucket, Client, Conditions, Format, ReadOptions, Record, SessionAck,
};

const ROUNDS: u32 = 3;
const STREAMS: usize = 4;
/// Acknowledged batches every stream has in a round before the kill may come.
const ACKS_BEFORE_KILL: usize = 3;
/// The kill comes up to this long after that.
const KILL_WINDOW_MS: u64 = 300;
/// Batches a session keeps in flight.
const SESSION_IN_FLIGHT: usize = 8;

#[test]
fn sigkill_loses_no_acknowledged_append() {
    crash_case(Store::Local);
}

#[test]
fn s3_sigkill_loses_no_acknowledged_append() {
    crash_case(Store::s3());
}

/// A batch's acknowledgement: (stream, "round:batch", start, end).
type Acked = (usize, String, u64, u64);

fn crash_case(store: Store) {
    let mut rng = Rng::seeded("NOVA_HTTP_CRASH_SEED");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let data = dir.path().join("data");
    let mut nova = Nova::start_in(store.clone(), &data, flags(0), &[]);
    ensure_buckets(&nova);
    let mut acked: Vec<Acked> = Vec::new();
    for round in 0..ROUNDS {
        let delay = Duration::from_millis(rng.below(KILL_WINDOW_MS));
        acked.extend(produce_until_killed(nova, round, delay));
        nova = Nova::start_in(store.clone(), &data, flags(round + 1), &[]);
        verify(&nova, &acked, round);
    }
    if matches!(store, Store::Local) {
        // The settler would settle nothing within the test (its target is 32 MiB, its
        // age 5 minutes): settled objects are the uploader's.
        let buckets = std::fs::read_dir(data.join("objects")).expect("the objects directory");
        let settled = buckets
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().starts_with("crash-"));
        assert!(settled, "some chunks went straight into settled objects");
    }
}

/// The server's flags in `round` (see the module doc).
fn flags(round: u32) -> &'static [&'static str] {
    match round % 2 {
        0 => &["--bundle-delay-ms", "0", "--direct-settle-bytes-min", "4KiB"],
        _ => &[],
    }
}

fn address(stream: usize) -> Address {
    let bucket = if stream < 2 { "crash-express" } else { "crash-standard" };
    Address::new(bucket, format!("s{stream}"))
}

fn ensure_buckets(nova: &Nova) {
    let client = Client::new(&nova.url).expect("url");
    for (name, class) in
        [("crash-express", StorageClass::Express), ("crash-standard", StorageClass::Standard)]
    {
        let mut bucket = Bucket::new(name);
        bucket.create_on_append = true;
        bucket.defaults.class = Some(class);
        // Standard batches wait for their bundle; a short batch delay keeps rounds short.
        bucket.defaults.batch_max_delay_ms = Some(2);
        client.ensure_bucket(&bucket).expect("ensure the bucket");
    }
}

/// Batch `index` of `stream` in `round`: 1 to 7 records.
fn batch(round: u32, stream: usize, index: u64) -> Batch {
    let mut batch = Batch::new();
    for i in 0..records_in(index) {
        batch.push::<&[u8], &[u8]>(&[], body(round, stream, index, i).as_bytes()).expect("fits");
    }
    batch
}

fn records_in(index: u64) -> usize {
    1 + (index % 7) as usize
}

/// Record `i` of a batch: `round:stream:index:i:n:` and up to 4 KiB of padding, so that
/// batches span chunk and bundle boundaries.
fn body(round: u32, stream: usize, index: u64, i: usize) -> String {
    let padding = "p".repeat((index as usize * 613) % 4096);
    format!("{round}:{stream}:{index}:{i}:{}:{padding}", records_in(index))
}

/// Runs every stream's producer against `nova` until `delay` after each stream has
/// [`ACKS_BEFORE_KILL`] acknowledgements, kills the server with SIGKILL, and returns
/// every acknowledgement the producers were given.
fn produce_until_killed(nova: Nova, round: u32, delay: Duration) -> Vec<Acked> {
    let url = nova.url.clone();
    // Every acknowledgement so far, and how many each stream has; a producer signals on
    // each.
    let progress = (Mutex::new((Vec::new(), [0; STREAMS])), Condvar::new());
    thread::scope(|scope| {
        for stream in 0..STREAMS {
            let (progress, url) = (&progress, url.as_str());
            scope.spawn(move || {
                let record = |index: u64, ack: Ack| {
                    assert_eq!(
                        ack.end.seq_num - ack.start.seq_num,
                        records_in(index) as u64,
                        "stream {stream}: an acknowledgement spans its batch"
                    );
                    let mut guard = progress.0.lock().expect("no producer panicked");
                    let (acked, counts) = &mut *guard;
                    acked.push((
                        stream,
                        format!("{round}:{index}"),
                        ack.start.seq_num,
                        ack.end.seq_num,
                    ));
                    counts[stream] += 1;
                    progress.1.notify_one();
                };
                if stream % 2 == 0 {
                    produce_pipelined(url, stream, round, record);
                } else {
                    produce_one_at_a_time(url, stream, round, record);
                }
            });
        }
        let guard = progress.0.lock().expect("no producer panicked");
        let (guard, waited) = progress
            .1
            .wait_timeout_while(guard, Duration::from_secs(60), |(_, counts)| {
                counts.iter().any(|&count| count < ACKS_BEFORE_KILL)
            })
            .expect("no producer panicked");
        assert!(!waited.timed_out(), "round {round}: the producers made no headway: {:?}", guard.1);
        drop(guard);
        thread::sleep(delay);
        let status = nova.kill();
        assert!(!status.success(), "the server was killed, not stopped: {status}");
    });
    progress.0.into_inner().expect("no producer panicked").0
}

/// Appends batches through a binary session until its connection fails; every batch it
/// answered with an acknowledgement goes to `record`, in order.
fn produce_pipelined(url: &str, stream: usize, round: u32, mut record: impl FnMut(u64, Ack)) {
    let client = Client::new(url).expect("url").with_format(Format::Binary);
    let Ok(mut session) = client.append_session(&address(stream), SESSION_IN_FLIGHT) else {
        return;
    };
    // Tickets count from 0 in submission order: batch `index` is ticket `index`.
    let mut take = |ack: SessionAck| ack.result.map(|result| record(ack.ticket, result)).is_ok();
    for index in 0u64.. {
        if session.submit(&batch(round, stream, index), &Conditions::default()).is_err() {
            break;
        }
        while let Some(ack) = session.try_recv() {
            if !take(ack) {
                return;
            }
        }
    }
    for ack in session.finish() {
        if !take(ack) {
            return;
        }
    }
}

/// Appends one JSON batch at a time until one fails.
fn produce_one_at_a_time(url: &str, stream: usize, round: u32, mut record: impl FnMut(u64, Ack)) {
    let client = Client::new(url).expect("url").with_format(Format::Json);
    for index in 0u64.. {
        match client.append(&address(stream), &batch(round, stream, index), &Conditions::default())
        {
            Ok(ack) => record(index, ack),
            Err(_) => return,
        }
    }
}

/// Every record of the stream, paging until the tail.
fn read_all(client: &Client, stream: usize) -> Vec<Record> {
    let mut records = Vec::new();
    loop {
        let options = ReadOptions::from_seq_num(records.len() as u64);
        let page = client.read(&address(stream), &options).expect("read");
        records.extend(page.records);
        assert_eq!(
            page.next_seq_num,
            records.len() as u64,
            "stream {stream}: pages are contiguous"
        );
        if page.next_seq_num == page.tail.seq_num {
            return records;
        }
    }
}

/// Checks every stream on the restarted server against what was acknowledged.
fn verify(nova: &Nova, acked: &[Acked], round: u32) {
    let client = Client::new(&nova.url).expect("url");
    for stream in 0..STREAMS {
        let records = read_all(&client, stream);
        let mut seen = HashSet::new();
        let mut positions = HashMap::new();
        let (mut at, mut last_stamp) = (0, 0);
        while at < records.len() {
            let first = &records[at];
            assert_eq!(first.seq_num, at as u64, "stream {stream}: numbered from 0, no hole");
            assert!(first.timestamp >= last_stamp, "stream {stream}: a stamp went back");
            last_stamp = first.timestamp;
            let text = String::from_utf8(first.body.clone()).expect("utf-8 bodies");
            let fields: Vec<&str> = text.split(':').collect();
            let [batch_round, of_stream, index, "0", _, _] = fields.as_slice() else {
                panic!("stream {stream}: seq {at} does not start a batch: {text:.40}")
            };
            assert_eq!(*of_stream, stream.to_string(), "stream {stream}: another stream's record");
            let (batch_round, index) =
                (batch_round.parse().expect("a round"), index.parse().expect("an index"));
            let n = records_in(index);
            let id = format!("{batch_round}:{index}");
            assert!(at + n <= records.len(), "stream {stream}: batch {id} is cut short at the end");
            for (i, record) in records[at..at + n].iter().enumerate() {
                assert_eq!(
                    record.body,
                    body(batch_round, stream, index, i).as_bytes(),
                    "stream {stream}: batch {id} is whole, in order"
                );
                assert_eq!(
                    record.timestamp, first.timestamp,
                    "stream {stream}: one stamp per batch"
                );
                assert_eq!(record.seq_num, (at + i) as u64);
            }
            assert!(seen.insert(id.clone()), "stream {stream}: batch {id} landed twice");
            positions.insert(id, (at as u64, (at + n) as u64));
            at += n;
        }
        let acknowledged = acked.iter().filter(|a| a.0 == stream).count();
        println!(
            "after round {round}, stream {stream}: {} batches, {acknowledged} acknowledged",
            seen.len()
        );
        for (of_stream, id, start, end) in acked.iter().filter(|a| a.0 == stream) {
            assert_eq!(
                positions.get(id),
                Some(&(*start, *end)),
                "stream {of_stream}: batch {id}, acknowledged at {start}..{end}, after round {round}"
            );
        }
    }
}

/// xorshift64*: kill moments that a failing run's seed replays.
struct Rng(u64);

impl Rng {
    fn seeded(seed_env: &str) -> Self {
        let seed = std::env::var(seed_env).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        println!("replay with {seed_env}={seed}");
        Self(seed | 1)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}
