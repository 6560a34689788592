//! `ichor demo`: the whole loop on the embedded default. The bundled homelab repository is
//! built as real git history; the twin runs its cluster (the Talos and Kubernetes APIs on
//! loopback), the GitHub emulator serves the repository, and `ichor run`'s controller
//! watches both. Renovate-shaped PRs arrive by webhook, get `ichor/gate` and a sticky
//! comment; the blocked one stays red, the good one is merged and rolled out, and the
//! comment follows it to the end. The twin's clock is simulated: hours of rollout pass in
//! seconds.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use ichor::controller::{self, Config, Running};
use ichor::git::Repo;
use ichor::sim::github::{GithubTwin, GithubTwinConfig, RepoSpec, WebhookTarget, RENOVATE_LOGIN};
use ichor::sim::twin::{ClusterFolder, Twin, TwinOptions};

const REPO: &str = "mara/homelab";
/// Real time the demo waits for any one thing before it gives up (only a hang gets there).
const PATIENCE: Duration = Duration::from_secs(120);

pub fn demo(dir: Option<std::path::PathBuf>) -> anyhow::Result<ExitCode> {
    let fixture = ichor::sim::fixture::Fixture::homelab();
    // Without --dir everything lives in temporary directories removed on return.
    let tmp;
    let (path, kept) = match dir {
        Some(d) => {
            super::prepare_demo_dir(&fixture, &d)?;
            (d, true)
        }
        None => {
            tmp = tempfile::Builder::new().prefix("ichor-demo-").tempdir()?;
            fixture.build(tmp.path())?;
            (tmp.path().to_path_buf(), false)
        }
    };
    let repo = Repo::open(&path)?;
    let mut out = format!(
        "ichor demo: the homelab repository ({} commits on main, {} branches) at {}{}\n\n\
         ━━ Every branch, as `ichor check --base main --head <branch>` judges it\n",
        fixture.history.main.len(),
        fixture.history.branches.len(),
        path.display(),
        if kept {
            ""
        } else {
            " (temporary; keep it with --dir DIR)"
        },
    );
    for b in &fixture.history.branches {
        let line = match ichor::gate::load(&repo, &b.base, &b.name, None) {
            Ok(change) => {
                let v = ichor::gate::verdict(&change);
                format!(
                    "{:<8} {}",
                    v.outcome.to_string().to_uppercase(),
                    ichor::forge::comment::gate_description(&v)
                )
            }
            Err(e) => format!("INVALID  {}", e.to_string().lines().next().unwrap_or("")),
        };
        out.push_str(&format!(
            "  {:<44} {}\n",
            b.name,
            ichor::escape::terminal(&line)
        ));
    }
    super::print(&out)?;
    let runtime = super::runtime(Some(2))?;
    runtime.block_on(the_loop(&path, &fixture))?;
    Ok(ExitCode::SUCCESS)
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    │ {}\n", ichor::escape::terminal(l)))
        .collect()
}

struct Stage<'a> {
    twin: &'a Twin,
    gh: &'a GithubTwin,
    running: &'a Running,
}

impl Stage<'_> {
    async fn wait(&self, what: &str, cond: impl FnMut() -> bool) -> anyhow::Result<()> {
        let drive = self.twin.drive(Duration::from_secs(2), || {});
        if self.running.wait_until(drive, cond, PATIENCE).await {
            Ok(())
        } else {
            anyhow::bail!("the demo waited too long for {what}")
        }
    }

    fn status(&self, sha: &str, context: &str) -> Option<(String, String)> {
        let (_, latest) = self.gh.combined_status(REPO, sha).ok()?;
        latest.into_iter().find(|s| s.context == context).map(|s| {
            (
                format!("{:?}", s.state).to_lowercase(),
                s.description.unwrap_or_default(),
            )
        })
    }

    fn sticky(&self, pr: u64) -> Option<String> {
        self.gh
            .comments(REPO, pr)
            .ok()?
            .into_iter()
            .find(|c| c.user == self.gh.login() && c.body.contains("<!-- ichor:sticky"))
            .map(|c| c.body)
    }
}

/// The progress lines of a sticky comment.
fn progress(body: &str) -> Vec<String> {
    body.split("<summary>Progress</summary>")
        .nth(1)
        .map(|rest| {
            rest.lines()
                .take_while(|l| !l.starts_with("</details>"))
                .filter_map(|l| l.strip_prefix("- "))
                .filter(|l| !l.starts_with("… "))
                .map(|l| l.replace('\\', ""))
                .collect()
        })
        .unwrap_or_default()
}

async fn the_loop(repo: &Path, fixture: &ichor::sim::fixture::Fixture) -> anyhow::Result<()> {
    let state = tempfile::Builder::new()
        .prefix("ichor-demo-loop-")
        .tempdir()?;
    let folder = ClusterFolder::read(&repo.join("clusters").join("homelab"))?;
    // It is Saturday morning and the homelab's maintenance window has just opened.
    let doc = ichor::releaseset::Cluster::parse(
        "cluster.yaml",
        &std::fs::read_to_string(repo.join("clusters/homelab/cluster.yaml"))?,
    )?;
    let clock = ichor::clock::Clock::manual_at(ichor::rollout::window::next_open(
        &doc.spec.rollout.maintenance_windows,
        ichor::clock::Clock::manual().now(),
    ));
    let twin = Twin::start(
        clock.clone(),
        &folder,
        &state.path().join("twin"),
        TwinOptions::default(),
    )
    .await?;
    twin.advance(Duration::from_secs(30));
    // deploy/ creates ichor's namespace.
    ichor::kube::KubeClient::connect(Some(twin.kubeconfig()))
        .await?
        .ensure_namespace(ichor::gate::live::ICHOR_NAMESPACE)
        .await?;
    let origin = ichor::sim::github::private_clone(repo, state.path(), REPO)?;
    let gh = GithubTwin::start_with(
        clock.clone(),
        GithubTwinConfig {
            repos: vec![RepoSpec {
                full_name: REPO.into(),
                path: origin,
                default_branch: "main".into(),
            }],
            ..GithubTwinConfig::default()
        },
    )
    .await?;
    let secret: [u8; 16] = rand::random();
    let secret = hex::encode(secret);
    let files = state.path().join("secrets");
    std::fs::create_dir_all(&files)?;
    std::fs::write(files.join("token"), gh.token())?;
    std::fs::write(files.join("webhook"), &secret)?;
    let config = format!(
        "repository:\n  url: {}\n  branch: main\ngithub:\n  repository: {REPO}\n  apiUrl: {}\n\
         credentials:\n  github:\n    tokenFile: {}\nwebhook:\n  secretFile: {}\n\
         clusters:\n  - name: homelab\n    kubeconfig: {}\n    talosconfig: {}\n\
         pollInterval: 10m\nlisten: 127.0.0.1:0\nmetricsListen: 127.0.0.1:0\nstateDir: {}\n\
         leaderElection:\n  identity: demo\n  leaseDuration: 1h\n",
        gh.clone_url(REPO),
        gh.base_url(),
        files.join("token").display(),
        files.join("webhook").display(),
        twin.kubeconfig().display(),
        twin.talosconfig().display(),
        state.path().join("ichor").display(),
    );
    let cfg = Config::parse("demo config", &config)?;
    let running = controller::start(cfg, clock.clone()).await?;
    let webhook_url = running
        .webhook_url()
        .ok_or_else(|| anyhow::anyhow!("the demo's controller has no webhook listener"))?;
    gh.set_webhook(Some(WebhookTarget {
        url: webhook_url.clone(),
        secret,
    }));
    let stage = Stage {
        twin: &twin,
        gh: &gh,
        running: &running,
    };
    super::print(&format!(
        "\n━━ The loop: the twin runs the homelab cluster (Talos and Kubernetes APIs on loopback), the\n   GitHub emulator serves {REPO} at {}, and `ichor run` watches both\n   (webhooks to {}, metrics at http://{}/metrics)\n",
        gh.base_url(),
        webhook_url,
        running.metrics_addr
    ))?;

    let mut pulls = Vec::new();
    for name in ["renovate/ghcr.io-siderolabs-kubelet-1.x", "renovate/talos"] {
        let spec = fixture
            .history
            .branches
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| anyhow::anyhow!("the fixture has no branch {name}"))?;
        let pr = gh
            .open_pull_request(REPO, name, "main", &spec.title, &spec.body, RENOVATE_LOGIN)
            .await?;
        let head = pr.head_sha.clone();
        stage
            .wait("the gate", || {
                stage.status(&head, "ichor/gate").is_some() && stage.sticky(pr.number).is_some()
            })
            .await?;
        let (state, description) = stage.status(&head, "ichor/gate").unwrap_or_default();
        super::print(&format!(
            "\n━━ Renovate opens #{} “{}”\n  webhook pull_request.opened → ichor\n  status ichor/gate on {}: {state} — {}\n  the sticky comment ichor keeps on #{} (edited in place from now on):\n{}",
            pr.number,
            spec.title,
            &head[..10],
            ichor::escape::terminal(&description),
            pr.number,
            indent(&stage.sticky(pr.number).unwrap_or_default())
        ))?;
        pulls.push(pr);
    }
    let (blocked, good) = (&pulls[0], &pulls[1]);
    super::print(&format!(
        "\n━━ #{} stays red: Renovate will not automerge it while ichor/gate fails. #{} is green: merged.\n",
        blocked.number, good.number
    ))?;
    let merge = gh.merge_pull_request(REPO, good.number, "mara").await?;
    let started = clock.now();
    let mut shown_status = String::new();
    let mut shown_lines: Vec<String> = Vec::new();
    let mut log = String::new();
    stage
        .wait("the rollout's end", || {
            if let Some((state, d)) = stage.status(&merge, "ichor/rollout") {
                let now = format!("{state} — {d}");
                if now != shown_status {
                    log.push_str(&format!(
                        "  +{:<8} ichor/rollout {}\n",
                        ichor::releaseset::HumanDuration(clock.now().since(started)).to_string(),
                        ichor::escape::terminal(&now)
                    ));
                    shown_status = now;
                }
            }
            if let Some(body) = stage.sticky(good.number) {
                for l in progress(&body) {
                    if !shown_lines.contains(&l) {
                        log.push_str(&format!("      {}\n", ichor::escape::terminal(&l)));
                        shown_lines.push(l);
                    }
                }
                let done = stage
                    .status(&merge, "ichor/rollout")
                    .is_some_and(|(s, _)| s != "pending");
                return done && (body.contains("**Done**") || body.contains("**Paused**"));
            }
            false
        })
        .await?;
    super::print(&format!(
        "\n━━ ichor rolls the cluster out: Talos node by node, then Kubernetes (status ichor/rollout on the\n   merge commit {}; progress in #{}'s comment; simulated time)\n{log}",
        &merge[..10],
        good.number
    ))?;
    let body = stage.sticky(good.number).unwrap_or_default();
    // The rollout section; the checklist and plan below it are as shown above.
    let top = body.split("\n---\n").next().unwrap_or("");
    let top: String = top
        .lines()
        .take_while(|l| !l.starts_with("<details>"))
        .map(|l| format!("{l}\n"))
        .collect();
    super::print(&format!(
        "\n━━ The top of #{}'s comment at the end (the checklist and the plan follow it):\n{}",
        good.number,
        indent(&top)
    ))?;
    let m = &running.ctx.metrics;
    super::print(&format!(
        "\n━━ What ichor counted (/metrics): gates passed {}, blocked {}; webhook deliveries accepted {}; rollouts completed {}\n\
         \nOn a real cluster the same runs as `ichor run --config deploy/config.yaml`; see docs/run.md.\n",
        m.value("ichor_gates_total", &[("outcome", "pass")]),
        m.value("ichor_gates_total", &[("outcome", "blocked")]),
        ["pull_request", "push", "issue_comment"]
            .iter()
            .map(|e| m.value("ichor_webhook_deliveries_total", &[("result", "accepted"), ("reason", e)]))
            .sum::<f64>(),
        m.value("ichor_rollouts_total", &[("outcome", "completed")]),
    ))?;
    running.shutdown().await;
    gh.shutdown().await;
    twin.shutdown().await;
    Ok(())
}
