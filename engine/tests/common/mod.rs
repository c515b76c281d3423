//! Helpers shared by the node tests: a node on a temporary data directory, framed
//! batches, and reading a whole stream back.
#![allow(dead_code)]

pub mod crash;

use std::path::Path;

use engine::control::Created;
use engine::framing::{AppendBuilder, AppendConditions, Frame, decode_frame};
use engine::names::{BucketName, StreamKey};
use engine::node::{Client, Node, NodeConfig};
use engine::options::{BucketConfigRequest, StorageClass, StreamOptionsRequest};
use engine::record;
use engine::shard::{AppendRequest, ReadRequest};
use engine::stream::{PageLimits, ReadStart};

pub use futures_lite::future::block_on;

/// How long a test waits for a condition before it fails.
pub const WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits until `condition` holds, polling; fails the test after [`WAIT_MAX`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT_MAX;
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "{what}: not within {WAIT_MAX:?}");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

pub fn config(dir: &Path, shards: usize) -> NodeConfig {
    let mut config = NodeConfig::new(dir);
    config.shards = shards;
    config.shard.memory_budget_bytes = 256 << 20;
    config.shard.express_chunk_bytes = 64 << 10;
    // Small segments: tests make many nodes, and rolls should happen in them.
    config.journal.segment_bytes = 8 << 20;
    config
}

pub fn bucket(name: &str) -> BucketName {
    BucketName::parse(name).expect("valid bucket name")
}

pub fn key(name: &str) -> StreamKey {
    StreamKey::parse(name).expect("valid key")
}

/// Creates a bucket whose streams default to `class`, with a short standard delay.
pub fn make_bucket(
    client: &Client,
    name: &str,
    class: StorageClass,
    create_on_append: bool,
) -> BucketName {
    let name = bucket(name);
    let mut request =
        BucketConfigRequest { create_stream_on_append: create_on_append, ..Default::default() };
    request.defaults =
        StreamOptionsRequest { class: Some(class), batch_max_delay_ms: 5, ..Default::default() };
    let Created { .. } =
        block_on(client.control().create_bucket(&name, &request, None)).expect("bucket created");
    name
}

/// A batch of these bodies, with optional conditions.
pub fn batch(bodies: &[Vec<u8>], conditions: AppendConditions<'_>) -> AppendRequest {
    let mut builder = AppendBuilder::new();
    for body in bodies {
        builder.push::<&[u8], &[u8]>(&[], body).expect("fits");
    }
    AppendRequest { framed: builder.finish(&conditions).into(), offered: None }
}

pub fn plain(bodies: &[&str]) -> AppendRequest {
    let bodies: Vec<Vec<u8>> = bodies.iter().map(|b| b.as_bytes().to_vec()).collect();
    batch(&bodies, AppendConditions::default())
}

pub const ALL: PageLimits = PageLimits { records: u64::MAX, bytes: u64::MAX, until: None };

pub fn read_request(start: ReadStart) -> ReadRequest {
    ReadRequest { start, clamp: false, limits: ALL, wait: None }
}

/// Decodes a reply's frames into (seq_num, timestamp, body).
pub fn records(frames: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((frame, used)) = decode_frame(&frames[at..]).expect("valid frames") {
        let Frame::Records(run) = frame else { panic!("only records frames in a page") };
        out.extend(run.iter().map(|(seq, ts, stored)| {
            (seq, ts, record::decode(stored).expect("valid record").body().to_vec())
        }));
        at += used;
    }
    out
}

/// Every record of a stream, page by page.
pub fn read_all(client: &Client, bucket: &BucketName, key: &StreamKey) -> Vec<(u64, u64, Vec<u8>)> {
    let mut all = Vec::new();
    let mut next = 0;
    loop {
        let reply = block_on(client.read(bucket, key, read_request(ReadStart::SeqNum(next))))
            .expect("read");
        if reply.record_count == 0 {
            return all;
        }
        all.extend(records(&reply.frames));
        next = reply.next_seq_num;
    }
}

/// Starts a node (the previous node on the directory, and every client of it, must be
/// gone: the metadata store holds the directory's lock until its last handle drops).
pub fn start(config: NodeConfig) -> Node {
    Node::start(config).unwrap_or_else(|error| panic!("node start: {error}"))
}

pub fn express() -> StorageClass {
    StorageClass::Express
}

/// Appends `bodies` as one batch, honouring backpressure as a client must: a refusal
/// that says when to retry (a full memory budget, while uploads catch up) is retried
/// after that long, for up to a minute. Such a refusal comes before the batch takes
/// numbers, so a retry never duplicates it.
pub fn append_patiently(
    client: &Client,
    bucket: &BucketName,
    key: &StreamKey,
    bodies: &[Vec<u8>],
) -> engine::error::Result<engine::shard::AppendAck> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match block_on(client.append(bucket, key, batch(bodies, AppendConditions::default()))) {
            Err(error) if std::time::Instant::now() < deadline => match error.retry_after_ms() {
                Some(ms) => std::thread::sleep(std::time::Duration::from_millis(ms)),
                None => return Err(error),
            },
            result => return result,
        }
    }
}
