//! Every knob of nova: its name, flag, environment variable, default, range, unit and
//! the reason for the default. `nova serve --help` and `docs/tuning.md` are generated
//! from [`KNOBS`]; a test fails when the doc drifts.
//!
//! A value comes from the flag, else the environment variable, else the default, and is
//! refused with a message naming the flag and its range when it is out of range.
//!
//! This crate is a leaf: it knows no other nova crate, so every crate can read its
//! defaults.

use std::fmt::Write as _;

/// What a knob's number measures, and how its values are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Bytes; accepts `KiB`, `MiB`, `GiB` suffixes.
    Bytes,
    /// A plain count.
    Count,
    /// Milliseconds; accepts `ms`, `s`, `m`, `h`, `d` suffixes.
    Milliseconds,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Count => "count",
            Unit::Milliseconds => "ms",
        }
    }
}

/// One tunable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knob {
    /// The flag without dashes, e.g. `record-bytes-max`.
    pub flag: &'static str,
    /// The environment variable, e.g. `NOVA_RECORD_BYTES_MAX`.
    pub env: &'static str,
    pub unit: Unit,
    pub default: u64,
    pub min: u64,
    pub max: u64,
    /// What it governs.
    pub help: &'static str,
    /// Why the default is what it is.
    pub reason: &'static str,
}

/// The per-record cap on content bytes (limits.md), inclusive.
pub const RECORD_BYTES_MAX: Knob = Knob {
    flag: "record-bytes-max",
    env: "NOVA_RECORD_BYTES_MAX",
    unit: Unit::Bytes,
    default: 1 << 20,
    min: 1,
    max: 16 << 20,
    help: "largest record accepted, in content bytes (body plus header names and values)",
    reason: "1 MiB is the documented cap (limits.md); above 16 MiB one record would exceed a binary read page",
};

/// The size of each express journal segment file, which is also the largest journal
/// entry (an entry never spans segments). Must be a whole number of 4 KiB blocks.
pub const JOURNAL_SEGMENT_BYTES: Knob = Knob {
    flag: "journal-segment-bytes",
    env: "NOVA_JOURNAL_SEGMENT_BYTES",
    unit: Unit::Bytes,
    default: 256 << 20,
    min: 1 << 20,
    max: 1 << 30,
    help: "size of each preallocated express journal segment file, and the largest journal entry (a chunk plus 64 bytes, padded to 4 KiB); a batch that needs a larger entry is refused",
    reason: "256 MiB takes the largest valid batch (100 MiB of content plus its framing and directory) as one entry, and makes a segment roll (preallocate and two syncs) rare next to the writes",
};

/// How many released journal segments are kept (renamed ahead of the head) for reuse.
pub const JOURNAL_SPARE_SEGMENTS: Knob = Knob {
    flag: "journal-spare-segments",
    env: "NOVA_JOURNAL_SPARE_SEGMENTS",
    unit: Unit::Count,
    default: 2,
    min: 0,
    max: 64,
    help: "released express journal segments kept for reuse instead of deleted",
    reason: "a reused segment skips the preallocation at a roll, and its blocks are already written, so O_DIRECT writes into it need no extent conversion before their flush; two cover a roll while the uploader releases the next",
};

/// Journal groups one shard keeps syncing while it writes the next.
pub const JOURNAL_SYNCS_IN_FLIGHT_MAX: Knob = Knob {
    flag: "journal-syncs-in-flight-max",
    env: "NOVA_JOURNAL_SYNCS_IN_FLIGHT_MAX",
    unit: Unit::Count,
    default: 4,
    min: 1,
    max: 64,
    help: "express journal groups whose flush (fdatasync, or a one-entry group's O_DSYNC write) may be in flight while the shard writes the next group; groups are still acknowledged in order, and 1 writes and syncs one group at a time",
    reason: "a group commit then costs the longer of its writes and its flush, not their sum; on the 2-core VM, 4 against 1 raised binary 64-record appends over HTTP by 8-15% (bench http), after which the shard's core is the limit",
};

/// Shard executors: one per core. 0 picks every core but one (the uploader's), at
/// least one.
pub const SHARDS: Knob = Knob {
    flag: "shards",
    env: "NOVA_SHARDS",
    unit: Unit::Count,
    default: 0,
    min: 0,
    max: 256,
    help: "shard executors, one per core (0: every core but the uploader's, at least one); fixed for a data directory",
    reason: "the design card's thread-per-core shape: one core is left to the uploader and the metadata thread",
};

/// Whether shards and the uploader are pinned to cores of their own.
pub const PIN_CORES: Knob = Knob {
    flag: "pin-cores",
    env: "NOVA_PIN_CORES",
    unit: Unit::Count,
    default: 0,
    min: 0,
    max: 1,
    help: "1: pin shard i to the i-th core nova may run on and the uploader to the next, if there is one (the cores must be consecutive, and at least one per shard); 0: leave the threads to the kernel's scheduler",
    reason: "pinning keeps a shard's caches and io_uring on one core, which a machine given to nova wants; a shared machine, or one whose other work moves around, is better left to the scheduler",
};

/// The memory budget of one shard over stored bytes held, with each record's 12-byte
/// directory entry (sequenced but not yet durable, and cached durable chunks).
pub const SHARD_MEMORY_BYTES: Knob = Knob {
    flag: "shard-memory-bytes",
    env: "NOVA_SHARD_MEMORY_BYTES",
    unit: Unit::Bytes,
    default: 1 << 30,
    min: 16 << 20,
    max: 1 << 40,
    help: "stored bytes one shard holds in memory, with 12 bytes a record for its directory entry (unsettled batches plus cached chunks); appends past it get resource_exhausted, and a batch larger than all of it is refused (invalid_argument)",
    reason: "1 GiB holds several seconds of ingest at disk speed plus a useful read cache, on machines with a few GiB per core; a new process fills it with memory touched for the first time, which on some virtual machines costs seconds of CPU per GiB (docs/benchmarks.md), so its first GiB of ingest is slower (nova_shard_memory_bytes_held shows when the budget is full)",
};

/// Freed chunk buffers kept for reuse, per process.
pub const BUFFER_POOL_BYTES: Knob = Knob {
    flag: "buffer-pool-bytes",
    env: "NOVA_BUFFER_POOL_BYTES",
    unit: Unit::Bytes,
    default: 256 << 20,
    min: 0,
    max: 1 << 40,
    help: "bytes of freed 4 KiB-aligned buffers (chunks, bundle and settled object bodies) the process keeps to hand out again instead of allocating; when full the oldest kept go first; 0 frees every buffer at once",
    reason: "a fresh buffer's first write faults once per 4 KiB page (a fifth of the shard's time under express appends, perf); 256 MiB holds what is in flight at disk speed (8 bundles of 8 MiB, two settled objects of 32 MiB and more): at 64 MiB each settled body was allocated anew and the uploader took 95% of the process's page faults",
};

/// The buffer an express stream's open chunk starts with.
pub const EXPRESS_CHUNK_BYTES: Knob = Knob {
    flag: "express-chunk-bytes",
    env: "NOVA_EXPRESS_CHUNK_BYTES",
    unit: Unit::Bytes,
    default: 256 << 10,
    min: 8 << 10,
    max: 64 << 20,
    help: "buffer size an express stream's open chunk starts with (a larger batch gets a buffer of its own size)",
    reason: "express chunks are cut at every group commit, so a buffer holds the batches of one group: 256 KiB holds a 256-record batch of 1 KiB records in one write",
};

/// Requests queued for one shard before senders wait.
pub const SHARD_INBOX_DEPTH: Knob = Knob {
    flag: "shard-inbox-depth",
    env: "NOVA_SHARD_INBOX_DEPTH",
    unit: Unit::Count,
    default: 1024,
    min: 16,
    max: 1 << 16,
    help: "requests queued for one shard before senders wait (a bounded cross-core channel)",
    reason: "deep enough that pipelining producers never wait on the queue at disk speed, small enough to bound what a stalled shard holds",
};

/// Requests one shard handles at once.
pub const SHARD_HANDLERS_MAX: Knob = Knob {
    flag: "shard-handlers-max",
    env: "NOVA_SHARD_HANDLERS_MAX",
    unit: Unit::Count,
    default: 4096,
    min: 16,
    max: 1 << 20,
    help: "requests one shard works on at once (unacknowledged appends included, but not an append session's batches: a session sends one at a time until it is sequenced, and the memory budget and --http-session-in-flight-max bound those waiting to be durable); reads that may wait (long polls, subscription pages) have a second pool of this size, so idle followers never hold up appends",
    reason: "each waiting request costs a task and little memory; the memory budget, not this, bounds the bytes they hold",
};

/// The base timeout of one S3 request attempt, before its bytes are counted.
pub const S3_ATTEMPT_TIMEOUT_MS: Knob = Knob {
    flag: "s3-attempt-timeout-ms",
    env: "NOVA_S3_ATTEMPT_TIMEOUT_MS",
    unit: Unit::Milliseconds,
    default: 2_000,
    min: 100,
    max: 600_000,
    help: "time one S3 request attempt may take, plus its bytes at --s3-transfer-bytes-per-second-min; a slower attempt is cut off and retried",
    reason: "ten times S3's usual p99 for small requests, so only a stuck attempt is cut, and a stuck PUT is re-sent within seconds instead of waited on",
};

/// The slowest transfer an S3 attempt is allowed before it times out.
pub const S3_TRANSFER_BYTES_PER_SECOND_MIN: Knob = Knob {
    flag: "s3-transfer-bytes-per-second-min",
    env: "NOVA_S3_TRANSFER_BYTES_PER_SECOND_MIN",
    unit: Unit::Bytes,
    default: 8 << 20,
    min: 64 << 10,
    max: 10 << 30,
    help: "bytes per second an S3 attempt must at least move: each attempt's timeout grows by one second per this many bytes it sends or receives",
    reason: "8 MiB/s gives an 8 MiB part one extra second, slow enough for several uploads sharing a modest link, fast enough that a stalled transfer is noticed",
};

/// Attempts per S3 request, the first included.
pub const S3_ATTEMPTS_MAX: Knob = Knob {
    flag: "s3-attempts-max",
    env: "NOVA_S3_ATTEMPTS_MAX",
    unit: Unit::Count,
    default: 4,
    min: 1,
    max: 20,
    help: "attempts per S3 request (the first included) on timeouts, connection failures, 5xx and throttling; then the call fails as unavailable",
    reason: "rides out a dropped connection or a throttling burst (the default pauses add up to at most 0.35 s); a longer outage is the uploader's to wait out, since it retries whole uploads",
};

/// The backoff ceiling before the second attempt of an S3 request.
pub const S3_BACKOFF_INITIAL_MS: Knob = Knob {
    flag: "s3-backoff-initial-ms",
    env: "NOVA_S3_BACKOFF_INITIAL_MS",
    unit: Unit::Milliseconds,
    default: 50,
    min: 1,
    max: 60_000,
    help: "backoff ceiling before an S3 request's second attempt; it doubles per attempt up to --s3-backoff-max-ms, and each pause is a random point in the ceiling's upper half",
    reason: "a few S3 round trips: long enough for a throttled prefix to recover, short enough that an append waiting on the PUT barely notices",
};

/// The largest backoff ceiling between attempts of an S3 request.
pub const S3_BACKOFF_MAX_MS: Knob = Knob {
    flag: "s3-backoff-max-ms",
    env: "NOVA_S3_BACKOFF_MAX_MS",
    unit: Unit::Milliseconds,
    default: 1_000,
    min: 1,
    max: 600_000,
    help: "largest backoff ceiling between attempts of one S3 request",
    reason: "caps the wait at a second, so raising --s3-attempts-max lengthens the retry window linearly, not exponentially",
};

/// Objects above this size are written to S3 with a multipart upload.
pub const S3_MULTIPART_THRESHOLD_BYTES: Knob = Knob {
    flag: "s3-multipart-threshold-bytes",
    env: "NOVA_S3_MULTIPART_THRESHOLD_BYTES",
    unit: Unit::Bytes,
    default: 16 << 20,
    min: 5 << 20,
    max: 5 << 30,
    help: "objects larger than this are written to S3 in parts (a multipart upload: two requests more than its parts); at most 5 GiB, S3's largest single PUT",
    reason: "transit bundles stay one PUT (one request each); settled objects above it go in concurrent parts, and a failed part is re-sent alone",
};

/// The size of each part of an S3 multipart upload but the last.
pub const S3_MULTIPART_PART_BYTES: Knob = Knob {
    flag: "s3-multipart-part-bytes",
    env: "NOVA_S3_MULTIPART_PART_BYTES",
    unit: Unit::Bytes,
    default: 8 << 20,
    min: 5 << 20,
    max: 5 << 30,
    help: "size of each part of an S3 multipart upload but the last (S3 allows 5 MiB to 5 GiB, and 10,000 parts)",
    reason: "8 MiB parts send a 64 MiB settled object in 8 requests, four at a time, and a retried part costs at most 8 MiB again",
};

/// Parts of one S3 multipart upload in flight at once.
pub const S3_MULTIPART_CONCURRENCY: Knob = Knob {
    flag: "s3-multipart-concurrency",
    env: "NOVA_S3_MULTIPART_CONCURRENCY",
    unit: Unit::Count,
    default: 4,
    min: 1,
    max: 64,
    help: "parts of one S3 multipart upload sent at once",
    reason: "four streams of 8 MiB fill a few Gbit/s to S3 while bounding one upload's memory in flight to the object itself",
};

/// File operations the local-directory object store runs at once.
pub const LOCAL_STORE_IO_CONCURRENCY: Knob = Knob {
    flag: "local-store-io-concurrency",
    env: "NOVA_LOCAL_STORE_IO_CONCURRENCY",
    unit: Unit::Count,
    default: 8,
    min: 1,
    max: 256,
    help: "puts, gets, heads, lists and deletes the local-directory object store runs at once (each holds a blocking thread; the rest wait their turn)",
    reason: "enough to overlap the fsyncs of concurrent puts on one disk, few enough to bound the blocking threads the store occupies",
};

/// The largest single write the local-directory object store makes of an object.
pub const LOCAL_STORE_WRITE_BYTES: Knob = Knob {
    flag: "local-store-write-bytes",
    env: "NOVA_LOCAL_STORE_WRITE_BYTES",
    unit: Unit::Bytes,
    default: 1 << 20,
    min: 4 << 10,
    max: 1 << 30,
    help: "the local-directory object store writes a larger object (and reads a large range of one) in pieces of this size, one after the other, so the disk's queue holds at most one piece of it ahead of the express journal's writes (rounded down to 4 KiB)",
    reason: "an 8 MiB bundle or a 32 MiB settled object written at once queued tens of block requests before every journal write on the same disk; in 1 MiB pieces, interleaved loadgen runs here cut express p99 ack latency from 28-31 to 17-19 ms and raised throughput 5-13%",
};

/// The size at which the uploader closes a transit bundle and sends it.
pub const BUNDLE_BYTES_TARGET: Knob = Knob {
    flag: "bundle-bytes-target",
    env: "NOVA_BUNDLE_BYTES_TARGET",
    unit: Unit::Bytes,
    default: 8 << 20,
    min: 64 << 10,
    max: 1 << 30,
    help: "size at which the uploader closes a transit bundle and PUTs it (a single larger request gets a bundle of its own); --bundle-delay-ms closes smaller ones",
    reason: "8 MiB amortises a PUT's request cost over many chunks and stays below the 16 MiB multipart threshold, so a bundle is one request",
};

/// How long the uploader waits for more chunks before it sends a bundle.
pub const BUNDLE_DELAY_MS: Knob = Knob {
    flag: "bundle-delay-ms",
    env: "NOVA_BUNDLE_DELAY_MS",
    unit: Unit::Milliseconds,
    default: 10,
    min: 0,
    max: 10_000,
    help: "longest a chunk waits in the uploader for others to share its transit bundle, counted from the first chunk of the bundle",
    reason: "a standard append waits this plus one PUT: 10 ms adds little to a PUT's own tens of milliseconds and still packs every chunk of a busy node's 10 ms into one object",
};

/// The smallest bundle of one stream's chunks alone written as its settled object.
pub const DIRECT_SETTLE_BYTES_MIN: Knob = Knob {
    flag: "direct-settle-bytes-min",
    env: "NOVA_DIRECT_SETTLE_BYTES_MIN",
    unit: Unit::Bytes,
    default: 4 << 20,
    min: 4 << 10,
    max: 1 << 30,
    help: "a bundle the uploader cuts from one stream's chunks alone, back to back by sequence number, of at least this many bytes, is written straight as that stream's settled object instead of a transit bundle (never rewritten later); set it above bundle-bytes-target to always write transit bundles",
    reason: "a stream busy enough to fill a bundle on its own had every byte written to the store twice, into a transit bundle and again into its settled object; 4 MiB, the settle-early-bytes-min floor, keeps settled objects from being smaller than the early settles already make them",
};

/// Transit bundle PUTs in flight at once.
pub const UPLOADS_IN_FLIGHT_MAX: Knob = Knob {
    flag: "uploads-in-flight-max",
    env: "NOVA_UPLOADS_IN_FLIGHT_MAX",
    unit: Unit::Count,
    default: 8,
    min: 1,
    max: 256,
    help: "transit bundle PUTs the uploader has in flight at once; past it, bundles wait and then shards wait on the uploader's queue",
    reason: "eight 8 MiB PUTs keep a few Gbit/s to S3 busy while bounding the bundle bytes held in flight to 64 MiB",
};

/// Ranged GETs of object storage in flight at once (reads of history no shard holds).
pub const OBJECT_READS_IN_FLIGHT_MAX: Knob = Knob {
    flag: "object-reads-in-flight-max",
    env: "NOVA_OBJECT_READS_IN_FLIGHT_MAX",
    unit: Unit::Count,
    default: 32,
    min: 1,
    max: 1024,
    help: "ranged GETs of chunks in object storage the uploader core has in flight at once; past it, reads of history wait",
    reason: "catch-up readers fetch one chunk per GET; 32 in flight hide S3's first-byte latency (tens of ms) without letting history reads starve bundle PUTs of connections",
};

/// Upload requests one shard has in flight before its flusher waits.
pub const SHARD_UPLOADS_IN_FLIGHT_MAX: Knob = Knob {
    flag: "shard-uploads-in-flight-max",
    env: "NOVA_SHARD_UPLOADS_IN_FLIGHT_MAX",
    unit: Unit::Count,
    default: 16,
    min: 1,
    max: 1024,
    help: "upload requests (each a group of chunks, then its refs) one shard has in flight; results are applied in order, so a stream's chunks become durable in sequence",
    reason: "standard acks wait one bundle delay plus a PUT (tens of ms); 16 groups in flight keep a shard's producers pipelined across that wait while bounding what a stalled store holds",
};

/// The size a settled object is cut at.
pub const SETTLE_TARGET_BYTES: Knob = Knob {
    flag: "settle-target-bytes",
    env: "NOVA_SETTLE_TARGET_BYTES",
    unit: Unit::Bytes,
    default: 32 << 20,
    min: 64 << 10,
    max: 1 << 30,
    help: "a stream's history in transit bundles is rewritten into a settled object of its own once this much has gathered (or once it is settle-age-ms old, or about to leave the shard's cache)",
    reason: "32 MiB objects make a catch-up read a few large GETs and keep per-object request costs negligible, while one settle holds at most 32 MiB in memory per shard",
};

/// How long history may stay in transit bundles before it is settled below the target.
pub const SETTLE_AGE_MS: Knob = Knob {
    flag: "settle-age-ms",
    env: "NOVA_SETTLE_AGE_MS",
    unit: Unit::Milliseconds,
    default: 300_000,
    min: 0,
    max: 86_400_000,
    help: "history older than this in transit bundles is settled even when less than settle-target-bytes has gathered, so slow streams free their bundles too",
    reason: "five minutes lets busy streams reach the target size first, and bounds how long a quiet stream keeps a bundle (shared with other streams) alive",
};

/// How often each shard looks for history to settle.
pub const SETTLE_INTERVAL_MS: Knob = Knob {
    flag: "settle-interval-ms",
    env: "NOVA_SETTLE_INTERVAL_MS",
    unit: Unit::Milliseconds,
    default: 1_000,
    min: 10,
    max: 3_600_000,
    help: "how often each shard's settling duty looks at its streams for transit history ready to settle",
    reason: "a second is far below the settle age and target fill times, and the check is a walk over in-memory chunk lists",
};

/// The smallest run settled early, before its chunks leave the shard's cache.
pub const SETTLE_EARLY_BYTES_MIN: Knob = Knob {
    flag: "settle-early-bytes-min",
    env: "NOVA_SETTLE_EARLY_BYTES_MIN",
    unit: Unit::Bytes,
    default: 4 << 20,
    min: 4 << 10,
    max: 1 << 30,
    help: "a run of transit history shorter than settle-target-bytes is settled early, while still in the shard's cache, when its chunks are about to be evicted, but only from this size on; shorter runs wait for the target or settle-age-ms (and are read back then)",
    reason: "with 100 busy streams sharing a 1 GiB cache, runs leave the cache at about 10 MiB each and were read back one GET per chunk; a floor of 4 MiB keeps those from memory while a quiet stream's few records do not become an object of their own every few seconds",
};

/// Chunks one read page may load.
pub const READ_PAGE_LOADS_MAX: Knob = Knob {
    flag: "read-page-loads-max",
    env: "NOVA_READ_PAGE_LOADS_MAX",
    unit: Unit::Count,
    default: 16,
    min: 1,
    max: 1024,
    help: "chunks not in memory that one read page loads (from the journal or the object store, one after the other) before it ends at the next one; a page's record and byte limits end it first",
    reason: "at 1, a read of history not in memory (after a restart, or past the cache) got one chunk per page: a reader catching up on one-record batches made a round trip per record. 16 fill a page of the largest size from express chunks of the default size, and bound how long one page takes",
};

/// Settles one shard runs at once.
pub const SETTLES_IN_FLIGHT_MAX: Knob = Knob {
    flag: "settles-in-flight-max",
    env: "NOVA_SETTLES_IN_FLIGHT_MAX",
    unit: Unit::Count,
    default: 2,
    min: 1,
    max: 64,
    help: "settled objects one shard builds at once (each holds up to twice settle-target-bytes in memory: its slots and the assembled object)",
    reason: "a settle is a read of its slots, then a PUT, then a refs commit, one after the other; two in flight overlap one's reads with the other's PUT, which a single settle left idle (a busy stream's history then piles up in transit bundles: measured on the local store at 200+ MiB/s)",
};

/// How often each shard applies its streams' age retention.
pub const RETENTION_INTERVAL_MS: Knob = Knob {
    flag: "retention-interval-ms",
    env: "NOVA_RETENTION_INTERVAL_MS",
    unit: Unit::Milliseconds,
    default: 500,
    min: 10,
    max: 3_600_000,
    help: "how often each shard moves the trim watermark of streams with retention_max_age_ms past the records that have aged out",
    reason: "retention acts within a second of a record's expiry (decisions.md): a check every half second leaves the pass itself the other half, and each is a walk over in-memory chunk lists, so a quiet stream trims on time like a busy one",
};

/// How long an object no ref names stays in the store before the auditor deletes it.
pub const AUDITOR_READ_GRACE: Knob = Knob {
    flag: "auditor-read-grace",
    env: "NOVA_AUDITOR_READ_GRACE",
    unit: Unit::Milliseconds,
    default: 600_000,
    min: 0,
    max: 604_800_000,
    help: "time from the moment the auditor marks an object dead (no ref names it) to its deletion, e.g. 10m (the name retention.md gives it, so it has no -ms); readers holding a ReadPlan or a fetch in flight keep working through it",
    reason: "ten minutes (operations.md) outlasts any fetch and a ReadPlan client's usual work, while trimmed history stops costing storage soon after",
};

/// Time between the auditor's passes.
pub const AUDITOR_INTERVAL_MS: Knob = Knob {
    flag: "auditor-interval-ms",
    env: "NOVA_AUDITOR_INTERVAL_MS",
    unit: Unit::Milliseconds,
    default: 30_000,
    min: 10,
    max: 86_400_000,
    help: "time between the auditor's passes (each lists the store and reads every ref); an object is marked dead only after two passes find it unreferenced",
    reason: "a pass costs a listing of the store; every 30 s keeps that cheap and is far below the read grace, and two passes apart is far longer than a bundle's PUT-to-refs window",
};

/// Upload requests queued for the uploader before shards wait.
pub const UPLOADER_QUEUE_DEPTH: Knob = Knob {
    flag: "uploader-queue-depth",
    env: "NOVA_UPLOADER_QUEUE_DEPTH",
    unit: Unit::Count,
    default: 1024,
    min: 1,
    max: 1 << 16,
    help: "upload requests (each one shard's chunks of one flush) queued for the uploader before the shards sending them wait",
    reason: "like --shard-inbox-depth: deep enough that shards never wait on the queue while the store keeps up; the shards' memory budget bounds the bytes behind it",
};

/// The first pause before a failed bundle PUT is sent again.
pub const UPLOAD_BACKOFF_INITIAL_MS: Knob = Knob {
    flag: "upload-backoff-initial-ms",
    env: "NOVA_UPLOAD_BACKOFF_INITIAL_MS",
    unit: Unit::Milliseconds,
    default: 100,
    min: 1,
    max: 60_000,
    help: "backoff ceiling before a failed transit bundle PUT is sent again; it doubles per failure up to --upload-backoff-max-ms, and each pause is a random point in the ceiling's upper half",
    reason: "the object store client already retried within the call (--s3-attempts-max), so a failure here is an outage: a tenth of a second before the first whole retry",
};

/// The largest pause between sends of a failed bundle PUT.
pub const UPLOAD_BACKOFF_MAX_MS: Knob = Knob {
    flag: "upload-backoff-max-ms",
    env: "NOVA_UPLOAD_BACKOFF_MAX_MS",
    unit: Unit::Milliseconds,
    default: 5_000,
    min: 1,
    max: 600_000,
    help: "largest backoff ceiling between sends of a failed transit bundle PUT; the uploader retries while it runs, so this is how soon appends resume after the store returns",
    reason: "appends resume within five seconds of the store's return, while an outage costs the store one request per bundle every few seconds",
};

/// How long a stopping node keeps retrying what its uploader holds, from the stop's start.
pub const UPLOADER_DRAIN_MS: Knob = Knob {
    flag: "uploader-drain-ms",
    env: "NOVA_UPLOADER_DRAIN_MS",
    unit: Unit::Milliseconds,
    default: 30_000,
    min: 0,
    max: 3_600_000,
    help: "how long a stopping node keeps sending what its uploader holds, counted from the signal: the uploader sends it at once, and what is still not durable then (appends to standard streams, settled objects) is answered unavailable, so a stop never waits on a store that is down for longer",
    reason: "half a minute rides out a short outage at shutdown without making a stop hang on a store that is down",
};

/// At a graceful stop, how long a connection may sit idle before it is closed.
pub const HTTP_SHUTDOWN_IDLE_MS: Knob = Knob {
    flag: "http-shutdown-idle-ms",
    env: "NOVA_HTTP_SHUTDOWN_IDLE_MS",
    unit: Unit::Milliseconds,
    default: 1_000,
    min: 100,
    max: 600_000,
    help: "once a graceful stop begins, --http-idle-timeout-ms becomes this (when shorter): a connection that has sent no request, or still sends its head, or whose client has taken no byte of an answer for this long, is closed; requests being answered are not cut",
    reason: "a stop should not wait two minutes for a pooled connection that never sends a request, or a subscriber that stopped reading; a second covers a request head already on its way",
};

/// Connections one shard serves at once; the next waits in the listen backlog.
pub const HTTP_CONNECTIONS_MAX: Knob = Knob {
    flag: "http-connections-max",
    env: "NOVA_HTTP_CONNECTIONS_MAX",
    unit: Unit::Count,
    default: 1024,
    min: 1,
    max: 1 << 20,
    help: "HTTP connections one shard serves at once; a shard at the limit stops accepting until one closes (the kernel's backlog holds the rest)",
    reason: "an idle keep-alive connection costs a task and a few KiB, so 1024 per core covers many producers and subscribers while bounding what a flood of connections can hold",
};

/// Issued tokens a node keeps (docs/auth.md).
pub const TOKENS_MAX: Knob = Knob {
    flag: "tokens-max",
    env: "NOVA_TOKENS_MAX",
    unit: Unit::Count,
    default: 10_000,
    min: 1,
    max: 1_000_000,
    help: "issued tokens the node keeps, expired ones aside (they are purged to make room); issuing past it is refused until some are revoked",
    reason: "every shard holds every token in memory (a few hundred bytes each), so 10,000 tokens cost a few MiB per node, far more than a service's callers need",
};

/// The largest request body the server reads.
pub const HTTP_BODY_BYTES_MAX: Knob = Knob {
    flag: "http-body-bytes-max",
    env: "NOVA_HTTP_BODY_BYTES_MAX",
    unit: Unit::Bytes,
    default: 160 << 20,
    min: 1 << 20,
    max: 1 << 30,
    help: "largest append body in the binary framing (JSON: --http-json-body-bytes-max; any other body: 1 MiB); a larger one is refused (invalid_argument) from its Content-Length, or as soon as the bytes read pass it, before it is held whole",
    reason: "the largest valid batch is 100 MiB of content, and the framing adds a few bytes a record and a header (at most 100,000 records): 160 MiB takes every valid batch",
};

/// The largest JSON append body the server reads.
pub const HTTP_JSON_BODY_BYTES_MAX: Knob = Knob {
    flag: "http-json-body-bytes-max",
    env: "NOVA_HTTP_JSON_BODY_BYTES_MAX",
    unit: Unit::Bytes,
    default: 768 << 20,
    min: 1 << 20,
    max: 4 << 30,
    help: "largest JSON append body; a larger one is refused (invalid_argument) from its Content-Length, or as soon as the bytes read pass it; the content limits (limits.md) apply to the records it holds",
    reason: "limits count content, never encoding overhead (limits.md): a body byte written as \\u0001 is 6 bytes of JSON, a one-byte header [\"\\u0001\",\"\"] 14 (at most 10 million of them), and a record's envelope about 60 (at most 100,000), so the largest valid batch in compact JSON is about 715 MB, within 768 MiB (base64 with every character written as a \\u escape is 8 bytes a byte, and can pass it: such a batch is refused naming this flag)",
};

/// Request body bytes one shard holds at once.
pub const HTTP_BODY_MEMORY_BYTES: Knob = Knob {
    flag: "http-body-memory-bytes",
    env: "NOVA_HTTP_BODY_MEMORY_BYTES",
    unit: Unit::Bytes,
    default: 2 << 30,
    min: 2 << 20,
    max: 1 << 40,
    help: "request body bytes one shard holds at once: each body as its bytes arrive, and once more when joined for the JSON parser, until its request is answered; a body that could not be held now is refused (resource_exhausted, Retry-After) from its Content-Length before it is read, else when a piece would pass it; at least --http-body-bytes-max and twice --http-json-body-bytes-max",
    reason: "--http-connections-max connections, each sending a body at its limit, could otherwise hold hundreds of GiB; 2 GiB takes one largest JSON append (held twice) or thousands of usual ones, beside --shard-memory-bytes",
};

/// Batches of one append session sequenced and not yet acknowledged.
pub const HTTP_SESSION_IN_FLIGHT_MAX: Knob = Knob {
    flag: "http-session-in-flight-max",
    env: "NOVA_HTTP_SESSION_IN_FLIGHT_MAX",
    unit: Unit::Count,
    default: 1024,
    min: 1,
    max: 1 << 20,
    help: "batches of one append session (a streamed append request) sequenced and not yet acknowledged; at the limit the session takes no further batch until the oldest is acknowledged, so its producer is slowed by TCP rather than refused; each batch's bytes are also held in --http-body-memory-bytes, as they arrive, until it is acknowledged",
    reason: "a session's batches become durable together, so its throughput is what it has in flight per acknowledgement latency: 1024 batches in a standard stream's 250 ms batch delay is about 4,000 batches a second from one producer, while an idle or slow session holds at most this many acknowledgements' state",
};

/// Response bytes one shard holds at once.
pub const HTTP_RESPONSE_MEMORY_BYTES: Knob = Knob {
    flag: "http-response-memory-bytes",
    env: "NOVA_HTTP_RESPONSE_MEMORY_BYTES",
    unit: Unit::Bytes,
    default: 1 << 30,
    min: 16 << 20,
    max: 1 << 40,
    help: "read and subscription page bytes one shard holds at once, each page from when it is read until its client has taken its last byte; a read is cut to the records that fit what is free, and refused (resource_exhausted, Retry-After) when under 64 KiB is free or its first record alone does not fit; a subscription waits for room, with heartbeats; a page larger than this is sent alone",
    reason: "--http-connections-max connections, each with a page of up to 16 MiB (a read) or six (a subscription) its client is slow to take, could otherwise hold tens of GiB; 1 GiB keeps a shard's slow readers beside --shard-memory-bytes while fast ones never meet it",
};

/// The largest request head nova reads a request from.
pub const HTTP_HEAD_BYTES_MAX: Knob = Knob {
    flag: "http-head-bytes-max",
    env: "NOVA_HTTP_HEAD_BYTES_MAX",
    unit: Unit::Bytes,
    default: 64 << 10,
    min: 8 << 10,
    max: 256 << 10,
    help: "largest HTTP request head (the request target plus every header name and value); a larger one is refused (invalid_argument) naming this limit, before the request is routed; past about 400 KiB the HTTP library itself answers 431",
    reason: "nova's requests carry a token, a content type and a request id, well under 1 KiB; 64 KiB passes any proxy's headers (most stop at 8-64 KiB) and bounds what a connection holds before its body",
};

/// How long a connection may go without a request being answered on it.
pub const HTTP_IDLE_TIMEOUT_MS: Knob = Knob {
    flag: "http-idle-timeout-ms",
    env: "NOVA_HTTP_IDLE_TIMEOUT_MS",
    unit: Unit::Milliseconds,
    default: 120_000,
    min: 1_000,
    max: 86_400_000,
    help: "a connection with no request being answered on it (idle between requests, or still sending a request head) is closed this long after its last answer or write, or after it was accepted; so is one whose client has taken no byte of an answer (a subscriber that stopped reading) for this long",
    reason: "without it a client that opens connections and sends nothing, a head one byte at a time, or a subscription it never reads, holds its shard's connection permits (and an answer's buffers) for good; 2 minutes is above any keep-alive pool's idle expiry (60-90 s in common clients), so a pooled connection is closed by its client first",
};

/// How soon a connection whose peer vanished without a word is found and closed.
pub const HTTP_PEER_GONE_MS: Knob = Knob {
    flag: "http-peer-gone-ms",
    env: "NOVA_HTTP_PEER_GONE_MS",
    unit: Unit::Milliseconds,
    default: 120_000,
    min: 12_000,
    max: 3_600_000,
    help: "a connection's peer that stops answering TCP (a host gone, a network cut) is given up this long after: a quiet connection is probed with TCP keepalive from half this on, six probes spread over the other half, and bytes sent that the peer has not acknowledged for this long drop it too (TCP_USER_TIMEOUT); whole seconds are what the kernel takes for the probes",
    reason: "a request may be answered for as long as its client likes without a byte moving (an append session between batches, a long poll), which --http-idle-timeout-ms counts as busy; without probes such a connection, its permit and its memory would be held for good by a peer that is gone, and retransmissions alone give up only after about 15 minutes; 2 minutes matches the idle timeout",
};

/// Which requests get a log line: failed ones always, the rest when slower than this.
pub const HTTP_LOG_SLOW_MS: Knob = Knob {
    flag: "http-log-slow-ms",
    env: "NOVA_HTTP_LOG_SLOW_MS",
    unit: Unit::Milliseconds,
    default: 1_000,
    min: 0,
    max: 3_600_000,
    help: "a request that succeeds is logged (one line with its request id) only when it took at least this long; a request that fails (status 400 or more) is always logged, within --http-log-lines-per-second; 0 logs every request",
    reason: "a line per request cost an unbuffered write on the shard's core, an eighth of its time under a 64-record append load (perf, loadgen); slow and failed requests are the ones worth reading",
};

/// Request log lines one shard writes per second at most.
pub const HTTP_LOG_LINES_PER_SECOND: Knob = Knob {
    flag: "http-log-lines-per-second",
    env: "NOVA_HTTP_LOG_LINES_PER_SECOND",
    unit: Unit::Count,
    default: 100,
    min: 1,
    max: 1_000_000,
    help: "request log lines (failed or slow requests) one shard writes per second at most; the lines past it are left out and counted (nova_http_log_lines_suppressed_total), and the next line written says how many were",
    reason: "a flood of failing requests (a scanner without a token, a producer stuck on a bad batch) would otherwise spend an eighth of the shard's core on log writes and bury the log; 100 a second per shard is more than anyone reads",
};

/// Log lines waiting for the log writer thread.
pub const LOG_QUEUE_LINES: Knob = Knob {
    flag: "log-queue-lines",
    env: "NOVA_LOG_QUEUE_LINES",
    unit: Unit::Count,
    default: 4_096,
    min: 1,
    max: 1_000_000,
    help: "log lines waiting for the thread that writes the log (stderr); past it, lines are dropped and counted (nova_log_lines_dropped_total), and the next line written says how many were",
    reason: "a shard never writes the log itself, so a log reader that stops reading (a full pipe) stalls no request; 4096 lines (under a MiB) cover a burst of a second at every shard's --http-log-lines-per-second",
};

/// How often an idle subscription sends a heartbeat.
pub const SSE_HEARTBEAT_MS: Knob = Knob {
    flag: "sse-heartbeat-ms",
    env: "NOVA_SSE_HEARTBEAT_MS",
    unit: Unit::Milliseconds,
    default: 15_000,
    min: 100,
    max: 15_000,
    help: "longest an idle subscription goes without an event; then it sends a ping carrying the tail",
    reason: "streams.md asks for a heartbeat at least every 15 s, which keeps proxies from closing the connection; lower only to notice lag sooner",
};

/// Every knob, in the order `--help` and the doc list them.
pub const KNOBS: &[Knob] = &[
    RECORD_BYTES_MAX,
    SHARDS,
    PIN_CORES,
    SHARD_MEMORY_BYTES,
    BUFFER_POOL_BYTES,
    EXPRESS_CHUNK_BYTES,
    SHARD_INBOX_DEPTH,
    SHARD_HANDLERS_MAX,
    JOURNAL_SEGMENT_BYTES,
    JOURNAL_SPARE_SEGMENTS,
    JOURNAL_SYNCS_IN_FLIGHT_MAX,
    BUNDLE_BYTES_TARGET,
    BUNDLE_DELAY_MS,
    DIRECT_SETTLE_BYTES_MIN,
    UPLOADS_IN_FLIGHT_MAX,
    OBJECT_READS_IN_FLIGHT_MAX,
    SHARD_UPLOADS_IN_FLIGHT_MAX,
    SETTLE_TARGET_BYTES,
    SETTLE_AGE_MS,
    SETTLE_INTERVAL_MS,
    SETTLE_EARLY_BYTES_MIN,
    SETTLES_IN_FLIGHT_MAX,
    READ_PAGE_LOADS_MAX,
    RETENTION_INTERVAL_MS,
    AUDITOR_READ_GRACE,
    AUDITOR_INTERVAL_MS,
    UPLOADER_QUEUE_DEPTH,
    UPLOAD_BACKOFF_INITIAL_MS,
    UPLOAD_BACKOFF_MAX_MS,
    UPLOADER_DRAIN_MS,
    LOCAL_STORE_IO_CONCURRENCY,
    LOCAL_STORE_WRITE_BYTES,
    S3_ATTEMPT_TIMEOUT_MS,
    S3_TRANSFER_BYTES_PER_SECOND_MIN,
    S3_ATTEMPTS_MAX,
    S3_BACKOFF_INITIAL_MS,
    S3_BACKOFF_MAX_MS,
    S3_MULTIPART_THRESHOLD_BYTES,
    S3_MULTIPART_PART_BYTES,
    S3_MULTIPART_CONCURRENCY,
    HTTP_CONNECTIONS_MAX,
    HTTP_BODY_BYTES_MAX,
    HTTP_JSON_BODY_BYTES_MAX,
    HTTP_BODY_MEMORY_BYTES,
    HTTP_SESSION_IN_FLIGHT_MAX,
    HTTP_RESPONSE_MEMORY_BYTES,
    HTTP_HEAD_BYTES_MAX,
    HTTP_IDLE_TIMEOUT_MS,
    HTTP_SHUTDOWN_IDLE_MS,
    HTTP_PEER_GONE_MS,
    HTTP_LOG_SLOW_MS,
    HTTP_LOG_LINES_PER_SECOND,
    LOG_QUEUE_LINES,
    SSE_HEARTBEAT_MS,
    TOKENS_MAX,
];

/// A knob whose value is text (an address, a path): no unit and no range, but a flag,
/// an environment variable, a default and a reason like every other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextKnob {
    pub flag: &'static str,
    pub env: &'static str,
    pub default: &'static str,
    pub help: &'static str,
    pub reason: &'static str,
}

impl TextKnob {
    /// The value from the flag if given, else from the environment, else the default.
    pub fn resolve(&self, flag_value: Option<&str>) -> String {
        flag_value
            .map(str::to_owned)
            .or_else(|| std::env::var(self.env).ok())
            .unwrap_or_else(|| self.default.to_owned())
    }
}

/// The address the HTTP server listens on.
pub const LISTEN: TextKnob = TextKnob {
    flag: "listen",
    env: "NOVA_LISTEN",
    default: "127.0.0.1:8080",
    help: "address and port the HTTP server listens on (every shard accepts on it); port 0 picks a free port, printed at start",
    reason: "loopback by default: a first run needs no token (auth is off on loopback without --root-token-file), so exposing the server is a decision to make explicitly",
};

/// The data directory.
pub const DATA_DIR: TextKnob = TextKnob {
    flag: "data-dir",
    env: "NOVA_DATA_DIR",
    default: "./nova-data",
    help: "directory for the metadata store, the journals (unless --journal-dir) and the local object store",
    reason: "a directory beside where the server is started, so a first run needs no setup",
};

/// Where the express journals are.
pub const JOURNAL_DIR: TextKnob = TextKnob {
    flag: "journal-dir",
    env: "NOVA_JOURNAL_DIR",
    default: "",
    help: "directory for the express journals (empty: <data-dir>/journal); the data directory's manifest records it, and a later start elsewhere is refused, since the journals hold acknowledged records not yet in the object store",
    reason: "with the data directory unless asked: one directory is all a first run needs, and a device of its own for the journal (its group commits' writes and fdatasyncs) is a choice for the operator who has one",
};

pub const ROOT_TOKEN_FILE: TextKnob = TextKnob {
    flag: "root-token-file",
    env: "NOVA_ROOT_TOKEN_FILE",
    default: "",
    help: "file holding the root token (16 to 4096 bytes, one line); given, every request needs Authorization: Bearer <token> (docs/auth.md), and without it a non-loopback --listen needs --insecure-no-auth",
    reason: "off on loopback, where only this machine's users reach the port and a first run should need nothing; a file, not a flag value, so the token never shows in ps or a shell history",
};

/// Every text knob, in the order `--help` and the doc list them.
pub const TEXT_KNOBS: &[TextKnob] = &[LISTEN, DATA_DIR, JOURNAL_DIR, ROOT_TOKEN_FILE];

/// A knob value that could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuningError {
    pub message: String,
}

impl std::fmt::Display for TuningError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TuningError {}

impl Knob {
    /// Parses `text` in this knob's unit and checks the range.
    pub fn parse(&self, text: &str) -> Result<u64, TuningError> {
        self.parse_from(text, "")
    }

    /// [`Knob::parse`], whose refusal names where the text came from (`from`, after the
    /// flag) when that was not the flag.
    fn parse_from(&self, text: &str, from: &str) -> Result<u64, TuningError> {
        let err = |why: String| TuningError { message: format!("--{}{from}: {why}", self.flag) };
        let text = text.trim();
        let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
        let (digits, suffix) = text.split_at(split);
        let number: u64 = digits
            .parse()
            .map_err(|_| err(format!("{text:?} is not a whole number of {}", self.unit.name())))?;
        let scale: u64 = match (self.unit, suffix.trim()) {
            (_, "") => 1,
            (Unit::Bytes, "KiB") => 1 << 10,
            (Unit::Bytes, "MiB") => 1 << 20,
            (Unit::Bytes, "GiB") => 1 << 30,
            (Unit::Milliseconds, "ms") => 1,
            (Unit::Milliseconds, "s") => 1_000,
            (Unit::Milliseconds, "m") => 60_000,
            (Unit::Milliseconds, "h") => 3_600_000,
            (Unit::Milliseconds, "d") => 86_400_000,
            (unit, other) => {
                return Err(err(format!("unknown suffix {other:?} for {}", unit.name())));
            }
        };
        let value = number.checked_mul(scale).ok_or_else(|| err(format!("{text:?} overflows")))?;
        if !(self.min..=self.max).contains(&value) {
            return Err(err(format!(
                "{value} {} is outside the range {}..={}",
                self.unit.name(),
                self.min,
                self.max
            )));
        }
        Ok(value)
    }

    /// The value from the flag if given, else from the environment (unless empty), else
    /// the default.
    pub fn resolve(&self, flag_value: Option<&str>) -> Result<u64, TuningError> {
        if let Some(text) = flag_value {
            return self.parse(text);
        }
        // An empty variable is unset (as a shell's `NOVA_X=` means).
        match std::env::var(self.env) {
            Ok(text) if !text.is_empty() => {
                self.parse_from(&text, &format!(" (from {})", self.env))
            }
            _ => Ok(self.default),
        }
    }
}

/// `docs/tuning.md`, generated.
pub fn markdown() -> String {
    let mut doc = String::from(
        "# Tuning\n\nGenerated from the `tuning` crate (`KNOBS`); `cargo test -p tuning` fails when \
         this file drifts. Regenerate with `NOVA_BLESS=1 cargo test -p tuning`.\n\nA value comes from \
         the flag, else the environment variable, else the default.\n\n\
         | flag | environment | default | range | unit | what | why the default |\n\
         |---|---|---:|---|---|---|---|\n",
    );
    for knob in KNOBS {
        let _ = writeln!(
            doc,
            "| `--{}` | `{}` | {} | {}..={} | {} | {} | {} |",
            knob.flag,
            knob.env,
            knob.default,
            knob.min,
            knob.max,
            knob.unit.name(),
            knob.help,
            knob.reason
        );
    }
    doc.push_str(
        "\nText settings:\n\n| flag | environment | default | what | why the default |\n|---|---|---|---|---|\n",
    );
    for knob in TEXT_KNOBS {
        let _ = writeln!(
            doc,
            "| `--{}` | `{}` | `{}` | {} | {} |",
            knob.flag, knob.env, knob.default, knob.help, knob.reason
        );
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_in_range_and_names_unique() {
        for knob in KNOBS {
            assert!((knob.min..=knob.max).contains(&knob.default), "{}", knob.flag);
            assert_eq!(knob.env, format!("NOVA_{}", knob.flag.to_uppercase().replace('-', "_")));
        }
        for knob in TEXT_KNOBS {
            assert_eq!(knob.env, format!("NOVA_{}", knob.flag.to_uppercase().replace('-', "_")));
        }
        let mut flags: Vec<_> =
            KNOBS.iter().map(|k| k.flag).chain(TEXT_KNOBS.iter().map(|k| k.flag)).collect();
        flags.sort_unstable();
        flags.dedup();
        assert_eq!(flags.len(), KNOBS.len() + TEXT_KNOBS.len());
    }

    #[test]
    fn parses_units_and_refuses_out_of_range() {
        assert_eq!(RECORD_BYTES_MAX.parse("2MiB"), Ok(2 << 20));
        assert_eq!(RECORD_BYTES_MAX.parse("512"), Ok(512));
        let err = RECORD_BYTES_MAX.parse("17MiB").expect_err("over the range");
        assert!(err.message.starts_with("--record-bytes-max:"), "{err}");
        assert!(err.message.contains("1..=16777216"), "{err}");
        assert!(RECORD_BYTES_MAX.parse("0").is_err());
        assert!(RECORD_BYTES_MAX.parse("1.5MiB").is_err());
        assert!(RECORD_BYTES_MAX.parse("1 ms").is_err());
        assert!(RECORD_BYTES_MAX.parse("99999999999999999999").is_err());
    }

    /// Every knob's limits, the early-settle floor's among them: one past either end is
    /// refused with the flag and the range named, and each end itself is taken.
    #[test]
    fn every_knob_refuses_one_past_its_range() {
        for knob in KNOBS {
            let range = format!("{}..={}", knob.min, knob.max);
            for value in [knob.max.checked_add(1), knob.min.checked_sub(1)].into_iter().flatten() {
                let err = knob.parse(&value.to_string()).expect_err(knob.flag);
                assert!(err.message.starts_with(&format!("--{}:", knob.flag)), "{err}");
                assert!(err.message.contains(&range), "{err}");
            }
            assert_eq!(knob.parse(&knob.min.to_string()), Ok(knob.min), "{}", knob.flag);
            assert_eq!(knob.parse(&knob.max.to_string()), Ok(knob.max), "{}", knob.flag);
        }
    }

    #[test]
    fn flag_wins_over_default() {
        assert_eq!(RECORD_BYTES_MAX.resolve(Some("1KiB")), Ok(1024));
    }

    /// A value from the environment is refused naming its variable too, and the flag
    /// wins over it; a day is a unit of time.
    #[test]
    fn the_environment_is_named_when_its_value_is_refused() {
        // SAFETY: nextest runs each test in a process of its own, and nothing else here
        // reads this variable.
        unsafe { std::env::set_var(AUDITOR_READ_GRACE.env, "8d") };
        let err = AUDITOR_READ_GRACE.resolve(None).expect_err("over the range");
        let from = "--auditor-read-grace (from NOVA_AUDITOR_READ_GRACE): ";
        assert!(err.message.starts_with(from), "{err}");
        assert_eq!(AUDITOR_READ_GRACE.resolve(Some("7d")), Ok(7 * 86_400_000));
        // SAFETY: as above.
        unsafe { std::env::set_var(AUDITOR_READ_GRACE.env, "1d") };
        assert_eq!(AUDITOR_READ_GRACE.resolve(None), Ok(86_400_000));
        // SAFETY: as above.
        unsafe { std::env::set_var(AUDITOR_READ_GRACE.env, "") };
        assert_eq!(AUDITOR_READ_GRACE.resolve(None), Ok(AUDITOR_READ_GRACE.default), "unset");
    }

    #[test]
    fn doc_matches_the_knobs() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/tuning.md");
        if std::env::var_os("NOVA_BLESS").is_some() {
            std::fs::write(&path, markdown()).expect("write docs/tuning.md");
        }
        let stored = std::fs::read_to_string(&path).expect("docs/tuning.md exists");
        assert_eq!(
            stored,
            markdown(),
            "docs/tuning.md drifted: run NOVA_BLESS=1 cargo test -p tuning"
        );
    }
}
