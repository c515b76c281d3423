//! Appends (and reads back) over loopback HTTP to a real `nova serve` child process
//! (1 KiB records, express streams), in JSON and in the binary framing
//! (`application/x-nova-records`), next to raw loopback TCP measured in the same run.
//!
//! The reference is what loopback gives one TCP connection with nothing of nova or HTTP
//! in the way: a sender thread writing 128 KiB buffers to a receiver thread that
//! discards them (what `iperf3 -c 127.0.0.1` measures). The appends' content bytes per
//! second are ratios to it.
//!
//! The client is a minimal HTTP/1.1 keep-alive client of this file: each connection is a
//! closed loop on its own thread (send one append, read its response, send the next),
//! so latency is per append from the first byte sent to the last byte of the response.
//! The server is the `nova` found next to this binary (`target/ci/nova`, or
//! `target/release/nova` for a release build); the bench never builds it.
//!
//! The binary framing once more in append sessions (one streamed request carrying many
//! batches, acknowledged in order: `docs/api.md`), through the Rust client that `nova
//! append` and the load generator use, to one stream.
//!
//! A second reference, for the binary cases: the same producers appending the same
//! batches to a node in this process (no HTTP, no sockets), which tells the server's
//! cost from the engine's. And the binary cases once more against a server with auth on
//! (every request carrying a token), as a ratio to the same case with auth off: what
//! checking tokens costs.
//!
//! After the binary one-stream case of 64-record batches, on its server, the stream is
//! read back in binary pages by a few closed-loop readers: what a read costs, and how
//! close to loopback a page goes (answers are written from the page's own buffer).
//!
//! Before the cases, the binary one-stream case of 64-record batches runs once, not
//! reported: the first large case of a run used to come out low, often by half.
//!
//! Every case also reports the CPU it cost per GB of content, the server's and the
//! client's apart (`/proc/<pid>/stat` around the measured time), next to what the
//! loopback reference spends per GB. On a machine whose cores are shared by both sides,
//! those sums bound the throughput: cores / (server + client core-seconds per GB).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use engine::framing::{AppendBuilder, AppendConditions};

use crate::harness::{self, Percentiles, Warmup};

const RECORD_BYTES: usize = 1024;
/// Keep-alive connections, each a closed-loop producer on its own thread. HTTP/1.1 has
/// one request in flight per connection, so this is the load's concurrency: at 16 the
/// server waited on group commits with a fifth of the machine idle; 64 keep it busy.
const CONNECTIONS: usize = 64;
const BINARY_MEDIA_TYPE: &str = "application/x-nova-records";
/// Append sessions of a session case (the Rust client's, each on its connection), and
/// the batches each keeps in flight: as many in flight as the request cases' connections.
const SESSIONS: usize = 4;
const SESSION_IN_FLIGHT: usize = CONNECTIONS / SESSIONS;
/// Reader connections of the read-back cases, each a closed loop of page reads.
const READERS: usize = 4;
/// Records (1 KiB each) per page of the read-back cases: 1 MiB and 16 MiB of content,
/// the binary framing's largest page.
const READ_PAGES: [u64; 2] = [1024, 16_384];
/// The bucket every case's streams are in (express, created on append).
const BUCKET: &str = "bench";
/// The root token of the auth-on servers.
const BENCH_ROOT_TOKEN: &str = "bench-root-token-0123456789abcdef";

struct Durations {
    warmup: Duration,
    /// An append case warms up past `warmup` until its shard's memory budget has filled
    /// ([`memory_filled`]), for at most this long.
    warmup_max: Duration,
    measure: Duration,
    /// One pass of the loopback reference (the best of `reference_passes` counts).
    reference: Duration,
    reference_passes: u32,
    /// Groups of 16 MiB in one pass of the raw disk reference (`journal::raw_reference`).
    disk_groups: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Binary,
    /// The binary framing in append sessions (`docs/api.md`): [`SESSIONS`] streamed
    /// requests, each keeping [`SESSION_IN_FLIGHT`] batches in flight.
    Session,
}

impl Format {
    fn label(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::Binary => "binary",
            Format::Session => "binary, sessions",
        }
    }
}

#[derive(Clone, Copy)]
struct Case {
    format: Format,
    streams: usize,
    records: usize,
}

/// A read-back case: pages of `page_records` records, as many as the stream held.
struct ReadOutcome {
    page_records: u64,
    pages_per_second: f64,
    content_bytes_per_second: f64,
    latency: Percentiles,
    server_cpu_per_gb: f64,
    client_cpu_per_gb: f64,
}

struct Outcome {
    appends_per_second: f64,
    content_bytes_per_second: f64,
    request_bytes_per_second: f64,
    latency: Percentiles,
    refused: u64,
    /// CPU seconds per GB of content in the measured time: the server process's, and this
    /// process's (the client's). In process, the engine and its producers are all
    /// `server`, and `client` is zero.
    server_cpu_per_gb: f64,
    client_cpu_per_gb: f64,
    /// Bytes written to the data directory's disk in the measured time per byte of
    /// content (every writer on the machine: the server's journal, objects and their
    /// writeback, and what an earlier case left to settle); `None` with no device.
    disk_per_content: Option<f64>,
}

impl Outcome {
    /// A closed loop of appends of `records` records each, `request_bytes` on the wire.
    fn of(run: &harness::ClosedLoop, spent: &Spent, records: usize, request_bytes: usize) -> Self {
        let content = run.total((records * RECORD_BYTES) as u64);
        let (server_cpu_per_gb, client_cpu_per_gb) = spent.per_gb(content);
        Outcome {
            appends_per_second: run.rate(1),
            content_bytes_per_second: run.rate((records * RECORD_BYTES) as u64),
            request_bytes_per_second: run.rate(request_bytes as u64),
            latency: Percentiles::of(&run.latency),
            refused: run.refused,
            server_cpu_per_gb,
            client_cpu_per_gb,
            disk_per_content: spent.disk_per_content(content),
        }
    }
}

/// What a case spent, read when the measured time starts and again at its end: the CPU
/// of the server (a child process, or this one) and of this process (`per_gb`: core-
/// seconds per GB), and the bytes written to the data directory's disk
/// (`disk_per_content`).
struct Spent {
    server: Option<u32>,
    started: Option<(Duration, Duration)>,
    /// The data directory's disk, and its bytes written when measuring began.
    disk: Option<harness::Disk>,
    disk_started: Option<u64>,
}

impl Spent {
    fn of(server: Option<u32>, data_dir: &Path) -> Self {
        Self { server, started: None, disk: harness::Disk::of(data_dir), disk_started: None }
    }

    fn start(&mut self) {
        self.started = Some(self.now());
        self.disk_started = self.disk.and_then(|disk| disk.bytes_written());
    }

    /// Bytes written to the disk since `start` per byte of `content`.
    fn disk_per_content(&self, content: f64) -> Option<f64> {
        let now = self.disk?.bytes_written()?;
        Some((now - self.disk_started?) as f64 / content)
    }

    fn now(&self) -> (Duration, Duration) {
        let client = harness::cpu_time(None);
        match self.server {
            Some(pid) => (harness::cpu_time(Some(pid)), client),
            None => (client, Duration::ZERO),
        }
    }

    /// (server, client) core-seconds per GB since `start`, over `bytes` of content.
    fn per_gb(&self, bytes: f64) -> (f64, f64) {
        let (server_then, client_then) = self.started.expect("started when measuring began");
        let (server, client) = self.now();
        (
            harness::cpu_per_gb(server - server_then, bytes),
            harness::cpu_per_gb(client - client_then, bytes),
        )
    }
}

/// A `nova serve` child on a loopback port; stopped with SIGTERM when dropped.
struct Server {
    child: Child,
    authority: String,
    /// The `Authorization` header value every request carries (auth on), if any.
    authorization: Option<String>,
    log: PathBuf,
    data_dir: PathBuf,
    // Held so the server's stdout stays open while it runs.
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    /// A server on `data_dir`; with `root_token`, auth on and every request carrying it.
    fn start(binary: &Path, data_dir: &Path, root_token: Option<&str>) -> Result<Self, String> {
        let log = data_dir.with_extension("log");
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let mut auth_args = Vec::new();
        if let Some(token) = root_token {
            let file = data_dir.with_extension("root-token");
            std::fs::write(&file, token).map_err(|e| format!("write {}: {e}", file.display()))?;
            auth_args = vec!["--root-token-file".into(), file.into_os_string()];
        }
        let mut child = Command::new(binary)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(auth_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("start {}: {e}", binary.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            let read = stdout.read_line(&mut line).map_err(|e| format!("nova's stdout: {e}"))?;
            if read == 0 {
                let _ = child.wait();
                let log_text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("nova serve exited before it listened: {log_text}"));
            }
            if let Some(url) = line.trim().strip_prefix("nova listening on http://") {
                let authority = url.to_owned();
                let authorization = root_token.map(|token| format!("Bearer {token}"));
                let data_dir = data_dir.to_owned();
                return Ok(Server {
                    child,
                    authority,
                    authorization,
                    log,
                    data_dir,
                    _stdout: stdout,
                });
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) with a pid this process started and has not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One keep-alive HTTP/1.1 connection.
struct Connection {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    /// Header lines every request carries (`Authorization`, with auth on).
    headers: String,
    request: Vec<u8>,
    body: Vec<u8>,
}

impl Connection {
    fn open(server: &Server) -> io::Result<Self> {
        let stream = TcpStream::connect(&server.authority)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let reader = BufReader::with_capacity(64 << 10, stream.try_clone()?);
        let headers = server
            .authorization
            .as_ref()
            .map(|value| format!("Authorization: {value}\r\n"))
            .unwrap_or_default();
        Ok(Self { writer: stream, reader, headers, request: Vec::new(), body: Vec::new() })
    }

    /// Sends a POST and reads its whole response; returns the status (the body is in
    /// `self.body`).
    fn post(&mut self, path: &str, content_type: &str, body: &[u8]) -> io::Result<u16> {
        self.request.clear();
        write!(
            self.request,
            "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: {content_type}\r\n{}\
             Content-Length: {}\r\n\r\n",
            self.headers,
            body.len()
        )?;
        self.request.extend_from_slice(body);
        self.writer.write_all(&self.request)?;
        self.read_response()
    }

    /// Sends a GET and reads its whole response; returns the status (the body is in
    /// `self.body`).
    fn get(&mut self, path: &str, accept: &str) -> io::Result<u16> {
        self.request.clear();
        write!(
            self.request,
            "GET {path} HTTP/1.1\r\nHost: bench\r\nAccept: {accept}\r\n{}\r\n",
            self.headers
        )?;
        self.writer.write_all(&self.request)?;
        self.read_response()
    }

    fn read_response(&mut self) -> io::Result<u16> {
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| bad(format!("status line {line:?}")))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else { continue };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.parse::<usize>().map_err(|_| bad(line.clone()))?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            }
        }
        self.body.clear();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| bad(format!("chunk size {line:?}")))?;
                let at = self.body.len();
                self.body.resize(at + size + 2, 0);
                self.reader.read_exact(&mut self.body[at..])?;
                self.body.truncate(at + size);
                if size == 0 {
                    break;
                }
            }
        } else {
            let length = length.ok_or_else(|| bad("a response without a length".into()))?;
            self.body.resize(length, 0);
            self.reader.read_exact(&mut self.body)?;
        }
        Ok(status)
    }
}

impl Durations {
    /// An append case's warm-up: at least `warmup`, then until `filled` (its shard's
    /// memory budget has filled), at most `warmup_max`.
    fn appends_warmup<'a>(&self, filled: &'a dyn Fn() -> bool) -> Warmup<'a> {
        Warmup { min: self.warmup, max: self.warmup_max, warm: filled }
    }
}

/// Whether a shard holds nine tenths of its memory budget (`--shard-memory-bytes`) of
/// `held`: its cache has filled, and the appends from then on reuse the memory of the
/// chunks they evict. Until then every chunk is memory touched for the first time, which
/// on these virtual machines costs 1 to 4 CPU seconds per GiB (docs/benchmarks.md): a
/// case measured while a new server fills a 1 GiB budget measures that.
fn memory_filled(held: impl Iterator<Item = u64>, budget: u64) -> bool {
    held.max().is_some_and(|held| held >= budget / 10 * 9)
}

/// [`memory_filled`] for `server`, from its `/metrics`, its budget the default or
/// `NOVA_SHARD_MEMORY_BYTES`, which it inherits.
fn server_memory_filled(server: &Server) -> bool {
    let budget = tuning::SHARD_MEMORY_BYTES.resolve(None).expect("a valid NOVA_SHARD_MEMORY_BYTES");
    let mut connection = Connection::open(server).expect("connect to nova");
    let status = connection.get("/metrics", "text/plain").expect("GET /metrics");
    assert_eq!(status, 200, "GET /metrics: {}", String::from_utf8_lossy(&connection.body));
    let text = String::from_utf8_lossy(&connection.body);
    let held = text.lines().filter_map(|line| {
        line.strip_prefix("nova_shard_memory_bytes_held{")?.rsplit(' ').next()?.parse().ok()
    });
    memory_filled(held, budget)
}

/// A request body of `records` 1 KiB records, and its content type.
fn append_body(format: Format, records: usize) -> (&'static str, Vec<u8>) {
    match format {
        Format::Binary => {
            let body = vec![0x42u8; RECORD_BYTES];
            let mut builder = AppendBuilder::new();
            for _ in 0..records {
                builder.push::<&[u8], &[u8]>(&[], &body).expect("fits");
            }
            (BINARY_MEDIA_TYPE, builder.finish(&AppendConditions::default()))
        }
        Format::Json | Format::Session => {
            assert!(format == Format::Json, "a session's batches are the client's");
            let body = "b".repeat(RECORD_BYTES);
            let record = format!("{{\"body\":\"{body}\"}}");
            let json = format!("{{\"records\":[{}]}}", vec![record; records].join(","));
            ("application/json", json.into_bytes())
        }
    }
}

fn run_case(server: &Server, case: Case, durations: &Durations) -> Outcome {
    if case.format == Format::Session {
        return run_session_case(server, case, durations);
    }
    let (content_type, body) = append_body(case.format, case.records);
    let body = Arc::new(body);
    let tag = match case.format {
        Format::Json => "json",
        _ => "bin",
    };
    let mut spent = Spent::of(Some(server.child.id()), &server.data_dir);
    let filled = || server_memory_filled(server);
    let run = harness::closed_loop(
        CONNECTIONS,
        durations.appends_warmup(&filled),
        durations.measure,
        |c| {
            let body = Arc::clone(&body);
            let paths: Vec<String> = (0..case.streams)
                .map(|s| {
                    format!(
                        "/v1/streams/{BUCKET}/{tag}-{}-{}-{s}/records",
                        case.streams, case.records
                    )
                })
                .collect();
            let mut connection = Connection::open(server).expect("connect to nova");
            let mut turn = c;
            move || {
                let path = &paths[turn % paths.len()];
                turn += CONNECTIONS;
                match connection.post(path, content_type, &body).expect("append") {
                    200 => true,
                    429 | 503 => {
                        thread::sleep(Duration::from_millis(1));
                        false
                    }
                    other => panic!(
                        "append to {path}: {other} {}",
                        String::from_utf8_lossy(&connection.body)
                    ),
                }
            }
        },
        || spent.start(),
    );
    Outcome::of(&run, &spent, case.records, body.len())
}

/// A session case: [`SESSIONS`] append sessions of the Rust client (`net::client`), each
/// a closed loop that keeps [`SESSION_IN_FLIGHT`] batches in flight (a turn sends one
/// and takes the oldest one's ack), the streams shared among them; latency from a
/// batch's submit to its ack.
fn run_session_case(server: &Server, case: Case, durations: &Durations) -> Outcome {
    use harness::Turn;
    use net::client::{Address, Batch, Client, Conditions};
    let url = format!("http://{}", server.authority);
    let client = Client::new(&url).expect("the server's url");
    let mut batch = Batch::new();
    let body = vec![0x42u8; RECORD_BYTES];
    for _ in 0..case.records {
        batch.push::<&[u8], &[u8]>(&[], &body).expect("a record fits");
    }
    // What goes on the wire per batch: its length, then the same append body.
    let request_bytes = append_body(Format::Binary, case.records).1.len() + 4;
    let mut spent = Spent::of(Some(server.child.id()), &server.data_dir);
    let filled = || server_memory_filled(server);
    let run = harness::closed_loop(
        SESSIONS,
        durations.appends_warmup(&filled),
        durations.measure,
        |s| {
            let key = format!("session-{}-{}-{}", case.streams, case.records, s % case.streams);
            let address = Address::new(BUCKET, &key);
            let mut session =
                client.append_session(&address, SESSION_IN_FLIGHT).expect("open a session");
            let batch = batch.clone();
            move || {
                session.submit(&batch, &Conditions::default()).expect("submit a batch");
                if session.pending() < SESSION_IN_FLIGHT {
                    return Turn::Sent;
                }
                let ack = session.recv().expect("a batch is pending");
                match ack.result {
                    Ok(_) => Turn::AckedAfter(ack.latency),
                    Err(net::client::Error::Api(api)) if api.retry_after_seconds.is_some() => {
                        Turn::Refused
                    }
                    Err(error) => panic!("append session to {key}: {error}"),
                }
            }
        },
        || spent.start(),
    );
    Outcome::of(&run, &spent, case.records, request_bytes)
}

/// The records stream `key` holds: its tail's seq_num (CheckTail).
fn records_in(server: &Server, key: &str) -> u64 {
    let mut connection = Connection::open(server).expect("connect to nova");
    let path = format!("/v1/streams/{BUCKET}/{key}/tail");
    let status = connection.get(&path, "application/json").expect("check the tail");
    let body = String::from_utf8_lossy(&connection.body);
    assert_eq!(status, 200, "GET {path}: {body}");
    let (_, after) = body.split_once("\"seq_num\":").expect("a tail with a seq_num");
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a seq_num")
}

/// The records of a binary read page that starts at `start`: up to its page end's
/// `next_seq_num`. A page may end before its `count` (at most `--read-page-loads-max`
/// chunks not in memory are loaded for one page), so what was read is counted.
fn records_read(page: &[u8], start: u64) -> Option<u64> {
    let mut at = 0;
    while let Some((frame, used)) = engine::framing::decode_frame(&page[at..]).ok()? {
        if let engine::framing::Frame::PageEnd { next_seq_num, .. } = frame {
            return next_seq_num.checked_sub(start);
        }
        at += used;
    }
    None
}

/// Reads stream `key` back in binary pages of `page_records` records (fewer when it
/// holds fewer): [`READERS`] closed loops, each from its own place, going round it.
fn read_back(server: &Server, key: &str, page_records: u64, durations: &Durations) -> ReadOutcome {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let held = records_in(server, key);
    let page_records = page_records.min(held).max(1);
    let pages = (held / page_records).max(1);
    // Records read in the measured time, by every reader (pages may end early).
    let measuring = Arc::new(AtomicBool::new(false));
    let records = Arc::new(AtomicU64::new(0));
    let mut spent = Spent::of(Some(server.child.id()), &server.data_dir);
    let run = harness::closed_loop(
        READERS,
        Warmup::fixed(durations.warmup),
        durations.measure,
        |reader| {
            let mut connection = Connection::open(server).expect("connect to nova");
            let mut page = reader as u64 * pages / READERS as u64;
            let key = key.to_owned();
            let (measuring, records) = (Arc::clone(&measuring), Arc::clone(&records));
            move || {
                let start = page % pages * page_records;
                page += 1;
                let path = format!(
                    "/v1/streams/{BUCKET}/{key}/records?seq_num={start}&count={page_records}"
                );
                match connection.get(&path, BINARY_MEDIA_TYPE).expect("read") {
                    200 => {
                        let read = records_read(&connection.body, start)
                            .unwrap_or_else(|| panic!("{path}: a page without its page end"));
                        if measuring.load(Ordering::Relaxed) {
                            records.fetch_add(read, Ordering::Relaxed);
                        }
                        true
                    }
                    429 | 503 => {
                        thread::sleep(Duration::from_millis(1));
                        false
                    }
                    other => {
                        panic!("read {path}: {other} {}", String::from_utf8_lossy(&connection.body))
                    }
                }
            }
        },
        || {
            measuring.store(true, Ordering::Relaxed);
            spent.start();
        },
    );
    let content = (records.load(Ordering::Relaxed) * RECORD_BYTES as u64) as f64;
    let (server_cpu_per_gb, client_cpu_per_gb) = spent.per_gb(content);
    ReadOutcome {
        page_records,
        pages_per_second: run.rate(1),
        content_bytes_per_second: content / run.elapsed.as_secs_f64(),
        latency: Percentiles::of(&run.latency),
        server_cpu_per_gb,
        client_cpu_per_gb,
    }
}

/// The same case through a node in this process (no HTTP, no sockets): what the engine
/// alone gives these producers, to tell the server's cost from the engine's.
fn in_process(data_dir: &Path, case: Case, durations: &Durations) -> Outcome {
    use engine::names::{BucketName, StreamKey};
    use engine::node::{Node, NodeConfig};
    use engine::options::{BucketConfigRequest, StorageClass, StreamOptionsRequest};
    use engine::shard::AppendRequest;
    use futures_lite::future::block_on;

    // The knobs `nova serve` would take from this environment, so both sides compare alike.
    let mut config = NodeConfig::new(data_dir);
    config
        .apply_knobs(&mut |knob| knob.resolve(None).map_err(|e| e.message))
        .expect("the NOVA_* knobs in the environment are valid");
    let budget = config.shard.memory_budget_bytes;
    let node = Node::start(config).expect("in-process node");
    let client = node.client();
    let bucket = BucketName::parse(BUCKET).expect("bucket");
    let request = BucketConfigRequest {
        create_stream_on_append: true,
        defaults: StreamOptionsRequest { class: Some(StorageClass::Express), ..Default::default() },
        ..Default::default()
    };
    block_on(client.control().create_bucket(&bucket, &request, None)).expect("bucket");
    let (_, framed) = append_body(Format::Binary, case.records);
    let framed = engine::framing::FramedBody::from(framed);
    let mut spent = Spent::of(None, data_dir);
    let filled = || {
        let stats = block_on(client.stats()).expect("the node's stats");
        memory_filled(stats.iter().map(|shard| shard.memory_held), budget)
    };
    let run = harness::closed_loop(
        CONNECTIONS,
        durations.appends_warmup(&filled),
        durations.measure,
        |c| {
            let (client, bucket) = (client.clone(), bucket.clone());
            let keys: Vec<StreamKey> = (0..case.streams)
                .map(|s| StreamKey::parse(&format!("in-{}-{}-{s}", case.streams, case.records)))
                .collect::<Result<_, _>>()
                .expect("keys");
            let request = AppendRequest { framed: framed.clone(), offered: None };
            let mut turn = c;
            move || {
                let key = &keys[turn % keys.len()];
                turn += CONNECTIONS;
                match block_on(client.append(&bucket, key, request.clone())) {
                    Ok(_) => true,
                    // As the server answers 429: the budget full of chunks not yet in
                    // the store.
                    Err(error) if error.code() == engine::error::Code::ResourceExhausted => {
                        thread::sleep(Duration::from_millis(1));
                        false
                    }
                    Err(error) => panic!("append: {error}"),
                }
            }
        },
        || spent.start(),
    );
    let outcome = Outcome::of(&run, &spent, case.records, framed.len());
    drop(client);
    node.stop();
    outcome
}

/// One loopback TCP connection: the bytes per second of the best of `passes`, and the
/// CPU seconds per GB its sender and receiver spent in that pass.
struct Loopback {
    bytes_per_second: f64,
    cpu_per_gb: f64,
}

fn loopback_reference(pass: Duration, passes: u32) -> Loopback {
    let mut best = Loopback { bytes_per_second: 0.0, cpu_per_gb: 0.0 };
    for _ in 0..passes {
        let cpu_before = harness::cpu_time(None);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("address");
        let receiver = thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut buf = vec![0u8; 256 << 10];
            let mut received = 0u64;
            loop {
                match stream.read(&mut buf) {
                    Ok(0) => return received,
                    Ok(n) => received += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => panic!("loopback receive: {e}"),
                }
            }
        });
        let mut sender = TcpStream::connect(addr).expect("connect loopback");
        let buf = vec![0x5au8; 128 << 10];
        let started = Instant::now();
        while started.elapsed() < pass {
            sender.write_all(&buf).expect("loopback send");
        }
        drop(sender);
        let received = receiver.join().expect("receiver");
        let bytes_per_second = received as f64 / started.elapsed().as_secs_f64();
        if bytes_per_second > best.bytes_per_second {
            let cpu = harness::cpu_time(None) - cpu_before;
            best = Loopback {
                bytes_per_second,
                cpu_per_gb: harness::cpu_per_gb(cpu, received as f64),
            };
        }
    }
    best
}

/// The knobs set in this environment (`NOVA_*`), which the server and the in-process node
/// both take; "defaults" when there are none.
fn knobs_from_environment() -> String {
    let set: Vec<String> = tuning::KNOBS
        .iter()
        .filter_map(|knob| {
            std::env::var(knob.env).ok().map(|value| format!("{}={value}", knob.env))
        })
        .collect();
    if set.is_empty() { "defaults".to_owned() } else { set.join(", ") }
}

/// `nova` next to this binary (`target/ci/nova` when this is `target/ci/bench`).
fn server_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let dir = exe.parent().ok_or("this binary has no directory")?;
    let nova = dir.join("nova");
    if nova.is_file() {
        Ok(nova)
    } else {
        Err(format!(
            "{} is missing: the http suite runs the real server and never builds it. Build it \
             first with `cargo build --profile ci -p net --bin nova` (./scripts/check's test \
             step builds it too)",
            nova.display()
        ))
    }
}

/// Runs `case` against a new server on `data_dir` with the bench's bucket, then stops the
/// server and removes its data.
fn on_a_fresh_server<T>(
    binary: &Path,
    data_dir: &Path,
    root_token: Option<&str>,
    case: impl FnOnce(&Server) -> T,
) -> Result<T, String> {
    let server = Server::start(binary, data_dir, root_token)?;
    create_bucket(&server, BUCKET)?;
    let outcome = case(&server);
    drop(server);
    let _ = std::fs::remove_dir_all(data_dir);
    Ok(outcome)
}

fn create_bucket(server: &Server, bucket: &str) -> Result<(), String> {
    let mut connection = Connection::open(server)
        .map_err(|e| format!("connect to nova at {}: {e}", server.authority))?;
    let status = connection
        .post(
            &format!("/v1/buckets/{bucket}"),
            "application/json",
            br#"{"create_stream_on_append":true,"default_class":"express"}"#,
        )
        .map_err(|e| format!("create bucket {bucket}: {e}"))?;
    if !(200..300).contains(&status) {
        return Err(format!(
            "create bucket {bucket}: {status} {}",
            String::from_utf8_lossy(&connection.body)
        ));
    }
    Ok(())
}

pub fn run(quick: bool) -> Result<(), String> {
    let binary = match server_binary() {
        Ok(binary) => binary,
        Err(why) if quick => {
            println!("\nhttp: skipped: {why}");
            return Ok(());
        }
        Err(why) => return Err(why),
    };
    let durations = if quick {
        Durations {
            warmup: Duration::from_millis(20),
            warmup_max: Duration::from_millis(20),
            measure: Duration::from_millis(100),
            reference: Duration::from_millis(100),
            reference_passes: 1,
            disk_groups: 2,
        }
    } else {
        Durations {
            warmup: Duration::from_millis(500),
            warmup_max: Duration::from_secs(10),
            measure: Duration::from_secs(3),
            reference: Duration::from_secs(1),
            reference_passes: 3,
            disk_groups: 48,
        }
    };
    // On the real disk (not a tmpfs): express appends are acknowledged from its journal.
    let dir = std::env::current_dir().expect("cwd").join("target").join("bench-http");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;

    let loopback_before = loopback_reference(durations.reference, durations.reference_passes);
    let disk_before = crate::journal::raw_reference(&dir, durations.disk_groups);
    let mut cases = Vec::new();
    for format in [Format::Binary, Format::Json] {
        for streams in [1, 100] {
            for records in [1, 64] {
                cases.push(Case { format, streams, records });
            }
        }
    }
    // A session is one stream's, so sessions to 100 streams would be 100 sessions of a
    // batch or two in flight each: what the request cases already measure.
    for records in [1, 64] {
        cases.push(Case { format: Format::Session, streams: 1, records });
    }
    // Each case on a server of its own, as the engine alone below: a case does not pay
    // for the settling of the ones before it. The binary cases also run against a server
    // with auth on (every request carrying a token), each right after the same case with
    // auth off, so that neither side gets the quieter minutes of a noisy machine.
    // The first case of large batches in a run came out low, often by half (the same
    // case right after it, with auth on, 1.8 times it): the machine's first minutes of
    // heavy writing, not the case. One run of it first, not reported, takes that.
    if !quick {
        let priming = Case { format: Format::Binary, streams: 1, records: 64 };
        on_a_fresh_server(&binary, &dir.join("data-priming"), None, |server| {
            run_case(server, priming, &durations)
        })?;
    }
    let mut outcomes = Vec::with_capacity(cases.len());
    let mut auth_cases = Vec::new();
    let mut reads = Vec::new();
    for (i, &case) in cases.iter().enumerate() {
        // The binary one-stream case of 64-record batches is then read back.
        let read_back_after =
            case.format == Format::Binary && case.streams == 1 && case.records == 64;
        let (outcome, read) =
            on_a_fresh_server(&binary, &dir.join(format!("data-{i}")), None, |server| {
                let outcome = run_case(server, case, &durations);
                let key = format!("bin-{}-{}-0", case.streams, case.records);
                let read = read_back_after
                    .then(|| READ_PAGES.map(|page| read_back(server, &key, page, &durations)));
                (outcome, read)
            })?;
        outcomes.push(outcome);
        reads.extend(read.into_iter().flatten());
        if case.format == Format::Binary {
            let data_dir = dir.join(format!("data-{i}-auth"));
            let outcome =
                on_a_fresh_server(&binary, &data_dir, Some(BENCH_ROOT_TOKEN), |server| {
                    run_case(server, case, &durations)
                })?;
            auth_cases.push((case, outcome));
        }
    }
    // The engine alone, for the binary cases: same producers, same streams, same disk.
    let engine_alone: Vec<Option<Outcome>> = cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            (case.format == Format::Binary)
                .then(|| in_process(&dir.join(format!("in-process-{i}")), *case, &durations))
        })
        .collect();
    let loopback_after = loopback_reference(durations.reference, durations.reference_passes);
    let disk = disk_before.max(crate::journal::raw_reference(&dir, durations.disk_groups));
    let loopback_cpu_per_gb = [&loopback_before, &loopback_after]
        .into_iter()
        .max_by(|a, b| a.bytes_per_second.total_cmp(&b.bytes_per_second))
        .expect("two passes")
        .cpu_per_gb;
    let (loopback_before, loopback_after) =
        (loopback_before.bytes_per_second, loopback_after.bytes_per_second);
    let loopback = loopback_before.max(loopback_after);
    let cores = thread::available_parallelism().map_or(1, |n| n.get());

    let primed = if quick {
        ""
    } else {
        ", and before the cases one unreported run of the binary one-stream case of \
         64-record batches (the first large case of a run came out low)"
    };
    println!("\n### Appends over loopback HTTP to `nova serve` (express, 1 KiB records)\n");
    println!(
        "Server: {} (knobs: {}), a new one for each case (and the engine alone a new \
         node), its data under target/bench-http. Client: {CONNECTIONS} keep-alive connections, each a closed loop \
         on its own thread (sessions: {SESSIONS} append sessions of the Rust client, each \
         keeping {SESSION_IN_FLIGHT} batches in flight, latency from submit to ack); {:.1} s measured per case after a warm-up of at least {:.1} s, then until the \
         shard holds nine tenths of its memory budget (its cache full: appends then reuse \
         memory rather than touch new pages), at most {:.1} s{primed}. Reference in \
         the same run: one loopback TCP connection, 128 KiB writes, best of {} passes of \
         {:.1} s before and after the cases: {:.0} MB/s (before {:.0}, after {:.0}), its \
         sender and receiver spending {loopback_cpu_per_gb:.2} core-seconds per GB. CPU \
         columns: core-seconds per GB of content in the measured time (`/proc/<pid>/stat`), \
         the server process's and the client's (this process); in process, the node and \
         its producers together. {cores} cores: at server + client core-seconds per GB, \
         the most the machine can carry is {cores} / (their sum) GB/s. Disk: the bytes \
         written to the data directory's disk in the measured time (`/proc/diskstats`, every \
         writer) per byte of content, and at that many, what the raw disk allows: 1 MiB \
         O_DIRECT writes, an fdatasync per 16, best of before and after the cases: \
         {:.0} MB/s.\n",
        binary.display(),
        knobs_from_environment(),
        durations.measure.as_secs_f64(),
        durations.warmup.as_secs_f64(),
        durations.warmup_max.as_secs_f64(),
        durations.reference_passes,
        durations.reference.as_secs_f64(),
        loopback / 1e6,
        loopback_before / 1e6,
        loopback_after / 1e6,
        disk / 1e6,
    );
    let header = "| format | streams | records per batch | appends/s | MB/s content | \
         MB/s of requests | ratio to loopback (content) | p50 µs | p99 µs | refused | \
         server CPU s/GB | client CPU s/GB | CPU bound MB/s | disk bytes per content byte | \
         disk bound MB/s | engine alone MB/s | engine alone p50 µs | engine alone CPU s/GB | \
         engine alone disk bytes per content byte | HTTP / engine alone |";
    // One alignment cell per column: the first left, the figures right.
    let columns = header.matches('|').count() - 1;
    println!("{header}\n|---|{}", "---:|".repeat(columns - 1));
    for ((case, outcome), alone) in cases.iter().zip(&outcomes).zip(&engine_alone) {
        let alone_text = match alone {
            Some(alone) => format!(
                "{:.1} | {} | {:.2} | {} | {:.2}",
                alone.content_bytes_per_second / 1e6,
                alone.latency.p50,
                alone.server_cpu_per_gb + alone.client_cpu_per_gb,
                alone.disk_per_content.map_or("–".to_owned(), |per| format!("{per:.2}")),
                outcome.content_bytes_per_second / alone.content_bytes_per_second
            ),
            None => "– | – | – | – | –".to_owned(),
        };
        let cpu_bound =
            cores as f64 / (outcome.server_cpu_per_gb + outcome.client_cpu_per_gb) * 1e3;
        let disk_text = match outcome.disk_per_content {
            Some(per) => format!("{per:.2} | {:.0}", disk / per / 1e6),
            None => "– | –".to_owned(),
        };
        println!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.3} | {} | {} | {} | {:.2} | {:.2} | \
             {cpu_bound:.0} | {disk_text} | {alone_text} |",
            case.format.label(),
            case.streams,
            case.records,
            outcome.appends_per_second,
            outcome.content_bytes_per_second / 1e6,
            outcome.request_bytes_per_second / 1e6,
            outcome.content_bytes_per_second / loopback,
            outcome.latency.p50,
            outcome.latency.p99,
            outcome.refused,
            outcome.server_cpu_per_gb,
            outcome.client_cpu_per_gb,
        );
    }
    let target = cases
        .iter()
        .zip(&outcomes)
        .filter(|(case, _)| case.format != Format::Json && case.records == 64)
        .map(|(case, outcome)| {
            let disk_bound = match outcome.disk_per_content {
                Some(per) => format!(", the disk's bound {:.2}", disk / per / loopback),
                None => String::new(),
            };
            let sessions = if case.format == Format::Session { " in sessions" } else { "" };
            format!(
                "{} stream(s){sessions}: {:.2}{disk_bound}",
                case.streams,
                outcome.content_bytes_per_second / loopback
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "\nTarget (issue 6): binary 64-record batches at 0.40 of raw loopback or more: {target}."
    );
    println!(
        "\nWith auth on (`--root-token-file`, every request carrying the root token; each case \
         run right after the same case with auth off), binary cases:\n"
    );
    println!(
        "| streams | records per batch | appends/s | p50 µs | p99 µs | server CPU s/GB | \
         appends/s / auth off |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (case, outcome) in &auth_cases {
        let off = cases
            .iter()
            .zip(&outcomes)
            .find(|(c, _)| {
                c.format == case.format && c.streams == case.streams && c.records == case.records
            })
            .map(|(_, off)| off.appends_per_second)
            .unwrap_or(f64::NAN);
        println!(
            "| {} | {} | {:.0} | {} | {} | {:.2} | {:.2} |",
            case.streams,
            case.records,
            outcome.appends_per_second,
            outcome.latency.p50,
            outcome.latency.p99,
            outcome.server_cpu_per_gb,
            outcome.appends_per_second / off
        );
    }
    println!("\n### Reads over loopback HTTP from `nova serve` (binary pages of 1 KiB records)\n");
    println!(
        "Right after the binary one-stream case of 64-record batches, on its server: \
         {READERS} keep-alive connections, each a closed loop of reads of one page from its \
         own place in the stream, going round it (a page may end before the records asked: \
         at most `--read-page-loads-max` chunks not in memory are loaded for one); {:.1} s \
         measured per case after {:.1} s \
         of warm-up. Ratio: content bytes per second to the loopback reference above.\n",
        durations.measure.as_secs_f64(),
        durations.warmup.as_secs_f64(),
    );
    println!(
        "| records per page asked | pages/s | MB/s content | ratio to loopback (content) | \
         p50 µs | p99 µs | server CPU s/GB | client CPU s/GB | CPU bound MB/s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for read in &reads {
        println!(
            "| {} | {:.0} | {:.1} | {:.3} | {} | {} | {:.2} | {:.2} | {:.0} |",
            read.page_records,
            read.pages_per_second,
            read.content_bytes_per_second / 1e6,
            read.content_bytes_per_second / loopback,
            read.latency.p50,
            read.latency.p99,
            read.server_cpu_per_gb,
            read.client_cpu_per_gb,
            cores as f64 / (read.server_cpu_per_gb + read.client_cpu_per_gb) * 1e3,
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
