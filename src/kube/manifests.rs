//! The bootstrap-manifest sync: Talos renders the cluster's bootstrap manifests (kube-proxy,
//! CoreDNS, their RBAC) on each control plane from its machine configuration, but applies
//! them only at bootstrap; after a Kubernetes upgrade they must be applied again. ichor
//! applies each object server-side as Talos's own field manager (`talos`), so ownership
//! stays where Talos left it, and only objects that differ: a dry run shows what the apply
//! would make, and an object that would not change is not written.
//!
//! Talos's bootstrap created these objects as `talos` with operation Update; server-side apply
//! keys a manager by name and operation, so `talos`/Apply would conflict with Talos's own
//! fields. Before its first apply of an object ichor moves the `talos`/Update fields into
//! the `talos`/Apply entry, as kubectl moves its client-side-apply manager's fields on
//! `apply --server-side` (kubernetes/kubernetes@master:staging/src/k8s.io/client-go/util/
//! csaupgrade/upgrade.go `UpgradeManagedFields`), in one write guarded by the object's
//! resourceVersion. `talosctl upgrade-k8s` gets there by forcing every apply
//! (siderolabs/talos@046495a8:pkg/cluster/kubernetes/talos_managed.go `syncManifestsSSA`
//! through siderolabs/go-kubernetes kubernetes/ssa and fluxcd/pkg ssa/manager_apply.go,
//! `client.ForceOwnership`); ichor forces nothing, so a field any other manager owns stays
//! a conflict.
//!
//! As ADR 0057 says and as `talosctl upgrade-k8s` does (siderolabs/talos
//! pkg/cluster/kubernetes, `--manifests-force` off by default), the sync runs with the admin
//! kubeconfig Talos issues, never with ichor's own ServiceAccount, and never forces: a field
//! another manager owns (a hand-edited Corefile, a CNI managed by Helm) is a conflict that
//! stops the sync and names the object and the other manager.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

use super::{KubeClient, KubeError};

/// The field manager Talos applies its manifests with.
pub const TALOS_FIELD_MANAGER: &str = "talos";
/// Objects one sync applies at most (Talos renders a few dozen).
pub const MAX_OBJECTS: usize = 500;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    /// Whether the object changed (false: it already matched, nothing was written).
    pub changed: bool,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// The objects of Talos's `Manifests` resources, in the order Talos applies them (by
/// resource id, e.g. `00-kubelet-bootstrapping-token` before `10-kube-proxy`).
pub fn objects(manifests: &[(String, String)]) -> Result<Vec<Value>, KubeError> {
    let mut sorted: Vec<&(String, String)> = manifests.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (id, yaml) in sorted {
        let bad = |message: String| KubeError::Reply {
            what: format!("bootstrap manifest {}", crate::releaseset::excerpt(id, 80)),
            message,
        };
        let doc: Value =
            crate::releaseset::yaml::parse(id, yaml).map_err(|e| bad(e.to_string()))?;
        let items = match doc {
            Value::Array(items) => items,
            Value::Null => vec![],
            obj @ Value::Object(_) => vec![obj],
            _ => return Err(bad("expected a list of Kubernetes objects".into())),
        };
        for item in items {
            if item.get("kind").and_then(Value::as_str).is_none()
                || item.get("apiVersion").and_then(Value::as_str).is_none()
                || item
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .is_none()
            {
                return Err(bad(
                    "an object without apiVersion, kind or metadata.name".into()
                ));
            }
            out.push(item);
        }
        if out.len() > MAX_OBJECTS {
            return Err(bad(format!("more than {MAX_OBJECTS} objects")));
        }
    }
    Ok(out)
}

fn is_entry(e: &Value, manager: &str, operation: &str) -> bool {
    e.get("manager").and_then(Value::as_str) == Some(manager)
        && e.get("operation").and_then(Value::as_str) == Some(operation)
        && e.get("subresource")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
}

/// FieldsV1 sets joined: a deep union of their `f:`/`k:` trees.
fn join_fields(into: &mut Value, from: &Value) {
    let (Some(into), Some(from)) = (into.as_object_mut(), from.as_object()) else {
        return;
    };
    for (k, v) in from {
        match into.get_mut(k) {
            Some(have) => join_fields(have, v),
            None => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `managed` with Talos's own Update fields moved into its Apply entry (made when there is
/// none), or `None` when Talos owns nothing by Update. Other managers' entries stay as
/// they are.
pub fn taken_over(managed: &[Value]) -> Option<Vec<Value>> {
    let update = |e: &Value| is_entry(e, TALOS_FIELD_MANAGER, "Update");
    let first = managed.iter().find(|e| update(e))?;
    let mut fields = serde_json::json!({});
    let mut out: Vec<Value> = Vec::new();
    let mut apply_at = None;
    for e in managed {
        if update(e) {
            join_fields(&mut fields, e.get("fieldsV1").unwrap_or(&Value::Null));
        } else {
            if is_entry(e, TALOS_FIELD_MANAGER, "Apply") {
                join_fields(&mut fields, e.get("fieldsV1").unwrap_or(&Value::Null));
                apply_at = Some(out.len());
            }
            out.push(e.clone());
        }
    }
    match apply_at.and_then(|i| out.get_mut(i)) {
        Some(apply) => apply["fieldsV1"] = fields,
        None => out.push(serde_json::json!({
            "manager": TALOS_FIELD_MANAGER,
            "operation": "Apply",
            "apiVersion": first.get("apiVersion").cloned().unwrap_or(Value::Null),
            "time": first.get("time").cloned().unwrap_or(Value::Null),
            "fieldsType": "FieldsV1",
            "fieldsV1": fields,
        })),
    }
    Some(out)
}

/// The object without what the server owns, for comparing "before" and "after".
fn comparable(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "managedFields",
            "resourceVersion",
            "generation",
            "uid",
            "creationTimestamp",
        ] {
            meta.remove(k);
        }
    }
    if let Some(obj) = v.as_object_mut() {
        obj.remove("status");
    }
    v
}

impl KubeClient {
    /// Apply `objects` server-side as `talos`, writing only those a dry run shows would
    /// change. Stops at the first refusal (a 403 names the object ichor may not write).
    pub async fn sync_manifests(&self, objects: &[Value]) -> Result<Vec<Applied>, KubeError> {
        let mut out = Vec::new();
        for obj in objects {
            let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
            let kind = obj
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let name = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let (group, version) = match api_version.split_once('/') {
                Some((g, v)) => (g, v),
                None => ("", api_version),
            };
            let what = match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
                Some(ns) => format!("apply {kind} {ns}/{name}"),
                None => format!("apply {kind} {name}"),
            };
            let gvk = GroupVersionKind::gvk(group, version, &kind);
            let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
                .await
                .map_err(|e| KubeError::from_kube(format!("discover {api_version} {kind}"), e))?;
            let namespaced = caps.scope == kube::discovery::Scope::Namespaced;
            let namespace = namespaced.then(|| {
                obj.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_string()
            });
            let api: Api<DynamicObject> = match &namespace {
                Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
                None => Api::all_with(self.client.clone(), &resource),
            };
            let before = api
                .get_opt(&name)
                .await
                .map_err(|e| KubeError::from_kube(format!("get {kind} {name}"), e))?;
            // Talos's bootstrap ownership (`talos`/Update) becomes `talos`/Apply first; the
            // resourceVersion makes a concurrent change a 409, and the sync is read again.
            if let Some(b) = &before {
                let managed: Vec<Value> = b
                    .metadata
                    .managed_fields
                    .iter()
                    .flatten()
                    .filter_map(|e| serde_json::to_value(e).ok())
                    .collect();
                if let Some(fields) = taken_over(&managed) {
                    let patch = serde_json::json!({"metadata": {
                        "managedFields": fields,
                        "resourceVersion": b.metadata.resource_version,
                    }});
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(|e| {
                            KubeError::from_kube(
                                format!("take over Talos's own fields of {kind} {name}"),
                                e,
                            )
                        })?;
                }
            }
            // Not forced: another manager's field is a conflict (409), not ours to take.
            let params = PatchParams::apply(TALOS_FIELD_MANAGER);
            let changed = match &before {
                None => true,
                Some(b) => {
                    let after = api
                        .patch(&name, &params.clone().dry_run(), &Patch::Apply(obj))
                        .await
                        .map_err(|e| KubeError::from_kube(format!("{what} (dry run)"), e))?;
                    let b = serde_json::to_value(b).unwrap_or(Value::Null);
                    let a = serde_json::to_value(&after).unwrap_or(Value::Null);
                    comparable(&a) != comparable(&b)
                }
            };
            if changed {
                api.patch(&name, &params, &Patch::Apply(obj))
                    .await
                    .map_err(|e| KubeError::from_kube(what, e))?;
            }
            out.push(Applied {
                kind,
                namespace,
                name,
                changed,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_come_in_resource_order_and_must_name_themselves() {
        let m = vec![
            (
                "10-kube-proxy".to_string(),
                "- apiVersion: apps/v1\n  kind: DaemonSet\n  metadata:\n    name: kube-proxy\n    namespace: kube-system\n".to_string(),
            ),
            (
                "05-coredns".to_string(),
                "- apiVersion: v1\n  kind: ServiceAccount\n  metadata:\n    name: coredns\n    namespace: kube-system\n".to_string(),
            ),
        ];
        let objs = objects(&m).unwrap();
        assert_eq!(objs[0]["kind"], "ServiceAccount");
        assert_eq!(objs[1]["kind"], "DaemonSet");
        let bad = vec![("x".to_string(), "- kind: Pod\n".to_string())];
        assert!(objects(&bad)
            .unwrap_err()
            .to_string()
            .contains("without apiVersion"));
        let deep = vec![(
            "y".to_string(),
            format!("{}1{}", "[".repeat(100), "]".repeat(100)),
        )];
        assert!(objects(&deep).is_err());
    }

    #[test]
    fn talos_update_fields_move_into_its_apply_entry_and_others_stay() {
        use serde_json::json;
        let managed = vec![
            json!({"manager": "talos", "operation": "Update", "apiVersion": "apps/v1",
                   "time": "t0", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}}}),
            json!({"manager": "kubectl-edit", "operation": "Update", "apiVersion": "apps/v1",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:x": {}}}}}),
            json!({"manager": "talos", "operation": "Apply", "apiVersion": "apps/v1",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:k8s-app": {}}}}}),
        ];
        let out = taken_over(&managed).unwrap_or_default();
        assert_eq!(out.len(), 2, "{out:#?}");
        assert_eq!(out[0]["manager"], "kubectl-edit");
        assert_eq!(out[1]["operation"], "Apply");
        assert_eq!(
            out[1]["fieldsV1"],
            json!({"f:metadata": {"f:labels": {"f:k8s-app": {}}},
                   "f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}})
        );
        // Nothing of Talos's by Update: nothing to move (a second run writes nothing).
        assert_eq!(taken_over(&out), None);
        // Only an Update entry: it becomes the Apply entry.
        let only = taken_over(&managed[..1]).unwrap_or_default();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0]["operation"], "Apply");
        assert_eq!(only[0]["apiVersion"], "apps/v1");
    }

    #[test]
    fn server_owned_fields_do_not_count_as_a_change() {
        let a = serde_json::json!({"metadata": {"name": "x", "resourceVersion": "1", "managedFields": []}, "spec": {"a": 1}, "status": {"b": 2}});
        let b = serde_json::json!({"metadata": {"name": "x", "resourceVersion": "7"}, "spec": {"a": 1}});
        assert_eq!(comparable(&a), comparable(&b));
        let c = serde_json::json!({"metadata": {"name": "x"}, "spec": {"a": 2}});
        assert_ne!(comparable(&a), comparable(&c));
    }
}
