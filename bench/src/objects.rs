//! Standard-class appends through a node in this process (1 KiB records), acknowledged
//! only once their transit bundle is durable in the object store, against (a) the local
//! directory store and (b) a real S3-protocol server on loopback (moto, from
//! `NOVA_MOTO_SERVER`); next to raw PUTs of the same store, measured in the same run.
//!
//! The reference is what the store gives the uploader's own access pattern with nothing
//! of nova in the way: PUTs of the bundle sizes the case produced, through the same
//! `s3::ObjectStore` on a current-thread tokio runtime (as the uploader runs it), as
//! many in flight as the uploader allows. The append figures are ratios to it.
//!
//! Objects written per second and bytes per PUT come from the store itself: after the
//! node stops, `_transit/` is listed, and each bundle is given to the case whose
//! measured window holds its key's write time (`_transit/<written at, ms>-<id>`). The
//! node does not expose its uploader's counters (see docs/benchmarks.md).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use engine::framing::{AppendBuilder, AppendConditions};
use engine::names::{BucketName, StreamKey};
use engine::node::{Client, Node, NodeConfig, ObjectStoreConfig};
use engine::options::{BucketConfigRequest, StorageClass, StreamOptionsRequest};
use engine::shard::AppendRequest;
use engine::transit::{TRANSIT_PREFIX, TransitKey};
use futures_lite::future::block_on;
use hdrhistogram::Histogram;
use s3::{ObjectStore, PutCondition, S3Config, S3Credentials};

use crate::harness::{self, Percentiles, Warmup};

const RECORD_BYTES: usize = 1024;
/// The streams' flush delay: short, so a 1-record batch's latency is the store's and not
/// the 250 ms default's.
const BATCH_MAX_DELAY_MS: u64 = 5;
/// Streams the producers share (producer `p` appends to stream `p % STREAMS`).
const STREAMS: usize = 4;

struct Durations {
    warmup: Duration,
    measure: Duration,
    /// Of each raw PUT reference.
    reference: Duration,
}

/// One case: `producers` closed-loop producers appending `records`-record batches.
#[derive(Clone, Copy)]
struct Case {
    producers: usize,
    records: usize,
}

/// One producer (an ack's latency alone), then 32 of them (throughput).
const CASES: [Case; 3] = [
    Case { producers: 1, records: 1 },
    Case { producers: 32, records: 1 },
    Case { producers: 32, records: 64 },
];

/// What one case measured through the node.
struct Appends {
    appends_per_second: f64,
    content_bytes_per_second: f64,
    latency: Percentiles,
    /// Wall-clock window of the measurement, in ms since the epoch.
    window_ms: (u64, u64),
    upload_jobs: u64,
}

/// What the store holds of one case's window.
#[derive(Default)]
struct Bundles {
    sizes: Vec<u64>,
}

impl Bundles {
    fn bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }
}

/// Raw PUTs of the store.
struct RawPuts {
    bytes_per_second: f64,
    puts_per_second: f64,
    latency: Percentiles,
}

struct Row {
    backend: &'static str,
    case: Case,
    appends: Appends,
    bundles: Bundles,
    raw: RawPuts,
}

/// An object store for the run and what keeps it alive.
struct Backend {
    name: &'static str,
    objects: ObjectStoreConfig,
    _moto: Option<s3::testing::Moto>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn batch(records: usize) -> AppendRequest {
    let body = vec![0x42u8; RECORD_BYTES];
    let mut builder = AppendBuilder::new();
    for _ in 0..records {
        builder.push::<&[u8], &[u8]>(&[], &body).expect("fits");
    }
    AppendRequest { framed: builder.finish(&AppendConditions::default()).into(), offered: None }
}

fn run_case(client: &Client, bucket: &BucketName, case: Case, durations: &Durations) -> Appends {
    let mut window = (0, 0);
    let mut before = Vec::new();
    let run = harness::closed_loop(
        case.producers,
        Warmup::fixed(durations.warmup),
        durations.measure,
        |p| {
            let (client, bucket) = (client.clone(), bucket.clone());
            let key =
                StreamKey::parse(&format!("bench-{}-{}", case.records, p % STREAMS)).expect("key");
            let request = batch(case.records);
            move || {
                block_on(client.append(&bucket, &key, request.clone())).expect("append");
                true
            }
        },
        || {
            window.0 = now_ms();
            before = block_on(client.stats()).expect("stats");
        },
    );
    window.1 = now_ms();
    let after = block_on(client.stats()).expect("stats");
    let jobs =
        |stats: &[engine::shard::ShardStats]| stats.iter().map(|s| s.upload_jobs).sum::<u64>();
    Appends {
        appends_per_second: run.rate(1),
        content_bytes_per_second: run.rate((case.records * RECORD_BYTES) as u64),
        latency: Percentiles::of(&run.latency),
        window_ms: window,
        upload_jobs: jobs(&after) - jobs(&before),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

fn open_store(objects: &ObjectStoreConfig) -> Arc<dyn ObjectStore> {
    match objects {
        ObjectStoreConfig::Local(root) => Arc::new(
            s3::LocalDirStore::open(root, s3::LocalDirOptions::default()).expect("local store"),
        ),
        ObjectStoreConfig::S3(config) => {
            Arc::new(s3::S3Store::new(config.as_ref().clone()).expect("s3 store"))
        }
    }
}

/// Every transit bundle in the store: (written at ms, size).
fn list_bundles(runtime: &tokio::runtime::Runtime, store: &dyn ObjectStore) -> Vec<(u64, u64)> {
    let mut bundles = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = runtime
            .block_on(store.list(TRANSIT_PREFIX, after.as_deref(), s3::LIST_PAGE_KEYS_MAX))
            .expect("list the transit bundles");
        for object in &page.objects {
            if let Ok(key) = TransitKey::parse(&object.key) {
                bundles.push((key.written_at_ms, object.size));
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return bundles,
        }
    }
}

/// PUTs of `sizes` (in turn) under `bench-raw/`, `in_flight` at a time, for `duration`.
fn raw_puts(
    runtime: &tokio::runtime::Runtime,
    store: &Arc<dyn ObjectStore>,
    sizes: &[u64],
    in_flight: usize,
    duration: Duration,
    tag: &str,
) -> RawPuts {
    let payloads: Vec<s3::Bytes> =
        sizes.iter().map(|&size| s3::Bytes::from(vec![0x5au8; size as usize])).collect();
    let run = |duration: Duration, round: &str| {
        runtime.block_on(async {
            let started = Instant::now();
            let tasks: Vec<_> = (0..in_flight)
                .map(|worker| {
                    let (store, payloads) = (Arc::clone(store), payloads.clone());
                    let prefix = format!("bench-raw/{tag}-{round}-{worker}");
                    tokio::spawn(async move {
                        let mut latency = Histogram::<u64>::new(3).expect("histogram");
                        let (mut bytes, mut puts) = (0u64, 0usize);
                        while started.elapsed() < duration {
                            let payload =
                                payloads[(worker + puts * in_flight) % payloads.len()].clone();
                            let size = payload.len() as u64;
                            let key = format!("{prefix}-{puts}");
                            let one = Instant::now();
                            store.put(&key, payload, PutCondition::CreateOnly).await.expect("put");
                            latency.record(one.elapsed().as_micros() as u64).expect("in range");
                            bytes += size;
                            puts += 1;
                        }
                        (bytes, puts, latency)
                    })
                })
                .collect();
            let mut latency = Histogram::<u64>::new(3).expect("histogram");
            let (mut bytes, mut puts) = (0u64, 0usize);
            for task in tasks {
                let (b, p, h) = task.await.expect("put task");
                bytes += b;
                puts += p;
                latency.add(&h).expect("same precision");
            }
            let seconds = started.elapsed().as_secs_f64();
            RawPuts {
                bytes_per_second: bytes as f64 / seconds,
                puts_per_second: puts as f64 / seconds,
                latency: Percentiles::of(&latency),
            }
        })
    };
    run(duration / 5, "warm");
    run(duration, "measure")
}

fn bench_backend(backend: Backend, dir: &std::path::Path, durations: &Durations) -> Vec<Row> {
    let mut config = NodeConfig::new(dir.join(format!("node-{}", backend.name)));
    config.shards = 1;
    config.objects = backend.objects.clone();
    let in_flight = config.uploader.uploads_in_flight_max;
    let node = Node::start(config).expect("node");
    let client = node.client();
    let bucket = BucketName::parse("bench").expect("bucket");
    let request = BucketConfigRequest {
        create_stream_on_append: true,
        defaults: StreamOptionsRequest {
            class: Some(StorageClass::Standard),
            batch_max_delay_ms: BATCH_MAX_DELAY_MS,
            ..Default::default()
        },
        ..Default::default()
    };
    block_on(client.control().create_bucket(&bucket, &request, None)).expect("bucket");
    let appends: Vec<Appends> =
        CASES.iter().map(|&case| run_case(&client, &bucket, case, durations)).collect();
    drop(client);
    node.stop();

    // The node has let go of the store (the local one is locked while open).
    let runtime = runtime();
    let store = open_store(&backend.objects);
    let listed = list_bundles(&runtime, store.as_ref());
    let mut rows = Vec::new();
    for (i, (case, appends)) in CASES.iter().zip(appends).enumerate() {
        let (from, to) = appends.window_ms;
        let bundles = Bundles {
            sizes: listed
                .iter()
                .filter(|(at, _)| (from..=to).contains(at))
                .map(|&(_, size)| size)
                .collect(),
        };
        let sizes = if bundles.sizes.is_empty() { vec![1 << 20] } else { bundles.sizes.clone() };
        let raw =
            raw_puts(&runtime, &store, &sizes, in_flight, durations.reference, &i.to_string());
        rows.push(Row { backend: backend.name, case: *case, appends, bundles, raw });
    }
    rows
}

fn moto_backend() -> Option<Backend> {
    if std::env::var_os(s3::testing::MOTO_ENV).is_none() {
        println!(
            "\nobjects: the S3 part is skipped: {} is not set (it names moto_server; \
             ./scripts/check installs moto in target/moto-venv and sets it)",
            s3::testing::MOTO_ENV
        );
        return None;
    }
    let moto = s3::testing::Moto::start();
    moto.create_bucket("nova");
    let config = S3Config {
        endpoint: Some(moto.endpoint()),
        region: Some("us-east-1".into()),
        path_style: true,
        credentials: Some(S3Credentials {
            access_key_id: "nova-bench".into(),
            secret_access_key: "nova-bench-secret".into(),
            session_token: None,
        }),
        ..S3Config::new("nova")
    };
    Some(Backend {
        name: "moto",
        objects: ObjectStoreConfig::S3(Box::new(config)),
        _moto: Some(moto),
    })
}

fn data_dir() -> PathBuf {
    // On the real disk (not a tmpfs): the local store's fsyncs are part of the figure.
    let dir = std::env::current_dir().expect("cwd").join("target").join("bench-objects");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench directory");
    dir
}

pub fn run(quick: bool) {
    let durations = if quick {
        Durations {
            warmup: Duration::from_millis(20),
            measure: Duration::from_millis(200),
            reference: Duration::from_millis(100),
        }
    } else {
        Durations {
            warmup: Duration::from_millis(500),
            measure: Duration::from_secs(4),
            reference: Duration::from_secs(2),
        }
    };
    let dir = data_dir();
    let defaults = NodeConfig::new(&dir);
    let mut rows = bench_backend(
        Backend {
            name: "local dir",
            objects: ObjectStoreConfig::Local(dir.join("objects")),
            _moto: None,
        },
        &dir,
        &durations,
    );
    if let Some(moto) = moto_backend() {
        rows.extend(bench_backend(moto, &dir, &durations));
    }

    println!("\n### Standard appends through the object store (1 shard, 1 KiB records)\n");
    println!(
        "Settings: {STREAMS} streams, closed-loop producers (each waits for its ack), \
         batch_max_delay_ms {BATCH_MAX_DELAY_MS}, bundle-delay-ms {}, bundle-bytes-target {} MiB, \
         uploads-in-flight-max {}; {:.1} s measured per case after {:.1} s of warm-up. \
         Reference in the same run: PUTs of the case's own bundle sizes through the same \
         store, {} in flight, for {:.1} s.\n",
        defaults.uploader.bundle_delay.as_millis(),
        defaults.uploader.bundle_bytes_target >> 20,
        defaults.uploader.uploads_in_flight_max,
        durations.measure.as_secs_f64(),
        durations.warmup.as_secs_f64(),
        defaults.uploader.uploads_in_flight_max,
        durations.reference.as_secs_f64(),
    );
    println!(
        "| store | case | appends/s | MB/s content | p50 µs | p99 µs | objects/s | KiB per PUT | \
         raw PUT MB/s | raw PUTs/s | raw PUT p50 µs | raw PUT p99 µs | MB/s / raw | p50 / raw p50 | p99 / raw p99 |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let seconds = (row.appends.window_ms.1 - row.appends.window_ms.0).max(1) as f64 / 1e3;
        let count = row.bundles.sizes.len();
        let per_put = if count == 0 { 0.0 } else { row.bundles.bytes() as f64 / count as f64 };
        println!(
            "| {} | {} producers, {}-record batches | {:.0} | {:.1} | {} | {} | {:.0} | {:.0} | \
             {:.1} | {:.0} | {} | {} | {:.2} | {:.2} | {:.2} |",
            row.backend,
            row.case.producers,
            row.case.records,
            row.appends.appends_per_second,
            row.appends.content_bytes_per_second / 1e6,
            row.appends.latency.p50,
            row.appends.latency.p99,
            count as f64 / seconds,
            per_put / 1024.0,
            row.raw.bytes_per_second / 1e6,
            row.raw.puts_per_second,
            row.raw.latency.p50,
            row.raw.latency.p99,
            row.appends.content_bytes_per_second / row.raw.bytes_per_second,
            row.appends.latency.p50 as f64 / row.raw.latency.p50.max(1) as f64,
            row.appends.latency.p99 as f64 / row.raw.latency.p99.max(1) as f64,
        );
    }
    let jobs: Vec<String> = rows
        .iter()
        .map(|row| {
            format!(
                "{} {}-record: {:.0}",
                row.backend,
                row.case.records,
                row.appends.upload_jobs as f64
                    / ((row.appends.window_ms.1 - row.appends.window_ms.0).max(1) as f64 / 1e3)
            )
        })
        .collect();
    println!("\nUpload jobs applied per second by the shard (ShardStats): {}.", jobs.join("; "));
    let _ = std::fs::remove_dir_all(&dir);
}
