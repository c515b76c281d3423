//! `AlignedBuf`: a fixed-size heap buffer whose start is 4 KiB-aligned and whose size is
//! a multiple of 4 KiB, so the same bytes can go to an O_DIRECT write and cross to the
//! uploader thread without a copy.
//!
//! glommio's `DmaBuffer` is `!Send`; this one is `Send` and owns its allocation, so a
//! sealed chunk can cross to the uploader core (platform.md). Every byte is written at
//! allocation (zeroed, or copied into), so nothing uninitialised is ever read or
//! written out.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// The alignment of every chunk buffer: the logical block size O_DIRECT needs.
pub const ALIGNMENT: usize = 4096;

/// Rounds `len` up to the next multiple of [`ALIGNMENT`].
pub const fn round_up(len: usize) -> usize {
    len.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// A fixed-size, 4 KiB-aligned, fully initialised byte buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively (no aliasing pointers escape
// except through borrows tied to `&self`/`&mut self`), like a `Box<[u8]>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `len` bytes, rounded up to a multiple of 4 KiB (at
    /// least 4 KiB).
    pub fn with_capacity(len: usize) -> Self {
        let len = round_up(len.max(1));
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (len >= ALIGNMENT).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        Self { ptr, len }
    }

    /// A buffer holding `bytes` at `offset` and zeros everywhere else, at least
    /// `offset + bytes.len()` long (rounded as [`AlignedBuf::with_capacity`]). Each byte
    /// is written once: `bytes` are not first zeroed and then overwritten, which for a
    /// copied chunk was a memset as large as the copy.
    pub fn copied_at(offset: usize, bytes: &[u8]) -> Self {
        let end = offset + bytes.len();
        let len = round_up(end.max(1));
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (len >= ALIGNMENT).
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
        // SAFETY: `ptr` is valid for `len` bytes and `offset <= end <= len`; every byte of
        // `0..len` is written (zeros, then `bytes`, then zeros) before the buffer is read,
        // through raw pointers, so no reference to uninitialised memory is made; `bytes`
        // is a borrow and cannot overlap the fresh allocation.
        unsafe {
            ptr.as_ptr().write_bytes(0, offset);
            ptr.as_ptr().add(offset).copy_from_nonoverlapping(bytes.as_ptr(), bytes.len());
            ptr.as_ptr().add(end).write_bytes(0, len - end);
        }
        Self { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, ALIGNMENT)
            .expect("len is a multiple of a power-of-two alignment and far below isize::MAX")
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation is `len` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc` or `alloc_zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_rounded_and_zeroed() {
        let mut buf = AlignedBuf::with_capacity(5000);
        assert_eq!(buf.as_slice().len(), 8192);
        assert_eq!(buf.as_slice().as_ptr() as usize % ALIGNMENT, 0);
        assert!(buf.as_slice().iter().all(|&b| b == 0));
        buf.as_mut_slice()[..3].copy_from_slice(b"abc");
        assert_eq!(&buf.as_slice()[..4], b"abc\0");
    }

    #[test]
    fn copied_at_holds_the_bytes_at_the_offset_and_zeros_around_them() {
        let bytes: Vec<u8> = (1..=200u8).cycle().take(5000).collect();
        let buf = AlignedBuf::copied_at(64, &bytes);
        assert_eq!(buf.as_slice().len(), 8192);
        assert_eq!(buf.as_slice().as_ptr() as usize % ALIGNMENT, 0);
        assert!(buf.as_slice()[..64].iter().all(|&b| b == 0));
        assert_eq!(&buf.as_slice()[64..5064], &bytes[..]);
        assert!(buf.as_slice()[5064..].iter().all(|&b| b == 0));
        assert_eq!(AlignedBuf::copied_at(0, &[]).as_slice(), &[0u8; ALIGNMENT][..]);
        assert_eq!(AlignedBuf::copied_at(4096, &[]).as_slice().len(), 4096);
    }

    #[test]
    fn zero_capacity_still_one_block() {
        assert_eq!(AlignedBuf::with_capacity(0).as_slice().len(), ALIGNMENT);
    }

    #[test]
    fn round_up_to_blocks() {
        assert_eq!(round_up(0), 0);
        assert_eq!(round_up(1), 4096);
        assert_eq!(round_up(4096), 4096);
        assert_eq!(round_up(4097), 8192);
    }
}
