//! `JournalBuffer`: chunk storage in glommio DMA memory, so an express chunk is built
//! where the journal's O_DIRECT write reads it (zero copy), and its bytes keep serving
//! readers after the write from the very same memory.
//!
//! Why a wrapper and not `DmaBuffer` itself: glommio writes a `DmaBuffer`'s whole length
//! and takes it by value or as `Rc<DmaBuffer>`. A chunk fills only part of its buffer, and
//! `SealedChunk` hands out its storage only by shared reference (and its envelope
//! mutably). So the buffer lives in an `Rc` that the journal clones into the write, and
//! is trimmed to the entry's padded length through the one mutable path a sealed chunk
//! has, [`crate::chunk::SealedChunk::envelope_mut`], right before the envelope is written
//! (`request_trim`, then `envelope_mut`). Trimming is glommio's and one-way: a recycled
//! buffer offers the trimmed length as its capacity.
//!
//! Never `Send`: the memory belongs to the shard's executor. An express chunk still
//! reaches the uploader's thread without a copy: the shard lends its bytes
//! ([`ChunkLoan`]), holding the chunk until the uploader has given them back.

use std::cell::Cell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;

use glommio::io::DmaBuffer;

use crate::chunk::{ChunkHeader, ChunkStorage, SealedChunk};

/// A 4 KiB-aligned DMA buffer a chunk is built in; see the module docs.
pub struct JournalBuffer {
    buf: Rc<DmaBuffer>,
    /// The allocation's size (the buffer's length before any trim).
    allocated: usize,
    /// Set by the journal just before it writes the envelope: the length the buffer is
    /// trimmed to at the next mutable access.
    trim_to: Cell<Option<usize>>,
}

impl JournalBuffer {
    /// Wraps a freshly allocated buffer. It is not zeroed: every byte an entry sends is
    /// written first (the envelope by the journal, the chunk by its builder, the padding
    /// to 4 KiB zeroed at seal), and the write is trimmed to exactly those bytes. Zeroing
    /// the whole capacity cost a page fault and a memset per 4 KiB of every chunk buffer,
    /// most of them never used (a 1-record batch in a 256 KiB buffer): the largest cost
    /// on the express path before it was removed (`bench engine`, perf).
    pub(crate) fn new(buf: DmaBuffer) -> Self {
        Self { allocated: buf.len(), buf: Rc::new(buf), trim_to: Cell::new(None) }
    }

    /// The memory the buffer holds, whatever its length now.
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    /// The buffer's length: its capacity for a chunk, or the padded entry once written.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the buffer has no bytes (never: buffers are at least 4 KiB).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Asks for the buffer to be trimmed to `len` at the next mutable access.
    pub(super) fn request_trim(&self, len: usize) {
        assert!(len <= self.buf.len(), "a buffer is trimmed, never grown");
        self.trim_to.set(Some(len));
    }

    /// The buffer, for the write that sends it.
    pub(super) fn shared(&self) -> Rc<DmaBuffer> {
        Rc::clone(&self.buf)
    }
}

impl ChunkStorage for JournalBuffer {
    fn storage(&self) -> &[u8] {
        self.buf.as_bytes()
    }

    fn storage_mut(&mut self) -> &mut [u8] {
        let buf = Rc::get_mut(&mut self.buf).expect(
            "a journal buffer is shared only with its own write, which ends before append \
             returns the chunk, and a shared chunk is never mutable",
        );
        if let Some(len) = self.trim_to.take() {
            buf.trim_to_size(len);
        }
        buf.as_bytes_mut()
    }
}

/// A sealed express chunk lent to another thread, on the shard's side: it holds the chunk
/// (and so its memory) at least until every [`LentChunk`] of it is dropped.
///
/// Dropped while a `LentChunk` is still out (a shard torn down with an upload on its
/// way), it does not wait, which could be as long as a store outage lasts, and it does
/// not free: it leaks its hold on the chunk, so the memory stays valid for the reader.
/// A glommio DMA buffer keeps the allocator it came from alive, so a leaked one stays
/// mapped after its executor is gone.
pub struct ChunkLoan {
    chunk: Rc<SealedChunk<JournalBuffer>>,
    /// One count per `LentChunk` out, besides this one.
    out: Arc<()>,
}

impl ChunkLoan {
    pub fn new(chunk: Rc<SealedChunk<JournalBuffer>>) -> Self {
        Self { chunk, out: Arc::new(()) }
    }

    pub fn chunk(&self) -> &Rc<SealedChunk<JournalBuffer>> {
        &self.chunk
    }

    /// The chunk's bytes and header, readable from any thread while this loan lives.
    pub fn lend(&self) -> LentChunk {
        let bytes = self.chunk.bytes();
        LentChunk {
            header: *self.chunk.header(),
            ptr: NonNull::from(bytes).cast(),
            len: bytes.len(),
            _out: Arc::clone(&self.out),
        }
    }
}

impl Drop for ChunkLoan {
    fn drop(&mut self) {
        // `get_mut` succeeds only with no other count left, and synchronises with the
        // drops that released them (Arc's release decrement, acquire here): every read
        // through a `LentChunk` happened before the chunk can be freed below.
        if Arc::get_mut(&mut self.out).is_none() {
            std::mem::forget(Rc::clone(&self.chunk));
        }
    }
}

/// The bytes of a sealed express chunk in its shard's journal buffer, lent by a
/// [`ChunkLoan`] for reading on another thread (the uploader's), with no copy.
pub struct LentChunk {
    header: ChunkHeader,
    ptr: NonNull<u8>,
    len: usize,
    _out: Arc<()>,
}

// SAFETY: a `LentChunk` only reads `ptr..ptr + len`, which its `ChunkLoan` keeps
// allocated until this is dropped (or forever, see `ChunkLoan`'s drop), and nothing
// writes there meanwhile: the loan holds an `Rc` of the sealed chunk, and a sealed
// chunk's bytes are mutable only through `&mut`, i.e. with no other `Rc` of it.
unsafe impl Send for LentChunk {}
// SAFETY: as for `Send`; shared access is reads only.
unsafe impl Sync for LentChunk {}

impl LentChunk {
    /// The chunk, exactly `header().chunk_len()` bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` was a `&[u8]` of the chunk when lent, and stays
        // allocated and unchanged while this lives (see the `Send` impl).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn header(&self) -> &ChunkHeader {
        &self.header
    }
}

impl std::fmt::Debug for LentChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentChunk").field("header", &self.header).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for JournalBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalBuffer").field("len", &self.buf.len()).finish()
    }
}
