//! The GitHub REST emulator: an axum server that answers like `api.github.com` for pull
//! requests, commit statuses and issue comments over real git repositories (git2), and
//! delivers signed webhooks. ichor's GitHub reporter points its client at
//! [`GithubTwin::base_url`] with [`GithubTwin::token`]; tests and `ichor demo` act as a
//! user or Renovate through the library calls (open a PR, push, force-push, merge,
//! comment). The shapes follow GitHub's REST documentation and deserialize into
//! octocrab's models.
//!
//! Routes (all need `Authorization: Bearer|token <token>`: the personal access token, an
//! installation token, or — for the `/app` routes only — an App's JWT):
//! - `GET /app`, `POST /app/installations/{id}/access_tokens`,
//!   `GET /repos/{o}/{r}/installation` (JWT, RS256 with the App's key; `iss`, `iat`, `exp`
//!   checked on the twin's clock, 401 with GitHub's messages)
//! - `GET /repos/{o}/{r}/collaborators/{user}/permission`
//! - `GET /rate_limit`, `GET /user`, `GET /repos/{o}/{r}`
//! - `GET|POST /repos/{o}/{r}/pulls` (`state`, `head=owner:branch`, `base`, `sort`,
//!   `direction`, `per_page`, `page`, `Link`), `GET /repos/{o}/{r}/pulls/{n}`
//! - `PUT /repos/{o}/{r}/pulls/{n}/merge` (`merge` or `squash`; 405 not mergeable, 409
//!   head moved), `GET` on the same path (204 merged / 404)
//! - `POST /repos/{o}/{r}/statuses/{sha}`, `GET /repos/{o}/{r}/commits/{ref}/statuses`,
//!   `GET /repos/{o}/{r}/commits/{ref}/status`, `GET /repos/{o}/{r}/commits/{sha}/pulls`
//! - `GET|POST /repos/{o}/{r}/issues/{n}/comments` (`since`, paging),
//!   `GET|PATCH|POST /repos/{o}/{r}/issues/comments/{id}`
//! - git smart HTTP at `/{o}/{r}.git/...` (fetch and push, Basic auth with the token as
//!   the password; see `smart_http.rs`): [`GithubTwin::clone_url`]
//!
//! Simulated faithfully: JSON shapes and error bodies (404, 401, 422 validation, 405/409
//! on merge), status rules (140-character descriptions, 255-character contexts, 1000 per
//! sha and context, combined state), the primary rate limit per hour of the twin's clock
//! with `x-ratelimit-*` headers on every answer, PR head/base shas read live from the
//! branches, `refs/pull/{n}/head`, real merge commits, webhooks (`pull_request` opened /
//! synchronize / closed, `push`, `issue_comment` created / edited) with
//! `X-Hub-Signature-256`, delivered in order by one task; `ETag` on every 200 to a GET
//! and a free 304 for a matching `If-None-Match`. GitHub Apps ([`GithubApp`]):
//! installation tokens (`ghs_…`, one hour on the twin's clock) scoped to their
//! installation's repositories, with their own rate-limit window, acting as
//! `<slug>[bot]`. Check runs (`checks.rs`: create, update in place by their App only,
//! list for a ref; 65,535-byte outputs, 50 annotations per request, 1,000 runs of a
//! name per suite; a personal access token is refused). Collaborator roles ([`GithubTwin::add_collaborator`]; the token's user
//! and the owner are admins). PRs from forks ([`GithubTwin::push_fork_commit`],
//! [`GithubTwin::open_fork_pull_request`]): `head.repo` is the fork, `fork: true`.
//! Faults: 5xx bursts, secondary rate limits, dropped webhooks.
//!
//! Not simulated: fork repositories beyond a PR's head, drafts beyond the flag, reviews,
//! labels, check suites and their webhooks, branch protection and required checks, GraphQL,
//! `If-Modified-Since`, HTTPS, webhook redelivery, the test merge commit of an open PR
//! (`merge_commit_sha` stays null until merged), App webhooks and token narrowing,
//! permission checks on writes.

mod api;
mod app;
mod checks;
mod forge;
mod git;
mod json;
mod model;
mod smart_http;
mod webhook;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use app::{
    emulator_app, AppInstallation, GithubApp, EMULATOR_APP_ID, EMULATOR_APP_KEY,
    EMULATOR_INSTALLATION_ID,
};
pub use checks::{Annotation, CheckRun};
pub use forge::MergeRequest;
pub use model::{CommitStatus, IssueComment, PullRequest, PullState, RepoSpec, Role, StatusState};
pub use smart_http::MAX_GIT_BODY;
pub use webhook::{signature_256, ContentType, Delivery, DeliveryOutcome, WebhookTarget};

use crate::clock::Clock;
use crate::sim::net::NetLimits;
use forge::{lock, Shared};

#[derive(Debug, thiserror::Error)]
pub enum GithubError {
    #[error("repository {0:?} is not served by the twin")]
    UnknownRepo(String),
    #[error("repository name {0:?} is not of the form owner/name")]
    BadRepoName(String),
    #[error("{repo} has no pull request #{number}")]
    UnknownPull { repo: String, number: u64 },
    #[error("{repo} has no issue comment {id}")]
    UnknownComment { repo: String, id: u64 },
    #[error("{repo} has no check run {id}")]
    UnknownCheckRun { repo: String, id: u64 },
    #[error("check run belongs to another App than {app_id}")]
    NotYourCheckRun { app_id: u64 },
    #[error("{repo} has no commit for {reference:?}")]
    UnknownRef { repo: String, reference: String },
    #[error("{resource}.{field} is invalid: {message}")]
    Validation {
        resource: &'static str,
        field: &'static str,
        code: &'static str,
        message: String,
    },
    #[error("pull request #{number} is not mergeable")]
    NotMergeable { number: u64 },
    #[error("the head of pull request #{number} moved; not merging")]
    HeadModified { number: u64 },
    #[error("merge method {0:?} is not allowed")]
    MergeMethodNotAllowed(String),
    #[error("git: {what}: {source}")]
    Git {
        what: String,
        #[source]
        source: git2::Error,
    },
    #[error("could not bind the GitHub twin on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("GitHub App key: {0}")]
    AppKey(String),
    #[error("{0:?} is not a collaborator role (admin, maintain, write, triage or read)")]
    UnknownRole(String),
    #[error("no delivery {0:?} in the log")]
    UnknownDelivery(String),
    #[error("the emulator's clone of {repo}: {message}")]
    Clone { repo: PathBuf, message: String },
}

/// Faults to inject; set them in [`GithubTwinConfig`] or at run time with
/// [`GithubTwin::set_faults`] / the helpers. Each counter is consumed one request (or one
/// webhook) at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GithubFaults {
    /// The next N API requests answer `server_error_status`.
    pub server_errors: u32,
    /// 502 or 503 (any 5xx is accepted; anything else becomes 502).
    pub server_error_status: u16,
    /// The next N API requests hit the secondary rate limit: `secondary_status` (403 or
    /// 429), GitHub's message, `x-ratelimit-remaining` untouched (above zero) and a
    /// `retry-after` of `retry_after_secs`, or none when that is 0 — GitHub documents all
    /// of these shapes (github/docs, content/rest/using-the-rest-api/
    /// rate-limits-for-the-rest-api.md, "Exceeding the rate limit").
    pub secondary_rate_limits: u32,
    pub retry_after_secs: u64,
    /// 403 (the default) or 429.
    pub secondary_status: u16,
    /// Only content-creating requests (anything but GET) hit the secondary limit, as
    /// GitHub's limit on content creation does.
    pub secondary_writes_only: bool,
    /// The next N webhooks are not sent (logged as [`DeliveryOutcome::Dropped`]).
    pub dropped_webhooks: u32,
    /// The next N webhooks are held back (logged as [`DeliveryOutcome::Held`]) until
    /// [`GithubTwin::release_held_webhooks`]: GitHub does not promise delivery order.
    pub held_webhooks: u32,
}

impl Default for GithubFaults {
    fn default() -> Self {
        GithubFaults {
            server_errors: 0,
            server_error_status: 502,
            secondary_rate_limits: 0,
            retry_after_secs: 60,
            secondary_status: 403,
            secondary_writes_only: false,
            dropped_webhooks: 0,
            held_webhooks: 0,
        }
    }
}

#[derive(Clone, Debug)]
pub struct GithubTwinConfig {
    pub repos: Vec<RepoSpec>,
    pub webhook: Option<WebhookTarget>,
    /// The token clients must present; a random one when `None`.
    pub token: Option<String>,
    /// The user the token belongs to: the author of statuses and comments made over HTTP.
    pub login: String,
    /// Requests per hour (of the twin's clock) for the token.
    pub rate_limit: u64,
    pub faults: GithubFaults,
    /// Where to listen; `127.0.0.1:0` (an ephemeral port) by default.
    pub listen: SocketAddr,
    /// Connection limits of the listener.
    pub net: NetLimits,
    /// GitHub Apps that may authenticate with a JWT and trade it for installation tokens.
    pub apps: Vec<GithubApp>,
}

impl Default for GithubTwinConfig {
    fn default() -> Self {
        GithubTwinConfig {
            repos: Vec::new(),
            webhook: None,
            token: None,
            login: "ichor-bot".to_string(),
            rate_limit: 5000,
            faults: GithubFaults::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            net: NetLimits::default(),
            apps: Vec::new(),
        }
    }
}

/// A running GitHub twin. Dropping it stops the server.
pub struct GithubTwin {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    server: Option<JoinHandle<()>>,
}

/// The login Renovate's PRs carry.
pub const RENOVATE_LOGIN: &str = "renovate[bot]";

impl GithubTwin {
    /// Serve `repos` on an ephemeral loopback port; deliver webhooks to `(url, secret)`.
    pub async fn start(
        clock: Clock,
        repos: Vec<RepoSpec>,
        webhook: Option<(String, String)>,
    ) -> Result<GithubTwin, GithubError> {
        let config = GithubTwinConfig {
            repos,
            webhook: webhook.map(|(url, secret)| WebhookTarget { url, secret }),
            ..GithubTwinConfig::default()
        };
        Self::start_with(clock, config).await
    }

    pub async fn start_with(
        clock: Clock,
        config: GithubTwinConfig,
    ) -> Result<GithubTwin, GithubError> {
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| GithubError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| GithubError::Bind {
            addr: config.listen,
            source,
        })?;
        let token = config.token.unwrap_or_else(|| {
            let bytes: [u8; 18] = rand::random();
            format!("ghp_{}", hex::encode(bytes))
        });
        let shared = Arc::new(Shared::new(
            clock,
            format!("http://{addr}"),
            token,
            config.login,
            config.repos,
            config.webhook,
            config.faults,
            config.rate_limit,
            config.apps,
        )?);
        // Working on a request: a simulation driver holds time still until it is answered.
        let clock = shared.clock.clone();
        let app = api::router(shared.clone())
            .merge(smart_http::router(shared.clone()))
            .layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    let busy = clock.busy();
                    async move {
                        let answer = next.run(req).await;
                        drop(busy);
                        answer
                    }
                },
            ));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(shared.clone().run_deliveries(stop.subscribe()));
        let server = tokio::spawn(crate::sim::net::serve_http(
            listener,
            None,
            app,
            config.net,
            Default::default(),
            stopped,
        ));
        tracing::info!(%addr, "github twin listening");
        Ok(GithubTwin {
            shared,
            addr,
            stop,
            server: Some(server),
        })
    }

    /// `http://127.0.0.1:PORT`: what a client uses as its API base URI.
    pub fn base_url(&self) -> String {
        self.shared.base.clone()
    }

    /// `http://127.0.0.1:PORT/{owner}/{repo}.git`: where git clones and fetches `repo`
    /// (smart HTTP, Basic auth with [`GithubTwin::token`] as the password).
    pub fn clone_url(&self, repo: &str) -> String {
        format!("{}/{repo}.git", self.shared.base)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The personal access token the API accepts (`Authorization: Bearer|token <t>`).
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The login the token belongs to.
    pub fn login(&self) -> &str {
        &self.shared.login
    }

    pub fn set_webhook(&self, target: Option<WebhookTarget>) {
        *lock(&self.shared.webhook) = target;
    }

    /// Serialize webhook payloads as `json` or as `form` (`payload=<JSON>`, GitHub's
    /// default for a new repository webhook).
    pub fn set_webhook_content_type(&self, content_type: ContentType) {
        *lock(&self.shared.content_type) = content_type;
    }

    // ----- faults -----

    pub fn set_faults(&self, faults: GithubFaults) {
        *lock(&self.shared.faults) = faults;
    }

    pub fn faults(&self) -> GithubFaults {
        lock(&self.shared.faults).clone()
    }

    /// The next `n` API requests answer `status` (502 or 503).
    pub fn fail_next_requests(&self, n: u32, status: u16) {
        let mut f = lock(&self.shared.faults);
        f.server_errors = n;
        f.server_error_status = status;
    }

    /// The next `n` API requests hit the secondary rate limit.
    pub fn secondary_rate_limit_next(&self, n: u32, retry_after_secs: u64) {
        let mut f = lock(&self.shared.faults);
        f.secondary_rate_limits = n;
        f.retry_after_secs = retry_after_secs;
    }

    /// The next `n` API requests (only content-creating ones with `writes_only`) hit the
    /// secondary rate limit with `status` (403 or 429) and `retry-after` when given.
    pub fn secondary_rate_limit_shaped(
        &self,
        n: u32,
        status: u16,
        retry_after_secs: Option<u64>,
        writes_only: bool,
    ) {
        let mut f = lock(&self.shared.faults);
        f.secondary_rate_limits = n;
        f.secondary_status = status;
        f.retry_after_secs = retry_after_secs.unwrap_or(0);
        f.secondary_writes_only = writes_only;
    }

    /// The next `n` webhooks are dropped (logged, never sent).
    /// Rename or transfer `old` to `new` (`owner/name`): the API answers the old name with
    /// GitHub's redirect to `/repositories/{id}`.
    pub fn rename_repo(&self, old: &str, new: &str) -> Result<(), GithubError> {
        self.shared.rename_repo(old, new)
    }

    pub fn drop_next_webhooks(&self, n: u32) {
        lock(&self.shared.faults).dropped_webhooks = n;
    }

    /// The next `n` webhooks are held back until [`GithubTwin::release_held_webhooks`],
    /// so they arrive after later ones.
    pub fn hold_next_webhooks(&self, n: u32) {
        lock(&self.shared.faults).held_webhooks = n;
    }

    /// Send the held webhooks now, oldest first, each with the delivery id it was given.
    pub async fn release_held_webhooks(&self) -> Vec<Delivery> {
        self.shared.release_held().await
    }

    /// Redeliver a logged delivery as GitHub's "Redeliver" does: the same body and the same
    /// `X-GitHub-Delivery` (the delivery's `guid`, "shared with all deliveries" of the
    /// event, per the `hook-delivery` schema in github/rest-api-description,
    /// descriptions/api.github.com/api.github.com.yaml), freshly signed.
    pub async fn redeliver(&self, delivery_id: &str) -> Result<Delivery, GithubError> {
        self.shared.redeliver(delivery_id).await
    }

    /// A handle that sets the dropped-webhooks fault, for `POST /_twin/faults`.
    pub fn webhook_faults(&self) -> WebhookFaults {
        WebhookFaults(self.shared.clone())
    }

    // ----- acting as a user or Renovate -----

    /// Open a PR from `head` into `base` as `author`; waits for the `opened` webhook.
    pub async fn open_pull_request(
        &self,
        repo: &str,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
        author: &str,
    ) -> Result<PullRequest, GithubError> {
        let (pr, ticket) =
            self.shared
                .create_pull(repo, head, base, title, Some(body), author, false)?;
        self.shared.wait_delivered(ticket).await;
        Ok(pr)
    }

    /// Commit `files` (path, content) on `branch` (created from the default branch when
    /// missing) as `pusher`; waits for the `push` and `synchronize` webhooks. Returns the
    /// new commit's sha.
    pub async fn push_commit(
        &self,
        repo: &str,
        branch: &str,
        files: &[(&str, &str)],
        message: &str,
        pusher: &str,
    ) -> Result<String, GithubError> {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(p, c)| (p.to_string(), c.to_string()))
            .collect();
        let (sha, ticket) = self
            .shared
            .push_files(repo, branch, &files, message, pusher)?;
        self.shared.wait_delivered(ticket).await;
        Ok(sha)
    }

    /// Point `branch` at an existing commit, as a (force) push does — Renovate's rebase.
    pub async fn force_push(
        &self,
        repo: &str,
        branch: &str,
        sha: &str,
        pusher: &str,
    ) -> Result<(), GithubError> {
        let ticket = self.shared.set_branch(repo, branch, sha, pusher)?;
        self.shared.wait_delivered(ticket).await;
        Ok(())
    }

    /// Merge a PR with a real merge commit on its base branch; returns the merge commit.
    pub async fn merge_pull_request(
        &self,
        repo: &str,
        number: u64,
        merger: &str,
    ) -> Result<String, GithubError> {
        let (sha, ticket) =
            self.shared
                .merge_pull(repo, number, &MergeRequest::default(), merger)?;
        self.shared.wait_delivered(ticket).await;
        Ok(sha)
    }

    /// Put PR `number` in its base branch's merge queue (see `Shared::queue_merge_group`);
    /// waits for the `merge_group` delivery. Returns the merge group's head sha, where
    /// the required statuses must be posted.
    pub async fn queue_merge_group(
        &self,
        repo: &str,
        number: u64,
        user: &str,
    ) -> Result<String, GithubError> {
        let (sha, ticket) = self.shared.queue_merge_group(repo, number, user)?;
        self.shared.wait_delivered(ticket).await;
        Ok(sha)
    }

    pub async fn close_pull_request(
        &self,
        repo: &str,
        number: u64,
        user: &str,
    ) -> Result<(), GithubError> {
        let ticket = self.shared.close_pull(repo, number, user)?;
        self.shared.wait_delivered(ticket).await;
        Ok(())
    }

    /// Reopen a closed PR (`pull_request.reopened`).
    pub async fn reopen_pull_request(
        &self,
        repo: &str,
        number: u64,
        user: &str,
    ) -> Result<(), GithubError> {
        let ticket = self.shared.reopen_pull(repo, number, user)?;
        self.shared.wait_delivered(ticket).await;
        Ok(())
    }

    /// Open a draft PR (`pull_request.opened` with `draft: true`).
    pub async fn open_draft_pull_request(
        &self,
        repo: &str,
        head: &str,
        base: &str,
        title: &str,
        author: &str,
    ) -> Result<PullRequest, GithubError> {
        let (pr, ticket) = self
            .shared
            .create_pull(repo, head, base, title, None, author, true)?;
        self.shared.wait_delivered(ticket).await;
        Ok(pr)
    }

    /// Mark a draft ready for review (`pull_request.ready_for_review`).
    pub async fn mark_ready_for_review(
        &self,
        repo: &str,
        number: u64,
        user: &str,
    ) -> Result<(), GithubError> {
        let ticket = self.shared.mark_ready(repo, number, user)?;
        self.shared.wait_delivered(ticket).await;
        Ok(())
    }

    /// Point a PR at another base branch (`PATCH /pulls/{n}` with `base`;
    /// `pull_request.edited` with `changes.base`).
    pub async fn change_pull_base(
        &self,
        repo: &str,
        number: u64,
        base: &str,
        user: &str,
    ) -> Result<PullRequest, GithubError> {
        let edit = forge::PullEdit {
            base: Some(base.to_string()),
            ..Default::default()
        };
        let (pr, ticket) = self.shared.edit_pull(repo, number, &edit, user)?;
        self.shared.wait_delivered(ticket).await;
        Ok(pr)
    }

    /// Add a label to a PR (`pull_request.labeled`).
    pub async fn label_pull_request(
        &self,
        repo: &str,
        number: u64,
        label: &str,
        user: &str,
    ) -> Result<(), GithubError> {
        let ticket = self.shared.label_pull(repo, number, label, user)?;
        self.shared.wait_delivered(ticket).await;
        Ok(())
    }

    /// Commit `files` on `branch` of `fork_owner`'s fork of `repo` (made from the default
    /// branch when new); a PR from it hears `synchronize`. Returns the new commit's sha.
    pub async fn push_fork_commit(
        &self,
        repo: &str,
        fork_owner: &str,
        branch: &str,
        files: &[(&str, &str)],
        message: &str,
    ) -> Result<String, GithubError> {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(p, c)| (p.to_string(), c.to_string()))
            .collect();
        let (sha, ticket) = self
            .shared
            .push_fork_files(repo, fork_owner, branch, &files, message, fork_owner)?;
        self.shared.wait_delivered(ticket).await;
        Ok(sha)
    }

    /// Open a PR from `branch` of `fork_owner`'s fork (see [`GithubTwin::push_fork_commit`])
    /// into `base`, as `author`; waits for the `opened` webhook.
    #[allow(clippy::too_many_arguments)]
    pub async fn open_fork_pull_request(
        &self,
        repo: &str,
        fork_owner: &str,
        branch: &str,
        base: &str,
        title: &str,
        body: &str,
        author: &str,
    ) -> Result<PullRequest, GithubError> {
        let head = format!("{fork_owner}:{branch}");
        let (pr, ticket) =
            self.shared
                .create_pull(repo, &head, base, title, Some(body), author, false)?;
        self.shared.wait_delivered(ticket).await;
        Ok(pr)
    }

    /// Make `login` a collaborator on `repo` with `role` (`admin`, `maintain`, `write`,
    /// `triage` or `read`).
    pub fn add_collaborator(&self, repo: &str, login: &str, role: &str) -> Result<(), GithubError> {
        let role = Role::parse(role).ok_or_else(|| GithubError::UnknownRole(role.to_string()))?;
        self.shared.add_collaborator(repo, login, role)
    }

    /// The `User-Agent` headers of the last API request.
    pub fn last_user_agent(&self) -> Vec<String> {
        lock(&self.shared.last_user_agent).clone()
    }

    /// How many installation access tokens the twin handed out.
    pub fn installation_token_requests(&self) -> u64 {
        self.shared
            .token_requests
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Comment on a PR as `author` (e.g. `/ichor retry`); waits for the webhook.
    pub async fn comment(
        &self,
        repo: &str,
        number: u64,
        body: &str,
        author: &str,
    ) -> Result<IssueComment, GithubError> {
        let (c, ticket) = self.shared.create_comment(repo, number, body, author)?;
        self.shared.wait_delivered(ticket).await;
        Ok(c)
    }

    // ----- reading state -----

    pub fn pull_request(&self, repo: &str, number: u64) -> Result<PullRequest, GithubError> {
        self.shared.with_repo(repo, |state, _, _| {
            let idx = forge::pull_index(state, repo, number)?;
            Ok(state.pulls[idx].clone())
        })
    }

    pub fn pull_requests(&self, repo: &str) -> Result<Vec<PullRequest>, GithubError> {
        self.shared
            .with_repo(repo, |state, _, _| Ok(state.pulls.clone()))
    }

    /// Every status posted on `sha`, oldest first.
    pub fn statuses(&self, repo: &str, sha: &str) -> Result<Vec<CommitStatus>, GithubError> {
        self.shared
            .with_repo(repo, |state, _, _| Ok(forge::statuses_for(state, sha)))
    }

    /// The repositories each live installation token reaches, oldest first.
    pub fn token_repos(&self) -> Vec<Vec<String>> {
        self.shared.token_repos()
    }

    /// Register a GitHub App (its JWTs, tokens and check runs) while the twin runs.
    pub fn register_app(&self, app: GithubApp) {
        let mut apps = lock(&self.shared.apps);
        apps.retain(|a| a.id != app.id);
        apps.push(app);
    }

    /// Every check run on `sha` (any App), oldest first.
    pub fn check_runs(&self, repo: &str, sha: &str) -> Result<Vec<CheckRun>, GithubError> {
        self.shared.with_repo(repo, |state, _, _| {
            Ok(state
                .check_runs
                .iter()
                .filter(|r| r.head_sha.eq_ignore_ascii_case(sha))
                .cloned()
                .collect())
        })
    }

    /// The combined state and the latest status per context.
    pub fn combined_status(
        &self,
        repo: &str,
        sha: &str,
    ) -> Result<(StatusState, Vec<CommitStatus>), GithubError> {
        self.shared
            .with_repo(repo, |state, _, _| Ok(forge::combined(state, sha)))
    }

    pub fn comments(&self, repo: &str, number: u64) -> Result<Vec<IssueComment>, GithubError> {
        self.shared.with_repo(repo, |state, _, _| {
            Ok(state
                .comments
                .iter()
                .filter(|c| c.issue_number == number)
                .cloned()
                .collect())
        })
    }

    /// The delivery log, oldest first.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.shared.deliveries()
    }

    /// Wait until at least `n` deliveries are logged (webhooks caused by API calls go
    /// out after the response, as on GitHub). Returns the log.
    pub async fn wait_for_deliveries(&self, n: usize) -> Vec<Delivery> {
        let mut rx = self.shared.delivery_count();
        loop {
            if *rx.borrow_and_update() >= n {
                return self.deliveries();
            }
            if rx.changed().await.is_err() {
                return self.deliveries();
            }
        }
    }

    /// Stop serving and wait for the server task to end.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

/// Sets the emulator's dropped-webhooks fault from elsewhere (see
/// [`GithubTwin::webhook_faults`]).
#[derive(Clone)]
pub struct WebhookFaults(Arc<Shared>);

impl WebhookFaults {
    /// The next `n` webhooks are dropped.
    pub fn drop_next(&self, n: u32) {
        lock(&self.0.faults).dropped_webhooks = n;
    }
}

/// A private bare clone of the repository at `source` for the emulator to own, at
/// `<state_dir>/github/<owner>-<name>.git`: every branch, tag and note, and `HEAD` on the
/// same branch. Merges, pushes and `refs/pull/*` then land in the clone only; the user's
/// repository (its refs, `HEAD`, index and work tree) is only read. Made afresh each time.
pub fn private_clone(
    source: &Path,
    state_dir: &Path,
    full_name: &str,
) -> Result<PathBuf, GithubError> {
    let err = |message: String| GithubError::Clone {
        repo: source.to_path_buf(),
        message,
    };
    let src = git2::Repository::open(source).map_err(|e| err(e.message().to_string()))?;
    let dir = state_dir.join("github");
    crate::sim::state::prepare_dir(&dir).map_err(|e| err(e.to_string()))?;
    let file: String = full_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let dest = dir.join(format!("{file}.git"));
    match std::fs::symlink_metadata(&dest) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(err(format!(
                "{} is a symbolic link; refusing to write through it",
                dest.display()
            )))
        }
        // A clone from an earlier run: start over from the repository as it is now.
        Ok(_) => std::fs::remove_dir_all(&dest)
            .map_err(|e| err(format!("removing the old clone {}: {e}", dest.display())))?,
        Err(_) => {}
    }
    let clone = git2::Repository::init_bare(&dest).map_err(|e| err(e.message().to_string()))?;
    let url = src.path().to_string_lossy().into_owned();
    clone
        .remote_anonymous(&url)
        .and_then(|mut remote| {
            remote.fetch(
                &[
                    "+refs/heads/*:refs/heads/*",
                    "+refs/tags/*:refs/tags/*",
                    "+refs/notes/*:refs/notes/*",
                ],
                None,
                None,
            )
        })
        .map_err(|e| err(format!("fetching into {}: {}", dest.display(), e.message())))?;
    if let Some(head) = src
        .find_reference("HEAD")
        .ok()
        .and_then(|h| h.symbolic_target().ok().flatten().map(str::to_string))
    {
        // An unborn or missing branch leaves the clone's default HEAD.
        let _ = clone.set_head(&head);
    }
    Ok(dest)
}

impl Drop for GithubTwin {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}
