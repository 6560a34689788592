//! The REST surface: discovery, CRUD, watch, the three patch formats plus server-side
//! apply, Tables, pods/eviction, /metrics, and the twin's own fault endpoint, over HTTPS
//! with a bearer token.

use std::convert::Infallible;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, Response, StatusCode, Uri};
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tokio_rustls::{rustls, TlsAcceptor};

use crate::sim::faults::{FaultHook, FaultTargets, FaultsConfig, Origin};
use crate::sim::net::{self, NetLimits};

use super::model::Cluster;
use super::patch::{json_patch, merge_patch, strategic_merge_patch};
use super::rbac::{self, User};
use super::resources::{groups, lookup, ResourceType, RESOURCES};
use super::select::{FieldSelector, LabelSelector};
use super::store::{name_of, namespace_of, rv_of, set_path, ApiError, At, EventType};
use super::table::table;
use crate::clock::Clock;

/// State shared by every request.
pub struct Shared {
    pub cluster: Mutex<Cluster>,
    pub clock: Clock,
    pub token: String,
    /// `127.0.0.1:PORT`, for `/api`'s serverAddressByClientCIDRs.
    pub server_address: String,
    pub kubernetes_version: String,
    /// The Talos and GitHub sides of `POST /_twin/faults`, when a whole twin runs.
    pub fault_hook: Mutex<Option<Arc<dyn FaultHook>>>,
    /// Wakes the driver after a change made outside a request (library calls, faults).
    pub poke: Notify,
    /// How often the driver woke up (an idle twin must not).
    pub driver_wakeups: AtomicU64,
    /// Each request's authorization attributes (verb, group, resource, …).
    pub audit: super::audit::Audit,
    /// ServiceAccount tokens issued by TokenRequest (the admin token is `token`).
    pub tokens: Mutex<super::rbac::Tokens>,
    /// The gauges tests set through `POST /_twin/gauges` (served at `/_twin/metrics`).
    pub gauges: Mutex<std::collections::BTreeMap<String, f64>>,
    /// TCP connections accepted so far.
    pub connections: Arc<AtomicU64>,
}

/// The apiserver's request body limit (kube-apiserver `--max-request-body-bytes`'s 3 MiB
/// default); larger bodies get 413 RequestEntityTooLarge.
pub const MAX_BODY: usize = 3 << 20;

impl Shared {
    /// The cluster, synced to the clock.
    pub fn lock(&self) -> MutexGuard<'_, Cluster> {
        // A poisoned lock means a panic in a handler; the model is still usable.
        let mut c = self.cluster.lock().unwrap_or_else(|e| e.into_inner());
        c.sync(self.clock.now());
        c
    }
}

/// The cluster locked for a write; `dryRun=All` writes are answered but not stored.
pub struct Write<'a>(MutexGuard<'a, Cluster>);

impl std::ops::Deref for Write<'_> {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.0
    }
}

impl std::ops::DerefMut for Write<'_> {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.0
    }
}

impl Drop for Write<'_> {
    fn drop(&mut self) {
        self.0.store.dry_run = false;
    }
}

impl Shared {
    fn lock_write(&self, q: &Query) -> Write<'_> {
        let mut c = self.lock();
        c.store.dry_run = q.get("dryRun") == Some("All");
        Write(c)
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// Accept TLS connections and serve HTTP/1.1 and HTTP/2 on each, within `limits`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    limits: NetLimits,
    accepted: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
) {
    net::serve_http(
        listener,
        Some(TlsAcceptor::from(tls)),
        app,
        limits,
        accepted,
        stop,
    )
    .await
}

fn respond(code: u16, content_type: &str, body: impl Into<Body>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, content_type)
        .body(body.into())
        .unwrap_or_default()
}

fn ok_json(code: u16, v: &Value) -> Response<Body> {
    respond(code, "application/json", v.to_string())
}

fn err(e: &ApiError) -> Response<Body> {
    ok_json(e.code, &e.status())
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
                {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Query parameters, decoded.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(uri: &Uri) -> Self {
        Query(
            uri.query()
                .unwrap_or("")
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (percent_decode(k), percent_decode(v)),
                    None => (percent_decode(p), String::new()),
                })
                .collect(),
        )
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

/// Constant-time comparison, so the token cannot be guessed byte by byte from timing.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Every answer carries the twin's time in `Date`, the clock its objects' times come from
/// (hyper would put the wall clock there).
async fn handle(
    State(sh): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response<Body> {
    // Working on a request: a simulation driver holds time still until it is answered
    // (a watch is answered once its stream opens).
    let _busy = sh.clock.busy();
    let mut resp = answer(sh.clone(), method, uri, headers, body).await;
    if let Ok(v) = header::HeaderValue::from_str(&http_date(sh.clock.now())) {
        resp.headers_mut().insert(header::DATE, v);
    }
    resp
}

/// RFC 9110's IMF-fixdate, e.g. `Thu, 01 Jan 2026 00:00:00 GMT`.
fn http_date(t: crate::clock::Timestamp) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    // `2026-01-01T00:00:00Z`: reuse the clock's calendar arithmetic.
    let iso = t.rfc3339();
    let (date, time) = iso.split_once('T').unwrap_or((&iso, "00:00:00Z"));
    let mut ymd = date.splitn(3, '-');
    let (y, m, d) = (
        ymd.next().unwrap_or(""),
        ymd.next().unwrap_or(""),
        ymd.next().unwrap_or(""),
    );
    let month = m
        .parse::<usize>()
        .ok()
        .and_then(|m| MONTHS.get(m.wrapping_sub(1)))
        .unwrap_or(&"Jan");
    let days = t.as_millis() / 1000 / 86_400;
    let weekday = DAYS[(days % 7) as usize];
    format!(
        "{weekday}, {d} {month} {y} {} GMT",
        time.trim_end_matches('Z')
    )
}

async fn answer(
    sh: Arc<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response<Body> {
    let path = uri.path().trim_matches('/').to_string();
    let segs: Vec<&str> = if path.is_empty() {
        Vec::new()
    } else {
        path.split('/').collect()
    };
    // With no kube-apiserver running there is nobody to answer: a load balancer in front of
    // the control planes says 503 (the twin's own `/_twin` endpoints stay up).
    if segs.first() != Some(&"_twin") && sh.lock().apiserver_down {
        return respond(
            503,
            "text/plain; charset=utf-8",
            "no kube-apiserver is running (every control plane is down or restarting it)\n",
        );
    }
    let public = matches!(
        segs.as_slice(),
        ["version"] | ["healthz"] | ["livez"] | ["readyz"]
    );
    // Authentication, then API Priority and Fairness, then authorization: the order of
    // kube-apiserver's handler chain (staging/src/k8s.io/apiserver/pkg/server/config.go,
    // DefaultBuildHandlerChain).
    let mut user = None;
    if !public {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let who = if same(presented.as_bytes(), sh.token.as_bytes()) {
            Some(User::admin())
        } else {
            sh.tokens
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .user(presented, sh.clock.now())
        };
        let Some(who) = who else {
            return err(&ApiError::new(401, "Unauthorized", "Unauthorized"));
        };
        if matches!(segs.first(), Some(&"api" | &"apis")) {
            let burst = sh.lock().take_burst();
            if let Some((code, retry)) = burst {
                return injected(code, retry);
            }
            if segs.contains(&"leases") && sh.lock().faults.leases_unreachable {
                return injected(503, 1);
            }
        }
        user = Some(who);
    }
    if let Some(who) = &user {
        let entry = super::audit::attributes(&method, uri.path(), uri.query().unwrap_or(""));
        if let Err(refused) = rbac::authorize(&sh.lock().store, who, &entry) {
            sh.audit.record(&method, &uri);
            return err(&refused);
        }
    }
    sh.audit.record(&method, &uri);
    // Read only once the caller is known, and never more than the apiserver would.
    let body = match net::read_body(body, MAX_BODY).await {
        Ok(b) => b,
        Err(net::BodyError::TooLarge { limit }) => {
            return err(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("Request entity too large: limit is {limit}"),
            ))
        }
        Err(e @ net::BodyError::Timeout(_)) => {
            return err(&ApiError::new(408, "Timeout", e.to_string()))
        }
        Err(e) => return err(&ApiError::bad_request(e.to_string())),
    };
    let q = Query::parse(&uri);
    match segs.as_slice() {
        ["version"] => ok_json(200, &version(&sh.kubernetes_version)),
        ["healthz"] | ["livez"] | ["readyz"] => respond(200, "text/plain", "ok"),
        ["metrics"] => metrics(&sh),
        ["api"] => ok_json(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": sh.server_address}]}),
        ),
        ["apis"] => ok_json(200, &group_list()),
        ["api", "v1"] => ok_json(200, &resource_list("", "v1")),
        ["apis", g] => match groups().into_iter().find(|(name, _)| name == g) {
            Some((g, v)) => ok_json(200, &group(g, v)),
            None => err(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )),
        },
        ["apis", g, v] if groups().contains(&(*g, *v)) => ok_json(200, &resource_list(g, v)),
        ["api", "v1", rest @ ..] => {
            resource(
                &sh,
                "",
                "v1",
                rest,
                &method,
                &q,
                &headers,
                &body,
                user.as_ref(),
            )
            .await
        }
        ["apis", g, v, rest @ ..] => {
            resource(&sh, g, v, rest, &method, &q, &headers, &body, user.as_ref()).await
        }
        ["_twin", "faults"] if method == Method::POST => faults(&sh, &headers, &body),
        ["_twin", "metrics"] if method == Method::GET => {
            let gauges = sh.gauges.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let text = super::metrics::exposition(&sh.lock(), &gauges);
            respond(200, "text/plain; version=0.0.4; charset=utf-8", text)
        }
        ["_twin", "gauges"] if method == Method::POST => {
            let r = super::metrics::set(
                &mut sh.gauges.lock().unwrap_or_else(|e| e.into_inner()),
                &body,
            );
            match r {
                Ok(()) => ok_json(200, &json!({"ok": true})),
                Err(why) => err(&ApiError::bad_request(why)),
            }
        }
        ["openapi", "v3"] => ok_json(200, &openapi_index()),
        ["openapi", "v3", "api", "v1"] => ok_json(200, &openapi_group_version("", "v1")),
        ["openapi", "v3", "apis", g, v] if groups().contains(&(*g, *v)) => {
            ok_json(200, &openapi_group_version(g, v))
        }
        _ => err(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

fn injected(code: u16, retry_after: u64) -> Response<Body> {
    if code == 429 {
        let e = ApiError {
            details: Some(json!({"retryAfterSeconds": retry_after})),
            ..ApiError::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
        };
        let mut r = err(&e);
        if let Ok(v) = header::HeaderValue::from_str(&retry_after.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    } else {
        err(&ApiError::new(
            code,
            "InternalError",
            "Internal error occurred: injected fault",
        ))
    }
}

fn version(k8s: &str) -> Value {
    let trimmed = k8s.trim_start_matches('v');
    let mut parts = trimmed.split('.');
    let major = parts.next().unwrap_or("1");
    let minor = parts.next().unwrap_or("0");
    json!({"major": major, "minor": minor, "gitVersion": format!("v{trimmed}"),
           "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
           "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.6", "compiler": "gc",
           "platform": "linux/amd64"})
}

fn group(g: &str, v: &str) -> Value {
    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": [gv], "preferredVersion": gv})
}

fn group_list() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|(g, v)| {
            let mut x = group(g, v);
            if let Some(m) = x.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            x
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(g: &str, v: &str) -> Value {
    let mut out = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == g && r.version == v) {
        let mut verbs = vec![
            "create", "delete", "get", "list", "patch", "update", "watch",
        ];
        if r.plural == "events" {
            verbs.retain(|v| *v != "update");
        }
        if r.plural == "selfsubjectaccessreviews" {
            verbs = vec!["create"];
        }
        let mut entry = json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                               "kind": r.kind, "verbs": verbs});
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if matches!(
            r.plural,
            "pods" | "deployments" | "replicasets" | "statefulsets" | "daemonsets"
        ) {
            entry["categories"] = json!(["all"]);
        }
        out.push(entry);
        for sub in r.subresources {
            let mut e = json!({"name": format!("{}/{}", r.plural, sub), "singularName": "",
                               "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]});
            match *sub {
                "eviction" => {
                    e = json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
                               "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]});
                }
                "log" => {
                    e = json!({"name": "pods/log", "singularName": "", "namespaced": true,
                               "kind": "Pod", "verbs": ["get"]});
                }
                "scale" => {
                    e = json!({"name": format!("{}/scale", r.plural), "singularName": "", "namespaced": true,
                               "group": "autoscaling", "version": "v1", "kind": "Scale",
                               "verbs": ["get", "patch", "update"]});
                }
                _ => {}
            }
            out.push(e);
        }
    }
    let gv = if g.is_empty() {
        v.to_string()
    } else {
        format!("{g}/{v}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out})
}

fn metrics(sh: &Shared) -> Response<Body> {
    let c = sh.lock();
    let mut out = String::from(
        "# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs that have been requested, broken out by API group, version, resource, subresource, and removed_release.\n# TYPE apiserver_requested_deprecated_apis gauge\n",
    );
    for d in &c.deprecated_apis {
        out.push_str(&format!(
            "apiserver_requested_deprecated_apis{{group=\"{}\",removed_release=\"{}\",resource=\"{}\",subresource=\"{}\",version=\"{}\"}} 1\n",
            d.group, d.removed_release, d.resource, d.subresource, d.version
        ));
    }
    respond(200, "text/plain; version=0.0.4; charset=utf-8", out)
}

/// `/openapi/v3`: one document per group version. kubectl reads them only to learn that
/// PATCH takes `fieldValidation` (then it leaves validation to the server, which the twin
/// does not do); schemas are not served.
fn openapi_index() -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs = vec![("", "v1")];
    gvs.extend(groups());
    for (g, v) in gvs {
        let key = if g.is_empty() {
            "api/v1".to_string()
        } else {
            format!("apis/{g}/{v}")
        };
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=1c4d")}),
        );
    }
    json!({"paths": paths})
}

fn openapi_group_version(g: &str, v: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES.iter().filter(|r| r.group == g && r.version == v) {
        let base = if g.is_empty() {
            format!("/api/{v}")
        } else {
            format!("/apis/{g}/{v}")
        };
        let path = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{base}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": g, "version": v, "kind": r.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}},
        ]);
        let op = |verb: &str| {
            json!({"operationId": format!("{verb}{}", r.kind), "x-kubernetes-action": verb,
                                    "x-kubernetes-group-version-kind": gvk, "parameters": params,
                                    "responses": {"200": {"description": "OK"}}})
        };
        paths.insert(path, json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
    }
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "ichor-twin"},
           "paths": paths, "components": {"schemas": {}}})
}

fn parse_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ct.contains("yaml") {
        // Aliases are bounded before anything is built (a few KB must not become GBs).
        crate::sim::yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding JSON: {e}")))
    }
}

/// A request body that must be a JSON (or YAML) object.
fn parse_object(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    let v = parse_body(headers, body)?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the request body is not an object"));
    }
    Ok(v)
}

fn strip_rv(obj: &mut Value) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
}

#[allow(clippy::too_many_arguments)]
async fn resource(
    sh: &Arc<Shared>,
    g: &str,
    v: &str,
    rest: &[&str],
    method: &Method,
    q: &Query,
    headers: &HeaderMap,
    body: &Bytes,
    user: Option<&User>,
) -> Response<Body> {
    let not_found = || {
        err(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ))
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, more @ ..]
            if lookup(g, v, plural).is_some_and(|r| r.namespaced) =>
        {
            (
                Some(*ns),
                std::iter::once(*plural)
                    .chain(more.iter().copied())
                    .collect::<Vec<_>>(),
            )
        }
        _ => (None, rest.to_vec()),
    };
    let Some(plural) = rest.first() else {
        return not_found();
    };
    let Some(rt) = lookup(g, v, plural) else {
        return not_found();
    };
    let name = rest.get(1).copied();
    let sub = rest.get(2).copied();
    if rest.len() > 3 || (rt.namespaced && name.is_some() && ns.is_none()) {
        return not_found();
    }
    if let Some(s) = sub {
        if !rt.subresources.contains(&s) {
            return not_found();
        }
    }
    let ns_str = ns.unwrap_or("");
    let result = match (method.clone(), name, sub) {
        (Method::POST, None, None) if rt.plural == "selfsubjectaccessreviews" => {
            access_review(sh, body, user)
        }
        (Method::POST, Some(n), Some("token")) => match match body.strip_prefix(b"k8s\0") {
            // kubectl sends built-in types as protobuf.
            Some(envelope) => token_request_from_protobuf(envelope).ok_or_else(|| {
                ApiError::bad_request("the protobuf TokenRequest could not be decoded")
            }),
            None => parse_body(headers, body),
        } {
            Ok(request) => {
                let c = sh.lock();
                let now = sh.clock.now();
                sh.tokens
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .request(&c.store, ns_str, n, &request, now)
                    .map(|t| (201, t))
            }
            Err(e) => Err(e),
        },
        (_, _, _) if rt.plural == "selfsubjectaccessreviews" => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource (selfsubjectaccessreviews)",
        )),
        (Method::GET, None, None) => {
            if q.flag("watch") {
                return watch(sh, rt, ns, q, Render::from(headers));
            }
            return list(sh, rt, ns, q, headers).unwrap_or_else(|e| err(&e));
        }
        (Method::POST, None, None) => create(sh, rt, ns_str, q, headers, body),
        (Method::GET, Some(n), Some("log")) => {
            return match sh.lock().store.get(rt.storage, ns_str, n) {
                // The twin runs no containers: a short, honest log.
                Some(_) => respond(
                    200,
                    "text/plain",
                    format!("ichor twin: pod {ns_str}/{n} runs no real containers\n"),
                ),
                None => err(&ApiError::not_found(rt, n)),
            };
        }
        (m, Some(n), Some("scale")) => scale(sh, rt, ns_str, n, &m, headers, body),
        (Method::GET, Some(n), None | Some("status")) => {
            match sh.lock().store.get(rt.storage, ns_str, n) {
                Some(o) => Ok((200, maybe_table(sh, rt, o.clone(), headers))),
                None => Err(ApiError::not_found(rt, n)),
            }
        }
        (Method::PUT, Some(n), None | Some("status")) => {
            update(sh, rt, ns_str, n, sub, q, headers, body)
        }
        (Method::PATCH, Some(n), None | Some("status")) => {
            patch(sh, rt, ns_str, n, sub, q, headers, body)
        }
        (Method::DELETE, Some(n), None) => {
            // DeleteOptions' gracePeriodSeconds, from the query or the body.
            let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let grace = q
                .get("gracePeriodSeconds")
                .and_then(|g| g.parse::<u64>().ok())
                .or_else(|| options.get("gracePeriodSeconds").and_then(Value::as_u64))
                .map(Duration::from_secs);
            let mut c = sh.lock_write(q);
            let now = sh.clock.now();
            if rt.plural == "pods" && c.store.dry_run {
                c.store
                    .get("pods", ns_str, n)
                    .cloned()
                    .map(|o| (200, o))
                    .ok_or_else(|| ApiError::not_found(rt, n))
            } else if rt.plural == "pods" {
                c.delete_pod(ns_str, n, grace, now).map(|o| (200, o))
            } else {
                c.delete(rt.storage, ns_str, n, now).map(|o| (200, o))
            }
        }
        (Method::POST, Some(n), Some("eviction")) => match parse_body(headers, body) {
            Ok(ev) => {
                // `?dryRun=All` holds for the eviction as for any write.
                let mut c = sh.lock_write(q);
                let now = sh.clock.now();
                // The apiserver's create handler answers 201, the Status carrying that code.
                c.evict(ns_str, n, &ev, now).map(|s| (201, s))
            }
            Err(e) => Err(e),
        },
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({})",
                rt.plural
            ),
        )),
    };
    match result {
        Ok((code, v)) => ok_json(code, &v),
        Err(e) => err(&e),
    }
}

/// POST selfsubjectaccessreviews (`kubectl auth can-i`): the review is judged for the caller
/// by the same authorizer as its requests, and comes back with its status; nothing is
/// stored (201, as the apiserver; staging/src/k8s.io/api/authorization/v1/types.go).
fn access_review(sh: &Shared, body: &Bytes, user: Option<&User>) -> Result<(u16, Value), ApiError> {
    // kubectl sends built-in types as protobuf (the `k8s\0` envelope); read what it asks.
    let mut review: Value = match body.strip_prefix(b"k8s\0") {
        Some(envelope) => review_from_protobuf(envelope).ok_or_else(|| {
            ApiError::bad_request("the protobuf SelfSubjectAccessReview could not be decoded")
        })?,
        None => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))?,
    };
    let spec = review.get("spec");
    let resource = spec.and_then(|s| s.get("resourceAttributes"));
    let non_resource = spec.and_then(|s| s.get("nonResourceAttributes"));
    if resource.is_some() == non_resource.is_some() {
        return Err(ApiError::new(
            422,
            "Invalid",
            "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    let field = |v: Option<&Value>, k: &str| {
        v.and_then(|v| v.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let entry = match resource {
        Some(_) => super::audit::Entry {
            verb: field(resource, "verb"),
            group: field(resource, "group"),
            resource: field(resource, "resource"),
            subresource: field(resource, "subresource"),
            namespace: field(resource, "namespace"),
            name: field(resource, "name"),
            non_resource: false,
        },
        None => super::audit::Entry {
            verb: field(non_resource, "verb"),
            group: String::new(),
            resource: field(non_resource, "path"),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            non_resource: true,
        },
    };
    let allowed = user.is_some_and(|u| rbac::authorize(&sh.lock().store, u, &entry).is_ok());
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    if !review["metadata"].is_object() {
        review["metadata"] = json!({});
    }
    review["status"] = if allowed {
        json!({"allowed": true, "reason": "RBAC: allowed"})
    } else {
        json!({"allowed": false})
    };
    Ok((201, review))
}

/// One field of a protobuf message: a varint, or the bytes of a length-delimited field.
#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The length-delimited and varint fields of one protobuf message, in order. None when the
/// bytes are not a well-formed message (or use a wire type the twin's requests never carry).
fn proto_fields(mut b: &[u8]) -> Option<Vec<(u64, Wire<'_>)>> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        match key & 7 {
            0 => out.push((key >> 3, Wire::Varint(varint(&mut b)?))),
            2 => {
                let len = usize::try_from(varint(&mut b)?).ok()?;
                if len > b.len() {
                    return None;
                }
                let (field, rest) = b.split_at(len);
                out.push((key >> 3, Wire::Bytes(field)));
                b = rest;
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The bytes of field `n` (the first occurrence), when it is length-delimited.
fn proto_bytes(msg: &[u8], n: u64) -> Option<&[u8]> {
    proto_fields(msg)?.into_iter().find_map(|(f, w)| match w {
        Wire::Bytes(b) if f == n => Some(b),
        _ => None,
    })
}

/// A TokenRequest from the apiserver's protobuf envelope (`runtime.Unknown`: raw = 2), as
/// JSON: spec = 2 with audiences = 1 (repeated) and expirationSeconds = 4
/// (staging/src/k8s.io/api/authentication/v1/generated.proto). kubectl create token sends it so.
fn token_request_from_protobuf(envelope: &[u8]) -> Option<Value> {
    let raw = proto_bytes(envelope, 2)?;
    let spec = proto_bytes(raw, 2).unwrap_or_default();
    let mut audiences = Vec::new();
    let mut seconds = None;
    for (f, w) in proto_fields(spec)? {
        match (f, w) {
            (1, Wire::Bytes(a)) => audiences.push(json!(String::from_utf8_lossy(a))),
            (4, Wire::Varint(v)) => seconds = Some(v),
            _ => {}
        }
    }
    let mut out = json!({"spec": {"audiences": audiences}});
    if let Some(v) = seconds {
        out["spec"]["expirationSeconds"] = json!(v);
    }
    Some(out)
}

/// A SelfSubjectAccessReview from the apiserver's protobuf envelope (`runtime.Unknown`:
/// raw = 2), as JSON: spec = 2 with resourceAttributes = 1 (namespace 1, verb 2, group 3,
/// version 4, resource 5, subresource 6, name 7) or nonResourceAttributes = 2 (path 1,
/// verb 2).
fn review_from_protobuf(envelope: &[u8]) -> Option<Value> {
    let field = |msg: &[u8], n: u64| proto_bytes(msg, n).map(<[u8]>::to_vec);
    let strings = |msg: &[u8], names: &[&str]| -> Option<Value> {
        let mut out = serde_json::Map::new();
        for (f, w) in proto_fields(msg)? {
            let Wire::Bytes(v) = w else { continue };
            let Some(name) = usize::try_from(f)
                .ok()
                .and_then(|i| names.get(i.wrapping_sub(1)))
            else {
                continue;
            };
            out.insert(name.to_string(), json!(String::from_utf8_lossy(v)));
        }
        Some(Value::Object(out))
    };
    let raw = field(envelope, 2)?;
    let spec = field(&raw, 2).unwrap_or_default();
    let mut out = json!({"metadata": {}, "spec": {}});
    if let Some(ra) = field(&spec, 1) {
        let names = [
            "namespace",
            "verb",
            "group",
            "version",
            "resource",
            "subresource",
            "name",
        ];
        out["spec"]["resourceAttributes"] = strings(&ra, &names)?;
    }
    if let Some(nra) = field(&spec, 2) {
        out["spec"]["nonResourceAttributes"] = strings(&nra, &["path", "verb"])?;
    }
    Some(out)
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

/// `Accept: application/json;as=PartialObjectMetadata(List);g=meta.k8s.io;v=v1`, which
/// kube-rs' metadata-only API sends.
fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

fn partial_metadata(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
           "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
}

fn maybe_table(sh: &Shared, rt: &ResourceType, obj: Value, headers: &HeaderMap) -> Value {
    if wants_metadata(headers) {
        return partial_metadata(&obj);
    }
    if wants_table(headers) {
        let rv = rv_of(&obj).unwrap_or(0);
        table(rt, &[obj], rv, sh.clock.now(), false)
    } else {
        obj
    }
}

fn selectors(rt: &ResourceType, q: &Query) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let l = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let f = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    // The core kinds with their own field label conversion refuse any other field
    // (kubernetes `pkg/apis/core/v1/conversion.go`, `addFieldLabelConversionsFor*`: a Node
    // selects on `metadata.name` and `spec.unschedulable` only, not on `spec.nodeName`).
    if let Some(known) = super::select::core_fields(rt.storage) {
        if let Some((path, ..)) = f.0.iter().find(|(p, ..)| !known.contains(&p.as_str())) {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {path}"
            )));
        }
    }
    // A custom resource without `selectableFields` selects on its name and namespace only
    // (apimachinery `runtime.DefaultMetaV1FieldSelectorConversion`, which
    // apiextensions-apiserver's custom resource handler installs).
    if rt.is_custom() {
        if let Some((path, ..)) =
            f.0.iter()
                .find(|(p, ..)| p != "metadata.name" && p != "metadata.namespace")
        {
            return Err(ApiError::bad_request(format!(
                "\"{path}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )));
        }
    }
    Ok((l, f))
}

fn list(
    sh: &Shared,
    rt: &'static ResourceType,
    ns: Option<&str>,
    q: &Query,
    headers: &HeaderMap,
) -> Result<Response<Body>, ApiError> {
    let (l, f) = selectors(rt, q)?;
    let mut c = sh.lock();
    let items = c.store.list(rt.storage, ns, &l, &f);
    let rv = c.store.resource_version();
    let offset: usize = match q.get("continue").filter(|s| !s.is_empty()) {
        Some(tok) => tok
            .strip_prefix("o")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ApiError::bad_request("invalid continue token"))?,
        None => 0,
    };
    let limit: usize = q
        .get("limit")
        .and_then(|s| s.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let total = items.len();
    let end = offset.saturating_add(limit).min(total);
    let page = &items[offset.min(end)..end];
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if end < total {
        meta["continue"] = json!(format!("o{end}"));
        meta["remainingItemCount"] = json!(total - end);
    }
    if wants_metadata(headers) {
        drop(c);
        let items: Vec<Value> = page.iter().map(|o| partial_metadata(o)).collect();
        return Ok(ok_json(
            200,
            &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                               "metadata": meta, "items": items}),
        ));
    }
    if wants_table(headers) {
        drop(c);
        let page: Vec<Value> = page.iter().map(|o| Value::clone(o)).collect();
        let mut t = table(
            rt,
            &page,
            rv,
            sh.clock.now(),
            q.get("includeObject") == Some("Object"),
        );
        t["metadata"] = meta;
        return Ok(ok_json(200, &t));
    }
    // Each object's JSON as written out for an earlier list, unless it changed since.
    let items = page
        .iter()
        .map(|o| c.store.json_of(rt.storage, o))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))?;
    drop(c);
    let mut body = Vec::with_capacity(256 + items.iter().map(|j| j.len() + 1).sum::<usize>());
    let head = json!({"apiVersion": rt.api_version(), "kind": format!("{}List", rt.kind), "metadata": meta});
    let head = head.to_string();
    body.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    body.extend_from_slice(b",\"items\":[");
    for (i, json) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(json);
    }
    body.extend_from_slice(b"]}");
    Ok(respond(200, "application/json", body))
}

fn create(
    sh: &Shared,
    rt: &'static ResourceType,
    ns: &str,
    q: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(u16, Value), ApiError> {
    let mut obj = parse_object(headers, body)?;
    super::store::check_shape(rt, &obj)?;
    let body_ns = namespace_of(&obj).to_string();
    if rt.namespaced && !body_ns.is_empty() && body_ns != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    strip_rv(&mut obj);
    if rt.plural == "pods" {
        // The apiserver ignores status on create; the twin's kubelet starts the pod later.
        obj["status"] = json!({"phase": "Pending"});
    }
    let now = sh.clock.now();
    super::apply::record_update(None, &mut obj, &manager(q, headers), &rt.api_version(), now);
    let mut c = sh.lock_write(q);
    if rt.namespaced && c.store.get("namespaces", "", ns).is_none() {
        return Err(ApiError::not_found(rt_namespaces(), ns));
    }
    let out = c.store.create(rt, ns, obj, now)?;
    c.after_change(rt.plural, &out, now);
    c.sync(now);
    Ok((201, Arc::unwrap_or_clone(out)))
}

/// Keep status on the main resource, or only status on `/status`, as the apiserver does
/// for resources with a status subresource.
fn split_status(rt: &ResourceType, old: &Value, mut new: Value, sub: Option<&str>) -> Value {
    if !rt.subresources.contains(&"status") {
        return new;
    }
    if sub == Some("status") {
        let mut out = old.clone();
        out["status"] = new.get("status").cloned().unwrap_or(Value::Null);
        if let Some(rv) = new.at("/metadata/resourceVersion").cloned() {
            set_path(&mut out, &["metadata", "resourceVersion"], rv);
        } else {
            strip_rv(&mut out);
        }
        out
    } else {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        new
    }
}

fn rt_namespaces() -> &'static ResourceType {
    // Namespaces are the first served resource.
    super::resources::by_plural("namespaces").unwrap_or(&RESOURCES[0])
}

/// The `/scale` subresource (autoscaling/v1 Scale) of Deployments, ReplicaSets and
/// StatefulSets: read or set `spec.replicas`.
fn scale(
    sh: &Shared,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    method: &Method,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(u16, Value), ApiError> {
    let mut c = sh.lock();
    let now = sh.clock.now();
    let Some(obj) = c.store.get(rt.storage, ns, name).cloned() else {
        return Err(ApiError::not_found(rt, name));
    };
    let as_scale = |o: &Value| {
        let selector = o
            .at("/spec/selector/matchLabels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
               "metadata": {"name": name_of(o), "namespace": namespace_of(o),
                            "uid": o.at("/metadata/uid"), "resourceVersion": o.at("/metadata/resourceVersion"),
                            "creationTimestamp": o.at("/metadata/creationTimestamp")},
               "spec": {"replicas": o.at("/spec/replicas").and_then(Value::as_u64).unwrap_or(1)},
               "status": {"replicas": o.at("/status/replicas").and_then(Value::as_u64).unwrap_or(0),
                          "selector": selector}})
    };
    let mut scale = as_scale(&obj);
    match *method {
        Method::GET => return Ok((200, scale)),
        Method::PUT => scale = parse_object(headers, body)?,
        Method::PATCH => {
            let p = parse_body(headers, body)?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if ct.starts_with("application/json-patch+json") {
                json_patch(&mut scale, &p)
                    .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?;
            } else {
                merge_patch(&mut scale, &p);
            }
        }
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "the scale subresource takes get, update and patch",
            ))
        }
    }
    if let Some(want) = rv_of(&scale) {
        if Some(want) != rv_of(&obj) {
            return Err(ApiError::conflict(rt, name));
        }
    }
    let Some(replicas) = scale.at("/spec/replicas").and_then(Value::as_u64) else {
        return Err(ApiError::invalid(
            rt,
            name,
            "spec.replicas",
            "Required value: a non-negative integer",
        ));
    };
    let mut next = obj.clone();
    set_path(&mut next, &["spec", "replicas"], json!(replicas));
    strip_rv(&mut next);
    let out = c.store.update(rt, ns, name, next)?;
    c.sync(now);
    let out = c.store.shared(rt.storage, ns, name).cloned().unwrap_or(out);
    Ok((200, as_scale(&out)))
}

/// The field manager of a write: `fieldManager`, else the User-Agent's program name (as
/// the apiserver defaults it).
fn manager(q: &Query, headers: &HeaderMap) -> String {
    if let Some(m) = q.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|m| !m.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

#[allow(clippy::too_many_arguments)]
fn update(
    sh: &Shared,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    q: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(u16, Value), ApiError> {
    let obj = parse_object(headers, body)?;
    super::store::check_shape(rt, &obj)?;
    if !name_of(&obj).is_empty() && name_of(&obj) != name {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    let mut c = sh.lock_write(q);
    let now = sh.clock.now();
    let Some(old) = c.store.get(rt.storage, ns, name).cloned() else {
        return Err(ApiError::not_found(rt, name));
    };
    let mut new = split_status(rt, &old, obj, sub);
    super::apply::record_update(
        Some(&old),
        &mut new,
        &manager(q, headers),
        &rt.api_version(),
        now,
    );
    let out = c.store.update(rt, ns, name, new)?;
    c.after_change(rt.plural, &out, now);
    c.sync(now);
    Ok((200, Arc::unwrap_or_clone(out)))
}

#[allow(clippy::too_many_arguments)]
fn patch(
    sh: &Shared,
    rt: &'static ResourceType,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    q: &Query,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(u16, Value), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let p = parse_body(headers, body)?;
    let mut c = sh.lock_write(q);
    let now = sh.clock.now();
    let old = c.store.get(rt.storage, ns, name).cloned();
    let bad = |e: super::patch::PatchError| ApiError::new(422, "Invalid", e.to_string());
    let (code, new) = match ct.as_str() {
        "application/apply-patch+yaml" => {
            if !p.is_object() {
                return Err(ApiError::bad_request(
                    "the applied configuration is not an object",
                ));
            }
            let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
                return Err(ApiError::new(422, "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"));
            };
            let force = q.flag("force");
            let applied =
                super::apply::apply(old.as_ref(), &p, manager, &rt.api_version(), force, now)
                    .map_err(|conflicts| ApiError {
                        details: Some(json!({"causes": conflicts.iter().map(|c| json!({
                        "reason": "FieldManagerConflict",
                        "message": format!("conflict with {}", super::apply::manager_text(c)),
                        "field": c.field})).collect::<Vec<_>>()})),
                        ..ApiError::new(409, "Conflict", super::apply::conflict_message(&conflicts))
                    })?;
            match old.clone() {
                None => {
                    let mut obj = applied;
                    strip_rv(&mut obj);
                    set_path(&mut obj, &["metadata", "name"], json!(name));
                    if rt.plural == "pods" {
                        obj["status"] = json!({"phase": "Pending"});
                    }
                    let out = c.store.create(rt, ns, obj, now)?;
                    c.after_change(rt.plural, &out, now);
                    c.sync(now);
                    return Ok((201, Arc::unwrap_or_clone(out)));
                }
                Some(_) => (200, applied),
            }
        }
        kind => {
            let Some(mut cur) = old.clone() else {
                return Err(ApiError::not_found(rt, name));
            };
            match kind {
                "application/merge-patch+json" => merge_patch(&mut cur, &p),
                "application/strategic-merge-patch+json" if !rt.is_custom() => {
                    strategic_merge_patch(&mut cur, &p).map_err(bad)?
                }
                "application/json-patch+json" => json_patch(&mut cur, &p).map_err(bad)?,
                other => {
                    return Err(ApiError::new(415, "UnsupportedMediaType",
                        format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})")));
                }
            }
            (200, cur)
        }
    };
    let Some(old) = old else {
        return Err(ApiError::not_found(rt, name));
    };
    // A patch may have turned the object into anything; refuse what cannot be stored.
    super::store::check_shape(rt, &new).map_err(|e| ApiError::new(422, "Invalid", e.message))?;
    let mut new = split_status(rt, &old, new, sub);
    if ct != "application/apply-patch+yaml" {
        super::apply::record_update(
            Some(&old),
            &mut new,
            &manager(q, headers),
            &rt.api_version(),
            now,
        );
    }
    let out = c.store.update(rt, ns, name, new)?;
    c.after_change(rt.plural, &out, now);
    c.sync(now);
    Ok((code, Arc::unwrap_or_clone(out)))
}

/// How watch events carry their objects, from the Accept header.
#[derive(Debug, Clone, Copy)]
enum Render {
    Object,
    Table,
    Metadata,
}

impl Render {
    fn from(headers: &HeaderMap) -> Self {
        if wants_metadata(headers) {
            Render::Metadata
        } else if wants_table(headers) {
            Render::Table
        } else {
            Render::Object
        }
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

/// Selector filtering for a watch, as the apiserver does it: an object that stops matching
/// is sent as DELETED, one that starts matching as ADDED.
struct WatchFilter {
    labels: LabelSelector,
    fields: FieldSelector,
    /// Objects (namespace, name) the client currently holds; unused without selectors.
    seen: std::collections::HashSet<(String, String)>,
    /// Replaying history: objects may have matched before the replay started.
    replay: bool,
}

impl WatchFilter {
    fn new(labels: LabelSelector, fields: FieldSelector, replay: bool) -> Self {
        WatchFilter {
            labels,
            fields,
            seen: Default::default(),
            replay,
        }
    }

    fn translate(&mut self, kind: EventType, obj: &Value) -> Option<&'static str> {
        if self.labels.0.is_empty() && self.fields.0.is_empty() {
            return Some(kind.as_str());
        }
        let key = (namespace_of(obj).to_string(), name_of(obj).to_string());
        let matches = self.labels.matches_object(obj) && self.fields.matches(obj);
        let held = self.seen.contains(&key);
        match (kind, matches, held) {
            (EventType::Deleted, _, _) => (self.seen.remove(&key) || matches).then_some("DELETED"),
            (_, true, true) => Some("MODIFIED"),
            (_, true, false) => {
                self.seen.insert(key);
                let unknown_before = self.replay && kind == EventType::Modified;
                Some(if unknown_before { "MODIFIED" } else { "ADDED" })
            }
            (_, false, true) => {
                self.seen.remove(&key);
                Some("DELETED")
            }
            (_, false, false) => None,
        }
    }
}

fn watch(
    sh: &Arc<Shared>,
    rt: &'static ResourceType,
    ns: Option<&str>,
    q: &Query,
    render_as: Render,
) -> Response<Body> {
    let (l, f) = match selectors(rt, q) {
        Ok(x) => x,
        Err(e) => return err(&e),
    };
    let ns = ns.map(String::from);
    let bookmarks = q.flag("allowWatchBookmarks");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    // sendInitialEvents=true: the current state first, then a bookmark marking its end.
    let initial_events = q.flag("sendInitialEvents");
    let from = q
        .get("resourceVersion")
        .filter(|_| !initial_events)
        .filter(|s| !s.is_empty() && *s != "0")
        .map(String::from);
    let (initial, mut rx, start_rv) = {
        let c = sh.lock();
        let rx = c.store.subscribe(rt.storage);
        let rv = c.store.resource_version();
        let initial: Result<Vec<(EventType, Arc<Value>)>, ApiError> = match &from {
            None => Ok(c
                .store
                .list(rt.storage, ns.as_deref(), &l, &f)
                .into_iter()
                .map(|o| (EventType::Added, o))
                .collect()),
            Some(s) => match s.parse::<u64>() {
                Err(_) => Err(ApiError::bad_request(format!(
                    "invalid resource version {s:?}"
                ))),
                Ok(rv) => c
                    .store
                    .history_since(rt.storage, ns.as_deref(), rv)
                    .map(|evs| evs.into_iter().map(|e| (e.kind, e.object)).collect()),
            },
        };
        (initial, rx, rv)
    };
    let mut filter = WatchFilter::new(l, f, from.is_some());
    let (tx, body_rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    let bookmark = move |rv: u64| json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": {"resourceVersion": rv.to_string()}});
    // `kubectl get -w` asks for Tables: each event then carries a one-row Table.
    let clock = sh.clock.clone();
    let line = move |kind: &str, obj: &Value| match render_as {
        Render::Table => event_line(
            kind,
            &table(
                rt,
                std::slice::from_ref(obj),
                rv_of(obj).unwrap_or(0),
                clock.now(),
                false,
            ),
        ),
        Render::Metadata => event_line(kind, &partial_metadata(obj)),
        Render::Object => event_line(kind, obj),
    };
    let sh = sh.clone();
    tokio::spawn(async move {
        match initial {
            Err(e) => {
                let _ = tx.send(Ok(event_line("ERROR", &e.status()))).await;
                return;
            }
            Ok(evs) => {
                for (kind, obj) in evs {
                    let Some(kind) = filter.translate(kind, &obj) else {
                        continue;
                    };
                    if tx.send(Ok(line(kind, &obj))).await.is_err() {
                        return;
                    }
                }
            }
        }
        let mut last = start_rv;
        if bookmarks || initial_events {
            let mut mark = bookmark(last);
            if initial_events {
                set_path(
                    &mut mark,
                    &["metadata", "annotations"],
                    json!({"k8s.io/initial-events-end": "true"}),
                );
            }
            if tx.send(Ok(event_line("BOOKMARK", &mark))).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.tick().await;
        loop {
            // A notice says only that this resource changed since; a bookmark first catches
            // up, so the version it carries covers every event sent before it.
            let bookmark_due = tokio::select! {
                _ = &mut deadline => return,
                _ = tick.tick(), if bookmarks => true,
                r = rx.changed() => {
                    if r.is_err() {
                        return;
                    }
                    false
                }
            };
            // The events come from the history, so a slow watcher holds no objects of its
            // own; its selectors are judged there, so it copies only what it sends.
            let (events, now_rv) = {
                let c = sh.cluster.lock().unwrap_or_else(|e| e.into_inner());
                let events = c
                    .store
                    .events_since(rt.storage, ns.as_deref(), last)
                    .map(|evs| {
                        evs.filter_map(|ev| {
                            let kind = filter.translate(ev.kind, &ev.object)?;
                            Some((kind, ev.object.clone()))
                        })
                        .collect::<Vec<_>>()
                    });
                (events, c.store.resource_version())
            };
            let events = match events {
                Ok(evs) => evs,
                // Too slow a reader: what it missed is gone; it must re-list.
                Err(e) => {
                    let _ = tx.send(Ok(event_line("ERROR", &e.status()))).await;
                    return;
                }
            };
            for (kind, object) in events {
                if tx.send(Ok(line(kind, &object))).await.is_err() {
                    return;
                }
            }
            last = last.max(now_rv);
            if bookmark_due
                && tx
                    .send(Ok(event_line("BOOKMARK", &bookmark(last))))
                    .await
                    .is_err()
            {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// `POST /_twin/faults`: the run-time fault API of `ichor sim`. The body (JSON, or YAML
/// with a YAML content type) is a faults document as in `--config`'s `faults:` section
/// (see [`crate::sim::faults`]); every field given replaces that fault's setting. An
/// invalid document changes nothing and gets 422 with every bad field as a cause.
fn faults(sh: &Shared, headers: &HeaderMap, body: &Bytes) -> Response<Body> {
    let (f, given) = match parse_faults(headers, body) {
        Ok(f) => f,
        Err(e) => return err(&e),
    };
    let hook = sh
        .fault_hook
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    // Asked before the cluster is locked: the hook reads the Talos side.
    let nodes = hook.as_ref().map(|h| h.nodes());
    let control_planes = hook
        .as_ref()
        .map(|h| h.control_planes())
        .unwrap_or_default();
    let mut c = sh.lock();
    let now = sh.clock.now();
    let targets = FaultTargets {
        nodes,
        control_planes,
        volumes: c
            .list("volumes", None)
            .iter()
            .map(|v| name_of(v).to_string())
            .collect(),
        pdbs: c
            .list("poddisruptionbudgets", None)
            .iter()
            .map(|p| format!("{}/{}", namespace_of(p), name_of(p)))
            .collect(),
        github: hook.as_ref().is_some_and(|h| h.github()),
    };
    let mut invalid = match f.validate(&targets, Origin::Runtime, "") {
        Ok(()) => Vec::new(),
        Err(e) => e.0,
    };
    if let Some(s) = &f.steal_lease {
        if c.store.get("leases", &s.namespace, &s.name).is_none() {
            invalid.push(crate::sim::faults::FieldError {
                field: "stealLease".into(),
                message: format!("no Lease {:?} in namespace {:?}", s.name, s.namespace),
            });
        }
    }
    if !invalid.is_empty() {
        let message = crate::sim::faults::FaultError(invalid.clone()).to_string();
        return err(&ApiError {
            // kubectl prints `The fault request "/_twin/faults" is invalid:` and the causes.
            details: Some(
                json!({"kind": "fault request", "name": "/_twin/faults", "causes": invalid.iter().map(|e| json!({
                "reason": "FieldValueInvalid", "field": e.field, "message": e.message})).collect::<Vec<_>>()}),
            ),
            ..ApiError::new(
                422,
                "Invalid",
                format!("the fault request is invalid: {message}"),
            )
        });
    }
    if given.contains("pdbsNeverAllow") {
        let list = &f.pdbs_never_allow;
        let current: Vec<(String, String)> = c.faults.pdb_never_allows.iter().cloned().collect();
        for (ns, name) in current {
            c.set_pdb_never_allows(&ns, &name, false, now);
        }
        for p in list {
            if let Some((ns, name)) = p.split_once('/') {
                c.set_pdb_never_allows(ns, name, true, now);
            }
        }
    }
    if given.contains("replicasNeverRebuild") {
        let list = f.replicas_never_rebuild.iter().cloned().collect();
        c.set_replicas_never_rebuild(list, now);
    }
    if given.contains("kubeletDown") {
        let list = f.kubelet_down.iter().cloned().collect();
        c.set_kubelet_down(list, now);
    }
    if let Some(b) = &f.api_error_burst {
        // Validated: both fit.
        let count = u32::try_from(b.count).unwrap_or(u32::MAX);
        let code = u16::try_from(b.status).unwrap_or(500);
        let retry = b.retry_after.map_or(1, |d| d.0.as_secs());
        c.fail_next_requests(count, code, retry);
    }
    // The endpoint's older forms.
    if let Some(t) = &f.pdb_never_allows {
        c.set_pdb_never_allows(&t.namespace, &t.name, t.on, now);
    }
    if let Some(n) = f.fail_next {
        let count = u32::try_from(n).unwrap_or(u32::MAX);
        let code = f.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(500);
        c.fail_next_requests(count, code, f.retry_after_seconds.unwrap_or(1));
    }
    if let Some(s) = &f.steal_lease {
        if let Err(e) = c.steal_lease(&s.namespace, &s.name, &s.holder, now) {
            return err(&e);
        }
    }
    drop(c);
    sh.poke.notify_one();
    if let Some(h) = hook {
        h.apply(&f, &given);
    }
    ok_json(
        200,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200}),
    )
}

/// The body of `POST /_twin/faults` and the fields it gives: 400 when it is not JSON (or
/// YAML) at all, 422 when it is but does not fit the schema (with the field path).
fn parse_faults(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(FaultsConfig, std::collections::BTreeSet<String>), ApiError> {
    let yaml = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("yaml"));
    let invalid =
        |m: String| ApiError::new(422, "Invalid", format!("the fault request is invalid: {m}"));
    // Syntax first (400), then the schema with the path of the bad field (422).
    let v: Value = if yaml {
        let text = std::str::from_utf8(body)
            .map_err(|_| ApiError::bad_request("the fault request is not UTF-8"))?;
        if text.trim().is_empty() {
            json!({})
        } else {
            crate::sim::yaml::from_str(text)
                .map_err(|e| ApiError::bad_request(format!("the fault request is not YAML: {e}")))?
        }
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the fault request is not JSON: {e}")))?
    };
    let given = crate::sim::faults::given_fields(
        v.as_object()
            .into_iter()
            .flat_map(|m| m.keys().map(String::as_str)),
    );
    let f: FaultsConfig = serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            invalid(inner.to_string())
        } else {
            invalid(format!("{path}: {inner}"))
        }
    })?;
    Ok((f, given))
}
