//! Issue 9: the twin survives anything a config file or a network peer sends. Each test
//! reproduces one finding: the user's repository is never written, the certificates do not
//! expire with the calendar, secrets stay private, an idle twin sleeps, YAML aliases and
//! big bodies are bounded, idle sockets cannot starve requests, faults are validated the
//! same way everywhere, speed and size are bounded, and the GitHub emulator checks branch
//! names as GitHub does.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ichor::clock::{Clock, Timestamp};
use ichor::sim::kube::{Behaviour, KubeSeed, KubeTwin};
use ichor::sim::net::NetLimits;
use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
use ichor::talos::proto::machine::machine_service_client::MachineServiceClient;
use ichor::talos::proto::machine::ApplyConfigurationRequest;
use serde_json::{json, Value};

use crate::sim_wire::{snapshot, talos_channel, Error, TestResult, Wire};

fn homelab_folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/repos/homelab/tree/clusters/homelab")
}

async fn start(clock: Clock, options: TwinOptions) -> Result<(Twin, tempfile::TempDir), Error> {
    let state = tempfile::tempdir()?;
    let folder = ClusterFolder::read(&homelab_folder())?;
    let twin = Twin::start(clock, &folder, state.path(), options).await?;
    Ok((twin, state))
}

/// The homelab fixture as a git repository with a work tree, and a twin serving the GitHub
/// emulator over it.
async fn start_with_github(net: NetLimits) -> Result<(Twin, tempfile::TempDir, PathBuf), Error> {
    let work = tempfile::tempdir()?;
    let repo = work.path().join("homelab");
    ichor::sim::fixture::Fixture::homelab().build(&repo)?;
    let folder = ClusterFolder::read(&repo.join("clusters/homelab"))?;
    let twin = Twin::start(
        Clock::manual(),
        &folder,
        &work.path().join("state"),
        TwinOptions {
            github: Some(("local/homelab".into(), repo.clone())),
            config: TwinConfig {
                net,
                ..TwinConfig::default()
            },
        },
    )
    .await?;
    Ok((twin, work, repo))
}

fn billion_laughs() -> String {
    let mut s = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let p = i - 1;
        s.push_str(&format!(
            "l{i}: &l{i} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n"
        ));
    }
    s.push_str("data: {x: y}\n");
    s
}

// ---- 11: the user's repository ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merging_through_the_emulator_never_touches_the_users_repository() -> TestResult {
    let (twin, _work, repo) = start_with_github(NetLimits::default()).await?;
    let before = snapshot(&repo.join(".git"))?;
    let gh = twin.github.as_ref().ok_or("github emulator")?;
    let wire = Wire::github(gh);
    let pr = wire
        .json(
            "POST",
            "/repos/local/homelab/pulls",
            &json!({"title": "cilium", "head": "renovate/cilium-1.18.x", "base": "main"}),
        )
        .await?;
    assert_eq!(pr.code, 201, "{}", pr.text);
    let n = pr.body["number"].as_u64().ok_or("number")?;
    let merged = wire
        .json(
            "PUT",
            &format!("/repos/local/homelab/pulls/{n}/merge"),
            &json!({}),
        )
        .await?;
    assert_eq!(merged.code, 200, "{}", merged.text);
    let sha = merged.body["sha"].as_str().ok_or("sha")?.to_string();

    // The merge and refs/pull/N/head live in the emulator's own clone...
    let clone = git2::Repository::open(twin.github_repo.as_ref().ok_or("clone")?)?;
    assert!(clone.is_bare());
    assert_eq!(
        clone.refname_to_id("refs/heads/main")?.to_string(),
        sha,
        "main moved in the clone"
    );
    assert!(clone.find_reference(&format!("refs/pull/{n}/head")).is_ok());
    // ...and the user's repository (refs, HEAD, index, objects) is byte-for-byte as before.
    let after = snapshot(&repo.join(".git"))?;
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    assert!(changed.is_empty(), "the user's .git changed: {changed:?}");
    let user = git2::Repository::open(&repo)?;
    assert_ne!(user.refname_to_id("refs/heads/main")?.to_string(), sha);
    twin.shutdown().await;
    Ok(())
}

// ---- 12: certificates relative to now -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn a_twin_whose_clock_is_a_year_ahead_still_serves_kubectl_and_talos() -> TestResult {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let year = Duration::from_secs(365 * 86_400);
    let later = Timestamp::from_millis(u64::try_from((now + year).as_millis())?);
    let (twin, state) = start(Clock::manual_at(later), TwinOptions::default()).await?;
    assert!(twin.clock.now() >= later);
    // A real mutual-TLS handshake with the tonic client, then a call.
    let mut talos = MachineServiceClient::new(talos_channel(twin.talosconfig(), None).await?);
    let version = talos.version(tonic::Request::new(())).await?.into_inner();
    assert_eq!(version.messages.len(), 1);
    {
        let out = std::process::Command::new(crate::tools::KUBECTL.path())
            .arg("--kubeconfig")
            .arg(twin.kubeconfig())
            .arg("--cache-dir")
            .arg(state.path().join("cache"))
            .args(["get", "nodes"])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(text.lines().count(), 7, "{text}");
    }
    Ok(())
}

// ---- 14: idle cost ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_twin_does_not_wake_itself() -> TestResult {
    let (twin, _state) = start(Clock::manual(), TwinOptions::default()).await?;
    let wire = Wire::kube(&twin.kube)?;
    assert_eq!(
        wire.send("GET", "/api/v1/nodes", None, vec![]).await?.code,
        200
    );
    let before = twin.wakeups();
    // Real time passes while the API answers reads; none of them changes the cluster and
    // nothing is due on the (manual) clock, so no background task has a reason to run.
    // The old projector woke itself ~1000 times a second, through `observe`.
    for _ in 0..20 {
        assert_eq!(
            wire.send("GET", "/api/v1/pods", None, vec![]).await?.code,
            200
        );
    }
    let after = twin.wakeups();
    let woke = (
        after.projector - before.projector,
        after.talos - before.talos,
        after.kube - before.kube,
    );
    assert!(
        woke.0 <= 2 && woke.1 <= 2 && woke.2 <= 2,
        "idle wakeups (projector, talos, kube): {woke:?}"
    );
    Ok(())
}

// ---- 15: amplification --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yaml_alias_bombs_are_refused_by_both_apis() -> TestResult {
    let (twin, _state) = start(Clock::manual(), TwinOptions::default()).await?;
    let bomb = billion_laughs();
    let wire = Wire::kube(&twin.kube)?;
    let created = wire
        .send(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some("application/yaml"),
            bomb.clone().into_bytes(),
        )
        .await?;
    assert_eq!(created.code, 400, "{}", created.text);
    assert_eq!(created.body["kind"], "Status");
    assert!(
        created.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("expands")),
        "{}",
        created.text
    );
    let applied = wire
        .send(
            "PATCH",
            "/api/v1/namespaces/default/configmaps/lol?fieldManager=test",
            Some("application/apply-patch+yaml"),
            bomb.clone().into_bytes(),
        )
        .await?;
    assert_eq!(applied.code, 400, "{}", applied.text);

    let mut talos = MachineServiceClient::new(talos_channel(twin.talosconfig(), None).await?);
    let mut req = tonic::Request::new(ApplyConfigurationRequest {
        data: bomb.into_bytes(),
        mode: 2,
        dry_run: true,
        try_mode_timeout: None,
    });
    req.metadata_mut().insert("node", "cp-1".parse()?);
    let err = talos
        .apply_configuration(req)
        .await
        .err()
        .ok_or("a billion laughs was applied")?;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("expands"), "{}", err.message());
    // The twin still answers.
    assert_eq!(
        wire.send("GET", "/api/v1/nodes", None, vec![]).await?.code,
        200
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn a_1_mib_apply_works_and_bodies_over_3_mib_get_413() -> TestResult {
    let (twin, state) = start(Clock::manual(), TwinOptions::default()).await?;
    let config_map = |name: &str, size: usize| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "default"},
               "data": {"blob": "x".repeat(size)}})
    };
    let wire = Wire::kube(&twin.kube)?;
    let big = wire
        .json(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            &config_map("big", 4 << 20),
        )
        .await?;
    assert_eq!(big.code, 413, "{}", &big.text[..big.text.len().min(300)]);
    assert_eq!(big.body["kind"], "Status");
    assert_eq!(big.body["code"], 413);
    assert_eq!(big.body["reason"], "RequestEntityTooLarge");
    let kubectl_path = crate::tools::KUBECTL.path();
    let kubectl = |args: &[&str]| {
        std::process::Command::new(&kubectl_path)
            .arg("--kubeconfig")
            .arg(twin.kubeconfig())
            .arg("--cache-dir")
            .arg(state.path().join("cache"))
            .args(args)
            .output()
    };
    let file = state.path().join("one-mib.json");
    std::fs::write(&file, config_map("one-mib", 1 << 20).to_string())?;
    let path = file.display().to_string();
    let out = kubectl(&["apply", "-f", &path])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&file, config_map("four-mib", 4 << 20).to_string())?;
    let out = kubectl(&["create", "-f", &path])?;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Request entity too large"), "{err}");
    Ok(())
}

// ---- 16: connections ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_starve_real_requests() -> TestResult {
    let (twin, _work, _repo) = start_with_github(NetLimits::default()).await?;
    let gh = twin.github.as_ref().ok_or("github emulator")?;
    let talos_addr = twin.talos.endpoints()[0].1;
    let mut idle = Vec::new();
    for addr in [twin.kube.addr, talos_addr, gh.addr()] {
        for _ in 0..300 {
            // Connected, never a byte: no handshake, no request head.
            idle.push(tokio::net::TcpStream::connect(addr).await?);
        }
    }
    let nodes = Wire::kube(&twin.kube)?
        .send("GET", "/api/v1/nodes", None, vec![])
        .await?;
    assert_eq!(nodes.code, 200);
    let mut talos = MachineServiceClient::new(talos_channel(twin.talosconfig(), None).await?);
    assert_eq!(
        talos
            .version(tonic::Request::new(()))
            .await?
            .into_inner()
            .messages
            .len(),
        1
    );
    let repo = Wire::github(gh)
        .send("GET", "/repos/local/homelab", None, vec![])
        .await?;
    assert_eq!(repo.code, 200, "{}", repo.text);
    drop(idle);
    Ok(())
}

/// Reads from a connection the server should close; the read ends with EOF or an error.
fn closed_by_server(addr: SocketAddr, send: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.write_all(send)?;
    // A guard against a hang only; the server's own timeout is far shorter.
    conn.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut buf = [0u8; 64];
    match conn.read(&mut buf) {
        Ok(0) => Ok(()),
        Ok(_) => Err("the server answered a silent client".into()),
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            Err("the server kept a silent connection open".into())
        }
        Err(_) => Ok(()), // reset
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_are_dropped_after_the_handshake_and_header_timeouts() -> TestResult {
    let net = NetLimits {
        handshake_timeout: Duration::from_millis(200),
        header_timeout: Duration::from_millis(200),
        ..NetLimits::default()
    };
    let (twin, _work, _repo) = start_with_github(net).await?;
    let kube = twin.kube.addr;
    let talos = twin.talos.endpoints()[0].1;
    let github = twin.github.as_ref().ok_or("github emulator")?.addr();
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        closed_by_server(kube, b"").map_err(|e| format!("kube: {e}"))?;
        closed_by_server(talos, b"").map_err(|e| format!("talos: {e}"))?;
        // Half a request head, never finished.
        closed_by_server(github, b"GET /rate_limit HTTP/1.1\r\nHost: x\r\n")
            .map_err(|e| format!("github: {e}"))
    })
    .await??;
    Ok(())
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() -> TestResult {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir()?;
    let net = NetLimits {
        idle_timeout: Duration::from_millis(200),
        ..NetLimits::default()
    };
    let t = KubeTwin::start_with_limits(
        Clock::manual(),
        KubeSeed::typical(1, 1),
        Behaviour::default(),
        net,
        dir.path(),
    )
    .await?;
    // Handshaken, then silent: the header timeout (30 s) is far off, the idle one is not.
    let mut conn = Wire::kube(&t)?.tls_connect().await?;
    let mut buf = [0u8; 16];
    // A guard against a hang only.
    let read = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf)).await?;
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    Ok(())
}

// ---- 17: faults ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_faults_endpoint_validates_like_the_config() -> TestResult {
    let (twin, _state) = start(Clock::manual(), TwinOptions::default()).await?;
    let wire = Wire::kube(&twin.kube)?;
    let cases = [
        (json!({"nope": 1}), "unknown field `nope`"),
        (
            json!({"apiErrorBurst": {"count": 1, "status": 200}}),
            "apiErrorBurst.status",
        ),
        (
            json!({"apiErrorBurst": {"count": 1, "status": 70000}}),
            "apiErrorBurst.status",
        ),
        (
            json!({"apiErrorBurst": {"count": 4294967297u64}}),
            "apiErrorBurst.count",
        ),
        (
            json!({"apiErrorBurst": {"count": -1}}),
            "apiErrorBurst.count",
        ),
        (
            json!({"pdbsNeverAllow": ["nope/nope"]}),
            "pdbsNeverAllow[0]",
        ),
        (json!({"nodesNeverReturn": ["w-9"]}), "nodesNeverReturn[0]"),
        (json!({"droppedWebhooks": 1}), "no GitHub emulator"),
        (
            json!({"stealLease": {"namespace": "x", "name": "y", "holder": "z"}}),
            "stealLease",
        ),
    ];
    for (body, expect) in cases {
        let r = wire.json("POST", "/_twin/faults", &body).await?;
        assert_eq!(r.code, 422, "{body}: {}", r.text);
        assert_eq!(r.body["kind"], "Status");
        assert_eq!(r.body["reason"], "Invalid");
        assert!(r.text.contains(expect), "{body}: {}", r.text);
    }
    // The endpoint's older forms are validated the same way, and still work.
    for (body, expect) in [
        (json!({"failNext": 1, "code": 70000}), "code"),
        (json!({"failNext": 4294967297u64}), "failNext"),
        (json!({"code": 429}), "failNext"),
        (
            json!({"pdbNeverAllows": {"namespace": "nope", "name": "nope"}}),
            "pdbNeverAllows",
        ),
    ] {
        let r = wire.json("POST", "/_twin/faults", &body).await?;
        assert_eq!(r.code, 422, "{body}: {}", r.text);
        assert!(r.text.contains(expect), "{body}: {}", r.text);
    }
    let r = wire
        .json(
            "POST",
            "/_twin/faults",
            &json!({"pdbNeverAllows": {"namespace": "default", "name": "web", "on": false}}),
        )
        .await?;
    assert_eq!(r.code, 200, "{}", r.text);
    let r = wire
        .send(
            "POST",
            "/_twin/faults",
            Some("application/json"),
            b"{not json".to_vec(),
        )
        .await?;
    assert_eq!(r.code, 400, "{}", r.text);
    // Nothing was applied: requests still succeed.
    assert_eq!(
        wire.send("GET", "/api/v1/nodes", None, vec![]).await?.code,
        200
    );

    // A valid document reaches both sides; an empty list clears a fault again.
    let r = wire
        .json(
            "POST",
            "/_twin/faults",
            &json!({"nodesNeverReturn": ["w-1"], "pdbsNeverAllow": ["default/web"]}),
        )
        .await?;
    assert_eq!(r.code, 200, "{}", r.text);
    assert!(twin
        .talos
        .with_model(|m| m.faults.never_return.contains("w-1")));
    let pdb = twin
        .kube
        .with(|c, _| c.get("poddisruptionbudgets", "default", "web"))
        .ok_or("pdb")?;
    assert_eq!(pdb["status"]["disruptionsAllowed"], 0, "{pdb}");
    let r = wire
        .json("POST", "/_twin/faults", &json!({"nodesNeverReturn": []}))
        .await?;
    assert_eq!(r.code, 200, "{}", r.text);
    assert!(twin.talos.with_model(|m| m.faults.never_return.is_empty()));

    // The same document in the config file is refused the same way.
    let config = TwinConfig::parse("twin.yaml", "faults:\n  pdbsNeverAllow: [nope/nope]\n")?;
    let err = start(
        Clock::manual(),
        TwinOptions {
            config,
            ..TwinOptions::default()
        },
    )
    .await
    .err()
    .ok_or("a fault on a missing PDB was accepted")?;
    assert!(
        err.to_string()
            .contains("faults.pdbsNeverAllow[0]: no PodDisruptionBudget \"nope\""),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn a_kubernetes_twin_alone_has_no_talos_faults() -> TestResult {
    let dir = tempfile::tempdir()?;
    let t = KubeTwin::start_with(
        Clock::manual(),
        KubeSeed::typical(1, 1),
        Behaviour::default(),
        dir.path(),
    )
    .await?;
    let r = Wire::kube(&t)?
        .json(
            "POST",
            "/_twin/faults",
            &json!({"slowApply": {"cp-1": "1m"}}),
        )
        .await?;
    assert_eq!(r.code, 422, "{}", r.text);
    assert!(r.text.contains("no Talos side"), "{}", r.text);
    Ok(())
}

// ---- 18: speed and size -------------------------------------------------------------------

#[test]
fn ichor_sim_refuses_extreme_speeds_and_sizes_before_starting() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let sim = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ichor"))
            .args(["sim", "--cluster"])
            .arg(homelab_folder())
            .arg("--state-dir")
            .arg(&state)
            .args(extra)
            .output()
    };
    for speed in ["1e308", "1e18", "0", "-1", "NaN", "inf"] {
        let out = sim(&["--speed", speed])?;
        assert_eq!(out.status.code(), Some(2), "--speed {speed}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--speed: speed") && err.contains("is out of range"),
            "{err}"
        );
    }
    let config = dir.path().join("twin.yaml");
    std::fs::write(&config, "extraPods: 100000000\n")?;
    let out = sim(&["--config", &config.display().to_string()])?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("extraPods: 100000000 is too many: expected at most 10000"),
        "{err}"
    );
    std::fs::write(&config, format!("# {}\n", "x".repeat(2 << 20)))?;
    let out = sim(&["--config", &config.display().to_string()])?;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is larger than 1048576 bytes"), "{err}");
    assert!(!state.exists(), "nothing was written");
    Ok(())
}

// ---- 19: GitHub and JSON patch ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_refuses_bad_branch_names_with_422() -> TestResult {
    let (twin, _work, _repo) = start_with_github(NetLimits::default()).await?;
    let wire = Wire::github(twin.github.as_ref().ok_or("github emulator")?);
    let names = [
        "../../etc",
        "refs/..",
        "a..b",
        "a~1",
        "a^",
        "other:b",
        "a b",
        "a\u{1}b",
        "-x",
        "HEAD",
        "a.lock",
        ".hidden",
        "a//b",
        "a@{1}",
        "",
        "a\\b",
        "a*",
        "a?",
        "a[",
    ];
    for name in names {
        for field in ["head", "base"] {
            let mut body = json!({"title": "t", "head": "renovate/cilium-1.18.x", "base": "main"});
            body[field] = json!(name);
            let r = wire
                .json("POST", "/repos/local/homelab/pulls", &body)
                .await?;
            assert_eq!(r.code, 422, "{field} {name:?}: {}", r.text);
            assert_eq!(r.body["message"], "Validation Failed", "{}", r.text);
            assert_eq!(r.body["errors"][0]["field"], field, "{}", r.text);
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_patch_copy_and_move_work_and_unknown_ops_are_unsupported() -> TestResult {
    let (twin, _state) = start(Clock::manual(), TwinOptions::default()).await?;
    let wire = Wire::kube(&twin.kube)?;
    let patch = |ops: Value| {
        wire.send(
            "PATCH",
            "/api/v1/nodes/w-1",
            Some("application/json-patch+json"),
            ops.to_string().into_bytes(),
        )
    };
    let r = patch(json!([
        {"op": "copy", "from": "/metadata/labels/kubernetes.io~1hostname", "path": "/metadata/labels/copied"},
        {"op": "move", "from": "/metadata/labels/copied", "path": "/metadata/labels/moved"}
    ]))
    .await?;
    assert_eq!(r.code, 200, "{}", r.text);
    assert_eq!(r.body["metadata"]["labels"]["moved"], "w-1");
    assert!(r.body["metadata"]["labels"].get("copied").is_none());
    let r = patch(json!([{"op": "frobnicate", "path": "/spec"}])).await?;
    assert_eq!(r.code, 422, "{}", r.text);
    assert!(r.text.contains("is not supported"), "{}", r.text);
    Ok(())
}

#[tokio::test]
async fn a_huge_replica_count_is_capped_by_the_controllers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let behaviour = Behaviour {
        max_replicas: 20,
        ..Behaviour::default()
    };
    let t = KubeTwin::start_with(
        Clock::manual(),
        KubeSeed::typical(1, 2),
        behaviour,
        dir.path(),
    )
    .await?;
    let wire = Wire::kube(&t)?;
    let r = wire
        .send(
            "PATCH",
            "/apis/apps/v1/namespaces/kube-system/deployments/coredns",
            Some("application/merge-patch+json"),
            br#"{"spec": {"replicas": 100000000}}"#.to_vec(),
        )
        .await?;
    assert_eq!(r.code, 200, "{}", r.text);
    let pods = t.with(|c, _| {
        c.list("pods", Some("kube-system"))
            .iter()
            .filter(|p| {
                p.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.starts_with("coredns-"))
            })
            .count()
    });
    assert_eq!(pods, 20);
    assert_eq!(
        wire.send("GET", "/api/v1/nodes", None, vec![]).await?.code,
        200
    );
    Ok(())
}
