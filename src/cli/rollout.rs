//! `ichor rollout`: the live gate, the plan, a confirmation, then the engine, with progress
//! on the terminal and a summary at the end.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use ichor::clock::Clock;
use ichor::gate;
use ichor::git::Repo;
use ichor::plan::PlanOptions;
use ichor::policy::Outcome;
use ichor::rollout::{terminal::Terminal, Rollout, RunOutcome, Target};

use super::EXIT_INVALID;

pub struct Args {
    pub repo: PathBuf,
    pub rev: String,
    pub base: Option<String>,
    pub cluster: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub talosconfig: Option<PathBuf>,
    pub dry_run: bool,
    pub resume: bool,
    pub yes: bool,
    pub ichor_node: Option<String>,
    /// Keep the two-pass order (`--two-pass`).
    pub two_pass: bool,
    pub time_scale: Option<f64>,
    pub clock_start: Option<String>,
    /// `--prometheus-url` and `--prometheus-token-file`: the token and where it may go.
    pub prometheus: Option<(String, PathBuf)>,
}

/// The Prometheus credential of `--prometheus-url` and `--prometheus-token-file`.
pub fn credential(
    url: Option<&str>,
    token_file: Option<&std::path::Path>,
) -> anyhow::Result<Option<ichor::prometheus::Credential>> {
    let (Some(url), Some(file)) = (url, token_file) else {
        return Ok(None);
    };
    let token = ichor::secret::Secret::from_file(file)
        .map_err(|e| anyhow::anyhow!("--prometheus-token-file: {e}"))?;
    ichor::prometheus::Credential::new(url, token)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--prometheus-url: {e}"))
}

pub const EXIT_BLOCKED: u8 = 1;
pub const EXIT_PAUSED: u8 = 3;
pub const EXIT_UNREACHABLE: u8 = 4;
pub const EXIT_LOCKED: u8 = 5;
pub const EXIT_INTERRUPTED: u8 = 130;

/// REV's first parent, as a revision string the gate resolves.
fn first_parent(repo: &Repo, rev: &str) -> anyhow::Result<String> {
    let r = repo.resolve(rev)?;
    let id = r.commit.ok_or_else(|| {
        anyhow::anyhow!("--rev {rev}: a rollout runs a commit, not the working tree")
    })?;
    let commit = repo.git2().find_commit(id)?;
    Ok(match commit.parent_id(0) {
        Ok(p) => p.to_string(),
        // The first commit: judged against itself; the plan still comes from what runs.
        Err(_) => id.to_string(),
    })
}

/// Who this engine is in the lock: the same on every run from this machine, so a run that
/// was killed is continued by the next one at once; a local lock file keeps two runs on one
/// machine apart.
fn holder() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "ichor".into());
    format!(
        "ichor-cli/{}@{}",
        ichor::rollout::clean_identity(&user),
        ichor::rollout::host_identity()
    )
}

/// `$XDG_STATE_HOME/ichor/rollout` (else `~/.local/state/ichor/rollout`), mode 0700.
fn state_dir() -> anyhow::Result<PathBuf> {
    let absolute = |k: &str| {
        std::env::var_os(k)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let base = match (absolute("XDG_STATE_HOME"), absolute("HOME")) {
        (Some(s), _) => s,
        (None, Some(h)) => h.join(".local").join("state"),
        (None, None) => anyhow::bail!(
            "neither XDG_STATE_HOME nor HOME is set: no place for the local rollout lock"
        ),
    };
    let dir = base.join("ichor").join("rollout");
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// An exclusive lock on a file in the state dir, released when the process ends (however
/// it ends).
struct LocalLock {
    _file: std::fs::File,
}

fn local_lock(cluster: &str) -> anyhow::Result<Option<LocalLock>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let safe: String = cluster
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    let path = state_dir()?.join(format!("{safe}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        // A link planted at the lock's path is not followed.
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .with_context(|| format!("opening the local lock {}", path.display()))?;
    // SAFETY: the descriptor is open and owned by `file` for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Ok(None);
    }
    Ok(Some(LocalLock { _file: file }))
}

fn confirm(prompt: &str) -> anyhow::Result<bool> {
    eprint!("{prompt} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES"))
}

/// The plan less the steps the record of this rollout (the same commit) has finished, laid
/// on the calendar again; the whole plan when the record cannot be read or is another's.
async fn left_to_do(
    kube: &ichor::kube::KubeClient,
    cluster: &str,
    commit: &str,
    plan: &ichor::plan::Plan,
    doc: &ichor::releaseset::Cluster,
    clock: &Clock,
) -> ichor::plan::Plan {
    let record = match ichor::rollout::record::load(kube, cluster).await {
        Ok(Some(s)) if s.record.target.commit == commit => s.record,
        _ => return plan.clone(),
    };
    let finished: Vec<(ichor::plan::StageId, Option<&str>)> = record
        .steps
        .iter()
        .filter(|(_, m)| m.finished_at.is_some())
        .filter_map(|(k, _)| ichor::rollout::stage_of_record_key(k))
        .collect();
    let is_done = |stage, node: &str| finished.contains(&(stage, Some(node)));
    let mut left = plan.left(|stage, step| match step.nodes.as_slice() {
        [] => finished.contains(&(stage, None)),
        nodes => nodes.iter().all(|n| is_done(stage, n)),
    });
    left.schedule(&doc.spec.rollout.maintenance_windows, clock.now());
    left
}

pub fn rollout(a: Args) -> anyhow::Result<ExitCode> {
    let clock = match (a.time_scale, &a.clock_start) {
        (Some(s), None) => {
            Clock::try_scaled(s).map_err(|e| anyhow::anyhow!("--time-scale: {e}"))?
        }
        (Some(s), Some(start)) => {
            let at = ichor::clock::Timestamp::parse_rfc3339(start).ok_or_else(|| {
                anyhow::anyhow!("--clock-start {start}: expected YYYY-MM-DDTHH:MM:SSZ")
            })?;
            Clock::scaled_at(s, at).map_err(|e| anyhow::anyhow!("--time-scale: {e}"))?
        }
        (None, Some(_)) => anyhow::bail!("--clock-start goes with --time-scale"),
        (None, None) => Clock::system(),
    };
    let Some(kubeconfig) = a.kubeconfig.as_deref() else {
        anyhow::bail!("rollout needs cluster access: pass --kubeconfig (or set KUBECONFIG) and --talosconfig (or set TALOSCONFIG)");
    };
    let Some(talosconfig) = a.talosconfig.as_deref() else {
        anyhow::bail!("rollout needs the Talos API too: pass --talosconfig (or set TALOSCONFIG)");
    };
    let repo = Repo::open(&a.repo)?;
    let mut change = match &a.base {
        Some(b) => gate::load(&repo, b, &a.rev, a.cluster.as_deref())?,
        None => {
            // As `ichor run` chooses: from where Talos or Kubernetes last changed before REV,
            // so commits on top of a bump (a fix to cluster.yaml, a README) leave its work
            // in the change; the plan then takes what each node runs.
            let first = first_parent(&repo, &a.rev)?;
            let change = gate::load(&repo, &first, &a.rev, a.cluster.as_deref())?;
            match change.head.commit {
                Some(tip) => {
                    let base =
                        ichor::controller::rollout_base(&repo, &change.cluster, &tip.to_string())?;
                    gate::load(&repo, &base, &a.rev, Some(&change.cluster))?
                }
                None => change,
            }
        }
    };
    let commit = change
        .head
        .commit
        .map(|c| c.to_string())
        .ok_or_else(|| anyhow::anyhow!("--rev {}: a rollout runs a commit", a.rev))?;
    // The rollout settings of the commit rolled out, so a remedy a pause asks for in
    // cluster.yaml takes effect on `--resume --rev` with the fixed commit.
    ichor::controller::settings_at(&repo, &mut change, &commit)?;
    let doc = change.cluster_doc.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "cluster {}: no cluster.yaml at {}; the rollout needs its rollout policy",
            change.cluster,
            change.base
        )
    })?;
    let runtime = super::runtime(Some(2))?;
    runtime.block_on(async move {
        let kube = match ichor::kube::KubeClient::connect(Some(kubeconfig)).await {
            Ok(k) => k,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(ExitCode::from(EXIT_INVALID));
            }
        };
        let ctx = ichor::talos::config::load(talosconfig, None)?;
        let talos = ichor::talos::TalosClient::new(ctx, clock.clone());

        // The live gate first.
        let prometheus_credential = match &a.prometheus {
            Some((url, file)) => credential(Some(url), Some(file))?,
            None => None,
        };
        let subject =
            gate::live::Subject::of(&change).with_prometheus_credential(prometheus_credential.clone());
        let facts = gate::live::observe(&kube, Some(&talos), &subject).await;
        if let Err(e) = &facts.nodes {
            // One line: the API server and the OS's own words when it cannot be reached.
            let why = kube
                .unreachable()
                .await
                .unwrap_or_else(|| format!("the cluster's nodes could not be read: {e}"));
            eprintln!("error: {}", ichor::escape::terminal(&why));
            return Ok(ExitCode::from(EXIT_UNREACHABLE));
        }
        let mut verdict = gate::verdict(&change);
        let me = holder();
        verdict.extend(gate::live::items_for_holder(&change, &facts, &me));
        print!("{}", verdict.render_text());
        if verdict.outcome == Outcome::Blocked {
            eprintln!("\nthe gate blocks this change: nothing was rolled out");
            return Ok(ExitCode::from(EXIT_BLOCKED));
        }
        let nodes = gate::live::live_nodes(&facts);
        let opts = PlanOptions {
            ichor_node: a.ichor_node.clone(),
            two_pass: a.two_pass,
            etcd_leader: gate::live::etcd_leader(&facts),
            ..PlanOptions::default()
        };
        let mut plan = gate::plan_with(&change, &opts, nodes.as_deref())?;
        // On the calendar from now: the prompt, --dry-run and the plan say when it starts.
        plan.schedule(&doc.spec.rollout.maintenance_windows, clock.now());
        // A resume shows what is left: the steps this rollout's record has finished are
        // taken out of what is printed (the engine still observes every one).
        let shown = match a.resume {
            true => left_to_do(&kube, &change.cluster, &commit, &plan, &doc, &clock).await,
            false => plan.clone(),
        };
        print!("\n{}", shown.render_text());
        if a.dry_run {
            println!("\ndry run: nothing was changed");
            return Ok(ExitCode::SUCCESS);
        }
        // Nothing left to change still runs the engine's verify (nothing is disrupted, so
        // nothing is asked): only a cluster seen at the target is "done".
        let nothing_left = plan.stages.is_empty();
        let tty = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
        if !a.yes && !nothing_left {
            if !tty {
                eprintln!("error: not a terminal, so no confirmation can be asked: pass --yes to roll out");
                return Ok(ExitCode::from(EXIT_INVALID));
            }
            // What "y" commits to, in calendar time, where windows decide it.
            let when = shown
                .schedule
                .as_ref()
                .map(|s| format!("\nThe rollout {}.", s.describe()))
                .unwrap_or_default();
            if !confirm(&format!("{when}\nRoll this out on cluster {}?", change.cluster))? {
                eprintln!("not confirmed: nothing was changed");
                return Ok(ExitCode::SUCCESS);
            }
        }
        let Some(_local) = local_lock(&change.cluster)? else {
            eprintln!("error: another `ichor rollout` for cluster {} runs on this machine", change.cluster);
            return Ok(ExitCode::from(EXIT_LOCKED));
        };

        let rs = &change.head_release_set.spec;
        let target = Target {
            commit,
            talos: rs.talos.clone(),
            kubernetes: rs.kubernetes.clone(),
        };
        let view = Terminal::new(clock.clone(), tty);
        let report = |p| view.report(p);
        let paused_in_git = doc.spec.rollout.paused;
        let pause_requested = move || {
            paused_in_git.then(|| {
                "paused in cluster.yaml (spec.rollout.paused: true); set it to false and resume".to_string()
            })
        };
        let mut engine = Rollout::new(&kube, &talos, clock.clone(), &change.cluster, &me)
            .for_cluster(&doc);
        engine.report = Some(&report);
        engine.pause_requested = Some(&pause_requested);
        engine.prometheus_credential = prometheus_credential;
        let started = clock.now();
        let outcome = tokio::select! {
            r = engine.run(&plan, &target, Some(&change), a.resume) => Some(r),
            _ = tokio::signal::ctrl_c() => None,
        };
        view.finish();
        let took = ichor::releaseset::HumanDuration(clock.now().since(started));
        let Some(outcome) = outcome else {
            // Every marker was written before its action, so a resume continues here.
            let _ = kube
                .release_lease(gate::live::ICHOR_NAMESPACE, &gate::live::lock_name(&change.cluster), &me)
                .await;
            eprintln!("\ninterrupted after {took}: the rollout record keeps where it stood; `ichor rollout --resume --rev {}` continues", a.rev);
            return Ok(ExitCode::from(EXIT_INTERRUPTED));
        };
        match outcome {
            Ok(RunOutcome::Completed { stages }) => {
                println!("\nDone in {took}: every node runs Talos {} and Kubernetes {}.", target.talos, target.kubernetes);
                // Each stage against the plan's estimate for it.
                for (stage, secs) in stages {
                    let planned: u64 = plan
                        .stages
                        .iter()
                        .filter(|s| ichor::rollout::stage_key(s.id) == stage)
                        .flat_map(|s| s.steps.iter().map(|st| st.duration_secs))
                        .sum();
                    println!(
                        "  {stage:<34} {:<10} (planned {})",
                        ichor::releaseset::HumanDuration::from_secs(secs).to_string(),
                        ichor::releaseset::HumanDuration::from_secs(planned)
                    );
                }
                let notes: Vec<String> = plan.notes.iter().chain(plan.warnings.iter()).cloned().collect();
                for n in notes {
                    println!("  note: {}", ichor::escape::terminal(&n));
                }
                Ok(ExitCode::SUCCESS)
            }
            Ok(RunOutcome::Paused(p)) => {
                println!(
                    "\nPaused after {took} in stage {}{}:\n  {}\n\nThe cluster runs at full capacity meanwhile. Once that is fixed: ichor rollout --resume --rev {}\n(a fix in cluster.yaml takes effect once committed: resume with --rev at that commit, e.g. the protected branch)",
                    p.stage,
                    p.node.as_deref().map(|n| format!(" at {n}")).unwrap_or_default(),
                    ichor::escape::terminal(&p.reason),
                    a.rev
                );
                Ok(ExitCode::from(EXIT_PAUSED))
            }
            Ok(RunOutcome::Refused(why)) => {
                eprintln!("error: {}", ichor::escape::terminal(&why));
                Ok(ExitCode::from(EXIT_LOCKED))
            }
            Err(e) => {
                eprintln!("error: {e}");
                Ok(ExitCode::from(EXIT_UNREACHABLE))
            }
        }
    })
}
