//! A shard's road to the object store: upload jobs, each a group of chunks that goes to
//! the uploader core in one request and whose refs are then made durable, applied back
//! to the leaders strictly in the order the jobs were made.
//!
//! ```text
//! flusher ── job ──► queue ──► feeder: take a permit (shard-uploads-in-flight-max),
//!                              spawn: [read journal] → upload → put refs
//!                                            │ (in flight, finishing in any order)
//!                    completer ◄── in order ─┘ apply: standard → durable, acknowledged
//!                                                     express  → relocated, journal released
//! ```
//!
//! Why in order: a stream's chunks become durable in sequence order, and a job's refs
//! can be durable before an earlier job's. Applying in job order keeps acknowledgements
//! in sequence order, which is what recovery relies on (a chunk after a gap was never
//! acknowledged, `recovery.rs`). It also makes journal release simple: the journal is
//! given up to the first express job not yet applied.
//!
//! Memory: a chunk is counted in the shard's `held` bytes from its append, and cannot be
//! evicted from memory before its job is applied (a standard chunk is not durable
//! before; an express chunk enters the eviction order only once it is in the object
//! store). So a store that is down backs appends up to the memory budget, which then
//! refuses them (ResourceExhausted); when the store returns, the uploader's retries land
//! and everything drains.

use std::rc::Rc;
use std::sync::Arc;

use crate::chunk::{ChunkHeader, ChunkStorage, SealedChunk};
use crate::control::{ControlPlane, RefRow};
use crate::error::{Error, Result};
use crate::journal::{Journal, JournalBuffer, Location};
use crate::loan::ChunkLoan;
use crate::meta::RedbMetaStore;
use crate::names::BucketName;
use crate::stream::{ChunkSource, DurableChunk, KeptChunk, metered_bytes};
use crate::uploader::{ChunkBody, Placement, UploadChunk, Uploader};

use super::{ObjectSlot, Shard, Stored};
use crate::aligned::AlignedBuf;

/// What a job carries to the store.
pub(crate) enum JobChunks {
    /// Standard chunks, sealed in their own aligned buffers.
    Standard(Vec<SealedChunk<AlignedBuf>>),
    /// Express chunks just written to the journal (lent to the uploader in place: see
    /// `ChunkLoan`).
    Journaled(Vec<Rc<SealedChunk<JournalBuffer>>>),
    /// Express chunks found in the journal at recovery with no ref: read back first.
    Recovered(Vec<Location>),
}

/// A job: its chunks, and for express jobs the journal position of its first chunk.
pub(crate) struct Job {
    chunks: JobChunks,
    lsn: Option<u64>,
    /// Queued jobs this one stands for (more than one once gathered).
    gathered: usize,
}

impl Job {
    pub(super) fn standard(chunks: Vec<SealedChunk<AlignedBuf>>) -> Self {
        Job { chunks: JobChunks::Standard(chunks), lsn: None, gathered: 1 }
    }

    /// Express chunks just appended to the journal at `lsn` and on.
    pub(super) fn journaled(chunks: Vec<Rc<SealedChunk<JournalBuffer>>>, lsn: u64) -> Self {
        Job { chunks: JobChunks::Journaled(chunks), lsn: Some(lsn), gathered: 1 }
    }

    /// Journal entries found at start with no ref, in journal order.
    pub(super) fn recovered(locations: Vec<Location>) -> Self {
        let lsn = locations.first().map(|l| l.lsn);
        Job { chunks: JobChunks::Recovered(locations), lsn, gathered: 1 }
    }

    /// What the job adds to the shard's `held` bytes until it is applied: chunks it reads
    /// back from the journal. The others are counted from their append and stay in the
    /// leader's cache, never evicted, until the job is applied.
    fn held_bytes(&self) -> u64 {
        match self.chunks {
            JobChunks::Recovered(_) => self.bytes(),
            JobChunks::Standard(_) | JobChunks::Journaled(_) => 0,
        }
    }

    /// The chunks' bytes.
    fn bytes(&self) -> u64 {
        match &self.chunks {
            JobChunks::Standard(chunks) => chunks.iter().map(|c| c.bytes().len() as u64).sum(),
            JobChunks::Journaled(chunks) => chunks.iter().map(|c| c.bytes().len() as u64).sum(),
            JobChunks::Recovered(locations) => {
                locations.iter().map(|l| u64::from(l.chunk_len)).sum()
            }
        }
    }

    /// Takes in the next job of the same kind (its chunks come after this one's).
    fn absorb(&mut self, next: Job) {
        self.lsn = self.lsn.or(next.lsn);
        self.gathered += next.gathered;
        match (&mut self.chunks, next.chunks) {
            (JobChunks::Standard(into), JobChunks::Standard(more)) => into.extend(more),
            (JobChunks::Journaled(into), JobChunks::Journaled(more)) => into.extend(more),
            (JobChunks::Recovered(into), JobChunks::Recovered(more)) => into.extend(more),
            _ => unreachable!("only jobs of one kind are merged"),
        }
    }
}

/// Says, once a job is done with its refs, whether they landed and every earlier job's
/// did: a message if so, the sender dropped without one if not.
pub(crate) type RefsLanded = flume::Receiver<()>;

/// A job's turn to write refs. A settled object the uploader wrote may hold chunks of
/// several jobs (a busy stream's), and each job writes its own refs: if a later job's
/// refs landed and an earlier one's did not (a crash between, or refs refused), the
/// object's first chunks would go again, to a transit bundle, and their settle would
/// meet the object under its own key, for good. So a job whose chunks are in a settled
/// object writes its refs only once every earlier job's have landed, and not at all if
/// one failed (the shard has failed then); a job's refs into a transit bundle (a random
/// key) need no turn.
pub(crate) struct RefsTurn {
    before: Option<RefsLanded>,
    /// What `before` said, once heard.
    earlier_landed: Option<bool>,
    mine: flume::Sender<()>,
}

impl RefsTurn {
    fn new(before: Option<RefsLanded>, mine: flume::Sender<()>) -> Self {
        RefsTurn { before, earlier_landed: None, mine }
    }

    /// Waits until every earlier job is done with its refs; whether they all landed.
    /// Cancel-safe: a wait dropped before its answer leaves the turn as it was.
    async fn wait(&mut self) -> bool {
        if let Some(landed) = self.earlier_landed {
            return landed;
        }
        let landed = match &self.before {
            Some(before) => before.recv_async().await.is_ok(),
            None => true,
        };
        self.before = None;
        self.earlier_landed = Some(landed);
        landed
    }

    /// Passes the turn on, once every earlier job is done: landed if this job's refs
    /// and all earlier ones' did.
    async fn pass(mut self, landed: bool) {
        if self.wait().await && landed {
            // The next job may be gone (a shard closing); nothing to tell then.
            let _ = self.mine.send(());
        }
    }
}

/// One chunk of a finished job: where it landed, and its bytes to keep in memory when
/// they came back in a buffer of their own (a lent express chunk stays in the journal
/// buffer its leader already holds).
struct LandedChunk {
    placement: Placement,
    header: ChunkHeader,
    bytes: Option<Rc<dyn ChunkSource>>,
}

/// What a finished job hands back, chunk by chunk.
type Landed = Vec<LandedChunk>;

/// A job in flight: what kind it is, its journal position (express), and its task.
pub(crate) struct InFlight {
    standard: bool,
    lsn: Option<u64>,
    held_bytes: u64,
    /// Queued jobs gathered into this one.
    gathered: usize,
    task: glommio::task::JoinHandle<Result<Landed>>,
    _permit: glommio::sync::StaticPermit,
}

impl Shard {
    /// Queues a job for the feeder. Never waits: the memory budget bounds the queue.
    pub(super) fn queue_job(&self, job: Job) {
        self.unapplied.set(self.unapplied.get() + 1);
        self.held.set(self.held.get() + job.held_bytes());
        self.jobs.borrow_mut().push_back(job);
        self.jobs_changed.notify();
    }

    /// Starts queued jobs, at most `shard-uploads-in-flight-max` at once, in order.
    pub(crate) async fn feeder(self: Rc<Self>) {
        loop {
            let seen = self.jobs_changed.generation();
            if self.jobs.borrow().is_empty() {
                self.jobs_changed.changed(seen).await;
                continue;
            }
            let Ok(permit) = self.upload_permits.acquire_static_permit(1).await else { return };
            // Everything queued meanwhile of the same kind goes in the same request.
            let Some(job) = self.gather() else { continue };
            let standard = matches!(job.chunks, JobChunks::Standard(_));
            let (held_bytes, lsn, gathered) = (job.held_bytes(), job.lsn, job.gathered);
            let (uploader, control, journal) =
                (self.uploader.clone(), self.control.clone(), Rc::clone(&self.journal));
            let buckets = self.buckets_of(&job.chunks);
            let (mine, landed) = flume::bounded(1);
            let mut turn = RefsTurn::new(self.last_refs.replace(Some(landed)), mine);
            let wait_max = self.config.refs_wait_max;
            let task = glommio::spawn_local(async move {
                let landed =
                    run(uploader, control, journal, job.chunks, buckets, &mut turn, wait_max).await;
                turn.pass(landed.is_ok()).await;
                landed
            })
            .detach();
            self.in_flight.borrow_mut().push_back(InFlight {
                standard,
                lsn,
                held_bytes,
                gathered,
                task,
                _permit: permit,
            });
            self.in_flight_changed.notify();
        }
    }

    /// Each chunk's bucket, so the uploader may write a busy stream's chunks straight
    /// into a settled object of its own. Not for chunks recovered from the journal: they
    /// are read back only once the job runs, and are few, once per start.
    fn buckets_of(&self, chunks: &JobChunks) -> Vec<Option<BucketName>> {
        let streams = self.streams.borrow();
        let bucket = |header: &ChunkHeader| {
            let slot = streams.get(&header.stream_id)?;
            Some(slot.bucket.clone())
        };
        match chunks {
            JobChunks::Standard(chunks) => chunks.iter().map(|c| bucket(c.header())).collect(),
            JobChunks::Journaled(chunks) => chunks.iter().map(|c| bucket(c.header())).collect(),
            JobChunks::Recovered(locations) => vec![None; locations.len()],
        }
    }

    /// The front job, with the jobs of its kind queued right behind it, up to a bundle.
    fn gather(&self) -> Option<Job> {
        let mut jobs = self.jobs.borrow_mut();
        let mut job = jobs.pop_front()?;
        let mut bytes = job.bytes();
        while let Some(next) = jobs.front() {
            let kind = std::mem::discriminant(&job.chunks) == std::mem::discriminant(&next.chunks);
            if !kind || bytes + next.bytes() > self.config.upload_job_bytes_max {
                break;
            }
            let next = jobs.pop_front().expect("checked just above");
            bytes += next.bytes();
            job.absorb(next);
        }
        Some(job)
    }

    /// Applies finished jobs in the order they started.
    pub(crate) async fn completer(self: Rc<Self>) {
        loop {
            let seen = self.in_flight_changed.generation();
            let front = self.in_flight.borrow_mut().pop_front();
            let Some(job) = front else {
                self.in_flight_changed.changed(seen).await;
                continue;
            };
            let InFlight { standard, held_bytes, gathered, task, _permit, .. } = job;
            let result =
                task.await.unwrap_or_else(|| Err(Error::internal("an upload task was dropped")));
            let uploaded = match result {
                Ok(uploaded) => uploaded,
                Err(error) => {
                    self.fail(format!("upload to the object store: {error}"));
                    return;
                }
            };
            self.release(held_bytes);
            self.count(|s| s.upload_jobs += 1);
            if standard {
                self.apply_standard(uploaded);
            } else {
                self.apply_express(uploaded).await;
            }
            // Every job gathered into this one is applied.
            self.unapplied.set(self.unapplied.get() - gathered);
            self.in_flight_changed.notify();
        }
    }

    /// Waits until every queued job is applied, for at most `time` (a stopping shard:
    /// what is still on its way then is safe in the journal, and the next start uploads
    /// it again). Returns whether everything was applied.
    pub(crate) async fn drain_uploads(&self, time: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + time;
        loop {
            let (jobs_seen, flight_seen) =
                (self.jobs_changed.generation(), self.in_flight_changed.generation());
            if self.unapplied.get() == 0 {
                return true;
            }
            if self.failed.borrow().is_some() {
                return false;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            let changed = futures_lite::future::or(
                self.jobs_changed.changed(jobs_seen),
                self.in_flight_changed.changed(flight_seen),
            );
            futures_lite::future::or(changed, glommio::timer::sleep(left)).await;
        }
    }

    /// Standard chunks are durable: visible and acknowledged, served from memory.
    fn apply_standard(&self, uploaded: Landed) {
        for LandedChunk { placement, header, bytes } in uploaded {
            let Some(slot) = self.streams.borrow().get(&placement.stream_id).cloned() else {
                unreachable!("a stream with chunks in flight keeps its slot until they are durable")
            };
            // Its bytes, held since the append, stay held: now as a cached chunk.
            debug_assert!(bytes.is_some(), "standard chunks come back in their buffers");
            let stored = Stored::Object(Rc::new(ObjectSlot::from(&placement)));
            slot.leader.borrow_mut().on_durable(DurableChunk::new(&header, stored, bytes));
            self.resume_held_back(&slot);
            let metered = metered_bytes(header.record_count.into(), header.data_len.into());
            self.cache_push(placement.stream_id, header.first_seq_num, metered);
            slot.changed.notify();
            self.count(|s| s.chunks += 1);
        }
    }

    /// Express chunks are in the object store and referenced: reads go there once they
    /// leave memory, and the journal space up to the next pending job is given up.
    async fn apply_express(&self, uploaded: Landed) {
        for LandedChunk { placement, header, bytes } in uploaded {
            let Some(slot) = self.streams.borrow().get(&placement.stream_id).cloned() else {
                continue; // deleted since: its objects are the auditor's
            };
            let first = header.first_seq_num;
            let stored = Stored::Object(Rc::new(ObjectSlot::from(&placement)));
            // Pinned in memory until now (the journal's space is about to go); from here
            // on it may be evicted and read back from the store.
            if slot.leader.borrow_mut().relocate(first, stored, bytes) {
                let metered = metered_bytes(header.record_count.into(), header.data_len.into());
                self.cache_push(placement.stream_id, first, metered);
            }
        }
        // Everything before the first express chunk still on its way is in the store.
        let next_in_flight = self.in_flight.borrow().iter().find_map(|job| job.lsn);
        let next_queued = || self.jobs.borrow().iter().find_map(|job| job.lsn);
        let release_to = next_in_flight.or_else(next_queued).unwrap_or_else(|| self.journal.head());
        if let Err(error) = self.journal.release_before(release_to).await {
            self.fail(format!("journal release: {error}"));
        }
    }
}

/// What the leader keeps in memory of a lent express chunk once it is in the store: the
/// journal buffer it already holds (`None`: no change), unless the chunk is sparse in it
/// (a small batch in a fresh `--express-chunk-bytes` buffer).
fn kept_in_memory(loan: &ChunkLoan<SealedChunk<JournalBuffer>>) -> Option<Rc<dyn ChunkSource>> {
    let chunk = loan.chunk();
    sparse_copy(chunk, chunk.storage().allocated())
}

/// What the leader keeps in memory of a standard chunk once it is in the store: its own
/// buffer, unless the chunk is sparse in it (cut by its delay before it grew).
fn kept_owned(chunk: SealedChunk<AlignedBuf>) -> Rc<dyn ChunkSource> {
    sparse_copy(&chunk, chunk.storage().allocated()).unwrap_or_else(|| Rc::new(chunk))
}

/// A copy of its own size of a chunk that fills under half of the `allocated` bytes of
/// its buffer ([`KeptChunk::is_sparse`]), else `None`.
fn sparse_copy<B: ChunkStorage>(
    chunk: &SealedChunk<B>,
    allocated: usize,
) -> Option<Rc<dyn ChunkSource>> {
    KeptChunk::is_sparse(chunk.bytes().len(), allocated)
        .then(|| Rc::new(KeptChunk::copy_of(chunk.bytes(), *chunk.header())) as _)
}

impl From<&Placement> for ObjectSlot {
    fn from(placement: &Placement) -> Self {
        ObjectSlot {
            key: Arc::clone(&placement.key),
            offset: placement.offset,
            length: placement.length,
        }
    }
}

/// How many times a job writes its chunks anew after the auditor marked the bundle they
/// went to (see [`run`]) before the shard gives up.
const DEAD_BUNDLE_RETRIES: u32 = 16;

/// One job's work, off the shard's state: make the chunks uploadable, upload them in
/// one request, make their refs durable.
///
/// The auditor marks an object dead once it has seen it unreferenced for an interval,
/// and a mark refuses new refs to it (`ObjectDead`). A bundle whose refs took longer
/// than that to land (a slow metadata write, a short `--auditor-interval-ms`) is such an
/// object: its chunks then go to a new bundle, and the marked one is the auditor's to
/// delete. Nothing was acknowledged from the first bundle, so nothing is lost. The same
/// goes for a settled object the uploader wrote (`buckets`: each chunk's bucket, if it
/// may go into one): its chunks then go to a bundle, since their object's key is marked.
/// They go to a bundle too when their turn to write refs (`RefsTurn`) took longer than
/// `wait_max`: the object went unreferenced long enough to be marked, and, were the wait
/// longer still, deleted and unmarked.
async fn run(
    uploader: Uploader,
    control: ControlPlane<RedbMetaStore>,
    journal: Rc<Journal>,
    chunks: JobChunks,
    mut buckets: Vec<Option<BucketName>>,
    turn: &mut RefsTurn,
    wait_max: std::time::Duration,
) -> Result<Landed> {
    // Declared first, so dropped last: after every lent chunk of this job is back.
    let mut loans = Vec::new();
    let mut chunks: Vec<ChunkBody> = match chunks {
        JobChunks::Standard(chunks) => chunks.into_iter().map(ChunkBody::Owned).collect(),
        JobChunks::Journaled(chunks) => chunks
            .into_iter()
            .map(|chunk| {
                let loan = ChunkLoan::new(chunk);
                let lent = loan.lend();
                loans.push(loan);
                ChunkBody::Lent(lent)
            })
            .collect(),
        JobChunks::Recovered(locations) => {
            let mut chunks = Vec::with_capacity(locations.len());
            for location in &locations {
                let read = journal.read(location).await?;
                chunks.push(ChunkBody::Owned(SealedChunk::copy_of(read.bytes(), *read.header())));
            }
            chunks
        }
    };
    let mut rewrites = 0;
    loop {
        let requests = chunks.into_iter().enumerate().map(|(i, body)| UploadChunk {
            body,
            leader_epoch: crate::uploader::LEADER_EPOCH,
            bucket: buckets.get(i).cloned().flatten(),
        });
        let uploaded = uploader.upload(requests.collect()).await?;
        let refs: Vec<RefRow> = uploaded
            .placements
            .iter()
            .zip(&uploaded.chunks)
            .map(|(placement, chunk)| RefRow {
                id: placement.stream_id,
                first_seq_num: placement.first_seq_num,
                record_count: placement.record_count,
                last_timestamp: chunk.header().last_timestamp,
                data_len: chunk.header().data_len,
                object: placement.key.to_string(),
                offset: placement.offset,
                length: placement.length,
            })
            .collect();
        // A settled object's refs wait for their turn; one that waited longer than
        // `wait_max` may be marked dead by now, and its chunks go anew, as below.
        let mut waited_too_long = false;
        if uploaded.settled {
            let waiting = std::time::Instant::now();
            if !turn.wait().await {
                return Err(Error::internal(
                    "an earlier upload job's refs failed, so this job's, which share a settled \
                     object with them, were not written",
                ));
            }
            waited_too_long = waiting.elapsed() > wait_max && rewrites < DEAD_BUNDLE_RETRIES;
        }
        if !waited_too_long {
            match control.put_refs(&refs).await {
                Ok(()) => {
                    let landed = uploaded.placements.into_iter().zip(uploaded.chunks).enumerate();
                    let landed = landed.map(|(i, (placement, body))| {
                        let header = *body.header();
                        let bytes = match body {
                            ChunkBody::Owned(chunk) => Some(kept_owned(chunk)),
                            // A journaled job lends every chunk, in order.
                            ChunkBody::Lent(_) => kept_in_memory(&loans[i]),
                        };
                        LandedChunk { placement, header, bytes }
                    });
                    return Ok(landed.collect());
                }
                Err(Error::ObjectDead { .. }) if rewrites < DEAD_BUNDLE_RETRIES => {}
                Err(error) => return Err(error),
            }
        }
        // Anew, to a transit bundle under a new key, never to the marked object.
        rewrites += 1;
        buckets.clear();
        chunks = uploaded.chunks;
    }
}

#[cfg(test)]
mod tests {
    use glommio::{LocalExecutorBuilder, Placement};

    use super::*;
    use crate::chunk::ChunkBuilder;
    use crate::ids::StreamId;

    /// A sealed chunk of one `body_len`-byte record in a fresh `capacity`-byte buffer.
    fn sealed(capacity: usize, body_len: usize) -> Rc<SealedChunk<JournalBuffer>> {
        let buffer = JournalBuffer::new(glommio::allocate_dma_buffer(capacity));
        let mut builder = ChunkBuilder::with_buffer(buffer, StreamId([7; 16]), 0);
        let record: Vec<u8> = std::iter::once(0).chain((0..body_len).map(|i| i as u8)).collect();
        builder.push_record(&record, 1).expect("sized to fit");
        Rc::new(builder.seal())
    }

    /// A job's turn comes once every earlier job is done with its refs, and says whether
    /// they all landed: one failure is heard by every later job.
    #[test]
    fn a_turn_waits_for_every_earlier_job_and_hears_a_failure() {
        let executor = LocalExecutorBuilder::new(Placement::Unbound).make().expect("executor");
        executor.run(async {
            let mut before = None;
            let mut turns: Vec<RefsTurn> = (0..4)
                .map(|_| {
                    let (mine, landed) = flume::bounded(1);
                    RefsTurn::new(before.replace(landed), mine)
                })
                .collect();
            let (first, mut second) = (turns.remove(0), turns.remove(0));
            let not_yet = futures_lite::future::poll_once(second.wait()).await;
            assert_eq!(not_yet, None, "the second waits while the first is not done");
            first.pass(true).await;
            assert!(second.wait().await, "the first landed");
            // A wait dropped before its answer loses nothing: the third still hears that
            // the second failed.
            let (mut third, mut fourth) = (turns.remove(0), turns.remove(0));
            assert_eq!(futures_lite::future::poll_once(third.wait()).await, None);
            second.pass(false).await;
            assert!(!third.wait().await, "the second failed");
            third.pass(true).await;
            assert!(!fourth.wait().await, "an earlier failure is heard by every later job");
        });
    }

    #[test]
    fn a_lent_chunk_stays_in_its_buffer_unless_it_fills_under_half_of_it() {
        let executor = LocalExecutorBuilder::new(Placement::Unbound).make().expect("executor");
        executor.run(async {
            // Most of a 64 KiB buffer: cached where it is.
            let full = ChunkLoan::new(sealed(64 << 10, 40 << 10));
            assert!(kept_in_memory(&full).is_none(), "the journal buffer is kept");

            // 8 KiB of a 256 KiB buffer: cached as a copy of its own size.
            let sparse = ChunkLoan::new(sealed(256 << 10, 5000));
            let kept = kept_in_memory(&sparse).expect("a right-sized copy");
            let records = |source: &dyn ChunkSource| {
                source
                    .records()
                    .iter()
                    .map(|(seq, ts, bytes)| (seq, ts, bytes.to_vec()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(records(&*kept), records(&**sparse.chunk()), "the same records");
        });
    }
}
