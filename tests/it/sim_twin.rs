//! The whole twin from a cluster folder: Talos machine API and Kubernetes API stay
//! consistent. A user's clients talk to both over real sockets, using the talosconfig and
//! kubeconfig the twin wrote; time moves only through a manual clock.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use ichor::clock::Clock;
use ichor::kube::changes::Scope;
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};

/// The legacy Upgrade answering at once (`timings.installerPull: 0s`): these tests call it
/// on a manual clock nothing moves while the call waits.
fn pull_at_once(mut config: TwinConfig) -> TwinConfig {
    config.timings.installer_pull = Some(ichor::releaseset::HumanDuration(Duration::ZERO));
    config
}
use ichor::talos::proto::cosi::resource::state_client::StateClient;
use ichor::talos::proto::cosi::resource::GetRequest;
use ichor::talos::proto::machine::apply_configuration_request::Mode;
use ichor::talos::proto::machine::machine_service_client::MachineServiceClient;
use ichor::talos::proto::machine::{ApplyConfigurationRequest, RebootRequest, UpgradeRequest};
use ichor::talos::proto::resource::config::MachineConfigSpec;
use prost::Message;
use serde_json::Value;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::Request;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn homelab_folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/repos/homelab/tree/clusters/homelab")
}

async fn start(
    config: TwinConfig,
) -> Result<(Twin, tempfile::TempDir), Box<dyn std::error::Error>> {
    let state = tempfile::tempdir()?;
    let folder = ClusterFolder::read(&homelab_folder())?;
    let twin = Twin::start(
        Clock::manual(),
        &folder,
        state.path(),
        TwinOptions {
            config,
            ..Default::default()
        },
    )
    .await?;
    Ok((twin, state))
}

/// A Talos client configured from the talosconfig the twin wrote, as talosctl would be.
async fn talos_channel(talosconfig: &Path) -> Result<Channel, Box<dyn std::error::Error>> {
    let cfg: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(talosconfig)?)?;
    let name = cfg["context"].as_str().ok_or("no context")?;
    let ctx = &cfg["contexts"][name];
    let b64 = |k: &str| -> Result<String, Box<dyn std::error::Error>> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(ctx[k].as_str().ok_or("missing field")?)?;
        Ok(String::from_utf8(raw)?)
    };
    // Talos labels Ed25519 keys with its own PEM type; rustls wants PKCS#8 "PRIVATE KEY".
    let key = b64("key")?.replace("ED25519 PRIVATE KEY", "PRIVATE KEY");
    let endpoint = ctx["endpoints"][0].as_str().ok_or("no endpoint")?;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(b64("ca")?))
        .identity(Identity::from_pem(b64("crt")?, key))
        .domain_name("127.0.0.1");
    Ok(Channel::from_shared(format!("https://{endpoint}"))?
        .tls_config(tls)?
        .connect()
        .await?)
}

fn to_node<T>(msg: T, node: &str) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut()
        .insert("node", node.parse().expect("ascii node"));
    r
}

fn node(twin: &Twin, name: &str) -> Value {
    twin.kube
        .with(|c, _| c.get("nodes", "", name))
        .unwrap_or(Value::Null)
}

fn ready(n: &Value) -> bool {
    n.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .is_some_and(|c| c["status"] == "True")
}

/// Pods other than DaemonSet and mirror pods on `node`.
fn movable_pods(twin: &Twin, node: &str) -> Vec<String> {
    twin.kube
        .with(|c, _| c.pods_on_node(node))
        .into_iter()
        .filter(|p| {
            p.pointer("/metadata/ownerReferences/0/kind")
                .and_then(Value::as_str)
                != Some("DaemonSet")
        })
        .filter(|p| {
            p.pointer("/metadata/annotations/kubernetes.io~1config.mirror")
                .is_none()
        })
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|p| {
            p.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .collect()
}

fn web_pods(twin: &Twin) -> usize {
    twin.kube
        .with(|c, _| c.list("pods", Some("default")))
        .iter()
        .filter(|p| p.pointer("/metadata/labels/app").and_then(Value::as_str) == Some("web"))
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_sees_what_the_talos_nodes_run() -> TestResult {
    let (twin, _state) = start(TwinConfig::default()).await?;
    let nodes = twin.kube.with(|c, _| c.list("nodes", None));
    assert_eq!(nodes.len(), 6);
    for n in &nodes {
        assert!(ready(n), "{n}");
        assert_eq!(
            n.pointer("/status/nodeInfo/osImage")
                .and_then(Value::as_str),
            Some("Talos (v1.12.4)")
        );
        assert_eq!(
            n.pointer("/status/nodeInfo/kubeletVersion")
                .and_then(Value::as_str),
            Some("v1.30.14")
        );
        assert_eq!(
            n.pointer("/status/nodeInfo/bootID")
                .and_then(Value::as_str)
                .map(str::len),
            Some(36)
        );
    }
    let cp1 = node(&twin, "cp-1");
    assert_eq!(
        cp1.pointer("/status/addresses/0/address")
            .and_then(Value::as_str),
        Some("10.0.10.11")
    );
    let mirror = twin
        .kube
        .with(|c, _| c.get("pods", "kube-system", "kube-apiserver-cp-1"))
        .ok_or("mirror pod")?;
    assert!(
        mirror
            .pointer("/spec/containers/0/image")
            .and_then(Value::as_str)
            .unwrap_or("")
            .ends_with(":v1.30.14"),
        "{mirror}"
    );
    // The inventory's replicas: every volume on w-1, w-2 and w-3.
    let replicas = twin
        .kube
        .with(|c, _| c.list("replicas", Some("longhorn-system")));
    let on = |n: &str| {
        replicas
            .iter()
            .filter(|r| r.pointer("/spec/nodeID").and_then(Value::as_str) == Some(n))
            .count()
    };
    assert_eq!((on("w-1"), on("w-2"), on("w-3"), on("cp-1")), (3, 3, 3, 0));
    // The CNI replaces kube-proxy in this cluster: no kube-proxy DaemonSet.
    assert!(twin
        .kube
        .with(|c, _| c.get("daemonsets", "kube-system", "kube-proxy"))
        .is_none());
    assert!(twin
        .kube
        .with(|c, _| c.get("daemonsets", "kube-system", "cilium"))
        .is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_talos_reboot_takes_the_node_and_its_pods_down_and_back() -> TestResult {
    let (twin, _state) = start(TwinConfig::default()).await?;
    let mut talos = MachineServiceClient::new(talos_channel(twin.talosconfig()).await?);
    let boot_before = node(&twin, "w-1")
        .pointer("/status/nodeInfo/bootID")
        .cloned();
    let had_pods = movable_pods(&twin, "w-1");
    assert!(
        !had_pods.is_empty(),
        "the seed spreads workloads over the workers"
    );
    let webs = web_pods(&twin);

    talos
        .reboot(to_node(RebootRequest { mode: 0 }, "10.0.10.21"))
        .await?;
    twin.advance(Duration::from_secs(2));
    // The kubelet went silent, but the node-monitor grace period (40 s) has not passed.
    let silent = node(&twin, "w-1");
    assert!(
        ready(&silent),
        "still Ready within the grace period: {silent}"
    );
    assert_eq!(movable_pods(&twin, "w-1"), had_pods);
    twin.advance(Duration::from_secs(38));
    let down = node(&twin, "w-1");
    assert!(!ready(&down), "NotReady after the grace period: {down}");
    assert_eq!(
        movable_pods(&twin, "w-1"),
        had_pods,
        "pods stay in the API until the unreachable toleration (300 s) runs out"
    );
    // Longhorn volumes with a replica there are degraded.
    let vols = twin
        .kube
        .with(|c, _| c.list("volumes", Some("longhorn-system")));
    assert!(
        vols.iter()
            .all(|v| v.pointer("/status/robustness").and_then(Value::as_str) == Some("degraded")),
        "{vols:?}"
    );

    twin.advance(Duration::from_secs(80));
    let up = node(&twin, "w-1");
    assert!(ready(&up), "Ready after the reboot: {up}");
    assert_ne!(
        up.pointer("/status/nodeInfo/bootID").cloned(),
        boot_before,
        "a new boot id"
    );
    assert_eq!(web_pods(&twin), webs, "the web Deployment is whole again");
    Ok(())
}

/// The machine config as Talos stores it, fetched over COSI.
async fn machine_config(
    channel: Channel,
    node: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let r = StateClient::new(channel)
        .get(to_node(
            GetRequest {
                namespace: "config".into(),
                r#type: "MachineConfigs.config.talos.dev".into(),
                id: "v1alpha1".into(),
                options: None,
            },
            node,
        ))
        .await?
        .into_inner();
    let spec = r.resource.and_then(|r| r.spec).ok_or("no spec")?;
    Ok(String::from_utf8(
        MachineConfigSpec::decode(spec.proto_spec.as_slice())?.yaml_marshalled,
    )?)
}

/// The kubelet's (state, healthy) from ServiceList.
async fn kubelet_service(
    talos: &mut MachineServiceClient<Channel>,
    node: &str,
) -> Result<(String, bool), Box<dyn std::error::Error>> {
    let r = talos.service_list(to_node((), node)).await?.into_inner();
    let services = &r.messages.first().ok_or("no reply")?.services;
    let k = services
        .iter()
        .find(|s| s.id == "kubelet")
        .ok_or("no kubelet service")?;
    Ok((
        k.state.clone(),
        k.health.as_ref().is_some_and(|h| h.healthy),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_changes_show_as_a_new_kubelet_version_and_restarted_static_pods() -> TestResult {
    let (twin, _state) = start(TwinConfig::default()).await?;
    let channel = talos_channel(twin.talosconfig()).await?;
    let mut talos = MachineServiceClient::new(channel.clone());

    // kube-apiserver on cp-1.
    let cfg = machine_config(channel.clone(), "10.0.10.11").await?;
    let new = cfg.replace(
        "registry.k8s.io/kube-apiserver:v1.30.14",
        "registry.k8s.io/kube-apiserver:v1.31.14",
    );
    assert_ne!(cfg, new, "the config names the apiserver image");
    talos
        .apply_configuration(to_node(
            ApplyConfigurationRequest {
                data: new.into_bytes(),
                mode: Mode::NoReboot as i32,
                dry_run: false,
                try_mode_timeout: None,
            },
            "10.0.10.11",
        ))
        .await?;
    twin.advance(Duration::from_secs(1));
    let pod = twin
        .kube
        .with(|c, _| c.get("pods", "kube-system", "kube-apiserver-cp-1"))
        .ok_or("mirror pod")?;
    assert!(
        pod.pointer("/spec/containers/0/image")
            .and_then(Value::as_str)
            .unwrap_or("")
            .ends_with(":v1.31.14"),
        "{pod}"
    );
    assert!(!ready(&pod), "restarting: {pod}");
    twin.advance(Duration::from_secs(60));
    let pod = twin
        .kube
        .with(|c, _| c.get("pods", "kube-system", "kube-apiserver-cp-1"))
        .ok_or("mirror pod")?;
    assert!(ready(&pod), "Ready after the restart: {pod}");
    assert_eq!(
        pod.pointer("/metadata/annotations/talos.dev~1config-version")
            .and_then(Value::as_str),
        Some("2"),
        "a new config version: {pod}"
    );

    // The kubelet on w-2.
    let cfg = machine_config(channel.clone(), "10.0.10.22").await?;
    let new = cfg.replace(
        "ghcr.io/siderolabs/kubelet:v1.30.14",
        "ghcr.io/siderolabs/kubelet:v1.31.14",
    );
    talos
        .apply_configuration(to_node(
            ApplyConfigurationRequest {
                data: new.into_bytes(),
                mode: Mode::NoReboot as i32,
                dry_run: false,
                try_mode_timeout: None,
            },
            "10.0.10.22",
        ))
        .await?;
    twin.advance(Duration::from_secs(1));
    assert_eq!(
        kubelet_service(&mut talos, "10.0.10.22").await?,
        ("Starting".to_string(), false),
        "the kubelet restarts"
    );
    twin.advance(Duration::from_secs(60));
    assert_eq!(
        kubelet_service(&mut talos, "10.0.10.22").await?,
        ("Running".to_string(), true)
    );
    let w2 = node(&twin, "w-2");
    assert_eq!(
        w2.pointer("/status/nodeInfo/kubeletVersion")
            .and_then(Value::as_str),
        Some("v1.31.14"),
        "{w2}"
    );
    assert!(ready(&w2));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_faults_reach_both_sides() -> TestResult {
    let config = TwinConfig::parse(
        "twin.yaml",
        "faults:\n  nodesNeverReturn: [w-3]\n  pdbsNeverAllow: [default/web]\ndeprecatedApiRequests:\n  - {group: resource.k8s.io, version: v1beta1, resource: resourceclaims, removedRelease: \"1.36\"}\n",
    )?;
    let (twin, _state) = start(config).await?;
    let mut talos = MachineServiceClient::new(talos_channel(twin.talosconfig()).await?);
    talos
        .reboot(to_node(RebootRequest { mode: 0 }, "w-3"))
        .await?;
    twin.advance(Duration::from_secs(600));
    assert!(!ready(&node(&twin, "w-3")), "w-3 never returns");
    let pdb = twin
        .kube
        .with(|c, _| c.get("poddisruptionbudgets", "default", "web"))
        .ok_or("pdb")?;
    assert_eq!(
        pdb.pointer("/status/disruptionsAllowed")
            .and_then(Value::as_i64),
        Some(0),
        "{pdb}"
    );
    let deprecated = twin.kube.with(|c, _| c.deprecated_apis.clone());
    assert_eq!(deprecated.len(), 1);
    assert_eq!(
        (
            deprecated[0].resource.as_str(),
            deprecated[0].removed_release.as_str()
        ),
        ("resourceclaims", "1.36")
    );
    // A fault naming an unknown node is refused with a clear message.
    let bad = TwinConfig::parse("twin.yaml", "faults:\n  nodesNeverReturn: [w-9]\n")?;
    let folder = ClusterFolder::read(&homelab_folder())?;
    let state = tempfile::tempdir()?;
    let err = Twin::start(
        Clock::manual(),
        &folder,
        state.path(),
        TwinOptions {
            config: bad,
            ..Default::default()
        },
    )
    .await
    .err()
    .ok_or("should fail")?;
    assert!(
        err.to_string()
            .contains("faults.nodesNeverReturn[0]: no node \"w-9\" in the inventory"),
        "{err}"
    );
    // Unknown fields in the config are refused with their line.
    let err = TwinConfig::parse("twin.yaml", "faults:\n  nodesNeverReturns: [w-3]\n")
        .err()
        .ok_or("should fail")?;
    assert_eq!(err.line, Some(2), "{err}");
    Ok(())
}

/// `ichor sim` as a user runs it: it prints the endpoints, kubectl works with the kubeconfig
/// it wrote, and Ctrl-C (SIGINT) stops it cleanly.
#[test]
#[ignore = "needs kubectl: scripts/test installs it"]
fn ichor_sim_serves_until_interrupted() -> TestResult {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let state = tempfile::tempdir()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(["sim", "--speed", "60", "--cluster"])
        .arg(homelab_folder())
        .arg("--state-dir")
        .arg(state.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("stdout")?;
    // Read until the twin says it serves (or the process ends, which fails the test).
    let mut printed = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        printed.push_str(&line);
        printed.push('\n');
        if line.starts_with("Serving until interrupted") {
            break;
        }
    }
    assert!(printed.contains("Serving until interrupted"), "{printed}");
    assert!(
        printed.contains("w-1") && printed.contains("node 10.0.10.21"),
        "{printed}"
    );
    let kubeconfig = state.path().join("kubeconfig");
    {
        let out = Command::new(crate::tools::KUBECTL.path())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "nodes", "-o", "wide"])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("Talos (v1.12.4)") && text.lines().count() == 7,
            "{text}"
        );
    }
    assert!(state.path().join("talosconfig").exists());
    let pid = child.id().to_string();
    Command::new("kill").args(["-INT", &pid]).status()?;
    let status = child.wait()?;
    assert!(status.success(), "exits cleanly on Ctrl-C: {status:?}");
    Ok(())
}

/// Without `--state-dir`, `ichor sim` writes its keys under the per-user state directory
/// (never into the working tree), mode 0700 with 0600 files even under umask 0; with no
/// HOME or XDG_STATE_HOME it asks for `--state-dir`.
#[test]
fn ichor_sim_defaults_to_a_private_per_user_state_dir_even_under_umask_0() -> TestResult {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Command, Stdio};
    let home = tempfile::tempdir()?;
    let xdg = home.path().join("xdg-state");
    let mut child = Command::new("sh")
        .args(["-c", "umask 000; exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_ichor"))
        .args(["sim", "--cluster"])
        .arg(homelab_folder())
        .env("XDG_STATE_HOME", &xdg)
        .env("HOME", home.path())
        .current_dir(home.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("stdout")?;
    let mut printed = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        printed.push_str(&line);
        printed.push('\n');
        if line.starts_with("Serving until interrupted") {
            break;
        }
    }
    let mode = |p: &Path| -> Result<u32, std::io::Error> {
        Ok(std::fs::symlink_metadata(p)?.permissions().mode() & 0o7777)
    };
    let state = xdg.join("ichor/sim/homelab");
    let checks = (|| -> TestResult {
        assert!(printed.contains("Serving until interrupted"), "{printed}");
        assert!(
            printed.contains(&state.join("kubeconfig").display().to_string()),
            "{printed}"
        );
        for dir in [&xdg, &xdg.join("ichor"), &state] {
            assert_eq!(mode(dir)?, 0o700, "{}", dir.display());
        }
        for file in ["kubeconfig", "talosconfig"] {
            assert_eq!(mode(&state.join(file))?, 0o600, "{file}");
        }
        assert!(!home.path().join(".ichor-sim").exists());
        Ok(())
    })();
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()?;
    assert!(child.wait()?.success());
    checks?;

    let out = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(["sim", "--cluster"])
        .arg(homelab_folder())
        .env_remove("HOME")
        .env_remove("XDG_STATE_HOME")
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pass --state-dir DIR"), "{err}");
    Ok(())
}

#[test]
fn ichor_sim_refuses_a_folder_without_inventory() -> TestResult {
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("release-set.yaml"),
        std::fs::read_to_string(homelab_folder().join("release-set.yaml"))?,
    )?;
    std::fs::write(
        dir.path().join("cluster.yaml"),
        "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {name: homelab}\nspec: {}\n",
    )?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(["sim", "--cluster"])
        .arg(dir.path())
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cluster.yaml: spec.inventory lists no nodes"),
        "{err}"
    );
    Ok(())
}

/// `ichor sim --github` serves the GitHub emulator over the repository that holds the
/// cluster folder, and writes its token to the state dir instead of printing it.
#[test]
fn ichor_sim_with_github_serves_the_repository() -> TestResult {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};
    let work = tempfile::tempdir()?;
    let repo = work.path().join("homelab");
    ichor::sim::fixture::Fixture::homelab().build(&repo)?;
    let state = work.path().join("state");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(["sim", "--github", "--cluster"])
        .arg(repo.join("clusters/homelab"))
        .arg("--state-dir")
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("stdout")?;
    let mut base = String::new();
    let mut printed = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        printed.push_str(&line);
        printed.push('\n');
        if let Some(rest) = line.strip_prefix("GitHub API") {
            base = rest.trim().to_string();
        }
        if line.starts_with("Serving until interrupted") {
            break;
        }
    }
    let token = std::fs::read_to_string(state.join("github-token"))?;
    assert!(
        !printed.contains(token.trim()),
        "the token is never printed"
    );
    let addr = base
        .strip_prefix("http://")
        .ok_or(format!("no GitHub line in {printed}"))?;
    let mut conn = std::net::TcpStream::connect(addr)?;
    write!(conn, "GET /repos/local/homelab HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nUser-Agent: test\r\nConnection: close\r\n\r\n", token.trim())?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("\"full_name\":\"local/homelab\""),
        "{answer}"
    );
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()?;
    assert!(child.wait()?.success());
    Ok(())
}

/// Pods on `node` that a drain moves and that are not yet terminating.
fn running_movable(twin: &Twin, node: &str) -> Vec<String> {
    twin.kube
        .with(|c, _| c.pods_on_node(node))
        .into_iter()
        .filter(|p| {
            p.pointer("/metadata/ownerReferences/0/kind") != Some(&Value::from("DaemonSet"))
        })
        .filter(|p| {
            p.pointer("/metadata/annotations/kubernetes.io~1config.mirror")
                .is_none()
        })
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter_map(|p| {
            p.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .collect()
}

fn unschedulable(n: &Value) -> bool {
    n.pointer("/spec/unschedulable") == Some(&Value::Bool(true))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_upgrade_cordons_and_drains_the_node_before_it_goes_down() -> TestResult {
    let (twin, _state) = start(pull_at_once(TwinConfig::default())).await?;
    let mut talos = MachineServiceClient::new(talos_channel(twin.talosconfig()).await?);
    let before = running_movable(&twin, "w-1");
    assert!(!before.is_empty(), "the seed puts workloads on w-1");
    let upgrade = UpgradeRequest {
        image: "ghcr.io/siderolabs/installer:v1.13.0".into(),
        ..Default::default()
    };
    talos
        .upgrade(to_node(upgrade.clone(), "10.0.10.21"))
        .await?;
    twin.advance(Duration::from_secs(1));
    // Still up and Ready, but Talos has cordoned it (marking its own cordon) and evicted
    // what the budgets allowed.
    let n = node(&twin, "w-1");
    assert!(ready(&n), "{n}");
    assert!(unschedulable(&n), "cordoned by Talos: {n}");
    assert_eq!(
        n.pointer("/metadata/annotations/talos.dev~1cordoned"),
        Some(&Value::from("true"))
    );
    let left = running_movable(&twin, "w-1");
    assert!(
        left.len() < before.len(),
        "evicted before the reboot: {left:?} of {before:?}"
    );
    // Evictions a budget blocked are retried; by the time the node goes down (30 s) the
    // replacements elsewhere are Ready and everything has been evicted.
    twin.advance(Duration::from_secs(29));
    assert!(
        running_movable(&twin, "w-1").is_empty(),
        "drained before going down"
    );
    // Back after the reboot: Ready, and Talos lifted the cordon it made.
    twin.advance(Duration::from_secs(120));
    let back = node(&twin, "w-1");
    assert!(ready(&back), "{back}");
    assert!(!unschedulable(&back), "uncordoned by Talos: {back}");
    assert!(back
        .pointer("/metadata/annotations/talos.dev~1cordoned")
        .is_none());

    // A node someone else cordoned first is theirs: Talos does not uncordon it.
    twin.kube
        .with(|c, now| c.set_unschedulable("w-2", true, now))?;
    talos.upgrade(to_node(upgrade, "10.0.10.22")).await?;
    twin.advance(Duration::from_secs(30));
    twin.advance(Duration::from_secs(120));
    let w2 = node(&twin, "w-2");
    assert!(ready(&w2), "{w2}");
    assert!(
        unschedulable(&w2),
        "still cordoned by its first owner: {w2}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_upgrade_drain_respects_disruption_budgets() -> TestResult {
    let mut config = TwinConfig::default();
    config.faults.pdbs_never_allow = vec!["default/web".into()];
    let (twin, _state) = start(pull_at_once(config)).await?;
    let mut talos = MachineServiceClient::new(talos_channel(twin.talosconfig()).await?);
    let webs_on = |twin: &Twin| {
        running_movable(twin, "w-1")
            .into_iter()
            .filter(|p| p.starts_with("web-"))
            .count()
    };
    let web_before = webs_on(&twin);
    assert!(web_before > 0, "a web pod runs on w-1");
    talos
        .upgrade(to_node(
            UpgradeRequest {
                image: "ghcr.io/siderolabs/installer:v1.13.0".into(),
                ..Default::default()
            },
            "10.0.10.21",
        ))
        .await?;
    twin.advance(Duration::from_secs(29));
    assert!(unschedulable(&node(&twin, "w-1")));
    assert_eq!(webs_on(&twin), web_before, "the budget holds the web pod");
    Ok(())
}

// ---- faults for the rollout's fault matrix --------------------------------------------------

/// A kube-rs client on the kubeconfig the twin wrote.
async fn kube_client(twin: &Twin) -> Result<kube::Client, Box<dyn std::error::Error>> {
    let kc = kube::config::Kubeconfig::read_from(twin.kubeconfig())?;
    Ok(kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?,
    )?)
}

/// `POST /_twin/faults` with `body`: the status code and the answer.
async fn post_faults(
    twin: &Twin,
    body: &Value,
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let client = kube_client(twin).await?;
    let req = http::Request::post("/_twin/faults")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body)?)?;
    match client.request_text(req).await {
        Ok(text) => Ok((200, text)),
        Err(kube::Error::Api(s)) => Ok((s.code, s.message)),
        Err(e) => Err(e.into()),
    }
}

/// ichor's own Talos client on the talosconfig the twin wrote, on the twin's clock.
fn ichor_talos(twin: &Twin) -> Result<ichor::talos::TalosClient, Box<dyn std::error::Error>> {
    Ok(ichor::talos::TalosClient::new(
        ichor::talos::config::load(twin.talosconfig(), None)?,
        twin.talos.clock().clone(),
    ))
}

fn call() -> ichor::talos::client::CallOptions<'static> {
    ichor::talos::client::CallOptions::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_faults_are_validated_at_run_time_naming_the_field() -> TestResult {
    let (twin, _state) = start(TwinConfig::default()).await?;
    for (body, field, expect) in [
        (
            serde_json::json!({"etcdUnhealthy": ["w-1"]}),
            "etcdUnhealthy[0]",
            "is a worker",
        ),
        (
            serde_json::json!({"etcdUnhealthy": ["cp-9"]}),
            "etcdUnhealthy[0]",
            "no node \"cp-9\"",
        ),
        (
            serde_json::json!({"wrongVersion": {"w-9": "v1.12.4"}}),
            "wrongVersion.w-9",
            "no node",
        ),
        (
            serde_json::json!({"wrongVersion": {"w-1": "1.12.4"}}),
            "wrongVersion.w-1",
            "expected a Talos version tag like v1.12.6",
        ),
        (
            serde_json::json!({"wrongVersion": {"w-1": "v1.x"}}),
            "wrongVersion.w-1",
            "is not a version tag",
        ),
        (
            serde_json::json!({"replicasNeverRebuild": ["pvc-nope"]}),
            "replicasNeverRebuild[0]",
            "no Longhorn volume \"pvc-nope\" (the cluster has: pvc-home-assistant, pvc-media, pvc-postgres)",
        ),
    ] {
        let (code, text) = post_faults(&twin, &body).await?;
        assert_eq!(code, 422, "{body}: {text}");
        assert!(text.contains(&format!("{field}: ")), "{body}: {text}");
        assert!(text.contains(expect), "{body}: {text}");
    }
    // Nothing was applied.
    assert!(twin
        .talos
        .with_model(|m| m.faults.etcd_unhealthy.is_empty() && m.faults.wrong_version.is_empty()));
    assert!(twin
        .kube
        .with(|c, _| c.faults.replicas_never_rebuild.is_empty()));
    // The config file refuses the same document, naming the field under `faults`.
    let bad = TwinConfig::parse(
        "twin.yaml",
        "faults:\n  etcdUnhealthy: [w-2]\n  wrongVersion: {w-1: latest}\n  replicasNeverRebuild: [pvc-nope]\n",
    )?;
    let folder = ClusterFolder::read(&homelab_folder())?;
    let state = tempfile::tempdir()?;
    let err = Twin::start(
        Clock::manual(),
        &folder,
        state.path(),
        TwinOptions {
            config: bad,
            ..Default::default()
        },
    )
    .await
    .err()
    .ok_or("an invalid fault was accepted")?
    .to_string();
    for field in [
        "faults.etcdUnhealthy[0]: ",
        "faults.wrongVersion.w-1: ",
        "faults.replicasNeverRebuild[0]: ",
    ] {
        assert!(err.contains(field), "{field}: {err}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_etcd_member_reports_no_leader_and_counts_as_down_for_quorum() -> TestResult {
    let (twin, _state) = start(pull_at_once(TwinConfig::default())).await?;
    let talos = ichor_talos(&twin)?;
    let (cp1, cp2, cp3) = ("10.0.10.11", "10.0.10.12", "10.0.10.13");
    let (code, text) = post_faults(&twin, &serde_json::json!({"etcdUnhealthy": ["cp-2"]})).await?;
    assert_eq!(code, 200, "{text}");
    // The member on cp-2 knows no leader, as etcd's Status says it; the others are fine.
    let sick = talos.etcd_status(cp2, call()).await?;
    assert_eq!(sick.errors, vec!["etcdserver: no leader".to_string()]);
    assert_eq!(sick.leader, 0);
    assert!(!sick.is_learner);
    let fine = talos.etcd_status(cp1, call()).await?;
    assert!(fine.errors.is_empty(), "{fine:?}");
    assert_ne!(fine.leader, 0);
    assert_ne!(
        fine.leader, sick.member_id,
        "the leader is a healthy member"
    );
    // Still a member; its etcd service fails its health check.
    assert_eq!(talos.etcd_members(cp1, call()).await?.len(), 3);
    let services = talos.services(cp2, call()).await?;
    assert!(
        services.iter().any(|s| s.id == "etcd" && !s.healthy),
        "{services:?}"
    );
    // A control-plane upgrade is refused as Talos refuses it: a member is not healthy.
    let refused = talos
        .upgrade_legacy(cp3, "ghcr.io/siderolabs/installer:v1.12.6", call())
        .await
        .err()
        .ok_or("an upgrade with an unhealthy member was accepted")?;
    assert!(
        refused
            .to_string()
            .contains("is not healthy; all members must be healthy to perform an upgrade"),
        "{refused}"
    );
    // Taking one more control plane down loses quorum: two of three are not healthy.
    talos.reboot(cp1, call()).await?;
    twin.advance(Duration::from_secs(1));
    assert!(!twin.talos.with_model(|m| m.etcd_has_quorum()));
    let lost = talos
        .etcd_status(cp3, call())
        .await
        .err()
        .ok_or("etcd answered without quorum")?;
    assert!(lost.to_string().contains("quorum lost"), "{lost}");
    // Back up and healed: quorum, a leader, no errors on cp-2.
    twin.advance(Duration::from_secs(120));
    let (code, text) = post_faults(&twin, &serde_json::json!({"etcdUnhealthy": []})).await?;
    assert_eq!(code, 200, "{text}");
    assert!(twin.talos.with_model(|m| m.etcd_has_quorum()));
    let healed = talos.etcd_status(cp2, call()).await?;
    assert!(healed.errors.is_empty(), "{healed:?}");
    assert_ne!(healed.leader, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_version_fault_boots_another_version_after_the_install() -> TestResult {
    // The installer falls back to the old partition: w-1 boots v1.12.4 again.
    let config = TwinConfig::parse("twin.yaml", "faults:\n  wrongVersion: {w-1: v1.12.4}\n")?;
    let (twin, _state) = start(pull_at_once(config)).await?;
    let talos = ichor_talos(&twin)?;
    let w1 = "10.0.10.21";
    let boot = talos.boot_id(w1, call()).await?;
    talos
        .upgrade_legacy(w1, "ghcr.io/siderolabs/installer:v1.12.6", call())
        .await?;
    twin.advance(Duration::from_secs(30 + 90 + 1));
    assert_ne!(talos.boot_id(w1, call()).await?, boot, "it rebooted");
    assert_eq!(talos.version(w1, call()).await?.tag, "v1.12.4");
    let n = node(&twin, "w-1");
    assert!(ready(&n), "{n}");
    assert_eq!(
        n.pointer("/status/nodeInfo/osImage")
            .and_then(Value::as_str),
        Some("Talos (v1.12.4)")
    );
    // Another node installs what it was given; set at run time, w-2 takes a third version.
    let (code, text) = post_faults(
        &twin,
        &serde_json::json!({"wrongVersion": {"w-2": "v1.12.5"}}),
    )
    .await?;
    assert_eq!(code, 200, "{text}");
    let w2 = "10.0.10.22";
    talos
        .upgrade_legacy(w2, "ghcr.io/siderolabs/installer:v1.12.6", call())
        .await?;
    twin.advance(Duration::from_secs(121));
    assert_eq!(talos.version(w2, call()).await?.tag, "v1.12.5");
    // The fault for w-1 was replaced: its next install takes.
    talos
        .upgrade_legacy(w1, "ghcr.io/siderolabs/installer:v1.12.6", call())
        .await?;
    twin.advance(Duration::from_secs(121));
    assert_eq!(talos.version(w1, call()).await?.tag, "v1.12.6");
    Ok(())
}

/// The Longhorn view ichor reads: (robustness, nodes with a running replica). Each time,
/// the per-node reads a step makes (label-selected replicas, volumes by name) must see
/// exactly what the whole lists say, in whatever state the test has brought the volume to.
async fn volume(
    kube: &ichor::kube::KubeClient,
    name: &str,
) -> Result<(Option<String>, Vec<String>), Box<dyn std::error::Error>> {
    let all = kube.longhorn_volumes().await?;
    let v = all
        .iter()
        .find(|v| v.name == name)
        .ok_or(format!("no volume {name}"))?
        .clone();
    for node in &v.holders {
        let mine = kube.longhorn_volumes_of(Some(node), &[]).await?;
        let mut want: Vec<_> = all.iter().filter(|v| v.holders.contains(node)).collect();
        let mut got: Vec<_> = mine.iter().collect();
        got.sort_by(|a, b| a.name.cmp(&b.name));
        want.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(got, want, "what {node}'s look reads");
    }
    let known = kube
        .longhorn_volumes_of(None, &[name.to_string(), "no-such-volume".into()])
        .await?;
    assert_eq!(known, vec![v.clone()], "{name} read by name");
    Ok((v.robustness, v.nodes))
}

fn replica_state(twin: &Twin, volume: &str, node: &str) -> Option<String> {
    twin.kube
        .with(|c, _| c.list("replicas", Some("longhorn-system")))
        .into_iter()
        .find(|r| {
            r.pointer("/spec/volumeName").and_then(Value::as_str) == Some(volume)
                && r.pointer("/spec/nodeID").and_then(Value::as_str) == Some(node)
        })
        .and_then(|r| {
            r.pointer("/status/currentState")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_replica_resyncs_before_the_volume_is_healthy_and_the_fault_keeps_it_failed(
) -> TestResult {
    let (twin, _state) = start(TwinConfig::default()).await?;
    let kube = ichor::kube::KubeClient::connect(Some(twin.kubeconfig())).await?;
    let talos = ichor_talos(&twin)?;
    let (code, text) = post_faults(
        &twin,
        &serde_json::json!({"replicasNeverRebuild": ["pvc-media"]}),
    )
    .await?;
    assert_eq!(code, 200, "{text}");
    let all = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        volume(&kube, "pvc-postgres").await?,
        (Some("healthy".into()), all(&["w-1", "w-2", "w-3"]))
    );
    talos.reboot("10.0.10.21", call()).await?;
    twin.advance(Duration::from_secs(1));
    assert_eq!(
        volume(&kube, "pvc-postgres").await?,
        (Some("degraded".into()), all(&["w-2", "w-3"]))
    );
    // Back after the 90 s reboot: the replica runs again at once, but re-syncs first.
    twin.advance(Duration::from_secs(90));
    assert!(ready(&node(&twin, "w-1")));
    assert_eq!(
        volume(&kube, "pvc-postgres").await?,
        (Some("degraded".into()), all(&["w-1", "w-2", "w-3"]))
    );
    twin.advance(Duration::from_secs(118));
    assert_eq!(
        volume(&kube, "pvc-postgres").await?.0.as_deref(),
        Some("degraded")
    );
    twin.advance(Duration::from_secs(1));
    assert_eq!(
        volume(&kube, "pvc-postgres").await?,
        (Some("healthy".into()), all(&["w-1", "w-2", "w-3"]))
    );
    // Under the fault, pvc-media's replica on w-1 stays stopped and nothing replaces it.
    assert_eq!(
        replica_state(&twin, "pvc-media", "w-1").as_deref(),
        Some("stopped")
    );
    twin.advance(Duration::from_secs(3600));
    assert_eq!(
        volume(&kube, "pvc-media").await?,
        (Some("degraded".into()), all(&["w-2", "w-3"]))
    );
    let replicas = twin
        .kube
        .with(|c, _| c.list("replicas", Some("longhorn-system")))
        .into_iter()
        .filter(|r| r.pointer("/spec/volumeName").and_then(Value::as_str) == Some("pvc-media"))
        .count();
    assert_eq!(replicas, 3, "never rebuilt elsewhere");
    // Healed: the failed replica is reused, running at once, healthy once re-synced.
    let (code, text) = post_faults(&twin, &serde_json::json!({"replicasNeverRebuild": []})).await?;
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        replica_state(&twin, "pvc-media", "w-1").as_deref(),
        Some("running")
    );
    assert_eq!(
        volume(&kube, "pvc-media").await?.0.as_deref(),
        Some("degraded")
    );
    twin.advance(Duration::from_secs(120));
    assert_eq!(
        volume(&kube, "pvc-media").await?,
        (Some("healthy".into()), all(&["w-1", "w-2", "w-3"]))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_attachments_follow_the_pods_that_mount_longhorn_volumes() -> TestResult {
    let (twin, _state) = start(TwinConfig::default()).await?;
    let kube = ichor::kube::KubeClient::connect(Some(twin.kubeconfig())).await?;
    let pod_of = |app: &str| {
        twin.kube
            .with(|c, _| c.list("pods", Some("apps")))
            .into_iter()
            .find(|p| p.pointer("/metadata/labels/app").and_then(Value::as_str) == Some(app))
    };
    let pg = pod_of("postgres").ok_or("no postgres pod")?;
    let host = pg
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .ok_or("not scheduled")?
        .to_string();
    let attached = kube.volume_attachments(&host).await?;
    assert!(
        !attached.is_empty(),
        "the volume is attached where its pod runs"
    );
    assert!(
        attached
            .iter()
            .all(|n| n.starts_with("csi-") && n.len() == 68),
        "{attached:?}"
    );
    let lh_node = |twin: &Twin| {
        twin.kube
            .with(|c, _| c.get("volumes", "longhorn-system", "pvc-postgres"))
            .and_then(|v| {
                v.pointer("/spec/nodeID")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
    };
    assert_eq!(lh_node(&twin).as_deref(), Some(host.as_str()));
    // Cordon and evict it: it terminates (30 s), then the volume detaches (10 s later).
    kube.cordon(&host, "test-rollout").await?;
    let pods = kube.pods_on(&host).await?;
    let victim = pods
        .iter()
        .find(|p| p.namespace == "apps" && p.name.starts_with("postgres"))
        .ok_or("no postgres pod on its node")?;
    kube.evict(victim).await?;
    let before = kube.volume_attachments(&host).await?;
    twin.advance(Duration::from_secs(29));
    assert_eq!(
        kube.volume_attachments(&host).await?,
        before,
        "still terminating"
    );
    twin.advance(Duration::from_secs(1));
    assert_eq!(
        kube.volume_attachments(&host).await?,
        before,
        "detaching takes a moment after the pod is gone"
    );
    // The replacement waits for the detach (a ReadWriteOnce volume attaches to one node).
    let waiting = pod_of("postgres").ok_or("no replacement")?;
    assert_eq!(
        waiting.pointer("/status/phase").and_then(Value::as_str),
        Some("Pending"),
        "{waiting}"
    );
    twin.advance(Duration::from_secs(10));
    let left = kube.volume_attachments(&host).await?;
    assert!(left.len() < before.len(), "{left:?} vs {before:?}");
    assert_ne!(lh_node(&twin).as_deref(), Some(host.as_str()));
    twin.advance(Duration::from_secs(10));
    let moved = pod_of("postgres").ok_or("no replacement")?;
    assert_eq!(
        moved.pointer("/status/phase").and_then(Value::as_str),
        Some("Running"),
        "{moved}"
    );
    let new_host = moved
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .ok_or("not scheduled")?
        .to_string();
    assert_ne!(new_host, host);
    let postgres: Vec<String> = twin
        .kube
        .with(|c, _| c.list("volumeattachments", None))
        .into_iter()
        .filter(|va| {
            va.pointer("/spec/source/persistentVolumeName")
                .and_then(Value::as_str)
                == Some("pvc-postgres")
        })
        .filter_map(|va| {
            va.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        postgres,
        vec![new_host.clone()],
        "attached to one node, the new one"
    );
    assert!(kube
        .volume_attachments(&new_host)
        .await?
        .iter()
        .any(|n| !before.contains(n)));
    assert_eq!(lh_node(&twin).as_deref(), Some(new_host.as_str()));
    Ok(())
}

/// What wakes a settling step: watches on its Node, pods, replicas and attachments report
/// each change to them, its Node's apart (a step reading only the Talos API wakes on those
/// alone), and a watch the API refuses reports a change (so the step polls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steps_watches_report_the_changes_to_its_node_and_a_refused_watch_as_one() -> TestResult {
    let (twin, _state) = start(TwinConfig::default()).await?;
    let kube = ichor::kube::KubeClient::connect(Some(twin.kubeconfig())).await?;
    let talos = ichor_talos(&twin)?;
    let guard = Duration::from_secs(30);
    let changes = kube.changes_of("w-1", &["pvc-postgres".to_string()], &twin.clock);
    tokio::time::timeout(guard, changes.watching()).await?;
    assert!(!changes.take(), "nothing changed yet");
    // Its Node.
    kube.cordon("w-1", "test").await?;
    tokio::time::timeout(guard, changes.changed(Scope::NODE)).await?;
    assert!(!changes.take(), "the wake-up took what was pending");
    // One of its volumes, not a replica of it: Longhorn's volume controller writes the
    // volume apart from its replicas, and a look judges both.
    let volumes: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        kube_client(&twin).await?,
        "longhorn-system",
        &kube::api::ApiResource {
            group: "longhorn.io".into(),
            version: "v1beta2".into(),
            api_version: "longhorn.io/v1beta2".into(),
            kind: "Volume".into(),
            plural: "volumes".into(),
        },
    );
    volumes
        .patch(
            "pvc-postgres",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {"test": "1"}}}),
            ),
        )
        .await?;
    tokio::time::timeout(guard, changes.changed(Scope::REPLICAS)).await?;
    // Its pods, replicas and attachments: a reboot fails the replica and takes the pods.
    talos.reboot("10.0.10.21", call()).await?;
    twin.advance(Duration::from_secs(1));
    tokio::time::timeout(guard, async {
        while !changes.pending(Scope::REPLICAS) {
            tokio::task::yield_now().await;
        }
    })
    .await?;
    // The replica failed at once; its Node has not changed yet: a step reading only the
    // Talos API sleeps through the replica's change.
    assert!(
        !changes.pending(Scope::NODE),
        "the Node has not changed yet"
    );
    tokio::time::timeout(guard, changes.changed(Scope::EVERYTHING)).await?;
    // Silent past kube-controller-manager's grace period, the Node turns NotReady.
    twin.advance(Duration::from_secs(45));
    tokio::time::timeout(guard, changes.changed(Scope::NODE)).await?;
    drop(changes);
    // Refused: every request fails, and the step is told to look.
    let (code, text) = post_faults(
        &twin,
        &serde_json::json!({"apiErrorBurst": {"count": 1000}}),
    )
    .await?;
    assert_eq!(code, 200, "{text}");
    let blind = kube.changes_of("w-2", &[], &twin.clock);
    tokio::time::timeout(guard, blind.changed(Scope::NODE)).await?;
    twin.advance(Duration::from_secs(5));
    tokio::time::timeout(guard, blind.changed(Scope::EVERYTHING)).await?;
    Ok(())
}
