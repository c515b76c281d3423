//! Express appends through a node in this process (one shard, 1 KiB records), next to
//! raw O_DIRECT writes with fdatasync on the same disk, measured in the same run.
//!
//! The reference is what the disk gives the same system calls with nothing of nova in
//! the way: sequential O_DIRECT writes through glommio, each followed by an fdatasync —
//! large writes for throughput, 4 KiB writes at queue depth 1 for latency. The engine's
//! figures are ratios to it.
//!
//! Producers are closed loops on their own threads (each waits for its ack before the
//! next append), so latency is measured per append from send to acknowledgement; the
//! throughput cases run many producers so that group commit has batches to group.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine::framing::{AppendBuilder, AppendConditions};
use engine::names::{BucketName, StreamKey};
use engine::node::{Client, Node, NodeConfig};
use engine::options::{BucketConfigRequest, StorageClass, StreamOptionsRequest};
use engine::shard::AppendRequest;
use futures_lite::future::block_on;
use glommio::io::DmaFile;
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;

use crate::harness::{self, Percentiles, Warmup};

const RECORD_BYTES: usize = 1024;

struct Durations {
    warmup: Duration,
    measure: Duration,
}

/// The raw reference: bytes per second of `block`-byte O_DIRECT writes each followed by
/// an fdatasync, and the latency of one such write plus fdatasync.
fn raw_reference(dir: &Path, block: usize, duration: Duration) -> (f64, Histogram<u64>) {
    let path = dir.join(format!("raw-{block}.bin"));
    let handle = LocalExecutorBuilder::new(Placement::Unbound)
        .name("bench-raw")
        .spawn(move || async move {
            let file = DmaFile::create(&path).await.expect("create the reference file");
            let span: u64 = 256 << 20;
            file.pre_allocate(span, false).await.expect("preallocate");
            let mut latency = Histogram::<u64>::new(3).expect("histogram");
            let (mut written, mut position) = (0u64, 0u64);
            let started = Instant::now();
            while started.elapsed() < duration {
                let mut buf = file.alloc_dma_buffer(block);
                buf.as_bytes_mut().fill(0x5a);
                let one = Instant::now();
                file.write_at(buf, position).await.expect("write");
                file.fdatasync().await.expect("fdatasync");
                latency.record(one.elapsed().as_micros() as u64).expect("in range");
                written += block as u64;
                position = (position + block as u64) % span;
            }
            let rate = written as f64 / started.elapsed().as_secs_f64();
            file.close().await.expect("close");
            let _ = std::fs::remove_file(&path);
            (rate, latency)
        })
        .expect("start the reference executor");
    handle.join().expect("reference run")
}

fn batch(records: usize) -> AppendRequest {
    let body = vec![0x42u8; RECORD_BYTES];
    let mut builder = AppendBuilder::new();
    for _ in 0..records {
        builder.push::<&[u8], &[u8]>(&[], &body).expect("fits");
    }
    AppendRequest { framed: builder.finish(&AppendConditions::default()).into(), offered: None }
}

struct Outcome {
    appends_per_second: f64,
    content_bytes_per_second: f64,
    latency: Percentiles,
    batches_per_sync: f64,
}

/// `producers` closed-loop threads appending `records`-record batches to their own
/// streams for the measured time after a warm-up.
fn run_case(
    client: &Client,
    bucket: &BucketName,
    records: usize,
    producers: usize,
    durations: &Durations,
) -> Outcome {
    let before = block_on(client.stats()).expect("stats")[0];
    let run = harness::closed_loop(
        producers,
        Warmup::fixed(durations.warmup),
        durations.measure,
        |p| {
            let (client, bucket) = (client.clone(), bucket.clone());
            let key = StreamKey::parse(&format!("bench-{records}-{p}")).expect("key");
            let request = batch(records);
            move || {
                block_on(client.append(&bucket, &key, request.clone())).expect("append");
                true
            }
        },
        || {},
    );
    let after = block_on(client.stats()).expect("stats")[0];
    let groups = (after.groups() - before.groups()).max(1);
    Outcome {
        appends_per_second: run.rate(1),
        content_bytes_per_second: run.rate((records * RECORD_BYTES) as u64),
        latency: Percentiles::of(&run.latency),
        batches_per_sync: (after.batches_acked() - before.batches_acked()) as f64 / groups as f64,
    }
}

fn data_dir() -> PathBuf {
    // On the real disk (not a tmpfs): the reference and the node must share a device.
    let dir = std::env::current_dir().expect("cwd").join("target").join("bench-engine");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench directory");
    dir
}

/// `objects_dir`: where the node's local object store goes (default: under the data
/// directory, on the journal's disk); a tmpfs directory separates the object writes'
/// cost from the disk's.
pub fn run(quick: bool, objects_dir: Option<&std::path::Path>) {
    let durations = if quick {
        Durations { warmup: Duration::from_millis(20), measure: Duration::from_millis(100) }
    } else {
        Durations { warmup: Duration::from_millis(500), measure: Duration::from_secs(3) }
    };
    let dir = data_dir();
    let mut config = NodeConfig::new(dir.join("node"));
    config.shards = 1;
    config.first_core = Some(0);
    if let Some(objects) = objects_dir {
        config.objects = engine::node::ObjectStoreConfig::Local(objects.to_owned());
    }
    let node = Node::start(config).expect("node");
    let client = node.client();
    let bucket = BucketName::parse("bench").expect("bucket");
    let request = BucketConfigRequest {
        create_stream_on_append: true,
        defaults: StreamOptionsRequest { class: Some(StorageClass::Express), ..Default::default() },
        ..Default::default()
    };
    block_on(client.control().create_bucket(&bucket, &request, None)).expect("bucket");

    // Latency first, while the disk is quiet: a large write burst leaves the device busy
    // for seconds, which would slow whichever side ran after it.
    let (_, raw_latency) = raw_reference(&dir, 4096, durations.measure);
    let raw_latency = Percentiles::of(&raw_latency);
    let moderate = run_case(&client, &bucket, 1, 1, &durations);
    let cases: &[(&str, usize, usize)] = &[
        ("16-record batches, 8 producers", 16, 8),
        ("256-record batches, 8 producers", 256, 8),
        ("256-record batches, 32 producers", 256, 32),
        ("1-record batches, 32 producers", 1, 32),
    ];
    let outcomes: Vec<Outcome> = cases
        .iter()
        .map(|(_, records, producers)| run_case(&client, &bucket, *records, *producers, &durations))
        .collect();
    // The throughput reference last, for the same reason; one second is enough.
    let (raw_rate, _) = raw_reference(&dir, 1 << 20, durations.measure.min(Duration::from_secs(1)));

    println!("\n### Express appends through the engine (1 shard, 1 KiB records)\n");
    println!(
        "Reference in the same run: 4 KiB O_DIRECT write + fdatasync at queue depth 1: p50 {} µs, \
         p99 {} µs, p99.9 {} µs; 1 MiB O_DIRECT writes + fdatasync: {:.0} MB/s.\n",
        raw_latency.p50,
        raw_latency.p99,
        raw_latency.p999,
        raw_rate / 1e6,
    );
    println!(
        "| case | appends/s | MB/s content | ratio to raw MB/s | p50 µs | p99 µs | p99.9 µs | p99 / raw p99 | batches per group commit |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let print = |name: &str, outcome: &Outcome| {
        println!(
            "| {name} | {:.0} | {:.1} | {:.2} | {} | {} | {} | {:.2} | {:.1} |",
            outcome.appends_per_second,
            outcome.content_bytes_per_second / 1e6,
            outcome.content_bytes_per_second / raw_rate,
            outcome.latency.p50,
            outcome.latency.p99,
            outcome.latency.p999,
            outcome.latency.p99 as f64 / raw_latency.p99.max(1) as f64,
            outcome.batches_per_sync,
        );
    };
    print("moderate: 1 producer, 1-record batches", &moderate);
    for ((name, _, _), outcome) in cases.iter().zip(&outcomes) {
        print(name, outcome);
    }
    drop(client);
    node.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
