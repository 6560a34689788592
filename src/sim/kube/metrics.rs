//! `GET /_twin/metrics`: the twin's state as Prometheus scrapes it, for the health checks'
//! end-to-end tests against a real Prometheus; `POST /_twin/gauges` sets a test's gauge.
//!
//! The series follow the exporters a real cluster has, so the documented queries work on
//! both:
//! - `kube_node_status_condition{node,condition="Ready",status}`: kube-state-metrics
//!   (internal/store/node.go), one series per status value, 1 for the one that holds.
//! - `longhorn_volume_robustness{volume,node,pvc}`: longhorn-manager
//!   (metrics_collector/volume_collector.go): 0 unknown, 1 healthy, 2 degraded, 3 faulted.
//! - `ichor_twin_gauge{name}`: the twin's own, whatever a test set.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

use super::model::Cluster;

/// The most gauges a test may set (the endpoint is the twin's, still bounded).
pub const MAX_GAUGES: usize = 256;

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition text (Prometheus text format 0.0.4).
pub fn exposition(c: &Cluster, gauges: &BTreeMap<String, f64>) -> String {
    let mut out = String::new();
    let s = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    out.push_str("# HELP kube_node_status_condition The condition of a cluster node.\n# TYPE kube_node_status_condition gauge\n");
    for n in c.list("nodes", None) {
        let name = label(&s(&n, "/metadata/name"));
        let ready = n
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .and_then(|c| c["status"].as_str())
            .unwrap_or("Unknown")
            .to_ascii_lowercase();
        for status in ["true", "false", "unknown"] {
            let _ = writeln!(
                out,
                "kube_node_status_condition{{node=\"{name}\",condition=\"Ready\",status=\"{status}\"}} {}",
                u8::from(ready == status)
            );
        }
    }
    out.push_str("# HELP longhorn_volume_robustness The robustness of this volume: 0=unknown, 1=healthy, 2=degraded, 3=faulted\n# TYPE longhorn_volume_robustness gauge\n");
    for v in c.list("volumes", None) {
        let value = match s(&v, "/status/robustness").as_str() {
            "healthy" => 1,
            "degraded" => 2,
            "faulted" => 3,
            _ => 0,
        };
        let _ = writeln!(
            out,
            "longhorn_volume_robustness{{volume=\"{}\",node=\"{}\",pvc=\"{}\"}} {value}",
            label(&s(&v, "/metadata/name")),
            label(&s(&v, "/status/currentNodeID")),
            label(&s(&v, "/status/kubernetesStatus/pvcName")),
        );
    }
    out.push_str("# HELP ichor_twin_gauge A gauge a test set through POST /_twin/gauges.\n# TYPE ichor_twin_gauge gauge\n");
    for (name, v) in gauges {
        let _ = writeln!(out, "ichor_twin_gauge{{name=\"{}\"}} {v}", label(name));
    }
    out
}

/// The body of `POST /_twin/gauges`: `{"name": "...", "value": 1}`; `"value": null`
/// removes the gauge (its series goes stale in Prometheus).
pub fn set(gauges: &mut BTreeMap<String, f64>, body: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty() && n.len() <= 128)
        .ok_or("expected a name of 1 to 128 characters")?;
    match v.get("value") {
        Some(Value::Null) => {
            gauges.remove(name);
        }
        Some(n) => {
            let n = n.as_f64().ok_or("expected a number as value")?;
            if !gauges.contains_key(name) && gauges.len() >= MAX_GAUGES {
                return Err(format!("at most {MAX_GAUGES} gauges"));
            }
            gauges.insert(name.to_string(), n);
        }
        None => return Err("expected a value (a number, or null to remove)".into()),
    }
    Ok(())
}
