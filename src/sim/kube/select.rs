//! Label and field selectors, as the `labelSelector` / `fieldSelector` query parameters
//! spell them, and the `LabelSelector` object of PDBs and workloads.

use std::collections::BTreeMap;

use serde_json::Value;

use super::store::At;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(pub String);

/// A parsed `labelSelector`: all requirements must hold. Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError(whole.to_string()))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

impl LabelSelector {
    /// The values `label` must take, when a requirement pins it to some (`label=v`,
    /// `label==v`, `label in (v, w)`): every object selected has one of them.
    pub fn values_of(&self, label: &str) -> Option<Vec<&str>> {
        self.0.iter().find_map(|r| match r {
            Requirement::Eq(k, v) if k == label => Some(vec![v.as_str()]),
            Requirement::In(k, vs) if k == label => Some(vs.iter().map(String::as_str).collect()),
            _ => None,
        })
    }

    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let err = || SelectorError(part.clone());
            let req = if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Requirement::NotIn(k.trim().to_string(), parse_set(rest, &part)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Requirement::In(k.trim().to_string(), parse_set(rest, &part)?)
            } else {
                Requirement::Exists(part.trim().to_string())
            };
            let key = match &req {
                Requirement::Eq(k, _)
                | Requirement::NotEq(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(err());
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// The metav1.LabelSelector object form (`matchLabels`, `matchExpressions`).
    /// `None` for a null selector, which selects nothing.
    pub fn from_object(v: &Value) -> Option<Self> {
        if v.is_null() {
            return None;
        }
        let mut reqs = Vec::new();
        if let Some(m) = v.get("matchLabels").and_then(Value::as_object) {
            for (k, val) in m {
                reqs.push(Requirement::Eq(
                    k.clone(),
                    val.as_str().unwrap_or("").to_string(),
                ));
            }
        }
        if let Some(exprs) = v.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default();
                match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                    "In" => reqs.push(Requirement::In(key, values)),
                    "NotIn" => reqs.push(Requirement::NotIn(key, values)),
                    "Exists" => reqs.push(Requirement::Exists(key)),
                    "DoesNotExist" => reqs.push(Requirement::NotExists(key)),
                    _ => return None,
                }
            }
        }
        Some(LabelSelector(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => labels.get(k) == Some(v),
            Requirement::NotEq(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// Match against an object's labels without copying them.
    pub fn matches_object(&self, obj: &Value) -> bool {
        // Every list without a selector asks, once per object.
        if self.0.is_empty() {
            return true;
        }
        let labels = obj.at("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|m| m.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            Requirement::Exists(k) => labels.is_some_and(|m| m.contains_key(k)),
            Requirement::NotExists(k) => !labels.is_some_and(|m| m.contains_key(k)),
        })
    }
}

/// The labels of an object as a map.
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.at("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// A parsed `fieldSelector`: `path=value`, `path==value`, `path!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

/// The fields each core kind with a field label conversion of its own selects on
/// (kubernetes `pkg/apis/core/v1/conversion.go` at v1.33, `addFieldLabelConversionsFor*`).
const CORE_FIELDS: &[(&str, &[&str])] = &[
    ("nodes", &["metadata.name", "spec.unschedulable"]),
    ("namespaces", &["metadata.name", "status.phase"]),
    ("secrets", &["metadata.name", "metadata.namespace", "type"]),
    (
        "pods",
        &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    ),
    (
        "events",
        &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    ),
];

/// The fields a core kind with its own conversion selects on; `None` for the kinds the twin
/// does not hold to a list of their own (they accept any field some kind selects on).
pub fn core_fields(storage: &str) -> Option<&'static [&'static str]> {
    CORE_FIELDS
        .iter()
        .find(|(kind, _)| *kind == storage)
        .map(|(_, fields)| *fields)
}

/// A field some kind selects on.
fn known_field(path: &str) -> bool {
    CORE_FIELDS.iter().any(|(_, fields)| fields.contains(&path))
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, eq, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(SelectorError(part.to_string()));
            };
            let path = path.trim();
            if !known_field(path) {
                return Err(SelectorError(format!("field label not supported: {path}")));
            }
            out.push((path.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// The value `path` must equal, when one term says so (`spec.nodeName=w-1`).
    pub fn equals(&self, path: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(p, eq, _)| *eq && p == path)
            .map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        // Walked in place: a watch tests every event of its resource, a list every object.
        self.0.iter().all(|(path, eq, want)| {
            let found = match path.as_str() {
                // Events' `source` selects on the reporting component.
                "source" => obj.get("source").and_then(|s| s.get("component")),
                p => p.split(['.', '/']).try_fold(obj, |cur, k| match cur {
                    Value::Object(m) => m.get(k),
                    Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get(i)),
                    _ => None,
                }),
            };
            let same = match found {
                Some(Value::String(s)) => s == want,
                Some(Value::Bool(b)) => want == if *b { "true" } else { "false" },
                Some(Value::Number(n)) => n.to_string() == *want,
                // An absent field compares as the empty string (or false for booleans).
                _ if path == "spec.unschedulable" || path == "spec.hostNetwork" => want == "false",
                _ => want.is_empty(),
            };
            same == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selector_operators() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        let ok = |s: &str| LabelSelector::parse(s).map(|sel| sel.matches(&l));
        assert_eq!(ok("app=web"), Ok(true));
        assert_eq!(ok("app==web,tier=front"), Ok(true));
        assert_eq!(ok("app!=web"), Ok(false));
        assert_eq!(ok("app in (web, db)"), Ok(true));
        assert_eq!(ok("app notin (web,db)"), Ok(false));
        assert_eq!(ok("tier,app"), Ok(true));
        assert_eq!(ok("!tier"), Ok(false));
        assert_eq!(ok("missing notin (x)"), Ok(true));
        assert_eq!(ok(""), Ok(true));
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn object_selector_null_selects_nothing_empty_selects_all() {
        assert_eq!(LabelSelector::from_object(&Value::Null), None);
        let all = LabelSelector::from_object(&json!({})).unwrap_or_default();
        assert!(all.matches(&labels(&[("x", "y")])));
        let sel = LabelSelector::from_object(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]
        }));
        assert_eq!(
            sel.map(|s| s.matches(&labels(&[("app", "web"), ("tier", "front")]))),
            Some(true)
        );
    }

    #[test]
    fn field_selector_on_pods() {
        let pod = json!({"metadata": {"name": "a", "namespace": "default"},
                         "spec": {"nodeName": "w1"}, "status": {"phase": "Running"}});
        let m = |s: &str| FieldSelector::parse(s).map(|f| f.matches(&pod));
        assert_eq!(m("spec.nodeName=w1"), Ok(true));
        assert_eq!(m("spec.nodeName=w2"), Ok(false));
        assert_eq!(m("status.phase!=Succeeded,status.phase!=Failed"), Ok(true));
        assert_eq!(m("metadata.namespace==default,metadata.name=a"), Ok(true));
        assert!(FieldSelector::parse("spec.bogus=1").is_err());
    }
}
