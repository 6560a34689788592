//! Issue 43: what ichor says is what happens. The real binary against an in-process twin on
//! a scaled clock, from a GitOps repository the test commits to as a user would.

use std::path::Path;

use ichor::clock::Clock;
use ichor::gate::live;
use ichor::kube::KubeClient;
use ichor::rollout::record::{self, RecordState};
use ichor::sim::twin::{ClusterFolder, Twin, TwinOptions};
use serde_json::json;

use crate::homelab;

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Error = Box<dyn std::error::Error>;

const SPEED: f64 = 60.0;

/// `git -C dir args…` as a fixed author, failing on a non-zero exit.
fn git(dir: &Path, args: &[&str]) -> TestResult {
    let o = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Mara Lindqvist")
        .env("GIT_AUTHOR_EMAIL", "mara@homelab.example")
        .env("GIT_COMMITTER_NAME", "Mara Lindqvist")
        .env("GIT_COMMITTER_EMAIL", "mara@homelab.example")
        .output()?;
    if !o.status.success() {
        return Err(format!("git {args:?}: {}", crate::stderr(&o)).into());
    }
    Ok(())
}

/// Replace the one occurrence of `find` in `file` (under the clone) and commit it on main.
fn commit_edit(repo: &Path, file: &str, find: &str, replace: &str, message: &str) -> TestResult {
    let path = repo.join(file);
    let text = std::fs::read_to_string(&path)?;
    if text.matches(find).count() != 1 {
        return Err(format!("{file}: `{find}` is not there exactly once").into());
    }
    std::fs::write(&path, text.replacen(find, replace, 1))?;
    git(repo, &["commit", "-q", "-am", message])
}

/// Nodes whose Talos or kubelet is not `talos`/`kubelet`, as the twin itself has them.
fn off_target(twin: &Twin, talos: &str, kubelet: &str) -> Vec<String> {
    twin.talos
        .observe()
        .into_iter()
        .filter(|o| o.talos_version != talos || !o.kubelet_version.ends_with(kubelet))
        .map(|o| {
            format!(
                "{} (Talos {}, kubelet {})",
                o.name, o.talos_version, o.kubelet_version
            )
        })
        .collect()
}

struct Run {
    code: Option<i32>,
    out: String,
}

/// `ichor rollout --rev main --yes [extra]` on `repo` against the twin, at the twin's time.
async fn rollout(
    twin: &Twin,
    clock: &Clock,
    repo: &Path,
    home: &Path,
    extra: &[&str],
) -> Result<Run, Error> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ichor"));
    cmd.args(["rollout", "--repo"])
        .arg(repo)
        .args(["--rev", "main", "--yes"])
        .args(extra)
        .arg("--kubeconfig")
        .arg(twin.kubeconfig())
        .arg("--talosconfig")
        .arg(twin.talosconfig())
        .args([
            "--time-scale",
            &SPEED.to_string(),
            "--clock-start",
            &clock.now().rfc3339(),
        ])
        .env("HOME", home)
        .env("XDG_STATE_HOME", home.join("state"))
        .env_remove("KUBECONFIG")
        .env_remove("TALOSCONFIG")
        .stdin(std::process::Stdio::null());
    let o = tokio::task::spawn_blocking(move || cmd.output()).await??;
    Ok(Run {
        code: o.status.code(),
        out: format!("{}{}", crate::stdout(&o), crate::stderr(&o)),
    })
}

/// F1 and F2: a kubelet bump paused at its drains (emptyDir data the drain may not delete).
/// An unrelated commit on top, then `--resume --rev main`: the work is still what the nodes
/// run against the target, so it pauses again rather than saying "Done". The fix the pause
/// asks for, committed on main, then `--resume --rev main`: it takes effect and the rollout
/// ends with every node at the target. No run exits 0 while a node is off the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_on_a_newer_commit_ends_at_the_target_and_never_says_done_before() -> TestResult {
    let state = tempfile::tempdir()?;
    let repo = state.path().join("repo");
    let clone = std::process::Command::new("git")
        .args(["clone", "-q", "--branch", "main"])
        .arg(homelab())
        .arg(&repo)
        .output()?;
    if !clone.status.success() {
        return Err(format!("git clone: {}", crate::stderr(&clone)).into());
    }
    let cluster_yaml = "clusters/homelab/cluster.yaml";
    commit_edit(
        &repo,
        cluster_yaml,
        "deleteEmptyDirData: true",
        "deleteEmptyDirData: false",
        "rollout: keep emptyDir data on drains",
    )?;
    // The twin runs main as it is now; the window opens at the start.
    let dir = repo.join("clusters/homelab");
    let doc = ichor::releaseset::Cluster::parse(
        cluster_yaml,
        &std::fs::read_to_string(repo.join(cluster_yaml))?,
    )?;
    let start = ichor::rollout::window::next_open(
        &doc.spec.rollout.maintenance_windows,
        Clock::manual().now(),
    );
    let clock = Clock::scaled_at(SPEED, start)?;
    let twin = Twin::start(
        clock.clone(),
        &ClusterFolder::read(&dir)?,
        &state.path().join("state"),
        TwinOptions::default(),
    )
    .await?;
    let kube = KubeClient::connect(Some(twin.kubeconfig())).await?;
    let raw = {
        let kc = kube::config::Kubeconfig::read_from(twin.kubeconfig())?;
        kube::Client::try_from(
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
        )?
    };
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(raw);
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": live::ICHOR_NAMESPACE}}))?,
    )
    .await?;
    let home = state.path().join("home");
    std::fs::create_dir_all(&home)?;
    let (talos, kubelet) = ("v1.12.6", "v1.33.7");
    let release_set = "clusters/homelab/release-set.yaml";
    commit_edit(
        &repo,
        release_set,
        "kubernetes: v1.33.5",
        &format!("kubernetes: {kubelet}"),
        "fix(deps): update kubelet ( v1.33.5 → v1.33.7 )",
    )?;
    let never_done_early = |r: &Run, when: &str| {
        let off = off_target(&twin, talos, kubelet);
        assert!(
            r.code != Some(0) || off.is_empty(),
            "{when}: exit 0 with nodes off the target: {off:?}\n{}",
            r.out
        );
    };

    let first = rollout(&twin, &clock, &repo, &home, &[]).await?;
    never_done_early(&first, "the bump");
    assert_eq!(first.code, Some(3), "the bump pauses:\n{}", first.out);
    assert!(first.out.contains("emptyDir"), "{}", first.out);
    assert!(!off_target(&twin, talos, kubelet).is_empty());

    // F11: a resume of the same commit shows what is left, not the steps already done
    // (the control planes' components went before the workers' drains paused).
    let again = rollout(&twin, &clock, &repo, &home, &["--resume"]).await?;
    never_done_early(&again, "a resume of the same commit");
    assert_eq!(again.code, Some(3), "{}", again.out);
    assert!(
        first.out.contains("kube-apiserver on cp-1"),
        "{}",
        first.out
    );
    assert!(
        !again.out.contains("kube-apiserver on cp-1")
            && again.out.contains("an earlier run finished"),
        "{}",
        again.out
    );

    // An unrelated commit on top: the paused bump's work is still there.
    std::fs::write(repo.join("NOTES.md"), "What runs where.\n")?;
    git(&repo, &["add", "NOTES.md"])?;
    git(&repo, &["commit", "-q", "-m", "docs: notes on the homelab"])?;
    let second = rollout(&twin, &clock, &repo, &home, &["--resume"]).await?;
    never_done_early(&second, "a resume after an unrelated commit");
    assert_eq!(second.code, Some(3), "{}", second.out);
    assert!(second.out.contains("emptyDir"), "{}", second.out);
    let rec = record::load(&kube, "homelab")
        .await?
        .ok_or("no record")?
        .record;
    assert_eq!(rec.state, RecordState::Paused, "{:#?}", rec.history);

    // The remedy the pause names, committed on main, takes effect on the resume.
    commit_edit(
        &repo,
        cluster_yaml,
        "deleteEmptyDirData: false",
        "deleteEmptyDirData: true",
        "rollout: emptyDir data may go on drains",
    )?;
    let mut last = None;
    for _ in 0..3 {
        let r = rollout(&twin, &clock, &repo, &home, &["--resume"]).await?;
        never_done_early(&r, "the resume after the fix");
        let code = r.code;
        last = Some(r);
        // A pause other than the fixed one (a call past its deadline on a loaded machine) is
        // resumed as an operator would.
        if code != Some(3) {
            break;
        }
    }
    let last = last.ok_or("no run")?;
    assert_eq!(last.code, Some(0), "{}", last.out);
    assert!(last.out.contains("Done in"), "{}", last.out);
    assert_eq!(off_target(&twin, talos, kubelet), Vec::<String>::new());
    let rec = record::load(&kube, "homelab")
        .await?
        .ok_or("no record")?
        .record;
    assert_eq!(rec.state, RecordState::Completed);
    // F10: `ichor status` without --repo finds the record by its name.
    let twin_kubeconfig = twin.kubeconfig().to_path_buf();
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
            .args(["status", "--kubeconfig"])
            .arg(twin_kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("TALOSCONFIG")
            .output()
    })
    .await??;
    let out = crate::stdout(&status);
    assert_eq!(
        status.status.code(),
        Some(0),
        "{out}{}",
        crate::stderr(&status)
    );
    assert!(
        out.contains("homelab") && out.contains("Rollout to ") && out.contains("completed"),
        "{out}"
    );
    twin.shutdown().await;
    Ok(())
}

/// F1: "completed" only after verify saw every node at the target. A plan with nothing left
/// in it (a resume, a re-run) still verifies: run on a cluster that is not at the target, it
/// pauses at verify naming the nodes, and the record is not written `completed`.
#[tokio::test]
async fn a_plan_with_nothing_left_verifies_before_it_completes() -> TestResult {
    let mut s = crate::rollout::setup(ichor::sim::twin::TwinConfig::default()).await?;
    s.plan.stages.clear();
    let (outcome, seen, _) = crate::rollout::run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = crate::rollout::paused(outcome)?;
    assert_eq!(p.stage, "verify");
    assert!(
        p.reason.contains("not every node runs the target") && p.reason.contains("w-1"),
        "{}",
        p.reason
    );
    assert_eq!(s.record().await?.state, RecordState::Paused);
    Ok(())
}

/// A clone of the homelab fixture on `main`, under `dir`.
fn clone_homelab(dir: &Path) -> Result<std::path::PathBuf, Error> {
    let repo = dir.join("repo");
    let clone = std::process::Command::new("git")
        .args(["clone", "-q", "--branch", "main"])
        .arg(homelab())
        .arg(&repo)
        .output()?;
    if !clone.status.success() {
        return Err(format!("git clone: {}", crate::stderr(&clone)).into());
    }
    Ok(repo)
}

/// F12: a cluster.yaml broken on main does not make the PR that fixes it invalid: the PR is
/// judged with the head's cluster.yaml, and the verdict says so. A PR that leaves it broken
/// stays invalid.
#[test]
fn a_broken_cluster_yaml_on_main_does_not_block_its_own_fix() -> TestResult {
    let state = tempfile::tempdir()?;
    let repo = clone_homelab(state.path())?;
    let cluster_yaml = "clusters/homelab/cluster.yaml";
    commit_edit(
        &repo,
        cluster_yaml,
        "maxUnavailable: 1",
        "maxUnavailible: 1",
        "rollout: one at a time",
    )?;
    git(&repo, &["checkout", "-q", "-b", "fix"])?;
    commit_edit(
        &repo,
        cluster_yaml,
        "maxUnavailible: 1",
        "maxUnavailable: 1",
        "rollout: fix the key",
    )?;
    let path = repo.to_string_lossy().into_owned();
    let check = |head: &str| {
        crate::ichor(&[
            "check", "--repo", &path, "--base", "main", "--head", head, "--output", "json",
        ])
    };
    let o = check("fix");
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        crate::stdout(&o),
        crate::stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["outcome"], "pass", "{v:#}");
    let items = v["clusters"][0]["items"].as_array().ok_or("items")?;
    let item = items
        .iter()
        .find(|i| i["id"] == "cluster-settings")
        .ok_or_else(|| format!("no cluster-settings item: {v:#}"))?;
    assert_eq!(item["status"], "warn");
    let msg = item["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("does not load at the base revision")
            && msg.contains("for validity alone")
            && msg.contains("maxUnavailible"),
        "{msg}"
    );
    // A change that leaves it broken is still invalid, naming the head.
    git(&repo, &["checkout", "-q", "main"])?;
    git(&repo, &["checkout", "-q", "-b", "other"])?;
    commit_edit(
        &repo,
        cluster_yaml,
        "# How ichor reaches",
        "# How ichor reaches (and rolls)",
        "docs: a comment",
    )?;
    let o = check("other");
    assert_eq!(o.status.code(), Some(2), "{}", crate::stdout(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["outcome"], "invalid", "{v:#}");
    let error = v["clusters"][0]["error"].as_str().unwrap_or("");
    assert!(error.contains("maxUnavailible"), "{v:#}");
    Ok(())
}

/// F3: a PR opened while another holder had the controller lease is gated once this
/// replica takes the lease back, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pr_opened_while_the_lease_was_lost_is_gated_once_it_is_regained() -> TestResult {
    use crate::controller::{until, Hub};
    let hub = Hub::start().await?;
    let a = hub.run("a").await?;
    let leader = || {
        a.ctx
            .metrics
            .value("ichor_leader", &[("cluster", "homelab")])
    };
    until(&hub.s, &a, "the lease", || leader() == 1.0).await?;
    hub.s
        .post_faults(json!({"stealLease": {
            "namespace": live::ICHOR_NAMESPACE,
            "name": "ichor-controller-homelab",
            "holder": "someone-else"
        }}))
        .await?;
    until(&hub.s, &a, "the lease lost", || leader() == 0.0).await?;
    let pr = hub.open("renovate/talos").await?;
    let before = a.ctx.metrics.total("ichor_reconciles_total");
    a.ctx
        .events
        .send(ichor::controller::Event::Reconcile)
        .await?;
    until(&hub.s, &a, "a reconcile without the lease", || {
        a.ctx.metrics.total("ichor_reconciles_total") > before
    })
    .await?;
    assert!(
        hub.status(&pr.head_sha, "ichor/gate").is_none(),
        "gated without the lease"
    );
    // Nobody renews the stolen lease: it runs out, ichor takes it back, and the PR it saw
    // meanwhile is judged.
    until(&hub.s, &a, "the verdict once the lease is back", || {
        hub.status(&pr.head_sha, "ichor/gate").is_some()
    })
    .await?;
    assert_eq!(leader(), 1.0);
    a.shutdown().await;
    Ok(())
}

/// F13: a Calico twin runs its agent as Calico's manifests name it, where the gate and
/// `ichor status` look for it.
#[tokio::test]
async fn a_calico_twin_runs_calico_node_where_the_gate_looks() -> TestResult {
    let state = tempfile::tempdir()?;
    let repo = clone_homelab(state.path())?;
    let dir = repo.join("clusters/homelab");
    let rs = dir.join("release-set.yaml");
    let text = std::fs::read_to_string(&rs)?;
    std::fs::write(&rs, text.replacen("name: cilium", "name: calico", 1))?;
    let twin = Twin::start(
        Clock::manual(),
        &ClusterFolder::read(&dir)?,
        &state.path().join("state"),
        TwinOptions::default(),
    )
    .await?;
    let daemonsets: Vec<(String, String)> = twin.kube.with(|c, _| {
        c.list("daemonsets", None)
            .iter()
            .map(|d| {
                let f = |p: &str| {
                    d.pointer(p)
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_string()
                };
                (f("/metadata/namespace"), f("/metadata/name"))
            })
            .collect()
    });
    let found = live::cni_workload("calico")
        .iter()
        .any(|(ns, name)| daemonsets.contains(&(ns.to_string(), name.to_string())));
    assert!(found, "{daemonsets:?}");
    twin.shutdown().await;
    Ok(())
}

/// `ichor plan --output json` on `repo`: the one plan it shows.
fn plan_json(repo: &Path, head: &str, now: &str) -> Result<serde_json::Value, Error> {
    let o = crate::ichor(&[
        "plan",
        "--repo",
        &repo.to_string_lossy(),
        "--base",
        "main",
        "--head",
        head,
        "--now",
        now,
        "--output",
        "json",
    ]);
    if o.status.code() != Some(0) {
        return Err(format!("plan: {}", crate::stderr(&o)).into());
    }
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    Ok(v["plans"][0].clone())
}

fn at(text: &str) -> Result<ichor::clock::Timestamp, Error> {
    ichor::clock::Timestamp::parse_rfc3339(text).ok_or_else(|| format!("not a time: {text}").into())
}

/// F8: the plan lays its estimate on the calendar. Merged on a Tuesday, the homelab's
/// weekend window (sat, sun 06:00 for 6h) starts it on Saturday and it ends one estimate
/// later; inside the window it starts now. With a 5-minute window each step needs a window
/// of its own, and the plan says how many and when the last one ends.
#[test]
fn the_plan_says_when_the_window_opens_and_when_the_rollout_ends_on_the_calendar() -> TestResult {
    let tuesday = "2026-12-01T12:00:00Z";
    let p = plan_json(homelab(), "renovate/talos", tuesday)?;
    let s = &p["schedule"];
    assert_eq!(s["startsAt"], "2026-12-05T06:00:00Z", "{p:#}");
    let secs = p["estimateSecs"].as_u64().ok_or("estimateSecs")?;
    let ends = at(s["endsAt"].as_str().ok_or("endsAt")?)?;
    assert_eq!(
        ends,
        at("2026-12-05T06:00:00Z")?.plus(std::time::Duration::from_secs(secs))
    );
    assert_eq!(s["windows"], 1, "{p:#}");
    let o = crate::ichor(&[
        "plan",
        "--repo",
        &homelab().to_string_lossy(),
        "--base",
        "main",
        "--head",
        "renovate/talos",
        "--now",
        tuesday,
    ]);
    let text = crate::stdout(&o);
    assert!(
        text.contains("calendar: starts in the next maintenance window, Sat 06:00 UTC (2026-12-05T06:00:00Z); ends ≈ Sat ")
            && text.contains("needs 1 maintenance window\n"),
        "{text}"
    );
    let inside = plan_json(homelab(), "renovate/talos", "2026-12-05T07:00:00Z")?;
    assert_eq!(inside["schedule"]["startsAt"], "2026-12-05T07:00:00Z");

    // A 5-minute window: every step but verify starts in a window of its own, two a
    // weekend, so the rollout needs weeks.
    let dir = tempfile::tempdir()?;
    let repo = clone_homelab(dir.path())?;
    commit_edit(
        &repo,
        "clusters/homelab/cluster.yaml",
        "duration: 6h",
        "duration: 5m",
        "rollout: a 5-minute window",
    )?;
    git(&repo, &["checkout", "-q", "-b", "bump"])?;
    commit_edit(
        &repo,
        "clusters/homelab/release-set.yaml",
        "talos: v1.12.6",
        "talos: v1.12.9",
        "fix(deps): update talos ( v1.12.6 → v1.12.9 )",
    )?;
    let p = plan_json(&repo, "bump", tuesday)?;
    let steps: Vec<&serde_json::Value> = p["stages"]
        .as_array()
        .ok_or("stages")?
        .iter()
        .flat_map(|s| s["steps"].as_array().into_iter().flatten())
        .collect();
    let gated = steps.iter().filter(|s| s["kind"] != "verify").count();
    assert!(gated > 2, "{p:#}");
    let s = &p["schedule"];
    assert_eq!(s["windows"], gated, "{p:#}");
    assert_eq!(s["startsAt"], "2026-12-05T06:00:00Z", "{p:#}");
    // The last step's window is the gated-th of Saturdays and Sundays from 5 December.
    let weekend = (gated as u64 - 1) / 2;
    let last_window = at("2026-12-05T06:00:00Z")?.plus(std::time::Duration::from_secs(
        weekend * 7 * 86_400 + ((gated as u64 - 1) % 2) * 86_400,
    ));
    let ends = at(s["endsAt"].as_str().ok_or("endsAt")?)?;
    assert!(
        ends > last_window && ends < last_window.plus(std::time::Duration::from_secs(3600)),
        "{p:#}"
    );
    Ok(())
}

/// F8: `ichor rollout --dry-run` on a weekday says when the window opens before anything is
/// confirmed (the prompt carries the same sentence). F14: its plan lists the control planes
/// as the run takes them, etcd's leader last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_on_a_weekday_says_the_rollout_waits_for_the_window() -> TestResult {
    let state = tempfile::tempdir()?;
    let repo = clone_homelab(state.path())?;
    let dir = repo.join("clusters/homelab");
    let tuesday = at("2026-12-01T12:00:00Z")?;
    let clock = Clock::scaled_at(SPEED, tuesday)?;
    let twin = Twin::start(
        clock.clone(),
        &ClusterFolder::read(&dir)?,
        &state.path().join("state"),
        TwinOptions::default(),
    )
    .await?;
    commit_edit(
        &repo,
        "clusters/homelab/release-set.yaml",
        "kubernetes: v1.33.5",
        "kubernetes: v1.33.7",
        "fix(deps): update kubelet ( v1.33.5 → v1.33.7 )",
    )?;
    commit_edit(
        &repo,
        "clusters/homelab/release-set.yaml",
        "talos: v1.12.6",
        "talos: v1.12.9",
        "fix(deps): update talos ( v1.12.6 → v1.12.9 )",
    )?;
    let home = state.path().join("home");
    std::fs::create_dir_all(&home)?;
    let r = rollout(&twin, &clock, &repo, &home, &["--dry-run"]).await?;
    // F14: the control planes in the order the run takes them, etcd's leader last.
    let leader = twin
        .talos
        .observe()
        .into_iter()
        .find(|o| o.etcd_leader)
        .map(|o| o.name)
        .ok_or("no etcd leader")?;
    let cps: Vec<&str> = r
        .out
        .lines()
        .filter_map(|l| l.split("control plane ").nth(1))
        .filter(|rest| rest.contains("Talos"))
        .filter_map(|rest| rest.split(':').next())
        .collect();
    assert_eq!(cps.len(), 3, "{}", r.out);
    assert_eq!(cps.last().copied(), Some(leader.as_str()), "{}", r.out);
    assert_eq!(r.code, Some(0), "{}", r.out);
    assert!(
        r.out
            .contains("calendar: starts in the next maintenance window, Sat 06:00 UTC (2026-12-05T06:00:00Z); ends ≈ Sat "),
        "{}",
        r.out
    );
    assert!(r.out.contains("dry run: nothing was changed"), "{}", r.out);
    twin.shutdown().await;
    Ok(())
}

/// F6: Git-only mode pushes its verdicts as git notes into `repository.path`, and git
/// refuses a push into a repository with a work tree. `ichor run --check` (and the start)
/// refuse such a path, and one that is no repository, with the way out; a bare clone of it
/// is valid.
#[test]
fn git_only_mode_refuses_a_repository_path_it_could_never_publish_to() -> TestResult {
    let dir = tempfile::tempdir()?;
    let work_tree = clone_homelab(dir.path())?;
    let bare = dir.path().join("homelab.git");
    let clone = std::process::Command::new("git")
        .args(["clone", "-q", "--bare"])
        .arg(&work_tree)
        .arg(&bare)
        .output()?;
    if !clone.status.success() {
        return Err(format!("git clone --bare: {}", crate::stderr(&clone)).into());
    }
    let check = |repo: &Path| -> Result<std::process::Output, Error> {
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "repository:\n  path: {}\nclusters:\n  - name: homelab\n    act: false\nstateDir: {}\n",
                repo.display(),
                dir.path().join("state").display()
            ),
        )?;
        Ok(crate::ichor(&[
            "run",
            "--config",
            &config.to_string_lossy(),
            "--check",
        ]))
    };
    let o = check(&work_tree)?;
    assert_eq!(o.status.code(), Some(2), "{}", crate::stdout(&o));
    let err = crate::stderr(&o);
    assert!(
        err.contains("has a work tree")
            && err.contains("Git-only mode")
            && err.contains("git clone --bare"),
        "{err}"
    );
    let o = check(&dir.path().join("nowhere"))?;
    assert_eq!(o.status.code(), Some(2));
    assert!(
        crate::stderr(&o).contains("not a git repository"),
        "{}",
        crate::stderr(&o)
    );
    let o = check(&bare)?;
    assert_eq!(o.status.code(), Some(0), "{}", crate::stderr(&o));
    assert!(crate::stdout(&o).contains("valid (1 cluster, Git-only mode"));
    Ok(())
}
