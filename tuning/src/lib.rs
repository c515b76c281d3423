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
    /// Milliseconds; accepts `ms`, `s`, `m`, `h` suffixes.
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
    reason: "a reused segment skips the preallocation at a roll, and its blocks are already written, so O_DIRECT writes into it need no extent conversion before the fdatasync; two cover a roll while the uploader releases the next",
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

/// The memory budget of one shard over stored bytes held (sequenced but not yet
/// durable, and cached durable chunks).
pub const SHARD_MEMORY_BYTES: Knob = Knob {
    flag: "shard-memory-bytes",
    env: "NOVA_SHARD_MEMORY_BYTES",
    unit: Unit::Bytes,
    default: 1 << 30,
    min: 16 << 20,
    max: 1 << 40,
    help: "stored bytes one shard holds in memory (unsettled batches plus cached chunks); appends past it get resource_exhausted",
    reason: "1 GiB holds several seconds of ingest at disk speed plus a useful read cache, on machines with a few GiB per core",
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
    help: "requests one shard works on at once (waiting reads and unacknowledged appends included)",
    reason: "each waiting request costs a task and little memory; the memory budget, not this, bounds the bytes they hold",
};

/// Every knob, in the order `--help` and the doc list them.
pub const KNOBS: &[Knob] = &[
    RECORD_BYTES_MAX,
    SHARDS,
    SHARD_MEMORY_BYTES,
    EXPRESS_CHUNK_BYTES,
    SHARD_INBOX_DEPTH,
    SHARD_HANDLERS_MAX,
    JOURNAL_SEGMENT_BYTES,
    JOURNAL_SPARE_SEGMENTS,
];

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
        let err = |why: String| TuningError { message: format!("--{}: {why}", self.flag) };
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

    /// The value from the flag if given, else from the environment, else the default.
    pub fn resolve(&self, flag_value: Option<&str>) -> Result<u64, TuningError> {
        match flag_value.map(str::to_owned).or_else(|| std::env::var(self.env).ok()) {
            Some(text) => self.parse(&text),
            None => Ok(self.default),
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
        let mut flags: Vec<_> = KNOBS.iter().map(|k| k.flag).collect();
        flags.sort_unstable();
        flags.dedup();
        assert_eq!(flags.len(), KNOBS.len());
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

    #[test]
    fn flag_wins_over_default() {
        assert_eq!(RECORD_BYTES_MAX.resolve(Some("1KiB")), Ok(1024));
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
