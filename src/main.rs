//! The `ichor` command line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use ichor::gate::{self, CheckReport, GateError, Review};
use ichor::git::Repo;
use ichor::plan::PlanOptions;
use ichor::policy::Outcome;

#[path = "cli/demo.rs"]
mod demo_cmd;
#[path = "cli/rehearse.rs"]
mod rehearse_cmd;
#[path = "cli/rollout.rs"]
mod rollout_cmd;
#[path = "cli/run.rs"]
mod run_cmd;

/// Gate and roll out Talos Linux and Kubernetes upgrades from Git.
#[derive(Parser)]
#[command(name = "ichor", version = VERSION, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Judge a change: every cluster it touches, against the compatibility data.
    ///
    /// Without --cluster, each cluster whose release-set.yaml or cluster.yaml differs between
    /// the two revisions gets its own section (a cluster the change adds is judged on its
    /// own); a change that edits only policies/ is judged as that policy change.
    ///
    /// Exit status: 0 pass (warnings allowed), 1 blocked, 2 invalid input or usage, 3 waiting;
    /// with several clusters, the worst of them.
    Check {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        access: Access,
        /// text: a table for the terminal; json: the stable report of docs/cli.md; markdown:
        /// the table as a pull-request comment shows it.
        #[arg(long, value_enum, default_value_t = CheckOutput::Text)]
        output: CheckOutput,
    },
    /// Show the staged rollout a change would run: stages, node order, batches, estimate.
    ///
    /// The gate runs first. A change it blocks (or that waits) gets no plan: the verdict is
    /// printed instead, with exit status 1 (or 3), unless --allow-blocked.
    ///
    /// Exit status: 0 a plan was shown, 1 blocked, 2 invalid input or usage, 3 waiting.
    Plan {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        access: Access,
        /// text: the steps for the terminal; json: the stable report of docs/cli.md;
        /// mermaid: a gantt chart; markdown: ordered steps and the gantt, for a PR comment.
        #[arg(long, value_enum, default_value_t = PlanOutput::Text)]
        output: PlanOutput,
        /// The node running ichor; its batch goes last. Must be a node of the inventory.
        #[arg(long, value_name = "NODE")]
        ichor_node: Option<String>,
        /// Keep the two-pass order for a bump moving Talos and Kubernetes: each worker
        /// drained for Talos, then again for its kubelet (default: drained once for both).
        #[arg(long)]
        two_pass: bool,
        /// Show the plan even when the gate blocks the change (it is still not run).
        #[arg(long)]
        allow_blocked: bool,
        /// The time the calendar counts from (maintenance windows), instead of now.
        #[arg(long, value_name = "RFC3339", hide = true)]
        now: Option<String>,
    },
    /// Roll a merged change out on the live cluster: the live gate first, then the staged
    /// plan (Talos, then Kubernetes), resumable from the record it keeps in the cluster.
    ///
    /// The change is REV against its first parent (or --base). A blocked change is refused.
    /// On a terminal the plan is shown and confirmed first (--yes skips that; without a
    /// terminal --yes is required). A rollout that paused continues with --resume.
    ///
    /// Exit status: 0 completed (or --dry-run shown), 1 the gate blocks the change, 2 invalid
    /// input or usage, 3 paused for a human (the reason is printed and kept in the record),
    /// 4 the cluster could not be reached, 5 another rollout holds the lock, 130 interrupted.
    Rollout {
        /// The GitOps repository (bare or with a work tree, or any folder inside it).
        #[arg(long, value_name = "PATH", default_value = ".")]
        repo: PathBuf,
        /// The merged revision to roll out, e.g. main or a merge commit.
        #[arg(long, value_name = "REV")]
        rev: String,
        /// What the change is judged against (default: REV's first parent).
        #[arg(long, value_name = "REV")]
        base: Option<String>,
        /// The cluster (folder under clusters/) when the repository holds several.
        #[arg(long, value_name = "NAME")]
        cluster: Option<String>,
        #[command(flatten)]
        access: Access,
        /// Show the gate and the plan, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Continue a rollout the record shows paused for this revision.
        #[arg(long)]
        resume: bool,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
        /// The node running ichor; it goes last.
        #[arg(long, value_name = "NODE", env = "ICHOR_NODE_NAME")]
        ichor_node: Option<String>,
        /// Keep the two-pass order for a bump moving Talos and Kubernetes: each worker
        /// drained for Talos, then again for its kubelet (default: drained once for both).
        #[arg(long)]
        two_pass: bool,
        /// Simulated seconds per wall-clock second, to rehearse against `ichor sim --speed N`.
        #[arg(long, value_name = "N", hide = true)]
        time_scale: Option<f64>,
        /// With --time-scale: where the simulated clock starts (e.g. the twin's start).
        #[arg(long, value_name = "RFC3339", hide = true)]
        clock_start: Option<String>,
    },
    /// Run the twin: a simulated Talos cluster served over the real Talos API (mutual TLS)
    /// and Kubernetes API, built from a cluster folder, until interrupted.
    Sim {
        /// The cluster folder: cluster.yaml (with spec.inventory) and release-set.yaml.
        #[arg(long, value_name = "DIR")]
        cluster: PathBuf,
        /// Simulated seconds per wall-clock second, from 0.001 to 100000.
        #[arg(
            long,
            value_name = "N",
            default_value_t = 1.0,
            allow_negative_numbers = true
        )]
        speed: f64,
        /// Where kubeconfig, talosconfig, github-token and the GitHub emulator's clone are
        /// written (mode 0700; files 0600). Default: $XDG_STATE_HOME/ichor/sim/<cluster>,
        /// else $HOME/.local/state/ichor/sim/<cluster>.
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Also serve the GitHub API emulator over a private clone (in the state dir) of the
        /// git repository holding the folder; the repository itself is never written.
        #[arg(long)]
        github: bool,
        /// With --github: register a GitHub App installed on the emulated repository (its
        /// id, installation id and private key go to <state-dir>/github-app/), so
        /// `ichor run` can post check runs as an App.
        #[arg(long, requires = "github")]
        github_app: bool,
        /// Timings and faults (YAML; see docs/twin.md).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// What the cluster runs right now: nodes, etcd, the CNI, the hand-over, removed APIs
    /// in use and the rollout lock.
    ///
    /// Exit status: 0 read (whatever it shows), 2 invalid input or usage, 4 the cluster
    /// could not be reached.
    Status {
        #[command(flatten)]
        access: Access,
        /// The GitOps repository, to learn the cluster's CNI and hand-over (optional).
        #[arg(long, value_name = "PATH")]
        repo: Option<PathBuf>,
        /// The revision of --repo to read (default: HEAD).
        #[arg(long, value_name = "REV", default_value = "HEAD")]
        rev: String,
        /// The cluster (folder under clusters/) when --repo holds several.
        #[arg(long, value_name = "NAME")]
        cluster: Option<String>,
        #[arg(long, value_enum, default_value_t = StatusOutput::Text)]
        output: StatusOutput,
    },
    /// The whole loop on the embedded twin: the bundled homelab repository served by the
    /// GitHub emulator, its cluster by the twin, and `ichor run` gating Renovate PRs that
    /// arrive by webhook, then rolling out the one that merges.
    Demo {
        /// Build the demo repository here and keep it (reused when it already is the demo
        /// repository); without it, a temporary directory is used and removed on exit.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Rehearse a bump on a twin of the cluster, many times, each seed under its own random
    /// faults (engine kills, PDBs that block, nodes that do not return, silent kubelets, an
    /// unhealthy etcd member, API error bursts, slow applies, replicas not rebuilt, an
    /// operator's cordon), judging every safety rule from the twin's own state.
    ///
    /// The twin is built from the base revision's cluster folder; the real engine rolls the
    /// head's release set out over the real protocols. When it pauses, the rehearsal clears
    /// the injected faults and resumes; a pause no injected fault explains is a finding.
    /// --seed N replays one seed and prints its whole event log.
    ///
    /// Exit status: 0 every seed held, 1 a rule broke, a rollout could not finish once its
    /// faults were cleared, or a pause went unexplained, 2 invalid input or usage.
    Rehearse {
        /// --base is what the cluster runs now (the twin is built from it), --head the change
        /// to rehearse.
        #[command(flatten)]
        target: Target,
        /// The seeds to run, A..B with both ends included (default 1..20).
        #[arg(long, value_name = "A..B")]
        seeds: Option<String>,
        /// Replay one seed and print its whole event log.
        #[arg(long, value_name = "N")]
        seed: Option<u64>,
        /// Seeds rehearsed at once, each on a thread of its own (default: the cores).
        #[arg(long, value_name = "N")]
        jobs: Option<usize>,
        /// The faults to draw from, comma-separated (default: all): engineKilled,
        /// pdbBlocks, nodeNeverReturns, kubeletSilent, etcdUnhealthy, apiErrors, slowApply,
        /// replicasNeverRebuild, operatorCordon.
        #[arg(long, value_name = "LIST")]
        faults: Option<String>,
        /// text: a progress bar, then a summary; json: one document for CI (docs/rehearse.md).
        #[arg(long, value_enum, default_value_t = RehearseOutput::Text)]
        output: RehearseOutput,
    },
    /// The controller: watch the repository, gate every PR with a commit status and one
    /// sticky comment, roll out what reaches the protected branch, report it back.
    ///
    /// Configuration: docs/run.md (deploy/config.yaml is an example). Logs are JSON lines
    /// when stderr is not a terminal. Exit status: 0 stopped by SIGTERM or Ctrl-C, 2 an
    /// invalid configuration or a start that failed.
    Run {
        /// The configuration file.
        #[arg(long, value_name = "FILE", env = "ICHOR_CONFIG")]
        config: PathBuf,
        /// Validate the configuration and exit.
        #[arg(long)]
        check: bool,
    },
    /// Maintainers: the shipped compatibility data and its health.
    Policies {
        #[command(subcommand)]
        command: PoliciesCommand,
    },
}

/// Cluster access. With a kubeconfig, `check` adds the live items and `plan` plans from
/// the live nodes; with a talosconfig too, etcd is checked through the Talos API.
#[derive(clap::Args)]
struct Access {
    /// A kubeconfig for the cluster (read as kubectl reads it).
    #[arg(long, value_name = "PATH", env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// A talosconfig for the cluster (read as talosctl reads it).
    #[arg(long, value_name = "PATH", env = "TALOSCONFIG")]
    talosconfig: Option<PathBuf>,
    /// A bearer token (a file) for the Prometheus of cluster.yaml's health checks, sent
    /// only to `--prometheus-url`.
    #[arg(long, value_name = "PATH", requires = "prometheus_url")]
    prometheus_token_file: Option<PathBuf>,
    /// The Prometheus the token belongs to: a check naming another URL gets no token.
    #[arg(long, value_name = "URL", requires = "prometheus_token_file")]
    prometheus_url: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RehearseOutput {
    Text,
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StatusOutput {
    Text,
    Json,
}

#[derive(clap::Args)]
struct Target {
    /// The GitOps repository (bare or with a work tree, or any folder inside it).
    #[arg(long, value_name = "PATH", default_value = ".")]
    repo: PathBuf,
    /// The revision the change starts from: a branch, tag, remote branch (origin/x) or SHA,
    /// e.g. main. What decides safety (policies, inventory, rollout policy) is read here.
    #[arg(long, value_name = "REV")]
    base: String,
    /// The revision with the change, e.g. renovate/ghcr.io-siderolabs-kubelet-1.x; `.` is
    /// the working tree, so uncommitted edits can be gated.
    #[arg(long, value_name = "REV")]
    head: String,
    /// Judge only this cluster (folder under clusters/).
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum CheckOutput {
    Text,
    Json,
    Markdown,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PlanOutput {
    Text,
    Json,
    Mermaid,
    Markdown,
}

const EXIT_INVALID: u8 = 2;

/// `--version`: the commit and how current the shipped compatibility data is, since every
/// verdict depends on it (both from build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ICHOR_COMMIT"),
    ", compatibility data verified up to ",
    env!("ICHOR_POLICIES_DATE"),
    ")"
);

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Diagnostics go to stderr; RUST_LOG (e.g. `RUST_LOG=ichor=debug`) turns them up. The
    // controller logs at info, as JSON lines when nobody watches a terminal.
    let controller = matches!(cli.command, Command::Run { .. });
    // A rehearsal's engine retries through injected faults on purpose; what it does is in
    // each seed's event log, not on stderr.
    let rehearsal = matches!(cli.command, Command::Rehearse { .. });
    // kube-rs logs every failed connection as an error of its own; ichor reports each
    // failure itself, once and with what it was doing, so kube-rs's lines are off.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        if controller {
            "info,kube_client=off"
        } else if rehearsal {
            "error,kube_client=off"
        } else {
            "warn,kube_client=off"
        }
        .into()
    });
    // Colours only for a person at a terminal, never into a pipe or a log file.
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(terminal)
        .with_writer(std::io::stderr);
    if controller && !terminal {
        fmt.json().init();
    } else {
        fmt.init();
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check {
            target,
            access,
            output,
        } => {
            let mut review = review(&target)?;
            if let Some(live) = Live::connect(&access, &review)? {
                live.judge(&mut review);
            }
            let text = match output {
                CheckOutput::Json => json(&CheckReport::new(&review))?,
                CheckOutput::Text => check_text(&review, |v| v.render_text()),
                CheckOutput::Markdown => check_text(&review, |v| v.render_markdown()),
            };
            print(&text)?;
            Ok(ExitCode::from(gate::exit_code(&review) as u8))
        }
        Command::Plan {
            target,
            access,
            output,
            ichor_node,
            two_pass,
            allow_blocked,
            now,
        } => {
            let now = match now {
                Some(t) => ichor::clock::Timestamp::parse_rfc3339(&t)
                    .ok_or_else(|| anyhow::anyhow!("--now {t}: expected YYYY-MM-DDTHH:MM:SSZ"))?,
                None => ichor::clock::Clock::system().now(),
            };
            plan(
                &target,
                &access,
                output,
                ichor_node,
                two_pass,
                allow_blocked,
                now,
            )
        }
        Command::Status {
            access,
            repo,
            rev,
            cluster,
            output,
        } => status(&access, repo.as_deref(), &rev, cluster.as_deref(), output),
        Command::Sim {
            cluster,
            speed,
            state_dir,
            github,
            github_app,
            config,
        } => sim(cluster, speed, state_dir, (github, github_app), config),
        Command::Demo { dir } => demo_cmd::demo(dir),
        Command::Rehearse {
            target:
                Target {
                    repo,
                    base,
                    head,
                    cluster,
                },
            seeds,
            seed,
            jobs,
            faults,
            output,
        } => rehearse_cmd::rehearse(rehearse_cmd::Args {
            repo,
            base,
            head,
            cluster,
            seeds,
            seed,
            jobs,
            faults,
            json: output == RehearseOutput::Json,
        }),
        Command::Rollout {
            repo,
            rev,
            base,
            cluster,
            access,
            dry_run,
            resume,
            yes,
            ichor_node,
            two_pass,
            time_scale,
            clock_start,
        } => rollout_cmd::rollout(rollout_cmd::Args {
            repo,
            rev,
            base,
            cluster,
            kubeconfig: access.kubeconfig,
            talosconfig: access.talosconfig,
            dry_run,
            resume,
            yes,
            ichor_node,
            two_pass,
            time_scale,
            clock_start,
            prometheus: access.prometheus_url.zip(access.prometheus_token_file),
        }),
        Command::Run { config, check } => run_cmd::run(&config, check),
        Command::Policies { command } => policies(command),
    }
}

fn sim(
    dir: PathBuf,
    speed: f64,
    state_dir: Option<PathBuf>,
    (github, github_app): (bool, bool),
    config: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use ichor::sim::twin::{ClusterFolder, Twin, TwinConfig, TwinOptions};
    // The one speed check the library uses too.
    let clock =
        ichor::clock::Clock::try_scaled(speed).map_err(|e| anyhow::anyhow!("--speed: {e}"))?;
    let folder = ClusterFolder::read(&dir)?;
    let state_dir = match state_dir {
        Some(d) => d,
        None => ichor::sim::state::default_dir(folder.cluster.name(), |k| std::env::var_os(k))?,
    };
    let config = match &config {
        Some(path) => {
            let text = ichor::sim::twin::read_file(path)?;
            TwinConfig::parse(&path.display().to_string(), &text)?
        }
        None => TwinConfig::default(),
    };
    let github = if github {
        let repo = git2::Repository::discover(&dir).map_err(|e| {
            anyhow::anyhow!(
                "--github: {} is not inside a git repository: {}",
                dir.display(),
                e.message()
            )
        })?;
        let root = repo.workdir().unwrap_or_else(|| repo.path()).to_path_buf();
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "repo".into());
        Some((format!("local/{name}"), root))
    } else {
        None
    };
    let repo_name = github.as_ref().map(|(name, _)| name.clone());
    let options = TwinOptions { config, github };
    let runtime = runtime(None)?;
    runtime.block_on(async move {
        // Listen for Ctrl-C before saying we serve, so an interrupt right after the banner
        // stops the twin cleanly instead of killing the process.
        #[cfg(unix)]
        let interrupted = {
            let mut sigint =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
            async move {
                sigint.recv().await;
                Ok::<_, std::io::Error>(())
            }
        };
        #[cfg(not(unix))]
        let interrupted = tokio::signal::ctrl_c();
        let twin = Twin::start(clock, &folder, &state_dir, options).await?;
        let rs = &folder.release_set.spec;
        let mut out = format!(
            "ichor sim: cluster {} — {} nodes, Talos {}, Kubernetes {}, {}x speed\n\n",
            folder.cluster.name(),
            twin.talos.endpoints().len(),
            rs.talos,
            rs.kubernetes,
            speed
        );
        let abs =
            |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        out.push_str(&format!(
            "Kubernetes API  {}\n  export KUBECONFIG={}\n  kubectl get nodes -o wide\n\n",
            twin.kube.url,
            abs(twin.kubeconfig()).display()
        ));
        out.push_str("Talos API (one endpoint per node; any control plane routes by `-n`)\n");
        let observed = twin.talos.observe();
        for (name, addr) in twin.talos.endpoints() {
            let ip = observed
                .iter()
                .find(|o| &o.name == name)
                .map(|o| o.ip.to_string())
                .unwrap_or_default();
            out.push_str(&format!("  {name:<12} {addr:<22} node {ip}\n"));
        }
        out.push_str(&format!(
            "  export TALOSCONFIG={}\n  talosctl -n {} version\n",
            abs(twin.talosconfig()).display(),
            observed
                .first()
                .map(|o| o.ip.to_string())
                .unwrap_or_default()
        ));
        if let Some(gh) = &twin.github {
            let token_path = state_dir.join("github-token");
            ichor::sim::state::write_private(&token_path, gh.token().as_bytes())?;
            out.push_str(&format!(
                "\nGitHub API      {}\n  token in {}\n",
                gh.base_url(),
                abs(&token_path).display()
            ));
            if let (true, Some(repo)) = (github_app, &repo_name) {
                gh.register_app(ichor::sim::github::emulator_app(repo)?);
                let dir = state_dir.join("github-app");
                ichor::sim::state::prepare_dir(&dir)?;
                let id = ichor::sim::github::EMULATOR_APP_ID.to_string();
                let installation = ichor::sim::github::EMULATOR_INSTALLATION_ID.to_string();
                ichor::sim::state::write_private(&dir.join("app-id"), id.as_bytes())?;
                ichor::sim::state::write_private(
                    &dir.join("installation-id"),
                    installation.as_bytes(),
                )?;
                ichor::sim::state::write_private(
                    &dir.join("private-key.pem"),
                    ichor::sim::github::EMULATOR_APP_KEY.as_bytes(),
                )?;
                out.push_str(&format!(
                    "  GitHub App {id} (ichor[bot]), installation {installation}; for ichor run:\n    credentials.github: {{appId: {id}, installationId: {installation}, privateKeyFile: {}}}\n    credentials.git: {{tokenFile: {}}}\n",
                    abs(&dir.join("private-key.pem")).display(),
                    abs(&token_path).display()
                ));
            }
            if let Some(clone) = &twin.github_repo {
                out.push_str(&format!(
                    "  serving a private clone (merges land there, not in your repository):\n  git push {} <branch>\n",
                    abs(clone).display()
                ));
            }
        }
        out.push_str("\nServing until interrupted (Ctrl-C).\n");
        print(&out)?;
        interrupted.await?;
        twin.shutdown().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Judged as the controller judges a PR: the head against where it left the base (their
/// merge base, src/controller/gating.rs), so a branch behind the base shows no phantom
/// downgrades of what the base moved since.
fn review(t: &Target) -> Result<Review, GateError> {
    let repo = Repo::open(&t.repo)?;
    let Some(fork) = merge_base(&repo, &t.base, &t.head) else {
        return gate::review(&repo, &t.base, &t.head, t.cluster.as_deref());
    };
    let mut review = gate::review(&repo, &fork, &t.head, t.cluster.as_deref())?;
    review.base.name = format!("the merge base of {} and {}", t.base, t.head);
    Ok(review)
}

/// Where `head` (the working tree: HEAD) left `base`, when that is not `base` itself.
fn merge_base(repo: &Repo, base: &str, head: &str) -> Option<String> {
    let b = repo.resolve(base).ok()?.commit?;
    let h = match repo.resolve(head).ok()?.commit {
        Some(h) => h,
        None => repo.resolve("HEAD").ok()?.commit?,
    };
    let m = repo.git2().merge_base(b, h).ok()?;
    (m != b).then(|| m.to_string())
}

/// Every section of a review rendered with `render`, errors in place, then the overall line.
fn check_text(review: &Review, render: impl Fn(&ichor::policy::Verdict) -> String) -> String {
    if review.sections.is_empty() {
        return format!(
            "no cluster changes between {} and {}: nothing to judge\n",
            review.base, review.head
        );
    }
    let mut out = String::new();
    for (i, s) in review.sections.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        match &s.result {
            Ok(j) => out.push_str(&render(&j.verdict)),
            // Errors go to stderr, as every other error does.
            Err(e) => eprintln!(
                "error: cluster {}: {e}",
                ichor::escape::terminal(s.cluster.as_deref().unwrap_or("-"))
            ),
        }
    }
    if review.sections.len() > 1 {
        out.push_str(&format!(
            "\noverall: {} ({} sections, exit {})\n",
            if review.has_errors() {
                "INVALID".to_string()
            } else {
                review.outcome().to_string().to_uppercase()
            },
            review.sections.len(),
            gate::exit_code(review)
        ));
    }
    out
}

fn plan(
    target: &Target,
    access: &Access,
    output: PlanOutput,
    ichor_node: Option<String>,
    two_pass: bool,
    allow_blocked: bool,
    now: ichor::clock::Timestamp,
) -> anyhow::Result<ExitCode> {
    let mut review = review(target)?;
    let live = Live::connect(access, &review)?;
    let (live_nodes, etcd_leader) = match live.as_ref().map(|l| l.judge(&mut review)) {
        Some((nodes, leader)) => (Some(nodes), leader),
        None => (None, None),
    };
    // With several clusters, the node running ichor belongs to one of them.
    let has_node =
        |c: &gate::Change, n: &str| c.nodes().is_some_and(|ns| ns.iter().any(|x| x.name == n));
    let changes: Vec<&gate::Change> = review
        .sections
        .iter()
        .filter_map(|s| s.result.as_ref().ok().and_then(|j| j.change.as_ref()))
        .collect();
    let node_somewhere = ichor_node
        .as_deref()
        .is_some_and(|n| changes.iter().any(|c| has_node(c, n)));
    if output == PlanOutput::Mermaid && changes.len() > 1 {
        anyhow::bail!(
            "--output mermaid draws one cluster and this change touches {}; choose one with --cluster",
            changes.len()
        );
    }
    let mut text = String::new();
    let mut plans = Vec::new();
    let mut errors = Vec::new();
    let mut code = 0;
    for s in &review.sections {
        let name = ichor::escape::terminal(s.cluster.as_deref().unwrap_or("policies"));
        let judged = match &s.result {
            Ok(j) => j,
            Err(e) => {
                code = 2;
                eprintln!("error: cluster {name}: {e}");
                errors.push(gate::ClusterError {
                    cluster: s.cluster.clone(),
                    error: e.to_string(),
                });
                continue;
            }
        };
        let outcome = judged.verdict.outcome;
        let Some(change) = &judged.change else {
            // A removed cluster or a policy edit: nothing to roll out, the verdict says why.
            text.push_str(&judged.verdict.render_text());
            continue;
        };
        if outcome != Outcome::Pass {
            if !allow_blocked {
                code = code.max(outcome.exit_code());
                let what = if outcome == Outcome::Blocked {
                    "blocks"
                } else {
                    "holds (waiting)"
                };
                let msg = format!(
                    "cluster {name}: the gate {what} this change, so there is no plan to run (exit {}); --allow-blocked shows it anyway\n\n",
                    outcome.exit_code()
                );
                if output == PlanOutput::Text {
                    text.push_str(&msg);
                    text.push_str(&judged.verdict.render_text());
                } else if output == PlanOutput::Markdown {
                    text.push_str(&format!("> {}\n\n", ichor::escape::md_text(msg.trim())));
                    text.push_str(&judged.verdict.render_markdown());
                } else {
                    eprint!("{msg}{}", judged.verdict.render_text());
                }
                continue;
            }
            let warning = format!(
                "WARNING: the gate {} this change; this plan is shown because of --allow-blocked and will not run\n\n",
                if outcome == Outcome::Blocked { "blocks" } else { "holds" }
            );
            match output {
                PlanOutput::Text => text.push_str(&warning),
                PlanOutput::Markdown => text.push_str(&format!("> **{}**\n\n", warning.trim())),
                _ => eprint!("{warning}"),
            }
        }
        let opts = PlanOptions {
            // Where the node is not in this cluster's inventory it runs elsewhere; only when
            // no cluster has it is the name refused (by the plan, which names the nodes).
            ichor_node: ichor_node
                .clone()
                .filter(|n| has_node(change, n) || !node_somewhere),
            two_pass,
            etcd_leader: etcd_leader.clone(),
            ..PlanOptions::default()
        };
        let nodes = live_nodes.as_ref().and_then(|n| n.as_deref());
        match gate::plan_with(change, &opts, nodes) {
            Ok(mut p) => {
                // The calendar with the windows of the rollout settings the plan judged by.
                if let Some(doc) = &change.cluster_doc {
                    p.schedule(&doc.spec.rollout.maintenance_windows, now);
                }
                plans.push((outcome, p))
            }
            Err(e) => {
                code = 2;
                eprintln!("error: {e}");
                errors.push(gate::ClusterError {
                    cluster: Some(change.cluster.clone()),
                    error: e.to_string(),
                });
            }
        }
    }
    if review.sections.is_empty() {
        text.push_str(&format!(
            "no cluster changes between {} and {}: nothing to roll out\n",
            review.base, review.head
        ));
    }
    match output {
        PlanOutput::Json => {
            let report = gate::PlanReport {
                api_version: gate::REPORT_API_VERSION,
                kind: "PlanReport",
                base: (&review.base).into(),
                head: (&review.head).into(),
                outcome: if errors.is_empty() {
                    gate::ReportOutcome::of(&review)
                } else {
                    gate::ReportOutcome::Invalid
                },
                plans: plans
                    .iter()
                    .map(|(gate, plan)| gate::ClusterPlan { gate: *gate, plan })
                    .collect(),
                errors,
            };
            text = json(&report)?;
        }
        _ => {
            for (_, p) in &plans {
                if !text.is_empty() && !text.ends_with("\n\n") {
                    text.push('\n');
                }
                text.push_str(&match output {
                    PlanOutput::Text => p.render_text(),
                    PlanOutput::Mermaid => p.render_mermaid(),
                    PlanOutput::Markdown => p.render_markdown(),
                    PlanOutput::Json => unreachable!("handled above"),
                });
            }
        }
    }
    print(&text)?;
    Ok(ExitCode::from(code as u8))
}

fn json<T: serde::Serialize>(v: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}

/// The runtime a command runs on: `workers` threads (the machine's cores when `None`),
/// each with a stack of [`WORKER_STACK`].
fn runtime(workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    builder.thread_stack_size(WORKER_STACK).enable_all().build()
}

/// A rollout's futures nest deep (a stage, its pool, a node's step, a look, a client
/// call), and a debug build keeps every temporary of an async function in its poll frame:
/// tokio's default 2 MiB per worker left `ichor demo` in a debug build about a quarter to
/// spare. Stack is reserved, not committed, so the margin costs no memory.
const WORKER_STACK: usize = 8 << 20;

fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        // A closed pipe (`ichor check … | head`) is not an error worth reporting.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Build the homelab fixture and run the gate on every branch, the way ichor would on each
/// pull request; then show the plan of a change that passes.
/// Make `dir` hold the demo repository: build it when `dir` is missing or empty, reuse it
/// when it already is the demo repository, and refuse anything else (it is not ours).
fn prepare_demo_dir(
    fixture: &ichor::sim::fixture::Fixture,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let empty = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => anyhow::bail!("--dir {}: {e}", dir.display()),
    };
    if empty {
        fixture.build(dir)?;
        return Ok(());
    }
    // The fixture's history is deterministic: the same build has the same main commit.
    let fresh = tempfile::Builder::new().prefix("ichor-demo-").tempdir()?;
    fixture.build(fresh.path())?;
    let main_of = |p: &std::path::Path| {
        Repo::open(p)
            .ok()
            .and_then(|r| r.resolve("main").ok())
            .and_then(|r| r.commit)
    };
    match (main_of(dir), main_of(fresh.path())) {
        (Some(a), Some(b)) if a == b => Ok(()),
        _ => anyhow::bail!(
            "--dir {}: the folder exists, is not empty and is not the demo repository; choose another folder or remove this one",
            dir.display()
        ),
    }
}

#[derive(Subcommand)]
enum PoliciesCommand {
    /// List the rows whose source was last verified more than --max-age days ago (or never),
    /// and the component versions in the bundled homelab fixture that no row covers.
    Audit {
        /// A row's source is due for re-reading after this many days.
        #[arg(long, value_name = "DAYS", default_value_t = 90)]
        max_age: u32,
        /// Judge ages as of this day (YYYY-MM-DD) instead of today.
        #[arg(long, value_name = "DATE")]
        today: Option<String>,
    },
}

/// `ichor policies audit`: the shipped data against its own `verified` dates and against
/// every release set of the bundled fixture (main's history and each branch).
fn policies(command: PoliciesCommand) -> anyhow::Result<ExitCode> {
    use ichor::policy::{audit, Date, Policies};

    /// (label, path, text) of every `clusters/*/release-set.yaml` the fixture's history holds:
    /// after each commit on main and at the tip of each branch, replaying its edits in memory.
    fn fixture_release_sets(
        f: &ichor::sim::fixture::Fixture,
    ) -> anyhow::Result<Vec<(String, String, String)>> {
        use std::collections::BTreeMap;
        type Files = BTreeMap<String, String>;
        let apply =
            |files: &mut Files, c: &ichor::sim::fixture::CommitSpec| -> anyhow::Result<()> {
                if c.tree {
                    *files = f.tree.clone();
                }
                for e in &c.edits {
                    match &e.content {
                        Some(content) => {
                            files.insert(e.file.clone(), content.clone());
                        }
                        None => {
                            let text = files
                                .get_mut(&e.file)
                                .ok_or_else(|| anyhow::anyhow!("fixture: no file {}", e.file))?;
                            *text = text.replacen(&e.find, &e.replace, 1);
                        }
                    }
                }
                Ok(())
            };
        let release_sets = |label: &str, files: &Files| -> Vec<(String, String, String)> {
            files
                .iter()
                .filter(|(p, _)| p.starts_with("clusters/") && p.ends_with("/release-set.yaml"))
                .map(|(p, t)| (format!("{}@{label}", f.name), p.clone(), t.clone()))
                .collect()
        };
        let mut out = Vec::new();
        let mut files = Files::new();
        let mut at_tag: BTreeMap<String, Files> = BTreeMap::new();
        for (i, c) in f.history.main.iter().enumerate() {
            apply(&mut files, c)?;
            out.extend(release_sets(
                &format!("main~{}", f.history.main.len() - 1 - i),
                &files,
            ));
            if let Some(tag) = &c.tag {
                at_tag.insert(tag.clone(), files.clone());
            }
        }
        at_tag.insert("main".into(), files);
        for b in &f.history.branches {
            let mut files = at_tag.get(&b.base).cloned().ok_or_else(|| {
                anyhow::anyhow!("fixture branch {}: unknown base {}", b.name, b.base)
            })?;
            for c in &b.commits {
                apply(&mut files, c)?;
            }
            out.extend(release_sets(&b.name, &files));
        }
        Ok(out)
    }

    let PoliciesCommand::Audit { max_age, today } = command;
    let today = match today {
        Some(t) => Date::parse(&t).map_err(|e| anyhow::anyhow!("--today: {e}"))?,
        None => Date::today_utc(),
    };
    let policies = Policies::shipped()?;
    let fixture = ichor::sim::fixture::Fixture::homelab();
    let mut sets = Vec::new();
    for (label, path, text) in fixture_release_sets(&fixture)? {
        // An invalid release set (a branch that tests the gate's refusal) has no versions to audit.
        if let Ok(rs) = ichor::releaseset::ReleaseSet::parse(&path, &text) {
            sets.push((label, rs));
        }
    }
    let report = audit::audit(&policies, today, max_age, &sets);
    print(&report.render_text())?;
    Ok(ExitCode::SUCCESS)
}

/// Cluster access for one command: a runtime, the Kubernetes client and, when given, the
/// Talos client. Live judging applies to one cluster at a time.
struct Live {
    runtime: tokio::runtime::Runtime,
    kube: ichor::kube::KubeClient,
    talos: Option<ichor::talos::TalosClient>,
    /// For the `before` health checks' Prometheus (`--prometheus-token-file`).
    prometheus_credential: Option<ichor::prometheus::Credential>,
}

impl Live {
    fn open(access: &Access) -> anyhow::Result<Option<Live>> {
        let Some(kubeconfig) = &access.kubeconfig else {
            if access.talosconfig.is_some() {
                anyhow::bail!("--talosconfig needs --kubeconfig too: the live gate reads the nodes from Kubernetes");
            }
            return Ok(None);
        };
        let runtime = runtime(Some(2))?;
        let kube = runtime.block_on(ichor::kube::KubeClient::connect(Some(kubeconfig)))?;
        // An unreachable cluster is said once, plainly; its live items then wait.
        if let Some(line) = runtime.block_on(kube.unreachable()) {
            eprintln!("warning: {}", ichor::escape::terminal(&line));
        }
        let talos = match &access.talosconfig {
            Some(path) => {
                let ctx = ichor::talos::config::load(path, None)?;
                Some(ichor::talos::TalosClient::new(
                    ctx,
                    ichor::clock::Clock::system(),
                ))
            }
            None => None,
        };
        let prometheus_credential = rollout_cmd::credential(
            access.prometheus_url.as_deref(),
            access.prometheus_token_file.as_deref(),
        )?;
        Ok(Some(Live {
            runtime,
            kube,
            talos,
            prometheus_credential,
        }))
    }

    fn connect(access: &Access, review: &Review) -> anyhow::Result<Option<Live>> {
        let changes = review
            .sections
            .iter()
            .filter(|s| s.result.as_ref().is_ok_and(|j| j.change.is_some()))
            .count();
        if access.kubeconfig.is_some() && changes > 1 {
            anyhow::bail!(
                "cluster access (--kubeconfig) is for one cluster, and this change touches {changes}; choose it with --cluster"
            );
        }
        Live::open(access)
    }

    /// Add the live items to every cluster section; the live nodes and etcd's leader, for
    /// the plan.
    fn judge(&self, review: &mut Review) -> (Option<Vec<ichor::releaseset::Node>>, Option<String>) {
        let mut nodes = None;
        let mut leader = None;
        for s in &mut review.sections {
            let Ok(j) = &mut s.result else { continue };
            let Some(change) = &j.change else { continue };
            let subject = gate::live::Subject::of(change)
                .with_prometheus_credential(self.prometheus_credential.clone());
            let facts = self.runtime.block_on(gate::live::observe(
                &self.kube,
                self.talos.as_ref(),
                &subject,
            ));
            let mut items = gate::live::items(change, &facts);
            if facts.etcd.is_none() {
                items.push(
                    ichor::policy::CheckItem::new(
                        "live/etcd",
                        "etcd is healthy with quorum to spare",
                        ichor::policy::Status::Warn,
                        "not checked: no talosconfig (etcd is read through the Talos API)",
                    )
                    .hint("pass --talosconfig (or set TALOSCONFIG) to check etcd")
                    .source("live"),
                );
            }
            j.verdict.extend(items);
            nodes = gate::live::live_nodes(&facts);
            leader = gate::live::etcd_leader(&facts);
        }
        (nodes, leader)
    }
}

/// The clusters with a rollout record in `ichor-system`, by the records' names.
async fn recorded_clusters(
    kube: &ichor::kube::KubeClient,
) -> Result<Vec<String>, ichor::kube::KubeError> {
    let prefix = gate::live::lock_name("");
    let maps = kube
        .objects(
            "v1",
            "ConfigMap",
            Some(gate::live::ICHOR_NAMESPACE),
            None,
            None,
            ichor::health::MAX_MATCHES,
        )
        .await?;
    let mut names: Vec<String> = maps
        .iter()
        .filter_map(|m| m.pointer("/metadata/name").and_then(|n| n.as_str()))
        .filter_map(|n| n.strip_prefix(&prefix))
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect();
    names.sort();
    Ok(names)
}

/// `ichor status`: what the cluster runs right now.
fn status(
    access: &Access,
    repo: Option<&std::path::Path>,
    rev: &str,
    cluster: Option<&str>,
    output: StatusOutput,
) -> anyhow::Result<ExitCode> {
    let Some(live) = Live::open(access)? else {
        anyhow::bail!("status needs cluster access: pass --kubeconfig (or set KUBECONFIG), and --talosconfig for etcd");
    };
    let mut subject = gate::live::Subject::default();
    if let Some(path) = repo {
        let repo = Repo::open(path)?;
        let change = gate::load(&repo, rev, rev, cluster)?;
        subject = gate::live::Subject::of(&change)
            .with_prometheus_credential(live.prometheus_credential.clone());
    } else if let Some(c) = cluster {
        subject.cluster = c.to_string();
    }
    // Without --repo or --cluster, the rollout records say which cluster this is: each is
    // the ConfigMap `ichor-system/ichor-rollout-<cluster>`.
    let mut which = None;
    if subject.cluster.is_empty() {
        match live.runtime.block_on(recorded_clusters(&live.kube)) {
            Ok(names) if names.len() == 1 => subject.cluster = names[0].clone(),
            Ok(names) if names.len() > 1 => {
                which = Some(format!(
                    "Rollout records for clusters {}: choose one with --cluster\n",
                    names
                        .iter()
                        .map(|n| ichor::escape::terminal(n))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
            // None, or none readable: the live part is shown alone, as before.
            _ => {}
        }
    }
    let facts = live.runtime.block_on(gate::live::observe(
        &live.kube,
        live.talos.as_ref(),
        &subject,
    ));
    let report = gate::live::StatusReport::new(&subject, &facts);
    // The rollout record, when the cluster is known and has one.
    let record = if subject.cluster.is_empty() {
        Ok(None)
    } else {
        live.runtime
            .block_on(ichor::rollout::record::load(&live.kube, &subject.cluster))
    };
    let text = match output {
        StatusOutput::Json => {
            let mut v = serde_json::to_value(&report)?;
            if let Some(obj) = v.as_object_mut() {
                obj.insert(
                    "rollout".into(),
                    match &record {
                        Ok(r) => serde_json::to_value(r.as_ref().map(|s| &s.record))?,
                        Err(e) => serde_json::json!({ "error": e.to_string() }),
                    },
                );
            }
            json(&v)?
        }
        StatusOutput::Text => {
            let mut t = report.render_text();
            match &record {
                Ok(Some(s)) => t.push_str(&format!("\n{}", s.record.render_text())),
                Ok(None) => {}
                Err(e) => t.push_str(&format!("\nRollout record: {e}\n")),
            }
            if let Some(w) = &which {
                t.push_str(&format!("\n{w}"));
            }
            t
        }
    };
    print(&text)?;
    // Nothing could be read at all: the cluster is not reachable with these credentials.
    Ok(ExitCode::from(if facts.nodes.is_err() { 4 } else { 0 }))
}
