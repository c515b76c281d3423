//! The metadata store: the one interface through which the control plane keeps buckets,
//! streams, refs and watermarks, and its embedded, durable implementation.
//!
//! The interface is etcd-shaped so that a distributed store can slot in behind it later
//! (architecture.md, "Scale-out") without touching callers:
//!
//! - keys and values are bytes; keys are ordered bytewise;
//! - every read is an async round trip that may leave the machine: nothing here is free or
//!   local, so callers batch and cache as they would against etcd;
//! - every mutation is a [`Txn`]: checks that must all pass and writes that all apply, or
//!   nothing applies and [`MetaError::Conflict`] names the failed check;
//! - a store-wide [`Revision`] increases strictly with every transaction that writes, and
//!   each key remembers the revision of its last write (etcd's `mod_revision`).
//!
//! This module owns the interface types, their limits and validation. It never encodes
//! rows (the callers own their row formats) and never runs blocking work on the caller's
//! thread: implementations do their I/O elsewhere and answer through futures.
//!
//! Glommio callers: replies are woken from the store's own thread, so a task awaiting one
//! must run in a `Latency::NotImportant` task queue (notes/platform.md, foreign-wake hang).

mod redb_store;

#[cfg(test)]
mod tests;

use std::fmt;

pub use redb_store::{MetaStats, RedbMetaOptions, RedbMetaStore};

/// Bytes in a key, inclusive. A stream address row (bucket of 63 bytes, stream key of 512
/// bytes, a short prefix) fits with room to spare.
pub const KEY_BYTES_MAX: u32 = 2048;
/// Bytes in a value, inclusive.
pub const VALUE_BYTES_MAX: u32 = 1 << 20;
/// Checks plus writes in one transaction: etcd's default `--max-txn-ops`, so that any
/// transaction accepted here is accepted by an etcd-backed store too.
pub const TXN_OPS_MAX: u32 = 128;
/// Key and value bytes in one transaction, all checks and writes counted: under etcd's
/// default 1.5 MiB request limit, for the same reason.
pub const TXN_BYTES_MAX: u64 = 1_400 * 1024;
/// Entries in one scan page. A larger `limit` is cut to this (the page says `more`).
pub const SCAN_ENTRIES_MAX: u32 = 1000;
/// Value bytes in one scan page. A page stops after the entry that reaches this, so it
/// always holds at least one entry when one exists.
pub const SCAN_BYTES_MAX: u64 = 4 << 20;

const _: () = assert!(VALUE_BYTES_MAX as u64 + KEY_BYTES_MAX as u64 <= TXN_BYTES_MAX);

/// The store-wide revision: it increases strictly with every committed transaction that
/// writes. Revision 0 is the empty store; no key is ever written at revision 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

impl Revision {
    /// The empty store's revision, before any write.
    pub const ZERO: Revision = Revision(0);

    /// The revision number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A value and the revision at which its key was last written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub value: Vec<u8>,
    /// The revision of the transaction that last wrote this key.
    pub version: Revision,
}

/// One page of a prefix scan, in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    pub entries: Vec<(Vec<u8>, Versioned)>,
    /// Whether more keys with the prefix follow the last entry: continue with
    /// `start_after` set to the last entry's key.
    pub more: bool,
}

/// A condition a transaction requires of the state it commits against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// The key does not exist.
    Absent(Vec<u8>),
    /// The key exists and was last written at exactly this revision.
    VersionIs(Vec<u8>, Revision),
    /// The key exists and holds exactly these bytes.
    ValueIs(Vec<u8>, Vec<u8>),
}

impl Check {
    /// The key this check reads.
    pub fn key(&self) -> &[u8] {
        match self {
            Check::Absent(key) | Check::VersionIs(key, _) | Check::ValueIs(key, _) => key,
        }
    }

    /// Whether the check holds for a key's current state (`None`: the key is absent).
    pub fn holds(&self, current: Option<(&[u8], Revision)>) -> bool {
        match (self, current) {
            (Check::Absent(_), found) => found.is_none(),
            (Check::VersionIs(_, want), Some((_, version))) => version == *want,
            (Check::ValueIs(_, want), Some((value, _))) => value == want.as_slice(),
            (Check::VersionIs(..) | Check::ValueIs(..), None) => false,
        }
    }

    fn bytes(&self) -> u64 {
        let value = match self {
            Check::ValueIs(_, value) => value.len(),
            Check::Absent(_) | Check::VersionIs(..) => 0,
        };
        (self.key().len() + value) as u64
    }
}

/// A change a transaction makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Sets the key to the value; the key's version becomes the transaction's revision.
    Put(Vec<u8>, Vec<u8>),
    /// Removes the key (a no-op if it is absent).
    Delete(Vec<u8>),
}

impl Write {
    /// The key this write changes.
    pub fn key(&self) -> &[u8] {
        match self {
            Write::Put(key, _) | Write::Delete(key) => key,
        }
    }

    fn bytes(&self) -> u64 {
        let value = match self {
            Write::Put(_, value) => value.len(),
            Write::Delete(_) => 0,
        };
        (self.key().len() + value) as u64
    }
}

/// An atomic transaction: every check passes and every write applies, together, or
/// nothing applies. Compare-and-set is one check and one write; a plain put is a write
/// with no check.
///
/// A key may be written at most once per transaction (etcd refuses duplicates too).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub checks: Vec<Check>,
    pub writes: Vec<Write>,
}

impl Txn {
    /// An empty transaction (it commits, writing nothing, at the current revision).
    pub fn new() -> Self {
        Self::default()
    }

    /// Requires that `key` does not exist.
    pub fn check_absent(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.checks.push(Check::Absent(key.into()));
        self
    }

    /// Requires that `key` was last written at `version`.
    pub fn check_version(mut self, key: impl Into<Vec<u8>>, version: Revision) -> Self {
        self.checks.push(Check::VersionIs(key.into(), version));
        self
    }

    /// Requires that `key` holds exactly `value`.
    pub fn check_value(mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.checks.push(Check::ValueIs(key.into(), value.into()));
        self
    }

    /// Sets `key` to `value`.
    pub fn put(mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.writes.push(Write::Put(key.into(), value.into()));
        self
    }

    /// Removes `key`.
    pub fn delete(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.writes.push(Write::Delete(key.into()));
        self
    }

    /// Key and value bytes of every check and write.
    pub fn bytes(&self) -> u64 {
        self.checks.iter().map(Check::bytes).chain(self.writes.iter().map(Write::bytes)).sum()
    }

    /// Checks the transaction against the interface's limits. Every implementation calls
    /// this before sending, so that a transaction valid for one store is valid for all.
    pub fn validate(&self) -> Result<(), Invalid> {
        let ops = self.checks.len() + self.writes.len();
        if ops > TXN_OPS_MAX as usize {
            return Err(Invalid::TxnTooManyOps { ops: ops as u64, limit: TXN_OPS_MAX });
        }
        for key in self.checks.iter().map(Check::key).chain(self.writes.iter().map(Write::key)) {
            validate_key(key)?;
        }
        for write in &self.writes {
            if let Write::Put(_, value) = write
                && value.len() > VALUE_BYTES_MAX as usize
            {
                return Err(Invalid::ValueTooLarge {
                    size: value.len() as u64,
                    limit: VALUE_BYTES_MAX,
                });
            }
        }
        let bytes = self.bytes();
        if bytes > TXN_BYTES_MAX {
            return Err(Invalid::TxnTooLarge { bytes, limit: TXN_BYTES_MAX });
        }
        let mut written: Vec<&[u8]> = self.writes.iter().map(Write::key).collect();
        written.sort_unstable();
        if let Some(pair) = written.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(Invalid::DuplicateWrite { key: pair[0].to_vec() });
        }
        Ok(())
    }
}

/// Checks a key against the interface's limits: non-empty, at most [`KEY_BYTES_MAX`].
pub fn validate_key(key: &[u8]) -> Result<(), Invalid> {
    if key.is_empty() {
        return Err(Invalid::KeyEmpty);
    }
    if key.len() > KEY_BYTES_MAX as usize {
        return Err(Invalid::KeyTooLarge { size: key.len() as u64, limit: KEY_BYTES_MAX });
    }
    Ok(())
}

/// Checks scan arguments: `limit` at least 1; `prefix` may be empty (all keys) but no
/// longer than a key; `start_after`, when given, is a valid key.
pub fn validate_scan(prefix: &[u8], start_after: Option<&[u8]>, limit: u32) -> Result<(), Invalid> {
    if limit == 0 {
        return Err(Invalid::ScanLimitZero);
    }
    if prefix.len() > KEY_BYTES_MAX as usize {
        return Err(Invalid::KeyTooLarge { size: prefix.len() as u64, limit: KEY_BYTES_MAX });
    }
    start_after.map_or(Ok(()), validate_key)
}

/// A request the interface refuses before it reaches any store: a bug in the caller, or
/// input that should have been refused at the edge.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("metadata key is empty")]
    KeyEmpty,
    #[error("metadata key of {size} bytes exceeds the limit of {limit}")]
    KeyTooLarge { size: u64, limit: u32 },
    #[error("metadata value of {size} bytes exceeds the limit of {limit}")]
    ValueTooLarge { size: u64, limit: u32 },
    #[error("metadata txn of {ops} checks and writes exceeds the limit of {limit}")]
    TxnTooManyOps { ops: u64, limit: u32 },
    #[error("metadata txn of {bytes} bytes exceeds the limit of {limit}")]
    TxnTooLarge { bytes: u64, limit: u64 },
    #[error("metadata txn writes key {} more than once", Key(key))]
    DuplicateWrite { key: Vec<u8> },
    #[error("metadata scan limit is 0")]
    ScanLimitZero,
}

/// Every error a metadata store reports.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// A check of the transaction failed, so nothing was written. `check` is its index in
    /// [`Txn::checks`]; `found` is the key's version when the check was evaluated (`None`:
    /// absent). Not retryable as such: re-read, decide, and build a new transaction.
    #[error(
        "metadata txn check {check} failed on key {}: found {}",
        Key(key),
        found.map_or_else(|| "no key".to_string(), |version| format!("version {version}"))
    )]
    Conflict { check: u32, key: Vec<u8>, found: Option<Revision> },
    /// The request was refused before it reached the store.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// The store could not read or write its storage. Whether a mutation that reports
    /// this was applied is unknown; the store may refuse further writes until reopened.
    #[error("metadata i/o failed while {op}: {message}")]
    Io { op: &'static str, message: String },
    /// Stored bytes are not what the store wrote.
    #[error("metadata is corrupt: {message}")]
    Corrupt { message: String },
    /// The store was closed, or its thread is gone. Whether an in-flight mutation was
    /// applied is unknown.
    #[error("metadata store is closed")]
    Closed,
}

/// A key printed for humans: printable ASCII as is, other bytes escaped.
struct Key<'a>(&'a [u8]);

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

/// The metadata store interface.
///
/// A handle is cheap to clone and shared by every task that needs metadata; each method
/// returns a `Send` future, so it can be awaited on any executor. A mutation's future
/// resolves once the transaction is durable (for the embedded store: fsynced).
///
/// Dropping a commit's future does not cancel the transaction: it may still apply. The
/// outcome of a commit that fails with [`MetaError::Io`] or [`MetaError::Closed`] is
/// likewise unknown; callers that must know re-read (a creation token in the written
/// value makes "did my create win?" answerable).
pub trait MetaStore: Clone + Send + Sync + 'static {
    /// The key's value and version, or `None` if absent.
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Versioned>, MetaError>> + Send;

    /// Keys starting with `prefix` and greater than `start_after` (if given), in key
    /// order, at most `limit` of them (cut to [`SCAN_ENTRIES_MAX`] entries and
    /// [`SCAN_BYTES_MAX`] value bytes). Each page is a consistent snapshot; successive
    /// pages are not one snapshot together.
    fn scan(
        &self,
        prefix: &[u8],
        start_after: Option<&[u8]>,
        limit: u32,
    ) -> impl Future<Output = Result<ScanPage, MetaError>> + Send;

    /// Commits the transaction atomically and durably. Returns the transaction's
    /// revision: the new revision if it wrote, else the revision it was checked at.
    fn commit(&self, txn: Txn) -> impl Future<Output = Result<Revision, MetaError>> + Send;

    /// Sets `key` to `value` unconditionally.
    fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<Revision, MetaError>> + Send {
        self.commit(Txn::new().put(key, value))
    }

    /// Removes `key` unconditionally.
    fn delete(
        &self,
        key: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<Revision, MetaError>> + Send {
        self.commit(Txn::new().delete(key))
    }

    /// Creates `key` with `value` if it does not exist; a [`MetaError::Conflict`] if it
    /// does. Racing creates of one key: exactly one succeeds.
    fn create_if_absent(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<Revision, MetaError>> + Send {
        let key = key.into();
        self.commit(Txn::new().check_absent(key.clone()).put(key, value))
    }

    /// Sets `key` to `value` if it was last written at `expected`; a
    /// [`MetaError::Conflict`] otherwise.
    fn cas(
        &self,
        key: impl Into<Vec<u8>>,
        expected: Revision,
        value: impl Into<Vec<u8>>,
    ) -> impl Future<Output = Result<Revision, MetaError>> + Send {
        let key = key.into();
        self.commit(Txn::new().check_version(key.clone(), expected).put(key, value))
    }
}
