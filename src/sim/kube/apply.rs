//! Server-side apply field ownership: each manager's fields live in `managedFields`
//! (FieldsV1: `{"f:data": {"f:a": {}}}`). Applying a value another manager owns is a conflict
//! unless forced; fields a manager stops applying are removed when nobody else owns them.
//! Lists are owned whole (the apiserver tracks list items by key; the twin does not).
//!
//! A manager is its name *and* its operation, as upstream keys them (kubernetes/kubernetes@
//! master:staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/managedfields.go
//! `BuildManagerIdentifier`): `talos`/Apply conflicts with `talos`/Update (how Talos's
//! bootstrap creates its objects) like with any other manager.

use serde_json::{json, Map, Value};

use super::patch::strategic_merge_patch;
use super::store::{set_path, At};
use crate::clock::Timestamp;

type Path = Vec<String>;

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    /// `Update` or `Apply`: upstream names an Update manager with its apiVersion and time.
    pub operation: String,
    pub time: String,
    pub api_version: String,
    /// `.data.a`
    pub field: String,
}

/// Identity and server-set fields nobody owns.
fn unowned(path: &[String]) -> bool {
    match path {
        [one] => one == "apiVersion" || one == "kind",
        [m, f] if m == "metadata" => matches!(
            f.as_str(),
            "name"
                | "namespace"
                | "uid"
                | "resourceVersion"
                | "generation"
                | "creationTimestamp"
                | "managedFields"
        ),
        _ => false,
    }
}

/// The leaf paths of an object: scalars, lists and empty objects.
pub fn leaves(v: &Value) -> Vec<Path> {
    fn walk(v: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    prefix.push(k.clone());
                    if !unowned(prefix) {
                        walk(child, prefix, out);
                    }
                    prefix.pop();
                }
            }
            _ if !prefix.is_empty() => out.push(prefix.clone()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// Paths → FieldsV1.
pub fn fields_v1(paths: &[Path]) -> Value {
    let mut root = Map::new();
    for p in paths {
        let mut node = &mut root;
        for k in p {
            let entry = node.entry(format!("f:{k}")).or_insert_with(|| json!({}));
            let Value::Object(next) = entry else { break };
            node = next;
        }
    }
    Value::Object(root)
}

/// FieldsV1 → paths (the leaves of the `f:` tree).
pub fn paths_of(fields: &Value) -> Vec<Path> {
    fn walk(v: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
        let Some(m) = v.as_object() else { return };
        let keys: Vec<(&String, &Value)> = m.iter().filter(|(k, _)| k.starts_with("f:")).collect();
        if keys.is_empty() {
            if !prefix.is_empty() {
                out.push(prefix.clone());
            }
            return;
        }
        for (k, child) in keys {
            prefix.push(k[2..].to_string());
            walk(child, prefix, out);
            prefix.pop();
        }
    }
    let mut out = Vec::new();
    walk(fields, &mut Vec::new(), &mut out);
    out
}

fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for k in parents {
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

fn dotted(path: &[String]) -> String {
    path.iter().map(|k| format!(".{k}")).collect()
}

fn entries_of(obj: Option<&Value>) -> Vec<Value> {
    obj.and_then(|o| o.at("/metadata/managedFields"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn manager_of(e: &Value) -> &str {
    e.get("manager").and_then(Value::as_str).unwrap_or("")
}

fn operation_of(e: &Value) -> &str {
    e.get("operation").and_then(Value::as_str).unwrap_or("")
}

fn entry(
    manager: &str,
    operation: &str,
    api_version: &str,
    paths: &[Path],
    now: Timestamp,
) -> Value {
    json!({"manager": manager, "operation": operation, "apiVersion": api_version,
           "time": now.rfc3339(), "fieldsType": "FieldsV1", "fieldsV1": fields_v1(paths)})
}

/// Apply `config` as `manager` onto `current` (None: create). Returns the new object with
/// its managedFields, or the conflicts when not forced.
pub fn apply(
    current: Option<&Value>,
    config: &Value,
    manager: &str,
    api_version: &str,
    force: bool,
    now: Timestamp,
) -> Result<Value, Vec<Conflict>> {
    let entries = entries_of(current);
    let applied = leaves(config);
    let empty = json!({});
    let cur = current.unwrap_or(&empty);
    let mut conflicts = Vec::new();
    let own = |e: &Value| manager_of(e) == manager && operation_of(e) == "Apply";
    for e in entries.iter().filter(|e| !own(e)) {
        let owned = paths_of(e.get("fieldsV1").unwrap_or(&Value::Null));
        for p in applied.iter().filter(|p| owned.contains(p)) {
            if value_at(cur, p) != value_at(config, p) {
                conflicts.push(Conflict {
                    manager: manager_of(e).to_string(),
                    operation: operation_of(e).to_string(),
                    time: e
                        .get("time")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    api_version: e
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    field: dotted(p),
                });
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    let mut obj = cur.clone();
    // Fields this manager applied before and no longer does, owned by nobody else, go.
    let before: Vec<Path> = entries
        .iter()
        .find(|e| manager_of(e) == manager && operation_of(e) == "Apply")
        .map(|e| paths_of(e.get("fieldsV1").unwrap_or(&Value::Null)))
        .unwrap_or_default();
    let others: Vec<Path> = entries
        .iter()
        .filter(|e| !own(e))
        .flat_map(|e| paths_of(e.get("fieldsV1").unwrap_or(&Value::Null)))
        .collect();
    for p in before
        .iter()
        .filter(|p| !applied.contains(p) && !others.contains(p))
    {
        remove_at(&mut obj, p);
    }
    // Apply never deletes by null; the patch directives do not apply either.
    let _ = strategic_merge_patch(&mut obj, config);
    let taken: Vec<Path> = conflicts
        .iter()
        .filter_map(|c| applied.iter().find(|p| dotted(p) == c.field).cloned())
        .collect();
    let mut out: Vec<Value> = Vec::new();
    let mut placed = false;
    for e in entries {
        if own(&e) {
            out.push(entry(manager, "Apply", api_version, &applied, now));
            placed = true;
            continue;
        }
        // Forced: the conflicting fields move to this manager.
        let mut paths = paths_of(e.get("fieldsV1").unwrap_or(&Value::Null));
        paths.retain(|p| !taken.contains(p));
        if !paths.is_empty() {
            let mut e = e.clone();
            e["fieldsV1"] = fields_v1(&paths);
            out.push(e);
        }
    }
    if !placed {
        out.push(entry(manager, "Apply", api_version, &applied, now));
    }
    set_path(&mut obj, &["metadata", "managedFields"], Value::Array(out));
    Ok(obj)
}

/// Record an ordinary write (PUT/PATCH/POST) by `manager`: the fields it changed become its
/// own (an `Update` entry) and leave the other managers.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    now: Timestamp,
) {
    let empty = json!({});
    let before = old.unwrap_or(&empty);
    let changed: Vec<Path> = leaves(new)
        .into_iter()
        .filter(|p| p.first().is_none_or(|k| k != "status"))
        .filter(|p| value_at(before, p) != value_at(new, p))
        .collect();
    // A field the write removed leaves every manager's set, as upstream's field manager
    // drops paths no longer in the object.
    let removed: Vec<Path> = leaves(before)
        .into_iter()
        .filter(|p| value_at(new, p).is_none())
        .collect();
    if changed.is_empty() && removed.is_empty() {
        return;
    }
    let mut out: Vec<Value> = Vec::new();
    let mut mine: Vec<Path> = Vec::new();
    for e in entries_of(old) {
        let mut paths = paths_of(e.get("fieldsV1").unwrap_or(&Value::Null));
        paths.retain(|p| !removed.contains(p));
        if manager_of(&e) == manager && operation_of(&e) == "Update" {
            mine = paths;
            continue;
        }
        paths.retain(|p| !changed.contains(p));
        if !paths.is_empty() {
            let mut e = e.clone();
            e["fieldsV1"] = fields_v1(&paths);
            out.push(e);
        }
    }
    for p in changed {
        if !mine.contains(&p) {
            mine.push(p);
        }
    }
    if !mine.is_empty() {
        out.push(entry(manager, "Update", api_version, &mine, now));
    }
    set_path(new, &["metadata", "managedFields"], Value::Array(out));
}

/// How upstream names a conflicting manager: an Update manager with its apiVersion and
/// time, an Apply manager by name (kubernetes/kubernetes@master:staging/src/k8s.io/
/// apimachinery/pkg/util/managedfields/internal/conflict.go `printManager`).
pub fn manager_text(c: &Conflict) -> String {
    match (c.operation.as_str(), c.time.is_empty()) {
        ("Update", true) => format!("\"{}\" using {}", c.manager, c.api_version),
        ("Update", false) => format!("\"{}\" using {} at {}", c.manager, c.api_version, c.time),
        _ => format!("\"{}\"", c.manager),
    }
}

/// The apiserver's conflict message (same file, `ConflictMessage`): one conflict on a
/// line, several grouped by manager.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [one] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            manager_text(one),
            one.field
        );
    }
    let mut by: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for c in conflicts {
        by.entry(manager_text(c)).or_default().push(&c.field);
    }
    let mut lines = Vec::new();
    for (m, fields) in by {
        lines.push(format!("conflicts with {m}:"));
        lines.extend(fields.iter().map(|f| format!("- {f}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let paths = leaves(
            &json!({"apiVersion": "v1", "metadata": {"name": "x", "labels": {"a": "1"}}, "data": {"k": "v"}}),
        );
        assert_eq!(
            paths,
            vec![
                vec!["data".to_string(), "k".into()],
                vec!["metadata".into(), "labels".into(), "a".into()]
            ]
        );
        let f = fields_v1(&paths);
        assert_eq!(
            f,
            json!({"f:data": {"f:k": {}}, "f:metadata": {"f:labels": {"f:a": {}}}})
        );
        assert_eq!(paths_of(&f), paths);
    }

    #[test]
    fn conflicts_unless_forced_and_drops_fields_no_longer_applied() {
        let now = Timestamp(0);
        let a = apply(
            None,
            &json!({"data": {"x": "1", "y": "1"}}),
            "a",
            "v1",
            false,
            now,
        )
        .unwrap_or_default();
        // Same value: shared, no conflict.
        assert!(apply(
            Some(&a),
            &json!({"data": {"x": "1"}}),
            "b",
            "v1",
            false,
            now
        )
        .is_ok());
        let err = apply(
            Some(&a),
            &json!({"data": {"x": "2"}}),
            "b",
            "v1",
            false,
            now,
        )
        .err()
        .unwrap_or_default();
        assert_eq!(
            conflict_message(&err),
            "Apply failed with 1 conflict: conflict with \"a\": .data.x"
        );
        // The same name by another operation is another manager.
        let mut created = json!({"data": {"x": "1"}});
        record_update(None, &mut created, "a", "v1", now);
        let err = apply(
            Some(&created),
            &json!({"data": {"x": "2"}}),
            "a",
            "v1",
            false,
            now,
        )
        .err()
        .unwrap_or_default();
        assert_eq!(
            conflict_message(&err),
            format!(
                "Apply failed with 1 conflict: conflict with \"a\" using v1 at {}: .data.x",
                now.rfc3339()
            )
        );
        let forced =
            apply(Some(&a), &json!({"data": {"x": "2"}}), "b", "v1", true, now).unwrap_or_default();
        assert_eq!(forced["data"], json!({"x": "2", "y": "1"}));
        // a re-applies without y: y goes (nobody else owns it); x now belongs to b only.
        let again =
            apply(Some(&forced), &json!({"data": {}}), "a", "v1", false, now).unwrap_or_default();
        assert_eq!(again["data"], json!({"x": "2"}));
    }
}
