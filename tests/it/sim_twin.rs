//! The whole twin from a cluster folder: Talos machine API and Kubernetes API stay
//! consistent. A user's clients talk to both over real sockets, using the talosconfig and
//! kubeconfig the twin wrote; time moves only through a manual clock.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use ichor::clock::Clock;
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
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
    if Path::new("/usr/bin/kubectl").exists() {
        let out = Command::new("/usr/bin/kubectl")
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
    let (twin, _state) = start(TwinConfig::default()).await?;
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
    let (twin, _state) = start(config).await?;
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
