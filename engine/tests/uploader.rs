//! The uploader core against real object stores: chunks from many submitters land in
//! transit bundles exactly once and where their placements say; bundles are cut by size
//! and by delay; failed and slow PUTs are retried and no request is answered before its
//! bundle is durable; one stream's run alone becomes its settled object (or a bundle
//! when its key is taken); and a soak of the glommio ↔ uploader bridge fails on a stall.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use engine::aligned::AlignedBuf;
use engine::chunk::{ChunkBuilder, SealedChunk};
use engine::ids::StreamId;
use engine::loan::ChunkLoan;
use engine::names::BucketName;
use engine::settled::{SettledBuilder, SettledKey, SettledObject};
use engine::stream::ChunkSource;
use engine::transit::{Bundle, Slot, SlotParts, TRANSIT_PREFIX};
use engine::uploader::{SettledSlot, UploadChunk, Uploaded, Uploader, UploaderConfig};
use futures_lite::future::block_on;
use s3::{
    BoxFuture, ByteRange, Bytes, Error as StoreError, ErrorKind, ListPage, LocalDirOptions,
    LocalDirStore, ObjectStore, PutCondition, S3Config, S3Credentials, S3Store, TransferPolicy,
};

/// A test that has not finished in this long has stalled.
const STALL: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

fn stream(thread: usize, index: usize) -> StreamId {
    let mut id = [0u8; 16];
    id[0] = thread as u8;
    id[1] = index as u8;
    id[15] = 0x5A;
    StreamId(id)
}

/// The body of record `seq` of `stream`: recognisable, so a misplaced byte shows.
fn body(stream: StreamId, seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| stream.0[0] ^ stream.0[1] ^ (seq as u8) ^ (i as u8)).collect()
}

/// A sealed chunk of `records` records of `len` body bytes from `first`.
fn chunk(stream: StreamId, first: u64, records: usize, len: usize) -> SealedChunk<AlignedBuf> {
    let capacity = ChunkBuilder::<AlignedBuf>::capacity_for(records, records * (len + 1));
    let mut builder = ChunkBuilder::new(stream, first, capacity);
    for seq in first..first + records as u64 {
        let mut stored = vec![0x00];
        stored.extend_from_slice(&body(stream, seq, len));
        builder.push_record(&stored, 1_000 + seq).expect("sized for it");
    }
    builder.seal()
}

/// What a request sent, chunk by chunk: (stream, first seq_num, records, body length).
type Sent = Vec<(StreamId, u64, usize, usize)>;

fn chunks_of(sent: &Sent) -> Vec<UploadChunk> {
    sent.iter().map(|&(s, first, n, len)| chunk(s, first, n, len).into()).collect()
}

/// Every placement GETs back exactly its chunk, and the returned chunks are the sent ones.
fn check_answer(
    rt: &tokio::runtime::Runtime,
    store: &dyn ObjectStore,
    sent: &Sent,
    got: &Uploaded,
) {
    assert_eq!(got.placements.len(), sent.len());
    assert_eq!(got.chunks.len(), sent.len());
    for ((&(stream, first, n, len), placement), returned) in
        sent.iter().zip(&got.placements).zip(&got.chunks)
    {
        assert_eq!((placement.stream_id, placement.first_seq_num), (stream, first));
        assert_eq!(placement.record_count as usize, n);
        let bytes = rt
            .block_on(store.get(&placement.key, ByteRange::Span(placement.range())))
            .expect("the placement's ranged GET");
        assert_eq!(bytes.len() as u64, placement.length);
        let slot = Slot::parse(&bytes).expect("the range is exactly one valid slot");
        assert_eq!(
            (slot.envelope.stream_id, slot.envelope.first_seq_num, slot.envelope.record_count),
            (stream, first, n as u32)
        );
        assert_eq!(slot.chunk.records.len(), n);
        for (i, (seq, _, record)) in slot.chunk.records.iter().enumerate() {
            assert_eq!(seq, first + i as u64);
            assert_eq!(&record[1..], body(stream, seq, len).as_slice(), "record {seq}");
        }
        assert_eq!(&bytes[64..], returned.bytes(), "the chunk given back is the one stored");
        let chunk = rt
            .block_on(store.get(&placement.key, ByteRange::Span(placement.chunk_range())))
            .expect("the chunk's ranged GET");
        assert_eq!(&chunk[..], returned.bytes());
    }
}

/// Parses every bundle under the transit prefix whole; returns every slot's (stream,
/// first seq_num) with its multiplicity, and the bundles' sizes.
fn all_slots(
    rt: &tokio::runtime::Runtime,
    store: &dyn ObjectStore,
) -> (HashMap<(StreamId, u64), usize>, Vec<u64>) {
    let mut slots = HashMap::new();
    let mut sizes = Vec::new();
    let mut after: Option<String> = None;
    for _page in 0..10_000 {
        let ListPage { objects, next } =
            rt.block_on(store.list(TRANSIT_PREFIX, after.as_deref(), 1000)).expect("list");
        for object in objects {
            let bytes = rt.block_on(store.get(&object.key, ByteRange::All)).expect("get");
            let bundle = Bundle::parse(&bytes).expect("every bundle parses whole");
            assert_eq!(object.key, bundle_key(&bundle));
            for slot in bundle.slots() {
                *slots
                    .entry((slot.envelope.stream_id, slot.envelope.first_seq_num))
                    .or_insert(0) += 1;
            }
            sizes.push(bytes.len() as u64);
        }
        match next {
            Some(next) => after = Some(next),
            None => return (slots, sizes),
        }
    }
    panic!("the listing never ended");
}

fn bundle_key(bundle: &Bundle<'_>) -> String {
    engine::transit::TransitKey {
        written_at_ms: bundle.footer.written_at_ms,
        bundle_id: bundle.footer.bundle_id,
    }
    .to_string()
}

/// Runs `work` on its own thread and fails the test if it does not finish within
/// [`STALL`].
fn within_stall_limit<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    match rx.recv_timeout(STALL) {
        Ok(value) => value,
        Err(e) => panic!("the test stalled or its thread panicked: {e}"),
    }
}

/// `threads` submitters, each owning its streams like a shard, sending `requests`
/// requests of one to three chunks and checking each answer as it comes.
fn submit_from_threads(
    uploader: &Uploader,
    store: &Arc<dyn ObjectStore>,
    threads: usize,
    requests: usize,
    body_len: usize,
    on_answer: Arc<dyn Fn(&Uploaded) + Send + Sync>,
) -> BTreeSet<(StreamId, u64)> {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (uploader, store, on_answer) =
                (uploader.clone(), Arc::clone(store), Arc::clone(&on_answer));
            std::thread::spawn(move || {
                let rt = runtime();
                let mut next_seq = [0u64; 4];
                let mut sent_all = Vec::new();
                for r in 0..requests {
                    // One to three chunks, of different streams or consecutive in one.
                    let sent: Sent = (0..1 + (r + t) % 3)
                        .map(|c| {
                            let s = (r + c * 3) % 4;
                            let n = 1 + (r + c) % 4;
                            let first = next_seq[s];
                            next_seq[s] += n as u64;
                            (stream(t, s), first, n, body_len)
                        })
                        .collect();
                    let got = block_on(uploader.upload(chunks_of(&sent))).expect("uploaded");
                    on_answer(&got);
                    check_answer(&rt, store.as_ref(), &sent, &got);
                    sent_all.extend(sent.iter().map(|&(s, first, _, _)| (s, first)));
                }
                sent_all
            })
        })
        .collect();
    let mut sent = BTreeSet::new();
    for handle in handles {
        for key in handle.join().expect("a submitter failed") {
            assert!(sent.insert(key), "sent twice: {key:?}");
        }
    }
    sent
}

/// Every sent chunk is in exactly one bundle, and no bundle holds anything else.
fn assert_exactly_once(
    rt: &tokio::runtime::Runtime,
    store: &dyn ObjectStore,
    sent: &BTreeSet<(StreamId, u64)>,
) -> Vec<u64> {
    let (slots, sizes) = all_slots(rt, store);
    for (key, count) in &slots {
        assert_eq!(*count, 1, "{key:?} stored {count} times");
        assert!(sent.contains(key), "{key:?} stored but never sent");
    }
    assert_eq!(slots.len(), sent.len(), "chunks lost");
    sizes
}

fn local_store(dir: &std::path::Path) -> Arc<dyn ObjectStore> {
    Arc::new(LocalDirStore::open(dir, LocalDirOptions::default()).expect("open the store"))
}

#[test]
fn chunks_from_many_submitters_land_once_where_their_placements_say() {
    within_stall_limit(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = local_store(dir.path());
        let config = UploaderConfig {
            bundle_bytes_target: 96 << 10,
            bundle_delay: Duration::from_millis(5),
            uploads_in_flight_max: 4,
            queue_depth: 16,
            ..UploaderConfig::default()
        };
        let uploader = Uploader::start(Arc::clone(&store), config, "").expect("start");
        let started = Instant::now();
        let sent = submit_from_threads(&uploader, &store, 6, 40, 3000, Arc::new(|_| {}));
        let elapsed = started.elapsed();
        let stats = uploader.stats();
        eprintln!(
            "local dir: {} bundles, {} chunks, {:.2} MB in {elapsed:?} ({:.0} bundles/s, {:.1} \
             MB/s; submitters check every answer with ranged GETs meanwhile); put p50 {} µs \
             p99 {} µs",
            stats.bundles,
            stats.chunks,
            stats.bundle_bytes as f64 / 1e6,
            stats.bundles as f64 / elapsed.as_secs_f64(),
            stats.bundle_bytes as f64 / 1e6 / elapsed.as_secs_f64(),
            stats.put_latency_us_p50,
            stats.put_latency_us_p99,
        );
        uploader.stop();
        let rt = runtime();
        let sizes = assert_exactly_once(&rt, store.as_ref(), &sent);
        assert_eq!(stats.bundles, sizes.len() as u64);
        assert_eq!(stats.chunks, sent.len() as u64);
        assert_eq!(stats.requests, 6 * 40);
        assert_eq!(stats.bundle_bytes, sizes.iter().sum::<u64>());
        assert!(stats.bundles > 1, "{stats:?}");
        assert!(stats.chunks_per_bundle_max > 1, "chunks of several requests shared a bundle");
        assert!(stats.cut_by_size > 0, "six submitters fill 96 KiB bundles: {stats:?}");
        assert!(sizes.iter().any(|&size| size >= 96 << 10), "{sizes:?}");
        assert_eq!(stats.cut_by_size + stats.cut_by_delay + stats.cut_by_stop, stats.bundles);
    });
}

#[test]
fn a_lone_chunk_goes_out_after_the_delay_and_a_large_request_at_once() {
    within_stall_limit(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = local_store(dir.path());
        let config = UploaderConfig {
            bundle_bytes_target: 256 << 10,
            bundle_delay: Duration::from_millis(200),
            ..UploaderConfig::default()
        };
        let uploader = Uploader::start(Arc::clone(&store), config, "cluster-a/").expect("start");
        let rt = runtime();
        // One small chunk: far below the size target, so only the delay sends it; while
        // it waits, its bytes are counted as waiting.
        let sent: Sent = vec![(stream(0, 0), 0, 1, 10)];
        let started = Instant::now();
        let waiting = {
            let (uploader, chunks) = (uploader.clone(), chunks_of(&sent));
            std::thread::spawn(move || block_on(uploader.upload(chunks)))
        };
        let mut seen = 0;
        while seen == 0 && !waiting.is_finished() {
            seen = uploader.stats().bytes_waiting;
        }
        assert!(seen > 0, "the chunk's bytes wait for the delay");
        let got = waiting.join().expect("the uploading thread").expect("uploaded");
        let waited = started.elapsed();
        let stats = uploader.stats();
        assert_eq!((stats.bytes_waiting, stats.bytes_uploading), (0, 0), "durable: {stats:?}");
        check_answer(&rt, store.as_ref(), &sent, &got);
        assert!(got.placements[0].key.starts_with("cluster-a/_transit/"));
        let stats = uploader.stats();
        assert_eq!((stats.bundles, stats.cut_by_delay, stats.cut_by_size), (1, 1, 0));
        // The delay is a lower bound on the wait (never an upper one: no timed asserts).
        assert!(waited >= Duration::from_millis(200), "sent before the delay: {waited:?}");
        // One request over the target: cut by size as it arrives, alone in its bundle.
        let sent: Sent = (0..8).map(|s| (stream(1, s), 0, 4, 10_000)).collect();
        let got = block_on(uploader.upload(chunks_of(&sent))).expect("uploaded");
        check_answer(&rt, store.as_ref(), &sent, &got);
        let stats = uploader.stats();
        assert_eq!((stats.bundles, stats.cut_by_delay, stats.cut_by_size), (2, 1, 1));
        assert!(got.placements.iter().all(|p| p.key == got.placements[0].key), "one bundle");
        // An empty request is answered at once with nothing.
        let got = block_on(uploader.upload(Vec::new())).expect("nothing to do");
        assert!(got.placements.is_empty());
        uploader.stop();
    });
}

#[test]
fn the_settlers_slot_reads_are_verified_and_its_objects_assembled_by_the_uploader() {
    within_stall_limit(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = local_store(dir.path());
        let uploader =
            Uploader::start(Arc::clone(&store), UploaderConfig::default(), "").expect("start");
        let rt = runtime();
        let s = stream(2, 0);
        let sent: Sent = vec![(s, 0, 3, 100), (s, 3, 2, 5000)];
        let got = block_on(uploader.upload(chunks_of(&sent))).expect("uploaded");
        // Both chunks went in one bundle, back to back: one read returns both slots.
        let key = &got.placements[0].key;
        assert_eq!(&got.placements[1].key, key, "one bundle");
        let ranges: Vec<_> = got.placements.iter().map(|p| p.range()).collect();
        let slots = block_on(uploader.read_slots(Arc::clone(key), ranges.clone()))
            .expect("intact slots read back");
        assert_eq!(slots.len(), 2);
        for (slot, range) in slots.iter().zip(&ranges) {
            let direct = rt.block_on(store.get(key, ByteRange::Span(range.clone()))).expect("get");
            assert_eq!(*slot, direct);
        }
        let reads = uploader.stats().object_reads;
        assert_eq!(
            block_on(uploader.read_slots(Arc::clone(key), vec![ranges[1].clone()])).expect("one"),
            slots[1..]
        );
        assert_eq!(uploader.stats().object_reads, reads + 1, "one GET per call");
        // Ranges with a gap, or none, are refused before any read.
        let gap = vec![ranges[0].start..ranges[0].end - 1, ranges[1].clone()];
        let refused = block_on(uploader.read_slots(Arc::clone(key), gap));
        assert!(matches!(refused, Err(engine::error::Error::Internal { .. })), "{refused:?}");
        assert!(block_on(uploader.read_slots(Arc::clone(key), vec![])).is_err());

        // One byte of the second slot's records flipped, in a copy of the bundle: a plain
        // read returns it as stored, a slot read refuses it.
        let key = &got.placements[1].key;
        let mut bundle = rt.block_on(store.get(key, ByteRange::All)).expect("bundle").to_vec();
        let range = got.placements[1].range();
        bundle[range.end as usize - 10] ^= 0x01;
        let corrupt: Arc<str> = "elsewhere/corrupt-copy".into();
        rt.block_on(store.put(&corrupt, Bytes::from(bundle), PutCondition::Overwrite))
            .expect("put");
        let plain = block_on(uploader.read(Arc::clone(&corrupt), range.clone())).expect("read");
        assert_ne!(plain, slots[1], "the copy differs");
        let refused = block_on(uploader.read_slots(corrupt, ranges));
        assert!(
            matches!(refused, Err(engine::error::Error::CorruptSlot(_))),
            "a corrupt slot must not read back as one: {refused:?}"
        );

        // A settled object: assembled by the uploader exactly as its layout says, from a
        // slot fetched and from a chunk lent from this thread's memory (as the settler
        // lends a cached chunk), its envelope apart.
        let mut builder = SettledBuilder::new(s, 0);
        for slot in &slots {
            builder.push(slot).expect("contiguous slots");
        }
        let layout = builder.finish().expect("two slots");
        let settled_key = layout.key(BucketName::parse("apps").expect("bucket")).to_string();
        let parts: Vec<SlotParts<'_>> =
            slots.iter().map(|slot| SlotParts::of(slot).expect("whole slots")).collect();
        let expected = layout.assemble(&parts);
        let cached = parts[1];
        let header = Slot::parse(&slots[1]).expect("a slot").chunk.header;
        let chunk: Rc<dyn ChunkSource> = Rc::new(SealedChunk::copy_of(cached.chunk, header));
        let loan = ChunkLoan::new(Rc::clone(&chunk));
        let handed = vec![
            SettledSlot::Fetched(slots[0].clone()),
            SettledSlot::Cached { envelope: *cached.envelope, chunk: loan.lend_bytes() },
        ];
        block_on(uploader.put_settled(settled_key.clone(), layout, handed))
            .expect("settled object written");
        drop(loan);
        assert_eq!(Rc::strong_count(&chunk), 1, "the uploader gave the lent chunk back");
        let stored = rt.block_on(store.get(&settled_key, ByteRange::All)).expect("settled");
        assert_eq!(stored, expected);
        uploader.stop();
    });
}

/// The chunks of `sent`, each with `bucket`: the uploader may write them as a settled
/// object.
fn chunks_in(bucket: &str, sent: &Sent) -> Vec<UploadChunk> {
    let bucket = BucketName::parse(bucket).expect("a valid bucket name");
    chunks_of(sent)
        .into_iter()
        .map(|chunk| UploadChunk { bucket: Some(bucket.clone()), ..chunk })
        .collect()
}

/// Every object's key under `prefix`.
fn keys_under(rt: &tokio::runtime::Runtime, store: &dyn ObjectStore, prefix: &str) -> Vec<String> {
    let page = rt.block_on(store.list(prefix, None, 1000)).expect("list");
    assert!(page.next.is_none(), "one page is all");
    page.objects.into_iter().map(|object| object.key).collect()
}

#[test]
fn one_streams_run_goes_straight_into_its_settled_object() {
    within_stall_limit(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = local_store(dir.path());
        let config = UploaderConfig {
            bundle_bytes_target: 1 << 20,
            bundle_delay: Duration::from_millis(50),
            direct_settle_bytes_min: 64 << 10,
            ..UploaderConfig::default()
        };
        let uploader = Uploader::start(Arc::clone(&store), config.clone(), "").expect("start");
        let rt = runtime();
        let ours = stream(0, 0);
        // Two requests of one stream in one cut, the later records first: one settled
        // object, its slots in sequence order, each request answered in its own order.
        let (early, late): (Sent, Sent) =
            (vec![(ours, 0, 4, 10_000), (ours, 4, 2, 10_000)], vec![(ours, 6, 3, 10_000)]);
        let (got_late, got_early) = block_on(futures_lite::future::zip(
            uploader.upload(chunks_in("apps", &late)),
            uploader.upload(chunks_in("apps", &early)),
        ));
        let (got_late, got_early) = (got_late.expect("uploaded"), got_early.expect("uploaded"));
        check_answer(&rt, store.as_ref(), &early, &got_early);
        check_answer(&rt, store.as_ref(), &late, &got_late);
        let key = Arc::clone(&got_early.placements[0].key);
        assert!(got_late.placements.iter().chain(&got_early.placements).all(|p| p.key == key));
        let parsed = SettledKey::parse(&key).expect("a settled object's key");
        assert_eq!(
            (parsed.bucket.as_str(), parsed.stream_id, parsed.first_seq_num),
            ("apps", ours, 0)
        );
        let whole = rt.block_on(store.get(&key, ByteRange::All)).expect("get");
        let object = SettledObject::parse(&whole).expect("a settled object, whole");
        let firsts: Vec<u64> = object.slots().iter().map(|s| s.envelope.first_seq_num).collect();
        assert_eq!(firsts, [0, 4, 6]);
        assert!(keys_under(&rt, store.as_ref(), "_transit/").is_empty(), "no transit bundle");
        let stats = uploader.stats();
        assert_eq!((stats.settled_direct, stats.bundles, stats.chunks), (1, 0, 3), "{stats:?}");
        assert_eq!(stats.settled_direct_bytes, whole.len() as u64);

        // The same run again (a PUT retried after its answer was lost, as `put_durably`
        // does): its own object, taken.
        let again: Sent = early.iter().chain(&late).copied().collect();
        let got = block_on(uploader.upload(chunks_in("apps", &again))).expect("uploaded");
        check_answer(&rt, store.as_ref(), &again, &got);
        assert!(got.placements.iter().all(|p| p.key == key), "the object it found");
        assert_eq!(uploader.stats().direct_fallbacks, 0);

        // Transit bundles: below the floor, two streams, and chunks without a bucket.
        let small: Sent = vec![(ours, 9, 1, 10)];
        let two: Sent = vec![(ours, 10, 4, 10_000), (stream(0, 1), 0, 4, 10_000)];
        let unnamed: Sent = vec![(ours, 14, 8, 10_000)];
        for (sent, chunks) in [
            (&small, chunks_in("apps", &small)),
            (&two, chunks_in("apps", &two)),
            (&unnamed, chunks_of(&unnamed)),
        ] {
            let got = block_on(uploader.upload(chunks)).expect("uploaded");
            check_answer(&rt, store.as_ref(), sent, &got);
            assert!(got.placements[0].key.starts_with("_transit/"), "{sent:?}");
        }
        assert_eq!(uploader.stats().bundles, 3);
        // An uploader under a key prefix writes only transit bundles, under it (settled
        // keys take no prefix).
        let prefixed = Uploader::start(Arc::clone(&store), config, "cluster-a/").expect("start");
        let run: Sent = vec![(ours, 30, 8, 10_000)];
        let got = block_on(prefixed.upload(chunks_in("apps", &run))).expect("uploaded");
        check_answer(&rt, store.as_ref(), &run, &got);
        assert!(got.placements[0].key.starts_with("cluster-a/_transit/"));
        assert_eq!(prefixed.stats().settled_direct, 0);
        prefixed.stop();

        // Another object under the key the run would take (an orphan of an earlier
        // attempt that laid out differently): the run goes out as a transit bundle, and
        // the other object is left as it was.
        let orphan = SettledKey {
            bucket: BucketName::parse("apps").expect("valid"),
            stream_id: ours,
            first_seq_num: 22,
        }
        .to_string();
        rt.block_on(store.put(&orphan, Bytes::from_static(b"not ours"), PutCondition::CreateOnly))
            .expect("put the orphan");
        let blocked: Sent = vec![(ours, 22, 8, 10_000)];
        let got = block_on(uploader.upload(chunks_in("apps", &blocked))).expect("uploaded");
        check_answer(&rt, store.as_ref(), &blocked, &got);
        assert!(got.placements[0].key.starts_with("_transit/"));
        let stats = uploader.stats();
        assert_eq!((stats.direct_fallbacks, stats.settled_direct, stats.bundles), (1, 2, 4));
        let left = rt.block_on(store.get(&orphan, ByteRange::All)).expect("get");
        assert_eq!(&left[..], b"not ours");
        uploader.stop();
    });
}

#[test]
fn refused_requests_are_answered_with_an_error_and_do_not_disturb_others() {
    within_stall_limit(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = local_store(dir.path());
        let config =
            UploaderConfig { bundle_delay: Duration::from_millis(20), ..UploaderConfig::default() };
        let uploader = Uploader::start(Arc::clone(&store), config, "").expect("start");
        // Two chunks of one stream overlapping by sequence number: the caller's bug.
        let bad: Sent = vec![(stream(0, 0), 0, 3, 10), (stream(0, 0), 2, 1, 10)];
        let error = block_on(uploader.upload(chunks_of(&bad))).expect_err("overlap refused");
        assert_eq!(error.code(), engine::Code::Internal, "{error}");
        assert!(error.to_string().contains("refused by the uploader"), "{error}");
        // Two requests of one stream overlapping each other: the later waits for the next
        // bundle rather than failing (a bundle holds each sequence number once).
        let (a, b): (Sent, Sent) = (vec![(stream(0, 1), 0, 2, 10)], vec![(stream(0, 1), 0, 2, 10)]);
        let (first, second) = std::thread::scope(|scope| {
            let first = scope.spawn(|| block_on(uploader.upload(chunks_of(&a))));
            let second = scope.spawn(|| block_on(uploader.upload(chunks_of(&b))));
            (first.join().expect("first"), second.join().expect("second"))
        });
        let (first, second) = (first.expect("uploaded"), second.expect("uploaded"));
        assert_ne!(first.placements[0].key, second.placements[0].key, "two bundles");
        uploader.stop();
    });
}

#[test]
fn requests_after_stop_are_unavailable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = local_store(dir.path());
    let uploader = Uploader::start(store, UploaderConfig::default(), "").expect("start");
    let other = uploader.clone();
    uploader.stop();
    let error =
        block_on(other.upload(chunks_of(&vec![(stream(0, 0), 0, 1, 1)]))).expect_err("stopped");
    assert_eq!(error.code(), engine::Code::Unavailable, "{error}");
}

#[test]
fn bad_key_prefix_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = local_store(dir.path());
    assert!(Uploader::start(store, UploaderConfig::default(), "/abs//").is_err());
}

/// A store that fails its first puts, delays some, and sometimes writes an object but
/// reports a failure (its answer "lost"); it records which keys are durable.
#[derive(Debug)]
struct FlakyStore {
    inner: Arc<dyn ObjectStore>,
    /// An S3 store at a closed port: the source of genuine retryable errors.
    dead: S3Store,
    puts: AtomicU64,
    fail_first: u64,
    durable: Mutex<HashSet<String>>,
}

impl FlakyStore {
    async fn unavailable(&self, key: &str) -> StoreError {
        let error = self.dead.put(key, Bytes::new(), PutCondition::Overwrite).await;
        error.expect_err("nothing listens at the dead store's port")
    }
}

impl ObjectStore for FlakyStore {
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        condition: PutCondition,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let n = self.puts.fetch_add(1, Ordering::Relaxed);
            if n < self.fail_first {
                return Err(self.unavailable(key).await);
            }
            if n.is_multiple_of(3) {
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            let result = self.inner.put(key, bytes, condition).await;
            if result.is_ok() {
                self.durable.lock().expect("lock").insert(key.to_owned());
                if n.is_multiple_of(5) {
                    return Err(self.unavailable(key).await);
                }
            }
            result
        })
    }

    fn get<'a>(
        &'a self,
        key: &'a str,
        range: ByteRange,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>> {
        self.inner.get(key, range)
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        self.inner.head(key)
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ListPage, StoreError>> {
        self.inner.list(prefix, start_after, limit)
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.delete(key)
    }
}

fn dead_s3_store() -> S3Store {
    // Port 1 on loopback: nothing listens, so every call fails at once, retryably.
    let mut config = S3Config::new("nova-test");
    config.endpoint = Some("http://127.0.0.1:1".into());
    config.region = Some("us-east-1".into());
    config.path_style = true;
    config.credentials = Some(S3Credentials {
        access_key_id: "test".into(),
        secret_access_key: "test".into(),
        session_token: None,
    });
    config.policy = TransferPolicy { attempts_max: 1, ..TransferPolicy::default() };
    S3Store::new(config).expect("an S3 store configures without a server")
}

#[test]
fn failed_lost_and_slow_puts_are_retried_and_nothing_is_answered_early() {
    within_stall_limit(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = runtime();
        let dead = rt.block_on(async { dead_s3_store() });
        let probe = rt.block_on(dead.put("probe", Bytes::new(), PutCondition::Overwrite));
        assert_eq!(probe.expect_err("dead").kind(), ErrorKind::Unavailable);
        let flaky = Arc::new(FlakyStore {
            inner: local_store(dir.path()),
            dead,
            puts: AtomicU64::new(0),
            fail_first: 6,
            durable: Mutex::new(HashSet::new()),
        });
        let store: Arc<dyn ObjectStore> = flaky.clone();
        let config = UploaderConfig {
            bundle_bytes_target: 32 << 10,
            bundle_delay: Duration::from_millis(2),
            uploads_in_flight_max: 3,
            queue_depth: 8,
            backoff_initial: Duration::from_millis(2),
            backoff_max: Duration::from_millis(20),
            ..UploaderConfig::default()
        };
        let uploader = Uploader::start(Arc::clone(&store), config, "").expect("start");
        let answered_early = Arc::new(AtomicU64::new(0));
        let on_answer: Arc<dyn Fn(&Uploaded) + Send + Sync> = {
            let (flaky, early) = (Arc::clone(&flaky), Arc::clone(&answered_early));
            Arc::new(move |got: &Uploaded| {
                let durable = flaky.durable.lock().expect("lock");
                if got.placements.iter().any(|p| !durable.contains(&*p.key)) {
                    early.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let sent = submit_from_threads(&uploader, &store, 4, 30, 2000, on_answer);
        let stats = uploader.stats();
        uploader.stop();
        assert_eq!(answered_early.load(Ordering::Relaxed), 0, "answered before durable");
        let sizes = assert_exactly_once(&rt, store.as_ref(), &sent);
        assert_eq!(stats.bundles, sizes.len() as u64, "one object per bundle, retries too");
        assert!(stats.put_failures >= 6, "{stats:?}");
        assert_eq!(stats.put_attempts, stats.bundles + stats.put_failures);
        assert!(stats.last_put_error.is_some());
        // Every failed PUT landed in the end, so none is failing now.
        assert_eq!((stats.puts_failing, stats.failing_for), (0, None), "{stats:?}");
        assert_eq!(stats.requests, 4 * 30);
    });
}

/// An in-memory store for the soak: the bridge is under test, not the disk.
#[derive(Debug, Default)]
struct MemStore {
    objects: Mutex<HashMap<String, Bytes>>,
}

impl ObjectStore for MemStore {
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        _condition: PutCondition,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let previous = self.objects.lock().expect("lock").insert(key.to_owned(), bytes);
        assert!(previous.is_none(), "a bundle key written twice: {key}");
        Box::pin(async { Ok(()) })
    }

    fn get<'a>(
        &'a self,
        key: &'a str,
        _range: ByteRange,
    ) -> BoxFuture<'a, Result<Bytes, StoreError>> {
        let found = self.objects.lock().expect("lock").get(key).cloned();
        Box::pin(async move { Ok(found.expect("soak reads only what it wrote")) })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<u64>, StoreError>> {
        let found = self.objects.lock().expect("lock").get(key).map(|b| b.len() as u64);
        Box::pin(async move { Ok(found) })
    }

    fn list<'a>(
        &'a self,
        _prefix: &'a str,
        _start_after: Option<&'a str>,
        _limit: usize,
    ) -> BoxFuture<'a, Result<ListPage, StoreError>> {
        Box::pin(async { Ok(ListPage::default()) })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        self.objects.lock().expect("lock").remove(key);
        Box::pin(async { Ok(()) })
    }
}

/// Round trips in the soak: tasks × rounds.
const SOAK_TASKS: usize = 16;
const SOAK_ROUNDS: usize = 2_500;

#[test]
fn soak_of_the_glommio_bridge_fails_on_a_stall() {
    let mem = Arc::new(MemStore::default());
    let store: Arc<dyn ObjectStore> = mem.clone();
    let config = UploaderConfig {
        bundle_bytes_target: 64 << 10,
        bundle_delay: Duration::from_millis(1),
        uploads_in_flight_max: 4,
        queue_depth: 64,
        ..UploaderConfig::default()
    };
    let uploader = Uploader::start(store, config, "").expect("start");
    let (progress, ticks) = flume::bounded::<u64>(1024);
    let shard_uploader = uploader.clone();
    let started = Instant::now();
    // A shard: every task in the executor's default (NotImportant) queue, as the shards'.
    let shard = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name("soak-shard")
        .spawn(move || async move {
            let tasks: Vec<_> = (0..SOAK_TASKS)
                .map(|t| {
                    let (uploader, progress) = (shard_uploader.clone(), progress.clone());
                    glommio::spawn_local(async move {
                        let id = stream(t, 0);
                        for round in 0..SOAK_ROUNDS as u64 {
                            let got = uploader
                                .upload(vec![chunk(id, round, 1, 16).into()])
                                .await
                                .expect("uploaded");
                            assert_eq!(got.placements[0].first_seq_num, round);
                            // The watchdog drains these; a full channel would itself be
                            // a stall it reports.
                            progress.send_async(1).await.expect("watchdog alive");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
        })
        .expect("start the shard executor");
    // The watchdog: every round trip ticks; ten seconds without one is a stall.
    let total = (SOAK_TASKS * SOAK_ROUNDS) as u64;
    let mut done = 0u64;
    while done < total {
        match ticks.recv_timeout(Duration::from_secs(10)) {
            Ok(n) => done += n,
            Err(e) => panic!(
                "round trips stalled after {done} of {total} ({e}); uploader: {:?}",
                uploader.stats()
            ),
        }
    }
    shard.join().expect("the shard finished");
    let elapsed = started.elapsed();
    let stats = uploader.stats();
    uploader.stop();
    assert_eq!(stats.chunks, total);
    assert_eq!(mem.objects.lock().expect("lock").len() as u64, stats.bundles);
    eprintln!(
        "soak: {total} round trips in {elapsed:?} ({:.0}/s), {} bundles, {:.1} chunks per \
         bundle, put p50 {} µs p99 {} µs",
        total as f64 / elapsed.as_secs_f64(),
        stats.bundles,
        stats.chunks as f64 / stats.bundles as f64,
        stats.put_latency_us_p50,
        stats.put_latency_us_p99,
    );
}
