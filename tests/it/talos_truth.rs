//! ichor's Talos calls as upstream Talos accepts them, against a twin that refuses what
//! upstream refuses (each rule of the twin names the upstream file it follows; docs/twin.md
//! keeps the table). Real mutual TLS on loopback; time moves only through a manual clock.

use std::path::{Path, PathBuf};

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
