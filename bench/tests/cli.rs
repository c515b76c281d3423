//! The `bench` binary's command line: a flag it does not know is refused before any
//! suite runs (a typo must not start a full run), and `--help` is an answer, not an
//! error.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_bench")).args(args).output().expect("bench runs");
    eprintln!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn an_unknown_flag_is_refused_by_name_and_runs_nothing() {
    for args in [&["codec", "--quick", "--no-such-flag"][..], &["codec", "--quik"]] {
        let out = bench(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let flag = args[args.len() - 1];
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("unknown flag {flag}")), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: a suite ran");
    }
}

#[test]
fn help_prints_the_usage_on_stdout_and_succeeds() {
    let out = bench(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("usage: bench "));
}
