//! What clients asked the twin's API server, as an authorizer sees each request: verb, API
//! group, resource, subresource, namespace and name, derived from the method and path the
//! way kube-apiserver's request-info resolver does (no lookup in the twin's own resource
//! table, so a request for something the twin does not serve is recorded as asked). Each
//! distinct request is kept once, up to [`MAX_ENTRIES`], so a test can hold a client's
//! real traffic against the RBAC it is deployed with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use axum::http::{Method, Uri};

/// Distinct entries kept; later new ones are counted in [`Audit::dropped`] instead.
pub const MAX_ENTRIES: usize = 4096;

/// One request's authorization attributes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`;
    /// for a non-resource request the lower-case method.
    pub verb: String,
    /// `""` for the core group and for non-resource requests.
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// A non-resource request (`/metrics`, discovery): `resource` is then the path.
    pub non_resource: bool,
}

impl Entry {
    /// `resource/subresource`, as RBAC rules name it.
    pub fn rbac_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

#[derive(Debug, Default)]
pub struct Audit {
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    entries: BTreeSet<Entry>,
    dropped: u64,
    /// Requests per (verb, `resource[/subresource]`): a handful of keys, however many
    /// requests.
    counts: BTreeMap<(String, String), u64>,
}

impl Audit {
    pub fn record(&self, method: &Method, uri: &Uri) {
        let entry = attributes(method, uri.path(), uri.query().unwrap_or(""));
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        *seen
            .counts
            .entry((entry.verb.clone(), entry.rbac_resource()))
            .or_default() += 1;
        if seen.entries.len() < MAX_ENTRIES {
            seen.entries.insert(entry);
        } else if !seen.entries.contains(&entry) {
            seen.dropped += 1;
        }
    }

    /// How many requests of each verb and resource arrived (`("list", "pods")`), every one
    /// counted: what a client costs the API server.
    pub fn counts(&self) -> BTreeMap<(String, String), u64> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .counts
            .clone()
    }

    /// Every distinct request so far, sorted.
    pub fn entries(&self) -> Vec<Entry> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.entries.iter().cloned().collect()
    }

    /// Distinct requests not kept because the list was full.
    pub fn dropped(&self) -> u64 {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).dropped
    }

    pub fn clear(&self) {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
    }
}

/// The attributes of `method path?query`: `/api/v1/…` and `/apis/GROUP/VERSION/…` with a
/// resource after the version are resource requests, everything else (discovery,
/// `/metrics`, `/version`) a non-resource one. `namespaces/NS/RESOURCE…` scopes the
/// request to NS; `namespaces/NAME[/status|/finalize]` is the namespace itself.
pub fn attributes(method: &Method, path: &str, query: &str) -> Entry {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
        _ => {
            return Entry {
                verb: method.as_str().to_ascii_lowercase(),
                group: String::new(),
                resource: path.to_string(),
                subresource: String::new(),
                namespace: String::new(),
                name: String::new(),
                non_resource: true,
            }
        }
    };
    // The legacy `/watch/` path prefix.
    let (legacy_watch, rest) = match rest {
        ["watch", more @ ..] if !more.is_empty() => (true, more),
        _ => (false, rest),
    };
    let mut namespace = "";
    let mut rest = rest;
    if let ["namespaces", ns, more @ ..] = rest {
        namespace = ns;
        if !more.is_empty() && !matches!(more[0], "status" | "finalize") {
            rest = more;
        }
    }
    let resource = rest.first().copied().unwrap_or("");
    let name = rest.get(1).copied().unwrap_or("");
    let subresource = rest.get(2).copied().unwrap_or("");
    let watch = legacy_watch
        || query
            .split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"));
    let verb = match *method {
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD if name.is_empty() => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if name.is_empty() => "deletecollection",
        Method::DELETE => "delete",
        _ => "",
    };
    let verb = if verb.is_empty() {
        method.as_str().to_ascii_lowercase()
    } else {
        verb.to_string()
    };
    Entry {
        verb,
        group: group.to_string(),
        resource: resource.to_string(),
        subresource: subresource.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        non_resource: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(method: Method, path: &str, query: &str) -> (String, String, String, String, String) {
        let e = attributes(&method, path, query);
        let resource = e.rbac_resource();
        (e.verb, e.group, resource, e.namespace, e.name)
    }

    fn t(v: &str, g: &str, r: &str, ns: &str, n: &str) -> (String, String, String, String, String) {
        (v.into(), g.into(), r.into(), ns.into(), n.into())
    }

    #[test]
    fn requests_resolve_as_the_apiserver_resolves_them() {
        assert_eq!(
            at(Method::GET, "/api/v1/nodes", ""),
            t("list", "", "nodes", "", "")
        );
        assert_eq!(
            at(Method::GET, "/api/v1/nodes/w-1", ""),
            t("get", "", "nodes", "", "w-1")
        );
        assert_eq!(
            at(Method::PATCH, "/api/v1/nodes/w-1", ""),
            t("patch", "", "nodes", "", "w-1")
        );
        assert_eq!(
            at(
                Method::POST,
                "/api/v1/namespaces/default/pods/web-0/eviction",
                ""
            ),
            t("create", "", "pods/eviction", "default", "web-0")
        );
        assert_eq!(
            at(
                Method::GET,
                "/apis/apps/v1/namespaces/kube-system/daemonsets/cilium",
                ""
            ),
            t("get", "apps", "daemonsets", "kube-system", "cilium")
        );
        assert_eq!(
            at(
                Method::GET,
                "/apis/apps/v1/daemonsets",
                "watch=true&resourceVersion=1"
            ),
            t("watch", "apps", "daemonsets", "", "")
        );
        assert_eq!(
            at(Method::GET, "/api/v1/watch/namespaces/default/pods", ""),
            t("watch", "", "pods", "default", "")
        );
        // The namespace itself, and its status subresource.
        assert_eq!(
            at(Method::GET, "/api/v1/namespaces/ichor-system", ""),
            t("get", "", "namespaces", "ichor-system", "ichor-system")
        );
        assert_eq!(
            at(Method::PUT, "/api/v1/namespaces/x/status", ""),
            t("update", "", "namespaces/status", "x", "x")
        );
        assert_eq!(
            at(Method::POST, "/api/v1/namespaces", ""),
            t("create", "", "namespaces", "", "")
        );
        assert_eq!(
            at(Method::DELETE, "/api/v1/namespaces/d/pods", ""),
            t("deletecollection", "", "pods", "d", "")
        );
        let m = attributes(&Method::GET, "/metrics", "");
        assert!(
            m.non_resource && m.verb == "get" && m.resource == "/metrics",
            "{m:?}"
        );
        for discovery in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
        ] {
            assert!(
                attributes(&Method::GET, discovery, "").non_resource,
                "{discovery}"
            );
        }
    }

    #[test]
    fn the_audit_keeps_each_request_once_and_stays_bounded() {
        let audit = Audit::default();
        let uri: Uri = "/api/v1/nodes".parse().unwrap();
        audit.record(&Method::GET, &uri);
        audit.record(&Method::GET, &uri);
        assert_eq!(audit.entries().len(), 1);
        for i in 0..MAX_ENTRIES + 10 {
            let uri: Uri = format!("/api/v1/nodes/n-{i}").parse().unwrap();
            audit.record(&Method::GET, &uri);
        }
        assert_eq!(audit.entries().len(), MAX_ENTRIES);
        assert_eq!(audit.dropped(), 11);
        audit.clear();
        assert!(audit.entries().is_empty());
    }
}
