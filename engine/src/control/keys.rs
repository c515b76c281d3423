//! The control plane's metadata key layout: which key each row lives under.
//!
//! ```text
//! b/<bucket>            -> bucket row            (ListBuckets scans "b/")
//! a/<bucket>/<key>      -> address row: the ID   (ListStreams scans "a/<bucket>/<prefix>")
//! s/<16-byte id>        -> stream row            (everything per stream is keyed by ID)
//! d/<bucket>/<key>      -> deleted marker: the ID last deleted at the address
//! r/<16-byte id><8-byte big-endian first seq>
//!                       -> ref: where one chunk of the stream is in the object store
//!                          (a stream's refs scan in sequence order under "r/<id>")
//! g/<object key>        -> dead mark: no ref names the object since the time it holds;
//!                          the auditor deletes it once the read grace has passed
//! t/<token id>          -> token: its grants and SHA-256 (never the token itself)
//! ```
//!
//! Bucket names are `a-z0-9-` (never `/`), so `a/<bucket>/` is a prefix of exactly that
//! bucket's addresses: `a/apps/` never matches `a/apps2/...`. Stream keys are opaque UTF-8
//! without control characters and follow the bucket's `/` unchanged, so key order within
//! a bucket is the bytewise order of stream keys, which is ListStreams' order.
//!
//! This module owns the byte layout of keys and the arithmetic of list cursors. It never
//! encodes values (that is `rows`) and never talks to a store.

use crate::ids::StreamId;
use crate::names::{BUCKET_NAME_BYTES_MAX, BucketName, STREAM_KEY_BYTES_MAX, StreamKey};

/// Prefix of bucket rows.
pub const BUCKETS: &[u8] = b"b/";
/// Prefix of address rows.
pub const ADDRESSES: &[u8] = b"a/";
/// Prefix of stream rows.
pub const STREAMS: &[u8] = b"s/";
/// Prefix of deleted markers.
pub const DELETED: &[u8] = b"d/";
/// Prefix of refs.
pub const REFS: &[u8] = b"r/";
/// Prefix of dead marks.
pub const DEAD: &[u8] = b"g/";
/// Prefix of tokens.
pub const TOKENS: &[u8] = b"t/";

/// The longest key this layout builds: an address or marker of the longest bucket name and
/// stream key. Far below the store's key limit, so a valid name never makes an invalid key.
pub const KEY_BYTES_MAX: usize = ADDRESSES.len() + BUCKET_NAME_BYTES_MAX + 1 + STREAM_KEY_BYTES_MAX;
const _: () = assert!(KEY_BYTES_MAX <= crate::meta::KEY_BYTES_MAX as usize);
const _: () = assert!(ADDRESSES.len() == DELETED.len());

fn join(parts: &[&[u8]]) -> Vec<u8> {
    let mut key = Vec::with_capacity(parts.iter().map(|part| part.len()).sum());
    parts.iter().for_each(|part| key.extend_from_slice(part));
    key
}

/// `b/<bucket>`.
pub fn bucket(name: &BucketName) -> Vec<u8> {
    join(&[BUCKETS, name.as_str().as_bytes()])
}

/// `a/<bucket>/<key>`.
pub fn address(bucket: &BucketName, key: &StreamKey) -> Vec<u8> {
    join(&[ADDRESSES, bucket.as_str().as_bytes(), b"/", key.as_str().as_bytes()])
}

/// `a/<bucket>/`: every address in the bucket, and nothing else.
pub fn addresses_of(bucket: &BucketName) -> Vec<u8> {
    join(&[ADDRESSES, bucket.as_str().as_bytes(), b"/"])
}

/// `s/<id>`.
pub fn stream(id: &StreamId) -> Vec<u8> {
    join(&[STREAMS, id.as_bytes()])
}

/// `r/<id>`: every ref of the stream, in sequence order.
pub fn refs_of(id: &StreamId) -> Vec<u8> {
    join(&[REFS, id.as_bytes()])
}

/// `r/<id><first seq, big-endian>`.
pub fn chunk_ref(id: &StreamId, first_seq_num: u64) -> Vec<u8> {
    join(&[REFS, id.as_bytes(), &first_seq_num.to_be_bytes()])
}

/// `g/<object key>`.
pub fn dead(object: &str) -> Vec<u8> {
    join(&[DEAD, object.as_bytes()])
}

/// `t/<token id>`.
pub fn token(id: &str) -> Vec<u8> {
    join(&[TOKENS, id.as_bytes()])
}

/// `d/<bucket>/<key>`.
pub fn deleted(bucket: &BucketName, key: &StreamKey) -> Vec<u8> {
    join(&[DELETED, bucket.as_str().as_bytes(), b"/", key.as_str().as_bytes()])
}

/// `d/<bucket>/`: every deleted marker of the bucket.
pub fn deleted_of(bucket: &BucketName) -> Vec<u8> {
    join(&[DELETED, bucket.as_str().as_bytes(), b"/"])
}

/// The bucket name of a bucket row's key, as stored bytes.
pub fn bucket_name_of(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(BUCKETS)
}

/// The stream key of an address row's key within `a/<bucket>/`.
pub fn stream_key_of<'a>(key: &'a [u8], addresses_of_bucket: &[u8]) -> Option<&'a [u8]> {
    key.strip_prefix(addresses_of_bucket)
}

/// A list cursor shortened to at most `longest + 1` bytes, so that it always makes a valid
/// store key, without changing which names sort after it.
///
/// Every name is at most `longest` bytes. For such a name `n` and a cursor `c` longer than
/// `longest`, with `t` the first `longest + 1` bytes of `c`: either `n` and `c` differ at a
/// byte before `n` ends, which `t` has too, so `n > c` exactly when `n > t`; or `n` is a
/// prefix of `c`, and then also a proper prefix of `t`, so `n < c` and `n < t`.
pub fn cursor(start_after: &str, longest: usize) -> &[u8] {
    let bytes = start_after.as_bytes();
    &bytes[..bytes.len().min(longest + 1)]
}

/// The store's `start_after` for ListBuckets after bucket name `start_after`.
pub fn buckets_after(start_after: &str) -> Vec<u8> {
    join(&[BUCKETS, cursor(start_after, BUCKET_NAME_BYTES_MAX)])
}

/// The store's `start_after` for ListStreams in `bucket` after stream key `start_after`.
pub fn addresses_after(bucket: &BucketName, start_after: &str) -> Vec<u8> {
    join(&[&addresses_of(bucket), cursor(start_after, STREAM_KEY_BYTES_MAX)])
}
