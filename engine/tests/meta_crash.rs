//! Kill -9 test of the embedded metadata store.
//!
//! The test re-executes its own binary as a writer child (selected by an environment
//! variable) that commits as fast as it can from several threads and prints each
//! acknowledged mutation. The parent reads acknowledgements for a random short time,
//! SIGKILLs the child, reopens the store and checks that every acknowledged mutation is
//! there, that multi-key transactions are all-or-nothing, and that the store keeps
//! working; several rounds on one directory.
//!
//! A failing seed replays with `NOVA_META_CRASH_SEED=<seed>`.

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use engine::meta::{MetaError, MetaStore, RedbMetaOptions, RedbMetaStore, Revision, Txn};

use common::crash::{self, Rng, block_on};

const TEST_NAME: &str = "kill9_keeps_every_acknowledged_mutation";
/// Set in the child: the store directory to write to. Its presence selects writer mode.
const WRITER_DIR_ENV: &str = "NOVA_META_CRASH_WRITER_DIR";
const WRITER_ROUND_ENV: &str = "NOVA_META_CRASH_ROUND";
const SEED_ENV: &str = "NOVA_META_CRASH_SEED";
const ROUNDS: u32 = 6;
const WRITER_THREADS: u32 = 4;
/// A writer thread stops after this many mutations or this long, whichever comes first;
/// the parent kills it long before.
const WRITER_MUTATIONS_MAX: u64 = 1_000_000;
const WRITER_TIME_MAX: Duration = Duration::from_secs(60);
/// Acknowledgements the parent reads after the first one, before the kill: random up to.
const RUN_BEFORE_KILL_MS_MAX: u64 = 300;

/// What the child acknowledged, one line each on stdout (after the commit resolved):
///
/// - `ACK CREATE <key> <revision>`: `key` was created with value = key.
/// - `ACK PAIR <key-a> <key-b> <revision>`: both were created in one txn.
/// - `ACK DELETE <key> <revision>`: `key` was deleted (and is never written again).
/// - `ACK COUNT <key> <count> <revision>`: the counter was compare-and-set to `count`.
#[derive(Debug)]
enum Ack {
    Create { key: String, revision: u64 },
    Pair { a: String, b: String, revision: u64 },
    Delete { key: String, revision: u64 },
    Count { key: String, count: u64, revision: u64 },
}

fn parse_ack(line: &str) -> Option<Ack> {
    let words: Vec<&str> = line.strip_prefix("ACK ")?.split(' ').collect();
    let number = |word: &str| word.parse::<u64>().ok();
    Some(match words.as_slice() {
        ["CREATE", key, revision] => {
            Ack::Create { key: key.to_string(), revision: number(revision)? }
        }
        ["PAIR", a, b, revision] => {
            Ack::Pair { a: a.to_string(), b: b.to_string(), revision: number(revision)? }
        }
        ["DELETE", key, revision] => {
            Ack::Delete { key: key.to_string(), revision: number(revision)? }
        }
        ["COUNT", key, count, revision] => {
            Ack::Count { key: key.to_string(), count: number(count)?, revision: number(revision)? }
        }
        _ => return None,
    })
}

fn ack(line: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    stdout.write_fmt(line).expect("stdout is the parent's pipe");
    stdout.write_all(b"\n").expect("stdout is the parent's pipe");
    stdout.flush().expect("stdout is the parent's pipe");
}

/// The child: commits from several threads until killed (or the bounds end it).
fn write_until_killed(dir: &Path, round: u32) {
    let store = RedbMetaStore::open(dir, RedbMetaOptions::default()).expect("open in the child");
    let started = Instant::now();
    let writers: Vec<_> = (0..WRITER_THREADS)
        .map(|thread_index| {
            let store = store.clone();
            thread::spawn(move || {
                let counter = format!("count/{thread_index}");
                let current = block_on(store.get(counter.as_bytes())).expect("read the counter");
                let (mut count, mut version) = match current {
                    Some(found) => (
                        u64::from_le_bytes(
                            found.value.as_slice().try_into().expect("8-byte counter"),
                        ),
                        found.version,
                    ),
                    None => (0, Revision::ZERO),
                };
                for index in 0..WRITER_MUTATIONS_MAX {
                    if started.elapsed() > WRITER_TIME_MAX {
                        return;
                    }
                    let name = format!("{round}/{thread_index}/{index}");
                    match index % 4 {
                        0 => {
                            let key = format!("create/{name}");
                            let revision =
                                block_on(store.create_if_absent(key.clone(), key.clone()))
                                    .expect("create a fresh key");
                            ack(format_args!("ACK CREATE {key} {revision}"));
                        }
                        1 => {
                            let (a, b) = (format!("pair-a/{name}"), format!("pair-b/{name}"));
                            let txn = Txn::new()
                                .check_absent(a.clone())
                                .check_absent(b.clone())
                                .put(a.clone(), a.clone())
                                .put(b.clone(), b.clone());
                            let revision =
                                block_on(store.commit(txn)).expect("create a fresh pair");
                            ack(format_args!("ACK PAIR {a} {b} {revision}"));
                        }
                        2 => {
                            let key = format!("delete/{name}");
                            block_on(store.create_if_absent(key.clone(), key.clone()))
                                .expect("create a fresh key");
                            let revision = block_on(store.delete(key.clone())).expect("delete");
                            ack(format_args!("ACK DELETE {key} {revision}"));
                        }
                        _ => {
                            let next = count + 1;
                            let txn = if version == Revision::ZERO {
                                Txn::new().check_absent(counter.clone())
                            } else {
                                Txn::new().check_version(counter.clone(), version)
                            };
                            // Only this thread writes its counter, so the check holds.
                            version = block_on(
                                store.commit(txn.put(counter.clone(), next.to_le_bytes())),
                            )
                            .expect("advance the counter");
                            count = next;
                            ack(format_args!("ACK COUNT {counter} {count} {version}"));
                        }
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("a writer thread panicked");
    }
}

/// Runs one child until a random moment after its first acknowledgement, SIGKILLs it,
/// and returns every acknowledgement it printed.
fn run_and_kill(dir: &Path, round: u32, rng: &mut Rng) -> Vec<Ack> {
    let run_for = Duration::from_millis(rng.below(RUN_BEFORE_KILL_MS_MAX) + 1);
    let envs = [(WRITER_DIR_ENV, dir.display().to_string()), (WRITER_ROUND_ENV, round.to_string())];
    let acks = crash::run_and_kill(TEST_NAME, &envs, parse_checked, |_| true, run_for);
    println!("round {round}: killed after {run_for:?} and {} acknowledgements", acks.len());
    acks
}

/// An acknowledgement, or `None` for other output; a malformed acknowledgement fails.
fn parse_checked(line: &str) -> Option<Ack> {
    let ack = parse_ack(line);
    assert!(ack.is_some() || !line.starts_with("ACK"), "unparsable acknowledgement {line:?}");
    ack
}

/// Every acknowledged mutation of every round so far, as the expected final state.
#[derive(Default)]
struct Expected {
    /// Created keys (never touched again): their exact revision.
    created: BTreeMap<String, u64>,
    /// Deleted keys (never written again).
    deleted: BTreeMap<String, u64>,
    /// Counters: the highest acknowledged count and its revision. A later write may be
    /// durable without having been acknowledged, so the store may be ahead of this.
    counts: BTreeMap<String, (u64, u64)>,
    /// The highest acknowledged revision.
    revision: u64,
}

impl Expected {
    fn add(&mut self, ack: Ack) {
        let revision = match ack {
            Ack::Create { key, revision } => {
                self.created.insert(key, revision);
                revision
            }
            Ack::Pair { a, b, revision } => {
                self.created.insert(a, revision);
                self.created.insert(b, revision);
                revision
            }
            Ack::Delete { key, revision } => {
                self.deleted.insert(key, revision);
                revision
            }
            Ack::Count { key, count, revision } => {
                let entry = self.counts.entry(key).or_default();
                if count > entry.0 {
                    *entry = (count, revision);
                }
                revision
            }
        };
        self.revision = self.revision.max(revision);
    }
}

/// Reads the whole store in pages.
fn scan_all(store: &RedbMetaStore, prefix: &str) -> BTreeMap<String, (Vec<u8>, u64)> {
    const PAGES_MAX: usize = 100_000;
    let mut rows = BTreeMap::new();
    let mut after: Option<Vec<u8>> = None;
    for _ in 0..PAGES_MAX {
        let page = block_on(store.scan(prefix.as_bytes(), after.as_deref(), 1000)).expect("scan");
        after = page.entries.last().map(|(key, _)| key.clone());
        for (key, versioned) in page.entries {
            let key = String::from_utf8(key).expect("the writer writes UTF-8 keys");
            rows.insert(key, (versioned.value, versioned.version.get()));
        }
        if !page.more {
            return rows;
        }
    }
    panic!("more than {PAGES_MAX} pages under {prefix:?}");
}

fn verify(store: &RedbMetaStore, expected: &Expected, round: u32) {
    for (key, revision) in &expected.created {
        let found = block_on(store.get(key.as_bytes())).expect("get");
        let found = found.unwrap_or_else(|| panic!("round {round}: acknowledged {key} is missing"));
        assert_eq!(found.value, key.as_bytes(), "round {round}: value of {key}");
        assert_eq!(found.version.get(), *revision, "round {round}: version of {key}");
    }
    for (key, revision) in &expected.deleted {
        let found = block_on(store.get(key.as_bytes())).expect("get");
        assert_eq!(found, None, "round {round}: {key} deleted at {revision} is back");
    }
    for (key, (count, revision)) in &expected.counts {
        let found = block_on(store.get(key.as_bytes())).expect("get");
        let found = found.unwrap_or_else(|| panic!("round {round}: counter {key} is missing"));
        let stored = u64::from_le_bytes(found.value.as_slice().try_into().expect("8-byte counter"));
        assert!(stored >= *count, "round {round}: {key} is {stored}, acknowledged {count}");
        if stored == *count {
            assert_eq!(found.version.get(), *revision, "round {round}: version of {key}");
        } else {
            assert!(found.version.get() > *revision, "round {round}: version of {key}");
        }
    }
    // Pairs are all or nothing, acknowledged or not.
    let a_side = scan_all(store, "pair-a/");
    let b_side = scan_all(store, "pair-b/");
    let a_names: Vec<_> =
        a_side.iter().map(|(key, (_, revision))| (&key["pair-a/".len()..], revision)).collect();
    let b_names: Vec<_> =
        b_side.iter().map(|(key, (_, revision))| (&key["pair-b/".len()..], revision)).collect();
    assert_eq!(a_names, b_names, "round {round}: a pair was torn");
    // The revision moves on past every stored version and every acknowledged revision
    // (a delete's revision is stored on no key, but the store's revision covers it).
    let all = scan_all(store, "");
    let highest = all.values().map(|(_, revision)| *revision).max().unwrap_or(0);
    let next = block_on(store.put(format!("parent/{round}"), b"".to_vec()))
        .expect("the store keeps working");
    assert!(next.get() > highest, "round {round}: revision {next} after version {highest}");
    assert!(
        next.get() > expected.revision,
        "round {round}: revision {next} after acknowledged {}",
        expected.revision
    );
    let raced = block_on(store.create_if_absent(format!("parent/{round}"), b"".to_vec()));
    assert!(matches!(raced, Err(MetaError::Conflict { .. })), "round {round}: {raced:?}");
}

#[test]
fn kill9_keeps_every_acknowledged_mutation() {
    if let Some(dir) = std::env::var_os(WRITER_DIR_ENV) {
        let round = std::env::var(WRITER_ROUND_ENV).ok().and_then(|round| round.parse().ok());
        write_until_killed(Path::new(&dir), round.expect("the parent sets the round"));
        return;
    }
    let mut rng = Rng::seeded(SEED_ENV);
    let temp = tempfile::tempdir().expect("a temporary directory");
    let dir = temp.path().join("meta");
    let mut expected = Expected::default();
    for round in 0..ROUNDS {
        for ack in run_and_kill(&dir, round, &mut rng) {
            expected.add(ack);
        }
        let store =
            RedbMetaStore::open(&dir, RedbMetaOptions::default()).expect("reopen after the kill");
        verify(&store, &expected, round);
        block_on(store.close()).expect("close");
    }
    assert!(
        !expected.created.is_empty() && !expected.deleted.is_empty() && !expected.counts.is_empty()
    );
}
