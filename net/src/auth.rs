//! Bearer tokens (spec/auth.md, docs/auth.md): who is calling, and whether their grants
//! cover the request.
//!
//! - Auth is on when the server has a root token (`--root-token-file`). The root token
//!   holds every grant and is the only one that exists before any is issued.
//! - Issued tokens are `nova_<id>_<secret>`: 8 random bytes of public ID (what lists and
//!   revocations name) and 32 of secret, in hex. The node keeps only the SHA-256 of each
//!   token, in its metadata (the control plane's token rows) and in memory.
//! - A request's token is checked against the in-memory table every shard shares: no
//!   metadata round trip on the hot path, and a revocation counts on every shard at once.
//!   The hash comparisons are constant-time; only the public ID picks the row.
//! - Grants are checked before a verb touches anything, so a refusal never says whether
//!   the resource exists.
//!
//! This module never decides what a grant covers (that is `engine::auth`) and never
//! writes a token row itself other than through the control plane.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use engine::auth::{Grant, Op, Target, TokenRecord};
use engine::control::ControlPlane;
use engine::meta::RedbMetaStore;
use hyper::HeaderMap;
use hyper::header;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::error::ApiError;

/// Tokens a node keeps, the root token aside: issuing more is refused until some are
/// revoked. Every shard holds the whole table in memory.
pub const TOKENS_MAX: usize = 10_000;
/// Bytes of a root token, inclusive: long enough to be unguessable.
pub const ROOT_TOKEN_BYTES_MIN: usize = 16;
/// Bytes of a root token, inclusive.
pub const ROOT_TOKEN_BYTES_MAX: usize = 4096;

const TOKEN_PREFIX: &str = "nova_";
const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// The node's tokens: the root token's hash and the issued tokens' table.
pub struct Auth {
    root: [u8; 32],
    /// By ID. `None` until the first shard has loaded it from metadata.
    tokens: RwLock<Option<HashMap<String, Arc<TokenRecord>>>>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Auth { .. }")
    }
}

/// Who is calling.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Auth is off (a loopback server without a root token): every request is allowed.
    Anyone,
    Root,
    Token(Arc<TokenRecord>),
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unauthenticated(message: impl Into<String>) -> ApiError {
    ApiError::from_code(engine::Code::Unauthenticated, message)
}

impl Auth {
    /// Auth with `root` as the root token, read from `flag`'s file (a trailing newline is
    /// not part of it).
    pub fn with_root_token(root: &str, flag: &str) -> Result<Auth, String> {
        let root = root.trim_end_matches(['\n', '\r']);
        if !(ROOT_TOKEN_BYTES_MIN..=ROOT_TOKEN_BYTES_MAX).contains(&root.len()) {
            return Err(format!(
                "--{flag}: the root token is {} bytes; it must be {ROOT_TOKEN_BYTES_MIN} to \
                 {ROOT_TOKEN_BYTES_MAX} (e.g. the 64 hex digits of `openssl rand -hex 32`)",
                root.len()
            ));
        }
        if root.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "--{flag}: the root token must not contain spaces or control characters: it \
                 travels in an Authorization header"
            ));
        }
        Ok(Auth { root: sha256(root.as_bytes()), tokens: RwLock::new(None) })
    }

    /// Loads the issued tokens from metadata, once: every shard calls this before it
    /// serves, and the first table loaded is the one kept (no token can be issued or
    /// revoked before some shard serves, so every load sees the same tokens).
    pub async fn load(&self, control: &ControlPlane<RedbMetaStore>) -> engine::Result<()> {
        if self.read_table(|table| table.is_some()) {
            return Ok(());
        }
        let mut table = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let (page, more) = control.tokens_page(after.as_deref()).await?;
            after = page.last().map(|token| token.id.clone());
            table.extend(page.into_iter().map(|token| (token.id.clone(), Arc::new(token))));
            if !more {
                break;
            }
        }
        let mut tokens = self.tokens.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        tokens.get_or_insert(table);
        Ok(())
    }

    fn read_table<T>(
        &self,
        read: impl FnOnce(&Option<HashMap<String, Arc<TokenRecord>>>) -> T,
    ) -> T {
        read(&self.tokens.read().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// The caller a request's `Authorization: Bearer <token>` header names.
    pub fn authenticate(&self, headers: &HeaderMap, now_ms: u64) -> Result<Caller, ApiError> {
        let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
            unauthenticated(
                "this server needs a token: send the header Authorization: Bearer <token>",
            )
        })?;
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
        let hash = sha256(token.as_bytes());
        if bool::from(hash.ct_eq(&self.root)) {
            return Ok(Caller::Root);
        }
        let found = issued_id(token).and_then(|id| {
            self.read_table(|table| table.as_ref().and_then(|t| t.get(id)).cloned())
        });
        match found {
            Some(record) if bool::from(hash.ct_eq(&record.hash)) => {
                let caller = Caller::Token(record);
                self.still_valid(&caller, now_ms)?;
                Ok(caller)
            }
            _ => Err(unauthenticated("the token is not one this server knows (or it was revoked)")),
        }
    }

    /// Whether `caller`, authenticated earlier, still holds: its token neither revoked
    /// nor expired since (a subscription asks before each page).
    pub fn still_valid(&self, caller: &Caller, now_ms: u64) -> Result<(), ApiError> {
        let Caller::Token(record) = caller else {
            return Ok(());
        };
        let held = self.read_table(|table| {
            table.as_ref().and_then(|t| t.get(&record.id)).is_some_and(|r| Arc::ptr_eq(r, record))
        });
        if !held {
            return Err(unauthenticated(format!("token {} was revoked", record.id)));
        }
        match record.expires_at_ms {
            Some(at) if at <= now_ms => Err(unauthenticated(format!(
                "token {} expired at {at} (unix ms); ask an admin for a new one",
                record.id
            ))),
            _ => Ok(()),
        }
    }

    /// Issues a token: stores its hash and grants, and returns the record and the token,
    /// which exists nowhere else from now on.
    pub async fn issue(
        &self,
        control: &ControlPlane<RedbMetaStore>,
        grants: Vec<Grant>,
        created_at_ms: u64,
        expires_at_ms: Option<u64>,
        description: String,
    ) -> Result<(Arc<TokenRecord>, String), ApiError> {
        let count = self.read_table(|table| table.as_ref().map_or(0, HashMap::len));
        if count >= TOKENS_MAX {
            return Err(ApiError::from_code(
                engine::Code::ResourceExhausted,
                format!("this node keeps at most {TOKENS_MAX} tokens; revoke some first"),
            ));
        }
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
                created_at_ms,
                expires_at_ms,
                description: description.clone(),
            };
            match control.put_token(&record).await {
                Ok(()) => {
                    let record = Arc::new(record);
                    self.tokens
                        .write()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .get_or_insert_default()
                        .insert(record.id.clone(), Arc::clone(&record));
                    return Ok((record, token));
                }
                Err(engine::Error::Contended { .. }) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(ApiError::internal("could not draw an unused token ID"))
    }

    /// Revokes a token: from metadata, then from every shard's view at once.
    pub async fn revoke(
        &self,
        control: &ControlPlane<RedbMetaStore>,
        id: &str,
    ) -> Result<(), ApiError> {
        let known = control.delete_token(id).await?;
        let held = self
            .tokens
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_mut()
            .and_then(|table| table.remove(id))
            .is_some();
        if known || held {
            Ok(())
        } else {
            Err(ApiError::from_code(engine::Code::NotFound, format!("no token has ID {id:?}")))
        }
    }

    /// Every issued token, in ID order.
    pub fn list(&self) -> Vec<Arc<TokenRecord>> {
        let mut tokens: Vec<Arc<TokenRecord>> =
            self.read_table(|table| table.iter().flat_map(|t| t.values().cloned()).collect());
        tokens.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        tokens
    }
}

/// The public ID of an issued token's text; None for anything else (the root token).
fn issued_id(token: &str) -> Option<&str> {
    let (id, secret) = token.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    (id.len() == ID_BYTES * 2 && secret.len() == SECRET_BYTES * 2).then_some(id)
}

impl Caller {
    /// Ok when the caller may do `op` on `target`; permission_denied otherwise, naming
    /// the token and its grants (never whether the target exists).
    pub fn may(&self, op: Op, target: Target<'_>) -> Result<(), ApiError> {
        let token = match self {
            Caller::Anyone | Caller::Root => return Ok(()),
            Caller::Token(token) => token,
        };
        if token.grants.iter().any(|grant| grant.covers(op, target)) {
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
                op.as_str(),
                grants.join(" ")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(authorization).unwrap());
        headers
    }

    fn code(result: Result<Caller, ApiError>) -> &'static str {
        result.expect_err("refused").code
    }

    #[test]
    fn the_root_token_is_checked_by_its_hash_and_must_be_long_enough() {
        let auth = Auth::with_root_token("0123456789abcdef\n", "root-token-file").unwrap();
        assert!(matches!(
            auth.authenticate(&headers("Bearer 0123456789abcdef"), 0),
            Ok(Caller::Root)
        ));
        assert!(matches!(
            auth.authenticate(&headers("bearer 0123456789abcdef"), 0),
            Ok(Caller::Root)
        ));
        assert_eq!(
            code(auth.authenticate(&headers("Bearer 0123456789abcdeF"), 0)),
            "unauthenticated"
        );
        assert_eq!(
            code(auth.authenticate(&headers("Basic 0123456789abcdef"), 0)),
            "unauthenticated"
        );
        assert_eq!(code(auth.authenticate(&HeaderMap::new(), 0)), "unauthenticated");
        let short = Auth::with_root_token("short", "root-token-file").unwrap_err();
        assert!(short.contains("--root-token-file: the root token is 5 bytes"), "{short}");
        let spaced = Auth::with_root_token("0123456789 abcdef", "root-token-file").unwrap_err();
        assert!(spaced.contains("must not contain spaces"), "{spaced}");
    }

    #[test]
    fn an_issued_token_is_found_by_its_id_and_matched_by_its_hash() {
        let auth = Auth::with_root_token("0123456789abcdef", "f").unwrap();
        let token = format!("nova_{}_{}", "ab".repeat(8), "cd".repeat(32));
        let record = TokenRecord {
            id: "ab".repeat(8),
            hash: sha256(token.as_bytes()),
            grants: engine::auth::parse_grants(&["bucket:apps:read"]).unwrap(),
            created_at_ms: 0,
            expires_at_ms: Some(1000),
            description: String::new(),
        };
        *auth.tokens.write().unwrap() =
            Some(HashMap::from([(record.id.clone(), Arc::new(record))]));
        let caller = auth.authenticate(&headers(&format!("Bearer {token}")), 999).unwrap();
        let apps = engine::names::BucketName::parse("apps").unwrap();
        assert!(caller.may(Op::Read, Target::Stream(&apps, "k")).is_ok());
        let denied = caller.may(Op::Write, Target::Stream(&apps, "k")).unwrap_err();
        assert_eq!(denied.code, "permission_denied");
        assert!(denied.message.contains("no write grant on stream apps/k"), "{}", denied.message);
        let expired = auth.authenticate(&headers(&format!("Bearer {token}")), 1000).unwrap_err();
        assert!(expired.message.contains("expired at 1000"), "{}", expired.message);
        // The right ID with a wrong secret is unknown, exactly like an unknown ID.
        let forged = format!("nova_{}_{}", "ab".repeat(8), "ce".repeat(32));
        let unknown = format!("nova_{}_{}", "ac".repeat(8), "cd".repeat(32));
        let (a, b) = (
            auth.authenticate(&headers(&format!("Bearer {forged}")), 0).unwrap_err(),
            auth.authenticate(&headers(&format!("Bearer {unknown}")), 0).unwrap_err(),
        );
        assert_eq!((a.code, &a.message), (b.code, &b.message));
    }
}
