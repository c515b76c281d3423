//! The S3 store against a real S3-protocol server: moto, started by each test on a
//! free loopback port (`NOVA_MOTO_SERVER`, set by `./scripts/check`), with its own bucket.
//! The conformance suite first, then what only S3 has: prefixes, multipart cleanup,
//! configuration, and retries through a proxy that resets, stalls and loses answers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use s3::{
    ByteRange, Bytes, Cause, ErrorKind, ObjectStore, Op, PutCondition, S3Config, S3Store,
    TransferPolicy,
};

use common::{Fault, Moto, Proxy, create_bucket, moto_fixture, raw_client, s3_config};

conformance_tests!(moto_fixture);

fn store(config: S3Config) -> S3Store {
    S3Store::new(config).expect("a valid S3 config")
}

#[test]
fn prefixes_keep_stores_apart() {
    let moto = Moto::start();
    common::block_on(async {
        create_bucket(&moto.endpoint(), "shared").await;
        let with_prefix = |prefix: &str| {
            store(S3Config { prefix: prefix.into(), ..s3_config(&moto.endpoint(), "shared") })
        };
        let (one, two, whole) =
            (with_prefix("tenant/one"), with_prefix("tenant/two"), with_prefix(""));
        one.put("k", Bytes::from_static(b"1"), PutCondition::CreateOnly).await.expect("put one");
        two.put("k", Bytes::from_static(b"2"), PutCondition::CreateOnly).await.expect("put two");
        assert_eq!(one.get("k", ByteRange::All).await.expect("get"), Bytes::from_static(b"1"));
        assert_eq!(two.get("k", ByteRange::All).await.expect("get"), Bytes::from_static(b"2"));
        let keys = |page: s3::ListPage| page.objects.into_iter().map(|o| o.key).collect::<Vec<_>>();
        assert_eq!(keys(one.list("", None, 10).await.expect("list")), ["k"]);
        assert_eq!(
            keys(whole.list("", None, 10).await.expect("list")),
            ["tenant/one/k", "tenant/two/k"]
        );
        one.delete("k").await.expect("delete");
        assert_eq!(two.head("k").await.expect("head"), Some(1));
    });
}

#[test]
fn foreign_keys_are_skipped_and_paging_goes_past_them() {
    let moto = Moto::start();
    common::block_on(async {
        create_bucket(&moto.endpoint(), "foreign").await;
        let raw = raw_client(&moto.endpoint());
        for key in ["f/a", "f/b c", "f/b~", "f/c"] {
            raw.put_object()
                .bucket("foreign")
                .key(key)
                .body(Bytes::from_static(b"x").into())
                .send()
                .await
                .unwrap_or_else(|err| panic!("raw put {key}: {err}"));
        }
        let store = store(s3_config(&moto.endpoint(), "foreign"));
        let mut keys = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..10 {
            let page = store.list("f/", after.as_deref(), 1).await.expect("list");
            keys.extend(page.objects.into_iter().map(|o| o.key));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(keys, ["f/a", "f/c"]);
    });
}

#[test]
fn multipart_uploads_leave_nothing_behind() {
    let moto = Moto::start();
    common::block_on(async {
        create_bucket(&moto.endpoint(), "parts").await;
        let store = store(s3_config(&moto.endpoint(), "parts"));
        let data = Bytes::from(common::pattern(9, 11 << 20));
        store.put("big", data.clone(), PutCondition::CreateOnly).await.expect("put");
        // Refused at completion: its parts were uploaded and must be aborted.
        let err =
            store.put("big", data.clone(), PutCondition::CreateOnly).await.expect_err("exists");
        assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
        let uploads = raw_client(&moto.endpoint())
            .list_multipart_uploads()
            .bucket("parts")
            .send()
            .await
            .expect("list multipart uploads");
        assert!(uploads.uploads().is_empty(), "uploads left open: {:?}", uploads.uploads());
        assert_eq!(store.get("big", ByteRange::All).await.expect("get"), data);
    });
}

#[test]
fn a_missing_bucket_is_refused_with_the_code() {
    let moto = Moto::start();
    common::block_on(async {
        let store = store(s3_config(&moto.endpoint(), "no-such-bucket"));
        let err = store
            .put("k", Bytes::from_static(b"x"), PutCondition::Overwrite)
            .await
            .expect_err("no bucket");
        assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
        assert!(!err.is_retryable());
        let message = err.to_string();
        assert!(message.starts_with("put \"k\": refused by the store (http 404"), "{message}");
        assert!(message.contains("NoSuchBucket"), "{message}");
        let err = store.list("", None, 10).await.expect_err("no bucket");
        assert_eq!((err.op(), err.kind()), (Op::List, ErrorKind::Refused), "{err}");
    });
}

#[test]
fn bad_configuration_is_refused_at_open() {
    let base = || s3_config("http://127.0.0.1:1", "bucket");
    let refusals = [
        (S3Config { bucket: "Upper_Case".into(), ..base() }, "bucket name"),
        (S3Config { prefix: "/leading".into(), ..base() }, "key prefix"),
        (S3Config { prefix: "a/../b".into(), ..base() }, "key prefix"),
        (S3Config { endpoint: Some("127.0.0.1:9000".into()), ..base() }, "not an http"),
        (
            S3Config {
                policy: TransferPolicy {
                    multipart_part_bytes: 1 << 20,
                    ..TransferPolicy::default()
                },
                ..base()
            },
            "--s3-multipart-part-bytes",
        ),
        (
            S3Config {
                policy: TransferPolicy { attempts_max: 0, ..TransferPolicy::default() },
                ..base()
            },
            "--s3-attempts-max",
        ),
    ];
    for (config, says) in refusals {
        let err = S3Store::new(config).expect_err("refused");
        assert_eq!((err.op(), err.kind()), (Op::Open, ErrorKind::Invalid), "{err}");
        assert!(err.to_string().contains(says), "{err} should say {says}");
    }
}

fn fast_retries(endpoint: &str, bucket: &str, attempts: u32) -> S3Config {
    let mut config = s3_config(endpoint, bucket);
    config.policy.attempts_max = attempts;
    config.policy.attempt_timeout = Duration::from_millis(500);
    config
}

#[test]
fn an_unreachable_store_is_unavailable_after_the_attempts() {
    let closed = common::free_port();
    common::block_on(async {
        let store = store(fast_retries(&format!("http://127.0.0.1:{closed}"), "bucket", 3));
        let err = store
            .put("some/key", Bytes::from_static(b"x"), PutCondition::CreateOnly)
            .await
            .expect_err("no server");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.is_retryable());
        assert!(matches!(err.cause(), Cause::Exhausted { attempts: 3, .. }), "{err}");
        let message = err.to_string();
        assert!(message.starts_with("put \"some/key\": gave up after 3 attempt(s)"), "{message}");
        let err = store.get("some/key", ByteRange::All).await.expect_err("no server");
        assert_eq!((err.op(), err.kind()), (Op::Get, ErrorKind::Unavailable), "{err}");
    });
}

#[test]
fn reset_connections_are_retried() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, vec![Fault::Reset, Fault::Reset]);
    common::block_on(async {
        create_bucket(&moto.endpoint(), "resets").await;
        let store = store(fast_retries(&proxy.endpoint(), "resets", 4));
        store
            .put("k", Bytes::from_static(b"through"), PutCondition::CreateOnly)
            .await
            .expect("put after resets");
        assert_eq!(
            store.get("k", ByteRange::All).await.expect("get"),
            Bytes::from_static(b"through")
        );
    });
    assert!(proxy.accepted() >= 3, "the first two connections were reset");
}

#[test]
fn a_stalled_attempt_times_out_and_is_retried() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, vec![Fault::Stall]);
    common::block_on(async {
        create_bucket(&moto.endpoint(), "stalls").await;
        let store = store(fast_retries(&proxy.endpoint(), "stalls", 2));
        store
            .put("k", Bytes::from_static(b"late"), PutCondition::Overwrite)
            .await
            .expect("put after a stall");
        assert_eq!(store.head("k").await.expect("head"), Some(4));
    });
    assert!(proxy.accepted() >= 2);
}

#[test]
fn a_stalled_get_gives_up_as_unavailable() {
    let moto = Moto::start();
    let proxy = Proxy::start(moto.port, vec![Fault::Stall; 8]);
    common::block_on(async {
        let store = store(fast_retries(&proxy.endpoint(), "stalls", 2));
        let err = store.get("k", ByteRange::All).await.expect_err("every attempt stalls");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.to_string().contains("no response within 500 ms"), "{err}");
    });
}

/// A create-only put whose first attempt landed but whose answer was lost: the retry
/// meets 412, reads the object back, finds its own bytes, and succeeds. Someone else's
/// bytes under the key would still be refused.
#[test]
fn a_create_only_put_whose_answer_was_lost_is_its_own_success() {
    let moto = Moto::start();
    let proxy =
        Proxy::start(moto.port, vec![Fault::DropResponse, Fault::Forward, Fault::DropResponse]);
    common::block_on(async {
        create_bucket(&moto.endpoint(), "lost").await;
        let store = store(fast_retries(&proxy.endpoint(), "lost", 3));
        let mine = Bytes::from(common::pattern(1, 5000));
        store
            .put("bundle/1", mine.clone(), PutCondition::CreateOnly)
            .await
            .expect("the landed put is ours");
        assert_eq!(store.get("bundle/1", ByteRange::All).await.expect("get"), mine);

        let direct = store_direct(&moto);
        direct
            .put("bundle/2", Bytes::from_static(b"theirs"), PutCondition::CreateOnly)
            .await
            .expect("put");
        let err = store
            .put("bundle/2", Bytes::from_static(b"mine"), PutCondition::CreateOnly)
            .await
            .expect_err("someone else's object");
        assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    });
    assert!(proxy.accepted() >= 2, "the first answer was dropped");
}

fn store_direct(moto: &Moto) -> S3Store {
    store(s3_config(&moto.endpoint(), "lost"))
}

#[test]
fn the_store_is_shareable_across_tasks() {
    fn assert_shareable<T: Send + Sync + Clone + 'static>() {}
    assert_shareable::<S3Store>();
    assert_shareable::<s3::LocalDirStore>();
    assert_shareable::<Arc<dyn ObjectStore>>();
}
