//! The forge's behaviour, shared by the HTTP API and the library calls a test or
//! `ichor demo` makes to act as a user or Renovate. Each operation changes state under one
//! lock and queues the webhook events it causes before releasing it, so webhooks go out in
//! the order the changes happened; one delivery task sends them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use git2::{Oid, Repository};
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

use super::app::{GithubApp, IssuedToken};
use super::git::{self, MergeOutcome};
use super::json::{self, PullDetail};
use super::model::{
    self, CommitStatus, IssueComment, PullRequest, PullState, RepoSpec, RepoState, StatusState,
};
use super::webhook::{self, Delivery, DeliveryOutcome, HttpClient, WebhookTarget};
use super::{GithubError, GithubFaults};
use crate::clock::{Clock, Timestamp};

/// An event waiting in the delivery queue.
#[derive(Clone, Debug)]
pub struct Event {
    pub name: &'static str,
    pub action: Option<String>,
    pub repo: String,
    pub repo_id: u64,
    pub payload: Value,
}

/// Whose rate-limit window a request counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RateKey {
    Anonymous,
    User,
    Installation(u64),
    App(u64),
}

/// Who made a request, as the gate authenticated it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The personal access token's user.
    User { login: String },
    /// An installation access token: acts as `<slug>[bot]` on the installation's repos.
    Installation {
        id: u64,
        login: String,
        repos: Vec<String>,
    },
    /// An App's JWT: only the `/app` routes.
    App { id: u64, login: String },
}

impl Caller {
    pub fn login(&self) -> &str {
        match self {
            Caller::User { login }
            | Caller::Installation { login, .. }
            | Caller::App { login, .. } => login,
        }
    }

    pub fn rate_key(&self) -> RateKey {
        match self {
            Caller::User { .. } => RateKey::User,
            Caller::Installation { id, .. } => RateKey::Installation(*id),
            Caller::App { id, .. } => RateKey::App(*id),
        }
    }
}

/// The primary rate-limit window of one caller.
#[derive(Clone, Copy, Debug)]
pub struct RateWindow {
    pub limit: u64,
    pub used: u64,
    pub reset: Timestamp,
}

impl RateWindow {
    fn new(limit: u64, now: Timestamp) -> Self {
        RateWindow {
            limit,
            used: 0,
            reset: now.plus(Duration::from_secs(3600)),
        }
    }

    /// Start a new hour when the old one is over.
    pub fn roll(&mut self, now: Timestamp) {
        if now >= self.reset {
            self.used = 0;
            self.reset = now.plus(Duration::from_secs(3600));
        }
    }

    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    pub fn reset_epoch_secs(&self) -> u64 {
        self.reset.as_millis() / 1000
    }
}

pub struct Forge {
    pub repos: BTreeMap<String, RepoState>,
    ids: Ids,
    /// Lower-cased old full names of renamed or transferred repositories → their id.
    pub renamed: BTreeMap<String, u64>,
}

/// Ids are unique across repositories, as on GitHub.
pub struct Ids {
    next_pull_id: u64,
    next_status_id: u64,
    next_comment_id: u64,
    next_check_run_id: u64,
}

/// How a merge is asked for (the body of `PUT /pulls/{n}/merge`).
#[derive(Clone, Debug, Default)]
pub struct MergeRequest {
    /// The head sha the caller expects; a different head is a 409.
    pub sha: Option<String>,
    /// `merge` (default), `squash` or `rebase` (refused, as on a repo that disallows it).
    pub method: Option<String>,
    pub commit_title: Option<String>,
    pub commit_message: Option<String>,
}

/// GitHub's 422 for a pull request field that is not valid.
fn invalid(field: &'static str, message: String) -> GithubError {
    GithubError::Validation {
        resource: "PullRequest",
        field,
        code: "invalid",
        message,
    }
}

/// What `PATCH /pulls/{n}` changes (the fields ichor cares about; `state` goes through
/// close and reopen).
#[derive(Clone, Debug, Default)]
pub struct PullEdit {
    pub title: Option<String>,
    pub body: Option<String>,
    pub base: Option<String>,
}

pub struct Shared {
    pub clock: Clock,
    pub base: String,
    pub token: String,
    pub login: String,
    pub hook_id: u64,
    forge: Mutex<Forge>,
    pub faults: Mutex<GithubFaults>,
    pub rate: Mutex<RateWindow>,
    pub anonymous_rate: Mutex<RateWindow>,
    /// The windows of installations and Apps, which GitHub counts apart from the user's.
    caller_rates: Mutex<BTreeMap<RateKey, RateWindow>>,
    rate_limit: u64,
    /// Apps registered at start or later ([`super::GithubTwin::register_app`]).
    pub apps: Mutex<Vec<GithubApp>>,
    /// Installation tokens handed out (expired ones are pruned as new ones are made).
    pub app_tokens: Mutex<Vec<IssuedToken>>,
    /// How many installation tokens were asked for and handed out.
    pub token_requests: std::sync::atomic::AtomicU64,
    /// The `User-Agent` values of the last API request (all of them, as sent).
    pub last_user_agent: Mutex<Vec<String>>,
    pub webhook: Mutex<Option<WebhookTarget>>,
    /// How payloads are serialized: GitHub's default for a repository hook is `form`.
    pub content_type: Mutex<webhook::ContentType>,
    /// Deliveries held back by the `held_webhooks` fault: (delivery id, event).
    held: Mutex<Vec<(String, Event)>>,
    deliveries: Mutex<Vec<Delivery>>,
    delivered: watch::Sender<usize>,
    client: HttpClient,
    queue: Mutex<Queue>,
    wake: Notify,
    /// The sequence number of the last event the delivery task finished with.
    done: watch::Sender<u64>,
}

/// Events waiting for delivery, each with its sequence number.
#[derive(Default)]
struct Queue {
    next_seq: u64,
    events: VecDeque<(u64, Event)>,
}

/// Identifies the last event an operation queued; wait on it with
/// [`Shared::wait_delivered`]. Zero when the operation queued nothing.
pub type Ticket = u64;

/// Locks that survive a panic elsewhere: the data under them is always left consistent.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn git_err(what: impl Into<String>) -> impl FnOnce(git2::Error) -> GithubError {
    let what = what.into();
    move |source| GithubError::Git { what, source }
}

fn parse_oid(s: &str) -> Option<Oid> {
    Oid::from_str(s).ok()
}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        clock: Clock,
        base: String,
        token: String,
        login: String,
        repos: Vec<RepoSpec>,
        webhook: Option<WebhookTarget>,
        faults: GithubFaults,
        rate_limit: u64,
        apps: Vec<GithubApp>,
    ) -> Result<Self, GithubError> {
        let mut map = BTreeMap::new();
        for (i, spec) in repos.into_iter().enumerate() {
            if spec.owner().is_empty()
                || spec.name().is_empty()
                || spec.full_name.matches('/').count() != 1
            {
                return Err(GithubError::BadRepoName(spec.full_name));
            }
            git::open(&spec.path).map_err(git_err(format!("open {}", spec.path.display())))?;
            map.insert(
                spec.full_name.to_lowercase(),
                RepoState {
                    id: 700_000_000 + i as u64 + 1,
                    spec,
                    created_at: clock.now(),
                    pulls: Vec::new(),
                    statuses: BTreeMap::new(),
                    comments: Vec::new(),
                    check_runs: Vec::new(),
                    collaborators: BTreeMap::new(),
                },
            );
        }
        let now = clock.now();
        let (delivered, _) = watch::channel(0);
        Ok(Shared {
            base,
            token,
            login,
            hook_id: 400_000_001,
            forge: Mutex::new(Forge {
                renamed: BTreeMap::new(),
                repos: map,
                ids: Ids {
                    next_pull_id: 2_000_000_001,
                    next_status_id: 30_000_000_001,
                    next_comment_id: 1_500_000_001,
                    next_check_run_id: 9_000_000_001,
                },
            }),
            faults: Mutex::new(faults),
            rate: Mutex::new(RateWindow::new(rate_limit, now)),
            anonymous_rate: Mutex::new(RateWindow::new(60, now)),
            caller_rates: Mutex::new(BTreeMap::new()),
            rate_limit,
            apps: Mutex::new(apps),
            app_tokens: Mutex::new(Vec::new()),
            token_requests: std::sync::atomic::AtomicU64::new(0),
            last_user_agent: Mutex::new(Vec::new()),
            webhook: Mutex::new(webhook),
            content_type: Mutex::new(webhook::ContentType::Json),
            held: Mutex::new(Vec::new()),
            deliveries: Mutex::new(Vec::new()),
            delivered,
            client: webhook::client(),
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            done: watch::channel(0).0,
            clock,
        })
    }

    /// Run `f` on the rate-limit window of `key`.
    pub fn with_window<T>(&self, key: RateKey, f: impl FnOnce(&mut RateWindow) -> T) -> T {
        match key {
            RateKey::User => f(&mut lock(&self.rate)),
            RateKey::Anonymous => f(&mut lock(&self.anonymous_rate)),
            other => {
                let now = self.clock.now();
                let mut windows = lock(&self.caller_rates);
                let w = windows
                    .entry(other)
                    .or_insert_with(|| RateWindow::new(self.rate_limit, now));
                f(w)
            }
        }
    }

    /// The Apps known now.
    pub fn apps(&self) -> Vec<GithubApp> {
        lock(&self.apps).clone()
    }

    /// Hand out an installation token for installation `id` of `app`; `None` when the App
    /// has no such installation.
    pub fn issue_token(&self, app: &GithubApp, id: u64) -> Option<IssuedToken> {
        let inst = app.installations.iter().find(|i| i.id == id)?;
        let now = self.clock.now();
        let issued = IssuedToken {
            token: super::app::new_token(),
            installation_id: id,
            login: app.bot_login(),
            repos: inst.repos.iter().map(|r| r.to_lowercase()).collect(),
            expires_at: now.plus(super::app::TOKEN_LIFETIME),
        };
        let mut tokens = lock(&self.app_tokens);
        tokens.retain(|t| t.expires_at > now);
        tokens.push(issued.clone());
        self.token_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(issued)
    }

    /// Keep a token to `repos` only (the request narrowed it).
    pub fn narrow_token(&self, token: &str, repos: Vec<String>) {
        if let Some(t) = lock(&self.app_tokens).iter_mut().find(|t| t.token == token) {
            t.repos = repos;
        }
    }

    /// The repositories each installation token reaches, oldest first.
    pub fn token_repos(&self) -> Vec<Vec<String>> {
        lock(&self.app_tokens)
            .iter()
            .map(|t| t.repos.clone())
            .collect()
    }

    pub fn forge(&self) -> MutexGuard<'_, Forge> {
        lock(&self.forge)
    }

    // ----- webhooks -----

    /// Queue events for delivery (called with the forge lock held, so queue order is the
    /// order of the changes).
    fn enqueue(&self, events: Vec<Event>) -> Ticket {
        if events.is_empty() {
            return 0;
        }
        let mut q = lock(&self.queue);
        for ev in events {
            q.next_seq += 1;
            let seq = q.next_seq;
            q.events.push_back((seq, ev));
        }
        let last = q.next_seq;
        drop(q);
        self.wake.notify_one();
        last
    }

    /// The delivery task: sends queued events one at a time until `stop` changes.
    pub async fn run_deliveries(self: std::sync::Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            let next = lock(&self.queue).events.pop_front();
            match next {
                Some((seq, ev)) => {
                    self.deliver_one(ev).await;
                    self.done.send_replace(seq);
                }
                None => {
                    tokio::select! {
                        _ = self.wake.notified() => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }

    /// Wait until the delivery task is done with the event `ticket` names.
    pub async fn wait_delivered(&self, ticket: Ticket) {
        let mut rx = self.done.subscribe();
        loop {
            if *rx.borrow_and_update() >= ticket {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Like [`Shared::with_repo`] for operations that cause webhooks: `f` returns its
    /// result and its events, which are queued before the lock is released.
    fn with_repo_events<T>(
        &self,
        full_name: &str,
        f: impl FnOnce(&mut RepoState, &Repository, &mut Ids) -> Result<(T, Vec<Event>), GithubError>,
    ) -> Result<(T, Ticket), GithubError> {
        self.with_repo(full_name, |state, repo, ids| {
            let (value, events) = f(state, repo, ids)?;
            Ok((value, self.enqueue(events)))
        })
    }

    async fn deliver_one(&self, ev: Event) -> Delivery {
        // A delivery in flight holds a simulation driver's time still until answered.
        let _busy = self.clock.busy();
        let id = webhook::new_guid();
        let target = lock(&self.webhook).clone();
        let (dropped, held) = {
            let mut f = lock(&self.faults);
            if target.is_some() && f.dropped_webhooks > 0 {
                f.dropped_webhooks -= 1;
                (true, false)
            } else if target.is_some() && f.held_webhooks > 0 {
                f.held_webhooks -= 1;
                (false, true)
            } else {
                (false, false)
            }
        };
        let content_type = *lock(&self.content_type);
        let body = content_type.encode(&ev.payload.to_string());
        if held {
            let d = self.log(Delivery {
                id: id.clone(),
                event: ev.name.to_string(),
                action: ev.action.clone(),
                repo: ev.repo.clone(),
                repo_id: ev.repo_id,
                content_type,
                redelivery: false,
                outcome: DeliveryOutcome::Held,
                at: self.clock.now(),
                body,
            });
            lock(&self.held).push((id, ev));
            return d;
        }
        let outcome = match (&target, dropped) {
            (None, _) => DeliveryOutcome::NoTarget,
            (Some(_), true) => DeliveryOutcome::Dropped,
            (Some(t), false) => {
                webhook::send(
                    &self.client,
                    webhook::Outgoing {
                        target: t,
                        delivery_id: &id,
                        event: ev.name,
                        hook_id: self.hook_id,
                        repo_id: ev.repo_id,
                        content_type,
                        body: &body,
                    },
                )
                .await
            }
        };
        self.log(Delivery {
            id,
            event: ev.name.to_string(),
            action: ev.action,
            repo: ev.repo,
            repo_id: ev.repo_id,
            content_type,
            redelivery: false,
            outcome,
            at: self.clock.now(),
            body,
        })
    }

    fn log(&self, delivery: Delivery) -> Delivery {
        tracing::debug!(id = %delivery.id, event = %delivery.event, outcome = ?delivery.outcome, "webhook");
        let n = {
            let mut log = lock(&self.deliveries);
            log.push(delivery.clone());
            log.len()
        };
        self.delivered.send_replace(n);
        delivery
    }

    /// Send a logged delivery again: same id, same bytes, signed with the current secret.
    async fn resend(&self, mut d: Delivery, redelivery: bool) -> Delivery {
        let target = lock(&self.webhook).clone();
        d.outcome = match &target {
            None => DeliveryOutcome::NoTarget,
            Some(t) => {
                webhook::send(
                    &self.client,
                    webhook::Outgoing {
                        target: t,
                        delivery_id: &d.id,
                        event: &d.event,
                        hook_id: self.hook_id,
                        repo_id: d.repo_id,
                        content_type: d.content_type,
                        body: &d.body,
                    },
                )
                .await
            }
        };
        d.redelivery = redelivery;
        d.at = self.clock.now();
        self.log(d)
    }

    pub async fn redeliver(&self, id: &str) -> Result<Delivery, GithubError> {
        let original = lock(&self.deliveries)
            .iter()
            .find(|d| d.id == id && !d.redelivery)
            .cloned()
            .ok_or_else(|| GithubError::UnknownDelivery(id.to_string()))?;
        Ok(self.resend(original, true).await)
    }

    /// The held deliveries, sent now in the order they were held.
    pub async fn release_held(&self) -> Vec<Delivery> {
        let held: Vec<(String, Event)> = std::mem::take(&mut *lock(&self.held));
        let mut out = Vec::new();
        for (id, _) in held {
            let logged = lock(&self.deliveries)
                .iter()
                .find(|d| d.id == id && d.outcome == DeliveryOutcome::Held)
                .cloned();
            if let Some(d) = logged {
                out.push(self.resend(d, false).await);
            }
        }
        out
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        lock(&self.deliveries).clone()
    }

    pub fn delivery_count(&self) -> watch::Receiver<usize> {
        self.delivered.subscribe()
    }

    /// Rename (or transfer) a repository, as GitHub does: the old name then answers with a
    /// redirect to `/repositories/{id}`, and everything else uses the new name.
    pub fn rename_repo(&self, old: &str, new: &str) -> Result<(), GithubError> {
        let mut forge = self.forge();
        let mut state = forge
            .repos
            .remove(&old.to_lowercase())
            .ok_or_else(|| GithubError::UnknownRepo(old.to_string()))?;
        state.spec.full_name = new.to_string();
        forge.renamed.insert(old.to_lowercase(), state.id);
        forge.repos.insert(new.to_lowercase(), state);
        Ok(())
    }

    /// Where a request for `owner/name` goes: `Moved(id)` when that name was renamed away,
    /// `Name(full name)` for `/repositories/{id}`.
    pub fn moved_repo(&self, full_name: &str) -> Option<u64> {
        let forge = self.forge();
        if forge.repos.contains_key(&full_name.to_lowercase()) {
            return None;
        }
        forge.renamed.get(&full_name.to_lowercase()).copied()
    }

    /// The current full name of the repository with this id.
    pub fn repo_by_id(&self, id: u64) -> Option<String> {
        self.forge()
            .repos
            .values()
            .find(|r| r.id == id)
            .map(|r| r.spec.full_name.clone())
    }

    // ----- reads -----

    /// Run `f` on a repository's state and its git repository, after refreshing the live
    /// head/base shas of its open PRs.
    pub fn with_repo<T>(
        &self,
        full_name: &str,
        f: impl FnOnce(&mut RepoState, &Repository, &mut Ids) -> Result<T, GithubError>,
    ) -> Result<T, GithubError> {
        let mut forge = self.forge();
        let Forge { repos, ids, .. } = &mut *forge;
        let state = repos
            .get_mut(&full_name.to_lowercase())
            .ok_or_else(|| GithubError::UnknownRepo(full_name.to_string()))?;
        let repo = git::open(&state.spec.path)
            .map_err(git_err(format!("open {}", state.spec.path.display())))?;
        refresh_open_pulls(state, &repo)?;
        f(state, &repo, ids)
    }

    pub fn pull_detail(state: &RepoState, repo: &Repository, pr: &PullRequest) -> PullDetail {
        let mergeable = match (pr.state, parse_oid(&pr.head_sha)) {
            (PullState::Open, Some(head)) => git::mergeable(repo, &pr.base_ref, head).ok(),
            _ => None,
        };
        let commits = match (parse_oid(&pr.head_sha), parse_oid(&pr.base_sha)) {
            (Some(h), Some(b)) => git::pushed_commits(repo, Some(b), h)
                .map(|c| c.len() as u64)
                .unwrap_or(0),
            _ => 0,
        };
        let comments = state
            .comments
            .iter()
            .filter(|c| c.issue_number == pr.number)
            .count() as u64;
        PullDetail {
            mergeable,
            commits,
            comments,
        }
    }

    fn pull_event(
        &self,
        state: &RepoState,
        repo: &Repository,
        pr: &PullRequest,
        action: &str,
        sender: &str,
        extra: Value,
    ) -> Event {
        let detail = Self::pull_detail(state, repo, pr);
        let mut payload = json!({
            "action": action,
            "number": pr.number,
            "pull_request": json::pull_request(&self.base, state, pr, Some(&detail)),
        });
        if let (Some(obj), Value::Object(extra)) = (payload.as_object_mut(), extra) {
            obj.extend(extra);
        }
        Event {
            name: "pull_request",
            action: Some(action.to_string()),
            repo: state.spec.full_name.clone(),
            repo_id: state.id,
            payload: json::with_envelope(payload, &self.base, state, sender),
        }
    }

    // ----- writes -----

    #[allow(clippy::too_many_arguments)]
    pub fn create_pull(
        &self,
        full_name: &str,
        head: &str,
        base: &str,
        title: &str,
        body: Option<&str>,
        user: &str,
        draft: bool,
    ) -> Result<(PullRequest, Ticket), GithubError> {
        let now = self.clock.now();
        // `owner:branch` names a branch of the repository or of a fork; the twin has no
        // forks, so the owner must be the repository's.
        let (owner, head) = match head.split_once(':') {
            Some((o, b)) => (Some(o), b.to_string()),
            None => (None, head.to_string()),
        };
        // Checked before git sees them: a name like `../../etc` is a 422, as on GitHub.
        for (field, name) in [("head", head.as_str()), ("base", base)] {
            if !git::is_valid_branch(name) {
                return Err(invalid(
                    field,
                    format!("{field} {name:?} is not a valid branch name"),
                ));
            }
        }
        if let Some(o) = owner.filter(|o| !is_valid_login(o)) {
            return Err(invalid("head", format!("{o:?} is not a valid owner")));
        }
        self.with_repo_events(full_name, |state, repo, ids| {
            // `owner:branch` with another owner names a branch of that owner's fork.
            let fork = owner
                .filter(|o| !o.eq_ignore_ascii_case(state.spec.owner()))
                .map(str::to_string);
            let head_refname = match &fork {
                Some(o) => git::fork_ref(o, &head),
                None => format!("refs/heads/{head}"),
            };
            if title.trim().is_empty() {
                return Err(GithubError::Validation {
                    resource: "PullRequest",
                    field: "title",
                    code: "missing_field",
                    message: "title is missing".into(),
                });
            }
            let head_tip = git::ref_tip(repo, &head_refname)
                .map_err(git_err("read head branch"))?
                .ok_or_else(|| invalid("head", format!("head branch {head} does not exist")))?;
            let base_tip = git::branch_tip(repo, base)
                .map_err(git_err("read base branch"))?
                .ok_or_else(|| invalid("base", format!("base branch {base} does not exist")))?;
            if git::is_ancestor(repo, head_tip, base_tip) {
                return Err(GithubError::Validation {
                    resource: "PullRequest",
                    field: "head",
                    code: "custom",
                    message: format!("No commits between {base} and {head}"),
                });
            }
            if state.pulls.iter().any(|p| {
                p.state == PullState::Open
                    && p.head_ref == head
                    && p.base_ref == base
                    && p.head_owner.as_deref().map(str::to_lowercase)
                        == fork.as_deref().map(str::to_lowercase)
            }) {
                return Err(GithubError::Validation {
                    resource: "PullRequest",
                    field: "head",
                    code: "custom",
                    message: format!(
                        "A pull request already exists for {}:{head}.",
                        fork.as_deref().unwrap_or(state.spec.owner())
                    ),
                });
            }
            let number = state.pulls.len() as u64 + 1;
            let pr = PullRequest {
                id: ids.next_pull_id,
                number,
                title: title.to_string(),
                body: body.map(str::to_string),
                head_ref: head.clone(),
                head_sha: head_tip.to_string(),
                base_ref: base.to_string(),
                base_sha: base_tip.to_string(),
                state: PullState::Open,
                merged: false,
                merged_at: None,
                merged_by: None,
                merge_commit_sha: None,
                closed_at: None,
                user: user.to_string(),
                created_at: now,
                updated_at: now,
                draft,
                head_owner: fork,
            };
            ids.next_pull_id += 1;
            git::set_ref(
                repo,
                &format!("refs/pull/{number}/head"),
                head_tip,
                "pull request opened",
            )
            .map_err(git_err("write refs/pull/N/head"))?;
            state.pulls.push(pr.clone());
            let ev = self.pull_event(state, repo, &pr, "opened", user, json!({}));
            Ok((pr, vec![ev]))
        })
    }

    /// Events for a branch that moved from `before` to `after`: `push`, then
    /// `pull_request synchronize` for every open PR whose head it is.
    fn branch_moved(
        &self,
        state: &mut RepoState,
        repo: &Repository,
        branch: &str,
        before: Option<Oid>,
        after: Oid,
        pusher: &str,
    ) -> Result<Vec<Event>, GithubError> {
        let now = self.clock.now();
        let forced = before.is_some_and(|b| !git::is_ancestor(repo, b, after));
        let commits = if forced {
            // After a force push GitHub lists what is new relative to the merge base.
            Vec::new()
        } else {
            git::pushed_commits(repo, before, after).map_err(git_err("walk pushed commits"))?
        };
        let zero = "0".repeat(40);
        let before_s = before.map(|b| b.to_string()).unwrap_or(zero);
        let push = json::push_event(
            &self.base,
            state,
            branch,
            &before_s,
            &after.to_string(),
            forced,
            &commits,
            pusher,
        );
        let mut events = vec![Event {
            name: "push",
            action: None,
            repo: state.spec.full_name.clone(),
            repo_id: state.id,
            payload: json::with_push_envelope(push, &self.base, state, pusher),
        }];
        let after_s = after.to_string();
        for i in 0..state.pulls.len() {
            let pr = &mut state.pulls[i];
            if pr.state != PullState::Open {
                continue;
            }
            if pr.base_ref == branch {
                pr.base_sha = after_s.clone();
            }
            if pr.head_owner.is_none() && pr.head_ref == branch {
                pr.head_sha = after_s.clone();
                pr.updated_at = now;
                git::set_ref(
                    repo,
                    &format!("refs/pull/{}/head", pr.number),
                    after,
                    "synchronize",
                )
                .map_err(git_err("write refs/pull/N/head"))?;
                let pr = pr.clone();
                events.push(self.pull_event(
                    state,
                    repo,
                    &pr,
                    "synchronize",
                    pusher,
                    json!({ "before": before_s, "after": after_s }),
                ));
            }
        }
        Ok(events)
    }

    /// Commit `files` on `branch` (created from the default branch when missing).
    pub fn push_files(
        &self,
        full_name: &str,
        branch: &str,
        files: &[(String, String)],
        message: &str,
        pusher: &str,
    ) -> Result<(String, Ticket), GithubError> {
        let now = self.clock.now();
        check_branch(branch)?;
        self.with_repo_events(full_name, |state, repo, _| {
            let start = git::branch_tip(repo, &state.spec.default_branch)
                .map_err(git_err("read default branch"))?;
            let sig = git::signature(pusher, &format!("{pusher}@users.noreply.twin"), now)
                .map_err(git_err("make signature"))?;
            let (before, after) = git::commit_files(repo, branch, start, files, message, &sig)
                .map_err(git_err(format!("commit on {branch}")))?;
            let events = self.branch_moved(state, repo, branch, before, after, pusher)?;
            Ok((after.to_string(), events))
        })
    }

    /// Commit `files` on the branch `branch` of `fork_owner`'s fork (created from the
    /// default branch when missing). GitHub sends the `push` to the fork's own hooks, so
    /// the served repository hears only `pull_request synchronize` for PRs from it.
    pub fn push_fork_files(
        &self,
        full_name: &str,
        fork_owner: &str,
        branch: &str,
        files: &[(String, String)],
        message: &str,
        pusher: &str,
    ) -> Result<(String, Ticket), GithubError> {
        let now = self.clock.now();
        check_branch(branch)?;
        if !is_valid_login(fork_owner) {
            return Err(GithubError::Validation {
                resource: "Repository",
                field: "owner",
                code: "invalid",
                message: format!("{fork_owner:?} is not a valid owner"),
            });
        }
        self.with_repo_events(full_name, |state, repo, _| {
            let start = git::branch_tip(repo, &state.spec.default_branch)
                .map_err(git_err("read default branch"))?;
            let sig = git::signature(pusher, &format!("{pusher}@users.noreply.twin"), now)
                .map_err(git_err("make signature"))?;
            let refname = git::fork_ref(fork_owner, branch);
            let (before, after) =
                git::commit_files_on_ref(repo, &refname, start, files, message, &sig)
                    .map_err(git_err(format!("commit on {fork_owner}:{branch}")))?;
            let before_s = before.map(|b| b.to_string()).unwrap_or("0".repeat(40));
            let after_s = after.to_string();
            let mut events = Vec::new();
            for i in 0..state.pulls.len() {
                let pr = &mut state.pulls[i];
                let ours = pr
                    .head_owner
                    .as_deref()
                    .is_some_and(|o| o.eq_ignore_ascii_case(fork_owner));
                if pr.state != PullState::Open || !ours || pr.head_ref != branch {
                    continue;
                }
                pr.head_sha = after_s.clone();
                pr.updated_at = now;
                git::set_ref(
                    repo,
                    &format!("refs/pull/{}/head", pr.number),
                    after,
                    "synchronize",
                )
                .map_err(git_err("write refs/pull/N/head"))?;
                let pr = pr.clone();
                events.push(self.pull_event(
                    state,
                    repo,
                    &pr,
                    "synchronize",
                    pusher,
                    json!({ "before": before_s, "after": after_s }),
                ));
            }
            Ok((after_s, events))
        })
    }

    /// Give `login` a role on a repository (replacing any earlier one).
    pub fn add_collaborator(
        &self,
        full_name: &str,
        login: &str,
        role: model::Role,
    ) -> Result<(), GithubError> {
        if !is_valid_login(login) {
            return Err(GithubError::Validation {
                resource: "Collaborator",
                field: "login",
                code: "invalid",
                message: format!("{login:?} is not a valid login"),
            });
        }
        self.with_repo(full_name, |state, _, _| {
            state
                .collaborators
                .insert(login.to_lowercase(), (login.to_string(), role));
            Ok(())
        })
    }

    /// The role `login` has on a repository: the token's own user and the repository's
    /// owner are admins; anyone else only what [`Shared::add_collaborator`] gave them.
    pub fn role_of(&self, state: &RepoState, login: &str) -> Option<model::Role> {
        if login.eq_ignore_ascii_case(&self.login) || login.eq_ignore_ascii_case(state.spec.owner())
        {
            return Some(model::Role::Admin);
        }
        state
            .collaborators
            .get(&login.to_lowercase())
            .map(|(_, role)| *role)
    }

    /// Point `branch` at `sha`, as a (force) push does.
    pub fn set_branch(
        &self,
        full_name: &str,
        branch: &str,
        sha: &str,
        pusher: &str,
    ) -> Result<Ticket, GithubError> {
        check_branch(branch)?;
        let ((), ticket) = self.with_repo_events(full_name, |state, repo, _| {
            let after = git::resolve_commit(repo, sha).ok_or_else(|| GithubError::UnknownRef {
                repo: full_name.to_string(),
                reference: sha.to_string(),
            })?;
            let before = git::branch_tip(repo, branch).map_err(git_err("read branch"))?;
            git::set_ref(repo, &format!("refs/heads/{branch}"), after, "push")
                .map_err(git_err(format!("move {branch}")))?;
            Ok((
                (),
                self.branch_moved(state, repo, branch, before, after, pusher)?,
            ))
        })?;
        Ok(ticket)
    }

    pub fn merge_pull(
        &self,
        full_name: &str,
        number: u64,
        req: &MergeRequest,
        merger: &str,
    ) -> Result<(String, Ticket), GithubError> {
        let now = self.clock.now();
        self.with_repo_events(full_name, |state, repo, _| {
            let idx = pull_index(state, full_name, number)?;
            let pr = state.pulls[idx].clone();
            if pr.state != PullState::Open {
                return Err(GithubError::NotMergeable { number });
            }
            if let Some(expected) = &req.sha {
                if !expected.eq_ignore_ascii_case(&pr.head_sha) {
                    return Err(GithubError::HeadModified { number });
                }
            }
            let squash = match req.method.as_deref().unwrap_or("merge") {
                "merge" => false,
                "squash" => true,
                other => return Err(GithubError::MergeMethodNotAllowed(other.to_string())),
            };
            let head = parse_oid(&pr.head_sha).ok_or(GithubError::NotMergeable { number })?;
            let title = req.commit_title.clone().unwrap_or_else(|| {
                if squash {
                    format!("{} (#{number})", pr.title)
                } else {
                    format!(
                        "Merge pull request #{number} from {}/{}",
                        pr.head_owner.as_deref().unwrap_or(state.spec.owner()),
                        pr.head_ref
                    )
                }
            });
            let message_body = req.commit_message.clone().unwrap_or_else(|| {
                if squash {
                    String::new()
                } else {
                    pr.title.clone()
                }
            });
            let message = if message_body.is_empty() {
                format!("{title}\n")
            } else {
                format!("{title}\n\n{message_body}\n")
            };
            let sig = git::signature(merger, &format!("{merger}@users.noreply.twin"), now)
                .map_err(git_err("make signature"))?;
            let before = git::branch_tip(repo, &pr.base_ref).map_err(git_err("read base"))?;
            let merged = git::merge_into(repo, &pr.base_ref, head, &message, &sig, squash)
                .map_err(git_err(format!("merge #{number}")))?;
            let MergeOutcome::Merged(oid) = merged else {
                return Err(GithubError::NotMergeable { number });
            };
            {
                let pr = &mut state.pulls[idx];
                pr.state = PullState::Closed;
                pr.merged = true;
                pr.merged_at = Some(now);
                pr.closed_at = Some(now);
                pr.merged_by = Some(merger.to_string());
                pr.merge_commit_sha = Some(oid.to_string());
                pr.updated_at = now;
            }
            // The push to the base comes first on GitHub too; it also moves other open
            // PRs' base sha.
            let mut events = self.branch_moved(state, repo, &pr.base_ref, before, oid, merger)?;
            let pr = state.pulls[idx].clone();
            events.push(self.pull_event(state, repo, &pr, "closed", merger, json!({})));
            Ok((oid.to_string(), events))
        })
    }

    /// Close without merging.
    /// Add an open PR to the base branch's merge queue as GitHub does: a merge commit of
    /// the head onto the base tip on `refs/heads/gh-readonly-queue/<base>/pr-<n>-<base sha>`
    /// (the base does not move), and a `merge_group` `checks_requested` delivery with the
    /// fields of octokit/webhooks payload-schemas/api.github.com/merge_group/
    /// checks_requested.schema.json. Returns the merge group's head sha.
    pub fn queue_merge_group(
        &self,
        full_name: &str,
        number: u64,
        user: &str,
    ) -> Result<(String, Ticket), GithubError> {
        let now = self.clock.now();
        self.with_repo_events(full_name, |state, repo, _| {
            let idx = pull_index(state, full_name, number)?;
            let pr = state.pulls[idx].clone();
            if pr.state != PullState::Open {
                return Err(GithubError::NotMergeable { number });
            }
            let head = parse_oid(&pr.head_sha).ok_or(GithubError::NotMergeable { number })?;
            let base_tip = git::branch_tip(repo, &pr.base_ref)
                .map_err(git_err("read base"))?
                .ok_or(GithubError::NotMergeable { number })?;
            let (base_c, head_c) = (
                repo.find_commit(base_tip).map_err(git_err("read base"))?,
                repo.find_commit(head).map_err(git_err("read head"))?,
            );
            let mut index = repo
                .merge_commits(&base_c, &head_c, None)
                .map_err(git_err("merge group"))?;
            if index.has_conflicts() {
                return Err(GithubError::NotMergeable { number });
            }
            let tree = index.write_tree_to(repo).map_err(git_err("merge group"))?;
            let tree = repo.find_tree(tree).map_err(git_err("merge group"))?;
            let message = format!(
                "Merge pull request #{number} from {}/{}\n\n{}\n",
                pr.head_owner.as_deref().unwrap_or(state.spec.owner()),
                pr.head_ref,
                pr.title
            );
            let sig = git::signature("GitHub", "noreply@github.com", now)
                .map_err(git_err("make signature"))?;
            let oid = repo
                .commit(None, &sig, &sig, &message, &tree, &[&base_c, &head_c])
                .map_err(git_err("merge group"))?;
            let head_ref = format!(
                "refs/heads/gh-readonly-queue/{}/pr-{number}-{base_tip}",
                pr.base_ref
            );
            git::set_ref(repo, &head_ref, oid, "merge queue").map_err(git_err("merge group"))?;
            let person = json!({"name": "GitHub", "email": "noreply@github.com"});
            let payload = json!({
                "action": "checks_requested",
                "merge_group": {
                    "head_sha": oid.to_string(),
                    "head_ref": head_ref,
                    "base_sha": base_tip.to_string(),
                    "base_ref": format!("refs/heads/{}", pr.base_ref),
                    "head_commit": {
                        "id": oid.to_string(),
                        "tree_id": tree.id().to_string(),
                        "message": message,
                        "timestamp": now.rfc3339(),
                        "author": person,
                        "committer": person,
                    },
                },
            });
            let event = Event {
                name: "merge_group",
                action: Some("checks_requested".into()),
                repo: state.spec.full_name.clone(),
                repo_id: state.id,
                payload: json::with_envelope(payload, &self.base, state, user),
            };
            Ok((oid.to_string(), vec![event]))
        })
    }

    pub fn close_pull(
        &self,
        full_name: &str,
        number: u64,
        user: &str,
    ) -> Result<Ticket, GithubError> {
        self.set_pull_state(full_name, number, user, PullState::Closed)
    }

    /// Reopen a closed (not merged) PR: `pull_request.reopened`. A merged PR cannot be
    /// reopened: GitHub answers 422 with `state` "cannot be changed" (the rest of this
    /// message is the emulator's wording).
    pub fn reopen_pull(
        &self,
        full_name: &str,
        number: u64,
        user: &str,
    ) -> Result<Ticket, GithubError> {
        self.set_pull_state(full_name, number, user, PullState::Open)
    }

    /// Close or reopen a PR, with its `closed` / `reopened` delivery; nothing when it is
    /// in that state already.
    fn set_pull_state(
        &self,
        full_name: &str,
        number: u64,
        user: &str,
        to: PullState,
    ) -> Result<Ticket, GithubError> {
        let now = self.clock.now();
        let ((), ticket) = self.with_repo_events(full_name, |state, repo, _| {
            let idx = pull_index(state, full_name, number)?;
            let pr = &mut state.pulls[idx];
            if pr.state == to {
                return Ok(((), Vec::new()));
            }
            let action = if to == PullState::Open {
                if pr.merged_at.is_some() {
                    return Err(GithubError::Validation {
                        resource: "PullRequest",
                        field: "state",
                        code: "invalid",
                        message: "state cannot be changed. The pull request cannot be reopened because it has been merged.".into(),
                    });
                }
                pr.closed_at = None;
                "reopened"
            } else {
                pr.closed_at = Some(now);
                "closed"
            };
            pr.state = to;
            pr.updated_at = now;
            let pr = pr.clone();
            let event = self.pull_event(state, repo, &pr, action, user, json!({}));
            Ok(((), vec![event]))
        })?;
        Ok(ticket)
    }

    /// `PATCH /repos/{owner}/{repo}/pulls/{number}` (operation `pulls/update` in
    /// github/rest-api-description): a new title, body or base branch. One
    /// `pull_request.edited` delivery carries `changes` with what each field was
    /// (`changes.title.from`, `changes.body.from`, `changes.base.ref.from` and
    /// `changes.base.sha.from`, octokit/webhooks `webhook-pull-request-edited`); nothing
    /// changed, nothing delivered. A base that does not exist is GitHub's 422 `invalid` on
    /// `base`, "Proposed base branch '…' is invalid" (as GitHub answered in
    /// spacedentist/spr#175); a base the head is already in, or a closed PR's base, is a 422
    /// too, in the emulator's own words.
    pub fn edit_pull(
        &self,
        full_name: &str,
        number: u64,
        edit: &PullEdit,
        user: &str,
    ) -> Result<(PullRequest, Ticket), GithubError> {
        let now = self.clock.now();
        if let Some(base) = edit.base.as_deref().filter(|b| !git::is_valid_branch(b)) {
            return Err(invalid(
                "base",
                format!("base {base:?} is not a valid branch name"),
            ));
        }
        self.with_repo_events(full_name, |state, repo, _| {
            let idx = pull_index(state, full_name, number)?;
            let mut pr = state.pulls[idx].clone();
            let mut changes = serde_json::Map::new();
            if let Some(title) = edit.title.as_deref().filter(|t| *t != pr.title) {
                if title.trim().is_empty() {
                    return Err(GithubError::Validation {
                        resource: "PullRequest",
                        field: "title",
                        code: "missing_field",
                        message: "title is missing".into(),
                    });
                }
                changes.insert("title".into(), json!({"from": pr.title}));
                pr.title = title.to_string();
            }
            if let Some(body) = edit.body.as_deref().filter(|b| Some(*b) != pr.body.as_deref()) {
                changes.insert("body".into(), json!({"from": pr.body.clone().unwrap_or_default()}));
                pr.body = Some(body.to_string());
            }
            if let Some(base) = edit.base.as_deref().filter(|b| *b != pr.base_ref) {
                if pr.state != PullState::Open {
                    return Err(invalid("base", "Cannot change the base branch of a closed pull request.".into()));
                }
                let base_tip = git::branch_tip(repo, base)
                    .map_err(git_err("read base branch"))?
                    .ok_or_else(|| invalid("base", format!("Proposed base branch '{base}' is invalid")))?;
                let head_tip = git::ref_tip(repo, &pr.head_refname())
                    .map_err(git_err("read head branch"))?
                    .ok_or_else(|| invalid("head", "the head branch is gone".into()))?;
                if git::is_ancestor(repo, head_tip, base_tip) {
                    return Err(GithubError::Validation {
                        resource: "PullRequest",
                        field: "base",
                        code: "custom",
                        message: format!("There are no new commits between base branch '{base}' and head branch '{}'.", pr.head_ref),
                    });
                }
                changes.insert(
                    "base".into(),
                    json!({"ref": {"from": pr.base_ref}, "sha": {"from": pr.base_sha}}),
                );
                pr.base_ref = base.to_string();
                pr.base_sha = base_tip.to_string();
            }
            if changes.is_empty() {
                return Ok((pr, Vec::new()));
            }
            pr.updated_at = now;
            state.pulls[idx] = pr.clone();
            let event = self.pull_event(state, repo, &pr, "edited", user, json!({"changes": changes}));
            Ok((pr, vec![event]))
        })
    }

    /// A draft PR marked ready for review: `pull_request.ready_for_review` (GitHub does
    /// this through GraphQL's `markPullRequestReadyForReview`; the REST API cannot).
    pub fn mark_ready(
        &self,
        full_name: &str,
        number: u64,
        user: &str,
    ) -> Result<Ticket, GithubError> {
        let now = self.clock.now();
        let ((), ticket) = self.with_repo_events(full_name, |state, repo, _| {
            let idx = pull_index(state, full_name, number)?;
            if !state.pulls[idx].draft {
                return Ok(((), Vec::new()));
            }
            state.pulls[idx].draft = false;
            state.pulls[idx].updated_at = now;
            let pr = state.pulls[idx].clone();
            let event = self.pull_event(state, repo, &pr, "ready_for_review", user, json!({}));
            Ok(((), vec![event]))
        })?;
        Ok(ticket)
    }

    /// A label added to a PR: `pull_request.labeled`, with the `label` object beside the PR
    /// (webhook payload schema `webhook-pull-request-labeled`).
    pub fn label_pull(
        &self,
        full_name: &str,
        number: u64,
        label: &str,
        user: &str,
    ) -> Result<Ticket, GithubError> {
        let ((), ticket) = self.with_repo_events(full_name, |state, repo, _| {
            let idx = pull_index(state, full_name, number)?;
            let pr = state.pulls[idx].clone();
            let extra = json!({"label": {
                "id": 208_045_946u64, "node_id": "MDU6TGFiZWwyMDgwNDU5NDY=",
                "url": format!("{}/repos/{full_name}/labels/{label}", self.base),
                "name": label, "description": null, "color": "ededed", "default": false,
            }});
            let event = self.pull_event(state, repo, &pr, "labeled", user, extra);
            Ok(((), vec![event]))
        })?;
        Ok(ticket)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn create_status(
        &self,
        full_name: &str,
        sha: &str,
        state_s: &str,
        context: Option<&str>,
        description: Option<&str>,
        target_url: Option<&str>,
        creator: &str,
    ) -> Result<CommitStatus, GithubError> {
        let now = self.clock.now();
        self.with_repo(full_name, |state, repo, ids| {
            let oid = git::resolve_commit(repo, sha)
                .filter(|o| o.to_string().eq_ignore_ascii_case(sha))
                .ok_or_else(|| GithubError::UnknownRef {
                    repo: full_name.to_string(),
                    reference: sha.to_string(),
                })?;
            let sha = oid.to_string();
            let context = context.filter(|c| !c.is_empty()).unwrap_or("default");
            let existing = state
                .statuses
                .get(&sha)
                .map(|v| {
                    v.iter()
                        .filter(|s| s.context.eq_ignore_ascii_case(context))
                        .count()
                })
                .unwrap_or(0);
            let st =
                model::validate_status(state_s, context, description, existing).map_err(|inv| {
                    GithubError::Validation {
                        resource: "Status",
                        field: inv.field,
                        code: inv.code,
                        message: inv.message,
                    }
                })?;
            let status = CommitStatus {
                id: ids.next_status_id,
                sha: sha.clone(),
                state: st,
                context: context.to_string(),
                description: description.map(str::to_string),
                target_url: target_url.map(str::to_string),
                creator: creator.to_string(),
                created_at: now,
            };
            ids.next_status_id += 1;
            state.statuses.entry(sha).or_default().push(status.clone());
            Ok(status)
        })
    }

    /// `POST /repos/{o}/{r}/check-runs` by the App `app` (id, slug).
    pub fn create_check_run(
        &self,
        full_name: &str,
        app: (u64, &str),
        req: &super::checks::CheckRunRequest,
    ) -> Result<super::checks::CheckRun, GithubError> {
        let now = self.clock.now();
        let check = |inv: super::checks::Invalid| GithubError::Validation {
            resource: "CheckRun",
            field: inv.field,
            code: inv.code,
            message: inv.message,
        };
        self.with_repo(full_name, |state, repo, ids| {
            let missing = |field: &'static str| GithubError::Validation {
                resource: "CheckRun",
                field,
                code: "missing_field",
                message: format!("{field} is missing"),
            };
            let name = req
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| missing("name"))?;
            let sha = req.head_sha.clone().ok_or_else(|| missing("head_sha"))?;
            let oid = git::resolve_commit(repo, &sha)
                .filter(|o| o.to_string().eq_ignore_ascii_case(&sha))
                .ok_or_else(|| GithubError::UnknownRef {
                    repo: full_name.to_string(),
                    reference: sha.clone(),
                })?;
            let mut run = super::checks::CheckRun {
                id: ids.next_check_run_id,
                app_id: app.0,
                app_slug: app.1.to_string(),
                head_sha: oid.to_string(),
                name,
                status: "queued".into(),
                conclusion: None,
                title: None,
                summary: None,
                text: None,
                annotations: Vec::new(),
                details_url: None,
                external_id: None,
                started_at: now,
                completed_at: None,
            };
            super::checks::apply(&mut run, req, now).map_err(check)?;
            ids.next_check_run_id += 1;
            state.check_runs.push(run.clone());
            super::checks::prune(&mut state.check_runs, app.0, &run.head_sha, &run.name);
            Ok(run)
        })
    }

    /// `PATCH /repos/{o}/{r}/check-runs/{id}`: only the App that created the run.
    pub fn update_check_run(
        &self,
        full_name: &str,
        app_id: u64,
        id: u64,
        req: &super::checks::CheckRunRequest,
    ) -> Result<super::checks::CheckRun, GithubError> {
        let now = self.clock.now();
        self.with_repo(full_name, |state, _, _| {
            let run = state
                .check_runs
                .iter_mut()
                .find(|r| r.id == id)
                .ok_or_else(|| GithubError::UnknownCheckRun {
                    repo: full_name.to_string(),
                    id,
                })?;
            if run.app_id != app_id {
                return Err(GithubError::NotYourCheckRun { app_id });
            }
            let mut next = run.clone();
            super::checks::apply(&mut next, req, now).map_err(|inv| GithubError::Validation {
                resource: "CheckRun",
                field: inv.field,
                code: inv.code,
                message: inv.message,
            })?;
            *run = next.clone();
            Ok(next)
        })
    }

    pub fn create_comment(
        &self,
        full_name: &str,
        number: u64,
        body: &str,
        user: &str,
    ) -> Result<(IssueComment, Ticket), GithubError> {
        let now = self.clock.now();
        self.with_repo_events(full_name, |state, _repo, ids| {
            let idx = pull_index(state, full_name, number)?;
            check_comment_body(body)?;
            let c = IssueComment {
                id: ids.next_comment_id,
                issue_number: number,
                body: body.to_string(),
                user: user.to_string(),
                created_at: now,
                updated_at: now,
            };
            ids.next_comment_id += 1;
            state.comments.push(c.clone());
            let ev = self.comment_event(state, idx, &c, "created", user, json!({}));
            Ok((c, vec![ev]))
        })
    }

    pub fn update_comment(
        &self,
        full_name: &str,
        id: u64,
        body: &str,
        user: &str,
    ) -> Result<(IssueComment, Ticket), GithubError> {
        let now = self.clock.now();
        self.with_repo_events(full_name, |state, _repo, _| {
            check_comment_body(body)?;
            let c = state
                .comments
                .iter_mut()
                .find(|c| c.id == id)
                .ok_or_else(|| GithubError::UnknownComment {
                    repo: full_name.to_string(),
                    id,
                })?;
            let old = std::mem::replace(&mut c.body, body.to_string());
            c.updated_at = now;
            let c = c.clone();
            let idx = pull_index(state, full_name, c.issue_number)?;
            let ev = self.comment_event(
                state,
                idx,
                &c,
                "edited",
                user,
                json!({ "changes": { "body": { "from": old } } }),
            );
            Ok((c, vec![ev]))
        })
    }

    fn comment_event(
        &self,
        state: &RepoState,
        pull_idx: usize,
        c: &IssueComment,
        action: &str,
        sender: &str,
        extra: Value,
    ) -> Event {
        let pr = &state.pulls[pull_idx];
        let count = state
            .comments
            .iter()
            .filter(|x| x.issue_number == pr.number)
            .count() as u64;
        let mut payload = json!({
            "action": action,
            "issue": json::issue_for_pull(&self.base, state, pr, count),
            "comment": json::comment(&self.base, state, c),
        });
        if let (Some(obj), Value::Object(extra)) = (payload.as_object_mut(), extra) {
            obj.extend(extra);
        }
        Event {
            name: "issue_comment",
            action: Some(action.to_string()),
            repo: state.spec.full_name.clone(),
            repo_id: state.id,
            payload: json::with_envelope(payload, &self.base, state, sender),
        }
    }
}

/// GitHub's login rules: 1 to 39 ASCII letters, digits or single inner hyphens; an App's
/// bot login adds `[bot]`.
pub fn is_valid_login(login: &str) -> bool {
    let name = login.strip_suffix("[bot]").unwrap_or(login);
    !name.is_empty()
        && name.len() <= 39
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

fn check_branch(branch: &str) -> Result<(), GithubError> {
    if git::is_valid_branch(branch) {
        Ok(())
    } else {
        Err(GithubError::Validation {
            resource: "Reference",
            field: "ref",
            code: "invalid",
            message: format!("{branch:?} is not a valid branch name"),
        })
    }
}

/// GitHub refuses a comment body over 262,144 UTF-8 bytes with a 422 whose message speaks
/// of 65,536 characters (measured by bisection on both comment endpoints; the message is
/// GitHub's own).
fn check_comment_body(body: &str) -> Result<(), GithubError> {
    if body.len() > 262_144 {
        return Err(GithubError::Validation {
            resource: "IssueComment",
            field: "data",
            code: "unprocessable",
            message: "Body is too long (maximum is 65536 characters)".into(),
        });
    }
    Ok(())
}

pub fn pull_index(state: &RepoState, full_name: &str, number: u64) -> Result<usize, GithubError> {
    state
        .pulls
        .iter()
        .position(|p| p.number == number)
        .ok_or_else(|| GithubError::UnknownPull {
            repo: full_name.to_string(),
            number,
        })
}

/// Open PRs follow their branches: a push made with plain git (outside the twin) shows
/// up on the next read, as on GitHub.
fn refresh_open_pulls(state: &mut RepoState, repo: &Repository) -> Result<(), GithubError> {
    for pr in state
        .pulls
        .iter_mut()
        .filter(|p| p.state == PullState::Open)
    {
        if let Some(tip) = git::ref_tip(repo, &pr.head_refname()).map_err(git_err("read head"))? {
            let tip = tip.to_string();
            if tip != pr.head_sha {
                pr.head_sha = tip;
            }
        }
        if let Some(tip) = git::branch_tip(repo, &pr.base_ref).map_err(git_err("read base"))? {
            pr.base_sha = tip.to_string();
        }
    }
    Ok(())
}

pub fn statuses_for(state: &RepoState, sha: &str) -> Vec<CommitStatus> {
    state.statuses.get(sha).cloned().unwrap_or_default()
}

pub fn combined(state: &RepoState, sha: &str) -> (StatusState, Vec<CommitStatus>) {
    let latest = model::latest_per_context(&statuses_for(state, sha));
    (model::combined_state(&latest), latest)
}
