//! The object store: JSON objects per resource/namespace/name, one global resourceVersion
//! counter, uids and creation timestamps, and a bounded watch history that `watch` replays
//! from a resourceVersion (older than the history → 410 Expired).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Map, Value};
use tokio::sync::watch;

use super::resources::{by_plural, ResourceType, RESOURCES};
use super::select::{FieldSelector, LabelSelector};
use crate::clock::Timestamp;

/// A failed request, rendered as a metav1 Status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }
    fn details(rt: &ResourceType, name: &str) -> Value {
        let mut d = json!({"name": name, "kind": rt.plural});
        if !rt.group.is_empty() {
            d["group"] = json!(rt.group);
        }
        d
    }
    /// Also what an update of a missing object gets where the kind does not create on
    /// update, as for Leases (k8s.io/apiserver `pkg/registry/generic/registry/store.go`
    /// `Update`; kubernetes `pkg/registry/coordination/lease/strategy.go`
    /// `AllowCreateOnUpdate`).
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        ApiError {
            details: Some(Self::details(rt, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{}\" not found", rt.qualified(), name),
            )
        }
    }
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        ApiError {
            details: Some(Self::details(rt, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{}\" already exists", rt.qualified(), name),
            )
        }
    }
    /// A write whose resourceVersion is not the stored one: apimachinery
    /// `pkg/api/errors/errors.go` `NewConflict` with k8s.io/apiserver
    /// `pkg/registry/generic/registry/store.go` `OptimisticLockErrorMsg`.
    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        ApiError {
            details: Some(Self::details(rt, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                    rt.qualified(),
                    name
                ),
            )
        }
    }
    pub fn invalid(rt: &ResourceType, name: &str, field: &str, why: &str) -> Self {
        let group = if rt.group.is_empty() {
            String::new()
        } else {
            format!(".{}", rt.group)
        };
        ApiError {
            details: Some(json!({"name": name, "group": rt.group, "kind": rt.kind,
                "causes": [{"reason": "FieldValueRequired", "message": why, "field": field}]})),
            ..Self::new(
                422,
                "Invalid",
                format!(
                    "{}{} \"{}\" is invalid: {}: {}",
                    rt.kind, group, name, field, why
                ),
            )
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// The metav1 Status object for this error.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as `watch` streams it.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    pub rv: u64,
    pub plural: &'static str,
    pub namespace: String,
    pub kind: EventType,
    /// Shared between the history and every watcher replaying it.
    pub object: Arc<Value>,
}

/// The largest object the twin stores (about its JSON size): the request body limit, so a
/// 1 MiB `kubectl apply` (with its last-applied annotation) fits, and repeated patches
/// cannot grow one object without end.
pub const MAX_OBJECT: usize = 3 << 20;
/// All stored objects together (etcd's default quota is 2 GiB).
pub const MAX_STORE: usize = 1 << 30;
/// The watch history, by size as well as by count.
pub const MAX_HISTORY_BYTES: usize = 64 << 20;

/// Roughly how many bytes `v` takes as JSON, without serializing it.
pub fn approx_size(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(approx_size).sum::<usize>() + 2,
        Value::Object(m) => {
            m.iter()
                .map(|(k, v)| k.len() + 4 + approx_size(v))
                .sum::<usize>()
                + 2
        }
    }
}

type Key = (&'static str, String, String);

/// A key's parts, borrowed: a lookup by (storage, namespace, name) then allocates nothing.
/// Ordered as the tuple is, so `BTreeMap::get` may look a [`Key`] up through it.
trait KeyParts {
    fn parts(&self) -> (&str, &str, &str);
}

impl KeyParts for Key {
    fn parts(&self) -> (&str, &str, &str) {
        (self.0, &self.1, &self.2)
    }
}

impl KeyParts for (&str, &str, &str) {
    fn parts(&self) -> (&str, &str, &str) {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn KeyParts + 'a> for Key {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

impl PartialOrd for dyn KeyParts + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn KeyParts + '_ {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

/// (storage, path, value) of an indexed field.
type FieldKey = (&'static str, &'static str, String);

/// The fields the model looks objects up by, (storage, path): pods by their node, Longhorn
/// replicas by their volume and by their node, and by the labels saying so (a list
/// selecting on a label here reads the index). A missing field indexes as "".
const FIELD_INDEX: &[(&str, &str)] = &[
    ("pods", "/spec/nodeName"),
    ("replicas", "/spec/volumeName"),
    ("replicas", "/spec/nodeID"),
    ("replicas", "/metadata/labels/longhornvolume"),
    ("replicas", "/metadata/labels/longhornnode"),
];

pub struct Store {
    /// Shared with the watch history and the lists handed out: a write stores one copy.
    objects: BTreeMap<Key, Arc<Value>>,
    /// [`approx_size`] of each stored object, and their sum.
    sizes: HashMap<Key, usize>,
    live_bytes: usize,
    rv: u64,
    serial: u64,
    /// Events with their sizes, oldest first.
    history: VecDeque<(WatchEvent, usize)>,
    history_bytes: usize,
    history_limit: usize,
    /// Events before this resourceVersion are no longer in the history.
    compacted: u64,
    /// Per resource (storage plural), the resourceVersion of its newest event no longer in
    /// the history: a watch of it from an older version has missed that event (410), one
    /// from a newer version has not, however many events of other resources went since
    /// (kube-apiserver keeps a watch cache per resource: `staging/src/k8s.io/apiserver/pkg/
    /// storage/cacher/watch_cache.go`, v1.33.0).
    compacted_by: HashMap<&'static str, u64>,
    /// Per resource (storage plural), the resourceVersion of its last event. A watcher
    /// waits on its own resource's notice alone and reads the events themselves from the
    /// history: a slow watcher holds no copies of objects, a change to another resource
    /// does not wake it, and many changes before it runs wake it once.
    notices: HashMap<&'static str, watch::Sender<u64>>,
    /// The resourceVersion of the last event of any resource (the model's driver).
    any_notice: watch::Sender<u64>,
    /// The resourceVersion of the last change to each resource (storage plural), so a
    /// view built from one resource knows when it is stale without reading the history.
    last_change: HashMap<&'static str, u64>,
    /// `dryRun=All`: writes are checked and answered but not stored.
    pub dry_run: bool,
    /// Each listed object's JSON, by the stored version it was written from (its address:
    /// the entry holds that version, so the address is not reused while it is here), and
    /// dropped when the object is written again or deleted. Found without comparing keys.
    json: HashMap<usize, (Arc<Value>, Arc<[u8]>)>,
    /// Pods by their controller, (namespace, kind, name) → pod names, so the controllers
    /// find their pods without scanning every pod.
    pod_owners: HashMap<(String, String, String), BTreeSet<String>>,
    /// (storage, path, value) → (namespace, name) of the objects with that value at that
    /// path, for the [`FIELD_INDEX`] fields: a node's pods without scanning every pod.
    by_field: HashMap<FieldKey, BTreeSet<(String, String)>>,
    /// (namespace, name) of the pods that mount a PersistentVolumeClaim: the only ones the
    /// attach-detach controller looks at.
    claim_pods: BTreeSet<(String, String)>,
}

/// A stored version's identity while it is held: its address.
fn version_of(obj: &Arc<Value>) -> usize {
    Arc::as_ptr(obj) as usize
}

/// The owner with `controller: true`: (kind, name).
pub fn controller_of(pod: &Value) -> Option<(&str, &str)> {
    pod.get("metadata")?
        .get("ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| o.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|o| {
            (
                o.get("kind").and_then(Value::as_str).unwrap_or(""),
                o.get("name").and_then(Value::as_str).unwrap_or(""),
            )
        })
}

/// Whether a pod mounts a PersistentVolumeClaim.
pub fn has_claims(pod: &Value) -> bool {
    pod.at("/spec/volumes")
        .and_then(Value::as_array)
        .is_some_and(|vs| vs.iter().any(|v| v.at("/persistentVolumeClaim").is_some()))
}

/// `name` of an object.
pub fn name_of(obj: &Value) -> &str {
    obj.at("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `namespace` of an object (empty for cluster-scoped ones).
pub fn namespace_of(obj: &Value) -> &str {
    obj.at("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The parsed `metadata.resourceVersion`, if any.
pub fn rv_of(obj: &Value) -> Option<u64> {
    obj.at("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let Value::Object(top) = obj else {
        unreachable!("just made an object")
    };
    let meta = top.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    match meta {
        Value::Object(m) => m,
        _ => unreachable!("just made an object"),
    }
}

/// `Value::pointer` without its per-segment allocations (it unescapes `~0`/`~1`, which
/// the twin's own paths never contain). The controllers walk paths on every pod of every
/// pass, so this matters.
pub trait At {
    fn at(&self, path: &str) -> Option<&Value>;
}

impl At for Value {
    fn at(&self, path: &str) -> Option<&Value> {
        if path.is_empty() {
            return Some(self);
        }
        path.strip_prefix('/')?
            .split('/')
            .try_fold(self, |cur, k| match cur {
                Value::Object(m) => m.get(k),
                Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            })
    }
}

/// Set `path` in `obj`, turning anything in the way into an object. Objects come from
/// clients, so a plain `obj["a"]["b"] = v` (which panics on a non-object) is not safe.
pub fn set_path(obj: &mut Value, path: &[&str], v: Value) {
    let mut cur = obj;
    for k in path {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Value::Object(m) = cur else { return };
        cur = m.entry(k.to_string()).or_insert(Value::Null);
    }
    *cur = v;
}

/// The shape every stored object has: an object whose metadata, spec and status (when
/// present) are objects, labels and annotations maps of strings.
pub fn check_shape(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let bad = |what: &str| {
        ApiError::new(
            400,
            "BadRequest",
            format!("unable to decode the {} object: {what}", rt.kind),
        )
    };
    let Some(top) = obj.as_object() else {
        return Err(bad("the body is not a JSON object"));
    };
    for k in ["metadata", "spec", "status"] {
        if top.get(k).is_some_and(|v| !v.is_object() && !v.is_null()) {
            return Err(bad(&format!("{k} must be an object")));
        }
    }
    for k in ["labels", "annotations"] {
        if let Some(v) = obj.at(&format!("/metadata/{k}")) {
            let ok = v.is_null()
                || v.as_object()
                    .is_some_and(|m| m.values().all(Value::is_string));
            if !ok {
                return Err(bad(&format!("metadata.{k} must map strings to strings")));
            }
        }
    }
    if obj
        .at("/metadata/ownerReferences")
        .is_some_and(|v| !v.is_array() && !v.is_null())
    {
        return Err(bad("metadata.ownerReferences must be a list"));
    }
    Ok(())
}

const NAME_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl Store {
    pub fn new(history_limit: usize) -> Self {
        Store {
            objects: BTreeMap::new(),
            sizes: HashMap::new(),
            live_bytes: 0,
            rv: 1000,
            serial: 0,
            history: VecDeque::new(),
            history_bytes: 0,
            history_limit: history_limit.max(1),
            compacted: 1000,
            compacted_by: HashMap::new(),
            notices: RESOURCES
                .iter()
                .map(|rt| (rt.storage, watch::Sender::new(1000)))
                .collect(),
            any_notice: watch::Sender::new(1000),
            dry_run: false,
            json: HashMap::new(),
            pod_owners: HashMap::new(),
            by_field: HashMap::new(),
            claim_pods: BTreeSet::new(),
            last_change: HashMap::new(),
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The resourceVersion of the last change to `storage` (0: none since the start).
    pub fn last_change(&self, storage: &str) -> u64 {
        self.last_change.get(storage).copied().unwrap_or(0)
    }

    /// Notices of new events of one resource (storage plural): the resourceVersion of the
    /// last; read the events with [`Store::history_since`].
    pub fn subscribe(&self, storage: &str) -> watch::Receiver<u64> {
        // Every storage plural is in RESOURCES; were one not, any change would wake it.
        self.notices
            .get(storage)
            .unwrap_or(&self.any_notice)
            .subscribe()
    }

    /// Notices of new events of any resource: the resourceVersion of the last.
    pub fn subscribe_all(&self) -> watch::Receiver<u64> {
        self.any_notice.subscribe()
    }

    /// Refuses an object too large to store, or one that would overfill the store.
    fn check_size(&self, rt: &ResourceType, key: &Key, size: usize) -> Result<(), ApiError> {
        if size > MAX_OBJECT {
            return Err(ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!(
                    "{} {:?} would be about {size} bytes; the twin stores objects of at most {MAX_OBJECT}",
                    rt.kind, key.2
                ),
            ));
        }
        let old = self.sizes.get(key).copied().unwrap_or(0);
        if self.live_bytes.saturating_sub(old).saturating_add(size) > MAX_STORE {
            return Err(ApiError::new(
                500,
                "InternalError",
                "etcdserver: mvcc: database space exceeded",
            ));
        }
        Ok(())
    }

    fn store(&mut self, key: Key, obj: Arc<Value>, size: usize) {
        let old = self.sizes.insert(key.clone(), size).unwrap_or(0);
        self.live_bytes = self.live_bytes.saturating_sub(old).saturating_add(size);
        if let Some(was) = self.objects.insert(key, obj) {
            self.json.remove(&version_of(&was));
        }
    }

    /// The namespaces objects of `plural` are in (`""` for cluster-scoped ones), in key
    /// order: one step through the keys per namespace.
    fn namespaces_of(&self, plural: &'static str) -> Vec<String> {
        let mut found = Vec::new();
        let mut from = (plural, String::new(), String::new());
        while let Some(((p, ns, _), _)) = self.objects.range(from..).next() {
            if *p != plural {
                break;
            }
            found.push(ns.clone());
            // Past every name in `ns`: no namespace sorts between `ns` and `ns` + NUL.
            from = (plural, format!("{ns}\0"), String::new());
        }
        found
    }

    /// The JSON of `obj`, an object of `storage` as listed, written out once per version
    /// stored: a list of 500 Nodes writes out only those changed since it was last listed.
    pub fn json_of(
        &mut self,
        storage: &'static str,
        obj: &Arc<Value>,
    ) -> Result<Arc<[u8]>, serde_json::Error> {
        // Found by the version's address: a list of 500 Nodes compares no keys.
        if let Some((_, json)) = self.json.get(&version_of(obj)) {
            return Ok(json.clone());
        }
        let json: Arc<[u8]> = serde_json::to_vec(&**obj)?.into();
        // Kept only for the version stored now.
        let parts = (storage, namespace_of(obj), name_of(obj));
        if self
            .objects
            .get(&parts as &dyn KeyParts)
            .is_some_and(|stored| Arc::ptr_eq(stored, obj))
        {
            self.json
                .insert(version_of(obj), (obj.clone(), json.clone()));
        }
        Ok(json)
    }

    /// A deterministic five-character suffix, like the ones generateName produces.
    pub fn suffix(&mut self) -> String {
        self.serial += 1;
        let mut n = self.serial.wrapping_mul(2_654_435_761).wrapping_add(97);
        (0..5)
            .map(|_| {
                let c = NAME_CHARS[(n % NAME_CHARS.len() as u64) as usize] as char;
                n /= NAME_CHARS.len() as u64;
                c
            })
            .collect()
    }

    fn uid(&mut self) -> String {
        self.serial += 1;
        format!(
            "5eed{:04x}-0000-4000-8000-{:012x}",
            self.serial & 0xffff,
            self.serial
        )
    }

    fn record(
        &mut self,
        rt: &'static ResourceType,
        ns: &str,
        kind: EventType,
        object: Arc<Value>,
        size: usize,
    ) {
        let ev = WatchEvent {
            rv: self.rv,
            plural: rt.storage,
            namespace: ns.to_string(),
            kind,
            object,
        };
        self.history.push_back((ev, size));
        self.history_bytes = self.history_bytes.saturating_add(size);
        while self.history.len() > self.history_limit
            || (self.history_bytes > MAX_HISTORY_BYTES && self.history.len() > 1)
        {
            if let Some((old, size)) = self.history.pop_front() {
                self.compacted = old.rv;
                self.compacted_by.insert(old.plural, old.rv);
                self.history_bytes = self.history_bytes.saturating_sub(size);
            }
        }
        self.last_change.insert(rt.storage, self.rv);
        // Wakes only the watchers waiting now; one already woken reads this event too.
        if let Some(tx) = self.notices.get(rt.storage) {
            tx.send_replace(self.rv);
        }
        self.any_notice.send_replace(self.rv);
    }

    /// Events after `rv` for `plural` (and namespace when given), or 410 when an event of
    /// `plural` after `rv` is no longer in the history.
    pub fn history_since(
        &self,
        plural: &str,
        ns: Option<&str>,
        rv: u64,
    ) -> Result<Vec<WatchEvent>, ApiError> {
        Ok(self.events_since(plural, ns, rv)?.cloned().collect())
    }

    /// [`Store::history_since`] in place: a watcher keeps only the events its selectors
    /// pass, rather than a copy of every event of its resource.
    pub fn events_since<'a>(
        &'a self,
        plural: &'a str,
        ns: Option<&'a str>,
        rv: u64,
    ) -> Result<impl Iterator<Item = &'a WatchEvent> + 'a, ApiError> {
        let compacted = self.compacted_by.get(plural).copied().unwrap_or(0);
        if rv < compacted {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({compacted})"
            )));
        }
        let start = self.history.partition_point(|(e, _)| e.rv <= rv);
        Ok(self
            .history
            .range(start..)
            .map(|(e, _)| e)
            .filter(move |e| e.plural == plural && ns.is_none_or(|n| n == e.namespace)))
    }

    /// The changes after `rv`, oldest first; `None` when the history no longer reaches back
    /// that far.
    pub fn changes_since(&self, rv: u64) -> Option<impl Iterator<Item = &WatchEvent>> {
        if rv < self.compacted {
            return None;
        }
        let start = self.history.partition_point(|(e, _)| e.rv <= rv);
        Some(self.history.range(start..).map(|(e, _)| e))
    }

    fn index(&mut self, storage: &'static str, obj: &Value, add: bool) {
        for &(s, path) in FIELD_INDEX {
            if s != storage {
                continue;
            }
            let value = obj.at(path).and_then(Value::as_str).unwrap_or("");
            let key = (s, path, value.to_string());
            let entry = (namespace_of(obj).to_string(), name_of(obj).to_string());
            if add {
                self.by_field.entry(key).or_default().insert(entry);
            } else if let Some(set) = self.by_field.get_mut(&key) {
                set.remove(&entry);
                if set.is_empty() {
                    self.by_field.remove(&key);
                }
            }
        }
        if storage != "pods" {
            return;
        }
        if has_claims(obj) {
            let entry = (namespace_of(obj).to_string(), name_of(obj).to_string());
            if add {
                self.claim_pods.insert(entry);
            } else {
                self.claim_pods.remove(&entry);
            }
        }
        let Some((kind, owner)) = controller_of(obj) else {
            return;
        };
        let key = (
            namespace_of(obj).to_string(),
            kind.to_string(),
            owner.to_string(),
        );
        if add {
            self.pod_owners
                .entry(key)
                .or_default()
                .insert(name_of(obj).to_string());
        } else if let Some(set) = self.pod_owners.get_mut(&key) {
            set.remove(name_of(obj));
            if set.is_empty() {
                self.pod_owners.remove(&key);
            }
        }
    }

    /// The pods whose controller is `kind/name` in `ns`.
    pub fn pods_owned_by(&self, ns: &str, kind: &str, name: &str) -> Vec<&Value> {
        let key = (ns.to_string(), kind.to_string(), name.to_string());
        self.pod_owners
            .get(&key)
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| self.get("pods", ns, n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The objects of `storage` (all namespaces, in key order) whose `path` is `value`, for
    /// an indexed field ([`FIELD_INDEX`]; any other yields nothing).
    pub fn by_field<'a>(
        &'a self,
        storage: &'static str,
        path: &'static str,
        value: &str,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.indexed(storage, path, value).map(|o| &**o)
    }

    /// [`Store::by_field`], the stored objects themselves.
    fn indexed<'a>(
        &'a self,
        storage: &'static str,
        path: &'static str,
        value: &str,
    ) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        self.by_field
            .get(&(storage, path, value.to_string()))
            .into_iter()
            .flatten()
            .filter_map(move |(ns, name)| self.shared(storage, ns, name))
    }

    /// The values an indexed field currently takes (in no particular order).
    pub fn field_values<'a>(
        &'a self,
        storage: &'static str,
        path: &'static str,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.by_field
            .keys()
            .filter(move |(s, p, _)| *s == storage && *p == path)
            .map(|(_, _, v)| v.as_str())
    }

    /// The pods that mount a PersistentVolumeClaim, in key order.
    pub fn pods_with_claims(&self) -> impl Iterator<Item = &Value> {
        self.claim_pods
            .iter()
            .filter_map(|(ns, name)| self.get("pods", ns, name))
    }

    /// How many objects of `storage` have each value of an indexed field.
    pub fn field_counts<'a>(
        &'a self,
        storage: &'static str,
        path: &'static str,
    ) -> impl Iterator<Item = (&'a str, usize)> + 'a {
        self.by_field
            .iter()
            .filter(move |((s, p, _), _)| *s == storage && *p == path)
            .map(|((_, _, v), set)| (v.as_str(), set.len()))
    }

    /// Borrow the objects of one resource in one namespace.
    pub fn iter_ns<'a>(
        &'a self,
        plural: &'static str,
        ns: &'a str,
    ) -> impl Iterator<Item = &'a Value> {
        self.objects
            .range((plural, ns.to_string(), String::new())..)
            .take_while(move |((p, n, _), _)| *p == plural && n == ns)
            .map(|(_, o)| &**o)
    }

    pub fn get(&self, plural: &'static str, ns: &str, name: &str) -> Option<&Value> {
        self.shared(plural, ns, name).map(|o| &**o)
    }

    /// The stored object itself, shared (no copy).
    pub fn shared(&self, plural: &'static str, ns: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects.get(&(plural, ns, name) as &dyn KeyParts)
    }

    /// Objects of one resource, optionally in one namespace, that match both selectors.
    pub fn list(
        &self,
        plural: &'static str,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Vec<Arc<Value>> {
        let keep = |o: &&Arc<Value>| {
            ns.is_none_or(|ns| namespace_of(o) == ns)
                && labels.matches_object(o)
                && fields.matches(o)
        };
        // `spec.nodeName=X` on pods (a drain's, a kubelet's list) reads the node index
        // instead of every pod; the index holds (namespace, name) in key order, so the
        // result is the same objects in the same order.
        if let Some(node) = fields.equals("spec.nodeName").filter(|_| plural == "pods") {
            return self
                .indexed("pods", "/spec/nodeName", node)
                .filter(keep)
                .cloned()
                .collect();
        }
        // `metadata.name=X` (a client listing one object by name in every namespace) reads
        // that name in each namespace rather than every object.
        if let Some(name) = fields.equals("metadata.name") {
            let namespaces = match ns {
                Some(ns) => vec![ns.to_string()],
                None => self.namespaces_of(plural),
            };
            return namespaces
                .iter()
                .filter_map(|ns| self.shared(plural, ns, name))
                .filter(keep)
                .cloned()
                .collect();
        }
        // `label=X` or `label in (X, Y)` on a label in the field index (Longhorn replicas'
        // volume and node, what a rollout's look at one node selects on) reads those
        // values' objects, put back in key order.
        let indexed_label = FIELD_INDEX
            .iter()
            .filter(|(storage, _)| *storage == plural)
            .find_map(|(_, path)| {
                let label = path.strip_prefix("/metadata/labels/")?;
                Some((*path, labels.values_of(label)?))
            });
        if let Some((path, values)) = indexed_label {
            let mut found: Vec<Arc<Value>> = values
                .iter()
                .flat_map(|v| self.indexed(plural, path, v))
                .filter(keep)
                .cloned()
                .collect();
            found.sort_by(|a, b| (namespace_of(a), name_of(a)).cmp(&(namespace_of(b), name_of(b))));
            found.dedup_by(|a, b| Arc::ptr_eq(a, b));
            return found;
        }
        let from = (plural, ns.unwrap_or_default().to_string(), String::new());
        self.objects
            .range(from..)
            .take_while(|((p, n, _), _)| *p == plural && ns.is_none_or(|ns| n == ns))
            .map(|(_, o)| o)
            .filter(keep)
            .cloned()
            .collect()
    }

    /// Borrow every object of one resource (all namespaces), in key order.
    pub fn iter(&self, plural: &'static str) -> impl Iterator<Item = &Value> {
        self.objects
            .range((plural, String::new(), String::new())..)
            .take_while(move |((p, _, _), _)| *p == plural)
            .map(|(_, o)| &**o)
    }

    /// Every object of one resource (all namespaces), shared.
    pub fn all(&self, plural: &'static str) -> Vec<Arc<Value>> {
        self.list(
            plural,
            None,
            &LabelSelector::default(),
            &FieldSelector::default(),
        )
    }

    /// Create an object: fills name (from generateName), namespace, uid, resourceVersion,
    /// creationTimestamp and generation; 409 AlreadyExists if the name is taken.
    pub fn create(
        &mut self,
        rt: &'static ResourceType,
        ns: &str,
        mut obj: Value,
        now: Timestamp,
    ) -> Result<Arc<Value>, ApiError> {
        check_shape(rt, &obj)?;
        let ns = if rt.namespaced { ns } else { "" };
        let mut name = name_of(&obj).to_string();
        if name.is_empty() {
            let generate = obj
                .at("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if generate.is_empty() {
                return Err(ApiError::invalid(
                    rt,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ));
            }
            name = format!("{}{}", generate, self.suffix());
        }
        if self.get(rt.storage, ns, &name).is_some() {
            return Err(ApiError::already_exists(rt, &name));
        }
        let rv = self.rv + 1;
        let uid = self.uid();
        let has_spec = obj.get("spec").is_some();
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        let m = meta_mut(&mut obj);
        m.insert("name".into(), json!(name));
        if rt.namespaced {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(uid));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        m.insert("creationTimestamp".into(), json!(now.rfc3339()));
        if has_spec {
            m.insert("generation".into(), json!(1));
        }
        let key = (rt.storage, ns.to_string(), name);
        let size = approx_size(&obj);
        self.check_size(rt, &key, size)?;
        let obj = Arc::new(obj);
        if self.dry_run {
            return Ok(obj);
        }
        self.rv = rv;
        self.store(key, obj.clone(), size);
        self.index(rt.storage, &obj, true);
        self.record(rt, ns, EventType::Added, obj.clone(), size);
        Ok(obj)
    }

    /// Replace an object. A non-empty `metadata.resourceVersion` must match the stored one
    /// (409 Conflict otherwise). uid and creationTimestamp are kept; generation moves when
    /// the spec changes. Returns the stored object; no event when nothing changed.
    pub fn update(
        &mut self,
        rt: &'static ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
    ) -> Result<Arc<Value>, ApiError> {
        check_shape(rt, &obj)?;
        let ns = if rt.namespaced { ns } else { "" };
        let Some(old) = self.shared(rt.storage, ns, name).cloned() else {
            return Err(ApiError::not_found(rt, name));
        };
        if let Some(want) = rv_of(&obj) {
            if Some(want) != rv_of(&old) {
                return Err(ApiError::conflict(rt, name));
            }
        } else if obj
            .at("/metadata/resourceVersion")
            .is_some_and(|v| !v.is_string() && !v.is_null())
        {
            return Err(ApiError::bad_request(
                "metadata.resourceVersion must be a string",
            ));
        }
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            if rt.namespaced {
                m.insert("namespace".into(), json!(ns));
            }
            for keep in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
                match old.at(&format!("/metadata/{keep}")) {
                    Some(v) => m.insert(keep.into(), v.clone()),
                    None => m.remove(keep),
                };
            }
        }
        if obj == *old {
            return Ok(old);
        }
        if obj.get("spec") != old.get("spec") && obj.get("spec").is_some() {
            let g = old
                .at("/metadata/generation")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            meta_mut(&mut obj).insert("generation".into(), json!(g + 1));
        }
        let rv = self.rv + 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let key = (rt.storage, ns.to_string(), name.to_string());
        let size = approx_size(&obj);
        self.check_size(rt, &key, size)?;
        let obj = Arc::new(obj);
        if self.dry_run {
            return Ok(obj);
        }
        self.rv = rv;
        self.index(rt.storage, &old, false);
        self.store(key, obj.clone(), size);
        self.index(rt.storage, &obj, true);
        self.record(rt, ns, EventType::Modified, obj.clone(), size);
        Ok(obj)
    }

    /// Create or replace, ignoring resourceVersion (the library path for the model).
    pub fn upsert(
        &mut self,
        rt: &'static ResourceType,
        mut obj: Value,
        now: Timestamp,
    ) -> Result<Arc<Value>, ApiError> {
        let ns = if rt.namespaced {
            namespace_of(&obj).to_string()
        } else {
            String::new()
        };
        let name = name_of(&obj).to_string();
        if !name.is_empty() && self.get(rt.storage, &ns, &name).is_some() {
            meta_mut(&mut obj).remove("resourceVersion");
            self.update(rt, &ns, &name, obj)
        } else {
            self.create(rt, &ns, obj, now)
        }
    }

    pub fn delete(
        &mut self,
        rt: &'static ResourceType,
        ns: &str,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let ns = if rt.namespaced { ns } else { "" };
        if self.dry_run {
            return self
                .shared(rt.storage, ns, name)
                .cloned()
                .ok_or_else(|| ApiError::not_found(rt, name));
        }
        let key = (rt.storage, ns.to_string(), name.to_string());
        let Some(last) = self.objects.remove(&key) else {
            return Err(ApiError::not_found(rt, name));
        };
        self.json.remove(&version_of(&last));
        let size = self.sizes.remove(&key).unwrap_or(0);
        self.live_bytes = self.live_bytes.saturating_sub(size);
        self.index(rt.storage, &last, false);
        // The caller gets the object as last stored; the DELETED event carries the new
        // version, so a watch from the returned version sees the deletion.
        let mut obj = (*last).clone();
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        self.record(rt, ns, EventType::Deleted, Arc::new(obj), size);
        Ok(last)
    }

    /// Look up a resource type by plural; the model only names served ones.
    pub fn rt(plural: &str) -> Result<&'static ResourceType, ApiError> {
        by_plural(plural).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({plural})"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leases() -> &'static ResourceType {
        by_plural("leases").unwrap_or(&super::super::resources::RESOURCES[0])
    }

    #[test]
    fn create_update_conflict_and_history() {
        let mut s = Store::new(3);
        let now = Timestamp(0);
        let created = s.create(
            leases(),
            "default",
            json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}),
            now,
        );
        let created = created.unwrap_or_default();
        assert_eq!(rv_of(&created), Some(1001));
        assert_eq!(
            s.create(leases(), "default", json!({"metadata": {"name": "l"}}), now)
                .map_err(|e| e.code),
            Err(409)
        );
        let mut next = (*created).clone();
        next["spec"]["holderIdentity"] = json!("b");
        let updated = s
            .update(leases(), "default", "l", next.clone())
            .unwrap_or_default();
        assert_eq!(updated.at("/metadata/generation"), Some(&json!(2)));
        // The same stale resourceVersion again: conflict.
        let err = s
            .update(leases(), "default", "l", next)
            .map_err(|e| e.reason);
        assert_eq!(err, Err("Conflict"));
        assert_eq!(
            s.history_since("leases", None, 1001)
                .map(|h| h.len())
                .unwrap_or(0),
            1
        );
        for i in 0..4 {
            let _ = s.create(
                leases(),
                "default",
                json!({"metadata": {"name": format!("x{i}")}}),
                now,
            );
        }
        assert_eq!(
            s.history_since("leases", None, 1001).map_err(|e| e.code),
            Err(410)
        );
    }

    #[test]
    fn objects_and_the_watch_history_are_bounded_in_bytes() {
        let mut s = Store::new(10_000);
        let now = Timestamp(0);
        let blob = |n: usize| json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "x".repeat(n)}});
        assert!(s.create(leases(), "default", blob(1 << 20), now).is_ok());
        let first = s.resource_version();
        // Growing past the object limit (as repeated patches would) is refused.
        let too_big = s.update(leases(), "default", "l", blob(MAX_OBJECT + 1));
        assert_eq!(too_big.map_err(|e| e.code).err(), Some(413));
        // A stream of 1 MiB updates keeps the history within its byte budget; a watcher
        // from before is told to re-list.
        for i in 0..(MAX_HISTORY_BYTES >> 20) + 8 {
            let mut next = blob(1 << 20);
            next["spec"]["renewTime"] = json!(i);
            assert!(s.update(leases(), "default", "l", next).is_ok());
        }
        assert!(s.history_bytes <= MAX_HISTORY_BYTES + (2 << 20));
        assert_eq!(
            s.history_since("leases", None, first)
                .map(|_| ())
                .map_err(|e| e.code),
            Err(410)
        );
        assert!(s.live_bytes < 2 << 20, "one object is stored");
        assert!(s.delete(leases(), "default", "l").is_ok());
        assert_eq!(s.live_bytes, 0);
    }

    /// A list selecting on an indexed label answers what a scan of every object answers,
    /// in the same order, and follows the objects as they change.
    #[test]
    fn a_list_by_an_indexed_label_answers_as_a_scan() -> Result<(), ApiError> {
        let Some(replicas) = by_plural("replicas") else {
            return Err(ApiError::bad_request("no replicas resource"));
        };
        let mut s = Store::new(100);
        let now = Timestamp(0);
        // Created out of key order, some without the labels.
        for (name, volume, node) in [
            ("r-9", Some("pvc-b"), Some("w-1")),
            ("r-1", Some("pvc-a"), Some("w-2")),
            ("r-5", Some("pvc-a"), Some("w-1")),
            ("r-3", None, Some("w-1")),
            ("r-7", Some("pvc-c"), None),
        ] {
            let mut labels = serde_json::Map::new();
            if let Some(v) = volume {
                labels.insert("longhornvolume".into(), json!(v));
            }
            if let Some(n) = node {
                labels.insert("longhornnode".into(), json!(n));
            }
            s.create(
                replicas,
                "longhorn-system",
                json!({"metadata": {"name": name, "labels": labels}}),
                now,
            )?;
        }
        let names = |objs: Vec<Arc<Value>>| -> Vec<String> {
            objs.iter().map(|o| name_of(o).to_string()).collect()
        };
        let scan = |s: &Store, sel: &LabelSelector| -> Vec<String> {
            s.iter("replicas")
                .filter(|o| sel.matches_object(o))
                .map(|o| name_of(o).to_string())
                .collect()
        };
        let none = FieldSelector::default();
        for text in [
            "longhornvolume=pvc-a",
            "longhornvolume in (pvc-b,pvc-a,pvc-a)",
            "longhornnode=w-1",
            "longhornnode=w-1,longhornvolume=pvc-a",
            "longhornvolume in (pvc-z)",
            "longhornnode!=w-1",
        ] {
            let sel =
                LabelSelector::parse(text).map_err(|e| ApiError::bad_request(e.to_string()))?;
            let listed = names(s.list("replicas", None, &sel, &none));
            assert_eq!(listed, scan(&s, &sel), "{text}");
        }
        let sel = LabelSelector::parse("longhornvolume in (pvc-a,pvc-b)")
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        assert_eq!(
            names(s.list("replicas", None, &sel, &none)),
            ["r-1", "r-5", "r-9"]
        );
        // r-5 moves to pvc-c: the index follows.
        let mut moved = (*s
            .shared("replicas", "longhorn-system", "r-5")
            .cloned()
            .unwrap_or_default())
        .clone();
        moved["metadata"]["labels"]["longhornvolume"] = json!("pvc-c");
        if let Some(m) = moved.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        s.update(replicas, "longhorn-system", "r-5", moved)?;
        assert_eq!(names(s.list("replicas", None, &sel, &none)), ["r-1", "r-9"]);
        Ok(())
    }

    /// A list by name finds the name in every namespace (and no other object); an object's
    /// JSON as listed follows each version stored.
    #[test]
    fn a_list_by_name_reads_each_namespace_and_listed_json_follows_writes() -> Result<(), ApiError>
    {
        let mut s = Store::new(100);
        let now = Timestamp(0);
        for (ns, name) in [("b", "x"), ("a", "x"), ("a", "y"), ("c", "y"), ("ab", "x")] {
            s.create(leases(), ns, json!({"metadata": {"name": name}}), now)?;
        }
        let by = |s: &Store, ns: Option<&str>, name: &str| -> Result<Vec<String>, ApiError> {
            let f = FieldSelector::parse(&format!("metadata.name={name}"))
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok(s.list("leases", ns, &LabelSelector::default(), &f)
                .iter()
                .map(|o| format!("{}/{}", namespace_of(o), name_of(o)))
                .collect())
        };
        assert_eq!(by(&s, None, "x")?, ["a/x", "ab/x", "b/x"]);
        assert_eq!(by(&s, None, "y")?, ["a/y", "c/y"]);
        assert_eq!(by(&s, Some("c"), "y")?, ["c/y"]);
        assert!(by(&s, Some("b"), "y")?.is_empty());
        assert!(by(&s, None, "z")?.is_empty());

        let listed = |s: &mut Store| -> Result<Value, ApiError> {
            let obj = s.shared("leases", "a", "x").cloned().unwrap_or_default();
            let json = s
                .json_of("leases", &obj)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            serde_json::from_slice(&json).map_err(|e| ApiError::bad_request(e.to_string()))
        };
        assert_eq!(listed(&mut s)?.at("/spec"), None);
        let mut next = s.get("leases", "a", "x").cloned().unwrap_or_default();
        next["spec"] = json!({"holderIdentity": "me"});
        s.update(leases(), "a", "x", next)?;
        assert_eq!(
            listed(&mut s)?.at("/spec/holderIdentity"),
            Some(&json!("me"))
        );
        s.delete(leases(), "a", "x")?;
        s.create(leases(), "a", json!({"metadata": {"name": "x"}}), now)?;
        assert_eq!(listed(&mut s)?.at("/spec"), None);
        Ok(())
    }
}
