//! The whole twin: the Talos nodes and the Kubernetes API server built from one cluster
//! folder (`cluster.yaml` inventory + `release-set.yaml` versions), kept consistent with each
//! other, plus optionally the GitHub emulator over the repository the folder lives in.
//!
//! The Talos model owns the machines (versions, reboots, static pods, etcd); the Kubernetes
//! model owns the API objects. After every change on the Talos side, [`Twin::project`]
//! carries what Kubernetes would see across: a node that went down is NotReady and loses its
//! pods (controllers recreate them elsewhere, Longhorn replicas degrade), a node that came
//! back is Ready with its new boot id and `Talos (vX)` OS image, a restarted kubelet reports
//! its new version, and a restarted static pod's mirror pod shows the new image and its
//! readiness.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::clock::{Clock, Timestamp};
use crate::releaseset::{
    Cluster, DocumentError, HandoverMode, HumanDuration, ReleaseSet, Role, Version, VolumeProvider,
};
use crate::sim::faults::{
    limits as fault_limits, FaultError, FaultHook, FaultTargets, FaultsConfig, FieldError, Origin,
};
use crate::sim::github::{GithubTwin, RepoSpec};
use crate::sim::kube::{self, KubeSeed, KubeTwin};
use crate::sim::net::NetLimits;
use crate::sim::state::{self, StateError};
use crate::sim::talos::{self, ConfigForm, NodeSpec, TalosTwin, TalosTwinOptions};
use crate::sim::yaml;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{0}")]
    Document(#[from] DocumentError),
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{0}")]
    Spec(String),
    #[error(transparent)]
    Talos(#[from] talos::TwinError),
    #[error(transparent)]
    Kube(#[from] kube::TwinError),
    #[error("github emulator: {0}")]
    Github(String),
    #[error("{0}")]
    Config(FaultError),
    #[error(transparent)]
    State(#[from] StateError),
}

/// Bounds on what a cluster folder and `--config` may ask the twin to build.
pub mod limits {
    /// Inventory nodes: each is a Talos endpoint (a socket, a certificate) and a Node.
    pub const MAX_NODES: usize = 500;
    /// `extraPods`, over the whole cluster.
    pub const MAX_EXTRA_PODS: u32 = 10_000;
    /// `deprecatedApiRequests` entries.
    pub const MAX_DEPRECATED_APIS: usize = 1000;
    /// A cluster document or `--config` file.
    pub const MAX_FILE: u64 = 1 << 20;
}

/// Simulated durations and faults for `ichor sim --config FILE` (all optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TwinConfig {
    #[serde(default)]
    pub timings: TimingsConfig,
    #[serde(default)]
    pub faults: FaultsConfig,
    /// Extra workload pods beyond the small home set (CoreDNS, a web app, the CNI), spread
    /// over Deployments of at most 100 replicas, to rehearse on a busier cluster.
    #[serde(default)]
    pub extra_pods: u32,
    /// Requests to deprecated APIs the apiserver has seen, reported by `/metrics` as
    /// `apiserver_requested_deprecated_apis` (to rehearse the removed-API warning).
    #[serde(default)]
    pub deprecated_api_requests: Vec<DeprecatedApiRequest>,
    /// Nodes register with Kubernetes under their FQDN, as Talos does with
    /// `machine.kubelet.registerWithFQDN: true`; Talos hostnames and etcd member names
    /// stay short.
    #[serde(default, rename = "registerWithFQDN")]
    pub register_with_fqdn: Option<RegisterWithFqdn>,
    /// Node → the boot loader it boots with (`grub`, the default, or `sdboot`): which slot
    /// an install writes and what a second install on one boot destroys follow it.
    #[serde(default)]
    pub bootloader: BTreeMap<String, BootloaderName>,
    /// Connection limits of every listener (library only: not read from the file).
    #[serde(skip)]
    pub net: NetLimits,
}

/// `timings.installerPull` unless configured: the legacy Upgrade's pull inside the call.
pub const DEFAULT_INSTALLER_PULL: std::time::Duration = std::time::Duration::from_secs(30);

/// A boot loader as `--config` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootloaderName {
    Grub,
    Sdboot,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RegisterWithFqdn {
    /// The domain every hostname is qualified with (`example.org`).
    pub domain: String,
}

/// The name a machine's Node registers under: Talos lower-cases the hostname, or its FQDN
/// under `registerWithFQDN` (siderolabs/talos@021c73c3:internal/app/machined/pkg/
/// controllers/k8s/nodename.go `NodenameController`), while etcd names the member with the
/// hostname as it is.
pub fn node_name(hostname: &str, fqdn: Option<&RegisterWithFqdn>) -> String {
    match fqdn {
        Some(f) => format!("{hostname}.{}", f.domain).to_lowercase(),
        None => hostname.to_lowercase(),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeprecatedApiRequest {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub resource: String,
    /// The Kubernetes minor that removes it, e.g. "1.36".
    pub removed_release: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimingsConfig {
    /// Legacy Upgrade: from the request to the node going down.
    pub upgrade: Option<HumanDuration>,
    /// From going down to being back up.
    pub reboot: Option<HumanDuration>,
    /// LifecycleService/Upgrade: writing the new version to disk.
    pub install: Option<HumanDuration>,
    pub static_pod_restart: Option<HumanDuration>,
    pub kubelet_restart: Option<HumanDuration>,
    /// Legacy Upgrade: pulling the installer into the system containerd, inside the call.
    pub installer_pull: Option<HumanDuration>,
}

impl TwinConfig {
    pub fn parse(file: &str, text: &str) -> Result<TwinConfig, DocumentError> {
        if text.trim().is_empty() {
            return Ok(TwinConfig::default());
        }
        yaml::check(text).map_err(|e| DocumentError::new(file, e.to_string()))?;
        serde_yaml::from_str(text).map_err(|e| DocumentError::from_yaml(file, &e))
    }

    /// Every bound and reference of the configuration, against what the twin will build
    /// (`targets`); the same validator `POST /_twin/faults` uses for `faults`.
    pub fn validate(&self, targets: &FaultTargets) -> Result<(), SimError> {
        let mut errors = match self.faults.validate(targets, Origin::Config, "faults") {
            Ok(()) => Vec::new(),
            Err(e) => e.0,
        };
        let mut bad = |field: &str, message: String| {
            errors.push(FieldError {
                field: field.to_string(),
                message,
            })
        };
        if self.extra_pods > limits::MAX_EXTRA_PODS {
            bad(
                "extraPods",
                format!(
                    "{} is too many: expected at most {}",
                    self.extra_pods,
                    limits::MAX_EXTRA_PODS
                ),
            );
        }
        if let Some(f) = &self.register_with_fqdn {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            };
            if f.domain.len() > 200 || !f.domain.split('.').all(label_ok) {
                bad(
                    "registerWithFQDN.domain",
                    "expected a DNS domain of at most 200 characters (labels of letters, digits and `-`)".to_string(),
                );
            }
        }
        if self.deprecated_api_requests.len() > limits::MAX_DEPRECATED_APIS {
            bad(
                "deprecatedApiRequests",
                format!(
                    "{} entries is too many: expected at most {}",
                    self.deprecated_api_requests.len(),
                    limits::MAX_DEPRECATED_APIS
                ),
            );
        }
        for name in self.bootloader.keys() {
            if targets.nodes.as_ref().is_some_and(|n| !n.contains(name)) {
                bad(
                    &format!("bootloader.{name}"),
                    format!("no Talos node is named {name:?}"),
                );
            }
        }
        let t = &self.timings;
        for (name, d) in [
            ("upgrade", t.upgrade),
            ("reboot", t.reboot),
            ("install", t.install),
            ("staticPodRestart", t.static_pod_restart),
            ("kubeletRestart", t.kubelet_restart),
            ("installerPull", t.installer_pull),
        ] {
            if let Some(d) = d.filter(|d| d.0 > fault_limits::MAX_DURATION) {
                bad(
                    &format!("timings.{name}"),
                    format!(
                        "{d} is too long: expected at most {}",
                        HumanDuration(fault_limits::MAX_DURATION)
                    ),
                );
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SimError::Config(FaultError(errors)))
        }
    }
}

/// Reads a file the twin is configured from (a cluster document, `--config`), refusing
/// one larger than [`limits::MAX_FILE`] without reading it all.
pub fn read_file(path: &Path) -> Result<String, SimError> {
    use std::io::Read;
    let fail = |message: String| SimError::File {
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let mut bytes = Vec::new();
    file.take(limits::MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > limits::MAX_FILE {
        return Err(fail(format!(
            "is larger than {} bytes; the twin reads configuration files up to that",
            limits::MAX_FILE
        )));
    }
    String::from_utf8(bytes).map_err(|e| fail(format!("is not UTF-8: {e}")))
}

/// A cluster folder: `cluster.yaml` (with `spec.inventory`) and `release-set.yaml`.
#[derive(Debug, Clone)]
pub struct ClusterFolder {
    pub dir: PathBuf,
    pub cluster: Cluster,
    pub release_set: ReleaseSet,
}

impl ClusterFolder {
    pub fn read(dir: &Path) -> Result<ClusterFolder, SimError> {
        let read = |name: &str| -> Result<(String, String), SimError> {
            let path = dir.join(name);
            read_file(&path).map(|t| (path.display().to_string(), t))
        };
        let (cpath, ctext) = read("cluster.yaml")?;
        let (rpath, rtext) = read("release-set.yaml")?;
        // The documents' own parsers build values as serde_yaml expands them.
        for (path, text) in [(&cpath, &ctext), (&rpath, &rtext)] {
            yaml::check(text).map_err(|e| SimError::File {
                path: PathBuf::from(path),
                message: e.to_string(),
            })?;
        }
        let cluster = Cluster::parse(&cpath, &ctext)?;
        let release_set = ReleaseSet::parse(&rpath, &rtext)?;
        if cluster
            .spec
            .inventory
            .as_ref()
            .is_none_or(|i| i.nodes.is_empty())
        {
            return Err(SimError::Spec(format!(
                "{cpath}: spec.inventory lists no nodes; the twin builds its machines from it"
            )));
        }
        let count = cluster.spec.inventory.as_ref().map_or(0, |i| i.nodes.len());
        if count > limits::MAX_NODES {
            return Err(SimError::Spec(format!(
                "{cpath}: spec.inventory lists {count} nodes; the twin simulates at most {}",
                limits::MAX_NODES
            )));
        }
        Ok(ClusterFolder {
            dir: dir.to_path_buf(),
            cluster,
            release_set,
        })
    }
}

/// Options for [`Twin::start`].
#[derive(Debug, Clone, Default)]
pub struct TwinOptions {
    pub config: TwinConfig,
    /// Serve the GitHub emulator as `owner/name` over a private clone of this repository
    /// (made in the state directory; the repository itself is never written).
    pub github: Option<(String, PathBuf)>,
}

/// The running twin.
pub struct Twin {
    pub clock: Clock,
    pub talos: Arc<TalosTwin>,
    pub kube: Arc<KubeTwin>,
    pub github: Option<GithubTwin>,
    /// The emulator's private bare clone (push branches there, as to GitHub).
    pub github_repo: Option<PathBuf>,
    pub state_dir: PathBuf,
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    /// How machines name their Nodes (`registerWithFQDN`).
    fqdn: Option<RegisterWithFqdn>,
    projector: Option<JoinHandle<()>>,
    projector_wakeups: Arc<AtomicU64>,
}

/// How often each background task of the twin woke up: an idle twin sleeps until its next
/// simulated event or a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wakeups {
    /// The Talos → Kubernetes projection.
    pub projector: u64,
    /// The Talos side's event driver.
    pub talos: u64,
    /// The Kubernetes side's controller driver.
    pub kube: u64,
}

/// What Kubernetes was last told about a node, so projection only sends changes.
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    up: bool,
    ready: bool,
    boot_id: String,
    talos_version: String,
    kubelet_version: String,
    static_pods: Vec<(String, String, bool)>,
    config_version: u64,
    /// In a legacy MachineService/Upgrade, before going down (Talos drains meanwhile).
    upgrading: bool,
}

fn ip_for(i: usize, address: Option<&str>) -> Result<IpAddr, SimError> {
    match address {
        Some(a) => a.parse().map_err(|_| {
            SimError::Spec(format!(
                "node address `{a}` is not an IP address; the twin needs one per node"
            ))
        }),
        None => Ok(IpAddr::from([10, 5, (i / 250) as u8, (i % 250 + 2) as u8])),
    }
}

/// Talos 1.14 writes the Kubernetes components as separate documents.
fn config_form(talos: &Version) -> ConfigForm {
    if talos.minor_version() >= crate::releaseset::MinorVersion::new(1, 14) {
        ConfigForm::MultiDoc
    } else {
        ConfigForm::V1Alpha1
    }
}

/// The machines and the Kubernetes objects a cluster folder describes.
pub fn build_specs(
    folder: &ClusterFolder,
    extra_pods: u32,
    fqdn: Option<&RegisterWithFqdn>,
) -> Result<(Vec<NodeSpec>, KubeSeed), SimError> {
    if extra_pods > limits::MAX_EXTRA_PODS {
        return Err(SimError::Spec(format!(
            "extraPods: {extra_pods} is too many: expected at most {}",
            limits::MAX_EXTRA_PODS
        )));
    }
    let rs = &folder.release_set.spec;
    let spec = &folder.cluster.spec;
    let inventory = spec
        .inventory
        .as_ref()
        .map(|i| i.nodes.as_slice())
        .unwrap_or_default();
    let mut nodes = Vec::new();
    let mut seed = KubeSeed::new().versions(&rs.talos.tag(), &rs.kubernetes.tag());
    for (i, n) in inventory.iter().enumerate() {
        let talos_version = n.talos.as_ref().unwrap_or(&rs.talos);
        let kubelet = n.kubelet.as_ref().unwrap_or(&rs.kubernetes);
        let ip = ip_for(i, n.address.as_deref())?;
        nodes.push(NodeSpec {
            name: n.name.clone(),
            role: match n.role {
                Role::Controlplane => talos::Role::ControlPlane,
                Role::Worker => talos::Role::Worker,
            },
            ip,
            talos_version: talos_version.tag(),
            kubernetes_version: rs.kubernetes.tag(),
            kubelet_version: kubelet.tag(),
            config_form: config_form(talos_version),
        });
        seed = seed.node(
            &node_name(&n.name, fqdn),
            if n.role == Role::Controlplane {
                kube::Role::ControlPlane
            } else {
                kube::Role::Worker
            },
            &ip.to_string(),
        );
        if let Some(last) = seed.nodes.last_mut() {
            last.talos_version = talos_version.tag();
            last.kubelet_version = kubelet.tag();
        }
    }
    // What a small home cluster runs: the CNI (and kube-proxy unless the CNI replaces it) on
    // every node, CoreDNS and a web app with PodDisruptionBudgets.
    let cni = &rs.cni;
    seed = seed.daemonset(
        "kube-system",
        cni_daemonset(&cni.name),
        &format!("{}:{}", cni_image(&cni.name), cni.version.tag()),
    );
    if !spec.cni.replaces_kube_proxy {
        seed = seed.daemonset("kube-system", "kube-proxy", "registry.k8s.io/kube-proxy");
    }
    seed = seed
        .deployment("kube-system", "coredns", 2)
        .pdb_max_unavailable("kube-system", "coredns", "coredns", json!(1))
        .deployment_with_empty_dir("default", "web", 3)
        .pdb_min_available("default", "web", "web", json!(2));
    let mut left = extra_pods;
    let mut i = 0;
    while left > 0 {
        let n = left.min(100);
        i += 1;
        seed = seed.deployment("load", &format!("app-{i}"), n);
        left -= n;
    }
    if spec.cni.handover.mode != HandoverMode::Disabled {
        if let Some(app) = &spec.cni.handover.argocd_application {
            seed = seed.application(&app.name, "Synced", "Healthy");
        }
    }
    if spec.volumes.provider == VolumeProvider::Longhorn {
        // Each volume is in use: a one-replica Deployment in `apps` mounts it, so draining
        // its node detaches it (VolumeAttachments) before the pod runs elsewhere.
        for (volume, holders) in volume_holders(folder) {
            let app = volume.strip_prefix("pvc-").unwrap_or(&volume).to_string();
            seed = seed.longhorn_volume_used_by(&volume, holders.len() as u32, "apps", &app);
        }
    }
    Ok((nodes, seed))
}

/// The admin kubeconfig the control planes hand out (MachineService/Kubeconfig), shaped as
/// siderolabs/talos v1.13.9 pkg/kubeconfig/generate.go renders it (cluster `<name>`, user and
/// context `admin@<name>`, namespace `default`). Talos authenticates it with a client
/// certificate of O=system:masters; the Kubernetes twin authenticates bearer tokens only,
/// so it carries the twin's cluster-admin token instead (docs/twin.md).
fn admin_kubeconfig(cluster: &str, kube: &KubeTwin) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(&kube.ca_pem);
    // A JSON string is a YAML scalar: any cluster name is quoted safely.
    let quote = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let name = quote(cluster);
    let user = quote(&format!("admin@{cluster}"));
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: {user}\n  context:\n    cluster: {name}\n    namespace: default\n    user: {user}\ncurrent-context: {user}\n",
        url = kube.url,
        token = kube.token(),
    )
}

/// Stage the `stagedConfig` fault's changes on each node it names.
fn stage_all(
    m: &mut talos::TalosCluster,
    staged: &BTreeMap<String, BTreeMap<String, serde_json::Value>>,
) -> Result<(), String> {
    for (node, paths) in staged {
        let values: Vec<(String, serde_yaml::Value)> = paths
            .iter()
            .map(|(p, v)| {
                serde_yaml::to_value(v)
                    .map(|v| (p.clone(), v))
                    .map_err(|e| format!("{node}.{p}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        m.stage_config(node, &values)
            .map_err(|e| format!("{node}: {e}"))?;
    }
    Ok(())
}

/// Apply the `tryConfig` fault's TRY on each node it names, as `talosctl apply-config
/// --mode try` would, rolled back after `tryTimeout` (default 1m).
fn try_all(
    m: &mut talos::TalosCluster,
    tries: &BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    timeout: Option<Duration>,
) -> Result<(), String> {
    let timeout = timeout.unwrap_or(Duration::from_secs(60));
    for (node, paths) in tries {
        let values: Vec<(String, serde_yaml::Value)> = paths
            .iter()
            .map(|(p, v)| {
                serde_yaml::to_value(v)
                    .map(|v| (p.clone(), v))
                    .map_err(|e| format!("{node}.{p}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        m.try_config(node, &values, timeout)
            .map_err(|e| format!("{node}: {e}"))?;
    }
    Ok(())
}

/// The CNI agent's DaemonSet as its own manifests name it: Calico's is `calico-node`
/// (projectcalico/calico@v3.29.3:charts/calico/templates/calico-node.yaml, in kube-system);
/// Cilium's is `cilium`. Others keep the CNI's name.
fn cni_daemonset(name: &str) -> &str {
    match name {
        "calico" => "calico-node",
        other => other,
    }
}

fn cni_image(name: &str) -> String {
    match name {
        "cilium" => "quay.io/cilium/cilium".into(),
        "calico" => "quay.io/calico/node".into(),
        "flannel" => "ghcr.io/flannel-io/flannel".into(),
        other => format!("registry.example/{other}"),
    }
}

/// Volume → the nodes holding a replica of it, from the inventory.
fn volume_holders(folder: &ClusterFolder) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in folder.cluster.spec.inventory.iter().flat_map(|i| &i.nodes) {
        for v in &n.volumes {
            out.entry(v.clone()).or_default().push(n.name.clone());
        }
    }
    out
}

impl Twin {
    /// Start the Talos endpoints and the Kubernetes API server for `folder`, write
    /// `talosconfig` and `kubeconfig` into `state_dir`, and keep the two consistent.
    /// Everything is checked before anything starts: the configuration against its bounds
    /// and the cluster it names, the state directory against its rules
    /// ([`crate::sim::state`]).
    pub async fn start(
        clock: Clock,
        folder: &ClusterFolder,
        state_dir: &Path,
        options: TwinOptions,
    ) -> Result<Twin, SimError> {
        let cfg = &options.config;
        let fqdn = cfg.register_with_fqdn.as_ref();
        let (nodes, mut seed) = build_specs(folder, cfg.extra_pods, fqdn)?;
        let targets = FaultTargets {
            nodes: Some(nodes.iter().map(|n| n.name.clone()).collect()),
            control_planes: nodes
                .iter()
                .filter(|n| n.role == talos::Role::ControlPlane)
                .map(|n| n.name.clone())
                .collect(),
            volumes: seed.volumes.iter().map(|v| v.name.clone()).collect(),
            pdbs: seed
                .pdbs
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect(),
            github: options.github.is_some(),
        };
        cfg.validate(&targets)?;
        state::prepare_dir(state_dir)?;
        for d in &cfg.deprecated_api_requests {
            seed = seed.deprecated_api(&d.group, &d.version, &d.resource, &d.removed_release);
        }
        let mut topts = TalosTwinOptions {
            context: folder.cluster.name().to_string(),
            net: cfg.net,
            ..Default::default()
        };
        let t = &cfg.timings;
        let set = |slot: &mut Duration, v: Option<HumanDuration>| {
            if let Some(v) = v {
                *slot = v.0;
            }
        };
        set(&mut topts.timings.upgrade, t.upgrade);
        set(&mut topts.timings.reboot, t.reboot);
        set(&mut topts.timings.install, t.install);
        set(&mut topts.timings.static_pod_restart, t.static_pod_restart);
        set(&mut topts.timings.kubelet_restart, t.kubelet_restart);
        topts.timings.installer_pull = t.installer_pull.map_or(DEFAULT_INSTALLER_PULL, |d| d.0);
        // Validated above: every name exists and every number is in range.
        let f = &cfg.faults;
        topts
            .faults
            .never_return
            .extend(f.nodes_never_return.iter().cloned());
        for (n, d) in &f.slow_apply {
            topts.faults.slow_apply.insert(n.clone(), d.0);
        }
        for (n, d) in &f.slow_installer_pull {
            topts.faults.slow_installer_pull.insert(n.clone(), d.0);
        }
        topts
            .faults
            .failing_images
            .extend(f.failing_images.iter().cloned());
        topts
            .faults
            .etcd_unhealthy
            .extend(f.etcd_unhealthy.iter().cloned());
        for (n, d) in &f.etcd_catch_up {
            topts.faults.etcd_catch_up.insert(n.clone(), d.0);
        }
        topts
            .faults
            .etcd_stale_members
            .extend(f.etcd_stale_members.iter().cloned());
        for (n, v) in &f.wrong_version {
            // Validated: a version tag.
            if let Ok(tag) = crate::sim::faults::talos_tag(v) {
                topts.faults.wrong_version.insert(n.clone(), tag);
            }
        }
        for (n, c) in &f.installer_exit_code {
            // Validated: 1 to 255.
            topts
                .faults
                .installer_exit_code
                .insert(n.clone(), i32::try_from(*c).unwrap_or(1));
        }
        seed.faults
            .kubelet_down
            .extend(f.kubelet_down.iter().map(|n| node_name(n, fqdn)));
        seed.faults
            .replicas_never_rebuild
            .extend(f.replicas_never_rebuild.iter().cloned());
        for p in &f.pdbs_never_allow {
            if let Some((ns, name)) = p.split_once('/') {
                seed.faults
                    .pdb_never_allows
                    .insert((ns.to_string(), name.to_string()));
            }
        }
        if let Some(b) = &f.api_error_burst {
            seed.faults.burst_remaining = u32::try_from(b.count).unwrap_or(u32::MAX);
            seed.faults.burst_code = u16::try_from(b.status).unwrap_or(500);
            seed.faults.retry_after_secs = b.retry_after.map(|d| d.0.as_secs()).unwrap_or(1);
        }

        let mut github_repo = None;
        let github = match &options.github {
            Some((name, path)) => {
                let clone = crate::sim::github::private_clone(path, state_dir, name)
                    .map_err(|e| SimError::Github(e.to_string()))?;
                github_repo = Some(clone.clone());
                let gh = GithubTwin::start_with(
                    clock.clone(),
                    crate::sim::github::GithubTwinConfig {
                        repos: vec![RepoSpec::new(name, clone)],
                        net: cfg.net,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| SimError::Github(e.to_string()))?;
                if f.dropped_webhooks > 0 {
                    gh.drop_next_webhooks(u32::try_from(f.dropped_webhooks).unwrap_or(u32::MAX));
                }
                Some(gh)
            }
            None => None,
        };
        let talos = Arc::new(TalosTwin::start(clock.clone(), nodes, state_dir, topts).await?);
        talos.with_model(|m| {
            for (node, loader) in &cfg.bootloader {
                m.set_bootloader(
                    node,
                    match loader {
                        BootloaderName::Grub => crate::sim::talos::Bootloader::Grub,
                        BootloaderName::Sdboot => crate::sim::talos::Bootloader::SdBoot,
                    },
                );
            }
        });
        // The machines are configured as the cluster folder says the CNI runs.
        if folder.cluster.spec.cni.replaces_kube_proxy {
            talos
                .with_model(|m| m.disable_kube_proxy())
                .map_err(|e| SimError::Spec(format!("spec.cni.replacesKubeProxy: {e}")))?;
        }
        if !f.staged_config.is_empty() {
            let staged = f.staged_config.clone();
            talos
                .with_model(|m| stage_all(m, &staged))
                .map_err(|e| SimError::Spec(format!("faults.stagedConfig: {e}")))?;
        }
        if !f.try_config.is_empty() {
            let tries = f.try_config.clone();
            let timeout = f.try_timeout.map(|d| d.0);
            talos
                .with_model(|m| try_all(m, &tries, timeout))
                .map_err(|e| SimError::Spec(format!("faults.tryConfig: {e}")))?;
        }
        let kube = Arc::new(
            KubeTwin::start_with_limits(
                clock.clone(),
                seed,
                kube::Behaviour::default(),
                cfg.net,
                state_dir,
            )
            .await?,
        );
        place_replicas(&kube, folder, fqdn);
        stamp_bootstrap_ownership(&talos, &kube);
        talos.set_admin_kubeconfig(admin_kubeconfig(folder.cluster.name(), &kube));
        kube.set_fault_hook(Arc::new(TwinFaults {
            talos: talos.clone(),
            webhooks: github.as_ref().map(|g| g.webhook_faults()),
        }));
        let mut twin = Twin {
            clock,
            talos,
            kube,
            github,
            github_repo,
            state_dir: state_dir.to_path_buf(),
            seen: Arc::new(Mutex::new(BTreeMap::new())),
            fqdn: cfg.register_with_fqdn.clone(),
            projector: None,
            projector_wakeups: Arc::new(AtomicU64::new(0)),
        };
        twin.project();
        twin.projector = Some(twin.spawn_projector());
        Ok(twin)
    }

    /// Keep projecting on every Talos model change (the background half of the twin; tests
    /// may also call [`Twin::advance`], which projects synchronously). Reading the model
    /// does not count as a change, so the projector sleeps while nothing happens.
    fn spawn_projector(&self) -> JoinHandle<()> {
        let mut changes = self.talos.changes();
        let seen = self.seen.clone();
        let talos = self.talos.clone();
        let kube = self.kube.clone();
        let wakeups = self.projector_wakeups.clone();
        let fqdn = self.fqdn.clone();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                wakeups.fetch_add(1, Ordering::Relaxed);
                project_into(&seen, &talos, &kube, fqdn.as_ref());
            }
        })
    }

    /// How often the background tasks woke up so far.
    pub fn wakeups(&self) -> Wakeups {
        Wakeups {
            projector: self.projector_wakeups.load(Ordering::Relaxed),
            talos: self.talos.driver_wakeups(),
            kube: self.kube.driver_wakeups(),
        }
    }

    /// Carry the Talos side's current state into Kubernetes.
    pub fn project(&self) {
        self.talos.sync();
        project_into(&self.seen, &self.talos, &self.kube, self.fqdn.as_ref());
    }

    /// Manual clock: move time forward by `d`, stopping at every moment either side has
    /// something due, so every event applies in order. Deterministic: no task scheduling
    /// is involved.
    pub fn advance(&self, d: Duration) {
        let end = self.clock.now().plus(d);
        loop {
            let talos_due = self.talos.next_due();
            let kube_due = self.kube.with(|c, _| c.next_due());
            let next = [talos_due, kube_due, Some(end)]
                .into_iter()
                .flatten()
                .filter(|t| *t > self.clock.now())
                .min()
                .unwrap_or(end)
                .min(end);
            self.clock.advance_to(next);
            self.project();
            self.kube.sync();
            if next >= end {
                break;
            }
        }
    }

    /// Manual clock: keep time moving for a client that waits on the same clock (the
    /// demo's engine, a test's), forever. Each tick goes to the next moment anyone sleeps
    /// until (at least 1 ms, at most `max_step`), so a wait of hours for a maintenance
    /// window costs a few ticks while a reboot is still watched every few seconds.
    ///
    /// Time moves only while the clock is quiet ([`Clock::quiet`]): no request in flight
    /// (ichor's Talos calls count from send to answer, the Kubernetes and GitHub twins count
    /// while they work on one) but the ones a handler parks on the clock. A request answered
    /// in a millisecond of a loaded machine's wall time must not take 30 simulated seconds:
    /// a real node answers within its own second. A request unanswered for
    /// [`UNANSWERED`] of wall time lets one tick through, so a wait nobody marked parked
    /// slows a run down instead of stopping it. `after_tick` runs after each tick (an
    /// invariant checker).
    pub async fn drive(&self, max_step: Duration, mut after_tick: impl FnMut()) {
        let min_step = Duration::from_millis(1);
        let mut unquiet_since: Option<std::time::Instant> = None;
        loop {
            tokio::task::yield_now().await;
            // Let the other side's requests arrive and be answered before time moves.
            tokio::time::sleep(Duration::from_millis(1)).await;
            if !self.clock.quiet() {
                let since = *unquiet_since.get_or_insert_with(std::time::Instant::now);
                let left = UNANSWERED.saturating_sub(since.elapsed());
                // Woken by the answer itself, not on the next poll: a rehearsal's wall time
                // is mostly these waits.
                if tokio::time::timeout(left, self.clock.until_quiet())
                    .await
                    .is_ok()
                {
                    // An answer often leads straight to the next request of a chain (a
                    // look's reads): give its caller a turn to send it before time moves.
                    for _ in 0..ANSWER_TURNS {
                        tokio::task::yield_now().await;
                    }
                    if !self.clock.quiet() {
                        continue;
                    }
                } else {
                    tracing::debug!(
                        "a request unanswered for {UNANSWERED:?} of wall time: one tick"
                    );
                }
            }
            unquiet_since = None;
            let now = self.clock.now();
            let step = self
                .clock
                .next_wakeup()
                .map(|t| t.since(now))
                .unwrap_or(max_step)
                .clamp(min_step, max_step);
            self.advance(step);
            after_tick();
        }
    }

    /// The Node name of the machine `hostname` (Talos's side names machines by hostname).
    pub fn node_name(&self, hostname: &str) -> String {
        node_name(hostname, self.fqdn.as_ref())
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kube.kubeconfig
    }

    pub fn talosconfig(&self) -> &Path {
        self.talos.talosconfig_path()
    }

    pub async fn shutdown(mut self) {
        if let Some(p) = self.projector.take() {
            p.abort();
        }
        if let Some(gh) = self.github.take() {
            gh.shutdown().await;
        }
        // Dropping the Talos and Kubernetes twins stops their endpoints.
    }
}

/// How long (wall time) a request may hold [`Twin::drive`]'s clock still before one tick
/// goes through anyway.
pub const UNANSWERED: Duration = Duration::from_secs(1);

/// Turns [`Twin::drive`] gives an answered caller to send its next request before time
/// moves.
const ANSWER_TURNS: usize = 3;

impl Drop for Twin {
    fn drop(&mut self) {
        if let Some(p) = self.projector.take() {
            p.abort();
        }
    }
}

/// `POST /_twin/faults` for the Talos side and the GitHub emulator.
struct TwinFaults {
    talos: Arc<TalosTwin>,
    webhooks: Option<crate::sim::github::WebhookFaults>,
}

impl FaultHook for TwinFaults {
    fn nodes(&self) -> std::collections::BTreeSet<String> {
        // A read: it must not count as a change of the Talos side.
        self.talos.observe().into_iter().map(|o| o.name).collect()
    }

    fn control_planes(&self) -> std::collections::BTreeSet<String> {
        self.talos
            .observe()
            .into_iter()
            .filter(|o| o.role == talos::Role::ControlPlane)
            .map(|o| o.name)
            .collect()
    }

    fn github(&self) -> bool {
        self.webhooks.is_some()
    }

    fn apply(&self, f: &FaultsConfig, given: &std::collections::BTreeSet<String>) {
        if FaultsConfig::touches_talos(given) {
            self.talos.with_model(|m| {
                if given.contains("nodesNeverReturn") {
                    let list = &f.nodes_never_return;
                    let held: Vec<String> = m.faults.never_return.iter().cloned().collect();
                    for n in held.iter().filter(|n| !list.contains(n)) {
                        m.set_never_return(n, false);
                    }
                    for n in list {
                        m.set_never_return(n, true);
                    }
                }
                if given.contains("slowApply") {
                    let map = &f.slow_apply;
                    let slow: Vec<String> = m.faults.slow_apply.keys().cloned().collect();
                    for n in slow {
                        m.set_slow_apply(&n, None);
                    }
                    for (n, d) in map {
                        m.set_slow_apply(n, Some(d.0));
                    }
                }
                if given.contains("slowInstallerPull") {
                    m.faults.slow_installer_pull = f
                        .slow_installer_pull
                        .iter()
                        .map(|(n, d)| (n.clone(), d.0))
                        .collect();
                }
                if given.contains("failingImages") {
                    m.faults.failing_images = f.failing_images.iter().cloned().collect();
                }
                if given.contains("etcdUnhealthy") {
                    let list = &f.etcd_unhealthy;
                    let held: Vec<String> = m.faults.etcd_unhealthy.iter().cloned().collect();
                    for n in held.iter().filter(|n| !list.contains(n)) {
                        m.set_etcd_unhealthy(n, false);
                    }
                    for n in list {
                        m.set_etcd_unhealthy(n, true);
                    }
                }
                if given.contains("installerExitCode") {
                    m.faults.installer_exit_code.clear();
                    for (n, c) in &f.installer_exit_code {
                        m.set_installer_exit_code(n, Some(i32::try_from(*c).unwrap_or(1)));
                    }
                }
                if given.contains("stagedConfig") {
                    // Validated paths; a value the config loader refuses leaves it unstaged.
                    let _ = stage_all(m, &f.staged_config);
                }
                if given.contains("etcdCatchUp") {
                    // From each node's next boot on.
                    m.faults.etcd_catch_up = f
                        .etcd_catch_up
                        .iter()
                        .map(|(n, d)| (n.clone(), d.0))
                        .collect();
                }
                if given.contains("tryConfig") {
                    // Validated paths; a value the node refuses leaves nothing tried.
                    let _ = try_all(m, &f.try_config, f.try_timeout.map(|d| d.0));
                }
                if given.contains("etcdStaleMembers") {
                    let list = &f.etcd_stale_members;
                    let held: Vec<String> = m.faults.etcd_stale_members.iter().cloned().collect();
                    for h in held.iter().filter(|h| !list.contains(h)) {
                        m.set_etcd_stale_member(h, false);
                    }
                    for h in list {
                        m.set_etcd_stale_member(h, true);
                    }
                }
                if given.contains("wrongVersion") {
                    m.faults.wrong_version.clear();
                    for (n, v) in &f.wrong_version {
                        // Validated: a version tag.
                        if let Ok(tag) = crate::sim::faults::talos_tag(v) {
                            m.set_wrong_version(n, Some(&tag));
                        }
                    }
                }
            });
        }
        if let (true, Some(w)) = (given.contains("droppedWebhooks"), &self.webhooks) {
            w.drop_next(u32::try_from(f.dropped_webhooks).unwrap_or(u32::MAX));
        }
    }
}

/// Talos's bootstrap created each object of its manifests with
/// `Create(…, CreateOptions{FieldManager: "talos"})` (siderolabs/talos@032c99a0:internal/app/
/// machined/pkg/controllers/k8s/manifest_apply.go `apply`): a `talos`/Update entry owning the
/// fields the manifest sets. Every seeded object a control plane's manifests name gets one.
fn stamp_bootstrap_ownership(talos: &TalosTwin, kube: &KubeTwin) {
    let texts: Vec<String> = talos.read(|m| {
        (0..m.nodes().len())
            .find(|&i| m.node(i).is_control_plane())
            .map(|i| {
                talos::bootstrap_manifests(m, i)
                    .into_iter()
                    .map(|(_, y)| y)
                    .collect()
            })
            .unwrap_or_default()
    });
    let objects: Vec<serde_json::Value> = texts
        .iter()
        .filter_map(|y| serde_yaml::from_str::<serde_json::Value>(y).ok())
        .flat_map(|v| match v {
            serde_json::Value::Array(items) => items,
            one => vec![one],
        })
        .collect();
    kube.with(|c, now| {
        c.batch(now, |c| {
            for o in &objects {
                let text = |p: &str| o.pointer(p).and_then(|v| v.as_str()).unwrap_or("");
                let api_version = text("/apiVersion");
                let Some(rt) = kube::resources::by_kind(api_version, text("/kind")) else {
                    continue;
                };
                let ns = if rt.namespaced {
                    text("/metadata/namespace")
                } else {
                    ""
                };
                let Some(mut live) = c.get(rt.plural, ns, text("/metadata/name")) else {
                    continue;
                };
                let seeded = kube::apply::leaves(&live);
                let owned: Vec<Vec<String>> = kube::apply::leaves(o)
                    .into_iter()
                    .filter(|p| seeded.contains(p))
                    .collect();
                live["metadata"]["managedFields"] = json!([{
                    "manager": "talos", "operation": "Update", "apiVersion": api_version,
                    "time": now.rfc3339(), "fieldsType": "FieldsV1",
                    "fieldsV1": kube::apply::fields_v1(&owned)}]);
                if let Some(m) = live.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                    m.remove("resourceVersion");
                }
                let _ = c.upsert(live, now);
            }
        })
    });
}

/// Put the Longhorn replicas on the nodes the inventory names (the seed spreads them
/// round-robin).
fn place_replicas(kube: &KubeTwin, folder: &ClusterFolder, fqdn: Option<&RegisterWithFqdn>) {
    if folder.cluster.spec.volumes.provider != VolumeProvider::Longhorn {
        return;
    }
    let mut holders = volume_holders(folder);
    for nodes in holders.values_mut() {
        for n in nodes.iter_mut() {
            *n = node_name(n, fqdn);
        }
    }
    kube.with(|c, now| c.batch(now, |c| place(c, now, &holders)));
}

fn place(c: &mut kube::Cluster, now: Timestamp, holders: &BTreeMap<String, Vec<String>>) {
    for r in c.list("replicas", Some("longhorn-system")) {
        let name = r
            .pointer("/metadata/name")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let _ = c.delete("replicas", "longhorn-system", &name, now);
    }
    for (volume, nodes) in holders {
        for (i, node) in nodes.iter().enumerate() {
            let _ = c.upsert(
                kube::model::replica_object(
                    "longhorn-system",
                    volume,
                    &format!("{volume}-r-{i}"),
                    node,
                    now,
                ),
                now,
            );
        }
    }
}

impl Seen {
    /// Whether projecting `n` now would find this (what the projection compares), without
    /// copying anything: an unchanged node costs a few comparisons.
    fn matches(&self, n: &talos::Node) -> bool {
        let upgrading = n.up && n.stage == talos::Stage::Upgrading;
        self.up == n.up
            && self.ready == (n.ready() || upgrading)
            && self.upgrading == upgrading
            && self.config_version == n.config_version
            && self.boot_id == n.boot_id
            && self.talos_version == n.talos_version
            && self.kubelet_version == n.kubelet.version
            && self.static_pods.len() == n.static_pods.len()
            && self
                .static_pods
                .iter()
                .zip(&n.static_pods)
                .all(|((c, image, ready), p)| {
                    c.as_str() == p.component.name() && *image == p.image && *ready == p.ready
                })
    }
}

fn project_into(
    seen: &Mutex<BTreeMap<String, Seen>>,
    talos: &TalosTwin,
    kube: &KubeTwin,
    fqdn: Option<&RegisterWithFqdn>,
) {
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    // Observed under the lock: the background projector and `advance` never write an
    // older view of the machines over a newer one (a rebooted node Ready again). Only the
    // nodes that differ from what was last projected are copied out.
    let (observations, apiserver_up, any_cp) = talos.read(|m| {
        // The API is served while some control plane runs a Ready kube-apiserver (its
        // static pod); a single control plane's reboot, or its apiserver's restart, is an
        // outage.
        let apiserver_up = m.nodes().iter().any(|n| {
            n.role == talos::Role::ControlPlane
                && n.up
                && n.static_pods
                    .iter()
                    .any(|p| p.component == talos::Component::ApiServer && p.ready)
        });
        let any_cp = m
            .nodes()
            .iter()
            .any(|n| n.role == talos::Role::ControlPlane);
        let changed = m.observe_nodes(|n| seen.get(&n.name).is_none_or(|s| !s.matches(n)));
        (changed, apiserver_up, any_cp)
    });
    let observations = observations.as_slice();
    kube.with(|c, now| {
        c.apiserver_down = any_cp && !apiserver_up;
        c.batch(now, |c| {
            for o in observations {
                let upgrading = o.up && o.stage == talos::Stage::Upgrading;
                let next = Seen {
                    up: o.up,
                    // Until the upgrade sequence stops it, the kubelet keeps posting Ready.
                    ready: o.ready || upgrading,
                    boot_id: o.boot_id.clone(),
                    talos_version: o.talos_version.clone(),
                    kubelet_version: o.kubelet_version.clone(),
                    static_pods: o
                        .static_pods
                        .iter()
                        .map(|p| (p.component.name().to_string(), p.image.clone(), p.ready))
                        .collect(),
                    config_version: o.config_version,
                    upgrading,
                };
                // The first time, compare with what the Kubernetes side was seeded with.
                let node = node_name(&o.name, fqdn);
                let prev = match seen.get(&o.name) {
                    Some(p) => p.clone(),
                    None => seeded(c, &node),
                };
                if prev == next {
                    continue;
                }
                // Talos's legacy upgrade sequence cordons and drains the node first; its
                // evictions blocked by a budget are retried until the node goes down.
                if next.upgrading || (prev.upgrading && !o.up) {
                    talos_drain(c, &node, now);
                }
                if prev.up && !o.up {
                    let _ = c.node_down(&node, now);
                } else if prev.ready != next.ready {
                    let _ = c.set_node_ready(&node, next.ready, now);
                    if next.ready {
                        talos_uncordon(c, &node, now);
                    }
                }
                if prev.kubelet_version != o.kubelet_version {
                    let _ = c.set_kubelet_version(&node, &o.kubelet_version, now);
                }
                if prev.talos_version != o.talos_version {
                    let _ = c.set_os_image(&node, &format!("Talos ({})", o.talos_version), now);
                }
                if prev.boot_id != o.boot_id {
                    set_boot_id(c, &node, &o.boot_id, now);
                }
                if prev.static_pods != next.static_pods
                    || prev.config_version != next.config_version
                {
                    // Talos stamps the mirror pod with the config version that produced it.
                    for (component, image, ready) in &next.static_pods {
                        let _ = c.upsert_mirror_pod(
                            &node,
                            component,
                            image,
                            &next.config_version.to_string(),
                            *ready,
                            now,
                        );
                    }
                }
                seen.insert(o.name.clone(), next);
            }
        })
    });
}

/// What the Kubernetes objects of `node` say before the first projection.
fn seeded(c: &kube::Cluster, node: &str) -> Seen {
    let n = c.get("nodes", "", node).unwrap_or_default();
    let text = |ptr: &str| {
        n.pointer(ptr)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let ready = n
        .pointer("/status/conditions")
        .and_then(|v| v.as_array())
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .is_some_and(|c| c["status"] == "True");
    let talos_version = text("/status/nodeInfo/osImage")
        .trim_start_matches("Talos (")
        .trim_end_matches(')')
        .to_string();
    Seen {
        up: true,
        ready,
        boot_id: text("/status/nodeInfo/bootID"),
        talos_version,
        kubelet_version: text("/status/nodeInfo/kubeletVersion"),
        // Mirror pods are always written once, with Talos's image and config version.
        static_pods: Vec::new(),
        config_version: 0,
        upgrading: false,
    }
}

/// What Talos's upgrade sequence does to its own node (`CordonAndDrainNode`): cordon it,
/// then evict every pod on it but mirror and DaemonSet pods through the Eviction API, so
/// PodDisruptionBudgets hold; a blocked eviction stays for the next attempt.
fn talos_drain(c: &mut kube::Cluster, node: &str, now: Timestamp) {
    let Some(mut n) = c.get("nodes", "", node) else {
        return;
    };
    // Talos marks a cordon it made, so that at boot it lifts only its own; a node someone
    // else cordoned stays theirs.
    if n.pointer("/spec/unschedulable") != Some(&json!(true)) {
        n["spec"]["unschedulable"] = json!(true);
        n["metadata"]["annotations"][TALOS_CORDONED] = json!("true");
        if let Some(m) = n.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            m.remove("resourceVersion");
        }
        let _ = c.upsert(n, now);
    }
    for pod in c.pods_on_node(node) {
        let daemon = kube::model::controller_of(&pod).is_some_and(|(kind, _)| kind == "DaemonSet");
        let terminating = pod.pointer("/metadata/deletionTimestamp").is_some();
        if kube::model::is_mirror(&pod) || daemon || terminating {
            continue;
        }
        let ns = pod
            .pointer("/metadata/namespace")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let name = pod
            .pointer("/metadata/name")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                              "metadata": {"name": name, "namespace": ns}});
        let (ns, name) = (ns.to_string(), name.to_string());
        let _ = c.evict(&ns, &name, &eviction, now);
    }
}

/// The annotation Talos puts on a Node it cordoned for an upgrade.
pub const TALOS_CORDONED: &str = "talos.dev/cordoned";

/// Talos's boot sequence (`UncordonNode`): once Ready, lift the cordon Talos made itself.
fn talos_uncordon(c: &mut kube::Cluster, node: &str, now: Timestamp) {
    let Some(mut n) = c.get("nodes", "", node) else {
        return;
    };
    let Some(annotations) = n
        .pointer_mut("/metadata/annotations")
        .and_then(|a| a.as_object_mut())
    else {
        return;
    };
    if annotations.remove(TALOS_CORDONED).is_none() {
        return;
    }
    if let Some(spec) = n.get_mut("spec").and_then(|s| s.as_object_mut()) {
        spec.remove("unschedulable");
    }
    if let Some(m) = n.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        m.remove("resourceVersion");
    }
    let _ = c.upsert(n, now);
}

fn set_boot_id(c: &mut kube::Cluster, node: &str, boot_id: &str, now: Timestamp) {
    if let Some(mut n) = c.get("nodes", "", node) {
        n["status"]["nodeInfo"]["bootID"] = json!(boot_id);
        if let Some(m) = n.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            m.remove("resourceVersion");
        }
        let _ = c.upsert(n, now);
    }
}
