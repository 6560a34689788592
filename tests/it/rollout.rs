//! The rollout engine's Talos stage against the whole twin, with an invariant checker fed
//! by the twin's own state (not the engine's opinion of it) after every tick of the clock.

use std::cell::RefCell;
use std::time::Duration;

use ichor::clock::Clock;
use ichor::gate::{self, live};
use ichor::kube::KubeClient;
use ichor::plan::PlanOptions;
use ichor::rollout::{Rollout, StageOutcome};
use ichor::sim::talos::Role;
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
use ichor::talos::TalosClient;
use serde_json::json;

use crate::homelab;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// What the twin itself says about safety at one instant: control planes down, workers
/// unavailable (down or cordoned), and whether etcd has quorum.
fn violations(twin: &Twin, max_unavailable: usize) -> Vec<String> {
    let obs = twin.talos.observe();
    let cordoned = |name: &str| {
        twin.kube.with(|c, _| {
            c.get("nodes", "", name)
                .and_then(|n| n.pointer("/spec/unschedulable").and_then(|v| v.as_bool()))
                .unwrap_or(false)
        })
    };
    let cps_down: Vec<&str> = obs
        .iter()
        .filter(|o| o.role == Role::ControlPlane && !(o.up && o.ready))
        .map(|o| o.name.as_str())
        .collect();
    let workers_out: Vec<&str> = obs
        .iter()
        .filter(|o| o.role == Role::Worker && (!(o.up && o.ready) || cordoned(&o.name)))
        .map(|o| o.name.as_str())
        .collect();
    let mut out = Vec::new();
    if cps_down.len() > 1 {
        out.push(format!("two control planes down: {cps_down:?}"));
    }
    if workers_out.len() > max_unavailable {
        out.push(format!(
            "more than {max_unavailable} workers unavailable: {workers_out:?}"
        ));
    }
    if !twin.talos.with_model(|m| m.etcd_has_quorum()) {
        out.push("etcd lost quorum".into());
    }
    // Never a kubelet newer than any apiserver.
    let version =
        |s: &str| ichor::releaseset::Version::parse(s.rsplit(':').next().unwrap_or(s)).ok();
    let apiservers: Vec<ichor::releaseset::Version> = obs
        .iter()
        .flat_map(|o| o.static_pods.iter())
        .filter(|p| p.component == ichor::sim::talos::Component::ApiServer)
        .filter_map(|p| version(&p.image))
        .collect();
    if let Some(oldest) = apiservers.iter().min() {
        for o in &obs {
            if version(&o.kubelet_version).is_some_and(|k| k > *oldest) {
                out.push(format!(
                    "kubelet {} on {} is newer than apiserver {oldest}",
                    o.kubelet_version, o.name
                ));
            }
        }
    }
    out
}

struct Setup {
    twin: Twin,
    kube: KubeClient,
    talos: TalosClient,
    change: gate::Change,
    plan: ichor::plan::Plan,
    nodes: Vec<ichor::kube::LiveNode>,
    _state: tempfile::TempDir,
}

/// The twin running the homelab cluster as main describes it, ichor's namespace created,
/// and the plan of the fixture's grouped Talos + Kubernetes PR from the live nodes.
async fn setup(config: TwinConfig) -> Result<Setup, Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let repo = ichor::git::Repo::open(homelab())?;
    let change = gate::load(&repo, "main", "renovate/talos", None)?;
    let dir = state.path().join("homelab");
    std::fs::create_dir_all(&dir)?;
    let main = repo.resolve("main")?;
    for f in ["cluster.yaml", "release-set.yaml"] {
        let text = repo
            .read_file(&main, &format!("clusters/homelab/{f}"))?
            .ok_or("missing")?;
        std::fs::write(dir.join(f), text)?;
    }
    let twin = Twin::start(
        Clock::manual(),
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
    let clock = twin.talos.clock().clone();
    let talos = TalosClient::new(ichor::talos::config::load(twin.talosconfig(), None)?, clock);
    // deploy/ creates ichor's namespace; the twin starts without it.
    let client = {
        let kc = kube::config::Kubeconfig::read_from(twin.kubeconfig())?;
        kube::Client::try_from(
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
        )?
    };
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": live::ICHOR_NAMESPACE}}))?,
    )
    .await?;
    let nodes = kube.nodes().await?;
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
        nodes,
        _state: state,
    })
}

#[derive(Clone, Copy)]
enum Which {
    Talos,
    Kubernetes,
}

/// Run the Talos stage while the clock moves, checking the invariants after every tick.
async fn run_stage(s: &Setup) -> Result<(StageOutcome, Vec<String>), Box<dyn std::error::Error>> {
    run(s, Which::Talos).await
}

async fn run(
    s: &Setup,
    which: Which,
) -> Result<(StageOutcome, Vec<String>), Box<dyn std::error::Error>> {
    let doc = s.change.cluster_doc.clone().ok_or("no cluster.yaml")?;
    let engine = Rollout {
        kube: &s.kube,
        talos: &s.talos,
        clock: s.twin.talos.clock().clone(),
        cluster: "homelab".into(),
        holder: "ichor-test".into(),
        policy: doc.spec.rollout.clone(),
        installer_image: doc
            .spec
            .talos
            .installer_image
            .clone()
            .ok_or("no installer image")?,
        report: None,
    };
    let max_unavailable = doc.spec.rollout.max_unavailable.get() as usize;
    let seen = RefCell::new(Vec::<String>::new());
    let talos = s.change.head_release_set.spec.talos.clone();
    let k8s = s.change.head_release_set.spec.kubernetes.clone();
    let run = async {
        match which {
            Which::Talos => engine.talos_stage(&s.plan, &talos, &s.nodes).await,
            Which::Kubernetes => engine.kubernetes_stages(&s.plan, &k8s, &s.nodes).await,
        }
    };
    let ticker = async {
        loop {
            tokio::task::yield_now().await;
            s.twin.advance(Duration::from_secs(2));
            seen.borrow_mut()
                .extend(violations(&s.twin, max_unavailable));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let outcome = tokio::select! {
        r = run => r?,
        _ = ticker => unreachable!("the ticker never ends"),
    };
    let seen = seen.into_inner();
    Ok((outcome, seen))
}

#[tokio::test]
async fn the_talos_stage_upgrades_every_node_and_never_breaks_an_invariant() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let (outcome, seen) = run_stage(&s).await?;
    assert_eq!(
        seen,
        Vec::<String>::new(),
        "invariants broken during the rollout"
    );
    match outcome {
        StageOutcome::Completed { nodes } => {
            assert_eq!(
                nodes,
                ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3"],
                "the plan's order"
            )
        }
        other => return Err(format!("expected completion, got {other:?}").into()),
    }
    for o in s.twin.talos.observe() {
        assert_eq!(o.talos_version, "v1.12.9", "{} not upgraded", o.name);
        assert!(o.ready, "{} not Ready", o.name);
    }
    for n in s.kube.nodes().await? {
        assert!(!n.cordoned, "{} left cordoned", n.name);
    }
    assert_eq!(
        s.kube
            .lease_holder(live::ICHOR_NAMESPACE, "ichor-rollout-homelab")
            .await?,
        None,
        "the lock is released"
    );
    // A second run finds everything done from what it observes.
    let (again, _) = run_stage(&s).await?;
    assert!(matches!(again, StageOutcome::Completed { .. }), "{again:?}");
    Ok(())
}

#[tokio::test]
async fn a_failing_installer_pull_pauses_before_anything_is_disrupted() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let doc = s.change.cluster_doc.clone().ok_or("no cluster.yaml")?;
    let installer = format!(
        "{}:v1.12.9",
        doc.spec.talos.installer_image.clone().ok_or("image")?
    );
    s.twin
        .talos
        .with_model(|m| m.set_failing_image(&installer, true));
    let (outcome, seen) = run_stage(&s).await?;
    assert_eq!(seen, Vec::<String>::new());
    match outcome {
        StageOutcome::Paused { node, reason } => {
            assert_eq!(node, "cp-1");
            assert!(
                reason.contains("pre-pulling") && reason.contains("nothing was disrupted"),
                "{reason}"
            );
        }
        other => return Err(format!("expected a pause, got {other:?}").into()),
    }
    for n in s.kube.nodes().await? {
        assert!(!n.cordoned && n.ready, "{} was disrupted", n.name);
    }
    for o in s.twin.talos.observe() {
        assert_eq!(o.talos_version, "v1.12.6", "{} moved", o.name);
    }
    Ok(())
}

#[tokio::test]
async fn a_node_that_never_returns_pauses_with_its_root_cause() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.nodes_never_return = vec!["w-2".into()];
    let s = setup(config).await?;
    let (outcome, seen) = run_stage(&s).await?;
    assert_eq!(seen, Vec::<String>::new());
    match outcome {
        StageOutcome::Paused { node, reason } => {
            assert_eq!(node, "w-2");
            assert!(reason.contains("not have come back"), "{reason}");
        }
        other => return Err(format!("expected a pause, got {other:?}").into()),
    }
    // Everything before w-2 is done and back in service; nothing after it was touched.
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
async fn a_grouped_bump_rolls_talos_then_kubernetes_and_no_kubelet_outruns_an_apiserver(
) -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let (talos, seen) = run(&s, Which::Talos).await?;
    assert!(matches!(talos, StageOutcome::Completed { .. }), "{talos:?}");
    assert_eq!(seen, Vec::<String>::new());
    let (kube, seen) = run(&s, Which::Kubernetes).await?;
    assert_eq!(
        seen,
        Vec::<String>::new(),
        "invariants broken during the Kubernetes stages"
    );
    match kube {
        StageOutcome::Completed { nodes } => {
            // apiservers on every control plane first, then controller-manager/scheduler,
            // then kubelets: control planes before workers.
            let first_kubelet = nodes
                .iter()
                .position(|n| n.starts_with("kubelet/"))
                .ok_or("no kubelet step")?;
            assert!(
                nodes[..first_kubelet]
                    .iter()
                    .filter(|n| n.starts_with("kube-apiserver/"))
                    .count()
                    == 3,
                "{nodes:?}"
            );
            assert_eq!(
                &nodes[first_kubelet..],
                [
                    "kubelet/cp-1",
                    "kubelet/cp-2",
                    "kubelet/cp-3",
                    "kubelet/w-1",
                    "kubelet/w-2",
                    "kubelet/w-3"
                ]
            );
        }
        other => return Err(format!("expected completion, got {other:?}").into()),
    }
    for o in s.twin.talos.observe() {
        assert!(
            o.kubelet_version.ends_with("v1.33.7"),
            "{}: kubelet {}",
            o.name,
            o.kubelet_version
        );
        for p in &o.static_pods {
            assert!(
                p.image.ends_with(":v1.33.7") && p.ready,
                "{}: {:?}",
                o.name,
                p
            );
        }
    }
    for n in s.kube.nodes().await? {
        assert!(
            !n.cordoned && n.ready,
            "{} left cordoned or not Ready",
            n.name
        );
    }
    Ok(())
}
