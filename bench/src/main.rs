//! nova's benchmarks. Every figure is reported next to a reference measured in the same
//! run on the same bytes (memcpy here; raw O_DIRECT writes, loopback TCP and raw PUTs in
//! the suites that need them), because these machines are noisy: the ratio is the
//! result, the absolute figure is context.
//!
//! `cargo run -p bench --profile ci -- codec` runs the format microbenchmarks;
//! `--quick` shrinks every workload to a smoke run (what CI does).

mod codec;
mod engine;
mod harness;
mod http;
mod journal;
mod objects;

use std::process::ExitCode;

const USAGE: &str = "usage: bench <codec|journal|engine|objects|http|all> [--quick]

  codec   stored-record encode and validate-decode, chunk build and chunk parse (CRCs),
          each in GB/s and as a ratio to memcpy of the same bytes in the same run
  journal the express journal alone: 16 x 1 MiB chunks per group into fresh and into
          recycled segments, next to raw 1 MiB O_DIRECT writes, 16 per fdatasync
  engine  express appends through a node in this process: appends/s, MB/s, ack latency
          percentiles and batches per fdatasync, next to raw O_DIRECT write + fdatasync
          of the same disk in the same run (run from the workspace: it writes under
          target/bench-engine)
  objects standard appends through a node in this process, acknowledged from the object
          store: the local directory and moto (when NOVA_MOTO_SERVER names moto_server),
          next to raw PUTs of the same store in the same run; objects/s, bytes per PUT
          (writes under target/bench-objects)
  http    JSON and binary appends over loopback HTTP to a `nova serve` child process
          (target/ci/nova, next to this binary), next to raw loopback TCP in the same run
          (writes under target/bench-http)
  all     every suite above
  --quick small workloads, one pass: a smoke run, not a measurement";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let suites: Vec<&str> =
        args.iter().map(String::as_str).filter(|a| !a.starts_with("--")).collect();
    let all = ["codec", "journal", "engine", "objects", "http"];
    let chosen: Vec<&str> = match suites.as_slice() {
        ["all"] => all.to_vec(),
        [one] if all.contains(one) => vec![*one],
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    for suite in chosen {
        match suite {
            "codec" => codec::run(quick),
            "journal" => journal::run(quick),
            "engine" => engine::run(quick),
            "objects" => objects::run(quick),
            "http" => {
                if let Err(why) = http::run(quick) {
                    eprintln!("bench http: {why}");
                    return ExitCode::FAILURE;
                }
            }
            _ => unreachable!("the suite was checked against the list"),
        }
    }
    ExitCode::SUCCESS
}
