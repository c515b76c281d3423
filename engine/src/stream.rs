//! A stream's leader state: the one place its records are sequenced, stamped, checked
//! and framed into chunks, and where its tail and its recent chunks live.
//!
//! This is a state machine with no I/O and no clock of its own: the shard that owns the
//! stream feeds it appends, seals its chunks and reports which are durable, and asks it
//! for pages. That keeps every rule here testable against a reference model, and keeps
//! all waiting (for durability, for new records) in the shard.
//!
//! Life of a batch: [`Leader::append`] checks it (fencing, `match_seq_num`, throughput,
//! memory, in the order of `decisions.md`), stamps it, and copies its stored records
//! once into the open chunk; the batch now has its sequence numbers but is invisible.
//! The shard takes sealed chunks with [`Leader::take_sealed`], makes them durable, and
//! reports each with [`Leader::on_durable`], which moves the visible tail. A batch is
//! visible exactly when it is durable, never before.
//!
//! Invariants, asserted: sequence numbers are contiguous with no gap or overlap from the
//! first record to `next_seq_num`; timestamps never decrease; chunks become durable in
//! sequence order; the visible tail never passes the sequenced one.

use std::collections::VecDeque;
use std::ops::Range;
use std::rc::Rc;

use crate::batch::BatchSummary;
use crate::chunk::{ChunkBuilder, ChunkHeader, ChunkStorage, Records, SealedChunk};
use crate::error::{Error, Result};
use crate::ids::StreamId;
use crate::limits::SEQ_NUM_MAX;
use crate::options::{ProducerPolicy, StreamOptions};
use crate::pieces::Pieces;
use crate::position::{Position, Tail};
use crate::record;
use crate::throughput::TokenBucket;
use crate::timestamp::{self, Offered};

/// Anything that can show a chunk's records: a sealed chunk still in its write buffer,
/// or one read back from storage.
///
/// # Safety
/// `chunk_bytes` returns the same bytes at the same address, unchanged, for as long as
/// the value is shared (behind an `Rc` with other counts): a shard lends them to the
/// uploader's thread that way (`loan::ChunkLoan`).
pub unsafe trait ChunkSource {
    fn records(&self) -> Records<'_>;
    /// The whole chunk (header, records, directory) as stored.
    fn chunk_bytes(&self) -> &[u8];
}

// SAFETY: a sealed chunk's bytes are its storage's. Every `ChunkStorage` nova has
// (`AlignedBuf`, `JournalBuffer`, `ShardBuf`) keeps them in a heap allocation it owns
// and changes them only through `&mut` (`envelope_mut`, `ChunkStorage::storage_mut`),
// which a shared chunk does not give.
unsafe impl<B: ChunkStorage> ChunkSource for SealedChunk<B> {
    fn records(&self) -> Records<'_> {
        SealedChunk::records(self)
    }

    fn chunk_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

/// What the shard's memory budget counts for `records` records of `data_len` stored
/// bytes: the records and their directory entries, which a chunk holds for each (a
/// chunk's bytes less its 64-byte header). Counting the records alone let a cache of
/// tiny records hold several times its budget.
pub fn metered_bytes(records: u64, data_len: u64) -> u64 {
    data_len + crate::chunk::DIR_ENTRY_LEN as u64 * records
}

/// A durable chunk copied into memory of its own size: what the cache keeps of a chunk
/// that fills less than half of the buffer it was built in (a small batch in a fresh
/// buffer), so that a cached chunk costs about the bytes the memory budget counts.
pub struct KeptChunk {
    bytes: Box<[u8]>,
    header: ChunkHeader,
}

impl KeptChunk {
    /// Whether a chunk of `chunk_len` bytes in a buffer of `footprint` bytes is better
    /// kept as a copy.
    pub fn is_sparse(chunk_len: usize, footprint: usize) -> bool {
        chunk_len * 2 < footprint
    }

    /// A copy of a chunk this process wrote or verified (`header` is its header).
    pub fn copy_of(chunk: &[u8], header: ChunkHeader) -> Self {
        debug_assert_eq!(chunk.len() as u64, header.chunk_len());
        Self { bytes: chunk.into(), header }
    }
}

// SAFETY: a kept chunk's bytes are a boxed slice it owns and never changes.
unsafe impl ChunkSource for KeptChunk {
    fn records(&self) -> Records<'_> {
        crate::chunk::verified_records(&self.bytes, &self.header)
    }

    fn chunk_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Where a durable chunk's bytes are: in memory, or only in storage at location `L`.
#[derive(Clone)]
pub enum ChunkBytes<L> {
    Memory(Rc<dyn ChunkSource>),
    Stored(L),
}

/// The buffer sizes a stream's open chunk is built in: `start` bytes at first (or what
/// its first batch needs), doubled as batches need room, up to `max`; a batch that would
/// take it past `max` goes to the next chunk. Express chunks start at their target, so
/// the hot path never copies a chunk to grow it; standard chunks start at what their
/// first batch needs, so a stream of small appends does not hold `batch_max_bytes` per
/// chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSizes {
    pub start: usize,
    pub max: usize,
}

/// A durable chunk of the stream.
#[derive(Clone)]
pub struct DurableChunk<L> {
    pub first_seq_num: u64,
    pub record_count: u32,
    pub last_timestamp: u64,
    /// Stored-record bytes.
    pub data_len: u32,
    /// Where the chunk is stored (kept when it is also in memory).
    pub location: L,
    /// The bytes, if in memory.
    pub cached: Option<Rc<dyn ChunkSource>>,
}

impl<L> DurableChunk<L> {
    /// A chunk known from its header (recovery, or after a write).
    pub fn new(header: &ChunkHeader, location: L, cached: Option<Rc<dyn ChunkSource>>) -> Self {
        Self {
            first_seq_num: header.first_seq_num,
            record_count: header.record_count,
            last_timestamp: header.last_timestamp,
            data_len: header.data_len,
            location,
            cached,
        }
    }

    /// What the memory budget counts for it while cached ([`metered_bytes`]).
    pub fn metered(&self) -> u64 {
        metered_bytes(self.record_count.into(), self.data_len.into())
    }

    fn end_seq_num(&self) -> u64 {
        self.first_seq_num + u64::from(self.record_count)
    }
}

/// One append, validated and decoded by the caller (batch::validate; framing or JSON).
#[derive(Clone, Copy, Debug)]
pub struct AppendInput<'a> {
    /// Stored lengths (little-endian u32 per record) and the stored records.
    pub lengths: &'a [u8],
    pub data: Pieces<'a>,
    pub summary: BatchSummary,
    /// What the records offered as timestamps.
    pub offered: Offered,
    pub match_seq_num: Option<u64>,
    pub fencing_token: Option<&'a str>,
}

/// Where a stream stands for the conditions of an append: what checks (1) to (3) of an
/// append's order (decisions.md, "Appends") read.
#[derive(Clone, Copy, Debug)]
pub struct Standing<'a> {
    pub options: &'a StreamOptions,
    pub fencing_token: &'a str,
    /// The number the next sequenced record takes (in-flight batches included).
    pub next_seq_num: u64,
    /// The stamp of the last sequenced batch.
    pub last_timestamp: u64,
}

impl Standing<'_> {
    /// A stream not made yet, as creating it from `options` would make it: empty, its
    /// fencing token never set.
    pub fn fresh(options: &StreamOptions) -> Standing<'_> {
        Standing { options, fencing_token: "", next_seq_num: 0, last_timestamp: 0 }
    }

    /// Checks, in order, the batch's numbering and stamping (1), its fencing token
    /// against the producer policy (2) and its `match_seq_num` (3); the batch's stamp
    /// when they pass.
    pub fn check(&self, input: &AppendInput<'_>, arrival_ms: u64) -> Result<u64> {
        // (1) well-formedness that depends on the stream: numbering and stamping.
        // The last number a record may take is SEQ_NUM_MAX, so the end (exclusive) of a
        // batch is at most SEQ_NUM_MAX + 1 = u64::MAX.
        let count = u64::from(input.summary.records);
        const _: () = assert!(SEQ_NUM_MAX == u64::MAX - 1);
        if count > u64::MAX - self.next_seq_num {
            return Err(Error::SeqNumOverflow { next_seq_num: self.next_seq_num, count });
        }
        let stamp = timestamp::stamp(
            self.options.timestamping_mode,
            self.options.timestamping_uncapped,
            &input.offered,
            arrival_ms,
            self.last_timestamp,
        )?;
        // (2) fencing token and producer policy.
        match input.fencing_token {
            Some(token) if token != self.fencing_token => {
                return Err(Error::FencingTokenMismatch {
                    field: "fencing_token",
                    current: self.fencing_token.to_owned(),
                });
            }
            None if self.options.producer_policy == ProducerPolicy::Fenced => {
                return Err(Error::FencingTokenMissing { current: self.fencing_token.to_owned() });
            }
            _ => {}
        }
        // (3) match_seq_num, counting batches sequenced but not yet durable.
        if let Some(expected) = input.match_seq_num
            && expected != self.next_seq_num
        {
            return Err(Error::SeqNumMismatch {
                match_seq_num: expected,
                next_seq_num: self.next_seq_num,
            });
        }
        Ok(stamp)
    }
}

impl AppendInput<'_> {
    /// What the batch takes of its shard's memory budget.
    pub fn metered_bytes(&self) -> u64 {
        metered_bytes(self.summary.records.into(), self.data.len() as u64)
    }
}

/// A sequenced batch: where it landed. Durable (and acknowledged) once the visible tail
/// reaches `end.seq_num`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sequenced {
    pub start: Position,
    /// One past the last record, with the batch's timestamp.
    pub end: Position,
}

/// Where a read starts (streams.md, "Reads").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStart {
    SeqNum(u64),
    /// The first record stamped at or after this (ms).
    Timestamp(u64),
    /// This many records before the tail.
    TailOffset(u64),
}

/// The bounds of one page: the caller's (`count`, `bytes`, `until`) already folded with
/// the server's page caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLimits {
    pub records: u64,
    /// Content bytes; the first record is returned even when it alone is larger.
    pub bytes: u64,
    /// Stop before the first record stamped at or after this.
    pub until: Option<u64>,
}

/// A step of a read: done, or a stored chunk must be loaded first
/// ([`Leader::install_loaded`]), then ask again.
pub enum Step<T, L> {
    Ready(T),
    Load { first_seq_num: u64, location: L },
}

/// A page of records: slices of chunks, to be sent as they are.
pub struct Page {
    pub parts: Vec<PagePart>,
    /// Where the next read should start.
    pub next_seq_num: u64,
    pub tail: Tail,
    /// Content bytes in the page.
    pub content_bytes: u64,
    /// Whether `until` ended the page (a subscription with `until` is then complete).
    pub reached_until: bool,
}

impl Page {
    /// Records in the page.
    pub fn record_count(&self) -> u64 {
        self.parts.iter().map(|p| p.range.len() as u64).sum()
    }
}

/// Records `range` of one chunk.
pub struct PagePart {
    pub chunk: Rc<dyn ChunkSource>,
    pub range: Range<usize>,
}

impl PagePart {
    /// The records of this part.
    pub fn records(&self) -> Records<'_> {
        self.chunk.records().slice(self.range.clone())
    }
}

/// The state a leader starts from: the stream's record and its durable chunks.
pub struct LeaderInit<L> {
    pub id: StreamId,
    pub options: StreamOptions,
    pub fencing_token: String,
    pub trim_seq_num: u64,
    /// The tail's timestamp when the watermark last moved: the tail's, when no chunk is
    /// left above the watermark.
    pub trim_timestamp: u64,
    /// Durable chunks in sequence order (recovery).
    pub chunks: Vec<DurableChunk<L>>,
    pub now_ms: u64,
}

/// A stream's leader state.
pub struct Leader<B: ChunkStorage, L> {
    id: StreamId,
    options: StreamOptions,
    fencing_token: String,
    trim_seq_num: u64,
    /// The number the next sequenced record takes (in-flight batches included).
    next_seq_num: u64,
    /// The stamp of the last sequenced batch.
    last_timestamp: u64,
    /// The visible tail: everything below is durable.
    durable: Tail,
    open: Option<ChunkBuilder<B>>,
    /// Sealed chunks not yet handed out by `take_sealed`.
    sealed: Vec<SealedChunk<B>>,
    /// End sequence numbers of chunks handed out and not yet durable, in order.
    in_flight: VecDeque<u64>,
    /// The path of the chunks in flight ([`Leader::take_sealed`]).
    in_flight_path: u8,
    /// Durable chunks at or above the trim watermark, contiguous, in order.
    chunks: VecDeque<DurableChunk<L>>,
    throughput: TokenBucket,
    deleted: bool,
}

impl<B: ChunkStorage, L: Clone> Leader<B, L> {
    /// A leader continuing exactly where its durable chunks end.
    ///
    /// # Panics
    /// If the chunks are not contiguous: recovery hands over a gap-free run.
    pub fn new(init: LeaderInit<L>) -> Self {
        let mut chunks = VecDeque::from(init.chunks);
        for pair in chunks.make_contiguous().windows(2) {
            assert_eq!(
                pair[0].end_seq_num(),
                pair[1].first_seq_num,
                "recovered chunks are contiguous"
            );
            assert!(pair[0].last_timestamp <= pair[1].last_timestamp, "timestamps never decrease");
        }
        // With every chunk trimmed away, numbering continues at the watermark (the
        // trimmed records' numbers are never reused) and stamps from the last one's.
        let trimmed = Tail { seq_num: init.trim_seq_num, timestamp: init.trim_timestamp };
        let durable = chunks
            .back()
            .map_or(trimmed, |c| Tail { seq_num: c.end_seq_num(), timestamp: c.last_timestamp });
        let mut leader = Self {
            id: init.id,
            throughput: TokenBucket::new(init.options.throughput_max_bytes_per_second, init.now_ms),
            options: init.options,
            fencing_token: init.fencing_token,
            trim_seq_num: 0,
            next_seq_num: durable.seq_num,
            last_timestamp: durable.timestamp,
            durable,
            open: None,
            sealed: Vec::new(),
            in_flight: VecDeque::new(),
            in_flight_path: 0,
            chunks,
            deleted: false,
        };
        leader.set_trim(init.trim_seq_num);
        leader
    }

    pub fn id(&self) -> StreamId {
        self.id
    }

    /// What the conditions of the next append are checked against.
    fn standing(&self) -> Standing<'_> {
        Standing {
            options: &self.options,
            fencing_token: &self.fencing_token,
            next_seq_num: self.next_seq_num,
            last_timestamp: self.last_timestamp,
        }
    }

    pub fn options(&self) -> &StreamOptions {
        &self.options
    }

    /// The visible tail.
    pub fn tail(&self) -> Tail {
        self.durable
    }

    /// The number the next sequenced record takes (counting batches not yet durable).
    pub fn next_seq_num(&self) -> u64 {
        self.next_seq_num
    }

    pub fn fencing_token(&self) -> &str {
        &self.fencing_token
    }

    pub fn trim_seq_num(&self) -> u64 {
        self.trim_seq_num
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted
    }

    /// Refuses everything from now on: the stream is being deleted.
    pub fn mark_deleted(&mut self) {
        self.deleted = true;
    }

    /// Undoes [`Leader::mark_deleted`] when the deletion could not be recorded.
    pub fn unmark_deleted(&mut self) {
        self.deleted = false;
    }

    /// New options (ReconfigureStream); the class and triggers apply to the next chunk.
    pub fn set_options(&mut self, options: StreamOptions, now_ms: u64) {
        self.throughput.set_rate(options.throughput_max_bytes_per_second, now_ms);
        // The open chunk was built for its class's path: it goes out sealed, so that a
        // batch under the new class never grows it into the other path's buffer.
        if options.class != self.options.class
            && let Some(open) = self.open.take()
        {
            self.sealed.push(open.seal());
        }
        self.options = options;
    }

    /// Sequences one batch: checks it, stamps it, and copies its records into the open
    /// chunk. `reserve` takes the batch's bytes from the shard's memory budget (or
    /// refuses); `buffer` makes a chunk buffer of at least the given capacity, `sizes`
    /// says which.
    pub fn append(
        &mut self,
        input: &AppendInput<'_>,
        arrival_ms: u64,
        sizes: ChunkSizes,
        reserve: &mut dyn FnMut(u64) -> Result<()>,
        buffer: &mut dyn FnMut(usize) -> B,
    ) -> Result<Sequenced> {
        if self.deleted {
            return Err(Error::internal("append to a deleted stream's leader"));
        }
        let stamp = self.standing().check(input, arrival_ms)?;
        // (4) throughput cap, then the memory budget.
        let count = u64::from(input.summary.records);
        self.throughput.check(input.summary.content_bytes, arrival_ms)?;
        reserve(input.metered_bytes())?;
        self.throughput.take(input.summary.content_bytes);

        let start = Position { seq_num: self.next_seq_num, timestamp: stamp };
        self.frame(input, stamp, sizes, buffer);
        self.next_seq_num += count;
        self.last_timestamp = stamp;
        Ok(Sequenced { start, end: Position { seq_num: self.next_seq_num, timestamp: stamp } })
    }

    /// Copies the batch into the open chunk: grown to fit it within `sizes.max`, else
    /// sealed first and a new one opened.
    fn frame(
        &mut self,
        input: &AppendInput<'_>,
        stamp: u64,
        sizes: ChunkSizes,
        buffer: &mut dyn FnMut(usize) -> B,
    ) {
        let (records, bytes) = (input.summary.records as usize, input.data.len());
        if let Some(open) = &mut self.open
            && !open.fits(records, bytes)
        {
            let needed = open.capacity_with(records, bytes);
            if needed <= sizes.max {
                open.grow_into(buffer(needed.max(2 * open.capacity()).min(sizes.max)));
            } else {
                let full = self.open.take().expect("checked just above");
                self.sealed.push(full.seal());
            }
        }
        let id = self.id;
        let next = self.next_seq_num;
        let open = self.open.get_or_insert_with(|| {
            let needed = ChunkBuilder::<B>::capacity_for(records, bytes);
            ChunkBuilder::with_buffer(buffer(needed.max(sizes.start)), id, next)
        });
        debug_assert_eq!(open.next_seq_num(), next, "the open chunk continues the stream");
        open.push_batch(input.lengths, input.data, stamp)
            .expect("an empty chunk is sized for the batch, a non-empty one was made to fit");
    }

    /// Stored bytes sequenced into the open chunk and not yet sealed.
    pub fn open_bytes(&self) -> usize {
        self.open.as_ref().map_or(0, ChunkBuilder::data_len)
    }

    /// Records in the open chunk.
    pub fn open_records(&self) -> usize {
        self.open.as_ref().map_or(0, ChunkBuilder::len)
    }

    /// Whether the standard-class flush triggers (bytes or records) say to cut now; the
    /// delay trigger is the shard's timer.
    pub fn flush_due_by_size(&self) -> bool {
        let records_max = self.options.batch_max_records as usize;
        !self.sealed.is_empty()
            || self.open_bytes() >= self.options.batch_max_bytes as usize
            || (records_max != 0 && self.open_records() >= records_max)
    }

    /// Seals the open chunk and hands out sealed chunks, in order, to be made durable.
    /// Each must come back through [`Leader::on_durable`] in this order.
    ///
    /// `path` names the way a chunk in its buffer becomes durable (the journal, a
    /// bundle). Two paths do not keep each other's order, so chunks go out on one path
    /// at a time: the first on another path than the chunks in flight, and every one
    /// after it, wait until those are durable ([`Leader::has_unflushed`]). A stream's
    /// chunks change path when its class changes.
    pub fn take_sealed(&mut self, path: impl Fn(&B) -> u8) -> Vec<SealedChunk<B>> {
        // The next chunk cannot go yet: then nothing is sealed either (the open chunk
        // goes on filling, and is cut by its own triggers).
        let next = self.sealed.first().map(|c| path(c.storage())).or_else(|| {
            self.open.as_ref().filter(|open| !open.is_empty()).map(|open| path(open.storage()))
        });
        if !self.in_flight.is_empty() && next.is_some_and(|next| next != self.in_flight_path) {
            return Vec::new();
        }
        if let Some(open) = self.open.take()
            && !open.is_empty()
        {
            self.sealed.push(open.seal());
        }
        let mut going = (!self.in_flight.is_empty()).then_some(self.in_flight_path);
        let taken = self
            .sealed
            .iter()
            .take_while(|chunk| {
                let chunk_path = path(chunk.storage());
                let same = going.is_none_or(|on| on == chunk_path);
                going = Some(chunk_path);
                same
            })
            .count();
        let sealed: Vec<_> = self.sealed.drain(..taken).collect();
        if let Some(chunk) = sealed.first() {
            self.in_flight_path = path(chunk.storage());
        }
        for chunk in &sealed {
            self.in_flight
                .push_back(chunk.header().first_seq_num + u64::from(chunk.header().record_count));
        }
        sealed
    }

    /// Whether sequenced records wait to be handed out: in sealed chunks, or in the
    /// open one ([`Leader::take_sealed`] holds them back while another path has chunks
    /// in flight).
    pub fn has_unflushed(&self) -> bool {
        !self.sealed.is_empty() || self.open.as_ref().is_some_and(|open| !open.is_empty())
    }

    /// A handed-out chunk is durable: it becomes visible and the tail moves.
    ///
    /// # Panics
    /// If chunks come back out of order: durability is reported in sequence order.
    pub fn on_durable(&mut self, chunk: DurableChunk<L>) {
        assert_eq!(
            chunk.first_seq_num, self.durable.seq_num,
            "chunks become durable in sequence order"
        );
        assert_eq!(
            self.in_flight.pop_front(),
            Some(chunk.end_seq_num()),
            "the chunk was handed out"
        );
        assert!(chunk.last_timestamp >= self.durable.timestamp, "timestamps never decrease");
        self.durable = Tail { seq_num: chunk.end_seq_num(), timestamp: chunk.last_timestamp };
        assert!(
            self.durable.seq_num <= self.next_seq_num,
            "the visible tail never passes the sequenced one"
        );
        if chunk.end_seq_num() > self.trim_seq_num {
            self.chunks.push_back(chunk);
        }
    }

    /// Whether every sequenced batch is durable.
    pub fn is_settled(&self) -> bool {
        self.durable.seq_num == self.next_seq_num
    }

    /// Checks a Fence request and sets the new token. The shard persists it first and
    /// calls this only once the token is durable.
    pub fn check_fence(&self, expected: Option<&str>) -> Result<()> {
        match expected {
            Some(expected) if expected != self.fencing_token => Err(Error::FencingTokenMismatch {
                field: "expected",
                current: self.fencing_token.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Installs a new fencing token (after it is durable in metadata).
    pub fn set_fencing_token(&mut self, token: String) {
        self.fencing_token = token;
    }

    /// The trim watermark for a Trim to `seq_num`: forward only, never past the tail.
    pub fn trim_target(&self, seq_num: u64) -> u64 {
        seq_num.min(self.durable.seq_num).max(self.trim_seq_num)
    }

    /// Moves the trim watermark (after it is durable in metadata) and forgets chunks
    /// wholly below it. Returns the metered bytes ([`metered_bytes`]) of cached chunks
    /// dropped.
    pub fn set_trim(&mut self, seq_num: u64) -> u64 {
        self.trim_seq_num = self.trim_seq_num.max(seq_num);
        let mut freed = 0;
        while let Some(front) = self.chunks.front()
            && front.end_seq_num() <= self.trim_seq_num
        {
            let front = self.chunks.pop_front().expect("checked just above");
            if front.cached.is_some() {
                freed += front.metered();
            }
        }
        freed
    }

    /// Where a read starts, as a sequence number at or above the trim watermark and at
    /// most the tail. A start past the tail is OutOfRange unless `clamp`.
    pub fn locate(&self, start: ReadStart, clamp: bool) -> Result<Step<u64, L>> {
        let tail = self.durable.seq_num;
        let first = self.trim_seq_num.min(tail);
        let seq = match start {
            ReadStart::SeqNum(seq) if seq > tail && !clamp => {
                return Err(Error::PastTail { start: seq, tail: self.durable });
            }
            ReadStart::SeqNum(seq) => seq.min(tail),
            ReadStart::TailOffset(offset) => tail.saturating_sub(offset),
            ReadStart::Timestamp(time) => {
                let index = self.chunks.partition_point(|c| c.last_timestamp < time);
                let Some(chunk) = self.chunks.get(index) else { return Ok(Step::Ready(tail)) };
                let Some(cached) = &chunk.cached else {
                    return Ok(Step::Load {
                        first_seq_num: chunk.first_seq_num,
                        location: chunk.location.clone(),
                    });
                };
                chunk.first_seq_num + cached.records().first_at_or_after(time) as u64
            }
        };
        Ok(Step::Ready(seq.max(first)))
    }

    /// One page from `from` (a located start), within `limits`. At a chunk that is only
    /// in storage it asks to load it when the page has no records yet or `may_load`
    /// (the caller bounds the loads of one page), and else ends the page there.
    pub fn page(&self, from: u64, limits: PageLimits, may_load: bool) -> Step<Page, L> {
        let mut page = Page {
            parts: Vec::new(),
            next_seq_num: from,
            tail: self.durable,
            content_bytes: 0,
            reached_until: false,
        };
        let mut seq = from.max(self.trim_seq_num);
        let mut records = 0u64;
        while seq < self.durable.seq_num && records < limits.records {
            let index = self.chunks.partition_point(|c| c.end_seq_num() <= seq);
            let chunk = &self.chunks[index];
            let Some(cached) = &chunk.cached else {
                if page.parts.is_empty() || may_load {
                    return Step::Load {
                        first_seq_num: chunk.first_seq_num,
                        location: chunk.location.clone(),
                    };
                }
                break;
            };
            let view = cached.records();
            let first = (seq - chunk.first_seq_num) as usize;
            let mut next = first;
            while next < view.len() {
                if records >= limits.records {
                    break;
                }
                if limits.until.is_some_and(|until| view.timestamp(next) >= until) {
                    page.reached_until = true;
                    break;
                }
                let size = record::decode(view.record(next))
                    .expect("records in a durable chunk were validated")
                    .content_len();
                if records > 0 && page.content_bytes + size > limits.bytes {
                    break;
                }
                page.content_bytes += size;
                records += 1;
                next += 1;
            }
            if next > first {
                page.parts.push(PagePart { chunk: Rc::clone(cached), range: first..next });
            }
            seq = chunk.first_seq_num + next as u64;
            if next < view.len() {
                break;
            }
        }
        // At the tail, a bound `until` at or below the last stamp is reached for good:
        // stamps never decrease, so every record still to come is stamped at or after it.
        if seq == self.durable.seq_num
            && limits.until.is_some_and(|until| self.durable.timestamp >= until)
        {
            page.reached_until = true;
        }
        page.next_seq_num = seq;
        Step::Ready(page)
    }

    /// Every durable chunk held (at or above the trim watermark), in sequence order.
    pub fn durable_chunks(&self) -> impl Iterator<Item = &DurableChunk<L>> + '_ {
        self.chunks.iter()
    }

    /// The durable chunks holding records from `from` within `limits`, in order, judged
    /// by chunk (record counts, stored bytes, and the last timestamp against `until`):
    /// what a ReadPlan lists. The last chunk may hold records past the limits.
    pub fn chunks_from(
        &self,
        from: u64,
        limits: PageLimits,
    ) -> impl Iterator<Item = &DurableChunk<L>> + '_ {
        let from = from.max(self.trim_seq_num);
        let first = self.chunks.partition_point(|c| c.end_seq_num() <= from);
        let (mut records, mut bytes, mut done) = (0u64, 0u64, false);
        self.chunks.range(first..).take_while(move |chunk| {
            if done || records >= limits.records || (records > 0 && bytes >= limits.bytes) {
                return false;
            }
            records += chunk.end_seq_num() - chunk.first_seq_num.max(from);
            bytes += u64::from(chunk.data_len);
            done = limits.until.is_some_and(|until| chunk.last_timestamp >= until);
            true
        })
    }

    /// Puts a chunk read back from storage into the cache. Returns its metered bytes
    /// (what the cache now holds), or 0 if it is no longer needed.
    pub fn install_loaded(&mut self, first_seq_num: u64, chunk: Rc<dyn ChunkSource>) -> u64 {
        let index = self.chunks.partition_point(|c| c.first_seq_num < first_seq_num);
        match self.chunks.get_mut(index) {
            Some(entry) if entry.first_seq_num == first_seq_num && entry.cached.is_none() => {
                entry.cached = Some(chunk);
                entry.metered()
            }
            _ => 0,
        }
    }

    /// A durable chunk moved (uploaded from the journal, or settled): it is now at
    /// `location`. When it is cached and `bytes` is given (the same chunk in another
    /// buffer), the cache serves from `bytes` from now on. Returns whether the chunk is
    /// cached (false when not in memory, or no longer held: trimmed).
    pub fn relocate(
        &mut self,
        first_seq_num: u64,
        location: L,
        bytes: Option<Rc<dyn ChunkSource>>,
    ) -> bool {
        let index = self.chunks.partition_point(|c| c.first_seq_num < first_seq_num);
        let Some(entry) = self.chunks.get_mut(index).filter(|c| c.first_seq_num == first_seq_num)
        else {
            return false;
        };
        entry.location = location;
        match (&mut entry.cached, bytes) {
            (Some(cached), Some(bytes)) => {
                debug_assert_eq!(bytes.records().len(), entry.record_count as usize);
                *cached = bytes;
                true
            }
            (cached, _) => cached.is_some(),
        }
    }

    /// Whether chunks handed out for durability are not durable yet.
    pub fn has_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Whether the durable chunk starting at `first_seq_num` is held and cached.
    pub fn is_cached(&self, first_seq_num: u64) -> bool {
        let index = self.chunks.partition_point(|c| c.first_seq_num < first_seq_num);
        self.chunks
            .get(index)
            .is_some_and(|c| c.first_seq_num == first_seq_num && c.cached.is_some())
    }

    /// Where the durable chunk starting at `first_seq_num` is, while it is held.
    pub fn location_of(&self, first_seq_num: u64) -> Option<&L> {
        let index = self.chunks.partition_point(|c| c.first_seq_num < first_seq_num);
        self.chunks.get(index).filter(|c| c.first_seq_num == first_seq_num).map(|c| &c.location)
    }

    /// Drops the cached bytes of the chunk starting at `first_seq_num` (it stays
    /// readable from storage). Returns the metered bytes freed, if it was cached.
    pub fn evict(&mut self, first_seq_num: u64) -> Option<u64> {
        let index = self.chunks.partition_point(|c| c.first_seq_num < first_seq_num);
        let entry = self.chunks.get_mut(index).filter(|c| c.first_seq_num == first_seq_num)?;
        entry.cached.take().map(|_| entry.metered())
    }

    /// Metered bytes of every cached durable chunk.
    pub fn cached_bytes(&self) -> u64 {
        self.chunks.iter().filter(|c| c.cached.is_some()).map(DurableChunk::metered).sum()
    }
}

#[cfg(test)]
mod tests;
