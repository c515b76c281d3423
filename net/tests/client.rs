//! The Rust client (`net::client`) against a real `nova serve` child: every verb, both
//! formats, the pipelined append session, subscriptions, and the errors it hands back.

#[macro_use]
mod common;

use common::{Nova, Store};
use engine::options::StorageClass;
use net::api::RECORDS_MEDIA_TYPE;
use net::client::{
    Address, Batch, Bucket, Client, Conditions, Error, Format, ReadOptions, Start, StreamOptions,
    SubscriptionEvent,
};

fn batch(bodies: &[&str]) -> Batch {
    let mut batch = Batch::new();
    for body in bodies {
        batch.push(&[("k", "v")], body.as_bytes()).expect("a record fits");
    }
    batch
}

/// A bucket of `class` streams, created on first append.
fn autocreating(client: &Client, name: &str, class: StorageClass) {
    let mut bucket = Bucket::new(name);
    bucket.create_on_append = true;
    bucket.defaults.class = Some(class);
    client.ensure_bucket(&bucket).expect("bucket");
}

fn bodies(records: &[net::client::Record]) -> Vec<String> {
    records.iter().map(|r| String::from_utf8(r.body.clone()).expect("text")).collect()
}

fn verbs_in_both_formats(nova: &Nova) {
    for (format, bucket) in [(Format::Binary, "cl-bin"), (Format::Json, "cl-json")] {
        let client = Client::new(&nova.url).expect("url").with_format(format);
        let mut wanted = Bucket::new(bucket);
        wanted.create_on_append = true;
        wanted.defaults.class = Some(StorageClass::Express);
        let stored = client.ensure_bucket(&wanted).expect("ensure creates");
        assert!(stored.create_on_append && stored.created_at_ms.is_some());
        assert_eq!(stored.defaults.class, Some(StorageClass::Express));
        assert_eq!(client.ensure_bucket(&wanted).expect("ensure again"), stored);
        // Create-or-join: another tool's wish for the same bucket joins it as it is.
        let mut other = Bucket::new(bucket);
        other.create_on_read = true;
        assert_eq!(client.ensure_bucket(&other).expect("ensure joins"), stored);
        assert_eq!(client.get_bucket(bucket).expect("get").name, bucket);
        let address = Address::parse(&format!("nova://{bucket}/orders/eu")).expect("address");
        assert_eq!(address.key, "orders/eu");
        let options = StreamOptions { retention_max_age_ms: Some(60_000), ..Default::default() };
        let info = client.create_stream(&address, &options, Some("tok")).expect("create");
        assert_eq!((info.address.clone(), info.id.len()), (address.clone(), 32));
        client.create_stream(&address, &options, Some("tok")).expect("same token converges");
        // Bytes of every value round trip, in JSON (base64) as in the binary framing.
        let all: Vec<u8> = (0..=255).collect();
        let mut odd = Batch::new();
        odd.push(&[(all.as_slice(), all.as_slice())], &all).expect("fits");
        let ack = client.append(&address, &odd, &Conditions::default()).expect("append");
        assert_eq!((ack.start.seq_num, ack.end.seq_num), (0, 1));
        let ack =
            client.append(&address, &batch(&["a", "b"]), &Conditions::default()).expect("append");
        assert_eq!((ack.start.seq_num, ack.end.seq_num, ack.tail.seq_num), (1, 3, 3));
        let page = client.read(&address, &ReadOptions::default()).expect("read");
        assert_eq!(page.records[0].body, all);
        assert_eq!(page.records[0].headers, vec![(all.clone(), all.clone())]);
        assert_eq!(bodies(&page.records[1..]), ["a", "b"]);
        assert_eq!(page.records[1].headers, vec![(b"k".to_vec(), b"v".to_vec())]);
        assert_eq!((page.next_seq_num, page.tail.seq_num), (3, 3));
        let page = client
            .read(&address, &ReadOptions { start: Start::TailOffset(1), ..Default::default() })
            .expect("read");
        assert_eq!(bodies(&page.records), ["b"]);
        // match_seq_num: refused with the stream's next seq_num, which the error carries.
        let stale = Conditions { match_seq_num: Some(1), ..Default::default() };
        let refused = client.append(&address, &batch(&["x"]), &stale).expect_err("refused");
        assert_eq!(
            (refused.code(), refused.next_seq_num()),
            (Some("failed_precondition"), Some(3))
        );
        let fresh = Conditions { match_seq_num: Some(3), ..Default::default() };
        client.append(&address, &batch(&["c"]), &fresh).expect("matches");
        assert_eq!(client.check_tail(&address).expect("tail").seq_num, 4);
        client.fence(&address, "w1", None).expect("fence");
        let fenced = Conditions { fencing_token: Some("w0".into()), ..Default::default() };
        let refused = client.append(&address, &batch(&["x"]), &fenced).expect_err("fenced out");
        assert_eq!(refused.code(), Some("failed_precondition"));
        let long = Conditions { fencing_token: Some("t".repeat(37)), ..Default::default() };
        let refused = client.append(&address, &batch(&["x"]), &long).expect_err("too long");
        assert!(matches!(&refused, Error::Invalid(m) if m.contains("36")), "{refused}");
        assert_eq!(client.trim(&address, Start::SeqNum(2)).expect("trim"), 2);
        let info = client.get_stream(&address).expect("get");
        assert_eq!((info.trim_seq_num, info.tail.map(|t| t.seq_num)), (Some(2), Some(4)));
        let patch = StreamOptions { retention_max_age_ms: Some(0), ..Default::default() };
        assert_eq!(
            client
                .reconfigure_stream(&address, &patch)
                .expect("patch")
                .options
                .retention_max_age_ms,
            Some(0)
        );
        let listed = client.list_streams(bucket, "orders/", None, Some(10)).expect("list");
        assert_eq!(listed.items.len(), 1);
        assert_eq!(listed.next, None);
        assert!(
            client.list_buckets(None, None).expect("list").items.iter().any(|b| b.name == bucket)
        );
        client.delete_stream(&address).expect("delete");
        let missing = client.get_stream(&address).expect_err("deleted");
        assert_eq!(missing.code(), Some("not_found"));
        assert!(missing.to_string().contains("not_found"), "{missing}");
    }
    assert!(matches!(Address::parse("nova://onlybucket"), Err(Error::Invalid(_))));
    assert!(matches!(Address::parse("s3://b/k"), Err(Error::Invalid(_))));
    let down = Client::new("http://127.0.0.1:1").expect("url").with_attempts(2);
    assert!(matches!(down.get_bucket("x"), Err(Error::Io { .. })));
}

fn append_session_pipelines_in_order(nova: &Nova) {
    let client = Client::new(&nova.url).expect("url");
    autocreating(&client, "cl-sess", StorageClass::Express);
    for (format, key) in [(Format::Binary, "bin"), (Format::Json, "json")] {
        let client = Client::new(&nova.url).expect("url").with_format(format);
        let address = Address::new("cl-sess", key);
        const BATCHES: u64 = 300;
        const RECORDS: u64 = 4;
        let mut session = client.append_session(&address, 16).expect("session");
        let mut acks = Vec::new();
        let mut batch = Batch::new();
        for b in 0..BATCHES {
            batch.clear();
            for r in 0..RECORDS {
                batch.push::<&str, &str>(&[], format!("{b}-{r}").as_bytes()).expect("fits");
            }
            assert_eq!(session.submit(&batch, &Conditions::default()).expect("submit"), b);
            assert!(session.pending() <= BATCHES as usize);
            while let Some(ack) = session.try_recv() {
                acks.push(ack);
            }
        }
        acks.extend(session.finish());
        assert_eq!(acks.len() as u64, BATCHES);
        for (i, ack) in acks.iter().enumerate() {
            assert_eq!(ack.ticket, i as u64, "acknowledged in order");
            let ack = ack.result.as_ref().expect("appended");
            assert_eq!(ack.start.seq_num, i as u64 * RECORDS, "batches in submission order");
            assert_eq!(ack.end.seq_num, (i as u64 + 1) * RECORDS);
        }
        let page = client
            .read(&address, &ReadOptions { count: Some(8), ..Default::default() })
            .expect("read");
        assert_eq!(bodies(&page.records), ["0-0", "0-1", "0-2", "0-3", "1-0", "1-1", "1-2", "1-3"]);
    }
    // In JSON, a request per batch: an error answers its own batch and the next lands.
    let json = Client::new(&nova.url).expect("url").with_format(Format::Json);
    let address = Address::new("cl-sess", "json");
    let mut session = json.append_session(&address, 4).expect("session");
    let wrong = Conditions { match_seq_num: Some(0), ..Default::default() };
    session.submit(&batch(&["x"]), &wrong).expect("submit");
    session.submit(&batch(&["y"]), &Conditions::default()).expect("submit");
    let acks = session.finish();
    assert_eq!(acks[0].result.as_ref().expect_err("refused").next_seq_num(), Some(1200));
    assert_eq!(acks[1].result.as_ref().expect("appended").start.seq_num, 1200);
    // A streamed session ends at a refused batch: the server takes nothing after it, and
    // says so for each batch behind it; the next batch goes on a new request.
    let address = Address::new("cl-sess", "bin");
    let mut session = client.append_session(&address, 8).expect("session");
    session.submit(&batch(&["ok"]), &Conditions::default()).expect("submit");
    session.submit(&batch(&["x"]), &wrong).expect("submit");
    session.submit(&batch(&["behind"]), &Conditions::default()).expect("submit");
    let acks: Vec<_> = (0..3).map(|_| session.recv().expect("an answer")).collect();
    assert_eq!(acks[0].result.as_ref().expect("appended").start.seq_num, 1200);
    let refused = acks[1].result.as_ref().expect_err("refused");
    assert_eq!((refused.code(), refused.next_seq_num()), (Some("failed_precondition"), Some(1201)));
    assert!(!refused.outcome_unknown());
    // An error frame has no HTTP status of its own: the one its code maps to.
    assert!(matches!(refused, Error::Api(api) if api.status == 412), "{refused:?}");
    let behind = acks[2].result.as_ref().expect_err("not taken");
    assert_eq!(behind.code(), Some("failed_precondition"));
    assert!(behind.to_string().contains("refused batch 1 before this one"), "{behind}");
    assert!(!behind.outcome_unknown(), "nothing behind a refusal landed");
    session.submit(&batch(&["after"]), &Conditions::default()).expect("a new request");
    let acks = session.finish();
    assert_eq!(acks[0].ticket, 3);
    assert_eq!(acks[0].result.as_ref().expect("appended").start.seq_num, 1201);
    let page = client
        .read(&address, &ReadOptions { start: Start::SeqNum(1199), ..Default::default() })
        .expect("read");
    assert_eq!(bodies(&page.records), ["299-3", "ok", "after"]);
}

/// A streamed session's batches become durable together: to a standard stream, whose
/// batches wait up to its batch delay for an upload, one session's batches share their
/// uploads instead of taking one each (a request per batch would be acknowledged one
/// upload apart, each ack's tail at its own end).
fn a_streamed_session_shares_uploads_among_its_batches(nova: &Nova) {
    let client = Client::new(&nova.url).expect("url");
    autocreating(&client, "cl-std", StorageClass::Standard);
    let address = Address::new("cl-std", "s");
    const BATCHES: u64 = 40;
    let mut session = client.append_session(&address, BATCHES as usize).expect("session");
    for b in 0..BATCHES {
        session.submit(&batch(&[&format!("{b}")]), &Conditions::default()).expect("submit");
    }
    let acks = session.finish();
    let mut tails: Vec<u64> = acks
        .iter()
        .enumerate()
        .map(|(i, ack)| {
            let ack = ack.result.as_ref().expect("appended");
            assert_eq!(ack.start.seq_num, i as u64, "in order");
            ack.tail.seq_num
        })
        .collect();
    tails.dedup();
    assert!(tails.len() <= 4, "{BATCHES} batches acknowledged at tails {tails:?}");
    let page = client.read(&address, &ReadOptions::default()).expect("read");
    assert_eq!(page.records.len() as u64, BATCHES);
}

fn subscriptions_follow_in_both_framings(nova: &Nova) {
    let client = Client::new(&nova.url).expect("url");
    let mut bucket = Bucket::new("cl-sub");
    bucket.defaults.class = Some(StorageClass::Express);
    client.ensure_bucket(&bucket).expect("bucket");
    // A client that speaks JSON subscribes over SSE unasked.
    let json = Client::new(&nova.url).expect("url").with_format(Format::Json);
    for (client, sse, key) in
        [(&client, false, "bin"), (&client, true, "sse"), (&json, false, "json")]
    {
        let address = Address::new("cl-sub", key);
        client.create_stream(&address, &StreamOptions::default(), None).expect("stream");
        client.append(&address, &batch(&["h0", "h1"]), &Conditions::default()).expect("append");
        let mut subscription =
            client.subscribe(&address, &ReadOptions::default(), sse).expect("subscribe");
        assert_eq!(subscription.over_sse(), key != "bin");
        let mut seen = Vec::new();
        while seen.len() < 2 {
            if let SubscriptionEvent::Records { records, .. } =
                subscription.next().expect("an event").expect("not an error")
            {
                seen.extend(bodies(&records));
            }
        }
        std::thread::scope(|scope| {
            scope.spawn(|| {
                client.append(&address, &batch(&["l2"]), &Conditions::default()).expect("append");
            });
            let mut heartbeats = 0;
            while seen.len() < 3 {
                match subscription.next().expect("an event").expect("not an error") {
                    SubscriptionEvent::Records { records, .. } => seen.extend(bodies(&records)),
                    SubscriptionEvent::Heartbeat { tail } => {
                        heartbeats += 1;
                        assert!(tail.seq_num >= 2 && heartbeats < 100, "{tail:?}");
                    }
                }
            }
        });
        assert_eq!(seen, ["h0", "h1", "l2"]);
        assert_eq!(subscription.next_seq_num(), Some(3));
        client.delete_stream(&address).expect("delete");
        let end = subscription
            .find(|event| event.is_err())
            .expect("an error ends it")
            .expect_err("an error");
        assert_eq!(end.code(), Some("not_found"));
        assert!(subscription.next().is_none());
        // Bounded: the end after `count` records; resume after a seq_num.
        let address = Address::new("cl-sub", format!("{key}-bounded"));
        client.create_stream(&address, &StreamOptions::default(), None).expect("stream");
        client
            .append(&address, &batch(&["a", "b", "c", "d"]), &Conditions::default())
            .expect("append");
        let options = ReadOptions { count: Some(2), ..Default::default() };
        let events: Vec<_> = client
            .resume(&address, &options, sse, 0)
            .expect("subscribe")
            .collect::<Result<_, _>>()
            .expect("no error");
        let records: Vec<String> = events
            .iter()
            .flat_map(|e| match e {
                SubscriptionEvent::Records { records, .. } => bodies(records),
                SubscriptionEvent::Heartbeat { .. } => Vec::new(),
            })
            .collect();
        assert_eq!(records, ["b", "c"]);
        // The tail is the stream's, not the last record delivered: in both framings.
        let tails: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                SubscriptionEvent::Records { tail, .. } => Some(tail.seq_num),
                SubscriptionEvent::Heartbeat { .. } => None,
            })
            .collect();
        assert_eq!(tails, [4], "sse: {sse}");
    }
    let past = client
        .subscribe(&Address::new("cl-sub", "bin-bounded"), &ReadOptions::from_seq_num(99), false)
        .err()
        .expect("past the tail");
    assert_eq!(past.code(), Some("out_of_range"));
    // A long poll through the client.
    let address = Address::new("cl-sub", "poll");
    client.create_stream(&address, &StreamOptions::default(), None).expect("stream");
    let page = std::thread::scope(|scope| {
        let poll = scope.spawn(|| {
            client.read(&address, &ReadOptions { wait_seconds: Some(30), ..Default::default() })
        });
        client.append(&address, &batch(&["late"]), &Conditions::default()).expect("append");
        poll.join().expect("poll")
    })
    .expect("read");
    assert_eq!(bodies(&page.records), ["late"]);
}

/// With a timeout, a call to a server that takes the connection but never answers ends
/// with an I/O error once its attempts are spent, instead of holding the caller for good
/// (which would hang this test).
#[test]
fn a_timeout_ends_a_call_the_server_never_answers() {
    // The kernel accepts into the backlog; nothing ever reads or answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", silent.local_addr().expect("address"));
    let client = Client::new(&url)
        .expect("client")
        .with_attempts(2)
        .with_timeout(Some(std::time::Duration::from_millis(100)));
    let address = Address::new("b", "k");
    let timed_out = |error: &Error| {
        matches!(error, Error::Io { .. })
            && error.to_string().contains("within the client's timeout")
    };
    let error = client.check_tail(&address).expect_err("nothing answers");
    assert!(timed_out(&error), "{error}");
    // Append sessions and subscriptions have connections of their own, and the same limit.
    let mut session = client.append_session(&address, 4).expect("the kernel takes the connection");
    session.submit(&batch(&["unanswered"]), &Conditions::default()).expect("sent");
    let ack = session.recv().expect("an answer for the batch");
    let error = ack.result.expect_err("nothing answers");
    assert!(timed_out(&error), "{error}");
    for sse in [false, true] {
        let error = client.subscribe(&address, &ReadOptions::default(), sse).err();
        let error = error.expect("nothing answers");
        assert!(timed_out(&error), "{error}");
    }
}

/// A safe call that timed out is made again, up to its attempts, unless the client says
/// a timeout is not to be repeated: then it is one attempt (one connection) however many
/// the client allows.
#[test]
fn a_call_that_timed_out_is_repeated_only_when_the_client_says_so() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    silent.set_nonblocking(true).expect("nonblocking");
    let url = format!("http://{}", silent.local_addr().expect("address"));
    let connections = || std::iter::from_fn(|| silent.accept().ok()).count();
    for (repeated, attempts) in [(true, 3), (false, 1)] {
        let client = Client::new(&url)
            .expect("client")
            .with_attempts(3)
            .with_timeout(Some(std::time::Duration::from_millis(50)))
            .with_timeouts_repeated(repeated);
        let error = client.check_tail(&Address::new("b", "k")).expect_err("nothing answers");
        assert!(error.timed_out(), "{error}");
        assert_eq!(connections(), attempts, "timeouts repeated: {repeated}");
    }
}

/// A connection the server never takes (its accept queue is full, so the kernel drops
/// every further SYN, as for a host that cannot be reached) ends within the client's
/// timeout too, not after the kernel's two minutes of retries.
#[test]
fn a_timeout_ends_a_connect_the_server_never_takes() {
    use std::os::fd::FromRawFd as _;
    // SAFETY: a new socket, owned by the listener from here on.
    let listener = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        std::net::TcpListener::from_raw_fd(fd)
    };
    let loopback = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes([127, 0, 0, 1]) },
        sin_zero: [0; 8],
    };
    let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: the listener's socket, and an address of the size given.
    unsafe {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        assert_eq!(libc::bind(fd, (&raw const loopback).cast(), size), 0);
        // A backlog of 0: one connection waits to be accepted, none more.
        assert_eq!(libc::listen(fd, 0), 0);
    }
    let address = listener.local_addr().expect("address");
    let short = std::time::Duration::from_millis(200);
    let mut queued = Vec::new();
    while let Ok(stream) = std::net::TcpStream::connect_timeout(&address, short) {
        queued.push(stream);
        assert!(queued.len() < 16, "the accept queue never filled");
    }
    let client = Client::new(&format!("http://{address}"))
        .expect("client")
        .with_attempts(2)
        .with_timeout(Some(short));
    let started = std::time::Instant::now();
    let error = client.check_tail(&Address::new("b", "k")).expect_err("never connected");
    assert!(matches!(error, Error::Io { .. }), "{error}");
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "two attempts took {took:?}");
    let error = client.subscribe(&Address::new("b", "k"), &ReadOptions::default(), true).err();
    assert!(matches!(error, Some(Error::Io { .. })), "{error:?}");
    let session = client.append_session(&Address::new("b", "k"), 4);
    assert!(session.is_err(), "a session needs its connection");
}

/// A server of the test's own, a client of it, and an express `bucket` whose streams are
/// created on append (the directory holds the server's data).
fn express_server(bucket: &str) -> (tempfile::TempDir, Nova, Client) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let nova = Nova::start_with(&dir.path().join("data"), &[], &[]);
    let client = Client::new(&nova.url).expect("url");
    autocreating(&client, bucket, StorageClass::Express);
    (dir, nova, client)
}

/// A server on a port of its own (not nova) that answers each request, once its head has
/// come, by writing the pieces of `answer`, `pace` apart, then closing; its URL, and how
/// many requests it has taken.
fn answering(
    answer: impl Iterator<Item = Vec<u8>> + Clone + Send + 'static,
    pace: std::time::Duration,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead as _, Write as _};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let taken = std::sync::Arc::clone(&requests);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let (answer, taken) = (answer.clone(), std::sync::Arc::clone(&taken));
            std::thread::spawn(move || {
                let mut head = std::io::BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while head.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                taken.fetch_add(1, Ordering::SeqCst);
                for piece in answer {
                    if stream.write_all(&piece).is_err() {
                        return;
                    }
                    std::thread::sleep(pace);
                }
            });
        }
    });
    (url, requests)
}

/// A deadline bounds a whole call. A server that answers a byte every 50 ms, each well
/// within the 5 s per-read timeout and never to its end, ends the call at the deadline
/// (without it the call would never end); and a retry whose wait (the server's
/// Retry-After) would end past the deadline is not made: the refusal comes back at once.
#[test]
fn a_deadline_bounds_a_whole_call() {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let deadline = Duration::from_millis(400);
    let client = |url: &str| {
        Client::new(url)
            .expect("client")
            .with_attempts(3)
            .with_timeout(Some(Duration::from_secs(5)))
            .with_deadline(Some(deadline))
    };
    let endless = b"HTTP/1.1 200 OK\r\nx-slow: ".iter().copied().chain(std::iter::repeat(b'a'));
    let (url, requests) = answering(endless.map(|byte| vec![byte]), Duration::from_millis(50));
    let started = Instant::now();
    let error = client(&url).check_tail(&Address::new("b", "k")).expect_err("never answered");
    let took = started.elapsed();
    assert!(
        error.timed_out() && error.to_string().contains("the call's deadline passed"),
        "{error}"
    );
    assert!(took >= deadline && took < deadline * 4, "the call took {took:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 1, "no attempt after the deadline");

    let body = r#"{"code":"resource_exhausted","message":"full"}"#;
    let refusal = format!(
        "HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let (url, requests) = answering(std::iter::once(refusal.into_bytes()), Duration::ZERO);
    let started = Instant::now();
    match client(&url).check_tail(&Address::new("b", "k")) {
        Err(Error::Api(error)) => {
            assert_eq!((error.status, error.retry_after_seconds), (429, Some(2)))
        }
        other => panic!("expected the refusal, got {other:?}"),
    }
    // Not the Retry-After's 2 s.
    assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
    assert_eq!(requests.load(Ordering::SeqCst), 1, "not sent again");
    // Without a deadline, the same call waits the Retry-After out and sends it again.
    let patient = Client::new(&url).expect("client").with_attempts(2);
    assert!(patient.check_tail(&Address::new("b", "k")).is_err());
    assert_eq!(requests.load(Ordering::SeqCst), 3, "sent again after Retry-After");
}

/// A subscription takes nothing on its server's word: a binary page of more than 128 MiB
/// (its records frames with no page end) and an SSE record numbered u64::MAX (no position
/// after it to resume from) are protocol errors, not memory held without bound or a
/// position wrapped to 0.
#[test]
fn a_subscription_refuses_what_no_nova_server_sends() {
    let address = Address::new("b", "k");
    // Real records frames: a nova page of 64 records of 64 KiB, without its page end.
    let (_dir, nova, _) = express_server("frames");
    common::append_large(&nova, "frames/s", 1);
    let page = nova.call_with(
        "GET",
        "/v1/streams/frames/s/records?seq_num=0",
        &[("accept", RECORDS_MEDIA_TYPE)],
        None,
    );
    let mut records_frames = Vec::new();
    let mut at = 0;
    while let Some((frame, used)) = engine::framing::decode_frame(&page.body[at..]).unwrap() {
        if matches!(frame, engine::framing::Frame::Records(_)) {
            records_frames.extend_from_slice(&page.body[at..at + used]);
        }
        at += used;
    }
    assert!(records_frames.len() > 4 << 20, "{} bytes of records frames", records_frames.len());
    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: {RECORDS_MEDIA_TYPE}\r\n\r\n");
    let pieces = 1 + (128 << 20) / records_frames.len();
    let answer =
        std::iter::once(head.into_bytes()).chain(std::iter::repeat_n(records_frames, pieces));
    let (url, _) = answering(answer, std::time::Duration::ZERO);
    let client = Client::new(&url).expect("url");
    let mut subscription =
        client.subscribe(&address, &ReadOptions::default(), false).expect("opened");
    match subscription.next() {
        Some(Err(Error::Protocol(why))) => {
            assert!(why.contains("a subscription page of more than 134217728 bytes"), "{why}")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }

    let data = format!(
        r#"{{"records":[{{"seq_num":{},"timestamp":0,"headers":[],"body":"eA=="}}],"tail":{{"seq_num":0,"timestamp":0}}}}"#,
        u64::MAX
    );
    let sse = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\nevent: batch\ndata: {data}\n\n"
    );
    let (url, _) = answering(std::iter::once(sse.into_bytes()), std::time::Duration::ZERO);
    let client = Client::new(&url).expect("url");
    let mut subscription =
        client.subscribe(&address, &ReadOptions::default(), true).expect("opened");
    match subscription.next() {
        Some(Err(Error::Protocol(why))) => {
            assert!(why.contains(&format!("a record numbered {}", u64::MAX)), "{why}")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

/// Sessions left idle past the server's `--http-idle-timeout-ms`: a JSON one (requests
/// on a keep-alive connection) has its connection closed by the server, and with nothing
/// in flight its next batch goes on a new one; a streamed one is a request still being
/// answered, which the server never ends for being idle (a batch on its way then would
/// meet an ended session), so a producer that appends now and then keeps it. Both go on,
/// in order.
#[test]
fn sessions_go_on_after_an_idle_spell() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start_with(&dir.path().join("data"), &["--http-idle-timeout-ms", "1000"], &[]);
    // Calls on connections of their own (closed after each answer), so that the sessions'
    // are the only ones the server can close idle.
    nova.ok("POST", "/v1/buckets/idle", Some(r#"{"create_stream_on_append":true}"#), 201);
    let mut sessions = Vec::new();
    for (format, key) in [(Format::Json, "json"), (Format::Binary, "bin")] {
        let client = Client::new(&nova.url).expect("url").with_format(format);
        let address = Address::new("idle", key);
        let mut session = client.append_session(&address, 4).expect("session");
        session.submit(&batch(&["before"]), &Conditions::default()).expect("submit");
        assert_eq!(session.recv().expect("ack").result.expect("appended").start.seq_num, 0);
        sessions.push((client, address, session));
    }
    // The server counts the connections it closes idle: wait for the JSON session's. The
    // streamed one has been idle as long.
    common::wait_until("the JSON session's connection closed idle", || {
        nova.metric("nova_http_connections_closed_idle_total") > 0
    });
    for (client, address, session) in &mut sessions {
        session.submit(&batch(&["after"]), &Conditions::default()).expect("submit");
        assert_eq!(session.recv().expect("ack").result.expect("appended").start.seq_num, 1);
        let page = client.read(address, &ReadOptions::default()).expect("read");
        assert_eq!(bodies(&page.records), ["before", "after"]);
    }
    assert_eq!(nova.metric("nova_http_connections_closed_idle_total"), 1, "only the JSON one's");
}

suite!(
    verbs_in_both_formats,
    append_session_pipelines_in_order,
    a_streamed_session_shares_uploads_among_its_batches,
    subscriptions_follow_in_both_framings,
);

/// A streamed session whose answer never began (its head not within the client's
/// timeout: the server was at its connection limit, the connection waiting in its
/// backlog) sent nothing: its next batch goes on a new connection, and lands.
#[test]
fn a_session_whose_answer_never_began_goes_on_on_a_new_connection() {
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start_with(
        &dir.path().join("data"),
        &["--http-connections-max", "1", "--shards", "1"],
        &[],
    );
    // On a connection of its own (closed after the answer): a pooled one would hold the
    // server's one connection.
    nova.ok("POST", "/v1/buckets/full", Some(r#"{"create_stream_on_append":true}"#), 201);
    let client = Client::new(&nova.url).expect("url");
    let address = Address::new("full", "s");
    // The server's one connection, held by a session.
    let holder = client.append_session(&address, 4).expect("session");
    let quick = Client::new(&nova.url).expect("url").with_timeout(Some(Duration::from_millis(300)));
    let mut waiting = quick.append_session(&address, 4).expect("the kernel takes it");
    // Nothing can be awaited here: the answer's head is missed within the timeout.
    std::thread::sleep(Duration::from_millis(600));
    drop(holder);
    waiting.submit(&batch(&["landed"]), &Conditions::default()).expect("submit");
    let ack = waiting.recv().expect("an answer").result.expect("appended on a new connection");
    assert_eq!(ack.start.seq_num, 0);
    // The session holds the server's one connection: done with it before reading.
    drop(waiting);
    let page = client.read(&address, &ReadOptions::default()).expect("read");
    assert_eq!(bodies(&page.records), ["landed"]);
}

/// A session the server ended right behind its last ack (the stopping server's error
/// frame read in the same gulp as the ack) is over, though its socket holds nothing more
/// to see: the next batch goes on a new connection, instead of meeting that frame and
/// being answered `unavailable`. No real server can be timed to put the two frames in
/// one read, so a scripted one over a real socket does: it writes them in one chunk.
#[test]
fn a_session_ended_behind_its_last_ack_goes_on_on_a_new_connection() {
    use engine::position::Position;
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let server = std::thread::spawn(move || {
        let mut held = Vec::new();
        for (seq_num, then_stop) in [(0, true), (1, false)] {
            let (socket, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(socket.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).expect("head") > 2 {
                line.clear();
            }
            let mut writer = socket.try_clone().expect("clone");
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/x-nova-records; \
                        session=true\r\ntransfer-encoding: chunked\r\n\r\n";
            writer.write_all(head.as_bytes()).expect("answer head");
            // One batch: a chunk of the request body.
            line.clear();
            reader.read_line(&mut line).expect("chunk size");
            let size = usize::from_str_radix(line.trim(), 16).expect("hex size");
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).expect("chunk");
            let at = |seq_num| Position { seq_num, timestamp: 7 };
            let mut frames = Vec::new();
            engine::framing::encode_ack(at(seq_num), at(seq_num + 1), at(seq_num + 1), &mut frames);
            if then_stop {
                let stop = r#"{"code":"unavailable","message":"stopping","not_appended":true}"#;
                engine::framing::encode_error(stop, &mut frames);
            }
            let mut out = format!("{:x}\r\n", frames.len()).into_bytes();
            out.extend_from_slice(&frames);
            out.extend_from_slice(b"\r\n");
            writer.write_all(&out).expect("frames");
            // The connection stays open: only its bytes say the session is over.
            held.push(socket);
        }
        held
    });
    let client = Client::new(&url).expect("url");
    let mut session = client.append_session(&Address::new("b", "s"), 4).expect("session");
    for (body, seq_num) in [("a", 0), ("b", 1)] {
        session.submit(&batch(&[body]), &Conditions::default()).expect("submit");
        let ack = session.recv().expect("an answer").result;
        assert_eq!(ack.expect("acknowledged").start.seq_num, seq_num);
    }
    assert_eq!(server.join().expect("the scripted server").len(), 2, "two connections");
}

/// A session whose connection failed is closed (module docs): it refuses the next batch,
/// so its caller opens a new one, instead of taking batches it can only fail.
#[test]
fn a_session_whose_connection_failed_refuses_more_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nova = Nova::start(dir.path());
    nova.ok("POST", "/v1/buckets/dead", Some(r#"{"create_stream_on_append":true}"#), 201);
    let client = Client::new(&nova.url).expect("url");
    let mut session = client.append_session(&Address::new("dead", "s"), 4).expect("session");
    session.submit(&batch(&["a"]), &Conditions::default()).expect("submit");
    assert!(session.recv().expect("ack").result.is_ok());
    assert!(!nova.kill().success());
    // The batch that meets the dead connection is answered with the failure...
    if session.submit(&batch(&["b"]), &Conditions::default()).is_ok() {
        assert!(session.recv().expect("an answer").result.is_err());
    }
    // ...and the session takes no more.
    let refused = session.submit(&batch(&["c"]), &Conditions::default());
    assert!(matches!(refused, Err(Error::Io { .. })), "{refused:?}");
}

/// A read the server refuses with `Retry-After` (its shard's response memory full) is
/// sent again once that time is out, and succeeds when room was freed meanwhile; with a
/// single attempt the refusal comes back as it is. Opening a subscription likewise.
#[test]
fn a_read_refused_with_retry_after_is_sent_again_after_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let flags = ["--shards", "1", "--http-response-memory-bytes", "16MiB"];
    let nova = Nova::start_with(&dir.path().join("data"), &flags, &[]);
    let client = Client::new(&nova.url).expect("url");
    let mut wanted = Bucket::new("full");
    wanted.create_on_append = true;
    client.ensure_bucket(&wanted).expect("a bucket");
    common::append_large(&nova, "full/big", 5);
    let small = Address::new("full", "small");
    client.append(&small, &batch(&["a", "b"]), &Conditions::default()).expect("append");
    // A reader that takes nothing of a page as large as the whole budget holds it all.
    let big = "/v1/streams/full/big/records?count=256";
    let stalled = nova.stalled_get(big, RECORDS_MEDIA_TYPE, 16 << 20);
    let once = Client::new(&nova.url).expect("url").with_attempts(1);
    match once.read(&small, &ReadOptions::default()) {
        Err(Error::Api(error)) => {
            assert_eq!((error.status, error.code.as_str()), (429, "resource_exhausted"));
            assert_eq!(error.retry_after_seconds, Some(1));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Once the next read has been refused too, the reader goes away and its page with it;
    // the read, sent again after Retry-After, gets its records.
    let refused = |route: &str| {
        nova.metric(&format!(r#"nova_http_requests_total{{route="{route}",status="429"}}"#))
    };
    std::thread::scope(|scope| {
        scope.spawn(move || {
            common::wait_until("a second read refused", || refused("read") >= 2);
            drop(stalled);
        });
        let started = std::time::Instant::now();
        let page = client.read(&small, &ReadOptions::default()).expect("read after Retry-After");
        assert!(started.elapsed() >= std::time::Duration::from_secs(1), "Retry-After waited out");
        assert_eq!(bodies(&page.records), ["a", "b"]);
    });
    // A subscription is opened the same way.
    let stalled = nova.stalled_get(big, RECORDS_MEDIA_TYPE, 16 << 20);
    std::thread::scope(|scope| {
        scope.spawn(move || {
            common::wait_until("a subscription refused", || refused("subscribe") >= 1);
            drop(stalled);
        });
        let mut subscription =
            client.subscribe(&small, &ReadOptions::default(), false).expect("subscribe");
        match subscription.next().expect("an event").expect("not an error") {
            SubscriptionEvent::Records { records, .. } => assert_eq!(bodies(&records), ["a", "b"]),
            other => panic!("expected records, got {other:?}"),
        }
    });
}

/// A gateway's error without nova's error body (a proxy's 503 when it cannot reach the
/// server) is a failed connection: transient, so a read is sent again and goes through,
/// and with an append's outcome unknown.
#[test]
fn a_gateways_bare_error_is_a_failed_connection() {
    use s3::testing::{Fault, Proxy};
    const GATEWAY: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
                           content-length: 19\r\nconnection: close\r\n\r\nno healthy upstream";
    let (_dir, nova, direct) = express_server("gateway");
    let address = Address::new("gateway", "k");
    direct.append(&address, &batch(&["a", "b"]), &Conditions::default()).expect("append");
    let port = nova.port();

    let proxy = Proxy::start(port, vec![Fault::Answer(GATEWAY)]);
    let client = Client::new(&proxy.endpoint()).expect("url").with_attempts(2);
    let tail = client.check_tail(&address).expect("sent again past the gateway's 503");
    assert_eq!((tail.seq_num, proxy.accepted()), (2, 2));

    let proxy = Proxy::start(port, vec![Fault::Answer(GATEWAY)]);
    let once = Client::new(&proxy.endpoint()).expect("url").with_attempts(1);
    let error = once.check_tail(&address).expect_err("the gateway's answer");
    assert!(matches!(error, Error::Io { .. }) && error.transient(), "{error}");
    assert!(error.outcome_unknown(), "{error}");
    let message = error.to_string();
    assert!(message.contains("HTTP 503") && message.contains("no healthy upstream"), "{message}");
}

/// A guarded append none of whose attempts was answered fails as the last did, with its
/// outcome unknown and transient (a guarded append is safe to send again), not as
/// ambiguous; one whose server is not there at all was never sent.
#[test]
fn a_guarded_append_never_answered_fails_as_its_last_attempt() {
    use s3::testing::{Fault, Proxy};
    let guarded = Conditions { match_seq_num: Some(0), ..Conditions::default() };
    let address = Address::new("b", "k");
    let silent = Proxy::start(1, vec![Fault::Stall; 3]);
    let client = Client::new(&silent.endpoint())
        .expect("url")
        .with_timeout(Some(std::time::Duration::from_millis(300)));
    let error = client.append(&address, &batch(&["a"]), &guarded).expect_err("never answered");
    assert!(matches!(error, Error::Io { .. }) && error.timed_out(), "{error}");
    assert!(error.transient() && error.outcome_unknown(), "{error}");
    assert_eq!(silent.accepted(), 3, "every attempt was made");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone = format!("http://{}", listener.local_addr().expect("address"));
    drop(listener);
    let error = Client::new(&gone).expect("url").append(&address, &batch(&["a"]), &guarded);
    let error = error.expect_err("refused");
    assert!(
        matches!(&error, Error::Io { error, .. }
        if error.kind() == std::io::ErrorKind::ConnectionRefused),
        "{error}"
    );
}

/// A guarded append whose first attempt landed unheard, and whose retry is refused for
/// something that does not show it did not land, fails with its outcome unknown: a new
/// writer fenced the stream meanwhile (the fencing token is checked before
/// `match_seq_num`, so the refusal has no tail), or appended past the batch's tail.
#[test]
fn a_guarded_append_refused_after_an_unknown_attempt_is_ambiguous() {
    use s3::testing::{Fault, Proxy};
    let (_dir, nova, direct) = express_server("guarded");
    let port = nova.port();
    let writer = |token: &str, seq_num| Conditions {
        match_seq_num: Some(seq_num),
        fencing_token: Some(token.into()),
    };
    // Between the attempt that landed unheard and the last (the one in the middle is
    // held unanswered until it times out), `meanwhile` runs on the stream.
    let append_with = |key: &str, meanwhile: &dyn Fn(&Address)| {
        let address = Address::new("guarded", key);
        direct.create_stream(&address, &StreamOptions::default(), None).expect("create");
        let tail = direct.fence(&address, "w1", None).expect("fence for the first writer");
        let proxy = Proxy::start(port, vec![Fault::DropResponse, Fault::Stall]);
        // Three attempts: answered and dropped, held to the timeout, refused.
        let client = Client::new(&proxy.endpoint())
            .expect("url")
            .with_attempts(3)
            .with_timeout(Some(std::time::Duration::from_secs(2)));
        std::thread::scope(|scope| {
            let appending = scope.spawn(|| {
                client.append(&address, &batch(&["a", "b"]), &writer("w1", tail.seq_num))
            });
            while proxy.accepted() < 2 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            meanwhile(&address);
            let error = appending.join().expect("the append ends").expect_err("refused");
            assert!(matches!(error, Error::Ambiguous(_)) && error.outcome_unknown(), "{error}");
            assert!(!error.transient(), "{error}");
        });
        let page = direct.read(&address, &ReadOptions::default()).expect("read");
        let bodies = bodies(&page.records);
        assert_eq!(bodies.iter().filter(|b| *b == "a").count(), 1, "landed once: {bodies:?}");
    };
    append_with("fenced", &|address| {
        direct.fence(address, "w2", Some("w1")).expect("a new writer fences");
    });
    append_with("moved", &|address| {
        let tail = direct.check_tail(address).expect("tail").seq_num;
        let more = batch(&["c", "d", "e"]);
        direct.append(address, &more, &writer("w1", tail)).expect("another append");
    });
}

/// A guarded append whose first attempt landed unheard (its answer dropped on the way),
/// and whose retry is refused with the tail the batch itself made, fails with its outcome
/// unknown, never as a refusal; it landed once. A retry that finds another tail is still
/// a refusal, and one that finds the stream where the batch goes lands it.
#[test]
fn a_guarded_append_whose_retry_finds_its_own_tail_fails_with_its_outcome_unknown() {
    use s3::testing::{Fault, Proxy};
    let (_dir, nova, direct) = express_server("guarded");
    let address = Address::new("guarded", "k");
    let guarded = |seq_num| Conditions { match_seq_num: Some(seq_num), ..Conditions::default() };
    direct.append(&address, &batch(&["first"]), &guarded(0)).expect("the first batch");
    let proxy = Proxy::start(nova.port(), vec![Fault::DropResponse]);
    let client = Client::new(&proxy.endpoint()).expect("url");
    let error = client
        .append(&address, &batch(&["second", "third"]), &guarded(1))
        .expect_err("the retry finds the tail the first attempt made");
    assert!(matches!(error, Error::Ambiguous(_)) && error.outcome_unknown(), "{error}");
    assert!(!error.transient(), "sending it again cannot tell: {error}");
    assert!(error.to_string().contains("would have made the tail 3"), "{error}");
    assert_eq!(direct.check_tail(&address).expect("tail").seq_num, 3, "landed once");
    // Another writer's tail: a plain refusal, nothing landed.
    let refused = client.append(&address, &batch(&["x"]), &guarded(1)).expect_err("refused");
    assert_eq!((refused.code(), refused.next_seq_num()), (Some("failed_precondition"), Some(3)));
    assert!(!refused.outcome_unknown(), "{refused}");
    client.append(&address, &batch(&["fourth"]), &guarded(3)).expect("lands");
    let page = direct.read(&address, &ReadOptions::default()).expect("read");
    assert_eq!(bodies(&page.records), ["first", "second", "third", "fourth"]);
}
