//! The `nova` command: `nova serve` runs a node with the HTTP server; every other verb
//! is a client of a running server (operations.md).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(net::cli::main(args));
}
