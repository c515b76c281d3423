//! An Append's JSON body (`{"records": [...], "match_seq_num": N, "fencing_token": "t"}`),
//! parsed in one pass straight into the binary framing the engine takes.
//!
//! The body is never held as a JSON tree. A tree of small values costs up to about 90
//! times its text (a map node for `{"a":0}`, 7 bytes), so a body within
//! `--http-json-body-bytes-max` could take gigabytes before any check ran. Here each record
//! is encoded into the batch as soon as it is read, values that cannot be valid (an array
//! where a string belongs) are skipped unread, and the record and header counts are
//! refused as soon as they pass their limits: memory is the encoded batch, never more
//! than the body. The checks and their messages are those of the other bodies
//! ([`crate::wire`]): unknown and repeated fields refused, every message naming the field.

use serde::Deserializer as _;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use engine::framing::{AppendBuilder, AppendConditions};
use engine::limits::{BATCH_RECORDS_MAX, FENCING_TOKEN_BYTES_MAX, HEADERS_PER_RECORD_MAX};
use engine::shard::AppendRequest;
use engine::timestamp::Offered;

use crate::error::ApiError;
use crate::wire::{self, Encoding};

const FIELDS: [&str; 3] = ["records", "match_seq_num", "fencing_token"];
const RECORD_FIELDS: [&str; 3] = ["body", "headers", "timestamp"];

/// An Append's JSON body, encoded into the binary framing.
pub fn append_request(body: &[u8], encoding: Encoding) -> Result<AppendRequest, ApiError> {
    let mut parse = Parse {
        encoding,
        builder: AppendBuilder::new(),
        offered: Offered::new(),
        has_records: false,
        match_seq_num: None,
        fencing_token: None,
        failure: None,
    };
    if !body.iter().all(u8::is_ascii_whitespace) {
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let parsed =
            deserializer.deserialize_any(BodyVisitor(&mut parse)).and_then(|()| deserializer.end());
        if let Err(error) = parsed {
            return Err(parse.failure.take().unwrap_or_else(|| wire::body_error(&error)));
        }
    }
    if !parse.has_records {
        return Err(ApiError::invalid("field records is required"));
    }
    let fencing_token = parse.fencing_token.as_deref();
    if let Some(token) = fencing_token
        && token.len() > FENCING_TOKEN_BYTES_MAX
    {
        return Err(ApiError::from_engine(&engine::Error::FencingTokenTooLong {
            field: "fencing_token",
            len: token.len(),
            limit: FENCING_TOKEN_BYTES_MAX,
        }));
    }
    let conditions =
        AppendConditions { match_seq_num: parse.match_seq_num, fencing_token, timestamp: None };
    Ok(AppendRequest {
        framed: parse.builder.finish(&conditions).into(),
        offered: Some(parse.offered),
    })
}

/// What the body holds so far.
struct Parse {
    encoding: Encoding,
    builder: AppendBuilder,
    offered: Offered,
    has_records: bool,
    match_seq_num: Option<u64>,
    fencing_token: Option<String>,
    /// The refusal that stopped the parse (the parser's own error then carries nothing).
    failure: Option<ApiError>,
}

impl Parse {
    /// Stops the parse with `error`.
    fn fail<E: de::Error>(&mut self, error: ApiError) -> E {
        self.failure = Some(error);
        E::custom("refused")
    }
}

/// A field's value where a scalar belongs: scalars kept, arrays and objects skipped
/// unread (nothing in them is kept, whatever their size).
enum Field {
    Scalar(Value),
    Array,
    Object,
}

impl Field {
    /// How a message shows it.
    fn excerpt(&self) -> String {
        match self {
            Field::Scalar(value) => wire::excerpt(value),
            Field::Array => "an array".into(),
            Field::Object => "an object".into(),
        }
    }

    /// The field `name` as a u64; null is absent (as in [`wire`]'s objects).
    fn u64(self, name: &str) -> Result<Option<u64>, ApiError> {
        match self {
            Field::Scalar(Value::Null) => Ok(None),
            Field::Scalar(value) => wire::u64_value(name, &value).map(Some),
            other => Err(wire::u64_wrong(name, &other.excerpt())),
        }
    }

    /// The field `name` as an i64; null is absent.
    fn i64(self, name: &str) -> Result<Option<i64>, ApiError> {
        match self {
            Field::Scalar(Value::Null) => Ok(None),
            Field::Scalar(value) => wire::i64_value(name, &value).map(Some),
            other => Err(wire::i64_wrong(name, &other.excerpt())),
        }
    }

    /// The field `name` as a string; null is absent.
    fn string(self, name: &str) -> Result<Option<String>, ApiError> {
        match self {
            Field::Scalar(Value::Null) => Ok(None),
            Field::Scalar(Value::String(text)) => Ok(Some(text)),
            other => Err(wire::wrong(name, "a string", &other.excerpt())),
        }
    }
}

impl<'de> de::Deserialize<'de> for Field {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(FieldVisitor)
    }
}

struct FieldVisitor;

impl<'de> Visitor<'de> for FieldVisitor {
    type Value = Field;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Field, E> {
        Ok(Field::Scalar(Value::Bool(value)))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Field, E> {
        Ok(Field::Scalar(Value::from(value)))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Field, E> {
        Ok(Field::Scalar(Value::from(value)))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Field, E> {
        Ok(Field::Scalar(Value::from(value)))
    }

    fn visit_str<E>(self, value: &str) -> Result<Field, E> {
        Ok(Field::Scalar(Value::String(value.to_owned())))
    }

    fn visit_string<E>(self, value: String) -> Result<Field, E> {
        Ok(Field::Scalar(Value::String(value)))
    }

    fn visit_unit<E>(self) -> Result<Field, E> {
        Ok(Field::Scalar(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Field, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::Array)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Field, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::Object)
    }
}

/// Which of `names` a field name is (its index), or the unknown name; read without
/// allocating when it is known.
struct Name<'n>(&'n [&'n str]);

impl<'de> DeserializeSeed<'de> for Name<'_> {
    type Value = Result<usize, String>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name<'_> {
    type Value = Result<usize, String>;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a field name")
    }

    fn visit_str<E>(self, name: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|known| *known == name).ok_or_else(|| name.to_owned()))
    }
}

/// The next field of an object with `names`: its index, after refusing an unknown one
/// and one `seen` already.
fn next_field<'de, A: MapAccess<'de>>(
    map: &mut A,
    parse: &mut Parse,
    names: &[&str],
    seen: &mut [bool],
    prefix: &str,
    what: &str,
) -> Result<Option<usize>, A::Error> {
    match map.next_key_seed(Name(names))? {
        None => Ok(None),
        Some(Err(unknown)) => Err(parse.fail(wire::unknown_field(prefix, &unknown, what, names))),
        Some(Ok(index)) if seen[index] => {
            Err(de::Error::custom(format!("names the field {:?} twice", names[index])))
        }
        Some(Ok(index)) => {
            seen[index] = true;
            Ok(Some(index))
        }
    }
}

/// The error for a value of the wrong JSON kind where an object belongs.
fn not_an_object(what: &str, kind: &str) -> ApiError {
    ApiError::invalid(format!("{what} must be a JSON object, not {kind}"))
}

/// The visits of a visitor that wants one kind of container (`map` or `seq`), for every
/// other kind but null: each refuses with `self.wrong(kind)`.
macro_rules! refuse_others {
    (map) => {
        refuse_others!(scalars);

        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(self.wrong("an array"))
        }
    };
    (seq) => {
        refuse_others!(scalars);

        fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(self.wrong("an object"))
        }
    };
    (scalars) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(self.wrong("a boolean"))
        }

        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Err(self.wrong("a number"))
        }

        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Err(self.wrong("a number"))
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(self.wrong("a number"))
        }

        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Err(self.wrong("a string"))
        }
    };
}

/// The whole body: one object.
struct BodyVisitor<'p>(&'p mut Parse);

impl BodyVisitor<'_> {
    fn wrong<E: de::Error>(self, kind: &str) -> E {
        self.0.fail(not_an_object("request body", kind))
    }
}

impl<'de> Visitor<'de> for BodyVisitor<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a JSON object")
    }

    refuse_others!(map);

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(self.wrong("null"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let parse = self.0;
        let mut seen = [false; FIELDS.len()];
        while let Some(index) = next_field(&mut map, parse, &FIELDS, &mut seen, "", "request body")?
        {
            match index {
                0 => map.next_value_seed(RecordsSeed(&mut *parse))?,
                1 => {
                    let field: Field = map.next_value()?;
                    parse.match_seq_num = field.u64("match_seq_num").map_err(|e| parse.fail(e))?;
                }
                _ => {
                    let field: Field = map.next_value()?;
                    parse.fencing_token =
                        field.string("fencing_token").map_err(|e| parse.fail(e))?;
                }
            }
        }
        Ok(())
    }
}

/// The `records` array.
struct RecordsSeed<'p>(&'p mut Parse);

impl<'de> DeserializeSeed<'de> for RecordsSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl RecordsSeed<'_> {
    fn wrong<E: de::Error>(self, kind: &str) -> E {
        self.0.fail(wire::wrong("records", "an array", kind))
    }
}

impl<'de> Visitor<'de> for RecordsSeed<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("an array of records")
    }

    refuse_others!(seq);

    /// Null is as good as absent.
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let parse = self.0;
        parse.has_records = true;
        let mut index = 0;
        while index < BATCH_RECORDS_MAX {
            if seq.next_element_seed(RecordSeed { parse: &mut *parse, index })?.is_none() {
                return Ok(());
            }
            index += 1;
        }
        // Past the limit: the rest is counted, not kept, so the message can say how many.
        let mut count = u64::from(index);
        while seq.next_element::<IgnoredAny>()?.is_some() {
            count += 1;
        }
        if count > u64::from(BATCH_RECORDS_MAX) {
            let error = engine::Error::TooManyRecords { count, limit: BATCH_RECORDS_MAX };
            return Err(parse.fail(ApiError::from_engine(&error)));
        }
        Ok(())
    }
}

/// Record `index` of the array, encoded into the batch.
struct RecordSeed<'p> {
    parse: &'p mut Parse,
    index: u32,
}

impl<'de> DeserializeSeed<'de> for RecordSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl RecordSeed<'_> {
    fn wrong<E: de::Error>(self, kind: &str) -> E {
        let what = format!("records[{}]", self.index);
        self.parse.fail(not_an_object(&what, kind))
    }
}

impl<'de> Visitor<'de> for RecordSeed<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a record object")
    }

    refuse_others!(map);

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(self.wrong("null"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let RecordSeed { parse, index } = self;
        let what = format!("records[{index}]");
        let prefix = format!("{what}.");
        let name = |field: &str| format!("{prefix}{field}");
        let (mut body, mut headers, mut timestamp) = (None, Vec::new(), None);
        let mut seen = [false; RECORD_FIELDS.len()];
        while let Some(field) =
            next_field(&mut map, parse, &RECORD_FIELDS, &mut seen, &prefix, &what)?
        {
            match field {
                0 => {
                    let field: Field = map.next_value()?;
                    let encoding = parse.encoding;
                    body = field
                        .string(&name("body"))
                        .and_then(|text| {
                            text.map(|text| encoding.decode_owned(text, &|| name("body")))
                                .transpose()
                        })
                        .map_err(|e| parse.fail(e))?;
                }
                1 => map.next_value_seed(HeadersSeed {
                    encoding: parse.encoding,
                    failure: &mut parse.failure,
                    record: index,
                    headers: &mut headers,
                })?,
                _ => {
                    let field: Field = map.next_value()?;
                    timestamp = field.i64(&name("timestamp")).map_err(|e| parse.fail(e))?;
                }
            }
        }
        let Some(body) = body else {
            return Err(
                parse.fail(ApiError::invalid(format!("field {} is required", name("body"))))
            );
        };
        if let Err(error) = parse.builder.push(&headers, &body) {
            return Err(parse.fail(ApiError::invalid(format!("{what}: {error}"))));
        }
        parse.offered.push(timestamp);
        Ok(())
    }
}

/// A record's `headers`: `[name, value]` pairs of strings, at most
/// [`HEADERS_PER_RECORD_MAX`].
struct HeadersSeed<'p> {
    encoding: Encoding,
    failure: &'p mut Option<ApiError>,
    record: u32,
    headers: &'p mut Vec<(Vec<u8>, Vec<u8>)>,
}

impl HeadersSeed<'_> {
    fn fail<E: de::Error>(&mut self, error: ApiError) -> E {
        *self.failure = Some(error);
        E::custom("refused")
    }

    fn wrong<E: de::Error>(mut self, kind: &str) -> E {
        let name = format!("records[{}].headers", self.record);
        self.fail(wire::wrong(&name, "an array", kind))
    }
}

impl<'de> DeserializeSeed<'de> for HeadersSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for HeadersSeed<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("an array of headers")
    }

    refuse_others!(seq);

    /// Null is as good as absent.
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let record = self.record;
        loop {
            let h = self.headers.len();
            let field = || format!("records[{record}].headers[{h}]");
            if h == HEADERS_PER_RECORD_MAX {
                // Past the limit: the rest is counted, not kept.
                let mut count = h;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    count += 1;
                }
                if count > HEADERS_PER_RECORD_MAX {
                    let limit = HEADERS_PER_RECORD_MAX;
                    let error = engine::Error::TooManyHeaders { index: record, count, limit };
                    return Err(self.fail(ApiError::from_engine(&error)));
                }
                return Ok(());
            }
            let Some(pair) = seq.next_element::<Pair>()? else { return Ok(()) };
            let (name, value) = match pair {
                Pair::Strings(name, value) => (name, value),
                Pair::Other(shown) => {
                    return Err(self.fail(ApiError::invalid(format!(
                        "{} must be a [name, value] pair of strings, not {shown}",
                        field()
                    ))));
                }
            };
            let name = self.encoding.decode_owned(name, &|| format!("{} name", field()));
            let name = name.map_err(|e| self.fail(e))?;
            let value = self.encoding.decode_owned(value, &|| format!("{} value", field()));
            let value = value.map_err(|e| self.fail(e))?;
            self.headers.push((name, value));
        }
    }
}

/// One element of `headers`: a pair of strings, or how a message shows what it was.
enum Pair {
    Strings(String, String),
    Other(String),
}

impl<'de> de::Deserialize<'de> for Pair {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PairVisitor)
    }
}

struct PairVisitor;

impl PairVisitor {
    fn other<E>(field: Result<Field, E>) -> Result<Pair, E> {
        field.map(|field| Pair::Other(field.excerpt()))
    }
}

impl<'de> Visitor<'de> for PairVisitor {
    type Value = Pair;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a [name, value] pair")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Pair, A::Error> {
        // Up to three elements are kept to show in a message; the rest are skipped.
        let mut elements = Vec::new();
        let mut more = false;
        while let Some(element) = seq.next_element::<Field>()? {
            if elements.len() < 3 {
                elements.push(element);
            } else {
                more = true;
            }
        }
        if let [Field::Scalar(Value::String(_)), Field::Scalar(Value::String(_))] = &elements[..]
            && let (
                Some(Field::Scalar(Value::String(value))),
                Some(Field::Scalar(Value::String(name))),
            ) = (elements.pop(), elements.pop())
        {
            return Ok(Pair::Strings(name, value));
        }
        let mut shown: Vec<String> = elements.iter().map(Field::excerpt).collect();
        if more {
            shown.push("...".into());
        }
        Ok(Pair::Other(format!("[{}]", shown.join(","))))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Pair, A::Error> {
        Self::other(FieldVisitor.visit_map(map))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Pair, E> {
        Self::other(FieldVisitor.visit_bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Pair, E> {
        Self::other(FieldVisitor.visit_i64(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Pair, E> {
        Self::other(FieldVisitor.visit_u64(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Pair, E> {
        Self::other(FieldVisitor.visit_f64(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Pair, E> {
        Self::other(FieldVisitor.visit_str(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Pair, E> {
        Self::other(FieldVisitor.visit_unit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(body: &str) -> String {
        match append_request(body.as_bytes(), Encoding::Text) {
            Ok(_) => panic!("accepted: {body:.80}"),
            Err(error) => error.message,
        }
    }

    fn records(count: usize, record: &str) -> String {
        format!(r#"{{"records":[{}]}}"#, vec![record; count].join(","))
    }

    #[test]
    fn counts_are_refused_as_they_pass_their_limits_naming_them() {
        let at_limit = records(BATCH_RECORDS_MAX as usize, r#"{"body":""}"#);
        append_request(at_limit.as_bytes(), Encoding::Text).expect("100,000 records fit");
        let over = records(BATCH_RECORDS_MAX as usize + 2, r#"{"body":""}"#);
        let message = refusal(&over);
        assert!(
            message.contains("batch has 100002 records, over the batch limit of 100000"),
            "{message}"
        );
        // Past 255 headers too (the most a stored record's table could say), the message
        // names the limit of 100.
        for count in [101, 256, 5000] {
            let headers = vec![r#"["h","v"]"#; count].join(",");
            let message = refusal(&records(1, &format!(r#"{{"body":"","headers":[{headers}]}}"#)));
            let want = format!("record 0 has {count} headers, over the limit of 100");
            assert!(message.contains(&want), "{message}");
        }
    }

    #[test]
    fn wrong_shapes_name_the_field() {
        for (body, want) in [
            (r#"[]"#, "request body must be a JSON object, not an array"),
            (r#"{"records":"x"}"#, "field records must be an array, not a string"),
            (r#"{"records":null}"#, "field records is required"),
            (r#"{"records":[7]}"#, "records[0] must be a JSON object, not a number"),
            (r#"{"records":[{"headers":[]}]}"#, "field records[0].body is required"),
            (
                r#"{"records":[{"body":["a"]}]}"#,
                "field records[0].body must be a string, not an array",
            ),
            (
                r#"{"records":[{"body":"a","headers":[["a"]]}]}"#,
                r#"records[0].headers[0] must be a [name, value] pair of strings, not ["a"]"#,
            ),
            (
                r#"{"records":[{"body":"a","headers":[["a","b",{"c":1},4]]}]}"#,
                r#"not ["a","b",an object,..."#,
            ),
            (
                r#"{"records":[{"body":"a","headers":{}}]}"#,
                "field records[0].headers must be an array, not an object",
            ),
            (
                r#"{"records":[{"body":"a","timestamp":1.5}]}"#,
                "field records[0].timestamp must be a whole number",
            ),
            (
                r#"{"records":[],"match_seq_num":-1}"#,
                "field match_seq_num must be a whole number from 0",
            ),
            (
                r#"{"records":[],"fencing_token":{}}"#,
                "field fencing_token must be a string, not an object",
            ),
            (
                r#"{"records":[],"records":[]}"#,
                r#"request body names the field "records" twice at line 1"#,
            ),
            (r#"{"records":[]} x"#, "request body is not valid JSON: trailing characters"),
        ] {
            let message = refusal(body);
            assert!(message.contains(want), "{body}: {message}");
        }
    }

    /// The body is never held as a JSON tree: parsing takes memory of the order of the
    /// encoded batch. 10,000 records of 100 one-byte headers are a 9 MB body; as a tree
    /// they took over 140 MB (a `Vec` and two `String`s per header).
    #[test]
    fn parsing_takes_memory_of_the_order_of_the_body() {
        let headers = vec![r#"["h",""]"#; 100].join(",");
        let body = records(10_000, &format!(r#"{{"body":"","headers":[{headers}]}}"#));
        let before = peak_resident_bytes();
        let request = append_request(body.as_bytes(), Encoding::Text).expect("a valid batch");
        let grown = peak_resident_bytes().saturating_sub(before);
        assert!(grown < 2 * body.len() as u64, "{grown} bytes for a {} byte body", body.len());
        drop(request);
    }

    /// This process's peak resident memory (each test is a process of its own under
    /// nextest).
    fn peak_resident_bytes() -> u64 {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) }, 0);
        // SAFETY: initialised by the successful call above.
        let usage = unsafe { usage.assume_init() };
        u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024
    }
}
