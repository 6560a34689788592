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
    mut cond: impl FnMut() -> bool,
) -> TestResult {
    let mut activity = running.ctx.activity.subscribe();
    let wait = async {
        loop {
            if cond() {
                return;
            }
            if activity.changed().await.is_err() {
                return;
            }
        }
    };
    let bounded = tokio::time::timeout(Duration::from_secs(120), wait);
    tokio::select! {
        r = bounded => r.map_err(|_| format!("timed out waiting for {what}").into()),
        _ = s.twin.drive(Duration::from_secs(2), || {}) => unreachable!("the driver never ends"),
    }
}

/// A bare copy of the homelab fixture with every branch, for ichor to fetch from.
pub fn origin(dir: &Path) -> Result<PathBuf, Error> {
    Ok(ichor::sim::github::private_clone(homelab(), dir, "acme/homelab")?)
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
    assert!(log.contains("Notes (ichor):") && log.contains("\"kind\":\"gate\""), "{log}");

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
        nodes.iter().all(|n| n.kubelet.trim_start_matches('v') == want.trim_start_matches('v')),
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
    running.ctx.events.send(controller::Event::Reconcile).await?;
    until(&s, &running, "the command's ack", || {
        note_has(&origin, cmd, RecordKind::Ack, "success")
    })
    .await?;
    running.shutdown().await;
    Ok(())
}
