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
          percentiles and batches per group commit, next to raw O_DIRECT write + fdatasync
          of the same disk in the same run (run from the workspace: it writes under
          target/bench-engine)
  objects standard appends through a node in this process, acknowledged from the object
          store: the local directory and moto (when NOVA_MOTO_SERVER names moto_server),
          next to raw PUTs of the same store in the same run; objects/s, bytes per PUT
          (writes under target/bench-objects)
  http    JSON and binary appends over loopback HTTP to a `nova serve` child process
          (target/ci/nova, next to this binary), next to raw loopback TCP and raw
          O_DIRECT writes in the same run, with the disk bytes each case wrote per byte
          of content (writes under target/bench-http)
  all     every suite above
  --quick small workloads, one pass: a smoke run, not a measurement
  --objects-dir=DIR
          engine: put the node's local object store in DIR (e.g. on tmpfs, to tell the
          cost of writing objects from the disk's)
  --write-doc
          also write the run's tables, with the machine's description, into
          docs/benchmarks.md between its `bench:latest` markers (run from the workspace)";

/// Where `--write-doc` puts the latest run, between these markers.
const DOC: &str = "docs/benchmarks.md";
const BEGIN: &str = "<!-- bench:latest:begin -->";
const END: &str = "<!-- bench:latest:end -->";

/// As `nova` runs: express chunks' DMA buffers come from the buffer pool, so the engine
/// measured in this process is the one the server runs.
#[global_allocator]
static ALLOCATOR: ::engine::aligned::PoolingAllocator = ::engine::aligned::PoolingAllocator;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--write-doc") {
        return write_doc(&args);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let objects_dir =
        args.iter().find_map(|a| a.strip_prefix("--objects-dir=")).map(std::path::Path::new);
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
            "engine" => engine::run(quick, objects_dir),
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

/// Runs this binary again without `--write-doc`, passes its output through, and puts it
/// with the machine's description into [`DOC`] between the markers.
fn write_doc(args: &[String]) -> ExitCode {
    let rest: Vec<&String> = args.iter().filter(|a| *a != "--write-doc").collect();
    let output = std::env::current_exe()
        .and_then(|exe| std::process::Command::new(exe).args(&rest).output());
    let output = match output {
        Ok(output) => output,
        Err(e) => {
            eprintln!("bench: cannot run the suites: {e}");
            return ExitCode::FAILURE;
        }
    };
    let text = String::from_utf8_lossy(&output.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        eprintln!("bench: the run failed; {DOC} is left as it was");
        return ExitCode::FAILURE;
    }
    let command = rest.iter().map(|a| a.as_str()).collect::<Vec<_>>().join(" ");
    let section = format!(
        "{BEGIN}\n## Latest run: `cargo run --release -p bench -- {command}`\n\n{} Built {}.\n\n{text}\n{END}",
        machine(),
        if cfg!(debug_assertions) {
            "in the ci profile (release optimisations with debug assertions: a little slower)"
        } else {
            "in the release profile"
        }
    );
    let doc = std::fs::read_to_string(DOC).unwrap_or_default();
    let updated = match (doc.find(BEGIN), doc.find(END)) {
        (Some(begin), Some(end)) if begin < end => {
            format!("{}{section}{}", &doc[..begin], &doc[end + END.len()..])
        }
        _ => format!("{}\n{section}\n", doc.trim_end()),
    };
    if let Err(e) = std::fs::write(DOC, updated) {
        eprintln!("bench: cannot write {DOC}: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!("bench: wrote the run into {DOC}");
    ExitCode::SUCCESS
}

/// The machine, as the figures need it: CPU model, cores, memory, kernel, and when.
fn machine() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
        .map_or("unknown CPU", |(_, m)| m.trim());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .map_or_else(|| "unknown".into(), |m| m.trim().to_owned());
    let kernel = read("/proc/sys/kernel/osrelease");
    let when = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "Machine: {model}, {cores} cores, {memory} memory, kernel {}; run at unix time {when}.",
        kernel.trim()
    )
}
