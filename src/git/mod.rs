//! Git, through git2: open or clone a repository, resolve revisions, and read the cluster
//! documents and policy files at any revision straight from the object database (no
//! checkout, no history walk: reading a revision touches only its tree). The working tree
//! can stand in for a revision (`.`), so uncommitted edits can be gated; it is read from
//! disk without following symbolic links.

pub mod notes;
pub mod remote;
pub mod watch;

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
    #[error("{path} at {rev} is {what}, not a file; ichor reads only regular files (a link could point anywhere)")]
    NotAFile {
        path: String,
        rev: String,
        what: &'static str,
    },
    #[error(
        "{path} at {rev} is {size} bytes; ichor reads files of at most {MAX_FILE_BYTES} bytes"
    )]
    TooLarge {
        path: String,
        rev: String,
        size: u64,
    },
    #[error("{rev} has {count} files under policies/; ichor reads at most {MAX_POLICY_FILES}")]
    TooManyPolicyFiles { rev: String, count: usize },
    #[error("--head .: {path} has no working tree (a bare repository); name a revision instead")]
    NoWorkTree { path: PathBuf },
    #[error("cannot read {path} in the working tree: {message}")]
    WorkTree { path: String, message: String },
    #[error("ichor will not write this note record: {message}")]
    BadNoteRecord { message: String },
    #[error("a notes tree annotates {count} objects or more; ichor merges at most {} (refs/notes/ichor should hold one note per PR head and merge commit)", notes::MAX_NOTED_OBJECTS)]
    TooManyNotes { count: usize },
    #[error("{place}: {refname} points at a {kind}, not a commit; git keeps notes and commands only in commits, so ichor leaves it alone and its records stay in its own copy until the ref is a commit again or deleted (git push <remote> :{refname})")]
    RefNotACommit {
        place: String,
        refname: String,
        kind: String,
    },
    #[error("cannot {action} ichor's notes at {url}: {message}")]
    NotesRemote {
        url: String,
        action: &'static str,
        message: String,
    },
    #[error("{url} refused ichor's notes {attempts} times, each after fetching and merging its notes (other writers keep racing, or a hook refuses); last: {message}")]
    NotesPushRejected {
        url: String,
        attempts: u32,
        message: String,
    },
    #[error("cannot fetch from {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("cannot fetch {what} from {url}: it sends more than {max_bytes} bytes, ichor's bound")]
    FetchTooLarge {
        url: String,
        what: String,
        max_bytes: u64,
    },
    #[error("cannot push to {url}: {message}")]
    Push { url: String, message: String },
    #[error("{path} has more than {max} refs; ichor reads at most that many")]
    TooManyRefs { path: PathBuf, max: usize },
    #[error("cannot watch {path} for ref moves: {message}")]
    Watch { path: PathBuf, message: String },
    #[error("git: {0}")]
    Git(#[from] git2::Error),
}

/// The largest file ichor reads from a revision (the documents' own bound).
pub const MAX_FILE_BYTES: u64 = crate::releaseset::yaml::MAX_DOCUMENT_BYTES as u64;
/// The most files ichor reads under `policies/`.
pub const MAX_POLICY_FILES: usize = 256;
/// What `--head` (or `--base`) says to mean the working tree. `.` is never a ref name.
pub const WORK_TREE: &str = ".";

/// A resolved revision: what the user typed and the commit it names, or the working tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rev {
    pub name: String,
    /// `None` for the working tree.
    pub commit: Option<Oid>,
}

impl Rev {
    pub fn short(&self) -> String {
        match self.commit {
            Some(c) => c.to_string()[..10].to_string(),
            None => "working tree".to_string(),
        }
    }

    pub fn is_work_tree(&self) -> bool {
        self.commit.is_none()
    }
}

impl std::fmt::Display for Rev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.commit {
            None => f.write_str("the working tree"),
            Some(c) if self.name.starts_with(&self.short()) || c.to_string() == self.name => {
                write!(f, "{}", self.short())
            }
            Some(_) => write!(f, "{} ({})", self.name, self.short()),
        }
    }
}

/// What a tree entry is, when it is not a regular file.
fn not_a_file(entry: &git2::TreeEntry) -> Option<&'static str> {
    match entry.kind() {
        Some(ObjectType::Blob) if entry.filemode() == 0o120000 => Some("a symbolic link"),
        Some(ObjectType::Blob) => None,
        Some(ObjectType::Tree) => Some("a directory"),
        Some(ObjectType::Commit) => Some("a submodule"),
        _ => Some("not a file"),
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
    /// remote has it) or (abbreviated) SHA to a commit; `.` is the working tree.
    pub fn resolve(&self, rev: &str) -> Result<Rev, GitError> {
        if rev == WORK_TREE {
            if self.repo.workdir().is_none() {
                return Err(GitError::NoWorkTree {
                    path: self.repo.path().to_path_buf(),
                });
            }
            return Ok(Rev {
                name: rev.to_string(),
                commit: None,
            });
        }
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
                        commit: Some(commit.id()),
                    });
                }
            }
        }
        Err(GitError::UnknownRevision {
            rev: rev.to_string(),
        })
    }

    fn tree(&self, commit: Oid) -> Result<git2::Tree<'_>, GitError> {
        Ok(self.repo.find_commit(commit)?.tree()?)
    }

    /// The text of `path` at `rev`, or `None` when the file does not exist there. A path that
    /// is a link, a directory or a submodule is an error that says so.
    pub fn read_file(&self, rev: &Rev, path: &str) -> Result<Option<String>, GitError> {
        let Some(commit) = rev.commit else {
            return self.read_work_tree_file(rev, path);
        };
        let tree = self.tree(commit)?;
        let entry = match tree.get_path(Path::new(path)) {
            Ok(e) => e,
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if let Some(what) = not_a_file(&entry) {
            return Err(GitError::NotAFile {
                path: path.to_string(),
                rev: rev.to_string(),
                what,
            });
        }
        self.read_blob(rev, path, entry.id()).map(Some)
    }

    /// A blob as text, refusing one over the size bound before loading it.
    fn read_blob(&self, rev: &Rev, path: &str, id: Oid) -> Result<String, GitError> {
        let (size, _) = self.repo.odb()?.read_header(id)?;
        if size as u64 > MAX_FILE_BYTES {
            return Err(GitError::TooLarge {
                path: path.to_string(),
                rev: rev.to_string(),
                size: size as u64,
            });
        }
        let blob = self.repo.find_blob(id)?;
        String::from_utf8(blob.content().to_vec()).map_err(|_| GitError::NotText {
            path: path.to_string(),
            rev: rev.to_string(),
        })
    }

    fn work_tree(&self) -> Result<&Path, GitError> {
        self.repo.workdir().ok_or_else(|| GitError::NoWorkTree {
            path: self.repo.path().to_path_buf(),
        })
    }

    /// A file of the working tree, read the way a tree entry is: links are refused, not
    /// followed (a PR branch checked out locally could point one at a secret).
    fn read_work_tree_file(&self, rev: &Rev, path: &str) -> Result<Option<String>, GitError> {
        let full = self.work_tree()?.join(path);
        let io = |e: std::io::Error| GitError::WorkTree {
            path: path.to_string(),
            message: e.to_string(),
        };
        // Every component, so a linked folder cannot lead outside the tree either.
        let mut at = self.work_tree()?.to_path_buf();
        for part in Path::new(path).components() {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(GitError::NotAFile {
                        path: path.to_string(),
                        rev: rev.to_string(),
                        what: "a symbolic link (or inside one)",
                    })
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Ok(None),
                Err(e) => return Err(io(e)),
            }
        }
        let meta = std::fs::symlink_metadata(&full).map_err(io)?;
        if meta.is_dir() {
            return Err(GitError::NotAFile {
                path: path.to_string(),
                rev: rev.to_string(),
                what: "a directory",
            });
        }
        if !meta.is_file() {
            return Err(GitError::NotAFile {
                path: path.to_string(),
                rev: rev.to_string(),
                what: "not a regular file",
            });
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(GitError::TooLarge {
                path: path.to_string(),
                rev: rev.to_string(),
                size: meta.len(),
            });
        }
        let bytes = std::fs::read(&full).map_err(io)?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| GitError::NotText {
                path: path.to_string(),
                rev: rev.to_string(),
            })
    }

    /// The folder `path` at a commit, or `None` when there is none.
    fn subtree(&self, commit: Oid, path: &str) -> Result<Option<git2::Tree<'_>>, GitError> {
        match self.tree(commit)?.get_path(Path::new(path)) {
            Ok(e) if e.kind() == Some(ObjectType::Tree) => Ok(Some(self.repo.find_tree(e.id())?)),
            Ok(_) => Ok(None),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Cluster names at `rev`: folders `clusters/<name>/` that hold a `release-set.yaml`
    /// (whatever it is: reading it says when it is not a file).
    pub fn clusters(&self, rev: &Rev) -> Result<Vec<String>, GitError> {
        let mut names = Vec::new();
        match rev.commit {
            Some(commit) => {
                let Some(clusters) = self.subtree(commit, "clusters")? else {
                    return Ok(vec![]);
                };
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
            }
            None => {
                let dir = self.work_tree()?.join("clusters");
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    return Ok(vec![]);
                };
                for entry in entries.flatten() {
                    let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                    let has_rs =
                        std::fs::symlink_metadata(entry.path().join("release-set.yaml")).is_ok();
                    if let (true, true, Some(name)) = (is_dir, has_rs, entry.file_name().to_str()) {
                        names.push(name.to_string());
                    }
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Every `policies/**/*.yaml` (or `.yml`) at `rev` as (path, text), in path order.
    pub fn policy_files(&self, rev: &Rev) -> Result<Vec<(String, String)>, GitError> {
        let paths = match rev.commit {
            Some(commit) => {
                let Some(policies) = self.subtree(commit, "policies")? else {
                    return Ok(vec![]);
                };
                let mut paths = Vec::new();
                policies.walk(TreeWalkMode::PreOrder, |dir, entry| {
                    if let (Some(ObjectType::Blob), Ok(name)) = (entry.kind(), entry.name()) {
                        if name.ends_with(".yaml") || name.ends_with(".yml") {
                            paths.push(format!("policies/{dir}{name}"));
                        }
                    }
                    TreeWalkResult::Ok
                })?;
                paths
            }
            None => {
                let mut paths = Vec::new();
                let root = self.work_tree()?.to_path_buf();
                let mut dirs = vec![root.join("policies")];
                while let Some(dir) = dirs.pop() {
                    let Ok(entries) = std::fs::read_dir(&dir) else {
                        continue;
                    };
                    for entry in entries.flatten() {
                        let path = entry.path();
                        let Ok(rel) = path.strip_prefix(&root) else {
                            continue;
                        };
                        let Some(rel) = rel.to_str() else { continue };
                        match entry.file_type() {
                            Ok(t) if t.is_dir() => dirs.push(path.clone()),
                            // Links and files alike: reading refuses a link with its reason.
                            Ok(_) if rel.ends_with(".yaml") || rel.ends_with(".yml") => {
                                paths.push(rel.to_string())
                            }
                            _ => {}
                        }
                    }
                    if paths.len() > MAX_POLICY_FILES {
                        break;
                    }
                }
                paths
            }
        };
        if paths.len() > MAX_POLICY_FILES {
            return Err(GitError::TooManyPolicyFiles {
                rev: rev.to_string(),
                count: paths.len(),
            });
        }
        let mut paths = paths;
        paths.sort();
        let mut out = Vec::new();
        for path in paths {
            if let Some(text) = self.read_file(rev, &path)? {
                out.push((path, text));
            }
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
        assert_eq!(r.resolve("v1").unwrap().commit, Some(c1));
        assert_eq!(r.resolve(&c1.to_string()[..8]).unwrap().commit, Some(c1));
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
        assert_eq!(cloned.resolve("main").unwrap().commit, Some(c1));
        assert!(Repo::open(&dest.path().join("nothing-here")).is_err());
    }
}
