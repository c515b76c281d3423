//! Lending a shard's chunks to another thread without a copy.
//!
//! A shard's chunks are `Rc`s on its executor, and never `Send`: an express chunk lives in
//! glommio DMA memory, a cached one may be a journal read. The uploader's thread still
//! reads them where they are: the shard keeps a [`ChunkLoan`] (an `Rc` of the chunk, so
//! its memory stays put and unchanged) until every [`Lent`] view of it has been dropped on
//! the other side. Uploads lend express chunks this way ([`LentChunk`]), and settling
//! lends the cached chunks it settles from memory.

use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;

use crate::chunk::{ChunkHeader, ChunkStorage, SealedChunk};
use crate::stream::ChunkSource;

/// A chunk lent to another thread, on the shard's side: it holds the chunk (and so its
/// memory) at least until every [`Lent`] of it is dropped.
///
/// Dropped while a `Lent` is still out (a shard torn down with an upload on its way), it
/// does not wait, which could be as long as a store outage lasts, and it does not free:
/// it leaks its hold on the chunk, so the memory stays valid for the reader. A glommio
/// DMA buffer keeps the allocator it came from alive, so a leaked one stays mapped after
/// its executor is gone.
pub struct ChunkLoan<C: ?Sized + ChunkSource> {
    chunk: Rc<C>,
    /// One count per `Lent` out, besides this one.
    out: Arc<()>,
}

impl<C: ?Sized + ChunkSource> ChunkLoan<C> {
    pub fn new(chunk: Rc<C>) -> Self {
        Self { chunk, out: Arc::new(()) }
    }

    pub fn chunk(&self) -> &Rc<C> {
        &self.chunk
    }

    /// The chunk's bytes ([`ChunkSource::chunk_bytes`]), readable from any thread while
    /// this loan lives.
    pub fn lend_bytes(&self) -> Lent {
        let bytes = self.chunk.chunk_bytes();
        Lent { ptr: NonNull::from(bytes).cast(), len: bytes.len(), _out: Arc::clone(&self.out) }
    }
}

impl<B: ChunkStorage> ChunkLoan<SealedChunk<B>> {
    /// The chunk's bytes and header, readable from any thread while this loan lives.
    pub fn lend(&self) -> LentChunk {
        LentChunk { header: *self.chunk.header(), bytes: self.lend_bytes() }
    }
}

impl<C: ?Sized + ChunkSource> Drop for ChunkLoan<C> {
    fn drop(&mut self) {
        // `get_mut` succeeds only with no other count left, and synchronises with the
        // drops that released them (Arc's release decrement, acquire here): every read
        // through a `Lent` happened before the chunk can be freed below.
        if Arc::get_mut(&mut self.out).is_none() {
            std::mem::forget(Rc::clone(&self.chunk));
        }
    }
}

/// A chunk's bytes in its shard's memory, lent by a [`ChunkLoan`] for reading on
/// another thread, with no copy.
pub struct Lent {
    ptr: NonNull<u8>,
    len: usize,
    _out: Arc<()>,
}

// SAFETY: a `Lent` only reads `ptr..ptr + len`, which its `ChunkLoan` keeps allocated
// until this is dropped (or forever, see `ChunkLoan`'s drop), and nothing writes there
// meanwhile: the loan holds an `Rc` of the chunk, and `ChunkSource`'s contract is that
// `chunk_bytes` stays where it is, unchanged, while the chunk is shared.
unsafe impl Send for Lent {}
// SAFETY: as for `Send`; shared access is reads only.
unsafe impl Sync for Lent {}

impl Lent {
    /// The chunk as stored (header, records, directory).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` was a `&[u8]` of the chunk when lent, and stays
        // allocated and unchanged while this lives (see the `Send` impl).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent").field("len", &self.len).finish_non_exhaustive()
    }
}

/// A lent sealed chunk: its bytes and its header.
#[derive(Debug)]
pub struct LentChunk {
    header: ChunkHeader,
    bytes: Lent,
}

impl LentChunk {
    /// The chunk, exactly `header().chunk_len()` bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.bytes()
    }

    pub fn header(&self) -> &ChunkHeader {
        &self.header
    }
}
