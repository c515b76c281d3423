//! The one error of the object stores: which call failed ([`Op`]), on which key, and why
//! ([`Cause`], with the numbers in it), plus the coarse [`ErrorKind`] that tells the
//! caller whether to retry. Both backends map their failures here; nothing above `s3`
//! sees an aws-sdk or `io` type except as text or a source.

use std::fmt;

use crate::key::{KeyRule, excerpt};
use crate::range::RangeRule;

/// The call that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Opening a store (its configuration, its directory).
    Open,
    Put,
    Get,
    Head,
    List,
    Delete,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Open => "open",
            Op::Put => "put",
            Op::Get => "get",
            Op::Head => "head",
            Op::List => "list",
            Op::Delete => "delete",
        })
    }
}

/// What a caller does about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object does not exist (a get; a head answers `None` instead).
    NotFound,
    /// A create-only put found the key taken.
    AlreadyExists,
    /// The request is wrong (key, range, limit): the same request always fails.
    Invalid,
    /// The store could not do it now (network, timeout, overload, disk full): the same
    /// request may succeed later. The only retryable kind.
    Unavailable,
    /// The store understood and said no for a reason retrying will not fix:
    /// credentials, permissions, a missing bucket, a server that rejects the request.
    Refused,
}

impl ErrorKind {
    /// Whether repeating the same request later may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorKind::Unavailable)
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    #[error("no such object")]
    NotFound,
    #[error("the key already exists (create-only put)")]
    AlreadyExists,
    #[error("invalid key: {0}")]
    InvalidKey(KeyRule),
    #[error("invalid range: {0}")]
    InvalidRange(RangeRule),
    #[error("range {range} is unsatisfiable: the object is {size} bytes")]
    RangeNotSatisfiable { range: String, size: u64 },
    #[error("range {range} is unsatisfiable (the store did not say the object's size)")]
    RangeNotSatisfiableSizeUnknown { range: String },
    #[error("a list page holds 1 to {max} keys, not {limit}")]
    ListLimit { limit: usize, max: usize },
    #[error("the object is {size} bytes, more than the {max} a put can write")]
    TooLarge { size: u64, max: u64 },
    #[error("local file system: {0}")]
    Io(#[source] std::io::Error),
    #[error("gave up after {attempts} attempt(s) in {elapsed_ms} ms; last failure: {last}")]
    Exhausted { attempts: u32, elapsed_ms: u64, last: String },
    #[error("refused by the store (http {status}, code {code}): {message}")]
    Refused { status: u16, code: String, message: String },
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("the request could not be built: {0}")]
    Request(String),
    #[error("the store's answer does not add up: {0}")]
    BadResponse(String),
    #[error("the blocking file task died: {0}")]
    TaskFailed(String),
}

impl Cause {
    /// The coarse kind of this cause.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Cause::NotFound => ErrorKind::NotFound,
            Cause::AlreadyExists => ErrorKind::AlreadyExists,
            Cause::InvalidKey(_)
            | Cause::InvalidRange(_)
            | Cause::RangeNotSatisfiable { .. }
            | Cause::RangeNotSatisfiableSizeUnknown { .. }
            | Cause::ListLimit { .. }
            | Cause::TooLarge { .. }
            | Cause::Config(_)
            | Cause::Request(_) => ErrorKind::Invalid,
            Cause::Io(err) => io_kind(err),
            Cause::Refused { .. } => ErrorKind::Refused,
            Cause::Exhausted { .. } | Cause::BadResponse(_) | Cause::TaskFailed(_) => {
                ErrorKind::Unavailable
            }
        }
    }
}

/// A local file error is retryable unless it is about permissions or names: a full or
/// failing disk may come back, a read-only or forbidden directory will not by itself.
fn io_kind(err: &std::io::Error) -> ErrorKind {
    use std::io::ErrorKind as Io;
    match err.kind() {
        Io::NotFound => ErrorKind::NotFound,
        Io::AlreadyExists => ErrorKind::AlreadyExists,
        Io::PermissionDenied | Io::ReadOnlyFilesystem => ErrorKind::Refused,
        Io::InvalidInput | Io::InvalidFilename | Io::NotADirectory | Io::IsADirectory => {
            ErrorKind::Invalid
        }
        _ => ErrorKind::Unavailable,
    }
}

/// An object-store call that failed: the call, the key (a list's prefix), and why.
#[derive(Debug, thiserror::Error)]
#[error("{op} {key:?}: {cause}")]
pub struct Error {
    op: Op,
    /// The caller's key (not the S3 backend's prefixed one), quoted up to a bound.
    key: String,
    cause: Cause,
}

impl Error {
    pub(crate) fn new(op: Op, key: &str, cause: Cause) -> Self {
        Self { op, key: excerpt(key), cause }
    }

    /// The call that failed.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The key the call was about (a list's prefix), shortened if very long.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Why it failed.
    pub fn cause(&self) -> &Cause {
        &self.cause
    }

    /// Whether to retry, in short.
    pub fn kind(&self) -> ErrorKind {
        self.cause.kind()
    }

    /// Whether repeating the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind().is_retryable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_call_key_and_cause() {
        let err = Error::new(Op::Get, "a/b", Cause::NotFound);
        assert_eq!(err.to_string(), "get \"a/b\": no such object");
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(!err.is_retryable());
        let err = Error::new(
            Op::Put,
            "k",
            Cause::Exhausted { attempts: 3, elapsed_ms: 120, last: "timed out".into() },
        );
        assert!(err.is_retryable());
        assert!(err.to_string().contains("3 attempt(s)"), "{err}");
    }

    #[test]
    fn io_errors_map_to_kinds() {
        let io = |kind| Cause::Io(std::io::Error::from(kind)).kind();
        assert_eq!(io(std::io::ErrorKind::StorageFull), ErrorKind::Unavailable);
        assert_eq!(io(std::io::ErrorKind::PermissionDenied), ErrorKind::Refused);
        assert_eq!(io(std::io::ErrorKind::NotFound), ErrorKind::NotFound);
    }
}
