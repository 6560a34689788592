//! ichor's Talos client (`src/talos`) against the Talos twin over real mutual TLS on
//! loopback: every call passing and failing, routing, failover, avoidance and deadlines.
//! Time moves only through the shared manual clock.

use std::time::Duration;

use ichor::clock::Clock;
use ichor::sim::talos::{ConfigForm, NodeSpec, Role, TalosTwin, TalosTwinOptions};
use ichor::talos::client::{CallOptions, ImageNamespace, TalosClient, TalosError, UpgradeApi};
use ichor::talos::config::{self, Endpoint};
use ichor::talos::machine_config::{set_images, Component, EditError};
use ichor::talos::proto::machine::apply_configuration_request::Mode;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn node(name: &str, role: Role, ip: [u8; 4], talos: &str, form: ConfigForm) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        role,
        ip: ip.into(),
        talos_version: talos.into(),
        kubernetes_version: "v1.33.5".into(),
        kubelet_version: "v1.33.5".into(),
        config_form: form,
    }
}

fn cluster(talos: &str) -> Vec<NodeSpec> {
    let v1 = ConfigForm::V1Alpha1;
    vec![
        node("cp-1", Role::ControlPlane, [10, 5, 0, 2], talos, v1),
        node("cp-2", Role::ControlPlane, [10, 5, 0, 3], talos, v1),
        node("cp-3", Role::ControlPlane, [10, 5, 0, 4], talos, v1),
        node("w-1", Role::Worker, [10, 5, 0, 10], talos, v1),
        node(
            "w-2",
            Role::Worker,
            [10, 5, 0, 11],
            "v1.14.0",
            ConfigForm::MultiDoc,
        ),
    ]
}

struct Sim {
    twin: TalosTwin,
    clock: Clock,
    client: TalosClient,
    _dir: tempfile::TempDir,
}

async fn start(nodes: Vec<NodeSpec>) -> Result<Sim, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = Clock::manual();
    let twin = TalosTwin::start(
        clock.clone(),
        nodes,
        dir.path(),
        TalosTwinOptions::default(),
    )
    .await?;
    let ctx = config::load(twin.talosconfig_path(), None)?;
    let client = TalosClient::new(ctx, clock.clone());
    Ok(Sim {
        twin,
        clock,
        client,
        _dir: dir,
    })
}

const CP1: &str = "10.5.0.2";
const W1: &str = "10.5.0.10";
const W2: &str = "10.5.0.11";

fn opts() -> CallOptions<'static> {
    CallOptions::default()
}

/// Advance the clock in steps until `f` holds (the twin's timers fire as time moves).
async fn advance_until(
    clock: &Clock,
    step: Duration,
    max_steps: usize,
    mut f: impl FnMut() -> bool,
) -> bool {
    for _ in 0..max_steps {
        if f() {
            return true;
        }
        clock.advance(step);
        tokio::task::yield_now().await;
    }
    f()
}

#[tokio::test]
async fn reads_versions_services_etcd_and_boot_ids_through_any_control_plane() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    let v = sim.client.version(W1, opts()).await?;
    assert_eq!(v.tag, "v1.12.6");
    assert_eq!(v.upgrade_api, UpgradeApi::Machine);
    let v = sim.client.version(W2, opts()).await?;
    assert_eq!(v.upgrade_api, UpgradeApi::Lifecycle, "1.14 has the new API");
    let services = sim.client.services(W1, opts()).await?;
    assert!(
        services.iter().any(|s| s.id == "kubelet" && s.healthy),
        "{services:?}"
    );
    let members = sim.client.etcd_members(CP1, opts()).await?;
    assert_eq!(members.len(), 3);
    assert!(members.iter().all(|m| !m.is_learner));
    let status = sim.client.etcd_status(CP1, opts()).await?;
    assert!(members.iter().any(|m| m.id == status.member_id));
    assert_ne!(status.leader, 0);
    let boot = sim.client.boot_id(W1, opts()).await?;
    assert_eq!(boot.len(), 36);
    Ok(())
}

#[tokio::test]
async fn etcd_leadership_moves_off_the_leader() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    let leader = sim
        .twin
        .with_model(|m| m.etcd_leader().map(str::to_string))
        .ok_or("no leader")?;
    let ip = sim
        .twin
        .observe()
        .into_iter()
        .find(|o| o.name == leader)
        .map(|o| o.ip.to_string())
        .ok_or("no leader ip")?;
    let to = sim.client.etcd_forfeit_leadership(&ip, opts()).await?;
    assert!(to.is_some());
    let now = sim.twin.with_model(|m| m.etcd_leader().map(str::to_string));
    assert_ne!(now.as_deref(), Some(leader.as_str()));
    Ok(())
}

/// A certificate past its end on the node's clock is refused at the handshake, and the error
/// says so, naming the node and the endpoint; a connection made before it expired is not
/// asked again (TLS checks at the handshake only), a new one is.
#[tokio::test]
async fn an_expired_certificate_is_named_as_such() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    let cert = sim
        .twin
        .issue_client_expiring("admin", &["os:admin"], Duration::from_secs(60))?;
    let mut ctx = sim.client.context().clone();
    ctx.crt_pem = cert.cert_pem;
    ctx.key_pem = cert.key_pem;
    let c = TalosClient::new(ctx.clone(), sim.clock.clone());
    assert_eq!(c.version(W1, opts()).await?.tag, "v1.12.6");
    sim.clock.advance(Duration::from_secs(61));
    // The connection from before still carries calls.
    assert_eq!(c.version(W1, opts()).await?.tag, "v1.12.6");
    let fresh = TalosClient::new(ctx, sim.clock.clone());
    let e = fresh
        .version(W1, opts())
        .await
        .err()
        .ok_or("expired cert accepted")?;
    assert!(matches!(e, TalosError::Handshake { .. }), "{e}");
    assert!(e.refuses_credentials());
    let text = e.to_string();
    assert!(text.contains("Version on 10.5.0.10"), "{text}");
    assert!(
        text.contains("mutual TLS with endpoint 127.0.0.1:"),
        "{text}"
    );
    assert!(text.to_ascii_lowercase().contains("expired"), "{text}");
    Ok(())
}

#[tokio::test]
async fn mutual_tls_is_required_and_roles_are_enforced() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    // A client certificate from another CA: the handshake fails on every endpoint.
    let other_dir = tempfile::tempdir()?;
    let other = TalosTwin::start(
        Clock::manual(),
        cluster("v1.12.6"),
        other_dir.path(),
        TalosTwinOptions::default(),
    )
    .await?;
    let mut foreign = config::load(other.talosconfig_path(), None)?;
    foreign.endpoints = sim.client.endpoints().to_vec();
    let c = TalosClient::new(foreign, sim.clock.clone());
    let e = c
        .version(W1, opts())
        .await
        .err()
        .ok_or("foreign cert accepted")?;
    // The real error, naming the endpoint, not "unreachable".
    assert!(matches!(e, TalosError::Handshake { .. }), "{e}");
    assert!(e.to_string().contains("Version on 10.5.0.10"), "{e}");
    assert!(e.to_string().contains("mutual TLS with endpoint"), "{e}");

    // A reader may read but not apply.
    let reader = sim.twin.issue_client("reader", &["os:reader"])?;
    let mut ctx = sim.client.context().clone();
    ctx.crt_pem = reader.cert_pem;
    ctx.key_pem = reader.key_pem;
    let c = TalosClient::new(ctx, sim.clock.clone());
    c.version(W1, opts()).await?;
    let e = c
        .apply_configuration(W1, "version: v1alpha1\n", Mode::NoReboot, true, opts())
        .await
        .err()
        .ok_or("reader applied")?;
    assert!(matches!(e, TalosError::PermissionDenied { .. }), "{e}");
    assert_eq!(e.kind(), "permission_denied");
    Ok(())
}

#[tokio::test]
async fn fails_over_when_an_endpoint_is_down() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    let mut ctx = sim.client.context().clone();
    // A closed port first: dialling it fails, the next endpoint answers.
    ctx.endpoints.insert(0, Endpoint::parse("127.0.0.1:1")?);
    let c = TalosClient::new(ctx, sim.clock.clone());
    assert_eq!(c.version(W1, opts()).await?.tag, "v1.12.6");

    // Every endpoint gone: the error names the node, the call and what was tried.
    let mut ctx = sim.client.context().clone();
    ctx.endpoints = vec![
        Endpoint::parse("127.0.0.1:1")?,
        Endpoint::parse("127.0.0.1:2")?,
    ];
    let c = TalosClient::new(ctx, sim.clock.clone());
    let e = c
        .version(W1, opts())
        .await
        .err()
        .ok_or("no endpoint, yet an answer")?;
    assert!(matches!(e, TalosError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains("127.0.0.1:1, 127.0.0.1:2"), "{e}");
    Ok(())
}

#[tokio::test]
async fn a_call_about_a_rebooting_control_plane_avoids_its_endpoint() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    // Start on cp-1's endpoint, then reboot cp-1.
    sim.client.version(CP1, opts()).await?;
    let before = sim.client.boot_id(CP1, opts()).await?;
    sim.client.reboot(CP1, opts()).await?;
    // Avoiding cp-1 (by name or address), the calls that watch it travel elsewhere and
    // report the node as it is (down), never "unreachable through cp-1".
    let avoid = CallOptions {
        avoid: Some("cp-1"),
        ..opts()
    };
    let came_back = advance_until(&sim.clock, Duration::from_secs(10), 60, || {
        sim.twin
            .observe()
            .iter()
            .any(|o| o.name == "cp-1" && o.ready && o.boot_id != before)
    })
    .await;
    assert!(came_back, "cp-1 never came back");
    let after = sim.client.boot_id(CP1, avoid).await?;
    assert_ne!(after, before);
    let cp1 = sim
        .twin
        .endpoint("cp-1")
        .ok_or("no cp-1 endpoint")?
        .to_string();
    assert_ne!(
        sim.client.last_endpoint().map(|e| e.to_string()),
        Some(cp1.clone()),
        "the call about cp-1 went through cp-1"
    );
    // Without avoidance the same call may well use cp-1 itself (it is back).
    for _ in 0..3 {
        sim.client.version(CP1, avoid).await?;
        assert_ne!(
            sim.client.last_endpoint().map(|e| e.to_string()),
            Some(cp1.clone())
        );
    }
    // And the client can tell every endpoint apart: with cp-1, cp-2 and cp-3 avoided in turn
    // it still reaches the node about which it asks.
    for avoid in ["cp-1", "cp-2", "cp-3", "10.5.0.3"] {
        let o = CallOptions {
            avoid: Some(avoid),
            ..opts()
        };
        sim.client.version(W1, o).await?;
    }
    Ok(())
}

#[tokio::test]
async fn watching_a_rebooting_worker_keeps_the_connections_to_the_endpoints() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    sim.client.version(W1, opts()).await?;
    sim.client.reboot(W1, opts()).await?;
    let opened = sim.twin.handshakes();
    // While w-1 is down, an endpoint relays apid's dial error (Unavailable) over a
    // connection that works: the client keeps it, and does not ask the other endpoints,
    // which dial the same node.
    for _ in 0..5 {
        let e = sim
            .client
            .version(W1, opts())
            .await
            .err()
            .ok_or("a rebooting worker answered")?;
        assert!(matches!(e, TalosError::Unreachable { .. }), "{e}");
        assert!(e.to_string().contains("connect: connection refused"), "{e}");
    }
    let endpoints = sim.client.endpoints().len() as u64;
    assert!(
        sim.twin.handshakes() <= opened + endpoints,
        "{} handshakes for 5 calls over {endpoints} endpoints: the client redials on each answer",
        sim.twin.handshakes() - opened
    );
    let versions = |sim: &Sim| {
        sim.twin
            .calls()
            .get("machine.MachineService/Version")
            .copied()
            .unwrap_or(0)
    };
    let before = versions(&sim);
    let _ = sim.client.version(W1, opts()).await;
    assert_eq!(
        versions(&sim) - before,
        1,
        "a call about a node that is down asked more than one endpoint"
    );
    Ok(())
}

#[tokio::test]
async fn a_slow_apply_ends_at_the_callers_deadline() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    sim.twin
        .with_model(|m| m.set_slow_apply("w-1", Some(Duration::from_secs(600))));
    let mc = sim.client.machine_config(W1, opts()).await?;
    let edit = set_images(&mc.yaml, "v1.33.7", &[Component::Kubelet])?;
    let o = CallOptions {
        deadline: Duration::from_secs(20),
        avoid: None,
    };
    let call = sim
        .client
        .apply_configuration(W1, &edit.yaml, Mode::NoReboot, false, o);
    let clock = sim.clock.clone();
    let tick = async move {
        for _ in 0..10 {
            tokio::task::yield_now().await;
            clock.advance(Duration::from_secs(5));
        }
    };
    let (r, ()) = tokio::join!(call, tick);
    let e = r
        .err()
        .ok_or("a 600 s apply finished inside a 20 s deadline")?;
    assert!(matches!(e, TalosError::Deadline { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("ApplyConfiguration on 10.5.0.10: no answer within 20s"),
        "{e}"
    );
    Ok(())
}

#[tokio::test]
async fn the_image_only_edit_applies_without_a_reboot_in_both_forms() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    for (ip, name) in [(W1, "w-1"), (W2, "w-2")] {
        let mc = sim.client.machine_config(ip, opts()).await?;
        let edit = set_images(&mc.yaml, "v1.33.7", &[Component::Kubelet])?;
        assert!(!edit.is_noop());
        let dry = sim
            .client
            .apply_configuration(ip, &edit.yaml, Mode::NoReboot, true, opts())
            .await?;
        assert!(!dry.details.is_empty(), "a dry run describes the change");
        let before = sim
            .twin
            .observe()
            .into_iter()
            .find(|o| o.name == name)
            .ok_or("node")?;
        assert!(before.kubelet_version.contains("1.33.5"), "{before:?}");
        let applied = sim
            .client
            .apply_configuration(ip, &edit.yaml, Mode::NoReboot, false, opts())
            .await?;
        assert_eq!(applied.mode, Mode::NoReboot);
        let changed = advance_until(&sim.clock, Duration::from_secs(5), 60, || {
            sim.twin
                .observe()
                .iter()
                .any(|o| o.name == name && o.kubelet_version.contains("1.33.7"))
        })
        .await;
        assert!(changed, "{name}: the kubelet never moved to v1.33.7");
        let after = sim
            .twin
            .observe()
            .into_iter()
            .find(|o| o.name == name)
            .ok_or("node")?;
        assert_eq!(after.boot_id, before.boot_id, "{name}: no reboot");
        let mc2 = sim.client.machine_config(ip, opts()).await?;
        assert_ne!(mc2.version, mc.version);
        // A watch from the old version returns the new one at once; from the new one it
        // waits for the next change (and ends at its deadline here: there is none).
        let changed = sim
            .client
            .watch_resource_change(
                ip,
                "config",
                "MachineConfigs.config.talos.dev",
                "v1alpha1",
                Some(&mc.version),
                opts(),
            )
            .await?
            .ok_or("destroyed")?;
        assert_eq!(
            changed.metadata.map(|m| m.version),
            Some(mc2.version.clone())
        );
        let short = CallOptions {
            deadline: Duration::from_secs(10),
            avoid: None,
        };
        let watch = sim.client.watch_resource_change(
            ip,
            "config",
            "MachineConfigs.config.talos.dev",
            "v1alpha1",
            Some(&mc2.version),
            short,
        );
        let clock = sim.clock.clone();
        let tick = async move {
            for _ in 0..20 {
                tokio::task::yield_now().await;
                clock.advance(Duration::from_secs(1));
            }
        };
        let (r, ()) = tokio::join!(watch, tick);
        assert!(matches!(r, Err(TalosError::Deadline { .. })), "{r:?}");
    }
    // Anything beyond the image fields is refused before it reaches a node.
    let mc = sim.client.machine_config(W1, opts()).await?;
    let odd = mc
        .yaml
        .replacen("kubelet:", "kubelet: disabled\n  old-kubelet:", 1);
    match set_images(&odd, "v1.33.7", &[Component::Kubelet]) {
        Err(EditError::OtherPaths { paths }) => assert!(!paths.is_empty()),
        Err(EditError::Yaml(_)) => {}
        other => return Err(format!("expected a refusal, got {other:?}").into()),
    }
    Ok(())
}

#[tokio::test]
async fn images_pull_through_the_api_the_node_has_and_a_failing_pull_is_refused() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    let kubelet = "ghcr.io/siderolabs/kubelet:v1.33.7";
    sim.client
        .pull_image(
            W1,
            kubelet,
            ImageNamespace::System,
            UpgradeApi::Machine,
            opts(),
        )
        .await?;
    sim.client
        .pull_image(
            W2,
            "registry.k8s.io/kube-proxy:v1.33.7",
            ImageNamespace::Cri,
            UpgradeApi::Lifecycle,
            opts(),
        )
        .await?;
    let broken = "ghcr.io/siderolabs/installer:v9.9.9";
    sim.twin.with_model(|m| m.set_failing_image(broken, true));
    let e = sim
        .client
        .pull_image(
            W1,
            broken,
            ImageNamespace::System,
            UpgradeApi::Machine,
            opts(),
        )
        .await
        .err()
        .ok_or("failing pull succeeded")?;
    assert!(
        matches!(e, TalosError::Refused { .. } | TalosError::NotFound { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("10.5.0.10"), "{e}");
    Ok(())
}

#[tokio::test]
async fn upgrades_through_both_apis() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    // Legacy: the node reboots by itself into the new version.
    let ack = sim
        .client
        .upgrade_legacy(W1, "ghcr.io/siderolabs/installer:v1.13.0", opts())
        .await?;
    assert!(!ack.is_empty());
    let up = advance_until(&sim.clock, Duration::from_secs(10), 60, || {
        sim.twin
            .observe()
            .iter()
            .any(|o| o.name == "w-1" && o.ready && o.talos_version == "v1.13.0")
    })
    .await;
    assert!(up, "w-1 did not come back on v1.13.0");
    // LifecycleService: streams progress and leaves the reboot to ichor.
    let boot = sim.client.boot_id(W2, opts()).await?;
    // The new API installs only what was pulled first (ichor pre-pulls before disrupting).
    let installer = "ghcr.io/siderolabs/installer:v1.14.1";
    sim.client
        .pull_image(
            W2,
            installer,
            ImageNamespace::System,
            UpgradeApi::Lifecycle,
            opts(),
        )
        .await?;
    let long = CallOptions {
        deadline: Duration::from_secs(1800),
        avoid: None,
    };
    let upgrade = sim.client.upgrade_lifecycle(W2, installer, long);
    let clock = sim.clock.clone();
    let tick = async move {
        for _ in 0..300 {
            tokio::task::yield_now().await;
            clock.advance(Duration::from_secs(5));
        }
    };
    let (progress, ()) = tokio::join!(upgrade, tick);
    let progress = progress?;
    assert!(!progress.is_empty());
    assert_eq!(
        sim.client.boot_id(W2, opts()).await?,
        boot,
        "no reboot of its own"
    );
    Ok(())
}

#[tokio::test]
async fn reads_the_bootstrap_manifests_of_a_control_plane() -> TestResult {
    let sim = start(cluster("v1.12.6")).await?;
    let manifests = sim.client.bootstrap_manifests(CP1, opts()).await?;
    let ids: Vec<&str> = manifests.iter().map(|(id, _)| id.as_str()).collect();
    assert!(
        ids.contains(&"10-kube-proxy") && ids.contains(&"11-core-dns"),
        "{ids:?}"
    );
    let proxy = manifests
        .iter()
        .find(|(id, _)| id == "10-kube-proxy")
        .map(|(_, y)| y.as_str())
        .unwrap_or("");
    assert!(proxy.contains("kube-proxy"), "{proxy}");
    // Workers hold none.
    assert!(sim.client.bootstrap_manifests(W1, opts()).await?.is_empty());
    Ok(())
}
