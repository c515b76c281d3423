//! The engine through a running node: real shard executors, a real journal on disk, the
//! real metadata store. Every verb, restart recovery, waiting reads, pipelining, the
//! memory budget, and a soak of the cross-thread bridge.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::*;
use engine::Code;
use engine::framing::AppendConditions;
use engine::options::{StorageClass, StreamOptionsPatch};
use engine::position::Tail;
use engine::shard::{ReadRequest, TrimTo};
use engine::stream::{PageLimits, ReadStart};

/// A one-shard node on `dir` whose clock reads `now` and whose age-retention passes are
/// `interval` apart.
fn retention_node(
    dir: &std::path::Path,
    now: &std::sync::Arc<std::sync::atomic::AtomicU64>,
    interval: Duration,
) -> engine::node::Node {
    let mut cfg = config(dir, 1);
    cfg.shard.retention_interval = interval;
    engine::node::Node::start_with_clock(cfg, clock_reading(now)).expect("start")
}

/// A node's clock that reads `now`, which the test moves.
fn clock_reading(
    now: &std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> std::sync::Arc<dyn engine::control::Clock> {
    let now = std::sync::Arc::clone(now);
    std::sync::Arc::new(move || now.load(std::sync::atomic::Ordering::SeqCst))
}

#[test]
fn express_and_standard_appends_are_acknowledged_durable_and_readable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    for (name, class) in [("fast", StorageClass::Express), ("slow", StorageClass::Standard)] {
        let bucket = make_bucket(&client, name, class, true);
        let key = key("orders/eu");
        let first = block_on(client.append(&bucket, &key, plain(&["a", "b"]))).expect("append");
        assert_eq!((first.start.seq_num, first.end.seq_num), (0, 2));
        assert_eq!(first.tail.seq_num, 2, "the ack carries the tail including the batch");
        let second = block_on(client.append(&bucket, &key, plain(&["c"]))).expect("append");
        assert_eq!((second.start.seq_num, second.end.seq_num), (2, 3));
        assert!(second.start.timestamp >= first.start.timestamp);
        let all = read_all(&client, &bucket, &key);
        let bodies: Vec<&[u8]> = all.iter().map(|r| r.2.as_slice()).collect();
        assert_eq!(bodies, [b"a", b"b", b"c"], "{name}");
        assert_eq!(block_on(client.check_tail(&bucket, &key)).expect("tail").seq_num, 3);
    }
    drop(client);
    node.stop();
}

/// The journals can live apart from the data directory (`--journal-dir`). The manifest
/// records where, and a start that would look for them elsewhere is refused, instead of
/// starting without the acknowledged records they hold.
#[test]
fn journals_apart_from_the_data_directory_are_never_left_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let journals = dir.path().join("fast").join("journals");
    let mut cfg = config(&data, 1);
    cfg.journal_dir = Some(journals.clone());
    let node = start(cfg.clone());
    let client = node.client();
    let bucket = make_bucket(&client, "apart", express(), true);
    block_on(client.append(&bucket, &key("k"), plain(&["a", "b"]))).expect("append");
    drop(client);
    node.stop();
    assert!(journals.join("shard-0").is_dir(), "the journal went where it was told");
    assert!(!data.join("journal").exists(), "and nowhere else");

    let elsewhere = dir.path().join("elsewhere");
    for journal_dir in [None, Some(elsewhere.clone())] {
        let mut moved = config(&data, 1);
        moved.journal_dir = journal_dir;
        let refused = engine::node::Node::start(moved).err().expect("refused").to_string();
        let kept = journals.display().to_string();
        assert!(refused.contains("journal-dir") && refused.contains(&kept), "{refused}");
    }
    assert!(!elsewhere.exists(), "refused before it made a journal there");

    let node = start(cfg);
    let client = node.client();
    let bodies: Vec<Vec<u8>> =
        read_all(&client, &bucket, &key("k")).into_iter().map(|r| r.2).collect();
    assert_eq!(bodies, [b"a".to_vec(), b"b".to_vec()]);
    drop(client);
    node.stop();
}

/// A journal that is missing or empty when a data directory that ran before starts (its
/// disk not mounted, its directory removed) held acknowledged express records not yet in
/// the object store: the start is refused, rather than losing them and handing their
/// sequence numbers out again. Only an explicit acceptance starts without it.
#[test]
fn a_missing_journal_is_refused_unless_its_loss_is_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), 1);
    let node = start(cfg.clone());
    let client = node.client();
    let bucket = make_bucket(&client, "lost", express(), true);
    block_on(client.append(&bucket, &key("k"), plain(&["a", "b"]))).expect("append");
    drop(client);
    node.stop();
    let journals = dir.path().join("journal");
    let unmounted = dir.path().join("journal-unmounted");
    std::fs::rename(&journals, &unmounted).expect("move the journals away");
    for empty in [false, true] {
        if empty {
            std::fs::create_dir_all(journals.join("shard-0")).expect("an empty mount point");
        }
        let refused = engine::node::Node::start(cfg.clone()).err().expect("refused").to_string();
        assert!(refused.contains("missing or empty"), "{refused}");
        assert!(refused.contains("--accept-journal-loss"), "{refused}");
    }
    // The journals back: everything acknowledged is there.
    std::fs::remove_dir_all(&journals).expect("remove the empty mount point");
    std::fs::rename(&unmounted, &journals).expect("restore the journals");
    let node = start(cfg.clone());
    let client = node.client();
    let bodies: Vec<Vec<u8>> =
        read_all(&client, &bucket, &key("k")).into_iter().map(|r| r.2).collect();
    assert_eq!(bodies, [b"a".to_vec(), b"b".to_vec()]);
    drop(client);
    node.stop();
    // Gone for good, and accepted: the node starts, with a journal anew.
    std::fs::remove_dir_all(&journals).expect("lose the journals");
    let mut accepting = cfg;
    accepting.accept_journal_loss = true;
    let node = start(accepting);
    assert!(journals.join("shard-0").is_dir());
    node.stop();
}

/// A first start that fails before it is ready (here its object store cannot be opened;
/// a start killed partway is the same) acknowledged nothing, and leaves no sign of
/// having run: the next start is not refused for journals it never made.
#[test]
fn a_first_start_that_failed_leaves_a_directory_the_next_start_takes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let not_a_directory = dir.path().join("objects-file");
    std::fs::write(&not_a_directory, b"a file where the objects should go").expect("a file");
    let mut failing = config(&data, 2);
    failing.objects = engine::node::ObjectStoreConfig::Local(not_a_directory);
    let refused = engine::node::Node::start(failing).err().expect("refused").to_string();
    assert!(refused.contains("objects-file"), "{refused}");

    let node = start(config(&data, 2));
    let client = node.client();
    let bucket = make_bucket(&client, "after", express(), true);
    block_on(client.append(&bucket, &key("k"), plain(&["a"]))).expect("append");
    drop(client);
    node.stop();
    // Having run now, its journals are required again.
    std::fs::remove_dir_all(data.join("journal")).expect("lose the journals");
    let refused = engine::node::Node::start(config(&data, 2)).err().expect("refused").to_string();
    assert!(refused.contains("missing or empty"), "{refused}");
}

/// After a restart nothing is in memory: a read loads the chunks it needs, up to
/// `read-page-loads-max` for one page, instead of answering one chunk per page.
#[test]
fn a_read_after_a_restart_loads_several_chunks_for_one_page() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "cold", express(), true);
    for i in 0..40 {
        block_on(client.append(&bucket, &key("k"), plain(&[&format!("r{i}")]))).expect("append");
    }
    drop(client);
    node.stop();
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let reply = block_on(client.read(&bucket, &key("k"), read_request(ReadStart::SeqNum(0))));
    let seqs: Vec<u64> = records(&reply.expect("read").frames).iter().map(|r| r.0).collect();
    // Each acknowledged one-record batch is a chunk of its own here (or shares one).
    assert!(seqs.len() >= 16, "one page after a restart: {seqs:?}");
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    drop(client);
    node.stop();
}

/// A stop flushes the batches waiting for their stream's batch delay at once, instead of
/// waiting it out, and acknowledges them.
#[test]
fn stopping_flushes_batches_waiting_for_their_delay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "delay", StorageClass::Standard, true);
    block_on(client.append(&bucket, &key("k"), plain(&["first"]))).expect("append");
    let slow = StreamOptionsPatch { batch_max_delay_ms: Some(60_000), ..Default::default() };
    block_on(client.reconfigure(&bucket, &key("k"), slow)).expect("reconfigure");
    let pending = {
        let (client, bucket) = (client.clone(), bucket.clone());
        thread::spawn(move || block_on(client.append(&bucket, &key("k"), plain(&["waits"]))))
    };
    // The append is sequenced (the tail it will make is known) before the stop begins.
    wait_until("the append in hand", || {
        block_on(client.stats()).expect("stats")[0].appends_waiting > 0
    });
    drop(client);
    let started = Instant::now();
    node.stop();
    assert!(started.elapsed() < Duration::from_secs(30), "stop took {:?}", started.elapsed());
    let ack = pending.join().expect("append thread").expect("acknowledged at the stop");
    assert_eq!(ack.start.seq_num, 1);
}

/// `append_sequenced` returns once the leader has sequenced a batch, before it is
/// durable: batches sequenced one after another are numbered in that order and wait for
/// durability together (here, for a standard stream's batch delay, which the stop cuts
/// short). A refusal is the call's own error, and takes no number.
#[test]
fn sequenced_appends_keep_their_order_and_become_durable_together() {
    use futures_lite::future::poll_once;
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 2));
    let client = node.client();
    let bucket = make_bucket(&client, "seq", StorageClass::Standard, true);
    let k = key("k");
    block_on(client.append(&bucket, &k, plain(&["first"]))).expect("append");
    let slow = StreamOptionsPatch { batch_max_delay_ms: Some(60_000), ..Default::default() };
    block_on(client.reconfigure(&bucket, &k, slow)).expect("reconfigure");
    let mut stream = None;
    let mut durable: Vec<_> = (0..20)
        .map(|i| {
            let request = plain(&[&format!("b{i}")]);
            let sequenced = block_on(client.append_sequenced(&bucket, &k, stream, request));
            let (to, pending) = sequenced.expect("sequenced");
            assert!(stream.is_none_or(|id| id == to), "the stream it was pinned to");
            stream = Some(to);
            Box::pin(pending.durable())
        })
        .collect();
    for ack in &mut durable {
        assert!(block_on(poll_once(ack)).is_none(), "durable before the batch delay");
    }
    let wrong =
        batch(&[b"x".to_vec()], AppendConditions { match_seq_num: Some(0), ..Default::default() });
    let refused =
        block_on(client.append_sequenced(&bucket, &k, stream, wrong)).expect_err("refused");
    assert_eq!((refused.code(), refused.next_seq_num()), (Code::FailedPrecondition, Some(21)));
    drop(client);
    node.stop();
    for (i, ack) in durable.into_iter().enumerate() {
        let ack = block_on(ack).expect("acknowledged at the stop");
        assert_eq!((ack.start.seq_num, ack.end.seq_num), (i as u64 + 1, i as u64 + 2), "in order");
    }
}

/// A sequenced append pinned to its stream goes there or nowhere: once the stream is
/// deleted it is NotFound, and its bucket's create-on-append makes no successor for it
/// (an append session stays on the stream it began on).
#[test]
fn a_pinned_sequenced_append_never_reaches_a_successor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 2));
    let client = node.client();
    let bucket = make_bucket(&client, "pinned", StorageClass::Express, true);
    let k = key("k");
    let (stream, pending) =
        block_on(client.append_sequenced(&bucket, &k, None, plain(&["a"]))).expect("created");
    block_on(pending.durable()).expect("durable");
    let (again, pending) =
        block_on(client.append_sequenced(&bucket, &k, Some(stream), plain(&["b"]))).expect("b");
    assert_eq!(again, stream);
    assert_eq!(block_on(pending.durable()).expect("durable").start.seq_num, 1);
    block_on(client.delete_stream(&bucket, &k)).expect("delete");
    let refused = block_on(client.append_sequenced(&bucket, &k, Some(stream), plain(&["c"])))
        .expect_err("the stream is gone");
    assert_eq!(refused.code(), Code::NotFound);
    let tail = block_on(client.check_tail(&bucket, &k)).map_err(|e| e.code());
    assert_eq!(tail, Err(Code::NotFound), "no successor was created");
    drop(client);
    node.stop();
}

/// One node per data directory: a second one is refused before it touches anything.
#[test]
fn a_second_node_on_a_data_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let refused = engine::node::Node::start(config(dir.path(), 1)).err().expect("refused");
    assert!(refused.to_string().contains("another nova is running on it"), "{refused}");
    node.stop();
    start(config(dir.path(), 1)).stop();
}

#[test]
fn everything_acknowledged_survives_a_restart_and_numbering_continues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), 1);
    let node = start(cfg.clone());
    let client = node.client();
    let bucket = make_bucket(&client, "keep", express(), true);
    let key = key("k");
    let mut acked = Vec::new();
    for i in 0..50 {
        let ack =
            block_on(client.append(&bucket, &key, plain(&[&format!("r{i}")]))).expect("append");
        acked.push(ack);
    }
    block_on(client.fence(&bucket, &key, "writer-2".into(), None)).expect("fence");
    let before = read_all(&client, &bucket, &key);
    let tail = block_on(client.check_tail(&bucket, &key)).expect("tail");
    drop(client);
    node.stop();

    let node = start(cfg);
    let client = node.client();
    assert_eq!(read_all(&client, &bucket, &key), before, "every acknowledged record, in order");
    assert_eq!(block_on(client.check_tail(&bucket, &key)).expect("tail"), tail);
    // The fencing token survived: an old-token append is refused, the current one lands.
    let stale = AppendConditions { fencing_token: Some("writer-1"), ..Default::default() };
    let err =
        block_on(client.append(&bucket, &key, batch(&[b"x".to_vec()], stale))).expect_err("fenced");
    assert_eq!(err.fencing_token(), Some("writer-2"));
    let current = AppendConditions { fencing_token: Some("writer-2"), ..Default::default() };
    let next =
        block_on(client.append(&bucket, &key, batch(&[b"x".to_vec()], current))).expect("append");
    assert_eq!(next.start.seq_num, 50);
    assert!(next.start.timestamp >= tail.timestamp, "timestamps continue, never decrease");
    drop(client);
    node.stop();
}

#[test]
fn pipelined_batches_take_contiguous_ranges_in_ack_order() {
    pipelined_batches(tuning::JOURNAL_SYNCS_IN_FLIGHT_MAX.default as usize);
}

/// The journal's pipeline off (`--journal-syncs-in-flight-max 1`): one group at a time.
#[test]
fn with_one_journal_sync_in_flight_batches_stay_contiguous_and_in_order() {
    pipelined_batches(1);
}

fn pipelined_batches(journal_syncs_in_flight_max: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(dir.path(), 1);
    config.shard.journal_syncs_in_flight_max = journal_syncs_in_flight_max;
    let node = start(config);
    let client = node.client();
    let bucket = make_bucket(&client, "pipe", express(), true);
    let key = key("k");
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let (client, bucket, key) = (client.clone(), bucket.clone(), key.clone());
            thread::spawn(move || {
                // Each producer pipelines: several appends in flight at once.
                let futures: Vec<_> = (0..25)
                    .map(|b| {
                        let bodies: Vec<Vec<u8>> =
                            (0..4).map(|r| format!("{p}:{b}:{r}").into_bytes()).collect();
                        client.append(&bucket, &key, batch(&bodies, AppendConditions::default()))
                    })
                    .collect();
                futures.into_iter().map(|f| block_on(f).expect("append")).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut ranges: Vec<(u64, u64)> = producers
        .into_iter()
        .flat_map(|p| p.join().expect("producer"))
        .map(|ack| (ack.start.seq_num, ack.end.seq_num))
        .collect();
    ranges.sort_unstable();
    let mut next = 0;
    for (start, end) in &ranges {
        assert_eq!(*start, next, "batches never overlap or leave gaps");
        assert_eq!(end - start, 4);
        next = *end;
    }
    // Each batch's records are contiguous, never interleaved with another's.
    let all = read_all(&client, &bucket, &key);
    assert_eq!(all.len(), 800);
    for chunk in all.chunks(4) {
        let prefix =
            |body: &[u8]| String::from_utf8_lossy(body).rsplit_once(':').map(|(p, _)| p.to_owned());
        assert!(chunk.iter().all(|r| prefix(&r.2) == prefix(&chunk[0].2)), "{chunk:?}");
    }
    let stats = block_on(client.stats()).expect("stats");
    let express = stats[0].express;
    assert_eq!((express.appends, express.records_in), (200, 800));
    assert_eq!(stats[0].standard, Default::default(), "no standard stream here");
    assert_eq!(express.ack_latency.count, 200);
    assert!(express.ack_latency.sum_micros > 0);
    assert!(stats[0].groups() <= stats[0].batches_acked());
    // Every record went through the journal, and writing took time.
    let bodies: u64 = all.iter().map(|r| r.2.len() as u64).sum();
    assert_eq!(express.bytes_in, bodies);
    assert!(stats[0].journal_bytes > bodies, "{} journal bytes", stats[0].journal_bytes);
    assert!(stats[0].journal_groups.sum_micros > 0);
    // read_all read it all back, page by page, from memory.
    assert_eq!(express.records_out, 800);
    assert_eq!(express.bytes_out, bodies);
    assert!(express.reads >= 1);
    assert_eq!((stats[0].read_cache_hits, stats[0].read_cache_misses), (express.reads, 0));
    assert!(stats[0].busy_micros > 0);
    // A counter: reading it does not start it over (glommio's own stats do).
    let again = block_on(client.stats()).expect("stats");
    assert!(again[0].busy_micros >= stats[0].busy_micros, "{again:?} after {stats:?}");
    drop(client);
    node.stop();
}

#[test]
fn a_waiting_read_returns_when_records_arrive_or_when_the_wait_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "wait", express(), true);
    let key = key("k");
    block_on(client.append(&bucket, &key, plain(&["first"]))).expect("append");
    let reader = {
        let (client, bucket, key) = (client.clone(), bucket.clone(), key.clone());
        thread::spawn(move || {
            let request = ReadRequest {
                start: ReadStart::SeqNum(1),
                clamp: false,
                limits: ALL,
                wait: Some(Duration::from_secs(30)),
            };
            block_on(client.read(&bucket, &key, request)).expect("read")
        })
    };
    // The reader is parked at the tail; an append wakes it (no polling, no lost wake-up).
    block_on(client.append(&bucket, &key, plain(&["second"]))).expect("append");
    let page = reader.join().expect("reader");
    assert_eq!(
        records(&page.frames).iter().map(|r| r.2.clone()).collect::<Vec<_>>(),
        [b"second".to_vec()]
    );
    // Nothing arrives: the wait ends with an empty page and the tail.
    let started = Instant::now();
    let request = ReadRequest {
        start: ReadStart::SeqNum(2),
        clamp: false,
        limits: ALL,
        wait: Some(Duration::from_millis(200)),
    };
    let empty = block_on(client.read(&bucket, &key, request)).expect("read");
    assert_eq!((empty.record_count, empty.tail.seq_num), (0, 2));
    assert!(started.elapsed() >= Duration::from_millis(200));
    drop(client);
    node.stop();
}

#[test]
fn conditions_fence_trim_and_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "rules", express(), true);
    let key = key("k");
    let matched = AppendConditions { match_seq_num: Some(0), ..Default::default() };
    block_on(client.append(&bucket, &key, batch(&[b"a".to_vec(), b"b".to_vec()], matched)))
        .expect("match 0");
    let err = block_on(client.append(&bucket, &key, batch(&[b"c".to_vec()], matched)))
        .expect_err("match 0 again");
    assert_eq!((err.code(), err.next_seq_num()), (Code::FailedPrecondition, Some(2)));
    assert_eq!(block_on(client.check_tail(&bucket, &key)).expect("tail").seq_num, 2, "no trace");

    // A fencing token over 36 bytes is refused whole, naming the limit.
    let long = "t".repeat(37);
    let too_long = AppendConditions { fencing_token: Some(&long), ..Default::default() };
    let err = block_on(client.append(&bucket, &key, batch(&[b"c".to_vec()], too_long)))
        .expect_err("too long");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.to_string().contains("36"), "{err}");
    let err = block_on(client.fence(&bucket, &key, long.clone(), None)).expect_err("too long");
    assert_eq!(err.code(), Code::InvalidArgument);

    // Fence with an expected token that is wrong, then right.
    let err =
        block_on(client.fence(&bucket, &key, "t1".into(), Some("nope".into()))).expect_err("wrong");
    assert_eq!(err.code(), Code::FailedPrecondition);
    let tail =
        block_on(client.fence(&bucket, &key, "t1".into(), Some(String::new()))).expect("fence");
    assert_eq!(tail.seq_num, 2);
    let old = AppendConditions { fencing_token: Some(""), ..Default::default() };
    assert!(block_on(client.append(&bucket, &key, batch(&[b"c".to_vec()], old))).is_err());

    // Past the tail, clamp, tail_offset.
    let err =
        block_on(client.read(&bucket, &key, read_request(ReadStart::SeqNum(3)))).expect_err("past");
    assert_eq!(err.tail(), Some(block_on(client.check_tail(&bucket, &key)).expect("tail")));
    let clamped = ReadRequest { clamp: true, ..read_request(ReadStart::SeqNum(3)) };
    assert_eq!(block_on(client.read(&bucket, &key, clamped)).expect("clamped").record_count, 0);
    let last =
        block_on(client.read(&bucket, &key, read_request(ReadStart::TailOffset(1)))).expect("read");
    assert_eq!(records(&last.frames)[0].2, b"b");

    // Trim past the tail is clamped to it; reads below the watermark start above it.
    assert_eq!(block_on(client.trim(&bucket, &key, TrimTo::SeqNum(1))).expect("trim"), 1);
    assert_eq!(
        block_on(client.trim(&bucket, &key, TrimTo::SeqNum(0))).expect("trim"),
        1,
        "never backward"
    );
    let page =
        block_on(client.read(&bucket, &key, read_request(ReadStart::SeqNum(0)))).expect("read");
    assert_eq!(records(&page.frames).iter().map(|r| r.0).collect::<Vec<_>>(), [1]);
    assert_eq!(block_on(client.trim(&bucket, &key, TrimTo::SeqNum(99))).expect("trim"), 2);
    let (record, _) = block_on(client.get_stream(&bucket, &key)).expect("get");
    assert_eq!(record.trim_seq_num, 2);

    // Observing verbs never create; a missing bucket is not found.
    let missing = engine::names::StreamKey::parse("missing").expect("key");
    assert_eq!(
        block_on(client.check_tail(&bucket, &missing)).map_err(|e| e.code()),
        Err(Code::NotFound)
    );
    let nobucket = bucket_named("nowhere");
    assert_eq!(
        block_on(client.append(&nobucket, &key, plain(&["x"]))).map_err(|e| e.code()),
        Err(Code::NotFound)
    );
    drop(client);
    node.stop();
}

fn bucket_named(name: &str) -> engine::names::BucketName {
    common::bucket(name)
}

#[test]
fn reconfigure_applies_at_once_and_delete_ends_the_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "life", express(), true);
    let key = key("k");
    block_on(client.append(&bucket, &key, plain(&["a"]))).expect("append");
    let patch =
        StreamOptionsPatch { throughput_max_bytes_per_second: Some(1), ..Default::default() };
    block_on(client.reconfigure(&bucket, &key, patch)).expect("reconfigure");
    block_on(client.append(&bucket, &key, plain(&["bb"]))).expect("a full bucket passes one batch");
    let err = block_on(client.append(&bucket, &key, plain(&["cc"]))).expect_err("over the cap");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.retry_after_ms().is_some());

    let old_id = block_on(client.get_stream(&bucket, &key)).expect("get").0.id;
    block_on(client.delete_stream(&bucket, &key)).expect("delete");
    block_on(client.delete_stream(&bucket, &key)).expect("deleting a deleted stream succeeds");
    let never = common::key("never");
    assert_eq!(
        block_on(client.delete_stream(&bucket, &never)).map_err(|e| e.code()),
        Err(Code::NotFound)
    );
    assert_eq!(
        block_on(client.check_tail(&bucket, &key)).map_err(|e| e.code()),
        Err(Code::NotFound)
    );
    // Autocreate makes a new stream: fresh ID, empty history.
    let ack = block_on(client.append(&bucket, &key, plain(&["new"]))).expect("append");
    assert_eq!(ack.start.seq_num, 0);
    let (record, tail) = block_on(client.get_stream(&bucket, &key)).expect("get");
    assert_ne!(record.id, old_id);
    assert_eq!(tail, Tail { seq_num: 1, timestamp: ack.end.timestamp });
    assert_eq!(read_all(&client, &bucket, &key).len(), 1);
    drop(client);
    node.stop();
}

#[test]
fn concurrent_deletes_all_succeed_and_leave_the_stream_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "twice", express(), false);
    let key = key("k");
    block_on(client.control().create_stream(&bucket, &key, &Default::default(), None))
        .expect("create");
    block_on(client.append(&bucket, &key, plain(&["a"]))).expect("append");
    let deleters: Vec<_> = (0..4)
        .map(|_| {
            let (client, bucket, key) = (client.clone(), bucket.clone(), key.clone());
            thread::spawn(move || block_on(client.delete_stream(&bucket, &key)))
        })
        .collect();
    for deleter in deleters {
        deleter.join().expect("deleter").expect("every delete of one stream succeeds");
    }
    assert_eq!(
        block_on(client.check_tail(&bucket, &key)).map_err(|e| e.code()),
        Err(Code::NotFound)
    );
    assert_eq!(
        block_on(client.append(&bucket, &key, plain(&["b"]))).map_err(|e| e.code()),
        Err(Code::NotFound)
    );
    drop(client);
    node.stop();
}

#[test]
fn a_delete_wakes_a_waiting_reader_with_not_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "gone", express(), true);
    let key = key("k");
    block_on(client.append(&bucket, &key, plain(&["a"]))).expect("append");
    let reader = {
        let (client, bucket, key) = (client.clone(), bucket.clone(), key.clone());
        thread::spawn(move || {
            let request = ReadRequest {
                wait: Some(Duration::from_secs(30)),
                ..read_request(ReadStart::SeqNum(1))
            };
            block_on(client.read(&bucket, &key, request))
        })
    };
    // Once the reader is parked (the shard has it), delete.
    block_on(client.delete_stream(&bucket, &key)).expect("delete");
    let result = reader.join().expect("reader");
    // The reader either was parked and woke with not_found, or arrived after the
    // delete and was refused with not_found: never records, never a hang.
    assert_eq!(result.map_err(|e| e.code()), Err(Code::NotFound));
    drop(client);
    node.stop();
}

#[test]
fn evicted_history_is_read_back_from_storage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path(), 1);
    // Far less than the history below, and more than the chunks pinned in memory while
    // their upload is on its way (one bundle delay and a PUT's worth of appends).
    cfg.shard.memory_budget_bytes = 512 << 10;
    let node = start(cfg);
    let client = node.client();
    let bucket = make_bucket(&client, "small", express(), true);
    let key = key("k");
    let body = vec![b'x'; 4000];
    // Chunks stay pinned until their upload lands, so on a busy machine the budget can
    // fill for a moment: a refusal with a retry time is honoured, as a client must.
    for _ in 0..400 {
        append_patiently(&client, &bucket, &key, std::slice::from_ref(&body)).expect("append");
    }
    let all = read_all(&client, &bucket, &key);
    assert_eq!(all.len(), 400);
    assert!(all.iter().all(|r| r.2 == body));
    // A batch larger than the whole budget is refused, never buffered without bound, and
    // for good: no retry could ever find room for it.
    let huge = vec![b'y'; 600 << 10];
    let err = block_on(client.append(&bucket, &key, batch(&[huge], AppendConditions::default())));
    assert_eq!(err.map_err(|e| e.code()), Err(Code::InvalidArgument));
    assert_eq!(block_on(client.check_tail(&bucket, &key)).expect("tail").seq_num, 400);
    drop(client);
    node.stop();
}

#[test]
fn a_batch_larger_than_a_journal_entry_is_refused_before_it_takes_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dir.path(), 1);
    cfg.journal.segment_bytes = 1 << 20;
    let node = start(cfg);
    let client = node.client();
    let bucket = make_bucket(&client, "entry", express(), true);
    let key = key("k");
    block_on(client.append(&bucket, &key, plain(&["a"]))).expect("append");
    let big: Vec<Vec<u8>> = (0..2).map(|_| vec![b'z'; 600 << 10]).collect();
    let err = block_on(client.append(&bucket, &key, batch(&big, AppendConditions::default())))
        .expect_err("too big");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.to_string().contains("--journal-segment-bytes"), "{err}");
    let ack = block_on(client.append(&bucket, &key, plain(&["b"]))).expect("append");
    assert_eq!(ack.start.seq_num, 1, "the refused batch left no trace");
    drop(client);
    node.stop();
}

#[test]
fn timestamps_and_bounds_through_the_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "time", express(), true);
    let key = key("k");
    for t in [100i64, 200, 300] {
        let stamped = AppendConditions { timestamp: Some(t), ..Default::default() };
        let ack =
            block_on(client.append(&bucket, &key, batch(&[b"r".to_vec(), b"s".to_vec()], stamped)))
                .expect("ok");
        assert_eq!(ack.start.timestamp, t as u64);
    }
    let from_time = block_on(client.read(&bucket, &key, read_request(ReadStart::Timestamp(150))))
        .expect("read");
    assert_eq!(records(&from_time.frames)[0].0, 2);
    let bounded = ReadRequest {
        limits: PageLimits { records: 3, bytes: u64::MAX, until: Some(300) },
        ..read_request(ReadStart::SeqNum(0))
    };
    let page = block_on(client.read(&bucket, &key, bounded)).expect("read");
    assert_eq!((page.record_count, page.next_seq_num), (3, 3));
    let until = ReadRequest {
        limits: PageLimits { records: 100, bytes: u64::MAX, until: Some(300) },
        ..read_request(ReadStart::SeqNum(0))
    };
    let page = block_on(client.read(&bucket, &key, until)).expect("read");
    assert_eq!((page.record_count, page.reached_until), (4, true));
    drop(client);
    node.stop();
}

/// The foreign-wake hazard of platform.md: replies cross threads (client thread to
/// shard and back) tens of thousands of times; a stalled round trip fails the test.
#[test]
fn cross_thread_round_trips_never_stall() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 2));
    let client = node.client();
    let bucket = make_bucket(&client, "soak", express(), true);
    // Eight streams, on both shards (IDs are random: make streams until both own some).
    let mut keys = Vec::new();
    let mut owners = [0usize; 2];
    for i in 0..64 {
        let key = key(&format!("k{i}"));
        block_on(client.append(&bucket, &key, plain(&["seed"]))).expect("append");
        let owner = client.owner(block_on(client.get_stream(&bucket, &key)).expect("get").0.id);
        if owners[owner] < 4 {
            owners[owner] += 1;
            keys.push(key);
        }
        if keys.len() == 8 {
            break;
        }
    }
    assert_eq!(owners, [4, 4], "four streams on each shard");
    let (progress, ticks) = flume::bounded::<()>(1024);
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (client, bucket, keys, progress) =
                (client.clone(), bucket.clone(), keys.clone(), progress.clone());
            thread::spawn(move || {
                for i in 0..5_000u64 {
                    let key = &keys[((w + i) % 8) as usize];
                    block_on(client.check_tail(&bucket, key)).expect("tail");
                    progress.send(()).expect("watcher alive");
                }
            })
        })
        .collect();
    drop(progress);
    let mut done = 0u64;
    // A watchdog, not a timing: any round trip that stalls stops the ticks.
    while done < 20_000 {
        ticks.recv_timeout(Duration::from_secs(10)).expect("a round trip stalled for 10 s");
        done += 1;
    }
    for worker in workers {
        worker.join().expect("worker");
    }
    drop(client);
    node.stop();
}

#[test]
fn a_data_directory_keeps_its_shard_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    start(config(dir.path(), 1)).stop();
    let err = engine::node::Node::start(config(dir.path(), 2)).err().expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.to_string().contains("shards"), "{err}");
}

#[test]
fn a_service_runs_on_every_shard_and_finishes_its_work_before_the_node_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (acks_tx, acks) = flume::unbounded();
    let service: engine::node::Service = {
        std::sync::Arc::new(move |context: engine::node::ServiceContext| {
            let acks_tx = acks_tx.clone();
            Box::pin(async move {
                context.stopping.wait().await;
                // Work that is still in hand when the node stops: it must be served.
                let bucket = bucket("svc");
                let key = key(&format!("shard-{}", context.shard));
                let ack = context.client.append(&bucket, &key, plain(&["last"])).await;
                let _ = acks_tx.send(ack.map(|a| a.end.seq_num));
            })
        })
    };
    let node = engine::node::Node::start_serving(config(dir.path(), 2), service).expect("start");
    let client = node.client();
    make_bucket(&client, "svc", StorageClass::Express, true);
    drop(client);
    node.stop();
    let ends: Vec<u64> = acks.try_iter().map(|a| a.expect("served while stopping")).collect();
    assert_eq!(ends, [1, 1], "each shard's service ran and finished its append before the stop");
}

#[test]
fn a_relative_data_directory_works() {
    // nextest runs each test in a process of its own, so changing directory is local.
    let dir = tempfile::tempdir().expect("tempdir");
    std::env::set_current_dir(dir.path()).expect("chdir");
    let node = start(config(std::path::Path::new("nova-data"), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "rel", express(), true);
    let ack = block_on(client.append(&bucket, &key("k"), plain(&["a"]))).expect("append");
    assert_eq!(ack.end.seq_num, 1);
    drop(client);
    node.stop();
    assert!(dir.path().join("nova-data/journal").is_dir());
}

#[test]
fn stopping_a_node_ends_waiting_reads_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "poll", express(), true);
    block_on(client.append(&bucket, &key("k"), plain(&["a"]))).expect("append");
    let reader = {
        let (client, bucket) = (client.clone(), bucket.clone());
        thread::spawn(move || {
            let request = ReadRequest {
                start: ReadStart::SeqNum(1),
                clamp: false,
                limits: ALL,
                wait: Some(Duration::from_secs(600)),
            };
            block_on(client.read(&bucket, &key("k"), request))
        })
    };
    // The read is waiting once the shard has it; a stop must not wait out its 600 s.
    wait_until("the read waiting", || {
        block_on(client.stats()).expect("stats")[0].reads_waiting > 0
    });
    drop(client);
    let started = Instant::now();
    node.stop();
    let reply = reader.join().expect("reader").expect("an empty page, not an error");
    assert_eq!((reply.record_count, reply.next_seq_num), (0, 1));
    assert!(started.elapsed() < Duration::from_secs(60), "stop waited {:?}", started.elapsed());
}

/// The retention backlog: how far past its age bound the most overdue record was when
/// a pass began, read off the pass that trimmed it; 0 at the pass after.
#[test]
fn the_retention_backlog_is_how_overdue_the_oldest_record_was() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let dir = tempfile::tempdir().expect("tempdir");
    let now = Arc::new(AtomicU64::new(1_800_000_000_000));
    // Long enough between passes to read the stats of the one that trimmed.
    let node = retention_node(dir.path(), &now, Duration::from_secs(2));
    let client = node.client();
    let bucket = make_bucket(&client, "retb", express(), true);
    block_on(client.append(&bucket, &key("k"), plain(&["a"]))).expect("append");
    let age = StreamOptionsPatch { retention_max_age_ms: Some(2_000), ..Default::default() };
    block_on(client.reconfigure(&bucket, &key("k"), age)).expect("reconfigure");
    let stats = || block_on(client.stats()).expect("stats")[0];
    // The record is 59 s past its 2 s bound when the next pass looks.
    now.fetch_add(61_000, Ordering::SeqCst);
    wait_until("the trim", || stats().retention_trims > 0);
    // Set before the pass trims, so its value is there once the trim is.
    assert_eq!(stats().retention_backlog_ms, 59_000);
    let passes = stats().retention_passes;
    wait_until("the next pass", || stats().retention_passes > passes);
    assert_eq!(stats().retention_backlog_ms, 0, "nothing is overdue once trimmed");
    drop(client);
    node.stop();
}

/// Age retention on record time, with a clock the test moves: a stream that goes quiet
/// loses its records exactly when they age out, and a reconfigured age applies at once.
#[test]
fn age_retention_trims_a_quiet_stream_on_time_and_follows_reconfigure() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let dir = tempfile::tempdir().expect("tempdir");
    let now = Arc::new(AtomicU64::new(1_800_000_000_000));
    let node = retention_node(dir.path(), &now, Duration::from_millis(10));
    let client = node.client();
    let bucket = make_bucket(&client, "ret", express(), true);
    let key = key("k");
    block_on(client.append(&bucket, &key, plain(&["a", "b"]))).expect("append");
    now.fetch_add(1_000, Ordering::SeqCst);
    block_on(client.append(&bucket, &key, plain(&["c"]))).expect("append");
    let age = |ms: u64| StreamOptionsPatch { retention_max_age_ms: Some(ms), ..Default::default() };
    block_on(client.reconfigure(&bucket, &key, age(2_000))).expect("reconfigure");
    let passes = || block_on(client.stats()).expect("stats")[0].retention_passes;
    let wait_passes = |n: u64| {
        let target = passes() + n;
        wait_until("the retention passes", || passes() >= target);
    };
    let first = || {
        let reply = block_on(client.read(&bucket, &key, read_request(ReadStart::SeqNum(0))));
        records(&reply.expect("read").frames).first().map(|r| r.0)
    };
    // 1999 ms after the first batch: nothing has aged out.
    now.fetch_add(999, Ordering::SeqCst);
    wait_passes(2);
    assert_eq!(first(), Some(0));
    // 2000 ms: the first batch ages out, no append needed; the second stays.
    now.fetch_add(1, Ordering::SeqCst);
    wait_passes(2);
    assert_eq!(first(), Some(2));
    // Unbounded: nothing more goes, however old.
    block_on(client.reconfigure(&bucket, &key, age(0))).expect("reconfigure");
    now.fetch_add(60_000, Ordering::SeqCst);
    wait_passes(2);
    assert_eq!(first(), Some(2));
    // Bounded again: applies at once; everything is past it.
    block_on(client.reconfigure(&bucket, &key, age(2_000))).expect("reconfigure");
    wait_passes(2);
    assert_eq!(first(), None);
    let tail = block_on(client.check_tail(&bucket, &key)).expect("tail");
    assert_eq!(tail.seq_num, 3, "trimming never moves the tail");
    // After a restart, a stream nobody touches still trims on time.
    block_on(client.append(&bucket, &key, plain(&["d"]))).expect("append");
    drop(client);
    node.stop();
    let node = retention_node(dir.path(), &now, Duration::from_millis(10));
    let client = node.client();
    now.fetch_add(2_000, Ordering::SeqCst);
    // Metadata only: reading the stream would make its leader and prove nothing.
    wait_until("the untouched stream trimmed", || {
        block_on(client.control().get_stream(&bucket, &key)).expect("get").trim_seq_num >= 4
    });
    drop(client);
    node.stop();
    // Everything trimmed, then a restart: numbering continues at the watermark.
    let node = engine::node::Node::start_with_clock(config(dir.path(), 1), clock_reading(&now))
        .expect("restart");
    let client = node.client();
    let ack = block_on(client.append(&bucket, &key, plain(&["e"]))).expect("append");
    assert_eq!(ack.start.seq_num, 4, "trimmed numbers are never reused");
    drop(client);
    node.stop();
    // A record that aged out while the node was down is trimmed before the node serves:
    // no read after the start finds it, however soon (the passes are an hour apart).
    now.fetch_add(2_000, Ordering::SeqCst);
    let node = retention_node(dir.path(), &now, Duration::from_secs(3600));
    let client = node.client();
    let reply = block_on(client.read(&bucket, &key, read_request(ReadStart::SeqNum(0))));
    assert_eq!(records(&reply.expect("read").frames).first().map(|r| r.0), None, "aged out");
    drop(client);
    node.stop();
}

#[test]
fn trim_by_timestamp_goes_to_the_first_record_stamped_at_or_after_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let dir = tempfile::tempdir().expect("tempdir");
    let now = Arc::new(AtomicU64::new(1_800_000_000_000));
    let node = engine::node::Node::start_with_clock(config(dir.path(), 1), clock_reading(&now))
        .expect("start");
    let client = node.client();
    let bucket = make_bucket(&client, "trimt", express(), true);
    let key = key("k");
    let t0 = now.load(Ordering::SeqCst);
    for (i, bodies) in [["a", "b"], ["c", "d"], ["e", "f"]].iter().enumerate() {
        now.store(t0 + 10 * i as u64, Ordering::SeqCst);
        block_on(client.append(&bucket, &key, plain(bodies))).expect("append");
    }
    let trim = |t: u64| block_on(client.trim(&bucket, &key, TrimTo::Timestamp(t))).expect("trim");
    assert_eq!(trim(t0 + 5), 2, "the first record stamped at or after t0+5 is c");
    assert_eq!(trim(t0), 2, "never backward");
    assert_eq!(trim(t0 + 10), 2);
    assert_eq!(trim(t0 + 11), 4);
    assert_eq!(trim(t0 + 1_000), 6, "past every record: the tail");
    let read = block_on(client.read(&bucket, &key, read_request(ReadStart::SeqNum(0))));
    assert_eq!(read.expect("read").record_count, 0, "nothing below the watermark is readable");
    drop(client);
    node.stop();
}

/// A stream trimmed to its tail has no chunk left to tell its last timestamp: the
/// watermark's row keeps it, so after a restart the tail is what it was and the next
/// append is never stamped before the records the stream had (records.md).
#[test]
fn a_stream_trimmed_to_its_tail_keeps_its_tail_timestamp_through_a_restart() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let dir = tempfile::tempdir().expect("tempdir");
    let late = 1_800_000_000_000;
    let now = Arc::new(AtomicU64::new(late));
    let node = engine::node::Node::start_with_clock(config(dir.path(), 1), clock_reading(&now))
        .expect("start");
    let client = node.client();
    let bucket = make_bucket(&client, "trimmed", express(), true);
    let key = key("k");
    block_on(client.append(&bucket, &key, plain(&["a", "b"]))).expect("append");
    assert_eq!(block_on(client.trim(&bucket, &key, TrimTo::SeqNum(2))).expect("trim"), 2);
    let tail = block_on(client.check_tail(&bucket, &key)).expect("tail");
    assert_eq!((tail.seq_num, tail.timestamp), (2, late));
    drop(client);
    node.stop();

    // The clock is behind the stream's last stamp now (a clock stepped back).
    now.store(late - 60_000, Ordering::SeqCst);
    let node = engine::node::Node::start_with_clock(config(dir.path(), 1), clock_reading(&now))
        .expect("start");
    let client = node.client();
    assert_eq!(block_on(client.check_tail(&bucket, &key)).expect("tail"), tail);
    let next = block_on(client.append(&bucket, &key, plain(&["c"]))).expect("append");
    assert_eq!((next.start.seq_num, next.start.timestamp), (2, late), "stamped no earlier");
    drop(client);
    node.stop();
}

#[test]
fn knobs_at_their_defaults_make_the_default_config_and_each_is_read_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let defaults = engine::node::NodeConfig::new(dir.path());
    let mut applied = engine::node::NodeConfig::new(dir.path());
    applied.shards = 0;
    applied.uploader.bundle_delay = Duration::ZERO; // overwritten below, or the test fails
    let mut read = Vec::new();
    applied
        .apply_knobs(&mut |knob| {
            read.push(knob.flag);
            Ok(knob.default)
        })
        .expect("defaults are valid");
    assert_eq!(format!("{applied:?}"), format!("{defaults:?}"));
    let mut once = read.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), read.len(), "no knob is read twice: {read:?}");
    // A knob's error stops the whole and names it.
    let mut failing = engine::node::NodeConfig::new(dir.path());
    let error = failing
        .apply_knobs(&mut |knob| {
            if knob.flag == "settle-age-ms" {
                Err(format!("--{} is bad", knob.flag))
            } else {
                Ok(knob.default)
            }
        })
        .expect_err("refused");
    assert!(error.contains("settle-age-ms"), "{error}");
}

/// Chunks that leave the cache other than by eviction (here: their streams deleted,
/// in a cache far from full, so nothing is evicted) do not pile up in its eviction
/// order: it holds at most twice the cached chunks plus 4096.
#[test]
fn the_cache_order_stays_bounded_when_nothing_is_evicted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "churn", express(), true);
    let (rounds, streams, appends) = (6, 64, 60);
    for round in 0..rounds {
        let producers: Vec<_> = (0..streams)
            .map(|s| {
                let (client, bucket) = (client.clone(), bucket.clone());
                thread::spawn(move || {
                    // One at a time: each lands in a journal group, a chunk, of its own.
                    for _ in 0..appends {
                        block_on(client.append(
                            &bucket,
                            &key(&format!("{round}-{s}")),
                            plain(&["x"]),
                        ))
                        .expect("append");
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.join().expect("producer");
        }
        for s in 0..streams {
            block_on(client.delete_stream(&bucket, &key(&format!("{round}-{s}")))).expect("delete");
        }
    }
    let stats = block_on(client.stats()).expect("stats");
    let pushed = rounds * streams * appends;
    let live = streams * appends;
    assert!(stats[0].chunks >= pushed as u64, "{} chunks", stats[0].chunks);
    let entries = stats[0].cache_entries;
    assert!(entries <= (2 * live + 4096) as u64, "{entries} entries after {pushed} chunks");
    drop(client);
    node.stop();
}

/// A stream's class changes back and forth under a steady load: each class has its own
/// path to durability (the journal, a bundle), and a change waits for the chunks in
/// flight on the old one, so chunks still become durable in order; every append lands
/// once, contiguous.
#[test]
fn a_class_change_under_load_keeps_chunks_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(config(dir.path(), 1));
    let client = node.client();
    let bucket = make_bucket(&client, "switch", StorageClass::Standard, true);
    let key = key("k");
    block_on(client.append(&bucket, &key, plain(&["first"]))).expect("append");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let (client, bucket, key, stop) =
                (client.clone(), bucket.clone(), key.clone(), stop.clone());
            thread::spawn(move || {
                let mut acked = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    block_on(client.append(&bucket, &key, plain(&[&format!("{p}")])))
                        .expect("append");
                    acked += 1;
                }
                acked
            })
        })
        .collect();
    for class in [express(), StorageClass::Standard].into_iter().cycle().take(100) {
        let patch = StreamOptionsPatch { class: Some(class), ..Default::default() };
        block_on(client.reconfigure(&bucket, &key, patch)).expect("reconfigure");
        block_on(client.append(&bucket, &key, plain(&["between"]))).expect("append");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked: u64 = producers.into_iter().map(|p| p.join().expect("producer")).sum();
    let records = read_all(&client, &bucket, &key);
    assert_eq!(records.len() as u64, 1 + 100 + acked);
    assert!(records.iter().enumerate().all(|(i, r)| r.0 == i as u64), "contiguous from 0");
    drop(client);
    node.stop();
}
