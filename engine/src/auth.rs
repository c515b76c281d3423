//! The domain rules of access (spec/auth.md): what a grant is, how it is written, and
//! which requests it covers.
//!
//! A grant is `RESOURCE:OPERATIONS`, split at its last `:` (operations never contain
//! one):
//!
//! ```text
//! *:*:read,write,admin          the whole fleet
//! bucket:apps:read              one bucket and its streams
//! stream:apps/orders/:write     the streams of bucket apps whose key starts with orders/
//! ```
//!
//! Operations come in three groups: `read` (Read, Subscribe, CheckTail, GetStream,
//! ReadPlan, ListStreams, GetBucket), `write` (Append, Trim, Fence) and `admin` (create,
//! update, reconfigure, delete). Fleet-wide requests (ListBuckets, `/metrics`, tokens)
//! need a `*:*` grant.
//!
//! The grammar is a persisted format: token rows store each grant as the text
//! [`Grant`]'s `Display` writes (golden vectors in `engine/testdata/control_rows.txt`), and
//! a row whose grant no longer parses is corrupt. Widen the grammar freely; never narrow
//! it.
//!
//! This module owns the grammar, the covering rule and the token limits. It never sees a
//! token or a request (that is the HTTP server's) and never stores anything (the control
//! plane's token rows).

use std::fmt;

use crate::error::{Error, Result};
use crate::names::{BucketName, STREAM_KEY_BYTES_MAX};

/// Grants one token may carry.
pub const GRANTS_PER_TOKEN_MAX: usize = 64;
/// Bytes of a token's description.
pub const TOKEN_DESCRIPTION_BYTES_MAX: usize = 256;
/// The longest lifetime a token may be issued with: ten years.
pub const TOKEN_LIFETIME_SECONDS_MAX: u64 = 10 * 365 * 24 * 3600;
/// Bytes of a root token, inclusive: long enough to be unguessable.
pub const ROOT_TOKEN_BYTES_MIN: usize = 16;
/// Bytes of a root token, inclusive.
pub const ROOT_TOKEN_BYTES_MAX: usize = 4096;

/// An operation group: what a request does to its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Access {
    Read = 1,
    Write = 2,
    Admin = 4,
}

impl Access {
    pub const ALL: [Access; 3] = [Access::Read, Access::Write, Access::Admin];

    pub const fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Admin => "admin",
        }
    }
}

/// What a grant reaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `*:*`: every bucket and stream, and the fleet-wide requests.
    Fleet,
    /// `bucket:NAME`: the bucket and every stream in it.
    Bucket(BucketName),
    /// `stream:NAME/PREFIX`: the streams of the bucket whose key starts with the prefix
    /// (an empty prefix: all of them, but not the bucket itself).
    Streams { bucket: BucketName, prefix: String },
}

/// What a request touches.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// ListBuckets, `/metrics`, the token verbs.
    Fleet,
    /// The bucket verbs.
    Bucket(&'a BucketName),
    /// The stream verbs.
    Stream(&'a BucketName, &'a str),
    /// ListStreams of the bucket with this key prefix.
    Listing(&'a BucketName, &'a str),
}

/// One grant: a resource and the operation groups allowed on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub resource: Resource,
    /// A set of [`Access`] bits, never empty.
    ops: u8,
}

impl Grant {
    /// Parses `RESOURCE:OPERATIONS`; the error names the grant and what is wrong with it.
    pub fn parse(text: &str) -> Result<Grant> {
        let refuse = |reason: &str| Error::InvalidOptionValue {
            field: "grant",
            value: text.chars().take(80).collect(),
            reason: format!(
                "{reason}; a grant is RESOURCE:OPERATIONS, e.g. bucket:apps:read,write \
                 (resources *:*, bucket:NAME, stream:NAME/KEY-PREFIX; operations read, \
                 write, admin)"
            ),
        };
        let (resource, ops_text) =
            text.rsplit_once(':').ok_or_else(|| refuse("it has no operations"))?;
        let mut ops = 0u8;
        for word in ops_text.split(',') {
            let op = Access::ALL
                .into_iter()
                .find(|op| op.as_str() == word)
                .ok_or_else(|| refuse(&format!("unknown operation {word:?}")))?;
            if ops & op as u8 != 0 {
                return Err(refuse(&format!("operation {word} is given twice")));
            }
            ops |= op as u8;
        }
        let resource = match resource.split_once(':') {
            Some(("*", "*")) => Resource::Fleet,
            Some(("bucket", name)) => Resource::Bucket(
                BucketName::parse(name).map_err(|e| refuse(&format!("bucket: {e}")))?,
            ),
            Some(("stream", path)) => {
                let (name, prefix) = path
                    .split_once('/')
                    .ok_or_else(|| refuse("stream:NAME/KEY-PREFIX has no /"))?;
                let bucket =
                    BucketName::parse(name).map_err(|e| refuse(&format!("bucket: {e}")))?;
                if prefix.len() > STREAM_KEY_BYTES_MAX {
                    return Err(refuse(&format!(
                        "the key prefix is {} bytes, over the {STREAM_KEY_BYTES_MAX} of a key",
                        prefix.len()
                    )));
                }
                // No stream key holds a control character, so no prefix needs one.
                if let Some(found) = prefix.chars().find(|c| c.is_control()) {
                    return Err(refuse(&format!(
                        "the key prefix holds the control character U+{:04X}, which no stream \
                         key may hold",
                        u32::from(found)
                    )));
                }
                Resource::Streams { bucket, prefix: prefix.to_owned() }
            }
            _ => return Err(refuse(&format!("unknown resource {resource:?}"))),
        };
        Ok(Grant { resource, ops })
    }

    /// Whether the grant allows `op`.
    pub fn allows(&self, op: Access) -> bool {
        self.ops & op as u8 != 0
    }

    /// Whether every request `other` covers, this grant covers too: an issuer may hand
    /// out only what it holds.
    pub fn includes(&self, other: &Grant) -> bool {
        other.ops & !self.ops == 0
            && match (&self.resource, &other.resource) {
                (Resource::Fleet, _) => true,
                (Resource::Bucket(mine), Resource::Bucket(theirs))
                | (Resource::Bucket(mine), Resource::Streams { bucket: theirs, .. }) => {
                    mine == theirs
                }
                (
                    Resource::Streams { bucket: mine, prefix: my_prefix },
                    Resource::Streams { bucket: theirs, prefix },
                ) => mine == theirs && prefix.starts_with(my_prefix.as_str()),
                (Resource::Bucket(_) | Resource::Streams { .. }, Resource::Fleet)
                | (Resource::Streams { .. }, Resource::Bucket(_)) => false,
            }
    }

    /// Whether the grant allows `op` on `target`.
    pub fn covers(&self, op: Access, target: Target<'_>) -> bool {
        self.allows(op)
            && match (&self.resource, target) {
                (Resource::Fleet, _) => true,
                (Resource::Bucket(mine), Target::Bucket(bucket))
                | (Resource::Bucket(mine), Target::Stream(bucket, _))
                | (Resource::Bucket(mine), Target::Listing(bucket, _)) => mine == bucket,
                (Resource::Streams { bucket: mine, prefix }, Target::Stream(bucket, key))
                | (Resource::Streams { bucket: mine, prefix }, Target::Listing(bucket, key)) => {
                    mine == bucket && key.starts_with(prefix.as_str())
                }
                (Resource::Bucket(_) | Resource::Streams { .. }, Target::Fleet)
                | (Resource::Streams { .. }, Target::Bucket(_)) => false,
            }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.resource {
            Resource::Fleet => f.write_str("*:*")?,
            Resource::Bucket(bucket) => write!(f, "bucket:{}", bucket.as_str())?,
            Resource::Streams { bucket, prefix } => {
                write!(f, "stream:{}/{prefix}", bucket.as_str())?;
            }
        }
        let mut separator = ':';
        for op in Access::ALL.into_iter().filter(|op| self.allows(*op)) {
            write!(f, "{separator}{}", op.as_str())?;
            separator = ',';
        }
        Ok(())
    }
}

/// Parses a token's grants: at least one, at most [`GRANTS_PER_TOKEN_MAX`].
pub fn parse_grants<S: AsRef<str>>(texts: &[S]) -> Result<Vec<Grant>> {
    if texts.is_empty() || texts.len() > GRANTS_PER_TOKEN_MAX {
        return Err(Error::OptionOutOfRange {
            field: "grants",
            value: texts.len() as u64,
            min: 1,
            max: GRANTS_PER_TOKEN_MAX as u64,
        });
    }
    texts.iter().map(|text| Grant::parse(text.as_ref())).collect()
}

/// A token as the control plane keeps it: never the token itself, only its SHA-256.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// The public part of the token, which names it in lists and revocations.
    pub id: String,
    /// SHA-256 of the whole token.
    pub hash: [u8; 32],
    pub grants: Vec<Grant>,
    pub created_at_ms: u64,
    /// None: never expires.
    pub expires_at_ms: Option<u64>,
    pub description: String,
}

impl fmt::Debug for TokenRecord {
    /// Without the hash: Debug output ends up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let grants: Vec<String> = self.grants.iter().map(ToString::to_string).collect();
        f.debug_struct("TokenRecord")
            .field("id", &self.id)
            .field("grants", &grants)
            .field("created_at_ms", &self.created_at_ms)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bucket(name: &str) -> BucketName {
        BucketName::parse(name).expect("valid bucket name")
    }

    #[test]
    fn parses_each_resource_and_writes_it_back_the_same() {
        for text in [
            "*:*:read,write,admin",
            "*:*:read",
            "bucket:apps:read,write",
            "stream:apps/orders/:write",
            "stream:apps/:admin",
            "stream:apps/a:b:read",
        ] {
            let grant = Grant::parse(text).expect(text);
            assert_eq!(grant.to_string(), text);
        }
        assert_eq!(
            Grant::parse("stream:apps/a:b:read").expect("key prefix with a colon").resource,
            Resource::Streams { bucket: bucket("apps"), prefix: "a:b".into() }
        );
        // Operations are written in one order whatever order they came in.
        assert_eq!(
            Grant::parse("bucket:apps:admin,read").expect("ops").to_string(),
            "bucket:apps:read,admin"
        );
    }

    #[test]
    fn refuses_malformed_grants_naming_what_is_wrong() {
        for (text, says) in [
            ("bucket:apps", "unknown operation \"apps\""),
            ("apps", "no operations"),
            ("bucket:apps:", "unknown operation \"\""),
            ("bucket:apps:read,read", "read is given twice"),
            ("bucket:apps:delete", "unknown operation \"delete\""),
            ("bucket:Apps:read", "bucket: invalid bucket name"),
            ("stream:apps:read", "has no /"),
            ("topic:apps:read", "unknown resource \"topic:apps\""),
            ("*:read", "unknown resource \"*\""),
        ] {
            let error = Grant::parse(text).expect_err(text).to_string();
            assert!(error.contains(says), "{text}: {error}");
            assert!(error.starts_with("invalid grant"), "{error}");
        }
        let escape = Grant::parse("stream:apps/a\u{1b}[2J:read").expect_err("a control character");
        assert!(escape.to_string().contains("U+001B"), "{escape}");
        let long = format!("stream:apps/{}:read", "k".repeat(STREAM_KEY_BYTES_MAX + 1));
        assert!(Grant::parse(&long).expect_err("long prefix").to_string().contains("over the 512"));
    }

    #[test]
    fn a_token_has_one_to_the_limit_of_grants() {
        let none: [&str; 0] = [];
        assert!(parse_grants(&none).expect_err("none").to_string().contains("between 1 and 64"));
        let many = vec!["*:*:read"; GRANTS_PER_TOKEN_MAX + 1];
        assert!(parse_grants(&many).is_err());
        assert_eq!(parse_grants(&many[1..]).expect("at the limit").len(), GRANTS_PER_TOKEN_MAX);
    }

    #[test]
    fn covers_what_the_resource_reaches_with_the_ops_it_names() {
        let (apps, other) = (bucket("apps"), bucket("other"));
        let fleet = Grant::parse("*:*:read").expect("grant");
        assert!(fleet.covers(Access::Read, Target::Fleet));
        assert!(fleet.covers(Access::Read, Target::Stream(&other, "x")));
        assert!(!fleet.covers(Access::Write, Target::Stream(&other, "x")));

        let whole = Grant::parse("bucket:apps:write,admin").expect("grant");
        assert!(whole.covers(Access::Admin, Target::Bucket(&apps)));
        assert!(whole.covers(Access::Write, Target::Stream(&apps, "any")));
        assert!(!whole.covers(Access::Read, Target::Stream(&apps, "any")));
        assert!(!whole.covers(Access::Write, Target::Stream(&other, "any")));
        assert!(!whole.covers(Access::Admin, Target::Fleet));

        let some = Grant::parse("stream:apps/orders/:read").expect("grant");
        assert!(some.covers(Access::Read, Target::Stream(&apps, "orders/eu")));
        assert!(!some.covers(Access::Read, Target::Stream(&apps, "orders")));
        assert!(!some.covers(Access::Read, Target::Stream(&other, "orders/eu")));
        assert!(!some.covers(Access::Read, Target::Bucket(&apps)));
        assert!(some.covers(Access::Read, Target::Listing(&apps, "orders/eu")));
        assert!(!some.covers(Access::Read, Target::Listing(&apps, "")));

        let reader = Grant::parse("bucket:apps:read").expect("grant");
        assert!(reader.covers(Access::Read, Target::Listing(&apps, "")));
        assert!(!reader.covers(Access::Read, Target::Listing(&other, "")));
    }

    #[test]
    fn a_grant_includes_only_narrower_resources_with_fewer_operations() {
        let grant = |text: &str| Grant::parse(text).expect(text);
        let fleet = grant("*:*:read,admin");
        assert!(fleet.includes(&grant("*:*:read")));
        assert!(fleet.includes(&grant("bucket:apps:read,admin")));
        assert!(!fleet.includes(&grant("*:*:write")), "an operation it lacks");
        assert!(!fleet.includes(&grant("bucket:apps:read,write")));

        let bucket = grant("bucket:apps:read,write");
        assert!(bucket.includes(&grant("stream:apps/orders/:write")));
        assert!(bucket.includes(&grant("bucket:apps:read")));
        assert!(!bucket.includes(&grant("bucket:other:read")));
        assert!(!bucket.includes(&grant("*:*:read")));

        let streams = grant("stream:apps/orders/:read");
        assert!(streams.includes(&grant("stream:apps/orders/eu:read")));
        assert!(!streams.includes(&grant("stream:apps/order:read")), "a wider prefix");
        assert!(!streams.includes(&grant("bucket:apps:read")));
    }

    proptest! {
        #[test]
        fn every_grant_reads_back_from_what_it_writes(
            resource in prop_oneof![
                Just("*:*".to_owned()),
                "[a-z0-9]{3,10}".prop_map(|b| format!("bucket:{b}")),
                ("[a-z0-9]{3,10}", "[ -~]{0,20}").prop_map(|(b, p)| format!("stream:{b}/{p}")),
            ],
            ops in 1u8..8,
        ) {
            let words: Vec<&str> =
                Access::ALL.into_iter().filter(|op| ops & *op as u8 != 0).map(Access::as_str).collect();
            let text = format!("{resource}:{}", words.join(","));
            let grant = Grant::parse(&text).expect("a well-formed grant");
            prop_assert_eq!(grant.to_string(), text.clone());
            prop_assert_eq!(Grant::parse(&grant.to_string()).expect("again"), grant);
        }
    }
}
