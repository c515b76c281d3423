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

use crate::auth::Auth;
use crate::metrics::Metrics;
use crate::server::{self, ServerConfig};

/// The HTTP server's knobs; the engine's are `engine::node::engine_knobs()` and the S3
/// store's [`S3_KNOBS`]. Together they are every knob (`tuning::KNOBS`), and `nova serve`
/// takes each as a flag.
pub const HTTP_KNOBS: [Knob; 15] = [
    tuning::HTTP_CONNECTIONS_MAX,
    tuning::HTTP_BODY_BYTES_MAX,
    tuning::HTTP_JSON_BODY_BYTES_MAX,
    tuning::HTTP_BODY_MEMORY_BYTES,
    tuning::HTTP_SESSION_IN_FLIGHT_MAX,
    tuning::HTTP_RESPONSE_MEMORY_BYTES,
    tuning::HTTP_HEAD_BYTES_MAX,
    tuning::HTTP_IDLE_TIMEOUT_MS,
    tuning::HTTP_SHUTDOWN_IDLE_MS,
    tuning::HTTP_PEER_GONE_MS,
    tuning::HTTP_LOG_SLOW_MS,
    tuning::HTTP_LOG_LINES_PER_SECOND,
    tuning::LOG_QUEUE_LINES,
    tuning::SSE_HEARTBEAT_MS,
    tuning::TOKENS_MAX,
];

/// The address to listen on, once a plain bind of it has worked (its port chosen, for
/// port 0). A port in use is tried again for [`PORT_TAKEN_WAIT`]: a nova killed just
/// before keeps its listener for some milliseconds after its exit (the kernel tears its
/// io_uring down), and a supervisor restarting it at once must not fail for that.
fn probe_port(listen: SocketAddr) -> Result<SocketAddr, String> {
    let given_up = std::time::Instant::now() + PORT_TAKEN_WAIT;
    loop {
        match std::net::TcpListener::bind(listen) {
            Ok(probe) => {
                return probe.local_addr().map_err(|e| format!("cannot listen on {listen}: {e}"));
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < given_up =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("cannot listen on {listen}: {e}")),
        }
    }
}

/// How long a start waits for its port to be let go of ([`probe_port`]).
const PORT_TAKEN_WAIT: Duration = Duration::from_secs(1);

/// The S3 store's transfer knobs (used with `--s3-bucket`).
pub const S3_KNOBS: [Knob; 8] = [
    tuning::S3_ATTEMPT_TIMEOUT_MS,
    tuning::S3_TRANSFER_BYTES_PER_SECOND_MIN,
    tuning::S3_ATTEMPTS_MAX,
    tuning::S3_BACKOFF_INITIAL_MS,
    tuning::S3_BACKOFF_MAX_MS,
    tuning::S3_MULTIPART_THRESHOLD_BYTES,
    tuning::S3_MULTIPART_PART_BYTES,
    tuning::S3_MULTIPART_CONCURRENCY,
];

/// The object-store flags: with `--s3-bucket`, objects go to S3 instead of
/// `<data-dir>/objects`. The first five may come from their environment variables
/// ([`S3_ENV_SETTINGS`]); unset values fall back to the usual AWS variables.
pub const S3_FLAGS: [(&str, &str); 7] = [
    (
        "s3-bucket",
        "store objects in this S3 bucket instead of <data-dir>/objects (env NOVA_S3_BUCKET)",
    ),
    ("s3-prefix", "prefix of every object key in the bucket (env NOVA_S3_PREFIX; default: none)"),
    (
        "s3-endpoint",
        "http:// or https:// URL of an S3-compatible server (env NOVA_S3_ENDPOINT; default: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS)",
    ),
    (
        "s3-region",
        "the bucket's region (env NOVA_S3_REGION; default: AWS_REGION, else AWS_DEFAULT_REGION)",
    ),
    (
        "s3-path-style",
        "true: path-style URLs (endpoint/bucket/key), which most S3-compatible servers need (env NOVA_S3_PATH_STYLE; default false)",
    ),
    ("s3-access-key-id", "access key (default: AWS_ACCESS_KEY_ID)"),
    (
        "s3-secret-access-key",
        "secret key, with --s3-access-key-id (default: AWS_SECRET_ACCESS_KEY; AWS_SESSION_TOKEN is read too)",
    ),
];

/// The object-store settings that may come from the environment, and their variables;
/// the keys come from the AWS variables instead, as every AWS tool reads them.
pub const S3_ENV_SETTINGS: [(&str, &str); 5] = [
    ("s3-bucket", "NOVA_S3_BUCKET"),
    ("s3-prefix", "NOVA_S3_PREFIX"),
    ("s3-endpoint", "NOVA_S3_ENDPOINT"),
    ("s3-region", "NOVA_S3_REGION"),
    ("s3-path-style", "NOVA_S3_PATH_STYLE"),
];

/// An object-store setting: its flag, else its environment variable (an empty one is
/// unset), else None.
fn s3_setting(flags: &[(String, String)], name: &str) -> Option<String> {
    flag_value(flags, name).map(str::to_owned).or_else(|| {
        let (_, variable) = S3_ENV_SETTINGS.iter().find(|(flag, _)| *flag == name)?;
        std::env::var(variable).ok().filter(|value| !value.is_empty())
    })
}

/// The S3 object store the flags (or their environment variables) ask for; None (the
/// node's default, `<data-dir>/objects`) without a bucket. `nova doctor` reads the same.
pub(crate) fn object_store(
    flags: &[(String, String)],
) -> Result<Option<ObjectStoreConfig>, String> {
    let Some(bucket) = s3_setting(flags, "s3-bucket") else {
        if let Some((name, _)) = flags.iter().find(|(name, _)| name.starts_with("s3-")) {
            return Err(format!(
                "--{name} needs --s3-bucket (objects go to S3 only with a bucket)"
            ));
        }
        let set = |variable: &&str| std::env::var(variable).is_ok_and(|v| !v.is_empty());
        let variables = S3_ENV_SETTINGS.iter().map(|(_, variable)| *variable);
        if let Some(variable) = variables.chain(S3_KNOBS.iter().map(|k| k.env)).find(set) {
            return Err(format!(
                "{variable} is set, but neither --s3-bucket nor NOVA_S3_BUCKET is (objects go \
                 to S3 only with a bucket)"
            ));
        }
        return Ok(None);
    };
    if bucket.is_empty() {
        return Err("--s3-bucket must name a bucket, not be empty".into());
    }
    let mut config = S3Config::new(bucket);
    let ms = |k| knob(flags, k).map(Duration::from_millis);
    config.policy = s3::TransferPolicy {
        attempt_timeout: ms(tuning::S3_ATTEMPT_TIMEOUT_MS)?,
        transfer_bytes_per_second_min: knob(flags, tuning::S3_TRANSFER_BYTES_PER_SECOND_MIN)?,
        attempts_max: u32::try_from(knob(flags, tuning::S3_ATTEMPTS_MAX)?).unwrap_or(u32::MAX),
        backoff_initial: ms(tuning::S3_BACKOFF_INITIAL_MS)?,
        backoff_max: ms(tuning::S3_BACKOFF_MAX_MS)?,
        multipart_threshold_bytes: knob(flags, tuning::S3_MULTIPART_THRESHOLD_BYTES)?,
        multipart_part_bytes: knob(flags, tuning::S3_MULTIPART_PART_BYTES)?,
        multipart_concurrency: to_usize(knob(flags, tuning::S3_MULTIPART_CONCURRENCY)?),
    };
    engine::node::backoff_in_order(
        config.policy.backoff_initial,
        config.policy.backoff_max,
        tuning::S3_BACKOFF_INITIAL_MS,
        tuning::S3_BACKOFF_MAX_MS,
    )?;
    config.prefix = s3_setting(flags, "s3-prefix").unwrap_or_default();
    config.endpoint = s3_setting(flags, "s3-endpoint");
    config.region = s3_setting(flags, "s3-region");
    config.path_style = match s3_setting(flags, "s3-path-style").as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!(
                "--s3-path-style (or NOVA_S3_PATH_STYLE) must be true or false, not {other:?}"
            ));
        }
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
         usage: nova serve [--listen ADDR] [--data-dir DIR] [--s3-bucket NAME ...] [--insecure-no-auth] [--KNOB VALUE ...]\n\n\
         example: nova serve --listen 127.0.0.1:8080 --data-dir ./nova-data\n\
         example: nova serve --s3-bucket nova --s3-endpoint http://127.0.0.1:9000 --s3-path-style\n\n\
         Objects go to <data-dir>/objects unless --s3-bucket names an S3 bucket:\n\n",
    );
    for (flag, help) in S3_FLAGS {
        text.push_str(&format!("  --{flag}: {help}\n"));
    }
    text.push_str(&format!(
        "\nWith --root-token-file, every request needs a token (docs/auth.md). Without one, nova\n\
         serves only a loopback address unless --{INSECURE_NO_AUTH} is given (then it warns):\n\n  \
         --{INSECURE_NO_AUTH}: serve a non-loopback --listen address without authentication\n"
    ));
    text.push_str(&format!(
        "\nA data directory that ran before needs its journals, which hold acknowledged express\n\
         records not yet in the object store; a start without them is refused, unless:\n\n  \
         --{ACCEPT_JOURNAL_LOSS}: start anew a journal that is gone for good, losing the express\n    \
         records only it held (their sequence numbers may be handed out again)\n"
    ));
    text.push_str(
        "\nEvery other setting comes from its flag, else its environment variable, else the default:\n\n",
    );
    for knob in tuning::TEXT_KNOBS {
        text.push_str(&format!(
            "  --{} ({}, default {}): {}\n",
            knob.flag, knob.env, knob.default, knob.help
        ));
    }
    for knob in tuning::KNOBS {
        text.push_str(&format!(
            "  --{} ({}, default {}, {}..={}): {}\n",
            knob.flag, knob.env, knob.default, knob.min, knob.max, knob.help
        ));
    }
    text
}

/// Serving a non-loopback address without auth (no `--root-token-file`) is refused unless
/// asked for (spec/auth.md: "binding any other address without auth needs an explicit
/// `--insecure-no-auth` flag, and the server warns at start").
const INSECURE_NO_AUTH: &str = "insecure-no-auth";

/// Starting although a journal of a data directory that ran before is missing.
const ACCEPT_JOURNAL_LOSS: &str = "accept-journal-loss";

/// Flags that mean true when given alone.
const SWITCHES: [&str; 3] = ["s3-path-style", INSECURE_NO_AUTH, ACCEPT_JOURNAL_LOSS];

/// The node's tokens when `--root-token-file` turns authentication on.
fn auth(flags: &[(String, String)]) -> Result<Option<Arc<Auth>>, String> {
    let knob = tuning::ROOT_TOKEN_FILE;
    // Given but empty is a mistake (an unset variable in a script), not a wish for no
    // auth: refused, so auth is never off by accident.
    let given_empty = flag_value(flags, knob.flag) == Some("")
        || (flag_value(flags, knob.flag).is_none()
            && std::env::var(knob.env).is_ok_and(|v| v.is_empty()));
    if given_empty {
        return Err(format!(
            "--{} ({}) is empty: give the path of the root token's file, or leave both unset \
             to serve without authentication",
            knob.flag, knob.env
        ));
    }
    let path = knob.resolve(flag_value(flags, knob.flag));
    if path.is_empty() {
        return Ok(None);
    }
    let root = std::fs::read_to_string(&path)
        .map_err(|e| format!("--{} {path:?} cannot be read: {e}", knob.flag))?;
    // Anyone who can read the file may do anything, and anyone who can write it may
    // choose the next start's root token: said, not refused (a container's secret mount
    // decides its own modes).
    if let Ok(meta) = std::fs::metadata(&path) {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            crate::log_line!(
                "nova: WARNING: --{} {path:?} has mode {mode:03o}: users other than its owner \
                 can read or write the root token; chmod 600 it",
                knob.flag
            );
        }
    }
    let tokens_max = usize::try_from(self::knob(flags, tuning::TOKENS_MAX)?).unwrap_or(usize::MAX);
    Ok(Some(Arc::new(Auth::with_root_token(&root, knob.flag, tokens_max)?)))
}

/// The cores this process may run on.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
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

/// Why `nova serve` did not run: a usage mistake (its flags, or their variables: exit 2),
/// or anything else (exit 1).
pub enum Failure {
    Usage(String),
    Failed(String),
}

/// Runs the server until a stop signal; `Err` says why it could not start.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let flags = flags(args).map_err(Failure::Usage)?;
    // Every knob's value, from its flag or variable, is checked before anything starts.
    for &k in tuning::KNOBS {
        knob(&flags, k).map_err(Failure::Usage)?;
    }
    let setup = configure(&flags).map_err(Failure::Usage)?;
    serve(setup).map_err(Failure::Failed)
}

/// `nova serve`'s flags: (name, value) pairs, each flag known.
fn flags(args: &[String]) -> Result<Vec<(String, String)>, String> {
    let mut flags: Vec<(String, String)> = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let Some(name) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?}\n\n{}", help()));
        };
        let (name, inline) = match name.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (name, None),
        };
        let known = tuning::TEXT_KNOBS.iter().any(|k| k.flag == name)
            || tuning::KNOBS.iter().any(|k| k.flag == name)
            || S3_FLAGS.iter().any(|(flag, _)| *flag == name)
            || SWITCHES.contains(&name);
        if !known {
            return Err(format!("unknown flag --{name}\n\n{}", help()));
        }
        let value = match inline {
            Some(value) => value,
            // The switches: alone, they mean true.
            None if SWITCHES.contains(&name)
                && rest.clone().next().is_none_or(|next| next.starts_with("--")) =>
            {
                "true".to_owned()
            }
            None => rest.next().ok_or_else(|| format!("--{name} needs a value"))?.clone(),
        };
        flags.push((name.to_owned(), value));
    }
    Ok(flags)
}

/// What `nova serve`'s flags and variables make: everything the server starts with.
struct Setup {
    listen: SocketAddr,
    data_dir: String,
    config: NodeConfig,
    server_config: ServerConfig,
    log_queue_lines: u64,
}

/// The server's setup from `flags` (and the variables): `Err` is a usage mistake.
fn configure(flags: &[(String, String)]) -> Result<Setup, String> {
    let listen_text = tuning::LISTEN.resolve(flag_value(flags, "listen"));
    let data_dir = tuning::DATA_DIR.resolve(flag_value(flags, "data-dir"));
    let listen: SocketAddr = listen_text
        .to_socket_addrs()
        .map_err(|e| format!("--listen {listen_text:?} is not an address: {e}"))?
        .next()
        .ok_or_else(|| format!("--listen {listen_text:?} resolves to no address"))?;

    let switch = |name: &str| match flag_value(flags, name) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(format!("--{name} is true or false, not {other:?}")),
    };
    let insecure = switch(INSECURE_NO_AUTH)?;
    let auth = auth(flags)?;
    match (&auth, insecure) {
        (Some(_), true) => {
            return Err(format!(
                "--{} turns authentication on and --{INSECURE_NO_AUTH} asks for none: give one",
                tuning::ROOT_TOKEN_FILE.flag
            ));
        }
        (Some(_), false) => {
            crate::log_line!(
                "nova: authentication on: every request needs a token (--{})",
                tuning::ROOT_TOKEN_FILE.flag
            );
            if !listen.ip().is_loopback() {
                crate::log_line!(
                    "nova: note: tokens cross the network in plain HTTP on {listen}; terminate \
                     TLS in front of nova (docs/auth.md)"
                );
            }
        }
        (None, false) if !listen.ip().is_loopback() => {
            return Err(format!(
                "--listen {listen} is not a loopback address, and authentication is off: \
                 anyone who can reach the port could read, write and delete every stream. \
                 Give --{} to turn it on, listen on 127.0.0.1, or pass --{INSECURE_NO_AUTH} \
                 to serve it anyway",
                tuning::ROOT_TOKEN_FILE.flag
            ));
        }
        (None, true) if !listen.ip().is_loopback() => crate::log_line!(
            "nova: WARNING: listening on {listen} without authentication \
             (--{INSECURE_NO_AUTH}): anyone who can reach the port can read, write and \
             delete every stream"
        ),
        (None, _) => {}
    }

    let mut config = NodeConfig::new(&data_dir);
    let journal_dir = tuning::JOURNAL_DIR.resolve(flag_value(flags, "journal-dir"));
    if !journal_dir.is_empty() {
        config.journal_dir = Some(journal_dir.into());
    }
    config.accept_journal_loss = switch(ACCEPT_JOURNAL_LOSS)?;
    if config.accept_journal_loss {
        crate::log_line!(
            "nova: WARNING: --{ACCEPT_JOURNAL_LOSS}: a missing journal is started anew; express \
             records only it held are lost, and their sequence numbers may be handed out again"
        );
    }
    if let Some(objects) = object_store(flags)? {
        config.objects = objects;
    }
    config.apply_knobs(&mut |k| knob(flags, k))?;
    let mut server_config = ServerConfig::new(listen);
    server_config.connections_max = knob(flags, tuning::HTTP_CONNECTIONS_MAX)?;
    server_config.auth = auth;
    let settings = &mut server_config.settings;
    settings.body_bytes_max = knob(flags, tuning::HTTP_BODY_BYTES_MAX)?;
    settings.json_body_bytes_max = knob(flags, tuning::HTTP_JSON_BODY_BYTES_MAX)?;
    settings.body_memory_bytes = knob(flags, tuning::HTTP_BODY_MEMORY_BYTES)?;
    settings.session_in_flight_max = knob(flags, tuning::HTTP_SESSION_IN_FLIGHT_MAX)?;
    // A JSON body is held twice: as it arrives, and joined for the parser.
    for (limit, times, held) in [
        (tuning::HTTP_BODY_BYTES_MAX, 1, settings.body_bytes_max),
        (tuning::HTTP_JSON_BODY_BYTES_MAX, 2, settings.json_body_bytes_max),
    ] {
        if settings.body_memory_bytes < times * held {
            return Err(format!(
                "--{} is {} bytes, below {times} x --{} ({held} bytes): a body at that limit \
                 could never be taken; raise the first or lower the second",
                tuning::HTTP_BODY_MEMORY_BYTES.flag,
                settings.body_memory_bytes,
                limit.flag
            ));
        }
    }
    server_config.settings.response_memory_bytes = knob(flags, tuning::HTTP_RESPONSE_MEMORY_BYTES)?;
    server_config.settings.head_bytes_max = knob(flags, tuning::HTTP_HEAD_BYTES_MAX)?;
    server_config.settings.idle_timeout =
        Duration::from_millis(knob(flags, tuning::HTTP_IDLE_TIMEOUT_MS)?);
    server_config.settings.shutdown_idle =
        Duration::from_millis(knob(flags, tuning::HTTP_SHUTDOWN_IDLE_MS)?);
    server_config.settings.peer_gone =
        Duration::from_millis(knob(flags, tuning::HTTP_PEER_GONE_MS)?);
    server_config.settings.log_slow = Duration::from_millis(knob(flags, tuning::HTTP_LOG_SLOW_MS)?);
    server_config.settings.log_lines_per_second = knob(flags, tuning::HTTP_LOG_LINES_PER_SECOND)?;
    server_config.settings.heartbeat =
        Duration::from_millis(knob(flags, tuning::SSE_HEARTBEAT_MS)?);

    let log_queue_lines = knob(flags, tuning::LOG_QUEUE_LINES)?;
    Ok(Setup { listen, data_dir, config, server_config, log_queue_lines })
}

/// Serves `setup` until a stop signal; `Err` says why it could not start.
fn serve(setup: Setup) -> Result<(), String> {
    let Setup { listen, data_dir, config, mut server_config, log_queue_lines } = setup;
    // A plain bind (no SO_REUSEPORT) finds a port already taken, by another nova too,
    // whose shards would otherwise share it silently; port 0 picks one free port for
    // every shard.
    let listen = probe_port(listen)?;
    server_config.listen = listen;
    crate::log::start(usize::try_from(log_queue_lines).unwrap_or(usize::MAX))
        .map_err(|e| format!("cannot start the log writer thread: {e}"))?;

    // Registered before the node starts, so a signal during start is not lost; its own
    // thread hands each on, so a second one can be heard while the first one's stop runs.
    let mut signals =
        Signals::new([SIGTERM, SIGINT]).map_err(|e| format!("cannot handle signals: {e}"))?;
    let (signal_tx, signal_rx) = flume::bounded(2);
    std::thread::Builder::new()
        .name("nova-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if signal_tx.send(signal).is_err() {
                    return;
                }
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
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
    crate::log_line!(
        "nova: {shard_count} shard{} (--shards) and one uploader thread, on {} core{}",
        if shard_count == 1 { "" } else { "s" },
        cores(),
        if cores() == 1 { "" } else { "s" },
    );
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "nova listening on http://{listen}");
        let _ = stdout.flush();
    }
    // Until a signal, the engine's troubles are logged as they start and end: the
    // engine itself writes no log.
    let (client, mut watch) = (node.client(), Watch::default());
    let signal = loop {
        match signal_rx.recv_timeout(WATCH_INTERVAL) {
            Ok(signal) => break Some(signal),
            Err(flume::RecvTimeoutError::Timeout) => watch.look(&client),
            Err(flume::RecvTimeoutError::Disconnected) => break None,
        }
    };
    if let Some(signal) = signal {
        crate::log_line!(
            "nova: signal {signal}: stopping (finishing requests in hand; a second signal \
             stops at once)"
        );
    }
    // A second signal ends the process at once, with 128 + its number. Nothing
    // acknowledged is lost (it is in the journal or the object store already); requests
    // in hand are cut unanswered, as in a crash.
    std::thread::Builder::new()
        .name("nova-signals-again".into())
        .spawn(move || {
            if let Ok(signal) = signal_rx.recv() {
                crate::log_line!("nova: signal {signal} again: exiting now, requests in hand cut");
                crate::log::flush(Duration::from_secs(1));
                std::process::exit(128 + signal);
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    node.stop();
    crate::log_line!("nova: stopped");
    Ok(())
}

/// How often the serving thread looks for trouble to log ([`Watch`]).
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What the log has been told of the engine's troubles, so that each is logged once as
/// it starts and once as it ends: a failed shard (until a restart) and object PUTs
/// failing (the store down or refusing).
#[derive(Default)]
struct Watch {
    shard_failed: bool,
    store_failing: bool,
}

impl Watch {
    fn look(&mut self, client: &engine::node::Client) {
        if !self.shard_failed
            && let Some(why) = client.failed()
        {
            self.shard_failed = true;
            crate::log_line!(
                "nova: {why} failed: it acknowledges nothing more until nova is restarted"
            );
        }
        let uploader = client.uploader_stats();
        match (uploader.failing_for, self.store_failing) {
            (Some(failing_for), false) => {
                self.store_failing = true;
                crate::log_line!(
                    "nova: object store failing: {} PUTs retrying for {} ms, standard appends wait: {}",
                    uploader.puts_failing,
                    failing_for.as_millis(),
                    uploader.last_put_error.as_deref().unwrap_or("no error recorded"),
                );
            }
            (None, true) => {
                self.store_failing = false;
                crate::log_line!("nova: object store takes PUTs again");
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_knob_is_read_by_exactly_one_part_of_the_server() {
        let mut read: Vec<&str> = engine::node::engine_knobs().iter().map(|k| k.flag).collect();
        read.extend(HTTP_KNOBS.iter().map(|k| k.flag));
        read.extend(S3_KNOBS.iter().map(|k| k.flag));
        read.sort_unstable();
        let mut all: Vec<&str> = tuning::KNOBS.iter().map(|k| k.flag).collect();
        all.sort_unstable();
        assert_eq!(read, all, "a knob no part reads (or two read) is a flag that does nothing");
    }
}
