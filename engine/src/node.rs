//! A node: the running engine on one machine. It opens the metadata store, starts one
//! shard executor per configured core (each recovers its own journal before it serves),
//! and routes every stream operation to the shard that leads the stream: the one at
//! `hash(stream ID) mod shards`.
//!
//! [`Client`] is the node's `Send + Clone` handle. It resolves a stream's address
//! through the control plane on the caller's thread, then sends the operation — the
//! whole batch, never single records — over a bounded channel to the owning shard, and
//! awaits the reply on a one-shot channel. Tests, the in-process bench and, later, the
//! HTTP layer use it.
//!
//! The shard count is fixed for a data directory (its journals are per shard): the
//! manifest records it and a node with another count refuses to start.

use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use glommio::{LocalExecutorBuilder, Placement};

use crate::auditor::{Auditor, AuditorConfig, AuditorStats};
use crate::control::{Clock, ControlPlane, Door, StreamRecord, SystemClock};
use crate::error::{Error, Result};
use crate::ids::StreamId;
use crate::journal::{Journal, JournalConfig};
use crate::meta::{RedbMetaOptions, RedbMetaStore};
use crate::names::{BucketName, StreamKey};
use crate::notify::Notify;
use crate::options::{StreamOptions, StreamOptionsPatch};
use crate::position::Tail;
use crate::shard::{
    Answer, AppendAck, AppendRequest, Op, PlanRequest, ReadPlan, ReadReply, ReadRequest, Reply,
    Shard, ShardConfig, ShardStats, TrimTo,
};
use crate::stream::Standing;
use crate::uploader::{Uploader, UploaderConfig};

/// The manifest's name in the data directory.
const MANIFEST: &str = "nova.manifest";
/// The lock a running node holds in the data directory.
const LOCK: &str = "nova.lock";
/// The manifest's format line.
const MANIFEST_FORMAT: &str = "nova manifest 1";

/// Everything a node needs to start.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    /// Where the express journals are (`journal-dir`); `None`: `data_dir/journal`.
    pub journal_dir: Option<PathBuf>,
    /// Start even though a journal of a data directory that ran before is missing
    /// (`--accept-journal-loss`): the express records only it held are lost.
    pub accept_journal_loss: bool,
    /// Shard executors (one per core).
    pub shards: usize,
    /// Pin shard `i` to core `first_core + i`; `None` leaves them unbound.
    pub first_core: Option<usize>,
    pub shard: ShardConfig,
    pub journal: JournalConfig,
    pub meta: RedbMetaOptions,
    /// Requests queued for one shard before senders wait.
    pub inbox_depth: usize,
    /// Requests one shard handles at once.
    pub handlers_max: u64,
    /// Where history lives.
    pub objects: ObjectStoreConfig,
    /// The local directory store's settings (when `objects` is local).
    pub local_store: s3::LocalDirOptions,
    pub uploader: UploaderConfig,
    pub auditor: AuditorConfig,
    /// Bytes of freed chunk buffers the process keeps for reuse (`aligned`); the
    /// pool is one per process, so the last node started sets it.
    pub buffer_pool_bytes: usize,
}

/// The object store a node keeps history in.
#[derive(Clone, Debug)]
pub enum ObjectStoreConfig {
    /// A local directory (the embedded default: `<data dir>/objects`).
    Local(PathBuf),
    /// An S3 bucket (AWS or an S3-compatible server).
    S3(Box<s3::S3Config>),
}

impl ObjectStoreConfig {
    fn open(&self, local: s3::LocalDirOptions) -> Result<Arc<dyn s3::ObjectStore>> {
        let store: Arc<dyn s3::ObjectStore> = match self {
            ObjectStoreConfig::Local(root) => {
                Arc::new(s3::LocalDirStore::open(root, local).map_err(|e| {
                    Error::unavailable(format!("the object directory {} ({e})", root.display()))
                })?)
            }
            ObjectStoreConfig::S3(config) => Arc::new(
                s3::S3Store::new(config.as_ref().clone())
                    .map_err(|e| Error::unavailable(format!("the S3 object store ({e})")))?,
            ),
        };
        Ok(store)
    }
}

impl NodeConfig {
    /// The directory of the shards' journals.
    pub fn journal_dir(&self) -> PathBuf {
        self.journal_dir.clone().unwrap_or_else(|| self.data_dir.join("journal"))
    }

    /// A node on `data_dir` with every knob at its default.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let shards = match tuning::SHARDS.default {
            0 => default_shards(),
            n => usize::try_from(n).expect("the knob's range is small"),
        };
        let data_dir: PathBuf = data_dir.into();
        Self {
            data_dir: data_dir.clone(),
            journal_dir: None,
            accept_journal_loss: false,
            shards,
            first_core: None,
            shard: ShardConfig {
                limits: crate::limits::Limits::default(),
                memory_budget_bytes: tuning::SHARD_MEMORY_BYTES.default,
                express_chunk_bytes: usize::try_from(tuning::EXPRESS_CHUNK_BYTES.default)
                    .expect("the knob's range fits memory"),
                uploads_in_flight_max: usize::try_from(tuning::SHARD_UPLOADS_IN_FLIGHT_MAX.default)
                    .expect("small"),
                journal_syncs_in_flight_max: usize::try_from(
                    tuning::JOURNAL_SYNCS_IN_FLIGHT_MAX.default,
                )
                .expect("small"),
                // The node sets it from `uploader` when it starts.
                upload_job_bytes_max: tuning::BUNDLE_BYTES_TARGET.default,
                // The node lowers it to `auditor.interval` when it starts.
                refs_wait_max: std::time::Duration::MAX,
                settle: crate::shard::SettleConfig::default(),
                retention_interval: std::time::Duration::from_millis(
                    tuning::RETENTION_INTERVAL_MS.default,
                ),
                read_page_loads_max: usize::try_from(tuning::READ_PAGE_LOADS_MAX.default)
                    .expect("small"),
            },
            journal: JournalConfig::default(),
            meta: RedbMetaOptions::default(),
            inbox_depth: usize::try_from(tuning::SHARD_INBOX_DEPTH.default).expect("small"),
            handlers_max: tuning::SHARD_HANDLERS_MAX.default,
            objects: ObjectStoreConfig::Local(data_dir.join("objects")),
            local_store: s3::LocalDirOptions::default(),
            uploader: UploaderConfig::default(),
            auditor: AuditorConfig::default(),
            buffer_pool_bytes: usize::try_from(tuning::BUFFER_POOL_BYTES.default)
                .expect("the knob's range fits memory"),
        }
    }
}

impl NodeConfig {
    /// Sets every engine knob from `value` (a server's flags, environment and defaults,
    /// `tuning::Knob::resolve`). The object store's transfer knobs (`s3-*`) belong to
    /// its `S3Config`; the HTTP knobs to the server. [`engine_knobs`] lists what it reads.
    pub fn apply_knobs(
        &mut self,
        value: &mut dyn FnMut(tuning::Knob) -> std::result::Result<u64, String>,
    ) -> std::result::Result<(), String> {
        use std::time::Duration;
        use tuning as t;
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let ms = Duration::from_millis;
        self.shards = match value(t::SHARDS)? {
            0 => default_shards(),
            n => count(n),
        };
        (self.first_core, self.uploader.core) = match value(t::PIN_CORES)? {
            0 => (None, None),
            _ => pinned_cores(self.shards)?,
        };
        self.shard.limits.record_bytes_max =
            u32::try_from(value(t::RECORD_BYTES_MAX)?).unwrap_or(u32::MAX);
        self.shard.memory_budget_bytes = value(t::SHARD_MEMORY_BYTES)?;
        self.shard.express_chunk_bytes = count(value(t::EXPRESS_CHUNK_BYTES)?);
        self.shard.uploads_in_flight_max = count(value(t::SHARD_UPLOADS_IN_FLIGHT_MAX)?);
        self.shard.settle.target_bytes = value(t::SETTLE_TARGET_BYTES)?;
        self.shard.settle.age = ms(value(t::SETTLE_AGE_MS)?);
        self.shard.settle.interval = ms(value(t::SETTLE_INTERVAL_MS)?);
        self.shard.settle.early_bytes_min = value(t::SETTLE_EARLY_BYTES_MIN)?;
        self.shard.settle.in_flight_max = count(value(t::SETTLES_IN_FLIGHT_MAX)?);
        self.shard.retention_interval = ms(value(t::RETENTION_INTERVAL_MS)?);
        self.shard.read_page_loads_max = count(value(t::READ_PAGE_LOADS_MAX)?);
        self.inbox_depth = count(value(t::SHARD_INBOX_DEPTH)?);
        self.handlers_max = value(t::SHARD_HANDLERS_MAX)?;
        self.journal.segment_bytes = value(t::JOURNAL_SEGMENT_BYTES)?;
        self.journal.spare_segments =
            u32::try_from(value(t::JOURNAL_SPARE_SEGMENTS)?).unwrap_or(u32::MAX);
        self.shard.journal_syncs_in_flight_max = count(value(t::JOURNAL_SYNCS_IN_FLIGHT_MAX)?);
        let uploader = &mut self.uploader;
        uploader.bundle_bytes_target = value(t::BUNDLE_BYTES_TARGET)?;
        uploader.bundle_delay = ms(value(t::BUNDLE_DELAY_MS)?);
        uploader.direct_settle_bytes_min = value(t::DIRECT_SETTLE_BYTES_MIN)?;
        uploader.uploads_in_flight_max = count(value(t::UPLOADS_IN_FLIGHT_MAX)?);
        uploader.reads_in_flight_max = count(value(t::OBJECT_READS_IN_FLIGHT_MAX)?);
        uploader.queue_depth = count(value(t::UPLOADER_QUEUE_DEPTH)?);
        uploader.backoff_initial = ms(value(t::UPLOAD_BACKOFF_INITIAL_MS)?);
        uploader.backoff_max = ms(value(t::UPLOAD_BACKOFF_MAX_MS)?);
        uploader.drain = ms(value(t::UPLOADER_DRAIN_MS)?);
        backoff_in_order(
            uploader.backoff_initial,
            uploader.backoff_max,
            t::UPLOAD_BACKOFF_INITIAL_MS,
            t::UPLOAD_BACKOFF_MAX_MS,
        )?;
        self.auditor.read_grace = ms(value(t::AUDITOR_READ_GRACE)?);
        self.auditor.interval = ms(value(t::AUDITOR_INTERVAL_MS)?);
        self.local_store.io_concurrency = count(value(t::LOCAL_STORE_IO_CONCURRENCY)?);
        self.local_store.write_bytes = count(value(t::LOCAL_STORE_WRITE_BYTES)?);
        self.buffer_pool_bytes = count(value(t::BUFFER_POOL_BYTES)?);
        Ok(())
    }
}

/// The engine knobs [`NodeConfig::apply_knobs`] reads, in order: found by applying
/// every default to a throwaway config, so the list cannot drift from what it reads.
pub fn engine_knobs() -> Vec<tuning::Knob> {
    let mut read = Vec::new();
    NodeConfig::new(".")
        .apply_knobs(&mut |knob| {
            read.push(knob);
            Ok(knob.default)
        })
        .expect("every knob's default is valid");
    read
}

/// Refuses a first backoff longer than the largest it may grow to, naming both knobs.
pub fn backoff_in_order(
    initial: std::time::Duration,
    max: std::time::Duration,
    initial_knob: tuning::Knob,
    max_knob: tuning::Knob,
) -> std::result::Result<(), String> {
    if initial <= max {
        return Ok(());
    }
    Err(format!(
        "--{} or {} ({} ms) is longer than --{} or {} ({} ms), the largest backoff it grows to",
        initial_knob.flag,
        initial_knob.env,
        initial.as_millis(),
        max_knob.flag,
        max_knob.env,
        max.as_millis()
    ))
}

/// The cores `--pin-cores` pins to: the first of the shards' (shard i on the i-th core
/// the process may run on), and the uploader's, the next one if there is one.
fn pinned_cores(shards: usize) -> std::result::Result<(Option<usize>, Option<usize>), String> {
    // SAFETY: `cpu_set_t` is plain bits; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this process; `set` is a valid set of the size passed.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(format!("--pin-cores: {}", std::io::Error::last_os_error()));
    }
    let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: every index is below CPU_SETSIZE.
        .filter(|&core| unsafe { libc::CPU_ISSET(core, &set) })
        .collect();
    let needed = &allowed[..shards.min(allowed.len())];
    if needed.len() < shards || needed.windows(2).any(|pair| pair[1] != pair[0] + 1) {
        return Err(format!(
            "--pin-cores 1 needs a core of its own for each of the {shards} shards (--shards), \
             consecutive, but nova may run on cores {allowed:?}"
        ));
    }
    Ok((Some(needed[0]), allowed.get(shards).copied()))
}

/// Every core but one (the uploader's and the metadata thread's), at least one.
pub fn default_shards() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
}

enum Message {
    Op {
        record: Box<StreamRecord>,
        op: Op,
        reply: flume::Sender<Answer>,
    },
    Stats(flume::Sender<ShardStats>),
    /// Ends the shard's service (it stops taking work and finishes what it holds);
    /// answered once it has returned. The shard keeps serving its inbox meanwhile.
    StopService(flume::Sender<()>),
    Stop,
}

/// What a [`Service`] runs with on its shard's executor.
pub struct ServiceContext {
    /// The shard's index (its core is `first_core + index` when pinned).
    pub shard: usize,
    /// The node's handle (operations on any stream, routed to their leaders).
    pub client: Client,
    /// Resolves when the node is stopping: the service stops taking new work, finishes
    /// what it holds, and returns. The shards serve until every service has returned.
    pub stopping: ServiceStop,
}

/// A signal that the node is stopping ([`ServiceContext::stopping`]).
#[derive(Clone)]
pub struct ServiceStop(Rc<crate::notify::Notify>, Rc<std::cell::Cell<bool>>);

impl ServiceStop {
    /// Whether the node is stopping.
    pub fn is_set(&self) -> bool {
        self.1.get()
    }

    /// Resolves once the node is stopping.
    pub async fn wait(&self) {
        loop {
            let seen = self.0.generation();
            if self.1.get() {
                return;
            }
            self.0.changed(seen).await;
        }
    }

    fn set(&self) {
        self.1.set(true);
        self.0.notify();
    }
}

/// Work that runs on every shard's executor beside the shard (the HTTP acceptor: one
/// listener per shard on the same port, so accepting is shared-nothing). Called once
/// per shard, on that shard's thread, once it has recovered (on a first start, once
/// every shard has).
pub type Service = Arc<
    dyn Fn(ServiceContext) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>
        + Send
        + Sync,
>;

/// A running node.
pub struct Node {
    /// Held while the node runs: one node per data directory.
    _lock: std::fs::File,
    client: Client,
    threads: Vec<glommio::ExecutorJoinHandle<()>>,
    uploader: Uploader,
    auditor: Option<Auditor>,
}

/// The node's handle: cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Client {
    shards: Arc<[flume::Sender<Message>]>,
    control: ControlPlane<RedbMetaStore>,
    /// Addresses resolved before, so the hot path skips the metadata round trip. Safe
    /// because a leader builds its state from the stream's current record by ID: a
    /// stale entry (the stream deleted, or recreated with a new ID) comes back from the
    /// leader as not found, and the client resolves once more.
    resolved: Arc<RwLock<HashMap<(BucketName, StreamKey), StreamRecord>>>,
    uploader: Uploader,
    auditor: Arc<std::sync::Mutex<AuditorStats>>,
    /// Set once every shard has recovered: a shard serves as soon as it has, so a
    /// caller may reach the node while another shard still replays its journal.
    recovered: Arc<AtomicBool>,
    /// The first shard failure (a journal, upload or metadata write that failed): that
    /// shard acknowledges nothing more until a restart.
    failed: Failed,
    /// The shards' limits, and the journal's largest entry, which an append meets before
    /// its address is resolved.
    limits: crate::limits::Limits,
    entry_max: u64,
    /// A shard's memory budget, which no batch may pass.
    memory_budget: u64,
}

/// The node's first shard failure, shared by its shards ([`Client::failed`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct Failed(Arc<std::sync::Mutex<Option<String>>>);

impl Failed {
    pub(crate) fn record(&self, why: &str) {
        if let Ok(mut first) = self.0.lock() {
            first.get_or_insert_with(|| why.to_owned());
        }
    }

    fn first(&self) -> Option<String> {
        self.0.lock().ok().and_then(|first| first.clone())
    }
}

/// Addresses the resolve cache holds before it starts over.
const RESOLVED_MAX: usize = 100_000;
/// Resolves one operation may take before it gives up (each after a stale record).
const ATTEMPTS_MAX: u32 = 4;

impl Node {
    /// Starts a node and returns once every shard has recovered and serves. Blocking:
    /// call it from an ordinary thread, never from a shard.
    pub fn start(config: NodeConfig) -> Result<Node> {
        Self::start_with_clock(config, Arc::new(SystemClock))
    }

    /// [`Node::start`] with the clock that stamps arrivals and records (tests).
    pub fn start_with_clock(config: NodeConfig, clock: Arc<dyn Clock>) -> Result<Node> {
        Self::start_with(config, clock, None)
    }

    /// [`Node::start`] with a [`Service`] run on every shard (the HTTP server).
    pub fn start_serving(config: NodeConfig, service: Service) -> Result<Node> {
        Self::start_with(config, Arc::new(SystemClock), Some(service))
    }

    fn start_with(
        mut config: NodeConfig,
        clock: Arc<dyn Clock>,
        service: Option<Service>,
    ) -> Result<Node> {
        assert!(config.shards > 0, "a node has at least one shard");
        crate::aligned::set_pool_bytes_max(config.buffer_pool_bytes);
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| io_error("create the data directory", &e))?;
        // glommio opens the journal's directories by absolute path only.
        config.data_dir = std::path::absolute(&config.data_dir)
            .map_err(|e| io_error("resolve the data directory", &e))?;
        if let Some(journals) = &config.journal_dir {
            config.journal_dir = Some(
                std::path::absolute(journals)
                    .map_err(|e| io_error("resolve the journal directory", &e))?,
            );
        }
        let lock = lock_data_dir(&config.data_dir)?;
        let ran_before = check_manifest(&config)?;
        if ran_before && !config.accept_journal_loss {
            check_journals_are_there(&config)?;
        }
        let store = config.objects.open(config.local_store.clone())?;
        let uploader = Uploader::start(Arc::clone(&store), config.uploader.clone(), "")?;
        let meta = match RedbMetaStore::open(config.data_dir.join("meta"), config.meta) {
            Ok(meta) => meta,
            Err(error) => {
                uploader.stop();
                return Err(error.into());
            }
        };
        let control =
            ControlPlane::with_seams(meta, Arc::clone(&clock), Arc::new(crate::control::OsRandom));
        let (ready_tx, ready_rx) = flume::bounded(config.shards);
        // One go per shard for its service. A directory that has run before serves as each
        // shard recovers (`/health` answers 503 until all have); a first start, only once
        // it is recorded as started (below), so that one that fails acknowledged nothing.
        let (serve_tx, serve_rx) = flume::bounded(config.shards);
        let serve_all = || {
            for _ in 0..config.shards {
                let _ = serve_tx.send(());
            }
        };
        if ran_before {
            serve_all();
        }
        let mut senders = Vec::with_capacity(config.shards);
        let mut receivers = Vec::with_capacity(config.shards);
        for _ in 0..config.shards {
            let (tx, rx) = flume::bounded(config.inbox_depth);
            senders.push(tx);
            receivers.push(rx);
        }
        let client = Client {
            shards: senders.into(),
            control,
            resolved: Arc::default(),
            uploader: uploader.clone(),
            auditor: Arc::default(),
            recovered: Arc::default(),
            failed: Failed::default(),
            limits: config.shard.limits,
            entry_max: config.journal.segment_bytes,
            memory_budget: config.shard.memory_budget_bytes,
        };
        let mut threads = Vec::with_capacity(config.shards);
        for (index, rx) in receivers.into_iter().enumerate() {
            let placement =
                config.first_core.map_or(Placement::Unbound, |core| Placement::Fixed(core + index));
            let start = ShardStart {
                index,
                config: config.clone(),
                client: client.clone(),
                clock: Arc::clone(&clock),
                uploader: uploader.clone(),
            };
            let (ready, service) = (ready_tx.clone(), service.clone());
            let service = service.map(|service| (service, serve_rx.clone()));
            let thread = LocalExecutorBuilder::new(placement)
                .name(&format!("nova-shard-{index}"))
                .spawn(move || run_shard(start, rx, ready, service))
                .map_err(|e| Error::internal(format!("start shard {index}: {e}")))?;
            threads.push(thread);
        }
        drop(ready_tx);
        let auditor = Auditor::start(
            store,
            client.control.clone(),
            Arc::clone(&clock),
            config.auditor,
            Arc::clone(&client.auditor),
        );
        let mut node = Node { _lock: lock, client, threads, uploader, auditor: None };
        match auditor {
            Ok(auditor) => node.auditor = Some(auditor),
            Err(error) => {
                node.stop();
                return Err(error);
            }
        }
        for _ in 0..config.shards {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    node.stop();
                    return Err(error);
                }
                Err(_) => {
                    node.stop();
                    return Err(Error::internal("a shard stopped before it was ready"));
                }
            }
        }
        // Only now, with every shard's journal made: a first start that failed or died
        // before it acknowledged nothing, and must not leave a directory that looks as if
        // it had run, whose missing journals would then refuse every later start.
        if !ran_before {
            if let Err(error) = write_manifest(&config) {
                node.stop();
                return Err(error);
            }
            serve_all();
        }
        node.client.recovered.store(true, Ordering::Release);
        Ok(node)
    }

    /// The node's handle.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Stops every shard's service (each finishes what it holds), then every shard
    /// after the requests it holds are answered, and waits for them. The uploader's
    /// drain time (`--uploader-drain-ms`) starts first: requests waiting on a store that
    /// is down are answered unavailable when it is out, so the stop takes at most about
    /// that long, whatever the store does.
    pub fn stop(mut self) {
        self.uploader.drain();
        let mut services = Vec::new();
        for shard in self.client.shards.iter() {
            let (done, stopped) = flume::bounded(1);
            if shard.send(Message::StopService(done)).is_ok() {
                services.push(stopped);
            }
        }
        for stopped in services {
            let _ = stopped.recv();
        }
        for shard in self.client.shards.iter() {
            let _ = shard.send(Message::Stop);
        }
        for thread in self.threads {
            let _ = thread.join();
        }
        // After the services: a long pass of the auditor never delays the stop of
        // accepting.
        if let Some(auditor) = self.auditor.take() {
            auditor.stop();
        }
        // Express chunks still uploading are safe in the journals (the next start
        // uploads them again); what the uploader holds gets its drain time.
        self.uploader.stop();
        // Close the metadata store now, not when the last client clone happens to drop:
        // the next node on this directory needs its lock.
        let _ = futures_lite::future::block_on(self.client.control.store().close());
    }
}

fn io_error(op: &'static str, error: &std::io::Error) -> Error {
    Error::Unavailable { what: format!("the data directory ({op}: {error})") }
}

/// A data directory that has run before has a journal per shard: one that is missing or
/// empty (its disk not mounted, a directory removed) held acknowledged express records
/// not yet in the object store, and a start without it would lose them and hand their
/// sequence numbers out again. Only `accept_journal_loss` starts without them.
fn check_journals_are_there(config: &NodeConfig) -> Result<()> {
    for shard in 0..config.shards {
        let dir = config.journal_dir().join(format!("shard-{shard}"));
        if !Journal::was_opened(&dir) {
            return Err(Error::InvalidOptionValue {
                field: "journal-dir",
                value: config.journal_dir().display().to_string(),
                reason: format!(
                    "the journal of shard {shard} ({}) is missing or empty, but this data \
                     directory has run before: it holds acknowledged express records not yet \
                     in the object store, and a start without it would lose them and hand \
                     their sequence numbers out again. Restore it (is its disk mounted?), or, \
                     if it is gone for good, start once with --accept-journal-loss",
                    dir.display()
                ),
            });
        }
    }
    Ok(())
}

/// The data directory's lock, taken: a second node on the same directory is refused
/// before it touches anything, with a message that says so.
fn lock_data_dir(dir: &Path) -> Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK))
        .map_err(|e| io_error("open its lock file", &e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Unavailable {
            what: format!("the data directory {} (another nova is running on it)", dir.display()),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(io_error("lock it", &e)),
    }
}

/// Checks the data directory's manifest against the layout `config` asks for: the shard
/// count (the journals are per shard) and where the journals are. A manifest from before
/// `--journal-dir` has no journal line; its journals are in the data directory. Whether
/// there was one: the directory has run before (a first start writes it once its shards
/// are ready, [`write_manifest`]).
fn check_manifest(config: &NodeConfig) -> Result<bool> {
    let (dir, shards, journals) = (&config.data_dir, config.shards, config.journal_dir());
    let path = dir.join(MANIFEST);
    let found = match std::fs::read_to_string(&path) {
        Ok(found) => found,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error("read the manifest", &e)),
    };
    let mut lines = found.lines();
    let layout = |field, value: String, reason: String| {
        Err(Error::InvalidOptionValue { field, value, reason })
    };
    if lines.next() != Some(MANIFEST_FORMAT) || lines.next() != Some(&format!("shards {shards}")) {
        let found = found.lines().collect::<Vec<_>>().join("; ");
        return layout(
            "shards",
            shards.to_string(),
            format!(
                "the data directory {} was written with another layout ({found:?}); its journals are per shard",
                dir.display()
            ),
        );
    }
    let kept = match lines.next().and_then(|line| line.strip_prefix("journal ")) {
        Some(kept) => PathBuf::from(kept),
        None => dir.join("journal"),
    };
    if kept != journals {
        return layout(
            "journal-dir",
            journals.display().to_string(),
            format!(
                "the data directory {} keeps its express journals in {} (its manifest); \
                 starting with them elsewhere would leave behind acknowledged records not yet \
                 in the object store: start with --journal-dir {}, or, to move them, stop \
                 nova, move the directory and change the journal line of {}",
                dir.display(),
                kept.display(),
                kept.display(),
                path.display()
            ),
        );
    }
    Ok(true)
}

/// Writes the manifest of [`check_manifest`], durably (renamed into place, its directory
/// synced).
fn write_manifest(config: &NodeConfig) -> Result<()> {
    let (dir, shards, journals) = (&config.data_dir, config.shards, config.journal_dir());
    let manifest = format!("{MANIFEST_FORMAT}\nshards {shards}\njournal {}\n", journals.display());
    let temporary = dir.join(format!("{MANIFEST}.tmp"));
    std::fs::write(&temporary, &manifest)
        .and_then(|()| std::fs::File::open(&temporary)?.sync_all())
        .and_then(|()| std::fs::rename(&temporary, dir.join(MANIFEST)))
        .and_then(|()| std::fs::File::open(dir)?.sync_all())
        .map_err(|e| io_error("write the manifest", &e))
}

/// One shard's executor: recover the journal, then serve until told to stop.
/// What a shard's executor starts from.
struct ShardStart {
    index: usize,
    config: NodeConfig,
    client: Client,
    clock: Arc<dyn Clock>,
    uploader: Uploader,
}

async fn run_shard(
    start: ShardStart,
    inbox: flume::Receiver<Message>,
    ready: flume::Sender<Result<()>>,
    service: Option<(Service, flume::Receiver<()>)>,
) {
    let ShardStart { index, config, client, clock, uploader } = start;
    let control = client.control.clone();
    let dir = config.journal_dir().join(format!("shard-{index}"));
    let opened = async { Journal::open(&dir, config.journal).await };
    let (journal, entries) = match opened.await {
        Ok(opened) => opened,
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    let shard_config = ShardConfig {
        upload_job_bytes_max: config.uploader.bundle_bytes_target,
        refs_wait_max: config.shard.refs_wait_max.min(config.auditor.interval),
        ..config.shard.clone()
    };
    let failed = client.failed.clone();
    let shard = Shard::new(index, shard_config, control, clock, journal, uploader, failed);
    glommio::spawn_local(Rc::clone(&shard).feeder()).detach();
    glommio::spawn_local(Rc::clone(&shard).completer()).detach();
    glommio::spawn_local(Rc::clone(&shard).settler()).detach();
    glommio::spawn_local(Rc::clone(&shard).retention()).detach();
    let owner = {
        let client = client.clone();
        move |id| client.owner(id)
    };
    let recovered = match shard.recover_journal(entries.entries).await {
        Ok(()) => shard.adopt_retained(owner).await,
        Err(error) => Err(error),
    };
    if let Err(error) = recovered {
        let _ = ready.send(Err(error));
        return;
    }
    // What aged out while the node was down goes before anything is served.
    shard.retention_pass().await;
    let flusher = glommio::spawn_local(Rc::clone(&shard).flusher());
    let _ = ready.send(Ok(()));
    let stopping = ServiceStop(Rc::default(), Rc::default());
    // Served once the node says go (`Node::start_with`): on a first start, once every
    // shard is ready and the node is recorded as started (its manifest), so that one
    // that fails acknowledged nothing a later start must find.
    let mut service = service.map(|(service, serve)| {
        let context = ServiceContext { shard: index, client, stopping: stopping.clone() };
        glommio::spawn_local(async move {
            let go = async { serve.recv_async().await.is_ok() };
            let stop = async {
                context.stopping.wait().await;
                false
            };
            if futures_lite::future::or(go, stop).await {
                service(context).await;
            }
        })
        .detach()
    });

    let permits = Rc::new(glommio::sync::Semaphore::new(config.handlers_max));
    // Reads that may wait (long polls, subscription pages) have a pool of their own, as
    // large, taken in their own task, off the loop: idle followers, however many, never
    // hold the permits that appends need, nor stop this loop taking them. Those tasks
    // are bounded by the requests that can be in flight (a connection has one at a
    // time, and connections are limited), and counted so that stopping waits for them.
    let waiting = Rc::new(glommio::sync::Semaphore::new(config.handlers_max));
    // Tasks in hand without a handler permit (those reads; sequenced appends): stopping
    // waits for them too.
    let in_hand = Rc::new(InHand::default());
    while let Ok(message) = inbox.recv_async().await {
        match message {
            Message::Op {
                record,
                op: op @ Op::Read { request: ReadRequest { wait: Some(_), .. }, .. },
                reply,
            } => {
                let (shard, waiting) = (Rc::clone(&shard), Rc::clone(&waiting));
                let held = in_hand.take();
                glommio::spawn_local(async move {
                    if let Ok(permit) = waiting.acquire_static_permit(1).await {
                        let _ = reply.send(shard.handle(*record, op).await);
                        drop(permit);
                    }
                    drop(held);
                })
                .detach();
            }
            // An append session's batch (sequenced: its caller waits only until it has
            // its place) takes no handler permit, which it would hold until durable: a
            // session keeps many batches waiting, and they must not take every handler
            // of the shard. Its session sends its next batch only once this one is
            // sequenced, so sessions (bounded by connections) have one each before that;
            // the ones waiting to be durable are bounded by each session's in-flight
            // bound, and their bytes by the memory budget.
            Message::Op { record, op: op @ Op::Append { sequenced: Some(_), .. }, reply } => {
                let shard = Rc::clone(&shard);
                let held = in_hand.take();
                glommio::spawn_local(async move {
                    let _ = reply.send(shard.handle(*record, op).await);
                    drop(held);
                })
                .detach();
            }
            Message::Op { record, op, reply } => {
                let Ok(permit) = permits.acquire_static_permit(1).await else { break };
                let shard = Rc::clone(&shard);
                glommio::spawn_local(async move {
                    let _ = reply.send(shard.handle(*record, op).await);
                    drop(permit);
                })
                .detach();
            }
            Message::Stats(reply) => {
                let _ = reply.send(shard.stats());
            }
            Message::StopService(done) => {
                stopping.set();
                // Long polls in hand answer now, so the service can finish them.
                shard.close();
                let running = service.take();
                glommio::spawn_local(async move {
                    if let Some(running) = running {
                        running.await;
                    }
                    let _ = done.send(());
                })
                .detach();
            }
            Message::Stop => break,
        }
    }
    shard.close();
    // Answer what is in hand (every handler gives its permit back when done), then let
    // the flusher finish and drop everything the shard holds, its metadata handle too.
    let _ = permits.acquire(config.handlers_max).await;
    in_hand.none().await;
    shard.stop();
    flusher.await;
    // Let express chunks on their way reach the object store, for a bounded time.
    shard.drain_uploads(config.uploader.drain).await;
    debug_assert_eq!(shard.index(), index);
}

/// A shard's tasks in hand that hold no handler permit, counted so that stopping can
/// wait for them.
#[derive(Default)]
struct InHand {
    count: Cell<u64>,
    changed: Notify,
}

impl InHand {
    /// One more, until the returned guard is dropped.
    fn take(self: &Rc<Self>) -> InHandGuard {
        self.count.set(self.count.get() + 1);
        InHandGuard(Rc::clone(self))
    }

    /// Waits until there are none.
    async fn none(&self) {
        loop {
            let seen = self.changed.generation();
            if self.count.get() == 0 {
                return;
            }
            self.changed.changed(seen).await;
        }
    }
}

struct InHandGuard(Rc<InHand>);

impl Drop for InHandGuard {
    fn drop(&mut self) {
        self.0.count.set(self.0.count.get() - 1);
        self.0.changed.notify();
    }
}

impl Client {
    /// Whether every shard has recovered (the node's start is complete).
    pub fn recovered(&self) -> bool {
        self.recovered.load(Ordering::Acquire)
    }

    /// Why a shard stopped acknowledging until a restart, if one has (the first).
    pub fn failed(&self) -> Option<String> {
        self.failed.first()
    }

    /// The control plane, for buckets and the stream verbs that need no leader.
    pub fn control(&self) -> &ControlPlane<RedbMetaStore> {
        &self.control
    }

    /// The shard that leads a stream.
    pub fn owner(&self, id: StreamId) -> usize {
        let hash = u64::from_le_bytes(id.0[..8].try_into().expect("8 of 16 bytes"));
        (hash % self.shards.len() as u64) as usize
    }

    /// Runs `op` on the stream's leader. The address is resolved from the cache when it
    /// can be; a leader that finds no live stream behind the record's ID hands the op
    /// back unused, and it is tried again with a fresh resolve.
    async fn call(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        door: Door,
        op: Op,
    ) -> Result<Reply> {
        self.call_on(bucket, key, door, None, op).await
    }

    /// [`Client::call`], to the stream `only` when given: NotFound if the address names
    /// another.
    async fn call_on(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        door: Door,
        only: Option<StreamId>,
        op: Op,
    ) -> Result<Reply> {
        match self.route(bucket, key, door, only, op, None).await?.1 {
            Routed::Done(result) => result,
            Routed::Sequenced(pending) => pending.reply().await,
        }
    }

    /// Sends `op` to the stream's leader and waits for its answer, or, for an append
    /// with a `sequenced` signal, only until the leader has sequenced it. The stream it
    /// reached, and how.
    async fn route(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        door: Door,
        only: Option<StreamId>,
        mut op: Op,
        sequenced: Option<&flume::Receiver<()>>,
    ) -> Result<(StreamId, Routed)> {
        let address = (bucket.clone(), key.clone());
        for attempt in 0..ATTEMPTS_MAX {
            let cached = if attempt == 0 { self.cached(&address) } else { None };
            let from_cache = cached.is_some();
            let record = match cached {
                Some(record) => record,
                None => {
                    let resolved = match &op {
                        // Resolving may create the stream: an append refused by its
                        // limits, or by the conditions it would meet on the new stream,
                        // leaves no trace (producers.md), not a new stream.
                        Op::Append { request, .. } => {
                            let input = crate::shard::check_append(
                                request,
                                &self.limits,
                                self.entry_max,
                                self.memory_budget,
                            )?;
                            // The arrival time only sets the stamp, never a refusal.
                            let admit = |options: &StreamOptions| {
                                Standing::fresh(options).check(&input, 0).map(drop)
                            };
                            self.control.resolve_admitting(bucket, key, door, &admit).await?
                        }
                        _ => self.control.resolve(bucket, key, door).await?,
                    };
                    let record = resolved.record;
                    self.remember(&address, &record);
                    record
                }
            };
            if only.is_some_and(|id| id != record.id) {
                if from_cache {
                    // The cache may be behind: resolve again before saying so.
                    self.forget(&address);
                    continue;
                }
                return Err(Error::stream_not_found(bucket, key));
            }
            let stream = record.id;
            let answer = self.send(record, op).await?;
            let answered = match sequenced {
                None => answer.recv_async().await,
                Some(sequenced) => {
                    // Sequenced first, or answered first (refused, or handed back); a
                    // signal dropped unused means the answer is on its way.
                    let signalled = async {
                        match sequenced.recv_async().await {
                            Ok(()) => None,
                            Err(_) => std::future::pending().await,
                        }
                    };
                    let answered = async { Some(answer.recv_async().await) };
                    match futures_lite::future::or(signalled, answered).await {
                        Some(answered) => answered,
                        None => {
                            return Ok((stream, Routed::Sequenced(PendingAck::Waiting(answer))));
                        }
                    }
                }
            };
            match answered.map_err(|_| stopped())? {
                Answer::Done(result) => return Ok((stream, Routed::Done(result))),
                Answer::Stale(returned) => {
                    self.forget(&address);
                    op = returned;
                }
            }
        }
        Err(Error::Contended { op: "route to the stream's leader", attempts: ATTEMPTS_MAX })
    }

    /// Hands `op` to the owner of the record's stream; its answer comes on the receiver.
    async fn send(&self, record: StreamRecord, op: Op) -> Result<flume::Receiver<Answer>> {
        let (reply, answer) = flume::bounded(1);
        let owner = self.owner(record.id);
        let message = Message::Op { record: Box::new(record), op, reply };
        self.shards[owner].send_async(message).await.map_err(|_| stopped())?;
        Ok(answer)
    }

    fn cached(&self, address: &(BucketName, StreamKey)) -> Option<StreamRecord> {
        self.resolved.read().ok().and_then(|map| map.get(address).cloned())
    }

    fn remember(&self, address: &(BucketName, StreamKey), record: &StreamRecord) {
        if let Ok(mut map) = self.resolved.write() {
            if map.len() >= RESOLVED_MAX {
                map.clear();
            }
            map.insert(address.clone(), record.clone());
        }
    }

    fn forget(&self, address: &(BucketName, StreamKey)) {
        if let Ok(mut map) = self.resolved.write() {
            map.remove(address);
        }
    }

    /// Appends one batch (creating the stream if its bucket says so).
    pub async fn append(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        request: AppendRequest,
    ) -> Result<AppendAck> {
        match self.call(bucket, key, Door::Append, Op::Append { request, sequenced: None }).await? {
            Reply::Appended(ack) => Ok(ack),
            other => Err(unexpected(&other)),
        }
    }

    /// Appends one batch, returning once the leader has sequenced it: the stream it went
    /// to, and the [`PendingAck`] the acknowledgement comes from once it is durable. A
    /// caller that awaits this before its next append has its batches sequenced in the
    /// order it made them, while they become durable together (an append session). With
    /// `only`, the batch goes to that stream or nowhere (NotFound once the address names
    /// no stream or another one, which is never created); without, the stream is created
    /// if its bucket says so. A refusal (a limit, a condition, a fencing token) is this
    /// call's error: nothing of the batch landed.
    pub async fn append_sequenced(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        only: Option<StreamId>,
        request: AppendRequest,
    ) -> Result<(StreamId, PendingAck)> {
        let (signal, sequenced) = flume::bounded(1);
        let op = Op::Append { request, sequenced: Some(signal) };
        let door = if only.is_some() { Door::Observe } else { Door::Append };
        let (stream, routed) = self.route(bucket, key, door, only, op, Some(&sequenced)).await?;
        let pending = match routed {
            Routed::Done(result) => match result? {
                Reply::Appended(ack) => PendingAck::Ready(ack),
                other => return Err(unexpected(&other)),
            },
            Routed::Sequenced(pending) => pending,
        };
        Ok((stream, pending))
    }

    /// Reads one page (creating the stream if its bucket says so).
    pub async fn read(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        request: ReadRequest,
    ) -> Result<ReadReply> {
        let (op, _asking) = Op::read(request);
        match self.call(bucket, key, Door::Read, op).await? {
            Reply::Read(page) => Ok(page),
            other => Err(unexpected(&other)),
        }
    }

    /// Reads one page of the stream `stream` at the address: NotFound once the address
    /// names no stream or another one (deleted and created anew), and never creates one,
    /// whatever its bucket says (a subscription, which ends when its stream is deleted).
    pub async fn read_existing(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        stream: StreamId,
        request: ReadRequest,
    ) -> Result<ReadReply> {
        let (op, _asking) = Op::read(request);
        match self.call_on(bucket, key, Door::Observe, Some(stream), op).await? {
            Reply::Read(page) => Ok(page),
            other => Err(unexpected(&other)),
        }
    }

    /// ReadPlan: the object-store extents that hold the requested records.
    pub async fn plan(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        request: PlanRequest,
    ) -> Result<ReadPlan> {
        match self.call(bucket, key, Door::Observe, Op::Plan(request)).await? {
            Reply::Plan(plan) => Ok(plan),
            other => Err(unexpected(&other)),
        }
    }

    /// CheckTail.
    pub async fn check_tail(&self, bucket: &BucketName, key: &StreamKey) -> Result<Tail> {
        match self.call(bucket, key, Door::Observe, Op::CheckTail).await? {
            Reply::Tail(tail) => Ok(tail),
            other => Err(unexpected(&other)),
        }
    }

    /// GetStream: the current record, with the tail from its leader.
    pub async fn get_stream(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
    ) -> Result<(StreamRecord, Tail)> {
        let tail = self.check_tail(bucket, key).await?;
        let record = self.control.get_stream(bucket, key).await?;
        Ok((record, tail))
    }

    /// Fence: sets a new token; returns the tail once every earlier batch is durable.
    pub async fn fence(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        token: String,
        expected: Option<String>,
    ) -> Result<Tail> {
        match self.call(bucket, key, Door::Observe, Op::Fence { token, expected }).await? {
            Reply::Tail(tail) => Ok(tail),
            other => Err(unexpected(&other)),
        }
    }

    /// Trim: moves the watermark forward; returns the watermark in force.
    pub async fn trim(&self, bucket: &BucketName, key: &StreamKey, to: TrimTo) -> Result<u64> {
        match self.call(bucket, key, Door::Observe, Op::Trim(to)).await? {
            Reply::Trimmed { trim_seq_num } => Ok(trim_seq_num),
            other => Err(unexpected(&other)),
        }
    }

    /// ReconfigureStream, through the leader so it applies at once.
    pub async fn reconfigure(
        &self,
        bucket: &BucketName,
        key: &StreamKey,
        patch: StreamOptionsPatch,
    ) -> Result<StreamRecord> {
        match self.call(bucket, key, Door::Observe, Op::Reconfigure(patch)).await? {
            Reply::Reconfigured(record) => Ok(*record),
            other => Err(unexpected(&other)),
        }
    }

    /// DeleteStream: through the leader, which fences and drains the stream first.
    /// Deleting a deleted stream succeeds; one that never existed is not found.
    pub async fn delete_stream(&self, bucket: &BucketName, key: &StreamKey) -> Result<()> {
        let address = (bucket.clone(), key.clone());
        self.forget(&address);
        let mut op = Op::Delete;
        for _ in 0..ATTEMPTS_MAX {
            let record = match self.control.resolve(bucket, key, Door::Observe).await {
                Ok(created) => created.record,
                // No live stream at the address: the control plane knows whether one was
                // deleted there (success) or never existed (not found). It deletes
                // nothing: only a leader deletes, after fencing its stream.
                Err(Error::StreamNotFound { .. }) => {
                    return self.control.deleted_before(bucket, key).await.map(drop);
                }
                Err(other) => return Err(other),
            };
            match self.send(record, op).await?.recv_async().await.map_err(|_| stopped())? {
                Answer::Done(result) => return result.map(drop),
                Answer::Stale(returned) => op = returned,
            }
        }
        Err(Error::Contended { op: "delete stream", attempts: ATTEMPTS_MAX })
    }

    /// The auditor's counters and backlog.
    pub fn auditor_stats(&self) -> AuditorStats {
        crate::auditor::snapshot(&self.auditor)
    }

    /// The uploader core's counters (bundles, PUTs, cuts, latencies).
    pub fn uploader_stats(&self) -> crate::uploader::UploaderStats {
        self.uploader.stats()
    }

    /// Each shard's counters.
    pub async fn stats(&self) -> Result<Vec<ShardStats>> {
        let mut all = Vec::with_capacity(self.shards.len());
        for shard in self.shards.iter() {
            let (reply, answer) = flume::bounded(1);
            shard.send_async(Message::Stats(reply)).await.map_err(|_| stopped())?;
            all.push(answer.recv_async().await.map_err(|_| stopped())?);
        }
        Ok(all)
    }
}

/// Where an op stands once [`Client::route`] returns.
enum Routed {
    Done(Result<Reply>),
    /// An append sequenced by its leader, not yet answered.
    Sequenced(PendingAck),
}

/// An append its leader has sequenced: its acknowledgement, once durable.
#[derive(Debug)]
pub enum PendingAck {
    /// Its leader's answer is still to come.
    Waiting(flume::Receiver<Answer>),
    /// Answered already (durable before the signal was seen).
    Ready(AppendAck),
}

impl PendingAck {
    /// The acknowledgement once the batch is durable, or why it never will be.
    pub async fn durable(self) -> Result<AppendAck> {
        match self.reply().await? {
            Reply::Appended(ack) => Ok(ack),
            other => Err(unexpected(&other)),
        }
    }

    async fn reply(self) -> Result<Reply> {
        let answer = match self {
            PendingAck::Ready(ack) => return Ok(Reply::Appended(ack)),
            PendingAck::Waiting(answer) => answer,
        };
        match answer.recv_async().await.map_err(|_| stopped())? {
            Answer::Done(result) => result,
            // A leader sequences only an append it keeps.
            Answer::Stale(_) => Err(Error::internal("a sequenced append came back unused")),
        }
    }
}

fn stopped() -> Error {
    Error::unavailable("the node (it is stopping)")
}

fn unexpected(reply: &Reply) -> Error {
    Error::internal(format!("a leader answered with {reply:?}"))
}
