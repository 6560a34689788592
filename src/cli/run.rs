//! `ichor run`: the controller, until SIGTERM or Ctrl-C; then it pauses running rollouts
//! at their next safe point (each records where it stopped) and exits.

use std::path::Path;
use std::process::ExitCode;

use ichor::clock::Clock;
use ichor::controller::{self, Config};

use super::EXIT_INVALID;

pub fn run(config: &Path, check_only: bool) -> anyhow::Result<ExitCode> {
    let cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(EXIT_INVALID));
        }
    };
    // Refused here and at the start alike: a notes sink that can never publish is not a
    // warning to find in the log later.
    if let Err(why) = notes_target(&cfg) {
        eprintln!("error: {}", ichor::escape::terminal(&why));
        return Ok(ExitCode::from(EXIT_INVALID));
    }
    for w in cfg.warnings() {
        if check_only {
            eprintln!("warning: {}", ichor::escape::terminal(&w));
        } else {
            tracing::warn!("{w}");
        }
    }
    if check_only {
        // Without a webhook secret nothing listens on `listen`: say so here as at the start.
        let webhooks = if cfg.webhook.is_some() {
            format!("webhooks on {}", cfg.listen)
        } else if !cfg.uses_github() {
            "no webhook listener".to_string()
        } else {
            format!(
                "no webhook secret: no webhook listener, polls every {}",
                cfg.poll_interval
            )
        };
        println!(
            "{}: valid ({} cluster{}, {} mode; {webhooks})",
            config.display(),
            cfg.clusters.len(),
            if cfg.clusters.len() == 1 { "" } else { "s" },
            if cfg.uses_github() {
                "GitHub"
            } else {
                "Git-only"
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    let runtime = super::runtime(Some(2))?;
    runtime.block_on(async move {
        let running = match controller::start(cfg, Clock::system()).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(ExitCode::from(EXIT_INVALID));
            }
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping: running rollouts pause at their next safe point");
        running.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Where ichor's git notes go must take them. With `repository.path` they are pushed into
/// it (Git-only mode, or `notes: true`), and git's local transport refuses a push into a
/// repository with a work tree (libgit2/libgit2@v1.9.7:src/libgit2/transports/local.c, as
/// bundled by libgit2-sys 0.18.8: "local push doesn't (yet) support pushing to non-bare
/// repos"), so such a path, or one that is no repository at all, is refused with the way
/// out.
fn notes_target(cfg: &Config) -> Result<(), String> {
    let publishes = !cfg.uses_github() || cfg.notes;
    let (None, Some(path)) = (&cfg.repository.url, &cfg.repository.path) else {
        return Ok(());
    };
    match git2::Repository::open(path) {
        Err(e) => Err(format!(
            "repository.path {}: not a git repository ({})",
            path.display(),
            e.message()
        )),
        Ok(r) if publishes && !r.is_bare() => Err(format!(
            "repository.path {} has a work tree, and ichor publishes its verdicts as git notes pushed into it ({}), which git refuses for a repository with a work tree; point repository.path at a bare clone (`git clone --bare {} /srv/<name>.git`, then push your branches there) or poll it with repository.url",
            path.display(),
            if cfg.uses_github() { "notes: true" } else { "Git-only mode" },
            path.display()
        )),
        Ok(_) => Ok(()),
    }
}
