//! A quick look at one store's PUT and GET latency for one object size (not a
//! benchmark: `bench` owns those, with references measured in the same run).
//!
//! ```text
//! cargo run --release -p s3 --example put_get_latency -- local <dir> [bytes] [rounds]
//! cargo run --release -p s3 --example put_get_latency -- s3 <endpoint> <bucket> [bytes] [rounds]
//! ```
//!
//! The `s3` form creates the bucket if it is missing and uses path-style URLs and dummy
//! credentials unless AWS_ACCESS_KEY_ID is set (fine for moto).

use std::sync::Arc;
use std::time::{Duration, Instant};

use s3::{
    ByteRange, Bytes, LocalDirOptions, LocalDirStore, ObjectStore, PutCondition, S3Config,
    S3Credentials, S3Store,
};

fn usage() -> ! {
    eprintln!(
        "usage: put_get_latency local <dir> [bytes] [rounds]\n       put_get_latency s3 <endpoint> <bucket> [bytes] [rounds]"
    );
    std::process::exit(2)
}

fn number(arg: Option<&String>, default: usize) -> usize {
    arg.map_or(default, |text| text.parse().unwrap_or_else(|_| usage()))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    println!(
        "{what}: n={} p50={:.2} ms p90={:.2} ms p99={:.2} ms max={:.2} ms",
        samples.len(),
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.9).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

async fn store_from_args(args: &[String]) -> (Arc<dyn ObjectStore>, &[String]) {
    match args.first().map(String::as_str) {
        Some("local") => {
            let dir = args.get(1).unwrap_or_else(|| usage());
            let store = LocalDirStore::open(dir, LocalDirOptions::default())
                .unwrap_or_else(|err| panic!("{err}"));
            (Arc::new(store), &args[2..])
        }
        Some("s3") => {
            let (Some(endpoint), Some(bucket)) = (args.get(1), args.get(2)) else { usage() };
            let credentials = S3Credentials::from_env().unwrap_or(S3Credentials {
                access_key_id: "nova".into(),
                secret_access_key: "nova".into(),
                session_token: None,
            });
            let config = S3Config {
                endpoint: Some(endpoint.clone()),
                region: Some(std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into())),
                path_style: true,
                credentials: Some(credentials.clone()),
                ..S3Config::new(bucket.clone())
            };
            create_bucket(endpoint, bucket, credentials).await;
            (Arc::new(S3Store::new(config).unwrap_or_else(|err| panic!("{err}"))), &args[3..])
        }
        _ => usage(),
    }
}

async fn create_bucket(endpoint: &str, bucket: &str, credentials: S3Credentials) {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            credentials.access_key_id,
            credentials.secret_access_key,
            credentials.session_token,
            None,
            "example",
        ))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    // An error here is most likely "already exists"; the PUTs will tell otherwise.
    let _ = aws_sdk_s3::Client::from_conf(config).create_bucket().bucket(bucket).send().await;
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let (store, rest) = store_from_args(&args).await;
        let bytes = number(rest.first(), 1 << 20);
        let rounds = number(rest.get(1), 200).max(1);
        let data = Bytes::from((0..bytes).map(|i| (i * 31 % 251) as u8).collect::<Vec<_>>());
        let (mut puts, mut gets) = (Vec::new(), Vec::new());
        // A few rounds warm connections and caches before the measured ones.
        for round in 0..rounds + 5 {
            let key = format!("latency/{}/{round:06}", std::process::id());
            let started = Instant::now();
            store
                .put(&key, data.clone(), PutCondition::CreateOnly)
                .await
                .unwrap_or_else(|err| panic!("{err}"));
            let put = started.elapsed();
            let started = Instant::now();
            let got = store.get(&key, ByteRange::All).await.unwrap_or_else(|err| panic!("{err}"));
            let get = started.elapsed();
            assert_eq!(got.len(), bytes, "a whole object back");
            store.delete(&key).await.unwrap_or_else(|err| panic!("{err}"));
            if round >= 5 {
                puts.push(put);
                gets.push(get);
            }
        }
        println!("{bytes} bytes, {rounds} rounds, one at a time");
        report("put", puts);
        report("get", gets);
    });
}
