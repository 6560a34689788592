//! The simulated Talos nodes: plain data plus methods that take the current `Timestamp`.
//!
//! Everything that happens later (a node going down, coming back, a static pod turning
//! Ready) is a `(time, event)` entry in one queue; [`TalosCluster::sync`] applies every due
//! entry in time order (ties in scheduling order), so a test that moves a manual clock sees
//! the same sequence every run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use crate::clock::Timestamp;

use super::config::{
    image_version, parse_version, upgradeable_from, Component, ConfigError, ConfigForm,
    MachineConfig,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    ControlPlane,
    Worker,
}

/// What the twin needs to create one node. The integration maps the user's Cluster
/// inventory onto it.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub role: Role,
    /// The simulated address (what `node` metadata and talosconfig `nodes` use).
    pub ip: IpAddr,
    /// Talos version tag, e.g. `v1.13.2`; decides the API generation the node exposes.
    pub talos_version: String,
    /// Kubernetes version of the control-plane (and kube-proxy) images, e.g. `v1.33.1`.
    pub kubernetes_version: String,
    /// Version of the kubelet image, e.g. `v1.33.1` (may trail the control plane mid-upgrade).
    pub kubelet_version: String,
    pub config_form: ConfigForm,
}

/// Simulated durations.
#[derive(Clone, Debug)]
pub struct Timings {
    /// Legacy MachineService/Upgrade: from the request to the node going down.
    pub upgrade: Duration,
    /// From going down to being back up (Running and ready).
    pub reboot: Duration,
    /// LifecycleService/Upgrade: writing the new version to disk.
    pub install: Duration,
    /// A static pod restarted by an image change is not Ready for this long.
    pub static_pod_restart: Duration,
    /// The kubelet restarted by an image change is unhealthy for this long.
    pub kubelet_restart: Duration,
    /// A component that starts on an image missing from its own store pulls it first.
    pub image_pull: Duration,
    /// The legacy MachineService/Upgrade pulls its installer into the system containerd
    /// inside the call, before it answers (`installerPull`).
    pub installer_pull: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            upgrade: Duration::from_secs(30),
            reboot: Duration::from_secs(90),
            install: Duration::from_secs(20),
            static_pod_restart: Duration::from_secs(20),
            kubelet_restart: Duration::from_secs(15),
            image_pull: Duration::from_secs(30),
            // The bare Talos twin answers at once; the whole twin (`ichor sim`, `Twin`)
            // takes `timings.installerPull`, 30 s unless configured.
            installer_pull: Duration::ZERO,
        }
    }
}

/// Injectable faults; set at start and changeable at run time.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Nodes that go down and never come back.
    pub never_return: BTreeSet<String>,
    /// Nodes whose ApplyConfiguration blocks this long (on the twin's clock) before acting.
    pub slow_apply: BTreeMap<String, Duration>,
    /// Nodes whose legacy Upgrade pulls its installer this long instead of
    /// `timings.installer_pull` (`slowInstallerPull`).
    pub slow_installer_pull: BTreeMap<String, Duration>,
    /// Image references whose pull fails with NotFound.
    pub failing_images: BTreeSet<String>,
    /// Control planes whose etcd member is cut off from its peers: still a member, but it
    /// knows no leader (EtcdStatus says so in `errors`) and counts as down for quorum.
    pub etcd_unhealthy: BTreeSet<String>,
    /// Hostnames of etcd members with no machine behind them (a control plane replaced and
    /// never removed with `talosctl etcd remove-member`): they stay in the member list,
    /// count toward quorum, and answer nothing.
    pub etcd_stale_members: BTreeSet<String>,
    /// Node → the Talos version its installs boot instead of the one installed.
    pub wrong_version: BTreeMap<String, String>,
    /// Node → the exit code its installer ends with (`installerExitCode`), as 1.14
    /// installers report a class of failure.
    pub installer_exit_code: BTreeMap<String, i32>,
    /// Control plane → how long its etcd member takes to catch up after each boot
    /// (`etcdCatchUp`): the kubelet is Ready at once, the member is out of touch (and
    /// Talos's MachineStatus not ready) until then.
    pub etcd_catch_up: BTreeMap<String, Duration>,
}

/// Errors a node returns; the server maps each to its gRPC code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TalosError {
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Internal(String),
    /// A plain Go error returned by a handler: gRPC's code Unknown.
    #[error("{0}")]
    Unknown(String),
}

impl TalosError {
    /// The error as Go's `%v` prints a gRPC status (how Talos wraps one in another).
    pub fn as_go_status(&self) -> String {
        let (code, m) = match self {
            TalosError::Unavailable(m) => ("Unavailable", m),
            TalosError::NotFound(m) => ("NotFound", m),
            TalosError::InvalidArgument(m) => ("InvalidArgument", m),
            TalosError::Unimplemented(m) => ("Unimplemented", m),
            TalosError::FailedPrecondition(m) => ("FailedPrecondition", m),
            TalosError::Internal(m) => ("Internal", m),
            TalosError::Unknown(m) => ("Unknown", m),
        };
        format!("rpc error: code = {code} desc = {m}")
    }
}

/// `MachineStatusEvent.MachineStage` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Booting = 1,
    Running = 4,
    Rebooting = 5,
    Upgrading = 8,
}

/// One entry of a node's event buffer (Events RPC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineEvent {
    pub id: String,
    pub actor_id: String,
    pub stage: Stage,
    pub ready: bool,
    pub at: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticPod {
    pub component: Component,
    pub image: String,
    pub ready: bool,
    restart: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kubelet {
    pub image: String,
    /// The version the node reports (`kubeletVersion`); changes once the restart completes.
    pub version: String,
    pub healthy: bool,
    restart: u64,
}

/// Where a pulled image lands: a containerd instance (address) and namespace, as
/// siderolabs/talos v1.13.9 internal/app/internal/ctrhelper/ctrhelper.go maps a
/// `common.ContainerdInstance` (driver CONTAINERD → the system containerd, CRI → the CRI
/// containerd; NS_SYSTEM → `system`, NS_CRI → `k8s.io`). Each store is separate: an image
/// pulled into one is not found in another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ImageStore {
    /// The system containerd (`/system/run/containerd`), namespace `system`: talosctl's
    /// `inmem`; in memory, emptied at every boot. The legacy MachineService/Upgrade pulls
    /// its installer here (internal/pkg/install/pull.go, v1.12.11).
    SystemContainerd,
    /// The CRI containerd, namespace `system`: where the kubelet service pulls and runs the
    /// kubelet image (internal/app/machined/pkg/system/services/kubelet.go, v1.13.9) and
    /// where talosctl upgrade pulls the installer by default (`--namespace system`).
    CriSystem,
    /// The CRI containerd, namespace `k8s.io`: the images of pods, static pods included.
    CriK8s,
}

/// The names one pull leaves in a store, as Talos's image.Pull aliases them
/// (internal/pkg/containers/image, `manageAliases`, v1.13.9): the normalized reference, the
/// digest, and `name@digest`; returned is `name@digest` (images.go `Pull`, v1.14.0-rc.1).
pub fn pulled_names(reference: &str) -> Option<(String, Vec<String>)> {
    let normalized = normalize_reference(reference)?;
    let name = match normalized.split_once('@') {
        Some((n, _)) => n.to_string(),
        None => match normalized.rsplit_once(':') {
            Some((n, tag)) if !tag.contains('/') => n.to_string(),
            _ => normalized.clone(),
        },
    };
    let digest = match normalized.split_once('@') {
        Some((_, d)) => d.to_string(),
        None => {
            use sha2::Digest;
            format!(
                "sha256:{}",
                hex::encode(sha2::Sha256::digest(normalized.as_bytes()))
            )
        }
    };
    let pinned = format!("{name}@{digest}");
    let mut names = vec![normalized, digest];
    if !names.contains(&pinned) {
        names.push(pinned.clone());
    }
    Some((pinned, names))
}

/// docker/distribution's ParseDockerRef: a domain is added to a bare name (`docker.io`, and
/// `library/` for a single component), `:latest` to a reference without tag or digest.
fn normalize_reference(reference: &str) -> Option<String> {
    if reference.is_empty() || reference.chars().any(char::is_whitespace) {
        return None;
    }
    let (first, rest) = match reference.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (reference, None),
    };
    let has_domain =
        rest.is_some() && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut out = if has_domain {
        reference.to_string()
    } else if rest.is_some() {
        format!("docker.io/{reference}")
    } else {
        format!("docker.io/library/{reference}")
    };
    let last = out.rsplit('/').next().unwrap_or_default();
    if !last.contains(':') && !out.contains('@') {
        out.push_str(":latest");
    }
    Some(out)
}

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub role: Role,
    pub ip: IpAddr,
    pub talos_version: String,
    pub boot_id: String,
    pub up: bool,
    pub stage: Stage,
    /// Active configuration.
    pub config: MachineConfig,
    /// Configuration on disk: differs from the active one after STAGED or TRY.
    pub persistent_config: MachineConfig,
    /// Whether the COSI `persistent` MachineConfig exists: only once an apply in this boot
    /// persisted something (STAGED, NO_REBOOT, REBOOT). A config read from STATE at boot
    /// is set active and not persisted again (siderolabs/talos@v1.13.9:internal/app/
    /// machined/pkg/controllers/config/acquire.go `Run`: "if the only source is state, we
    /// do not need to persist it"); a TRY sets only the active one.
    pub persistent_resource: bool,
    /// The `persistent` resource's version: 1 when an apply creates it, bumped by each
    /// later one.
    pub persistent_version: u64,
    /// The active configuration's COSI resource version: 1 at boot (the in-memory state
    /// is new and acquire.go creates it once), bumped by every later SetConfig (a TRY, its
    /// rollback, NO_REBOOT) as cosi-project/runtime pkg/state/impl/inmem/collection.go
    /// `Create`/`Update` count.
    pub config_version: u64,
    pub kubelet: Kubelet,
    pub static_pods: Vec<StaticPod>,
    /// Every name in every image store of the node → the reference it was pulled as.
    pub images: BTreeMap<(ImageStore, String), String>,
    /// The boot loader's slots: what each holds, which one boots next, which one this boot
    /// came from.
    pub boot: BootSlots,
    /// An installer runs (LifecycleService/Upgrade): it holds the service's lock until it
    /// exits, whether or not its caller is still there.
    pub installing: bool,
    /// Bumped by every install started or cancelled: an `InstallDone` of an earlier run
    /// is stale.
    pub install_run: u64,
    /// Events since the last boot.
    pub events: Vec<MachineEvent>,
    /// Changes whenever the event buffer is replaced (at boot), so streams know to end.
    pub events_epoch: u64,
    pub etcd_member_id: u64,
    /// The node booted a UKI through systemd-boot (else GRUB, the twin's default), as
    /// `runtime/SecurityStates.talos.dev` `bootedWithUKI` reports it (siderolabs/talos
    /// internal/app/machined/pkg/controllers/runtime/security_state.go, v1.13.9).
    pub booted_with_uki: bool,
    /// Until when this boot's etcd member is still catching up (`etcdCatchUp`).
    pub etcd_catching_up_until: Option<Timestamp>,
    /// Bumped whenever the node goes down; scheduled work for an older value is dropped.
    boot_gen: u64,
    try_token: u64,
}

impl Node {
    /// SetPersistedConfig: the on-disk config and its COSI resource, created or updated.
    fn persist(&mut self, config: MachineConfig) {
        self.persistent_config = config;
        self.persistent_version = if self.persistent_resource {
            self.persistent_version + 1
        } else {
            1
        };
        self.persistent_resource = true;
    }

    pub fn is_control_plane(&self) -> bool {
        self.role == Role::ControlPlane
    }

    /// Running, kubelet healthy: what the Kubernetes Node's Ready condition shows.
    pub fn ready(&self) -> bool {
        self.up && self.stage == Stage::Running && self.kubelet.healthy
    }

    pub fn rebooting(&self) -> bool {
        !self.up
    }

    pub fn kubelet_version(&self) -> &str {
        &self.kubelet.version
    }

    /// API generation: LifecycleService and ImageService exist from 1.13.
    pub fn has_lifecycle_api(&self) -> bool {
        matches!(parse_version(&self.talos_version), Some((major, minor, _)) if major > 1 || minor >= 13)
    }

    /// Talos minor version (1.x).
    pub fn minor(&self) -> u64 {
        parse_version(&self.talos_version).map_or(0, |(_, m, _)| m)
    }

    /// The etcd version a control plane runs when its configuration pins
    /// `.cluster.etcd.image` (upstream runs that image: v1alpha1_etcdconfig.go `Image`,
    /// v1.13.9); `None` runs the release's default.
    pub fn pinned_etcd_version(&self) -> Option<String> {
        let image = self.config.etcd_image()?;
        let no_digest = image.split('@').next().unwrap_or(&image);
        let (_, tag) = no_digest.rsplit_once(':')?;
        let tag = tag.strip_prefix('v').unwrap_or(tag);
        let (major, minor, patch) = parse_version(tag)?;
        Some(format!("{major}.{minor}.{patch}"))
    }

    pub fn static_pod(&self, c: Component) -> Option<&StaticPod> {
        self.static_pods.iter().find(|p| p.component == c)
    }

    /// The version the next boot starts when an install since this boot changed it.
    pub fn installed_version(&self) -> Option<String> {
        if !self.boot.written {
            return None;
        }
        self.boot.slots[self.boot.default].clone()
    }
}

/// Which boot loader a node boots with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Bootloader {
    #[default]
    Grub,
    SdBoot,
}

/// A node's two boot slots (GRUB's labels A and B; sd-boot's UKIs on the ESP, of which an
/// upgrade leaves at most two) with upstream's switching rules. Neither loader picks the
/// slot to write from the one running:
/// - GRUB flips from grub.cfg's `Default` and writes the new kernel there
///   (siderolabs/talos@main:internal/app/machined/pkg/runtime/v1alpha1/bootloader/grub/
///   upgrade.go `Upgrade` → boot_label.go `flip`, install.go `copyAssets`): a second install
///   on one boot overwrites the running slot, so both hold the target.
///   The node then has no version to fall back to (machined/revert.go).
/// - sd-boot (siderolabs/talos internal/app/machined/pkg/runtime/v1alpha1/bootloader/sdboot/
///   sdboot.go at 06023fd1898a: `Probe` takes the booted entry, `LoaderEntrySelected`, as
///   its default; `install` removes every UKI but that one, writes the new one and makes it
///   `LoaderEntryDefault`): a second install on one boot keeps the booted UKI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootSlots {
    pub loader: Bootloader,
    /// The Talos version each slot holds (`None`: empty).
    pub slots: [Option<String>; 2],
    /// The slot the next boot starts (grub.cfg `Default`, sd-boot `LoaderEntryDefault`).
    pub default: usize,
    /// The slot this boot started from.
    pub booted: usize,
    /// An install wrote a slot since this boot.
    pub written: bool,
}

impl BootSlots {
    fn new(version: &str) -> BootSlots {
        BootSlots {
            loader: Bootloader::Grub,
            slots: [Some(version.to_string()), None],
            default: 0,
            booted: 0,
            written: false,
        }
    }

    /// The installer writes `version` and makes it the default, by the loader's rule.
    fn install(&mut self, version: &str) {
        self.written = true;
        let other = 1 - self.default;
        match self.loader {
            Bootloader::Grub => {
                self.slots[other] = Some(version.to_string());
                self.default = other;
            }
            Bootloader::SdBoot => {
                let booted = self.booted;
                if self.slots[booted].as_deref() == Some(version) {
                    // The booted UKI is this version: rewritten in place, the other deleted.
                    self.slots[1 - booted] = None;
                    self.default = booted;
                } else {
                    self.slots[1 - booted] = Some(version.to_string());
                    self.default = 1 - booted;
                }
            }
        }
    }

    /// The version a failed boot of the default slot falls back to: the other slot's.
    pub fn fallback(&self) -> Option<&str> {
        self.slots[1 - self.default].as_deref()
    }
}

/// A node's observable state at one instant (plain data, for the Kubernetes projection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeObservation {
    pub name: String,
    pub role: Role,
    pub ip: IpAddr,
    /// Reachable (not rebooting).
    pub up: bool,
    /// Running with a healthy kubelet: the Kubernetes Node's Ready condition.
    pub ready: bool,
    pub stage: Stage,
    /// Changes at every boot.
    pub boot_id: String,
    pub talos_version: String,
    pub kubelet_image: String,
    pub kubelet_version: String,
    /// kube-apiserver, kube-controller-manager, kube-scheduler (control planes only).
    pub static_pods: Vec<StaticPod>,
    pub etcd_member: bool,
    pub etcd_leader: bool,
    /// Bumped on every applied configuration (and at boot); mirror pods carry it as
    /// `talos.dev/config-version`.
    pub config_version: u64,
}

/// Result of an ApplyConfiguration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyOutcome {
    pub mode: ApplyMode,
    pub mode_details: String,
    pub warnings: Vec<String>,
}

/// `ApplyConfigurationRequest.Mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyMode {
    Reboot = 0,
    Auto = 1,
    NoReboot = 2,
    Staged = 3,
    Try = 4,
}

impl ApplyMode {
    pub fn from_i32(v: i32) -> Option<Self> {
        Some(match v {
            0 => ApplyMode::Reboot,
            1 => ApplyMode::Auto,
            2 => ApplyMode::NoReboot,
            3 => ApplyMode::Staged,
            4 => ApplyMode::Try,
            _ => return None,
        })
    }
}

/// An etcd member as the member list shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdMemberView {
    pub id: u64,
    pub hostname: String,
    pub ip: IpAddr,
}

#[derive(Clone, Debug, PartialEq)]
enum Scheduled {
    /// The `etcdCatchUp` member of this boot is in touch again.
    EtcdCaughtUp {
        node: usize,
        gen: u64,
    },
    GoDown {
        node: usize,
        gen: u64,
    },
    Return {
        node: usize,
        gen: u64,
    },
    StaticPodReady {
        node: usize,
        gen: u64,
        component: Component,
        restart: u64,
    },
    KubeletReady {
        node: usize,
        gen: u64,
        restart: u64,
        version: String,
    },
    InstallDone {
        node: usize,
        gen: u64,
        run: u64,
        version: String,
    },
    TryRollback {
        node: usize,
        gen: u64,
        token: u64,
        config: Box<MachineConfig>,
    },
}

/// The simulated Talos side of a cluster.
#[derive(Debug)]
pub struct TalosCluster {
    nodes: Vec<Node>,
    pub timings: Timings,
    pub faults: Faults,
    queue: BTreeMap<(Timestamp, u64), Scheduled>,
    seq: u64,
    now: Timestamp,
    etcd_leader: Option<usize>,
    raft_term: u64,
    counter: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("node {0:?} is defined twice")]
    DuplicateNode(String),
    #[error("node {node}: {source}")]
    Config {
        node: String,
        source: Box<ConfigError>,
    },
    #[error("node {0}: Talos version {1:?} is not a version tag like v1.13.2")]
    BadVersion(String, String),
}

pub(crate) fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn new_uuid() -> String {
    let b: [u8; 16] = rand::random();
    let h = hex::encode(b);
    // Version 4, RFC 4122 variant.
    format!(
        "{}-{}-4{}-{:x}{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        (b[8] & 0x3) | 0x8,
        &h[17..20],
        &h[20..32]
    )
}

/// An id shaped like an xid (20 base32hex characters: time, machine, counter).
fn xid(at: Timestamp, node: &str, counter: u64) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghijklmnopqrstuv";
    let mut raw = [0u8; 12];
    raw[..4].copy_from_slice(&((at.as_millis() / 1000) as u32).to_be_bytes());
    raw[4..9].copy_from_slice(&fnv1a(node).to_be_bytes()[..5]);
    raw[9..].copy_from_slice(&(counter as u32).to_be_bytes()[1..]);
    let mut bits: u128 = 0;
    for b in raw {
        bits = (bits << 8) | b as u128;
    }
    // 96 bits → 20 characters of 5 bits (padded with 4 zero bits).
    bits <<= 4;
    (0..20)
        .rev()
        .map(|i| ALPHABET[((bits >> (i * 5)) & 0x1f) as usize] as char)
        .collect()
}

fn normalize_tag(v: &str) -> String {
    if v.starts_with('v') {
        v.to_string()
    } else {
        format!("v{v}")
    }
}

impl TalosCluster {
    pub fn new(
        specs: &[NodeSpec],
        timings: Timings,
        faults: Faults,
        now: Timestamp,
    ) -> Result<Self, ModelError> {
        let mut nodes: Vec<Node> = Vec::new();
        for spec in specs {
            if nodes.iter().any(|n| n.name == spec.name) {
                return Err(ModelError::DuplicateNode(spec.name.clone()));
            }
            let talos = normalize_tag(&spec.talos_version);
            let spec_talos = talos.clone();
            if parse_version(&talos).is_none() {
                return Err(ModelError::BadVersion(spec.name.clone(), talos));
            }
            let k8s = normalize_tag(&spec.kubernetes_version);
            let kubelet = normalize_tag(&spec.kubelet_version);
            let text = MachineConfig::generate(
                &spec.name,
                spec.role == Role::ControlPlane,
                &talos,
                &k8s,
                &kubelet,
                spec.config_form,
            );
            let config = MachineConfig::parse(text.as_bytes(), &talos).map_err(|source| {
                ModelError::Config {
                    node: spec.name.clone(),
                    source: Box::new(source),
                }
            })?;
            let kubelet_image = config.image(Component::Kubelet).unwrap_or_default();
            let static_pods = if spec.role == Role::ControlPlane {
                Component::STATIC_PODS
                    .iter()
                    .map(|c| StaticPod {
                        component: *c,
                        image: config.image(*c).unwrap_or_default(),
                        ready: true,
                        restart: 0,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            nodes.push(Node {
                name: spec.name.clone(),
                role: spec.role,
                ip: spec.ip,
                talos_version: talos,
                boot_id: new_uuid(),
                up: true,
                stage: Stage::Running,
                persistent_config: config.clone(),
                persistent_resource: false,
                persistent_version: 0,
                config,
                config_version: 1,
                kubelet: Kubelet {
                    version: image_version(&kubelet_image).unwrap_or(kubelet),
                    image: kubelet_image,
                    healthy: true,
                    restart: 0,
                },
                static_pods,
                images: BTreeMap::new(),
                boot: BootSlots::new(&spec_talos),
                installing: false,
                install_run: 0,
                events: Vec::new(),
                events_epoch: 0,
                etcd_member_id: fnv1a(&spec.name),
                booted_with_uki: false,
                etcd_catching_up_until: None,
                boot_gen: 0,
                try_token: 0,
            });
        }
        let mut cluster = TalosCluster {
            nodes,
            timings,
            faults,
            queue: BTreeMap::new(),
            seq: 0,
            now,
            etcd_leader: None,
            raft_term: 1,
            counter: 0,
        };
        for i in 0..cluster.nodes.len() {
            cluster.boot_events(i);
        }
        cluster.elect_leader();
        Ok(cluster)
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// A node by name or simulated IP, as the `node` metadata names it.
    pub fn find(&self, name_or_ip: &str) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.name == name_or_ip || n.ip.to_string() == name_or_ip)
    }

    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index]
    }

    pub fn node_by_name(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// When the next scheduled event is due, if any.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.queue.keys().next().map(|(t, _)| *t)
    }

    fn schedule(&mut self, at: Timestamp, what: Scheduled) {
        self.seq += 1;
        self.queue.insert((at, self.seq), what);
    }

    /// Applies every scheduled event due at or before `now`, in order. Time never moves
    /// backwards: an earlier `now` is ignored.
    /// Returns how many events were applied.
    pub fn sync(&mut self, now: Timestamp) -> usize {
        let mut applied = 0;
        while let Some(entry) = self.queue.first_entry() {
            let (at, _) = *entry.key();
            if at > now {
                break;
            }
            let what = entry.remove();
            self.now = self.now.max(at);
            self.apply(what);
            applied += 1;
        }
        self.now = self.now.max(now);
        applied
    }

    /// Same as [`TalosCluster::sync`].
    pub fn advance_to(&mut self, now: Timestamp) -> usize {
        self.sync(now)
    }

    /// The observable state of every node, for the Kubernetes projection (Node Ready,
    /// kubeletVersion, mirror pods of the static pods, pods lost when a node goes down).
    pub fn observe(&self) -> Vec<NodeObservation> {
        self.observe_nodes(|_| true)
    }

    /// [`TalosCluster::observe`] of just the nodes `which` picks, so a caller that knows
    /// what it saw last copies only what changed.
    pub fn observe_nodes(&self, mut which: impl FnMut(&Node) -> bool) -> Vec<NodeObservation> {
        let members: BTreeSet<u64> = self.etcd_members().iter().map(|m| m.id).collect();
        self.nodes
            .iter()
            .filter(|&n| which(n))
            .map(|n| NodeObservation {
                name: n.name.clone(),
                role: n.role,
                ip: n.ip,
                up: n.up,
                ready: n.ready(),
                stage: n.stage,
                boot_id: n.boot_id.clone(),
                talos_version: n.talos_version.clone(),
                kubelet_image: n.kubelet.image.clone(),
                kubelet_version: n.kubelet.version.clone(),
                static_pods: n.static_pods.clone(),
                etcd_member: members.contains(&n.etcd_member_id) && n.is_control_plane(),
                etcd_leader: self.etcd_leader().is_some_and(|l| l == n.name),
                config_version: n.config_version,
            })
            .collect()
    }

    fn apply(&mut self, what: Scheduled) {
        match what {
            Scheduled::GoDown { node, gen } if self.nodes[node].boot_gen == gen => {
                self.go_down(node, String::new());
            }
            Scheduled::Return { node, gen } if self.nodes[node].boot_gen == gen => {
                self.come_back(node);
            }
            Scheduled::StaticPodReady {
                node,
                gen,
                component,
                restart,
            } if self.nodes[node].boot_gen == gen => {
                if let Some(p) = self.nodes[node]
                    .static_pods
                    .iter_mut()
                    .find(|p| p.component == component && p.restart == restart)
                {
                    p.ready = true;
                }
            }
            Scheduled::KubeletReady {
                node,
                gen,
                restart,
                version,
            } if self.nodes[node].boot_gen == gen => {
                let k = &mut self.nodes[node].kubelet;
                if k.restart == restart {
                    k.healthy = true;
                    k.version = version;
                }
            }
            Scheduled::InstallDone {
                node,
                gen,
                run,
                version,
            } if self.nodes[node].boot_gen == gen && self.nodes[node].install_run == run => {
                let n = &mut self.nodes[node];
                n.installing = false;
                n.boot.install(&version);
            }
            Scheduled::EtcdCaughtUp { node, gen } if self.nodes[node].boot_gen == gen => {
                self.nodes[node].etcd_catching_up_until = None;
                self.elect_leader();
            }
            Scheduled::TryRollback {
                node,
                gen,
                token,
                config,
            } if self.nodes[node].boot_gen == gen && self.nodes[node].try_token == token => {
                let now = self.now;
                self.activate_config(node, *config, now);
            }
            _ => {} // stale: the node rebooted or a newer change superseded it
        }
    }

    fn push_event(&mut self, node: usize, stage: Stage, ready: bool, actor_id: &str) {
        self.counter += 1;
        let at = self.now;
        let n = &mut self.nodes[node];
        let id = xid(at, &n.name, self.counter);
        n.events.push(MachineEvent {
            id,
            actor_id: actor_id.to_string(),
            stage,
            ready,
            at,
        });
    }

    fn boot_events(&mut self, node: usize) {
        self.nodes[node].events.clear();
        self.nodes[node].events_epoch += 1;
        self.push_event(node, Stage::Booting, false, "");
        self.push_event(node, Stage::Running, true, "");
    }

    // ---- etcd ----

    fn etcd_total(&self) -> usize {
        self.nodes.iter().filter(|n| n.is_control_plane()).count()
            + self.faults.etcd_stale_members.len()
    }

    fn etcd_up(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].is_control_plane() && self.nodes[*i].up)
            .collect()
    }

    /// Control planes that are up and whose etcd member is in touch with its peers: the
    /// members that count for quorum.
    fn etcd_healthy(&self) -> Vec<usize> {
        self.etcd_up()
            .into_iter()
            // The upgrade sequence stops etcd before it installs (siderolabs/talos v1.12.0
            // v1alpha1_sequencer.go `Upgrade`: "stopServices" before "upgrade").
            .filter(|i| !self.etcd_unhealthy(*i) && self.nodes[*i].stage != Stage::Upgrading)
            .collect()
    }

    /// Whether the `etcdUnhealthy` fault cuts this node's member off, or it is still
    /// catching up after its boot (`etcdCatchUp`).
    pub fn etcd_unhealthy(&self, node: usize) -> bool {
        self.faults.etcd_unhealthy.contains(&self.nodes[node].name)
            || self.nodes[node]
                .etcd_catching_up_until
                .is_some_and(|until| self.now < until)
    }

    /// More than half of the control planes are up and healthy.
    pub fn etcd_has_quorum(&self) -> bool {
        let total = self.etcd_total();
        total > 0 && self.etcd_healthy().len() * 2 > total
    }

    /// Members as the member list shows them: control planes that are up (a rebooting
    /// control plane is missing until it returns).
    pub fn etcd_members(&self) -> Vec<EtcdMemberView> {
        let mut out: Vec<EtcdMemberView> = self
            .etcd_up()
            .into_iter()
            .map(|i| EtcdMemberView {
                id: self.nodes[i].etcd_member_id,
                hostname: self.nodes[i].name.clone(),
                ip: self.nodes[i].ip,
            })
            .collect();
        // A stale member stays listed until someone removes it (etcd's MemberList returns
        // every member of the cluster configuration, started or not: etcd-io/etcd
        // server/etcdserver/api/membership/cluster.go at v3.5.17, `Members`).
        out.extend(
            self.faults
                .etcd_stale_members
                .iter()
                .map(|h| EtcdMemberView {
                    id: fnv1a(h),
                    hostname: h.clone(),
                    // Its old address: nothing listens there any more.
                    ip: IpAddr::from([192, 0, 2, 1]),
                }),
        );
        out
    }

    /// Add (or remove) a stale etcd member; quorum is recounted.
    pub fn set_etcd_stale_member(&mut self, hostname: &str, on: bool) {
        if on {
            self.faults.etcd_stale_members.insert(hostname.to_string());
        } else {
            self.faults.etcd_stale_members.remove(hostname);
        }
        self.elect_leader();
    }

    /// The leader's node name, if etcd has one.
    pub fn etcd_leader(&self) -> Option<&str> {
        self.etcd_leader.map(|i| self.nodes[i].name.as_str())
    }

    pub fn raft_term(&self) -> u64 {
        self.raft_term
    }

    fn elect_leader(&mut self) {
        if let Some(l) = self.etcd_leader {
            if self.nodes[l].up && !self.etcd_unhealthy(l) && self.etcd_has_quorum() {
                return;
            }
        }
        self.etcd_leader = None;
        if self.etcd_has_quorum() {
            self.etcd_leader = self.etcd_healthy().first().copied();
            self.raft_term += 1;
        }
    }

    /// EtcdForfeitLeadership on `node`: the name of the new leader, or "" if `node` was not
    /// the leader.
    pub fn forfeit_leadership(&mut self, node: usize) -> Result<String, TalosError> {
        self.check_etcd(node)?;
        let up = self.etcd_up();
        // siderolabs/talos v1.12.0 internal/pkg/etcd/etcd.go `ForfeitLeadership`: a plain
        // error, so gRPC's Unknown.
        if up.len() < 2 {
            return Err(TalosError::Unknown(
                "cannot forfeit leadership, only one member".into(),
            ));
        }
        if self.etcd_leader != Some(node) {
            return Ok(String::new());
        }
        let next = self.etcd_healthy().into_iter().find(|i| *i != node);
        self.etcd_leader = next;
        self.raft_term += 1;
        Ok(next.map(|i| self.nodes[i].name.clone()).unwrap_or_default())
    }

    /// The errors an etcd call on `node` gets: not a control plane, or no quorum.
    pub fn check_etcd(&self, node: usize) -> Result<(), TalosError> {
        if !self.nodes[node].is_control_plane() {
            return Err(TalosError::Unimplemented(
                "etcd APIs are only available on control plane nodes".into(),
            ));
        }
        if !self.etcd_has_quorum() {
            return Err(TalosError::Unavailable(format!(
                "etcdserver: no leader (quorum lost: {} of {} members healthy)",
                self.etcd_healthy().len(),
                self.etcd_total()
            )));
        }
        Ok(())
    }

    /// What EtcdStatus reports on `node` (a control plane, quorum held): the leader's member
    /// id, 0 when this member knows none, and the member's `errors`. As etcd's maintenance
    /// Status: a member without a leader reports `etcdserver: no leader`.
    pub fn etcd_status(&self, node: usize) -> (u64, Vec<String>) {
        if self.etcd_unhealthy(node) {
            return (0, vec!["etcdserver: no leader".to_string()]);
        }
        let leader = self.etcd_leader.map_or(0, |l| self.nodes[l].etcd_member_id);
        (leader, Vec::new())
    }

    // ---- power ----

    fn go_down(&mut self, node: usize, actor_id: String) {
        if !self.nodes[node].up {
            return;
        }
        self.push_event(node, Stage::Rebooting, false, &actor_id);
        let now = self.now;
        let n = &mut self.nodes[node];
        n.up = false;
        n.stage = Stage::Rebooting;
        n.installing = false;
        // The system containerd keeps its images in memory.
        n.images
            .retain(|(store, _), _| *store != ImageStore::SystemContainerd);
        n.boot_gen += 1;
        n.kubelet.healthy = false;
        for p in &mut n.static_pods {
            p.ready = false;
        }
        let gen = n.boot_gen;
        let never = self.faults.never_return.contains(&n.name);
        self.elect_leader();
        if !never {
            let at = now.plus(self.timings.reboot);
            self.schedule(at, Scheduled::Return { node, gen });
        }
    }

    fn come_back(&mut self, node: usize) {
        if self.faults.never_return.contains(&self.nodes[node].name) {
            return;
        }
        let now = self.now;
        let restart = self.timings.static_pod_restart;
        let wrong = self
            .faults
            .wrong_version
            .get(&self.nodes[node].name)
            .cloned();
        let n = &mut self.nodes[node];
        if let Some(v) = n.installed_version() {
            // The fault: what boots is not what was installed.
            n.talos_version = wrong.unwrap_or(v);
        }
        n.boot.booted = n.boot.default;
        n.boot.written = false;
        n.config = n.persistent_config.clone();
        // A new boot's in-memory state: the active config created once, nothing persisted.
        n.config_version = 1;
        n.persistent_resource = false;
        n.up = true;
        n.stage = Stage::Running;
        n.boot_id = new_uuid();
        n.boot_gen += 1;
        let gen = n.boot_gen;
        n.kubelet.image = n.config.image(Component::Kubelet).unwrap_or_default();
        if let Some(v) = image_version(&n.kubelet.image) {
            n.kubelet.version = v;
        }
        n.kubelet.healthy = true;
        let catch_up = self.faults.etcd_catch_up.get(&n.name).copied();
        n.etcd_catching_up_until = catch_up.map(|d| now.plus(d));
        let mut pods = Vec::new();
        for p in &mut n.static_pods {
            p.image = n.config.image(p.component).unwrap_or_default();
            p.ready = false;
            p.restart += 1;
            pods.push((p.component, p.restart));
        }
        self.boot_events(node);
        self.elect_leader();
        if let Some(d) = catch_up {
            self.schedule(now.plus(d), Scheduled::EtcdCaughtUp { node, gen });
        }
        for (component, r) in pods {
            self.schedule(
                now.plus(restart),
                Scheduled::StaticPodReady {
                    node,
                    gen,
                    component,
                    restart: r,
                },
            );
        }
    }

    /// Whether calls to this node fail because it is down.
    pub fn check_up(&self, node: usize) -> Result<(), TalosError> {
        if self.nodes[node].up {
            Ok(())
        } else {
            Err(TalosError::Unavailable(format!(
                "node {} is not reachable (rebooting)",
                self.nodes[node].name
            )))
        }
    }

    /// Reboot: the node goes down now and returns after `timings.reboot` (unless a fault
    /// keeps it down) with a new boot id. Returns the actor id.
    pub fn reboot(&mut self, node: usize) -> Result<String, TalosError> {
        self.check_up(node)?;
        let actor = new_uuid();
        self.go_down(node, actor.clone());
        Ok(actor)
    }

    /// Legacy MachineService/Upgrade: accepted now; the node goes down after
    /// `timings.upgrade` and returns running the image's version. Returns the actor id.
    pub fn upgrade_legacy(
        &mut self,
        node: usize,
        image: &str,
        force: bool,
    ) -> Result<String, TalosError> {
        self.check_up(node)?;
        let target = self.installer_version(node, image)?;
        if self.faults.failing_images.contains(image) {
            return Err(TalosError::NotFound(format!(
                "failed to pull image {image:?}: not found"
            )));
        }
        // As siderolabs/talos v1.12.0 internal/app/machined/internal/server/v1alpha1/
        // v1alpha1_server.go `Upgrade`: on a control plane (unless forced) etcd is validated
        // (internal/pkg/etcd/etcd.go `ValidateForUpgrade`); the errors are plain Go errors,
        // so gRPC's code is Unknown. The upgrade mutex it takes only serialises these checks.
        if self.nodes[node].is_control_plane() && !force {
            let refuse = |why: String| {
                Err(TalosError::Unknown(format!(
                    "error validating etcd for upgrade: {why}"
                )))
            };
            let total = self.etcd_total();
            if total == 2 {
                return refuse(
                    "etcd member count(2) is insufficient to maintain quorum if upgrade commences"
                        .into(),
                );
            }
            // Every member must answer a quorum read; a control plane in its upgrade
            // sequence has stopped its own.
            let healthy = self.etcd_healthy();
            let sick = (0..self.nodes.len())
                .find(|i| self.nodes[*i].is_control_plane() && !healthy.contains(i))
                .map(|i| self.nodes[i].etcd_member_id)
                // A stale member never answers its quorum read either.
                .or_else(|| {
                    self.faults
                        .etcd_stale_members
                        .iter()
                        .next()
                        .map(|s| fnv1a(s))
                });
            if let Some(id) = sick {
                return refuse(format!(
                    "etcd member {id:016x} is not healthy; all members must be healthy to perform an upgrade: context deadline exceeded"
                ));
            }
        }
        // A second request while the upgrade sequence runs is acknowledged, but the sequencer
        // is locked and the new sequence never starts (v1alpha1_controller.go `Run`,
        // "sequence not started: locked"): the first one carries on.
        if self.nodes[node].stage == Stage::Upgrading {
            return Ok(new_uuid());
        }
        // install.PullAndValidateInstallerImage pulls into the system containerd.
        self.pull_image(node, ImageStore::SystemContainerd, image)?;
        let actor = new_uuid();
        self.push_event(node, Stage::Upgrading, false, &actor);
        let now = self.now;
        let n = &mut self.nodes[node];
        n.stage = Stage::Upgrading;
        // The legacy sequence runs the same installer, by the same slot rules.
        n.boot.install(&target);
        let gen = n.boot_gen;
        self.schedule(
            now.plus(self.timings.upgrade),
            Scheduled::GoDown { node, gen },
        );
        Ok(actor)
    }

    /// How long the legacy Upgrade on `node` pulls `image` before it answers: nothing when
    /// the system containerd holds it already (emptied at every boot), else
    /// `timings.installer_pull` or the node's `slowInstallerPull`.
    pub fn legacy_installer_pull(&self, node: usize, image: &str) -> Option<Duration> {
        let held = pulled_names(image).is_some_and(|(_, names)| {
            self.image(node, ImageStore::SystemContainerd, &names[0])
                .is_some()
        });
        if held {
            return None;
        }
        Some(
            self.faults
                .slow_installer_pull
                .get(&self.nodes[node].name)
                .copied()
                .unwrap_or(self.timings.installer_pull),
        )
    }

    fn installer_version(&self, node: usize, image: &str) -> Result<String, TalosError> {
        if image.is_empty() {
            return Err(TalosError::InvalidArgument(
                "installer image is empty".into(),
            ));
        }
        let target = image_version(image).ok_or_else(|| {
            TalosError::InvalidArgument(format!("installer image {image:?} has no v<version> tag"))
        })?;
        upgradeable_from(&self.nodes[node].talos_version, &target)
            .map_err(TalosError::FailedPrecondition)?;
        Ok(target)
    }

    /// ImagePull / ImageService.Pull into `store`: the name the pull returns (`name@digest`)
    /// and whether the image was already there.
    pub fn pull_image(
        &mut self,
        node: usize,
        store: ImageStore,
        reference: &str,
    ) -> Result<(String, bool), TalosError> {
        self.check_up(node)?;
        let (pinned, names) = pulled_names(reference).ok_or_else(|| {
            TalosError::InvalidArgument(format!(
                "failed to parse image reference {reference:?}: invalid reference format"
            ))
        })?;
        if self.faults.failing_images.contains(reference) {
            return Err(TalosError::NotFound(format!(
                "error pulling image: failed to pull image {reference:?}: {reference}: not found"
            )));
        }
        let n = &mut self.nodes[node];
        let already = n.images.contains_key(&(store, names[0].clone()));
        for name in names {
            n.images.insert((store, name), reference.to_string());
        }
        Ok((pinned, already))
    }

    /// The reference `name` (looked up exactly, as containerd's GetImage does) was pulled
    /// as, if it is in `store`.
    pub fn image(&self, node: usize, store: ImageStore, name: &str) -> Option<&str> {
        self.nodes[node]
            .images
            .get(&(store, name.to_string()))
            .map(String::as_str)
    }

    /// LifecycleService/Upgrade: starts writing `image`'s version to disk by the boot
    /// loader's slot rules ([`BootSlots`]). Returns when the install finishes, whether or not
    /// its caller still listens; until then the service's lock refuses another; a later
    /// reboot boots it. Errors are gRPC errors, in the order
    /// siderolabs/talos v1.13.9 internal/app/lifecycle/lifecycle.go checks them; an installer
    /// failure is `Ok(Err((exit code, message)))` (a non-zero exit code on the stream).
    pub fn start_install(
        &mut self,
        node: usize,
        store: Result<ImageStore, TalosError>,
        image: &str,
    ) -> Result<Result<Timestamp, (i32, String)>, TalosError> {
        self.check_up(node)?;
        if self.nodes[node].installing {
            return Err(TalosError::FailedPrecondition(
                "another installation/upgrade is already in progress".into(),
            ));
        }
        if image.is_empty() {
            return Err(TalosError::InvalidArgument(
                "installer image name is required".into(),
            ));
        }
        // runInstallerContainer's errors come back wrapped: Internal "upgrade failed: …".
        let wrapped = |e: String| TalosError::Internal(format!("upgrade failed: {e}"));
        let store = store.map_err(|e| wrapped(e.as_go_status()))?;
        let Some(pulled_as) = self.image(node, store, image).map(str::to_string) else {
            return Err(wrapped(format!(
                "installer image {image:?} not found in containerd store: image {image:?}: not found"
            )));
        };
        if let Some(code) = self.faults.installer_exit_code.get(&self.nodes[node].name) {
            return Ok(Err((
                *code,
                format!("installer failed with exit code {code}"),
            )));
        }
        let target = match image_version(&pulled_as)
            .map(|t| (upgradeable_from(&self.nodes[node].talos_version, &t), t))
        {
            Some((Ok(()), t)) => t,
            // A 1.14 installer's version preflight is tagged EnvironmentTag: exit 4
            // (siderolabs/talos@v1.14.0-rc.1:cmd/installer/pkg/install/preflight.go `Run`,
            // `talosVersion`); before 1.14 every failure exits 1.
            Some((Err(m), t)) => {
                return Ok(Err(match parse_version(&t) {
                    Some((1, minor, _)) if minor >= 14 => {
                        (4, format!("pre-flight checks failed: {m}"))
                    }
                    _ => (1, m),
                }))
            }
            None => {
                return Ok(Err((
                    1,
                    format!("installer image {image:?} has no v<version> tag"),
                )))
            }
        };
        let at = self.now.plus(self.timings.install);
        let n = &mut self.nodes[node];
        n.installing = true;
        n.install_run += 1;
        let (gen, run) = (n.boot_gen, n.install_run);
        self.schedule(
            at,
            Scheduled::InstallDone {
                node,
                gen,
                run,
                version: target,
            },
        );
        Ok(Ok(at))
    }

    // ---- configuration ----

    /// ApplyConfiguration with Talos' per-version mode rules (facts sheet §7).
    pub fn apply_configuration(
        &mut self,
        node: usize,
        data: &[u8],
        mode: ApplyMode,
        dry_run: bool,
        try_timeout: Option<Duration>,
    ) -> Result<ApplyOutcome, TalosError> {
        self.check_up(node)?;
        // Any request but TRY cancels a running TRY's rollback first — a dry run and one
        // that is then refused too (siderolabs/talos v1.13.9
        // internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go
        // `ApplyConfiguration`: CancelConfigRollbackTimeout before the config is parsed).
        if mode != ApplyMode::Try {
            self.nodes[node].try_token += 1;
        }
        let n = &self.nodes[node];
        let new = MachineConfig::parse(data, &n.talos_version).map_err(|e| {
            TalosError::InvalidArgument(format!("configuration validation failed: {e}"))
        })?;
        let diff = n.config.diff(&new);
        let modern = n.minor() >= 14 || parse_version(&n.talos_version).is_some_and(|v| v.0 > 1);
        let blocking = diff.needs_reboot();
        let live = blocking.is_empty();
        let chosen = match mode {
            ApplyMode::Reboot if modern => {
                return Err(TalosError::Unimplemented(
                    "REBOOT mode is not supported, please use AUTO or NO_REBOOT".into(),
                ))
            }
            ApplyMode::Reboot => ApplyMode::Reboot,
            ApplyMode::Auto if modern || live => ApplyMode::NoReboot,
            ApplyMode::Auto => ApplyMode::Reboot,
            ApplyMode::NoReboot | ApplyMode::Try if !modern && !live => {
                // Upstream's words, then the changes that need the reboot.
                return Err(TalosError::InvalidArgument(format!(
                    "this config change can't be applied in immediate mode\ndiff:\n{}",
                    blocking.join("\n")
                )));
            }
            other => other,
        };
        let details = match chosen {
            ApplyMode::Reboot => "Applied configuration with a reboot".to_string(),
            ApplyMode::NoReboot => "Applied configuration without a reboot".to_string(),
            ApplyMode::Staged => {
                "Staged configuration to be applied after the next reboot".to_string()
            }
            ApplyMode::Try => "Applied configuration without a reboot".to_string(),
            ApplyMode::Auto => String::new(),
        };
        if dry_run {
            // Upstream's `generateDiff`: the active configuration against the new one, a
            // unified diff of their encodings, or "No changes.".
            let d = super::textdiff::diff(
                &super::textdiff::encode(n.config.raw()),
                &super::textdiff::encode(new.raw()),
            );
            let d = if d.is_empty() {
                "No changes.".to_string()
            } else {
                d
            };
            return Ok(ApplyOutcome {
                mode: chosen,
                mode_details: format!(
                    "Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n\n{d}"
                ),
                warnings: Vec::new(),
            });
        }
        let details = match chosen {
            // constants.ConfigTryTimeout is one minute; Go prints the duration as "1m0s".
            ApplyMode::Try => format!(
                "{details}\nThe config is applied in 'try' mode and will be automatically reverted back in {}",
                go_duration(try_timeout.unwrap_or(Duration::from_secs(60)))
            ),
            _ => details,
        };
        let now = self.now;
        if mode == ApplyMode::Try {
            self.nodes[node].try_token += 1;
        }
        match chosen {
            ApplyMode::Staged => {
                self.nodes[node].persist(new);
            }
            ApplyMode::Reboot => {
                self.nodes[node].persist(new);
                self.go_down(node, new_uuid());
            }
            ApplyMode::Try => {
                let old = self.nodes[node].config.clone();
                self.activate_config(node, new, now);
                let n = &self.nodes[node];
                let (gen, token) = (n.boot_gen, n.try_token);
                let at = now.plus(try_timeout.unwrap_or(Duration::from_secs(60)));
                self.schedule(
                    at,
                    Scheduled::TryRollback {
                        node,
                        gen,
                        token,
                        config: Box::new(old),
                    },
                );
            }
            _ => {
                self.nodes[node].persist(new.clone());
                self.activate_config(node, new, now);
            }
        }
        Ok(ApplyOutcome {
            mode: chosen,
            mode_details: details,
            warnings: Vec::new(),
        })
    }

    /// Makes `config` active without a reboot: changed static pods restart (not Ready for
    /// `static_pod_restart`), a changed kubelet image restarts the kubelet.
    fn activate_config(&mut self, node: usize, config: MachineConfig, now: Timestamp) {
        let diff = self.nodes[node].config.diff(&config);
        let (pod_delay, kubelet_delay, pull) = (
            self.timings.static_pod_restart,
            self.timings.kubelet_restart,
            self.timings.image_pull,
        );
        let n = &mut self.nodes[node];
        // A component finds only the images of its own store; a missing one is pulled
        // before it starts (the kubelet service into CRI `system`, the kubelet's pods into
        // `k8s.io`).
        let mut fetch = |store: ImageStore, image: &str| -> Duration {
            match pulled_names(image) {
                Some((_, names)) if !n.images.contains_key(&(store, names[0].clone())) => {
                    for name in names {
                        n.images.insert((store, name), image.to_string());
                    }
                    pull
                }
                _ => Duration::ZERO,
            }
        };
        let waits: Vec<(Component, Duration)> = diff
            .images
            .iter()
            .map(|(c, _, new)| {
                let image = new.clone().unwrap_or_default();
                let store = if *c == Component::Kubelet {
                    ImageStore::CriSystem
                } else {
                    ImageStore::CriK8s
                };
                (*c, fetch(store, &image))
            })
            .collect();
        let wait = |c: Component| {
            waits
                .iter()
                .find(|(w, _)| *w == c)
                .map_or(Duration::ZERO, |(_, d)| *d)
        };
        n.config = config;
        n.config_version += 1;
        let gen = n.boot_gen;
        let mut later = Vec::new();
        for (component, _, new) in diff.images {
            let image = new.unwrap_or_default();
            if component == Component::Kubelet {
                n.kubelet.image = image.clone();
                n.kubelet.healthy = false;
                n.kubelet.restart += 1;
                let version = image_version(&image).unwrap_or_else(|| n.kubelet.version.clone());
                later.push((
                    now.plus(kubelet_delay + wait(component)),
                    Scheduled::KubeletReady {
                        node,
                        gen,
                        restart: n.kubelet.restart,
                        version,
                    },
                ));
            } else if let Some(p) = n.static_pods.iter_mut().find(|p| p.component == component) {
                p.image = image;
                p.ready = false;
                p.restart += 1;
                later.push((
                    now.plus(pod_delay + wait(component)),
                    Scheduled::StaticPodReady {
                        node,
                        gen,
                        component,
                        restart: p.restart,
                    },
                ));
            }
        }
        for (at, what) in later {
            self.schedule(at, what);
        }
    }

    // ---- faults at run time ----

    pub fn set_never_return(&mut self, node: &str, on: bool) {
        if on {
            self.faults.never_return.insert(node.to_string());
        } else {
            self.faults.never_return.remove(node);
            // A node held down by the fault comes back one reboot duration from now.
            if let Some(i) = self.find(node) {
                if !self.nodes[i].up {
                    let gen = self.nodes[i].boot_gen;
                    let at = self.now.plus(self.timings.reboot);
                    self.schedule(at, Scheduled::Return { node: i, gen });
                }
            }
        }
    }

    pub fn set_slow_apply(&mut self, node: &str, delay: Option<Duration>) {
        match delay {
            Some(d) => self.faults.slow_apply.insert(node.to_string(), d),
            None => self.faults.slow_apply.remove(node),
        };
    }

    /// Cut a control plane's etcd member off from its peers (or heal it); leadership moves
    /// off a member that is cut off, and quorum is recounted.
    pub fn set_etcd_unhealthy(&mut self, node: &str, on: bool) {
        if on {
            self.faults.etcd_unhealthy.insert(node.to_string());
        } else {
            self.faults.etcd_unhealthy.remove(node);
        }
        self.elect_leader();
    }

    /// Installs on `node` boot `version` instead of what they installed (`None` heals).
    pub fn set_wrong_version(&mut self, node: &str, version: Option<&str>) {
        match version {
            Some(v) => self
                .faults
                .wrong_version
                .insert(node.to_string(), v.to_string()),
            None => self.faults.wrong_version.remove(node),
        };
    }

    /// The installer of `node` exits with `code` (`None` heals).
    pub fn set_installer_exit_code(&mut self, node: &str, code: Option<i32>) {
        match code {
            Some(c) => self.faults.installer_exit_code.insert(node.to_string(), c),
            None => self.faults.installer_exit_code.remove(node),
        };
    }

    /// A STAGED configuration pending on `node`: the active one with `paths` set, persisted
    /// for the next boot as ApplyConfiguration STAGED does. An empty list drops it.
    pub fn stage_config(
        &mut self,
        node: &str,
        paths: &[(String, serde_yaml::Value)],
    ) -> Result<(), ConfigError> {
        let Some(i) = self.find(node) else {
            return Ok(());
        };
        let n = &mut self.nodes[i];
        let staged = if paths.is_empty() {
            n.config.clone()
        } else {
            n.config.with_values(paths, &n.talos_version)?
        };
        n.persist(staged);
        Ok(())
    }

    /// An operator's `talosctl apply-config --mode try` on `node`: the active configuration
    /// with `paths` set, through ApplyConfiguration's TRY, rolled back after `timeout`.
    pub fn try_config(
        &mut self,
        node: &str,
        paths: &[(String, serde_yaml::Value)],
        timeout: Duration,
    ) -> Result<(), ConfigError> {
        let Some(i) = self.find(node) else {
            return Err(ConfigError::NoSuchNode(node.to_string()));
        };
        let n = &self.nodes[i];
        let trial = n.config.with_values(paths, &n.talos_version)?;
        self.apply_configuration(i, trial.raw(), ApplyMode::Try, false, Some(timeout))
            .map_err(|e| ConfigError::Refused(e.to_string()))?;
        Ok(())
    }

    /// `node` as installed with these dotted v1alpha1 `paths` set in its configuration
    /// (`machine.install.extraKernelArgs`, `cluster.etcd.image`, …): active and on disk alike.
    pub fn configure_node(
        &mut self,
        node: &str,
        paths: &[(String, serde_yaml::Value)],
    ) -> Result<(), ConfigError> {
        let Some(i) = self.find(node) else {
            return Err(ConfigError::NoSuchNode(node.to_string()));
        };
        let n = &mut self.nodes[i];
        n.config = n.config.with_values(paths, &n.talos_version)?;
        n.persistent_config = n.config.clone();
        // As booted with it: the active resource stays at its boot version (1), since a
        // version above 1 with nothing persisted is what a TRY leaves.
        Ok(())
    }

    /// Every node configured without kube-proxy (the CNI replaces it), active and on disk.
    pub fn disable_kube_proxy(&mut self) -> Result<(), ConfigError> {
        for n in &mut self.nodes {
            n.config = n.config.without_kube_proxy(&n.talos_version)?;
            n.persistent_config = n.config.clone();
        }
        Ok(())
    }

    /// Whether `node` booted a UKI through systemd-boot (else GRUB): its boot loader.
    pub fn set_booted_with_uki(&mut self, node: &str, on: bool) {
        self.set_bootloader(
            node,
            if on {
                Bootloader::SdBoot
            } else {
                Bootloader::Grub
            },
        );
    }

    /// The boot loader `node` boots with (`--config` `bootloader:`).
    pub fn set_bootloader(&mut self, node: &str, loader: Bootloader) {
        if let Some(i) = self.find(node) {
            self.nodes[i].boot.loader = loader;
            self.nodes[i].booted_with_uki = loader == Bootloader::SdBoot;
        }
    }

    pub fn set_failing_image(&mut self, reference: &str, failing: bool) {
        if failing {
            self.faults.failing_images.insert(reference.to_string());
        } else {
            self.faults.failing_images.remove(reference);
        }
    }
}

/// A whole-second duration as Go's `time.Duration.String` prints it ("1m0s", "1h2m3s").
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, role: Role, ip: &str, talos: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            role,
            ip: ip.parse().unwrap_or(IpAddr::from([10, 5, 0, 9])),
            talos_version: talos.into(),
            kubernetes_version: "v1.33.1".into(),
            kubelet_version: "v1.33.1".into(),
            config_form: ConfigForm::V1Alpha1,
        }
    }

    fn cluster(talos: &str) -> TalosCluster {
        let specs = vec![
            spec("cp-1", Role::ControlPlane, "10.5.0.2", talos),
            spec("cp-2", Role::ControlPlane, "10.5.0.3", talos),
            spec("cp-3", Role::ControlPlane, "10.5.0.4", talos),
            spec("w-1", Role::Worker, "10.5.0.10", talos),
        ];
        TalosCluster::new(&specs, Timings::default(), Faults::default(), Timestamp(0))
            .unwrap_or_else(|e| panic!("cluster: {e}"))
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn legacy_upgrade_goes_down_then_returns_with_new_version_and_boot_id() {
        let mut c = cluster("v1.12.4");
        let w = c.find("w-1").unwrap_or(3);
        let boot = c.node(w).boot_id.clone();
        c.upgrade_legacy(w, "ghcr.io/siderolabs/installer:v1.13.0", false)
            .unwrap_or_else(|e| panic!("{e}"));
        c.sync(Timestamp(0).plus(S(29)));
        assert!(c.node(w).up);
        c.sync(Timestamp(0).plus(S(30)));
        assert!(!c.node(w).up && !c.node(w).ready());
        c.sync(Timestamp(0).plus(S(119)));
        assert!(!c.node(w).up);
        c.sync(Timestamp(0).plus(S(120)));
        let n = c.node(w);
        assert!(n.up && n.ready());
        assert_eq!(n.talos_version, "v1.13.0");
        assert_ne!(n.boot_id, boot);
        let stages: Vec<Stage> = n.events.iter().map(|e| e.stage).collect();
        assert_eq!(stages, vec![Stage::Booting, Stage::Running]);
    }

    #[test]
    fn due_events_apply_in_time_order_even_when_scheduled_out_of_order() {
        let mut c = cluster("v1.13.2");
        c.timings.static_pod_restart = S(50);
        c.timings.kubelet_restart = S(10);
        // Not pre-pulled: no pull time, so only the restarts count.
        c.timings.image_pull = S(0);
        let cp = c.find("cp-1").unwrap_or(0);
        let cfg = String::from_utf8_lossy(c.node(cp).config.raw())
            .replace("kube-apiserver:v1.33.1", "kube-apiserver:v1.34.0")
            .replace("kubelet:v1.33.1", "kubelet:v1.34.0");
        c.apply_configuration(cp, cfg.as_bytes(), ApplyMode::NoReboot, false, None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!c
            .node(cp)
            .static_pod(Component::ApiServer)
            .is_some_and(|p| p.ready));
        assert!(!c.node(cp).kubelet.healthy);
        // One sync far in the future applies both: kubelet (t+10) before apiserver (t+50).
        c.sync(Timestamp(0).plus(S(10)));
        assert!(c.node(cp).kubelet.healthy);
        assert_eq!(c.node(cp).kubelet_version(), "v1.34.0");
        assert!(!c
            .node(cp)
            .static_pod(Component::ApiServer)
            .is_some_and(|p| p.ready));
        c.sync(Timestamp(0).plus(S(500)));
        assert!(c
            .node(cp)
            .static_pod(Component::ApiServer)
            .is_some_and(|p| p.ready));
    }

    #[test]
    fn a_reboot_drops_work_scheduled_before_it() {
        let mut c = cluster("v1.13.2");
        let cp = c.find("cp-2").unwrap_or(1);
        let cfg = String::from_utf8_lossy(c.node(cp).config.raw())
            .replace("kube-scheduler:v1.33.1", "kube-scheduler:v1.34.0");
        c.apply_configuration(cp, cfg.as_bytes(), ApplyMode::NoReboot, false, None)
            .unwrap_or_else(|e| panic!("{e}"));
        c.reboot(cp).unwrap_or_else(|e| panic!("{e}"));
        c.sync(Timestamp(0).plus(S(30)));
        // The pod-ready event from before the reboot did not fire while down.
        assert!(!c
            .node(cp)
            .static_pod(Component::Scheduler)
            .is_some_and(|p| p.ready));
        c.sync(Timestamp(0).plus(S(90)));
        assert!(c.node(cp).up);
        assert_eq!(
            c.node(cp)
                .static_pod(Component::Scheduler)
                .map(|p| p.image.as_str()),
            Some("registry.k8s.io/kube-scheduler:v1.34.0")
        );
    }

    #[test]
    fn etcd_loses_quorum_with_two_control_planes_down() {
        let mut c = cluster("v1.13.2");
        assert_eq!(c.etcd_members().len(), 3);
        let leader = c.etcd_leader().map(str::to_string).unwrap_or_default();
        let l = c.find(&leader).unwrap_or(0);
        c.reboot(l).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.etcd_members().len(), 2);
        assert!(c.etcd_has_quorum());
        assert_ne!(c.etcd_leader(), Some(leader.as_str()));
        let other = c.find(c.etcd_leader().unwrap_or("")).unwrap_or(0);
        c.reboot(other).unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.etcd_has_quorum());
        assert!(c.etcd_leader().is_none());
        let last = (0..3).find(|i| c.node(*i).up).unwrap_or(0);
        assert!(matches!(
            c.check_etcd(last),
            Err(TalosError::Unavailable(_))
        ));
        c.sync(Timestamp(0).plus(S(90)));
        assert!(c.etcd_has_quorum() && c.etcd_members().len() == 3);
    }

    #[test]
    fn an_unhealthy_member_stays_listed_but_counts_as_down_and_heals() {
        let mut c = cluster("v1.12.4");
        let leader = c.etcd_leader().map(str::to_string).unwrap_or_default();
        let l = c.find(&leader).unwrap_or(0);
        c.set_etcd_unhealthy(&leader, true);
        // Leadership moves to a healthy member; the sick one knows no leader.
        assert_ne!(c.etcd_leader(), Some(leader.as_str()));
        assert!(c.etcd_leader().is_some());
        assert_eq!(c.etcd_members().len(), 3);
        assert_eq!(
            c.etcd_status(l),
            (0, vec!["etcdserver: no leader".to_string()])
        );
        let other = (0..3).find(|i| *i != l).unwrap_or(1);
        let (seen_leader, errors) = c.etcd_status(other);
        assert!(errors.is_empty());
        assert_ne!(seen_leader, 0);
        assert!(c.etcd_has_quorum());
        // A control-plane upgrade is refused while a member is unhealthy.
        let third = (0..3).find(|i| *i != l && *i != other).unwrap_or(2);
        assert!(matches!(
            c.upgrade_legacy(third, "ghcr.io/siderolabs/installer:v1.12.6", false),
            Err(TalosError::Unknown(m)) if m.contains("is not healthy")
        ));
        // One more down: quorum is gone (one healthy of three).
        c.reboot(other).unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.etcd_has_quorum());
        assert!(c.etcd_leader().is_none());
        assert!(
            matches!(c.check_etcd(third), Err(TalosError::Unavailable(m)) if m.contains("1 of 3 members healthy"))
        );
        // Healing it alone restores quorum while the other is still down.
        c.set_etcd_unhealthy(&leader, false);
        assert!(c.etcd_has_quorum());
        assert_eq!(c.etcd_status(l).1, Vec::<String>::new());
    }

    #[test]
    fn a_wrong_version_takes_the_place_of_what_was_installed() {
        let mut c = cluster("v1.12.4");
        let w = c.find("w-1").unwrap_or(3);
        c.set_wrong_version("w-1", Some("v1.12.4"));
        let boot = c.node(w).boot_id.clone();
        c.upgrade_legacy(w, "ghcr.io/siderolabs/installer:v1.12.6", false)
            .unwrap_or_else(|e| panic!("{e}"));
        c.sync(Timestamp(0).plus(S(120)));
        assert!(c.node(w).up);
        assert_ne!(c.node(w).boot_id, boot);
        assert_eq!(c.node(w).talos_version, "v1.12.4");
        // A plain reboot installs nothing, so the fault changes nothing.
        c.set_wrong_version("w-1", Some("v1.11.0"));
        c.reboot(w).unwrap_or_else(|e| panic!("{e}"));
        c.sync(Timestamp(0).plus(S(300)));
        assert_eq!(c.node(w).talos_version, "v1.12.4");
        // Healed: the next install takes.
        c.set_wrong_version("w-1", None);
        c.upgrade_legacy(w, "ghcr.io/siderolabs/installer:v1.12.6", false)
            .unwrap_or_else(|e| panic!("{e}"));
        c.sync(Timestamp(0).plus(S(600)));
        assert_eq!(c.node(w).talos_version, "v1.12.6");
    }

    #[test]
    fn no_reboot_refuses_other_changes_before_1_14_and_accepts_them_after() {
        for (talos, refused) in [("v1.13.2", true), ("v1.14.0", false)] {
            let mut c = cluster(talos);
            let cfg = String::from_utf8_lossy(c.node(0).config.raw())
                .replace("machine:\n", "machine:\n  env:\n    FOO: bar\n");
            let r = c.apply_configuration(0, cfg.as_bytes(), ApplyMode::NoReboot, false, None);
            assert_eq!(
                matches!(r, Err(TalosError::InvalidArgument(_))),
                refused,
                "{talos}"
            );
        }
    }

    #[test]
    fn try_mode_rolls_back_unless_a_later_apply_supersedes_it() {
        let mut c = cluster("v1.13.2");
        let original = c.node(0).config.clone();
        let bumped = String::from_utf8_lossy(original.raw())
            .replace("kube-apiserver:v1.33.1", "kube-apiserver:v1.34.0");
        c.apply_configuration(0, bumped.as_bytes(), ApplyMode::Try, false, Some(S(60)))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(c.node(0).config, original);
        c.sync(Timestamp(0).plus(S(60)));
        assert_eq!(
            c.node(0).config,
            original,
            "rolled back after the try timeout"
        );

        c.apply_configuration(0, bumped.as_bytes(), ApplyMode::Try, false, Some(S(60)))
            .unwrap_or_else(|e| panic!("{e}"));
        c.apply_configuration(0, bumped.as_bytes(), ApplyMode::NoReboot, false, None)
            .unwrap_or_else(|e| panic!("{e}"));
        c.sync(Timestamp(0).plus(S(600)));
        assert_ne!(
            c.node(0).config,
            original,
            "a later apply cancels the rollback"
        );
    }

    #[test]
    fn the_persistent_resource_exists_only_after_an_apply_in_this_boot() {
        let mut c = cluster("v1.13.2");
        let n = |c: &TalosCluster| {
            let n = c.node(0);
            (n.persistent_resource, n.config_version)
        };
        assert_eq!(
            n(&c),
            (false, 1),
            "a config from STATE is not persisted again"
        );
        let original = c.node(0).config.clone();
        let bumped = String::from_utf8_lossy(original.raw())
            .replace("kube-apiserver:v1.33.1", "kube-apiserver:v1.34.0");
        c.apply_configuration(0, bumped.as_bytes(), ApplyMode::Try, false, Some(S(60)))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n(&c), (false, 2), "a TRY sets only the active one");
        c.sync(Timestamp(0).plus(S(60)));
        assert_eq!(n(&c), (false, 3), "its rollback sets it again");
        c.apply_configuration(0, original.raw(), ApplyMode::NoReboot, false, None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n(&c), (true, 4));
        assert_eq!(c.node(0).persistent_version, 1);
        c.reboot(0).unwrap_or_else(|e| panic!("{e}"));
        c.sync(Timestamp(0).plus(S(3600)));
        assert!(c.node(0).up);
        assert_eq!(n(&c), (false, 1), "a new boot starts over");
    }

    #[test]
    fn xid_is_twenty_base32hex_characters() {
        let id = xid(Timestamp(1_767_225_600_000), "cp-1", 7);
        assert_eq!(id.len(), 20);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'v').contains(&b)));
    }
}
