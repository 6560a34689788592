//! The gate: read both revisions of a cluster from Git, diff them into a bump, and judge it
//! against the compatibility data. This module holds the static judgement (documents,
//! policies, the optional inventory: what Git alone can tell); [`live`] adds the facts read
//! from the cluster (nodes, etcd, what each node runs, the lock, the CNI, removed APIs, the
//! `before` health checks) to the same verdict when ichor can reach it.
//!
//! Trust: whatever decides a verdict — the repository's `policies/` and the inventory,
//! rollout policy and volumes in `cluster.yaml` — is read from the *base* revision. A pull
//! request's content is data to evaluate, so a change cannot relax the rules it is judged
//! by; its edits to them take effect once merged, and the verdict shows each as its own item.

pub mod live;

use crate::git::{GitError, Repo, Rev};
use crate::plan::{self, Plan, PlanError, PlanOptions};
use crate::policy::{self, CheckItem, Outcome, Policies, Status, Verdict};
use crate::releaseset::{Bump, Cluster, ClusterSpec, DocumentError, Node, ReleaseSet};

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("{error}\n  (in {side} revision {rev})")]
    Document {
        error: DocumentError,
        side: &'static str,
        rev: String,
    },
    #[error("no cluster at {side} revision {rev}: expected clusters/<name>/release-set.yaml")]
    NoCluster { side: &'static str, rev: String },
    #[error("{rev} has {} clusters ({}); choose one with --cluster", names.len(), names.join(", "))]
    AmbiguousCluster { rev: String, names: Vec<String> },
    #[error("cluster `{name}` not found at {side} revision {rev}: expected clusters/{name}/release-set.yaml{}", available_list(available))]
    UnknownCluster {
        name: String,
        side: &'static str,
        rev: String,
        available: Vec<String>,
    },
    #[error("clusters/{cluster}/cluster.yaml at {rev} {}; `plan` needs the node list: pass --kubeconfig (and --talosconfig) to read it from the cluster, or list the nodes in spec.inventory", if *missing { "does not exist" } else { "has no spec.inventory" })]
    NoInventory {
        cluster: String,
        rev: String,
        missing: bool,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("the change touches {count} cluster folders; ichor judges at most {max} in one change: split it, or judge one with --cluster")]
    TooManyClusters { count: usize, max: usize },
}

/// The most cluster folders one change may touch: each is parsed and judged, so a PR adding
/// a thousand would cost every gate minutes and gigabytes. Past it, a clear refusal.
pub const MAX_CLUSTERS_PER_CHANGE: usize = 50;

fn available_list(names: &[String]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!(" (found: {})", names.join(", "))
    }
}

/// Both sides of one cluster's change, parsed.
#[derive(Debug, Clone)]
pub struct Change {
    pub cluster: String,
    pub base: Rev,
    pub head: Rev,
    pub base_release_set: ReleaseSet,
    pub head_release_set: ReleaseSet,
    /// `cluster.yaml` as the gate judges with it: the base revision's, since a pull request
    /// cannot rewrite its own judge (inventory, rollout policy and volumes decide safety).
    /// Only a cluster the change adds is judged with the head's.
    pub cluster_doc: Option<Cluster>,
    /// Where `cluster_doc` comes from ("base" or "head").
    pub cluster_doc_side: &'static str,
    /// Fields of `cluster.yaml` the head changes (`spec.inventory`, …); they apply once merged.
    pub cluster_edits: Vec<&'static str>,
    /// The cluster does not exist at the base revision: it is judged on its own.
    pub new_cluster: bool,
    /// Why `cluster.yaml` does not load at the base revision, when the head's does: the
    /// change (most often the fix) is then judged with the head's, and says so.
    pub base_cluster_error: Option<String>,
    pub policies: Policies,
    /// Whether the change edits `policies/` (which then applies only after merge).
    pub edits_policies: bool,
    /// Why the head's `policies/` would not load, when the change breaks them.
    pub head_policies_error: Option<String>,
    /// Why the base's `policies/` do not load, when `policies` is the shipped data instead.
    pub base_policies_error: Option<String>,
    pub bump: Bump,
}

impl Change {
    /// Nodes from the static inventory, versions defaulting to the base release set.
    pub fn nodes(&self) -> Option<Vec<Node>> {
        let inv = self.cluster_doc.as_ref()?.spec.inventory.as_ref()?;
        Some(inv.resolve(&self.base_release_set))
    }
}

fn doc_err(side: &'static str, rev: &Rev) -> impl Fn(DocumentError) -> GateError {
    let rev = rev.to_string();
    move |error| GateError::Document {
        error,
        side,
        rev: rev.clone(),
    }
}

/// The policies a change is judged with (the base's), and what the change does to them.
struct PolicyState {
    policies: Policies,
    edits: bool,
    head_error: Option<String>,
    head: Option<Policies>,
    /// The base's `policies/` do not load (why): `policies` is the shipped data.
    base_error: Option<String>,
}

fn policy_state(repo: &Repo, base: &Rev, head: &Rev) -> Result<PolicyState, GateError> {
    let base_files = repo.policy_files(base).map_err(|e| e.to_string());
    let base_loaded = base_files
        .clone()
        .and_then(|files| Policies::load(&files).map_err(|e| doc_err("base", base)(e).to_string()));
    let (policies, base_error) = match base_loaded {
        Ok(p) => (p, None),
        // Broken policies on the protected branch must not make every PR `error`, the one
        // that fixes them included: judge with the shipped data, and say so.
        Err(why) => (
            Policies::shipped().map_err(doc_err("shipped", base))?,
            Some(why),
        ),
    };
    // A head that cannot even be listed (too many files, a link) is a broken policy edit.
    let head_files = match repo.policy_files(head) {
        Ok(files) => Ok(files),
        Err(e) => Err(e.to_string()),
    };
    let edits = match (&base_files, &head_files) {
        (Ok(b), Ok(h)) => b != h,
        _ => true,
    };
    let (head_policies, head_error) = match head_files {
        Ok(files) if edits => match Policies::load(&files) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e.to_string())),
        },
        Ok(_) => (None, None),
        Err(e) => (None, Some(e)),
    };
    Ok(PolicyState {
        policies,
        edits,
        head_error,
        head: head_policies,
        base_error,
    })
}

/// Read `cluster` (or the only cluster) at `base` and `head`.
pub fn load(
    repo: &Repo,
    base: &str,
    head: &str,
    cluster: Option<&str>,
) -> Result<Change, GateError> {
    let base = repo.resolve(base)?;
    let head = repo.resolve(head)?;
    let name = match cluster {
        Some(n) => n.to_string(),
        None => {
            let names = repo.clusters(&head)?;
            match names.len() {
                0 => {
                    return Err(GateError::NoCluster {
                        side: "head",
                        rev: head.to_string(),
                    })
                }
                1 => names[0].clone(),
                _ => {
                    return Err(GateError::AmbiguousCluster {
                        rev: head.to_string(),
                        names,
                    })
                }
            }
        }
    };
    let state = policy_state(repo, &base, &head)?;
    load_cluster(repo, &base, &head, &name, &state)
}

/// The paths of a cluster's two documents.
fn paths(name: &str) -> (String, String) {
    (
        format!("clusters/{name}/release-set.yaml"),
        format!("clusters/{name}/cluster.yaml"),
    )
}

fn load_cluster(
    repo: &Repo,
    base: &Rev,
    head: &Rev,
    name: &str,
    state: &PolicyState,
) -> Result<Change, GateError> {
    let (rs_path, cluster_path) = paths(name);
    let unknown = |side: &'static str, rev: &Rev| GateError::UnknownCluster {
        name: name.to_string(),
        side,
        rev: rev.to_string(),
        available: repo.clusters(rev).unwrap_or_default(),
    };
    let read_rs = |side: &'static str, rev: &Rev| -> Result<Option<ReleaseSet>, GateError> {
        let Some(text) = repo.read_file(rev, &rs_path)? else {
            return Ok(None);
        };
        let rs = ReleaseSet::parse(&rs_path, &text).map_err(doc_err(side, rev))?;
        same_name(&rs_path, &text, rs.name(), name).map_err(doc_err(side, rev))?;
        Ok(Some(rs))
    };
    let read_cluster = |side: &'static str, rev: &Rev| -> Result<Option<Cluster>, GateError> {
        let Some(text) = repo.read_file(rev, &cluster_path)? else {
            return Ok(None);
        };
        let c = Cluster::parse(&cluster_path, &text).map_err(doc_err(side, rev))?;
        same_name(&cluster_path, &text, c.name(), name).map_err(doc_err(side, rev))?;
        Ok(Some(c))
    };
    let head_release_set = read_rs("head", head)?.ok_or_else(|| unknown("head", head))?;
    let base_release_set = read_rs("base", base)?;
    let new_cluster = base_release_set.is_none();
    let base_release_set = base_release_set.unwrap_or_else(|| head_release_set.clone());
    let head_cluster = read_cluster("head", head)?;
    // A cluster.yaml broken on the base would make every change invalid, the one that fixes
    // it too: with a valid head, the head's is used and the verdict says so.
    let mut base_cluster_error = None;
    let base_cluster = if new_cluster {
        None
    } else {
        match read_cluster("base", base) {
            Ok(c) => c,
            Err(e @ GateError::Document { .. }) if head_cluster.is_some() => {
                base_cluster_error = Some(e.to_string());
                None
            }
            Err(e) => return Err(e),
        }
    };
    let cluster_edits = match (&base_cluster, &head_cluster) {
        (Some(b), Some(h)) => spec_edits(&b.spec, &h.spec),
        (None, Some(_)) if base_cluster_error.is_some() => vec![],
        (None, Some(_)) if !new_cluster => vec!["cluster.yaml (added)"],
        (Some(_), None) => vec!["cluster.yaml (removed)"],
        _ => vec![],
    };
    let (cluster_doc, cluster_doc_side) = if new_cluster || base_cluster_error.is_some() {
        (head_cluster, "head")
    } else {
        (base_cluster, "base")
    };
    let bump = Bump::between(&base_release_set, &head_release_set);
    Ok(Change {
        cluster: name.to_string(),
        base: base.clone(),
        head: head.clone(),
        base_release_set,
        head_release_set,
        cluster_doc,
        cluster_doc_side,
        cluster_edits,
        new_cluster,
        base_cluster_error,
        policies: state.policies.clone(),
        edits_policies: state.edits,
        head_policies_error: state.head_error.clone(),
        base_policies_error: state.base_error.clone(),
        bump,
    })
}

/// `metadata.name` must be the folder's name: Renovate, the lock and the reports key on it.
fn same_name(path: &str, text: &str, doc: &str, folder: &str) -> Result<(), DocumentError> {
    if doc == folder {
        return Ok(());
    }
    Err(DocumentError::at(
        path,
        crate::releaseset::locate(text, "name:", 0),
        format!("metadata.name is `{doc}`, but the folder is clusters/{folder}/; they must match"),
    ))
}

/// Which parts of a cluster's spec the head changes. Every part decides how (and whether)
/// a rollout is safe, so each edit is shown and applies only once merged.
fn spec_edits(base: &ClusterSpec, head: &ClusterSpec) -> Vec<&'static str> {
    let mut out = Vec::new();
    if base.inventory != head.inventory {
        out.push("spec.inventory");
    }
    if base.rollout != head.rollout {
        out.push("spec.rollout");
    }
    if base.volumes != head.volumes {
        out.push("spec.volumes");
    }
    if base.cni != head.cni {
        out.push("spec.cni");
    }
    if base.talos != head.talos {
        out.push("spec.talos");
    }
    out
}

/// One section of a review: a cluster the change touches, or the policy change itself.
#[derive(Debug)]
pub struct Section {
    /// The cluster's name; `None` for a change that edits only `policies/`.
    pub cluster: Option<String>,
    pub result: Result<Judged, GateError>,
}

#[derive(Debug)]
pub struct Judged {
    pub verdict: Verdict,
    /// The change, when there is one to plan (not for a removed cluster or a policy edit).
    pub change: Option<Change>,
}

/// Everything a change between two revisions touches, each judged on its own.
#[derive(Debug)]
pub struct Review {
    pub base: Rev,
    pub head: Rev,
    pub sections: Vec<Section>,
}

impl Review {
    /// The worst outcome over the sections; invalid input (exit 2) is reported apart.
    pub fn outcome(&self) -> Outcome {
        let outcomes = self
            .sections
            .iter()
            .filter_map(|s| s.result.as_ref().ok())
            .map(|j| j.verdict.outcome);
        outcomes.fold(Outcome::Pass, Outcome::worst)
    }

    pub fn has_errors(&self) -> bool {
        self.sections.iter().any(|s| s.result.is_err())
    }
}

/// Judge every cluster the change between `base` and `head` touches (or just `cluster`).
/// A cluster the change adds is judged on its own; one it removes is reported; a change
/// that edits only `policies/` says what the new policies will do once merged.
pub fn review(
    repo: &Repo,
    base: &str,
    head: &str,
    cluster: Option<&str>,
) -> Result<Review, GateError> {
    review_among(repo, base, head, cluster, None)
}

/// [`review`] of only the clusters named in `among` (`None`: every one): the clusters a
/// controller is configured for, so a PR's other folders are never parsed.
pub fn review_among(
    repo: &Repo,
    base: &str,
    head: &str,
    cluster: Option<&str>,
    among: Option<&[String]>,
) -> Result<Review, GateError> {
    let head = repo.resolve(head)?;
    let base = repo.resolve(base)?;
    let state = policy_state(repo, &base, &head)?;
    let head_names = repo.clusters(&head)?;
    let names: Vec<String> = match cluster {
        Some(n) => vec![n.to_string()],
        None => {
            let mut all = repo.clusters(&base)?;
            all.extend(head_names.iter().cloned());
            all.sort();
            all.dedup();
            if let Some(among) = among {
                all.retain(|n| among.contains(n));
            }
            let mut touched = Vec::new();
            for n in all {
                let (rs, cl) = paths(&n);
                // A file that cannot be read counts as touched: judging it says why.
                let differs = |p: &str| match (repo.read_file(&base, p), repo.read_file(&head, p)) {
                    (Ok(a), Ok(b)) => a != b,
                    _ => true,
                };
                if differs(&rs) || differs(&cl) {
                    touched.push(n);
                }
            }
            if touched.len() > MAX_CLUSTERS_PER_CHANGE {
                return Err(GateError::TooManyClusters {
                    count: touched.len(),
                    max: MAX_CLUSTERS_PER_CHANGE,
                });
            }
            touched
        }
    };
    let mut sections = Vec::new();
    for name in names {
        let (rs_path, _) = paths(&name);
        let gone_at_head =
            !head_names.contains(&name) && matches!(repo.read_file(&head, &rs_path), Ok(None));
        let result = if gone_at_head && cluster.is_none() {
            Ok(Judged {
                verdict: removed_verdict(&name),
                change: None,
            })
        } else {
            load_cluster(repo, &base, &head, &name, &state).map(|change| Judged {
                verdict: verdict(&change),
                change: Some(change),
            })
        };
        sections.push(Section {
            cluster: Some(name),
            result,
        });
    }
    // The policy change is a section of its own when it is the whole change, and when its
    // policies do not load: once merged they apply to every cluster, touched or not.
    if (sections.is_empty() || state.head_error.is_some()) && state.edits && cluster.is_none() {
        sections.push(Section {
            cluster: None,
            result: Ok(Judged {
                verdict: policy_only_verdict(repo, &head, &head_names, &state),
                change: None,
            }),
        });
    }
    Ok(Review {
        base,
        head,
        sections,
    })
}

fn removed_verdict(name: &str) -> Verdict {
    Verdict::new(
        name,
        "cluster removed",
        vec![CheckItem::new(
            "cluster-removed",
            "The change removes the cluster",
            Status::Warn,
            format!("clusters/{name}/ is removed: once merged, ichor no longer gates or rolls out this cluster; nothing on the cluster changes"),
        )
        .hint("make sure removing the cluster from Git is intended")],
    )
}

/// A change that edits only `policies/` *is* the policy change: it passes when the new
/// policies load, and shows what they will say about each cluster once merged.
fn policy_only_verdict(
    repo: &Repo,
    head: &Rev,
    clusters: &[String],
    state: &PolicyState,
) -> Verdict {
    let title = "The new policies load and apply once merged";
    let mut items = Vec::new();
    match (&state.head_error, &state.head) {
        (Some(why), _) => {
            items.push(
                CheckItem::new(
                    "policies",
                    title,
                    Status::Fail,
                    format!("the edited policies/ do not load: {why}"),
                )
                .hint("fix the file named above: once merged, every gate run would fail on it"),
            );
        }
        (None, Some(new)) => {
            items.push(CheckItem::new(
                "policies",
                title,
                Status::Pass,
                format!("this change edits policies/ only; once merged, ichor judges every later change with them ({} compatibility rows, {} blockers)", new.compatibility.len(), new.blockers.len()),
            ));
            // What the new rules say about each cluster as it stands: not a reason to block
            // the policy change, but worth knowing before merging it.
            for name in clusters {
                let (rs_path, _) = paths(name);
                let Ok(Some(text)) = repo.read_file(head, &rs_path) else {
                    continue;
                };
                let Ok(rs) = ReleaseSet::parse(&rs_path, &text) else {
                    continue;
                };
                let bump = Bump::between(&rs, &rs);
                for item in policy::evaluate(&bump, new, None) {
                    if item.status == Status::Pass {
                        continue;
                    }
                    let mut after = item.clone();
                    after.id = format!("after-merge/{name}/{}", item.id);
                    after.status = Status::Warn;
                    after.message = format!("once merged, cluster {name}: {}", item.message);
                    items.push(after);
                }
            }
        }
        (None, None) => {}
    }
    if let Some(why) = &state.base_error {
        items.push(base_policies_item(why));
    }
    Verdict::new("policies", "policies/ edited", items)
}

/// Said wherever the base's `policies/` do not load and the shipped data stood in.
fn base_policies_item(why: &str) -> CheckItem {
    CheckItem::new(
        "base-policies",
        "The protected branch's policies load",
        Status::Warn,
        format!("the base revision's policies/ do not load, so this change is judged with the shipped data only: {why}"),
    )
    .hint("merge a change that fixes policies/ first")
}

/// The static verdict for a change.
pub fn verdict(change: &Change) -> Verdict {
    let nodes = change.nodes();
    let cluster_doc = match (&change.cluster_doc, change.cluster_doc_side) {
        (Some(_), side) => format!(", cluster.yaml valid (judged with the {side} revision's)"),
        (None, _) => "; no cluster.yaml (static checks only)".to_string(),
    };
    let mut items = vec![CheckItem::new(
        "documents",
        "Documents are valid",
        Status::Pass,
        if change.new_cluster {
            format!("release-set.yaml valid at head{cluster_doc}")
        } else {
            format!("release-set.yaml valid at both revisions{cluster_doc}")
        },
    )];
    if change.new_cluster {
        items.push(CheckItem::new(
            "new-cluster",
            "A new cluster is judged on its own",
            Status::Pass,
            format!("cluster {} is added by this change: its release set is judged on its own (pairing, CNI, add-ons); there is nothing to roll out until it runs", change.cluster),
        ));
    }
    if change.edits_policies {
        match &change.head_policies_error {
            Some(e) => items.push(
                CheckItem::new("policies", "Policies come from the protected branch", Status::Fail, format!("this change edits policies/, and they do not load: {e}"))
                    .hint("fix the file named above: once merged, every gate run would fail on it"),
            ),
            None => items.push(
                CheckItem::new(
                    "policies",
                    "Policies come from the protected branch",
                    Status::Warn,
                    "this change edits policies/; the gate judged it with the base revision's policies",
                )
                .hint("merge policy changes on their own first, then re-run the gate on this change"),
            ),
        }
    }
    if let Some(e) = &change.base_cluster_error {
        items.push(
            CheckItem::new(
                "cluster-settings",
                "cluster.yaml settings come from the protected branch",
                Status::Warn,
                format!(
                    "clusters/{}/cluster.yaml does not load at the base revision, so this change is judged with the head's, for validity alone: {}",
                    change.cluster,
                    crate::releaseset::excerpt(e, 400)
                ),
            )
            .hint("review the head's cluster.yaml as the settings every rollout will use once merged; merge the fix on its own"),
        );
    }
    if let Some(why) = &change.base_policies_error {
        items.push(base_policies_item(why));
    }
    if !change.cluster_edits.is_empty() {
        items.push(
            CheckItem::new(
                "cluster-settings",
                "cluster.yaml settings come from the protected branch",
                Status::Warn,
                format!(
                    "this change edits {} in clusters/{}/cluster.yaml; the gate and the plan use the base revision's until it merges",
                    change.cluster_edits.join(", "),
                    change.cluster
                ),
            )
            .hint("merge cluster.yaml changes on their own first to have this change judged with them"),
        );
    }
    if let Some(doc) = &change.cluster_doc {
        let warnings = doc.warnings();
        if !warnings.is_empty() {
            items.push(
                CheckItem::new(
                    "rollout-settings",
                    "Rollout settings are consistent",
                    Status::Warn,
                    warnings.join("; "),
                )
                .hint("lengthen the window or timeout, or shorten the estimate, in spec.rollout"),
            );
        }
    }
    let pre: Vec<String> = change
        .bump
        .changes
        .iter()
        .filter_map(|c| c.to.as_ref().map(|v| (c, v)))
        .filter(|(_, v)| !v.semver().pre.is_empty())
        .map(|(c, v)| format!("{} {v}", c.component.name()))
        .collect();
    if !pre.is_empty() {
        items.push(
            CheckItem::new(
                "prerelease",
                "Targets are releases",
                Status::Warn,
                format!(
                    "{} is a pre-release: compatibility data and upgrade paths are for releases",
                    pre.join(", ")
                ),
            )
            .hint(
                "roll pre-releases out to a test cluster only; wait for the release for this one",
            ),
        );
    }
    let ctx = policy::Context {
        talos_minors_per_reboot: change.cluster_doc.as_ref().map_or(1, |d| {
            u64::from(d.spec.rollout.talos_minors_per_reboot.get())
        }),
        ..policy::Context::system(
            change
                .cluster_doc
                .as_ref()
                .and_then(|d| d.spec.talos.installer_image.as_deref()),
        )
    };
    items.extend(policy::evaluate_with(
        &change.bump,
        &change.policies,
        nodes.as_deref(),
        &ctx,
    ));
    Verdict::new(&change.cluster, change.bump.summary(), items)
}

/// The staged plan for a change; needs the inventory in `cluster.yaml` (the base
/// revision's: a pull request cannot change how its own rollout is staged).
pub fn plan(change: &Change, opts: &PlanOptions) -> Result<Plan, GateError> {
    plan_with(change, opts, None)
}

/// The staged plan, from the live nodes when given (cluster access): then `spec.inventory`
/// is not needed, and where it disagrees with the cluster the plan's notes say so.
pub fn plan_with(
    change: &Change,
    opts: &PlanOptions,
    live: Option<&[Node]>,
) -> Result<Plan, GateError> {
    // The mixed-pair rule of the one-drain order reads the compatibility the gate judges by.
    let with_rows;
    let opts = if opts.kubernetes_by_talos.is_empty() {
        with_rows = opts.clone().with_policies(&change.policies);
        &with_rows
    } else {
        opts
    };
    if let Some(nodes) = live {
        let spec = change
            .cluster_doc
            .as_ref()
            .map(|d| d.spec.clone())
            .unwrap_or_default();
        let mut p = plan::plan(&change.cluster, &change.bump, &spec, nodes, opts)?;
        with_path(change, &mut p);
        match change.nodes() {
            Some(listed) => {
                let drift = live::inventory_drift(&listed, nodes);
                if !drift.is_empty() {
                    p.notes.push(format!(
                        "planned from the live cluster, which differs from spec.inventory: {}",
                        drift.join("; ")
                    ));
                }
            }
            None => p
                .notes
                .push("planned from the live cluster (no spec.inventory)".into()),
        }
        return Ok(p);
    }
    let rev = if change.cluster_doc_side == "head" {
        &change.head
    } else {
        &change.base
    };
    let no_inventory = |missing| GateError::NoInventory {
        cluster: change.cluster.clone(),
        rev: rev.to_string(),
        missing,
    };
    let doc = change
        .cluster_doc
        .as_ref()
        .ok_or_else(|| no_inventory(true))?;
    let nodes = change.nodes().ok_or_else(|| no_inventory(false))?;
    let mut p = plan::plan(&change.cluster, &change.bump, &doc.spec, &nodes, opts)?;
    with_path(change, &mut p);
    Ok(p)
}

/// A change that skips minors: the plan gains the chain's states, and its notes say what
/// the chain costs (docs/rollout.md, "Chains").
fn with_path(change: &Change, p: &mut Plan) {
    if !policy::chain::needed(&change.bump) {
        return;
    }
    let per = change.cluster_doc.as_ref().map_or(1, |d| {
        u64::from(d.spec.rollout.talos_minors_per_reboot.get())
    });
    match policy::chain::path_for(&change.bump, &change.policies, per) {
        Ok(path) => {
            p.warnings.push(format!(
                "this change skips minors: it needs a chain of {} hops with each worker drained {} time(s), which ichor does not roll out yet; the stages below are the change as one jump",
                path.hops(),
                path.worker_drains()
            ));
            p.path = Some(path.states);
        }
        Err(e) => p.warnings.push(format!(
            "this change skips minors and no supported chain leads to it: the hop {e}"
        )),
    }
}

/// The version of the JSON reports (`check` and `plan --output json`). The shapes are a
/// stable interface (docs/cli.md): a field is never renamed or removed within a version.
pub const REPORT_API_VERSION: &str = "ichor.dev/v1alpha1";

/// A revision in JSON output; `commit` is null for the working tree.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RevJson {
    pub rev: String,
    pub commit: Option<String>,
}

impl From<&Rev> for RevJson {
    fn from(r: &Rev) -> Self {
        RevJson {
            rev: r.name.clone(),
            commit: r.commit.map(|c| c.to_string()),
        }
    }
}

/// The exit status of `check` (and of `plan` on a change the gate does not pass):
/// 0 pass, 1 blocked, 2 invalid input, 3 waiting.
pub fn exit_code(review: &Review) -> i32 {
    if review.has_errors() {
        2
    } else {
        review.outcome().exit_code()
    }
}

/// A report's outcome: the gate's, or `invalid` when a document could not be read (exit 2),
/// so a script reading `.outcome` never lets a broken document through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportOutcome {
    Pass,
    Waiting,
    Blocked,
    Invalid,
}

impl From<Outcome> for ReportOutcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Pass => ReportOutcome::Pass,
            Outcome::Waiting => ReportOutcome::Waiting,
            Outcome::Blocked => ReportOutcome::Blocked,
        }
    }
}

impl ReportOutcome {
    /// The review's: `invalid` when any section could not be read, else the worst verdict.
    pub fn of(review: &Review) -> Self {
        if review.has_errors() {
            ReportOutcome::Invalid
        } else {
            review.outcome().into()
        }
    }
}

/// `ichor check --output json`: the documented, stable shape (docs/cli.md).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport<'a> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub base: RevJson,
    pub head: RevJson,
    pub outcome: ReportOutcome,
    pub exit_code: i32,
    pub clusters: Vec<ClusterReport<'a>>,
}

/// One section of a check report: a cluster (or, with `cluster: null`, a policy-only change).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport<'a> {
    pub cluster: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<&'a str>,
    pub outcome: ReportOutcome,
    pub exit_code: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counts: Option<&'a policy::Counts>,
    pub changes: &'a [crate::releaseset::Change],
    pub items: &'a [CheckItem],
}

impl<'a> CheckReport<'a> {
    pub fn new(review: &'a Review) -> Self {
        let clusters = review
            .sections
            .iter()
            .map(|s| match &s.result {
                Ok(j) => ClusterReport {
                    cluster: s.cluster.as_deref(),
                    error: None,
                    summary: Some(&j.verdict.summary),
                    outcome: j.verdict.outcome.into(),
                    exit_code: j.verdict.outcome.exit_code(),
                    counts: Some(&j.verdict.counts),
                    changes: j.change.as_ref().map_or(&[], |c| &c.bump.changes),
                    items: &j.verdict.items,
                },
                Err(e) => ClusterReport {
                    cluster: s.cluster.as_deref(),
                    error: Some(e.to_string()),
                    summary: None,
                    outcome: ReportOutcome::Invalid,
                    exit_code: 2,
                    counts: None,
                    changes: &[],
                    items: &[],
                },
            })
            .collect();
        CheckReport {
            api_version: REPORT_API_VERSION,
            kind: "CheckReport",
            base: (&review.base).into(),
            head: (&review.head).into(),
            outcome: ReportOutcome::of(review),
            exit_code: exit_code(review),
            clusters,
        }
    }
}

/// `ichor plan --output json`.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport<'a> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub base: RevJson,
    pub head: RevJson,
    /// `invalid` when a cluster's documents could not be read or planned, else the worst
    /// gate outcome.
    pub outcome: ReportOutcome,
    pub plans: Vec<ClusterPlan<'a>>,
    /// What could not be planned, as printed on stderr.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ClusterError>,
}

/// A cluster that could not be judged or planned, and why.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterError {
    pub cluster: Option<String>,
    pub error: String,
}

/// One cluster's plan, with the gate's outcome for the change it would roll out.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPlan<'a> {
    pub gate: Outcome,
    #[serde(flatten)]
    pub plan: &'a Plan,
}
