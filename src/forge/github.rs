//! ichor's GitHub client: commit statuses (posted only when they change), the sticky PR
//! comment, collaborator permissions and pull requests, over octocrab's raw HTTP helpers
//! with ichor's own serde models. It authenticates with a token or as a GitHub App
//! installation ([`super::app::AppAuth`]), recognises GitHub's rate-limit answers (403 or
//! 429; `retry-after`, `x-ratelimit-reset` when the window is spent, else a minute doubling
//! while they persist) and holds every further call of the limited kind until the wait is
//! over — a patient client sleeps it out on the [`Clock`], an impatient one (the
//! controller's event loop) answers [`ForgeError::RateLimited`] at once, so the work can be
//! queued again instead of blocking the loop — retries 5xx with
//! backoff, and sends `If-None-Match` for the listings the controller repeats, since a
//! 304 costs nothing against GitHub's rate limit.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use http::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, IF_NONE_MATCH};
use http::{Method, StatusCode, Uri};
use octocrab::Octocrab;
use serde::Deserialize;
use serde_json::{json, Value};

use super::app::{AppAuth, AppAuthError, InstallationToken};
use crate::clock::{Clock, Timestamp};
use crate::secret::Secret;

/// GitHub's cap on a status description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 140;
/// GitHub's effective cap on a status context.
pub const MAX_CONTEXT_CHARS: usize = 255;
/// GitHub's cap on an issue comment body: 262,144 UTF-8 bytes (its 422 says "maximum is
/// 65536 characters", which holds only for 4-byte characters; measured in bytes).
pub const MAX_COMMENT_BYTES: usize = 262_144;
/// The most comment pages read when looking for the sticky comment (100 per page).
pub const MAX_COMMENT_PAGES: u32 = 50;
/// The most pages of open pull requests read (100 per page).
pub const MAX_PULL_PAGES: u32 = 20;
/// The most status pages read to find the newest status of a context.
pub const MAX_STATUS_PAGES: u32 = 10;
/// The largest response body read.
pub const MAX_RESPONSE_BYTES: usize = 32 << 20;
/// Attempts for one call that meets 5xx answers or broken connections.
pub const MAX_ATTEMPTS: u32 = 5;
/// Rate-limit waits for one call before giving up.
pub const MAX_RATE_LIMIT_WAITS: u32 = 3;
/// The longest rate-limit wait ichor sits out inside one call (GitHub's window is an hour).
pub const MAX_RATE_LIMIT_WAIT: Duration = Duration::from_secs(3600 + 60);
/// The first backoff after a 5xx; doubled each further attempt.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Remembered statuses and cached ETags, each; a full cache starts over.
const MAX_CACHE_ENTRIES: usize = 4096;

const COMMENT_TRUNCATION_NOTE: &str =
    "\n\n… (truncated: this report is longer than GitHub's comment limit of 262,144 bytes)";

pub struct GithubConfig {
    /// `https://api.github.com`, a GitHub Enterprise `https://host/api/v3`, or the emulator.
    pub api_url: String,
    /// `owner/name`.
    pub repo: String,
    pub auth: GithubAuth,
}

pub enum GithubAuth {
    /// A personal access token (classic or fine-grained).
    Token(Secret),
    /// A GitHub App installation; `private_key` is the App's PEM.
    App {
        app_id: u64,
        installation_id: u64,
        private_key: Secret,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusState {
    Pending,
    Success,
    Failure,
    Error,
}

impl StatusState {
    pub fn as_str(self) -> &'static str {
        match self {
            StatusState::Pending => "pending",
            StatusState::Success => "success",
            StatusState::Failure => "failure",
            StatusState::Error => "error",
        }
    }

    fn parse(s: &str) -> Option<StatusState> {
        match s {
            "pending" => Some(StatusState::Pending),
            "success" => Some(StatusState::Success),
            "failure" => Some(StatusState::Failure),
            "error" => Some(StatusState::Error),
            _ => None,
        }
    }
}

/// GitHub's cap on a check run's `output.title`, `summary` and `text`, each, in bytes (its
/// 422 says "summary exceeds a maximum bytesize of 65535").
pub const MAX_CHECK_OUTPUT_BYTES: usize = 65_535;
/// Annotations GitHub takes in one request.
pub const MAX_ANNOTATIONS: usize = 50;

const OUTPUT_TRUNCATION_NOTE: &str =
    "\n\n… (truncated: GitHub keeps at most 65,535 bytes here; the sticky comment and the notes have the rest)";

/// How a check run ended; `None` in [`CheckRunOut::conclusion`] is a run still in
/// progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conclusion {
    Success,
    Failure,
    Neutral,
    Skipped,
    Cancelled,
    /// Paused: someone has to act (Renovate and GitHub count it as not passed).
    ActionRequired,
}

impl Conclusion {
    pub fn as_str(self) -> &'static str {
        match self {
            Conclusion::Success => "success",
            Conclusion::Failure => "failure",
            Conclusion::Neutral => "neutral",
            Conclusion::Skipped => "skipped",
            Conclusion::Cancelled => "cancelled",
            Conclusion::ActionRequired => "action_required",
        }
    }
}

/// Where a check run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    Queued,
    InProgress,
    Completed(Conclusion),
}

impl RunState {
    fn status(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::InProgress => "in_progress",
            RunState::Completed(_) => "completed",
        }
    }

    fn conclusion(self) -> Option<&'static str> {
        match self {
            RunState::Completed(c) => Some(c.as_str()),
            _ => None,
        }
    }
}

/// A line of a file a check run points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckAnnotation {
    pub path: String,
    pub line: u64,
    /// notice, warning or failure.
    pub level: &'static str,
    pub title: String,
    pub message: String,
}

/// A check run as ichor posts it (only a GitHub App can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRunOut {
    pub state: RunState,
    pub title: String,
    pub summary: String,
    pub text: String,
    pub annotations: Vec<CheckAnnotation>,
}

impl CheckRunOut {
    /// Cut to what GitHub takes: each output field within its byte cap, at most
    /// [`MAX_ANNOTATIONS`] annotations.
    fn bounded(&self) -> CheckRunOut {
        let cut = |t: &str| {
            if t.len() <= MAX_CHECK_OUTPUT_BYTES {
                return t.to_string();
            }
            let mut out =
                head_bytes(t, MAX_CHECK_OUTPUT_BYTES - OUTPUT_TRUNCATION_NOTE.len()).to_string();
            out.push_str(OUTPUT_TRUNCATION_NOTE);
            out
        };
        CheckRunOut {
            state: self.state,
            title: head_bytes(&self.title, 1000).to_string(),
            summary: cut(&self.summary),
            text: cut(&self.text),
            annotations: self
                .annotations
                .iter()
                .take(MAX_ANNOTATIONS)
                .cloned()
                .collect(),
        }
    }
}

/// What GitHub holds of a run ichor posted: its id and what it says.
#[derive(Clone)]
struct PostedRun {
    id: u64,
    run: CheckRunOut,
    /// Annotations GitHub holds (from a listing only their count is known).
    annotations: usize,
}

/// A user's role on the repository, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    None,
    Read,
    Triage,
    Write,
    Maintain,
    Admin,
}

impl Permission {
    /// May push to the repository (write, maintain, admin).
    pub fn can_write(self) -> bool {
        self >= Permission::Write
    }

    fn parse(s: &str) -> Option<Permission> {
        match s {
            "none" => Some(Permission::None),
            "read" | "pull" => Some(Permission::Read),
            "triage" => Some(Permission::Triage),
            "write" | "push" => Some(Permission::Write),
            "maintain" => Some(Permission::Maintain),
            "admin" => Some(Permission::Admin),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Pull {
    pub number: u64,
    pub open: bool,
    pub merged: bool,
    pub head_sha: String,
    pub head_ref: String,
    pub base_ref: String,
    /// The head branch lives in another repository (a fork), or its repository is gone.
    pub from_fork: bool,
    pub author: String,
    pub title: String,
    /// The merge commit, once merged (GitHub's test-merge sha of an open PR is left out).
    pub merge_commit_sha: Option<String>,
}

/// What the controller's metrics count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// HTTP answers received (every attempt).
    pub requests: u64,
    /// Attempts repeated after a 5xx, a broken connection, a rate limit or a stale token.
    pub retries: u64,
    /// Answers that were rate-limit refusals.
    pub rate_limited: u64,
    /// 304 answers served from the ETag cache.
    pub not_modified: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error("GitHub client configuration: {0}")]
    Config(String),
    #[error(transparent)]
    App(#[from] AppAuthError),
    #[error("refused before calling GitHub: {0}")]
    Refused(String),
    #[error("{what}: could not reach GitHub: {message}")]
    Transport { what: String, message: String },
    #[error("{what}: GitHub refused the credentials (401): {message}")]
    Unauthorized { what: String, message: String },
    #[error("{what}: GitHub denied access (403): {message}")]
    Forbidden { what: String, message: String },
    #[error("{what}: not found (404); check the repository name and the token's access")]
    NotFound { what: String },
    #[error("{what}: GitHub rejected the request (422): {message}")]
    Validation { what: String, message: String },
    #[error("{what}: GitHub answered {status}: {message}")]
    Api {
        what: String,
        status: u16,
        message: String,
    },
    #[error("{what}: GitHub kept failing ({status}) after {attempts} attempts")]
    Server {
        what: String,
        status: u16,
        attempts: u32,
    },
    #[error("{what}: rate limited; GitHub asks to wait {wait_secs} s more")]
    RateLimited { what: String, wait_secs: u64 },
    #[error("{what}: unexpected answer from GitHub: {message}")]
    Decode { what: String, message: String },
}

impl ForgeError {
    /// How long GitHub asked to wait, when this is a rate limit.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ForgeError::RateLimited { wait_secs, .. } => Some(Duration::from_secs(*wait_secs)),
            _ => None,
        }
    }

    /// Worth trying again later: the network, GitHub's servers, or a rate limit.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ForgeError::Transport { .. }
                | ForgeError::Server { .. }
                | ForgeError::RateLimited { .. }
        )
    }
}

#[derive(Clone)]
pub struct GithubClient {
    inner: Arc<Inner>,
    /// Sleep out a rate limit inside the call (true), or answer
    /// [`ForgeError::RateLimited`] at once (false: the controller's event loop).
    patient: bool,
}

/// Which calls a rate limit holds: GitHub's secondary limits count content creation apart
/// from reads; an exhausted primary window holds both.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Reads,
    Writes,
    All,
}

enum Credentials {
    Token(Secret),
    App {
        auth: AppAuth,
        /// One refresh at a time: concurrent calls wait for it instead of each buying a token.
        refresh: tokio::sync::Mutex<()>,
    },
}

struct Inner {
    http: Octocrab,
    /// The API's base URL, without a trailing slash: a redirect is followed only within it.
    api_url: String,
    /// The repository moved (renamed or transferred): `/repos/{repo}` → where GitHub's
    /// redirect said it is now (`/repositories/{id}`), learnt from the first redirect.
    moved: Mutex<Option<(String, String)>>,
    clock: Clock,
    repo: String,
    login: String,
    credentials: Credentials,
    /// (sha, lower-cased context) → what was last posted or seen there.
    statuses: Mutex<HashMap<(String, String), PostedStatus>>,
    /// (sha, lower-cased check name) → the run this client posted there.
    runs: Mutex<HashMap<(String, String), PostedRun>>,
    /// Request path → the last 200 answer and its ETag.
    etags: Mutex<HashMap<String, Cached>>,
    requests: AtomicU64,
    retries: AtomicU64,
    rate_limited: AtomicU64,
    not_modified: AtomicU64,
    /// No read (0) or write (1) goes out before these times: GitHub warns that requests
    /// sent while limited may get an integration banned.
    held_until: Mutex<[Option<Timestamp>; 2]>,
    /// Secondary limits met in a row without a success in between (the backoff doubles).
    strikes: std::sync::atomic::AtomicU32,
    /// The repository's id, once learnt: webhooks of a renamed or transferred repository
    /// carry its new name but the same id.
    repo_id: Mutex<Option<u64>>,
    /// Whether the log has said once that webhooks name the repository otherwise.
    rename_told: std::sync::atomic::AtomicBool,
}

#[derive(Clone, PartialEq, Eq)]
struct PostedStatus {
    state: StatusState,
    description: String,
    target_url: Option<String>,
}

#[derive(Clone)]
struct Cached {
    etag: HeaderValue,
    headers: HeaderMap,
    body: Bytes,
}

/// One answer: status, headers and the whole (bounded) body.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json<T: for<'de> Deserialize<'de>>(&self, what: &str) -> Result<T, ForgeError> {
        serde_json::from_slice(&self.body).map_err(|e| ForgeError::Decode {
            what: what.to_string(),
            message: e.to_string(),
        })
    }

    fn has_next_page(&self) -> bool {
        self.headers
            .get("link")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|l| l.contains("rel=\"next\""))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ----- serde models of what ichor reads -----

#[derive(Deserialize)]
struct CheckRunsJson {
    check_runs: Vec<CheckRunJson>,
}

#[derive(Deserialize)]
struct CheckRunJson {
    id: u64,
    name: String,
    status: String,
    conclusion: Option<String>,
    app: Option<AppIdJson>,
    output: Option<CheckOutputJson>,
}

#[derive(Deserialize)]
struct AppIdJson {
    id: u64,
}

#[derive(Deserialize)]
struct CheckOutputJson {
    title: Option<String>,
    summary: Option<String>,
    text: Option<String>,
    #[serde(default)]
    annotations_count: usize,
}

#[derive(Deserialize)]
struct UserJson {
    login: String,
}

#[derive(Deserialize)]
struct RepoIdJson {
    id: u64,
    full_name: String,
}

#[derive(Deserialize)]
struct AppJson {
    slug: String,
}

#[derive(Deserialize)]
struct TokenJson {
    token: String,
    expires_at: String,
}

#[derive(Deserialize)]
struct StatusJson {
    state: String,
    context: String,
    description: Option<String>,
    target_url: Option<String>,
}

#[derive(Deserialize)]
struct CommentJson {
    id: u64,
    body: Option<String>,
    user: Option<UserJson>,
}

#[derive(Deserialize)]
struct PermissionJson {
    permission: Option<String>,
    role_name: Option<String>,
}

#[derive(Deserialize)]
struct RepoJson {
    full_name: String,
}

#[derive(Deserialize)]
struct EndJson {
    #[serde(rename = "ref")]
    ref_name: String,
    sha: String,
    repo: Option<RepoJson>,
}

#[derive(Deserialize)]
struct PullJson {
    number: u64,
    state: String,
    merged: Option<bool>,
    merged_at: Option<String>,
    title: Option<String>,
    user: Option<UserJson>,
    head: EndJson,
    base: EndJson,
    merge_commit_sha: Option<String>,
}

impl PullJson {
    fn into_pull(self, repo: &str) -> Pull {
        // The list endpoints leave out `merged`; `merged_at` says the same.
        let merged = self.merged.unwrap_or(self.merged_at.is_some());
        let from_fork = match (&self.head.repo, &self.base.repo) {
            (Some(h), Some(b)) => !h.full_name.eq_ignore_ascii_case(&b.full_name),
            // The head repository's `fork` flag is set for every PR of a repository
            // that is itself a fork: only the names tell.
            (Some(h), None) => !h.full_name.eq_ignore_ascii_case(repo),
            // GitHub drops `head.repo` when the fork was deleted.
            (None, _) => true,
        };
        Pull {
            number: self.number,
            open: self.state == "open",
            merged,
            head_sha: self.head.sha,
            head_ref: self.head.ref_name,
            base_ref: self.base.ref_name,
            from_fork,
            author: self.user.map(|u| u.login).unwrap_or_default(),
            title: self.title.unwrap_or_default(),
            merge_commit_sha: if merged { self.merge_commit_sha } else { None },
        }
    }
}

#[derive(Deserialize)]
struct ErrorJson {
    message: Option<String>,
    errors: Option<Vec<Value>>,
}

// ----- input checks -----

/// `owner/name` with GitHub's characters.
fn check_repo(repo: &str) -> Result<(), ForgeError> {
    let ok_part = |p: &str| {
        !p.is_empty()
            && p.len() <= 100
            && p != "."
            && p != ".."
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    match repo.split_once('/') {
        Some((o, n)) if ok_part(o) && ok_part(n) => Ok(()),
        _ => Err(ForgeError::Config(format!(
            "repository {:?} is not of the form owner/name",
            repo.chars().take(120).collect::<String>()
        ))),
    }
}

fn check_sha(sha: &str) -> Result<(), ForgeError> {
    if (sha.len() == 40 || sha.len() == 64) && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ForgeError::Refused(format!(
            "{:?} is not a full commit sha",
            sha.chars().take(80).collect::<String>()
        )))
    }
}

/// A GitHub login (`[bot]` suffix allowed), safe to put in a path.
fn check_login(login: &str) -> Result<(), ForgeError> {
    let name = login.strip_suffix("[bot]").unwrap_or(login);
    let ok = !name.is_empty()
        && name.len() <= 39
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ForgeError::Refused(format!(
            "{:?} is not a GitHub login",
            login.chars().take(60).collect::<String>()
        )))
    }
}

/// The context as GitHub will store it, or why ichor refuses it.
pub fn check_context(context: &str) -> Result<(), ForgeError> {
    if context.trim().is_empty() {
        return Err(ForgeError::Refused(
            "a status context must not be empty".into(),
        ));
    }
    // Renovate ignores successful statuses named renovate/…, so the gate would not gate.
    if context.to_ascii_lowercase().starts_with("renovate/") {
        return Err(ForgeError::Refused(format!(
            "status context {context:?} starts with renovate/, which Renovate ignores; use another name such as ichor/gate"
        )));
    }
    let n = context.chars().count();
    if n > MAX_CONTEXT_CHARS {
        return Err(ForgeError::Refused(format!(
            "a status context is at most {MAX_CONTEXT_CHARS} characters; this one has {n}"
        )));
    }
    Ok(())
}

/// At most `max` characters, cut on a character boundary and ending with `…` when cut.
pub fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A status description GitHub accepts (≤ 140 characters).
pub fn status_description(description: &str) -> String {
    truncate_chars(description, MAX_DESCRIPTION_CHARS)
}

/// A marker must be one HTML comment, so it is invisible and cannot match everything.
fn check_marker(marker: &str) -> Result<(), ForgeError> {
    let inner = marker
        .strip_prefix("<!--")
        .and_then(|m| m.strip_suffix("-->"));
    match inner {
        Some(i) if !i.trim().is_empty() && !i.contains("--") && marker.len() <= 200 => Ok(()),
        _ => Err(ForgeError::Refused(format!(
            "the sticky-comment marker {:?} is not one HTML comment such as <!-- ichor:lab -->",
            marker.chars().take(80).collect::<String>()
        ))),
    }
}

/// The sticky comment's body: the marker kept, at most GitHub's 262,144 bytes (cut on a
/// character boundary, with a note saying so).
pub fn sticky_body(marker: &str, body: &str) -> String {
    let full = if body.contains(marker) {
        body.to_string()
    } else {
        format!("{marker}\n{body}")
    };
    if full.len() <= MAX_COMMENT_BYTES {
        return full;
    }
    let room = MAX_COMMENT_BYTES - COMMENT_TRUNCATION_NOTE.len();
    let mut cut = head_bytes(&full, room).to_string();
    if !cut.contains(marker) {
        // The marker sat past the cut: put it first so the comment is still ours.
        let room = room - marker.len() - 1;
        cut = format!("{marker}\n{}", head_bytes(&full, room));
    }
    cut.push_str(COMMENT_TRUNCATION_NOTE);
    cut
}

/// The longest start of `s` of at most `max` bytes that ends on a character boundary.
fn head_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// GitHub's message from an error body, bounded and on one line.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<ErrorJson> = serde_json::from_slice(body).ok();
    let mut msg = match parsed {
        Some(e) => {
            let mut m = e.message.unwrap_or_default();
            if let Some(errors) = e.errors {
                let details: Vec<String> = errors
                    .iter()
                    .take(5)
                    .filter_map(|v| {
                        v.get("message")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                            .or_else(|| v.get("code").and_then(Value::as_str).map(str::to_string))
                    })
                    .collect();
                if !details.is_empty() {
                    m = format!("{m} ({})", details.join("; "));
                }
            }
            m
        }
        None => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
    };
    msg.retain(|c| !c.is_control());
    truncate_chars(msg.trim(), 300)
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The longest wait for a secondary limit that gives no `retry-after`.
pub const MAX_SECONDARY_BACKOFF: Duration = Duration::from_secs(16 * 60);

/// How long a rate-limit refusal asks to wait and what it holds, or `None` when it is not
/// one. github/docs content/rest/using-the-rest-api/rate-limits-for-the-rest-api.md
/// ("Exceeding the rate limit"): a primary limit is a 403 or 429 with
/// `x-ratelimit-remaining: 0` (wait for `x-ratelimit-reset`); a secondary limit is a 403
/// or 429 whose message says so — `retry-after` when present, else the reset when the
/// window is spent, else at least a minute, growing exponentially while it persists.
fn rate_limit_wait(
    answer: &Answer,
    now: Timestamp,
    write: bool,
    strikes: u32,
) -> Option<(Duration, Scope)> {
    if !matches!(answer.status.as_u16(), 403 | 429) {
        return None;
    }
    let kind = if write { Scope::Writes } else { Scope::Reads };
    if let Some(secs) = header_u64(&answer.headers, "retry-after") {
        return Some((Duration::from_secs(secs), kind));
    }
    if header_u64(&answer.headers, "x-ratelimit-remaining") == Some(0) {
        if let Some(reset) = header_u64(&answer.headers, "x-ratelimit-reset") {
            let reset = Timestamp::from_millis(reset.saturating_mul(1000));
            // A second past the reset, so the two clocks' rounding cannot land us just before it.
            return Some((reset.since(now) + Duration::from_secs(1), Scope::All));
        }
    }
    let message = error_message(&answer.body).to_ascii_lowercase();
    let secondary = message.contains("secondary rate limit")
        || message.contains("abuse detection")
        || answer.status.as_u16() == 429;
    if secondary {
        let wait = Duration::from_secs(60).saturating_mul(1u32 << strikes.min(4));
        return Some((wait.min(MAX_SECONDARY_BACKOFF), kind));
    }
    None
}

impl GithubClient {
    /// Authenticate and learn this client's login: `GET /user` for a token; for an App,
    /// `GET /app` (its slug makes `<slug>[bot]`) and a first installation token.
    pub async fn connect(config: GithubConfig, clock: Clock) -> Result<GithubClient, ForgeError> {
        check_repo(&config.repo)?;
        let api_url = config.api_url.trim_end_matches('/');
        let uri = Uri::from_str(api_url)
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some())
            .ok_or_else(|| {
                ForgeError::Config(format!(
                    "api_url {:?} is not an http(s) URL",
                    api_url.chars().take(200).collect::<String>()
                ))
            })?;
        let http = Octocrab::builder()
            .base_uri(uri)
            .map_err(|e| ForgeError::Config(format!("api_url: {e}")))?
            // Failure guards only: GitHub answers within seconds or not at all.
            .set_connect_timeout(Some(Duration::from_secs(15)))
            .set_read_timeout(Some(Duration::from_secs(60)))
            .build()
            .map_err(|e| ForgeError::Config(format!("building the HTTP client: {e}")))?;
        let credentials = match config.auth {
            GithubAuth::Token(token) => Credentials::Token(token),
            GithubAuth::App {
                app_id,
                installation_id,
                private_key,
            } => Credentials::App {
                auth: AppAuth::new(app_id, installation_id, &private_key, clock.clone())?,
                refresh: tokio::sync::Mutex::new(()),
            },
        };
        let mut client = GithubClient {
            inner: Arc::new(Inner {
                http,
                api_url: api_url.to_string(),
                moved: Mutex::new(None),
                clock,
                repo: config.repo,
                login: String::new(),
                credentials,
                statuses: Mutex::new(HashMap::new()),
                runs: Mutex::new(HashMap::new()),
                etags: Mutex::new(HashMap::new()),
                requests: AtomicU64::new(0),
                retries: AtomicU64::new(0),
                rate_limited: AtomicU64::new(0),
                not_modified: AtomicU64::new(0),
                held_until: Mutex::new([None, None]),
                strikes: std::sync::atomic::AtomicU32::new(0),
                repo_id: Mutex::new(None),
                rename_told: std::sync::atomic::AtomicBool::new(false),
            }),
            patient: true,
        };
        let login = match &client.inner.credentials {
            Credentials::Token(_) => {
                let a = client
                    .call(Method::GET, "/user".into(), None, false, "GET /user")
                    .await?;
                a.json::<UserJson>("GET /user")?.login
            }
            Credentials::App { auth, .. } => {
                let a = client
                    .app_call(auth, Method::GET, "/app".into(), None, "GET /app")
                    .await?;
                let slug = a.json::<AppJson>("GET /app")?.slug;
                // Buy the first token now, so a wrong installation id fails at start-up.
                client.installation_token(false).await?;
                format!("{slug}[bot]")
            }
        };
        // Not shared yet: the only handle is this one.
        Arc::get_mut(&mut client.inner)
            .ok_or_else(|| ForgeError::Config("the client was shared while connecting".into()))?
            .login = login;
        Ok(client)
    }

    pub fn login(&self) -> &str {
        &self.inner.login
    }

    /// The same client (same caches, same rate-limit holds) answering a rate limit with
    /// [`ForgeError::RateLimited`] at once instead of sleeping it out.
    pub fn impatient(&self) -> GithubClient {
        GithubClient {
            inner: self.inner.clone(),
            patient: false,
        }
    }

    /// The same client sleeping out rate limits (on the clock) inside each call.
    pub fn patient(&self) -> GithubClient {
        GithubClient {
            inner: self.inner.clone(),
            patient: true,
        }
    }

    /// Until when calls of this kind are held by a rate limit, if they are.
    fn held(&self, write: bool) -> Option<Timestamp> {
        let now = self.inner.clock.now();
        lock(&self.inner.held_until)[usize::from(write)].filter(|t| now < *t)
    }

    fn hold(&self, scope: Scope, until: Timestamp) {
        let mut h = lock(&self.inner.held_until);
        let slots: &[usize] = match scope {
            Scope::Reads => &[0],
            Scope::Writes => &[1],
            Scope::All => &[0, 1],
        };
        for &i in slots {
            h[i] = Some(h[i].map_or(until, |t| t.max(until)));
        }
    }

    pub fn repo(&self) -> &str {
        &self.inner.repo
    }

    /// The repository's id, when known (see [`GithubClient::learn_repository_id`]).
    pub fn repository_id(&self) -> Option<u64> {
        *lock(&self.inner.repo_id)
    }

    /// Ask GitHub for the repository's id (`GET /repos/{owner}/{repo}`, following a rename's
    /// redirect), once: later calls answer from memory.
    pub async fn learn_repository_id(&self) -> Result<u64, ForgeError> {
        if let Some(id) = self.repository_id() {
            return Ok(id);
        }
        let what = "GET /repos/{owner}/{repo}";
        let answer = self
            .call(
                Method::GET,
                format!("/repos/{}", self.inner.repo),
                None,
                false,
                what,
            )
            .await?;
        let repo = answer.json::<RepoIdJson>(what)?;
        if !repo.full_name.eq_ignore_ascii_case(&self.inner.repo) {
            self.told_renamed(&repo.full_name);
        }
        *lock(&self.inner.repo_id) = Some(repo.id);
        Ok(repo.id)
    }

    /// Whether a webhook's `repository` is the configured one: by name, or, for a renamed
    /// or transferred repository (whose webhooks carry the new name), by its id.
    pub fn is_this_repository(&self, full_name: &str, id: Option<u64>) -> bool {
        if full_name.eq_ignore_ascii_case(&self.inner.repo) {
            return true;
        }
        let same = id.is_some() && id == self.repository_id();
        if same {
            self.told_renamed(full_name);
        }
        same
    }

    fn told_renamed(&self, now: &str) {
        if !self.inner.rename_told.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                repository = %self.inner.repo,
                now_named = %crate::escape::clip(now, 200),
                "GitHub names the repository otherwise now (renamed or transferred); ichor follows it by its id — update github.repository"
            );
        }
    }

    pub fn stats(&self) -> ClientStats {
        ClientStats {
            requests: self.inner.requests.load(Ordering::Relaxed),
            retries: self.inner.retries.load(Ordering::Relaxed),
            rate_limited: self.inner.rate_limited.load(Ordering::Relaxed),
            not_modified: self.inner.not_modified.load(Ordering::Relaxed),
        }
    }

    /// Post a commit status unless the newest status of (sha, context) already says the
    /// same; true when posted.
    pub async fn set_status(
        &self,
        sha: &str,
        context: &str,
        state: StatusState,
        description: &str,
        target_url: Option<&str>,
    ) -> Result<bool, ForgeError> {
        check_sha(sha)?;
        check_context(context)?;
        let sha = sha.to_ascii_lowercase();
        let wanted = PostedStatus {
            state,
            description: status_description(description),
            target_url: target_url.map(str::to_string),
        };
        // GitHub compares contexts without regard to case.
        let key = (sha.clone(), context.to_lowercase());
        let known = lock(&self.inner.statuses).get(&key).cloned();
        let newest = match known {
            Some(k) => Some(k),
            None => self.newest_status(&sha, context).await?,
        };
        if newest.as_ref() == Some(&wanted) {
            self.remember_status(key, wanted);
            return Ok(false);
        }
        let mut body = json!({
            "state": state.as_str(),
            "context": context,
            "description": wanted.description,
        });
        if let Some(url) = target_url {
            body["target_url"] = json!(url);
        }
        let what = format!("POST status {context} on {}", &sha[..12]);
        self.call(
            Method::POST,
            format!("/repos/{}/statuses/{sha}", self.inner.repo),
            Some(body),
            false,
            &what,
        )
        .await?;
        self.remember_status(key, wanted);
        Ok(true)
    }

    fn remember_status(&self, key: (String, String), status: PostedStatus) {
        let mut map = lock(&self.inner.statuses);
        if map.len() >= MAX_CACHE_ENTRIES && !map.contains_key(&key) {
            map.clear();
        }
        map.insert(key, status);
    }

    /// Authenticated as a GitHub App installation: check runs are open to it.
    pub fn is_app(&self) -> bool {
        matches!(self.inner.credentials, Credentials::App { .. })
    }

    /// Post the check run `name` on `sha` unless this App's newest run there already says
    /// the same; true when something was sent. The run is edited in place (one run per
    /// name and commit, however often it changes), except when its annotations change:
    /// GitHub appends annotations on every update and never removes one, so new ones go on
    /// a new run, which GitHub then shows as the check's result.
    pub async fn upsert_check_run(
        &self,
        sha: &str,
        name: &str,
        run: &CheckRunOut,
    ) -> Result<bool, ForgeError> {
        check_sha(sha)?;
        check_context(name)?;
        let Credentials::App { auth, .. } = &self.inner.credentials else {
            return Err(ForgeError::Config(
                "check runs need a GitHub App (GitHub refuses them to a token)".into(),
            ));
        };
        let app_id = auth.app_id();
        let sha = sha.to_ascii_lowercase();
        let wanted = run.bounded();
        let key = (sha.clone(), name.to_lowercase());
        let known = lock(&self.inner.runs).get(&key).cloned();
        let posted = match known {
            Some(p) => Some(p),
            None => self.newest_run(&sha, name, app_id).await?,
        };
        // A listing tells only how many annotations a run holds: unless that is none and
        // none are wanted, they count as different.
        let same_annotations = |p: &PostedRun| {
            p.annotations == wanted.annotations.len() && p.run.annotations == wanted.annotations
        };
        let mut body = json!({
            "status": wanted.state.status(),
            "output": {
                "title": wanted.title,
                "summary": wanted.summary,
                "text": wanted.text,
            },
        });
        if let Some(c) = wanted.state.conclusion() {
            body["conclusion"] = json!(c);
        }
        let (method, path, what) = match &posted {
            Some(p) if same_annotations(p) => {
                if p.run == wanted {
                    return Ok(false);
                }
                (
                    Method::PATCH,
                    format!("/repos/{}/check-runs/{}", self.inner.repo, p.id),
                    format!("PATCH check run {name} on {}", &sha[..12]),
                )
            }
            _ => {
                body["name"] = json!(name);
                body["head_sha"] = json!(sha);
                body["output"]["annotations"] = Value::Array(
                    wanted
                        .annotations
                        .iter()
                        .map(|a| {
                            json!({
                                "path": a.path,
                                "start_line": a.line,
                                "end_line": a.line,
                                "annotation_level": a.level,
                                "title": head_bytes(&a.title, 255),
                                "message": head_bytes(&a.message, 64 * 1024),
                            })
                        })
                        .collect(),
                );
                (
                    Method::POST,
                    format!("/repos/{}/check-runs", self.inner.repo),
                    format!("POST check run {name} on {}", &sha[..12]),
                )
            }
        };
        let a = self.call(method, path, Some(body), false, &what).await?;
        let id = a.json::<CheckRunJson>(&what)?.id;
        let annotations = wanted.annotations.len();
        let mut map = lock(&self.inner.runs);
        if map.len() >= MAX_CACHE_ENTRIES && !map.contains_key(&key) {
            map.clear();
        }
        map.insert(
            key,
            PostedRun {
                id,
                run: wanted,
                annotations,
            },
        );
        Ok(true)
    }

    /// This App's newest run named `name` on `sha`, as GitHub lists it.
    async fn newest_run(
        &self,
        sha: &str,
        name: &str,
        app_id: u64,
    ) -> Result<Option<PostedRun>, ForgeError> {
        let what = format!("GET check runs of {}", &sha[..12]);
        let a = self
            .call(
                Method::GET,
                format!(
                    "/repos/{}/commits/{sha}/check-runs?check_name={}&app_id={app_id}&filter=latest&per_page=100",
                    self.inner.repo,
                    query_escape(name)
                ),
                None,
                false,
                &what,
            )
            .await?;
        let list: CheckRunsJson = a.json(&what)?;
        let Some(r) = list.check_runs.into_iter().find(|r| {
            r.name.eq_ignore_ascii_case(name) && r.app.as_ref().is_some_and(|a| a.id == app_id)
        }) else {
            return Ok(None);
        };
        let conclusion = match r.conclusion.as_deref() {
            Some("success") => Some(Conclusion::Success),
            Some("failure") => Some(Conclusion::Failure),
            Some("neutral") => Some(Conclusion::Neutral),
            Some("skipped") => Some(Conclusion::Skipped),
            Some("cancelled") => Some(Conclusion::Cancelled),
            Some("action_required") => Some(Conclusion::ActionRequired),
            _ => None,
        };
        let state = match (r.status.as_str(), conclusion) {
            ("completed", Some(c)) => RunState::Completed(c),
            ("queued", _) => RunState::Queued,
            _ => RunState::InProgress,
        };
        let output = r.output.unwrap_or(CheckOutputJson {
            title: None,
            summary: None,
            text: None,
            annotations_count: 0,
        });
        Ok(Some(PostedRun {
            id: r.id,
            run: CheckRunOut {
                state,
                title: output.title.unwrap_or_default(),
                summary: output.summary.unwrap_or_default(),
                text: output.text.unwrap_or_default(),
                annotations: vec![],
            },
            annotations: output.annotations_count,
        }))
    }

    /// The newest status of `context` on `sha` (GitHub lists newest first).
    async fn newest_status(
        &self,
        sha: &str,
        context: &str,
    ) -> Result<Option<PostedStatus>, ForgeError> {
        let what = format!("GET statuses of {}", &sha[..12]);
        for page in 1..=MAX_STATUS_PAGES {
            let a = self
                .call(
                    Method::GET,
                    format!(
                        "/repos/{}/commits/{sha}/statuses?per_page=100&page={page}",
                        self.inner.repo
                    ),
                    None,
                    false,
                    &what,
                )
                .await?;
            let list: Vec<StatusJson> = a.json(&what)?;
            if let Some(s) = list
                .iter()
                .find(|s| s.context.eq_ignore_ascii_case(context))
            {
                return Ok(StatusState::parse(&s.state).map(|state| PostedStatus {
                    state,
                    description: s.description.clone().unwrap_or_default(),
                    target_url: s.target_url.clone(),
                }));
            }
            if !a.has_next_page() {
                break;
            }
        }
        Ok(None)
    }

    /// The one comment on `pr` written by this client's login that contains `marker` (an
    /// HTML comment): edit it in place when the body differs, else create it. Returns its
    /// id.
    pub async fn upsert_comment(
        &self,
        pr: u64,
        marker: &str,
        body: &str,
    ) -> Result<u64, ForgeError> {
        check_marker(marker)?;
        let body = sticky_body(marker, body);
        let what = format!("GET comments of #{pr}");
        let mut ours: Option<(u64, String)> = None;
        'pages: for page in 1..=MAX_COMMENT_PAGES {
            let a = self
                .call(
                    Method::GET,
                    format!(
                        "/repos/{}/issues/{pr}/comments?per_page=100&page={page}",
                        self.inner.repo
                    ),
                    None,
                    true,
                    &what,
                )
                .await?;
            let list: Vec<CommentJson> = a.json(&what)?;
            for c in list {
                // Author and marker both: someone pasting our marker must not capture it.
                let by_us = c
                    .user
                    .as_ref()
                    .is_some_and(|u| u.login.eq_ignore_ascii_case(&self.inner.login));
                let text = c.body.unwrap_or_default();
                if by_us && text.contains(marker) {
                    ours = Some((c.id, text));
                    break 'pages;
                }
            }
            if !a.has_next_page() {
                break;
            }
        }
        match ours {
            Some((id, text)) if text == body => Ok(id),
            Some((id, _)) => {
                let what = format!("PATCH comment {id} on #{pr}");
                let a = self
                    .call(
                        Method::PATCH,
                        format!("/repos/{}/issues/comments/{id}", self.inner.repo),
                        Some(json!({ "body": body })),
                        false,
                        &what,
                    )
                    .await?;
                Ok(a.json::<CommentJson>(&what)?.id)
            }
            None => self.create_comment(pr, &body).await,
        }
    }

    /// A new comment on `pr` (the body capped at GitHub's limit). Returns its id.
    pub async fn post_comment(&self, pr: u64, body: &str) -> Result<u64, ForgeError> {
        let body = if body.len() > MAX_COMMENT_BYTES {
            let mut cut =
                head_bytes(body, MAX_COMMENT_BYTES - COMMENT_TRUNCATION_NOTE.len()).to_string();
            cut.push_str(COMMENT_TRUNCATION_NOTE);
            cut
        } else {
            body.to_string()
        };
        self.create_comment(pr, &body).await
    }

    async fn create_comment(&self, pr: u64, body: &str) -> Result<u64, ForgeError> {
        let what = format!("POST comment on #{pr}");
        let a = self
            .call(
                Method::POST,
                format!("/repos/{}/issues/{pr}/comments", self.inner.repo),
                Some(json!({ "body": body })),
                false,
                &what,
            )
            .await?;
        Ok(a.json::<CommentJson>(&what)?.id)
    }

    /// `user`'s role on the repository; a user GitHub does not know has none.
    pub async fn permission(&self, user: &str) -> Result<Permission, ForgeError> {
        check_login(user)?;
        let what = format!("GET permission of {user}");
        let answer = self
            .call(
                Method::GET,
                format!("/repos/{}/collaborators/{user}/permission", self.inner.repo),
                None,
                false,
                &what,
            )
            .await;
        let a = match answer {
            Ok(a) => a,
            Err(ForgeError::NotFound { .. }) => return Ok(Permission::None),
            Err(e) => return Err(e),
        };
        let p: PermissionJson = a.json(&what)?;
        // `role_name` is the full role; `permission` folds maintain and triage away, and is
        // the fallback for custom roles.
        let role = p.role_name.as_deref().and_then(Permission::parse);
        let coarse = p.permission.as_deref().and_then(Permission::parse);
        role.or(coarse).ok_or_else(|| ForgeError::Decode {
            what,
            message: "no known permission in the answer".into(),
        })
    }

    /// Every open pull request (up to 2,000).
    pub async fn open_pulls(&self) -> Result<Vec<Pull>, ForgeError> {
        let what = "GET open pulls";
        let mut pulls = Vec::new();
        for page in 1..=MAX_PULL_PAGES {
            let a = self
                .call(
                    Method::GET,
                    format!(
                        "/repos/{}/pulls?state=open&per_page=100&page={page}",
                        self.inner.repo
                    ),
                    None,
                    true,
                    what,
                )
                .await?;
            let list: Vec<PullJson> = a.json(what)?;
            pulls.extend(list.into_iter().map(|p| p.into_pull(&self.inner.repo)));
            if !a.has_next_page() {
                break;
            }
        }
        Ok(pulls)
    }

    pub async fn pull(&self, number: u64) -> Result<Pull, ForgeError> {
        let what = format!("GET pull #{number}");
        let a = self
            .call(
                Method::GET,
                format!("/repos/{}/pulls/{number}", self.inner.repo),
                None,
                false,
                &what,
            )
            .await?;
        Ok(a.json::<PullJson>(&what)?.into_pull(&self.inner.repo))
    }

    /// The pull requests `sha` belongs to (the merged PR of a merge commit, the open PRs
    /// whose head contains it).
    pub async fn pulls_for_commit(&self, sha: &str) -> Result<Vec<Pull>, ForgeError> {
        check_sha(sha)?;
        let what = format!("GET pulls of {}", &sha[..12]);
        let a = self
            .call(
                Method::GET,
                format!(
                    "/repos/{}/commits/{sha}/pulls?per_page=100",
                    self.inner.repo
                ),
                None,
                false,
                &what,
            )
            .await?;
        let list: Vec<PullJson> = a.json(&what)?;
        Ok(list
            .into_iter()
            .map(|p| p.into_pull(&self.inner.repo))
            .collect())
    }

    // ----- HTTP -----

    /// The installation token, bought with a fresh JWT when none is cached or less than
    /// five minutes of it remain (`force` buys one regardless).
    async fn installation_token(&self, force: bool) -> Result<Secret, ForgeError> {
        let Credentials::App { auth, refresh } = &self.inner.credentials else {
            return Err(ForgeError::Config("not a GitHub App client".into()));
        };
        if !force {
            if let Some(t) = auth.current_token() {
                return Ok(t);
            }
        }
        let _one_at_a_time = refresh.lock().await;
        if !force {
            // Someone else may have refreshed while this call waited.
            if let Some(t) = auth.current_token() {
                return Ok(t);
            }
        }
        let what = format!(
            "POST access token for installation {}",
            auth.installation_id()
        );
        // Narrowed to the one repository and what ichor does with it: an installation on
        // a whole organisation must not hand ichor write on every repository.
        let name = self.inner.repo.split('/').nth(1).unwrap_or_default();
        let body = json!({
            "repositories": [name],
            "permissions": TOKEN_PERMISSIONS
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect::<serde_json::Map<_, _>>(),
        });
        let a = self
            .app_call(
                auth,
                Method::POST,
                format!(
                    "/app/installations/{}/access_tokens",
                    auth.installation_id()
                ),
                Some(body),
                &what,
            )
            .await?;
        let t: TokenJson = a.json(&what)?;
        let expires_at =
            Timestamp::parse_rfc3339(&t.expires_at).ok_or_else(|| ForgeError::Decode {
                what: what.clone(),
                message: format!(
                    "expires_at {:?} is not an RFC 3339 UTC time",
                    t.expires_at.chars().take(40).collect::<String>()
                ),
            })?;
        let token = Secret::new(t.token);
        auth.remember(InstallationToken {
            token: token.clone(),
            expires_at,
        });
        Ok(token)
    }

    /// A call authenticated with the App's JWT (signed afresh for each attempt).
    async fn app_call(
        &self,
        auth: &AppAuth,
        method: Method,
        path: String,
        body: Option<Value>,
        what: &str,
    ) -> Result<Answer, ForgeError> {
        self.send(method, path, body, false, what, &|| {
            let auth = auth.clone();
            async move { Ok(auth.jwt()?) }
        })
        .await
    }

    /// A call authenticated with the token or the installation token.
    async fn call(
        &self,
        method: Method,
        path: String,
        body: Option<Value>,
        conditional: bool,
        what: &str,
    ) -> Result<Answer, ForgeError> {
        self.send(method, path, body, conditional, what, &|| async {
            match &self.inner.credentials {
                Credentials::Token(t) => Ok(t.clone()),
                Credentials::App { .. } => self.installation_token(false).await,
            }
        })
        .await
    }

    /// Send with retries: 5xx and broken connections back off on the clock, rate limits
    /// wait as GitHub asks, a refused installation token is replaced once. A 304 answers
    /// from the ETag cache.
    async fn send<F, Fut>(
        &self,
        method: Method,
        path: String,
        body: Option<Value>,
        conditional: bool,
        what: &str,
        bearer: &F,
    ) -> Result<Answer, ForgeError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Secret, ForgeError>>,
    {
        let inner = &self.inner;
        let mut failures = 0u32;
        let mut waits = 0u32;
        let mut redirects = 0u32;
        let mut token_renewed = false;
        let mut clock_corrected = false;
        let write = method != Method::GET;
        // Once GitHub said the repository moved, its calls go straight to where it is.
        let mut path = match &*lock(&inner.moved) {
            Some((old, new)) if path.starts_with(old.as_str()) => {
                format!("{new}{}", &path[old.len()..])
            }
            _ => path,
        };
        loop {
            // A limit met earlier holds this call too: nothing is sent until it is over.
            if let Some(until) = self.held(write) {
                let wait = until.since(inner.clock.now());
                waits += 1;
                if !self.patient || waits > MAX_RATE_LIMIT_WAITS {
                    return Err(ForgeError::RateLimited {
                        what: what.to_string(),
                        wait_secs: wait.as_secs().max(1),
                    });
                }
                inner.clock.sleep(wait).await;
                continue;
            }
            let token = bearer().await?;
            let cached = if conditional && method == Method::GET {
                lock(&inner.etags).get(&path).cloned()
            } else {
                None
            };
            let result = self
                .attempt(&method, &path, body.as_ref(), &token, cached.as_ref(), what)
                .await;
            let answer = match result {
                Ok(a) => a,
                Err(e @ ForgeError::Transport { .. }) => {
                    failures += 1;
                    if failures >= MAX_ATTEMPTS {
                        return Err(e);
                    }
                    tracing::warn!(what, error = %e, "GitHub unreachable; retrying");
                    inner.retries.fetch_add(1, Ordering::Relaxed);
                    inner.clock.sleep(backoff(failures)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            inner.requests.fetch_add(1, Ordering::Relaxed);
            let status = answer.status;
            if status == StatusCode::NOT_MODIFIED {
                if let Some(c) = cached {
                    inner.not_modified.fetch_add(1, Ordering::Relaxed);
                    return Ok(Answer {
                        status: StatusCode::OK,
                        headers: c.headers,
                        body: c.body,
                    });
                }
            }
            if status.is_success() {
                inner.strikes.store(0, Ordering::Relaxed);
                if conditional && method == Method::GET {
                    if let Some(etag) = answer.headers.get("etag").cloned() {
                        let mut etags = lock(&inner.etags);
                        if etags.len() >= MAX_CACHE_ENTRIES && !etags.contains_key(&path) {
                            etags.clear();
                        }
                        etags.insert(
                            path.clone(),
                            Cached {
                                etag,
                                headers: answer.headers.clone(),
                                body: answer.body.clone(),
                            },
                        );
                    }
                }
                return Ok(answer);
            }
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                // A renamed or transferred repository answers 301 (GET) or 307 (the rest);
                // followed within this API only, never to another origin with the token.
                redirects += 1;
                let location = answer
                    .headers
                    .get(http::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let within = location
                    .strip_prefix(inner.api_url.as_str())
                    .filter(|rest| rest.starts_with('/'));
                let Some(rest) = within.filter(|_| redirects <= MAX_REDIRECTS) else {
                    return Err(ForgeError::Api {
                        what: what.to_string(),
                        status: status.as_u16(),
                        message: format!(
                            "redirected to {}: not followed (another origin, or more than {MAX_REDIRECTS} redirects)",
                            crate::escape::clip(&crate::controller::config::redact_url(location), 200)
                        ),
                    });
                };
                let old = format!("/repos/{}", inner.repo);
                if let Some(suffix) = path.strip_prefix(old.as_str()) {
                    if let Some(new) = rest.strip_suffix(suffix).filter(|n| !n.is_empty()) {
                        let mut moved = lock(&inner.moved);
                        if moved.is_none() {
                            tracing::warn!(
                                repository = %inner.repo,
                                now_at = %new,
                                "GitHub says the repository moved (renamed or transferred); following its redirects — update github.repository"
                            );
                            *moved = Some((old.clone(), new.to_string()));
                        }
                    }
                }
                path = rest.to_string();
                continue;
            }
            let strikes = inner.strikes.load(Ordering::Relaxed);
            if let Some((wait, scope)) = rate_limit_wait(&answer, inner.clock.now(), write, strikes)
            {
                inner.rate_limited.fetch_add(1, Ordering::Relaxed);
                if scope != Scope::All {
                    inner.strikes.fetch_add(1, Ordering::Relaxed);
                }
                let wait = wait.min(MAX_RATE_LIMIT_WAIT);
                self.hold(scope, inner.clock.now().plus(wait));
                tracing::warn!(
                    what,
                    wait_secs = wait.as_secs(),
                    status = status.as_u16(),
                    "GitHub rate limit; holding calls until it is over"
                );
                inner.retries.fetch_add(1, Ordering::Relaxed);
                // The loop at the top waits (or answers RateLimited) for the hold.
                continue;
            }
            if status.is_server_error() {
                failures += 1;
                if failures >= MAX_ATTEMPTS {
                    return Err(ForgeError::Server {
                        what: what.to_string(),
                        status: status.as_u16(),
                        attempts: failures,
                    });
                }
                tracing::warn!(
                    what,
                    status = status.as_u16(),
                    "GitHub server error; retrying"
                );
                inner.retries.fetch_add(1, Ordering::Relaxed);
                inner.clock.sleep(backoff(failures)).await;
                continue;
            }
            let message = error_message(&answer.body);
            let what = what.to_string();
            // A JWT refused for its times: the clocks disagree. Sign again on GitHub's
            // time, from its `Date`, once (octokit/auth-app.js src/hook.ts does the same).
            if status == StatusCode::UNAUTHORIZED && !clock_corrected && is_jwt_time_error(&message)
            {
                let github_now = answer
                    .headers
                    .get(http::header::DATE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(Timestamp::parse_http_date);
                if let (Some(at), Credentials::App { auth, .. }) = (github_now, &inner.credentials)
                {
                    clock_corrected = true;
                    let skew = auth.correct_clock(at);
                    tracing::warn!(
                        what,
                        skew_secs = skew,
                        "GitHub refused the App's JWT for its times: this host's clock is off; signing on GitHub's time"
                    );
                    inner.retries.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            return Err(match status.as_u16() {
                401 => {
                    let is_installation = matches!(inner.credentials, Credentials::App { .. })
                        && !path.starts_with("/app");
                    if is_installation && !token_renewed {
                        // Revoked, or the clocks disagree on its expiry: buy a new one once.
                        token_renewed = true;
                        if let Credentials::App { auth, .. } = &inner.credentials {
                            auth.forget();
                        }
                        inner.retries.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    ForgeError::Unauthorized { what, message }
                }
                403 => ForgeError::Forbidden { what, message },
                404 => ForgeError::NotFound { what },
                422 => ForgeError::Validation { what, message },
                other => ForgeError::Api {
                    what,
                    status: other,
                    message,
                },
            });
        }
    }

    /// One HTTP exchange through octocrab.
    async fn attempt(
        &self,
        method: &Method,
        path: &str,
        body: Option<&Value>,
        token: &Secret,
        cached: Option<&Cached>,
        what: &str,
    ) -> Result<Answer, ForgeError> {
        let transport = |message: String| ForgeError::Transport {
            what: what.to_string(),
            message,
        };
        let uri = Uri::from_str(path).map_err(|e| ForgeError::Refused(format!("{what}: {e}")))?;
        let mut auth =
            HeaderValue::from_str(&format!("Bearer {}", token.expose())).map_err(|_| {
                ForgeError::Config("the token has characters HTTP headers cannot carry".into())
            })?;
        auth.set_sensitive(true);
        let mut builder = http::Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(AUTHORIZATION, auth)
            .header(ACCEPT, "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            // GitHub refuses a request without one, and asks that it name the client.
            .header(
                http::header::USER_AGENT,
                concat!("ichor/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(c) = cached {
            builder = builder.header(IF_NONE_MATCH, c.etag.clone());
        }
        let request = self
            .inner
            .http
            .build_request(builder, body)
            .map_err(|e| ForgeError::Refused(format!("{what}: building the request: {e}")))?;
        let response = self
            .inner
            .http
            .execute(request)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(
            axum::body::Body::new(response.into_body()),
            MAX_RESPONSE_BYTES,
        )
        .await
        .map_err(|e| {
            transport(format!(
                "reading the answer (at most {MAX_RESPONSE_BYTES} bytes): {e}"
            ))
        })?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

/// What an installation token is narrowed to (docs/run.md lists why each).
pub const TOKEN_PERMISSIONS: [(&str, &str); 5] = [
    ("checks", "write"),
    ("pull_requests", "write"),
    ("issues", "write"),
    ("contents", "read"),
    ("metadata", "read"),
];

/// GitHub's 401 texts for a JWT whose `iat` or `exp` its clock does not accept.
fn is_jwt_time_error(message: &str) -> bool {
    message.contains("'Expiration time' claim ('exp')")
        || message.contains("'Issued at' claim ('iat')")
}

/// A query value with everything but unreserved characters and `/` percent-encoded.
fn query_escape(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Redirects followed for one call.
const MAX_REDIRECTS: u32 = 3;

/// 1 s, 2 s, 4 s, … after the first, second, third failure.
fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1u32 << failures.saturating_sub(1).min(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_are_cut_on_a_char_boundary_with_an_ellipsis() {
        assert_eq!(status_description("short"), "short");
        let exact = "a".repeat(140);
        assert_eq!(status_description(&exact), exact);
        let long = "é".repeat(200);
        let cut = status_description(&long);
        assert_eq!(cut.chars().count(), 140);
        assert!(cut.ends_with('…'));
        assert!(cut.starts_with("éé"));
    }

    #[test]
    fn contexts_renovate_ignores_or_github_refuses_are_refused() {
        assert!(check_context("ichor/gate").is_ok());
        assert!(check_context("renovate/stability-days").is_err());
        assert!(check_context("Renovate/x").is_err());
        assert!(check_context("").is_err());
        assert!(check_context(&"c".repeat(255)).is_ok());
        assert!(check_context(&"c".repeat(256)).is_err());
    }

    #[test]
    fn sticky_bodies_keep_the_marker_and_githubs_limit() {
        let m = "<!-- ichor:lab -->";
        assert_eq!(sticky_body(m, "hello"), format!("{m}\nhello"));
        assert_eq!(sticky_body(m, &format!("x {m} y")), format!("x {m} y"));
        let huge = format!("{}{m}", "z".repeat(300_000));
        let cut = sticky_body(m, &huge);
        assert_eq!(cut.len(), MAX_COMMENT_BYTES);
        // Many characters fit below the bytes: nothing is cut for 70,000 ASCII ones.
        assert!(!sticky_body(m, &"z".repeat(70_000)).contains("truncated"));
        // Cut on a character boundary: 4-byte characters never split.
        let emoji = sticky_body(m, &"🌈".repeat(70_000));
        assert!(emoji.len() <= MAX_COMMENT_BYTES && emoji.ends_with("bytes)"));
        assert!(cut.starts_with(m), "the marker survives the cut");
        assert!(cut.ends_with("262,144 bytes)"));
        assert!(check_marker(m).is_ok());
        for bad in ["", "ichor", "<!---->", "<!-- a -- b -->", "<!-- x"] {
            assert!(check_marker(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn permissions_order_and_write_access() {
        assert!(Permission::Admin.can_write());
        assert!(Permission::Maintain.can_write());
        assert!(Permission::Write.can_write());
        assert!(!Permission::Triage.can_write());
        assert!(!Permission::Read.can_write());
        assert!(!Permission::None.can_write());
        assert_eq!(Permission::parse("push"), Some(Permission::Write));
    }

    #[test]
    fn rate_limit_answers_say_how_long_to_wait() {
        let now = Timestamp(1_767_225_600_000);
        let answer = |status: u16, headers: &[(&'static str, &str)], body: &str| {
            let mut h = HeaderMap::new();
            for (k, v) in headers {
                h.insert(*k, HeaderValue::from_str(v).unwrap());
            }
            Answer {
                status: StatusCode::from_u16(status).unwrap(),
                headers: h,
                body: Bytes::from(body.to_string()),
            }
        };
        let wait = |a: &Answer, write: bool, strikes: u32| {
            rate_limit_wait(a, now, write, strikes).map(|(d, s)| (d.as_secs(), s as u8))
        };
        let (reads, writes, all) = (Scope::Reads as u8, Scope::Writes as u8, Scope::All as u8);
        assert_eq!(
            wait(&answer(403, &[("retry-after", "30")], ""), true, 0),
            Some((30, writes))
        );
        let reset = (now.as_millis() / 1000 + 100).to_string();
        let spent = answer(
            403,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &reset),
            ],
            "",
        );
        assert_eq!(wait(&spent, false, 0), Some((101, all)));
        // A secondary limit without `retry-after` and with requests left in the primary
        // window: a minute, doubling while it persists, as GitHub documents.
        let secondary = r#"{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/rest"}"#;
        let limited = answer(403, &[("x-ratelimit-remaining", "4000")], secondary);
        assert_eq!(wait(&limited, false, 0), Some((60, reads)));
        assert_eq!(wait(&limited, false, 2), Some((240, reads)));
        assert_eq!(wait(&limited, false, 30), Some((16 * 60, reads)));
        assert_eq!(
            wait(
                &answer(429, &[("x-ratelimit-remaining", "10")], ""),
                true,
                0
            ),
            Some((60, writes))
        );
        // A plain 403 (no permission) is not a rate limit.
        let denied = r#"{"message":"Resource not accessible by personal access token"}"#;
        assert_eq!(
            wait(
                &answer(403, &[("x-ratelimit-remaining", "10")], denied),
                false,
                0
            ),
            None
        );
        assert_eq!(
            wait(&answer(500, &[("retry-after", "5")], ""), false, 0),
            None
        );
    }

    #[test]
    fn input_checks() {
        assert!(check_repo("home/ops").is_ok());
        for bad in ["home", "home/ops/x", "/ops", "ho me/ops", "../x"] {
            assert!(check_repo(bad).is_err(), "{bad}");
        }
        assert!(check_login("renovate[bot]").is_ok());
        assert!(check_login("../admin").is_err());
        assert!(check_sha(&"a".repeat(40)).is_ok());
        assert!(check_sha("main").is_err());
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(1024));
    }
}
