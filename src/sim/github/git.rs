//! The git side of the forge: branch tips, ref resolution, merges and new commits, all
//! through git2 on the repository the twin serves.

use std::path::Path;

use git2::{build::TreeUpdateBuilder, FileMode, Oid, Repository, Signature, Time};

use crate::clock::Timestamp;

pub fn open(path: &Path) -> Result<Repository, git2::Error> {
    Repository::open(path)
}

/// Whether `name` may name a branch, by git's refname rules (no `..`, `~`, `^`, `:`, `?`,
/// `*`, `[`, `\\`, spaces or control characters, no component starting with `.` or ending
/// in `.lock`, no `@{`) plus what `git branch` refuses besides: a leading `-` and `HEAD`.
pub fn is_valid_branch(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('-')
        && name != "HEAD"
        && git2::Reference::is_valid_name(&format!("refs/heads/{name}"))
}

/// The commit a branch points at, or `None` when the branch does not exist.
pub fn branch_tip(repo: &Repository, branch: &str) -> Result<Option<Oid>, git2::Error> {
    ref_tip(repo, &format!("refs/heads/{branch}"))
}

/// Where the twin keeps the branch `branch` of `owner`'s fork: in the served repository
/// itself, under a namespace GitHub's own `refs/heads` never sees.
pub fn fork_ref(owner: &str, branch: &str) -> String {
    format!("refs/forks/{}/{branch}", owner.to_lowercase())
}

/// The commit a full ref name points at, or `None` when the ref does not exist.
pub fn ref_tip(repo: &Repository, refname: &str) -> Result<Option<Oid>, git2::Error> {
    match repo.find_reference(refname) {
        Ok(r) => Ok(Some(r.peel_to_commit()?.id())),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Resolve what GitHub accepts as a `{ref}`: a full sha, a branch, a tag, `heads/x`,
/// `tags/x`, or a full ref name, to a commit.
pub fn resolve_commit(repo: &Repository, r: &str) -> Option<Oid> {
    if r.len() == 40 && r.chars().all(|c| c.is_ascii_hexdigit()) {
        let oid = Oid::from_str(r).ok()?;
        return repo.find_commit(oid).ok().map(|c| c.id());
    }
    let candidates = [
        format!("refs/heads/{r}"),
        format!("refs/tags/{r}"),
        format!("refs/{r}"),
        r.to_string(),
    ];
    candidates.iter().find_map(|name| {
        repo.find_reference(name)
            .ok()
            .and_then(|reference| reference.peel_to_commit().ok())
            .map(|c| c.id())
    })
}

pub fn signature(
    name: &str,
    email: &str,
    at: Timestamp,
) -> Result<Signature<'static>, git2::Error> {
    let secs = (at.as_millis() / 1000) as i64;
    Signature::new(name, email, &Time::new(secs, 0))
}

pub enum MergeOutcome {
    Merged(Oid),
    Conflict,
}

/// Merge `head` into `base_branch` as GitHub's merge button does: a merge commit with two
/// parents (or, for `squash`, one commit with the merged tree), moving the branch.
pub fn merge_into(
    repo: &Repository,
    base_branch: &str,
    head: Oid,
    message: &str,
    sig: &Signature<'_>,
    squash: bool,
) -> Result<MergeOutcome, git2::Error> {
    let Some(base_tip) = branch_tip(repo, base_branch)? else {
        return Err(git2::Error::from_str(&format!(
            "base branch {base_branch} does not exist"
        )));
    };
    let base = repo.find_commit(base_tip)?;
    let head = repo.find_commit(head)?;
    let mut index = repo.merge_commits(&base, &head, None)?;
    if index.has_conflicts() {
        return Ok(MergeOutcome::Conflict);
    }
    let tree = repo.find_tree(index.write_tree_to(repo)?)?;
    let parents: Vec<&git2::Commit<'_>> = if squash {
        vec![&base]
    } else {
        vec![&base, &head]
    };
    let refname = format!("refs/heads/{base_branch}");
    // Write the commit first, then move the branch only if nobody moved it meanwhile.
    let oid = repo.commit(None, sig, sig, message, &tree, &parents)?;
    repo.reference_matching(&refname, oid, true, base_tip, message)?;
    Ok(MergeOutcome::Merged(oid))
}

/// Whether merging `head` into `base_branch` would conflict (GitHub's `mergeable`).
pub fn mergeable(repo: &Repository, base_branch: &str, head: Oid) -> Result<bool, git2::Error> {
    let Some(base_tip) = branch_tip(repo, base_branch)? else {
        return Ok(false);
    };
    let index = repo.merge_commits(&repo.find_commit(base_tip)?, &repo.find_commit(head)?, None)?;
    Ok(!index.has_conflicts())
}

/// Commit `files` (path → new content) on top of `branch`, creating the branch from
/// `start` when it does not exist yet. Returns (old tip, new tip).
pub fn commit_files(
    repo: &Repository,
    branch: &str,
    start: Option<Oid>,
    files: &[(String, String)],
    message: &str,
    sig: &Signature<'_>,
) -> Result<(Option<Oid>, Oid), git2::Error> {
    commit_files_on_ref(
        repo,
        &format!("refs/heads/{branch}"),
        start,
        files,
        message,
        sig,
    )
}

/// [`commit_files`] on any ref (a fork's branch lives outside `refs/heads`).
pub fn commit_files_on_ref(
    repo: &Repository,
    refname: &str,
    start: Option<Oid>,
    files: &[(String, String)],
    message: &str,
    sig: &Signature<'_>,
) -> Result<(Option<Oid>, Oid), git2::Error> {
    let old = ref_tip(repo, refname)?;
    let Some(parent_oid) = old.or(start) else {
        return Err(git2::Error::from_str(&format!(
            "{refname} does not exist and no start commit was given"
        )));
    };
    let parent = repo.find_commit(parent_oid)?;
    let mut update = TreeUpdateBuilder::new();
    for (path, content) in files {
        let blob = repo.blob(content.as_bytes())?;
        update.upsert(path.as_str(), blob, FileMode::Blob);
    }
    let tree_oid = update.create_updated(repo, &parent.tree()?)?;
    let tree = repo.find_tree(tree_oid)?;
    let oid = repo.commit(None, sig, sig, message, &tree, &[&parent])?;
    match old {
        Some(old) => repo.reference_matching(refname, oid, true, old, message)?,
        None => repo.reference(refname, oid, false, message)?,
    };
    Ok((old, oid))
}

/// Point `refname` at `oid` (e.g. `refs/pull/7/head`).
pub fn set_ref(repo: &Repository, refname: &str, oid: Oid, why: &str) -> Result<(), git2::Error> {
    repo.reference(refname, oid, true, why).map(|_| ())
}

pub fn is_ancestor(repo: &Repository, ancestor: Oid, of: Oid) -> bool {
    ancestor == of || repo.graph_descendant_of(of, ancestor).unwrap_or(false)
}

/// One commit as a push event describes it.
#[derive(Clone, Debug)]
pub struct PushedCommit {
    pub id: String,
    pub tree_id: String,
    pub message: String,
    pub time: Timestamp,
    pub author_name: String,
    pub author_email: String,
    pub committer_name: String,
    pub committer_email: String,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub modified: Vec<String>,
}

/// The commits reachable from `after` but not from `before`, oldest first, at most 20
/// (GitHub's cap in push payloads).
pub fn pushed_commits(
    repo: &Repository,
    before: Option<Oid>,
    after: Oid,
) -> Result<Vec<PushedCommit>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)?;
    walk.push(after)?;
    if let Some(before) = before {
        walk.hide(before)?;
    }
    let mut out = Vec::new();
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        out.push(describe_commit(repo, &commit)?);
    }
    let skip = out.len().saturating_sub(20);
    Ok(out.split_off(skip))
}

pub fn describe_commit(
    repo: &Repository,
    commit: &git2::Commit<'_>,
) -> Result<PushedCommit, git2::Error> {
    let tree = commit.tree()?;
    let parent_tree = match commit.parent(0) {
        Ok(p) => Some(p.tree()?),
        Err(_) => None,
    };
    let diff = repo.diff_tree_to_tree(parent_tree.as_ref(), Some(&tree), None)?;
    let (mut added, mut removed, mut modified) = (Vec::new(), Vec::new(), Vec::new());
    for delta in diff.deltas() {
        let path = delta
            .new_file()
            .path()
            .or_else(|| delta.old_file().path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        match delta.status() {
            git2::Delta::Added => added.push(path),
            git2::Delta::Deleted => removed.push(path),
            _ => modified.push(path),
        }
    }
    let author = commit.author();
    let committer = commit.committer();
    Ok(PushedCommit {
        id: commit.id().to_string(),
        tree_id: tree.id().to_string(),
        message: commit.message().unwrap_or_default().to_string(),
        time: Timestamp::from_millis(commit.time().seconds().max(0) as u64 * 1000),
        author_name: author.name().unwrap_or_default().to_string(),
        author_email: author.email().unwrap_or_default().to_string(),
        committer_name: committer.name().unwrap_or_default().to_string(),
        committer_email: committer.email().unwrap_or_default().to_string(),
        added,
        removed,
        modified,
    })
}
