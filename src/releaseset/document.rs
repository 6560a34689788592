//! The two documents a user keeps per cluster: `clusters/<name>/release-set.yaml`
//! (kind ReleaseSet: what versions should run) and `clusters/<name>/cluster.yaml` (kind
//! Cluster: how to reach the cluster and how to roll it). Parsing is strict: unknown fields
//! are refused, and every error names the file, line and column and what was expected.

use std::collections::BTreeSet;
use std::fmt;
use std::num::NonZeroU32;

use serde::{Deserialize, Serialize};

use super::duration::HumanDuration;
use super::scalar::{self, FromScalar};
use super::version::{excerpt, Version};

pub const API_VERSION: &str = "ichor.dev/v1alpha1";

/// A document that could not be read. `Display` gives `file:line:column: message`, the form
/// compilers use, so editors and terminals can jump to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct DocumentError {
    pub file: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{}:{}: {}", self.file, l, c, self.message),
            (Some(l), None) => write!(f, "{}:{}: {}", self.file, l, self.message),
            _ => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl DocumentError {
    pub fn new(file: &str, message: impl Into<String>) -> Self {
        DocumentError {
            file: file.to_string(),
            line: None,
            column: None,
            message: message.into(),
        }
    }

    pub fn at(file: &str, pos: Option<(usize, usize)>, message: impl Into<String>) -> Self {
        DocumentError {
            file: file.to_string(),
            line: pos.map(|p| p.0),
            column: pos.map(|p| p.1),
            message: message.into(),
        }
    }

    /// From a serde_yaml error, moving its "at line X column Y" into the structured fields.
    pub fn from_yaml(file: &str, e: &serde_yaml::Error) -> Self {
        let mut message = e.to_string();
        if let Some(i) = message.find(" at line ") {
            message.truncate(i);
        }
        // serde_yaml quotes offending keys and values whole; a PR can make them huge.
        message = super::version::excerpt(&message, 300);
        if message.trim().is_empty() || message == "EOF while parsing a value" {
            message = "the document is empty; expected apiVersion, kind, metadata and spec".into();
        }
        let loc = e.location();
        DocumentError {
            file: file.to_string(),
            line: loc.as_ref().map(|l| l.line()),
            column: loc.as_ref().map(|l| l.column()),
            message,
        }
    }
}

/// 1-based (line, column) of the `nth` (0-based) line whose trimmed text starts with `needle`.
/// Used for checks that span several fields, after serde has already accepted the document.
pub fn locate(text: &str, needle: &str, nth: usize) -> Option<(usize, usize)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let trimmed = line.trim_start().trim_start_matches("- ");
            trimmed
                .starts_with(needle)
                .then(|| (i + 1, line.len() - trimmed.len() + 1))
        })
        .nth(nth)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApiVersion {
    #[serde(rename = "ichor.dev/v1alpha1")]
    V1alpha1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseSetKind {
    ReleaseSet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterKind {
    Cluster,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
}

/// What versions the cluster should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseSet {
    pub api_version: ApiVersion,
    pub kind: ReleaseSetKind,
    pub metadata: Metadata,
    pub spec: ReleaseSetSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseSetSpec {
    pub talos: Version,
    pub kubernetes: Version,
    pub cni: Component,
    #[serde(default)]
    pub addons: Vec<Component>,
    /// Intermediate versions a chained upgrade passes through, pinned by the user; each
    /// minor not pinned lands on its newest known patch (policies' `latestPatches`).
    #[serde(default, skip_serializing_if = "Via::is_empty")]
    pub via: Via,
}

/// The most pinned versions `spec.via` may hold per component: more than any chain walks.
pub const MAX_VIA: usize = 16;

/// `spec.via: {talos: [v1.13.10], kubernetes: [v1.34.6, v1.35.4]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Via {
    #[serde(default)]
    pub talos: Vec<Version>,
    #[serde(default)]
    pub kubernetes: Vec<Version>,
}

impl Via {
    pub fn is_empty(&self) -> bool {
        self.talos.is_empty() && self.kubernetes.is_empty()
    }
}

/// A named, versioned piece: the CNI or an add-on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    pub name: String,
    pub version: Version,
}

impl ReleaseSet {
    pub fn parse(file: &str, text: &str) -> Result<Self, DocumentError> {
        let doc: ReleaseSet = super::yaml::parse(file, text)?;
        doc.validate(file, text)?;
        Ok(doc)
    }

    fn validate(&self, file: &str, text: &str) -> Result<(), DocumentError> {
        check_name(file, text, &self.metadata.name)?;
        check_component_name(file, text, &self.spec.cni.name, 0)?;
        for (what, pins) in [
            ("talos", &self.spec.via.talos),
            ("kubernetes", &self.spec.via.kubernetes),
        ] {
            if pins.len() > MAX_VIA {
                return Err(DocumentError::at(
                    file,
                    locate(text, "via:", 0),
                    format!(
                        "spec.via.{what} lists {} versions; at most {MAX_VIA}",
                        pins.len()
                    ),
                ));
            }
            let mut minors = BTreeSet::new();
            for v in pins {
                if !minors.insert(v.minor_version()) {
                    return Err(DocumentError::at(
                        file,
                        locate(text, "via:", 0),
                        format!("spec.via.{what} pins {} twice; a chain passes each minor once, so pin one patch per minor", v.minor_version()),
                    ));
                }
            }
        }
        let mut seen = BTreeSet::new();
        for (i, addon) in self.spec.addons.iter().enumerate() {
            check_component_name(file, text, &addon.name, 0)?;
            if addon.name == self.spec.cni.name {
                return Err(DocumentError::at(
                    file,
                    locate(text, &format!("name: {}", addon.name), 1),
                    format!(
                        "spec.addons[{i}]: `{}` is already the CNI (spec.cni); list it once",
                        addon.name
                    ),
                ));
            }
            if !seen.insert(addon.name.as_str()) {
                return Err(DocumentError::at(
                    file,
                    locate(text, &format!("name: {}", addon.name), 1),
                    format!(
                        "spec.addons[{i}]: add-on `{}` is listed twice; each add-on appears once",
                        addon.name
                    ),
                ));
            }
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.metadata.name
    }
}

fn check_name(file: &str, text: &str, name: &str) -> Result<(), DocumentError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(DocumentError::at(
            file,
            locate(text, "name:", 0),
            format!("metadata.name `{}` is not a valid name; expected lower-case letters, digits and `-` (at most 63)", excerpt(name, 64)),
        ))
    }
}

fn check_component_name(
    file: &str,
    text: &str,
    name: &str,
    nth: usize,
) -> Result<(), DocumentError> {
    let ok = name.len() <= 63
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !ok {
        return Err(DocumentError::at(
            file,
            locate(text, &format!("name: {name}"), nth).or_else(|| locate(text, "name:", 1)),
            format!(
                "component name `{}` must be a single word of letters, digits, `-`, `.` or `_` (at most 63), such as `cilium` or `cert-manager`",
                excerpt(name, 64)
            ),
        ));
    }
    Ok(())
}

/// How to reach the cluster and how to roll it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Cluster {
    pub api_version: ApiVersion,
    pub kind: ClusterKind,
    pub metadata: Metadata,
    pub spec: ClusterSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default)]
    pub talos: TalosAccess,
    #[serde(default)]
    pub cni: CniSettings,
    #[serde(default)]
    pub rollout: RolloutPolicy,
    #[serde(default)]
    pub volumes: Volumes,
    /// Nodes as the user describes them, for planning without cluster access.
    #[serde(default)]
    pub inventory: Option<Inventory>,
    /// The owner's definition of healthy, judged before, between and after the disruptive
    /// steps (crate::health).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks: Vec<crate::health::HealthCheck>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TalosAccess {
    /// Control-plane addresses the Talos API is reached through.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Installer image without a tag; the tag is the release set's Talos version.
    #[serde(default)]
    pub installer_image: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CniSettings {
    #[serde(default)]
    pub handover: Handover,
    /// The CNI replaces kube-proxy (e.g. Cilium kube-proxy replacement): the rollout skips
    /// the kube-proxy step.
    #[serde(default)]
    pub replaces_kube_proxy: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Handover {
    #[serde(default)]
    pub mode: HandoverMode,
    #[serde(default)]
    pub argocd_application: Option<ObjectRef>,
}

/// Whether Argo CD takes the CNI over from Talos's inline manifests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum HandoverMode {
    Automatic,
    Manual,
    #[default]
    Disabled,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectRef {
    pub name: String,
    #[serde(default = "default_argocd_namespace")]
    pub namespace: String,
}

fn default_argocd_namespace() -> String {
    "argocd".into()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// Workers down at once (batch size).
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: NonZeroU32,
    /// How long a drain may wait on PodDisruptionBudgets before the rollout pauses.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: HumanDuration,
    /// How long one node may take from cordon to uncordon before the rollout pauses.
    #[serde(default = "default_node_timeout")]
    pub node_timeout: HumanDuration,
    #[serde(default)]
    pub estimates: StepEstimates,
    /// When the rollout may act; empty means any time.
    #[serde(default)]
    pub maintenance_windows: Vec<MaintenanceWindow>,
    #[serde(default)]
    pub paused: bool,
    /// What a drain may evict beyond what `kubectl drain` evicts by default.
    #[serde(default)]
    pub drain: DrainPolicy,
    /// A cluster of one node cannot move its workloads anywhere: ichor refuses to roll it
    /// unless this accepts that everything on it is down while the node upgrades (then the
    /// node is upgraded without a drain).
    #[serde(default)]
    pub accept_single_node_downtime: bool,
    /// Keep the two-pass order for a bump that moves Talos and Kubernetes: every node's
    /// Talos first, then the Kubernetes stages with each worker drained again for its
    /// kubelet. By default each worker is drained once for both (docs/rollout.md).
    #[serde(default)]
    pub two_pass: bool,
    /// How many Talos minors a worker may move in one reboot on a chained upgrade: 1 (the
    /// default, every minor walked as Talos's docs advise) or 2 where the target's
    /// `upgradeFrom` accepts the worker's Talos.
    #[serde(default = "default_talos_minors_per_reboot")]
    pub talos_minors_per_reboot: NonZeroU32,
}

/// The most Talos minors one reboot may move (Talos installers accept hosts at most two
/// minors older: `MinimumHostUpgradeVersion` in pkg/machinery/compatibility).
pub const MAX_TALOS_MINORS_PER_REBOOT: u32 = 2;

fn default_talos_minors_per_reboot() -> NonZeroU32 {
    NonZeroU32::MIN
}

/// The drain's opt-ins, named after `kubectl drain`'s flags (kubernetes/kubectl
/// pkg/drain/filters.go): by default a pod without a controller, or with `emptyDir` data,
/// stops the drain, as it stops `kubectl drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DrainPolicy {
    /// Evict pods that no controller owns (`kubectl drain --force`, though ichor still only
    /// evicts): they are not recreated anywhere.
    #[serde(default)]
    pub evict_unmanaged_pods: bool,
    /// Evict pods with `emptyDir` volumes (`--delete-emptydir-data`): their data is lost,
    /// where a reboot alone would keep it.
    #[serde(default)]
    pub delete_empty_dir_data: bool,
}

impl Default for RolloutPolicy {
    fn default() -> Self {
        RolloutPolicy {
            max_unavailable: default_max_unavailable(),
            drain_timeout: default_drain_timeout(),
            node_timeout: default_node_timeout(),
            estimates: StepEstimates::default(),
            maintenance_windows: Vec::new(),
            paused: false,
            drain: DrainPolicy::default(),
            accept_single_node_downtime: false,
            two_pass: false,
            talos_minors_per_reboot: default_talos_minors_per_reboot(),
        }
    }
}

fn default_max_unavailable() -> NonZeroU32 {
    NonZeroU32::MIN
}
fn default_drain_timeout() -> HumanDuration {
    HumanDuration::from_mins(10)
}
fn default_node_timeout() -> HumanDuration {
    HumanDuration::from_mins(30)
}

/// Expected duration of each kind of step, for the plan's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct StepEstimates {
    /// One node's Talos upgrade: pre-pull, cordon, drain, install, reboot, Ready, uncordon.
    pub talos_node: HumanDuration,
    /// kube-apiserver on one control plane.
    pub api_server: HumanDuration,
    /// kube-controller-manager and kube-scheduler on one control plane.
    pub controller_manager_scheduler: HumanDuration,
    /// kube-proxy roll-out and the bootstrap-manifest sync.
    pub kube_proxy_and_manifests: HumanDuration,
    /// One node's kubelet: cordon, drain, restart, Ready, uncordon.
    pub kubelet: HumanDuration,
    /// The final whole-cluster verification.
    pub verify: HumanDuration,
}

impl Default for StepEstimates {
    fn default() -> Self {
        StepEstimates {
            talos_node: HumanDuration::from_mins(8),
            api_server: HumanDuration::from_mins(2),
            controller_manager_scheduler: HumanDuration::from_mins(2),
            kube_proxy_and_manifests: HumanDuration::from_mins(3),
            kubelet: HumanDuration::from_mins(3),
            verify: HumanDuration::from_mins(2),
        }
    }
}

/// A weekly window in UTC, e.g. `{days: [sat, sun], start: "02:00", duration: 4h}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceWindow {
    pub days: Vec<Weekday>,
    pub start: TimeOfDay,
    pub duration: HumanDuration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weekday {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

/// `HH:MM`, 24-hour, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimeOfDay {
    pub hour: u8,
    pub minute: u8,
}

impl FromScalar for TimeOfDay {
    const EXPECTING: &'static str =
        "a time of day as a quoted \"HH:MM\" (24-hour, UTC), e.g. \"02:30\"";
    fn from_text(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("`{s}` is not a time of day; expected \"HH:MM\" (24-hour, UTC), e.g. \"02:30\"")
        };
        let (h, m) = s.split_once(':').ok_or_else(bad)?;
        let hour: u8 = h.parse().map_err(|_| bad())?;
        let minute: u8 = m.parse().map_err(|_| bad())?;
        if hour > 23 || minute > 59 || m.len() != 2 {
            return Err(bad());
        }
        Ok(TimeOfDay { hour, minute })
    }
}

impl<'de> Deserialize<'de> for TimeOfDay {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar::deserialize(d)
    }
}

impl Serialize for TimeOfDay {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:02}:{:02}", self.hour, self.minute))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Volumes {
    #[serde(default)]
    pub provider: VolumeProvider,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeProvider {
    Longhorn,
    LocalPath,
    #[default]
    None,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    pub nodes: Vec<InventoryNode>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryNode {
    pub name: String,
    pub role: Role,
    #[serde(default)]
    pub address: Option<String>,
    /// Talos version the node runs; defaults to the base release set's.
    #[serde(default)]
    pub talos: Option<Version>,
    /// Kubelet version the node runs; defaults to the base release set's Kubernetes.
    #[serde(default)]
    pub kubelet: Option<Version>,
    /// Volumes this node holds a replica of (Longhorn volume names, local-path PVs).
    #[serde(default)]
    pub volumes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    #[serde(alias = "control-plane")]
    Controlplane,
    Worker,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Controlplane => "controlplane",
            Role::Worker => "worker",
        })
    }
}

impl Cluster {
    pub fn parse(file: &str, text: &str) -> Result<Self, DocumentError> {
        let doc: Cluster = super::yaml::parse(file, text)?;
        doc.validate(file, text)?;
        Ok(doc)
    }

    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    fn validate(&self, file: &str, text: &str) -> Result<(), DocumentError> {
        check_name(file, text, &self.metadata.name)?;
        let spec = &self.spec;
        if let Some(image) = &spec.talos.installer_image {
            let last = image.rsplit('/').next().unwrap_or(image);
            if image.trim().is_empty() || last.contains(':') || image.contains('@') {
                return Err(DocumentError::at(
                    file,
                    locate(text, "installerImage:", 0),
                    format!("spec.talos.installerImage `{image}` must be an image name without a tag or digest; the tag comes from release-set.yaml spec.talos"),
                ));
            }
        }
        if spec.cni.handover.mode != HandoverMode::Disabled
            && spec.cni.handover.argocd_application.is_none()
        {
            return Err(DocumentError::at(
                file,
                locate(text, "mode:", 0),
                "spec.cni.handover.argocdApplication is required when the hand-over mode is automatic or manual (the Argo CD Application that takes the CNI over)",
            ));
        }
        for (i, w) in spec.rollout.maintenance_windows.iter().enumerate() {
            if w.days.is_empty() || w.duration.0.is_zero() {
                return Err(DocumentError::at(
                    file,
                    locate(text, "maintenanceWindows:", 0),
                    format!("spec.rollout.maintenanceWindows[{i}] needs at least one day and a non-zero duration"),
                ));
            }
        }
        let r = &spec.rollout;
        if r.talos_minors_per_reboot.get() > MAX_TALOS_MINORS_PER_REBOOT {
            return Err(DocumentError::at(
                file,
                locate(text, "talosMinorsPerReboot:", 0),
                format!(
                    "spec.rollout.talosMinorsPerReboot is {}; at most {MAX_TALOS_MINORS_PER_REBOOT} (a Talos installer upgrades hosts at most two minors older)",
                    r.talos_minors_per_reboot
                ),
            ));
        }
        if r.node_timeout < r.drain_timeout {
            return Err(DocumentError::at(
                file,
                locate(text, "nodeTimeout:", 0).or_else(|| locate(text, "drainTimeout:", 0)),
                format!(
                    "spec.rollout.nodeTimeout ({}) is shorter than spec.rollout.drainTimeout ({}): a node's whole upgrade includes its drain",
                    r.node_timeout, r.drain_timeout
                ),
            ));
        }
        for (i, e) in spec.talos.endpoints.iter().enumerate() {
            if let Err(why) = check_endpoint(e) {
                return Err(DocumentError::at(
                    file,
                    locate(text, "endpoints:", 0),
                    format!("spec.talos.endpoints[{i}] `{}`: {why}", excerpt(e, 64)),
                ));
            }
        }
        if let Some(inv) = &spec.inventory {
            validate_inventory(file, text, inv)?;
        }
        crate::health::validate(file, text, &spec.health_checks, spec.rollout.node_timeout)?;
        Ok(())
    }

    /// Settings that are allowed but probably not meant, each with the reason.
    pub fn warnings(&self) -> Vec<String> {
        let r = &self.spec.rollout;
        let longest = r.estimates.talos_node.max(r.estimates.kubelet);
        let mut out = Vec::new();
        for (i, w) in r.maintenance_windows.iter().enumerate() {
            if w.duration < longest {
                out.push(format!(
                    "spec.rollout.maintenanceWindows[{i}] lasts {}, shorter than one node's step ({} estimated): each window starts at most one node, which finishes outside it",
                    w.duration, longest
                ));
            }
        }
        if r.node_timeout < longest {
            out.push(format!(
                "spec.rollout.nodeTimeout ({}) is shorter than the estimate for one node ({}): expect the rollout to pause on timeouts",
                r.node_timeout, longest
            ));
        }
        out
    }
}

/// The most nodes an inventory may list.
pub const MAX_INVENTORY_NODES: usize = 10_000;

fn validate_inventory(file: &str, text: &str, inv: &Inventory) -> Result<(), DocumentError> {
    let at_nodes = || locate(text, "nodes:", 0).or_else(|| locate(text, "inventory:", 0));
    if inv.nodes.is_empty() {
        return Err(DocumentError::at(
            file,
            at_nodes(),
            "spec.inventory.nodes is empty; list every node of the cluster, or remove spec.inventory",
        ));
    }
    if inv.nodes.len() > MAX_INVENTORY_NODES {
        return Err(DocumentError::at(
            file,
            at_nodes(),
            format!(
                "spec.inventory lists {} nodes; at most {MAX_INVENTORY_NODES}",
                inv.nodes.len()
            ),
        ));
    }
    let mut names = BTreeSet::new();
    let mut addresses = std::collections::BTreeMap::new();
    for (i, n) in inv.nodes.iter().enumerate() {
        let at_name = || {
            locate(text, &format!("name: {}", n.name), 0)
                .or_else(|| locate(text, &format!("name: \"{}\"", n.name), 0))
                .or_else(|| locate(text, &format!("name: '{}'", n.name), 0))
                .or_else(at_nodes)
        };
        if let Err(why) = check_node_name(&n.name) {
            return Err(DocumentError::at(
                file,
                at_name(),
                format!(
                    "spec.inventory.nodes[{i}].name `{}` is not a valid Kubernetes node name: {why}",
                    excerpt(&n.name, 64)
                ),
            ));
        }
        if !names.insert(n.name.as_str()) {
            return Err(DocumentError::at(
                file,
                locate(text, &format!("name: {}", n.name), 1).or_else(at_nodes),
                format!(
                    "spec.inventory.nodes[{i}]: node `{}` is listed twice",
                    n.name
                ),
            ));
        }
        if let Some(addr) = &n.address {
            let at_addr = || locate(text, &format!("address: {addr}"), 0).or_else(at_name);
            let ip: std::net::IpAddr = addr.parse().map_err(|_| {
                DocumentError::at(
                    file,
                    at_addr(),
                    format!(
                        "spec.inventory.nodes[{i}].address `{}` is not an IP address; expected e.g. 10.0.10.11 or fd00::11, without a port",
                        excerpt(addr, 64)
                    ),
                )
            })?;
            if let Some(other) = addresses.insert(ip, n.name.as_str()) {
                return Err(DocumentError::at(
                    file,
                    at_addr(),
                    format!(
                        "spec.inventory.nodes[{i}].address {ip} is also the address of `{other}`; each node has its own"
                    ),
                ));
            }
        }
        for (j, v) in n.volumes.iter().enumerate() {
            if let Err(why) = check_node_name(v) {
                return Err(DocumentError::at(
                    file,
                    at_name(),
                    format!(
                        "spec.inventory.nodes[{i}].volumes[{j}] `{}` is not a valid volume name: {why}",
                        excerpt(v, 64)
                    ),
                ));
            }
        }
    }
    if !inv.nodes.iter().any(|n| n.role == Role::Controlplane) {
        return Err(DocumentError::at(
            file,
            locate(text, "inventory:", 0),
            "spec.inventory lists no node with role controlplane; a Talos cluster has at least one",
        ));
    }
    Ok(())
}

/// A Kubernetes object name (DNS-1123 subdomain), as Node, PV and Longhorn volume names are.
pub fn check_node_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 253 {
        return Err("longer than 253 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err("only lower-case letters, digits, `-` and `.` are allowed");
    }
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name
        .split('.')
        .any(|l| l.len() > 63 || !alnum(l.bytes().next()) || !alnum(l.bytes().last()))
    {
        return Err("each dot-separated part must start and end with a letter or digit (at most 63 characters)");
    }
    Ok(())
}

/// A Talos API endpoint as talosconfig takes it: a host name or IP, optionally with a port.
fn check_endpoint(e: &str) -> Result<(), String> {
    if e.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if let Ok(sock) = e.parse::<std::net::SocketAddr>() {
        return match sock.port() {
            0 => Err("port 0 is not a port".into()),
            _ => Ok(()),
        };
    }
    let (host, port) = match e.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (e, None),
    };
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => {}
            _ => return Err(format!("`{}` is not a port (1–65535)", excerpt(p, 12))),
        }
    }
    if host.parse::<std::net::Ipv4Addr>().is_err()
        && host
            .split('.')
            .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("not a valid IPv4 address".into());
    }
    check_node_name(&host.to_ascii_lowercase()).map_err(|why| {
        format!("expected an IP address or host name, optionally with :port ({why})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RS: &str = "apiVersion: ichor.dev/v1alpha1
kind: ReleaseSet
metadata:
  name: homelab
spec:
  talos: v1.13.8
  kubernetes: 1.35.4
  cni:
    name: cilium
    version: 1.19.6
  addons:
    - name: cert-manager
      version: v1.21.0
";

    #[test]
    fn parses_a_release_set() {
        let rs = ReleaseSet::parse("release-set.yaml", RS).unwrap();
        assert_eq!(rs.spec.talos.tag(), "v1.13.8");
        assert_eq!(rs.spec.kubernetes.tag(), "v1.35.4");
        assert_eq!(rs.spec.kubernetes.original(), "1.35.4");
        assert_eq!(rs.spec.addons[0].name, "cert-manager");
    }

    #[test]
    fn unknown_field_names_file_line_and_column() {
        let text = RS.replace("  kubernetes: 1.35.4", "  kubernets: 1.35.4");
        let e = ReleaseSet::parse("clusters/homelab/release-set.yaml", &text).unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
        assert!(e.message.contains("unknown field `kubernets`"), "{e}");
        assert!(e.message.contains("expected one of"), "{e}");
        assert!(
            e.to_string()
                .starts_with("clusters/homelab/release-set.yaml:7:"),
            "{e}"
        );
    }

    #[test]
    fn bad_version_names_its_line() {
        let text = RS.replace("1.35.4", "1.35");
        let e = ReleaseSet::parse("rs.yaml", &text).unwrap_err();
        assert_eq!(e.line, Some(7), "{e}");
        assert!(e.message.contains("invalid version `1.35`"), "{e}");
    }

    #[test]
    fn wrong_kind_and_api_version_are_refused() {
        let e = ReleaseSet::parse("rs.yaml", &RS.replace("kind: ReleaseSet", "kind: Cluster"))
            .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("expected `ReleaseSet`"), "{e}");
        let e = ReleaseSet::parse("rs.yaml", &RS.replace("ichor.dev/v1alpha1", "ichor.dev/v2"))
            .unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
    }

    #[test]
    fn duplicate_addon_is_refused_at_its_second_line() {
        let text = format!("{RS}    - name: cert-manager\n      version: v1.20.0\n");
        let e = ReleaseSet::parse("rs.yaml", &text).unwrap_err();
        assert_eq!(e.line, Some(14), "{e}");
        assert!(e.message.contains("listed twice"), "{e}");
    }

    #[test]
    fn empty_document_says_what_is_expected() {
        let e = ReleaseSet::parse("rs.yaml", "").unwrap_err();
        assert!(
            e.message.contains("expected") || e.message.contains("missing"),
            "{e}"
        );
    }

    const CL: &str = "apiVersion: ichor.dev/v1alpha1
kind: Cluster
metadata:
  name: homelab
spec:
  talos:
    endpoints: [10.0.0.11]
    installerImage: factory.talos.dev/metal-installer/abc
  rollout:
    maxUnavailable: 2
    drainTimeout: 15m
    maintenanceWindows:
      - days: [sat, sun]
        start: \"02:00\"
        duration: 4h
  volumes:
    provider: longhorn
  inventory:
    nodes:
      - name: cp-1
        role: controlplane
      - name: w-1
        role: worker
        volumes: [pvc-a]
";

    #[test]
    fn parses_a_cluster_with_defaults() {
        let c = Cluster::parse("cluster.yaml", CL).unwrap();
        assert_eq!(c.spec.rollout.max_unavailable.get(), 2);
        assert_eq!(c.spec.rollout.drain_timeout.0.as_secs(), 900);
        assert_eq!(c.spec.rollout.node_timeout.0.as_secs(), 1800);
        assert_eq!(c.spec.volumes.provider, VolumeProvider::Longhorn);
        assert_eq!(c.spec.cni.handover.mode, HandoverMode::Disabled);
        assert_eq!(c.spec.inventory.unwrap().nodes[1].volumes, vec!["pvc-a"]);
    }

    #[test]
    fn cluster_errors_are_specific() {
        let e = Cluster::parse(
            "c.yaml",
            &CL.replace("maxUnavailable: 2", "maxUnavailable: 0"),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(10), "{e}");
        assert!(e.message.contains("nonzero"), "{e}");
        let e = Cluster::parse(
            "c.yaml",
            &CL.replace("drainTimeout: 15m", "drainTimeout: 15"),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(11), "{e}");
        let e = Cluster::parse(
            "c.yaml",
            &CL.replace("metal-installer/abc", "metal-installer/abc:v1.13.8"),
        )
        .unwrap_err();
        assert_eq!(e.line, Some(8), "{e}");
        let e = Cluster::parse(
            "c.yaml",
            &CL.replace("provider: longhorn", "provider: ceph"),
        )
        .unwrap_err();
        assert!(
            e.message
                .contains("expected one of `longhorn`, `local-path`, `none`"),
            "{e}"
        );
        let e = Cluster::parse("c.yaml", &CL.replace("name: w-1", "name: cp-1")).unwrap_err();
        assert!(e.message.contains("listed twice"), "{e}");
        assert_eq!(e.line, Some(22), "{e}");
        let e = Cluster::parse("c.yaml", &CL.replace("\"02:00\"", "\"25:00\"")).unwrap_err();
        assert_eq!(e.line, Some(14), "{e}");
    }

    #[test]
    fn inventories_that_cannot_be_real_are_refused_with_their_line() {
        let bad = |from: &str, to: &str, want: &str, line: usize| {
            let e = Cluster::parse("c.yaml", &CL.replace(from, to)).unwrap_err();
            assert!(e.message.contains(want), "{to:?}: {e}");
            assert_eq!(e.line, Some(line), "{to:?}: {e}");
        };
        let nodes = CL.find("    nodes:").unwrap();
        let e = Cluster::parse("c.yaml", &format!("{}    nodes: []\n", &CL[..nodes])).unwrap_err();
        assert!(e.message.contains("nodes is empty"), "{e}");
        bad(
            "name: w-1",
            "name: \"CP 1/../x\"",
            "not a valid Kubernetes node name",
            22,
        );
        bad(
            "name: w-1",
            "name: \"w-1\\nrole: x\"",
            "not a valid Kubernetes node name",
            19,
        );
        bad("name: w-1", "name: W-1", "lower-case", 22);
        bad(
            "role: worker",
            "role: worker\n        address: 10.0.10.300",
            "not an IP address",
            24,
        );
        bad(
            "role: worker",
            "role: worker\n        address: not-an-ip",
            "not an IP address",
            24,
        );
        bad(
            "role: worker",
            "role: worker\n        address: ''",
            "not an IP address",
            24,
        );
        bad(
            "role: worker",
            "role: worker\n        address: 10.0.10.5:50000",
            "without a port",
            24,
        );
        let twice = CL
            .replace(
                "role: controlplane",
                "role: controlplane\n        address: 10.0.0.1",
            )
            .replace("role: worker", "role: worker\n        address: 10.0.0.1");
        let e = Cluster::parse("c.yaml", &twice).unwrap_err();
        assert!(e.message.contains("also the address of `cp-1`"), "{e}");
        bad(
            "volumes: [pvc-a]",
            "volumes: [\"pvc a`\"]",
            "not a valid volume name",
            22,
        );
        bad(
            "endpoints: [10.0.0.11]",
            "endpoints: [\"10.0.0.11:99999\"]",
            "not a port",
            7,
        );
        bad(
            "endpoints: [10.0.0.11]",
            "endpoints: [10.0.0.300]",
            "IPv4",
            7,
        );
        for ok in [
            "10.0.0.11:50000",
            "cp.example.com",
            "[fd00::1]:50000",
            "fd00::1",
        ] {
            Cluster::parse("c.yaml", &CL.replace("[10.0.0.11]", &format!("[\"{ok}\"]")))
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn contradictory_rollout_settings_are_refused_or_warned() {
        let e = Cluster::parse(
            "c.yaml",
            &CL.replace(
                "drainTimeout: 15m",
                "drainTimeout: 15m\n    nodeTimeout: 10m",
            ),
        )
        .unwrap_err();
        assert!(
            e.message.contains("shorter than spec.rollout.drainTimeout"),
            "{e}"
        );
        assert_eq!(e.line, Some(12), "{e}");
        let c = Cluster::parse("c.yaml", &CL.replace("duration: 4h", "duration: 5m")).unwrap();
        let w = c.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("maintenanceWindows[0] lasts 5m"), "{w:?}");
        assert!(Cluster::parse("c.yaml", CL).unwrap().warnings().is_empty());
        let e = Cluster::parse(
            "c.yaml",
            &CL.replace("drainTimeout: 15m", "drainTimeout: 18446744073709551615s"),
        )
        .unwrap_err();
        assert!(e.message.contains("longer than 366 days"), "{e}");
    }
}

/// A node as the gate and the plan see it: from the static inventory today, from the live
/// cluster once ichor talks to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Node {
    pub name: String,
    pub role: Role,
    pub talos: Version,
    pub kubelet: Version,
    pub volumes: Vec<String>,
}

impl Inventory {
    /// Nodes with their versions, defaulting to what the base release set declares.
    pub fn resolve(&self, base: &ReleaseSet) -> Vec<Node> {
        self.nodes
            .iter()
            .map(|n| Node {
                name: n.name.clone(),
                role: n.role,
                talos: n.talos.clone().unwrap_or_else(|| base.spec.talos.clone()),
                kubelet: n
                    .kubelet
                    .clone()
                    .unwrap_or_else(|| base.spec.kubernetes.clone()),
                volumes: n.volumes.clone(),
            })
            .collect()
    }
}
