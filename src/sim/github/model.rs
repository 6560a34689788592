//! The forge's state as plain data, and the pure rules GitHub applies to it: combined
//! status, status validation, pagination and `Link` headers, timestamps in and out.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::clock::Timestamp;

/// One repository the twin serves: `owner/name` backed by a git repository on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoSpec {
    /// `owner/name`, as it appears in API paths.
    pub full_name: String,
    /// A git repository, bare or with a work tree. The twin moves branch refs only: the
    /// work tree of a checked-out branch is not updated by merges or pushes.
    pub path: PathBuf,
    /// The branch PRs target when none is given (GitHub's `default_branch`).
    pub default_branch: String,
}

impl RepoSpec {
    pub fn new(full_name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        RepoSpec {
            full_name: full_name.into(),
            path: path.into(),
            default_branch: "main".to_string(),
        }
    }

    pub fn owner(&self) -> &str {
        self.full_name.split('/').next().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.full_name.split('/').nth(1).unwrap_or_default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullState {
    Open,
    Closed,
}

impl PullState {
    pub fn as_str(self) -> &'static str {
        match self {
            PullState::Open => "open",
            PullState::Closed => "closed",
        }
    }
}

/// A pull request as the twin stores it. For an open PR the head and base shas are read
/// live from the branches; `head_sha`/`base_sha` hold the last values seen, and are what
/// a closed PR keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullRequest {
    pub id: u64,
    pub number: u64,
    pub title: String,
    pub body: Option<String>,
    pub head_ref: String,
    pub head_sha: String,
    pub base_ref: String,
    pub base_sha: String,
    pub state: PullState,
    pub merged: bool,
    pub merged_at: Option<Timestamp>,
    pub merged_by: Option<String>,
    pub merge_commit_sha: Option<String>,
    pub closed_at: Option<Timestamp>,
    pub user: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub draft: bool,
    /// The owner of the fork the head branch lives in; `None` for a branch of the
    /// repository itself.
    pub head_owner: Option<String>,
}

impl PullRequest {
    /// The ref holding the head branch in the served repository.
    pub fn head_refname(&self) -> String {
        match &self.head_owner {
            Some(owner) => super::git::fork_ref(owner, &self.head_ref),
            None => format!("refs/heads/{}", self.head_ref),
        }
    }
}

/// A collaborator's role on a repository, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Read,
    Triage,
    Write,
    Maintain,
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "read" | "pull" => Some(Role::Read),
            "triage" => Some(Role::Triage),
            "write" | "push" => Some(Role::Write),
            "maintain" => Some(Role::Maintain),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// The `role_name` GitHub reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Triage => "triage",
            Role::Write => "write",
            Role::Maintain => "maintain",
            Role::Admin => "admin",
        }
    }

    /// The coarse `permission` GitHub reports beside it: maintain counts as write and
    /// triage as read.
    pub fn permission(self) -> &'static str {
        match self {
            Role::Read | Role::Triage => "read",
            Role::Write | Role::Maintain => "write",
            Role::Admin => "admin",
        }
    }
}

/// One commit status as posted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitStatus {
    pub id: u64,
    pub sha: String,
    pub state: StatusState,
    pub context: String,
    pub description: Option<String>,
    pub target_url: Option<String>,
    pub creator: String,
    pub created_at: Timestamp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusState {
    Error,
    Failure,
    Pending,
    Success,
}

impl StatusState {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "error" => Some(StatusState::Error),
            "failure" => Some(StatusState::Failure),
            "pending" => Some(StatusState::Pending),
            "success" => Some(StatusState::Success),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StatusState::Error => "error",
            StatusState::Failure => "failure",
            StatusState::Pending => "pending",
            StatusState::Success => "success",
        }
    }
}

/// One issue comment on a PR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssueComment {
    pub id: u64,
    pub issue_number: u64,
    pub body: String,
    pub user: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Everything the twin knows about one repository besides its git objects.
#[derive(Clone, Debug)]
pub struct RepoState {
    pub id: u64,
    pub spec: RepoSpec,
    /// When the emulator took the repository in: its `created_at`, `updated_at`, `pushed_at`.
    pub created_at: crate::clock::Timestamp,
    pub pulls: Vec<PullRequest>,
    /// Per commit sha, oldest first.
    pub statuses: BTreeMap<String, Vec<CommitStatus>>,
    pub comments: Vec<IssueComment>,
    /// Check runs of every App, oldest first.
    pub check_runs: Vec<super::checks::CheckRun>,
    /// Lower-cased login → (login as given, role).
    pub collaborators: BTreeMap<String, (String, Role)>,
}

/// GitHub's cap on statuses for one (sha, context) pair.
pub const MAX_STATUSES_PER_CONTEXT: usize = 1000;
pub const MAX_DESCRIPTION_CHARS: usize = 140;
pub const MAX_CONTEXT_CHARS: usize = 255;

/// Why a status was refused: the `field` and the `message` of GitHub's validation error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub code: &'static str,
    pub message: String,
}

/// GitHub's checks on a new status, in the order it reports them.
pub fn validate_status(
    state: &str,
    context: &str,
    description: Option<&str>,
    existing_for_context: usize,
) -> Result<StatusState, Invalid> {
    let Some(parsed) = StatusState::parse(state) else {
        return Err(Invalid {
            field: "state",
            code: "invalid",
            message: format!("state is not included in the list (got {state:?})"),
        });
    };
    if description.is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_CHARS) {
        return Err(Invalid {
            field: "description",
            code: "custom",
            message: format!(
                "description is too long (maximum is {MAX_DESCRIPTION_CHARS} characters)"
            ),
        });
    }
    if context.chars().count() > MAX_CONTEXT_CHARS {
        return Err(Invalid {
            field: "context",
            code: "custom",
            message: format!("context is too long (maximum is {MAX_CONTEXT_CHARS} characters)"),
        });
    }
    if existing_for_context >= MAX_STATUSES_PER_CONTEXT {
        return Err(Invalid {
            field: "context",
            code: "custom",
            message: "This SHA and context has reached the maximum number of statuses.".to_string(),
        });
    }
    Ok(parsed)
}

/// The latest status per context (contexts compare case-insensitively), newest first.
pub fn latest_per_context(statuses: &[CommitStatus]) -> Vec<CommitStatus> {
    let mut seen = std::collections::HashSet::new();
    let mut latest = Vec::new();
    for s in statuses.iter().rev() {
        if seen.insert(s.context.to_lowercase()) {
            latest.push(s.clone());
        }
    }
    latest
}

/// GitHub's combined state over the latest status per context: `failure` if any is error
/// or failure, `pending` if there are none or any is pending, else `success`.
pub fn combined_state(latest: &[CommitStatus]) -> StatusState {
    if latest
        .iter()
        .any(|s| matches!(s.state, StatusState::Error | StatusState::Failure))
    {
        StatusState::Failure
    } else if latest.is_empty() || latest.iter().any(|s| s.state == StatusState::Pending) {
        StatusState::Pending
    } else {
        StatusState::Success
    }
}

/// `per_page` (default 30, at most 100) and `page` (from 1) as GitHub reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRequest {
    pub per_page: usize,
    pub page: usize,
}

impl PageRequest {
    pub fn from_query(per_page: Option<&str>, page: Option<&str>) -> Self {
        let per_page = per_page
            .and_then(|p| p.parse::<usize>().ok())
            .map(|p| p.clamp(1, 100))
            .unwrap_or(30);
        let page = page
            .and_then(|p| p.parse::<usize>().ok())
            .filter(|p| *p >= 1)
            .unwrap_or(1);
        PageRequest { per_page, page }
    }

    /// The slice of `items` on this page.
    pub fn slice<'a, T>(&self, items: &'a [T]) -> &'a [T] {
        let start = (self.page - 1)
            .saturating_mul(self.per_page)
            .min(items.len());
        let end = start.saturating_add(self.per_page).min(items.len());
        &items[start..end]
    }

    pub fn last_page(&self, total: usize) -> usize {
        total.div_ceil(self.per_page).max(1)
    }
}

/// The `Link` header for `page` of `total` items at `url_without_paging` (which keeps
/// the other query parameters), or `None` when everything fits on one page.
pub fn link_header(
    url_without_paging: &str,
    other_query: &[(String, String)],
    req: PageRequest,
    total: usize,
) -> Option<String> {
    let last = req.last_page(total);
    if last <= 1 && req.page <= 1 {
        return None;
    }
    let href = |page: usize| {
        let mut q: Vec<String> = other_query
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        q.push(format!("per_page={}", req.per_page));
        q.push(format!("page={page}"));
        format!("<{url_without_paging}?{}>", q.join("&"))
    };
    let mut parts = Vec::new();
    if req.page > 1 {
        parts.push(format!("{}; rel=\"prev\"", href((req.page - 1).min(last))));
    }
    if req.page < last {
        parts.push(format!("{}; rel=\"next\"", href(req.page + 1)));
        parts.push(format!("{}; rel=\"last\"", href(last)));
    }
    if req.page > 1 {
        parts.push(format!("{}; rel=\"first\"", href(1)));
    }
    Some(parts.join(", "))
}

/// Parse an ISO 8601 UTC instant such as `2026-01-01T00:00:00Z` (the form GitHub's
/// `since` parameter takes); fractional seconds are ignored.
pub fn parse_rfc3339(s: &str) -> Option<Timestamp> {
    let s = s.trim();
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-');
    let y: i64 = d.next()?.parse().ok()?;
    let m: u32 = d.next()?.parse().ok()?;
    let day: u32 = d.next()?.parse().ok()?;
    let time = time
        .strip_suffix('Z')
        .or_else(|| time.strip_suffix("+00:00"))?;
    let time = time.split('.').next()?;
    let mut t = time.split(':');
    let h: u64 = t.next()?.parse().ok()?;
    let mi: u64 = t.next()?.parse().ok()?;
    let sec: u64 = t.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let days = days_from_civil(y, m, day);
    if days < 0 {
        return None;
    }
    let secs = days as u64 * 86_400 + h * 3600 + mi * 60 + sec;
    Some(Timestamp::from_millis(secs * 1000))
}

/// (year, month, day) to days since 1970-01-01; Howard Hinnant's algorithm.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: u64, context: &str, state: StatusState) -> CommitStatus {
        CommitStatus {
            id,
            sha: "abc".into(),
            state,
            context: context.into(),
            description: None,
            target_url: None,
            creator: "bot".into(),
            created_at: Timestamp(id),
        }
    }

    #[test]
    fn combined_state_follows_githubs_rules() {
        assert_eq!(combined_state(&[]), StatusState::Pending);
        let all = vec![
            status(1, "ci", StatusState::Failure),
            status(2, "CI", StatusState::Success),
            status(3, "ichor/gate", StatusState::Success),
        ];
        let latest = latest_per_context(&all);
        assert_eq!(latest.len(), 2, "contexts compare case-insensitively");
        assert_eq!(combined_state(&latest), StatusState::Success);
        let with_pending = [latest.clone(), vec![status(4, "x", StatusState::Pending)]].concat();
        assert_eq!(combined_state(&with_pending), StatusState::Pending);
        let with_error = [with_pending, vec![status(5, "y", StatusState::Error)]].concat();
        assert_eq!(combined_state(&with_error), StatusState::Failure);
    }

    #[test]
    fn status_validation_matches_github() {
        assert!(validate_status("success", "default", Some(&"a".repeat(140)), 0).is_ok());
        let err = validate_status("success", "default", Some(&"a".repeat(141)), 0);
        assert_eq!(err.map_err(|e| e.field), Err("description"));
        assert_eq!(
            validate_status("green", "c", None, 0).map_err(|e| e.field),
            Err("state")
        );
        assert_eq!(
            validate_status("success", &"c".repeat(256), None, 0).map_err(|e| e.field),
            Err("context")
        );
        assert!(validate_status("success", "c", None, MAX_STATUSES_PER_CONTEXT).is_err());
    }

    #[test]
    fn pages_and_links() {
        let req = PageRequest::from_query(Some("2"), Some("2"));
        let items = [1, 2, 3, 4, 5];
        assert_eq!(req.slice(&items), &[3, 4]);
        let link = link_header("http://h/x", &[("state".into(), "all".into())], req, 5)
            .unwrap_or_default();
        assert!(link.contains("<http://h/x?state=all&per_page=2&page=3>; rel=\"next\""));
        assert!(link.contains("page=1>; rel=\"prev\""));
        assert!(link.contains("page=3>; rel=\"last\""));
        assert_eq!(
            link_header("http://h/x", &[], PageRequest::from_query(None, None), 5),
            None
        );
        assert_eq!(
            PageRequest::from_query(Some("1000"), Some("0")).per_page,
            100
        );
    }

    #[test]
    fn rfc3339_round_trips() {
        let t = Timestamp(1_796_023_926_000);
        assert_eq!(parse_rfc3339(&t.rfc3339()), Some(t));
        assert_eq!(
            parse_rfc3339("2026-01-01T00:00:00.123Z"),
            Some(Timestamp(1_767_225_600_000))
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
