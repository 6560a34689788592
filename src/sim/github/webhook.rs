//! Webhook delivery as GitHub does it: a JSON POST signed with HMAC-SHA256 of the raw body,
//! a fresh delivery GUID per attempt, and a log of what happened to each delivery.

use std::time::Duration;

use axum::body::Body;
use hmac::{Hmac, Mac};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use sha2::Sha256;

use crate::clock::Timestamp;

/// Where events go: an `http://` URL and the shared secret.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    pub url: String,
    pub secret: String,
}

impl std::fmt::Debug for WebhookTarget {
    // The secret never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookTarget")
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .finish()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The receiver answered with this HTTP status.
    Delivered { status: u16 },
    /// No HTTP answer: connection refused, timeout, bad URL.
    Failed { error: String },
    /// A fault swallowed it: never sent.
    Dropped,
    /// A fault holds it back, to be sent after later deliveries.
    Held,
    /// No webhook is configured.
    NoTarget,
}

/// One entry of the delivery log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The `X-GitHub-Delivery` GUID.
    pub id: String,
    /// The `X-GitHub-Event` name: `pull_request`, `push`, `issue_comment`.
    pub event: String,
    pub action: Option<String>,
    pub repo: String,
    pub repo_id: u64,
    pub content_type: ContentType,
    /// Sent again by "Redeliver" (same id, same body).
    pub redelivery: bool,
    pub outcome: DeliveryOutcome,
    pub at: Timestamp,
    /// The exact bytes that were (or would have been) sent.
    pub body: String,
}

/// A webhook's `content_type`: "Supported values include `json` and `form`. The default
/// is `form`." (`webhook-config-content-type` in github/rest-api-description,
/// descriptions/api.github.com/api.github.com.yaml). A `form` delivery is
/// `application/x-www-form-urlencoded` with the JSON in the `payload` field; the
/// signature is over the body as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ContentType {
    #[default]
    Json,
    Form,
}

impl ContentType {
    pub fn header(self) -> &'static str {
        match self {
            ContentType::Json => "application/json",
            ContentType::Form => "application/x-www-form-urlencoded",
        }
    }

    /// The body for a JSON payload.
    pub fn encode(self, json: &str) -> String {
        match self {
            ContentType::Json => json.to_string(),
            ContentType::Form => {
                let mut out = String::from("payload=");
                for b in json.bytes() {
                    match b {
                        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                            out.push(b as char)
                        }
                        b' ' => out.push('+'),
                        _ => out.push_str(&format!("%{b:02X}")),
                    }
                }
                out
            }
        }
    }
}

impl Delivery {
    pub fn status(&self) -> Option<u16> {
        match self.outcome {
            DeliveryOutcome::Delivered { status } => Some(status),
            _ => None,
        }
    }
}

/// `sha256=<hex>` of the HMAC-SHA256 of `body` keyed by `secret`.
pub fn signature_256(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// `sha1=<hex>` of the HMAC-SHA1 of `body` (the legacy `X-Hub-Signature`).
pub fn signature_sha1(secret: &[u8], body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret);
    format!(
        "sha1={}",
        hex::encode(ring::hmac::sign(&key, body).as_ref())
    )
}

/// A random (version 4) UUID, as GitHub uses for delivery ids.
pub fn new_guid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub type HttpClient = Client<HttpConnector, Body>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// GitHub gives a receiver 10 seconds before it counts the delivery as failed.
const RECEIVER_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Outgoing<'a> {
    pub target: &'a WebhookTarget,
    pub delivery_id: &'a str,
    pub event: &'a str,
    pub hook_id: u64,
    pub repo_id: u64,
    pub content_type: ContentType,
    pub body: &'a str,
}

/// POST one event; the receiver's status code, or why there was none.
pub async fn send(client: &HttpClient, out: Outgoing<'_>) -> DeliveryOutcome {
    let request = hyper::Request::post(out.target.url.as_str())
        .header("content-type", out.content_type.header())
        .header("user-agent", "GitHub-Hookshot/ichor-twin")
        .header("x-github-event", out.event)
        .header("x-github-delivery", out.delivery_id)
        .header("x-github-hook-id", out.hook_id.to_string())
        .header("x-github-hook-installation-target-type", "repository")
        .header(
            "x-github-hook-installation-target-id",
            out.repo_id.to_string(),
        )
        // GitHub still sends the legacy SHA-1 signature beside the SHA-256 one
        // (github/docs content/webhooks/webhook-events-and-payloads.md, "Delivery headers").
        .header(
            "x-hub-signature",
            signature_sha1(out.target.secret.as_bytes(), out.body.as_bytes()),
        )
        .header(
            "x-hub-signature-256",
            signature_256(out.target.secret.as_bytes(), out.body.as_bytes()),
        )
        .body(Body::from(out.body.to_string()));
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            return DeliveryOutcome::Failed {
                error: format!("invalid webhook request: {e}"),
            }
        }
    };
    match tokio::time::timeout(RECEIVER_TIMEOUT, client.request(request)).await {
        Ok(Ok(resp)) => DeliveryOutcome::Delivered {
            status: resp.status().as_u16(),
        },
        Ok(Err(e)) => DeliveryOutcome::Failed {
            error: format!("could not deliver to {}: {e}", out.target.url),
        },
        Err(_) => DeliveryOutcome::Failed {
            error: format!("{} did not answer within 10 s", out.target.url),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hex_hmac_sha256_with_prefix() {
        // RFC 4231 test case 2.
        let sig = signature_256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn guids_are_version_4() {
        let g = new_guid();
        assert_eq!(g.len(), 36);
        assert_eq!(&g[14..15], "4");
        assert_ne!(g, new_guid());
    }
}
