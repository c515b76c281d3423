//! Test support shared by every crate's tests (feature `testing`): a real S3-protocol
//! server (moto, started on a free loopback port from `NOVA_MOTO_SERVER`, which
//! `./scripts/check` installs and sets), a way to create a bucket on it, and a
//! fault-injecting TCP proxy to put in front of it. Never part of a release build.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// The variable that names the `moto_server` executable.
pub const MOTO_ENV: &str = "NOVA_MOTO_SERVER";
/// How long moto may take to answer after it is started.
const MOTO_START_WAIT: Duration = Duration::from_secs(60);

/// A moto server on a free loopback port, killed when dropped.
pub struct Moto {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

impl Moto {
    /// Starts `$NOVA_MOTO_SERVER` and waits until it accepts connections. Fails the test
    /// (never skips it) when the variable is not set.
    pub fn start() -> Self {
        let program = std::env::var_os(MOTO_ENV).unwrap_or_else(|| {
            panic!(
                "{MOTO_ENV} is not set: the S3 tests need a real S3-protocol server. Run \
                 ./scripts/check, which installs moto in target/moto-venv and sets {MOTO_ENV}"
            )
        });
        // The port is free when asked for, and may be taken before moto binds it: retry.
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = free_port();
            let log =
                std::env::temp_dir().join(format!("nova-moto-{}-{port}.log", std::process::id()));
            let log_file = std::fs::File::create(&log).expect("create moto's log file");
            let child = Command::new(&program)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("clone the log file"))
                .stderr(log_file)
                .spawn()
                .unwrap_or_else(|err| panic!("start {program:?} ({MOTO_ENV}): {err}"));
            let mut moto = Moto { child, port, log };
            match moto.wait_ready() {
                Ok(()) => return moto,
                Err(why) => failures.push(why),
            }
        }
        panic!("moto did not start: {failures:#?}");
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + MOTO_START_WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                return Err(format!("moto exited ({status}): {log}"));
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(50));
        }
        Err(format!("moto did not listen on port {} within {MOTO_START_WAIT:?}", self.port))
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

impl Moto {
    /// A configuration for `bucket` on this server: path-style, a fixed region and test
    /// credentials (moto takes any), default transfer policy.
    pub fn config(&self, bucket: &str) -> crate::S3Config {
        config_for(&self.endpoint(), bucket)
    }

    /// Creates `bucket` with one plain HTTP request (moto checks no signature).
    pub fn create_bucket(&self, bucket: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        let request = format!(
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        stream.write_all(request.as_bytes()).expect("send CreateBucket");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 200"), "CreateBucket {bucket}: {answer}");
    }
}

/// A test configuration for `bucket` at `endpoint` (moto, or a proxy in front of it).
pub fn config_for(endpoint: &str, bucket: &str) -> crate::S3Config {
    crate::S3Config {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        path_style: true,
        credentials: Some(crate::S3Credentials {
            access_key_id: "nova-test".into(),
            secret_access_key: "nova-test-secret".into(),
            session_token: None,
        }),
        ..crate::S3Config::new(bucket)
    }
}

/// What the proxy does with one accepted connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Pass bytes both ways.
    Forward,
    /// Close the connection as soon as it is accepted.
    Reset,
    /// Pass the request on, throw the response away, close once it started: the
    /// request took effect, the client never hears so.
    DropResponse,
    /// Read the request and never answer.
    Stall,
    /// Answer with these bytes (a whole HTTP response) without passing the request on, as
    /// a gateway that cannot reach its upstream does, and close.
    Answer(&'static str),
}

/// A TCP proxy in front of `upstream` that applies `script` to the connections it
/// accepts, in order, and forwards every connection after the script ends.
pub struct Proxy {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    /// Stalled connections are held here until the proxy is dropped.
    held: Arc<Mutex<Vec<TcpStream>>>,
    /// Forwarded connections, cut when an outage starts.
    live: Arc<Mutex<Vec<TcpStream>>>,
    /// While set, the store is "down": every new connection is reset.
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16, script: Vec<Fault>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(Mutex::new(Vec::new()));
        let live = Arc::new(Mutex::new(Vec::new()));
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (counter, keep) = (Arc::clone(&accepted), Arc::clone(&held));
        let (forwarded, outage) = (Arc::clone(&live), Arc::clone(&down));
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let index = counter.fetch_add(1, Ordering::SeqCst);
                let fault = if outage.load(Ordering::SeqCst) {
                    Fault::Reset
                } else {
                    script.get(index).copied().unwrap_or(Fault::Forward)
                };
                match fault {
                    Fault::Reset => drop(client),
                    Fault::Stall => {
                        keep.lock().expect("the held list").push(client);
                    }
                    Fault::Answer(response) => {
                        thread::spawn(move || answer(client, response));
                    }
                    Fault::Forward | Fault::DropResponse => {
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        if let (Ok(a), Ok(b)) = (client.try_clone(), server.try_clone()) {
                            forwarded.lock().expect("the live list").extend([a, b]);
                        }
                        pipe(client, server, fault == Fault::DropResponse);
                    }
                }
            }
        });
        Proxy { port, accepted, held, live, down }
    }

    /// Starts an outage (every open connection cut, every new one reset) or ends it.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            for stream in self.live.lock().expect("the live list").drain(..) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for stream in self.held.lock().expect("the held list").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Reads a request's head, answers `response` and closes; what else the client sends is
/// read and thrown away until it closes too, so the close does not reset the connection
/// under the answer.
fn answer(mut client: TcpStream, response: &str) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    if client.write_all(response.as_bytes()).is_ok() && client.shutdown(Shutdown::Write).is_ok() {
        let _ = client.set_read_timeout(Some(Duration::from_secs(10)));
        while matches!(client.read(&mut chunk), Ok(n) if n > 0) {}
    }
}

/// Copies client→server, and server→client unless `drop_response`, in which case the
/// client is cut off as soon as the server starts answering.
fn pipe(client: TcpStream, server: TcpStream, drop_response: bool) {
    let (Ok(mut client_read), Ok(mut server_write)) = (client.try_clone(), server.try_clone())
    else {
        return;
    };
    thread::spawn(move || {
        let _ = std::io::copy(&mut client_read, &mut server_write);
        let _ = server_write.shutdown(Shutdown::Write);
    });
    thread::spawn(move || {
        let (mut server_read, mut client_write) = (server, client);
        if drop_response {
            // Interim answers (`100 Continue`, which the SDK asks for before sending a
            // body) pass, or the request would never reach the server; the final
            // answer, sent once the server has acted, is dropped.
            let mut pending = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                if pending.starts_with(b"HTTP/1.1 1") {
                    if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        if client_write.write_all(&pending[..end + 4]).is_err() {
                            break;
                        }
                        pending.drain(..end + 4);
                        continue;
                    }
                } else if pending.len() >= 10 {
                    break;
                }
                match server_read.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => pending.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = client_write.shutdown(Shutdown::Both);
            let _ = server_read.shutdown(Shutdown::Both);
        } else {
            let _ = std::io::copy(&mut server_read, &mut client_write);
            let _ = client_write.flush();
            let _ = client_write.shutdown(Shutdown::Write);
        }
    });
}
