//! Authentication and authorization (spec/auth.md, docs/auth.md) over real sockets
//! against a `nova serve` child with a root token: 401 without a known token, 403 without
//! the grant (and the same answer whether the target exists or not), each resource kind,
//! issuing, listing, expiring and revoking tokens, tokens kept across a restart, and the
//! CLI and client carrying a token.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Nova;
use serde_json::{Value, json};

const ROOT: &str = "root-token-for-tests-0123456789";

/// The root token's file in `dir`, which only its owner may read (or nova warns).
fn root_file(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join("root-token");
    std::fs::write(&path, format!("{ROOT}\n")).expect("write the root token file");
    let owner_only = std::fs::Permissions::from_mode(0o600);
    std::fs::set_permissions(&path, owner_only).expect("chmod 600 the root token file");
    path.to_str().expect("a UTF-8 path").to_owned()
}

fn start(dir: &Path) -> Nova {
    Nova::start_with(&dir.join("data"), &["--root-token-file", &root_file(dir)], &[])
}

/// Calls with `token` (None: no Authorization header); the status and the JSON body.
fn call(
    nova: &Nova,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> =
        bearer.as_deref().map(|b| ("authorization", b)).into_iter().collect();
    let body = body.map(Value::to_string);
    let response = nova.call_with(method, path, &headers, body.as_deref().map(str::as_bytes));
    let json = if response.body.is_empty() { Value::Null } else { response.json() };
    (response.status, json)
}

fn expect(
    nova: &Nova,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
    status: u16,
) -> Value {
    let (got, json) = call(nova, token, method, path, body);
    assert_eq!(got, status, "{method} {path}: {json}");
    json
}

fn issue(nova: &Nova, grants: &[&str]) -> (String, String) {
    let issued =
        expect(nova, Some(ROOT), "POST", "/v1/tokens", Some(&json!({"grants": grants})), 201);
    let token = issued["token"].as_str().expect("the token").to_owned();
    let id = issued["id"].as_str().expect("the id").to_owned();
    assert!(token.starts_with(&format!("nova_{id}_")), "{token}");
    (token, id)
}

/// `nova serve` with `flags` and `env`, which must refuse to start (exit 2, a usage
/// mistake) before it touches its data directory; its stderr.
fn serve_refused(dir: &Path, flags: &[&str], env: &[(&str, &str)]) -> String {
    let data = dir.join("refused");
    let out = Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .args(flags)
        .env_remove("NOVA_ROOT_TOKEN_FILE")
        .envs(env.iter().copied())
        .output()
        .expect("run nova serve");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{flags:?} {env:?}: {stderr}");
    assert!(!data.exists(), "refused before it touched the disk: {flags:?}");
    stderr
}

/// The root token creates `bucket`, with streams created on first append.
fn autocreating_bucket(nova: &Nova, bucket: &str) {
    let config = json!({"create_stream_on_append": true});
    expect(nova, Some(ROOT), "POST", &format!("/v1/buckets/{bucket}"), Some(&config), 201);
}

#[test]
fn every_request_but_health_needs_a_token_the_server_knows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = start(dir.path());
    expect(&nova, None, "GET", "/health", None, 200);
    for (method, path) in [
        ("GET", "/v1/buckets"),
        ("POST", "/v1/buckets/apps"),
        ("GET", "/v1/streams/apps/k/records"),
        ("POST", "/v1/tokens"),
        ("GET", "/metrics"),
        ("GET", "/v1/no/such/route"),
        // Only GET and HEAD are the probe's.
        ("POST", "/health"),
        ("DELETE", "/health"),
    ] {
        let response = nova.call(method, path, None);
        assert_eq!(response.status, 401, "{method} {path}: {}", response.text());
        assert_eq!(response.json()["code"], "unauthenticated");
        assert_eq!(response.header("www-authenticate"), Some("Bearer"));
    }
    for wrong in [
        "not-the-root-token".to_owned(),
        format!("{ROOT}x"),
        format!("nova_{}_{}", "0".repeat(16), "0".repeat(64)),
    ] {
        let (status, body) = call(&nova, Some(&wrong), "GET", "/v1/buckets", None);
        assert_eq!((status, body["code"].as_str()), (401, Some("unauthenticated")), "{body}");
    }
    let twice = nova.call_with(
        "GET",
        "/v1/buckets",
        &[("authorization", &format!("Bearer {ROOT}")), ("authorization", "Bearer other")],
        None,
    );
    assert_eq!(twice.status, 401, "two Authorization headers: {}", twice.text());
    let basic =
        nova.call_with("GET", "/v1/buckets", &[("authorization", &format!("Basic {ROOT}"))], None);
    assert_eq!(basic.status, 401);
    assert!(basic.json()["message"].as_str().is_some_and(|m| m.contains("Bearer")));
    // The root token may do everything.
    expect(&nova, Some(ROOT), "GET", "/v1/buckets", None, 200);
    expect(&nova, Some(ROOT), "GET", "/metrics", None, 200);
}

#[test]
fn each_grant_reaches_only_its_resource_and_operations() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = start(dir.path());
    for bucket in ["apps", "other"] {
        autocreating_bucket(&nova, bucket);
    }
    let records = json!({"records": [{"body": "hi"}]});
    for path in ["/v1/streams/apps/orders%2Feu/records", "/v1/streams/other/exists/records"] {
        expect(&nova, Some(ROOT), "POST", path, Some(&records), 200);
    }

    // A bucket reader reads that bucket's streams, and does nothing else.
    let (reader_token, _) = issue(&nova, &["bucket:apps:read"]);
    let reader = Some(reader_token.as_str());
    expect(&nova, reader, "GET", "/v1/streams/apps/orders%2Feu/records?seq_num=0", None, 200);
    expect(&nova, reader, "GET", "/v1/streams/apps/orders%2Feu/tail", None, 200);
    expect(&nova, reader, "GET", "/v1/streams/apps/orders%2Feu", None, 200);
    expect(&nova, reader, "GET", "/v1/streams/apps", None, 200);
    expect(&nova, reader, "GET", "/v1/buckets/apps", None, 200);
    for (method, path, body) in [
        ("POST", "/v1/streams/apps/orders%2Feu/records", Some(&records)),
        ("POST", "/v1/streams/apps/orders%2Feu/trim", Some(&json!({"seq_num": 1}))),
        ("POST", "/v1/streams/apps/orders%2Feu/fence", Some(&json!({"fencing_token": "t"}))),
        ("DELETE", "/v1/streams/apps/orders%2Feu", None),
        ("PUT", "/v1/buckets/apps", Some(&json!({}))),
        ("GET", "/v1/buckets", None),
        ("GET", "/metrics", None),
        ("GET", "/v1/tokens", None),
        ("DELETE", "/v1/tokens/0123456789abcdef", None),
        ("GET", "/v1/streams/other/exists/records", None),
        ("GET", "/v1/streams/other/exists/plan", None),
        ("GET", "/v1/buckets/other", None),
        ("GET", "/v1/buckets/nothere", None),
    ] {
        let denied = expect(&nova, reader, method, path, body, 403);
        assert_eq!(denied["code"], "permission_denied", "{method} {path}");
    }
    // Subscriptions, SSE and binary, are reads.
    let bearer = format!("Bearer {reader_token}");
    for accept in ["text/event-stream", "application/x-nova-records; subscribe=true"] {
        let headers = [("authorization", bearer.as_str()), ("accept", accept)];
        let refused = nova.call_with("GET", "/v1/streams/other/exists/records", &headers, None);
        assert_eq!(refused.status, 403, "{accept}: {}", refused.text());
    }
    // A refusal says the same whether the bucket or stream exists or not.
    let (bucket, nothere) = (
        expect(&nova, reader, "GET", "/v1/buckets/other", None, 403),
        expect(&nova, reader, "GET", "/v1/buckets/nothere", None, 403),
    );
    assert_eq!(
        bucket["message"].as_str().map(|m| m.replace("other", "NAME")),
        nothere["message"].as_str().map(|m| m.replace("nothere", "NAME")),
    );
    let exists = expect(&nova, reader, "GET", "/v1/streams/other/exists", None, 403);
    let missing = expect(&nova, reader, "GET", "/v1/streams/other/missing", None, 403);
    assert_eq!(
        exists["message"].as_str().map(|m| m.replace("exists", "KEY")),
        missing["message"].as_str().map(|m| m.replace("missing", "KEY")),
    );
    assert!(
        exists["message"]
            .as_str()
            .is_some_and(|m| m.contains("no read grant on stream other/exists"))
    );

    // A stream-prefix writer appends (creating) under its prefix, and lists only there.
    let (writer, _) = issue(&nova, &["stream:apps/orders/:write,read"]);
    let writer = Some(writer.as_str());
    expect(&nova, writer, "POST", "/v1/streams/apps/orders%2Fus/records", Some(&records), 200);
    expect(&nova, writer, "POST", "/v1/streams/apps/logs/records", Some(&records), 403);
    expect(&nova, writer, "GET", "/v1/buckets/apps", None, 403);
    expect(&nova, writer, "GET", "/v1/streams/apps", None, 403);
    let listed = expect(&nova, writer, "GET", "/v1/streams/apps?prefix=orders%2F", None, 200);
    let keys: Vec<&str> = listed["streams"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["key"].as_str())
        .collect();
    assert_eq!(keys, ["orders/eu", "orders/us"]);
    let past = "/v1/streams/apps?prefix=orders%2F&start_after=zzz";
    assert_eq!(expect(&nova, writer, "GET", past, None, 200)["streams"], json!([]));
    expect(&nova, writer, "GET", "/v1/streams/apps?prefix=order", None, 403);

    // A bucket admin creates and deletes in its bucket, but issues no tokens.
    let (admin, _) = issue(&nova, &["bucket:other:admin"]);
    let admin = Some(admin.as_str());
    expect(&nova, admin, "POST", "/v1/streams/other/made", None, 201);
    expect(&nova, admin, "DELETE", "/v1/streams/other/made", None, 204);
    expect(&nova, admin, "POST", "/v1/streams/apps/made", None, 403);
    expect(&nova, admin, "POST", "/v1/tokens", Some(&json!({"grants": ["*:*:read"]})), 403);
    // A bucket's admin creates it, granted before it exists.
    let (founder, _) = issue(&nova, &["bucket:newb:admin"]);
    expect(&nova, Some(&founder), "POST", "/v1/buckets/newb", None, 201);
    expect(&nova, Some(&founder), "POST", "/v1/buckets/newc", None, 403);

    // A fleet reader lists buckets.
    let (fleet, _) = issue(&nova, &["*:*:read"]);
    let names = expect(&nova, Some(&fleet), "GET", "/v1/buckets", None, 200);
    assert_eq!(names["buckets"].as_array().map(Vec::len), Some(3));
}

#[test]
fn tokens_are_listed_without_secrets_revoked_at_once_expire_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = start(dir.path());
    let (kept, kept_id) = issue(&nova, &["*:*:read"]);
    let (revoked, revoked_id) = issue(&nova, &["*:*:read"]);
    let described =
        json!({"grants": ["bucket:apps:write"], "description": "ci", "expires_in_seconds": 3600});
    let issued = expect(&nova, Some(ROOT), "POST", "/v1/tokens", Some(&described), 201);
    assert_eq!(issued["description"], "ci");
    assert_eq!(issued["grants"], json!(["bucket:apps:write"]));
    let expires = issued["expires_at_ms"].as_u64().expect("an expiry");
    let created = issued["created_at_ms"].as_u64().expect("a creation time");
    assert_eq!(expires - created, 3_600_000);

    let listed = expect(&nova, Some(ROOT), "GET", "/v1/tokens", None, 200);
    let tokens = listed["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 3);
    let text = listed.to_string();
    for secret in [&kept, &revoked] {
        assert!(!text.contains(&secret[secret.len() - 64..]), "a secret in the list: {text}");
    }
    assert!(tokens.iter().all(|t| t.get("token").is_none() && t.get("hash").is_none()), "{text}");

    expect(&nova, Some(&revoked), "GET", "/v1/buckets", None, 200);
    expect(&nova, Some(ROOT), "DELETE", &format!("/v1/tokens/{revoked_id}"), None, 204);
    // Each call is a new connection, which the kernel gives either shard: the
    // revocation counts on both.
    for _ in 0..20 {
        expect(&nova, Some(&revoked), "GET", "/v1/buckets", None, 401);
    }
    expect(&nova, Some(ROOT), "DELETE", &format!("/v1/tokens/{revoked_id}"), None, 404);
    let long = format!("/v1/tokens/{}", "f".repeat(4000));
    for malformed in ["/v1/tokens/nothex", "/v1/tokens/%00", long.as_str()] {
        let refused = expect(&nova, Some(ROOT), "DELETE", malformed, None, 404);
        assert_eq!(refused["code"], "not_found");
    }

    // Pages of tokens.
    let first = expect(&nova, Some(ROOT), "GET", "/v1/tokens?limit=1", None, 200);
    let next = first["next"].as_str().expect("more follow").to_owned();
    assert_eq!(first["tokens"][0]["id"], json!(next));
    let rest =
        expect(&nova, Some(ROOT), "GET", &format!("/v1/tokens?start_after={next}"), None, 200);
    assert_eq!(rest["tokens"].as_array().map(Vec::len), Some(1), "two left after the revocation");
    assert_eq!(rest["next"], "");
    expect(&nova, Some(ROOT), "GET", "/v1/tokens?limit=0", None, 400);
    let over = expect(&nova, Some(ROOT), "GET", "/v1/tokens?limit=1001", None, 400);
    assert!(over["message"].as_str().is_some_and(|m| m.contains("between 1 and 1000")), "{over}");

    // A token expires at its time: asked for the shortest lifetime, it is refused soon.
    let short = json!({"grants": ["*:*:read"], "expires_in_seconds": 1});
    let brief = expect(&nova, Some(ROOT), "POST", "/v1/tokens", Some(&short), 201);
    let brief = brief["token"].as_str().expect("token").to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = call(&nova, Some(&brief), "GET", "/v1/buckets", None);
        if status == 401 {
            assert!(body["message"].as_str().is_some_and(|m| m.contains("expired at")), "{body}");
            break;
        }
        assert_eq!(status, 200);
        assert!(Instant::now() < deadline, "a 1 s token still works after 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }

    assert!(nova.terminate().success());
    let nova = start(dir.path());
    expect(&nova, Some(&kept), "GET", "/v1/buckets", None, 200);
    expect(&nova, Some(&revoked), "GET", "/v1/buckets", None, 401);
    let listed = expect(&nova, Some(ROOT), "GET", "/v1/tokens", None, 200);
    let ids: Vec<&str> = listed["tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert!(ids.contains(&kept_id.as_str()) && !ids.contains(&revoked_id.as_str()), "{ids:?}");
}

#[test]
fn a_bad_token_request_is_refused_naming_the_field_and_the_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = start(dir.path());
    let many: Vec<String> = (0..65).map(|_| "*:*:read".to_owned()).collect();
    for (body, says) in [
        (json!({}), "field grants is required"),
        (json!({"grants": []}), "between 1 and 64"),
        (json!({"grants": many}), "grants 65 is out of range"),
        (json!({"grants": [7]}), "grants[0] must be a string"),
        (json!({"grants": ["bucket:apps:delete"]}), "unknown operation \"delete\""),
        (json!({"grants": ["*:*:read"], "expires_in_seconds": 0}), "expires_in_seconds is 0"),
        (
            json!({"grants": ["*:*:read"], "expires_in_seconds": 315_360_001}),
            "it must be 1 to 315360000",
        ),
        (json!({"grants": ["*:*:read"], "description": "d".repeat(257)}), "over the limit of 256"),
        (json!({"grants": ["*:*:read"], "ttl": 5}), "unknown field \"ttl\""),
        (json!({"grants": ["*:*:read"], "description": "a\u{1b}[2J"}), "control character U+001B"),
        (json!({"grants": ["stream:apps/a\nb:read"]}), "control character U+000A"),
    ] {
        let refused = expect(&nova, Some(ROOT), "POST", "/v1/tokens", Some(&body), 400);
        assert_eq!(refused["code"], "invalid_argument");
        let message = refused["message"].as_str().unwrap_or("");
        assert!(message.contains(says), "{body}: {message}");
    }
    expect(&nova, Some(ROOT), "PUT", "/v1/tokens", None, 405);
}

#[test]
fn without_a_root_token_auth_is_off_and_the_token_verbs_say_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = Nova::start(dir.path());
    expect(&nova, None, "GET", "/v1/buckets", None, 200);
    let refused =
        expect(&nova, None, "POST", "/v1/tokens", Some(&json!({"grants": ["*:*:read"]})), 412);
    assert!(refused["message"].as_str().is_some_and(|m| m.contains("--root-token-file")));
}

#[test]
fn serve_refuses_a_root_token_it_cannot_use_and_auth_serves_any_address() {
    let dir = tempfile::tempdir().expect("temp dir");
    let short = dir.path().join("short");
    std::fs::write(&short, "short\n").expect("write");
    let missing = dir.path().join("missing");
    let long = dir.path().join("long");
    std::fs::write(&long, "k".repeat(4097)).expect("write");
    let root = root_file(dir.path());
    for (flags, says) in [
        (vec!["--root-token-file", short.to_str().unwrap_or("")], "the root token is 5 bytes"),
        (vec!["--root-token-file", long.to_str().unwrap_or("")], "it must be 16 to 4096"),
        (vec!["--root-token-file", missing.to_str().unwrap_or("")], "cannot be read"),
        (vec!["--root-token-file", &root, "--insecure-no-auth"], "give one"),
    ] {
        let stderr = serve_refused(dir.path(), &flags, &[]);
        assert!(stderr.contains(says) && stderr.contains("--"), "{flags:?}: {stderr}");
    }
    // With auth on, a non-loopback address needs no --insecure-no-auth.
    let log = dir.path().join("log");
    let nova = Nova::start_logging(
        &dir.path().join("data"),
        &["--listen", "0.0.0.0:0", "--root-token-file", &root],
        &log,
    );
    expect(&nova, Some(ROOT), "GET", "/v1/buckets", None, 200);
    // Stopped, so every line it logged is written.
    assert!(nova.terminate().success());
    let text = std::fs::read_to_string(&log).expect("read the log");
    assert!(text.contains("authentication on") && !text.contains("WARNING"), "{text}");
    // A file others may read is used, and warned of.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let nova = Nova::start_logging(&dir.path().join("data"), &["--root-token-file", &root], &log);
    expect(&nova, Some(ROOT), "GET", "/v1/buckets", None, 200);
    assert!(nova.terminate().success());
    let text = std::fs::read_to_string(&log).expect("read the log");
    assert!(text.contains("WARNING: --root-token-file") && text.contains("mode 644"), "{text}");
}

#[test]
fn the_cli_carries_its_token_from_the_flag_or_the_environment() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = start(dir.path());
    let nova_cli = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_nova"))
            .args(["--server", &nova.url])
            .args(args)
            .env_remove("NOVA_TOKEN")
            .envs(env.iter().copied())
            .output()
            .expect("run nova");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, stderr) = nova_cli(&["ls"], &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("unauthenticated"), "{stderr}");

    let root_file = root_file(dir.path());
    let (code, out, stderr) = nova_cli(
        &[
            "--auth-token-file",
            &root_file,
            "token",
            "issue",
            "--grant",
            "bucket:apps:read,write",
            "--expires-in",
            "1h",
            "--description",
            "cli",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(out.lines().count(), 1, "the token alone on stdout: {out}");
    let token = out.trim_end().to_owned();
    assert!(token.starts_with("nova_"), "{out}");
    assert!(stderr.contains("shown only now"), "{stderr}");
    // Saved as the CLI printed it, the token works from a file (its first line).
    let saved = dir.path().join("saved-token");
    std::fs::write(&saved, &out).expect("save the token");
    let saved = saved.to_str().expect("a UTF-8 path");
    let (code, _, stderr) =
        nova_cli(&["--auth-token-file", saved, "tail", "nova://apps/none"], &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("not_found"), "the token was taken: {stderr}");
    let empty = dir.path().join("empty-token");
    std::fs::write(&empty, "\n").expect("write");
    let (code, _, stderr) =
        nova_cli(&["--auth-token-file", empty.to_str().unwrap_or(""), "ls"], &[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("is empty"), "{stderr}");

    let (code, out, stderr) = nova_cli(&["token", "list"], &[("NOVA_TOKEN", ROOT)]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        out.contains("bucket:apps:read,write") && out.contains("cli") && !out.contains(&token),
        "{out}"
    );

    autocreating_bucket(&nova, "apps");
    let (code, _, stderr) = nova_cli(&["tail", "nova://apps/k"], &[("NOVA_TOKEN", &token)]);
    assert_eq!(code, Some(1), "the stream does not exist yet, and the token may read it: {stderr}");
    assert!(stderr.contains("not_found"), "{stderr}");
    let (code, _, stderr) = nova_cli(&["bucket", "delete", "apps"], &[("NOVA_TOKEN", &token)]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("permission_denied") && stderr.contains("no admin grant"), "{stderr}");

    // A whole token revokes as well as its ID; only the ID is sent.
    let id = token.split('_').nth(1).expect("the id");
    let (code, out, stderr) = nova_cli(&["token", "revoke", &token], &[("NOVA_TOKEN", ROOT)]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(out.contains(&format!("revoked token {id}")), "{out}");
    let (code, _, stderr) = nova_cli(&["tail", "nova://apps/k"], &[("NOVA_TOKEN", &token)]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("unauthenticated"), "{stderr}");
}

#[test]
fn the_client_appends_reads_and_subscribes_with_its_token() {
    use net::client::{Address, Batch, Client, Conditions, ReadOptions, SubscriptionEvent};
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = start(dir.path());
    autocreating_bucket(&nova, "apps");
    let (token, id) = issue(&nova, &["bucket:apps:read,write"]);
    let address = Address::new("apps", "orders");
    let anonymous = Client::new(&nova.url).expect("client");
    let refused = anonymous.check_tail(&address).expect_err("no token");
    assert_eq!(refused.code(), Some("unauthenticated"), "{refused}");
    let client = Client::new(&nova.url).expect("client").with_token(Some(token)).expect("a token");
    let injected =
        Client::new(&nova.url).expect("client").with_token(Some("a\r\nx-evil: 1".into()));
    assert!(injected.expect_err("a line break").to_string().contains("visible ASCII"));
    let mut batch = Batch::new();
    for body in ["one", "two"] {
        batch.push::<&str, &str>(&[], body.as_bytes()).expect("a record");
    }
    client.append(&address, &batch, &Conditions::default()).expect("append with the token");
    let mut session = client.append_session(&address, 4).expect("a session");
    session.submit(&batch, &Conditions::default()).expect("submit");
    let ack = session.recv().expect("an ack");
    assert!(ack.result.is_ok(), "{:?}", ack.result);
    let page = client.read(&address, &ReadOptions::default()).expect("read");
    assert_eq!(page.records.len(), 4);
    let mut subscriptions = Vec::new();
    for sse in [false, true] {
        let mut subscription =
            client.subscribe(&address, &ReadOptions::default(), sse).expect("subscribe");
        match subscription.next().expect("an event").expect("no error") {
            SubscriptionEvent::Records { records, .. } => assert_eq!(records[0].body, b"one"),
            other => panic!("records first, not {other:?}"),
        }
        subscriptions.push(subscription);
    }

    // Revoked, the token ends both live subscriptions: nothing appended since reaches them;
    // and its open append session takes no more batches.
    expect(&nova, Some(ROOT), "DELETE", &format!("/v1/tokens/{id}"), None, 204);
    session.submit(&batch, &Conditions::default()).expect("submit after the revocation");
    let refused = session.recv().expect("an answer").result.expect_err("refused");
    assert_eq!(refused.code(), Some("unauthenticated"), "{refused}");
    assert!(refused.to_string().contains("was revoked"), "{refused}");
    let after = json!({"records": [{"body": "after"}]});
    let ack =
        expect(&nova, Some(ROOT), "POST", "/v1/streams/apps/orders/records", Some(&after), 200);
    let revoked_at = ack["start"]["seq_num"].as_u64().expect("the append's seq_num");
    for mut subscription in subscriptions {
        // Records read before the revocation may still be on their way; none after it.
        let error = loop {
            match subscription.next().expect("an event before the end") {
                Ok(SubscriptionEvent::Heartbeat { .. }) => continue,
                Ok(SubscriptionEvent::Records { records, .. }) => assert!(
                    records.iter().all(|r| r.seq_num < revoked_at),
                    "a record appended after the revocation was delivered: {records:?}"
                ),
                Err(error) => break error,
            }
        };
        assert_eq!(error.code(), Some("unauthenticated"), "{error}");
        assert!(error.to_string().contains("was revoked"), "{error}");
    }
    let tail = expect(&nova, Some(ROOT), "GET", "/v1/streams/apps/orders/tail", None, 200);
    assert_eq!(tail["tail"]["seq_num"], revoked_at + 1, "the refused batch did not land");
}

#[test]
fn a_token_issues_only_what_it_holds() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = start(dir.path());
    let asked = json!({"grants": ["*:*:read,admin"], "expires_in_seconds": 3600});
    let delegate = expect(&nova, Some(ROOT), "POST", "/v1/tokens", Some(&asked), 201);
    let delegate = delegate["token"].as_str().expect("token").to_owned();
    for (body, says) in [
        (
            json!({"grants": ["*:*:write"], "expires_in_seconds": 60}),
            "cannot issue the grant *:*:write",
        ),
        (json!({"grants": ["bucket:apps:read"]}), "give expires_in_seconds"),
        (json!({"grants": ["bucket:apps:read"], "expires_in_seconds": 7200}), "expire by then"),
    ] {
        let refused = expect(&nova, Some(&delegate), "POST", "/v1/tokens", Some(&body), 403);
        assert!(refused["message"].as_str().is_some_and(|m| m.contains(says)), "{refused}");
    }
    let narrower = json!({"grants": ["bucket:apps:read"], "expires_in_seconds": 60});
    expect(&nova, Some(&delegate), "POST", "/v1/tokens", Some(&narrower), 201);
}

#[test]
fn tokens_past_the_limit_are_refused_once_the_expired_ones_are_purged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = Nova::start_with(
        &dir.path().join("data"),
        &["--root-token-file", &root_file(dir.path()), "--tokens-max", "2"],
        &[],
    );
    let brief = json!({"grants": ["*:*:read"], "expires_in_seconds": 1});
    let brief = expect(&nova, Some(ROOT), "POST", "/v1/tokens", Some(&brief), 201);
    let (kept, _) = issue(&nova, &["*:*:read"]);
    let full = expect(
        &nova,
        Some(ROOT),
        "POST",
        "/v1/tokens",
        Some(&json!({"grants": ["*:*:read"]})),
        412,
    );
    assert!(
        full["message"]
            .as_str()
            .is_some_and(|m| m.contains("at most 2 unexpired tokens (--tokens-max)")),
        "{full}"
    );

    let brief = brief["token"].as_str().expect("token").to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while call(&nova, Some(&brief), "GET", "/v1/buckets", None).0 != 401 {
        assert!(Instant::now() < deadline, "a 1 s token still works after 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (third, third_id) = issue(&nova, &["*:*:read"]);
    let listed = expect(&nova, Some(ROOT), "GET", "/v1/tokens", None, 200);
    assert_eq!(
        listed["tokens"].as_array().map(Vec::len),
        Some(2),
        "the expired one was purged: {listed}"
    );
    assert!(listed.to_string().contains(&third_id));
    for token in [&kept, &third] {
        expect(&nova, Some(token), "GET", "/v1/buckets", None, 200);
    }
    expect(&nova, Some(ROOT), "POST", "/v1/tokens", Some(&json!({"grants": ["*:*:read"]})), 412);
}

#[test]
fn auth_is_never_off_by_accident() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    for (flags, env) in
        [(&["--root-token-file", ""][..], &[][..]), (&[][..], &[("NOVA_ROOT_TOKEN_FILE", "")][..])]
    {
        let stderr = serve_refused(dir.path(), flags, env);
        assert!(stderr.contains("--root-token-file (NOVA_ROOT_TOKEN_FILE) is empty"), "{stderr}");
    }
    let lines = dir.path().join("two-lines");
    std::fs::write(&lines, "0123456789abcdef0123\nsecond\n").expect("write");
    let stderr =
        serve_refused(dir.path(), &["--root-token-file", lines.to_str().unwrap_or("")], &[]);
    assert!(stderr.contains("must hold one line"), "{stderr}");

    // A data directory that has tokens, started without a root token, says auth is off.
    let nova = Nova::start_with(&data, &["--root-token-file", &root_file(dir.path())], &[]);
    issue(&nova, &["*:*:read"]);
    assert!(nova.terminate().success());
    let log = dir.path().join("log");
    let nova = Nova::start_logging(&data, &[], &log);
    expect(&nova, None, "GET", "/v1/buckets", None, 200);
    assert!(nova.terminate().success());
    let log = std::fs::read_to_string(&log).expect("read the log");
    assert!(log.contains("WARNING: this data directory holds issued tokens"), "{log}");
}

#[test]
fn a_long_poll_answers_nothing_read_after_its_token_was_revoked() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = start(dir.path());
    autocreating_bucket(&nova, "apps");
    let (token, id) = issue(&nova, &["bucket:apps:read"]);
    let path = "/v1/streams/apps/polled/records";
    expect(&nova, Some(ROOT), "POST", path, Some(&json!({"records": [{"body": "0"}]})), 200);
    let server = nova.server.clone();
    let poll = std::thread::spawn(move || {
        let bearer = format!("Bearer {token}");
        let headers = [("authorization", bearer.as_str())];
        net::client::request(
            &server,
            "GET",
            "/v1/streams/apps/polled/records?seq_num=1&wait=30",
            &headers,
            None,
        )
        .expect("the long poll")
    });
    // The poll is waiting once the server counts it in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = nova
            .call_with("GET", "/metrics", &[("authorization", &format!("Bearer {ROOT}"))], None)
            .text();
        let in_flight: u64 = text
            .lines()
            .filter(|l| l.starts_with("nova_http_requests_in_flight{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if in_flight >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the long poll never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    expect(&nova, Some(ROOT), "DELETE", &format!("/v1/tokens/{id}"), None, 204);
    expect(&nova, Some(ROOT), "POST", path, Some(&json!({"records": [{"body": "after"}]})), 200);
    let answer = poll.join().expect("the poll thread");
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert!(answer.text().contains("was revoked"), "{}", answer.text());
}

/// A whole token sent where its ID goes (`DELETE /v1/tokens/{token}`) is a secret: it is
/// neither logged nor echoed in an error, and the token stays live, as the 404 says.
#[test]
fn a_token_in_place_of_its_id_is_never_logged_nor_echoed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("log");
    let nova = Nova::start_logging(
        &dir.path().join("data"),
        &["--root-token-file", &root_file(dir.path())],
        &log,
    );
    let (token, id) = issue(&nova, &["*:*:read"]);
    let secret = &token[token.len() - 64..];
    let encoded = token.replace('_', "%5F");
    let refused = [
        ("DELETE", format!("/v1/tokens/{token}"), 404),
        ("GET", format!("/v1/tokens/{token}"), 405),
        ("PUT", format!("/v1/tokens/{token}"), 405),
        ("GET", format!("/v1/tokens/{token}/more"), 404),
        // The router skips leading and doubled slashes, and decodes the segment.
        ("DELETE", format!("//v1/tokens/{token}"), 404),
        ("GET", format!("/v1//tokens/{token}"), 404),
        ("DELETE", format!("/v1/tokens/{encoded}"), 404),
        ("DELETE", format!("/v1/tokens/{token}?x=1"), 400),
        // The root token is not an issued one: left out in place of an ID all the same.
        ("DELETE", format!("/v1/tokens/{ROOT}"), 404),
    ];
    // Refusals whose message names what the request sent, in a path or a query.
    let echoed = [
        ("DELETE", format!("/v1/tokens/{token}%zz"), 400),
        ("GET", format!("/v1/streams/apps/{token}"), 404),
        ("GET", format!("/v1/buckets/{token}"), 400),
        ("GET", format!("/v1/buckets/apps?{token}=1"), 400),
        ("GET", format!("/v1/tokens?{encoded}"), 400),
    ];
    expect(&nova, Some(ROOT), "POST", "/v1/buckets/apps", None, 201);
    for (method, path, status) in refused.iter().chain(&echoed) {
        let answer = expect(&nova, Some(ROOT), method, path, None, *status);
        let text = answer.to_string();
        assert!(!text.contains(secret) && !text.contains(ROOT), "{method} {path}: {answer}");
        assert!(!text.contains(&secret[..8]), "no part of the secret: {method} {path}: {answer}");
    }
    expect(&nova, Some(&token), "GET", "/v1/buckets", None, 200);
    // A token ID is no secret: its path is logged as it is.
    expect(&nova, Some(ROOT), "GET", &format!("/v1/tokens/{id}"), None, 405);
    let mut text = String::new();
    common::wait_until("the log has the last refusal", || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains(&format!("path=\"/v1/tokens/{id}\""))
    });
    assert!(!text.contains(secret) && !text.contains(ROOT), "{text}");
    let left_out = text.lines().filter(|line| line.contains(net::auth::LEFT_OUT)).count();
    // Each path above but the query ones' is logged with its token left out.
    assert_eq!(left_out, refused.len() + echoed.len() - 2, "{text}");
}

#[test]
fn a_log_pipe_whose_reader_went_away_does_not_stop_the_server() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nova = Nova::start_with_stderr_closed(
        &dir.path().join("data"),
        &["--root-token-file", &root_file(dir.path())],
    );
    // Each of these is a log line, written into a closed pipe.
    for _ in 0..5 {
        expect(&nova, None, "GET", "/v1/buckets", None, 401);
    }
    expect(&nova, None, "GET", "/health", None, 200);
    expect(&nova, Some(ROOT), "GET", "/v1/buckets", None, 200);
}
