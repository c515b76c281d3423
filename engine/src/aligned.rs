//! `AlignedBuf`: a fixed-size heap buffer whose start is 4 KiB-aligned and whose size is
//! a multiple of 4 KiB, so the same bytes can go to an O_DIRECT write and cross to the
//! uploader thread without a copy.
//!
//! glommio's `DmaBuffer` is `!Send`; this one is `Send` and owns its allocation, so a
//! sealed chunk can cross to the uploader core (platform.md). Every byte is written at
//! allocation (zeroed, or copied into), so nothing uninitialised is ever read or
//! written out.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::{BTreeMap, VecDeque};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use mimalloc::MiMalloc;

/// The allocator beneath the pool and beneath [`PoolingAllocator`]: mimalloc, not glibc's
/// malloc. An HTTP append allocates a few dozen small objects (hyper's buffers, names,
/// the ack's JSON) and frees some of them on another thread; glibc served them from
/// fragmented arenas, with `malloc_consolidate` on every allocation of a kilobyte or more,
/// and that cost the shard 9% of its core. With mimalloc's thread-local free lists the
/// shard spends about a fifth less CPU per GiB acknowledged (`scripts/ab`,
/// docs/benchmarks.md).
static BASE: MiMalloc = MiMalloc;

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

    /// The bytes its allocation takes: its length rounded up to its size class, or a
    /// class up to half again as large that the pool had kept.
    pub fn allocated(&self) -> usize {
        self.capacity
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
// handed out again for a request of the same size class (or, for nova's own buffers, a
// class up to half as large again). Buffers cross threads (shard to uploader and back),
// so the pool is one for the process, behind a lock taken once per allocation and once
// per free.
//
// When a freed buffer does not fit under the bound, the buffers kept longest are freed
// to make room for it: sizes the process stopped asking for (a burst of odd-sized chunks)
// leave the pool instead of filling it for good and turning away the sizes in steady use
// (the uploader's 32 MiB settled bodies).

/// Buffers per size class step: a class is a power of two split into this many steps,
/// so a buffer is at most an eighth larger than asked for.
const CLASS_STEPS: usize = 8;

/// The bytes of freed buffers kept for reuse, process-wide (`buffer-pool-bytes`).
static POOL_BYTES_MAX: AtomicUsize = AtomicUsize::new(tuning::BUFFER_POOL_BYTES.default as usize);

struct Pool {
    held: usize,
    /// The kept buffers by age (the order they were freed in), with their capacity.
    by_age: BTreeMap<u64, (usize, FreeBuf)>,
    /// The ages of the kept buffers of each capacity (size class), oldest first: a
    /// request takes its class's youngest (warmest) buffer, room is made from the
    /// pool's oldest. Each is one map probe however many buffers are kept.
    classes: BTreeMap<usize, VecDeque<u64>>,
    next_age: u64,
}

/// A kept allocation, owned by the pool.
struct FreeBuf(NonNull<u8>);

// SAFETY: a kept allocation is owned by the pool alone; it is only handed out by moving
// it out of the pool under the lock.
unsafe impl Send for FreeBuf {}

static POOL: Mutex<Pool> = Mutex::new(Pool::new());

impl Pool {
    const fn new() -> Self {
        Self { held: 0, by_age: BTreeMap::new(), classes: BTreeMap::new(), next_age: 0 }
    }

    fn lock() -> std::sync::MutexGuard<'static, Pool> {
        POOL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The youngest kept buffer of the smallest class in `capacity..=largest`, with its
    /// capacity.
    fn take(&mut self, capacity: usize, largest: usize) -> Option<(usize, FreeBuf)> {
        let (&class, _) = self.classes.range(capacity..=largest).next()?;
        let age = self.unlist(class, VecDeque::pop_back)?;
        Some((class, self.by_age.remove(&age).expect("every class entry has its buffer").1))
    }

    /// The oldest kept buffer, with its capacity.
    fn take_oldest(&mut self) -> Option<(usize, FreeBuf)> {
        let (age, (capacity, buf)) = self.by_age.pop_first()?;
        let oldest = self.unlist(capacity, VecDeque::pop_front);
        assert_eq!(oldest, Some(age), "a class is in age order");
        Some((capacity, buf))
    }

    /// Takes one age off `capacity`'s class (`end`: its youngest or its oldest), and the
    /// capacity off `held`.
    fn unlist(
        &mut self,
        capacity: usize,
        end: fn(&mut VecDeque<u64>) -> Option<u64>,
    ) -> Option<u64> {
        let class = self.classes.get_mut(&capacity)?;
        let age = end(class).expect("an empty class is removed");
        if class.is_empty() {
            self.classes.remove(&capacity);
        }
        self.held -= capacity;
        Some(age)
    }

    /// Keeps `buf` if it fits under `max` once older buffers are let go: what goes, to
    /// be freed outside the lock, is returned (`buf` itself if it is larger than `max`).
    fn keep(&mut self, capacity: usize, buf: FreeBuf, max: usize) -> Vec<(usize, FreeBuf)> {
        if capacity > max {
            return vec![(capacity, buf)];
        }
        let mut evicted = Vec::new();
        while self.held + capacity > max {
            let Some(oldest) = self.take_oldest() else { break };
            evicted.push(oldest);
        }
        let age = self.next_age;
        self.next_age += 1;
        self.by_age.insert(age, (capacity, buf));
        self.classes.entry(capacity).or_default().push_back(age);
        self.held += capacity;
        evicted
    }
}

/// Frees buffers the pool let go.
fn free_all(evicted: Vec<(usize, FreeBuf)>) {
    for (capacity, buf) in evicted {
        // SAFETY: the pool owned `buf`, allocated from `BASE` with exactly this
        // capacity's layout.
        unsafe { BASE.dealloc(buf.0.as_ptr(), layout(capacity)) };
    }
}

/// Sets how many bytes of freed buffers the process keeps for reuse; 0 keeps none.
pub fn set_pool_bytes_max(bytes: usize) {
    POOL_BYTES_MAX.store(bytes, Ordering::Relaxed);
    let mut evicted = Vec::new();
    {
        let mut pool = Pool::lock();
        while pool.held > bytes {
            let Some(oldest) = pool.take_oldest() else { break };
            evicted.push(oldest);
        }
    }
    free_all(evicted);
}

/// The bytes of freed buffers the pool holds now.
pub fn pool_bytes() -> usize {
    Pool::lock().held
}

/// The size an allocation of `len` bytes (a multiple of 4 KiB) is rounded up to.
fn size_class(len: usize) -> usize {
    let power = len.next_power_of_two();
    let step = (power / 2 / CLASS_STEPS).max(ALIGNMENT);
    len.div_ceil(step) * step
}

/// An allocation of at least `len` bytes (a multiple of 4 KiB), with its capacity: a
/// kept one of its size class or up to half as large again if there is one, else a fresh
/// one. Its bytes are not initialised.
///
/// The slack is for object bodies, whose sizes spread over many classes (transit bundles
/// are cut by time as often as by size, from a few hundred KiB to the target): taking
/// only their own class, many missed the pool and faulted in fresh pages. With the
/// slack, the uploader thread's page faults per `scripts/ab` run fell from 86k and 62k to
/// 44k and 36k (docs/benchmarks.md).
fn allocate(len: usize) -> (NonNull<u8>, usize) {
    let capacity = size_class(len);
    try_allocate(capacity, capacity + capacity / 2)
        .unwrap_or_else(|| std::alloc::handle_alloc_error(layout(capacity)))
}

/// A kept buffer of a class in `capacity..=largest` (the smallest there is), else a
/// fresh one of `capacity`; `None` where the system has no memory to give.
fn try_allocate(capacity: usize, largest: usize) -> Option<(NonNull<u8>, usize)> {
    if let Some((class, buf)) = Pool::lock().take(capacity, largest) {
        return Some((buf.0, class));
    }
    let layout = layout(capacity);
    // SAFETY: the layout has a non-zero size (a size class is at least ALIGNMENT). `BASE`,
    // not the global allocator: that may be [`PoolingAllocator`], which calls this.
    let raw = unsafe { BASE.alloc(layout) };
    NonNull::new(raw).map(|ptr| (ptr, capacity))
}

/// Gives an allocation back: kept for reuse, making room by freeing the oldest kept, or
/// freed if it is larger than the whole pool.
fn release(ptr: NonNull<u8>, capacity: usize) {
    let max = POOL_BYTES_MAX.load(Ordering::Relaxed);
    let evicted = Pool::lock().keep(capacity, FreeBuf(ptr), max);
    free_all(evicted);
}

/// The smallest allocation [`PoolingAllocator`] draws from the pool: below it, mimalloc's
/// own free lists serve as well, and a class per 4 KiB would only fragment the pool.
const POOLED_BYTES_MIN: usize = 64 << 10;

/// The process's allocator for binaries that run a node: every 4 KiB-aligned allocation
/// of 64 KiB or more comes from the same pool as [`AlignedBuf`], everything else from
/// mimalloc ([`BASE`]).
///
/// It is for the buffers nova does not allocate itself: an express chunk is built in a
/// glommio DMA buffer (`journal::JournalBuffer`), which glommio allocates with a 4 KiB
/// alignment from the global allocator. glibc served those from `mmap` or from arena
/// heaps it trims (mimalloc, too, gives freed memory back to the kernel), so a chunk's
/// memory went back to the kernel when the cache evicted it and the next chunk faulted
/// every page in again: under express appends over HTTP, 9% of
/// the shard's core in page faults and 3% more in `munmap` and its TLB shootdowns (perf,
/// `scripts/ab`). Through the pool such a buffer goes to the next chunk with its old
/// bytes, which changes nothing for its user: memory from `alloc` is uninitialised by
/// contract, and a journal buffer's every byte is written before it is sent
/// (`journal::JournalBuffer`).
///
/// Install it with `#[global_allocator]`; without it nova runs the same, only slower.
pub struct PoolingAllocator;

fn pooled(layout: Layout) -> bool {
    layout.align() == ALIGNMENT && layout.size() >= POOLED_BYTES_MIN
}

// SAFETY: pooled layouts get an allocation of at least `round_up(size)` bytes aligned to
// `ALIGNMENT` (the layout's alignment) and give it back to the pool by the same size, so
// the capacity `release` is told is the one `allocate` chose; every other layout is the
// system allocator's, untouched. The pool's own bookkeeping allocates only small,
// 8-byte-aligned memory, which never re-enters the pool (no lock is taken twice).
unsafe impl GlobalAlloc for PoolingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if pooled(layout) {
            // Its own class only: `dealloc` knows the capacity by the layout alone.
            let capacity = size_class(round_up(layout.size()));
            try_allocate(capacity, capacity).map_or(std::ptr::null_mut(), |(ptr, _)| ptr.as_ptr())
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { BASE.alloc(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if pooled(layout) {
            // SAFETY: a pooled layout's memory came from `allocate` above, non-null.
            let ptr = unsafe { NonNull::new_unchecked(ptr) };
            release(ptr, size_class(round_up(layout.size())));
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { BASE.dealloc(ptr, layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if pooled(layout) {
            // SAFETY: as `alloc`; a kept buffer is dirty, so it is zeroed here.
            unsafe {
                let ptr = self.alloc(layout);
                ptr.write_bytes(0, layout.size());
                ptr
            }
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { BASE.alloc_zeroed(layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract: `layout` is `ptr`'s, `new_size` fits `isize`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if !pooled(layout) && !pooled(new_layout) {
            // SAFETY: the caller's contract, passed on: Vec growth keeps the allocator's
            // in-place path.
            return unsafe { BASE.realloc(ptr, layout, new_size) };
        }
        // SAFETY: a fresh allocation for the new layout, the overlap copied, the old one
        // given back by its own layout: the caller's contract for each call.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                new.copy_from_nonoverlapping(ptr, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
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
    fn a_full_pool_lets_its_oldest_buffers_go_and_hands_out_the_youngest() {
        // A pool of its own, with stand-in pointers that are never freed or read.
        let mut pool = Pool::new();
        let buf = |n: usize| FreeBuf(NonNull::new((n * ALIGNMENT) as *mut u8).unwrap());
        let address = |buf: &FreeBuf| buf.0.as_ptr() as usize / ALIGNMENT;
        let addresses = |gone: Vec<(usize, FreeBuf)>| {
            gone.iter().map(|(capacity, buf)| (*capacity, address(buf))).collect::<Vec<_>>()
        };
        let max = 10;
        assert!(pool.keep(2, buf(1), max).is_empty());
        assert!(pool.keep(4, buf(2), max).is_empty());
        assert!(pool.keep(4, buf(3), max).is_empty());
        assert_eq!(pool.held, 10);
        // Room for a 3 is made from the oldest: the 2, then the older 4.
        assert_eq!(addresses(pool.keep(3, buf(4), max)), [(2, 1), (4, 2)]);
        assert_eq!(pool.held, 7);
        // Larger than the whole pool: given straight back, nothing else goes.
        assert_eq!(addresses(pool.keep(11, buf(5), max)), [(11, 5)]);
        assert_eq!(pool.held, 7);
        assert!(pool.take(2, 2).is_none(), "its class left with it");
        // 7 + 4 > 10: the older 4 goes.
        assert_eq!(addresses(pool.keep(4, buf(6), max)), [(4, 3)]);
        let taken = |pool: &mut Pool, capacity, largest| {
            pool.take(capacity, largest).map(|(class, b)| (class, address(&b)))
        };
        assert_eq!(taken(&mut pool, 4, 4), Some((4, 6)), "the youngest of its class");
        assert_eq!(taken(&mut pool, 4, 4), None);
        assert_eq!(taken(&mut pool, 3, 3), Some((3, 4)));
        assert_eq!((pool.held, pool.by_age.len(), pool.classes.len()), (0, 0, 0));
    }

    #[test]
    fn a_request_takes_the_smallest_kept_class_within_its_slack() {
        let mut pool = Pool::new();
        let buf = |n: usize| FreeBuf(NonNull::new((n * ALIGNMENT) as *mut u8).unwrap());
        for (capacity, n) in [(8, 1), (6, 2), (5, 3), (5, 4)] {
            assert!(pool.keep(capacity, buf(n), 100).is_empty());
        }
        let taken = |pool: &mut Pool, capacity, largest| {
            pool.take(capacity, largest).map(|(class, b)| (class, b.0.as_ptr() as usize))
        };
        assert_eq!(taken(&mut pool, 4, 4), None, "no class of its own, no slack");
        assert_eq!(taken(&mut pool, 4, 6), Some((5, 4 * ALIGNMENT)), "the smallest, youngest");
        assert_eq!(taken(&mut pool, 4, 6), Some((5, 3 * ALIGNMENT)));
        assert_eq!(taken(&mut pool, 4, 6), Some((6, 2 * ALIGNMENT)));
        assert_eq!(taken(&mut pool, 4, 7), None, "the 8 is beyond the slack");
        assert_eq!(pool.held, 8);
    }

    #[test]
    fn a_buffer_from_a_larger_class_goes_back_as_that_class() {
        // Sizes no other test uses, so the pool's other users cannot take them.
        let large = size_class(905 * ALIGNMENT);
        let asked = 801 * ALIGNMENT;
        assert!(size_class(asked) < large && large <= size_class(asked) * 3 / 2);
        let first = AlignedBuf::with_capacity(large);
        let address = first.as_slice().as_ptr() as usize;
        drop(first);
        let again = AlignedBuf::with_capacity(asked);
        assert_eq!(again.as_slice().as_ptr() as usize, address, "the larger buffer serves");
        assert_eq!((again.as_slice().len(), again.capacity), (asked, large));
        drop(again);
        let whole = AlignedBuf::with_capacity(large);
        assert_eq!(whole.as_slice().as_ptr() as usize, address, "kept as its own class");
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
