//! `nova doctor`, the real binary: every finding is reported with a status, an unusable
//! data directory fails the run, and the S3 round trip works against moto and leaves
//! nothing behind.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use s3::ObjectStore as _;
use s3::testing::Moto;
use serde_json::Value;

/// Every check the doctor runs, in its order (docs/doctor.md).
const CHECKS: [&str; 12] = [
    "cores",
    "memory",
    "kernel",
    "io_uring",
    "memlock",
    "data_dir",
    "o_direct",
    "io_poll",
    "write_cache",
    "fdatasync",
    "disk_space",
    "object_store",
];

fn doctor(args: &[&str]) -> Output {
    doctor_in(&[], args)
}

/// Runs `nova doctor` with `env` set (knobs from their environment variables).
fn doctor_in(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nova"));
    command.arg("doctor").args(args).envs(env.iter().copied());
    command.output().expect("run nova")
}

/// Runs `nova doctor --json` on `data_dir`; the exit code and the report.
fn doctor_json(data_dir: &Path, extra: &[&str]) -> (i32, Value) {
    doctor_json_in(&[], data_dir, extra)
}

/// [`doctor_json`] with `env` set.
fn doctor_json_in(env: &[(&str, &str)], data_dir: &Path, extra: &[&str]) -> (i32, Value) {
    let dir = data_dir.to_str().expect("utf-8 path");
    let mut args = vec!["--json", "--data-dir", dir, "--sync-writes", "20"];
    args.extend_from_slice(extra);
    let out = doctor_in(env, &args);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not json ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().expect("exited"), report)
}

fn finding<'a>(report: &'a Value, check: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no finding {check}: {report}"))
}

fn status<'a>(report: &'a Value, check: &str) -> &'a str {
    finding(report, check)["status"].as_str().expect("a status")
}

/// Every check appears once, in order, with a status and a one-line finding, and the
/// exit code says whether any failed.
fn check_shape(code: i32, report: &Value) {
    let findings = report["findings"].as_array().expect("findings");
    let names: Vec<&str> = findings.iter().map(|f| f["check"].as_str().expect("check")).collect();
    assert_eq!(names, CHECKS, "{report}");
    for f in findings {
        assert!(["ok", "warn", "fail"].contains(&f["status"].as_str().expect("status")), "{f}");
        let found = f["found"].as_str().expect("found");
        assert!(!found.is_empty() && !found.contains('\n'), "{f}");
        assert!(f["recommendation"].is_null() || f["recommendation"].is_string(), "{f}");
    }
    let fails = findings.iter().filter(|f| f["status"] == "fail").count();
    assert_eq!(report["fail"], fails, "{report}");
    assert_eq!(code, if fails > 0 { 1 } else { 0 }, "{report}");
}

#[test]
fn reports_every_finding_with_a_status_and_cleans_up() {
    // Under the target directory: a real disk, unlike a tmpfs /tmp.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let data = dir.path().join("a/data");
    let (code, report) = doctor_json(&data, &[]);
    check_shape(code, &report);
    assert_eq!(status(&report, "data_dir"), "ok", "{report}");
    assert_eq!(report["data_dir"], data.to_str().expect("utf-8"));
    // The write cache finding names the device and what its queue says, when it has one.
    // The write cache finding says what the device's queue says.
    let cache = finding(&report, "write_cache");
    if let Some(device) = cache["details"]["device"].as_str()
        && let Ok(mode) = std::fs::read_to_string(format!("/sys/block/{device}/queue/write_cache"))
    {
        assert_eq!(cache["details"]["write_cache"], mode.trim(), "{cache}");
        let all = std::fs::read_to_string(format!("/sys/block/{device}/queue/scheduler"))
            .expect("a device with a write_cache attribute has a scheduler one");
        let active = cache["details"]["scheduler"].as_str().expect("a scheduler");
        assert!(all.contains(&format!("[{active}]")) || all.trim() == active, "{all}: {cache}");
    }
    // It made `a/data` for its probes and leaves the file system as it found it.
    assert!(!dir.path().join("a").exists(), "the doctor left its directories behind");

    // An existing data directory keeps exactly what it had.
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::write(data.join("keep"), b"x").expect("write");
    let (code, report) = doctor_json(&data, &[]);
    check_shape(code, &report);
    let left: Vec<_> = std::fs::read_dir(&data)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left, ["keep"]);
}

#[test]
fn an_unusable_data_dir_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A data directory below a regular file cannot be created, even by root.
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a directory").expect("write");
    let (code, report) = doctor_json(&file.join("data"), &[]);
    check_shape(code, &report);
    assert_eq!(status(&report, "data_dir"), "fail", "{report}");
    assert_eq!(code, 1);

    // The text report says the same.
    let out = doctor(&["--data-dir", file.join("data").to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("fail  data_dir")), "{text}");
}

#[test]
fn the_checks_use_the_engine_knobs_nova_serve_would_use() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let data = dir.path().join("data");
    let (_, report) =
        doctor_json_in(&[("NOVA_SHARDS", "3"), ("NOVA_JOURNAL_SPARE_SEGMENTS", "0")], &data, &[]);
    assert_eq!(finding(&report, "cores")["details"]["shards"], 3, "{report}");
    // Three shards' journals of two 256 MiB segments each (no spares).
    assert_eq!(finding(&report, "disk_space")["details"]["journal_bytes"], 3 * 2 * (256u64 << 20));
    assert_eq!(finding(&report, "memory")["details"]["shards"], 3, "{report}");
    // The HTTP servers' bounds count too: past what is available beside the caches, a
    // warning names the knobs to lower.
    let huge = [("NOVA_SHARDS", "3"), ("NOVA_HTTP_RESPONSE_MEMORY_BYTES", "1048576MiB")];
    let (_, report) = doctor_json_in(&huge, &data, &[]);
    let memory = finding(&report, "memory");
    assert_eq!(memory["details"]["http_response_memory_bytes"], 1u64 << 40, "{report}");
    assert_eq!(memory["details"]["http_body_memory_bytes"], 2u64 << 30, "{report}");
    assert_eq!(memory["status"], "warn", "{report}");
    let advice = memory["recommendation"].as_str().expect("a recommendation");
    assert!(advice.contains("--http-response-memory-bytes"), "{advice}");
    // A setting nova serve would refuse is a usage mistake here too, named.
    let data = data.to_str().expect("utf-8 path");
    let bad = doctor_in(&[("NOVA_SHARDS", "many")], &["--data-dir", data]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--shards"), "{bad:?}");
}

#[test]
fn help_and_usage_mistakes() {
    let out = doctor(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("example: nova doctor"), "{text}");
    assert!(text.contains("--s3-bucket"), "{text}");
    // Usage mistakes exit 2 before any check runs.
    assert_eq!(doctor(&["--bogus", "1"]).status.code(), Some(2));
    assert_eq!(doctor(&["--s3-prefix", "p"]).status.code(), Some(2));
}

#[test]
fn s3_round_trip_against_moto() {
    let moto = Moto::start();
    moto.create_bucket("nova");
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let s3 = common::s3_flags(&moto.endpoint());
    let s3: Vec<&str> = s3.iter().map(String::as_str).collect();
    let (code, report) = doctor_json(&dir.path().join("data"), &s3);
    check_shape(code, &report);
    assert_eq!(status(&report, "object_store"), "ok", "{report}");
    let details = &finding(&report, "object_store")["details"];
    assert_eq!(details["store"], "s3", "{report}");
    assert!(details["put_us"].as_u64().is_some_and(|us| us > 0), "{report}");

    // Its objects are gone.
    let store = s3::S3Store::new(moto.config("nova")).expect("store");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let page = runtime.block_on(store.list("nova-doctor/", None, 100)).expect("list");
    assert!(page.objects.is_empty(), "left behind: {:?}", page.objects);

    // A bucket that does not exist fails the check and the run.
    let mut missing = s3;
    missing[1] = "no-such-bucket";
    let (code, report) = doctor_json(&dir.path().join("data"), &missing);
    check_shape(code, &report);
    assert_eq!(status(&report, "object_store"), "fail", "{report}");
}
