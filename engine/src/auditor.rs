//! The auditor: physical reclamation of history nobody can read any more (retention.md,
//! operations.md "Duties"). One per node, on its own thread (`nova-auditor`, a
//! current-thread tokio runtime for the object store), every `--auditor-interval-ms`:
//!
//! 1. **Refs nobody can read** are deleted: a live stream's refs wholly below its trim
//!    watermark, and every ref of a deleted stream. (The leader stopped serving them
//!    the moment the watermark moved or the stream was deleted.)
//! 2. **Objects no ref names** (transit bundles and settled objects; other keys in the
//!    store are never touched) are marked dead in metadata (`g/<key>` → time). An
//!    object is marked only once it was seen unreferenced on two passes an interval
//!    apart, so a bundle whose refs land within an interval of its PUT is never marked.
//!    One whose refs take longer is refused them, and the shard writes its chunks to a
//!    new bundle (`shard/uploads.rs`): a slow metadata write costs a rewrite, never an
//!    acknowledged record.
//! 3. **Dead objects past the read grace** (`--auditor-read-grace` since the mark)
//!    are deleted, after the refs are read once more. A mark also blocks new refs to the
//!    object (`ControlPlane::put_refs` checks it in the same transaction), so between
//!    that last look and the delete no reader can be handed the object anew; a reader
//!    that got it before (a ReadPlan, a fetch in flight) has the whole grace. The mark
//!    is lifted a further grace after the delete, not at once: a settle retried under
//!    the same key (a settled object's key is its stream and first seq_num) may have
//!    fetched the object just before it went, and its refs, refused while the mark
//!    stands, must not land on a deleted object. Within that grace such a settle
//!    writes the object anew and lands its refs once the mark is lifted; if the
//!    auditor restarts meanwhile it deletes the object once more (it does not know it
//!    did), which costs the settle one more rewrite.
//!
//! Survives restarts: marks are durable and every pass starts from the store's listing
//! and the refs, so nothing is leaked and nothing is deleted before its grace. Its
//! backlog (the age of the oldest mark) is in [`AuditorStats`].
//!
//! Costs, and the limit of this design: a pass lists the whole store and reads every
//! ref, O(objects + chunks). Fine to millions of chunks; beyond, reference counts per
//! object kept with the refs are the next step (docs/decisions/0009).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use s3::ObjectStore;

use crate::control::{Clock, ControlPlane};
use crate::error::{Error, Result};
use crate::meta::RedbMetaStore;
use crate::settled::SettledKey;
use crate::transit::TransitKey;

/// When the auditor runs and how long dead objects stay readable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditorConfig {
    /// How long a dead object stays in the store after its mark (`auditor-read-grace`).
    pub read_grace: Duration,
    /// Time between passes (`auditor-interval-ms`).
    pub interval: Duration,
}

impl Default for AuditorConfig {
    fn default() -> Self {
        Self {
            read_grace: Duration::from_millis(tuning::AUDITOR_READ_GRACE.default),
            interval: Duration::from_millis(tuning::AUDITOR_INTERVAL_MS.default),
        }
    }
}

/// The auditor's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditorStats {
    pub passes: u64,
    pub refs_deleted: u64,
    pub objects_marked: u64,
    pub objects_deleted: u64,
    /// Objects marked dead and not yet deleted, after the last pass.
    pub dead_objects: u64,
    /// Age of the oldest of them (the backlog), in milliseconds.
    pub oldest_dead_age_ms: u64,
    /// The last pass's failure, if it failed (the next pass tries again).
    pub last_error: Option<String>,
}

/// The running auditor.
pub struct Auditor {
    stop: flume::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Auditor {
    /// Starts the auditor's thread. Blocking: call it from an ordinary thread.
    /// `stats` is where it keeps its counters (shared with whoever reports them).
    pub fn start(
        store: Arc<dyn ObjectStore>,
        control: ControlPlane<RedbMetaStore>,
        clock: Arc<dyn Clock>,
        config: AuditorConfig,
        stats: Arc<Mutex<AuditorStats>>,
    ) -> Result<Auditor> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::internal(format!("start the auditor's tokio runtime: {e}")))?;
        let (stop, stopped) = flume::bounded::<()>(1);
        let mut work = Work {
            store,
            control,
            clock,
            config,
            stats,
            suspects: HashMap::new(),
            deleted: HashMap::new(),
        };
        let thread = std::thread::Builder::new()
            .name("nova-auditor".into())
            .spawn(move || {
                runtime.block_on(async move {
                    loop {
                        tokio::select! {
                            _ = stopped.recv_async() => return,
                            () = tokio::time::sleep(work.config.interval) => {}
                        }
                        let outcome = work.pass().await;
                        let mut stats = lock(&work.stats);
                        stats.passes += 1;
                        stats.last_error = outcome.err().map(|e| e.to_string());
                    }
                });
            })
            .map_err(|e| Error::internal(format!("start the auditor thread: {e}")))?;
        Ok(Auditor { stop, thread: Some(thread) })
    }

    /// Stops after the pass in hand, and waits for the thread.
    pub fn stop(mut self) {
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A snapshot of shared counters.
pub fn snapshot(stats: &Mutex<AuditorStats>) -> AuditorStats {
    lock(stats).clone()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether nova wrote the object: a transit bundle or a settled object.
fn is_ours(key: &str) -> bool {
    TransitKey::parse(key).is_ok() || SettledKey::parse(key).is_ok()
}

/// The auditor thread's state.
struct Work {
    store: Arc<dyn ObjectStore>,
    control: ControlPlane<RedbMetaStore>,
    clock: Arc<dyn Clock>,
    config: AuditorConfig,
    stats: Arc<Mutex<AuditorStats>>,
    /// Objects seen unreferenced on the last pass (not yet marked), and when.
    suspects: HashMap<String, u64>,
    /// Marked objects this auditor deleted, and when: their marks are lifted a grace
    /// later.
    deleted: HashMap<String, u64>,
}

impl Work {
    async fn pass(&mut self) -> Result<()> {
        self.delete_unreadable_refs().await?;
        let referenced = self.referenced().await?;
        self.mark_unreferenced(&referenced).await?;
        self.sweep().await
    }

    /// Step 1: refs below a watermark, and every ref of a deleted stream.
    async fn delete_unreadable_refs(&self) -> Result<()> {
        let mut after = None;
        loop {
            let (records, next) = self.control.all_streams_page(after).await?;
            for record in records {
                let below = match record.deleted_at_ms {
                    Some(_) => u64::MAX,
                    None => record.trim_seq_num,
                };
                if below == 0 {
                    continue;
                }
                let doomed: Vec<u64> = self
                    .control
                    .refs_of(record.id)
                    .await?
                    .iter()
                    .filter(|r| r.end_seq_num() <= below)
                    .map(|r| r.first_seq_num)
                    .collect();
                if !doomed.is_empty() {
                    self.control.delete_refs(record.id, &doomed).await?;
                    lock(&self.stats).refs_deleted += doomed.len() as u64;
                }
            }
            match next {
                Some(id) => after = Some(id),
                None => return Ok(()),
            }
        }
    }

    /// Every object some ref names.
    async fn referenced(&self) -> Result<HashSet<String>> {
        let mut objects = HashSet::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let (refs, next) = self.control.refs_page(after.as_deref()).await?;
            objects.extend(refs.into_iter().map(|r| r.object));
            match next {
                Some(key) => after = Some(key),
                None => return Ok(objects),
            }
        }
    }

    /// Step 2: marks what was unreferenced on the last pass too, at least an interval ago.
    async fn mark_unreferenced(&mut self, referenced: &HashSet<String>) -> Result<()> {
        let now = self.clock.now_ms();
        let interval = u64::try_from(self.config.interval.as_millis()).unwrap_or(u64::MAX);
        let mut seen = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .store
                .list("", after.as_deref(), s3::LIST_PAGE_KEYS_MAX)
                .await
                .map_err(|e| Error::unavailable(format!("the object store listing ({e})")))?;
            for object in page.objects {
                if !is_ours(&object.key) || referenced.contains(&object.key) {
                    continue;
                }
                let first_seen = self.suspects.get(&object.key).copied().unwrap_or(now);
                if now.saturating_sub(first_seen) >= interval {
                    self.control.mark_dead(&object.key, now).await?;
                    lock(&self.stats).objects_marked += 1;
                } else {
                    seen.insert(object.key, first_seen);
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        self.suspects = seen;
        Ok(())
    }

    /// Step 3: deletes marked objects whose grace has passed and that no ref names.
    async fn sweep(&mut self) -> Result<()> {
        let now = self.clock.now_ms();
        let grace = u64::try_from(self.config.read_grace.as_millis()).unwrap_or(u64::MAX);
        let mut due = Vec::new();
        let (mut dead, mut oldest) = (0u64, None::<u64>);
        let mut after: Option<String> = None;
        loop {
            let (marks, more) = self.control.dead_page(after.as_deref()).await?;
            after = marks.last().map(|(object, _)| object.clone());
            for (object, marked_at) in marks {
                if let Some(&deleted_at) = self.deleted.get(&object) {
                    // Deleted already: its mark is lifted a grace later (not a backlog).
                    if now.saturating_sub(deleted_at) >= grace {
                        due.push(object);
                    }
                    continue;
                }
                if now.saturating_sub(marked_at) >= grace {
                    due.push(object);
                } else {
                    dead += 1;
                    oldest = Some(oldest.map_or(marked_at, |o| o.min(marked_at)));
                }
            }
            if !more {
                break;
            }
        }
        if !due.is_empty() {
            // New refs to a marked object are refused, so this look is the last word.
            let referenced = self.referenced().await?;
            for object in due {
                if self.deleted.remove(&object).is_some() {
                    // Deleted a grace ago: whatever fetched it before has let go.
                    self.control.unmark_dead(&object).await?;
                } else if referenced.contains(&object) {
                    // Referenced since it was marked (before the mark was durable).
                    self.control.unmark_dead(&object).await?;
                } else {
                    self.store
                        .delete(&object)
                        .await
                        .map_err(|e| Error::unavailable(format!("delete {object} ({e})")))?;
                    lock(&self.stats).objects_deleted += 1;
                    self.deleted.insert(object, now);
                }
            }
        }
        let mut stats = lock(&self.stats);
        stats.dead_objects = dead;
        stats.oldest_dead_age_ms = oldest.map_or(0, |o| now.saturating_sub(o));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use s3::{LocalDirStore, PutCondition};

    use super::*;
    use crate::ids::StreamId;
    use crate::meta::RedbMetaOptions;
    use crate::names::BucketName;

    /// A settled object left by a settle that crashed before its refs: marked, deleted a
    /// grace later, and its mark lifted only a grace after that, so a settle that fetched
    /// it just before the delete is still refused its refs.
    #[test]
    fn a_deleted_objects_mark_stands_a_grace_longer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalDirStore::open(dir.path().join("objects"), Default::default());
        let store: Arc<dyn ObjectStore> = Arc::new(store.expect("the store"));
        let meta = RedbMetaStore::open(dir.path().join("meta"), RedbMetaOptions::default());
        let meta = meta.expect("the metadata");
        let now = Arc::new(AtomicU64::new(0));
        let clock = {
            let now = Arc::clone(&now);
            move || now.load(Ordering::SeqCst)
        };
        let config =
            AuditorConfig { read_grace: Duration::from_secs(10), interval: Duration::from_secs(1) };
        let mut work = Work {
            store: Arc::clone(&store),
            control: ControlPlane::new(meta.clone()),
            clock: Arc::new(clock),
            config,
            stats: Arc::default(),
            suspects: HashMap::new(),
            deleted: HashMap::new(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let runtime = runtime.expect("a runtime");
        let bucket = BucketName::parse("apps").expect("a bucket name");
        let key = SettledKey { bucket, stream_id: StreamId([7; 16]), first_seq_num: 0 }.to_string();
        let put = store.put(&key, s3::Bytes::from_static(b"orphan"), PutCondition::CreateOnly);
        runtime.block_on(put).expect("put");
        let mut pass_at = |ms: u64| {
            now.store(ms, Ordering::SeqCst);
            runtime.block_on(work.pass()).expect("a pass");
            let (marks, _) = runtime.block_on(work.control.dead_page(None)).expect("marks");
            let present = runtime.block_on(store.head(&key)).expect("head").is_some();
            (marks.iter().any(|(object, _)| *object == key), present)
        };
        assert_eq!(pass_at(0), (false, true), "first seen unreferenced");
        assert_eq!(pass_at(1_000), (true, true), "marked an interval later");
        assert_eq!(pass_at(10_999), (true, true), "kept through the grace");
        assert_eq!(pass_at(11_000), (true, false), "deleted, still marked");
        assert_eq!(pass_at(20_999), (true, false), "the mark stands a grace longer");
        assert_eq!(pass_at(21_000), (false, false), "then it is lifted");
        drop(work);
        runtime.block_on(meta.close()).expect("close");
    }
}
