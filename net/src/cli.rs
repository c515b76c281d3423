//! The `nova` command line (operations.md): `nova serve`, and the client verbs over
//! HTTP (`ls`, `bucket ...`, `stream ...`, `append`, `read`, `tail`, `trim`, `fence`).
//! Addresses are `nova://bucket/key`; output is for people, or the server's JSON with
//! `--json`; a failure exits non-zero with the server's message.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::{
    self, Address, Batch, Bucket, Client, Conditions, ReadOptions, Record, Start, Subscription,
    SubscriptionEvent, encode_segment,
};

/// The verbs, each with its usage and an example: `nova VERB --help` prints them. The
/// client verbs' examples (not `token`'s, which need a server with auth on and a token's
/// id) are shell lines that, run one after another against a new server, all succeed
/// (tests/cli.rs runs them, in an order it names).
const VERBS: &[(&str, &str, &str)] = &[
    (
        "serve",
        "nova serve [--listen 127.0.0.1:8080] [--data-dir ./nova-data] [--KNOB VALUE ...]",
        "nova serve --listen 127.0.0.1:8080",
    ),
    (
        "doctor",
        "nova doctor [--data-dir ./nova-data] [--json] [--s3-bucket B ...]   inspect this host",
        "nova doctor --data-dir /var/lib/nova",
    ),
    ("ls", "nova ls                      buckets, one name per line", "nova ls"),
    (
        "bucket create",
        "nova bucket create <name> [--create-on-append] [--create-on-read] [--location L] [--creation-token T] [--default-OPTION V ...]",
        "nova bucket create apps --create-on-append --default-class express --default-retention-max-age 7d",
    ),
    ("bucket get", "nova bucket get <name>", "nova bucket get apps"),
    ("bucket list", "nova bucket list [--limit N] [--cursor NAME]", "nova bucket list --limit 50"),
    ("bucket delete", "nova bucket delete <name>", "nova bucket delete apps"),
    (
        "stream create",
        "nova stream create (--bucket B --key K | nova://B/K) [--creation-token T] [--OPTION V ...]",
        "nova stream create --bucket apps --key orders --retention-max-age 168h --batch-max-bytes 1MiB",
    ),
    ("stream get", "nova stream get nova://B/K", "nova stream get nova://apps/orders"),
    ("stream delete", "nova stream delete nova://B/K", "nova stream delete nova://apps/orders"),
    (
        "stream reconfigure",
        "nova stream reconfigure nova://B/K [--OPTION V ...]",
        "nova stream reconfigure nova://apps/orders --retention-max-age 0 --throughput-max-bytes-per-second 4MiB",
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
    (
        "trim",
        "nova trim nova://B/K --seq N | --time T   (T: ms since the epoch, or RFC 3339)",
        "nova trim nova://apps/orders --time 2026-05-01T00:00:00Z",
    ),
    (
        "fence",
        "nova fence nova://B/K --token T [--expected OLD]",
        "nova fence nova://apps/orders --token writer-1   # a new writer: --token writer-2 --expected writer-1",
    ),
    (
        "token issue",
        "nova token issue --grant RESOURCE:OPS [--grant ...] [--expires-in 30d] [--description D]   (prints the token once)",
        "nova token issue --grant bucket:apps:read,write --grant stream:logs/api/:read --expires-in 30d",
    ),
    (
        "token list",
        "nova token list              issued tokens (never the tokens themselves)",
        "nova token list",
    ),
    ("token revoke", "nova token revoke <id>", "nova token revoke 5f1c0a9e3b7d2468"),
];

fn usage() -> String {
    let mut text = String::from(
        "nova: a durable stream store\n\nusage: nova [--server URL] [--auth-token-file F] [--timeout D] [--json] VERB ...\n\
         (nova --version prints its version)\n\
         --server defaults to $NOVA_SERVER when it is set and not empty, else http://127.0.0.1:8080\n\
         A server with auth on needs a token: the first line of --auth-token-file, else $NOVA_TOKEN\n\
         (docs/auth.md).\n\
         --timeout (default 30s; 0s for none) bounds each wait on the server: a call it\n\
         never answers fails after that long. `read -f` waits on heartbeats, which come at\n\
         least every 15 s, so it needs more than that.\n\
         In nova://B/K the key K is everything after the bucket, as written: `/` is part of it\n\
         and nothing is percent-decoded (nova://apps/orders/eu is the key orders/eu).\n\
         An address with no bucket (nova:///orders/eu, or --key without --bucket) is in the\n\
         bucket `default`, which append and stream create make first if it does not exist\n\
         (streams created on first append; an existing one is used as it is).\n\n",
    );
    for (_, line, _) in VERBS {
        text.push_str(&format!("  {line}\n"));
    }
    text.push_str("\n`nova VERB --help` shows an example, and the stream OPTIONs.\n");
    text
}

fn verb_help(verb: &str) -> Option<String> {
    let (_, line, example) = VERBS.iter().find(|(name, ..)| *name == verb)?;
    let options = if line.contains("OPTION") { stream_options_help() } else { String::new() };
    Some(format!("usage: {line}\n{options}\nexample:\n  {example}\n"))
}

/// `nova bucket --help` (a group of verbs): each of its verbs with an example.
fn group_help(group: &str) -> Option<String> {
    let prefix = format!("{group} ");
    let verbs: Vec<_> = VERBS.iter().filter(|(name, ..)| name.starts_with(&prefix)).collect();
    if verbs.is_empty() {
        return None;
    }
    let mut text = String::new();
    for (_, line, example) in verbs {
        text.push_str(&format!("usage: {line}\n  example: {example}\n"));
    }
    text.push_str(&format!("\n`nova {group} VERB --help` shows more of one.\n"));
    Some(text)
}

/// How a stream option's flag is written.
#[derive(Clone, Copy)]
enum OptionValue {
    /// A word, sent as is: the server names the words it takes.
    Word,
    /// A switch: alone (or `=true`) it is true.
    Switch,
    /// A duration with its unit, or a bare 0.
    Duration,
    /// Bytes: a whole number, or one with `KiB`, `MiB` or `GiB`.
    Bytes,
    /// A whole number.
    Count,
}

/// The stream options of http-api.md: the flag (the JSON field in kebab case, less a
/// `_ms` the duration's unit replaces), the field, how the value is written, and an
/// example value for `--help`. A bucket's defaults are the same with `default-`
/// (`default_`) in front.
const STREAM_OPTIONS: &[(&str, &str, OptionValue, &str)] = &[
    ("class", "class", OptionValue::Word, "standard|express"),
    ("producer-policy", "producer_policy", OptionValue::Word, "any|fenced"),
    (
        "timestamping-mode",
        "timestamping_mode",
        OptionValue::Word,
        "client-prefer|client-require|arrival",
    ),
    (
        "timestamping-uncapped",
        "timestamping_uncapped",
        OptionValue::Switch,
        "(alone, =true or =false)",
    ),
    ("retention-max-age", "retention_max_age_ms", OptionValue::Duration, "168h"),
    ("retention-max-bytes", "retention_max_bytes", OptionValue::Bytes, "10GiB"),
    ("batch-max-bytes", "batch_max_bytes", OptionValue::Bytes, "8MiB"),
    ("batch-max-records", "batch_max_records", OptionValue::Count, "1000"),
    ("batch-max-delay", "batch_max_delay_ms", OptionValue::Duration, "250ms"),
    (
        "throughput-max-bytes-per-second",
        "throughput_max_bytes_per_second",
        OptionValue::Bytes,
        "4MiB",
    ),
];

fn stream_options_help() -> String {
    let mut text =
        String::from("\nstream OPTIONs (a bucket takes them as its defaults: --default-OPTION):\n");
    for (flag, _, _, example) in STREAM_OPTIONS {
        text.push_str(&format!("  --{flag} {example}\n"));
    }
    text.push_str(
        "durations take ms, s, m, h or d; sizes are bytes, or take KiB, MiB or GiB.\n\
         0 (no unit needed) leaves an option to the bucket's default on create; on reconfigure\n\
         it sets retention, throughput and batch-max-records back to unbounded.\n\
         timestamping-mode and timestamping-uncapped are fixed when the stream is created.\n",
    );
    text
}

/// A failed call: the server's `code: message`, or why it could not be reached.
fn failed(error: client::Error) -> Failure {
    let code = error_code(&error).to_owned();
    Failure::Call { message: error.to_string(), code, error: Box::new(error) }
}

/// The code `--json` gives a failed call: the server's, or one of the CLI's own.
fn error_code(error: &client::Error) -> &str {
    match error {
        client::Error::Api(api) => &api.code,
        client::Error::Io { .. } => "connection_failed",
        client::Error::Protocol(_) => "protocol_error",
        client::Error::Invalid(_) => "invalid_argument",
        client::Error::Ambiguous(_) => "outcome_unknown",
    }
}

/// A usage mistake (exit 2), or a failure (exit 1): of a call, told with its code and
/// error, or of anything else.
enum Failure {
    Usage(String),
    Call { message: String, code: String, error: Box<client::Error> },
    Failed(String),
}

impl Failure {
    fn message(&self) -> &str {
        match self {
            Failure::Usage(message) | Failure::Failed(message) => message,
            Failure::Call { message, .. } => message,
        }
    }

    /// What `--json` writes to stderr for it, one line: `code` (the server's, or one of
    /// the CLI's own: `usage`, `connection_failed`, `protocol_error`, `invalid_argument`,
    /// `outcome_unknown`, `not_sent`, `failed`), `message` (the line written without
    /// `--json`), and when the server answered, its `status` and whole error body as
    /// `error`.
    fn to_json(&self) -> Value {
        let code = match self {
            Failure::Usage(_) => "usage",
            Failure::Failed(_) => "failed",
            Failure::Call { code, .. } => code,
        };
        let mut out = json!({"code": code, "message": self.message()});
        if let Failure::Call { error, .. } = self
            && let client::Error::Api(api) = &**error
        {
            out["status"] = json!(api.status);
            out["error"] = api.body.clone();
        }
        out
    }
}

/// Whether failures are told as JSON (`--json`): set once the arguments are read, for
/// what is told before the command's end ([`print_line`]).
static JSON_ERRORS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Tells a failure on stderr: `nova: message`, or under `--json` one JSON object.
fn tell(failure: &Failure) {
    if JSON_ERRORS.load(std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{}", failure.to_json());
    } else {
        eprintln!("nova: {}", failure.message());
    }
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
        let code = match crate::serve::run(&args[1..]) {
            Ok(()) => 0,
            Err(crate::serve::Failure::Usage(error)) => {
                crate::log_line!("nova serve: {error}");
                2
            }
            Err(crate::serve::Failure::Failed(error)) => {
                crate::log_line!("nova serve: {error}");
                1
            }
        };
        // Every line logged is written before the exit, but a log nobody reads does not
        // hold the exit for long.
        crate::log::flush(Duration::from_secs(1));
        return code;
    }
    if args.first().map(String::as_str) == Some("doctor") {
        return crate::doctor::main(&args[1..]);
    }
    // Arguments that cannot be read are told as JSON too when `--json` is among them.
    let json = args.iter().any(|a| a == "--json" || a == "--json=true");
    let args = parse(args);
    let json = args.as_ref().map_or(json, |args| args.has("json"));
    JSON_ERRORS.store(json, std::sync::atomic::Ordering::Relaxed);
    match args.and_then(run) {
        Ok(()) if OUTPUT_FAILED.load(std::sync::atomic::Ordering::Relaxed) => 1,
        Ok(()) => 0,
        Err(failure) => {
            tell(&failure);
            if matches!(failure, Failure::Usage(_)) { 2 } else { 1 }
        }
    }
}

/// Parsed arguments: positionals, and `--flag [value]` pairs.
struct Args {
    positional: Vec<String>,
    flags: Vec<(String, Option<String>)>,
}

/// Flags every verb takes.
const GLOBAL_FLAGS: &[&str] = &["json", "help", "version", "server", "auth-token-file", "timeout"];

/// How long a call waits on the server's every read and write unless `--timeout` says.
const DEFAULT_TIMEOUT: &str = "30s";

/// Flags that take no value: alone they are on, and `--NAME=true` or `--NAME=false` says
/// which.
const SWITCHES: &[&str] = &[
    "json",
    "help",
    "version",
    "create-on-append",
    "create-on-read",
    "follow",
    "timestamping-uncapped",
    "default-timestamping-uncapped",
];

fn parse(args: Vec<String>) -> Result<Args, Failure> {
    let mut positional = Vec::new();
    let mut flags = Vec::new();
    let mut iter = args.into_iter().peekable();
    while let Some(arg) = iter.next() {
        let name = match arg.as_str() {
            "-f" => "follow".to_owned(),
            "-h" => "help".to_owned(),
            other => match other.strip_prefix("--") {
                Some(name) => name.to_owned(),
                // `-x`: no flag of nova's is written so (a negative number is a value).
                None if other.len() > 1
                    && other.starts_with('-')
                    && !other[1..].starts_with(|c: char| c.is_ascii_digit()) =>
                {
                    return Err(usage_error(format!(
                        "unknown flag {other}; flags are written --NAME (-f and -h aside)"
                    )));
                }
                None => {
                    positional.push(arg);
                    continue;
                }
            },
        };
        if let Some((name, value)) = name.split_once('=') {
            if SWITCHES.contains(&name) && !matches!(value, "true" | "false") {
                return Err(usage_error(format!(
                    "--{name} is a switch: give it alone, or as --{name}=true or --{name}=false"
                )));
            }
            flags.push((name.to_owned(), Some(value.to_owned())));
        } else if SWITCHES.contains(&name.as_str()) {
            // `--switch true` (or false) as well as `--switch=true`.
            let value = iter.next_if(|next| matches!(next.as_str(), "true" | "false"));
            flags.push((name, value));
        } else {
            let value =
                iter.next().ok_or_else(|| usage_error(format!("--{name} needs a value")))?;
            // `--token --json` forgot the token: never take a flag for a value.
            if value.starts_with("--") {
                return Err(usage_error(format!(
                    "--{name} needs a value, not the flag {value} (a value starting with -- \
                     is written --{name}={value})"
                )));
            }
            flags.push((name, Some(value)));
        }
    }
    Ok(Args { positional, flags })
}

impl Args {
    /// Whether a switch is on.
    fn has(&self, name: &str) -> bool {
        self.switch(name).unwrap_or(false)
    }

    /// A switch as given: alone or `=true` it is on, `=false` off; the last one counts.
    fn switch(&self, name: &str) -> Option<bool> {
        self.flags.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_deref() != Some("false"))
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
                v.parse::<u64>().map_err(|_| {
                    usage_error(if !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) {
                        format!("--{name} {v} is too large: at most {}", u64::MAX)
                    } else {
                        format!("--{name} must be a whole number, not {v:?}")
                    })
                })
            })
            .transpose()
    }

    /// A bound's duration (`168h`); a bare 0 needs no unit, as it is the same in every
    /// unit and says "unbounded" (decisions.md).
    fn bound_ms(&self, name: &str) -> Result<Option<u64>, Failure> {
        self.value(name)
            .map(|v| if v == "0" { Ok(0) } else { duration_ms(name, v).map_err(usage_error) })
            .transpose()
    }

    fn bytes(&self, name: &str) -> Result<Option<u64>, Failure> {
        self.value(name).map(|v| size_bytes(name, v).map_err(usage_error)).transpose()
    }

    /// Refuses flags the verb does not take.
    fn only(&self, accepted: &[&str]) -> Outcome {
        self.only_with_options(accepted, None)
    }

    /// Refuses flags the verb does not take: `accepted`, and the stream options with
    /// `options` in front (`""`, or `"default-"` for a bucket's defaults) when given.
    fn only_with_options(&self, accepted: &[&str], options: Option<&str>) -> Outcome {
        let option = |name: &str| {
            options
                .and_then(|prefix| name.strip_prefix(prefix))
                .is_some_and(|flag| STREAM_OPTIONS.iter().any(|(option, ..)| *option == flag))
        };
        for (name, _) in &self.flags {
            if !accepted.contains(&name.as_str())
                && !option(name)
                && !GLOBAL_FLAGS.contains(&name.as_str())
            {
                return Err(usage_error(format!("unknown flag --{name}; see --help")));
            }
        }
        Ok(())
    }
}

/// The bucket of a stream named by its key alone (seeds/buckets.md: "nova uses default
/// when you give none").
const DEFAULT_BUCKET: &str = "default";

/// The stream `text` names: `nova://bucket/key`, or, with no bucket, `nova:///key` in
/// [`DEFAULT_BUCKET`], which a verb that `writes` first makes sure of
/// ([`implied_bucket`]); one that only reads or removes leaves it as it is. A key
/// without `nova://` is refused, never taken for one in `default`: `apps/orders` meant
/// for the stream `orders` of `apps` would name another stream.
fn stream_address(session: &Session, text: &str, writes: bool) -> Result<Address, Failure> {
    let (bucket, key) = address(text, true)?;
    let bucket = if !bucket.is_empty() {
        bucket
    } else if writes {
        implied_bucket(session)?
    } else {
        DEFAULT_BUCKET.to_owned()
    };
    Ok(Address::new(bucket, key.unwrap_or_default()))
}

/// [`DEFAULT_BUCKET`], created like any other bucket if it does not exist yet, with
/// streams created on first append (what an address with no bucket is for: `echo hi |
/// nova append nova:///orders` on a fresh server); an existing one is used as it is.
fn implied_bucket(session: &Session) -> Result<String, Failure> {
    let mut wanted = Bucket::new(DEFAULT_BUCKET);
    wanted.create_on_append = true;
    match session.client.ensure_bucket(&wanted) {
        // A token that may use the bucket but not create (or see) it: the verb answers.
        Err(error) if error.code() == Some("permission_denied") => {}
        other => drop(other.map_err(failed)?),
    }
    Ok(DEFAULT_BUCKET.to_owned())
}

/// `nova://bucket/key` (key optional): the bucket and the key.
fn address(text: &str, need_key: bool) -> Result<(String, Option<String>), Failure> {
    let rest = text.strip_prefix("nova://").ok_or_else(|| {
        usage_error(format!(
            "{text:?} is not an address like nova://bucket/key (or nova:///key, in the \
                 bucket default)"
        ))
    })?;
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

/// `--{flag}`'s duration, `7d`, `168h`, `10m`, `30s` or `250ms`, in milliseconds. A bare
/// number is refused: `loadgen` read one as seconds where `nova` read milliseconds, so
/// now neither guesses.
pub fn duration_ms(flag: &str, text: &str) -> Result<u64, String> {
    let (number, unit) = number_and_unit(text)
        .ok_or_else(|| format!("--{flag} {text:?} is not a duration like 168h, 10m or 30s"))?;
    let scale = match unit {
        "" => return Err(format!("--{flag} {text:?} needs a unit: ms, s, m, h or d")),
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("--{flag} {text:?} has an unknown unit (use ms, s, m, h or d)")),
    };
    number.checked_mul(scale).ok_or_else(|| format!("--{flag} {text:?} is too long"))
}

/// `--{flag}`'s size in bytes: a whole number, or one with `KiB`, `MiB` or `GiB`, as
/// `nova serve`'s byte flags take.
fn size_bytes(flag: &str, text: &str) -> Result<u64, String> {
    let (number, unit) = number_and_unit(text)
        .ok_or_else(|| format!("--{flag} {text:?} is not a size like 4096, 64KiB or 1MiB"))?;
    let scale = match unit {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(format!("--{flag} {text:?} has an unknown unit (use KiB, MiB or GiB)")),
    };
    number.checked_mul(scale).ok_or_else(|| format!("--{flag} {text:?} is too large"))
}

/// The whole number `text` starts with, and the unit after it: `250ms` is 250 and `ms`.
fn number_and_unit(text: &str) -> Option<(u64, &str)> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    Some((digits.parse().ok()?, unit))
}

struct Session {
    client: Client,
    json: bool,
    /// `--timeout`: also how long `read --follow` keeps trying to resume (None: for good).
    timeout: Option<Duration>,
}

impl Session {
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
        self.client.call_json(method, path, body).map_err(failed)
    }

    /// A create (POST): the record, and whether this call made it (201) rather than
    /// converged on what the same creation token made before (200, decisions.md).
    fn create(&self, path: &str, body: &Value) -> Result<(Value, bool), Failure> {
        let (record, status) =
            self.client.call_json_status("POST", path, Some(body)).map_err(failed)?;
        Ok((record, status == 201))
    }

    /// Prints an answer: JSON as is with `--json`, else `people`.
    fn show(&self, value: &Value, people: impl FnOnce(&Value) -> String) {
        if self.json {
            print_line(value);
        } else {
            let text = people(value);
            if !text.is_empty() {
                print_line(text);
            }
        }
    }

    /// Says on stderr, for people, that a list page has more after it (`--json` has
    /// `next`): stdout stays one name a line for whatever reads it.
    fn more(&self, page: &Value) {
        if let Some(next) = page["next"].as_str().filter(|n| !n.is_empty())
            && !self.json
        {
            eprintln!("(more: --cursor {next})");
        }
    }
}

/// The `field` of each item of a list page's `items`, a line each.
fn names(page: &Value, items: &str, field: &str) -> String {
    let names: Vec<&str> = page[items]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| item[field].as_str().unwrap_or(""))
        .collect();
    names.join("\n")
}

/// Set when an answer could not be written to stdout: the command then exits 1.
static OUTPUT_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Prints a line of an answer on stdout. A reader that closed it (`nova ... | head`)
/// took what it wanted: the command goes on (an append appends the rest of its input)
/// and the line is dropped, where `println!` would end it in a panic. Any other failure
/// to write (a full disk) is told on stderr, once, and fails the command at its end.
fn print_line(line: impl std::fmt::Display) {
    if let Err(error) = writeln!(std::io::stdout().lock(), "{line}")
        && error.kind() != std::io::ErrorKind::BrokenPipe
        && !OUTPUT_FAILED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        tell(&Failure::Failed(format!("writing to stdout failed: {error}")));
    }
}

/// Every item of a listing (`field` of each page), page after page: one list, so that
/// `--json` prints one document however many pages there are.
fn every_page(session: &Session, path: &str, field: &str) -> Result<Vec<Value>, Failure> {
    let mut items = Vec::new();
    let mut after = String::new();
    loop {
        let page_path = if after.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?start_after={}", encode_segment(&after))
        };
        let mut page = session.call("GET", &page_path, None)?;
        if let Some(Value::Array(more)) = page.get_mut(field).map(Value::take) {
            items.extend(more);
        }
        match page["next"].as_str() {
            Some(next) if !next.is_empty() => after = next.to_owned(),
            _ => return Ok(items),
        }
    }
}

/// One page of ListTokens: a line per token, its ID, grants, expiry and description
/// (escaped: what a token's issuer wrote must not drive the terminal).
fn show_tokens(session: &Session, page: &Value) {
    session.show(page, |page| {
        page["tokens"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let grants: Vec<String> = t["grants"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|g| g.escape_debug().to_string())
                    .collect();
                let expires = t["expires_at_ms"]
                    .as_u64()
                    .map_or("never expires".to_owned(), |ms| format!("expires at {ms} ms"));
                let description = t["description"].as_str().unwrap_or("").escape_debug();
                let id = t["id"].as_str().unwrap_or("");
                format!("{id} {} ({expires}) {description}", grants.join(" ")).trim_end().to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
}

/// An object as `name: value` lines.
fn fields(value: &Value) -> String {
    match value.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => format!("{k}: {s}"),
                tail if k == "tail" => format!("tail: {}", tail_text(tail)),
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

fn run(args: Args) -> Outcome {
    let verb: Vec<&str> = args.positional.iter().map(String::as_str).collect();
    let name = match verb.as_slice() {
        [] => {
            // `nova --bogus ls` took `ls` for the value of `--bogus`.
            if let Some((flag, value)) =
                args.flags.iter().find(|(name, _)| !GLOBAL_FLAGS.contains(&name.as_str()))
            {
                let took = value.as_ref().map(|v| format!(" (it took {v:?} as its value)"));
                return Err(usage_error(format!(
                    "unknown flag --{flag}{}; nova's own flags are --{}",
                    took.unwrap_or_default(),
                    GLOBAL_FLAGS.join(", --")
                )));
            }
            if args.has("version") {
                let version = env!("CARGO_PKG_VERSION");
                if args.has("json") {
                    print_line(json!({"version": version}));
                } else {
                    print_line(format_args!("nova {version}"));
                }
                return Ok(());
            }
            if args.has("help") || !args.has("json") {
                print!("{}", usage());
            }
            return if args.has("help") { Ok(()) } else { Err(usage_error("no verb given")) };
        }
        // `serve` and `doctor` take their own flags, after them.
        ["serve" | "doctor", ..] => {
            return Err(usage_error(format!(
                "{} takes no flags before it: write nova {} [its flags]",
                verb[0], verb[0]
            )));
        }
        ["bucket" | "stream" | "token", sub, ..] => format!("{} {sub}", verb[0]),
        [one, ..] => (*one).to_owned(),
    };
    if args.has("version") {
        return Err(usage_error(format!(
            "--version is nova's own and takes no verb, not {name:?}: write nova --version"
        )));
    }
    if args.has("help") {
        match verb_help(&name).or_else(|| group_help(&name)) {
            Some(text) => {
                print!("{text}");
                return Ok(());
            }
            None => {
                print!("{}", usage());
                return Err(usage_error(format!("no verb {name:?}; the verbs are above")));
            }
        }
    }
    // An empty NOVA_SERVER is unset, as a shell's `NOVA_SERVER= nova ...` means.
    let url = args
        .value("server")
        .map(str::to_owned)
        .or_else(|| std::env::var("NOVA_SERVER").ok().filter(|url| !url.is_empty()))
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    // The token from a file (never a flag value, which `ps` and shell history show), or
    // else the environment.
    let token = match args.value("auth-token-file") {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                usage_error(format!("--auth-token-file {path:?} cannot be read: {e}"))
            })?;
            let first = text.lines().next().unwrap_or("").trim_end_matches('\r');
            if first.is_empty() {
                return Err(usage_error(format!(
                    "--auth-token-file {path:?} is empty: its first line is the token"
                )));
            }
            Some(first.to_owned())
        }
        None => std::env::var("NOVA_TOKEN").ok(),
    };
    let timeout = duration_ms("timeout", args.value("timeout").unwrap_or(DEFAULT_TIMEOUT))
        .map_err(usage_error)?;
    let client = Client::new(&url)
        .and_then(|client| client.with_token(token))
        .map_err(|e| usage_error(e.to_string()))?
        .with_timeout(Some(Duration::from_millis(timeout)))
        // A call the server never answers fails after --timeout, not after three of them.
        .with_timeouts_repeated(false);
    let timeout = (timeout > 0).then(|| Duration::from_millis(timeout));
    let session = Session { client, json: args.has("json"), timeout };
    let rest: Vec<&str> = match verb.as_slice() {
        ["bucket" | "stream" | "token", _, rest @ ..] => rest.to_vec(),
        [_, rest @ ..] => rest.to_vec(),
        [] => Vec::new(),
    };
    let one = |what: &str| -> Result<&str, Failure> {
        match rest.as_slice() {
            [one] => Ok(one),
            _ => Err(usage_error(format!("{name} takes one {what}; see nova {name} --help"))),
        }
    };
    let none = || -> Result<(), Failure> {
        match rest.as_slice() {
            [] => Ok(()),
            [first, ..] => Err(usage_error(format!(
                "{name} takes no argument, not {first:?}; see nova {name} --help"
            ))),
        }
    };
    match name.as_str() {
        "ls" => {
            args.only(&[])?;
            none()?;
            let buckets = every_page(&session, "/v1/buckets", "buckets")?;
            session.show(&json!({"buckets": buckets, "next": ""}), |all| {
                names(all, "buckets", "name")
            });
            Ok(())
        }
        "bucket create" => {
            args.only_with_options(
                &["create-on-append", "create-on-read", "location", "creation-token"],
                Some("default-"),
            )?;
            let bucket = one("bucket name")?;
            let mut body = options_body(&args, "default-")?;
            if args.has("create-on-append") {
                body["create_stream_on_append"] = json!(true);
            }
            if args.has("create-on-read") {
                body["create_stream_on_read"] = json!(true);
            }
            for (flag, field) in [("location", "location"), ("creation-token", "creation_token")] {
                if let Some(value) = args.value(flag) {
                    body[field] = json!(value);
                }
            }
            let (record, created) =
                session.create(&format!("/v1/buckets/{}", encode_segment(bucket)), &body)?;
            session.show(&record, |r| {
                let name = r["name"].as_str().unwrap_or(bucket);
                if created {
                    format!("created bucket {name}")
                } else {
                    format!("bucket {name} already exists with this configuration")
                }
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
            none()?;
            let mut query = Vec::new();
            if let Some(limit) = args.number("limit")? {
                query.push(format!("limit={limit}"));
            }
            if let Some(cursor) = args.value("cursor") {
                query.push(format!("start_after={}", encode_segment(cursor)));
            }
            let page = session.call("GET", &format!("/v1/buckets?{}", query.join("&")), None)?;
            session.show(&page, |page| names(page, "buckets", "name"));
            session.more(&page);
            Ok(())
        }
        "token issue" => {
            args.only(&["grant", "expires-in", "description"])?;
            if !rest.is_empty() {
                return Err(usage_error("token issue takes no address; grants go in --grant"));
            }
            let grants = args.values("grant");
            if grants.is_empty() {
                return Err(usage_error(
                    "token issue needs at least one --grant RESOURCE:OPS, e.g. --grant bucket:apps:read",
                ));
            }
            let mut body = json!({"grants": grants});
            if let Some(text) = args.value("expires-in") {
                let ms = duration_ms("expires-in", text).map_err(usage_error)?;
                if ms % 1000 != 0 || ms == 0 {
                    return Err(usage_error(format!(
                        "--expires-in {text:?} must be a whole number of seconds, at least 1s"
                    )));
                }
                body["expires_in_seconds"] = json!(ms / 1000);
            }
            if let Some(description) = args.value("description") {
                body["description"] = json!(description);
            }
            let issued = session.call("POST", "/v1/tokens", Some(&body))?;
            // The token alone on stdout, so `nova token issue ... > file` and
            // `TOKEN=$(nova token issue ...)` keep exactly it.
            session.show(&issued, |t| t["token"].as_str().unwrap_or("").to_owned());
            if !session.json {
                eprintln!(
                    "nova: token {} issued; it is shown only now (the server keeps only its hash)",
                    issued["id"].as_str().unwrap_or("")
                );
            }
            Ok(())
        }
        "token list" => {
            args.only(&[])?;
            if !rest.is_empty() {
                return Err(usage_error("token list takes no arguments"));
            }
            let tokens = every_page(&session, "/v1/tokens", "tokens")?;
            show_tokens(&session, &json!({"tokens": tokens, "next": ""}));
            Ok(())
        }
        "token revoke" => {
            args.only(&[])?;
            // The ID, or a whole token, whose ID is its second part: only the ID is sent.
            let given = one("token ID")?;
            let id = given
                .strip_prefix("nova_")
                .and_then(|rest| rest.split_once('_'))
                .map_or(given, |(id, _)| id);
            session.call("DELETE", &format!("/v1/tokens/{}", encode_segment(id)), None)?;
            session.show(&json!({"revoked": "token", "id": id}), |_| format!("revoked token {id}"));
            Ok(())
        }
        "bucket delete" => {
            args.only(&[])?;
            let bucket = one("bucket name")?;
            session.call("DELETE", &format!("/v1/buckets/{}", encode_segment(bucket)), None)?;
            let deleted = json!({"deleted": "bucket", "name": bucket});
            session.show(&deleted, |_| format!("deleted bucket {bucket}"));
            Ok(())
        }
        "stream create" => {
            args.only_with_options(&["bucket", "key", "creation-token"], Some(""))?;
            let (bucket, key) = match (args.value("bucket"), args.value("key"), rest.as_slice()) {
                (Some(bucket), Some(key), []) => (bucket.to_owned(), key.to_owned()),
                (None, Some(key), []) => (implied_bucket(&session)?, key.to_owned()),
                (None, None, [address_text]) => {
                    let address = stream_address(&session, address_text, true)?;
                    (address.bucket, address.key)
                }
                _ => {
                    return Err(usage_error(
                        "stream create takes [--bucket B] --key K, or nova://B/K",
                    ));
                }
            };
            let mut body = options_body(&args, "")?;
            if let Some(token) = args.value("creation-token") {
                body["creation_token"] = json!(token);
            }
            let (record, created) = session.create(&stream_path(&bucket, &key), &body)?;
            session.show(&record, |r| {
                let id = r["id"].as_str().unwrap_or("");
                if created {
                    format!("created stream nova://{bucket}/{key} (id {id})")
                } else {
                    format!(
                        "stream nova://{bucket}/{key} already exists with this configuration (id {id})"
                    )
                }
            });
            Ok(())
        }
        "stream get" => {
            args.only(&[])?;
            let Address { bucket, key } = stream_address(&session, one("address")?, false)?;
            let record = session.call("GET", &stream_path(&bucket, &key), None)?;
            session.show(&record, fields);
            Ok(())
        }
        "stream delete" => {
            args.only(&[])?;
            let Address { bucket, key } = stream_address(&session, one("address")?, false)?;
            session.call("DELETE", &stream_path(&bucket, &key), None)?;
            let deleted = json!({"deleted": "stream", "bucket": bucket, "key": key});
            session.show(&deleted, |_| format!("deleted stream nova://{bucket}/{key}"));
            Ok(())
        }
        "stream reconfigure" => {
            args.only_with_options(&[], Some(""))?;
            let Address { bucket, key } = stream_address(&session, one("address")?, false)?;
            let body = options_body(&args, "")?;
            let record = session.call("PATCH", &stream_path(&bucket, &key), Some(&body))?;
            session.show(&record, fields);
            Ok(())
        }
        "stream list" => {
            args.only(&["prefix", "limit", "cursor"])?;
            let text = one("address")?;
            let (bucket, key) = address(text, false)?;
            let bucket = if bucket.is_empty() { DEFAULT_BUCKET.to_owned() } else { bucket };
            if key.is_some() {
                return Err(usage_error(format!(
                    "stream list takes a bucket like nova://{bucket}, not the stream {text:?}; \
                     --prefix K lists the keys that start with K"
                )));
            }
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
            session.show(&page, |page| names(page, "streams", "key"));
            session.more(&page);
            Ok(())
        }
        "append" => {
            args.only(&["batch", "header", "match-seq-num", "fencing-token"])?;
            append(&session, &stream_address(&session, one("address")?, true)?, &args)
        }
        "read" => {
            args.only(&["from-seq", "from-time", "tail-offset", "count", "follow"])?;
            read(&session, &stream_address(&session, one("address")?, false)?, &args)
        }
        "tail" => {
            args.only(&[])?;
            let Address { bucket, key } = stream_address(&session, one("address")?, false)?;
            let tail =
                session.call("GET", &format!("{}/tail", stream_path(&bucket, &key)), None)?;
            session.show(&tail, |t| tail_text(&t["tail"]));
            Ok(())
        }
        "trim" => {
            args.only(&["seq", "time"])?;
            let time = args.value("time").map(|t| time_ms("time", t)).transpose();
            let body = match (args.number("seq")?, time.map_err(usage_error)?) {
                (Some(seq), None) => json!({"seq_num": seq}),
                (None, Some(time)) => json!({"timestamp": time}),
                _ => return Err(usage_error("trim takes one of --seq N or --time T")),
            };
            let Address { bucket, key } = stream_address(&session, one("address")?, false)?;
            let trimmed = session.call(
                "POST",
                &format!("{}/trim", stream_path(&bucket, &key)),
                Some(&body),
            )?;
            session.show(&trimmed, |t| format!("trim_seq_num {}", t["trim_seq_num"]));
            Ok(())
        }
        "fence" => {
            args.only(&["token", "expected"])?;
            let token = args.value("token").ok_or_else(|| usage_error("fence needs --token T"))?;
            let Address { bucket, key } = stream_address(&session, one("address")?, false)?;
            let mut body = json!({"fencing_token": token});
            if let Some(expected) = args.value("expected") {
                body["expected"] = json!(expected);
            }
            let fenced = session.call(
                "POST",
                &format!("{}/fence", stream_path(&bucket, &key)),
                Some(&body),
            )?;
            session.show(&fenced, |t| format!("fenced; {}", tail_text(&t["tail"])));
            Ok(())
        }
        other => Err(usage_error(format!("unknown verb {other:?}\n\n{}", usage()))),
    }
}

/// The stream option flags given, as JSON fields; `prefix` is `default-` for a bucket's
/// defaults (`default_` fields).
fn options_body(args: &Args, prefix: &str) -> Result<Value, Failure> {
    let mut body = json!({});
    for (flag, field, written, _) in STREAM_OPTIONS {
        let flag = format!("{prefix}{flag}");
        let value = match written {
            OptionValue::Word => args.value(&flag).map(Value::from),
            OptionValue::Switch => args.switch(&flag).map(Value::from),
            OptionValue::Duration => args.bound_ms(&flag)?.map(Value::from),
            OptionValue::Bytes => args.bytes(&flag)?.map(Value::from),
            OptionValue::Count => args.number(&flag)?.map(Value::from),
        };
        if let Some(value) = value {
            body[format!("{}{field}", prefix.replace('-', "_"))] = value;
        }
    }
    Ok(body)
}

/// Batches in flight on the append session of `nova append`.
const APPEND_IN_FLIGHT_MAX: usize = 64;
/// Records in a batch unless `--batch` says otherwise.
const APPEND_BATCH_DEFAULT: u64 = 1000;
/// The largest `--batch` (limits.md: a batch holds at most this many records).
const APPEND_BATCH_MAX: u64 = engine::limits::BATCH_RECORDS_MAX as u64;
/// How long `nova append` fills a batch before sending it, full or not: lines from a
/// producer that writes now and then (`tail -f app.log | nova append ...`) go out
/// within this, not when a batch fills.
const APPEND_LINGER: Duration = Duration::from_millis(100);
/// Input lines read ahead of the batch being filled.
const APPEND_LINES_AHEAD: usize = 64;

/// One input line of `nova append` (without its end of line), or the read's failure.
type InputLine = std::io::Result<Vec<u8>>;

/// The longest input line `append` reads: the largest record any server takes
/// (`--record-bytes-max` at its most) and its end of line. A longer line could never be
/// appended, and is not held whole to find that out.
const APPEND_LINE_BYTES_MAX: u64 = tuning::RECORD_BYTES_MAX.max + 2;

/// Reads stdin on a thread of its own, so that `append` can send a partial batch when
/// the input pauses. The channel ends at the end of the input; the thread ends there,
/// at a line longer than [`APPEND_LINE_BYTES_MAX`] (an error), or at exit when the
/// process stops reading earlier.
fn stdin_lines() -> std::sync::mpsc::Receiver<InputLine> {
    let (tx, rx) = std::sync::mpsc::sync_channel(APPEND_LINES_AHEAD);
    std::thread::spawn(move || {
        let mut input = std::io::stdin().lock();
        for number in 1u64.. {
            let mut line = Vec::new();
            let read = match std::io::Read::take(&mut input, APPEND_LINE_BYTES_MAX)
                .read_until(b'\n', &mut line)
            {
                Ok(0) => return,
                Ok(n) if n as u64 == APPEND_LINE_BYTES_MAX && !line.ends_with(b"\n") => {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "line {number} is longer than any record a server takes (over {} \
                             bytes, --record-bytes-max at its largest)",
                            tuning::RECORD_BYTES_MAX.max
                        ),
                    ))
                }
                Ok(_) => Ok(line),
                Err(error) => Err(error),
            };
            let failed = read.is_err();
            if tx.send(read).is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// `nova append`: stdin lines become records, `--batch` per batch (cut sooner to stay
/// within the 100 MiB batch limit, or [`APPEND_LINGER`] after the batch's first line),
/// pipelined on one append session; a progress line on stderr when it is a terminal.
/// Batches the stream's throughput cap refuses go again after its Retry-After, in order
/// ([`Answers::throttled`]). Any other failed batch ends it: nothing more is sent, and
/// the failure names the lines appended before it, whether it was refused (nothing of
/// it landed) or its outcome is unknown (the connection failed: it may have landed),
/// and what became of each batch pipelined behind it, so a resend takes what did not.
fn append(session: &Session, address: &Address, args: &Args) -> Outcome {
    let batch_records = args.number("batch")?.unwrap_or(APPEND_BATCH_DEFAULT);
    if !(1..=APPEND_BATCH_MAX).contains(&batch_records) {
        return Err(usage_error(format!(
            "--batch must be 1 to {APPEND_BATCH_MAX} records, not {batch_records}"
        )));
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    for header in args.values("header") {
        match header.split_once('=') {
            Some((name, value)) if !name.is_empty() => {
                headers.push((name.to_owned(), value.to_owned()));
            }
            _ => {
                return Err(usage_error(format!(
                    "--header {header:?} must be name=value with a non-empty name"
                )));
            }
        }
    }
    // What a record adds to a batch besides its body: its headers, and the stored
    // form's flag byte and header table (4 bytes a header, and some slack).
    let header_bytes: usize =
        headers.iter().map(|(name, value)| name.len() + value.len() + 4).sum::<usize>() + 16;
    let mut match_seq_num = args.number("match-seq-num")?;
    let fencing_token = args.value("fencing-token").map(str::to_owned);
    let mut appender =
        session.client.append_session(address, APPEND_IN_FLIGHT_MAX).map_err(failed)?;
    let mut progress = Progress::start();
    let input = stdin_lines();
    let mut batch = Batch::new();
    let mut lines_read = 0u64;
    // The batches in flight, in order, kept to be sent again if the stream's throughput
    // cap refuses them (at most APPEND_IN_FLIGHT_MAX).
    let mut sent: VecDeque<InFlight> = VecDeque::new();
    let mut answers = Answers::default();
    let take = |ack: client::SessionAck,
                sent: &mut VecDeque<InFlight>,
                progress: &mut Progress,
                answers: &mut Answers| {
        let batch = sent.pop_front().expect("a batch per answer");
        if let Some(ack) = answers.take(ack.result, batch) {
            progress.acked(answers.appended);
            if session.json {
                print_line(
                    json!({"start": position(ack.start), "end": position(ack.end), "tail": position(ack.tail)}),
                );
            }
        }
    };
    // Sends the batch (its lines end at `last_line`); when it could not be sent, its lines
    // and why (nothing of it went out).
    let mut send = |appender: &mut client::AppendSession,
                    batch: &mut Batch,
                    sent: &mut VecDeque<InFlight>,
                    last_line: u64| {
        let lines = batch.len() as u64;
        let conditions = Conditions { match_seq_num, fencing_token: fencing_token.clone() };
        if let Err(error) = appender.submit(batch, &conditions) {
            return Err(Box::new((InFlight::lines(last_line + 1 - lines, lines), not_sent(error))));
        }
        // A copy to send again if the throughput cap refuses it, within a bound.
        let kept: usize =
            sent.iter().filter_map(|b| b.batch.as_ref()).map(Batch::stored_bytes).sum();
        let copy = (kept + batch.stored_bytes() <= APPEND_KEPT_BYTES_MAX).then(|| batch.clone());
        sent.push_back(InFlight {
            first_line: last_line + 1 - lines,
            lines,
            batch: copy,
            conditions,
        });
        // A conditional append continues where the previous batch ends (one past the
        // last seq_num there is cannot match: the server refuses it).
        match_seq_num = match_seq_num.map(|n| n.saturating_add(lines));
        batch.clear();
        Ok(())
    };
    // A batch that could not be sent, and an input that could not be read on: told
    // after everything sent before them is answered.
    let mut unsent: Option<Box<(InFlight, client::Error)>> = None;
    let mut input_failed: Option<String> = None;
    // When the batch being filled took its first line.
    let mut filling_since: Option<Instant> = None;
    // The input ended or failed: nothing more of it is read (a resend may loop again).
    let mut input_done = false;
    loop {
        let wait =
            filling_since.map_or(APPEND_LINGER, |t| APPEND_LINGER.saturating_sub(t.elapsed()));
        let received =
            if input_done { Err(RecvTimeoutError::Disconnected) } else { input.recv_timeout(wait) };
        let (line, mut ended) = match received {
            Ok(Ok(line)) => (Some(line), false),
            // A line too long to be a record says so itself.
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::InvalidData => {
                input_failed = Some(error.to_string());
                (None, true)
            }
            Ok(Err(error)) => {
                input_failed =
                    Some(format!("reading stdin after line {lines_read} failed: {error}"));
                (None, true)
            }
            Err(RecvTimeoutError::Timeout) => (None, false),
            Err(RecvTimeoutError::Disconnected) => (None, true),
        };
        let paused = line.is_none();
        if let Some(line) = line {
            progress.read(line.len() as u64);
            let body = line.strip_suffix(b"\n").unwrap_or(&line);
            let body = body.strip_suffix(b"\r").unwrap_or(body);
            // Cut before the batch would pass the batch limit of 100 MiB (counted in
            // stored bytes, a little more than content), whatever --batch says.
            let room = engine::limits::BATCH_BYTES_MAX as usize;
            if !batch.is_empty()
                && batch.stored_bytes() + body.len() + header_bytes > room
                && let Err(failed) = send(&mut appender, &mut batch, &mut sent, lines_read)
            {
                unsent = Some(failed);
            }
            if unsent.is_none() {
                match batch.push(&headers, body) {
                    Ok(()) => {
                        lines_read += 1;
                        let since = *filling_since.get_or_insert_with(Instant::now);
                        let full = batch.len() as u64 == batch_records;
                        if (full || since.elapsed() >= APPEND_LINGER)
                            && let Err(failed) =
                                send(&mut appender, &mut batch, &mut sent, lines_read)
                        {
                            unsent = Some(failed);
                        }
                    }
                    Err(error) => {
                        input_failed = Some(format!("line {}: {error}", lines_read + 1));
                        ended = true;
                    }
                }
            }
        }
        // The input paused or ended: what it gave so far goes out now.
        if (paused || ended)
            && unsent.is_none()
            && !batch.is_empty()
            && let Err(failed) = send(&mut appender, &mut batch, &mut sent, lines_read)
        {
            unsent = Some(failed);
        }
        if batch.is_empty() {
            filling_since = None;
        }
        input_done |= ended;
        while let Some(ack) = appender.try_recv() {
            take(ack, &mut sent, &mut progress, &mut answers);
        }
        if unsent.is_none() && (ended || !answers.throttled.is_empty()) {
            // Every answer, before the end is told, and before throttled batches go again
            // (a resend goes behind every batch sent).
            while answers.refused.is_none() {
                let Some(ack) = appender.recv() else { break };
                take(ack, &mut sent, &mut progress, &mut answers);
            }
        }
        if !answers.throttled.is_empty() && unsent.is_none() && answers.refused.is_none() {
            // Refused by the stream's throughput cap, and nothing behind them landed:
            // they go again, in order, after the server's Retry-After.
            if answers.throttled_round() {
                std::thread::sleep(answers.retry_after());
                let mut again = std::mem::take(&mut answers.throttled).into_iter();
                for (batch, _) in again.by_ref() {
                    let copy = batch.batch.as_ref().expect("only kept batches are throttled");
                    if let Err(error) = appender.submit(copy, &batch.conditions) {
                        unsent = Some(Box::new((batch, not_sent(error))));
                        break;
                    }
                    sent.push_back(batch);
                }
                for (batch, _) in again {
                    let last_line = batch.first_line + batch.lines - 1;
                    answers.after.push(format!(
                        "lines {}-{last_line} were not sent again",
                        batch.first_line
                    ));
                }
                if unsent.is_none() {
                    continue;
                }
            }
        }
        // Nothing more is sent after a failure (what is in flight is still answered).
        if ended || unsent.is_some() || answers.refused.is_some() {
            break;
        }
    }
    for ack in appender.finish() {
        take(ack, &mut sent, &mut progress, &mut answers);
    }
    if let Some(unsent) = unsent {
        let (batch, error) = *unsent;
        answers.take(Err(error), batch);
    }
    progress.done();
    answers.outcome(session.json, input_failed)
}

/// A batch the session could not send: nothing of it went out, so it was not appended.
fn not_sent(error: client::Error) -> client::Error {
    client::Error::Invalid(format!("not sent: {error}"))
}

/// Rounds of `nova append`'s batches refused by the stream's throughput cap, one after
/// another with nothing landing, before it gives up.
const APPEND_THROTTLED_ROUNDS_MAX: u32 = 10;
/// The longest a throttled append waits before sending again, whatever Retry-After says.
const APPEND_RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// Bytes of the batches in flight `append` keeps copies of, to send them again if the
/// throughput cap refuses them; a batch past it is not kept, and its refusal is final.
const APPEND_KEPT_BYTES_MAX: usize = 64 << 20;

/// A batch `append` sent: its input lines, and (within [`APPEND_KEPT_BYTES_MAX`]) what
/// it sent, to send it again.
struct InFlight {
    first_line: u64,
    lines: u64,
    batch: Option<Batch>,
    conditions: Conditions,
}

impl InFlight {
    /// Input lines alone, for a batch that will not be sent (again).
    fn lines(first_line: u64, lines: u64) -> Self {
        InFlight { first_line, lines, batch: None, conditions: Conditions::default() }
    }
}

/// What the server answered an `append`'s batches, in order.
#[derive(Default)]
struct Answers {
    /// Batches the stream's throughput cap refused (resource_exhausted: nothing landed),
    /// with nothing answered otherwise behind them: to be sent again, in order.
    throttled: Vec<(InFlight, client::Error)>,
    /// Records appended before any refusal.
    appended: u64,
    last: Option<client::Ack>,
    /// The first batch that failed: its first input line, its lines, and the error,
    /// with whether it may have landed anyway.
    refused: Option<(u64, u64, client::Error)>,
    /// What became of each batch sent after it.
    after: Vec<String>,
    /// The last input line of the batches answered.
    last_line: u64,
    /// Throttled rounds in a row with nothing landing between them, and what had landed
    /// at the last.
    throttled_rounds: u32,
    appended_at_throttle: u64,
}

impl Answers {
    /// Notes one batch's answer; its acknowledgement when it counts as appended.
    fn take(
        &mut self,
        result: client::Result<client::Ack>,
        batch: InFlight,
    ) -> Option<client::Ack> {
        let (first_line, lines) = (batch.first_line, batch.lines);
        let last_line = first_line + lines - 1;
        self.last_line = self.last_line.max(last_line);
        if self.refused.is_none() {
            // Refused, so nothing of it landed: sent again later if a copy was kept. Behind
            // a throttled batch, one whose match_seq_num counted on it is refused too,
            // for the seq_num the throttled batch did not take: it goes again as well.
            let throttled = |error: &client::Error| {
                error.code() == Some("resource_exhausted")
                    || (!self.throttled.is_empty()
                        && batch.conditions.match_seq_num.is_some()
                        && error.next_seq_num().is_some())
            };
            match result {
                Err(error) if batch.batch.is_some() && throttled(&error) => {
                    self.throttled.push((batch, error));
                    return None;
                }
                // Answered otherwise behind throttled batches: a resend would land after
                // this, out of order, so the throttling is this append's failure.
                _ if !self.throttled.is_empty() => self.stop_throttled(),
                _ => {}
            }
        }
        match (result, &self.refused) {
            (Ok(ack), None) => {
                self.appended += ack.end.seq_num - ack.start.seq_num;
                self.last = Some(ack);
                return Some(ack);
            }
            (Ok(ack), Some(_)) => self.after.push(format!(
                "lines {first_line}-{last_line} were appended after them, at seq_num {}..{}",
                ack.start.seq_num, ack.end.seq_num
            )),
            (Err(error), None) => self.refused = Some((first_line, lines, error)),
            (Err(error), Some(_)) => self.after.push(format!(
                "lines {first_line}-{last_line} {}: {error}",
                if error.outcome_unknown() { "may or may not have landed" } else { "failed too" }
            )),
        }
        None
    }

    /// The throttled batches are not sent again: the first is the failure, the rest
    /// failed after it.
    fn stop_throttled(&mut self) {
        let mut throttled = std::mem::take(&mut self.throttled).into_iter();
        if let Some((batch, error)) = throttled.next() {
            self.refused = Some((batch.first_line, batch.lines, error));
        }
        for (batch, error) in throttled {
            let last_line = batch.first_line + batch.lines - 1;
            self.after.push(format!("lines {}-{last_line} failed too: {error}", batch.first_line));
        }
    }

    /// Whether the throttled batches go again, for one more round: not once
    /// [`APPEND_THROTTLED_ROUNDS_MAX`] rounds in a row were throttled with nothing landing
    /// between them. Then they stop, the first of them this append's failure.
    fn throttled_round(&mut self) -> bool {
        let landed = self.appended > self.appended_at_throttle;
        self.throttled_rounds = if landed { 1 } else { self.throttled_rounds + 1 };
        self.appended_at_throttle = self.appended;
        if self.throttled_rounds > APPEND_THROTTLED_ROUNDS_MAX {
            self.stop_throttled();
            return false;
        }
        true
    }

    /// How long the server asked the throttled batches to wait (1 s if it did not say).
    fn retry_after(&self) -> Duration {
        let seconds = self
            .throttled
            .iter()
            .filter_map(|(_, error)| match error {
                client::Error::Api(api) => api.retry_after_seconds,
                _ => None,
            })
            .max()
            .unwrap_or(1);
        Duration::from_secs(seconds).min(APPEND_RETRY_AFTER_MAX)
    }

    /// The command's outcome: every failure with what was appended before it, and, after
    /// the first, what became of the rest.
    fn outcome(self, json: bool, input_failed: Option<String>) -> Outcome {
        if let Some((first_line, lines, error)) = self.refused {
            // Batches pipelined behind the refused one may have landed: say which, so
            // that a resend takes exactly what did not.
            let what = if error.outcome_unknown() {
                "may or may not have been appended (check the stream's tail before resending \
                 them)"
            } else {
                "were not appended"
            };
            // The server counts records from 0 within the batch; a record is a line.
            let record = match &error {
                client::Error::Api(api) => api.message.strip_prefix("record ").and_then(|rest| {
                    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()
                }),
                _ => None,
            };
            let line = record
                .filter(|&record| record < lines)
                .map(|record| format!(" (record {record} is line {})", first_line + record))
                .unwrap_or_default();
            let mut message = format!(
                "lines {first_line}-{} {what}: {error}{line}; {} before them {}",
                first_line + lines - 1,
                counted(self.appended, "record"),
                if self.appended == 1 { "was" } else { "were" }
            );
            for after in &self.after {
                message.push_str("; ");
                message.push_str(after);
            }
            message.push_str(&format!("; nothing after line {} was sent", self.last_line));
            if let Some(input_failed) = input_failed {
                message.push_str(&format!("; and {input_failed}"));
            }
            // What a script needs to know first: whether the batch may have landed.
            let code = if error.outcome_unknown() {
                "outcome_unknown"
            } else if let client::Error::Invalid(_) = error {
                "not_sent"
            } else {
                error_code(&error)
            };
            return Err(Failure::Call { message, code: code.to_owned(), error: Box::new(error) });
        }
        if let Some(input_failed) = input_failed {
            // Everything before the failure was appended; nothing after it was read.
            return Err(Failure::Failed(format!(
                "{input_failed}; {} before it {} appended{}",
                counted(self.appended, "record"),
                if self.appended == 1 { "was" } else { "were" },
                self.last
                    .map(|ack| format!(" ({})", tail_text(&position(ack.tail))))
                    .unwrap_or_default()
            )));
        }
        // The server refuses an empty batch; an empty input sent none, which is no success.
        let last = self.last.ok_or_else(|| {
            Failure::Failed("nothing to append: the input had no records".to_owned())
        })?;
        if !json {
            print_line(format_args!(
                "appended {}; {}",
                counted(self.appended, "record"),
                tail_text(&position(last.tail))
            ));
        }
        Ok(())
    }
}

/// `count` `noun`s, in the singular for 1.
fn counted(count: u64, noun: &str) -> String {
    if count == 1 { format!("1 {noun}") } else { format!("{count} {noun}s") }
}

fn position(position: client::Position) -> Value {
    json!({"seq_num": position.seq_num, "timestamp": position.timestamp})
}

/// The progress line of a long `nova append`, on stderr only when it is a terminal:
/// records acknowledged, bytes read (of the input's size when stdin is a file), rate.
struct Progress {
    shown: bool,
    started: Instant,
    last_drawn: Instant,
    read_bytes: u64,
    total_bytes: Option<u64>,
    acked: u64,
}

impl Progress {
    fn start() -> Self {
        use std::io::IsTerminal as _;
        let now = Instant::now();
        let total_bytes = std::fs::metadata("/dev/stdin")
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len());
        Self {
            shown: std::io::stderr().is_terminal(),
            started: now,
            last_drawn: now,
            read_bytes: 0,
            total_bytes,
            acked: 0,
        }
    }

    fn read(&mut self, bytes: u64) {
        self.read_bytes += bytes;
    }

    fn acked(&mut self, records: u64) {
        self.acked = records;
        if self.shown && self.last_drawn.elapsed() >= Duration::from_millis(100) {
            self.draw();
        }
    }

    fn draw(&mut self) {
        self.last_drawn = Instant::now();
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = self.acked as f64 / seconds;
        let bar = match self.total_bytes.filter(|t| *t > 0) {
            Some(total) => {
                let done = (self.read_bytes.min(total) * 30 / total) as usize;
                format!(
                    "[{}{}] {:>3}% ",
                    "#".repeat(done),
                    " ".repeat(30 - done),
                    self.read_bytes.min(total) * 100 / total
                )
            }
            None => String::new(),
        };
        eprint!(
            "\r{bar}{} appended, {:.1} MB read, {rate:.0} records/s ",
            counted(self.acked, "record"),
            self.read_bytes as f64 / 1e6
        );
    }

    fn done(&mut self) {
        if self.shown && self.acked > 0 {
            self.draw();
            eprintln!();
        }
    }
}

/// `--from-time`: milliseconds since the epoch, or RFC 3339 (`2026-05-01T12:00:00Z`,
/// `2026-05-01T14:00:00.250+02:00`).
pub fn time_ms(flag: &str, text: &str) -> Result<u64, String> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    let bad = || {
        format!(
            "--{flag} must be milliseconds since the epoch or RFC 3339 like 2026-05-01T12:00:00Z, not {text:?}"
        )
    };
    let b = text.as_bytes();
    // ASCII only, so that every slice below falls on a character boundary.
    if !text.is_ascii()
        || b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let num = |range: std::ops::Range<usize>| -> Result<i64, String> {
        let part = text.get(range).ok_or_else(bad)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=12).contains(&month)
        || !(1..=days_in_month).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let padded = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = padded.parse().map_err(|_| bad())?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6
            && (rest.starts_with('+') || rest.starts_with('-'))
            && &rest[3..4] == ":" =>
        {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let at = text.len() - rest.len();
            let (hours, minutes) = (num(at + 1..at + 3)?, num(at + 4..at + 6)?);
            if hours > 23 || minutes > 59 {
                return Err(bad());
            }
            sign * (hours * 60 + minutes)
        }
        _ => return Err(bad()),
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    let ms = seconds * 1000 + millis;
    u64::try_from(ms).map_err(|_| format!("--{flag} {text:?} is before 1970"))
}

/// Where printing records stopped: stdout closed by its reader (`nova read -f | head`),
/// which ends a read as a success; any other failure to write is one.
enum Printed {
    All,
    ReaderGone,
}

/// A record for people (its body, as is) or as JSON (`--json`, a JSON object a line: the
/// body as text when UTF-8, else `body_base64`; the headers as text when every name and
/// value is UTF-8, else `headers_base64`; nova never alters a byte).
fn print_records(session: &Session, records: &[Record]) -> Result<Printed, Failure> {
    use base64::Engine as _;
    let mut out = std::io::stdout().lock();
    let mut print = |record: &Record| {
        if session.json {
            let text = |bytes: &[u8]| std::str::from_utf8(bytes).ok().map(str::to_owned);
            let mut value = json!({"seq_num": record.seq_num, "timestamp": record.timestamp});
            match text(&record.body) {
                Some(body) => value["body"] = json!(body),
                None => {
                    value["body_base64"] =
                        json!(base64::engine::general_purpose::STANDARD.encode(&record.body));
                }
            }
            // Headers as text when every name and value is UTF-8, else all in base64.
            let texts: Option<Vec<Value>> =
                record.headers.iter().map(|(n, v)| Some(json!([text(n)?, text(v)?]))).collect();
            match texts {
                Some(headers) => value["headers"] = json!(headers),
                None => {
                    let base64 = |bytes| base64::engine::general_purpose::STANDARD.encode(bytes);
                    let headers: Vec<Value> =
                        record.headers.iter().map(|(n, v)| json!([base64(n), base64(v)])).collect();
                    value["headers_base64"] = json!(headers);
                }
            }
            writeln!(out, "{value}")
        } else {
            out.write_all(&record.body).and_then(|()| out.write_all(b"\n"))
        }
    };
    let written = records.iter().try_for_each(&mut print).and_then(|()| out.flush());
    match written {
        Ok(()) => Ok(Printed::All),
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(Printed::ReaderGone),
        Err(error) => {
            Err(Failure::Failed(format!("writing the records to stdout failed: {error}")))
        }
    }
}

fn read(session: &Session, address: &Address, args: &Args) -> Outcome {
    let mut starts = Vec::new();
    if let Some(n) = args.number("from-seq")? {
        starts.push(Start::SeqNum(n));
    }
    if let Some(time) = args.value("from-time") {
        starts.push(Start::Timestamp(time_ms("from-time", time).map_err(usage_error)?));
    }
    if let Some(k) = args.number("tail-offset")? {
        starts.push(Start::TailOffset(k));
    }
    let start = match starts.as_slice() {
        [] => Start::SeqNum(0),
        [one] => *one,
        _ => return Err(usage_error("read takes one of --from-seq, --from-time, --tail-offset")),
    };
    let count = args.number("count")?;
    if count == Some(0) {
        return Err(usage_error("--count must be at least 1"));
    }
    let options = ReadOptions { start, count, ..ReadOptions::default() };
    if args.has("follow") {
        return follow(session, address, options);
    }
    let mut options = options;
    let mut delivered = 0u64;
    loop {
        let page = session.client.read(address, &options).map_err(failed)?;
        if let Printed::ReaderGone = print_records(session, &page.records)? {
            return Ok(());
        }
        delivered += page.records.len() as u64;
        let done = page.next_seq_num >= page.tail.seq_num
            || count.is_some_and(|c| delivered >= c)
            || page.records.is_empty();
        if done {
            return Ok(());
        }
        options.start = Start::SeqNum(page.next_seq_num);
        options.count = count.map(|c| c - delivered);
    }
}

/// The first wait before `read --follow` resumes a subscription, doubling to the next.
const RESUME_BACKOFF_FIRST: Duration = Duration::from_millis(100);
const RESUME_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// `read --follow`: a subscription, resumed right after the last record printed when its
/// connection fails (the server restarted, a proxy cut it): a read has no side effect,
/// so no record is lost or printed twice. It gives up when the subscription has not
/// delivered an event for `--timeout` while being resumed; an error the server answers
/// ends it at once.
fn follow(session: &Session, address: &Address, mut options: ReadOptions) -> Outcome {
    // A tail offset names a position only against the tail of the moment: fixed now, so
    // that a resume before any event starts where this follow did, not at a later tail.
    // (A stream not there yet keeps it: its tail is where it will start.)
    if let Start::TailOffset(k) = options.start
        && let Ok(tail) = session.client.check_tail(address)
    {
        options.start = Start::SeqNum(tail.seq_num.saturating_sub(k));
    }
    let count = options.count;
    let mut delivered = 0u64;
    let mut subscription = session.client.subscribe(address, &options, false).map_err(failed)?;
    // Resumed on the stream followed, never on one created at its address since.
    options.stream_id = options.stream_id.or(subscription.stream_id());
    // Since when the subscription has been cut with no event since, and the next wait.
    let mut cut: Option<(Instant, Duration)> = None;
    loop {
        let error = match subscription.next() {
            None => return Ok(()),
            Some(Ok(event)) => {
                cut = None;
                match event {
                    SubscriptionEvent::Records { records, .. } => {
                        delivered += records.len() as u64;
                        if let Printed::ReaderGone = print_records(session, &records)? {
                            return Ok(());
                        }
                    }
                    // Idle at the tail before any record: what comes next starts there,
                    // whatever the start was, so a resume must not go back.
                    SubscriptionEvent::Heartbeat { tail } => {
                        if delivered == 0 && !matches!(options.start, Start::SeqNum(_)) {
                            options.start = Start::SeqNum(tail.seq_num);
                        }
                        // `read -f | head -1`: the reader took what it wanted and went,
                        // which an idle stream gives no write to find out.
                        if stdout_reader_gone() {
                            return Ok(());
                        }
                    }
                }
                continue;
            }
            Some(Err(error)) if resumable(&error) => error,
            Some(Err(error)) => return Err(failed(error)),
        };
        if let Some(next) = subscription.next_seq_num() {
            options.start = Start::SeqNum(next);
        }
        if count.is_some_and(|c| delivered >= c) {
            // Every record asked for is printed: only the end was cut.
            return Ok(());
        }
        options.count = count.map(|c| c - delivered);
        let notice = format!("the subscription was cut ({error}); resuming");
        if session.json {
            eprintln!("{}", json!({ "notice": notice }));
        } else {
            eprintln!("nova: {notice}");
        }
        let (since, wait) = cut.get_or_insert((Instant::now(), RESUME_BACKOFF_FIRST));
        subscription = resume(session, address, &options, *since, wait)?;
    }
}

/// Whether stdout is a pipe or socket whose reader has closed it, told by poll(2) with
/// nothing written (POLLERR on a pipe's write end, POLLHUP on a socket, Unix or TCP,
/// whose peer has closed it).
fn stdout_reader_gone() -> bool {
    let mut stdout = libc::pollfd { fd: libc::STDOUT_FILENO, events: 0, revents: 0 };
    // SAFETY: one valid pollfd, and no wait.
    let ready = unsafe { libc::poll(&mut stdout, 1, 0) };
    ready == 1 && stdout.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// Opens the subscription again, waiting between tries (the wait doubling, kept across
/// cuts until an event arrives), within `--timeout` of the first cut.
fn resume(
    session: &Session,
    address: &Address,
    options: &ReadOptions,
    since: Instant,
    wait: &mut Duration,
) -> Result<Subscription, Failure> {
    loop {
        std::thread::sleep(*wait);
        *wait = (*wait * 2).min(RESUME_BACKOFF_MAX);
        match session.client.subscribe(address, options, false) {
            Ok(subscription) => return Ok(subscription),
            Err(error)
                if resumable(&error)
                    && session.timeout.is_none_or(|limit| since.elapsed() + *wait < limit) => {}
            Err(error) => return Err(failed(error)),
        }
    }
}

/// A failure of the connection, or a server that is stopping or starting: worth
/// opening the subscription again.
fn resumable(error: &client::Error) -> bool {
    matches!(error, client::Error::Io { .. }) || error.code() == Some("unavailable")
}

#[cfg(test)]
mod tests {
    use super::{Answers, Failure, InFlight, client, duration_ms, size_bytes, time_ms};

    fn ack(start: u64, end: u64) -> client::Result<client::Ack> {
        let at = |seq_num| client::Position { seq_num, timestamp: 0 };
        Ok(client::Ack { start: at(start), end: at(end), tail: at(end) })
    }

    fn failure(answers: Answers) -> String {
        match answers.outcome(false, None) {
            Err(failure @ (Failure::Call { .. } | Failure::Failed(_))) => {
                failure.message().to_owned()
            }
            Ok(()) | Err(Failure::Usage(_)) => panic!("not a failed call"),
        }
    }

    /// A batch whose connection failed may have landed: the failure says so rather than
    /// "not appended", which would invite a resend that lands twice; a refusal says
    /// "not appended", and what became of each batch behind it.
    #[test]
    fn an_append_failure_tells_a_refusal_from_an_unknown_outcome() {
        let lost = || client::Error::Io {
            what: "append session".into(),
            error: std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        };
        let refused = || {
            client::Error::Api(client::ApiError {
                status: 400,
                code: "invalid_argument".into(),
                message: "record 0 is over the record limit".into(),
                body: serde_json::Value::Null,
                retry_after_seconds: None,
            })
        };
        let mut answers = Answers::default();
        assert!(answers.take(ack(0, 2), InFlight::lines(1, 2)).is_some());
        assert!(answers.take(Err(lost()), InFlight::lines(3, 1)).is_none());
        assert!(answers.take(Err(lost()), InFlight::lines(4, 2)).is_none());
        let message = failure(answers);
        assert!(message.starts_with("lines 3-3 may or may not have been appended"), "{message}");
        assert!(message.contains("2 records before them were"), "{message}");
        assert!(message.contains("lines 4-5 may or may not have landed"), "{message}");

        let mut answers = Answers::default();
        assert!(answers.take(ack(0, 1), InFlight::lines(1, 1)).is_some());
        assert!(answers.take(Err(refused()), InFlight::lines(2, 1)).is_none());
        assert!(answers.take(ack(1, 2), InFlight::lines(3, 1)).is_none());
        assert!(answers.take(Err(refused()), InFlight::lines(4, 1)).is_none());
        let message = failure(answers);
        assert!(message.starts_with("lines 2-2 were not appended"), "{message}");
        assert!(message.contains("over the record limit (record 0 is line 2)"), "{message}");
        assert!(message.contains("1 record before them was"), "{message}");
        assert!(message.contains("lines 3-3 were appended after them, at seq_num 1..2"));
        assert!(message.contains("lines 4-4 failed too"), "{message}");
    }

    fn api_error(code: &str, body: serde_json::Value, retry: Option<u64>) -> client::Error {
        client::Error::Api(client::ApiError {
            status: 400,
            code: code.into(),
            message: format!("a {code}"),
            body,
            retry_after_seconds: retry,
        })
    }

    /// A batch kept to send again, with `match_seq_num` when given.
    fn kept(first_line: u64, lines: u64, match_seq_num: Option<u64>) -> InFlight {
        let conditions = client::Conditions { match_seq_num, ..Default::default() };
        InFlight { first_line, lines, batch: Some(client::Batch::new()), conditions }
    }

    /// Batches the throughput cap refused wait to go again, as long as nothing behind
    /// them lands: one that does makes the first of them this append's failure.
    #[test]
    fn throttled_batches_go_again_only_while_nothing_lands_behind_them() {
        let capped = |retry| api_error("resource_exhausted", serde_json::Value::Null, retry);
        let mut answers = Answers::default();
        assert!(answers.take(ack(0, 1), kept(1, 1, None)).is_some());
        assert!(answers.take(Err(capped(Some(2))), kept(2, 1, None)).is_none());
        assert!(answers.take(Err(capped(Some(5))), kept(3, 1, None)).is_none());
        assert_eq!(answers.throttled.len(), 2);
        assert!(answers.refused.is_none());
        assert_eq!(answers.retry_after(), std::time::Duration::from_secs(5));
        assert!(answers.take(Err(capped(Some(3600))), kept(4, 1, None)).is_none());
        assert_eq!(answers.retry_after(), super::APPEND_RETRY_AFTER_MAX);
        // A batch behind them lands: resending them would put them after it.
        assert!(answers.take(ack(1, 2), kept(5, 1, None)).is_none());
        assert!(answers.throttled.is_empty());
        let message = failure(answers);
        assert!(message.starts_with("lines 2-2 were not appended: "), "{message}");
        assert!(message.contains("lines 3-3 failed too"), "{message}");
        assert!(message.contains("lines 5-5 were appended after them"), "{message}");

        // A batch not kept (past the bound) cannot go again: its refusal is final.
        let mut answers = Answers::default();
        assert!(answers.take(Err(capped(None)), InFlight::lines(1, 1)).is_none());
        assert!(answers.throttled.is_empty() && answers.refused.is_some());

        // Behind a throttled batch, a conditional one refused for its seq_num goes too.
        let mismatch =
            || api_error("failed_precondition", serde_json::json!({"next_seq_num": 7}), None);
        let mut answers = Answers::default();
        assert!(answers.take(Err(capped(None)), kept(1, 1, Some(7))).is_none());
        assert!(answers.take(Err(mismatch()), kept(2, 1, Some(8))).is_none());
        assert_eq!(answers.throttled.len(), 2);
        // Without a throttled batch before it, a mismatch is a refusal.
        let mut answers = Answers::default();
        assert!(answers.take(Err(mismatch()), kept(1, 1, Some(8))).is_none());
        assert!(answers.throttled.is_empty() && answers.refused.is_some());
    }

    /// A batch throttled round after round with nothing landing is given up after
    /// APPEND_THROTTLED_ROUNDS_MAX rounds; anything landing starts the count again.
    #[test]
    fn throttled_rounds_with_nothing_landing_are_bounded() {
        let capped = || api_error("resource_exhausted", serde_json::Value::Null, Some(1));
        let mut answers = Answers::default();
        // A round: the batch sent again (taken out of `throttled`) and throttled again.
        let throttle = |answers: &mut Answers| {
            answers.throttled.clear();
            assert!(answers.take(Err(capped()), kept(2, 1, None)).is_none());
        };
        assert!(answers.take(ack(0, 1), kept(1, 1, None)).is_some());
        for round in 1..=super::APPEND_THROTTLED_ROUNDS_MAX {
            throttle(&mut answers);
            assert!(answers.throttled_round(), "round {round} goes");
        }
        // Something lands between rounds (a batch answered before the throttled one's
        // resend): the count starts again.
        answers.appended += 1;
        for round in 1..=super::APPEND_THROTTLED_ROUNDS_MAX {
            throttle(&mut answers);
            assert!(answers.throttled_round(), "round {round} after a landing goes");
        }
        throttle(&mut answers);
        assert!(!answers.throttled_round(), "one round past the bound stops");
        assert!(answers.throttled.is_empty());
        let message = failure(answers);
        assert!(message.starts_with("lines 2-2 were not appended: "), "{message}");
        assert!(message.contains("resource_exhausted"), "{message}");
    }

    #[test]
    fn durations_need_a_unit_and_errors_name_the_flag() {
        let ms = |text| duration_ms("retention-max-age", text);
        assert_eq!(ms("250ms"), Ok(250));
        assert_eq!(ms("30s"), Ok(30_000));
        assert_eq!(ms("10m"), Ok(600_000));
        assert_eq!(ms("168h"), Ok(604_800_000));
        assert_eq!(ms("7d"), Ok(604_800_000));
        for (bad, why) in [
            ("1000", "needs a unit"),
            ("1.5h", "unknown unit"),
            ("h", "is not a duration"),
            ("10w", "unknown unit"),
            ("99999999999999999d", "too long"),
        ] {
            let error = ms(bad).expect_err(bad);
            assert!(error.contains("--retention-max-age") && error.contains(why), "{error}");
        }
    }

    #[test]
    fn sizes_are_bytes_or_take_binary_units_and_errors_name_the_flag() {
        let bytes = |text| size_bytes("batch-max-bytes", text);
        assert_eq!(bytes("0"), Ok(0));
        assert_eq!(bytes("4096"), Ok(4096));
        assert_eq!(bytes("64KiB"), Ok(64 << 10));
        assert_eq!(bytes("1MiB"), Ok(1 << 20));
        assert_eq!(bytes("2GiB"), Ok(2 << 30));
        for (bad, why) in [
            ("1MB", "unknown unit"),
            ("1.5MiB", "unknown unit"),
            ("MiB", "is not a size"),
            ("99999999999GiB", "too large"),
        ] {
            let error = bytes(bad).expect_err(bad);
            assert!(error.contains("--batch-max-bytes") && error.contains(why), "{error}");
        }
    }

    #[test]
    fn from_time_takes_milliseconds_and_rfc_3339() {
        assert_eq!(time_ms("from-time", "1700000000000"), Ok(1_700_000_000_000));
        assert_eq!(time_ms("from-time", "1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(time_ms("from-time", "2023-11-14T22:13:20Z"), Ok(1_700_000_000_000));
        assert_eq!(time_ms("from-time", "2023-11-14T23:13:20.25+01:00"), Ok(1_700_000_000_250));
        assert_eq!(time_ms("from-time", "2024-02-29T00:00:00.123456Z"), Ok(1_709_164_800_123));
        assert_eq!(time_ms("from-time", "2023-11-14T20:43:20-01:30"), Ok(1_700_000_000_000));
        let bad = [
            "yesterday",
            "2023-13-01T00:00:00Z",
            "2023-11-14T22:13:20",
            "2023-11-14",
            // Days past their month's end, not shifted into the next.
            "2026-02-31T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2026-04-31T00:00:00Z",
            // Offsets out of range or not two digits each.
            "2026-05-01T00:00:00+99:99",
            "2026-05-01T00:00:00+24:00",
            "2026-05-01T00:00:00++1:00",
            // Not ASCII: refused, not a panic at a slice inside a character.
            "2026-05-01T00:00:00+1é00",
            "2026-05-01T00:00:0é",
        ];
        for bad in bad {
            let error = time_ms("from-time", bad).expect_err(bad);
            assert!(
                error.contains("--from-time") && error.contains(&format!("{bad:?}")),
                "{error}"
            );
        }
    }
}
