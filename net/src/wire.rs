//! The JSON wire format of http-api.md: request bodies checked field by field (unknown
//! fields refused, every message naming the field), the bucket, stream and record
//! objects of responses, and the bytes of bodies and headers as UTF-8 text or, with
//! `Nova-Encoding: base64`, as base64.
//!
//! JSON records are encoded into the binary framing here (one validation path in the
//! engine for both formats); read pages come back as framing and are decoded here.
//! Nothing here alters a byte to make it printable: bytes that are not UTF-8 in a text
//! page are refused.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use engine::auth::{Grant, TOKEN_DESCRIPTION_BYTES_MAX, TOKEN_LIFETIME_SECONDS_MAX, TokenRecord};
use engine::control::{BucketRecord, StreamRecord};
use engine::framing::{Frame, decode_frame};
use engine::options::{
    BucketConfigRequest, OptionScope, ProducerPolicy, StorageClass, StreamOptions,
    StreamOptionsPatch, StreamOptionsRequest, TimestampingMode,
};
use engine::position::Tail;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, position};

/// How bodies, header names and header values travel in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// UTF-8 text (the default).
    Text,
    /// Standard base64, padded (`Nova-Encoding: base64`).
    Base64,
}

impl Encoding {
    /// Bytes from a JSON string; `field` names it in the error.
    pub fn decode(self, text: &str, field: &dyn Fn() -> String) -> Result<Vec<u8>, ApiError> {
        match self {
            Encoding::Text => Ok(text.as_bytes().to_vec()),
            Encoding::Base64 => BASE64.decode(text).map_err(|error| {
                ApiError::invalid(format!(
                    "{} is not valid base64 (standard alphabet, padded; Nova-Encoding: base64 is set): {error}",
                    field()
                ))
            }),
        }
    }

    /// [`Encoding::decode`] of a string already owned: text is taken as it is, uncopied.
    pub fn decode_owned(
        self,
        text: String,
        field: &dyn Fn() -> String,
    ) -> Result<Vec<u8>, ApiError> {
        match self {
            Encoding::Text => Ok(text.into_bytes()),
            Encoding::Base64 => self.decode(&text, field),
        }
    }

    /// A JSON string for bytes; `what` names them in the error when they are not UTF-8.
    pub fn encode(self, bytes: &[u8], what: &dyn Fn() -> String) -> Result<String, ApiError> {
        match self {
            Encoding::Base64 => Ok(BASE64.encode(bytes)),
            Encoding::Text => match std::str::from_utf8(bytes) {
                Ok(text) => Ok(text.to_owned()),
                Err(_) => Err(ApiError::invalid(format!(
                    "{} holds bytes that are not valid UTF-8; send the request header \
                     Nova-Encoding: base64 to read bytes (nova never alters them to make them printable)",
                    what()
                ))),
            },
        }
    }
}

/// A JSON request object whose fields were checked against the accepted names.
pub struct Object {
    map: Map<String, Value>,
    /// How fields are named in messages, e.g. `records[2].`.
    prefix: String,
}

/// Parses a request body as one JSON object with only `accepted` fields. An empty body is
/// an empty object (every body of the API is optional or has required fields that say so).
pub fn parse_body(body: &[u8], accepted: &[&str]) -> Result<Object, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Object { map: Map::new(), prefix: String::new() });
    }
    let Unique(value) = serde_json::from_slice(body).map_err(|error| body_error(&error))?;
    Object::from_value(value, String::new(), "request body", accepted)
}

/// The error for a body the JSON parser refused.
pub(crate) fn body_error(error: &serde_json::Error) -> ApiError {
    match error.classify() {
        // Every JSON value is accepted but an object naming a field twice.
        serde_json::error::Category::Data => ApiError::invalid(format!("request body {error}")),
        _ => ApiError::invalid(format!("request body is not valid JSON: {error}")),
    }
}

/// The error for a field not among `accepted`; `prefix` (e.g. `records[2].`) and `what`
/// (e.g. `records[2]`) place it.
pub(crate) fn unknown_field(prefix: &str, name: &str, what: &str, accepted: &[&str]) -> ApiError {
    if accepted.is_empty() {
        return ApiError::invalid(format!("unknown field {prefix}{name:?} in {what}"));
    }
    ApiError::invalid(format!(
        "unknown field {prefix}{name:?} in {what}; accepted fields are {}",
        accepted.join(", ")
    ))
}

/// The error for a field `name` holding the wrong kind of value, `shown` as in a message.
pub(crate) fn wrong(name: &str, expected: &str, shown: &str) -> ApiError {
    ApiError::invalid(format!("field {name} must be {expected}, not {shown}"))
}

/// A u64 field's value.
pub(crate) fn u64_value(name: &str, value: &Value) -> Result<u64, ApiError> {
    value.as_u64().ok_or_else(|| u64_wrong(name, &excerpt(value)))
}

pub(crate) fn u64_wrong(name: &str, shown: &str) -> ApiError {
    wrong(name, &format!("a whole number from 0 to {}", u64::MAX), shown)
}

/// An i64 field's value.
pub(crate) fn i64_value(name: &str, value: &Value) -> Result<i64, ApiError> {
    value.as_i64().ok_or_else(|| i64_wrong(name, &excerpt(value)))
}

pub(crate) fn i64_wrong(name: &str, shown: &str) -> ApiError {
    wrong(name, &format!("a whole number from {} to {}", i64::MIN, i64::MAX), shown)
}

/// A JSON value whose objects name each field once. Parsed as a plain `Value`, a
/// repeated field would keep its last value, so `{"class":"express","class":"standard"}`
/// would quietly mean standard: refused instead, as an unknown field is.
struct Unique(Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(Unique(value)) = seq.next_element()? {
            values.push(value);
        }
        Ok(Value::Array(values))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut fields = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let Unique(value) = map.next_value()?;
            if fields.contains_key(&name) {
                return Err(serde::de::Error::custom(format!("names the field {name:?} twice")));
            }
            fields.insert(name, value);
        }
        Ok(Value::Object(fields))
    }
}

impl Object {
    fn from_value(
        value: Value,
        prefix: String,
        what: &str,
        accepted: &[&str],
    ) -> Result<Object, ApiError> {
        let Value::Object(map) = value else {
            return Err(ApiError::invalid(format!(
                "{what} must be a JSON object, not {}",
                kind(&value)
            )));
        };
        if let Some(unknown) = map.keys().find(|name| !accepted.contains(&name.as_str())) {
            return Err(unknown_field(&prefix, unknown, what, accepted));
        }
        Ok(Object { map, prefix })
    }

    fn name(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    fn get(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|value| !value.is_null())
    }

    fn wrong(&self, field: &str, expected: &str, value: &Value) -> ApiError {
        wrong(&self.name(field), expected, &excerpt(value))
    }

    pub fn has(&self, field: &str) -> bool {
        self.get(field).is_some()
    }

    pub fn u64(&self, field: &str) -> Result<Option<u64>, ApiError> {
        self.get(field).map(|value| u64_value(&self.name(field), value)).transpose()
    }

    pub fn i64(&self, field: &str) -> Result<Option<i64>, ApiError> {
        self.get(field).map(|value| i64_value(&self.name(field), value)).transpose()
    }

    pub fn bool(&self, field: &str) -> Result<Option<bool>, ApiError> {
        self.get(field)
            .map(|value| value.as_bool().ok_or_else(|| self.wrong(field, "true or false", value)))
            .transpose()
    }

    pub fn str(&self, field: &str) -> Result<Option<&str>, ApiError> {
        self.get(field)
            .map(|value| value.as_str().ok_or_else(|| self.wrong(field, "a string", value)))
            .transpose()
    }

    pub fn array(&self, field: &str) -> Result<Option<&Vec<Value>>, ApiError> {
        self.get(field)
            .map(|value| value.as_array().ok_or_else(|| self.wrong(field, "an array", value)))
            .transpose()
    }

    fn required<T>(&self, field: &str, value: Option<T>) -> Result<T, ApiError> {
        value.ok_or_else(|| ApiError::invalid(format!("field {} is required", self.name(field))))
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// How a whole number read as a float is noted in an error message.
const ROUNDED: &str = "read as a floating-point number, perhaps rounded: not a whole number within 64 bits as written";

/// A value for an error message, cut short.
pub(crate) fn excerpt(value: &Value) -> String {
    let text = value.to_string();
    // A whole number past 64 bits is parsed as the nearest float, which may print as a
    // number inside the range the message names (-2^63 - 1 prints as -2^63). What was
    // written cannot be told from the float (`-9223372036854775808.0` reads the same), so
    // the note says what is true of every such float.
    if let Value::Number(number) = value
        && number.is_f64()
        && number.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() >= 2f64.powi(63))
    {
        return format!("{text} ({ROUNDED})");
    }
    engine::names::excerpt(&text, 64)
}

// ---- Buckets and streams ------------------------------------------------------------

/// The stream option fields, as a stream request names them (a bucket's add `default_`).
const OPTION_FIELDS: [&str; 10] = [
    "class",
    "producer_policy",
    "timestamping_mode",
    "timestamping_uncapped",
    "retention_max_age_ms",
    "retention_max_bytes",
    "batch_max_bytes",
    "batch_max_records",
    "batch_max_delay_ms",
    "throughput_max_bytes_per_second",
];

fn bucket_fields(with_token: bool) -> Vec<String> {
    let mut fields: Vec<String> =
        ["create_stream_on_append", "create_stream_on_read", "location"].map(String::from).into();
    if with_token {
        fields.push("creation_token".into());
    }
    fields.extend(OPTION_FIELDS.iter().map(|field| format!("default_{field}")));
    fields
}

fn stream_fields(with_token: bool) -> Vec<String> {
    let mut fields: Vec<String> = OPTION_FIELDS.map(String::from).into();
    if with_token {
        fields.push("creation_token".into());
    }
    fields
}

fn parse_with(body: &[u8], fields: &[String]) -> Result<Object, ApiError> {
    let accepted: Vec<&str> = fields.iter().map(String::as_str).collect();
    parse_body(body, &accepted)
}

/// Reads the option fields (`prefix` is `default_` for a bucket) as a create request:
/// absent, 0 and false mean "not set".
fn options_request(
    object: &Object,
    prefix: &str,
    scope: OptionScope,
) -> Result<StreamOptionsRequest, ApiError> {
    let name = |field: &str| format!("{prefix}{field}");
    let number = |field: &str| object.u64(&name(field)).map(Option::unwrap_or_default);
    Ok(StreamOptionsRequest {
        class: object
            .str(&name("class"))?
            .map(|value| StorageClass::parse_in(value, scope))
            .transpose()?,
        producer_policy: object
            .str(&name("producer_policy"))?
            .map(|value| ProducerPolicy::parse_in(value, scope))
            .transpose()?,
        timestamping_mode: object
            .str(&name("timestamping_mode"))?
            .map(|value| TimestampingMode::parse_in(value, scope))
            .transpose()?,
        timestamping_uncapped: object.bool(&name("timestamping_uncapped"))?.unwrap_or(false),
        retention_max_age_ms: number("retention_max_age_ms")?,
        retention_max_bytes: number("retention_max_bytes")?,
        batch_max_bytes: number("batch_max_bytes")?,
        batch_max_records: number("batch_max_records")?,
        batch_max_delay_ms: number("batch_max_delay_ms")?,
        throughput_max_bytes_per_second: number("throughput_max_bytes_per_second")?,
    })
}

/// CreateBucket's body: the configuration and the creation token.
pub fn bucket_create(body: &[u8]) -> Result<(BucketConfigRequest, Option<String>), ApiError> {
    let object = parse_with(body, &bucket_fields(true))?;
    let request = bucket_request(&object)?;
    Ok((request, object.str("creation_token")?.map(str::to_owned)))
}

/// UpdateBucket's body.
pub fn bucket_update(body: &[u8]) -> Result<BucketConfigRequest, ApiError> {
    bucket_request(&parse_with(body, &bucket_fields(false))?)
}

fn bucket_request(object: &Object) -> Result<BucketConfigRequest, ApiError> {
    Ok(BucketConfigRequest {
        location: object.str("location")?.unwrap_or_default().to_owned(),
        create_stream_on_append: object.bool("create_stream_on_append")?.unwrap_or(false),
        create_stream_on_read: object.bool("create_stream_on_read")?.unwrap_or(false),
        defaults: options_request(object, "default_", OptionScope::BucketDefaults)?,
    })
}

/// CreateStream's body: the options and the creation token.
pub fn stream_create(body: &[u8]) -> Result<(StreamOptionsRequest, Option<String>), ApiError> {
    let object = parse_with(body, &stream_fields(true))?;
    let request = options_request(&object, "", OptionScope::Stream)?;
    Ok((request, object.str("creation_token")?.map(str::to_owned)))
}

/// ReconfigureStream's body: the fields present are set, 0 included.
pub fn stream_patch(body: &[u8]) -> Result<StreamOptionsPatch, ApiError> {
    let object = parse_with(body, &stream_fields(false))?;
    let scope = OptionScope::Stream;
    Ok(StreamOptionsPatch {
        class: object.str("class")?.map(|v| StorageClass::parse_in(v, scope)).transpose()?,
        producer_policy: object
            .str("producer_policy")?
            .map(|v| ProducerPolicy::parse_in(v, scope))
            .transpose()?,
        timestamping_mode: object
            .str("timestamping_mode")?
            .map(|v| TimestampingMode::parse_in(v, scope))
            .transpose()?,
        timestamping_uncapped: object.bool("timestamping_uncapped")?,
        retention_max_age_ms: object.u64("retention_max_age_ms")?,
        retention_max_bytes: object.u64("retention_max_bytes")?,
        batch_max_bytes: object.u64("batch_max_bytes")?,
        batch_max_records: object.u64("batch_max_records")?,
        batch_max_delay_ms: object.u64("batch_max_delay_ms")?,
        throughput_max_bytes_per_second: object.u64("throughput_max_bytes_per_second")?,
    })
}

fn options_json(options: &StreamOptions, prefix: &str, out: &mut Map<String, Value>) {
    let mut put = |field: &str, value: Value| {
        out.insert(format!("{prefix}{field}"), value);
    };
    put("class", json!(options.class.as_str()));
    put("producer_policy", json!(options.producer_policy.as_str()));
    put("timestamping_mode", json!(options.timestamping_mode.as_str()));
    put("timestamping_uncapped", json!(options.timestamping_uncapped));
    put("retention_max_age_ms", json!(options.retention_max_age_ms));
    put("retention_max_bytes", json!(options.retention_max_bytes));
    put("batch_max_bytes", json!(options.batch_max_bytes));
    put("batch_max_records", json!(options.batch_max_records));
    put("batch_max_delay_ms", json!(options.batch_max_delay_ms));
    put("throughput_max_bytes_per_second", json!(options.throughput_max_bytes_per_second));
}

/// A bucket record.
pub fn bucket_json(bucket: &BucketRecord) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), json!(bucket.name.as_str()));
    out.insert("location".into(), json!(bucket.config.location));
    out.insert("create_stream_on_append".into(), json!(bucket.config.create_stream_on_append));
    out.insert("create_stream_on_read".into(), json!(bucket.config.create_stream_on_read));
    options_json(&bucket.config.defaults, "default_", &mut out);
    out.insert("created_at_ms".into(), json!(bucket.created_at_ms));
    Value::Object(out)
}

/// A stream record; GetStream adds the tail and the trim watermark.
pub fn stream_json(stream: &StreamRecord, tail: Option<Tail>) -> Value {
    let mut out = Map::new();
    out.insert("bucket".into(), json!(stream.bucket.as_str()));
    out.insert("key".into(), json!(stream.key.as_str()));
    out.insert("id".into(), json!(stream.id.to_string()));
    out.insert("created_at_ms".into(), json!(stream.created_at_ms));
    options_json(&stream.options, "", &mut out);
    if let Some(tail) = tail {
        out.insert("tail".into(), position(tail));
        out.insert("trim_seq_num".into(), json!(stream.trim_seq_num));
    }
    Value::Object(out)
}

// ---- Records ------------------------------------------------------------------------

/// Why a read page's records could not all be written as JSON: the error, and how many
/// records before the one that failed could (0 when the page is corrupt).
#[derive(Debug)]
pub struct Unwritable {
    pub records_before: u64,
    pub error: ApiError,
}

/// The records of a read page (binary framing) as JSON record objects. A record whose
/// bytes the encoding cannot carry (not UTF-8, without base64) stops it: the caller ends
/// the page before that record when others precede it, so that a reader gets every
/// record up to it and the read from it fails naming it.
pub fn records_json(frames: &[u8], encoding: Encoding) -> Result<Vec<Value>, Unwritable> {
    let corrupt = |error: ApiError| Unwritable { records_before: 0, error };
    let mut out = Vec::new();
    let mut at = 0;
    while at < frames.len() {
        let (frame, used) = match decode_frame(&frames[at..]) {
            Ok(Some(decoded)) => decoded,
            Ok(None) => return Err(corrupt(ApiError::internal("a read page ends inside a frame"))),
            Err(error) => {
                return Err(corrupt(ApiError::internal(format!(
                    "a read page is corrupt: {error}"
                ))));
            }
        };
        at += used;
        let Frame::Records(run) = frame else { continue };
        for (seq_num, timestamp, stored) in run.iter() {
            let record = engine::record::decode(stored).map_err(|error| {
                corrupt(ApiError::internal(format!("stored record {seq_num} is corrupt: {error}")))
            })?;
            let unwritable = |error| Unwritable { records_before: out.len() as u64, error };
            let text = |bytes, what: &str| {
                encoding.encode(bytes, &|| format!("record {seq_num} ({what})")).map_err(unwritable)
            };
            let mut headers = Vec::with_capacity(record.header_count());
            for (name, value) in record.headers() {
                headers.push(json!([text(name, "a header name")?, text(value, "a header value")?]));
            }
            let body = text(record.body(), "its body")?;
            out.push(json!({
                "seq_num": seq_num,
                "timestamp": timestamp,
                "headers": headers,
                "body": body,
            }));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::append_json::append_request;

    #[test]
    fn unknown_fields_are_named() {
        let error = append_request(br#"{"records":[],"match_seqnum":1}"#, Encoding::Text)
            .expect_err("refused");
        assert!(error.message.contains("\"match_seqnum\""), "{}", error.message);
        let error =
            append_request(br#"{"records":[{"bdy":"x"}]}"#, Encoding::Text).expect_err("refused");
        assert!(error.message.contains("records[0].\"bdy\""), "{}", error.message);
    }

    #[test]
    fn a_field_named_twice_is_refused_at_any_depth() {
        let error =
            stream_create(br#"{"class":"express","class":"standard"}"#).expect_err("refused");
        assert!(error.message.contains(r#"names the field "class" twice"#), "{}", error.message);
        let body = br#"{"records":[{"body":"a","body":"b"}]}"#;
        let error = append_request(body, Encoding::Text).expect_err("refused");
        assert!(error.message.contains(r#""body" twice at line 1"#), "{}", error.message);
        // Not a repeat: the same name in two objects, and repeated values in an array.
        let body = br#"{"records":[{"body":"a","headers":[["h","1"],["h","1"]]},{"body":"a"}]}"#;
        append_request(body, Encoding::Text).expect("accepted");
        // Still JSON that is not valid says so.
        let error = stream_create(br#"{"class":}"#).expect_err("refused");
        assert!(error.message.contains("is not valid JSON"), "{}", error.message);
    }

    #[test]
    fn wrong_types_name_the_field() {
        let error = stream_create(br#"{"retention_max_age_ms":"1h"}"#).expect_err("refused");
        assert!(error.message.contains("field retention_max_age_ms"), "{}", error.message);
        // Out of range: the message names the range.
        let error = stream_create(br#"{"retention_max_age_ms":18446744073709551616}"#)
            .expect_err("refused");
        let range = "must be a whole number from 0 to 18446744073709551615";
        assert!(error.message.contains(range), "{}", error.message);
        let body = br#"{"records":[{"body":"a","timestamp":9223372036854775808}]}"#;
        let error = append_request(body, Encoding::Text).expect_err("refused");
        let range = "records[0].timestamp must be a whole number from -9223372036854775808 to \
                     9223372036854775807";
        assert!(error.message.contains(range), "{}", error.message);
        // One past 64 bits is told as read as a float, not as the in-range number it rounds
        // to; so are floats written with a fraction or an exponent.
        for (body, shown) in [
            (
                &br#"{"records":[{"body":"a","timestamp":-9223372036854775809}]}"#[..],
                "-9.223372036854776e+18",
            ),
            (
                br#"{"records":[{"body":"a","timestamp":-9223372036854775808.0}]}"#,
                "-9.223372036854776e+18",
            ),
            (br#"{"records":[{"body":"a","timestamp":1e19}]}"#, "1e+19"),
        ] {
            let error = append_request(body, Encoding::Text).expect_err("refused");
            assert!(error.message.ends_with(&format!("{shown} ({ROUNDED})")), "{}", error.message);
        }
        let error = stream_create(br#"{"retention_max_age_ms":18446744073709551616}"#)
            .expect_err("refused");
        assert!(error.message.ends_with(&format!("({ROUNDED})")), "{}", error.message);
        let error = bucket_create(br#"{"default_class":"fast"}"#).expect_err("refused");
        assert!(error.message.contains("default_class"), "{}", error.message);
    }

    #[test]
    fn base64_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let text = Encoding::Base64.encode(&all, &String::new).expect("encodes");
        assert_eq!(Encoding::Base64.decode(&text, &String::new).expect("decodes"), all);
        assert!(Encoding::Text.encode(&all, &|| "x".into()).is_err());
    }
}

// ---- Tokens ---------------------------------------------------------------------------

/// An IssueToken request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequest {
    pub grants: Vec<Grant>,
    /// None: the token never expires.
    pub expires_in_seconds: Option<u64>,
    pub description: String,
}

/// `{"grants": ["bucket:apps:read", ...], "expires_in_seconds": N, "description": "..."}`.
pub fn token_request(body: &[u8]) -> Result<TokenRequest, ApiError> {
    let object = parse_body(body, &["grants", "expires_in_seconds", "description"])?;
    let values = object.required("grants", object.array("grants")?)?;
    let mut texts = Vec::with_capacity(values.len());
    for (index, value) in values.iter().enumerate() {
        texts.push(value.as_str().ok_or_else(|| {
            ApiError::invalid(format!(
                "field grants[{index}] must be a string such as \"bucket:apps:read\", not {}",
                excerpt(value)
            ))
        })?);
    }
    let grants = engine::auth::parse_grants(&texts)?;
    let expires_in_seconds = match object.u64("expires_in_seconds")? {
        Some(seconds) if !(1..=TOKEN_LIFETIME_SECONDS_MAX).contains(&seconds) => {
            return Err(ApiError::invalid(format!(
                "field expires_in_seconds is {seconds}; it must be 1 to \
                 {TOKEN_LIFETIME_SECONDS_MAX} (ten years), or absent for a token that never \
                 expires"
            )));
        }
        other => other,
    };
    let description = object.str("description")?.unwrap_or_default().to_owned();
    if let Some(found) = description.chars().find(|c| c.is_control()) {
        return Err(ApiError::invalid(format!(
            "field description holds the control character U+{:04X}; it is one line of text",
            u32::from(found)
        )));
    }
    if description.len() > TOKEN_DESCRIPTION_BYTES_MAX {
        return Err(ApiError::invalid(format!(
            "field description is {} bytes, over the limit of {TOKEN_DESCRIPTION_BYTES_MAX}",
            description.len()
        )));
    }
    Ok(TokenRequest { grants, expires_in_seconds, description })
}

/// A token as IssueToken and ListTokens show it: never the token or its hash.
pub fn token_json(token: &TokenRecord) -> Value {
    let grants: Vec<String> = token.grants.iter().map(ToString::to_string).collect();
    json!({
        "id": token.id,
        "grants": grants,
        "created_at_ms": token.created_at_ms,
        "expires_at_ms": token.expires_at_ms,
        "description": token.description,
    })
}
