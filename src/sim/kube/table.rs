//! Server-side printing (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), so
//! `kubectl get nodes -o wide` and `kubectl get pods -A` print the real columns.

use serde_json::{json, Value};

use super::model::{is_ready, parse_time};
use super::resources::ResourceType;
use super::store::{name_of, namespace_of, At};
use crate::clock::Timestamp;

/// An age the way kubectl prints it (`45s`, `3m20s`, `5h`, `12d`).
pub fn human_age(secs: u64) -> String {
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86_400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        match secs % 60 {
            0 => format!("{m}m"),
            s => format!("{m}m{s}s"),
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            mm => format!("{h}h{mm}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        match h % 24 {
            0 => format!("{d}d"),
            hh => format!("{d}d{hh}h"),
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

fn age(obj: &Value, now: Timestamp) -> String {
    obj.at("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(parse_time)
        .map(|t| human_age(now.since(t).as_secs()))
        .unwrap_or_else(|| "<unknown>".into())
}

fn col(name: &str, kind: &str, priority: u8, description: &str) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": kind, "format": format, "description": description, "priority": priority})
}

fn s<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.at(ptr).and_then(Value::as_str).unwrap_or("")
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.into()
    }
}

fn address(node: &Value, kind: &str) -> String {
    let found = node
        .at("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .find(|x| x.get("type").and_then(Value::as_str) == Some(kind))
        })
        .and_then(|x| x.get("address"))
        .and_then(Value::as_str)
        .unwrap_or("");
    or_none(found)
}

fn node_row(n: &Value, now: Timestamp) -> Vec<Value> {
    let mut status = if is_ready(n) { "Ready" } else { "NotReady" }.to_string();
    if n.at("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<&str> = n
        .at("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    vec![
        json!(name_of(n)),
        json!(status),
        json!(roles),
        json!(age(n, now)),
        json!(s(n, "/status/nodeInfo/kubeletVersion")),
        json!(address(n, "InternalIP")),
        json!(address(n, "ExternalIP")),
        json!(or_none(s(n, "/status/nodeInfo/osImage"))),
        json!(or_none(s(n, "/status/nodeInfo/kernelVersion"))),
        json!(or_none(s(n, "/status/nodeInfo/containerRuntimeVersion"))),
    ]
}

fn pod_row(p: &Value, now: Timestamp) -> Vec<Value> {
    let statuses = p.at("/status/containerStatuses").and_then(Value::as_array);
    let total = p
        .at("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = statuses.map_or(0, |c| {
        c.iter()
            .filter(|c| c.get("ready") == Some(&json!(true)))
            .count()
    });
    let ready = if is_ready(p) { ready } else { 0 };
    let restarts: u64 = statuses.map_or(0, |c| {
        c.iter()
            .filter_map(|c| c.get("restartCount")?.as_u64())
            .sum()
    });
    let status = if p.at("/metadata/deletionTimestamp").is_some() {
        "Terminating".to_string()
    } else {
        or_none(s(p, "/status/phase"))
    };
    vec![
        json!(name_of(p)),
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts),
        json!(age(p, now)),
        json!(or_none(s(p, "/status/podIP"))),
        json!(or_none(s(p, "/spec/nodeName"))),
        json!("<none>"),
        json!("<none>"),
    ]
}

/// Column definitions: `main` always shown, `wide` only with `-o wide`.
fn cols(main: &[&str], wide: &[&str]) -> Vec<Value> {
    let mut out: Vec<Value> = main.iter().map(|c| col(c, "string", 0, "")).collect();
    out.extend(wide.iter().map(|c| col(c, "string", 1, "")));
    out
}

fn n(obj: &Value, ptr: &str) -> u64 {
    obj.at(ptr).and_then(Value::as_u64).unwrap_or(0)
}

/// Container names and images of a workload's pod template.
fn containers(o: &Value) -> Vec<Value> {
    let cs = o
        .at("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = cs.iter().filter_map(|c| c.get("name")?.as_str()).collect();
    let images: Vec<&str> = cs.iter().filter_map(|c| c.get("image")?.as_str()).collect();
    vec![json!(names.join(",")), json!(images.join(","))]
}

/// Renders the cells of one row.
type RowFn = fn(&Value, Timestamp) -> Vec<Value>;

/// A meta.k8s.io/v1 Table of `items`.
pub fn table(
    rt: &ResourceType,
    items: &[Value],
    resource_version: u64,
    now: Timestamp,
    include_object: bool,
) -> Value {
    let (columns, row): (Vec<Value>, RowFn) = match rt.plural {
        "nodes" => (
            vec![
                col(
                    "Name",
                    "string",
                    0,
                    "Name must be unique within a namespace.",
                ),
                col("Status", "string", 0, "The status of the node"),
                col("Roles", "string", 0, "The roles of the node"),
                col("Age", "string", 0, "CreationTimestamp"),
                col(
                    "Version",
                    "string",
                    0,
                    "Kubelet Version reported by the node.",
                ),
                col("Internal-IP", "string", 1, "List of internal IPs."),
                col("External-IP", "string", 1, "List of external IPs."),
                col("OS-Image", "string", 1, "OS image reported by the node."),
                col(
                    "Kernel-Version",
                    "string",
                    1,
                    "Kernel version reported by the node.",
                ),
                col(
                    "Container-Runtime",
                    "string",
                    1,
                    "Container runtime reported by the node.",
                ),
            ],
            node_row,
        ),
        "pods" => (
            vec![
                col(
                    "Name",
                    "string",
                    0,
                    "Name must be unique within a namespace.",
                ),
                col(
                    "Ready",
                    "string",
                    0,
                    "The aggregate readiness state of this pod for accepting traffic.",
                ),
                col(
                    "Status",
                    "string",
                    0,
                    "The aggregate status of the containers in this pod.",
                ),
                col(
                    "Restarts",
                    "string",
                    0,
                    "The number of times the containers in this pod have been restarted.",
                ),
                col("Age", "string", 0, "CreationTimestamp"),
                col("IP", "string", 1, "IP address allocated to the pod."),
                col(
                    "Node",
                    "string",
                    1,
                    "Name of the Node this pod is assigned to.",
                ),
                col(
                    "Nominated Node",
                    "string",
                    1,
                    "Name of the node nominated by the scheduler.",
                ),
                col(
                    "Readiness Gates",
                    "string",
                    1,
                    "The readiness gates of the pod.",
                ),
            ],
            pod_row,
        ),
        "poddisruptionbudgets" => (
            cols(
                &[
                    "Name",
                    "Min Available",
                    "Max Unavailable",
                    "Allowed Disruptions",
                    "Age",
                ],
                &[],
            ),
            |o, now| {
                let v = |p: &str| match o.at(p) {
                    Some(Value::Number(n)) => n.to_string(),
                    Some(Value::String(s)) => s.clone(),
                    _ => "N/A".into(),
                };
                vec![
                    json!(name_of(o)),
                    json!(v("/spec/minAvailable")),
                    json!(v("/spec/maxUnavailable")),
                    json!(n(o, "/status/disruptionsAllowed")),
                    json!(age(o, now)),
                ]
            },
        ),
        "deployments" => (
            cols(
                &["Name", "Ready", "Up-to-date", "Available", "Age"],
                &["Containers", "Images"],
            ),
            |o, now| {
                let replicas = o.at("/spec/replicas").and_then(Value::as_u64).unwrap_or(1);
                let mut row = vec![
                    json!(name_of(o)),
                    json!(format!("{}/{}", n(o, "/status/readyReplicas"), replicas)),
                    json!(n(o, "/status/updatedReplicas")),
                    json!(n(o, "/status/availableReplicas")),
                    json!(age(o, now)),
                ];
                row.extend(containers(o));
                row
            },
        ),
        "daemonsets" => (
            cols(
                &[
                    "Name",
                    "Desired",
                    "Current",
                    "Ready",
                    "Up-to-date",
                    "Available",
                    "Node Selector",
                    "Age",
                ],
                &["Containers", "Images"],
            ),
            |o, now| {
                let mut row = vec![json!(name_of(o))];
                for f in [
                    "desiredNumberScheduled",
                    "currentNumberScheduled",
                    "numberReady",
                    "updatedNumberScheduled",
                    "numberAvailable",
                ] {
                    row.push(json!(n(o, &format!("/status/{f}"))));
                }
                row.push(json!("<none>"));
                row.push(json!(age(o, now)));
                row.extend(containers(o));
                row
            },
        ),
        "leases" => (cols(&["Name", "Holder", "Age"], &[]), |o, now| {
            vec![
                json!(name_of(o)),
                json!(s(o, "/spec/holderIdentity")),
                json!(age(o, now)),
            ]
        }),
        "volumes" => (
            cols(&["Name", "State", "Robustness", "Node", "Age"], &[]),
            |o, now| {
                vec![
                    json!(name_of(o)),
                    json!(s(o, "/status/state")),
                    json!(s(o, "/status/robustness")),
                    json!(s(o, "/spec/nodeID")),
                    json!(age(o, now)),
                ]
            },
        ),
        "replicas" => (
            cols(&["Name", "State", "Node", "Volume", "Age"], &[]),
            |o, now| {
                vec![
                    json!(name_of(o)),
                    json!(s(o, "/status/currentState")),
                    json!(s(o, "/spec/nodeID")),
                    json!(s(o, "/spec/volumeName")),
                    json!(age(o, now)),
                ]
            },
        ),
        "applications" => (
            cols(&["Name", "Sync Status", "Health Status", "Age"], &[]),
            |o, now| {
                vec![
                    json!(name_of(o)),
                    json!(s(o, "/status/sync/status")),
                    json!(s(o, "/status/health/status")),
                    json!(age(o, now)),
                ]
            },
        ),
        _ => (cols(&["Name", "Age"], &[]), |o, now| {
            vec![json!(name_of(o)), json!(age(o, now))]
        }),
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let object = if include_object {
                o.clone()
            } else {
                let mut meta = o.get("metadata").cloned().unwrap_or(json!({}));
                if namespace_of(o).is_empty() {
                    if let Some(m) = meta.as_object_mut() {
                        m.remove("namespace");
                    }
                }
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
            };
            json!({"cells": row(o, now), "object": object})
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version.to_string()},
        "columnDefinitions": columns, "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_print_like_kubectl() {
        assert_eq!(human_age(45), "45s");
        assert_eq!(human_age(200), "3m20s");
        assert_eq!(human_age(3600 * 5), "5h");
        assert_eq!(human_age(86_400 * 12), "12d");
    }
}
