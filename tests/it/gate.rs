//! The gate on hostile and unusual changes, each in a real git repository built here: a PR
//! that rewrites its own judge, clusters added and removed, policy-only changes, files that
//! are not files, the working tree as head, and `plan` of a blocked change.

use std::collections::BTreeMap;
use std::path::Path;

use git2::{Oid, Repository, Signature};
use serde_json::Value;

use crate::{homelab, ichor, stderr, stdout};

const RS: &str = "apiVersion: ichor.dev/v1alpha1
kind: ReleaseSet
metadata:
  name: home
spec:
  talos: v1.12.6
  kubernetes: v1.33.5
  cni:
    name: cilium
    version: 1.18.3
";

const CLUSTER: &str = "apiVersion: ichor.dev/v1alpha1
kind: Cluster
metadata:
  name: home
spec:
  inventory:
    nodes:
      - name: cp-1
        role: controlplane
      - name: w-1
        role: worker
";

/// A file in a test tree: its bytes and git mode.
struct Entry {
    bytes: Vec<u8>,
    mode: u32,
    /// For a submodule (mode 0o160000): the commit it points at.
    gitlink: Option<Oid>,
}

fn file(text: &str) -> Entry {
    Entry {
        bytes: text.as_bytes().to_vec(),
        mode: 0o100644,
        gitlink: None,
    }
}

/// A repository with `main` and branches, written as real commits.
struct TestRepo {
    dir: tempfile::TempDir,
    repo: Repository,
    main: Oid,
}

impl TestRepo {
    fn new(files: Vec<(&str, Entry)>) -> TestRepo {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init(dir.path()).expect("init");
        let tree = write(&repo, files);
        let main = commit(&repo, tree, None, "refs/heads/main");
        repo.set_head("refs/heads/main").expect("head");
        TestRepo { dir, repo, main }
    }

    /// A branch from main whose tree is main's with `files` set (None removes the path).
    fn branch(&self, name: &str, files: Vec<(&str, Option<Entry>)>) {
        let mut all = tree_entries(&self.repo, self.main);
        for (path, e) in files {
            match e {
                Some(e) => all.insert(path.to_string(), e),
                None => all.remove(path),
            };
        }
        let tree = write(&self.repo, all.into_iter().collect::<Vec<_>>());
        commit(
            &self.repo,
            tree,
            Some(self.main),
            &format!("refs/heads/{name}"),
        );
    }

    fn path(&self) -> String {
        self.dir.path().to_string_lossy().into_owned()
    }

    fn check(&self, head: &str, extra: &[&str]) -> std::process::Output {
        let repo = self.path();
        let mut args = vec!["check", "--repo", &repo, "--base", "main", "--head", head];
        args.extend_from_slice(extra);
        ichor(&args)
    }
}

fn write<P: AsRef<str>>(repo: &Repository, files: Vec<(P, Entry)>) -> Oid {
    let mut index = git2::Index::new().expect("index");
    for (path, e) in files {
        let id = match e.gitlink {
            Some(c) => c,
            None => repo.blob(&e.bytes).expect("blob"),
        };
        index
            .add(&git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: e.mode,
                uid: 0,
                gid: 0,
                file_size: e.bytes.len() as u32,
                id,
                flags: 0,
                flags_extended: 0,
                path: path.as_ref().as_bytes().to_vec(),
            })
            .expect("add");
    }
    index.write_tree_to(repo).expect("tree")
}

fn tree_entries(repo: &Repository, commit: Oid) -> BTreeMap<String, Entry> {
    let tree = repo
        .find_commit(commit)
        .and_then(|c| c.tree())
        .expect("tree");
    let mut out = BTreeMap::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(git2::ObjectType::Blob) {
            let blob = repo.find_blob(entry.id()).expect("blob");
            out.insert(
                format!("{dir}{}", entry.name().unwrap_or("")),
                Entry {
                    bytes: blob.content().to_vec(),
                    mode: entry.filemode() as u32,
                    gitlink: None,
                },
            );
        }
        git2::TreeWalkResult::Ok
    })
    .expect("walk");
    out
}

fn commit(repo: &Repository, tree: Oid, parent: Option<Oid>, refname: &str) -> Oid {
    let sig =
        Signature::new("t", "t@example.com", &git2::Time::new(1_700_000_000, 0)).expect("sig");
    let tree = repo.find_tree(tree).expect("tree");
    let parents: Vec<git2::Commit> = parent
        .iter()
        .map(|p| repo.find_commit(*p).expect("parent"))
        .collect();
    let refs: Vec<&git2::Commit> = parents.iter().collect();
    repo.commit(Some(refname), &sig, &sig, "m", &tree, &refs)
        .expect("commit")
}

fn home() -> TestRepo {
    TestRepo::new(vec![
        ("clusters/home/release-set.yaml", file(RS)),
        ("clusters/home/cluster.yaml", file(CLUSTER)),
    ])
}

fn report(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("json: {e}\n{}{}", stdout(o), stderr(o)))
}

fn section<'a>(v: &'a Value, cluster: &str) -> &'a Value {
    v["clusters"]
        .as_array()
        .and_then(|c| c.iter().find(|s| s["cluster"] == cluster))
        .unwrap_or_else(|| panic!("no section {cluster} in {v:#}"))
}

fn item<'a>(section: &'a Value, id: &str) -> &'a Value {
    section["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["id"] == id))
        .unwrap_or_else(|| panic!("no item {id} in {section:#}"))
}

fn has_item(section: &Value, id: &str) -> bool {
    section["items"]
        .as_array()
        .is_some_and(|items| items.iter().any(|i| i["id"] == id))
}

#[test]
fn a_pr_cannot_rewrite_the_inventory_it_is_judged_by() {
    // The base inventory leaves w-1's kubelet far behind, so the bump fails on it; the PR
    // also "fixes" the inventory.
    let lagging = format!("{CLUSTER}        kubelet: v1.30.0\n");
    let r = TestRepo::new(vec![
        ("clusters/home/release-set.yaml", file(RS)),
        ("clusters/home/cluster.yaml", file(&lagging)),
    ]);
    r.branch(
        "sneaky",
        vec![
            (
                "clusters/home/release-set.yaml",
                Some(file(&RS.replace("v1.33.5", "v1.33.7"))),
            ),
            ("clusters/home/cluster.yaml", Some(file(CLUSTER))),
        ],
    );
    let o = r.check("sneaky", &["--output", "json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let v = report(&o);
    let s = section(&v, "home");
    assert_eq!(item(s, "kubelet-skew")["status"], "fail", "{s:#}");
    let edit = item(s, "cluster-settings");
    assert_eq!(edit["status"], "warn");
    assert!(
        edit["message"]
            .as_str()
            .unwrap_or("")
            .contains("spec.inventory"),
        "{edit}"
    );
    // The plan follows the base inventory too: w-1 is still there.
    let o = ichor(&[
        "plan",
        "--repo",
        &r.path(),
        "--base",
        "main",
        "--head",
        "sneaky",
        "--allow-blocked",
        "--output",
        "json",
    ]);
    let plan = report(&o);
    assert_eq!(plan["plans"][0]["gate"], "blocked", "{plan:#}");
    assert_eq!(plan["plans"][0]["workers"], 1, "{plan:#}");
}

#[test]
fn a_new_cluster_is_judged_on_its_own_and_a_removed_one_is_reported() {
    let r = home();
    let prod = RS
        .replace("name: home", "name: prod")
        .replace("v1.33.5", "v1.34.2");
    r.branch(
        "add-prod",
        vec![("clusters/prod/release-set.yaml", Some(file(&prod)))],
    );
    let o = r.check("add-prod", &["--output", "json"]);
    let v = report(&o);
    let s = section(&v, "prod");
    assert_eq!(
        v["clusters"].as_array().map(Vec::len),
        Some(1),
        "home untouched"
    );
    assert_eq!(item(s, "new-cluster")["status"], "pass");
    // Judged on its own: Kubernetes 1.34 needs cilium >= 1.19.
    assert_eq!(item(s, "cni")["status"], "fail", "{s:#}");
    assert_eq!(o.status.code(), Some(1));

    r.branch(
        "drop-home",
        vec![
            ("clusters/home/release-set.yaml", None),
            ("clusters/home/cluster.yaml", None),
        ],
    );
    let o = r.check("drop-home", &["--output", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = report(&o);
    assert_eq!(
        item(section(&v, "home"), "cluster-removed")["status"],
        "warn"
    );
}

#[test]
fn several_clusters_are_judged_in_one_run_and_the_worst_decides() {
    let r = TestRepo::new(vec![
        (
            "clusters/a/release-set.yaml",
            file(&RS.replace("home", "a")),
        ),
        (
            "clusters/b/release-set.yaml",
            file(&RS.replace("home", "b")),
        ),
    ]);
    r.branch(
        "both",
        vec![
            (
                "clusters/a/release-set.yaml",
                Some(file(&RS.replace("home", "a").replace("1.18.3", "1.18.6"))),
            ),
            (
                "clusters/b/release-set.yaml",
                Some(file(&RS.replace("home", "b").replace("v1.33.5", "v1.35.0"))),
            ),
        ],
    );
    let o = r.check("both", &[]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(
        out.contains("cluster a:") && out.contains("cluster b:"),
        "{out}"
    );
    assert!(
        out.contains("overall: BLOCKED (2 sections, exit 1)"),
        "{out}"
    );
}

#[test]
fn a_policy_only_change_is_judged_as_that_change() {
    let r = home();
    let row = "compatibility:\n  - component: cilium\n    version: \"1.18\"\n    kubernetes: {min: \"1.30\", max: \"1.34\"}\n    source: our lab\n";
    r.branch("policy", vec![("policies/local.yaml", Some(file(row)))]);
    let o = r.check("policy", &["--output", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v = report(&o);
    let s = &v["clusters"][0];
    assert_eq!(s["cluster"], Value::Null);
    let p = item(s, "policies");
    assert_eq!(p["status"], "pass");
    let msg = p["message"].as_str().unwrap_or("");
    assert!(msg.contains("once merged"), "{msg}");
    assert!(
        !msg.contains("merge policy changes on their own first"),
        "{msg}"
    );

    // A policy edit that does not load would break every later gate run: blocked.
    r.branch(
        "broken-policy",
        vec![(
            "policies/local.yaml",
            Some(file(&row.replace("min: \"1.30\"", "min: \"1.35\""))),
        )],
    );
    let o = r.check("broken-policy", &["--output", "json"]);
    assert_eq!(o.status.code(), Some(1));
    let v = report(&o);
    let p = item(&v["clusters"][0], "policies");
    assert_eq!(p["status"], "fail");
    assert!(
        p["message"]
            .as_str()
            .unwrap_or("")
            .contains("policies/local.yaml:2"),
        "{p}"
    );
}

#[test]
fn a_release_set_that_is_not_a_file_says_what_it_is() {
    let link = Entry {
        bytes: b"../../etc/passwd".to_vec(),
        mode: 0o120000,
        gitlink: None,
    };
    let r = home();
    r.branch("link", vec![("clusters/home/release-set.yaml", Some(link))]);
    let o = r.check("link", &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("clusters/home/release-set.yaml at link")
            && stderr(&o).contains("is a symbolic link, not a file"),
        "{}",
        stderr(&o)
    );

    r.branch(
        "dir",
        vec![
            ("clusters/home/release-set.yaml", None),
            ("clusters/home/release-set.yaml/x", Some(file("x"))),
        ],
    );
    let o = r.check("dir", &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is a directory, not a file"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("not found"), "{}", stderr(&o));

    let sub = Entry {
        bytes: vec![],
        mode: 0o160000,
        gitlink: Some(r.main),
    };
    r.branch(
        "submodule",
        vec![("clusters/home/release-set.yaml", Some(sub))],
    );
    let o = r.check("submodule", &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is a submodule, not a file"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn documents_with_a_bom_or_the_wrong_name() {
    let r = home();
    r.branch(
        "bom",
        vec![(
            "clusters/home/release-set.yaml",
            Some(file(&format!("\u{feff}{}", RS.replace("1.18.3", "1.18.6")))),
        )],
    );
    let o = r.check("bom", &[]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    r.branch(
        "renamed",
        vec![(
            "clusters/home/release-set.yaml",
            Some(file(&RS.replace("name: home", "name: prod"))),
        )],
    );
    let o = r.check("renamed", &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("release-set.yaml:4:")
            && stderr(&o).contains("metadata.name is `prod`, but the folder is clusters/home/"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn hostile_versions_and_sizes_end_in_a_clear_error() {
    let r = home();
    for (name, text, want) in [
        (
            "huge-minor",
            RS.replace("v1.33.5", "v1.2147483648.0"),
            "larger than 999999999",
        ),
        (
            "build",
            RS.replace("v1.33.5", "v1.33.5+b"),
            "build metadata",
        ),
        (
            "deep",
            format!("{RS}x: {}{}\n", "[".repeat(100_000), "]".repeat(100_000)),
            "nested more than 32",
        ),
        (
            "big",
            format!("{RS}x: \"{}\"\n", "y".repeat(2 * 1024 * 1024)),
            "at most 1048576 bytes",
        ),
    ] {
        r.branch(
            name,
            vec![("clusters/home/release-set.yaml", Some(file(&text)))],
        );
        let o = r.check(name, &[]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(err.contains(want), "{name}: {err}");
        assert!(
            err.len() < 1000,
            "{name}: the value is not echoed: {} bytes",
            err.len()
        );
    }
}

#[test]
fn a_prerelease_target_warns() {
    let r = home();
    r.branch(
        "rc",
        vec![(
            "clusters/home/release-set.yaml",
            Some(file(&RS.replace("v1.33.5", "v1.33.6-rc.1"))),
        )],
    );
    let o = r.check("rc", &["--output", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let v = report(&o);
    let pre = item(section(&v, "home"), "prerelease");
    assert_eq!(pre["status"], "warn");
    assert!(pre["message"]
        .as_str()
        .unwrap_or("")
        .contains("kubernetes v1.33.6-rc.1"));
}

#[test]
fn the_working_tree_can_be_the_head() {
    let r = home();
    let rs_path = r.dir.path().join("clusters/home/release-set.yaml");
    std::fs::create_dir_all(rs_path.parent().expect("parent")).expect("mkdir");
    std::fs::write(&rs_path, RS.replace("1.18.3", "1.18.6")).expect("write");
    std::fs::write(r.dir.path().join("clusters/home/cluster.yaml"), CLUSTER).expect("write");
    let o = r.check(".", &["--output", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v = report(&o);
    assert_eq!(v["head"]["commit"], Value::Null);
    let s = section(&v, "home");
    assert_eq!(s["changes"][0]["to"], "1.18.6", "{s:#}");
    assert!(!has_item(s, "cluster-settings"));

    // A link in the working tree is refused, not followed.
    std::fs::remove_file(&rs_path).expect("rm");
    let secret = r.dir.path().join("secret.yaml");
    std::fs::write(&secret, RS).expect("write");
    std::os::unix::fs::symlink(&secret, &rs_path).expect("symlink");
    let o = r.check(".", &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));

    // A bare repository has no working tree to name.
    let bare = tempfile::tempdir().expect("tempdir");
    Repository::init_bare(bare.path()).expect("bare");
    let o = ichor(&[
        "check",
        "--repo",
        &bare.path().to_string_lossy(),
        "--base",
        "main",
        "--head",
        ".",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("has no working tree"), "{}", stderr(&o));
}

#[test]
fn plan_of_a_blocked_change_says_so_and_fails() {
    let repo = homelab().to_string_lossy().into_owned();
    let head = "renovate/ghcr.io-siderolabs-kubelet-1.x";
    let args = ["plan", "--repo", &repo, "--base", "main", "--head", head];
    let o = ichor(&args);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    let first = out.lines().next().unwrap_or("");
    assert!(first.contains("the gate blocks this change"), "{out}");
    assert!(
        out.contains("Kubernetes 1.34 is blocked on cilium"),
        "{out}"
    );
    assert!(
        !out.contains("Stage 1"),
        "no plan without --allow-blocked: {out}"
    );

    let mut anyway = args.to_vec();
    anyway.push("--allow-blocked");
    let o = ichor(&anyway);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    assert!(
        out.starts_with("WARNING: the gate blocks this change"),
        "{out}"
    );
    assert!(out.contains("Stage 1"), "{out}");
}

#[test]
fn demo_reuses_its_own_folder_refuses_others_and_cleans_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().join("homelab");
    let d = d.to_string_lossy();
    for _ in 0..2 {
        let o = ichor(&["demo", "--dir", &d]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("notes.txt"), "mine").expect("write");
    let o = ichor(&["demo", "--dir", &other.to_string_lossy()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("is not the demo repository"), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "said once: {err}");
    assert!(other.join("notes.txt").exists());

    // Without --dir the temporary repository is gone when the demo ends.
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .arg("demo")
        .env("TMPDIR", tmp.path())
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(is_empty(tmp.path()), "demo left files in TMPDIR");
}

fn is_empty(p: &Path) -> bool {
    std::fs::read_dir(p)
        .map(|mut e| e.next().is_none())
        .unwrap_or(false)
}

/// Issue 17 item 9: a change may touch at most `MAX_CLUSTERS_PER_CHANGE` cluster folders —
/// past it, `ichor check` refuses clearly rather than parse them all; a controller reads only
/// the clusters it is configured for, so another's broken (or thousand) folders cost it
/// nothing and never block its own cluster.
#[test]
fn a_change_touching_too_many_cluster_folders_is_refused_and_others_are_never_parsed() {
    let r = home();
    let n = ichor::gate::MAX_CLUSTERS_PER_CHANGE + 1;
    let names: Vec<String> = (0..n).map(|i| format!("extra-{i}")).collect();
    let paths: Vec<String> = names
        .iter()
        .map(|c| format!("clusters/{c}/release-set.yaml"))
        .collect();
    let mut files: Vec<(&str, Option<Entry>)> = paths
        .iter()
        // Not even YAML: parsed, each would be an error section.
        .map(|p| (p.as_str(), Some(file("{{{ not yaml"))))
        .collect();
    let bumped = RS.replace("v1.33.5", "v1.33.7");
    files.push(("clusters/home/release-set.yaml", Some(file(&bumped))));
    r.branch("flood", files);

    let o = r.check("flood", &[]);
    assert_eq!(o.status.code(), Some(2), "{}{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("touches {} cluster folders", n + 1))
            && err.contains(&format!("at most {}", n - 1)),
        "{err}"
    );

    // As a controller configured for `home` sees it: only `home` is read and judged.
    let repo = ichor::git::Repo::open(r.dir.path()).expect("open");
    let review =
        ichor::gate::review_among(&repo, "main", "flood", None, Some(&["home".to_string()]))
            .expect("judged");
    let clusters: Vec<Option<String>> = review.sections.iter().map(|s| s.cluster.clone()).collect();
    assert_eq!(clusters, [Some("home".to_string())]);
    assert!(review.sections.iter().all(|s| s.result.is_ok()));
}
