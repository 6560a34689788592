//! `ichor run` end to end: the controller against the twin (Talos and Kubernetes APIs) and
//! the GitHub emulator, over real sockets, with one manual clock that the twin's driver
//! moves. Nothing here sleeps: each test waits on the controller's activity counter and
//! then looks at what GitHub, the notes or the cluster show.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor::controller::{self, Config, Running};
use ichor::git::notes::{self, RecordKind};
use ichor::sim::twin::TwinConfig;

use crate::homelab;
use crate::rollout::{setup, Setup};

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Error = Box<dyn std::error::Error>;

/// Wait (driving the twin's clock) until `cond` holds; fail after a generous bound of
/// real time, which only a hang reaches.
pub async fn until(
    s: &Setup,
    running: &Running,
    what: &str,
    cond: impl FnMut() -> bool,
) -> TestResult {
    let drive = s.twin.drive(Duration::from_secs(2), || {});
    if running
        .wait_until(drive, cond, Duration::from_secs(120))
        .await
    {
        Ok(())
    } else {
        Err(format!("timed out waiting for {what}").into())
    }
}

/// A bare copy of the homelab fixture with every branch, for ichor to fetch from.
pub fn origin(dir: &Path) -> Result<PathBuf, Error> {
    Ok(ichor::sim::github::private_clone(
        homelab(),
        dir,
        "acme/homelab",
    )?)
}

pub fn oid(repo: &git2::Repository, rev: &str) -> Result<git2::Oid, Error> {
    Ok(repo.revparse_single(rev)?.peel_to_commit()?.id())
}

fn git_only_config(s: &Setup, origin: &Path, state: &Path) -> Result<Config, Error> {
    let text = format!(
        "repository:\n  path: {}\n  branch: main\nclusters:\n  - name: homelab\n    kubeconfig: {}\n    talosconfig: {}\npollInterval: 10m\nlisten: 127.0.0.1:0\nmetricsListen: 127.0.0.1:0\nstateDir: {}\n",
        origin.display(),
        s.twin.kubeconfig().display(),
        s.twin.talosconfig().display(),
        state.display()
    );
    Ok(Config::parse("test-config.yaml", &text)?)
}

fn note_has(repo: &Path, commit: git2::Oid, kind: RecordKind, state: &str) -> bool {
    let Ok(r) = git2::Repository::open_bare(repo) else {
        return false;
    };
    notes::read(&r, commit)
        .map(|recs| recs.iter().any(|n| n.kind == kind && n.state == state))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_only_gates_branches_rolls_out_the_merge_and_writes_notes() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let origin = origin(dir.path())?;
    let cfg = git_only_config(&s, &origin, &dir.path().join("ichor"))?;
    let running = controller::start(cfg, s.twin.talos.clock().clone()).await?;
    let repo = git2::Repository::open_bare(&origin)?;
    let good = oid(&repo, "renovate/talos")?;
    let bad = oid(&repo, "renovate/ghcr.io-siderolabs-kubelet-1.x")?;

    // Every branch is judged, and the verdict lands as a note on its head.
    until(&s, &running, "gate notes on both branches", || {
        note_has(&origin, good, RecordKind::Gate, "success")
            && note_has(&origin, bad, RecordKind::Gate, "failure")
    })
    .await?;
    let blocked = notes::read(&repo, bad)?;
    assert!(
        blocked.iter().any(|n| n.summary.starts_with("blocked:")),
        "{blocked:?}"
    );
    // Readable with git alone.
    let log = std::process::Command::new("git")
        .args(["log", "--notes=ichor", "-1", &good.to_string()])
        .current_dir(&origin)
        .output()?;
    let log = String::from_utf8(log.stdout)?;
    assert!(
        log.contains("Notes (ichor):") && log.contains("\"kind\":\"gate\""),
        "{log}"
    );

    // The merge: main moves to the good branch's head, on disk, as a push would.
    repo.reference("refs/heads/main", good, true, "merge renovate/talos")?;
    // Meanwhile somebody else writes notes to the same repository: both survive.
    let other = tempfile::tempdir()?;
    let clone = git2::Repository::clone(&origin.display().to_string(), other.path())?;
    let sig = git2::Signature::now("Mara", "mara@homelab.example")?;
    let mut theirs = notes::NoteRecord::new(
        RecordKind::Command,
        ichor::clock::Clock::manual().now(),
        "success",
        "a human's note",
    );
    theirs.by = Some("mara".into());
    notes::append(&clone, good, &[theirs], &sig)?;
    let url = origin.display().to_string();
    notes::push(&clone, &url, &git2::RemoteCallbacks::new, 5)?;

    until(&s, &running, "the rollout to complete", || {
        note_has(&origin, good, RecordKind::Rollout, "completed")
    })
    .await?;
    let on_merge = notes::read(&repo, good)?;
    assert!(on_merge.iter().any(|n| n.summary == "a human's note"));
    assert!(on_merge
        .iter()
        .any(|n| n.kind == RecordKind::Rollout && n.state == "running"));
    let nodes = s.kube.nodes().await?;
    let want = s.change.head_release_set.spec.kubernetes.to_string();
    assert!(
        nodes
            .iter()
            .all(|n| n.kubelet.trim_start_matches('v') == want.trim_start_matches('v')),
        "{nodes:?}"
    );

    // A command through the documented ref, acknowledged on its commit.
    let tree = repo.find_commit(good)?.tree()?;
    let cmd = repo.commit(
        Some(notes::COMMANDS_REF),
        &sig,
        &sig,
        "/ichor plan\n",
        &tree,
        &[],
    )?;
    running
        .ctx
        .events
        .send(controller::Event::Reconcile)
        .await?;
    until(&s, &running, "the command's ack", || {
        note_has(&origin, cmd, RecordKind::Ack, "success")
    })
    .await?;
    running.shutdown().await;
    Ok(())
}

/// Commands on `refs/ichor/commands`, on top of what is there; the ref moves once, after
/// the last, so a reconcile sees all or none.
fn give_commands(repo: &git2::Repository, lines: &[&str]) -> Result<Vec<git2::Oid>, Error> {
    let sig = git2::Signature::now("Mara", "mara@homelab.example")?;
    let mut parent = repo
        .find_reference(notes::COMMANDS_REF)
        .ok()
        .and_then(|r| r.peel_to_commit().ok());
    let tree = repo.find_tree(repo.treebuilder(None)?.write()?)?;
    let mut oids = Vec::new();
    for line in lines {
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        let oid = repo.commit(None, &sig, &sig, line, &tree, &parents)?;
        parent = Some(repo.find_commit(oid)?);
        oids.push(oid);
    }
    Ok(oids)
}

fn publish_commands(repo: &git2::Repository, oids: &[git2::Oid]) -> Result<(), Error> {
    if let Some(last) = oids.last() {
        repo.reference(notes::COMMANDS_REF, *last, true, "commands")?;
    }
    Ok(())
}

fn give_command(repo: &git2::Repository, line: &str) -> Result<git2::Oid, Error> {
    let oids = give_commands(repo, &[line])?;
    publish_commands(repo, &oids)?;
    Ok(oids[0])
}

/// The `ack` records on `commit` in the origin's notes.
fn acks(origin: &Path, commit: git2::Oid) -> Vec<notes::NoteRecord> {
    git2::Repository::open_bare(origin)
        .ok()
        .and_then(|r| notes::read(&r, commit).ok())
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.kind == RecordKind::Ack)
        .collect()
}

/// Issue 17 item 11: an `ack` line anyone can push does not suppress a command; the acks of
/// one reconcile go in one push; a `refs/notes/ichor` that is not a commit is named and the
/// commands still run once, their acks published once the ref is fixed; a restart, with
/// its state dir or without, runs nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_only_acks_cannot_be_forged_and_a_broken_notes_ref_stops_nothing() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let origin = origin(dir.path())?;
    let repo = git2::Repository::open_bare(&origin)?;
    // Count the pushes that move the origin's notes (a bare repository keeps no reflog
    // unless asked).
    repo.config()?.set_str("core.logAllRefUpdates", "always")?;
    let pushes = || -> usize {
        git2::Repository::open_bare(&origin)
            .and_then(|r| r.reflog(notes::NOTES_REF))
            .map(|log| {
                log.iter()
                    .filter(|e| e.message().ok().flatten() == Some("ichor: notes"))
                    .count()
            })
            .unwrap_or(0)
    };
    let state = dir.path().join("ichor");
    let running = controller::start(
        git_only_config(&s, &origin, &state)?,
        s.twin.talos.clock().clone(),
    )
    .await?;
    let good = oid(&repo, "renovate/talos")?;
    until(&s, &running, "the gate's note", || {
        note_has(&origin, good, RecordKind::Gate, "success")
    })
    .await?;

    // Three commands; someone who can push the notes acks the middle one first.
    let cmds = give_commands(
        &repo,
        &[
            "/ichor plan",
            "/ichor pause homelab",
            "/ichor resume homelab",
        ],
    )?;
    let sig = git2::Signature::now("Eve", "eve@example.org")?;
    let mut forged = notes::NoteRecord::new(
        RecordKind::Ack,
        ichor::clock::Clock::manual().now(),
        "success",
        "nothing to see",
    );
    forged.command = Some("/ichor pause homelab".into());
    forged.mac = Some("00000000.00".into());
    notes::append(&repo, cmds[1], &[forged], &sig)?;
    let before = pushes();
    publish_commands(&repo, &cmds)?;
    running
        .ctx
        .events
        .send(controller::Event::Reconcile)
        .await?;
    until(&s, &running, "ichor's acks of all three", || {
        cmds.iter().all(|c| {
            acks(&origin, *c)
                .iter()
                .any(|a| a.summary != "nothing to see")
        })
    })
    .await?;
    let paused = acks(&origin, cmds[1]);
    assert!(
        paused.iter().any(
            |a| a.detail.as_deref().is_some_and(|d| d.contains("homelab"))
                && a.mac.as_deref().is_some_and(|m| m.len() == 8 + 1 + 64)
        ),
        "the pause ran and ichor sealed its ack: {paused:?}"
    );
    assert_eq!(pushes() - before, 1, "three acks, one push");

    // refs/notes/ichor on the origin now names a blob.
    let blob = repo.blob(b"not notes\n")?;
    let notes_tip = repo.refname_to_id(notes::NOTES_REF)?;
    repo.reference(notes::NOTES_REF, blob, true, "broken by hand")?;
    let late = give_command(&repo, "/ichor plan")?;
    running
        .ctx
        .events
        .send(controller::Event::Reconcile)
        .await?;
    until(
        &s,
        &running,
        "the command handled while its ack cannot be published",
        || {
            running.ctx.reporters.notes.as_ref().is_some_and(|n| {
                n.unpublished.lock().is_ok_and(|why| {
                    why.as_deref().is_some_and(|w| {
                        w.contains("refs/notes/ichor points at a blob, not a commit")
                    })
                })
            })
        },
    )
    .await?;
    assert_eq!(
        repo.refname_to_id(notes::NOTES_REF)?,
        blob,
        "never forced over"
    );
    // Fixed by hand: the next reconcile publishes what waited.
    repo.reference(notes::NOTES_REF, notes_tip, true, "fixed by hand")?;
    running
        .ctx
        .events
        .send(controller::Event::Reconcile)
        .await?;
    until(&s, &running, "the late command's ack published", || {
        acks(&origin, late).len() == 1
    })
    .await?;
    running.shutdown().await;

    // Restarted with its state dir, and then without one: nothing runs twice.
    for state in [state.clone(), dir.path().join("fresh")] {
        let running = controller::start(
            git_only_config(&s, &origin, &state)?,
            s.twin.talos.clock().clone(),
        )
        .await?;
        let probe = give_command(&repo, "/ichor plan")?;
        running
            .ctx
            .events
            .send(controller::Event::Reconcile)
            .await?;
        until(&s, &running, "the probe's ack", || {
            !acks(&origin, probe).is_empty()
        })
        .await?;
        for c in cmds.iter().chain([&late]) {
            let ichors = acks(&origin, *c)
                .into_iter()
                .filter(|a| a.summary != "nothing to see")
                .count();
            assert_eq!(ichors, 1, "{c} acknowledged {ichors} times");
        }
        running.shutdown().await;
    }
    Ok(())
}

/// The homelab's Talos PR merged on disk, with `ichor run` in Git-only mode watching:
/// (twin, controller, origin, main before the merge, the merge).
async fn merged_on_disk(
    dir: &Path,
) -> Result<(Setup, Running, PathBuf, git2::Oid, git2::Oid), Error> {
    let s = setup(TwinConfig::default()).await?;
    let origin = origin(dir)?;
    let cfg = git_only_config(&s, &origin, &dir.join("ichor"))?;
    let running = controller::start(cfg, s.twin.talos.clock().clone()).await?;
    let repo = git2::Repository::open_bare(&origin)?;
    let main = oid(&repo, "main")?;
    let good = oid(&repo, "renovate/talos")?;
    repo.reference("refs/heads/main", good, true, "merge renovate/talos")?;
    Ok((s, running, origin, main, good))
}

/// A revert of `merged` onto main (main's old tree `before` on top of it), and the loop told.
async fn revert(
    running: &Running,
    origin: &Path,
    before: git2::Oid,
    merged: git2::Oid,
) -> Result<git2::Oid, Error> {
    let repo = git2::Repository::open_bare(origin)?;
    let sig = git2::Signature::now("Mara", "mara@homelab.example")?;
    let old_tree = repo.find_commit(before)?.tree()?;
    let merged = repo.find_commit(merged)?;
    let revert = repo.commit(
        Some("refs/heads/main"),
        &sig,
        &sig,
        "Revert \"update talos group\"\n",
        &old_tree,
        &[&merged],
    )?;
    running
        .ctx
        .events
        .send(controller::Event::Reconcile)
        .await?;
    Ok(revert)
}

/// Whether a note of `kind` on `commit` says `words` anywhere.
fn note_says(origin: &Path, commit: git2::Oid, kind: RecordKind, words: &str) -> bool {
    git2::Repository::open_bare(origin)
        .ok()
        .and_then(|r| notes::read(&r, commit).ok())
        .is_some_and(|recs| {
            recs.iter()
                .any(|n| n.kind == kind && format!("{n:?}").contains(words))
        })
}

/// Issue 16 item 14: a merge that moves Talos or Kubernetes backwards (a revert) starts
/// nothing — ichor never downgrades — and says so on the commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_that_would_downgrade_starts_nothing_and_says_so() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (s, running, origin, main, good) = merged_on_disk(dir.path()).await?;
    until(&s, &running, "the rollout to complete", || {
        note_has(&origin, good, RecordKind::Rollout, "completed")
    })
    .await?;
    let revert = revert(&running, &origin, main, good).await?;
    until(&s, &running, "the refusal on the revert", || {
        note_says(&origin, revert, RecordKind::Ack, "ichor never downgrades")
    })
    .await?;
    // Nothing moved back.
    let want = s.change.head_release_set.spec.talos.to_string();
    for n in s.kube.nodes().await? {
        assert_eq!(n.talos.as_deref(), Some(want.as_str()), "{} moved", n.name);
        assert!(!n.cordoned, "{} cordoned", n.name);
    }
    running.shutdown().await;
    Ok(())
}

/// Issue 16 item 14: a revert that lands while the rollout runs stops it at its next safe
/// point, saying why, instead of letting it finish and then refusing the revert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_during_a_rollout_stops_it_at_the_next_safe_point() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (s, running, origin, main, good) = merged_on_disk(dir.path()).await?;
    until(&s, &running, "the rollout to start", || {
        note_has(&origin, good, RecordKind::Rollout, "running")
    })
    .await?;
    let revert = revert(&running, &origin, main, good).await?;
    until(&s, &running, "the rollout to pause on the revert", || {
        note_has(&origin, good, RecordKind::Rollout, "paused")
            && note_says(&origin, good, RecordKind::Rollout, "ichor never downgrades")
    })
    .await?;
    assert!(
        note_says(&origin, revert, RecordKind::Ack, "ichor never downgrades"),
        "the revert is answered on its commit"
    );
    running.shutdown().await;
    Ok(())
}

// ----- with GitHub (the emulator) -----

use ichor::sim::github::{
    CommitStatus, GithubTwin, GithubTwinConfig, RepoSpec, StatusState, WebhookTarget,
    RENOVATE_LOGIN,
};

const REPO: &str = "acme/homelab";
const GOOD: &str = "renovate/talos";
const BAD: &str = "renovate/ghcr.io-siderolabs-kubelet-1.x";
const SECRET: &str = "webhook-secret-do-not-print";

pub struct Hub {
    pub s: Setup,
    pub gh: GithubTwin,
    pub dir: tempfile::TempDir,
    /// The emulator's repository on disk.
    pub origin: PathBuf,
    /// ichor authenticates as a GitHub App.
    pub app: bool,
}

/// Test-only RSA key in PKCS#1 PEM, made with OpenSSL (testdata/keys/README.md).
const APP_KEY: &str = include_str!("../../testdata/keys/github-app.pkcs1.pem");

impl Hub {
    pub async fn start() -> Result<Hub, Error> {
        Hub::start_as(false).await
    }

    /// With `app`, ichor authenticates as a GitHub App (id 1234, installation 99 on the
    /// repository, test key from testdata/keys/) instead of with the token.
    pub async fn start_as(app: bool) -> Result<Hub, Error> {
        let s = setup(TwinConfig::default()).await?;
        let dir = tempfile::tempdir()?;
        let origin = origin(dir.path())?;
        let apps = if app {
            vec![ichor::sim::github::GithubApp::from_private_key_pem(
                1234,
                "ichor",
                APP_KEY,
                vec![ichor::sim::github::AppInstallation {
                    id: 99,
                    repos: vec![REPO.to_string()],
                }],
            )?]
        } else {
            vec![]
        };
        let gh = GithubTwin::start_with(
            s.twin.talos.clock().clone(),
            GithubTwinConfig {
                repos: vec![RepoSpec {
                    full_name: REPO.into(),
                    path: origin.clone(),
                    default_branch: "main".into(),
                }],
                apps,
                ..GithubTwinConfig::default()
            },
        )
        .await?;
        std::fs::write(dir.path().join("token"), format!("{}\n", gh.token()))?;
        std::fs::write(dir.path().join("secret"), SECRET)?;
        if app {
            use std::os::unix::fs::PermissionsExt;
            let key = dir.path().join("app-key.pem");
            std::fs::write(&key, APP_KEY)?;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        }
        Ok(Hub {
            s,
            gh,
            dir,
            origin,
            app,
        })
    }

    pub fn config(&self, name: &str) -> Result<Config, Error> {
        Ok(Config::parse(
            "test-config.yaml",
            &self.config_text(name, "127.0.0.1:0"),
        )?)
    }

    pub fn config_text(&self, name: &str, listen: &str) -> String {
        let d = self.dir.path();
        format!(
            "repository:\n  url: {url}\n  branch: main\n\
             github:\n  repository: {REPO}\n  apiUrl: {api}\n\
             credentials:\n  github:\n{credentials}\
             webhook:\n  secretFile: {secret}\n\
             clusters:\n  - name: homelab\n    kubeconfig: {kc}\n    talosconfig: {tc}\n\
             pollInterval: 10m\nlisten: {listen}\nmetricsListen: 127.0.0.1:0\nstateDir: {state}\n\
             leaderElection:\n  identity: {name}\n  leaseDuration: 1h\n",
            url = self.gh.clone_url(REPO),
            api = self.gh.base_url(),
            credentials = if self.app {
                // The installation token is for the API only: git reads with the token.
                format!(
                    "    appId: 1234\n    installationId: 99\n    privateKeyFile: {}\n  git:\n    tokenFile: {}\n",
                    d.join("app-key.pem").display(),
                    d.join("token").display()
                )
            } else {
                format!("    tokenFile: {}\n", d.join("token").display())
            },
            secret = d.join("secret").display(),
            kc = self.s.twin.kubeconfig().display(),
            tc = self.s.twin.talosconfig().display(),
            state = d.join(name).display(),
        )
    }

    /// A controller, with the emulator's webhooks pointed at it.
    pub async fn run(&self, name: &str) -> Result<Running, Error> {
        let running =
            controller::start(self.config(name)?, self.s.twin.talos.clock().clone()).await?;
        self.gh.set_webhook(Some(WebhookTarget {
            url: running.webhook_url().ok_or("no webhook listener")?,
            secret: SECRET.into(),
        }));
        Ok(running)
    }

    pub fn status(&self, sha: &str, context: &str) -> Option<CommitStatus> {
        let (_, latest) = self.gh.combined_status(REPO, sha).ok()?;
        latest.into_iter().find(|s| s.context == context)
    }

    pub fn sticky(&self, pr: u64) -> Vec<String> {
        self.gh
            .comments(REPO, pr)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| {
                c.user == self.gh.login()
                    && c.body.contains("<!-- ichor:sticky cluster=homelab -->")
            })
            .map(|c| c.body)
            .collect()
    }

    pub fn replies(&self, pr: u64, needle: &str) -> usize {
        self.gh
            .comments(REPO, pr)
            .unwrap_or_default()
            .iter()
            .filter(|c| c.user == self.gh.login() && c.body.contains(needle))
            .count()
    }

    pub async fn open(&self, branch: &str) -> Result<ichor::sim::github::PullRequest, Error> {
        Ok(self
            .gh
            .open_pull_request(
                REPO,
                branch,
                "main",
                branch,
                "Renovate update",
                RENOVATE_LOGIN,
            )
            .await?)
    }
}

fn is(s: &Option<CommitStatus>, state: StatusState) -> bool {
    s.as_ref().is_some_and(|s| s.state == state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pr_gets_its_gate_and_one_comment_and_each_new_head_is_judged_afresh() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    let good = hub.open(GOOD).await?;
    let bad = hub.open(BAD).await?;
    until(&hub.s, &running, "both verdicts", || {
        is(
            &hub.status(&good.head_sha, "ichor/gate"),
            StatusState::Success,
        ) && is(
            &hub.status(&bad.head_sha, "ichor/gate"),
            StatusState::Failure,
        ) && hub.sticky(good.number).len() == 1
            && hub.sticky(bad.number).len() == 1
    })
    .await?;
    let red = hub.status(&bad.head_sha, "ichor/gate").ok_or("no status")?;
    let why = red.description.unwrap_or_default();
    assert!(
        why.starts_with("blocked: ") && why.chars().count() <= 140,
        "{why}"
    );
    let body = &hub.sticky(bad.number)[0];
    assert!(
        body.contains("### ichor gate") && body.contains("```mermaid") || body.contains("No plan"),
        "{body}"
    );
    let body = &hub.sticky(good.number)[0];
    assert!(
        body.contains("```mermaid") && body.contains("| ✅ |"),
        "{body}"
    );

    // Renovate force-pushes: the PR's branch now points at the blocked change.
    hub.gh
        .force_push(REPO, GOOD, &bad.head_sha, RENOVATE_LOGIN)
        .await?;
    let moved = hub.gh.pull_request(REPO, good.number)?;
    assert_eq!(moved.head_sha, bad.head_sha);
    until(&hub.s, &running, "the new head's comment", || {
        hub.sticky(good.number)
            .first()
            .is_some_and(|b| b.contains(&bad.head_sha[..10]))
    })
    .await?;
    assert_eq!(hub.sticky(good.number).len(), 1, "edited in place");
    // The old head keeps its own verdict; nothing moved it.
    assert!(is(
        &hub.status(&good.head_sha, "ichor/gate"),
        StatusState::Success
    ));
    let posted = hub.gh.statuses(REPO, &good.head_sha)?;
    assert_eq!(
        posted.iter().filter(|s| s.context == "ichor/gate").count(),
        1,
        "posted once"
    );
    // A fork's PR is judged like any other, and says that nothing from a fork acts.
    let fixture = git2::Repository::open(homelab())?;
    let cilium = fixture
        .revparse_single("renovate/cilium-1.18.x:clusters/homelab/release-set.yaml")?
        .peel_to_blob()?;
    let text = std::str::from_utf8(cilium.content())?.to_string();
    hub.gh
        .push_fork_commit(
            REPO,
            "mallory",
            "cilium",
            &[("clusters/homelab/release-set.yaml", &text)],
            "bump cilium",
        )
        .await?;
    let fork = hub
        .gh
        .open_fork_pull_request(
            REPO,
            "mallory",
            "cilium",
            "main",
            "bump cilium",
            "",
            "mallory",
        )
        .await?;
    until(&hub.s, &running, "the fork PR's verdict", || {
        is(
            &hub.status(&fork.head_sha, "ichor/gate"),
            StatusState::Success,
        ) && hub
            .sticky(fork.number)
            .first()
            .is_some_and(|b| b.contains("comes from a fork"))
    })
    .await?;
    // Nothing secret in anything ichor wrote.
    for c in hub.gh.comments(REPO, good.number)? {
        assert!(!c.body.contains(hub.gh.token()) && !c.body.contains(SECRET));
    }
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_a_github_app_the_gate_is_a_check_run_with_its_checklist_and_annotations() -> TestResult
{
    let hub = Hub::start_as(true).await?;
    let running = hub.run("a").await?;
    let good = hub.open(GOOD).await?;
    let bad = hub.open(BAD).await?;
    let run = |sha: &str| {
        hub.gh
            .check_runs(REPO, sha)
            .unwrap_or_default()
            .into_iter()
            .rfind(|r| r.name == "ichor/gate")
    };
    until(&hub.s, &running, "both check runs", || {
        run(&good.head_sha).is_some_and(|r| r.conclusion.as_deref() == Some("success"))
            && run(&bad.head_sha).is_some_and(|r| r.conclusion.as_deref() == Some("failure"))
    })
    .await?;
    let red = run(&bad.head_sha).ok_or("no run")?;
    assert_eq!(red.app_slug, "ichor");
    let title = red.title.clone().unwrap_or_default();
    assert!(title.starts_with("blocked: "), "{title}");
    let summary = red.summary.clone().unwrap_or_default();
    assert!(summary.contains("### ichor gate"), "{summary}");
    assert!(red.text.clone().unwrap_or_default().contains("staged plan"));
    // The failing item points at the line it is about in the head's release set.
    let file = "clusters/homelab/release-set.yaml";
    let text = std::str::from_utf8(
        git2::Repository::open_bare(&hub.origin)?
            .find_commit(git2::Oid::from_str(&bad.head_sha)?)?
            .tree()?
            .get_path(Path::new(file))?
            .to_object(&git2::Repository::open_bare(&hub.origin)?)?
            .peel_to_blob()?
            .content(),
    )?
    .to_string();
    let failing: Vec<_> = red
        .annotations
        .iter()
        .filter(|a| a.level == "failure")
        .collect();
    assert!(!failing.is_empty(), "{:?}", red.annotations);
    for a in &failing {
        assert_eq!(a.path, file);
        let line = text.lines().nth(a.start_line as usize - 1).unwrap_or("");
        // The version line of what the item is about (Kubernetes, or the CNI under it).
        assert!(
            line.contains("kubernetes:") || line.trim_start().starts_with("version:"),
            "line {}: {line}",
            a.start_line
        );
    }
    // No status of the same name beside the run: GitHub would require both.
    for sha in [&good.head_sha, &bad.head_sha] {
        assert!(hub.status(sha, "ichor/gate").is_none());
    }
    // The sticky comment is still there, by the App's bot.
    assert!(hub
        .gh
        .comments(REPO, bad.number)?
        .iter()
        .any(|c| c.user == "ichor[bot]" && c.body.contains("### ichor gate")));
    running.shutdown().await;
    Ok(())
}

/// A valid row of `policies/local.yaml`, and the same row made invalid on its line 2.
const POLICY_ROW: &str = "compatibility:\n  - component: cilium\n    version: \"1.18\"\n    kubernetes: {min: \"1.30\", max: \"1.34\"}\n    source: our lab\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_edit_that_does_not_load_is_red_and_the_fix_for_a_broken_base_is_judged(
) -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    let broken = POLICY_ROW.replace("min: \"1.30\"", "min: \"1.35\"");
    hub.gh
        .push_commit(
            REPO,
            "policy-broken",
            &[("policies/local.yaml", &broken)],
            "policies: a row",
            RENOVATE_LOGIN,
        )
        .await?;
    let pr = hub.open("policy-broken").await?;
    // It touches no cluster, but once merged its policies judge every cluster: red, naming
    // the file and line (never "nothing to judge").
    until(&hub.s, &running, "the policy PR's verdict", || {
        hub.status(&pr.head_sha, "ichor/gate").is_some() && hub.sticky(pr.number).len() == 1
    })
    .await?;
    let status = hub.status(&pr.head_sha, "ichor/gate").ok_or("no status")?;
    assert_eq!(status.state, StatusState::Failure, "{status:?}");
    let body = &hub.sticky(pr.number)[0];
    assert!(body.contains("policies/local.yaml:2"), "{body}");

    // Merged anyway (an admin's bypass): the PR that fixes it, branched from the broken
    // base, is judged with the shipped data and says so, rather than `error`.
    hub.gh.merge_pull_request(REPO, pr.number, "admin").await?;
    hub.gh
        .push_commit(
            REPO,
            "policy-fix",
            &[("policies/local.yaml", POLICY_ROW)],
            "policies: fix the row",
            RENOVATE_LOGIN,
        )
        .await?;
    let fix = hub.open("policy-fix").await?;
    until(&hub.s, &running, "the fix PR's verdict", || {
        hub.status(&fix.head_sha, "ichor/gate").is_some() && hub.sticky(fix.number).len() == 1
    })
    .await?;
    let status = hub.status(&fix.head_sha, "ichor/gate").ok_or("no status")?;
    assert_eq!(status.state, StatusState::Success, "{status:?}");
    let body = &hub.sticky(fix.number)[0];
    assert!(
        body.contains("judged with the shipped data") && body.contains("policies/local.yaml:2"),
        "{body}"
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pr_over_the_fetch_bound_is_red_and_every_other_pr_is_judged() -> TestResult {
    let hub = Hub::start().await?;
    // A fork's PR carrying a megabyte that does not compress much: only its own fetch
    // (refs/pull/N/head) can bring it, and that fetch is over the bound.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: String = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"0123456789abcdef"[(x & 15) as usize])
        })
        .collect();
    hub.gh
        .push_fork_commit(REPO, "mallory", "huge", &[("blob.txt", &noise)], "huge")
        .await?;
    let huge = hub
        .gh
        .open_fork_pull_request(REPO, "mallory", "huge", "main", "huge", "", "mallory")
        .await?;
    let good = hub.open(GOOD).await?;
    // Open before ichor starts: its first fetch is where a PR could stall it.
    let text = format!(
        "{}limits:\n  prFetchBytes: 131072\n",
        hub.config_text("a", "127.0.0.1:0")
    );
    let running = controller::start(
        Config::parse("test-config.yaml", &text)?,
        hub.s.twin.talos.clock().clone(),
    )
    .await?;
    hub.gh.set_webhook(Some(WebhookTarget {
        url: running.webhook_url().ok_or("no webhook listener")?,
        secret: SECRET.into(),
    }));
    until(&hub.s, &running, "both verdicts", || {
        hub.status(&huge.head_sha, "ichor/gate").is_some()
            && is(
                &hub.status(&good.head_sha, "ichor/gate"),
                StatusState::Success,
            )
    })
    .await?;
    let red = hub
        .status(&huge.head_sha, "ichor/gate")
        .ok_or("no status")?;
    assert_eq!(red.state, StatusState::Error, "{red:?}");
    let why = red.description.unwrap_or_default();
    assert!(why.contains("too large to judge"), "{why}");
    running.shutdown().await;
    Ok(())
}

/// `ichor run` with the homelab's Talos PR gated green and merged, its rollout paused on
/// the cluster's one PodDisruptionBudget, which never allows a disruption for now:
/// (hub, controller, the PR, its merge commit).
async fn merged_and_paused(
) -> Result<(Hub, Running, ichor::sim::github::PullRequest, String), Error> {
    let hub = Hub::start().await?;
    let pdb_name = hub.s.first_pdb()?;
    hub.s
        .post_faults(serde_json::json!({"pdbsNeverAllow": [pdb_name]}))
        .await?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the gate", || {
        is(
            &hub.status(&pr.head_sha, "ichor/gate"),
            StatusState::Success,
        )
    })
    .await?;
    let merge = hub.gh.merge_pull_request(REPO, pr.number, "mara").await?;
    until(&hub.s, &running, "the pause", || {
        is(&hub.status(&merge, "ichor/rollout"), StatusState::Failure)
            && hub.sticky(pr.number).join("").contains("**Paused**")
    })
    .await?;
    Ok((hub, running, pr, merge))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_rolls_out_a_pause_shows_its_cause_and_retry_resumes_it() -> TestResult {
    let (hub, running, pr, merge) = merged_and_paused().await?;
    let status = hub.status(&merge, "ichor/rollout").ok_or("no status")?;
    assert!(status
        .description
        .unwrap_or_default()
        .starts_with("paused in "));
    let body = hub.sticky(pr.number).join("");
    assert!(
        body.contains("**Paused**") && body.contains("PodDisruptionBudget"),
        "{body}"
    );
    assert!(body.contains("/ichor retry"));

    // Someone without write access cannot resume it.
    hub.gh
        .comment(REPO, pr.number, "/ichor retry", "mallory")
        .await?;
    until(&hub.s, &running, "the refusal", || {
        hub.replies(pr.number, "only people with write access") == 1
    })
    .await?;
    assert!(is(
        &hub.status(&merge, "ichor/rollout"),
        StatusState::Failure
    ));

    // The budget is fixed; a maintainer retries.
    hub.s
        .post_faults(serde_json::json!({"pdbsNeverAllow": []}))
        .await?;
    hub.gh.add_collaborator(REPO, "mara", "write")?;
    hub.gh
        .comment(REPO, pr.number, "/ichor retry", "mara")
        .await?;
    until(&hub.s, &running, "the rollout's end", || {
        is(&hub.status(&merge, "ichor/rollout"), StatusState::Success)
            && hub.sticky(pr.number).join("").contains("✅ **Done**")
    })
    .await?;
    assert_eq!(hub.replies(pr.number, "resuming the rollout"), 1);
    let body = hub.sticky(pr.number).join("");
    assert!(body.contains("✅ **Done**"), "{body}");
    // With a token, the rollout's status changes with its state and stage only (GitHub
    // keeps at most 1,000 per commit and context); how far it is and when it should end
    // are in the comment (and, as an App, in the check run's title).
    let rollout: Vec<String> = hub
        .gh
        .statuses(REPO, &merge)?
        .into_iter()
        .filter(|s| s.context == "ichor/rollout")
        .filter_map(|s| s.description)
        .collect();
    assert!(
        rollout.iter().any(|d| d.starts_with("rolling out: ")),
        "{rollout:?}"
    );
    assert!(
        // One per stage entered (twice here: paused, then resumed), none per node.
        rollout.iter().all(|d| !d.contains(" done, ends ≈ ")) && rollout.len() <= 20,
        "{rollout:?}"
    );
    let want = hub.s.change.head_release_set.spec.kubernetes.to_string();
    let nodes = hub.s.kube.nodes().await?;
    assert!(nodes
        .iter()
        .all(|n| n.kubelet.trim_start_matches('v') == want.trim_start_matches('v')));
    let m = &running.ctx.metrics;
    assert_eq!(
        m.value("ichor_rollout_pauses_total", &[("cluster", "homelab")]),
        1.0
    );
    assert!(m
        .render()
        .contains("ichor_rollout_stage_seconds_count{stage=\"talos\"}"));
    running.shutdown().await;
    Ok(())
}

/// Item 14 of the safety issue: a newer merge over a paused rollout is acknowledged on both
/// PRs. The first PR's comment and its merge commit's status say it was superseded and by
/// what; the second PR's comment says what it took over, where that one had paused and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_merge_over_a_paused_rollout_is_acknowledged_on_both_prs() -> TestResult {
    let (hub, running, pr, merge) = merged_and_paused().await?;

    // Renovate's next Talos patch, on top of the paused merge, merged too.
    let next = "renovate/talos-next";
    {
        let repo = git2::Repository::open_bare(&hub.origin)?;
        commit_edit(
            &repo,
            &merge,
            &format!("refs/heads/{next}"),
            "clusters/homelab/release-set.yaml",
            |text| {
                let text = text
                    .unwrap_or_default()
                    .replace("talos: v1.12.9", "talos: v1.12.10");
                assert!(text.contains("talos: v1.12.10"), "{text}");
                text
            },
            "fix(deps): update talos ( v1.12.9 → v1.12.10 )\n",
        )?;
    }
    let pr2 = hub.open(next).await?;
    let merge2 = hub.gh.merge_pull_request(REPO, pr2.number, "mara").await?;
    until(&hub.s, &running, "both acknowledgements", || {
        hub.sticky(pr.number).join("").contains("**Superseded**")
            && hub
                .sticky(pr2.number)
                .join("")
                .contains("supersedes the rollout of")
    })
    .await?;
    let old = hub.sticky(pr.number).join("");
    let short2 = merge2.get(..12).ok_or("a short sha")?;
    assert!(
        old.contains(short2) && old.contains(&format!("PR #{}", pr2.number)),
        "{old}"
    );
    let status = hub.status(&merge, "ichor/rollout").ok_or("no status")?;
    assert!(
        status
            .description
            .as_deref()
            .is_some_and(|d| d.starts_with("superseded: ")),
        "{status:?}"
    );
    let new = hub.sticky(pr2.number).join("");
    assert!(
        new.contains(&format!("PR #{}", pr.number)) && new.contains("PodDisruptionBudget"),
        "{new}"
    );
    running.shutdown().await;
    Ok(())
}

/// Issue 17 item 10: a command runs once per comment. The same signed delivery replayed
/// with a fresh delivery id, and a signed comment older than a few minutes, run nothing and
/// get no reply; someone without write access is told once per PR, however often they ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_cannot_be_replayed_and_a_flood_gets_one_reply() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the gate", || {
        hub.status(&pr.head_sha, "ichor/gate").is_some()
    })
    .await?;
    hub.gh.add_collaborator(REPO, "mara", "write")?;
    hub.gh
        .comment(REPO, pr.number, "/ichor pause", "mara")
        .await?;
    let acked = "no rollout starts until `/ichor resume`";
    until(&hub.s, &running, "the pause's reply", || {
        hub.replies(pr.number, acked) == 1
    })
    .await?;
    let delivery = hub
        .gh
        .deliveries()
        .into_iter()
        .rev()
        .find(|d| {
            d.event == "issue_comment"
                && serde_json::from_str::<serde_json::Value>(&d.body)
                    .is_ok_and(|v| v["comment"]["user"]["login"] == "mara")
        })
        .ok_or("no delivery of mara's comment")?;
    assert_eq!(delivery.content_type, ichor::sim::github::ContentType::Json);
    let m = &running.ctx.metrics;
    let result = |r: &str| {
        m.value(
            "ichor_commands_total",
            &[("verb", "unknown"), ("result", r)],
        )
    };

    // The captured delivery again, signature and all, under a fresh delivery id.
    let sig = ichor::forge::webhook::sign(SECRET.as_bytes(), delivery.body.as_bytes());
    let posted = post_event(
        &running,
        "issue_comment",
        "replay-1",
        Some(&sig),
        &delivery.body,
    )
    .await?;
    assert_eq!(posted, 202);
    until(&hub.s, &running, "the replay counted", || {
        result("replayed") == 1.0
    })
    .await?;

    // A new comment id, written ten minutes ago: too old to be a command now.
    let mut old: serde_json::Value = serde_json::from_str(&delivery.body)?;
    let now = hub.s.twin.talos.clock().now();
    let then =
        ichor::clock::Timestamp::from_millis(now.as_millis().saturating_sub(600_000)).rfc3339();
    old["comment"]["id"] = serde_json::json!(987_654_321u64);
    old["comment"]["created_at"] = serde_json::json!(then);
    let body = old.to_string();
    let sig = ichor::forge::webhook::sign(SECRET.as_bytes(), body.as_bytes());
    assert_eq!(
        post_event(&running, "issue_comment", "replay-2", Some(&sig), &body).await?,
        202
    );
    until(&hub.s, &running, "the stale comment counted", || {
        result("stale") == 1.0
    })
    .await?;
    assert_eq!(hub.replies(pr.number, acked), 1, "nothing ran twice");

    // Someone without write access, three times: one reply.
    for _ in 0..3 {
        hub.gh
            .comment(REPO, pr.number, "/ichor resume", "mallory")
            .await?;
    }
    until(&hub.s, &running, "the refusals", || {
        m.value(
            "ichor_commands_total",
            &[("verb", "resume"), ("result", "refused")],
        ) == 3.0
    })
    .await?;
    assert_eq!(hub.replies(pr.number, "only people with write access"), 1);

    // `/ichor plan` says what it did, for which cluster.
    hub.gh
        .comment(REPO, pr.number, "/ichor plan", "mara")
        .await?;
    until(&hub.s, &running, "the plan's reply", || {
        hub.replies(pr.number, "judged the head again for homelab") == 1
    })
    .await?;
    running.shutdown().await;
    Ok(())
}

/// A signed delivery of `event`, as GitHub posts one.
async fn post_event(
    running: &Running,
    event: &str,
    delivery: &str,
    signature: Option<&str>,
    body: &str,
) -> Result<u16, Error> {
    use http_body_util::BodyExt;
    let mut req = http::Request::post(running.webhook_url().ok_or("no webhook listener")?)
        .header("x-github-event", event)
        .header("x-github-delivery", delivery)
        .header("content-type", "application/json");
    if let Some(sig) = signature {
        req = req.header("x-hub-signature-256", sig);
    }
    let req = req.body(http_body_util::Full::new(axum::body::Bytes::from(
        body.to_string(),
    )))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let resp = client.request(req).await?;
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    Ok(status)
}

async fn post_webhook(
    running: &Running,
    signature: Option<String>,
    body: &str,
) -> Result<u16, Error> {
    post_event(
        running,
        "pull_request",
        "forged-1",
        signature.as_deref(),
        body,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_webhooks_change_nothing_and_a_dropped_one_is_caught_up() -> TestResult {
    let hub = Hub::start().await?;
    let running = hub.run("a").await?;
    until(&hub.s, &running, "the first reconcile", || {
        running.ctx.metrics.total("ichor_reconciles_total") >= 1.0
    })
    .await?;
    // A forged delivery naming a PR head: refused before it is read.
    let head = hub.gh.pull_requests(REPO)?.len();
    assert_eq!(head, 0);
    let body = r#"{"action":"opened","number":1}"#;
    let forged = ichor::forge::webhook::sign(b"not-the-secret", body.as_bytes());
    assert_eq!(post_webhook(&running, Some(forged), body).await?, 401);
    assert_eq!(post_webhook(&running, None, body).await?, 401);
    let m = &running.ctx.metrics;
    assert_eq!(
        m.value(
            "ichor_webhook_deliveries_total",
            &[("result", "refused"), ("reason", "bad_signature")]
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "ichor_webhook_deliveries_total",
            &[("result", "refused"), ("reason", "missing_signature")]
        ),
        1.0
    );
    assert_eq!(m.total("ichor_gates_total"), 0.0);

    // GitHub drops the PR's webhook: the periodic reconcile finds the PR anyway.
    hub.gh.drop_next_webhooks(1);
    let pr = hub.open(GOOD).await?;
    until(&hub.s, &running, "the reconcile's verdict", || {
        is(
            &hub.status(&pr.head_sha, "ichor/gate"),
            StatusState::Success,
        )
    })
    .await?;
    assert!(hub
        .gh
        .deliveries()
        .iter()
        .any(|d| d.outcome == ichor::sim::github::DeliveryOutcome::Dropped));
    assert_eq!(
        m.value(
            "ichor_webhook_deliveries_total",
            &[("result", "accepted"), ("reason", "pull_request")]
        ),
        0.0,
        "no webhook told ichor about the PR"
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_one_acts() -> TestResult {
    let hub = Hub::start().await?;
    let a = hub.run("a").await?;
    let b = controller::start(hub.config("b")?, hub.s.twin.talos.clock().clone()).await?;
    until(&hub.s, &a, "both replicas' first reconcile", || {
        a.ctx.metrics.total("ichor_reconciles_total") >= 1.0
            && b.ctx.metrics.total("ichor_reconciles_total") >= 1.0
    })
    .await?;
    let leaders = a
        .ctx
        .metrics
        .value("ichor_leader", &[("cluster", "homelab")])
        + b.ctx
            .metrics
            .value("ichor_leader", &[("cluster", "homelab")]);
    assert_eq!(leaders, 1.0, "exactly one holds the cluster's lease");
    let pr = hub.open(GOOD).await?;
    // Both look at the PR (the webhook reaches one, a reconcile the other).
    b.ctx.events.send(controller::Event::Reconcile).await?;
    until(&hub.s, &a, "the verdict", || {
        is(
            &hub.status(&pr.head_sha, "ichor/gate"),
            StatusState::Success,
        )
    })
    .await?;
    a.ctx.events.send(controller::Event::Reconcile).await?;
    b.ctx.events.send(controller::Event::Reconcile).await?;
    let (ra, rb) = (
        a.ctx.metrics.total("ichor_reconciles_total"),
        b.ctx.metrics.total("ichor_reconciles_total"),
    );
    until(&hub.s, &a, "both to look again", || {
        a.ctx.metrics.total("ichor_reconciles_total") > ra
            && b.ctx.metrics.total("ichor_reconciles_total") > rb
    })
    .await?;
    let gates = a.ctx.metrics.total("ichor_gates_total") + b.ctx.metrics.total("ichor_gates_total");
    assert_eq!(gates, 1.0, "one replica judged, the other stood by");
    a.shutdown().await;
    b.shutdown().await;
    Ok(())
}

/// Read a child's stderr until a line contains `needle`; every line read is kept.
fn read_until(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    seen: &mut Vec<String>,
    needle: &str,
) -> Result<(), Error> {
    for l in lines {
        let l = l?;
        let hit = l.contains(needle);
        seen.push(l);
        if hit {
            return Ok(());
        }
    }
    Err(format!("ichor run ended before logging {needle:?}: {seen:#?}").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ichor_run_logs_json_never_a_secret_and_stops_cleanly_on_sigterm() -> TestResult {
    use std::io::BufRead;
    let hub = Hub::start().await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = hub.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        hub.config_text("proc", &format!("127.0.0.1:{port}")),
    )?;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(["run", "--config", &config.to_string_lossy()])
        .env("RUST_LOG", "debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let reader = tokio::task::spawn_blocking(move || {
        let mut lines = std::io::BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        read_until(&mut lines, &mut seen, "ichor run started").map_err(|e| e.to_string())?;
        Ok::<_, String>((lines, seen))
    });
    let (lines, mut seen) = reader.await??;
    hub.gh.set_webhook(Some(WebhookTarget {
        url: format!("http://127.0.0.1:{port}/webhook"),
        secret: SECRET.into(),
    }));
    let pr = hub.open(GOOD).await?;
    let reader = tokio::task::spawn_blocking(move || {
        let mut lines = lines;
        read_until(&mut lines, &mut seen, "gate verdict posted").map_err(|e| e.to_string())?;
        Ok::<_, String>((lines, seen))
    });
    let (lines, mut seen) = reader.await??;
    assert!(is(
        &hub.status(&pr.head_sha, "ichor/gate"),
        StatusState::Success
    ));
    // SIGTERM: the controller stops taking events and exits 0.
    let pid = i32::try_from(child.id())?;
    // SAFETY: signalling our own child, which is still running.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || child.wait()).await??;
    assert_eq!(status.code(), Some(0), "{seen:#?}");
    for l in lines {
        seen.push(l?);
    }
    assert!(
        seen.iter().any(|l| l.contains("ichor run stopped")),
        "{seen:#?}"
    );
    for l in &seen {
        // Not a terminal: one JSON object a line.
        let v: serde_json::Value = serde_json::from_str(l).map_err(|e| format!("{e}: {l}"))?;
        assert!(v.get("level").is_some(), "{l}");
        assert!(!l.contains(hub.gh.token()), "the token leaked: {l}");
        assert!(!l.contains(SECRET), "the webhook secret leaked: {l}");
    }
    Ok(())
}

/// Commit `edit` (find → replace in `path`) on main of a bare repository, as a push would.
/// A commit on top of `from` (a revision) that sets `path` to what `edit` makes of its
/// text (`None`: the file is new), moving `to` (a ref) there, as a push would.
pub fn commit_edit(
    repo: &git2::Repository,
    from: &str,
    to: &str,
    path: &str,
    edit: impl FnOnce(Option<&str>) -> String,
    message: &str,
) -> Result<git2::Oid, Error> {
    let base = repo.revparse_single(from)?.peel_to_commit()?;
    let old = match base.tree()?.get_path(Path::new(path)) {
        Ok(entry) => Some(String::from_utf8(
            repo.find_blob(entry.id())?.content().to_vec(),
        )?),
        Err(_) => None,
    };
    let new = repo.blob(edit(old.as_deref()).as_bytes())?;
    let mut b = git2::build::TreeUpdateBuilder::new();
    b.upsert(path, new, git2::FileMode::Blob);
    let tree = repo.find_tree(b.create_updated(repo, &base.tree()?)?)?;
    let sig = git2::Signature::now("Mara", "mara@homelab.example")?;
    let c = repo.commit(None, &sig, &sig, message, &tree, &[&base])?;
    repo.reference(to, c, true, message)?;
    Ok(c)
}

fn commit_on_main(
    repo: &git2::Repository,
    path: &str,
    find: &str,
    replace: &str,
    message: &str,
) -> Result<git2::Oid, Error> {
    commit_edit(
        repo,
        "main",
        "refs/heads/main",
        path,
        |text| {
            let text = text.unwrap_or_default();
            assert!(text.contains(find), "{path} has no {find:?}");
            text.replacen(find, replace, 1)
        },
        message,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_only_pauses_and_resumes_through_cluster_yaml() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let origin = origin(dir.path())?;
    let cfg = git_only_config(&s, &origin, &dir.path().join("ichor"))?;
    let running = controller::start(cfg, s.twin.talos.clock().clone()).await?;
    let repo = git2::Repository::open_bare(&origin)?;
    let m = running.ctx.metrics.clone();
    until(&s, &running, "the first reconcile", || {
        m.total("ichor_reconciles_total") >= 1.0
    })
    .await?;

    let cluster = "clusters/homelab/cluster.yaml";
    let pause = commit_on_main(
        &repo,
        cluster,
        "  rollout:\n",
        "  rollout:\n    paused: true\n",
        "Pause rollouts",
    )?;
    until(&s, &running, "the pause's acknowledgement", || {
        note_has(&origin, pause, RecordKind::Ack, "success")
    })
    .await?;
    let from = s.change.base_release_set.spec.talos.to_string();
    let to = s.change.head_release_set.spec.talos.to_string();
    let bump = commit_on_main(
        &repo,
        "clusters/homelab/release-set.yaml",
        &format!("talos: {from}"),
        &format!("talos: {to}"),
        "fix(deps): update talos",
    )?;
    let seen = m.total("ichor_reconciles_total");
    until(&s, &running, "a look at the bump", || {
        m.total("ichor_reconciles_total") > seen
    })
    .await?;
    let nodes = s.kube.nodes().await?;
    assert!(
        nodes
            .iter()
            .all(|n| n.talos.as_deref().unwrap_or("").trim_start_matches('v')
                == from.trim_start_matches('v')),
        "paused: nothing moved"
    );
    let homelab = running.ctx.cluster("homelab").ok_or("no cluster")?;
    assert!(!homelab.rolling(), "paused in Git: no rollout started");
    assert!(!note_has(&origin, bump, RecordKind::Rollout, "queued"));

    let resume = commit_on_main(&repo, cluster, "    paused: true\n", "", "Resume rollouts")?;
    until(&s, &running, "the resumed rollout's end", || {
        note_has(&origin, resume, RecordKind::Rollout, "completed")
    })
    .await?;
    let nodes = s.kube.nodes().await?;
    assert!(
        nodes
            .iter()
            .all(|n| n.talos.as_deref().unwrap_or("").trim_start_matches('v')
                == to.trim_start_matches('v')),
        "{nodes:?}"
    );
    running.shutdown().await;
    Ok(())
}

/// `gate.rehearse`: the verdict comes first and is never held back; then the PR's comment
/// gains one line saying how rehearsing its change under random faults went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_pr_is_rehearsed_after_its_verdict_and_its_comment_says_how_it_went() -> TestResult
{
    let hub = Hub::start().await?;
    let text = format!(
        "{}gate:\n  rehearse:\n    seeds: 1\n",
        hub.config_text("a", "127.0.0.1:0")
    );
    let running = controller::start(
        Config::parse("test-config.yaml", &text)?,
        hub.s.twin.talos.clock().clone(),
    )
    .await?;
    hub.gh.set_webhook(Some(WebhookTarget {
        url: running.webhook_url().ok_or("no webhook listener")?,
        secret: SECRET.into(),
    }));
    let good = hub.open(GOOD).await?;
    until(&hub.s, &running, "the verdict", || {
        is(
            &hub.status(&good.head_sha, "ichor/gate"),
            StatusState::Success,
        ) && hub.sticky(good.number).len() == 1
    })
    .await?;
    until(&hub.s, &running, "the rehearsal's line", || {
        hub.sticky(good.number)
            .join("")
            .contains("Rehearsed 1 time with random faults: 0 rules broken; makespan p50")
    })
    .await?;
    let body = hub.sticky(good.number).join("");
    assert_eq!(hub.sticky(good.number).len(), 1, "edited in place");
    assert!(
        body.contains("```mermaid"),
        "the plan is still there: {body}"
    );
    assert!(
        is(
            &hub.status(&good.head_sha, "ichor/gate"),
            StatusState::Success
        ),
        "the verdict is the gate's alone"
    );
    Ok(())
}
