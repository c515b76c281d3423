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

const USAGE: &str = "usage: bench <codec|journal|engine|objects|http|all> [--quick] [--objects-dir=DIR] [--write-doc]

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
          docs/benchmarks.md between its `bench:latest` markers (run from the workspace)
  --help  this text";

/// Where `--write-doc` puts the latest run, between these markers.
const DOC: &str = "docs/benchmarks.md";
const BEGIN: &str = "<!-- bench:latest:begin -->";
const END: &str = "<!-- bench:latest:end -->";

/// As `nova` runs: express chunks' DMA buffers come from the buffer pool, so the engine
/// measured in this process is the one the server runs.
#[global_allocator]
static ALLOCATOR: ::engine::aligned::PoolingAllocator = ::engine::aligned::PoolingAllocator;

/// Every suite, in the order `all` runs them.
const SUITES: [&str; 5] = ["codec", "journal", "engine", "objects", "http"];

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Help,
    Run(Options),
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Options {
    suites: Vec<&'static str>,
    quick: bool,
    objects_dir: Option<std::path::PathBuf>,
    write_doc: bool,
}

/// Parses the arguments after the program name; an error names what is wrong. Every
/// flag is checked, so a typo (`--quik`) is refused instead of starting a full run.
fn parse(args: &[String]) -> Result<Command, String> {
    let mut options = Options::default();
    let mut suite = None;
    for arg in args {
        match arg.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--quick" => options.quick = true,
            "--write-doc" => options.write_doc = true,
            flag if flag.starts_with("--objects-dir") => {
                match flag.strip_prefix("--objects-dir=") {
                    Some(dir) if !dir.is_empty() => options.objects_dir = Some(dir.into()),
                    _ => return Err("--objects-dir needs a directory: --objects-dir=DIR".into()),
                }
            }
            flag if flag.starts_with('-') => return Err(format!("unknown flag {flag}")),
            name => {
                if let Some(first) = suite {
                    return Err(format!("one suite at a time (or all), not {first} and {name}"));
                }
                suite = Some(name);
            }
        }
    }
    options.suites = match suite {
        Some("all") => SUITES.to_vec(),
        Some(name) => match SUITES.iter().find(|s| **s == name) {
            Some(one) => vec![*one],
            None => return Err(format!("unknown suite {name}")),
        },
        None => return Err("which suite?".into()),
    };
    Ok(Command::Run(options))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(options)) => options,
        Err(why) => {
            eprintln!("bench: {why}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if options.write_doc {
        return write_doc(&args);
    }
    let quick = options.quick;
    for suite in options.suites {
        match suite {
            "codec" => codec::run(quick),
            "journal" => journal::run(quick),
            "engine" => engine::run(quick, options.objects_dir.as_deref()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        super::parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn every_flag_is_checked() {
        let run = |args: &[&str]| match parse(args) {
            Ok(Command::Run(options)) => options,
            other => panic!("{args:?}: {other:?}"),
        };
        let o = run(&["codec", "--quick"]);
        assert_eq!((o.suites, o.quick, o.write_doc), (vec!["codec"], true, false));
        let o = run(&["--write-doc", "all", "--objects-dir=/tmp/x"]);
        assert_eq!(o.suites, SUITES.to_vec());
        assert_eq!(o.objects_dir.as_deref(), Some(std::path::Path::new("/tmp/x")));
        assert!(o.write_doc);
        assert_eq!(parse(&["--help"]), Ok(Command::Help));
        assert_eq!(parse(&["codec", "--quik"]), Err("unknown flag --quik".into()));
        assert_eq!(
            parse(&["codec", "--quick", "--no-such-flag"]),
            Err("unknown flag --no-such-flag".into())
        );
        assert!(parse(&["codex"]).unwrap_err().contains("codex"));
        assert!(parse(&["codec", "http"]).is_err());
        assert!(parse(&["--quick"]).is_err());
        assert!(parse(&["engine", "--objects-dir"]).unwrap_err().contains("--objects-dir=DIR"));
    }

    /// Only what `--write-doc` writes sits between the markers (it replaces all of it):
    /// a section written by hand there would be lost to the next run.
    #[test]
    fn only_the_latest_run_is_between_the_doc_markers() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../",
            "docs/benchmarks.md"
        ))
        .expect("read docs/benchmarks.md");
        let (begin, end) =
            (doc.find(BEGIN).expect("the begin marker"), doc.find(END).expect("the end marker"));
        assert!(begin < end);
        let latest = &doc[begin + BEGIN.len()..end];
        assert!(
            latest.starts_with("\n## Latest run: "),
            "by hand between the markers: {}",
            &latest[..latest.len().min(200)]
        );
        assert_eq!(latest.matches("\n## ").count(), 1, "one generated section");
    }
}
