//! The live gate and `ichor status` against the whole twin (homelab folder), through ichor's
//! own Kubernetes and Talos clients over real sockets: each live item passing and failing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor::clock::Clock;
use ichor::gate::{self, live};
use ichor::kube::KubeClient;
use ichor::policy::Status;
use ichor::releaseset::{Bump, ReleaseSet};
use ichor::sim::twin::{ClusterFolder, DeprecatedApiRequest, Twin, TwinConfig, TwinOptions};
use ichor::talos::TalosClient;
use serde_json::{json, Value};

use crate::{homelab, stderr, stdout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Live {
    twin: Twin,
    kube: KubeClient,
    talos: TalosClient,
    _state: tempfile::TempDir,
}

/// The homelab cluster folder as the fixture's `main` has it (what the PR branches start
/// from), written out for the twin.
fn main_folder(dir: &Path) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let repo = ichor::git::Repo::open(homelab())?;
    let main = repo.resolve("main")?;
    let out = dir.join("homelab");
    std::fs::create_dir_all(&out)?;
    for f in ["cluster.yaml", "release-set.yaml"] {
        let text = repo
            .read_file(&main, &format!("clusters/homelab/{f}"))?
            .ok_or("missing in the fixture")?;
        std::fs::write(out.join(f), text)?;
    }
    Ok(out)
}

async fn start(config: TwinConfig) -> Result<Live, Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let twin = Twin::start(
        Clock::manual(),
        &ClusterFolder::read(&main_folder(state.path())?)?,
        state.path(),
        TwinOptions {
            config,
            github: None,
        },
    )
    .await?;
    // Let the nodes report in (heartbeats, Ready) before anything is judged.
    twin.advance(Duration::from_secs(30));
    let kube = KubeClient::connect(Some(twin.kubeconfig())).await?;
    let ctx = ichor::talos::config::load(twin.talosconfig(), None)?;
    let talos = TalosClient::new(ctx, twin.talos.clock().clone());
    Ok(Live {
        twin,
        kube,
        talos,
        _state: state,
    })
}

/// The fixture's change on `head`, judged live; `retarget` may move the head release set.
async fn judge(
    l: &Live,
    head: &str,
    retarget: Option<(&str, &str)>,
) -> Result<Vec<ichor::policy::CheckItem>, Box<dyn std::error::Error>> {
    let repo = ichor::git::Repo::open(homelab())?;
    let mut change = gate::load(&repo, "main", head, None)?;
    if let Some((from, to)) = retarget {
        let text = serde_yaml::to_string(&change.head_release_set)?.replace(from, to);
        change.head_release_set = ReleaseSet::parse("head", &text)?;
        change.bump = Bump::between(&change.base_release_set, &change.head_release_set);
    }
    let facts = live::observe(&l.kube, Some(&l.talos), &live::Subject::of(&change)).await;
    Ok(live::items(&change, &facts))
}

fn status_of(items: &[ichor::policy::CheckItem], id: &str) -> (Status, String) {
    items
        .iter()
        .find(|i| i.id == id)
        .map(|i| {
            (
                i.status,
                format!("{} {}", i.message, i.hint.clone().unwrap_or_default()),
            )
        })
        .unwrap_or_else(|| panic!("no item {id} in {items:#?}"))
}

#[tokio::test]
async fn a_healthy_cluster_passes_every_live_item() -> TestResult {
    let l = start(TwinConfig::default()).await?;
    let items = judge(&l, "renovate/cilium-1.18.x", None).await?;
    for id in [
        "live/nodes-ready",
        "live/etcd",
        "live/nodes-talos",
        "live/kubelet-skew",
        "live/rollout-lock",
        "live/cni-handover",
        "live/cni-running",
        "live/removed-apis",
    ] {
        let (s, msg) = status_of(&items, id);
        assert_eq!(s, Status::Pass, "{id}: {msg}");
    }
    Ok(())
}

#[tokio::test]
async fn a_node_that_does_not_come_back_and_a_lost_etcd_member_make_the_gate_wait() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.nodes_never_return = vec!["cp-2".into(), "w-1".into()];
    let l = start(config).await?;
    for ip in ["10.0.10.12", "10.0.10.21"] {
        l.talos.reboot(ip, Default::default()).await?;
    }
    l.twin.advance(Duration::from_secs(600));
    let items = judge(&l, "renovate/cilium-1.18.x", None).await?;
    let (s, msg) = status_of(&items, "live/nodes-ready");
    assert_eq!(s, Status::Wait, "{msg}");
    assert!(msg.contains("cp-2") && msg.contains("w-1"), "{msg}");
    let (s, msg) = status_of(&items, "live/etcd");
    assert_eq!(s, Status::Wait, "{msg}");
    assert!(msg.contains("unhealthy") && msg.contains("cp-2"), "{msg}");
    Ok(())
}

#[tokio::test]
async fn an_unfinished_hand_over_fails_and_a_lock_waits() -> TestResult {
    let l = start(TwinConfig::default()).await?;
    // Argo CD has not synced the CNI yet.
    let ar = kube::api::ApiResource {
        group: "argoproj.io".into(),
        version: "v1alpha1".into(),
        api_version: "argoproj.io/v1alpha1".into(),
        kind: "Application".into(),
        plural: "applications".into(),
    };
    let apps: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(kube_client(&l).await?, "argocd", &ar);
    apps.patch(
        "cilium",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"status": {"sync": {"status": "OutOfSync"}}})),
    )
    .await?;
    // Another rollout holds the lock.
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(kube_client(&l).await?);
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": live::ICHOR_NAMESPACE}}))?,
    )
    .await?;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(kube_client(&l).await?, live::ICHOR_NAMESPACE);
    let lease: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(json!({
        "metadata": {"name": live::lock_name("homelab"), "namespace": live::ICHOR_NAMESPACE},
        "spec": {"holderIdentity": "ichor-7d9f", "leaseDurationSeconds": 30}
    }))?;
    leases.create(&Default::default(), &lease).await?;
    let items = judge(&l, "renovate/cilium-1.18.x", None).await?;
    let (s, msg) = status_of(&items, "live/cni-handover");
    assert_eq!(s, Status::Fail, "{msg}");
    assert!(msg.contains("roll the CNI back"), "{msg}");
    let (s, msg) = status_of(&items, "live/rollout-lock");
    assert_eq!(s, Status::Wait, "{msg}");
    assert!(msg.contains("ichor-7d9f"), "{msg}");
    Ok(())
}

async fn kube_client(l: &Live) -> Result<kube::Client, Box<dyn std::error::Error>> {
    let kc = kube::config::Kubeconfig::read_from(l.twin.kubeconfig())?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}

#[tokio::test]
async fn a_cni_still_on_the_old_version_makes_the_gate_wait() -> TestResult {
    let l = start(TwinConfig::default()).await?;
    // The release set already says cilium 1.19 with Kubernetes 1.34; the cluster still runs
    // the base's cilium 1.18, which does not support 1.34.
    let items = judge(
        &l,
        "renovate/ghcr.io-siderolabs-kubelet-1.x",
        Some(("version: 1.18.3", "version: 1.19.1")),
    )
    .await?;
    let (s, msg) = status_of(&items, "live/cni-running");
    assert_eq!(s, Status::Wait, "{msg}");
    assert!(
        msg.contains("still runs cilium") && msg.contains("1.34"),
        "{msg}"
    );
    Ok(())
}

#[tokio::test]
async fn removed_apis_still_requested_warn_by_name() -> TestResult {
    let config = TwinConfig {
        deprecated_api_requests: vec![
            DeprecatedApiRequest {
                group: "flowcontrol.apiserver.k8s.io".into(),
                version: "v1beta3".into(),
                resource: "flowschemas".into(),
                removed_release: "1.32".into(),
            },
            DeprecatedApiRequest {
                group: "example.com".into(),
                version: "v1beta1".into(),
                resource: "widgets".into(),
                removed_release: "1.40".into(),
            },
        ],
        ..TwinConfig::default()
    };
    let l = start(config).await?;
    let items = judge(&l, "renovate/cilium-1.18.x", None).await?;
    let (s, msg) = status_of(&items, "live/removed-apis");
    assert_eq!(s, Status::Warn, "{msg}");
    assert!(
        msg.contains("flowcontrol.apiserver.k8s.io/v1beta3 flowschemas"),
        "{msg}"
    );
    assert!(!msg.contains("widgets"), "removed after the target: {msg}");
    Ok(())
}

#[tokio::test]
async fn an_unreachable_cluster_waits_never_passes() -> TestResult {
    let l = start(TwinConfig::default()).await?;
    let kubeconfig = std::fs::read_to_string(l.twin.kubeconfig())?;
    let dir = tempfile::tempdir()?;
    // Point the kubeconfig at a port nobody listens on.
    let url = l.twin.kube.url.clone();
    let dead = dir.path().join("kubeconfig");
    std::fs::write(&dead, kubeconfig.replace(&url, "https://127.0.0.1:1"))?;
    let kube = KubeClient::connect(Some(&dead)).await?;
    let repo = ichor::git::Repo::open(homelab())?;
    let change = gate::load(&repo, "main", "renovate/cilium-1.18.x", None)?;
    let facts = live::observe(&kube, None, &live::Subject::of(&change)).await;
    let items = live::items(&change, &facts);
    assert!(!items.is_empty());
    for i in &items {
        assert_ne!(
            i.status,
            Status::Pass,
            "{} passed without a cluster: {}",
            i.id,
            i.message
        );
    }
    assert_eq!(status_of(&items, "live/nodes-ready").0, Status::Wait);
    Ok(())
}

#[tokio::test]
async fn check_and_status_from_the_command_line() -> TestResult {
    let l = start(TwinConfig::default()).await?;
    let repo = homelab().to_string_lossy().into_owned();
    let kc = l.twin.kubeconfig().to_string_lossy().into_owned();
    let tc = l.twin.talosconfig().to_string_lossy().into_owned();
    let run = |args: Vec<String>| async move {
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
                .args(&args)
                .env_remove("KUBECONFIG")
                .env_remove("TALOSCONFIG")
                .output()
        })
        .await
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let o = run(s(&[
        "check",
        "--repo",
        &repo,
        "--base",
        "main",
        "--head",
        "renovate/cilium-1.18.x",
        "--kubeconfig",
        &kc,
        "--talosconfig",
        &tc,
        "--output",
        "json",
    ]))
    .await??;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout)?;
    let ids: Vec<&str> = v["clusters"][0]["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|i| i["id"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        ids.contains(&"live/etcd") && ids.contains(&"live/cni-handover"),
        "{ids:?}"
    );

    let o = run(s(&[
        "status",
        "--kubeconfig",
        &kc,
        "--talosconfig",
        &tc,
        "--repo",
        &repo,
        "--rev",
        "main",
    ]))
    .await??;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "cluster homelab (live)",
        "cp-1",
        "w-3",
        "v1.12.6",
        "etcd        3 members",
        "leader",
        "CNI         kube-system/cilium",
        "hand-over   Argo CD Synced, Healthy (complete)",
        "rollout lock  free",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let o = run(s(&["status", "--kubeconfig", &kc, "--output", "json"])).await??;
    let v: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["kind"], "StatusReport");
    assert_eq!(v["nodes"].as_array().map(Vec::len), Some(6));
    assert_eq!(
        v["cni"]["name"], "cilium",
        "found without a release set: {v:#}"
    );
    Ok(())
}

/// A worker that runs a pod of `default/web` (the app behind the `web` budget).
async fn node_with_web(l: &Live) -> Result<String, Box<dyn std::error::Error>> {
    for n in ["w-1", "w-2", "w-3"] {
        if l.kube
            .pods_on(n)
            .await?
            .iter()
            .any(|p| p.namespace == "default" && p.name.starts_with("web"))
        {
            return Ok(n.to_string());
        }
    }
    Err("no worker runs a web pod".into())
}

/// Drive the twin's clock while `fut` runs (the drain's backoff and the pods' grace periods
/// run on it).
async fn with_ticks<T>(twin: &Twin, fut: impl std::future::Future<Output = T>) -> T {
    let ticker = async {
        loop {
            tokio::task::yield_now().await;
            twin.advance(Duration::from_secs(5));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::select! {
        r = fut => r,
        _ = ticker => unreachable!("the ticker never ends"),
    }
}

#[tokio::test]
async fn cordon_marks_what_ichor_cordoned_and_only_that_is_uncordoned() -> TestResult {
    let l = start(TwinConfig::default()).await?;
    l.kube.cordon("w-1", "test-rollout").await?;
    let n = l
        .kube
        .nodes()
        .await?
        .into_iter()
        .find(|n| n.name == "w-1")
        .ok_or("w-1")?;
    assert!(n.cordoned && n.cordoned_by_ichor, "{n:?}");
    l.kube.cordon("w-1", "test-rollout").await?; // idempotent
    assert!(l.kube.uncordon("w-1", "test-rollout").await?);
    let n = l
        .kube
        .nodes()
        .await?
        .into_iter()
        .find(|n| n.name == "w-1")
        .ok_or("w-1")?;
    assert!(!n.cordoned && !n.cordoned_by_ichor, "{n:?}");
    // A node an operator cordoned stays cordoned: it is not ichor's to release.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(kube_client(&l).await?);
    nodes
        .patch(
            "w-2",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await?;
    l.kube.cordon("w-2", "test-rollout").await?;
    assert!(
        !l.kube.uncordon("w-2", "test-rollout").await?,
        "uncordoned someone else's cordon"
    );
    let n = l
        .kube
        .nodes()
        .await?
        .into_iter()
        .find(|n| n.name == "w-2")
        .ok_or("w-2")?;
    assert!(n.cordoned && !n.cordoned_by_ichor, "{n:?}");
    Ok(())
}

#[tokio::test]
async fn a_drain_evicts_everything_but_daemonsets_and_mirror_pods() -> TestResult {
    let l = start(TwinConfig::default()).await?;
    let node = node_with_web(&l).await?;
    let before = l.kube.pods_on(&node).await?;
    assert!(
        before.iter().any(|p| p.stays),
        "a DaemonSet pod runs there: {before:?}"
    );
    l.kube.cordon(&node, "test-rollout").await?;
    let clock = l.twin.talos.clock().clone();
    // Woken by a watch on the node's pods, as a rollout's step drains.
    let wake = l.kube.changes_of(&node, &[], &clock);
    let outcome = with_ticks(
        &l.twin,
        l.kube.drain(
            &node,
            Duration::from_secs(600),
            &clock,
            ichor::kube::DrainOptions {
                delete_empty_dir_data: true,
                ..Default::default()
            },
            Some(&wake),
        ),
    )
    .await?;
    match outcome {
        ichor::kube::DrainOutcome::Drained { evicted } => {
            assert!(
                evicted.iter().any(|p| p.starts_with("default/web")),
                "{evicted:?}"
            )
        }
        other => return Err(format!("{other:?}").into()),
    }
    let after = l.kube.pods_on(&node).await?;
    assert!(
        after.iter().all(|p| p.stays),
        "only DaemonSet and mirror pods stay: {after:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_budget_that_never_allows_stops_the_drain_for_a_human() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.pdbs_never_allow = vec!["default/web".into()];
    let l = start(config).await?;
    let node = node_with_web(&l).await?;
    l.kube.cordon(&node, "test-rollout").await?;
    let clock = l.twin.talos.clock().clone();
    let started = clock.now();
    let outcome = with_ticks(
        &l.twin,
        l.kube.drain(
            &node,
            Duration::from_secs(300),
            &clock,
            ichor::kube::DrainOptions {
                delete_empty_dir_data: true,
                ..Default::default()
            },
            None,
        ),
    )
    .await?;
    match outcome {
        ichor::kube::DrainOutcome::Blocked {
            pod,
            budget,
            waited_secs,
            ..
        } => {
            assert!(pod.starts_with("default/web"), "{pod}");
            assert_eq!(budget.as_deref(), Some("web"));
            assert!(waited_secs >= 300, "{waited_secs}");
        }
        other => return Err(format!("expected a stop, got {other:?}").into()),
    }
    assert!(clock.now().since(started) >= Duration::from_secs(300));
    // Never deleted: the blocked pod is still there.
    assert!(l
        .kube
        .pods_on(&node)
        .await?
        .iter()
        .any(|p| p.namespace == "default" && p.name.starts_with("web")));
    Ok(())
}

#[tokio::test]
async fn the_lock_has_one_holder_is_renewed_and_can_be_taken_once_expired() -> TestResult {
    use ichor::kube::LockState;
    let l = start(TwinConfig::default()).await?;
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(kube_client(&l).await?);
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": live::ICHOR_NAMESPACE}}))?,
    )
    .await?;
    let clock = l.twin.talos.clock().clone();
    let (ns, name, d) = (
        live::ICHOR_NAMESPACE,
        "ichor-rollout-homelab",
        Duration::from_secs(30),
    );
    assert_eq!(
        l.kube.acquire_lease(ns, name, "a", d, clock.now()).await?,
        LockState::Held
    );
    assert_eq!(
        l.kube.acquire_lease(ns, name, "b", d, clock.now()).await?,
        LockState::HeldBy { holder: "a".into() }
    );
    l.twin.advance(Duration::from_secs(20));
    assert_eq!(
        l.kube.acquire_lease(ns, name, "a", d, clock.now()).await?,
        LockState::Held,
        "renewed"
    );
    l.twin.advance(Duration::from_secs(20));
    assert!(
        matches!(
            l.kube.acquire_lease(ns, name, "b", d, clock.now()).await?,
            LockState::HeldBy { .. }
        ),
        "renewal kept it"
    );
    // a stops renewing: after its duration, b may take it, and a has lost it.
    l.twin.advance(Duration::from_secs(40));
    assert_eq!(
        l.kube.acquire_lease(ns, name, "b", d, clock.now()).await?,
        LockState::Held
    );
    assert_eq!(
        l.kube.acquire_lease(ns, name, "a", d, clock.now()).await?,
        LockState::HeldBy { holder: "b".into() }
    );
    // Racing writers: both try at once, exactly one holds it.
    l.kube.release_lease(ns, name, "b").await?;
    let (x, y) = tokio::join!(
        l.kube.acquire_lease(ns, name, "x", d, clock.now()),
        l.kube.acquire_lease(ns, name, "y", d, clock.now())
    );
    let held = [x?, y?].iter().filter(|s| **s == LockState::Held).count();
    assert_eq!(held, 1, "exactly one of two racing writers holds the lock");
    Ok(())
}

/// A twin with ichor's namespace created, and its Leases as a plain client sees them.
async fn start_with_lock_namespace(
) -> Result<(Live, kube::Api<k8s_openapi::api::coordination::v1::Lease>), Box<dyn std::error::Error>>
{
    let l = start(TwinConfig::default()).await?;
    let raw = kube_client(&l).await?;
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(raw.clone());
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": live::ICHOR_NAMESPACE}}))?,
    )
    .await?;
    Ok((l, kube::Api::namespaced(raw, live::ICHOR_NAMESPACE)))
}

/// The holder renews in one write over the lease as it last wrote it (client-go's fast
/// path); a lease someone else wrote meanwhile makes that write a 409, and the lease is
/// then read and judged, never overwritten.
#[tokio::test]
async fn the_holder_renews_in_one_write_and_a_lease_taken_meanwhile_is_read() -> TestResult {
    use ichor::kube::LockState;
    let (l, leases) = start_with_lock_namespace().await?;
    let clock = l.twin.talos.clock().clone();
    let (ns, name, d) = (
        live::ICHOR_NAMESPACE,
        "ichor-rollout-homelab",
        Duration::from_secs(30),
    );
    let count = |verb: &str| {
        l.twin
            .kube
            .audit()
            .counts()
            .get(&(verb.to_string(), "leases".to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        l.kube
            .acquire_lease(ns, name, "ichor", d, clock.now())
            .await?,
        LockState::Held
    );
    for n in 1..=3 {
        let (gets, updates) = (count("get"), count("update"));
        l.twin.advance(Duration::from_secs(10));
        assert_eq!(
            l.kube
                .acquire_lease(ns, name, "ichor", d, clock.now())
                .await?,
            LockState::Held
        );
        assert_eq!(
            (count("get") - gets, count("update") - updates),
            (0, 1),
            "renewal {n}: one write, no read"
        );
    }
    let renewed = leases.get(name).await?;
    assert_eq!(
        renewed
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.as_second()),
        Some((clock.now().as_millis() / 1000) as i64),
        "the write carried this renewal's time"
    );
    // Someone else takes the lease over (as after an expiry ichor did not see).
    let mut theirs = renewed.clone();
    if let Some(spec) = theirs.spec.as_mut() {
        spec.holder_identity = Some("other".into());
    }
    leases.replace(name, &Default::default(), &theirs).await?;
    let gets = count("get");
    assert_eq!(
        l.kube
            .acquire_lease(ns, name, "ichor", d, clock.now())
            .await?,
        LockState::HeldBy {
            holder: "other".into()
        },
        "the stale write is refused and the lease read"
    );
    assert!(count("get") > gets, "the lease was read after the 409");
    assert_eq!(
        leases.get(name).await?.spec.and_then(|s| s.holder_identity),
        Some("other".into()),
        "never overwritten"
    );
    Ok(())
}

/// Expiry is judged as client-go's leader election judges it: from when this client saw the
/// lease change, never from the holder's clock. A holder whose clock runs an hour behind
/// but who keeps renewing keeps the lock; once it stops, it is free a duration later.
#[tokio::test]
async fn a_lease_expires_by_the_time_it_was_seen_not_by_the_holders_clock() -> TestResult {
    use ichor::kube::LockState;
    let (l, leases) = start_with_lock_namespace().await?;
    let clock = l.twin.talos.clock().clone();
    let name = "ichor-rollout-homelab";
    let d = Duration::from_secs(30);
    // The other holder writes times an hour behind ichor's.
    let renew = |n: u32| {
        let behind = clock.now().as_millis().saturating_sub(3_600_000);
        let t = ichor::clock::Timestamp::from_millis(behind + u64::from(n) * 1000).rfc3339();
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": name, "namespace": live::ICHOR_NAMESPACE},
               "spec": {"holderIdentity": "skewed", "leaseDurationSeconds": 30,
                        "acquireTime": t.replace('Z', ".000000Z"), "renewTime": t.replace('Z', ".000000Z")}})
    };
    leases
        .create(&Default::default(), &serde_json::from_value(renew(0))?)
        .await?;
    for n in 1..4 {
        assert_eq!(
            l.kube
                .acquire_lease(live::ICHOR_NAMESPACE, name, "ichor", d, clock.now())
                .await?,
            LockState::HeldBy {
                holder: "skewed".into()
            },
            "renewal {n}: a live holder is never taken over"
        );
        l.twin.advance(Duration::from_secs(20));
        let mut current = leases.get(name).await?;
        let fresh: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(renew(n))?;
        current.spec = fresh.spec;
        leases.replace(name, &Default::default(), &current).await?;
    }
    // It stops renewing: seen unchanged for longer than its duration, it is free.
    assert!(matches!(
        l.kube
            .acquire_lease(live::ICHOR_NAMESPACE, name, "ichor", d, clock.now())
            .await?,
        LockState::HeldBy { .. }
    ));
    l.twin.advance(Duration::from_secs(31));
    assert_eq!(
        l.kube
            .acquire_lease(live::ICHOR_NAMESPACE, name, "ichor", d, clock.now())
            .await?,
        LockState::Held
    );
    Ok(())
}

#[tokio::test]
async fn a_blocked_eviction_is_retried_until_the_budget_allows_it() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.pdbs_never_allow = vec!["default/web".into()];
    let l = start(config).await?;
    let node = node_with_web(&l).await?;
    l.kube.cordon(&node, "test-rollout").await?;
    let clock = l.twin.talos.clock().clone();
    let drain = l.kube.drain(
        &node,
        Duration::from_secs(1800),
        &clock,
        ichor::kube::DrainOptions {
            delete_empty_dir_data: true,
            ..Default::default()
        },
        None,
    );
    // After ten simulated minutes the budget allows again (the fault is lifted at run time).
    // with_ticks moves the clock; this only waits on it.
    let lift = async {
        clock.sleep(Duration::from_secs(600)).await;
        let url = format!("{}/_twin/faults", l.twin.kube.url);
        let body = json!({"pdbNeverAllows": {"namespace": "default", "name": "web", "on": false}});
        post_json(&l, &url, &body).await
    };
    let (outcome, lifted) = with_ticks(&l.twin, async { tokio::join!(drain, lift) }).await;
    lifted?;
    match outcome? {
        ichor::kube::DrainOutcome::Drained { evicted } => {
            assert!(
                evicted.iter().any(|p| p.starts_with("default/web")),
                "{evicted:?}"
            )
        }
        other => return Err(format!("expected the drain to finish, got {other:?}").into()),
    }
    Ok(())
}

/// POST a JSON body to the twin's Kubernetes side with the kubeconfig's token.
async fn post_json(l: &Live, url: &str, body: &Value) -> Result<(), Box<dyn std::error::Error>> {
    let client = kube_client(l).await?;
    let req = http::Request::post(url.trim_start_matches(&l.twin.kube.url).to_string())
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body)?)?;
    client.request_text(req).await?;
    Ok(())
}

#[tokio::test]
async fn an_unreachable_cluster_exits_3_from_the_command_line() -> TestResult {
    let dir = tempfile::tempdir()?;
    let l = start(TwinConfig::default()).await?;
    let dead = dir.path().join("kubeconfig");
    let text = std::fs::read_to_string(l.twin.kubeconfig())?
        .replace(&l.twin.kube.url, "https://127.0.0.1:1");
    std::fs::write(&dead, text)?;
    let repo = homelab().to_string_lossy().into_owned();
    let dead = dead.to_string_lossy().into_owned();
    let o = tokio::task::spawn_blocking(move || {
        crate::ichor(&[
            "check",
            "--repo",
            &repo,
            "--base",
            "main",
            "--head",
            "renovate/cilium-1.18.x",
            "--kubeconfig",
            &dead,
        ])
    })
    .await?;
    assert_eq!(o.status.code(), Some(3), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("WAITING"), "{}", stdout(&o));
    // One line on stderr naming the API server and the OS's error; no library log lines,
    // no terminal colours into a pipe.
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0]
            .starts_with("warning: cannot reach the Kubernetes API server https://127.0.0.1:1:")
            && lines[0].contains("Connection refused"),
        "{err}"
    );
    assert!(
        !err.contains('\u{1b}') && !stdout(&o).contains('\u{1b}'),
        "{err}"
    );
    Ok(())
}

/// ADR 0057 pre-check 1, from the live Nodes: a kubelet two minors behind the target is
/// refused before anything is touched, not jumped two minors; a patch behind is fine.
#[tokio::test]
async fn a_kubelet_two_minors_behind_the_target_is_refused_not_jumped() -> TestResult {
    let l = start(TwinConfig::default()).await?;
    let branch = "renovate/ghcr.io-siderolabs-kubelet-1.x";
    for (kubelet, want) in [("v1.33.0", Status::Pass), ("v1.32.9", Status::Fail)] {
        l.twin
            .kube
            .with(|c, now| c.set_kubelet_version("w-1", kubelet, now))?;
        let items = judge(&l, branch, None).await?;
        let (s, msg) = status_of(&items, "live/kubelet-skew");
        assert_eq!(s, want, "{kubelet}: {msg}");
    }
    let items = judge(&l, branch, None).await?;
    let (_, msg) = status_of(&items, "live/kubelet-skew");
    assert!(msg.contains("w-1 (v1.32.9, 2 minors)"), "{msg}");
    Ok(())
}

/// A DaemonSet is rolled out only once its status observed the current generation: right
/// after a spec change the counts still describe the old template (the twin's controller
/// writes the new generation's status a moment later, as kube-controller-manager does).
#[tokio::test]
async fn a_daemonset_is_not_rolled_out_until_its_status_observed_the_new_generation() -> TestResult
{
    let l = start(TwinConfig::default()).await?;
    let before = l
        .kube
        .daemonset("kube-system", "cilium")
        .await?
        .ok_or("no cilium")?;
    assert!(before.rolled_out(), "{before:?}");
    let dss: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
        kube::Api::namespaced(kube_client(&l).await?, "kube-system");
    dss.patch(
        "cilium",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "cilium", "image": "quay.io/cilium/cilium:v1.18.9"}]}}}})),
    )
    .await?;
    let raw = dss.get("cilium").await?;
    let stale = raw.status.as_ref().and_then(|s| s.observed_generation);
    assert!(
        stale < raw.metadata.generation,
        "the status lags its generation: {stale:?} vs {:?}",
        raw.metadata.generation
    );
    let now = l
        .kube
        .daemonset("kube-system", "cilium")
        .await?
        .ok_or("no cilium")?;
    assert!(!now.observed && !now.rolled_out(), "{now:?}");
    // Once the controller has caught up and the pods moved, it is rolled out again.
    l.twin.advance(Duration::from_secs(600));
    let later = l
        .kube
        .daemonset("kube-system", "cilium")
        .await?
        .ok_or("no cilium")?;
    assert!(later.observed, "{later:?}");
    Ok(())
}

/// ADR 0057 pre-check 5: a failed `/metrics` scrape is recorded as Unknown, a warning, never
/// a wait. The identity here may read every object but no non-resource URL, so the twin's RBAC
/// answers the scrape with the apiserver's 403, as a real cluster does for a Role without
/// `nonResourceURLs: [/metrics]`.
#[tokio::test]
async fn an_unreadable_metrics_endpoint_is_unknown_a_warning_never_a_wait() -> TestResult {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::{Api, PostParams};

    let l = start(TwinConfig::default()).await?;
    let admin = kube_client(&l).await?;
    let pp = PostParams::default();
    let sa: ServiceAccount = serde_json::from_value(json!({
        "metadata": {"name": "reader", "namespace": "default"}
    }))?;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    sas.create(&pp, &sa).await?;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]
    }))?;
    Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &role)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &binding)
        .await?;
    let token = sas
        .create_token_request(
            "reader",
            &pp,
            &TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(86_400),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?
        .status
        .ok_or("a TokenRequest answers with a status")?
        .token;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("reader.kubeconfig");
    std::fs::write(
        &path,
        std::fs::read_to_string(l.twin.kubeconfig())?.replace(l.twin.kube.token(), &token),
    )?;
    let kube = KubeClient::connect(Some(&path)).await?;
    assert!(
        kube.deprecated_apis().await.is_err(),
        "the twin must refuse /metrics to an identity without the non-resource URL"
    );

    let repo = ichor::git::Repo::open(homelab())?;
    let change = gate::load(&repo, "main", "renovate/cilium-1.18.x", None)?;
    let facts = live::observe(&kube, Some(&l.talos), &live::Subject::of(&change)).await;
    let items = live::items(&change, &facts);
    let (s, msg) = status_of(&items, "live/removed-apis");
    assert_eq!(s, Status::Warn, "{msg}");
    assert!(
        msg.contains("Unknown") && msg.contains("forbidden") && msg.contains("/metrics"),
        "{msg}"
    );
    // The rest of what that identity reads still passes: the scrape alone is unknown.
    assert_eq!(status_of(&items, "live/nodes-ready").0, Status::Pass);
    Ok(())
}
