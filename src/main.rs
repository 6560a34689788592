//! The `ichor` command line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use ichor::gate::{self, CheckReport, GateError, PlanReport};
use ichor::git::Repo;
use ichor::plan::PlanOptions;

/// Gate and roll out Talos Linux and Kubernetes upgrades from Git.
#[derive(Parser)]
#[command(name = "ichor", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Judge the change between two revisions of a cluster's release set.
    ///
    /// Exit status: 0 pass (warnings allowed), 1 blocked, 2 invalid input or usage, 3 waiting.
    Check {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_enum, default_value_t = CheckOutput::Text)]
        output: CheckOutput,
    },
    /// Show the staged rollout the change would run: stages, node order, batches, estimate.
    Plan {
        #[command(flatten)]
        target: Target,
        #[arg(long, value_enum, default_value_t = PlanOutput::Text)]
        output: PlanOutput,
        /// The node running ichor; its batch goes last.
        #[arg(long, value_name = "NODE")]
        ichor_node: Option<String>,
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
        /// Timings and faults (YAML; see docs/twin.md).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Build the bundled homelab repository and gate every pull-request branch in it.
    Demo {
        /// Keep the demo repository here instead of a temporary directory.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct Target {
    /// The GitOps repository (bare or with a work tree).
    #[arg(long, value_name = "PATH", default_value = ".")]
    repo: PathBuf,
    /// The revision the change starts from (branch, tag or SHA), e.g. main.
    #[arg(long, value_name = "REV")]
    base: String,
    /// The revision with the change, e.g. renovate/ghcr.io-siderolabs-kubelet-1.x.
    #[arg(long, value_name = "REV")]
    head: String,
    /// The cluster (folder under clusters/); optional when the revision has one.
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum CheckOutput {
    Text,
    Json,
    Markdown,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlanOutput {
    Text,
    Json,
    Mermaid,
    Markdown,
}

const EXIT_INVALID: u8 = 2;

fn main() -> ExitCode {
    // Diagnostics go to stderr; RUST_LOG (e.g. `RUST_LOG=ichor=debug`) turns them up.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
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
        Command::Check { target, output } => {
            let change = load(&target)?;
            let verdict = gate::verdict(&change);
            let text = match output {
                CheckOutput::Text => verdict.render_text(),
                CheckOutput::Markdown => verdict.render_markdown(),
                CheckOutput::Json => json(&CheckReport::new(&change, &verdict))?,
            };
            print(&text)?;
            Ok(ExitCode::from(verdict.outcome.exit_code() as u8))
        }
        Command::Plan {
            target,
            output,
            ichor_node,
        } => {
            let change = load(&target)?;
            let plan = gate::plan(&change, &PlanOptions { ichor_node })?;
            let text = match output {
                PlanOutput::Text => plan.render_text(),
                PlanOutput::Mermaid => plan.render_mermaid(),
                PlanOutput::Markdown => plan.render_markdown(),
                PlanOutput::Json => json(&PlanReport {
                    base: (&change.base).into(),
                    head: (&change.head).into(),
                    plan: &plan,
                })?,
            };
            print(&text)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sim {
            cluster,
            speed,
            state_dir,
            github,
            config,
        } => sim(cluster, speed, state_dir, github, config),
        Command::Demo { dir } => demo(dir),
    }
}

fn sim(
    dir: PathBuf,
    speed: f64,
    state_dir: Option<PathBuf>,
    github: bool,
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
    let options = TwinOptions { config, github };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
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

fn load(t: &Target) -> Result<gate::Change, GateError> {
    let repo = Repo::open(&t.repo)?;
    gate::load(&repo, &t.base, &t.head, t.cluster.as_deref())
}

fn json<T: serde::Serialize>(v: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}

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
fn demo(dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let tmp;
    let path = match dir {
        Some(d) => d,
        None => {
            tmp = tempfile_dir()?;
            tmp.clone()
        }
    };
    let fixture = ichor::sim::fixture::Fixture::homelab();
    fixture.build(&path)?;
    let repo = Repo::open(&path)?;
    let mut out = format!(
        "ichor demo: the homelab repository ({} commits on main, {} pull-request branches) at {}\n\
         Each branch is gated as ichor gates a pull request: `ichor check --repo {} --base <base> --head <branch>`.\n",
        fixture.history.main.len(),
        fixture.history.branches.len(),
        path.display(),
        path.display()
    );
    let mut passing = None;
    for b in &fixture.history.branches {
        out.push_str(&format!(
            "\n━━ PR “{}”  ({} ← {})\n",
            b.title, b.base, b.name
        ));
        match gate::load(&repo, &b.base, &b.name, None) {
            Ok(change) => {
                let v = gate::verdict(&change);
                out.push_str(&v.render_text());
                if passing.is_none()
                    && v.outcome == ichor::policy::Outcome::Pass
                    && change.bump.talos_moves()
                {
                    passing = Some(change);
                }
            }
            Err(e) => out.push_str(&format!("error (exit 2): {e}\n")),
        }
    }
    if let Some(change) = passing {
        let plan = gate::plan(&change, &PlanOptions::default())?;
        out.push_str(&format!(
            "\n━━ The staged plan ichor would run once “{}” merges\n",
            change.head.name
        ));
        out.push_str(&plan.render_text());
    }
    out.push_str("\nThe rollout itself against the simulated cluster comes with the rollout engine; see docs/.\n");
    print(&out)?;
    Ok(ExitCode::SUCCESS)
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("ichor-demo-{}", std::process::id()));
    if base.exists() {
        std::fs::remove_dir_all(&base)?;
    }
    std::fs::create_dir_all(&base)?;
    Ok(base)
}
