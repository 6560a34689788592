//! Who a request is and what it may do, as kube-apiserver decides it with `--authorization-mode=RBAC`:
//!
//! - **Authentication.** The twin's admin token is the cluster admin Talos's kubeconfig
//!   carries (Talos issues it with the `system:masters` organization). A ServiceAccount token
//!   comes from TokenRequest (`POST …/serviceaccounts/NAME/token`, what `kubectl create token`
//!   sends) and authenticates as `system:serviceaccount:NS:NAME` with the groups
//!   `system:serviceaccounts`, `system:serviceaccounts:NS` and `system:authenticated`
//!   (kubernetes/kubernetes `staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go`),
//!   until it expires on the twin's clock. Anything else is 401.
//! - **Authorization.** `system:masters` may do anything (the privileged-group authorizer,
//!   `staging/src/k8s.io/apiserver/pkg/authorization/authorizerfactory/builtin.go`). Everyone
//!   else is judged by RBAC from the Roles, ClusterRoles and bindings the twin holds
//!   (`plugin/pkg/auth/authorizer/rbac/rbac.go`: ClusterRoleBindings, then the RoleBindings
//!   of the request's namespace; `pkg/apis/rbac/v1/evaluation_helpers.go` for how a rule
//!   matches), plus the bootstrap policy every cluster has for authenticated users
//!   (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`: `system:discovery`,
//!   `system:basic-user`, `system:public-info-viewer`). A refusal is the apiserver's 403
//!   (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/writers.go`,
//!   `forbiddenMessage`). All at kubernetes v1.33.
//!
//! Not modelled (assumptions): aggregated ClusterRoles (`aggregationRule`), impersonation,
//! the Node and Webhook authorizers, escalation checks on writes of Roles.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::audit::Entry;
use super::store::{ApiError, Store};
use crate::clock::Timestamp;

/// A request's user, as the authenticator found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    /// The cluster admin of Talos's admin kubeconfig.
    pub fn admin() -> User {
        User {
            name: "admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }

    pub fn service_account(namespace: &str, name: &str) -> User {
        User {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// The ServiceAccount tokens TokenRequest issued, until they expire.
#[derive(Debug, Default)]
pub struct Tokens {
    issued: HashMap<String, (User, Timestamp)>,
}

/// TokenRequest's bounds (`pkg/apis/authentication/validation/validation.go`: at least
/// 10 minutes; the apiserver's default `--service-account-max-token-expiration` is unset,
/// and kubectl asks for 1 hour by default).
const MIN_EXPIRATION: u64 = 600;
const DEFAULT_EXPIRATION: u64 = 3600;
/// Tokens the twin keeps at most; the oldest go first.
const MAX_TOKENS: usize = 10_000;

impl Tokens {
    /// Who `token` is, when it is a live ServiceAccount token.
    pub fn user(&self, token: &str, now: Timestamp) -> Option<User> {
        let (user, expires) = self.issued.get(token)?;
        (now < *expires).then(|| user.clone())
    }

    /// Issue a token for `namespace/name` (which must exist in `store`), answering the
    /// TokenRequest with its status filled in, as the apiserver does (201).
    pub fn request(
        &mut self,
        store: &Store,
        namespace: &str,
        name: &str,
        body: &Value,
        now: Timestamp,
    ) -> Result<Value, ApiError> {
        if store.get("serviceaccounts", namespace, name).is_none() {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("serviceaccounts \"{name}\" not found"),
            ));
        }
        let seconds = body
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_EXPIRATION);
        if seconds < MIN_EXPIRATION {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!("TokenRequest.authentication.k8s.io \"{name}\" is invalid: spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration less than 10 minutes"),
            ));
        }
        // At most a day in the twin: enough for any test, bounded for a hostile client.
        let seconds = seconds.min(86_400);
        let expires = now.plus(Duration::from_secs(seconds));
        let token = hex::encode(rand::random::<[u8; 32]>());
        if self.issued.len() >= MAX_TOKENS {
            self.issued.retain(|_, (_, e)| *e > now);
            if self.issued.len() >= MAX_TOKENS {
                if let Some(oldest) = self
                    .issued
                    .iter()
                    .min_by_key(|(_, (_, e))| *e)
                    .map(|(k, _)| k.clone())
                {
                    self.issued.remove(&oldest);
                }
            }
        }
        self.issued.insert(
            token.clone(),
            (User::service_account(namespace, name), expires),
        );
        let audiences = body
            .pointer("/spec/audiences")
            .cloned()
            .filter(|a| a.as_array().is_some_and(|a| !a.is_empty()))
            .unwrap_or_else(|| json!(["https://kubernetes.default.svc.cluster.local"]));
        Ok(json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
            "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": null},
            "status": {"token": token, "expirationTimestamp": expires.rfc3339()},
        }))
    }
}

/// Whether `user` may make the request `entry`, and if not, the apiserver's 403.
pub fn authorize(store: &Store, user: &User, entry: &Entry) -> Result<(), ApiError> {
    if user.is_master() || bootstrap_allows(entry) || rbac_allows(store, user, entry) {
        return Ok(());
    }
    Err(forbidden(user, entry))
}

/// What every authenticated user may do on any cluster: discovery, the version, health,
/// and asking what it may do (`system:discovery`, `system:public-info-viewer`,
/// `system:basic-user`).
fn bootstrap_allows(entry: &Entry) -> bool {
    if entry.non_resource {
        let path = entry.resource.as_str();
        let discovery = ["/api", "/apis", "/openapi", "/version"]
            .iter()
            .any(|p| path == *p || path.starts_with(&format!("{p}/")));
        let health = ["/healthz", "/livez", "/readyz"]
            .iter()
            .any(|p| path == *p || path.starts_with(&format!("{p}/")));
        return entry.verb == "get" && (discovery || health);
    }
    entry.group == "authorization.k8s.io"
        && entry.verb == "create"
        && matches!(
            entry.resource.as_str(),
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
        )
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A binding's subject names `user` (`pkg/registry/rbac/validation/rule.go`,
/// `appliesToUser`): a User by name, a Group the user is in, a ServiceAccount by namespace
/// and name (the binding's own namespace when the subject names none).
fn applies(subject: &Value, user: &User, binding_ns: &str) -> bool {
    let name = subject.get("name").and_then(Value::as_str).unwrap_or("");
    match subject.get("kind").and_then(Value::as_str) {
        Some("User") => user.name == name,
        Some("Group") => user.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subject
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_ns);
            !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

/// One PolicyRule allows the request (`pkg/apis/rbac/v1/evaluation_helpers.go`).
fn rule_allows(rule: &Value, entry: &Entry) -> bool {
    let has = |key: &str, want: &str| {
        strings(rule.get(key))
            .iter()
            .any(|v| *v == "*" || *v == want)
    };
    if !has("verbs", &entry.verb) {
        return false;
    }
    if entry.non_resource {
        return strings(rule.get("nonResourceURLs")).iter().any(|u| {
            *u == "*"
                || *u == entry.resource
                || u.strip_suffix('*')
                    .is_some_and(|prefix| entry.resource.starts_with(prefix))
        });
    }
    if !has("apiGroups", &entry.group) {
        return false;
    }
    let combined = entry.rbac_resource();
    let resource_ok = strings(rule.get("resources")).iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!entry.subresource.is_empty() && *r == format!("*/{}", entry.subresource))
    });
    if !resource_ok {
        return false;
    }
    let names = strings(rule.get("resourceNames"));
    names.is_empty() || names.iter().any(|n| *n == entry.name)
}

/// The rules of the role a binding refers to: a ClusterRole by name, or a Role in the
/// binding's namespace. A missing role grants nothing.
fn role_rules<'s>(store: &'s Store, binding: &Value, binding_ns: &str) -> Vec<&'s Value> {
    let kind = binding.pointer("/roleRef/kind").and_then(Value::as_str);
    let name = binding
        .pointer("/roleRef/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let role = match kind {
        Some("ClusterRole") => store.get("clusterroles", "", name),
        Some("Role") if !binding_ns.is_empty() => store.get("roles", binding_ns, name),
        _ => None,
    };
    role.and_then(|r| r.get("rules"))
        .and_then(Value::as_array)
        .map(|rules| rules.iter().collect())
        .unwrap_or_default()
}

fn rbac_allows(store: &Store, user: &User, entry: &Entry) -> bool {
    let grants = |binding: &Value, ns: &str| {
        strings_of(binding.get("subjects")).any(|s| applies(s, user, ns))
            && role_rules(store, binding, ns)
                .iter()
                .any(|r| rule_allows(r, entry))
    };
    if store.iter("clusterrolebindings").any(|b| grants(b, "")) {
        return true;
    }
    // A RoleBinding grants only inside its own namespace, and never cluster-scoped or
    // non-resource requests.
    !entry.non_resource
        && !entry.namespace.is_empty()
        && store
            .iter_ns("rolebindings", &entry.namespace)
            .any(|b| grants(b, &entry.namespace))
}

fn strings_of(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}

/// The apiserver's 403: `forbiddenMessage` wrapped by `NewForbidden`, whose message is
/// `RESOURCE[.GROUP] "NAME" is forbidden: …` (no name: `RESOURCE is forbidden: …`).
pub fn forbidden(user: &User, entry: &Entry) -> ApiError {
    if entry.non_resource {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "forbidden: User \"{}\" cannot {} path \"{}\"",
                user.name, entry.verb, entry.resource
            ),
        );
    }
    let resource = entry.rbac_resource();
    let scope = if entry.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", entry.namespace)
    };
    let why = format!(
        "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name, entry.verb, entry.group
    );
    let qualified = if entry.group.is_empty() {
        entry.resource.clone()
    } else {
        format!("{}.{}", entry.resource, entry.group)
    };
    let message = if entry.name.is_empty() {
        format!("{qualified} is forbidden: {why}")
    } else {
        format!("{qualified} \"{}\" is forbidden: {why}", entry.name)
    };
    ApiError::new(403, "Forbidden", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Entry {
        Entry {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            non_resource: false,
        }
    }

    #[test]
    fn a_rule_matches_as_rbac_matches_it() {
        let rule = json!({"apiGroups": ["apps"], "resources": ["daemonsets"],
            "resourceNames": ["kube-proxy"], "verbs": ["get"]});
        assert!(rule_allows(
            &rule,
            &entry("get", "apps", "daemonsets", "", "kube-system", "kube-proxy")
        ));
        assert!(!rule_allows(
            &rule,
            &entry("get", "apps", "daemonsets", "", "kube-system", "cilium")
        ));
        // A list names no object: resourceNames never match it.
        assert!(!rule_allows(
            &rule,
            &entry("list", "apps", "daemonsets", "", "kube-system", "")
        ));
        assert!(!rule_allows(
            &rule,
            &entry("get", "", "daemonsets", "", "kube-system", "kube-proxy")
        ));
        let sub = json!({"apiGroups": [""], "resources": ["*/status"], "verbs": ["*"]});
        assert!(rule_allows(
            &sub,
            &entry("patch", "", "nodes", "status", "", "n")
        ));
        assert!(!rule_allows(
            &sub,
            &entry("patch", "", "nodes", "", "", "n")
        ));
        let evict = json!({"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]});
        assert!(rule_allows(
            &evict,
            &entry("create", "", "pods", "eviction", "a", "p")
        ));
        assert!(!rule_allows(
            &evict,
            &entry("create", "", "pods", "", "a", "")
        ));
        let url = json!({"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]});
        let mut e = entry("get", "", "/metrics", "", "", "");
        e.non_resource = true;
        assert!(rule_allows(&url, &e));
        e.resource = "/logs/x".into();
        assert!(rule_allows(&url, &e));
        e.resource = "/metricsx".into();
        assert!(!rule_allows(&url, &e));
    }

    #[test]
    fn subjects_match_by_kind() {
        let sa = User::service_account("ichor-system", "ichor");
        assert!(applies(
            &json!({"kind": "ServiceAccount", "name": "ichor", "namespace": "ichor-system"}),
            &sa,
            ""
        ));
        assert!(applies(
            &json!({"kind": "ServiceAccount", "name": "ichor"}),
            &sa,
            "ichor-system"
        ));
        assert!(!applies(
            &json!({"kind": "ServiceAccount", "name": "ichor"}),
            &sa,
            ""
        ));
        assert!(applies(
            &json!({"kind": "Group", "name": "system:serviceaccounts:ichor-system"}),
            &sa,
            ""
        ));
        assert!(!applies(&json!({"kind": "User", "name": "ichor"}), &sa, ""));
    }

    #[test]
    fn the_403_is_the_apiservers() {
        let sa = User::service_account("ichor-system", "ichor");
        let e = forbidden(
            &sa,
            &entry("get", "apps", "daemonsets", "", "kube-system", "kube-proxy"),
        );
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "daemonsets.apps \"kube-proxy\" is forbidden: User \"system:serviceaccount:ichor-system:ichor\" cannot get resource \"daemonsets\" in API group \"apps\" in the namespace \"kube-system\""
        );
        let e = forbidden(&sa, &entry("list", "", "nodes", "", "", ""));
        assert_eq!(
            e.message,
            "nodes is forbidden: User \"system:serviceaccount:ichor-system:ichor\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
    }
}
