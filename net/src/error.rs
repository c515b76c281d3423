//! The one place where errors become HTTP: an [`ApiError`] is the JSON error body of
//! http-api.md (`{"code", "message", ...details}`) with its status, built from an engine
//! [`engine::Error`] through its [`Code`] and detail accessors, never by reading a
//! message.

use engine::Code;
use hyper::StatusCode;
use serde_json::{Map, Value, json};

/// An error answer: status, code, message and the detail fields.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Map<String, Value>,
    /// Seconds for the `Retry-After` header (resource_exhausted).
    pub retry_after_seconds: Option<u64>,
    /// Refused before the request's body was read (or all of it): its connection cannot
    /// carry another request, and the answer says `Connection: close`.
    pub body_unread: bool,
}

/// The HTTP status of a code: Google's standard mapping, with FailedPrecondition as 412
/// (http-api.md, "Errors").
pub fn status_of(code: Code) -> StatusCode {
    match code {
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::OutOfRange => StatusCode::RANGE_NOT_SATISFIABLE,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl ApiError {
    /// An error of `code`; its status follows from the code.
    pub fn from_code(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            status: status_of(code),
            code: code.as_str(),
            message: message.into(),
            details: Map::new(),
            retry_after_seconds: None,
            body_unread: false,
        }
    }

    /// This error, refusing a request before its body was read.
    pub fn before_body(self) -> Self {
        ApiError { body_unread: true, ..self }
    }

    /// invalid_argument: the message names the field and what was wrong with it.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::from_code(Code::InvalidArgument, message)
    }

    /// not_found for a path no route serves.
    pub fn no_route(method: &str, path: &str) -> Self {
        Self::from_code(
            Code::NotFound,
            format!("no route for {method} {path}; the API is under /v1 (docs/api.md)"),
        )
    }

    /// A path that exists, with a method it does not serve (405).
    pub fn method_not_allowed(method: &str, path: &str, allowed: &str) -> Self {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            ..Self::invalid(format!("{method} is not served on {path}; use {allowed}"))
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::from_code(Code::Internal, message)
    }

    /// The engine's error, with the details its accessors give.
    pub fn from_engine(error: &engine::Error) -> Self {
        let mut api = Self::from_code(error.code(), error.to_string());
        if let Some(next) = error.next_seq_num() {
            api.details.insert("next_seq_num".into(), json!(next));
        }
        if let Some(tail) = error.tail() {
            api.details.insert("tail".into(), position(tail));
        }
        if let Some(token) = error.fencing_token() {
            api.details.insert("fencing_token".into(), json!(token));
        }
        if let Some(ms) = error.retry_after_ms() {
            api.details.insert("retry_after_ms".into(), json!(ms));
            api.retry_after_seconds = Some(ms.div_ceil(1000).max(1));
        }
        api
    }

    /// The error body.
    pub fn to_json(&self) -> Value {
        let mut body = Map::new();
        body.insert("code".into(), json!(self.code));
        // A message may echo what the request named: a token pasted there is left out.
        body.insert("message".into(), json!(crate::auth::scrub_tokens(&self.message)));
        for (name, value) in &self.details {
            body.insert(name.clone(), value.clone());
        }
        Value::Object(body)
    }
}

impl From<engine::Error> for ApiError {
    fn from(error: engine::Error) -> Self {
        ApiError::from_engine(&error)
    }
}

/// A position or tail as JSON: `{"seq_num", "timestamp"}`.
pub fn position(position: engine::position::Position) -> Value {
    json!({"seq_num": position.seq_num, "timestamp": position.timestamp})
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::position::Tail;

    #[test]
    fn every_code_has_the_documented_status() {
        let table = [
            (Code::InvalidArgument, 400),
            (Code::Unauthenticated, 401),
            (Code::PermissionDenied, 403),
            (Code::NotFound, 404),
            (Code::AlreadyExists, 409),
            (Code::FailedPrecondition, 412),
            (Code::OutOfRange, 416),
            (Code::ResourceExhausted, 429),
            (Code::Internal, 500),
            (Code::Unavailable, 503),
        ];
        for (code, status) in table {
            assert_eq!(status_of(code).as_u16(), status, "{code:?}");
        }
    }

    #[test]
    fn details_come_from_the_accessors() {
        let past = engine::Error::PastTail { start: 9, tail: Tail { seq_num: 3, timestamp: 7 } };
        let body = ApiError::from_engine(&past).to_json();
        assert_eq!(body["code"], "out_of_range");
        assert_eq!(body["tail"], json!({"seq_num": 3, "timestamp": 7}));
        let busy =
            engine::Error::ThroughputExceeded { limit_bytes_per_second: 10, retry_after_ms: 1500 };
        let api = ApiError::from_engine(&busy);
        assert_eq!(api.status.as_u16(), 429);
        assert_eq!(api.retry_after_seconds, Some(2));
    }
}
