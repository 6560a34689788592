//! GitHub Apps as GitHub authenticates them: an App proves itself with a JWT signed
//! RS256 by its private key (`iss` = the App id, `iat`/`exp` checked against the twin's
//! clock, at most 10 minutes apart), and trades it for an installation access token
//! (`ghs_…`, one hour) that then authenticates the REST routes of the installation's
//! repositories as `<slug>[bot]`.

use std::time::Duration;

use base64::Engine as _;
use ring::signature::{self, KeyPair as _, RsaKeyPair, UnparsedPublicKey};
use serde_json::{json, Value};

use super::GithubError;
use crate::clock::Timestamp;

/// A GitHub App the twin knows.
#[derive(Clone, Debug)]
pub struct GithubApp {
    pub id: u64,
    /// The App's URL name; its bot login is `<slug>[bot]`.
    pub slug: String,
    /// The RSA public key as DER `RSAPublicKey` (PKCS#1), what ring verifies with.
    pub public_key_der: Vec<u8>,
    pub installations: Vec<AppInstallation>,
}

/// One installation of an App: the repositories (`owner/name`) it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppInstallation {
    pub id: u64,
    pub repos: Vec<String>,
}

impl GithubApp {
    /// An App whose public key is derived from its private key PEM (PKCS#1
    /// `RSA PRIVATE KEY`, as GitHub hands it out, or PKCS#8 `PRIVATE KEY`).
    pub fn from_private_key_pem(
        id: u64,
        slug: impl Into<String>,
        pem: &str,
        installations: Vec<AppInstallation>,
    ) -> Result<GithubApp, GithubError> {
        let bad = |why: &str| GithubError::AppKey(format!("App {id}: {why}"));
        let (label, der) = pem_block(pem).ok_or_else(|| bad("not a PEM private key"))?;
        let pair = match label.as_str() {
            "RSA PRIVATE KEY" => RsaKeyPair::from_der(&der),
            "PRIVATE KEY" => RsaKeyPair::from_pkcs8(&der),
            _ => return Err(bad("not an RSA private key")),
        }
        .map_err(|e| bad(&format!("the key is rejected: {e}")))?;
        Ok(GithubApp {
            id,
            slug: slug.into(),
            public_key_der: pair.public_key().as_ref().to_vec(),
            installations,
        })
    }

    pub fn bot_login(&self) -> String {
        format!("{}[bot]", self.slug)
    }
}

/// The label and bytes of the first PEM block.
fn pem_block(pem: &str) -> Option<(String, Vec<u8>)> {
    let start = pem.find("-----BEGIN ")?;
    let rest = &pem[start + "-----BEGIN ".len()..];
    let label_end = rest.find("-----")?;
    let label = rest[..label_end].to_string();
    let body = &rest[label_end + 5..];
    let end = body.find(&format!("-----END {label}-----"))?;
    let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    Some((label, der))
}

/// The emulator's own App for `ichor sim --github --github-app`: a fixed, published
/// test key (testdata/keys/), good for this emulator only, never for GitHub.
pub const EMULATOR_APP_KEY: &str = include_str!("../../../testdata/keys/github-app.pkcs1.pem");
pub const EMULATOR_APP_ID: u64 = 1;
pub const EMULATOR_INSTALLATION_ID: u64 = 1;

/// The emulator's App, installed on `repo`.
pub fn emulator_app(repo: &str) -> Result<GithubApp, GithubError> {
    GithubApp::from_private_key_pem(
        EMULATOR_APP_ID,
        "ichor",
        EMULATOR_APP_KEY,
        vec![AppInstallation {
            id: EMULATOR_INSTALLATION_ID,
            repos: vec![repo.to_string()],
        }],
    )
}

/// An installation access token the twin handed out.
#[derive(Clone, Debug)]
pub struct IssuedToken {
    pub token: String,
    pub installation_id: u64,
    pub login: String,
    pub repos: Vec<String>,
    pub expires_at: Timestamp,
}

/// GitHub's installation tokens live one hour.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// GitHub refuses a JWT whose `exp` is more than 10 minutes after its `iat`.
pub const MAX_JWT_LIFETIME_SECS: i64 = 600;
/// The longest bearer value the twin decodes as a JWT.
pub const MAX_JWT_BYTES: usize = 8 * 1024;

/// The permissions every twin installation token carries.
pub fn token_permissions() -> Value {
    json!({
        "metadata": "read",
        "contents": "read",
        "pull_requests": "write",
        "issues": "write",
        "statuses": "write",
        "checks": "write",
    })
}

pub const JWT_UNDECODABLE: &str = "A JSON web token could not be decoded";
pub const JWT_EXPIRED: &str = "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires";
pub const JWT_TOO_LONG: &str = "'Expiration time' claim ('exp') is too far in the future";
pub const JWT_IAT_FUTURE: &str =
    "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued";
pub const JWT_ISS: &str = "'Issuer' claim ('iss') must be an Integer";
pub const JWT_UNKNOWN_APP: &str = "Integration not found";

/// Whether a bearer value is shaped like a JWT (three base64url parts).
pub fn looks_like_jwt(value: &str) -> bool {
    value.split('.').count() == 3 && !value.starts_with("gh")
}

fn b64url(part: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .ok()
}

/// Check a JWT as GitHub does: RS256 over `header.payload` with the key of the App named
/// by `iss`, then `iat` not in the future and `exp` in the future, at most 10 minutes
/// after `iat`. The error is GitHub's message for the first check that fails.
pub fn verify_jwt<'a>(
    apps: &'a [GithubApp],
    jwt: &str,
    now: Timestamp,
) -> Result<&'a GithubApp, &'static str> {
    if jwt.len() > MAX_JWT_BYTES {
        return Err(JWT_UNDECODABLE);
    }
    let mut parts = jwt.split('.');
    let (Some(h), Some(p), Some(sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JWT_UNDECODABLE);
    };
    let header: Value = b64url(h)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or(JWT_UNDECODABLE)?;
    if header["alg"] != "RS256" {
        return Err(JWT_UNDECODABLE);
    }
    let claims: Value = b64url(p)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or(JWT_UNDECODABLE)?;
    let signature = b64url(sig).ok_or(JWT_UNDECODABLE)?;
    // `iss` may be the number or its decimal string.
    let iss = match &claims["iss"] {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    }
    .ok_or(JWT_ISS)?;
    let app = apps.iter().find(|a| a.id == iss).ok_or(JWT_UNKNOWN_APP)?;
    let signed = &jwt[..h.len() + 1 + p.len()];
    UnparsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, &app.public_key_der)
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| JWT_UNDECODABLE)?;
    let now_secs = i64::try_from(now.as_millis() / 1000).unwrap_or(i64::MAX);
    let iat = claims["iat"].as_i64().ok_or(JWT_IAT_FUTURE)?;
    let exp = claims["exp"].as_i64().ok_or(JWT_EXPIRED)?;
    if iat > now_secs {
        return Err(JWT_IAT_FUTURE);
    }
    if exp <= now_secs {
        return Err(JWT_EXPIRED);
    }
    if exp.saturating_sub(iat) > MAX_JWT_LIFETIME_SECS {
        return Err(JWT_TOO_LONG);
    }
    Ok(app)
}

/// A fresh `ghs_` token, longer than the 40 characters of today's: GitHub reserves the
/// right to lengthen them (github/docs, "About authentication to GitHub", token formats),
/// so a client must not assume a length. 76 characters here.
pub fn new_token() -> String {
    let bytes: [u8; 36] = rand::random();
    format!("ghs_{}", hex::encode(bytes))
}

/// `GET /app`.
pub fn app_json(base: &str, app: &GithubApp, owner: &str) -> Value {
    json!({
        "id": app.id,
        "slug": app.slug,
        "node_id": format!("A_{}", app.id),
        "client_id": format!("Iv1.{:016x}", app.id),
        "owner": super::json::user(base, owner),
        "name": app.slug,
        "description": "",
        "external_url": format!("{base}/apps/{}", app.slug),
        "html_url": format!("{base}/apps/{}", app.slug),
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "permissions": token_permissions(),
        "events": ["pull_request", "push", "issue_comment"],
        "installations_count": app.installations.len(),
    })
}

/// An installation object (`GET /repos/{o}/{r}/installation`).
pub fn installation_json(
    base: &str,
    app: &GithubApp,
    inst: &AppInstallation,
    account: &str,
) -> Value {
    json!({
        "id": inst.id,
        "account": super::json::user(base, account),
        "app_id": app.id,
        "app_slug": app.slug,
        "target_id": super::json::user_id(account),
        "target_type": "User",
        "repository_selection": "selected",
        "access_tokens_url": format!("{base}/app/installations/{}/access_tokens", inst.id),
        "repositories_url": format!("{base}/installation/repositories"),
        "html_url": format!("{base}/settings/installations/{}", inst.id),
        "permissions": token_permissions(),
        "events": ["pull_request", "push", "issue_comment"],
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "single_file_name": Value::Null,
        "suspended_at": Value::Null,
    })
}
