//! The S3 object store on aws-sdk-s3, for AWS and S3-compatible servers.
//!
//! Every key is stored as `<prefix>/<key>` in one bucket. Configuration comes from
//! [`S3Config`], whose unset parts fall back to the usual AWS environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` or
//! `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`); nothing is read
//! from profiles or instance metadata (no aws-config, a lighter build).
//!
//! Requests go out without the SDK's newer default checksums (`WhenRequired`, which
//! S3-compatible servers accept) and without its retries: [`crate::retry`] times each
//! attempt out and retries transient failures (timeouts, connection errors, 5xx,
//! throttling) with capped, jittered backoff. A create-only put sends
//! `If-None-Match: *`, and a 412 means the key exists. Objects above the multipart
//! threshold go up in parts, a bounded number at once; an upload that fails is aborted.
//!
//! This module maps every failure to [`Error`] with the call, the caller's key and the
//! cause (HTTP status, S3 error code and message, or the transport's error chain). It
//! never creates or configures buckets.

use std::fmt;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use tokio::task::JoinSet;

use crate::error::{Cause, Error, Op};
use crate::key::{check_key, check_prefix};
use crate::range::ByteRange;
use crate::retry::{Failure, PARTS_MAX, TransferPolicy, retry};
use crate::{
    BoxFuture, ListPage, ObjectMeta, ObjectStore, PutCondition, check_get_args, check_key_for,
    check_list_args,
};

/// Static credentials. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("session_token", &self.session_token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl S3Credentials {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and the optional
    /// `AWS_SESSION_TOKEN`, when the first two are set.
    pub fn from_env() -> Option<Self> {
        Some(Self {
            access_key_id: env("AWS_ACCESS_KEY_ID")?,
            secret_access_key: env("AWS_SECRET_ACCESS_KEY")?,
            session_token: env("AWS_SESSION_TOKEN"),
        })
    }
}

/// Where and how to reach the bucket. `None` fields fall back to the environment.
#[derive(Clone, Debug)]
pub struct S3Config {
    pub bucket: String,
    /// Stored keys are `<prefix>/<key>`; empty for none. Follows the key rule.
    pub prefix: String,
    /// `http://` or `https://` URL of an S3-compatible server; `None`: the
    /// `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` variable, else AWS.
    pub endpoint: Option<String>,
    /// `None`: `AWS_REGION`, else `AWS_DEFAULT_REGION`; one of them must be set.
    pub region: Option<String>,
    /// Path-style URLs (`endpoint/bucket/key`), which most S3-compatible servers need.
    pub path_style: bool,
    /// `None`: [`S3Credentials::from_env`]; one of them must give credentials.
    pub credentials: Option<S3Credentials>,
    pub policy: TransferPolicy,
}

impl S3Config {
    /// A bucket with no prefix, everything else from the environment and the knobs'
    /// defaults.
    pub fn new(bucket: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            prefix: String::new(),
            endpoint: None,
            region: None,
            path_style: false,
            credentials: None,
            policy: TransferPolicy::default(),
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// The S3 object store. Cheap to clone; clones share the HTTP connections.
#[derive(Clone, Debug)]
pub struct S3Store {
    client: Client,
    bucket: String,
    /// `""` or the configured prefix followed by `/`.
    prefix: String,
    policy: TransferPolicy,
}

impl S3Store {
    /// Checks `config` and builds the client; sends no request, so a wrong endpoint or
    /// missing bucket shows at the first call.
    pub fn new(config: S3Config) -> Result<Self, Error> {
        let fail = |why: String| Error::new(Op::Open, &config.bucket, Cause::Config(why));
        check_bucket(&config.bucket).map_err(fail)?;
        if !config.prefix.is_empty() {
            check_prefix(&config.prefix)
                .map_err(|rule| fail(format!("the key prefix {:?}: {rule}", config.prefix)))?;
        }
        config.policy.check().map_err(fail)?;
        let region = config
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .ok_or_else(|| fail("no region: set one, or AWS_REGION".into()))?;
        let credentials =
            config.credentials.clone().or_else(S3Credentials::from_env).ok_or_else(|| {
                fail(
                    "no credentials: set them, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                        .into(),
                )
            })?;
        let endpoint = config
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env("AWS_ENDPOINT_URL"));
        let mut builder = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(Credentials::new(
                credentials.access_key_id,
                credentials.secret_access_key,
                credentials.session_token,
                None,
                "nova",
            ))
            .force_path_style(config.path_style)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            // Retries and attempt timeouts are ours (crate::retry); the SDK only bounds
            // connecting, so a dead endpoint fails an attempt instead of hanging it.
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder().connect_timeout(config.policy.attempt_timeout).build(),
            );
        if let Some(url) = endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(fail(format!(
                    "the endpoint {url:?} is not an http:// or https:// URL"
                )));
            }
            builder = builder.endpoint_url(url);
        }
        let prefix =
            if config.prefix.is_empty() { String::new() } else { format!("{}/", config.prefix) };
        Ok(Self {
            client: Client::from_conf(builder.build()),
            bucket: config.bucket,
            prefix,
            policy: config.policy,
        })
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    fn stored_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    async fn put_single(
        &self,
        key: &str,
        bytes: Bytes,
        condition: PutCondition,
    ) -> Result<(), Error> {
        let stored = self.stored_key(key);
        let len = bytes.len() as u64;
        let timeout = self.policy.attempt_timeout_for(len);
        let outcome = retry(&self.policy, Some(timeout), || {
            let mut request = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(&stored)
                .content_length(i64::try_from(len).unwrap_or(i64::MAX))
                .body(ByteStream::from(bytes.clone()));
            if condition == PutCondition::CreateOnly {
                request = request.if_none_match("*");
            }
            async move {
                match request.send().await {
                    Ok(_) => Ok(()),
                    Err(err) if status(&err) == Some(412) => {
                        Err(Failure::Final(Cause::AlreadyExists))
                    }
                    Err(err) => Err(classify(&err)),
                }
            }
        })
        .await;
        match outcome.result {
            Err(Cause::AlreadyExists) if outcome.unclear_attempts > 0 => {
                self.confirm_own_write(key, &bytes).await
            }
            result => result.map_err(|cause| Error::new(Op::Put, key, cause)),
        }
    }

    /// Settles a create-only put that found the key taken after an attempt whose fate
    /// is unknown (it timed out or failed in transit): that very attempt may have
    /// landed. The object is read back, and the same bytes count as our own write.
    /// Another writer of the same bytes under the same key would look the same, which
    /// is harmless for keys unique to one writer (nova's are).
    async fn confirm_own_write(&self, key: &str, bytes: &Bytes) -> Result<(), Error> {
        let existing = self.get_stored(key, &ByteRange::All).await.map_err(|err| {
            Error::new(Op::Put, key, Cause::BadResponse(format!("reading the key back: {err}")))
        })?;
        if existing == *bytes {
            Ok(())
        } else {
            Err(Error::new(Op::Put, key, Cause::AlreadyExists))
        }
    }

    async fn put_multipart(
        &self,
        key: &str,
        bytes: Bytes,
        condition: PutCondition,
    ) -> Result<(), Error> {
        let fail = |cause| Error::new(Op::Put, key, cause);
        let len = bytes.len() as u64;
        let part_bytes = self.policy.multipart_part_bytes;
        let parts = len.div_ceil(part_bytes);
        if parts > PARTS_MAX {
            return Err(fail(Cause::TooLarge { size: len, max: PARTS_MAX * part_bytes }));
        }
        let stored = self.stored_key(key);
        let created = retry(&self.policy, Some(self.policy.attempt_timeout), || {
            let request = self.client.create_multipart_upload().bucket(&self.bucket).key(&stored);
            async move {
                let output = request.send().await.map_err(|err| classify(&err))?;
                output.upload_id().map(str::to_owned).ok_or_else(|| {
                    Failure::Final(Cause::BadResponse(
                        "no upload id in CreateMultipartUpload".into(),
                    ))
                })
            }
        })
        .await;
        let upload_id = created.result.map_err(fail)?;
        let mut upload = Upload {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            stored,
            upload_id,
            open: true,
        };
        let completed = match self.send_parts(&upload, &bytes, parts).await {
            Ok(completed) => completed,
            Err(cause) => {
                upload.abort(&self.policy).await;
                return Err(fail(cause));
            }
        };
        let outcome = retry(&self.policy, Some(self.policy.attempt_timeout), || {
            let mut request = self
                .client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(&upload.stored)
                .upload_id(&upload.upload_id)
                .multipart_upload(
                    CompletedMultipartUpload::builder().set_parts(Some(completed.clone())).build(),
                );
            if condition == PutCondition::CreateOnly {
                request = request.if_none_match("*");
            }
            async move {
                match request.send().await {
                    Ok(_) => Ok(Completion::Done),
                    Err(err) if status(&err) == Some(412) => {
                        Err(Failure::Final(Cause::AlreadyExists))
                    }
                    Err(err) if code(&err) == Some("NoSuchUpload") => Ok(Completion::UploadGone),
                    Err(err) => Err(classify(&err)),
                }
            }
        })
        .await;
        let unclear = outcome.unclear_attempts > 0;
        match outcome.result {
            Ok(Completion::Done) => {
                upload.open = false;
                Ok(())
            }
            // Only a completion or an abort ends an upload, and nobody else knows its
            // id: after an attempt we did not hear back from, it is ours that landed.
            Ok(Completion::UploadGone) if unclear => {
                upload.open = false;
                match condition {
                    PutCondition::Overwrite => Ok(()),
                    PutCondition::CreateOnly => self.confirm_own_write(key, &bytes).await,
                }
            }
            Ok(Completion::UploadGone) => {
                upload.open = false;
                Err(fail(Cause::BadResponse(
                    "the multipart upload vanished before it was completed".into(),
                )))
            }
            Err(cause) => {
                // The parts stay stored (and billed) until the upload is aborted.
                upload.abort(&self.policy).await;
                match cause {
                    Cause::AlreadyExists if unclear => self.confirm_own_write(key, &bytes).await,
                    cause => Err(fail(cause)),
                }
            }
        }
    }

    /// Sends every part, at most `multipart_concurrency` at once, each with its own
    /// retries; returns them in part order, or the first failure (the rest are
    /// cancelled).
    async fn send_parts(
        &self,
        upload: &Upload,
        bytes: &Bytes,
        parts: u64,
    ) -> Result<Vec<CompletedPart>, Cause> {
        let part_bytes = self.policy.multipart_part_bytes;
        let mut in_flight = JoinSet::new();
        let mut completed = Vec::with_capacity(usize::try_from(parts).unwrap_or(0));
        let mut next = 0u64;
        loop {
            while in_flight.len() < self.policy.multipart_concurrency && next < parts {
                let start = usize::try_from(next * part_bytes).unwrap_or(usize::MAX);
                let end =
                    usize::try_from((next + 1) * part_bytes).unwrap_or(usize::MAX).min(bytes.len());
                // S3 numbers parts from 1, at most 10,000 (checked by the caller).
                let number = i32::try_from(next + 1).unwrap_or(i32::MAX);
                let body = bytes.slice(start..end);
                let client = self.client.clone();
                let (bucket, stored, upload_id) =
                    (upload.bucket.clone(), upload.stored.clone(), upload.upload_id.clone());
                let policy = self.policy.clone();
                in_flight.spawn(async move {
                    let timeout = policy.attempt_timeout_for(body.len() as u64);
                    let sent = retry(&policy, Some(timeout), || {
                        let request = client
                            .upload_part()
                            .bucket(&bucket)
                            .key(&stored)
                            .upload_id(&upload_id)
                            .part_number(number)
                            .content_length(i64::try_from(body.len()).unwrap_or(i64::MAX))
                            .body(ByteStream::from(body.clone()));
                        async move {
                            let output = request.send().await.map_err(|err| classify(&err))?;
                            let e_tag = output.e_tag().ok_or_else(|| {
                                Failure::Transient(format!("no ETag for part {number}"))
                            })?;
                            Ok(CompletedPart::builder().part_number(number).e_tag(e_tag).build())
                        }
                    })
                    .await;
                    sent.result.map_err(|cause| match cause {
                        Cause::Exhausted { attempts, elapsed_ms, last } => Cause::Exhausted {
                            attempts,
                            elapsed_ms,
                            last: format!("part {number}: {last}"),
                        },
                        other => other,
                    })
                });
                next += 1;
            }
            match in_flight.join_next().await {
                None => break,
                Some(Ok(Ok(part))) => completed.push(part),
                // Dropping `in_flight` cancels the other parts.
                Some(Ok(Err(cause))) => return Err(cause),
                Some(Err(err)) => return Err(Cause::TaskFailed(err.to_string())),
            }
        }
        completed.sort_by_key(|part| part.part_number());
        Ok(completed)
    }

    /// A GET of `key` (unprefixed) with retries; used by `get` and to read back a
    /// create-only put.
    async fn get_stored(&self, key: &str, range: &ByteRange) -> Result<Bytes, Error> {
        let stored = self.stored_key(key);
        let header = range.header();
        // The first timeout covers the response head only; the body gets its own,
        // sized by its length once that is known.
        let outcome = retry(&self.policy, None, || {
            let mut request = self.client.get_object().bucket(&self.bucket).key(&stored);
            if let Some(header) = &header {
                request = request.range(header);
            }
            let policy = &self.policy;
            let header = &header;
            async move {
                let sent = tokio::time::timeout(policy.attempt_timeout, request.send()).await;
                let output = match sent {
                    Err(_) => {
                        return Err(Failure::Transient(format!(
                            "no response within {} ms",
                            policy.attempt_timeout.as_millis()
                        )));
                    }
                    Ok(Ok(output)) => output,
                    Ok(Err(err)) => {
                        return Err(match status(&err) {
                            Some(404) if code(&err) != Some("NoSuchBucket") => {
                                Failure::Final(Cause::NotFound)
                            }
                            Some(416) => Failure::Final(Cause::RangeNotSatisfiableSizeUnknown {
                                range: range.to_string(),
                            }),
                            _ => classify(&err),
                        });
                    }
                };
                let expected = output.content_length().and_then(|n| u64::try_from(n).ok());
                let ranged = output.content_range().is_some();
                let body_timeout = policy.attempt_timeout_for(expected.unwrap_or(0));
                let body = match tokio::time::timeout(body_timeout, output.body.collect()).await {
                    Err(_) => {
                        return Err(Failure::Transient(format!(
                            "the body did not arrive within {} ms",
                            body_timeout.as_millis()
                        )));
                    }
                    Ok(Err(err)) => {
                        return Err(Failure::Transient(format!(
                            "reading the body: {}",
                            DisplayErrorContext(&err)
                        )));
                    }
                    Ok(Ok(body)) => body.into_bytes(),
                };
                if expected.is_some_and(|n| n != body.len() as u64) {
                    return Err(Failure::Transient(format!(
                        "the body is {} bytes, not the {} announced",
                        body.len(),
                        expected.unwrap_or(0)
                    )));
                }
                if header.is_some() && !ranged {
                    // The server ignored the Range header and sent the whole object.
                    let size = body.len() as u64;
                    return match range.resolve(size) {
                        Some(span) => Ok(body.slice(
                            usize::try_from(span.start).unwrap_or(0)
                                ..usize::try_from(span.end).unwrap_or(body.len()),
                        )),
                        None => Err(Failure::Final(Cause::RangeNotSatisfiable {
                            range: range.to_string(),
                            size,
                        })),
                    };
                }
                Ok(body)
            }
        })
        .await;
        outcome.result.map_err(|cause| Error::new(Op::Get, key, cause))
    }
}

/// How a CompleteMultipartUpload attempt ended, when it did not fail.
enum Completion {
    Done,
    /// `NoSuchUpload`: completed or aborted already.
    UploadGone,
}

/// A multipart upload in progress: aborted when it fails, and when the future writing
/// it is dropped (in the background, if a tokio runtime is there to run it).
struct Upload {
    client: Client,
    bucket: String,
    stored: String,
    upload_id: String,
    /// Until completed or aborted.
    open: bool,
}

impl Upload {
    /// Aborts the upload with the usual retries. A failed abort leaves parts stored
    /// until a lifecycle rule removes them; it does not change the put's error.
    async fn abort(&mut self, policy: &TransferPolicy) {
        let _ = retry(policy, Some(policy.attempt_timeout), || {
            let request = self.abort_request();
            async move {
                match request.send().await {
                    Ok(_) => Ok(()),
                    Err(err) if status(&err) == Some(404) => Ok(()),
                    Err(err) => Err(classify(&err)),
                }
            }
        })
        .await;
        self.open = false;
    }

    fn abort_request(
        &self,
    ) -> aws_sdk_s3::operation::abort_multipart_upload::builders::AbortMultipartUploadFluentBuilder
    {
        self.client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.stored)
            .upload_id(&self.upload_id)
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if self.open
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let request = self.abort_request();
            // One request, once per dropped upload: bounded by the uploads that were
            // in flight.
            runtime.spawn(async move {
                let _ = request.send().await;
            });
        }
    }
}

impl ObjectStore for S3Store {
    fn put<'a>(
        &'a self,
        key: &'a str,
        bytes: Bytes,
        condition: PutCondition,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            check_key_for(Op::Put, key)?;
            if bytes.len() as u64 > self.policy.multipart_threshold_bytes {
                self.put_multipart(key, bytes, condition).await
            } else {
                self.put_single(key, bytes, condition).await
            }
        })
    }

    fn get<'a>(&'a self, key: &'a str, range: ByteRange) -> BoxFuture<'a, Result<Bytes, Error>> {
        Box::pin(async move {
            check_get_args(key, &range)?;
            self.get_stored(key, &range).await
        })
    }

    fn head<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<u64>, Error>> {
        Box::pin(async move {
            check_key_for(Op::Head, key)?;
            let stored = self.stored_key(key);
            let outcome = retry(&self.policy, Some(self.policy.attempt_timeout), || {
                let request = self.client.head_object().bucket(&self.bucket).key(&stored);
                async move {
                    match request.send().await {
                        Ok(output) => Ok(Some(
                            output
                                .content_length()
                                .and_then(|n| u64::try_from(n).ok())
                                .ok_or_else(|| {
                                    Failure::Transient("HeadObject gave no Content-Length".into())
                                })?,
                        )),
                        // A HEAD has no body, so no error code tells a missing key from
                        // a missing bucket; the bucket shows up at the first put.
                        Err(err) if status(&err) == Some(404) => Ok(None),
                        Err(err) => Err(classify(&err)),
                    }
                }
            })
            .await;
            outcome.result.map_err(|cause| Error::new(Op::Head, key, cause))
        })
    }

    fn list<'a>(
        &'a self,
        prefix: &'a str,
        start_after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ListPage, Error>> {
        Box::pin(async move {
            check_list_args(prefix, start_after, limit)?;
            let stored_prefix = self.stored_key(prefix);
            let stored_after = start_after.map(|after| self.stored_key(after));
            let outcome = retry(&self.policy, Some(self.policy.attempt_timeout), || {
                let request = self
                    .client
                    .list_objects_v2()
                    .bucket(&self.bucket)
                    .prefix(&stored_prefix)
                    .set_start_after(stored_after.clone())
                    .max_keys(i32::try_from(limit).unwrap_or(i32::MAX));
                async move { request.send().await.map_err(|err| classify(&err)) }
            })
            .await;
            let output = outcome.result.map_err(|cause| Error::new(Op::List, prefix, cause))?;
            let mut objects = Vec::with_capacity(output.contents().len());
            let mut last_listed = None;
            for object in output.contents() {
                let stored = object.key().unwrap_or_default();
                let Some(key) = stored.strip_prefix(&self.prefix) else {
                    return Err(Error::new(
                        Op::List,
                        prefix,
                        Cause::BadResponse(format!("listed {stored:?}, outside the prefix")),
                    ));
                };
                last_listed = Some(key);
                // Objects another program wrote under a key this crate refuses are
                // skipped: every listed key can be read, and the page still moves on.
                if check_key(key).is_err() {
                    continue;
                }
                let size = object.size().and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
                objects.push(ObjectMeta { key: key.to_owned(), size });
            }
            let next = match (output.is_truncated() == Some(true), last_listed) {
                (false, _) => None,
                (true, Some(last)) => Some(last.to_owned()),
                (true, None) => {
                    return Err(Error::new(
                        Op::List,
                        prefix,
                        Cause::BadResponse("an empty page that says more follow".into()),
                    ));
                }
            };
            Ok(ListPage { objects, next })
        })
    }

    fn delete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            check_key_for(Op::Delete, key)?;
            let stored = self.stored_key(key);
            let outcome = retry(&self.policy, Some(self.policy.attempt_timeout), || {
                let request = self.client.delete_object().bucket(&self.bucket).key(&stored);
                async move {
                    match request.send().await {
                        Ok(_) => Ok(()),
                        Err(err) if code(&err) == Some("NoSuchKey") => Ok(()),
                        Err(err) => Err(classify(&err)),
                    }
                }
            })
            .await;
            outcome.result.map_err(|cause| Error::new(Op::Delete, key, cause))
        })
    }
}

/// S3's bucket naming rule, in short: 3 to 63 of `a-z 0-9 . -`.
fn check_bucket(bucket: &str) -> Result<(), String> {
    let ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!("the bucket name {bucket:?} is not 3 to 63 of a-z 0-9 . -"))
    }
}

/// The HTTP status of a service's answer, if there was one.
fn status<E>(err: &SdkError<E>) -> Option<u16> {
    err.raw_response().map(|response| response.status().as_u16())
}

/// The S3 error code of a service error (`NoSuchKey`, `SlowDown`, ...).
fn code<E: ProvideErrorMetadata>(err: &SdkError<E>) -> Option<&str> {
    err.as_service_error().and_then(ProvideErrorMetadata::code)
}

/// Error codes S3 documents as worth retrying, whatever their HTTP status.
const RETRYABLE_CODES: &[&str] = &[
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "InternalError",
    "ServiceUnavailable",
    // 409: a concurrent conditional write or multipart operation on the same key; the
    // retry then sees the winner's object (412) or succeeds.
    "ConditionalRequestConflict",
    "OperationAborted",
];

/// Whether a failed request is worth another attempt, with the whole error chain as
/// the reason.
fn classify<E>(err: &SdkError<E>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let text = DisplayErrorContext(err).to_string();
    match err {
        SdkError::ConstructionFailure(_) => Failure::Final(Cause::Request(text)),
        SdkError::DispatchFailure(failure) if failure.is_user() => {
            Failure::Final(Cause::Request(text))
        }
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = service.err().code().unwrap_or("none");
            let message = service.err().message().unwrap_or("no message");
            if status >= 500 || status == 429 || RETRYABLE_CODES.contains(&code) {
                Failure::Transient(format!("http {status}, code {code}: {message}"))
            } else {
                Failure::Final(Cause::Refused {
                    status,
                    code: code.to_owned(),
                    message: message.to_owned(),
                })
            }
        }
        // Timeouts, connection failures, broken responses: the network, not the request.
        _ => Failure::Transient(text),
    }
}
