//! Where the controller's records go: GitHub (commit statuses and the sticky comment) and
//! git notes (`refs/notes/ichor`, pushed to the repository). Git-only mode has only the
//! notes; with GitHub they are optional (`notes: true`).

use std::path::PathBuf;
use std::sync::Arc;

use crate::clock::Clock;
use crate::forge::comment::{self, RolloutSection, Sticky};
use crate::forge::github::{
    CheckAnnotation, CheckRunOut, Conclusion, GithubClient, RunState, StatusState,
};
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
    /// Lines of the head's files that the failing items are about (a check run's
    /// annotations, in App mode).
    pub annotations: Vec<CheckAnnotation>,
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

/// The gate's check run (App mode): the verdict as its conclusion — waiting stays in
/// progress, never `neutral`, which GitHub and Renovate count as passing — the checklist
/// as its summary, the plan as its text.
pub fn gate_run(r: &GateReport) -> CheckRunOut {
    let state = match r.state {
        StatusState::Success => RunState::Completed(Conclusion::Success),
        StatusState::Pending => RunState::InProgress,
        StatusState::Failure | StatusState::Error => RunState::Completed(Conclusion::Failure),
    };
    let mut summary = r.sticky.checklist.clone();
    for n in &r.sticky.notes {
        summary.push_str(&format!("\n- {}", crate::escape::md_text(n)));
    }
    summary.push_str(&format!(
        "\n\n<sub>Judged at head `{}` with the base revision's policies and rollout settings.</sub>\n",
        crate::escape::md_text(crate::escape::clip(&r.head, 10))
    ));
    CheckRunOut {
        state,
        title: r.description.clone(),
        summary,
        text: format!("### The staged plan\n\n{}", r.sticky.plan),
        annotations: r.annotations.clone(),
    }
}

/// Annotations for a gate's check run: each failing (and warning) item that is about a
/// line of the head's `release-set.yaml` or `cluster.yaml` points at that line — the
/// version line of the component it names, the `inventory:` key. Items about no one
/// line (a blocker, a downgrade) stay in the summary only.
pub fn gate_annotations(
    cluster: &str,
    release_set: Option<&str>,
    cluster_yaml: Option<&str>,
    items: &[crate::policy::CheckItem],
) -> Vec<CheckAnnotation> {
    use crate::policy::Status;
    let rs_path = format!("clusters/{cluster}/release-set.yaml");
    let cl_path = format!("clusters/{cluster}/cluster.yaml");
    let mut out = Vec::new();
    for item in items {
        let level = match item.status {
            Status::Fail => "failure",
            Status::Warn => "warning",
            _ => continue,
        };
        let subject = item.id.rsplit('/').next().unwrap_or(&item.id);
        let found = if item.id == "inventory" {
            cluster_yaml
                .and_then(|t| key_line(t, "inventory"))
                .map(|l| (cl_path.clone(), l))
        } else {
            release_set
                .and_then(|t| component_line(t, subject))
                .map(|l| (rs_path.clone(), l))
        };
        if let Some((path, line)) = found {
            out.push(CheckAnnotation {
                path,
                line,
                level,
                title: item.title.clone(),
                message: match &item.hint {
                    Some(h) => format!("{}\n{h}", item.message),
                    None => item.message.clone(),
                },
            });
        }
    }
    out
}

/// The 1-based line of the first `key:` (any indentation, not a comment).
fn key_line(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .position(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            t.strip_prefix(key).is_some_and(|r| r.starts_with(':'))
        })
        .map(|i| i as u64 + 1)
}

/// The line holding the version of `subject`: `talos:`/`kubernetes:` (an id like
/// `kubernetes-step` names it first), the `cni:` block, or an entry `name: <subject>` and
/// its `version:` below.
fn component_line(text: &str, subject: &str) -> Option<u64> {
    for key in ["talos", "kubernetes"] {
        if subject == key || subject.starts_with(&format!("{key}-")) {
            return key_line(text, key);
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    let at = if subject == "cni" {
        key_line(text, "cni")? as usize - 1
    } else {
        lines.iter().position(|l| {
            let t = l.trim_start().trim_start_matches("- ").trim();
            t.strip_prefix("name:")
                .is_some_and(|v| v.trim().trim_matches('"').trim_matches('\'') == subject)
        })?
    };
    let version = lines[at..]
        .iter()
        .take(4)
        .position(|l| l.trim_start().starts_with("version:"));
    Some((at + version.unwrap_or(0)) as u64 + 1)
}

/// The rollout's check run (App mode), one per commit and cluster, edited in place: a
/// pause is `action_required` and says how to resume.
pub fn rollout_run(cluster: &str, section: &RolloutSection) -> CheckRunOut {
    use comment::RolloutState::*;
    let state = match &section.state {
        Queued(_) => RunState::Queued,
        Running { .. } => RunState::InProgress,
        Paused { .. } => RunState::Completed(Conclusion::ActionRequired),
        Refused(_) => RunState::Completed(Conclusion::Failure),
        Superseded(_) => RunState::Completed(Conclusion::Cancelled),
        Completed { .. } => RunState::Completed(Conclusion::Success),
    };
    let mut summary = comment::render_rollout(cluster, section);
    if matches!(section.state, Paused { .. }) {
        summary.push_str(
            "\n**To resume**: fix the cause, then comment `/ichor retry` on the PR that merged this commit (write access needed); `/ichor resume` lifts an operator's `/ichor pause`.\n",
        );
    }
    CheckRunOut {
        state,
        title: section.state.status_description(),
        summary,
        text: String::new(),
        annotations: vec![],
    }
}

/// What a token's commit status says of a rollout: the state and stage, not the running
/// count or the ETA, so a rollout posts a handful of statuses per commit however many
/// nodes it has (GitHub keeps at most 1,000 per commit and context); the progress is in
/// the comment.
fn rollout_status_description(state: &comment::RolloutState) -> String {
    match state {
        comment::RolloutState::Running { stage, .. } => comment::RolloutState::Running {
            stage: stage.clone(),
            eta: None,
        }
        .status_description(),
        other => other.status_description(),
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
            let name = comment::gate_context(&r.cluster, r.several);
            if gh.is_app() {
                // A check run only: a status of the same name would be required beside it.
                gh.upsert_check_run(&r.head, &name, &gate_run(r)).await?;
            } else {
                gh.set_status(&r.head, &name, r.state, &r.description, None)
                    .await?;
            }
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

    /// A head that touches none of `cluster`'s files passes its gate ("nothing to judge"),
    /// so a required check never holds back a change elsewhere. GitHub only: the notes
    /// record verdicts, not their absence.
    pub async fn untouched(&self, head: &str, cluster: &str, several: bool) -> Result<(), Error> {
        let Some(gh) = &self.github else {
            return Ok(());
        };
        let name = comment::gate_context(cluster, several);
        let why = format!("nothing to judge: this change leaves cluster {cluster} as it is");
        if gh.is_app() {
            let run = CheckRunOut {
                // GitHub and Renovate count `skipped` as passing.
                state: RunState::Completed(Conclusion::Skipped),
                title: comment::description(&why),
                summary: crate::escape::md_text(&why),
                text: String::new(),
                annotations: vec![],
            };
            gh.upsert_check_run(head, &name, &run).await?;
        } else {
            gh.set_status(
                head,
                &name,
                StatusState::Success,
                &comment::description(&why),
                None,
            )
            .await?;
        }
        Ok(())
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
            let name = comment::rollout_context(&r.cluster, r.several);
            if gh.is_app() {
                gh.upsert_check_run(&r.commit, &name, &rollout_run(&r.cluster, &r.section))
                    .await?;
            } else {
                gh.set_status(
                    &r.commit,
                    &name,
                    state,
                    &rollout_status_description(&r.section.state),
                    None,
                )
                .await?;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{CheckItem, Status};

    const RS: &str = "spec:\n  talos: v1.12.4\n  kubernetes: v1.30.14\n  cni:\n    name: cilium\n    version: 1.18.3\n  addons:\n    - name: longhorn\n      # renovate: x\n      version: v1.10.1\n";

    #[test]
    fn failing_items_point_at_the_version_line_they_are_about() {
        let items = vec![
            CheckItem::new("kubernetes-step", "K", Status::Fail, "too far"),
            CheckItem::new("cni", "CNI", Status::Warn, "old"),
            CheckItem::new("addon/longhorn", "L", Status::Fail, "needs 1.11"),
            CheckItem::new("blocker/x", "B", Status::Fail, "no line"),
            CheckItem::new("talos-step", "T", Status::Pass, "fine"),
            CheckItem::new("inventory", "I", Status::Fail, "bad"),
        ];
        let got: Vec<(String, u64, &str)> =
            gate_annotations("lab", Some(RS), Some("spec:\n  inventory:\n"), &items)
                .into_iter()
                .map(|a| (a.path, a.line, a.level))
                .collect();
        assert_eq!(
            got,
            [
                ("clusters/lab/release-set.yaml".to_string(), 3, "failure"),
                ("clusters/lab/release-set.yaml".to_string(), 6, "warning"),
                ("clusters/lab/release-set.yaml".to_string(), 10, "failure"),
                ("clusters/lab/cluster.yaml".to_string(), 2, "failure"),
            ]
        );
    }
}
