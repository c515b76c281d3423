//! `aligned::PoolingAllocator` installed as the global allocator, as `nova` installs it:
//! glommio's DMA buffers, which express chunks are built in, come back from the pool
//! instead of from the kernel's fresh pages. This binary holds this test alone, so the
//! process-wide pool is its own.

use engine::aligned::{self, PoolingAllocator};
use glommio::{LocalExecutorBuilder, Placement};

#[global_allocator]
static ALLOCATOR: PoolingAllocator = PoolingAllocator;

#[test]
fn a_freed_dma_buffer_goes_to_the_pool_and_the_next_one_comes_from_it() {
    // Larger than glommio's own 10 MiB buffer area, which would otherwise serve it.
    const BYTES: usize = 12 << 20;
    let executor = LocalExecutorBuilder::new(Placement::Unbound).make().expect("an executor");
    executor.run(async {
        let held = aligned::pool_bytes();
        let mut first = glommio::allocate_dma_buffer(BYTES);
        first.as_bytes_mut().fill(0xA5);
        let address = first.as_ptr() as usize;
        assert_eq!(address % aligned::ALIGNMENT, 0);
        drop(first);
        assert_eq!(aligned::pool_bytes(), held + BYTES, "the freed buffer is kept");

        let second = glommio::allocate_dma_buffer(BYTES);
        assert_eq!(second.as_ptr() as usize, address, "and handed out again");
        assert_eq!(aligned::pool_bytes(), held);
        drop(second);
    });
}

#[test]
fn pooled_memory_is_zeroed_when_asked_and_kept_across_a_realloc() {
    use std::alloc::{GlobalAlloc, Layout};
    let layout = Layout::from_size_align(300 << 10, aligned::ALIGNMENT).expect("a layout");
    // SAFETY: each pointer is used within its layout's size and freed by that layout.
    unsafe {
        let dirty = ALLOCATOR.alloc(layout);
        dirty.write_bytes(0xEE, layout.size());
        ALLOCATOR.dealloc(dirty, layout);
        let zeroed = ALLOCATOR.alloc_zeroed(layout);
        assert_eq!(zeroed, dirty, "the same buffer, from the pool");
        let bytes = std::slice::from_raw_parts(zeroed, layout.size());
        assert!(bytes.iter().all(|&b| b == 0), "zeroed though it came back dirty");

        zeroed.write_bytes(7, layout.size());
        let grown = ALLOCATOR.realloc(zeroed, layout, 600 << 10);
        assert_eq!(grown as usize % aligned::ALIGNMENT, 0);
        let bytes = std::slice::from_raw_parts(grown, layout.size());
        assert!(bytes.iter().all(|&b| b == 7), "a realloc keeps the bytes");
        ALLOCATOR.dealloc(grown, Layout::from_size_align(600 << 10, aligned::ALIGNMENT).unwrap());

        // Small or byte-aligned memory is the system's, realloc included.
        let small = Layout::from_size_align(100, 8).expect("a layout");
        let p = ALLOCATOR.alloc(small);
        p.write_bytes(3, 100);
        let p = ALLOCATOR.realloc(p, small, 1 << 20);
        assert!(std::slice::from_raw_parts(p, 100).iter().all(|&b| b == 3));
        ALLOCATOR.dealloc(p, Layout::from_size_align(1 << 20, 8).unwrap());
    }
}
