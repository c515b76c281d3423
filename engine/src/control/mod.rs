//! The control plane: buckets and streams, kept as rows in the metadata store.
//!
//! [`ControlPlane`] is the engine's API for every control verb of buckets.md and
//! retention.md (CreateBucket ... ListStreams, DeleteStream), for address resolution with
//! autocreate ([`ControlPlane::resolve`]), and for the stream state the engine's leader
//! changes (fencing token, trim watermark). Each verb is a few reads and one metadata
//! transaction; a transaction that loses a race re-reads and decides again, a bounded
//! number of times ([`ATTEMPTS_MAX`]).
//!
//! The rules it keeps (docs/decisions/0003-control-plane-rows.md):
//! - an address `(bucket, key)` is claimed by one compare-and-set on its address row, so
//!   racing creates make one stream; the stream's 16-byte ID is drawn from the OS and
//!   checked absent in the same transaction, so no ID is ever reused;
//! - a stream's options are its bucket's defaults with the request applied, copied once
//!   at creation;
//! - a create is checked against the bucket row's version, and DeleteBucket marks the row
//!   "deleting" before it looks for streams, so no interleaving leaves a stream in a
//!   deleted bucket;
//! - DeleteStream removes the address row and tombstones the stream row (kept, by ID, for
//!   reclamation) in one transaction, and leaves a marker so deleting again succeeds.
//!
//! Every method is async and does its I/O through the [`MetaStore`]; none blocks the
//! caller's thread. Time and ID randomness come from the [`Clock`] and [`IdSource`] seams.
//! This module never fences or drains a stream (the engine's leader does, then calls
//! [`ControlPlane::delete_stream`]), never reads a stream's records or tail, and never
//! reclaims what a deleted stream left behind.

mod keys;
mod rows;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::auth::TokenRecord;
use crate::error::{Error, Result};
use crate::ids::StreamId;
use crate::limits::{CREATION_TOKEN_BYTES_MAX, FENCING_TOKEN_BYTES_MAX, LIST_PAGE_MAX};
use crate::meta::{MetaError, MetaStore, Revision, Txn};
use crate::names::{BucketName, STREAM_KEY_BYTES_MAX, StreamKey};
use crate::options::{
    BucketConfig, BucketConfigRequest, StreamOptions, StreamOptionsPatch, StreamOptionsRequest,
};
pub use rows::RefRow;
use rows::{AddressRow, BucketId, BucketRow, BucketState, DeletedRow, StreamRow, StreamState};

/// Refs written per metadata transaction: under the store's operation cap
/// ([`crate::meta::TXN_OPS_MAX`]) and, at the longest object key, its byte cap.
pub const REFS_PER_TXN: usize = 100;
/// Distinct objects whose dead marks one refs transaction checks.
const DEAD_CHECKS_PER_TXN: usize = 20;
const _: () = assert!(REFS_PER_TXN + DEAD_CHECKS_PER_TXN <= crate::meta::TXN_OPS_MAX as usize);

/// How many times a verb re-reads and retries after its transaction lost a race before it
/// gives up with [`Error::Contended`]. A lost race means another writer made progress, so
/// a verb only runs out under sustained contention on the rows it needs.
pub const ATTEMPTS_MAX: u32 = 32;

/// Deleted markers removed per transaction when a bucket is deleted: each takes a check
/// and a delete, within the store's [`crate::meta::TXN_OPS_MAX`].
const SWEEP_MARKERS_PER_TXN: usize = 60;
const _: () = assert!(SWEEP_MARKERS_PER_TXN * 2 <= crate::meta::TXN_OPS_MAX as usize);
/// Pages of deleted markers a bucket deletion sweeps at most (a page is up to
/// [`LIST_PAGE_MAX`] markers). Markers left over are harmless: they name a bucket
/// incarnation that no longer exists.
const SWEEP_PAGES_MAX: u32 = 1000;

/// Wall-clock milliseconds, for `created_at_ms` and `deleted_at_ms`.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

impl<F: Fn() -> u64 + Send + Sync + 'static> Clock for F {
    fn now_ms(&self) -> u64 {
        self()
    }
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Where stream and bucket IDs come from. IDs must be unpredictable enough that two nodes
/// never draw the same one in practice; a collision is still detected and retried.
pub trait IdSource: Send + Sync + 'static {
    fn next_id(&self) -> Result<[u8; 16]>;
}

/// 16 random bytes from the operating system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsRandom;

impl IdSource for OsRandom {
    fn next_id(&self) -> Result<[u8; 16]> {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id)
            .map_err(|error| Error::unavailable(format!("os randomness ({error})")))?;
        Ok(id)
    }
}

/// A bucket as GetBucket returns it: every default concrete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketRecord {
    pub name: BucketName,
    /// Location, create flags and default stream configuration.
    pub config: BucketConfig,
    pub created_at_ms: u64,
}

/// A stream as GetStream returns it (less the tail, which is the engine's), with the state
/// the engine keeps in metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamRecord {
    pub bucket: BucketName,
    pub key: StreamKey,
    pub id: StreamId,
    pub created_at_ms: u64,
    pub options: StreamOptions,
    /// Empty: never set.
    pub fencing_token: String,
    /// Records below this are gone.
    pub trim_seq_num: u64,
    /// The tail's timestamp when the watermark last moved.
    pub trim_timestamp: u64,
    /// Reserved for leadership leases; 0.
    pub leader_epoch: u64,
    /// Set once the stream is deleted; only lookups by ID return deleted streams.
    pub deleted_at_ms: Option<u64>,
    /// The revision of the stream row's last write.
    pub version: Revision,
}

/// The outcome of a create: the record, and whether this call created it (`false`: a
/// retry converged on the existing one, or an autocreate joined the winner).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created<T> {
    pub record: T,
    pub created: bool,
}

/// The outcome of a DeleteStream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deleted {
    /// The deleted stream.
    pub id: StreamId,
    /// Whether the stream had been deleted before this call.
    pub already: bool,
}

/// One page of ListBuckets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BucketPage {
    pub buckets: Vec<BucketRecord>,
    /// The last name of this page when more follow (the next page's `start_after`);
    /// `None` on the last page.
    pub next: Option<BucketName>,
}

/// One page of ListStreams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamPage {
    pub streams: Vec<StreamRecord>,
    /// The last key of this page when more follow; `None` on the last page.
    pub next: Option<StreamKey>,
}

/// How a data-path verb reaches a stream, which decides whether a missing stream is
/// created (buckets.md, "Create on first use").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    /// Append: creates when the bucket has `create_stream_on_append`.
    Append,
    /// Read and subscribe: creates when the bucket has `create_stream_on_read`.
    Read,
    /// GetStream, CheckTail, Fence, Trim, ReadPlan: never creates.
    Observe,
}

/// The control plane over a metadata store. Cheap to clone; share one per node.
#[derive(Clone)]
pub struct ControlPlane<S> {
    store: S,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn IdSource>,
}

/// What an address leads to.
enum AtAddress {
    /// Boxed: a stream row is large beside the other variants.
    Live(Box<StreamRow>, Revision),
    Empty,
    /// The address changed between reading it and reading its stream: read again.
    Changed,
}

impl<S: MetaStore> ControlPlane<S> {
    /// A control plane with the system clock and OS randomness.
    pub fn new(store: S) -> Self {
        Self::with_seams(store, Arc::new(SystemClock), Arc::new(OsRandom))
    }

    /// A control plane with the given clock and ID source (tests make both deterministic).
    pub fn with_seams(store: S, clock: Arc<dyn Clock>, ids: Arc<dyn IdSource>) -> Self {
        Self { store, clock, ids }
    }

    /// The metadata store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    // ---- Buckets ------------------------------------------------------------------------

    /// CreateBucket. A taken name is [`Error::BucketAlreadyExists`], unless the request
    /// carries the creation token and the exact request the bucket was created with: then
    /// the existing record returns with `created: false`. An empty token is no token.
    pub async fn create_bucket(
        &self,
        name: &BucketName,
        request: &BucketConfigRequest,
        creation_token: Option<&str>,
    ) -> Result<Created<BucketRecord>> {
        let token = creation_token_of(creation_token)?;
        self.create_bucket_or(name, request, token, |existing| {
            token.is_some()
                && existing.creation_token.as_deref() == token
                && existing.creation_request == *request
        })
        .await
    }

    /// EnsureBucket: create-or-join. An existing bucket is returned as it is, whatever
    /// its configuration, with `created: false`.
    pub async fn ensure_bucket(
        &self,
        name: &BucketName,
        request: &BucketConfigRequest,
    ) -> Result<Created<BucketRecord>> {
        self.create_bucket_or(name, request, None, |_| true).await
    }

    async fn create_bucket_or(
        &self,
        name: &BucketName,
        request: &BucketConfigRequest,
        token: Option<&str>,
        joins: impl Fn(&BucketRow) -> bool,
    ) -> Result<Created<BucketRecord>> {
        let config = BucketConfig::from_request(request)?;
        let key = keys::bucket(name);
        for _ in 0..ATTEMPTS_MAX {
            if let Some((existing, _)) = self.read_bucket(name).await? {
                return if joins(&existing) {
                    Ok(Created { record: bucket_record(existing), created: false })
                } else {
                    Err(Error::bucket_already_exists(name))
                };
            }
            let row = BucketRow {
                name: name.clone(),
                bucket_id: self.ids.next_id()?,
                created_at_ms: self.clock.now_ms(),
                state: BucketState::Active,
                config: config.clone(),
                creation_token: token.map(str::to_owned),
                creation_request: request.clone(),
            };
            let txn = Txn::new().check_absent(key.clone()).put(key.clone(), row.encode());
            if committed(self.store.commit(txn).await)?.is_some() {
                return Ok(Created { record: bucket_record(row), created: true });
            }
        }
        Err(Error::Contended { op: "create bucket", attempts: ATTEMPTS_MAX })
    }

    /// GetBucket.
    pub async fn get_bucket(&self, name: &BucketName) -> Result<BucketRecord> {
        let (row, _) =
            self.read_bucket(name).await?.ok_or_else(|| Error::bucket_not_found(name))?;
        Ok(bucket_record(row))
    }

    /// UpdateBucket: replaces the caller-writable configuration. Defaults the request
    /// omits take the domain default, not the previous value. The flags act at once; the
    /// defaults govern streams created afterwards only (copy-at-create).
    pub async fn update_bucket(
        &self,
        name: &BucketName,
        request: &BucketConfigRequest,
    ) -> Result<BucketRecord> {
        let config = BucketConfig::from_request(request)?;
        let key = keys::bucket(name);
        for _ in 0..ATTEMPTS_MAX {
            let (row, version) =
                self.read_bucket(name).await?.ok_or_else(|| Error::bucket_not_found(name))?;
            if row.config == config {
                return Ok(bucket_record(row));
            }
            // The state is kept: a deletion in progress re-checks at the new version.
            let updated = BucketRow { config: config.clone(), ..row };
            let txn =
                Txn::new().check_version(key.clone(), version).put(key.clone(), updated.encode());
            if committed(self.store.commit(txn).await)?.is_some() {
                return Ok(bucket_record(updated));
            }
        }
        Err(Error::Contended { op: "update bucket", attempts: ATTEMPTS_MAX })
    }

    /// DeleteBucket: only when no stream lives in the bucket
    /// ([`Error::BucketNotEmpty`] otherwise).
    ///
    /// Atomic against concurrent creates: the bucket row is first marked
    /// "deleting", which changes its version, so a create that read the
    /// bucket before fails its version check and reads again; a create that sees the mark
    /// clears it in its own transaction (the create wins, and this deletion, finding the
    /// row changed, looks again and finds the stream). Only a row still at the version
    /// this call marked, after a scan that found no stream, is deleted.
    pub async fn delete_bucket(&self, name: &BucketName) -> Result<()> {
        let key = keys::bucket(name);
        for _ in 0..ATTEMPTS_MAX {
            let (row, version) =
                self.read_bucket(name).await?.ok_or_else(|| Error::bucket_not_found(name))?;
            // A row already marked (by a concurrent or crashed deletion) is taken over as
            // is: the mark, not who wrote it, is what keeps creates out.
            let marked = match row.state {
                BucketState::Deleting => version,
                BucketState::Active => {
                    let deleting = BucketRow { state: BucketState::Deleting, ..row.clone() };
                    let txn = Txn::new()
                        .check_version(key.clone(), version)
                        .put(key.clone(), deleting.encode());
                    match committed(self.store.commit(txn).await)? {
                        Some(marked) => marked,
                        None => continue,
                    }
                }
            };
            // Every create that committed before the mark is visible to this scan; every
            // later one changed the bucket row.
            let live = self.store.scan(&keys::addresses_of(name), None, 1).await?;
            if !live.entries.is_empty() {
                // Unmark, unless someone changed the row meanwhile (then it is theirs).
                let active = BucketRow { state: BucketState::Active, ..row };
                let txn =
                    Txn::new().check_version(key.clone(), marked).put(key.clone(), active.encode());
                committed(self.store.commit(txn).await)?;
                return Err(Error::bucket_not_empty(name));
            }
            let txn = Txn::new().check_version(key.clone(), marked).delete(key.clone());
            if committed(self.store.commit(txn).await)?.is_some() {
                self.sweep_deleted_markers(name, row.bucket_id).await;
                return Ok(());
            }
        }
        Err(Error::Contended { op: "delete bucket", attempts: ATTEMPTS_MAX })
    }

    /// Removes the deleted markers of a bucket incarnation that is gone. Best effort: the
    /// bucket is deleted already, and a marker left behind is never mistaken for the next
    /// bucket of the same name (it carries the old bucket's ID).
    async fn sweep_deleted_markers(&self, name: &BucketName, bucket_id: BucketId) {
        let prefix = keys::deleted_of(name);
        let mut after: Option<Vec<u8>> = None;
        for _ in 0..SWEEP_PAGES_MAX {
            let Ok(page) = self.store.scan(&prefix, after.as_deref(), LIST_PAGE_MAX).await else {
                return;
            };
            after = page.entries.last().map(|(key, _)| key.clone());
            let stale: Vec<_> = page
                .entries
                .into_iter()
                .filter(|(_, found)| {
                    DeletedRow::decode(&found.value).is_ok_and(|row| row.bucket_id == bucket_id)
                })
                .collect();
            for chunk in stale.chunks(SWEEP_MARKERS_PER_TXN) {
                let txn = chunk.iter().fold(Txn::new(), |txn, (key, found)| {
                    txn.check_version(key.clone(), found.version).delete(key.clone())
                });
                // A failure leaves harmless markers; the deletion itself has succeeded.
                let _ = self.store.commit(txn).await;
            }
            if !page.more {
                return;
            }
        }
    }

    /// ListBuckets: name order, at most `limit` (1 to 1000, default 1000) buckets after
    /// `start_after`.
    pub async fn list_buckets(
        &self,
        start_after: Option<&str>,
        limit: Option<u64>,
    ) -> Result<BucketPage> {
        let limit = page_limit(limit)?;
        let after = start_after.map(keys::buckets_after);
        let page = self.store.scan(keys::BUCKETS, after.as_deref(), limit).await?;
        let more = page.more;
        let mut buckets = Vec::with_capacity(page.entries.len());
        for (key, found) in page.entries {
            let row = BucketRow::decode(&found.value).map_err(|error| corrupt(&key, error))?;
            if keys::bucket_name_of(&key) != Some(row.name.as_str().as_bytes()) {
                return Err(corrupt(&key, format!("holds bucket {}", row.name)));
            }
            buckets.push(bucket_record(row));
        }
        let next = if more { buckets.last().map(|bucket| bucket.name.clone()) } else { None };
        Ok(BucketPage { buckets, next })
    }

    // ---- Streams ------------------------------------------------------------------------

    /// CreateStream: the bucket's defaults with the request applied (fields sent as 0 or
    /// omitted keep the default), claimed with one compare-and-set on the address.
    ///
    /// A taken address is [`Error::StreamAlreadyExists`], unless the request carries the
    /// creation token and the exact request the stream was created with: then the
    /// existing record returns with `created: false`. An empty token is no token.
    pub async fn create_stream(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        request: &StreamOptionsRequest,
        creation_token: Option<&str>,
    ) -> Result<Created<StreamRecord>> {
        let token = creation_token_of(creation_token)?;
        for _ in 0..ATTEMPTS_MAX {
            let (bucket_row, bucket_version) =
                self.read_bucket(bucket).await?.ok_or_else(|| Error::bucket_not_found(bucket))?;
            let options = bucket_row.config.defaults.with_request(request)?;
            match self.stream_at(bucket, key).await? {
                AtAddress::Live(existing, version) => {
                    let converges = token.is_some()
                        && existing.creation_token.as_deref() == token
                        && existing.creation_request == *request;
                    return if converges {
                        Ok(Created { record: stream_record(*existing, version), created: false })
                    } else {
                        Err(Error::stream_already_exists(bucket, key))
                    };
                }
                AtAddress::Changed => continue,
                AtAddress::Empty => {}
            }
            let claim = Claim { bucket_row, bucket_version, options, request, token };
            if let Some(record) = self.try_create(bucket, key, claim).await? {
                return Ok(Created { record, created: true });
            }
        }
        Err(Error::Contended { op: "create stream", attempts: ATTEMPTS_MAX })
    }

    /// Resolves an address for a data-path verb. A missing stream is created from the
    /// bucket's defaults when `door` and the bucket's flags allow it, exactly once under
    /// the address compare-and-set; a caller that loses the race joins the winner.
    /// `created` says whether this call created the stream.
    pub async fn resolve(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        door: Door,
    ) -> Result<Created<StreamRecord>> {
        self.resolve_admitting(bucket, key, door, &|_| Ok(())).await
    }

    /// [`ControlPlane::resolve`], where a stream it would create is first shown to
    /// `admit` with the options it would have: the verb's refusal on such a stream is
    /// this call's error, and nothing is created.
    pub async fn resolve_admitting(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        door: Door,
        admit: &(dyn Fn(&StreamOptions) -> Result<()> + Sync),
    ) -> Result<Created<StreamRecord>> {
        for _ in 0..ATTEMPTS_MAX {
            match self.stream_at(bucket, key).await? {
                AtAddress::Live(row, version) => {
                    return Ok(Created { record: stream_record(*row, version), created: false });
                }
                AtAddress::Changed => continue,
                AtAddress::Empty => {}
            }
            // Autocreate creates streams, never buckets.
            let (bucket_row, bucket_version) =
                self.read_bucket(bucket).await?.ok_or_else(|| Error::bucket_not_found(bucket))?;
            let creates = match door {
                Door::Append => bucket_row.config.create_stream_on_append,
                Door::Read => bucket_row.config.create_stream_on_read,
                Door::Observe => false,
            };
            if !creates {
                return Err(Error::stream_not_found(bucket, key));
            }
            let request = StreamOptionsRequest::default();
            let options = bucket_row.config.defaults.with_request(&request)?;
            admit(&options)?;
            let claim =
                Claim { bucket_row, bucket_version, options, request: &request, token: None };
            if let Some(record) = self.try_create(bucket, key, claim).await? {
                return Ok(Created { record, created: true });
            }
        }
        Err(Error::Contended { op: "resolve stream", attempts: ATTEMPTS_MAX })
    }

    /// GetStream: the live stream at the address. Never creates.
    pub async fn get_stream(&self, bucket: &BucketName, key: &StreamKey) -> Result<StreamRecord> {
        Ok(self.resolve(bucket, key, Door::Observe).await?.record)
    }

    /// The stream with this ID, live or deleted, if it ever existed.
    pub async fn stream_by_id(&self, id: StreamId) -> Result<Option<StreamRecord>> {
        Ok(self.read_stream(id).await?.map(|(row, version)| stream_record(row, version)))
    }

    /// One attempt at creating the stream: `None` when the transaction lost a race (the
    /// bucket changed, the address was taken, or the drawn ID exists), so the caller reads
    /// again.
    async fn try_create(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        claim: Claim<'_>,
    ) -> Result<Option<StreamRecord>> {
        let id = StreamId(self.ids.next_id()?);
        let row = StreamRow {
            id,
            bucket: bucket.clone(),
            bucket_id: claim.bucket_row.bucket_id,
            key: key.clone(),
            created_at_ms: self.clock.now_ms(),
            options: claim.options,
            creation_token: claim.token.map(str::to_owned),
            creation_request: *claim.request,
            fencing_token: String::new(),
            trim_seq_num: 0,
            trim_timestamp: 0,
            leader_epoch: 0,
            state: StreamState::Live,
            deleted_at_ms: 0,
        };
        let bucket_key = keys::bucket(bucket);
        let address_key = keys::address(bucket, key);
        let stream_key = keys::stream(&id);
        let mut txn = Txn::new()
            .check_version(bucket_key.clone(), claim.bucket_version)
            .check_absent(address_key.clone())
            // IDs are random; this makes a collision a retry instead of a reuse.
            .check_absent(stream_key.clone());
        if claim.bucket_row.state == BucketState::Deleting {
            // The create wins over a deletion in progress: clearing the mark changes the
            // bucket row, so the deleter's final check fails and it looks again.
            let active = BucketRow { state: BucketState::Active, ..claim.bucket_row };
            txn = txn.put(bucket_key, active.encode());
        }
        let txn = txn
            .put(address_key, AddressRow { id }.encode())
            .put(stream_key, row.encode())
            // A marker of an earlier stream here is superseded: deleting the address now
            // deletes this stream.
            .delete(keys::deleted(bucket, key));
        Ok(committed(self.store.commit(txn).await)?.map(|revision| stream_record(row, revision)))
    }

    /// ReconfigureStream: the patch's present fields are set (a present 0 sets a bound to
    /// unbounded); options fixed at creation are refused.
    pub async fn reconfigure_stream(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        patch: &StreamOptionsPatch,
    ) -> Result<StreamRecord> {
        for _ in 0..ATTEMPTS_MAX {
            let (row, version) = match self.stream_at(bucket, key).await? {
                AtAddress::Live(row, version) => (*row, version),
                AtAddress::Changed => continue,
                AtAddress::Empty => return Err(self.missing(bucket, key).await),
            };
            let options = row.options.with_patch(patch)?;
            if options == row.options {
                return Ok(stream_record(row, version));
            }
            let updated = StreamRow { options, ..row };
            if let Some(record) = self.replace_stream(updated, version).await? {
                return Ok(record);
            }
        }
        Err(Error::Contended { op: "reconfigure stream", attempts: ATTEMPTS_MAX })
    }

    /// DeleteStream, called by the stream's leader after it fenced the stream and drained
    /// its writers: removes the address and tombstones the stream row, in one transaction.
    ///
    /// With `expected`, deletes only that stream (the one the leader fenced), never a
    /// newer stream at the same address. Deleting a deleted stream succeeds
    /// (`already: true`); an address that never held a stream in this bucket is
    /// [`Error::StreamNotFound`].
    pub async fn delete_stream(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        expected: Option<StreamId>,
    ) -> Result<Deleted> {
        for _ in 0..ATTEMPTS_MAX {
            let (row, version) = match expected {
                None => match self.stream_at(bucket, key).await? {
                    AtAddress::Live(row, version) => (*row, version),
                    AtAddress::Changed => continue,
                    AtAddress::Empty => return self.deleted_before(bucket, key).await,
                },
                Some(id) => {
                    let (row, version) =
                        self.read_stream(id).await?.ok_or(Error::StreamIdNotFound { id })?;
                    if row.bucket != *bucket || row.key != *key {
                        return Err(Error::internal(format!(
                            "stream {id} lives at {}/{}, not {bucket}/{key}",
                            row.bucket, row.key
                        )));
                    }
                    if !row.is_live() {
                        return Ok(Deleted { id, already: true });
                    }
                    (row, version)
                }
            };
            let id = row.id;
            let now = self.clock.now_ms();
            let marker = DeletedRow { id, bucket_id: row.bucket_id, deleted_at_ms: now };
            let tombstone = StreamRow { state: StreamState::Deleted, deleted_at_ms: now, ..row };
            let address_key = keys::address(bucket, key);
            let stream_key = keys::stream(&id);
            // The stream row must be as read (a concurrent fence or trim makes this read
            // again). That alone implies the address still leads here, since only a
            // deletion moves a live stream's address; the address is checked anyway so the
            // transaction stands on its own under any store.
            let txn = Txn::new()
                .check_value(address_key.clone(), AddressRow { id }.encode())
                .check_version(stream_key.clone(), version)
                .delete(address_key)
                .put(stream_key, tombstone.encode())
                .put(keys::deleted(bucket, key), marker.encode());
            if committed(self.store.commit(txn).await)?.is_some() {
                return Ok(Deleted { id, already: false });
            }
        }
        Err(Error::Contended { op: "delete stream", attempts: ATTEMPTS_MAX })
    }

    /// An empty address: success if its last stream was deleted in this incarnation of
    /// the bucket, else not found.
    /// Whether a stream was deleted at this address and none lives there since: the
    /// answer a DeleteStream of an empty address gives (success for a deleted stream,
    /// [`Error::StreamNotFound`] for an address that never held one). Deletes nothing.
    pub async fn deleted_before(&self, bucket: &BucketName, key: &StreamKey) -> Result<Deleted> {
        let (bucket_row, _) =
            self.read_bucket(bucket).await?.ok_or_else(|| Error::bucket_not_found(bucket))?;
        let marker_key = keys::deleted(bucket, key);
        let Some(found) = self.store.get(&marker_key).await? else {
            return Err(Error::stream_not_found(bucket, key));
        };
        let marker =
            DeletedRow::decode(&found.value).map_err(|error| corrupt(&marker_key, error))?;
        if marker.bucket_id != bucket_row.bucket_id {
            return Err(Error::stream_not_found(bucket, key));
        }
        Ok(Deleted { id: marker.id, already: true })
    }

    /// ListStreams: key order, keys starting with `prefix` (bytewise; keys are opaque),
    /// at most `limit` (1 to 1000, default 1000) after `start_after`.
    pub async fn list_streams(
        &self,
        bucket: &BucketName,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<u64>,
    ) -> Result<StreamPage> {
        let limit = page_limit(limit)?;
        if self.read_bucket(bucket).await?.is_none() {
            return Err(Error::bucket_not_found(bucket));
        }
        if prefix.len() > STREAM_KEY_BYTES_MAX {
            // No key is that long.
            return Ok(StreamPage::default());
        }
        let addresses = keys::addresses_of(bucket);
        let mut scan_prefix = addresses.clone();
        scan_prefix.extend_from_slice(prefix.as_bytes());
        let after = start_after.map(|after| keys::addresses_after(bucket, after));
        let page = self.store.scan(&scan_prefix, after.as_deref(), limit).await?;
        let mut ids = Vec::with_capacity(page.entries.len());
        for (key, found) in &page.entries {
            let address = AddressRow::decode(&found.value).map_err(|error| corrupt(key, error))?;
            ids.push(address.id);
        }
        let rows = join_all(ids.iter().map(|id| self.read_stream(*id)).collect()).await;
        let mut streams = Vec::with_capacity(rows.len());
        for ((key, _), row) in page.entries.iter().zip(rows) {
            let Some((row, version)) = row? else {
                return Err(corrupt(key, "leads to a stream row that does not exist"));
            };
            // Deleted after the scan: it is gone.
            if row.is_live() {
                streams.push(stream_record(row, version));
            }
        }
        let next = match page.entries.last() {
            Some((key, _)) if page.more => {
                let stream_key = keys::stream_key_of(key, &addresses)
                    .and_then(|bytes| StreamKey::from_bytes(bytes).ok())
                    .ok_or_else(|| corrupt(key, "is not an address of this bucket"))?;
                Some(stream_key)
            }
            _ => None,
        };
        Ok(StreamPage { streams, next })
    }

    // ---- Stream state, for the engine's leader --------------------------------------------

    /// Sets the stream's fencing token (Fence). With `expected`, only if the current
    /// token equals it ([`Error::FencingTokenMismatch`] otherwise).
    pub async fn set_fencing_token(
        &self,
        id: StreamId,
        expected: Option<&str>,
        fencing_token: &str,
    ) -> Result<StreamRecord> {
        check_fence_tokens(fencing_token, expected)?;
        for _ in 0..ATTEMPTS_MAX {
            let (row, version) = self.live_stream(id).await?;
            if let Some(expected) = expected
                && expected != row.fencing_token
            {
                return Err(Error::FencingTokenMismatch {
                    field: "expected",
                    current: row.fencing_token,
                });
            }
            if row.fencing_token == fencing_token {
                return Ok(stream_record(row, version));
            }
            let updated = StreamRow { fencing_token: fencing_token.to_owned(), ..row };
            if let Some(record) = self.replace_stream(updated, version).await? {
                return Ok(record);
            }
        }
        Err(Error::Contended { op: "set fencing token", attempts: ATTEMPTS_MAX })
    }

    /// Moves the trim watermark forward to `trim_seq_num`, with `tail_timestamp`, the
    /// stream's tail timestamp now (kept for a stream trimmed to its tail: no chunk is
    /// left to tell it after a restart); a lower or equal watermark leaves both where
    /// they are. The record carries the watermark now in force.
    pub async fn set_trim_seq_num(
        &self,
        id: StreamId,
        trim_seq_num: u64,
        tail_timestamp: u64,
    ) -> Result<StreamRecord> {
        for _ in 0..ATTEMPTS_MAX {
            let (row, version) = self.live_stream(id).await?;
            if trim_seq_num <= row.trim_seq_num {
                return Ok(stream_record(row, version));
            }
            let trim_timestamp = tail_timestamp.max(row.trim_timestamp);
            let updated = StreamRow { trim_seq_num, trim_timestamp, ..row };
            if let Some(record) = self.replace_stream(updated, version).await? {
                return Ok(record);
            }
        }
        Err(Error::Contended { op: "set trim seq_num", attempts: ATTEMPTS_MAX })
    }

    // ---- Refs: where each durable chunk is in the object store --------------------------

    /// Makes `refs` durable (new ones, or settled locations replacing transit ones under
    /// the same key). Each transaction of [`REFS_PER_TXN`] is atomic; the call returns
    /// once all are durable. A ref names one chunk, so a reader sees either location of
    /// a chunk, never a gap, whichever transactions have applied.
    ///
    /// Each transaction also requires that no object it names is marked dead: once the
    /// auditor has marked an object, no new ref can name it, so the auditor may delete
    /// it after checking the refs once more (`ObjectDead` otherwise: write it anew).
    pub async fn put_refs(&self, refs: &[RefRow]) -> Result<()> {
        let mut rest = refs;
        while !rest.is_empty() {
            // At most REFS_PER_TXN refs and DEAD_CHECKS_PER_TXN distinct objects.
            let mut objects: Vec<&str> = Vec::new();
            let mut taken = 0;
            for row in rest.iter().take(REFS_PER_TXN) {
                if !objects.contains(&row.object.as_str()) {
                    if objects.len() == DEAD_CHECKS_PER_TXN {
                        break;
                    }
                    objects.push(&row.object);
                }
                taken += 1;
            }
            let (part, after) = rest.split_at(taken);
            let txn =
                objects.iter().fold(Txn::new(), |txn, object| txn.check_absent(keys::dead(object)));
            let txn = part.iter().fold(txn, |txn, row| {
                txn.put(keys::chunk_ref(&row.id, row.first_seq_num), row.encode())
            });
            match self.store.commit(txn).await {
                Ok(_) => {}
                Err(MetaError::Conflict { .. }) => {
                    return Err(Error::ObjectDead { objects: objects.join(", ") });
                }
                Err(error) => return Err(error.into()),
            }
            rest = after;
        }
        Ok(())
    }

    /// Marks `object` dead at `at_ms` unless it is marked already; returns the time of
    /// its mark.
    pub async fn mark_dead(&self, object: &str, at_ms: u64) -> Result<u64> {
        let key = keys::dead(object);
        if let Some(found) = self.store.get(&key).await? {
            return dead_mark_time(&key, &found.value);
        }
        match self
            .store
            .commit(
                Txn::new().check_absent(key.clone()).put(key.clone(), at_ms.to_le_bytes().to_vec()),
            )
            .await
        {
            Ok(_) => Ok(at_ms),
            Err(MetaError::Conflict { .. }) => match self.store.get(&key).await? {
                Some(found) => dead_mark_time(&key, &found.value),
                None => Err(Error::Contended { op: "mark an object dead", attempts: 1 }),
            },
            Err(error) => Err(error.into()),
        }
    }

    /// Removes the dead mark of `object` (deleted, or referenced again).
    pub async fn unmark_dead(&self, object: &str) -> Result<()> {
        self.store.commit(Txn::new().delete(keys::dead(object))).await?;
        Ok(())
    }

    /// One page of dead marks after `after`: (object, marked at).
    pub async fn dead_page(&self, after: Option<&str>) -> Result<(Vec<(String, u64)>, bool)> {
        let start = after.map(keys::dead);
        let page =
            self.store.scan(keys::DEAD, start.as_deref(), crate::meta::SCAN_ENTRIES_MAX).await?;
        let mut marks = Vec::with_capacity(page.entries.len());
        for (key, found) in &page.entries {
            let object = std::str::from_utf8(&key[keys::DEAD.len()..])
                .map_err(|_| corrupt(key, "object key is not UTF-8"))?;
            marks.push((object.to_owned(), dead_mark_time(key, &found.value)?));
        }
        Ok((marks, page.more))
    }

    /// One page of refs of every stream after the ref key `after` (the auditor's sweep).
    pub async fn refs_page(&self, after: Option<&[u8]>) -> Result<(Vec<RefRow>, Option<Vec<u8>>)> {
        let page = self.store.scan(keys::REFS, after, crate::meta::SCAN_ENTRIES_MAX).await?;
        let mut refs = Vec::with_capacity(page.entries.len());
        for (key, found) in &page.entries {
            refs.push(RefRow::decode(&found.value).map_err(|error| corrupt(key, error))?);
        }
        let next = if page.more { page.entries.last().map(|(key, _)| key.clone()) } else { None };
        Ok((refs, next))
    }

    /// One page of every stream row, live or deleted, after `after`, in ID order.
    pub async fn all_streams_page(
        &self,
        after: Option<StreamId>,
    ) -> Result<(Vec<StreamRecord>, Option<StreamId>)> {
        let start = after.map(|id| keys::stream(&id));
        let page =
            self.store.scan(keys::STREAMS, start.as_deref(), crate::meta::SCAN_ENTRIES_MAX).await?;
        let mut records = Vec::with_capacity(page.entries.len());
        for (key, found) in page.entries {
            let row = StreamRow::decode(&found.value).map_err(|error| corrupt(&key, error))?;
            records.push(stream_record(row, found.version));
        }
        let next = if page.more { records.last().map(|r| r.id) } else { None };
        Ok((records, next))
    }

    /// Every ref of the stream, in sequence order.
    pub async fn refs_of(&self, id: StreamId) -> Result<Vec<RefRow>> {
        let prefix = keys::refs_of(&id);
        let mut refs = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page =
                self.store.scan(&prefix, after.as_deref(), crate::meta::SCAN_ENTRIES_MAX).await?;
            for (key, found) in &page.entries {
                let row = RefRow::decode(&found.value).map_err(|error| corrupt(key, error))?;
                if *key != keys::chunk_ref(&id, row.first_seq_num) {
                    return Err(corrupt(
                        key,
                        format!("holds stream {} seq {}", row.id, row.first_seq_num),
                    ));
                }
                refs.push(row);
            }
            match page.entries.last() {
                Some((key, _)) if page.more => after = Some(key.clone()),
                _ => return Ok(refs),
            }
        }
    }

    /// Removes the refs of the stream's chunks that start at these sequence numbers.
    pub async fn delete_refs(&self, id: StreamId, first_seq_nums: &[u64]) -> Result<()> {
        for part in first_seq_nums.chunks(REFS_PER_TXN) {
            let txn =
                part.iter().fold(Txn::new(), |txn, seq| txn.delete(keys::chunk_ref(&id, *seq)));
            self.store.commit(txn).await?;
        }
        Ok(())
    }

    // ---- Tokens (spec/auth.md) -----------------------------------------------------------

    /// Stores a newly issued token. Its ID is drawn at random by the issuer; one already
    /// taken is [`Error::Contended`], and the issuer draws again.
    pub async fn put_token(&self, token: &TokenRecord) -> Result<()> {
        let key = keys::token(&token.id);
        match self
            .store
            .commit(Txn::new().check_absent(key.clone()).put(key, rows::encode_token(token)))
            .await
        {
            Ok(_) => Ok(()),
            Err(MetaError::Conflict { .. }) => {
                Err(Error::Contended { op: "issue a token", attempts: 1 })
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Revokes a token; false when no token has the ID.
    pub async fn delete_token(&self, id: &str) -> Result<bool> {
        let key = keys::token(id);
        let Some(found) = self.store.get(&key).await? else {
            return Ok(false);
        };
        // A token row is never rewritten, so a lost race is a revocation that came first.
        match self
            .store
            .commit(Txn::new().check_version(key.clone(), found.version).delete(key))
            .await
        {
            Ok(_) => Ok(true),
            Err(MetaError::Conflict { .. }) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// One page of tokens after the ID `after`, in ID order, and whether more follow.
    pub async fn tokens_page(&self, after: Option<&str>) -> Result<(Vec<TokenRecord>, bool)> {
        let start = after.map(keys::token);
        let page =
            self.store.scan(keys::TOKENS, start.as_deref(), crate::meta::SCAN_ENTRIES_MAX).await?;
        let mut tokens = Vec::with_capacity(page.entries.len());
        for (key, found) in &page.entries {
            let token = rows::decode_token(&found.value).map_err(|error| corrupt(key, error))?;
            if key[keys::TOKENS.len()..] != *token.id.as_bytes() {
                return Err(corrupt(key, format!("holds token {}", token.id)));
            }
            tokens.push(token);
        }
        Ok((tokens, page.more))
    }

    // ---- Reads and writes of rows --------------------------------------------------------

    async fn read_bucket(&self, name: &BucketName) -> Result<Option<(BucketRow, Revision)>> {
        let key = keys::bucket(name);
        let Some(found) = self.store.get(&key).await? else {
            return Ok(None);
        };
        let row = BucketRow::decode(&found.value).map_err(|error| corrupt(&key, error))?;
        if row.name != *name {
            return Err(corrupt(&key, format!("holds bucket {}", row.name)));
        }
        Ok(Some((row, found.version)))
    }

    async fn read_stream(&self, id: StreamId) -> Result<Option<(StreamRow, Revision)>> {
        let key = keys::stream(&id);
        let Some(found) = self.store.get(&key).await? else {
            return Ok(None);
        };
        let row = StreamRow::decode(&found.value).map_err(|error| corrupt(&key, error))?;
        if row.id != id {
            return Err(corrupt(&key, format!("holds stream {}", row.id)));
        }
        Ok(Some((row, found.version)))
    }

    /// The live stream with this ID.
    async fn live_stream(&self, id: StreamId) -> Result<(StreamRow, Revision)> {
        let (row, version) = self.read_stream(id).await?.ok_or(Error::StreamIdNotFound { id })?;
        if !row.is_live() {
            return Err(Error::stream_not_found(&row.bucket, &row.key));
        }
        Ok((row, version))
    }

    async fn stream_at(&self, bucket: &BucketName, key: &StreamKey) -> Result<AtAddress> {
        let address_key = keys::address(bucket, key);
        let Some(found) = self.store.get(&address_key).await? else {
            return Ok(AtAddress::Empty);
        };
        let id = AddressRow::decode(&found.value).map_err(|error| corrupt(&address_key, error))?.id;
        // Stream rows are never removed, only tombstoned.
        let (row, version) = self
            .read_stream(id)
            .await?
            .ok_or_else(|| corrupt(&address_key, "leads to a stream row that does not exist"))?;
        if !row.is_live() {
            // Deleted between the two reads, in which case the deletion removed the
            // address too (IDs are never reused, so it cannot lead here again); if it
            // still leads here, the rows disagree.
            let again = self.store.get(&address_key).await?;
            if again.is_some_and(|again| again.value == found.value) {
                return Err(corrupt(&address_key, format!("leads to deleted stream {id}")));
            }
            return Ok(AtAddress::Changed);
        }
        if row.bucket != *bucket || row.key != *key {
            return Err(corrupt(&address_key, format!("leads to {}/{}", row.bucket, row.key)));
        }
        Ok(AtAddress::Live(Box::new(row), version))
    }

    /// Why an address has no stream: the bucket or the stream is missing.
    async fn missing(&self, bucket: &BucketName, key: &StreamKey) -> Error {
        match self.read_bucket(bucket).await {
            Ok(Some(_)) => Error::stream_not_found(bucket, key),
            Ok(None) => Error::bucket_not_found(bucket),
            Err(error) => error,
        }
    }

    /// Writes `row` if its stream row is still at `version`; `None` if it is not.
    async fn replace_stream(
        &self,
        row: StreamRow,
        version: Revision,
    ) -> Result<Option<StreamRecord>> {
        let key = keys::stream(&row.id);
        let txn = Txn::new().check_version(key.clone(), version).put(key, row.encode());
        Ok(committed(self.store.commit(txn).await)?.map(|revision| stream_record(row, revision)))
    }
}

/// What a create claims an address with.
struct Claim<'a> {
    bucket_row: BucketRow,
    bucket_version: Revision,
    options: StreamOptions,
    request: &'a StreamOptionsRequest,
    token: Option<&'a str>,
}

/// A commit's revision, `None` when a check failed (the caller reads again), or the error.
fn committed(result: Result<Revision, MetaError>) -> Result<Option<Revision>> {
    match result {
        Ok(revision) => Ok(Some(revision)),
        Err(MetaError::Conflict { .. }) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

fn dead_mark_time(key: &[u8], value: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] =
        value.try_into().map_err(|_| corrupt(key, format!("{} bytes, not 8", value.len())))?;
    Ok(u64::from_le_bytes(bytes))
}

fn corrupt(key: &[u8], reason: impl std::fmt::Display) -> Error {
    Error::Meta(MetaError::Corrupt {
        message: format!("control row \"{}\": {reason}", key.escape_ascii()),
    })
}

/// A creation token within its limit; an empty token is no token.
fn creation_token_of(token: Option<&str>) -> Result<Option<&str>> {
    match token {
        Some(token) if token.len() > CREATION_TOKEN_BYTES_MAX => {
            Err(Error::CreationTokenTooLong { len: token.len(), limit: CREATION_TOKEN_BYTES_MAX })
        }
        Some("") | None => Ok(None),
        Some(token) => Ok(Some(token)),
    }
}

/// A list page's limit: 1 to [`LIST_PAGE_MAX`], that when omitted.
fn page_limit(limit: Option<u64>) -> Result<u32> {
    match limit {
        None => Ok(LIST_PAGE_MAX),
        Some(limit) => u32::try_from(limit)
            .ok()
            .filter(|limit| (1..=LIST_PAGE_MAX).contains(limit))
            .ok_or(Error::ListLimitOutOfRange { limit, max: LIST_PAGE_MAX }),
    }
}

fn bucket_record(row: BucketRow) -> BucketRecord {
    BucketRecord { name: row.name, config: row.config, created_at_ms: row.created_at_ms }
}

/// A Fence's tokens within the limit (limits.md: 36 bytes), the new one and the one
/// expected: checked before either is compared with the stream's (decisions.md: limits
/// first).
pub(crate) fn check_fence_tokens(fencing_token: &str, expected: Option<&str>) -> Result<()> {
    for (field, token) in [("fencing_token", Some(fencing_token)), ("expected", expected)] {
        if let Some(token) = token
            && token.len() > FENCING_TOKEN_BYTES_MAX
        {
            return Err(Error::FencingTokenTooLong {
                field,
                len: token.len(),
                limit: FENCING_TOKEN_BYTES_MAX,
            });
        }
    }
    Ok(())
}

fn stream_record(row: StreamRow, version: Revision) -> StreamRecord {
    StreamRecord {
        bucket: row.bucket,
        key: row.key,
        id: row.id,
        created_at_ms: row.created_at_ms,
        options: row.options,
        fencing_token: row.fencing_token,
        trim_seq_num: row.trim_seq_num,
        trim_timestamp: row.trim_timestamp,
        leader_epoch: row.leader_epoch,
        deleted_at_ms: (row.state == StreamState::Deleted).then_some(row.deleted_at_ms),
        version,
    }
}

/// Awaits every future, polling the pending ones whenever woken, so that their requests
/// are in flight together (the store answers them in one batch).
fn join_all<F: Future>(futures: Vec<F>) -> JoinAll<F> {
    let outputs = futures.iter().map(|_| None).collect();
    JoinAll { futures: futures.into_iter().map(Box::pin).collect(), outputs }
}

struct JoinAll<F: Future> {
    futures: Vec<Pin<Box<F>>>,
    outputs: Vec<Option<F::Output>>,
}

// Nothing is pinned in place: the futures are boxed.
impl<F: Future> Unpin for JoinAll<F> {}

impl<F: Future> Future for JoinAll<F> {
    type Output = Vec<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut pending = false;
        for (future, output) in this.futures.iter_mut().zip(this.outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(this.outputs.iter_mut().filter_map(Option::take).collect())
    }
}
