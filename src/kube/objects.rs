//! Any object by apiVersion and kind, as a health check reads it: the resource found
//! through discovery (a custom resource such as CloudNativePG's `Cluster` included), then
//! one object by name or every object a label selector matches, as JSON.

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::GroupVersionKind;

use super::{KubeClient, KubeError};

impl KubeClient {
    /// The objects `api_version`/`kind` named `name` (none when it does not exist), or
    /// matching `label_selector` (at most `max`; more is an error: every match is judged).
    pub async fn objects(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: Option<&str>,
        label_selector: Option<&str>,
        max: usize,
    ) -> Result<Vec<serde_json::Value>, KubeError> {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let what = format!("find {kind} in {api_version}");
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| KubeError::from_kube(what.clone(), e))?;
        let api: Api<DynamicObject> = match (caps.scope, namespace) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(self.client.clone(), ns, &resource)
            }
            (kube::discovery::Scope::Namespaced, None) => {
                Api::all_with(self.client.clone(), &resource)
            }
            (kube::discovery::Scope::Cluster, _) => Api::all_with(self.client.clone(), &resource),
        };
        let json = |o: DynamicObject| {
            serde_json::to_value(o).map_err(|e| KubeError::Reply {
                what: what.clone(),
                message: e.to_string(),
            })
        };
        if let Some(name) = name {
            let got = api
                .get_opt(name)
                .await
                .map_err(|e| KubeError::from_kube(format!("get {kind} {name}"), e))?;
            return got.into_iter().map(json).collect();
        }
        let selector = label_selector.unwrap_or("");
        let list = api
            .list(&ListParams::default().labels(selector).limit(max as u32 + 1))
            .await
            .map_err(|e| KubeError::from_kube(format!("list {kind} -l {selector}"), e))?;
        if list.items.len() > max {
            return Err(KubeError::Reply {
                what: format!("list {kind} -l {selector}"),
                message: format!("more than {max} objects match; a health check judges at most {max}, narrow the selector"),
            });
        }
        list.items.into_iter().map(json).collect()
    }
}
