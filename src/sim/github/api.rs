//! The HTTP face: GitHub's REST routes, auth, rate-limit headers, injected faults, and
//! GitHub's error bodies.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::forge::{self, lock, Caller, MergeRequest, RateKey, Shared};
use super::json;
use super::model::{self, PageRequest, PullState};
use super::GithubError;
use crate::clock::Timestamp;

const DOCS: &str = "https://docs.github.com/rest";

/// The largest request body the emulator reads (an issue comment is at most 65 536
/// characters); larger ones get 413.
pub const MAX_BODY: usize = 1 << 20;

/// An error answer in GitHub's shape: `{"message", "documentation_url", ["errors"]}`.
pub struct ApiError {
    status: StatusCode,
    body: Value,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, message: &str) -> Self {
        ApiError {
            status,
            body: json!({
                "message": message,
                "documentation_url": DOCS,
                "status": status.as_u16().to_string(),
            }),
            retry_after: None,
        }
    }

    fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not Found")
    }

    fn bad_json() -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Problems parsing JSON")
    }
}

impl From<GithubError> for ApiError {
    fn from(e: GithubError) -> Self {
        match e {
            GithubError::UnknownRepo(_)
            | GithubError::UnknownPull { .. }
            | GithubError::UnknownComment { .. }
            | GithubError::UnknownCheckRun { .. } => ApiError::not_found(),
            GithubError::NotYourCheckRun { app_id } => ApiError::new(
                StatusCode::FORBIDDEN,
                &format!("Invalid app_id `{app_id}` - check run can only be modified by the GitHub App that created it."),
            ),
            GithubError::UnknownRef { reference, .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("No commit found for SHA: {reference}"),
            ),
            GithubError::Validation {
                resource,
                field,
                code,
                message,
            } => ApiError {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                body: json!({
                    "message": "Validation Failed",
                    "errors": [{
                        "resource": resource,
                        "code": code,
                        "field": field,
                        "message": message,
                    }],
                    "documentation_url": DOCS,
                    "status": "422",
                }),
                retry_after: None,
            },
            GithubError::NotMergeable { .. } => ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "Pull Request is not mergeable",
            ),
            GithubError::MergeMethodNotAllowed(m) => ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!("{m} merges are not allowed on this repository."),
            ),
            GithubError::HeadModified { .. } => ApiError::new(
                StatusCode::CONFLICT,
                "Head branch was modified. Review and try the merge again.",
            ),
            other => {
                tracing::warn!(error = %other, "github twin: internal error");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "Server Error")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(self.body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(secs));
        }
        resp
    }
}

type ApiResult = Result<Response, ApiError>;
type S = State<Arc<Shared>>;

pub fn router(shared: Arc<Shared>) -> Router {
    let routes = Router::new()
        .route("/rate_limit", get(rate_limit))
        .route("/user", get(current_user))
        .route("/app", get(get_app))
        .route(
            "/app/installations/{id}/access_tokens",
            post(create_installation_token),
        )
        .route("/repos/{owner}/{repo}/installation", get(repo_installation))
        .route(
            "/repos/{owner}/{repo}/collaborators/{username}/permission",
            get(collaborator_permission),
        )
        .route("/repos/{owner}/{repo}", get(get_repo))
        .route(
            "/repos/{owner}/{repo}/pulls",
            get(list_pulls).post(create_pull),
        )
        .route(
            "/repos/{owner}/{repo}/pulls/{number}",
            get(get_pull).patch(update_pull),
        )
        .route(
            "/repos/{owner}/{repo}/pulls/{number}/merge",
            put(merge_pull).get(is_merged),
        )
        .route("/repos/{owner}/{repo}/statuses/{sha}", post(create_status))
        .route("/repos/{owner}/{repo}/check-runs", post(create_check_run))
        .route(
            "/repos/{owner}/{repo}/check-runs/{id}",
            get(get_check_run).patch(update_check_run),
        )
        .route(
            "/repos/{owner}/{repo}/commits/{*rest}",
            get(commit_statuses),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/comments",
            get(list_comments).post(create_comment),
        )
        .route(
            "/repos/{owner}/{repo}/issues/comments/{id}",
            get(get_comment).patch(update_comment).post(update_comment),
        )
        .fallback(|| async { ApiError::not_found() })
        // GitHub answers an unsupported method on a known path with 404 too.
        .method_not_allowed_fallback(|| async { ApiError::not_found() })
        .layer(middleware::from_fn_with_state(shared.clone(), gate))
        .with_state(shared.clone());
    // Outside the routes, so a rewritten path is routed afresh.
    Router::new()
        .fallback_service(routes)
        .layer(middleware::from_fn_with_state(shared, moved))
}

/// A renamed or transferred repository, before routing: its old name answers 301 (GET) or
/// 307 (the rest, so the method and body are kept) with `Location: …/repositories/{id}/…`,
/// and that path serves the repository under its new name (github/rest-api-description,
/// components/responses/moved_permanently; GitHub's docs, "Follow redirects").
async fn moved(State(shared): S, mut req: Request, next: Next) -> Response {
    let segs: Vec<String> = req.uri().path().split('/').map(str::to_string).collect();
    if let [_, first, owner, name, ..] = segs.as_slice() {
        if first == "repos" {
            if let Some(id) = shared.moved_repo(&format!("{owner}/{name}")) {
                let rest = segs[4..].join("/");
                let query = req
                    .uri()
                    .query()
                    .map(|q| format!("?{q}"))
                    .unwrap_or_default();
                let to = format!(
                    "{}/repositories/{id}{}{query}",
                    shared.base,
                    if rest.is_empty() {
                        String::new()
                    } else {
                        format!("/{rest}")
                    }
                );
                let status = if req.method() == Method::GET {
                    StatusCode::MOVED_PERMANENTLY
                } else {
                    StatusCode::TEMPORARY_REDIRECT
                };
                let body = serde_json::json!({
                    "message": "Moved Permanently",
                    "url": to,
                    "documentation_url": "https://docs.github.com/v3/#http-redirects"
                });
                return (
                    status,
                    [(axum::http::header::LOCATION, to)],
                    axum::Json(body),
                )
                    .into_response();
            }
        }
        if first == "repositories" {
            let full = owner
                .parse::<u64>()
                .ok()
                .and_then(|id| shared.repo_by_id(id));
            if let Some(full) = full {
                let rest = segs[3..].join("/");
                let query = req
                    .uri()
                    .query()
                    .map(|q| format!("?{q}"))
                    .unwrap_or_default();
                let pq = format!("/repos/{full}/{rest}{query}");
                let pq = pq.replace("//", "/");
                if let Ok(uri) = pq.parse::<axum::http::Uri>() {
                    *req.uri_mut() = uri;
                }
            }
        }
    }
    next.run(req).await
}

/// Every request passes here: injected faults first (they come from GitHub's edge), then
/// authentication, then the primary rate limit of the caller; every answer gets the
/// rate-limit headers. The authenticated [`Caller`] rides on the request to the handler.
async fn gate(State(shared): S, mut req: Request, next: Next) -> Response {
    let now = shared.clock.now();
    let path = req.uri().path().to_string();
    let auth = authenticate(&shared, req.headers(), now)
        .and_then(|caller| allowed(&caller, &path).map(|()| caller));
    let key = match &auth {
        Ok(c) => c.rate_key(),
        Err(_) => RateKey::Anonymous,
    };
    let fault = {
        let mut f = lock(&shared.faults);
        if f.server_errors > 0 {
            f.server_errors -= 1;
            let status = StatusCode::from_u16(f.server_error_status)
                .ok()
                .filter(|s| s.is_server_error())
                .unwrap_or(StatusCode::BAD_GATEWAY);
            Some(ApiError::new(
                status,
                status.canonical_reason().unwrap_or("Server Error"),
            ))
        } else if f.secondary_rate_limits > 0
            && (!f.secondary_writes_only || req.method() != Method::GET)
        {
            // github/docs content/rest/using-the-rest-api/rate-limits-for-the-rest-api.md:
            // a secondary limit is a 403 or a 429 whose message says so, with or without
            // `retry-after`; `x-ratelimit-remaining` is the primary window's, above zero.
            f.secondary_rate_limits -= 1;
            let status = if f.secondary_status == 429 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::FORBIDDEN
            };
            let mut e = ApiError::new(
                status,
                "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
            );
            e.body["documentation_url"] = json!(
                "https://docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api#about-secondary-rate-limits"
            );
            e.retry_after = (f.retry_after_secs > 0).then_some(f.retry_after_secs);
            Some(e)
        } else {
            None
        }
    };
    if let Some(e) = fault {
        let w = shared.with_window(key, |w| *w);
        return with_rate_headers(
            e.into_response(),
            w.limit,
            w.used,
            w.reset_epoch_secs(),
            now,
        );
    }
    *lock(&shared.last_user_agent) = req
        .headers()
        .get_all("user-agent")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    // github/docs content/rest/using-the-rest-api/getting-started-with-the-rest-api.md,
    // "User agent": a request without a `User-Agent` is refused with 403.
    let agent = req
        .headers()
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .unwrap_or_default();
    if agent.is_empty() {
        let mut e = ApiError::new(
            StatusCode::FORBIDDEN,
            "Request forbidden by administrative rules. Please make sure your request has a User-Agent header",
        );
        e.body["documentation_url"] = json!(
            "https://docs.github.com/rest/using-the-rest-api/getting-started-with-the-rest-api#user-agent"
        );
        return e.into_response();
    }
    // GitHub does not charge `/rate_limit` against the limit.
    let counts = path != "/rate_limit";
    let conditional = (req.method() == Method::GET)
        .then(|| req.headers().get("if-none-match").cloned())
        .flatten();
    let is_get = req.method() == Method::GET;
    let (mut w, exhausted) = shared.with_window(key, |w| {
        w.roll(now);
        let exhausted = counts && w.remaining() == 0;
        if counts && !exhausted {
            w.used += 1;
        }
        (*w, exhausted)
    });
    let resp = match auth {
        Err(e) => e.into_response(),
        Ok(caller) if exhausted => {
            let who = match &caller {
                Caller::Installation { id, .. } => format!("installation ID {id}"),
                Caller::App { id, .. } => format!("integration ID {id}"),
                Caller::User { login } => format!("user ID {}", json::user_id(login)),
            };
            ApiError::new(
                StatusCode::FORBIDDEN,
                &format!("API rate limit exceeded for {who}."),
            )
            .into_response()
        }
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            // Read within the limit here, so no handler can be handed an unbounded body.
            let (parts, body) = req.into_parts();
            match crate::sim::net::read_body(body, MAX_BODY).await {
                Ok(bytes) => {
                    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                        .await
                }
                Err(crate::sim::net::BodyError::TooLarge { .. }) => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("Request body is too large: the limit is {MAX_BODY} bytes"),
                )
                .into_response(),
                Err(e @ crate::sim::net::BodyError::Timeout(_)) => {
                    ApiError::new(StatusCode::REQUEST_TIMEOUT, &e.to_string()).into_response()
                }
                Err(_) => ApiError::bad_json().into_response(),
            }
        }
    };
    let resp = if is_get && resp.status() == StatusCode::OK {
        let (resp, not_modified) = with_etag(resp, conditional.as_ref()).await;
        if not_modified && counts {
            // An authorized 304 is free, as on GitHub.
            w = shared.with_window(key, |window| {
                window.used = window.used.saturating_sub(1);
                *window
            });
        }
        resp
    } else {
        resp
    };
    with_rate_headers(resp, w.limit, w.used, w.reset_epoch_secs(), now)
}

/// Add a strong `ETag` (sha256 of the body); answer 304 with no body when the client
/// already has it. Returns whether it was a 304.
async fn with_etag(resp: Response, if_none_match: Option<&HeaderValue>) -> (Response, bool) {
    use sha2::Digest as _;
    let (mut parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(_) => {
            let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "Server Error");
            return (e.into_response(), false);
        }
    };
    let etag = format!("\"{}\"", hex::encode(sha2::Sha256::digest(&bytes)));
    let matches = if_none_match
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().trim_start_matches("W/") == etag)
        });
    if let Ok(v) = HeaderValue::from_str(&etag) {
        parts.headers.insert("etag", v);
    }
    if matches {
        parts.status = StatusCode::NOT_MODIFIED;
        parts.headers.remove("content-type");
        parts.headers.remove("content-length");
        return (Response::from_parts(parts, axum::body::Body::empty()), true);
    }
    (
        Response::from_parts(parts, axum::body::Body::from(bytes)),
        false,
    )
}

fn with_rate_headers(
    mut resp: Response,
    limit: u64,
    used: u64,
    reset: u64,
    now: Timestamp,
) -> Response {
    let h = resp.headers_mut();
    // GitHub's `Date` is its own clock: here the twin's (a client corrects a skewed JWT
    // by it; octokit/auth-app.js src/hook.ts).
    if let Ok(v) = HeaderValue::from_str(&now.http_date()) {
        h.insert("date", v);
    }
    h.insert("x-ratelimit-limit", HeaderValue::from(limit));
    h.insert(
        "x-ratelimit-remaining",
        HeaderValue::from(limit.saturating_sub(used)),
    );
    h.insert("x-ratelimit-used", HeaderValue::from(used));
    h.insert("x-ratelimit-reset", HeaderValue::from(reset));
    h.insert("x-ratelimit-resource", HeaderValue::from_static("core"));
    h.insert(
        "x-github-media-type",
        HeaderValue::from_static("github.v3; format=json"),
    );
    h.insert("x-github-request-id", HeaderValue::from_static("0000:TWIN"));
    resp
}

/// Who presents the `Authorization` header: the personal access token's user, an
/// installation token (until it expires on the twin's clock), or an App's JWT.
fn authenticate(shared: &Shared, headers: &HeaderMap, now: Timestamp) -> Result<Caller, ApiError> {
    let Some(value) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Requires authentication",
        ));
    };
    let bad = || ApiError::new(StatusCode::UNAUTHORIZED, "Bad credentials");
    let presented = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .or_else(|| value.strip_prefix("token "))
        .or_else(|| value.strip_prefix("Token "))
        .map(str::trim)
        .ok_or_else(bad)?;
    if constant_time_eq(presented.as_bytes(), shared.token.as_bytes()) {
        return Ok(Caller::User {
            login: shared.login.clone(),
        });
    }
    if let Some(t) = lock(&shared.app_tokens)
        .iter()
        .find(|t| constant_time_eq(presented.as_bytes(), t.token.as_bytes()))
    {
        if t.expires_at <= now {
            return Err(bad());
        }
        return Ok(Caller::Installation {
            id: t.installation_id,
            login: t.login.clone(),
            repos: t.repos.clone(),
        });
    }
    let apps = shared.apps();
    if super::app::looks_like_jwt(presented) && !apps.is_empty() {
        return match super::app::verify_jwt(&apps, presented, now) {
            Ok(app) => Ok(Caller::App {
                id: app.id,
                login: app.bot_login(),
            }),
            Err(message) => Err(ApiError::new(StatusCode::UNAUTHORIZED, message)),
        };
    }
    Err(bad())
}

/// `/app`, `/app/…` and `/repos/{o}/{r}/installation` take an App's JWT and nothing else;
/// a JWT opens no other route; an installation token reaches only its repositories and
/// not `/user`.
fn allowed(caller: &Caller, path: &str) -> Result<(), ApiError> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let app_route = segments.first() == Some(&"app")
        || (segments.len() == 4 && segments[0] == "repos" && segments[3] == "installation");
    match caller {
        Caller::App { .. } if app_route => Ok(()),
        Caller::App { .. } => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "A JSON web token could not be used for this route; use an installation token",
        )),
        _ if app_route => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            super::app::JWT_UNDECODABLE,
        )),
        Caller::Installation { repos, .. } => {
            if segments.first() == Some(&"user") {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "Resource not accessible by integration",
                ));
            }
            if segments.len() >= 3 && segments[0] == "repos" {
                let name = format!("{}/{}", segments[1], segments[2]).to_lowercase();
                if !repos.contains(&name) {
                    return Err(ApiError::not_found());
                }
            }
            Ok(())
        }
        Caller::User { .. } => Ok(()),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn full_name(owner: &str, repo: &str) -> String {
    format!("{owner}/{repo}")
}

fn parse_number(s: &str) -> Result<u64, ApiError> {
    s.parse().map_err(|_| ApiError::not_found())
}

fn parse_json<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|_| ApiError::bad_json())
}

fn ok(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

fn query_get<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The page of `items` the query asks for, with GitHub's `Link` header.
fn paged(shared: &Shared, path: &str, q: &[(String, String)], items: Vec<Value>) -> Response {
    let req = PageRequest::from_query(query_get(q, "per_page"), query_get(q, "page"));
    let others: Vec<(String, String)> = q
        .iter()
        .filter(|(k, _)| k != "per_page" && k != "page")
        .map(|(k, v)| (k.clone(), encode_query_value(v)))
        .collect();
    let link = model::link_header(&format!("{}{path}", shared.base), &others, req, items.len());
    let page = req.slice(&items).to_vec();
    let mut resp = ok(StatusCode::OK, Value::Array(page));
    if let Some(link) = link.and_then(|l| HeaderValue::from_str(&l).ok()) {
        resp.headers_mut().insert("link", link);
    }
    resp
}

fn encode_query_value(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

// ----- handlers -----

async fn rate_limit(State(shared): S, Extension(caller): Extension<Caller>) -> ApiResult {
    let w = shared.with_window(caller.rate_key(), |w| *w);
    let core = json::rate(w.limit, w.used, w.reset_epoch_secs());
    let fresh = |limit: u64| json::rate(limit, 0, w.reset_epoch_secs());
    Ok(ok(
        StatusCode::OK,
        json!({
            "resources": {
                "core": core,
                "search": fresh(30),
                "graphql": fresh(5000),
                "integration_manifest": fresh(5000),
                "code_scanning_upload": fresh(1000),
                "actions_runner_registration": fresh(10000),
            },
            "rate": core,
        }),
    ))
}

async fn current_user(State(shared): S, Extension(caller): Extension<Caller>) -> ApiResult {
    Ok(ok(StatusCode::OK, json::user(&shared.base, caller.login())))
}

async fn get_repo(State(shared): S, Path((owner, repo)): Path<(String, String)>) -> ApiResult {
    let v = shared.with_repo(&full_name(&owner, &repo), |state, _, _| {
        Ok(json::repository(&shared.base, state))
    })?;
    Ok(ok(StatusCode::OK, v))
}

async fn list_pulls(
    State(shared): S,
    Path((owner, repo)): Path<(String, String)>,
    Query(q): Query<Vec<(String, String)>>,
) -> ApiResult {
    let name = full_name(&owner, &repo);
    let want_state = query_get(&q, "state").unwrap_or("open").to_string();
    if !matches!(want_state.as_str(), "open" | "closed" | "all") {
        return Err(GithubError::Validation {
            resource: "PullRequest",
            field: "state",
            code: "invalid",
            message: format!("state must be open, closed or all, not {want_state}"),
        }
        .into());
    }
    let head = query_get(&q, "head").map(str::to_string);
    let base = query_get(&q, "base").map(str::to_string);
    let sort = query_get(&q, "sort").unwrap_or("created").to_string();
    let descending = match query_get(&q, "direction") {
        Some(d) => d == "desc",
        None => sort == "created",
    };
    let items = shared.with_repo(&name, |state, _, _| {
        let mut pulls: Vec<_> = state
            .pulls
            .iter()
            .filter(|p| match want_state.as_str() {
                "open" => p.state == PullState::Open,
                "closed" => p.state == PullState::Closed,
                _ => true,
            })
            .filter(|p| match &head {
                // `owner:branch`; a bare branch also matches, for convenience.
                Some(h) => match h.split_once(':') {
                    Some((o, b)) => {
                        o.eq_ignore_ascii_case(
                            p.head_owner.as_deref().unwrap_or(state.spec.owner()),
                        ) && b == p.head_ref
                    }
                    None => *h == p.head_ref,
                },
                None => true,
            })
            .filter(|p| base.as_ref().is_none_or(|b| *b == p.base_ref))
            .cloned()
            .collect();
        match sort.as_str() {
            "updated" => pulls.sort_by_key(|p| (p.updated_at, p.number)),
            _ => pulls.sort_by_key(|p| p.number),
        }
        if descending {
            pulls.reverse();
        }
        Ok(pulls
            .iter()
            .map(|p| json::pull_request(&shared.base, state, p, None))
            .collect::<Vec<_>>())
    })?;
    Ok(paged(&shared, &format!("/repos/{name}/pulls"), &q, items))
}

async fn get_pull(
    State(shared): S,
    Path((owner, repo, number)): Path<(String, String, String)>,
) -> ApiResult {
    let number = parse_number(&number)?;
    let name = full_name(&owner, &repo);
    let v = shared.with_repo(&name, |state, repo, _| {
        let idx = forge::pull_index(state, &name, number)?;
        let pr = &state.pulls[idx];
        let detail = Shared::pull_detail(state, repo, pr);
        Ok(json::pull_request(&shared.base, state, pr, Some(&detail)))
    })?;
    Ok(ok(StatusCode::OK, v))
}

#[derive(Deserialize)]
struct CreatePull {
    title: Option<String>,
    head: Option<String>,
    base: Option<String>,
    body: Option<String>,
    #[serde(default)]
    draft: bool,
}

async fn create_pull(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path((owner, repo)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let req: CreatePull = parse_json(&body)?;
    let missing = |field: &'static str| GithubError::Validation {
        resource: "PullRequest",
        field,
        code: "missing_field",
        message: format!("{field} is missing"),
    };
    let head = req.head.ok_or_else(|| missing("head"))?;
    let base = req.base.ok_or_else(|| missing("base"))?;
    let title = req.title.ok_or_else(|| missing("title"))?;
    let name = full_name(&owner, &repo);
    let (pr, _ticket) = shared.create_pull(
        &name,
        &head,
        &base,
        &title,
        req.body.as_deref(),
        caller.login(),
        req.draft,
    )?;
    let v = shared.with_repo(&name, |state, repo, _| {
        let detail = Shared::pull_detail(state, repo, &pr);
        Ok(json::pull_request(&shared.base, state, &pr, Some(&detail)))
    })?;
    Ok(ok(StatusCode::CREATED, v))
}

#[derive(Deserialize, Default)]
struct UpdatePull {
    title: Option<String>,
    body: Option<String>,
    base: Option<String>,
    state: Option<String>,
}

/// `PATCH /repos/{owner}/{repo}/pulls/{pull_number}` (`pulls/update`): title, body, base
/// and state (`open`/`closed`).
async fn update_pull(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path((owner, repo, number)): Path<(String, String, u64)>,
    body: Bytes,
) -> ApiResult {
    let req: UpdatePull = parse_json(&body)?;
    if let Some(other) = req
        .state
        .as_deref()
        .filter(|s| !matches!(*s, "open" | "closed"))
    {
        return Err(GithubError::Validation {
            resource: "PullRequest",
            field: "state",
            code: "invalid",
            message: format!("state must be open or closed, not {other}"),
        }
        .into());
    }
    let name = full_name(&owner, &repo);
    let edit = crate::sim::github::forge::PullEdit {
        title: req.title,
        body: req.body,
        base: req.base,
    };
    let (mut pr, _ticket) = shared.edit_pull(&name, number, &edit, caller.login())?;
    match req.state.as_deref() {
        None => {}
        Some("closed") => {
            shared.close_pull(&name, number, caller.login())?;
        }
        Some(_) => {
            shared.reopen_pull(&name, number, caller.login())?;
        }
    }
    let v = shared.with_repo(&name, |state, repo, _| {
        if let Some(now) = state.pulls.iter().find(|p| p.number == number) {
            pr = now.clone();
        }
        let detail = Shared::pull_detail(state, repo, &pr);
        Ok(json::pull_request(&shared.base, state, &pr, Some(&detail)))
    })?;
    Ok(ok(StatusCode::OK, v))
}

#[derive(Deserialize, Default)]
struct MergeBody {
    sha: Option<String>,
    merge_method: Option<String>,
    commit_title: Option<String>,
    commit_message: Option<String>,
}

async fn merge_pull(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let number = parse_number(&number)?;
    let req: MergeBody = if body.is_empty() {
        MergeBody::default()
    } else {
        parse_json(&body)?
    };
    let (sha, _ticket) = shared.merge_pull(
        &full_name(&owner, &repo),
        number,
        &MergeRequest {
            sha: req.sha,
            method: req.merge_method,
            commit_title: req.commit_title,
            commit_message: req.commit_message,
        },
        caller.login(),
    )?;
    Ok(ok(
        StatusCode::OK,
        json!({ "sha": sha, "merged": true, "message": "Pull Request successfully merged" }),
    ))
}

/// `GET /pulls/{n}/merge`: 204 when merged, 404 when not.
async fn is_merged(
    State(shared): S,
    Path((owner, repo, number)): Path<(String, String, String)>,
) -> ApiResult {
    let number = parse_number(&number)?;
    let name = full_name(&owner, &repo);
    let merged = shared.with_repo(&name, |state, _, _| {
        let idx = forge::pull_index(state, &name, number)?;
        Ok(state.pulls[idx].merged)
    })?;
    if merged {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found())
    }
}

#[derive(Deserialize)]
struct CreateStatus {
    state: Option<String>,
    target_url: Option<String>,
    description: Option<String>,
    context: Option<String>,
}

async fn create_status(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path((owner, repo, sha)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let req: CreateStatus = parse_json(&body)?;
    let name = full_name(&owner, &repo);
    let state_s = req.state.ok_or(GithubError::Validation {
        resource: "Status",
        field: "state",
        code: "missing_field",
        message: "state is missing".into(),
    })?;
    let status = shared.create_status(
        &name,
        &sha,
        &state_s,
        req.context.as_deref(),
        req.description.as_deref(),
        req.target_url.as_deref(),
        caller.login(),
    )?;
    let v = shared.with_repo(&name, |state, _, _| {
        Ok(json::status(&shared.base, state, &status))
    })?;
    Ok(ok(StatusCode::CREATED, v))
}

/// `GET /commits/{ref}/statuses`, `GET /commits/{ref}/status` and
/// `GET /commits/{sha}/pulls`; a ref may contain `/`.
async fn commit_statuses(
    State(shared): S,
    Path((owner, repo, rest)): Path<(String, String, String)>,
    Query(q): Query<Vec<(String, String)>>,
) -> ApiResult {
    let name = full_name(&owner, &repo);
    if let Some(sha) = rest.strip_suffix("/pulls") {
        return commit_pulls(&shared, &name, sha, &q);
    }
    if let Some(reference) = rest.strip_suffix("/check-runs") {
        return check_runs_for_ref(&shared, &name, reference, &q);
    }
    let (reference, combined) = if let Some(r) = rest.strip_suffix("/statuses") {
        (r.to_string(), false)
    } else if let Some(r) = rest.strip_suffix("/status") {
        (r.to_string(), true)
    } else {
        return Err(ApiError::not_found());
    };
    let result = shared.with_repo(&name, |state, repo, _| {
        let oid = super::git::resolve_commit(repo, &reference).ok_or_else(|| {
            GithubError::UnknownRef {
                repo: name.clone(),
                reference: reference.clone(),
            }
        })?;
        let sha = oid.to_string();
        if combined {
            let (st, latest) = forge::combined(state, &sha);
            Ok((
                Some(json::combined_status(
                    &shared.base,
                    state,
                    &sha,
                    st,
                    &latest,
                )),
                vec![],
            ))
        } else {
            // Newest first, as GitHub lists them.
            let mut all = forge::statuses_for(state, &sha);
            all.reverse();
            Ok((
                None,
                all.iter()
                    .map(|s| json::status(&shared.base, state, s))
                    .collect(),
            ))
        }
    })?;
    match result {
        (Some(mut v), _) => {
            // The combined view pages its statuses too (GitHub: up to 100 per page).
            let req = PageRequest::from_query(
                query_get(&q, "per_page").or(Some("100")),
                query_get(&q, "page"),
            );
            if let Some(list) = v["statuses"].as_array().cloned() {
                v["statuses"] = Value::Array(req.slice(&list).to_vec());
            }
            Ok(ok(StatusCode::OK, v))
        }
        (None, items) => Ok(paged(
            &shared,
            &format!("/repos/{name}/commits/{reference}/statuses"),
            &q,
            items,
        )),
    }
}

// ----- check runs (src/sim/github/checks.rs has the rules) -----

/// The App behind an installation token; anyone else is told the Checks API is for Apps
/// (GitHub's 403 to a personal access token).
fn checks_app(shared: &Shared, caller: &Caller) -> Result<(u64, String), ApiError> {
    let app = match caller {
        Caller::Installation { id, .. } => shared
            .apps()
            .into_iter()
            .find(|a| a.installations.iter().any(|i| i.id == *id)),
        _ => None,
    };
    app.map(|a| (a.id, a.slug.clone())).ok_or_else(|| {
        let mut e = ApiError::new(StatusCode::FORBIDDEN, super::checks::APP_ONLY);
        e.body["documentation_url"] =
            json!("https://docs.github.com/rest/checks/runs#create-a-check-run");
        e
    })
}

async fn create_check_run(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path((owner, repo)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let app = checks_app(&shared, &caller)?;
    let req: super::checks::CheckRunRequest = parse_json(&body)?;
    let name = full_name(&owner, &repo);
    let run = shared.create_check_run(&name, (app.0, &app.1), &req)?;
    Ok(ok(
        StatusCode::CREATED,
        super::checks::json(&shared.base, &name, &run),
    ))
}

async fn update_check_run(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let app = checks_app(&shared, &caller)?;
    let id = parse_number(&id)?;
    let req: super::checks::CheckRunRequest = parse_json(&body)?;
    let name = full_name(&owner, &repo);
    let run = shared.update_check_run(&name, app.0, id, &req)?;
    Ok(ok(
        StatusCode::OK,
        super::checks::json(&shared.base, &name, &run),
    ))
}

async fn get_check_run(
    State(shared): S,
    Path((owner, repo, id)): Path<(String, String, String)>,
) -> ApiResult {
    let id = parse_number(&id)?;
    let name = full_name(&owner, &repo);
    let v = shared.with_repo(&name, |state, _, _| {
        state
            .check_runs
            .iter()
            .find(|r| r.id == id)
            .map(|r| super::checks::json(&shared.base, &name, r))
            .ok_or(GithubError::UnknownCheckRun {
                repo: name.clone(),
                id,
            })
    })?;
    Ok(ok(StatusCode::OK, v))
}

/// `GET /commits/{ref}/check-runs`: `{total_count, check_runs}`, filtered by `check_name`,
/// `app_id` and `filter` (`latest`, the default, or `all`), paged.
fn check_runs_for_ref(
    shared: &Shared,
    name: &str,
    reference: &str,
    q: &[(String, String)],
) -> ApiResult {
    let latest = query_get(q, "filter") != Some("all");
    let app_id = query_get(q, "app_id").and_then(|a| a.parse().ok());
    let check_name = query_get(q, "check_name");
    let runs = shared.with_repo(name, |state, repo, _| {
        let oid =
            super::git::resolve_commit(repo, reference).ok_or_else(|| GithubError::UnknownRef {
                repo: name.to_string(),
                reference: reference.to_string(),
            })?;
        Ok(super::checks::for_ref(
            &state.check_runs,
            &oid.to_string(),
            check_name,
            app_id,
            latest,
        )
        .into_iter()
        .map(|r| super::checks::json(&shared.base, name, r))
        .collect::<Vec<_>>())
    })?;
    let req = PageRequest::from_query(query_get(q, "per_page"), query_get(q, "page"));
    let total = runs.len();
    Ok(ok(
        StatusCode::OK,
        json!({ "total_count": total, "check_runs": req.slice(&runs).to_vec() }),
    ))
}

/// The PRs a commit belongs to: merged PRs whose merge commit it is or whose head
/// contains it, and open PRs whose head contains it but whose base does not.
fn commit_pulls(shared: &Shared, name: &str, sha: &str, q: &[(String, String)]) -> ApiResult {
    let items = shared.with_repo(name, |state, repo, _| {
        let oid = super::git::resolve_commit(repo, sha).ok_or_else(|| GithubError::UnknownRef {
            repo: name.to_string(),
            reference: sha.to_string(),
        })?;
        let contains = |tip: &str| {
            git2::Oid::from_str(tip).is_ok_and(|t| super::git::is_ancestor(repo, oid, t))
        };
        Ok(state
            .pulls
            .iter()
            .rev()
            .filter(|p| {
                if p.merge_commit_sha.as_deref() == Some(sha) {
                    return true;
                }
                match p.state {
                    PullState::Open => contains(&p.head_sha) && !contains(&p.base_sha),
                    PullState::Closed => p.merged && contains(&p.head_sha),
                }
            })
            .map(|p| json::pull_request(&shared.base, state, p, None))
            .collect::<Vec<_>>())
    })?;
    Ok(paged(
        shared,
        &format!("/repos/{name}/commits/{sha}/pulls"),
        q,
        items,
    ))
}

async fn list_comments(
    State(shared): S,
    Path((owner, repo, number)): Path<(String, String, String)>,
    Query(q): Query<Vec<(String, String)>>,
) -> ApiResult {
    let number = parse_number(&number)?;
    let name = full_name(&owner, &repo);
    let since = match query_get(&q, "since") {
        Some(s) => Some(model::parse_rfc3339(s).ok_or_else(|| {
            ApiError::from(GithubError::Validation {
                resource: "IssueComment",
                field: "since",
                code: "invalid",
                message: format!("since is not an ISO 8601 timestamp: {s}"),
            })
        })?),
        None => None,
    };
    let items = shared.with_repo(&name, |state, _, _| {
        forge::pull_index(state, &name, number)?;
        Ok(state
            .comments
            .iter()
            .filter(|c| c.issue_number == number)
            .filter(|c| since.is_none_or(|s| c.updated_at >= s))
            .map(|c| json::comment(&shared.base, state, c))
            .collect::<Vec<_>>())
    })?;
    Ok(paged(
        &shared,
        &format!("/repos/{name}/issues/{number}/comments"),
        &q,
        items,
    ))
}

#[derive(Deserialize)]
struct CommentBody {
    body: Option<String>,
}

fn comment_body(body: &Bytes) -> Result<String, ApiError> {
    let req: CommentBody = parse_json(body)?;
    req.body.ok_or_else(|| {
        GithubError::Validation {
            resource: "IssueComment",
            field: "body",
            code: "missing_field",
            message: "body is missing".into(),
        }
        .into()
    })
}

async fn create_comment(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path((owner, repo, number)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let number = parse_number(&number)?;
    let text = comment_body(&body)?;
    let name = full_name(&owner, &repo);
    let (c, _ticket) = shared.create_comment(&name, number, &text, caller.login())?;
    let v = shared.with_repo(&name, |state, _, _| {
        Ok(json::comment(&shared.base, state, &c))
    })?;
    Ok(ok(StatusCode::CREATED, v))
}

async fn get_comment(
    State(shared): S,
    Path((owner, repo, id)): Path<(String, String, String)>,
) -> ApiResult {
    let id = parse_number(&id)?;
    let name = full_name(&owner, &repo);
    let v = shared.with_repo(&name, |state, _, _| {
        let c = state.comments.iter().find(|c| c.id == id).ok_or_else(|| {
            GithubError::UnknownComment {
                repo: name.clone(),
                id,
            }
        })?;
        Ok(json::comment(&shared.base, state, c))
    })?;
    Ok(ok(StatusCode::OK, v))
}

/// PATCH, and POST too: octocrab's `update_comment` sends POST, which GitHub accepts.
async fn update_comment(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    method: Method,
    Path((owner, repo, id)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult {
    let id = parse_number(&id)?;
    let text = comment_body(&body)?;
    let name = full_name(&owner, &repo);
    let (c, _ticket) = shared.update_comment(&name, id, &text, caller.login())?;
    tracing::debug!(%method, id, "comment updated");
    let v = shared.with_repo(&name, |state, _, _| {
        Ok(json::comment(&shared.base, state, &c))
    })?;
    Ok(ok(StatusCode::OK, v))
}

// ----- GitHub Apps and permissions -----

fn calling_app(shared: &Shared, caller: &Caller) -> Result<super::app::GithubApp, ApiError> {
    match caller {
        Caller::App { id, .. } => shared
            .apps()
            .into_iter()
            .find(|a| a.id == *id)
            .ok_or_else(ApiError::not_found),
        _ => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            super::app::JWT_UNDECODABLE,
        )),
    }
}

/// The App's owner: the owner of its first installation's first repository.
fn app_owner(app: &super::app::GithubApp) -> String {
    app.installations
        .iter()
        .flat_map(|i| i.repos.iter())
        .next()
        .and_then(|r| r.split('/').next())
        .unwrap_or("twin")
        .to_string()
}

async fn get_app(State(shared): S, Extension(caller): Extension<Caller>) -> ApiResult {
    let app = &calling_app(&shared, &caller)?;
    Ok(ok(
        StatusCode::OK,
        super::app::app_json(&shared.base, app, &app_owner(app)),
    ))
}

#[derive(Deserialize, Default)]
struct TokenRequest {
    repositories: Option<Vec<String>>,
    permissions: Option<serde_json::Map<String, Value>>,
}

/// `POST /app/installations/{id}/access_tokens`, narrowed as asked (`apps/create-
/// installation-access-token` in github/rest-api-description): `repositories` (names)
/// keeps those of the installation's, `permissions` at most what it was granted; asking
/// for more is a 422.
async fn create_installation_token(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let id = parse_number(&id)?;
    let req: TokenRequest = if body.is_empty() {
        TokenRequest::default()
    } else {
        parse_json(&body)?
    };
    let app = &calling_app(&shared, &caller)?;
    let granted = super::app::token_permissions();
    let level = |v: &Value| match v.as_str() {
        Some("read") => 1,
        Some("write") => 2,
        Some("admin") => 3,
        _ => 9,
    };
    let permissions = match &req.permissions {
        Some(asked) => {
            for (k, v) in asked {
                if granted.get(k).is_none_or(|g| level(v) > level(g)) {
                    return Err(ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "The permissions requested are not granted to this installation.",
                    ));
                }
            }
            Value::Object(asked.clone())
        }
        None => granted,
    };
    let mut issued = shared
        .issue_token(app, id)
        .ok_or_else(ApiError::not_found)?;
    if let Some(names) = &req.repositories {
        let short = |r: &str| r.rsplit('/').next().unwrap_or_default().to_lowercase();
        if names
            .iter()
            .any(|n| !issued.repos.iter().any(|r| short(r) == n.to_lowercase()))
        {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "There is at least one repository that does not exist or is not accessible to the parent installation.",
            ));
        }
        issued
            .repos
            .retain(|r| names.iter().any(|n| short(r) == n.to_lowercase()));
        shared.narrow_token(&issued.token, issued.repos.clone());
    }
    Ok(ok(
        StatusCode::CREATED,
        json!({
            "token": issued.token,
            "expires_at": issued.expires_at.rfc3339(),
            "permissions": permissions,
            "repository_selection": "selected",
        }),
    ))
}

async fn repo_installation(
    State(shared): S,
    Extension(caller): Extension<Caller>,
    Path((owner, repo)): Path<(String, String)>,
) -> ApiResult {
    let app = &calling_app(&shared, &caller)?;
    let name = full_name(&owner, &repo).to_lowercase();
    let inst = app
        .installations
        .iter()
        .find(|i| i.repos.iter().any(|r| r.to_lowercase() == name))
        .ok_or_else(ApiError::not_found)?;
    Ok(ok(
        StatusCode::OK,
        super::app::installation_json(&shared.base, app, inst, &owner),
    ))
}

/// `GET /repos/{o}/{r}/collaborators/{username}/permission`: `permission` is the coarse
/// admin/write/read/none, `role_name` the role itself.
async fn collaborator_permission(
    State(shared): S,
    Path((owner, repo, username)): Path<(String, String, String)>,
) -> ApiResult {
    if !forge::is_valid_login(&username) {
        return Err(ApiError::not_found());
    }
    let name = full_name(&owner, &repo);
    let role = shared.with_repo(&name, |state, _, _| Ok(shared.role_of(state, &username)))?;
    let (permission, role_name) = match role {
        Some(r) => (r.permission(), r.as_str()),
        None => ("none", "none"),
    };
    let at_least = |min: model::Role| role.is_some_and(|r| r >= min);
    let mut user = json::user(&shared.base, &username);
    if let Some(obj) = user.as_object_mut() {
        obj.insert(
            "permissions".into(),
            json!({
                "admin": at_least(model::Role::Admin),
                "maintain": at_least(model::Role::Maintain),
                "push": at_least(model::Role::Write),
                "triage": at_least(model::Role::Triage),
                "pull": at_least(model::Role::Read),
            }),
        );
        obj.insert("role_name".into(), json!(role_name));
    }
    Ok(ok(
        StatusCode::OK,
        json!({ "permission": permission, "role_name": role_name, "user": user }),
    ))
}
