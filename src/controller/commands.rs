//! Commands given in Git: PR comments (`/ichor plan|retry|pause|resume [cluster]`) from
//! users with write access, or, in Git-only mode, commits on `refs/ichor/commands`. Every
//! command is acknowledged where it was given; a refusal says why, politely.

use std::sync::Arc;

use crate::forge::command::{self, Command, Verb};

use super::{lock, rolling, ClusterRuntime, Ctx, Error, Event};

/// A PR comment arrived.
pub async fn on_comment(
    ctx: &Arc<Ctx>,
    number: u64,
    author: &str,
    body: &str,
) -> Result<(), Error> {
    let Some(gh) = &ctx.github else {
        return Ok(());
    };
    if author == gh.login() {
        return Ok(());
    }
    let Some(parsed) = command::parse(body) else {
        return Ok(());
    };
    let line = command::command_line(body).unwrap_or("/ichor").to_string();
    let cmd = match parsed {
        Ok(c) => c,
        Err(why) => {
            ctx.metrics.inc(
                "ichor_commands_total",
                "Commands, by verb and result.",
                &[("verb", "unknown"), ("result", "invalid")],
            );
            return reply(ctx, number, None, &line, author, &why).await;
        }
    };
    let permission = gh.permission(author).await?;
    if !permission.can_write() {
        ctx.metrics.inc(
            "ichor_commands_total",
            "Commands, by verb and result.",
            &[("verb", cmd.verb.as_str()), ("result", "refused")],
        );
        return reply(
            ctx,
            number,
            None,
            &cmd.to_string(),
            author,
            "sorry, only people with write access to this repository can give ichor commands. Nothing was done.",
        )
        .await;
    }
    let text = run(ctx, Some(number), &cmd, author).await?;
    ctx.metrics.inc(
        "ichor_commands_total",
        "Commands, by verb and result.",
        &[("verb", cmd.verb.as_str()), ("result", "done")],
    );
    reply(
        ctx,
        number,
        cmd.cluster.as_deref(),
        &cmd.to_string(),
        author,
        &text,
    )
    .await
}

/// Reply to a command on its PR. When GitHub's rate limit holds the reply back, the
/// command has been carried out already: the reply waits in its own task (never in the
/// loop, never run twice) and goes out once GitHub allows it.
async fn reply(
    ctx: &Arc<Ctx>,
    number: u64,
    cluster: Option<&str>,
    line: &str,
    author: &str,
    text: &str,
) -> Result<(), Error> {
    match ctx
        .reporters
        .ack(Some(number), None, cluster, line, author, text)
        .await
    {
        Err(e) if e.rate_limited_for().is_some() => {
            let reporters = ctx.reporters.patient();
            let (cluster, line, author, text) = (
                cluster.map(str::to_string),
                line.to_string(),
                author.to_string(),
                text.to_string(),
            );
            tokio::spawn(async move {
                if let Err(e) = reporters
                    .ack(
                        Some(number),
                        None,
                        cluster.as_deref(),
                        &line,
                        &author,
                        &text,
                    )
                    .await
                {
                    tracing::warn!(pr = number, error = %e, "a command's reply could not be posted");
                }
            });
            Ok(())
        }
        r => r,
    }
}

/// The clusters a command is about: the one named, else those the PR's comment covers,
/// else every cluster ichor acts on.
async fn clusters_of(
    ctx: &Ctx,
    pr: Option<u64>,
    cmd: &Command,
) -> Result<Vec<Arc<ClusterRuntime>>, String> {
    if let Some(name) = &cmd.cluster {
        return ctx.cluster(name).cloned().map(|c| vec![c]).ok_or_else(|| {
            format!("this ichor does not manage a cluster called `{name}`; nothing was done.")
        });
    }
    if let Some(pr) = pr {
        let st = ctx.state.lock().await;
        let named: Vec<_> = ctx
            .clusters
            .iter()
            .filter(|c| st.stickies.contains_key(&(pr, c.name.clone())))
            .cloned()
            .collect();
        if !named.is_empty() {
            return Ok(named);
        }
    }
    Ok(ctx.clusters.iter().filter(|c| c.act).cloned().collect())
}

/// Carry a command out; the acknowledgement's text.
async fn run(ctx: &Arc<Ctx>, pr: Option<u64>, cmd: &Command, by: &str) -> Result<String, Error> {
    let clusters = match clusters_of(ctx, pr, cmd).await {
        Ok(c) => c,
        Err(why) => return Ok(why),
    };
    let mut said = Vec::new();
    match cmd.verb {
        Verb::Plan => match pr {
            Some(n) => {
                super::gating::gate_pull_number(ctx, n, true).await?;
                said.push("judged the head again; the comment above is up to date.".to_string());
            }
            None => {
                let _ = ctx.events.try_send(Event::Reconcile);
                said.push("judging every branch again.".to_string());
            }
        },
        Verb::Pause => {
            for c in &clusters {
                *lock(&c.paused_by) = Some(by.to_string());
                said.push(if c.rolling() {
                    format!("{}: the rollout stops at its next safe point (between nodes) and records where.", c.name)
                } else {
                    format!("{}: paused; no rollout starts until `/ichor resume`.", c.name)
                });
            }
        }
        Verb::Resume | Verb::Retry => {
            for c in &clusters {
                let was_paused_by_command = lock(&c.paused_by).take().is_some();
                if !c.act {
                    said.push(format!("{}: ichor only gates this cluster.", c.name));
                    continue;
                }
                if c.rolling() {
                    said.push(format!("{}: the rollout is running.", c.name));
                    continue;
                }
                let tip = ctx.state.lock().await.tip.clone();
                let target = rolling::paused_target(c).await.or(tip);
                let Some(target) = target else {
                    said.push(format!("{}: there is nothing to roll out.", c.name));
                    continue;
                };
                match rolling::decide(ctx, c, &target, true).await? {
                    None => said.push(format!(
                        "{}: resuming the rollout from where it stopped.",
                        c.name
                    )),
                    Some(why) if was_paused_by_command => {
                        said.push(format!("{}: pause lifted ({why}).", c.name))
                    }
                    Some(why) => said.push(format!("{}: nothing to retry ({why}).", c.name)),
                }
            }
        }
    }
    Ok(said.join(" "))
}

/// Git-only mode: each unacknowledged commit on `refs/ichor/commands` is a command.
pub async fn git_commands(ctx: &Arc<Ctx>) -> Result<(), Error> {
    let pending = {
        let repo = ctx.repo()?;
        crate::git::notes::pending_commands(repo.git2(), crate::git::notes::MAX_COMMAND_WALK)?
    };
    for c in pending {
        let by = if c.author_email.is_empty() {
            c.author_name.clone()
        } else {
            c.author_email.clone()
        };
        let oid = c.oid.to_string();
        let text = match command::parse(&c.line) {
            None => "not an ichor command (the first line should start with `/ichor`); ignored."
                .to_string(),
            Some(Err(why)) => why,
            Some(Ok(cmd)) => run(ctx, None, &cmd, &by).await?,
        };
        ctx.reporters
            .ack(None, Some(&oid), None, &c.line, &by, &text)
            .await?;
    }
    Ok(())
}
