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
