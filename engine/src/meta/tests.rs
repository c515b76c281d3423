//! Tests of the metadata interface through the embedded store: every operation, the
//! checks and their atomicity, paging, concurrency, group commit, and reopening.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Instant;

use proptest::prelude::*;

use super::*;

use crate::test_support::{STALL_LIMIT, WakeFlag};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Drives futures on this thread, polling each in the order given (so the first poll of
/// each sends its request in that order), until all resolve.
fn join_in_order<T>(futures: Vec<BoxFuture<'_, T>>) -> Vec<T> {
    join_in_order_then(futures, || {})
}

/// [`join_in_order`], calling `after_first_polls` once every future was polled once.
fn join_in_order_then<T>(
    mut futures: Vec<BoxFuture<'_, T>>,
    after_first_polls: impl FnOnce(),
) -> Vec<T> {
    let mut after_first_polls = Some(after_first_polls);
    let flag = WakeFlag::new();
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let deadline = Instant::now() + STALL_LIMIT;
    loop {
        flag.wait(deadline);
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none()
                && let Poll::Ready(value) = future.as_mut().poll(&mut cx)
            {
                *output = Some(value);
            }
        }
        if let Some(after) = after_first_polls.take() {
            after();
        }
        if outputs.iter().all(Option::is_some) {
            return outputs.into_iter().flatten().collect();
        }
    }
}

fn block_on<T>(future: impl Future<Output = T> + Send) -> T {
    join_in_order(vec![Box::pin(future)]).pop().expect("one future, one output")
}

fn open(dir: &tempfile::TempDir) -> RedbMetaStore {
    RedbMetaStore::open(dir.path().join("meta"), RedbMetaOptions::default()).unwrap()
}

fn fresh() -> (tempfile::TempDir, RedbMetaStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    (dir, store)
}

fn keys(page: &ScanPage) -> Vec<&[u8]> {
    page.entries.iter().map(|(key, _)| key.as_slice()).collect()
}

#[test]
fn futures_are_send_and_store_is_shareable() {
    fn send<T: Send>(_: &T) {}
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<RedbMetaStore>();
    let (_dir, store) = fresh();
    send(&store.get(b"k"));
    send(&store.scan(b"k", None, 1));
    send(&store.commit(Txn::new()));
    send(&store.put(b"k".to_vec(), b"v".to_vec()));
    send(&store.close());
}

#[test]
fn get_put_delete() {
    let (_dir, store) = fresh();
    assert_eq!(block_on(store.get(b"k")).unwrap(), None);
    let first = block_on(store.put(b"k".to_vec(), b"one".to_vec())).unwrap();
    assert_eq!(first, Revision(1));
    let got = block_on(store.get(b"k")).unwrap().unwrap();
    assert_eq!(got, Versioned { value: b"one".to_vec(), version: first });
    let empty = block_on(store.put(b"empty".to_vec(), Vec::new())).unwrap();
    assert_eq!(block_on(store.get(b"empty")).unwrap().unwrap().value, b"");
    let deleted = block_on(store.delete(b"k".to_vec())).unwrap();
    assert!(deleted > empty);
    assert_eq!(block_on(store.get(b"k")).unwrap(), None);
    // Deleting an absent key is a write like any other.
    assert!(block_on(store.delete(b"k".to_vec())).unwrap() > deleted);
}

#[test]
fn versions_strictly_increase_and_name_the_last_write() {
    let (_dir, store) = fresh();
    let mut last = Revision::ZERO;
    let mut written = BTreeMap::new();
    for round in 0..20u32 {
        let key = format!("key/{}", round % 3).into_bytes();
        let revision = block_on(store.put(key.clone(), round.to_le_bytes().to_vec())).unwrap();
        assert!(revision > last, "revision {revision} after {last}");
        last = revision;
        written.insert(key, (round, revision));
    }
    for (key, (round, revision)) in written {
        let got = block_on(store.get(&key)).unwrap().unwrap();
        assert_eq!(got, Versioned { value: round.to_le_bytes().to_vec(), version: revision });
    }
    // A multi-key txn gives every key it writes the same version.
    let both = block_on(store.commit(Txn::new().put(b"x".to_vec(), b"1").put(b"y".to_vec(), b"2")))
        .unwrap();
    assert_eq!(both, Revision(last.0 + 1));
    assert_eq!(block_on(store.get(b"x")).unwrap().unwrap().version, both);
    assert_eq!(block_on(store.get(b"y")).unwrap().unwrap().version, both);
    // A txn that only checks writes nothing and returns the current revision.
    let checked = block_on(store.commit(Txn::new().check_value(b"x".to_vec(), b"1"))).unwrap();
    assert_eq!(checked, both);
    assert_eq!(block_on(store.commit(Txn::new())).unwrap(), both);
    assert_eq!(block_on(store.put(b"z".to_vec(), b"3")).unwrap(), Revision(both.0 + 1));
}

#[test]
fn checks_pass_and_fail() {
    let (_dir, store) = fresh();
    let created = block_on(store.create_if_absent(b"k".to_vec(), b"v1")).unwrap();
    let again = block_on(store.create_if_absent(b"k".to_vec(), b"v2"));
    assert_eq!(
        again,
        Err(MetaError::Conflict { check: 0, key: b"k".to_vec(), found: Some(created) })
    );

    let stale = block_on(store.cas(b"k".to_vec(), Revision(created.0 + 7), b"v2"));
    assert_eq!(
        stale,
        Err(MetaError::Conflict { check: 0, key: b"k".to_vec(), found: Some(created) })
    );
    let swapped = block_on(store.cas(b"k".to_vec(), created, b"v2")).unwrap();
    assert!(swapped > created);

    let missing = block_on(store.cas(b"absent".to_vec(), created, b"v"));
    assert_eq!(
        missing,
        Err(MetaError::Conflict { check: 0, key: b"absent".to_vec(), found: None })
    );

    let by_value = Txn::new().check_value(b"k".to_vec(), b"v2").put(b"k".to_vec(), b"v3");
    let valued = block_on(store.commit(by_value)).unwrap();
    let wrong_value = Txn::new().check_value(b"k".to_vec(), b"v2").put(b"k".to_vec(), b"v4");
    assert_eq!(
        block_on(store.commit(wrong_value)),
        Err(MetaError::Conflict { check: 0, key: b"k".to_vec(), found: Some(valued) })
    );
    let absent_value = Txn::new().check_value(b"absent".to_vec(), b"");
    assert_eq!(
        block_on(store.commit(absent_value)),
        Err(MetaError::Conflict { check: 0, key: b"absent".to_vec(), found: None })
    );

    // The error names the first failing check by index.
    let third_fails = Txn::new()
        .check_absent(b"absent".to_vec())
        .check_version(b"k".to_vec(), valued)
        .check_absent(b"k".to_vec())
        .check_absent(b"also-absent".to_vec())
        .put(b"new".to_vec(), b"n");
    assert_eq!(
        block_on(store.commit(third_fails)),
        Err(MetaError::Conflict { check: 2, key: b"k".to_vec(), found: Some(valued) })
    );
    let message = MetaError::Conflict { check: 2, key: b"k\n".to_vec(), found: None }.to_string();
    assert_eq!(message, "metadata txn check 2 failed on key \"k\\n\": found no key");
}

#[test]
fn a_failed_txn_applies_nothing() {
    let (_dir, store) = fresh();
    let base =
        block_on(store.commit(Txn::new().put(b"a".to_vec(), b"a0").put(b"b".to_vec(), b"b0")))
            .unwrap();
    let failing = Txn::new()
        .check_version(b"a".to_vec(), base)
        .check_absent(b"b".to_vec())
        .put(b"a".to_vec(), b"a1")
        .delete(b"b".to_vec())
        .put(b"c".to_vec(), b"c1");
    assert!(matches!(block_on(store.commit(failing)), Err(MetaError::Conflict { check: 1, .. })));
    assert_eq!(
        block_on(store.get(b"a")).unwrap().unwrap(),
        Versioned { value: b"a0".to_vec(), version: base }
    );
    assert_eq!(
        block_on(store.get(b"b")).unwrap().unwrap(),
        Versioned { value: b"b0".to_vec(), version: base }
    );
    assert_eq!(block_on(store.get(b"c")).unwrap(), None);
    // No revision was spent on the failed txn.
    assert_eq!(block_on(store.put(b"d".to_vec(), b"d")).unwrap(), Revision(base.0 + 1));
    let stats = store.stats();
    assert_eq!((stats.txns_applied, stats.txns_conflicted, stats.groups_committed), (2, 1, 2));
}

#[test]
fn scan_pages_by_start_after_and_limit() {
    let (_dir, store) = fresh();
    let mut txn = Txn::new();
    for index in 1..=9u8 {
        txn = txn.put(format!("p/{index}").into_bytes(), vec![index]);
    }
    let revision =
        block_on(store.commit(txn.put(b"o".to_vec(), b"").put(b"q".to_vec(), b""))).unwrap();

    let page = block_on(store.scan(b"p/", None, 4)).unwrap();
    assert_eq!(keys(&page), [b"p/1", b"p/2", b"p/3", b"p/4"]);
    assert!(page.more);
    assert_eq!(page.entries[0].1, Versioned { value: vec![1], version: revision });
    let page = block_on(store.scan(b"p/", Some(b"p/4"), 4)).unwrap();
    assert_eq!(keys(&page), [b"p/5", b"p/6", b"p/7", b"p/8"]);
    assert!(page.more);
    let page = block_on(store.scan(b"p/", Some(b"p/8"), 4)).unwrap();
    assert_eq!(keys(&page), [b"p/9"]);
    assert!(!page.more);
    // A page that ends exactly at the last key says there is no more.
    let page = block_on(store.scan(b"p/", Some(b"p/6"), 3)).unwrap();
    assert_eq!(keys(&page), [b"p/7", b"p/8", b"p/9"]);
    assert!(!page.more);
    // start_after need not exist, and may lie before or after the prefix.
    assert_eq!(keys(&block_on(store.scan(b"p/", Some(b"p/45"), 1)).unwrap()), [b"p/5"]);
    assert_eq!(keys(&block_on(store.scan(b"p/", Some(b"a"), 1)).unwrap()), [b"p/1"]);
    let past = block_on(store.scan(b"p/", Some(b"p/9"), 10)).unwrap();
    assert_eq!(past, ScanPage::default());
    assert_eq!(block_on(store.scan(b"p/", Some(b"z"), 10)).unwrap(), ScanPage::default());
    // A limit over the maximum is cut, not refused.
    let all = block_on(store.scan(b"", None, u32::MAX)).unwrap();
    assert_eq!(all.entries.len(), 11);
    assert!(!all.more);
}

#[test]
fn scan_stays_inside_its_prefix() {
    let (_dir, store) = fresh();
    let stored: [&[u8]; 9] =
        [b"a", b"a/", b"a/x", b"a/\xff", b"a/\xff\xff", b"a0", b"a.", b"b/", b"\xff\xff"];
    let mut txn = Txn::new();
    for key in stored {
        txn = txn.put(key.to_vec(), key.to_vec());
    }
    block_on(store.commit(txn)).unwrap();
    let page = block_on(store.scan(b"a/", None, 100)).unwrap();
    assert_eq!(keys(&page), [&b"a/"[..], b"a/x", b"a/\xff", b"a/\xff\xff"]);
    assert!(!page.more);
    let page = block_on(store.scan(b"a/", None, 4)).unwrap();
    assert!(!page.more, "a0 after the prefix is not more");
    let page = block_on(store.scan(b"\xff", None, 100)).unwrap();
    assert_eq!(keys(&page), [b"\xff\xff"]);
    assert_eq!(block_on(store.scan(b"a/y", None, 100)).unwrap(), ScanPage::default());
    let page = block_on(store.scan(b"", None, 100)).unwrap();
    let mut sorted = stored.to_vec();
    sorted.sort();
    assert_eq!(keys(&page), sorted);
}

#[test]
fn scan_page_is_cut_by_bytes() {
    let (_dir, store) = fresh();
    let value = vec![7u8; VALUE_BYTES_MAX as usize];
    for index in 0..5u8 {
        block_on(store.put(vec![b'v', index], value.clone())).unwrap();
    }
    let page = block_on(store.scan(b"v", None, 100)).unwrap();
    assert_eq!(page.entries.len() as u64, SCAN_BYTES_MAX / VALUE_BYTES_MAX as u64);
    assert!(page.more);
    let last = page.entries.last().unwrap().0.clone();
    let rest = block_on(store.scan(b"v", Some(&last), 100)).unwrap();
    assert_eq!(rest.entries.len(), 5 - page.entries.len());
    assert!(!rest.more);
}

#[test]
fn invalid_requests_are_refused_before_the_store() {
    let (_dir, store) = fresh();
    let long_key = vec![b'k'; KEY_BYTES_MAX as usize + 1];
    let cases = [
        (Txn::new().put(Vec::new(), b"v"), Invalid::KeyEmpty),
        (
            Txn::new().check_absent(long_key.clone()),
            Invalid::KeyTooLarge { size: KEY_BYTES_MAX as u64 + 1, limit: KEY_BYTES_MAX },
        ),
        (
            Txn::new().put(b"k".to_vec(), vec![0; VALUE_BYTES_MAX as usize + 1]),
            Invalid::ValueTooLarge { size: VALUE_BYTES_MAX as u64 + 1, limit: VALUE_BYTES_MAX },
        ),
        (
            Txn::new().put(b"k".to_vec(), b"1").delete(b"j".to_vec()).delete(b"k".to_vec()),
            Invalid::DuplicateWrite { key: b"k".to_vec() },
        ),
    ];
    for (txn, invalid) in cases {
        assert_eq!(block_on(store.commit(txn)), Err(MetaError::Invalid(invalid)));
    }
    let mut many = Txn::new();
    for index in 0..=TXN_OPS_MAX {
        many = many.check_absent(index.to_le_bytes().to_vec());
    }
    assert_eq!(
        block_on(store.commit(many)),
        Err(MetaError::Invalid(Invalid::TxnTooManyOps {
            ops: TXN_OPS_MAX as u64 + 1,
            limit: TXN_OPS_MAX
        }))
    );
    let big = vec![0u8; VALUE_BYTES_MAX as usize];
    let heavy = Txn::new().put(b"a".to_vec(), big.clone()).put(b"b".to_vec(), big);
    assert!(matches!(
        block_on(store.commit(heavy)),
        Err(MetaError::Invalid(Invalid::TxnTooLarge { .. }))
    ));
    assert_eq!(block_on(store.get(b"")), Err(MetaError::Invalid(Invalid::KeyEmpty)));
    assert_eq!(block_on(store.scan(b"", None, 0)), Err(MetaError::Invalid(Invalid::ScanLimitZero)));
    assert_eq!(block_on(store.scan(b"", Some(b""), 1)), Err(MetaError::Invalid(Invalid::KeyEmpty)));
    // A key at the limit and a check of a key it writes are fine.
    let at_limit = vec![b'k'; KEY_BYTES_MAX as usize];
    block_on(store.commit(Txn::new().check_absent(at_limit.clone()).put(at_limit, b"v"))).unwrap();
    let stats = store.stats();
    assert_eq!((stats.txns_applied, stats.txns_conflicted, stats.reads_served), (1, 0, 0));
}

#[test]
fn racing_creates_make_one_winner() {
    const TASKS: usize = 32;
    let (_dir, store) = fresh();
    for round in 0..5u32 {
        let key = format!("bucket/b/stream/{round}").into_bytes();
        let start = Arc::new(Barrier::new(TASKS));
        let racers: Vec<_> = (0..TASKS)
            .map(|task| {
                let (store, start, key) = (store.clone(), Arc::clone(&start), key.clone());
                thread::spawn(move || {
                    start.wait();
                    block_on(store.create_if_absent(key, format!("task {task}")))
                })
            })
            .collect();
        let outcomes: Vec<_> = racers.into_iter().map(|racer| racer.join().unwrap()).collect();
        let winners: Vec<_> =
            outcomes.iter().enumerate().filter(|(_, outcome)| outcome.is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let (winner, Ok(revision)) = winners[0] else { unreachable!() };
        for outcome in &outcomes {
            if let Err(error) = outcome {
                assert_eq!(
                    error,
                    &MetaError::Conflict { check: 0, key: key.clone(), found: Some(*revision) }
                );
            }
        }
        let stored = block_on(store.get(&key)).unwrap().unwrap();
        assert_eq!(
            stored,
            Versioned { value: format!("task {winner}").into_bytes(), version: *revision }
        );
    }
}

/// Holds the store thread, queues one exact group in a known order, and checks that
/// it commits with one fsync and that each txn saw the ones before it.
#[test]
fn a_group_commits_once_and_each_txn_sees_the_earlier_ones() {
    let (_dir, store) = fresh();
    let base = block_on(store.put(b"other".to_vec(), b"o")).unwrap();
    let before = store.stats();
    let (release, released) = flume::bounded(1);
    store.hold(released).unwrap();

    enum Out {
        Commit(Result<Revision, MetaError>),
        Get(Result<Option<Versioned>, MetaError>),
    }
    let commit = |txn: Txn| -> BoxFuture<'_, Out> {
        let store = &store;
        Box::pin(async move { Out::Commit(store.commit(txn).await) })
    };
    let r = |n: u64| Revision(base.0 + n);
    let futures = vec![
        commit(Txn::new().check_absent(b"k".to_vec()).put(b"k".to_vec(), b"v1")),
        commit(Txn::new().check_absent(b"k".to_vec()).put(b"k".to_vec(), b"lost")),
        commit(Txn::new().check_version(b"k".to_vec(), r(1)).put(b"k".to_vec(), b"v2")),
        commit(Txn::new().check_value(b"k".to_vec(), b"v1").put(b"k".to_vec(), b"lost")),
        commit(Txn::new().check_value(b"k".to_vec(), b"v2")),
        Box::pin(async { Out::Get(store.get(b"k").await) }),
        commit(
            Txn::new()
                .check_version(b"other".to_vec(), base)
                .delete(b"other".to_vec())
                .put(b"x".to_vec(), b""),
        ),
        commit(Txn::new().check_absent(b"other".to_vec()).put(b"other".to_vec(), b"o2")),
    ];
    // Every request is queued, in order, before the store thread is released.
    let outs = join_in_order_then(futures, || release.send(()).unwrap());

    let got: Vec<String> = outs
        .iter()
        .map(|out| match out {
            Out::Commit(result) => format!("{result:?}"),
            Out::Get(result) => format!("{result:?}"),
        })
        .collect();
    let expected = [
        format!("{:?}", Ok::<_, MetaError>(r(1))),
        format!(
            "{:?}",
            Err::<Revision, _>(MetaError::Conflict {
                check: 0,
                key: b"k".to_vec(),
                found: Some(r(1))
            })
        ),
        format!("{:?}", Ok::<_, MetaError>(r(2))),
        format!(
            "{:?}",
            Err::<Revision, _>(MetaError::Conflict {
                check: 0,
                key: b"k".to_vec(),
                found: Some(r(2))
            })
        ),
        format!("{:?}", Ok::<_, MetaError>(r(2))),
        // The read is answered from the state before the group: nothing of it was
        // acknowledged yet.
        format!("{:?}", Ok::<_, MetaError>(None::<Versioned>)),
        format!("{:?}", Ok::<_, MetaError>(r(3))),
        format!("{:?}", Ok::<_, MetaError>(r(4))),
    ];
    assert_eq!(got, expected);
    let after = store.stats();
    assert_eq!(after.groups_committed - before.groups_committed, 1, "{before:?} -> {after:?}");
    assert_eq!(after.txns_applied - before.txns_applied, 5);
    assert_eq!(after.txns_conflicted - before.txns_conflicted, 2);
    assert_eq!(
        block_on(store.get(b"k")).unwrap().unwrap(),
        Versioned { value: b"v2".to_vec(), version: r(2) }
    );
    assert_eq!(
        block_on(store.get(b"other")).unwrap().unwrap(),
        Versioned { value: b"o2".to_vec(), version: r(4) }
    );
    assert_eq!(block_on(store.get(b"x")).unwrap().unwrap().version, r(3));
}

/// Threads increment one counter with compare-and-set while group commit batches their
/// txns: every increment must be counted exactly once. Prints txns per fsync.
#[test]
fn concurrent_cas_increments_are_each_applied_once() {
    const THREADS: usize = 16;
    const INCREMENTS_PER_THREAD: u64 = 25;
    const ATTEMPTS_MAX: u32 = 100_000;
    let (_dir, store) = fresh();
    block_on(store.put(b"counter".to_vec(), 0u64.to_le_bytes())).unwrap();
    let before = store.stats();
    let started = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let store = store.clone();
            thread::spawn(move || {
                let mut won_from = Vec::new();
                let mut attempts = 0;
                while (won_from.len() as u64) < INCREMENTS_PER_THREAD {
                    attempts += 1;
                    assert!(attempts <= ATTEMPTS_MAX, "no progress");
                    let current = block_on(store.get(b"counter")).unwrap().unwrap();
                    let count = u64::from_le_bytes(current.value.as_slice().try_into().unwrap());
                    match block_on(store.cas(
                        b"counter".to_vec(),
                        current.version,
                        (count + 1).to_le_bytes(),
                    )) {
                        Ok(revision) => {
                            assert!(revision > current.version);
                            won_from.push(count);
                        }
                        Err(MetaError::Conflict { found: Some(found), .. }) => {
                            assert!(found > current.version);
                        }
                        Err(error) => panic!("{error}"),
                    }
                }
                won_from
            })
        })
        .collect();
    let mut won_from: Vec<u64> =
        workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect();
    let elapsed = started.elapsed();
    let total = THREADS as u64 * INCREMENTS_PER_THREAD;
    won_from.sort_unstable();
    assert_eq!(won_from, (0..total).collect::<Vec<_>>(), "each count was incremented exactly once");
    let counter = block_on(store.get(b"counter")).unwrap().unwrap();
    assert_eq!(counter.value, total.to_le_bytes());
    let after = store.stats();
    let fsyncs = after.groups_committed - before.groups_committed;
    let applied = after.txns_applied - before.txns_applied;
    assert_eq!(applied, total);
    println!(
        "{total} increments by {THREADS} threads in {elapsed:?}: {fsyncs} fsyncs, {} conflicts, \
         {:.2} txns per fsync, {:.0} commits/s",
        after.txns_conflicted - before.txns_conflicted,
        (applied + after.txns_conflicted - before.txns_conflicted) as f64 / fsyncs.max(1) as f64,
        total as f64 / elapsed.as_secs_f64(),
    );
}

/// Independent writers (no conflicts): each gets its own answer, and txns share fsyncs.
/// Prints the rate against one writer's, measured first in the same run.
#[test]
fn concurrent_writers_share_fsyncs() {
    const THREADS: usize = 32;
    const PUTS_PER_THREAD: usize = 40;
    const SOLO_PUTS: usize = 200;
    let (_dir, store) = fresh();
    let solo_started = Instant::now();
    for index in 0..SOLO_PUTS {
        block_on(store.put(format!("solo/{index}"), b"")).unwrap();
    }
    let solo_per_second = SOLO_PUTS as f64 / solo_started.elapsed().as_secs_f64();
    let solo = store.stats();
    assert_eq!(solo.groups_committed, SOLO_PUTS as u64, "one writer: one fsync per commit");
    let started = Instant::now();
    let writers: Vec<_> = (0..THREADS)
        .map(|writer| {
            let store = store.clone();
            thread::spawn(move || {
                let mut last = Revision::ZERO;
                for index in 0..PUTS_PER_THREAD {
                    let key = format!("w/{writer:02}/{index:04}");
                    let revision = block_on(store.create_if_absent(key.clone(), key)).unwrap();
                    assert!(revision > last);
                    last = revision;
                }
            })
        })
        .collect();
    writers.into_iter().for_each(|writer| writer.join().unwrap());
    let elapsed = started.elapsed();
    let stats = store.stats();
    let total = (THREADS * PUTS_PER_THREAD) as u64;
    assert_eq!(stats.txns_applied - solo.txns_applied, total);
    let fsyncs = stats.groups_committed - solo.groups_committed;
    let mut seen = 0;
    let mut after: Option<Vec<u8>> = None;
    for _ in 0..total {
        let page = block_on(store.scan(b"w/", after.as_deref(), 1000)).unwrap();
        for (key, versioned) in &page.entries {
            assert_eq!(key, &versioned.value);
        }
        seen += page.entries.len() as u64;
        after = page.entries.last().map(|(key, _)| key.clone());
        if !page.more {
            break;
        }
    }
    assert_eq!(seen, total);
    println!(
        "one writer: {solo_per_second:.0} commits/s; {total} creates by {THREADS} threads in \
         {elapsed:?}: {fsyncs} fsyncs, {:.2} txns per fsync, {:.0} commits/s ({:.1}x one writer)",
        total as f64 / fsyncs.max(1) as f64,
        total as f64 / elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64() / solo_per_second,
    );
}

#[test]
fn state_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir);
    let first = block_on(store.create_if_absent(b"kept".to_vec(), b"1")).unwrap();
    block_on(store.put(b"gone".to_vec(), b"2")).unwrap();
    let deleted = block_on(store.delete(b"gone".to_vec())).unwrap();
    block_on(store.close()).unwrap();
    assert_eq!(block_on(store.get(b"kept")), Err(MetaError::Closed));
    assert_eq!(block_on(store.put(b"late".to_vec(), b"")), Err(MetaError::Closed));
    block_on(store.close()).unwrap();
    drop(store);

    let store = open(&dir);
    assert_eq!(
        block_on(store.get(b"kept")).unwrap().unwrap(),
        Versioned { value: b"1".to_vec(), version: first }
    );
    assert_eq!(block_on(store.get(b"gone")).unwrap(), None);
    assert_eq!(block_on(store.get(b"late")).unwrap(), None);
    // The revision continues where it stopped.
    assert_eq!(block_on(store.put(b"next".to_vec(), b"")).unwrap(), Revision(deleted.0 + 1));
    // Dropping the last handle closes the store too, so it reopens at once.
    let clone = store.clone();
    drop(store);
    block_on(clone.put(b"after-drop".to_vec(), b"")).unwrap();
    drop(clone);
    let store = open(&dir);
    assert_eq!(
        block_on(store.get(b"after-drop")).unwrap().unwrap().version,
        Revision(deleted.0 + 2)
    );
}

#[test]
fn a_second_open_of_one_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _store = open(&dir);
    let second = RedbMetaStore::open(dir.path().join("meta"), RedbMetaOptions::default());
    assert!(matches!(second, Err(MetaError::Io { .. })), "{second:?}");
}

#[test]
fn an_unknown_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("meta")).unwrap();
    {
        let db = redb::Database::create(dir.path().join("meta").join("meta.redb")).unwrap();
        let write = db.begin_write().unwrap();
        write
            .open_table(redb::TableDefinition::<&str, u64>::new("sys"))
            .unwrap()
            .insert("format", 99)
            .unwrap();
        write.commit().unwrap();
    }
    let opened = RedbMetaStore::open(dir.path().join("meta"), RedbMetaOptions::default());
    assert!(matches!(opened, Err(MetaError::Corrupt { .. })), "{opened:?}");
}

/// One random operation of the model test.
#[derive(Clone, Debug)]
enum Op {
    Commit(Txn),
    Get(Vec<u8>),
    Scan { prefix: Vec<u8>, start_after: Option<Vec<u8>>, limit: u32 },
}

const MODEL_KEYS: [&[u8]; 6] = [b"a", b"a/", b"a/1", b"a/2", b"a0", b"b"];

fn model_key() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(MODEL_KEYS.to_vec()).prop_map(<[u8]>::to_vec)
}

fn model_value() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..3, 0..2)
}

fn model_op() -> impl Strategy<Value = Op> {
    let check = prop_oneof![
        model_key().prop_map(Check::Absent),
        (model_key(), 0u64..12).prop_map(|(key, version)| Check::VersionIs(key, Revision(version))),
        (model_key(), model_value()).prop_map(|(key, value)| Check::ValueIs(key, value)),
    ];
    let write = prop_oneof![
        (model_key(), model_value()).prop_map(|(key, value)| Write::Put(key, value)),
        model_key().prop_map(Write::Delete),
    ];
    let txn = (prop::collection::vec(check, 0..3), prop::collection::vec(write, 0..3)).prop_map(
        |(checks, mut writes)| {
            writes.sort_by(|a, b| a.key().cmp(b.key()));
            writes.dedup_by(|a, b| a.key() == b.key());
            Txn { checks, writes }
        },
    );
    let prefix =
        prop::sample::select(vec![&b""[..], b"a", b"a/", b"b", b"c"]).prop_map(<[u8]>::to_vec);
    prop_oneof![
        4 => txn.prop_map(Op::Commit),
        1 => model_key().prop_map(Op::Get),
        1 => (prefix, prop::option::of(model_key()), 1u32..4)
            .prop_map(|(prefix, start_after, limit)| Op::Scan { prefix, start_after, limit }),
    ]
}

/// The reference: a sorted map and a revision counter.
#[derive(Default)]
struct Model {
    rows: BTreeMap<Vec<u8>, Versioned>,
    revision: Revision,
}

impl Model {
    fn commit(&mut self, txn: &Txn) -> Result<Revision, MetaError> {
        for (index, check) in txn.checks.iter().enumerate() {
            let current = self.rows.get(check.key());
            if !check.holds(current.map(|row| (row.value.as_slice(), row.version))) {
                return Err(MetaError::Conflict {
                    check: u32::try_from(index).unwrap(),
                    key: check.key().to_vec(),
                    found: current.map(|row| row.version),
                });
            }
        }
        if !txn.writes.is_empty() {
            self.revision = Revision(self.revision.0 + 1);
        }
        for write in &txn.writes {
            match write {
                Write::Put(key, value) => {
                    self.rows.insert(
                        key.clone(),
                        Versioned { value: value.clone(), version: self.revision },
                    );
                }
                Write::Delete(key) => {
                    self.rows.remove(key);
                }
            }
        }
        Ok(self.revision)
    }

    fn scan(&self, prefix: &[u8], start_after: Option<&[u8]>, limit: u32) -> ScanPage {
        let mut matching = self.rows.iter().filter(|(key, _)| {
            key.starts_with(prefix) && start_after.is_none_or(|after| key.as_slice() > after)
        });
        let entries: Vec<_> = matching
            .by_ref()
            .take(limit as usize)
            .map(|(key, row)| (key.clone(), row.clone()))
            .collect();
        ScanPage { entries, more: matching.next().is_some() }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random operations against the store and a model. Commits are sent in bursts that
    /// the store groups; reads run alone, after the burst before them.
    #[test]
    fn the_store_matches_a_model(ops in prop::collection::vec(model_op(), 1..40), burst in 1usize..6) {
        let (dir, store) = fresh();
        let mut model = Model::default();
        let mut pending: Vec<Txn> = Vec::new();
        let flush = |pending: &mut Vec<Txn>, model: &mut Model| {
            let futures: Vec<BoxFuture<'_, _>> =
                pending.iter().map(|txn| Box::pin(store.commit(txn.clone())) as Pin<Box<_>>).collect();
            let results = join_in_order(futures);
            for (txn, result) in pending.drain(..).zip(results) {
                assert_eq!(result, model.commit(&txn), "{txn:?}");
            }
        };
        for op in ops {
            match op {
                Op::Commit(txn) => {
                    pending.push(txn);
                    if pending.len() >= burst {
                        flush(&mut pending, &mut model);
                    }
                }
                Op::Get(key) => {
                    flush(&mut pending, &mut model);
                    prop_assert_eq!(block_on(store.get(&key)).unwrap(), model.rows.get(&key).cloned());
                }
                Op::Scan { prefix, start_after, limit } => {
                    flush(&mut pending, &mut model);
                    let page = block_on(store.scan(&prefix, start_after.as_deref(), limit)).unwrap();
                    prop_assert_eq!(page, model.scan(&prefix, start_after.as_deref(), limit));
                }
            }
        }
        flush(&mut pending, &mut model);
        drop(store);
        let store = open(&dir);
        let all = block_on(store.scan(b"", None, 100)).unwrap();
        prop_assert_eq!(all, model.scan(b"", None, 100));
        if model.revision > Revision::ZERO {
            // The reopened store continues the revision.
            prop_assert_eq!(block_on(store.put(b"z".to_vec(), b"")).unwrap(), Revision(model.revision.0 + 1));
        }
    }
}
