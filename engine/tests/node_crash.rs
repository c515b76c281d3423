//! Crash test of the whole engine: a child process runs a node with producers on express
//! and standard streams and prints every acknowledged batch; the parent kills it with
//! SIGKILL at a random moment, restarts a node on the same directory, and checks that
//! every acknowledged batch is there — whole, once, in order — that no part of any
//! batch is missing (a batch is all there or not at all), that timestamps never
//! decrease, and that the fencing token of the last completed fence survived. Several
//! rounds on one directory, each round's producers continuing the same streams.
//!
//! Even rounds send most chunks straight into settled objects of their streams (decision
//! 0010), odd ones into transit bundles.
//!
//! `NOVA_NODE_CRASH_SEED` replays a failing run.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::thread;
use std::time::Duration;

use common::crash::{self, Rng};
use common::*;
use engine::framing::AppendConditions;
use engine::names::{BucketName, StreamKey};
use engine::node::Client;
use engine::options::{BucketConfigRequest, StorageClass, StreamOptionsRequest};

const CHILD_ENV: &str = "NOVA_NODE_CRASH_CHILD";
const ROUND_ENV: &str = "NOVA_NODE_CRASH_ROUND";
const TEST_NAME: &str = "kill9_loses_no_acknowledged_batch_and_exposes_no_partial_one";
const ROUNDS: u32 = 5;
const STREAMS: usize = 4;

/// Streams 0 and 1 are express, 2 and 3 standard (acknowledged after a short delay).
fn stream_of(index: usize) -> (BucketName, StreamKey) {
    let bucket = if index < 2 { "crash-express" } else { "crash-standard" };
    (bucket_named(bucket), key(&format!("s{index}")))
}

fn bucket_named(name: &str) -> BucketName {
    common::bucket(name)
}

fn ensure_buckets(client: &Client) {
    for (name, class) in
        [("crash-express", StorageClass::Express), ("crash-standard", StorageClass::Standard)]
    {
        let request = BucketConfigRequest {
            create_stream_on_append: true,
            defaults: StreamOptionsRequest {
                class: Some(class),
                batch_max_delay_ms: 2,
                ..Default::default()
            },
            ..Default::default()
        };
        block_on(client.control().ensure_bucket(&bucket_named(name), &request)).expect("bucket");
    }
}

/// The child: produce until killed. Lines: `fenced <stream>` once its fence returned,
/// then `ack <stream> <batch> <start> <end>` for every acknowledged batch.
fn child(dir: &str, round: u32) {
    let mut config = config(std::path::Path::new(dir), 1);
    if round.is_multiple_of(2) {
        // Even rounds cut a bundle at every request and write any cut of one stream's
        // chunks alone as its settled object (decision 0010), so many go that way.
        config.uploader.bundle_delay = Duration::ZERO;
        config.uploader.direct_settle_bytes_min = 1;
    }
    let node = start(config);
    let client = node.client();
    ensure_buckets(&client);
    let token = format!("round-{round}");
    let producers: Vec<_> = (0..STREAMS)
        .map(|s| {
            let (client, token) = (client.clone(), token.clone());
            thread::spawn(move || {
                let (bucket, key) = stream_of(s);
                // Make sure the stream exists, then take it over with this round's token.
                block_on(client.append(&bucket, &key, plain(&[&format!("{round}:{s}:open:0:1")])))
                    .expect("open");
                block_on(client.fence(&bucket, &key, token.clone(), None)).expect("fence");
                println!("fenced {s}");
                for batch_index in 0u64.. {
                    let n = 1 + (batch_index % 7) as usize;
                    let bodies: Vec<Vec<u8>> = (0..n)
                        .map(|i| format!("{round}:{s}:{batch_index}:{i}:{n}").into_bytes())
                        .collect();
                    let conditions =
                        AppendConditions { fencing_token: Some(&token), ..Default::default() };
                    let ack = block_on(client.append(&bucket, &key, batch(&bodies, conditions)))
                        .expect("append");
                    let mut out = std::io::stdout().lock();
                    writeln!(
                        out,
                        "ack {s} {round}:{batch_index} {} {}",
                        ack.start.seq_num, ack.end.seq_num
                    )
                    .and_then(|()| out.flush())
                    .expect("parent reads");
                }
            })
        })
        .collect();
    for producer in producers {
        let _ = producer.join();
    }
}

/// What the child printed.
enum Line {
    Fenced(usize),
    Ack { stream: usize, batch: String, range: (u64, u64) },
}

fn parse_line(line: &str) -> Option<Line> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let parsed = match words.as_slice() {
        ["fenced", s] => Line::Fenced(s.parse().ok()?),
        ["ack", s, batch, start, end] => Line::Ack {
            stream: s.parse().ok()?,
            batch: (*batch).to_owned(),
            range: (start.parse().ok()?, end.parse().ok()?),
        },
        _ => return None,
    };
    Some(parsed)
}

fn parse_checked(line: &str) -> Option<Line> {
    let parsed = parse_line(line);
    assert!(
        parsed.is_some() || !(line.starts_with("ack") || line.starts_with("fenced")),
        "unparsable {line:?}"
    );
    parsed
}

#[derive(Default)]
struct Expected {
    /// (stream, "round:batch") -> (start, end)
    acked: HashMap<(usize, String), (u64, u64)>,
    /// The last round whose fence returned, per stream.
    fenced: HashMap<usize, u32>,
}

#[test]
fn kill9_loses_no_acknowledged_batch_and_exposes_no_partial_one() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        let round = std::env::var(ROUND_ENV).expect("round").parse().expect("number");
        child(&dir, round);
        return;
    }
    let mut rng = Rng::seeded("NOVA_NODE_CRASH_SEED");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut expected = Expected::default();
    for round in 0..ROUNDS {
        let run_for = Duration::from_millis(20 + rng.below(400));
        let envs = [(CHILD_ENV, dir.path().display().to_string()), (ROUND_ENV, round.to_string())];
        let lines = crash::run_and_kill(
            TEST_NAME,
            &envs,
            parse_checked,
            |l| matches!(l, Line::Ack { .. }),
            run_for,
        );
        for line in lines {
            match line {
                Line::Fenced(stream) => {
                    expected.fenced.insert(stream, round);
                }
                Line::Ack { stream, batch, range } => {
                    expected.acked.insert((stream, batch), range);
                }
            }
        }
        verify(dir.path(), &expected, round);
    }
    // The settler settles nothing within the test (its target is 32 MiB, its age 5
    // minutes): objects under a bucket's prefix are the uploader's.
    let buckets = [bucket_named("crash-express"), bucket_named("crash-standard")];
    let objects = std::fs::read_dir(dir.path().join("objects")).expect("the objects directory");
    let settled =
        objects.flatten().any(|entry| buckets.iter().any(|b| entry.file_name() == b.as_str()));
    assert!(settled, "some chunks went straight into settled objects");
}

/// Restarts a node on the directory and checks every stream against what was acked.
fn verify(dir: &std::path::Path, expected: &Expected, round: u32) {
    let node = start(config(dir, 1));
    let client = node.client();
    for s in 0..STREAMS {
        let (bucket, key) = stream_of(s);
        let records = match block_on(client.get_stream(&bucket, &key)) {
            Ok(_) => read_all(&client, &bucket, &key),
            Err(_) => Vec::new(), // killed before the stream was created
        };
        let mut seen = HashSet::new();
        let mut at = 0;
        let mut last_ts = 0;
        while at < records.len() {
            let (seq, ts, body) = &records[at];
            assert_eq!(*seq, at as u64, "stream {s}: sequence numbers are contiguous from 0");
            assert!(*ts >= last_ts, "stream {s}: timestamps never decrease");
            last_ts = *ts;
            let text = String::from_utf8(body.clone()).expect("utf-8 bodies");
            let parts: Vec<&str> = text.split(':').collect();
            let [batch_round, stream, batch_index, index, count] = parts.as_slice() else {
                panic!("stream {s}: unexpected body {text:?}")
            };
            assert_eq!(*stream, s.to_string(), "stream {s}: record of another stream");
            assert_eq!(*index, "0", "stream {s}: batch starts mid-way at seq {seq}: {text}");
            let n: usize = count.parse().expect("count");
            let batch_id = format!("{batch_round}:{batch_index}");
            assert!(
                at + n <= records.len(),
                "stream {s}: batch {batch_id} is cut short at the end"
            );
            for (i, (seq_i, ts_i, body_i)) in records[at..at + n].iter().enumerate() {
                let want = format!("{batch_round}:{s}:{batch_index}:{i}:{n}");
                assert_eq!(
                    String::from_utf8_lossy(body_i),
                    want,
                    "stream {s}: batch {batch_id} is whole, in order"
                );
                assert_eq!(ts_i, ts, "stream {s}: one stamp per batch");
                assert_eq!(*seq_i, (at + i) as u64);
            }
            assert!(seen.insert(batch_id.clone()), "stream {s}: batch {batch_id} landed twice");
            if let Some(&(start, end)) = expected.acked.get(&(s, batch_id.clone())) {
                assert_eq!(
                    (start, end),
                    (at as u64, (at + n) as u64),
                    "stream {s}: batch {batch_id} moved"
                );
            }
            at += n;
        }
        for ((stream, batch_id), range) in &expected.acked {
            if *stream == s {
                assert!(
                    seen.contains(batch_id),
                    "stream {s}: acknowledged batch {batch_id} at {range:?} is lost"
                );
            }
        }
        if let Some(&fenced_round) = expected.fenced.get(&s) {
            let (record, _) =
                block_on(client.get_stream(&bucket, &key)).expect("stream exists once fenced");
            let token_round: u32 =
                record.fencing_token.trim_start_matches("round-").parse().expect("token");
            assert!(
                (fenced_round..=round).contains(&token_round),
                "stream {s}: token {} after the fence of round {fenced_round} returned",
                record.fencing_token
            );
        }
    }
    drop(client);
    node.stop();
}
