//! Kill -9 test of the control plane over the embedded metadata store.
//!
//! The test re-executes its own binary as a child (selected by an environment variable)
//! that creates and deletes streams from several threads and prints each acknowledged
//! verb with the stream's ID. The parent SIGKILLs the child at a random moment, reopens
//! the store and checks that every acknowledged stream is there with its ID, that every
//! acknowledged deletion held, and that addresses and stream rows agree (no address leads
//! to a dead row, no live row lacks its address); several rounds on one directory.
//!
//! A failing seed replays with `NOVA_CONTROL_CRASH_SEED=<seed>`.

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use engine::Error;
use engine::control::{ControlPlane, Door};
use engine::ids::StreamId;
use engine::meta::{MetaStore, RedbMetaOptions, RedbMetaStore};
use engine::names::{BucketName, StreamKey};
use engine::options::{BucketConfigRequest, StreamOptionsRequest};

use common::crash::{self, Rng, block_on};

const TEST_NAME: &str = "kill9_keeps_every_acknowledged_stream";
/// Set in the child: the store directory. Its presence selects the child's mode.
const CHILD_DIR_ENV: &str = "NOVA_CONTROL_CRASH_DIR";
const CHILD_ROUND_ENV: &str = "NOVA_CONTROL_CRASH_ROUND";
const SEED_ENV: &str = "NOVA_CONTROL_CRASH_SEED";
const BUCKET: &str = "crash";
const ROUNDS: u32 = 4;
const CHILD_THREADS: u32 = 4;
/// A child thread stops after this many verbs or this long; the parent kills it first.
const CHILD_VERBS_MAX: u32 = 100_000;
const CHILD_TIME_MAX: Duration = Duration::from_secs(60);
const RUN_BEFORE_KILL_MS_MAX: u64 = 300;

fn bucket() -> BucketName {
    BucketName::parse(BUCKET).expect("a valid bucket name")
}

fn stream_key(text: &str) -> StreamKey {
    StreamKey::parse(text).expect("the child makes valid keys")
}

/// One acknowledged verb, a line each on stdout (after the verb returned):
/// `CREATED <key> <id>` (explicit create or autocreate) or `DELETED <key> <id>`.
#[derive(Debug)]
enum Ack {
    Created { key: String, id: StreamId },
    Deleted { key: String, id: StreamId },
}

fn parse_ack(line: &str) -> Option<Ack> {
    // The test harness may print "test <name> ... " on the line before the first ack.
    let start = [line.find("CREATED "), line.find("DELETED ")].into_iter().flatten().min()?;
    let words: Vec<&str> = line[start..].split(' ').collect();
    Some(match words.as_slice() {
        ["CREATED", key, id] => Ack::Created { key: key.to_string(), id: StreamId::from_hex(id)? },
        ["DELETED", key, id] => Ack::Deleted { key: key.to_string(), id: StreamId::from_hex(id)? },
        _ => return None,
    })
}

fn ack(line: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    stdout.write_fmt(line).expect("stdout is the parent's pipe");
    stdout.write_all(b"\n").expect("stdout is the parent's pipe");
    stdout.flush().expect("stdout is the parent's pipe");
}

/// The child: creates streams (every other one by autocreate) and deletes every third
/// one it created, until killed.
fn run_until_killed(dir: &Path, round: u32) {
    let store = RedbMetaStore::open(dir, RedbMetaOptions::default()).expect("open in the child");
    let control = ControlPlane::new(store);
    let autocreating = BucketConfigRequest { create_stream_on_append: true, ..Default::default() };
    block_on(control.ensure_bucket(&bucket(), &autocreating)).expect("ensure the bucket");
    let started = Instant::now();
    let workers: Vec<_> = (0..CHILD_THREADS)
        .map(|worker| {
            let control = control.clone();
            thread::spawn(move || {
                for index in 0..CHILD_VERBS_MAX {
                    if started.elapsed() > CHILD_TIME_MAX {
                        return;
                    }
                    let key = format!("r{round}/w{worker}/{index}");
                    let address = stream_key(&key);
                    let id = if index % 2 == 0 {
                        let created = block_on(control.create_stream(
                            &bucket(),
                            &address,
                            &StreamOptionsRequest::default(),
                            None,
                        ));
                        created.expect("create a fresh address").record.id
                    } else {
                        let resolved = block_on(control.resolve(&bucket(), &address, Door::Append));
                        resolved.expect("autocreate a fresh address").record.id
                    };
                    ack(format_args!("CREATED {key} {id}"));
                    if meant_to_delete(&key) {
                        let deleted =
                            block_on(control.delete_stream(&bucket(), &address, Some(id)))
                                .expect("delete what this thread created");
                        assert!(!deleted.already);
                        ack(format_args!("DELETED {key} {id}"));
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a child thread panicked");
    }
}

fn run_and_kill(dir: &Path, round: u32, rng: &mut Rng) -> Vec<Ack> {
    let run_for = Duration::from_millis(rng.below(RUN_BEFORE_KILL_MS_MAX) + 1);
    let envs = [(CHILD_DIR_ENV, dir.display().to_string()), (CHILD_ROUND_ENV, round.to_string())];
    let acks = crash::run_and_kill(TEST_NAME, &envs, parse_checked, |_| true, run_for);
    println!("round {round}: killed after {run_for:?} and {} acknowledgements", acks.len());
    acks
}

/// An acknowledgement, or `None` for other output; a malformed acknowledgement fails.
fn parse_checked(line: &str) -> Option<Ack> {
    let ack = parse_ack(line);
    assert!(
        ack.is_some() || (!line.contains("CREATED") && !line.contains("DELETED")),
        "unparsable acknowledgement {line:?}"
    );
    ack
}

/// Whether the child deletes the stream at `key` right after creating it.
fn meant_to_delete(key: &str) -> bool {
    let index = key.rsplit('/').next().and_then(|index| index.parse::<u32>().ok());
    index.expect("the child's keys end in an index").is_multiple_of(3)
}

fn verify(control: &ControlPlane<RedbMetaStore>, expected: &BTreeMap<String, (StreamId, bool)>) {
    for (key, (id, deleted)) in expected {
        let address = stream_key(key);
        let by_id = block_on(control.stream_by_id(*id)).expect("read by id");
        let by_id = by_id.unwrap_or_else(|| panic!("acknowledged stream {key} {id} is missing"));
        assert_eq!((by_id.key.as_str(), by_id.id), (key.as_str(), *id));
        let found = block_on(control.get_stream(&bucket(), &address));
        if *deleted {
            assert!(by_id.deleted_at_ms.is_some(), "{key} {id}: deletion lost");
            assert!(matches!(found, Err(Error::StreamNotFound { .. })), "{key}: {found:?}");
            let again = block_on(control.delete_stream(&bucket(), &address, None)).expect("again");
            assert!(again.already && again.id == *id, "{key}: {again:?}");
        } else if by_id.deleted_at_ms.is_some() {
            // A deletion may be durable without its acknowledgement having been printed,
            // but only of a stream the child meant to delete.
            assert!(meant_to_delete(key), "{key} {id}: deleted, never asked to be");
            assert!(matches!(found, Err(Error::StreamNotFound { .. })), "{key}: {found:?}");
        } else {
            assert_eq!(found.expect("an acknowledged live stream").id, *id, "{key}");
        }
    }
    // Addresses and rows agree, acknowledged or not: every listed stream is live and found
    // at its address, and every live stream row is listed.
    let mut listed = BTreeMap::new();
    let mut after: Option<String> = None;
    for _ in 0..10_000 {
        let page =
            block_on(control.list_streams(&bucket(), "", after.as_deref(), None)).expect("list");
        for record in page.streams {
            assert_eq!(record.deleted_at_ms, None);
            listed.insert(record.id, record.key.into_string());
        }
        match page.next {
            Some(next) => after = Some(next.into_string()),
            None => break,
        }
    }
    let mut live_rows = 0;
    let mut after: Option<Vec<u8>> = None;
    for _ in 0..10_000 {
        let page = block_on(control.store().scan(b"s/", after.as_deref(), 1000)).expect("scan");
        after = page.entries.last().map(|(key, _)| key.clone());
        for (key, _) in &page.entries {
            let id = StreamId(key[2..].try_into().expect("a stream row's key is s/ and 16 bytes"));
            let record = block_on(control.stream_by_id(id)).expect("read").expect("scanned");
            if record.deleted_at_ms.is_none() {
                live_rows += 1;
                assert_eq!(listed.get(&id), Some(&record.key.into_string()), "{id} is orphaned");
            }
        }
        if !page.more {
            break;
        }
    }
    assert_eq!(live_rows, listed.len(), "every listed stream has a live row");
}

#[test]
fn kill9_keeps_every_acknowledged_stream() {
    if let Some(dir) = std::env::var_os(CHILD_DIR_ENV) {
        let round = std::env::var(CHILD_ROUND_ENV).ok().and_then(|round| round.parse().ok());
        run_until_killed(Path::new(&dir), round.expect("the parent sets the round"));
        return;
    }
    let mut rng = Rng::seeded(SEED_ENV);
    let temp = tempfile::tempdir().expect("a temporary directory");
    let dir = temp.path().join("meta");
    // key -> (id, whether its deletion was acknowledged)
    let mut expected: BTreeMap<String, (StreamId, bool)> = BTreeMap::new();
    let mut deletions = 0;
    for round in 0..ROUNDS {
        for ack in run_and_kill(&dir, round, &mut rng) {
            match ack {
                Ack::Created { key, id } => {
                    let previous = expected.insert(key.clone(), (id, false));
                    assert!(previous.is_none(), "{key} acknowledged twice");
                }
                Ack::Deleted { key, id } => {
                    let entry = expected
                        .get_mut(&key)
                        .unwrap_or_else(|| panic!("deletion of {key} before its create"));
                    assert_eq!(entry.0, id);
                    entry.1 = true;
                    deletions += 1;
                }
            }
        }
        let store = RedbMetaStore::open(&dir, RedbMetaOptions::default()).expect("reopen");
        let control = ControlPlane::new(store.clone());
        verify(&control, &expected);
        block_on(store.close()).expect("close");
    }
    assert!(!expected.is_empty() && deletions > 0, "the child did some of everything");
}
