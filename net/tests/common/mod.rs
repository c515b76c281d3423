//! A real `nova serve` child process on a temporary data directory and a free port, for
//! tests over real sockets, on either object store: the local directory or a real
//! S3-protocol server (moto). The child is killed when the guard drops.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use s3::testing::Moto;

use net::client::{self, Response, Server};
use serde_json::Value;

/// Runs each case (`fn case(nova: &Nova)`) twice: as its own test `local::case` on a
/// server of its own with the local object directory, and within one test `s3_suite`
/// that runs every case in order on one server over moto (starting moto is the slow part).
/// Cases use their own bucket names so they can share a server.
#[allow(unused_macros)]
macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod local {
            $(
                #[test]
                fn $case() {
                    let dir = tempfile::tempdir().expect("a temporary directory");
                    let nova = super::Nova::shared(super::Store::Local, dir.path());
                    super::$case(&nova);
                }
            )*
        }

        #[test]
        fn s3_suite() {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let nova = Nova::shared(Store::s3(), dir.path());
            $(
                eprintln!("s3_suite: case {}", stringify!($case));
                $case(&nova);
            )*
        }
    };
}

/// Where a test server keeps its objects.
#[derive(Clone)]
pub enum Store {
    /// `<data-dir>/objects` (the default).
    Local,
    /// A bucket `nova` on a moto server (from `NOVA_MOTO_SERVER`; the test fails without
    /// it). Restarts of a test server share it, like a real bucket.
    S3(Arc<Moto>),
}

impl Store {
    /// A fresh moto server with the bucket `nova`.
    pub fn s3() -> Store {
        let moto = Moto::start();
        moto.create_bucket("nova");
        Store::S3(Arc::new(moto))
    }

    fn flags(&self) -> Vec<String> {
        match self {
            Store::Local => Vec::new(),
            Store::S3(moto) => s3_flags(&moto.endpoint()),
        }
    }
}

/// The flags of `nova serve` for the bucket `nova` of the S3-protocol server at
/// `endpoint` (moto, or a proxy in front of it).
pub fn s3_flags(endpoint: &str) -> Vec<String> {
    [
        "--s3-bucket",
        "nova",
        "--s3-endpoint",
        endpoint,
        "--s3-region",
        "us-east-1",
        "--s3-path-style",
        "--s3-access-key-id",
        "test",
        "--s3-secret-access-key",
        "test",
    ]
    .map(str::to_owned)
    .into()
}

/// How long a test waits for a condition before it fails.
pub const WAIT_MAX: Duration = Duration::from_secs(60);

/// Waits until `condition` holds, polling; fails the test after [`WAIT_MAX`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT_MAX;
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "{what}: not within {WAIT_MAX:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The flags and environment every shared test server runs with: small bodies (the body
/// limit test) and quick heartbeats (the subscription tests).
pub const SHARED_FLAGS: [&str; 4] =
    ["--http-body-bytes-max", "1MiB", "--http-json-body-bytes-max", "4MiB"];
pub const SHARED_ENV: [(&str, &str); 1] = [("NOVA_SSE_HEARTBEAT_MS", "200")];

pub struct Nova {
    child: Option<Child>,
    /// Held so the object store outlives the server.
    pub store: Store,
    pub server: Server,
    /// `http://HOST:PORT`.
    pub url: String,
    pub data_dir: PathBuf,
}

impl Nova {
    /// A server with two shards on a fresh directory inside `dir`.
    pub fn start(dir: &Path) -> Nova {
        Nova::start_with(&dir.join("data"), &[], &[])
    }

    /// The server a whole test file shares on one store.
    pub fn shared(store: Store, dir: &Path) -> Nova {
        Nova::start_in(store, &dir.join("data"), &SHARED_FLAGS, &SHARED_ENV)
    }

    pub fn start_with(data_dir: &Path, flags: &[&str], env: &[(&str, &str)]) -> Nova {
        Nova::start_in(Store::Local, data_dir, flags, env)
    }

    pub fn start_in(store: Store, data_dir: &Path, flags: &[&str], env: &[(&str, &str)]) -> Nova {
        Nova::launch(store, data_dir, flags, env, Stdio::inherit())
    }

    /// A server on the local store whose stderr (its log) goes to the file `log`.
    pub fn start_logging(data_dir: &Path, flags: &[&str], log: &Path) -> Nova {
        let log = std::fs::File::create(log).expect("create the log file");
        Nova::launch(Store::Local, data_dir, flags, &[], Stdio::from(log))
    }

    /// A server on the local store whose log pipe's reader has gone away: every log
    /// write it makes after start fails with EPIPE.
    pub fn start_with_stderr_closed(data_dir: &Path, flags: &[&str]) -> Nova {
        let mut nova = Nova::launch(Store::Local, data_dir, flags, &[], Stdio::piped());
        drop(nova.child.as_mut().and_then(|child| child.stderr.take()));
        nova
    }

    /// A server on the local store whose log is a pipe that nobody reads: once the pipe
    /// is full, every write to it would block.
    pub fn start_with_stderr_unread(data_dir: &Path, flags: &[&str]) -> Nova {
        Nova::launch(Store::Local, data_dir, flags, &[], Stdio::piped())
    }

    fn launch(
        store: Store,
        data_dir: &Path,
        flags: &[&str],
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> Nova {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nova"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            // Small journal segments: tests start many servers.
            .args(["--shards", "2", "--journal-segment-bytes", "8MiB"])
            .args(store.flags())
            .args(flags)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start nova serve");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let url = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(url) = line.strip_prefix("nova listening on ") {
                        break url.to_owned();
                    }
                }
                _ => {
                    let status = child.wait().expect("wait for nova");
                    panic!("nova serve ended before it listened: {status}");
                }
            }
        };
        let server = Server::parse(&url).expect("a server URL");
        Nova { child: Some(child), store, server, url, data_dir: data_dir.to_owned() }
    }

    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        self.call_with(method, path, &[], body.map(str::as_bytes))
    }

    pub fn call_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Response {
        client::request(&self.server, method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// A connection to the server whose receive buffer is small (64 KiB), for a client
    /// that stops reading: what the server could not send stays in the server, whatever
    /// the host's TCP buffer sizes.
    pub fn connect_with_small_window(&self) -> std::net::TcpStream {
        let address: std::net::SocketAddr = self.server.authority.parse().expect("an address");
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("a socket");
        socket.set_recv_buffer_size(64 << 10).expect("a small receive buffer");
        socket.connect(&address.into()).expect("connect");
        socket.into()
    }

    /// Sends `GET path` (accepting `accept`) from a client that takes no byte of its
    /// answer, on a [`Nova::connect_with_small_window`] connection, and returns it once
    /// the server holds at least `held` bytes of responses.
    pub fn stalled_get(&self, path: &str, accept: &str, held: u64) -> std::net::TcpStream {
        use std::io::Write as _;
        let mut stream = self.connect_with_small_window();
        let request = format!("GET {path} HTTP/1.1\r\nhost: nova\r\naccept: {accept}\r\n\r\n");
        stream.write_all(request.as_bytes()).expect("send the request");
        wait_until(&format!("{held} bytes of responses held"), || {
            self.response_bytes_held() >= held
        });
        stream
    }

    /// Response bytes the server holds, every shard's (`--http-response-memory-bytes`).
    pub fn response_bytes_held(&self) -> u64 {
        self.metric("nova_http_response_bytes_held")
    }

    /// The sum of the `/metrics` series named `name` over every label set (each shard's).
    pub fn metric(&self, name: &str) -> u64 {
        let text = self.call("GET", "/metrics", None).text();
        text.lines()
            .filter_map(|line| line.strip_prefix(name))
            .filter(|rest| rest.starts_with(['{', ' ']))
            .filter_map(|rest| rest.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Creates bucket `name`: express by default, streams created on append.
    pub fn express_bucket(&self, name: &str) {
        let settings = r#"{"create_stream_on_append":true,"default_class":"express"}"#;
        self.ok("POST", &format!("/v1/buckets/{name}"), Some(settings), 201);
    }

    /// Calls and checks the status; the JSON body.
    pub fn ok(&self, method: &str, path: &str, body: Option<&str>, status: u16) -> Value {
        let response = self.call(method, path, body);
        assert_eq!(response.status, status, "{method} {path}: {}", response.text());
        response.json()
    }

    /// Calls, expects an error with this status and code; the error body.
    pub fn err(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        status: u16,
        code: &str,
    ) -> Value {
        let response = self.call(method, path, body);
        let json = response.json();
        assert_eq!(response.status, status, "{method} {path}: {}", response.text());
        assert_eq!(json["code"], code, "{method} {path}: {}", response.text());
        assert!(json["message"].as_str().is_some_and(|m| !m.is_empty()), "{json}");
        json
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        let port = self.server.authority.rsplit(':').next().and_then(|p| p.parse().ok());
        port.expect("a server's authority ends with its port")
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Waits for the child to exit (after a signal sent elsewhere); fails the test, after
    /// killing it, if it has not within a minute: a stop that hangs.
    pub fn wait_exit(mut self) -> ExitStatus {
        exit_within(self.child.take().expect("running"), STOP_WAIT_MAX)
    }

    /// SIGKILL, then the exit status: a crash, with nothing flushed or closed.
    pub fn kill(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        child.kill().expect("send SIGKILL");
        child.wait().expect("wait for nova")
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let child = self.child.take().expect("running");
        // SAFETY: kill(2) on the pid of our own child, which has not been waited for, so
        // the pid cannot have been reused.
        let sent = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        assert_eq!(sent, 0, "send SIGTERM");
        exit_within(child, STOP_WAIT_MAX)
    }
}

/// The longest a test waits for a signalled server to exit.
const STOP_WAIT_MAX: Duration = Duration::from_secs(60);

/// The child's exit status, once it exits within `limit`; else it is killed and the
/// test fails.
fn exit_within(mut child: Child, limit: Duration) -> ExitStatus {
    let pid = child.id() as i32;
    let (exited, status) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = exited.send(child.wait().expect("wait for nova"));
    });
    status.recv_timeout(limit).unwrap_or_else(|_| {
        // SAFETY: kill(2) on our own child, which the thread above has not reaped yet (it
        // would have sent its status).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("nova (pid {pid}) did not exit within {limit:?} of its signal")
    })
}

impl Drop for Nova {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether curl is on this machine.
pub fn have_curl() -> bool {
    Command::new("curl").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Runs a shell command (curl examples); its stdout.
pub fn shell(command: &str) -> String {
    let output = Command::new("sh").args(["-c", command]).output().expect("run sh");
    assert!(output.status.success(), "{command}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Appends `batches` binary batches of 64 records of 64 KiB to `stream` (4 MiB each).
pub fn append_large(nova: &Nova, stream: &str, batches: usize) {
    use engine::framing::{AppendBuilder, AppendConditions};
    let media = [("content-type", "application/x-nova-records")];
    for _ in 0..batches {
        let mut builder = AppendBuilder::new();
        for _ in 0..64 {
            builder.push::<&[u8], &[u8]>(&[], &[b'r'; 64 << 10]).expect("fits");
        }
        let framed = builder.finish(&AppendConditions::default());
        let ack =
            nova.call_with("POST", &format!("/v1/streams/{stream}/records"), &media, Some(&framed));
        assert_eq!(ack.status, 200, "{}", ack.text());
    }
}
