//! Bucket names and stream keys: the two halves of a stream's address.
//!
//! This module owns the naming rules of buckets.md and limits.md and nothing else. A
//! [`BucketName`] or [`StreamKey`] exists only if it passed them, so code that holds one
//! never checks again. It never resolves an address to a stream (that is the metadata
//! store's job) and never looks inside a key: `/` is a grouping convention for people,
//! not a hierarchy, and nova never parses a key.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Shortest bucket name, in bytes.
pub const BUCKET_NAME_BYTES_MIN: usize = 3;
/// Longest bucket name, in bytes. Bucket names embed in metadata keys and object
/// prefixes, which is why the rules are strict.
pub const BUCKET_NAME_BYTES_MAX: usize = 63;
/// Shortest stream key, in bytes.
pub const STREAM_KEY_BYTES_MIN: usize = 1;
/// Longest stream key, in bytes of UTF-8.
pub const STREAM_KEY_BYTES_MAX: usize = 512;

/// How much of an offending name an error message quotes. A refused key may be
/// arbitrarily long (it arrives in a URL); the message needs only enough to recognise it.
const EXCERPT_CHARS_MAX: usize = 64;

/// The bucket-name rule a name broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketNameRule {
    /// Not 3 to 63 bytes long.
    Length { len: usize },
    /// A byte that is not `a-z`, `0-9` or `-` (and not a dot, which has its own rule).
    Character { index: usize, found: char },
    /// A dot: allowed by S3, refused by nova.
    Dot { index: usize },
    /// Starts with `-`.
    LeadingHyphen,
    /// Ends with `-`.
    TrailingHyphen,
}

impl fmt::Display for BucketNameRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BucketNameRule::Length { len } => write!(
                f,
                "a bucket name is {BUCKET_NAME_BYTES_MIN} to {BUCKET_NAME_BYTES_MAX} bytes, \
                 not {len}"
            ),
            BucketNameRule::Character { index, found } => write!(
                f,
                "byte {index} is {found:?}; only lowercase letters a-z, digits 0-9 and '-' \
                 are allowed"
            ),
            BucketNameRule::Dot { index } => {
                write!(f, "byte {index} is a dot; dots are not allowed in a bucket name")
            }
            BucketNameRule::LeadingHyphen => write!(f, "a bucket name must not start with '-'"),
            BucketNameRule::TrailingHyphen => write!(f, "a bucket name must not end with '-'"),
        }
    }
}

/// The stream-key rule a key broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKeyRule {
    /// Not 1 to 512 bytes long.
    Length { len: usize },
    /// Not valid UTF-8; the bytes before `valid_up_to` were.
    NotUtf8 { valid_up_to: usize },
    /// A control character, U+0000–U+001F or U+007F–U+009F, at byte `index`.
    ControlCharacter { index: usize, found: char },
}

impl fmt::Display for StreamKeyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamKeyRule::Length { len } => write!(
                f,
                "a stream key is {STREAM_KEY_BYTES_MIN} to {STREAM_KEY_BYTES_MAX} bytes, not {len}"
            ),
            StreamKeyRule::NotUtf8 { valid_up_to } => {
                write!(f, "a stream key must be valid UTF-8, and byte {valid_up_to} is not")
            }
            StreamKeyRule::ControlCharacter { index, found } => write!(
                f,
                "byte {index} is the control character U+{:04X}; control characters are not \
                 allowed in a stream key",
                u32::from(*found)
            ),
        }
    }
}

/// A bucket's name: 3 to 63 bytes of `a-z`, `0-9` and `-`, no leading or trailing `-`.
///
/// Ordered by bytes, which is the order ListBuckets pages in.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketName(String);

impl BucketName {
    /// Checks `name` against every bucket-name rule. The error names the rule broken.
    pub fn parse(name: &str) -> Result<Self> {
        check_bucket_name(name).map_err(|rule| Error::InvalidBucketName {
            name: excerpt(name, EXCERPT_CHARS_MAX),
            rule,
        })?;
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

fn check_bucket_name(name: &str) -> Result<(), BucketNameRule> {
    let bytes = name.as_bytes();
    if !(BUCKET_NAME_BYTES_MIN..=BUCKET_NAME_BYTES_MAX).contains(&bytes.len()) {
        return Err(BucketNameRule::Length { len: bytes.len() });
    }
    // Walk chars rather than bytes so a refused multi-byte character is reported whole.
    for (index, found) in name.char_indices() {
        match found {
            'a'..='z' | '0'..='9' | '-' => {}
            '.' => return Err(BucketNameRule::Dot { index }),
            _ => return Err(BucketNameRule::Character { index, found }),
        }
    }
    if name.starts_with('-') {
        return Err(BucketNameRule::LeadingHyphen);
    }
    if name.ends_with('-') {
        return Err(BucketNameRule::TrailingHyphen);
    }
    Ok(())
}

/// A stream's key within its bucket: 1 to 512 bytes of UTF-8 without control characters.
///
/// Opaque: `orders`, `orders/` and `orders/eu` are three unrelated keys. Ordered by bytes,
/// which is the order ListStreams pages in.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamKey(String);

impl StreamKey {
    /// Checks `key` against every stream-key rule. The error names the rule broken.
    pub fn parse(key: &str) -> Result<Self> {
        check_stream_key(key).map_err(|rule| Error::InvalidStreamKey {
            key: excerpt(key, EXCERPT_CHARS_MAX),
            rule,
        })?;
        Ok(Self(key.to_owned()))
    }

    /// Like [`StreamKey::parse`], for a key that arrived as bytes (a decoded URL segment):
    /// bytes that are not UTF-8 are refused, never replaced.
    pub fn from_bytes(key: &[u8]) -> Result<Self> {
        let refuse = |rule| Error::InvalidStreamKey {
            key: excerpt(&String::from_utf8_lossy(key), EXCERPT_CHARS_MAX),
            rule,
        };
        // Length first: it is the cheap check and bounds the work of the others.
        if !(STREAM_KEY_BYTES_MIN..=STREAM_KEY_BYTES_MAX).contains(&key.len()) {
            return Err(refuse(StreamKeyRule::Length { len: key.len() }));
        }
        let text = std::str::from_utf8(key)
            .map_err(|error| refuse(StreamKeyRule::NotUtf8 { valid_up_to: error.valid_up_to() }))?;
        Self::parse(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

fn check_stream_key(key: &str) -> Result<(), StreamKeyRule> {
    if !(STREAM_KEY_BYTES_MIN..=STREAM_KEY_BYTES_MAX).contains(&key.len()) {
        return Err(StreamKeyRule::Length { len: key.len() });
    }
    match key.char_indices().find(|&(_, c)| is_control(c)) {
        Some((index, found)) => Err(StreamKeyRule::ControlCharacter { index, found }),
        None => Ok(()),
    }
}

/// The control characters of limits.md: C0 (U+0000–U+001F), DEL and C1 (U+007F–U+009F).
/// Spelled out rather than `char::is_control` so the rule reads as the spec states it.
const fn is_control(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// The first `chars_max` characters of `text`, marked when cut: how an error message
/// shows a value it quotes.
pub fn excerpt(text: &str, chars_max: usize) -> String {
    match text.char_indices().nth(chars_max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

macro_rules! name_impls {
    ($name:ident) => {
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:?})"), self.0)
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(text: &str) -> Result<Self> {
                Self::parse(text)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

name_impls!(BucketName);
name_impls!(StreamKey);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use proptest::prelude::*;

    fn bucket_rule(name: &str) -> BucketNameRule {
        match BucketName::parse(name) {
            Err(Error::InvalidBucketName { rule, .. }) => rule,
            other => panic!("expected InvalidBucketName for {name:?}, got {other:?}"),
        }
    }

    fn key_rule(key: &str) -> StreamKeyRule {
        match StreamKey::parse(key) {
            Err(Error::InvalidStreamKey { rule, .. }) => rule,
            other => panic!("expected InvalidStreamKey for {key:?}, got {other:?}"),
        }
    }

    fn key_bytes_rule(key: &[u8]) -> StreamKeyRule {
        match StreamKey::from_bytes(key) {
            Err(Error::InvalidStreamKey { rule, .. }) => rule,
            other => panic!("expected InvalidStreamKey for {key:?}, got {other:?}"),
        }
    }

    #[test]
    fn bucket_length_boundaries() {
        assert_eq!(bucket_rule(""), BucketNameRule::Length { len: 0 });
        assert_eq!(bucket_rule("ab"), BucketNameRule::Length { len: 2 });
        assert_eq!(BucketName::parse("abc").expect("3 bytes").as_str(), "abc");
        let longest = "a".repeat(63);
        assert_eq!(BucketName::parse(&longest).expect("63 bytes").as_str(), longest);
        assert_eq!(bucket_rule(&"a".repeat(64)), BucketNameRule::Length { len: 64 });
        // Length counts bytes: two two-byte characters are 4 bytes, so the length passes
        // and the character rule catches them.
        assert_eq!(bucket_rule("éé"), BucketNameRule::Character { index: 0, found: 'é' });
        assert_eq!(bucket_rule("é"), BucketNameRule::Length { len: 2 });
    }

    #[test]
    fn bucket_characters() {
        assert!(BucketName::parse("a-b-0-9").is_ok());
        assert!(BucketName::parse("123").is_ok());
        assert!(BucketName::parse("a--b").is_ok());
        assert_eq!(bucket_rule("Apps"), BucketNameRule::Character { index: 0, found: 'A' });
        assert_eq!(bucket_rule("ap_ps"), BucketNameRule::Character { index: 2, found: '_' });
        assert_eq!(bucket_rule("ap ps"), BucketNameRule::Character { index: 2, found: ' ' });
        assert_eq!(bucket_rule("ap/ps"), BucketNameRule::Character { index: 2, found: '/' });
        assert_eq!(bucket_rule("apps\n"), BucketNameRule::Character { index: 4, found: '\n' });
        assert_eq!(bucket_rule("my.apps"), BucketNameRule::Dot { index: 2 });
        assert_eq!(bucket_rule("..."), BucketNameRule::Dot { index: 0 });
    }

    #[test]
    fn bucket_hyphens_at_the_ends() {
        assert_eq!(bucket_rule("-apps"), BucketNameRule::LeadingHyphen);
        assert_eq!(bucket_rule("apps-"), BucketNameRule::TrailingHyphen);
        assert_eq!(bucket_rule("---"), BucketNameRule::LeadingHyphen);
        assert!(BucketName::parse("a-b").is_ok());
    }

    #[test]
    fn bucket_error_names_the_rule_and_the_name() {
        let error = BucketName::parse("my.apps").expect_err("dot");
        assert_eq!(error.code(), Code::InvalidArgument);
        let message = error.to_string();
        assert!(message.contains("\"my.apps\""), "{message}");
        assert!(message.contains("dots are not allowed"), "{message}");
        let message = BucketName::parse("ab").expect_err("short").to_string();
        assert!(message.contains("3 to 63 bytes, not 2"), "{message}");
        let message = BucketName::parse("-ab").expect_err("leading").to_string();
        assert!(message.contains("must not start with '-'"), "{message}");
    }

    #[test]
    fn key_length_boundaries() {
        assert_eq!(key_rule(""), StreamKeyRule::Length { len: 0 });
        assert!(StreamKey::parse("a").is_ok());
        let longest = "k".repeat(512);
        assert_eq!(StreamKey::parse(&longest).expect("512 bytes").as_str(), longest);
        assert_eq!(key_rule(&"k".repeat(513)), StreamKeyRule::Length { len: 513 });
        // Bytes, not characters: 128 four-byte characters are exactly 512 bytes.
        assert!(StreamKey::parse(&"🦀".repeat(128)).is_ok());
        assert_eq!(key_rule(&format!("a{}", "🦀".repeat(128))), StreamKeyRule::Length { len: 513 });
    }

    #[test]
    fn key_control_characters() {
        for code in (0x00..=0x1f).chain(0x7f..=0x9f) {
            let found = char::from_u32(code).expect("a scalar value");
            let key = format!("ab{found}c");
            assert_eq!(
                key_rule(&key),
                StreamKeyRule::ControlCharacter { index: 2, found },
                "U+{code:04X}"
            );
        }
        // The neighbours of both ranges are ordinary characters.
        for found in [' ', '~', '\u{a0}', '\u{2028}', '\u{feff}'] {
            assert!(StreamKey::parse(&format!("a{found}")).is_ok(), "{found:?}");
        }
        let message = StreamKey::parse("a\u{85}").expect_err("NEL is C1").to_string();
        assert!(message.contains("U+0085"), "{message}");
        assert!(message.contains("byte 1"), "{message}");
    }

    #[test]
    fn key_is_opaque() {
        for key in ["orders", "orders/", "orders/eu", "/", "//", " ", "..", "%2F", "ключ", "a b"]
        {
            assert_eq!(StreamKey::parse(key).expect("legal key").as_str(), key);
        }
        let orders = StreamKey::parse("orders").expect("legal");
        let orders_slash = StreamKey::parse("orders/").expect("legal");
        let orders_eu = StreamKey::parse("orders/eu").expect("legal");
        assert_ne!(orders, orders_slash);
        assert_ne!(orders_slash, orders_eu);
        assert!(orders < orders_slash && orders_slash < orders_eu);
    }

    #[test]
    fn key_from_bytes() {
        assert_eq!(StreamKey::from_bytes(b"orders/eu").expect("utf-8").as_str(), "orders/eu");
        assert_eq!(key_bytes_rule(b"ab\xffcd"), StreamKeyRule::NotUtf8 { valid_up_to: 2 });
        assert_eq!(key_bytes_rule(b"\xc3"), StreamKeyRule::NotUtf8 { valid_up_to: 0 });
        assert_eq!(key_bytes_rule(b""), StreamKeyRule::Length { len: 0 });
        assert_eq!(key_bytes_rule(&[0xff; 513]), StreamKeyRule::Length { len: 513 });
        assert_eq!(
            key_bytes_rule(b"a\x00"),
            StreamKeyRule::ControlCharacter { index: 1, found: '\0' }
        );
        let message = StreamKey::from_bytes(b"ab\xff").expect_err("not utf-8").to_string();
        assert!(message.contains("UTF-8"), "{message}");
    }

    #[test]
    fn long_names_are_excerpted_in_messages() {
        let message = StreamKey::parse(&"k".repeat(10_000)).expect_err("long").to_string();
        assert!(message.len() < 300, "{message}");
        assert!(message.contains("10000"), "{message}");
        assert!(message.contains("..."), "{message}");
    }

    #[test]
    fn display_debug_and_order_use_the_bytes() {
        let bucket: BucketName = "apps".parse().expect("valid");
        assert_eq!(bucket.to_string(), "apps");
        assert_eq!(format!("{bucket:?}"), "BucketName(\"apps\")");
        let key: StreamKey = "orders/eu".parse().expect("valid");
        assert_eq!(key.to_string(), "orders/eu");
        assert_eq!(format!("{key:?}"), "StreamKey(\"orders/eu\")");
        assert_eq!(key.as_ref(), "orders/eu");
        assert_eq!(key.clone().into_string(), "orders/eu");
        // Byte order, not character-aware order: 'Z' (0x5a) < 'a' (0x61) < 'é' (0xc3..).
        let mut keys: Vec<StreamKey> =
            ["é", "a", "Z", "a/b", "a-b"].iter().map(|k| k.parse().expect("valid")).collect();
        keys.sort();
        let sorted: Vec<&str> = keys.iter().map(StreamKey::as_str).collect();
        assert_eq!(sorted, ["Z", "a", "a-b", "a/b", "é"]);
        let mut buckets: Vec<BucketName> =
            ["b-1", "a10", "a99", "a-9"].iter().map(|b| b.parse().expect("valid")).collect();
        buckets.sort();
        let sorted: Vec<&str> = buckets.iter().map(BucketName::as_str).collect();
        assert_eq!(sorted, ["a-9", "a10", "a99", "b-1"]);
    }

    /// The rules restated as a predicate, independently of the parser's structure.
    fn bucket_oracle(name: &str) -> bool {
        let b = name.as_bytes();
        (3..=63).contains(&b.len())
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    }

    fn key_oracle(key: &str) -> bool {
        (1..=512).contains(&key.len()) && !key.chars().any(char::is_control)
    }

    proptest! {
        #[test]
        fn generated_valid_bucket_names_parse(name in "[a-z0-9][a-z0-9-]{1,61}[a-z0-9]") {
            prop_assert_eq!(BucketName::parse(&name)?.into_string(), name);
        }

        #[test]
        fn bucket_names_with_a_bad_character_are_refused(
            name in "[a-z0-9][a-z0-9-]{1,61}[a-z0-9]",
            bad in "[A-Z._ /\\x00-\\x1f\u{80}-\u{10ffff}]",
            at in any::<prop::sample::Index>(),
        ) {
            // The generated name is ASCII, so any index is a character boundary.
            let mut broken = name.clone();
            broken.insert_str(at.index(name.len() + 1), &bad);
            // Inserting may push the length over 63; either way it must be refused.
            prop_assert!(BucketName::parse(&broken).is_err());
        }

        #[test]
        fn bucket_parse_agrees_with_the_rules(name in "[a-z0-9.A-Z_-]{0,70}") {
            prop_assert_eq!(BucketName::parse(&name).is_ok(), bucket_oracle(&name));
        }

        #[test]
        fn generated_valid_keys_parse(key in "[^\\x00-\\x1f\\x7f-\\x9f]{1,128}") {
            prop_assert_eq!(StreamKey::parse(&key)?.into_string(), key.as_str());
            prop_assert_eq!(StreamKey::from_bytes(key.as_bytes())?.into_string(), key);
        }

        #[test]
        fn keys_with_a_control_character_are_refused(
            key in "[^\\x00-\\x1f\\x7f-\\x9f]{0,100}",
            bad in "[\\x00-\\x1f\\x7f-\\x9f]",
        ) {
            let broken = format!("{key}{bad}{key}");
            prop_assert!(StreamKey::parse(&broken).is_err());
        }

        #[test]
        fn key_parse_agrees_with_the_rules(
            // Any text, and text dense in the boundaries of both control ranges and
            // long enough in bytes to cross 512.
            key in prop_oneof!["(?s:.){0,200}", "[\\x00-\\x20\\x7e-\\xa0a/é🦀]{0,300}"],
        ) {
            prop_assert_eq!(StreamKey::parse(&key).is_ok(), key_oracle(&key));
        }

        #[test]
        fn key_from_bytes_agrees_with_utf8_and_the_rules(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let expected = std::str::from_utf8(&bytes).is_ok_and(key_oracle);
            prop_assert_eq!(StreamKey::from_bytes(&bytes).is_ok(), expected);
        }
    }
}
