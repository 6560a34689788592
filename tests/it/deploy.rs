//! `deploy/` against the code: the RBAC that `kubectl kustomize deploy/` renders grants
//! exactly the rows of `ichor::kube::access::ACCESS` marked granted (no wildcard, nothing
//! more, nothing less), docs/cluster-access.md shows that table, every request ichor's
//! Kubernetes client really sends (recorded by the twin) is covered by it, and the
//! Deployment is locked down (non-root, read-only root, no privilege escalation, limits,
//! the downward-API node name, Secrets as files).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ichor::clock::Clock;
use ichor::gate::{self, live};
use ichor::kube::access::{self, Access, Grant, Request, Scope, ACCESS};
use ichor::kube::KubeClient;
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
use ichor::talos::TalosClient;
use serde_yaml::Value;

use crate::homelab;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl kustomize deploy/`, one value per object.
fn render() -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let out = Command::new(crate::tools::KUBECTL.path())
        .arg("kustomize")
        .arg(repo_root().join("deploy"))
        .output()?;
    assert!(
        out.status.success(),
        "kubectl kustomize deploy/ failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(documents(&String::from_utf8(out.stdout)?)?)
}

fn documents(text: &str) -> Result<Vec<Value>, serde_yaml::Error> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let v = <Value as serde::Deserialize>::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path)?.as_str()
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_sequence)
        .map(|seq| {
            seq.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|o| s(o, &["kind"]) == Some(kind))
        .collect()
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(objects, kind);
    assert_eq!(found.len(), 1, "expected one {kind} in deploy/");
    found[0]
}

/// One permission: where, API group, resource (or URL), verb, and the names it is limited to.
type Grantee = (String, String, String, String, Vec<String>);

fn scope_key(scope: Scope) -> String {
    match scope {
        Scope::Cluster => "cluster".into(),
        Scope::Namespace(ns) => format!("namespace {ns}"),
        Scope::Url => "url".into(),
    }
}

fn expand(a: &Access) -> Vec<Grantee> {
    let mut names: Vec<String> = a.names.iter().map(|n| n.to_string()).collect();
    names.sort();
    a.verbs
        .iter()
        .map(|v| {
            (
                scope_key(a.scope),
                a.group.to_string(),
                a.resource.to_string(),
                v.to_string(),
                names.clone(),
            )
        })
        .collect()
}

/// What the rendered RBAC grants ichor's ServiceAccount, checking on the way that every
/// binding is for that ServiceAccount only and to a role of deploy/ itself, and that every
/// role of deploy/ is bound.
fn granted(objects: &[Value]) -> BTreeSet<Grantee> {
    let mut roles: BTreeMap<(String, String, String), &Value> = BTreeMap::new();
    for kind in ["ClusterRole", "Role"] {
        for r in of_kind(objects, kind) {
            let ns = s(r, &["metadata", "namespace"]).unwrap_or("").to_string();
            let name = s(r, &["metadata", "name"]).unwrap_or("").to_string();
            roles.insert((kind.to_string(), ns, name), r);
        }
    }
    let mut bound = BTreeSet::new();
    let mut out = BTreeSet::new();
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for b in of_kind(objects, kind) {
            let ns = s(b, &["metadata", "namespace"]).unwrap_or("").to_string();
            let subjects = at(b, &["subjects"]).and_then(Value::as_sequence);
            let subjects: Vec<(Option<&str>, Option<&str>, Option<&str>)> = subjects
                .map(|ss| {
                    ss.iter()
                        .map(|x| (s(x, &["kind"]), s(x, &["name"]), s(x, &["namespace"])))
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(
                subjects,
                vec![(Some("ServiceAccount"), Some("ichor"), Some("ichor-system"))],
                "{kind} {ns}/{:?} must bind ichor's ServiceAccount only",
                s(b, &["metadata", "name"])
            );
            let ref_kind = s(b, &["roleRef", "kind"]).unwrap_or("").to_string();
            let ref_name = s(b, &["roleRef", "name"]).unwrap_or("").to_string();
            let role_ns = if ref_kind == "Role" {
                ns.clone()
            } else {
                String::new()
            };
            let key = (ref_kind.clone(), role_ns, ref_name.clone());
            let role = roles.get(&key).unwrap_or_else(|| {
                panic!("{kind} {ns}/… binds {ref_kind} {ref_name}, which deploy/ does not define")
            });
            bound.insert(key);
            let scope = if kind == "ClusterRoleBinding" {
                "cluster".to_string()
            } else {
                format!("namespace {ns}")
            };
            for rule in at(role, &["rules"])
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
            {
                let verbs = strings(rule.get("verbs"));
                let urls = strings(rule.get("nonResourceURLs"));
                if !urls.is_empty() {
                    assert_eq!(
                        scope, "cluster",
                        "nonResourceURLs only hold in a ClusterRole"
                    );
                    for u in &urls {
                        for v in &verbs {
                            out.insert(("url".into(), String::new(), u.clone(), v.clone(), vec![]));
                        }
                    }
                    continue;
                }
                let mut names = strings(rule.get("resourceNames"));
                names.sort();
                for g in strings(rule.get("apiGroups")) {
                    for r in strings(rule.get("resources")) {
                        for v in &verbs {
                            out.insert((
                                scope.clone(),
                                g.clone(),
                                r.clone(),
                                v.clone(),
                                names.clone(),
                            ));
                        }
                    }
                }
            }
        }
    }
    let unbound: Vec<_> = roles.keys().filter(|k| !bound.contains(*k)).collect();
    assert!(unbound.is_empty(), "roles nobody binds: {unbound:?}");
    out
}

fn walk_strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Sequence(seq) => seq.iter().for_each(|x| walk_strings(x, out)),
        Value::Mapping(m) => m.iter().for_each(|(k, x)| {
            walk_strings(k, out);
            walk_strings(x, out);
        }),
        _ => {}
    }
}

#[test]
#[ignore = "needs kubectl: scripts/test installs it"]
fn the_rbac_grants_exactly_what_the_code_uses_and_no_wildcard() -> TestResult {
    let objects = render()?;
    // No wildcard anywhere in a rule, and none of the verbs that widen a grant.
    for kind in ["ClusterRole", "Role"] {
        for r in of_kind(&objects, kind) {
            let mut texts = Vec::new();
            walk_strings(at(r, &["rules"]).unwrap_or(&Value::Null), &mut texts);
            for t in texts {
                assert!(
                    !t.contains('*'),
                    "a wildcard in {kind} {:?}: {t}",
                    s(r, &["metadata", "name"])
                );
                assert!(
                    ![
                        "escalate",
                        "bind",
                        "impersonate",
                        "delete",
                        "deletecollection"
                    ]
                    .contains(&t),
                    "{kind} {:?} grants `{t}`",
                    s(r, &["metadata", "name"])
                );
            }
            assert!(at(r, &["aggregationRule"]).is_none(), "no aggregated roles");
        }
    }
    let rendered = granted(&objects);
    let wanted: BTreeSet<Grantee> = ACCESS
        .iter()
        .filter(|a| a.grant == Grant::Granted)
        .flat_map(expand)
        .collect();
    let extra: Vec<_> = rendered.difference(&wanted).collect();
    let missing: Vec<_> = wanted.difference(&rendered).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "deploy/ and src/kube/access.rs disagree\n  granted but not in ACCESS: {extra:#?}\n  in ACCESS but not granted: {missing:#?}"
    );
    // A withheld row is granted by no rule, under any name.
    for a in ACCESS.iter().filter(|a| a.grant != Grant::Granted) {
        for v in a.verbs {
            let leaked: Vec<_> = rendered
                .iter()
                .filter(|(_, g, r, verb, _)| g == a.group && r == a.resource && verb == v)
                .collect();
            assert!(
                leaked.is_empty(),
                "{} {v} is withheld but granted: {leaked:?}",
                a.resource
            );
        }
    }
    Ok(())
}

#[test]
fn the_cni_agents_ichor_reads_are_the_daemonsets_it_may_read() {
    let row = ACCESS
        .iter()
        .find(|a| a.resource == "daemonsets" && a.scope == Scope::Cluster)
        .expect("a cluster-wide daemonsets row");
    let agents: BTreeSet<&str> = live::KNOWN_CNIS
        .iter()
        .flat_map(|c| live::cni_workload(c).iter().map(|(_, name)| *name))
        .collect();
    let names: BTreeSet<&str> = row.names.iter().copied().collect();
    assert_eq!(
        names, agents,
        "the daemonsets row must name every CNI agent gate::live reads"
    );
    // The record and the lock live where the Role is.
    for a in ACCESS
        .iter()
        .filter(|a| matches!(a.resource, "leases" | "configmaps"))
    {
        if a.needed_by.contains("KubeClient::") {
            assert_eq!(a.scope, Scope::Namespace(live::ICHOR_NAMESPACE), "{a:?}");
        }
    }
}

#[test]
fn docs_cluster_access_shows_the_table() -> TestResult {
    let doc = std::fs::read_to_string(repo_root().join("docs/cluster-access.md"))?;
    let begin = "<!-- access-table:begin (generated from src/kube/access.rs; tests/it/deploy.rs checks it) -->\n";
    let end = "<!-- access-table:end -->";
    let start = doc
        .find(begin)
        .ok_or("docs/cluster-access.md lacks the access-table markers")?;
    let rest = &doc[start + begin.len()..];
    let stop = rest.find(end).ok_or("no end marker")?;
    let expected = access::markdown();
    assert_eq!(
        &rest[..stop],
        expected,
        "docs/cluster-access.md's table differs from src/kube/access.rs; paste this between the markers:\n{expected}"
    );
    Ok(())
}

fn container(deployment: &Value) -> &Value {
    let cs = at(deployment, &["spec", "template", "spec", "containers"])
        .and_then(Value::as_sequence)
        .expect("containers");
    assert_eq!(cs.len(), 1, "one container");
    &cs[0]
}

#[test]
#[ignore = "needs kubectl: scripts/test installs it"]
fn the_deployment_is_locked_down() -> TestResult {
    let objects = render()?;
    let d = one(&objects, "Deployment");
    let pod = at(d, &["spec", "template", "spec"]).ok_or("pod spec")?;
    assert_eq!(s(pod, &["serviceAccountName"]), Some("ichor"));
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(
            at(pod, &[key]).and_then(Value::as_bool),
            Some(true),
            "{key}"
        );
    }
    let psc = at(pod, &["securityContext"]).ok_or("pod securityContext")?;
    assert_eq!(
        at(psc, &["runAsNonRoot"]).and_then(Value::as_bool),
        Some(true)
    );
    assert!(at(psc, &["runAsUser"])
        .and_then(Value::as_u64)
        .is_some_and(|u| u > 0));
    assert_eq!(s(psc, &["seccompProfile", "type"]), Some("RuntimeDefault"));

    let c = container(d);
    let csc = at(c, &["securityContext"]).ok_or("container securityContext")?;
    assert_eq!(
        at(csc, &["readOnlyRootFilesystem"]).and_then(Value::as_bool),
        Some(true)
    );
    assert_eq!(
        at(csc, &["allowPrivilegeEscalation"]).and_then(Value::as_bool),
        Some(false)
    );
    assert_ne!(
        at(csc, &["privileged"]).and_then(Value::as_bool),
        Some(true)
    );
    assert_eq!(
        strings(at(csc, &["capabilities", "drop"])),
        vec!["ALL".to_string()]
    );
    assert!(at(csc, &["capabilities", "add"]).is_none());
    for kind in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(
                at(c, &["resources", kind, r]).is_some(),
                "resources.{kind}.{r}"
            );
        }
    }
    assert_eq!(
        strings(at(c, &["args"])),
        ["run", "--config", "/etc/ichor/config.yaml"]
    );
    let env = at(c, &["env"]).and_then(Value::as_sequence).ok_or("env")?;
    let node = env
        .iter()
        .find(|e| s(e, &["name"]) == Some("ICHOR_NODE_NAME"))
        .ok_or("ICHOR_NODE_NAME")?;
    assert_eq!(
        s(node, &["valueFrom", "fieldRef", "fieldPath"]),
        Some("spec.nodeName")
    );
    // No secret in the environment.
    assert!(
        env.iter()
            .all(|e| at(e, &["valueFrom", "secretKeyRef"]).is_none()),
        "Secrets are mounted as files, never in env"
    );
    assert!(at(c, &["envFrom"]).is_none());

    // Control planes go first: ichor prefers a node that is not one.
    let prefs = at(
        pod,
        &[
            "affinity",
            "nodeAffinity",
            "preferredDuringSchedulingIgnoredDuringExecution",
        ],
    )
    .and_then(Value::as_sequence)
    .ok_or("node affinity preference")?;
    assert!(prefs.iter().any(|p| {
        at(p, &["preference", "matchExpressions"])
            .and_then(Value::as_sequence)
            .is_some_and(|es| {
                es.iter().any(|e| {
                    s(e, &["key"]) == Some("node-role.kubernetes.io/control-plane")
                        && s(e, &["operator"]) == Some("DoesNotExist")
                })
            })
    }));

    // Volumes: the config from the rendered ConfigMap, Secrets as files, state on an emptyDir.
    let volumes: BTreeMap<&str, &Value> = at(pod, &["volumes"])
        .and_then(Value::as_sequence)
        .ok_or("volumes")?
        .iter()
        .filter_map(|v| Some((s(v, &["name"])?, v)))
        .collect();
    let mounts: BTreeMap<&str, &str> = at(c, &["volumeMounts"])
        .and_then(Value::as_sequence)
        .ok_or("volumeMounts")?
        .iter()
        .filter_map(|m| Some((s(m, &["mountPath"])?, s(m, &["name"])?)))
        .collect();
    let config_map = s(volumes["config"], &["configMap", "name"]).ok_or("config volume")?;
    let cm = of_kind(&objects, "ConfigMap")
        .into_iter()
        .find(|m| s(m, &["metadata", "name"]) == Some(config_map))
        .ok_or("the config volume's ConfigMap is not rendered")?;
    assert_eq!(mounts.get("/etc/ichor/config.yaml"), Some(&"config"));
    let config: Value =
        serde_yaml::from_str(s(cm, &["data", "config.yaml"]).ok_or("config.yaml key")?)?;
    for key in [
        &["repository", "url"][..],
        &["repository", "branch"],
        &["clusters"],
        &["webhook", "secretFile"],
        &["pollInterval"],
        &["listen"],
    ] {
        assert!(at(&config, key).is_some(), "config.yaml lacks {key:?}");
    }
    // Every file the config names is in a mounted Secret.
    let mut files: Vec<&str> = vec![
        s(&config, &["webhook", "secretFile"]).ok_or("secretFile")?,
        s(&config, &["credentials", "github", "tokenFile"]).ok_or("tokenFile")?,
    ];
    for cl in at(&config, &["clusters"])
        .and_then(Value::as_sequence)
        .ok_or("clusters")?
    {
        files.push(s(cl, &["talosconfig"]).ok_or("a cluster's talosconfig")?);
    }
    let secrets = examples()?;
    for f in files {
        let (dir, key) = f.rsplit_once('/').ok_or("a file path")?;
        let volume = mounts
            .get(dir)
            .ok_or_else(|| format!("{f}: nothing mounted at {dir}"))?;
        let secret = s(volumes[volume], &["secret", "secretName"])
            .ok_or_else(|| format!("{f}: {dir} is not a Secret"))?;
        assert!(
            secrets.get(secret).is_some_and(|keys| keys.contains(key)),
            "{f}: examples/secrets.yaml has no Secret {secret} with key {key}"
        );
    }
    // The state dir lies inside an emptyDir (a folder ichor makes 0700 there: the mount
    // point itself is world-writable, which ichor refuses to take over).
    let state = s(&config, &["stateDir"]).ok_or("stateDir")?;
    let mount = mounts
        .keys()
        .filter(|m| state.starts_with(&format!("{m}/")))
        .max_by_key(|m| m.len())
        .ok_or_else(|| format!("stateDir {state} is not inside a mounted volume"))?;
    assert!(
        at(volumes[mounts[*mount]], &["emptyDir"]).is_some(),
        "the state dir is inside an emptyDir"
    );
    Ok(())
}

/// examples/secrets.yaml: Secret name → its keys, each value an obvious placeholder.
fn examples() -> Result<BTreeMap<String, BTreeSet<String>>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(repo_root().join("deploy/examples/secrets.yaml"))?;
    let mut out = BTreeMap::new();
    for secret in documents(&text)? {
        assert_eq!(s(&secret, &["kind"]), Some("Secret"));
        assert!(
            at(&secret, &["data"]).is_none(),
            "examples use stringData, visibly fake"
        );
        let name = s(&secret, &["metadata", "name"]).ok_or("name")?.to_string();
        let data = at(&secret, &["stringData"])
            .and_then(Value::as_mapping)
            .ok_or("stringData")?;
        let mut keys = BTreeSet::new();
        for (k, v) in data {
            let v = v.as_str().ok_or("a string value")?;
            assert!(
                v.contains("FAKE-PLACEHOLDER"),
                "{name}: a value that is not a placeholder"
            );
            keys.insert(k.as_str().ok_or("a key")?.to_string());
        }
        out.insert(name, keys);
    }
    Ok(out)
}

#[test]
#[ignore = "needs kubectl: scripts/test installs it"]
fn the_service_and_network_policy_open_only_the_containers_ports() -> TestResult {
    let objects = render()?;
    let d = one(&objects, "Deployment");
    let ports: BTreeSet<String> = at(container(d), &["ports"])
        .and_then(Value::as_sequence)
        .ok_or("ports")?
        .iter()
        .filter_map(|p| s(p, &["name"]).map(str::to_string))
        .collect();
    assert_eq!(ports, ["metrics".to_string(), "webhook".to_string()].into());
    let labels = at(d, &["spec", "template", "metadata", "labels"]).ok_or("pod labels")?;
    let svc = one(&objects, "Service");
    let targets: BTreeSet<String> = at(svc, &["spec", "ports"])
        .and_then(Value::as_sequence)
        .ok_or("service ports")?
        .iter()
        .filter_map(|p| s(p, &["targetPort"]).map(str::to_string))
        .collect();
    assert_eq!(targets, ports);
    let selects = |sel: &Value| {
        sel.as_mapping()
            .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
    };
    assert!(selects(at(svc, &["spec", "selector"]).ok_or("selector")?));
    let np = one(&objects, "NetworkPolicy");
    assert!(selects(
        at(np, &["spec", "podSelector", "matchLabels"]).ok_or("podSelector")?
    ));
    assert_eq!(
        strings(at(np, &["spec", "policyTypes"])),
        ["Ingress", "Egress"]
    );
    let ingress = at(np, &["spec", "ingress"])
        .and_then(Value::as_sequence)
        .ok_or("ingress")?;
    let mut opened = BTreeSet::new();
    for rule in ingress {
        let ps = rule
            .get("ports")
            .and_then(Value::as_sequence)
            .ok_or("every ingress rule names its ports")?;
        opened.extend(
            ps.iter()
                .filter_map(|p| s(p, &["port"]).map(str::to_string)),
        );
    }
    assert_eq!(opened, ports);
    let mut egress = BTreeSet::new();
    for rule in at(np, &["spec", "egress"])
        .and_then(Value::as_sequence)
        .ok_or("egress")?
    {
        let ps = rule
            .get("ports")
            .and_then(Value::as_sequence)
            .ok_or("every egress rule names its ports")?;
        egress.extend(
            ps.iter()
                .filter_map(|p| at(p, &["port"]).and_then(Value::as_u64)),
        );
    }
    assert_eq!(
        egress,
        [53, 443, 6443, 50000].into(),
        "DNS, HTTPS, the API server, Talos"
    );
    Ok(())
}

/// The homelab cluster folder as the fixture's `main` has it.
fn main_folder(dir: &Path) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let repo = ichor::git::Repo::open(homelab())?;
    let main = repo.resolve("main")?;
    let out = dir.join("homelab");
    std::fs::create_dir_all(&out)?;
    for f in ["cluster.yaml", "release-set.yaml"] {
        let text = repo
            .read_file(&main, &format!("clusters/homelab/{f}"))?
            .ok_or("missing in the fixture")?;
        std::fs::write(out.join(f), text)?;
    }
    Ok(out)
}

/// The discovery and health URLs every authenticated user may read (the default
/// `system:discovery`, `system:basic-user` and `system:public-info-viewer` ClusterRoles).
fn granted_to_everyone(path: &str) -> bool {
    matches!(
        path,
        "/api" | "/apis" | "/version" | "/healthz" | "/livez" | "/readyz" | "/openapi/v2"
    ) || [
        "/api/",
        "/apis/",
        "/openapi/",
        "/version/",
        "/healthz/",
        "/livez/",
        "/readyz/",
    ]
    .iter()
    .any(|p| path.starts_with(p))
}

fn uncovered(twin: &Twin) -> Vec<String> {
    twin.kube
        .audit()
        .entries()
        .into_iter()
        .filter(|e| !(e.non_resource && granted_to_everyone(&e.resource)))
        .filter(|e| {
            let resource = if e.non_resource {
                e.resource.clone()
            } else {
                e.rbac_resource()
            };
            let req = Request {
                verb: &e.verb,
                group: &e.group,
                resource: &resource,
                namespace: (!e.namespace.is_empty()).then_some(e.namespace.as_str()),
                name: (!e.name.is_empty()).then_some(e.name.as_str()),
                non_resource: e.non_resource,
            };
            access::covering(&req).is_none()
        })
        .map(|e| {
            format!(
                "{} {}/{} ns={:?} name={:?}",
                e.verb,
                e.group,
                e.rbac_resource(),
                e.namespace,
                e.name
            )
        })
        .collect()
}

fn saw(twin: &Twin, verb: &str, resource: &str) -> bool {
    twin.kube.audit().entries().iter().any(|e| {
        e.verb == verb
            && (e.rbac_resource() == resource || (e.non_resource && e.resource == resource))
    })
}

#[tokio::test]
async fn every_request_the_client_sends_is_granted_by_access() -> TestResult {
    let state = tempfile::tempdir()?;
    let twin = Twin::start(
        Clock::manual(),
        &ClusterFolder::read(&main_folder(state.path())?)?,
        state.path(),
        TwinOptions {
            config: TwinConfig::default(),
            github: None,
        },
    )
    .await?;
    twin.advance(Duration::from_secs(30));
    let kube = KubeClient::connect(Some(twin.kubeconfig())).await?;
    let ctx = ichor::talos::config::load(twin.talosconfig(), None)?;
    let talos = TalosClient::new(ctx, twin.talos.clock().clone());

    // Without deploy/, ensure_namespace must create the namespace: exactly the withheld row.
    twin.kube.audit().clear();
    kube.ensure_namespace(live::ICHOR_NAMESPACE).await?;
    assert_eq!(
        uncovered(&twin),
        vec![format!("create /namespaces ns=\"\" name=\"\"")],
        "ensure_namespace on a cluster without ichor-system"
    );
    let withheld = ACCESS
        .iter()
        .find(|a| a.resource == "namespaces" && a.verbs == ["create"])
        .ok_or("the namespaces create row")?;
    assert!(matches!(withheld.grant, Grant::Withheld(_)));

    // From here on the cluster is as deploy/ leaves it: the namespace exists.
    twin.kube.audit().clear();
    let repo = ichor::git::Repo::open(homelab())?;
    let change = gate::load(&repo, "main", "renovate/cilium-1.18.x", None)?;
    let facts = live::observe(&kube, Some(&talos), &live::Subject::of(&change)).await;
    assert!(facts.nodes.is_ok(), "{:?}", facts.nodes);
    // Without a release set (status): every known CNI, local volumes.
    let any = live::Subject {
        cluster: "homelab".into(),
        cni: None,
        volumes: ichor::releaseset::VolumeProvider::LocalPath,
        handover: None,
        health_checks: vec![],
        prometheus_credential: None,
    };
    live::observe(&kube, Some(&talos), &any).await;

    // Every other call of the client, as the rollout makes them.
    kube.ensure_namespace(live::ICHOR_NAMESPACE).await?;
    let now = twin.kube.clock().now();
    let lock = live::lock_name("homelab");
    kube.acquire_lease(
        live::ICHOR_NAMESPACE,
        &lock,
        "me",
        Duration::from_secs(30),
        now,
    )
    .await?;
    kube.acquire_lease(
        live::ICHOR_NAMESPACE,
        &lock,
        "me",
        Duration::from_secs(30),
        now,
    )
    .await?;
    kube.lease_holder(live::ICHOR_NAMESPACE, &lock).await?;
    kube.release_lease(live::ICHOR_NAMESPACE, &lock, "me")
        .await?;
    assert!(kube
        .config_map(live::ICHOR_NAMESPACE, "ichor-record")
        .await?
        .is_none());
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ichor-record", "namespace": live::ICHOR_NAMESPACE},
        "data": {"stage": "talos"}
    }))?;
    let written = kube.put_config_map(&cm).await?;
    kube.put_config_map(&written).await?;
    let nodes = kube.nodes().await?;
    let worker = nodes
        .iter()
        .find(|n| n.role == ichor::releaseset::Role::Worker)
        .ok_or("a worker")?;
    kube.cordon(&worker.name, "test-rollout").await?;
    let mut evicted = false;
    for n in &nodes {
        if let Some(p) = kube.pods_on(&n.name).await?.into_iter().find(|p| !p.stays) {
            kube.evict(&p).await?;
            evicted = true;
            break;
        }
    }
    assert!(evicted, "some pod to evict in the homelab twin");
    kube.uncordon(&worker.name, "test-rollout").await?;
    kube.volume_attachments(&worker.name).await?;
    kube.local_volumes().await?;
    kube.longhorn_volumes().await?;
    kube.longhorn_volumes_of(Some(&worker.name), &["pvc-postgres".into()])
        .await?;
    kube.mirror_pods().await?;
    kube.daemonset("kube-system", "kube-proxy").await?;
    kube.deprecated_apis().await?;
    // A settling step's watches, each open once.
    let changes = kube.changes_of(&worker.name, &["pvc-postgres".into()], &twin.clock);
    tokio::time::timeout(Duration::from_secs(30), changes.watching()).await?;
    drop(changes);

    // The audit saw the traffic (so an empty result below means something) …
    for (verb, resource) in [
        ("list", "nodes"),
        ("patch", "nodes"),
        ("create", "pods/eviction"),
        ("update", "leases"),
        ("create", "configmaps"),
        ("update", "configmaps"),
        ("get", "daemonsets"),
        ("get", "applications"),
        ("get", "/metrics"),
        ("watch", "nodes"),
        ("watch", "pods"),
        ("watch", "volumeattachments"),
        ("watch", "replicas"),
    ] {
        assert!(
            saw(&twin, verb, resource),
            "the twin recorded no {verb} {resource}"
        );
    }
    // … and every request is covered by a granted row.
    let missing = uncovered(&twin);
    assert!(
        missing.is_empty(),
        "requests no row of src/kube/access.rs grants (add a row and the RBAC, or stop asking):\n{}",
        missing.join("\n")
    );
    assert_eq!(twin.kube.audit().dropped(), 0);
    Ok(())
}
