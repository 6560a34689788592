//! Fixture repositories: a folder tree plus a `history.yaml` that says which commits,
//! tags and branches to make, turned into real git history with git2. The homelab fixture
//! is embedded so `ichor demo` works from any directory.
//!
//! Signatures and dates come from the history file, so the commit ids are the same on
//! every machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository, Signature, Time};
use serde::Deserialize;

use crate::clock::Timestamp;
use crate::git::write_tree;

#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("{0}")]
    History(String),
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    pub people: BTreeMap<String, Person>,
    pub main: Vec<CommitSpec>,
    #[serde(default)]
    pub branches: Vec<BranchSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Person {
    pub name: String,
    pub email: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitSpec {
    pub message: String,
    pub author: String,
    pub date: String,
    /// Start from the fixture's whole tree (the first commit).
    #[serde(default)]
    pub tree: bool,
    #[serde(default)]
    pub edits: Vec<Edit>,
    #[serde(default)]
    pub tag: Option<String>,
}

/// One change to a file: replace the single occurrence of `find` with `replace`, or, with
/// `content`, write the whole file (creating it).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    pub file: String,
    #[serde(default)]
    pub find: String,
    #[serde(default)]
    pub replace: String,
    #[serde(default)]
    pub content: Option<String>,
}

/// What `ichor check` is expected to say about a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    Pass,
    Warn,
    Wait,
    Fail,
    Invalid,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BranchSpec {
    pub name: String,
    /// The revision the branch starts from and is compared against (default `main`).
    #[serde(default = "main_branch")]
    pub base: String,
    pub expect: Expect,
    /// Pull request title and body, as Renovate (or a person) wrote them.
    pub title: String,
    #[serde(default)]
    pub body: String,
    pub commits: Vec<CommitSpec>,
}

fn main_branch() -> String {
    "main".into()
}

/// A fixture: its files (path → text) and its history.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub name: String,
    pub tree: BTreeMap<String, String>,
    pub history: History,
}

impl Fixture {
    pub fn parse(
        name: &str,
        tree: &[(&str, &str)],
        history_yaml: &str,
    ) -> Result<Fixture, FixtureError> {
        let history: History = crate::sim::yaml::from_str(history_yaml)
            .map_err(|e| FixtureError::History(format!("{name}/history.yaml: {e}")))?;
        Ok(Fixture {
            name: name.to_string(),
            tree: tree
                .iter()
                .map(|(p, t)| (p.to_string(), t.to_string()))
                .collect(),
            history,
        })
    }

    /// `testdata/repos/homelab`, embedded at build time.
    pub fn homelab() -> Fixture {
        const TREE: &[(&str, &str)] = &[
            (
                "README.md",
                include_str!("../../testdata/repos/homelab/tree/README.md"),
            ),
            (
                "renovate.json",
                include_str!("../../testdata/repos/homelab/tree/renovate.json"),
            ),
            (
                "clusters/homelab/release-set.yaml",
                include_str!("../../testdata/repos/homelab/tree/clusters/homelab/release-set.yaml"),
            ),
            (
                "clusters/homelab/cluster.yaml",
                include_str!("../../testdata/repos/homelab/tree/clusters/homelab/cluster.yaml"),
            ),
        ];
        // The embedded fixture is part of the binary and covered by tests; failing to parse
        // it is a build defect, not user input.
        Fixture::parse(
            "homelab",
            TREE,
            include_str!("../../testdata/repos/homelab/history.yaml"),
        )
        .unwrap_or_else(|e| panic!("embedded homelab fixture: {e}"))
    }

    /// A generated fleet: 3 control planes and `workers` workers (at most 999), one Longhorn
    /// volume per three workers with a replica on workers i, i + n and i + 2n, no
    /// maintenance window. `main` runs Talos v1.12.6 and Kubernetes v1.33.5; branch
    /// `bump/talos` moves Talos to v1.12.9, `bump/grouped` Talos to v1.12.9 and Kubernetes
    /// to v1.33.7. For the rehearsal's tests and benchmarks.
    pub fn fleet(workers: usize, max_unavailable: u32) -> Fixture {
        use std::fmt::Write as _;
        let workers = workers.clamp(1, 999);
        let mut inv = String::new();
        for i in 1..=3 {
            let _ = writeln!(
                inv,
                "      - {{name: cp-{i}, role: controlplane, address: 10.0.10.{}}}",
                10 + i
            );
        }
        let volumes = workers.div_ceil(3);
        for i in 0..workers {
            let _ = writeln!(
                inv,
                "      - {{name: w-{i:03}, role: worker, address: 10.0.{}.{}, volumes: [pvc-{:03}]}}",
                11 + i / 200,
                1 + i % 200,
                i % volumes
            );
        }
        let cluster = format!(
            "apiVersion: ichor.dev/v1alpha1
kind: Cluster
metadata:
  name: fleet
spec:
  talos:
    endpoints: [10.0.10.11, 10.0.10.12, 10.0.10.13]
    installerImage: factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba
  cni:
    handover:
      mode: automatic
      argocdApplication: {{name: cilium, namespace: argocd}}
    replacesKubeProxy: true
  rollout:
    maxUnavailable: {max_unavailable}
    drainTimeout: 15m
    nodeTimeout: 45m
    # The twin's `web` Deployment keeps scratch data in an emptyDir, as a cache would.
    drain: {{deleteEmptyDirData: true}}
  volumes:
    provider: longhorn
  inventory:
    nodes:
{inv}"
        );
        const RELEASE_SET: &str = "apiVersion: ichor.dev/v1alpha1
kind: ReleaseSet
metadata:
  name: fleet
spec:
  talos: v1.12.6
  kubernetes: v1.33.5
  cni: {name: cilium, version: 1.18.3}
  addons:
    - {name: cert-manager, version: v1.20.2}
    - {name: longhorn, version: v1.10.3}
";
        const HISTORY: &str = "people:
  me: {name: Fleet, email: fleet@example.com}
main:
  - {message: the cluster, author: me, date: \"2026-01-01T00:00:00Z\", tree: true}
branches:
  - name: bump/talos
    expect: pass
    title: talos
    commits:
      - message: talos v1.12.9
        author: me
        date: \"2026-01-02T00:00:00Z\"
        edits:
          - {file: clusters/fleet/release-set.yaml, find: \"talos: v1.12.6\", replace: \"talos: v1.12.9\"}
  - name: bump/grouped
    expect: pass
    title: grouped
    commits:
      - message: talos v1.12.9, kubernetes v1.33.7
        author: me
        date: \"2026-01-02T00:00:00Z\"
        edits:
          - {file: clusters/fleet/release-set.yaml, find: \"talos: v1.12.6\", replace: \"talos: v1.12.9\"}
          - {file: clusters/fleet/release-set.yaml, find: \"kubernetes: v1.33.5\", replace: \"kubernetes: v1.33.7\"}
";
        let tree = [
            ("clusters/fleet/cluster.yaml", cluster.as_str()),
            ("clusters/fleet/release-set.yaml", RELEASE_SET),
        ];
        // Generated here from constants: failing to parse it is a defect of this function.
        Fixture::parse("fleet", &tree, HISTORY)
            .unwrap_or_else(|e| panic!("generated fleet fixture: {e}"))
    }

    /// Write the history into a new (non-bare) repository at `dest`, with `main` checked out.
    pub fn build(&self, dest: &Path) -> Result<Repository, FixtureError> {
        // Writing history over an existing repository would fail half-way with a git error
        // (or worse, mix two histories): refuse up front.
        if std::fs::read_dir(dest).is_ok_and(|mut d| d.next().is_some()) {
            return Err(FixtureError::Io {
                path: dest.to_path_buf(),
                message: "already exists and is not empty; choose a new directory or remove it"
                    .into(),
            });
        }
        let mut opts = git2::RepositoryInitOptions::new();
        opts.initial_head("main");
        let repo = Repository::init_opts(dest, &opts)?;
        let mut files = BTreeMap::new();
        let mut parent = None;
        for c in &self.history.main {
            if c.tree {
                files = self.tree.clone();
            }
            let oid = self.commit(&repo, &mut files, c, parent, Some("refs/heads/main"))?;
            if let Some(tag) = &c.tag {
                repo.tag_lightweight(tag, &repo.find_object(oid, None)?, false)?;
            }
            parent = Some(oid);
        }
        for b in &self.history.branches {
            let base = repo
                .revparse_single(&b.base)
                .and_then(|o| o.peel_to_commit())
                .map_err(|_| {
                    FixtureError::History(format!("branch {}: unknown base `{}`", b.name, b.base))
                })?;
            let mut files = snapshot(&repo, &base.tree()?)?;
            let mut parent = Some(base.id());
            for c in &b.commits {
                parent = Some(self.commit(&repo, &mut files, c, parent, None)?);
            }
            if let Some(head) = parent {
                repo.reference(
                    &format!("refs/heads/{}", b.name),
                    head,
                    true,
                    "fixture branch",
                )?;
            }
        }
        repo.set_head("refs/heads/main")?;
        repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))?;
        Ok(repo)
    }

    fn commit(
        &self,
        repo: &Repository,
        files: &mut BTreeMap<String, String>,
        c: &CommitSpec,
        parent: Option<Oid>,
        refname: Option<&str>,
    ) -> Result<Oid, FixtureError> {
        for e in &c.edits {
            if let Some(content) = &e.content {
                files.insert(e.file.clone(), content.clone());
                continue;
            }
            let text = files.get_mut(&e.file).ok_or_else(|| {
                FixtureError::History(format!("commit {:?}: no file {}", c.message, e.file))
            })?;
            let n = text.matches(&e.find).count();
            if n != 1 {
                return Err(FixtureError::History(format!(
                    "commit {:?}: `{}` occurs {n} times in {} (expected once)",
                    c.message,
                    e.find.escape_debug(),
                    e.file
                )));
            }
            *text = text.replacen(&e.find, &e.replace, 1);
        }
        let person = self.history.people.get(&c.author).ok_or_else(|| {
            FixtureError::History(format!(
                "commit {:?}: unknown author `{}`",
                c.message, c.author
            ))
        })?;
        let when = Timestamp::parse_rfc3339(&c.date).ok_or_else(|| {
            FixtureError::History(format!(
                "commit {:?}: date `{}` is not YYYY-MM-DDTHH:MM:SSZ",
                c.message, c.date
            ))
        })?;
        let sig = Signature::new(
            &person.name,
            &person.email,
            &Time::new((when.as_millis() / 1000) as i64, 0),
        )?;
        let tree = write_tree(repo, files)?;
        let parents: Vec<git2::Commit> = parent
            .map(|p| repo.find_commit(p))
            .transpose()?
            .into_iter()
            .collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        Ok(repo.commit(
            refname,
            &sig,
            &sig,
            &c.message,
            &repo.find_tree(tree)?,
            &refs,
        )?)
    }
}

fn snapshot(
    repo: &Repository,
    tree: &git2::Tree,
) -> Result<BTreeMap<String, String>, FixtureError> {
    let mut files = BTreeMap::new();
    let mut err = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(git2::ObjectType::Blob) {
            match (entry.name(), repo.find_blob(entry.id())) {
                (Ok(name), Ok(blob)) => {
                    files.insert(
                        format!("{dir}{name}"),
                        String::from_utf8_lossy(blob.content()).into_owned(),
                    );
                }
                (_, Err(e)) => err = Some(e),
                _ => {}
            }
        }
        git2::TreeWalkResult::Ok
    })?;
    match err {
        Some(e) => Err(e.into()),
        None => Ok(files),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homelab_builds_with_stable_ids_and_every_branch() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let ra = Fixture::homelab().build(a.path()).unwrap();
        let rb = Fixture::homelab().build(b.path()).unwrap();
        let main_a = ra.revparse_single("main").unwrap().id();
        assert_eq!(
            main_a,
            rb.revparse_single("main").unwrap().id(),
            "commit ids are reproducible"
        );
        for br in &Fixture::homelab().history.branches {
            assert!(ra.revparse_single(&br.name).is_ok(), "{}", br.name);
        }
        assert!(
            a.path().join("clusters/homelab/release-set.yaml").exists(),
            "main is checked out"
        );
        assert!(ra.revparse_single("homelab-2026-03").is_ok());
    }

    #[test]
    fn an_edit_that_does_not_match_once_is_an_error() {
        let mut f = Fixture::homelab();
        f.history.main[1].edits[0].find = "no such text".into();
        let d = tempfile::tempdir().unwrap();
        let e = f.build(d.path()).err().unwrap();
        assert!(e.to_string().contains("occurs 0 times"), "{e}");
    }
}
