//! GitHub App authentication without a JWT crate: the App's private key (PEM, PKCS#1 as
//! GitHub hands it out, or PKCS#8) signs a short JWT with ring (RS256), the JWT buys an
//! installation access token, and [`AppAuth`] keeps that token until less than five
//! minutes of it remain, so a long-running ichor never presents an expired one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};

use crate::clock::{Clock, Timestamp};
use crate::secret::Secret;

/// The largest PEM ichor parses (a 4096-bit PKCS#1 key is about 3.3 KiB).
pub const MAX_PEM_BYTES: usize = 16 * 1024;
/// `iat` is set this far in the past, as GitHub advises, to absorb clock drift.
pub const JWT_BACKDATE: Duration = Duration::from_secs(60);
/// `exp` is this far ahead; GitHub refuses more than 10 minutes after `iat`.
pub const JWT_LIFETIME: Duration = Duration::from_secs(9 * 60);
/// A cached installation token is replaced when less than this remains of it.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// Why App authentication could not proceed. Never carries key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppAuthError {
    #[error("the GitHub App private key is {0} bytes; ichor reads keys of at most {MAX_PEM_BYTES} bytes")]
    KeyTooLarge(usize),
    #[error("the GitHub App private key is not PEM: expected a -----BEGIN RSA PRIVATE KEY----- (PKCS#1, as GitHub hands it out) or -----BEGIN PRIVATE KEY----- (PKCS#8) block")]
    NotPem,
    #[error("the GitHub App private key is a PEM {label:?} block; expected RSA PRIVATE KEY (PKCS#1) or PRIVATE KEY (PKCS#8)")]
    WrongPemKind { label: String },
    #[error("the GitHub App private key's PEM body is not valid base64")]
    BadBase64,
    #[error("the GitHub App private key ({format}) is rejected: {reason}")]
    KeyRejected {
        format: &'static str,
        reason: String,
    },
    #[error("signing the GitHub App JWT failed")]
    Signing,
}

/// Parse the App's private key: PKCS#1 (`RSA PRIVATE KEY`) or PKCS#8 (`PRIVATE KEY`).
pub fn parse_private_key(pem: &Secret) -> Result<RsaKeyPair, AppAuthError> {
    let text = pem.expose();
    if text.len() > MAX_PEM_BYTES {
        return Err(AppAuthError::KeyTooLarge(text.len()));
    }
    let (label, body) = pem_block(text).ok_or(AppAuthError::NotPem)?;
    let format = match label {
        "RSA PRIVATE KEY" => "PKCS#1",
        "PRIVATE KEY" => "PKCS#8",
        other => {
            // Only the label is echoed: it is the header line, never key material.
            let label: String = other.chars().take(40).collect();
            return Err(AppAuthError::WrongPemKind { label });
        }
    };
    let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| AppAuthError::BadBase64)?;
    let parsed = if format == "PKCS#1" {
        RsaKeyPair::from_der(&der)
    } else {
        RsaKeyPair::from_pkcs8(&der)
    };
    parsed.map_err(|e| AppAuthError::KeyRejected {
        format,
        reason: e.to_string(),
    })
}

/// The label and body of the first PEM block, if the text holds a complete one.
fn pem_block(text: &str) -> Option<(&str, &str)> {
    const BEGIN: &str = "-----BEGIN ";
    let start = text.find(BEGIN)? + BEGIN.len();
    let rest = &text[start..];
    let label_end = rest.find("-----")?;
    let label = &rest[..label_end];
    let body_start = label_end + "-----".len();
    let end_marker = format!("-----END {label}-----");
    let body_len = rest[body_start..].find(&end_marker)?;
    Some((label, &rest[body_start..body_start + body_len]))
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The App's JWT at `now`: `{"alg":"RS256","typ":"JWT"}`, `iat` = now − 60 s, `exp` =
/// now + 9 min, `iss` = the App id; RSASSA-PKCS1-v1_5 with SHA-256, base64url unpadded.
pub fn sign_jwt(key: &RsaKeyPair, app_id: u64, now: Timestamp) -> Result<Secret, AppAuthError> {
    let now_secs = now.as_millis() / 1000;
    let iat = now_secs.saturating_sub(JWT_BACKDATE.as_secs());
    let exp = now_secs.saturating_add(JWT_LIFETIME.as_secs());
    let header = b64url(br#"{"alg":"RS256","typ":"JWT"}"#);
    let claims = b64url(
        serde_json::json!({ "iat": iat, "exp": exp, "iss": app_id.to_string() })
            .to_string()
            .as_bytes(),
    );
    let signing_input = format!("{header}.{claims}");
    let mut signature = vec![0u8; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        signing_input.as_bytes(),
        &mut signature,
    )
    .map_err(|_| AppAuthError::Signing)?;
    Ok(Secret::new(format!(
        "{signing_input}.{}",
        b64url(&signature)
    )))
}

/// An installation access token and when GitHub lets it expire.
#[derive(Clone, Debug)]
pub struct InstallationToken {
    pub token: Secret,
    pub expires_at: Timestamp,
}

/// One App installation's credentials: the key that signs JWTs and the cached
/// installation token. Cloning shares the cache.
#[derive(Clone)]
pub struct AppAuth {
    app_id: u64,
    installation_id: u64,
    key: Arc<RsaKeyPair>,
    clock: Clock,
    cached: Arc<Mutex<Option<InstallationToken>>>,
    /// GitHub's clock minus ours, in milliseconds, once GitHub refused a JWT for its
    /// times: JWTs are signed on GitHub's time from then on (as octokit's auth-app does).
    skew_ms: Arc<std::sync::atomic::AtomicI64>,
}

impl std::fmt::Debug for AppAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppAuth")
            .field("app_id", &self.app_id)
            .field("installation_id", &self.installation_id)
            .finish_non_exhaustive()
    }
}

impl AppAuth {
    pub fn new(
        app_id: u64,
        installation_id: u64,
        private_key: &Secret,
        clock: Clock,
    ) -> Result<AppAuth, AppAuthError> {
        Ok(AppAuth {
            app_id,
            installation_id,
            key: Arc::new(parse_private_key(private_key)?),
            clock,
            cached: Arc::new(Mutex::new(None)),
            skew_ms: Arc::new(std::sync::atomic::AtomicI64::new(0)),
        })
    }

    pub fn app_id(&self) -> u64 {
        self.app_id
    }

    pub fn installation_id(&self) -> u64 {
        self.installation_id
    }

    /// A JWT signed now (for `/app` routes and buying an installation token).
    pub fn jwt(&self) -> Result<Secret, AppAuthError> {
        sign_jwt(&self.key, self.app_id, self.github_now())
    }

    /// Now on GitHub's clock, as far as ichor learnt it.
    fn github_now(&self) -> Timestamp {
        let skew = self.skew_ms.load(std::sync::atomic::Ordering::Relaxed);
        let now = self.clock.now().as_millis() as i64;
        Timestamp::from_millis(now.saturating_add(skew).max(0) as u64)
    }

    /// Sign on `github_now` (GitHub's `Date`) from now on; the difference found, in
    /// seconds.
    pub fn correct_clock(&self, github_now: Timestamp) -> i64 {
        let skew = github_now.as_millis() as i64 - self.clock.now().as_millis() as i64;
        self.skew_ms
            .store(skew, std::sync::atomic::Ordering::Relaxed);
        skew / 1000
    }

    /// The cached installation token while more than [`REFRESH_MARGIN`] of it remains.
    pub fn current_token(&self) -> Option<Secret> {
        let now = self.clock.now();
        let cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        cached
            .as_ref()
            .filter(|t| !needs_refresh(t.expires_at, now))
            .map(|t| t.token.clone())
    }

    /// Keep a freshly bought token.
    pub fn remember(&self, token: InstallationToken) {
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
    }

    /// Drop the cached token (GitHub refused it: revoked, or the clocks disagree).
    pub fn forget(&self) {
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Whether a token expiring at `expires_at` should be replaced at `now`.
pub fn needs_refresh(expires_at: Timestamp, now: Timestamp) -> bool {
    expires_at.since(now) < REFRESH_MARGIN
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{KeyPair as _, UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    /// Test-only keys made with OpenSSL (testdata/keys/README.md).
    const PKCS1: &str = include_str!("../../testdata/keys/github-app.pkcs1.pem");
    const PKCS8: &str = include_str!("../../testdata/keys/github-app.pkcs8.pem");

    fn decode(part: &str) -> Vec<u8> {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part)
            .unwrap()
    }

    fn round_trip(pem: &str, expected_header: &str) {
        assert!(pem.contains(expected_header), "{expected_header}");
        let key = parse_private_key(&Secret::new(pem)).unwrap();
        let now = Timestamp(1_767_225_600_000);
        let jwt = sign_jwt(&key, 4242, now).unwrap();
        let jwt = jwt.expose();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        assert!(!jwt.contains('='), "base64url without padding");
        let header: serde_json::Value = serde_json::from_slice(&decode(parts[0])).unwrap();
        assert_eq!(header, serde_json::json!({"alg": "RS256", "typ": "JWT"}));
        let claims: serde_json::Value = serde_json::from_slice(&decode(parts[1])).unwrap();
        assert_eq!(claims["iat"], 1_767_225_600 - 60);
        assert_eq!(claims["exp"], 1_767_225_600 + 9 * 60);
        assert_eq!(claims["iss"], "4242");
        let public = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, key.public_key().as_ref());
        let signed = format!("{}.{}", parts[0], parts[1]);
        public.verify(signed.as_bytes(), &decode(parts[2])).unwrap();
        // A changed claim breaks the signature.
        let tampered = format!("{}.{}", parts[0], b64url(br#"{"iss":"1"}"#));
        assert!(public
            .verify(tampered.as_bytes(), &decode(parts[2]))
            .is_err());
    }

    #[test]
    fn pkcs1_key_signs_a_jwt_that_ring_verifies() {
        round_trip(PKCS1, "-----BEGIN RSA PRIVATE KEY-----");
    }

    #[test]
    fn pkcs8_key_signs_a_jwt_that_ring_verifies() {
        round_trip(PKCS8, "-----BEGIN PRIVATE KEY-----");
    }

    #[test]
    fn bad_keys_get_clear_errors_without_key_material() {
        let err = |s: &str| parse_private_key(&Secret::new(s)).unwrap_err();
        assert_eq!(err("ghp_notakey"), AppAuthError::NotPem);
        assert!(matches!(
            err("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
            AppAuthError::WrongPemKind { label } if label == "CERTIFICATE"
        ));
        assert_eq!(
            err("-----BEGIN RSA PRIVATE KEY-----\n!!!secretish!!!\n-----END RSA PRIVATE KEY-----"),
            AppAuthError::BadBase64
        );
        let rejected = err(
            "-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END RSA PRIVATE KEY-----",
        );
        assert!(matches!(
            rejected,
            AppAuthError::KeyRejected {
                format: "PKCS#1",
                ..
            }
        ));
        for e in [rejected, err("x".repeat(MAX_PEM_BYTES + 1).as_str())] {
            let shown = format!("{e} {e:?}");
            assert!(
                !shown.contains("c2VjcmV0") && !shown.contains("xxxx"),
                "{shown}"
            );
        }
    }

    #[test]
    fn a_token_is_refreshed_when_less_than_five_minutes_remain() {
        let now = Timestamp(1_000_000_000);
        assert!(!needs_refresh(now.plus(Duration::from_secs(301)), now));
        assert!(!needs_refresh(now.plus(REFRESH_MARGIN), now));
        assert!(needs_refresh(now.plus(Duration::from_secs(299)), now));
        assert!(needs_refresh(now, now));
        assert!(needs_refresh(Timestamp(5), now), "already expired");
    }
}
