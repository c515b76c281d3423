//! The engine with its object store, on both backends: the local directory (the
//! embedded default) and a real S3-protocol server (moto, from `NOVA_MOTO_SERVER`).
//!
//! - standard batches are acknowledged only once their bundle and refs are durable;
//! - express history reaches the object store in the background, and the journal is
//!   given up behind it: a node that lost its whole journal still reads every record;
//! - history that left memory is read back from objects, after a restart too;
//! - a stream that fills the uploader's cut alone is written straight into settled
//!   objects of its own, which read back alike (docs/decisions/0010);
//! - an object store that goes down mid-load (a proxy cutting every connection) backs
//!   appends up, and when it returns everything acknowledged is there, once, in order.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use engine::control::RefRow;
use engine::framing::AppendConditions;
use engine::ids::StreamId;
use engine::names::{BucketName, StreamKey};
use engine::node::{Client, NodeConfig, ObjectStoreConfig};
use engine::options::StorageClass;
use engine::settled::{SettledKey, SettledObject};
use s3::testing::{Moto, Proxy};
use s3::{ObjectStore, S3Config, TransferPolicy};

/// An object store for a test, and what keeps it alive.
struct Backend {
    name: &'static str,
    objects: ObjectStoreConfig,
    _moto: Option<Moto>,
    proxy: Option<Proxy>,
}

fn local(dir: &Path) -> Backend {
    Backend {
        name: "local",
        objects: ObjectStoreConfig::Local(dir.join("objects")),
        _moto: None,
        proxy: None,
    }
}

/// A fresh moto with a bucket, reached through a proxy the test can take down.
fn s3() -> Backend {
    let moto = Moto::start();
    moto.create_bucket("nova");
    let proxy = Proxy::start(moto.port, Vec::new());
    let config = S3Config {
        policy: TransferPolicy {
            backoff_initial: Duration::from_millis(5),
            backoff_max: Duration::from_millis(50),
            ..TransferPolicy::default()
        },
        ..s3::testing::config_for(&proxy.endpoint(), "nova")
    };
    Backend {
        name: "s3",
        objects: ObjectStoreConfig::S3(Box::new(config)),
        _moto: Some(moto),
        proxy: Some(proxy),
    }
}

fn node_config(dir: &Path, backend: &Backend) -> NodeConfig {
    let mut config = config(dir, 1);
    config.objects = backend.objects.clone();
    config.uploader.backoff_initial = Duration::from_millis(5);
    config.uploader.backoff_max = Duration::from_millis(100);
    config
}

fn stream_id(client: &Client, bucket: &BucketName, key: &StreamKey) -> StreamId {
    block_on(client.control().get_stream(bucket, key)).expect("stream").id
}

/// Whether the refs of the stream cover `0..end` without a gap.
fn refs_cover(client: &Client, id: StreamId, end: u64) -> bool {
    covers(&block_on(client.control().refs_of(id)).expect("refs"), end)
}

/// Whether `refs` cover seq_nums `0..end` without a gap.
fn covers(refs: &[RefRow], end: u64) -> bool {
    let mut next = 0;
    for r in refs {
        if r.first_seq_num != next {
            return false;
        }
        next = r.end_seq_num();
    }
    next >= end
}

fn bodies(prefix: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count).map(|i| format!("{prefix}-{i:05}-{}", "x".repeat(i % 700)).into_bytes()).collect()
}

fn append_each(client: &Client, bucket: &BucketName, key: &StreamKey, bodies: &[Vec<u8>]) {
    for (i, pair) in bodies.chunks(2).enumerate() {
        let ack = append_patiently(client, bucket, key, pair)
            .unwrap_or_else(|e| panic!("append {i}: {e}"));
        assert_eq!(ack.start.seq_num, 2 * i as u64);
    }
}

fn assert_reads_back(client: &Client, bucket: &BucketName, key: &StreamKey, bodies: &[Vec<u8>]) {
    let all = read_all(client, bucket, key);
    let seqs: Vec<u64> = all.iter().map(|r| r.0).collect();
    assert_eq!(seqs, (0..bodies.len() as u64).collect::<Vec<_>>(), "every record once, in order");
    for (record, body) in all.iter().zip(bodies) {
        assert_eq!(&record.2, body, "record {}", record.0);
    }
}

fn standard_appends_are_durable_in_objects_before_they_are_acknowledged(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(node_config(dir.path(), &backend));
    let client = node.client();
    let bucket = make_bucket(&client, "std", StorageClass::Standard, true);
    let key = key("orders/eu");
    let mut acked = 0;
    let mut id = None;
    for round in 0..20u64 {
        let ack = block_on(client.append(&bucket, &key, plain(&["a", "b", "c"]))).expect("append");
        assert_eq!(ack.start.seq_num, round * 3);
        acked = ack.end.seq_num;
        let id = *id.get_or_insert_with(|| stream_id(&client, &bucket, &key));
        assert!(
            refs_cover(&client, id, acked),
            "{}: refs cover the acknowledged {acked}",
            backend.name
        );
    }
    let id = id.expect("appended");
    let refs = block_on(client.control().refs_of(id)).expect("refs");
    drop(client);
    node.stop();
    // Every ref names a slot that one ranged GET returns, holding the chunk it says (the
    // local store is opened once the node has let go of it).
    let store = open_store(&backend);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    for r in refs {
        let slot = runtime
            .block_on(store.get(&r.object, (r.offset..r.offset + r.length).into()))
            .expect("the ref's object");
        let parsed = engine::transit::Slot::parse(&slot).expect("a valid slot");
        assert_eq!(parsed.chunk.header.stream_id, id);
        assert_eq!(parsed.chunk.header.first_seq_num, r.first_seq_num);
        assert_eq!(parsed.chunk.header.record_count, r.record_count);
    }
    assert_eq!(acked, 60);
}

fn open_store(backend: &Backend) -> Arc<dyn ObjectStore> {
    match &backend.objects {
        ObjectStoreConfig::Local(root) => {
            Arc::new(s3::LocalDirStore::open(root, s3::LocalDirOptions::default()).expect("store"))
        }
        ObjectStoreConfig::S3(config) => {
            Arc::new(s3::S3Store::new(config.as_ref().clone()).expect("s3"))
        }
    }
}

#[test]
fn standard_appends_are_durable_in_objects_before_they_are_acknowledged_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    standard_appends_are_durable_in_objects_before_they_are_acknowledged(local(dir.path()));
}

#[test]
fn standard_appends_are_durable_in_objects_before_they_are_acknowledged_s3() {
    standard_appends_are_durable_in_objects_before_they_are_acknowledged(s3());
}

/// Express and standard history, evicted from a small memory budget, read back from
/// objects; after a restart; and after the journal is lost, which only works if every
/// express chunk reached the object store and is referenced.
fn history_lives_in_objects(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = node_config(dir.path(), &backend);
    config.shard.memory_budget_bytes = 256 << 10;
    let streams = [("fast", StorageClass::Express), ("slow", StorageClass::Standard)];
    let mut written: Vec<Vec<Vec<u8>>> =
        streams.iter().map(|(name, _)| bodies(name, 200)).collect();
    {
        let node = start(config.clone());
        let client = node.client();
        for ((name, class), bodies) in streams.iter().zip(&written) {
            let bucket = make_bucket(&client, name, *class, true);
            append_each(&client, &bucket, &key("k"), bodies);
            assert_reads_back(&client, &bucket, &key("k"), bodies);
            let id = stream_id(&client, &bucket, &key("k"));
            let end = bodies.len() as u64;
            wait_until("express chunks referenced", || refs_cover(&client, id, end));
        }
        drop(client);
        node.stop();
    }
    // Restart on the same journal, then without it (which a node starts on only when told
    // the loss is accepted: it cannot know that nothing was only there).
    for lose_journal in [false, true] {
        if lose_journal {
            std::fs::remove_dir_all(dir.path().join("journal")).expect("remove the journal");
        }
        config.accept_journal_loss = lose_journal;
        let node = start(config.clone());
        let client = node.client();
        for ((name, _), bodies) in streams.iter().zip(&written) {
            let bucket = common::bucket(name);
            assert_reads_back(&client, &bucket, &key("k"), bodies);
            let tail = block_on(client.check_tail(&bucket, &key("k"))).expect("tail");
            assert_eq!(tail.seq_num, bodies.len() as u64, "{}: {name}", backend.name);
        }
        // Numbering continues where it was.
        let more = block_on(client.append(&common::bucket("fast"), &key("k"), plain(&["z"])));
        assert_eq!(more.expect("append").start.seq_num, written[0].len() as u64);
        written[0].push(b"z".to_vec());
        // A node that stops lets what is on its way reach the object store.
        drop(client);
        node.stop();
    }
}

/// A stream busy enough to fill a bundle on its own: the uploader writes its chunks
/// straight into settled objects of its own (one write per byte instead of two), which
/// the settler leaves as they are while it settles what went to transit bundles, and
/// every record reads back from them, after a restart without the journal too.
fn a_busy_streams_bundles_are_its_settled_objects(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = node_config(dir.path(), &backend);
    config.uploader.direct_settle_bytes_min = 64 << 10;
    // Every append of the burst below lands in a cut or two.
    config.uploader.bundle_delay = Duration::from_millis(300);
    config.shard.memory_budget_bytes = 256 << 10;
    // What goes to a transit bundle (a cut of the burst too small to go straight) is
    // settled soon after.
    config.shard.settle.age = Duration::from_millis(200);
    let mut bodies: Vec<Vec<u8>> =
        (0..400).map(|i| format!("{i:05}-{}", "y".repeat(2000)).into_bytes()).collect();
    let bucket = common::bucket("busy");
    let (id, refs) = {
        let node = start(config.clone());
        let client = node.client();
        make_bucket(&client, "busy", StorageClass::Express, true);
        for (i, batch) in bodies.chunks(20).enumerate() {
            let ack = append_patiently(&client, &bucket, &key("k"), batch).expect("append");
            assert_eq!(ack.start.seq_num, 20 * i as u64);
        }
        let id = stream_id(&client, &bucket, &key("k"));
        let mut refs = Vec::new();
        wait_until("every chunk in a settled object", || {
            refs = block_on(client.control().refs_of(id)).expect("refs");
            covers(&refs, 400) && refs.iter().all(|r| !r.object.starts_with("_transit/"))
        });
        // Every object the uploader wrote is still named by refs: the settler moved none
        // of their chunks, and settled only the rest (counted once its commit is seen).
        let direct = client.uploader_stats().settled_direct;
        let mut named: Vec<&str> = refs.iter().map(|r| r.object.as_str()).collect();
        named.dedup();
        assert!(direct >= 1, "{}: the uploader wrote no settled object", backend.name);
        let by_settler = || block_on(client.stats()).expect("stats")[0].settled_objects;
        wait_until("every settle counted", || direct + by_settler() >= named.len() as u64);
        assert_eq!(named.len() as u64, direct + by_settler(), "{named:?}");
        assert_reads_back(&client, &bucket, &key("k"), &bodies);
        drop(client);
        node.stop();
        (id, refs)
    };
    // Each object whole, each of its slots named by a ref.
    let store = open_store(&backend);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let mut objects: Vec<&str> = refs.iter().map(|r| r.object.as_str()).collect();
    objects.dedup();
    for object in objects {
        let key = SettledKey::parse(object).expect("a settled object's key");
        assert_eq!((&key.bucket, key.stream_id), (&bucket, id));
        let bytes = runtime.block_on(store.get(object, s3::ByteRange::All)).expect("get");
        let parsed = SettledObject::parse(&bytes).expect("a whole settled object");
        let named = refs.iter().filter(|r| r.object == object).count();
        assert_eq!(parsed.slots().len(), named, "{object}: every slot has its ref");
    }
    drop(store);
    std::fs::remove_dir_all(dir.path().join("journal")).expect("remove the journal");
    config.accept_journal_loss = true;
    let node = start(config);
    let client = node.client();
    assert_reads_back(&client, &bucket, &key("k"), &bodies);
    let more = block_on(client.append(&bucket, &key("k"), plain(&["z"])));
    assert_eq!(more.expect("append").start.seq_num, 400, "numbering continues");
    bodies.push(b"z".to_vec());
    assert_reads_back(&client, &bucket, &key("k"), &bodies);
    drop(client);
    node.stop();
}

/// A job whose refs into a settled object waited longer than their bound for the turn
/// (`refs_wait_max`: by then the auditor may have marked the object) sends its chunks
/// anew, to a transit bundle, and nothing is lost: with a bound of zero, every object the
/// uploader wrote is left unreferenced and every record reads back from bundles.
#[test]
fn refs_that_waited_too_long_go_to_a_bundle_instead() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = node_config(dir.path(), &local(dir.path()));
    config.uploader.direct_settle_bytes_min = 64 << 10;
    config.uploader.bundle_delay = Duration::from_millis(300);
    config.shard.refs_wait_max = Duration::ZERO;
    config.shard.settle.age = Duration::from_secs(3600);
    let bodies: Vec<Vec<u8>> =
        (0..200).map(|i| format!("{i:05}-{}", "y".repeat(2000)).into_bytes()).collect();
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "late", StorageClass::Express, true);
    for batch in bodies.chunks(20) {
        append_patiently(&client, &bucket, &key("k"), batch).expect("append");
    }
    let id = stream_id(&client, &bucket, &key("k"));
    wait_until("every chunk referenced", || refs_cover(&client, id, 200));
    let refs = block_on(client.control().refs_of(id)).expect("refs");
    assert!(refs.iter().all(|r| r.object.starts_with("_transit/")), "{refs:?}");
    assert!(client.uploader_stats().settled_direct >= 1, "the uploader wrote settled objects");
    assert_reads_back(&client, &bucket, &key("k"), &bodies);
    drop(client);
    node.stop();
}

#[test]
fn a_busy_streams_bundles_are_its_settled_objects_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    a_busy_streams_bundles_are_its_settled_objects(local(dir.path()));
}

#[test]
fn a_busy_streams_bundles_are_its_settled_objects_s3() {
    a_busy_streams_bundles_are_its_settled_objects(s3());
}

#[test]
fn history_lives_in_objects_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    history_lives_in_objects(local(dir.path()));
}

#[test]
fn history_lives_in_objects_s3() {
    history_lives_in_objects(s3());
}

/// A node stopping while its store is down stops within about the uploader's drain
/// time, even with its uploader backed up (its one upload slot retrying, a full bundle
/// pending, more requests queued behind): the standard appends waiting on the store are
/// answered unavailable (never acknowledged), and nothing waits for the store to return.
#[test]
fn a_stop_while_the_store_is_down_takes_the_drain_time_not_forever() {
    let backend = s3();
    let proxy = backend.proxy.as_ref().expect("the s3 backend has a proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = node_config(dir.path(), &backend);
    config.uploader.drain = Duration::from_millis(500);
    config.uploader.uploads_in_flight_max = 1;
    config.uploader.bundle_bytes_target = 64 << 10;
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "down", StorageClass::Standard, true);
    proxy.set_down(true);
    // Appends to new streams, one at a time, until the uploader is backed up: appends
    // that arrive together may share one upload request, so how many it takes varies.
    let backed_up = || {
        let stats = client.uploader_stats();
        stats.put_failures >= 2 && stats.queue_depth >= 1
    };
    let mut appends = Vec::new();
    for i in 0..64u8 {
        let (client, bucket) = (client.clone(), bucket.clone());
        appends.push(thread::spawn(move || {
            let body = vec![b'a' + i % 26; 64 << 10];
            let request = batch(&[body], AppendConditions::default());
            block_on(client.append(&bucket, &key(&format!("k{i}")), request))
        }));
        let deadline = Instant::now() + Duration::from_millis(200);
        while !backed_up() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        if backed_up() {
            break;
        }
    }
    assert!(backed_up(), "the uploader never backed up: {:?}", client.uploader_stats());
    let (stopped_tx, stopped) = std::sync::mpsc::channel();
    let started = Instant::now();
    thread::spawn(move || {
        node.stop();
        let _ = stopped_tx.send(());
    });
    stopped.recv_timeout(Duration::from_secs(30)).expect("the stop ended (drain 500 ms)");
    let took = started.elapsed();
    for append in appends {
        let answer = append.join().expect("an appending thread");
        let error = answer.expect_err("nothing reached the store, so nothing was acknowledged");
        assert_eq!(error.code(), engine::Code::Unavailable, "{error}");
    }
    assert!(took < Duration::from_secs(10), "the stop took {took:?}");
    proxy.set_down(false);
}

#[test]
fn an_object_store_outage_backs_appends_up_and_loses_nothing() {
    let backend = s3();
    let proxy = backend.proxy.as_ref().expect("the s3 backend has a proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = node_config(dir.path(), &backend);
    // Less than the producers below hold in flight, so a stalled store fills it.
    config.shard.memory_budget_bytes = 48 << 10;
    let node = start(config.clone());
    let client = node.client();
    let bucket = make_bucket(&client, "outage", StorageClass::Standard, true);
    let key = key("k");
    // Producers append until told to stop, retrying what is refused; each records what
    // was acknowledged.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..32)
        .map(|p| {
            let (client, bucket, key, stop) =
                (client.clone(), bucket.clone(), key.clone(), Arc::clone(&stop));
            thread::spawn(move || {
                let mut acked = Vec::new();
                let mut refused = 0u64;
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let body = format!("p{p}-{n:06}-{}", "y".repeat(2000)).into_bytes();
                    match block_on(client.append(
                        &bucket,
                        &key,
                        batch(std::slice::from_ref(&body), AppendConditions::default()),
                    )) {
                        Ok(ack) => {
                            acked.push((ack.start.seq_num, body));
                            n += 1;
                        }
                        Err(e) if e.code() == engine::Code::ResourceExhausted => {
                            refused += 1;
                            thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => panic!("append: {e}"),
                    }
                }
                (acked, refused)
            })
        })
        .collect();
    let acked_now = |client: &Client| match block_on(client.check_tail(&bucket, &key)) {
        Ok(tail) => tail.seq_num,
        // The producers' first append creates the stream; until then nothing is acked.
        Err(e) if e.code() == engine::Code::NotFound => 0,
        Err(e) => panic!("tail: {e}"),
    };
    wait_until("appends flow", || acked_now(&client) >= 50);
    proxy.set_down(true);
    // Down: the tail stops moving while producers back up against the memory budget.
    let before = acked_now(&client);
    thread::sleep(Duration::from_millis(1500));
    let during = acked_now(&client);
    assert!(
        during <= before + 64,
        "little is acknowledged while the store is down: {before} -> {during}"
    );
    proxy.set_down(false);
    wait_until("appends resume", || acked_now(&client) >= during + 50);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut acked = Vec::new();
    let mut refused = 0;
    for producer in producers {
        let (a, r) = producer.join().expect("producer");
        acked.extend(a);
        refused += r;
    }
    assert!(refused > 0, "the memory budget refused appends while the store was down");
    acked.sort();
    let check = |client: &Client| {
        let all = read_all(client, &bucket, &key);
        let by_seq: std::collections::HashMap<u64, &Vec<u8>> =
            all.iter().map(|r| (r.0, &r.2)).collect();
        assert_eq!(by_seq.len(), all.len(), "no record twice");
        for (seq, body) in &acked {
            assert_eq!(by_seq.get(seq).copied(), Some(body), "acknowledged record {seq}");
        }
        let seqs: Vec<u64> = all.iter().map(|r| r.0).collect();
        assert_eq!(seqs, (0..all.len() as u64).collect::<Vec<_>>(), "gap-free");
    };
    check(&client);
    drop(client);
    node.stop();
    let node = start(config);
    check(&node.client());
    node.stop();
}

/// A ReadPlan's extents, fetched straight from the object store and decoded, give the
/// same records as a normal read.
fn a_read_plan_decodes_to_the_same_records_as_a_read(backend: Backend) {
    use engine::shard::PlanRequest;
    use engine::stream::ReadStart;

    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(node_config(dir.path(), &backend));
    let client = node.client();
    let bucket = make_bucket(&client, "plan", StorageClass::Standard, true);
    let key = key("k");
    let written = bodies("plan", 120);
    append_each(&client, &bucket, &key, &written);
    let read = read_all(&client, &bucket, &key);
    let request = |start| PlanRequest { start, clamp: false, limits: ALL };
    let plan = block_on(client.plan(&bucket, &key, request(ReadStart::SeqNum(0)))).expect("plan");
    assert_eq!(plan.memory_from_seq_num, None, "standard records are all in the store");
    assert_eq!(plan.tail.seq_num, 120);
    // A plan from the middle starts at the extent holding its first record.
    let middle =
        block_on(client.plan(&bucket, &key, request(ReadStart::SeqNum(61)))).expect("plan");
    let first = middle.extents.first().expect("an extent");
    assert!(first.first_seq_num <= 61 && 61 < first.first_seq_num + u64::from(first.count));
    drop(client);
    node.stop();

    let store = open_store(&backend);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let mut decoded = Vec::new();
    for extent in &plan.extents {
        let range = extent.offset..extent.offset + extent.length;
        let bytes = runtime.block_on(store.get(&extent.object, range.into())).expect("extent");
        let slot = engine::transit::Slot::parse(&bytes).expect("a valid slot");
        assert_eq!(slot.chunk.header.first_seq_num, extent.first_seq_num);
        let records = slot.chunk.records;
        for i in 0..records.len() {
            let stored = engine::record::decode(records.record(i)).expect("a valid record");
            let seq = slot.chunk.header.first_seq_num + i as u64;
            decoded.push((seq, records.timestamp(i), stored.body().to_vec()));
        }
    }
    assert_eq!(decoded, read, "the plan's records are the read's");
}

#[test]
fn a_read_plan_decodes_to_the_same_records_as_a_read_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    a_read_plan_decodes_to_the_same_records_as_a_read(local(dir.path()));
}

#[test]
fn a_read_plan_decodes_to_the_same_records_as_a_read_s3() {
    a_read_plan_decodes_to_the_same_records_as_a_read(s3());
}

/// Settling rewrites history into per-stream settled objects, contiguous and
/// non-overlapping, while readers keep reading every record once; refs and the leader
/// follow, and a restart reads the settled objects.
fn settling_moves_history_into_per_stream_objects(backend: Backend) {
    use std::sync::atomic::{AtomicBool, Ordering};

    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = node_config(dir.path(), &backend);
    config.shard.memory_budget_bytes = 128 << 10; // reads come from the objects
    config.shard.settle.target_bytes = 24 << 10;
    config.shard.settle.age = Duration::from_millis(200);
    config.shard.settle.interval = Duration::from_millis(20);
    let node = start(config.clone());
    let client = node.client();
    let streams = [("set-fast", StorageClass::Express), ("set-slow", StorageClass::Standard)];
    let mut written = Vec::new();
    let done = Arc::new(AtomicBool::new(false));
    // A reader that, all along, sees every stream gap-free, each record once.
    let reader = {
        let (client, done) = (client.clone(), Arc::clone(&done));
        thread::spawn(move || {
            let mut rounds = 0u64;
            while !done.load(Ordering::SeqCst) {
                for (name, _) in streams {
                    let bucket = common::bucket(name);
                    if block_on(client.check_tail(&bucket, &key("k"))).is_err() {
                        continue; // not made yet
                    }
                    let all = read_all(&client, &bucket, &key("k"));
                    let seqs: Vec<u64> = all.iter().map(|r| r.0).collect();
                    assert_eq!(seqs, (0..all.len() as u64).collect::<Vec<_>>(), "{name}");
                }
                rounds += 1;
            }
            rounds
        })
    };
    for (name, class) in streams {
        let bucket = make_bucket(&client, name, class, true);
        let bodies = bodies(name, 240);
        append_each(&client, &bucket, &key("k"), &bodies);
        written.push((bucket, bodies));
    }
    let mut refs = Vec::new();
    for (bucket, bodies) in &written {
        let id = stream_id(&client, bucket, &key("k"));
        let settled = |r: &engine::control::RefRow| !r.object.starts_with("_transit/");
        wait_until("every chunk settled", || {
            let found = block_on(client.control().refs_of(id)).expect("refs");
            let all = found.iter().all(settled) && refs_cover(&client, id, bodies.len() as u64);
            all.then(|| refs.push((id, found))).is_some()
        });
        assert_reads_back(&client, bucket, &key("k"), bodies);
    }
    done.store(true, Ordering::SeqCst);
    assert!(reader.join().expect("reader") > 0, "the reader read while settling ran");
    // The counts follow the refs: a settle is counted once its commit is seen back.
    wait_until("both streams' settles counted", || {
        block_on(client.stats()).expect("stats")[0].settled_objects >= 2
    });
    drop(client);
    node.stop();

    // The settled objects: each a contiguous run of its stream, the runs back to back.
    let store = open_store(&backend);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    for (id, refs) in refs {
        let mut objects: Vec<String> = refs.iter().map(|r| r.object.clone()).collect();
        objects.dedup();
        let mut next = 0u64;
        for object in objects {
            assert!(object.contains(&id.to_string()), "{object} is keyed by the stream ID");
            let bytes = runtime.block_on(store.get(&object, s3::ByteRange::All)).expect("get");
            let parsed = engine::settled::SettledObject::parse(&bytes).expect("a settled object");
            assert_eq!(parsed.footer.first_seq_num, next, "{object} continues the last one");
            assert_eq!(parsed.footer.stream_id, id);
            next = parsed.footer.end_seq_num();
        }
        assert_eq!(next, 240, "the settled objects hold the whole stream");
    }
    drop(store);
    let node = start(config);
    let client = node.client();
    for (bucket, bodies) in &written {
        assert_reads_back(&client, bucket, &key("k"), bodies);
    }
    drop(client);
    node.stop();
}

#[test]
fn settling_moves_history_into_per_stream_objects_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    settling_moves_history_into_per_stream_objects(local(dir.path()));
}

#[test]
fn settling_moves_history_into_per_stream_objects_s3() {
    settling_moves_history_into_per_stream_objects(s3());
}

/// Every run that is due settles at the next tick, not one run per stream per tick: a
/// stream that gathers many targets' worth between two ticks (a busy stream, with the
/// default 32 MiB target and 1 s interval, anything above 32 MiB/s) would otherwise keep
/// more transit history at every tick, without end. Chunks still cached are settled from
/// memory, the others read back, and either way each settled slot is byte for byte its
/// transit slot (so a retried settle finds its own object).
fn a_busy_stream_settles_every_due_run_at_the_next_tick(memory_budget_bytes: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = local(dir.path());
    let mut config = node_config(dir.path(), &backend);
    let interval = Duration::from_millis(1500);
    config.shard.memory_budget_bytes = memory_budget_bytes;
    config.shard.settle.target_bytes = 8 << 10;
    config.shard.settle.age = Duration::from_secs(3600); // only full runs are due
    config.shard.settle.interval = interval;
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "settle-busy", StorageClass::Express, true);
    // Ten appends of one 9 KiB record: ten chunks, each a full run of its own.
    let count = 10u64;
    let bodies: Vec<Vec<u8>> = (0..count).map(|i| vec![b'a' + i as u8; 9 << 10]).collect();
    // Every transit ref seen at any look, by first seq_num: under load a tick may settle
    // a chunk before a later look, so one look at the end could see none in transit.
    let mut in_transit = std::collections::BTreeMap::new();
    let mut look = |id: StreamId| {
        let refs = block_on(client.control().refs_of(id)).expect("refs");
        for r in refs.iter().filter(|r| r.object.starts_with("_transit/")) {
            in_transit.entry(r.first_seq_num).or_insert_with(|| r.clone());
        }
        refs
    };
    let mut id = None;
    for (i, body) in bodies.iter().enumerate() {
        let ack = append_patiently(&client, &bucket, &key("k"), std::slice::from_ref(body))
            .expect("append");
        assert_eq!(ack.start.seq_num, i as u64);
        let id = *id.get_or_insert_with(|| stream_id(&client, &bucket, &key("k")));
        look(id);
    }
    let id = id.expect("appended");
    wait_until("every chunk in the object store", || covers(&look(id), count));
    let in_store = Instant::now();
    let mut settled = Vec::new();
    wait_until("every chunk settled", || {
        settled = look(id);
        settled.iter().all(|r| !r.object.starts_with("_transit/")) && covers(&settled, count)
    });
    // The next tick comes within one interval; one run per tick would take ten.
    let took = in_store.elapsed();
    assert!(took < 3 * interval, "settling ten due runs took {took:?}");
    // The counts follow the refs: a settle is counted once its commit is seen back.
    let mut stats = Vec::new();
    wait_until("every settle counted", || {
        stats = block_on(client.stats()).expect("stats");
        stats[0].settled_objects >= count
    });
    assert_eq!(stats[0].settled_objects, count, "{stats:?}");
    assert_eq!(stats[0].settle_failures, 0, "{stats:?}");
    assert_eq!(stats[0].settled_from_memory + stats[0].settled_from_store, count, "{stats:?}");
    if memory_budget_bytes >= 1 << 20 {
        assert_eq!(stats[0].settled_from_memory, count, "all cached: {stats:?}");
    } else {
        // The budget holds one 9 KiB chunk at most.
        assert!(stats[0].settled_from_store >= count - 1, "read back: {stats:?}");
    }
    assert_reads_back(&client, &bucket, &key("k"), &bodies);
    drop(client);
    node.stop();

    // Each settled slot is its transit slot, byte for byte (the bundles outlive the
    // settle by the read grace).
    let store = open_store(&backend);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let get = |object: &str, offset: u64, length: u64| {
        let range = s3::ByteRange::Span(offset..offset + length);
        runtime.block_on(store.get(object, range)).expect("get")
    };
    let mut compared = 0;
    for before in in_transit.values() {
        let after = settled.iter().find(|r| r.first_seq_num == before.first_seq_num);
        let after = after.expect("every chunk has a settled ref");
        assert_eq!(after.length, before.length, "chunk {}", before.first_seq_num);
        let (transit, settled) = (
            get(&before.object, before.offset, before.length),
            get(&after.object, after.offset, after.length),
        );
        assert!(transit == settled, "chunk {}: the settled slot differs", before.first_seq_num);
        compared += 1;
    }
    assert!(compared > 0, "the chunks were seen in transit before they settled");
}

#[test]
fn a_busy_stream_settles_every_due_run_at_the_next_tick_from_memory() {
    a_busy_stream_settles_every_due_run_at_the_next_tick(1 << 30);
}

#[test]
fn a_busy_stream_settles_every_due_run_at_the_next_tick_from_the_store() {
    a_busy_stream_settles_every_due_run_at_the_next_tick(16 << 10);
}

/// The settle backlog is the age of the oldest history still in transit: it grows while
/// a run waits for its age, and is 0 once the stream has none.
#[test]
fn the_settle_backlog_is_the_age_of_the_oldest_transit_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = local(dir.path());
    let mut config = node_config(dir.path(), &backend);
    config.shard.settle.target_bytes = 1 << 30;
    config.shard.settle.age = Duration::from_secs(3600);
    config.shard.settle.interval = Duration::from_millis(20);
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "settle-backlog", StorageClass::Standard, true);
    let backlog = || block_on(client.stats()).expect("stats")[0].settle_backlog_ms;
    let before = Instant::now();
    append_patiently(&client, &bucket, &key("k"), &[b"waits for its age".to_vec()])
        .expect("append");
    wait_until("a backlog of 300 ms", || backlog() >= 300);
    let backlog_ms = backlog();
    assert!(u128::from(backlog_ms) <= before.elapsed().as_millis(), "{backlog_ms} ms");
    block_on(client.delete_stream(&bucket, &key("k"))).expect("delete");
    wait_until("no backlog once the stream is gone", || backlog() == 0);
    drop(client);
    node.stop();
}

/// A settle whose key holds another object (an orphan the uploader left, decision 0010)
/// fails, and never takes that object, until the auditor has reclaimed it; the settler
/// backs off meanwhile instead of redoing the whole run at every tick: the waits double,
/// from one interval. The chunks stay readable where they are.
#[test]
fn a_settle_whose_key_is_taken_backs_off_and_leaves_the_other_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = local(dir.path());
    let mut config = node_config(dir.path(), &backend);
    let interval = Duration::from_millis(50);
    config.shard.settle.interval = interval;
    config.shard.settle.age = Duration::from_millis(1);
    // The stream first, for its ID: the key its first settle will take.
    let node = start(config.clone());
    let client = node.client();
    let bucket = make_bucket(&client, "taken", StorageClass::Standard, true);
    let options = engine::options::StreamOptionsRequest::default();
    block_on(client.control().create_stream(&bucket, &key("k"), &options, None)).expect("create");
    let id = stream_id(&client, &bucket, &key("k"));
    drop(client);
    node.stop();
    let taken = SettledKey { bucket: bucket.clone(), stream_id: id, first_seq_num: 0 }.to_string();
    let put = |store: &dyn ObjectStore| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        let other = s3::Bytes::from_static(b"someone else's");
        rt.block_on(store.put(&taken, other, s3::PutCondition::CreateOnly)).expect("put");
    };
    put(open_store(&backend).as_ref());

    let node = start(config);
    let client = node.client();
    append_each(&client, &bucket, &key("k"), &bodies("t", 4));
    let failures = || block_on(client.stats()).expect("stats")[0].settle_failures;
    wait_until("a failed settle", || failures() >= 1);
    let first = Instant::now();
    // Backing off, the n-th failure comes at least 2^(n-1) - 1 intervals after the
    // first: six more take 63 intervals (3 s), against 6 to 12 at one a tick or two.
    // Within E intervals of the first (seen a little after it: one more allowed), at
    // most log2(E + 1) + 1 more.
    wait_until("seven failed settles", || failures() >= 7);
    let after_first = failures() - 1;
    let intervals = first.elapsed().as_millis() / interval.as_millis();
    let most = u64::from((intervals + 1).ilog2()) + 1;
    assert!(after_first <= most, "{after_first} more failed settles in {intervals} intervals");
    let refs = block_on(client.control().refs_of(id)).expect("refs");
    assert!(refs.iter().all(|r| r.object.starts_with("_transit/")), "{refs:?}");
    assert_reads_back(&client, &bucket, &key("k"), &bodies("t", 4));
    drop(client);
    node.stop();
}

/// Many streams sharing a small cache: none reaches the settle target (or age) before
/// its chunks are evicted, so runs about to leave the cache are settled short of the
/// target while their bytes are still in memory, instead of waiting to be read back
/// from the bundles one GET per chunk. Before this rule, nothing here ever settled. A
/// quiet stream's run, shorter than the early floor, is left for the age.
#[test]
fn runs_about_to_leave_the_cache_are_settled_from_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = local(dir.path());
    let mut config = node_config(dir.path(), &backend);
    config.shard.memory_budget_bytes = 4 << 20;
    config.shard.settle.target_bytes = 1 << 30;
    config.shard.settle.age = Duration::from_secs(3600);
    config.shard.settle.interval = Duration::from_millis(50);
    config.shard.settle.early_bytes_min = 256 << 10;
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "settle-leaving", StorageClass::Express, true);
    let quiet = vec![b'q'; 1 << 10];
    append_patiently(&client, &bucket, &key("quiet"), std::slice::from_ref(&quiet))
        .expect("append");
    // Four streams, a 16 KiB record each per round, paced: 7.5 MiB through a 4 MiB
    // cache over about a second, so it turns over a few times between ticks' worth.
    let (streams, rounds) = (4, 120);
    let mut bodies = vec![Vec::new(); streams];
    for round in 0..rounds {
        for (stream, bodies) in bodies.iter_mut().enumerate() {
            let body = vec![(round * streams + stream) as u8; 16 << 10];
            let name = format!("k{stream}");
            append_patiently(&client, &bucket, &key(&name), std::slice::from_ref(&body))
                .expect("append");
            bodies.push(body);
        }
        thread::sleep(Duration::from_millis(5));
    }
    wait_until("some history settled", || {
        block_on(client.stats()).expect("stats")[0].settled_objects >= streams as u64
    });
    let stats = block_on(client.stats()).expect("stats");
    assert_eq!(stats[0].settle_failures, 0, "{stats:?}");
    assert_eq!(stats[0].settled_early, stats[0].settled_objects, "all short: {stats:?}");
    assert!(
        stats[0].settled_from_memory > stats[0].settled_from_store,
        "settled while cached, mostly: {stats:?}"
    );
    for (stream, bodies) in bodies.iter().enumerate() {
        assert_reads_back(&client, &bucket, &key(&format!("k{stream}")), bodies);
    }
    let refs = block_on(client.control().refs_of(stream_id(&client, &bucket, &key("quiet"))));
    let refs = refs.expect("refs");
    assert_eq!(refs.len(), 1, "{refs:?}");
    assert!(refs[0].object.starts_with("_transit/"), "1 KiB is below the floor: {refs:?}");
    assert_reads_back(&client, &bucket, &key("quiet"), &[quiet]);
    drop(client);
    node.stop();
}

// ---- The auditor -------------------------------------------------------------------------

fn auditing(dir: &Path, backend: &Backend, grace: Duration) -> NodeConfig {
    let mut config = node_config(dir, backend);
    config.auditor.interval = Duration::from_millis(30);
    config.auditor.read_grace = grace;
    config.shard.settle.target_bytes = 16 << 10;
    config.shard.settle.age = Duration::from_millis(100);
    config.shard.settle.interval = Duration::from_millis(20);
    config
}

/// Waits for `passes` more auditor passes that end with `done(stats)`.
fn wait_audit(client: &Client, what: &str, done: impl Fn(&engine::auditor::AuditorStats) -> bool) {
    let start = client.auditor_stats().passes;
    wait_until(what, || {
        let stats = client.auditor_stats();
        assert_eq!(stats.last_error, None, "the auditor failed");
        stats.passes >= start + 3 && done(&stats)
    });
}

/// nova's objects in the store, and the objects the refs name (the node stopped: the
/// local store and the metadata are locked while it runs).
fn objects_and_refs(dir: &Path, backend: &Backend) -> (Vec<String>, Vec<String>) {
    let store = open_store(backend);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let mut listed = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = runtime
            .block_on(store.list("", after.as_deref(), s3::LIST_PAGE_KEYS_MAX))
            .expect("list");
        listed.extend(page.objects.into_iter().map(|o| o.key));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    listed.retain(|k| {
        engine::transit::TransitKey::parse(k).is_ok()
            || engine::settled::SettledKey::parse(k).is_ok()
    });
    let meta = engine::meta::RedbMetaStore::open(dir.join("meta"), Default::default())
        .expect("open the metadata");
    let control = engine::control::ControlPlane::new(meta.clone());
    let mut referenced = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let (refs, next) = block_on(control.refs_page(after.as_deref())).expect("refs");
        referenced.extend(refs.into_iter().map(|r| r.object));
        match next {
            Some(key) => after = Some(key),
            None => break,
        }
    }
    drop(control);
    block_on(meta.close()).expect("close");
    listed.sort();
    referenced.sort();
    referenced.dedup();
    (listed, referenced)
}

/// After trims and a deletion, and across a restart in the middle of reclamation, the
/// store holds exactly the objects some ref names, and what is still readable is intact.
fn the_store_holds_exactly_what_refs_name(backend: Backend) {
    use engine::shard::TrimTo;

    let dir = tempfile::tempdir().expect("tempdir");
    // A grace far longer than the test: marks are made, nothing is deleted yet.
    let config = auditing(dir.path(), &backend, Duration::from_secs(3600));
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "audit", StorageClass::Standard, true);
    let kept = bodies("kept", 60);
    for name in ["kept", "trimmed", "deleted"] {
        append_each(&client, &bucket, &key(name), &kept);
    }
    let trim = block_on(client.trim(&bucket, &key("trimmed"), TrimTo::SeqNum(40))).expect("trim");
    assert_eq!(trim, 40);
    block_on(client.delete_stream(&bucket, &key("deleted"))).expect("delete");
    wait_audit(&client, "dead objects marked", |s| s.dead_objects > 0 && s.refs_deleted > 0);
    assert_eq!(client.auditor_stats().objects_deleted, 0, "nothing goes before its grace");
    drop(client);
    node.stop();
    let (listed, referenced) = objects_and_refs(dir.path(), &backend);
    assert!(listed.len() > referenced.len(), "dead objects wait out their grace");

    // Restart in the middle of reclamation, now with the grace over: what was marked
    // goes, what is still referenced stays and reads back whole.
    let node = start(auditing(dir.path(), &backend, Duration::ZERO));
    let client = node.client();
    wait_audit(&client, "dead objects deleted", |s| s.objects_deleted > 0 && s.dead_objects == 0);
    assert_reads_back(&client, &bucket, &key("kept"), &kept);
    let rest = read_all(&client, &bucket, &key("trimmed"));
    assert_eq!(rest.first().map(|r| r.0), Some(40));
    assert_eq!(rest.len(), 20);
    drop(client);
    node.stop();
    let (listed, referenced) = objects_and_refs(dir.path(), &backend);
    assert_eq!(listed, referenced, "{}: the store holds exactly what refs name", backend.name);
}

/// The auditor marks what it has seen unreferenced for an interval, and a bundle whose
/// refs have not landed by then is refused its refs. Here the interval is zero, so the
/// auditor marks every bundle it lists before its refs land: the shard writes those
/// chunks anew, and every append still lands, once, and reads back.
#[test]
fn a_bundle_marked_before_its_refs_land_is_written_anew() {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = local(dir.path());
    let mut config = auditing(dir.path(), &backend, Duration::ZERO);
    config.auditor.interval = Duration::ZERO;
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "race", StorageClass::Standard, true);
    let written = bodies("r", 60);
    append_each(&client, &bucket, &key("k"), &written);
    assert_reads_back(&client, &bucket, &key("k"), &written);
    assert!(client.auditor_stats().passes > 0);
    drop(client);
    node.stop();
}

#[test]
fn the_store_holds_exactly_what_refs_name_local() {
    let dir = tempfile::tempdir().expect("tempdir");
    the_store_holds_exactly_what_refs_name(local(dir.path()));
}

#[test]
fn the_store_holds_exactly_what_refs_name_s3() {
    the_store_holds_exactly_what_refs_name(s3());
}

/// A reader holding a ReadPlan keeps reading its extents through the read grace while
/// reclamation runs; after it, they are gone.
#[test]
fn a_read_plan_stays_readable_through_the_read_grace() {
    use engine::shard::{PlanRequest, TrimTo};
    use engine::stream::ReadStart;

    let backend = s3();
    let dir = tempfile::tempdir().expect("tempdir");
    let grace = Duration::from_millis(1500);
    let node = start(auditing(dir.path(), &backend, grace));
    let client = node.client();
    let bucket = make_bucket(&client, "grace", StorageClass::Standard, true);
    let key = key("k");
    append_each(&client, &bucket, &key, &bodies("grace", 40));
    let plan = block_on(client.plan(
        &bucket,
        &key,
        PlanRequest { start: ReadStart::SeqNum(0), clamp: false, limits: ALL },
    ))
    .expect("plan");
    block_on(client.trim(&bucket, &key, TrimTo::SeqNum(40))).expect("trim everything");
    wait_audit(&client, "the plan's objects marked dead", |s| s.dead_objects > 0);
    let store = open_store(&backend);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let fetch = |extent: &engine::shard::Extent| {
        runtime.block_on(
            store.get(&extent.object, (extent.offset..extent.offset + extent.length).into()),
        )
    };
    for extent in &plan.extents {
        let slot = fetch(extent).expect("readable through the grace");
        engine::transit::Slot::parse(&slot).expect("intact");
    }
    wait_audit(&client, "the plan's objects deleted", |s| {
        s.objects_deleted > 0 && s.dead_objects == 0
    });
    let gone = fetch(&plan.extents[0]).expect_err("deleted after the grace");
    assert_eq!(gone.kind(), s3::ErrorKind::NotFound);
    drop(client);
    node.stop();
}

/// A follower that starts far behind reads history back from the object store (the
/// memory budget holds a fraction of it), then keeps up with the live tail: every record
/// once, in order, no gap.
#[test]
fn a_follower_catches_up_from_objects_and_rejoins_the_live_tail() {
    use engine::shard::ReadRequest;
    use engine::stream::{PageLimits, ReadStart};

    let dir = tempfile::tempdir().expect("tempdir");
    let backend = local(dir.path());
    let mut config = node_config(dir.path(), &backend);
    config.shard.memory_budget_bytes = 256 << 10;
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "follow", StorageClass::Express, true);
    let key = key("k");
    // 400 records of 2 KB: the history is three times the memory budget.
    let written: Vec<Vec<u8>> =
        (0..400).map(|i| format!("follow-{i:05}-{}", "z".repeat(2000)).into_bytes()).collect();
    append_each(&client, &bucket, &key, &written[..300]);
    let id = stream_id(&client, &bucket, &key);
    wait_until("history referenced", || refs_cover(&client, id, 300));
    let producer = {
        let (client, bucket, key, rest) =
            (client.clone(), bucket.clone(), key.clone(), written[300..].to_vec());
        thread::spawn(move || {
            for pair in rest.chunks(2) {
                append_patiently(&client, &bucket, &key, pair).expect("append");
            }
        })
    };
    let mut seen: Vec<(u64, Vec<u8>)> = Vec::new();
    let limits = PageLimits { records: 16, bytes: u64::MAX, until: None };
    while seen.len() < written.len() {
        let next = seen.len() as u64;
        let request = ReadRequest {
            start: ReadStart::SeqNum(next),
            clamp: false,
            limits,
            wait: Some(Duration::from_secs(30)),
        };
        let page = block_on(client.read(&bucket, &key, request)).expect("read");
        assert!(page.record_count > 0, "a waiting read returns records once they exist");
        seen.extend(records(&page.frames).into_iter().map(|r| (r.0, r.2)));
    }
    producer.join().expect("producer");
    for (i, (seq, body)) in seen.iter().enumerate() {
        assert_eq!(*seq, i as u64, "no gap, no duplicate");
        assert_eq!(body, &written[i]);
    }
    assert!(client.uploader_stats().object_reads > 0, "history came from the object store");
    drop(client);
    node.stop();
}
