//! Commands given in Git: PR comments (`/ichor plan|retry|pause|resume [cluster]`) from
//! users with write access, or, in Git-only mode, commits on `refs/ichor/commands`. Every
//! command is acknowledged where it was given; a refusal says why, politely.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use crate::git::notes;

use crate::forge::command::{self, Command, Verb};

use super::{lock, rolling, ClusterRuntime, Ctx, Error, Event};

/// A comment older than this is not taken as a command: a delivery captured and replayed
/// later (the signature covers the body, not when it was sent) runs nothing. GitHub sends a
/// delivery within seconds; a redelivery of an old one is refused too, on purpose.
pub const MAX_COMMAND_AGE: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// How long a "no write access" answer stands for the same person.
const NO_WRITE_REMEMBERED: std::time::Duration = std::time::Duration::from_secs(60);

/// Comment ids already handled: a command runs once per comment, however often its
/// delivery comes. Bounded: the oldest ids go first (by then [`MAX_COMMAND_AGE`] refuses
/// their comments anyway).
#[derive(Default)]
pub struct SeenComments {
    order: std::collections::VecDeque<u64>,
    ids: std::collections::HashSet<u64>,
}

impl SeenComments {
    const CAP: usize = 10_000;

    /// Whether `id` is new; remembered from now on.
    pub fn first_time(&mut self, id: u64) -> bool {
        if !self.ids.insert(id) {
            return false;
        }
        self.order.push_back(id);
        while self.order.len() > Self::CAP {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
        true
    }
}

/// A PR comment as the webhook told it.
pub struct Comment<'a> {
    pub number: u64,
    pub id: u64,
    pub created_at: Option<crate::clock::Timestamp>,
    pub author: &'a str,
    pub body: &'a str,
}

fn count(ctx: &Ctx, verb: &str, result: &str) {
    ctx.metrics.inc(
        "ichor_commands_total",
        "Commands, by verb and result.",
        &[("verb", verb), ("result", result)],
    );
}

/// A PR comment arrived.
pub async fn on_comment(ctx: &Arc<Ctx>, c: &Comment<'_>) -> Result<(), Error> {
    let (number, author, body) = (c.number, c.author, c.body);
    let Some(gh) = &ctx.github else {
        return Ok(());
    };
    if author == gh.login() {
        return Ok(());
    }
    let Some(parsed) = command::parse(body) else {
        return Ok(());
    };
    // Replays run nothing and get no reply: the same comment again, or one too old.
    if !ctx.state.lock().await.seen_comments.first_time(c.id) {
        tracing::info!(
            pr = number,
            comment = c.id,
            "a command comment seen before: not run again"
        );
        count(ctx, "unknown", "replayed");
        return Ok(());
    }
    let now = ctx.clock.now();
    let fresh = c
        .created_at
        .is_some_and(|at| now.since(at) <= MAX_COMMAND_AGE);
    if !fresh {
        tracing::warn!(
            pr = number,
            comment = c.id,
            "a command comment older than {}s (or undated): not run",
            MAX_COMMAND_AGE.as_secs()
        );
        count(ctx, "unknown", "stale");
        return Ok(());
    }
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
    // A refusal is remembered a minute, so a flood from one person costs GitHub one
    // lookup, not one per comment; write access is always asked afresh.
    let refused_lately = ctx
        .state
        .lock()
        .await
        .no_write
        .get(author)
        .is_some_and(|at| now.since(*at) < NO_WRITE_REMEMBERED);
    let can_write = !refused_lately && gh.permission(author).await?.can_write();
    if !can_write {
        let mut st = ctx.state.lock().await;
        // Bounded by the minute it is kept: what is older goes.
        st.no_write
            .retain(|_, at| now.since(*at) < NO_WRITE_REMEMBERED);
        st.no_write.insert(author.to_string(), now);
        drop(st);
        count(ctx, cmd.verb.as_str(), "refused");
        // Told once per PR: anyone can comment, and every reply is a write to GitHub.
        if !ctx.state.lock().await.refusal_told.insert(number) {
            return Ok(());
        }
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
                use super::gating::Judged;
                // Say what was done, not what was hoped for.
                said.push(match super::gating::gate_pull_number(ctx, n, true).await {
                    Ok(Judged::Posted { clusters, untouched }) if clusters.is_empty() => format!(
                        "nothing to judge: this PR changes none of the clusters ichor gates here{}.",
                        if untouched.is_empty() { String::new() } else { format!(" ({} left as they are)", untouched.join(", ")) }
                    ),
                    Ok(Judged::Posted { clusters, .. }) => format!(
                        "judged the head again for {}; the comment above is up to date.",
                        clusters.join(", ")
                    ),
                    Ok(Judged::Unchanged) => "the head was judged already; the comment above is up to date.".into(),
                    Ok(Judged::Stale) => "a newer head arrived meanwhile; it is judged next.".into(),
                    Ok(Judged::Closed) => "this PR is closed: nothing was judged.".into(),
                    Ok(Judged::NoForge) => "nothing was judged: ichor has no GitHub access here.".into(),
                    Err(Error::Forge(crate::forge::github::ForgeError::NotFound { .. })) => {
                        "GitHub knows no such PR: nothing was judged.".into()
                    }
                    Err(e) => return Err(e),
                });
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

/// Git-only commands this controller handled, kept in its state dir (not in the shared
/// notes, where anyone who can push could add or push out an `ack`), and the key that
/// seals its acks.
pub struct CommandLedger {
    pub key: notes::AckKey,
    path: std::path::PathBuf,
    inner: Mutex<LedgerState>,
}

struct LedgerState {
    done: BTreeSet<git2::Oid>,
    /// Oldest first, to keep the newest [`CommandLedger::KEEP`].
    order: VecDeque<git2::Oid>,
    /// No ledger was on disk at the start: acks already in the notes count once.
    fresh: bool,
}

impl CommandLedger {
    /// More than one walk's worth ([`notes::MAX_COMMAND_WALK`]), so nothing walked is forgotten.
    const KEEP: usize = 10 * notes::MAX_COMMAND_WALK;
    const KEY_FILE: &'static str = "ack.key";
    const LEDGER_FILE: &'static str = "commands-handled";

    /// The ledger in `state_dir`, with its key: read from `key_file` when given (a Secret,
    /// so that acks stay ichor's own across a state dir that starts empty), else kept in
    /// the state dir (created on first use, mode 0600).
    pub fn open(
        state_dir: &std::path::Path,
        key_file: Option<&std::path::Path>,
    ) -> Result<CommandLedger, Error> {
        let err = |e: crate::state::StateError| Error::Other(e.to_string());
        let key_path = key_file.map_or_else(|| state_dir.join(Self::KEY_FILE), |p| p.to_path_buf());
        let kept = match key_file {
            Some(path) => Some(
                crate::secret::Secret::from_file(path)
                    .map_err(|e| Error::Other(e.to_string()))?
                    .expose()
                    .as_bytes()
                    .to_vec(),
            ),
            None => crate::state::read_private(&key_path, 1024).map_err(err)?,
        };
        let key = match kept {
            Some(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let raw = hex::decode(text.trim())
                    .ok()
                    .and_then(|b| <[u8; 32]>::try_from(b).ok());
                match raw {
                    Some(raw) => notes::AckKey::new(raw),
                    None => {
                        return Err(Error::Other(format!(
                            "{}: not the 64 hex digits ichor writes; delete it to let ichor make a new key (commands already acknowledged in the notes then count once)",
                            key_path.display()
                        )))
                    }
                }
            }
            None => {
                let key = notes::AckKey::random();
                crate::state::write_private(
                    &key_path,
                    format!("{}\n", hex::encode(key.bytes())).as_bytes(),
                )
                .map_err(err)?;
                key
            }
        };
        let path = state_dir.join(Self::LEDGER_FILE);
        let (order, fresh) =
            match crate::state::read_private(&path, 64 * Self::KEEP as u64).map_err(err)? {
                Some(bytes) => (
                    String::from_utf8_lossy(&bytes)
                        .lines()
                        .filter_map(|l| git2::Oid::from_str(l.trim()).ok())
                        .collect::<VecDeque<_>>(),
                    false,
                ),
                None => (VecDeque::new(), true),
            };
        Ok(CommandLedger {
            key,
            path,
            inner: Mutex::new(LedgerState {
                done: order.iter().copied().collect(),
                order,
                fresh,
            }),
        })
    }

    /// Remember `oids` as handled, on disk before anything is acknowledged.
    fn record(&self, oids: impl IntoIterator<Item = git2::Oid>) -> Result<(), Error> {
        let text = {
            let mut st = lock(&self.inner);
            for oid in oids {
                if st.done.insert(oid) {
                    st.order.push_back(oid);
                }
            }
            while st.order.len() > Self::KEEP {
                if let Some(old) = st.order.pop_front() {
                    st.done.remove(&old);
                }
            }
            st.fresh = false;
            st.order
                .iter()
                .map(|o| format!("{o}\n"))
                .collect::<String>()
        };
        crate::state::write_private(&self.path, text.as_bytes())
            .map_err(|e| Error::Other(e.to_string()))
    }
}

/// Git-only mode: each commit on `refs/ichor/commands` this controller has not handled is a
/// command. All are acknowledged in one push.
pub async fn git_commands(ctx: &Arc<Ctx>) -> Result<(), Error> {
    let ledger = &ctx.ledger;
    let found = {
        let repo = ctx.repo()?;
        let st = lock(&ledger.inner);
        notes::pending_commands(
            repo.git2(),
            notes::Handled {
                key: &ledger.key,
                done: &st.done,
                trust_every_ack: st.fresh,
            },
            notes::MAX_COMMAND_WALK,
        )?
    };
    for oid in &found.forged {
        tracing::warn!(command = %oid, "a command on refs/ichor/commands has an ack this controller did not write; ichor runs it");
    }
    if !found.acknowledged.is_empty() || lock(&ledger.inner).fresh {
        ledger.record(found.acknowledged.iter().copied())?;
    }
    let mut acks = Vec::new();
    let mut failed = None;
    for c in found.commands {
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
            Some(Ok(cmd)) => match run(ctx, None, &cmd, &by).await {
                Ok(text) => text,
                Err(e) => {
                    // Not handled: it runs again next time; those before it are acknowledged.
                    failed = Some(e);
                    break;
                }
            },
        };
        // Handled from now on, whatever becomes of the notes.
        ledger.record([c.oid])?;
        acks.push(super::report::Ack {
            commit: oid,
            cluster: None,
            command: c.line.clone(),
            by,
            text,
        });
    }
    ctx.reporters.ack_commits(acks).await?;
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_keeps_the_acks_key_across_an_empty_state_dir(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let secret = tempfile::tempdir()?;
        let key_file = secret.path().join("key");
        std::fs::write(&key_file, format!("{}\n", "ab".repeat(32)))?;
        let first = tempfile::tempdir()?;
        let second = tempfile::tempdir()?;
        let a = CommandLedger::open(first.path(), Some(&key_file))?;
        let b = CommandLedger::open(second.path(), Some(&key_file))?;
        assert_eq!(a.key.id(), b.key.id());
        assert_eq!(a.key.id(), notes::AckKey::new([0xab; 32]).id());
        assert!(!first.path().join(CommandLedger::KEY_FILE).exists());
        // Without it, each state dir makes its own key: a restart on an emptyDir
        // trusts none of its old acks.
        let c = CommandLedger::open(first.path(), None)?;
        let d = CommandLedger::open(second.path(), None)?;
        assert_ne!(c.key.id(), d.key.id());
        // A key file that is not 64 hex digits is refused, not replaced.
        std::fs::write(&key_file, "short\n")?;
        assert!(CommandLedger::open(first.path(), Some(&key_file)).is_err());
        Ok(())
    }
}
