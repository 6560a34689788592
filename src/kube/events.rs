//! Kubernetes Events on the Nodes ichor touches, so `kubectl describe node` shows what
//! ichor did to it and why (core/v1 Events in `default`, where the kubelet writes a Node's).

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::{KubeClient, KubeError};
use crate::clock::Timestamp;

/// Where Events about cluster-scoped objects live.
pub const NODE_EVENTS_NAMESPACE: &str = "default";

impl KubeClient {
    /// Record `reason` (CamelCase, e.g. `TalosUpgraded`) and `message` on Node `node`.
    pub async fn node_event(
        &self,
        node: &str,
        reason: &str,
        message: &str,
        warning: bool,
        now: Timestamp,
        instance: &str,
    ) -> Result<(), KubeError> {
        let api = Api::<Event>::namespaced(self.client.clone(), NODE_EVENTS_NAMESPACE);
        let name = format!(
            "{}.ichor.{:x}{:04x}",
            crate::escape::clip(node, 200),
            now.as_millis(),
            rand::random::<u16>()
        );
        let t = now.rfc3339();
        let event: Event = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NODE_EVENTS_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": reason,
            "message": crate::escape::clip(message, 1000),
            "type": if warning { "Warning" } else { "Normal" },
            "source": {"component": "ichor"},
            "reportingComponent": "ichor.dev/rollout",
            "reportingInstance": crate::escape::clip(instance, 128),
            "firstTimestamp": t,
            "lastTimestamp": t,
            "count": 1,
        }))
        .map_err(|e| KubeError::Reply {
            what: format!("an Event for node {node}"),
            message: e.to_string(),
        })?;
        api.create(&PostParams::default(), &event)
            .await
            .map(|_| ())
            .map_err(|e| KubeError::from_kube("create an Event", e))
    }
}
