//! Keys and the two strict token formats (join tokens and capability tokens).
//!
//! Both are `<prefix>.<b64url(claims JSON)>.<b64url(Ed25519 signature)>`, the signature covering
//! the exact ASCII bytes `<prefix>.<b64url(claims JSON)>`. There is no header and no algorithm
//! field: the prefix fixes the purpose and the algorithm (`hlj1` join token signed by the app
//! backend key, `hlc1` capability token signed by the server key). Claims are decoded with
//! `deny_unknown_fields`; `kid` selects the verifying key.

use std::collections::HashMap;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use hostlease::protocol::{
    codec::signing_bytes, Action, Assignment, Epoch, KeyId, ParticipantId, PublicKey, Role, RoomId,
    SessionId, SignedAssignment, MAX_TOKEN_LEN,
};
use serde::{Deserialize, Serialize};

pub const JOIN_PREFIX: &str = "hlj1";
pub const CAP_PREFIX: &str = "hlc1";

/// Why a token was refused. Fixed messages: the token itself never appears in an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    Malformed,
    UnknownKey,
    BadSignature,
    Expired,
}

/// An Ed25519 key pair with its key id.
#[derive(Clone)]
pub struct Keypair {
    pub kid: KeyId,
    key: SigningKey,
}

#[derive(Serialize, Deserialize)]
struct KeyFile {
    kid: String,
    secret: String,
}

impl Keypair {
    pub fn generate(kid: &str) -> Self {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).expect("operating system random source");
        Self {
            kid: KeyId::new(kid).expect("valid kid"),
            key: SigningKey::from_bytes(&secret),
        }
    }

    /// A fresh key with a random kid after `prefix` (refused if that makes no valid kid: a
    /// prefix with a space, or too long).
    pub fn generate_random_kid(prefix: &str) -> Result<Self, String> {
        let mut b = [0u8; 6];
        getrandom::fill(&mut b).expect("operating system random source");
        let kid = format!("{prefix}-{}", URL_SAFE_NO_PAD.encode(b));
        KeyId::new(kid.as_str()).map_err(|e| format!("key id prefix {prefix:?}: {e}"))?;
        Ok(Self::generate(&kid))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&KeyFile {
            kid: self.kid.to_string(),
            secret: URL_SAFE_NO_PAD.encode(self.key.to_bytes()),
        })
        .expect("key file serialises")
    }

    pub fn from_json(text: &str) -> Result<Self, String> {
        let f: KeyFile =
            serde_json::from_str(text).map_err(|_| "malformed key file".to_string())?;
        let bytes = URL_SAFE_NO_PAD
            .decode(f.secret.as_bytes())
            .map_err(|_| "malformed key secret".to_string())?;
        let secret: [u8; 32] = bytes
            .try_into()
            .map_err(|_| "key secret must be 32 bytes".to_string())?;
        Ok(Self {
            kid: KeyId::new(f.kid).map_err(|_| "bad kid".to_string())?,
            key: SigningKey::from_bytes(&secret),
        })
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::from_json(&text)
    }

    /// Loads `path`, or creates it with a new key.
    pub fn load_or_create(path: &Path, prefix: &str) -> Result<Self, String> {
        if path.exists() {
            return Self::load(path);
        }
        let k = Self::generate_random_kid(prefix)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        // Readable by its owner only (the key signs host tokens), written whole to a file of
        // its own, then linked into place: a process starting at the same time finds either no
        // file or a complete one, and then uses that key.
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let fail = |e: std::io::Error| format!("{}: {e}", path.display());
        let tmp = path.with_file_name(format!(".{}.tmp", k.kid)); // the kid is random
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(k.to_json().as_bytes())
                    .and_then(|()| f.sync_all())
            })
            .map_err(fail)?;
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(k),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Self::load(path),
            Err(e) => Err(fail(e)),
        }
    }

    pub fn public(&self) -> PublicKey {
        PublicKey {
            kid: self.kid.clone(),
            alg: "Ed25519".into(),
            x: URL_SAFE_NO_PAD.encode(self.key.verifying_key().to_bytes()),
        }
    }

    pub fn sign_b64(&self, msg: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(self.key.sign(msg).to_bytes())
    }

    /// Signs an assignment over [`signing_bytes`].
    pub fn sign_assignment(&self, a: Assignment) -> SignedAssignment {
        let sig = self.sign_b64(&signing_bytes(&a));
        SignedAssignment {
            assignment: a,
            kid: Some(self.kid.clone()),
            sig: Some(sig),
        }
    }

    /// Signs claims into a token with `prefix`.
    pub fn sign_token<C: Serialize>(&self, prefix: &str, claims: &C) -> String {
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("claims serialise"));
        let signed = format!("{prefix}.{body}");
        let sig = self.sign_b64(signed.as_bytes());
        format!("{signed}.{sig}")
    }
}

/// Public keys by kid.
#[derive(Clone, Default)]
pub struct Verifier {
    keys: HashMap<KeyId, VerifyingKey>,
}

impl Verifier {
    pub fn add(&mut self, pk: &PublicKey) -> Result<(), String> {
        let bytes = URL_SAFE_NO_PAD
            .decode(pk.x.as_bytes())
            .map_err(|_| "bad public key".to_string())?;
        let arr: [u8; 32] = bytes
            .try_into()
            .map_err(|_| "bad public key length".to_string())?;
        let vk = VerifyingKey::from_bytes(&arr).map_err(|_| "bad public key".to_string())?;
        // Two keys under one kid: the later replaced the earlier, and every token signed with
        // that one was refused `unauthorized`.
        match self.keys.insert(pk.kid.clone(), vk) {
            Some(old) if old != vk => Err(format!("two different keys with key id {}", pk.kid)),
            _ => Ok(()),
        }
    }

    /// No key: every token is refused.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn from_keys(keys: &[PublicKey]) -> Result<Self, String> {
        let mut v = Self::default();
        for k in keys {
            v.add(k)?;
        }
        Ok(v)
    }

    /// Verifies a token's signature and decodes its claims. Expiry is checked by the caller (on
    /// the clock that matters for it).
    pub fn verify<C: for<'de> Deserialize<'de> + HasKid>(
        &self,
        prefix: &str,
        token: &str,
    ) -> Result<C, TokenError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Malformed);
        }
        let mut parts = token.split('.');
        let (Some(p), Some(body), Some(sig), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        if p != prefix {
            return Err(TokenError::Malformed);
        }
        let claims_bytes = URL_SAFE_NO_PAD
            .decode(body.as_bytes())
            .map_err(|_| TokenError::Malformed)?;
        let claims: C = serde_json::from_slice(&claims_bytes).map_err(|_| TokenError::Malformed)?;
        let vk = self.keys.get(claims.kid()).ok_or(TokenError::UnknownKey)?;
        let sig_bytes = URL_SAFE_NO_PAD
            .decode(sig.as_bytes())
            .map_err(|_| TokenError::Malformed)?;
        let sig = ed25519_dalek::Signature::from_slice(&sig_bytes)
            .map_err(|_| TokenError::BadSignature)?;
        let signed_len = p.len() + 1 + body.len();
        vk.verify_strict(&token.as_bytes()[..signed_len], &sig)
            .map_err(|_| TokenError::BadSignature)?;
        Ok(claims)
    }
}

pub trait HasKid {
    fn kid(&self) -> &KeyId;
}

/// Claims of a join token, minted by the app backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinClaims {
    pub room: RoomId,
    pub sub: ParticipantId,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub may_host: bool,
    /// Expiry, ms since the Unix epoch.
    pub exp: u64,
    pub kid: KeyId,
}

impl HasKid for JoinClaims {
    fn kid(&self) -> &KeyId {
        &self.kid
    }
}

/// Claims of a capability token, minted by this server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapClaims {
    pub room: RoomId,
    pub sub: ParticipantId,
    pub sid: SessionId,
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    pub actions: Vec<Action>,
    /// Expiry, ms since the Unix epoch (compared with the store's clock).
    pub exp: u64,
    /// When the session it was issued to began, ms since the Unix epoch: a kick of `sub` from
    /// `room` at or after it revokes the capability, and every later one of that session (the
    /// session may mint some before the kick closes it). 0 in a capability minted before this
    /// claim existed: any kick does.
    #[serde(default)]
    pub sat: u64,
    pub kid: KeyId,
}

impl HasKid for CapClaims {
    fn kid(&self) -> &KeyId {
        &self.kid
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_roundtrip_and_forgery() {
        let k = Keypair::generate("k1");
        let v = Verifier::from_keys(&[k.public()]).unwrap();
        let c = JoinClaims {
            room: RoomId::new("r").unwrap(),
            sub: ParticipantId::new("p").unwrap(),
            name: "P".into(),
            may_host: true,
            exp: 5,
            kid: k.kid.clone(),
        };
        let t = k.sign_token(JOIN_PREFIX, &c);
        assert_eq!(v.verify::<JoinClaims>(JOIN_PREFIX, &t).unwrap(), c);
        assert_eq!(
            v.verify::<JoinClaims>(CAP_PREFIX, &t).unwrap_err(),
            TokenError::Malformed
        );
        let other = Keypair::generate("k1");
        let forged = other.sign_token(JOIN_PREFIX, &c);
        assert_eq!(
            v.verify::<JoinClaims>(JOIN_PREFIX, &forged).unwrap_err(),
            TokenError::BadSignature
        );
    }

    /// Two keys under one kid (a rotation listing the old and the new key by the same name) are
    /// refused: the later silently replaced the earlier. The same key twice is not a conflict.
    #[test]
    fn two_keys_under_one_kid_are_refused() {
        let (a, b) = (Keypair::generate("k"), Keypair::generate("k"));
        let err = Verifier::from_keys(&[a.public(), b.public()])
            .err()
            .unwrap();
        assert_eq!(err, "two different keys with key id k");
        assert!(Verifier::from_keys(&[a.public(), a.public()]).is_ok());
        // A random kid after a prefix that makes no valid kid is an error, not a panic.
        assert!(Keypair::generate_random_kid("my app").is_err());
        assert!(Keypair::generate_random_kid(&"p".repeat(200)).is_err());
        assert!(Keypair::generate_random_kid("acme:prod").is_ok());
    }
}
