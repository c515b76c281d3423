//! What the object-store tests share: a real S3-protocol server (moto, started per test
//! on a free loopback port from `NOVA_MOTO_SERVER`, which `./scripts/check` installs and
//! sets), a fault-injecting TCP proxy to put in front of it, the fixture each
//! conformance case runs on, and the runtime that drives a case.

#![allow(dead_code)] // Each test binary uses its own part of this.

pub mod conformance;

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

#[allow(unused_imports)] // Each test binary uses its own part.
pub use s3::testing::{Fault, Moto, Proxy, free_port};
use s3::{ObjectStore, S3Config, S3Store, TransferPolicy};

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

/// A test's S3 configuration for `endpoint`: moto takes any credentials.
pub fn s3_config(endpoint: &str, bucket: &str) -> S3Config {
    S3Config {
        policy: TransferPolicy {
            // Small parts so a 20 MiB object takes five (S3's smallest part is 5 MiB).
            multipart_threshold_bytes: 8 << 20,
            multipart_part_bytes: 5 << 20,
            backoff_initial: Duration::from_millis(5),
            backoff_max: Duration::from_millis(50),
            ..TransferPolicy::default()
        },
        ..s3::testing::config_for(endpoint, bucket)
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
