//! Git, through git2: open or clone a repository, resolve revisions, and read the cluster
//! documents and policy files at any revision straight from the object database (no
//! checkout, no history walk: reading a revision touches only its tree).

use std::path::{Path, PathBuf};

use git2::{ObjectType, Oid, Repository, TreeWalkMode, TreeWalkResult};

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot open git repository at {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error("cannot clone {url} into {dest}: {message}")]
    Clone {
        url: String,
        dest: PathBuf,
        message: String,
    },
    #[error(
        "unknown revision `{rev}`: not a branch, tag, remote branch or commit in this repository"
    )]
    UnknownRevision { rev: String },
    #[error("{path} at {rev} is not valid UTF-8 text")]
    NotText { path: String, rev: String },
    #[error("git: {0}")]
    Git(#[from] git2::Error),
}

/// A resolved revision: what the user typed and the commit it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rev {
    pub name: String,
    pub commit: Oid,
}

impl Rev {
    pub fn short(&self) -> String {
        self.commit.to_string()[..10].to_string()
    }
}

impl std::fmt::Display for Rev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name.starts_with(&self.short()) || self.commit.to_string() == self.name {
            write!(f, "{}", self.short())
        } else {
            write!(f, "{} ({})", self.name, self.short())
        }
    }
}

pub struct Repo {
    repo: Repository,
}

impl std::fmt::Debug for Repo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repo")
            .field("path", &self.repo.path())
            .finish()
    }
}

impl Repo {
    /// Open a repository, bare or with a work tree, at `path` (or a parent of it).
    pub fn open(path: &Path) -> Result<Repo, GitError> {
        Repository::open(path)
            .or_else(|_| Repository::discover(path))
            .map(|repo| Repo { repo })
            .map_err(|e| GitError::Open {
                path: path.to_path_buf(),
                message: e.message().to_string(),
            })
    }

    /// Clone `url` into `dest` as a bare mirror of its branches and tags. Local paths and
    /// `file://` URLs work everywhere; network transports come with the controller.
    pub fn clone_bare(url: &str, dest: &Path) -> Result<Repo, GitError> {
        git2::build::RepoBuilder::new()
            .bare(true)
            .clone(url, dest)
            .map(|repo| Repo { repo })
            .map_err(|e| GitError::Clone {
                url: url.to_string(),
                dest: dest.to_path_buf(),
                message: e.message().to_string(),
            })
    }

    pub fn git2(&self) -> &Repository {
        &self.repo
    }

    /// Resolve a branch name, tag, remote branch (`origin/x` or just `x` when only the
    /// remote has it) or (abbreviated) SHA to a commit.
    pub fn resolve(&self, rev: &str) -> Result<Rev, GitError> {
        let candidates = [
            rev.to_string(),
            format!("refs/heads/{rev}"),
            format!("refs/tags/{rev}"),
            format!("refs/remotes/origin/{rev}"),
        ];
        for c in &candidates {
            if let Ok(obj) = self.repo.revparse_single(c) {
                if let Ok(commit) = obj.peel_to_commit() {
                    return Ok(Rev {
                        name: rev.to_string(),
                        commit: commit.id(),
                    });
                }
            }
        }
        Err(GitError::UnknownRevision {
            rev: rev.to_string(),
        })
    }

    fn tree(&self, rev: &Rev) -> Result<git2::Tree<'_>, GitError> {
        Ok(self.repo.find_commit(rev.commit)?.tree()?)
    }

    /// The text of `path` at `rev`, or `None` when the file does not exist there.
    pub fn read_file(&self, rev: &Rev, path: &str) -> Result<Option<String>, GitError> {
        let tree = self.tree(rev)?;
        let entry = match tree.get_path(Path::new(path)) {
            Ok(e) => e,
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if entry.kind() != Some(ObjectType::Blob) {
            return Ok(None);
        }
        let blob = self.repo.find_blob(entry.id())?;
        String::from_utf8(blob.content().to_vec())
            .map(Some)
            .map_err(|_| GitError::NotText {
                path: path.to_string(),
                rev: rev.to_string(),
            })
    }

    /// The folder `path` at `rev`, or `None` when there is none.
    fn subtree(&self, rev: &Rev, path: &str) -> Result<Option<git2::Tree<'_>>, GitError> {
        match self.tree(rev)?.get_path(Path::new(path)) {
            Ok(e) if e.kind() == Some(ObjectType::Tree) => Ok(Some(self.repo.find_tree(e.id())?)),
            Ok(_) => Ok(None),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Cluster names at `rev`: folders `clusters/<name>/` that hold a `release-set.yaml`.
    pub fn clusters(&self, rev: &Rev) -> Result<Vec<String>, GitError> {
        let Some(clusters) = self.subtree(rev, "clusters")? else {
            return Ok(vec![]);
        };
        let mut names = Vec::new();
        for entry in clusters.iter() {
            if entry.kind() != Some(ObjectType::Tree) {
                continue;
            }
            let sub = self.repo.find_tree(entry.id())?;
            if sub.get_name("release-set.yaml").is_some() {
                if let Ok(name) = entry.name() {
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Every `policies/**/*.yaml` (or `.yml`) at `rev` as (path, text), in path order.
    pub fn policy_files(&self, rev: &Rev) -> Result<Vec<(String, String)>, GitError> {
        let Some(policies) = self.subtree(rev, "policies")? else {
            return Ok(vec![]);
        };
        let mut paths = Vec::new();
        policies.walk(TreeWalkMode::PreOrder, |dir, entry| {
            if let (Some(ObjectType::Blob), Ok(name)) = (entry.kind(), entry.name()) {
                if name.ends_with(".yaml") || name.ends_with(".yml") {
                    paths.push((format!("policies/{dir}{name}"), entry.id()));
                }
            }
            TreeWalkResult::Ok
        })?;
        paths.sort();
        let mut out = Vec::new();
        for (path, id) in paths {
            let blob = self.repo.find_blob(id)?;
            let text =
                String::from_utf8(blob.content().to_vec()).map_err(|_| GitError::NotText {
                    path: path.clone(),
                    rev: rev.to_string(),
                })?;
            out.push((path, text));
        }
        Ok(out)
    }
}

/// Write `files` (path → text) as a tree object, without a work tree or index on disk.
/// Fixtures and benchmarks build history with it.
pub fn write_tree(
    repo: &Repository,
    files: &std::collections::BTreeMap<String, String>,
) -> Result<Oid, git2::Error> {
    let mut index = git2::Index::new()?;
    for (path, text) in files {
        let id = repo.blob(text.as_bytes())?;
        index.add(&git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            file_size: text.len() as u32,
            id,
            flags: 0,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        })?;
    }
    index.write_tree_to(repo)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(
        repo: &Repository,
        files: &[(&str, &str)],
        parent: Option<Oid>,
        refname: &str,
    ) -> Oid {
        let files: std::collections::BTreeMap<String, String> = files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect();
        let tree = repo.find_tree(write_tree(repo, &files).unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let parents: Vec<git2::Commit> = parent
            .iter()
            .map(|p| repo.find_commit(*p).unwrap())
            .collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(Some(refname), &sig, &sig, "m", &tree, &refs)
            .unwrap()
    }

    #[test]
    fn reads_files_clusters_and_policies_at_a_revision() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let c1 = commit(
            &repo,
            &[
                ("clusters/a/release-set.yaml", "one"),
                ("clusters/b/cluster.yaml", "no release set here"),
                ("policies/z.yaml", "z"),
                ("policies/sub/a.yml", "a"),
                ("policies/readme.md", "not policy"),
            ],
            None,
            "refs/heads/main",
        );
        commit(
            &repo,
            &[("clusters/a/release-set.yaml", "two")],
            Some(c1),
            "refs/heads/renovate/x",
        );
        repo.tag_lightweight("v1", &repo.find_object(c1, None).unwrap(), false)
            .unwrap();

        let r = Repo::open(dir.path()).unwrap();
        let main = r.resolve("main").unwrap();
        let branch = r.resolve("renovate/x").unwrap();
        assert_eq!(
            r.read_file(&main, "clusters/a/release-set.yaml")
                .unwrap()
                .as_deref(),
            Some("one")
        );
        assert_eq!(
            r.read_file(&branch, "clusters/a/release-set.yaml")
                .unwrap()
                .as_deref(),
            Some("two")
        );
        assert_eq!(r.read_file(&main, "missing.yaml").unwrap(), None);
        assert_eq!(r.clusters(&main).unwrap(), vec!["a"]);
        let policies: Vec<String> = r
            .policy_files(&main)
            .unwrap()
            .into_iter()
            .map(|p| p.0)
            .collect();
        assert_eq!(policies, vec!["policies/sub/a.yml", "policies/z.yaml"]);
        assert_eq!(r.resolve("v1").unwrap().commit, c1);
        assert_eq!(r.resolve(&c1.to_string()[..8]).unwrap().commit, c1);
        assert!(matches!(
            r.resolve("nope"),
            Err(GitError::UnknownRevision { .. })
        ));
    }

    #[test]
    fn clone_and_remote_branches_resolve() {
        let src = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(src.path()).unwrap();
        let c1 = commit(
            &repo,
            &[("clusters/a/release-set.yaml", "one")],
            None,
            "refs/heads/main",
        );
        repo.set_head("refs/heads/main").unwrap();
        let dest = tempfile::tempdir().unwrap();
        let cloned =
            Repo::clone_bare(&src.path().to_string_lossy(), &dest.path().join("mirror")).unwrap();
        assert_eq!(cloned.resolve("main").unwrap().commit, c1);
        assert!(Repo::open(&dest.path().join("nothing-here")).is_err());
    }
}
