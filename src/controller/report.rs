//! Where the controller's records go: GitHub (commit statuses and the sticky comment) and
//! git notes (`refs/notes/ichor`, pushed to the repository). Git-only mode has only the
//! notes; with GitHub they are optional (`notes: true`).

use std::path::PathBuf;
use std::sync::Arc;

use crate::clock::Clock;
use crate::forge::comment::{self, RolloutSection, Sticky};
use crate::forge::github::{GithubClient, StatusState};
use crate::git::notes::{self, NoteRecord, RecordKind};
use crate::git::remote::{self, Remote};

use super::Error;

/// What the gate said about one head, for one cluster.
#[derive(Debug, Clone)]
pub struct GateReport {
    pub cluster: String,
    /// `None` in Git-only mode (a branch, not a PR).
    pub pr: Option<u64>,
    pub branch: String,
    pub head: String,
    pub state: StatusState,
    pub description: String,
    pub sticky: Sticky,
    /// The repository holds several clusters: contexts carry the cluster's name.
    pub several: bool,
}

/// Where one cluster's rollout of one commit stands.
#[derive(Debug, Clone)]
pub struct RolloutReport {
    pub cluster: String,
    pub commit: String,
    /// The PR that merged the commit, when known.
    pub pr: Option<u64>,
    pub section: RolloutSection,
    /// The PR's comment as it stood (its gate section), to redraw with the rollout.
    pub sticky: Option<Sticky>,
    pub several: bool,
}

/// Git notes written into ichor's mirror and pushed to the repository.
pub struct NotesSink {
    pub mirror: PathBuf,
    pub remote: Remote,
    /// One writer at a time within this process; others are merged on push.
    pub lock: tokio::sync::Mutex<()>,
    /// Seals ichor's `ack` records (see [`notes::AckKey`]).
    pub key: notes::AckKey,
    /// Why the last push failed, while the mirror holds records the remote lacks: they go
    /// with the next push ([`Reporters::publish_notes`] tries on every reconcile).
    pub unpublished: std::sync::Mutex<Option<String>>,
}

/// A Git-only command's acknowledgement: an `ack` record on its commit.
#[derive(Debug, Clone)]
pub struct Ack {
    pub commit: String,
    pub cluster: Option<String>,
    pub command: String,
    pub by: String,
    pub text: String,
}

#[derive(Clone)]
pub struct Reporters {
    pub github: Option<GithubClient>,
    pub notes: Option<Arc<NotesSink>>,
    pub clock: Clock,
}

fn state_word(s: StatusState) -> &'static str {
    match s {
        StatusState::Pending => "pending",
        StatusState::Success => "success",
        StatusState::Failure => "failure",
        StatusState::Error => "error",
    }
}

pub fn rollout_state(section: &RolloutSection) -> StatusState {
    use comment::RolloutState::*;
    match section.state {
        Queued(_) | Running { .. } => StatusState::Pending,
        Paused { .. } | Refused(_) | Superseded(_) => StatusState::Failure,
        Completed { .. } => StatusState::Success,
    }
}

impl Reporters {
    pub async fn gate(&self, r: &GateReport) -> Result<(), Error> {
        // With GitHub every report is a PR's head or a merge queue's group: the status
        // goes on the commit, the sticky comment only on a PR.
        if let Some(gh) = &self.github {
            gh.set_status(
                &r.head,
                &comment::gate_context(&r.cluster, r.several),
                r.state,
                &r.description,
                None,
            )
            .await?;
            if let Some(pr) = r.pr {
                gh.upsert_comment(
                    pr,
                    &comment::marker(&r.cluster),
                    &comment::render(&r.sticky),
                )
                .await?;
            }
        }
        let record = NoteRecord {
            cluster: Some(r.cluster.clone()),
            pr: r.pr,
            head: Some(r.head.clone()),
            detail: Some(format!("branch {}", crate::escape::clip(&r.branch, 200))),
            ..NoteRecord::new(
                RecordKind::Gate,
                self.clock.now(),
                state_word(r.state),
                &r.description,
            )
        };
        self.note(&r.head, record).await
    }

    /// The same reporters, sleeping out GitHub's rate limits inside each call: for work
    /// that runs in its own task (rollouts, late replies), never the event loop.
    pub fn patient(&self) -> Reporters {
        Reporters {
            github: self.github.as_ref().map(|g| g.patient()),
            notes: self.notes.clone(),
            clock: self.clock.clone(),
        }
    }

    /// Runs in the rollout's own task: a rate limit is slept out there.
    pub async fn rollout(&self, r: &RolloutReport) -> Result<(), Error> {
        let state = rollout_state(&r.section);
        let description = r.section.state.status_description();
        if let Some(gh) = self.github.as_ref().map(|g| g.patient()) {
            let gh = &gh;
            gh.set_status(
                &r.commit,
                &comment::rollout_context(&r.cluster, r.several),
                state,
                &description,
                None,
            )
            .await?;
            if let (Some(pr), Some(sticky)) = (r.pr, &r.sticky) {
                let mut s = sticky.clone();
                s.rollout = Some(r.section.clone());
                gh.upsert_comment(pr, &comment::marker(&r.cluster), &comment::render(&s))
                    .await?;
            }
        }
        let (stage, node) = match &r.section.state {
            comment::RolloutState::Paused { stage, node, .. } => {
                (Some(stage.clone()), node.clone())
            }
            comment::RolloutState::Running { stage, .. } => (Some(stage.clone()), None),
            _ => (None, None),
        };
        let word = match &r.section.state {
            comment::RolloutState::Queued(_) => "queued",
            comment::RolloutState::Running { .. } => "running",
            comment::RolloutState::Paused { .. } => "paused",
            comment::RolloutState::Refused(_) => "refused",
            comment::RolloutState::Superseded(_) => "superseded",
            comment::RolloutState::Completed { .. } => "completed",
        };
        let detail = match &r.section.state {
            comment::RolloutState::Paused { reason, .. } => Some(reason.clone()),
            comment::RolloutState::Refused(why) | comment::RolloutState::Superseded(why) => {
                Some(why.clone())
            }
            _ => None,
        };
        let record = NoteRecord {
            cluster: Some(r.cluster.clone()),
            pr: r.pr,
            stage,
            node,
            detail,
            ..NoteRecord::new(RecordKind::Rollout, self.clock.now(), word, &description)
        };
        self.note(&r.commit, record).await
    }

    /// Acknowledge a command where it was given: a reply on the PR, or an `ack` note on
    /// the command's commit (Git-only).
    pub async fn ack(
        &self,
        pr: Option<u64>,
        commit: Option<&str>,
        cluster: Option<&str>,
        command: &str,
        by: &str,
        text: &str,
    ) -> Result<(), Error> {
        if let (Some(gh), Some(pr)) = (&self.github, pr) {
            gh.post_comment(pr, &comment::acknowledgement(by, command, text))
                .await?;
        }
        if let Some(commit) = commit {
            self.ack_commits(vec![Ack {
                commit: commit.to_string(),
                cluster: cluster.map(str::to_string),
                command: command.to_string(),
                by: by.to_string(),
                text: text.to_string(),
            }])
            .await?;
        }
        Ok(())
    }

    /// Acknowledge Git-only commands: an `ack` record on each command's commit, all
    /// published in one push.
    pub async fn ack_commits(&self, acks: Vec<Ack>) -> Result<(), Error> {
        let now = self.clock.now();
        let records = acks
            .into_iter()
            .map(|a| {
                let record = NoteRecord {
                    cluster: a.cluster,
                    command: Some(a.command),
                    by: Some(a.by),
                    detail: Some(a.text.clone()),
                    ..NoteRecord::new(
                        RecordKind::Ack,
                        now,
                        "success",
                        &comment::description(&a.text),
                    )
                };
                (a.commit, record)
            })
            .collect();
        self.notes(records).await
    }

    async fn note(&self, commit: &str, record: NoteRecord) -> Result<(), Error> {
        self.notes(vec![(commit.to_string(), record)]).await
    }

    /// Push the notes when an earlier push failed; nothing to do otherwise.
    pub async fn publish_notes(&self) -> Result<(), Error> {
        match &self.notes {
            Some(sink) if super::lock(&sink.unpublished).is_some() => self.notes(vec![]).await,
            _ => Ok(()),
        }
    }

    /// Append `records` to their commits' notes in the mirror (acks sealed), then publish
    /// once. A push that fails is not the caller's failure: the records stay in the mirror
    /// and go with the next push, and the reason is logged when it changes.
    async fn notes(&self, records: Vec<(String, NoteRecord)>) -> Result<(), Error> {
        let Some(sink) = self.notes.clone() else {
            return Ok(());
        };
        let _one = sink.lock.lock().await;
        let secs = (self.clock.now().as_millis() / 1000) as i64;
        let sink = sink.clone();
        tokio::task::spawn_blocking(move || -> Result<(), Error> {
            let repo = git2::Repository::open_bare(&sink.mirror)?;
            let sig = git2::Signature::new("ichor", "ichor@localhost", &git2::Time::new(secs, 0))?;
            let mut changed = false;
            for (commit, mut record) in records {
                let oid = git2::Oid::from_str(&commit)?;
                if record.kind == RecordKind::Ack {
                    sink.key.seal(oid, &mut record);
                }
                changed |= notes::append(&repo, oid, &[record], &sig)?;
            }
            let mut unpublished = super::lock(&sink.unpublished);
            if !changed && unpublished.is_none() {
                return Ok(());
            }
            let remote = sink.remote.clone();
            match notes::push(&repo, &remote.url, &|| remote::callbacks(&remote), 5) {
                Ok(_) => {
                    if unpublished.take().is_some() {
                        tracing::info!("ichor's notes are published again");
                    }
                }
                Err(e) => {
                    let why = e.to_string();
                    if unpublished.as_deref() != Some(why.as_str()) {
                        tracing::warn!(error = %why, "ichor's notes could not be published; they stay in its mirror and go with the next push");
                    }
                    *unpublished = Some(why);
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::Other(format!("the notes writer stopped: {e}")))?
    }
}
