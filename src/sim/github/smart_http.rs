//! Git's smart HTTP protocol for the emulated repositories, as `github.com` serves them:
//! `http://127.0.0.1:PORT/{owner}/{repo}.git/info/refs`, `/git-upload-pack` (fetch) and
//! `/git-receive-pack` (push), answered by Git's own `git http-backend` (CGI) run on the
//! repository the emulator owns.
//!
//! Authentication is HTTP Basic with the emulator's token as the password and any user
//! name (GitHub accepts `x-access-token:<token>`); a request without it, or with a wrong
//! one, gets 401 with `WWW-Authenticate: Basic realm="GitHub"`, so git clients ask for
//! credentials. Request bodies are read up to [`MAX_GIT_BODY`] (413 beyond).
//!
//! Not simulated: a push through smart HTTP moves refs in the repository but fires no
//! webhooks and does not update PR state beyond what is read live from the branches;
//! protocol v2 is whatever `git http-backend` negotiates; no rate limit, no LFS.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;

use super::forge::Shared;

/// The largest request body (a pushed pack, or a fetch's negotiation) the emulator reads.
pub const MAX_GIT_BODY: usize = 64 << 20;

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/{owner}/{repo}/info/refs", get(serve))
        .route("/{owner}/{repo}/git-upload-pack", post(serve))
        .route("/{owner}/{repo}/git-receive-pack", post(serve))
        .with_state(shared)
}

fn plain(status: StatusCode, text: &str) -> Response {
    (status, text.to_string()).into_response()
}

fn unauthorized(text: &str) -> Response {
    let mut resp = plain(StatusCode::UNAUTHORIZED, text);
    resp.headers_mut().insert(
        "www-authenticate",
        HeaderValue::from_static("Basic realm=\"GitHub\""),
    );
    resp
}

/// The password of a Basic `Authorization` header, if there is one.
fn basic_password(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    text.split_once(':').map(|(_, p)| p.to_string())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn serve(
    State(shared): State<Arc<Shared>>,
    Path((owner, repo)): Path<(String, String)>,
    req: Request,
) -> Response {
    match basic_password(req.headers()) {
        None => return unauthorized("Authentication required"),
        Some(p) if !constant_time_eq(p.as_bytes(), shared.token.as_bytes()) => {
            return unauthorized("Invalid username or token.")
        }
        Some(_) => {}
    }
    let name = repo.strip_suffix(".git").unwrap_or(&repo);
    let full = format!("{owner}/{name}").to_lowercase();
    let path = shared
        .forge()
        .repos
        .get(&full)
        .map(|state| state.spec.path.clone());
    let Some(path) = path else {
        // A renamed or transferred repository: git traffic to the old name goes on working
        // ("git clone, git fetch, or git push operations targeting the previous location
        // will continue to function", GitHub's "Renaming a repository"). The emulator does
        // it as GitHub's web and API do, with a 301 to the new place on the same host.
        if let Some(now) = shared
            .moved_repo(&full)
            .and_then(|id| shared.repo_by_id(id))
        {
            let rest = req
                .uri()
                .path()
                .strip_prefix(&format!("/{owner}/{repo}"))
                .unwrap_or("");
            let query = req
                .uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            let mut resp = plain(StatusCode::MOVED_PERMANENTLY, "Moved Permanently");
            if let Ok(v) = HeaderValue::from_str(&format!("{}/{now}.git{rest}{query}", shared.base))
            {
                resp.headers_mut().insert("location", v);
            }
            return resp;
        }
        return plain(StatusCode::NOT_FOUND, "Repository not found.");
    };

    let (parts, body) = req.into_parts();
    // What follows `{owner}/{repo}` in the path: `/info/refs`, `/git-upload-pack`, ...
    let prefix = format!("/{owner}/{repo}");
    let path_info = parts
        .uri
        .path()
        .strip_prefix(&prefix)
        .unwrap_or_default()
        .to_string();
    let body = match crate::sim::net::read_body(body, MAX_GIT_BODY).await {
        Ok(b) => b,
        Err(crate::sim::net::BodyError::TooLarge { .. }) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("request body too large: the limit is {MAX_GIT_BODY} bytes"),
            )
        }
        Err(e) => return plain(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let cgi = Cgi {
        repo: path,
        method: parts.method.clone(),
        path_info,
        query: parts.uri.query().unwrap_or_default().to_string(),
        content_type: header("content-type"),
        content_encoding: header("content-encoding"),
        git_protocol: header("git-protocol"),
        user: shared.login.clone(),
        body,
    };
    match tokio::task::spawn_blocking(move || cgi.run()).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(message)) => {
            tracing::warn!(%message, "github twin: git http-backend failed");
            plain(StatusCode::INTERNAL_SERVER_ERROR, "git http-backend failed")
        }
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "git http-backend failed"),
    }
}

/// One CGI request to `git http-backend`.
struct Cgi {
    repo: PathBuf,
    method: Method,
    path_info: String,
    query: String,
    content_type: Option<String>,
    content_encoding: Option<String>,
    git_protocol: Option<String>,
    user: String,
    body: Bytes,
}

impl Cgi {
    fn run(self) -> Result<Response, String> {
        // http-backend serves GIT_PROJECT_ROOT + PATH_INFO: the git directory itself is the
        // root, so a work tree's `.git` and a bare repository are served alike.
        let git_dir = git2::Repository::open(&self.repo)
            .map(|r| r.path().to_path_buf())
            .map_err(|e| format!("open {}: {}", self.repo.display(), e.message()))?;
        let mut cmd = Command::new("git");
        cmd.arg("http-backend")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_PROJECT_ROOT", &git_dir)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("PATH_INFO", &self.path_info)
            .env("QUERY_STRING", &self.query)
            .env("REQUEST_METHOD", self.method.as_str())
            .env("CONTENT_LENGTH", self.body.len().to_string())
            // Set for an authenticated user, which also enables receive-pack.
            .env("REMOTE_USER", &self.user)
            .env("REMOTE_ADDR", "127.0.0.1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = &self.content_type {
            cmd.env("CONTENT_TYPE", t);
        }
        if let Some(e) = &self.content_encoding {
            cmd.env("HTTP_CONTENT_ENCODING", e);
        }
        if let Some(p) = &self.git_protocol {
            cmd.env("GIT_PROTOCOL", p);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run git http-backend: {e}"))?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| "no stdin for git http-backend".to_string())?;
        let body = self.body;
        // Written from a thread while the output is read, so neither pipe can fill up and
        // block the other.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&body);
        });
        let out = child
            .wait_with_output()
            .map_err(|e| format!("git http-backend: {e}"))?;
        let _ = writer.join();
        parse_cgi(&out.stdout).ok_or_else(|| {
            format!(
                "git http-backend ({}) answered no CGI headers: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }
}

/// A CGI answer (`Status:` and headers, a blank line, the body) as an HTTP response.
fn parse_cgi(out: &[u8]) -> Option<Response> {
    let (head_end, body_start) = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            out.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        })?;
    let head = std::str::from_utf8(&out[..head_end]).ok()?;
    let mut status = StatusCode::OK;
    let mut headers = HeaderMap::new();
    for line in head.lines() {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next()?.parse::<u16>().ok()?;
            status = StatusCode::from_u16(code).ok()?;
        } else if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    }
    let mut resp = Response::new(Body::from(out[body_start..].to_vec()));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    Some(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgi_answers_become_responses() {
        let resp =
            parse_cgi(b"Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\nnope").unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        assert_eq!(resp.headers()["content-type"], "text/plain");
        let resp = parse_cgi(b"Content-Type: application/x-git-upload-pack-advertisement\n\n001e")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(parse_cgi(b"no headers at all").is_none());
    }

    #[test]
    fn basic_auth_password() {
        let mut h = HeaderMap::new();
        let v = base64::engine::general_purpose::STANDARD.encode("x-access-token:ghp_1");
        h.insert(
            "authorization",
            HeaderValue::from_str(&format!("Basic {v}")).unwrap(),
        );
        assert_eq!(basic_password(&h).as_deref(), Some("ghp_1"));
        h.insert("authorization", HeaderValue::from_static("Bearer ghp_1"));
        assert_eq!(basic_password(&h), None);
    }
}
