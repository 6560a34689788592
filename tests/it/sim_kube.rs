//! The twin's Kubernetes API against independent clients: real kubectl, and raw HTTPS
//! requests (hyper) asserting on the wire bodies. Plus behaviour tests of the model.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use ichor::clock::Clock;
use ichor::sim::kube::{Behaviour, KubeSeed, KubeTwin};
use serde_json::{json, Value};
use tokio_rustls::rustls;

async fn twin(seed: KubeSeed, behaviour: Behaviour) -> (KubeTwin, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let t = KubeTwin::start_with(Clock::manual(), seed, behaviour, dir.path())
        .await
        .expect("twin starts");
    (t, dir)
}

// ---- kubectl -------------------------------------------------------------------------------

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

async fn kubectl(kubeconfig: &Path, cache: &Path, args: &[&str]) -> Out {
    let mut cmd = std::process::Command::new(crate::tools::KUBECTL.path());
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("kubectl runs");
    let o = Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("$ kubectl {}\n{}{}", args.join(" "), o.stdout, o.stderr);
    o
}

/// Pods go at once when deleted (no grace period), for tests about what follows a deletion.
fn instant_deletion() -> Behaviour {
    Behaviour {
        pod_termination: Duration::ZERO,
        ..Behaviour::default()
    }
}

/// Run `fut` (a kubectl that waits for pods to go) while the twin's clock moves on, 1 s
/// of simulated time per wall millisecond or so, so grace periods pass.
async fn ticking<T>(t: &KubeTwin, fut: impl std::future::Future<Output = T>) -> T {
    let ticker = async {
        loop {
            t.clock().advance(Duration::from_secs(1));
            t.sync();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::select! {
        r = fut => r,
        _ = ticker => unreachable!("the ticker never ends"),
    }
}

fn drain_seed() -> KubeSeed {
    KubeSeed::typical(1, 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn kubectl_gets_nodes_wide_and_pods_in_all_namespaces() {
    let (t, dir) = twin(drain_seed(), Behaviour::default()).await;
    let cache = dir.path().join("cache");
    let nodes = kubectl(&t.kubeconfig, &cache, &["get", "nodes", "-o", "wide"]).await;
    assert!(nodes.ok);
    let header = nodes.stdout.lines().next().unwrap_or("");
    for col in [
        "NAME",
        "STATUS",
        "ROLES",
        "AGE",
        "VERSION",
        "INTERNAL-IP",
        "OS-IMAGE",
        "CONTAINER-RUNTIME",
    ] {
        assert!(header.contains(col), "missing column {col}: {header}");
    }
    let cp = nodes
        .stdout
        .lines()
        .find(|l| l.starts_with("cp-1"))
        .unwrap_or("");
    assert!(
        cp.contains("Ready") && cp.contains("control-plane") && cp.contains("v1.34.1"),
        "{cp}"
    );
    assert!(
        cp.contains("10.5.0.11") && cp.contains("Talos (v1.11.3)"),
        "{cp}"
    );
    assert_eq!(
        nodes
            .stdout
            .lines()
            .filter(|l| l.starts_with("worker-"))
            .count(),
        3
    );

    let pods = kubectl(&t.kubeconfig, &cache, &["get", "pods", "-A", "-o", "wide"]).await;
    assert!(pods.ok);
    let header = pods.stdout.lines().next().unwrap_or("");
    for col in [
        "NAMESPACE",
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "NODE",
    ] {
        assert!(header.contains(col), "missing column {col}: {header}");
    }
    let apiserver = pods
        .stdout
        .lines()
        .find(|l| l.contains("kube-apiserver-cp-1"))
        .unwrap_or("");
    assert!(
        apiserver.starts_with("kube-system")
            && apiserver.contains("1/1")
            && apiserver.contains("Running"),
        "{apiserver}"
    );
    assert_eq!(
        pods.stdout
            .lines()
            .filter(|l| l.starts_with("default ") && l.contains("web-"))
            .count(),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn kubectl_cordons_and_uncordons() {
    let (t, dir) = twin(drain_seed(), Behaviour::default()).await;
    let cache = dir.path().join("cache");
    let out = kubectl(&t.kubeconfig, &cache, &["cordon", "worker-2"]).await;
    assert!(out.ok && out.stdout.contains("node/worker-2 cordoned"));
    let unsched = |t: &KubeTwin| {
        t.with(|c, _| c.get("nodes", "", "worker-2"))
            .and_then(|n| n.pointer("/spec/unschedulable").cloned())
    };
    assert_eq!(unsched(&t), Some(json!(true)));
    let nodes = kubectl(&t.kubeconfig, &cache, &["get", "nodes"]).await;
    assert!(nodes
        .stdout
        .lines()
        .any(|l| l.starts_with("worker-2") && l.contains("Ready,SchedulingDisabled")));
    let out = kubectl(&t.kubeconfig, &cache, &["uncordon", "worker-2"]).await;
    assert!(out.ok && out.stdout.contains("node/worker-2 uncordoned"));
    assert_eq!(unsched(&t), None);
}

fn pods_on(t: &KubeTwin, node: &str) -> Vec<Value> {
    t.with(|c, _| c.list("pods", None))
        .into_iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node))
        .collect()
}

fn owner_kind(p: &Value) -> String {
    p.pointer("/metadata/ownerReferences/0/kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn kubectl_drain_evicts_and_pods_come_back_elsewhere() {
    let (t, dir) = twin(drain_seed(), Behaviour::default()).await;
    let cache = dir.path().join("cache");
    let before = pods_on(&t, "worker-1");
    assert!(
        before.iter().any(|p| owner_kind(p) == "ReplicaSet"),
        "seed puts workload pods on worker-1"
    );
    // A server-side dry run changes nothing.
    let dry = kubectl(
        &t.kubeconfig,
        &cache,
        &[
            "drain",
            "worker-1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--dry-run=server",
        ],
    )
    .await;
    assert!(dry.ok, "{}", dry.stderr);
    assert_eq!(pods_on(&t, "worker-1").len(), before.len());
    let node = t
        .with(|c, _| c.get("nodes", "", "worker-1"))
        .unwrap_or_default();
    assert_eq!(node.pointer("/spec/unschedulable"), None);
    // kubectl waits for the evicted pods to go, which takes their grace period (30 s) on
    // the twin's clock: keep the clock moving meanwhile.
    let evicted_at = t.clock().now();
    let out = ticking(
        &t,
        kubectl(
            &t.kubeconfig,
            &cache,
            &[
                "drain",
                "worker-1",
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=60s",
            ],
        ),
    )
    .await;
    assert!(
        t.clock().now().since(evicted_at) >= Duration::from_secs(30),
        "the drain waited out the grace period"
    );
    assert!(out.ok, "drain failed: {}", out.stderr);
    assert!(
        out.stdout.contains("node/worker-1 drained"),
        "{}",
        out.stdout
    );
    let left = pods_on(&t, "worker-1");
    assert!(
        left.iter().all(|p| owner_kind(p) == "DaemonSet"),
        "only DaemonSet pods stay"
    );
    // The replacements started elsewhere while the evicted pods terminated.
    let web_ready = |t: &KubeTwin| {
        t.with(|c, _| c.list("pods", Some("default")))
            .iter()
            .filter(|p| p.pointer("/status/phase") == Some(&json!("Running")))
            .count()
    };
    assert_eq!(web_ready(&t), 3);
    let web: Vec<Value> = t.with(|c, _| c.list("pods", Some("default")));
    assert!(web
        .iter()
        .all(|p| p.pointer("/spec/nodeName") != Some(&json!("worker-1"))));
    let node = t
        .with(|c, _| c.get("nodes", "", "worker-1"))
        .unwrap_or_default();
    assert_eq!(node.pointer("/spec/unschedulable"), Some(&json!(true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn kubectl_drain_stalled_by_a_pdb_reports_the_disruption_budget() {
    let (t, dir) = twin(drain_seed(), Behaviour::default()).await;
    let cache = dir.path().join("cache");
    t.with(|c, now| c.set_pdb_never_allows("default", "web", true, now));
    // kubectl's retry loop runs on wall time (5 s between attempts): a short --timeout.
    let out = kubectl(
        &t.kubeconfig,
        &cache,
        &[
            "drain",
            "worker-1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=3s",
        ],
    )
    .await;
    assert!(!out.ok, "a drain blocked by a PDB must fail");
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        all.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{all}"
    );
    assert!(all.contains("will retry after 5s"), "{all}");
    // The web pod on worker-1 is still there.
    assert!(pods_on(&t, "worker-1")
        .iter()
        .any(|p| p.pointer("/metadata/labels/app") == Some(&json!("web"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn kubectl_prints_the_other_kinds_and_follows_a_daemonset_rollout() {
    let seed = drain_seed().lease("kube-system", "ichor", "ichor-0");
    let (t, dir) = twin(seed, Behaviour::default()).await;
    let cache = dir.path().join("cache");
    let k = |args: &'static [&'static str]| kubectl(&t.kubeconfig, &cache, args);
    let pdb = k(&["get", "pdb", "-A"]).await;
    assert!(
        pdb.ok && pdb.stdout.contains("ALLOWED DISRUPTIONS"),
        "{}",
        pdb.stdout
    );
    assert!(pdb.stdout.lines().any(|l| l.starts_with("default")
        && l.contains("web")
        && l.contains(" 2 ")
        && l.contains("N/A")));
    let ds = k(&["get", "ds", "-n", "kube-system"]).await;
    assert!(
        ds.stdout
            .lines()
            .any(|l| l.starts_with("kube-proxy") && l.split_whitespace().nth(1) == Some("4")),
        "{}",
        ds.stdout
    );
    let vols = k(&["get", "volumes.longhorn.io", "-A"]).await;
    assert!(
        // Nothing mounts pvc-data: detached, robustness unknown, as Longhorn reports it.
        vols.stdout
            .lines()
            .any(|l| l.contains("pvc-data") && l.contains("detached") && l.contains("unknown")),
        "{}",
        vols.stdout
    );
    let apps = k(&["get", "applications", "-n", "argocd"]).await;
    assert!(
        apps.stdout.contains("Synced") && apps.stdout.contains("Healthy"),
        "{}",
        apps.stdout
    );
    let leases = k(&["get", "leases", "-n", "kube-system"]).await;
    assert!(leases.stdout.contains("ichor-0"), "{}", leases.stdout);
    let crds = k(&["get", "crd"]).await;
    assert!(
        crds.stdout.contains("volumes.longhorn.io")
            && crds.stdout.contains("applications.argoproj.io")
    );

    // A new kube-proxy image (strategic merge on the containers list) rolls node by node.
    let set = k(&[
        "set",
        "image",
        "ds/kube-proxy",
        "kube-proxy=registry.k8s.io/kube-proxy:v1.35.0",
        "-n",
        "kube-system",
    ])
    .await;
    assert!(set.ok, "{}", set.stderr);
    let ds = || {
        t.with(|c, _| c.get("daemonsets", "kube-system", "kube-proxy"))
            .unwrap_or_default()
    };
    // The status describes the new generation a moment after the spec.
    assert_ne!(
        ds()["status"]["observedGeneration"],
        ds()["metadata"]["generation"]
    );
    t.clock().advance(Duration::from_secs(2));
    t.sync();
    assert_eq!(
        ds()["status"]["updatedNumberScheduled"],
        1,
        "one pod replaced at a time"
    );
    for _ in 0..8 {
        t.clock().advance(Duration::from_secs(10));
        t.sync();
    }
    assert_eq!(ds()["status"]["updatedNumberScheduled"], 4);
    assert_eq!(ds()["status"]["numberAvailable"], 4);
    let images: Vec<String> = t
        .with(|c, _| c.list("pods", Some("kube-system")))
        .iter()
        .filter(|p| p["metadata"]["labels"]["k8s-app"] == "kube-proxy")
        .map(|p| {
            p["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(images, vec!["registry.k8s.io/kube-proxy:v1.35.0"; 4]);
    let status = k(&[
        "rollout",
        "status",
        "ds/kube-proxy",
        "-n",
        "kube-system",
        "--timeout=10s",
    ])
    .await;
    assert!(
        status.ok && status.stdout.contains("successfully rolled out"),
        "{}",
        status.stdout
    );

    // describe reads the node, its pods and its events with field selectors.
    let describe = k(&["describe", "node", "worker-1"]).await;
    assert!(describe.ok, "{}", describe.stderr);
    assert!(
        describe.stdout.contains("Non-terminated Pods:") && describe.stdout.contains("kube-proxy-"),
        "{}",
        describe.stdout
    );
    assert!(
        describe.stdout.contains("HolderIdentity:  worker-1"),
        "node leases are seeded: {}",
        describe.stdout
    );
    let describe_pod = k(&[
        "describe",
        "pod",
        "-n",
        "kube-system",
        "kube-apiserver-cp-1",
    ])
    .await;
    assert!(
        describe_pod.ok && describe_pod.stdout.contains("Node/cp-1"),
        "{}",
        describe_pod.stdout
    );

    // apply (client-side, then server-side) and label go through the patch paths.
    let manifest = dir.path().join("cm.yaml");
    std::fs::write(&manifest, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plan\n  namespace: default\ndata:\n  stage: talos\n").expect("write");
    let m = manifest.to_string_lossy().to_string();
    let applied = kubectl(&t.kubeconfig, &cache, &["apply", "-f", &m]).await;
    assert!(
        applied.ok && applied.stdout.contains("configmap/plan created"),
        "{}",
        applied.stderr
    );
    std::fs::write(&manifest, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plan\n  namespace: default\ndata:\n  stage: kubernetes\n").expect("write");
    let ssa = kubectl(
        &t.kubeconfig,
        &cache,
        &["apply", "--server-side", "--force-conflicts", "-f", &m],
    )
    .await;
    assert!(
        ssa.ok && ssa.stdout.contains("serverside-applied"),
        "{}",
        ssa.stderr
    );
    let cm = t
        .with(|c, _| c.get("configmaps", "default", "plan"))
        .unwrap_or_default();
    assert_eq!(cm["data"]["stage"], "kubernetes");
    let label = k(&["label", "node", "worker-3", "ichor.dev/batch=1"]).await;
    assert!(label.ok, "{}", label.stderr);
    let node = t
        .with(|c, _| c.get("nodes", "", "worker-3"))
        .unwrap_or_default();
    assert_eq!(node["metadata"]["labels"]["ichor.dev/batch"], "1");

    // scale (the /scale subresource) and logs.
    let scaled = k(&["scale", "deployment/web", "--replicas=5"]).await;
    assert!(
        scaled.ok && scaled.stdout.contains("scaled"),
        "{}",
        scaled.stderr
    );
    t.clock().advance(Duration::from_secs(10));
    t.sync();
    let web = t
        .with(|c, _| c.get("deployments", "default", "web"))
        .unwrap_or_default();
    assert_eq!(
        (
            web["status"]["readyReplicas"].as_u64(),
            web["spec"]["replicas"].as_u64()
        ),
        (Some(5), Some(5))
    );
    let logs = k(&["logs", "-n", "kube-system", "kube-apiserver-cp-1"]).await;
    assert!(
        logs.ok && logs.stdout.contains("runs no real containers"),
        "{}",
        logs.stderr
    );

    // kubectl delete waits for the pod to be gone.
    let web = t.with(|c, _| c.list("pods", Some("default")))[0]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let del = ticking(
        &t,
        kubectl(
            &t.kubeconfig,
            &cache,
            &["delete", "pod", &web, "--timeout=10s"],
        ),
    )
    .await;
    assert!(del.ok && del.stdout.contains("deleted"), "{}", del.stderr);
}

// ---- raw HTTPS ---------------------------------------------------------------------------

struct Api {
    addr: std::net::SocketAddr,
    token: String,
    tls: tokio_rustls::TlsConnector,
}

struct Reply {
    code: u16,
    headers: hyper::HeaderMap,
    body: Value,
    text: String,
}

impl Api {
    fn new(t: &KubeTwin) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut t.ca_pem.as_bytes()).flatten() {
            roots.add(cert).expect("CA cert");
        }
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Api {
            addr: t.addr,
            token: t.token().to_string(),
            tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        ct: Option<&str>,
        body: String,
    ) -> hyper::Response<Incoming> {
        self.send_accepting(method, path, ct, None, body).await
    }

    async fn send_accepting(
        &self,
        method: &str,
        path: &str,
        ct: Option<&str>,
        accept: Option<&str>,
        body: String,
    ) -> hyper::Response<Incoming> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .expect("TLS handshake against the twin CA");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("h1");
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string())
            .header("authorization", format!("Bearer {}", self.token));
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        if let Some(accept) = accept {
            req = req.header("accept", accept);
        }
        let req = req.body(Full::new(Bytes::from(body))).expect("request");
        sender.send_request(req).await.expect("response")
    }

    async fn call(&self, method: &str, path: &str, ct: Option<&str>, body: Option<Value>) -> Reply {
        let resp = self
            .send(
                method,
                path,
                ct.or(body.as_ref().map(|_| "application/json")),
                body.map(|b| b.to_string()).unwrap_or_default(),
            )
            .await;
        let code = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Reply {
            code,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    async fn call_with_accept(&self, path: &str, accept: &str) -> Reply {
        let resp = self
            .send_accepting("GET", path, None, Some(accept), String::new())
            .await;
        let code = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        Reply {
            code,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    async fn get(&self, path: &str) -> Reply {
        self.call("GET", path, None, None).await
    }
}

/// Read newline-delimited watch events until `n` arrived.
async fn read_events(body: &mut Incoming, buf: &mut String, n: usize) -> Vec<Value> {
    let mut out = Vec::new();
    while out.len() < n {
        while let Some(i) = buf.find('\n') {
            let line: String = buf.drain(..=i).collect();
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                out.push(v);
            }
            if out.len() == n {
                return out;
            }
        }
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("watch event within the safety timeout");
        match frame {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    buf.push_str(&String::from_utf8_lossy(d));
                }
            }
            _ => break,
        }
    }
    out
}

fn two_pdbs_seed() -> KubeSeed {
    KubeSeed::nodes(1, 3)
        .deployment("default", "web", 3)
        .pdb_min_available("default", "web", "web", json!(2))
}

#[tokio::test]
async fn eviction_blocked_by_a_pdb_is_429_with_the_disruption_budget_cause() {
    let (t, _d) = twin(two_pdbs_seed(), Behaviour::default()).await;
    let api = Api::new(&t);
    let web: Vec<String> = t
        .with(|c, _| c.list("pods", Some("default")))
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    let evict = |name: &str| json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}});
    let path = |name: &str| format!("/api/v1/namespaces/default/pods/{name}/eviction");
    // minAvailable 2 of 3: one eviction allowed, then the budget blocks.
    let first = api
        .call("POST", &path(&web[0]), None, Some(evict(&web[0])))
        .await;
    assert_eq!(first.code, 201, "{}", first.text);
    assert_eq!(first.body["status"], "Success");
    let pdb = api
        .get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/web")
        .await;
    assert_eq!(pdb.body["status"]["disruptionsAllowed"], 0);
    assert_eq!(pdb.body["status"]["currentHealthy"], 2);
    assert_eq!(pdb.body["status"]["desiredHealthy"], 2);
    assert_eq!(pdb.body["status"]["expectedPods"], 3);
    let second = api
        .call("POST", &path(&web[1]), None, Some(evict(&web[1])))
        .await;
    assert_eq!(second.code, 429);
    assert_eq!(second.body["kind"], "Status");
    assert_eq!(second.body["reason"], "TooManyRequests");
    assert_eq!(
        second.body["message"],
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(
        second.body["details"]["causes"][0]["reason"],
        "DisruptionBudget"
    );
    assert_eq!(
        second.body["details"]["causes"][0]["message"],
        "The disruption budget web needs 2 healthy pods and has 2 currently"
    );
    // After the replacement starts, the budget allows again.
    t.clock().advance(Duration::from_secs(10));
    let third = api
        .call("POST", &path(&web[1]), None, Some(evict(&web[1])))
        .await;
    assert_eq!(third.code, 201, "{}", third.text);
    // Unknown pod: 404 NotFound Status.
    let gone = api
        .call("POST", &path("nope"), None, Some(evict("nope")))
        .await;
    assert_eq!(
        (gone.code, gone.body["reason"].as_str()),
        (404, Some("NotFound"))
    );
}

#[tokio::test]
async fn eviction_with_two_matching_pdbs_is_500() {
    let seed = two_pdbs_seed().pdb_max_unavailable("default", "web-too", "web", json!(1));
    let (t, _d) = twin(seed, Behaviour::default()).await;
    let api = Api::new(&t);
    let pod = t.with(|c, _| c.list("pods", Some("default")))[0]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let r = api
        .call(
            "POST",
            &format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
            None,
            Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}})),
        )
        .await;
    assert_eq!(r.code, 500);
    assert!(r.body["message"]
        .as_str()
        .unwrap_or("")
        .contains("more than one PodDisruptionBudget"));
    assert!(
        t.with(|c, _| c.get("pods", "default", &pod)).is_some(),
        "the pod stays"
    );
}

#[tokio::test]
async fn eviction_of_unready_pods_follows_unhealthy_pod_eviction_policy() {
    use ichor::sim::kube::PdbSeed;
    let pdb = |policy: Option<&str>| PdbSeed {
        namespace: "default".into(),
        name: "web".into(),
        app: "web".into(),
        min_available: Some(json!(3)),
        max_unavailable: None,
        unhealthy_pod_eviction_policy: policy.map(String::from),
    };
    for (policy, want) in [(None, 429), (Some("AlwaysAllow"), 201)] {
        let seed = KubeSeed::nodes(1, 3)
            .deployment("default", "web", 3)
            .pdb(pdb(policy));
        let (t, _d) = twin(seed, Behaviour::default()).await;
        let api = Api::new(&t);
        // worker-1 goes NotReady: its web pod runs but is not Ready; the budget (3) is broken.
        t.with(|c, now| c.set_node_ready("worker-1", false, now))
            .expect("node");
        let pod = t
            .with(|c, _| c.list("pods", Some("default")))
            .into_iter()
            .find(|p| p["spec"]["nodeName"] == "worker-1")
            .expect("a web pod on worker-1");
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        let r = api.call("POST", &format!("/api/v1/namespaces/default/pods/{name}/eviction"), None,
            Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}))).await;
        assert_eq!(r.code, want, "policy {policy:?}: {}", r.text);
    }
}

#[tokio::test]
async fn lease_update_with_a_stale_resource_version_is_409_and_a_stolen_lease_shows() {
    let (t, _d) = twin(KubeSeed::nodes(1, 0), Behaviour::default()).await;
    let api = Api::new(&t);
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ichor", "namespace": "kube-system"},
        "spec": {"holderIdentity": "ichor-a", "leaseDurationSeconds": 15}});
    let base = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";
    let created = api.call("POST", base, None, Some(lease.clone())).await;
    assert_eq!(created.code, 201, "{}", created.text);
    let again = api.call("POST", base, None, Some(lease)).await;
    assert_eq!(
        (again.code, again.body["reason"].as_str()),
        (409, Some("AlreadyExists"))
    );
    let mut renewed = created.body.clone();
    renewed["spec"]["renewTime"] = json!("2026-01-01T00:00:05.000000Z");
    let ok = api
        .call("PUT", &format!("{base}/ichor"), None, Some(renewed.clone()))
        .await;
    assert_eq!(ok.code, 200, "{}", ok.text);
    // The same (now stale) resourceVersion again.
    let stale = api
        .call("PUT", &format!("{base}/ichor"), None, Some(renewed))
        .await;
    assert_eq!(stale.code, 409);
    assert_eq!(stale.body["reason"], "Conflict");
    assert_eq!(stale.body["message"], "Operation cannot be fulfilled on leases.coordination.k8s.io \"ichor\": the object has been modified; please apply your changes to the latest version and try again");
    // Fault: another holder takes the lease; our next update conflicts and a GET shows it.
    t.with(|c, now| c.steal_lease("kube-system", "ichor", "intruder", now))
        .expect("lease exists");
    let mut mine = ok.body.clone();
    mine["spec"]["renewTime"] = json!("2026-01-01T00:00:10.000000Z");
    let lost = api
        .call("PUT", &format!("{base}/ichor"), None, Some(mine))
        .await;
    assert_eq!(lost.code, 409);
    let now = api.get(&format!("{base}/ichor")).await;
    assert_eq!(now.body["spec"]["holderIdentity"], "intruder");
    assert_eq!(now.body["spec"]["leaseTransitions"], 1);
}

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

/// A twin that keeps 40 events of history, a client, and the configmaps' version now.
async fn short_history() -> (KubeTwin, tempfile::TempDir, Api, String) {
    let behaviour = Behaviour {
        watch_history: 40,
        ..Behaviour::default()
    };
    let (t, d) = twin(KubeSeed::nodes(1, 2), behaviour).await;
    let api = Api::new(&t);
    let list = api.get(CONFIGMAPS).await;
    let rv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    (t, d, api, rv)
}

/// A watch of the configmaps from `rv` (`extra` appended to its query): its body.
async fn watch_configmaps(api: &Api, rv: &str, extra: &str) -> Incoming {
    let resp = api
        .send(
            "GET",
            &format!("{CONFIGMAPS}?watch=true&resourceVersion={rv}{extra}"),
            None,
            String::new(),
        )
        .await;
    assert_eq!(resp.status().as_u16(), 200);
    resp.into_body()
}

#[tokio::test]
async fn watch_replays_from_a_resource_version_sends_bookmarks_and_expires_old_versions() {
    let (_t, _d, api, rv) = short_history().await;
    let base = CONFIGMAPS;
    for i in 0..3 {
        let r = api
            .call(
                "POST",
                base,
                None,
                Some(
                    json!({"metadata": {"name": format!("cm-{i}")}, "data": {"i": i.to_string()}}),
                ),
            )
            .await;
        assert_eq!(r.code, 201);
    }
    let mut body = watch_configmaps(&api, &rv, "&allowWatchBookmarks=true").await;
    let mut buf = String::new();
    let evs = read_events(&mut body, &mut buf, 4).await;
    let types: Vec<&str> = evs
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(types, ["ADDED", "ADDED", "ADDED", "BOOKMARK"]);
    assert_eq!(evs[0]["object"]["metadata"]["name"], "cm-0");
    // A change after the watch started streams as it happens.
    let patched = api
        .call(
            "PATCH",
            &format!("{base}/cm-1"),
            Some("application/merge-patch+json"),
            Some(json!({"data": {"i": "one"}})),
        )
        .await;
    assert_eq!(patched.code, 200);
    let evs = read_events(&mut body, &mut buf, 1).await;
    assert_eq!(evs[0]["type"], "MODIFIED");
    assert_eq!(evs[0]["object"]["data"]["i"], "one");
    // Push the history past the old version: 410 Expired as an ERROR event.
    for i in 0..50 {
        api.call(
            "POST",
            base,
            None,
            Some(json!({"metadata": {"name": format!("filler-{i}")}})),
        )
        .await;
    }
    let mut body = watch_configmaps(&api, &rv, "").await;
    let mut buf = String::new();
    let evs = read_events(&mut body, &mut buf, 1).await;
    assert_eq!(evs[0]["type"], "ERROR");
    assert_eq!(evs[0]["object"]["code"], 410);
    assert_eq!(evs[0]["object"]["reason"], "Expired");
}

/// A watch that stays open while other resources churn through the history keeps going:
/// it has missed none of its own resource's events (kube-apiserver keeps a watch cache per
/// resource), so its next event arrives, not a 410.
#[tokio::test]
async fn a_watch_outlives_other_resources_churning_through_the_history() {
    let (_t, _d, api, rv) = short_history().await;
    let base = CONFIGMAPS;
    let mut body = watch_configmaps(&api, &rv, "").await;
    // Twice the history's length of writes to another resource.
    for i in 0..80 {
        let r = api
            .call(
                "POST",
                "/api/v1/namespaces/default/secrets",
                None,
                Some(json!({"metadata": {"name": format!("s-{i}")}})),
            )
            .await;
        assert_eq!(r.code, 201);
    }
    let r = api
        .call(
            "POST",
            base,
            None,
            Some(json!({"metadata": {"name": "after-the-churn"}})),
        )
        .await;
    assert_eq!(r.code, 201);
    let mut buf = String::new();
    let evs = read_events(&mut body, &mut buf, 1).await;
    assert_eq!(evs[0]["type"], "ADDED", "{:?}", evs[0]);
    assert_eq!(evs[0]["object"]["metadata"]["name"], "after-the-churn");
    // A new watch from the old version still finds every configmap event after it.
    let mut body = watch_configmaps(&api, &rv, "").await;
    let mut buf = String::new();
    let evs = read_events(&mut body, &mut buf, 1).await;
    assert_eq!(evs[0]["type"], "ADDED", "{:?}", evs[0]);
}

#[tokio::test]
async fn list_filters_by_label_and_field_selectors_and_pages() {
    let (t, _d) = twin(KubeSeed::typical(1, 3), Behaviour::default()).await;
    let api = Api::new(&t);
    let names = |r: &Reply| -> Vec<String> {
        r.body["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let web = api.get("/api/v1/pods?labelSelector=app%3Dweb").await;
    assert_eq!(names(&web).len(), 3);
    let not_web = api
        .get("/api/v1/namespaces/default/pods?labelSelector=app!%3Dweb")
        .await;
    assert_eq!(names(&not_web).len(), 0);
    let set = api
        .get("/api/v1/pods?labelSelector=k8s-app%20in%20(kube-proxy,cilium)")
        .await;
    assert_eq!(names(&set).len(), 8, "two DaemonSets on four nodes");
    let exists = api
        .get("/api/v1/nodes?labelSelector=node-role.kubernetes.io/control-plane")
        .await;
    assert_eq!(names(&exists), ["cp-1"]);
    let on_w1 = api
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dworker-1,status.phase%3DRunning")
        .await;
    assert!(names(&on_w1).len() >= 3);
    assert!(on_w1.body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|p| p["spec"]["nodeName"] == "worker-1"));
    let by_name = api
        .get("/api/v1/nodes?fieldSelector=metadata.name%3Dworker-2")
        .await;
    assert_eq!(names(&by_name), ["worker-2"]);
    // A Node selects on its name and `spec.unschedulable` only (kubernetes
    // `pkg/apis/core/v1/conversion.go`), in a list and in a watch alike.
    for path in ["/api/v1/nodes?", "/api/v1/nodes?watch=true&"] {
        let nodes_by_node = api
            .get(&format!("{path}fieldSelector=spec.nodeName%3Dworker-1"))
            .await;
        assert_eq!(nodes_by_node.code, 400, "{path}");
        assert_eq!(
            nodes_by_node.body["message"].as_str(),
            Some("field label not supported: spec.nodeName")
        );
    }
    let bad = api.get("/api/v1/pods?labelSelector=app%20in%20web").await;
    assert_eq!(bad.code, 400);
    // A custom resource selects on its name and namespace only, as apiextensions-apiserver
    // serves it (apimachinery `DefaultMetaV1FieldSelectorConversion`).
    let cr_by_name = api
        .get("/apis/argoproj.io/v1alpha1/applications?fieldSelector=metadata.name%3Dcilium")
        .await;
    assert_eq!(names(&cr_by_name), ["cilium"]);
    let cr_by_spec = api
        .get("/apis/argoproj.io/v1alpha1/applications?fieldSelector=spec.nodeName%3Dworker-1")
        .await;
    assert_eq!(cr_by_spec.code, 400);
    assert_eq!(
        cr_by_spec.body["message"].as_str(),
        Some("\"spec.nodeName\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"")
    );
    t.with(|c, now| c.set_application_status("argocd", "cilium", "OutOfSync", "Progressing", now))
        .expect("the typical seed has the CNI Application");
    let app = api
        .get("/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/cilium")
        .await;
    assert_eq!(
        (
            app.body["status"]["sync"]["status"].as_str(),
            app.body["status"]["health"]["status"].as_str()
        ),
        (Some("OutOfSync"), Some("Progressing"))
    );
    let page = api.get("/api/v1/pods?limit=5").await;
    assert_eq!(names(&page).len(), 5);
    let token = page.body["metadata"]["continue"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let rest = api
        .get(&format!("/api/v1/pods?limit=500&continue={token}"))
        .await;
    let all = api.get("/api/v1/pods").await;
    assert_eq!(names(&page).len() + names(&rest).len(), names(&all).len());
}

#[tokio::test]
async fn server_side_apply_creates_then_merges_and_records_the_field_manager() {
    let (t, _d) = twin(KubeSeed::nodes(1, 0), Behaviour::default()).await;
    let api = Api::new(&t);
    let path = "/api/v1/namespaces/kube-system/configmaps/talos-bootstrap-manifests-inventory";
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: talos-bootstrap-manifests-inventory\n  namespace: kube-system\ndata:\n  a: \"1\"\n";
    let no_manager = api
        .send(
            "PATCH",
            path,
            Some("application/apply-patch+yaml"),
            yaml.into(),
        )
        .await;
    assert_eq!(no_manager.status().as_u16(), 422);
    let created = api
        .send(
            "PATCH",
            &format!("{path}?fieldManager=talos"),
            Some("application/apply-patch+yaml"),
            yaml.into(),
        )
        .await;
    assert_eq!(created.status().as_u16(), 201);
    let second = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: talos-bootstrap-manifests-inventory\n  namespace: kube-system\ndata:\n  b: \"2\"\n";
    let merged = api
        .send(
            "PATCH",
            &format!("{path}?fieldManager=ichor&force=true"),
            Some("application/apply-patch+yaml"),
            second.into(),
        )
        .await;
    assert_eq!(merged.status().as_u16(), 200);
    let got = api.get(path).await;
    assert_eq!(got.body["data"], json!({"a": "1", "b": "2"}));
    let managers: Vec<&str> = got.body["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["manager"].as_str())
        .collect();
    assert_eq!(managers, ["talos", "ichor"]);
    // Strategic merge and JSON patch on the same object.
    let json_patched = api
        .call(
            "PATCH",
            path,
            Some("application/json-patch+json"),
            Some(json!([{"op": "add", "path": "/data/c", "value": "3"}])),
        )
        .await;
    assert_eq!(json_patched.body["data"]["c"], "3");

    // ichor applying a value talos owns: a conflict, unless forced.
    let clash = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: talos-bootstrap-manifests-inventory\ndata:\n  a: \"9\"\n  b: \"2\"\n";
    let conflict = api
        .send(
            "PATCH",
            &format!("{path}?fieldManager=ichor"),
            Some("application/apply-patch+yaml"),
            clash.into(),
        )
        .await;
    assert_eq!(conflict.status().as_u16(), 409);
    let body: Value = serde_json::from_slice(
        &conflict
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes(),
    )
    .unwrap_or_default();
    assert_eq!(body["reason"], "Conflict");
    assert_eq!(
        body["message"],
        // talos applied `a` (an Apply manager is named alone, as upstream's printManager does).
        "Apply failed with 1 conflict: conflict with \"talos\": .data.a"
    );
    assert_eq!(body["details"]["causes"][0]["field"], ".data.a");
    let forced = api
        .send(
            "PATCH",
            &format!("{path}?fieldManager=ichor&force=true"),
            Some("application/apply-patch+yaml"),
            clash.into(),
        )
        .await;
    assert_eq!(forced.status().as_u16(), 200);
    // talos owned only `a`, now ichor's, so its entry goes; the JSON patch's field belongs to
    // the patching client (an Update entry).
    let got = api.get(path).await;
    assert_eq!(got.body["data"], json!({"a": "9", "b": "2", "c": "3"}));
    let ops: Vec<(String, String)> = got.body["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            (
                f["manager"].as_str().unwrap_or("").to_string(),
                f["operation"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(ops.contains(&("ichor".into(), "Apply".into())), "{ops:?}");
    assert!(ops.iter().any(|(_, op)| op == "Update"), "{ops:?}");
    assert!(
        !ops.iter().any(|(m, _)| m == "talos"),
        "talos lost its only field: {ops:?}"
    );
}

#[tokio::test]
async fn metrics_expose_requested_deprecated_apis() {
    let seed = KubeSeed::nodes(1, 0)
        .deprecated_api("resource.k8s.io", "v1beta1", "resourceslices", "1.36")
        .deprecated_api("", "v1", "componentstatuses", "");
    let (t, _d) = twin(seed, Behaviour::default()).await;
    let api = Api::new(&t);
    t.with(|c, _| {
        c.record_deprecated_request(ichor::sim::kube::DeprecatedApi {
            group: "flowcontrol.apiserver.k8s.io".into(),
            version: "v1beta3".into(),
            resource: "flowschemas".into(),
            subresource: String::new(),
            removed_release: "1.32".into(),
        })
    });
    let m = api.get("/metrics").await;
    assert_eq!(m.code, 200);
    assert!(m
        .text
        .contains("# TYPE apiserver_requested_deprecated_apis gauge"));
    assert!(m.text.contains("apiserver_requested_deprecated_apis{group=\"resource.k8s.io\",removed_release=\"1.36\",resource=\"resourceslices\",subresource=\"\",version=\"v1beta1\"} 1"), "{}", m.text);
    assert!(m.text.contains("resource=\"componentstatuses\""));
    assert!(m
        .text
        .contains("removed_release=\"1.32\",resource=\"flowschemas\""));
}

#[tokio::test]
async fn errors_are_status_objects_and_the_token_is_required() {
    let (t, _d) = twin(KubeSeed::nodes(1, 1), Behaviour::default()).await;
    let api = Api::new(&t);
    let missing = api.get("/api/v1/nodes/nope").await;
    assert_eq!(missing.code, 404);
    assert_eq!(
        missing.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "nodes \"nope\" not found", "reason": "NotFound", "code": 404,
        "details": {"name": "nope", "kind": "nodes"}})
    );
    let invalid = api
        .call(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            None,
            Some(json!({"data": {}})),
        )
        .await;
    assert_eq!(
        (invalid.code, invalid.body["reason"].as_str()),
        (422, Some("Invalid"))
    );
    let no_ns = api
        .call(
            "POST",
            "/api/v1/namespaces/nope/configmaps",
            None,
            Some(json!({"metadata": {"name": "x"}})),
        )
        .await;
    assert_eq!(
        (no_ns.code, no_ns.body["message"].as_str()),
        (404, Some("namespaces \"nope\" not found"))
    );
    let anon = Api {
        token: "wrong".into(),
        ..Api::new(&t)
    };
    assert_eq!(anon.get("/api/v1/nodes").await.code, 401);
    assert_eq!(
        anon.get("/version").await.code,
        200,
        "/version is public as on a real apiserver"
    );
    let v = api.get("/version").await;
    assert_eq!(v.body["gitVersion"], "v1.34.1");
    let res = api.get("/api/v1").await;
    let eviction = res.body["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == "pods/eviction")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (eviction["group"].as_str(), eviction["version"].as_str()),
        (Some("policy"), Some("v1"))
    );
    let crds = api
        .get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        .await;
    // Longhorn's Volume and Replica, Argo CD's Application, CloudNativePG's Cluster.
    assert_eq!(crds.body["items"].as_array().map(Vec::len), Some(4));
}

// ---- faults --------------------------------------------------------------------------------

#[tokio::test]
async fn fault_bursts_of_5xx_and_429_with_retry_after() {
    let (t, _d) = twin(KubeSeed::nodes(1, 1), Behaviour::default()).await;
    let api = Api::new(&t);
    t.with(|c, _| c.fail_next_requests(2, 500, 0));
    assert_eq!(api.get("/api/v1/nodes").await.code, 500);
    assert_eq!(api.get("/api/v1/nodes").await.code, 500);
    assert_eq!(api.get("/api/v1/nodes").await.code, 200);
    // The same through the run-time fault endpoint.
    let set = api
        .call(
            "POST",
            "/_twin/faults",
            None,
            Some(json!({"apiErrorBurst": {"count": 1, "status": 429, "retryAfter": "7s"}})),
        )
        .await;
    assert_eq!(set.code, 200);
    let limited = api.get("/api/v1/nodes").await;
    assert_eq!(limited.code, 429);
    assert_eq!(
        limited
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("7")
    );
    assert_eq!(limited.body["reason"], "TooManyRequests");
    assert_eq!(api.get("/api/v1/nodes").await.code, 200);
}

#[tokio::test]
async fn fault_pdb_that_never_allows() {
    let (t, _d) = twin(two_pdbs_seed(), Behaviour::default()).await;
    let api = Api::new(&t);
    let set = api
        .call(
            "POST",
            "/_twin/faults",
            None,
            Some(json!({"pdbsNeverAllow": ["default/web"]})),
        )
        .await;
    assert_eq!(set.code, 200);
    let pdb = api
        .get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/web")
        .await;
    assert_eq!(pdb.body["status"]["disruptionsAllowed"], 0);
    assert_eq!(pdb.body["status"]["currentHealthy"], 3);
    let pod = t.with(|c, _| c.list("pods", Some("default")))[0]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let r = api
        .call(
            "POST",
            &format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
            None,
            Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}})),
        )
        .await;
    assert_eq!(r.code, 429);
    t.with(|c, now| c.set_pdb_never_allows("default", "web", false, now));
    let r = api
        .call(
            "POST",
            &format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
            None,
            Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod}})),
        )
        .await;
    assert_eq!(r.code, 201);
}

// ---- behaviour -----------------------------------------------------------------------------

#[tokio::test]
async fn deleted_pods_are_recreated_on_a_schedulable_node_after_the_delay() {
    let (t, _d) = twin(
        KubeSeed::nodes(1, 3)
            .deployment("default", "web", 3)
            .statefulset("db", "pg", 2),
        instant_deletion(),
    )
    .await;
    t.with(|c, now| c.set_unschedulable("worker-3", true, now))
        .expect("node");
    let victim = t
        .with(|c, _| c.list("pods", Some("default")))
        .into_iter()
        .find(|p| p["spec"]["nodeName"] == "worker-1")
        .expect("pod on worker-1");
    let name = victim["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    t.with(|c, now| c.delete("pods", "default", &name, now))
        .expect("delete");
    let pods = t.with(|c, _| c.list("pods", Some("default")));
    assert_eq!(pods.len(), 3, "the ReplicaSet made a replacement at once");
    let fresh = pods
        .iter()
        .find(|p| p["status"]["phase"] == "Pending")
        .cloned()
        .expect("a pending replacement");
    t.clock().advance(Duration::from_secs(9));
    t.sync();
    assert!(t
        .with(|c, _| c.list("pods", Some("default")))
        .iter()
        .any(|p| p["status"]["phase"] == "Pending"));
    t.clock().advance(Duration::from_secs(1));
    t.sync();
    let started = t
        .with(|c, _| {
            c.get(
                "pods",
                "default",
                fresh["metadata"]["name"].as_str().unwrap_or(""),
            )
        })
        .unwrap_or_default();
    assert_eq!(started["status"]["phase"], "Running");
    let node = started["spec"]["nodeName"].as_str().unwrap_or("");
    assert!(
        node == "worker-1" || node == "worker-2",
        "never the cordoned worker-3 or the tainted control plane: {node}"
    );
    // A deleted Node takes its pods with it (pod GC); the ReplicaSet replaces them.
    t.with(|c, now| c.delete("nodes", "", "worker-2", now))
        .expect("delete node");
    assert!(pods_on(&t, "worker-2").is_empty());
    assert_eq!(t.with(|c, _| c.list("pods", Some("default"))).len(), 3);
    // A StatefulSet pod comes back with the same name.
    t.with(|c, now| c.delete("pods", "db", "pg-0", now))
        .expect("delete");
    t.clock().advance(Duration::from_secs(10));
    t.sync();
    assert_eq!(
        t.with(|c, _| c.get("pods", "db", "pg-0"))
            .map(|p| p["status"]["phase"].clone()),
        Some(json!("Running"))
    );
}

#[tokio::test]
async fn node_down_loses_pods_and_degrades_longhorn_volumes_until_rebuilt() {
    let behaviour = Behaviour {
        replica_rebuild_delay: Duration::from_secs(60),
        ..Behaviour::default()
    };
    // A volume in use: a detached one is judged by nobody (robustness `unknown`).
    let seed = KubeSeed::typical(1, 4).longhorn_volume_attached("pvc-used", 3, "worker-1");
    let (t, _d) = twin(seed, behaviour).await;
    let vol = |t: &KubeTwin| {
        t.with(|c, _| c.get("volumes", "longhorn-system", "pvc-used"))
            .unwrap_or_default()
    };
    assert_eq!(vol(&t)["status"]["robustness"], "healthy");
    let replica_nodes = |t: &KubeTwin| -> Vec<String> {
        t.with(|c, _| c.list("replicas", Some("longhorn-system")))
            .iter()
            .filter(|r| r["spec"]["volumeName"] == "pvc-used")
            .filter(|r| r["status"]["currentState"] == "running")
            .map(|r| r["spec"]["nodeID"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let holder = replica_nodes(&t)[0].clone();
    t.with(|c, now| c.node_down(&holder, now)).expect("node");
    assert_eq!(vol(&t)["status"]["robustness"], "degraded");
    // The pods stay in the API (see node_down_keeps_pods_until_the_unreachable_toleration).
    let left: Vec<Value> = pods_on(&t, &holder);
    assert!(
        left.iter().any(|p| owner_kind(p) == "DaemonSet"),
        "{left:?}"
    );
    t.clock().advance(Duration::from_secs(59));
    t.sync();
    assert_eq!(vol(&t)["status"]["robustness"], "degraded");
    t.clock().advance(Duration::from_secs(1));
    t.sync();
    assert_eq!(vol(&t)["status"]["robustness"], "healthy");
    let nodes = replica_nodes(&t);
    assert_eq!(nodes.len(), 3);
    assert!(
        !nodes.contains(&holder),
        "rebuilt on another node: {nodes:?}"
    );
    // The node returns: Ready again, its pods with it.
    t.with(|c, now| c.node_up(&holder, now)).expect("node");
    assert!(pods_on(&t, &holder)
        .iter()
        .all(|p| p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")));
}

#[tokio::test]
async fn node_model_api_for_the_integration() {
    let (t, _d) = twin(
        KubeSeed::nodes(3, 1)
            .versions("1.10.6", "1.33.5")
            .node_versions("worker-1", "1.11.3", "1.33.5")
            .longhorn_volume_attached("pvc-db", 1, "worker-1"),
        Behaviour::default(),
    )
    .await;
    let api = Api::new(&t);
    t.with(|c, now| {
        c.set_kubelet_version("cp-2", "v1.34.1", now)?;
        c.set_os_image("cp-2", "Talos (v1.11.3)", now)?;
        c.set_node_ready("cp-3", false, now)
    })
    .expect("nodes exist");
    let cp2 = api.get("/api/v1/nodes/cp-2").await;
    assert_eq!(cp2.body["status"]["nodeInfo"]["kubeletVersion"], "v1.34.1");
    assert_eq!(cp2.body["status"]["nodeInfo"]["osImage"], "Talos (v1.11.3)");
    let app = t.with(|c, now| {
        c.set_application_status("argocd", "cilium", "OutOfSync", "Progressing", now)
    });
    assert!(app.is_err(), "no Application in this seed");
    let w1 = api.get("/api/v1/nodes/worker-1").await;
    assert_eq!(w1.body["status"]["nodeInfo"]["osImage"], "Talos (v1.11.3)");
    let vol = api
        .get("/apis/longhorn.io/v1beta2/namespaces/longhorn-system/volumes/pvc-db")
        .await;
    assert_eq!(
        (
            vol.body["status"]["state"].as_str(),
            vol.body["status"]["robustness"].as_str()
        ),
        (Some("attached"), Some("healthy"))
    );
    let cp3 = api.get("/api/v1/nodes/cp-3").await;
    let ready = cp3.body["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["status"], "False");
    let apiserver = api
        .get("/api/v1/namespaces/kube-system/pods/kube-apiserver-cp-1")
        .await;
    assert_eq!(
        apiserver.body["spec"]["containers"][0]["image"],
        "registry.k8s.io/kube-apiserver:v1.33.5"
    );
    assert!(apiserver.body["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string());
    // upsert: a mirror pod with a new image, as the integration does after a NO_REBOOT apply.
    t.with(|c, now| {
        c.upsert_mirror_pod(
            "cp-1",
            "kube-apiserver",
            "registry.k8s.io/kube-apiserver:v1.34.1",
            "2",
            true,
            now,
        )
    })
    .expect("upsert");
    let after = api
        .get("/api/v1/namespaces/kube-system/pods/kube-apiserver-cp-1")
        .await;
    assert_eq!(
        after.body["spec"]["containers"][0]["image"],
        "registry.k8s.io/kube-apiserver:v1.34.1"
    );
    assert_eq!(
        after.body["metadata"]["annotations"]["talos.dev/config-version"],
        "2"
    );
    assert_eq!(after.body["status"]["hostIP"], "10.5.0.11");
}

#[tokio::test]
async fn terminal_pods_are_evicted_without_a_budget_check_and_dry_run_keeps_the_pod() {
    let seed = two_pdbs_seed()
        .pdb_never_allows("default", "web")
        .bare_pod("default", "debug", "worker-1");
    let (t, _d) = twin(seed, Behaviour::default()).await;
    let api = Api::new(&t);
    let evict = |name: &str, dry: bool| {
        let mut body =
            json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}});
        if dry {
            body["deleteOptions"] = json!({"dryRun": ["All"]});
        }
        body
    };
    let mut pods = t.with(|c, _| c.list("pods", Some("default")));
    pods.retain(|p| p["metadata"]["labels"]["app"] == "web");
    let name = pods[0]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let path = format!("/api/v1/namespaces/default/pods/{name}/eviction");
    assert_eq!(
        api.call("POST", &path, None, Some(evict(&name, false)))
            .await
            .code,
        429,
        "the configured fault holds"
    );
    // The pod finished: a terminal pod goes without asking the budget.
    let mut done = pods[0].clone();
    done["status"]["phase"] = json!("Succeeded");
    t.with(|c, now| c.upsert(done, now)).expect("upsert");
    let r = api
        .call("POST", &path, None, Some(evict(&name, false)))
        .await;
    assert_eq!(r.code, 201, "{}", r.text);
    // No PDB covers the bare pod: dry run answers 201 and keeps it.
    let dry = api
        .call(
            "POST",
            "/api/v1/namespaces/default/pods/debug/eviction",
            None,
            Some(evict("debug", true)),
        )
        .await;
    assert_eq!(dry.code, 201);
    assert!(t.with(|c, _| c.get("pods", "default", "debug")).is_some());
}

#[tokio::test]
async fn watch_with_initial_events_and_metadata_only_lists() {
    let (t, _d) = twin(KubeSeed::nodes(1, 2), Behaviour::default()).await;
    let api = Api::new(&t);
    let resp = api
        .send("GET", "/api/v1/nodes?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", None, String::new())
        .await;
    let mut body = resp.into_body();
    let mut buf = String::new();
    let evs = read_events(&mut body, &mut buf, 4).await;
    let types: Vec<&str> = evs
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(types, ["ADDED", "ADDED", "ADDED", "BOOKMARK"]);
    assert_eq!(
        evs[3]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // A node going NotReady shows on the watch and leaves an Event.
    t.with(|c, now| c.set_node_ready("worker-2", false, now))
        .expect("node");
    let evs = read_events(&mut body, &mut buf, 1).await;
    assert_eq!(
        (
            evs[0]["type"].as_str(),
            evs[0]["object"]["metadata"]["name"].as_str()
        ),
        (Some("MODIFIED"), Some("worker-2"))
    );
    let events = api
        .get("/api/v1/namespaces/default/events?fieldSelector=reason%3DNodeNotReady")
        .await;
    assert_eq!(
        events.body["items"][0]["involvedObject"]["name"],
        "worker-2"
    );

    // `kubectl get -w` asks for Tables: each watch event carries a one-row Table.
    let resp = api
        .send_accepting(
            "GET",
            "/api/v1/nodes?watch=1",
            None,
            Some("application/json;as=Table;v=v1;g=meta.k8s.io"),
            String::new(),
        )
        .await;
    let mut tbody = resp.into_body();
    let mut tbuf = String::new();
    let first = read_events(&mut tbody, &mut tbuf, 1)
        .await
        .pop()
        .unwrap_or_default();
    assert_eq!(first["object"]["kind"], "Table");
    assert_eq!(first["object"]["rows"][0]["cells"][0], "cp-1");

    let meta = api
        .call_with_accept(
            "/api/v1/nodes",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
        .await;
    assert_eq!(meta.body["kind"], "PartialObjectMetadataList");
    assert_eq!(meta.body["items"][0]["kind"], "PartialObjectMetadata");
    assert_eq!(meta.body["items"][0]["metadata"]["name"], "cp-1");
    assert!(meta.body["items"][0].get("status").is_none());
}

#[tokio::test]
async fn evicted_pods_terminate_for_their_grace_period_while_a_replacement_starts() {
    let behaviour = Behaviour {
        pod_termination: Duration::from_secs(30),
        ..Behaviour::default()
    };
    let (t, _d) = twin(two_pdbs_seed(), behaviour).await;
    let api = Api::new(&t);
    let name = t.with(|c, _| c.list("pods", Some("default")))[0]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let r = api
        .call(
            "POST",
            &format!("/api/v1/namespaces/default/pods/{name}/eviction"),
            None,
            Some(
                json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}),
            ),
        )
        .await;
    assert_eq!(r.code, 201);
    let pod = api
        .get(&format!("/api/v1/namespaces/default/pods/{name}"))
        .await;
    assert_eq!(pod.code, 200, "still there, terminating");
    assert!(pod.body["metadata"]["deletionTimestamp"].is_string());
    let pods = t.with(|c, _| c.list("pods", Some("default")));
    assert_eq!(
        pods.len(),
        4,
        "the replacement exists while the old pod terminates"
    );
    let pdb = api
        .get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/web")
        .await;
    assert_eq!(
        (
            pdb.body["status"]["currentHealthy"].as_u64(),
            pdb.body["status"]["disruptionsAllowed"].as_u64()
        ),
        (Some(2), Some(0))
    );
    t.clock().advance(Duration::from_secs(30));
    t.sync();
    assert_eq!(
        api.get(&format!("/api/v1/namespaces/default/pods/{name}"))
            .await
            .code,
        404
    );
    let healthy = api
        .get("/apis/policy/v1/namespaces/default/poddisruptionbudgets/web")
        .await;
    assert_eq!(healthy.body["status"]["currentHealthy"], 3);
    // An explicit zero grace period deletes at once.
    let other = t.with(|c, _| c.list("pods", Some("default")))[0]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let del = api
        .call(
            "DELETE",
            &format!("/api/v1/namespaces/default/pods/{other}?gracePeriodSeconds=0"),
            None,
            None,
        )
        .await;
    assert_eq!(del.code, 200);
    assert_eq!(
        api.get(&format!("/api/v1/namespaces/default/pods/{other}"))
            .await
            .code,
        404
    );
}

#[tokio::test]
async fn local_path_pods_come_back_only_on_their_own_node() {
    let seed = KubeSeed::nodes(1, 3).statefulset_with_local_storage("db", "pg", 2);
    let (t, _d) = twin(seed, instant_deletion()).await;
    let pod = |name: &str| t.with(|c, _| c.get("pods", "db", name)).unwrap_or_default();
    assert_eq!(pod("pg-0")["spec"]["nodeName"], "worker-1");
    assert_eq!(pod("pg-1")["spec"]["nodeName"], "worker-2");
    assert_eq!(
        pod("pg-0")["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "data-pg-0"
    );
    let pv = t
        .with(|c, _| c.get("persistentvolumes", "", "pvc-db-pg-0"))
        .unwrap_or_default();
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
            ["values"][0],
        "worker-1"
    );
    // Cordoned and drained: the pod cannot start anywhere else.
    t.with(|c, now| c.set_unschedulable("worker-1", true, now))
        .expect("node");
    t.with(|c, now| c.delete("pods", "db", "pg-0", now))
        .expect("delete");
    t.clock().advance(Duration::from_secs(60));
    t.sync();
    assert_eq!(pod("pg-0")["status"]["phase"], "Pending");
    t.with(|c, now| c.set_unschedulable("worker-1", false, now))
        .expect("node");
    assert_eq!(pod("pg-0")["status"]["phase"], "Running");
    assert_eq!(pod("pg-0")["spec"]["nodeName"], "worker-1");
}

#[tokio::test]
async fn a_watch_with_a_selector_sees_objects_leave_and_enter_it() {
    let (t, _d) = twin(two_pdbs_seed(), Behaviour::default()).await;
    let api = Api::new(&t);
    let resp = api
        .send(
            "GET",
            "/api/v1/namespaces/default/pods?watch=1&labelSelector=app%3Dweb",
            None,
            String::new(),
        )
        .await;
    let mut body = resp.into_body();
    let mut buf = String::new();
    let initial = read_events(&mut body, &mut buf, 3).await;
    assert!(initial.iter().all(|e| e["type"] == "ADDED"));
    let name = initial[0]["object"]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let path = format!("/api/v1/namespaces/default/pods/{name}");
    let relabel = |app: &str| json!({"metadata": {"labels": {"app": app}}});
    api.call(
        "PATCH",
        &path,
        Some("application/merge-patch+json"),
        Some(relabel("debug")),
    )
    .await;
    let left = read_events(&mut body, &mut buf, 1).await;
    assert_eq!(
        (
            left[0]["type"].as_str(),
            left[0]["object"]["metadata"]["name"].as_str()
        ),
        (Some("DELETED"), Some(name.as_str()))
    );
    // The twin's ReplicaSet owns pods by reference, so no replacement appears; relabelling
    // back brings the pod into the watch again.
    api.call(
        "PATCH",
        &path,
        Some("application/merge-patch+json"),
        Some(relabel("web")),
    )
    .await;
    let back = read_events(&mut body, &mut buf, 1).await;
    assert_eq!(
        (
            back[0]["type"].as_str(),
            back[0]["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some(name.as_str()))
    );
}

#[tokio::test]
async fn malformed_objects_are_refused_not_crashing_the_server() {
    let (t, _d) = twin(KubeSeed::nodes(1, 1), Behaviour::default()).await;
    let api = Api::new(&t);
    let cms = "/api/v1/namespaces/default/configmaps";
    for body in [
        json!([1, 2]),
        json!({"metadata": "x"}),
        json!({"metadata": {"name": "a", "labels": {"n": 1}}}),
        json!({"metadata": {"name": "a"}, "status": 3}),
    ] {
        let r = api.call("POST", cms, None, Some(body.clone())).await;
        assert_eq!(r.code, 400, "{body}: {}", r.text);
    }
    let node = "/api/v1/nodes/worker-1";
    let r = api
        .call(
            "PATCH",
            node,
            Some("application/merge-patch+json"),
            Some(json!({"metadata": "gone"})),
        )
        .await;
    assert_eq!(r.code, 422, "{}", r.text);
    let r = api
        .call(
            "PATCH",
            node,
            Some("application/merge-patch+json"),
            Some(json!(["not", "an", "object"])),
        )
        .await;
    assert_eq!(r.code, 422, "{}", r.text);
    // A client-made odd status shape does not trip the model later.
    let r = api
        .call(
            "PATCH",
            &format!("{node}/status"),
            Some("application/merge-patch+json"),
            Some(json!({"status": {"nodeInfo": "odd"}})),
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.text);
    t.with(|c, now| c.set_kubelet_version("worker-1", "v1.35.0", now))
        .expect("node");
    let n = api.get(node).await;
    assert_eq!(n.body["status"]["nodeInfo"]["kubeletVersion"], "v1.35.0");
    let garbage = api
        .send("POST", cms, Some("application/json"), "{not json".into())
        .await;
    assert_eq!(garbage.status().as_u16(), 400);
    assert_eq!(api.get("/api/v1/nodes").await.code, 200, "still serving");
}

#[tokio::test]
async fn events_k8s_io_events_as_kube_rs_records_them() {
    let (t, _d) = twin(KubeSeed::nodes(1, 1), Behaviour::default()).await;
    let api = Api::new(&t);
    let groups = api.get("/apis").await;
    assert!(groups.body["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|g| g["name"] == "events.k8s.io"));
    let base = "/apis/events.k8s.io/v1/namespaces/kube-system/events";
    let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"generateName": "ichor-"}, "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "ichor", "reportingInstance": "ichor-0", "action": "Rollout",
        "reason": "Started", "type": "Normal", "note": "rollout to v1.35.0 started",
        "regarding": {"kind": "Node", "name": "worker-1", "apiVersion": "v1"}});
    let created = api.call("POST", base, None, Some(ev)).await;
    assert_eq!(created.code, 201, "{}", created.text);
    let name = created.body["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(name.starts_with("ichor-"));
    let series = api
        .call(
            "PATCH",
            &format!("{base}/{name}"),
            Some("application/merge-patch+json"),
            Some(
                json!({"series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}}),
            ),
        )
        .await;
    assert_eq!(series.body["series"]["count"], 2);
    let list = api.get(base).await;
    assert_eq!(list.body["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(list.body["kind"], "EventList");
    assert_eq!(list.body["apiVersion"], "events.k8s.io/v1");
}

// ---- evictions and graceful deletion as the apiserver does them ---------------------------

fn eviction_of(name: &str) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}})
}

#[tokio::test]
async fn eviction_dry_run_query_keeps_the_pod_and_a_mismatched_name_is_400() {
    let seed = KubeSeed::nodes(1, 2).bare_pod("default", "debug", "worker-1");
    let (t, _d) = twin(seed, Behaviour::default()).await;
    let api = Api::new(&t);
    let path = "/api/v1/namespaces/default/pods/debug/eviction";
    // `?dryRun=All` on the URL (kubectl drain --dry-run=server sends it there too).
    let dry = api
        .call(
            "POST",
            &format!("{path}?dryRun=All"),
            None,
            Some(eviction_of("debug")),
        )
        .await;
    assert_eq!(dry.code, 201, "{}", dry.text);
    let pod = api.get("/api/v1/namespaces/default/pods/debug").await;
    assert_eq!(pod.code, 200);
    assert!(
        pod.body["metadata"]["deletionTimestamp"].is_null(),
        "{}",
        pod.text
    );
    // The body names another pod: refused before anything is looked at.
    let wrong = api
        .call("POST", path, None, Some(eviction_of("other")))
        .await;
    assert_eq!(wrong.code, 400, "{}", wrong.text);
    assert_eq!(wrong.body["kind"], "Status");
    assert_eq!(wrong.body["reason"], "BadRequest");
    assert_eq!(
        wrong.body["message"],
        "name in URL does not match name in Eviction object"
    );
    let nameless = api
        .call(
            "POST",
            path,
            None,
            Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {}})),
        )
        .await;
    assert_eq!(nameless.code, 400, "{}", nameless.text);
    assert!(t.with(|c, _| c.get("pods", "default", "debug")).is_some());
    // A real eviction: 201 Created with a Success Status carrying that code.
    let done = api
        .call("POST", path, None, Some(eviction_of("debug")))
        .await;
    assert_eq!(done.code, 201, "{}", done.text);
    assert_eq!(
        (&done.body["kind"], &done.body["status"], &done.body["code"]),
        (&json!("Status"), &json!("Success"), &json!(201))
    );
}

#[tokio::test]
async fn an_evicted_pod_terminates_for_its_own_grace_period_on_the_clock() {
    let seed = KubeSeed::nodes(1, 2).bare_pod("default", "debug", "worker-1");
    let (t, _d) = twin(seed, Behaviour::default()).await;
    let api = Api::new(&t);
    let mut pod = t
        .with(|c, _| c.get("pods", "default", "debug"))
        .unwrap_or_default();
    pod["spec"]["terminationGracePeriodSeconds"] = json!(45);
    t.with(|c, now| c.upsert(pod, now)).expect("upsert");
    let evicted_at = t.clock().now();
    let r = api
        .call(
            "POST",
            "/api/v1/namespaces/default/pods/debug/eviction",
            None,
            Some(eviction_of("debug")),
        )
        .await;
    assert_eq!(r.code, 201, "{}", r.text);
    let get = || api.get("/api/v1/namespaces/default/pods/debug");
    let terminating = get().await;
    assert_eq!(terminating.code, 200, "still listed while it terminates");
    assert_eq!(
        terminating.body["metadata"]["deletionGracePeriodSeconds"],
        45
    );
    assert_eq!(
        terminating.body["metadata"]["deletionTimestamp"],
        json!(evicted_at.plus(Duration::from_secs(45)).rfc3339())
    );
    t.clock().advance(Duration::from_secs(44));
    t.sync();
    assert_eq!(
        get().await.code,
        200,
        "a second before its grace period ends"
    );
    t.clock().advance(Duration::from_secs(1));
    t.sync();
    assert_eq!(get().await.code, 404, "gone once the grace period passed");
    // A pod that does not say waits the apiserver's default, 30 s; a DELETE likewise.
    let web = KubeSeed::nodes(1, 2).deployment("default", "web", 1);
    let (t, _d) = twin(web, Behaviour::default()).await;
    let api = Api::new(&t);
    let name = t.with(|c, _| c.list("pods", Some("default")))[0]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let path = format!("/api/v1/namespaces/default/pods/{name}");
    let del = api.call("DELETE", &path, None, None).await;
    assert_eq!(del.code, 200, "{}", del.text);
    assert_eq!(del.body["metadata"]["deletionGracePeriodSeconds"], 30);
    t.clock().advance(Duration::from_secs(29));
    t.sync();
    assert_eq!(api.get(&path).await.code, 200);
    t.clock().advance(Duration::from_secs(1));
    t.sync();
    assert_eq!(api.get(&path).await.code, 404);
}

fn ready_status(obj: &Value) -> String {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

#[tokio::test]
async fn node_down_keeps_pods_until_the_unreachable_toleration() {
    let seed = KubeSeed::typical(1, 3).bare_pod("default", "debug", "worker-1");
    let (t, _d) = twin(seed, Behaviour::default()).await;
    let api = Api::new(&t);
    let before = pods_on(&t, "worker-1");
    let down_at = t.clock().now();
    t.with(|c, now| c.node_down("worker-1", now)).expect("node");
    let at = |secs: u64| {
        let to = down_at.plus(Duration::from_secs(secs));
        let d = to.since(t.clock().now());
        t.clock().advance(d);
        t.sync();
    };
    let node = || api.get("/api/v1/nodes/worker-1");
    let listed = || async {
        let r = api
            .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dworker-1")
            .await;
        r.body["items"].as_array().cloned().unwrap_or_default()
    };
    // The kubelet is silent, but the node-monitor grace period (40 s) has not passed.
    at(39);
    assert_eq!(ready_status(&node().await.body), "True");
    assert_eq!(
        listed().await.len(),
        before.len(),
        "the pods stay in the API"
    );
    at(40);
    let n = node().await.body;
    assert_ne!(ready_status(&n), "True", "NotReady after the grace period");
    assert_eq!(
        n["spec"]["taints"][0]["key"],
        "node.kubernetes.io/unreachable"
    );
    assert_eq!(n["spec"]["taints"][0]["effect"], "NoExecute");
    let pods = listed().await;
    assert_eq!(pods.len(), before.len(), "still listed, not Ready");
    assert!(pods
        .iter()
        .filter(|p| owner_kind(p) != "DaemonSet")
        .all(|p| ready_status(p) == "False" && p["metadata"]["deletionTimestamp"].is_null()));
    // 300 s of toleration after the taint: a second before, nothing is deleted.
    at(339);
    assert!(listed()
        .await
        .iter()
        .all(|p| p["metadata"]["deletionTimestamp"].is_null()));
    at(340);
    let pods = listed().await;
    let debug = pods.iter().find(|p| p["metadata"]["name"] == "debug");
    assert!(
        debug.is_some_and(|p| p["metadata"]["deletionTimestamp"].is_string()),
        "the taint-based eviction deletes it gracefully: {debug:?}"
    );
    assert!(pods
        .iter()
        .filter(|p| owner_kind(p) == "DaemonSet")
        .all(|p| p["metadata"]["deletionTimestamp"].is_null()));
    assert!(pods.iter().any(|p| owner_kind(p) == "DaemonSet"));
    // A reboot shorter than the grace period is never seen as NotReady.
    let (t, _d) = twin(KubeSeed::typical(1, 3), Behaviour::default()).await;
    t.with(|c, now| c.node_down("worker-2", now)).expect("node");
    t.clock().advance(Duration::from_secs(30));
    t.with(|c, now| c.node_up("worker-2", now)).expect("node");
    t.clock().advance(Duration::from_secs(400));
    t.sync();
    let n = t
        .with(|c, _| c.get("nodes", "", "worker-2"))
        .unwrap_or_default();
    assert_eq!(ready_status(&n), "True");
    assert!(n["spec"]["taints"].is_null(), "{n}");
    assert!(pods_on(&t, "worker-2")
        .iter()
        .all(|p| p["metadata"]["deletionTimestamp"].is_null()));
}

// ---- what a controller's pre-flight asks ------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_reviews_and_the_preflight_resources_are_served() {
    let (t, _dir) = twin(KubeSeed::nodes(1, 1), Behaviour::default()).await;
    let api = Api::new(&t);
    // Over the wire: a review comes back allowed, with 201 and nothing stored.
    let r = api
        .call(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            None,
            Some(
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                        "spec": {"resourceAttributes": {"verb": "list", "resource": "nodes"}}}),
            ),
        )
        .await;
    assert_eq!(r.code, 201, "{}", r.text);
    assert_eq!(r.body["status"]["allowed"], true);
    assert_eq!(r.body["spec"]["resourceAttributes"]["resource"], "nodes");
    let empty = api
        .call(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            None,
            Some(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {}})),
        )
        .await;
    assert_eq!(empty.code, 422, "{}", empty.text);
    let listed = api
        .get("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
        .await;
    assert_eq!(listed.code, 405);
    for path in [
        "/apis/storage.k8s.io/v1/volumeattachments",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
        "/api/v1/namespaces/default/services",
        "/api/v1/namespaces/default/secrets",
        "/api/v1/namespaces/default/serviceaccounts",
    ] {
        let l = api.get(path).await;
        assert_eq!(l.code, 200, "{path}: {}", l.text);
        assert!(l.body["items"].is_array(), "{path}: {}", l.text);
    }
    let groups = api.get("/apis").await;
    for g in [
        "authorization.k8s.io",
        "storage.k8s.io",
        "rbac.authorization.k8s.io",
    ] {
        assert!(
            groups.body["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|x| x["name"] == g),
            "{g} in discovery"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn kubectl_auth_can_i_and_gets_the_preflight_resources() {
    let (t, dir) = twin(KubeSeed::nodes(1, 1), Behaviour::default()).await;
    let cache = dir.path().join("cache");
    let yes = kubectl(&t.kubeconfig, &cache, &["auth", "can-i", "list", "nodes"]).await;
    assert!(
        yes.ok && yes.stdout.trim() == "yes",
        "{}{}",
        yes.stdout,
        yes.stderr
    );
    let va = kubectl(&t.kubeconfig, &cache, &["get", "volumeattachments"]).await;
    assert!(va.ok, "{}", va.stderr);
    let sa = kubectl(&t.kubeconfig, &cache, &["get", "sa,svc,secrets", "-A"]).await;
    assert!(sa.ok, "{}", sa.stderr);
    let rbac = kubectl(&t.kubeconfig, &cache, &["get", "clusterroles"]).await;
    assert!(rbac.ok, "{}", rbac.stderr);
}

#[tokio::test]
async fn the_date_header_comes_from_the_twins_clock_as_object_times_do() {
    let (t, _d) = twin(KubeSeed::nodes(1, 1), Behaviour::default()).await;
    let api = Api::new(&t);
    // The manual clock starts at Thursday 2026-01-01T00:00:00Z.
    t.clock().advance(Duration::from_secs(86_400 + 3_723));
    let r = api
        .call(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            None,
            Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})),
        )
        .await;
    assert_eq!(r.code, 201, "{}", r.text);
    assert_eq!(
        r.body["metadata"]["creationTimestamp"],
        "2026-01-02T01:02:03Z"
    );
    assert_eq!(
        r.headers.get("date").and_then(|v| v.to_str().ok()),
        Some("Fri, 02 Jan 2026 01:02:03 GMT")
    );
}

#[tokio::test]
async fn node_heartbeats_move_with_the_clock_until_the_node_goes_silent() {
    let (t, _d) = twin(KubeSeed::nodes(1, 2), Behaviour::default()).await;
    let api = Api::new(&t);
    let lease = |name: &str| {
        t.with(|c, _| c.get("leases", "kube-node-lease", name))
            .and_then(|l| l["spec"]["renewTime"].as_str().map(String::from))
            .unwrap_or_default()
    };
    let start = lease("worker-1");
    assert_eq!(start, "2026-01-01T00:00:00.000000Z");
    t.clock().advance(Duration::from_secs(25));
    assert_eq!(lease("worker-1"), "2026-01-01T00:00:25.000000Z");
    // Condition heartbeats follow the 5-minute status report.
    let beat = |n: &Value| {
        n["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["lastHeartbeatTime"].as_str())
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(
        beat(&api.get("/api/v1/nodes/worker-1").await.body),
        "2026-01-01T00:00:00Z"
    );
    t.clock().advance(Duration::from_secs(300));
    assert_eq!(
        beat(&api.get("/api/v1/nodes/worker-1").await.body),
        "2026-01-01T00:05:25Z"
    );
    // A silent node's kubelet renews nothing.
    t.with(|c, now| c.node_down("worker-2", now)).expect("node");
    let silent_from = lease("worker-2");
    t.clock().advance(Duration::from_secs(60));
    assert_eq!(lease("worker-2"), silent_from);
    assert_eq!(lease("worker-1"), "2026-01-01T00:06:25.000000Z");
}

/// The kube-proxy DaemonSet as Talos's bootstrap manifest `10-kube-proxy` holds it.
fn kube_proxy_manifest(image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: kube-proxy\n  namespace: kube-system\n  labels:\n    k8s-app: kube-proxy\nspec:\n  selector:\n    matchLabels:\n      k8s-app: kube-proxy\n  template:\n    metadata:\n      labels:\n        k8s-app: kube-proxy\n    spec:\n      containers:\n        - name: kube-proxy\n          image: {image}\n"
    )
}

#[tokio::test]
async fn the_bootstrap_manifest_sync_rolls_kube_proxy_node_by_node_over_http() {
    let (t, _d) = twin(KubeSeed::typical(1, 3), Behaviour::default()).await;
    let api = Api::new(&t);
    let path = "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy";
    let sync = |image: &str| {
        let body = kube_proxy_manifest(image);
        let api = &api;
        async move {
            api.send(
                "PATCH",
                &format!("{path}?fieldManager=talos&force=true"),
                Some("application/apply-patch+yaml"),
                body,
            )
            .await
            .status()
            .as_u16()
        }
    };
    let status = |r: &Reply| {
        let n = |k: &str| r.body["status"][k].as_u64().unwrap_or(99);
        (
            n("updatedNumberScheduled"),
            n("numberReady"),
            n("numberUnavailable"),
        )
    };
    let images = |t: &KubeTwin| -> Vec<String> {
        let mut v: Vec<String> = t
            .with(|c, _| c.list("pods", Some("kube-system")))
            .iter()
            .filter(|p| p["metadata"]["labels"]["k8s-app"] == "kube-proxy")
            .map(|p| {
                p["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        v.sort();
        v
    };
    let new = "registry.k8s.io/kube-proxy:v1.35.0";
    assert_eq!(sync(new).await, 200);
    let ds = api.get(path).await;
    assert_eq!(
        ds.body["spec"]["template"]["spec"]["containers"][0]["image"],
        new
    );
    let managers: Vec<&str> = ds.body["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["manager"].as_str())
        .collect();
    assert!(managers.contains(&"talos"), "{managers:?}");
    // One node at a time: one pod replaced, three old ones still Ready — said by the status
    // once it has observed the new generation, a moment after the spec.
    let generation = ds.body["metadata"]["generation"].clone();
    assert_eq!(generation, 2, "a new template is a new generation");
    assert_eq!(ds.body["status"]["observedGeneration"], 1);
    t.clock().advance(Duration::from_secs(2));
    t.sync();
    let ds = api.get(path).await;
    assert_eq!(ds.body["status"]["observedGeneration"], generation);
    assert_eq!(status(&ds), (1, 3, 1));
    for step in 2..=4 {
        t.clock().advance(Duration::from_secs(10));
        t.sync();
        let ds = api.get(path).await;
        assert_eq!(status(&ds), (step, 3, 1), "step {step}");
    }
    t.clock().advance(Duration::from_secs(10));
    t.sync();
    assert_eq!(status(&api.get(path).await), (4, 4, 0));
    assert_eq!(images(&t), vec![new.to_string(); 4]);
    // maxUnavailable 50% of 4 nodes: two at a time.
    let widened = api
        .call(
            "PATCH",
            path,
            Some("application/merge-patch+json"),
            Some(json!({"spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}}}})),
        )
        .await;
    assert_eq!(widened.code, 200, "{}", widened.text);
    let newer = "registry.k8s.io/kube-proxy:v1.35.1";
    assert_eq!(sync(newer).await, 200);
    t.clock().advance(Duration::from_secs(2));
    t.sync();
    assert_eq!(status(&api.get(path).await), (2, 2, 2));
    t.clock().advance(Duration::from_secs(10));
    t.sync();
    assert_eq!(status(&api.get(path).await), (4, 2, 2));
    t.clock().advance(Duration::from_secs(10));
    t.sync();
    assert_eq!(status(&api.get(path).await), (4, 4, 0));
    // OnDelete: a new image replaces nothing until a pod is deleted.
    let on_delete = api
        .call(
            "PATCH",
            path,
            Some("application/merge-patch+json"),
            Some(json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}})),
        )
        .await;
    assert_eq!(on_delete.code, 200, "{}", on_delete.text);
    let newest = "registry.k8s.io/kube-proxy:v1.35.2";
    assert_eq!(sync(newest).await, 200);
    t.clock().advance(Duration::from_secs(60));
    t.sync();
    assert_eq!(status(&api.get(path).await), (0, 4, 0));
    assert_eq!(images(&t), vec![newer.to_string(); 4]);
}

async fn vas(api: &Api) -> Vec<Value> {
    let l = api.get("/apis/storage.k8s.io/v1/volumeattachments").await;
    l.body["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn volume_attachments_come_and_go_with_the_pod_using_the_claim() {
    let (t, _d) = twin(
        KubeSeed::nodes(1, 2).longhorn_volume_attached("pvc-db", 1, "worker-1"),
        Behaviour::default(),
    )
    .await;
    let api = Api::new(&t);
    let list = vas(&api).await;
    assert_eq!(list.len(), 1, "{list:?}");
    let va = &list[0];
    assert_eq!(va["spec"]["attacher"], "driver.longhorn.io");
    assert_eq!(va["spec"]["nodeName"], "worker-1");
    assert_eq!(va["spec"]["source"]["persistentVolumeName"], "pvc-db");
    assert_eq!(va["status"]["attached"], true);
    // The name Kubernetes gives it: csi-<sha256(volume handle + driver + node)>.
    use sha2::Digest;
    let want = format!(
        "csi-{}",
        hex::encode(sha2::Sha256::digest(b"pvc-dbdriver.longhorn.ioworker-1"))
    );
    assert_eq!(va["metadata"]["name"], want.as_str());
    // A second pod on another node wants the ReadWriteOnce volume: it waits, unattached.
    let second = api
        .call(
            "POST",
            "/api/v1/namespaces/default/pods",
            None,
            Some(json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "second", "namespace": "default"},
                        "spec": {"nodeName": "worker-2",
                                 "containers": [{"name": "c", "image": "registry.example/c:1"}],
                                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "pvc-db"}}]}})),
        )
        .await;
    assert_eq!(second.code, 201, "{}", second.text);
    t.clock().advance(Duration::from_secs(20));
    t.sync();
    let phase = |t: &KubeTwin, name: &str| {
        t.with(|c, _| c.get("pods", "default", name))
            .map(|p| p["status"]["phase"].clone())
    };
    assert_eq!(
        phase(&t, "second"),
        Some(json!("Pending")),
        "Multi-Attach wait"
    );
    assert_eq!(vas(&api).await.len(), 1, "never attached to two nodes");
    t.with(|c, now| c.delete("pods", "default", "second", now))
        .expect("delete");
    // The pod goes (gracefully, 30 s); 10 s after it is gone, so is the attachment.
    t.with(|c, now| c.delete("pods", "default", "pvc-db-user", now))
        .expect("delete");
    t.clock().advance(Duration::from_secs(30));
    t.sync();
    assert!(t
        .with(|c, _| c.get("pods", "default", "pvc-db-user"))
        .is_none());
    assert_eq!(vas(&api).await.len(), 1, "still detaching");
    t.clock().advance(Duration::from_secs(9));
    t.sync();
    assert_eq!(vas(&api).await.len(), 1);
    t.clock().advance(Duration::from_secs(1));
    t.sync();
    assert!(vas(&api).await.is_empty());
    let vol = api
        .get("/apis/longhorn.io/v1beta2/namespaces/longhorn-system/volumes/pvc-db")
        .await;
    assert_eq!(vol.body["status"]["state"], "detached", "{}", vol.text);
    // A VolumeAttachment for a volume the twin knows nothing of is left alone.
    let created = api
        .call(
            "POST",
            "/apis/storage.k8s.io/v1/volumeattachments",
            None,
            Some(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                        "metadata": {"name": "csi-manual"},
                        "spec": {"attacher": "other.csi.example", "nodeName": "worker-2",
                                 "source": {"persistentVolumeName": "pv-elsewhere"}},
                        "status": {"attached": true}}),
            ),
        )
        .await;
    assert_eq!(created.code, 201, "{}", created.text);
    t.clock().advance(Duration::from_secs(600));
    t.sync();
    assert_eq!(vas(&api).await.len(), 1);
}
