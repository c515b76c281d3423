//! `loadgen`: see `docs/loadgen.md` and `loadgen --help`.
//!
//! Exit status: 0 when the run completed with every append and read served (and verified,
//! with --verify); 1 when it could not run (bad arguments, no server, a report that could
//! not be written); 2 when verification found a problem; 4 when verification could not
//! read every stream to its tail and found nothing wrong in what it read (incomplete: not
//! verified); 3 when some appends or reads failed (refused, or unanswered by the drain:
//! the report counts and names them); 128 + the signal's number (130, 143) when SIGINT or
//! SIGTERM ended it early (its report is still printed and written). The first that
//! applies, in that order from 128 + N: 2, 4, 3, 1.

use std::process::ExitCode;

use loadgen::config::{Config, USAGE};
use loadgen::interrupt::{self, Interrupt};
use loadgen::report;

/// The server's allocator (`engine::aligned::PoolingAllocator`, mimalloc beneath): the
/// load generator shares the machine with the server it measures, so every cycle its
/// allocations save is one the server can use.
#[global_allocator]
static ALLOCATOR: engine::aligned::PoolingAllocator = engine::aligned::PoolingAllocator;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let config = match Config::parse(&args) {
        Ok(Some(config)) => config,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(warning) = config.connections_warning() {
        eprintln!("loadgen: warning: {warning}");
    }
    let interrupt = match Interrupt::on_signals() {
        Ok(interrupt) => interrupt,
        Err(e) => {
            eprintln!("loadgen: cannot handle signals: {e}");
            return ExitCode::from(1);
        }
    };
    let outputs = (config.json.clone(), config.hdr_log.clone(), config.report.clone());
    // Said on stderr before the load starts, so a caller can reach the same server.
    let mut on_target = |url: &str| eprintln!("loadgen: target {url}");
    let outcome = match loadgen::run::run(config, &interrupt, &mut on_target) {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::from(1);
        }
    };
    print!("{}", report::summary(&outcome));
    let (json, hdr_log, html_or_svg) = outputs;
    let mut failed = false;
    let write = |path: &std::path::Path, bytes: &[u8]| match std::fs::write(path, bytes) {
        Ok(()) => false,
        Err(e) => {
            eprintln!("loadgen: write {}: {e}", path.display());
            true
        }
    };
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&report::to_json(&outcome)).unwrap_or_default();
        failed |= write(&path, text.as_bytes());
    }
    if let Some(path) = hdr_log {
        match report::hdr_log(&outcome) {
            Ok(bytes) => failed |= write(&path, &bytes),
            Err(e) => {
                eprintln!("loadgen: {e}");
                failed = true;
            }
        }
    }
    if let Some(path) = html_or_svg {
        let text = if path.extension().is_some_and(|e| e == "html") {
            report::html(&outcome)
        } else {
            report::svg(&outcome)
        };
        failed |= write(&path, text.as_bytes());
    }
    if let Some(signal) = outcome.interrupted {
        return ExitCode::from(interrupt::exit_status(signal));
    }
    if outcome.verify_failed() {
        return ExitCode::from(2);
    }
    if outcome.verify_incomplete() {
        return ExitCode::from(4);
    }
    if outcome.had_errors() {
        return ExitCode::from(3);
    }
    if failed { ExitCode::from(1) } else { ExitCode::SUCCESS }
}
