//! The `nova` client verbs against a real `nova serve` child.

mod common;

use std::io::{BufRead as _, BufReader, Lines, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};

use common::{Nova, Store};
use serde_json::Value;

/// `nova --server URL args...` running, its stdin, stdout and stderr piped.
fn spawn_cli(server: &Nova, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["--server", &server.url])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nova")
}

/// `nova read --follow` of `address` (and `args`), and the lines it prints.
fn follow(server: &Nova, address: &str, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = spawn_cli(server, &[&["read", address, "--follow"], args].concat());
    let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    (child, lines)
}

/// `nova args...` with its stdout on a full disk.
fn to_full_disk(server: &Nova, args: &[&str]) -> Output {
    let full = std::fs::File::create("/dev/full").expect("/dev/full");
    Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["--server", &server.url])
        .args(args)
        .stdout(full)
        .output()
        .expect("run nova")
}

fn nova_cli(server: &Nova, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = spawn_cli(server, args);
    let mut input = child.stdin.take().expect("stdin");
    match input.write_all(stdin.unwrap_or("").as_bytes()) {
        // nova exited without reading it all: its status and stderr say why.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        written => written.expect("write stdin"),
    }
    drop(input);
    child.wait_with_output().expect("nova output")
}

fn ok(server: &Nova, args: &[&str], stdin: Option<&str>) -> String {
    let out = nova_cli(server, args, stdin);
    assert!(out.status.success(), "nova {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn version_prints_the_version() {
    let out = Command::new(env!("CARGO_BIN_EXE_nova")).arg("--version").output().expect("run nova");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("nova {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn client_verbs_round_trip_through_the_server() {
    client_verbs(Store::Local);
}

#[test]
fn s3_client_verbs_round_trip_through_the_server() {
    client_verbs(Store::s3());
}

fn client_verbs(store: Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start_in(store, &dir.path().join("data"), &[], &[]);
    ok(
        &server,
        &["bucket", "create", "apps", "--create-on-append", "--default-class", "express"],
        None,
    );
    ok(&server, &["bucket", "create", "logs"], None);
    assert_eq!(ok(&server, &["ls"], None), "apps\nlogs\n");
    let got: Value = serde_json::from_str(&ok(&server, &["--json", "bucket", "get", "apps"], None))
        .expect("json");
    assert_eq!(got["default_class"], "express");
    // One name a line on stdout; that there is more is said on stderr.
    let page = nova_cli(&server, &["bucket", "list", "--limit", "1"], None);
    assert!(page.status.success());
    assert_eq!(String::from_utf8_lossy(&page.stdout), "apps\n");
    assert_eq!(String::from_utf8_lossy(&page.stderr), "(more: --cursor apps)\n");
    // Arguments a verb does not take are refused, not ignored.
    for (args, named) in [
        (&["ls", "extra"][..], "\"extra\""),
        (&["bucket", "list", "apps"][..], "\"apps\""),
        (&["stream", "list", "nova://logs/api"][..], "--prefix"),
        (&["bucket", "list", "--limit", "99999999999999999999"][..], "too large"),
    ] {
        let error = fails(&server, args, None, 2);
        assert!(error.contains(named), "nova {args:?}: {error}");
    }
    ok(
        &server,
        &["stream", "create", "--bucket", "logs", "--key", "api", "--retention-max-age", "168h"],
        None,
    );
    let stream: Value =
        serde_json::from_str(&ok(&server, &["stream", "get", "nova://logs/api", "--json"], None))
            .expect("json");
    assert_eq!(stream["retention_max_age_ms"], 604_800_000);
    ok(&server, &["stream", "reconfigure", "nova://logs/api", "--retention-max-age", "24h"], None);
    let appended = ok(
        &server,
        &["append", "nova://apps/orders/eu", "--batch", "2"],
        Some("one\ntwo\nthree\n"),
    );
    assert!(appended.contains("appended 3 records"), "{appended}");
    assert_eq!(
        ok(&server, &["stream", "list", "nova://apps", "--prefix", "orders/"], None),
        "orders/eu\n"
    );
    assert_eq!(ok(&server, &["read", "nova://apps/orders/eu"], None), "one\ntwo\nthree\n");
    assert_eq!(
        ok(&server, &["read", "nova://apps/orders/eu", "--from-seq", "1", "--count", "1"], None),
        "two\n"
    );
    assert_eq!(
        ok(&server, &["read", "nova://apps/orders/eu", "-f", "--count", "3"], None),
        "one\ntwo\nthree\n"
    );
    assert!(ok(&server, &["tail", "nova://apps/orders/eu"], None).contains("next_seq_num 3"));
    assert!(
        ok(&server, &["trim", "nova://apps/orders/eu", "--seq", "1"], None)
            .contains("trim_seq_num 1")
    );
    // --time takes RFC 3339 as --from-time does; the epoch trims nothing more.
    let trimmed =
        ok(&server, &["trim", "nova://apps/orders/eu", "--time", "1970-01-01T00:00:00Z"], None);
    assert!(trimmed.contains("trim_seq_num 1"), "{trimmed}");
    let bad = nova_cli(&server, &["trim", "nova://apps/orders/eu", "--time", "yesterday"], None);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--time must be"));
    // People-readable fields, the tail among them.
    let got = ok(&server, &["stream", "get", "nova://apps/orders/eu"], None);
    assert!(got.lines().any(|line| line.starts_with("tail: next_seq_num 3 ")), "{got}");
    ok(&server, &["fence", "nova://apps/orders/eu", "--token", "w1"], None);
    // Failures exit non-zero with the server's message.
    let refused = nova_cli(
        &server,
        &["fence", "nova://apps/orders/eu", "--token", "w2", "--expected", "nope"],
        None,
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("failed_precondition"));
    let missing = nova_cli(&server, &["stream", "get", "nova://apps/missing"], None);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not_found"));
    let usage = nova_cli(&server, &["read", "apps/orders"], None);
    assert_eq!(usage.status.code(), Some(2));
    ok(&server, &["stream", "delete", "nova://logs/api"], None);
    ok(&server, &["bucket", "delete", "logs"], None);
    assert_eq!(ok(&server, &["ls"], None), "apps\n");
}

/// Every verb's `--help` has an example; the client verbs' examples, in the order of a
/// story on one bucket, run verbatim through `sh` against a new server and all succeed.
#[test]
fn every_verb_has_help_with_an_example() {
    let nova = std::path::Path::new(env!("CARGO_BIN_EXE_nova"));
    let help = |verb: &[&str]| {
        let out = Command::new(nova).args(verb).arg("--help").output().expect("run nova");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "nova {verb:?} --help: {text}");
        text
    };
    for group in [&["bucket"][..], &["stream"], &["token"], &["serve"]] {
        assert!(help(group).contains("example"), "nova {group:?} --help");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    let path = format!(
        "{}:{}",
        nova.parent().expect("the binary's directory").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let in_order: [&[&str]; 15] = [
        &["ls"],
        &["bucket", "create"],
        &["bucket", "get"],
        &["bucket", "list"],
        &["stream", "create"],
        &["stream", "get"],
        &["stream", "reconfigure"],
        &["stream", "list"],
        &["append"],
        &["read"],
        &["tail"],
        &["trim"],
        &["fence"],
        &["stream", "delete"],
        &["bucket", "delete"],
    ];
    for verb in in_order {
        let text = help(verb);
        let example = text.split("example:\n  ").nth(1).and_then(|rest| rest.lines().next());
        let example = example.unwrap_or_else(|| panic!("nova {verb:?} --help: {text}"));
        let out = Command::new("sh")
            .args(["-c", example])
            .env("PATH", &path)
            .env("NOVA_SERVER", &server.url)
            .output()
            .expect("run sh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{example}: {stderr}");
    }
    assert_eq!(ok(&server, &["ls"], None), "", "the examples' bucket is deleted");

    // A verb that does not exist, even with --help, is a usage error.
    let out = Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["bucket", "update", "--help"])
        .output()
        .expect("run nova");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no verb \"bucket update\""));
}

/// An argument that is not UTF-8 is refused with a usage error, not a panic.
#[test]
fn arguments_that_are_not_utf8_are_refused() {
    use std::os::unix::ffi::OsStrExt as _;

    let header = std::ffi::OsStr::from_bytes(b"k\xff=v");
    let out = Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["append", "nova://apps/s", "--header"])
        .arg(header)
        .output()
        .expect("run nova");
    assert_eq!(out.status.code(), Some(2));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains("argument 4") && error.contains("UTF-8"), "{error}");
}

/// `nova serve`'s flag mistakes (and its variables') are usage mistakes: exit 2.
#[test]
fn serve_refuses_flags_it_cannot_use() {
    for (flags, named) in [
        (&["--s3-region", "eu-west-1"][..], "--s3-region needs --s3-bucket"),
        (&["--s3-bucket", "b", "--s3-access-key-id", "k"][..], "--s3-secret-access-key"),
        (
            &["--s3-bucket", "b", "--s3-path-style", "maybe"][..],
            "--s3-path-style (or NOVA_S3_PATH_STYLE) must be true or false",
        ),
        (&["--s3-bucket", ""][..], "--s3-bucket must name a bucket"),
        (
            &["--upload-backoff-initial-ms", "6s", "--upload-backoff-max-ms", "10"][..],
            "--upload-backoff-initial-ms or NOVA_UPLOAD_BACKOFF_INITIAL_MS (6000 ms) is longer than --upload-backoff-max-ms or NOVA_UPLOAD_BACKOFF_MAX_MS (10 ms)",
        ),
        (
            &["--s3-bucket", "b", "--s3-backoff-initial-ms", "2s", "--s3-backoff-max-ms", "1s"][..],
            "--s3-backoff-initial-ms or NOVA_S3_BACKOFF_INITIAL_MS (2000 ms) is longer",
        ),
        // An unknown flag is named as one, not as one that needs a value.
        (&["--bogus"][..], "unknown flag --bogus"),
        (&["--insecure-no-auth", "maybe"][..], "--insecure-no-auth is true or false"),
        (&["--accept-journal-loss=yes"][..], "--accept-journal-loss is true or false"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_nova"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(tempfile::tempdir().expect("tempdir").path().join("data"))
            .args(flags)
            .output()
            .expect("run nova serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
    }
    // The object-store settings' variables are held to the same rules.
    for (variable, value, named) in [
        (
            "NOVA_S3_PREFIX",
            "x",
            "NOVA_S3_PREFIX is set, but neither --s3-bucket nor NOVA_S3_BUCKET",
        ),
        ("NOVA_S3_PATH_STYLE", "x", "NOVA_S3_PATH_STYLE is set"),
        ("NOVA_S3_ATTEMPTS_MAX", "3", "NOVA_S3_ATTEMPTS_MAX is set"),
        // A knob's value is checked first, whatever else is wrong.
        ("NOVA_S3_ATTEMPTS_MAX", "x", "(from NOVA_S3_ATTEMPTS_MAX): \"x\" is not a whole number"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_nova"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(tempfile::tempdir().expect("tempdir").path().join("data"))
            .env(variable, value)
            .output()
            .expect("run nova serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{variable}: {stderr}");
        assert!(stderr.contains(named), "{variable}: {stderr}");
    }
}

/// The object store can be chosen by environment variables alone (NOVA_S3_*, and the
/// keys from AWS_*), as every other setting can.
#[test]
fn serve_takes_the_object_store_from_the_environment() {
    let moto = s3::testing::Moto::start();
    moto.create_bucket("nova");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let endpoint = moto.endpoint();
    let env = [
        ("NOVA_S3_BUCKET", "nova"),
        ("NOVA_S3_ENDPOINT", endpoint.as_str()),
        ("NOVA_S3_REGION", "us-east-1"),
        ("NOVA_S3_PATH_STYLE", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
    ];
    let nova = Nova::start_with(&data, &[], &env);
    nova.ok("POST", "/v1/buckets/env", Some(r#"{"create_stream_on_append":true}"#), 201);
    // A standard append is acknowledged once its object is in the store: in S3.
    nova.ok("POST", "/v1/streams/env/k/records", Some(r#"{"records":[{"body":"a"}]}"#), 200);
    assert!(!data.join("objects").exists(), "no local object store");
    // The bucket's listing (moto takes it unsigned) holds it.
    let authority = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(authority).expect("connect to moto");
    let list =
        format!("GET /nova?list-type=2 HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n");
    stream.write_all(list.as_bytes()).expect("ask for the listing");
    let mut listing = String::new();
    std::io::Read::read_to_string(&mut stream, &mut listing).expect("the listing");
    assert!(listing.contains("<Key>"), "the append's object is in the bucket: {listing}");
}

#[test]
fn append_takes_headers_and_batches_and_read_takes_rfc_3339() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    ok(
        &server,
        &["bucket", "create", "hdr", "--create-on-append", "--default-class", "express"],
        None,
    );
    let lines: String = (0..25).map(|i| format!("line{i}\n")).collect();
    let out = ok(
        &server,
        &[
            "--json",
            "append",
            "nova://hdr/s",
            "--batch",
            "10",
            "--header",
            "app=cli",
            "--header",
            "v=1",
        ],
        Some(&lines),
    );
    let acks: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
    let ranges: Vec<(u64, u64)> = acks
        .iter()
        .map(|a| {
            (
                a["start"]["seq_num"].as_u64().expect("start"),
                a["end"]["seq_num"].as_u64().expect("end"),
            )
        })
        .collect();
    assert_eq!(ranges, [(0, 10), (10, 20), (20, 25)], "batches of --batch records, in order");
    let out = ok(
        &server,
        &["--json", "read", "nova://hdr/s", "--from-time", "1970-01-01T00:00:00Z", "--count", "1"],
        None,
    );
    let record: Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(record["body"], "line0");
    assert_eq!(record["headers"], serde_json::json!([["app", "cli"], ["v", "1"]]));
    let out = ok(&server, &["read", "nova://hdr/s", "--from-seq", "23"], None);
    assert_eq!(out, "line23\nline24\n");
    for (args, named) in [
        (&["append", "nova://hdr/s", "--batch", "0"][..], "--batch must be 1 to 100000"),
        (&["append", "nova://hdr/s", "--header", "novalue"][..], "--header \"novalue\""),
        (&["read", "nova://hdr/s", "--from-time", "noon"][..], "--from-time"),
    ] {
        let out = nova_cli(&server, args, Some("x\n"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
    // The server's refusal, non-zero with its message.
    let out = nova_cli(&server, &["append", "nova://hdr/s", "--match-seq-num", "3"], Some("x\n"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("failed_precondition"));
}

/// An address with no bucket (`nova:///key`, or `--key` without `--bucket`) is in the
/// bucket `default` (seeds/buckets.md: "nova uses default when you give none"), which
/// the CLI creates like any other bucket when it does not exist, with streams created on
/// first append; an existing one is used as it is.
#[test]
fn an_address_with_no_bucket_is_in_the_default_bucket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(&dir.path().join("data"));
    // Verbs that only read or remove leave it as they find it.
    let missing = fails(&server, &["read", "nova:///orders/eu"], None, 1);
    assert!(missing.contains("not_found"), "{missing}");
    fails(&server, &["stream", "get", "nova:///orders/eu"], None, 1);
    assert_eq!(ok(&server, &["ls"], None), "", "no bucket was made");
    assert!(ok(&server, &["append", "nova:///orders/eu"], Some("a\nb\n")).contains("2 records"));
    let read = ok(&server, &["read", "nova://default/orders/eu", "--from-seq", "0"], None);
    assert_eq!(read, "a\nb\n");
    assert_eq!(ok(&server, &["read", "nova:///orders/eu", "--from-seq", "1"], None), "b\n");
    let tail = json_of(&server, &["--json", "tail", "nova:///orders/eu"]);
    assert_eq!(tail["tail"]["seq_num"], 2, "{tail}");
    let bucket = json_of(&server, &["--json", "bucket", "get", "default"]);
    assert_eq!(bucket["create_stream_on_append"], true, "{bucket}");
    assert_eq!(bucket["create_stream_on_read"], false, "{bucket}");
    let created = json_of(&server, &["--json", "stream", "create", "--key", "made"]);
    assert_eq!(created["bucket"], "default", "{created}");
    assert_eq!(ok(&server, &["stream", "list", "nova:///"], None), "made\norders/eu\n");
    // An existing `default` is used as it is, never reconfigured.
    server.ok("PUT", "/v1/buckets/default", Some("{}"), 200);
    let refused = fails(&server, &["append", "nova:///other"], Some("x\n"), 1);
    assert!(refused.contains("not_found") || refused.contains("not found"), "{refused}");
    let bucket = json_of(&server, &["--json", "bucket", "get", "default"]);
    assert_eq!(bucket["create_stream_on_append"], false, "{bucket}");
    // A key without nova:// is refused, never taken for one in `default`.
    for typo in ["default/x", "nova:/default/x"] {
        let said = fails(&server, &["tail", typo], None, 2);
        assert!(said.contains("not an address") && said.contains("nova:///key"), "{said}");
    }
}

/// `nova ARGS` expected to fail with `code`: its stderr.
fn fails(server: &Nova, args: &[&str], stdin: Option<&str>, code: i32) -> String {
    let out = nova_cli(server, args, stdin);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "nova {args:?}: {stderr}");
    stderr
}

fn json_of(server: &Nova, args: &[&str]) -> Value {
    serde_json::from_str(&ok(server, args, None)).expect("json")
}

#[test]
fn a_bare_0_sets_a_bound_back_to_unbounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    ok(&server, &["bucket", "create", "ret"], None);
    ok(&server, &["stream", "create", "nova://ret/s", "--retention-max-age", "1h"], None);
    // seeds/retention.md: reconfigure sets age retention back to unbounded, written 0.
    ok(&server, &["stream", "reconfigure", "nova://ret/s", "--retention-max-age", "0"], None);
    let stream = json_of(&server, &["--json", "stream", "get", "nova://ret/s"]);
    assert_eq!(stream["retention_max_age_ms"], 0);
    // Any other number still needs its unit.
    let args = ["stream", "reconfigure", "nova://ret/s", "--retention-max-age", "10"];
    let stderr = fails(&server, &args, None, 2);
    assert!(stderr.contains("--retention-max-age \"10\" needs a unit"), "{stderr}");
}

#[test]
fn every_stream_option_has_a_flag_and_switches_take_true_or_false() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    // A bucket's defaults are the stream options with `default-` in front.
    let args = [
        "bucket",
        "create",
        "opt",
        "--create-on-append=false",
        "--default-batch-max-records",
        "10",
        "--default-timestamping-uncapped",
    ];
    ok(&server, &args, None);
    let bucket = json_of(&server, &["--json", "bucket", "get", "opt"]);
    assert_eq!(bucket["create_stream_on_append"], false);
    assert_eq!(bucket["default_batch_max_records"], 10);
    assert_eq!(bucket["default_timestamping_uncapped"], true);
    let args = [
        "stream",
        "create",
        "nova://opt/s",
        "--timestamping-uncapped",
        "--retention-max-bytes",
        "1GiB",
        "--batch-max-bytes",
        "64KiB",
        "--batch-max-records",
        "500",
        "--batch-max-delay",
        "50ms",
        "--throughput-max-bytes-per-second",
        "2MiB",
    ];
    ok(&server, &args, None);
    let stream = json_of(&server, &["--json", "stream", "get", "nova://opt/s"]);
    for (field, value) in [
        ("timestamping_uncapped", Value::from(true)),
        ("retention_max_bytes", Value::from(1u64 << 30)),
        ("batch_max_bytes", Value::from(64 << 10)),
        ("batch_max_records", Value::from(500)),
        ("batch_max_delay_ms", Value::from(50)),
        ("throughput_max_bytes_per_second", Value::from(2 << 20)),
    ] {
        assert_eq!(stream[field], value, "{field}");
    }
    // A switch takes its value after a space too.
    ok(&server, &["bucket", "create", "opt2", "--create-on-read", "false", "--json"], None);
    assert_eq!(
        json_of(&server, &["--json", "bucket", "get", "opt2"])["create_stream_on_read"],
        false
    );
    let args = [
        "stream",
        "reconfigure",
        "nova://opt/s",
        "--timestamping-uncapped=true",
        "--batch-max-records",
        "0",
        "--batch-max-delay",
        "1s",
        "--throughput-max-bytes-per-second",
        "0",
    ];
    ok(&server, &args, None);
    let stream = json_of(&server, &["--json", "stream", "get", "nova://opt/s"]);
    assert_eq!(stream["batch_max_records"], 0);
    assert_eq!(stream["batch_max_delay_ms"], 1000);
    assert_eq!(stream["throughput_max_bytes_per_second"], 0);
    for (args, named) in [
        (&["stream", "create", "nova://opt/t", "--timestamping-uncapped=maybe"][..], "=true"),
        (&["stream", "create", "nova://opt/t", "--batch-max-bytes", "1MB"][..], "KiB, MiB or GiB"),
    ] {
        let stderr = fails(&server, args, None, 2);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
    for verb in [&["stream", "create"][..], &["stream", "reconfigure"], &["bucket", "create"]] {
        let help = ok(&server, &[verb, &["--help"]].concat(), None);
        assert!(help.contains("batch-max-bytes"), "{verb:?}: {help}");
    }
}

#[test]
fn append_refuses_an_input_without_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    ok(&server, &["bucket", "create", "app", "--create-on-append"], None);
    for args in [&["append", "nova://app/s"][..], &["--json", "append", "nova://app/s"]] {
        let stderr = fails(&server, args, Some(""), 1);
        assert!(stderr.contains("nothing to append"), "{args:?}: {stderr}");
    }
}

/// Under `--json` a failure is one JSON object on stderr: the server's code, status and
/// error body when it answered, the CLI's own code when it did not.
#[test]
fn failures_under_json_are_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    ok(&server, &["bucket", "create", "app", "--create-on-append"], None);
    let error = |args: &[&str], stdin, code| -> Value {
        let stderr = fails(&server, args, stdin, code);
        serde_json::from_str(&stderr).unwrap_or_else(|e| panic!("{args:?}: {e}: {stderr}"))
    };

    let missing = error(&["--json", "stream", "get", "nova://app/none"], None, 1);
    assert_eq!((&missing["code"], &missing["status"]), (&"not_found".into(), &404.into()));
    assert_eq!(missing["error"]["code"], "not_found", "{missing}");
    assert!(missing["message"].as_str().is_some_and(|m| m.contains("not_found")), "{missing}");

    // A refused append keeps the server's details (next_seq_num) and says which lines.
    let args = ["--json", "append", "nova://app/s", "--match-seq-num", "5"];
    let refused = error(&args, Some("a\n"), 1);
    assert_eq!(refused["code"], "failed_precondition", "{refused}");
    assert_eq!(refused["error"]["next_seq_num"], 0, "{refused}");
    assert!(refused["message"].as_str().is_some_and(|m| m.starts_with("lines 1-1")), "{refused}");

    let usage = error(&["--json", "read", "nova://app/s", "--bogus", "1"], None, 2);
    assert_eq!(usage["code"], "usage", "{usage}");
    assert!(usage.get("status").is_none(), "{usage}");

    let unreachable = ["--json", "--server", "http://127.0.0.1:1", "--timeout", "2s", "ls"];
    let unreachable = error(&unreachable, None, 1);
    assert_eq!(unreachable["code"], "connection_failed", "{unreachable}");

    // Arguments that cannot be read are told as JSON too.
    let usage = error(&["--json", "read", "nova://app/s", "--count"], None, 2);
    assert_eq!(usage["code"], "usage", "{usage}");

    // An append sent to a server that never answers may have landed: a script is told
    // so first, and after one --timeout (not one per attempt).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a silent listener");
    let url = format!("http://{}", silent.local_addr().expect("its address"));
    let args = ["--json", "--server", &url, "--timeout", "1s", "append", "nova://app/s"];
    let started = std::time::Instant::now();
    let unknown = error(&args, Some("a\n"), 1);
    assert_eq!(unknown["code"], "outcome_unknown", "{unknown}");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());

    // The largest match_seq_num is refused by the server, never a crash in the CLI.
    let args = ["--json", "append", "nova://app/s", "--match-seq-num", "18446744073709551615"];
    let refused = error(&args, Some("a\nb\n"), 1);
    assert_eq!(refused["code"], "failed_precondition", "{refused}");
}

/// A flag that takes a value never takes the flag after it, a `-x` is no flag, and
/// `serve` and `doctor` come first; `--version` goes with `--json`.
#[test]
fn flags_are_never_taken_for_values_nor_verbs_for_arguments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    ok(&server, &["bucket", "create", "app", "--create-on-append"], None);
    ok(&server, &["append", "nova://app/s"], Some("a\n"));
    let stderr = fails(&server, &["fence", "nova://app/s", "--token", "--json"], None, 2);
    assert!(stderr.contains("--token needs a value, not the flag --json"), "{stderr}");
    let stream = json_of(&server, &["--json", "stream", "get", "nova://app/s"]);
    assert_eq!(stream["fencing_token"], Value::Null, "nothing was fenced: {stream}");
    let stderr =
        fails(&server, &["bucket", "create", "b", "--location", "--create-on-read"], None, 2);
    assert!(stderr.contains("--location needs a value"), "{stderr}");
    // The value is given with `=` when it does start with --.
    ok(&server, &["fence", "nova://app/s", "--token=--odd"], None);

    let stderr = fails(&server, &["read", "nova://app/s", "-x"], None, 2);
    assert!(stderr.contains("unknown flag -x"), "{stderr}");
    let stderr = fails(&server, &["--timeout", "5s", "serve"], None, 2);
    assert!(stderr.contains("serve takes no flags before it"), "{stderr}");

    let version = json_of(&server, &["--json", "--version"]);
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"), "{version}");
    let stderr = fails(&server, &["ls", "--version"], None, 2);
    assert!(stderr.contains("--version is nova's own and takes no verb"), "{stderr}");
}

/// `read -f | head -1`: once its reader has closed the pipe, a follow of a stream with
/// nothing new ends at the next heartbeat rather than wait for a record to write.
#[test]
fn follow_ends_when_its_reader_has_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start_with(dir.path(), &["--sse-heartbeat-ms", "300"], &[]);
    ok(&server, &["bucket", "create", "app", "--create-on-append"], None);
    ok(&server, &["append", "nova://app/s"], Some("one\n"));
    let (mut child, mut lines) = follow(&server, "nova://app/s", &["--from-seq", "0"]);
    assert_eq!(lines.next().expect("a line").expect("read it"), "one");
    drop(lines);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the follower") {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "the follower goes on with no reader");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

/// `append` refuses a line longer than any record, without holding it whole.
#[test]
fn append_refuses_a_line_longer_than_any_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    ok(&server, &["bucket", "create", "app", "--create-on-append"], None);
    let long = format!("first\n{}\nlast\n", "x".repeat(17 << 20));
    let stderr = fails(&server, &["append", "nova://app/s"], Some(&long), 1);
    assert!(stderr.contains("line 2 is longer than any record a server takes"), "{stderr}");
    assert!(stderr.contains("1 record before it was appended"), "{stderr}");
    let tail = json_of(&server, &["--json", "tail", "nova://app/s"]);
    assert_eq!(tail["tail"]["seq_num"], 1, "{tail}");
}

/// A flag before the verb that nova does not know takes the verb for its value: the
/// refusal says so, rather than that no verb was given.
#[test]
fn an_unknown_flag_before_the_verb_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    let stderr = fails(&server, &["--bogus", "ls"], None, 2);
    assert!(stderr.contains("unknown flag --bogus (it took \"ls\" as its value)"), "{stderr}");
    assert!(!stderr.contains("no verb"), "{stderr}");
}

#[test]
fn append_counts_one_record_in_the_singular() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    ok(&server, &["bucket", "create", "app", "--create-on-append"], None);
    let out = ok(&server, &["append", "nova://app/s"], Some("one\n"));
    assert!(out.starts_with("appended 1 record; next_seq_num 1"), "{out}");
}

#[test]
fn json_deletes_say_what_was_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    ok(&server, &["bucket", "create", "del"], None);
    ok(&server, &["stream", "create", "nova://del/a/b"], None);
    let deleted = json_of(&server, &["--json", "stream", "delete", "nova://del/a/b"]);
    assert_eq!(deleted, serde_json::json!({"deleted": "stream", "bucket": "del", "key": "a/b"}));
    let deleted = json_of(&server, &["--json", "bucket", "delete", "del"]);
    assert_eq!(deleted, serde_json::json!({"deleted": "bucket", "name": "del"}));
}

#[test]
fn a_create_that_converges_on_its_creation_token_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Nova::start(dir.path());
    let bucket = ["bucket", "create", "tok", "--creation-token", "t1"];
    assert_eq!(ok(&server, &bucket, None), "created bucket tok\n");
    assert_eq!(ok(&server, &bucket, None), "bucket tok already exists with this configuration\n");
    let stream = ["stream", "create", "nova://tok/s", "--creation-token", "t1"];
    assert!(ok(&server, &stream, None).starts_with("created stream nova://tok/s"));
    let again = ok(&server, &stream, None);
    assert!(
        again.starts_with("stream nova://tok/s already exists with this configuration"),
        "{again}"
    );
    // Another configuration under the same token is the server's refusal.
    let stderr = fails(&server, &[&stream[..], &["--class", "express"]].concat(), None, 1);
    assert!(stderr.contains("already_exists"), "{stderr}");
}

#[test]
fn an_empty_server_variable_means_the_default_server() {
    let out = Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["tail", "nova://b/s"])
        .env("NOVA_SERVER", "")
        .output()
        .expect("run nova");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Whatever answers at the default address (likely nothing), the empty URL is not used.
    assert_ne!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains("server URL"), "{stderr}");
}

/// `--timeout` bounds each wait on the server: a server that takes the connection and
/// never answers fails the call with that said, instead of holding the shell for good.
#[test]
fn a_server_that_never_answers_fails_the_call_after_the_timeout() {
    // The kernel accepts into the backlog; nothing ever reads or answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("address"));
    let nova = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_nova"))
            .args(["--server", &url])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run nova")
    };
    for args in [&["--timeout", "100ms", "tail", "nova://b/s"][..], &["--timeout=100ms", "ls"]] {
        let out = nova(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("did not answer within the client's timeout"), "{stderr}");
    }
    let out = nova(&["--timeout", "100", "ls"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--timeout") && stderr.contains("needs a unit"), "{stderr}");
}

/// `read` stops when its output goes: a follow whose reader closed the pipe ends (as
/// `nova read -f ... | head -1` should), and a write that fails otherwise is a failure.
#[test]
fn read_ends_with_its_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    ok(&nova, &["bucket", "create", "outp", "--create-on-append"], None);
    ok(&nova, &["append", "nova://outp/s"], Some("first\n"));
    let (mut follow, mut lines) = follow(&nova, "nova://outp/s", &[]);
    assert_eq!(lines.next().expect("a line").expect("read"), "first");
    drop(lines);
    // The next record meets the closed pipe.
    ok(&nova, &["append", "nova://outp/s"], Some("second\n"));
    let status = follow.wait().expect("the follow ends");
    assert!(status.success(), "{status}");
    // A full disk is a failure that says so.
    let out = to_full_disk(&nova, &["read", "nova://outp/s"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("writing the records to stdout failed"), "{stderr}");
    // So is an answer that cannot be written.
    let out = to_full_disk(&nova, &["ls"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("writing to stdout failed"), "{stderr}");
}

/// `nova append` to `stream` on `server`, its stdin kept open: the first `lines` are
/// written and awaited until the stream's tail shows them (sent on the input's pause).
fn append_pausing(server: &Nova, stream: &str, lines: &[u8], count: u64) -> (Child, ChildStdin) {
    let mut child = spawn_cli(server, &["append", &format!("nova://{stream}")]);
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(lines).expect("write stdin");
    input.flush().expect("flush stdin");
    let tail = || {
        let answer = server.call("GET", &format!("/v1/streams/{stream}/tail"), None);
        (answer.status == 200).then(|| answer.json()["tail"]["seq_num"].as_u64()).flatten()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tail() != Some(count) {
        assert!(std::time::Instant::now() < deadline, "the lines never landed: {:?}", tail());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (child, input)
}

/// Lines from a producer that writes now and then go out while its stdin stays open
/// (`tail -f app.log | nova append ...`), not only when a batch fills or the input ends.
#[test]
fn append_sends_a_partial_batch_when_the_input_pauses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    ok(&nova, &["bucket", "create", "live", "--create-on-append"], None);
    let (child, mut input) = append_pausing(&nova, "live/s", b"a\nb\n", 2);
    input.write_all(b"c\n").expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("nova output");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ok(&nova, &["read", "nova://live/s"], None), "a\nb\nc\n");
}

/// A batch that meets a server gone away fails `append` with an account of the lines:
/// those appended before it, and it.
#[test]
fn append_accounts_for_its_lines_when_the_server_goes_away() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    ok(&nova, &["bucket", "create", "away", "--create-on-append"], None);
    let (child, mut input) = append_pausing(&nova, "away/s", b"a\n", 1);
    nova.kill();
    input.write_all(b"b\n").expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("nova output");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lines 2-2 "), "{stderr}");
    assert!(stderr.contains("1 record before them was"), "{stderr}");
}

/// Batches the stream's throughput cap refuses go again after the server's Retry-After,
/// in order: a capped stream takes the whole input, each line once.
#[test]
fn append_waits_out_a_throughput_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    ok(&nova, &["bucket", "create", "cap", "--default-class", "express"], None);
    let capped = ["stream", "create", "nova://cap/s", "--throughput-max-bytes-per-second", "16KiB"];
    ok(&nova, &capped, None);
    // Batches of 8 KB: the bucket refills one in half a second, far longer than between
    // two pipelined batches, so those behind a refused one are refused too.
    let lines: Vec<String> = (0..320).map(|i| format!("{i:04}{}", "x".repeat(96))).collect();
    let input = lines.join("\n") + "\n";
    let out = nova_cli(&nova, &["append", "nova://cap/s", "--batch", "80"], Some(&input));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("appended 320 records"));
    let read = ok(&nova, &["read", "nova://cap/s"], None);
    assert!(read.lines().eq(lines.iter().map(String::as_str)), "every line once, in order");
    // The cap did refuse some: the server counted its 429s (batches of the append's
    // session).
    let refusals = nova.call("GET", "/metrics", None).text();
    let throttled = refusals
        .lines()
        .any(|line| line.starts_with("nova_http_session_outcomes_total{status=\"429\"}"));
    assert!(throttled, "the cap never refused a batch: the test proves nothing");
}

/// `nova append --json` whose reader has gone (`... | head -3`) appends the rest of its
/// input all the same, where printing its acknowledgements once ended it in a panic.
#[test]
fn append_goes_on_when_its_output_is_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    ok(&nova, &["bucket", "create", "gone", "--create-on-append"], None);
    let mut child = spawn_cli(&nova, &["--json", "append", "nova://gone/s", "--batch", "1"]);
    drop(child.stdout.take());
    let input: String = (1..=20).map(|i| format!("{i}\n")).collect();
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("nova output");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ok(&nova, &["read", "nova://gone/s"], None), input);
}

/// `read --json` never alters a byte: headers that are not UTF-8 come as
/// `headers_base64`, as a body that is not comes as `body_base64`.
#[test]
fn read_json_keeps_every_header_byte() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    ok(&nova, &["bucket", "create", "hdr", "--create-on-append"], None);
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let body = serde_json::json!({"records": [
        {"body": b64(b"text"), "headers": [[b64(b"k"), b64(b"v")]]},
        {"body": b64(&[0xff]), "headers": [[b64(b"k"), b64(&[0xfe, 0xff])]]},
    ]});
    let answer = nova.call_with(
        "POST",
        "/v1/streams/hdr/s/records",
        &[("nova-encoding", "base64")],
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let out = ok(&nova, &["--json", "read", "nova://hdr/s"], None);
    let records: Vec<Value> =
        out.lines().map(|line| serde_json::from_str(line).expect("a JSON record a line")).collect();
    assert_eq!(records[0]["body"], "text");
    assert_eq!(records[0]["headers"], serde_json::json!([["k", "v"]]));
    assert_eq!(records[1]["body_base64"], b64(&[0xff]));
    assert_eq!(records[1]["headers_base64"], serde_json::json!([[b64(b"k"), b64(&[0xfe, 0xff])]]));
    assert!(records[1].get("headers").is_none(), "{out}");
}

/// `read --follow` outlives a restart of the server: it resumes right after the last
/// record it printed, so nothing is lost or printed twice.
#[test]
fn follow_resumes_across_a_server_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let nova = Nova::start_with(&data, &[], &[]);
    ok(&nova, &["bucket", "create", "fol", "--create-on-append"], None);
    ok(&nova, &["append", "nova://fol/s"], Some("first\n"));
    let (first, mut lines) = follow(&nova, "nova://fol/s", &[]);
    assert_eq!(lines.next().expect("a line").expect("read"), "first");
    // One from the tail, cut before any event: it resumes from the tail it started at,
    // not from the tail when it comes back (the records appended meanwhile would be lost).
    // It speaks JSON: its records are JSON lines, and the cut is told as JSON too.
    let (at_tail, mut from_tail) = follow(&nova, "nova://fol/s", &["--tail-offset", "0", "--json"]);
    // Both subscriptions wait at the tail.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while nova.metric("nova_shard_reads_waiting") < 2 {
        assert!(std::time::Instant::now() < deadline, "the second follower never subscribed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let address = nova.server.authority.clone();
    assert!(nova.terminate().success());
    // Records appended while the followers cannot reach the server (it runs elsewhere).
    let elsewhere = Nova::start_with(&data, &[], &[]);
    ok(&elsewhere, &["append", "nova://fol/s"], Some("second\nthird\n"));
    assert!(elsewhere.terminate().success());
    let nova = Nova::start_with(&data, &["--listen", &address], &[]);
    ok(&nova, &["append", "nova://fol/s"], Some("fourth\n"));
    let body = |line: String| match serde_json::from_str::<Value>(&line) {
        Ok(record) => record["body"].as_str().map(str::to_owned).unwrap_or(line),
        Err(_) => line,
    };
    for lines in [&mut lines, &mut from_tail] {
        for expected in ["second", "third", "fourth"] {
            assert_eq!(body(lines.next().expect("a line").expect("read")), expected);
        }
    }
    for (mut follower, json) in [(first, false), (at_tail, true)] {
        follower.kill().expect("stop the follower");
        let out = follower.wait_with_output().expect("the follower's end");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("the subscription was cut"), "{stderr}");
        for line in stderr.lines() {
            let notice = serde_json::from_str::<Value>(line).ok();
            let notice = notice.as_ref().and_then(|n| n["notice"].as_str());
            assert_eq!(notice.is_some(), json, "{line}");
        }
    }
}

/// `read --follow` resumes on the stream it followed, never on one created at its
/// address while it was cut (buckets.md: "nothing of the old one is visible through the
/// new address"): it ends with the server's not_found instead of printing the new
/// stream's records from the old one's position.
#[test]
fn follow_never_resumes_on_a_stream_created_anew_at_its_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let nova = Nova::start_with(&data, &[], &[]);
    ok(&nova, &["bucket", "create", "pin", "--create-on-append"], None);
    ok(&nova, &["append", "nova://pin/s"], Some("old0\nold1\nold2\n"));
    let (mut follower, mut lines) = follow(&nova, "nova://pin/s", &[]);
    for expected in ["old0", "old1", "old2"] {
        assert_eq!(lines.next().expect("a line").expect("read"), expected);
    }
    let address = nova.server.authority.clone();
    assert!(nova.terminate().success());
    // Deleted and created anew while the follower cannot reach the server.
    let elsewhere = Nova::start_with(&data, &[], &[]);
    ok(&elsewhere, &["stream", "delete", "nova://pin/s"], None);
    ok(&elsewhere, &["append", "nova://pin/s"], Some("new0\nnew1\nnew2\nnew3\nnew4\n"));
    assert!(elsewhere.terminate().success());
    let nova = Nova::start_with(&data, &["--listen", &address], &[]);
    let printed = lines.next().map(|line| line.expect("read"));
    if printed.is_some() {
        follower.kill().expect("stop the follower");
    }
    assert_eq!(printed, None, "printed from the new stream");
    assert_eq!(follower.wait().expect("the follower ends").code(), Some(1));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut follower.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(stderr.contains("not_found"), "{stderr}");
    // The new stream is there, for a new follower.
    assert_eq!(ok(&nova, &["read", "nova://pin/s", "--count", "1"], None), "new0\n");
}

/// A refused batch ends `append`, and the failure says exactly which input lines were
/// appended: those before it, and any pipelined after it that landed anyway.
#[test]
fn a_refused_batch_says_which_lines_were_appended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    ok(&nova, &["bucket", "create", "refu", "--create-on-append"], None);
    let big = "x".repeat((1 << 20) + 1);
    let input = format!("a\nb\n{big}\nd\ne\nf\n");
    let out = nova_cli(&nova, &["append", "nova://refu/s", "--batch", "1"], Some(&input));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stderr.contains("lines 3-3 were not appended: "), "{stderr}");
    assert!(stderr.contains("over the record limit"), "{stderr}");
    assert!(stderr.contains("2 records before them were"), "{stderr}");
    // Exactly what it says landed is in the stream.
    let mut said = vec!["a".to_owned(), "b".to_owned()];
    let lines = ["a", "b", "", "d", "e", "f"];
    for part in stderr.split("; ") {
        if let Some(rest) = part.strip_prefix("lines ")
            && part.contains("were appended after them")
        {
            let line: usize = rest.split('-').next().and_then(|n| n.parse().ok()).expect("a line");
            said.push(lines[line - 1].to_owned());
        }
    }
    let read = ok(&nova, &["read", "nova://refu/s"], None);
    assert_eq!(read.lines().collect::<Vec<_>>(), said, "{stderr}");
}

/// Input whose `--batch` worth of lines is more than a batch may hold (100 MiB) goes in
/// more than one batch, cut before the limit, and every line lands once, in order.
#[test]
fn append_cuts_a_batch_before_the_100_mib_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Segments that take a batch of 100 MiB, as the default 256 MiB do (the test servers'
    // 8 MiB take no express batch over 8 MiB).
    let nova =
        Nova::start_with(&dir.path().join("data"), &["--journal-segment-bytes", "128MiB"], &[]);
    ok(&nova, &["bucket", "create", "big", "--create-on-append"], None);
    // 101 records just under the 1 MiB record limit: 105 MB, over 100 MiB.
    let lines: Vec<String> = (0..101).map(|i| format!("{i:03}{}", "x".repeat(1_040_000))).collect();
    let input = lines.join("\n") + "\n";
    assert!(input.len() as u64 > engine::limits::BATCH_BYTES_MAX);
    let out = ok(&nova, &["--json", "append", "nova://big/s", "--batch", "1000"], Some(&input));
    let acks: Vec<Value> =
        out.lines().map(|line| serde_json::from_str(line).expect("one JSON ack a line")).collect();
    let ends: Vec<u64> =
        acks.iter().map(|ack| ack["end"]["seq_num"].as_u64().expect("an end")).collect();
    // Each batch within the limit (at most 100 of these records), however the input's
    // pauses cut them, and together every record.
    let sizes: Vec<u64> =
        ends.iter().scan(0, |start, &end| Some(end - std::mem::replace(start, end))).collect();
    assert!(sizes.iter().all(|&n| (1..=100).contains(&n)), "{ends:?}");
    assert_eq!(ends.last(), Some(&101), "{ends:?}");
    let read = ok(&nova, &["read", "nova://big/s"], None);
    assert!(read.lines().eq(lines.iter().map(String::as_str)), "every line once, in order");
}

/// A listing longer than a page (1000 buckets) is one list: one JSON document with
/// `--json`, one line per bucket without.
#[test]
fn ls_lists_every_page_as_one_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    let names: Vec<String> = (0..1001).map(|i| format!("b{i:04}")).collect();
    for name in &names {
        nova.ok("POST", &format!("/v1/buckets/{name}"), None, 201);
    }
    let listed: Value =
        serde_json::from_str(&ok(&nova, &["--json", "ls"], None)).expect("one JSON document");
    let listed: Vec<&str> = listed["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(listed, names);
    assert_eq!(ok(&nova, &["ls"], None).lines().count(), 1001);
}
