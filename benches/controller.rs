//! `ichor run` benchmarks, against the twin and the GitHub emulator on loopback. Run with
//! `cargo bench --bench controller`; figures are printed (as ratios where a ratio means
//! something), never asserted. `ICHOR_BENCH_PRS` (default 50) sets how many PRs.
//!
//! 1. Webhook received → `ichor/gate` posted (fetch of the PR head into ichor's mirror, the
//!    gate with the live items, the plan, the status and the sticky comment), against a
//!    bare fetch of the same PR head by libgit2 into a mirror that already has main, on a
//!    repository whose main has 10,000 commits: p50 and p99 over the PRs, as ratios.
//! 2. Webhook deliveries per second the receiver sustains (signature checked, deduplicated,
//!    parsed, queued) with eight concurrent senders, and how many it refused.
//! 3. Resident memory of the process running the controller while it watches the open PRs
//!    (the twin and the emulator run in the same process: the figure is an upper bound).

use std::path::Path;
use std::time::{Duration, Instant};

use ichor::clock::Clock;
use ichor::controller::{self, Config};
use ichor::git::remote::{Credentials, Mirror, Remote};
use ichor::sim::github::{GithubTwin, GithubTwinConfig, RepoSpec, WebhookTarget, RENOVATE_LOGIN};
use ichor::sim::twin::{ClusterFolder, Twin, TwinOptions};

type Error = Box<dyn std::error::Error>;

const REPO: &str = "bench/homelab";
const SECRET: &str = "bench-secret";
const HISTORY: usize = 10_000;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The homelab fixture with `HISTORY` more commits on main, bare.
fn long_history(dir: &Path) -> Result<std::path::PathBuf, Error> {
    let work = dir.join("work");
    let repo = ichor::sim::fixture::Fixture::homelab().build(&work)?;
    let sig = git2::Signature::new(
        "Bench",
        "bench@example.org",
        &git2::Time::new(1_780_000_000, 0),
    )?;
    let mut parent = repo.find_commit(repo.revparse_single("main")?.peel_to_commit()?.id())?;
    for i in 0..HISTORY {
        let mut b = git2::build::TreeUpdateBuilder::new();
        let blob = repo.blob(format!("change {i}\n").as_bytes())?;
        b.upsert(
            format!("notes/{:02}/change.txt", i % 97),
            blob,
            git2::FileMode::Blob,
        );
        let tree = repo.find_tree(b.create_updated(&repo, &parent.tree()?)?)?;
        let oid = repo.commit(
            None,
            &sig,
            &sig,
            &format!("chore: change {i}"),
            &tree,
            &[&parent],
        )?;
        parent = repo.find_commit(oid)?;
    }
    repo.reference("refs/heads/main", parent.id(), true, "history")?;
    Ok(ichor::sim::github::private_clone(&work, dir, REPO)?)
}

fn main() -> Result<(), Error> {
    let prs: usize = std::env::var("ICHOR_BENCH_PRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
        .clamp(2, 500);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(prs))
}

async fn bench(prs: usize) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let started = Instant::now();
    let origin = long_history(dir.path())?;
    println!(
        "repository: homelab + {HISTORY} commits on main, built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let clock = Clock::system();
    let folder = ClusterFolder::read(&dir.path().join("work/clusters/homelab"))?;
    let twin = Twin::start(
        clock.clone(),
        &folder,
        &dir.path().join("twin"),
        TwinOptions::default(),
    )
    .await?;
    ichor::kube::KubeClient::connect(Some(twin.kubeconfig()))
        .await?
        .ensure_namespace(ichor::gate::live::ICHOR_NAMESPACE)
        .await?;
    let gh = GithubTwin::start_with(
        clock.clone(),
        GithubTwinConfig {
            repos: vec![RepoSpec {
                full_name: REPO.into(),
                path: origin,
                default_branch: "main".into(),
            }],
            rate_limit: 1_000_000,
            ..GithubTwinConfig::default()
        },
    )
    .await?;
    std::fs::write(dir.path().join("token"), gh.token())?;
    std::fs::write(dir.path().join("secret"), SECRET)?;
    let text = format!(
        "repository:\n  url: {}\ngithub:\n  repository: {REPO}\n  apiUrl: {}\n\
         credentials:\n  github:\n    tokenFile: {}\nwebhook:\n  secretFile: {}\n\
         clusters:\n  - name: homelab\n    kubeconfig: {}\n    talosconfig: {}\n    act: false\n\
         pollInterval: 1h\nlisten: 127.0.0.1:0\nmetricsListen: 127.0.0.1:0\nstateDir: {}\n",
        gh.clone_url(REPO),
        gh.base_url(),
        dir.path().join("token").display(),
        dir.path().join("secret").display(),
        twin.kubeconfig().display(),
        twin.talosconfig().display(),
        dir.path().join("ichor").display(),
    );
    let rss_before = rss_mib();
    let running = controller::start(Config::parse("bench", &text)?, clock.clone()).await?;
    gh.set_webhook(Some(WebhookTarget {
        url: running.webhook_url().ok_or("no webhook listener")?,
        secret: SECRET.into(),
    }));
    // The first reconcile fetches the whole history once.
    let first = Instant::now();
    running
        .wait_until(
            std::future::pending(),
            || running.ctx.ready.load(std::sync::atomic::Ordering::Relaxed),
            Duration::from_secs(600),
        )
        .await;
    println!(
        "first fetch of the repository into ichor's mirror: {:.2} s",
        first.elapsed().as_secs_f64()
    );

    // A bare fetch for comparison: a mirror that already has main, fetching one PR head.
    let bare = Mirror::open(&dir.path().join("bare.git"))?;
    let remote = Remote {
        url: gh.clone_url(REPO),
        credentials: Credentials::Token {
            user: "x-access-token".into(),
            token: ichor::secret::Secret::new(gh.token()),
        },
        known_hosts: None,
    };
    bare.fetch(&remote, &["+refs/heads/main:refs/heads/main"])?;

    let mut gate_times = Vec::new();
    let mut fetch_times = Vec::new();
    for i in 0..prs {
        let branch = format!("renovate/cilium-{i}");
        // Renovate's commit: cilium's patch bump, a distinct commit per PR.
        let release_set =
            std::fs::read_to_string(dir.path().join("work/clusters/homelab/release-set.yaml"))?
                .replacen("version: 1.18.3", "version: 1.18.6", 1)
                + &format!("# bench {i}\n");
        gh.push_commit(
            REPO,
            &branch,
            &[("clusters/homelab/release-set.yaml", &release_set)],
            "fix(helm): update chart cilium",
            RENOVATE_LOGIN,
        )
        .await?;
        let t0 = Instant::now();
        let pr = gh
            .open_pull_request(REPO, &branch, "main", &branch, "Renovate", RENOVATE_LOGIN)
            .await?;
        let head = pr.head_sha.clone();
        let ok = running
            .wait_until(
                std::future::pending(),
                || {
                    gh.combined_status(REPO, &head)
                        .map(|(_, l)| l.iter().any(|s| s.context == "ichor/gate"))
                        .unwrap_or(false)
                },
                Duration::from_secs(120),
            )
            .await;
        if !ok {
            return Err(format!("PR {} got no status", pr.number).into());
        }
        gate_times.push(t0.elapsed());
        let t1 = Instant::now();
        let spec = format!("+refs/pull/{}/head:refs/pull/{}/head", pr.number, pr.number);
        bare.fetch(&remote, &[spec.as_str()])?;
        fetch_times.push(t1.elapsed());
    }
    let rss_watching = rss_mib();
    gate_times.sort();
    fetch_times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (g50, g99) = (percentile(&gate_times, 0.5), percentile(&gate_times, 0.99));
    let (f50, f99) = (
        percentile(&fetch_times, 0.5),
        percentile(&fetch_times, 0.99),
    );
    println!("\n1. webhook → ichor/gate posted, over {prs} PRs ({HISTORY}-commit main)");
    println!(
        "   webhook → status  p50 {:.1} ms  p99 {:.1} ms",
        ms(g50),
        ms(g99)
    );
    println!(
        "   bare git fetch    p50 {:.1} ms  p99 {:.1} ms",
        ms(f50),
        ms(f99)
    );
    println!(
        "   ratio             p50 {:.2}  p99 {:.2}",
        ms(g50) / ms(f50).max(0.001),
        ms(g99) / ms(f99).max(0.001)
    );

    // 2. Deliveries per second: comments without a command, each signed and unique.
    let total = 4000usize;
    let body = |i: usize| {
        format!(
            r#"{{"action":"created","issue":{{"number":1,"pull_request":{{}}}},"comment":{{"id":{i},"user":{{"login":"someone"}},"body":"looks good {i}"}},"repository":{{"full_name":"{REPO}"}}}}"#
        )
    };
    let url = running.webhook_url().ok_or("no webhook listener")?;
    let t0 = Instant::now();
    let mut senders = Vec::new();
    for s in 0..8usize {
        let url = url.clone();
        let bodies: Vec<(usize, String)> = (0..total)
            .filter(|i| i % 8 == s)
            .map(|i| (i, body(i)))
            .collect();
        senders.push(tokio::spawn(async move {
            use http_body_util::BodyExt;
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<http_body_util::Full<axum::body::Bytes>>();
            let mut refused = 0usize;
            for (i, b) in bodies {
                let sig = ichor::forge::webhook::sign(SECRET.as_bytes(), b.as_bytes());
                let req = http::Request::post(&url)
                    .header("x-github-event", "issue_comment")
                    .header("x-github-delivery", format!("bench-{i}"))
                    .header("x-hub-signature-256", sig)
                    .body(http_body_util::Full::new(axum::body::Bytes::from(b)));
                let Ok(req) = req else {
                    refused += 1;
                    continue;
                };
                match client.request(req).await {
                    Ok(resp) => {
                        if resp.status() != 202 {
                            refused += 1;
                        }
                        let _ = resp.into_body().collect().await;
                    }
                    Err(_) => refused += 1,
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for s in senders {
        refused += s.await?;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!("\n2. webhook deliveries: {total} in {secs:.2} s = {:.0}/s with 8 senders; {refused} refused", total as f64 / secs);

    println!(
        "\n3. resident memory: {:.1} MiB watching {prs} open PRs ({:.1} MiB before the controller started; twin and emulator included)",
        rss_watching, rss_before
    );
    running.shutdown().await;
    Ok(())
}
