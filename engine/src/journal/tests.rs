//! Tests of the journal on a real glommio executor and real O_DIRECT files: round trips
//! across groups, reopens and segment rolls; torn and corrupt tails; stale entries after a
//! cut; group atomicity; release and recycling; reads; failures that must never be
//! acknowledged. Damage is done to the files between opens with std::fs, as a crash or a
//! bad disk would leave them.

use std::future::Future;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::{LocalExecutorBuilder, Placement};

use super::*;
use crate::chunk::DIR_ENTRY_LEN;
use crate::chunk::{ChunkBuilder, ChunkStorage};
use crate::error::Error;
use crate::ids::StreamId;
use crate::loan::ChunkLoan;

const STREAM: StreamId = StreamId(*b"journal-test-str");
/// The smallest segment the knob allows, so tests roll and recycle with little data.
const SEGMENT: u64 = 1 << 20;
const SEGMENT_BLOCKS: u64 = SEGMENT / BLOCK;

fn options() -> JournalConfig {
    JournalConfig { segment_bytes: SEGMENT, spare_segments: 1 }
}

/// Runs `test` on a fresh glommio executor with a fresh directory, after the IOPOLL probe
/// (platform.md).
fn run<F, Fut>(test: F)
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = ()>,
{
    let temp = tempfile::tempdir().expect("a temporary directory");
    let dir = temp.path().join("journal");
    let executor =
        LocalExecutorBuilder::new(Placement::Unbound).make().expect("a glommio executor");
    executor.run(async move {
        probe_io_poll(temp.path()).await.expect("the probe");
        test(dir).await;
    });
}

async fn open(dir: &Path) -> (Journal, Recovery) {
    Journal::open(dir, options()).await.expect("open the journal")
}

/// The stored record numbered `seq`: a headerless record whose body is a pattern of
/// `body_len` bytes derived from `seq`, so a read checks every byte.
fn stored(seq: u64, body_len: usize) -> Vec<u8> {
    let mut record = vec![0x00];
    record.extend((0..body_len).map(|i| (seq as usize * 31 + i * 7) as u8));
    record
}

/// A chunk of `records` records from `first_seq`, each with `body_len` body bytes.
fn chunk(
    journal: &Journal,
    first_seq: u64,
    records: usize,
    body_len: usize,
) -> SealedChunk<JournalBuffer> {
    let capacity = ChunkBuilder::<JournalBuffer>::capacity_for(records, records * (body_len + 1));
    let mut builder = ChunkBuilder::with_buffer(journal.alloc_buffer(capacity), STREAM, first_seq);
    for seq in first_seq..first_seq + records as u64 {
        builder.push_record(&stored(seq, body_len), seq).expect("sized to fit");
    }
    builder.seal()
}

/// A one-record chunk whose entry is exactly `blocks` 4 KiB blocks.
fn chunk_of_blocks(journal: &Journal, seq: u64, blocks: u64) -> SealedChunk<JournalBuffer> {
    let overhead = ENVELOPE_LEN + HEADER_LEN + 1 + DIR_ENTRY_LEN;
    let sealed = chunk(journal, seq, 1, blocks as usize * ALIGNMENT - overhead);
    assert_eq!(sealed.padded().len() as u64, blocks * BLOCK);
    sealed
}

/// Checks a recovered or read chunk's records against what [`chunk`] put in.
fn check_records(records: Records<'_>, first_seq: u64, body_len: usize) {
    assert_eq!(records.first_seq_num(), first_seq);
    for (seq, timestamp, bytes) in records.iter() {
        assert_eq!(timestamp, seq);
        assert_eq!(bytes, stored(seq, body_len), "record {seq}");
    }
}

async fn append(journal: &Journal, chunks: Vec<SealedChunk<JournalBuffer>>) -> Vec<Location> {
    let appended = journal.append(chunks).await.expect("append");
    appended.into_iter().map(|(_, location)| location).collect()
}

/// The segment file holding `lsn`, and the offset of `lsn` in it.
fn file_of(journal_dir: &Path, segments: &[(u64, u64)], lsn: u64) -> (PathBuf, u64) {
    let &(start, _) = segments
        .iter()
        .find(|(start, len)| (*start..start + len).contains(&lsn))
        .expect("a segment holds the lsn");
    (journal_dir.join(segment_name(start)), lsn - start)
}

/// XORs `mask` into the byte at `lsn + delta`, as a bad disk would.
fn flip(dir: &Path, segments: &[(u64, u64)], lsn: u64, delta: u64, mask: u8) {
    let (path, offset) = file_of(dir, segments, lsn);
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open");
    let mut byte = [0];
    file.read_exact_at(&mut byte, offset + delta).expect("read");
    byte[0] ^= mask;
    file.write_all_at(&byte, offset + delta).expect("write");
    file.sync_all().expect("sync");
}

/// Zeroes `len` bytes at `lsn`, as a write that never reached the disk leaves them.
fn zero(dir: &Path, segments: &[(u64, u64)], lsn: u64, len: u64) {
    let (path, offset) = file_of(dir, segments, lsn);
    let file = std::fs::OpenOptions::new().write(true).open(path).expect("open");
    file.write_all_at(&vec![0; len as usize], offset).expect("write");
    file.sync_all().expect("sync");
}

fn recovered(recovery: &Recovery) -> Vec<Location> {
    recovery.entries.iter().map(|entry| entry.location).collect()
}

#[test]
fn append_reopen_recover_across_groups_and_a_segment_roll() {
    run(|dir| async move {
        let (journal, recovery) = open(&dir).await;
        assert_eq!(
            (recovery.entries.len(), recovery.end.clone(), recovery.epoch),
            (0, LogEnd::Clean, 1)
        );
        let mut expected = Vec::new();
        let mut seq = 0;
        // Seven groups of 1 to 4 chunks of up to ~100 KiB: more than a segment.
        // fdatasyncs expected: one per segment file each group of several entries touched.
        let mut files_synced = 0;
        for group in 0..7u64 {
            let mut chunks = Vec::new();
            for index in 0..=(group % 4) {
                let records = 1 + (group * 5 + index * 3) as usize % 40;
                let body_len = 37 + (group * 977 + index * 131) as usize % 8000;
                chunks.push(chunk(&journal, seq, records, body_len));
                expected.push((seq, records, body_len));
                seq += records as u64;
            }
            let appended = journal.append(chunks).await.expect("append");
            for (sealed, location) in &appended {
                assert_eq!(location.chunk_len as usize, sealed.bytes().len());
                assert_eq!(location.entry_len() as usize, sealed.padded().len());
            }
            if appended.len() > 1 {
                let segments = journal.segments();
                let segment_of = |lsn| segments.iter().position(|&(start, len)| lsn < start + len);
                let first = segment_of(appended[0].1.lsn);
                let last = segment_of(appended[appended.len() - 1].1.lsn);
                files_synced += 1 + u64::from(first != last);
            }
        }
        let stats = journal.stats();
        assert_eq!((stats.groups, stats.entries), (7, expected.len() as u64));
        assert!(journal.segments().len() >= 2, "the groups rolled into a second segment");
        // Groups 0 and 4 have one entry each, written O_DSYNC; the other five are
        // fdatasynced, once per segment file they touched (twice at a roll).
        assert_eq!(stats.synced_writes, 2);
        assert!(files_synced > 5, "a group of several entries rolled: {files_synced}");
        assert_eq!(stats.fdatasyncs, files_synced);
        let head = journal.head();
        journal.close().await.expect("close");

        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovery.end, LogEnd::Clean);
        assert_eq!(recovery.epoch, 2);
        assert_eq!(recovery.head, head);
        assert_eq!(recovery.entries.len(), expected.len());
        let mut previous_end = 0;
        for (entry, &(first_seq, records, body_len)) in recovery.entries.iter().zip(&expected) {
            assert!(entry.location.lsn >= previous_end, "entries are in log order");
            previous_end = entry.location.end();
            assert_eq!(entry.header.first_seq_num, first_seq);
            assert_eq!(entry.header.record_count as usize, records);
            let read = journal.read(&entry.location).await.expect("read");
            assert_eq!(read.header(), &entry.header);
            check_records(read.records(), first_seq, body_len);
        }
        // Writes continue after the recovered log, and survive the next reopen too.
        let more = append(&journal, vec![chunk(&journal, seq, 3, 10)]).await;
        assert_eq!(more[0].lsn, head);
        journal.close().await.expect("close");
        let (_journal, recovery) = open(&dir).await;
        assert_eq!(recovery.entries.len(), expected.len() + 1);
        assert_eq!(recovery.entries.last().map(|e| e.location), Some(more[0]));
        assert_eq!(recovery.epoch, 3);
    });
}

#[test]
fn one_fdatasync_covers_a_whole_group() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let chunks = (0..32).map(|i| chunk(&journal, i * 10, 10, 100)).collect();
        let locations = append(&journal, chunks).await;
        assert_eq!(locations.len(), 32);
        let stats = journal.stats();
        assert_eq!(
            (stats.groups, stats.entries, stats.fdatasyncs, stats.synced_writes),
            (1, 32, 1, 0)
        );
        assert_eq!(stats.bytes, locations.iter().map(Location::entry_len).sum::<u64>());
        // Entries are back to back, each at a 4 KiB boundary.
        for pair in locations.windows(2) {
            assert_eq!(pair[0].end(), pair[1].lsn);
            assert!(pair[1].lsn.is_multiple_of(BLOCK));
        }
        assert_eq!(append(&journal, Vec::new()).await, Vec::new());
        assert_eq!(journal.stats().fdatasyncs, 1, "an empty group syncs nothing");
    });
}

#[test]
fn a_group_of_one_entry_is_written_o_dsync_and_needs_no_fdatasync() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let location = append(&journal, vec![chunk(&journal, 0, 10, 100)]).await;
        let stats = journal.stats();
        assert_eq!(
            (stats.groups, stats.entries, stats.fdatasyncs, stats.synced_writes),
            (1, 1, 0, 1)
        );
        // What makes it durable: the segment is open O_DSYNC as well as without (the
        // flags of each descriptor, as the kernel reports them).
        let (segment_start, _) = journal.segments()[0];
        let flags = open_flags(&dir.join(segment_name(segment_start)));
        let dsync = libc::O_DSYNC as u32;
        assert_eq!(flags.len(), 2, "{flags:x?}");
        assert!(flags.iter().any(|f| f & dsync != 0), "{flags:x?}");
        assert!(flags.iter().any(|f| f & dsync == 0), "{flags:x?}");
        journal.close().await.expect("close");
        let (_, recovery) = open(&dir).await;
        assert_eq!(recovery.entries.iter().map(|e| e.location).collect::<Vec<_>>(), location);
    });
}

/// Which descriptor each kind of group is written through: the other refusing every
/// write changes nothing for it.
#[test]
fn one_entry_goes_through_the_o_dsync_descriptor_and_several_through_the_plain_one() {
    for (broken, one_entry_fails) in [("plain", false), ("dsync", true)] {
        run(|dir| async move {
            let (journal, _) = open(&dir).await;
            append(&journal, vec![chunk(&journal, 0, 1, 1)]).await;
            let fd = {
                let segment = &journal.state.borrow().segments[0];
                if broken == "plain" { segment.file.as_raw_fd() } else { segment.dsync.as_raw_fd() }
            };
            refuse_writes(&dir, fd);
            let one = journal.append(vec![chunk(&journal, 1, 1, 1)]).await;
            assert_eq!(one.is_err(), one_entry_fails, "{broken} broken, one entry: {one:?}");
            if one_entry_fails {
                return;
            }
            let two =
                journal.append(vec![chunk(&journal, 2, 1, 1), chunk(&journal, 3, 1, 1)]).await;
            assert!(
                matches!(two, Err(Error::Journal(JournalError::Io { op: "writing", .. }))),
                "{broken} broken, two entries: {two:?}"
            );
        });
    }
}

/// Makes the journal's descriptor `fd` name a read-only file (the journal's epoch file),
/// so the kernel refuses every write through it.
fn refuse_writes(dir: &Path, fd: std::os::fd::RawFd) {
    let read_only = std::fs::File::open(dir.join(EPOCH_FILE)).expect("open read-only");
    // SAFETY: both descriptors are open; `fd` now names the read-only file, which the
    // journal only writes to (and fails) and closes.
    assert_eq!(unsafe { libc::dup2(read_only.as_raw_fd(), fd) }, fd);
}

/// The open flags of every descriptor this process holds on `path`.
fn open_flags(path: &Path) -> Vec<u32> {
    let path = path.canonicalize().expect("the file exists");
    let mut flags = Vec::new();
    for fd in std::fs::read_dir("/proc/self/fd").expect("fds").flatten() {
        if std::fs::read_link(fd.path()).is_ok_and(|target| target == path) {
            let info = std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(fd.file_name()))
                .unwrap_or_default();
            let octal = info.lines().find_map(|l| l.strip_prefix("flags:")).expect("flags");
            flags.push(u32::from_str_radix(octal.trim(), 8).expect("octal flags"));
        }
    }
    flags
}

/// Builds a journal of three single-chunk groups, the last two spanning several blocks,
/// and returns their locations and the segments.
async fn three_groups(dir: &Path) -> (Vec<Location>, Vec<(u64, u64)>) {
    let (journal, _) = open(dir).await;
    let mut locations = Vec::new();
    for (seq, records) in [(0, 5), (5, 30), (35, 30)] {
        locations.extend(append(&journal, vec![chunk(&journal, seq, records, 400)]).await);
    }
    assert!(locations[2].entry_len() > BLOCK, "the last entry spans blocks");
    let segments = journal.segments();
    journal.close().await.expect("close");
    (locations, segments)
}

/// After damage to the last entry: recovery keeps the two before it, the next append goes
/// exactly where the damaged one was, and the reopen after that finds it.
async fn cut_at_last_and_continue(dir: &Path, locations: &[Location], expect_clean: bool) {
    let (journal, recovery) = open(dir).await;
    assert_eq!(recovered(&recovery), locations[..2]);
    assert_eq!(recovery.head, locations[2].lsn);
    match &recovery.end {
        LogEnd::Clean => assert!(expect_clean, "a damaged entry is reported as a cut"),
        LogEnd::Cut { lsn, discarded_entries, .. } => {
            assert!(!expect_clean, "{:?}", recovery.end);
            assert_eq!((*lsn, *discarded_entries), (locations[2].lsn, 0));
        }
    }
    let next = append(&journal, vec![chunk(&journal, 35, 2, 10)]).await;
    assert_eq!(next[0].lsn, locations[2].lsn, "writes continue right after the cut");
    journal.close().await.expect("close");
    let (journal, recovery) = open(dir).await;
    assert_eq!(recovered(&recovery), [locations[0], locations[1], next[0]]);
    let read = journal.read(&next[0]).await.expect("read");
    check_records(read.records(), 35, 10);
}

#[test]
fn a_tail_cut_short_mid_entry_is_cut_at_the_last_whole_entry() {
    run(|dir| async move {
        let (locations, segments) = three_groups(&dir).await;
        // A torn write: the last entry's first block reached the disk, the rest did not.
        zero(&dir, &segments, locations[2].lsn + BLOCK, locations[2].entry_len() - BLOCK);
        cut_at_last_and_continue(&dir, &locations, false).await;
    });
}

/// Groups' writes overlap (a group is written while the one before is still being
/// written), so a crash can leave a torn group with a whole one after it. Recovery stops
/// at the torn one; the whole one after it, never acknowledged (groups are durable in
/// write order), never comes back, not even once new entries are written over the hole.
#[test]
fn a_whole_group_after_a_torn_one_never_comes_back() {
    run(|dir| async move {
        let (locations, segments) = three_groups(&dir).await;
        // The second group's entry is torn past its first block; the third reached disk.
        zero(&dir, &segments, locations[1].lsn + BLOCK, locations[1].entry_len() - BLOCK);
        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), locations[..1]);
        assert_eq!(recovery.head, locations[1].lsn);
        // A shorter entry where the torn one was: the third group's bytes lie past it.
        let next = append(&journal, vec![chunk(&journal, 5, 2, 10)]).await;
        assert_eq!(next[0].lsn, locations[1].lsn);
        assert!(next[0].end() < locations[2].lsn, "the third group lies beyond the new entry");
        journal.close().await.expect("close");
        let (_, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), [locations[0], next[0]], "{:?}", recovery.end);
    });
}

#[test]
fn a_segment_file_shorter_than_its_last_entry_is_cut_there() {
    run(|dir| async move {
        let (locations, segments) = three_groups(&dir).await;
        let (path, offset) = file_of(&dir, &segments, locations[2].lsn);
        let file = std::fs::OpenOptions::new().write(true).open(path).expect("open");
        file.set_len(offset + BLOCK).expect("truncate mid-entry");
        file.sync_all().expect("sync");
        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), locations[..2]);
        assert!(matches!(recovery.end, LogEnd::Cut { lsn, .. } if lsn == locations[2].lsn));
        // The short segment cannot take the next entry where the cut is: it goes to the
        // start of the next segment, and the chain finds it there.
        let next = append(&journal, vec![chunk(&journal, 35, 30, 400)]).await;
        assert_eq!(next[0].lsn, offset + BLOCK);
        journal.close().await.expect("close");
        let (_, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), [locations[0], locations[1], next[0]]);
    });
}

#[test]
fn a_flipped_byte_in_the_last_chunk_is_cut_there() {
    run(|dir| async move {
        let (locations, segments) = three_groups(&dir).await;
        let in_data = ENVELOPE_LEN as u64 + HEADER_LEN as u64 + 4500;
        flip(&dir, &segments, locations[2].lsn, in_data, 0x10);
        cut_at_last_and_continue(&dir, &locations, false).await;
    });
}

#[test]
fn a_zeroed_envelope_ends_the_log_before_it() {
    run(|dir| async move {
        let (locations, segments) = three_groups(&dir).await;
        zero(&dir, &segments, locations[2].lsn, ENVELOPE_LEN as u64);
        cut_at_last_and_continue(&dir, &locations, true).await;
    });
}

#[test]
fn a_flipped_byte_in_an_envelope_is_cut_there() {
    run(|dir| async move {
        let (locations, segments) = three_groups(&dir).await;
        flip(&dir, &segments, locations[2].lsn, 20, 0x01);
        cut_at_last_and_continue(&dir, &locations, false).await;
    });
}

#[test]
fn an_incomplete_group_is_discarded_whole() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let first = append(&journal, vec![chunk(&journal, 0, 4, 50)]).await;
        let group = append(
            &journal,
            vec![chunk(&journal, 4, 4, 50), chunk(&journal, 8, 4, 50), chunk(&journal, 12, 4, 50)],
        )
        .await;
        let segments = journal.segments();
        journal.close().await.expect("close");
        // The group's last entry never reached the disk; the two before it did.
        zero(&dir, &segments, group[2].lsn, group[2].entry_len());
        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), first);
        assert!(
            matches!(&recovery.end, LogEnd::Cut { lsn, discarded_entries: 2, .. } if *lsn == group[0].lsn),
            "{:?}",
            recovery.end
        );
        assert_eq!(recovery.head, group[0].lsn);
        let next = append(&journal, vec![chunk(&journal, 4, 1, 1)]).await;
        assert_eq!(next[0].lsn, group[0].lsn);
        journal.close().await.expect("close");
        // The discarded entries still on disk after the new one never join the log.
        let (_, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), [first[0], next[0]]);
        assert_eq!(recovery.end, LogEnd::Clean);
    });
}

/// The scenario of the brief: E1 torn and E2 valid in one unacknowledged group; recovery
/// cuts at E1; E1' is written at E1's position with the same padded length; after
/// another crash E2, still intact right after E1', must not be read as following it.
#[test]
fn a_stale_entry_after_a_cut_never_comes_back() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let base = append(&journal, vec![chunk(&journal, 0, 2, 10)]).await;
        let group =
            append(&journal, vec![chunk(&journal, 2, 3, 900), chunk(&journal, 5, 3, 900)]).await;
        let (e1, e2) = (group[0], group[1]);
        let segments = journal.segments();
        journal.close().await.expect("close");
        flip(&dir, &segments, e1.lsn, ENVELOPE_LEN as u64 + HEADER_LEN as u64 + 7, 0x01);

        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), base);
        assert_eq!(recovery.head, e1.lsn);
        // E1': other records, the same padded length, at E1's position, as its own group.
        let e1_again = append(&journal, vec![chunk(&journal, 2, 3, 880)]).await[0];
        assert_eq!((e1_again.lsn, e1_again.entry_len()), (e1.lsn, e1.entry_len()));
        assert_eq!(e1_again.end(), e2.lsn, "E2 sits exactly where E1's successor would");
        journal.close().await.expect("close");
        // E2 is intact on disk, names its own position and E1's: only the link to E1's
        // exact envelope (and E1's epoch) tells it apart from a successor of E1'.
        let (path, offset) = file_of(&dir, &segments, e2.lsn);
        let file = std::fs::File::open(path).expect("open");
        let mut bytes = [0; ENVELOPE_LEN];
        file.read_exact_at(&mut bytes, offset).expect("read");
        let (stale, _) = Envelope::parse(&bytes).expect("E2's envelope is intact");
        assert_eq!((stale.lsn, stale.prev.map(|link| link.lsn)), (e2.lsn, Some(e1.lsn)));

        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), [base[0], e1_again], "E2 did not come back");
        assert_eq!(recovery.end, LogEnd::Clean);
        let read = journal.read(&e1_again).await.expect("read");
        check_records(read.records(), 2, 880);
        // And the next write replaces it for good.
        let next = append(&journal, vec![chunk(&journal, 5, 1, 1)]).await;
        assert_eq!(next[0].lsn, e2.lsn);
    });
}

/// Two successors claim the same entry: a stale one right after it (its group was cut)
/// and, at the next segment's start, the one a later open wrote and acknowledged. The
/// later epoch wins, or an acknowledged group would be lost.
#[test]
fn the_later_of_two_claimants_wins() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        // Three entries of 80 blocks leave 16 blocks in the first segment.
        let filled: Vec<_> = (0..3).map(|i| chunk_of_blocks(&journal, i, 80)).collect();
        let filled = append(&journal, filled).await;
        assert_eq!(filled[2].end(), 240 * BLOCK);
        // Q fits after them; Q2 does not fit after Q, so it opens the second segment.
        let cut = append(
            &journal,
            vec![chunk_of_blocks(&journal, 3, 8), chunk_of_blocks(&journal, 4, 20)],
        )
        .await;
        assert_eq!((cut[0].lsn, cut[1].lsn), (240 * BLOCK, SEGMENT));
        let segments = journal.segments();
        journal.close().await.expect("close");
        flip(&dir, &segments, cut[1].lsn, 200, 0x01);

        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), filled);
        assert!(matches!(recovery.end, LogEnd::Cut { discarded_entries: 1, .. }));
        // S does not fit in the 16 blocks left after the tail: it goes to the second
        // segment's start, where Q2 was, while the stale Q still claims the tail.
        let s = append(&journal, vec![chunk_of_blocks(&journal, 3, 20)]).await[0];
        assert_eq!(s.lsn, SEGMENT);
        journal.close().await.expect("close");

        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), [filled[0], filled[1], filled[2], s]);
        assert_eq!(journal.read(&s).await.expect("read").header().first_seq_num, 3);
    });
}

#[test]
fn release_recycles_then_deletes_and_keeps_the_tail_segment() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        // Nine entries of 100 blocks: two per segment, so five segments.
        let mut all = Vec::new();
        for seq in 0..9 {
            all.extend(append(&journal, vec![chunk_of_blocks(&journal, seq, 100)]).await);
        }
        assert_eq!(journal.segments().len(), 5);
        assert_eq!(journal.stats().segments_created, 5);
        // Release everything below the fourth segment: the first is recycled as the one
        // spare, the next two are deleted.
        journal.release_before(all[6].lsn).await.expect("release");
        let stats = journal.stats();
        assert_eq!((stats.segments_recycled, stats.segments_deleted), (1, 2));
        let segments = journal.segments();
        assert_eq!(
            segments,
            [(3 * SEGMENT, SEGMENT), (4 * SEGMENT, SEGMENT), (5 * SEGMENT, SEGMENT)]
        );
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|name| name.ends_with(SEGMENT_SUFFIX))
            .collect();
        names.sort();
        assert_eq!(
            names,
            segments.iter().map(|(start, _)| segment_name(*start)).collect::<Vec<_>>()
        );
        assert!(matches!(
            journal.read(&all[0]).await,
            Err(Error::Journal(JournalError::NoEntry { .. }))
        ));
        check_records(
            journal.read(&all[6]).await.expect("read").records(),
            6,
            100 * ALIGNMENT - 141,
        );
        // Releasing everything keeps the segment holding the last entry.
        journal.release_before(u64::MAX).await.expect("release");
        assert_eq!(journal.segments()[0].0, 4 * SEGMENT);
        journal.close().await.expect("close");

        let (journal, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), all[8..]);
        assert_eq!(recovery.end, LogEnd::Clean, "the recycled spare's old entries are stale");
        // The next roll reuses the spare instead of creating a segment.
        let more =
            append(&journal, (9..12).map(|seq| chunk_of_blocks(&journal, seq, 100)).collect())
                .await;
        assert_eq!(more[1].lsn, 5 * SEGMENT);
        assert_eq!(journal.stats().segments_created, 0);
        journal.close().await.expect("close");
        let (_, recovery) = open(&dir).await;
        assert_eq!(recovered(&recovery), [all[8], more[0], more[1], more[2]]);
    });
}

#[test]
fn a_read_of_a_damaged_entry_is_an_error_not_a_panic() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let location = append(&journal, vec![chunk(&journal, 0, 10, 300)]).await[0];
        let segments = journal.segments();
        flip(&dir, &segments, location.lsn, ENVELOPE_LEN as u64 + HEADER_LEN as u64 + 3, 0x40);
        assert!(matches!(
            journal.read(&location).await,
            Err(Error::Journal(JournalError::Corrupt { lsn: 0, .. }))
        ));
        let wrong = Location { lsn: location.lsn, chunk_len: location.chunk_len - 1 };
        assert!(journal.read(&wrong).await.is_err());
        let past = Location { lsn: location.end(), chunk_len: location.chunk_len };
        assert!(matches!(
            journal.read(&past).await,
            Err(Error::Journal(JournalError::NoEntry { .. }))
        ));
    });
}

#[test]
fn a_failed_sync_is_never_acknowledged_and_stops_the_journal() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        append(&journal, vec![chunk(&journal, 0, 1, 1)]).await;
        journal.fail_next_sync.set(true);
        let failed = journal.append(vec![chunk(&journal, 1, 1, 1)]).await;
        assert!(matches!(failed, Err(Error::Journal(JournalError::Io { op: "syncing", .. }))));
        let refused = journal.append(vec![chunk(&journal, 1, 1, 1)]).await;
        assert!(
            matches!(refused, Err(Error::Journal(JournalError::Stopped { .. }))),
            "{refused:?}"
        );
        assert_eq!(journal.stats().groups, 1);
        journal.close().await.expect("close");
        // The reopen decides from the disk alone; here the group had reached it whole.
        let (_, recovery) = open(&dir).await;
        assert_eq!(recovery.entries.len(), 2);
    });
}

#[test]
fn a_failed_write_is_never_acknowledged_and_stops_the_journal() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        append(&journal, vec![chunk(&journal, 0, 1, 1)]).await;
        let fds = {
            let segment = &journal.state.borrow().segments[0];
            [segment.file.as_raw_fd(), segment.dsync.as_raw_fd()]
        };
        for fd in fds {
            refuse_writes(&dir, fd);
        }
        let failed = journal.append(vec![chunk(&journal, 1, 1, 1)]).await;
        assert!(
            matches!(failed, Err(Error::Journal(JournalError::Io { op: "writing", .. }))),
            "{failed:?}"
        );
        let refused = journal.append(vec![chunk(&journal, 1, 1, 1)]).await;
        assert!(matches!(refused, Err(Error::Journal(JournalError::Stopped { .. }))));
        assert_eq!(journal.stats().groups, 1);
    });
}

#[test]
fn writes_are_one_at_a_time_and_a_dropped_one_stops_the_journal() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let journal = Rc::new(journal);
        let first = glommio::spawn_local({
            let (journal, group) = (Rc::clone(&journal), vec![chunk(&journal, 0, 5, 100)]);
            async move { journal.append(group).await.map(|appended| appended.len()) }
        });
        // Let the first append start (it awaits its segment's creation, holding the
        // journal's one writer).
        glommio::executor().yield_task_queue_now().await;
        let second = journal.append(vec![chunk(&journal, 5, 1, 1)]).await;
        assert!(matches!(second, Err(Error::Journal(JournalError::WriteInFlight))), "{second:?}");
        assert_eq!(first.await.expect("the first append"), 1);

        let dropped = glommio::spawn_local({
            let (journal, group) = (Rc::clone(&journal), vec![chunk(&journal, 5, 5, 100)]);
            async move { journal.append(group).await.map(|appended| appended.len()) }
        });
        glommio::executor().yield_task_queue_now().await;
        drop(dropped);
        // A dropped task's future is dropped when the executor next runs it.
        for _ in 0..1000 {
            if !journal.state.borrow().writing {
                break;
            }
            glommio::executor().yield_task_queue_now().await;
        }
        let after = journal.append(vec![chunk(&journal, 5, 1, 1)]).await;
        assert!(matches!(after, Err(Error::Journal(JournalError::Stopped { .. }))), "{after:?}");
    });
}

/// Whichever way each group is made durable (one entry O_DSYNC, several fdatasynced),
/// a group whose sync finished first still waits for the group written before it.
#[test]
fn groups_written_while_others_sync_become_durable_in_write_order() {
    for second_has_one_entry in [false, true] {
        run(|dir| async move {
            let (journal, _) = open(&dir).await;
            let journal = Rc::new(journal);
            let (first, second) = if second_has_one_entry {
                (
                    vec![chunk(&journal, 0, 2, 100), chunk(&journal, 2, 3, 100)],
                    vec![chunk(&journal, 5, 5, 100)],
                )
            } else {
                (
                    vec![chunk(&journal, 0, 5, 100)],
                    vec![chunk(&journal, 5, 2, 100), chunk(&journal, 7, 3, 100)],
                )
            };
            let second_len = second.len();
            let first = journal.write(first).await.expect("write 1");
            let second = journal.write(second).await.expect("write 2 while 1 is not synced");
            assert_eq!(journal.stats().groups, 0, "nothing is durable before a sync");
            // The second group's sync runs first and makes it durable on the disk (its
            // O_DSYNC write, or its fdatasync), but it is not durable before the first
            // group is: it waits for it.
            let later = glommio::spawn_local({
                let journal = Rc::clone(&journal);
                async move { journal.sync(second).await.map(|appended| appended.len()) }
            });
            let synced = |stats: JournalStats| {
                if second_has_one_entry { stats.synced_writes } else { stats.fdatasyncs }
            };
            for _ in 0..10_000 {
                if synced(journal.stats()) >= 1 {
                    break;
                }
                glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
            }
            for _ in 0..100 {
                glommio::executor().yield_task_queue_now().await;
            }
            assert_eq!(synced(journal.stats()), 1, "the second group's sync ran");
            assert_eq!(journal.stats().groups, 0, "the second group waits for the first");
            let earlier = journal.sync(first).await.expect("sync 1");
            assert_eq!((earlier.len(), journal.stats().groups), (3 - second_len, 1));
            assert_eq!(later.await.expect("sync 2"), second_len);
            assert_eq!(journal.stats().groups, 2);
            let head = journal.head();
            Rc::into_inner(journal).expect("the only handle").close().await.expect("close");
            let (_, recovery) = open(&dir).await;
            assert_eq!((recovery.entries.len(), recovery.head), (3, head));
            assert_eq!(recovery.end, LogEnd::Clean);
        });
    }
}

#[test]
fn a_failed_sync_fails_every_group_written_after_it() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let first = journal.write(vec![chunk(&journal, 0, 1, 1)]).await.expect("write 1");
        let second = journal.write(vec![chunk(&journal, 1, 1, 1)]).await.expect("write 2");
        journal.fail_next_sync.set(true);
        let failed = journal.sync(first).await;
        assert!(matches!(failed, Err(Error::Journal(JournalError::Io { op: "syncing", .. }))));
        // Its own write (O_DSYNC, one entry) succeeds, but the group before it is not
        // durable.
        let after = journal.sync(second).await;
        assert!(matches!(after, Err(Error::Journal(JournalError::Stopped { .. }))), "{after:?}");
        assert_eq!(journal.stats().groups, 0);
    });
}

#[test]
fn a_written_group_dropped_unsynced_stops_the_journal() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let written = journal.write(vec![chunk(&journal, 0, 1, 1)]).await.expect("write");
        drop(written);
        let refused = journal.append(vec![chunk(&journal, 1, 1, 1)]).await;
        assert!(
            matches!(refused, Err(Error::Journal(JournalError::Stopped { .. }))),
            "{refused:?}"
        );
    });
}

#[test]
fn an_entry_larger_than_a_segment_is_refused_before_anything_is_written() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let big = chunk(&journal, 0, 1, SEGMENT as usize);
        let refused = journal.append(vec![chunk(&journal, 0, 1, 1), big]).await;
        assert!(matches!(refused, Err(Error::Journal(JournalError::EntryTooLarge { .. }))));
        assert_eq!(append(&journal, vec![chunk(&journal, 0, 1, 1)]).await[0].lsn, 0);
    });
}

#[test]
fn a_written_buffer_serves_reads_and_is_recycled_at_its_entry_size() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let buffer = journal.alloc_buffer(64 << 10);
        assert_eq!(buffer.len(), 64 << 10);
        assert_eq!(buffer.storage().as_ptr() as usize % ALIGNMENT, 0);
        let mut builder = ChunkBuilder::with_buffer(buffer, STREAM, 0);
        builder.push_record(&stored(0, 5000), 0).expect("fits");
        let mut appended = journal.append(vec![builder.seal()]).await.expect("append");
        let (chunk, location) = appended.pop().expect("one chunk");
        assert_eq!(location.entry_len(), 8192);
        check_records(chunk.records(), 0, 5000);
        // What went to disk past the chunk is zeros, though the buffer was never zeroed.
        let written = chunk.padded();
        assert!(written[ENVELOPE_LEN + chunk.bytes().len()..].iter().all(|&b| b == 0));
        let storage = Rc::try_unwrap(chunk).expect("the write let go of it").into_storage();
        assert_eq!(storage.len(), 8192, "trimmed to its entry");
        let mut builder = ChunkBuilder::with_buffer(storage, STREAM, 1);
        builder.push_record(&stored(1, 100), 1).expect("fits");
        let next = append(&journal, vec![builder.seal()]).await;
        assert_eq!(next[0].lsn, 8192);
        check_records(journal.read(&next[0]).await.expect("read").records(), 1, 100);
    });
}

#[test]
fn a_lent_chunk_reads_on_another_thread_and_outlives_a_loan_dropped_first() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        let mut appended = journal.append(vec![chunk(&journal, 0, 3, 2000)]).await.expect("append");
        let (chunk, _) = appended.pop().expect("one chunk");
        let expected = chunk.bytes().to_vec();

        // Read on another thread, given back, then the loan ends: the chunk is let go.
        let loan = ChunkLoan::new(Rc::clone(&chunk));
        let lent = loan.lend();
        assert_eq!(lent.header(), chunk.header());
        let want = expected.clone();
        let lent = std::thread::spawn(move || {
            assert_eq!(lent.bytes(), want, "the chunk's bytes, in place");
            lent
        })
        .join()
        .expect("the reader");
        drop(lent);
        drop(loan);
        assert_eq!(Rc::strong_count(&chunk), 1, "an ended loan holds nothing");

        // A loan dropped while its chunk is still out (a shard torn down mid-upload)
        // neither waits nor frees: the reader's bytes stay as they were.
        let loan = ChunkLoan::new(Rc::clone(&chunk));
        let lent = loan.lend();
        drop(loan);
        assert_eq!(Rc::strong_count(&chunk), 2, "the chunk is held for the reader");
        drop(chunk);
        let reader = std::thread::spawn(move || assert_eq!(lent.bytes(), expected));
        reader.join().expect("the bytes outlive the loan");
    });
}

#[test]
fn an_unknown_version_or_a_missing_segment_refuses_to_open() {
    run(|dir| async move {
        let (journal, _) = open(&dir).await;
        for seq in 0..3 {
            append(&journal, vec![chunk_of_blocks(&journal, seq, 200)]).await;
        }
        let segments = journal.segments();
        assert_eq!(segments.len(), 3);
        journal.close().await.expect("close");
        flip(&dir, &segments, 0, 4, 0x02);
        assert!(matches!(
            Journal::open(&dir, options()).await,
            Err(Error::Journal(JournalError::Damaged { .. }))
        ));
        flip(&dir, &segments, 0, 4, 0x02);
        assert_eq!(open(&dir).await.1.entries.len(), 3);
        std::fs::remove_file(dir.join(segment_name(SEGMENT))).expect("remove");
        assert!(matches!(
            Journal::open(&dir, options()).await,
            Err(Error::Journal(JournalError::Damaged { .. }))
        ));
    });
}

#[test]
fn options_out_of_range_are_refused() {
    run(|dir| async move {
        for segment_bytes in [4096, SEGMENT + 1] {
            let options = JournalConfig { segment_bytes, spare_segments: 0 };
            assert!(matches!(
                Journal::open(&dir, options).await,
                Err(Error::Journal(JournalError::InvalidOption { .. }))
            ));
        }
    });
}

#[test]
fn segment_names_sort_by_position() {
    assert_eq!(segment_name(1 << 20), "00000000000001048576.journal");
    assert_eq!(parse_segment_name("00000000000001048576.journal"), Some(1 << 20));
    assert_eq!(parse_segment_name(&segment_name(u64::MAX)), Some(u64::MAX));
    for bad in ["1048576.journal", "0000000000000104857x.journal", "00000000000001048576.seg"] {
        assert_eq!(parse_segment_name(bad), None, "{bad}");
    }
    assert!(segment_name(99) < segment_name(100));
    assert_eq!(SEGMENT_BLOCKS, 256);
}
