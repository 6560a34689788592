//! ichor as deployed: `kubectl apply -k deploy/` into the twin, a token for ichor's
//! ServiceAccount from `kubectl create token`, and a whole rollout run with that token, so a
//! verb deploy/ does not grant is a 403 here as on a real cluster. The bootstrap manifests go
//! through the admin kubeconfig Talos issues (ADR 0057), as Talos's field manager, without
//! force: another manager's field stops the sync, naming the object and the manager.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ichor::kube::KubeClient;
use ichor::rollout::RunOutcome;
use ichor::sim::twin::TwinConfig;

use crate::rollout::{assert_finished, paused, run_once, setup, Setup};

type TestResult = Result<(), Box<dyn std::error::Error>>;
type Error = Box<dyn std::error::Error>;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Real kubectl against the twin, with `kubeconfig`, its discovery cache under `cache`;
/// stdin from `input`. kubectl blocks, so it runs off the async runtime.
async fn kubectl(
    kubeconfig: &Path,
    cache: &Path,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, Error> {
    let mut cmd = Command::new(crate::tools::KUBECTL.path());
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let input = input.map(str::to_string);
    let out = tokio::task::spawn_blocking(move || -> std::io::Result<std::process::Output> {
        let mut child = cmd.spawn()?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            use std::io::Write;
            stdin.write_all(text.as_bytes())?;
        }
        child.wait_with_output()
    })
    .await??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(format!("kubectl {}: {stderr}{stdout}", args.join(" ")).into());
    }
    Ok(stdout)
}

/// `kubectl apply -k deploy/` with the admin kubeconfig, then a kubeconfig for ichor's
/// ServiceAccount with a token from `kubectl create token`.
pub(crate) async fn deployed(s: &Setup, dir: &Path) -> Result<PathBuf, Error> {
    let admin = s.twin.kubeconfig();
    let cache = dir.join("cache");
    let deploy = repo_root().join("deploy");
    let deploy = deploy.to_str().ok_or("a UTF-8 path")?;
    let applied = kubectl(admin, &cache, &["apply", "-k", deploy], None).await?;
    for object in [
        "serviceaccount/ichor",
        "deployment.apps/ichor",
        "networkpolicy.networking.k8s.io/ichor",
    ] {
        assert!(applied.contains(object), "{applied}");
    }
    // A day, not the TokenRequest default of an hour: the rollout's simulated time runs past
    // an hour on a loaded machine, and a token in a kubeconfig is not refreshed (in the
    // cluster the kubelet refreshes the projected token file ichor reads).
    let token = kubectl(
        admin,
        &cache,
        &[
            "create",
            "token",
            "ichor",
            "-n",
            "ichor-system",
            "--duration=24h",
        ],
        None,
    )
    .await?;
    let token = token.trim();
    assert!(!token.is_empty());
    // The admin kubeconfig with the ServiceAccount's token in place of the admin's.
    let text = std::fs::read_to_string(admin)?;
    let sa = text.replace(s.twin.kube.token(), token);
    assert_ne!(sa, text, "the twin's kubeconfig carries its token");
    let path = dir.join("ichor-sa.kubeconfig");
    std::fs::write(&path, sa)?;
    Ok(path)
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn the_deployed_service_account_is_held_to_its_rbac_and_rolls_the_cluster_out() -> TestResult
{
    let mut s = setup(TwinConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let sa_config = deployed(&s, dir.path()).await?;
    let cache = dir.path().join("cache-sa");

    // What deploy/ grants answers; what it does not is the apiserver's 403, word for word
    // (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/writers.go).
    kubectl(&sa_config, &cache, &["get", "nodes"], None).await?;
    let refused = kubectl(
        &sa_config,
        &cache,
        &["get", "secrets", "-n", "kube-system"],
        None,
    )
    .await
    .err()
    .ok_or("listing kube-system's Secrets must be refused")?
    .to_string();
    assert!(
        refused.contains(
            "secrets is forbidden: User \"system:serviceaccount:ichor-system:ichor\" cannot list resource \"secrets\" in API group \"\" in the namespace \"kube-system\""
        ),
        "{refused}"
    );
    let can = kubectl(
        &sa_config,
        &cache,
        &["auth", "can-i", "patch", "daemonsets", "-n", "kube-system"],
        None,
    )
    .await;
    assert!(
        can.as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("no")),
        "ichor's ServiceAccount keeps no write on DaemonSets: {can:?}"
    );
    let yes = kubectl(
        &sa_config,
        &cache,
        &["auth", "can-i", "list", "nodes"],
        None,
    )
    .await?;
    assert_eq!(yes.trim(), "yes");

    // The whole rollout as that ServiceAccount; the manifest sync goes through Talos.
    s.kube = KubeClient::connect(Some(&sa_config)).await?;
    let (outcome, seen, lines) = run_once(&s, false).await?;
    assert!(seen.is_empty(), "{seen:?}");
    assert!(
        matches!(outcome, RunOutcome::Completed { .. }),
        "{outcome:?}\n{:#?}",
        lines.all()
    );
    assert!(lines.any("bootstrap manifests:"), "{:#?}", lines.all());
    assert_finished(&s).await?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs kubectl: scripts/test installs it"]
async fn a_bootstrap_manifest_field_another_manager_owns_pauses_naming_both() -> TestResult {
    let s = setup(TwinConfig::default()).await?;
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("cache");
    // Someone edited CoreDNS's image by hand with server-side apply ("the Corefile edit").
    let coredns = kubectl(
        s.twin.kubeconfig(),
        &cache,
        &[
            "get",
            "deployment",
            "coredns",
            "-n",
            "kube-system",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
        None,
    )
    .await?;
    let edited = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: coredns\n  namespace: kube-system\nspec:\n  selector:\n    matchLabels:\n      k8s-app: kube-dns\n  template:\n    metadata:\n      labels:\n        k8s-app: kube-dns\n    spec:\n      containers:\n        - name: coredns\n          image: {}-patched\n",
        coredns.trim()
    );
    kubectl(
        s.twin.kubeconfig(),
        &cache,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=platform-team",
            "-f",
            "-",
        ],
        Some(&edited),
    )
    .await?;
    let (outcome, _, lines) = run_once(&s, false).await?;
    let pause = paused(outcome)?;
    assert_eq!(pause.stage, "kube-proxy-manifests", "{pause:?}");
    assert!(
        pause.reason.contains("Deployment kube-system/coredns")
            && pause.reason.contains("platform-team")
            && pause.reason.contains("without force"),
        "{}\n{:#?}",
        pause.reason,
        lines.all()
    );
    // The edit is still there: nothing was forced over it.
    let now = kubectl(
        s.twin.kubeconfig(),
        &cache,
        &[
            "get",
            "deployment",
            "coredns",
            "-n",
            "kube-system",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
        None,
    )
    .await?;
    assert!(now.ends_with("-patched"), "{now}");
    Ok(())
}
