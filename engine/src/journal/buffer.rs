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
//! ([`crate::loan::ChunkLoan`]), holding the chunk until the uploader has given them back.

use std::cell::Cell;
use std::rc::Rc;

use glommio::io::DmaBuffer;

use crate::chunk::ChunkStorage;

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

impl std::fmt::Debug for JournalBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalBuffer").field("len", &self.buf.len()).finish()
    }
}
