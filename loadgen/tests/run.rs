//! The real loadgen binary against a server it spawns (`--spawn`) or one of the test's
//! own: short runs that must verify clean, one where the test writes behind loadgen's
//! back and verification must fail naming the stream, one where it trims records away
//! and verification must report them lost, and the ends of a run: an open-loop run the
//! server cannot keep up with stops at its duration, a server that stops answering or
//! dies holds the end a bounded time and leaves every scheduled batch counted, one
//! restarted mid-run is sent to and followed again, SIGTERM
//! ends a run early with its report and no server or directory left, and `kill -9` takes
//! the server down with loadgen. Needs the `nova` binary next to loadgen's (CI's
//! workspace build makes it; alone: `cargo build --profile ci -p net --bin nova`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use loadgen::consumer;
use loadgen::interrupt::Interrupt;
use loadgen::producer::StreamSpec;
use net::client::{Address, Batch, Bucket, Client, Conditions, Format, StreamOptions};

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

/// Starts loadgen with its output piped and reads its stderr up to the server's URL,
/// which it says once its streams exist, before the load starts: the child, the rest of
/// its stderr, and the URL.
fn start(cmd: &mut Command) -> (Child, BufReader<ChildStderr>, String) {
    let mut child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("loadgen starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr is piped"));
    let mut line = String::new();
    let url = loop {
        line.clear();
        match stderr.read_line(&mut line) {
            Ok(0) | Err(_) => break None,
            Ok(_) => {
                if let Some(url) = line.trim().strip_prefix("loadgen: target ") {
                    break Some(url.to_owned());
                }
            }
        }
    };
    match url {
        Some(url) => (child, stderr, url),
        None => {
            let status = child.wait();
            panic!("loadgen ended without naming its target: {status:?}");
        }
    }
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
    let (child, stderr, url) = start(
        loadgen()
            .args(["--class", "express", "--streams", "2", "--stream-prefix", "t", "--rate", "400"])
            .args(["--batch", "4", "--duration", "1500ms", "--warmup", "0s", "--verify"]),
    );
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    append_behind_the_back(authority, "/v1/streams/loadgen/t-1/records");
    let (status, stdout) = finish(child, stderr);
    assert_eq!(status.code(), Some(2), "verification must fail");
    assert!(stdout.contains("VERIFY FAILED nova://loadgen/t-1"), "{stdout}");
    assert!(stdout.contains("1 foreign"), "{stdout}");
    assert!(!stdout.contains("VERIFY FAILED nova://loadgen/t-0"), "{stdout}");
}

/// Waits for `child` to end, reading what is left of its output; its status, stdout and
/// the rest of its stderr.
fn finish(
    mut child: Child,
    mut stderr: BufReader<ChildStderr>,
) -> (std::process::ExitStatus, String) {
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).expect("read loadgen's stderr");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut stdout)
        .expect("read loadgen's stdout");
    let status = child.wait().expect("loadgen ends");
    eprintln!("status: {status}\nstdout:\n{stdout}\nstderr:\n{rest}");
    (status, stdout)
}

#[test]
fn an_open_loop_run_the_server_cannot_keep_up_with_ends_at_its_duration() {
    // A standard stream acknowledges a batch after about 270 ms (docs/loadgen.md): with 1
    // in flight, about 4 batches/s answered of the 25 asked for.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let duration = Duration::from_secs(2);
    let (child, stderr, _) = start(
        loadgen()
            .args([
                "--class",
                "standard",
                "--rate",
                "400",
                "--batch",
                "16",
                "--record-bytes",
                "100",
            ])
            .args(["--in-flight", "1", "--duration", "2s", "--warmup", "0s", "--verify", "--json"])
            .arg(&json),
    );
    let load_started = Instant::now();
    let (status, stdout) = finish(child, stderr);
    let took = load_started.elapsed();
    assert_eq!(status.code(), Some(0));
    // The duration, the acknowledgement of the batch in flight, the read-back: not the
    // ~13 s it takes the server to take every batch the schedule called for.
    assert!(took < duration + Duration::from_secs(4), "the run took {took:?}");
    let r = report(&json);
    let appends = &r["appends"];
    let (sent, unsent) =
        (appends["sent_batches"].as_u64().unwrap(), appends["unsent_batches"].as_u64().unwrap());
    assert!(unsent > 0, "{appends}");
    assert!(stdout.contains(&format!("{unsent} behind schedule at the end")), "{stdout}");
    // The schedule called for 2 s x 400 records/s / 16 = 50 batches before the end (51
    // when rounding puts one more just inside it): each was sent or is behind schedule.
    assert!((50..=51).contains(&(sent + unsent)), "{appends}");
    assert_eq!(appends["acked_batches"].as_u64().unwrap(), sent, "{appends}");
    assert!(r["ack_latency"]["count"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["verify"]["ok"], true);
}

/// A `nova serve` of the test's own (not one loadgen spawns, which loadgen would wait
/// for at the end), so the test can stop and resume it; and its URL.
fn own_server(dir: &Path) -> (Child, String) {
    own_server_on(dir, "127.0.0.1:0", &[])
}

/// [`own_server`] listening on `listen`, with `flags`.
fn own_server_on(dir: &Path, listen: &str, flags: &[&str]) -> (Child, String) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_loadgen")).with_file_name("nova");
    let mut child = Command::new(bin)
        .args(["serve", "--listen", listen])
        .args(flags)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("nova serve starts");
    let stdout = child.stdout.take().expect("stdout is piped");
    let listening = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.trim().strip_prefix("nova listening on ").map(str::to_owned));
    match listening {
        Some(url) => (child, url),
        None => {
            let status = child.wait();
            panic!("nova serve ended before it listened: {status:?}");
        }
    }
}

/// Runs loadgen with `load` (small express batches, 2 in flight, 2 s measured) against
/// a server of its own that is stopped (SIGSTOP) as soon as the run starts; the report,
/// the run's status, its stdout, and how long it took after the stop.
fn stalled_run(load: &[&str], drain: &str) -> (serde_json::Value, Option<i32>, String, Duration) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (nova, url) = own_server(dir.path());
    let _reap = Reap(nova.id());
    let json = dir.path().join("r.json");
    let (child, stderr, _) = start(
        Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args(["--url", &url, "--no-progress", "--class", "express"])
            .args(load)
            .args(["--in-flight", "2", "--batch", "4", "--record-bytes", "100"])
            .args(["--duration", "2s", "--warmup", "0s", "--drain", drain, "--json"])
            .arg(&json),
    );
    signal(nova.id(), "STOP");
    let stopped = Instant::now();
    let ended = finish_within(child, stderr, Duration::from_secs(120));
    let took = stopped.elapsed();
    signal(nova.id(), "CONT");
    let (status, stdout) = ended.expect("loadgen ends while the server is stopped");
    (report(&json), status.code(), stdout, took)
}

/// A server that stops answering mid-run (SIGSTOP): the run still ends, after its
/// duration and `--drain` rather than the default 30 s (the final tail checks too wait
/// at most that long), with the batches in flight counted as failed and named in an
/// error; it exits 3, ran with failed appends (docs/loadgen.md).
#[test]
fn a_server_that_stops_answering_ends_the_run_after_the_drain() {
    let (r, status, stdout, took) = stalled_run(&["--closed-loop"], "1s");
    assert_eq!(status, Some(3), "{stdout}");
    // Far below the 30 s default: the drain is what ended it.
    assert!(took < Duration::from_secs(20), "the run took {took:?} after the server stopped");
    let failed = r["appends"]["failed_batches"].as_u64().unwrap();
    assert!(failed > 0, "{r}");
    let errors = r["errors"].to_string();
    assert!(errors.contains("unanswered 1s after sending stopped (--drain"), "{errors}");
    // The unanswered batches count in the latencies with what they waited, at least the
    // drain: a stall is never left out of the percentiles.
    let max = r["ack_latency"]["max_ms"].as_f64().unwrap_or(0.0);
    assert!(max >= 1000.0, "{}", r["ack_latency"]);
}

/// The same stall under an open loop: the batches the schedule called for and could not
/// send (every slot taken by the stalled ones) count in the latencies too, each with
/// the time it had waited when sending stopped (no coordinated omission).
#[test]
fn an_open_loop_stall_shows_in_the_percentiles() {
    let (r, status, stdout, _) = stalled_run(&["--rate", "800"], "200ms");
    assert_eq!(status, Some(3), "{stdout}");
    assert!(r["appends"]["unsent_batches"].as_u64().unwrap_or(0) > 100, "{r}");
    // About 400 batches due over 2 s, all but a few stalled: most waited a good part of it.
    let p90 = r["ack_latency"]["p90_ms"].as_f64().unwrap_or(0.0);
    assert!(p90 >= 500.0, "{}", r["ack_latency"]);
}

/// A server stopped (SIGSTOP) for the whole run, with followers and several streams to
/// verify: the followers end within `--drain` of the producers (their reads wait at most
/// that), the final tails are checked at once, each once, and serve the read-back, so
/// the end of the run takes about two drains (the acknowledgements, then the tails and
/// followers) rather than one per tail check and attempt, or forever. Nothing could be
/// read back: verification is incomplete, exit 4, and nothing is called lost.
#[test]
fn a_stalled_server_holds_the_end_of_a_run_about_two_drains() {
    let load =
        ["--closed-loop", "--streams", "4", "--producers", "2", "--consumers", "2", "--verify"];
    let (r, status, stdout, took) = stalled_run(&load, "1s");
    // 2 s of load, 1 s for the acknowledgements, a few for tails and followers: far from
    // the 24 s of tail checks one after another, or forever.
    assert!(took < Duration::from_secs(20), "the run took {took:?} after the server stopped");
    assert_eq!(status, Some(4), "{stdout}");
    assert_eq!(r["verify"]["outcome"], "incomplete", "{r}");
    assert!(!stdout.contains("VERIFY FAILED"), "{stdout}");
    assert_eq!(stdout.matches("VERIFY INCOMPLETE nova://").count(), 4, "{stdout}");
    for stream in r["verify"]["streams"].as_array().unwrap() {
        assert_eq!(stream["lost"], 0, "{stream}");
    }
}

/// A stream followed against a server whose heartbeats (15 s by default) are further
/// apart than `--drain`, at a rate that leaves it idle longer than that: the follower's
/// reads time out while the producers run and it goes on where it was, and at the end it
/// stops at the final tail within the drain instead of waiting for a heartbeat.
#[test]
fn a_follower_of_a_quiet_stream_goes_on_past_timeouts_and_ends_at_the_tail() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (nova, url) = own_server(dir.path());
    let _reap = Reap(nova.id());
    let json = dir.path().join("r.json");
    // One 16-record batch every 1.6 s.
    let (child, stderr, _) = start(
        Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args(["--url", &url, "--no-progress", "--class", "express", "--rate", "10"])
            .args(["--batch", "16", "--record-bytes", "100", "--consumers", "1"])
            .args(["--duration", "4s", "--warmup", "0s", "--drain", "500ms", "--json"])
            .arg(&json),
    );
    let started = Instant::now();
    let (status, stdout) =
        finish_within(child, stderr, Duration::from_secs(120)).expect("loadgen ends");
    let took = started.elapsed();
    assert_eq!(status.code(), Some(0), "{stdout}");
    // Below the 15 s a heartbeat would take to come, with room for a slow machine.
    assert!(took < Duration::from_secs(14), "the run took {took:?}");
    let r = report(&json);
    let acked = r["appends"]["acked_batches"].as_u64().unwrap();
    assert!(acked >= 2, "{r}");
    assert_eq!(r["delivered_records"].as_u64().unwrap(), acked * 16, "{r}");
}

/// The body of a plain HTTP request's answer from the server at `authority`, and its
/// status line.
fn http(authority: &str, method: &str, path: &str, body: &str) -> (String, String) {
    let mut conn = TcpStream::connect(authority).expect("connect to the server");
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).expect("read the answer");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// Waits until stream `key` of bucket `loadgen` holds at least `records`.
fn await_tail(authority: &str, key: &str, records: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = http(authority, "GET", &format!("/v1/streams/loadgen/{key}/tail"), "");
        if status.contains(" 200 ") {
            let tail: serde_json::Value = serde_json::from_str(&body).expect("a tail is JSON");
            if tail["tail"]["seq_num"].as_u64().unwrap_or(0) >= records {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{key} did not reach {records} records: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Records trimmed away mid-run are lost to verification: the read-back ends at the tail
/// it measured (it does not wait for records the server will never send), and names
/// them, and loadgen exits 2.
#[test]
fn verification_reports_records_trimmed_away_as_lost() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let (child, stderr, url) = start(
        loadgen()
            .args(["--class", "express", "--stream-prefix", "trim3", "--rate", "1000"])
            .args(["--batch", "16", "--duration", "2s", "--warmup", "0s", "--verify"])
            .args(["--catch-up", "--json"])
            .arg(&json),
    );
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    await_tail(authority, "trim3-0", 600);
    let (status, body) =
        http(authority, "POST", "/v1/streams/loadgen/trim3-0/trim", r#"{"seq_num":500}"#);
    assert!(status.contains(" 200 "), "{status} {body}");
    let (status, stdout) =
        finish_within(child, stderr, Duration::from_secs(120)).expect("loadgen ends");
    assert_eq!(status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("VERIFY FAILED nova://loadgen/trim3-0: 500 lost"), "{stdout}");
    let r = report(&json);
    assert_eq!(r["verify"]["outcome"], "failed", "{r}");
    assert_eq!(r["verify"]["streams"][0]["lost"], 500, "{r}");
    assert_eq!(r["read_back"]["complete"], true, "{r}");
}

/// A server killed mid-run: the stream's session cannot be reopened, yet every batch the
/// schedule called for is accounted for (sent, behind schedule, or abandoned with the
/// stream, in the latencies with its wait) and the run keeps its duration; nothing could
/// be read back, which is an incomplete verification (exit 4), not lost records.
#[test]
fn a_server_killed_mid_run_leaves_every_batch_counted_and_verification_incomplete() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (nova, url) = own_server(dir.path());
    let reap = Reap(nova.id());
    let json = dir.path().join("r.json");
    let (child, stderr, _) = start(
        Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args(["--url", &url, "--no-progress", "--class", "express", "--stream-prefix"])
            .args(["killed", "--rate", "1000", "--batch", "16", "--duration", "2s"])
            .args(["--warmup", "0s", "--verify", "--consumers", "1", "--drain", "3s", "--json"])
            .arg(&json),
    );
    let started = Instant::now();
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    await_tail(authority, "killed-0", 320);
    signal(reap.0, "KILL");
    let (status, stdout) =
        finish_within(child, stderr, Duration::from_secs(120)).expect("loadgen ends");
    assert!(started.elapsed() >= Duration::from_secs(2), "the run ended early");
    assert_eq!(status.code(), Some(4), "{stdout}");
    let r = report(&json);
    let appends = &r["appends"];
    let count = |name: &str| appends[name].as_u64().unwrap_or_else(|| panic!("{name}: {appends}"));
    // 2 s x 1000 records/s / 16 = 125 batches (126 when rounding puts one more inside),
    // whatever became of them (`scheduled_batches` is their sum).
    let scheduled = count("scheduled_batches");
    assert!((125..=126).contains(&scheduled), "{appends}");
    assert_eq!(
        count("acked_batches") + count("failed_batches"),
        count("sent_batches"),
        "{appends}"
    );
    assert!(count("abandoned_batches") > 50, "{appends}");
    assert!(stdout.contains(&format!("{scheduled} scheduled: ")), "{stdout}");
    // The abandoned batches waited up to the end of the run.
    assert!(r["ack_latency"]["max_ms"].as_f64().unwrap_or(0.0) >= 500.0, "{}", r["ack_latency"]);
    assert!(stdout.contains("VERIFY INCOMPLETE nova://loadgen/killed-0"), "{stdout}");
    assert!(!stdout.contains("VERIFY FAILED"), "{stdout}");
    assert_eq!(r["verify"]["outcome"], "incomplete", "{r}");
    assert_eq!(r["verify"]["streams"][0]["lost"], 0, "{r}");
}

/// A server restarted mid-run (SIGTERM, then started again on its port and data): the
/// producer reopens its session once the server is back and sends what the schedule held
/// back meanwhile, so nothing is abandoned and every record acknowledged reads back; the
/// follower resumes where it was and sees every record.
#[test]
fn a_server_restarted_mid_run_is_sent_to_again() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    // Heartbeats as a spawned server's: the follower at the tail learns it is done.
    let heartbeats = ["--sse-heartbeat-ms", "100"];
    let (mut nova, url) = own_server_on(dir.path(), "127.0.0.1:0", &heartbeats);
    let reap = Reap(nova.id());
    let json = dir.path().join("r.json");
    let (child, stderr, _) = start(
        Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args(["--url", &url, "--no-progress", "--class", "express", "--stream-prefix"])
            .args(["restarted", "--rate", "1000", "--batch", "16", "--duration", "3s"])
            .args(["--warmup", "0s", "--verify", "--consumers", "1", "--json"])
            .arg(&json),
    );
    let authority = url.trim_start_matches("http://").trim_end_matches('/').to_owned();
    await_tail(&authority, "restarted-0", 320);
    signal(reap.0, "TERM");
    assert!(nova.wait().expect("nova serve ends").success(), "a clean stop");
    let (nova, _) = own_server_on(dir.path(), &authority, &heartbeats);
    let _reap = Reap(nova.id());
    let (status, stdout) =
        finish_within(child, stderr, Duration::from_secs(120)).expect("loadgen ends");
    let r = report(&json);
    let appends = &r["appends"];
    let count = |name: &str| appends[name].as_u64().unwrap_or_else(|| panic!("{name}: {appends}"));
    // 3 s x 1000 records/s / 16 = 187.5 batches, each sent or behind schedule, none
    // abandoned (`scheduled_batches` is their sum).
    let scheduled = count("scheduled_batches");
    assert!((187..=188).contains(&scheduled), "{appends}");
    assert_eq!(count("abandoned_batches"), 0, "{appends}");
    assert_eq!(
        count("acked_batches") + count("failed_batches"),
        count("sent_batches"),
        "{appends}"
    );
    // A clean stop answers what it read; batches cut off on the way may have failed, and
    // the rest were sent again.
    assert!(count("acked_batches") + 10 >= scheduled, "{appends}");
    assert_eq!(r["verify"]["outcome"], "ok", "{r}");
    let acked_records = count("acked_batches") * 16;
    // (A batch that failed as the server stopped may have landed, and be seen too.)
    let seen = r["end_to_end_latency"]["count"].as_u64().unwrap_or(0);
    assert!(seen >= acked_records, "{seen} of {acked_records} acknowledged seen: {r}");
    assert!(matches!(status.code(), Some(0 | 3)), "{status:?}: {stdout}");
}

/// A server that takes each connection and cuts it (here a proxy in front of it, gone
/// down): every session reopened fails again before an acknowledgement, so the outage
/// goes on across them, each try waiting longer, and after `--drain` the stream is given
/// up. What its schedule called for from then on is abandoned, not sent to fail, and the
/// run keeps its duration.
#[test]
fn a_server_that_cuts_every_connection_is_given_up_after_the_drain() {
    use s3::testing::Proxy;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (nova, url) = own_server(dir.path());
    let _reap = Reap(nova.id());
    let authority = url.trim_start_matches("http://").trim_end_matches('/');
    let port = authority.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port");
    let proxy = Proxy::start(port, Vec::new());
    let json = dir.path().join("r.json");
    let started = Instant::now();
    let (child, stderr, _) = start(
        Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args(["--url", &proxy.endpoint(), "--no-progress", "--class", "express"])
            .args(["--stream-prefix", "cut", "--rate", "1000", "--batch", "16"])
            .args(["--duration", "5s", "--warmup", "0s", "--drain", "1s", "--json"])
            .arg(&json),
    );
    await_tail(authority, "cut-0", 320);
    proxy.set_down(true);
    let (_, stdout) = finish_within(child, stderr, Duration::from_secs(60)).expect("loadgen ends");
    assert!(started.elapsed() >= Duration::from_secs(5), "the run ended early");
    let r = report(&json);
    let appends = &r["appends"];
    let count = |name: &str| appends[name].as_u64().unwrap_or_else(|| panic!("{name}: {appends}"));
    // 5 s x 1000 records/s / 16 = 312.5 batches.
    assert!((312..=313).contains(&count("scheduled_batches")), "{appends}");
    assert_eq!(count("acked_batches") + count("failed_batches"), count("sent_batches"));
    // Given up 1 s into the outage, which began about 0.4 s in: the last 3.6 s of the
    // schedule, and what it held back meanwhile, are abandoned; the tries sent few.
    assert!(count("abandoned_batches") >= 100, "{appends} {}", r["errors"]);
    assert!(count("failed_batches") <= 20, "{appends} {}", r["errors"]);
    let errors = r["errors"].to_string();
    assert!(errors.contains("gave up after 1s (--drain)"), "{errors}: {stdout}");
}

/// A read-back that cannot reach its tail (here one past the stream's: the pages run out
/// below it) stops, saying where and why, with what it read so far, over several pages.
#[test]
fn a_read_back_cut_short_keeps_the_counts_it_read() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (nova, url) = own_server(dir.path());
    let _reap = Reap(nova.id());
    // JSON pages hold at most 1000 records.
    let client = Client::new(&url)
        .unwrap()
        .with_format(Format::Json)
        .with_timeout(Some(Duration::from_secs(10)))
        .with_attempts(1);
    client.create_bucket(&Bucket::new("readback"), None).unwrap();
    let address = Address::new("readback", "s");
    let express = StreamOptions {
        class: Some(engine::options::StorageClass::Express),
        ..StreamOptions::default()
    };
    client.create_stream(&address, &express, None).unwrap();
    let mut batch = Batch::new();
    for i in 0..700u32 {
        batch.push::<&[u8], &[u8]>(&[], format!("record {i}").as_bytes()).unwrap();
    }
    for _ in 0..5 {
        client.append(&address, &batch, &Conditions::default()).unwrap();
    }
    let spec = StreamSpec { number: 0, address, base_seq: 0 };
    let silent = AtomicBool::new(false);
    let drain = Duration::from_secs(10);
    let r = consumer::read_back(&client, &spec, 4000, None, &Interrupt::none(), &silent, drain);
    assert_eq!((r.records, r.next_seq_num), (3500, 3500), "{r:?}");
    let why = r.incomplete.expect("the read-back stopped before its tail");
    assert!(why.contains("seq_num 3500") && why.contains("4000"), "{why}");

    let r = consumer::read_back(&client, &spec, 3500, None, &Interrupt::none(), &silent, drain);
    assert_eq!((r.records, r.next_seq_num, r.incomplete), (3500, 3500, None));
}

/// Waits up to `limit` for `child` to end, reading its output meanwhile; its status and
/// stdout, or None (and the child killed) when it did not end in time.
fn finish_within(
    mut child: Child,
    mut stderr: BufReader<ChildStderr>,
    limit: Duration,
) -> Option<(ExitStatus, String)> {
    let mut stdout_pipe = child.stdout.take().expect("stdout is piped");
    let stdout = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout_pipe.read_to_string(&mut text);
        text
    });
    let rest = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for loadgen") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, rest) = (stdout.join().unwrap_or_default(), rest.join().unwrap_or_default());
    eprintln!("status: {status:?}\nstdout:\n{stdout}\nstderr:\n{rest}");
    status.map(|status| (status, stdout))
}

/// The processes whose parent is `parent` and whose name is `name`, from /proc.
fn children_named(parent: u32, name: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("list /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so split at its last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let ppid = stat[close + 1..].split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if &stat[open + 1..close] == name && ppid == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// Whether `pid` still runs (a zombie waiting for its new parent to reap it does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')').is_some_and(|c| !stat[c + 1..].trim_start().starts_with('Z'))
    })
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// Kills a spawned server the test found, should the test fail with it still running.
struct Reap(u32);

impl Drop for Reap {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = Command::new("kill").arg("-KILL").arg(self.0.to_string()).status();
        }
    }
}

/// A spawned run of express appends for a minute, in a temporary directory of its own
/// (TMPDIR): the loadgen child, its stderr past the target line, its nova, and the
/// directory.
fn long_spawned_run(json: &Path) -> (Child, BufReader<ChildStderr>, Reap, tempfile::TempDir) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let (child, stderr, _) = start(
        loadgen()
            .env("TMPDIR", tmp.path())
            .args(["--class", "express", "--rate", "2000", "--consumers", "1"])
            .args(["--duration", "60s", "--warmup", "0s", "--verify", "--json"])
            .arg(json),
    );
    let nova = children_named(child.id(), "nova");
    assert_eq!(nova.len(), 1, "one spawned server: {nova:?}");
    let server_dirs = std::fs::read_dir(tmp.path()).expect("list TMPDIR").count();
    assert_eq!(server_dirs, 1, "the server's directory is in TMPDIR");
    (child, stderr, Reap(nova[0]), tmp)
}

/// Waits up to `limit` for `pid` to end.
fn ends_within(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

#[test]
fn sigterm_ends_a_spawned_run_early_with_its_report_and_leaves_no_server_or_directory() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let (child, stderr, nova, tmp) = long_spawned_run(&json);
    std::thread::sleep(Duration::from_millis(1500));
    let signalled = Instant::now();
    signal(child.id(), "TERM");
    let (status, stdout) = finish(child, stderr);
    assert!(signalled.elapsed() < Duration::from_secs(20), "{:?}", signalled.elapsed());
    assert_eq!(status.code(), Some(143), "128 + SIGTERM");
    assert!(stdout.contains("interrupted by SIGTERM"), "{stdout}");
    assert!(stdout.contains("appends:") && stdout.contains("append ack"), "{stdout}");
    assert!(!alive(nova.0), "the spawned server {} still runs", nova.0);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let r = report(&json);
    assert_eq!(r["interrupted"]["signal"], "SIGTERM", "{r}");
    let measured = r["interrupted"]["measured_seconds"].as_f64().unwrap();
    assert!(measured > 0.5 && measured < 30.0, "{r}");
    assert!(r["appends"]["acked_batches"].as_u64().unwrap() > 0, "{r}");
    assert!(r["ack_latency"]["count"].as_u64().unwrap() > 0, "{r}");
}

#[test]
fn a_spawned_server_dies_with_loadgen_killed_outright() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _stderr, nova, _tmp) = long_spawned_run(&dir.path().join("r.json"));
    signal(child.id(), "KILL");
    child.wait().unwrap();
    assert!(
        ends_within(nova.0, Duration::from_secs(10)),
        "the spawned server {} outlived loadgen",
        nova.0
    );
}
