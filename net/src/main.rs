//! The `nova` command: `nova serve` runs a node with the HTTP server; every other verb
//! is a client of a running server (operations.md).

/// Express chunks' DMA buffers come back from a pool instead of from fresh pages, and
/// everything else comes from mimalloc (`engine::aligned::PoolingAllocator`).
#[global_allocator]
static ALLOCATOR: engine::aligned::PoolingAllocator = engine::aligned::PoolingAllocator;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(net::cli::main(args));
}
