//! `AlignedBuf`: a fixed-size heap buffer whose start is 4 KiB-aligned and whose size is
//! a multiple of 4 KiB, so the same bytes can go to an O_DIRECT write and cross to the
//! uploader thread without a copy.
//!
//! glommio's `DmaBuffer` is `!Send`; this one is `Send` and owns its allocation, so a
//! sealed chunk can cross to the uploader core (platform.md). Every byte is written at
//! allocation (zeroed, or copied into), so nothing uninitialised is ever read or
//! written out.

use std::alloc::{self, Layout};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The alignment of every chunk buffer: the logical block size O_DIRECT needs.
pub const ALIGNMENT: usize = 4096;

/// Rounds `len` up to the next multiple of [`ALIGNMENT`].
pub const fn round_up(len: usize) -> usize {
    len.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// A fixed-size, 4 KiB-aligned, fully initialised byte buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    /// The bytes the buffer shows.
    len: usize,
    /// The allocation's size: `len` rounded up to its size class.
    capacity: usize,
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
        let (ptr, capacity) = allocate(len);
        // SAFETY: `ptr` is valid for `capacity >= len` bytes, written through a raw
        // pointer before any slice of them is made.
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        Self { ptr, len, capacity }
    }

    /// A buffer holding `bytes` at `offset` and zeros everywhere else, at least
    /// `offset + bytes.len()` long (rounded as [`AlignedBuf::with_capacity`]). Each byte
    /// is written once: `bytes` are not first zeroed and then overwritten, which for a
    /// copied chunk was a memset as large as the copy.
    pub fn copied_at(offset: usize, bytes: &[u8]) -> Self {
        let end = offset + bytes.len();
        let len = round_up(end.max(1));
        let (ptr, capacity) = allocate(len);
        // SAFETY: `ptr` is valid for `capacity >= len` bytes and `offset <= end <= len`;
        // every byte of `0..len` is written (zeros, then `bytes`, then zeros) before the
        // buffer is read, through raw pointers, so no reference to uninitialised memory
        // is made; `bytes` is a borrow and cannot overlap an allocation this buffer owns.
        unsafe {
            ptr.as_ptr().write_bytes(0, offset);
            ptr.as_ptr().add(offset).copy_from_nonoverlapping(bytes.as_ptr(), bytes.len());
            ptr.as_ptr().add(end).write_bytes(0, len - end);
        }
        Self { ptr, len, capacity }
    }

    /// A buffer holding `parts` one after another from its start and zeros after them,
    /// rounded as [`AlignedBuf::with_capacity`]: an object body assembled where an
    /// O_DIRECT write can take it without staging it first. Each byte is written once.
    pub fn gathered(parts: &[&[u8]]) -> Self {
        let end: usize = parts.iter().map(|part| part.len()).sum();
        let len = round_up(end.max(1));
        let (ptr, capacity) = allocate(len);
        // SAFETY: `ptr` is valid for `capacity >= len >= end` bytes; the parts fill
        // `0..end` back to back and zeros `end..len`, through raw pointers, before any
        // slice of the buffer is made; the parts are borrows and cannot overlap an
        // allocation this buffer owns.
        unsafe {
            let mut at = 0;
            for part in parts {
                ptr.as_ptr().add(at).copy_from_nonoverlapping(part.as_ptr(), part.len());
                at += part.len();
            }
            ptr.as_ptr().add(end).write_bytes(0, len - end);
        }
        Self { ptr, len, capacity }
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the allocation are initialised (the
        // constructors write them all) and owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// `parts` back to back in shared bytes that start 4 KiB-aligned: what an object body is
/// assembled into, so the local store writes it with O_DIRECT without staging it.
pub fn bytes_of(parts: &[&[u8]]) -> s3::Bytes {
    let len: usize = parts.iter().map(|part| part.len()).sum();
    s3::Bytes::from_owner(AlignedBuf::gathered(parts)).slice(..len)
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        release(self.ptr, self.capacity);
    }
}

// ---- Reuse of freed buffers -------------------------------------------------------------
//
// A fresh allocation of chunk size comes from the kernel as untouched pages, so the first
// write to each 4 KiB page faults: under an express append load that was a fifth of the
// shard's time (perf, `bench http`). Freed buffers are therefore kept, up to a bound, and
// handed out again for a request of the same size class. Buffers cross threads (shard to
// uploader and back), so the pool is one for the process, behind a lock taken once per
// allocation and once per free.

/// Buffers per size class step: a class is a power of two split into this many steps,
/// so a buffer is at most an eighth larger than asked for.
const CLASS_STEPS: usize = 8;

/// The bytes of freed buffers kept for reuse, process-wide (`buffer-pool-bytes`).
static POOL_BYTES_MAX: AtomicUsize = AtomicUsize::new(tuning::BUFFER_POOL_BYTES.default as usize);

struct Pool {
    held: usize,
    /// The kept buffers by capacity (size class), each class a stack: a lookup is one
    /// map probe however many buffers are kept, where a flat list was scanned whole.
    free: BTreeMap<usize, Vec<FreeBuf>>,
}

/// A kept allocation, owned by the pool.
struct FreeBuf(NonNull<u8>);

// SAFETY: a kept allocation is owned by the pool alone; it is only handed out by moving
// it out of the pool under the lock.
unsafe impl Send for FreeBuf {}

static POOL: Mutex<Pool> = Mutex::new(Pool { held: 0, free: BTreeMap::new() });

/// Sets how many bytes of freed buffers the process keeps for reuse; 0 keeps none.
pub fn set_pool_bytes_max(bytes: usize) {
    POOL_BYTES_MAX.store(bytes, Ordering::Relaxed);
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    while pool.held > bytes {
        let Some(mut class) = pool.free.last_entry() else { break };
        let capacity = *class.key();
        let Some(buf) = class.get_mut().pop() else {
            class.remove();
            continue;
        };
        pool.held -= capacity;
        // SAFETY: the pool owned `buf`, allocated with exactly this capacity's layout.
        unsafe { alloc::dealloc(buf.0.as_ptr(), layout(capacity)) };
    }
}

/// The bytes of freed buffers the pool holds now.
pub fn pool_bytes() -> usize {
    POOL.lock().unwrap_or_else(|e| e.into_inner()).held
}

/// The size an allocation of `len` bytes (a multiple of 4 KiB) is rounded up to.
fn size_class(len: usize) -> usize {
    let power = len.next_power_of_two();
    let step = (power / 2 / CLASS_STEPS).max(ALIGNMENT);
    len.div_ceil(step) * step
}

/// An allocation of at least `len` bytes (a multiple of 4 KiB): a kept one of its size
/// class if there is one, else a fresh one. Its bytes are not initialised.
fn allocate(len: usize) -> (NonNull<u8>, usize) {
    let capacity = size_class(len);
    {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(buf) = pool.free.get_mut(&capacity).and_then(Vec::pop) {
            pool.held -= capacity;
            return (buf.0, capacity);
        }
    }
    let layout = layout(capacity);
    // SAFETY: the layout has a non-zero size (capacity >= len >= ALIGNMENT).
    let raw = unsafe { alloc::alloc(layout) };
    let Some(ptr) = NonNull::new(raw) else { alloc::handle_alloc_error(layout) };
    (ptr, capacity)
}

/// Gives an allocation back: kept for reuse while the pool has room, else freed.
fn release(ptr: NonNull<u8>, capacity: usize) {
    {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if pool.held + capacity <= POOL_BYTES_MAX.load(Ordering::Relaxed) {
            pool.held += capacity;
            pool.free.entry(capacity).or_default().push(FreeBuf(ptr));
            return;
        }
    }
    // SAFETY: `ptr` came from `alloc` with exactly this capacity's layout and is owned
    // by the caller, which gives it up here.
    unsafe { alloc::dealloc(ptr.as_ptr(), layout(capacity)) }
}

fn layout(capacity: usize) -> Layout {
    Layout::from_size_align(capacity, ALIGNMENT)
        .expect("capacity is a multiple of a power-of-two alignment and far below isize::MAX")
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
    fn gathered_holds_the_parts_in_order_and_zeros_after_them() {
        let a: Vec<u8> = (1..=250u8).cycle().take(4000).collect();
        let b: Vec<u8> = (7..=90u8).cycle().take(300).collect();
        let buf = AlignedBuf::gathered(&[&a, &[], &b]);
        assert_eq!(buf.as_slice().len(), 8192);
        assert_eq!(buf.as_slice().as_ptr() as usize % ALIGNMENT, 0);
        assert_eq!(&buf.as_slice()[..4000], &a[..]);
        assert_eq!(&buf.as_slice()[4000..4300], &b[..]);
        assert!(buf.as_slice()[4300..].iter().all(|&x| x == 0));
        assert_eq!(AlignedBuf::gathered(&[]).as_slice(), &[0u8; ALIGNMENT][..]);
        assert_eq!(AlignedBuf::gathered(&[&[9u8; ALIGNMENT]]).as_slice(), &[9u8; ALIGNMENT][..]);
    }

    #[test]
    fn size_classes_waste_at_most_an_eighth_and_stay_aligned() {
        for len in (1..=4096).map(|blocks| blocks * ALIGNMENT) {
            let class = size_class(len);
            assert!(class >= len && class.is_multiple_of(ALIGNMENT), "{len} -> {class}");
            assert!(class - len <= len / 8, "{len} -> {class}");
        }
        assert_eq!(size_class(ALIGNMENT), ALIGNMENT);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + ALIGNMENT), (1 << 20) + (1 << 17));
    }

    #[test]
    fn a_freed_buffer_is_reused_dirty_but_every_constructor_initialises_it() {
        // A size no other test uses, so the pool's other users cannot take it.
        let len = 777 * ALIGNMENT;
        let mut first = AlignedBuf::with_capacity(len);
        first.as_mut_slice().fill(0xEE);
        let address = first.as_slice().as_ptr() as usize;
        drop(first);
        let again = AlignedBuf::with_capacity(len - 1);
        assert_eq!(again.as_slice().as_ptr() as usize, address, "the freed buffer comes back");
        assert!(again.as_slice().iter().all(|&b| b == 0), "and is zeroed");
        drop(again);
        let copied = AlignedBuf::copied_at(100, b"abc");
        assert_ne!(copied.as_slice().as_ptr() as usize, address, "another size class");
        let copied = AlignedBuf::copied_at(len - 3, b"abc");
        assert_eq!(copied.as_slice().as_ptr() as usize, address);
        assert!(copied.as_slice()[..len - 3].iter().all(|&b| b == 0));
        assert_eq!(&copied.as_slice()[len - 3..], b"abc");
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
