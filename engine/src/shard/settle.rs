//! The settling duty: each shard rewrites its streams' history from transit bundles into
//! per-stream settled objects (`settled.rs`), so that a stream's history becomes a few
//! large objects of its own, and the bundles (shared by many streams) can be reclaimed.
//!
//! For one stream, a settle takes the run of durable chunks that starts at its first
//! chunk still in a transit bundle and continues, contiguous, through chunks in transit
//! bundles, up to the target size (`settle-target-bytes`). It settles the run once it
//! reaches the target, or once its oldest bundle is `settle-age-ms` old. Then:
//!
//! 1. each chunk's slot is fetched with one ranged GET and verified;
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
//! (retention issue) reclaims what no ref names.
//!
//! Never here: a chunk that is not yet in the object store (journal only), a change to
//! a stream's records or numbering, or an error that stops the shard (a failed settle is
//! counted and tried again at the next tick).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::control::RefRow;
use crate::error::{Error, Result};
use crate::names::BucketName;
use crate::settled::SettledBuilder;
use crate::transit::TransitKey;

use super::{ObjectSlot, Shard, Slot, Stored};

/// When and how big to settle (`tuning`: settle-*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SettleConfig {
    pub target_bytes: u64,
    pub age: Duration,
    pub interval: Duration,
}

impl Default for SettleConfig {
    fn default() -> Self {
        Self {
            target_bytes: tuning::SETTLE_TARGET_BYTES.default,
            age: Duration::from_millis(tuning::SETTLE_AGE_MS.default),
            interval: Duration::from_millis(tuning::SETTLE_INTERVAL_MS.default),
        }
    }
}

/// One chunk of a run to settle: where its slot is now.
struct Settling {
    first_seq_num: u64,
    data_len: u32,
    slot: Rc<ObjectSlot>,
}

impl Shard {
    /// The settling duty. Runs until the shard closes.
    pub(crate) async fn settler(self: Rc<Self>) {
        loop {
            glommio::timer::sleep(self.config.settle.interval).await;
            if self.closing.get() || self.failed.borrow().is_some() {
                return;
            }
            let slots: Vec<Rc<Slot>> = self.streams.borrow().values().cloned().collect();
            for slot in slots {
                let Some(run) = self.run_to_settle(&slot) else { continue };
                match self.settle_run(&slot, run).await {
                    Ok(()) => self.count(|s| s.settled_objects += 1),
                    Err(_) => self.count(|s| s.settle_failures += 1),
                }
                if self.closing.get() {
                    return;
                }
            }
        }
    }

    /// The stream's run of transit chunks to settle now, if there is one.
    fn run_to_settle(&self, slot: &Slot) -> Option<Vec<Settling>> {
        let leader = slot.leader.borrow();
        if leader.is_deleted() {
            return None;
        }
        let mut run = Vec::new();
        let (mut bytes, mut oldest) = (0u64, u64::MAX);
        for chunk in leader.durable_chunks() {
            let in_transit = match &chunk.location {
                Stored::Object(object) => TransitKey::parse(&object.key).ok().map(|k| (object, k)),
                Stored::Journal(_) => None,
            };
            let Some((object, key)) = in_transit else {
                if run.is_empty() {
                    continue; // settled already: the run starts further on
                }
                break;
            };
            if bytes >= self.config.settle.target_bytes {
                break;
            }
            bytes += object.length;
            oldest = oldest.min(key.written_at_ms);
            run.push(Settling {
                first_seq_num: chunk.first_seq_num,
                data_len: chunk.data_len,
                slot: Rc::clone(object),
            });
        }
        let age = u64::try_from(self.config.settle.age.as_millis()).unwrap_or(u64::MAX);
        let due =
            bytes >= self.config.settle.target_bytes || self.now_ms().saturating_sub(oldest) >= age;
        (!run.is_empty() && due).then_some(run)
    }

    /// Settles one run: fetch, lay out, PUT, rewrite refs, relocate.
    async fn settle_run(&self, slot: &Slot, run: Vec<Settling>) -> Result<()> {
        let id = slot.leader.borrow().id();
        let bucket = BucketName::parse(&slot.bucket)
            .map_err(|e| Error::internal(format!("stream's bucket {:?}: {e}", slot.bucket)))?;
        let mut slots = Vec::with_capacity(run.len());
        for chunk in &run {
            let range = chunk.slot.offset..chunk.slot.offset + chunk.slot.length;
            slots.push(self.uploader.read_slot(Arc::clone(&chunk.slot.key), range).await?);
        }
        let mut builder = SettledBuilder::new(id, run[0].first_seq_num);
        for bytes in &slots {
            builder.push(bytes).map_err(|refused| {
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
