//! The express journal: one per shard, the local write-ahead log that makes express-class
//! appends durable (architecture.md, "Storage classes"; docs/decisions/0004).
//!
//! It owns a directory of fixed-size, preallocated segment files named by their starting
//! journal position (LSN, a byte position), written with O_DIRECT through glommio
//! (io_uring). An entry is a 64-byte envelope in the chunk buffer's front reserve, the
//! chunk, and zeros to a multiple of 4 KiB, written where the previous entry ended, or at
//! the start of the next segment when it does not fit: an entry never spans segments.
//!
//! ```text
//! segment <start>.journal:   [entry][entry][entry]...[unused tail][          ]
//! entry:                     [envelope 64][chunk L][zeros to 4 KiB]
//! envelope:                  magic, version, flags (group end), lsn, epoch,
//!                            prev_lsn + prev_crc (the chain), L, chunk HeaderCRC, CRC
//! ```
//!
//! Group commit: [`Journal::write`] submits a group's entries' writes concurrently, after
//! the last group written, and returns once they are submitted; [`Journal::sync`] awaits
//! them, makes them durable, and returns the group durable once every group written
//! before it is durable too. A group of one entry (every group of a shard with one busy
//! stream) is written through the segment's second descriptor, opened `O_DSYNC`: its
//! write completes only once durable, with the kernel's cache flush in the write's own
//! completion, so no second round trip through the shard. A group of several entries is
//! written through the plain descriptor and then fdatasynced once per segment file it
//! touched (one, unless it rolls into the next segment): one flush for all of them, where
//! `O_DSYNC` would flush after each. Groups are submitted one at a time, but the next may be
//! written while earlier ones are still being written or synced: the shard's flusher
//! keeps up to `--journal-syncs-in-flight-max` groups in flight. The last entry of a
//! group carries the group-end flag, and recovery keeps a group only whole. A crash may
//! leave a torn group with whole ones after it; recovery's chain ends at the hole (it
//! never skips one), and none of the groups after it was acknowledged, since a group is
//! durable only once every earlier one is.
//!
//! Recovery ([`Journal::open`], `recovery.rs`) follows the chain from the first segment:
//! each entry names its predecessor's position and envelope CRC, and is written in an
//! epoch (one per open, durable in the `epoch` file before anything is written), so a
//! stale entry (left after a cut, or in a recycled segment) can never follow an entry it
//! was not written after. The log ends at the first position where nothing valid claims
//! the last entry; an incomplete last group is discarded whole.
//!
//! This module never runs off its shard's executor (glommio files and buffers are
//! `!Send`), never reports an entry durable before its `O_DSYNC` write or its fdatasync
//! returned, and after any
//! I/O error accepts no more appends (the shard stops and reopens it).

mod buffer;
mod envelope;
mod recovery;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{Directory, DmaFile, OpenOptions, ReadResult};
use glommio::sync::Semaphore;

use crate::aligned::{ALIGNMENT, round_up};
use crate::chunk::{ChunkHeader, ENVELOPE_LEN, HEADER_LEN, Records, SealedChunk};
use crate::error::Result;
use crate::notify::Notify;

pub use buffer::JournalBuffer;
pub use envelope::{Envelope, EnvelopeError, Link};

/// The suffix of segment file names: `<start LSN, 20 decimal digits>.journal`.
const SEGMENT_SUFFIX: &str = ".journal";
/// Digits of the start LSN in a segment's name (enough for any u64, so names sort).
const SEGMENT_NAME_DIGITS: usize = 20;
/// The file holding the epoch record, in two 4 KiB slots (`epoch % 2`), so a torn write
/// of one leaves the other.
const EPOCH_FILE: &str = "epoch";
const EPOCH_SLOTS: u64 = 2;
/// The non-empty file that glommio's IOPOLL probe reads (platform.md).
const PROBE_FILE: &str = "iopoll-probe";

const BLOCK: u64 = ALIGNMENT as u64;

/// Why the journal failed or refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// A read, write, sync, create or rename failed. After a failed write or sync the
    /// journal accepts no more appends: what reached the disk is unknown.
    #[error("journal i/o failed while {op} {path}: {message}")]
    Io { op: &'static str, path: String, message: String },

    /// An earlier failure stopped the journal; reopen it (recovery decides what is kept).
    #[error("journal is stopped after an earlier failure: {cause}")]
    Stopped { cause: String },

    /// A write while another is in flight: groups are written one at a time.
    #[error("a journal write is already in flight; groups are written one at a time")]
    WriteInFlight,

    /// A chunk whose entry does not fit a segment: the shard cuts chunks smaller.
    #[error("journal entry of {bytes} bytes is over the largest entry of {limit} bytes")]
    EntryTooLarge { bytes: u64, limit: u64 },

    /// A read of a position the journal no longer (or never) held.
    #[error("journal holds no entry at lsn {lsn}: it is released or past the head {head}")]
    NoEntry { lsn: u64, head: u64 },

    /// Bytes at a position the journal wrote and acknowledged fail their checks.
    #[error("journal entry at lsn {lsn} is corrupt: {reason}")]
    Corrupt { lsn: u64, reason: String },

    /// The directory is not a journal this build can open (a missing segment, an unknown
    /// format version): it is left untouched.
    #[error("journal directory {path} cannot be opened: {reason}")]
    Damaged { path: String, reason: String },

    /// Options outside what the journal supports.
    #[error("journal option {field} {value} is invalid: {reason}")]
    InvalidOption { field: &'static str, value: u64, reason: &'static str },
}

fn io_error(op: &'static str, path: &Path, error: impl std::fmt::Display) -> JournalError {
    JournalError::Io { op, path: path.display().to_string(), message: error.to_string() }
}

/// The journal's knobs (`tuning`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalConfig {
    /// Bytes of each new segment file; also the largest entry.
    pub segment_bytes: u64,
    /// Released segments kept, renamed ahead of the head, for reuse.
    pub spare_segments: u32,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            segment_bytes: tuning::JOURNAL_SEGMENT_BYTES.default,
            spare_segments: u32::try_from(tuning::JOURNAL_SPARE_SEGMENTS.default)
                .expect("the knob's range is far below u32::MAX"),
        }
    }
}

impl JournalConfig {
    fn validate(&self) -> Result<(), JournalError> {
        let knob = tuning::JOURNAL_SEGMENT_BYTES;
        if !(knob.min..=knob.max).contains(&self.segment_bytes) {
            return Err(JournalError::InvalidOption {
                field: "segment_bytes",
                value: self.segment_bytes,
                reason: "outside the range of --journal-segment-bytes",
            });
        }
        if !self.segment_bytes.is_multiple_of(BLOCK) {
            return Err(JournalError::InvalidOption {
                field: "segment_bytes",
                value: self.segment_bytes,
                reason: "a segment is a whole number of 4 KiB blocks",
            });
        }
        if u64::from(self.spare_segments) > tuning::JOURNAL_SPARE_SEGMENTS.max {
            return Err(JournalError::InvalidOption {
                field: "spare_segments",
                value: u64::from(self.spare_segments),
                reason: "outside the range of --journal-spare-segments",
            });
        }
        Ok(())
    }
}

/// An appended chunk, still serving reads from its buffer, and where its entry is.
pub type Appended = (Rc<SealedChunk<JournalBuffer>>, Location);

/// Where an entry is: what a shard keeps to read a chunk back with [`Journal::read`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// The entry's journal position (its envelope's first byte).
    pub lsn: u64,
    /// The chunk's length.
    pub chunk_len: u32,
}

impl Location {
    /// Bytes the entry occupies: envelope, chunk, padding.
    pub fn entry_len(&self) -> u64 {
        entry_len(self.chunk_len)
    }

    /// One past the entry's last byte.
    pub fn end(&self) -> u64 {
        self.lsn + self.entry_len()
    }
}

fn entry_len(chunk_len: u32) -> u64 {
    (ENVELOPE_LEN as u64 + u64::from(chunk_len)).div_ceil(BLOCK) * BLOCK
}

/// One entry found by recovery: where it is and its chunk's header (the data stays on
/// disk; read it with [`Journal::read`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveredEntry {
    pub location: Location,
    pub header: ChunkHeader,
}

/// How the log found at open ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEnd {
    /// After the last entry there is unwritten space, or entries of an earlier life of
    /// the space (stale), which is how every log ends.
    Clean,
    /// The log was cut at `lsn`: something damaged was where the next entry would be, or
    /// the last group was incomplete (`discarded_entries` valid entries of it dropped).
    Cut { lsn: u64, reason: String, discarded_entries: u32 },
}

/// What [`Journal::open`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// Every entry of every whole group, in log order.
    pub entries: Vec<RecoveredEntry>,
    pub end: LogEnd,
    /// This open's epoch: every entry it writes carries it.
    pub epoch: u64,
    /// Where the next entry goes (the end of the last entry kept).
    pub head: u64,
}

impl IntoIterator for Recovery {
    type Item = RecoveredEntry;
    type IntoIter = std::vec::IntoIter<RecoveredEntry>;

    /// The recovered entries, in log order.
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

/// Counters since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Appends that wrote at least one entry and returned durable.
    pub groups: u64,
    pub entries: u64,
    /// Bytes written for entries (envelopes, chunks, padding).
    pub bytes: u64,
    /// fdatasync calls: one per segment file each group of several entries touched.
    pub fdatasyncs: u64,
    /// Groups of one entry, written `O_DSYNC` (durable when the write completes).
    pub synced_writes: u64,
    pub segments_created: u64,
    pub segments_recycled: u64,
    pub segments_deleted: u64,
}

/// A chunk read back from the journal, verified (envelope and [`crate::chunk::Chunk::parse`]).
pub struct JournalRead {
    entry: ReadResult,
    header: ChunkHeader,
}

impl JournalRead {
    /// The chunk's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.entry[ENVELOPE_LEN..ENVELOPE_LEN + self.header.chunk_len() as usize]
    }

    pub fn header(&self) -> &ChunkHeader {
        &self.header
    }

    /// The chunk's records, served from the read buffer without copying.
    pub fn records(&self) -> Records<'_> {
        crate::chunk::verified_records(self.bytes(), &self.header)
    }
}

impl std::fmt::Debug for JournalRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalRead").field("header", &self.header).finish()
    }
}

/// One segment file: `[start, start + len)` of the journal.
struct Segment {
    start: u64,
    len: u64,
    /// Reads, renames, removes and every write of a group of several entries go
    /// through it.
    file: Rc<DmaFile>,
    /// The same file opened `O_DSYNC`, for a group of one entry. Only written and
    /// closed: after a recycle its own idea of its path is stale.
    dsync: Rc<DmaFile>,
    path: PathBuf,
}

impl Segment {
    fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// The last entry of the last whole group: what the next entry links to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tail {
    lsn: u64,
    end: u64,
    crc: u32,
}

struct State {
    /// Contiguous, in LSN order.
    segments: VecDeque<Segment>,
    /// Where the next entry goes, unless it does not fit the segment.
    head: u64,
    /// The last entry of the last durable group.
    tail: Option<Tail>,
    /// The last entry written (durable or not): what the next entry links to.
    written: Option<Tail>,
    /// Groups written, and groups durable (a prefix of them), since open.
    groups_written: u64,
    groups_durable: u64,
    /// Set by the first failure; every later append refuses with it.
    stopped: Option<String>,
    writing: bool,
    stats: JournalStats,
}

impl State {
    /// The index of the segment holding `lsn`.
    fn segment_index(&self, lsn: u64) -> Option<usize> {
        let index = self.segments.partition_point(|s| s.start <= lsn).checked_sub(1)?;
        (lsn < self.segments[index].end()).then_some(index)
    }

    /// Where segments may be released up to: never the tail's segment (recovery needs
    /// the last whole entry to anchor the chain and the epochs) nor anything after it.
    fn release_bound(&self) -> u64 {
        let anchor = self.tail.map_or(self.head, |tail| tail.lsn);
        self.segment_index(anchor).map_or(anchor, |index| self.segments[index].start)
    }

    /// Segments after the one holding the head: empty, ready for the next rolls.
    fn spare_count(&self) -> usize {
        self.segments.iter().filter(|s| s.start > self.head).count()
    }
}

/// Where one entry of a group goes.
struct Slot {
    file: Rc<DmaFile>,
    dsync: Rc<DmaFile>,
    segment_start: u64,
    lsn: u64,
}

/// The per-shard express journal; see the module docs.
pub struct Journal {
    dir: PathBuf,
    directory: Directory,
    options: JournalConfig,
    epoch: u64,
    state: Rc<RefCell<State>>,
    /// Moves when a group is published durable or the journal stops.
    published: Rc<Notify>,
    /// Serialises segment creation (an append's roll) with recycling (a release): both
    /// add a segment at the end and must not pick the same name.
    segment_changes: Semaphore,
    /// A test's stand-in for a failing sync, the fdatasync or the `O_DSYNC` write (the
    /// other failures are real).
    #[cfg(test)]
    fail_next_sync: std::cell::Cell<bool>,
}

/// Makes glommio's IOPOLL probe for the device holding `dir` see a non-empty file, so
/// DmaFile reads on that device keep working (platform.md, "IOPOLL probe bug").
///
/// Call it at the start of each executor that opens DmaFiles, before any other DmaFile on
/// that device ([`Journal::open`] calls it too, which is enough only if the journal is the
/// executor's first DmaFile). It writes a 4 KiB file in `dir` with std::fs (blocking, once,
/// at start) and opens and closes it with `DmaFile::open`.
pub async fn probe_io_poll(dir: &Path) -> Result<()> {
    let path = dir.join(PROBE_FILE);
    let sized = std::fs::metadata(&path).is_ok_and(|m| m.len() == BLOCK);
    if !sized {
        std::fs::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))?;
        std::fs::write(&path, [0x4e; ALIGNMENT]).map_err(|e| io_error("writing", &path, e))?;
    }
    let file = DmaFile::open(&path).await.map_err(|e| io_error("probing", &path, e))?;
    file.close().await.map_err(|e| io_error("closing", &path, e))?;
    Ok(())
}

fn segment_name(start: u64) -> String {
    format!("{start:0width$}{SEGMENT_SUFFIX}", width = SEGMENT_NAME_DIGITS)
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

async fn open_rw(path: &Path) -> Result<DmaFile, JournalError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .dma_open(path)
        .await
        .map_err(|e| io_error("opening", path, e))
}

/// The segment at `path` opened for writes that are durable when they complete.
async fn open_dsync(path: &Path) -> Result<Rc<DmaFile>, JournalError> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .dma_open(path)
        .await
        .map(Rc::new)
        .map_err(|e| io_error("opening", path, e))
}

impl Journal {
    /// Whether a journal was ever opened in `dir` (its epoch file is there).
    pub fn was_opened(dir: &Path) -> bool {
        dir.join(EPOCH_FILE).is_file()
    }

    /// Opens (creating if needed) the journal in `dir`, recovers its log and makes this
    /// open's epoch durable. Runs on the shard's executor.
    pub async fn open(
        dir: impl AsRef<Path>,
        options: JournalConfig,
    ) -> Result<(Journal, Recovery)> {
        options.validate()?;
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(|e| io_error("creating", &dir, e))?;
            if let Some(parent) = dir.parent() {
                let parent =
                    Directory::open(parent).await.map_err(|e| io_error("opening", parent, e))?;
                parent.sync().await.map_err(|e| io_error("syncing", &dir, e))?;
            }
        }
        probe_io_poll(&dir).await?;
        let directory = Directory::open(&dir).await.map_err(|e| io_error("opening", &dir, e))?;
        let mut segments = list_segments(&dir).await?;
        let stored_epoch = read_epoch(&dir).await?;
        if stored_epoch.is_none() && !segments.is_empty() {
            return Err(
                damaged(&dir, "segments exist but no epoch file records their epoch").into()
            );
        }
        let scan = recovery::scan(&segments).await?;
        let epoch = stored_epoch.unwrap_or(0).max(scan.max_epoch) + 1;
        write_epoch(&dir, &directory, epoch).await?;
        let mut stats = JournalStats::default();
        drop_unusable_spares(&mut segments, scan.tail.as_ref(), &options, &mut stats).await?;
        let recovery = Recovery { entries: scan.entries, end: scan.end, epoch, head: scan.head };
        let journal = Journal {
            dir,
            directory,
            options,
            epoch,
            state: Rc::new(RefCell::new(State {
                segments: segments.into(),
                head: scan.head,
                tail: scan.tail,
                written: scan.tail,
                groups_written: 0,
                groups_durable: 0,
                stopped: None,
                writing: false,
                stats,
            })),
            published: Rc::new(Notify::new()),
            segment_changes: Semaphore::new(1),
            #[cfg(test)]
            fail_next_sync: std::cell::Cell::new(false),
        };
        Ok((journal, recovery))
    }

    /// A zeroed DMA buffer of at least `capacity` bytes (rounded up to 4 KiB) to build an
    /// express chunk in: `ChunkBuilder::with_buffer(journal.alloc_buffer(n), ..)`.
    pub fn alloc_buffer(&self, capacity: usize) -> JournalBuffer {
        JournalBuffer::new(glommio::allocate_dma_buffer(round_up(capacity.max(1))))
    }

    /// The largest entry (envelope, chunk, padding) an append takes: a segment.
    pub fn entry_bytes_max(&self) -> u64 {
        self.options.segment_bytes
    }

    /// This open's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Where the next entry goes (it may move to the next segment if it does not fit).
    pub fn head(&self) -> u64 {
        self.state.borrow().head
    }

    pub fn stats(&self) -> JournalStats {
        self.state.borrow().stats
    }

    /// The segments, as `(start, len)` in LSN order.
    pub fn segments(&self) -> Vec<(u64, u64)> {
        self.state.borrow().segments.iter().map(|s| (s.start, s.len)).collect()
    }

    /// Makes a group of chunks durable: [`Journal::write`], then [`Journal::sync`]. An
    /// empty group returns at once without a sync.
    pub async fn append(&self, chunks: Vec<SealedChunk<JournalBuffer>>) -> Result<Vec<Appended>> {
        if chunks.is_empty() {
            return match &self.state.borrow().stopped {
                Some(cause) => Err(JournalError::Stopped { cause: cause.clone() }.into()),
                None => Ok(Vec::new()),
            };
        }
        let written = self.write(chunks).await?;
        self.sync(written).await
    }

    /// Writes a non-empty group's entries, concurrently, after the last group written, and
    /// returns once every write is submitted; [`Journal::sync`] awaits them, then makes
    /// the group durable. Groups are submitted one at a time (a second concurrent call is
    /// refused), but a group may be written while earlier ones are still being written
    /// or synced: that is the journal's pipeline (`--journal-syncs-in-flight-max`). A
    /// crash may then leave an earlier group torn and a later one whole; recovery stops at
    /// the torn one, and the later one was never acknowledged (groups are durable in
    /// write order).
    ///
    /// On any error the journal stops. Dropping the returned group unsynced stops it too.
    pub async fn write(&self, chunks: Vec<SealedChunk<JournalBuffer>>) -> Result<Written> {
        assert!(!chunks.is_empty(), "a journal group has at least one chunk");
        let mut guard = WriteGuard::start(self)?;
        let limit = self.entry_bytes_max();
        let mut sizes = Vec::with_capacity(chunks.len());
        for chunk in &chunks {
            let bytes = chunk.padded().len() as u64;
            if bytes > limit {
                // Nothing was written: the journal stays usable.
                guard.finish();
                return Err(JournalError::EntryTooLarge { bytes, limit }.into());
            }
            sizes.push(bytes);
        }
        let slots = self.plan(&sizes).await.map_err(|e| self.stop(e))?;
        let last_index = chunks.len() - 1;
        // One entry: written O_DSYNC, durable when it completes. Several: one fdatasync
        // per file after them all, a single flush where O_DSYNC would flush per entry.
        let dsync = chunks.len() == 1;
        let mut prev = self.state.borrow().written.map(|t| Link { lsn: t.lsn, crc: t.crc });
        let mut written = Vec::with_capacity(chunks.len());
        let mut writes = Vec::with_capacity(chunks.len());
        let mut tail = None;
        for (index, (mut chunk, slot)) in chunks.into_iter().zip(&slots).enumerate() {
            let padded = chunk.padded().len();
            let chunk_len = chunk.bytes().len() as u32;
            let chunk_header_crc = u32::from_le_bytes(
                chunk.bytes()[HEADER_LEN - 4..HEADER_LEN].try_into().expect("4 bytes"),
            );
            let envelope = Envelope {
                lsn: slot.lsn,
                epoch: self.epoch,
                prev,
                chunk_len,
                chunk_header_crc,
                group_end: index == last_index,
            };
            // Trim first: the envelope's mutable access applies it (buffer.rs).
            chunk.storage().request_trim(padded);
            let crc = envelope.write(chunk.envelope_mut());
            debug_assert_eq!(chunk.storage().len(), padded, "the write sends exactly the entry");
            prev = Some(Link { lsn: slot.lsn, crc });
            tail = Some(Tail { lsn: slot.lsn, end: slot.lsn + padded as u64, crc });
            let chunk = Rc::new(chunk);
            let file = Rc::clone(if dsync { &slot.dsync } else { &slot.file });
            let buf = chunk.storage().shared();
            let offset = slot.lsn - slot.segment_start;
            // Spawned so every write is submitted before the first completes: the
            // group's writes are in flight together.
            writes.push(glommio::spawn_local(async move {
                file.write_rc_at(buf, offset).await.map_err(|e| e.to_string())
            }));
            written.push((chunk, Location { lsn: slot.lsn, chunk_len }));
        }
        let writes: Vec<PendingWrite> = writes
            .into_iter()
            .zip(&written)
            .zip(&slots)
            .map(|((task, (_, location)), slot)| PendingWrite {
                task,
                expected: location.entry_len(),
                segment_start: slot.segment_start,
            })
            .collect();
        let tail = tail.expect("a non-empty group has a last entry");
        let mut files: Vec<(u64, Rc<DmaFile>)> = Vec::new();
        for slot in slots.iter().filter(|_| !dsync) {
            if files.last().is_none_or(|(start, _)| *start != slot.segment_start) {
                files.push((slot.segment_start, Rc::clone(&slot.file)));
            }
        }
        let ticket = {
            let mut state = self.state.borrow_mut();
            state.head = tail.end;
            state.written = Some(tail);
            state.groups_written += 1;
            state.groups_written - 1
        };
        guard.finish();
        Ok(Written {
            ticket,
            writes,
            entries: written,
            files,
            tail,
            bytes: sizes.iter().sum(),
            state: Rc::clone(&self.state),
            published: Rc::clone(&self.published),
        })
    }

    /// Makes a written group durable: its writes complete (durable already when written
    /// `O_DSYNC`), else one fdatasync per segment file it touched; then,
    /// once every group written before it is durable too, returns each chunk (still
    /// serving reads from its buffer) with its location, in order. Several groups may
    /// sync at once; they return in the order they were written. Nothing is acknowledged
    /// unless it and everything before it is durable: on any error the journal stops, and
    /// recovery keeps a group only if every entry of it reached the disk.
    pub async fn sync(&self, mut group: Written) -> Result<Vec<Appended>> {
        let mut failure = None;
        for PendingWrite { task, expected, segment_start } in std::mem::take(&mut group.writes) {
            let outcome = match task.await {
                Ok(n) if n as u64 == expected => continue,
                Ok(n) => format!("short write of {n} of {expected} bytes"),
                Err(message) => message,
            };
            let path = self.segment_path(segment_start);
            failure.get_or_insert(JournalError::Io { op: "writing", path, message: outcome });
        }
        if let Some(error) = failure {
            return Err(self.stop(error).into());
        }
        #[cfg(test)]
        if self.fail_next_sync.take() {
            return Err(self.stop(io_error("syncing", &self.dir, "injected failure")).into());
        }
        if group.files.is_empty() {
            self.state.borrow_mut().stats.synced_writes += 1;
        }
        for (segment_start, file) in &group.files {
            self.state.borrow_mut().stats.fdatasyncs += 1;
            let path = self.segment_path(*segment_start);
            if let Err(e) = file.fdatasync().await {
                return Err(self.stop(io_error("syncing", Path::new(&path), e)).into());
            }
        }
        // A group is durable only with every group written before it: wait for those.
        loop {
            let seen = self.published.generation();
            {
                let state = self.state.borrow();
                if let Some(cause) = &state.stopped {
                    return Err(JournalError::Stopped { cause: cause.clone() }.into());
                }
                if state.groups_durable == group.ticket {
                    break;
                }
            }
            self.published.changed(seen).await;
        }
        {
            let mut state = self.state.borrow_mut();
            state.tail = Some(group.tail);
            state.groups_durable += 1;
            state.stats.groups += 1;
            state.stats.entries += group.entries.len() as u64;
            state.stats.bytes += group.bytes;
        }
        self.published.notify();
        Ok(std::mem::take(&mut group.entries))
    }

    /// Reads the chunk at `location` back and verifies it (envelope and chunk).
    pub async fn read(&self, location: &Location) -> Result<JournalRead> {
        let location = *location;
        let (file, offset, head) = {
            let state = self.state.borrow();
            let head = state.tail.map_or(0, |tail| tail.end);
            let index = state.segment_index(location.lsn).filter(|&index| {
                location.end() <= head && location.end() <= state.segments[index].end()
            });
            let Some(index) = index else {
                return Err(JournalError::NoEntry { lsn: location.lsn, head }.into());
            };
            let segment = &state.segments[index];
            (Rc::clone(&segment.file), location.lsn - segment.start, head)
        };
        let len = location.entry_len() as usize;
        let entry = file.read_at_aligned(offset, len).await.map_err(|e| {
            io_error("reading", Path::new(&self.segment_path(location.lsn - offset)), e)
        })?;
        match verify_entry(&entry, location) {
            Ok(header) => Ok(JournalRead { entry, header }),
            // A release may have recycled the segment while the read was in flight.
            Err(_) if self.state.borrow().segment_index(location.lsn).is_none() => {
                Err(JournalError::NoEntry { lsn: location.lsn, head }.into())
            }
            Err(reason) => Err(JournalError::Corrupt { lsn: location.lsn, reason }.into()),
        }
    }

    /// Gives up the segments wholly below `lsn` (their chunks are safe elsewhere): each is
    /// renamed ahead of the head as a spare while fewer than `spare_segments` are, else
    /// deleted. The segment holding the last entry is always kept: recovery anchors the
    /// chain and the epochs on it.
    ///
    /// One segment at a time, front first, each made durable in the directory before the
    /// next: after a crash the segments left are still contiguous (at most the one being
    /// released comes back, and recovery then returns its entries again).
    pub async fn release_before(&self, lsn: u64) -> Result<()> {
        let _permit = self
            .segment_changes
            .acquire_permit(1)
            .await
            .map_err(|e| JournalError::Stopped { cause: e.to_string() })?;
        // Each turn gives up the front segment; a recycled one goes past the tail, where
        // the bound never reaches, so there are at most as many turns as segments now.
        let turns = self.state.borrow().segments.len();
        for _ in 0..turns {
            let released = {
                let mut state = self.state.borrow_mut();
                let bound = lsn.min(state.release_bound());
                match state.segments.front() {
                    Some(front) if front.end() <= bound && state.segments.len() > 1 => {
                        state.segments.pop_front()
                    }
                    _ => None,
                }
            };
            let Some(segment) = released else { break };
            let (recycle_at, spares) = {
                let state = self.state.borrow();
                let back = state.segments.back().expect("the tail's segment is kept");
                (back.end(), state.spare_count())
            };
            let recycle = spares < self.options.spare_segments as usize
                && segment.len == self.options.segment_bytes;
            if recycle {
                let path = self.dir.join(segment_name(recycle_at));
                segment
                    .file
                    .rename(&path)
                    .await
                    .map_err(|e| self.stop(io_error("recycling", &segment.path, e)))?;
                self.sync_directory().await?;
                let mut state = self.state.borrow_mut();
                state.segments.push_back(Segment { start: recycle_at, path, ..segment });
                state.stats.segments_recycled += 1;
            } else {
                segment
                    .file
                    .remove()
                    .await
                    .map_err(|e| self.stop(io_error("deleting", &segment.path, e)))?;
                self.sync_directory().await?;
                self.state.borrow_mut().stats.segments_deleted += 1;
            }
        }
        Ok(())
    }

    async fn sync_directory(&self) -> Result<(), JournalError> {
        self.directory.sync().await.map_err(|e| self.stop(io_error("syncing", &self.dir, e)))
    }

    /// Closes every file. Dropping the journal closes them too, in the background.
    pub async fn close(self) -> Result<()> {
        let segments = std::mem::take(&mut self.state.borrow_mut().segments);
        for segment in segments {
            for file in [segment.file, segment.dsync] {
                if let Ok(file) = Rc::try_unwrap(file) {
                    file.close().await.map_err(|e| io_error("closing", &segment.path, e))?;
                }
            }
        }
        self.directory.close().await.map_err(|e| io_error("closing", &self.dir, e))?;
        Ok(())
    }

    fn segment_path(&self, start: u64) -> String {
        self.dir.join(segment_name(start)).display().to_string()
    }

    /// Records the first failure and refuses every later append.
    fn stop(&self, error: JournalError) -> JournalError {
        self.state.borrow_mut().stopped.get_or_insert_with(|| error.to_string());
        // Groups waiting to be published see it and fail.
        self.published.notify();
        error
    }

    /// Places each entry of a group: where the previous one ended, or at the start of the
    /// next segment when it does not fit (creating that segment if needed). Never skips a
    /// whole segment: recovery looks for an entry's successor only there.
    async fn plan(&self, sizes: &[u64]) -> Result<Vec<Slot>, JournalError> {
        let mut head = self.state.borrow().head;
        let mut slots = Vec::with_capacity(sizes.len());
        for &size in sizes {
            let mut skipped = false;
            // At most: skip the rest of one segment, create the next, place.
            for _ in 0..3 {
                let found = {
                    let state = self.state.borrow();
                    state.segment_index(head).map(|index| {
                        let segment = &state.segments[index];
                        let files = (Rc::clone(&segment.file), Rc::clone(&segment.dsync));
                        (segment.start, segment.end(), files)
                    })
                };
                match found {
                    Some((start, end, (file, dsync))) if head + size <= end => {
                        slots.push(Slot { file, dsync, segment_start: start, lsn: head });
                        head += size;
                        break;
                    }
                    Some((start, end, _)) => {
                        if skipped || head == start {
                            return Err(JournalError::Stopped {
                                cause: format!(
                                    "segment at {start} of {} bytes cannot take an entry of \
                                     {size} bytes",
                                    end - start
                                ),
                            });
                        }
                        skipped = true;
                        head = end;
                    }
                    None => self.add_segment(head).await?,
                }
            }
            if slots.last().is_none_or(|slot| slot.lsn + size != head) {
                return Err(JournalError::Stopped {
                    cause: format!("no segment could be found for an entry at {head}"),
                });
            }
        }
        Ok(slots)
    }

    /// Creates a preallocated segment starting at `start`, the end of the last segment
    /// (or the head of an empty journal), durable in the directory before it is used.
    async fn add_segment(&self, start: u64) -> Result<(), JournalError> {
        let _permit = self
            .segment_changes
            .acquire_permit(1)
            .await
            .map_err(|e| JournalError::Stopped { cause: e.to_string() })?;
        {
            let state = self.state.borrow();
            if state.segment_index(start).is_some() {
                // A release recycled a segment here while this waited.
                return Ok(());
            }
            let expected = state.segments.back().map_or(state.head, Segment::end);
            if expected != start {
                return Err(JournalError::Stopped {
                    cause: format!("a new segment at {start} would not follow {expected}"),
                });
            }
        }
        let len = self.options.segment_bytes;
        let path = self.dir.join(segment_name(start));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .dma_open(&path)
            .await
            .map_err(|e| io_error("creating", &path, e))?;
        file.pre_allocate(len, false).await.map_err(|e| io_error("preallocating", &path, e))?;
        file.fdatasync().await.map_err(|e| io_error("syncing", &path, e))?;
        self.directory.sync().await.map_err(|e| io_error("syncing", &self.dir, e))?;
        let dsync = open_dsync(&path).await?;
        let mut state = self.state.borrow_mut();
        state.segments.push_back(Segment { start, len, file: Rc::new(file), dsync, path });
        state.stats.segments_created += 1;
        Ok(())
    }
}

/// Marks the journal writing, and stops it if the write is dropped before it finishes
/// (its writes may have landed in part, with this epoch: only a reopen may write again).
struct WriteGuard<'a> {
    journal: &'a Journal,
    finished: bool,
}

impl<'a> WriteGuard<'a> {
    fn start(journal: &'a Journal) -> Result<Self, JournalError> {
        let mut state = journal.state.borrow_mut();
        if let Some(cause) = &state.stopped {
            return Err(JournalError::Stopped { cause: cause.clone() });
        }
        if state.writing {
            return Err(JournalError::WriteInFlight);
        }
        state.writing = true;
        Ok(Self { journal, finished: false })
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.journal.state.borrow_mut();
        state.writing = false;
        if !self.finished {
            state
                .stopped
                .get_or_insert_with(|| "a write failed or was dropped before it finished".into());
            drop(state);
            self.journal.published.notify();
        }
    }
}

/// A group written by [`Journal::write`] and not yet durable: pass it to
/// [`Journal::sync`]. Dropped unsynced, it stops the journal: its entries may be on disk,
/// linked into the log, and the groups after it would be acknowledged past a group
/// nobody acknowledged.
pub struct Written {
    /// Its place in write order: groups become durable in this order.
    ticket: u64,
    /// Its entries' writes, submitted and maybe not complete: [`Journal::sync`] awaits
    /// them (before its fdatasync, if it has one).
    writes: Vec<PendingWrite>,
    entries: Vec<Appended>,
    /// The segment files to fdatasync, each once, with their start: none when its one
    /// entry was written `O_DSYNC`.
    files: Vec<(u64, Rc<DmaFile>)>,
    tail: Tail,
    bytes: u64,
    state: Rc<RefCell<State>>,
    published: Rc<Notify>,
}

impl Drop for Written {
    fn drop(&mut self) {
        let synced = self.state.borrow().groups_durable > self.ticket;
        if !synced {
            self.state
                .borrow_mut()
                .stopped
                .get_or_insert_with(|| "a written group was dropped before its sync".into());
            self.published.notify();
        }
    }
}

/// One entry's O_DIRECT write in flight, and what it must write.
struct PendingWrite {
    task: glommio::Task<std::result::Result<usize, String>>,
    expected: u64,
    /// The segment it writes into (named only if it fails).
    segment_start: u64,
}

/// Checks an entry read back at `location`: its envelope, then the chunk.
fn verify_entry(entry: &[u8], location: Location) -> Result<ChunkHeader, String> {
    if (entry.len() as u64) < location.entry_len() {
        return Err(format!("read {} of {} bytes", entry.len(), location.entry_len()));
    }
    let (envelope, _) = Envelope::parse(entry.first_chunk().expect("an entry is at least 4 KiB"))
        .map_err(|e| e.to_string())?;
    if envelope.lsn != location.lsn || envelope.chunk_len != location.chunk_len {
        return Err(format!(
            "the envelope says lsn {} and {} chunk bytes",
            envelope.lsn, envelope.chunk_len
        ));
    }
    recovery::verify_chunk(Some(entry), &envelope)
}

fn damaged(dir: &Path, reason: impl Into<String>) -> JournalError {
    JournalError::Damaged { path: dir.display().to_string(), reason: reason.into() }
}

/// Opens the segment files in `dir` in LSN order and checks they are contiguous. A last
/// file of no whole blocks is a creation a crash interrupted: it held nothing and is
/// removed.
async fn list_segments(dir: &Path) -> Result<Vec<Segment>, JournalError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error("listing", dir, e))? {
        let entry = entry.map_err(|e| io_error("listing", dir, e))?;
        if let Some(start) = entry.file_name().to_str().and_then(parse_segment_name) {
            found.push((start, entry.path()));
        }
    }
    found.sort_unstable();
    let count = found.len();
    let mut segments: Vec<Segment> = Vec::with_capacity(count);
    for (index, (start, path)) in found.into_iter().enumerate() {
        let file = open_rw(&path).await?;
        let len = file.file_size().await.map_err(|e| io_error("sizing", &path, e))?;
        if len == 0 || !len.is_multiple_of(BLOCK) {
            if index + 1 == count {
                file.remove().await.map_err(|e| io_error("deleting", &path, e))?;
                break;
            }
            return Err(damaged(dir, format!("segment {} is {len} bytes", path.display())));
        }
        if let Some(previous) = segments.last()
            && previous.end() != start
        {
            return Err(damaged(
                dir,
                format!("segment {start} does not follow the segment ending at {}", previous.end()),
            ));
        }
        let dsync = open_dsync(&path).await?;
        segments.push(Segment { start, len, file: Rc::new(file), dsync, path });
    }
    Ok(segments)
}

/// Segments after the tail's are empty; every one of them must take the largest entry,
/// since the entry after a segment's last one goes to the very next segment. From the
/// first that cannot (written under a smaller `segment_bytes`), they are removed.
async fn drop_unusable_spares(
    segments: &mut Vec<Segment>,
    tail: Option<&Tail>,
    options: &JournalConfig,
    stats: &mut JournalStats,
) -> Result<(), JournalError> {
    let first_empty = match tail {
        Some(tail) => segments.partition_point(|s| s.start <= tail.lsn),
        None => 0,
    };
    let Some(cut) =
        (first_empty..segments.len()).find(|&i| segments[i].len < options.segment_bytes)
    else {
        return Ok(());
    };
    for segment in segments.drain(cut..).rev() {
        segment.file.remove().await.map_err(|e| io_error("deleting", &segment.path, e))?;
        stats.segments_deleted += 1;
    }
    Ok(())
}

/// The epoch of the last open, from the better of the epoch file's two slots.
async fn read_epoch(dir: &Path) -> Result<Option<u64>, JournalError> {
    let path = dir.join(EPOCH_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let file = DmaFile::open(&path).await.map_err(|e| io_error("opening", &path, e))?;
    let slots = file
        .read_at_aligned(0, (EPOCH_SLOTS * BLOCK) as usize)
        .await
        .map_err(|e| io_error("reading", &path, e))?;
    file.close().await.map_err(|e| io_error("closing", &path, e))?;
    // None when no slot holds a record: a first open that crashed before its epoch was
    // durable (then no segment exists either; the caller checks).
    Ok(slots.chunks(ALIGNMENT).filter_map(|slot| envelope::parse_epoch(slot).ok()).max())
}

/// Makes `epoch` durable in its slot before the journal writes anything in it.
async fn write_epoch(dir: &Path, directory: &Directory, epoch: u64) -> Result<(), JournalError> {
    let path = dir.join(EPOCH_FILE);
    let created = !path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .dma_open(&path)
        .await
        .map_err(|e| io_error("opening", &path, e))?;
    let mut slot = file.alloc_dma_buffer(ALIGNMENT);
    envelope::write_epoch(epoch, slot.as_bytes_mut());
    let at = (epoch % EPOCH_SLOTS) * BLOCK;
    let written = file.write_at(slot, at).await.map_err(|e| io_error("writing", &path, e))?;
    if written != ALIGNMENT {
        return Err(io_error("writing", &path, format!("short write of {written} bytes")));
    }
    file.fdatasync().await.map_err(|e| io_error("syncing", &path, e))?;
    file.close().await.map_err(|e| io_error("closing", &path, e))?;
    if created {
        directory.sync().await.map_err(|e| io_error("syncing", dir, e))?;
    }
    Ok(())
}
