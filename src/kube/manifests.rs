//! The bootstrap-manifest sync: Talos renders the cluster's bootstrap manifests (kube-proxy,
//! CoreDNS, their RBAC) on each control plane from its machine configuration, but applies
//! them only at bootstrap; after a Kubernetes upgrade they must be applied again. ichor
//! applies each object server-side as Talos's own field manager (`talos`), so ownership
//! stays where Talos left it, and only objects that differ: a dry run shows what the apply
//! would make, and an object that would not change is not written.
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
    fn server_owned_fields_do_not_count_as_a_change() {
        let a = serde_json::json!({"metadata": {"name": "x", "resourceVersion": "1", "managedFields": []}, "spec": {"a": 1}, "status": {"b": 2}});
        let b = serde_json::json!({"metadata": {"name": "x", "resourceVersion": "7"}, "spec": {"a": 1}});
        assert_eq!(comparable(&a), comparable(&b));
        let c = serde_json::json!({"metadata": {"name": "x"}, "spec": {"a": 2}});
        assert_ne!(comparable(&a), comparable(&c));
    }
}
