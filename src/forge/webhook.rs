//! GitHub webhooks: the signature is checked (HMAC-SHA256 over the raw body, compared in
//! constant time) before a byte is parsed, deliveries are deduplicated by
//! `X-GitHub-Delivery`, the body is bounded, and only the fields ichor acts on are read.
//! A delivery carries no authority of its own: it only says *look again*; what ichor does
//! follows from the repository and the API.

use std::collections::{HashSet, VecDeque};

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

/// The largest body accepted. GitHub caps payloads at 25 MB, but the events ichor reads
/// are a few KiB; a `push` listing huge commits is refused (413) and the periodic
/// reconcile catches the branch up.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// Delivery ids remembered for deduplication (GitHub redelivers with the same id).
pub const DEDUPE_CAPACITY: usize = 10_000;
/// The longest delivery id or event name accepted (a GUID is 36 characters).
const MAX_HEADER_CHARS: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no X-Hub-Signature-256 header")]
    MissingSignature,
    #[error("X-Hub-Signature-256 is not `sha256=<64 hex digits>`")]
    MalformedSignature,
    #[error("X-Hub-Signature-256 does not match the body and the webhook secret")]
    BadSignature,
    #[error("the body is larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("no X-GitHub-Event header")]
    MissingEvent,
    #[error("no X-GitHub-Delivery header, or one longer than {MAX_HEADER_CHARS} characters")]
    BadDelivery,
    #[error("the {event} payload is not what GitHub sends: {message}")]
    BadPayload { event: String, message: String },
    #[error("Content-Type is neither application/json nor application/x-www-form-urlencoded (the two a GitHub webhook sends)")]
    UnsupportedContentType,
    /// The body did not arrive within the listener's body deadline.
    #[error("the body did not arrive in time (GitHub sends a delivery in well under 10 s)")]
    SlowBody,
    /// The sender stopped or broke the body off.
    #[error("the body could not be read to its end")]
    UnreadableBody,
    /// As many bodies as the listener reads at once are being read.
    #[error("too many deliveries are being read at once; the next reconcile catches up")]
    Busy,
}

impl Refusal {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::MissingSignature => "missing_signature",
            Refusal::MalformedSignature | Refusal::BadSignature => "bad_signature",
            Refusal::TooLarge => "too_large",
            Refusal::MissingEvent | Refusal::BadDelivery => "bad_headers",
            Refusal::BadPayload { .. } => "bad_payload",
            Refusal::UnsupportedContentType => "bad_content_type",
            Refusal::SlowBody => "slow_body",
            Refusal::UnreadableBody => "bad_body",
            Refusal::Busy => "busy",
        }
    }
}

/// Check `X-Hub-Signature-256` against the raw body. Runs before any parsing.
pub fn verify(secret: &[u8], body: &[u8], header: Option<&str>) -> Result<(), Refusal> {
    let header = header.ok_or(Refusal::MissingSignature)?;
    let hex_sig = header
        .strip_prefix("sha256=")
        .ok_or(Refusal::MalformedSignature)?;
    if hex_sig.len() != 64 {
        return Err(Refusal::MalformedSignature);
    }
    let sig = hex::decode(hex_sig).map_err(|_| Refusal::MalformedSignature)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| Refusal::BadSignature)?;
    mac.update(body);
    // `verify_slice` compares in constant time.
    mac.verify_slice(&sig).map_err(|_| Refusal::BadSignature)
}

/// `sha256=<hex>` for a body, as GitHub signs it (for tests, benches and the demo).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        // HMAC takes a key of any length.
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Remembers the last [`DEDUPE_CAPACITY`] delivery ids.
#[derive(Debug, Default)]
pub struct Dedupe {
    seen: HashSet<String>,
    order: VecDeque<String>,
}

impl Dedupe {
    /// Forget an id: its delivery was refused, and GitHub's "Redeliver" sends the same id
    /// again.
    pub fn forget(&mut self, id: &str) {
        if self.seen.remove(id) {
            self.order.retain(|o| o != id);
        }
    }

    /// True the first time an id is seen.
    pub fn first_time(&mut self, id: &str) -> bool {
        if self.seen.contains(id) {
            return false;
        }
        if self.order.len() >= DEDUPE_CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        self.seen.insert(id.to_string());
        self.order.push_back(id.to_string());
        true
    }
}

/// What a delivery tells ichor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookEvent {
    PullRequest(PullRequestEvent),
    Push {
        repo: String,
        repo_id: Option<u64>,
        /// `refs/heads/main`
        git_ref: String,
        before: String,
        after: String,
    },
    IssueComment(CommentEvent),
    /// A merge queue asks for the required checks on its merge group's head.
    MergeGroup(MergeGroupEvent),
    Ping,
    /// An event or action ichor does not act on (answered 202 and counted).
    Ignored(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequestEvent {
    pub repo: String,
    pub repo_id: Option<u64>,
    pub action: PullAction,
    pub number: u64,
    pub head_sha: String,
    pub head_ref: String,
    pub base_ref: String,
    pub from_fork: bool,
    pub merged: bool,
    pub merge_commit_sha: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullAction {
    /// opened, reopened, synchronize, ready_for_review, edited (a base change)
    Updated,
    Closed,
}

/// `merge_group` `checks_requested` (octokit/webhooks
/// payload-schemas/api.github.com/merge_group/checks_requested.schema.json).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeGroupEvent {
    pub repo: String,
    pub repo_id: Option<u64>,
    /// The merge group's commit: where GitHub waits for the required statuses.
    pub head_sha: String,
    /// `refs/heads/gh-readonly-queue/<base>/pr-<n>-<sha>`
    pub head_ref: String,
    /// `refs/heads/<base>`
    pub base_ref: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentEvent {
    pub repo: String,
    pub repo_id: Option<u64>,
    pub number: u64,
    pub is_pull_request: bool,
    pub comment_id: u64,
    /// When the comment was written (`None` when the payload does not say or cannot be read).
    pub created_at: Option<crate::clock::Timestamp>,
    pub author: String,
    pub body: String,
}

#[derive(Deserialize)]
struct Repository {
    full_name: String,
    /// Stays when the repository is renamed or transferred; `full_name` does not.
    #[serde(default)]
    id: Option<u64>,
}

#[derive(Deserialize)]
struct Branch {
    #[serde(rename = "ref")]
    git_ref: String,
    sha: String,
    repo: Option<Repository>,
}

#[derive(Deserialize)]
struct Pull {
    head: Branch,
    base: Branch,
    /// `["boolean", "null"]` in octokit/webhooks
    /// payload-schemas/api.github.com/common/pull-request.schema.json.
    #[serde(default)]
    merged: Option<bool>,
    merge_commit_sha: Option<String>,
}

#[derive(Deserialize)]
struct PullPayload {
    action: String,
    number: u64,
    pull_request: Pull,
    repository: Repository,
}

#[derive(Deserialize)]
struct PushPayload {
    #[serde(rename = "ref")]
    git_ref: String,
    before: String,
    after: String,
    repository: Repository,
}

#[derive(Deserialize)]
struct User {
    login: String,
}

#[derive(Deserialize)]
struct Comment {
    id: u64,
    user: User,
    body: Option<String>,
    /// RFC 3339, as GitHub writes it (`issue-comment.created_at` in the webhook schema).
    #[serde(default)]
    created_at: Option<String>,
}

#[derive(Deserialize)]
struct Issue {
    number: u64,
    pull_request: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct MergeGroup {
    head_sha: String,
    head_ref: String,
    base_ref: String,
}

#[derive(Deserialize)]
struct MergeGroupPayload {
    action: String,
    merge_group: MergeGroup,
    repository: Repository,
}

#[derive(Deserialize)]
struct CommentPayload {
    action: String,
    issue: Issue,
    comment: Comment,
    repository: Repository,
}

/// The JSON of a delivery: the body itself for `application/json`, the `payload` field
/// for `application/x-www-form-urlencoded` (GitHub's default content type for a repository
/// webhook: `webhook-config-content-type` in github/rest-api-description,
/// descriptions/api.github.com/api.github.com.yaml). Runs after the signature check, which
/// is over the raw body either way. A missing header is read as JSON.
pub fn payload(content_type: Option<&str>, body: &[u8]) -> Result<Vec<u8>, Refusal> {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase());
    match media.as_deref() {
        None | Some("application/json") => Ok(body.to_vec()),
        Some("application/x-www-form-urlencoded") => {
            let bad = |message: &str| Refusal::BadPayload {
                event: "form-encoded".into(),
                message: message.into(),
            };
            let field = body
                .split(|b| *b == b'&')
                .find_map(|pair| pair.strip_prefix(b"payload=".as_slice()))
                .ok_or_else(|| bad("no `payload` field"))?;
            percent_decode(field).ok_or_else(|| bad("the `payload` field is not percent-encoded"))
        }
        Some(_) => Err(Refusal::UnsupportedContentType),
    }
}

/// `application/x-www-form-urlencoded` value decoding: `+` is a space, `%XX` a byte.
fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

fn is_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A delivery's headers, checked for shape.
pub fn headers<'a>(
    event: Option<&'a str>,
    delivery: Option<&'a str>,
) -> Result<(&'a str, &'a str), Refusal> {
    let event = event
        .filter(|e| !e.is_empty() && e.len() <= MAX_HEADER_CHARS)
        .ok_or(Refusal::MissingEvent)?;
    let delivery = delivery
        .filter(|d| !d.is_empty() && d.len() <= MAX_HEADER_CHARS && d.is_ascii())
        .ok_or(Refusal::BadDelivery)?;
    Ok((event, delivery))
}

/// Read an (already verified) delivery.
pub fn parse(event: &str, body: &[u8]) -> Result<WebhookEvent, Refusal> {
    let bad = |message: String| Refusal::BadPayload {
        event: event.chars().take(MAX_HEADER_CHARS).collect(),
        message,
    };
    let json = |b: &[u8]| -> Result<serde_json::Value, Refusal> {
        serde_json::from_slice(b).map_err(|e| bad(e.to_string()))
    };
    match event {
        "ping" => Ok(WebhookEvent::Ping),
        "pull_request" => {
            let p: PullPayload =
                serde_json::from_value(json(body)?).map_err(|e| bad(e.to_string()))?;
            let action = match p.action.as_str() {
                "opened" | "reopened" | "synchronize" | "ready_for_review" | "edited" => {
                    PullAction::Updated
                }
                "closed" => PullAction::Closed,
                other => {
                    return Ok(WebhookEvent::Ignored(format!(
                        "pull_request.{}",
                        crate::escape::clip(other, 40)
                    )))
                }
            };
            let pr = p.pull_request;
            if !is_sha(&pr.head.sha) {
                return Err(bad("pull_request.head.sha is not a 40-digit sha".into()));
            }
            let merge_commit_sha = pr.merge_commit_sha.filter(|s| is_sha(s));
            // A fork's PR has its head in another repository. The head repository's own
            // `fork` flag says nothing: in a repository that is itself a fork every PR's
            // head repository has it. GitHub compares names without case.
            let base_repo = pr
                .base
                .repo
                .as_ref()
                .map_or(p.repository.full_name.as_str(), |r| r.full_name.as_str());
            let from_fork = match &pr.head.repo {
                Some(r) => !r.full_name.eq_ignore_ascii_case(base_repo),
                // The fork was deleted: not ours either.
                None => true,
            };
            Ok(WebhookEvent::PullRequest(PullRequestEvent {
                repo_id: p.repository.id,
                repo: p.repository.full_name,
                action,
                number: p.number,
                head_sha: pr.head.sha,
                head_ref: pr.head.git_ref,
                base_ref: pr.base.git_ref,
                from_fork,
                merged: pr.merged.unwrap_or(false),
                merge_commit_sha,
            }))
        }
        "push" => {
            let p: PushPayload =
                serde_json::from_value(json(body)?).map_err(|e| bad(e.to_string()))?;
            if !is_sha(&p.before) || !is_sha(&p.after) {
                return Err(bad("push.before/after are not 40-digit shas".into()));
            }
            Ok(WebhookEvent::Push {
                repo_id: p.repository.id,
                repo: p.repository.full_name,
                git_ref: p.git_ref,
                before: p.before,
                after: p.after,
            })
        }
        "issue_comment" => {
            let p: CommentPayload =
                serde_json::from_value(json(body)?).map_err(|e| bad(e.to_string()))?;
            if p.action != "created" {
                return Ok(WebhookEvent::Ignored(format!(
                    "issue_comment.{}",
                    crate::escape::clip(&p.action, 40)
                )));
            }
            Ok(WebhookEvent::IssueComment(CommentEvent {
                repo_id: p.repository.id,
                repo: p.repository.full_name,
                number: p.issue.number,
                is_pull_request: p.issue.pull_request.is_some(),
                comment_id: p.comment.id,
                created_at: p
                    .comment
                    .created_at
                    .as_deref()
                    .and_then(crate::clock::Timestamp::parse_rfc3339),
                author: p.comment.user.login,
                body: p.comment.body.unwrap_or_default(),
            }))
        }
        "merge_group" => {
            let p: MergeGroupPayload =
                serde_json::from_value(json(body)?).map_err(|e| bad(e.to_string()))?;
            if p.action != "checks_requested" {
                // `destroyed`: the group was merged, dequeued or invalidated.
                return Ok(WebhookEvent::Ignored(format!(
                    "merge_group.{}",
                    crate::escape::clip(&p.action, 40)
                )));
            }
            let g = p.merge_group;
            if !is_sha(&g.head_sha) {
                return Err(bad("merge_group.head_sha is not a 40-digit sha".into()));
            }
            if !g.head_ref.starts_with("refs/heads/") || !g.base_ref.starts_with("refs/heads/") {
                return Err(bad("merge_group refs are not under refs/heads/".into()));
            }
            Ok(WebhookEvent::MergeGroup(MergeGroupEvent {
                repo_id: p.repository.id,
                repo: p.repository.full_name,
                head_sha: g.head_sha,
                head_ref: g.head_ref,
                base_ref: g.base_ref,
            }))
        }
        other => Ok(WebhookEvent::Ignored(
            crate::escape::clip(other, 40).to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn signatures_are_checked_before_anything() {
        let body = br#"{"zen":"x"}"#;
        let good = sign(b"s3cret", body);
        assert_eq!(verify(b"s3cret", body, Some(&good)), Ok(()));
        assert_eq!(
            verify(b"other", body, Some(&good)),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            verify(b"s3cret", b"{}", Some(&good)),
            Err(Refusal::BadSignature)
        );
        assert_eq!(
            verify(b"s3cret", body, None),
            Err(Refusal::MissingSignature)
        );
        assert_eq!(
            verify(b"s3cret", body, Some("sha1=abc")),
            Err(Refusal::MalformedSignature)
        );
        let upper = good.to_uppercase().replace("SHA256=", "sha256=");
        assert_eq!(verify(b"s3cret", body, Some(&upper)), Ok(()));
        assert_eq!(
            verify(b"s3cret", body, Some(&format!("{good}00"))),
            Err(Refusal::MalformedSignature)
        );
    }

    #[test]
    fn dedupe_forgets_the_oldest() {
        let mut d = Dedupe::default();
        assert!(d.first_time("a"));
        assert!(!d.first_time("a"));
        for i in 0..DEDUPE_CAPACITY {
            d.first_time(&i.to_string());
        }
        assert!(d.first_time("a"), "evicted after capacity");
    }

    fn pull(action: &str, head_repo: &str, fork: bool) -> String {
        format!(
            r#"{{"action":"{action}","number":7,"pull_request":{{"head":{{"ref":"renovate/talos","sha":"{SHA}","repo":{{"full_name":"{head_repo}","fork":{fork}}}}},"base":{{"ref":"main","sha":"{SHA}","repo":{{"full_name":"acme/lab"}}}},"merged":false,"merge_commit_sha":null}},"repository":{{"full_name":"acme/lab"}}}}"#
        )
    }

    #[test]
    fn pull_requests_and_forks() {
        let WebhookEvent::PullRequest(p) = parse(
            "pull_request",
            pull("synchronize", "acme/lab", false).as_bytes(),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(p.action, PullAction::Updated);
        assert_eq!(p.number, 7);
        assert!(!p.from_fork);
        let WebhookEvent::PullRequest(f) = parse(
            "pull_request",
            pull("opened", "mallory/lab", true).as_bytes(),
        )
        .unwrap() else {
            panic!()
        };
        assert!(f.from_fork);
        // A PR inside a repository that is itself a fork is not a fork's PR; names
        // compare without case.
        let WebhookEvent::PullRequest(own) =
            parse("pull_request", pull("opened", "ACME/Lab", true).as_bytes()).unwrap()
        else {
            panic!()
        };
        assert!(!own.from_fork);
        let null_merged =
            pull("closed", "acme/lab", false).replace(r#""merged":false"#, r#""merged":null"#);
        assert!(matches!(
            parse("pull_request", null_merged.as_bytes()),
            Ok(WebhookEvent::PullRequest(PullRequestEvent {
                merged: false,
                ..
            }))
        ));
        assert!(matches!(
            parse(
                "pull_request",
                pull("labeled", "acme/lab", false).as_bytes()
            ),
            Ok(WebhookEvent::Ignored(_))
        ));
        let bad = pull("opened", "acme/lab", false).replace(SHA, "nope");
        assert!(matches!(
            parse("pull_request", bad.as_bytes()),
            Err(Refusal::BadPayload { .. })
        ));
        assert!(matches!(
            parse("pull_request", b"[[[[[["),
            Err(Refusal::BadPayload { .. })
        ));
    }

    #[test]
    fn form_encoded_payloads_are_read_from_the_payload_field() {
        let json = br#"{"zen":"a b+c&d=e%"}"#;
        let form = b"payload=%7B%22zen%22%3A%22a+b%2Bc%26d%3De%25%22%7D";
        assert_eq!(
            payload(Some("application/x-www-form-urlencoded"), form).unwrap(),
            json.to_vec()
        );
        assert_eq!(
            payload(Some("application/json; charset=utf-8"), json).unwrap(),
            json.to_vec()
        );
        assert_eq!(
            payload(Some("text/plain"), json),
            Err(Refusal::UnsupportedContentType)
        );
        assert!(payload(Some("application/x-www-form-urlencoded"), b"payload=%zz").is_err());
        assert!(payload(Some("application/x-www-form-urlencoded"), b"other=1").is_err());
    }

    #[test]
    fn a_forgotten_id_is_new_again() {
        let mut d = Dedupe::default();
        assert!(d.first_time("a"));
        d.forget("a");
        assert!(d.first_time("a"));
        assert!(!d.first_time("a"));
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let deep = "[".repeat(100_000);
        assert!(parse("push", deep.as_bytes()).is_err());
    }

    #[test]
    fn comments_and_headers() {
        let body = r#"{"action":"created","issue":{"number":3,"pull_request":{"url":"x"}},"comment":{"id":9,"user":{"login":"alice"},"body":"/ichor retry"},"repository":{"full_name":"acme/lab"}}"#;
        let WebhookEvent::IssueComment(c) = parse("issue_comment", body.as_bytes()).unwrap() else {
            panic!()
        };
        assert!(c.is_pull_request);
        assert_eq!((c.number, c.comment_id, c.author.as_str()), (3, 9, "alice"));
        assert_eq!(headers(None, Some("x")), Err(Refusal::MissingEvent));
        assert_eq!(
            headers(Some("push"), Some(&"x".repeat(200))),
            Err(Refusal::BadDelivery)
        );
    }
}
