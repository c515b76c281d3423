//! The `nova` command line (operations.md): `nova serve`, and the client verbs over
//! HTTP (`ls`, `bucket ...`, `stream ...`, `append`, `read`, `tail`, `trim`, `fence`).
//! Addresses are `nova://bucket/key`; output is for people, or the server's JSON with
//! `--json`; a failure exits non-zero with the server's message.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

use crate::client::{self, Server, encode_segment};

/// The verbs, each with its usage and an example: `nova VERB --help` prints them.
const VERBS: &[(&str, &str, &str)] = &[
    (
        "serve",
        "nova serve [--listen 127.0.0.1:8080] [--data-dir ./nova-data] [--KNOB VALUE ...]",
        "nova serve --listen 127.0.0.1:8080",
    ),
    ("ls", "nova ls                      buckets, one name per line", "nova ls"),
    (
        "bucket create",
        "nova bucket create <name> [--create-on-append] [--create-on-read] [--default-class standard|express] [--location L] [--creation-token T]",
        "nova bucket create apps --create-on-append",
    ),
    ("bucket get", "nova bucket get <name>", "nova bucket get apps"),
    ("bucket list", "nova bucket list [--limit N] [--cursor NAME]", "nova bucket list --limit 50"),
    ("bucket delete", "nova bucket delete <name>", "nova bucket delete apps"),
    (
        "stream create",
        "nova stream create (--bucket B --key K | nova://B/K) [--class C] [--producer-policy any|fenced] [--timestamping-mode M] [--retention-max-age 168h] [--creation-token T]",
        "nova stream create --bucket logs --key api --retention-max-age 168h",
    ),
    ("stream get", "nova stream get nova://B/K", "nova stream get nova://logs/api"),
    ("stream delete", "nova stream delete nova://B/K", "nova stream delete nova://demo/events"),
    (
        "stream reconfigure",
        "nova stream reconfigure nova://B/K [--class C] [--producer-policy P] [--retention-max-age D] [--throughput-max-bytes-per-second N]",
        "nova stream reconfigure nova://logs/api --retention-max-age 24h",
    ),
    (
        "stream list",
        "nova stream list nova://B [--prefix P] [--limit N] [--cursor KEY]",
        "nova stream list nova://apps --prefix orders/",
    ),
    (
        "append",
        "nova append nova://B/K [--batch N] [--header k=v ...] [--match-seq-num N] [--fencing-token T]   (stdin lines become records)",
        "printf 'a\\nb\\n' | nova append nova://apps/orders",
    ),
    (
        "read",
        "nova read nova://B/K [--from-seq N | --from-time T | --tail-offset K] [--count N] [-f|--follow]",
        "nova read nova://apps/orders --from-seq 0 --count 10",
    ),
    ("tail", "nova tail nova://B/K           CheckTail", "nova tail nova://apps/orders"),
    ("trim", "nova trim nova://B/K --seq N | --time T", "nova trim nova://apps/orders --seq 100"),
    (
        "fence",
        "nova fence nova://B/K --token T [--expected OLD]",
        "nova fence nova://apps/orders --token writer-2 --expected writer-1",
    ),
];

fn usage() -> String {
    let mut text = String::from(
        "nova: a durable stream store\n\nusage: nova [--server URL] [--json] VERB ...\n\
         --server defaults to $NOVA_SERVER, else http://127.0.0.1:8080\n\n",
    );
    for (_, line, _) in VERBS {
        text.push_str(&format!("  {line}\n"));
    }
    text.push_str("\n`nova VERB --help` shows an example.\n");
    text
}

fn verb_help(verb: &str) -> Option<String> {
    VERBS
        .iter()
        .find(|(name, ..)| *name == verb)
        .map(|(_, line, example)| format!("usage: {line}\n\nexample:\n  {example}\n"))
}

/// A usage mistake (exit 2) or a failed call (exit 1).
enum Failure {
    Usage(String),
    Failed(String),
}

type Outcome = Result<(), Failure>;

fn usage_error(message: impl Into<String>) -> Failure {
    Failure::Usage(message.into())
}

/// Runs the command; the exit status.
pub fn main(args: Vec<String>) -> i32 {
    if args.first().map(String::as_str) == Some("serve") {
        if args.iter().any(|a| a == "--help" || a == "-h") {
            println!("{}", crate::serve::help());
            return 0;
        }
        return match crate::serve::run(&args[1..]) {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("nova serve: {error}");
                1
            }
        };
    }
    match run(args) {
        Ok(()) => 0,
        Err(Failure::Usage(message)) => {
            eprintln!("nova: {message}");
            2
        }
        Err(Failure::Failed(message)) => {
            eprintln!("nova: {message}");
            1
        }
    }
}

/// Parsed arguments: positionals, and `--flag [value]` pairs.
struct Args {
    positional: Vec<String>,
    flags: Vec<(String, Option<String>)>,
}

/// Flags that take no value.
const SWITCHES: &[&str] = &["json", "help", "create-on-append", "create-on-read", "follow"];

fn parse(args: Vec<String>) -> Result<Args, Failure> {
    let mut positional = Vec::new();
    let mut flags = Vec::new();
    let mut iter = args.into_iter();
    while let Some(arg) = iter.next() {
        let name = match arg.as_str() {
            "-f" => "follow".to_owned(),
            "-h" => "help".to_owned(),
            other => match other.strip_prefix("--") {
                Some(name) => name.to_owned(),
                None => {
                    positional.push(arg);
                    continue;
                }
            },
        };
        if let Some((name, value)) = name.split_once('=') {
            flags.push((name.to_owned(), Some(value.to_owned())));
        } else if SWITCHES.contains(&name.as_str()) {
            flags.push((name, None));
        } else {
            let value =
                iter.next().ok_or_else(|| usage_error(format!("--{name} needs a value")))?;
            flags.push((name, Some(value)));
        }
    }
    Ok(Args { positional, flags })
}

impl Args {
    fn has(&self, name: &str) -> bool {
        self.flags.iter().any(|(n, _)| n == name)
    }

    fn value(&self, name: &str) -> Option<&str> {
        self.flags.iter().rev().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    fn values(&self, name: &str) -> Vec<&str> {
        self.flags.iter().filter(|(n, _)| n == name).filter_map(|(_, v)| v.as_deref()).collect()
    }

    fn number(&self, name: &str) -> Result<Option<u64>, Failure> {
        self.value(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| usage_error(format!("--{name} must be a whole number, not {v:?}")))
            })
            .transpose()
    }

    /// Refuses flags the verb does not take.
    fn only(&self, accepted: &[&str]) -> Outcome {
        for (name, _) in &self.flags {
            if !accepted.contains(&name.as_str())
                && !["json", "help", "server"].contains(&name.as_str())
            {
                return Err(usage_error(format!("unknown flag --{name}; see --help")));
            }
        }
        Ok(())
    }
}

/// `nova://bucket/key` (key optional): the bucket and the key.
fn address(text: &str, need_key: bool) -> Result<(String, Option<String>), Failure> {
    let rest = text
        .strip_prefix("nova://")
        .ok_or_else(|| usage_error(format!("{text:?} is not an address like nova://bucket/key")))?;
    let (bucket, key) = match rest.split_once('/') {
        Some((bucket, key)) if !key.is_empty() => (bucket, Some(key.to_owned())),
        Some((bucket, _)) => (bucket, None),
        None => (rest, None),
    };
    if need_key && key.is_none() {
        return Err(usage_error(format!("{text:?} names no key: write nova://bucket/key")));
    }
    Ok((bucket.to_owned(), key))
}

fn stream_path(bucket: &str, key: &str) -> String {
    format!("/v1/streams/{}/{}", encode_segment(bucket), encode_segment(key))
}

/// `168h`, `10m`, `30s`, `250ms` or plain milliseconds.
pub fn duration_ms(text: &str) -> Result<u64, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 =
        digits.parse().map_err(|_| format!("{text:?} is not a duration like 168h, 10m, 30s"))?;
    let scale = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?} has an unknown unit (use ms, s, m, h or d)")),
    };
    number.checked_mul(scale).ok_or_else(|| format!("{text:?} is too long"))
}

struct Session {
    server: Server,
    json: bool,
}

impl Session {
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        let text = body.map(Value::to_string);
        let response =
            client::request(&self.server, method, path, &[], text.as_deref().map(str::as_bytes))
                .map_err(|e| {
                    Failure::Failed(format!(
                        "cannot reach the server at {}: {e}",
                        self.server.authority
                    ))
                })?;
        if !(200..300).contains(&response.status) {
            let error = response.json();
            return Err(Failure::Failed(
                match (error["code"].as_str(), error["message"].as_str()) {
                    (Some(code), Some(message)) => format!("{code}: {message}"),
                    _ => format!("HTTP {}: {}", response.status, response.text()),
                },
            ));
        }
        Ok(if response.body.is_empty() { Value::Null } else { response.json() })
    }

    /// Prints an answer: JSON as is with `--json`, else `people`.
    fn show(&self, value: &Value, people: impl FnOnce(&Value) -> String) {
        if self.json {
            println!("{value}");
        } else {
            let text = people(value);
            if !text.is_empty() {
                println!("{text}");
            }
        }
    }
}

/// An object as `name: value` lines.
fn fields(value: &Value) -> String {
    match value.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}: {s}"),
                other => format!("{k}: {other}"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        None => value.to_string(),
    }
}

fn tail_text(tail: &Value) -> String {
    format!("next_seq_num {} last_timestamp {}", tail["seq_num"], tail["timestamp"])
}

fn run(args: Vec<String>) -> Outcome {
    let args = parse(args)?;
    let verb: Vec<&str> = args.positional.iter().map(String::as_str).collect();
    let name = match verb.as_slice() {
        [] => {
            print!("{}", usage());
            return if args.has("help") { Ok(()) } else { Err(usage_error("no verb given")) };
        }
        ["bucket" | "stream", sub, ..] => format!("{} {sub}", verb[0]),
        [one, ..] => (*one).to_owned(),
    };
    if args.has("help") {
        match verb_help(&name) {
            Some(text) => {
                print!("{text}");
                return Ok(());
            }
            None => {
                print!("{}", usage());
                return Ok(());
            }
        }
    }
    let url = args
        .value("server")
        .map(str::to_owned)
        .or_else(|| std::env::var("NOVA_SERVER").ok())
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    let session =
        Session { server: Server::parse(&url).map_err(usage_error)?, json: args.has("json") };
    let rest: Vec<&str> = match verb.as_slice() {
        ["bucket" | "stream", _, rest @ ..] => rest.to_vec(),
        [_, rest @ ..] => rest.to_vec(),
        [] => Vec::new(),
    };
    let one = |what: &str| -> Result<&str, Failure> {
        match rest.as_slice() {
            [one] => Ok(one),
            _ => Err(usage_error(format!("{name} takes one {what}; see nova {name} --help"))),
        }
    };
    match name.as_str() {
        "ls" => {
            args.only(&[])?;
            let mut after = String::new();
            loop {
                let path = format!("/v1/buckets?start_after={}", encode_segment(&after));
                let path = if after.is_empty() { "/v1/buckets".to_owned() } else { path };
                let page = session.call("GET", &path, None)?;
                session.show(&page, |page| {
                    page["buckets"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|b| b["name"].as_str().unwrap_or("").to_owned())
                        .collect::<Vec<_>>()
                        .join("\n")
                });
                match page["next"].as_str() {
                    Some(next) if !next.is_empty() => after = next.to_owned(),
                    _ => return Ok(()),
                }
            }
        }
        "bucket create" => {
            args.only(&[
                "create-on-append",
                "create-on-read",
                "default-class",
                "location",
                "creation-token",
            ])?;
            let bucket = one("bucket name")?;
            let mut body = json!({});
            if args.has("create-on-append") {
                body["create_stream_on_append"] = json!(true);
            }
            if args.has("create-on-read") {
                body["create_stream_on_read"] = json!(true);
            }
            for (flag, field) in [
                ("default-class", "default_class"),
                ("location", "location"),
                ("creation-token", "creation_token"),
            ] {
                if let Some(value) = args.value(flag) {
                    body[field] = json!(value);
                }
            }
            let record = session.call(
                "POST",
                &format!("/v1/buckets/{}", encode_segment(bucket)),
                Some(&body),
            )?;
            session.show(&record, |r| {
                format!("created bucket {}", r["name"].as_str().unwrap_or(bucket))
            });
            Ok(())
        }
        "bucket get" => {
            args.only(&[])?;
            let record = session.call(
                "GET",
                &format!("/v1/buckets/{}", encode_segment(one("bucket name")?)),
                None,
            )?;
            session.show(&record, fields);
            Ok(())
        }
        "bucket list" => {
            args.only(&["limit", "cursor"])?;
            let mut query = Vec::new();
            if let Some(limit) = args.number("limit")? {
                query.push(format!("limit={limit}"));
            }
            if let Some(cursor) = args.value("cursor") {
                query.push(format!("start_after={}", encode_segment(cursor)));
            }
            let page = session.call("GET", &format!("/v1/buckets?{}", query.join("&")), None)?;
            session.show(&page, |page| {
                let mut lines: Vec<String> = page["buckets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|b| b["name"].as_str().unwrap_or("").to_owned())
                    .collect();
                if let Some(next) = page["next"].as_str().filter(|n| !n.is_empty()) {
                    lines.push(format!("(more: --cursor {next})"));
                }
                lines.join("\n")
            });
            Ok(())
        }
        "bucket delete" => {
            args.only(&[])?;
            let bucket = one("bucket name")?;
            session.call("DELETE", &format!("/v1/buckets/{}", encode_segment(bucket)), None)?;
            session.show(&Value::Null, |_| format!("deleted bucket {bucket}"));
            Ok(())
        }
        "stream create" => {
            args.only(&[
                "bucket",
                "key",
                "class",
                "producer-policy",
                "timestamping-mode",
                "retention-max-age",
                "creation-token",
            ])?;
            let (bucket, key) = match (args.value("bucket"), args.value("key"), rest.as_slice()) {
                (Some(bucket), Some(key), []) => (bucket.to_owned(), key.to_owned()),
                (None, None, [address_text]) => {
                    let (bucket, key) = address(address_text, true)?;
                    (bucket, key.unwrap_or_default())
                }
                _ => {
                    return Err(usage_error(
                        "stream create takes --bucket B --key K, or nova://B/K",
                    ));
                }
            };
            let mut body = options_body(&args)?;
            if let Some(token) = args.value("creation-token") {
                body["creation_token"] = json!(token);
            }
            let record = session.call("POST", &stream_path(&bucket, &key), Some(&body))?;
            session.show(&record, |r| {
                format!(
                    "created stream nova://{bucket}/{key} (id {})",
                    r["id"].as_str().unwrap_or("")
                )
            });
            Ok(())
        }
        "stream get" => {
            args.only(&[])?;
            let (bucket, key) = address(one("address")?, true)?;
            let record =
                session.call("GET", &stream_path(&bucket, &key.unwrap_or_default()), None)?;
            session.show(&record, fields);
            Ok(())
        }
        "stream delete" => {
            args.only(&[])?;
            let (bucket, key) = address(one("address")?, true)?;
            let key = key.unwrap_or_default();
            session.call("DELETE", &stream_path(&bucket, &key), None)?;
            session.show(&Value::Null, |_| format!("deleted stream nova://{bucket}/{key}"));
            Ok(())
        }
        "stream reconfigure" => {
            args.only(&[
                "class",
                "producer-policy",
                "retention-max-age",
                "throughput-max-bytes-per-second",
            ])?;
            let (bucket, key) = address(one("address")?, true)?;
            let mut body = options_body(&args)?;
            if let Some(n) = args.number("throughput-max-bytes-per-second")? {
                body["throughput_max_bytes_per_second"] = json!(n);
            }
            let record = session.call(
                "PATCH",
                &stream_path(&bucket, &key.unwrap_or_default()),
                Some(&body),
            )?;
            session.show(&record, fields);
            Ok(())
        }
        "stream list" => {
            args.only(&["prefix", "limit", "cursor"])?;
            let (bucket, _) = address(one("address")?, false)?;
            let mut query = Vec::new();
            if let Some(prefix) = args.value("prefix") {
                query.push(format!("prefix={}", encode_segment(prefix)));
            }
            if let Some(limit) = args.number("limit")? {
                query.push(format!("limit={limit}"));
            }
            if let Some(cursor) = args.value("cursor") {
                query.push(format!("start_after={}", encode_segment(cursor)));
            }
            let page = session.call(
                "GET",
                &format!("/v1/streams/{}?{}", encode_segment(&bucket), query.join("&")),
                None,
            )?;
            session.show(&page, |page| {
                let mut lines: Vec<String> = page["streams"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| s["key"].as_str().unwrap_or("").to_owned())
                    .collect();
                if let Some(next) = page["next"].as_str().filter(|n| !n.is_empty()) {
                    lines.push(format!("(more: --cursor {next})"));
                }
                lines.join("\n")
            });
            Ok(())
        }
        "append" => {
            args.only(&["batch", "header", "match-seq-num", "fencing-token"])?;
            let (bucket, key) = address(one("address")?, true)?;
            append(&session, &stream_path(&bucket, &key.unwrap_or_default()), &args)
        }
        "read" => {
            args.only(&["from-seq", "from-time", "tail-offset", "count", "follow"])?;
            let (bucket, key) = address(one("address")?, true)?;
            read(&session, &stream_path(&bucket, &key.unwrap_or_default()), &args)
        }
        "tail" => {
            args.only(&[])?;
            let (bucket, key) = address(one("address")?, true)?;
            let tail = session.call(
                "GET",
                &format!("{}/tail", stream_path(&bucket, &key.unwrap_or_default())),
                None,
            )?;
            session.show(&tail, |t| tail_text(&t["tail"]));
            Ok(())
        }
        "trim" => {
            args.only(&["seq", "time"])?;
            let (bucket, key) = address(one("address")?, true)?;
            let body = match (args.number("seq")?, args.number("time")?) {
                (Some(seq), None) => json!({"seq_num": seq}),
                (None, Some(time)) => json!({"timestamp": time}),
                _ => return Err(usage_error("trim takes one of --seq N or --time T")),
            };
            let trimmed = session.call(
                "POST",
                &format!("{}/trim", stream_path(&bucket, &key.unwrap_or_default())),
                Some(&body),
            )?;
            session.show(&trimmed, |t| format!("trim_seq_num {}", t["trim_seq_num"]));
            Ok(())
        }
        "fence" => {
            args.only(&["token", "expected"])?;
            let (bucket, key) = address(one("address")?, true)?;
            let token = args.value("token").ok_or_else(|| usage_error("fence needs --token T"))?;
            let mut body = json!({"fencing_token": token});
            if let Some(expected) = args.value("expected") {
                body["expected"] = json!(expected);
            }
            let fenced = session.call(
                "POST",
                &format!("{}/fence", stream_path(&bucket, &key.unwrap_or_default())),
                Some(&body),
            )?;
            session.show(&fenced, |t| format!("fenced; {}", tail_text(&t["tail"])));
            Ok(())
        }
        other => Err(usage_error(format!("unknown verb {other:?}\n\n{}", usage()))),
    }
}

/// The stream option flags as JSON fields.
fn options_body(args: &Args) -> Result<Value, Failure> {
    let mut body = json!({});
    for (flag, field) in [
        ("class", "class"),
        ("producer-policy", "producer_policy"),
        ("timestamping-mode", "timestamping_mode"),
    ] {
        if let Some(value) = args.value(flag) {
            body[field] = json!(value);
        }
    }
    if let Some(age) = args.value("retention-max-age") {
        body["retention_max_age_ms"] = json!(duration_ms(age).map_err(usage_error)?);
    }
    Ok(body)
}

fn append(session: &Session, path: &str, args: &Args) -> Outcome {
    let batch = usize::try_from(args.number("batch")?.unwrap_or(1000).max(1)).unwrap_or(1000);
    let mut headers = Vec::new();
    for header in args.values("header") {
        let (name, value) = header
            .split_once('=')
            .ok_or_else(|| usage_error(format!("--header {header:?} must be name=value")))?;
        headers.push(json!([name, value]));
    }
    let mut match_seq_num = args.number("match-seq-num")?;
    let token = args.value("fencing-token");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut appended = 0u64;
    let mut last = Value::Null;
    loop {
        let mut records = Vec::with_capacity(batch);
        for line in lines.by_ref() {
            let line = line.map_err(|e| Failure::Failed(format!("reading stdin: {e}")))?;
            records.push(json!({"body": line, "headers": headers}));
            if records.len() == batch {
                break;
            }
        }
        if records.is_empty() {
            break;
        }
        let count = records.len() as u64;
        let mut body = json!({"records": records});
        if let Some(n) = match_seq_num {
            body["match_seq_num"] = json!(n);
        }
        if let Some(token) = token {
            body["fencing_token"] = json!(token);
        }
        last = session.call("POST", &format!("{path}/records"), Some(&body))?;
        appended += count;
        // A conditional append continues where the last batch ended.
        match_seq_num = match_seq_num.and(last["end"]["seq_num"].as_u64());
        if session.json {
            println!("{last}");
        } else if atty_stderr() {
            eprint!("\rappended {appended} records");
        }
    }
    if !session.json {
        if atty_stderr() {
            eprintln!();
        }
        println!("appended {appended} records; {}", tail_text(&last["tail"]));
    }
    Ok(())
}

/// Whether stderr is a terminal (progress goes there only then).
fn atty_stderr() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal()
}

fn read(session: &Session, path: &str, args: &Args) -> Outcome {
    let mut query = Vec::new();
    for (flag, param) in
        [("from-seq", "seq_num"), ("tail-offset", "tail_offset"), ("count", "count")]
    {
        if let Some(n) = args.number(flag)? {
            query.push(format!("{param}={n}"));
        }
    }
    if let Some(time) = args.value("from-time") {
        let ms: u64 = time
            .parse()
            .map_err(|_| usage_error(format!("--from-time must be milliseconds, not {time:?}")))?;
        query.push(format!("timestamp={ms}"));
    }
    let print = |records: &Value| {
        let mut out = std::io::stdout().lock();
        for record in records.as_array().into_iter().flatten() {
            let _ = if session.json {
                writeln!(out, "{record}")
            } else {
                writeln!(out, "{}", record["body"].as_str().unwrap_or(""))
            };
        }
        let _ = out.flush();
    };
    if args.has("follow") {
        let target = format!("{path}/records?{}", query.join("&"));
        let mut stream = client::open(
            &session.server,
            "GET",
            &target,
            &[("accept", "text/event-stream")],
            None,
            None,
        )
        .map_err(|e| {
            Failure::Failed(format!("cannot reach the server at {}: {e}", session.server.authority))
        })?;
        if stream.status != 200 {
            let response = stream.finish().map_err(|e| Failure::Failed(e.to_string()))?;
            let error = response.json();
            return Err(Failure::Failed(format!(
                "{}: {}",
                error["code"].as_str().unwrap_or("error"),
                error["message"].as_str().unwrap_or("")
            )));
        }
        while let Some(event) =
            client::next_event(&mut stream.body).map_err(|e| Failure::Failed(e.to_string()))?
        {
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            match event.event.as_str() {
                "batch" => print(&data["records"]),
                "end" => return Ok(()),
                "error" => {
                    return Err(Failure::Failed(format!(
                        "{}: {}",
                        data["code"].as_str().unwrap_or("error"),
                        data["message"].as_str().unwrap_or("")
                    )));
                }
                _ => {}
            }
        }
        return Ok(());
    }
    let count = args.number("count")?;
    let mut delivered = 0u64;
    loop {
        let page = session.call("GET", &format!("{path}/records?{}", query.join("&")), None)?;
        print(&page["records"]);
        delivered += page["records"].as_array().map_or(0, |r| r.len() as u64);
        let next = page["next_seq_num"].as_u64().unwrap_or(0);
        let at_tail = Some(next) == page["tail"]["seq_num"].as_u64();
        if at_tail
            || count.is_some_and(|c| delivered >= c)
            || page["records"].as_array().is_none_or(Vec::is_empty)
        {
            return Ok(());
        }
        query.retain(|q| {
            !q.starts_with("seq_num=")
                && !q.starts_with("timestamp=")
                && !q.starts_with("tail_offset=")
                && !q.starts_with("count=")
        });
        query.push(format!("seq_num={next}"));
        if let Some(c) = count {
            query.push(format!("count={}", c - delivered));
        }
    }
}
