//! The GitHub twin over real sockets: plain HTTP requests for every endpoint, a webhook
//! receiver that checks the signature itself, and each fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode};
use git2::{Oid, Repository, Signature, Time};
use hmac::{Hmac, Mac};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::sync::{mpsc, Mutex};

use ichor::clock::Clock;
use ichor::sim::github::{
    DeliveryOutcome, GithubFaults, GithubTwin, GithubTwinConfig, RepoSpec, WebhookTarget,
    RENOVATE_LOGIN,
};

const REPO: &str = "home/ops";
const BUMP: &str = "renovate/ghcr.io-siderolabs-installer-1.x";
const CONFLICT: &str = "renovate/conflicting";
const RELEASE_SET: &str = "clusters/lab/release-set.yaml";

type TestResult = Result<(), Box<dyn std::error::Error>>;

// ----- fixtures -----

fn commit(
    repo: &Repository,
    refname: &str,
    parent: Option<Oid>,
    files: &[(&str, &str)],
    message: &str,
    secs: i64,
) -> Result<Oid, git2::Error> {
    let sig = Signature::new("Ops", "ops@example.org", &Time::new(secs, 0))?;
    let parent = parent.map(|p| repo.find_commit(p)).transpose()?;
    let mut builder = git2::build::TreeUpdateBuilder::new();
    for (path, content) in files {
        let blob = repo.blob(content.as_bytes())?;
        builder.upsert(*path, blob, git2::FileMode::Blob);
    }
    let tree_oid = match &parent {
        Some(p) => builder.create_updated(repo, &p.tree()?)?,
        None => {
            let empty = repo.treebuilder(None)?.write()?;
            builder.create_updated(repo, &repo.find_tree(empty)?)?
        }
    };
    let tree = repo.find_tree(tree_oid)?;
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    let oid = repo.commit(None, &sig, &sig, message, &tree, &parents)?;
    repo.reference(refname, oid, true, message)?;
    Ok(oid)
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    main: Oid,
    bump: Oid,
}

fn release_set(talos: &str) -> String {
    format!("kind: ReleaseSet\nspec:\n  talos: {talos}\n  kubernetes: v1.35.0\n")
}

/// A bare repository: main with a release set, a Renovate branch bumping Talos, and a
/// branch that conflicts with main (both add README.md).
fn fixture() -> Result<Fixture, git2::Error> {
    let dir = tempfile::tempdir().map_err(|e| git2::Error::from_str(&e.to_string()))?;
    let path = dir.path().join("ops.git");
    let repo = Repository::init_bare(&path)?;
    repo.set_head("refs/heads/main")?;
    let v12 = release_set("v1.12.0");
    let root = commit(
        &repo,
        "refs/heads/main",
        None,
        &[(RELEASE_SET, &v12)],
        "init",
        1_767_225_600,
    )?;
    let v13 = release_set("v1.13.0");
    let bump = commit(
        &repo,
        &format!("refs/heads/{BUMP}"),
        Some(root),
        &[(RELEASE_SET, &v13)],
        "Update ghcr.io/siderolabs/installer Docker tag to v1.13.0",
        1_767_225_700,
    )?;
    let other = release_set("v1.12.5");
    commit(
        &repo,
        &format!("refs/heads/{CONFLICT}"),
        Some(root),
        &[(RELEASE_SET, &other), ("README.md", "not ops\n")],
        "conflicting bump",
        1_767_225_800,
    )?;
    let main = commit(
        &repo,
        "refs/heads/main",
        Some(root),
        &[("README.md", "ops\n")],
        "docs",
        1_767_225_900,
    )?;
    Ok(Fixture {
        _dir: dir,
        path,
        main,
        bump,
    })
}

// ----- a plain HTTP client -----

struct Api {
    client: Client<HttpConnector, Body>,
    base: String,
    token: String,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    json: Value,
}

impl Answer {
    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }
}

impl Api {
    fn new(twin: &GithubTwin) -> Self {
        Api {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: twin.base_url(),
            token: twin.token().to_string(),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        authorization: Option<String>,
    ) -> Result<Answer, Box<dyn std::error::Error>> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("accept", "application/vnd.github+json")
            .header("user-agent", "ichor-test");
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        let req = match body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(Body::from(b.to_string()))?,
            None => req.body(Body::empty())?,
        };
        let resp =
            tokio::time::timeout(Duration::from_secs(20), self.client.request(req)).await??;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 10 << 20).await?;
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)?
        };
        Ok(Answer {
            status,
            headers,
            json,
        })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Answer, Box<dyn std::error::Error>> {
        let auth = Some(format!("Bearer {}", self.token));
        self.send(method, path, body, auth).await
    }

    async fn get(&self, path: &str) -> Result<Answer, Box<dyn std::error::Error>> {
        self.call(Method::GET, path, None).await
    }
}

async fn start(
    fx: &Fixture,
    webhook: Option<(String, String)>,
) -> Result<GithubTwin, Box<dyn std::error::Error>> {
    Ok(GithubTwin::start(
        Clock::manual(),
        vec![RepoSpec::new(REPO, &fx.path)],
        webhook,
    )
    .await?)
}

// ----- a webhook receiver that checks signatures itself -----

#[derive(Debug, Clone)]
struct Received {
    event: String,
    delivery: String,
    user_agent: String,
    payload: Value,
}

struct Receiver {
    url: String,
    events: Arc<Mutex<mpsc::UnboundedReceiver<Received>>>,
}

impl Receiver {
    async fn next(&self) -> Result<Received, Box<dyn std::error::Error>> {
        let mut rx = self.events.lock().await;
        let got = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await?;
        got.ok_or_else(|| "receiver closed".into())
    }

    async fn nothing_pending(&self) -> bool {
        self.events.lock().await.try_recv().is_err()
    }
}

fn signature_ok(secret: &str, body: &[u8], header: &str) -> bool {
    let Some(hex_sig) = header.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(sig) = hex::decode(hex_sig) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&sig).is_ok()
}

async fn receiver(secret: &'static str) -> Result<Receiver, Box<dyn std::error::Error>> {
    let (tx, rx) = mpsc::unbounded_channel::<Received>();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let tx = tx.clone();
            async move {
                let h = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string()
                };
                if !signature_ok(secret, &body, &h("x-hub-signature-256")) {
                    return StatusCode::UNAUTHORIZED;
                }
                let Ok(payload) = serde_json::from_slice::<Value>(&body) else {
                    return StatusCode::BAD_REQUEST;
                };
                let _ = tx.send(Received {
                    event: h("x-github-event"),
                    delivery: h("x-github-delivery"),
                    user_agent: h("user-agent"),
                    payload,
                });
                StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Receiver {
        url,
        events: Arc::new(Mutex::new(rx)),
    })
}

fn tip(path: &Path, branch: &str) -> Result<Oid, git2::Error> {
    let repo = Repository::open(path)?;
    let oid = repo
        .find_reference(&format!("refs/heads/{branch}"))?
        .peel_to_commit()?
        .id();
    Ok(oid)
}

// ----- tests -----

#[tokio::test]
async fn pulls_list_get_create_with_filters_and_pages() -> TestResult {
    let fx = fixture()?;
    let twin = start(&fx, None).await?;
    let api = Api::new(&twin);
    let pr = twin
        .open_pull_request(
            REPO,
            BUMP,
            "main",
            "Update installer to v1.13.0",
            "body",
            RENOVATE_LOGIN,
        )
        .await?;
    assert_eq!(pr.number, 1);

    // Created over the API, authored by the token's user.
    let created = api
        .call(
            Method::POST,
            "/repos/home/ops/pulls",
            Some(
                json!({"title": "conflicting", "head": format!("home:{CONFLICT}"), "base": "main"}),
            ),
        )
        .await?;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json);
    assert_eq!(created.json["number"], 2);
    assert_eq!(created.json["user"]["login"], twin.login());
    assert_eq!(created.json["mergeable"], false, "conflicts with main");

    // Same head and base again: 422.
    let dup = api
        .call(
            Method::POST,
            "/repos/home/ops/pulls",
            Some(json!({"title": "again", "head": BUMP, "base": "main"})),
        )
        .await?;
    assert_eq!(dup.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(dup.json["message"], "Validation Failed");

    let one = api.get("/repos/home/ops/pulls/1").await?;
    assert_eq!(one.status, StatusCode::OK);
    let j = &one.json;
    assert_eq!(
        j["url"],
        format!("{}/repos/home/ops/pulls/1", twin.base_url())
    );
    assert!(j["id"].as_u64().is_some());
    assert_eq!(j["state"], "open");
    assert_eq!(j["merged"], false);
    assert_eq!(j["mergeable"], true);
    assert_eq!(j["head"]["ref"], BUMP);
    assert_eq!(j["head"]["sha"], fx.bump.to_string());
    assert_eq!(j["head"]["label"], format!("home:{BUMP}"));
    assert_eq!(j["head"]["repo"]["full_name"], REPO);
    assert_eq!(j["base"]["ref"], "main");
    assert_eq!(j["base"]["sha"], fx.main.to_string());
    assert_eq!(j["user"]["login"], RENOVATE_LOGIN);
    assert_eq!(j["user"]["type"], "Bot");
    assert!(j["merge_commit_sha"].is_null());

    // The list has the simple shape: no `merged`.
    let list = api.get("/repos/home/ops/pulls").await?;
    assert_eq!(list.status, StatusCode::OK);
    let items = list.json.as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["number"], 2, "newest first");
    assert!(items[0].get("merged").is_none());

    let by_head = api
        .get(&format!("/repos/home/ops/pulls?head=home:{BUMP}"))
        .await?;
    assert_eq!(by_head.json.as_array().map(Vec::len), Some(1));
    assert_eq!(by_head.json[0]["number"], 1);
    let by_base = api.get("/repos/home/ops/pulls?base=release").await?;
    assert_eq!(by_base.json.as_array().map(Vec::len), Some(0));
    let closed = api.get("/repos/home/ops/pulls?state=closed").await?;
    assert_eq!(closed.json.as_array().map(Vec::len), Some(0));

    let page1 = api
        .get("/repos/home/ops/pulls?state=all&per_page=1")
        .await?;
    assert_eq!(page1.json.as_array().map(Vec::len), Some(1));
    let link = page1.header("link");
    let next = format!(
        "<{}/repos/home/ops/pulls?state=all&per_page=1&page=2>; rel=\"next\"",
        twin.base_url()
    );
    assert!(link.contains(&next), "{link}");
    assert!(link.contains("rel=\"last\""), "{link}");
    let page2 = api
        .get("/repos/home/ops/pulls?state=all&per_page=1&page=2")
        .await?;
    assert_eq!(page2.json[0]["number"], 1);
    assert!(page2.header("link").contains("rel=\"prev\""));

    // Head sha is read live: a push with plain git shows up.
    let repo = Repository::open(&fx.path)?;
    let moved = commit(
        &repo,
        &format!("refs/heads/{BUMP}"),
        Some(fx.bump),
        &[("notes.txt", "x")],
        "more",
        1_767_226_000,
    )?;
    let again = api.get("/repos/home/ops/pulls/1").await?;
    assert_eq!(again.json["head"]["sha"], moved.to_string());

    let missing = api.get("/repos/home/ops/pulls/99").await?;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json["message"], "Not Found");
    assert!(missing.json["documentation_url"].is_string());
    let unknown_repo = api.get("/repos/nobody/nothing/pulls").await?;
    assert_eq!(unknown_repo.status, StatusCode::NOT_FOUND);
    let wrong_method = api
        .call(Method::DELETE, "/repos/home/ops/pulls/1", None)
        .await?;
    assert_eq!(wrong_method.status, StatusCode::NOT_FOUND);
    assert_eq!(wrong_method.json["message"], "Not Found");
    assert!(!wrong_method.header("x-ratelimit-remaining").is_empty());
    Ok(())
}

#[tokio::test]
async fn statuses_validate_list_and_combine() -> TestResult {
    let fx = fixture()?;
    let twin = start(&fx, None).await?;
    let api = Api::new(&twin);
    let sha = fx.bump.to_string();
    let post = |body: Value| {
        let api = &api;
        let sha = sha.clone();
        async move {
            api.call(
                Method::POST,
                &format!("/repos/home/ops/statuses/{sha}"),
                Some(body),
            )
            .await
        }
    };

    // No statuses: pending, empty.
    let empty = api
        .get(&format!("/repos/home/ops/commits/{sha}/status"))
        .await?;
    assert_eq!(empty.json["state"], "pending");
    assert_eq!(empty.json["total_count"], 0);

    let created = post(json!({"state": "success", "description": "a".repeat(140)})).await?;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json);
    assert_eq!(created.json["context"], "default");
    assert_eq!(created.json["state"], "success");
    assert!(created.json["id"].as_u64().is_some());
    assert!(created.json["url"]
        .as_str()
        .is_some_and(|u| u.ends_with(&sha)));
    assert_eq!(created.json["creator"]["login"], twin.login());
    assert!(created.json["created_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));

    let too_long =
        post(json!({"state": "success", "context": "ichor/gate", "description": "a".repeat(141)}))
            .await?;
    assert_eq!(too_long.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(too_long.json["message"], "Validation Failed");
    assert_eq!(too_long.json["errors"][0]["resource"], "Status");
    assert_eq!(too_long.json["errors"][0]["field"], "description");
    assert_eq!(
        too_long.json["errors"][0]["message"],
        "description is too long (maximum is 140 characters)"
    );
    let bad_state = post(json!({"state": "green"})).await?;
    assert_eq!(bad_state.status, StatusCode::UNPROCESSABLE_ENTITY);
    let bad_sha = api
        .call(
            Method::POST,
            &format!("/repos/home/ops/statuses/{}", "0".repeat(40)),
            Some(json!({"state": "success"})),
        )
        .await?;
    assert_eq!(bad_sha.status, StatusCode::UNPROCESSABLE_ENTITY);
    let bad_json = api
        .send(
            Method::POST,
            &format!("/repos/home/ops/statuses/{sha}"),
            None,
            Some(format!("token {}", twin.token())),
        )
        .await?;
    assert_eq!(bad_json.status, StatusCode::BAD_REQUEST);

    // success + pending → pending.
    post(json!({"state": "pending", "context": "ichor/gate", "description": "evaluating"})).await?;
    let combined = api
        .get(&format!("/repos/home/ops/commits/{sha}/status"))
        .await?;
    assert_eq!(combined.json["state"], "pending");
    assert_eq!(combined.json["total_count"], 2);
    assert_eq!(combined.json["sha"], sha);

    // The latest per context wins: gate turns success → success overall.
    post(json!({"state": "success", "context": "ichor/gate", "target_url": "http://x/y"})).await?;
    let combined = api
        .get(&format!("/repos/home/ops/commits/{sha}/status"))
        .await?;
    assert_eq!(combined.json["state"], "success");
    assert_eq!(combined.json["total_count"], 2);

    // Any error or failure → failure; contexts are case-insensitive.
    post(json!({"state": "error", "context": "ICHOR/GATE"})).await?;
    let combined = api
        .get(&format!("/repos/home/ops/commits/{BUMP}/status"))
        .await?;
    assert_eq!(
        combined.json["state"], "failure",
        "the branch name resolves too"
    );
    assert_eq!(combined.json["total_count"], 2);

    // Full list, newest first, paged.
    let list = api
        .get(&format!("/repos/home/ops/commits/{sha}/statuses"))
        .await?;
    let items = list.json.as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 4);
    assert_eq!(items[0]["state"], "error");
    assert_eq!(items[3]["context"], "default");
    let paged = api
        .get(&format!(
            "/repos/home/ops/commits/{sha}/statuses?per_page=3"
        ))
        .await?;
    assert_eq!(paged.json.as_array().map(Vec::len), Some(3));
    assert!(paged.header("link").contains("page=2>; rel=\"next\""));

    let unknown_ref = api
        .get("/repos/home/ops/commits/no-such-branch/status")
        .await?;
    assert_eq!(unknown_ref.status, StatusCode::UNPROCESSABLE_ENTITY);

    // The library view agrees.
    let (state, latest) = twin.combined_status(REPO, &sha)?;
    assert_eq!(state, ichor::sim::github::StatusState::Failure);
    assert_eq!(latest.len(), 2);
    Ok(())
}

/// GitHub's comment limit is in bytes: 262,144 UTF-8 bytes are stored, one more is a 422
/// whose message (GitHub's own) still speaks of 65,536 characters.
#[tokio::test]
async fn comment_bodies_are_limited_to_262144_bytes() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = GithubTwin::start(clock.clone(), vec![RepoSpec::new(REPO, &fx.path)], None).await?;
    let api = Api::new(&twin);
    twin.open_pull_request(REPO, BUMP, "main", "bump", "", RENOVATE_LOGIN)
        .await?;
    let post = |body: String| {
        let api = &api;
        async move {
            api.call(
                Method::POST,
                "/repos/home/ops/issues/1/comments",
                Some(json!({ "body": body })),
            )
            .await
        }
    };
    assert_eq!(post("x".repeat(262_144)).await?.status, StatusCode::CREATED);
    assert_eq!(post("🌈".repeat(65_536)).await?.status, StatusCode::CREATED);
    let refused = post(format!("{}x", "🌈".repeat(65_536))).await?;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(refused.json["errors"][0]["message"]
        .as_str()
        .is_some_and(|m| m == "Body is too long (maximum is 65536 characters)"));
    Ok(())
}

#[tokio::test]
async fn comments_create_list_get_and_update_with_patch_and_post() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = GithubTwin::start(clock.clone(), vec![RepoSpec::new(REPO, &fx.path)], None).await?;
    let api = Api::new(&twin);
    twin.open_pull_request(REPO, BUMP, "main", "bump", "", RENOVATE_LOGIN)
        .await?;
    let human = twin.comment(REPO, 1, "/ichor retry", "alice").await?;

    let created = api
        .call(
            Method::POST,
            "/repos/home/ops/issues/1/comments",
            Some(json!({"body": "<!-- ichor:lab -->\nchecklist"})),
        )
        .await?;
    assert_eq!(created.status, StatusCode::CREATED);
    let id = created.json["id"].as_u64().ok_or("no id")?;
    assert_eq!(created.json["user"]["login"], twin.login());
    assert_eq!(
        created.json["url"],
        format!("{}/repos/home/ops/issues/comments/{id}", twin.base_url())
    );
    assert!(created.json["html_url"]
        .as_str()
        .is_some_and(|u| u.contains("#issuecomment-")));
    assert!(created.json["node_id"].is_string());
    assert_eq!(created.json["created_at"], created.json["updated_at"]);

    let list = api.get("/repos/home/ops/issues/1/comments").await?;
    let items = list.json.as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["id"], human.id, "oldest first");
    assert_eq!(items[0]["user"]["login"], "alice");
    let paged = api
        .get("/repos/home/ops/issues/1/comments?per_page=1")
        .await?;
    assert!(paged.header("link").contains("rel=\"next\""));

    clock.advance(Duration::from_secs(90));
    let patched = api
        .call(
            Method::PATCH,
            &format!("/repos/home/ops/issues/comments/{id}"),
            Some(json!({"body": "<!-- ichor:lab -->\nv2"})),
        )
        .await?;
    assert_eq!(patched.status, StatusCode::OK);
    assert_eq!(patched.json["body"], "<!-- ichor:lab -->\nv2");
    assert_ne!(patched.json["updated_at"], created.json["updated_at"]);
    assert_eq!(patched.json["created_at"], created.json["created_at"]);
    // `since` filters on the update time.
    let since = api
        .get(&format!(
            "/repos/home/ops/issues/1/comments?since={}",
            clock.now().rfc3339()
        ))
        .await?;
    assert_eq!(since.json.as_array().map(Vec::len), Some(1));
    let posted = api
        .call(
            Method::POST,
            &format!("/repos/home/ops/issues/comments/{id}"),
            Some(json!({"body": "<!-- ichor:lab -->\nv3"})),
        )
        .await?;
    assert_eq!(posted.status, StatusCode::OK);
    let got = api
        .get(&format!("/repos/home/ops/issues/comments/{id}"))
        .await?;
    assert_eq!(got.json["body"], "<!-- ichor:lab -->\nv3");
    assert_eq!(got.json["id"], id);

    let missing = api.get("/repos/home/ops/issues/comments/12345").await?;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let no_pr = api
        .call(
            Method::POST,
            "/repos/home/ops/issues/42/comments",
            Some(json!({"body": "x"})),
        )
        .await?;
    assert_eq!(no_pr.status, StatusCode::NOT_FOUND);
    assert_eq!(twin.comments(REPO, 1)?.len(), 2);
    Ok(())
}

#[tokio::test]
async fn merge_makes_a_real_merge_commit_on_main() -> TestResult {
    let fx = fixture()?;
    let twin = start(&fx, None).await?;
    let api = Api::new(&twin);
    twin.open_pull_request(REPO, BUMP, "main", "bump", "", RENOVATE_LOGIN)
        .await?;
    twin.open_pull_request(REPO, CONFLICT, "main", "conflict", "", RENOVATE_LOGIN)
        .await?;

    let stale = api
        .call(
            Method::PUT,
            "/repos/home/ops/pulls/1/merge",
            Some(json!({"sha": fx.main.to_string()})),
        )
        .await?;
    assert_eq!(stale.status, StatusCode::CONFLICT);

    let not_yet = api.get("/repos/home/ops/pulls/1/merge").await?;
    assert_eq!(not_yet.status, StatusCode::NOT_FOUND);

    let merged = api
        .call(
            Method::PUT,
            "/repos/home/ops/pulls/1/merge",
            Some(json!({"sha": fx.bump.to_string(), "merge_method": "merge"})),
        )
        .await?;
    assert_eq!(merged.status, StatusCode::OK, "{}", merged.json);
    assert_eq!(merged.json["merged"], true);
    let sha = merged.json["sha"].as_str().ok_or("no sha")?.to_string();

    // A real commit on main: two parents (old main, the PR head) and the PR's content.
    let main = tip(&fx.path, "main")?;
    assert_eq!(main.to_string(), sha);
    let repo = Repository::open(&fx.path)?;
    let c = repo.find_commit(main)?;
    let parents: Vec<Oid> = c.parent_ids().collect();
    assert_eq!(parents, vec![fx.main, fx.bump]);
    assert!(c.message()?.starts_with("Merge pull request #1 from home/"));
    let entry = c.tree()?.get_path(Path::new(RELEASE_SET))?;
    let blob = repo.find_blob(entry.id())?;
    assert!(String::from_utf8_lossy(blob.content()).contains("v1.13.0"));
    assert!(c.tree()?.get_path(Path::new("README.md")).is_ok());

    let pr = api.get("/repos/home/ops/pulls/1").await?;
    assert_eq!(pr.json["state"], "closed");
    assert_eq!(pr.json["merged"], true);
    assert_eq!(pr.json["merge_commit_sha"], sha);
    assert!(pr.json["merged_at"].is_string());
    assert_eq!(pr.json["merged_by"]["login"], twin.login());
    assert_eq!(
        pr.json["head"]["sha"],
        fx.bump.to_string(),
        "a closed PR keeps its head"
    );
    let is_merged = api.get("/repos/home/ops/pulls/1/merge").await?;
    assert_eq!(is_merged.status, StatusCode::NO_CONTENT);

    let twice = api
        .call(Method::PUT, "/repos/home/ops/pulls/1/merge", None)
        .await?;
    assert_eq!(twice.status, StatusCode::METHOD_NOT_ALLOWED);
    let conflicting = api
        .call(
            Method::PUT,
            "/repos/home/ops/pulls/2/merge",
            Some(json!({})),
        )
        .await?;
    assert_eq!(conflicting.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(conflicting.json["message"], "Pull Request is not mergeable");
    assert_eq!(
        tip(&fx.path, "main")?.to_string(),
        sha,
        "main unchanged by the refused merge"
    );

    let closed = api.get("/repos/home/ops/pulls?state=closed").await?;
    assert_eq!(closed.json[0]["merged_at"], pr.json["merged_at"]);

    // From the merge commit (what a rollout reports on) back to its PR.
    let of_merge = api
        .get(&format!("/repos/home/ops/commits/{sha}/pulls"))
        .await?;
    assert_eq!(of_merge.status, StatusCode::OK);
    assert_eq!(of_merge.json.as_array().map(Vec::len), Some(1));
    assert_eq!(of_merge.json[0]["number"], 1);
    let of_head = api
        .get(&format!("/repos/home/ops/commits/{}/pulls", fx.bump))
        .await?;
    assert_eq!(of_head.json[0]["number"], 1);
    let of_old_main = api
        .get(&format!("/repos/home/ops/commits/{}/pulls", fx.main))
        .await?;
    assert_eq!(of_old_main.json.as_array().map(Vec::len), Some(0));
    Ok(())
}

#[tokio::test]
async fn auth_and_primary_rate_limit() -> TestResult {
    let fx = fixture()?;
    let clock = Clock::manual();
    let twin = GithubTwin::start_with(
        clock.clone(),
        GithubTwinConfig {
            repos: vec![RepoSpec::new(REPO, &fx.path)],
            token: Some("ghp_test".into()),
            rate_limit: 3,
            ..GithubTwinConfig::default()
        },
    )
    .await?;
    let api = Api::new(&twin);
    assert_eq!(twin.token(), "ghp_test");

    let none = api
        .send(Method::GET, "/repos/home/ops/pulls", None, None)
        .await?;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.json["message"], "Requires authentication");
    assert!(!none.header("x-ratelimit-limit").is_empty());
    let wrong = api
        .send(
            Method::GET,
            "/repos/home/ops/pulls",
            None,
            Some("Bearer nope".into()),
        )
        .await?;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.json["message"], "Bad credentials");

    let a = api
        .send(
            Method::GET,
            "/repos/home/ops/pulls",
            None,
            Some("token ghp_test".into()),
        )
        .await?;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("x-ratelimit-limit"), "3");
    assert_eq!(a.header("x-ratelimit-used"), "1");
    assert_eq!(a.header("x-ratelimit-remaining"), "2");
    assert_eq!(a.header("x-ratelimit-resource"), "core");
    let reset: u64 = a.header("x-ratelimit-reset").parse()?;
    assert_eq!(reset, clock.now().as_millis() / 1000 + 3600);

    let b = api.get("/repos/home/ops/pulls").await?;
    assert_eq!(b.header("x-ratelimit-remaining"), "1");
    // `/rate_limit` is free.
    let rl = api.get("/rate_limit").await?;
    assert_eq!(rl.json["resources"]["core"]["remaining"], 1);
    assert_eq!(rl.json["rate"]["used"], 2);
    assert_eq!(rl.json["rate"]["limit"], 3);
    let c = api.get("/repos/home/ops/pulls").await?;
    assert_eq!(c.header("x-ratelimit-remaining"), "0");
    let d = api.get("/repos/home/ops/pulls").await?;
    assert_eq!(d.status, StatusCode::FORBIDDEN);
    assert!(d.json["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("API rate limit exceeded")));

    // A new hour on the twin's clock resets the window.
    clock.advance(Duration::from_secs(3600));
    let e = api.get("/repos/home/ops/pulls").await?;
    assert_eq!(e.status, StatusCode::OK);
    assert_eq!(e.header("x-ratelimit-remaining"), "2");
    Ok(())
}

#[tokio::test]
async fn injected_server_errors_and_secondary_rate_limit() -> TestResult {
    let fx = fixture()?;
    let twin = GithubTwin::start_with(
        Clock::manual(),
        GithubTwinConfig {
            repos: vec![RepoSpec::new(REPO, &fx.path)],
            faults: GithubFaults {
                server_errors: 1,
                server_error_status: 502,
                ..GithubFaults::default()
            },
            ..GithubTwinConfig::default()
        },
    )
    .await?;
    let api = Api::new(&twin);

    // From the configuration: one 502.
    let first = api.get("/repos/home/ops/pulls").await?;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    assert!(!first.header("x-ratelimit-remaining").is_empty());
    assert_eq!(
        api.get("/repos/home/ops/pulls").await?.status,
        StatusCode::OK
    );

    // At run time: two 503s, then normal service.
    twin.fail_next_requests(2, 503);
    assert_eq!(
        api.get("/repos/home/ops/pulls").await?.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        api.get("/rate_limit").await?.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        api.get("/repos/home/ops/pulls").await?.status,
        StatusCode::OK
    );

    twin.secondary_rate_limit_next(1, 42);
    let limited = api
        .call(
            Method::POST,
            &format!("/repos/home/ops/statuses/{}", fx.bump),
            Some(json!({"state": "pending"})),
        )
        .await?;
    assert_eq!(limited.status, StatusCode::FORBIDDEN);
    assert_eq!(limited.header("retry-after"), "42");
    assert!(limited.json["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("You have exceeded a secondary rate limit")));
    assert!(
        twin.statuses(REPO, &fx.bump.to_string())?.is_empty(),
        "nothing was written"
    );
    let retried = api
        .call(
            Method::POST,
            &format!("/repos/home/ops/statuses/{}", fx.bump),
            Some(json!({"state": "pending"})),
        )
        .await?;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert_eq!(
        twin.faults(),
        GithubFaults {
            server_error_status: 503,
            retry_after_secs: 42,
            ..GithubFaults::default()
        }
    );
    Ok(())
}

#[tokio::test]
async fn webhooks_are_signed_and_logged() -> TestResult {
    let fx = fixture()?;
    let rx = receiver("s3cret").await?;
    let twin = start(&fx, Some((rx.url.clone(), "s3cret".into()))).await?;
    let api = Api::new(&twin);

    let pr = twin
        .open_pull_request(REPO, BUMP, "main", "bump", "renovate body", RENOVATE_LOGIN)
        .await?;
    let opened = rx.next().await?;
    assert_eq!(opened.event, "pull_request");
    assert_eq!(opened.payload["action"], "opened");
    assert_eq!(opened.payload["number"], pr.number);
    assert_eq!(opened.payload["pull_request"]["head"]["ref"], BUMP);
    assert_eq!(
        opened.payload["pull_request"]["head"]["sha"],
        fx.bump.to_string()
    );
    assert_eq!(opened.payload["repository"]["full_name"], REPO);
    assert_eq!(opened.payload["sender"]["login"], RENOVATE_LOGIN);
    assert!(opened.user_agent.starts_with("GitHub-Hookshot/"));
    assert_eq!(opened.delivery.len(), 36);

    // Renovate pushes a new commit: push, then synchronize.
    let new_head = twin
        .push_commit(
            REPO,
            BUMP,
            &[(RELEASE_SET, &release_set("v1.13.1"))],
            "bump to v1.13.1",
            RENOVATE_LOGIN,
        )
        .await?;
    let push = rx.next().await?;
    assert_eq!(push.event, "push");
    assert_eq!(push.payload["ref"], format!("refs/heads/{BUMP}"));
    assert_eq!(push.payload["before"], fx.bump.to_string());
    assert_eq!(push.payload["after"], new_head);
    assert_eq!(push.payload["forced"], false);
    assert_eq!(push.payload["commits"][0]["modified"][0], RELEASE_SET);
    let sync = rx.next().await?;
    assert_eq!(sync.payload["action"], "synchronize");
    assert_eq!(sync.payload["before"], fx.bump.to_string());
    assert_eq!(sync.payload["after"], new_head);
    assert_eq!(sync.payload["pull_request"]["head"]["sha"], new_head);
    assert_eq!(twin.pull_request(REPO, 1)?.head_sha, new_head);
    let pull_ref = Repository::open(&fx.path)?
        .find_reference("refs/pull/1/head")?
        .peel_to_commit()?
        .id();
    assert_eq!(pull_ref.to_string(), new_head);

    // A human comment.
    twin.comment(REPO, 1, "/ichor retry", "alice").await?;
    let comment = rx.next().await?;
    assert_eq!(comment.event, "issue_comment");
    assert_eq!(comment.payload["action"], "created");
    assert_eq!(comment.payload["comment"]["body"], "/ichor retry");
    assert_eq!(comment.payload["issue"]["number"], 1);
    assert!(comment.payload["issue"]["pull_request"]["url"].is_string());

    // A comment over the API: the webhook follows the response.
    let before = twin.deliveries().len();
    api.call(
        Method::POST,
        "/repos/home/ops/issues/1/comments",
        Some(json!({"body": "from ichor"})),
    )
    .await?;
    let log = twin.wait_for_deliveries(before + 1).await;
    assert_eq!(log[before].event, "issue_comment");
    assert_eq!(
        rx.next().await?.payload["comment"]["user"]["login"],
        twin.login()
    );

    // Merge: push to main, then closed with merged.
    let merge_sha = twin.merge_pull_request(REPO, 1, "alice").await?;
    let push_main = rx.next().await?;
    assert_eq!(push_main.event, "push");
    assert_eq!(push_main.payload["ref"], "refs/heads/main");
    assert_eq!(push_main.payload["after"], merge_sha);
    let closed = rx.next().await?;
    assert_eq!(closed.payload["action"], "closed");
    assert_eq!(closed.payload["pull_request"]["merged"], true);
    assert_eq!(
        closed.payload["pull_request"]["merge_commit_sha"],
        merge_sha
    );

    // The log has every delivery with the receiver's status.
    let log = twin.deliveries();
    let events: Vec<(&str, Option<&str>)> = log
        .iter()
        .map(|d| (d.event.as_str(), d.action.as_deref()))
        .collect();
    assert_eq!(
        events,
        vec![
            ("pull_request", Some("opened")),
            ("push", None),
            ("pull_request", Some("synchronize")),
            ("issue_comment", Some("created")),
            ("issue_comment", Some("created")),
            ("push", None),
            ("pull_request", Some("closed")),
        ]
    );
    assert!(log.iter().all(|d| d.status() == Some(204)));
    assert_eq!(log[0].id, opened.delivery);

    // A dropped webhook: logged, never sent.
    twin.drop_next_webhooks(1);
    twin.comment(REPO, 1, "dropped", "alice").await?;
    let last = twin.deliveries().pop().ok_or("empty log")?;
    assert_eq!(last.outcome, DeliveryOutcome::Dropped);
    twin.comment(REPO, 1, "delivered", "alice").await?;
    assert_eq!(rx.next().await?.payload["comment"]["body"], "delivered");
    assert!(rx.nothing_pending().await);
    Ok(())
}

#[tokio::test]
async fn a_receiver_rejects_the_wrong_secret() -> TestResult {
    let fx = fixture()?;
    let rx = receiver("right").await?;
    let twin = start(&fx, Some((rx.url.clone(), "wrong".into()))).await?;
    twin.open_pull_request(REPO, BUMP, "main", "bump", "", RENOVATE_LOGIN)
        .await?;
    let log = twin.deliveries();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].status(), Some(401));
    assert!(rx.nothing_pending().await);

    // Fixing the secret at run time fixes delivery.
    twin.set_webhook(Some(WebhookTarget {
        url: rx.url.clone(),
        secret: "right".into(),
    }));
    twin.comment(REPO, 1, "hello", "alice").await?;
    assert_eq!(twin.deliveries()[1].status(), Some(204));
    assert_eq!(rx.next().await?.event, "issue_comment");

    // An unreachable receiver is a failed delivery, not an error for the caller.
    twin.set_webhook(Some(WebhookTarget {
        url: "http://127.0.0.1:1/hook".into(),
        secret: "right".into(),
    }));
    twin.comment(REPO, 1, "lost", "alice").await?;
    assert!(matches!(
        twin.deliveries()[2].outcome,
        DeliveryOutcome::Failed { .. }
    ));
    Ok(())
}

#[tokio::test]
async fn renovate_rebase_is_a_forced_push_and_closing_is_not_merging() -> TestResult {
    let fx = fixture()?;
    let rx = receiver("s").await?;
    let twin = start(&fx, Some((rx.url.clone(), "s".into()))).await?;
    let api = Api::new(&twin);
    twin.open_pull_request(REPO, BUMP, "main", "bump", "", RENOVATE_LOGIN)
        .await?;
    rx.next().await?;

    // Renovate rebases onto main: the branch jumps to a commit that is not a descendant.
    let rebased = commit(
        &Repository::open(&fx.path)?,
        "refs/heads/scratch",
        Some(fx.main),
        &[(RELEASE_SET, &release_set("v1.13.0"))],
        "Update installer to v1.13.0 (rebased)",
        1_767_226_100,
    )?;
    twin.force_push(REPO, BUMP, &rebased.to_string(), RENOVATE_LOGIN)
        .await?;
    let push = rx.next().await?;
    assert_eq!(push.event, "push");
    assert_eq!(push.payload["forced"], true);
    assert_eq!(push.payload["before"], fx.bump.to_string());
    assert_eq!(push.payload["after"], rebased.to_string());
    let sync = rx.next().await?;
    assert_eq!(sync.payload["action"], "synchronize");
    let pr = api.get("/repos/home/ops/pulls/1").await?;
    assert_eq!(pr.json["head"]["sha"], rebased.to_string());
    assert_eq!(pr.json["mergeable"], true);

    twin.close_pull_request(REPO, 1, "alice").await?;
    let closed = rx.next().await?;
    assert_eq!(closed.payload["action"], "closed");
    assert_eq!(closed.payload["pull_request"]["merged"], false);
    assert!(closed.payload["pull_request"]["merge_commit_sha"].is_null());
    assert_eq!(
        tip(&fx.path, "main")?,
        fx.main,
        "closing does not touch main"
    );
    let merge = api
        .call(Method::PUT, "/repos/home/ops/pulls/1/merge", None)
        .await?;
    assert_eq!(merge.status, StatusCode::METHOD_NOT_ALLOWED);
    Ok(())
}

#[tokio::test]
async fn conditional_requests_answer_304_for_free() -> TestResult {
    let fx = fixture()?;
    let twin = start(&fx, None).await?;
    let api = Api::new(&twin);
    twin.open_pull_request(REPO, BUMP, "main", "bump", "", RENOVATE_LOGIN)
        .await?;
    let first = api.get("/repos/home/ops/pulls").await?;
    let etag = first.header("etag");
    assert!(etag.starts_with('"'), "{etag}");
    let used = first.header("x-ratelimit-used");

    let auth = format!("Bearer {}", twin.token());
    let mut req = hyper::Request::get(format!("{}/repos/home/ops/pulls", twin.base_url()))
        .header("authorization", auth.as_str())
        .header("user-agent", "ichor-test")
        .header("if-none-match", etag.as_str())
        .body(Body::empty())?;
    let resp = api.client.request(req).await?;
    assert_eq!(resp.status(), StatusCode::NOT_MODIFIED);
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(h("x-ratelimit-used"), used, "a 304 does not count");
    assert_eq!(h("etag"), etag);

    // A change makes the old tag stale.
    twin.open_pull_request(REPO, CONFLICT, "main", "other", "", RENOVATE_LOGIN)
        .await?;
    req = hyper::Request::get(format!("{}/repos/home/ops/pulls", twin.base_url()))
        .header("authorization", auth.as_str())
        .header("user-agent", "ichor-test")
        .header("if-none-match", etag.as_str())
        .body(Body::empty())?;
    let resp = api.client.request(req).await?;
    assert_eq!(resp.status(), StatusCode::OK);
    Ok(())
}

/// `ichor sim --github --github-app` registers a GitHub App installed on the emulated
/// repository and writes what `ichor run` needs to act as it; ichor's own client then
/// posts a check run as that App, which a token could not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ichor_sim_with_a_github_app_lets_ichor_post_check_runs() -> TestResult {
    use ichor::forge::github::{
        CheckRunOut, Conclusion, GithubAuth, GithubClient, GithubConfig, RunState,
    };
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let work = tempfile::tempdir()?;
    let repo = work.path().join("homelab");
    ichor::sim::fixture::Fixture::homelab().build(&repo)?;
    let state = work.path().join("state");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(["sim", "--github", "--github-app", "--cluster"])
        .arg(repo.join("clusters/homelab"))
        .arg("--state-dir")
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("stdout")?;
    let (mut base, mut printed) = (String::new(), String::new());
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        printed.push_str(&line);
        printed.push('\n');
        if let Some(rest) = line.strip_prefix("GitHub API") {
            base = rest.trim().to_string();
        }
        if line.starts_with("Serving until interrupted") {
            break;
        }
    }
    let app_dir = state.join("github-app");
    let read = |f: &str| std::fs::read_to_string(app_dir.join(f));
    let (app_id, installation_id) = (read("app-id")?.parse()?, read("installation-id")?.parse()?);
    let key = read("private-key.pem")?;
    assert!(!printed.contains("PRIVATE KEY"), "the key is never printed");
    assert!(printed.contains("installationId"), "{printed}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(app_dir.join("private-key.pem"))?
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the key is the owner's alone");

    let client = GithubClient::connect(
        GithubConfig {
            api_url: base.clone(),
            repo: "local/homelab".into(),
            auth: GithubAuth::App {
                app_id,
                installation_id,
                private_key: ichor::secret::Secret::new(key),
            },
        },
        Clock::system(),
    )
    .await;
    let result = async {
        let client = client?;
        assert_eq!(client.login(), "ichor[bot]");
        let main = Repository::open(&repo)?
            .revparse_single("main")?
            .id()
            .to_string();
        let run = CheckRunOut {
            state: RunState::Completed(Conclusion::Success),
            title: "passed".into(),
            summary: "### ichor gate".into(),
            text: String::new(),
            annotations: vec![],
        };
        assert!(client.upsert_check_run(&main, "ichor/gate", &run).await?);
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .await;
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()?;
    assert!(child.wait()?.success());
    result
}
