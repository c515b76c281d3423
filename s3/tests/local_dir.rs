//! The local-directory store: the conformance suite on a temporary directory, then what
//! only a directory has: its lock, its leftovers, and crash safety under SIGKILL.
//!
//! The kill -9 test re-executes this test binary as a child (selected by an environment
//! variable) that overwrites and creates objects in a loop and prints each put that
//! returned. The parent kills it at a random moment, reopens the store and checks that
//! every object is whole (never a prefix of a put in flight) and that no returned put
//! was lost. A failing seed replays with `NOVA_S3_CRASH_SEED=<seed>`.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use s3::{
    ByteRange, Bytes, ErrorKind, LocalDirOptions, LocalDirStore, ObjectStore, Op, PutCondition,
};

async fn local_fixture() -> common::Fixture {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = LocalDirStore::open(dir.path().join("objects"), LocalDirOptions::default())
        .expect("open the store");
    common::Fixture::new(Arc::new(store), 2_500, dir)
}

conformance_tests!(local_fixture);

#[test]
fn a_second_store_on_one_root_is_refused_until_the_first_is_dropped() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let first = LocalDirStore::open(dir.path(), LocalDirOptions::default()).expect("open");
    let err = LocalDirStore::open(dir.path(), LocalDirOptions::default()).expect_err("locked");
    assert_eq!(err.op(), Op::Open);
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    assert!(err.to_string().contains("another object store"), "{err}");
    drop(first);
    LocalDirStore::open(dir.path(), LocalDirOptions::default())
        .expect("open after the first closed");
}

#[test]
fn objects_survive_a_reopen_and_leftover_temporaries_are_removed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    common::block_on(async {
        let store = LocalDirStore::open(dir.path(), LocalDirOptions::default()).expect("open");
        store
            .put("keep/me", Bytes::from_static(b"kept"), PutCondition::CreateOnly)
            .await
            .expect("put");
    });
    // What a put killed between write and rename leaves behind.
    std::fs::write(dir.path().join("~tmp").join("999-1"), b"half an obj")
        .expect("plant a temporary");
    common::block_on(async {
        let store = LocalDirStore::open(dir.path(), LocalDirOptions::default()).expect("reopen");
        assert_eq!(
            store.get("keep/me", ByteRange::All).await.expect("get"),
            Bytes::from_static(b"kept")
        );
        let page = store.list("", None, 10).await.expect("list");
        assert_eq!(page.objects.len(), 1, "only the object: {page:?}");
    });
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("~tmp")).expect("~tmp").collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn foreign_files_are_not_objects() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    common::block_on(async {
        let store = LocalDirStore::open(dir.path(), LocalDirOptions::default()).expect("open");
        store.put("a/b", Bytes::from_static(b"x"), PutCondition::CreateOnly).await.expect("put");
        std::fs::write(dir.path().join("a").join("notes.txt"), b"?").expect("a stray file");
        std::fs::write(dir.path().join("a").join("bad name~"), b"?")
            .expect("a stray object-like file");
        let page = store.list("", None, 10).await.expect("list");
        let keys: Vec<_> = page.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["a/b"]);
    });
}

#[test]
fn many_concurrent_puts_wait_for_their_turn() {
    // One permit: the calls queue instead of each holding a blocking thread.
    let dir = tempfile::tempdir().expect("a temporary directory");
    common::block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(
            LocalDirStore::open(
                dir.path(),
                LocalDirOptions { io_concurrency: 1, ..LocalDirOptions::default() },
            )
            .expect("open"),
        );
        let mut puts = tokio::task::JoinSet::new();
        for i in 0..64u64 {
            let store = Arc::clone(&store);
            puts.spawn(async move {
                store
                    .put(
                        &format!("q/{i:02}"),
                        Bytes::from(common::pattern(i, 100)),
                        PutCondition::CreateOnly,
                    )
                    .await
            });
        }
        while let Some(done) = puts.join_next().await {
            done.expect("a put task").expect("put");
        }
        assert_eq!(store.list("q/", None, 100).await.expect("list").objects.len(), 64);
    });
}

// ---- kill -9 ---------------------------------------------------------------------

const CRASH_TEST: &str = "kill9_leaves_every_object_whole";
/// Set in the child: the store's directory. Its presence selects the child's mode.
const CHILD_DIR_ENV: &str = "NOVA_S3_CRASH_DIR";
const CHILD_ROUND_ENV: &str = "NOVA_S3_CRASH_ROUND";
const SEED_ENV: &str = "NOVA_S3_CRASH_SEED";
const ROUNDS: u64 = 12;
/// Keys the child overwrites over and over: a kill lands mid-put on one of them.
const OVERWRITTEN_KEYS: u64 = 4;
/// The kill comes at a random moment this long at most after the first put returned.
const RUN_BEFORE_KILL_US_MAX: u64 = 200_000;
const FIRST_ACK_WAIT_MAX: Duration = Duration::from_secs(60);

/// The object written by put number `generation`: its size varies (up to 8 MiB, so a
/// kill often lands mid-write), the first 8 bytes are the generation and the rest one
/// byte that differs between consecutive generations, so a torn object (short) or a
/// mixed one (another generation's bytes) is detected. Cheap to make, so the child
/// spends its time in the store, where the kill should land.
fn crash_object(generation: u64) -> Vec<u8> {
    let len = 8 + (generation * 7919 % 8_192) as usize * 1024;
    let mut object = vec![(generation % 251) as u8 + 1; len];
    object[..8].copy_from_slice(&generation.to_le_bytes());
    object
}

fn check_whole(key: &str, object: &[u8]) -> u64 {
    assert!(object.len() >= 8, "{key}: {} bytes, a torn object", object.len());
    let generation = u64::from_le_bytes(object[..8].try_into().expect("8 bytes"));
    assert!(
        object == crash_object(generation),
        "{key}: {} bytes, not put number {generation} whole",
        object.len()
    );
    generation
}

/// The child: overwrites `o/<n>` seven times for each `c/<generation>` it creates, printing
/// `ACK <key> <generation>` after each put returned, until killed.
fn run_until_killed(dir: &Path, round: u64) {
    common::block_on(async {
        let store =
            LocalDirStore::open(dir, LocalDirOptions::default()).expect("open in the child");
        for step in 0.. {
            let generation = round * 1_000_000 + step;
            let (key, condition) = if step % 8 != 0 {
                (format!("o/{}", step % OVERWRITTEN_KEYS), PutCondition::Overwrite)
            } else {
                (format!("c/{generation}"), PutCondition::CreateOnly)
            };
            store
                .put(&key, Bytes::from(crash_object(generation)), condition)
                .await
                .expect("put in the child");
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "ACK {key} {generation}").expect("stdout is the parent's pipe");
            stdout.flush().expect("stdout is the parent's pipe");
        }
    });
}

#[test]
fn kill9_leaves_every_object_whole() {
    if let Some(dir) = std::env::var_os(CHILD_DIR_ENV) {
        let round = std::env::var(CHILD_ROUND_ENV).ok().and_then(|r| r.parse().ok()).unwrap_or(0);
        run_until_killed(Path::new(&dir), round);
        return;
    }
    let seed = std::env::var(SEED_ENV).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(7, |d| d.as_nanos() as u64)
    });
    println!("replay with {SEED_ENV}={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().expect("a temporary directory");
    // Key → the newest generation whose put returned.
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    for round in 0..ROUNDS {
        let mut child = Command::new(std::env::current_exe().expect("the test binary's path"))
            .args(["--exact", CRASH_TEST, "--nocapture", "--test-threads", "1"])
            .env(CHILD_DIR_ENV, dir.path())
            .env(CHILD_ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the child");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (lines, received) = std::sync::mpsc::sync_channel::<(String, u64)>(4096);
        let reader = thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Some(start) = line.find("ACK ") else { continue };
                let mut words = line[start + 4..].split(' ');
                let (Some(key), Some(generation)) =
                    (words.next(), words.next().and_then(|g| g.parse().ok()))
                else {
                    continue;
                };
                if lines.send((key.to_owned(), generation)).is_err() {
                    break;
                }
            }
        });
        let first =
            received.recv_timeout(FIRST_ACK_WAIT_MAX).expect("the child acknowledges a put");
        let kill_at = Instant::now() + Duration::from_micros(rng.u64(0..RUN_BEFORE_KILL_US_MAX));
        let mut round_acks = vec![first];
        while let Some(left) = kill_at.checked_duration_since(Instant::now()) {
            match received.recv_timeout(left) {
                Ok(ack) => round_acks.push(ack),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
                Err(err) => panic!("the child exited before the kill: {err}"),
            }
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("reap the child");
        assert!(!status.success(), "the child was killed: {status:?}");
        reader.join().expect("the reader thread");
        round_acks.extend(received.try_iter());
        for (key, generation) in round_acks {
            let newest = acked.entry(key).or_default();
            *newest = (*newest).max(generation);
        }

        common::block_on(async {
            let store = LocalDirStore::open(dir.path(), LocalDirOptions::default())
                .expect("reopen after the kill");
            let (mut listed, mut after) = (BTreeMap::new(), None::<String>);
            loop {
                let page = store.list("", after.as_deref(), 1000).await.expect("list");
                for object in page.objects {
                    let data =
                        store.get(&object.key, ByteRange::All).await.expect("get a listed object");
                    assert_eq!(data.len() as u64, object.size);
                    listed.insert(object.key.clone(), check_whole(&object.key, &data));
                }
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            for (key, generation) in &acked {
                let found = listed
                    .get(key)
                    .unwrap_or_else(|| panic!("{key}: acknowledged put {generation} lost"));
                assert!(
                    found >= generation,
                    "{key}: put {generation} returned, but {found} is stored"
                );
            }
        });
        let leftovers = std::fs::read_dir(dir.path().join("~tmp")).expect("~tmp").count();
        assert_eq!(leftovers, 0, "the reopen empties ~tmp");
    }
    assert!(acked.len() as u64 > OVERWRITTEN_KEYS, "the child got going: {acked:?}");
}

/// Large objects are written with O_DIRECT, padded and cut back to their length, and
/// large ranges read with it; on tmpfs too (which refuses O_DIRECT before Linux 6.6, where the buffered fallback runs).
/// Bodies that start 4 KiB-aligned are written from where they are (all but their last
/// partial block, in pieces of `--local-store-write-bytes`), others staged. Byte for
/// byte the same every way.
#[test]
fn large_objects_round_trip_with_and_without_o_direct() {
    let on_disk = tempfile::tempdir().expect("a temporary directory");
    let on_tmpfs = tempfile::tempdir_in("/dev/shm").expect("a directory on tmpfs (/dev/shm)");
    // The default piece, and pieces of 12,000 bytes: two whole blocks each.
    let small_pieces = LocalDirOptions { write_bytes: 12_000, ..LocalDirOptions::default() };
    for (dir, options) in [
        (on_disk.path().join("default"), LocalDirOptions::default()),
        (on_disk.path().join("small-pieces"), small_pieces),
        (on_tmpfs.path().to_path_buf(), LocalDirOptions::default()),
    ] {
        let store = LocalDirStore::open(dir.join("objects"), options).expect("open the store");
        common::block_on(async {
            // Below, at and above the O_DIRECT threshold, none a multiple of 4 KiB but one.
            for (i, len) in
                [1000usize, 65_536, 65_537, 3 << 20, (8 << 20) + 4095].iter().enumerate()
            {
                let body = common::pattern(i as u64, *len);
                for (key, bytes) in [
                    (format!("big/{i}"), Bytes::from(body.clone())),
                    (format!("aligned/{i}"), aligned(&body)),
                ] {
                    store.put(&key, bytes, PutCondition::CreateOnly).await.expect("put");
                    let back = store.get(&key, ByteRange::All).await.expect("get");
                    assert_eq!(back.len(), *len, "{}: {key}", dir.display());
                    assert!(back[..] == body[..], "{}: {key} differs", dir.display());
                    assert_eq!(store.head(&key).await.expect("head"), Some(*len as u64));
                    // Ranged reads from 64 KiB on go with O_DIRECT, over the blocks the
                    // range touches: starts and ends on and off block bounds, to the end.
                    let spans = [
                        (0, *len),
                        (1, *len),
                        (4095, 4095 + 65_536),
                        (4096, *len - 1),
                        (len.saturating_sub(65_537), *len),
                    ];
                    for (start, end) in
                        spans.into_iter().filter(|&(s, e)| s < e && e <= *len && e - s >= 65_536)
                    {
                        let range = ByteRange::Span(start as u64..end as u64);
                        let back = store.get(&key, range).await.expect("ranged get");
                        assert!(back[..] == body[start..end], "{key} {start}..{end} differs");
                    }
                }
            }
        });
    }
}

#[test]
fn a_write_piece_smaller_than_a_block_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = LocalDirOptions { write_bytes: 4095, ..LocalDirOptions::default() };
    let refused = LocalDirStore::open(dir.path(), options).expect_err("refused");
    let message = refused.to_string();
    assert!(message.contains("--local-store-write-bytes 4095"), "{message}");
    assert!(message.contains("at least 4096"), "{message}");
}

/// `body` in shared bytes that start 4 KiB-aligned, as the engine assembles objects.
fn aligned(body: &[u8]) -> Bytes {
    const ALIGN: usize = 4096;
    let mut memory = vec![0u8; body.len() + ALIGN];
    let at = memory.as_ptr().align_offset(ALIGN);
    memory[at..at + body.len()].copy_from_slice(body);
    let bytes = Bytes::from(memory).slice(at..at + body.len());
    assert_eq!(bytes.as_ptr() as usize % ALIGN, 0, "the slice keeps the vector's memory");
    bytes
}
