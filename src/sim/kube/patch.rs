//! The three patch formats: JSON merge patch (RFC 7386), strategic merge patch (the subset
//! kubectl sends: maps merge, lists of known kinds merge by key, `$patch` directives), and
//! JSON patch (RFC 6902: add, remove, replace, test).

use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("the patch is not a JSON object")]
    NotAnObject,
    #[error("invalid JSON patch operation {0}")]
    BadOp(String),
    #[error("JSON patch path {0} does not exist")]
    NoPath(String),
    #[error("JSON patch test failed at {0}")]
    TestFailed(String),
}

/// RFC 7386: objects merge recursively, `null` deletes, everything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The merge key of the lists that Kubernetes merges by key rather than replaces.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers" | "initContainers" | "volumes" | "env" | "volumeMounts" => "name",
        "conditions" => "type",
        "taints" => "key",
        "ownerReferences" => "uid",
        "ports" => "containerPort",
        "addresses" => "type",
        _ => return None,
    })
}

/// Lists of primitives that merge as sets.
fn is_set_list(field: &str) -> bool {
    field == "finalizers"
}

/// The strategic merge patch kubectl sends for cordon, label, annotate and edits.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Value::Object(p) = patch else {
        return Err(PatchError::NotAnObject);
    };
    smp_object(target, p);
    Ok(())
}

fn smp_object(target: &mut Value, p: &Map<String, Value>) {
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = p.clone();
        clean.remove("$patch");
        *target = Value::Object(clean);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(have)), Value::Array(gone)) = (t.get_mut(field), v) {
                have.retain(|x| !gone.contains(x));
            }
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(inner) => {
                if inner.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.remove(k);
                } else {
                    smp_object(t.entry(k.clone()).or_insert(Value::Null), inner);
                }
            }
            Value::Array(items) => {
                let slot = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                if let (Some(key), Value::Array(have)) = (merge_key(k), &mut *slot) {
                    merge_list_by_key(have, items, key);
                } else if let (true, Value::Array(have)) = (is_set_list(k), &mut *slot) {
                    for x in items {
                        if !have.contains(x) {
                            have.push(x.clone());
                        }
                    }
                } else {
                    *slot = v.clone();
                }
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

fn merge_list_by_key(have: &mut Vec<Value>, items: &[Value], key: &str) {
    for item in items {
        let Some(obj) = item.as_object() else {
            have.push(item.clone());
            continue;
        };
        let id = obj.get(key);
        let pos = have.iter().position(|h| h.get(key) == id && id.is_some());
        let delete = obj.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                have.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => smp_object(&mut have[i], obj),
            (None, false) => {
                let mut fresh = Value::Null;
                smp_object(&mut fresh, obj);
                have.push(fresh);
            }
        }
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn split_pointer(path: &str) -> Result<(String, String), PatchError> {
    let Some(idx) = path.rfind('/') else {
        return Err(PatchError::NoPath(path.to_string()));
    };
    Ok((path[..idx].to_string(), unescape(&path[idx + 1..])))
}

/// RFC 6902 with the operations Kubernetes clients use.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let Some(ops) = ops.as_array() else {
        return Err(PatchError::BadOp("the body is not a list".to_string()));
    };
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| PatchError::BadOp(op.to_string()))?;
        let value = op.get("value").cloned().unwrap_or(Value::Null);
        match kind {
            "test" => {
                if target.pointer(path) != Some(&value) {
                    return Err(PatchError::TestFailed(path.to_string()));
                }
            }
            "replace" => {
                let slot = target
                    .pointer_mut(path)
                    .ok_or_else(|| PatchError::NoPath(path.to_string()))?;
                *slot = value;
            }
            "remove" => {
                let (parent, last) = split_pointer(path)?;
                let removed = match target.pointer_mut(&parent) {
                    Some(Value::Object(m)) => m.remove(&last).is_some(),
                    Some(Value::Array(a)) => match last.parse::<usize>() {
                        Ok(i) if i < a.len() => {
                            a.remove(i);
                            true
                        }
                        _ => false,
                    },
                    _ => false,
                };
                if !removed {
                    return Err(PatchError::NoPath(path.to_string()));
                }
            }
            "add" => {
                if path.is_empty() {
                    *target = value;
                    continue;
                }
                let (parent, last) = split_pointer(path)?;
                match target.pointer_mut(&parent) {
                    Some(Value::Object(m)) => {
                        m.insert(last, value);
                    }
                    Some(Value::Array(a)) if last == "-" => a.push(value),
                    Some(Value::Array(a)) => match last.parse::<usize>() {
                        Ok(i) if i <= a.len() => a.insert(i, value),
                        _ => return Err(PatchError::NoPath(path.to_string())),
                    },
                    _ => return Err(PatchError::NoPath(path.to_string())),
                }
            }
            other => return Err(PatchError::BadOp(other.to_string())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_on_null() {
        let mut node = json!({"spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24"}});
        merge_patch(&mut node, &json!({"spec": {"unschedulable": null}}));
        assert_eq!(node, json!({"spec": {"podCIDR": "10.0.0.0/24"}}));
    }

    #[test]
    fn strategic_patch_merges_conditions_by_type() {
        let mut pod = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}});
        let patch = json!({"$setElementOrder/conditions": [{"type": "Ready"}],
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        assert_eq!(strategic_merge_patch(&mut pod, &patch), Ok(()));
        assert_eq!(
            pod.pointer("/status/conditions/0/status"),
            Some(&json!("False"))
        );
        assert_eq!(
            pod.pointer("/status/conditions/1/type"),
            Some(&json!("PodScheduled"))
        );
    }

    #[test]
    fn strategic_patch_cordons_and_labels() {
        let mut node = json!({"metadata": {"labels": {"a": "1"}}, "spec": {}});
        let patch = json!({"metadata": {"labels": {"b": "2"}}, "spec": {"unschedulable": true}});
        assert_eq!(strategic_merge_patch(&mut node, &patch), Ok(()));
        assert_eq!(
            node,
            json!({"metadata": {"labels": {"a": "1", "b": "2"}},
                                "spec": {"unschedulable": true}})
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut v = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        let ops = json!([
            {"op": "add", "path": "/metadata/labels/b", "value": "2"},
            {"op": "remove", "path": "/metadata/labels/a"},
            {"op": "add", "path": "/list/-", "value": 3},
            {"op": "test", "path": "/list/2", "value": 3},
            {"op": "replace", "path": "/list/0", "value": 0}
        ]);
        assert_eq!(json_patch(&mut v, &ops), Ok(()));
        assert_eq!(
            v,
            json!({"metadata": {"labels": {"b": "2"}}, "list": [0, 2, 3]})
        );
        assert!(json_patch(&mut v, &json!([{"op": "remove", "path": "/nope"}])).is_err());
    }
}
