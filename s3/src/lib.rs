//! nova's object stores: one interface, [`ObjectStore`], and its two backends, a local
//! directory ([`LocalDirStore`], the embedded default) and S3 on aws-sdk-s3
//! ([`S3Store`], for AWS and S3-compatible servers).
//!
//! This crate moves bytes under `/`-separated keys. It knows nothing about records,
//! chunks, bundles or streams, and never decides what a key means; the engine does.
//!
//! Every call is async and returns a `Send` future, to be awaited on a tokio runtime
//! with time and I/O enabled (the uploader's own thread): the S3 backend needs tokio for
//! aws-sdk-s3, and the local backend does its blocking file work on tokio's blocking
//! pool. Nothing here may run on a glommio shard. A store is shared as
//! `Arc<dyn ObjectStore>`.
//!
//! `docs/decisions/0005-object-store.md` records the choices and what each call costs in
//! requests.

mod error;
mod key;
mod local;
mod range;
mod retry;
mod s3;
#[cfg(feature = "testing")]
pub mod testing;

use std::future::Future;
use std::pin::Pin;

pub use bytes::Bytes;

pub use crate::error::{Cause, Error, ErrorKind, Op};
pub use crate::key::{KEY_BYTES_MAX, KeyRule, PREFIX_BYTES_MAX, SEGMENT_BYTES_MAX, check_key};
pub use crate::local::{LocalDirOptions, LocalDirStore};
pub use crate::range::{ByteRange, RangeRule};
pub use crate::retry::TransferPolicy;
pub use crate::s3::{S3Config, S3Credentials, S3Store};

/// The future every [`ObjectStore`] call returns: boxed so the trait is object-safe,
/// `Send` so the uploader may spawn it on a multi-threaded runtime.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Most keys one [`ObjectStore::list`] page returns: S3's own page limit.
pub const LIST_PAGE_KEYS_MAX: usize = 1000;

/// Longest `start_after` of a list: S3's longest key.
const START_AFTER_BYTES_MAX: usize = 1024;

/// What a put may do to an existing object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutCondition {
    /// Write only if the key is absent; else fail with [`ErrorKind::AlreadyExists`].
    /// Of concurrent create-only puts of one key, exactly one succeeds.
    CreateOnly,
    /// Write whether or not the key exists, replacing it whole.
    Overwrite,
}

/// One listed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
}

/// One page of a listing, in ascending byte order of keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    pub objects: Vec<ObjectMeta>,
    /// The `start_after` of the next page, `None` when the listing is complete. A page
    /// may hold fewer keys than asked (even none) and still have a next one: objects
    /// under keys that fail [`check_key`] (written by another program) are skipped.
    pub next: Option<String>,
}

/// An object store: whole-object puts, ranged gets, heads, paged listings and deletes,
/// under keys that pass [`check_key`].
///
/// Every object is written whole and atomically: a reader sees the old object, the new
/// one, or none, never a part. A successful put is durable. Every call validates its
/// arguments first and refuses bad ones with [`ErrorKind::Invalid`] before any I/O.
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// Writes `bytes` under `key`. With [`PutCondition::CreateOnly`] an existing key is
    /// refused with [`ErrorKind::AlreadyExists`].
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        condition: PutCondition,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Reads `range` of the object at `key` ([`ErrorKind::NotFound`] when absent).
    fn get<'a>(&'a self, key: &'a str, range: ByteRange) -> BoxFuture<'a, Result<Bytes, Error>>;

    /// The size of the object at `key`, `None` when absent.
    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<u64>, Error>>;

    /// Up to `limit` (1 to [`LIST_PAGE_KEYS_MAX`]) objects whose keys start with
    /// `prefix` and sort after `start_after`, in ascending byte order.
    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ListPage, Error>>;

    /// Removes the object at `key`; removing an absent key succeeds.
    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), Error>>;
}

/// Checks a list call's arguments (both backends share the rule).
fn check_list_args(prefix: &str, start_after: Option<&str>, limit: usize) -> Result<(), Error> {
    let invalid = |cause| Error::new(Op::List, prefix, cause);
    key::check_scan_bound(prefix).map_err(|rule| invalid(Cause::InvalidKey(rule)))?;
    // Any string bounds a scan; `next` may even name a foreign object the store
    // skipped. Only its length is bounded (S3's longest key).
    if let Some(bound) = start_after
        && bound.len() > START_AFTER_BYTES_MAX
    {
        return Err(invalid(Cause::InvalidKey(KeyRule::Length {
            len: bound.len(),
            max: START_AFTER_BYTES_MAX,
        })));
    }
    if !(1..=LIST_PAGE_KEYS_MAX).contains(&limit) {
        return Err(invalid(Cause::ListLimit { limit, max: LIST_PAGE_KEYS_MAX }));
    }
    Ok(())
}

/// Checks a get's key and range (both backends share the rule).
fn check_get_args(key: &str, range: &ByteRange) -> Result<(), Error> {
    check_key(key).map_err(|rule| Error::new(Op::Get, key, Cause::InvalidKey(rule)))?;
    range.check().map_err(|rule| Error::new(Op::Get, key, Cause::InvalidRange(rule)))
}

/// Checks the key of a put, head or delete.
fn check_key_for(op: Op, key: &str) -> Result<(), Error> {
    check_key(key).map_err(|rule| Error::new(op, key, Cause::InvalidKey(rule)))
}
