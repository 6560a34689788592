//! The rollout engine against the whole twin: the grouped bump end to end, the fault
//! matrix, pause and resume, windows and holds, and crash/resume at many points — with an
//! invariant checker fed by the twin's own state (not the engine's opinion of it) after
//! every tick of the clock.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use ichor::clock::Clock;
use ichor::gate::{self, live};
use ichor::kube::KubeClient;
use ichor::plan::PlanOptions;
use ichor::rehearse::Judge;
use ichor::rollout::record::{self, RecordState};
use ichor::rollout::{Progress, Rollout, RunOutcome, Target};
use ichor::sim::talos::Role;
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
use ichor::talos::TalosClient;
use serde_json::{json, Value};

use crate::homelab;

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Error = Box<dyn std::error::Error>;

/// What the twin itself says about safety at one instant: the rules `ichor rehearse`
/// judges (`ichor::rehearse::invariants`), with no fault injected to blame instead.
fn violations(twin: &Twin, max_unavailable: usize) -> Vec<String> {
    Judge::new(max_unavailable)
        .judge(twin)
        .into_iter()
        .map(|v| v.to_string())
        .collect()
}

pub struct Setup {
    pub twin: Twin,
    pub kube: KubeClient,
    pub talos: TalosClient,
    pub change: gate::Change,
    pub plan: ichor::plan::Plan,
    pub raw: kube::Client,
    _state: tempfile::TempDir,
}

impl Setup {
    pub fn doc(&self) -> &ichor::releaseset::Cluster {
        self.change
            .cluster_doc
            .as_ref()
            .expect("the fixture has a cluster.yaml")
    }

    pub fn target(&self) -> Target {
        let rs = &self.change.head_release_set.spec;
        Target {
            commit: self
                .change
                .head
                .commit
                .map(|c| c.to_string())
                .unwrap_or_default(),
            talos: rs.talos.clone(),
            kubernetes: rs.kubernetes.clone(),
        }
    }

    fn max_unavailable(&self) -> usize {
        self.doc().spec.rollout.max_unavailable.get() as usize
    }

    /// The engine as `ichor rollout` sets it up from cluster.yaml.
    pub fn engine<'a>(&'a self, report: &'a (dyn Fn(Progress) + Sync)) -> Rollout<'a> {
        let mut e = Rollout::new(
            &self.kube,
            &self.talos,
            self.twin.talos.clock().clone(),
            "homelab",
            "ichor-test",
        )
        .for_cluster(self.doc());
        e.report = Some(report);
        e
    }

    /// `namespace/name` of the homelab's first PodDisruptionBudget.
    pub fn first_pdb(&self) -> Result<String, Error> {
        let pdbs = self
            .twin
            .kube
            .with(|c, _| c.list("poddisruptionbudgets", None));
        let pdb = pdbs
            .first()
            .ok_or("the homelab has a PodDisruptionBudget")?;
        let field = |p: &str| {
            pdb.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        Ok(format!(
            "{}/{}",
            field("/metadata/namespace"),
            field("/metadata/name")
        ))
    }

    pub async fn post_faults(&self, body: Value) -> TestResult {
        let req = http::Request::post("/_twin/faults")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)?;
        self.raw.request_text(req).await?;
        Ok(())
    }

    pub async fn record(&self) -> Result<record::RolloutRecord, Error> {
        Ok(record::load(&self.kube, "homelab")
            .await?
            .ok_or("no rollout record")?
            .record)
    }
}

/// The twin running the homelab cluster as main describes it (its maintenance window just
/// opened), ichor's namespace created, and the plan of the fixture's grouped Talos +
/// Kubernetes PR from the live nodes.
pub async fn setup(config: TwinConfig) -> Result<Setup, Error> {
    setup_at(config, SetupFrom::default()).await
}

/// [`setup`] on a cluster whose `cluster.yaml` (what the twin builds) `edit` rewrote.
pub async fn setup_edited(
    config: TwinConfig,
    edit: &dyn Fn(&str) -> String,
) -> Result<Setup, Error> {
    setup_at(
        config,
        SetupFrom {
            edit: Some(edit),
            ..Default::default()
        },
    )
    .await
}

/// Where a set-up starts from other than the homelab's grouped PR at its window's opening.
#[derive(Default)]
struct SetupFrom<'a> {
    start: Option<ichor::clock::Timestamp>,
    edit: Option<&'a dyn Fn(&str) -> String>,
    /// Another repository and the branch of its PR (its `main` is the cluster now).
    repo: Option<(&'a std::path::Path, &'a str)>,
}

async fn setup_at(config: TwinConfig, from: SetupFrom<'_>) -> Result<Setup, Error> {
    let SetupFrom { start, edit, repo } = from;
    let state = tempfile::tempdir()?;
    let (repo, head) = repo.unwrap_or((homelab(), "renovate/talos"));
    let (change, dir, opens) = change_of(state.path(), repo, head)?;
    if let Some(edit) = edit {
        let path = dir.join("cluster.yaml");
        let text = std::fs::read_to_string(&path)?;
        std::fs::write(&path, edit(&text))?;
    }
    let start = start.unwrap_or(opens);
    let twin = Twin::start(
        Clock::manual_at(start),
        &ClusterFolder::read(&dir)?,
        &state.path().join("state"),
        TwinOptions {
            config,
            github: None,
        },
    )
    .await?;
    twin.advance(Duration::from_secs(30));
    let (kube, talos, raw) = ichor::rehearse::clients(&twin)
        .await
        .map_err(|e| -> Error { e.to_string().into() })?;
    // deploy/ creates ichor's namespace; the twin starts without it.
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(raw.clone());
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": live::ICHOR_NAMESPACE}}))?,
    )
    .await?;
    let live_nodes =
        live::live_nodes(&live::observe(&kube, Some(&talos), &live::Subject::of(&change)).await)
            .ok_or("no live nodes")?;
    let plan = gate::plan_with(&change, &PlanOptions::default(), Some(&live_nodes))?;
    Ok(Setup {
        twin,
        kube,
        talos,
        change,
        plan,
        raw,
        _state: state,
    })
}

/// The fixture's grouped PR, the homelab cluster folder as main describes it (written under
/// `state`), and when its maintenance window next opens.
fn homelab_change(
    state: &std::path::Path,
) -> Result<(gate::Change, std::path::PathBuf, ichor::clock::Timestamp), Error> {
    change_of(state, homelab(), "renovate/talos")
}

/// The PR on `head` of the repository at `repo`, its homelab folder as `main` describes it
/// (written under `state`), and when the maintenance window next opens.
fn change_of(
    state: &std::path::Path,
    repo: &std::path::Path,
    head: &str,
) -> Result<(gate::Change, std::path::PathBuf, ichor::clock::Timestamp), Error> {
    let repo = ichor::git::Repo::open(repo)?;
    let change = gate::load(&repo, "main", head, None)?;
    let dir = state.join("homelab");
    std::fs::create_dir_all(&dir)?;
    let main = repo.resolve("main")?;
    for f in ["cluster.yaml", "release-set.yaml"] {
        let text = repo
            .read_file(&main, &format!("clusters/homelab/{f}"))?
            .ok_or("missing")?;
        std::fs::write(dir.join(f), text)?;
    }
    let windows = change
        .cluster_doc
        .as_ref()
        .map(|d| d.spec.rollout.maintenance_windows.clone())
        .unwrap_or_default();
    let opens = ichor::rollout::window::next_open(&windows, Clock::manual().now());
    Ok((change, dir, opens))
}

/// The plan made again from the live nodes with `opts` (as `ichor rollout` would with its
/// flags).
async fn replan(s: &mut Setup, opts: &PlanOptions) -> TestResult {
    let facts = live::observe(&s.kube, Some(&s.talos), &live::Subject::of(&s.change)).await;
    let nodes = live::live_nodes(&facts).ok_or("no live nodes")?;
    s.plan = gate::plan_with(&s.change, opts, Some(&nodes))?;
    Ok(())
}

/// One run to its completion with no invariant broken: the stages in the order they ran,
/// and every line said.
async fn completed(s: &Setup) -> Result<(Vec<String>, Vec<String>), Error> {
    let (outcome, seen, lines) = run_once(s, false).await?;
    assert_eq!(seen, Vec::<String>::new(), "invariants broken");
    let RunOutcome::Completed { stages } = outcome else {
        return Err(format!(
            "expected completion, got {outcome:?}\n{}",
            lines.all().join("\n")
        )
        .into());
    };
    Ok((stages.into_iter().map(|(s, _)| s).collect(), lines.all()))
}

/// Progress as lines, for assertions.
#[derive(Default)]
pub struct Lines(Mutex<Vec<String>>);

impl Lines {
    pub fn push(&self, p: Progress) {
        if std::env::var_os("ICHOR_TEST_ECHO").is_some() {
            eprintln!("[progress] {p}");
        }
        if let Ok(mut l) = self.0.lock() {
            l.push(p.to_string());
        }
    }
    pub fn all(&self) -> Vec<String> {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }
    pub fn any(&self, needle: &str) -> bool {
        self.all().iter().any(|l| l.contains(needle))
    }
}

/// Simulated time after which a test's rollout counts as never ending (the longest one,
/// waiting for a maintenance window, takes under a simulated day).
pub const NEVER_ENDING: Duration = Duration::from_secs(12 * 3600);

/// A rollout that did not end: what its record last said, so the failure says why.
pub async fn never_ended(s: &Setup) -> Error {
    let said = match s.record().await {
        Ok(r) => {
            let tail: Vec<String> = r
                .history
                .iter()
                .rev()
                .take(40)
                .rev()
                .map(|h| format!("  {} {}", h.at, h.message))
                .collect();
            format!("waiting: {:?}\n{}", r.waiting, tail.join("\n"))
        }
        Err(e) => format!("(no record: {e})"),
    };
    format!(
        "the rollout did not end within {} simulated hours; its record:\n{said}",
        NEVER_ENDING.as_secs() / 3600
    )
    .into()
}

/// Run `engine` to its end while the twin's clock moves, checking the invariants after
/// every tick.
pub async fn run_checked(
    s: &Setup,
    engine: &Rollout<'_>,
    resume: bool,
) -> Result<(RunOutcome, Vec<String>), Error> {
    let seen = RefCell::new(Vec::<String>::new());
    let max = s.max_unavailable();
    let target = s.target();
    let outcome = tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), resume) => r?,
        _ = s.twin.drive(Duration::from_secs(2), || seen.borrow_mut().extend(violations(&s.twin, max))) => unreachable!("the driver never ends"),
        _ = s.twin.clock.sleep(NEVER_ENDING) => return Err(never_ended(s).await),
    };
    let mut seen = seen.into_inner();
    seen.sort();
    seen.dedup();
    Ok((outcome, seen))
}

/// Run `engine` to its end with the clock moving while `side` (a fix or a check made at the
/// right moment) runs alongside it; `side`'s result, when it finished.
pub async fn run_alongside<T>(
    s: &Setup,
    engine: &Rollout<'_>,
    side: impl std::future::Future<Output = T>,
) -> Result<(RunOutcome, Option<T>), Error> {
    run_alongside_as(s, engine, false, side).await
}

/// [`run_alongside`], resuming a paused rollout when `resume`.
pub async fn run_alongside_as<T>(
    s: &Setup,
    engine: &Rollout<'_>,
    resume: bool,
    side: impl std::future::Future<Output = T>,
) -> Result<(RunOutcome, Option<T>), Error> {
    let target = s.target();
    let run = engine.run(&s.plan, &target, Some(&s.change), resume);
    let limit = s.twin.clock.sleep(NEVER_ENDING);
    tokio::pin!(run);
    tokio::pin!(side);
    tokio::pin!(limit);
    let mut out = None;
    let outcome = loop {
        tokio::select! {
            r = &mut run => break r?,
            v = &mut side, if out.is_none() => out = Some(v),
            _ = s.twin.drive(Duration::from_secs(2), || {}) => unreachable!("the driver never ends"),
            _ = &mut limit => return Err(never_ended(s).await),
        }
    };
    Ok((outcome, out))
}

pub async fn run_once(s: &Setup, resume: bool) -> Result<(RunOutcome, Vec<String>, Lines), Error> {
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let engine = s.engine(&report);
    let (o, seen) = run_checked(s, &engine, resume).await?;
    drop(engine);
    Ok((o, seen, lines))
}

pub fn paused(o: RunOutcome) -> Result<ichor::rollout::record::Pause, Error> {
    match o {
        RunOutcome::Paused(p) => Ok(p),
        other => Err(format!("expected a pause, got {other:?}").into()),
    }
}

/// Every node on the target, Ready, uncordoned, the lock released.
pub async fn assert_finished(s: &Setup) -> TestResult {
    let target = s.target();
    let (talos, kubernetes) = (target.talos.to_string(), target.kubernetes.to_string());
    for o in s.twin.talos.observe() {
        assert_eq!(o.talos_version, talos, "{} Talos", o.name);
        assert!(
            o.kubelet_version.ends_with(&kubernetes),
            "{} kubelet {}",
            o.name,
            o.kubelet_version
        );
        for p in &o.static_pods {
            assert!(
                p.image.ends_with(&format!(":{kubernetes}")) && p.ready,
                "{}: {p:?}",
                o.name
            );
        }
    }
    for n in s.kube.nodes().await? {
        assert!(!n.cordoned && n.ready, "{} cordoned or not Ready", n.name);
    }
    assert_eq!(
        s.kube
            .lease_holder(live::ICHOR_NAMESPACE, "ichor-rollout-homelab")
            .await?,
        None,
        "the lock is released"
    );
    Ok(())
}

/// Issue 19 item 1: a bump moving Talos and Kubernetes disrupts each worker once. Control
/// planes go through Talos one at a time, then the Kubernetes stages, then every worker is
/// cordoned and drained once for its kubelet switch and its Talos reboot together.
#[tokio::test]
async fn the_grouped_bump_drains_each_worker_once_without_breaking_an_invariant() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let (order, all) = completed(&s).await?;
    let any = |needle: &str| all.iter().any(|l| l.contains(needle));
    assert_eq!(
        order,
        [
            "talos",
            "kube-apiserver",
            "kube-controller-manager-scheduler",
            "kube-proxy-manifests",
            "kubelet",
            "workers",
            "verify"
        ]
    );
    assert_finished(&s).await?;
    let pos = |needle: &str| {
        all.iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in {all:#?}"))
    };
    // One control plane at a time, the etcd leader last.
    let mut cps: Vec<&str> = vec!["cp-1", "cp-2", "cp-3"];
    cps.sort_by_key(|cp| pos(&format!("talos {cp}: cordoned")));
    for pair in cps.windows(2) {
        assert!(
            pos(&format!("talos {}: on", pair[0])) < pos(&format!("talos {}: cordoned", pair[1])),
            "{pair:?} overlap"
        );
    }
    // Every apiserver before any kubelet; the control planes' kubelets before any worker.
    assert!(pos("kube-apiserver cp-3: on") < pos("kubelet cp-1: on"));
    assert!(pos("bootstrap manifests") < pos("kubelet cp-1: on"));
    let first_worker = all
        .iter()
        .position(|l| l.starts_with("worker w-") && l.ends_with(": cordoned"))
        .ok_or("no worker cordoned")?;
    for cp in ["cp-1", "cp-2", "cp-3"] {
        assert!(pos(&format!("kubelet {cp}: on")) < first_worker);
    }
    // Each worker: cordoned exactly once, its kubelet switched and its Talos upgraded
    // inside that one window, then given back on both versions.
    for w in ["w-1", "w-2", "w-3"] {
        let cordons: Vec<&String> = all
            .iter()
            .filter(|l| l.ends_with(&format!("{w}: cordoned")))
            .collect();
        assert_eq!(cordons, [&format!("worker {w}: cordoned")], "{all:#?}");
        let cordoned = pos(&format!("worker {w}: cordoned"));
        let switched = pos(&format!("kubelet {w}: switched to v1.33.7"));
        let requested = pos(&format!("worker {w}: upgrade to v1.12.9 requested"));
        let back = pos(&format!(
            "worker {w}: on Talos v1.12.9 and kubelet v1.33.7, Ready, back in service"
        ));
        assert!(cordoned < switched && switched < requested && requested < back);
        assert!(!any(&format!("talos {w}:")), "{w} in the Talos stage");
        // The installer was pulled ahead, while the control planes went.
        let pulled = pos(&format!("worker {w}: pre-pulled"));
        assert!(pulled < first_worker && all[pulled].ends_with("ahead of its turn"));
    }
    assert!(any("the installer is pulled ahead on"), "{all:#?}");
    // Longhorn replicas were waited for before a node went back.
    assert!(any("waiting for the replicas of"), "{all:#?}");
    // The record says so.
    let rec = s.record().await?;
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.target, s.target().to_ref());
    assert!(rec.steps.contains_key("talos/cp-2") && rec.steps.contains_key("worker/w-2"));
    assert!(!rec.steps.contains_key("talos/w-2") && !rec.steps.contains_key("kubelet/w-2"));
    // A second run finds everything done from what it observes, and changes nothing.
    let (again, seen, lines) = run_once(&s, false).await?;
    assert!(matches!(again, RunOutcome::Completed { .. }), "{again:?}");
    assert!(seen.is_empty());
    assert!(!lines.any("cordoned"), "{:#?}", lines.all());
    Ok(())
}

/// `--two-pass` (`spec.rollout.twoPass`) keeps the order of two drains per worker: every
/// node's Talos first, then the Kubernetes stages with each worker's kubelet.
#[tokio::test]
async fn two_pass_rolls_talos_then_kubernetes_without_breaking_an_invariant() -> TestResult {
    let mut s = setup(TwinConfig::default()).await?;
    let opts = PlanOptions {
        two_pass: true,
        ..PlanOptions::default()
    };
    replan(&mut s, &opts).await?;
    let (order, all) = completed(&s).await?;
    let any = |needle: &str| all.iter().any(|l| l.contains(needle));
    assert_eq!(
        order,
        [
            "talos",
            "kube-apiserver",
            "kube-controller-manager-scheduler",
            "kube-proxy-manifests",
            "kubelet",
            "verify"
        ]
    );
    assert_finished(&s).await?;
    let pos = |needle: &str| {
        all.iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in {all:#?}"))
    };
    assert!(
        pos("talos cp-3: on") < pos("talos w-1: cordoned")
            || pos("talos cp-1: on") < pos("talos w-1: cordoned")
    );
    // Issue 19 item 2: the installer is pulled ahead (4 nodes at a time, before the first
    // node goes down), so a worker's turn never waits on its pull.
    for o in s.twin.talos.observe() {
        let i = pos(&format!("talos {}: pre-pulled", o.name));
        assert!(
            i < pos(&format!("talos {}: cordoned", o.name)),
            "{}",
            all[i]
        );
        if o.name.starts_with("w-") {
            assert!(all[i].ends_with("ahead of its turn"), "{}", all[i]);
        }
    }
    assert!(pos("kube-apiserver cp-3: on") < pos("kubelet cp-1: on"));
    assert!(pos("kubelet cp-3: on") < pos("kubelet w-1: on"));
    assert!(pos("bootstrap manifests") < pos("kubelet cp-1: on"));
    // Two drains per worker: one for Talos, one for the kubelet.
    for w in ["w-1", "w-2", "w-3"] {
        assert!(any(&format!("talos {w}: cordoned")));
        assert!(any(&format!("kubelet {w}: cordoned")));
    }
    let rec = s.record().await?;
    assert!(rec.steps.contains_key("talos/w-2") && rec.steps.contains_key("kubelet/w-3"));
    // The pulls ahead are recorded, a batch per write, before any step begins: no node's
    // own step pulls again (its pull would be said without "ahead of its turn").
    for o in s.twin.talos.observe() {
        let step = rec.steps.get(&format!("talos/{}", o.name));
        assert!(step.is_some_and(|m| m.pre_pulled), "{}: {step:?}", o.name);
        let pulls: Vec<&String> = all
            .iter()
            .filter(|l| l.contains(&format!("talos {}: pre-pulled", o.name)))
            .collect();
        assert_eq!(pulls.len(), 1, "{pulls:#?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_failing_installer_pull_pauses_before_anything_is_disrupted_and_resume_finishes(
) -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let installer = format!(
        "{}:v1.12.9",
        s.doc().spec.talos.installer_image.clone().ok_or("image")?
    );
    s.post_faults(json!({"failingImages": [installer]})).await?;
    let (outcome, seen, _) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    // The first control plane to go (not the etcd leader, which goes last).
    assert!(
        p.node.as_deref().is_some_and(|n| n.starts_with("cp-")),
        "{p:?}"
    );
    assert!(
        p.reason.contains("pre-pulling") && p.reason.contains("nothing was disrupted"),
        "{}",
        p.reason
    );
    for n in s.kube.nodes().await? {
        assert!(!n.cordoned && n.ready, "{} was disrupted", n.name);
    }
    // The record keeps the pause; a run without --resume does not continue it.
    let rec = s.record().await?;
    assert_eq!(rec.state, RecordState::Paused);
    assert_eq!(
        rec.pause.as_ref().map(|p| p.reason.clone()),
        Some(p.reason.clone())
    );
    let (again, _, lines) = run_once(&s, false).await?;
    assert_eq!(paused(again)?.reason, p.reason);
    assert!(!lines.any("pre-pulled"));
    // Fixed, then resumed: it finishes.
    s.post_faults(json!({"failingImages": []})).await?;
    let (outcome, seen, _) = run_once(&s, true).await?;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    assert_finished(&s).await?;
    let rec = s.record().await?;
    assert!(
        rec.history.iter().any(|h| h.message == "resumed"),
        "{:?}",
        rec.history
    );
    Ok(())
}

#[tokio::test]
async fn a_node_that_never_returns_pauses_and_the_others_run_at_full_capacity() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.nodes_never_return = vec!["w-2".into()];
    let s = setup(config).await?;
    let (outcome, seen, _) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    assert_eq!(p.node.as_deref(), Some("w-2"));
    assert_eq!(p.stage, "workers");
    assert!(p.reason.contains("not have come back"), "{}", p.reason);
    for o in s.twin.talos.observe() {
        let want = match o.name.as_str() {
            "w-2" | "w-3" => "v1.12.6",
            _ => "v1.12.9",
        };
        assert_eq!(o.talos_version, want, "{}", o.name);
    }
    for n in s.kube.nodes().await? {
        if n.name != "w-2" {
            assert!(!n.cordoned, "{} left cordoned", n.name);
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_pdb_that_never_allows_pauses_naming_the_pod_and_the_budget() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let name = s.first_pdb()?;
    s.post_faults(json!({"pdbsNeverAllow": [name]})).await?;
    let (outcome, seen, _) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    assert!(
        p.reason.contains("PodDisruptionBudget") && p.reason.contains(&name),
        "{}",
        p.reason
    );
    assert!(p.reason.contains("never deletes or forces"), "{}", p.reason);
    // The node was drained as far as it could be, then given back.
    for n in s.kube.nodes().await? {
        assert!(!n.cordoned, "{} left cordoned", n.name);
    }
    Ok(())
}

#[tokio::test]
async fn an_unhealthy_etcd_member_pauses_before_a_control_plane_goes_down() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.etcd_unhealthy = vec!["cp-3".into()];
    let s = setup(config).await?;
    let (outcome, seen, _) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    // The start waits on it (reported), then pauses with nothing changed.
    assert!(
        p.reason.contains("cp-3") && p.reason.contains("etcdserver: no leader"),
        "{}",
        p.reason
    );
    for o in s.twin.talos.observe() {
        assert_eq!(o.talos_version, "v1.12.6", "{} moved", o.name);
        assert!(o.up, "{} went down", o.name);
    }
    Ok(())
}

#[tokio::test]
async fn a_node_back_on_the_wrong_version_pauses() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.wrong_version = [("w-1".to_string(), "v1.12.6".to_string())].into();
    let s = setup(config).await?;
    let (outcome, seen, _) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    assert_eq!(p.node.as_deref(), Some("w-1"));
    assert!(p.reason.contains("did not take"), "{}", p.reason);
    Ok(())
}

#[tokio::test]
async fn a_replica_that_never_rebuilds_pauses_before_the_node_is_given_back() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let volumes = s.kube.longhorn_volumes().await?;
    let v = volumes.first().ok_or("the homelab has Longhorn volumes")?;
    s.post_faults(json!({"replicasNeverRebuild": [v.name]}))
        .await?;
    let (outcome, seen, _) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    assert!(
        p.reason.contains(&v.name) && p.reason.contains("has not rebuilt"),
        "{}",
        p.reason
    );
    // The checker above saw no second holder of it go down meanwhile.
    Ok(())
}

#[tokio::test]
async fn api_error_bursts_are_waited_out() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let engine = s.engine(&report);
    let seen = RefCell::new(Vec::<String>::new());
    let target = s.target();
    let max = s.max_unavailable();
    let burst = async {
        // A burst of 500s, later one of 429s, while the rollout runs.
        for (count, status) in [(25, 500), (25, 429)] {
            for _ in 0..40 {
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let _ = s
                .post_faults(json!({"apiErrorBurst": {"count": count, "status": status, "retryAfter": "1s"}}))
                .await;
        }
        std::future::pending::<()>().await
    };
    let outcome = tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => r?,
        _ = s.twin.drive(Duration::from_secs(2), || seen.borrow_mut().extend(violations(&s.twin, max))) => unreachable!(),
        _ = burst => unreachable!(),
    };
    assert!(seen.into_inner().is_empty());
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    assert_finished(&s).await?;
    Ok(())
}

#[tokio::test]
async fn a_stolen_lock_stops_every_action_at_once() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let lines = Lines::default();
    let notify = tokio::sync::Notify::new();
    let report = |p: Progress| {
        if p.to_string().contains("talos cp-2: cordoned") {
            notify.notify_one();
        }
        lines.push(p);
    };
    let engine = s.engine(&report);
    let target = s.target();
    let thief = async {
        notify.notified().await;
        let _ = s
            .post_faults(json!({"stealLease": {"namespace": live::ICHOR_NAMESPACE, "name": "ichor-rollout-homelab", "holder": "someone-else"}}))
            .await;
        std::future::pending::<()>().await
    };
    let outcome = tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => r?,
        _ = s.twin.drive(Duration::from_secs(2), || {}) => unreachable!(),
        _ = thief => unreachable!(),
    };
    // A refusal, not a pause: the controller tries again once the lock is free.
    let RunOutcome::Refused(why) = outcome else {
        return Err(format!("expected a refusal, got {outcome:?}").into());
    };
    assert!(
        why.contains("someone-else")
            && why.contains("stopped")
            && why.contains("once the lock is free"),
        "{why}"
    );
    // cp-2 was the last node touched: no later node was acted on (its installer pulled
    // ahead, before anything went down, acts on nothing).
    let all = lines.all();
    assert!(
        !all.iter()
            .any(|l| l.contains("cp-3") && !l.ends_with("ahead of its turn")),
        "{all:#?}"
    );
    assert_eq!(
        s.kube
            .lease_holder(live::ICHOR_NAMESPACE, "ichor-rollout-homelab")
            .await?
            .map(|l| l.holder),
        Some("someone-else".into()),
        "the lock stays with its new holder"
    );
    Ok(())
}

#[tokio::test]
async fn a_slow_apply_past_its_deadline_pauses_and_resume_finishes() -> TestResult {
    // Only Kubernetes moves here: the Talos stage is done first, then cp-2's apply hangs.
    let s = setup(TwinConfig::default()).await?;
    s.post_faults(json!({"slowApply": {"cp-2": "10m"}})).await?;
    let (outcome, seen, _) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    assert_eq!(p.node.as_deref(), Some("cp-2"));
    assert_eq!(p.stage, "kube-apiserver");
    assert!(
        p.reason.contains("deadline") || p.reason.contains("no answer"),
        "{}",
        p.reason
    );
    s.post_faults(json!({"slowApply": {}})).await?;
    let (outcome, seen, _) = run_once(&s, true).await?;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    assert_finished(&s).await?;
    Ok(())
}

#[tokio::test]
async fn no_node_starts_outside_a_maintenance_window() -> TestResult {
    // Saturday 05:50: the window (sat, sun 06:00 for 6h) opens in ten minutes.
    let before = ichor::clock::Timestamp::parse_rfc3339("2026-01-03T05:50:00Z").ok_or("date")?;
    let s = setup_at(
        TwinConfig::default(),
        SetupFrom {
            start: Some(before),
            ..Default::default()
        },
    )
    .await?;
    let (outcome, seen, lines) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    assert!(
        lines.any("starts in the next maintenance window, Sat 06:00 UTC"),
        "{:#?}",
        lines.all()
    );
    // The engine's ETA knows the windows (issue 43 F8): its end carries the date.
    assert!(lines.any("done, ends ≈ 2026-01-03 "), "{:#?}", lines.all());
    let opens = ichor::clock::Timestamp::parse_rfc3339("2026-01-03T06:00:00Z").ok_or("date")?;
    for (key, step) in s.record().await?.steps {
        let at = step
            .started_at
            .as_deref()
            .and_then(ichor::clock::Timestamp::parse_rfc3339);
        assert!(
            at.is_some_and(|t| t >= opens),
            "{key} started at {:?}",
            step.started_at
        );
    }
    Ok(())
}

/// Hold `node` with `reason` (ichor's hold annotation), or let it go (`None`).
pub async fn hold(s: &Setup, node: &str, reason: Option<&str>) -> Result<(), kube::Error> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(s.raw.clone());
    let patch = json!({"metadata": {"annotations": {ichor::kube::HOLD: reason}}});
    nodes
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .map(|_| ())
}

#[tokio::test]
async fn a_held_node_is_waited_on_and_the_wait_is_reported() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    hold(&s, "w-2", Some("backup running")).await?;
    let lines = Lines::default();
    let notify = tokio::sync::Notify::new();
    let report = |p: Progress| {
        if matches!(&p, Progress::Waiting(w) if w.contains("w-2 is held")) {
            notify.notify_one();
        }
        lines.push(p);
    };
    let engine = s.engine(&report);
    let release = async {
        // While held, the record says what the rollout waits on. Other workers starting
        // clear the wait and a later look says it again (each time heard), so the record
        // is read at each saying until it is caught holding it; once every other worker is
        // done it holds it for good, so this ends without depending on timing.
        let mut waiting = None;
        for _ in 0..1000 {
            notify.notified().await;
            let rec = s.record().await.ok();
            waiting = rec.and_then(|r| r.waiting);
            if waiting
                .as_deref()
                .is_some_and(|w| w.contains("w-2 is held"))
            {
                break;
            }
        }
        let _ = hold(&s, "w-2", None).await;
        waiting
    };
    let (outcome, waiting) = run_alongside(&s, &engine, release).await?;
    let waiting = waiting.flatten();
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    let waiting = waiting.ok_or("no waiting in the record")?;
    assert!(waiting.contains("backup running"), "{waiting}");
    Ok(())
}

/// A step's start records the boot id the node runs once its start is granted: a node
/// rebooted by someone while it was held starts from its new boot. A boot id kept from
/// before the wait would read as "rebooted" before the upgrade had rebooted it, and the
/// step would pause on a fallback that never happened.
#[tokio::test]
async fn a_node_rebooted_while_held_starts_from_its_new_boot() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    hold(&s, "cp-2", Some("console work")).await?;
    let lines = Lines::default();
    let notify = tokio::sync::Notify::new();
    let report = |p: Progress| {
        if matches!(&p, Progress::Waiting(w) if w.contains("cp-2 is held")) {
            notify.notify_one();
        }
        lines.push(p);
    };
    let engine = s.engine(&report);
    let boot_of = |name: &str| {
        s.twin
            .talos
            .observe()
            .into_iter()
            .find(|o| o.name == name)
            .map(|o| (o.up, o.boot_id))
    };
    let release = async {
        notify.notified().await;
        let before = boot_of("cp-2");
        let rebooted = s
            .twin
            .talos
            .with_model(|m| m.find("cp-2").map(|i| m.reboot(i).is_ok()));
        // Back up on a new boot (time moves with the clock) before the hold goes.
        for _ in 0..100 {
            s.twin.clock.sleep(Duration::from_secs(30)).await;
            if boot_of("cp-2")
                .is_some_and(|(up, b)| up && Some(&b) != before.as_ref().map(|x| &x.1))
            {
                break;
            }
        }
        let after = boot_of("cp-2");
        let _ = hold(&s, "cp-2", None).await;
        (rebooted, before, after)
    };
    let (outcome, side) = run_alongside(&s, &engine, release).await?;
    let (rebooted, before, after) = side.ok_or("the hold was never reported")?;
    assert_eq!(rebooted, Some(true));
    assert!(
        before.as_ref().map(|b| &b.1) != after.as_ref().map(|a| &a.1)
            && after.as_ref().is_some_and(|a| a.0),
        "cp-2 came back on a new boot: {before:?} → {after:?}"
    );
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    Ok(())
}

#[tokio::test]
async fn paused_in_cluster_yaml_stops_before_the_next_node() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let pause = || Some("paused in cluster.yaml (spec.rollout.paused: true)".to_string());
    let mut engine = s.engine(&report);
    engine.pause_requested = Some(&pause);
    let (outcome, _) = run_checked(&s, &engine, false).await?;
    let p = paused(outcome)?;
    assert!(p.reason.contains("spec.rollout.paused"), "{}", p.reason);
    for o in s.twin.talos.observe() {
        assert_eq!(o.talos_version, "v1.12.6");
    }
    Ok(())
}

/// Kill the engine (drop its task) at every progress line and every few ticks mid-step,
/// restarting it each time, until `covered` says the distinct points reached are enough (or
/// 400 kills); then let it finish. Asserts that no invariant broke at any tick and that the
/// last run completed; returns the points ("after <line>" for a kill at the first new line,
/// "mid-step after <line>" for one a few ticks in).
async fn killed_and_resumed(
    s: &Setup,
    covered: &dyn Fn(&BTreeSet<String>) -> bool,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<BTreeSet<String>, Error> {
    let max = s.max_unavailable();
    let target = s.target();
    let mut seen: Vec<String> = Vec::new();
    let mut points: BTreeSet<String> = BTreeSet::new();
    let mut kills = 0usize;
    let known: RefCell<BTreeSet<String>> = RefCell::new(BTreeSet::new());
    let (outcome, last_said) = loop {
        let said = Mutex::new(Vec::<String>::new());
        let notify = tokio::sync::Notify::new();
        let report = |p: Progress| {
            if let Ok(mut l) = said.lock() {
                l.push(p.to_string());
            }
            notify.notify_one();
        };
        let engine = s.engine(&report);
        // Odd incarnations die at their first new line (a step boundary), even ones after
        // a few ticks (mid-step: a drain, a reboot, a verification).
        let mid_step = kills % 2 == 1;
        let ticks = RefCell::new(0u32);
        // A wanted line said for the first time is a kill point whichever way this
        // incarnation was to die: where a mid-step kill lands depends on timing, and a
        // wanted boundary must not be passed over on a loaded machine.
        let at_wanted = RefCell::new(None::<String>);
        let wanted_fresh = || {
            said.lock().ok().and_then(|l| {
                l.iter()
                    .find(|x| wanted(x) && !known.borrow().contains(*x))
                    .cloned()
            })
        };
        let violations_now = RefCell::new(Vec::new());
        // Kill until enough distinct points are covered: on a loaded machine the mid-step
        // kills land on fewer distinct lines, so the count of kills alone is not the bound.
        let enough = covered(&points) || kills >= 400;
        let killer = async {
            if enough {
                return std::future::pending::<()>().await;
            }
            if mid_step {
                loop {
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    if let Some(line) = wanted_fresh() {
                        *at_wanted.borrow_mut() = Some(line);
                        return;
                    }
                    if *ticks.borrow() >= 3 + (kills as u32 % 5) {
                        return;
                    }
                }
            } else {
                // The first line this incarnation says that no earlier one said: a step
                // boundary reached for the first time (lines about what is already done
                // do not count, or it would never get further).
                loop {
                    notify.notified().await;
                    let fresh = said
                        .lock()
                        .map(|l| l.iter().any(|x| !known.borrow().contains(x)))
                        .unwrap_or(false);
                    if fresh {
                        return;
                    }
                }
            }
        };
        let r = tokio::select! {
            r = engine.run(&s.plan, &target, Some(&s.change), false) => Some(r),
            _ = s.twin.drive(Duration::from_secs(2), || { *ticks.borrow_mut() += 1; violations_now.borrow_mut().extend(violations(&s.twin, max)); }) => unreachable!(),
            _ = killer => None,
        };
        drop(engine);
        seen.extend(violations_now.into_inner());
        let said = said.into_inner().unwrap_or_default();
        let last_fresh = said
            .iter()
            .rev()
            .find(|x| !known.borrow().contains(*x))
            .cloned();
        known.borrow_mut().extend(said.iter().cloned());
        match r {
            Some(r) => break (r?, said),
            None => {
                kills += 1;
                let wanted_line = at_wanted.into_inner();
                let at_boundary = !mid_step || wanted_line.is_some();
                let last = wanted_line
                    .or(last_fresh)
                    .or_else(|| said.last().cloned())
                    .unwrap_or_else(|| "(nothing said)".into());
                points.insert(format!(
                    "{} {}",
                    if at_boundary {
                        "after"
                    } else {
                        "mid-step after"
                    },
                    last
                ));
            }
        }
    };
    seen.sort();
    seen.dedup();
    assert!(seen.is_empty(), "invariants broken: {seen:?}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "after {kills} kills: {outcome:?}\nthe last run said:\n{}",
        last_said.join("\n")
    );
    eprintln!("{kills} kills at {} distinct points", points.len());
    assert_finished(s).await?;
    Ok(points)
}

/// Kill the engine at every step boundary and mid-step until 60 distinct points are
/// covered, a worker's kubelet switch among them; then let it finish.
#[tokio::test]
async fn killed_at_every_step_boundary_and_mid_step_it_still_finishes_safely() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    // The one-drain window (between a worker's kubelet switch and its reboot) must be
    // among the points, however early the 60 are reached.
    let switch_window = |p: &String| p.starts_with("after kubelet w-") && p.contains("switched to");
    let points = killed_and_resumed(
        &s,
        &|points| points.len() >= 60 && points.iter().any(switch_window),
        &|line| line.starts_with("kubelet w-") && line.contains("switched to"),
    )
    .await?;
    // The one-drain window was among them: killed between a worker's kubelet switch and
    // its reboot, the next run carried on from what it observed without breaking a rule.
    assert!(
        points.iter().any(switch_window),
        "no kill between a kubelet switch and its reboot: {points:#?}"
    );
    assert!(
        points.len() >= 50,
        "only {} distinct kill points: {points:#?}",
        points.len()
    );
    Ok(())
}

/// On Talos ≥ 1.13 the next nodes install ahead of their turn: killed between a node's
/// install ahead and its turn (a control plane's and a worker's), and at every other new
/// boundary, the next run reboots into what was installed (an install cut short is waited
/// for, never sent again on the same boot), and never breaks a rule.
#[tokio::test]
async fn killed_between_an_install_ahead_and_its_turn_it_still_finishes_safely() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = setup_on_1_13(dir.path(), "talos: v1.13.9", "kubernetes: v1.33.7").await?;
    let ahead = |node: &'static str| {
        move |p: &String| {
            p.starts_with("after ")
                && p.contains(node)
                && p.contains("ahead of its turn")
                && p.contains("installed")
        }
    };
    let points = killed_and_resumed(
        &s,
        &|points| {
            points.len() >= 30
                && points.iter().any(ahead(" cp-"))
                && points.iter().any(ahead(" w-"))
        },
        &|line| line.contains("ahead of its turn") && line.contains("installed"),
    )
    .await?;
    for who in [" cp-", " w-"] {
        assert!(
            points.iter().any(ahead(who)),
            "no kill between an install ahead on{who}… and its turn: {points:#?}"
        );
    }
    Ok(())
}

/// Installs per (node, boot) in the twin's call log: every LifecycleService/Upgrade the
/// node took (code 0) that named an installer (an empty name only asks whether the service
/// is free; "already in progress" installs nothing).
fn installs_per_boot(
    s: &Setup,
) -> Result<std::collections::BTreeMap<(String, String), usize>, Error> {
    let log = std::fs::read_to_string(s.twin.talos.audit_log_path())?;
    let mut per = std::collections::BTreeMap::new();
    for line in log.lines() {
        let l: Value = serde_json::from_str(line)?;
        if l["method"] == "machine.LifecycleService/Upgrade"
            && l["request"]["image"]
                .as_str()
                .is_some_and(|i| !i.is_empty())
            && l["code"] == 0
        {
            let key = (
                l["node"].as_str().unwrap_or_default().to_string(),
                l["bootId"].as_str().unwrap_or_default().to_string(),
            );
            *per.entry(key).or_insert(0) += 1;
        }
    }
    Ok(per)
}

/// N2: killed while an install runs — ahead of a node's turn, and in the node's own step —
/// the next run waits for that install and reboots into what it wrote: at most one install
/// reaches a node per boot (the twin's call log), and every node's fallback slot still
/// holds the version it ran before the rollout (a second install on one boot would have
/// overwritten it: GRUB flips from grub.cfg's Default).
#[tokio::test]
async fn killed_during_installs_it_sends_at_most_one_install_per_node_per_boot() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = setup_on_1_13(dir.path(), "talos: v1.13.9", "kubernetes: v1.33.7").await?;
    let before: Vec<(String, String)> = s
        .twin
        .talos
        .observe()
        .into_iter()
        .map(|o| (o.name, o.talos_version))
        .collect();
    let target = s.target();
    // (node, in its own step) where an incarnation was killed mid-install.
    let mut killed: BTreeSet<(String, bool)> = BTreeSet::new();
    let outcome = loop {
        let report = |_: Progress| {};
        let engine = s.engine(&report);
        let hit = RefCell::new(None::<(String, bool)>);
        let look = || {
            if hit.borrow().is_some() || killed.len() >= 8 {
                return;
            }
            let running: Vec<String> = s.twin.talos.with_model(|m| {
                m.nodes()
                    .iter()
                    .filter(|n| n.installing)
                    .map(|n| n.name.clone())
                    .collect()
            });
            let cordoned: BTreeSet<String> = s.twin.kube.with(|c, _| {
                c.list("nodes", None)
                    .iter()
                    .filter(|n| {
                        n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true)
                    })
                    .filter_map(|n| {
                        n.pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .collect()
            });
            for n in running {
                let key = (n.clone(), cordoned.contains(&n));
                if !killed.contains(&key) {
                    *hit.borrow_mut() = Some(key);
                    return;
                }
            }
        };
        let killer = async {
            loop {
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                if hit.borrow().is_some() {
                    return;
                }
            }
        };
        let r = tokio::select! {
            r = engine.run(&s.plan, &target, Some(&s.change), false) => Some(r),
            _ = s.twin.drive(Duration::from_secs(2), look) => unreachable!(),
            _ = killer => None,
        };
        drop(engine);
        match r {
            Some(r) => break r?,
            None => {
                if let Some(k) = hit.into_inner() {
                    killed.insert(k);
                }
            }
        }
    };
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?} after kills at {killed:?}"
    );
    assert!(
        killed.iter().any(|(_, own)| !own) && killed.iter().any(|(_, own)| *own),
        "killed during an install ahead and one in a node's own step: {killed:?}"
    );
    let per = installs_per_boot(&s)?;
    let twice: Vec<_> = per.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "installs per boot: {twice:?} (killed at {killed:?})"
    );
    for (name, was) in &before {
        let fallback = s.twin.talos.with_model(|m| {
            m.node_by_name(name)
                .and_then(|n| n.boot.fallback().map(str::to_string))
        });
        assert_eq!(fallback.as_ref(), Some(was), "{name}'s fallback slot");
    }
    assert_finished(&s).await?;
    Ok(())
}

/// N2 (d): a retryable installer exit code (6, I/O) is tried again on a fresh boot, never on
/// the boot it failed on (the installer may have written the switch before it failed): the
/// drained node is rebooted into whatever it left, and the next install goes on the new
/// boot. Every control plane's installer fails until the node goes down: the first one
/// fails in its own step, the others ahead of their turn.
#[tokio::test]
async fn a_retryable_installer_failure_is_tried_again_on_a_fresh_boot_only() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = setup_on_1_13(dir.path(), "talos: v1.13.9", "kubernetes: v1.33.7").await?;
    let cps = ["cp-1", "cp-2", "cp-3"];
    s.twin.talos.with_model(|m| {
        for cp in cps {
            m.set_installer_exit_code(cp, Some(6));
        }
    });
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let engine = s.engine(&report);
    let target = s.target();
    let outcome = tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => r?,
        _ = s.twin.drive(Duration::from_secs(2), || {
            s.twin.talos.with_model(|m| {
                for cp in cps {
                    if m.node_by_name(cp).is_some_and(|n| !n.up) {
                        m.set_installer_exit_code(cp, None);
                    }
                }
            });
        }) => unreachable!(),
    };
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{}",
        lines.all().join("\n")
    );
    assert!(
        lines.any("rebooting to try again on a fresh boot"),
        "no control plane failed in its own step:\n{}",
        lines.all().join("\n")
    );
    let per = installs_per_boot(&s)?;
    for cp in cps {
        let on: Vec<_> = per.iter().filter(|((n, _), _)| n == cp).collect();
        assert!(on.len() >= 2, "{cp} was installed on two boots: {on:?}");
        assert!(
            on.iter().all(|(_, n)| **n == 1),
            "installs per boot: {on:?}"
        );
        let fallback = s.twin.talos.with_model(|m| {
            m.node_by_name(cp)
                .and_then(|n| n.boot.fallback().map(str::to_string))
        });
        assert_eq!(fallback.as_deref(), Some("v1.13.4"), "{cp}");
    }
    assert_finished(&s).await?;
    Ok(())
}

/// N1: the legacy MachineService/Upgrade pulls the installer inside the call (the twin
/// takes `slowInstallerPull` on its clock and lets the caller's grpc-timeout, judged on
/// that clock, cancel the pull): with a 45 s pull on w-1 the call needs more than 30 s, and
/// the rollout completes.
#[tokio::test]
async fn a_legacy_upgrade_whose_installer_pull_takes_45s_completes() -> TestResult {
    let config = TwinConfig::parse("twin.yaml", "faults:\n  slowInstallerPull: {w-1: 45s}\n")?;
    let s = setup(config).await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let engine = s.engine(&report);
    let (outcome, _) = run_checked(&s, &engine, false).await?;
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{}",
        lines.all().join("\n")
    );
    let log = std::fs::read_to_string(s.twin.talos.audit_log_path())?;
    let upgrades: Vec<Value> = log
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()?
        .into_iter()
        .filter(|l| l["method"] == "machine.MachineService/Upgrade" && l["node"] == "w-1")
        .collect();
    assert_eq!(
        upgrades.len(),
        1,
        "one legacy Upgrade reached w-1: {upgrades:?}"
    );
    assert_eq!(upgrades[0]["code"], 0);
    assert_finished(&s).await?;
    Ok(())
}

/// N5: etcd is judged again between a control plane's install and its reboot. Another
/// member turns unhealthy while the first control plane installs in its own step: the
/// rollout pauses on etcd and that control plane is never rebooted (two of three members
/// down would lose quorum).
#[tokio::test]
async fn a_member_lost_during_a_control_planes_install_stops_its_reboot() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = setup_on_1_13(dir.path(), "talos: v1.13.9", "kubernetes: v1.33.7").await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let engine = s.engine(&report);
    let target = s.target();
    let hit = RefCell::new(None::<(String, String)>);
    let outcome = tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => r?,
        _ = s.twin.drive(Duration::from_secs(2), || {
            if hit.borrow().is_some() {
                return;
            }
            let cordoned: BTreeSet<String> = s.twin.kube.with(|c, _| {
                c.list("nodes", None)
                    .iter()
                    .filter(|n| n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true))
                    .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str).map(str::to_string))
                    .collect()
            });
            let found = s.twin.talos.with_model(|m| {
                let installing = m
                    .nodes()
                    .iter()
                    .find(|n| n.installing && n.is_control_plane() && cordoned.contains(&n.name))?
                    .name
                    .clone();
                let other = m
                    .nodes()
                    .iter()
                    .find(|n| n.is_control_plane() && n.name != installing && !n.installing)?
                    .name
                    .clone();
                m.set_etcd_unhealthy(&other, true);
                Some((installing, other))
            });
            *hit.borrow_mut() = found;
        }) => unreachable!(),
    };
    let (installing, other) = hit
        .into_inner()
        .ok_or("no control plane installed in its step")?;
    let p = paused(outcome)?;
    assert!(p.reason.contains("etcd"), "{}", p.reason);
    let log = std::fs::read_to_string(s.twin.talos.audit_log_path())?;
    let rebooted = log.lines().any(|l| {
        serde_json::from_str::<Value>(l).is_ok_and(|v| {
            v["method"] == "machine.MachineService/Reboot" && v["node"] == installing.as_str()
        })
    });
    assert!(
        !rebooted,
        "{installing} was rebooted while {other}'s member was down"
    );
    Ok(())
}

/// Run the engine until it has requested its first Talos upgrade, then stop it there (as a
/// crash would); the node it asked.
async fn stop_at_the_first_upgrade_request(s: &Setup) -> Result<String, Error> {
    let lines = Lines::default();
    let notify = tokio::sync::Notify::new();
    let report = |p: Progress| {
        lines.push(p);
        notify.notify_one();
    };
    let engine = s.engine(&report);
    let target = s.target();
    let requested = async {
        loop {
            notify.notified().await;
            if lines.any("upgrade to v1.12.9 requested") {
                return;
            }
        }
    };
    tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => {
            return Err(format!("the run ended before any upgrade request: {r:?}").into())
        }
        _ = s.twin.drive(Duration::from_secs(2), || {}) => unreachable!("the driver never ends"),
        _ = requested => {}
    }
    drop(engine);
    let first = lines
        .all()
        .into_iter()
        .find(|l| l.contains("upgrade to v1.12.9 requested"))
        .unwrap_or_default();
    let node = first
        .split_whitespace()
        .find_map(|w| w.strip_suffix(':'))
        .unwrap_or_default()
        .to_string();
    assert!(
        node.starts_with("cp-"),
        "a control plane goes first: {first}"
    );
    Ok(node)
}

/// One control plane, one endpoint: the calls that watch it while it reboots cannot go
/// around it, so they go through it and wait for it to answer again (never "every endpoint
/// was avoided" until the node timeout). The cluster upgrades end to end.
#[tokio::test]
async fn a_single_control_plane_cluster_upgrades_end_to_end_through_its_only_endpoint() -> TestResult
{
    let single = |text: &str| {
        text.replace(
            "endpoints: [10.0.10.11, 10.0.10.12, 10.0.10.13]",
            "endpoints: [10.0.10.11]",
        )
        .lines()
        .filter(|l| !l.contains("name: cp-2") && !l.contains("name: cp-3"))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
    };
    let s = setup_edited(TwinConfig::default(), &single).await?;
    assert_eq!(s.talos.endpoints().len(), 1, "{:?}", s.talos.endpoints());
    let cps = s
        .twin
        .talos
        .observe()
        .into_iter()
        .filter(|o| o.role == Role::ControlPlane)
        .count();
    assert_eq!(cps, 1);
    let before = s.twin.talos.clock().now();
    let (o, seen, lines) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "invariants broken: {seen:?}");
    assert!(
        matches!(o, RunOutcome::Completed { .. }),
        "{o:?}\n{:#?}",
        lines.all()
    );
    assert_finished(&s).await?;
    // Well inside one node timeout per node: nothing waited the whole timeout out.
    let took = s.twin.talos.clock().now().since(before);
    assert!(took < Duration::from_secs(45 * 60), "took {took:?}");
    Ok(())
}

/// [`setup`] from a repository (under `dir`) whose `main` runs the homelab on Talos v1.13.4
/// and Kubernetes v1.33.5, with a Renovate PR that sets `talos` and `kubernetes` (each a
/// `key: version` line of the release set; the current one leaves it).
pub async fn setup_on_1_13(
    dir: &std::path::Path,
    talos: &str,
    kubernetes: &str,
) -> Result<Setup, Error> {
    let branch = "renovate/bump";
    let homelab = ichor::sim::fixture::Fixture::homelab();
    let mut tree = homelab.tree.clone();
    let rs = "clusters/homelab/release-set.yaml";
    let text = tree
        .get(rs)
        .cloned()
        .ok_or("the homelab has a release set")?;
    tree.insert(
        rs.to_string(),
        text.replace("talos: v1.12.4", "talos: v1.13.4")
            .replace("kubernetes: v1.30.14", "kubernetes: v1.33.5"),
    );
    let files: Vec<(&str, &str)> = tree.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    let history = format!(
        r#"
people:
  owner: {{name: Mara Lindqvist, email: mara@homelab.example}}
  renovate: {{name: "renovate[bot]", email: "29139614+renovate[bot]@users.noreply.github.com"}}
main:
  - {{message: "Bootstrap homelab on Talos 1.13", author: owner, date: "2026-09-01T09:00:00Z", tree: true}}
branches:
  - name: {branch}
    expect: pass
    title: "fix(deps): update {talos}, {kubernetes}"
    commits:
      - message: "fix(deps): update {talos}, {kubernetes}"
        author: renovate
        date: "2026-11-21T06:04:00Z"
        edits:
          - {{file: clusters/homelab/release-set.yaml, find: "talos: v1.13.4", replace: "{talos}"}}
          - {{file: clusters/homelab/release-set.yaml, find: "kubernetes: v1.33.5", replace: "{kubernetes}"}}
"#
    );
    let repo = dir.join("repo");
    ichor::sim::fixture::Fixture::parse("homelab-1.13", &files, &history)?.build(&repo)?;
    setup_at(
        TwinConfig::default(),
        SetupFrom {
            repo: Some((&repo, branch)),
            ..Default::default()
        },
    )
    .await
}

/// A cluster already on Talos 1.13 upgrades through LifecycleService end to end: the
/// installer pulled into the instance the upgrade names, installed while the node serves,
/// then ichor's own reboot.
#[tokio::test]
async fn a_talos_1_13_cluster_upgrades_end_to_end_through_the_lifecycle_service() -> TestResult {
    let dir = tempfile::tempdir()?;
    let s = setup_on_1_13(dir.path(), "talos: v1.13.9", "kubernetes: v1.33.5").await?;
    assert!(s
        .twin
        .talos
        .observe()
        .iter()
        .all(|o| o.talos_version == "v1.13.4"));
    let (o, seen, lines) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "invariants broken: {seen:?}");
    assert!(
        matches!(o, RunOutcome::Completed { .. }),
        "{o:?}\n{:#?}",
        lines.all()
    );
    for o in s.twin.talos.observe() {
        assert_eq!(o.talos_version, "v1.13.9", "{}", o.name);
        assert!(o.ready, "{} Ready", o.name);
    }
    assert!(
        lines.any("LifecycleService, then reboot"),
        "{:#?}",
        lines.all()
    );
    assert!(!lines.any("MachineService/Upgrade"), "{:#?}", lines.all());
    Ok(())
}

/// A talosconfig the nodes refuse — its certificate expired, issued by another CA (the OS CA
/// was rotated, Talos's way of revoking), or without the admin role — is said at once as what
/// it is, naming the node and the endpoint; never waited on as a node that "may not have
/// come back".
#[tokio::test]
async fn a_refused_talosconfig_pauses_at_once_naming_the_node_and_endpoint() -> TestResult {
    let foreign_dir = tempfile::tempdir()?;
    let foreign = ichor::sim::talos::TalosTwin::start(
        Clock::manual(),
        vec![ichor::sim::talos::NodeSpec {
            name: "elsewhere".into(),
            role: Role::ControlPlane,
            ip: [10, 9, 9, 9].into(),
            talos_version: "v1.12.6".into(),
            kubernetes_version: "v1.33.5".into(),
            kubelet_version: "v1.33.5".into(),
            config_form: ichor::sim::talos::ConfigForm::V1Alpha1,
        }],
        foreign_dir.path(),
        Default::default(),
    )
    .await?;
    for case in ["expired", "another CA", "reader"] {
        let s = setup(TwinConfig::default()).await?;
        let node = stop_at_the_first_upgrade_request(&s).await?;
        let mut ctx = s.talos.context().clone();
        let cert = match case {
            "expired" => {
                s.twin
                    .talos
                    .issue_client_expiring("admin", &["os:admin"], Duration::ZERO)?
            }
            "another CA" => foreign.issue_client("admin", &["os:admin"])?,
            _ => s.twin.talos.issue_client("reader", &["os:reader"])?,
        };
        ctx.crt_pem = cert.cert_pem;
        ctx.key_pem = cert.key_pem;
        // Past the certificate's end on the nodes' clocks.
        s.twin.advance(Duration::from_secs(1));
        let talos = TalosClient::new(ctx, s.twin.talos.clock().clone());
        let lines = Lines::default();
        let report = |p| lines.push(p);
        let mut engine = Rollout::new(
            &s.kube,
            &talos,
            s.twin.talos.clock().clone(),
            "homelab",
            "ichor-test",
        )
        .for_cluster(s.doc());
        engine.report = Some(&report);
        let before = s.twin.talos.clock().now();
        let (o, _) = run_checked(&s, &engine, false).await?;
        let p = paused(o)?;
        let took = s.twin.talos.clock().now().since(before);
        assert_eq!(p.node.as_deref(), Some(node.as_str()), "{case}: {p:?}");
        assert!(
            p.reason.contains("refuses ichor's credentials"),
            "{case}: {}",
            p.reason
        );
        assert!(
            p.reason
                .contains(&format!("on {}", node_address(&s, &node))),
            "{case}: {}",
            p.reason
        );
        let named = match case {
            "reader" => "permission denied by endpoint 127.0.0.1:",
            _ => "mutual TLS with endpoint 127.0.0.1:",
        };
        assert!(p.reason.contains(named), "{case}: {}", p.reason);
        if case == "expired" {
            assert!(
                p.reason.to_ascii_lowercase().contains("expired"),
                "{}",
                p.reason
            );
        }
        assert!(
            took < Duration::from_secs(120),
            "{case}: paused only after {took:?}"
        );
    }
    Ok(())
}

/// The address ichor reaches `node`'s Talos API by (its InternalIP).
fn node_address(s: &Setup, node: &str) -> String {
    s.twin
        .talos
        .observe()
        .into_iter()
        .find(|o| o.name == node)
        .map(|o| o.ip.to_string())
        .unwrap_or_default()
}

/// Talos ≤ 1.12: an engine restarted while a control plane runs the upgrade sequence its
/// first request started asks again, and the node refuses (its own etcd member is stopped by
/// that sequence). That is the node upgrading, not a refusal: ichor reads the node's machine
/// stage and waits for the reboot instead of pausing.
#[tokio::test]
async fn a_restart_mid_legacy_upgrade_of_a_control_plane_waits_for_the_node_not_pausing(
) -> TestResult {
    let mut config = TwinConfig::default();
    // A sequence that drains and stops services takes minutes on a real node.
    config.timings.upgrade = Some(ichor::releaseset::HumanDuration::from_secs(600));
    let s = setup(config).await?;
    let node = stop_at_the_first_upgrade_request(&s).await?;
    let upgrading = s
        .twin
        .talos
        .observe()
        .into_iter()
        .any(|o| o.name == node && o.up && o.stage == ichor::sim::talos::Stage::Upgrading);
    assert!(upgrading, "{node} is still in its upgrade sequence");

    let (o, seen, again) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "invariants broken: {seen:?}");
    assert!(matches!(o, RunOutcome::Completed { .. }), "{o:?}");
    assert!(!again.any("was refused"), "{:?}", again.all());
    assert_finished(&s).await?;
    Ok(())
}

#[tokio::test]
async fn a_cni_still_rolling_out_is_waited_for_before_the_apiservers() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let dss: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
        kube::Api::namespaced(s.raw.clone(), "kube-system");
    let patch = |strategy: &str| json!({"spec": {"updateStrategy": {"type": strategy}, "template": {"spec": {"containers": [{"name": "cilium", "image": "quay.io/cilium/cilium:v1.18.4"}]}}}});
    // A new Cilium image that the DaemonSet does not roll by itself (OnDelete): the CNI is
    // "still rolling out" until someone lets it.
    dss.patch(
        "cilium",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(patch("OnDelete")),
    )
    .await?;
    let lines = Lines::default();
    let notify = tokio::sync::Notify::new();
    let report = |p: Progress| {
        if matches!(&p, Progress::Waiting(w) if w.contains("the Kubernetes stages start once")) {
            notify.notify_one();
        }
        lines.push(p);
    };
    let engine = s.engine(&report);
    let let_it_roll = async {
        notify.notified().await;
        // Nothing of Kubernetes moved while it waited.
        let apiservers_moved = s.twin.talos.observe().iter().any(|o| {
            o.static_pods.iter().any(|p| {
                p.component == ichor::sim::talos::Component::ApiServer
                    && p.image.ends_with(":v1.33.7")
            })
        });
        let _ = dss
            .patch(
                "cilium",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Strategic(patch("RollingUpdate")),
            )
            .await;
        apiservers_moved
    };
    let (outcome, moved_while_waiting) = run_alongside(&s, &engine, let_it_roll).await?;
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    assert_eq!(moved_while_waiting, Some(false), "{:#?}", lines.all());
    assert!(lines.any("live/cni-running"), "{:#?}", lines.all());
    Ok(())
}

/// The homelab rollout on a cluster that keeps kube-proxy (the CNI does not replace it),
/// planned from the live nodes.
pub async fn setup_keeping_kube_proxy() -> Result<Setup, Error> {
    let mut s = setup_edited(TwinConfig::default(), &|c| {
        c.replace("replacesKubeProxy: true", "replacesKubeProxy: false")
    })
    .await?;
    if let Some(doc) = s.change.cluster_doc.as_mut() {
        doc.spec.cni.replaces_kube_proxy = false;
    }
    let live_nodes = live::live_nodes(
        &live::observe(&s.kube, Some(&s.talos), &live::Subject::of(&s.change)).await,
    )
    .ok_or("no live nodes")?;
    s.plan = gate::plan_with(&s.change, &PlanOptions::default(), Some(&live_nodes))?;
    Ok(s)
}

#[tokio::test]
async fn kube_proxy_moves_on_every_control_plane_and_the_manifests_are_synced() -> TestResult {
    let s = setup_keeping_kube_proxy().await?;
    // Talos's bootstrap created it: `talos`/Update owns its fields, which a `talos`/Apply
    // changing the image conflicts with unless ichor takes them over first.
    let raw: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
        kube::Api::namespaced(s.raw.clone(), "kube-system");
    let ops = |ds: k8s_openapi::api::apps::v1::DaemonSet| -> Vec<(String, String)> {
        ds.metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                (
                    m.manager.unwrap_or_default(),
                    m.operation.unwrap_or_default(),
                )
            })
            .collect()
    };
    assert_eq!(
        ops(raw.get("kube-proxy").await?),
        [("talos".to_string(), "Update".to_string())]
    );
    assert!(s
        .plan
        .steps()
        .any(|st| st.kind == ichor::plan::StepKind::KubeProxyAndManifests));
    let (outcome, seen, lines) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    for cp in ["cp-1", "cp-2", "cp-3"] {
        assert!(
            lines.any(&format!("kube-proxy image on {cp}: v1.33.7")),
            "{:#?}",
            lines.all()
        );
    }
    assert!(lines.any("kube-proxy on v1.33.7 and the bootstrap manifests in sync"));
    let ds = s
        .kube
        .daemonset("kube-system", "kube-proxy")
        .await?
        .ok_or("no kube-proxy")?;
    assert_eq!(ds.version.as_deref(), Some("v1.33.7"));
    assert!(ds.rolled_out(), "{ds:?}");
    // Applied as Talos's own field manager, which now owns them by Apply.
    let after = ops(raw.get("kube-proxy").await?);
    assert!(
        after.contains(&("talos".to_string(), "Apply".to_string())),
        "{after:?}"
    );
    assert!(
        !after.contains(&("talos".to_string(), "Update".to_string())),
        "{after:?}"
    );
    Ok(())
}

/// Only Talos's own bootstrap ownership is taken over: a field another manager changed (an
/// operator's `kubectl edit` of kube-proxy's image) stays a conflict, the stage pauses naming
/// that manager, and the edit is left as it is.
#[tokio::test]
async fn another_managers_edit_of_a_bootstrap_object_pauses_the_sync_and_is_kept() -> TestResult {
    let s = setup_keeping_kube_proxy().await?;
    let raw: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
        kube::Api::namespaced(s.raw.clone(), "kube-system");
    let edited = "registry.example/kube-proxy:hand-edited";
    raw.patch(
        "kube-proxy",
        &kube::api::PatchParams {
            field_manager: Some("kubectl-edit".into()),
            ..Default::default()
        },
        &kube::api::Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "kube-proxy", "image": edited}]}}}})),
    )
    .await?;
    let (outcome, _, lines) = run_once(&s, false).await?;
    let p = paused(outcome)?;
    assert_eq!(p.stage, "kube-proxy-manifests", "{p:?}\n{:#?}", lines.all());
    assert!(p.reason.contains("\"kubectl-edit\""), "{}", p.reason);
    let image = raw
        .get("kube-proxy")
        .await?
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.first().and_then(|c| c.image.clone()));
    assert_eq!(image.as_deref(), Some(edited));
    Ok(())
}

/// The real binary, killed outright (SIGKILL) three times mid-rollout and started again each
/// time, against an in-process twin on a scaled clock; it finishes, and the twin's own state
/// never broke an invariant meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ichor_rollout_killed_three_times_is_continued_by_the_next_run() -> TestResult {
    const SPEED: f64 = 60.0;
    let state = tempfile::tempdir()?;
    let (_, dir, start) = homelab_change(state.path())?;
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
    let spawn = |clock: &Clock| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
            .args(["rollout", "--repo"])
            .arg(homelab())
            .args([
                "--base",
                "main",
                "--rev",
                "renovate/talos",
                "--yes",
                "--resume",
            ])
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
            .env("HOME", &home)
            .env("XDG_STATE_HOME", home.join("state"))
            .env_remove("KUBECONFIG")
            .env_remove("TALOSCONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
    };
    // The twin's state, sampled all along.
    let done = std::sync::atomic::AtomicBool::new(false);
    let checker = async {
        let mut seen = Vec::new();
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            seen.extend(violations(&twin, 1));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        seen
    };
    let work = async {
        // Kill once each of these is in the record: mid control planes, mid kubelets, mid
        // workers (each drained once for both).
        let kill_when: [&dyn Fn(&record::RolloutRecord) -> bool; 3] = [
            // Begun, not only pulled ahead.
            &|r| {
                r.steps
                    .get("talos/cp-2")
                    .is_some_and(|s| s.started_at.is_some())
            },
            &|r| r.stage.as_deref() == Some("kubelet"),
            &|r| {
                r.steps
                    .get("worker/w-2")
                    .is_some_and(|s| s.started_at.is_some())
            },
        ];
        let mut kills = 0;
        let mut etas = Vec::new();
        for when in kill_when {
            let mut child = spawn(&clock)?;
            loop {
                if let Some(status) = child.try_wait()? {
                    return Err::<_, Error>(
                        format!("ichor rollout ended before it was killed: {status}").into(),
                    );
                }
                let rec = record::load(&kube, "homelab").await.ok().flatten();
                if let Some(s) = rec.as_ref().filter(|s| when(&s.record)) {
                    etas.push(s.record.eta.clone());
                    child.kill()?;
                    child.wait()?;
                    kills += 1;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // The last run, to the end; a pause (a call past its deadline on a loaded machine)
        // is resumed as an operator would.
        let mut outputs = Vec::new();
        for _ in 0..3 {
            let child = spawn(&clock)?;
            let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
            let code = out.status.code();
            outputs.push(format!(
                "exit {code:?}\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
            if code == Some(0) {
                return Ok((kills, outputs, etas));
            }
            if code != Some(3) {
                break;
            }
        }
        Err(format!("ichor rollout did not finish:\n{}", outputs.join("\n---\n")).into())
    };
    let (result, seen) = tokio::join!(
        async {
            let r = work.await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            r
        },
        checker
    );
    let (kills, outputs, etas) = result?;
    assert_eq!(kills, 3);
    // The record carries the live ETA while it runs (`ichor status` shows it).
    let done: Vec<usize> = etas.iter().flatten().map(|e| e.done).collect();
    assert_eq!(done.len(), 3, "{etas:?}");
    assert!(done[2] > 0, "{etas:?}");
    // What an earlier run finished still counts after a restart.
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{etas:?}");
    assert!(etas.iter().flatten().all(|e| e.done < e.total), "{etas:?}");
    let mut seen = seen;
    seen.sort();
    seen.dedup();
    assert!(seen.is_empty(), "invariants broken: {seen:?}");
    let last = outputs.last().cloned().unwrap_or_default();
    assert!(last.contains("Done in"), "{last}");
    // Issue 19 item 4: each node done says how far and when it should end; the summary puts
    // each stage beside its estimate.
    assert!(
        last.contains(" done, ends ≈ ") && last.contains(" UTC)"),
        "{last}"
    );
    assert!(last.contains("(planned "), "{last}");
    for o in twin.talos.observe() {
        assert_eq!(o.talos_version, "v1.12.9", "{}", o.name);
        assert!(o.kubelet_version.ends_with("v1.33.7"), "{}", o.name);
    }
    for n in kube.nodes().await? {
        assert!(!n.cordoned && n.ready, "{} cordoned or not Ready", n.name);
    }
    let rec = record::load(&kube, "homelab")
        .await?
        .ok_or("no record")?
        .record;
    assert_eq!(rec.state, RecordState::Completed);
    assert!(
        rec.history
            .iter()
            .filter(|h| h.message.contains("continued"))
            .count()
            >= 3,
        "{:#?}",
        rec.history
    );
    twin.shutdown().await;
    Ok(())
}

fn run_ichor(args: Vec<String>) -> std::io::Result<std::process::Output> {
    std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(&args)
        .env_remove("KUBECONFIG")
        .env_remove("TALOSCONFIG")
        // The local rollout lock goes under the test's own temp dir.
        .env(
            "XDG_STATE_HOME",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("rollout-cli-state"),
        )
        .stdin(std::process::Stdio::null())
        .output()
}

#[tokio::test]
async fn the_command_line_asks_refuses_and_shows_the_record() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let repo = homelab().to_string_lossy().into_owned();
    let kc = s.twin.kubeconfig().to_string_lossy().into_owned();
    let tc = s.twin.talosconfig().to_string_lossy().into_owned();
    let args = |extra: &[&str]| {
        let mut v: Vec<String> = [
            "rollout",
            "--repo",
            &repo,
            "--base",
            "main",
            "--kubeconfig",
            &kc,
            "--talosconfig",
            &tc,
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    let call = |a: Vec<String>| tokio::task::spawn_blocking(move || run_ichor(a));
    // --dry-run: the gate and the plan, nothing changed.
    let o = call(args(&["--rev", "renovate/talos", "--dry-run"])).await??;
    let out = crate::stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", crate::stderr(&o));
    assert!(
        out.contains("PASS") && out.contains("dry run: nothing was changed"),
        "{out}"
    );
    assert!(out.contains("cp-1"), "the plan is printed: {out}");
    // No terminal and no --yes: refused before anything is touched.
    let o = call(args(&["--rev", "renovate/talos"])).await??;
    assert_eq!(o.status.code(), Some(2), "{}", crate::stderr(&o));
    assert!(
        crate::stderr(&o).contains("pass --yes"),
        "{}",
        crate::stderr(&o)
    );
    // A change the gate blocks is refused.
    let o = call(args(&[
        "--rev",
        "renovate/ghcr.io-siderolabs-kubelet-1.x",
        "--yes",
    ]))
    .await??;
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}{}",
        crate::stdout(&o),
        crate::stderr(&o)
    );
    assert!(crate::stderr(&o).contains("nothing was rolled out"));
    for n in s.kube.nodes().await? {
        assert!(!n.cordoned, "{} touched", n.name);
    }
    assert!(
        record::load(&s.kube, "homelab").await?.is_none(),
        "no record was written"
    );

    // A paused rollout, as `ichor status` shows it.
    let installer = format!(
        "{}:v1.12.9",
        s.doc().spec.talos.installer_image.clone().ok_or("image")?
    );
    s.post_faults(json!({"failingImages": [installer]})).await?;
    let (outcome, _, _) = run_once(&s, false).await?;
    paused(outcome)?;
    let status = |json: bool| {
        let mut v: Vec<String> = [
            "status",
            "--kubeconfig",
            &kc,
            "--talosconfig",
            &tc,
            "--repo",
            &repo,
            "--rev",
            "main",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        if json {
            v.extend(["--output".to_string(), "json".to_string()]);
        }
        v
    };
    let o = call(status(false)).await??;
    let out = crate::stdout(&o);
    assert!(
        out.contains("Rollout to") && out.contains("paused"),
        "{out}"
    );
    assert!(
        out.contains("pre-pulling") && out.contains("--resume"),
        "{out}"
    );
    let o = call(status(true)).await??;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["rollout"]["kind"], "RolloutRecord", "{v:#}");
    assert_eq!(v["rollout"]["state"], "paused");
    // The same revision without --resume: the pause is printed, exit 3, nothing moves.
    let o = call(args(&["--rev", "renovate/talos", "--yes"])).await??;
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}{}",
        crate::stdout(&o),
        crate::stderr(&o)
    );
    assert!(crate::stdout(&o).contains("Paused") && crate::stdout(&o).contains("pre-pulling"));
    Ok(())
}

#[tokio::test]
async fn a_single_replica_volume_is_named_as_down_for_the_duration_and_not_waited_on() -> TestResult
{
    let s = setup(TwinConfig::default()).await?;
    // One more Longhorn volume, with its only replica on w-2.
    add_longhorn_volume(&s, "pvc-scratch", &["w-2"])?;
    let (outcome, seen, lines) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    assert!(
        lines.any("w-2: volume pvc-scratch has its only replica here; its workload is down until the node is back"),
        "{:#?}",
        lines.all()
    );
    Ok(())
}

/// A Longhorn volume nothing mounts yet (detached), with one replica on each of `nodes`,
/// made after the set-up (and its plan); the twin settles for a moment after.
pub fn add_longhorn_volume(s: &Setup, name: &str, nodes: &[&str]) -> Result<(), Error> {
    s.twin
        .kube
        .with(|c, now| -> Result<(), ichor::sim::kube::ApiError> {
            c.upsert(
                json!({
                    "apiVersion": "longhorn.io/v1beta2", "kind": "Volume",
                    "metadata": {"name": name, "namespace": "longhorn-system"},
                    "spec": {"numberOfReplicas": nodes.len(), "size": "1073741824", "frontend": "blockdev", "nodeID": ""},
                    "status": {"state": "detached", "robustness": "unknown"},
                }),
                now,
            )?;
            for (i, node) in nodes.iter().enumerate() {
                c.upsert(
                    ichor::sim::kube::model::replica_object(
                        "longhorn-system",
                        name,
                        &format!("{name}-r-{}", i + 1),
                        node,
                        now,
                    ),
                    now,
                )?;
            }
            Ok(())
        })?;
    s.twin.advance(Duration::from_secs(5));
    Ok(())
}

/// Talos ≥ 1.13: LifecycleService/Upgrade, then ichor's own Reboot (one drain owner: ichor).
/// The homelab on Talos 1.13.0 rolled to 1.13.2 (LifecycleService) on a twin with
/// `config`: the outcome, the invariants broken, the lines, the twin and the record.
async fn lifecycle_rollout(
    config: TwinConfig,
) -> Result<
    (
        RunOutcome,
        Vec<String>,
        Lines,
        Twin,
        KubeClient,
        record::RolloutRecord,
    ),
    Error,
> {
    let state = tempfile::tempdir()?;
    let (change, dir, start) = homelab_change(state.path())?;
    let base_text = std::fs::read_to_string(dir.join("release-set.yaml"))?;
    let running = change.base_release_set.spec.talos.to_string();
    let base_text = base_text.replacen(&format!("talos: {running}"), "talos: v1.13.0", 1);
    std::fs::write(dir.join("release-set.yaml"), &base_text)?;
    let base = ichor::releaseset::ReleaseSet::parse("release-set.yaml", &base_text)?;
    let head = ichor::releaseset::ReleaseSet::parse(
        "release-set.yaml",
        &base_text.replacen("talos: v1.13.0", "talos: v1.13.2", 1),
    )?;
    let twin = Twin::start(
        Clock::manual_at(start),
        &ClusterFolder::read(&dir)?,
        &state.path().join("state"),
        TwinOptions {
            config,
            github: None,
        },
    )
    .await?;
    twin.advance(Duration::from_secs(30));
    let kube = KubeClient::connect(Some(twin.kubeconfig())).await?;
    let talos = TalosClient::new(
        ichor::talos::config::load(twin.talosconfig(), None)?,
        twin.talos.clock().clone(),
    );
    let doc = change.cluster_doc.clone().ok_or("cluster.yaml")?;
    let facts = live::observe(&kube, Some(&talos), &live::Subject::of(&change)).await;
    let nodes = live::live_nodes(&facts).ok_or("no live nodes")?;
    let plan = ichor::plan::plan(
        "homelab",
        &ichor::releaseset::Bump::between(&base, &head),
        &doc.spec,
        &nodes,
        &PlanOptions::default(),
    )?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let mut engine = Rollout::new(
        &kube,
        &talos,
        twin.talos.clock().clone(),
        "homelab",
        "ichor-test",
    )
    .for_cluster(&doc);
    engine.report = Some(&report);
    let target = Target {
        commit: "lifecycle".into(),
        talos: head.spec.talos.clone(),
        kubernetes: head.spec.kubernetes.clone(),
    };
    let seen = RefCell::new(Vec::new());
    let max = doc.spec.rollout.max_unavailable.get() as usize;
    let outcome = tokio::select! {
        r = engine.run(&plan, &target, None, false) => r?,
        _ = twin.drive(Duration::from_secs(2), || seen.borrow_mut().extend(violations(&twin, max))) => unreachable!(),
    };
    drop(engine);
    let rec = record::load(&kube, "homelab")
        .await?
        .ok_or("no rollout record")?
        .record;
    let mut seen = seen.into_inner();
    seen.sort();
    seen.dedup();
    Ok((outcome, seen, lines, twin, kube, rec))
}

/// Issue 19 item 2: on Talos ≥ 1.13 the next worker installs while the current one reboots
/// (one round ahead), so its own turn is a drain and a reboot.
#[tokio::test]
async fn talos_1_13_upgrades_through_the_lifecycle_service_then_ichors_reboot() -> TestResult {
    let (outcome, seen, lines, twin, kube, _) = lifecycle_rollout(TwinConfig::default()).await?;
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        lines.any("talos w-1: upgrade to v1.13.2 requested (LifecycleService, then reboot)"),
        "{:#?}",
        lines.all()
    );
    let all = lines.all();
    let pos = |needle: &str| {
        all.iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in {all:#?}"))
    };
    // w-2 installs while w-1 is out, w-3 while w-2 is; their turns only reboot.
    for (w, before) in [("w-2", "w-1"), ("w-3", "w-2")] {
        let installed = pos(&format!("talos {w}: installed"));
        assert!(
            all[installed].contains("ahead of its turn"),
            "{}",
            all[installed]
        );
        assert!(pos(&format!("talos {before}: cordoned")) < installed);
        assert!(installed < pos(&format!("talos {w}: cordoned")));
        assert!(lines.any(&format!(
            "talos {w}: upgrade to v1.13.2 requested (installed ahead, reboot)"
        )));
    }
    // The control planes too, one node ahead: each after the first installs while the
    // one before it is out, and its turn only reboots.
    let cps: Vec<String> = ["cp-1", "cp-2", "cp-3"]
        .into_iter()
        .filter(|cp| lines.any(&format!("talos {cp}: installed")))
        .map(String::from)
        .collect();
    assert_eq!(cps.len(), 2, "{all:#?}");
    for cp in &cps {
        let installed = pos(&format!("talos {cp}: installed"));
        assert!(
            all[installed].contains("ahead of its turn"),
            "{}",
            all[installed]
        );
        let requested = pos(&format!(
            "talos {cp}: upgrade to v1.13.2 requested (installed ahead, reboot)"
        ));
        assert!(installed < requested, "{all:#?}");
    }
    for o in twin.talos.observe() {
        assert_eq!(o.talos_version, "v1.13.2", "{}", o.name);
    }
    for n in kube.nodes().await? {
        assert!(!n.cordoned && n.ready, "{}", n.name);
    }
    Ok(())
}

/// A pause with nodes installed ahead but not rebooted names them (a reboot of their own
/// brings them up on the target, undrained), and the record keeps them.
#[tokio::test]
async fn a_pause_names_the_nodes_installed_ahead_and_not_rebooted() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.nodes_never_return = vec!["w-2".into()];
    let (outcome, seen, lines, twin, _, rec) = lifecycle_rollout(config).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    assert_eq!(p.node.as_deref(), Some("w-2"), "{p:?}\n{:#?}", lines.all());
    assert!(
        p.reason.contains(
            "installed ahead and not rebooted: w-3 (each boots Talos v1.13.2 at its next reboot"
        ),
        "{}",
        p.reason
    );
    let w3 = rec.steps.get("talos/w-3").ok_or("w-3 in the record")?;
    assert!(
        w3.installed_boot.is_some() && w3.started_at.is_none(),
        "{w3:?}"
    );
    // Installed, not rebooted: still on its old version, serving.
    let o = twin
        .talos
        .observe()
        .into_iter()
        .find(|o| o.name == "w-3")
        .ok_or("w-3")?;
    assert_eq!(o.talos_version, "v1.13.0");
    Ok(())
}

#[tokio::test]
async fn an_add_on_that_must_move_first_is_waited_for_before_the_apiservers() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let wanted = s
        .change
        .head_release_set
        .spec
        .addons
        .iter()
        .find(|a| a.name == "cert-manager")
        .map(|a| a.version.to_string())
        .ok_or("the homelab runs cert-manager")?;
    // cert-manager 1.16 supports Kubernetes up to 1.32: it must move before 1.33.7.
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(s.raw.clone());
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cert-manager"}}))?,
    )
    .await?;
    let deploys: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(s.raw.clone(), "cert-manager");
    let deployment =
        |tag: &str| -> Result<k8s_openapi::api::apps::v1::Deployment, serde_json::Error> {
            serde_json::from_value(json!({
                "metadata": {"name": "cert-manager", "namespace": "cert-manager"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "cert-manager"}},
                         "template": {"metadata": {"labels": {"app": "cert-manager"}},
                                      "spec": {"containers": [{"name": "cert-manager-controller",
                                                               "image": format!("quay.io/jetstack/cert-manager-controller:{tag}")}]}}}
            }))
        };
    deploys
        .create(&Default::default(), &deployment("v1.16.3")?)
        .await?;
    let lines = Lines::default();
    let notify = tokio::sync::Notify::new();
    let report = |p: Progress| {
        if matches!(&p, Progress::Waiting(w) if w.contains("cert-manager cert-manager/cert-manager runs v1.16.3"))
        {
            notify.notify_one();
        }
        lines.push(p);
    };
    let engine = s.engine(&report);
    let upgrade_it = async {
        notify.notified().await;
        let _ = deploys
            .patch(
                "cert-manager",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "cert-manager-controller", "image": format!("quay.io/jetstack/cert-manager-controller:{wanted}")}]}}}})),
            )
            .await;
    };
    let (outcome, upgraded) = run_alongside(&s, &engine, upgrade_it).await?;
    let upgraded = upgraded.is_some();
    assert!(upgraded, "the wait was never reported: {:#?}", lines.all());
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    let all = lines.all();
    let waited = all
        .iter()
        .position(|l| l.contains("does not support Kubernetes v1.33.7"))
        .ok_or("no wait line")?;
    let first_apiserver = all
        .iter()
        .position(|l| l.contains("kube-apiserver cp-1: on"))
        .ok_or("no apiserver")?;
    assert!(waited < first_apiserver, "{all:#?}");
    Ok(())
}

/// Issue 16 item 13: stage (c) obeys the rules of every step. A pause asked for once the
/// control-plane components are done stops the rollout at kube-proxy and the manifests,
/// before any kube-proxy image is switched, not only at the next kubelet.
#[tokio::test]
async fn a_pause_asked_for_before_the_manifest_sync_stops_it_before_anything_is_switched(
) -> TestResult {
    let s = setup_keeping_kube_proxy().await?;
    let lines = Lines::default();
    let components_done = std::sync::atomic::AtomicBool::new(false);
    let report = |p: Progress| {
        if matches!(
            &p,
            Progress::StageFinished { stage, .. }
                if *stage == ichor::plan::StageId::KubeControllerManagerScheduler
        ) {
            components_done.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        lines.push(p);
    };
    let pause = || {
        components_done
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| "paused in cluster.yaml (spec.rollout.paused: true)".to_string())
    };
    let mut engine = s.engine(&report);
    engine.pause_requested = Some(&pause);
    let (outcome, _) = run_checked(&s, &engine, false).await?;
    let p = paused(outcome)?;
    assert_eq!(p.stage, "kube-proxy-manifests", "{p:?}\n{:#?}", lines.all());
    assert!(p.reason.contains("spec.rollout.paused"), "{}", p.reason);
    assert!(
        !lines.any("kube-proxy image on"),
        "a kube-proxy image was switched: {:#?}",
        lines.all()
    );
    Ok(())
}

/// Issue 19 item 3: no batch barriers. Two workers may be out together and no volume ties
/// them, so the plan batches w-1 with w-2 and w-3 alone; w-1's kubelet switch is slow. The
/// next worker starts as soon as w-2 frees its slot, not once w-1 (its batch's slowest)
/// is done — and never more than two are out.
#[tokio::test]
async fn the_next_worker_starts_when_a_slot_frees_not_when_its_batch_ends() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.slow_apply.insert(
        "w-3".into(),
        ichor::releaseset::HumanDuration::from_secs(25),
    );
    let edit = |t: &str| {
        t.replace("maxUnavailable: 1", "maxUnavailable: 2")
            .replace("provider: longhorn", "provider: none")
    };
    let mut s = setup_edited(config, &edit).await?;
    if let Some(doc) = s.change.cluster_doc.as_mut() {
        doc.spec.rollout.max_unavailable = std::num::NonZeroU32::new(2).ok_or("2")?;
        doc.spec.volumes.provider = ichor::releaseset::VolumeProvider::None;
    }
    replan(&mut s, &PlanOptions::default()).await?;
    let batches: Vec<Vec<String>> = s
        .plan
        .steps()
        .filter(|st| st.id.starts_with("worker/workers-"))
        .map(|st| st.nodes.clone())
        .collect();
    // The short batch first (`plan_batches`), its one node slow.
    assert_eq!(batches, [vec!["w-3"], vec!["w-1", "w-2"]], "{:#?}", s.plan);
    let (_, all) = completed(&s).await?;
    let pos = |needle: &str| {
        all.iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in {all:#?}"))
    };
    assert!(pos("worker w-1: on Talos") < pos("worker w-2: cordoned"));
    assert!(
        pos("worker w-2: cordoned") < pos("worker w-3: on Talos"),
        "w-2 waited for its predecessor batch's slowest node: {all:#?}"
    );
    Ok(())
}
