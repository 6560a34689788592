//! The gate half of the loop: judge a PR head (or, in Git-only mode, a branch) for every
//! configured cluster it touches, with the live items when the cluster is reachable, and
//! report the verdict, the checklist and the staged plan.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::forge::comment::{self, Sticky};
use crate::forge::github::{Pull, StatusState};
use crate::gate;
use crate::plan::PlanOptions;
use crate::policy::{CheckItem, Outcome, Status};

use super::{Ctx, Error, GateReport, MAX_OPEN_PULLS};

/// One head to judge.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The PR number as a string, or the branch name in Git-only mode.
    pub key: String,
    pub pr: Option<u64>,
    pub branch: String,
    pub head: String,
    /// The branch it would merge into (its tip is the base).
    pub base_ref: String,
    pub from_fork: bool,
}

impl Candidate {
    pub fn of_pull(p: &Pull) -> Candidate {
        Candidate {
            key: p.number.to_string(),
            pr: Some(p.number),
            branch: p.head_ref.clone(),
            head: p.head_sha.clone(),
            base_ref: p.base_ref.clone(),
            from_fork: p.from_fork,
        }
    }
}

/// Git-only mode reads at most this many branches per reconcile.
const MAX_BRANCHES_READ: usize = 5_000;

/// Gate every open PR (Git-only: every branch but the protected one) whose head is new.
pub async fn gate_open(ctx: &Arc<Ctx>) -> Result<(), Error> {
    let candidates = match &ctx.github {
        Some(gh) => {
            let pulls = gh.open_pulls().await?;
            let mut st = ctx.state.lock().await;
            for p in &pulls {
                st.latest_head.insert(p.number, p.head_sha.clone());
            }
            drop(st);
            pulls.iter().map(Candidate::of_pull).collect::<Vec<_>>()
        }
        None => branches(ctx)?,
    };
    // Every flag is taken (no short cut): each is answered by this one clearing.
    let regained = ctx
        .clusters
        .iter()
        .filter(|c| c.regained.swap(false, Ordering::Relaxed))
        .count()
        > 0;
    let candidates = {
        let mut st = ctx.state.lock().await;
        if regained {
            // Heads seen without the lease were skipped for that cluster: judge them all.
            st.judged.clear();
        }
        fair_order(candidates, &st.judged, MAX_OPEN_PULLS)
    };
    let mut limited = None;
    for c in candidates {
        if let Err(e) = gate(ctx, &c, false).await {
            // One broken PR does not stop the others.
            super::error_policy(ctx, &e);
            if e.rate_limited_for().is_some() {
                limited = Some(e);
            }
        }
    }
    // A rate limit brings the reconcile back once it is over.
    limited.map_or(Ok(()), Err)
}

/// At most `max` candidates, those whose head was never judged first (in the order given),
/// then the rest: past the bound, a new head is never starved by the same old ones.
pub fn fair_order(
    candidates: Vec<Candidate>,
    judged: &std::collections::HashMap<String, (String, String)>,
    max: usize,
) -> Vec<Candidate> {
    let (fresh, seen): (Vec<Candidate>, Vec<Candidate>) = candidates
        .into_iter()
        .partition(|c| judged.get(&c.key).is_none_or(|(h, _)| *h != c.head));
    fresh.into_iter().chain(seen).take(max).collect()
}

/// Git-only mode: each branch but the protected one is a change to judge.
fn branches(ctx: &Ctx) -> Result<Vec<Candidate>, Error> {
    let repo = ctx.repo()?;
    let protected = &ctx.cfg.repository.branch;
    let mut out = Vec::new();
    for r in repo.git2().references_glob("refs/heads/*")? {
        let r = r?;
        let (Ok(name), Some(oid)) = (r.shorthand().map(str::to_string), r.target()) else {
            continue;
        };
        if &name == protected {
            continue;
        }
        out.push(Candidate {
            key: name.clone(),
            pr: None,
            branch: name,
            head: oid.to_string(),
            base_ref: protected.clone(),
            from_fork: false,
        });
        // Bounded while reading; [`fair_order`] then picks the ones to judge.
        if out.len() >= MAX_BRANCHES_READ {
            break;
        }
    }
    Ok(out)
}

/// Gate PR `number` at its current head (read from the API: a webhook's head may be old).
pub async fn gate_pull_number(ctx: &Arc<Ctx>, number: u64, force: bool) -> Result<Judged, Error> {
    let Some(gh) = &ctx.github else {
        return Ok(Judged::NoForge);
    };
    let pull = gh.pull(number).await?;
    if !pull.open {
        return Ok(Judged::Closed);
    }
    ctx.state
        .lock()
        .await
        .latest_head
        .insert(number, pull.head_sha.clone());
    gate(ctx, &Candidate::of_pull(&pull), force).await
}

/// What a gate run did with one head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// Verdicts posted for these clusters; `untouched` got "nothing to judge".
    Posted {
        clusters: Vec<String>,
        untouched: Vec<String>,
    },
    /// This head and base were judged already (not forced).
    Unchanged,
    /// A newer head came meanwhile: nothing was posted for this one.
    Stale,
    /// The PR is closed (or merged): nothing is judged.
    Closed,
    /// Nothing to talk to (Git-only mode).
    NoForge,
}

/// Judge one head for every configured cluster it touches and report each.
pub async fn gate(ctx: &Arc<Ctx>, c: &Candidate, force: bool) -> Result<Judged, Error> {
    let repo = ctx.repo()?;
    let head_oid = git2::Oid::from_str(&c.head)?;
    let base_tip = repo
        .resolve(&format!("refs/heads/{}", c.base_ref))
        .ok()
        .and_then(|r| r.commit)
        .ok_or_else(|| Error::Other(format!("{}: unknown base branch", c.key)))?;
    {
        let st = ctx.state.lock().await;
        if !force && st.judged.get(&c.key) == Some(&(c.head.clone(), base_tip.to_string())) {
            return Ok(Judged::Unchanged);
        }
    }
    if let Some(pr) = c.pr {
        match ctx.fetch_pull(pr, &c.head).await {
            Ok(()) => {}
            // Red, saying why, for every cluster: a head ichor will not fetch is no pass.
            Err(e @ crate::git::GitError::FetchTooLarge { .. }) => {
                let several = super::several_clusters(&repo, &format!("refs/heads/{}", c.base_ref));
                let why =
                    format!("too large to judge ({e}); raise limits.prFetchBytes to judge it");
                let mut reports = Vec::new();
                for cluster in &ctx.clusters {
                    if ctx.holds(cluster).await {
                        reports.push(invalid(c, &cluster.name, &why, several));
                    }
                }
                for r in &reports {
                    ctx.reporters.gate(r).await?;
                }
                ctx.state
                    .lock()
                    .await
                    .judged
                    .insert(c.key.clone(), (c.head.clone(), base_tip.to_string()));
                return Ok(Judged::Posted {
                    clusters: reports.iter().map(|r| r.cluster.clone()).collect(),
                    untouched: vec![],
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Reopened: the PR's fetch may have added a pack this handle has not seen.
    let repo = ctx.repo()?;
    if repo.git2().find_commit(head_oid).is_err() {
        return Err(Error::Other(format!(
            "head {} of {} is not in the mirror yet",
            crate::escape::clip(&c.head, 12),
            c.key
        )));
    }
    // Judge what the merge would change: the head against where it left the base.
    let base = repo
        .git2()
        .merge_base(base_tip, head_oid)
        .unwrap_or(base_tip)
        .to_string();
    let started = ctx.clock.now();
    // Only this instance's clusters are read (another's folders are never parsed), and
    // off the event loop: parsing and judging is CPU and git work, and the loop must stay
    // free for other PRs and a maintainer's `/ichor pause`.
    let review = {
        let mirror = ctx.mirror_dir.clone();
        let among: Vec<String> = ctx.clusters.iter().map(|c| c.name.clone()).collect();
        let (base, head) = (base.clone(), c.head.clone());
        tokio::task::spawn_blocking(move || -> Result<gate::Review, gate::GateError> {
            let repo = crate::git::Repo::open(&mirror)?;
            gate::review_among(&repo, &base, &head, None, Some(&among))
        })
        .await
        .map_err(|e| Error::Other(format!("the gate's task failed: {e}")))?
    };
    let several = super::several_clusters(&repo, &base);
    let mut reports = Vec::new();
    let mut untouched = Vec::new();
    match review {
        Ok(review) => {
            let touched: Vec<String> = review
                .sections
                .iter()
                .filter_map(|s| s.cluster.clone())
                .collect();
            // An edit of `policies/` applies to every cluster once merged: its verdict
            // (a failure when they do not load) is every untouched cluster's.
            let policy_verdict = review
                .sections
                .iter()
                .find(|s| s.cluster.is_none())
                .and_then(|s| s.result.as_ref().ok())
                .map(|j| j.verdict.clone());
            for cluster in &ctx.clusters {
                if touched.contains(&cluster.name) || !ctx.holds(cluster).await {
                    continue;
                }
                match &policy_verdict {
                    Some(verdict) => {
                        let section = gate::Section {
                            cluster: Some(cluster.name.clone()),
                            result: Ok(gate::Judged {
                                verdict: verdict.clone(),
                                change: None,
                            }),
                        };
                        reports.push(judge(ctx, c, cluster, section, several).await);
                    }
                    // A required `ichor/gate` must not hold back a change that touches
                    // none of this ichor's clusters (docs, renovate.json, another
                    // instance's cluster).
                    None => untouched.push(cluster.name.clone()),
                }
            }
            for section in review.sections {
                let Some(name) = section.cluster.clone() else {
                    continue;
                };
                let Some(cluster) = ctx.cluster(&name).cloned() else {
                    // Another instance's cluster.
                    continue;
                };
                if !ctx.holds(&cluster).await {
                    continue;
                }
                reports.push(judge(ctx, c, &cluster, section, several).await);
            }
        }
        Err(e) => {
            // The change cannot be read at all (a broken document at the base, a git
            // error): every configured cluster says so.
            for cluster in &ctx.clusters {
                if !ctx.holds(cluster).await {
                    continue;
                }
                reports.push(invalid(c, &cluster.name, &e.to_string(), several));
            }
        }
    }
    // Stale work is dropped: the API reported a newer head while this one was judged.
    if let Some(pr) = c.pr {
        let st = ctx.state.lock().await;
        if st.latest_head.get(&pr).is_some_and(|h| h != &c.head) {
            ctx.metrics.inc(
                "ichor_stale_events_total",
                "PR heads superseded by a newer head before they were judged.",
                &[],
            );
            return Ok(Judged::Stale);
        }
    }
    // A merge group (no PR) needs its required status as much as a PR's head does.
    for name in &untouched {
        ctx.reporters.untouched(&c.head, name, several).await?;
    }
    for r in &reports {
        ctx.reporters.gate(r).await?;
        tracing::info!(
            cluster = %r.cluster,
            pr = ?r.pr,
            branch = %crate::escape::clip(&r.branch, 100),
            head = %crate::escape::clip(&r.head, 12),
            description = %r.description,
            "gate verdict posted"
        );
        let outcome = match r.state {
            StatusState::Success => "pass",
            StatusState::Pending => "waiting",
            StatusState::Failure => "blocked",
            StatusState::Error => "invalid",
        };
        ctx.metrics.inc(
            "ichor_gates_total",
            "Gate verdicts posted, by outcome.",
            &[("outcome", outcome)],
        );
        ctx.metrics.observe(
            "ichor_gate_seconds",
            "Time from taking a head to posting its verdict.",
            &[],
            ctx.clock.now().since(started).as_secs_f64(),
        );
        if let Some(pr) = r.pr {
            ctx.state
                .lock()
                .await
                .stickies
                .insert((pr, r.cluster.clone()), r.sticky.clone());
            // A change with a plan may be rehearsed, after (never before) its verdict.
            if matches!(r.state, StatusState::Success | StatusState::Pending) {
                super::rehearsing::spawn(ctx, pr, &r.cluster, &base, &r.head);
            }
        }
    }
    let mut st = ctx.state.lock().await;
    st.judged
        .insert(c.key.clone(), (c.head.clone(), base_tip.to_string()));
    Ok(Judged::Posted {
        clusters: reports.iter().map(|r| r.cluster.clone()).collect(),
        untouched,
    })
}

fn invalid(c: &Candidate, cluster: &str, error: &str, several: bool) -> GateReport {
    let md = crate::escape::md_text;
    GateReport {
        cluster: cluster.to_string(),
        pr: c.pr,
        branch: c.branch.clone(),
        head: c.head.clone(),
        // `error` is red to GitHub and Renovate alike, and tells an unreadable change
        // from a blocked one.
        state: StatusState::Error,
        description: comment::description(&format!("invalid: {error}")),
        sticky: Sticky {
            cluster: cluster.to_string(),
            head: c.head.clone(),
            checklist: format!(
                "### ichor gate — {}: the change cannot be judged\n\n> [!CAUTION]\n> {}\n",
                crate::escape::md_code(cluster),
                md(error)
            ),
            plan: "No plan: the documents do not parse.".into(),
            notes: vec![],
            rollout: None,
        },
        several,
        annotations: vec![],
    }
}

/// The verdict of one cluster section, with the live items when the cluster is reachable.
async fn judge(
    ctx: &Ctx,
    c: &Candidate,
    cluster: &super::ClusterRuntime,
    section: gate::Section,
    several: bool,
) -> GateReport {
    let judged = match section.result {
        Ok(j) => j,
        Err(e) => return invalid(c, &cluster.name, &e.to_string(), several),
    };
    let mut verdict = judged.verdict;
    let mut notes = Vec::new();
    if c.from_fork {
        notes.push(
            "This PR comes from a fork: it is judged, but nothing from a fork ever acts on a cluster."
                .to_string(),
        );
    }
    if c.base_ref != ctx.cfg.repository.branch {
        notes.push(format!(
            "This PR targets {}, not the protected branch {}: merging it rolls nothing out.",
            c.base_ref, ctx.cfg.repository.branch
        ));
    }
    let mut live_nodes = None;
    if let Some(change) = judged.change.as_ref().filter(|c| c.new_cluster) {
        // Its cluster.yaml is the PR's own: its checks' URLs and expressions must not run
        // with the controller's access. Only what the base revision holds is read live.
        notes.push(format!(
            "clusters/{}/ is new in this PR: it is judged from its files only; live checks and health checks start once it is on {}.",
            change.cluster, c.base_ref
        ));
    } else if let Some(change) = &judged.change {
        match &cluster.kube {
            Some(kube) => {
                let subject = gate::live::Subject::of(change).with_prometheus_credential(
                    super::config::notify::prometheus_credential(ctx, &cluster.name),
                );
                let facts = gate::live::observe(kube, cluster.talos.as_deref(), &subject).await;
                let items: Vec<CheckItem> = gate::live::items(change, &facts)
                    .into_iter()
                    // A rollout in progress is no reason to hold back a PR's verdict.
                    .filter(|i| i.id != "live/rollout-lock")
                    .collect();
                // A live item answers the same question as its static twin (from the
                // inventory) better: it replaces it.
                verdict
                    .items
                    .retain(|i| !items.iter().any(|l| l.title == i.title));
                verdict.extend(items);
                live_nodes = gate::live::live_nodes(&facts);
            }
            None => {
                verdict.push(
                    CheckItem::new(
                        "live/cluster",
                        "the cluster is reachable",
                        Status::Warn,
                        format!(
                            "not checked live: {}",
                            cluster
                                .access_error
                                .as_deref()
                                .unwrap_or("no cluster access configured")
                        ),
                    )
                    .source("live"),
                );
            }
        }
    }
    let opts = PlanOptions {
        ichor_node: std::env::var("ICHOR_NODE_NAME").ok(),
        ..PlanOptions::default()
    };
    let plan = match &judged.change {
        Some(change) => match gate::plan_with(change, &opts, live_nodes.as_deref()) {
            Ok(p) => p.render_markdown(),
            Err(e) => format!("No plan: {}", crate::escape::md_text(&e.to_string())),
        },
        None => "No plan: nothing to roll out for this cluster.".into(),
    };
    // The lines a check run's annotations point at, read at the head judged.
    let annotations = {
        let read = |file: &str| -> Option<String> {
            let repo = ctx.repo().ok()?;
            let rev = repo.resolve(&c.head).ok()?;
            repo.read_file(&rev, &format!("clusters/{}/{file}", cluster.name))
                .ok()
                .flatten()
        };
        let wanted = ctx.github.as_ref().is_some_and(|g| g.is_app());
        if wanted {
            super::report::gate_annotations(
                &cluster.name,
                read("release-set.yaml").as_deref(),
                read("cluster.yaml").as_deref(),
                &verdict.items,
            )
        } else {
            vec![]
        }
    };
    let state = match verdict.outcome {
        Outcome::Pass => StatusState::Success,
        Outcome::Waiting => StatusState::Pending,
        Outcome::Blocked => StatusState::Failure,
    };
    GateReport {
        cluster: cluster.name.clone(),
        pr: c.pr,
        branch: c.branch.clone(),
        head: c.head.clone(),
        state,
        description: comment::gate_description(&verdict),
        sticky: Sticky {
            cluster: cluster.name.clone(),
            head: c.head.clone(),
            checklist: verdict.render_markdown(),
            plan,
            notes,
            rollout: None,
        },
        several,
        annotations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(key: &str, head: &str) -> Candidate {
        Candidate {
            key: key.into(),
            pr: key.parse().ok(),
            branch: format!("b-{key}"),
            head: head.into(),
            base_ref: "main".into(),
            from_fork: false,
        }
    }

    #[test]
    fn new_heads_come_first_so_none_is_starved_past_the_bound() {
        let mut judged = std::collections::HashMap::new();
        for i in 0..3 {
            judged.insert(i.to_string(), (format!("h{i}"), "base".to_string()));
        }
        // 0..3 judged at their heads, 3 new, 1 moved to a new head.
        let cands = vec![
            cand("0", "h0"),
            cand("1", "h1-new"),
            cand("2", "h2"),
            cand("3", "h3"),
        ];
        let keys: Vec<String> = fair_order(cands.clone(), &judged, 2)
            .into_iter()
            .map(|c| c.key)
            .collect();
        assert_eq!(keys, ["1", "3"]);
        let all: Vec<String> = fair_order(cands, &judged, 10)
            .into_iter()
            .map(|c| c.key)
            .collect();
        assert_eq!(all, ["1", "3", "0", "2"]);
    }
}
