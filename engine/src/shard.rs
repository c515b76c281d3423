//! A shard: one glommio executor on one core that owns a set of streams (by a hash of
//! their IDs) and is the leader of each. It alone mutates their state: no locks and no
//! shared mutable state with other shards. Requests for its streams arrive over a
//! bounded channel ([`crate::node`] routes them) and are answered the same way.
//!
//! What runs here:
//! - the request handlers ([`Shard::handle`]): append, read (with long-poll wait), check
//!   tail, fence, trim, reconfigure, delete;
//! - the flusher: group commit. It seals every express stream's open chunk (and every
//!   standard stream's whose flush trigger fired). Express chunks go to the journal with
//!   one flush per group, then become visible and their batches are acknowledged; appends that
//!   arrive while a group is being written form the next group. Standard chunks go to
//!   the object store as an upload job (`uploads.rs`) and are acknowledged once their
//!   bundle and refs are durable. Express chunks follow as a job of their own, after
//!   which their journal space is given up;
//! - recovery of a stream's leader from its refs and the journal (`recovery.rs`);
//! - the memory budget over stored bytes held, each record's directory entry included
//!   (`stream::metered_bytes`; sequenced and not yet durable, express
//!   chunks not yet in the object store, and cached durable chunks): cached chunks are
//!   evicted oldest first (they stay readable from the journal or the object store);
//!   when only unsettled bytes remain, appends are refused with ResourceExhausted.
//!
//! Never here: blocking calls (metadata answers through futures from its own thread,
//! awaited in the executor's default `Latency::NotImportant` queue, as platform.md
//! requires for anything woken from another thread), and RefCell borrows held across an
//! `.await`.

mod recovery;
mod settle;
mod ticker;
mod uploads;

pub use settle::SettleConfig;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::aligned::AlignedBuf;
use crate::batch;
use crate::chunk::{ChunkBuilder, ChunkHeader, ChunkStorage, SealedChunk};
use crate::control::{Clock, ControlPlane, StreamRecord};
use crate::error::{Error, Result};
use crate::framing::{self, AppendFrame, FramedBody};
use crate::ids::StreamId;
use crate::journal::{
    Appended, Journal, JournalBuffer, JournalError, JournalRead, Location, RecoveredEntry,
};
use crate::latency::Latency;
use crate::limits::{FENCING_TOKEN_BYTES_MAX, Limits};
use crate::meta::RedbMetaStore;
use crate::names::BucketName;
use crate::notify::Notify;
use crate::options::{StorageClass, StreamOptionsPatch};
use crate::position::{Position, Tail};
use crate::stream::{
    AppendInput, ChunkSizes, ChunkSource, DurableChunk, Leader, LeaderInit, PageLimits, ReadStart,
    Step,
};
use crate::timestamp::Offered;
use crate::transit;
use crate::uploader::Uploader;
use uploads::{InFlight, Job};

/// The leader type of a shard.
type ShardLeader = Leader<ShardBuf, Stored>;

/// The buffer a chunk is built in: a DMA buffer for the journal (express), or an
/// aligned allocation that can cross to the uploader's thread (standard). The class in
/// force when a chunk opens picks it; the flusher routes a sealed chunk by it.
pub enum ShardBuf {
    Journal(JournalBuffer),
    Upload(AlignedBuf),
}

impl ShardBuf {
    /// The path a chunk in this buffer takes to durability (`Leader::take_sealed`).
    fn path(&self) -> u8 {
        match self {
            ShardBuf::Journal(_) => 0,
            ShardBuf::Upload(_) => 1,
        }
    }
}

impl ChunkStorage for ShardBuf {
    fn storage(&self) -> &[u8] {
        match self {
            ShardBuf::Journal(buf) => buf.storage(),
            ShardBuf::Upload(buf) => buf.storage(),
        }
    }

    fn storage_mut(&mut self) -> &mut [u8] {
        match self {
            ShardBuf::Journal(buf) => buf.storage_mut(),
            ShardBuf::Upload(buf) => buf.storage_mut(),
        }
    }
}

/// Where a durable chunk of a shard's stream is.
#[derive(Clone, Debug)]
pub enum Stored {
    /// Only in this shard's journal (express, upload not finished).
    Journal(Location),
    /// In the object store, found through its ref.
    Object(Rc<ObjectSlot>),
}

/// A chunk's slot in an object: one ranged GET of `offset..offset + length` of `key`
/// returns its slot envelope and the chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectSlot {
    pub key: Arc<str>,
    pub offset: u64,
    pub length: u64,
}

// SAFETY: a journal read's bytes are glommio's read buffer, on the heap, never written
// after the read.
unsafe impl ChunkSource for JournalRead {
    fn records(&self) -> crate::chunk::Records<'_> {
        JournalRead::records(self)
    }

    fn chunk_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

/// A chunk read back from the object store: its slot's bytes, verified.
struct ObjectChunk {
    slot: s3::Bytes,
    header: ChunkHeader,
}

impl ObjectChunk {
    fn parse(slot: s3::Bytes) -> Result<Self> {
        let parsed = transit::Slot::parse(&slot)?;
        Ok(Self { header: parsed.chunk.header, slot })
    }
}

// SAFETY: an object chunk's bytes are an immutable `Bytes` it owns.
unsafe impl ChunkSource for ObjectChunk {
    fn records(&self) -> crate::chunk::Records<'_> {
        crate::chunk::verified_records(self.chunk_bytes(), &self.header)
    }

    fn chunk_bytes(&self) -> &[u8] {
        &self.slot[transit::SLOT_ENVELOPE_LEN..]
    }
}

/// A cached durable chunk in the order the cache lets go of them.
struct CacheEntry {
    id: StreamId,
    first_seq_num: u64,
    /// The bytes it holds of the memory budget (`stream::metered_bytes`).
    bytes: u64,
}

/// A shard's settings (from `tuning`, via the node).
#[derive(Clone, Debug)]
pub struct ShardConfig {
    pub limits: Limits,
    /// Metered bytes (`stream::metered_bytes`) a shard may hold in memory (unsettled
    /// plus cached).
    pub memory_budget_bytes: u64,
    /// Buffer size an express stream's open chunk starts with.
    pub express_chunk_bytes: usize,
    /// Upload jobs in flight at once (`shard-uploads-in-flight-max`).
    pub uploads_in_flight_max: usize,
    /// Journal groups syncing while the next is written (`journal-syncs-in-flight-max`).
    pub journal_syncs_in_flight_max: usize,
    /// Chunk bytes one upload request gathers from the queue at most: the uploader's
    /// bundle target (a request travels in one bundle), set by the node.
    pub upload_job_bytes_max: u64,
    /// How long a job whose chunks went into a settled object of the uploader's waits
    /// for earlier jobs' refs before it sends its chunks anew, to a bundle
    /// (`uploads.rs`, `RefsTurn`): at most the auditor's interval (the node takes the
    /// smaller). An object is marked dead only once seen unreferenced on two passes an
    /// interval apart.
    pub refs_wait_max: Duration,
    /// The settling duty's target size, age and interval.
    pub settle: SettleConfig,
    /// How often age retention is applied (`retention-interval-ms`).
    pub retention_interval: Duration,
    /// Chunks not in memory one read page loads before it ends (`read-page-loads-max`).
    pub read_page_loads_max: usize,
}

/// Journal chunks found without a ref at start, uploaded per job.
const RECOVERED_PER_JOB: usize = 64;

/// Entries the cache's eviction order may hold before it is first compacted.
const CACHE_ORDER_FLOOR: usize = 4096;

/// An append as it crosses to the owning shard: the whole batch, in binary framing.
#[derive(Clone, Debug)]
pub struct AppendRequest {
    /// The batch in binary framing (`framing.rs`); the JSON path encodes into it. Shared
    /// bytes, in the pieces the body arrived in, so a binary request body reaches the
    /// chunk without being copied first.
    pub framed: FramedBody,
    /// What the records offered as timestamps, when the framing's one batch stamp does
    /// not say it all (JSON records stamp each record or not). `None`: from the framing.
    pub offered: Option<Offered>,
}

/// The checks of an append that need no stream (decisions.md: well-formedness and the
/// limits come first): its framing, its fencing token's length, every record, header and
/// batch limit, and the largest batch the journal (`entry_max`) and the shard's memory
/// budget could ever take. The batch as the leader takes it when it passes.
pub(crate) fn check_append<'a>(
    request: &'a AppendRequest,
    limits: &Limits,
    entry_max: u64,
    memory_budget: u64,
) -> Result<AppendInput<'a>> {
    let frame = AppendFrame::decode_body(&request.framed)?;
    if let Some(token) = frame.conditions.fencing_token
        && token.len() > FENCING_TOKEN_BYTES_MAX
    {
        return Err(Error::FencingTokenTooLong {
            field: "fencing_token",
            len: token.len(),
            limit: FENCING_TOKEN_BYTES_MAX,
        });
    }
    let summary = batch::validate(frame.lengths, frame.data, limits)?;
    // A batch is one chunk at most, and a chunk (with its envelope, padded) one journal
    // entry: refuse what could never be written, before it takes numbers.
    let chunk_bytes = crate::aligned::round_up(ChunkBuilder::<JournalBuffer>::capacity_for(
        summary.records as usize,
        frame.data.len(),
    )) as u64;
    if chunk_bytes > entry_max {
        return Err(Error::BatchTooLargeForJournal { chunk_bytes, limit: entry_max });
    }
    let offered = request.offered.unwrap_or_else(|| {
        std::iter::repeat_n(frame.conditions.timestamp, summary.records as usize).collect()
    });
    let input = AppendInput {
        lengths: frame.lengths,
        data: frame.data,
        summary,
        offered,
        match_seq_num: frame.conditions.match_seq_num,
        fencing_token: frame.conditions.fencing_token,
    };
    let bytes = input.metered_bytes();
    if bytes > memory_budget {
        return Err(Error::BatchOverMemoryBudget { bytes, budget_bytes: memory_budget });
    }
    Ok(input)
}

/// The acknowledgement of an append: where it landed and the tail at the ack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendAck {
    pub start: Position,
    pub end: Position,
    pub tail: Tail,
}

/// A read of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    pub start: ReadStart,
    pub clamp: bool,
    /// The page's bounds, already folded with the page caps of the response format.
    pub limits: PageLimits,
    /// How long to wait for records when none are readable at the start.
    pub wait: Option<Duration>,
}

/// One page, in binary framing: records frames (no page-end frame; the fields say it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadReply {
    /// The stream the page is of: a stream deleted and created again at the same address
    /// is another stream, with another ID.
    pub stream: StreamId,
    pub frames: Vec<u8>,
    pub record_count: u64,
    pub content_bytes: u64,
    pub next_seq_num: u64,
    pub tail: Tail,
    /// The page stopped at `until`.
    pub reached_until: bool,
}

/// A ReadPlan request: where to start and how much (the Read's start and bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanRequest {
    pub start: ReadStart,
    pub clamp: bool,
    pub limits: PageLimits,
}

/// A ReadPlan (streams.md): the extents of the object store that hold the requested
/// records, in order, for clients that read the store directly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    /// The first record the plan is for: the start resolved (a timestamp or tail offset
    /// to its seq_num, a start below the trim watermark to the watermark). Records of
    /// the first extent before it are not part of the answer; they may be trimmed.
    pub start_seq_num: u64,
    pub extents: Vec<Extent>,
    /// Where records only this node holds start (not yet in the object store), when the
    /// request reaches them: read those through the API.
    pub memory_from_seq_num: Option<u64>,
    pub tail: Tail,
}

/// One extent: `length` bytes at `offset` of `object` are one slot (docs/format.md:
/// a 64-byte slot envelope, then a chunk) holding records `first_seq_num` on, `count`
/// of them. The first and last extents may hold records outside the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub object: String,
    pub offset: u64,
    pub length: u64,
    pub first_seq_num: u64,
    pub count: u32,
}

/// Where a Trim goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrimTo {
    SeqNum(u64),
    /// The first record stamped at or after this.
    Timestamp(u64),
}

/// An operation on one stream, sent to its leader.
#[derive(Debug)]
pub enum Op {
    /// An append; `sequenced` is told once the batch has its place in the stream (its
    /// answer comes when it is durable), and dropped unused when it is refused first.
    Append {
        request: AppendRequest,
        sequenced: Option<flume::Sender<()>>,
    },
    /// A read; one that may wait stops waiting once `asker` says its caller has gone
    /// (its sender dropped), so long polls nobody will take hold no handler.
    Read {
        request: ReadRequest,
        asker: Option<flume::Receiver<()>>,
    },
    Plan(PlanRequest),
    CheckTail,
    Fence {
        token: String,
        expected: Option<String>,
    },
    Trim(TrimTo),
    Reconfigure(StreamOptionsPatch),
    Delete,
}

impl Op {
    /// A read, and for one that may wait the sender its caller holds while it waits for
    /// the answer: dropped with the caller, it ends the wait.
    pub(crate) fn read(request: ReadRequest) -> (Op, Option<flume::Sender<()>>) {
        let (asking, asker) = match request.wait {
            Some(_) => {
                let (asking, asker) = flume::bounded(0);
                (Some(asking), Some(asker))
            }
            None => (None, None),
        };
        (Op::Read { request, asker }, asking)
    }
}

/// What a shard answers: the op's result, or the op itself, unused, when no live
/// stream is behind the record it came with (resolve again and resend it).
#[derive(Debug)]
pub enum Answer {
    Done(Result<Reply>),
    Stale(Op),
}

/// A leader's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Appended(AppendAck),
    Read(ReadReply),
    Plan(ReadPlan),
    Tail(Tail),
    Trimmed { trim_seq_num: u64 },
    Reconfigured(Box<StreamRecord>),
    Deleted,
}

/// A stream this shard leads, with what its waiters wait on.
struct Slot {
    bucket: BucketName,
    key: String,
    leader: RefCell<ShardLeader>,
    /// Notified when the visible tail moves, and on deletion.
    changed: Notify,
    /// Queued for the flusher.
    queued: Cell<bool>,
    /// Standard class: a flush trigger fired.
    due: Cell<bool>,
    /// Standard class: a delay timer is running for the open chunk.
    timer_armed: Cell<bool>,
}

impl Slot {
    fn not_found(&self) -> Error {
        Error::StreamNotFound { bucket: self.bucket.to_string(), key: self.key.clone() }
    }
}

/// Counters a benchmark or `/metrics` reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Journal group commits: how long each took (writes and flush), and the chunk
    /// bytes and chunks they held.
    pub journal_groups: Latency,
    pub journal_bytes: u64,
    pub chunks: u64,
    /// Appends and reads of the shard's express streams, and of its standard ones.
    pub express: ClassStats,
    pub standard: ClassStats,
    /// Reads answered without loading a chunk, and chunks read back (from the journal or
    /// the object store) to serve a read: the read cache's hits and misses.
    pub read_cache_hits: u64,
    pub read_cache_misses: u64,
    /// Time the shard's executor spent running tasks and polling I/O (not parked).
    pub busy_micros: u64,
    /// Upload jobs applied (standard acknowledged, or express referenced).
    pub upload_jobs: u64,
    /// Reads waiting for records now (long polls).
    pub reads_waiting: u64,
    /// Appends sequenced and waiting to be durable now.
    pub appends_waiting: u64,
    /// Settled objects written, and settles that failed (tried again later).
    pub settled_objects: u64,
    pub settle_failures: u64,
    /// Of the settled objects, those settled early: runs short of the target and the age
    /// whose chunks were about to leave the cache.
    pub settled_early: u64,
    /// Chunks settled from the shard's cache, and chunks read back from the object store
    /// to be settled.
    pub settled_from_memory: u64,
    pub settled_from_store: u64,
    /// Passes of the retention duty, and trims it made.
    pub retention_passes: u64,
    pub retention_trims: u64,
    /// The settle duty's backlog at its last tick: the age of the oldest transit history
    /// of the shard's streams (0: none). Up to `settle-age-ms` is by design (a quiet
    /// stream's history waits that long); past it, settling is behind.
    pub settle_backlog_ms: u64,
    /// Entries in the cache's eviction order (at most twice the cached chunks, plus 4096).
    pub cache_entries: u64,
    /// Metered bytes held of the memory budget (`--shard-memory-bytes`): unsettled and
    /// cached chunks. It reaches the budget once the cache has filled, and stays there.
    pub memory_held: u64,
    /// The retention duty's backlog at its last pass: how long the most overdue record
    /// had been past its stream's age bound when the pass began (0: none; set before the
    /// pass trims). Up to `retention-interval-ms` is by design; past it, trims are
    /// failing or late.
    pub retention_backlog_ms: u64,
}

impl ShardStats {
    /// Journal group commits written.
    pub fn groups(&self) -> u64 {
        self.journal_groups.count
    }

    /// Appends acknowledged, of either class.
    pub fn batches_acked(&self) -> u64 {
        self.express.appends + self.standard.appends
    }

    fn class_mut(&mut self, class: StorageClass) -> &mut ClassStats {
        match class {
            StorageClass::Express => &mut self.express,
            StorageClass::Standard => &mut self.standard,
        }
    }
}

/// What one storage class's streams on a shard took in and gave out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Appends acknowledged, their records and content bytes, and the time from the
    /// append reaching the shard to its acknowledgement.
    pub appends: u64,
    pub records_in: u64,
    pub bytes_in: u64,
    pub ack_latency: Latency,
    /// Read pages answered (long polls and subscriptions included), their records and
    /// content bytes.
    pub reads: u64,
    pub records_out: u64,
    pub bytes_out: u64,
}

pub(crate) struct Shard {
    index: usize,
    config: ShardConfig,
    control: ControlPlane<RedbMetaStore>,
    clock: Arc<dyn Clock>,
    journal: Rc<Journal>,
    uploader: Uploader,
    streams: RefCell<HashMap<StreamId, Rc<Slot>>>,
    /// Streams whose leaders are being made (their records fetched).
    loading: RefCell<HashSet<StreamId>>,
    loaded: Notify,
    /// Streams with sequenced records for the flusher.
    queue: RefCell<VecDeque<StreamId>>,
    work: Notify,
    /// Metered bytes held: unsettled plus cached.
    held: Cell<u64>,
    /// Cached durable chunks, oldest first: what `make_room` evicts next.
    cache_order: RefCell<VecDeque<CacheEntry>>,
    /// `cache_order`'s length after its last compaction (`cache_push`).
    cache_order_compacted: Cell<usize>,
    /// Metered bytes of every chunk put in `cache_order` so far: the settler's measure of
    /// how fast the cache turns over (`settle.rs`).
    cache_pushed_bytes: Cell<u64>,
    /// Upload jobs not started, and started (in order) (`uploads.rs`).
    jobs: RefCell<VecDeque<Job>>,
    jobs_changed: Notify,
    in_flight: RefCell<VecDeque<InFlight>>,
    in_flight_changed: Notify,
    /// The last job started: its refs have landed (or failed) once this says so.
    last_refs: RefCell<Option<uploads::RefsLanded>>,
    upload_permits: Rc<glommio::sync::Semaphore>,
    /// Jobs queued and not yet applied.
    unapplied: Cell<usize>,
    /// Set when the journal, an upload or the metadata failed: nothing more is
    /// acknowledged until a restart, whose recovery decides from what is durable.
    failed: RefCell<Option<String>>,
    /// The node's record of it, for `/health`.
    node_failed: crate::node::Failed,
    /// Set when the shard stops: the flusher returns once nothing is left to flush.
    stopping: Cell<bool>,
    /// Set when the node starts stopping: waiting reads answer with what they have.
    closing: Cell<bool>,
    stats: RefCell<ShardStats>,
    /// The executor's busy time read so far (`stats`).
    busy: Cell<Duration>,
}

impl Shard {
    pub(crate) fn new(
        index: usize,
        config: ShardConfig,
        control: ControlPlane<RedbMetaStore>,
        clock: Arc<dyn Clock>,
        journal: Journal,
        uploader: Uploader,
        node_failed: crate::node::Failed,
    ) -> Rc<Self> {
        let permits = config.uploads_in_flight_max as u64;
        Rc::new(Self {
            index,
            config,
            control,
            clock,
            journal: Rc::new(journal),
            uploader,
            streams: RefCell::default(),
            loading: RefCell::default(),
            loaded: Notify::new(),
            queue: RefCell::default(),
            work: Notify::new(),
            held: Cell::new(0),
            cache_order: RefCell::default(),
            cache_order_compacted: Cell::new(0),
            cache_pushed_bytes: Cell::new(0),
            jobs: RefCell::default(),
            jobs_changed: Notify::new(),
            in_flight: RefCell::default(),
            in_flight_changed: Notify::new(),
            last_refs: RefCell::default(),
            upload_permits: Rc::new(glommio::sync::Semaphore::new(permits)),
            unapplied: Cell::new(0),
            failed: RefCell::default(),
            node_failed,
            stopping: Cell::new(false),
            closing: Cell::new(false),
            stats: RefCell::default(),
            busy: Cell::new(Duration::ZERO),
        })
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    pub(crate) fn stats(&self) -> ShardStats {
        // glommio hands its executor stats over and starts them afresh at each call: the
        // busy time is summed here, so that it stays a counter however often it is read.
        let busy = self.busy.get() + glommio::executor().executor_stats().total_runtime();
        self.busy.set(busy);
        ShardStats {
            busy_micros: u64::try_from(busy.as_micros()).unwrap_or(u64::MAX),
            memory_held: self.held.get(),
            ..*self.stats.borrow()
        }
    }

    /// The node is stopping: reads waiting for records answer now with what they have
    /// (an empty page), so that stopping never waits out a long poll, and batches waiting
    /// for their stream's `batch_max_delay_ms` are flushed now, so it never waits that
    /// out either.
    pub(crate) fn close(&self) {
        self.closing.set(true);
        for slot in self.streams.borrow().values() {
            slot.changed.notify();
        }
        self.work.notify();
    }

    /// Asks the flusher to return once every queued stream is flushed. Called after the
    /// last handler finished, so nothing new is queued.
    pub(crate) fn stop(&self) {
        self.stopping.set(true);
        self.work.notify();
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn check_failed(&self) -> Result<()> {
        match &*self.failed.borrow() {
            Some(why) => Err(Error::unavailable(format!("shard {} ({why})", self.index))),
            None => Ok(()),
        }
    }

    /// Stops acknowledging on this shard until a restart: something durable failed, and
    /// sequence numbers were taken by batches whose fate only recovery can decide.
    fn fail(&self, why: String) {
        self.node_failed.record(&format!("shard {} ({why})", self.index));
        self.failed.borrow_mut().get_or_insert(why);
        for slot in self.streams.borrow().values() {
            slot.changed.notify();
        }
    }

    fn count(&self, f: impl FnOnce(&mut ShardStats)) {
        f(&mut self.stats.borrow_mut());
    }

    /// Runs one operation on a stream this shard leads. When no live stream is behind
    /// the record's ID (the caller resolved it before a delete), the op comes back
    /// unused for the caller to resolve again.
    pub(crate) async fn handle(self: &Rc<Self>, record: StreamRecord, op: Op) -> Answer {
        if let Err(error) = self.check_failed() {
            return Answer::Done(Err(error));
        }
        let slot = match self.slot(&record).await {
            Ok(slot) => slot,
            Err(Error::StreamNotFound { .. }) => return Answer::Stale(op),
            Err(error) => return Answer::Done(Err(error)),
        };
        Answer::Done(self.run(&slot, record, op).await)
    }

    async fn run(self: &Rc<Self>, slot: &Rc<Slot>, record: StreamRecord, op: Op) -> Result<Reply> {
        let slot = Rc::clone(slot);
        // A stream being deleted is gone for every verb; a second delete waits for the
        // first to finish (and takes over if it failed).
        loop {
            let seen = slot.changed.generation();
            if !slot.leader.borrow().is_deleted() {
                break;
            }
            if !matches!(op, Op::Delete) {
                return Err(slot.not_found());
            }
            if !self.streams.borrow().contains_key(&record.id) {
                return Ok(Reply::Deleted);
            }
            slot.changed.changed(seen).await;
        }
        match op {
            Op::Append { request, sequenced } => {
                self.append(&slot, request, sequenced).await.map(Reply::Appended)
            }
            Op::Read { request, asker } => {
                self.read(&slot, request, asker.as_ref()).await.map(Reply::Read)
            }
            Op::Plan(request) => self.plan(&slot, request).await.map(Reply::Plan),
            Op::CheckTail => Ok(Reply::Tail(slot.leader.borrow().tail())),
            Op::Fence { token, expected } => {
                self.fence(&slot, token, expected).await.map(Reply::Tail)
            }
            Op::Trim(to) => self.trim(&slot, to).await,
            Op::Reconfigure(patch) => {
                let updated =
                    self.control.reconfigure_stream(&record.bucket, &record.key, &patch).await?;
                slot.leader.borrow_mut().set_options(updated.options, self.now_ms());
                Ok(Reply::Reconfigured(Box::new(updated)))
            }
            Op::Delete => self.delete(&slot, &record).await,
        }
    }

    /// The stream's slot, making its leader on first use from the stream's current
    /// record and the chunks recovery found for it.
    async fn slot(self: &Rc<Self>, record: &StreamRecord) -> Result<Rc<Slot>> {
        loop {
            if let Some(slot) = self.streams.borrow().get(&record.id) {
                return Ok(Rc::clone(slot));
            }
            let seen = self.loaded.generation();
            if !self.loading.borrow_mut().insert(record.id) {
                self.loaded.changed(seen).await;
                continue;
            }
            let made = self.make_slot(record).await;
            self.loading.borrow_mut().remove(&record.id);
            self.loaded.notify();
            return made;
        }
    }

    async fn make_slot(&self, record: &StreamRecord) -> Result<Rc<Slot>> {
        let (slot, unreferenced) = self.make_slot_with(record.id, Vec::new()).await?;
        debug_assert!(unreferenced.is_empty(), "only journal chunks can lack a ref");
        slot.ok_or_else(|| Error::StreamNotFound {
            bucket: record.bucket.to_string(),
            key: record.key.to_string(),
        })
    }

    /// Makes the leader of stream `id` from its current record (the caller's may be
    /// stale: the stream deleted since it resolved it), its refs, and the chunks the
    /// journal holds for it. `None` when no live stream has the ID. Also returns the
    /// run's chunks that are only in the journal, to upload.
    async fn make_slot_with(
        &self,
        id: StreamId,
        journal: Vec<(ChunkHeader, Location)>,
    ) -> Result<(Option<Rc<Slot>>, Vec<Location>)> {
        let Some(current) =
            self.control.stream_by_id(id).await?.filter(|r| r.deleted_at_ms.is_none())
        else {
            return Ok((None, Vec::new()));
        };
        let refs = self.control.refs_of(id).await?;
        let found = recovery::recover(current.trim_seq_num, refs, journal);
        if !found.stale_refs.is_empty() {
            self.control.delete_refs(id, &found.stale_refs).await?;
        }
        let leader = Leader::new(LeaderInit {
            id: current.id,
            options: current.options,
            fencing_token: current.fencing_token,
            trim_seq_num: current.trim_seq_num,
            trim_timestamp: current.trim_timestamp,
            chunks: found.chunks,
            now_ms: self.now_ms(),
        });
        let slot = Rc::new(Slot {
            bucket: current.bucket.clone(),
            key: current.key.to_string(),
            leader: RefCell::new(leader),
            changed: Notify::new(),
            queued: Cell::new(false),
            due: Cell::new(false),
            timer_armed: Cell::new(false),
        });
        self.streams.borrow_mut().insert(current.id, Rc::clone(&slot));
        Ok((Some(slot), found.unreferenced))
    }

    /// At start, before serving: makes the leader of every stream the journal holds
    /// chunks of, and queues the upload of those chunks no ref names yet, in journal
    /// order, so the journal can be given up behind them.
    pub(crate) async fn recover_journal(&self, entries: Vec<RecoveredEntry>) -> Result<()> {
        let mut by_stream: HashMap<StreamId, Vec<(ChunkHeader, Location)>> = HashMap::new();
        let mut order = Vec::new();
        for entry in entries {
            let chunks = by_stream.entry(entry.header.stream_id).or_default();
            if chunks.is_empty() {
                order.push(entry.header.stream_id);
            }
            chunks.push((entry.header, entry.location));
        }
        let mut unreferenced = Vec::new();
        for id in order {
            let journal = by_stream.remove(&id).unwrap_or_default();
            let (_, chunks) = self.make_slot_with(id, journal).await?;
            unreferenced.extend(chunks);
        }
        unreferenced.sort_unstable_by_key(|location| location.lsn);
        for locations in unreferenced.chunks(RECOVERED_PER_JOB) {
            self.queue_job(Job::recovered(locations.to_vec()));
        }
        if self.unapplied.get() == 0 {
            // Nothing unreferenced: whatever the journal holds is in the object store.
            self.journal.release_before(self.journal.head()).await?;
        }
        Ok(())
    }

    async fn append(
        self: &Rc<Self>,
        slot: &Rc<Slot>,
        request: AppendRequest,
        sequenced_signal: Option<flume::Sender<()>>,
    ) -> Result<AppendAck> {
        let arrived = Instant::now();
        let entry_max = self.journal.entry_bytes_max();
        let budget = self.config.memory_budget_bytes;
        let input = check_append(&request, &self.config.limits, entry_max, budget)?;
        self.make_room(input.metered_bytes());
        let class = slot.leader.borrow().options().class;
        let sequenced = {
            let mut leader = slot.leader.borrow_mut();
            if leader.is_deleted() {
                return Err(slot.not_found());
            }
            let (held, budget) = (&self.held, self.config.memory_budget_bytes);
            let journal = &self.journal;
            let entry_max = usize::try_from(entry_max).unwrap_or(usize::MAX);
            let sizes = match class {
                StorageClass::Express => {
                    let target = self.config.express_chunk_bytes.min(entry_max);
                    ChunkSizes { start: target, max: target }
                }
                StorageClass::Standard => ChunkSizes {
                    start: 0,
                    max: (leader.options().batch_max_bytes as usize).min(entry_max),
                },
            };
            leader.append(
                &input,
                self.now_ms(),
                sizes,
                &mut |bytes| {
                    if held.get() + bytes > budget {
                        return Err(Error::MemoryBudgetExhausted {
                            budget_bytes: budget,
                            retry_after_ms: 10,
                        });
                    }
                    held.set(held.get() + bytes);
                    Ok(())
                },
                &mut |capacity| match class {
                    StorageClass::Express => ShardBuf::Journal(journal.alloc_buffer(capacity)),
                    StorageClass::Standard => ShardBuf::Upload(AlignedBuf::with_capacity(capacity)),
                },
            )?
        };
        if let Some(signal) = sequenced_signal {
            let _ = signal.try_send(());
        }
        self.queue_flush(slot);
        self.count(|s| s.appends_waiting += 1);
        let durable = self.wait_durable(slot, sequenced.end.seq_num).await;
        self.count(|s| s.appends_waiting -= 1);
        durable?;
        self.count(|s| {
            let class = s.class_mut(class);
            class.appends += 1;
            class.records_in += u64::from(input.summary.records);
            class.bytes_in += input.summary.content_bytes;
            class.ack_latency.record(arrived.elapsed());
        });
        Ok(AppendAck {
            start: sequenced.start,
            end: sequenced.end,
            tail: slot.leader.borrow().tail(),
        })
    }

    /// Frees cached chunks, oldest first, until `bytes` more fit the budget (or nothing
    /// cached is left: the append then meets the budget check in its turn).
    fn make_room(&self, bytes: u64) {
        while self.held.get() + bytes > self.config.memory_budget_bytes {
            let Some(CacheEntry { id, first_seq_num, .. }) =
                self.cache_order.borrow_mut().pop_front()
            else {
                return;
            };
            let Some(slot) = self.streams.borrow().get(&id).cloned() else { continue };
            if let Some(freed) = slot.leader.borrow_mut().evict(first_seq_num) {
                self.release(freed);
            }
        }
    }

    /// Puts a chunk that just became cached at the end of the eviction order.
    fn cache_push(&self, id: StreamId, first_seq_num: u64, bytes: u64) {
        let mut order = self.cache_order.borrow_mut();
        order.push_back(CacheEntry { id, first_seq_num, bytes });
        self.cache_pushed_bytes.set(self.cache_pushed_bytes.get() + bytes);
        // Chunks that left the cache other than by eviction (trimmed, or their stream
        // deleted) leave their entries behind, and a cache that never fills evicts
        // nothing: when the order has doubled since it was last compacted, it drops
        // those, so it holds at most twice the cached chunks (plus a floor), at a cost
        // of O(1) a push.
        if order.len() > 2 * self.cache_order_compacted.get() + CACHE_ORDER_FLOOR {
            let streams = self.streams.borrow();
            order.retain(|entry| {
                streams
                    .get(&entry.id)
                    .is_some_and(|slot| slot.leader.borrow().is_cached(entry.first_seq_num))
            });
            self.cache_order_compacted.set(order.len());
        }
        self.count(|s| s.cache_entries = order.len() as u64);
    }

    fn release(&self, bytes: u64) {
        self.held.set(self.held.get().checked_sub(bytes).expect("released bytes were held"));
    }

    /// Queues the stream for the flusher: express at the next group; standard when a
    /// flush trigger fires (size now, or the delay timer).
    fn queue_flush(self: &Rc<Self>, slot: &Rc<Slot>) {
        let (class, size_due, delay_ms, id) = {
            let leader = slot.leader.borrow();
            (
                leader.options().class,
                leader.flush_due_by_size(),
                leader.options().batch_max_delay_ms,
                leader.id(),
            )
        };
        match class {
            StorageClass::Express => slot.due.set(true),
            StorageClass::Standard if size_due => slot.due.set(true),
            StorageClass::Standard if !slot.timer_armed.get() => {
                slot.timer_armed.set(true);
                // Weak: a timer never keeps a stopped shard alive.
                let (shard, timer_slot) = (Rc::downgrade(self), Rc::downgrade(slot));
                glommio::spawn_local(async move {
                    glommio::timer::sleep(Duration::from_millis(u64::from(delay_ms))).await;
                    if let (Some(shard), Some(slot)) = (shard.upgrade(), timer_slot.upgrade()) {
                        slot.timer_armed.set(false);
                        slot.due.set(true);
                        shard.work.notify();
                    }
                })
                .detach();
            }
            StorageClass::Standard => {}
        }
        if !slot.queued.replace(true) {
            self.queue.borrow_mut().push_back(id);
        }
        self.work.notify();
    }

    async fn wait_durable(&self, slot: &Slot, end_seq_num: u64) -> Result<()> {
        loop {
            let seen = slot.changed.generation();
            self.check_failed()?;
            if slot.leader.borrow().tail().seq_num >= end_seq_num {
                return Ok(());
            }
            slot.changed.changed(seen).await;
        }
    }

    /// The group-commit loop. Runs until the shard stops. Each turn writes the group due
    /// to the journal, then leaves its sync and acknowledgement to a task of its own, so
    /// the next group is written while earlier ones sync, with at most
    /// `journal_syncs_in_flight_max` syncing. The journal publishes groups in the order
    /// they were written, and each task acknowledges its group as soon as it is published,
    /// so chunks become durable in order.
    pub(crate) async fn flusher(self: Rc<Self>) {
        let syncs_max = self.config.journal_syncs_in_flight_max as u64;
        let syncing = Rc::new(glommio::sync::Semaphore::new(syncs_max));
        loop {
            // A free sync first: meanwhile the next group grows.
            let Ok(permit) = syncing.acquire_static_permit(1).await else { return };
            let seen = self.work.generation();
            let group = self.take_group();
            if group.is_empty() {
                drop(permit);
                if self.stopping.get() {
                    // Every group written is acknowledged (or failed) before returning.
                    let _ = syncing.acquire(syncs_max).await;
                    return;
                }
                self.work.changed(seen).await;
                continue;
            }
            let mut journaled = Vec::new();
            let mut standard = Vec::new();
            for (id, chunk) in group {
                match chunk.storage() {
                    ShardBuf::Journal(_) => journaled.push((
                        id,
                        chunk.map_storage(|b| match b {
                            ShardBuf::Journal(buf) => buf,
                            ShardBuf::Upload(_) => unreachable!("matched just above"),
                        }),
                    )),
                    ShardBuf::Upload(_) => standard.push(chunk.map_storage(|b| match b {
                        ShardBuf::Upload(buf) => buf,
                        ShardBuf::Journal(_) => unreachable!("matched just above"),
                    })),
                }
            }
            if !standard.is_empty() {
                self.queue_job(Job::standard(standard));
            }
            if journaled.is_empty() {
                continue;
            }
            let (ids, chunks): (Vec<StreamId>, Vec<SealedChunk<JournalBuffer>>) =
                journaled.into_iter().unzip();
            let started = Instant::now();
            let written = match self.journal.write(chunks).await {
                Ok(written) => written,
                Err(error) => {
                    // Nothing of this group may be acknowledged, and its sequence numbers
                    // are taken.
                    self.fail(format!("journal: {error}"));
                    return;
                }
            };
            let shard = Rc::clone(&self);
            glommio::spawn_local(async move {
                let _permit = permit;
                match shard.journal.sync(written).await {
                    Ok(durable) => shard.on_group_durable(ids, durable, started),
                    // The journal stopped: the next write fails too, and the flusher ends.
                    Err(error) => shard.fail(format!("journal: {error}")),
                }
            })
            .detach();
        }
    }

    /// A journal group is durable: its chunks are acknowledged and queued for upload.
    fn on_group_durable(&self, ids: Vec<StreamId>, durable: Vec<Appended>, started: Instant) {
        self.count(|s| {
            s.journal_groups.record(started.elapsed());
            s.chunks += durable.len() as u64;
            s.journal_bytes += durable.iter().map(|(c, _)| c.bytes().len() as u64).sum::<u64>();
        });
        let lsn = durable.first().map_or(0, |(_, location)| location.lsn);
        let mut uploads = Vec::with_capacity(durable.len());
        for (id, (chunk, location)) in ids.into_iter().zip(durable) {
            uploads.push(Rc::clone(&chunk));
            self.on_durable(id, chunk, location);
        }
        self.queue_job(Job::journaled(uploads, lsn));
    }

    /// Every stream's sealed chunks that should go in this group, in stream order and
    /// within a stream in sequence order.
    fn take_group(&self) -> Vec<(StreamId, SealedChunk<ShardBuf>)> {
        let mut group = Vec::new();
        let mut waiting = VecDeque::new();
        let queued: Vec<StreamId> = self.queue.borrow_mut().drain(..).collect();
        for id in queued {
            let Some(slot) = self.streams.borrow().get(&id).cloned() else { continue };
            if !slot.due.get() && !self.closing.get() {
                waiting.push_back(id);
                continue;
            }
            slot.due.set(false);
            slot.queued.set(false);
            let mut leader = slot.leader.borrow_mut();
            group.extend(leader.take_sealed(ShardBuf::path).into_iter().map(|c| (id, c)));
            if leader.has_unflushed() {
                // Held back until the chunks in flight on the other path are durable
                // (`on_durable`, `apply_standard` notify then).
                slot.due.set(true);
                slot.queued.set(true);
                waiting.push_back(id);
            }
        }
        self.queue.borrow_mut().extend(waiting);
        group
    }

    /// Wakes the flusher for a stream whose chunks on one path waited for those in
    /// flight on the other (`Leader::take_sealed`), once those are durable.
    fn resume_held_back(&self, slot: &Slot) {
        let leader = slot.leader.borrow();
        if leader.has_unflushed() && !leader.has_in_flight() {
            self.work.notify();
        }
    }

    /// An express chunk is durable in the journal: visible, acknowledged, cached.
    fn on_durable(&self, id: StreamId, chunk: Rc<SealedChunk<JournalBuffer>>, location: Location) {
        let Some(slot) = self.streams.borrow().get(&id).cloned() else {
            unreachable!("a stream with chunks in flight keeps its slot until they are durable")
        };
        let header = *chunk.header();
        let source: Rc<dyn ChunkSource> = chunk;
        // Not in the eviction order until it is in the object store (`uploads.rs`).
        slot.leader.borrow_mut().on_durable(DurableChunk::new(
            &header,
            Stored::Journal(location),
            Some(source),
        ));
        self.resume_held_back(&slot);
        slot.changed.notify();
    }

    /// One page; when none of it is readable yet and the request may wait, the page
    /// once records arrive, the wait is out, or `asker` says its caller has gone.
    async fn read(
        self: &Rc<Self>,
        slot: &Rc<Slot>,
        request: ReadRequest,
        asker: Option<&flume::Receiver<()>>,
    ) -> Result<ReadReply> {
        let deadline = request.wait.map(|wait| Instant::now() + wait);
        let mut asked = true;
        let mut start = request.start;
        loop {
            let seen = slot.changed.generation();
            if slot.leader.borrow().is_deleted() {
                return Err(slot.not_found());
            }
            let from = self.locate(slot, start, request.clamp).await?;
            // A wait goes on from where the read stood: a tail offset or a clamped start
            // located again would move up with the tail past the very records waited
            // for, and a start by time past the last record's stamp starts at the tail
            // (decisions.md), as a subscription from it does, so what arrives is read
            // whatever its stamp.
            start = ReadStart::SeqNum(from);
            let (reply, loaded) = self.page(slot, from, request.limits).await?;
            let waited_out =
                deadline.is_none_or(|d| Instant::now() >= d) || self.closing.get() || !asked;
            // A read that reached `until` is complete: nothing that arrives can be in it.
            if reply.record_count > 0 || reply.reached_until || waited_out {
                let class = slot.leader.borrow().options().class;
                self.count(|s| {
                    s.read_cache_hits += u64::from(!loaded);
                    let class = s.class_mut(class);
                    class.reads += 1;
                    class.records_out += reply.record_count;
                    class.bytes_out += reply.content_bytes;
                });
                return Ok(reply);
            }
            let left =
                deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
            // Nothing is ever sent on `asker`: it ends when its sender is dropped.
            let gone = async {
                match asker {
                    Some(asker) => drop(asker.recv_async().await),
                    None => std::future::pending().await,
                }
                false
            };
            let arrived = async {
                futures_lite::future::or(slot.changed.changed(seen), glommio::timer::sleep(left))
                    .await;
                true
            };
            self.count(|s| s.reads_waiting += 1);
            asked = futures_lite::future::or(arrived, gone).await;
            self.count(|s| s.reads_waiting -= 1);
        }
    }

    async fn plan(&self, slot: &Slot, request: PlanRequest) -> Result<ReadPlan> {
        let from = self.locate(slot, request.start, request.clamp).await?;
        let leader = slot.leader.borrow();
        let mut plan = ReadPlan {
            start_seq_num: from,
            extents: Vec::new(),
            memory_from_seq_num: None,
            tail: leader.tail(),
        };
        for chunk in leader.chunks_from(from, request.limits) {
            match &chunk.location {
                Stored::Object(object) => plan.extents.push(Extent {
                    object: object.key.to_string(),
                    offset: object.offset,
                    length: object.length,
                    first_seq_num: chunk.first_seq_num,
                    count: chunk.record_count,
                }),
                Stored::Journal(_) => {
                    plan.memory_from_seq_num = Some(chunk.first_seq_num.max(from));
                    break;
                }
            }
        }
        Ok(plan)
    }

    async fn locate(&self, slot: &Slot, start: ReadStart, clamp: bool) -> Result<u64> {
        loop {
            let step = slot.leader.borrow().locate(start, clamp)?;
            match step {
                Step::Ready(seq) => return Ok(seq),
                Step::Load { first_seq_num, location } => {
                    self.load(slot, first_seq_num, location).await?
                }
            }
        }
    }

    /// One page from `from`, and whether a chunk had to be loaded for it: up to
    /// `read-page-loads-max` of them, one after the other.
    async fn page(&self, slot: &Slot, from: u64, limits: PageLimits) -> Result<(ReadReply, bool)> {
        let mut loads = 0;
        loop {
            let may_load = loads < self.config.read_page_loads_max;
            let (stream, step) = {
                let leader = slot.leader.borrow();
                (leader.id(), leader.page(from, limits, may_load))
            };
            match step {
                Step::Ready(page) => {
                    let mut frames = Vec::new();
                    for part in &page.parts {
                        framing::encode_records(&part.records(), &mut frames);
                    }
                    let reply = ReadReply {
                        stream,
                        frames,
                        record_count: page.record_count(),
                        content_bytes: page.content_bytes,
                        next_seq_num: page.next_seq_num,
                        tail: page.tail,
                        reached_until: page.reached_until,
                    };
                    return Ok((reply, loads > 0));
                }
                Step::Load { first_seq_num, location } => {
                    loads += 1;
                    self.load(slot, first_seq_num, location).await?
                }
            }
        }
    }

    /// Reads a chunk back from the journal or the object store into the stream's cache.
    async fn load(&self, slot: &Slot, first_seq_num: u64, location: Stored) -> Result<()> {
        self.count(|s| s.read_cache_misses += 1);
        let chunk: Rc<dyn ChunkSource> = match location {
            Stored::Journal(location) => match self.journal.read(&location).await {
                Ok(read) => Rc::new(read),
                // Released while the read was in flight: journal space is released only
                // once its chunks have moved to the object store (or been trimmed), so
                // the caller asks the leader again, which names where the chunk is now.
                Err(Error::Journal(JournalError::NoEntry { .. }))
                    if !slot.leader.borrow().location_of(first_seq_num).is_some_and(
                        |now| matches!(now, Stored::Journal(at) if *at == location),
                    ) =>
                {
                    return Ok(());
                }
                Err(error) => return Err(error),
            },
            Stored::Object(object) => {
                let range = object.offset..object.offset + object.length;
                let bytes = self.uploader.read(Arc::clone(&object.key), range).await?;
                let chunk = ObjectChunk::parse(bytes)?;
                let id = slot.leader.borrow().id();
                if (chunk.header.stream_id, chunk.header.first_seq_num) != (id, first_seq_num) {
                    return Err(Error::internal(format!(
                        "object {} at {}: holds stream {} from seq_num {}, its ref says stream {id} from {first_seq_num}",
                        object.key,
                        object.offset,
                        chunk.header.stream_id,
                        chunk.header.first_seq_num
                    )));
                }
                Rc::new(chunk)
            }
        };
        let id = slot.leader.borrow().id();
        let cached = slot.leader.borrow_mut().install_loaded(first_seq_num, chunk);
        if cached > 0 {
            self.make_room(cached);
            self.held.set(self.held.get() + cached);
            self.cache_push(id, first_seq_num, cached);
        }
        Ok(())
    }

    /// Waits until every batch sequenced so far is durable.
    async fn settle(&self, slot: &Slot) -> Result<()> {
        let end = slot.leader.borrow().next_seq_num();
        self.wait_durable(slot, end).await
    }

    async fn fence(
        self: &Rc<Self>,
        slot: &Rc<Slot>,
        token: String,
        expected: Option<String>,
    ) -> Result<Tail> {
        crate::control::check_fence_tokens(&token, expected.as_deref())?;
        slot.leader.borrow().check_fence(expected.as_deref())?;
        let id = slot.leader.borrow().id();
        // Durable first: a fence that returned must survive a crash.
        let record = self.control.set_fencing_token(id, expected.as_deref(), &token).await?;
        slot.leader.borrow_mut().set_fencing_token(record.fencing_token);
        // Batches sequenced before the fence are committed before it returns.
        self.settle(slot).await?;
        Ok(slot.leader.borrow().tail())
    }

    async fn trim(&self, slot: &Slot, to: TrimTo) -> Result<Reply> {
        let seq = match to {
            TrimTo::SeqNum(seq) => seq,
            TrimTo::Timestamp(time) => self.locate(slot, ReadStart::Timestamp(time), true).await?,
        };
        let (id, target, current, tail) = {
            let leader = slot.leader.borrow();
            (leader.id(), leader.trim_target(seq), leader.trim_seq_num(), leader.tail())
        };
        if target > current {
            let record = self.control.set_trim_seq_num(id, target, tail.timestamp).await?;
            let freed = slot.leader.borrow_mut().set_trim(record.trim_seq_num);
            self.release(freed);
        }
        Ok(Reply::Trimmed { trim_seq_num: slot.leader.borrow().trim_seq_num() })
    }

    /// The age-retention duty (retention.md): every `retention-interval-ms`, each stream
    /// with `retention_max_age_ms` has its watermark moved to the first record younger
    /// than the age (stamped after now minus the age), through the same path as a Trim (durable first,
    /// then the leader). Record time, not object boundaries, decides, so a quiet stream
    /// trims on time like a busy one; a reconfigured age applies at the next pass.
    /// Runs until the shard closes.
    pub(crate) async fn retention(self: Rc<Self>) {
        let mut ticker = ticker::Ticker::new(self.config.retention_interval);
        loop {
            ticker.tick().await;
            if self.closing.get() || self.failed.borrow().is_some() {
                return;
            }
            self.retention_pass().await;
        }
    }

    /// One pass of the age-retention duty over the shard's streams. Also run once at
    /// start, before the shard serves, so records that aged out while the node was down
    /// are never read after it is back.
    pub(crate) async fn retention_pass(&self) {
        let now = self.now_ms();
        let slots: Vec<Rc<Slot>> = self.streams.borrow().values().cloned().collect();
        // The streams with records past their bound, each with the stamp a record must
        // pass to stay, and the backlog: how far past it the oldest one is.
        let mut due = Vec::new();
        let mut backlog_ms = 0;
        for slot in slots {
            let (age, deleted) = {
                let leader = slot.leader.borrow();
                (leader.options().retention_max_age_ms, leader.is_deleted())
            };
            // A record stamped at or before `expired` is `age` old or more.
            let Some(expired) = now.checked_sub(age).filter(|_| age > 0 && !deleted) else {
                continue;
            };
            let oldest = self.oldest_timestamp(&slot);
            if oldest > expired {
                continue;
            }
            // 0: the oldest record is not in memory, so its time is not known here.
            if oldest > 0 {
                backlog_ms = backlog_ms.max(expired - oldest);
            }
            due.push((slot, expired));
        }
        self.count(|s| s.retention_backlog_ms = backlog_ms);
        for (slot, expired) in due {
            match self.trim(&slot, TrimTo::Timestamp(expired + 1)).await {
                Ok(_) => self.count(|s| s.retention_trims += 1),
                // A stream deleted meanwhile, or metadata briefly away: next pass.
                Err(_) => continue,
            }
        }
        self.count(|s| s.retention_passes += 1);
    }

    /// At start: makes the leader of every live stream of this shard that has an age
    /// bound, so that retention trims a stream nobody touches after a restart on time.
    pub(crate) async fn adopt_retained(&self, owner: impl Fn(StreamId) -> usize) -> Result<()> {
        let mut after = None;
        loop {
            let (records, next) = self.control.all_streams_page(after).await?;
            for record in records.into_iter().filter(|r| r.deleted_at_ms.is_none()) {
                let ours = owner(record.id) == self.index;
                let known = self.streams.borrow().contains_key(&record.id);
                if ours && !known && record.options.retention_max_age_ms > 0 {
                    self.make_slot(&record).await?;
                }
            }
            match next {
                Some(id) => after = Some(id),
                None => return Ok(()),
            }
        }
    }

    /// The timestamp of the first record at or above the watermark (cached chunks only;
    /// for one that is not in memory, 0: the trim path then loads what it needs).
    fn oldest_timestamp(&self, slot: &Slot) -> u64 {
        let leader = slot.leader.borrow();
        let trim = leader.trim_seq_num();
        let Some(chunk) = leader.durable_chunks().next() else { return u64::MAX };
        let Some(cached) = &chunk.cached else { return 0 };
        let records = cached.records();
        let index = trim.saturating_sub(chunk.first_seq_num) as usize;
        if index < records.len() { records.timestamp(index) } else { u64::MAX }
    }

    /// DeleteStream: fence the stream (every new append and read is refused), drain the
    /// batches in flight, then tombstone it in metadata.
    async fn delete(&self, slot: &Rc<Slot>, record: &StreamRecord) -> Result<Reply> {
        slot.leader.borrow_mut().mark_deleted();
        let deleted = match self.settle(slot).await {
            Ok(()) => {
                self.control.delete_stream(&record.bucket, &record.key, Some(record.id)).await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = deleted {
            slot.leader.borrow_mut().unmark_deleted();
            slot.changed.notify();
            return Err(error);
        }
        self.streams.borrow_mut().remove(&record.id);
        self.release(slot.leader.borrow().cached_bytes());
        slot.changed.notify();
        Ok(Reply::Deleted)
    }
}
