//! The settling duty: each shard rewrites its streams' history from transit bundles into
//! per-stream settled objects (`settled.rs`), so that a stream's history becomes a few
//! large objects of its own, and the bundles (shared by many streams) can be reclaimed.
//!
//! A stream's durable chunks in transit bundles are cut into runs: contiguous chunks, each
//! run up to the target size (`settle-target-bytes`). A run is settled once it reaches
//! the target, once its oldest bundle is `settle-age-ms` old, or once its first chunk is
//! about to leave the shard's cache: among the oldest cached bytes that the ingest of the
//! next two ticks, at the last tick's pace, would evict, if it is `settle-early-bytes-min`
//! long. That last rule settles a run short of the target while its bytes are still in
//! memory: with many streams sharing the cache, each holds too little of it to reach the
//! target before it is evicted, and a run read back from the bundles costs a ranged GET
//! per chunk (a stream's chunks are seldom adjacent in bundles shared with other
//! streams). One busy stream seldom trips it: its runs reach the target first, and only a
//! run left behind (settling lagging a moment) is cut short, 4 of about 160 settles in a
//! 20 s `scripts/ab` run.
//! The floor keeps a quiet stream's few records from becoming an object of their own at
//! every turn of the cache; they wait for the age, as before. At every tick
//! (`settle-interval-ms`) every due run of every stream is settled, up to
//! `settles-in-flight-max` at once (runs are disjoint, so they settle independently).
//! Each settle:
//!
//! 1. its chunks' slots are gathered: a chunk still in the shard's cache lent from
//!    memory (`loan::ChunkLoan`), its envelope written as the uploader writes it (so the
//!    slot is byte for byte the one in its bundle), the others fetched, one ranged GET
//!    for each stretch of slots back to back in one bundle, and verified;
//! 2. the slots, unchanged, are laid out in one settled object, PUT create-only under
//!    `<bucket>/<stream ID>/<first seq_num>` and retried until durable. The shard only
//!    plans: the verification (1) and the object's assembly (2), each a pass over every
//!    byte, run on the uploader's core;
//! 3. the chunks' refs are rewritten to point into it (same ref keys; a ref names one
//!    chunk, so whatever transactions have applied, each chunk has exactly one valid
//!    location, both of which hold the same bytes);
//! 4. the leader's chunks are relocated, so reads go to the settled object from then on.
//!
//! A crash after 2 leaves an object no ref names; after part of 3, some chunks point to
//! the settled object and some still to their bundle. Either way every chunk stays
//! readable; the next settle starts at the first chunk still in transit (its object's
//! key then differs, so it never collides with the earlier one), and the auditor
//! (retention issue) reclaims what no ref names. A key can still be taken by an object
//! that is not the run's: an orphan of the uploader's own settled objects (decision
//! 0010). Such a settle fails, and the run is not planned again for a while that
//! doubles with each failure in a row, until the auditor has reclaimed the orphan.
//!
//! Never here: a chunk that is not yet in the object store (journal only), a change to
//! a stream's records or numbering, or an error that stops the shard (a failed settle is
//! counted and tried again at the next tick).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::control::RefRow;
use crate::error::{Error, Result};
use crate::ids::StreamId;
use crate::loan::ChunkLoan;
use crate::settled::SettledBuilder;
use crate::stream::ChunkSource;
use crate::transit::{SLOT_ENVELOPE_LEN, SlotEnvelope, TransitKey};
use crate::uploader::{LEADER_EPOCH, SettledSlot};

use super::ticker::Ticker;
use super::{ObjectSlot, Shard, Slot, Stored};

/// The longest wait, in settle intervals, before a run whose settles keep failing is
/// planned again (64 s at the default 1 s interval).
const SETTLE_BACKOFF_INTERVALS_MAX: u32 = 64;

/// When and how big to settle (`tuning`: settle-*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettleConfig {
    pub target_bytes: u64,
    pub age: Duration,
    pub interval: Duration,
    /// The smallest run settled because its chunks are about to leave the cache
    /// (`settle-early-bytes-min`).
    pub early_bytes_min: u64,
    /// Settles one shard runs at once (`settles-in-flight-max`).
    pub in_flight_max: usize,
}

impl Default for SettleConfig {
    fn default() -> Self {
        Self {
            target_bytes: tuning::SETTLE_TARGET_BYTES.default,
            age: Duration::from_millis(tuning::SETTLE_AGE_MS.default),
            interval: Duration::from_millis(tuning::SETTLE_INTERVAL_MS.default),
            early_bytes_min: tuning::SETTLE_EARLY_BYTES_MIN.default,
            in_flight_max: usize::try_from(tuning::SETTLES_IN_FLIGHT_MAX.default).unwrap_or(1),
        }
    }
}

/// A run being gathered: its chunks, their slots' bytes in the store, and the write time
/// of its oldest bundle.
#[derive(Default)]
struct Run {
    chunks: Vec<Settling>,
    bytes: u64,
    oldest_ms: Option<u64>,
}

/// A run due to settle, and whether only because its chunks are about to leave the
/// cache (an early settle, short of the target and of the age).
struct Due {
    chunks: Vec<Settling>,
    early: bool,
}

/// One chunk of a run to settle: where its slot is now, and its bytes if the shard still
/// has them in memory.
struct Settling {
    first_seq_num: u64,
    data_len: u32,
    slot: Rc<ObjectSlot>,
    cached: Option<Rc<dyn ChunkSource>>,
}

impl Shard {
    /// The settling duty. Runs until the shard closes.
    pub(crate) async fn settler(self: Rc<Self>) {
        let window = self.config.settle.in_flight_max.max(1);
        let mut pushed_before = self.cache_pushed_bytes.get();
        // A tick whose settles overran the interval is followed at once (`Ticker`), so
        // the chunks that came in meanwhile are planned, and held, while still cached.
        let mut ticker = Ticker::new(self.config.settle.interval);
        // Runs whose settle failed, by stream and first seq_num: not planned again before
        // the instant given, after a wait that doubles with each failure of the run in a
        // row, from one interval to SETTLE_BACKOFF_INTERVALS_MAX intervals. What fails for
        // long is a run whose key holds another object until the auditor reclaims it
        // (decision 0010), or a store that is down; neither is worth a pass over the run
        // at every tick, and the stream's other runs go on meanwhile.
        let mut backoff: HashMap<(StreamId, u64), (Instant, Duration)> = HashMap::new();
        let interval = self.config.settle.interval.max(Duration::from_millis(1));
        let longest = interval.saturating_mul(SETTLE_BACKOFF_INTERVALS_MAX);
        loop {
            ticker.tick().await;
            if self.closing.get() || self.failed.borrow().is_some() {
                return;
            }
            let pushed = self.cache_pushed_bytes.get();
            let leaving = self.leaving_cache(2 * (pushed - pushed_before));
            pushed_before = pushed;
            // Every due run is settled before the next tick, `settles-in-flight-max` at a
            // time: one run per stream per tick let a stream ingesting more than
            // settle-target-bytes a tick (32 MiB/s) pile up transit bundles without end.
            // Runs planned together are disjoint, so they settle independently; a stream
            // is planned again only after one of its settles succeeded, so a failing one
            // waits for the next tick, or its backoff.
            let now = Instant::now();
            // A run that stopped failing (settled by a later plan, trimmed) is forgotten
            // once its wait is long over.
            backoff.retain(|_, &mut (until, _)| now < until + longest);
            let streams: Vec<Rc<Slot>> = self.streams.borrow().values().cloned().collect();
            // The first plan is over every stream: it measures the backlog.
            let (due, oldest_ms) = self.due_runs(&streams, &leaving);
            let backlog = oldest_ms.map_or(0, |t| self.now_ms().saturating_sub(t));
            self.count(|s| s.settle_backlog_ms = backlog);
            let mut due = not_waiting(&backoff, now, due);
            while !due.is_empty() {
                let settles = due.into_iter().map(|(slot, due)| {
                    let shard = Rc::clone(&self);
                    let key = run_key(&slot, &due);
                    async move {
                        let settled = shard.settle_run(&slot, due.chunks).await;
                        (slot, key, settled.map(|()| due.early))
                    }
                });
                let mut progressed: Vec<Rc<Slot>> = Vec::new();
                in_order(window, settles, |(slot, key, settled)| {
                    match settled {
                        Ok(early) => {
                            backoff.remove(&key);
                            self.count(|s| {
                                s.settled_objects += 1;
                                s.settled_early += u64::from(early);
                            });
                            if !progressed.iter().any(|s| Rc::ptr_eq(s, &slot)) {
                                progressed.push(slot);
                            }
                        }
                        Err(_) => {
                            self.count(|s| s.settle_failures += 1);
                            let wait = backoff
                                .get(&key)
                                .map_or(interval, |&(_, wait)| (wait * 2).min(longest));
                            backoff.insert(key, (Instant::now() + wait, wait));
                        }
                    }
                    // Closing: those in flight finish, no more start.
                    !self.closing.get()
                })
                .await;
                if self.closing.get() {
                    return;
                }
                due = not_waiting(&backoff, now, self.due_runs(&progressed, &leaving).0);
            }
        }
    }

    /// The runs of `streams` due now, and when the oldest of their transit bundles was
    /// written.
    fn due_runs(
        &self,
        streams: &[Rc<Slot>],
        leaving: &HashMap<StreamId, u64>,
    ) -> (Vec<(Rc<Slot>, Due)>, Option<u64>) {
        let mut due = Vec::new();
        let mut oldest_ms: Option<u64> = None;
        for slot in streams {
            let leaving = leaving.get(&slot.leader.borrow().id()).copied();
            let (runs, oldest) = self.runs_to_settle(slot, leaving);
            oldest_ms = oldest_ms.into_iter().chain(oldest).min();
            due.extend(runs.into_iter().map(|run| (Rc::clone(slot), run)));
        }
        (due, oldest_ms)
    }

    /// For each stream with chunks among the cached bytes that `coming` more bytes of
    /// cached chunks would evict (the cache's oldest, past what the budget has room
    /// for), the first seq_num of its last such chunk.
    fn leaving_cache(&self, coming: u64) -> HashMap<StreamId, u64> {
        let mut leaving = HashMap::new();
        let mut evicted =
            (self.held.get() + coming).saturating_sub(self.config.memory_budget_bytes);
        for entry in self.cache_order.borrow().iter() {
            if evicted == 0 {
                break;
            }
            evicted = evicted.saturating_sub(entry.bytes);
            let last = leaving.entry(entry.id).or_insert(entry.first_seq_num);
            *last = (*last).max(entry.first_seq_num);
        }
        leaving
    }

    /// The stream's runs of transit chunks to settle now, oldest first: each as long as
    /// the target (the last one, or one cut short by chunks settled already, shorter:
    /// due only once its oldest bundle is `settle-age-ms` old, or once its first chunk is
    /// at or before `leaving`, the last of the stream's chunks about to be evicted, and
    /// it is at least `settle-early-bytes-min` long). With them, when its oldest transit
    /// bundle was written, if it has history in transit.
    fn runs_to_settle(&self, slot: &Slot, leaving: Option<u64>) -> (Vec<Due>, Option<u64>) {
        let leader = slot.leader.borrow();
        let mut runs = Vec::new();
        let mut oldest_ms: Option<u64> = None;
        if leader.is_deleted() {
            return (runs, oldest_ms);
        }
        let target = self.config.settle.target_bytes;
        let age = u64::try_from(self.config.settle.age.as_millis()).unwrap_or(u64::MAX);
        let now = self.now_ms();
        let mut close = |run: &mut Run| {
            let run = std::mem::take(run);
            let old = run.oldest_ms.is_some_and(|oldest| now.saturating_sub(oldest) >= age);
            let Some(first) = run.chunks.first() else { return };
            let evicted_soon = leaving.is_some_and(|last| first.first_seq_num <= last)
                && run.bytes >= self.config.settle.early_bytes_min;
            let early = evicted_soon && run.bytes < target && !old;
            if run.bytes >= target || old || early {
                runs.push(Due { chunks: run.chunks, early });
            }
        };
        let mut run = Run::default();
        for chunk in leader.durable_chunks() {
            let in_transit = match &chunk.location {
                Stored::Object(object) => TransitKey::parse(&object.key).ok().map(|k| (object, k)),
                Stored::Journal(_) => None,
            };
            let Some((object, key)) = in_transit else {
                // Settled already (or not in the store yet): a run never spans it.
                close(&mut run);
                continue;
            };
            if run.bytes >= target {
                close(&mut run);
            }
            run.bytes += object.length;
            run.oldest_ms =
                Some(run.oldest_ms.map_or(key.written_at_ms, |t| t.min(key.written_at_ms)));
            oldest_ms = Some(oldest_ms.map_or(key.written_at_ms, |t| t.min(key.written_at_ms)));
            run.chunks.push(Settling {
                first_seq_num: chunk.first_seq_num,
                data_len: chunk.data_len,
                slot: Rc::clone(object),
                cached: chunk.cached.clone(),
            });
        }
        close(&mut run);
        (runs, oldest_ms)
    }

    /// Settles one run: fetch, lay out, PUT, rewrite refs, relocate.
    async fn settle_run(&self, slot: &Slot, run: Vec<Settling>) -> Result<()> {
        let id = slot.leader.borrow().id();
        let bucket = slot.bucket.clone();
        // A chunk still in the shard's cache is not read back: its slot is rebuilt from
        // memory, the envelope exactly as the uploader wrote it (same function, same
        // leader epoch), so the settled object is the same bytes either way and a
        // retried settle finds its own object. The others are fetched: slots that lie
        // back to back in one object (a stream's chunks of one bundle) in one ranged
        // GET, the GETs overlapping, the settles in flight together taking half the
        // uploader's reads at most so that readers of history keep room.
        let mut gets: Vec<(Arc<str>, Vec<Range<u64>>)> = Vec::new();
        for chunk in run.iter().filter(|chunk| chunk.cached.is_none()) {
            let range = chunk.slot.offset..chunk.slot.offset + chunk.slot.length;
            match gets.last_mut() {
                Some((key, ranges))
                    if *key == chunk.slot.key
                        && ranges.last().map(|r| r.end) == Some(range.start) =>
                {
                    ranges.push(range);
                }
                _ => gets.push((Arc::clone(&chunk.slot.key), vec![range])),
            }
        }
        let settles = self.config.settle.in_flight_max.max(1);
        let window = (self.uploader.reads_in_flight_max() / 2 / settles).max(1);
        let reads = gets.into_iter().map(|(key, ranges)| {
            let uploader = self.uploader.clone();
            async move { uploader.read_slots(key, ranges).await }
        });
        let (mut fetched, mut failed) = (VecDeque::new(), None);
        in_order(window, reads, |read| match read {
            Ok(slots) => {
                fetched.extend(slots);
                true
            }
            Err(error) => {
                failed = Some(error);
                false
            }
        })
        .await;
        if let Some(error) = failed {
            return Err(error);
        }
        let from_store = fetched.len() as u64;
        // Declared before the slots, so dropped after them: a loan outlives what it lent.
        let mut loans = Vec::new();
        let mut slots = Vec::with_capacity(run.len());
        for chunk in &run {
            slots.push(match &chunk.cached {
                Some(cached) => {
                    let loan = ChunkLoan::new(Rc::clone(cached));
                    let slot = slot_of(&loan)?;
                    loans.push(loan);
                    if slot.parts().len() as u64 != chunk.slot.length {
                        return Err(Error::internal(format!(
                            "settling stream {id}: chunk {}'s slot is {} bytes, {} in {}",
                            chunk.first_seq_num,
                            slot.parts().len(),
                            chunk.slot.length,
                            chunk.slot.key
                        )));
                    }
                    slot
                }
                None => SettledSlot::Fetched(
                    fetched.pop_front().expect("one fetched slot per chunk not cached"),
                ),
            });
        }
        self.count(|s| {
            s.settled_from_store += from_store;
            s.settled_from_memory += run.len() as u64 - from_store;
        });
        let mut builder = SettledBuilder::new(id, run[0].first_seq_num);
        for slot in &slots {
            builder.push_parts(slot.parts()).map_err(|refused| {
                Error::internal(format!("settling stream {id}: a slot was refused: {refused}"))
            })?;
        }
        let layout = builder.finish().expect("a run has at least one chunk");
        let key = layout.key(bucket).to_string();
        let entries = layout.entries().to_vec();
        self.uploader.put_settled(key.clone(), layout, slots).await?;
        let refs: Vec<RefRow> = entries
            .iter()
            .zip(&run)
            .map(|(entry, chunk)| RefRow {
                id,
                first_seq_num: entry.first_seq_num,
                record_count: entry.record_count,
                last_timestamp: entry.last_timestamp,
                data_len: chunk.data_len,
                object: key.clone(),
                offset: entry.offset,
                length: u64::from(entry.len),
            })
            .collect();
        self.control.put_refs(&refs).await?;
        let key: Arc<str> = key.into();
        let mut leader = slot.leader.borrow_mut();
        for entry in &entries {
            let object = ObjectSlot {
                key: Arc::clone(&key),
                offset: entry.offset,
                length: u64::from(entry.len),
            };
            // A chunk trimmed meanwhile is simply gone.
            leader.relocate(entry.first_seq_num, Stored::Object(Rc::new(object)), None);
        }
        Ok(())
    }
}

/// The runs of `planned` not waiting out a backoff at `now`.
fn not_waiting(
    backoff: &HashMap<(StreamId, u64), (Instant, Duration)>,
    now: Instant,
    planned: Vec<(Rc<Slot>, Due)>,
) -> Vec<(Rc<Slot>, Due)> {
    let waits = |(slot, due): &(Rc<Slot>, Due)| {
        backoff.get(&run_key(slot, due)).is_some_and(|&(until, _)| now < until)
    };
    planned.into_iter().filter(|run| !waits(run)).collect()
}

/// What a run's settle backoff is kept by: its stream and first seq_num (the key of
/// the object it settles into).
fn run_key(slot: &Slot, due: &Due) -> (StreamId, u64) {
    (slot.leader.borrow().id(), due.chunks.first().map_or(0, |chunk| chunk.first_seq_num))
}

/// A cached chunk's transit slot: the chunk lent where it is, and the envelope the
/// uploader gave it, written anew (same function, same leader epoch).
fn slot_of(loan: &ChunkLoan<dyn ChunkSource>) -> Result<SettledSlot> {
    let mut envelope = [0; SLOT_ENVELOPE_LEN];
    SlotEnvelope::write(&mut envelope, loan.chunk().chunk_bytes(), LEADER_EPOCH)
        .map_err(|e| Error::internal(format!("a cached chunk cannot be enveloped: {e}")))?;
    Ok(SettledSlot::Cached { envelope, chunk: loan.lend_bytes() })
}

/// Runs `jobs` as tasks on this executor, at most `window` at once, and hands their
/// outputs to `each` in the order the jobs came. Once `each` returns false no further job
/// starts; those already running are awaited and handed over, never cancelled.
async fn in_order<T: 'static>(
    window: usize,
    jobs: impl IntoIterator<Item = impl Future<Output = T> + 'static>,
    mut each: impl FnMut(T) -> bool,
) {
    let mut jobs = jobs.into_iter();
    let mut running = VecDeque::with_capacity(window);
    let mut starting = true;
    loop {
        while starting
            && running.len() < window.max(1)
            && let Some(job) = jobs.next()
        {
            running.push_back(glommio::spawn_local(job));
        }
        let Some(task) = running.pop_front() else { return };
        starting &= each(task.await);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::time::Duration;

    use glommio::{LocalExecutorBuilder, Placement};

    use super::*;

    /// Outputs come in the jobs' order however the jobs finish; no more than `window` run
    /// at once; once `each` says stop, nothing new starts and what runs is handed over.
    #[test]
    fn in_order_keeps_the_order_the_window_and_the_stop() {
        let executor = LocalExecutorBuilder::new(Placement::Unbound).make().expect("executor");
        executor.run(async {
            let (running, most) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
            let started = Rc::new(RefCell::new(Vec::new()));
            let jobs = (0..10u64).map(|i| {
                let (running, most, started) =
                    (Rc::clone(&running), Rc::clone(&most), Rc::clone(&started));
                async move {
                    started.borrow_mut().push(i);
                    running.set(running.get() + 1);
                    most.set(most.get().max(running.get()));
                    // Later jobs finish first.
                    glommio::timer::sleep(Duration::from_millis(10 - i)).await;
                    running.set(running.get() - 1);
                    i
                }
            });
            let mut seen = Vec::new();
            in_order(3, jobs, |i| {
                seen.push(i);
                i < 4
            })
            .await;
            // Stopped at 4: each handover had started the next job, so 0..=6 had started
            // (5 and 6 still running, then handed over too); 7.. never did.
            assert_eq!(seen, (0..=6).collect::<Vec<_>>());
            assert_eq!(*started.borrow(), (0..=6).collect::<Vec<_>>());
            assert_eq!(most.get(), 3, "at most the window at once");
            assert_eq!(running.get(), 0, "everything started was awaited");
        });
    }
}
