//! The rollout half of the loop: when the protected branch moves, each cluster ichor acts
//! on decides from its rollout record and the change whether to roll, resume or rest; a
//! rollout runs in its own task (one per cluster) and reports every stage to the merge
//! commit, the PR that merged it and the notes.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::forge::comment::{RolloutSection, RolloutState, Sticky};
use crate::gate::{self, Change};
use crate::plan::PlanOptions;
use crate::policy::{Outcome, Status};
use crate::rollout::record::{self, RecordState};
use crate::rollout::{Progress, Rollout, RunOutcome, Target};

use super::config::notify;
use super::{lock, ClusterRuntime, Ctx, Error, RolloutReport, SHUTDOWN_REASON};

/// The protected branch's tip, looked at for every cluster ichor acts on.
pub async fn on_branch(ctx: &Arc<Ctx>) -> Result<(), Error> {
    let repo = ctx.repo()?;
    let branch = format!("refs/heads/{}", ctx.cfg.repository.branch);
    let Some(tip) = repo.resolve(&branch).ok().and_then(|r| r.commit) else {
        return Ok(());
    };
    let tip = tip.to_string();
    ctx.state.lock().await.tip = Some(tip.clone());
    for cluster in &ctx.clusters {
        if !cluster.act {
            continue;
        }
        // Pausing through Git: `spec.rollout.paused` at the tip, read on every look.
        let paused_now = repo
            .resolve(&tip)
            .ok()
            .and_then(|rev| {
                repo.read_file(&rev, &format!("clusters/{}/cluster.yaml", cluster.name))
                    .ok()
                    .flatten()
            })
            .and_then(|text| crate::releaseset::Cluster::parse("cluster.yaml", &text).ok())
            .is_some_and(|doc| doc.spec.rollout.paused);
        let was = cluster.git_paused.swap(paused_now, Ordering::Relaxed);
        if was != paused_now && ctx.holds(cluster).await {
            let text = if paused_now {
                "paused through cluster.yaml: a running rollout stops at its next safe point; no rollout starts until it is set back to false"
            } else {
                "unpaused through cluster.yaml: a paused rollout resumes"
            };
            ctx.reporters
                .ack(
                    None,
                    Some(&tip),
                    Some(&cluster.name),
                    "spec.rollout.paused",
                    "cluster.yaml",
                    text,
                )
                .await?;
            if was && !cluster.rolling() {
                decide(ctx, cluster, &tip, false).await?;
                *lock(&cluster.decided_tip) = Some(tip.clone());
                continue;
            }
        }
        if cluster.rolling() {
            let path = format!("clusters/{}/release-set.yaml", cluster.name);
            let at_tip = repo
                .resolve(&tip)
                .ok()
                .and_then(|rev| repo.read_file(&rev, &path).ok().flatten())
                .and_then(|text| crate::releaseset::ReleaseSet::parse(&path, &text).ok());
            if let Some(rs) = at_tip {
                stop_if_backwards(ctx, cluster, &rs, &tip).await?;
            }
            continue;
        }
        if lock(&cluster.decided_tip).as_deref() == Some(tip.as_str()) {
            continue;
        }
        if !ctx.holds(cluster).await {
            continue;
        }
        decide(ctx, cluster, &tip, false).await?;
        *lock(&cluster.decided_tip) = Some(tip.clone());
    }
    Ok(())
}

/// While a rollout runs, a newer tip whose release set has a lower Talos or Kubernetes than
/// its target (a revert) must not wait for the rollout to end and then be refused: the
/// rollout stops at its next safe point, and says why on the tip.
async fn stop_if_backwards(
    ctx: &Arc<Ctx>,
    cluster: &Arc<ClusterRuntime>,
    rs: &crate::releaseset::ReleaseSet,
    tip: &str,
) -> Result<(), Error> {
    if lock(&cluster.backwards).is_some() {
        return Ok(());
    }
    let Some(kube) = &cluster.kube else {
        return Ok(());
    };
    let Ok(Some(stored)) = record::load(kube, &cluster.name).await else {
        return Ok(());
    };
    let target = &stored.record.target;
    if target.commit == tip || stored.record.state != RecordState::Running {
        return Ok(());
    }
    let lower = |now: &str, running: &str| match (
        crate::releaseset::Version::parse(now),
        crate::releaseset::Version::parse(running),
    ) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    };
    let mut back = Vec::new();
    if lower(&rs.spec.talos.to_string(), &target.talos) {
        back.push(format!("Talos {} → {}", target.talos, rs.spec.talos));
    }
    if lower(&rs.spec.kubernetes.to_string(), &target.kubernetes) {
        back.push(format!(
            "Kubernetes {} → {}",
            target.kubernetes, rs.spec.kubernetes
        ));
    }
    if back.is_empty() {
        return Ok(());
    }
    let why = format!(
        "ichor never downgrades: the branch moved to {}, which would move {} back from the running rollout's target; the rollout stops at its next safe point — merge the newer versions back, then /ichor retry",
        crate::releaseset::excerpt(tip, 12),
        back.join(" and ")
    );
    *lock(&cluster.backwards) = Some(why.clone());
    say_on_commit(ctx, cluster, tip, &why).await
}

/// ichor's own word on a commit of the protected branch (a note, and the PR when known).
async fn say_on_commit(
    ctx: &Arc<Ctx>,
    cluster: &ClusterRuntime,
    tip: &str,
    text: &str,
) -> Result<(), Error> {
    ctx.reporters
        .ack(
            None,
            Some(tip),
            Some(&cluster.name),
            "rollout",
            "ichor",
            text,
        )
        .await
}

/// The newest first-parent ancestor of `tip` whose Talos or Kubernetes differs from the
/// tip's for `cluster` (at most [`MAX_BASE_WALK`] back): where the change that matters
/// starts, even when later commits (a README, a pause toggle) came on top of it.
pub fn rollout_base(repo: &crate::git::Repo, cluster: &str, tip: &str) -> Result<String, Error> {
    let versions = |oid: git2::Oid| -> Option<(String, String)> {
        let rev = repo.resolve(&oid.to_string()).ok()?;
        let path = format!("clusters/{cluster}/release-set.yaml");
        let text = repo.read_file(&rev, &path).ok()??;
        let rs = crate::releaseset::ReleaseSet::parse(&path, &text).ok()?;
        Some((rs.spec.talos.to_string(), rs.spec.kubernetes.to_string()))
    };
    let tip_oid = git2::Oid::from_str(tip)?;
    let want = versions(tip_oid);
    let mut commit = repo.git2().find_commit(tip_oid)?;
    for _ in 0..MAX_BASE_WALK {
        let Ok(parent) = commit.parent(0) else { break };
        if versions(parent.id()) != want {
            return Ok(parent.id().to_string());
        }
        commit = parent;
    }
    first_parent(repo, tip)
}

/// `change` with the rollout settings (`cluster.yaml`) of `tip`, the newest commit of the
/// protected branch, whichever target the rollout carries: what a pause asks to change there
/// (drain options, timeouts, `replacesKubeProxy`, health checks) takes effect when the fix
/// is merged and the rollout resumes. Only commits of the protected branch get here, never a
/// PR head. Without a `cluster.yaml` at `tip` the change keeps the one it has.
pub fn settings_at(repo: &crate::git::Repo, change: &mut Change, tip: &str) -> Result<(), Error> {
    let rev = repo.resolve(tip)?;
    let path = format!("clusters/{}/cluster.yaml", change.cluster);
    if let Some(text) = repo.read_file(&rev, &path)? {
        change.cluster_doc = Some(crate::releaseset::Cluster::parse(&path, &text)?);
        change.cluster_doc_side = "head";
        // Merged: the edits apply now.
        change.cluster_edits.clear();
    }
    Ok(())
}

/// How a pause through cluster.yaml starts its reason (setting it back resumes by itself).
const GIT_PAUSE_REASON: &str = "paused in cluster.yaml (spec.rollout.paused: true)";

/// How far back [`rollout_base`] looks.
const MAX_BASE_WALK: usize = 200;

fn first_parent(repo: &crate::git::Repo, commit: &str) -> Result<String, Error> {
    let c = repo.git2().find_commit(git2::Oid::from_str(commit)?)?;
    Ok(c.parent_id(0).unwrap_or(c.id()).to_string())
}

/// Roll `cluster` to `tip` if it is not there: from the record, a completed rollout of
/// `tip` is done; a running one (a crash) or one paused by a shutdown resumes; a pause for
/// a human waits for `/ichor retry` (`retry` is that). Otherwise the change since the last
/// completed target (or the tip's first parent) rolls out when it moves a version.
pub async fn decide(
    ctx: &Arc<Ctx>,
    cluster: &Arc<ClusterRuntime>,
    tip: &str,
    retry: bool,
) -> Result<Option<String>, Error> {
    let Some(kube) = &cluster.kube else {
        return Ok(Some("ichor cannot reach this cluster".into()));
    };
    if cluster.git_paused.load(Ordering::Relaxed) {
        return Ok(Some(GIT_PAUSE_REASON.into()));
    }
    let repo = ctx.repo()?;
    let stored = record::load(kube, &cluster.name)
        .await
        .map_err(|e| Error::Other(e.to_string()))?;
    let mut resume = false;
    let mut base = rollout_base(&repo, &cluster.name, tip)?;
    let mut head = tip.to_string();
    if let Some(s) = &stored {
        let r = &s.record;
        let same = r.target.commit == tip;
        match r.state {
            RecordState::Completed if same && !retry => {
                return Ok(Some("already rolled out".into()))
            }
            RecordState::Running => {
                // A crash or a kill mid-rollout: carry on with that target first.
                head = r.target.commit.clone();
                base = rollout_base(&repo, &cluster.name, &head)?;
                resume = true;
            }
            RecordState::Paused => {
                // Paused by a shutdown, or by cluster.yaml now set back: carry on by itself.
                let by_shutdown = r.pause.as_ref().is_some_and(|p| {
                    p.reason == SHUTDOWN_REASON || p.reason.starts_with(GIT_PAUSE_REASON)
                });
                if by_shutdown || retry {
                    head = r.target.commit.clone();
                    base = rollout_base(&repo, &cluster.name, &head)?;
                    resume = true;
                } else if same {
                    return Ok(Some("paused; waiting for /ichor retry".into()));
                }
                // Else a newer target supersedes the paused one, from where it changed.
            }
            RecordState::Completed => {
                let done = git2::Oid::from_str(&r.target.commit).ok();
                let tip_oid = git2::Oid::from_str(tip)?;
                if let Some(done) = done {
                    if repo
                        .git2()
                        .graph_descendant_of(tip_oid, done)
                        .unwrap_or(false)
                    {
                        base = done.to_string();
                    }
                }
            }
        }
    }
    let mut change = match gate::load(&repo, &base, &head, Some(&cluster.name)) {
        Ok(c) => c,
        // The cluster is not (or no longer) in the repository.
        Err(gate::GateError::UnknownCluster { .. }) => {
            return Ok(Some("not in the repository".into()))
        }
        Err(e) => return Err(e.into()),
    };
    settings_at(&repo, &mut change, tip)?;
    // ichor never downgrades: a merge (a revert, say) that moves Talos or Kubernetes back
    // starts nothing, and says so on the commit.
    let backwards: Vec<String> = change
        .bump
        .changes
        .iter()
        .filter(|c| {
            matches!(
                c.component,
                crate::releaseset::ComponentId::Talos | crate::releaseset::ComponentId::Kubernetes
            ) && c.kind == crate::releaseset::ChangeKind::Downgrade
        })
        .map(|c| {
            let v = |v: &Option<crate::releaseset::Version>| {
                v.as_ref().map_or("?".to_string(), |v| v.to_string())
            };
            format!("{} {} → {}", c.component, v(&c.from), v(&c.to))
        })
        .collect();
    if !backwards.is_empty() {
        let why = format!(
            "ichor never downgrades: this commit moves {} on {}; nothing was started — merge the newer versions back (or downgrade by hand, outside ichor)",
            backwards.join(" and "),
            cluster.name
        );
        say_on_commit(ctx, cluster, tip, &why).await?;
        return Ok(Some(why));
    }
    // Add-ons and the CNI are deployed by the GitOps tool; ichor rolls Talos and Kubernetes.
    let moves = change.bump.talos_moves() || change.bump.kubernetes_moves();
    if !moves && !resume && !retry {
        return Ok(Some(
            "the change moves neither Talos nor Kubernetes on this cluster".into(),
        ));
    }
    // Observed state over cursors: with no record to go by, a cluster already running the
    // target (a fresh ichor on a cluster kept up to date by hand) has nothing to roll.
    if stored.is_none() && !resume {
        if let Ok(nodes) = kube.nodes().await {
            let rs = &change.head_release_set.spec;
            let same = |a: &str, b: &str| a.trim_start_matches('v') == b.trim_start_matches('v');
            let (talos, kubernetes) = (rs.talos.to_string(), rs.kubernetes.to_string());
            let at_target = !nodes.is_empty()
                && nodes.iter().all(|n| {
                    same(n.talos.as_deref().unwrap_or(""), &talos) && same(&n.kubelet, &kubernetes)
                });
            if at_target {
                return Ok(Some("every node already runs the target".into()));
            }
        }
    }
    start(ctx, cluster, change, resume);
    Ok(None)
}

/// Start the rollout task for `change`.
pub fn start(ctx: &Arc<Ctx>, cluster: &Arc<ClusterRuntime>, change: Change, resume: bool) {
    *lock(&cluster.backwards) = None;
    let task = tokio::spawn(run(ctx.clone(), cluster.clone(), change, resume));
    *lock(&cluster.rollout) = Some(task);
}

async fn find_pull(ctx: &Ctx, commit: &str) -> Option<u64> {
    let gh = ctx.github.as_ref()?;
    match gh.pulls_for_commit(commit).await {
        Ok(pulls) => pulls
            .iter()
            .find(|p| p.merge_commit_sha.as_deref() == Some(commit))
            .or(pulls.first())
            .map(|p| p.number),
        Err(e) => {
            tracing::warn!(error = %e, "cannot find the PR of a merge commit");
            None
        }
    }
}

/// The PR's comment to redraw: as the gate last left it, else rebuilt from the change.
async fn sticky_for(ctx: &Ctx, pr: Option<u64>, change: &Change) -> Option<Sticky> {
    let pr = pr?;
    if let Some(s) = ctx
        .state
        .lock()
        .await
        .stickies
        .get(&(pr, change.cluster.clone()))
    {
        return Some(s.clone());
    }
    let verdict = gate::verdict(change);
    let plan = match gate::plan(change, &PlanOptions::default()) {
        Ok(p) => p.render_markdown(),
        Err(e) => format!("No plan: {}", crate::escape::md_text(&e.to_string())),
    };
    Some(Sticky {
        cluster: change.cluster.clone(),
        head: change
            .head
            .commit
            .map(|c| c.to_string())
            .unwrap_or_default(),
        checklist: verdict.render_markdown(),
        plan,
        notes: vec![],
        rollout: None,
    })
}

struct Reporting {
    ctx: Arc<Ctx>,
    cluster: String,
    commit: String,
    pr: Option<u64>,
    sticky: Option<Sticky>,
    several: bool,
    section: Mutex<RolloutSection>,
}

impl Reporting {
    async fn send(&self) {
        let section = lock(&self.section).clone();
        let r = RolloutReport {
            cluster: self.cluster.clone(),
            commit: self.commit.clone(),
            pr: self.pr,
            section,
            sticky: self.sticky.clone(),
            several: self.several,
        };
        if let Err(e) = self.ctx.reporters.rollout(&r).await {
            super::error_policy(&self.ctx, &e);
        }
        self.ctx.bump();
    }

    fn set(&self, state: RolloutState) {
        lock(&self.section).state = state;
    }

    fn checks(&self, checks: Vec<crate::forge::comment::CheckLine>) {
        lock(&self.section).checks = checks;
    }

    fn line(&self, l: String) {
        let mut s = lock(&self.section);
        s.lines.push(l);
        // The record keeps the whole history; the comment shows the end of it.
        let excess = s.lines.len().saturating_sub(200);
        s.lines.drain(..excess);
    }
}

async fn run(ctx: Arc<Ctx>, cluster: Arc<ClusterRuntime>, change: Change, resume: bool) {
    let commit = change
        .head
        .commit
        .map(|c| c.to_string())
        .unwrap_or_default();
    let pr = find_pull(&ctx, &commit).await;
    let several = ctx
        .repo()
        .map(|r| super::several_clusters(&r, &commit))
        .unwrap_or(false);
    let rep = Arc::new(Reporting {
        ctx: ctx.clone(),
        cluster: cluster.name.clone(),
        commit: commit.clone(),
        pr,
        sticky: sticky_for(&ctx, pr, &change).await,
        several,
        section: Mutex::new(RolloutSection {
            commit: commit.clone(),
            state: RolloutState::Queued("the pre-flight gate runs against the live cluster".into()),
            lines: vec![],
            checks: vec![],
        }),
    });
    rep.send().await;
    let outcome = execute(&ctx, &cluster, &change, resume, &rep).await;
    let (state, label) = match outcome {
        Ok(s) => s,
        Err(e) => {
            super::error_policy(&ctx, &e);
            (
                RolloutState::Paused {
                    stage: "pre-flight".into(),
                    node: None,
                    reason: format!("ichor could not run the rollout: {e}"),
                },
                "error",
            )
        }
    };
    if let RolloutState::Paused { .. } = &state {
        ctx.metrics.inc(
            "ichor_rollout_pauses_total",
            "Rollouts paused for a human (or by a shutdown).",
            &[("cluster", &cluster.name)],
        );
    }
    ctx.metrics.inc(
        "ichor_rollouts_total",
        "Rollouts ended, by outcome.",
        &[("outcome", label)],
    );
    // Another holder had the lock, or ichor could not run it: the next look tries again
    // (a pre-flight refusal or a pause waits for a commit or `/ichor retry`).
    if matches!(label, "locked" | "error") {
        *lock(&cluster.decided_tip) = None;
    }
    rep.set(state);
    rep.send().await;
}

/// The pre-flight gate, the plan and the engine; the final state to report.
async fn execute(
    ctx: &Arc<Ctx>,
    cluster: &Arc<ClusterRuntime>,
    change: &Change,
    resume: bool,
    rep: &Arc<Reporting>,
) -> Result<(RolloutState, &'static str), Error> {
    let (Some(kube), Some(talos)) = (&cluster.kube, &cluster.talos) else {
        return Err(Error::Other(
            "no Kubernetes or Talos access to this cluster".into(),
        ));
    };
    let doc = change.cluster_doc.clone().ok_or_else(|| {
        Error::Other(format!(
            "cluster {}: no cluster.yaml; the rollout needs its rollout policy",
            change.cluster
        ))
    })?;
    let subject = gate::live::Subject::of(change)
        .with_prometheus_credential(notify::prometheus_credential(ctx, &cluster.name));
    let facts = gate::live::observe(kube, Some(talos), &subject).await;
    let mut verdict = gate::verdict(change);
    verdict.extend(gate::live::items_for_holder(change, &facts, &ctx.identity));
    if verdict.outcome == Outcome::Blocked {
        let why = verdict
            .items
            .iter()
            .find(|i| i.status == Status::Fail)
            .map(|i| i.message.clone())
            .unwrap_or_else(|| "the live gate blocks it".into());
        return Ok((RolloutState::Refused(why), "refused"));
    }
    let opts = PlanOptions {
        ichor_node: std::env::var("ICHOR_NODE_NAME").ok(),
        etcd_leader: gate::live::etcd_leader(&facts),
        ..PlanOptions::default()
    };
    let plan = gate::plan_with(change, &opts, gate::live::live_nodes(&facts).as_deref())?;
    let rs = &change.head_release_set.spec;
    let target = Target {
        commit: rep.commit.clone(),
        talos: rs.talos.clone(),
        kubernetes: rs.kubernetes.clone(),
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Progress>();
    let progress = {
        let rep = rep.clone();
        let ctx = ctx.clone();
        let cluster = cluster.clone();
        // Until the engine's first estimate: the plan's own.
        let windows = doc.spec.rollout.maintenance_windows.clone();
        let mut eta = crate::plan::eta::Eta::new(&plan, ctx.clock.now())
            .with_windows(&windows)
            .estimate(ctx.clock.now())
            .short();
        tokio::spawn(async move {
            let mut step_started = ctx.clock.now();
            let mut stage_title = String::new();
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                while let Ok(p) = rx.try_recv() {
                    batch.push(p);
                }
                for p in batch {
                    match &p {
                        Progress::StageStarted { title, .. } => {
                            stage_title = title.clone();
                            rep.set(RolloutState::Running {
                                stage: title.clone(),
                                eta: Some(eta.clone()),
                            });
                            step_started = ctx.clock.now();
                        }
                        // The engine's estimate (it knows what earlier runs finished).
                        Progress::Eta(e) => {
                            eta = e.short();
                            rep.set(RolloutState::Running {
                                stage: stage_title.clone(),
                                eta: Some(eta.clone()),
                            });
                            // Not a line of its own: the next one is what it follows from.
                            continue;
                        }
                        Progress::HealthChecks(checks) => rep.checks(checks.clone()),
                        Progress::StageFinished { stage, secs } => ctx.metrics.observe(
                            "ichor_rollout_stage_seconds",
                            "Rollout stage durations.",
                            &[("stage", crate::rollout::stage_key(*stage))],
                            *secs as f64,
                        ),
                        Progress::UnitDone { stage, what, node } => {
                            if let (Some(node), Some(kube)) = (node, &cluster.kube) {
                                let reason = match stage {
                                    crate::plan::StageId::Talos => "TalosUpgraded",
                                    crate::plan::StageId::Kubelet => "KubeletUpgraded",
                                    crate::plan::StageId::Workers => "WorkerUpgraded",
                                    _ => "ControlPlaneUpgraded",
                                };
                                if let Err(e) = kube
                                    .node_event(
                                        node,
                                        reason,
                                        what,
                                        false,
                                        ctx.clock.now(),
                                        &ctx.identity,
                                    )
                                    .await
                                {
                                    tracing::warn!(%node, error = %e, "cannot record an Event on the node");
                                }
                            }
                            ctx.metrics.observe(
                                "ichor_rollout_step_seconds",
                                "Rollout step durations (a node or a component), by stage.",
                                &[("stage", crate::rollout::stage_key(*stage))],
                                ctx.clock.now().since(step_started).as_secs_f64(),
                            );
                            step_started = ctx.clock.now();
                        }
                        _ => {}
                    }
                    if let Some(e) =
                        notify::event_of(&p, &cluster.name, &rep.commit, rep.pr, ctx.clock.now())
                    {
                        notify::send(&ctx, e);
                    }
                    rep.line(format!(
                        "{} {}",
                        ctx.clock.now().rfc3339().get(11..16).unwrap_or(""),
                        p
                    ));
                }
                rep.send().await;
            }
        })
    };
    let report = move |p: Progress| {
        let _ = tx.send(p);
    };
    let pause_requested = || -> Option<String> {
        if cluster.stopping.load(Ordering::Relaxed) {
            return Some(SHUTDOWN_REASON.to_string());
        }
        if let Some(why) = lock(&cluster.backwards).clone() {
            return Some(why);
        }
        if let Some(by) = lock(&cluster.paused_by).clone() {
            return Some(format!(
                "paused by `/ichor pause` from {by}; `/ichor resume` continues"
            ));
        }
        cluster
            .git_paused
            .load(Ordering::Relaxed)
            .then(|| format!("{GIT_PAUSE_REASON}; set it to false to continue"))
    };
    // A newer merge never replaces a paused rollout silently: both PRs say so (once the
    // pre-flight gate let this one start, so a refused merge supersedes nothing).
    if let Some((old, paused)) = superseded_rollout(cluster, &rep.commit, resume).await {
        let old_pr = find_pull(ctx, &old).await;
        let of_pr = |pr: Option<u64>| pr.map(|n| format!(" (PR #{n})")).unwrap_or_default();
        let short = |c: &str| crate::releaseset::excerpt(c, 12);
        rep.line(format!(
            "supersedes the rollout of {}{}, {paused}; this one carries on from where that one stopped",
            short(&old),
            of_pr(old_pr)
        ));
        rep.send().await;
        let sticky = match old_pr {
            Some(n) => ctx
                .state
                .lock()
                .await
                .stickies
                .get(&(n, cluster.name.clone()))
                .cloned(),
            None => None,
        };
        Reporting {
            ctx: ctx.clone(),
            cluster: cluster.name.clone(),
            commit: old.clone(),
            pr: old_pr,
            sticky,
            several: rep.several,
            section: Mutex::new(RolloutSection {
                commit: old.clone(),
                state: RolloutState::Superseded(format!(
                    "by the rollout of {}{}, merged while this one was {paused}",
                    short(&rep.commit),
                    of_pr(rep.pr)
                )),
                lines: vec![],
                checks: vec![],
            }),
        }
        .send()
        .await;
    }
    let outcome = {
        let mut engine = Rollout::new(kube, talos, ctx.clock.clone(), &cluster.name, &ctx.identity)
            .for_cluster(&doc);
        engine.report = Some(&report);
        engine.pause_requested = Some(&pause_requested);
        engine.prometheus_credential = notify::prometheus_credential(ctx, &cluster.name);
        engine.run(&plan, &target, Some(change), resume).await
    };
    drop(report);
    let _ = progress.await;
    if let Err(e) = &outcome {
        let why = e.to_string();
        notify::send(
            ctx,
            notify::failed(&cluster.name, &rep.commit, rep.pr, &why, ctx.clock.now()),
        );
    }
    Ok(match outcome.map_err(|e| Error::Other(e.to_string()))? {
        RunOutcome::Completed { stages } => {
            let total: u64 = stages.iter().map(|(_, s)| s).sum();
            (
                RolloutState::Completed {
                    summary: format!(
                        "every node runs Talos {} and Kubernetes {} ({})",
                        target.talos,
                        target.kubernetes,
                        crate::releaseset::HumanDuration::from_secs(total)
                    ),
                },
                "completed",
            )
        }
        RunOutcome::Paused(p) => (
            RolloutState::Paused {
                stage: p.stage,
                node: p.node,
                reason: p.reason,
            },
            "paused",
        ),
        RunOutcome::Refused(why) => (RolloutState::Queued(why), "locked"),
    })
}

/// The paused rollout of another commit that a new (not resumed) rollout of `commit` takes
/// over: that commit, and where and why it paused.
async fn superseded_rollout(
    cluster: &ClusterRuntime,
    commit: &str,
    resume: bool,
) -> Option<(String, String)> {
    if resume {
        return None;
    }
    let kube = cluster.kube.as_ref()?;
    let stored = record::load(kube, &cluster.name).await.ok()??;
    let r = &stored.record;
    if r.state != RecordState::Paused || r.target.commit == commit {
        return None;
    }
    let paused = match &r.pause {
        Some(p) => format!(
            "paused in {}{}: {}",
            p.stage,
            p.node
                .as_deref()
                .map(|n| format!(" at {n}"))
                .unwrap_or_default(),
            crate::releaseset::excerpt(&p.reason, 300)
        ),
        None => "paused".to_string(),
    };
    Some((r.target.commit.clone(), paused))
}

/// Whether `cluster`'s last rollout is paused for a human, and at which commit.
pub async fn paused_target(cluster: &ClusterRuntime) -> Option<String> {
    let kube = cluster.kube.as_ref()?;
    let stored = record::load(kube, &cluster.name).await.ok()??;
    (stored.record.state == RecordState::Paused).then(|| stored.record.target.commit.clone())
}
