//! Tests of the control plane through the embedded metadata store: every verb, the
//! creation-token and copy-at-create rules, races between creates and between creates and
//! bucket deletion (both with threads and with hooks that force an interleaving), paging,
//! corruption, and reopening.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Instant;

use super::rows::{BucketRow, BucketState, DeletedRow, StreamRow};
use super::*;
use crate::error::Code;
use crate::meta::{RedbMetaOptions, RedbMetaStore, ScanPage, Versioned, Write};
use crate::options::{BATCH_MAX_DELAY_MS_DEFAULT, ProducerPolicy, StorageClass, TimestampingMode};

/// The test clock's time at start.
const START_MS: u64 = 1_700_000_000_000;

use crate::test_support::{STALL_LIMIT, block_on};

/// IDs in a scripted order, then distinct IDs from a counter.
#[derive(Default)]
struct ScriptedIds {
    script: Mutex<VecDeque<[u8; 16]>>,
    drawn: AtomicU64,
}

impl ScriptedIds {
    fn push(&self, id: [u8; 16]) {
        self.script.lock().unwrap().push_back(id);
    }
}

impl IdSource for ScriptedIds {
    fn next_id(&self) -> Result<[u8; 16]> {
        let count = self.drawn.fetch_add(1, Ordering::SeqCst);
        if let Some(id) = self.script.lock().unwrap().pop_front() {
            return Ok(id);
        }
        let mut id = [0xc0; 16];
        id[8..].copy_from_slice(&count.to_be_bytes());
        Ok(id)
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    store: RedbMetaStore,
    control: ControlPlane<RedbMetaStore>,
    now: Arc<AtomicU64>,
    ids: Arc<ScriptedIds>,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir);
        let now = Arc::new(AtomicU64::new(START_MS));
        let ids = Arc::new(ScriptedIds::default());
        let control = plane(store.clone(), &now, &ids);
        Self { dir, store, control, now, ids }
    }

    fn advance(&self, ms: u64) -> u64 {
        self.now.fetch_add(ms, Ordering::SeqCst) + ms
    }

    /// Every key under `prefix`, in order.
    fn keys_under(&self, prefix: &[u8]) -> Vec<Vec<u8>> {
        scan_all(&self.store, prefix).into_iter().map(|(key, _)| key).collect()
    }
}

fn open(dir: &tempfile::TempDir) -> RedbMetaStore {
    RedbMetaStore::open(dir.path().join("meta"), RedbMetaOptions::default()).unwrap()
}

fn plane<S: MetaStore>(store: S, now: &Arc<AtomicU64>, ids: &Arc<ScriptedIds>) -> ControlPlane<S> {
    let now = Arc::clone(now);
    ControlPlane::with_seams(store, Arc::new(move || now.load(Ordering::SeqCst)), ids.clone())
}

fn scan_all<S: MetaStore>(store: &S, prefix: &[u8]) -> Vec<(Vec<u8>, Versioned)> {
    const PAGES_MAX: usize = 10_000;
    let mut rows = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    for _ in 0..PAGES_MAX {
        let page: ScanPage = block_on(store.scan(prefix, after.as_deref(), 1000)).unwrap();
        after = page.entries.last().map(|(key, _)| key.clone());
        rows.extend(page.entries);
        if !page.more {
            return rows;
        }
    }
    panic!("more than {PAGES_MAX} pages under {prefix:?}");
}

fn bucket(name: &str) -> BucketName {
    BucketName::parse(name).unwrap()
}

fn key(text: &str) -> StreamKey {
    StreamKey::parse(text).unwrap()
}

fn none() -> BucketConfigRequest {
    BucketConfigRequest::default()
}

fn autocreating() -> BucketConfigRequest {
    BucketConfigRequest {
        create_stream_on_append: true,
        create_stream_on_read: true,
        ..Default::default()
    }
}

fn no_overrides() -> StreamOptionsRequest {
    StreamOptionsRequest::default()
}

fn with_delay(batch_max_delay_ms: u64) -> StreamOptionsRequest {
    StreamOptionsRequest { batch_max_delay_ms, ..Default::default() }
}

fn new_bucket<S: MetaStore>(control: &ControlPlane<S>, name: &str, request: &BucketConfigRequest) {
    let created = block_on(control.create_bucket(&bucket(name), request, None)).unwrap();
    assert!(created.created);
}

fn new_stream<S: MetaStore>(control: &ControlPlane<S>, name: &str, stream: &str) -> StreamRecord {
    let created =
        block_on(control.create_stream(&bucket(name), &key(stream), &no_overrides(), None))
            .unwrap();
    assert!(created.created);
    created.record
}

fn code<T: std::fmt::Debug>(result: Result<T>) -> Code {
    result.expect_err("an error").code()
}

fn bucket_row(store: &RedbMetaStore, name: &str) -> Option<(BucketRow, Revision)> {
    block_on(store.get(&keys::bucket(&bucket(name))))
        .unwrap()
        .map(|found| (BucketRow::decode(&found.value).unwrap(), found.version))
}

// ---- Futures and seams ----------------------------------------------------------------------

#[test]
fn futures_are_send_and_the_plane_is_shareable() {
    fn send<T: Send>(_: &T) {}
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<ControlPlane<RedbMetaStore>>();
    let fixture = Fixture::new();
    let control = &fixture.control;
    let (apps, orders) = (bucket("apps"), key("orders"));
    send(&control.create_bucket(&apps, &none(), None));
    send(&control.ensure_bucket(&apps, &none()));
    send(&control.get_bucket(&apps));
    send(&control.update_bucket(&apps, &none()));
    send(&control.delete_bucket(&apps));
    send(&control.list_buckets(None, None));
    send(&control.create_stream(&apps, &orders, &no_overrides(), None));
    send(&control.resolve(&apps, &orders, Door::Append));
    send(&control.get_stream(&apps, &orders));
    send(&control.stream_by_id(StreamId::default()));
    send(&control.reconfigure_stream(&apps, &orders, &StreamOptionsPatch::default()));
    send(&control.delete_stream(&apps, &orders, None));
    send(&control.list_streams(&apps, "", None, None));
    send(&control.set_fencing_token(StreamId::default(), None, "t"));
    send(&control.set_trim_seq_num(StreamId::default(), 1, 0));
}

#[test]
fn os_random_ids_differ() {
    let first = OsRandom.next_id().unwrap();
    let second = OsRandom.next_id().unwrap();
    assert_ne!(first, second);
    let now = SystemClock.now_ms();
    assert!(now > START_MS, "the system clock reads {now}");
}

// ---- Buckets -----------------------------------------------------------------------------

#[test]
fn create_then_get_bucket_returns_every_default_concrete() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let created = block_on(control.create_bucket(&bucket("apps"), &none(), None)).unwrap();
    assert!(created.created);
    let expected = BucketRecord {
        name: bucket("apps"),
        config: BucketConfig::default(),
        created_at_ms: START_MS,
    };
    assert_eq!(created.record, expected);
    assert_eq!(block_on(control.get_bucket(&bucket("apps"))).unwrap(), expected);
    assert_eq!(created.record.config.defaults, StreamOptions::default());

    let request = BucketConfigRequest {
        location: "eu-west".into(),
        create_stream_on_append: true,
        create_stream_on_read: false,
        defaults: StreamOptionsRequest {
            class: Some(StorageClass::Express),
            retention_max_age_ms: 60_000,
            ..Default::default()
        },
    };
    fixture.advance(5);
    let record = block_on(control.create_bucket(&bucket("logs"), &request, None)).unwrap().record;
    assert_eq!(record.created_at_ms, START_MS + 5);
    assert_eq!(record.config, BucketConfig::from_request(&request).unwrap());
    assert_eq!(record.config.defaults.class, StorageClass::Express);
    assert_eq!(record.config.defaults.batch_max_delay_ms, BATCH_MAX_DELAY_MS_DEFAULT);
    assert_eq!(block_on(control.get_bucket(&bucket("logs"))).unwrap(), record);

    assert_eq!(
        block_on(control.get_bucket(&bucket("nope"))),
        Err(Error::BucketNotFound { bucket: "nope".into() })
    );
}

#[test]
fn a_taken_bucket_name_is_already_exists_unless_the_token_and_request_match() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let apps = bucket("apps");
    let request = autocreating();
    let first = block_on(control.create_bucket(&apps, &request, Some("token-1"))).unwrap();
    assert!(first.created);
    fixture.advance(10);

    let again = block_on(control.create_bucket(&apps, &request, Some("token-1"))).unwrap();
    assert_eq!(again, Created { record: first.record.clone(), created: false });

    let exists = Error::BucketAlreadyExists { bucket: "apps".into() };
    assert_eq!(
        block_on(control.create_bucket(&apps, &none(), Some("token-1"))),
        Err(exists.clone())
    );
    assert_eq!(
        block_on(control.create_bucket(&apps, &request, Some("token-2"))),
        Err(exists.clone())
    );
    assert_eq!(block_on(control.create_bucket(&apps, &request, None)), Err(exists.clone()));
    // An empty token is no token.
    assert_eq!(block_on(control.create_bucket(&apps, &request, Some(""))), Err(exists.clone()));
    // A bucket created without a token never converges.
    new_bucket(control, "logs", &none());
    assert_eq!(
        block_on(control.create_bucket(&bucket("logs"), &none(), Some("token-1"))),
        Err(Error::BucketAlreadyExists { bucket: "logs".into() })
    );
    // The token converges on the request, not on the configuration now in force.
    block_on(control.update_bucket(&apps, &none())).unwrap();
    let after_update = block_on(control.create_bucket(&apps, &request, Some("token-1"))).unwrap();
    assert!(!after_update.created);
    assert_eq!(after_update.record.config, BucketConfig::default());

    let long = "t".repeat(65);
    assert_eq!(
        block_on(control.create_bucket(&bucket("other"), &none(), Some(&long))),
        Err(Error::CreationTokenTooLong { len: 65, limit: 64 })
    );
    let at_limit = "t".repeat(64);
    assert!(block_on(control.create_bucket(&bucket("other"), &none(), Some(&at_limit))).is_ok());
}

#[test]
fn ensure_bucket_creates_once_and_then_joins() {
    const THREADS: usize = 16;
    let fixture = Fixture::new();
    let start = Arc::new(Barrier::new(THREADS));
    let racers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (control, start) = (fixture.control.clone(), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                block_on(control.ensure_bucket(&bucket("default"), &autocreating())).unwrap()
            })
        })
        .collect();
    let outcomes: Vec<_> = racers.into_iter().map(|racer| racer.join().unwrap()).collect();
    assert_eq!(outcomes.iter().filter(|outcome| outcome.created).count(), 1);
    assert!(outcomes.iter().all(|outcome| outcome.record == outcomes[0].record));
    // Joining ignores the requested configuration: the bucket is returned as it is.
    let joined = block_on(fixture.control.ensure_bucket(&bucket("default"), &none())).unwrap();
    assert!(!joined.created);
    assert!(joined.record.config.create_stream_on_append);
}

#[test]
fn update_bucket_replaces_the_config_and_its_flags_act_at_once() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let apps = bucket("apps");
    let request = BucketConfigRequest {
        location: "rack-1".into(),
        defaults: with_delay(5),
        ..Default::default()
    };
    new_bucket(control, "apps", &request);
    assert_eq!(code(block_on(control.resolve(&apps, &key("a"), Door::Append))), Code::NotFound);
    let update = BucketConfigRequest { create_stream_on_append: true, ..Default::default() };
    fixture.advance(100);
    let updated = block_on(control.update_bucket(&apps, &update)).unwrap();
    // Omitted defaults take the domain default, not the previous value; the creation time
    // stays.
    assert_eq!(updated.config, BucketConfig::from_request(&update).unwrap());
    assert_eq!(updated.config.defaults.batch_max_delay_ms, BATCH_MAX_DELAY_MS_DEFAULT);
    assert_eq!(updated.config.location, "");
    assert_eq!(updated.created_at_ms, START_MS);
    assert_eq!(block_on(control.get_bucket(&apps)).unwrap(), updated);
    let resolved = block_on(control.resolve(&apps, &key("a"), Door::Append)).unwrap();
    assert!(resolved.created);

    // The same config again writes nothing.
    let (_, version) = bucket_row(&fixture.store, "apps").unwrap();
    block_on(control.update_bucket(&apps, &update)).unwrap();
    assert_eq!(bucket_row(&fixture.store, "apps").unwrap().1, version);

    assert_eq!(
        block_on(control.update_bucket(&bucket("nope"), &update)),
        Err(Error::BucketNotFound { bucket: "nope".into() })
    );
}

#[test]
fn uncapped_with_age_retention_is_refused_everywhere() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let refused_defaults = BucketConfigRequest {
        defaults: StreamOptionsRequest {
            timestamping_uncapped: true,
            retention_max_age_ms: 60_000,
            ..Default::default()
        },
        ..Default::default()
    };
    let default_fields = Error::UncappedWithAgeRetention {
        uncapped_field: "default_timestamping_uncapped",
        age_field: "default_retention_max_age_ms",
        retention_max_age_ms: 60_000,
        from_bucket: None,
    };
    assert_eq!(
        block_on(control.create_bucket(&bucket("apps"), &refused_defaults, None)),
        Err(default_fields.clone())
    );
    assert_eq!(
        block_on(control.ensure_bucket(&bucket("apps"), &refused_defaults)),
        Err(default_fields.clone())
    );
    assert!(fixture.keys_under(b"").is_empty(), "a refused create writes nothing");

    // Bucket with age retention by default: a create asking for uncapped is refused.
    let aged = BucketConfigRequest {
        defaults: StreamOptionsRequest { retention_max_age_ms: 60_000, ..Default::default() },
        ..Default::default()
    };
    new_bucket(control, "aged", &aged);
    assert_eq!(
        block_on(control.update_bucket(&bucket("aged"), &refused_defaults)),
        Err(default_fields)
    );
    let stream_fields = |age, from_bucket| Error::UncappedWithAgeRetention {
        uncapped_field: "timestamping_uncapped",
        age_field: "retention_max_age_ms",
        retention_max_age_ms: age,
        from_bucket,
    };
    let uncapped = StreamOptionsRequest { timestamping_uncapped: true, ..Default::default() };
    assert_eq!(
        block_on(control.create_stream(&bucket("aged"), &key("s"), &uncapped, None)),
        Err(stream_fields(60_000, Some("default_retention_max_age_ms")))
    );

    // Bucket with uncapped streams by default: a create asking for age retention is
    // refused, and so is a reconfigure that adds it.
    let uncapped_bucket = BucketConfigRequest { defaults: uncapped, ..Default::default() };
    new_bucket(control, "raw", &uncapped_bucket);
    let aging = StreamOptionsRequest { retention_max_age_ms: 1_000, ..Default::default() };
    assert_eq!(
        block_on(control.create_stream(&bucket("raw"), &key("s"), &aging, None)),
        Err(stream_fields(1_000, Some("default_timestamping_uncapped")))
    );
    let stream = new_stream(control, "raw", "s");
    assert!(stream.options.timestamping_uncapped);
    let patch = StreamOptionsPatch { retention_max_age_ms: Some(1_000), ..Default::default() };
    assert_eq!(
        block_on(control.reconfigure_stream(&bucket("raw"), &key("s"), &patch)),
        Err(stream_fields(1_000, None))
    );
    assert_eq!(block_on(control.get_stream(&bucket("raw"), &key("s"))).unwrap(), stream);
    assert_eq!(fixture.keys_under(keys::ADDRESSES), vec![keys::address(&bucket("raw"), &key("s"))]);
}

#[test]
fn list_buckets_pages_through_2500_in_name_order() {
    const BUCKETS: usize = 2_500;
    const THREADS: usize = 16;
    let fixture = Fixture::new();
    let names: Vec<String> = (0..BUCKETS).map(|index| format!("b-{index:05}")).collect();
    let started = Instant::now();
    let creators: Vec<_> = (0..THREADS)
        .map(|thread_index| {
            let control = fixture.control.clone();
            let mine: Vec<String> =
                names.iter().skip(thread_index).step_by(THREADS).cloned().collect();
            thread::spawn(move || {
                for name in mine {
                    block_on(control.create_bucket(&bucket(&name), &none(), None)).unwrap();
                }
            })
        })
        .collect();
    creators.into_iter().for_each(|creator| creator.join().unwrap());
    let elapsed = started.elapsed();
    println!(
        "{BUCKETS} buckets from {THREADS} threads in {elapsed:?}: {:.0} creates/s",
        BUCKETS as f64 / elapsed.as_secs_f64()
    );

    let control = &fixture.control;
    for limit in [Some(1000), None, Some(7), Some(500), Some(1)] {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        for page_index in 0..=BUCKETS {
            let page = block_on(control.list_buckets(after.as_deref(), limit)).unwrap();
            let cap = limit.unwrap_or(1000) as usize;
            assert!(page.buckets.len() <= cap);
            seen.extend(page.buckets.iter().map(|record| record.name.as_str().to_owned()));
            match page.next {
                Some(next) => {
                    assert_eq!(page.buckets.len(), cap, "only a full page has a next");
                    assert_eq!(Some(&next), page.buckets.last().map(|record| &record.name));
                    after = Some(next.into_string());
                }
                None => break,
            }
            assert!(page_index < BUCKETS, "paging did not end");
        }
        assert_eq!(seen, names, "limit {limit:?}: every bucket once, in name order");
    }
    // A cursor that names no bucket, and one longer than any name.
    let page = block_on(control.list_buckets(Some("b-01000x"), Some(2))).unwrap();
    let got: Vec<_> = page.buckets.iter().map(|record| record.name.as_str()).collect();
    assert_eq!(got, ["b-01001", "b-01002"]);
    let long = format!("b-01000{}", "z".repeat(200));
    let page = block_on(control.list_buckets(Some(&long), Some(1))).unwrap();
    assert_eq!(page.buckets[0].name.as_str(), "b-01001");
    let page = block_on(control.list_buckets(Some("b-02499"), None)).unwrap();
    assert_eq!(page, BucketPage::default());
    let page = block_on(control.list_buckets(Some(""), Some(1))).unwrap();
    assert_eq!(page.buckets[0].name.as_str(), "b-00000");

    for limit in [0, 1001, u64::MAX] {
        assert_eq!(
            block_on(control.list_buckets(None, Some(limit))),
            Err(Error::ListLimitOutOfRange { limit, max: 1000 })
        );
    }
}

// ---- Creating streams ------------------------------------------------------------------------

#[test]
fn create_stream_copies_the_bucket_defaults_and_applies_the_request() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let defaults = BucketConfigRequest {
        defaults: StreamOptionsRequest {
            class: Some(StorageClass::Express),
            retention_max_age_ms: 3_600_000,
            batch_max_delay_ms: 20,
            ..Default::default()
        },
        ..Default::default()
    };
    new_bucket(control, "apps", &defaults);
    let bucket_defaults = BucketConfig::from_request(&defaults).unwrap().defaults;
    fixture.advance(7);

    let plain = new_stream(control, "apps", "plain");
    assert_eq!(plain.options, bucket_defaults);
    assert_eq!(plain.created_at_ms, START_MS + 7);
    assert_eq!((plain.bucket.as_str(), plain.key.as_str()), ("apps", "plain"));
    assert_eq!((plain.fencing_token.as_str(), plain.trim_seq_num, plain.leader_epoch), ("", 0, 0));
    assert_eq!(plain.deleted_at_ms, None);

    let request = StreamOptionsRequest {
        producer_policy: Some(ProducerPolicy::Fenced),
        timestamping_mode: Some(TimestampingMode::ClientRequire),
        // Zero means unset on create: the bucket's bound stays.
        retention_max_age_ms: 0,
        retention_max_bytes: 1 << 30,
        batch_max_records: 100,
        ..Default::default()
    };
    let created =
        block_on(control.create_stream(&bucket("apps"), &key("tuned"), &request, None)).unwrap();
    assert!(created.created);
    assert_eq!(created.record.options, bucket_defaults.with_request(&request).unwrap());
    assert_eq!(created.record.options.retention_max_age_ms, 3_600_000);
    assert_eq!(created.record.options.producer_policy, ProducerPolicy::Fenced);
    assert_eq!(created.record.options.class, StorageClass::Express);
    assert_eq!(
        block_on(control.get_stream(&bucket("apps"), &key("tuned"))).unwrap(),
        created.record
    );
    assert_eq!(
        block_on(control.stream_by_id(created.record.id)).unwrap(),
        Some(created.record.clone())
    );

    // Out-of-range requests are refused before anything is written.
    let wide = StreamOptionsRequest { batch_max_bytes: 1 << 40, ..Default::default() };
    assert_eq!(
        code(block_on(control.create_stream(&bucket("apps"), &key("wide"), &wide, None))),
        Code::InvalidArgument
    );
    assert_eq!(
        block_on(control.create_stream(&bucket("nope"), &key("s"), &no_overrides(), None)),
        Err(Error::BucketNotFound { bucket: "nope".into() })
    );
    assert_eq!(fixture.keys_under(keys::STREAMS).len(), 2);
}

#[test]
fn a_taken_address_is_already_exists_unless_the_token_and_request_match() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    new_bucket(control, "apps", &none());
    let (apps, orders) = (bucket("apps"), key("orders"));
    let request = with_delay(9);
    let first = block_on(control.create_stream(&apps, &orders, &request, Some("t1"))).unwrap();
    assert!(first.created);
    fixture.advance(10);

    let retried = block_on(control.create_stream(&apps, &orders, &request, Some("t1"))).unwrap();
    assert_eq!(retried, Created { record: first.record.clone(), created: false });

    let exists = Error::StreamAlreadyExists { bucket: "apps".into(), key: "orders".into() };
    let attempts = [
        (with_delay(10), Some("t1")),
        (no_overrides(), Some("t1")),
        (request, Some("t2")),
        (request, None),
        (request, Some("")),
    ];
    for (other, token) in attempts {
        assert_eq!(
            block_on(control.create_stream(&apps, &orders, &other, token)),
            Err(exists.clone()),
            "{other:?} {token:?}"
        );
    }
    // Converges on the request even after the bucket's defaults changed.
    block_on(control.update_bucket(&apps, &autocreating())).unwrap();
    let after_update =
        block_on(control.create_stream(&apps, &orders, &request, Some("t1"))).unwrap();
    assert_eq!(after_update, Created { record: first.record.clone(), created: false });

    // An autocreated stream carries no token, so a create never converges on it.
    new_bucket(control, "auto", &autocreating());
    block_on(control.resolve(&bucket("auto"), &orders, Door::Append)).unwrap();
    assert_eq!(
        code(block_on(control.create_stream(
            &bucket("auto"),
            &orders,
            &no_overrides(),
            Some("t1")
        ))),
        Code::AlreadyExists
    );

    let long = "x".repeat(65);
    assert_eq!(
        block_on(control.create_stream(&apps, &key("other"), &request, Some(&long))),
        Err(Error::CreationTokenTooLong { len: 65, limit: 64 })
    );
    // The stream is untouched by all of it.
    assert_eq!(block_on(control.get_stream(&apps, &orders)).unwrap(), first.record);
}

/// Runs `create` from `THREADS` threads at once, `ROUNDS` times (a fresh address each),
/// and returns every round's outcomes.
fn race<F>(fixture: &Fixture, create: F) -> Vec<Vec<Result<Created<StreamRecord>>>>
where
    F: Fn(&ControlPlane<RedbMetaStore>, &StreamKey) -> Result<Created<StreamRecord>>
        + Send
        + Sync
        + 'static,
{
    const THREADS: usize = 32;
    const ROUNDS: usize = 3;
    let create = Arc::new(create);
    (0..ROUNDS)
        .map(|round| {
            let stream = key(&format!("race/{round}"));
            let start = Arc::new(Barrier::new(THREADS));
            let racers: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (control, start) = (fixture.control.clone(), Arc::clone(&start));
                    let (create, stream) = (Arc::clone(&create), stream.clone());
                    thread::spawn(move || {
                        start.wait();
                        create(&control, &stream)
                    })
                })
                .collect();
            racers.into_iter().map(|racer| racer.join().unwrap()).collect()
        })
        .collect()
}

#[test]
fn concurrent_creates_of_one_address_make_one_stream() {
    let fixture = Fixture::new();
    new_bucket(&fixture.control, "apps", &none());
    let rounds = race(&fixture, |control, stream| {
        block_on(control.create_stream(&bucket("apps"), stream, &no_overrides(), None))
    });
    for outcomes in rounds {
        let winners: Vec<_> = outcomes.iter().filter_map(|outcome| outcome.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{outcomes:?}");
        assert!(winners[0].created);
        let losers = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Err(Error::StreamAlreadyExists { .. })));
        assert_eq!(losers.count(), outcomes.len() - 1, "{outcomes:?}");
    }
    // Exactly one stream row per address, nothing more.
    assert_eq!(fixture.keys_under(keys::ADDRESSES).len(), 3);
    assert_eq!(fixture.keys_under(keys::STREAMS).len(), 3);
}

#[test]
fn concurrent_creates_with_one_token_converge_on_one_stream() {
    let fixture = Fixture::new();
    new_bucket(&fixture.control, "apps", &none());
    let rounds = race(&fixture, |control, stream| {
        block_on(control.create_stream(&bucket("apps"), stream, &with_delay(3), Some("same")))
    });
    for outcomes in rounds {
        let records: Vec<_> = outcomes.into_iter().map(Result::unwrap).collect();
        assert_eq!(records.iter().filter(|outcome| outcome.created).count(), 1);
        assert!(records.iter().all(|outcome| outcome.record.id == records[0].record.id));
    }
    assert_eq!(fixture.keys_under(keys::STREAMS).len(), 3);
}

#[test]
fn concurrent_autocreates_of_one_address_all_join_one_stream() {
    for door in [Door::Append, Door::Read] {
        let fixture = Fixture::new();
        new_bucket(&fixture.control, "apps", &autocreating());
        let rounds = race(&fixture, move |control, stream| {
            block_on(control.resolve(&bucket("apps"), stream, door))
        });
        for outcomes in rounds {
            let records: Vec<_> = outcomes.into_iter().map(Result::unwrap).collect();
            assert_eq!(records.iter().filter(|outcome| outcome.created).count(), 1, "{door:?}");
            assert!(records.iter().all(|outcome| outcome.record == records[0].record));
        }
        assert_eq!(fixture.keys_under(keys::STREAMS).len(), 3, "{door:?}");
    }
}

#[test]
fn a_drawn_id_that_exists_is_retried_and_never_reused() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let (first_id, second_id, third_id) = ([1u8; 16], [2u8; 16], [3u8; 16]);
    fixture.ids.push([0xbb; 16]); // the bucket's
    new_bucket(control, "apps", &none());
    fixture.ids.push(first_id);
    let first = new_stream(control, "apps", "one");
    assert_eq!(first.id, StreamId(first_id));
    // The next create draws the same ID first: the transaction's absence check refuses it
    // and the create draws again.
    fixture.ids.push(first_id);
    fixture.ids.push(second_id);
    let second = new_stream(control, "apps", "two");
    assert_eq!(second.id, StreamId(second_id));
    assert!(fixture.ids.script.lock().unwrap().is_empty(), "both scripted IDs were drawn");

    // Delete and recreate at the same address, drawing the deleted stream's ID first: the
    // tombstone keeps the ID taken.
    block_on(control.delete_stream(&bucket("apps"), &key("one"), None)).unwrap();
    fixture.ids.push(first_id);
    fixture.ids.push(third_id);
    let again = new_stream(control, "apps", "one");
    assert_eq!(again.id, StreamId(third_id));
    let old = block_on(control.stream_by_id(StreamId(first_id))).unwrap().unwrap();
    assert!(old.deleted_at_ms.is_some());
}

// ---- Copy-at-create and autocreate -----------------------------------------------------------

#[test]
fn updating_the_defaults_leaves_existing_streams_alone() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let apps = bucket("apps");
    let first_defaults = BucketConfigRequest {
        create_stream_on_append: true,
        defaults: StreamOptionsRequest {
            class: Some(StorageClass::Express),
            batch_max_delay_ms: 10,
            ..Default::default()
        },
        ..Default::default()
    };
    new_bucket(control, "apps", &first_defaults);
    let explicit = new_stream(control, "apps", "explicit");
    let auto = block_on(control.resolve(&apps, &key("auto"), Door::Append)).unwrap().record;
    // Two doors, no overrides: indistinguishable options.
    assert_eq!(explicit.options, auto.options);
    assert_eq!(explicit.options.class, StorageClass::Express);

    let second_defaults = BucketConfigRequest {
        create_stream_on_append: true,
        defaults: StreamOptionsRequest {
            producer_policy: Some(ProducerPolicy::Fenced),
            retention_max_bytes: 1 << 20,
            ..Default::default()
        },
        ..Default::default()
    };
    block_on(control.update_bucket(&apps, &second_defaults)).unwrap();
    assert_eq!(block_on(control.get_stream(&apps, &key("explicit"))).unwrap(), explicit);
    assert_eq!(block_on(control.get_stream(&apps, &key("auto"))).unwrap(), auto);

    let new_defaults = BucketConfig::from_request(&second_defaults).unwrap().defaults;
    let later = new_stream(control, "apps", "later");
    assert_eq!(later.options, new_defaults);
    assert_eq!(later.options.class, StorageClass::Standard);
    let later_auto = block_on(control.resolve(&apps, &key("later-auto"), Door::Append)).unwrap();
    assert_eq!(later_auto.record.options, new_defaults);
}

#[test]
fn doors_create_only_where_the_bucket_allows_and_observers_never_create() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let on_append = BucketConfigRequest { create_stream_on_append: true, ..Default::default() };
    let on_read = BucketConfigRequest { create_stream_on_read: true, ..Default::default() };
    new_bucket(control, "append-only", &on_append);
    new_bucket(control, "read-only", &on_read);
    new_bucket(control, "both", &autocreating());
    new_bucket(control, "neither", &none());
    let missing = key("missing");
    let not_found =
        |name: &str| Error::StreamNotFound { bucket: name.into(), key: "missing".into() };

    for name in ["append-only", "read-only", "both", "neither"] {
        let target = bucket(name);
        assert_eq!(
            block_on(control.resolve(&target, &missing, Door::Observe)),
            Err(not_found(name))
        );
        assert_eq!(block_on(control.get_stream(&target, &missing)), Err(not_found(name)));
        assert_eq!(
            block_on(control.reconfigure_stream(&target, &missing, &StreamOptionsPatch::default())),
            Err(not_found(name))
        );
    }
    assert!(fixture.keys_under(keys::ADDRESSES).is_empty(), "observing created a stream");
    assert!(fixture.keys_under(keys::STREAMS).is_empty(), "observing created a stream");

    assert_eq!(
        block_on(control.resolve(&bucket("read-only"), &missing, Door::Append)),
        Err(not_found("read-only"))
    );
    assert_eq!(
        block_on(control.resolve(&bucket("append-only"), &missing, Door::Read)),
        Err(not_found("append-only"))
    );
    for door in [Door::Append, Door::Read] {
        assert_eq!(
            block_on(control.resolve(&bucket("neither"), &missing, door)),
            Err(not_found("neither"))
        );
    }
    let appended =
        block_on(control.resolve(&bucket("append-only"), &missing, Door::Append)).unwrap();
    assert!(appended.created);
    let read = block_on(control.resolve(&bucket("read-only"), &missing, Door::Read)).unwrap();
    assert!(read.created);
    // Once created, every door finds the stream and none creates again.
    for door in [Door::Append, Door::Read, Door::Observe] {
        let found = block_on(control.resolve(&bucket("append-only"), &missing, door)).unwrap();
        assert_eq!(found, Created { record: appended.record.clone(), created: false });
    }
    // Autocreate creates streams, never buckets.
    assert_eq!(
        block_on(control.resolve(&bucket("nope"), &missing, Door::Append)),
        Err(Error::BucketNotFound { bucket: "nope".into() })
    );
    assert_eq!(
        block_on(control.get_stream(&bucket("nope"), &missing)),
        Err(Error::BucketNotFound { bucket: "nope".into() })
    );
    assert!(bucket_row(&fixture.store, "nope").is_none());
}

// ---- Reconfigure and stream state -------------------------------------------------------------

#[test]
fn reconfigure_sets_present_fields_and_refuses_immutables() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let (apps, orders) = (bucket("apps"), key("orders"));
    new_bucket(control, "apps", &none());
    let request = StreamOptionsRequest {
        retention_max_age_ms: 60_000,
        throughput_max_bytes_per_second: 1 << 20,
        ..Default::default()
    };
    let created = block_on(control.create_stream(&apps, &orders, &request, None)).unwrap().record;

    let patch = StreamOptionsPatch {
        class: Some(StorageClass::Express),
        retention_max_age_ms: Some(0),
        throughput_max_bytes_per_second: Some(0),
        batch_max_records: Some(10),
        ..Default::default()
    };
    let patched = block_on(control.reconfigure_stream(&apps, &orders, &patch)).unwrap();
    assert_eq!(patched.options, created.options.with_patch(&patch).unwrap());
    assert_eq!(patched.options.retention_max_age_ms, 0, "a present 0 is unbounded");
    assert_eq!(patched.options.throughput_max_bytes_per_second, 0);
    assert_eq!(patched.options.class, StorageClass::Express);
    assert_eq!((patched.id, patched.created_at_ms), (created.id, created.created_at_ms));
    assert!(patched.version > created.version);
    assert_eq!(block_on(control.get_stream(&apps, &orders)).unwrap(), patched);

    let immutable = StreamOptionsPatch {
        timestamping_mode: Some(TimestampingMode::Arrival),
        class: Some(StorageClass::Standard),
        ..Default::default()
    };
    assert_eq!(
        block_on(control.reconfigure_stream(&apps, &orders, &immutable)),
        Err(Error::OptionImmutable { field: "timestamping_mode" })
    );
    // Nothing changed, and an empty patch writes nothing.
    let same = block_on(control.reconfigure_stream(&apps, &orders, &StreamOptionsPatch::default()))
        .unwrap();
    assert_eq!(same, patched);
    assert_eq!(
        block_on(control.reconfigure_stream(&bucket("nope"), &orders, &patch)),
        Err(Error::BucketNotFound { bucket: "nope".into() })
    );
}

#[test]
fn fencing_token_and_trim_watermark() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    new_bucket(control, "apps", &none());
    let stream = new_stream(control, "apps", "orders");
    let id = stream.id;

    let fenced = block_on(control.set_fencing_token(id, None, "writer-1")).unwrap();
    assert_eq!(fenced.fencing_token, "writer-1");
    assert_eq!(
        block_on(control.set_fencing_token(id, Some("wrong"), "writer-2")),
        Err(Error::FencingTokenMismatch { field: "expected", current: "writer-1".into() })
    );
    let refenced = block_on(control.set_fencing_token(id, Some("writer-1"), "writer-2")).unwrap();
    assert_eq!(refenced.fencing_token, "writer-2");
    // An explicit empty expected token matches a token never set.
    let other = new_stream(control, "apps", "other");
    assert_eq!(
        block_on(control.set_fencing_token(other.id, Some(""), "first")).unwrap().fencing_token,
        "first"
    );
    assert_eq!(
        block_on(control.set_fencing_token(id, None, &"t".repeat(37))),
        Err(Error::FencingTokenTooLong { field: "fencing_token", len: 37, limit: 36 })
    );
    // An expected token over the limit is refused as such, before any comparison.
    assert_eq!(
        block_on(control.set_fencing_token(id, Some(&"t".repeat(37)), "writer-3")),
        Err(Error::FencingTokenTooLong { field: "expected", len: 37, limit: 36 })
    );
    assert!(block_on(control.set_fencing_token(id, None, &"t".repeat(36))).is_ok());

    let trimmed = block_on(control.set_trim_seq_num(id, 100, 5_000)).unwrap();
    assert_eq!((trimmed.trim_seq_num, trimmed.trim_timestamp), (100, 5_000));
    // Only forward: a lower value leaves the watermark, and writes nothing.
    let kept = block_on(control.set_trim_seq_num(id, 50, 9_000)).unwrap();
    assert_eq!(
        (kept.trim_seq_num, kept.trim_timestamp, kept.version),
        (100, 5_000, trimmed.version)
    );
    // The timestamp never goes back either.
    let moved = block_on(control.set_trim_seq_num(id, 101, 4_000)).unwrap();
    assert_eq!((moved.trim_seq_num, moved.trim_timestamp), (101, 5_000));
    let got = block_on(control.get_stream(&bucket("apps"), &key("orders"))).unwrap();
    assert_eq!((got.trim_seq_num, got.fencing_token.len()), (101, 36));

    let unknown = StreamId([0xee; 16]);
    assert_eq!(
        block_on(control.set_trim_seq_num(unknown, 1, 0)),
        Err(Error::StreamIdNotFound { id: unknown })
    );
    assert_eq!(block_on(control.stream_by_id(unknown)), Ok(None));
    block_on(control.delete_stream(&bucket("apps"), &key("orders"), None)).unwrap();
    let gone = Error::StreamNotFound { bucket: "apps".into(), key: "orders".into() };
    assert_eq!(block_on(control.set_trim_seq_num(id, 200, 0)), Err(gone.clone()));
    assert_eq!(block_on(control.set_fencing_token(id, None, "x")), Err(gone));
}

// ---- Deleting streams ---------------------------------------------------------------------------

#[test]
fn delete_and_recreate_yields_a_fresh_stream_and_tombstones_the_old_one() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let (apps, orders) = (bucket("apps"), key("orders"));
    new_bucket(control, "apps", &none());
    let old = new_stream(control, "apps", "orders");
    block_on(control.set_fencing_token(old.id, None, "writer")).unwrap();
    block_on(control.set_trim_seq_num(old.id, 42, 0)).unwrap();

    let deleted_at = fixture.advance(1_000);
    let deleted = block_on(control.delete_stream(&apps, &orders, None)).unwrap();
    assert_eq!(deleted, Deleted { id: old.id, already: false });
    let not_found = Error::StreamNotFound { bucket: "apps".into(), key: "orders".into() };
    assert_eq!(block_on(control.get_stream(&apps, &orders)), Err(not_found.clone()));
    assert_eq!(
        block_on(control.list_streams(&apps, "", None, None)).unwrap(),
        StreamPage::default()
    );
    let tombstone = block_on(control.stream_by_id(old.id)).unwrap().unwrap();
    assert_eq!(tombstone.deleted_at_ms, Some(deleted_at));
    assert_eq!((tombstone.trim_seq_num, tombstone.fencing_token.as_str()), (42, "writer"));
    assert!(fixture.keys_under(keys::ADDRESSES).is_empty());

    fixture.advance(1);
    let fresh = new_stream(control, "apps", "orders");
    assert_ne!(fresh.id, old.id);
    assert_eq!((fresh.trim_seq_num, fresh.fencing_token.as_str()), (0, ""));
    assert_eq!(fresh.deleted_at_ms, None);
    assert_eq!(block_on(control.get_stream(&apps, &orders)).unwrap(), fresh);
    // The old ID's row is still a tombstone; the new stream cleared the marker.
    assert!(block_on(control.stream_by_id(old.id)).unwrap().unwrap().deleted_at_ms.is_some());
    assert!(fixture.keys_under(keys::DELETED).is_empty());
    assert_eq!(fixture.keys_under(keys::STREAMS).len(), 2);
}

#[test]
fn deleting_twice_succeeds_and_never_existed_is_not_found() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let (apps, orders) = (bucket("apps"), key("orders"));
    new_bucket(control, "apps", &none());
    let stream = new_stream(control, "apps", "orders");
    assert_eq!(
        block_on(control.delete_stream(&apps, &orders, None)).unwrap(),
        Deleted { id: stream.id, already: false }
    );
    for _ in 0..2 {
        assert_eq!(
            block_on(control.delete_stream(&apps, &orders, None)).unwrap(),
            Deleted { id: stream.id, already: true }
        );
    }
    assert_eq!(
        block_on(control.delete_stream(&apps, &key("never"), None)),
        Err(Error::StreamNotFound { bucket: "apps".into(), key: "never".into() })
    );
    // Keys are opaque: a deleted "orders" says nothing of "orders/".
    assert_eq!(code(block_on(control.delete_stream(&apps, &key("orders/"), None))), Code::NotFound);
    assert_eq!(
        block_on(control.delete_stream(&bucket("nope"), &orders, None)),
        Err(Error::BucketNotFound { bucket: "nope".into() })
    );
}

#[test]
fn delete_by_id_deletes_only_the_fenced_stream() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let (apps, orders) = (bucket("apps"), key("orders"));
    new_bucket(control, "apps", &none());
    let first = new_stream(control, "apps", "orders");
    assert_eq!(
        block_on(control.delete_stream(&apps, &orders, Some(first.id))).unwrap(),
        Deleted { id: first.id, already: false }
    );
    let second = new_stream(control, "apps", "orders");
    // A leader that fenced the first stream deletes it again: success, and the second
    // stream at the same address is untouched.
    assert_eq!(
        block_on(control.delete_stream(&apps, &orders, Some(first.id))).unwrap(),
        Deleted { id: first.id, already: true }
    );
    assert_eq!(block_on(control.get_stream(&apps, &orders)).unwrap(), second);
    let unknown = StreamId([0xef; 16]);
    assert_eq!(
        block_on(control.delete_stream(&apps, &orders, Some(unknown))),
        Err(Error::StreamIdNotFound { id: unknown })
    );
    assert_eq!(
        code(block_on(control.delete_stream(&apps, &key("elsewhere"), Some(second.id)))),
        Code::Internal
    );
    assert_eq!(block_on(control.get_stream(&apps, &orders)).unwrap(), second);
}

#[test]
fn a_fence_between_reading_and_deleting_makes_the_delete_read_again() {
    let fixture = Fixture::new();
    let hooked = Hooked::new(fixture.store.clone());
    let control = plane(hooked.clone(), &fixture.now, &fixture.ids);
    new_bucket(&control, "apps", &none());
    let stream = new_stream(&control, "apps", "orders");
    let unhooked = fixture.control.clone();
    hooked.on(
        move |op| matches!(op, Op::Commit(txn) if deletes(txn, &keys::address(&bucket("apps"), &key("orders")))),
        move || {
            block_on(unhooked.set_fencing_token(stream.id, None, "late")).unwrap();
        },
    );
    let deleted = block_on(control.delete_stream(&bucket("apps"), &key("orders"), None)).unwrap();
    assert_eq!(deleted, Deleted { id: stream.id, already: false });
    assert_eq!(hooked.pending(), 0);
    let tombstone = block_on(control.stream_by_id(stream.id)).unwrap().unwrap();
    assert_eq!(tombstone.fencing_token, "late", "the tombstone is of the row as fenced");
    assert!(tombstone.deleted_at_ms.is_some());
}

// ---- Listing streams -------------------------------------------------------------------------

#[test]
fn list_streams_pages_through_2500_in_key_order() {
    const STREAMS: usize = 2_500;
    const THREADS: usize = 16;
    let fixture = Fixture::new();
    new_bucket(&fixture.control, "apps", &none());
    new_bucket(&fixture.control, "apps2", &none());
    // Keys that sort differently as numbers and as bytes.
    let keys: Vec<String> = (0..STREAMS).map(|index| format!("k/{index}")).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    let started = Instant::now();
    let creators: Vec<_> = (0..THREADS)
        .map(|thread_index| {
            let control = fixture.control.clone();
            let mine: Vec<String> =
                keys.iter().skip(thread_index).step_by(THREADS).cloned().collect();
            thread::spawn(move || {
                for stream in mine {
                    block_on(control.create_stream(
                        &bucket("apps"),
                        &key(&stream),
                        &no_overrides(),
                        None,
                    ))
                    .unwrap();
                }
            })
        })
        .collect();
    creators.into_iter().for_each(|creator| creator.join().unwrap());
    let elapsed = started.elapsed();
    println!(
        "{STREAMS} streams in one bucket from {THREADS} threads in {elapsed:?}: {:.0} creates/s",
        STREAMS as f64 / elapsed.as_secs_f64()
    );
    // A neighbour bucket's streams never show.
    for stream in ["k/0", "k/1", "a", "z"] {
        new_stream(&fixture.control, "apps2", stream);
    }

    let control = &fixture.control;
    let mut ids = BTreeSet::new();
    for limit in [None, Some(333), Some(1000), Some(2500 / 5)] {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        for page_index in 0..=STREAMS {
            let page = block_on(control.list_streams(&bucket("apps"), "", after.as_deref(), limit))
                .unwrap();
            let cap = limit.unwrap_or(1000) as usize;
            assert!(page.streams.len() <= cap);
            for record in &page.streams {
                assert_eq!(record.bucket.as_str(), "apps");
                ids.insert(record.id);
                seen.push(record.key.as_str().to_owned());
            }
            match page.next {
                Some(next) => {
                    assert_eq!(page.streams.len(), cap);
                    assert_eq!(Some(&next), page.streams.last().map(|record| &record.key));
                    after = Some(next.into_string());
                }
                None => break,
            }
            assert!(page_index < STREAMS, "paging did not end");
        }
        assert_eq!(seen, sorted, "limit {limit:?}: every stream once, in key order");
    }
    assert_eq!(ids.len(), STREAMS, "one ID per stream");
    for limit in [0, 1001] {
        assert_eq!(
            block_on(control.list_streams(&bucket("apps"), "", None, Some(limit))),
            Err(Error::ListLimitOutOfRange { limit, max: 1000 })
        );
    }
    assert_eq!(
        block_on(control.list_streams(&bucket("nope"), "", None, None)),
        Err(Error::BucketNotFound { bucket: "nope".into() })
    );
}

#[test]
fn list_streams_prefix_treats_keys_as_opaque() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    new_bucket(control, "apps", &none());
    new_bucket(control, "apps-2", &none());
    for stream in ["order", "orders", "orders/", "orders/eu", "orders/us", "ordersx", "p"] {
        new_stream(control, "apps", stream);
    }
    new_stream(control, "apps-2", "orders/eu");
    let list = |prefix: &str, start_after: Option<&str>, limit: Option<u64>| -> Vec<String> {
        block_on(control.list_streams(&bucket("apps"), prefix, start_after, limit))
            .unwrap()
            .streams
            .into_iter()
            .map(|record| record.key.into_string())
            .collect()
    };
    assert_eq!(list("orders/", None, None), ["orders/", "orders/eu", "orders/us"]);
    assert_eq!(
        list("orders", None, None),
        ["orders", "orders/", "orders/eu", "orders/us", "ordersx"]
    );
    assert_eq!(list("orders/eu", None, None), ["orders/eu"]);
    assert_eq!(list("orders/e", None, None), ["orders/eu"]);
    assert_eq!(list("", None, None).len(), 7);
    assert!(list("q", None, None).is_empty());
    assert!(list(&"o".repeat(513), None, None).is_empty());
    // start_after within, before and after the prefix's range.
    assert_eq!(list("orders/", Some("orders/"), None), ["orders/eu", "orders/us"]);
    assert_eq!(list("orders/", Some("a"), None), ["orders/", "orders/eu", "orders/us"]);
    assert!(list("orders/", Some("orders/us"), None).is_empty());
    assert!(list("orders/", Some("z"), None).is_empty());
    let long_cursor = format!("orders/eu{}", "~".repeat(600));
    assert_eq!(list("orders/", Some(&long_cursor), None), ["orders/us"]);
    // A page cut inside the prefix has a next; the last page has none.
    let page = block_on(control.list_streams(&bucket("apps"), "orders/", None, Some(2))).unwrap();
    assert_eq!(page.next, Some(key("orders/eu")));
    let page =
        block_on(control.list_streams(&bucket("apps"), "orders/", Some("orders/eu"), Some(2)))
            .unwrap();
    assert_eq!((page.streams.len(), page.next), (1, None));
}

#[test]
fn a_stream_deleted_while_listing_is_left_out_and_paging_goes_on() {
    let fixture = Fixture::new();
    let (hooked, control) = hooked(&fixture);
    new_bucket(&control, "apps", &none());
    let streams: Vec<_> = ["a", "b", "c"].map(|stream| new_stream(&control, "apps", stream)).into();
    // After the scan found "a" and "b", and before their rows are read, "b" and "c" go.
    let unhooked = fixture.control.clone();
    let b_row = keys::stream(&streams[1].id);
    hooked.on(
        move |op| matches!(op, Op::Get(key) if *key == b_row),
        move || {
            for stream in ["b", "c"] {
                block_on(unhooked.delete_stream(&bucket("apps"), &key(stream), None)).unwrap();
            }
        },
    );
    let page = block_on(control.list_streams(&bucket("apps"), "", None, Some(2))).unwrap();
    assert_eq!(hooked.pending(), 0);
    assert_eq!(page.streams, [streams[0].clone()]);
    // The cursor is the last key scanned, so the next page starts after "b".
    assert_eq!(page.next, Some(key("b")));
    let rest = block_on(control.list_streams(&bucket("apps"), "", Some("b"), Some(2))).unwrap();
    assert_eq!(rest, StreamPage::default());
}

#[test]
fn a_verb_that_keeps_losing_its_race_gives_up_with_contended() {
    let fixture = Fixture::new();
    let (hooked, control) = hooked(&fixture);
    new_bucket(&control, "apps", &none());
    let address = keys::address(&bucket("apps"), &key("s"));
    // Before each of the create's commits, the bucket changes under it.
    for round in 0..ATTEMPTS_MAX {
        let (unhooked, address) = (fixture.control.clone(), address.clone());
        hooked.on(
            move |op| matches!(op, Op::Commit(txn) if puts(txn, &address)),
            move || {
                let request = BucketConfigRequest { location: round.to_string(), ..none() };
                block_on(unhooked.update_bucket(&bucket("apps"), &request)).unwrap();
            },
        );
    }
    let error = block_on(control.create_stream(&bucket("apps"), &key("s"), &no_overrides(), None))
        .expect_err("contended");
    assert_eq!(error, Error::Contended { op: "create stream", attempts: ATTEMPTS_MAX });
    assert!(error.is_retryable());
    assert_eq!(hooked.pending(), 0, "one attempt per hook");
    assert!(fixture.keys_under(keys::ADDRESSES).is_empty());
    // Without the contention it goes through.
    assert!(
        block_on(control.create_stream(&bucket("apps"), &key("s"), &no_overrides(), None))
            .unwrap()
            .created
    );
}

// ---- Deleting buckets -----------------------------------------------------------------------------

#[test]
fn delete_bucket_only_when_no_stream_lives_in_it() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let apps = bucket("apps");
    new_bucket(control, "apps", &none());
    new_stream(control, "apps", "a");
    new_stream(control, "apps", "b");
    let before = bucket_row(&fixture.store, "apps").unwrap();
    let not_empty = Error::BucketNotEmpty { bucket: "apps".into() };
    assert_eq!(block_on(control.delete_bucket(&apps)), Err(not_empty.clone()));
    assert_eq!(not_empty.code(), Code::FailedPrecondition);
    // The bucket is back to active, its configuration untouched.
    let (after, _) = bucket_row(&fixture.store, "apps").unwrap();
    assert_eq!((after.state, &after.config), (BucketState::Active, &before.0.config));
    new_stream(control, "apps", "c");

    for stream in ["a", "b"] {
        block_on(control.delete_stream(&apps, &key(stream), None)).unwrap();
    }
    assert_eq!(block_on(control.delete_bucket(&apps)), Err(not_empty));
    block_on(control.delete_stream(&apps, &key("c"), None)).unwrap();
    assert_eq!(fixture.keys_under(&keys::deleted_of(&apps)).len(), 3);
    block_on(control.delete_bucket(&apps)).unwrap();
    assert_eq!(
        block_on(control.get_bucket(&apps)),
        Err(Error::BucketNotFound { bucket: "apps".into() })
    );
    assert_eq!(
        block_on(control.delete_bucket(&apps)),
        Err(Error::BucketNotFound { bucket: "apps".into() })
    );
    // The deleted markers went with the bucket; the tombstones stay for reclamation.
    assert!(fixture.keys_under(keys::DELETED).is_empty());
    assert_eq!(fixture.keys_under(keys::STREAMS).len(), 3);
    assert_eq!(
        block_on(control.delete_stream(&apps, &key("a"), None)),
        Err(Error::BucketNotFound { bucket: "apps".into() })
    );

    // A new bucket of the same name knows nothing of the old one's streams, even when a
    // marker of the old bucket was left behind.
    new_bucket(control, "apps", &none());
    let stale =
        DeletedRow { id: StreamId([5; 16]), bucket_id: before.0.bucket_id, deleted_at_ms: 1 };
    block_on(fixture.store.put(keys::deleted(&apps, &key("a")), stale.encode())).unwrap();
    assert_eq!(
        block_on(control.delete_stream(&apps, &key("a"), None)),
        Err(Error::StreamNotFound { bucket: "apps".into(), key: "a".into() })
    );
    assert_eq!(
        block_on(control.list_streams(&apps, "", None, None)).unwrap(),
        StreamPage::default()
    );
}

/// A metadata store that runs a hook, once, when an operation matches: the hook runs
/// another verb to completion before the matched operation reaches the store, which forces
/// one interleaving of two verbs.
#[derive(Clone)]
struct Hooked {
    inner: RedbMetaStore,
    hooks: Arc<Mutex<Vec<Hook>>>,
}

type Matcher = Box<dyn Fn(&Op<'_>) -> bool + Send>;

struct Hook {
    matches: Matcher,
    run: Box<dyn FnOnce() + Send>,
}

enum Op<'a> {
    Get(&'a [u8]),
    Scan(&'a [u8]),
    Commit(&'a Txn),
}

impl Hooked {
    fn new(inner: RedbMetaStore) -> Self {
        Self { inner, hooks: Arc::default() }
    }

    fn on(
        &self,
        matches: impl Fn(&Op<'_>) -> bool + Send + 'static,
        run: impl FnOnce() + Send + 'static,
    ) {
        self.hooks.lock().unwrap().push(Hook { matches: Box::new(matches), run: Box::new(run) });
    }

    fn pending(&self) -> usize {
        self.hooks.lock().unwrap().len()
    }

    fn fire(&self, op: Op<'_>) {
        let hook = {
            let mut hooks = self.hooks.lock().unwrap();
            let found = hooks.iter().position(|hook| (hook.matches)(&op));
            found.map(|index| hooks.remove(index))
        };
        if let Some(hook) = hook {
            (hook.run)();
        }
    }
}

impl MetaStore for Hooked {
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Versioned>, MetaError>> + Send {
        self.fire(Op::Get(key));
        self.inner.get(key)
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: u32,
    ) -> impl Future<Output = Result<ScanPage, MetaError>> + Send {
        self.fire(Op::Scan(prefix));
        self.inner.scan(prefix, start_after, limit)
    }

    fn commit(&self, txn: Txn) -> impl Future<Output = Result<Revision, MetaError>> + Send {
        self.fire(Op::Commit(&txn));
        self.inner.commit(txn)
    }
}

fn deletes(txn: &Txn, key: &[u8]) -> bool {
    txn.writes.iter().any(|write| matches!(write, Write::Delete(deleted) if deleted == key))
}

fn puts(txn: &Txn, key: &[u8]) -> bool {
    txn.writes.iter().any(|write| matches!(write, Write::Put(put, _) if put == key))
}

/// A hooked control plane over the fixture's store, and an unhooked one for hooks to use.
fn hooked(fixture: &Fixture) -> (Hooked, ControlPlane<Hooked>) {
    let hooked = Hooked::new(fixture.store.clone());
    let control = plane(hooked.clone(), &fixture.now, &fixture.ids);
    (hooked, control)
}

#[test]
fn a_create_while_the_bucket_is_marked_wins_and_the_delete_finds_its_stream() {
    let fixture = Fixture::new();
    let (hooked, control) = hooked(&fixture);
    let apps = bucket("apps");
    new_bucket(&control, "apps", &autocreating());
    // Right before the deletion looks for streams, a create runs to completion.
    let unhooked = fixture.control.clone();
    let created = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&created);
    hooked.on(
        move |op| matches!(op, Op::Scan(prefix) if *prefix == keys::addresses_of(&bucket("apps"))),
        move || {
            let (row, _) = block_on(unhooked.read_bucket(&bucket("apps"))).unwrap().unwrap();
            assert_eq!(row.state, BucketState::Deleting, "the create sees the mark");
            let stream = block_on(unhooked.resolve(&bucket("apps"), &key("late"), Door::Append));
            *slot.lock().unwrap() = Some(stream.unwrap());
        },
    );
    assert_eq!(
        block_on(control.delete_bucket(&apps)),
        Err(Error::BucketNotEmpty { bucket: "apps".into() })
    );
    assert_eq!(hooked.pending(), 0);
    let late = created.lock().unwrap().take().unwrap();
    assert!(late.created);
    assert_eq!(block_on(control.get_stream(&apps, &key("late"))).unwrap(), late.record);
    assert_eq!(bucket_row(&fixture.store, "apps").unwrap().0.state, BucketState::Active);
}

#[test]
fn a_create_between_the_scan_and_the_delete_makes_the_delete_look_again() {
    let fixture = Fixture::new();
    let (hooked, control) = hooked(&fixture);
    let apps = bucket("apps");
    new_bucket(&control, "apps", &none());
    let unhooked = fixture.control.clone();
    hooked.on(
        move |op| matches!(op, Op::Commit(txn) if deletes(txn, &keys::bucket(&bucket("apps")))),
        move || {
            let created = block_on(unhooked.create_stream(
                &bucket("apps"),
                &key("late"),
                &no_overrides(),
                None,
            ));
            assert!(created.unwrap().created);
        },
    );
    assert_eq!(
        block_on(control.delete_bucket(&apps)),
        Err(Error::BucketNotEmpty { bucket: "apps".into() })
    );
    assert_eq!(hooked.pending(), 0);
    assert!(block_on(control.get_stream(&apps, &key("late"))).is_ok());
    assert_eq!(bucket_row(&fixture.store, "apps").unwrap().0.state, BucketState::Active);
}

#[test]
fn a_delete_between_a_creates_read_and_commit_makes_the_create_not_found() {
    let fixture = Fixture::new();
    let (hooked, control) = hooked(&fixture);
    let apps = bucket("apps");
    new_bucket(&control, "apps", &autocreating());
    let address = keys::address(&apps, &key("s"));
    for door in [None, Some(Door::Append)] {
        let unhooked = fixture.control.clone();
        let address = address.clone();
        hooked.on(
            move |op| matches!(op, Op::Commit(txn) if puts(txn, &address)),
            move || block_on(unhooked.delete_bucket(&bucket("apps"))).unwrap(),
        );
        let outcome = match door {
            None => block_on(control.create_stream(&apps, &key("s"), &no_overrides(), None)),
            Some(door) => block_on(control.resolve(&apps, &key("s"), door)),
        };
        assert_eq!(outcome, Err(Error::BucketNotFound { bucket: "apps".into() }), "{door:?}");
        assert_eq!(hooked.pending(), 0);
        assert!(fixture.keys_under(keys::ADDRESSES).is_empty());
        assert!(fixture.keys_under(keys::STREAMS).is_empty());
        new_bucket(&fixture.control, "apps", &autocreating());
    }
}

#[test]
fn a_mark_left_by_a_crashed_deletion_is_cleared_by_a_create_and_taken_over_by_a_delete() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let apps = bucket("apps");
    new_bucket(control, "apps", &autocreating());
    let mark = |store: &RedbMetaStore| {
        let (row, version) = bucket_row(store, "apps").unwrap();
        let marked = BucketRow { state: BucketState::Deleting, ..row };
        block_on(store.cas(keys::bucket(&bucket("apps")), version, marked.encode())).unwrap();
    };
    mark(&fixture.store);
    // A marked bucket reads like any other.
    let record = block_on(control.get_bucket(&apps)).unwrap();
    assert!(record.config.create_stream_on_append);
    assert_eq!(
        block_on(control.list_buckets(None, None)).unwrap().buckets,
        std::slice::from_ref(&record)
    );
    // A create clears the mark.
    let stream = block_on(control.resolve(&apps, &key("s"), Door::Append)).unwrap();
    assert!(stream.created);
    assert_eq!(bucket_row(&fixture.store, "apps").unwrap().0.state, BucketState::Active);
    assert_eq!(block_on(control.get_bucket(&apps)).unwrap(), record);

    // A mark over a bucket with a stream: the delete takes it over, finds the stream, and
    // unmarks.
    mark(&fixture.store);
    assert_eq!(
        block_on(control.delete_bucket(&apps)),
        Err(Error::BucketNotEmpty { bucket: "apps".into() })
    );
    assert_eq!(bucket_row(&fixture.store, "apps").unwrap().0.state, BucketState::Active);
    // An update keeps a mark (the deletion looks again at the new version).
    block_on(control.delete_stream(&apps, &key("s"), None)).unwrap();
    mark(&fixture.store);
    block_on(control.update_bucket(&apps, &none())).unwrap();
    assert_eq!(bucket_row(&fixture.store, "apps").unwrap().0.state, BucketState::Deleting);
    block_on(control.delete_bucket(&apps)).unwrap();
    assert!(bucket_row(&fixture.store, "apps").is_none());
}

#[test]
fn racing_bucket_deletes_and_creates_never_leave_a_stream_in_a_deleted_bucket() {
    const ROUNDS: u32 = 12;
    const CREATORS: u32 = 6;
    const CREATES_PER_CREATOR: u32 = 8;
    let fixture = Fixture::new();
    let mut outcomes = BTreeMap::new();
    for round in 0..ROUNDS {
        let name = format!("race-{round}");
        new_bucket(&fixture.control, &name, &autocreating());
        let start = Arc::new(Barrier::new(CREATORS as usize + 1));
        let deleted = Arc::new(AtomicBool::new(false));
        let creators: Vec<_> = (0..CREATORS)
            .map(|creator| {
                let (control, start, name) =
                    (fixture.control.clone(), Arc::clone(&start), name.clone());
                let deleted = Arc::clone(&deleted);
                thread::spawn(move || {
                    start.wait();
                    // Creators start a few reads apart; the deleter starts later each
                    // round, so early rounds favour the deletion and later ones the
                    // creates (reads, not sleeps).
                    for _ in 0..creator {
                        block_on(control.store().get(b"warm-up")).unwrap();
                    }
                    let mut created = Vec::new();
                    for index in 0..CREATES_PER_CREATOR {
                        let stream = key(&format!("{creator}/{index}"));
                        let started_after_delete = deleted.load(Ordering::SeqCst);
                        let outcome = if index % 2 == 0 {
                            block_on(control.create_stream(
                                &bucket(&name),
                                &stream,
                                &no_overrides(),
                                None,
                            ))
                        } else {
                            block_on(control.resolve(&bucket(&name), &stream, Door::Append))
                        };
                        match outcome {
                            Ok(done) => {
                                assert!(!started_after_delete, "created {stream:?} after delete");
                                assert!(done.created);
                                created.push(done.record.id);
                            }
                            Err(Error::BucketNotFound { .. }) => {}
                            Err(error) => panic!("{error}"),
                        }
                    }
                    created
                })
            })
            .collect();
        let deleter = {
            let (control, name) = (fixture.control.clone(), name.clone());
            let deleted = Arc::clone(&deleted);
            thread::spawn(move || {
                start.wait();
                for _ in 0..round / 3 {
                    block_on(control.store().get(b"warm-up")).unwrap();
                }
                match block_on(control.delete_bucket(&bucket(&name))) {
                    Ok(()) => {
                        deleted.store(true, Ordering::SeqCst);
                        "deleted"
                    }
                    Err(Error::BucketNotEmpty { .. }) => "not empty",
                    Err(error) => panic!("{error}"),
                }
            })
        };
        let created: Vec<StreamId> =
            creators.into_iter().flat_map(|creator| creator.join().unwrap()).collect();
        let outcome = deleter.join().unwrap();
        *outcomes.entry(outcome).or_insert(0) += 1;
        let addresses = fixture.keys_under(&keys::addresses_of(&bucket(&name)));
        match outcome {
            "deleted" => {
                // Streams are never deleted here, so a deletion that succeeded came before
                // every create, and every create failed.
                assert!(created.is_empty(), "round {round}: {created:?} in a deleted bucket");
                assert!(addresses.is_empty(), "round {round}: {addresses:?}");
                assert!(bucket_row(&fixture.store, &name).is_none());
            }
            "not empty" => {
                assert_eq!(addresses.len(), created.len(), "round {round}");
                assert_eq!(created.len(), (CREATORS * CREATES_PER_CREATOR) as usize);
                let (row, _) = bucket_row(&fixture.store, &name).unwrap();
                assert_eq!(row.state, BucketState::Active, "round {round}");
            }
            other => panic!("round {round}: {other}"),
        }
    }
    println!("outcomes over {ROUNDS} rounds: {outcomes:?}");
}

#[test]
fn a_bucket_emptied_while_creates_and_deletes_race_is_deleted_cleanly() {
    const CREATORS: u32 = 6;
    const CREATES_PER_CREATOR: u32 = 10;
    let fixture = Fixture::new();
    new_bucket(&fixture.control, "churn", &autocreating());
    let start = Arc::new(Barrier::new(CREATORS as usize + 1));
    let deleted = Arc::new(AtomicBool::new(false));
    // The deleter tries once per finished create-and-delete, and once more after all of
    // them: it races the creators without starving them.
    let (progress, progressed) = std::sync::mpsc::channel::<()>();
    let creators: Vec<_> = (0..CREATORS)
        .map(|creator| {
            let (control, start) = (fixture.control.clone(), Arc::clone(&start));
            let (deleted, progress) = (Arc::clone(&deleted), progress.clone());
            thread::spawn(move || {
                start.wait();
                for index in 0..CREATES_PER_CREATOR {
                    let stream = key(&format!("{creator}/{index}"));
                    let started_after_delete = deleted.load(Ordering::SeqCst);
                    match block_on(control.resolve(&bucket("churn"), &stream, Door::Append)) {
                        Ok(done) => {
                            assert!(!started_after_delete, "created {stream:?} after delete");
                            let id = Some(done.record.id);
                            block_on(control.delete_stream(&bucket("churn"), &stream, id)).unwrap();
                        }
                        Err(Error::BucketNotFound { .. }) => {}
                        Err(error) => panic!("{error}"),
                    }
                    // The deleter stops listening once the bucket is gone.
                    let _ = progress.send(());
                }
            })
        })
        .collect();
    drop(progress);
    let deleter = {
        let control = fixture.control.clone();
        let deleted = Arc::clone(&deleted);
        thread::spawn(move || {
            start.wait();
            let mut tries = 0;
            loop {
                // Bounded: the creators send a finite number of messages, then hang up.
                let last = match progressed.recv_timeout(STALL_LIMIT) {
                    Ok(()) => false,
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => true,
                    Err(timeout) => panic!("the creators stalled: {timeout}"),
                };
                tries += 1;
                match block_on(control.delete_bucket(&bucket("churn"))) {
                    Ok(()) => {
                        deleted.store(true, Ordering::SeqCst);
                        return tries;
                    }
                    Err(Error::BucketNotEmpty { .. }) if !last => {}
                    Err(error) => panic!("try {tries}: {error}"),
                }
            }
        })
    };
    creators.into_iter().for_each(|creator| creator.join().unwrap());
    let tries = deleter.join().unwrap();
    println!("deleted after {tries} tries");
    assert!(bucket_row(&fixture.store, "churn").is_none());
    assert!(fixture.keys_under(keys::ADDRESSES).is_empty());
    assert!(fixture.keys_under(keys::DELETED).is_empty(), "the markers went with the bucket");
    for (key, found) in scan_all(&fixture.store, keys::STREAMS) {
        let row = StreamRow::decode(&found.value).unwrap();
        assert!(!row.is_live(), "{key:?} is live in a deleted bucket");
    }
}

// ---- Corruption and reopening --------------------------------------------------------------------

#[test]
fn corrupt_and_unknown_version_rows_are_refused_as_corruption() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let apps = bucket("apps");
    new_bucket(control, "apps", &none());
    let stream = new_stream(control, "apps", "orders");

    // An address leading to a tombstone that stays there: corrupt, not a race to retry.
    let other = new_stream(control, "apps", "other");
    let stored = block_on(fixture.store.get(&keys::stream(&other.id))).unwrap().unwrap();
    let tombstone = StreamRow {
        state: super::rows::StreamState::Deleted,
        deleted_at_ms: 1,
        ..StreamRow::decode(&stored.value).unwrap()
    };
    block_on(fixture.store.put(keys::stream(&other.id), tombstone.encode())).unwrap();
    let message =
        block_on(control.get_stream(&apps, &key("other"))).expect_err("stuck").to_string();
    assert!(message.contains("leads to deleted stream"), "{message}");

    let (good, _) = bucket_row(&fixture.store, "apps").unwrap();
    let mut future_version = good.encode();
    future_version[0] = 2;
    block_on(fixture.store.put(keys::bucket(&apps), future_version)).unwrap();
    let error = block_on(control.get_bucket(&apps)).expect_err("unknown version");
    assert_eq!(error.code(), Code::Internal);
    assert!(matches!(error, Error::Meta(MetaError::Corrupt { .. })), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("version 2") && message.contains("b/apps"), "{message}");
    assert_eq!(code(block_on(control.list_buckets(None, None))), Code::Internal);
    assert_eq!(
        code(block_on(control.create_stream(&apps, &key("x"), &no_overrides(), None))),
        Code::Internal
    );

    // A row under another name's key, and an address leading to a missing stream row.
    let other = BucketRow { name: bucket("other"), ..good };
    block_on(fixture.store.put(keys::bucket(&apps), other.encode())).unwrap();
    let message = block_on(control.get_bucket(&apps)).expect_err("misplaced").to_string();
    assert!(message.contains("holds bucket other"), "{message}");
    block_on(fixture.store.delete(keys::stream(&stream.id))).unwrap();
    let message =
        block_on(control.get_stream(&apps, &key("orders"))).expect_err("dangling").to_string();
    assert!(message.contains("does not exist"), "{message}");
    block_on(fixture.store.put(keys::address(&apps, &key("orders")), b"\x01\x02".to_vec()))
        .unwrap();
    assert_eq!(code(block_on(control.get_stream(&apps, &key("orders")))), Code::Internal);
}

#[test]
fn state_survives_closing_and_reopening_the_store() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let apps = bucket("apps");
    new_bucket(control, "apps", &autocreating());
    let kept = new_stream(control, "apps", "kept");
    let fenced = block_on(control.set_fencing_token(kept.id, None, "writer")).unwrap();
    let trimmed = block_on(control.set_trim_seq_num(fenced.id, 9, 0)).unwrap();
    let gone = new_stream(control, "apps", "gone");
    block_on(control.delete_stream(&apps, &key("gone"), None)).unwrap();
    let auto = block_on(control.resolve(&apps, &key("auto"), Door::Read)).unwrap().record;
    let bucket_record = block_on(control.get_bucket(&apps)).unwrap();
    let streams = block_on(control.list_streams(&apps, "", None, None)).unwrap();
    block_on(fixture.store.close()).unwrap();

    let store = open(&fixture.dir);
    let reopened = plane(store, &fixture.now, &fixture.ids);
    assert_eq!(block_on(reopened.get_bucket(&apps)).unwrap(), bucket_record);
    assert_eq!(block_on(reopened.get_stream(&apps, &key("kept"))).unwrap(), trimmed);
    assert_eq!(block_on(reopened.get_stream(&apps, &key("auto"))).unwrap(), auto);
    assert_eq!(block_on(reopened.list_streams(&apps, "", None, None)).unwrap(), streams);
    assert_eq!(
        block_on(reopened.delete_stream(&apps, &key("gone"), None)).unwrap(),
        Deleted { id: gone.id, already: true }
    );
    assert!(block_on(reopened.stream_by_id(gone.id)).unwrap().unwrap().deleted_at_ms.is_some());
    // And it keeps working: the address is free, the ID is not.
    let again = new_stream(&reopened, "apps", "gone");
    assert_ne!(again.id, gone.id);
}

// ---- Refs ------------------------------------------------------------------------------

fn chunk_ref(id: StreamId, first_seq_num: u64, count: u32, object: &str) -> RefRow {
    RefRow {
        id,
        first_seq_num,
        record_count: count,
        last_timestamp: first_seq_num * 10,
        data_len: count * 100,
        object: object.into(),
        offset: first_seq_num * 1000,
        length: 1000,
    }
}

#[test]
fn refs_scan_in_sequence_order_per_stream_across_transactions_and_pages() {
    let fx = Fixture::new();
    let (a, b) = (StreamId([1; 16]), StreamId([2; 16]));
    // Sequence numbers whose little-endian order differs from numeric order, more refs
    // than one transaction holds and than one scan page returns.
    let seqs: Vec<u64> = (0..1_250u64).rev().map(|i| i * 256 + 255).collect();
    let refs: Vec<RefRow> = seqs.iter().map(|&s| chunk_ref(a, s, 1, "bundle-a")).collect();
    block_on(fx.control.put_refs(&refs)).unwrap();
    block_on(fx.control.put_refs(&[chunk_ref(b, 0, 5, "bundle-b")])).unwrap();

    let found = block_on(fx.control.refs_of(a)).unwrap();
    let mut expected = refs.clone();
    expected.sort_by_key(|r| r.first_seq_num);
    assert_eq!(found, expected, "every ref of the stream, in sequence order, no other's");
    assert_eq!(block_on(fx.control.refs_of(b)).unwrap(), [chunk_ref(b, 0, 5, "bundle-b")]);
    assert!(block_on(fx.control.refs_of(StreamId([3; 16]))).unwrap().is_empty());

    // Settling rewrites a ref in place; deleting removes exactly the ones named.
    let moved = chunk_ref(b, 0, 5, "apps/settled-b");
    block_on(fx.control.put_refs(std::slice::from_ref(&moved))).unwrap();
    assert_eq!(block_on(fx.control.refs_of(b)).unwrap(), [moved]);
    let doomed: Vec<u64> = expected[..200].iter().map(|r| r.first_seq_num).collect();
    block_on(fx.control.delete_refs(a, &doomed)).unwrap();
    assert_eq!(block_on(fx.control.refs_of(a)).unwrap(), expected[200..]);
}

#[test]
fn a_dead_mark_refuses_new_refs_to_its_object_until_it_is_lifted() {
    let fx = Fixture::new();
    let id = StreamId([4; 16]);
    let marked = block_on(fx.control.mark_dead("_transit/doomed", 1_000)).unwrap();
    assert_eq!(marked, 1_000);
    assert_eq!(
        block_on(fx.control.mark_dead("_transit/doomed", 2_000)).unwrap(),
        1_000,
        "a mark keeps its first time: the grace never restarts"
    );
    // A transaction naming the dead object is refused whole: the live object's ref too.
    let refs = [chunk_ref(id, 0, 1, "_transit/alive"), chunk_ref(id, 1, 1, "_transit/doomed")];
    let refused = block_on(fx.control.put_refs(&refs)).unwrap_err();
    assert!(matches!(refused, Error::ObjectDead { .. }), "{refused:?}");
    assert!(refused.to_string().contains("_transit/doomed"), "{refused}");
    assert!(block_on(fx.control.refs_of(id)).unwrap().is_empty(), "nothing of it applied");
    let (marks, more) = block_on(fx.control.dead_page(None)).unwrap();
    assert_eq!((marks, more), (vec![("_transit/doomed".to_owned(), 1_000)], false));
    block_on(fx.control.unmark_dead("_transit/doomed")).unwrap();
    block_on(fx.control.put_refs(&refs)).unwrap();
    assert_eq!(block_on(fx.control.refs_of(id)).unwrap(), refs);
}

#[test]
fn refs_to_more_objects_than_one_transaction_checks_are_split_and_all_land() {
    let fx = Fixture::new();
    let id = StreamId([5; 16]);
    // Every ref in its own object: more distinct objects than a transaction checks.
    let refs: Vec<RefRow> =
        (0..90u64).map(|s| chunk_ref(id, s, 1, &format!("_transit/o{s:03}"))).collect();
    block_on(fx.control.put_refs(&refs)).unwrap();
    assert_eq!(block_on(fx.control.refs_of(id)).unwrap(), refs);
}

fn token(id: &str, grant: &str) -> TokenRecord {
    TokenRecord {
        id: id.into(),
        hash: [id.len() as u8; 32],
        grants: crate::auth::parse_grants(&[grant]).unwrap(),
        created_at_ms: START_MS,
        expires_at_ms: None,
        description: String::new(),
    }
}

#[test]
fn tokens_are_stored_listed_in_id_order_revoked_once_and_kept_across_a_reopen() {
    let fixture = Fixture::new();
    let control = &fixture.control;
    let (b, a) = (token("bbbb", "bucket:apps:read"), token("aaaa", "*:*:admin"));
    block_on(control.put_token(&b)).unwrap();
    block_on(control.put_token(&a)).unwrap();
    assert_eq!(
        code(block_on(control.put_token(&token("aaaa", "*:*:read")))),
        Code::Unavailable,
        "a taken ID is refused, never overwritten"
    );
    assert_eq!(block_on(control.tokens_page(None)).unwrap(), (vec![a.clone(), b.clone()], false));
    assert_eq!(block_on(control.tokens_page(Some("aaaa"))).unwrap(), (vec![b.clone()], false));

    assert!(block_on(control.delete_token("aaaa")).unwrap());
    assert!(!block_on(control.delete_token("aaaa")).unwrap(), "revoked already");
    assert!(!block_on(control.delete_token("zzzz")).unwrap(), "never issued");

    block_on(fixture.store.close()).unwrap();
    let reopened = plane(open(&fixture.dir), &fixture.now, &fixture.ids);
    assert_eq!(block_on(reopened.tokens_page(None)).unwrap(), (vec![b], false));
}
