//! The uploader core: one dedicated OS thread (`nova-uploader`, optionally pinned) that
//! owns the object-store client and the tokio runtime it needs, packs the sealed chunks
//! shards hand it into transit bundles (transit.rs), PUTs them create-only with bounded
//! concurrency, retries failures, and answers each request once its bundle is durable.
//!
//! ```text
//! shard (glommio)                         nova-uploader (tokio, current thread)
//!  Uploader::upload ── bounded flume ──►  intake: write each chunk's slot envelope,
//!                                         check the request on its own
//!                                         pending ── cut by size or delay ──► bundle
//!                                         ≤ uploads-in-flight-max PUTs, each retried
//!  ◄── one-shot flume reply ───────────── until it succeeds: placements + the chunks
//! ```
//!
//! What it guarantees:
//! - A request is answered exactly once: `Ok` only after the PUT of the bundle holding
//!   all of its chunks returned success (durable in the store), or an error (a refused
//!   chunk; the uploader stopping before its bundle was durable). A request's chunks
//!   always travel in one bundle.
//! - A bundle cut from one stream's chunks alone, back to back by sequence number and at
//!   least `direct-settle-bytes-min` long, whose chunks came with their bucket, is
//!   written as that stream's settled object (settled.rs) under its settled key instead:
//!   the same slots, so placements work alike, and the settler never rewrites it. If
//!   that key holds another object (an orphan of an earlier attempt that differs), or
//!   the store refuses it for good, the same chunks go out as a transit bundle
//!   (docs/decisions/0010-direct-settled-objects.md). Not with a key prefix: settled
//!   keys have none.
//! - A failed PUT is retried with capped exponential backoff and jitter for as long as
//!   the uploader runs, under the same key, so a retry after a PUT that landed unseen
//!   finds its own object (checked byte for byte) rather than writing a second one.
//! - Every queue is bounded: the request channel (`uploader-queue-depth`), the bytes
//!   waiting for a bundle (one bundle's worth: intake pauses while a full bundle waits
//!   for an upload slot), and the PUTs in flight (`uploads-in-flight-max`).
//!
//! What it never does: run on or block a shard (the submit side is two flume channels
//! awaited with `send_async`/`recv_async`, woken from this thread, so the awaiting
//! glommio task must be in a `Latency::NotImportant` queue, notes/platform.md); write
//! to a chunk, or copy one other than into the PUT body (the envelope is written apart,
//! and the chunk read where it is: an express chunk in its shard's journal buffer, lent
//! for the upload; assembling the one contiguous body the store takes is the one
//! copy); talk to aws-sdk directly (only the `s3` crate's `ObjectStore`); write refs or
//! metadata (the shard that gets the placements does).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use s3::{ByteRange, Bytes, ErrorKind, ObjectStore, PutCondition};
use tokio::task::JoinSet;

use crate::aligned::AlignedBuf;
use crate::chunk::{ChunkHeader, SealedChunk};
use crate::error::{Error, Result};
use crate::ids::StreamId;
use crate::loan::{Lent, LentChunk};
use crate::names::BucketName;
use crate::settled::{SettledBuilder, SettledLayout};
use crate::transit::{
    self, BundleBuilder, BundleId, BundleLayout, PushRefused, SLOT_ENVELOPE_LEN as ENVELOPE_LEN,
    SlotEnvelope, SlotParts, TransitKey,
};

/// How the uploader cuts, sends and retries. [`Default`] is every knob's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploaderConfig {
    /// A bundle is sent once its pending bytes reach this (`bundle-bytes-target`).
    pub bundle_bytes_target: u64,
    /// ... or once its first chunk has waited this long (`bundle-delay-ms`).
    pub bundle_delay: Duration,
    /// PUTs in flight at once (`uploads-in-flight-max`).
    pub uploads_in_flight_max: usize,
    /// Requests queued before submitters wait (`uploader-queue-depth`).
    pub queue_depth: usize,
    /// First backoff ceiling after a failed PUT (`upload-backoff-initial-ms`).
    pub backoff_initial: Duration,
    /// Largest backoff ceiling (`upload-backoff-max-ms`).
    pub backoff_max: Duration,
    /// How long [`Uploader::stop`] keeps sending what is held (`uploader-drain-ms`).
    pub drain: Duration,
    /// Ranged GETs in flight at once (`object-reads-in-flight-max`).
    pub reads_in_flight_max: usize,
    /// The smallest bundle of one stream's chunks alone written as its settled object
    /// (`direct-settle-bytes-min`).
    pub direct_settle_bytes_min: u64,
    /// The core the thread is pinned to, if any.
    pub core: Option<usize>,
}

impl Default for UploaderConfig {
    fn default() -> Self {
        let ms = |knob: tuning::Knob| Duration::from_millis(knob.default);
        let count = |knob: tuning::Knob| usize::try_from(knob.default).unwrap_or(usize::MAX);
        Self {
            bundle_bytes_target: tuning::BUNDLE_BYTES_TARGET.default,
            bundle_delay: ms(tuning::BUNDLE_DELAY_MS),
            uploads_in_flight_max: count(tuning::UPLOADS_IN_FLIGHT_MAX),
            queue_depth: count(tuning::UPLOADER_QUEUE_DEPTH),
            backoff_initial: ms(tuning::UPLOAD_BACKOFF_INITIAL_MS),
            backoff_max: ms(tuning::UPLOAD_BACKOFF_MAX_MS),
            drain: ms(tuning::UPLOADER_DRAIN_MS),
            reads_in_flight_max: count(tuning::OBJECT_READS_IN_FLIGHT_MAX),
            direct_settle_bytes_min: tuning::DIRECT_SETTLE_BYTES_MIN.default,
            core: None,
        }
    }
}

/// The leader epoch every slot envelope carries until leases exist. One constant, so the
/// settler can rebuild a cached chunk's slot byte for byte as the uploader wrote it.
pub const LEADER_EPOCH: u64 = 0;

/// One chunk to upload and the leader epoch its slot envelope carries.
#[derive(Debug)]
pub struct UploadChunk {
    pub body: ChunkBody,
    /// The stream's leader epoch when the chunk was built ([`LEADER_EPOCH`] until leases
    /// exist).
    pub leader_epoch: u64,
    /// The stream's bucket, when the chunk may be written straight into a settled object
    /// of its stream (see the module doc); without it, only into a transit bundle.
    pub bucket: Option<BucketName>,
}

impl From<SealedChunk<AlignedBuf>> for UploadChunk {
    fn from(chunk: SealedChunk<AlignedBuf>) -> Self {
        Self { body: ChunkBody::Owned(chunk), leader_epoch: LEADER_EPOCH, bucket: None }
    }
}

/// A chunk's bytes as the uploader gets them. Either way they are copied once, into the
/// bundle's body, and nowhere else.
#[derive(Debug)]
pub enum ChunkBody {
    /// In a buffer of its own, handed over: standard chunks (and express chunks read
    /// back from the journal at recovery).
    Owned(SealedChunk<AlignedBuf>),
    /// Lent from the shard's journal buffer, where the express chunk was built and
    /// written: read there, on the uploader's thread.
    Lent(LentChunk),
}

/// One slot of a settled object as the settler hands it over. Either way its bytes are
/// copied once, into the object's body, on the uploader's thread.
#[derive(Debug)]
pub enum SettledSlot {
    /// Read back from its bundle, envelope and chunk, verified (`read_slots`).
    Fetched(Bytes),
    /// A chunk still in the shard's cache, lent where it is, and the envelope the
    /// uploader gave it in its bundle, written anew.
    Cached { envelope: [u8; ENVELOPE_LEN], chunk: Lent },
}

impl SettledSlot {
    /// The slot's envelope and chunk.
    pub fn parts(&self) -> SlotParts<'_> {
        match self {
            SettledSlot::Fetched(slot) => {
                SlotParts::of(slot).expect("a fetched slot was verified whole")
            }
            SettledSlot::Cached { envelope, chunk } => SlotParts { envelope, chunk: chunk.bytes() },
        }
    }
}

impl ChunkBody {
    /// The chunk, exactly `header().chunk_len()` bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            ChunkBody::Owned(chunk) => chunk.bytes(),
            ChunkBody::Lent(chunk) => chunk.bytes(),
        }
    }

    pub fn header(&self) -> &ChunkHeader {
        match self {
            ChunkBody::Owned(chunk) => chunk.header(),
            ChunkBody::Lent(chunk) => chunk.header(),
        }
    }
}

/// Where one uploaded chunk's slot lies: one ranged GET of `range()` of `key` returns
/// exactly the slot (envelope and chunk), which `transit::Slot::parse` verifies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The bundle's full object key (the uploader's key prefix included).
    pub key: Arc<str>,
    /// The slot's first byte in the bundle.
    pub offset: u64,
    /// The slot's bytes: the 64-byte envelope and the chunk.
    pub length: u64,
    pub stream_id: StreamId,
    pub first_seq_num: u64,
    pub record_count: u32,
}

impl Placement {
    /// The slot's bytes in the bundle.
    pub fn range(&self) -> Range<u64> {
        self.offset..self.offset + self.length
    }

    /// The chunk's bytes in the bundle (the slot without its envelope).
    pub fn chunk_range(&self) -> Range<u64> {
        self.offset + transit::SLOT_ENVELOPE_LEN as u64..self.offset + self.length
    }
}

/// A request's answer: where each chunk went, and the chunks themselves (in the order
/// they were handed in), given back so the shard can cache or recycle their buffers
/// (or end its loans).
#[derive(Debug, Default)]
pub struct Uploaded {
    pub placements: Vec<Placement>,
    pub chunks: Vec<ChunkBody>,
    /// The chunks went into a settled object of their stream, which may hold chunks of
    /// other requests too: the refs of its first chunks must land no later than those
    /// of its later ones (see `shard/uploads.rs`).
    pub settled: bool,
}

/// A snapshot of the uploader's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UploaderStats {
    /// Requests answered with their placements.
    pub requests: u64,
    /// Chunks in bundles written.
    pub chunks: u64,
    /// Bundles written.
    pub bundles: u64,
    /// Bytes of bundles written.
    pub bundle_bytes: u64,
    /// Bundles of one stream written as its settled object instead, and their bytes.
    pub settled_direct: u64,
    pub settled_direct_bytes: u64,
    /// Of those cut to be a settled object, how many went out as a transit bundle
    /// after all (their key held another object, or the store refused it for good).
    pub direct_fallbacks: u64,
    /// PUT attempts, and how many of them failed.
    pub put_attempts: u64,
    pub put_failures: u64,
    /// Requests waiting in the channel, not yet taken in.
    pub queue_depth: usize,
    /// Bytes of chunks taken in and waiting for their bundle to be cut (its size, its
    /// delay, or an upload slot), and bytes of bundles and settled objects being
    /// uploaded now (retries included): what the uploader holds that is not durable.
    pub bytes_waiting: u64,
    pub bytes_uploading: u64,
    /// Bundles being uploaded now.
    pub in_flight: usize,
    /// Bundles cut because their bytes reached the target, because their first chunk
    /// waited the delay, and because the uploader was stopping.
    pub cut_by_size: u64,
    pub cut_by_delay: u64,
    pub cut_by_stop: u64,
    /// Chunks per bundle: median and largest.
    pub chunks_per_bundle_p50: u64,
    pub chunks_per_bundle_max: u64,
    /// One bundle's upload, retries included, in microseconds.
    pub put_latency_us_p50: u64,
    pub put_latency_us_p99: u64,
    pub put_latency_us_max: u64,
    /// The last PUT failure, as text.
    pub last_put_error: Option<String>,
    /// PUTs failing now (retrying with backoff), and how long since the first of them
    /// failed: the object store is down or refusing while this is not zero.
    pub puts_failing: usize,
    pub failing_for: Option<Duration>,
    /// Ranged GETs of history answered.
    pub object_reads: u64,
}

/// The handle: cheap to clone, `Send + Sync`, usable from any thread or executor.
///
/// Dropping every handle lets the thread finish what is queued and exit on its own
/// (without joining it, because the last handle may be dropped on a shard);
/// [`Uploader::stop`] does the same and waits for it.
#[derive(Clone, Debug)]
pub struct Uploader {
    tx: flume::Sender<Message>,
    /// Reads and single-object writes have their own queue: a backlog of uploads never
    /// delays a read of history.
    side: flume::Sender<Side>,
    /// The start of the drain time ([`Uploader::drain`]): a path of its own, read
    /// whatever the upload queue holds, and never waited on by the sender.
    drain: flume::Sender<()>,
    shared: Arc<Shared>,
}

/// Work beside the bundles: a ranged GET for a shard, one of back-to-back transit slots
/// to verify (the settler's), or one settled object's PUT.
enum Side {
    Read {
        key: Arc<str>,
        range: Range<u64>,
        reply: flume::Sender<Result<Bytes>>,
    },
    ReadSlots {
        key: Arc<str>,
        ranges: Vec<Range<u64>>,
        reply: flume::Sender<Result<Vec<Bytes>>>,
    },
    PutSettled {
        key: String,
        layout: SettledLayout,
        slots: Vec<SettledSlot>,
        reply: flume::Sender<Result<()>>,
    },
}

enum Message {
    Upload(Request),
    Stop,
}

struct Request {
    chunks: Vec<UploadChunk>,
    reply: flume::Sender<Result<Uploaded>>,
}

#[derive(Debug)]
struct Shared {
    thread: Mutex<Option<JoinHandle<()>>>,
    counters: Counters,
    histograms: Mutex<Histograms>,
    last_put_error: Mutex<Option<String>>,
    failing: Mutex<Failing>,
}

/// The PUTs in their retry loop, and since when one has been: set by the first that
/// fails, cleared when the last of them ends.
#[derive(Debug, Default)]
struct Failing {
    puts: usize,
    since: Option<Instant>,
}

/// One PUT counted in [`Failing`] from its first failure until it ends, however it ends
/// (durable, refused for good, or dropped by a stop).
struct FailingPut<'a>(&'a Shared);

impl<'a> FailingPut<'a> {
    fn new(shared: &'a Shared) -> FailingPut<'a> {
        let mut failing = lock(&shared.failing);
        failing.puts += 1;
        failing.since.get_or_insert_with(Instant::now);
        FailingPut(shared)
    }
}

impl Drop for FailingPut<'_> {
    fn drop(&mut self) {
        let mut failing = lock(&self.0.failing);
        failing.puts -= 1;
        if failing.puts == 0 {
            failing.since = None;
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    chunks: AtomicU64,
    bundles: AtomicU64,
    bundle_bytes: AtomicU64,
    settled_direct: AtomicU64,
    settled_direct_bytes: AtomicU64,
    direct_fallbacks: AtomicU64,
    put_attempts: AtomicU64,
    put_failures: AtomicU64,
    in_flight: AtomicUsize,
    bytes_waiting: AtomicU64,
    bytes_uploading: AtomicU64,
    cut_by_size: AtomicU64,
    cut_by_delay: AtomicU64,
    cut_by_stop: AtomicU64,
    object_reads: AtomicU64,
}

#[derive(Debug)]
struct Histograms {
    chunks_per_bundle: Histogram<u64>,
    put_latency_us: Histogram<u64>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Counters only: a panic elsewhere leaves them usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn stopped() -> Error {
    Error::unavailable("the uploader (it is stopping)")
}

impl Uploader {
    /// Starts the uploader thread over `store`; every bundle key is `key_prefix`
    /// followed by a transit key (`_transit/<ms>-<id>`). Blocking (it waits for the
    /// thread to be pinned and running): call it from an ordinary thread.
    pub fn start(
        store: Arc<dyn ObjectStore>,
        config: UploaderConfig,
        key_prefix: &str,
    ) -> Result<Uploader> {
        if config.uploads_in_flight_max == 0 || config.queue_depth == 0 {
            return Err(Error::internal(format!(
                "uploader config: uploads in flight ({}) and queue depth ({}) must be at least 1",
                config.uploads_in_flight_max, config.queue_depth
            )));
        }
        let sample = format!("{key_prefix}{}", TransitKey::listing_floor(u64::MAX));
        s3::check_key(&sample).map_err(|rule| {
            Error::internal(format!("uploader key prefix {key_prefix:?}: {rule}"))
        })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::internal(format!("start the uploader's tokio runtime: {e}")))?;
        let (tx, rx) = flume::bounded(config.queue_depth);
        let (side, side_rx) = flume::bounded(config.reads_in_flight_max);
        let (drain, drain_rx) = flume::bounded(1);
        let shared = Arc::new(Shared {
            thread: Mutex::new(None),
            counters: Counters::default(),
            histograms: Mutex::new(Histograms {
                chunks_per_bundle: Histogram::new_with_bounds(1, u64::from(u32::MAX), 2)
                    .expect("constant bounds are valid"),
                put_latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 2)
                    .expect("constant bounds are valid"),
            }),
            last_put_error: Mutex::new(None),
            failing: Mutex::new(Failing::default()),
        });
        let (ready_tx, ready_rx) = flume::bounded(1);
        let engine = Engine {
            store,
            config: config.clone(),
            key_prefix: key_prefix.to_owned(),
            shared: Arc::clone(&shared),
            rx,
            side_rx,
            drain_rx,
            side_in_flight: JoinSet::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            pending_since: None,
            in_flight: JoinSet::new(),
        };
        let thread = std::thread::Builder::new()
            .name("nova-uploader".into())
            .spawn(move || {
                let pinned = config.core.map_or(Ok(()), pin_to_core);
                let failed = pinned.is_err();
                // The starter waits for this one message; it cannot be gone yet.
                let _ = ready_tx.send(pinned);
                if !failed {
                    runtime.block_on(engine.run());
                }
            })
            .map_err(|e| Error::internal(format!("start the uploader thread: {e}")))?;
        let pinned = ready_rx.recv();
        match pinned {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(Error::internal(format!(
                    "pin the uploader to core {:?}: {e}",
                    config.core
                )));
            }
            Err(_) => return Err(Error::internal("the uploader thread died while starting")),
        }
        *lock(&shared.thread) = Some(thread);
        Ok(Uploader { tx, side, drain, shared })
    }

    /// Uploads `chunks` (sealed; read, never written) in one
    /// transit bundle, shared with other requests', and answers once that bundle is
    /// durable: a placement per chunk and the chunks, in the order given.
    ///
    /// Never blocks a thread: it awaits a bounded channel (backpressure when the
    /// uploader is behind) and a one-shot reply, both woken from the uploader thread,
    /// so a glommio caller must run in a `Latency::NotImportant` task queue.
    ///
    /// Errors: `UploadRefused` when a chunk cannot be enveloped or the request's chunks
    /// overlap by sequence number (nothing of the request was written);
    /// `ObjectWriteFailed` when the store refuses the bundle for good; `Unavailable`
    /// when the uploader stops before the bundle is durable.
    pub async fn upload(&self, chunks: Vec<UploadChunk>) -> Result<Uploaded> {
        if chunks.is_empty() {
            return Ok(Uploaded::default());
        }
        let (reply, answer) = flume::bounded(1);
        self.tx
            .send_async(Message::Upload(Request { chunks, reply }))
            .await
            .map_err(|_| stopped())?;
        answer.recv_async().await.map_err(|_| stopped())?
    }

    /// Reads `range` of the object at `key` (a full key, as a [`Placement`] names it)
    /// with one ranged GET on the uploader's runtime. Same waiting rules as
    /// [`Uploader::upload`]: a glommio caller runs in a `Latency::NotImportant` queue.
    ///
    /// Errors: `Unavailable` when the store cannot answer now (or the uploader is
    /// stopping); `Internal` when the object or range is not there, which for a key
    /// taken from a ref means lost or corrupt history.
    pub async fn read(&self, key: Arc<str>, range: Range<u64>) -> Result<Bytes> {
        self.side_request(|reply| Side::Read { key, range, reply }).await
    }

    /// Transit slots lying back to back in one object (`ranges`, each starting where the
    /// one before ends), read with one ranged GET and each verified
    /// ([`transit::Slot::parse`], CRC included) on the uploader's core: the settler's
    /// reads, whose pass over every byte would otherwise be on the shard's core, in as
    /// few requests as the slots' layout allows. A slot that fails is a `Corrupt…` error
    /// for the whole read.
    pub async fn read_slots(&self, key: Arc<str>, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>> {
        let back_to_back = ranges.windows(2).all(|pair| pair[0].end == pair[1].start);
        if ranges.is_empty() || !back_to_back {
            return Err(Error::internal(format!(
                "slot reads of {key} must be back to back and at least one: {ranges:?}"
            )));
        }
        self.side_request(|reply| Side::ReadSlots { key, ranges, reply }).await
    }

    /// Writes one settled object create-only under `key` (a full key), retried like a
    /// bundle until it is durable; a retry that finds the key taken succeeds only if the
    /// object there is byte for byte this one. The body is assembled from `layout` and
    /// its `slots` on the uploader's core, as bundles are, so the copy of every settled
    /// byte is not the shard's. Shares the reads' queue and concurrency.
    pub async fn put_settled(
        &self,
        key: String,
        layout: SettledLayout,
        slots: Vec<SettledSlot>,
    ) -> Result<()> {
        self.side_request(|reply| Side::PutSettled { key, layout, slots, reply }).await
    }

    /// How many ranged GETs and settled PUTs the uploader runs at once
    /// (`object-reads-in-flight-max`).
    pub fn reads_in_flight_max(&self) -> usize {
        self.side.capacity().unwrap_or(1)
    }

    async fn side_request<T>(
        &self,
        side: impl FnOnce(flume::Sender<Result<T>>) -> Side,
    ) -> Result<T> {
        let (reply, answer) = flume::bounded(1);
        self.side.send_async(side(reply)).await.map_err(|_| stopped())?;
        answer.recv_async().await.map_err(|_| stopped())?
    }

    /// The counters now.
    pub fn stats(&self) -> UploaderStats {
        let c = &self.shared.counters;
        let h = lock(&self.shared.histograms);
        let failing = lock(&self.shared.failing);
        UploaderStats {
            requests: c.requests.load(Ordering::Relaxed),
            chunks: c.chunks.load(Ordering::Relaxed),
            bundles: c.bundles.load(Ordering::Relaxed),
            bundle_bytes: c.bundle_bytes.load(Ordering::Relaxed),
            settled_direct: c.settled_direct.load(Ordering::Relaxed),
            settled_direct_bytes: c.settled_direct_bytes.load(Ordering::Relaxed),
            direct_fallbacks: c.direct_fallbacks.load(Ordering::Relaxed),
            put_attempts: c.put_attempts.load(Ordering::Relaxed),
            put_failures: c.put_failures.load(Ordering::Relaxed),
            queue_depth: self.tx.len(),
            bytes_waiting: c.bytes_waiting.load(Ordering::Relaxed),
            bytes_uploading: c.bytes_uploading.load(Ordering::Relaxed),
            in_flight: c.in_flight.load(Ordering::Relaxed),
            cut_by_size: c.cut_by_size.load(Ordering::Relaxed),
            cut_by_delay: c.cut_by_delay.load(Ordering::Relaxed),
            cut_by_stop: c.cut_by_stop.load(Ordering::Relaxed),
            chunks_per_bundle_p50: h.chunks_per_bundle.value_at_quantile(0.5),
            chunks_per_bundle_max: h.chunks_per_bundle.max(),
            put_latency_us_p50: h.put_latency_us.value_at_quantile(0.5),
            put_latency_us_p99: h.put_latency_us.value_at_quantile(0.99),
            put_latency_us_max: h.put_latency_us.max(),
            last_put_error: lock(&self.shared.last_put_error).clone(),
            puts_failing: failing.puts,
            failing_for: failing.since.map(|since| since.elapsed()),
            object_reads: c.object_reads.load(Ordering::Relaxed),
        }
    }

    /// Starts the drain time now, while the shards still finish what they hold: the
    /// uploader goes on taking requests and sends what it holds at once, and when the
    /// drain time is out it answers every request not durable `Unavailable`, uploads,
    /// settled writes and reads alike, then and after. So a stopping node's wait for a
    /// store that is down is bounded ([`Uploader::stop`] after it keeps the deadline).
    pub fn drain(&self) {
        // Full: a drain is already on its way.
        let _ = self.drain.try_send(());
    }

    /// Stops taking requests, uploads everything sent before this call (retrying for at
    /// most the drain time, from [`Uploader::drain`] if that came first; what is still
    /// not durable then is answered `Unavailable`), and waits for the thread. Blocking:
    /// call it from an ordinary thread. Requests other handles send afterwards are
    /// answered `Unavailable`.
    pub fn stop(self) {
        // A full queue makes this wait its turn, behind everything already queued; a
        // gone thread (stopped by another handle) has nothing left to do.
        let _ = self.tx.send(Message::Stop);
        let thread = lock(&self.shared.thread).take();
        if let Some(thread) = thread {
            // A panic on the thread has already answered its requests (their reply
            // senders dropped): nothing more to report here.
            let _ = thread.join();
        }
    }
}

/// Pins the calling thread to `core`.
fn pin_to_core(core: usize) -> std::io::Result<()> {
    if core >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    // SAFETY: `cpu_set_t` is plain bits; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `core` is below CPU_SETSIZE, checked above.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid set of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Why a bundle was cut.
#[derive(Clone, Copy, Debug)]
enum Cut {
    Size,
    Delay,
    Stop,
}

/// A request taken in: its chunks, their slot envelopes, checked to form a bundle on
/// their own.
struct Accepted {
    chunks: Vec<UploadChunk>,
    envelopes: Vec<[u8; ENVELOPE_LEN]>,
    reply: flume::Sender<Result<Uploaded>>,
}

impl Accepted {
    /// Answers with `error`, the chunks dropped first: a lent chunk is back with its
    /// shard before the shard hears the answer (its loan then ends rather than leaks).
    fn refuse(self, error: Error) {
        let Accepted { chunks, envelopes: _, reply } = self;
        drop(chunks);
        // The submitter may have given up waiting; nothing else to do.
        let _ = reply.send(Err(error));
    }

    fn slots(&self) -> impl Iterator<Item = SlotParts<'_>> {
        self.envelopes
            .iter()
            .zip(&self.chunks)
            .map(|(envelope, chunk)| SlotParts { envelope, chunk: chunk.body.bytes() })
    }
}

/// One object on its way: its key and body, and the requests it answers.
struct Job {
    key: Arc<str>,
    body: Bytes,
    /// Each request with its chunks' placements, in the request's order.
    requests: Vec<(Accepted, Vec<Placement>)>,
    chunks: u64,
    /// A settled object of one stream rather than a transit bundle.
    settled: bool,
}

impl Job {
    /// `requests` in the transit bundle `layout` (`lay_out_bundle`'s), under `key_prefix`.
    fn bundle(
        key_prefix: &str,
        layout: &BundleLayout,
        requests: Vec<Accepted>,
        pushes: Vec<Vec<u32>>,
    ) -> Job {
        let key: Arc<str> = format!("{key_prefix}{}", layout.key()).into();
        let slots: Vec<SlotParts<'_>> = requests.iter().flat_map(Accepted::slots).collect();
        // The one copy: the store takes one contiguous body.
        let body = layout.assemble(&slots);
        drop(slots);
        let mut chunks = 0u64;
        let requests = requests
            .into_iter()
            .zip(pushes)
            .map(|(request, numbers)| {
                chunks += numbers.len() as u64;
                let placements = numbers
                    .iter()
                    .map(|&push| {
                        let entry = layout.entry_of(push);
                        Placement {
                            key: Arc::clone(&key),
                            offset: entry.offset,
                            length: u64::from(entry.len),
                            stream_id: entry.stream_id,
                            first_seq_num: entry.first_seq_num,
                            record_count: entry.record_count,
                        }
                    })
                    .collect();
                (request, placements)
            })
            .collect();
        Job { key, body, requests, chunks, settled: false }
    }

    /// `requests` as one settled object of their stream, if they make one: every chunk
    /// came with its bucket, all of one stream, back to back by sequence number, at
    /// least `bytes_min` of slots. If not, the requests back.
    fn settled(requests: Vec<Accepted>, bytes_min: u64) -> std::result::Result<Job, Vec<Accepted>> {
        let bytes: u64 = requests.iter().flat_map(Accepted::slots).map(|s| s.len() as u64).sum();
        let first = requests.first().and_then(|request| request.chunks.first());
        let Some((bucket, stream_id)) =
            first.and_then(|chunk| Some((chunk.bucket.clone()?, chunk.body.header().stream_id)))
        else {
            return Err(requests);
        };
        let ours = |chunk: &UploadChunk| {
            chunk.body.header().stream_id == stream_id && chunk.bucket.as_ref() == Some(&bucket)
        };
        if bytes < bytes_min || !requests.iter().flat_map(|r| &r.chunks).all(ours) {
            return Err(requests);
        }
        // Every (request, chunk), in sequence order: requests of one stream may come in
        // any order when a shard has several jobs in flight.
        let mut order: Vec<(usize, usize)> = requests
            .iter()
            .enumerate()
            .flat_map(|(r, request)| (0..request.chunks.len()).map(move |c| (r, c)))
            .collect();
        order.sort_by_key(|&(r, c)| requests[r].chunks[c].body.header().first_seq_num);
        let slot = |&(r, c): &(usize, usize)| SlotParts {
            envelope: &requests[r].envelopes[c],
            chunk: requests[r].chunks[c].body.bytes(),
        };
        let (r, c) = order[0];
        let mut builder =
            SettledBuilder::new(stream_id, requests[r].chunks[c].body.header().first_seq_num);
        for at in &order {
            // A gap or an overlap: not one run.
            if builder.push_parts(slot(at)).is_err() {
                return Err(requests);
            }
        }
        let Some(layout) = builder.finish() else { return Err(requests) };
        let key: Arc<str> = layout.key(bucket).to_string().into();
        let slots: Vec<SlotParts<'_>> = order.iter().map(slot).collect();
        // The one copy, as for a bundle.
        let body = layout.assemble(&slots);
        drop(slots);
        let mut placed: Vec<Vec<Option<Placement>>> =
            requests.iter().map(|request| vec![None; request.chunks.len()]).collect();
        for (entry, &(r, c)) in layout.entries().iter().zip(&order) {
            placed[r][c] = Some(Placement {
                key: Arc::clone(&key),
                offset: entry.offset,
                length: u64::from(entry.len),
                stream_id,
                first_seq_num: entry.first_seq_num,
                record_count: entry.record_count,
            });
        }
        let requests = requests
            .into_iter()
            .zip(placed)
            .map(|(request, placements)| {
                let placements =
                    placements.into_iter().map(|p| p.expect("every chunk is placed")).collect();
                (request, placements)
            })
            .collect();
        Ok(Job { key, body, requests, chunks: order.len() as u64, settled: true })
    }
}

/// Lays `requests` out in one transit bundle: the layout and each request's pushes (in
/// its chunks' order), or the index of the first request whose slots collide with an
/// earlier one's (two chunks of one stream overlapping by sequence number).
fn lay_out_bundle(
    requests: &[Accepted],
) -> std::result::Result<(Option<BundleLayout>, Vec<Vec<u32>>), usize> {
    let mut builder = BundleBuilder::new(new_bundle_id(), now_ms());
    let mut pushes = Vec::with_capacity(requests.len());
    for (at, request) in requests.iter().enumerate() {
        let numbers: std::result::Result<Vec<u32>, _> =
            request.slots().map(|slot| builder.push_parts(slot)).collect();
        pushes.push(numbers.map_err(|_| at)?);
    }
    Ok((builder.finish(), pushes))
}

/// The uploader thread's state. Lives on that thread only.
struct Engine {
    store: Arc<dyn ObjectStore>,
    config: UploaderConfig,
    key_prefix: String,
    shared: Arc<Shared>,
    rx: flume::Receiver<Message>,
    /// [`Uploader::drain`]'s path: read even while intake pauses on a full bundle.
    drain_rx: flume::Receiver<()>,
    side_rx: flume::Receiver<Side>,
    side_in_flight: JoinSet<()>,
    /// Requests waiting for a bundle, in arrival order.
    pending: Vec<Accepted>,
    /// Their slots' bytes.
    pending_bytes: u64,
    /// When the oldest of them arrived: the delay cut counts from it.
    pending_since: Option<Instant>,
    in_flight: JoinSet<()>,
}

impl Engine {
    async fn run(mut self) {
        // When the drain time is out (set by Drain or Stop), whether it is, and whether
        // Stop came: then the loop ends once nothing is held.
        let mut give_up_at: Option<tokio::time::Instant> = None;
        let (mut gave_up, mut stopping) = (false, false);
        loop {
            let now = Instant::now();
            while self.in_flight.len() < self.config.uploads_in_flight_max {
                let Some(cut) = self.cut_due(now, give_up_at.is_some()) else { break };
                let c = &self.shared.counters;
                match cut {
                    Cut::Size => c.cut_by_size.fetch_add(1, Ordering::Relaxed),
                    Cut::Delay => c.cut_by_delay.fetch_add(1, Ordering::Relaxed),
                    Cut::Stop => c.cut_by_stop.fetch_add(1, Ordering::Relaxed),
                };
                self.cut_and_send();
            }
            if stopping && self.pending.is_empty() && self.in_flight.is_empty() {
                break;
            }
            // Intake pauses while a full bundle waits for an upload slot: that bounds the
            // bytes held here and pushes back on the shards through the channel.
            let intake = !stopping && self.pending_bytes < self.config.bundle_bytes_target;
            let slot_free = self.in_flight.len() < self.config.uploads_in_flight_max;
            let cut_at = self
                .pending_since
                .filter(|_| slot_free)
                .map(|since| since + self.config.bundle_delay);
            // Never-firing stand-ins for timers that are off (select! evaluates them).
            let far = tokio::time::Instant::now() + Duration::from_secs(86_400);
            let side_slot = self.side_in_flight.len() < self.config.reads_in_flight_max;
            let drain = || tokio::time::Instant::now() + self.config.drain;
            tokio::select! {
                biased;
                Some(_) = self.in_flight.join_next(), if !self.in_flight.is_empty() => {}
                Some(_) = self.side_in_flight.join_next(), if !self.side_in_flight.is_empty() => {}
                Ok(side) = self.side_rx.recv_async(), if side_slot && !stopping => {
                    if gave_up {
                        // Its reply sender dropped: answered unavailable.
                        drop(side);
                    } else {
                        self.start_side(side);
                    }
                }
                Ok(()) = self.drain_rx.recv_async(), if give_up_at.is_none() => {
                    give_up_at = Some(drain());
                }
                message = self.rx.recv_async(), if intake => match message {
                    Ok(Message::Upload(request)) if gave_up => {
                        let _ = request.reply.send(Err(stopped()));
                    }
                    Ok(Message::Upload(request)) => self.accept(request),
                    // Stop, or every handle gone: finish what is held, for at most the drain.
                    Ok(Message::Stop) | Err(_) => {
                        give_up_at.get_or_insert_with(drain);
                        stopping = true;
                        if gave_up {
                            break;
                        }
                    }
                },
                () = tokio::time::sleep_until(cut_at.map_or(far, tokio::time::Instant::from_std)), if cut_at.is_some() => {}
                () = tokio::time::sleep_until(give_up_at.unwrap_or(far)), if give_up_at.is_some() && !gave_up => {
                    // Out of time: whatever is not durable is answered unavailable (its
                    // reply sender dropped with its task or here).
                    self.in_flight.abort_all();
                    self.side_in_flight.abort_all();
                    while self.in_flight.join_next().await.is_some() {}
                    while self.side_in_flight.join_next().await.is_some() {}
                    self.shared.counters.in_flight.store(0, Ordering::Relaxed);
                    self.shared.counters.bytes_uploading.store(0, Ordering::Relaxed);
                    for request in self.pending.drain(..) {
                        request.refuse(stopped());
                    }
                    self.set_pending_bytes(0);
                    self.pending_since = None;
                    gave_up = true;
                    if stopping {
                        break;
                    }
                }
            }
        }
        // Requests queued after the stop are dropped with the receiver: their senders
        // see the channel gone and answer themselves unavailable.
    }

    fn start_side(&mut self, side: Side) {
        let store = Arc::clone(&self.store);
        let (backoff_initial, backoff_max) = (self.config.backoff_initial, self.config.backoff_max);
        let shared = Arc::clone(&self.shared);
        self.side_in_flight.spawn(async move {
            match side {
                Side::Read { key, range, reply } => {
                    let answer = read_range(&*store, &key, range).await;
                    shared.counters.object_reads.fetch_add(1, Ordering::Relaxed);
                    // The reader may have given up waiting.
                    let _ = reply.send(answer);
                }
                Side::ReadSlots { key, ranges, reply } => {
                    let (start, end) = (ranges[0].start, ranges[ranges.len() - 1].end);
                    let answer = read_range(&*store, &key, start..end).await.and_then(|bytes| {
                        let slot = |range: &Range<u64>| {
                            let at = (range.start - start) as usize..(range.end - start) as usize;
                            let slot = bytes.slice(at);
                            transit::Slot::parse(&slot)?;
                            Ok(slot)
                        };
                        ranges.iter().map(slot).collect()
                    });
                    shared.counters.object_reads.fetch_add(1, Ordering::Relaxed);
                    let _ = reply.send(answer);
                }
                Side::PutSettled { key, layout, slots, reply } => {
                    let parts: Vec<SlotParts<'_>> = slots.iter().map(SettledSlot::parts).collect();
                    let body = layout.assemble(&parts);
                    drop(parts);
                    drop(slots);
                    let outcome =
                        put_durably(&*store, &shared, &key, &body, backoff_initial, backoff_max)
                            .await
                            .map_err(|reason| Error::ObjectWriteFailed { key, reason });
                    let _ = reply.send(outcome);
                }
            }
        });
    }

    /// Whether (and why) the pending requests go out as a bundle now.
    fn cut_due(&self, now: Instant, draining: bool) -> Option<Cut> {
        let since = self.pending_since?;
        if self.pending_bytes >= self.config.bundle_bytes_target {
            Some(Cut::Size)
        } else if now.duration_since(since) >= self.config.bundle_delay {
            Some(Cut::Delay)
        } else {
            draining.then_some(Cut::Stop)
        }
    }

    /// Envelopes a request's chunks and checks they make a bundle on their own, so that
    /// later a push can only fail against another request's slots.
    fn accept(&mut self, request: Request) {
        let Request { chunks, reply } = request;
        let mut check = BundleBuilder::new(BundleId::default(), 0);
        let mut envelopes = Vec::with_capacity(chunks.len());
        let mut bytes = 0u64;
        let mut refused = None;
        for chunk in &chunks {
            let mut envelope = [0; ENVELOPE_LEN];
            let body = chunk.body.bytes();
            let checked = SlotEnvelope::write(&mut envelope, body, chunk.leader_epoch)
                .map_err(PushRefused::Slot)
                .and_then(|_| check.push_parts(SlotParts { envelope: &envelope, chunk: body }));
            if let Err(why) = checked {
                refused = Some(why);
                break;
            }
            bytes += (ENVELOPE_LEN + body.len()) as u64;
            envelopes.push(envelope);
        }
        let request = Accepted { chunks, envelopes, reply };
        if let Some(refused) = refused {
            request.refuse(Error::UploadRefused(refused));
            return;
        }
        self.pending_since.get_or_insert_with(Instant::now);
        self.set_pending_bytes(self.pending_bytes + bytes);
        self.pending.push(request);
    }

    /// The pending requests' bytes, here and in the shared counters.
    fn set_pending_bytes(&mut self, bytes: u64) {
        self.pending_bytes = bytes;
        self.shared.counters.bytes_waiting.store(bytes, Ordering::Relaxed);
    }

    /// Lays out every pending request in one bundle (deferring to the next bundle a
    /// request whose slots collide with an earlier one's), or in one settled object when
    /// they are one stream's run, and starts its upload.
    fn cut_and_send(&mut self) {
        let mut taken = std::mem::take(&mut self.pending);
        let mut deferred = Vec::new();
        // Each pass either lays out everything or moves one request out: bounded.
        let (layout, pushes) = loop {
            match lay_out_bundle(&taken) {
                Ok(laid) => break laid,
                Err(at) => deferred.push(taken.remove(at)),
            }
        };
        self.set_pending_bytes(
            deferred.iter().flat_map(Accepted::slots).map(|slot| slot.len() as u64).sum(),
        );
        self.pending_since = (!deferred.is_empty()).then(Instant::now);
        self.pending = deferred;
        // `taken` is never empty here (a cut needs pending requests, and a request alone
        // always lays out), but a layout of nothing is simply nothing to send.
        let Some(layout) = layout else { return };
        // Settled keys take no prefix (the settler's neither): an uploader sharing its
        // store under a prefix writes only transit bundles, under it.
        let direct = if self.key_prefix.is_empty() {
            Job::settled(taken, self.config.direct_settle_bytes_min)
        } else {
            Err(taken)
        };
        let job = match direct {
            Ok(job) => job,
            Err(taken) => Job::bundle(&self.key_prefix, &layout, taken, pushes),
        };
        self.shared.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        self.shared.counters.bytes_uploading.fetch_add(job.body.len() as u64, Ordering::Relaxed);
        self.in_flight.spawn(upload(
            Arc::clone(&self.store),
            Arc::clone(&self.shared),
            self.config.backoff_initial,
            self.config.backoff_max,
            self.key_prefix.clone(),
            job,
        ));
    }
}

/// One ranged GET, checked to return the whole range.
async fn read_range(store: &dyn ObjectStore, key: &str, range: Range<u64>) -> Result<Bytes> {
    match store.get(key, ByteRange::Span(range.clone())).await {
        Ok(bytes) if bytes.len() as u64 == range.end - range.start => Ok(bytes),
        Ok(bytes) => Err(Error::internal(format!(
            "object {key} bytes {range:?}: {} bytes came back (the object is shorter than its ref says)",
            bytes.len()
        ))),
        Err(e) if e.is_retryable() => Err(Error::unavailable(format!("the object store ({e})"))),
        Err(e) => Err(Error::internal(format!("object {key} bytes {range:?}: {e}"))),
    }
}

/// PUTs `body` create-only under `key`, retrying with capped, jittered backoff until it
/// is durable or refused for good (the reason).
async fn put_durably(
    store: &dyn ObjectStore,
    shared: &Shared,
    key: &str,
    body: &Bytes,
    backoff_initial: Duration,
    backoff_max: Duration,
) -> std::result::Result<(), String> {
    let counters = &shared.counters;
    let mut ceiling = backoff_initial;
    let mut failing = None;
    loop {
        counters.put_attempts.fetch_add(1, Ordering::Relaxed);
        let failure = match store.put(key, body.clone(), PutCondition::CreateOnly).await {
            Ok(()) => return Ok(()),
            // The key is ours alone (a random bundle ID, or a settled object's stream and
            // first seq_num): an earlier attempt landed although its answer was lost.
            // Durable if the object is exactly ours.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                match store.get(key, ByteRange::All).await {
                    Ok(found) if found == *body => return Ok(()),
                    Ok(found) => {
                        return Err(format!(
                            "another object of {} bytes is under its key",
                            found.len()
                        ));
                    }
                    Err(get) => format!("{e}; then {get}"),
                }
            }
            // Retrying the same request cannot succeed.
            Err(e) if e.kind() == ErrorKind::Invalid => return Err(e.to_string()),
            // Unavailable, and also refused (credentials, a missing bucket): an operator
            // may fix those while the memory budget upstream bounds what waits.
            Err(e) => e.to_string(),
        };
        counters.put_failures.fetch_add(1, Ordering::Relaxed);
        *lock(&shared.last_put_error) = Some(failure);
        failing.get_or_insert_with(|| FailingPut::new(shared));
        tokio::time::sleep(jittered(ceiling)).await;
        ceiling = ceiling.saturating_mul(2).min(backoff_max);
    }
}

/// Writes one bundle or settled object, retrying until it is durable (or refused for
/// good), then answers its requests. A settled object that cannot be written (its key
/// holds another object, or the store refuses it) goes out as a transit bundle instead.
async fn upload(
    store: Arc<dyn ObjectStore>,
    shared: Arc<Shared>,
    backoff_initial: Duration,
    backoff_max: Duration,
    key_prefix: String,
    mut job: Job,
) {
    // Counted in at its start, as laid out then (a fallback below lays it out again).
    let uploading = job.body.len() as u64;
    let started = Instant::now();
    let counters = &shared.counters;
    let put = |job: &Job| {
        let (key, body) = (Arc::clone(&job.key), job.body.clone());
        let (store, shared) = (Arc::clone(&store), Arc::clone(&shared));
        async move { put_durably(&*store, &shared, &key, &body, backoff_initial, backoff_max).await }
    };
    let mut outcome = put(&job).await;
    if job.settled
        && let Err(reason) = &outcome
    {
        counters.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
        *lock(&shared.last_put_error) =
            Some(format!("{}: {reason}; its chunks go in a transit bundle", job.key));
        let requests: Vec<Accepted> =
            job.requests.into_iter().map(|(request, _)| request).collect();
        // One stream's chunks back to back never collide, and are never none.
        let Ok((Some(layout), pushes)) = lay_out_bundle(&requests) else {
            unreachable!("the slots of one settled object lay out in one bundle")
        };
        job = Job::bundle(&key_prefix, &layout, requests, pushes);
        outcome = put(&job).await;
    }
    counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    counters.bytes_uploading.fetch_sub(uploading, Ordering::Relaxed);
    let Job { key, body, requests, chunks, settled } = job;
    match outcome {
        Ok(()) => {
            let (objects, bytes) = match settled {
                true => (&counters.settled_direct, &counters.settled_direct_bytes),
                false => (&counters.bundles, &counters.bundle_bytes),
            };
            objects.fetch_add(1, Ordering::Relaxed);
            bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
            counters.chunks.fetch_add(chunks, Ordering::Relaxed);
            counters.requests.fetch_add(requests.len() as u64, Ordering::Relaxed);
            {
                let mut h = lock(&shared.histograms);
                h.chunks_per_bundle.saturating_record(chunks);
                let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                h.put_latency_us.saturating_record(us.max(1));
            }
            for (request, placements) in requests {
                let chunks = request.chunks.into_iter().map(|c| c.body).collect();
                // A submitter that gave up waiting no longer needs the answer.
                let _ = request.reply.send(Ok(Uploaded { placements, chunks, settled }));
            }
        }
        Err(reason) => {
            for (request, _) in requests {
                request.refuse(Error::ObjectWriteFailed {
                    key: key.to_string(),
                    reason: reason.clone(),
                });
            }
        }
    }
}

/// A random point in the upper half of `ceiling`: spreads retries of many bundles.
fn jittered(ceiling: Duration) -> Duration {
    let half = ceiling / 2;
    let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(fastrand::u64(0..=nanos))
}

/// 16 random bytes from the OS; should the OS source fail, from a seeded generator,
/// which still makes a collision unlikely, and a create-only PUT refuses one anyway.
fn new_bundle_id() -> BundleId {
    let mut id = [0u8; 16];
    if getrandom::fill(&mut id).is_err() {
        id = fastrand::u128(..).to_le_bytes();
    }
    BundleId(id)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for ms in [1u64, 2, 100, 5_000] {
            let ceiling = Duration::from_millis(ms);
            for _ in 0..100 {
                let pause = jittered(ceiling);
                assert!(pause >= ceiling / 2 && pause <= ceiling, "{pause:?} of {ceiling:?}");
            }
        }
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn placement_ranges() {
        let placement = Placement {
            key: "k".into(),
            offset: 100,
            length: 200,
            stream_id: StreamId([1; 16]),
            first_seq_num: 0,
            record_count: 1,
        };
        assert_eq!(placement.range(), 100..300);
        assert_eq!(placement.chunk_range(), 164..300);
    }

    #[test]
    fn defaults_come_from_the_knobs() {
        let config = UploaderConfig::default();
        assert_eq!(config.bundle_bytes_target, tuning::BUNDLE_BYTES_TARGET.default);
        assert_eq!(config.bundle_delay, Duration::from_millis(tuning::BUNDLE_DELAY_MS.default));
        assert_eq!(config.core, None);
    }
}
