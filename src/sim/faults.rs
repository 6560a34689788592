//! The fault document, one schema for both ways in: the `faults:` section of
//! `ichor sim --config FILE` and the body of `POST /_twin/faults` on the Kubernetes API.
//! [`FaultsConfig::validate`] is the one validator: every number is bounded, every node,
//! PodDisruptionBudget and Longhorn volume named must exist, and each error names its field
//! and what was expected.
//!
//! At run time each field given replaces that fault's current setting (an empty list or
//! map clears it, `apiErrorBurst: {count: 0}` ends a burst); fields not given are left as
//! they are ([`given_fields`] tells which were). `stealLease` exists only at run time.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::releaseset::HumanDuration;

/// Bounds on fault settings.
pub mod limits {
    use std::time::Duration;

    /// Requests an `apiErrorBurst` may fail, webhooks `droppedWebhooks` may drop.
    pub const MAX_COUNT: u64 = 1_000_000;
    /// `apiErrorBurst.retryAfter`.
    pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
    /// `slowApply` delays (and, in the config, every timing).
    pub const MAX_DURATION: Duration = Duration::from_secs(7 * 86_400);
    /// Entries of any one list or map.
    pub const MAX_ENTRIES: usize = 1000;
    /// Length of an image reference or other name.
    pub const MAX_NAME: usize = 1024;
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FaultsConfig {
    /// Nodes that go down and never come back.
    #[serde(default)]
    pub nodes_never_return: Vec<String>,
    /// Nodes whose ApplyConfiguration blocks this long before acting.
    #[serde(default)]
    pub slow_apply: BTreeMap<String, HumanDuration>,
    /// Nodes whose legacy MachineService/Upgrade pulls its installer this long (instead of
    /// `timings.installerPull`) inside the call.
    #[serde(default)]
    pub slow_installer_pull: BTreeMap<String, HumanDuration>,
    /// Image references whose pull fails with NotFound.
    #[serde(default)]
    pub failing_images: Vec<String>,
    /// PodDisruptionBudgets (`namespace/name`) that never allow a disruption.
    #[serde(default)]
    pub pdbs_never_allow: Vec<String>,
    /// The next N Kubernetes API requests fail with this status (500 or 429).
    #[serde(default)]
    pub api_error_burst: Option<ApiBurst>,
    /// The next N webhooks of the GitHub emulator are dropped.
    #[serde(default)]
    pub dropped_webhooks: u64,
    /// Control planes whose etcd member is cut off from its peers: it stays in the member
    /// list, reports no leader in EtcdStatus, and counts as down for quorum.
    #[serde(default)]
    pub etcd_unhealthy: Vec<String>,
    /// Hostnames of etcd members with no machine behind them (a replaced control plane never
    /// removed): each stays in the member list, counts toward quorum, and answers nothing.
    #[serde(default)]
    pub etcd_stale_members: Vec<String>,
    /// Nodes whose kubelet stops posting status while the machine stays up: the Node goes
    /// NotReady once the node-monitor grace period passes.
    #[serde(default)]
    pub kubelet_down: Vec<String>,
    /// Nodes whose installs boot this Talos version instead of the one installed (an
    /// installer whose tag does not match its content, or a fallback to the old partition).
    #[serde(default)]
    pub wrong_version: BTreeMap<String, String>,
    /// Node → the exit code its installer ends with (LifecycleService/Upgrade), as Talos 1.14
    /// installers report a class of failure (2 invalid input … 7 install; 1 unclassified).
    #[serde(default)]
    pub installer_exit_code: BTreeMap<String, i64>,
    /// Node → a STAGED configuration pending on it: the active configuration with these
    /// dotted v1alpha1 paths (`machine.network.hostname`) set to these values.
    #[serde(default)]
    pub staged_config: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// Node → a TRY configuration an operator applied to it (`talosctl apply-config --mode
    /// try`): the active configuration with these dotted v1alpha1 paths set, rolled back
    /// after `tryTimeout`.
    #[serde(default)]
    pub try_config: BTreeMap<String, BTreeMap<String, serde_json::Value>>,
    /// Control plane → how long its etcd member takes to catch up after each boot: its
    /// kubelet is Ready at once, its member (and Talos's MachineStatus) only then.
    #[serde(default)]
    pub etcd_catch_up: BTreeMap<String, HumanDuration>,
    /// How long a `tryConfig` runs before Talos rolls it back (default 1m, Talos's
    /// `constants.ConfigTryTimeout`), on the twin's clock.
    #[serde(default)]
    pub try_timeout: Option<HumanDuration>,
    /// Longhorn volumes whose failed replicas are never rebuilt: not where they were once the
    /// node returns, nor elsewhere.
    #[serde(default)]
    pub replicas_never_rebuild: Vec<String>,
    /// Run time only: another holder takes over a Lease.
    #[serde(default)]
    pub steal_lease: Option<StealLease>,
    /// Run time only, the endpoint's older form: one PodDisruptionBudget on or off.
    #[serde(default)]
    pub pdb_never_allows: Option<PdbToggle>,
    /// Run time only, the older form of `apiErrorBurst`: `failNext` requests fail with
    /// `code` (default 500), 429s with `Retry-After: retryAfterSeconds` (default 1).
    #[serde(default)]
    pub fail_next: Option<u64>,
    #[serde(default)]
    pub code: Option<u64>,
    #[serde(default)]
    pub retry_after_seconds: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PdbToggle {
    pub namespace: String,
    pub name: String,
    #[serde(default = "default_on")]
    pub on: bool,
}

fn default_on() -> bool {
    true
}

/// The document's field names (camelCase) that appear in `doc`, a map: at run time only
/// those replace the current faults.
pub fn given_fields<'a>(keys: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    keys.into_iter().map(str::to_string).collect()
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiBurst {
    pub count: u64,
    #[serde(default = "default_burst_status")]
    pub status: u64,
    #[serde(default)]
    pub retry_after: Option<HumanDuration>,
}

fn default_burst_status() -> u64 {
    500
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StealLease {
    pub namespace: String,
    pub name: String,
    pub holder: String,
}

/// What the faults may name, and which sides of the twin exist.
#[derive(Debug, Clone, Default)]
pub struct FaultTargets {
    /// Talos nodes by name; `None` when the twin has no Talos side.
    pub nodes: Option<BTreeSet<String>>,
    /// The control planes among `nodes` (the nodes that run an etcd member).
    pub control_planes: BTreeSet<String>,
    /// Longhorn volumes by name.
    pub volumes: BTreeSet<String>,
    /// PodDisruptionBudgets as `namespace/name`.
    pub pdbs: BTreeSet<String>,
    /// Whether a GitHub emulator runs.
    pub github: bool,
}

/// The sides of the twin the Kubernetes API's fault endpoint does not own (the Talos
/// machines, the GitHub emulator); the whole twin installs one on its Kubernetes side.
pub trait FaultHook: Send + Sync {
    /// The Talos node names.
    fn nodes(&self) -> BTreeSet<String>;
    /// The Talos control planes (each runs an etcd member).
    fn control_planes(&self) -> BTreeSet<String>;
    /// Whether a GitHub emulator runs.
    fn github(&self) -> bool;
    /// Applies the Talos and GitHub fields of a validated document that are `given`.
    fn apply(&self, faults: &FaultsConfig, given: &BTreeSet<String>);
}

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path from the document root, e.g. `faults.apiErrorBurst.status`.
    pub field: String,
    pub message: String,
}

/// Every invalid field of a faults document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FaultError(pub Vec<FieldError>);

impl fmt::Display for FaultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.message)?;
        }
        Ok(())
    }
}

/// Where the document came from: the config file refuses run-time-only fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Config,
    Runtime,
}

impl FaultsConfig {
    /// Checks the document; `prefix` is the path of its root (`faults` in the config file,
    /// empty for the endpoint body).
    pub fn validate(
        &self,
        targets: &FaultTargets,
        origin: Origin,
        prefix: &str,
    ) -> Result<(), FaultError> {
        let mut errors = Vec::new();
        let path = |field: &str| {
            if prefix.is_empty() {
                field.to_string()
            } else {
                format!("{prefix}.{field}")
            }
        };
        let mut bad = |field: String, message: String| errors.push(FieldError { field, message });
        let check_node =
            |field: String, node: &str, bad: &mut dyn FnMut(String, String)| match &targets.nodes {
                None => bad(field, "this twin has no Talos side".to_string()),
                Some(nodes) if !nodes.contains(node) => bad(
                    field,
                    format!(
                        "no node {node:?} in the inventory (expected one of: {})",
                        nodes.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ),
                Some(_) => {}
            };
        {
            let list = &self.nodes_never_return;
            let field = path("nodesNeverReturn");
            if list.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(list.len()));
            }
            for (i, n) in list.iter().enumerate().take(limits::MAX_ENTRIES) {
                check_node(format!("{field}[{i}]"), n, &mut bad);
            }
        }
        {
            let map = &self.slow_apply;
            let field = path("slowApply");
            if map.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(map.len()));
            }
            for (n, d) in map.iter().take(limits::MAX_ENTRIES) {
                check_node(format!("{field}.{n}"), n, &mut bad);
                if d.0 > limits::MAX_DURATION {
                    bad(format!("{field}.{n}"), too_long(d.0, limits::MAX_DURATION));
                }
            }
        }
        {
            let map = &self.slow_installer_pull;
            let field = path("slowInstallerPull");
            if map.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(map.len()));
            }
            for (n, d) in map.iter().take(limits::MAX_ENTRIES) {
                check_node(format!("{field}.{n}"), n, &mut bad);
                if d.0 > limits::MAX_DURATION {
                    bad(format!("{field}.{n}"), too_long(d.0, limits::MAX_DURATION));
                }
            }
        }
        {
            let list = &self.failing_images;
            let field = path("failingImages");
            if list.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(list.len()));
            }
            if targets.nodes.is_none() && !list.is_empty() {
                bad(field.clone(), "this twin has no Talos side".to_string());
            }
            for (i, image) in list.iter().enumerate().take(limits::MAX_ENTRIES) {
                if image.is_empty() || image.len() > limits::MAX_NAME {
                    bad(
                        format!("{field}[{i}]"),
                        format!(
                            "expected an image reference of 1 to {} characters",
                            limits::MAX_NAME
                        ),
                    );
                }
            }
        }
        {
            let list = &self.pdbs_never_allow;
            let field = path("pdbsNeverAllow");
            if list.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(list.len()));
            }
            for (i, p) in list.iter().enumerate().take(limits::MAX_ENTRIES) {
                let field = format!("{field}[{i}]");
                match p.split_once('/') {
                    Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
                        if !targets.pdbs.contains(p) {
                            bad(
                                field,
                                format!(
                                    "no PodDisruptionBudget {name:?} in namespace {ns:?} (the cluster has: {})",
                                    if targets.pdbs.is_empty() {
                                        "none".to_string()
                                    } else {
                                        targets.pdbs.iter().cloned().collect::<Vec<_>>().join(", ")
                                    }
                                ),
                            );
                        }
                    }
                    _ => bad(field, format!("{p:?} is not namespace/name")),
                }
            }
        }
        if let Some(b) = &self.api_error_burst {
            let field = path("apiErrorBurst");
            if b.count > limits::MAX_COUNT {
                bad(
                    format!("{field}.count"),
                    format!(
                        "{} is out of range: expected 0 to {}",
                        b.count,
                        limits::MAX_COUNT
                    ),
                );
            }
            if b.status != 429 && b.status != 500 {
                bad(
                    format!("{field}.status"),
                    format!(
                        "{} is not a status the twin injects: expected 429 or 500",
                        b.status
                    ),
                );
            }
            if let Some(d) = b.retry_after {
                if d.0 > limits::MAX_RETRY_AFTER {
                    bad(
                        format!("{field}.retryAfter"),
                        too_long(d.0, limits::MAX_RETRY_AFTER),
                    );
                }
            }
        }
        {
            let list = &self.etcd_unhealthy;
            let field = path("etcdUnhealthy");
            if list.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(list.len()));
            }
            for (i, n) in list.iter().enumerate().take(limits::MAX_ENTRIES) {
                let field = format!("{field}[{i}]");
                match &targets.nodes {
                    Some(nodes) if nodes.contains(n) && !targets.control_planes.contains(n) => {
                        bad(
                            field,
                            format!(
                                "{n:?} is a worker: only control planes run an etcd member (expected one of: {})",
                                joined(&targets.control_planes)
                            ),
                        )
                    }
                    _ => check_node(field, n, &mut bad),
                }
            }
        }
        {
            let map = &self.etcd_catch_up;
            let field = path("etcdCatchUp");
            if map.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(map.len()));
            }
            for (n, d) in map.iter().take(limits::MAX_ENTRIES) {
                let field = format!("{field}.{n}");
                match &targets.nodes {
                    Some(nodes) if nodes.contains(n) && !targets.control_planes.contains(n) => {
                        bad(
                            field.clone(),
                            format!(
                                "{n:?} is a worker: only control planes run an etcd member (expected one of: {})",
                                joined(&targets.control_planes)
                            ),
                        )
                    }
                    _ => check_node(field.clone(), n, &mut bad),
                }
                if d.0 > limits::MAX_DURATION {
                    bad(field, too_long(d.0, limits::MAX_DURATION));
                }
            }
        }
        {
            let list = &self.etcd_stale_members;
            let field = path("etcdStaleMembers");
            if list.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(list.len()));
            }
            if targets.nodes.is_none() && !list.is_empty() {
                bad(field.clone(), "this twin has no Talos side".to_string());
            }
            for (i, h) in list.iter().enumerate().take(limits::MAX_ENTRIES) {
                let field = format!("{field}[{i}]");
                let hostname = !h.is_empty()
                    && h.len() <= 253
                    && h.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
                if !hostname {
                    bad(
                        field,
                        "expected a hostname (letters, digits, '-' and '.', at most 253)"
                            .to_string(),
                    );
                } else if targets.control_planes.contains(h) {
                    bad(
                        field,
                        format!(
                            "{h:?} is a running control plane with its own member; a stale member is one no machine answers for"
                        ),
                    );
                }
            }
        }
        {
            let list = &self.kubelet_down;
            let field = path("kubeletDown");
            if list.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(list.len()));
            }
            for (i, n) in list.iter().enumerate().take(limits::MAX_ENTRIES) {
                check_node(format!("{field}[{i}]"), n, &mut bad);
            }
        }
        {
            let map = &self.wrong_version;
            let field = path("wrongVersion");
            if map.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(map.len()));
            }
            for (n, v) in map.iter().take(limits::MAX_ENTRIES) {
                let field = format!("{field}.{n}");
                check_node(field.clone(), n, &mut bad);
                if let Err(why) = talos_tag(v) {
                    bad(field, why);
                }
            }
        }
        {
            let map = &self.installer_exit_code;
            let field = path("installerExitCode");
            if map.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(map.len()));
            }
            for (n, code) in map.iter().take(limits::MAX_ENTRIES) {
                let field = format!("{field}.{n}");
                check_node(field.clone(), n, &mut bad);
                if !(1..=255).contains(code) {
                    bad(
                        field,
                        format!("{code} is not an exit code of a failure: expected 1 to 255"),
                    );
                }
            }
        }
        {
            let map = &self.staged_config;
            let field = path("stagedConfig");
            if map.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(map.len()));
            }
            for (n, paths) in map.iter().take(limits::MAX_ENTRIES) {
                let field = format!("{field}.{n}");
                check_node(field.clone(), n, &mut bad);
                if paths.is_empty() || paths.len() > limits::MAX_ENTRIES {
                    bad(
                        field.clone(),
                        format!(
                            "expected 1 to {} paths of the v1alpha1 document",
                            limits::MAX_ENTRIES
                        ),
                    );
                }
                for p in paths.keys().take(limits::MAX_ENTRIES) {
                    let segments: Vec<&str> = p.split('.').collect();
                    if p.len() > limits::MAX_NAME
                        || segments.len() < 2
                        || segments.len() > 16
                        || segments.iter().any(|s| s.is_empty())
                        || !matches!(segments[0], "machine" | "cluster")
                    {
                        bad(
                            format!("{field}.{p}"),
                            "expected a dotted path under machine or cluster, like machine.network.hostname"
                                .to_string(),
                        );
                    }
                }
            }
        }
        {
            let map = &self.try_config;
            let field = path("tryConfig");
            if map.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(map.len()));
            }
            for (n, paths) in map.iter().take(limits::MAX_ENTRIES) {
                let field = format!("{field}.{n}");
                check_node(field.clone(), n, &mut bad);
                if paths.is_empty() || paths.len() > limits::MAX_ENTRIES {
                    bad(
                        field.clone(),
                        format!(
                            "expected 1 to {} paths of the v1alpha1 document",
                            limits::MAX_ENTRIES
                        ),
                    );
                }
                for p in paths.keys().take(limits::MAX_ENTRIES) {
                    if !config_path(p) {
                        bad(
                            format!("{field}.{p}"),
                            "expected a dotted path under machine or cluster, like machine.network.hostname"
                                .to_string(),
                        );
                    }
                }
            }
            if let Some(d) = self.try_timeout {
                if d.0.is_zero() || d.0 > limits::MAX_DURATION {
                    bad(
                        path("tryTimeout"),
                        format!(
                            "expected more than 0s and at most {}s",
                            limits::MAX_DURATION.as_secs()
                        ),
                    );
                }
            }
        }
        {
            let list = &self.replicas_never_rebuild;
            let field = path("replicasNeverRebuild");
            if list.len() > limits::MAX_ENTRIES {
                bad(field.clone(), too_many(list.len()));
            }
            for (i, v) in list.iter().enumerate().take(limits::MAX_ENTRIES) {
                if !targets.volumes.contains(v) {
                    bad(
                        format!("{field}[{i}]"),
                        format!(
                            "no Longhorn volume {v:?} (the cluster has: {})",
                            if targets.volumes.is_empty() {
                                "none".to_string()
                            } else {
                                joined(&targets.volumes)
                            }
                        ),
                    );
                }
            }
        }
        {
            let n = self.dropped_webhooks;
            let field = path("droppedWebhooks");
            if n > limits::MAX_COUNT {
                bad(
                    field.clone(),
                    format!("{n} is out of range: expected 0 to {}", limits::MAX_COUNT),
                );
            }
            if origin == Origin::Runtime && !targets.github && n > 0 {
                bad(field, "this twin runs no GitHub emulator".to_string());
            }
        }
        let runtime_only = |field: String, bad: &mut dyn FnMut(String, String)| {
            bad(
                field,
                "only at run time (POST /_twin/faults); the config file uses pdbsNeverAllow and apiErrorBurst".to_string(),
            )
        };
        if let Some(t) = &self.pdb_never_allows {
            let field = path("pdbNeverAllows");
            if origin == Origin::Config {
                runtime_only(field, &mut bad);
            } else if !targets
                .pdbs
                .contains(&format!("{}/{}", t.namespace, t.name))
            {
                bad(
                    field,
                    format!(
                        "no PodDisruptionBudget {:?} in namespace {:?}",
                        t.name, t.namespace
                    ),
                );
            }
        }
        for (name, v) in [
            ("failNext", self.fail_next),
            ("code", self.code),
            ("retryAfterSeconds", self.retry_after_seconds),
        ] {
            if v.is_some() && origin == Origin::Config {
                runtime_only(path(name), &mut bad);
            }
        }
        if origin == Origin::Runtime {
            if let Some(n) = self.fail_next.filter(|n| *n > limits::MAX_COUNT) {
                bad(
                    path("failNext"),
                    format!("{n} is out of range: expected 0 to {}", limits::MAX_COUNT),
                );
            }
            if let Some(c) = self.code.filter(|c| *c != 429 && *c != 500) {
                bad(
                    path("code"),
                    format!("{c} is not a status the twin injects: expected 429 or 500"),
                );
            }
            if let Some(r) = self
                .retry_after_seconds
                .filter(|r| *r > limits::MAX_RETRY_AFTER.as_secs())
            {
                bad(
                    path("retryAfterSeconds"),
                    format!(
                        "{r} is too long: expected at most {}",
                        limits::MAX_RETRY_AFTER.as_secs()
                    ),
                );
            }
            if self.fail_next.is_none()
                && (self.code.is_some() || self.retry_after_seconds.is_some())
            {
                bad(
                    path("failNext"),
                    "is required with code and retryAfterSeconds".to_string(),
                );
            }
        }
        if let Some(s) = &self.steal_lease {
            let field = path("stealLease");
            if origin == Origin::Config {
                bad(
                    field,
                    "only at run time (POST /_twin/faults), once the Lease exists".to_string(),
                );
            } else if s.namespace.is_empty() || s.name.is_empty() || s.holder.is_empty() {
                bad(
                    field,
                    "expected a namespace, a name and a holder, none empty".to_string(),
                );
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(FaultError(errors))
        }
    }

    /// Whether a run-time request with these `given` fields changes the Talos side.
    pub fn touches_talos(given: &BTreeSet<String>) -> bool {
        [
            "nodesNeverReturn",
            "slowApply",
            "slowInstallerPull",
            "failingImages",
            "etcdUnhealthy",
            "etcdStaleMembers",
            "wrongVersion",
            "installerExitCode",
            "stagedConfig",
            "tryConfig",
            "etcdCatchUp",
        ]
        .iter()
        .any(|f| given.contains(*f))
    }
}

/// A dotted path of the v1alpha1 document a fault may set (`machine.network.hostname`).
fn config_path(p: &str) -> bool {
    let segments: Vec<&str> = p.split('.').collect();
    p.len() <= limits::MAX_NAME
        && (2..=16).contains(&segments.len())
        && segments.iter().all(|s| !s.is_empty())
        && matches!(segments[0], "machine" | "cluster")
}

fn joined(names: &BTreeSet<String>) -> String {
    names.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// A Talos version tag as the twin boots it: `v` and a semantic version (`v1.12.6`,
/// `v1.13.0-beta.1`); its normalised form, or why not.
pub fn talos_tag(v: &str) -> Result<String, String> {
    let expected = "expected a Talos version tag like v1.12.6";
    // Echo at most a short excerpt of what was given.
    let shown: String = v.chars().take(40).collect();
    let shown = if shown.len() < v.len() {
        format!("{shown:?}…")
    } else {
        format!("{shown:?}")
    };
    if !v.starts_with('v') {
        return Err(format!("{shown} is not a version tag: {expected}"));
    }
    match crate::releaseset::Version::parse(v) {
        Ok(parsed) => Ok(parsed.tag()),
        Err(e) => Err(format!(
            "{shown} is not a version tag ({}): {expected}",
            e.reason
        )),
    }
}

fn too_many(n: usize) -> String {
    format!(
        "{n} entries is too many: expected at most {}",
        limits::MAX_ENTRIES
    )
}

fn too_long(d: Duration, max: Duration) -> String {
    format!(
        "{} is too long: expected at most {}",
        HumanDuration(d),
        HumanDuration(max)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> FaultTargets {
        FaultTargets {
            nodes: Some(["cp-1".to_string(), "w-1".to_string()].into()),
            control_planes: ["cp-1".to_string()].into(),
            volumes: ["pvc-data".to_string()].into(),
            pdbs: ["default/web".to_string()].into(),
            github: false,
        }
    }

    fn parse(json: &str) -> Result<FaultsConfig, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn every_bad_field_is_named_with_what_was_expected() -> Result<(), serde_json::Error> {
        let f = parse(
            r#"{"nodesNeverReturn": ["nope"], "pdbsNeverAllow": ["nope/nope", "web"],
                "apiErrorBurst": {"count": 4294967297, "status": 70000},
                "droppedWebhooks": 3, "slowApply": {"w-1": "30d"}}"#,
        )?;
        let e = f
            .validate(&targets(), Origin::Runtime, "")
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        let fields: Vec<&str> = e.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "nodesNeverReturn[0]",
                "slowApply.w-1",
                "pdbsNeverAllow[0]",
                "pdbsNeverAllow[1]",
                "apiErrorBurst.count",
                "apiErrorBurst.status",
                "droppedWebhooks"
            ]
        );
        assert!(e[0].message.contains("expected one of: cp-1, w-1"));
        assert!(e[5].message.contains("expected 429 or 500"));
        Ok(())
    }

    #[test]
    fn the_config_refuses_the_same_things_and_run_time_only_fields() -> Result<(), serde_json::Error>
    {
        let f = parse(
            r#"{"pdbsNeverAllow": ["nope/nope"], "stealLease": {"namespace": "a", "name": "b", "holder": "c"}}"#,
        )?;
        let e = f.validate(&targets(), Origin::Config, "faults").err();
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("faults.pdbsNeverAllow[0]: no PodDisruptionBudget"),
            "{text}"
        );
        assert!(
            text.contains("faults.stealLease: only at run time"),
            "{text}"
        );
        assert!(parse(r#"{"nope": 1}"#).is_err());
        let ok = parse(
            r#"{"pdbsNeverAllow": ["default/web"], "apiErrorBurst": {"count": 5, "status": 429, "retryAfter": "2s"}}"#,
        )?;
        assert_eq!(ok.validate(&targets(), Origin::Config, "faults"), Ok(()));
        Ok(())
    }

    #[test]
    fn a_try_names_a_node_and_paths_and_its_timeout_is_bounded() -> Result<(), serde_json::Error> {
        let f = parse(
            r#"{"tryConfig": {"nope": {"machine.network.hostname": "x"}, "w-1": {"hostname": "x"}},
                "tryTimeout": "0s"}"#,
        )?;
        let e = f
            .validate(&targets(), Origin::Runtime, "")
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        let fields: Vec<&str> = e.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"tryConfig.nope"), "{fields:?}");
        assert!(fields.contains(&"tryConfig.w-1.hostname"), "{fields:?}");
        assert!(fields.contains(&"tryTimeout"), "{fields:?}");
        let ok = parse(
            r#"{"tryConfig": {"w-1": {"machine.network.hostname": "x"}}, "tryTimeout": "5m"}"#,
        )?;
        assert!(ok.validate(&targets(), Origin::Runtime, "").is_ok());
        Ok(())
    }

    #[test]
    fn the_etcd_version_and_volume_faults_name_what_exists() -> Result<(), serde_json::Error> {
        let f = parse(
            r#"{"etcdUnhealthy": ["w-1", "cp-9", "cp-1"],
                "wrongVersion": {"w-1": "1.12.6", "nope": "v1.12.6", "cp-1": "v1.12", "w-1x": "vx"},
                "replicasNeverRebuild": ["pvc-data", "pvc-nope"]}"#,
        )?;
        let e = f
            .validate(&targets(), Origin::Runtime, "")
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        let got: Vec<(&str, &str)> = e
            .iter()
            .map(|e| (e.field.as_str(), e.message.as_str()))
            .collect();
        let fields: Vec<&str> = got.iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            vec![
                "etcdUnhealthy[0]",
                "etcdUnhealthy[1]",
                "wrongVersion.cp-1",
                "wrongVersion.nope",
                "wrongVersion.w-1",
                "wrongVersion.w-1x",
                "wrongVersion.w-1x",
                "replicasNeverRebuild[1]",
            ],
            "{got:?}"
        );
        assert!(got[0].1.contains("is a worker") && got[0].1.contains("expected one of: cp-1"));
        assert!(got[1].1.contains("no node \"cp-9\""), "{}", got[1].1);
        assert!(
            got[2].1.contains("\"v1.12\" is not a version tag"),
            "{}",
            got[2].1
        );
        assert!(got[4]
            .1
            .contains("expected a Talos version tag like v1.12.6"));
        assert!(got[7]
            .1
            .contains("no Longhorn volume \"pvc-nope\" (the cluster has: pvc-data)"));
        // The config file refuses the same; fine ones pass.
        let text = f
            .validate(&targets(), Origin::Config, "faults")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains("faults.etcdUnhealthy[0]: "), "{text}");
        let ok = parse(
            r#"{"etcdUnhealthy": ["cp-1"], "wrongVersion": {"w-1": "v1.12.6"},
                "replicasNeverRebuild": ["pvc-data"]}"#,
        )?;
        assert_eq!(ok.validate(&targets(), Origin::Config, "faults"), Ok(()));
        // Without a Talos side, the Talos faults are refused; the volume one is not.
        let kube_only = FaultTargets {
            nodes: None,
            ..targets()
        };
        let e = ok
            .validate(&kube_only, Origin::Runtime, "")
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        let fields: Vec<&str> = e.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, vec!["etcdUnhealthy[0]", "wrongVersion.w-1"]);
        assert!(FaultsConfig::touches_talos(&given_fields(["wrongVersion"])));
        assert!(!FaultsConfig::touches_talos(&given_fields([
            "replicasNeverRebuild"
        ])));
        Ok(())
    }

    #[test]
    fn a_version_tag_is_normalised_and_a_long_one_is_not_echoed_whole() {
        assert_eq!(
            talos_tag("v1.13.0-beta.1"),
            Ok("v1.13.0-beta.1".to_string())
        );
        let long = format!("v{}", "9".repeat(5000));
        let e = talos_tag(&long).err().unwrap_or_default();
        assert!(e.len() < 300, "{e}");
        assert!(talos_tag("V1.2.3").is_err() && talos_tag("").is_err());
    }

    #[test]
    fn every_list_is_bounded() -> Result<(), serde_json::Error> {
        let many: Vec<String> = (0..=limits::MAX_ENTRIES)
            .map(|_| "cp-1".to_string())
            .collect();
        let f = FaultsConfig {
            etcd_unhealthy: many.clone(),
            replicas_never_rebuild: many,
            ..FaultsConfig::default()
        };
        let e = f
            .validate(&targets(), Origin::Runtime, "")
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert!(e
            .iter()
            .any(|e| e.field == "etcdUnhealthy" && e.message.contains("too many")));
        assert!(e
            .iter()
            .any(|e| e.field == "replicasNeverRebuild" && e.message.contains("too many")));
        Ok(())
    }
}
