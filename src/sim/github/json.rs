//! The JSON shapes of GitHub's REST API and webhook payloads, written from the API
//! documentation so that GitHub clients (octocrab's models) deserialize them. Every URL
//! points back at the twin.

use serde_json::{json, Value};

use super::git::PushedCommit;
use super::model::{CommitStatus, IssueComment, PullRequest, PullState, RepoState, StatusState};
use crate::clock::Timestamp;

/// A stable numeric id for a login, so the same user always has the same id.
pub fn user_id(login: &str) -> u64 {
    // FNV-1a: tiny, stable across runs, good enough to tell users apart.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in login.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % 100_000_000 + 1
}

pub fn node_id(prefix: &str, id: u64) -> String {
    use base64::Engine as _;
    let raw = format!("0:{id}");
    format!(
        "{prefix}_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw)
    )
}

pub fn user(base: &str, login: &str) -> Value {
    let id = user_id(login);
    let kind = if login.ends_with("[bot]") {
        "Bot"
    } else {
        "User"
    };
    let u = format!("{base}/users/{login}");
    json!({
        "login": login,
        "id": id,
        "node_id": node_id("U", id),
        "avatar_url": format!("{base}/avatars/u/{id}"),
        "gravatar_id": "",
        "url": u,
        "html_url": format!("{base}/{login}"),
        "followers_url": format!("{u}/followers"),
        "following_url": format!("{u}/following{{/other_user}}"),
        "gists_url": format!("{u}/gists{{/gist_id}}"),
        "starred_url": format!("{u}/starred{{/owner}}{{/repo}}"),
        "subscriptions_url": format!("{u}/subscriptions"),
        "organizations_url": format!("{u}/orgs"),
        "repos_url": format!("{u}/repos"),
        "events_url": format!("{u}/events{{/privacy}}"),
        "received_events_url": format!("{u}/received_events"),
        "type": kind,
        "site_admin": false,
    })
}

pub fn repo_url(base: &str, repo: &RepoState) -> String {
    format!("{base}/repos/{}", repo.spec.full_name)
}

/// The repository object, every field `common/repository.schema.json` in octokit/webhooks
/// requires (the REST API's `full-repository` holds the same ones). Times are strings here;
/// a `push` payload carries `created_at` and `pushed_at` as epoch seconds instead
/// ([`push_envelope`]).
pub fn repository(base: &str, repo: &RepoState) -> Value {
    let url = repo_url(base, repo);
    let mut v = repository_core(base, repo, &url);
    let created = ts(repo.created_at);
    if let Some(obj) = v.as_object_mut() {
        let name = &repo.spec.full_name;
        let host = base
            .split_once("://")
            .map_or(base, |(_, rest)| rest)
            .split('/')
            .next()
            .unwrap_or("")
            .to_string();
        for (key, value) in [
            ("forks_url", json!(format!("{url}/forks"))),
            ("keys_url", json!(format!("{url}/keys{{/key_id}}"))),
            (
                "collaborators_url",
                json!(format!("{url}/collaborators{{/collaborator}}")),
            ),
            ("teams_url", json!(format!("{url}/teams"))),
            ("hooks_url", json!(format!("{url}/hooks"))),
            (
                "issue_events_url",
                json!(format!("{url}/issues/events{{/number}}")),
            ),
            ("events_url", json!(format!("{url}/events"))),
            ("assignees_url", json!(format!("{url}/assignees{{/user}}"))),
            ("branches_url", json!(format!("{url}/branches{{/branch}}"))),
            ("tags_url", json!(format!("{url}/tags"))),
            ("blobs_url", json!(format!("{url}/git/blobs{{/sha}}"))),
            ("git_tags_url", json!(format!("{url}/git/tags{{/sha}}"))),
            ("git_refs_url", json!(format!("{url}/git/refs{{/sha}}"))),
            ("trees_url", json!(format!("{url}/git/trees{{/sha}}"))),
            ("languages_url", json!(format!("{url}/languages"))),
            ("stargazers_url", json!(format!("{url}/stargazers"))),
            ("contributors_url", json!(format!("{url}/contributors"))),
            ("subscribers_url", json!(format!("{url}/subscribers"))),
            ("subscription_url", json!(format!("{url}/subscription"))),
            (
                "git_commits_url",
                json!(format!("{url}/git/commits{{/sha}}")),
            ),
            ("contents_url", json!(format!("{url}/contents/{{+path}}"))),
            (
                "compare_url",
                json!(format!("{url}/compare/{{base}}...{{head}}")),
            ),
            ("merges_url", json!(format!("{url}/merges"))),
            (
                "archive_url",
                json!(format!("{url}/{{archive_format}}{{/ref}}")),
            ),
            ("downloads_url", json!(format!("{url}/downloads"))),
            ("issues_url", json!(format!("{url}/issues{{/number}}"))),
            (
                "milestones_url",
                json!(format!("{url}/milestones{{/number}}")),
            ),
            (
                "notifications_url",
                json!(format!("{url}/notifications{{?since,all,participating}}")),
            ),
            ("labels_url", json!(format!("{url}/labels{{/name}}"))),
            ("releases_url", json!(format!("{url}/releases{{/id}}"))),
            ("deployments_url", json!(format!("{url}/deployments"))),
            ("created_at", created.clone()),
            ("updated_at", created.clone()),
            ("pushed_at", created),
            ("ssh_url", json!(format!("git@{host}:{name}.git"))),
            ("svn_url", json!(format!("{base}/{name}"))),
            ("homepage", Value::Null),
            ("mirror_url", Value::Null),
            ("language", Value::Null),
            ("license", Value::Null),
            ("size", json!(0)),
            ("stargazers_count", json!(0)),
            ("watchers_count", json!(0)),
            ("watchers", json!(0)),
            ("forks_count", json!(0)),
            ("forks", json!(0)),
            (
                "open_issues_count",
                json!(repo
                    .pulls
                    .iter()
                    .filter(|p| p.state == crate::sim::github::model::PullState::Open)
                    .count()),
            ),
            (
                "open_issues",
                json!(repo
                    .pulls
                    .iter()
                    .filter(|p| p.state == crate::sim::github::model::PullState::Open)
                    .count()),
            ),
            ("has_issues", json!(true)),
            ("has_projects", json!(false)),
            ("has_downloads", json!(false)),
            ("has_wiki", json!(false)),
            ("has_pages", json!(false)),
            ("has_discussions", json!(false)),
            ("is_template", json!(false)),
            ("web_commit_signoff_required", json!(false)),
            ("allow_forking", json!(true)),
            ("topics", json!([])),
            ("custom_properties", json!({})),
        ] {
            obj.insert(key.into(), value);
        }
    }
    v
}

/// A `push` payload's repository: `created_at` and `pushed_at` in epoch seconds, as GitHub
/// sends them there (`oneOf` integer or date-time string in the schema).
pub fn push_repository(base: &str, repo: &RepoState) -> Value {
    let mut v = repository(base, repo);
    if let Some(obj) = v.as_object_mut() {
        let secs = json!(repo.created_at.as_millis() / 1000);
        obj.insert("created_at".into(), secs.clone());
        obj.insert("pushed_at".into(), secs);
    }
    v
}

fn repository_core(base: &str, repo: &RepoState, url: &str) -> Value {
    json!({
        "id": repo.id,
        "node_id": node_id("R", repo.id),
        "name": repo.spec.name(),
        "full_name": repo.spec.full_name,
        "owner": user(base, repo.spec.owner()),
        "private": false,
        "html_url": format!("{base}/{}", repo.spec.full_name),
        "description": Value::Null,
        "fork": false,
        "url": url,
        "pulls_url": format!("{url}/pulls{{/number}}"),
        "statuses_url": format!("{url}/statuses/{{sha}}"),
        "commits_url": format!("{url}/commits{{/sha}}"),
        "issue_comment_url": format!("{url}/issues/comments{{/number}}"),
        "comments_url": format!("{url}/comments{{/number}}"),
        "git_url": format!("{base}/{}.git", repo.spec.full_name),
        "clone_url": format!("{base}/{}.git", repo.spec.full_name),
        "default_branch": repo.spec.default_branch,
        "archived": false,
        "disabled": false,
        "visibility": "public",
    })
}

fn ts(t: Timestamp) -> Value {
    Value::String(t.rfc3339())
}

fn opt_ts(t: Option<Timestamp>) -> Value {
    t.map(ts).unwrap_or(Value::Null)
}

/// The facts about a PR that are computed live (for the single-PR and webhook shapes).
#[derive(Clone, Debug, Default)]
pub struct PullDetail {
    pub mergeable: Option<bool>,
    pub commits: u64,
    pub comments: u64,
}

fn branch_end(base: &str, repo: &RepoState, branch: &str, sha: &str) -> Value {
    json!({
        "label": format!("{}:{branch}", repo.spec.owner()),
        "ref": branch,
        "sha": sha,
        "user": user(base, repo.spec.owner()),
        "repo": repository(base, repo),
    })
}

/// The head of a PR from `owner`'s fork: its label, user and repository are the fork's.
fn fork_branch_end(base: &str, repo: &RepoState, owner: &str, branch: &str, sha: &str) -> Value {
    json!({
        "label": format!("{owner}:{branch}"),
        "ref": branch,
        "sha": sha,
        "user": user(base, owner),
        "repo": fork_repository(base, repo, owner),
    })
}

/// `owner`'s fork of `repo`: same name, its own id and owner, `fork: true`.
pub fn fork_repository(base: &str, repo: &RepoState, owner: &str) -> Value {
    let mut v = repository(base, repo);
    let full_name = format!("{owner}/{}", repo.spec.name());
    let id = 800_000_000 + user_id(&full_name);
    let url = format!("{base}/repos/{full_name}");
    if let Some(obj) = v.as_object_mut() {
        obj.insert("id".into(), json!(id));
        obj.insert("node_id".into(), json!(node_id("R", id)));
        obj.insert("full_name".into(), json!(full_name));
        obj.insert("owner".into(), user(base, owner));
        obj.insert("fork".into(), json!(true));
        obj.insert("html_url".into(), json!(format!("{base}/{full_name}")));
        obj.insert("url".into(), json!(url));
        obj.insert("pulls_url".into(), json!(format!("{url}/pulls{{/number}}")));
        obj.insert(
            "statuses_url".into(),
            json!(format!("{url}/statuses/{{sha}}")),
        );
        obj.insert(
            "commits_url".into(),
            json!(format!("{url}/commits{{/sha}}")),
        );
        obj.insert(
            "issue_comment_url".into(),
            json!(format!("{url}/issues/comments{{/number}}")),
        );
        obj.insert(
            "comments_url".into(),
            json!(format!("{url}/comments{{/number}}")),
        );
        obj.insert("git_url".into(), json!(format!("{base}/{full_name}.git")));
        obj.insert("clone_url".into(), json!(format!("{base}/{full_name}.git")));
    }
    v
}

/// The PR shape. `detail` adds the fields only `GET /pulls/{n}` and webhooks carry
/// (`merged`, `mergeable`, counts); the list endpoint omits them, as GitHub does.
pub fn pull_request(
    base: &str,
    repo: &RepoState,
    pr: &PullRequest,
    detail: Option<&PullDetail>,
) -> Value {
    let rurl = repo_url(base, repo);
    let url = format!("{rurl}/pulls/{}", pr.number);
    let html = format!("{base}/{}/pull/{}", repo.spec.full_name, pr.number);
    let issue = format!("{rurl}/issues/{}", pr.number);
    let statuses = format!("{rurl}/statuses/{}", pr.head_sha);
    let links = json!({
        "self": {"href": url},
        "html": {"href": html},
        "issue": {"href": issue},
        "comments": {"href": format!("{issue}/comments")},
        "review_comments": {"href": format!("{url}/comments")},
        "review_comment": {"href": format!("{rurl}/pulls/comments{{/number}}")},
        "commits": {"href": format!("{url}/commits")},
        "statuses": {"href": statuses},
    });
    let mut v = json!({
        "url": url,
        "id": pr.id,
        "node_id": node_id("PR", pr.id),
        "html_url": html,
        "diff_url": format!("{html}.diff"),
        "patch_url": format!("{html}.patch"),
        "issue_url": issue,
        "commits_url": format!("{url}/commits"),
        "review_comments_url": format!("{url}/comments"),
        "review_comment_url": format!("{rurl}/pulls/comments{{/number}}"),
        "comments_url": format!("{issue}/comments"),
        "statuses_url": statuses,
        "number": pr.number,
        "state": pr.state.as_str(),
        "locked": false,
        "title": pr.title,
        "user": user(base, &pr.user),
        "body": pr.body,
        "labels": [],
        "milestone": Value::Null,
        "active_lock_reason": Value::Null,
        "created_at": ts(pr.created_at),
        "updated_at": ts(pr.updated_at),
        "closed_at": opt_ts(pr.closed_at),
        "merged_at": opt_ts(pr.merged_at),
        "merge_commit_sha": pr.merge_commit_sha,
        "assignee": Value::Null,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "head": match &pr.head_owner {
            Some(owner) => fork_branch_end(base, repo, owner, &pr.head_ref, &pr.head_sha),
            None => branch_end(base, repo, &pr.head_ref, &pr.head_sha),
        },
        "base": branch_end(base, repo, &pr.base_ref, &pr.base_sha),
        "_links": links,
        "author_association": association(repo, &pr.user),
        "auto_merge": Value::Null,
        "draft": pr.draft,
    });
    if let (Some(d), Some(obj)) = (detail, v.as_object_mut()) {
        let open = pr.state == PullState::Open;
        let mergeable = if open { d.mergeable } else { None };
        let mergeable_state = match (open, mergeable) {
            (false, _) => "unknown",
            (true, Some(true)) => "clean",
            (true, Some(false)) => "dirty",
            (true, None) => "unknown",
        };
        obj.insert("merged".into(), json!(pr.merged));
        obj.insert("mergeable".into(), json!(mergeable));
        obj.insert("rebaseable".into(), json!(mergeable));
        obj.insert("mergeable_state".into(), json!(mergeable_state));
        obj.insert(
            "merged_by".into(),
            pr.merged_by
                .as_deref()
                .map(|l| user(base, l))
                .unwrap_or(Value::Null),
        );
        obj.insert("comments".into(), json!(d.comments));
        obj.insert("review_comments".into(), json!(0));
        obj.insert("maintainer_can_modify".into(), json!(false));
        obj.insert("commits".into(), json!(d.commits));
        obj.insert("additions".into(), json!(0));
        obj.insert("deletions".into(), json!(0));
        obj.insert("changed_files".into(), json!(0));
    }
    v
}

fn association(repo: &RepoState, login: &str) -> &'static str {
    if login == repo.spec.owner() {
        "OWNER"
    } else if login.ends_with("[bot]") {
        "NONE"
    } else {
        "MEMBER"
    }
}

/// The issue side of a PR (webhook `issue_comment` payloads carry it).
pub fn issue_for_pull(base: &str, repo: &RepoState, pr: &PullRequest, comments: u64) -> Value {
    let rurl = repo_url(base, repo);
    let issue = format!("{rurl}/issues/{}", pr.number);
    let html = format!("{base}/{}/pull/{}", repo.spec.full_name, pr.number);
    json!({
        "url": issue,
        "repository_url": rurl,
        "labels_url": format!("{issue}/labels{{/name}}"),
        "comments_url": format!("{issue}/comments"),
        "events_url": format!("{issue}/events"),
        "html_url": html,
        "id": pr.id,
        "node_id": node_id("I", pr.id),
        "number": pr.number,
        "title": pr.title,
        "user": user(base, &pr.user),
        "labels": [],
        "state": pr.state.as_str(),
        "state_reason": Value::Null,
        "locked": false,
        "assignee": Value::Null,
        "assignees": [],
        "milestone": Value::Null,
        "comments": comments,
        "created_at": ts(pr.created_at),
        "updated_at": ts(pr.updated_at),
        "closed_at": opt_ts(pr.closed_at),
        "author_association": association(repo, &pr.user),
        "active_lock_reason": Value::Null,
        "body": pr.body,
        "reactions": reactions(&format!("{rurl}/issues/{}/reactions", pr.number)),
        "pull_request": {
            "url": format!("{rurl}/pulls/{}", pr.number),
            "html_url": html,
            "diff_url": format!("{html}.diff"),
            "patch_url": format!("{html}.patch"),
            "merged_at": opt_ts(pr.merged_at),
        },
    })
}

pub fn comment(base: &str, repo: &RepoState, c: &IssueComment) -> Value {
    let rurl = repo_url(base, repo);
    json!({
        "id": c.id,
        "node_id": node_id("IC", c.id),
        "url": format!("{rurl}/issues/comments/{}", c.id),
        "html_url": format!("{base}/{}/pull/{}#issuecomment-{}", repo.spec.full_name, c.issue_number, c.id),
        "issue_url": format!("{rurl}/issues/{}", c.issue_number),
        "body": c.body,
        "user": user(base, &c.user),
        "created_at": ts(c.created_at),
        "updated_at": ts(c.updated_at),
        "author_association": association(repo, &c.user),
        "performed_via_github_app": Value::Null,
        "reactions": reactions(&format!("{rurl}/issues/comments/{}/reactions", c.id)),
    })
}

/// No reactions: the `reactions` rollup the schema requires on issues and comments.
fn reactions(url: &str) -> Value {
    json!({
        "url": url, "total_count": 0, "+1": 0, "-1": 0, "laugh": 0, "confused": 0,
        "heart": 0, "hooray": 0, "eyes": 0, "rocket": 0,
    })
}

pub fn status(base: &str, repo: &RepoState, s: &CommitStatus) -> Value {
    json!({
        "url": format!("{}/statuses/{}", repo_url(base, repo), s.sha),
        "avatar_url": Value::Null,
        "id": s.id,
        "node_id": node_id("SC", s.id),
        "state": s.state.as_str(),
        "description": s.description,
        "target_url": s.target_url,
        "context": s.context,
        "created_at": ts(s.created_at),
        "updated_at": ts(s.created_at),
        "creator": user(base, &s.creator),
    })
}

pub fn combined_status(
    base: &str,
    repo: &RepoState,
    sha: &str,
    state: StatusState,
    latest: &[CommitStatus],
) -> Value {
    let rurl = repo_url(base, repo);
    json!({
        "state": state.as_str(),
        "statuses": latest.iter().map(|s| status(base, repo, s)).collect::<Vec<_>>(),
        "sha": sha,
        "total_count": latest.len(),
        "repository": repository(base, repo),
        "commit_url": format!("{rurl}/commits/{sha}"),
        "url": format!("{rurl}/commits/{sha}/status"),
    })
}

fn git_user(name: &str, email: &str, date: Option<Timestamp>) -> Value {
    let mut v = json!({ "name": name, "email": email, "username": name });
    if let (Some(d), Some(obj)) = (date, v.as_object_mut()) {
        obj.insert("date".into(), ts(d));
    }
    v
}

pub fn push_commit(base: &str, repo: &RepoState, c: &PushedCommit) -> Value {
    json!({
        "id": c.id,
        "tree_id": c.tree_id,
        "distinct": true,
        "message": c.message,
        "timestamp": ts(c.time),
        "url": format!("{base}/{}/commit/{}", repo.spec.full_name, c.id),
        "author": git_user(&c.author_name, &c.author_email, None),
        "committer": git_user(&c.committer_name, &c.committer_email, None),
        "added": c.added,
        "removed": c.removed,
        "modified": c.modified,
    })
}

/// The `push` event payload (without `repository`/`sender`, which every event shares).
#[allow(clippy::too_many_arguments)]
pub fn push_event(
    base: &str,
    repo: &RepoState,
    branch: &str,
    before: &str,
    after: &str,
    forced: bool,
    commits: &[PushedCommit],
    pusher: &str,
) -> Value {
    let zero = "0".repeat(40);
    let commits_json: Vec<Value> = commits.iter().map(|c| push_commit(base, repo, c)).collect();
    json!({
        "ref": format!("refs/heads/{branch}"),
        "before": before,
        "after": after,
        "created": before == zero,
        "deleted": after == zero,
        "forced": forced,
        "base_ref": Value::Null,
        "compare": format!("{base}/{}/compare/{}...{}", repo.spec.full_name, &before[..12.min(before.len())], &after[..12.min(after.len())]),
        "commits": commits_json,
        "head_commit": commits_json.last().cloned().unwrap_or(Value::Null),
        "pusher": { "name": pusher, "email": format!("{pusher}@users.noreply.twin") },
    })
}

/// Adds the fields every webhook payload shares.
pub fn with_envelope(mut payload: Value, base: &str, repo: &RepoState, sender: &str) -> Value {
    if let Some(obj) = payload.as_object_mut() {
        obj.insert("repository".into(), repository(base, repo));
        obj.insert("sender".into(), user(base, sender));
    }
    payload
}

/// [`with_envelope`] for a `push`, whose repository carries epoch-second times.
pub fn with_push_envelope(payload: Value, base: &str, repo: &RepoState, sender: &str) -> Value {
    let mut payload = with_envelope(payload, base, repo, sender);
    if let Some(obj) = payload.as_object_mut() {
        obj.insert("repository".into(), push_repository(base, repo));
    }
    payload
}

pub fn rate(limit: u64, used: u64, reset: u64) -> Value {
    json!({
        "limit": limit,
        "used": used,
        "remaining": limit.saturating_sub(used),
        "reset": reset,
    })
}
