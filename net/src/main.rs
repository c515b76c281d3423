//! The `nova` command: `nova serve` runs a node with the HTTP server; every other verb
//! is a client of a running server (operations.md).

/// Express chunks' DMA buffers come back from a pool instead of from fresh pages, and
/// everything else comes from mimalloc (`engine::aligned::PoolingAllocator`).
#[global_allocator]
static ALLOCATOR: engine::aligned::PoolingAllocator = engine::aligned::PoolingAllocator;

fn main() {
    let mut args = Vec::new();
    for (at, arg) in std::env::args_os().enumerate().skip(1) {
        match arg.into_string() {
            Ok(arg) => args.push(arg),
            Err(arg) => {
                let shown = arg.to_string_lossy();
                eprintln!("nova: argument {at} ({shown:?}) is not UTF-8: nova takes UTF-8 text");
                std::process::exit(2);
            }
        }
    }
    std::process::exit(net::cli::main(args));
}
