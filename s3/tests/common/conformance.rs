//! The conformance suite: what every [`ObjectStore`] must do, run as is against each
//! backend (`conformance_tests!` makes one `#[test]` per case).

use std::collections::BTreeMap;
use std::sync::Arc;

use s3::{ByteRange, Bytes, ErrorKind, ObjectStore, Op, PutCondition};

use super::{Fixture, pattern};

/// One `#[test]` per conformance case, each on a fresh fixture from `$make`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::conformance_tests!(@cases $make;
            round_trip, a_key_and_its_children_coexist, empty_object, ranged_get,
            create_only_refuses_an_existing_key, concurrent_create_only_has_one_winner,
            list_is_ordered_and_pages, list_respects_prefix_and_start_after,
            large_object_round_trip, invalid_arguments_are_refused,
            missing_key_is_not_found);
    };
    (@cases $make:path; $($case:ident),*) => {
        $(
            #[test]
            fn $case() {
                common::run($make, common::conformance::$case);
            }
        )*
    };
}

fn bytes(seed: u64, len: usize) -> Bytes {
    Bytes::from(pattern(seed, len))
}

#[track_caller]
fn expect_kind<T: std::fmt::Debug>(
    result: Result<T, s3::Error>,
    kind: ErrorKind,
    op: Op,
    key: &str,
) {
    let err = result.expect_err("the call should fail");
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(err.op(), op, "{err}");
    assert_eq!(err.key(), key, "{err}");
    let message = err.to_string();
    assert!(message.starts_with(&format!("{op} ")), "the message names the call: {message}");
}

pub async fn round_trip(fixture: &Fixture) {
    let store = &fixture.store;
    let key = "round/trip/object";
    let first = bytes(1, 1000);
    store.put(key, first.clone(), PutCondition::Overwrite).await.expect("put");
    assert_eq!(store.head(key).await.expect("head"), Some(1000));
    assert_eq!(store.get(key, ByteRange::All).await.expect("get"), first);

    let second = bytes(2, 4321);
    store.put(key, second.clone(), PutCondition::Overwrite).await.expect("overwrite");
    assert_eq!(store.head(key).await.expect("head"), Some(4321));
    assert_eq!(store.get(key, ByteRange::All).await.expect("get"), second);

    store.delete(key).await.expect("delete");
    assert_eq!(store.head(key).await.expect("head after delete"), None);
    expect_kind(store.get(key, ByteRange::All).await, ErrorKind::NotFound, Op::Get, key);
    store.delete(key).await.expect("a second delete is a no-op");
}

/// S3 has no directories: `a` and `a/b` are two keys that may both exist.
pub async fn a_key_and_its_children_coexist(fixture: &Fixture) {
    let store = &fixture.store;
    for (key, seed) in [("nest", 1), ("nest/child", 2), ("nest/child/leaf", 3)] {
        store
            .put(key, bytes(seed, 100 + seed as usize), PutCondition::CreateOnly)
            .await
            .expect(key);
    }
    for (key, seed) in [("nest", 1), ("nest/child", 2), ("nest/child/leaf", 3)] {
        assert_eq!(
            store.get(key, ByteRange::All).await.expect(key),
            bytes(seed, 100 + seed as usize)
        );
    }
    let page = store.list("nest", None, 10).await.expect("list");
    let keys: Vec<_> = page.objects.iter().map(|o| (o.key.as_str(), o.size)).collect();
    assert_eq!(keys, [("nest", 101), ("nest/child", 102), ("nest/child/leaf", 103)]);
    store.delete("nest").await.expect("delete the parent key");
    assert_eq!(store.head("nest/child").await.expect("head"), Some(102));
}

pub async fn empty_object(fixture: &Fixture) {
    let store = &fixture.store;
    store.put("empty", Bytes::new(), PutCondition::CreateOnly).await.expect("put");
    assert_eq!(store.head("empty").await.expect("head"), Some(0));
    assert_eq!(store.get("empty", ByteRange::All).await.expect("get"), Bytes::new());
    expect_kind(store.get("empty", ByteRange::Last(4)).await, ErrorKind::Invalid, Op::Get, "empty");
}

pub async fn ranged_get(fixture: &Fixture) {
    let store = &fixture.store;
    let key = "ranged";
    let data = bytes(7, 1024);
    store.put(key, data.clone(), PutCondition::Overwrite).await.expect("put");
    let cases: [(ByteRange, std::ops::Range<usize>); 7] = [
        (ByteRange::All, 0..1024),
        ((10..20).into(), 10..20),
        ((0..1).into(), 0..1),
        ((1000..5000).into(), 1000..1024), // clipped at the end
        (ByteRange::From(1020), 1020..1024),
        (ByteRange::Last(5), 1019..1024),
        (ByteRange::Last(5000), 0..1024), // a suffix longer than the object
    ];
    for (range, expected) in cases {
        let got =
            store.get(key, range.clone()).await.unwrap_or_else(|err| panic!("{range}: {err}"));
        assert_eq!(got, data.slice(expected), "{range}");
    }
    for unsatisfiable in
        [ByteRange::from(1024..1030), ByteRange::From(1024), ByteRange::from(5000..6000)]
    {
        expect_kind(store.get(key, unsatisfiable).await, ErrorKind::Invalid, Op::Get, key);
    }
    // Never satisfiable: refused before any request.
    for empty in [
        ByteRange::from(5..5),
        ByteRange::Span(std::ops::Range { start: 9, end: 3 }),
        ByteRange::Last(0),
    ] {
        expect_kind(store.get(key, empty).await, ErrorKind::Invalid, Op::Get, key);
    }
    expect_kind(
        store.get("ranged-missing", (0..4).into()).await,
        ErrorKind::NotFound,
        Op::Get,
        "ranged-missing",
    );
}

pub async fn create_only_refuses_an_existing_key(fixture: &Fixture) {
    let store = &fixture.store;
    let key = "create/only";
    store.put(key, bytes(1, 300), PutCondition::CreateOnly).await.expect("first create");
    expect_kind(
        store.put(key, bytes(2, 300), PutCondition::CreateOnly).await,
        ErrorKind::AlreadyExists,
        Op::Put,
        key,
    );
    assert_eq!(
        store.get(key, ByteRange::All).await.expect("get"),
        bytes(1, 300),
        "the first stays"
    );
    store.put(key, bytes(3, 10), PutCondition::Overwrite).await.expect("overwrite");
    assert_eq!(store.get(key, ByteRange::All).await.expect("get"), bytes(3, 10));
    store.delete(key).await.expect("delete");
    store.put(key, bytes(4, 10), PutCondition::CreateOnly).await.expect("create after delete");
}

pub async fn concurrent_create_only_has_one_winner(fixture: &Fixture) {
    const RACERS: u64 = 16;
    const ROUNDS: u64 = 5;
    for round in 0..ROUNDS {
        let key = format!("race/{round}");
        let mut racers = tokio::task::JoinSet::new();
        for racer in 0..RACERS {
            let store = Arc::clone(&fixture.store);
            let key = key.clone();
            racers.spawn(async move {
                let data = bytes(round * 100 + racer, 2048 + racer as usize);
                (racer, store.put(&key, data, PutCondition::CreateOnly).await)
            });
        }
        let mut winners = Vec::new();
        while let Some(joined) = racers.join_next().await {
            let (racer, result) = joined.expect("a racer panicked");
            match result {
                Ok(()) => winners.push(racer),
                Err(err) => assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let winner = winners[0];
        let stored = fixture.store.get(&key, ByteRange::All).await.expect("get");
        assert_eq!(
            stored,
            bytes(round * 100 + winner, 2048 + winner as usize),
            "the winner's bytes"
        );
    }
}

/// Writes `keys` (16 puts in flight at a time); each object's size is its index + 1.
async fn put_all(store: &Arc<dyn ObjectStore>, keys: &[String]) {
    let mut in_flight = tokio::task::JoinSet::<Result<(), s3::Error>>::new();
    for (index, key) in keys.iter().enumerate() {
        if in_flight.len() >= 16 {
            in_flight
                .join_next()
                .await
                .expect("a put in flight")
                .expect("a put task")
                .expect("put");
        }
        let (store, key) = (Arc::clone(store), key.clone());
        in_flight.spawn(async move {
            store.put(&key, bytes(index as u64, index % 64 + 1), PutCondition::CreateOnly).await
        });
    }
    while let Some(done) = in_flight.join_next().await {
        done.expect("a put task").expect("put");
    }
}

/// Every page of `prefix` after `start_after`, `limit` keys at most each.
async fn list_all(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    start_after: Option<&str>,
    limit: usize,
) -> (Vec<(String, u64)>, usize) {
    let mut listed = Vec::new();
    let mut after = start_after.map(str::to_owned);
    let mut pages = 0;
    loop {
        let page = store.list(prefix, after.as_deref(), limit).await.expect("list");
        pages += 1;
        assert!(page.objects.len() <= limit, "page {pages} has {} keys", page.objects.len());
        listed.extend(page.objects.into_iter().map(|o| (o.key, o.size)));
        match page.next {
            Some(next) => after = Some(next),
            None => return (listed, pages),
        }
        assert!(pages < 10_000, "the listing does not end");
    }
}

pub async fn list_is_ordered_and_pages(fixture: &Fixture) {
    let store = &fixture.store;
    // Several directories deep, in no particular order, with names whose byte order
    // differs from a per-directory order ('-' < '.' < '/' < '0').
    let mut keys: Vec<String> =
        (0..fixture.list_keys).map(|i| format!("list/{}/{:05}", (i * 7919) % 13, i)).collect();
    keys.extend(
        ["list/a", "list/a/b", "list/a-b", "list/a.b", "list/a0", "list/a/b/c"].map(String::from),
    );
    keys.extend(["lis", "listx", "list-", "other/list/1"].map(String::from));
    put_all(store, &keys).await;
    let expected: BTreeMap<&str, u64> = keys
        .iter()
        .enumerate()
        .filter(|(_, key)| key.starts_with("list/"))
        .map(|(index, key)| (key.as_str(), (index % 64 + 1) as u64))
        .collect();
    let expected: Vec<(String, u64)> =
        expected.into_iter().map(|(k, s)| (k.to_owned(), s)).collect();

    let (listed, pages) = list_all(store, "list/", None, 1000).await;
    assert_eq!(listed.len(), expected.len());
    assert_eq!(listed, expected, "every key once, in byte order, with its size");
    assert_eq!(pages, expected.len().div_ceil(1000));

    let (small_pages, _) = list_all(store, "list/", None, 97).await;
    assert_eq!(small_pages, expected);
}

pub async fn list_respects_prefix_and_start_after(fixture: &Fixture) {
    let store = &fixture.store;
    let keys: Vec<String> =
        ["p/a", "p/a-b", "p/a.b", "p/a/b", "p/a/b/c", "p/a0", "p/b", "p/b/1", "p/b/2", "pp", "p"]
            .map(String::from)
            .to_vec();
    put_all(store, &keys).await;
    let listed = |prefix: &'static str, after: Option<&'static str>, limit| {
        let store = Arc::clone(store);
        async move {
            let (listed, _) = list_all(&store, prefix, after, limit).await;
            listed.into_iter().map(|(key, _)| key).collect::<Vec<_>>()
        }
    };
    assert_eq!(listed("p/a", None, 2).await, ["p/a", "p/a-b", "p/a.b", "p/a/b", "p/a/b/c", "p/a0"]);
    assert_eq!(listed("p/a/", None, 1).await, ["p/a/b", "p/a/b/c"]);
    assert_eq!(listed("p", None, 3).await.len(), keys.len());
    assert_eq!(listed("p/", Some("p/a/b"), 2).await, ["p/a/b/c", "p/a0", "p/b", "p/b/1", "p/b/2"]);
    // A bound that is not a key, between keys and inside a "directory".
    assert_eq!(
        listed("p/", Some("p/a/a"), 100).await,
        ["p/a/b", "p/a/b/c", "p/a0", "p/b", "p/b/1", "p/b/2"]
    );
    assert_eq!(listed("p/", Some("p/b/1"), 100).await, ["p/b/2"]);
    assert_eq!(listed("p/", Some("p/c"), 100).await, Vec::<String>::new());
    assert_eq!(listed("q", None, 100).await, Vec::<String>::new());
    assert_eq!(listed("", Some("p/b/2"), 100).await, ["pp"]);
    let page = store.list("p/b/", None, 2).await.expect("list");
    assert_eq!(page.next, None, "a page that ends the listing says so");
}

pub async fn large_object_round_trip(fixture: &Fixture) {
    let store = &fixture.store;
    let len = (20 << 20) + 12_345; // five parts on S3 (5 MiB), the last one short
    let data = bytes(42, len);
    store.put("large/one", data.clone(), PutCondition::Overwrite).await.expect("put");
    assert_eq!(store.head("large/one").await.expect("head"), Some(len as u64));
    assert_eq!(store.get("large/one", ByteRange::All).await.expect("get"), data);
    let boundary = 5u64 << 20;
    let across = store
        .get("large/one", ((boundary - 10)..(boundary + 10)).into())
        .await
        .expect("ranged get");
    assert_eq!(across, data.slice((boundary - 10) as usize..(boundary + 10) as usize));
    assert_eq!(
        store.get("large/one", ByteRange::Last(100)).await.expect("tail"),
        data.slice(len - 100..)
    );

    expect_kind(
        store.put("large/one", bytes(43, len), PutCondition::CreateOnly).await,
        ErrorKind::AlreadyExists,
        Op::Put,
        "large/one",
    );
    assert_eq!(store.get("large/one", ByteRange::All).await.expect("get"), data, "unchanged");
    store
        .put("large/two", bytes(44, len), PutCondition::CreateOnly)
        .await
        .expect("create a large object");
    assert_eq!(store.get("large/two", ByteRange::All).await.expect("get"), bytes(44, len));
}

pub async fn invalid_arguments_are_refused(fixture: &Fixture) {
    let store = &fixture.store;
    let long = "k".repeat(s3::KEY_BYTES_MAX + 1);
    for key in [
        "",
        "/a",
        "a/",
        "a//b",
        "a/../b",
        "..",
        ".",
        "a b",
        "a~",
        "ü",
        "a\\b",
        "a?b",
        long.as_str(),
    ] {
        expect_kind(
            store.put(key, bytes(1, 1), PutCondition::Overwrite).await,
            ErrorKind::Invalid,
            Op::Put,
            &s3_key(key),
        );
        expect_kind(
            store.get(key, ByteRange::All).await,
            ErrorKind::Invalid,
            Op::Get,
            &s3_key(key),
        );
        expect_kind(store.head(key).await, ErrorKind::Invalid, Op::Head, &s3_key(key));
        expect_kind(store.delete(key).await, ErrorKind::Invalid, Op::Delete, &s3_key(key));
    }
    for prefix in ["/a", "a//", "a b"] {
        expect_kind(store.list(prefix, None, 10).await, ErrorKind::Invalid, Op::List, prefix);
    }
    for limit in [0, s3::LIST_PAGE_KEYS_MAX + 1] {
        expect_kind(store.list("", None, limit).await, ErrorKind::Invalid, Op::List, "");
    }
    let page = store.list("", None, 10).await.expect("list");
    assert!(page.objects.is_empty(), "nothing was written: {page:?}");
}

/// The key as an error quotes it (long keys are shortened).
fn s3_key(key: &str) -> String {
    if key.chars().count() > 80 {
        format!("{}…", key.chars().take(80).collect::<String>())
    } else {
        key.to_owned()
    }
}

pub async fn missing_key_is_not_found(fixture: &Fixture) {
    let store = &fixture.store;
    expect_kind(
        store.get("no/such/key", ByteRange::All).await,
        ErrorKind::NotFound,
        Op::Get,
        "no/such/key",
    );
    let err = store.get("no/such/key", ByteRange::Last(3)).await.expect_err("missing");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("no/such/key"), "{err}");
    assert_eq!(store.head("no/such/key").await.expect("head"), None);
    store.delete("no/such/key").await.expect("deleting a missing key succeeds");
    let page = store.list("no/", None, 10).await.expect("list");
    assert_eq!(page, s3::ListPage::default());
}
