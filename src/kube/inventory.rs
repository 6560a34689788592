//! What the cluster runs right now, read from the Kubernetes API: nodes (role, versions,
//! boot id, readiness, cordon, hold), volume placement (Longhorn replicas, node-local PVs),
//! the static pods' mirror pods, workloads such as the CNI's DaemonSet, the Argo CD
//! Application of the hand-over, the removed-API metric and the rollout lock's Lease.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

use super::{KubeClient, KubeError, CORDONED_BY_ICHOR, FIELD_MANAGER, HOLD};
use crate::releaseset::{Role, Version};

/// One node as the API server reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveNode {
    pub name: String,
    pub role: Role,
    pub internal_ip: Option<String>,
    /// `status.nodeInfo.kubeletVersion`, e.g. `v1.33.5`.
    pub kubelet: String,
    /// From `osImage` (`Talos (v1.12.6)`); `None` when the node is not Talos.
    pub talos: Option<String>,
    pub boot_id: String,
    pub ready: bool,
    pub cordoned: bool,
    /// ichor's mark is on it (the rollout that cordoned it is [`LiveNode::cordoned_for`]).
    pub cordoned_by_ichor: bool,
    /// The rollout (target commit) ichor's mark names; ichor uncordons only the nodes the
    /// running rollout cordoned.
    pub cordoned_for: Option<String>,
    /// The operator's hold annotation, with its value (the reason).
    pub hold: Option<String>,
}

impl LiveNode {
    /// As the gate and the plan take nodes: versions parsed, volumes added by the caller.
    pub fn to_node(&self, volumes: Vec<String>) -> Option<crate::releaseset::Node> {
        Some(crate::releaseset::Node {
            name: self.name.clone(),
            role: self.role,
            talos: Version::parse(self.talos.as_deref()?).ok()?,
            kubelet: Version::parse(&self.kubelet).ok()?,
            volumes,
        })
    }
}

/// A volume and the nodes holding its replicas.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveVolume {
    pub name: String,
    /// `longhorn` or `local` (a PV pinned to one node by its node affinity).
    pub provider: &'static str,
    /// Longhorn's `status.robustness` (`healthy`, `degraded`, `faulted`, `unknown`); `None`
    /// for local.
    pub robustness: Option<String>,
    /// Longhorn's `status.state` (`attached`, `detached`, ...); `None` for local.
    pub state: Option<String>,
    /// Nodes with a replica holding its data: running, or stopped (not failed) while the
    /// volume is detached.
    pub nodes: Vec<String>,
    /// Every node with a replica of it, failed or stopped included: a failed replica on a
    /// node that is down is reused once the node is back (longhorn-manager's replica
    /// reuse), so that node still holds the volume. "Never two holders of one volume down"
    /// counts these.
    pub holders: Vec<String>,
    /// Only one copy exists: its workload is down while that node is.
    pub single_replica: bool,
}

impl LiveVolume {
    /// A detached Longhorn volume is at rest: Longhorn stops its engine and replicas and
    /// reports its robustness `unknown` (longhorn-manager `controller/volume_controller.go`,
    /// v1.10), which says nothing about its copies.
    pub fn at_rest(&self) -> bool {
        self.state.as_deref() == Some("detached")
    }

    /// Fewer healthy copies than wanted, judged by the volume's own robustness; a volume at
    /// rest is not degraded.
    pub fn degraded(&self) -> bool {
        !self.at_rest() && self.robustness.as_deref().is_some_and(|r| r != "healthy")
    }
}

/// The mirror pod of a static pod (kube-apiserver, controller-manager, scheduler).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MirrorPod {
    pub node: String,
    pub component: String,
    pub image: String,
    pub ready: bool,
}

/// A DaemonSet's or Deployment's roll-out, and the version its image runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    pub namespace: String,
    pub name: String,
    pub desired: i32,
    pub updated: i32,
    pub ready: i32,
    pub images: Vec<String>,
    /// The first container image's tag, when it is a version.
    pub version: Option<String>,
    /// The status describes the current spec (`status.observedGeneration` has caught up
    /// with `metadata.generation`): until then its counts are the old template's.
    pub observed: bool,
}

impl WorkloadStatus {
    /// As `kubectl rollout status` judges it (kubernetes/kubectl pkg/polymorphichelpers/
    /// rollout_status.go at v0.33.0): the status observed the current generation, and every
    /// scheduled pod is updated and ready.
    pub fn rolled_out(&self) -> bool {
        self.observed && self.updated >= self.desired && self.ready >= self.desired
    }
}

/// An Argo CD Application's sync and health.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ApplicationStatus {
    pub sync: String,
    pub health: String,
}

impl ApplicationStatus {
    /// The hand-over is complete when Argo CD owns the CNI and it is in sync and healthy.
    pub fn complete(&self) -> bool {
        self.sync == "Synced" && self.health == "Healthy"
    }
}

/// One series of `apiserver_requested_deprecated_apis`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeprecatedApi {
    pub group: String,
    pub version: String,
    pub resource: String,
    /// The Kubernetes minor that removes it (`1.25`), when the metric says.
    pub removed_release: Option<String>,
}

/// Who holds a Lease, and until when (RFC 3339 renew time + duration).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseHolder {
    pub holder: String,
    pub renew_time: Option<String>,
    pub duration_secs: Option<i32>,
}

/// Longhorn's label naming a replica's node, and its volume (longhorn-manager
/// `types/types.go` `LonghornNodeKey`; the volume controller's replica labels).
pub(super) const LONGHORN_NODE_LABEL: &str = "longhornnode";
pub(super) const LONGHORN_VOLUME_LABEL: &str = "longhornvolume";

/// Above this many volumes a node's look reads the whole lists: a selector naming more
/// would be a long URL for little gain.
const VOLUMES_PER_SELECTOR: usize = 32;

pub(super) fn longhorn(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "longhorn.io".into(),
        version: "v1beta2".into(),
        api_version: "longhorn.io/v1beta2".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Whether `s` can be a label value, so a selector can name it (apimachinery
/// `validation.IsValidLabelValue`: at most 63 characters, alphanumerics at both ends,
/// `-`, `_` and `.` between). An empty value selects nothing useful here.
pub(super) fn label_value(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A Longhorn Volume or Replica as ichor reads it: the few fields of its spec and status
/// [`live_volumes`] judges by, each as whatever JSON it holds; the rest is skipped while
/// reading. Every replica is read at each step's end.
type LonghornRead = kube::core::Object<Option<LonghornSpecRead>, LonghornStatusRead>;

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LonghornSpecRead {
    /// A replica's volume.
    #[serde(default)]
    volume_name: Option<Value>,
    /// A replica's node.
    #[serde(default, rename = "nodeID")]
    node_id: Option<Value>,
    /// When a replica failed (empty: it did not).
    #[serde(default)]
    failed_at: Option<Value>,
    /// A volume's replica count.
    #[serde(default)]
    number_of_replicas: Option<Value>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LonghornStatusRead {
    /// A replica's state (`running`, `stopped`, …).
    #[serde(default)]
    current_state: Option<Value>,
    /// A volume's state (`attached`, `detached`, …).
    #[serde(default)]
    state: Option<Value>,
    /// A volume's robustness (`healthy`, `degraded`, `faulted`).
    #[serde(default)]
    robustness: Option<Value>,
}

/// Longhorn's `kind` (plural `plural`), read as [`LonghornRead`].
fn longhorn_api(client: &kube::Client, kind: &str, plural: &str) -> Api<LonghornRead> {
    Api::all_with(client.clone(), &longhorn(kind, plural))
}

/// A string field of a Longhorn object's spec.
fn spec_str(o: &LonghornRead, field: fn(&LonghornSpecRead) -> &Option<Value>) -> Option<&str> {
    o.spec
        .as_ref()
        .and_then(|s| field(s).as_ref())
        .and_then(Value::as_str)
}

/// Longhorn volumes with the nodes of their replicas, from the objects as listed. The
/// replicas of a detached volume are stopped, not lost: they still hold its data.
fn live_volumes(volumes: &[LonghornRead], replicas: &[LonghornRead]) -> Vec<LiveVolume> {
    let status = |o: &LonghornRead, field: fn(&LonghornStatusRead) -> &Option<Value>| {
        o.status
            .as_ref()
            .and_then(|s| field(s).as_ref())
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let detached: BTreeSet<&str> = volumes
        .iter()
        .filter(|v| status(v, |s| &s.state).as_deref() == Some("detached"))
        .filter_map(|v| v.metadata.name.as_deref())
        .collect();
    let mut by_volume: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut placed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in replicas {
        let volume = spec_str(r, |s| &s.volume_name);
        let node = spec_str(r, |s| &s.node_id).filter(|n| !n.is_empty());
        let running = r
            .status
            .as_ref()
            .and_then(|s| s.current_state.as_ref())
            .and_then(Value::as_str)
            .is_none_or(|s| s == "running");
        let failed = spec_str(r, |s| &s.failed_at).is_some_and(|f| !f.is_empty());
        let holds = running || (!failed && volume.is_some_and(|v| detached.contains(v)));
        if let (Some(v), Some(n)) = (volume, node) {
            placed.entry(v.to_string()).or_default().push(n.to_string());
            if holds {
                by_volume
                    .entry(v.to_string())
                    .or_default()
                    .push(n.to_string());
            }
        }
    }
    volumes
        .iter()
        .map(|v| {
            let name = v.metadata.name.clone().unwrap_or_default();
            let mut nodes = by_volume.remove(&name).unwrap_or_default();
            nodes.sort();
            nodes.dedup();
            let mut holders = placed.remove(&name).unwrap_or_default();
            holders.sort();
            holders.dedup();
            let wanted = v
                .spec
                .as_ref()
                .and_then(|s| s.number_of_replicas.as_ref())
                .and_then(Value::as_u64)
                .unwrap_or(nodes.len() as u64);
            LiveVolume {
                single_replica: wanted <= 1,
                state: status(v, |s| &s.state),
                robustness: status(v, |s| &s.robustness),
                name,
                provider: "longhorn",
                nodes,
                holders,
            }
        })
        .collect()
}

/// A Node as ichor reads it, borrowed from the answer's text: its name, labels and
/// annotations and only the fields of its spec and status that [`LiveNode`] keeps. The rest
/// (managedFields, capacity, every condition's times and messages, a real kubelet's list
/// of images) is skipped while reading, and no string is copied but those kept: a list of
/// every Node is read at each step's end.
#[derive(serde::Deserialize)]
struct NodeRead<'a> {
    #[serde(borrow)]
    metadata: NodeMetaRead<'a>,
    #[serde(default)]
    spec: Option<NodeSpecRead>,
    #[serde(default, borrow)]
    status: Option<NodeStatusRead<'a>>,
}

#[derive(serde::Deserialize)]
struct NodeListRead<'a> {
    #[serde(borrow)]
    items: Vec<NodeRead<'a>>,
}

/// A JSON string, borrowed from the text unless it holds an escape.
#[derive(Default, serde::Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

#[derive(serde::Deserialize)]
struct NodeMetaRead<'a> {
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
    #[serde(default, borrow)]
    labels: Option<BTreeMap<Text<'a>, Text<'a>>>,
    #[serde(default, borrow)]
    annotations: Option<BTreeMap<Text<'a>, Text<'a>>>,
    /// Only who owns `spec.unschedulable`; the rest of each entry is skipped.
    #[serde(default, rename = "managedFields", borrow)]
    managed_fields: Option<Vec<ManagedRead<'a>>>,
}

#[derive(serde::Deserialize)]
struct ManagedRead<'a> {
    #[serde(default, borrow)]
    manager: Text<'a>,
    #[serde(default, rename = "fieldsV1")]
    fields: Option<FieldsRead>,
}

#[derive(serde::Deserialize)]
struct FieldsRead {
    #[serde(default, rename = "f:spec")]
    spec: Option<SpecFieldsRead>,
}

#[derive(serde::Deserialize)]
struct SpecFieldsRead {
    #[serde(default, rename = "f:unschedulable")]
    unschedulable: Option<serde::de::IgnoredAny>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
struct NodeSpecRead {
    #[serde(default)]
    unschedulable: Option<bool>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeStatusRead<'a> {
    #[serde(default, borrow)]
    conditions: Option<Vec<NodeConditionRead<'a>>>,
    #[serde(default, borrow)]
    addresses: Option<Vec<NodeAddressRead<'a>>>,
    #[serde(default, borrow)]
    node_info: Option<NodeInfoRead<'a>>,
}

#[derive(serde::Deserialize)]
struct NodeConditionRead<'a> {
    #[serde(rename = "type", borrow)]
    type_: Text<'a>,
    #[serde(borrow)]
    status: Text<'a>,
}

#[derive(serde::Deserialize)]
struct NodeAddressRead<'a> {
    #[serde(rename = "type", borrow)]
    type_: Text<'a>,
    #[serde(borrow)]
    address: Text<'a>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeInfoRead<'a> {
    #[serde(default, borrow)]
    kubelet_version: Text<'a>,
    #[serde(default, borrow)]
    os_image: Text<'a>,
    #[serde(default, rename = "bootID", borrow)]
    boot_id: Text<'a>,
}

/// The Nodes' collection, for a list or a get by name.
fn nodes_request() -> kube::core::Request {
    kube::core::Request::new("/api/v1/nodes")
}

/// What an answer's text holds, or why it does not.
fn parse<'a, T: serde::Deserialize<'a>>(what: &str, text: &'a str) -> Result<T, KubeError> {
    serde_json::from_str(text).map_err(|e| KubeError::from_kube(what, kube::Error::SerdeError(e)))
}

/// `Talos (v1.12.6)` → `v1.12.6`.
pub fn talos_from_os_image(os_image: &str) -> Option<String> {
    let rest = os_image.trim().strip_prefix("Talos (")?;
    Some(rest.strip_suffix(')')?.to_string())
}

/// The tag of an image reference, without a digest (`repo:v1.2.3@sha256:…` → `v1.2.3`).
pub fn image_tag(image: &str) -> Option<&str> {
    let no_digest = image.split('@').next()?;
    let (_, tag) = no_digest.rsplit_once(':')?;
    (!tag.contains('/')).then_some(tag)
}

/// A Node as the rollout and the gate read it: read in place, copying only what it keeps.
fn live_node(n: &NodeRead) -> LiveNode {
    let meta = &n.metadata;
    let name = meta
        .name
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    let annotation = |key: &str| {
        meta.annotations
            .iter()
            .flatten()
            .find(|(k, _)| k.0 == key)
            .map(|(_, v)| v.0.to_string())
    };
    let status = n.status.as_ref();
    let info = status.and_then(|s| s.node_info.as_ref());
    let control_plane = meta
        .labels
        .iter()
        .flatten()
        .any(|(k, _)| k.0 == "node-role.kubernetes.io/control-plane");
    let role = if control_plane {
        Role::Controlplane
    } else {
        Role::Worker
    };
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_.0 == "Ready"))
        .is_some_and(|c| c.status.0 == "True");
    let internal_ip = status
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_.0 == "InternalIP"))
        .map(|a| a.address.0.to_string());
    let cordoned = n
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    // ichor's mark names its cordon only while ichor's field manager owns the field: an
    // operator's cordon made after theirs is theirs (no owner recorded: the mark decides).
    let owners: Vec<&str> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            e.fields
                .as_ref()
                .and_then(|f| f.spec.as_ref())
                .is_some_and(|s| s.unschedulable.is_some())
        })
        .map(|e| e.manager.0.as_ref())
        .collect();
    let operators = cordoned && !owners.is_empty() && !owners.contains(&FIELD_MANAGER);
    let cordoned_for = annotation(CORDONED_BY_ICHOR).filter(|_| !operators);
    LiveNode {
        name,
        role,
        internal_ip,
        kubelet: info
            .map(|i| i.kubelet_version.0.to_string())
            .unwrap_or_default(),
        talos: info.and_then(|i| talos_from_os_image(&i.os_image.0)),
        boot_id: info.map(|i| i.boot_id.0.to_string()).unwrap_or_default(),
        ready,
        cordoned,
        cordoned_by_ichor: cordoned_for.is_some(),
        cordoned_for,
        hold: annotation(HOLD),
    }
}

impl KubeClient {
    pub async fn nodes(&self) -> Result<Vec<LiveNode>, KubeError> {
        let what = "list nodes";
        let req = nodes_request()
            .list(&ListParams::default())
            .map_err(|e| KubeError::from_kube(what, kube::Error::BuildRequest(e)))?;
        let text = self
            .client
            .request_text(req)
            .await
            .map_err(|e| KubeError::from_kube(what, e))?;
        let list: NodeListRead = parse(what, &text)?;
        let mut out: Vec<LiveNode> = list.items.iter().map(live_node).collect();
        out.sort_by(|a, b| (a.role, &a.name).cmp(&(b.role, &b.name)));
        Ok(out)
    }

    /// One Node by name (`None`: no such Node): what a step watching its node reads, at the
    /// cost of one object whatever the cluster's size.
    pub async fn node(&self, name: &str) -> Result<Option<LiveNode>, KubeError> {
        let what = format!("get node {name}");
        let req = nodes_request()
            .get(name, &kube::api::GetParams::default())
            .map_err(|e| KubeError::from_kube(what.as_str(), kube::Error::BuildRequest(e)))?;
        let text = match self.client.request_text(req).await {
            Ok(text) => text,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => return Err(KubeError::from_kube(what, e)),
        };
        let node: NodeRead = parse(&what, &text)?;
        Ok(Some(live_node(&node)))
    }

    /// Longhorn volumes (`longhorn.io/v1beta2`) with the nodes of the replicas holding them;
    /// when Longhorn is not installed, none.
    pub async fn longhorn_volumes(&self) -> Result<Vec<LiveVolume>, KubeError> {
        // Both lists at once: a step reads them together every few seconds.
        let lp = ListParams::default();
        let volumes_api = longhorn_api(&self.client, "Volume", "volumes");
        let replicas_api = longhorn_api(&self.client, "Replica", "replicas");
        let (volumes, replicas) = tokio::join!(volumes_api.list(&lp), replicas_api.list(&lp));
        let volumes = match volumes {
            Ok(v) => v.items,
            // No Longhorn here: its replicas' answer (a 404 too) does not matter.
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(vec![]),
            Err(e) => return Err(KubeError::from_kube("list longhorn volumes", e)),
        };
        let replicas = replicas
            .map_err(|e| KubeError::from_kube("list longhorn replicas", e))?
            .items;
        Ok(live_volumes(&volumes, &replicas))
    }

    /// The Longhorn volumes with a replica on `node` (failed or stopped ones included; with
    /// no node, none) and the volumes named in `known`, each with every replica it has:
    /// what a step judges its node by, at a cost that grows with the node's volumes, not
    /// the cluster's.
    /// Longhorn labels each replica with its node and volume (`longhornnode`,
    /// `longhornvolume`; longhorn-manager `types/types.go` `LonghornNodeKey`, and the
    /// replicas its volume controller creates), so two label-selected lists and a list by
    /// name per volume find them. Names that cannot be a label value, or more volumes than a
    /// selector should carry, fall back to the whole lists.
    pub async fn longhorn_volumes_of(
        &self,
        node: Option<&str>,
        known: &[String],
    ) -> Result<Vec<LiveVolume>, KubeError> {
        let mut known = known.to_vec();
        known.sort();
        known.dedup();
        if !node.is_none_or(label_value) || known.len() > VOLUMES_PER_SELECTOR {
            return self.longhorn_volumes().await;
        }
        let replicas_api = longhorn_api(&self.client, "Replica", "replicas");
        let on_node = async {
            let Some(node) = node else {
                return Ok(Vec::new());
            };
            let lp = ListParams::default().labels(&format!("{LONGHORN_NODE_LABEL}={node}"));
            replicas_api.list(&lp).await.map(|l| l.items)
        };
        let (mine, first) = tokio::join!(on_node, self.volumes_named(&known));
        let mine = match mine {
            Ok(items) => items,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(vec![]),
            Err(e) => return Err(KubeError::from_kube("list longhorn replicas", e)),
        };
        let Some((mut volumes, mut replicas)) = first? else {
            return self.longhorn_volumes().await;
        };
        // The node's own replicas may name volumes the caller did not know of.
        let mut extra: Vec<String> = Vec::new();
        for r in &mine {
            if let Some(v) = spec_str(r, |s| &s.volume_name) {
                if !known.iter().any(|k| k == v) && !extra.iter().any(|e| e == v) {
                    extra.push(v.to_string());
                }
            }
        }
        if known.len() + extra.len() > VOLUMES_PER_SELECTOR {
            return self.longhorn_volumes().await;
        }
        if !extra.is_empty() {
            let Some((v, r)) = self.volumes_named(&extra).await? else {
                return self.longhorn_volumes().await;
            };
            volumes.extend(v);
            replicas.extend(r);
        }
        Ok(live_volumes(&volumes, &replicas))
    }

    /// The Longhorn volumes named (those that exist) and all their replicas; `None` when a
    /// name cannot be a label value.
    async fn volumes_named(
        &self,
        names: &[String],
    ) -> Result<Option<(Vec<LonghornRead>, Vec<LonghornRead>)>, KubeError> {
        if names.is_empty() {
            return Ok(Some((vec![], vec![])));
        }
        if !names.iter().all(|n| label_value(n)) {
            return Ok(None);
        }
        let replicas_api = longhorn_api(&self.client, "Replica", "replicas");
        let of_volumes = ListParams::default()
            .labels(&format!("{LONGHORN_VOLUME_LABEL} in ({})", names.join(",")));
        let replicas = replicas_api.list(&of_volumes);
        // By name in every namespace: Longhorn's own is whatever the install named it.
        let volumes = futures_util::future::join_all(names.iter().map(|name| async move {
            let lp = ListParams::default().fields(&format!("metadata.name={name}"));
            longhorn_api(&self.client, "Volume", "volumes")
                .list(&lp)
                .await
        }));
        let (replicas, volumes) = tokio::join!(replicas, volumes);
        let replicas = match replicas {
            Ok(l) => l.items,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Some((vec![], vec![]))),
            Err(e) => return Err(KubeError::from_kube("list longhorn replicas", e)),
        };
        let mut found = Vec::new();
        for v in volumes {
            match v {
                Ok(l) => found.extend(l.items),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(KubeError::from_kube("list longhorn volumes", e)),
            }
        }
        Ok(Some((found, replicas)))
    }

    /// PersistentVolumes pinned to one node by `spec.nodeAffinity` (local-path, local
    /// volumes): one copy, on that node.
    pub async fn local_volumes(&self) -> Result<Vec<LiveVolume>, KubeError> {
        let pvs = Api::<PersistentVolume>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| KubeError::from_kube("list persistentvolumes", e))?;
        let mut out = Vec::new();
        for pv in pvs.items {
            let terms = pv
                .spec
                .as_ref()
                .and_then(|s| s.node_affinity.as_ref())
                .and_then(|a| a.required.as_ref())
                .map(|r| r.node_selector_terms.clone())
                .unwrap_or_default();
            let nodes: Vec<String> = terms
                .iter()
                .flat_map(|t| t.match_expressions.clone().unwrap_or_default())
                .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
                .flat_map(|e| e.values.unwrap_or_default())
                .collect();
            if nodes.len() == 1 {
                out.push(LiveVolume {
                    name: pv.metadata.name.clone().unwrap_or_default(),
                    provider: "local",
                    robustness: None,
                    state: None,
                    holders: nodes.clone(),
                    nodes,
                    single_replica: true,
                });
            }
        }
        Ok(out)
    }

    /// Names of the VolumeAttachments still attached to `node` (a drain waits for none).
    pub async fn volume_attachments(&self, node: &str) -> Result<Vec<String>, KubeError> {
        use k8s_openapi::api::storage::v1::VolumeAttachment;
        let list = Api::<VolumeAttachment>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| KubeError::from_kube("list volumeattachments", e))?;
        Ok(list
            .items
            .into_iter()
            .filter(|va| va.spec.node_name == node)
            .filter(|va| va.status.as_ref().is_some_and(|s| s.attached))
            .filter_map(|va| va.metadata.name)
            .collect())
    }

    /// The mirror pods of the static pods, per node.
    pub async fn mirror_pods(&self) -> Result<Vec<MirrorPod>, KubeError> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), "kube-system")
            .list(&ListParams::default())
            .await
            .map_err(|e| KubeError::from_kube("list pods in kube-system", e))?;
        let mut out = Vec::new();
        for p in pods.items {
            let mirror = p
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
            if !mirror {
                continue;
            }
            let spec = p.spec.clone().unwrap_or_default();
            let Some(c) = spec.containers.first() else {
                continue;
            };
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            out.push(MirrorPod {
                node: spec.node_name.clone().unwrap_or_default(),
                component: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                ready,
            });
        }
        Ok(out)
    }

    /// A DaemonSet's roll-out status, or `None` when it does not exist.
    pub async fn daemonset(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<WorkloadStatus>, KubeError> {
        let ds = Api::<DaemonSet>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(format!("get daemonset {namespace}/{name}"), e))?;
        Ok(ds.map(|ds| {
            let images = containers(ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()));
            let generation = ds.metadata.generation;
            let st = ds.status.unwrap_or_default();
            workload(
                namespace,
                name,
                st.desired_number_scheduled,
                st.updated_number_scheduled.unwrap_or(0),
                st.number_ready,
                images,
                generation,
                st.observed_generation,
            )
        }))
    }

    /// A Deployment's roll-out status, or `None` when it does not exist.
    pub async fn deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<WorkloadStatus>, KubeError> {
        let d = Api::<Deployment>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(format!("get deployment {namespace}/{name}"), e))?;
        Ok(d.map(|d| {
            let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let images = containers(d.spec.as_ref().and_then(|s| s.template.spec.as_ref()));
            let generation = d.metadata.generation;
            let st = d.status.unwrap_or_default();
            workload(
                namespace,
                name,
                desired,
                st.updated_replicas.unwrap_or(0),
                st.ready_replicas.unwrap_or(0),
                images,
                generation,
                st.observed_generation,
            )
        }))
    }

    /// The Argo CD Application's sync and health, or `None` when it (or Argo CD) is absent.
    pub async fn application(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ApplicationStatus>, KubeError> {
        let ar = ApiResource {
            group: "argoproj.io".into(),
            version: "v1alpha1".into(),
            api_version: "argoproj.io/v1alpha1".into(),
            kind: "Application".into(),
            plural: "applications".into(),
        };
        let app = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &ar)
            .get_opt(name)
            .await;
        let app = match app {
            Ok(a) => a,
            // No Argo CD at all: the CRD's group is unknown.
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => {
                return Err(KubeError::from_kube(
                    format!("get application {namespace}/{name}"),
                    e,
                ))
            }
        };
        Ok(app.map(|a| {
            let st = a.data.get("status");
            let field = |k: &str| {
                st.and_then(|s| s.get(k))
                    .and_then(|s| s.get("status"))
                    .and_then(Value::as_str)
                    .unwrap_or("Unknown")
                    .to_string()
            };
            ApplicationStatus {
                sync: field("sync"),
                health: field("health"),
            }
        }))
    }

    /// The series of `apiserver_requested_deprecated_apis` on the API server's `/metrics`.
    pub async fn deprecated_apis(&self) -> Result<Vec<DeprecatedApi>, KubeError> {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| KubeError::Reply {
                what: "GET /metrics".into(),
                message: e.to_string(),
            })?;
        let text = self
            .client
            .request_text(req)
            .await
            .map_err(|e| KubeError::from_kube("GET /metrics", e))?;
        Ok(parse_deprecated_apis(&text))
    }

    /// The holder of a Lease, or `None` when there is no such Lease or nobody holds it.
    pub async fn lease_holder(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<LeaseHolder>, KubeError> {
        let lease = Api::<Lease>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(format!("get lease {namespace}/{name}"), e))?;
        Ok(lease.and_then(|l| {
            let spec = l.spec?;
            let holder = spec.holder_identity.filter(|h| !h.is_empty())?;
            Some(LeaseHolder {
                holder,
                renew_time: spec.renew_time.map(|t| t.0.to_string()),
                duration_secs: spec.lease_duration_seconds,
            })
        }))
    }
}

fn containers(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<String> {
    spec.map(|s| {
        s.containers
            .iter()
            .filter_map(|c| c.image.clone())
            .collect()
    })
    .unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
fn workload(
    ns: &str,
    name: &str,
    desired: i32,
    updated: i32,
    ready: i32,
    images: Vec<String>,
    generation: Option<i64>,
    observed_generation: Option<i64>,
) -> WorkloadStatus {
    let version = images
        .first()
        .and_then(|i| image_tag(i))
        .filter(|t| Version::parse(t).is_ok())
        .map(str::to_string);
    WorkloadStatus {
        namespace: ns.to_string(),
        name: name.to_string(),
        desired,
        updated,
        ready,
        images,
        version,
        observed: observed_generation.unwrap_or(0) >= generation.unwrap_or(0),
    }
}

/// Parse the Prometheus text format for `apiserver_requested_deprecated_apis` series with a
/// non-zero value. Lines are bounded by the response; each label is read by name.
pub fn parse_deprecated_apis(text: &str) -> Vec<DeprecatedApi> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_requested_deprecated_apis{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        if value.trim().parse::<f64>().map_or(true, |v| v == 0.0) {
            continue;
        }
        let mut map = BTreeMap::new();
        for pair in labels.split("\",") {
            if let Some((k, v)) = pair.split_once("=\"") {
                map.insert(
                    k.trim().trim_start_matches(','),
                    v.trim_end_matches('"').to_string(),
                );
            }
        }
        let get = |k: &str| map.get(k).cloned().unwrap_or_default();
        let api = DeprecatedApi {
            group: get("group"),
            version: get("version"),
            resource: get("resource"),
            removed_release: map
                .get("removed_release")
                .cloned()
                .filter(|r| !r.is_empty()),
        };
        if !out.contains(&api) {
            out.push(api);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a Node is read as: the fields kept, from a Node carrying what a real one does
    /// (managedFields, images, every condition), with an escape in an annotation's value
    /// (then that string alone is copied while reading).
    #[test]
    fn a_node_is_read_as_the_fields_ichor_keeps() {
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "cp-1", "uid": "u-1", "resourceVersion": "42",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"kubernetes.io/hostname": "cp-1", "node-role.kubernetes.io/control-plane": ""},
                "annotations": {HOLD: "a \"quoted\" reason", CORDONED_BY_ICHOR: "abc123"},
                "managedFields": [{"manager": "kubelet", "operation": "Update",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:images": {}}}}],
            },
            "spec": {"unschedulable": true, "podCIDR": "10.244.0.0/24"},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "r", "message": "m"},
                    {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
                ],
                "addresses": [{"type": "Hostname", "address": "cp-1"}, {"type": "InternalIP", "address": "10.0.0.1"}],
                "images": [{"names": ["ghcr.io/siderolabs/kubelet:v1.33.5"], "sizeBytes": 1}],
                "nodeInfo": {"kubeletVersion": "v1.33.5", "osImage": "Talos (v1.12.6)", "bootID": "b-1",
                             "kernelVersion": "6.12.48-talos"},
            },
        });
        let list = serde_json::json!({"kind": "NodeList", "metadata": {"resourceVersion": "43"},
                                      "items": [node, {"metadata": {"name": "w-1"}}]})
        .to_string();
        let read: NodeListRead = match parse("list nodes", &list) {
            Ok(read) => read,
            Err(e) => panic!("a list as the apiserver sends it reads: {e}"),
        };
        let nodes: Vec<LiveNode> = read.items.iter().map(live_node).collect();
        assert_eq!(
            nodes[0],
            LiveNode {
                name: "cp-1".into(),
                role: Role::Controlplane,
                internal_ip: Some("10.0.0.1".into()),
                kubelet: "v1.33.5".into(),
                talos: Some("v1.12.6".into()),
                boot_id: "b-1".into(),
                ready: true,
                cordoned: true,
                cordoned_by_ichor: true,
                cordoned_for: Some("abc123".into()),
                hold: Some("a \"quoted\" reason".into()),
            }
        );
        // A Node with nothing but a name: a NotReady worker nobody cordoned.
        assert_eq!(
            (
                nodes[1].role,
                nodes[1].ready,
                nodes[1].cordoned,
                nodes[1].talos.clone()
            ),
            (Role::Worker, false, false, None)
        );
        let Err(bad) = parse::<NodeRead>("get node x", "{\"metadata\": 3}") else {
            panic!("metadata that is not an object is refused")
        };
        assert!(bad.to_string().contains("get node x"), "{bad}");
    }

    #[test]
    fn os_images_and_tags() {
        assert_eq!(
            talos_from_os_image("Talos (v1.12.6)").as_deref(),
            Some("v1.12.6")
        );
        assert_eq!(talos_from_os_image("Ubuntu 24.04"), None);
        assert_eq!(
            image_tag("quay.io/cilium/cilium:v1.18.3@sha256:ab"),
            Some("v1.18.3")
        );
        assert_eq!(image_tag("registry:5000/cilium"), None);
    }

    #[test]
    fn deprecated_api_series() {
        let text = "# HELP x\n\
apiserver_requested_deprecated_apis{group=\"policy\",removed_release=\"1.25\",resource=\"podsecuritypolicies\",subresource=\"\",version=\"v1beta1\"} 1\n\
apiserver_requested_deprecated_apis{group=\"flowcontrol.apiserver.k8s.io\",removed_release=\"1.32\",resource=\"flowschemas\",subresource=\"\",version=\"v1beta3\"} 0\n\
apiserver_request_total{code=\"200\"} 5\n";
        let apis = parse_deprecated_apis(text);
        assert_eq!(apis.len(), 1, "{apis:?}");
        assert_eq!(apis[0].resource, "podsecuritypolicies");
        assert_eq!(apis[0].removed_release.as_deref(), Some("1.25"));
        assert_eq!(apis[0].group, "policy");
    }
}
