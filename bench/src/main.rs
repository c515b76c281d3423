//! nova's benchmarks. Every figure is reported next to a reference measured in the same
//! run on the same bytes (memcpy here; raw O_DIRECT writes, loopback TCP and raw PUTs in
//! the suites that need them), because these machines are noisy: the ratio is the
//! result, the absolute figure is context.
//!
//! `cargo run -p bench --release -- codec` runs the format microbenchmarks;
//! `--quick` shrinks every workload to a smoke run (what CI does).

mod codec;
mod engine;
mod harness;
mod journal;

use std::process::ExitCode;

const USAGE: &str = "usage: bench <codec|engine|all> [--quick]

  codec   stored-record encode and validate-decode, chunk build and chunk parse (CRCs),
          each in GB/s and as a ratio to memcpy of the same bytes in the same run
  journal the express journal alone: 16 x 1 MiB chunks per group into fresh and into
          recycled segments, next to raw 1 MiB O_DIRECT writes, 16 per fdatasync
  engine  express appends through a node in this process: appends/s, MB/s, ack latency
          percentiles and batches per fdatasync, next to raw O_DIRECT write + fdatasync
          of the same disk in the same run (run from the workspace: it writes under
          target/bench-engine)
  all     every suite above
  --quick small workloads, one pass: a smoke run, not a measurement";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let suites: Vec<&str> =
        args.iter().map(String::as_str).filter(|a| !a.starts_with("--")).collect();
    let (codec, journal, engine) = match suites.as_slice() {
        ["codec"] => (true, false, false),
        ["journal"] => (false, true, false),
        ["engine"] => (false, false, true),
        ["all"] => (true, true, true),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if codec {
        codec::run(quick);
    }
    if journal {
        journal::run(quick);
    }
    if engine {
        engine::run(quick);
    }
    ExitCode::SUCCESS
}
