//! The three patch formats: JSON merge patch (RFC 7386), strategic merge patch (the subset
//! kubectl sends: maps merge, lists of known kinds merge by key, `$patch` directives), and
//! JSON patch (RFC 6902: add, remove, replace, move, copy, test).

use std::collections::{HashMap, VecDeque};

use serde_json::{Map, Value};

/// What a JSON patch may add to a document in total (values added or copied), so a few
/// `copy` operations cannot double an object into gigabytes. The apiserver stores objects
/// of at most 1.5 MiB.
pub const MAX_PATCH_GROWTH: usize = 8 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("the patch is not a JSON object")]
    NotAnObject,
    #[error("invalid JSON patch operation {0}")]
    BadOp(String),
    #[error("JSON patch operation {0:?} is not supported (RFC 6902 defines add, remove, replace, move, copy and test)")]
    UnsupportedOp(String),
    #[error("JSON patch path {0} does not exist")]
    NoPath(String),
    #[error("JSON patch test failed at {0}")]
    TestFailed(String),
    #[error("JSON patch: cannot move {from} into its own child {path}")]
    MoveIntoChild { from: String, path: String },
    #[error("JSON patch would grow the object by more than {MAX_PATCH_GROWTH} bytes")]
    TooLarge,
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

/// Merges `items` into `have` by `key`, in one pass over each (an index of the keys, not a
/// search per item, so a patch with many items cannot take quadratic time). The first
/// element with a given key is the one merged into or deleted, as before.
fn merge_list_by_key(have: &mut Vec<Value>, items: &[Value], key: &str) {
    let id_of = |v: &Value| v.get(key).map(Value::to_string);
    let mut slots: Vec<Option<Value>> = std::mem::take(have).into_iter().map(Some).collect();
    // Key → positions holding it, first first; the first live one is merged into.
    let mut index: HashMap<String, VecDeque<usize>> = HashMap::new();
    for (i, v) in slots.iter().enumerate() {
        if let Some(id) = v.as_ref().and_then(id_of) {
            index.entry(id).or_default().push_back(i);
        }
    }
    for item in items {
        let Some(obj) = item.as_object() else {
            slots.push(Some(item.clone()));
            continue;
        };
        let id = id_of(item);
        let pos = id
            .as_ref()
            .and_then(|id| index.get(id))
            .and_then(|p| p.front().copied());
        let delete = obj.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                slots[i] = None;
                if let Some(p) = id.as_ref().and_then(|id| index.get_mut(id)) {
                    p.pop_front();
                }
            }
            (None, true) => {}
            (Some(i), false) => {
                if let Some(slot) = slots[i].as_mut() {
                    smp_object(slot, obj);
                }
            }
            (None, false) => {
                let mut fresh = Value::Null;
                smp_object(&mut fresh, obj);
                if let Some(id) = id {
                    index.entry(id).or_default().push_back(slots.len());
                }
                slots.push(Some(fresh));
            }
        }
    }
    *have = slots.into_iter().flatten().collect();
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

/// Roughly how many bytes `v` takes serialized (for the growth bound).
fn size_of(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(size_of).sum::<usize>() + 2,
        Value::Object(m) => {
            m.iter()
                .map(|(k, v)| k.len() + 4 + size_of(v))
                .sum::<usize>()
                + 2
        }
    }
}

/// Removes and returns the value at `path`.
fn take(target: &mut Value, path: &str) -> Result<Value, PatchError> {
    let (parent, last) = split_pointer(path)?;
    let taken = match target.pointer_mut(&parent) {
        Some(Value::Object(m)) => m.remove(&last),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Some(a.remove(i)),
            _ => None,
        },
        _ => None,
    };
    taken.ok_or_else(|| PatchError::NoPath(path.to_string()))
}

/// Adds `value` at `path` (RFC 6902 `add`: replaces a member, inserts into an array).
fn put(target: &mut Value, path: &str, value: Value) -> Result<(), PatchError> {
    if path.is_empty() {
        *target = value;
        return Ok(());
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
    Ok(())
}

/// RFC 6902. Added and copied values count against [`MAX_PATCH_GROWTH`].
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), PatchError> {
    let Some(ops) = ops.as_array() else {
        return Err(PatchError::BadOp("the body is not a list".to_string()));
    };
    let mut growth = 0usize;
    let mut grow = |v: &Value| {
        growth = growth.saturating_add(size_of(v));
        if growth > MAX_PATCH_GROWTH {
            Err(PatchError::TooLarge)
        } else {
            Ok(())
        }
    };
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| PatchError::BadOp(op.to_string()))?;
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| PatchError::BadOp(format!("{kind} needs \"from\": {op}")))
        };
        let value = op.get("value").cloned().unwrap_or(Value::Null);
        match kind {
            "copy" => {
                let from = from()?;
                let v = target
                    .pointer(from)
                    .ok_or_else(|| PatchError::NoPath(from.to_string()))?;
                grow(v)?;
                let v = v.clone();
                put(target, path, v)?;
            }
            "move" => {
                let from = from()?;
                if from == path {
                    target
                        .pointer(from)
                        .ok_or_else(|| PatchError::NoPath(from.to_string()))?;
                    continue;
                }
                if path.starts_with(&format!("{from}/")) {
                    return Err(PatchError::MoveIntoChild {
                        from: from.to_string(),
                        path: path.to_string(),
                    });
                }
                let v = take(target, from)?;
                put(target, path, v)?;
            }
            "test" => {
                if target.pointer(path) != Some(&value) {
                    return Err(PatchError::TestFailed(path.to_string()));
                }
            }
            "replace" => {
                grow(&value)?;
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
                grow(&value)?;
                put(target, path, value)?;
            }
            "" => return Err(PatchError::BadOp(format!("missing \"op\": {op}"))),
            other => return Err(PatchError::UnsupportedOp(other.to_string())),
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

    #[test]
    fn json_patch_copy_and_move_follow_rfc_6902() {
        let mut v = json!({"metadata": {"labels": {"a": "1"}}, "list": [1, 2]});
        let ops = json!([
            {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
            {"op": "move", "from": "/list/0", "path": "/list/-"},
            {"op": "copy", "from": "/list", "path": "/spare"}
        ]);
        assert_eq!(json_patch(&mut v, &ops), Ok(()));
        assert_eq!(
            v,
            json!({"metadata": {"labels": {"a": "1", "b": "1"}}, "list": [2, 1], "spare": [2, 1]})
        );
        assert_eq!(
            json_patch(
                &mut v,
                &json!([{"op": "move", "from": "/list", "path": "/list/0"}])
            ),
            Err(PatchError::MoveIntoChild {
                from: "/list".into(),
                path: "/list/0".into()
            })
        );
        assert!(matches!(
            json_patch(&mut v, &json!([{"op": "frobnicate", "path": "/list"}])),
            Err(PatchError::UnsupportedOp(_))
        ));
    }

    #[test]
    fn doubling_copies_are_refused_before_they_blow_up() {
        let mut v = json!({"a": "x".repeat(1000)});
        // Each copy doubles the document: 2^40 times the start without the bound.
        let ops: Vec<Value> = (0..40)
            .map(|i| json!({"op": "copy", "from": "", "path": format!("/c{i}")}))
            .collect();
        assert_eq!(
            json_patch(&mut v, &Value::Array(ops)),
            Err(PatchError::TooLarge)
        );
    }

    #[test]
    fn strategic_lists_merge_by_key_in_linear_time() {
        let have: Vec<Value> = (0..20_000)
            .map(|i| json!({"name": format!("c{i}"), "v": 0}))
            .collect();
        let mut pod = json!({"spec": {"containers": have}});
        let mut items: Vec<Value> = (0..20_000)
            .map(|i| json!({"name": format!("c{i}"), "v": 1}))
            .collect();
        items.push(json!({"name": "c5", "$patch": "delete"}));
        items.push(json!({"name": "new", "v": 2}));
        let patch = json!({"spec": {"containers": items}});
        assert_eq!(strategic_merge_patch(&mut pod, &patch), Ok(()));
        let list = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert_eq!(list.len(), 20_000);
        assert_eq!(list[0], json!({"name": "c0", "v": 1}));
        assert!(!list.iter().any(|c| c["name"] == "c5"));
        assert_eq!(list.last(), Some(&json!({"name": "new", "v": 2})));
    }
}
