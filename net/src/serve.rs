//! `nova serve`: starts a node on the data directory with the HTTP server on every shard,
//! prints `nova listening on http://ADDR` once every shard accepts, and on SIGTERM or
//! SIGINT stops accepting, finishes the requests in hand, stops the node and returns.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use engine::node::{Node, NodeConfig, ObjectStoreConfig};
use s3::{S3Config, S3Credentials};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tuning::Knob;

use crate::metrics::Metrics;
use crate::server::{self, ServerConfig};

/// The knobs `nova serve` takes, besides `--listen` and `--data-dir`.
pub const SERVE_KNOBS: [Knob; 14] = [
    tuning::SHARDS,
    tuning::RECORD_BYTES_MAX,
    tuning::SHARD_MEMORY_BYTES,
    tuning::EXPRESS_CHUNK_BYTES,
    tuning::SHARD_INBOX_DEPTH,
    tuning::SHARD_HANDLERS_MAX,
    tuning::JOURNAL_SEGMENT_BYTES,
    tuning::JOURNAL_SPARE_SEGMENTS,
    tuning::HTTP_CONNECTIONS_MAX,
    tuning::HTTP_BODY_BYTES_MAX,
    tuning::SSE_HEARTBEAT_MS,
    tuning::BUNDLE_BYTES_TARGET,
    tuning::BUNDLE_DELAY_MS,
    tuning::UPLOADS_IN_FLIGHT_MAX,
];

/// The object-store flags: with `--s3-bucket`, objects go to S3 instead of
/// `<data-dir>/objects`. Unset values fall back to the usual AWS variables.
pub const S3_FLAGS: [(&str, &str); 7] = [
    ("s3-bucket", "store objects in this S3 bucket instead of <data-dir>/objects"),
    ("s3-prefix", "prefix of every object key in the bucket (default: none)"),
    (
        "s3-endpoint",
        "http:// or https:// URL of an S3-compatible server (default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS)",
    ),
    ("s3-region", "the bucket's region (default: AWS_REGION, else AWS_DEFAULT_REGION)"),
    (
        "s3-path-style",
        "true: path-style URLs (endpoint/bucket/key), which most S3-compatible servers need (default false)",
    ),
    ("s3-access-key-id", "access key (default: AWS_ACCESS_KEY_ID)"),
    (
        "s3-secret-access-key",
        "secret key, with --s3-access-key-id (default: AWS_SECRET_ACCESS_KEY; AWS_SESSION_TOKEN is read too)",
    ),
];

/// The S3 object store the flags ask for; None (the node's default, `<data-dir>/objects`)
/// without `--s3-bucket`. `nova doctor` reads the same flags.
pub(crate) fn object_store(
    flags: &[(String, String)],
) -> Result<Option<ObjectStoreConfig>, String> {
    let Some(bucket) = flag_value(flags, "s3-bucket") else {
        if let Some((name, _)) = flags.iter().find(|(name, _)| name.starts_with("s3-")) {
            return Err(format!(
                "--{name} needs --s3-bucket (objects go to S3 only with a bucket)"
            ));
        }
        return Ok(None);
    };
    if bucket.is_empty() {
        return Err("--s3-bucket must name a bucket, not be empty".into());
    }
    let mut config = S3Config::new(bucket);
    config.prefix = flag_value(flags, "s3-prefix").unwrap_or_default().to_owned();
    config.endpoint = flag_value(flags, "s3-endpoint").map(str::to_owned);
    config.region = flag_value(flags, "s3-region").map(str::to_owned);
    config.path_style = match flag_value(flags, "s3-path-style") {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(format!("--s3-path-style must be true or false, not {other:?}")),
    };
    config.credentials =
        match (flag_value(flags, "s3-access-key-id"), flag_value(flags, "s3-secret-access-key")) {
            (Some(id), Some(secret)) => Some(S3Credentials {
                access_key_id: id.to_owned(),
                secret_access_key: secret.to_owned(),
                session_token: std::env::var("AWS_SESSION_TOKEN").ok().filter(|t| !t.is_empty()),
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err("--s3-access-key-id needs --s3-secret-access-key too".into());
            }
            (None, Some(_)) => {
                return Err("--s3-secret-access-key needs --s3-access-key-id too".into());
            }
        };
    Ok(Some(ObjectStoreConfig::S3(Box::new(config))))
}

/// `nova serve`'s help.
pub fn help() -> String {
    let mut text = String::from(
        "nova serve: run a nova node and its HTTP API\n\n\
         usage: nova serve [--listen ADDR] [--data-dir DIR] [--s3-bucket NAME ...] [--KNOB VALUE ...]\n\n\
         example: nova serve --listen 127.0.0.1:8080 --data-dir ./nova-data\n\
         example: nova serve --s3-bucket nova --s3-endpoint http://127.0.0.1:9000 --s3-path-style\n\n\
         Objects go to <data-dir>/objects unless --s3-bucket names an S3 bucket:\n\n",
    );
    for (flag, help) in S3_FLAGS {
        text.push_str(&format!("  --{flag}: {help}\n"));
    }
    text.push_str(
        "\nEvery other setting comes from its flag, else its environment variable, else the default:\n\n",
    );
    for knob in tuning::TEXT_KNOBS {
        text.push_str(&format!(
            "  --{} ({}, default {}): {}\n",
            knob.flag, knob.env, knob.default, knob.help
        ));
    }
    for knob in SERVE_KNOBS {
        text.push_str(&format!(
            "  --{} ({}, default {}, {}..={}): {}\n",
            knob.flag, knob.env, knob.default, knob.min, knob.max, knob.help
        ));
    }
    text
}

fn flag_value<'a>(flags: &'a [(String, String)], name: &str) -> Option<&'a str> {
    flags.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn knob(flags: &[(String, String)], knob: Knob) -> Result<u64, String> {
    knob.resolve(flag_value(flags, knob.flag)).map_err(|e| e.message)
}

fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Runs the server until a stop signal; `Err` says why it could not start.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut flags: Vec<(String, String)> = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let Some(name) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?}\n\n{}", help()));
        };
        let (name, value) = match name.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            // The one switch: `--s3-path-style` alone means true.
            None if name == "s3-path-style"
                && rest.clone().next().is_none_or(|next| next.starts_with("--")) =>
            {
                (name.to_owned(), "true".to_owned())
            }
            None => {
                let value = rest.next().ok_or_else(|| format!("--{name} needs a value"))?;
                (name.to_owned(), value.clone())
            }
        };
        let known = tuning::TEXT_KNOBS.iter().any(|k| k.flag == name)
            || SERVE_KNOBS.iter().any(|k| k.flag == name)
            || S3_FLAGS.iter().any(|(flag, _)| *flag == name);
        if !known {
            return Err(format!("unknown flag --{name}\n\n{}", help()));
        }
        flags.push((name, value));
    }
    let listen_text = tuning::LISTEN.resolve(flag_value(&flags, "listen"));
    let data_dir = tuning::DATA_DIR.resolve(flag_value(&flags, "data-dir"));
    let mut listen: SocketAddr = listen_text
        .to_socket_addrs()
        .map_err(|e| format!("--listen {listen_text:?} is not an address: {e}"))?
        .next()
        .ok_or_else(|| format!("--listen {listen_text:?} resolves to no address"))?;
    // A plain bind (no SO_REUSEPORT) finds a port already taken, by another nova too,
    // whose shards would otherwise share it silently; port 0 picks one free port for
    // every shard.
    {
        let probe = std::net::TcpListener::bind(listen)
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        listen = probe.local_addr().map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    }

    let mut config = NodeConfig::new(&data_dir);
    if let Some(objects) = object_store(&flags)? {
        config.objects = objects;
    }
    let shards = knob(&flags, tuning::SHARDS)?;
    if shards > 0 {
        config.shards = to_usize(shards);
    }
    config.shard.limits.record_bytes_max =
        u32::try_from(knob(&flags, tuning::RECORD_BYTES_MAX)?).unwrap_or(u32::MAX);
    config.shard.memory_budget_bytes = knob(&flags, tuning::SHARD_MEMORY_BYTES)?;
    config.shard.express_chunk_bytes = to_usize(knob(&flags, tuning::EXPRESS_CHUNK_BYTES)?);
    config.inbox_depth = to_usize(knob(&flags, tuning::SHARD_INBOX_DEPTH)?);
    config.handlers_max = knob(&flags, tuning::SHARD_HANDLERS_MAX)?;
    config.journal.segment_bytes = knob(&flags, tuning::JOURNAL_SEGMENT_BYTES)?;
    config.journal.spare_segments =
        u32::try_from(knob(&flags, tuning::JOURNAL_SPARE_SEGMENTS)?).unwrap_or(u32::MAX);
    config.uploader.bundle_bytes_target = knob(&flags, tuning::BUNDLE_BYTES_TARGET)?;
    config.uploader.bundle_delay = Duration::from_millis(knob(&flags, tuning::BUNDLE_DELAY_MS)?);
    config.uploader.uploads_in_flight_max = to_usize(knob(&flags, tuning::UPLOADS_IN_FLIGHT_MAX)?);
    let mut server_config = ServerConfig::new(listen);
    server_config.connections_max = knob(&flags, tuning::HTTP_CONNECTIONS_MAX)?;
    server_config.settings.body_bytes_max = knob(&flags, tuning::HTTP_BODY_BYTES_MAX)?;
    server_config.settings.heartbeat =
        Duration::from_millis(knob(&flags, tuning::SSE_HEARTBEAT_MS)?);

    // Registered before the node starts, so a signal during start is not lost.
    let mut signals =
        Signals::new([SIGTERM, SIGINT]).map_err(|e| format!("cannot handle signals: {e}"))?;
    let shard_count = config.shards;
    let metrics = Arc::new(Metrics::new(shard_count));
    let (bound_tx, bound_rx) = flume::unbounded();
    let service = server::service(server_config, metrics, bound_tx);
    let node = Node::start_serving(config, service)
        .map_err(|e| format!("cannot start the node on {data_dir}: {e}"))?;
    for _ in 0..shard_count {
        match bound_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                node.stop();
                return Err(error);
            }
            Err(_) => {
                node.stop();
                return Err("a shard stopped before it listened".into());
            }
        }
    }
    println!("nova listening on http://{listen}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    if let Some(signal) = signals.forever().next() {
        eprintln!("nova: signal {signal}: stopping (finishing requests in hand)");
    }
    node.stop();
    eprintln!("nova: stopped");
    Ok(())
}
