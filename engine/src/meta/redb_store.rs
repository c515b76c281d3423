//! The embedded metadata store: one redb database file, owned by one dedicated OS thread.
//!
//! Callers hold a cloneable [`RedbMetaStore`] handle. Each request goes to the store thread
//! over one bounded flume channel and its reply comes back over a one-slot flume channel.
//! The thread serves requests in batches: it answers the batch's reads from a snapshot of
//! the committed state, then applies the batch's transactions in arrival order inside one
//! redb write transaction, each checked against the state the earlier ones left (a failed
//! one applies nothing), commits it with one fsync (group commit), and only then replies.
//! A reply to a mutation therefore means the mutation is on disk.
//!
//! This module owns the database file and its thread. It never runs on a shard's reactor
//! thread and never blocks one: the only blocking calls on a caller's thread are
//! [`RedbMetaStore::open`] (at start) and the join when the last handle drops (instant
//! after [`RedbMetaStore::close`]).
//!
//! # Layout of `<dir>/meta.redb`
//!
//! ```text
//! table "kv":  key bytes -> +----------------------+----------------------+
//!                           | version: u64 LE (8)  | value bytes (0..)    |
//!                           +----------------------+----------------------+
//!                           VERSION = 0, VALUE = VERSION + size_of::<u64>()
//! table "sys": "format"   -> FORMAT_VERSION (1)
//!              "revision" -> the store-wide revision: the highest version ever written
//! ```
//!
//! Invariants, checked on every read: `1 <= version <= revision`.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, Table, TableDefinition,
};

use super::{
    Check, MetaError, MetaStore, Revision, SCAN_BYTES_MAX, SCAN_ENTRIES_MAX, ScanPage, Txn,
    Versioned, Write, validate_key, validate_scan,
};

const FILE_NAME: &str = "meta.redb";
const KV: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("kv");
type KvTable<'txn> = Table<'txn, &'static [u8], &'static [u8]>;
type KvSnapshot = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;
const SYS: TableDefinition<'_, &str, u64> = TableDefinition::new("sys");
const SYS_FORMAT: &str = "format";
const SYS_REVISION: &str = "revision";
/// The layout above. Bump it, and migrate, when the layout changes.
const FORMAT_VERSION: u64 = 1;
const VERSION_BYTES: usize = size_of::<u64>();

/// Settings of the embedded store. The defaults suit a single node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedbMetaOptions {
    /// Requests queued to the store thread; senders wait when it is full.
    pub queue_depth: u32,
    /// Transactions applied in one write transaction (one fsync).
    pub group_txns_max: u32,
    /// The store thread stops adding transactions to a group past this many key and
    /// value bytes.
    pub group_bytes_max: u64,
    /// redb's page cache.
    pub cache_bytes: u64,
}

impl Default for RedbMetaOptions {
    fn default() -> Self {
        Self {
            queue_depth: 1024,
            group_txns_max: 256,
            group_bytes_max: 16 << 20,
            cache_bytes: 64 << 20,
        }
    }
}

/// Counters of what the store thread did since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaStats {
    /// Write transactions committed to disk: one fsync each.
    pub groups_committed: u64,
    /// Transactions whose checks passed (with or without writes).
    pub txns_applied: u64,
    /// Transactions refused with a conflict.
    pub txns_conflicted: u64,
    /// Gets and scans answered.
    pub reads_served: u64,
}

#[derive(Debug, Default)]
struct Counters {
    groups_committed: AtomicU64,
    txns_applied: AtomicU64,
    txns_conflicted: AtomicU64,
    reads_served: AtomicU64,
}

type Reply<T> = flume::Sender<Result<T, MetaError>>;

enum Request {
    Get {
        key: Vec<u8>,
        reply: Reply<Option<Versioned>>,
    },
    Scan {
        prefix: Vec<u8>,
        start_after: Option<Vec<u8>>,
        limit: u32,
        reply: Reply<ScanPage>,
    },
    Commit {
        txn: Txn,
        reply: Reply<Revision>,
    },
    Close {
        reply: Reply<()>,
    },
    /// Tests only: the thread finishes what it holds, says so on `entered`, and waits
    /// on `release`, so a test can queue an exact group behind it.
    #[cfg(test)]
    Hold {
        entered: flume::Sender<()>,
        release: flume::Receiver<()>,
    },
}

/// A handle to the embedded metadata store. Clones share one store thread; the thread
/// closes the database and exits when [`close`](Self::close) is called or the last
/// handle drops.
#[derive(Clone, Debug)]
pub struct RedbMetaStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    // Declared before `_thread`: fields drop in order, so the channel disconnects (and the
    // thread drains and exits) before the join.
    requests: flume::Sender<Request>,
    counters: Arc<Counters>,
    _thread: Joiner,
}

#[derive(Debug)]
struct Joiner(Option<JoinHandle<()>>);

impl Drop for Joiner {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            // A panic of the store thread has already answered its callers with `Closed`
            // (their reply senders dropped); there is nobody left to tell.
            let _ = thread.join();
        }
    }
}

impl RedbMetaStore {
    /// Opens the store in directory `dir`, creating both if needed, and starts its
    /// thread. Blocks while redb opens the file, which after a crash includes a repair
    /// pass over the whole file: call it at start, before any reactor depends on it.
    pub fn open(dir: impl AsRef<Path>, options: RedbMetaOptions) -> Result<Self, MetaError> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir).map_err(|error| MetaError::Io {
            op: "creating the metadata directory",
            message: format!("{}: {error}", dir.display()),
        })?;
        let path = dir.join(FILE_NAME);
        let existed = path.try_exists().map_err(|error| MetaError::Io {
            op: "opening the metadata file",
            message: format!("{}: {error}", path.display()),
        })?;
        let db = redb::Builder::new()
            .set_cache_size(usize::try_from(options.cache_bytes).unwrap_or(usize::MAX))
            .create(&path)
            .map_err(storage("opening the metadata file"))?;
        if !existed {
            // The new file's entry, and the directory's own entry if it is new too.
            sync_dir(dir)?;
            if let Some(parent) = dir.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
        }
        let revision = init(&db)?;
        let (requests, receiver) = flume::bounded(options.queue_depth.max(1) as usize);
        let counters = Arc::new(Counters::default());
        let worker = Worker {
            db,
            revision,
            requests: receiver,
            counters: Arc::clone(&counters),
            group_txns_max: options.group_txns_max.max(1) as usize,
            group_bytes_max: options.group_bytes_max,
        };
        let thread = std::thread::Builder::new()
            .name("nova-meta".to_string())
            .spawn(move || worker.run())
            .map_err(|error| MetaError::Io {
                op: "starting the metadata thread",
                message: error.to_string(),
            })?;
        Ok(Self { inner: Arc::new(Inner { requests, counters, _thread: Joiner(Some(thread)) }) })
    }

    /// Finishes the requests queued before this call, closes the database and stops the
    /// thread. Later requests, from any clone, fail with [`MetaError::Closed`]. Closing a
    /// closed store is a no-op.
    pub async fn close(&self) -> Result<(), MetaError> {
        match self.call(|reply| Request::Close { reply }).await {
            Err(MetaError::Closed) => Ok(()),
            result => result,
        }
    }

    /// What the store thread has done since open.
    pub fn stats(&self) -> MetaStats {
        let counters = &self.inner.counters;
        MetaStats {
            groups_committed: counters.groups_committed.load(Ordering::Relaxed),
            txns_applied: counters.txns_applied.load(Ordering::Relaxed),
            txns_conflicted: counters.txns_conflicted.load(Ordering::Relaxed),
            reads_served: counters.reads_served.load(Ordering::Relaxed),
        }
    }

    async fn call<T>(&self, request: impl FnOnce(Reply<T>) -> Request) -> Result<T, MetaError> {
        let (reply, answer) = flume::bounded(1);
        self.inner.requests.send_async(request(reply)).await.map_err(|_| MetaError::Closed)?;
        answer.recv_async().await.map_err(|_| MetaError::Closed)?
    }

    /// Tests only: parks the store thread until `release` receives or disconnects, and
    /// returns once it is parked with nothing in hand.
    #[cfg(test)]
    pub(crate) fn hold(&self, release: flume::Receiver<()>) -> Result<(), MetaError> {
        let (entered, parked) = flume::bounded(1);
        self.inner
            .requests
            .send(Request::Hold { entered, release })
            .map_err(|_| MetaError::Closed)?;
        parked.recv().map_err(|_| MetaError::Closed)
    }
}

impl MetaStore for RedbMetaStore {
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Versioned>, MetaError>> + Send {
        let key = validate_key(key).map(|()| key.to_vec());
        async move {
            let key = key?;
            self.call(|reply| Request::Get { key, reply }).await
        }
    }

    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: u32,
    ) -> impl Future<Output = Result<ScanPage, MetaError>> + Send {
        let checked = validate_scan(prefix, start_after, limit)
            .map(|()| (prefix.to_vec(), start_after.map(<[u8]>::to_vec)));
        async move {
            let (prefix, start_after) = checked?;
            self.call(|reply| Request::Scan { prefix, start_after, limit, reply }).await
        }
    }

    async fn commit(&self, txn: Txn) -> Result<Revision, MetaError> {
        txn.validate()?;
        self.call(|reply| Request::Commit { txn, reply }).await
    }
}

/// Creates the tables of a new file, or checks the format of an existing one; returns
/// the stored revision.
fn init(db: &Database) -> Result<Revision, MetaError> {
    let write = db.begin_write().map_err(storage("initializing the metadata file"))?;
    let (format, revision, kv_empty) = {
        let sys = write.open_table(SYS).map_err(storage("initializing the metadata file"))?;
        let kv = write.open_table(KV).map_err(storage("initializing the metadata file"))?;
        let format = sys.get(SYS_FORMAT).map_err(storage("reading the metadata format"))?;
        let revision = sys.get(SYS_REVISION).map_err(storage("reading the metadata revision"))?;
        let kv_empty = kv.is_empty().map_err(storage("initializing the metadata file"))?;
        (format.map(|guard| guard.value()), revision.map(|guard| guard.value()), kv_empty)
    };
    match (format, revision) {
        (Some(FORMAT_VERSION), Some(revision)) => {
            write.abort().map_err(storage("initializing the metadata file"))?;
            Ok(Revision(revision))
        }
        (None, None) if kv_empty => {
            {
                let mut sys =
                    write.open_table(SYS).map_err(storage("initializing the metadata file"))?;
                sys.insert(SYS_FORMAT, FORMAT_VERSION)
                    .map_err(storage("initializing the metadata file"))?;
                sys.insert(SYS_REVISION, 0).map_err(storage("initializing the metadata file"))?;
            }
            write.commit().map_err(storage("initializing the metadata file"))?;
            Ok(Revision::ZERO)
        }
        (format, revision) => Err(MetaError::Corrupt {
            message: format!(
                "unknown metadata file: format {format:?}, revision {revision:?}, \
                 expected format {FORMAT_VERSION}"
            ),
        }),
    }
}

/// Makes a new file's directory entry durable.
fn sync_dir(dir: &Path) -> Result<(), MetaError> {
    fs::File::open(dir).and_then(|handle| handle.sync_all()).map_err(|error| MetaError::Io {
        op: "syncing the metadata directory",
        message: format!("{}: {error}", dir.display()),
    })
}

/// Maps a redb error: corruption to [`MetaError::Corrupt`], anything else to
/// [`MetaError::Io`] naming what the store was doing.
fn storage<E: Into<redb::Error>>(op: &'static str) -> impl FnOnce(E) -> MetaError {
    move |error| match error.into() {
        redb::Error::Corrupted(message) => MetaError::Corrupt { message },
        error => MetaError::Io { op, message: error.to_string() },
    }
}

/// The store thread's state.
struct Worker {
    db: Database,
    /// The revision of the last durable write group.
    revision: Revision,
    requests: flume::Receiver<Request>,
    counters: Arc<Counters>,
    group_txns_max: usize,
    group_bytes_max: u64,
}

/// A transaction waiting in the current group, with its caller.
struct Pending {
    txn: Txn,
    reply: Reply<Revision>,
}

/// A read waiting in the current batch, with its caller.
enum Read {
    Get { key: Vec<u8>, reply: Reply<Option<Versioned>> },
    Scan { prefix: Vec<u8>, start_after: Option<Vec<u8>>, limit: u32, reply: Reply<ScanPage> },
}

impl Worker {
    fn run(mut self) {
        let mut reads = Vec::new();
        let mut group = Vec::new();
        // Bounded by the channel: the loop ends when every handle is gone (after the
        // queued requests are served) or on `Close`.
        while let Ok(first) = self.requests.recv() {
            let mut group_bytes = 0;
            let mut next = Some(first);
            while let Some(request) = next.take() {
                match request {
                    Request::Get { key, reply } => reads.push(Read::Get { key, reply }),
                    Request::Scan { prefix, start_after, limit, reply } => {
                        reads.push(Read::Scan { prefix, start_after, limit, reply })
                    }
                    Request::Commit { txn, reply } => {
                        group_bytes += txn.bytes();
                        group.push(Pending { txn, reply });
                    }
                    Request::Close { reply } => {
                        self.serve(&mut reads, &mut group);
                        let _ = reply.send(self.close());
                        return;
                    }
                    #[cfg(test)]
                    Request::Hold { entered, release } => {
                        self.serve(&mut reads, &mut group);
                        let _ = entered.send(());
                        let _ = release.recv();
                    }
                }
                if group.len() < self.group_txns_max
                    && group_bytes < self.group_bytes_max
                    && reads.len() < self.group_txns_max
                {
                    next = self.requests.try_recv().ok();
                }
            }
            self.serve(&mut reads, &mut group);
        }
        // Every handle is gone, so nobody waits for the outcome.
        let _ = self.close();
    }

    fn close(self) -> Result<(), MetaError> {
        self.db.close().map_err(storage("closing the metadata file"))
    }

    /// Answers the reads from the committed state, then commits the group. Reads may
    /// be answered before writes that arrived earlier in the same batch: those writes
    /// are not acknowledged yet, so the reads are concurrent with them.
    fn serve(&mut self, reads: &mut Vec<Read>, group: &mut Vec<Pending>) {
        if !reads.is_empty() {
            self.serve_reads(reads);
        }
        if !group.is_empty() {
            self.commit_group(group);
        }
    }

    fn serve_reads(&mut self, reads: &mut Vec<Read>) {
        let snapshot = self
            .db
            .begin_read()
            .map_err(storage("reading metadata"))
            .and_then(|read| read.open_table(KV).map_err(storage("reading metadata")));
        let served = reads.len() as u64;
        for read in reads.drain(..) {
            match read {
                Read::Get { key, reply } => {
                    let answer = snapshot.as_ref().map_err(Clone::clone).and_then(|kv| {
                        match kv.get(key.as_slice()).map_err(storage("reading metadata"))? {
                            Some(stored) => decode(&key, stored.value(), self.revision).map(Some),
                            None => Ok(None),
                        }
                    });
                    let _ = reply.send(answer);
                }
                Read::Scan { prefix, start_after, limit, reply } => {
                    let answer = snapshot.as_ref().map_err(Clone::clone).and_then(|kv| {
                        scan(kv, &prefix, start_after.as_deref(), limit, self.revision)
                    });
                    let _ = reply.send(answer);
                }
            }
        }
        self.counters.reads_served.fetch_add(served, Ordering::Relaxed);
    }

    fn commit_group(&mut self, group: &mut Vec<Pending>) {
        let outcome = self.apply_group(group);
        let (applied, conflicted) = match &outcome {
            Ok(results) => {
                let conflicted = results.iter().filter(|result| result.is_err()).count() as u64;
                (results.len() as u64 - conflicted, conflicted)
            }
            Err(_) => (0, 0),
        };
        self.counters.txns_applied.fetch_add(applied, Ordering::Relaxed);
        self.counters.txns_conflicted.fetch_add(conflicted, Ordering::Relaxed);
        match outcome {
            Ok(results) => {
                for (pending, result) in group.drain(..).zip(results) {
                    let _ = pending.reply.send(result);
                }
            }
            // Nothing of the group is known to be durable: every caller hears the error.
            Err(error) => {
                for pending in group.drain(..) {
                    let _ = pending.reply.send(Err(error.clone()));
                }
            }
        }
    }

    /// Applies the group's transactions in order in one redb write transaction and
    /// commits it (one fsync) if any of them wrote. Returns each transaction's result;
    /// an error means nothing of the group was committed.
    fn apply_group(
        &mut self,
        group: &[Pending],
    ) -> Result<Vec<Result<Revision, MetaError>>, MetaError> {
        let write = self.db.begin_write().map_err(storage("writing metadata"))?;
        let mut revision = self.revision;
        let mut results = Vec::with_capacity(group.len());
        {
            let mut kv = write.open_table(KV).map_err(storage("writing metadata"))?;
            for Pending { txn, .. } in group {
                if let Some(conflict) = failed_check(&kv, &txn.checks, revision)? {
                    results.push(Err(conflict));
                    continue;
                }
                if !txn.writes.is_empty() {
                    revision = Revision(revision.0 + 1);
                    apply_writes(&mut kv, &txn.writes, revision)?;
                }
                results.push(Ok(revision));
            }
        }
        if revision == self.revision {
            // Nothing written: the checks read durable state, so there is nothing to sync.
            write.abort().map_err(storage("writing metadata"))?;
            return Ok(results);
        }
        {
            let mut sys = write.open_table(SYS).map_err(storage("writing metadata"))?;
            sys.insert(SYS_REVISION, revision.0).map_err(storage("writing metadata"))?;
        }
        // Immediate durability (redb's default): commit returns after fsync.
        write.commit().map_err(storage("committing metadata"))?;
        assert!(revision > self.revision, "the revision only grows");
        self.revision = revision;
        self.counters.groups_committed.fetch_add(1, Ordering::Relaxed);
        Ok(results)
    }
}

/// The first check that fails against the table's current state, as a conflict.
fn failed_check(
    kv: &KvTable<'_>,
    checks: &[Check],
    revision: Revision,
) -> Result<Option<MetaError>, MetaError> {
    for (index, check) in checks.iter().enumerate() {
        let key = check.key();
        let stored = kv.get(key).map_err(storage("reading metadata"))?;
        let current = stored.map(|stored| decode(key, stored.value(), revision)).transpose()?;
        let holds =
            check.holds(current.as_ref().map(|found| (found.value.as_slice(), found.version)));
        if !holds {
            return Ok(Some(MetaError::Conflict {
                check: u32::try_from(index).expect("TXN_OPS_MAX bounds the checks of a txn"),
                key: key.to_vec(),
                found: current.map(|found| found.version),
            }));
        }
    }
    Ok(None)
}

fn apply_writes(
    kv: &mut KvTable<'_>,
    writes: &[Write],
    revision: Revision,
) -> Result<(), MetaError> {
    for write in writes {
        match write {
            Write::Put(key, value) => {
                let stored = encode(value, revision);
                kv.insert(key.as_slice(), stored.as_slice())
                    .map_err(storage("writing metadata"))?;
            }
            Write::Delete(key) => {
                kv.remove(key.as_slice()).map_err(storage("writing metadata"))?;
            }
        }
    }
    Ok(())
}

/// One page of keys with `prefix`, after `start_after`.
fn scan(
    kv: &KvSnapshot,
    prefix: &[u8],
    start_after: Option<&[u8]>,
    limit: u32,
    revision: Revision,
) -> Result<ScanPage, MetaError> {
    use std::ops::Bound;
    let lower = match start_after {
        Some(after) if after >= prefix => Bound::Excluded(after),
        _ => Bound::Included(prefix),
    };
    let entries_max = limit.min(SCAN_ENTRIES_MAX) as usize;
    let mut page = ScanPage::default();
    let mut value_bytes = 0u64;
    // Bounded by `entries_max` and `SCAN_BYTES_MAX`; keys past the prefix end it.
    for entry in
        kv.range::<&[u8]>((lower, Bound::Unbounded)).map_err(storage("scanning metadata"))?
    {
        let (key, stored) = entry.map_err(storage("scanning metadata"))?;
        let key = key.value();
        if !key.starts_with(prefix) {
            break;
        }
        if page.entries.len() == entries_max || value_bytes >= SCAN_BYTES_MAX {
            page.more = true;
            break;
        }
        let versioned = decode(key, stored.value(), revision)?;
        value_bytes += versioned.value.len() as u64;
        page.entries.push((key.to_vec(), versioned));
    }
    Ok(page)
}

fn encode(value: &[u8], revision: Revision) -> Vec<u8> {
    let mut stored = Vec::with_capacity(VERSION_BYTES + value.len());
    stored.extend_from_slice(&revision.0.to_le_bytes());
    stored.extend_from_slice(value);
    stored
}

fn decode(key: &[u8], stored: &[u8], revision: Revision) -> Result<Versioned, MetaError> {
    let corrupt = |what: String| MetaError::Corrupt {
        message: format!("key \"{}\": {what}", key.escape_ascii()),
    };
    let (version, value) = stored
        .split_first_chunk::<VERSION_BYTES>()
        .ok_or_else(|| corrupt(format!("stored value of {} bytes has no version", stored.len())))?;
    let version = Revision(u64::from_le_bytes(*version));
    if version == Revision::ZERO || version > revision {
        return Err(corrupt(format!("version {version} outside 1..={revision}")));
    }
    Ok(Versioned { value: value.to_vec(), version })
}
