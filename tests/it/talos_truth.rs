//! ichor's Talos calls as upstream Talos accepts them, against a twin that refuses what
//! upstream refuses (each rule of the twin names the upstream file it follows; docs/twin.md
//! keeps the table). Real mutual TLS on loopback; time moves only through a manual clock.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor::clock::Clock;
use ichor::sim::talos::{ConfigForm, NodeSpec, Role, TalosTwin, TalosTwinOptions};
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
use ichor::talos::client::{CallOptions, TalosClient, TalosError};
use ichor::talos::config;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn node(name: &str, role: Role, ip: [u8; 4], talos: &str) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        role,
        ip: ip.into(),
        talos_version: talos.into(),
        kubernetes_version: "v1.33.5".into(),
        kubelet_version: "v1.33.5".into(),
        config_form: ConfigForm::V1Alpha1,
    }
}

fn cluster(talos: &str) -> Vec<NodeSpec> {
    vec![
        node("cp-1", Role::ControlPlane, [10, 5, 0, 2], talos),
        node("cp-2", Role::ControlPlane, [10, 5, 0, 3], talos),
        node("cp-3", Role::ControlPlane, [10, 5, 0, 4], talos),
        node("w-1", Role::Worker, [10, 5, 0, 10], talos),
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

fn opts() -> CallOptions<'static> {
    CallOptions::default()
}

fn homelab_folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/repos/homelab/tree/clusters/homelab")
}

// ---- MachineService/Kubeconfig ----

#[tokio::test]
async fn the_admin_kubeconfig_from_a_control_plane_reaches_the_kubernetes_api() -> TestResult {
    let state = tempfile::tempdir()?;
    let folder = ClusterFolder::read(&homelab_folder())?;
    let twin = Twin::start(
        Clock::manual(),
        &folder,
        state.path(),
        TwinOptions {
            config: TwinConfig::default(),
            ..Default::default()
        },
    )
    .await?;
    let ctx = config::load(twin.talosconfig(), None)?;
    let talos = TalosClient::new(ctx, twin.talos.clock().clone());
    let obs = twin.talos.observe();
    let cp = obs
        .iter()
        .find(|n| n.role == Role::ControlPlane)
        .ok_or("no control plane")?;
    let text = talos.kubeconfig(&cp.ip.to_string(), opts()).await?;
    // The kubeconfig works as it is: list the nodes through it, as a cluster-admin.
    let kc = kube::config::Kubeconfig::from_yaml(&text)?;
    assert_eq!(
        kc.current_context.as_deref(),
        Some(format!("admin@{}", folder.cluster.name()).as_str())
    );
    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
    )?;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let list = nodes.list(&Default::default()).await?;
    assert_eq!(list.items.len(), obs.len());

    // A worker has no kubeconfig to give: Unimplemented, as upstream's CheckControlplane.
    let worker = obs
        .iter()
        .find(|n| n.role == Role::Worker)
        .ok_or("no worker")?;
    match talos.kubeconfig(&worker.ip.to_string(), opts()).await {
        Err(TalosError::Refused { code, message, .. }) => {
            assert_eq!(code, tonic::Code::Unimplemented);
            assert_eq!(
                message,
                "kubeconfig is only available on control plane nodes"
            );
        }
        other => panic!("expected Unimplemented, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn the_kubeconfig_needs_the_admin_role() -> TestResult {
    let sim = start(cluster("v1.13.2")).await?;
    let reader = sim.twin.issue_client("reader", &["os:reader"])?;
    let mut ctx = sim.client.context().clone();
    ctx.crt_pem = reader.cert_pem;
    ctx.key_pem = reader.key_pem;
    let client = TalosClient::new(ctx, sim.clock.clone());
    match client.kubeconfig(CP1, opts()).await {
        Err(TalosError::PermissionDenied { .. }) => {}
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    Ok(())
}

/// Drive `fut` while the manual clock moves in `step`s (the twin's timers fire as it does).
async fn with_time<T>(
    clock: &Clock,
    step: Duration,
    fut: impl std::future::Future<Output = T>,
) -> T {
    let clock = clock.clone();
    let tick = async move {
        for _ in 0..2000 {
            tokio::task::yield_now().await;
            clock.advance(step);
        }
    };
    tokio::pin!(fut);
    tokio::select! {
        r = &mut fut => r,
        () = tick => fut.await,
    }
}

fn long() -> CallOptions<'static> {
    CallOptions {
        deadline: Duration::from_secs(1800),
        avoid: None,
    }
}

async fn raw_channel(sim: &Sim) -> Result<tonic::transport::Channel, Box<dyn std::error::Error>> {
    let ctx = sim.client.context();
    let ep = sim.twin.endpoint("cp-1").ok_or("no endpoint")?;
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&ctx.ca_pem))
        .identity(tonic::transport::Identity::from_pem(
            &ctx.crt_pem,
            &ctx.key_pem,
        ))
        .domain_name("127.0.0.1");
    Ok(
        tonic::transport::Channel::from_shared(format!("https://{ep}"))?
            .tls_config(tls)?
            .connect()
            .await?,
    )
}

fn to_node<T>(msg: T, node: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Ok(v) = node.parse() {
        r.metadata_mut().insert("node", v);
    }
    r
}

// ---- Finding 1: LifecycleService/Upgrade names its containerd instance ----

#[tokio::test]
async fn the_twin_refuses_a_lifecycle_upgrade_without_a_containerd_instance_as_upstream_does(
) -> TestResult {
    use ichor::talos::proto::common::{ContainerDriver, ContainerdInstance, ContainerdNamespace};
    use ichor::talos::proto::machine::image_service_client::ImageServiceClient;
    use ichor::talos::proto::machine::lifecycle_service_client::LifecycleServiceClient;
    use ichor::talos::proto::machine::{
        ImageServicePullRequest, InstallArtifactsSource, LifecycleServiceUpgradeRequest,
    };
    let sim = start(cluster("v1.13.2")).await?;
    let ch = raw_channel(&sim).await?;
    let installer = "ghcr.io/siderolabs/installer:v1.13.4";
    let pull = |containerd: Option<ContainerdInstance>| {
        let ch = ch.clone();
        async move {
            ImageServiceClient::new(ch)
                .pull(to_node(
                    ImageServicePullRequest {
                        containerd,
                        image_ref: installer.into(),
                    },
                    W1,
                ))
                .await
        }
    };
    // ctrhelper.ContainerdInstanceHelper: the namespace of an absent instance is NS_UNKNOWN.
    let e = pull(None).await.err().ok_or("pull without an instance")?;
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.message(), "invalid containerd namespace NS_UNKNOWN");
    let e = pull(Some(ContainerdInstance {
        driver: ContainerDriver::Containerd as i32,
        namespace: ContainerdNamespace::NsCri as i32,
    }))
    .await
    .err()
    .ok_or("containerd driver with the CRI namespace")?;
    assert_eq!(
        e.message(),
        "cannot use CRI namespace with containerd driver"
    );
    // Pulled into the CRI containerd's `system` namespace, as talosctl upgrade does.
    let cri_system = ContainerdInstance {
        driver: ContainerDriver::Cri as i32,
        namespace: ContainerdNamespace::NsSystem as i32,
    };
    let mut stream = pull(Some(cri_system)).await?.into_inner();
    let mut name = String::new();
    while let Some(m) = stream.message().await? {
        if let Some(ichor::talos::proto::machine::image_service_pull_response::Response::Name(n)) =
            m.response
        {
            name = n;
        }
    }
    assert!(
        name.starts_with("ghcr.io/siderolabs/installer@sha256:"),
        "{name}"
    );
    let upgrade = |containerd: Option<ContainerdInstance>, image: String| {
        let ch = ch.clone();
        async move {
            LifecycleServiceClient::new(ch)
                .upgrade(to_node(
                    LifecycleServiceUpgradeRequest {
                        containerd,
                        source: Some(InstallArtifactsSource { image_name: image }),
                    },
                    W1,
                ))
                .await
        }
    };
    // lifecycle.go wraps runInstallerContainer's error: Internal "upgrade failed: …".
    let e = upgrade(None, name.clone())
        .await
        .err()
        .ok_or("upgrade without an instance")?;
    assert_eq!(e.code(), tonic::Code::Internal);
    assert_eq!(
        e.message(),
        "upgrade failed: rpc error: code = InvalidArgument desc = invalid containerd namespace NS_UNKNOWN"
    );
    // Another instance's store does not hold the image.
    let inmem = ContainerdInstance {
        driver: ContainerDriver::Containerd as i32,
        namespace: ContainerdNamespace::NsSystem as i32,
    };
    let e = upgrade(Some(inmem), name.clone())
        .await
        .err()
        .ok_or("upgrade from the wrong store")?;
    assert_eq!(e.code(), tonic::Code::Internal);
    assert!(
        e.message().contains("not found in containerd store"),
        "{}",
        e.message()
    );
    // The same instance and the name the pull returned: the install runs.
    let stream = upgrade(Some(cri_system), name).await?.into_inner();
    drop(stream);
    assert!(sim.twin.with_model(|m| m.nodes()[3].installing));
    Ok(())
}

#[tokio::test]
async fn ichor_upgrades_a_talos_1_13_node_through_the_installers_instance() -> TestResult {
    // Fails on a client that sends LifecycleService/Upgrade without a containerd instance:
    // Internal "upgrade failed: … invalid containerd namespace NS_UNKNOWN".
    let sim = start(cluster("v1.13.2")).await?;
    let installer = "ghcr.io/siderolabs/installer:v1.13.4";
    sim.client
        .pull_image(
            W1,
            installer,
            ichor::talos::client::ImageNamespace::System,
            ichor::talos::UpgradeApi::Lifecycle,
            opts(),
        )
        .await?;
    let progress = with_time(
        &sim.clock,
        Duration::from_secs(5),
        sim.client.upgrade_lifecycle(W1, installer, long()),
    )
    .await?;
    assert!(!progress.is_empty());
    let installed = sim
        .twin
        .with_model(|m| m.node_by_name("w-1").and_then(|n| n.installed_version()));
    assert_eq!(installed.as_deref(), Some("v1.13.4"));
    Ok(())
}

// ---- Finding 2: pre-pulls land where the component that starts next looks ----

#[tokio::test]
async fn a_pre_pulled_kubelet_image_is_in_the_store_the_kubelet_starts_from() -> TestResult {
    // The kubelet service pulls and runs its image in the CRI containerd's `system`
    // namespace; a pre-pull into the system containerd is a wasted pull and the kubelet
    // then pulls again before it starts (twin: `timings.image_pull` longer).
    use ichor::talos::machine_config::{set_images, Component};
    use ichor::talos::proto::machine::apply_configuration_request::Mode;
    for talos in ["v1.12.6", "v1.13.2"] {
        let sim = start(cluster(talos)).await?;
        let api = sim.client.version(W1, opts()).await?.upgrade_api;
        let image = "ghcr.io/siderolabs/kubelet:v1.33.7";
        sim.client
            .pull_image(
                W1,
                image,
                ichor::talos::client::ImageNamespace::System,
                api,
                opts(),
            )
            .await?;
        let mc = sim.client.machine_config(W1, opts()).await?;
        let edit = set_images(&mc.yaml, "v1.33.7", &[Component::Kubelet])?;
        sim.client
            .apply_configuration(W1, &edit.yaml, Mode::NoReboot, false, opts())
            .await?;
        // kubelet_restart is 15 s; a missing image would add image_pull (30 s).
        sim.clock.advance(Duration::from_secs(16));
        let healthy = sim
            .twin
            .with_model(|m| m.node_by_name("w-1").map(|n| n.kubelet.healthy));
        assert_eq!(
            healthy,
            Some(true),
            "Talos {talos}: the kubelet had to pull again"
        );
    }
    Ok(())
}

// ---- Finding 5: installer failures, classified ----

#[tokio::test]
async fn an_installer_exit_code_names_its_class_and_last_messages() -> TestResult {
    use ichor::talos::client::InstallerFailure;
    let sim = start(cluster("v1.14.0")).await?;
    let installer = "factory.talos.dev/metal-installer/abc:v1.14.1";
    for (code, class, retryable) in [
        (2, InstallerFailure::InvalidInput, false),
        (3, InstallerFailure::Unsupported, false),
        (4, InstallerFailure::Environment, true),
        (7, InstallerFailure::Install, true),
        (1, InstallerFailure::Unknown, false),
    ] {
        sim.twin
            .with_model(|m| m.set_installer_exit_code("w-1", Some(code)));
        let e = sim
            .client
            .upgrade_lifecycle(W1, installer, long())
            .await
            .err()
            .ok_or("the installer failure passed")?;
        match &e {
            TalosError::Installer {
                code: c,
                class: k,
                last,
                ..
            } => {
                assert_eq!((*c, *k), (code, class));
                assert_eq!(k.retryable(), retryable);
                assert!(!last.is_empty(), "{e}");
            }
            other => panic!("expected an installer failure, got {other:?}"),
        }
        assert!(
            e.to_string().contains(&format!("exited with code {code}")),
            "{e}"
        );
    }
    Ok(())
}

/// N7: a 1.14 installer's version preflight exits 4 (EnvironmentTag) with "pre-flight
/// checks failed: …"; ichor reads that one as permanent, not as a retryable environment
/// failure.
#[tokio::test]
async fn a_1_14_installers_version_refusal_exits_4_and_is_permanent() -> TestResult {
    use ichor::talos::client::InstallerFailure;
    let sim = start(cluster("v1.13.2")).await?;
    // 1.16 takes hosts from 1.14 on.
    let installer = "factory.talos.dev/metal-installer/abc:v1.16.0";
    let e = sim
        .client
        .upgrade_lifecycle(W1, installer, long())
        .await
        .err()
        .ok_or("a 1.13 host took a 1.16 installer")?;
    match &e {
        TalosError::Installer {
            code, class, last, ..
        } => {
            assert_eq!((*code, *class), (4, InstallerFailure::Environment), "{e}");
            assert!(InstallerFailure::version_refused(last), "{last:?}");
        }
        other => panic!("expected an installer failure, got {other:?}"),
    }
    // An environment failure of another kind stays retryable.
    assert!(!InstallerFailure::version_refused(&[
        "installer failed with exit code 4".to_string()
    ]));
    Ok(())
}

// ---- Finding 3: pending configurations ----

#[tokio::test]
async fn a_staged_configuration_shows_as_the_persistent_one_and_its_paths() -> TestResult {
    use ichor::talos::machine_config::pending_changes;
    let sim = start(cluster("v1.13.2")).await?;
    assert!(
        sim.client
            .persistent_machine_config(W1, opts())
            .await?
            .is_none(),
        "a node booted from STATE has no persistent configuration until an apply"
    );
    sim.twin.with_model(|m| {
        m.stage_config(
            "w-1",
            &[(
                "machine.network.hostname".to_string(),
                serde_yaml::Value::String("w-1-renamed".into()),
            )],
        )
    })?;
    let active = sim.client.machine_config(W1, opts()).await?;
    let persistent = sim
        .client
        .persistent_machine_config(W1, opts())
        .await?
        .ok_or("no persistent configuration")?;
    assert_eq!(
        pending_changes(&active.yaml, &persistent.yaml)?,
        vec!["machine.network.hostname".to_string()]
    );
    // Talos before 1.10 has no persistent resource.
    let old = start(cluster("v1.9.5")).await?;
    assert!(old
        .client
        .persistent_machine_config(W1, opts())
        .await?
        .is_none());
    Ok(())
}

#[tokio::test]
async fn a_change_staged_by_an_operator_pauses_the_kubernetes_switch_instead_of_being_dropped(
) -> TestResult {
    // On the old engine the NO_REBOOT apply of "active + image edit" persisted over the
    // staged change: the rollout finished and the operator's change was gone.
    use ichor::rollout::RunOutcome;
    let s = crate::rollout::setup(TwinConfig::default()).await?;
    let report = |_p: ichor::rollout::Progress| {};
    let engine = s.engine(&report);
    let target = s.target();
    let run = engine.run(&s.plan, &target, Some(&s.change), false);
    let twin = &s.twin;
    // Once every control plane runs the target Talos (their reboots are over; the workers
    // reboot later, in the one-drain workers stage), an operator stages a change on cp-1.
    let side = async {
        loop {
            if twin
                .talos
                .observe()
                .iter()
                .filter(|o| o.role == Role::ControlPlane)
                .all(|o| o.talos_version == "v1.12.9" && o.ready)
            {
                let cp = twin
                    .talos
                    .observe()
                    .into_iter()
                    .find(|o| o.role == Role::ControlPlane)
                    .map(|o| o.name)
                    .unwrap_or_default();
                twin.talos.with_model(|m| {
                    m.stage_config(
                        &cp,
                        &[(
                            "machine.network.hostname".to_string(),
                            serde_yaml::Value::String("renamed".into()),
                        )],
                    )
                })?;
                return Ok::<String, Box<dyn std::error::Error>>(cp);
            }
            twin.talos.clock().sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::pin!(run);
    tokio::pin!(side);
    let mut staged = None;
    let outcome = loop {
        tokio::select! {
            r = &mut run => break r?,
            v = &mut side, if staged.is_none() => staged = Some(v?),
            _ = twin.drive(Duration::from_secs(2), || {}) => unreachable!("the driver never ends"),
        }
    };
    let cp = staged.ok_or("the Talos stage never finished")?;
    match outcome {
        RunOutcome::Paused(p) => {
            assert_eq!(p.node.as_deref(), Some(cp.as_str()), "{p:?}");
            assert!(
                p.reason.contains("unrelated pending configuration change")
                    && p.reason.contains("machine.network.hostname"),
                "{}",
                p.reason
            );
        }
        other => panic!("expected a pause, got {other:?}"),
    }
    // The staged change is still there.
    let kept = twin.talos.with_model(|m| {
        m.node_by_name(&cp)
            .map(|n| String::from_utf8_lossy(n.persistent_config.raw()).contains("renamed"))
    });
    assert_eq!(kept, Some(true));
    Ok(())
}

/// N3: upstream keeps no `persistent` MachineConfig until an apply in this boot
/// (siderolabs/talos@v1.13.9:internal/app/machined/pkg/controllers/config/acquire.go
/// `Run`), and a TRY sets only the active one. The `tryConfig` fault is an operator's
/// `talosctl apply-config --mode try`; it rolls back after `tryTimeout`.
#[tokio::test]
async fn a_try_on_a_freshly_booted_node_leaves_no_persistent_configuration_and_rolls_back(
) -> TestResult {
    let config = TwinConfig::parse(
        "twin.yaml",
        "faults:\n  tryConfig: {cp-1: {machine.network.hostname: tried}}\n  tryTimeout: 10m\n",
    )?;
    let s = crate::rollout::setup(config).await?;
    let cp1 = s
        .twin
        .talos
        .observe()
        .into_iter()
        .find(|o| o.name == "cp-1")
        .ok_or("no cp-1")?
        .ip
        .to_string();
    let active = s.talos.machine_config(&cp1, opts()).await?;
    assert!(active.yaml.contains("tried"), "the TRY is active");
    assert_eq!(active.version, "2", "created at boot, set again by the TRY");
    assert!(
        s.talos
            .persistent_machine_config(&cp1, opts())
            .await?
            .is_none(),
        "nothing persisted in this boot"
    );
    s.twin.advance(Duration::from_secs(10 * 60));
    let active = s.talos.machine_config(&cp1, opts()).await?;
    assert!(
        !active.yaml.contains("tried"),
        "rolled back after tryTimeout"
    );
    assert_eq!(active.version, "3");
    Ok(())
}

/// N3 / item 3: an operator's TRY on a freshly booted control plane (no `persistent`
/// resource, the active configuration changed since boot) pauses a Kubernetes bump before
/// any dry run or apply reaches the node — a non-TRY apply, dry runs included, cancels the
/// TRY's rollback and a NO_REBOOT apply would persist it — and the TRY still rolls back.
#[tokio::test]
async fn an_operators_try_on_a_freshly_booted_control_plane_pauses_a_kubernetes_bump_and_is_not_made_permanent(
) -> TestResult {
    use ichor::rollout::RunOutcome;
    let dir = tempfile::tempdir()?;
    let s =
        crate::rollout::setup_on_1_13(dir.path(), "talos: v1.13.4", "kubernetes: v1.33.7").await?;
    let tried = "tried-by-an-operator";
    s.twin.talos.with_model(|m| {
        m.try_config(
            "cp-1",
            &[(
                "machine.network.hostname".to_string(),
                serde_yaml::Value::String(tried.into()),
            )],
            Duration::from_secs(4 * 3600),
        )
    })?;
    let (outcome, _, lines) = crate::rollout::run_once(&s, false).await?;
    match outcome {
        RunOutcome::Paused(p) => {
            assert_eq!(p.node.as_deref(), Some("cp-1"), "{p:?}");
            assert!(
                p.reason.contains("unrelated pending configuration change")
                    && p.reason.contains("TRY"),
                "{}",
                p.reason
            );
        }
        other => panic!("expected a pause, got {other:?}\n{:#?}", lines.all()),
    }
    // Nothing but reads reached cp-1's configuration: no dry run, no apply.
    let log = std::fs::read_to_string(s.twin.talos.audit_log_path())?;
    let applies = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| {
            l["node"] == "cp-1" && l["method"] == "machine.MachineService/ApplyConfiguration"
        })
        .count();
    assert_eq!(applies, 0, "an ApplyConfiguration reached cp-1");
    // The TRY rolls back as the operator asked: nothing made it permanent.
    s.twin.advance(Duration::from_secs(4 * 3600));
    let kept = s.twin.talos.with_model(|m| {
        m.node_by_name("cp-1").map(|n| {
            (
                String::from_utf8_lossy(n.config.raw()).contains(tried),
                String::from_utf8_lossy(n.persistent_config.raw()).contains(tried),
            )
        })
    });
    assert_eq!(kept, Some((false, false)), "the TRY was made permanent");
    Ok(())
}

/// Item 3: a Talos upgrade's reboot applies an operator's STAGED configuration (Talos
/// boots what is on disk): ichor says so, naming the node and the paths, before it
/// requests the upgrade — and leaves the change to Talos.
#[tokio::test]
async fn a_reboot_that_applies_an_operators_staged_configuration_says_so() -> TestResult {
    use ichor::rollout::RunOutcome;
    let config = TwinConfig::parse(
        "twin.yaml",
        "faults:\n  stagedConfig: {cp-2: {machine.network.hostname: staged-by-an-operator}}\n",
    )?;
    let s = crate::rollout::setup(config).await?;
    let lines = crate::rollout::Lines::default();
    let report = |p| lines.push(p);
    let engine = s.engine(&report);
    let (outcome, _) = crate::rollout::run_checked(&s, &engine, false).await?;
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{}",
        lines.all().join("\n")
    );
    let said: Vec<String> = lines
        .all()
        .into_iter()
        .filter(|l| l.contains("STAGED configuration applies at this reboot"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("cp-2") && said[0].contains("machine.network.hostname"),
        "{said:?}"
    );
    // Talos booted it, as the operator staged it.
    let active = s.twin.talos.with_model(|m| {
        m.node_by_name("cp-2")
            .map(|n| String::from_utf8_lossy(n.config.raw()).contains("staged-by-an-operator"))
    });
    assert_eq!(active, Some(true));
    Ok(())
}

/// N8: a control plane counts back only when Talos says the machine is ready, which
/// includes its etcd service (siderolabs/talos@v1.13.9:internal/app/machined/pkg/
/// controllers/runtime/machine_status.go). With every member catching up for a minute
/// after its boot while its kubelet is Ready at once, the rollout waits for each and
/// completes — before, the next control plane's etcd check paused it.
#[tokio::test]
async fn a_control_plane_whose_etcd_is_still_catching_up_is_waited_for_not_paused_on() -> TestResult
{
    use ichor::rollout::RunOutcome;
    let config = TwinConfig::parse(
        "twin.yaml",
        "faults:\n  etcdCatchUp: {cp-1: 60s, cp-2: 60s, cp-3: 60s}\n",
    )?;
    let s = crate::rollout::setup(config).await?;
    let lines = crate::rollout::Lines::default();
    let report = |p| lines.push(p);
    let engine = s.engine(&report);
    let (outcome, broken) = crate::rollout::run_checked(&s, &engine, false).await?;
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{}",
        lines.all().join("\n")
    );
    assert!(broken.is_empty(), "{broken:?}");
    assert!(
        lines.any("waiting for Talos to report the machine ready (services: etcd not healthy)"),
        "{}",
        lines.all().join("\n")
    );
    Ok(())
}
