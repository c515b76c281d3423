//! The routes of http-api.md: one function per verb, each turning a request into an
//! engine call through the node's [`Client`] and the answer into JSON (or the binary
//! framing). Every answer carries the request id and is one count in `/metrics`; a
//! failed or slow request (`--http-log-slow-ms`) is also one log line on stderr.

use std::cell::Cell;
use std::convert::Infallible;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use engine::auth::{Access, Target};
use engine::framing::{self, FramedBody};
use engine::ids::StreamId;
use engine::limits::{
    LIST_PAGE_MAX, READ_PAGE_BYTES_MAX_BINARY, READ_PAGE_BYTES_MAX_JSON,
    READ_PAGE_RECORDS_MAX_BINARY, READ_PAGE_RECORDS_MAX_JSON, READ_WAIT_SECONDS_MAX,
};
use engine::names::{BucketName, StreamKey};
use engine::node::{Client, ServiceStop};
use engine::shard::{AppendRequest, PlanRequest, ReadReply, ReadRequest, TrimTo};
use engine::stream::{PageLimits, ReadStart};
use engine::timestamp;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use serde_json::{Value, json};

use crate::arrived::Arrived;
use crate::auth::{Auth, Caller, CallerCache};
use crate::body::Body;
use crate::error::{ApiError, position};
use crate::metrics::Metrics;
use crate::response_memory::{Refit, ResponseMemory};
use crate::wire::{self, Encoding};

/// The binary framing's media type.
pub const RECORDS_MEDIA_TYPE: &str = "application/x-nova-records";
/// The request id headers: `x-request-id` (decisions.md) and `nova-request-id`, the same value.
pub const REQUEST_ID_HEADERS: [&str; 2] = ["x-request-id", "nova-request-id"];
/// Bytes of a request id the server echoes; a longer or unprintable one is replaced.
const REQUEST_ID_BYTES_MAX: usize = 128;

/// The server's settings, from `tuning` knobs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// An append body in the binary framing, at most.
    pub body_bytes_max: u64,
    /// A JSON append body, at most.
    pub json_body_bytes_max: u64,
    /// Request body bytes one shard holds at once ([`Shared::body_memory`]).
    pub body_memory_bytes: u64,
    /// Batches of one append session sequenced and not yet acknowledged, at most.
    pub session_in_flight_max: u64,
    /// Response bytes one shard holds at once ([`Shared::responses`]).
    pub response_memory_bytes: u64,
    /// The request target plus every header name and value, at most.
    pub head_bytes_max: u64,
    /// A connection with no request being answered, or whose client has taken no byte of
    /// an answer, is closed after this long.
    pub idle_timeout: Duration,
    /// What `idle_timeout` becomes (when shorter) once a graceful stop begins.
    pub shutdown_idle: Duration,
    /// A peer that stops answering TCP is given up this long after (keepalive probes,
    /// `TCP_USER_TIMEOUT`).
    pub peer_gone: Duration,
    /// A request that succeeds is logged only when it took at least this long.
    pub log_slow: Duration,
    /// Request log lines a shard writes per second at most.
    pub log_lines_per_second: u64,
    pub heartbeat: Duration,
}

/// What every request on one shard shares.
pub struct Shared {
    pub client: Client,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub shard: usize,
    pub stopping: ServiceStop,
    /// Request ids are `<boot>-<shard>-<n>`.
    pub boot: u32,
    pub next_request: Cell<u64>,
    pub log_budget: LogBudget,
    /// None: auth is off (a loopback server without a root token).
    pub auth: Option<Arc<Auth>>,
    /// Units of `settings.body_memory_bytes`: a request's body takes its bytes as they
    /// arrive, and gives them back when the request is done with it.
    pub body_memory: Rc<glommio::sync::Semaphore>,
    /// Read and subscription pages, held until their clients have taken them.
    pub responses: Rc<ResponseMemory>,
}

/// The largest body of a request other than an append (bucket and stream settings, a
/// fence, a trim, a token): ten times the largest a valid one needs (64 grants of a
/// 1 KiB key prefix). Such a body is parsed as a JSON tree, which takes many times its
/// text; an append's body is parsed as it streams (`append_json.rs`).
pub const CONTROL_BODY_BYTES_MAX: u64 = 1 << 20;

/// How large a request body may be, and what a refusal names as the limit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyLimit {
    pub(crate) bytes: u64,
    pub(crate) name: &'static str,
}

/// Any body but an append's (`--http-body-bytes-max` is never below it).
const CONTROL_BODY_LIMIT: BodyLimit =
    BodyLimit { bytes: CONTROL_BODY_BYTES_MAX, name: "the limit of a body other than an append's" };

impl Shared {
    /// An append's body in the binary framing.
    pub(crate) fn append_body_limit(&self) -> BodyLimit {
        BodyLimit { bytes: self.settings.body_bytes_max, name: "--http-body-bytes-max" }
    }

    /// An append's JSON body.
    fn json_append_body_limit(&self) -> BodyLimit {
        BodyLimit { bytes: self.settings.json_body_bytes_max, name: "--http-json-body-bytes-max" }
    }

    /// Nothing of the shard's body memory yet, to hold a request's body with.
    pub(crate) fn body_memory(&self) -> BodyMemory {
        BodyMemory {
            memory: Rc::clone(&self.body_memory),
            bytes: 0,
            metrics: Arc::clone(&self.metrics),
            shard: self.shard,
        }
    }

    /// Takes `bytes` more of the shard's body memory for `memory`, or refuses the
    /// request: nothing waits while holding some, so no two requests can wait on each
    /// other.
    pub(crate) fn hold_body(&self, bytes: u64, memory: &mut BodyMemory) -> Result<(), ApiError> {
        if bytes == 0 {
            return Ok(());
        }
        if !self.body_memory.try_acquire(bytes).unwrap_or(false) {
            return Err(self.body_memory_full(bytes));
        }
        memory.bytes += bytes;
        self.metrics.body_bytes_held(self.shard, bytes);
        Ok(())
    }

    /// Refuses a body of `bytes` that the shard's body memory could not hold now.
    fn could_hold_body(&self, bytes: u64) -> Result<(), ApiError> {
        if bytes <= self.body_memory.available() {
            Ok(())
        } else {
            Err(self.body_memory_full(bytes))
        }
    }

    fn body_memory_full(&self, bytes: u64) -> ApiError {
        let limit = self.settings.body_memory_bytes;
        let holding = limit - self.body_memory.available();
        let mut error = ApiError::from_code(
            engine::Code::ResourceExhausted,
            format!(
                "this shard holds {holding} bytes of request bodies, and {bytes} more would \
                 pass its limit of {limit} bytes (--http-body-memory-bytes); retry shortly"
            ),
        );
        error.retry_after_seconds = Some(1);
        error
    }
}

/// A request body and the shard's body memory it holds.
struct Held<T> {
    body: T,
    memory: BodyMemory,
}

/// What one request holds of its shard's body memory: given back when dropped.
pub(crate) struct BodyMemory {
    /// The shard's body memory, given `bytes` back on drop (one count, however many
    /// pieces took them).
    memory: Rc<glommio::sync::Semaphore>,
    bytes: u64,
    metrics: Arc<Metrics>,
    shard: usize,
}

impl BodyMemory {
    /// The bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for BodyMemory {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.memory.signal(self.bytes);
        }
        self.metrics.body_bytes_released(self.shard, self.bytes);
    }
}

impl<T> std::ops::Deref for Held<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.body
    }
}

/// Serves one request: route, answer, request id, log line, count.
pub async fn handle(
    shared: Rc<Shared>,
    callers: Rc<CallerCache>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let mut in_flight = InFlight::begin(&shared, &request);
    let has_body = !hyper::body::Body::is_end_stream(request.body());
    let version = request.version();
    let (route, answer) = route(&shared, &callers, request).await;
    let error = answer.as_ref().err().map(|error| (error.code, error.message.clone()));
    // A connection whose request body was left unread cannot carry another request (hyper
    // closes it): the client is told so, rather than finding out when its next is cut.
    let unread = has_body && answer.as_ref().is_err_and(|error| error.body_unread);
    let mut response = answer.unwrap_or_else(error_response);
    if unread {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        // hyper adds `keep-alive` to an answer of version 1.1 to an HTTP/1.0 client that
        // asked for it; one of its own version it leaves alone.
        if version == hyper::Version::HTTP_10 {
            *response.version_mut() = version;
        }
    }
    if let Ok(value) = HeaderValue::from_str(&in_flight.request_id) {
        for name in REQUEST_ID_HEADERS {
            response.headers_mut().insert(name, value.clone());
        }
    }
    in_flight.end(route, response.status().as_u16(), error);
    Ok(response)
}

/// The route and status a request is counted and logged with when its client went away
/// before its answer (hyper drops the request's future): nginx's "client closed request".
const UNANSWERED: (&str, u16) = ("unanswered", 499);

/// A request from its arrival until it is answered, or dropped unanswered: counted in
/// `nova_http_requests_in_flight` meanwhile, then in `nova_http_requests_total` and, when
/// it failed or was slow, the request log, either way.
struct InFlight<'a> {
    shared: &'a Shared,
    started: Instant,
    request_id: String,
    method: Method,
    path: String,
    ended: bool,
}

impl<'a> InFlight<'a> {
    fn begin(shared: &'a Shared, request: &Request<Incoming>) -> Self {
        shared.metrics.request_started(shared.shard);
        InFlight {
            shared,
            started: Instant::now(),
            request_id: request_id(shared, request),
            method: request.method().clone(),
            path: crate::auth::shown_path(request.uri().path()).into_owned(),
            ended: false,
        }
    }

    /// Counts the request, and logs it when it failed (with its error's code, and for a
    /// server error its message: the cause an operator looks for) or was slow.
    fn end(&mut self, route: &'static str, status: u16, error: Option<(&'static str, String)>) {
        self.ended = true;
        let shared = self.shared;
        shared.metrics.request(shared.shard, route, status);
        let took = self.started.elapsed();
        if status < 400 && took < shared.settings.log_slow {
            return;
        }
        match shared.log_budget.take(self.started, shared.settings.log_lines_per_second) {
            Some(left_out) => {
                if left_out > 0 {
                    crate::log_line!(
                        "nova log shard={} left_out={left_out} (request lines past --http-log-lines-per-second)",
                        shared.shard
                    );
                }
                let error = match &error {
                    Some((code, message)) if status >= 500 => {
                        let message = crate::auth::scrub_tokens(message);
                        format!(" code={code} message={message:?}")
                    }
                    Some((code, _)) => format!(" code={code}"),
                    None => String::new(),
                };
                crate::log_line!(
                    "nova request request_id={} shard={} method={} path={:?} route={route} status={status}{error} micros={}",
                    self.request_id,
                    shared.shard,
                    self.method,
                    self.path,
                    took.as_micros()
                );
            }
            None => shared.metrics.log_line_suppressed(shared.shard),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.end(UNANSWERED.0, UNANSWERED.1, None);
        }
    }
}

/// A shard's request log lines in the current second, so that a flood of failing
/// requests costs a bounded number of log writes.
pub struct LogBudget {
    epoch: Instant,
    second: Cell<u64>,
    written: Cell<u64>,
    /// Lines left out since the last one written.
    left_out: Cell<u64>,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget {
            epoch: Instant::now(),
            second: Cell::new(0),
            written: Cell::new(0),
            left_out: Cell::new(0),
        }
    }
}

impl LogBudget {
    /// Whether a line may be written at `now`, within `per_second`: Some(lines left out
    /// before it), or None (left out, and counted).
    fn take(&self, now: Instant, per_second: u64) -> Option<u64> {
        let second = now.saturating_duration_since(self.epoch).as_secs();
        if second != self.second.get() {
            self.second.set(second);
            self.written.set(0);
        }
        if self.written.get() >= per_second {
            self.left_out.set(self.left_out.get() + 1);
            return None;
        }
        self.written.set(self.written.get() + 1);
        Some(self.left_out.replace(0))
    }
}

/// The bytes of a request's head as `--http-head-bytes-max` counts them: the request
/// target and every header name and value.
fn head_bytes(request: &Request<Incoming>) -> u64 {
    let target = request.uri().path_and_query().map_or(0, |target| target.as_str().len());
    let headers: usize =
        request.headers().iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    (target + headers) as u64
}

fn request_id(shared: &Shared, request: &Request<Incoming>) -> String {
    let sent = REQUEST_ID_HEADERS
        .iter()
        .find_map(|name| request.headers().get(*name))
        .and_then(|value| value.to_str().ok())
        .filter(|id| {
            !id.is_empty()
                && id.len() <= REQUEST_ID_BYTES_MAX
                && id.bytes().all(|b| b.is_ascii_graphic() && !b"\"'=\\".contains(&b))
        });
    match sent {
        Some(id) => id.to_owned(),
        None => {
            let n = shared.next_request.get();
            shared.next_request.set(n + 1);
            format!("{:08x}-{}-{n}", shared.boot, shared.shard)
        }
    }
}

type Answer = Result<Response<Body>, ApiError>;

pub fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(Body::full(value.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn ok(value: &Value) -> Answer {
    Ok(json_response(StatusCode::OK, value))
}

pub fn error_response(error: ApiError) -> Response<Body> {
    let mut response = json_response(error.status, &error.to_json());
    if let Some(seconds) = error.retry_after_seconds {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    if error.status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if error.status == StatusCode::METHOD_NOT_ALLOWED {
        // The message names the allowed methods; the header says it too.
        if let Some(allowed) = error.message.rsplit("use ").next()
            && let Ok(value) = HeaderValue::from_str(allowed)
        {
            response.headers_mut().insert(header::ALLOW, value);
        }
    }
    response
}

fn no_content() -> Answer {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    Ok(response)
}

async fn route(
    shared: &Rc<Shared>,
    callers: &CallerCache,
    mut request: Request<Incoming>,
) -> (&'static str, Answer) {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let shown = crate::auth::shown_path(&path);
    let not_allowed = |allowed: &str| {
        Err(ApiError::method_not_allowed(method.as_str(), &shown, allowed).before_body())
    };
    // A head past the limit is refused before anything in it is read.
    let head = head_bytes(&request);
    if head > shared.settings.head_bytes_max {
        let message = format!(
            "request head (target and headers) is {head} bytes, over the limit of {} bytes \
             (--{})",
            shared.settings.head_bytes_max,
            tuning::HTTP_HEAD_BYTES_MAX.flag
        );
        return ("head_too_large", Err(ApiError::invalid(message).before_body()));
    }
    // Who is calling comes first: a caller without a valid token learns nothing else.
    let caller = match segments.as_slice() {
        ["health"] if matches!(method, Method::GET | Method::HEAD) => Caller::Anyone,
        _ => match authenticate(shared, callers, &request) {
            Ok(caller) => caller,
            Err(error) => return ("unauthenticated", Err(error.before_body())),
        },
    };
    // A verb that takes no body refuses one rather than ignore it: a DELETE carrying a
    // condition its sender believes holds would otherwise delete regardless.
    if matches!(method, Method::GET | Method::HEAD | Method::DELETE)
        && let Err(error) = no_body(shared, &mut request).await
    {
        // Read to its end unless reading it failed (read_pieces says so then).
        return ("no_body", Err(error));
    }
    // For the verbs that take no query parameters: a misplaced one (a `match_seq_num`
    // meant for the body) is refused, never ignored.
    let refused = query(&request, &[]).err();
    // What stops a verb before it runs: a missing grant, then a refused query. Grants are
    // checked before anything is looked up, so a refusal never tells whether the target
    // exists.
    let gate = |access: Access, target: Target<'_>| {
        caller.may(access, target).err().or_else(|| refused.clone())
    };
    let denied = |access: Access, target: Target<'_>| caller.may(access, target).err();
    match segments.as_slice() {
        ["health"] => (
            "health",
            match method {
                Method::GET | Method::HEAD => health(shared, || {
                    authenticate(shared, callers, &request)
                        .is_ok_and(|caller| caller.may(Access::Read, Target::Fleet).is_ok())
                }),
                _ => not_allowed("GET, HEAD"),
            },
        ),
        ["metrics"] => (
            "metrics",
            match method {
                Method::GET | Method::HEAD => {
                    bare(gate(Access::Read, Target::Fleet), metrics(shared)).await
                }
                _ => not_allowed("GET, HEAD"),
            },
        ),
        ["v1", "buckets"] => (
            "list_buckets",
            match method {
                Method::GET => {
                    bare(denied(Access::Read, Target::Fleet), list_buckets(shared, &request)).await
                }
                _ => not_allowed("GET"),
            },
        ),
        ["v1", "buckets", bucket] => {
            let bucket = match bucket_name(bucket) {
                Ok(bucket) => bucket,
                Err(error) => return ("bucket", Err(error.before_body())),
            };
            let (admin, read) = (
                gate(Access::Admin, Target::Bucket(&bucket)),
                gate(Access::Read, Target::Bucket(&bucket)),
            );
            match method {
                Method::POST => {
                    ("create_bucket", bare(admin, create_bucket(shared, &bucket, request)).await)
                }
                Method::GET => ("get_bucket", bare(read, get_bucket(shared, &bucket)).await),
                Method::PUT => {
                    ("update_bucket", bare(admin, update_bucket(shared, &bucket, request)).await)
                }
                Method::DELETE => {
                    ("delete_bucket", bare(admin, delete_bucket(shared, &bucket)).await)
                }
                _ => ("bucket", not_allowed("POST, GET, PUT, DELETE")),
            }
        }
        ["v1", "streams", bucket] => {
            let bucket = match bucket_name(bucket) {
                Ok(bucket) => bucket,
                Err(error) => return ("list_streams", Err(error.before_body())),
            };
            (
                "list_streams",
                match method {
                    Method::GET => list_streams(shared, &caller, &bucket, &request).await,
                    _ => not_allowed("GET"),
                },
            )
        }
        ["v1", "streams", bucket, key, rest @ ..] if rest.len() <= 1 => {
            let address = match bucket_name(bucket).and_then(|b| Ok((b, stream_key(key)?))) {
                Ok(address) => address,
                Err(error) => return ("stream", Err(error.before_body())),
            };
            let (bucket, key) = (&address.0, &address.1);
            let stream = Target::Stream(bucket, key.as_str());
            match (rest.first().copied(), method.clone()) {
                (None, Method::POST) => {
                    let verb = create_stream(shared, bucket, key, request);
                    ("create_stream", bare(gate(Access::Admin, stream), verb).await)
                }
                (None, Method::GET) => {
                    let verb = get_stream(shared, bucket, key);
                    ("get_stream", bare(gate(Access::Read, stream), verb).await)
                }
                (None, Method::PATCH) => {
                    let verb = reconfigure(shared, bucket, key, request);
                    ("reconfigure_stream", bare(gate(Access::Admin, stream), verb).await)
                }
                (None, Method::DELETE) => {
                    let verb = delete_stream(shared, bucket, key);
                    ("delete_stream", bare(gate(Access::Admin, stream), verb).await)
                }
                (None, _) => ("stream", not_allowed("POST, GET, PATCH, DELETE")),
                (Some("records"), Method::POST) if crate::append_session::is_session(&request) => {
                    let verb = async {
                        Ok(crate::append_session::open(shared, &caller, bucket, key, request))
                    };
                    ("append_session", bare(gate(Access::Write, stream), verb).await)
                }
                (Some("records"), Method::POST) => {
                    let verb = append(shared, bucket, key, request);
                    ("append", bare(gate(Access::Write, stream), verb).await)
                }
                (Some("records"), Method::GET) => {
                    if let Some(denied) = denied(Access::Read, stream) {
                        ("read", Err(denied))
                    } else if accepts(&request, "text/event-stream") {
                        let answer = crate::subscribe::subscribe(
                            shared, &caller, bucket, key, &request, false,
                        );
                        ("subscribe", answer.await)
                    } else if accepts_binary_subscription(&request) {
                        let answer = crate::subscribe::subscribe(
                            shared, &caller, bucket, key, &request, true,
                        );
                        ("subscribe", answer.await)
                    } else {
                        ("read", read(shared, &caller, bucket, key, &request).await)
                    }
                }
                (Some("records"), _) => ("records", not_allowed("POST, GET")),
                (Some("tail"), Method::GET) => {
                    let verb = check_tail(shared, bucket, key);
                    ("check_tail", bare(gate(Access::Read, stream), verb).await)
                }
                (Some("tail"), _) => ("check_tail", not_allowed("GET")),
                (Some("fence"), Method::POST) => (
                    "fence",
                    bare(gate(Access::Write, stream), fence(shared, bucket, key, request)).await,
                ),
                (Some("fence"), _) => ("fence", not_allowed("POST")),
                (Some("trim"), Method::POST) => (
                    "trim",
                    bare(gate(Access::Write, stream), trim(shared, bucket, key, request)).await,
                ),
                (Some("trim"), _) => ("trim", not_allowed("POST")),
                (Some("plan"), Method::GET) => {
                    let verb = plan(shared, bucket, key, &request);
                    ("read_plan", bare(denied(Access::Read, stream), verb).await)
                }
                (Some("plan"), _) => ("read_plan", not_allowed("GET")),
                _ => ("unknown", Err(ApiError::no_route(method.as_str(), &shown).before_body())),
            }
        }
        ["v1", "tokens"] => {
            let admin = gate(Access::Admin, Target::Fleet);
            match method {
                Method::POST => {
                    ("issue_token", bare(admin, issue_token(shared, &caller, request)).await)
                }
                Method::GET => {
                    let verb = list_tokens(shared, &request);
                    ("list_tokens", bare(denied(Access::Admin, Target::Fleet), verb).await)
                }
                _ => ("tokens", not_allowed("POST, GET")),
            }
        }
        ["v1", "tokens", id] => match method {
            Method::DELETE => (
                "revoke_token",
                bare(gate(Access::Admin, Target::Fleet), revoke_token(shared, id)).await,
            ),
            _ => ("revoke_token", not_allowed("DELETE")),
        },
        _ => ("unknown", Err(ApiError::no_route(method.as_str(), &shown).before_body())),
    }
}

/// The caller of a request: anyone when auth is off, else who its token names.
fn authenticate(
    shared: &Shared,
    callers: &CallerCache,
    request: &Request<Incoming>,
) -> Result<Caller, ApiError> {
    match &shared.auth {
        None => Ok(Caller::Anyone),
        Some(auth) => auth.authenticate(callers, request.headers(), now_ms()),
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// Runs `verb` unless something stops it first: a missing grant, or a query parameter
/// where the verb takes none.
async fn bare(stop: Option<ApiError>, verb: impl Future<Output = Answer>) -> Answer {
    match stop {
        Some(error) => Err(error.before_body()),
        None => verb.await,
    }
}

// ---- Request parts --------------------------------------------------------------------

fn decode_segment(segment: &str, field: &str) -> Result<String, ApiError> {
    // `%` starts an escape of two hex digits, or nothing is meant by it: taken literally,
    // `a%2` and `a%252` would name one key two ways.
    let bytes = segment.as_bytes();
    if let Some(at) = bytes.iter().enumerate().position(|(i, &b)| {
        b == b'%'
            && !bytes.get(i + 1..i + 3).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    }) {
        let escape: String = segment[at..].chars().take(3).collect();
        return Err(ApiError::invalid(format!(
            "{field} {segment:?} is not percent-encoded: {escape:?} is not % and two hex digits \
             (a % itself is %25)"
        )));
    }
    let bytes: Vec<u8> = percent_decode_str(segment).collect();
    String::from_utf8(bytes).map_err(|_| {
        ApiError::invalid(format!("{field} {segment:?} is not valid UTF-8 once percent-decoded"))
    })
}

fn bucket_name(segment: &str) -> Result<BucketName, ApiError> {
    Ok(BucketName::parse(&decode_segment(segment, "bucket name")?)?)
}

fn stream_key(segment: &str) -> Result<StreamKey, ApiError> {
    Ok(StreamKey::parse(&decode_segment(segment, "stream key")?)?)
}

/// The query parameters, percent-decoded (`+` is a space); each name may appear once and
/// only the names in `accepted`.
pub fn query(
    request: &Request<Incoming>,
    accepted: &[&str],
) -> Result<Vec<(String, String)>, ApiError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for pair in request.uri().query().unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode_segment(&name.replace('+', " "), "query parameter name")?;
        let value = decode_segment(&value.replace('+', " "), &format!("query parameter {name}"))?;
        if accepted.is_empty() {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {name:?}: {} {} takes no query parameters",
                request.method(),
                crate::auth::shown_path(request.uri().path())
            )));
        }
        if !accepted.contains(&name.as_str()) {
            return Err(ApiError::invalid(format!(
                "unknown query parameter {name:?}; accepted parameters are {}",
                accepted.join(", ")
            )));
        }
        if pairs.iter().any(|(seen, _)| *seen == name) {
            return Err(ApiError::invalid(format!("query parameter {name} is given twice")));
        }
        pairs.push((name, value));
    }
    Ok(pairs)
}

fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// `text` as a whole number written as the API writes one: digits, after a minus sign
/// for a signed type. (Rust's parsers also take a leading `+`.)
pub(crate) fn plain_number<T: std::str::FromStr>(text: &str, signed: bool) -> Option<T> {
    let digits = if signed { text.strip_prefix('-').unwrap_or(text) } else { text };
    let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    plain.then(|| text.parse().ok()).flatten()
}

/// Which whole numbers a query parameter takes, as the refusal of one that is not a
/// number says (the verb checks the range).
#[derive(Clone, Copy)]
enum Whole {
    /// `seq_num`, `tail_offset`.
    Position,
    /// A list's `limit`.
    ListLimit,
    /// A read's `count` and `bytes` (0 is refused as a bound of its own).
    Bound,
}

impl std::fmt::Display for Whole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Whole::Position => write!(f, "a whole number from 0 to {}", u64::MAX),
            Whole::ListLimit => write!(f, "a whole number from 1 to {LIST_PAGE_MAX}"),
            Whole::Bound => {
                write!(f, "a whole number from 1 to {} (omit it: no bound)", u64::MAX)
            }
        }
    }
}

fn number_param(
    pairs: &[(String, String)],
    name: &str,
    accepted: Whole,
) -> Result<Option<u64>, ApiError> {
    param(pairs, name)
        .map(|text| {
            plain_number::<u64>(text, false).ok_or_else(|| {
                ApiError::invalid(format!(
                    "query parameter {name} must be {accepted}, not {text:?}"
                ))
            })
        })
        .transpose()
}

/// A timestamp bound (int64 milliseconds), as stored stamps compare with it
/// ([`timestamp::clamp_to_stored`]).
fn timestamp_param(pairs: &[(String, String)], name: &str) -> Result<Option<u64>, ApiError> {
    param(pairs, name)
        .map(|text| {
            plain_number::<i64>(text, true).map(timestamp::clamp_to_stored).ok_or_else(|| {
                ApiError::invalid(format!(
                    "query parameter {name} must be a whole number of milliseconds from {} to \
                     {}, not {text:?}",
                    i64::MIN,
                    i64::MAX
                ))
            })
        })
        .transpose()
}

fn bool_param(pairs: &[(String, String)], name: &str) -> Result<Option<bool>, ApiError> {
    param(pairs, name)
        .map(|text| match text {
            "true" | "1" | "" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(ApiError::invalid(format!(
                "query parameter {name} must be true or false (or 1, 0; given bare, true), not \
                 {text:?}"
            ))),
        })
        .transpose()
}

/// The JSON encoding asked for with `Nova-Encoding`.
pub fn encoding(request: &Request<Incoming>) -> Result<Encoding, ApiError> {
    match request.headers().get("nova-encoding").map(HeaderValue::to_str) {
        None => Ok(Encoding::Text),
        Some(Ok(value)) if value.trim().eq_ignore_ascii_case("base64") => Ok(Encoding::Base64),
        Some(value) => Err(ApiError::invalid(format!(
            "header Nova-Encoding must be base64 (or absent for UTF-8 text), not {:?}",
            value.unwrap_or("(not text)")
        ))),
    }
}

fn media_type(value: Option<&HeaderValue>) -> Option<String> {
    let value = value?.to_str().ok()?;
    Some(value.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
}

/// Whether `Accept` names this media type.
pub fn accepts(request: &Request<Incoming>, media: &str) -> bool {
    request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case(media))
}

/// Whether `Accept` asks for a binary subscription:
/// `application/x-nova-records; subscribe=true`.
pub fn accepts_binary_subscription(request: &Request<Incoming>) -> bool {
    request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| is_records_with(v, "subscribe=true"))
}

/// Whether a media type (one of `Accept`'s, or a `Content-Type`) is the binary framing
/// with `parameter` (`subscribe=true`, `session=true`).
pub(crate) fn is_records_with(media: &str, parameter: &str) -> bool {
    let mut parts = media.split(';').map(str::trim);
    parts.next().is_some_and(|media| media.eq_ignore_ascii_case(RECORDS_MEDIA_TYPE))
        && parts.any(|p| p.eq_ignore_ascii_case(parameter))
}

/// The request body in one piece (joined, a copy, only if it came in several); see
/// [`read_pieces`].
async fn read_body(
    shared: &Shared,
    request: &mut Request<Incoming>,
    limit: BodyLimit,
) -> Result<Held<Bytes>, ApiError> {
    let Held { body: mut pieces, mut memory } =
        read_pieces(shared, request, limit).await.map_err(ApiError::before_body)?;
    let body = match pieces.len() {
        1 => pieces.pop().expect("one piece"),
        _ => {
            // Joined for the parser: held too. The pieces go once joined, and what a JSON
            // append is encoded into, never larger than its text, takes their place; so a
            // body held twice is never more than that in memory.
            let len = pieces.iter().map(|piece| piece.len() as u64).sum();
            shared.hold_body(len, &mut memory)?;
            pieces.concat().into()
        }
    };
    Ok(Held { body, memory })
}

/// The body of a verb that takes none: an empty one, or an empty JSON object (`{}`, as
/// any body with no fields is), passes; anything else is refused as a body with an
/// unknown field is.
async fn no_body(shared: &Shared, request: &mut Request<Incoming>) -> Result<(), ApiError> {
    use hyper::body::Body as _;
    if request.body().is_end_stream() {
        return Ok(());
    }
    let method = request.method().clone();
    let body = read_body(shared, request, CONTROL_BODY_LIMIT).await?;
    wire::parse_body(&body, &[]).map(drop).map_err(|error| {
        ApiError::invalid(format!("{method} takes no request body: {}", error.message))
    })
}

/// The request body, in the pieces hyper read it in (never joined here), refused past
/// the limit before it is held whole: from `Content-Length` at once, or as soon as the
/// bytes read pass the limit. Its bytes are taken from the shard's body memory first:
/// all of them from `Content-Length` before any is read, else each piece as it comes. A
/// refusal leaves the body unread, all of it or the rest ([`ApiError::before_body`]).
async fn read_pieces(
    shared: &Shared,
    request: &mut Request<Incoming>,
    limit: BodyLimit,
) -> Result<Held<Vec<Bytes>>, ApiError> {
    let BodyLimit { bytes: limit, name } = limit;
    let too_large = |len: String| {
        ApiError::invalid(format!(
            "request body is {len}, over the limit of {limit} bytes ({name})"
        ))
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared
        && len > limit
    {
        return Err(too_large(format!("{len} bytes")));
    }
    let mut memory = shared.body_memory();
    // A body that could not be held now is refused before a byte of it is read; what is
    // held is only what has arrived, so a client that stops sending holds no more.
    shared.could_hold_body(declared.unwrap_or(0))?;
    let mut limited = http_body_util::Limited::new(
        request.body_mut(),
        usize::try_from(limit).unwrap_or(usize::MAX),
    );
    let mut arrived = Arrived::default();
    let idle = shared.settings.idle_timeout;
    loop {
        let next = futures_lite::future::or(async { Some(limited.frame().await) }, async {
            glommio::timer::sleep(idle).await;
            None
        });
        let Some(frame) = next.await else {
            return Err(ApiError::invalid(format!(
                "the request body stalled: no byte of it for {} ms (--http-idle-timeout-ms)",
                idle.as_millis()
            )));
        };
        let Some(frame) = frame else { break };
        match frame {
            // Trailers, the only other kind of frame, carry nothing nova reads.
            Ok(frame) => {
                if let Ok(piece) = frame.into_data() {
                    shared.hold_body(piece.len() as u64, &mut memory)?;
                    arrived.push(piece);
                }
            }
            Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                return Err(too_large("larger".into()));
            }
            Err(error) => {
                return Err(ApiError::invalid(format!("reading the request body failed: {error}")));
            }
        }
    }
    Ok(Held { body: arrived.take_all(), memory })
}

// ---- Operations -----------------------------------------------------------------------

async fn metrics(shared: &Shared) -> Answer {
    let stats = shared.client.stats().await?;
    let (uploader, auditor) = (shared.client.uploader_stats(), shared.client.auditor_stats());
    let mut response =
        Response::new(Body::full(shared.metrics.render(&stats, &uploader, &auditor)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

/// `/health`, which needs no token: 503 while a shard recovers, or once one failed (it
/// acknowledges nothing until a restart, so a supervisor watching this restarts nova);
/// else 200, serving, or degraded while object PUTs fail. A store that is down is no
/// reason to restart (a restart cannot bring it back, and reads, express appends and the
/// control plane go on), so that stays a 200, while standard appends wait in memory,
/// within the shards' budget, until the store is back. Why a shard or a PUT failed is
/// told only to a caller who may read `/metrics` (`detailed`): its text can name paths
/// and endpoints.
fn health(shared: &Shared, detailed: impl FnOnce() -> bool) -> Answer {
    let unavailable =
        |message: String| Err(ApiError::from_code(engine::Code::Unavailable, message));
    if !shared.client.recovered() {
        return unavailable(
            "recovering: a shard is still replaying its journal; retry shortly".into(),
        );
    }
    if let Some(why) = shared.client.failed() {
        let why = if detailed() { why } else { "a shard".into() };
        return unavailable(format!("{why} acknowledges nothing more until nova is restarted"));
    }
    let uploader = shared.client.uploader_stats();
    let Some(failing_for) = uploader.failing_for else {
        return ok(&json!({"status": "serving"}));
    };
    let mut message = format!(
        "{} object PUTs failing for {} s; standard appends wait until the store takes them",
        uploader.puts_failing,
        failing_for.as_secs(),
    );
    if let Some(error) = uploader.last_put_error.filter(|_| detailed()) {
        message = format!("{message}: {error}");
    }
    ok(&json!({
        "status": "degraded",
        "message": message,
        "object_puts_failing": uploader.puts_failing,
        "object_store_failing_ms": u64::try_from(failing_for.as_millis()).unwrap_or(u64::MAX),
    }))
}

// ---- Buckets --------------------------------------------------------------------------

async fn list_buckets(shared: &Shared, request: &Request<Incoming>) -> Answer {
    let pairs = query(request, &["limit", "start_after"])?;
    let limit = number_param(&pairs, "limit", Whole::ListLimit)?;
    let page = shared.client.control().list_buckets(param(&pairs, "start_after"), limit).await?;
    let buckets: Vec<Value> = page.buckets.iter().map(wire::bucket_json).collect();
    let next = page.next.map(BucketName::into_string).unwrap_or_default();
    ok(&json!({"buckets": buckets, "next": next}))
}

async fn create_bucket(
    shared: &Shared,
    bucket: &BucketName,
    mut request: Request<Incoming>,
) -> Answer {
    let body = read_body(shared, &mut request, CONTROL_BODY_LIMIT).await?;
    let (config, token) = wire::bucket_create(&body)?;
    let created = shared.client.control().create_bucket(bucket, &config, token.as_deref()).await?;
    let status = if created.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok(json_response(status, &wire::bucket_json(&created.record)))
}

async fn get_bucket(shared: &Shared, bucket: &BucketName) -> Answer {
    ok(&wire::bucket_json(&shared.client.control().get_bucket(bucket).await?))
}

async fn update_bucket(
    shared: &Shared,
    bucket: &BucketName,
    mut request: Request<Incoming>,
) -> Answer {
    let body = read_body(shared, &mut request, CONTROL_BODY_LIMIT).await?;
    let config = wire::bucket_update(&body)?;
    ok(&wire::bucket_json(&shared.client.control().update_bucket(bucket, &config).await?))
}

async fn delete_bucket(shared: &Shared, bucket: &BucketName) -> Answer {
    shared.client.control().delete_bucket(bucket).await?;
    no_content()
}

// ---- Tokens ---------------------------------------------------------------------------

/// The token verbs on a server whose auth is off are refused: a token would change nothing.
fn token_table(shared: &Shared) -> Result<&Auth, ApiError> {
    shared.auth.as_deref().ok_or_else(|| {
        ApiError::from_code(
            engine::Code::FailedPrecondition,
            "authentication is off on this server (no --root-token-file), so tokens \
             would change nothing; start it with --root-token-file to use them",
        )
    })
}

async fn issue_token(shared: &Shared, caller: &Caller, mut request: Request<Incoming>) -> Answer {
    let auth = token_table(shared).map_err(ApiError::before_body)?;
    let body = read_body(shared, &mut request, CONTROL_BODY_LIMIT).await?;
    let asked = wire::token_request(&body)?;
    let now = now_ms();
    let expires_at_ms = asked.expires_in_seconds.map(|seconds| now.saturating_add(seconds * 1000));
    let control = shared.client.control();
    let (record, token) =
        auth.issue(control, caller, asked.grants, now, expires_at_ms, asked.description).await?;
    let mut answer = wire::token_json(&record);
    answer["token"] = json!(token);
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// ListTokens pages like ListBuckets: `limit` (at most 1000) tokens after `start_after`.
async fn list_tokens(shared: &Shared, request: &Request<Incoming>) -> Answer {
    let auth = token_table(shared)?;
    let pairs = query(request, &["limit", "start_after"])?;
    let limit = match number_param(&pairs, "limit", Whole::ListLimit)? {
        None => LIST_PAGE_MAX,
        Some(limit) => u32::try_from(limit)
            .ok()
            .filter(|limit| (1..=LIST_PAGE_MAX).contains(limit))
            .ok_or(engine::Error::ListLimitOutOfRange { limit, max: LIST_PAGE_MAX })?,
    };
    let (tokens, next) = auth.list(param(&pairs, "start_after"), limit as usize);
    let tokens: Vec<Value> = tokens.iter().map(|t| wire::token_json(t)).collect();
    ok(&json!({"tokens": tokens, "next": next.unwrap_or_default()}))
}

async fn revoke_token(shared: &Shared, id: &str) -> Answer {
    let id = decode_segment(id, "token ID")?;
    token_table(shared)?.revoke(shared.client.control(), &id).await?;
    no_content()
}

// ---- Streams --------------------------------------------------------------------------

async fn list_streams(
    shared: &Shared,
    caller: &Caller,
    bucket: &BucketName,
    request: &Request<Incoming>,
) -> Answer {
    let pairs = query(request, &["prefix", "start_after", "limit"])?;
    // A stream-prefix grant lists only under its prefix.
    caller.may(Access::Read, Target::Listing(bucket, param(&pairs, "prefix").unwrap_or("")))?;
    let limit = number_param(&pairs, "limit", Whole::ListLimit)?;
    let page = shared
        .client
        .control()
        .list_streams(
            bucket,
            param(&pairs, "prefix").unwrap_or(""),
            param(&pairs, "start_after"),
            limit,
        )
        .await?;
    let streams: Vec<Value> = page.streams.iter().map(|s| wire::stream_json(s, None)).collect();
    let next = page.next.map(StreamKey::into_string).unwrap_or_default();
    ok(&json!({"streams": streams, "next": next}))
}

async fn create_stream(
    shared: &Shared,
    bucket: &BucketName,
    key: &StreamKey,
    mut request: Request<Incoming>,
) -> Answer {
    let body = read_body(shared, &mut request, CONTROL_BODY_LIMIT).await?;
    let (options, token) = wire::stream_create(&body)?;
    let created =
        shared.client.control().create_stream(bucket, key, &options, token.as_deref()).await?;
    let status = if created.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok(json_response(status, &wire::stream_json(&created.record, None)))
}

async fn get_stream(shared: &Shared, bucket: &BucketName, key: &StreamKey) -> Answer {
    let (record, tail) = shared.client.get_stream(bucket, key).await?;
    ok(&wire::stream_json(&record, Some(tail)))
}

async fn reconfigure(
    shared: &Shared,
    bucket: &BucketName,
    key: &StreamKey,
    mut request: Request<Incoming>,
) -> Answer {
    let body = read_body(shared, &mut request, CONTROL_BODY_LIMIT).await?;
    let patch = wire::stream_patch(&body)?;
    ok(&wire::stream_json(&shared.client.reconfigure(bucket, key, patch).await?, None))
}

async fn delete_stream(shared: &Shared, bucket: &BucketName, key: &StreamKey) -> Answer {
    shared.client.delete_stream(bucket, key).await?;
    no_content()
}

// ---- Records --------------------------------------------------------------------------

async fn append(
    shared: &Shared,
    bucket: &BucketName,
    key: &StreamKey,
    mut request: Request<Incoming>,
) -> Answer {
    let binary = media_type(request.headers().get(header::CONTENT_TYPE)).as_deref()
        == Some(RECORDS_MEDIA_TYPE);
    let encoding = encoding(&request).map_err(ApiError::before_body)?;
    // The body's memory is held until the append is answered: the framed batch (or
    // what the JSON was encoded into, no larger) is alive until then.
    let (append, _memory) = if binary {
        // The framed batch goes to the engine as it came, in the pieces it was read in;
        // the engine validates it in place.
        let Held { body, memory } = read_pieces(shared, &mut request, shared.append_body_limit())
            .await
            .map_err(ApiError::before_body)?;
        (AppendRequest { framed: FramedBody::from_pieces(body), offered: None }, memory)
    } else {
        let Held { body, memory } =
            read_body(shared, &mut request, shared.json_append_body_limit()).await?;
        (crate::append_json::append_request(&body, encoding)?, memory)
    };
    let ack = shared.client.append(bucket, key, append).await?;
    ok(&json!({
        "start": position(ack.start),
        "end": position(ack.end),
        "tail": position(ack.tail),
    }))
}

/// A read's start and bounds from its query (also a subscription's).
#[derive(Clone, Copy, Debug)]
pub struct ReadParams {
    pub start: ReadStart,
    pub clamp: bool,
    pub count: Option<u64>,
    pub bytes: Option<u64>,
    pub until: Option<u64>,
    pub wait: Option<Duration>,
    /// `stream_id`: read this stream only; NotFound once its address names another (it
    /// was deleted and a stream created there anew) or none.
    pub stream: Option<StreamId>,
}

/// The query parameters of a read or a subscription.
pub const READ_PARAMS: [&str; 9] = [
    "seq_num",
    "timestamp",
    "tail_offset",
    "count",
    "bytes",
    "until",
    "clamp",
    "wait",
    "stream_id",
];
/// A ReadPlan's: a read's but `wait` (a plan never waits).
const PLAN_PARAMS: [&str; 7] =
    ["seq_num", "timestamp", "tail_offset", "count", "bytes", "until", "clamp"];

pub fn read_params(request: &Request<Incoming>, accepted: &[&str]) -> Result<ReadParams, ApiError> {
    let pairs = query(request, accepted)?;
    let starts: Vec<ReadStart> = [
        number_param(&pairs, "seq_num", Whole::Position)?.map(ReadStart::SeqNum),
        timestamp_param(&pairs, "timestamp")?.map(ReadStart::Timestamp),
        number_param(&pairs, "tail_offset", Whole::Position)?.map(ReadStart::TailOffset),
    ]
    .into_iter()
    .flatten()
    .collect();
    let start = match starts.as_slice() {
        [] => ReadStart::SeqNum(0),
        [one] => *one,
        _ => {
            return Err(ApiError::invalid(
                "a read starts at one of seq_num, timestamp or tail_offset, not several",
            ));
        }
    };
    let bound = |name: &'static str| -> Result<Option<u64>, ApiError> {
        match number_param(&pairs, name, Whole::Bound)? {
            Some(0) => Err(engine::Error::read_bound_zero(name).into()),
            other => Ok(other),
        }
    };
    let wait = param(&pairs, "wait").map(|text| {
        plain_number::<u64>(text, false).ok_or_else(|| {
            ApiError::invalid(format!(
                "query parameter wait must be whole seconds from 0 to {READ_WAIT_SECONDS_MAX}, \
                 not {text:?}"
            ))
        })
    });
    let wait = match wait.transpose()? {
        Some(seconds) if seconds > u64::from(READ_WAIT_SECONDS_MAX) => {
            return Err(engine::Error::read_wait_too_long(seconds).into());
        }
        Some(0) | None => None,
        Some(seconds) => Some(Duration::from_secs(seconds)),
    };
    Ok(ReadParams {
        start,
        clamp: bool_param(&pairs, "clamp")?.unwrap_or(false),
        count: bound("count")?,
        bytes: bound("bytes")?,
        until: timestamp_param(&pairs, "until")?,
        wait,
        stream: stream_param(&pairs)?,
    })
}

fn stream_param(pairs: &[(String, String)]) -> Result<Option<StreamId>, ApiError> {
    let Some(text) = param(pairs, "stream_id") else { return Ok(None) };
    let id = StreamId::from_hex(text).ok_or_else(|| {
        ApiError::invalid(format!(
            "query parameter stream_id must be a stream's id (32 hex digits), not {text:?}"
        ))
    })?;
    Ok(Some(id))
}

/// A page's limits: the caller's bounds folded with the format's page caps.
pub fn page_limits(
    count: Option<u64>,
    bytes: Option<u64>,
    until: Option<u64>,
    binary: bool,
) -> PageLimits {
    let (records_cap, bytes_cap) = if binary {
        (u64::from(READ_PAGE_RECORDS_MAX_BINARY), READ_PAGE_BYTES_MAX_BINARY)
    } else {
        (u64::from(READ_PAGE_RECORDS_MAX_JSON), READ_PAGE_BYTES_MAX_JSON)
    };
    PageLimits {
        records: count.map_or(records_cap, |c| c.min(records_cap)),
        bytes: bytes.map_or(bytes_cap, |b| b.min(bytes_cap)),
        until,
    }
}

/// One page, waiting up to `wait` for records when none are readable (a stopping node
/// answers a waiting read at once, so a long poll never holds up a graceful stop); of
/// the stream `only` when given, which is never created.
pub async fn read_page(
    shared: &Shared,
    bucket: &BucketName,
    key: &StreamKey,
    only: Option<StreamId>,
    request: ReadRequest,
) -> engine::Result<ReadReply> {
    match only {
        Some(stream) => shared.client.read_existing(bucket, key, stream, request).await,
        None => shared.client.read(bucket, key, request).await,
    }
}

/// The response header that names the stream a read or subscription reads: its
/// `stream_id` to stay on it (a resumed subscription, never its address's successor).
pub const STREAM_ID_HEADER: &str = "nova-stream-id";

pub fn stream_id_header(stream: StreamId) -> HeaderValue {
    HeaderValue::from_str(&stream.to_string()).expect("hex digits are a valid header value")
}

async fn read(
    shared: &Shared,
    caller: &Caller,
    bucket: &BucketName,
    key: &StreamKey,
    request: &Request<Incoming>,
) -> Answer {
    let binary = accepts(request, RECORDS_MEDIA_TYPE);
    let encoding = encoding(request)?;
    let params = read_params(request, &READ_PARAMS)?;
    // The page is cut to the shard's free response memory, and held in it until its
    // client has taken it (response_memory.rs).
    let mut limits = page_limits(params.count, params.bytes, params.until, binary);
    limits.bytes = shared.responses.page_bytes(limits.bytes)?;
    let mut read =
        ReadRequest { start: params.start, clamp: params.clamp, limits, wait: params.wait };
    let mut cuts = 0;
    let (body, media, hold, stream) = loop {
        let reply = read_page(shared, bucket, key, params.stream, read).await?;
        // A long poll may have waited a minute: its token is checked again before
        // records read since go out.
        if let (Some(_), Some(auth)) = (params.wait, &shared.auth) {
            auth.still_valid(caller, now_ms())?;
        }
        let (records, content, first_seq_num) =
            (reply.record_count, reply.content_bytes, reply.next_seq_num - reply.record_count);
        let (body, media) = if binary {
            let mut frames = reply.frames;
            framing::encode_page_end(reply.next_seq_num, reply.tail, &mut frames);
            (frames, RECORDS_MEDIA_TYPE)
        } else {
            let records = match wire::records_json(&reply.frames, encoding) {
                Ok(records) => records,
                // The page ends before the first record JSON cannot carry: read again,
                // cut to the records before it (the read from it fails, naming it).
                Err(wire::Unwritable { records_before, .. }) if records_before > 0 => {
                    read = ReadRequest {
                        start: ReadStart::SeqNum(first_seq_num),
                        clamp: false,
                        limits: PageLimits { records: records_before, ..read.limits },
                        wait: None,
                    };
                    continue;
                }
                Err(unwritable) => return Err(unwritable.error),
            };
            let page = json!({
                "records": records,
                "next_seq_num": reply.next_seq_num,
                "tail": position(reply.tail),
            });
            (page.to_string().into_bytes(), "application/json")
        };
        let bytes = body.len() as u64;
        if records == 0 {
            // A page of no records is a few dozen bytes: nothing to hold.
            break (body, media, None, reply.stream);
        }
        if let Some(hold) = shared.responses.try_hold(bytes) {
            break (body, media, Some(hold), reply.stream);
        }
        // Encoded, the page is larger than what is free (its cut counted content, or
        // others took the room while it was read): read again from where it began, cut
        // to fit, without waiting; refused only when one record is more than is free,
        // too little is free to cut to, or cuts did not make it fit.
        let Refit::Cut(cut) = shared.responses.refit(records, content, bytes, cuts) else {
            return Err(shared.responses.refusal(bytes));
        };
        cuts += 1;
        let limits = PageLimits {
            records: read.limits.records.min(cut.records),
            bytes: read.limits.bytes.min(cut.bytes),
            ..read.limits
        };
        read = ReadRequest {
            start: ReadStart::SeqNum(first_seq_num),
            clamp: false,
            limits,
            wait: None,
        };
    };
    let mut response = Response::new(match hold {
        Some(hold) => Body::held(body, hold),
        None => Body::full(body),
    });
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    response.headers_mut().insert(STREAM_ID_HEADER, stream_id_header(stream));
    Ok(response)
}

/// ReadPlan: the read's start and bounds (no `wait`); never creates the stream.
async fn plan(
    shared: &Shared,
    bucket: &BucketName,
    key: &StreamKey,
    request: &Request<Incoming>,
) -> Answer {
    let params = read_params(request, &PLAN_PARAMS)?;
    let plan = PlanRequest {
        start: params.start,
        clamp: params.clamp,
        limits: page_limits(params.count, params.bytes, params.until, true),
    };
    let plan = shared.client.plan(bucket, key, plan).await?;
    let extents: Vec<Value> = plan
        .extents
        .iter()
        .map(|e| {
            json!({
                "object": e.object,
                "offset": e.offset,
                "length": e.length,
                "first_seq_num": e.first_seq_num,
                "count": e.count,
            })
        })
        .collect();
    ok(&json!({
        "start_seq_num": plan.start_seq_num,
        "extents": extents,
        "memory_from_seq_num": plan.memory_from_seq_num,
        "tail": position(plan.tail),
    }))
}

async fn check_tail(shared: &Shared, bucket: &BucketName, key: &StreamKey) -> Answer {
    let tail = shared.client.check_tail(bucket, key).await?;
    ok(&json!({"tail": position(tail)}))
}

async fn fence(
    shared: &Shared,
    bucket: &BucketName,
    key: &StreamKey,
    mut request: Request<Incoming>,
) -> Answer {
    let body = read_body(shared, &mut request, CONTROL_BODY_LIMIT).await?;
    let object = wire::parse_body(&body, &["fencing_token", "expected"])?;
    let token = object
        .str("fencing_token")?
        .ok_or_else(|| ApiError::invalid("field fencing_token is required"))?
        .to_owned();
    let expected = object.str("expected")?.map(str::to_owned);
    let tail = shared.client.fence(bucket, key, token, expected).await?;
    ok(&json!({"tail": position(tail)}))
}

async fn trim(
    shared: &Shared,
    bucket: &BucketName,
    key: &StreamKey,
    mut request: Request<Incoming>,
) -> Answer {
    let body = read_body(shared, &mut request, CONTROL_BODY_LIMIT).await?;
    let object = wire::parse_body(&body, &["seq_num", "timestamp"])?;
    let stamp = object.i64("timestamp")?.map(timestamp::clamp_to_stored);
    let to = match (object.u64("seq_num")?, stamp) {
        (Some(seq_num), None) => TrimTo::SeqNum(seq_num),
        (None, Some(timestamp)) => TrimTo::Timestamp(timestamp),
        _ => return Err(ApiError::invalid("a trim carries exactly one of seq_num or timestamp")),
    };
    let trim_seq_num = shared.client.trim(bucket, key, to).await?;
    ok(&json!({"trim_seq_num": trim_seq_num}))
}
