//! Health checks (`spec.healthChecks`) end to end: CEL over objects made with real
//! `kubectl apply` in the twin, PromQL against a real Prometheus scraping the twin's
//! `/_twin/metrics`, and the rollout's `between` gate pausing and resuming on them.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ichor::clock::{Clock, Timestamp};
use ichor::health::{HealthCheck, Reading};
use ichor::prometheus::Credential;
use ichor::rollout::health::read_check;
use ichor::rollout::RunOutcome;
use ichor::sim::twin::TwinConfig;
use serde_json::{json, Value};

use crate::rollout::{paused, run_alongside, setup, Lines, Setup};

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Error = Box<dyn std::error::Error>;

/// Real kubectl against the twin, `input` on its stdin; on a blocking thread, so the twin
/// keeps answering meanwhile.
async fn kubectl(s: &Setup, args: &[&str], input: Option<&str>) -> Result<String, Error> {
    // A person's command is one moment of the cluster's time, however long kubectl takes
    // to start on a loaded machine: the twin's clock waits for it.
    let _busy = s.twin.clock.busy();
    let kubeconfig = s.twin.kubeconfig().to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let input = input.map(str::to_string);
    let kubectl_path = crate::tools::KUBECTL.path();
    tokio::task::spawn_blocking(move || -> Result<String, String> {
        let cache = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(kubectl_path);
        cmd.arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(cache.path())
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            use std::io::Write;
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("kubectl {}: {text}", args.join(" ")))
        }
    })
    .await?
    .map_err(Into::into)
}

const CNPG: &str = r#"apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata:
  name: main
  namespace: ichor-system
  labels: {app: pg}
spec:
  instances: 3
"#;

fn config_map(ok: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: db-state\n  namespace: ichor-system\n  labels: {{app: pg}}\ndata:\n  ok: \"{ok}\"\n"
    )
}

fn cnpg_status(ready: u32) -> String {
    json!({"status": {"readyInstances": ready, "phase": "Cluster in healthy state"}}).to_string()
}

/// One check from its YAML entry, through the real parser (so it is valid as written).
fn check(entry: &str) -> Result<HealthCheck, Error> {
    let text = format!(
        "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: homelab\nspec:\n  healthChecks:\n{entry}"
    );
    let doc = ichor::releaseset::Cluster::parse("cluster.yaml", &text)?;
    Ok(doc.spec.health_checks[0].clone())
}

fn kubernetes_check(target: &str, expression: &str) -> Result<HealthCheck, Error> {
    check(&format!(
        "    - name: t\n      kubernetes:\n{target}        expression: '{expression}'\n"
    ))
}

const CNPG_MAIN: &str = "        apiVersion: postgresql.cnpg.io/v1\n        kind: Cluster\n        namespace: ichor-system\n        name: main\n";
const READY_ALL: &str = "object.status.readyInstances == object.spec.instances";

async fn read(s: &Setup, c: &HealthCheck) -> Reading {
    read_check(&s.kube, None, c, s.twin.talos.clock().now()).await
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn cel_reads_a_cnpg_cluster_and_a_config_map_made_with_kubectl() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let out = kubectl(&s, &["apply", "-f", "-"], Some(CNPG)).await?;
    assert!(
        out.contains("cluster.postgresql.cnpg.io/main created"),
        "{out}"
    );
    let out = kubectl(
        &s,
        &["get", "clusters.postgresql.cnpg.io", "-n", "ichor-system"],
        None,
    )
    .await?;
    assert!(out.contains("main"), "{out}");
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let ready = kubernetes_check(CNPG_MAIN, READY_ALL)?;

    // No status yet: the field is missing, which is an error of the expression, not a pass.
    let r = read(&s, &ready).await;
    assert!(!r.passes() && r.value.starts_with("error:"), "{r:?}");
    let guarded = kubernetes_check(
        CNPG_MAIN,
        "has(object.status) && has(object.status.readyInstances) && object.status.readyInstances == object.spec.instances",
    )?;
    assert_eq!(read(&s, &guarded).await.value, "false");

    // The operator reports two of three ready, then three (the status subresource).
    for (n, want) in [(2, false), (3, true)] {
        kubectl(
            &s,
            &[
                "patch",
                "clusters.postgresql.cnpg.io",
                "main",
                "-n",
                "ichor-system",
                "--subresource=status",
                "--type=merge",
                "-p",
                &cnpg_status(n),
            ],
            None,
        )
        .await?;
        let r = read(&s, &ready).await;
        assert_eq!(r.passes(), want, "{n} ready: {r:?}");
        assert!(
            r.read.contains("ichor-system/main")
                && r.read.contains(&format!("\"readyInstances\":{n}")),
            "{r:?}"
        );
    }

    // A ConfigMap by label selector: every match must pass.
    let by_label = kubernetes_check(
        "        apiVersion: v1\n        kind: ConfigMap\n        namespace: ichor-system\n        labelSelector: app=pg\n",
        "object.data.ok == \"true\"",
    )?;
    assert!(read(&s, &by_label).await.passes());
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("false"))).await?;
    let r = read(&s, &by_label).await;
    assert_eq!(r.value, "false", "{r:?}");

    // Missing: no such object, and no such kind.
    let missing = kubernetes_check(
        "        apiVersion: v1\n        kind: ConfigMap\n        namespace: ichor-system\n        name: nope\n",
        "true",
    )?;
    assert_eq!(read(&s, &missing).await.value, "no such object");
    let no_kind = kubernetes_check(
        "        apiVersion: example.com/v1\n        kind: Widget\n        name: w\n",
        "true",
    )?;
    let r = read(&s, &no_kind).await;
    assert!(!r.passes() && r.value.contains("not served"), "{r:?}");

    // Only a bool passes.
    let number = kubernetes_check(CNPG_MAIN, "object.status.readyInstances")?;
    let r = read(&s, &number).await;
    assert!(r.value.contains("gave a int, not a bool"), "{r:?}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn a_flapping_object_counts_only_after_holding_for_stable_for() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let c = check(
        "    - name: flappy\n      stableFor: 1m\n      kubernetes:\n        apiVersion: v1\n        kind: ConfigMap\n        namespace: ichor-system\n        name: db-state\n        expression: 'object.data.ok == \"true\"'\n",
    )?;
    let clock = s.twin.talos.clock().clone();
    let mut run = ichor::health::Run::default();
    let mut verdict = |r: &Reading, now: Timestamp| {
        ichor::health::judge_stability(r, &mut run, c.stable_for.as_duration(), c.error_limit, now)
    };
    use ichor::health::Verdict;
    let r = read(&s, &c).await;
    assert!(matches!(verdict(&r, clock.now()), Verdict::Settling(_)));
    s.twin.advance(Duration::from_secs(40));
    // It flaps: false for a moment, then true again.
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("false"))).await?;
    let r = read(&s, &c).await;
    assert_eq!(verdict(&r, clock.now()), Verdict::Fails);
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let r = read(&s, &c).await;
    assert_eq!(
        verdict(&r, clock.now()),
        Verdict::Settling(Duration::from_secs(60)),
        "a flap starts stableFor over"
    );
    s.twin.advance(Duration::from_secs(30));
    let r = read(&s, &c).await;
    assert!(matches!(verdict(&r, clock.now()), Verdict::Settling(_)));
    s.twin.advance(Duration::from_secs(30));
    let r = read(&s, &c).await;
    assert_eq!(verdict(&r, clock.now()), Verdict::Holds);
    Ok(())
}

#[test]
fn a_bad_expression_is_an_error_of_cluster_yaml_with_its_line() {
    let text = "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: homelab\nspec:\n  healthChecks:\n    - name: postgres-ready\n      kubernetes:\n        apiVersion: postgresql.cnpg.io/v1\n        kind: Cluster\n        namespace: db\n        name: main\n        expression: 'object.status.readyInstances =='\n";
    let e = ichor::releaseset::Cluster::parse("clusters/homelab/cluster.yaml", text)
        .expect_err("refused");
    let shown = e.to_string();
    assert!(
        shown.starts_with("clusters/homelab/cluster.yaml:13:"),
        "{shown}"
    );
    assert!(shown.contains("does not compile"), "{shown}");
}

// ---- Prometheus ----------------------------------------------------------------------

/// A real Prometheus on loopback, scraping the twin every second; stopped on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn start_prometheus(s: &Setup) -> Result<Prometheus, Error> {
    let dir = tempfile::tempdir()?;
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &s.twin.kube.ca_pem)?;
    let token = dir.path().join("token");
    std::fs::write(&token, s.twin.kube.token())?;
    let target = s.twin.kube.url.trim_start_matches("https://").to_string();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: twin\n    scheme: https\n    metrics_path: /_twin/metrics\n    authorization:\n      credentials_file: {}\n    tls_config:\n      ca_file: {}\n    static_configs:\n      - targets: ['{target}']\n",
        token.display(),
        ca.display()
    );
    let config_file = dir.path().join("prometheus.yml");
    std::fs::write(&config_file, config)?;
    let port = free_port()?;
    let log = std::fs::File::create(dir.path().join("prometheus.log"))?;
    let child = Command::new(crate::tools::PROMETHEUS.path())
        .arg(format!("--config.file={}", config_file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let p = Prometheus {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    };
    // Ready once it has scraped the twin: `up` answers 1 (an observable condition).
    wait_for(&p, "up{job=\"twin\"} == 1").await?;
    Ok(p)
}

/// Poll the query API until `query` has a sample (bounded: 60 tries, 0.5 s apart, real
/// time, since Prometheus scrapes on the wall clock).
async fn wait_for(p: &Prometheus, query: &str) -> Result<(), Error> {
    for _ in 0..60 {
        if let Ok(a) = ichor::prometheus::query(&p.url, query, None, Duration::from_secs(2)).await {
            let r = ichor::health::judge_prometheus(a.status, &a.body, Clock::system().now(), None);
            if r.passes() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = std::fs::read_to_string(p._dir.path().join("prometheus.log")).unwrap_or_default();
    Err(format!(
        "Prometheus never answered `{query}`; its log ends:\n{}",
        log.lines().rev().take(15).collect::<Vec<_>>().join("\n")
    )
    .into())
}

async fn set_gauge(s: &Setup, name: &str, value: Value) -> TestResult {
    let req = http::Request::post("/_twin/gauges")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({"name": name, "value": value}))?)?;
    s.raw.request_text(req).await?;
    Ok(())
}

fn prometheus_check(url: &str, query: &str, max_age: Option<&str>) -> Result<HealthCheck, Error> {
    check(&format!(
        "    - name: p\n      prometheus:\n        url: {url}\n        query: '{query}'\n{}",
        max_age
            .map(|a| format!("        maxSampleAge: {a}\n"))
            .unwrap_or_default()
    ))
}

async fn ask(s: &Setup, c: &HealthCheck, now: Timestamp) -> Reading {
    read_check(&s.kube, None, c, now).await
}

#[tokio::test]
#[ignore = "needs prometheus: scripts/test installs it"]
async fn promql_is_judged_from_a_real_prometheus_scraping_the_twin() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    set_gauge(&s, "ceph_health_status", json!(0)).await?;
    let p = start_prometheus(&s).await?;
    wait_for(&p, "ichor_twin_gauge{name=\"ceph_health_status\"}").await?;
    let wall = || Clock::system().now();

    // Pass: at least one sample.
    let ceph_ok = prometheus_check(
        &p.url,
        "ichor_twin_gauge{name=\"ceph_health_status\"} == 0",
        Some("2m"),
    )?;
    let r = ask(&s, &ceph_ok, wall()).await;
    assert!(r.passes(), "{r:?}");
    assert_eq!(r.value, "1 sample");

    // The twin's state as kube-state-metrics and Longhorn export it.
    let nodes = s.kube.nodes().await?.len();
    let ready = prometheus_check(
        &p.url,
        "kube_node_status_condition{condition=\"Ready\",status=\"true\"} == 1",
        None,
    )?;
    let r = ask(&s, &ready, wall()).await;
    assert_eq!(r.value, format!("{nodes} samples"), "{r:?}");
    let healthy = prometheus_check(&p.url, "longhorn_volume_robustness == 1", None)?;
    assert!(ask(&s, &healthy, wall()).await.passes());

    // Fail: the gauge moves, Prometheus scrapes it, the result is empty.
    set_gauge(&s, "ceph_health_status", json!(1)).await?;
    wait_for(&p, "ichor_twin_gauge{name=\"ceph_health_status\"} == 1").await?;
    let r = ask(&s, &ceph_ok, wall()).await;
    assert!(!r.passes());
    assert_eq!(r.value, "0 samples");

    // Stale: Prometheus stamps its answer with its wall clock; ichor's clock is 10 min on.
    let any = prometheus_check(
        &p.url,
        "ichor_twin_gauge{name=\"ceph_health_status\"}",
        Some("2m"),
    )?;
    assert!(ask(&s, &any, wall()).await.passes());
    let r = ask(&s, &any, wall().plus(Duration::from_secs(600))).await;
    assert!(!r.passes() && r.value.starts_with("stale:"), "{r:?}");

    // A query Prometheus cannot parse: its 400 bad_data, said as such.
    let bad = prometheus_check(&p.url, "sum(ichor_twin_gauge", None)?;
    let r = ask(&s, &bad, wall()).await;
    assert!(!r.passes());
    assert!(r.value.starts_with("query error bad_data:"), "{r:?}");

    // Nobody listening: said, not hung.
    let port = free_port()?;
    let gone = prometheus_check(&format!("http://127.0.0.1:{port}"), "up", None)?;
    let r = ask(&s, &gone, wall()).await;
    assert!(!r.passes() && r.value.contains("did not answer"), "{r:?}");
    Ok(())
}

#[tokio::test]
#[ignore = "needs prometheus: scripts/test installs it"]
async fn a_failure_query_with_a_sample_is_failed_and_an_answer_that_cannot_judge_is_unknown(
) -> TestResult {
    use ichor::health::Outcome;
    let s = setup(TwinConfig::default()).await?;
    set_gauge(&s, "ceph_health_status", json!(0)).await?;
    let p = start_prometheus(&s).await?;
    wait_for(&p, "ichor_twin_gauge{name=\"ceph_health_status\"} == 0").await?;
    let wall = || Clock::system().now();
    let gauge = "ichor_twin_gauge{name=\"ceph_health_status\"}";
    let mut c = prometheus_check(&p.url, &format!("{gauge} == 0"), None)?;
    if let Some(q) = c.prometheus.as_mut() {
        q.failure_query = Some(format!("{gauge} == 2"));
    }
    // Healthy: the failure query is empty, the query has its sample.
    let r = ask(&s, &c, wall()).await;
    assert_eq!(r.outcome, Outcome::Pass, "{r:?}");

    // Unhealthy (1): failing, worth waiting for.
    set_gauge(&s, "ceph_health_status", json!(1)).await?;
    wait_for(&p, &format!("{gauge} == 1")).await?;
    let r = ask(&s, &c, wall()).await;
    assert_eq!(r.outcome, Outcome::Fail, "{r:?}");

    // Broken (2): the failure query has a sample, failed at once.
    set_gauge(&s, "ceph_health_status", json!(2)).await?;
    wait_for(&p, &format!("{gauge} == 2")).await?;
    let r = ask(&s, &c, wall()).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(r.value.starts_with("failureQuery has 1 sample"), "{r:?}");

    // A failure query Prometheus cannot parse is the cluster.yaml's error, named so.
    if let Some(q) = c.prometheus.as_mut() {
        q.failure_query = Some("sum(up".into());
    }
    let r = ask(&s, &c, wall()).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(
        r.value.starts_with("failureQuery: query error bad_data:"),
        "{r:?}"
    );

    // An answer for another time, or none at all: unknown, never a pass.
    let any = prometheus_check(&p.url, gauge, Some("2m"))?;
    let r = ask(&s, &any, wall().plus(Duration::from_secs(600))).await;
    assert_eq!(r.outcome, Outcome::Unknown, "{r:?}");
    let port = free_port()?;
    let gone = prometheus_check(&format!("http://127.0.0.1:{port}"), "up", None)?;
    let r = ask(&s, &gone, wall()).await;
    assert_eq!(r.outcome, Outcome::Unknown, "{r:?}");
    Ok(())
}

/// The query of docs/health-checks.md's `longhorn-all-healthy` example, as written there.
fn longhorn_example_query() -> Result<String, Error> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/health-checks.md"
    ))?;
    let from = doc
        .find("name: longhorn-all-healthy")
        .ok_or("no Longhorn example")?;
    let line = doc[from..]
        .lines()
        .find_map(|l| l.trim().strip_prefix("query: "))
        .ok_or("the Longhorn example has no query")?;
    Ok(line.trim_matches('\'').to_string())
}

#[tokio::test]
#[ignore = "needs prometheus: scripts/test installs it"]
async fn the_longhorn_example_fails_when_its_metric_is_missing() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let p = start_prometheus(&s).await?;
    wait_for(&p, "longhorn_volume_robustness").await?;
    let wall = || Clock::system().now();
    let query = longhorn_example_query()?;
    // Every volume of the twin healthy: it passes.
    let r = ask(&s, &prometheus_check(&p.url, &query, None)?, wall()).await;
    assert!(r.passes(), "{query}: {r:?}");
    // The metric missing (renamed, not scraped): it does not pass.
    let missing = query.replace(
        "longhorn_volume_robustness",
        "longhorn_volume_robustness_gone",
    );
    let r = ask(&s, &prometheus_check(&p.url, &missing, None)?, wall()).await;
    assert!(!r.passes(), "{missing}: {r:?}");
    assert_eq!(r.value, "0 samples");
    Ok(())
}

// ---- Alertmanager -----------------------------------------------------------------------

struct Alertmanager {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real Alertmanager on loopback, its cluster port off, one receiver that sends nothing.
async fn start_alertmanager() -> Result<Alertmanager, Error> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("alertmanager.yml");
    std::fs::write(
        &config,
        "route:\n  receiver: nowhere\nreceivers:\n  - name: nowhere\n",
    )?;
    let port = free_port()?;
    let log = std::fs::File::create(dir.path().join("alertmanager.log"))?;
    let child = Command::new(crate::tools::ALERTMANAGER.path())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let am = Alertmanager {
        child,
        url: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    };
    // Ready once its API answers (bounded, real time: it is a real process).
    for _ in 0..60 {
        if am_request(&am, "GET", "/api/v2/status", None).await.is_ok() {
            return Ok(am);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let log = std::fs::read_to_string(am._dir.path().join("alertmanager.log")).unwrap_or_default();
    Err(format!("Alertmanager never answered; its log ends:\n{log}").into())
}

/// One call to Alertmanager's API v2, its JSON answer.
async fn am_request(
    am: &Alertmanager,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Value, Error> {
    let req = hyper::Request::builder()
        .method(method)
        .uri(format!("{}{path}", am.url))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(match body {
            Some(b) => serde_json::to_vec(&b)?,
            None => Vec::new(),
        }))?;
    let a = ichor::outbound::call(req, Duration::from_secs(5), 1 << 20).await?;
    if a.status != 200 {
        return Err(format!("HTTP {}: {}", a.status, String::from_utf8_lossy(&a.body)).into());
    }
    Ok(serde_json::from_slice(&a.body).unwrap_or(Value::Null))
}

/// Fire an alert as Prometheus would (POST /api/v2/alerts).
async fn fire(am: &Alertmanager, labels: Value) -> TestResult {
    am_request(
        am,
        "POST",
        "/api/v2/alerts",
        Some(json!([{"labels": labels}])),
    )
    .await?;
    Ok(())
}

fn alertmanager_check(
    url: &str,
    matchers: &[&str],
    include_silenced: bool,
) -> Result<HealthCheck, Error> {
    let list: Vec<String> = matchers.iter().map(|m| format!("'{m}'")).collect();
    check(&format!(
        "    - name: alerts\n      alertmanager:\n        url: {url}\n        matchers: [{}]\n        includeSilenced: {include_silenced}\n",
        list.join(", ")
    ))
}

#[tokio::test]
#[ignore = "needs prometheus-alertmanager: scripts/test installs it"]
async fn an_alertmanager_check_passes_with_no_unsilenced_matching_alert() -> TestResult {
    use ichor::health::Outcome;
    let s = setup(TwinConfig::default()).await?;
    let am = start_alertmanager().await?;
    let wall = Clock::system().now();
    let critical = alertmanager_check(&am.url, &["severity=\"critical\""], false)?;
    let r = ask(&s, &critical, wall).await;
    assert_eq!(r.outcome, Outcome::Pass, "{r:?}");
    assert_eq!(r.value, "0 alerts");

    // A warning matches nothing; a critical alert fails the check, named.
    fire(
        &am,
        json!({"alertname": "DiskFilling", "severity": "warning"}),
    )
    .await?;
    assert!(ask(&s, &critical, wall).await.passes());
    fire(
        &am,
        json!({"alertname": "KubeNodeNotReady", "severity": "critical", "node": "w-1"}),
    )
    .await?;
    let r = ask(&s, &critical, wall).await;
    assert_eq!(r.outcome, Outcome::Fail, "{r:?}");
    assert_eq!(r.value, "1 alert firing");
    assert!(
        r.read.contains("KubeNodeNotReady{") && r.read.contains("node=\"w-1\""),
        "{r:?}"
    );
    // Every matcher must match: another node's alerts are not this check's.
    let other = alertmanager_check(&am.url, &["severity=\"critical\"", "node=\"w-2\""], false)?;
    assert!(ask(&s, &other, wall).await.passes());

    // Silenced: no longer firing for the check, unless it asks for silenced alerts too.
    let now = Clock::system().now().rfc3339();
    let later = Clock::system()
        .now()
        .plus(Duration::from_secs(3600))
        .rfc3339();
    am_request(
        &am,
        "POST",
        "/api/v2/silences",
        Some(json!({"matchers": [{"name": "node", "value": "w-1", "isRegex": false, "isEqual": true}],
                    "startsAt": now, "endsAt": later, "createdBy": "test", "comment": "w-1 reboots"})),
    )
    .await?;
    let r = ask(&s, &critical, wall).await;
    assert_eq!(
        r.outcome,
        Outcome::Pass,
        "a silenced alert does not count: {r:?}"
    );
    let with_silenced = alertmanager_check(&am.url, &["severity=\"critical\""], true)?;
    assert_eq!(ask(&s, &with_silenced, wall).await.outcome, Outcome::Fail);

    // A matcher Alertmanager cannot parse is cluster.yaml's error, failed at once.
    let mut bad = critical.clone();
    if let Some(a) = bad.alertmanager.as_mut() {
        a.matchers = vec!["severity=~\"(\"".into()];
    }
    let r = ask(&s, &bad, wall).await;
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");

    // Nobody listening: unknown, never a pass.
    let gone = alertmanager_check(&format!("http://127.0.0.1:{}", free_port()?), &[], false)?;
    assert_eq!(ask(&s, &gone, wall).await.outcome, Outcome::Unknown);
    Ok(())
}

// ---- the rollout's gate -----------------------------------------------------------------

/// One `between` check on the ConfigMap `db-state`, as cluster.yaml gives it.
fn between_check(timeout: &str) -> Result<HealthCheck, Error> {
    check(&format!(
        "    - name: db-ready\n      when: [between]\n      timeout: {timeout}\n      kubernetes:\n        apiVersion: v1\n        kind: ConfigMap\n        namespace: ichor-system\n        name: db-state\n        expression: 'object.data.ok == \"true\"'\n"
    ))
}

/// Wait (on the twin's clock) until some node runs the target Talos.
async fn first_node_upgraded(s: &Setup) {
    let clock = s.twin.talos.clock().clone();
    loop {
        if s.twin
            .talos
            .observe()
            .iter()
            .any(|o| o.talos_version == "v1.12.9")
        {
            return;
        }
        clock.sleep(Duration::from_secs(1)).await;
    }
}

/// Wait (on the twin's clock) until the record says the rollout waits on `needle`.
async fn record_waits_on(s: &Setup, needle: &str) -> Result<String, Error> {
    let clock = s.twin.talos.clock().clone();
    loop {
        if let Ok(r) = s.record().await {
            if let Some(w) = r.waiting.filter(|w| w.contains(needle)) {
                return Ok(w);
            }
        }
        clock.sleep(Duration::from_secs(1)).await;
    }
}

fn upgraded(s: &Setup) -> usize {
    s.twin
        .talos
        .observe()
        .iter()
        .filter(|o| o.talos_version == "v1.12.9")
        .count()
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn a_failing_check_between_nodes_is_waited_on_and_the_rollout_resumes_by_itself() -> TestResult
{
    let s = setup(TwinConfig::default()).await?;
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let mut engine = s.engine(&report);
    engine.health_checks = vec![between_check("10m")?];
    let side = async {
        first_node_upgraded(&s).await;
        kubectl(&s, &["apply", "-f", "-"], Some(&config_map("false"))).await?;
        let waited = record_waits_on(&s, "health check `db-ready`").await?;
        let upgraded_while_waiting = upgraded(&s);
        // Fixed within the timeout: the rollout carries on by itself.
        kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
        Ok::<_, Error>((waited, upgraded_while_waiting))
    };
    let (outcome, side) = run_alongside(&s, &engine, side).await?;
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    let (waited, upgraded_while_waiting) = side.ok_or("the side task did not finish")??;
    assert!(
        waited.contains("after ") && waited.contains("false"),
        "{waited}"
    );
    let total = s.twin.talos.observe().len();
    assert!(
        upgraded_while_waiting < total,
        "no node started while the check failed ({upgraded_while_waiting} of {total} upgraded)"
    );
    assert!(
        lines.any("health check db-ready failing: false"),
        "{:?}",
        lines.all()
    );
    let rec = s.record().await?;
    assert_eq!(rec.health.checks["db-ready"].state, "holds");
    assert!(rec.health.gate.is_none());
    crate::rollout::assert_finished(&s).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn a_check_that_stays_failing_pauses_the_rollout_naming_it_and_its_value() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let mut engine = s.engine(&report);
    engine.health_checks = vec![between_check("2m")?];
    let side = async {
        first_node_upgraded(&s).await;
        kubectl(&s, &["apply", "-f", "-"], Some(&config_map("false"))).await
    };
    let (outcome, _) = run_alongside(&s, &engine, side).await?;
    let p = paused(outcome)?;
    assert!(
        p.reason.contains("health check `db-ready` (between)"),
        "{}",
        p.reason
    );
    assert!(p.reason.contains("last value false"), "{}", p.reason);
    assert!(
        p.reason.contains("v1 ConfigMap ichor-system/db-state"),
        "{}",
        p.reason
    );
    let before = upgraded(&s);
    assert!(before < s.twin.talos.observe().len());
    let rec = s.record().await?;
    assert_eq!(rec.health.checks["db-ready"].state, "failing");
    let status = rec.render_text();
    assert!(
        status.contains("health check db-ready (between): failing, last value false"),
        "{status}"
    );

    // Fixed, then resumed: the gate passes and the rollout finishes.
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let mut engine = s.engine(&report);
    engine.health_checks = vec![between_check("2m")?];
    let (outcome, seen) = crate::rollout::run_checked(&s, &engine, true).await?;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    crate::rollout::assert_finished(&s).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn a_failure_expression_pauses_at_once_without_waiting_out_the_timeout() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let mut engine = s.engine(&report);
    let mut c = between_check("20m")?;
    if let Some(k) = c.kubernetes.as_mut() {
        k.failure_expression = Some("object.data.ok == 'broken'".into());
    }
    engine.health_checks = vec![c];
    let clock = s.twin.talos.clock().clone();
    let side = async {
        first_node_upgraded(&s).await;
        kubectl(&s, &["apply", "-f", "-"], Some(&config_map("broken"))).await?;
        Ok::<_, Error>(clock.now())
    };
    let (outcome, side) = run_alongside(&s, &engine, side).await?;
    let broken_at = side.ok_or("the side task did not finish")??;
    let p = paused(outcome)?;
    assert!(
        p.reason.contains(
            "health check `db-ready` (between) failed: failureExpression is true for ichor-system/db-state"
        ),
        "{}",
        p.reason
    );
    // At once: far inside the 20 minutes the check may otherwise fail for.
    let waited = clock.now().since(broken_at);
    assert!(
        waited < Duration::from_secs(5 * 60),
        "paused after {waited:?}"
    );
    assert!(upgraded(&s) < s.twin.talos.observe().len());
    let rec = s.record().await?;
    assert_eq!(rec.health.checks["db-ready"].state, "failed");
    Ok(())
}

#[tokio::test]
async fn a_check_that_cannot_judge_is_tolerated_error_limit_times_then_failing_and_never_passes(
) -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let port = free_port()?;
    // Nobody listens: every reading is unknown.
    let gone = check(&format!(
        "    - name: prom\n      when: [before]\n      timeout: 2m\n      errorLimit: 2\n      prometheus:\n        url: http://127.0.0.1:{port}\n        query: up\n"
    ))?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let mut engine = s.engine(&report);
    engine.health_checks = vec![gone];
    let (outcome, _) = crate::rollout::run_checked(&s, &engine, false).await?;
    let p = paused(outcome)?;
    assert!(
        p.reason
            .contains("health check `prom` (before) has not held"),
        "{}",
        p.reason
    );
    assert_eq!(upgraded(&s), 0, "an unknown check never passes");
    // The record's states, as each change was said: two tolerated, then failing.
    let states: Vec<String> = lines
        .all()
        .into_iter()
        .filter_map(|l| l.strip_prefix("health checks: ").map(str::to_string))
        .collect();
    assert_eq!(
        states,
        vec!["prom unknown", "prom unknown", "prom failing"],
        "{:?}",
        lines.all()
    );
    // Only the reading past the limit is news: one failing notice, after the tolerated ones.
    let failing = lines
        .all()
        .iter()
        .filter(|l| l.contains("health check prom failing"))
        .count();
    assert_eq!(failing, 1, "{:?}", lines.all());
    Ok(())
}

// ---- notifications ----------------------------------------------------------------------

/// A request's path, `X-Signature` header and body.
type Signed = (String, Option<String>, String);

/// A receiver on loopback: every request's path and body, the first one refused with 500
/// (so a retry is exercised).
#[derive(Clone, Default)]
struct Receiver {
    got: std::sync::Arc<std::sync::Mutex<Vec<(String, u16, String)>>>,
    /// Each request's path, `X-Signature` header and body.
    signed: std::sync::Arc<std::sync::Mutex<Vec<Signed>>>,
}

impl Receiver {
    async fn start(&self) -> Result<std::net::SocketAddr, Error> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let got = self.got.clone();
        let signed = self.signed.clone();
        let app = axum::Router::new().fallback(
            move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: String| {
                let got = got.clone();
                let signed = signed.clone();
                async move {
                    let sig = headers
                        .get("x-signature")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    signed.lock().unwrap_or_else(|e| e.into_inner()).push((
                        uri.path().to_string(),
                        sig,
                        body.clone(),
                    ));
                    let mut g = got.lock().unwrap_or_else(|e| e.into_inner());
                    let code = if g.is_empty() { 500 } else { 200 };
                    g.push((uri.path().to_string(), code, body));
                    axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::OK)
                }
            },
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(addr)
    }

    /// The bodies accepted at paths starting with `prefix`.
    fn accepted(&self, prefix: &str) -> Vec<String> {
        self.got
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(p, code, _)| p.starts_with(prefix) && *code == 200)
            .map(|(_, _, b)| b.clone())
            .collect()
    }

    fn all_bodies(&self) -> Vec<String> {
        self.got
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, _, b)| b.clone())
            .collect()
    }
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn a_receiver_gets_each_rollout_event_once_and_no_secret() -> TestResult {
    use ichor::controller::config::notify::{self, Destination, NotificationsConfig};
    use ichor::controller::metrics::Metrics;
    let s = setup(TwinConfig::default()).await?;
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let receiver = Receiver::default();
    let addr = receiver.start().await?;
    // The URLs carry their secret in the path, as Slack's do.
    let secret = "T0KEN-3f9a7c1e5b";
    let dir = tempfile::tempdir()?;
    let hook = dir.path().join("webhook-url");
    std::fs::write(&hook, format!("http://{addr}/hook/{secret}\n"))?;
    let slack = dir.path().join("slack-url");
    std::fs::write(&slack, format!("http://{addr}/slack/{secret}"))?;
    let key_file = dir.path().join("signing-key");
    std::fs::write(&key_file, "shared-signing-key\n")?;
    let cfg = NotificationsConfig {
        webhook: Some(Destination {
            url_file: Some(hook),
            url_env: None,
            signing_key_file: Some(key_file),
        }),
        slack: Some(Destination {
            url_file: Some(slack),
            url_env: None,
            signing_key_file: None,
        }),
    };
    let metrics = std::sync::Arc::new(Metrics::default());
    let clock = s.twin.talos.clock().clone();
    let commit = s.target().commit;
    let report = |p: ichor::rollout::Progress| {
        if let Some(e) = notify::event_of(&p, "homelab", &commit, Some(7), clock.now()) {
            notify::send_with(&cfg, &metrics, &clock, e);
        }
    };

    // The check fails after the first node and stays failing: started, failing, paused.
    let mut engine = s.engine(&report);
    engine.health_checks = vec![between_check("2m")?];
    let side = async {
        first_node_upgraded(&s).await;
        kubectl(&s, &["apply", "-f", "-"], Some(&config_map("false"))).await
    };
    let (outcome, _) = run_alongside(&s, &engine, side).await?;
    paused(outcome)?;
    drop(engine);
    // Fixed and resumed: resumed, completed.
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let mut engine = s.engine(&report);
    engine.health_checks = vec![between_check("2m")?];
    let (outcome, _) = crate::rollout::run_checked(&s, &engine, true).await?;
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}"
    );
    drop(engine);

    // Deliveries are their own tasks: wait for them (bounded), moving the clock for retries.
    let want = [
        "rollout.started",
        "healthcheck.failing",
        "rollout.paused",
        "rollout.resumed",
        "healthcheck.recovered",
        "rollout.completed",
    ];
    for _ in 0..400 {
        if receiver.accepted("/hook/").len() >= want.len()
            && receiver.accepted("/slack/").len() >= want.len()
        {
            break;
        }
        s.twin.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let events: Vec<Value> = receiver
        .accepted("/hook/")
        .iter()
        .map(|b| serde_json::from_str(b))
        .collect::<Result<_, _>>()?;
    let names: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(names, want, "{events:#?}");
    for e in &events {
        assert_eq!(e["cluster"], "homelab");
        assert_eq!(e["commit"], commit.as_str());
        assert_eq!(e["pr"], 7);
    }
    let paused_event = &events[2];
    assert_eq!(paused_event["stage"], "talos");
    assert!(paused_event["cause"]
        .as_str()
        .unwrap_or("")
        .contains("health check `db-ready`"));
    assert!(paused_event["resume"]
        .as_str()
        .unwrap_or("")
        .contains("/ichor retry"));
    assert!(events[0]["eta"].is_string(), "{}", events[0]);
    assert!(events[1]["cause"]
        .as_str()
        .unwrap_or("")
        .contains("db-ready"));

    let texts: Vec<String> = receiver
        .accepted("/slack/")
        .iter()
        .map(|b| {
            serde_json::from_str::<Value>(b).map(|v| v["text"].as_str().unwrap_or("").to_string())
        })
        .collect::<Result<_, _>>()?;
    assert_eq!(texts.len(), want.len(), "{texts:#?}");
    assert!(
        texts[0].starts_with("ichor: homelab: rollout started"),
        "{}",
        texts[0]
    );
    assert!(
        texts[2].contains("rollout paused in talos") && texts[2].contains("To resume:"),
        "{}",
        texts[2]
    );

    // Each webhook body is signed with the key, as a receiver checks it; each event has its
    // own id, and the retried one kept its id. Slack gets no signature.
    let signed = receiver
        .signed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for (path, sig, body) in &signed {
        if path.starts_with("/hook/") {
            let want = notify::signature(b"shared-signing-key", body.as_bytes())?;
            assert_eq!(sig.as_deref(), Some(want.as_str()), "{body}");
        } else {
            assert_eq!(sig, &None, "{path}");
        }
    }
    let mut ids: Vec<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), want.len(), "{events:#?}");

    // No secret in any body: not the URLs' token, not the cluster's.
    for b in receiver.all_bodies() {
        assert!(!b.contains(secret), "{b}");
        assert!(!b.contains(s.twin.kube.token()), "{b}");
    }
    // The refused first try was retried: every event sent, none failed.
    let value = |kind: &str, result: &str| {
        metrics.value(
            "ichor_notifications_total",
            &[("kind", kind), ("result", result)],
        )
    };
    assert_eq!(value("webhook", "sent") + value("slack", "sent"), 12.0);
    assert_eq!(value("webhook", "failed") + value("slack", "failed"), 0.0);
    Ok(())
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn the_before_checks_are_live_items_of_the_gate() -> TestResult {
    use ichor::gate::live;
    use ichor::policy::Status;
    let mut s = setup(TwinConfig::default()).await?;
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("false"))).await?;
    let doc = s.change.cluster_doc.as_mut().ok_or("a cluster.yaml")?;
    let mut before = between_check("10m")?;
    before.when = vec![ichor::health::Phase::Before];
    // A `between`-only check is not a live item.
    doc.spec.health_checks = vec![before, between_check("10m")?];
    doc.spec.health_checks[1].name = "only-between".into();
    let items = |facts: &live::LiveFacts| -> Vec<ichor::policy::CheckItem> {
        live::items(&s.change, facts)
            .into_iter()
            .filter(|i| i.id.starts_with("live/health/"))
            .collect()
    };
    let facts = live::observe(&s.kube, Some(&s.talos), &live::Subject::of(&s.change)).await;
    let open = items(&facts);
    assert_eq!(open.len(), 1, "{open:#?}");
    assert_eq!(open[0].id, "live/health/db-ready");
    assert_eq!(
        open[0].status,
        Status::Wait,
        "a failing check makes the gate wait"
    );
    assert!(
        open[0]
            .message
            .starts_with("false; read v1 ConfigMap ichor-system/db-state"),
        "{}",
        open[0].message
    );
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let facts = live::observe(&s.kube, Some(&s.talos), &live::Subject::of(&s.change)).await;
    assert_eq!(items(&facts)[0].status, Status::Pass);
    Ok(())
}

#[tokio::test]
#[ignore = "needs prometheus: scripts/test installs it"]
async fn a_query_prometheus_cannot_parse_pauses_at_once_as_an_error_of_cluster_yaml() -> TestResult
{
    let s = setup(TwinConfig::default()).await?;
    let p = start_prometheus(&s).await?;
    let mut bad = prometheus_check(&p.url, "sum(ichor_twin_gauge", None)?;
    bad.when = vec![ichor::health::Phase::Before];
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let mut engine = s.engine(&report);
    engine.health_checks = vec![bad];
    let (outcome, _) = crate::rollout::run_checked(&s, &engine, false).await?;
    let pause = paused(outcome)?;
    assert!(
        pause.reason.contains("Prometheus cannot parse"),
        "{}",
        pause.reason
    );
    assert!(pause.reason.contains("bad_data"), "{}", pause.reason);
    // Nothing was touched.
    assert_eq!(upgraded(&s), 0);
    Ok(())
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn an_engine_restarted_mid_gate_resumes_the_same_gate_and_deadline() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    kubectl(&s, &["apply", "-f", "-"], Some(&config_map("true"))).await?;
    let lines = Lines::default();
    let report = |p| lines.push(p);
    let mut engine = s.engine(&report);
    engine.health_checks = vec![between_check("4m")?];
    let target = s.target();
    let side = async {
        first_node_upgraded(&s).await;
        kubectl(&s, &["apply", "-f", "-"], Some(&config_map("false"))).await?;
        record_waits_on(&s, "health check `db-ready`").await
    };
    // The engine is killed (its future dropped) while it waits at the gate.
    tokio::select! {
        r = engine.run(&s.plan, &target, Some(&s.change), false) => return Err(format!("the rollout ended first: {r:?}").into()),
        w = side => { w?; }
        _ = s.twin.drive(Duration::from_secs(2), || {}) => unreachable!("the driver never ends"),
    }
    drop(engine);
    let rec = s.record().await?;
    let gate = rec.health.gate.clone().ok_or("the record keeps the gate")?;
    assert!(gate.key.starts_with("between/talos/"), "{gate:?}");
    let started = Timestamp::parse_rfc3339(&gate.started_at).ok_or("a start")?;
    // Down for a minute, then started again (not a resume: the record says running).
    s.twin.advance(Duration::from_secs(60));
    let mut engine = s.engine(&report);
    engine.health_checks = vec![between_check("4m")?];
    let (outcome, seen) = crate::rollout::run_checked(&s, &engine, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    let p = paused(outcome)?;
    assert!(p.reason.contains("health check `db-ready`"), "{}", p.reason);
    let since = Timestamp::parse_rfc3339(&p.since).ok_or("a pause time")?;
    let waited = since.since(started);
    assert!(
        waited >= Duration::from_secs(240) && waited < Duration::from_secs(240 + 60),
        "the gate kept its deadline across the restart: paused {}s after it began",
        waited.as_secs()
    );
    Ok(())
}

/// `ichor run` (Git-only, the main branch moved on disk) with a webhook and a Slack URL in
/// its config: the receiver gets the rollout's start and completion, once each, and the
/// failed first try is retried; `/metrics` counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ichor_run_notifies_the_start_and_the_end_of_a_rollout() -> TestResult {
    use ichor::controller::{self, Config};
    let s = setup(TwinConfig::default()).await?;
    let receiver = Receiver::default();
    let addr = receiver.start().await?;
    let dir = tempfile::tempdir()?;
    let origin = crate::controller::origin(dir.path())?;
    let secret = "T0KEN-9c2e4b6a8d";
    let hook = dir.path().join("webhook-url");
    std::fs::write(&hook, format!("http://{addr}/hook/{secret}"))?;
    let slack = dir.path().join("slack-url");
    std::fs::write(&slack, format!("http://{addr}/slack/{secret}"))?;
    let text = format!(
        "repository:\n  path: {}\n  branch: main\nclusters:\n  - name: homelab\n    kubeconfig: {}\n    talosconfig: {}\npollInterval: 10m\nlisten: 127.0.0.1:0\nmetricsListen: 127.0.0.1:0\nstateDir: {}\nnotifications:\n  webhook:\n    urlFile: {}\n  slack:\n    urlFile: {}\n",
        origin.display(),
        s.twin.kubeconfig().display(),
        s.twin.talosconfig().display(),
        dir.path().join("ichor").display(),
        hook.display(),
        slack.display(),
    );
    let cfg = Config::parse("test-config.yaml", &text)?;
    let running = controller::start(cfg, s.twin.talos.clock().clone()).await?;
    let repo = git2::Repository::open_bare(&origin)?;
    let good = crate::controller::oid(&repo, "renovate/talos")?;
    repo.reference("refs/heads/main", good, true, "merge renovate/talos")?;
    let done = || {
        let names = |prefix: &str| -> Vec<String> {
            receiver
                .accepted(prefix)
                .iter()
                .filter_map(|b| serde_json::from_str::<Value>(b).ok())
                .map(|v| {
                    v["event"]
                        .as_str()
                        .or(v["text"].as_str())
                        .unwrap_or("")
                        .to_string()
                })
                .collect()
        };
        let sent = |kind: &str| {
            running.ctx.metrics.value(
                "ichor_notifications_total",
                &[("kind", kind), ("result", "sent")],
            )
        };
        names("/hook/").iter().any(|e| e == "rollout.completed")
            && names("/slack/")
                .iter()
                .any(|t| t.contains("rollout completed"))
            && sent("webhook") + sent("slack") >= 4.0
    };
    crate::controller::until(&s, &running, "the rollout's notifications", done).await?;
    let events: Vec<String> = receiver
        .accepted("/hook/")
        .iter()
        .filter_map(|b| serde_json::from_str::<Value>(b).ok())
        .filter_map(|v| v["event"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        events,
        ["rollout.started", "rollout.completed"],
        "{events:?}"
    );
    let first: Value = serde_json::from_str(&receiver.accepted("/hook/")[0])?;
    assert_eq!(first["commit"], good.to_string());
    assert!(first["eta"].is_string(), "{first}");
    for b in receiver.all_bodies() {
        assert!(
            !b.contains(secret) && !b.contains(s.twin.kube.token()),
            "{b}"
        );
    }
    let m = &running.ctx.metrics;
    let sent = m.value(
        "ichor_notifications_total",
        &[("kind", "webhook"), ("result", "sent")],
    ) + m.value(
        "ichor_notifications_total",
        &[("kind", "slack"), ("result", "sent")],
    );
    assert_eq!(sent, 4.0);
    assert!(m.render().contains("ichor_notifications_total{"));
    running.shutdown().await;
    Ok(())
}

/// A Prometheus behind auth (a proxy in front of it): the token from the controller's config
/// goes in the Authorization header, and nowhere in what ichor reports.
#[tokio::test]
async fn the_prometheus_token_is_sent_as_a_bearer_and_never_reported() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let token = "prom-tok-5d1e";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/api/v1/query",
        axum::routing::get(move |headers: axum::http::HeaderMap| async move {
            let ok = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                == Some("Bearer prom-tok-5d1e");
            let now = Clock::system().now().as_millis() as f64 / 1000.0;
            if ok {
                (
                    axum::http::StatusCode::OK,
                    json!({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [now, "1"]}]}}).to_string(),
                )
            } else {
                (axum::http::StatusCode::UNAUTHORIZED, "Unauthorized\n".to_string())
            }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let c = prometheus_check(&format!("http://{addr}"), "up", Some("1m"))?;
    let secret = Credential::new(&format!("http://{addr}"), ichor::secret::Secret::new(token))?;
    let r = read_check(&s.kube, Some(&secret), &c, Clock::system().now()).await;
    assert!(r.passes(), "{r:?}");
    let r = read_check(&s.kube, None, &c, Clock::system().now()).await;
    assert!(!r.passes() && r.value.contains("HTTP 401"), "{r:?}");
    assert!(!format!("{r:?}").contains(token));
    // The gate's live item reads with the token too (the controller's config, or
    // `--prometheus-url` with `--prometheus-token-file`), so a `before` check behind auth does not wait forever.
    let subject = |t: Option<Credential>| {
        ichor::gate::live::Subject {
            cluster: "homelab".into(),
            cni: None,
            volumes: Default::default(),
            handover: None,
            health_checks: vec![c.clone()],
            prometheus_credential: None,
        }
        .with_prometheus_credential(t)
    };
    for (t, pass) in [(Some(secret.clone()), true), (None, false)] {
        let facts = ichor::gate::live::observe(&s.kube, None, &subject(t)).await;
        let (_, r) = facts.health.first().ok_or("no reading")?;
        assert_eq!(r.passes(), pass, "{r:?}");
    }
    Ok(())
}

/// A check on a ConfigMap, read between nodes, as it goes under `spec:`.
const CHECK: &str = "spec:\n  healthChecks:\n    - name: app-health\n      when: [between]\n      kubernetes:\n        apiVersion: v1\n        kind: ConfigMap\n        namespace: default\n        name: app-health\n        expression: 'object.data.ok == \"yes\"'\n";

/// Issue 18 item 4, over GitHub: the sticky comment of the merged PR lists each health check
/// with its gate, state and last value, as the rollout read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn the_sticky_comment_lists_each_health_check_with_its_state_and_value() -> TestResult {
    use ichor::sim::github::{StatusState, RENOVATE_LOGIN};
    let hub = crate::controller::Hub::start().await?;
    // main's cluster.yaml gains a check on a ConfigMap the rollout reads between nodes.
    crate::controller::commit_edit(
        &git2::Repository::open_bare(&hub.origin)?,
        "main",
        "refs/heads/main",
        "clusters/homelab/cluster.yaml",
        |text| text.unwrap_or_default().replacen("spec:\n", CHECK, 1),
        "health check\n",
    )?;
    kubectl(
        &hub.s,
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-health\n  namespace: default\ndata:\n  ok: \"yes\"\n"),
    )
    .await?;
    let running = hub.run("a").await?;
    let pr = hub
        .gh
        .open_pull_request(
            "acme/homelab",
            "renovate/talos",
            "main",
            "update talos",
            "Renovate update",
            RENOVATE_LOGIN,
        )
        .await?;
    crate::controller::until(&hub.s, &running, "the gate", || {
        hub.status(&pr.head_sha, "ichor/gate")
            .is_some_and(|s| s.state == StatusState::Success)
    })
    .await?;
    let merge = hub
        .gh
        .merge_pull_request("acme/homelab", pr.number, "mara")
        .await?;
    crate::controller::until(&hub.s, &running, "the rollout's end", || {
        hub.status(&merge, "ichor/rollout")
            .is_some_and(|s| s.state == StatusState::Success)
    })
    .await?;
    let body = hub.sticky(pr.number).join("");
    assert!(
        body.contains("| health check | gate | state | last value |")
            && body.contains("| `app-health` | between | ✅ holds | "),
        "{body}"
    );
    running.shutdown().await;
    Ok(())
}

/// A plain listener on loopback that records each connection's request head and answers
/// every one with `reply`: what ichor sent, or that it never connected.
struct Recorder {
    url: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Recorder {
    async fn start(reply: String) -> Result<Recorder, Error> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let record = record.clone();
                let reply = reply.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    if let Ok(mut r) = record.lock() {
                        r.push(String::from_utf8_lossy(&head).to_lowercase());
                    }
                    let _ = sock.write_all(reply.as_bytes()).await;
                });
            }
        });
        Ok(Recorder { url, seen })
    }

    fn requests(&self) -> Vec<String> {
        self.seen.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

const UNAUTHORIZED: &str =
    "HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Issue 46 item 1: the token is bound to its Prometheus. A check naming another URL reads
/// without it, and a redirect from the bound Prometheus to another origin is not followed.
#[tokio::test]
async fn the_prometheus_token_goes_only_to_the_url_it_is_bound_to() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let token = "prom-tok-77ab";
    let other = Recorder::start(UNAUTHORIZED.into()).await?;
    let bound = Recorder::start(format!(
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: {}/api/v1/query?query=up\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        other.url
    ))
    .await?;
    let credential = Credential::new(&bound.url, ichor::secret::Secret::new(token))?;
    let now = Clock::system().now();
    // A check that names another listener: asked, without the token.
    let c = prometheus_check(&other.url, "up", None)?;
    let r = read_check(&s.kube, Some(&credential), &c, now).await;
    assert!(!r.passes(), "{r:?}");
    let asked = other.requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(
        !asked[0].contains("authorization") && !asked[0].contains(token),
        "{asked:?}"
    );
    // The bound Prometheus gets the token; its redirect elsewhere is an answer, not followed.
    let c = prometheus_check(&bound.url, "up", None)?;
    let r = read_check(&s.kube, Some(&credential), &c, now).await;
    assert!(!r.passes(), "{r:?}");
    let got = bound.requests();
    assert!(
        got.len() == 1 && got[0].contains(&format!("authorization: bearer {token}")),
        "{got:?}"
    );
    assert_eq!(other.requests().len(), 1, "the redirect was followed");
    assert!(!format!("{r:?}").contains(token));
    Ok(())
}

/// Issue 46 item 1, over GitHub: a fork PR adds the folder of a cluster the controller is
/// configured for (with a Prometheus credential bound to the very listener the PR's check
/// names). The PR's own cluster.yaml is never run live: the listener gets no connection,
/// so no token, and the comment says live checks start once the cluster is on the base.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_pr_adding_a_cluster_gets_no_live_check_and_no_token() -> TestResult {
    let hub = crate::controller::Hub::start().await?;
    let trap = Recorder::start(UNAUTHORIZED.into()).await?;
    let token_file = hub.dir.path().join("prom-token");
    std::fs::write(&token_file, "prom-tok-fork")?;
    let edge = format!(
        "  - name: edge\n    kubeconfig: {}\n    act: false\n    prometheus:\n      url: {}\n      tokenFile: {}\npollInterval:",
        hub.s.twin.kubeconfig().display(),
        trap.url,
        token_file.display()
    );
    let text = hub
        .config_text("a", "127.0.0.1:0")
        .replacen("pollInterval:", &edge, 1);
    let running = ichor::controller::start(
        ichor::controller::Config::parse("test-config.yaml", &text)?,
        hub.s.twin.talos.clock().clone(),
    )
    .await?;
    hub.gh.set_webhook(Some(ichor::sim::github::WebhookTarget {
        url: running.webhook_url().ok_or("no webhook listener")?,
        secret: "webhook-secret-do-not-print".into(),
    }));
    let fixture = git2::Repository::open(crate::homelab())?;
    let file = |path: &str| -> Result<String, Error> {
        let blob = fixture
            .revparse_single(&format!("main:clusters/homelab/{path}"))?
            .peel_to_blob()?;
        Ok(std::str::from_utf8(blob.content())?.replace("name: homelab", "name: edge"))
    };
    let release_set = file("release-set.yaml")?;
    let cluster = file("cluster.yaml")?.replacen(
        "spec:\n",
        &format!(
            "spec:\n  healthChecks:\n    - name: exfil\n      when: [before]\n      prometheus:\n        url: {}\n        query: up\n",
            trap.url
        ),
        1,
    );
    hub.gh
        .push_fork_commit(
            "acme/homelab",
            "mallory",
            "edge",
            &[
                ("clusters/edge/release-set.yaml", &release_set),
                ("clusters/edge/cluster.yaml", &cluster),
            ],
            "add edge",
        )
        .await?;
    let pr = hub
        .gh
        .open_fork_pull_request(
            "acme/homelab",
            "mallory",
            "edge",
            "main",
            "add edge",
            "",
            "mallory",
        )
        .await?;
    let sticky = || {
        hub.gh
            .comments("acme/homelab", pr.number)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.body)
            .find(|b| b.contains("<!-- ichor:sticky cluster=edge -->"))
    };
    crate::controller::until(&hub.s, &running, "the new cluster's verdict", || {
        sticky().is_some()
    })
    .await?;
    assert_eq!(
        trap.requests(),
        Vec::<String>::new(),
        "the PR's check ran live"
    );
    let body = sticky().unwrap_or_default();
    assert!(
        body.contains("clusters/edge/ is new in this PR")
            && body.contains("live checks and health checks start once it is on main"),
        "{body}"
    );
    running.shutdown().await;
    Ok(())
}
