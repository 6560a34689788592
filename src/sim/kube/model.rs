//! The simulated cluster behind the API: the store plus the controllers the twin plays
//! (ReplicaSet, StatefulSet, Deployment, DaemonSet, scheduler, PDB status, Longhorn
//! replicas), faults, and the Eviction API. Everything runs on timestamps passed in, so a
//! manual clock makes it deterministic: a change is applied when `sync(now)` reaches its time.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::resources::{by_kind, ResourceType};
use super::select::{FieldSelector, LabelSelector};
use super::store::{has_claims, name_of, namespace_of, set_path, ApiError, At, EventType, Store};
use crate::clock::Timestamp;

/// How fast the simulated controllers react.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// From a pod's creation (after an eviction or loss) until it runs Ready on a node.
    pub pod_start_delay: Duration,
    /// From a Longhorn volume becoming degraded until its lost replica is rebuilt elsewhere,
    /// and from a node's return until the replica it kept has re-synced (Longhorn reuses a
    /// failed replica whose node comes back: it runs again at once, but the volume counts it
    /// healthy only once rebuilt).
    pub replica_rebuild_delay: Duration,
    /// From the last pod using a CSI volume on a node being gone until its VolumeAttachment
    /// is detached and deleted (kubelet unmount, attach-detach controller, external-attacher).
    pub volume_detach_delay: Duration,
    /// Watch events kept for `watch` with a resourceVersion; older ones get 410 Expired.
    pub watch_history: usize,
    /// How long a deleted or evicted pod stays Terminating before it is gone when neither
    /// the request (`gracePeriodSeconds`) nor the pod (`spec.terminationGracePeriodSeconds`)
    /// says: 30 s, the apiserver's default for the pod field.
    pub pod_termination: Duration,
    /// The most pods the controllers run for one ReplicaSet or StatefulSet. A client may
    /// ask for any `spec.replicas` (the apiserver allows 2^31-1); creating them all at once
    /// would take the twin's memory with it.
    pub max_replicas: u64,
    /// From a DaemonSet's spec change until its controller writes a status for the new
    /// generation: until then `status.observedGeneration` is the old one and the counts are
    /// the old template's (what a client reading right after its patch sees;
    /// pkg/controller/daemon/daemon_controller.go `updateDaemonSetStatus` at v1.33.0 writes
    /// `observedGeneration` with the counts).
    pub status_lag: Duration,
    /// kube-controller-manager's `--node-monitor-grace-period` (40 s): how long a node that
    /// stopped posting status still shows Ready.
    pub node_monitor_grace: Duration,
    /// The DefaultTolerationSeconds admission plugin's 300 s: how long a pod stays on an
    /// unreachable node before the taint-based eviction deletes it.
    pub unreachable_toleration: Duration,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            pod_start_delay: Duration::from_secs(10),
            replica_rebuild_delay: Duration::from_secs(120),
            volume_detach_delay: Duration::from_secs(10),
            watch_history: 10_000,
            pod_termination: Duration::from_secs(30),
            max_replicas: MAX_REPLICAS,
            status_lag: Duration::from_secs(2),
            node_monitor_grace: Duration::from_secs(40),
            unreachable_toleration: Duration::from_secs(300),
        }
    }
}

/// Injected failures.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// PDBs (namespace, name) that never allow a disruption.
    pub pdb_never_allows: BTreeSet<(String, String)>,
    /// Fail the next N API requests with `burst_code`.
    pub burst_remaining: u32,
    /// Every request for a Lease fails with 503 while set: a client whose renewals cannot
    /// get through (a stream starved, a path partitioned) while its other calls do.
    pub leases_unreachable: bool,
    /// 500 (InternalError) or 429 (TooManyRequests, with Retry-After).
    pub burst_code: u16,
    pub retry_after_secs: u64,
    /// Longhorn volumes whose failed replicas are never rebuilt (where they were or
    /// elsewhere): the volume stays degraded.
    pub replicas_never_rebuild: BTreeSet<String>,
    /// Nodes whose kubelet stopped posting status (the machine stays up, its pods keep
    /// running): kube-controller-manager marks the Node NotReady after the node-monitor
    /// grace period, as for any silent node.
    pub kubelet_down: BTreeSet<String>,
}

/// A sample of `apiserver_requested_deprecated_apis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeprecatedApi {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub removed_release: String,
}

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The twin's record of which pod template a pod was made from (for rolling updates).
pub const TEMPLATE_HASH: &str = "twin.ichor.dev/template-hash";

/// A short stable hash of an owner's pod template.
pub fn template_hash(owner: &Value) -> String {
    // FNV-1a over the template's compact JSON as it is written out (no copy of the text):
    // stable across runs, unlike the std hasher.
    struct Fnv(u64);
    impl std::io::Write for Fnv {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            for &b in bytes {
                self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    if let Some(t) = owner.at("/spec/template") {
        // Writing into the hasher cannot fail.
        let _ = serde_json::to_writer(&mut h, t);
    }
    format!("{:08x}", h.0 as u32)
}

fn pod_template_hash(pod: &Value) -> Option<&str> {
    pod.at("/metadata/annotations")?
        .get(TEMPLATE_HASH)?
        .as_str()
}
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// The Longhorn CSI driver (a PersistentVolume's `spec.csi.driver`, a VolumeAttachment's
/// `spec.attacher`).
pub const LONGHORN_DRIVER: &str = "driver.longhorn.io";

/// The simulated cluster: objects and the controllers acting on them.
pub struct Cluster {
    pub store: Store,
    pub behaviour: Behaviour,
    pub faults: Faults,
    pub deprecated_apis: Vec<DeprecatedApi>,
    /// No kube-apiserver runs: every control plane is down or restarting its apiserver
    /// (set by the twin from the Talos side). The API then answers nothing but 503.
    pub apiserver_down: bool,
    /// Pods waiting to start: (namespace, name) → when they were created.
    pending: BTreeMap<(String, String), Timestamp>,
    /// Longhorn volumes (namespace, name) → since when they are degraded.
    degraded_since: BTreeMap<(String, String), Timestamp>,
    /// Longhorn replicas (namespace, name) reused after their node returned → when they have
    /// re-synced.
    resync_due: BTreeMap<(String, String), Timestamp>,
    /// What Longhorn's last pass read. The next pass looks only at the volumes something
    /// touched since (their replicas, their nodes, a re-sync or rebuild due), and is skipped
    /// when nothing did, so it costs what changed rather than every volume of the cluster.
    longhorn_seen: Option<LonghornSeen>,
    /// The volumes Longhorn's passes looked at, in order (tests pin what a change costs).
    #[cfg(test)]
    longhorn_judged: Vec<String>,
    /// The controllers' passes and statuses that looked, in order, as "what ns/name" (tests
    /// pin what a change costs).
    #[cfg(test)]
    judged: Vec<String>,
    /// The store's resourceVersion after an attach/detach pass that changed nothing: until
    /// a pod with a claim, a claim, a PersistentVolume or a VolumeAttachment changes, or a
    /// detach falls due, another pass would change nothing and is skipped.
    attach_quiet: Option<u64>,
    /// The pods with a claim as the last attach/detach pass read them, by uid (a pod made
    /// again under its name is another pod): their [`attach_view`] and the
    /// VolumeAttachments they want (by name), worked out again when the view changes or a
    /// claim or PersistentVolume changed (`attach_claims_at`).
    attach_pods: HashMap<String, AttachPod>,
    /// Attach/detach passes so far: a pod read by the last one is still there.
    attach_passes: u64,
    /// The last change to claims and PersistentVolumes when `attach_pods` was worked out.
    attach_claims_at: u64,
    /// Every Node's brief, brought up to date from the Nodes changed since it was last
    /// read: a pass does not read 500 Nodes to place one pod, nor rebuild 500 briefs for
    /// one heartbeat.
    node_view: Option<NodeView>,
    /// VolumeAttachments no pod needs any more → when they are detached and gone.
    detach_due: BTreeMap<String, Timestamp>,
    /// Terminating pods (namespace, name) → when they are gone.
    terminating: BTreeMap<(String, String), Timestamp>,
    /// Nodes whose kubelet stopped posting status → since when (the node is down).
    silent_since: BTreeMap<String, Timestamp>,
    /// When the kubelets' heartbeats are next brought up to date (lazily, on a sync).
    heartbeat_due: Timestamp,
    now: Timestamp,
    /// The resourceVersion the controllers last settled at, and when something is due next.
    settled_at: Option<u64>,
    /// The resourceVersion statuses were last computed at.
    statuses_at: Option<u64>,
    next_due: Option<Timestamp>,
    /// The next time a pending pod may start (computed by the scheduler pass).
    next_pod_start: Option<Timestamp>,
    /// Inside [`Cluster::batch`]: mutations skip the controllers until the batch ends.
    deferred: bool,
    /// DaemonSets (namespace, name, generation) whose new generation's status is due then.
    status_due: BTreeMap<(String, String, u64), Timestamp>,
    /// The ReplicaSets each Deployment controls.
    deployment_sets: DeploymentSets,
    /// The Deployments a ReplicaSet joined or left since the last deployments pass: a set
    /// that changes hands (or loses its owner) still wakes the Deployment it left.
    deployments_moved: BTreeSet<(String, String)>,
    /// DaemonSets (namespace, name) found with one current pod on every node, and the spec
    /// they were found with.
    daemon_sets_settled: HashMap<(String, String), DaemonSetSpec>,
    /// Each DaemonSet's pods as its status counts them, kept from the pods that changed.
    daemon_set_pods: HashMap<(String, String), DaemonSetPods>,
    /// The pods each PodDisruptionBudget (namespace, name) selected when its status was
    /// last computed, so a pod that no longer matches still wakes it.
    pdb_pods: HashMap<(String, String), HashSet<String>>,
}

/// Which ReplicaSets each Deployment controls, kept current from the ReplicaSets that
/// changed since `at` (rebuilt when the history no longer reaches back), so a pass does not
/// read every ReplicaSet to find the few whose pods changed.
#[derive(Debug, Default)]
struct DeploymentSets {
    at: Option<u64>,
    /// (namespace, Deployment) → the names of the ReplicaSets it controls, in store order.
    sets: HashMap<(String, String), BTreeSet<String>>,
    /// (namespace, ReplicaSet) → the Deployment controlling it.
    owner: HashMap<(String, String), String>,
}

impl DeploymentSets {
    /// Brings the index up to the store; the Deployments a ReplicaSet joined or left are
    /// added to `moved`.
    fn refresh(&mut self, store: &Store, moved: &mut BTreeSet<(String, String)>) {
        let rv = store.resource_version();
        let changed: Option<BTreeSet<(String, String)>> = match self.at {
            Some(at) if store.last_change("replicasets") <= at => Some(BTreeSet::new()),
            Some(at) => store.changes_since(at).map(|changes| {
                changes
                    .filter(|e| e.plural == "replicasets")
                    .map(|e| (e.namespace.clone(), name_of(&e.object).to_string()))
                    .collect()
            }),
            None => None,
        };
        let changed = changed.unwrap_or_else(|| {
            moved.extend(self.sets.drain().map(|(d, _)| d));
            self.owner.clear();
            store
                .iter("replicasets")
                .map(|rs| (namespace_of(rs).to_string(), name_of(rs).to_string()))
                .collect()
        });
        for key in changed {
            let (ns, rs) = &key;
            let now = store
                .get("replicasets", ns, rs)
                .and_then(controller_of)
                .filter(|(kind, _)| *kind == "Deployment")
                .map(|(_, d)| d.to_string());
            if self.owner.get(&key) == now.as_ref() {
                continue;
            }
            if let Some(before) = self.owner.remove(&key) {
                let d = (ns.clone(), before);
                if let Some(set) = self.sets.get_mut(&d) {
                    set.remove(rs);
                    if set.is_empty() {
                        self.sets.remove(&d);
                    }
                }
                moved.insert(d);
            }
            if let Some(d) = now {
                self.owner.insert(key.clone(), d.clone());
                let d = (ns.clone(), d);
                self.sets.entry(d.clone()).or_default().insert(rs.clone());
                moved.insert(d);
            }
        }
        self.at = Some(rv);
    }

    /// The ReplicaSets `ns/deployment` controls, in store order.
    fn of(&self, ns: &str, deployment: &str) -> Vec<String> {
        self.sets
            .get(&(ns.to_string(), deployment.to_string()))
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// (namespace, name) of the Deployments to look at again, in store order: those that
    /// changed and those whose ReplicaSets changed, and with `pods`, those whose pods did.
    fn touched(&self, store: &Store, dirty: &Dirty, pods: bool) -> BTreeSet<(String, String)> {
        if dirty.all {
            return store
                .iter("deployments")
                .map(|d| (namespace_of(d).to_string(), name_of(d).to_string()))
                .collect();
        }
        let changed = |plural, kind| {
            if pods {
                dirty.owners_to_look_at(store, plural, kind)
            } else {
                dirty.objects_to_look_at(store, plural, kind)
            }
        };
        let mut touched: BTreeSet<(String, String)> =
            changed("deployments", "Deployment").into_iter().collect();
        for (ns, rs) in changed("replicasets", "ReplicaSet") {
            if let Some(d) = self.owner.get(&(ns.clone(), rs)) {
                touched.insert((ns, d.clone()));
            }
        }
        touched
    }
}

/// Storage the controllers never read (kubelet Leases, Events, and the ConfigMaps and
/// Secrets no simulated controller looks at, such as ichor's rollout record): a change
/// there alone leaves them settled.
const UNREAD_BY_CONTROLLERS: &[&str] = &[
    "leases",
    "events",
    "events.events.k8s.io",
    "configmaps",
    "secrets",
];

fn rt(plural: &str) -> &'static ResourceType {
    // Every plural the model names is in RESOURCES; a typo is a programming error caught by
    // the unit tests, so fall back to the first entry rather than panic.
    super::resources::by_plural(plural).unwrap_or(&super::resources::RESOURCES[0])
}

fn all_labels() -> (LabelSelector, FieldSelector) {
    (LabelSelector::default(), FieldSelector::default())
}

/// Parse `2026-01-01T00:00:00Z` (fractions ignored) back to a timestamp.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    let b = s.as_bytes();
    if b.len() < 19 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from civil, Howard Hinnant's algorithm.
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    u64::try_from(secs).ok().map(|s| Timestamp(s * 1000))
}

/// MicroTime as Leases carry it.
pub fn micro_time(now: Timestamp) -> String {
    let base = now.rfc3339();
    format!(
        "{}.{:06}Z",
        base.trim_end_matches('Z'),
        (now.0 % 1000) * 1000
    )
}

pub fn is_ready(obj: &Value) -> bool {
    condition(obj, "Ready") == Some("True")
}

pub fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj.at("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))?
        .get("status")?
        .as_str()
}

/// Set a condition, moving lastTransitionTime only when the status changes.
pub fn set_condition(obj: &mut Value, kind: &str, status: bool, reason: &str, now: Timestamp) {
    let status = if status { "True" } else { "False" };
    if !obj["status"]["conditions"].is_array() {
        set_path(obj, &["status", "conditions"], json!([]));
    }
    let Some(conds) = obj["status"]["conditions"].as_array_mut() else {
        return;
    };
    let t = now.rfc3339();
    if let Some(c) = conds
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
    {
        if c.get("status").and_then(Value::as_str) != Some(status) {
            c["status"] = json!(status);
            c["lastTransitionTime"] = json!(t);
            c["reason"] = json!(reason);
        }
        if c.get("lastHeartbeatTime").is_some() {
            c["lastHeartbeatTime"] = json!(t);
        }
    } else {
        conds.push(
            json!({"type": kind, "status": status, "reason": reason, "lastTransitionTime": t}),
        );
    }
}

pub use super::store::controller_of;

pub fn is_mirror(pod: &Value) -> bool {
    pod.at("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some()
}

/// The taint the node lifecycle controller puts on a node that stopped posting status.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// Whether the taint-based eviction deletes this pod: not a mirror pod, not a DaemonSet's
/// (the DaemonSet controller tolerates the taint forever), not already terminating.
fn taint_evicts(pod: &Value) -> bool {
    let daemon = controller_of(pod).is_some_and(|(kind, _)| kind == "DaemonSet");
    !is_mirror(pod) && !daemon && pod.at("/metadata/deletionTimestamp").is_none()
}

fn has_taint(node: &Value, key: &str) -> bool {
    node.at("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.get("key").and_then(Value::as_str) == Some(key))
        })
}

fn add_taint(node: &mut Value, key: &str, effect: &str, added: Timestamp) {
    if !node["spec"]["taints"].is_array() {
        set_path(node, &["spec", "taints"], json!([]));
    }
    if let Some(ts) = node["spec"]["taints"].as_array_mut() {
        ts.push(json!({"key": key, "effect": effect, "timeAdded": added.rfc3339()}));
    }
}

/// Remove a taint by key; whether there was one.
fn remove_taint(node: &mut Value, key: &str) -> bool {
    let Some(ts) = node
        .get_mut("spec")
        .and_then(|s| s.get_mut("taints"))
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    let before = ts.len();
    ts.retain(|t| t.get("key").and_then(Value::as_str) != Some(key));
    let removed = ts.len() != before;
    if ts.is_empty() {
        if let Some(spec) = node.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("taints");
        }
    }
    removed
}

fn node_of(pod: &Value) -> &str {
    pod.at("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The default of [`Behaviour::max_replicas`].
pub const MAX_REPLICAS: u64 = 10_000;

/// `spec.replicas`, at most `max`.
fn replicas_of(obj: &Value, max: u64) -> u64 {
    obj.at("/spec/replicas")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .min(max)
}

fn owner_ref(obj: &Value) -> Value {
    json!({
        "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
        "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
        "name": name_of(obj),
        "uid": obj.at("/metadata/uid").cloned().unwrap_or(Value::Null),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// An int-or-percent against a total; percentages round up, as the disruption controller does.
fn scaled(v: &Value, total: u64) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => {
            let p: u64 = s.strip_suffix('%')?.trim().parse().ok()?;
            Some((p * total).div_ceil(100))
        }
        _ => None,
    }
}

impl Cluster {
    pub fn new(behaviour: Behaviour, now: Timestamp) -> Self {
        Cluster {
            store: Store::new(behaviour.watch_history),
            behaviour,
            faults: Faults::default(),
            apiserver_down: false,
            deprecated_apis: Vec::new(),
            pending: BTreeMap::new(),
            degraded_since: BTreeMap::new(),
            resync_due: BTreeMap::new(),
            longhorn_seen: None,
            #[cfg(test)]
            longhorn_judged: Vec::new(),
            #[cfg(test)]
            judged: Vec::new(),
            attach_quiet: None,
            attach_pods: HashMap::new(),
            attach_claims_at: 0,
            attach_passes: 0,
            node_view: None,
            detach_due: BTreeMap::new(),
            terminating: BTreeMap::new(),
            silent_since: BTreeMap::new(),
            heartbeat_due: Timestamp(0),
            now,
            settled_at: None,
            statuses_at: None,
            status_due: BTreeMap::new(),
            next_due: None,
            next_pod_start: None,
            deferred: false,
            deployment_sets: DeploymentSets::default(),
            deployments_moved: BTreeSet::new(),
            daemon_sets_settled: HashMap::new(),
            daemon_set_pods: HashMap::new(),
            pdb_pods: HashMap::new(),
        }
    }

    /// Run several mutations (e.g. a whole reboot wave's node changes) and let the
    /// controllers react once, at the end, instead of after each one.
    pub fn batch<R>(&mut self, now: Timestamp, f: impl FnOnce(&mut Self) -> R) -> R {
        let outer = self.deferred;
        self.deferred = true;
        let r = f(self);
        self.deferred = outer;
        self.sync(now);
        r
    }

    /// When the model next has something to do on its own (a pod start, a replica rebuild,
    /// a terminating pod gone), if anything.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.next_due
    }

    /// The last time the model was synced to.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    // ---- plain library API -------------------------------------------------------------

    /// Create or replace an object by its apiVersion/kind (no resourceVersion check).
    pub fn upsert(&mut self, obj: Value, now: Timestamp) -> Result<Value, ApiError> {
        let out = self.upsert_quiet(obj, now)?;
        self.sync(now);
        Ok(out)
    }

    /// Upsert without running the controllers (bulk seeding; call `sync` after).
    pub(crate) fn upsert_quiet(&mut self, obj: Value, now: Timestamp) -> Result<Value, ApiError> {
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let Some(rt) = by_kind(api_version, kind) else {
            return Err(ApiError::bad_request(format!(
                "no resource served for apiVersion {api_version:?} kind {kind:?}"
            )));
        };
        let out = self.store.upsert(rt, obj, now)?;
        self.after_change(rt.plural, &out, now);
        Ok(Arc::unwrap_or_clone(out))
    }

    /// One object by resource plural (`pods`, `nodes`, `volumes`...); namespace "" for
    /// cluster-scoped resources.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let rt = super::resources::by_plural(plural)?;
        self.store.get(rt.storage, namespace, name).cloned()
    }

    /// Every object of a resource, in one namespace or all.
    pub fn list(&self, plural: &str, namespace: Option<&str>) -> Vec<Value> {
        let Some(rt) = super::resources::by_plural(plural) else {
            return Vec::new();
        };
        let (l, f) = all_labels();
        self.store
            .list(rt.storage, namespace, &l, &f)
            .into_iter()
            .map(Arc::unwrap_or_clone)
            .collect()
    }

    /// Delete an object (pods gracefully, see [`Cluster::delete_pod`]).
    pub fn delete(
        &mut self,
        plural: &str,
        namespace: &str,
        name: &str,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        let rt = Store::rt(plural)?;
        if rt.plural == "pods" {
            return self.delete_pod(namespace, name, None, now);
        }
        let out = self.store.delete(rt, namespace, name)?;
        self.sync(now);
        Ok(Arc::unwrap_or_clone(out))
    }

    /// Delete a pod gracefully: it turns Terminating (deletionTimestamp set, not Ready) and is
    /// gone after `grace` (else the pod's own, else `Behaviour::pod_termination`); zero, or a pod that never
    /// started, goes at once. Its controller makes a replacement right away.
    pub fn delete_pod(
        &mut self,
        namespace: &str,
        name: &str,
        grace: Option<Duration>,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        let key = (namespace.to_string(), name.to_string());
        let Some(pod) = self.store.get("pods", namespace, name).cloned() else {
            return Err(ApiError::not_found(rt_pods(), name));
        };
        // As the apiserver: the request's grace period, else the pod's own
        // `terminationGracePeriodSeconds` (which the apiserver defaults to 30 s).
        let grace = grace
            .or_else(|| {
                pod.at("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_u64)
                    .map(Duration::from_secs)
            })
            .unwrap_or(self.behaviour.pod_termination);
        let started = !node_of(&pod).is_empty() && !self.pending.contains_key(&key);
        if grace.is_zero() || !started {
            let out = self.store.delete(rt_pods(), namespace, name)?;
            self.pending.remove(&key);
            self.terminating.remove(&key);
            self.sync(now);
            return Ok(Arc::unwrap_or_clone(out));
        }
        let due = now.plus(grace);
        if let Some(old_due) = self.terminating.get(&key) {
            // Already terminating: a shorter grace period moves the end closer.
            if due < *old_due {
                self.terminating.insert(key, due);
                self.invalidate();
                self.sync(now);
            }
            return Ok(pod);
        }
        let mut p = pod;
        set_path(
            &mut p,
            &["metadata", "deletionTimestamp"],
            json!(due.rfc3339()),
        );
        set_path(
            &mut p,
            &["metadata", "deletionGracePeriodSeconds"],
            json!(grace.as_secs()),
        );
        set_condition(&mut p, "Ready", false, "PodTerminating", now);
        set_condition(&mut p, "ContainersReady", false, "PodTerminating", now);
        if let Some(m) = p.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let out = self.store.update(rt_pods(), namespace, name, p)?;
        self.terminating.insert(key, due);
        self.sync(now);
        Ok(Arc::unwrap_or_clone(out))
    }

    /// Set a node's Ready condition, as its kubelet posts it (so the node is heard from
    /// again; Ready lifts the unreachable taint). Pods on a NotReady node stay but report
    /// not Ready.
    pub fn set_node_ready(
        &mut self,
        node: &str,
        ready: bool,
        now: Timestamp,
    ) -> Result<(), ApiError> {
        // A kubelet that is down posts nothing, whatever the machine does.
        if self.faults.kubelet_down.contains(node) {
            return Ok(());
        }
        self.silent_since.remove(node);
        if ready {
            if let Some(mut n) = self.store.get("nodes", "", node).cloned() {
                if remove_taint(&mut n, UNREACHABLE_TAINT) {
                    self.store.update(rt("nodes"), "", node, n)?;
                }
            }
        }
        self.node_ready_unsynced(node, ready, now)?;
        self.sync(now);
        Ok(())
    }

    fn node_ready_unsynced(
        &mut self,
        node: &str,
        ready: bool,
        now: Timestamp,
    ) -> Result<(), ApiError> {
        let rt = rt("nodes");
        let Some(mut n) = self.store.get("nodes", "", node).cloned() else {
            return Err(ApiError::not_found(rt, node));
        };
        let was_ready = is_ready(&n);
        let (reason, _msg) = if ready {
            ("KubeletReady", "kubelet is posting ready status")
        } else {
            ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        };
        set_condition(&mut n, "Ready", ready, reason, now);
        let n = self.store.update(rt, "", node, n)?;
        if was_ready != ready {
            let (reason, message) = if ready {
                ("NodeReady", format!("Node {node} status is now: NodeReady"))
            } else {
                (
                    "NodeNotReady",
                    format!("Node {node} status is now: NodeNotReady"),
                )
            };
            self.record_event(&n, reason, &message, now);
        }
        for pod in self.pods_on(node) {
            let mut p = pod.clone();
            // Only pods that run (not pending) follow their node's readiness.
            let terminating = p.at("/metadata/deletionTimestamp").is_some();
            if p.at("/status/phase").and_then(Value::as_str) == Some("Running") && !terminating {
                set_condition(
                    &mut p,
                    "Ready",
                    ready,
                    if ready { "" } else { "NodeNotReady" },
                    now,
                );
                let _ = self
                    .store
                    .update(rt_pods(), namespace_of(&pod), name_of(&pod), p);
            }
        }
        // Replicas on a node back in service are reused by the Longhorn pass (re-synced,
        // not instantly healthy).
        Ok(())
    }

    /// The node went down (reboot, crash): its kubelet stops posting status, so the API
    /// learns nothing at once. As kube-controller-manager: after the node-monitor grace period
    /// the Node turns NotReady, gets the `node.kubernetes.io/unreachable:NoExecute` taint and
    /// its pods turn not Ready; after the pods' toleration of that taint (300 s) the
    /// taint-based eviction deletes them, all but DaemonSet pods (which tolerate it forever)
    /// and mirror pods. Longhorn replicas on it stop at once (the engine sees the peer go).
    pub fn node_down(&mut self, node: &str, now: Timestamp) -> Result<(), ApiError> {
        if self.store.get("nodes", "", node).is_none() {
            return Err(ApiError::not_found(rt("nodes"), node));
        }
        self.silent_since.entry(node.to_string()).or_insert(now);
        self.replicas_fail_on(node, now);
        // A silent kubelet is no object change, and of the passes only node_lifecycle and
        // Longhorn's (which compares the silent kubelets itself) read it: a sync is due now,
        // for them and for the grace period's deadline, but nothing else is dirty. Looking at
        // everything here cost every owner's status and every DaemonSet's count on each
        // reboot, O(cluster) per node.
        self.next_due = Some(now);
        self.sync(now);
        Ok(())
    }

    /// The node is back: the kubelet posts Ready again, the unreachable taint goes, and its
    /// pods still bound to it (restarted by the kubelet) run again; Longhorn reuses its
    /// stopped replicas, healthy once re-synced.
    pub fn node_up(&mut self, node: &str, now: Timestamp) -> Result<(), ApiError> {
        self.set_node_ready(node, true, now)
    }

    /// What kube-controller-manager does about silent nodes at `now`: NotReady and tainted
    /// after the grace period, their pods evicted after the toleration.
    fn node_lifecycle(&mut self, now: Timestamp) {
        let grace = self.behaviour.node_monitor_grace;
        let toleration = self.behaviour.unreachable_toleration;
        // A kubelet that stopped posting: silent from the moment it was first seen so.
        for n in &self.faults.kubelet_down {
            if !self.silent_since.contains_key(n) {
                self.silent_since.insert(n.clone(), now);
            }
        }
        let silent: Vec<(String, Timestamp)> = self
            .silent_since
            .iter()
            .map(|(n, t)| (n.clone(), *t))
            .collect();
        for (node, since) in silent {
            let unreachable_at = since.plus(grace);
            if now < unreachable_at {
                continue;
            }
            // Judged in place: the Node is copied only to change it.
            let Some(n) = self.store.get("nodes", "", &node) else {
                self.silent_since.remove(&node);
                continue;
            };
            if is_ready(n) {
                let _ = self.node_ready_unsynced(&node, false, now);
            }
            if let Some(n) = self.store.get("nodes", "", &node) {
                if !has_taint(n, UNREACHABLE_TAINT) {
                    let mut n = n.clone();
                    add_taint(&mut n, UNREACHABLE_TAINT, "NoExecute", unreachable_at);
                    let _ = self.store.update(rt("nodes"), "", &node, n);
                }
            }
            if now < unreachable_at.plus(toleration) {
                continue;
            }
            // Deleting runs the controllers; they run once, after this pass.
            let deferred = std::mem::replace(&mut self.deferred, true);
            let evicted: Vec<Value> = self
                .store
                .by_field("pods", "/spec/nodeName", &node)
                .filter(|p| taint_evicts(p))
                .cloned()
                .collect();
            for pod in evicted {
                let (ns, name) = (namespace_of(&pod).to_string(), name_of(&pod).to_string());
                self.record_event(
                    &pod,
                    "TaintManagerEviction",
                    "Marking for deletion Pod",
                    now,
                );
                let _ = self.delete_pod(&ns, &name, None, now);
            }
            self.deferred = deferred;
        }
    }

    /// What the kubelets of nodes still heard from post: the node Lease in `kube-node-lease`
    /// renewed every 10 s (a quarter of its 40 s duration) and the Node's condition
    /// heartbeats every 5 min (`nodeStatusReportFrequency`). Brought up to date when the
    /// model is read rather than on a timer, so an idle twin stays asleep.
    fn heartbeats(&mut self, now: Timestamp) {
        const RENEW: Duration = Duration::from_secs(10);
        const REPORT: Duration = Duration::from_secs(300);
        if now < self.heartbeat_due || self.store.dry_run {
            return;
        }
        self.heartbeat_due = now.plus(RENEW);
        let nodes: Vec<String> = self
            .store
            .iter("nodes")
            .map(|n| name_of(n).to_string())
            .filter(|n| !self.silent_since.contains_key(n))
            .collect();
        for node in nodes {
            if let Some(mut lease) = self.store.get("leases", "kube-node-lease", &node).cloned() {
                let renewed = lease
                    .at("/spec/renewTime")
                    .and_then(Value::as_str)
                    .and_then(parse_time);
                if renewed.is_none_or(|t| now.since(t) >= RENEW) {
                    set_path(&mut lease, &["spec", "renewTime"], json!(micro_time(now)));
                    if let Some(m) = lease.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("resourceVersion");
                    }
                    let _ = self
                        .store
                        .update(rt("leases"), "kube-node-lease", &node, lease);
                }
            }
            // Judged in place: a Node is copied only on its five-minute report.
            let stale = self
                .store
                .get("nodes", "", &node)
                .and_then(|n| n.at("/status/conditions"))
                .and_then(Value::as_array)
                .is_some_and(|conds| {
                    conds.iter().any(|c| {
                        c.get("lastHeartbeatTime")
                            .and_then(Value::as_str)
                            .and_then(parse_time)
                            .is_some_and(|t| now.since(t) >= REPORT)
                    })
                });
            if !stale {
                continue;
            }
            let Some(mut n) = self.store.get("nodes", "", &node).cloned() else {
                continue;
            };
            if let Some(conds) = n
                .get_mut("status")
                .and_then(|s| s.get_mut("conditions"))
                .and_then(Value::as_array_mut)
            {
                for c in conds.iter_mut() {
                    if c.get("lastHeartbeatTime").is_some() {
                        c["lastHeartbeatTime"] = json!(now.rfc3339());
                    }
                }
                if let Some(m) = n.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                let _ = self.store.update(rt("nodes"), "", &node, n);
            }
        }
    }

    /// When kube-controller-manager next acts on a silent node.
    fn next_node_lifecycle(&self) -> Option<Timestamp> {
        let grace = self.behaviour.node_monitor_grace;
        let toleration = self.behaviour.unreachable_toleration;
        self.silent_since
            .iter()
            .filter_map(|(node, since)| {
                let unreachable_at = since.plus(grace);
                let evict_at = unreachable_at.plus(toleration);
                let n = self.store.get("nodes", "", node)?;
                if is_ready(n) || !has_taint(n, UNREACHABLE_TAINT) {
                    return Some(unreachable_at);
                }
                let evictable = self
                    .store
                    .by_field("pods", "/spec/nodeName", node)
                    .any(taint_evicts);
                evictable.then_some(evict_at)
            })
            .min()
    }

    /// Cordon (`true`) or uncordon a node.
    pub fn set_unschedulable(
        &mut self,
        node: &str,
        unschedulable: bool,
        now: Timestamp,
    ) -> Result<(), ApiError> {
        let Some(mut n) = self.store.get("nodes", "", node).cloned() else {
            return Err(ApiError::not_found(rt("nodes"), node));
        };
        if unschedulable {
            set_path(&mut n, &["spec", "unschedulable"], json!(true));
        } else if let Some(spec) = n.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("unschedulable");
        }
        self.store.update(rt("nodes"), "", node, n)?;
        self.sync(now);
        Ok(())
    }

    /// The kubelet restarted with a new version.
    pub fn set_kubelet_version(
        &mut self,
        node: &str,
        version: &str,
        now: Timestamp,
    ) -> Result<(), ApiError> {
        let Some(mut n) = self.store.get("nodes", "", node).cloned() else {
            return Err(ApiError::not_found(rt("nodes"), node));
        };
        set_path(
            &mut n,
            &["status", "nodeInfo", "kubeletVersion"],
            json!(version),
        );
        self.store.update(rt("nodes"), "", node, n)?;
        self.sync(now);
        Ok(())
    }

    /// The OS image the node reports, e.g. `Talos (v1.11.3)`.
    pub fn set_os_image(
        &mut self,
        node: &str,
        os_image: &str,
        now: Timestamp,
    ) -> Result<(), ApiError> {
        let Some(mut n) = self.store.get("nodes", "", node).cloned() else {
            return Err(ApiError::not_found(rt("nodes"), node));
        };
        set_path(&mut n, &["status", "nodeInfo", "osImage"], json!(os_image));
        self.store.update(rt("nodes"), "", node, n)?;
        self.sync(now);
        Ok(())
    }

    /// Pods bound to a node.
    pub fn pods_on_node(&self, node: &str) -> Vec<Value> {
        self.pods_on(node)
    }

    /// Post or replace the mirror pod of a static pod (`<component>-<node>` in kube-system),
    /// as the kubelet does after a static pod (re)starts.
    pub fn upsert_mirror_pod(
        &mut self,
        node: &str,
        component: &str,
        image: &str,
        config_version: &str,
        ready: bool,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        let Some(n) = self.store.get("nodes", "", node) else {
            return Err(ApiError::not_found(rt("nodes"), node));
        };
        let mut pod = super::seed::mirror_pod(n, component, image, config_version, now);
        if !ready {
            set_condition(&mut pod, "Ready", false, "ContainersNotReady", now);
            set_condition(
                &mut pod,
                "ContainersReady",
                false,
                "ContainersNotReady",
                now,
            );
            pod["status"]["containerStatuses"][0]["ready"] = json!(false);
        }
        self.upsert(pod, now)
    }

    /// Set an Argo CD Application's sync and health status (e.g. the CNI hand-over).
    pub fn set_application_status(
        &mut self,
        namespace: &str,
        name: &str,
        sync: &str,
        health: &str,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        let Some(mut app) = self.store.get("applications", namespace, name).cloned() else {
            return Err(ApiError::not_found(rt("applications"), name));
        };
        set_path(&mut app, &["status", "sync", "status"], json!(sync));
        set_path(&mut app, &["status", "health", "status"], json!(health));
        set_path(&mut app, &["status", "reconciledAt"], json!(now.rfc3339()));
        if let Some(m) = app.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let out = self
            .store
            .update(rt("applications"), namespace, name, app)?;
        self.sync(now);
        Ok(Arc::unwrap_or_clone(out))
    }

    /// A client requested a deprecated API: it shows in `apiserver_requested_deprecated_apis`.
    pub fn record_deprecated_request(&mut self, api: DeprecatedApi) {
        if !self.deprecated_apis.contains(&api) {
            self.deprecated_apis.push(api);
        }
    }

    /// Another holder takes the Lease (fault: a stolen lock).
    pub fn steal_lease(
        &mut self,
        namespace: &str,
        name: &str,
        holder: &str,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        let rt = rt("leases");
        let Some(mut l) = self.store.get("leases", namespace, name).cloned() else {
            return Err(ApiError::not_found(rt, name));
        };
        let transitions = l
            .at("/spec/leaseTransitions")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        set_path(&mut l, &["spec", "holderIdentity"], json!(holder));
        set_path(&mut l, &["spec", "acquireTime"], json!(micro_time(now)));
        set_path(&mut l, &["spec", "renewTime"], json!(micro_time(now)));
        set_path(
            &mut l,
            &["spec", "leaseTransitions"],
            json!(transitions + 1),
        );
        if let Some(m) = l.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        self.store
            .update(rt, namespace, name, l)
            .map(Arc::unwrap_or_clone)
    }

    /// Fault: this PDB never allows a disruption (or allows again with `false`).
    /// The `replicasNeverRebuild` fault: these Longhorn volumes' failed replicas are never
    /// rebuilt. Replaces the current set; a volume taken out rebuilds from now on.
    pub fn set_replicas_never_rebuild(&mut self, volumes: BTreeSet<String>, now: Timestamp) {
        self.faults.replicas_never_rebuild = volumes;
        self.invalidate();
        self.sync(now);
    }

    /// The `kubeletDown` fault: these nodes' kubelets post nothing from now on; a node taken
    /// out posts Ready again (its kubelet restarted).
    pub fn set_kubelet_down(&mut self, nodes: BTreeSet<String>, now: Timestamp) {
        let back: Vec<String> = self
            .faults
            .kubelet_down
            .difference(&nodes)
            .cloned()
            .collect();
        self.faults.kubelet_down = nodes;
        for n in back {
            let _ = self.set_node_ready(&n, true, now);
        }
        self.invalidate();
        self.sync(now);
    }

    pub fn set_pdb_never_allows(&mut self, namespace: &str, name: &str, on: bool, now: Timestamp) {
        let key = (namespace.to_string(), name.to_string());
        if on {
            self.faults.pdb_never_allows.insert(key);
        } else {
            self.faults.pdb_never_allows.remove(&key);
        }
        // Not an object change, so the controllers would not otherwise look again.
        self.invalidate();
        self.sync(now);
    }

    /// Fault: fail the next `n` API requests with 500, or 429 with `Retry-After`.
    pub fn fail_next_requests(&mut self, n: u32, code: u16, retry_after_secs: u64) {
        self.faults.burst_remaining = n;
        self.faults.burst_code = code;
        self.faults.retry_after_secs = retry_after_secs;
    }

    /// Fault: every Lease request fails with 503 while `on` (the others are answered).
    pub fn set_leases_unreachable(&mut self, on: bool) {
        self.faults.leases_unreachable = on;
    }

    /// Take one injected failure for a request, if a burst is running.
    pub fn take_burst(&mut self) -> Option<(u16, u64)> {
        if self.faults.burst_remaining == 0 {
            return None;
        }
        self.faults.burst_remaining -= 1;
        Some((self.faults.burst_code, self.faults.retry_after_secs))
    }

    // ---- the Eviction API --------------------------------------------------------------

    /// POST pods/eviction (policy/v1): the pod is deleted when no PDB covers it or the
    /// one PDB that does allows it; 429 with the DisruptionBudget cause when it blocks; 500
    /// when several PDBs match. Returns the success Status.
    pub fn evict(
        &mut self,
        namespace: &str,
        name: &str,
        eviction: &Value,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        self.sync(now);
        let pods = rt_pods();
        // As the apiserver's EvictionREST.Create, before it looks the pod up.
        if eviction.at("/metadata/name").and_then(Value::as_str) != Some(name) {
            return Err(ApiError::bad_request(
                "name in URL does not match name in Eviction object",
            ));
        }
        let Some(pod) = self.store.get("pods", namespace, name).cloned() else {
            return Err(ApiError::not_found(pods, name));
        };
        if let Some(uid) = eviction
            .at("/deleteOptions/preconditions/uid")
            .and_then(Value::as_str)
        {
            if pod.at("/metadata/uid").and_then(Value::as_str) != Some(uid) {
                return Err(ApiError::conflict(pods, name));
            }
        }
        let dry_run = self.store.dry_run
            || eviction
                .at("/deleteOptions/dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        let success = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                             "status": "Success", "code": 201});
        let phase = pod
            .at("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        // As the apiserver's canIgnorePDB: finished, not yet running, or already terminating.
        let terminal = matches!(phase, "Succeeded" | "Failed" | "Pending")
            || pod.at("/metadata/deletionTimestamp").is_some();
        let pdbs: Vec<Arc<Value>> = if terminal {
            Vec::new()
        } else {
            self.store
                .list(
                    "poddisruptionbudgets",
                    Some(namespace),
                    &LabelSelector::default(),
                    &FieldSelector::default(),
                )
                .into_iter()
                .filter(|pdb| {
                    LabelSelector::from_object(pdb.at("/spec/selector").unwrap_or(&Value::Null))
                        .is_some_and(|s| s.matches_object(&pod))
                })
                .collect()
        };
        if pdbs.len() > 1 {
            return Err(ApiError::new(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        if let Some(pdb) = pdbs.first() {
            let pdb_name = name_of(pdb).to_string();
            let generation = pdb
                .at("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let observed = pdb
                .at("/status/observedGeneration")
                .and_then(Value::as_i64)
                .unwrap_or(-1);
            let too_many = |cause: String| ApiError {
                details: Some(
                    json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]}),
                ),
                ..ApiError::new(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                )
            };
            if observed < generation {
                return Err(too_many(format!(
                    "The disruption budget {pdb_name} is still being processed by the server."
                )));
            }
            let allowed = pdb
                .at("/status/disruptionsAllowed")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let current = pdb
                .at("/status/currentHealthy")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let desired = pdb
                .at("/status/desiredHealthy")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if allowed < 0 {
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    "pdb disruptions allowed is negative",
                ));
            }
            let running_unready = phase == "Running" && !is_ready(&pod);
            let policy = pdb
                .at("/spec/unhealthyPodEvictionPolicy")
                .and_then(Value::as_str)
                .unwrap_or("IfHealthyBudget");
            let ok = if running_unready {
                policy == "AlwaysAllow" || current >= desired
            } else {
                allowed > 0
            };
            if !ok {
                return Err(too_many(format!(
                    "The disruption budget {pdb_name} needs {desired} healthy pods and has {current} currently"
                )));
            }
        }
        if !dry_run {
            let grace = eviction
                .at("/deleteOptions/gracePeriodSeconds")
                .and_then(Value::as_u64)
                .map(Duration::from_secs);
            self.delete_pod(namespace, name, grace, now)?;
            self.record_event(&pod, "Evicted", "Eviction API: pod evicted", now);
        }
        Ok(success)
    }

    /// Record a core/v1 Event about an object.
    pub fn record_event(&mut self, about: &Value, reason: &str, message: &str, now: Timestamp) {
        let ns = match namespace_of(about) {
            "" => "default",
            ns => ns,
        }
        .to_string();
        let ev = json!({
            "metadata": {"generateName": format!("{}.", name_of(about)), "namespace": ns},
            "involvedObject": {
                "apiVersion": about.get("apiVersion").cloned().unwrap_or(Value::Null),
                "kind": about.get("kind").cloned().unwrap_or(Value::Null),
                "name": name_of(about), "namespace": namespace_of(about),
                "uid": about.at("/metadata/uid").cloned().unwrap_or(Value::Null),
            },
            "reason": reason, "message": message, "type": "Normal", "count": 1,
            "firstTimestamp": now.rfc3339(), "lastTimestamp": now.rfc3339(),
            "source": {"component": "ichor-twin"},
        });
        let _ = self.store.create(rt("events"), &ns, ev, now);
    }

    // ---- the controllers -----------------------------------------------------------------

    /// Called after an object changed through the API or the library.
    pub fn after_change(&mut self, plural: &str, obj: &Value, now: Timestamp) {
        if self.store.dry_run {
            return;
        }
        if plural == "pods" && obj.at("/status/phase").and_then(Value::as_str) == Some("Pending") {
            self.pending
                .entry((namespace_of(obj).to_string(), name_of(obj).to_string()))
                .or_insert(now);
        }
    }

    /// Apply everything due at `now`, in order, until nothing changes.
    pub fn sync(&mut self, now: Timestamp) {
        if self.store.dry_run || self.deferred {
            return;
        }
        if now > self.now {
            self.now = now;
        }
        let now = self.now;
        self.heartbeats(now);
        // Nothing changed and nothing is due: the model is already settled.
        let rv = self.store.resource_version();
        if self.next_due.is_none_or(|d| now < d) {
            if self.settled_at == Some(rv) {
                return;
            }
            // Only what no controller reads changed (the kubelets' Lease renewals every
            // 10 s): a pass would change nothing, so count it as settled without one.
            if let Some(at) = self.settled_at {
                let unread = self.store.changes_since(at).is_some_and(|mut changes| {
                    changes.all(|e| UNREAD_BY_CONTROLLERS.contains(&e.plural))
                });
                if unread {
                    if self.statuses_at == Some(at) {
                        self.statuses_at = Some(rv);
                    }
                    self.settled_at = Some(rv);
                    return;
                }
            }
        }
        let gone: Vec<(String, String)> = self
            .terminating
            .iter()
            .filter(|(_, due)| **due <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for (ns, name) in gone {
            let _ = self.store.delete(rt_pods(), &ns, &name);
            self.terminating.remove(&(ns, name));
        }
        self.node_lifecycle(now);
        if self.status_due.values().any(|t| *t <= now) {
            self.statuses_at = None;
        }
        // The controllers run until they change nothing more (a few passes: deployments →
        // replicasets → pods); status, which no controller reads, is computed once after.
        // Each pass looks only at the owners whose pods or specs changed since the last one.
        let mut since = self.settled_at;
        let mut settled = false;
        for _ in 0..6 {
            let before = self.store.resource_version();
            let dirty = self.dirty_since(since);
            self.deployments(now, &dirty);
            self.replica_sets(now, &dirty);
            self.stateful_sets(now, &dirty);
            self.daemon_sets(now, &dirty);
            self.start_pending(now);
            self.pod_gc(&dirty);
            self.longhorn(now);
            self.attach_detach(now);
            if self.store.resource_version() == before {
                settled = true;
                break;
            }
            since = Some(before);
        }
        let dirty = self.dirty_since(self.statuses_at);
        self.statuses(now, &dirty);
        self.statuses_at = Some(self.store.resource_version());
        // Out of passes before settling: the next sync picks up from the last pass.
        self.settled_at = if settled {
            Some(self.store.resource_version())
        } else {
            since
        };
        let pod_due = self.next_pod_start;
        let rebuild_due = self
            .degraded_since
            .values()
            .map(|t| t.plus(self.behaviour.replica_rebuild_delay));
        let gone_due = self.terminating.values().copied();
        let resync_due = self.resync_due.values().copied();
        let detach_due = self.detach_due.values().copied();
        let status_due = self.status_due.values().copied();
        self.next_due = pod_due
            .into_iter()
            .chain(status_due)
            .chain(rebuild_due)
            .chain(gone_due)
            .chain(resync_due)
            .chain(detach_due)
            .chain(self.next_node_lifecycle())
            .min();
    }

    /// Advance the model to `now` (same as `sync`).
    pub fn advance_to(&mut self, now: Timestamp) {
        self.sync(now)
    }

    /// Forget what is settled: the next sync looks at everything.
    ///
    /// Longhorn's pass keeps what it saw: besides the store's changes it compares the
    /// silent kubelets and the fault it reads itself, so a kubelet fault touches only the
    /// volumes with a replica on the nodes it silenced or brought back. (A node going down
    /// does not invalidate: see [`Cluster::node_down`].)
    fn invalidate(&mut self) {
        self.settled_at = None;
        self.statuses_at = None;
        self.attach_quiet = None;
        self.attach_pods.clear();
    }

    /// What changed after `rv` (everything when unknown or older than the history).
    fn dirty_since(&self, rv: Option<u64>) -> Dirty {
        let everything = Dirty {
            all: true,
            ..Dirty::default()
        };
        let Some(changes) = rv.and_then(|rv| self.store.changes_since(rv)) else {
            return everything;
        };
        let mut d = Dirty::default();
        for e in changes {
            let name = name_of(&e.object);
            let kind = match e.plural {
                "pods" => {
                    if let Some((k, n)) = controller_of(&e.object) {
                        d.owners
                            .insert((k.to_string(), e.namespace.clone(), n.to_string()));
                    }
                    d.pods.push((e.kind, e.object.clone()));
                    continue;
                }
                "poddisruptionbudgets" => {
                    d.pdbs.insert((e.namespace.clone(), name.to_string()));
                    continue;
                }
                // DaemonSets cover every node (and count them in their status): what they
                // read changes when a Node comes or goes, not with its heartbeats.
                "nodes" => {
                    d.nodes |= e.kind != EventType::Modified;
                    continue;
                }
                "replicasets" => "ReplicaSet",
                "statefulsets" => "StatefulSet",
                "daemonsets" => "DaemonSet",
                "deployments" => "Deployment",
                _ => continue,
            };
            let key = (kind.to_string(), e.namespace.clone(), name.to_string());
            d.objects.insert(key.clone());
            d.owners.insert(key);
        }
        d
    }

    fn pods_on(&self, node: &str) -> Vec<Value> {
        self.store
            .by_field("pods", "/spec/nodeName", node)
            .cloned()
            .collect()
    }

    /// The pods of one controller: just what the controllers look at.
    fn briefs_of(&self, ns: &str, kind: &str, name: &str) -> Vec<PodBrief> {
        self.store
            .pods_owned_by(ns, kind, name)
            .into_iter()
            .map(|p| PodBrief {
                namespace: namespace_of(p).to_string(),
                name: name_of(p).to_string(),
                template: pod_template_hash(p).map(String::from),
                terminating: p.at("/metadata/deletionTimestamp").is_some(),
            })
            .collect()
    }

    /// Name, readiness and schedulability of every node, kept current from the Nodes that
    /// changed since the last read (all of them again when a Node came or went, or the
    /// history no longer reaches back).
    fn node_briefs(&mut self) -> Arc<Vec<NodeBrief>> {
        self.node_view().briefs.clone()
    }

    fn node_view(&mut self) -> &NodeView {
        let rv = self.store.resource_version();
        let last = self.store.last_change("nodes");
        let kept = match self.node_view.take() {
            Some(v) if last <= v.at => Some(v),
            Some(mut v) => self.changed_nodes(v.at).map(|names| {
                for name in names {
                    let fresh = self.store.get("nodes", "", &name).map(node_brief);
                    let Some(fresh) = fresh else { continue };
                    let Ok(i) = v.briefs.binary_search_by(|b| b.name.cmp(&name)) else {
                        continue;
                    };
                    if v.briefs[i] != fresh {
                        Arc::make_mut(&mut v.briefs)[i] = fresh;
                        v.changed = rv;
                    }
                }
                v.at = rv;
                v
            }),
            None => None,
        };
        let view = kept.unwrap_or_else(|| NodeView {
            at: rv,
            changed: rv,
            briefs: Arc::new(self.build_node_briefs()),
        });
        self.node_view.insert(view)
    }

    /// The names of the Nodes modified after `rv`; `None` when a Node was added or deleted
    /// since, or the history no longer reaches back.
    fn changed_nodes(&self, rv: u64) -> Option<BTreeSet<String>> {
        let mut names = BTreeSet::new();
        for e in self.store.changes_since(rv)? {
            if e.plural != "nodes" {
                continue;
            }
            if e.kind != EventType::Modified {
                return None;
            }
            names.insert(name_of(&e.object).to_string());
        }
        Some(names)
    }

    fn build_node_briefs(&self) -> Vec<NodeBrief> {
        let mut briefs: Vec<NodeBrief> = self.store.iter("nodes").map(node_brief).collect();
        briefs.sort_by(|a, b| a.name.cmp(&b.name));
        briefs
    }

    /// A node pods can be scheduled on: Ready, not cordoned, no NoSchedule taint.
    fn schedulable(node: &Value) -> bool {
        !Self::cordoned(node) && Self::ready_untainted(node)
    }

    /// Ready and without a NoSchedule taint, but cordoned: only a pod that tolerates the
    /// `node.kubernetes.io/unschedulable` taint goes there.
    fn cordoned_only(node: &Value) -> bool {
        Self::cordoned(node) && Self::ready_untainted(node)
    }

    fn cordoned(node: &Value) -> bool {
        node.at("/spec/unschedulable").and_then(Value::as_bool) == Some(true)
    }

    fn ready_untainted(node: &Value) -> bool {
        let tainted = node
            .at("/spec/taints")
            .and_then(Value::as_array)
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.get("effect").and_then(Value::as_str) == Some("NoSchedule"))
            });
        is_ready(node) && !tainted
    }

    fn new_pod(
        &mut self,
        owner: &Value,
        name: String,
        node: Option<&str>,
        volumes: Vec<Value>,
        now: Timestamp,
    ) {
        let template = owner.at("/spec/template").cloned().unwrap_or(json!({}));
        let ns = namespace_of(owner).to_string();
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": ns,
                "labels": template.at("/metadata/labels").cloned().unwrap_or(json!({})),
                "ownerReferences": [owner_ref(owner)],
            },
            "spec": template.get("spec").cloned().unwrap_or(json!({})),
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": if node.is_some() {"True"} else {"False"}}]},
        });
        if let Some(a) = template.at("/metadata/annotations") {
            set_path(&mut pod, &["metadata", "annotations"], a.clone());
        }
        set_path(
            &mut pod,
            &["metadata", "annotations", TEMPLATE_HASH],
            json!(template_hash(owner)),
        );
        if let Some(n) = node {
            set_path(&mut pod, &["spec", "nodeName"], json!(n));
        }
        if !volumes.is_empty() {
            let mut all = pod["spec"]["volumes"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            all.extend(volumes);
            set_path(&mut pod, &["spec", "volumes"], Value::Array(all));
        }
        if let Ok(p) = self.store.create(rt_pods(), &ns, pod, now) {
            self.pending.insert((ns, name_of(&p).to_string()), now);
        }
    }

    /// Deployments own one ReplicaSet each: its scale and pod template follow the
    /// Deployment's (the twin updates the ReplicaSet in place instead of creating a new one).
    /// Looks only at the Deployments that changed or whose ReplicaSets (or their pods)
    /// did: the others were settled by an earlier pass and nothing they read moved since.
    fn deployments(&mut self, now: Timestamp, dirty: &Dirty) {
        self.deployment_sets
            .refresh(&self.store, &mut self.deployments_moved);
        let mut touched = std::mem::take(&mut self.deployments_moved);
        // The pass reads the Deployment and its ReplicaSets, never their pods: a pod's
        // change (Ready, gone) leaves it as it was. Upstream's controller is woken by a pod
        // only when one is deleted under the Recreate strategy, which the twin does not
        // model (kubernetes v1.33.5 pkg/controller/deployment/deployment_controller.go
        // `deletePod`); the counts are the status pass's.
        touched.extend(self.deployment_sets.touched(&self.store, dirty, false));
        for (ns, dname) in touched {
            #[cfg(test)]
            self.judged.push(format!("deployment pass {ns}/{dname}"));
            let mine = self.deployment_sets.of(&ns, &dname);
            // Shared, not copied: most passes change nothing.
            let Some(d) = self.store.shared("deployments", &ns, &dname).cloned() else {
                continue;
            };
            let want = replicas_of(&d, self.behaviour.max_replicas);
            let template = d.at("/spec/template").cloned().unwrap_or(json!({}));
            // A Deployment created through the API gets its ReplicaSet, named and labelled
            // with the template's hash (pkg/controller/deployment/sync.go `getNewReplicaSet`,
            // kubernetes v1.33.5); seeded ones come with theirs.
            let has_rs = !mine.is_empty();
            if !has_rs {
                let hash = template_hash(&d);
                let mut labels = template
                    .at("/metadata/labels")
                    .cloned()
                    .unwrap_or(json!({}));
                if let Some(m) = labels.as_object_mut() {
                    m.insert("pod-template-hash".into(), json!(hash));
                }
                let mut rs_template = template.clone();
                set_path(
                    &mut rs_template,
                    &["metadata", "labels", "pod-template-hash"],
                    json!(hash),
                );
                let rs = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {"name": format!("{}-{hash}", name_of(&d)), "namespace": ns,
                                 "labels": labels, "ownerReferences": [owner_ref(&d)]},
                    "spec": {"replicas": want, "selector": {"matchLabels": labels}, "template": rs_template},
                });
                let _ = self.store.create(rt("replicasets"), &ns, rs, now);
                continue;
            }
            for rs_name in &mine {
                let Some(rs) = self.store.shared("replicasets", &ns, rs_name).cloned() else {
                    continue;
                };
                // The ReplicaSet's template carries pod-template-hash on top of the Deployment's.
                let mut rs_template = template.clone();
                if let Some(h) = rs.at("/spec/template/metadata/labels/pod-template-hash") {
                    set_path(
                        &mut rs_template,
                        &["metadata", "labels", "pod-template-hash"],
                        h.clone(),
                    );
                }
                if replicas_of(&rs, self.behaviour.max_replicas) != want
                    || rs.at("/spec/template") != Some(&rs_template)
                {
                    let mut rs2 = Value::clone(&rs);
                    set_path(&mut rs2, &["spec", "replicas"], json!(want));
                    set_path(&mut rs2, &["spec", "template"], rs_template);
                    if let Some(m) = rs2.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("resourceVersion");
                    }
                    let _ = self.store.update(rt("replicasets"), &ns, name_of(&rs), rs2);
                }
            }
        }
    }

    /// Rolling update, one pod at a time: when none of the owner's pods is starting,
    /// replace one pod built from an older template.
    fn roll(&mut self, owner: &Value, have: &[PodBrief]) {
        let current = template_hash(owner);
        let starting = have.iter().any(|p| {
            self.pending
                .contains_key(&(p.namespace.clone(), p.name.clone()))
        });
        if starting {
            return;
        }
        if let Some(stale) = have
            .iter()
            .find(|p| p.template.as_deref() != Some(current.as_str()))
        {
            let _ = self.store.delete(rt_pods(), &stale.namespace, &stale.name);
        }
    }

    fn replica_sets(&mut self, now: Timestamp, dirty: &Dirty) {
        for (ns, name) in dirty.owners_to_look_at(&self.store, "replicasets", "ReplicaSet") {
            let Some(rs) = self.store.shared("replicasets", &ns, &name).cloned() else {
                continue;
            };
            let mut have = self.briefs_of(&ns, "ReplicaSet", name_of(&rs));
            // Terminating pods no longer count: the ReplicaSet replaces them at once.
            let winding_down = have.iter().any(|p| p.terminating);
            have.retain(|p| !p.terminating);
            let want = replicas_of(&rs, self.behaviour.max_replicas) as usize;
            for _ in have.len()..want {
                let name = format!("{}-{}", name_of(&rs), self.store.suffix());
                self.new_pod(&rs, name, None, Vec::new(), now);
            }
            // Scale down: drop the newest extra pods.
            for p in have.iter().skip(want) {
                let _ = self.store.delete(rt_pods(), &ns, &p.name);
            }
            if have.len() == want && !winding_down {
                self.roll(&rs, &have);
            }
        }
    }

    fn stateful_sets(&mut self, now: Timestamp, dirty: &Dirty) {
        for (ns, name) in dirty.owners_to_look_at(&self.store, "statefulsets", "StatefulSet") {
            let Some(sts) = self.store.shared("statefulsets", &ns, &name).cloned() else {
                continue;
            };
            let mut have = Vec::new();
            for i in 0..replicas_of(&sts, self.behaviour.max_replicas) {
                let name = format!("{}-{}", name_of(&sts), i);
                match self.store.get("pods", &ns, &name) {
                    Some(p) => have.push(PodBrief {
                        namespace: ns.clone(),
                        name: name.clone(),
                        template: pod_template_hash(p).map(String::from),
                        terminating: p.at("/metadata/deletionTimestamp").is_some(),
                    }),
                    None => {
                        // One claim per volumeClaimTemplate: `<template>-<pod>`.
                        let claims: Vec<Value> = sts
                            .at("/spec/volumeClaimTemplates")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                            .map(|t| {
                                let tname = name_of(t);
                                json!({"name": tname, "persistentVolumeClaim": {"claimName": format!("{tname}-{name}")}})
                            })
                            .collect();
                        self.new_pod(&sts, name, None, claims, now)
                    }
                }
            }
            if have.len() as u64 == replicas_of(&sts, self.behaviour.max_replicas) {
                // StatefulSets roll from the highest ordinal down.
                have.reverse();
                self.roll(&sts, &have);
            }
        }
    }

    fn daemon_sets(&mut self, now: Timestamp, dirty: &Dirty) {
        let mut briefs: Option<Arc<Vec<NodeBrief>>> = None;
        for (ns, name) in dirty.owners_to_look_at(&self.store, "daemonsets", "DaemonSet") {
            let Some(ds) = self.store.shared("daemonsets", &ns, &name).cloned() else {
                self.daemon_sets_settled.remove(&(ns, name));
                continue;
            };
            let key = (ns, name);
            let (ns, name) = (&key.0, &key.1);
            // A settled DaemonSet (one current pod on every node) stays settled while its
            // spec and the set of nodes stay, and its pods only change state: a pod
            // turning Ready on a rebooted node need not read the other 499.
            let spec = DaemonSetSpec::of(&ds);
            if !dirty.all && !dirty.nodes {
                let settled = self.daemon_sets_settled.get(&key).is_some_and(|s| {
                    *s == spec
                        && dirty.pods_of(ns, "DaemonSet", name).all(|(kind, p)| {
                            *kind == EventType::Modified
                                && pod_template_hash(p) == Some(s.template.as_str())
                        })
                });
                if settled {
                    continue;
                }
            }
            #[cfg(test)]
            self.judged.push(format!("daemonset pass {ns}/{name}"));
            // Read the nodes once, and only when some DaemonSet looks at them.
            let nodes = briefs.get_or_insert_with(|| self.node_briefs()).clone();
            // Judged in place over the DaemonSet's pods (one per node); what to change is
            // collected, then done.
            let (missing, orphans, replace, settled) = {
                let have = self.store.pods_owned_by(ns, "DaemonSet", name);
                let covered: HashSet<&str> = have.iter().map(|p| node_of(p)).collect();
                // Every node gets one (DaemonSet pods tolerate NotReady); on a NotReady node
                // the pod stays Pending until the kubelet is back.
                let missing: Vec<String> = nodes
                    .iter()
                    .filter(|n| !covered.contains(n.name.as_str()))
                    .map(|n| n.name.clone())
                    .collect();
                // Pods of a node that no longer exists are garbage.
                let orphans: Vec<String> = have
                    .iter()
                    .filter(|p| brief_of(&nodes, node_of(p)).is_none())
                    .map(|p| name_of(p).to_string())
                    .collect();
                let replace = if missing.is_empty() {
                    daemon_set_replacements(&ds, &have, nodes.len() as u64)
                } else {
                    Vec::new()
                };
                let settled = missing.is_empty()
                    && orphans.is_empty()
                    && have.len() == nodes.len()
                    && have
                        .iter()
                        .all(|p| pod_template_hash(p) == Some(spec.template.as_str()));
                (missing, orphans, replace, settled)
            };
            for node in missing {
                let pod = format!("{}-{}", name, self.store.suffix());
                self.new_pod(&ds, pod, Some(&node), Vec::new(), now);
            }
            for pod in orphans.iter().chain(&replace) {
                let _ = self.store.delete(rt_pods(), ns, pod);
            }
            if settled {
                self.daemon_sets_settled.insert(key, spec);
            } else {
                self.daemon_sets_settled.remove(&key);
            }
        }
    }

    /// Pods bound to a node that no longer exists are deleted, as the pod GC does. A pod is
    /// orphaned when its Node goes or it is bound to a node that is not there: unless a
    /// Node went, only the nodes of the pods that changed are looked at.
    fn pod_gc(&mut self, dirty: &Dirty) {
        let store = &self.store;
        let gone = |node: &&str| !node.is_empty() && store.get("nodes", "", node).is_none();
        let nodes: BTreeSet<&str> = if dirty.all || dirty.nodes {
            store
                .field_values("pods", "/spec/nodeName")
                .filter(gone)
                .collect()
        } else {
            dirty
                .pods
                .iter()
                .map(|(_, p)| node_of(p))
                .filter(gone)
                .collect()
        };
        // By the node index: only the pods of nodes that are gone, in store order.
        let orphans: BTreeSet<(String, String)> = nodes
            .into_iter()
            .flat_map(|n| store.by_field("pods", "/spec/nodeName", n))
            .map(|p| (namespace_of(p).to_string(), name_of(p).to_string()))
            .collect();
        for (ns, name) in orphans {
            let _ = self.store.delete(rt_pods(), &ns, &name);
            self.pending.remove(&(ns.clone(), name.clone()));
            self.terminating.remove(&(ns, name));
        }
    }

    /// The node a pending pod may run on, for pods bound by PV node affinity (local-path).
    fn pinned_node(&self, pod: &Value) -> Option<String> {
        let vols = pod.at("/spec/volumes")?.as_array()?;
        for v in vols {
            let Some(claim) = v
                .at("/persistentVolumeClaim/claimName")
                .and_then(Value::as_str)
            else {
                continue;
            };
            let ns = namespace_of(pod);
            let pv = self.store.all("persistentvolumes").into_iter().find(|pv| {
                pv.at("/spec/claimRef/name").and_then(Value::as_str) == Some(claim)
                    && pv.at("/spec/claimRef/namespace").and_then(Value::as_str) == Some(ns)
            })?;
            let node = pv
                .at("/spec/nodeAffinity/required/nodeSelectorTerms/0/matchExpressions/0/values/0")
                .and_then(Value::as_str)?;
            return Some(node.to_string());
        }
        None
    }

    /// Start pods whose delay passed: pick a node if none, then Running and Ready.
    fn start_pending(&mut self, now: Timestamp) {
        let delay = self.behaviour.pod_start_delay;
        self.next_pod_start = None;
        let due: Vec<(String, String, Timestamp)> = self
            .pending
            .iter()
            .filter(|(_, t)| t.plus(delay) <= now)
            .map(|((ns, name), t)| (ns.clone(), name.clone(), *t))
            .collect();
        // Pods not due yet wake the model when they are.
        self.next_pod_start = self
            .pending
            .values()
            .map(|t| t.plus(delay))
            .filter(|d| *d > now)
            .min();
        if due.is_empty() {
            return;
        }
        let nodes = self.node_briefs();
        let brief = |name: &str| brief_of(&nodes, name);
        // Pods per node and per owner per node, kept current while placing: per node from
        // the node index (counted when the first unbound pod is placed: most passes only
        // start pods already bound, a DaemonSet's on a rebooted node); per owner from the
        // owner index, counted when the owner's first pod is placed (before any of its pods
        // moves), not by scanning every pod.
        type OwnerKey = (String, String, String);
        let mut per_node: Option<HashMap<String, usize>> = None;
        let count_nodes = |store: &Store| {
            store
                .field_counts("pods", "/spec/nodeName")
                .filter(|(n, _)| !n.is_empty())
                .map(|(n, c)| (n.to_string(), c))
                .collect::<HashMap<String, usize>>()
        };
        let mut per_owner: HashMap<OwnerKey, HashMap<String, usize>> = HashMap::new();
        let owner_key = |p: &Value| {
            controller_of(p)
                .map(|(k, n)| (namespace_of(p).to_string(), k.to_string(), n.to_string()))
        };
        let count_owned = |store: &Store, (ns, kind, name): &OwnerKey| {
            let mut counts: HashMap<String, usize> = HashMap::new();
            for p in store.pods_owned_by(ns, kind, name) {
                let n = node_of(p);
                if !n.is_empty() {
                    *counts.entry(n.to_string()).or_default() += 1;
                }
            }
            counts
        };
        let no_counts = HashMap::new();
        for (ns, name, created) in due {
            // Judged in place; the pod is copied only once it starts.
            let Some(current) = self.store.get("pods", &ns, &name) else {
                self.pending.remove(&(ns, name));
                continue;
            };
            let owner = owner_key(current);
            let unbound = node_of(current).is_empty();
            let node_name = if unbound {
                let pinned = self.pinned_node(current);
                let same = match &owner {
                    Some(o) => &*per_owner
                        .entry(o.clone())
                        .or_insert_with(|| count_owned(&self.store, o)),
                    None => &no_counts,
                };
                let per_node = per_node.get_or_insert_with(|| count_nodes(&self.store));
                // Spread: fewest pods of the same owner, then fewest pods, then name.
                let best = nodes
                    .iter()
                    // A cordon keeps out only pods that do not tolerate it (the
                    // scheduler's NodeUnschedulable plugin: pkg/scheduler/framework/
                    // plugins/nodeunschedulable/node_unschedulable.go at v1.33.5).
                    .filter(|n| {
                        n.schedulable || (n.cordoned_only && tolerates_unschedulable(current))
                    })
                    .filter(|n| selects_node(current, &n.labels))
                    .filter(|n| pinned.as_deref().is_none_or(|p| p == n.name))
                    .min_by_key(|n| {
                        (
                            same.get(&n.name).copied().unwrap_or(0),
                            per_node.get(&n.name).copied().unwrap_or(0),
                            &n.name,
                        )
                    });
                match best {
                    Some(n) => n.name.clone(),
                    None => continue,
                }
            } else {
                // A pod bound to a node starts once that node's kubelet has been Ready
                // for the start delay (a rebooted node restarts its DaemonSet pods).
                let n = node_of(current);
                let Some(node) = brief(n).filter(|x| x.ready) else {
                    continue;
                };
                let start = created.max(node.ready_since).plus(delay);
                if start > now {
                    self.next_pod_start = Some(self.next_pod_start.map_or(start, |t| t.min(start)));
                    continue;
                }
                n.to_string()
            };
            // The kubelet waits for the attach-detach controller (Multi-Attach).
            if self.attached_elsewhere(current, &node_name) {
                continue;
            }
            let mut pod = current.clone();
            if unbound {
                if let Some(o) = owner {
                    *per_owner
                        .entry(o)
                        .or_default()
                        .entry(node_name.clone())
                        .or_default() += 1;
                }
                if let Some(per_node) = per_node.as_mut() {
                    *per_node.entry(node_name.clone()).or_default() += 1;
                }
            }
            let host_ip = brief(&node_name).map(|n| n.ip.clone()).unwrap_or_default();
            let serial = self.store.resource_version();
            set_path(&mut pod, &["spec", "nodeName"], json!(node_name));
            set_path(&mut pod, &["status", "phase"], json!("Running"));
            set_path(&mut pod, &["status", "hostIP"], json!(host_ip));
            set_path(&mut pod, &["status", "hostIPs"], json!([{"ip": host_ip}]));
            // Host-network pods (the CNI, kube-proxy) use the node's address.
            let pod_ip = if pod.at("/spec/hostNetwork") == Some(&json!(true)) {
                host_ip.clone()
            } else {
                format!("10.244.{}.{}", (serial / 250) % 250, serial % 250 + 2)
            };
            set_path(&mut pod, &["status", "podIP"], json!(pod_ip));
            set_path(&mut pod, &["status", "podIPs"], json!([{"ip": pod_ip}]));
            set_path(&mut pod, &["status", "startTime"], json!(now.rfc3339()));
            set_condition(&mut pod, "PodScheduled", true, "", now);
            set_condition(&mut pod, "Initialized", true, "", now);
            set_condition(&mut pod, "ContainersReady", true, "", now);
            set_condition(&mut pod, "Ready", true, "", now);
            let statuses = container_statuses(&pod, now);
            set_path(&mut pod, &["status", "containerStatuses"], statuses);
            if let Some(m) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            if self.store.update(rt_pods(), &ns, &name, pod).is_ok() {
                self.pending.remove(&(ns, name));
            }
        }
    }

    /// Longhorn sees the replicas on a node that went down fail at once: the instance
    /// stops and `spec.failedAt` is set (`healthyAt` keeps when it was last healthy).
    fn replicas_fail_on(&mut self, node: &str, now: Timestamp) {
        let on_node: Vec<Value> = self
            .store
            .by_field("replicas", "/spec/nodeID", node)
            .cloned()
            .collect();
        for r in on_node {
            if r.at("/spec/nodeID").and_then(Value::as_str) != Some(node) {
                continue;
            }
            self.resync_due
                .remove(&(namespace_of(&r).to_string(), name_of(&r).to_string()));
            let mut r2 = r.clone();
            set_path(&mut r2, &["status", "currentState"], json!("stopped"));
            if replica_failed_at(&r).is_empty() {
                set_path(&mut r2, &["spec", "failedAt"], json!(now.rfc3339()));
            }
            if r2 != r {
                if let Some(m) = r2.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                let _ = self
                    .store
                    .update(rt("replicas"), namespace_of(&r), name_of(&r), r2);
            }
        }
    }

    /// Longhorn, per volume (as longhorn-manager's volume controller):
    /// - a failed replica whose node is Ready again is reused: its instance runs again
    ///   (`currentState: running`, `failedAt` and `healthyAt` cleared) and re-syncs from a
    ///   healthy one for `replica_rebuild_delay`, after which `healthyAt` is set (a volume
    ///   with no healthy replica left takes it back at once, as Longhorn salvages one);
    /// - a volume short of replicas for `replica_rebuild_delay` gets a new one on another
    ///   Ready node, in place of a failed one;
    /// - robustness counts the healthy replicas (running, not failed, `healthyAt` set):
    ///   `healthy`, `degraded`, or `faulted` with none.
    ///
    /// The `replicasNeverRebuild` fault stops the first two for its volumes.
    fn longhorn(&mut self, now: Timestamp) {
        let delay = self.behaviour.replica_rebuild_delay;
        let due = self.resync_due.values().any(|t| *t <= now)
            || self.degraded_since.values().any(|t| t.plus(delay) <= now);
        // Quiet since the last pass: no replica or volume changed, no Node's brief, no
        // kubelet went silent or came back, no fault moved, nothing fell due. Judged without
        // reading a Node or a volume.
        let (briefs_changed, briefs) = {
            let view = self.node_view();
            (view.changed, view.briefs.clone())
        };
        if let Some(last) = &self.longhorn_seen {
            let unchanged = self.store.last_change("replicas") <= last.at
                && self.store.last_change("volumes") <= last.at
                && briefs_changed <= last.nodes_changed
                && last.silent.iter().eq(self.silent_since.keys())
                && last.never == self.faults.replicas_never_rebuild;
            if !due && unchanged {
                return;
            }
        }
        // Longhorn sees a node go the moment it does (its manager pod there stops), not after
        // the Node's grace period: a node counts once it is Ready and heard from. Worked out
        // again only when a Node's brief or the silent kubelets changed: most passes follow
        // a replica or a volume, and the set is the cluster's size.
        let ready = match &self.longhorn_seen {
            Some(last)
                if briefs_changed <= last.nodes_changed
                    && last.silent.iter().eq(self.silent_since.keys()) =>
            {
                last.ready.clone()
            }
            _ => Arc::new(
                briefs
                    .iter()
                    .filter(|n| n.ready && !self.silent_since.contains_key(&n.name))
                    .map(|n| n.name.clone())
                    .collect(),
            ),
        };
        let before = self.store.resource_version();
        // A replica deleted while it re-synced has nothing left to finish.
        let store = &self.store;
        self.resync_due
            .retain(|(ns, name), _| store.get("replicas", ns, name).is_some());
        let volumes = self.longhorn_volumes_to_look_at(&ready, now);
        self.longhorn_seen = Some(LonghornSeen {
            at: before,
            nodes_changed: briefs_changed,
            ready: ready.clone(),
            silent: self.silent_since.keys().cloned().collect(),
            never: self.faults.replicas_never_rebuild.clone(),
        });
        for (ns, vname) in volumes {
            #[cfg(test)]
            self.longhorn_judged.push(vname.clone());
            let never = self.faults.replicas_never_rebuild.contains(&vname);
            let Some(vol) = self.store.get("volumes", &ns, &vname) else {
                continue;
            };
            let want = vol
                .at("/spec/numberOfReplicas")
                .and_then(Value::as_u64)
                .unwrap_or(3);
            let replicas = volume_replicas(&self.store, &ns, &vname);
            let mut updates = Vec::new();
            // Re-synced replicas turn healthy.
            for r in &replicas {
                let key = (ns.clone(), name_of(r).to_string());
                if self.resync_due.get(&key).is_some_and(|due| *due <= now) {
                    self.resync_due.remove(&key);
                    let mut r2 = (*r).clone();
                    set_path(&mut r2, &["spec", "healthyAt"], json!(now.rfc3339()));
                    updates.push(r2);
                }
            }
            // Failed replicas on nodes back in service are reused.
            if !never {
                let mut active = replicas
                    .iter()
                    .filter(|r| replica_failed_at(r).is_empty())
                    .count() as u64;
                let mut healthy = replicas.iter().filter(|r| replica_healthy(r)).count();
                for r in &replicas {
                    let node = r.at("/spec/nodeID").and_then(Value::as_str).unwrap_or("");
                    if replica_failed_at(r).is_empty() || !ready.contains(node) || active >= want {
                        continue;
                    }
                    active += 1;
                    let mut r2 = (*r).clone();
                    set_path(&mut r2, &["status", "currentState"], json!("running"));
                    set_path(&mut r2, &["spec", "failedAt"], json!(""));
                    if healthy == 0 {
                        // Nothing to sync from: Longhorn salvages it as it is.
                        set_path(&mut r2, &["spec", "healthyAt"], json!(now.rfc3339()));
                        healthy += 1;
                    } else {
                        set_path(&mut r2, &["spec", "healthyAt"], json!(""));
                        self.resync_due
                            .insert((ns.clone(), name_of(r).to_string()), now.plus(delay));
                    }
                    updates.push(r2);
                }
            }
            for mut r2 in updates {
                if let Some(m) = r2.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                let name = name_of(&r2).to_string();
                let _ = self.store.update(rt("replicas"), &ns, &name, r2);
            }
            let replicas = volume_replicas(&self.store, &ns, &vname);
            let active = replicas
                .iter()
                .filter(|r| replica_failed_at(r).is_empty())
                .count() as u64;
            let healthy = replicas.iter().filter(|r| replica_healthy(r)).count() as u64;
            let key = (ns.clone(), vname.clone());
            if active < want && healthy > 0 && !never {
                let since = *self.degraded_since.entry(key.clone()).or_insert(now);
                if since.plus(delay) <= now {
                    let used: BTreeSet<&str> = replicas
                        .iter()
                        .filter(|r| replica_failed_at(r).is_empty())
                        .filter_map(|r| r.at("/spec/nodeID").and_then(Value::as_str))
                        .collect();
                    let has_workers = briefs.iter().any(|n| !n.control_plane);
                    let target = briefs
                        .iter()
                        .find(|n| {
                            ready.contains(&n.name)
                                && !used.contains(n.name.as_str())
                                && (!has_workers || !n.control_plane)
                        })
                        .map(|n| n.name.clone());
                    let failed = replicas
                        .iter()
                        .find(|r| !replica_failed_at(r).is_empty())
                        .map(|f| name_of(f).to_string());
                    if let Some(target) = target {
                        if let Some(f) = failed {
                            let _ = self.store.delete(rt("replicas"), &ns, &f);
                        }
                        let r = replica_object(
                            &ns,
                            &vname,
                            &format!("{}-r-{}", vname, self.store.suffix()),
                            &target,
                            now,
                        );
                        let _ = self.store.create(rt("replicas"), &ns, r, now);
                        self.degraded_since.remove(&key);
                    }
                }
            } else {
                self.degraded_since.remove(&key);
            }
            let healthy = volume_replicas(&self.store, &ns, &vname)
                .iter()
                .filter(|r| replica_healthy(r))
                .count() as u64;
            let Some(vol) = self.store.get("volumes", &ns, &vname) else {
                continue;
            };
            let attached = vol
                .at("/spec/nodeID")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            let state = if attached { "attached" } else { "detached" };
            // A detached volume's engine is stopped, so Longhorn cannot judge its replicas
            // and reports `unknown` (longhorn-manager v1.10 `controller/volume_controller.go`,
            // and its test "volume detaching after being created").
            let robustness = if !attached {
                "unknown"
            } else if healthy == 0 {
                "faulted"
            } else if healthy < want {
                "degraded"
            } else {
                "healthy"
            };
            if vol.at("/status/robustness").and_then(Value::as_str) != Some(robustness)
                || vol.at("/status/state").and_then(Value::as_str) != Some(state)
            {
                let mut v2 = vol.clone();
                set_path(&mut v2, &["status", "robustness"], json!(robustness));
                set_path(&mut v2, &["status", "state"], json!(state));
                let _ = self.store.update(rt("volumes"), &ns, &vname, v2);
            }
        }
    }

    /// The Longhorn volumes a pass looks at: those whose volume or replicas changed since
    /// the last pass began, those with a replica on a node that came or went for Longhorn,
    /// and those with a re-sync or a rebuild due; every volume when the history does not
    /// reach back or the `replicasNeverRebuild` fault moved. Any other volume's pass would
    /// change nothing.
    fn longhorn_volumes_to_look_at(
        &self,
        ready: &Arc<BTreeSet<String>>,
        now: Timestamp,
    ) -> Vec<(String, String)> {
        let all = || {
            self.store
                .iter("volumes")
                .map(|v| (namespace_of(v).to_string(), name_of(v).to_string()))
                .collect()
        };
        let Some(last) = &self.longhorn_seen else {
            return all();
        };
        if last.never != self.faults.replicas_never_rebuild {
            return all();
        }
        let Some(changes) = self.store.changes_since(last.at) else {
            return all();
        };
        let mut out: BTreeSet<(String, String)> = BTreeSet::new();
        let volume_of = |r: &Value| {
            r.at("/spec/volumeName")
                .and_then(Value::as_str)
                .map(|v| (namespace_of(r).to_string(), v.to_string()))
        };
        for e in changes {
            match e.plural {
                "replicas" => out.extend(volume_of(&e.object)),
                "volumes" => {
                    out.insert((e.namespace.clone(), name_of(&e.object).to_string()));
                }
                _ => {}
            }
        }
        // The same set as the last pass's: no node came or went.
        let moved: Vec<String> = if Arc::ptr_eq(ready, &last.ready) {
            Vec::new()
        } else {
            ready.symmetric_difference(&last.ready).cloned().collect()
        };
        for node in moved {
            out.extend(
                self.store
                    .by_field("replicas", "/spec/nodeID", &node)
                    .filter_map(volume_of),
            );
        }
        let delay = self.behaviour.replica_rebuild_delay;
        for ((ns, name), due) in &self.resync_due {
            if *due <= now {
                out.extend(self.store.get("replicas", ns, name).and_then(volume_of));
            }
        }
        for (key, since) in &self.degraded_since {
            if since.plus(delay) <= now {
                out.insert(key.clone());
            }
        }
        out.into_iter().collect()
    }

    /// Whether `pod` must wait to start on `node`: a ReadWriteOnce CSI volume of it is
    /// still attached to another node (the attach-detach controller's Multi-Attach error).
    fn attached_elsewhere(&self, pod: &Value, node: &str) -> bool {
        let vols = csi_volumes_of(&self.store, pod);
        vols.iter().filter(|v| v.3).any(|(pv, ..)| {
            self.store.iter("volumeattachments").any(|va| {
                va.at("/spec/source/persistentVolumeName")
                    .and_then(Value::as_str)
                    == Some(pv)
                    && va.at("/spec/nodeName").and_then(Value::as_str) != Some(node)
            })
        })
    }

    /// The attach-detach controller with the CSI external-attacher: a VolumeAttachment
    /// (`csi-<sha256(handle + driver + node)>`, `status.attached: true`) for every CSI
    /// volume a pod bound to a node uses, until the pod is gone; `volume_detach_delay` after
    /// the last such pod on that node is gone, the volume is detached and the
    /// VolumeAttachment deleted. A Longhorn volume's `spec.nodeID` follows. A
    /// VolumeAttachment whose PersistentVolume is not a CSI one the twin knows is left alone.
    fn attach_detach(&mut self, now: Timestamp) {
        use sha2::Digest;
        let due = self.detach_due.values().any(|t| *t <= now);
        if let Some(rv) = self.attach_quiet {
            // A pod with a claim matters when it came, went, moved to a node or finished
            // since the last pass read it, not when it only turned Ready.
            let as_read = |ns: &str, pod: &str| {
                self.store.get("pods", ns, pod).is_some_and(|p| {
                    self.attach_pods
                        .get(uid_of(p))
                        .is_some_and(|read| read.reads(p))
                })
            };
            let unchanged = self.store.changes_since(rv).is_some_and(|mut changes| {
                changes.all(|e| match e.plural {
                    "pods" => !has_claims(&e.object) || as_read(&e.namespace, name_of(&e.object)),
                    "persistentvolumeclaims" | "persistentvolumes" | "volumeattachments" => false,
                    _ => true,
                })
            });
            if !due && unchanged {
                return;
            }
        }
        #[cfg(test)]
        self.judged.push("attach pass".to_string());
        let before = self.store.resource_version();
        // What each pod with a claim wants holds while its view and every claim and
        // PersistentVolume stay as they were: only the pods that moved are worked out again,
        // and the rest is read in place.
        let claims_at = self
            .store
            .last_change("persistentvolumeclaims")
            .max(self.store.last_change("persistentvolumes"));
        if claims_at != self.attach_claims_at {
            self.attach_pods.clear();
            self.attach_claims_at = claims_at;
        }
        self.attach_passes += 1;
        let pass = self.attach_passes;
        for pod in self.store.pods_with_claims() {
            if let Some(read) = self.attach_pods.get_mut(uid_of(pod)) {
                if read.reads(pod) {
                    read.pass = pass;
                    continue;
                }
            }
            let (node, done) = attach_view(pod);
            let wants = if node.is_empty() || done {
                Vec::new()
            } else {
                csi_volumes_of(&self.store, pod)
                    .into_iter()
                    .map(|(pv, driver, handle, rwo)| {
                        let digest =
                            sha2::Sha256::digest(format!("{handle}{driver}{node}").as_bytes());
                        let name = format!("csi-{}", hex::encode(digest));
                        (name, (pv, driver, handle, node.clone(), rwo))
                    })
                    .collect()
            };
            let read = AttachPod {
                node,
                done,
                pass,
                wants,
            };
            self.attach_pods.insert(uid_of(pod).to_string(), read);
        }
        self.attach_pods.retain(|_, read| read.pass == pass);
        let wanted: BTreeMap<&str, &AttachWant> = self
            .attach_pods
            .values()
            .flat_map(|read| read.wants.iter().map(|(name, w)| (name.as_str(), w)))
            .collect();
        let mut longhorn_node: Vec<(String, String)> = Vec::new();
        for (&name, &want) in &wanted {
            let (pv, driver, handle, node, rwo) = want;
            self.detach_due.remove(name);
            if self.store.get("volumeattachments", "", name).is_some() {
                continue;
            }
            // A ReadWriteOnce volume attaches to one node at a time (Multi-Attach error).
            let elsewhere = self.store.iter("volumeattachments").any(|va| {
                va.at("/spec/source/persistentVolumeName")
                    .and_then(Value::as_str)
                    == Some(pv.as_str())
                    && va.at("/spec/nodeName").and_then(Value::as_str) != Some(node.as_str())
            });
            if *rwo && elsewhere {
                continue;
            }
            let va = json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": name,
                             "annotations": {"csi.alpha.kubernetes.io/node-id": node},
                             "finalizers": [format!("external-attacher/{}", driver.replace('/', "-"))]},
                "spec": {"attacher": driver, "nodeName": node, "source": {"persistentVolumeName": pv}},
                "status": {"attached": true},
            });
            let _ = self.store.create(rt("volumeattachments"), "", va, now);
            if driver == LONGHORN_DRIVER {
                longhorn_node.push((handle.clone(), node.clone()));
            }
        }
        // Copied only when no pod wants them any more.
        let unwanted: Vec<Value> = self
            .store
            .iter("volumeattachments")
            .filter(|va| !wanted.contains_key(name_of(va)))
            .cloned()
            .collect();
        for va in unwanted {
            let name = name_of(&va).to_string();
            let pv = va
                .at("/spec/source/persistentVolumeName")
                .and_then(Value::as_str)
                .and_then(|pv| self.store.get("persistentvolumes", "", pv));
            let Some(handle) = pv
                .filter(|pv| pv.at("/spec/csi/driver").is_some())
                .and_then(|pv| pv.at("/spec/csi/volumeHandle"))
                .and_then(Value::as_str)
                .map(str::to_string)
            else {
                continue;
            };
            let due = *self
                .detach_due
                .entry(name.clone())
                .or_insert(now.plus(self.behaviour.volume_detach_delay));
            if due > now {
                continue;
            }
            self.detach_due.remove(&name);
            let _ = self.store.delete(rt("volumeattachments"), "", &name);
            let source = va.at("/spec/source/persistentVolumeName");
            let still = self
                .store
                .iter("volumeattachments")
                .any(|o| o.at("/spec/source/persistentVolumeName") == source);
            if va.at("/spec/attacher").and_then(Value::as_str) == Some(LONGHORN_DRIVER) && !still {
                longhorn_node.push((handle, String::new()));
            }
        }
        let store = &self.store;
        self.detach_due
            .retain(|name, _| store.get("volumeattachments", "", name).is_some());
        for (volume, node) in longhorn_node {
            if let Some(v) = self
                .store
                .get("volumes", "longhorn-system", &volume)
                .cloned()
            {
                if v.at("/spec/nodeID").and_then(Value::as_str) != Some(node.as_str()) {
                    let mut v2 = v;
                    set_path(&mut v2, &["spec", "nodeID"], json!(node));
                    if let Some(m) = v2.get_mut("metadata").and_then(Value::as_object_mut) {
                        m.remove("resourceVersion");
                    }
                    let _ = self
                        .store
                        .update(rt("volumes"), "longhorn-system", &volume, v2);
                }
            }
        }
        let after = self.store.resource_version();
        self.attach_quiet = (after == before).then_some(after);
    }

    /// Status of PDBs, ReplicaSets, Deployments, StatefulSets and DaemonSets from the pods.
    /// Brings every counted DaemonSet's pods up to date with the pods that changed: each
    /// changed pod is counted as the store has it now (gone, or no longer the DaemonSet's,
    /// it is dropped). Without the history, they are counted afresh when next needed.
    fn count_daemon_set_pods(&mut self, dirty: &Dirty) {
        if dirty.all {
            self.daemon_set_pods.clear();
            return;
        }
        for (_, p) in &dirty.pods {
            let Some(("DaemonSet", ds)) = controller_of(p) else {
                continue;
            };
            let (ns, pod) = (namespace_of(p), name_of(p));
            let Some(counted) = self
                .daemon_set_pods
                .get_mut(&(ns.to_string(), ds.to_string()))
            else {
                continue;
            };
            match self
                .store
                .get("pods", ns, pod)
                .filter(|now| controller_of(now) == Some(("DaemonSet", ds)))
            {
                Some(now) => {
                    counted.pods.insert(pod.to_string(), counted.flags(now));
                }
                None => {
                    counted.pods.remove(pod);
                }
            }
        }
    }

    fn statuses(&mut self, now: Timestamp, dirty: &Dirty) {
        if dirty.is_empty() {
            return;
        }
        self.deployment_sets
            .refresh(&self.store, &mut self.deployments_moved);
        self.count_daemon_set_pods(dirty);
        let store = &self.store;
        let owned = |ns: &str, kind: &str, name: &str| store.pods_owned_by(ns, kind, name);
        let updated = |ps: &[&Value], owner: &Value| {
            let h = template_hash(owner);
            ps.iter()
                .filter(|p| pod_template_hash(p) == Some(h.as_str()))
                .count()
        };
        let mut updates: Vec<(&'static str, Value)> = Vec::new();
        for (kind, plural) in [
            ("ReplicaSet", "replicasets"),
            ("StatefulSet", "statefulsets"),
        ] {
            for (ns, name) in dirty.owners_to_look_at(store, plural, kind) {
                let Some(o) = store.get(plural, &ns, &name) else {
                    continue;
                };
                let ps = owned(&ns, kind, &name);
                let ready = ps.iter().filter(|p| is_ready(p)).count();
                let status = with_status(
                    o,
                    &[
                        ("replicas", json!(ps.len())),
                        ("readyReplicas", json!(ready)),
                        ("availableReplicas", json!(ready)),
                        ("currentReplicas", json!(ps.len())),
                        ("updatedReplicas", json!(updated(&ps, o))),
                        ("observedGeneration", generation_of(o)),
                    ],
                );
                updates.extend(status.map(|o2| (plural, o2)));
            }
        }
        for (ns, name) in self.deployment_sets.touched(store, dirty, true) {
            let Some(d) = store.get("deployments", &ns, &name) else {
                continue;
            };
            let mut rs_pods: Vec<&Value> = Vec::new();
            let mut up_to_date = 0;
            for rs in self
                .deployment_sets
                .of(&ns, &name)
                .iter()
                .filter_map(|rs| store.get("replicasets", &ns, rs))
            {
                let ps = owned(&ns, "ReplicaSet", name_of(rs));
                up_to_date += updated(&ps, rs);
                rs_pods.extend(ps);
            }
            let ready = rs_pods.iter().filter(|p| is_ready(p)).count();
            let want = replicas_of(d, self.behaviour.max_replicas) as usize;
            let status = with_status(
                d,
                &[
                    ("replicas", json!(rs_pods.len())),
                    ("readyReplicas", json!(ready)),
                    ("availableReplicas", json!(ready)),
                    ("updatedReplicas", json!(up_to_date)),
                    ("unavailableReplicas", json!(want.saturating_sub(ready))),
                    ("observedGeneration", generation_of(d)),
                ],
            );
            updates.extend(status.map(|d2| ("deployments", d2)));
        }
        let desired = self.store.iter("nodes").count();
        for (ns, name) in dirty.owners_to_look_at(&self.store, "daemonsets", "DaemonSet") {
            let Some(ds) = self.store.shared("daemonsets", &ns, &name).cloned() else {
                self.daemon_set_pods.remove(&(ns, name));
                continue;
            };
            // A new generation's status comes a moment after its spec.
            let generation = ds
                .at("/metadata/generation")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            let observed = ds.at("/status/observedGeneration").and_then(Value::as_u64);
            if observed.is_some_and(|o| o < generation) {
                let key = (ns.clone(), name.clone(), generation);
                let due = *self
                    .status_due
                    .entry(key.clone())
                    .or_insert(now.plus(self.behaviour.status_lag));
                if now < due {
                    continue;
                }
                self.status_due.remove(&key);
            }
            let template = template_hash(&ds);
            let key = (ns, name);
            let counted = match self.daemon_set_pods.get(&key) {
                Some(c) if c.template == template => c,
                _ => {
                    #[cfg(test)]
                    self.judged
                        .push(format!("daemonset count {}/{}", key.0, key.1));
                    let fresh = DaemonSetPods::count(&self.store, &key.0, &key.1, template);
                    self.daemon_set_pods
                        .entry(key)
                        .insert_entry(fresh)
                        .into_mut()
                }
            };
            let scheduled = counted.pods.len();
            let ready = counted.pods.values().filter(|(ready, _)| *ready).count();
            let updated = counted.pods.values().filter(|(_, new)| *new).count();
            let status = with_status(
                &ds,
                &[
                    ("desiredNumberScheduled", json!(desired)),
                    ("currentNumberScheduled", json!(scheduled)),
                    ("updatedNumberScheduled", json!(updated)),
                    ("numberReady", json!(ready)),
                    ("numberAvailable", json!(ready)),
                    ("numberUnavailable", json!(desired.saturating_sub(ready))),
                    ("numberMisscheduled", json!(0)),
                    ("observedGeneration", generation_of(&ds)),
                ],
            );
            updates.extend(status.map(|ds2| ("daemonsets", ds2)));
        }
        for gone in &dirty.pdbs {
            if self
                .store
                .get("poddisruptionbudgets", &gone.0, &gone.1)
                .is_none()
            {
                self.pdb_pods.remove(gone);
            }
        }
        for pdb in self.store.all("poddisruptionbudgets") {
            let ns = namespace_of(&pdb).to_string();
            let key = (ns.clone(), name_of(&pdb).to_string());
            let selector =
                LabelSelector::from_object(pdb.at("/spec/selector").unwrap_or(&Value::Null));
            let selects = |p: &Value| selector.as_ref().is_some_and(|s| s.matches_object(p));
            // Looked at again when it changed, or a pod it selects (or selected) changed:
            // the kube-system budget of CoreDNS does not count the 500 pods of every
            // DaemonSet there each time one of them turns Ready.
            let before = self.pdb_pods.get(&key);
            let touched = dirty.all
                || dirty.pdbs.contains(&key)
                || before.is_none()
                || dirty.pods.iter().any(|(_, p)| {
                    namespace_of(p) == ns
                        && (selects(p) || before.is_some_and(|b| b.contains(name_of(p))))
                });
            if !touched {
                continue;
            }
            #[cfg(test)]
            self.judged.push(format!("pdb status {}/{}", key.0, key.1));
            let matched: Vec<&Value> = self
                .store
                .iter_ns("pods", &ns)
                .filter(|p| selects(p))
                .collect();
            self.pdb_pods.insert(
                key,
                matched.iter().map(|p| name_of(p).to_string()).collect(),
            );
            // expectedPods: the scale of each controller behind the pods; bare pods count one.
            let mut controllers: BTreeMap<(&str, &str), u64> = BTreeMap::new();
            let mut bare = 0u64;
            for p in &matched {
                match controller_of(p) {
                    Some((k, n)) if k == "ReplicaSet" || k == "StatefulSet" => {
                        let plural = if k == "ReplicaSet" {
                            "replicasets"
                        } else {
                            "statefulsets"
                        };
                        let max = self.behaviour.max_replicas;
                        let scale = self
                            .store
                            .get(rt(plural).storage, &ns, n)
                            .map(|o| replicas_of(o, max))
                            .unwrap_or(1);
                        controllers.insert((k, n), scale);
                    }
                    _ => bare += 1,
                }
            }
            let expected = controllers.values().sum::<u64>() + bare;
            let healthy = matched.iter().filter(|p| is_ready(p)).count() as u64;
            let desired = if let Some(min) = pdb.at("/spec/minAvailable") {
                scaled(min, expected).unwrap_or(0)
            } else if let Some(max) = pdb.at("/spec/maxUnavailable") {
                expected.saturating_sub(scaled(max, expected).unwrap_or(0))
            } else {
                0
            };
            let mut allowed = healthy.saturating_sub(desired);
            if self
                .faults
                .pdb_never_allows
                .contains(&(ns.clone(), name_of(&pdb).to_string()))
            {
                allowed = 0;
            }
            let reason = if allowed > 0 {
                "SufficientPods"
            } else {
                "InsufficientPods"
            };
            let since = pdb
                .at("/status/conditions/0/lastTransitionTime")
                .cloned()
                .unwrap_or(json!(self.now.rfc3339()));
            let old_status = pdb
                .at("/status/conditions/0/status")
                .and_then(Value::as_str);
            let status = if allowed > 0 { "True" } else { "False" };
            let since = if old_status == Some(status) {
                since
            } else {
                json!(self.now.rfc3339())
            };
            let generation = generation_of(&pdb);
            let conditions = json!([{"type": "DisruptionAllowed", "status": status,
                "reason": reason, "message": "", "lastTransitionTime": since,
                "observedGeneration": generation.clone()}]);
            let status = with_status(
                &pdb,
                &[
                    ("currentHealthy", json!(healthy)),
                    ("desiredHealthy", json!(desired)),
                    ("expectedPods", json!(expected)),
                    ("disruptionsAllowed", json!(allowed)),
                    ("observedGeneration", generation),
                    ("conditions", conditions),
                ],
            );
            updates.extend(status.map(|p2| ("poddisruptionbudgets", p2)));
        }
        for (plural, obj) in updates {
            let old = self
                .store
                .get(rt(plural).storage, namespace_of(&obj), name_of(&obj));
            if old.map(|o| o.get("status")) != Some(obj.get("status")) {
                let mut obj = obj;
                if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                let ns = namespace_of(&obj).to_string();
                let name = name_of(&obj).to_string();
                let _ = self.store.update(rt(plural), &ns, &name, obj);
            }
        }
    }
}

/// `o` with these `status` fields set, or `None` when it has every one of them already: a
/// status that did not change costs no copy of its object (a DaemonSet's is kilobytes).
fn with_status(o: &Value, fields: &[(&str, Value)]) -> Option<Value> {
    let status = o.get("status");
    if fields
        .iter()
        .all(|(k, v)| status.and_then(|s| s.get(*k)) == Some(v))
    {
        return None;
    }
    let mut o2 = o.clone();
    for (k, v) in fields {
        set_path(&mut o2, &["status", k], v.clone());
    }
    Some(o2)
}

/// `metadata.generation`, which a status's `observedGeneration` echoes (1 when unset).
fn generation_of(o: &Value) -> Value {
    o.at("/metadata/generation").cloned().unwrap_or(json!(1))
}

/// What changed since a resourceVersion: the controllers, statuses and pods to look at
/// again.
#[derive(Debug, Default)]
struct Dirty {
    /// Everything: nothing is known from before, or the history no longer reaches back.
    all: bool,
    /// A Node came or went: every DaemonSet looks again.
    nodes: bool,
    /// (kind, namespace, name) of controllers whose object or pods changed.
    owners: BTreeSet<(String, String, String)>,
    /// (kind, namespace, name) of controllers whose object itself changed.
    objects: BTreeSet<(String, String, String)>,
    /// Every change to a pod, oldest first, with the object as that change left it.
    pods: Vec<(EventType, Arc<Value>)>,
    /// (namespace, name) of the PodDisruptionBudgets that changed.
    pdbs: BTreeSet<(String, String)>,
}

impl Dirty {
    fn is_empty(&self) -> bool {
        !self.all
            && !self.nodes
            && self.owners.is_empty()
            && self.pods.is_empty()
            && self.pdbs.is_empty()
    }

    /// (namespace, name) of the `kind` controllers (stored as `plural`) to look at again,
    /// in store order: every one when everything changed (and every DaemonSet when a Node
    /// came or went), else those that changed. A pass costs what changed, not how many
    /// controllers there are.
    fn owners_to_look_at(
        &self,
        store: &Store,
        plural: &'static str,
        kind: &str,
    ) -> Vec<(String, String)> {
        self.of_kind(store, plural, kind, &self.owners)
    }

    /// As [`Dirty::owners_to_look_at`], for the controllers whose object itself changed
    /// (their pods' changes left out).
    fn objects_to_look_at(
        &self,
        store: &Store,
        plural: &'static str,
        kind: &str,
    ) -> Vec<(String, String)> {
        self.of_kind(store, plural, kind, &self.objects)
    }

    fn of_kind(
        &self,
        store: &Store,
        plural: &'static str,
        kind: &str,
        set: &BTreeSet<(String, String, String)>,
    ) -> Vec<(String, String)> {
        if self.all || (self.nodes && kind == "DaemonSet") {
            return store
                .iter(plural)
                .map(|o| (namespace_of(o).to_string(), name_of(o).to_string()))
                .collect();
        }
        set.range((kind.to_string(), String::new(), String::new())..)
            .take_while(|(k, _, _)| k == kind)
            .map(|(_, ns, name)| (ns.clone(), name.clone()))
            .collect()
    }

    /// The changes to the pods `kind/name` in `ns` controls.
    fn pods_of<'a>(
        &'a self,
        ns: &'a str,
        kind: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = &'a (EventType, Arc<Value>)> + 'a {
        self.pods
            .iter()
            .filter(move |(_, p)| namespace_of(p) == ns && controller_of(p) == Some((kind, name)))
    }
}

/// What the controllers need to know about a pod.
#[derive(Debug, Clone)]
struct PodBrief {
    namespace: String,
    name: String,
    template: Option<String>,
    terminating: bool,
}

/// The CSI volumes a pod mounts through its claims: (PersistentVolume, driver, volume
/// handle, ReadWriteOnce).
fn csi_volumes_of(store: &Store, pod: &Value) -> Vec<(String, String, String, bool)> {
    let ns = namespace_of(pod);
    let mut out = Vec::new();
    for v in pod
        .at("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(claim) = v
            .at("/persistentVolumeClaim/claimName")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let Some(pv_name) = store
            .get("persistentvolumeclaims", ns, claim)
            .and_then(|c| c.at("/spec/volumeName"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let Some(pv) = store.get("persistentvolumes", "", pv_name) else {
            continue;
        };
        let text = |p: &str| pv.at(p).and_then(Value::as_str).unwrap_or("").to_string();
        let (driver, handle) = (text("/spec/csi/driver"), text("/spec/csi/volumeHandle"));
        if driver.is_empty() || handle.is_empty() {
            continue;
        }
        let rwo = pv
            .at("/spec/accessModes")
            .and_then(Value::as_array)
            .is_some_and(|m| {
                m.iter()
                    .any(|m| m == "ReadWriteOnce" || m == "ReadWriteOncePod")
            });
        out.push((pv_name.to_string(), driver, handle, rwo));
    }
    out
}

/// A VolumeAttachment a pod wants: (PersistentVolume, driver, handle, node, ReadWriteOnce).
type AttachWant = (String, String, String, String, bool);
/// A pod with a claim as the attach/detach pass read it: its [`attach_view`], the last pass
/// that found it, and the attachments (by name) it wants.
struct AttachPod {
    node: String,
    done: bool,
    pass: u64,
    wants: Vec<(String, AttachWant)>,
}

impl AttachPod {
    /// Whether `pod` is still as read: what it wants has not changed.
    fn reads(&self, pod: &Value) -> bool {
        self.node == node_of(pod) && self.done == pod_done(pod)
    }
}

fn uid_of(obj: &Value) -> &str {
    obj.at("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn pod_done(pod: &Value) -> bool {
    matches!(
        pod.at("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

/// What the attach/detach pass reads of a pod with a claim: its node, and whether it is
/// done (Succeeded or Failed: its volumes may detach).
fn attach_view(pod: &Value) -> (String, bool) {
    (node_of(pod).to_string(), pod_done(pod))
}

/// Whether the pod tolerates `node.kubernetes.io/unschedulable:NoSchedule`, the taint a
/// cordon stands for: a toleration of that key (or of every key, `operator: Exists` without
/// one) whose effect is empty or NoSchedule (k8s.io/api core/v1 toleration.go
/// `ToleratesTaint`, at v0.33.5).
fn tolerates_unschedulable(pod: &Value) -> bool {
    pod.at("/spec/tolerations")
        .and_then(Value::as_array)
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                let s = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("");
                let effect_ok = matches!(s("effect"), "" | "NoSchedule");
                let exists = s("operator") == "Exists";
                let key_ok = match s("key") {
                    "" => exists,
                    "node.kubernetes.io/unschedulable" => exists || s("value").is_empty(),
                    _ => false,
                };
                effect_ok && key_ok
            })
        })
}

/// Whether every label of the pod's `spec.nodeSelector` is on the node (the scheduler's
/// NodeAffinity plugin: pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go at
/// v1.33.5, nodeSelector part).
fn selects_node(pod: &Value, labels: &Value) -> bool {
    pod.at("/spec/nodeSelector")
        .and_then(Value::as_object)
        .is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// What the scheduler and Longhorn need to know about a node.
#[derive(Debug, Clone, PartialEq)]
struct NodeBrief {
    name: String,
    ready: bool,
    control_plane: bool,
    schedulable: bool,
    /// Schedulable but for its cordon.
    cordoned_only: bool,
    labels: Value,
    ip: String,
    ready_since: Timestamp,
}

/// A DaemonSet's pods as its status counts them: pod name → (Ready, made from `template`).
#[derive(Debug)]
struct DaemonSetPods {
    template: String,
    pods: HashMap<String, (bool, bool)>,
}

impl DaemonSetPods {
    fn count(store: &Store, ns: &str, ds: &str, template: String) -> Self {
        let mut counted = DaemonSetPods {
            template,
            pods: HashMap::new(),
        };
        for p in store.pods_owned_by(ns, "DaemonSet", ds) {
            let flags = counted.flags(p);
            counted.pods.insert(name_of(p).to_string(), flags);
        }
        counted
    }

    fn flags(&self, pod: &Value) -> (bool, bool) {
        (
            is_ready(pod),
            pod_template_hash(pod) == Some(self.template.as_str()),
        )
    }
}

/// What a settled DaemonSet was judged by: the object (uid), its spec (generation) and
/// the pod template's hash.
#[derive(Debug, Clone, PartialEq)]
struct DaemonSetSpec {
    uid: String,
    generation: u64,
    template: String,
}

impl DaemonSetSpec {
    fn of(ds: &Value) -> Self {
        DaemonSetSpec {
            uid: ds
                .at("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            generation: ds
                .at("/metadata/generation")
                .and_then(Value::as_u64)
                .unwrap_or(1),
            template: template_hash(ds),
        }
    }
}

/// A DaemonSet's RollingUpdate (no surge), as the DaemonSet controller does it
/// (kubernetes/kubernetes `pkg/controller/daemon/update.go` `rollingUpdate` v1.33.0, a
/// pod's availability as `podutil.IsPodAvailable`: Ready, not terminating): the pods to
/// replace now. An old pod that is not available is replaced at once; available old pods
/// are replaced only while fewer than `maxUnavailable` (default 1, a percentage of the
/// nodes rounded up) of its pods are unavailable, counting new pods still starting.
/// `OnDelete` never replaces a pod. The twin's DaemonSet pods exit at once when deleted.
fn daemon_set_replacements(ds: &Value, have: &[&Value], desired: u64) -> Vec<String> {
    if ds.at("/spec/updateStrategy/type").and_then(Value::as_str) == Some("OnDelete") {
        return Vec::new();
    }
    let current = template_hash(ds);
    let max_unavailable = ds
        .at("/spec/updateStrategy/rollingUpdate/maxUnavailable")
        .and_then(|v| scaled(v, desired))
        .unwrap_or(1)
        .max(1);
    // A pod still Pending (the pods `start_pending` waits on) is not available.
    let available = |p: &Value| {
        p.at("/metadata/deletionTimestamp").is_none()
            && p.at("/status/phase").and_then(Value::as_str) != Some("Pending")
            && is_ready(p)
    };
    let mut by_node: Vec<&Value> = have.to_vec();
    by_node.sort_by(|a, b| node_of(a).cmp(node_of(b)));
    let mut unavailable = 0u64;
    let mut replace_now: Vec<String> = Vec::new();
    let mut candidates: Vec<String> = Vec::new();
    for pods in by_node.chunk_by(|a, b| node_of(a) == node_of(b)) {
        let [p] = pods else {
            // More than one pod on a node: the manage loop sorts it out.
            unavailable += 1;
            continue;
        };
        let new = pod_template_hash(p) == Some(current.as_str());
        match (new, available(p)) {
            (true, true) => {}
            (true, false) => unavailable += 1,
            (false, false) => replace_now.push(name_of(p).to_string()),
            (false, true) if unavailable >= max_unavailable => {}
            (false, true) => candidates.push(name_of(p).to_string()),
        }
    }
    let room = max_unavailable.saturating_sub(unavailable) as usize;
    replace_now.extend(candidates.into_iter().take(room));
    replace_now
}

/// The brief of the node `name` among `briefs` (sorted by name, as the Node view keeps them).
fn brief_of<'a>(briefs: &'a [NodeBrief], name: &str) -> Option<&'a NodeBrief> {
    briefs
        .binary_search_by(|b| b.name.as_str().cmp(name))
        .ok()
        .and_then(|i| briefs.get(i))
}

fn node_brief(n: &Value) -> NodeBrief {
    NodeBrief {
        name: name_of(n).to_string(),
        ready: is_ready(n),
        control_plane: is_control_plane(n),
        schedulable: Cluster::schedulable(n),
        cordoned_only: Cluster::cordoned_only(n),
        labels: n.at("/metadata/labels").cloned().unwrap_or(Value::Null),
        ip: internal_ip(n).unwrap_or_default(),
        ready_since: ready_since(n),
    }
}

/// Every Node's brief, sorted by name: `at` the store's resourceVersion it is current
/// for, `changed` the last one at which a brief differed.
#[derive(Debug)]
struct NodeView {
    at: u64,
    changed: u64,
    briefs: Arc<Vec<NodeBrief>>,
}

fn rt_pods() -> &'static ResourceType {
    rt("pods")
}

/// When the node's Ready condition last changed.
fn ready_since(node: &Value) -> Timestamp {
    node.at("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
        })
        .and_then(|c| c.get("lastTransitionTime"))
        .and_then(Value::as_str)
        .and_then(parse_time)
        .unwrap_or_default()
}

pub fn is_control_plane(node: &Value) -> bool {
    node.at("/metadata/labels")
        .and_then(|l| l.get(CONTROL_PLANE_LABEL))
        .is_some()
}

pub fn internal_ip(node: &Value) -> Option<String> {
    node.at("/status/addresses")?
        .as_array()?
        .iter()
        .find(|a| a.get("type").and_then(Value::as_str) == Some("InternalIP"))?
        .get("address")?
        .as_str()
        .map(String::from)
}

fn container_statuses(pod: &Value, now: Timestamp) -> Value {
    let containers = pod
        .at("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Value::Array(
        containers
            .iter()
            .map(|c| {
                json!({"name": c.get("name").cloned().unwrap_or(json!("main")),
                       "image": c.get("image").cloned().unwrap_or(Value::Null),
                       "imageID": super::seed::image_id(c.get("image").and_then(Value::as_str).unwrap_or("")),
                       "ready": true, "started": true, "restartCount": 0,
                       "state": {"running": {"startedAt": now.rfc3339()}}})
            })
            .collect(),
    )
}

/// What Longhorn's last pass read: the store's resourceVersion when it began, the Node
/// view's last change, the nodes it counted as up, those whose kubelet was silent, and the
/// volumes the `replicasNeverRebuild` fault held.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LonghornSeen {
    at: u64,
    nodes_changed: u64,
    /// Shared with the next pass while no node comes or goes for Longhorn.
    ready: Arc<BTreeSet<String>>,
    silent: BTreeSet<String>,
    never: BTreeSet<String>,
}

/// A healthy running Longhorn replica of `volume` on `node`, healthy since `now`.
pub fn replica_object(
    namespace: &str,
    volume: &str,
    name: &str,
    node: &str,
    now: Timestamp,
) -> Value {
    json!({
        "apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
        "metadata": {"name": name, "namespace": namespace, "labels": {"longhornvolume": volume, "longhornnode": node}},
        "spec": {"nodeID": node, "volumeName": volume, "failedAt": "", "healthyAt": now.rfc3339(),
                 "desireState": "running"},
        "status": {"currentState": "running"},
    })
}

/// A replica's `spec.failedAt` ("" while it has not failed).
/// The replicas of one Longhorn volume, as stored.
fn volume_replicas<'s>(store: &'s Store, ns: &str, volume: &str) -> Vec<&'s Value> {
    store
        .by_field("replicas", "/spec/volumeName", volume)
        .filter(|r| {
            namespace_of(r) == ns
                && r.at("/spec/volumeName").and_then(Value::as_str) == Some(volume)
        })
        .collect()
}

fn replica_failed_at(r: &Value) -> &str {
    r.at("/spec/failedAt").and_then(Value::as_str).unwrap_or("")
}

/// What Longhorn counts for robustness: running, not failed, rebuilt (`healthyAt` set).
fn replica_healthy(r: &Value) -> bool {
    r.at("/status/currentState").and_then(Value::as_str) == Some("running")
        && replica_failed_at(r).is_empty()
        && r.at("/spec/healthyAt")
            .and_then(Value::as_str)
            .is_some_and(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_or_percent_rounds_up_like_the_disruption_controller() {
        assert_eq!(scaled(&json!(2), 5), Some(2));
        assert_eq!(scaled(&json!("50%"), 5), Some(3));
        assert_eq!(scaled(&json!("10%"), 3), Some(1));
        assert_eq!(scaled(&json!("x"), 3), None);
    }

    #[test]
    fn times_round_trip() {
        let t = Timestamp(1_767_225_600_000 + 86_400_000 * 40 + 3_723_000);
        assert_eq!(parse_time(&t.rfc3339()), Some(t));
        assert_eq!(
            parse_time("2026-01-01T00:00:00.123456Z"),
            Some(Timestamp(1_767_225_600_000))
        );
        assert_eq!(
            micro_time(Timestamp(1_767_225_600_123)),
            "2026-01-01T00:00:00.123000Z"
        );
        assert_eq!(parse_time("garbage"), None);
    }

    #[test]
    fn template_hash_follows_the_template_only() {
        let a = json!({"metadata": {"name": "a"}, "spec": {"template": {"spec": {"containers": [{"image": "x:1"}]}}}});
        let b = json!({"metadata": {"name": "b"}, "spec": {"replicas": 3, "template": {"spec": {"containers": [{"image": "x:1"}]}}}});
        let c = json!({"spec": {"template": {"spec": {"containers": [{"image": "x:2"}]}}}});
        assert_eq!(template_hash(&a), template_hash(&b));
        assert_ne!(template_hash(&a), template_hash(&c));
        // The FNV-1a of the template's compact text, so names made from it stay as they were.
        let text = a["spec"]["template"].to_string();
        let fnv = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
        assert_eq!(template_hash(&a), format!("{:08x}", fnv as u32));
        assert_eq!(
            template_hash(&json!({})),
            format!("{:08x}", 0xcbf2_9ce4_8422_2325u64 as u32)
        );
    }

    fn robustness(c: &Cluster, volume: &str) -> String {
        c.get("volumes", "longhorn-system", volume)
            .and_then(|v| {
                v.at("/status/robustness")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .unwrap_or_default()
    }

    fn replica_on(c: &Cluster, volume: &str, node: &str) -> Option<Value> {
        c.list("replicas", Some("longhorn-system"))
            .into_iter()
            .find(|r| {
                r.at("/spec/volumeName").and_then(Value::as_str) == Some(volume)
                    && r.at("/spec/nodeID").and_then(Value::as_str) == Some(node)
            })
    }

    #[test]
    fn the_node_view_is_patched_from_the_nodes_that_changed() -> Result<(), ApiError> {
        let t0 = Timestamp(1_767_225_600_000);
        let s = Duration::from_secs;
        let mut c = super::super::seed::KubeSeed::nodes(1, 3).build(Behaviour::default(), t0)?;
        let before = c.node_briefs();
        let first = c.node_view().changed;
        // The five-minute heartbeats write every Node; no brief differs.
        let written = c.store.last_change("nodes");
        c.sync(t0.plus(s(301)));
        assert!(
            c.store.last_change("nodes") > written,
            "no heartbeat was written"
        );
        assert_eq!(c.node_view().changed, first);
        // A cordon changes that node's brief alone, as a full rebuild would see it.
        c.set_unschedulable("worker-2", true, t0.plus(s(302)))?;
        let after = c.node_briefs();
        assert!(c.node_view().changed > first);
        assert_eq!(*after, c.build_node_briefs());
        for (was, is) in before.iter().zip(after.iter()) {
            if is.name == "worker-2" {
                assert!(!is.schedulable && is.cordoned_only, "{is:?}");
            } else {
                assert_eq!(was, is);
            }
        }
        Ok(())
    }

    fn daemon_set(c: &Cluster, ns: &str, ds: &str) -> Value {
        let found = c.store.get("daemonsets", ns, ds);
        found.cloned().unwrap_or_default()
    }

    /// A DaemonSet's status as counted from every pod now: (scheduled, ready, updated).
    fn daemon_set_counted_afresh(c: &Cluster, ns: &str, ds: &str) -> (u64, u64, u64) {
        let obj = daemon_set(c, ns, ds);
        let template = template_hash(&obj);
        let pods = c.store.pods_owned_by(ns, "DaemonSet", ds);
        let ready = pods.iter().filter(|p| is_ready(p)).count() as u64;
        let updated = pods
            .iter()
            .filter(|p| pod_template_hash(p) == Some(template.as_str()))
            .count() as u64;
        (pods.len() as u64, ready, updated)
    }

    fn daemon_set_status(c: &Cluster, ns: &str, ds: &str) -> (u64, u64, u64) {
        let obj = daemon_set(c, ns, ds);
        let n = |f: &str| {
            obj.at(&format!("/status/{f}"))
                .and_then(Value::as_u64)
                .unwrap_or(0)
        };
        (
            n("currentNumberScheduled"),
            n("numberReady"),
            n("updatedNumberScheduled"),
        )
    }

    fn current_healthy(c: &Cluster, ns: &str, pdb: &str) -> u64 {
        c.store
            .get("poddisruptionbudgets", ns, pdb)
            .and_then(|p| p.at("/status/currentHealthy"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }

    /// The pod of `owner` (a controller's name) on `node`, as stored.
    fn pod_of(c: &Cluster, owner: &str, node: &str) -> Value {
        c.pods_on_node(node)
            .into_iter()
            .find(|p| controller_of(p).is_some_and(|(_, n)| n == owner))
            .unwrap_or_default()
    }

    /// A pod of `ns` labelled `app=<app>`, as stored.
    fn pod_labelled(c: &Cluster, ns: &str, app: &str) -> Value {
        c.store
            .iter_ns("pods", ns)
            .find(|p| p.at("/metadata/labels/app").and_then(Value::as_str) == Some(app))
            .cloned()
            .unwrap_or_default()
    }

    /// A client's write of `obj` as changed by `edit`.
    fn write(c: &mut Cluster, mut obj: Value, at: Timestamp, edit: impl FnOnce(&mut Value)) {
        edit(&mut obj);
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let written = c.upsert(obj, at);
        assert!(written.is_ok(), "{written:?}");
    }

    #[test]
    fn a_pod_changing_state_costs_its_own_controllers_and_budgets() -> Result<(), ApiError> {
        let t0 = Timestamp(1_767_225_600_000);
        let s = Duration::from_secs;
        let mut c = super::super::seed::KubeSeed::typical(1, 5).build(Behaviour::default(), t0)?;
        c.sync(t0.plus(s(1)));
        let judged = |c: &Cluster, from: usize| -> Vec<String> { c.judged[from..].to_vec() };
        assert_eq!(daemon_set_status(&c, "kube-system", "cilium"), (6, 6, 6));

        // A cilium pod turns NotReady: cilium's status is counted from that one pod (the
        // count kept is the count afresh), its DaemonSet pass is skipped (settled, and the
        // pod only changed state), and no budget looks: none selects cilium's pods.
        let mark = c.judged.len();
        let pod = pod_of(&c, "cilium", "worker-2");
        write(&mut c, pod, t0.plus(s(10)), |p| {
            set_condition(p, "Ready", false, "ContainersNotReady", t0.plus(s(10)))
        });
        assert_eq!(daemon_set_status(&c, "kube-system", "cilium"), (6, 5, 6));
        assert_eq!(
            daemon_set_status(&c, "kube-system", "cilium"),
            daemon_set_counted_afresh(&c, "kube-system", "cilium")
        );
        assert_eq!(
            judged(&c, mark),
            Vec::<String>::new(),
            "{:?}",
            judged(&c, mark)
        );

        // A CoreDNS pod turns NotReady: its budget looks, and only it (the Deployment's
        // pass reads its ReplicaSets, not their pods).
        let mark = c.judged.len();
        let healthy = current_healthy(&c, "kube-system", "coredns");
        let coredns = pod_labelled(&c, "kube-system", "coredns");
        write(&mut c, coredns, t0.plus(s(20)), |p| {
            set_condition(p, "Ready", false, "ContainersNotReady", t0.plus(s(20)))
        });
        assert_eq!(current_healthy(&c, "kube-system", "coredns"), healthy - 1);
        assert_eq!(judged(&c, mark), ["pdb status kube-system/coredns"]);

        // A web pod relabelled out of its budget's selector: the budget selected it, so it
        // looks again and counts one healthy pod fewer.
        let mark = c.judged.len();
        let healthy = current_healthy(&c, "default", "web");
        let web = pod_labelled(&c, "default", "web");
        write(&mut c, web, t0.plus(s(30)), |p| {
            set_path(p, &["metadata", "labels", "app"], json!("other"))
        });
        assert_eq!(current_healthy(&c, "default", "web"), healthy - 1);
        assert!(
            judged(&c, mark).contains(&"pdb status default/web".to_string()),
            "{:?}",
            judged(&c, mark)
        );

        // A cilium pod deleted: once it is gone the DaemonSet pass looks and makes a new
        // one; the status counts it as the store has it.
        let mark = c.judged.len();
        let gone = name_of(&pod_of(&c, "cilium", "worker-3")).to_string();
        c.delete_pod("kube-system", &gone, None, t0.plus(s(40)))?;
        c.sync(t0.plus(s(100)));
        assert!(judged(&c, mark).contains(&"daemonset pass kube-system/cilium".to_string()));
        assert_ne!(name_of(&pod_of(&c, "cilium", "worker-3")), gone);
        assert_eq!(
            daemon_set_status(&c, "kube-system", "cilium"),
            daemon_set_counted_afresh(&c, "kube-system", "cilium")
        );
        Ok(())
    }

    #[test]
    fn a_node_going_down_costs_what_it_touches_not_the_whole_cluster() -> Result<(), ApiError> {
        let t0 = Timestamp(1_767_225_600_000);
        let s = Duration::from_secs;
        let mut c = super::super::seed::KubeSeed::typical(1, 5).build(Behaviour::default(), t0)?;
        c.sync(t0.plus(s(1)));
        assert_eq!(daemon_set_status(&c, "kube-system", "cilium"), (6, 6, 6));

        // Its kubelet goes silent: no object changed, so no owner's status, DaemonSet count
        // or budget is looked at again.
        let mark = c.judged.len();
        c.node_down("worker-2", t0.plus(s(10)))?;
        assert_eq!(c.judged[mark..].to_vec(), Vec::<String>::new());

        // The grace period is still kept: the Node turns NotReady when it ends, its pods
        // follow, and the status counted from the pods that changed is the count afresh.
        let grace = c.behaviour.node_monitor_grace;
        assert!(c
            .next_due()
            .is_some_and(|d| d <= t0.plus(s(10)).plus(grace)));
        c.sync(t0.plus(s(11)).plus(grace));
        let node = c.get("nodes", "", "worker-2").unwrap_or_default();
        assert!(!is_ready(&node), "{node}");
        assert_eq!(daemon_set_status(&c, "kube-system", "cilium"), (6, 5, 6));
        assert_eq!(
            daemon_set_status(&c, "kube-system", "cilium"),
            daemon_set_counted_afresh(&c, "kube-system", "cilium")
        );

        // A node that holds nothing changes no object at all when it goes: its grace period
        // is kept all the same.
        let mut c = super::super::seed::KubeSeed::nodes(1, 2).build(Behaviour::default(), t0)?;
        c.sync(t0.plus(s(1)));
        c.node_down("worker-1", t0.plus(s(10)))?;
        c.sync(t0.plus(s(11)).plus(grace));
        let node = c.get("nodes", "", "worker-1").unwrap_or_default();
        assert!(!is_ready(&node), "{node}");
        Ok(())
    }

    #[test]
    fn a_pod_with_a_claim_wakes_attach_detach_when_it_moves_not_when_it_turns_ready(
    ) -> Result<(), ApiError> {
        let t0 = Timestamp(1_767_225_600_000);
        let s = Duration::from_secs;
        let mut c = super::super::seed::KubeSeed::nodes(1, 3)
            .longhorn_volume_used_by("pvc-db", 3, "default", "db")
            .build(Behaviour::default(), t0)?;
        c.sync(t0.plus(s(60)));
        let attached = |c: &Cluster| -> Vec<String> {
            c.store
                .iter("volumeattachments")
                .map(|va| node_of(va).to_string())
                .collect()
        };
        let db = c
            .store
            .iter_ns("pods", "default")
            .find(|p| controller_of(p).is_some())
            .cloned()
            .unwrap_or_default();
        let first = node_of(&db).to_string();
        assert_eq!(attached(&c), std::slice::from_ref(&first));
        // It turns NotReady and Ready again: nothing attach/detach reads changed.
        let mark = c.judged.len();
        for (at, ready) in [(70, false), (80, true)] {
            let now = c
                .store
                .get("pods", "default", name_of(&db))
                .cloned()
                .unwrap_or_default();
            write(&mut c, now, t0.plus(s(at)), |p| {
                set_condition(p, "Ready", ready, "ContainersReady", t0.plus(s(at)))
            });
        }
        assert!(
            !c.judged[mark..].contains(&"attach pass".to_string()),
            "{:?}",
            &c.judged[mark..]
        );
        // Its node is cordoned and the pod deleted: its replacement lands elsewhere, and the
        // volume follows it once detached.
        c.set_unschedulable(&first, true, t0.plus(s(90)))?;
        let mark = c.judged.len();
        c.delete_pod(
            "default",
            name_of(&db),
            Some(Duration::ZERO),
            t0.plus(s(91)),
        )?;
        c.sync(t0.plus(s(600)));
        assert!(c.judged[mark..].contains(&"attach pass".to_string()));
        let moved = attached(&c);
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_ne!(moved[0], first);
        Ok(())
    }

    #[test]
    fn a_pod_made_again_under_its_name_is_attached_for_the_claims_it_mounts_now(
    ) -> Result<(), ApiError> {
        let t0 = Timestamp(1_767_225_600_000);
        let s = Duration::from_secs;
        let mut c = super::super::seed::KubeSeed::nodes(1, 3)
            .longhorn_volume_attached("vol-a", 3, "worker-1")
            .longhorn_volume_attached("vol-b", 3, "worker-2")
            .build(Behaviour::default(), t0)?;
        c.sync(t0.plus(s(60)));
        // (node, PersistentVolume) of every VolumeAttachment.
        let attached = |c: &Cluster| -> Vec<(String, String)> {
            let mut v: Vec<(String, String)> = c
                .store
                .iter("volumeattachments")
                .map(|va| {
                    let pv = va.at("/spec/source/persistentVolumeName");
                    let pv = pv.and_then(Value::as_str).unwrap_or("");
                    (node_of(va).to_string(), pv.to_string())
                })
                .collect();
            v.sort();
            v
        };
        let before = attached(&c);
        assert_eq!(before.len(), 2, "{before:?}");
        let pv_of = |node: &str| {
            before
                .iter()
                .find(|(n, _)| n == node)
                .map(|(_, pv)| pv.clone())
                .unwrap_or_default()
        };
        let (pv_a, pv_b) = (pv_of("worker-1"), pv_of("worker-2"));
        // Both pods go and, before any pass sees it, a pod named as vol-a's comes back on
        // worker-1 mounting vol-b's claim: same name, same node, another claim.
        let b_pod = c.store.get("pods", "default", "vol-b-user").cloned();
        let b_pod = b_pod.unwrap_or_default();
        let mut again = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "vol-a-user", "namespace": "default"},
            "spec": b_pod.get("spec").cloned().unwrap_or_default(),
        });
        set_path(&mut again, &["spec", "nodeName"], json!("worker-1"));
        c.batch(t0.plus(s(61)), |c| {
            for pod in ["vol-a-user", "vol-b-user"] {
                c.delete_pod("default", pod, Some(Duration::ZERO), t0.plus(s(61)))?;
            }
            c.upsert(again, t0.plus(s(61)))
        })?;
        c.sync(t0.plus(s(600)));
        assert_eq!(attached(&c), [("worker-1".to_string(), pv_b.clone())]);
        assert_ne!(pv_a, pv_b);
        Ok(())
    }

    #[test]
    fn a_replica_set_changing_hands_wakes_the_deployment_it_left() -> Result<(), ApiError> {
        let t0 = Timestamp(1_767_225_600_000);
        let s = Duration::from_secs;
        let mut c = super::super::seed::KubeSeed::typical(1, 3).build(Behaviour::default(), t0)?;
        c.sync(t0.plus(s(1)));
        let sets_of = |c: &Cluster, d: &str| -> Vec<String> {
            c.store
                .iter_ns("replicasets", "default")
                .filter(|rs| controller_of(rs) == Some(("Deployment", d)))
                .map(|rs| name_of(rs).to_string())
                .collect()
        };
        let [web_set] = sets_of(&c, "web").try_into().unwrap_or_default();
        // A second Deployment, then web's ReplicaSet handed to it.
        let mut other = c
            .store
            .get("deployments", "default", "web")
            .cloned()
            .unwrap_or_default();
        if let Some(m) = other.get_mut("metadata").and_then(Value::as_object_mut) {
            m.retain(|k, _| k == "name" || k == "namespace" || k == "labels");
        }
        set_path(&mut other, &["metadata", "name"], json!("other"));
        let other = c.upsert(other, t0.plus(s(10)))?;
        let rs = c
            .store
            .get("replicasets", "default", &web_set)
            .cloned()
            .unwrap_or_default();
        let mark = c.judged.len();
        write(&mut c, rs, t0.plus(s(20)), |rs| {
            set_path(
                rs,
                &["metadata", "ownerReferences"],
                json!([owner_ref(&other)]),
            )
        });
        // web, which the set left, looks again and makes itself a new one; other owns web's.
        let judged = &c.judged[mark..];
        assert!(
            judged.contains(&"deployment pass default/web".to_string()),
            "{judged:?}"
        );
        assert!(
            judged.contains(&"deployment pass default/other".to_string()),
            "{judged:?}"
        );
        let now = sets_of(&c, "web");
        assert_eq!(now.len(), 1, "{now:?}");
        assert_ne!(now[0], web_set);
        assert!(sets_of(&c, "other").contains(&web_set));
        Ok(())
    }

    #[test]
    fn longhorns_pass_looks_only_at_the_volumes_a_change_touched() -> Result<(), ApiError> {
        let t0 = Timestamp(1_767_225_600_000);
        let s = Duration::from_secs;
        // Three replicas each of pvc-a and pvc-b (one on every worker); pvc-c's one replica
        // is on worker-3.
        let mut c = super::super::seed::KubeSeed::nodes(1, 3)
            .longhorn_volume_attached("pvc-a", 3, "worker-2")
            .longhorn_volume_attached("pvc-b", 3, "worker-2")
            .longhorn_volume_attached("pvc-c", 1, "worker-3")
            .build(Behaviour::default(), t0)?;
        for v in ["pvc-a", "pvc-b", "pvc-c"] {
            assert_eq!(robustness(&c, v), "healthy", "{v}");
        }
        let judged = |c: &Cluster, from: usize| -> BTreeSet<String> {
            c.longhorn_judged[from..].iter().cloned().collect()
        };
        // Heartbeats (Node reports, lease renewals) change nothing Longhorn reads.
        let mark = c.longhorn_judged.len();
        c.sync(t0.plus(s(301)));
        assert!(judged(&c, mark).is_empty(), "{:?}", judged(&c, mark));
        // A client clears one replica's healthyAt: that volume alone is judged again, and
        // found degraded.
        let mark = c.longhorn_judged.len();
        let r = replica_on(&c, "pvc-a", "worker-1").unwrap_or_default();
        write(&mut c, r, t0.plus(s(302)), |r| {
            set_path(r, &["spec", "healthyAt"], json!(""))
        });
        assert_eq!(robustness(&c, "pvc-a"), "degraded");
        assert_eq!(judged(&c, mark), BTreeSet::from(["pvc-a".to_string()]));
        // worker-1 goes down: the volumes with a replica there are judged, pvc-c is not.
        let mark = c.longhorn_judged.len();
        c.node_down("worker-1", t0.plus(s(310)))?;
        assert_eq!(robustness(&c, "pvc-b"), "degraded");
        assert_eq!(robustness(&c, "pvc-c"), "healthy");
        assert_eq!(
            judged(&c, mark),
            BTreeSet::from(["pvc-a".to_string(), "pvc-b".to_string()])
        );
        // Back: its replicas are reused, and once re-synced both volumes are healthy.
        c.set_node_ready("worker-1", true, t0.plus(s(320)))?;
        let reused = replica_on(&c, "pvc-b", "worker-1").unwrap_or_default();
        assert_eq!(reused.at("/status/currentState"), Some(&json!("running")));
        c.sync(t0.plus(s(320 + 120)));
        assert_eq!(robustness(&c, "pvc-b"), "healthy");
        // The fault moving makes every volume looked at again.
        let mark = c.longhorn_judged.len();
        c.set_replicas_never_rebuild(["pvc-c".to_string()].into(), t0.plus(s(500)));
        assert_eq!(judged(&c, mark).len(), 3);
        Ok(())
    }

    #[test]
    fn a_returning_replica_runs_at_once_and_is_healthy_once_resynced() -> Result<(), ApiError> {
        let t0 = Timestamp(1_767_225_600_000);
        let s = Duration::from_secs;
        let mut c = super::super::seed::KubeSeed::nodes(1, 3)
            .longhorn_volume_attached("pvc-a", 3, "worker-2")
            .longhorn_volume_attached("pvc-b", 3, "worker-2")
            .longhorn_volume("pvc-rest", 3)
            .build(Behaviour::default(), t0)?;
        // Detached, its engine is stopped: Longhorn judges nothing.
        assert_eq!(robustness(&c, "pvc-rest"), "unknown");
        c.set_replicas_never_rebuild(["pvc-b".to_string()].into(), t0);
        assert_eq!(robustness(&c, "pvc-a"), "healthy");
        c.node_down("worker-1", t0)?;
        let failed = replica_on(&c, "pvc-a", "worker-1").unwrap_or_default();
        assert_eq!(failed.at("/status/currentState"), Some(&json!("stopped")));
        assert_ne!(replica_failed_at(&failed), "");
        assert_eq!(robustness(&c, "pvc-a"), "degraded");
        // Back within the rebuild delay: reused, running, not yet healthy.
        let back = t0.plus(s(90));
        c.set_node_ready("worker-1", true, back)?;
        let reused = replica_on(&c, "pvc-a", "worker-1").unwrap_or_default();
        assert_eq!(reused.at("/status/currentState"), Some(&json!("running")));
        assert_eq!(reused.at("/spec/healthyAt"), Some(&json!("")));
        assert_eq!(robustness(&c, "pvc-a"), "degraded");
        // The degraded volume's own delay (t0 + 120 s) builds no extra replica: one re-syncs.
        c.sync(t0.plus(s(200)));
        assert_eq!(
            c.list("replicas", Some("longhorn-system"))
                .iter()
                .filter(|r| r.at("/spec/volumeName") == Some(&json!("pvc-a")))
                .count(),
            3
        );
        assert_eq!(c.next_due(), Some(back.plus(s(120))));
        c.sync(back.plus(s(120)));
        assert_eq!(robustness(&c, "pvc-a"), "healthy");
        // The fault: pvc-b's replica stays stopped, nothing rebuilds it, nothing is due.
        let kept = replica_on(&c, "pvc-b", "worker-1").unwrap_or_default();
        assert_eq!(kept.at("/status/currentState"), Some(&json!("stopped")));
        assert_eq!(robustness(&c, "pvc-b"), "degraded");
        c.sync(back.plus(s(3600)));
        assert_eq!(robustness(&c, "pvc-b"), "degraded");
        Ok(())
    }
}
