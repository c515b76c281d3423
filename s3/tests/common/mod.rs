//! What the object-store tests share: a real S3-protocol server (moto, started per test
//! on a free loopback port from `NOVA_MOTO_SERVER`, which `./scripts/check` installs and
//! sets), a fault-injecting TCP proxy to put in front of it, the fixture each
//! conformance case runs on, and the runtime that drives a case.

#![allow(dead_code)] // Each test binary uses its own part of this.

pub mod conformance;

use std::any::Any;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use s3::{ObjectStore, S3Config, S3Credentials, S3Store, TransferPolicy};

/// The variable that names the `moto_server` executable.
pub const MOTO_ENV: &str = "NOVA_MOTO_SERVER";
/// How long moto may take to answer after it is started.
const MOTO_START_WAIT: Duration = Duration::from_secs(60);
/// How long one case may run before the test fails as stalled.
const CASE_TIME_MAX: Duration = Duration::from_secs(240);

/// A store to run a conformance case on, with what keeps it alive.
pub struct Fixture {
    pub store: Arc<dyn ObjectStore>,
    /// How many keys the listing case writes: above S3's 1,000-key page either way,
    /// more where puts are cheap.
    pub list_keys: usize,
    _keep: Box<dyn Any + Send>,
}

impl Fixture {
    pub fn new(store: Arc<dyn ObjectStore>, list_keys: usize, keep: impl Any + Send) -> Self {
        Self { store, list_keys, _keep: Box::new(keep) }
    }
}

/// Runs `case` on the fixture `make` builds, on a two-thread tokio runtime (the shape of
/// the uploader's), failing the test if it stalls.
pub fn run<M, C>(make: M, case: C)
where
    M: AsyncFnOnce() -> Fixture,
    C: AsyncFnOnce(&Fixture),
{
    let runtime = runtime();
    runtime.block_on(async {
        let fixture = make().await;
        tokio::time::timeout(CASE_TIME_MAX, case(&fixture))
            .await
            .unwrap_or_else(|_| panic!("the case stalled for {CASE_TIME_MAX:?}"));
    });
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs `future` on a fresh runtime.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    runtime().block_on(future)
}

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

/// A test's S3 configuration for `endpoint`: moto takes any credentials.
pub fn s3_config(endpoint: &str, bucket: &str) -> S3Config {
    S3Config {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".into()),
        path_style: true,
        credentials: Some(S3Credentials {
            access_key_id: "nova-test".into(),
            secret_access_key: "nova-test-secret".into(),
            session_token: None,
        }),
        policy: TransferPolicy {
            // Small parts so a 20 MiB object takes five (S3's smallest part is 5 MiB).
            multipart_threshold_bytes: 8 << 20,
            multipart_part_bytes: 5 << 20,
            backoff_initial: Duration::from_millis(5),
            backoff_max: Duration::from_millis(50),
            ..TransferPolicy::default()
        },
        ..S3Config::new(bucket)
    }
}

/// A raw aws-sdk-s3 client on moto, for what the store deliberately cannot do (create
/// buckets, look at multipart uploads).
pub fn raw_client(endpoint: &str) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "nova-test",
            "x",
            None,
            None,
            "test",
        ))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

pub async fn create_bucket(endpoint: &str, bucket: &str) {
    raw_client(endpoint).create_bucket().bucket(bucket).send().await.unwrap_or_else(|err| {
        panic!("create bucket {bucket}: {}", aws_sdk_s3::error::DisplayErrorContext(err))
    });
}

/// A fixture on a fresh moto with one bucket, and an S3 store on it.
pub async fn moto_fixture() -> Fixture {
    let moto = Moto::start();
    let endpoint = moto.endpoint();
    create_bucket(&endpoint, "conformance").await;
    let store = S3Store::new(s3_config(&endpoint, "conformance")).expect("a valid S3 config");
    Fixture::new(Arc::new(store), 1_100, moto)
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
}

/// A TCP proxy in front of `upstream` that applies `script` to the connections it
/// accepts, in order, and forwards every connection after the script ends.
pub struct Proxy {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    /// Stalled connections are held here until the proxy is dropped.
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub fn start(upstream: u16, script: Vec<Fault>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (counter, keep) = (Arc::clone(&accepted), Arc::clone(&held));
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let index = counter.fetch_add(1, Ordering::SeqCst);
                let fault = script.get(index).copied().unwrap_or(Fault::Forward);
                match fault {
                    Fault::Reset => drop(client),
                    Fault::Stall => {
                        keep.lock().expect("the held list").push(client);
                    }
                    Fault::Forward | Fault::DropResponse => {
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        pipe(client, server, fault == Fault::DropResponse);
                    }
                }
            }
        });
        Proxy { port, accepted, held }
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

/// `len` bytes that differ with `seed` and with position, so a misplaced range shows.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}
