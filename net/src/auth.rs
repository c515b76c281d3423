//! Bearer tokens (spec/auth.md, docs/auth.md): who is calling, and whether their grants
//! cover the request.
//!
//! - Auth is on when the server has a root token (`--root-token-file`). The root token
//!   holds every grant and is the only one that exists before any is issued.
//! - Issued tokens are `nova_<id>_<secret>`: 8 random bytes of public ID (what lists,
//!   revocations and refusals name) and 32 of secret, in hex. The node keeps only the
//!   SHA-256 of each token, in its metadata (the control plane's token rows) and in one
//!   table in memory that every shard reads.
//! - A request's token costs no metadata round trip, and on a kept-alive connection no
//!   lock either: each connection caches the caller its last `Authorization` header
//!   named ([`CallerCache`]), good until the table's generation moves (any issue or
//!   revoke). A miss hashes the token and looks it up; the hash comparisons are
//!   constant-time, and only the public ID picks the row.
//! - Grants are checked before a verb touches anything, so a refusal never says whether
//!   the resource exists.
//!
//! This module never decides what a grant covers (that is `engine::auth`) and writes
//! token rows only through the control plane.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use engine::auth::{
    Access, Grant, ROOT_TOKEN_BYTES_MAX, ROOT_TOKEN_BYTES_MIN, Target, TokenRecord,
};
use engine::control::ControlPlane;
use engine::meta::RedbMetaStore;
use hyper::HeaderMap;
use hyper::header;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::error::ApiError;

const TOKEN_PREFIX: &str = "nova_";
const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

type Table = BTreeMap<String, Arc<TokenRecord>>;

/// The node's tokens: the root token's hash and the issued tokens' table.
pub struct Auth {
    root: [u8; 32],
    /// By ID. `None` until the first shard has loaded it from metadata.
    tokens: RwLock<Option<Table>>,
    /// Moves with every change to `tokens`: what a connection's cached caller is checked
    /// against.
    generation: AtomicU64,
    /// Unexpired issued tokens kept at most (`--tokens-max`).
    tokens_max: usize,
    /// Places in the table held by issues in flight ([`Place`]): taken under the table's
    /// read lock, so issues racing on several shards cannot pass `tokens_max` together.
    issuing: AtomicUsize,
}

/// A place in the token table held for one issue while it writes its row: filled with
/// the token, or given back when dropped unfilled.
struct Place<'a> {
    auth: &'a Auth,
    filled: bool,
}

impl Place<'_> {
    /// Puts the issued token in the place: in the table, and no longer held.
    fn fill(mut self, record: Arc<TokenRecord>) {
        let mut table = self.auth.write_table();
        table
            .as_mut()
            .expect("a shard serves only once the table is loaded")
            .insert(record.id.clone(), record);
        self.auth.issuing.fetch_sub(1, Ordering::AcqRel);
        self.filled = true;
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if !self.filled {
            self.auth.issuing.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth").field("tokens_max", &self.tokens_max).finish_non_exhaustive()
    }
}

/// Who is calling.
#[derive(Clone, Debug)]
pub enum Caller {
    /// No token was asked for: auth is off (a loopback server without a root token), or
    /// the route needs none (`/health`). Every grant check passes.
    Anyone,
    Root,
    /// An issued token: the connection's own copy of its record.
    Token(Rc<TokenRecord>),
}

/// One connection's last caller: the `Authorization` header it came from and the token
/// table's generation it was checked at.
#[derive(Default)]
pub struct CallerCache(RefCell<Option<(Vec<u8>, u64, Caller)>>);

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unauthenticated(message: impl Into<String>) -> ApiError {
    ApiError::from_code(engine::Code::Unauthenticated, message)
}

fn expired(record: &TokenRecord, now_ms: u64) -> Option<ApiError> {
    let at = record.expires_at_ms.filter(|at| *at <= now_ms)?;
    Some(unauthenticated(format!(
        "token {} expired at {at} (unix ms); ask an admin for a new one",
        record.id
    )))
}

/// Whether `text` can travel as a token in an `Authorization` header: visible ASCII.
pub fn is_header_safe(text: &str) -> bool {
    text.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// Whether `id` is an issued token's ID: 16 lowercase hex digits.
fn is_token_id(id: &str) -> bool {
    id.len() == ID_BYTES * 2 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What a log line or an error message shows in place of a path segment left out.
pub const LEFT_OUT: &str = "<left out: may be a token>";

/// `path` as a log line or an error message may show it. Left out: a segment holding an
/// issued token ([`scrub_tokens`]), and the one in place of a token ID
/// (`/v1/tokens/{id}`, however many slashes the router skipped) unless it is an ID: a
/// whole token, or the root token, pasted in the wrong place must not reach the log.
/// Every request's path comes through here: one that could hold neither is borrowed.
pub fn shown_path(path: &str) -> Cow<'_, str> {
    if !path.contains("tokens") && !path.contains("nova") {
        return Cow::Borrowed(path);
    }
    let named: Vec<&str> = path.split('/').filter(|part| !part.is_empty()).collect();
    let id_place = match named.as_slice() {
        ["v1", "tokens", id, ..] => Some(*id),
        _ => None,
    };
    let secret = |part: &str| {
        (id_place == Some(part) && !is_token_id(part))
            || matches!(scrub_tokens(part), Cow::Owned(_))
    };
    let parts: Vec<&str> =
        path.split('/').map(|part| if secret(part) { LEFT_OUT } else { part }).collect();
    Cow::Owned(parts.join("/"))
}

/// `text` with every issued token in it, or what looks like the start of one, left out:
/// `nova_`, a token ID, `_`, and hex digits, with either underscore also as `%5F` (text
/// that echoes a request's path or query as it was sent). Error messages go through
/// this, so a token pasted where a name goes never comes back in an answer.
pub fn scrub_tokens(text: &str) -> Cow<'_, str> {
    // The length of a token's start at `at` (its prefix, ID, separator, and at least one
    // hex digit of secret, all of it), if one starts there.
    let token_at = |at: usize| -> Option<usize> {
        let bytes = text.as_bytes();
        let underscore = |i: usize| -> Option<usize> {
            match bytes.get(i..) {
                Some([b'_', ..]) => Some(i + 1),
                Some([b'%', b'5', b'f' | b'F', ..]) => Some(i + 3),
                _ => None,
            }
        };
        let hex_run = |i: usize| bytes[i..].iter().take_while(|b| b.is_ascii_hexdigit()).count();
        let id = underscore(at + 4)?;
        (hex_run(id) >= ID_BYTES * 2).then_some(())?;
        let secret = underscore(id + ID_BYTES * 2)?;
        let len = hex_run(secret);
        (len > 0).then_some(secret + len - at)
    };
    let starts: Vec<usize> =
        text.match_indices("nova").map(|(at, _)| at).filter(|&at| token_at(at).is_some()).collect();
    if starts.is_empty() {
        return Cow::Borrowed(text);
    }
    let (mut out, mut from) = (String::with_capacity(text.len()), 0);
    for at in starts {
        if at < from {
            continue;
        }
        out.push_str(&text[from..at]);
        out.push_str(LEFT_OUT);
        from = at + token_at(at).unwrap_or(0);
    }
    out.push_str(&text[from..]);
    Cow::Owned(out)
}

/// The public ID of an issued token's text; None for anything else (the root token).
fn issued_id(token: &str) -> Option<&str> {
    let (id, secret) = token.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    (is_token_id(id) && secret.len() == SECRET_BYTES * 2).then_some(id)
}

impl Auth {
    /// Auth with `root` as the root token, read from `flag`'s file (a trailing newline is
    /// not part of it), keeping at most `tokens_max` issued tokens.
    pub fn with_root_token(root: &str, flag: &str, tokens_max: usize) -> Result<Auth, String> {
        let root = root.trim_end_matches(['\n', '\r']);
        if root.contains(['\n', '\r']) {
            return Err(format!("--{flag}: the file must hold one line, the root token"));
        }
        if !(ROOT_TOKEN_BYTES_MIN..=ROOT_TOKEN_BYTES_MAX).contains(&root.len()) {
            return Err(format!(
                "--{flag}: the root token is {} bytes; it must be {ROOT_TOKEN_BYTES_MIN} to \
                 {ROOT_TOKEN_BYTES_MAX} (e.g. the 64 hex digits of `openssl rand -hex 32`)",
                root.len()
            ));
        }
        if !is_header_safe(root) {
            return Err(format!(
                "--{flag}: the root token must be visible ASCII (no spaces, control characters \
                 or other letters): it travels in an Authorization header"
            ));
        }
        Ok(Auth {
            root: sha256(root.as_bytes()),
            tokens: RwLock::new(None),
            generation: AtomicU64::new(0),
            tokens_max,
            issuing: AtomicUsize::new(0),
        })
    }

    fn read_table(&self) -> RwLockReadGuard<'_, Option<Table>> {
        self.tokens.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The table, to change it: the generation moves, so every cached caller is checked
    /// again.
    fn write_table(&self) -> RwLockWriteGuard<'_, Option<Table>> {
        let table = self.tokens.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.generation.fetch_add(1, Ordering::AcqRel);
        table
    }

    /// Loads the issued tokens from metadata. Every shard calls this before it serves,
    /// and the first table loaded is the one kept: no token can be issued or revoked
    /// before some shard serves, so every load sees the same tokens.
    pub async fn load(&self, control: &ControlPlane<RedbMetaStore>) -> engine::Result<()> {
        if self.read_table().is_some() {
            return Ok(());
        }
        let mut table = Table::new();
        let mut after: Option<String> = None;
        loop {
            let (page, more) = control.tokens_page(after.as_deref()).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.clone());
            table.extend(page.into_iter().map(|token| (token.id.clone(), Arc::new(token))));
            if !more {
                break;
            }
        }
        self.write_table().get_or_insert(table);
        Ok(())
    }

    /// The caller a request's `Authorization: Bearer <token>` header names, from the
    /// connection's cache when the header and the table are as they were.
    pub fn authenticate(
        &self,
        cache: &CallerCache,
        headers: &HeaderMap,
        now_ms: u64,
    ) -> Result<Caller, ApiError> {
        let mut sent = headers.get_all(header::AUTHORIZATION).iter();
        let value = sent.next().ok_or_else(|| {
            unauthenticated(
                "this server needs a token: send the header Authorization: Bearer <token>",
            )
        })?;
        // Two would let a proxy or an audit log read another token than the one checked.
        if sent.next().is_some() {
            return Err(unauthenticated("send one Authorization header, not several"));
        }
        let generation = self.generation.load(Ordering::Acquire);
        if let Some((sent, at, caller)) = &*cache.0.borrow()
            && *at == generation
            && sent.as_slice() == value.as_bytes()
        {
            if let Caller::Token(record) = caller
                && let Some(error) = expired(record, now_ms)
            {
                return Err(error);
            }
            return Ok(caller.clone());
        }
        let token = value
            .to_str()
            .ok()
            .and_then(|value| {
                let (scheme, token) = value.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or_else(|| {
                unauthenticated("header Authorization must be Bearer <token>, one token in text")
            })?;
        let caller = self.caller_of(token, now_ms)?;
        *cache.0.borrow_mut() = Some((value.as_bytes().to_vec(), generation, caller.clone()));
        Ok(caller)
    }

    fn caller_of(&self, token: &str, now_ms: u64) -> Result<Caller, ApiError> {
        let hash = sha256(token.as_bytes());
        if bool::from(hash.ct_eq(&self.root)) {
            return Ok(Caller::Root);
        }
        let found = issued_id(token)
            .and_then(|id| self.read_table().as_ref().and_then(|table| table.get(id)).cloned());
        match found {
            Some(record) if bool::from(hash.ct_eq(&record.hash)) => {
                match expired(&record, now_ms) {
                    Some(error) => Err(error),
                    None => Ok(Caller::Token(Rc::new(TokenRecord::clone(&record)))),
                }
            }
            _ => Err(unauthenticated("the token is not one this server knows (or it was revoked)")),
        }
    }

    /// Whether `caller`, authenticated earlier, still holds: its token neither revoked
    /// nor expired since (a subscription asks after each page).
    pub fn still_valid(&self, caller: &Caller, now_ms: u64) -> Result<(), ApiError> {
        let Caller::Token(record) = caller else {
            return Ok(());
        };
        let held = self
            .read_table()
            .as_ref()
            .and_then(|table| table.get(&record.id))
            .is_some_and(|held| held.hash == record.hash);
        if !held {
            return Err(unauthenticated(format!("token {} was revoked", record.id)));
        }
        expired(record, now_ms).map_or(Ok(()), Err)
    }

    /// Issues a token for `issuer`: stores its hash and grants, and returns the record and
    /// the token, which exists nowhere else from now on. An issued token never holds
    /// more than its issuer: grants it includes, an expiry no later than its own.
    pub async fn issue(
        &self,
        control: &ControlPlane<RedbMetaStore>,
        issuer: &Caller,
        grants: Vec<Grant>,
        now_ms: u64,
        expires_at_ms: Option<u64>,
        description: String,
    ) -> Result<(Arc<TokenRecord>, String), ApiError> {
        if let Caller::Token(issuer) = issuer {
            within(issuer, &grants, expires_at_ms)?;
        }
        let place = self.make_room(control, now_ms).await?;
        // An ID already taken is drawn again: at 64 random bits, in practice never.
        for _ in 0..engine::control::ATTEMPTS_MAX {
            let mut random = [0u8; ID_BYTES + SECRET_BYTES];
            getrandom::fill(&mut random)
                .map_err(|error| ApiError::internal(format!("os randomness: {error}")))?;
            let id = hex(&random[..ID_BYTES]);
            let token = format!("{TOKEN_PREFIX}{id}_{}", hex(&random[ID_BYTES..]));
            let record = TokenRecord {
                id,
                hash: sha256(token.as_bytes()),
                grants: grants.clone(),
                created_at_ms: now_ms,
                expires_at_ms,
                description: description.clone(),
            };
            match control.put_token(&record).await {
                Ok(()) => {
                    let record = Arc::new(record);
                    place.fill(Arc::clone(&record));
                    return Ok((record, token));
                }
                Err(engine::Error::Contended { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(ApiError::internal("could not draw an unused token ID"))
    }

    /// A place for one more token, or a refusal past `--tokens-max` unexpired tokens
    /// (counting the places of issues in flight), after purging the expired ones when
    /// there is none.
    async fn make_room(
        &self,
        control: &ControlPlane<RedbMetaStore>,
        now_ms: u64,
    ) -> Result<Place<'_>, ApiError> {
        if let Some(place) = self.take_place() {
            return Ok(place);
        }
        let expired_ids: Vec<String> = self.read_table().as_ref().map_or_else(Vec::new, |table| {
            table.values().filter(|t| expired(t, now_ms).is_some()).map(|t| t.id.clone()).collect()
        });
        for id in &expired_ids {
            self.revoke(control, id).await?;
        }
        self.take_place().ok_or_else(|| {
            ApiError::from_code(
                engine::Code::FailedPrecondition,
                format!(
                    "this node keeps at most {} unexpired tokens (--tokens-max); revoke some first",
                    self.tokens_max
                ),
            )
        })
    }

    /// A place if the table and the issues in flight leave one.
    fn take_place(&self) -> Option<Place<'_>> {
        // Held while the place is taken: an insert (under the write lock) cannot slip
        // between the count and the reservation.
        let table = self.read_table();
        let kept = table.as_ref().map_or(0, Table::len);
        self.issuing
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |issuing| {
                (kept + issuing < self.tokens_max).then_some(issuing + 1)
            })
            .ok()?;
        Some(Place { auth: self, filled: false })
    }

    /// Revokes a token: from metadata, then from every shard's view at once.
    pub async fn revoke(
        &self,
        control: &ControlPlane<RedbMetaStore>,
        id: &str,
    ) -> Result<(), ApiError> {
        let unknown =
            || ApiError::from_code(engine::Code::NotFound, format!("no token has ID {id:?}"));
        if !is_token_id(id) {
            // Not echoed: it may be a whole token, secret and all.
            return Err(ApiError::from_code(
                engine::Code::NotFound,
                "no token has that ID: an ID is the 16 hex digits after nova_ in a token",
            ));
        }
        let known = control.delete_token(id).await?;
        let held = self.write_table().as_mut().and_then(|table| table.remove(id)).is_some();
        if known || held { Ok(()) } else { Err(unknown()) }
    }

    /// Up to `limit` issued tokens after the ID `after`, in ID order, and the last ID when
    /// more follow.
    pub fn list(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<Arc<TokenRecord>>, Option<String>) {
        let table = self.read_table();
        let Some(table) = table.as_ref() else {
            return (Vec::new(), None);
        };
        let mut tokens = table
            .range::<str, _>((
                after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
                std::ops::Bound::Unbounded,
            ))
            .map(|(_, token)| Arc::clone(token));
        let page: Vec<Arc<TokenRecord>> = tokens.by_ref().take(limit).collect();
        let next = match tokens.next() {
            Some(_) => page.last().map(|token| token.id.clone()),
            None => None,
        };
        (page, next)
    }
}

/// Refuses grants or an expiry beyond what `issuer` holds.
fn within(
    issuer: &TokenRecord,
    grants: &[Grant],
    expires_at_ms: Option<u64>,
) -> Result<(), ApiError> {
    let refuse = |message: String| ApiError::from_code(engine::Code::PermissionDenied, message);
    if let Some(wider) = grants.iter().find(|g| !issuer.grants.iter().any(|mine| mine.includes(g)))
    {
        return Err(refuse(format!(
            "token {} cannot issue the grant {wider}: a token hands out only what its own \
             grants include",
            issuer.id
        )));
    }
    match (issuer.expires_at_ms, expires_at_ms) {
        (Some(own), None) => Err(refuse(format!(
            "token {} expires at {own} (unix ms), so it issues only tokens that expire by \
             then: give expires_in_seconds",
            issuer.id
        ))),
        (Some(own), Some(asked)) if asked > own => Err(refuse(format!(
            "token {} expires at {own} (unix ms), so it issues only tokens that expire by \
             then, not at {asked}",
            issuer.id
        ))),
        _ => Ok(()),
    }
}

impl Caller {
    /// Ok when the caller may do `access` on `target`; permission_denied otherwise,
    /// naming the token and its grants (never whether the target exists).
    pub fn may(&self, access: Access, target: Target<'_>) -> Result<(), ApiError> {
        let token = match self {
            Caller::Anyone | Caller::Root => return Ok(()),
            Caller::Token(token) => token,
        };
        if token.grants.iter().any(|grant| grant.covers(access, target)) {
            return Ok(());
        }
        let what = match target {
            Target::Fleet => "the whole fleet (a *:* grant)".to_owned(),
            Target::Bucket(bucket) => format!("bucket {}", bucket.as_str()),
            Target::Stream(bucket, key) => format!("stream {}/{key}", bucket.as_str()),
            Target::Listing(bucket, prefix) => {
                format!("the streams of bucket {} with prefix {prefix:?}", bucket.as_str())
            }
        };
        let grants: Vec<String> = token.grants.iter().map(ToString::to_string).collect();
        Err(ApiError::from_code(
            engine::Code::PermissionDenied,
            format!(
                "token {} has no {} grant on {what}; its grants are {}",
                token.id,
                access.as_str(),
                grants.join(" ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_their_starts_are_scrubbed_from_text() {
        let token = format!("nova_{}_{}", "0123456789abcdef", "f".repeat(64));
        let encoded = token.replace('_', "%5F");
        for text in [
            format!("token ID \"{token}%zz\" is not percent-encoded"),
            format!("no stream {encoded} here"),
            // Cut short (a name's length limit): what is there of the secret goes too.
            format!("bucket {}", &token[..64]),
            format!("{token}{token}"),
        ] {
            let scrubbed = scrub_tokens(&text);
            assert!(!scrubbed.contains("ffff") && scrubbed.contains(LEFT_OUT), "{scrubbed}");
        }
        // No secret after the ID, or no ID: nothing to leave out.
        for text in ["nova_0123456789abcdef_", "nova_0123_ffff", "nova serve", "nova_"] {
            assert_eq!(scrub_tokens(text), text);
        }
        assert_eq!(
            shown_path(&format!("/v1/streams/b/{encoded}")),
            format!("/v1/streams/b/{LEFT_OUT}")
        );
    }
    use hyper::header::HeaderValue;

    fn headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(authorization).unwrap());
        headers
    }

    fn authenticate(auth: &Auth, authorization: &str, now_ms: u64) -> Result<Caller, ApiError> {
        auth.authenticate(&CallerCache::default(), &headers(authorization), now_ms)
    }

    #[test]
    fn the_root_token_is_checked_by_its_hash_and_must_be_usable_in_a_header() {
        let auth = Auth::with_root_token("0123456789abcdef\n", "root-token-file", 10).unwrap();
        assert!(matches!(authenticate(&auth, "Bearer 0123456789abcdef", 0), Ok(Caller::Root)));
        assert!(matches!(authenticate(&auth, "bearer 0123456789abcdef", 0), Ok(Caller::Root)));
        for wrong in ["Bearer 0123456789abcdeF", "Basic 0123456789abcdef"] {
            assert_eq!(authenticate(&auth, wrong, 0).unwrap_err().code, "unauthenticated");
        }
        let none = auth.authenticate(&CallerCache::default(), &HeaderMap::new(), 0);
        assert_eq!(none.unwrap_err().code, "unauthenticated");
        let short = Auth::with_root_token("short", "root-token-file", 10).unwrap_err();
        assert!(short.contains("--root-token-file: the root token is 5 bytes"), "{short}");
        for unusable in ["0123456789 abcdef", "0123456789abcdéf"] {
            let refused = Auth::with_root_token(unusable, "root-token-file", 10).unwrap_err();
            assert!(refused.contains("must be visible ASCII"), "{refused}");
        }
    }

    fn table_with(auth: &Auth, token: &str, expires_at_ms: Option<u64>) -> String {
        let id = issued_id(token).expect("an issued token").to_owned();
        let record = TokenRecord {
            id: id.clone(),
            hash: sha256(token.as_bytes()),
            grants: engine::auth::parse_grants(&["bucket:apps:read"]).unwrap(),
            created_at_ms: 0,
            expires_at_ms,
            description: String::new(),
        };
        auth.write_table().get_or_insert_default().insert(id.clone(), Arc::new(record));
        id
    }

    #[test]
    fn issues_in_flight_hold_their_places_so_racing_ones_cannot_pass_the_limit() {
        let auth = Auth::with_root_token("0123456789abcdef", "f", 2).unwrap();
        *auth.write_table() = Some(Table::new());
        let (first, second) = (auth.take_place(), auth.take_place());
        assert!(first.is_some() && second.is_some(), "room for two");
        assert!(auth.take_place().is_none(), "two issues in flight fill a table of two");
        drop(second); // its row was not written
        let third = auth.take_place().expect("a place given back is free again");
        let token = format!("nova_{}_{}", "ab".repeat(8), "cd".repeat(32));
        let id = issued_id(&token).expect("an issued token").to_owned();
        let record = TokenRecord {
            id: id.clone(),
            hash: sha256(token.as_bytes()),
            grants: Vec::new(),
            created_at_ms: 0,
            expires_at_ms: None,
            description: String::new(),
        };
        first.expect("taken").fill(Arc::new(record));
        assert!(auth.read_table().as_ref().is_some_and(|t| t.contains_key(&id)));
        assert!(auth.take_place().is_none(), "one kept and one in flight");
        drop(third);
        assert!(auth.take_place().is_some(), "one kept, one free");
    }

    #[test]
    fn an_issued_token_is_found_by_its_id_and_matched_by_its_hash() {
        let auth = Auth::with_root_token("0123456789abcdef", "f", 10).unwrap();
        let token = format!("nova_{}_{}", "ab".repeat(8), "cd".repeat(32));
        table_with(&auth, &token, Some(1000));
        let caller = authenticate(&auth, &format!("Bearer {token}"), 999).unwrap();
        let apps = engine::names::BucketName::parse("apps").unwrap();
        assert!(caller.may(Access::Read, Target::Stream(&apps, "k")).is_ok());
        let denied = caller.may(Access::Write, Target::Stream(&apps, "k")).unwrap_err();
        assert_eq!(denied.code, "permission_denied");
        assert!(denied.message.contains("no write grant on stream apps/k"), "{}", denied.message);
        let expired = authenticate(&auth, &format!("Bearer {token}"), 1000).unwrap_err();
        assert!(expired.message.contains("expired at 1000"), "{}", expired.message);
        // The right ID with a wrong secret is unknown, exactly like an unknown ID.
        let forged = format!("nova_{}_{}", "ab".repeat(8), "ce".repeat(32));
        let unknown = format!("nova_{}_{}", "ac".repeat(8), "cd".repeat(32));
        let (a, b) = (
            authenticate(&auth, &format!("Bearer {forged}"), 0).unwrap_err(),
            authenticate(&auth, &format!("Bearer {unknown}"), 0).unwrap_err(),
        );
        assert_eq!((a.code, &a.message), (b.code, &b.message));
    }

    #[test]
    fn a_connection_keeps_its_caller_until_the_table_changes_or_the_token_expires() {
        let auth = Auth::with_root_token("0123456789abcdef", "f", 10).unwrap();
        let token = format!("nova_{}_{}", "ab".repeat(8), "cd".repeat(32));
        let id = table_with(&auth, &token, Some(1000));
        let (cache, sent) = (CallerCache::default(), headers(&format!("Bearer {token}")));
        assert!(matches!(auth.authenticate(&cache, &sent, 0), Ok(Caller::Token(_))));
        assert!(cache.0.borrow().is_some(), "cached");
        // Cached, it still expires.
        let expired = auth.authenticate(&cache, &sent, 1000).unwrap_err();
        assert!(expired.message.contains("expired"), "{}", expired.message);
        // A revocation moves the generation, so the cached caller is not used.
        auth.write_table().as_mut().unwrap().remove(&id);
        assert_eq!(auth.authenticate(&cache, &sent, 0).unwrap_err().code, "unauthenticated");
        // Another header on the same connection is another caller.
        let root = headers("Bearer 0123456789abcdef");
        assert!(matches!(auth.authenticate(&cache, &root, 0), Ok(Caller::Root)));
    }

    #[test]
    fn a_token_issues_only_grants_it_includes_and_an_expiry_within_its_own() {
        let mut issuer = TokenRecord {
            id: "ab".repeat(8),
            hash: [0; 32],
            grants: engine::auth::parse_grants(&["*:*:read,admin"]).unwrap(),
            created_at_ms: 0,
            expires_at_ms: None,
            description: String::new(),
        };
        let grants = |texts: &[&str]| engine::auth::parse_grants(texts).unwrap();
        assert!(within(&issuer, &grants(&["bucket:apps:read"]), None).is_ok());
        let wider = within(&issuer, &grants(&["bucket:apps:read", "*:*:write"]), None);
        assert!(wider.unwrap_err().message.contains("cannot issue the grant *:*:write"));
        issuer.expires_at_ms = Some(5000);
        assert!(within(&issuer, &grants(&["*:*:read"]), Some(5000)).is_ok());
        assert!(within(&issuer, &grants(&["*:*:read"]), Some(5001)).is_err());
        let forever = within(&issuer, &grants(&["*:*:read"]), None).unwrap_err();
        assert!(forever.message.contains("give expires_in_seconds"), "{}", forever.message);
    }
}
