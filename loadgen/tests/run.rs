//! The real loadgen binary against a server it spawns (`--spawn`): short runs that must
//! verify clean, and one where the test writes behind loadgen's back and verification
//! must fail naming the stream. Needs the `nova` binary next to loadgen's (CI's
//! workspace build makes it; alone: `cargo build --profile ci -p net --bin nova`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn loadgen() -> Command {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_loadgen"));
    let nova = bin.with_file_name("nova");
    assert!(
        nova.is_file(),
        "{} is missing: build it with `cargo build --profile ci -p net --bin nova`",
        nova.display()
    );
    let mut cmd = Command::new(bin);
    cmd.arg("--spawn").arg("--nova-bin").arg(nova).arg("--no-progress");
    cmd
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("loadgen runs");
    eprintln!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn report(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("the JSON report is written"))
        .expect("the report is JSON")
}

#[test]
fn an_express_binary_run_with_followers_verifies_clean_and_writes_every_report() {
    let dir = tempfile::tempdir().unwrap();
    let (json, hdr, svg, html) = (
        dir.path().join("r.json"),
        dir.path().join("r.hlog"),
        dir.path().join("r.svg"),
        dir.path().join("r.html"),
    );
    let out = run(loadgen()
        .args(["--class", "express", "--format", "binary", "--streams", "3", "--producers", "2"])
        .args([
            "--consumers",
            "3",
            "--rate",
            "3000",
            "--batch",
            "10",
            "--record-bytes-dist",
            "uniform:24:300",
        ])
        .args([
            "--duration",
            "1s",
            "--warmup",
            "300ms",
            "--connections",
            "2",
            "--verify",
            "--catch-up",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--hdr-log")
        .arg(&hdr)
        .arg("--report")
        .arg(&svg));
    assert_eq!(out.status.code(), Some(0));
    let r = report(&json);
    assert!(r["appends"]["measured_records"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["appends"]["failed_batches"], 0);
    assert!(r["ack_latency"]["count"].as_u64().unwrap() > 0);
    assert!(r["end_to_end_latency"]["count"].as_u64().unwrap() > 0);
    assert!(r["read_back"]["records"].as_u64().unwrap() > 0);
    assert_eq!(r["verify"]["ok"], true);
    assert_eq!(r["verify"]["streams"].as_array().unwrap().len(), 3);
    let log = std::fs::read_to_string(&hdr).unwrap();
    assert!(log.contains("Tag=ack,") && log.contains("Tag=e2e,"), "{log}");
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.starts_with("<svg") && svg_text.contains("<path"), "{svg_text}");
    assert!(!svg_text.contains("http-equiv") && !svg_text.contains("src="), "self-contained");
    drop(html);
}

#[test]
fn a_standard_json_closed_loop_run_verifies_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (json, html) = (dir.path().join("r.json"), dir.path().join("r.html"));
    let out = run(loadgen()
        .args(["--class", "standard", "--format", "json", "--streams", "2", "--consumers", "1"])
        .args(["--closed-loop", "--in-flight", "2", "--batch", "4", "--record-bytes", "100"])
        .args(["--duration", "1s", "--warmup", "0s", "--verify"])
        .arg("--json")
        .arg(&json)
        .arg("--report")
        .arg(&html));
    assert_eq!(out.status.code(), Some(0));
    let r = report(&json);
    assert!(r["appends"]["acked_batches"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["config"]["class"], "standard");
    assert_eq!(r["config"]["format"], "json");
    assert_eq!(r["verify"]["ok"], true);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<html") && page.contains("<svg"));
}

/// Posts one JSON record to `bucket/key` of the server at `authority`: plain HTTP, no client.
fn append_behind_the_back(authority: &str, path: &str) {
    let body = r#"{"records":[{"body":"not loadgen's"}]}"#;
    let mut conn = TcpStream::connect(authority).expect("connect to the server");
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send the append");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("read the answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn verify_fails_naming_the_stream_that_got_a_record_loadgen_did_not_write() {
    let mut child = loadgen()
        .args(["--class", "express", "--streams", "2", "--stream-prefix", "t", "--rate", "400"])
        .args(["--batch", "4", "--duration", "1500ms", "--warmup", "0s", "--verify"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // loadgen says where the server is once its streams exist, before the load starts.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let url = loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "loadgen ended without naming its target"
        );
        if let Some(url) = line.trim().strip_prefix("loadgen: target ") {
            break url.to_owned();
        }
    };
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    append_behind_the_back(authority, "/v1/streams/loadgen/t-1/records");
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    let status = child.wait().unwrap();
    eprintln!("stdout:\n{stdout}\nstderr:\n{rest}");
    assert_eq!(status.code(), Some(2), "verification must fail");
    assert!(stdout.contains("VERIFY FAILED nova://loadgen/t-1"), "{stdout}");
    assert!(stdout.contains("1 foreign"), "{stdout}");
    assert!(!stdout.contains("VERIFY FAILED nova://loadgen/t-0"), "{stdout}");
}
