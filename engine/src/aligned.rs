//! `AlignedBuf`: a heap buffer whose start is 4 KiB-aligned and whose capacity is a
//! multiple of 4 KiB, so the same bytes can go to an O_DIRECT write and to the uploader
//! thread without a copy.
//!
//! glommio's `DmaBuffer` is `!Send`; this one is `Send` and owns its allocation, so a
//! sealed chunk can cross to the uploader core (platform.md). The memory is zeroed at
//! allocation so padding past the logical length is deterministic on disk.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// The alignment of every chunk buffer: the logical block size O_DIRECT needs.
pub const ALIGNMENT: usize = 4096;

/// Rounds `len` up to the next multiple of [`ALIGNMENT`].
pub const fn round_up(len: usize) -> usize {
    len.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// A fixed-capacity, 4 KiB-aligned, zero-initialised byte buffer with a logical length.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively (no aliasing pointers escape
// except through borrows tied to `&self`/`&mut self`), like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of at least `capacity` bytes (rounded up to a multiple of 4 KiB, at least
    /// 4 KiB), zeroed, with length 0.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = round_up(capacity.max(1));
        let layout = Self::layout(capacity);
        // SAFETY: the layout has a non-zero size (capacity >= ALIGNMENT).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        Self { ptr, capacity, len: 0 }
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, ALIGNMENT)
            .expect("capacity is a multiple of a power-of-two alignment and far below isize::MAX")
    }

    /// Bytes the buffer can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The logical length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the logical length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The logical bytes rounded up to the alignment (zero padding included): what an
    /// O_DIRECT write of this buffer sends.
    pub fn padded(&self) -> &[u8] {
        // SAFETY: round_up(len) <= capacity because capacity is a multiple of ALIGNMENT
        // and len <= capacity; the whole capacity is initialised (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), round_up(self.len)) }
    }

    /// The whole capacity, read-only: views of a buffer being filled read past `len`.
    pub fn capacity_bytes(&self) -> &[u8] {
        // SAFETY: the allocation is `capacity` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity) }
    }

    /// The whole capacity, writable. Bytes past `len` are zero or earlier writes.
    pub fn capacity_mut(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `capacity` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }

    /// Sets the logical length.
    ///
    /// # Panics
    /// If `len` exceeds the capacity (a caller bug, not bad input).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity, "length {len} over capacity {}", self.capacity);
        self.len = len;
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: len <= capacity and the allocation is initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_rounded_and_zeroed() {
        let mut buf = AlignedBuf::with_capacity(5000);
        assert_eq!(buf.capacity(), 8192);
        assert_eq!(buf.as_ptr() as usize % ALIGNMENT, 0);
        assert!(buf.capacity_mut().iter().all(|&b| b == 0));
        buf.capacity_mut()[..3].copy_from_slice(b"abc");
        buf.set_len(3);
        assert_eq!(&*buf, b"abc");
        assert_eq!(buf.padded().len(), 4096);
        assert!(buf.padded()[3..].iter().all(|&b| b == 0));
    }

    #[test]
    fn zero_capacity_still_one_block() {
        let buf = AlignedBuf::with_capacity(0);
        assert_eq!(buf.capacity(), ALIGNMENT);
        assert!(buf.is_empty());
        assert_eq!(buf.padded().len(), 0);
    }

    #[test]
    #[should_panic(expected = "over capacity")]
    fn set_len_past_capacity_panics() {
        AlignedBuf::with_capacity(1).set_len(4097);
    }
}
