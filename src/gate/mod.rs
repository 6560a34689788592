//! The gate: read both revisions of a cluster from Git, diff them into a bump, and judge it
//! against the compatibility data. Today the facts are static (documents, policies, the
//! optional inventory); live facts from the cluster join the same verdict later.
//!
//! Trust: the repository's `policies/` are read from the *base* revision. A pull request's
//! content is data to evaluate, so a change cannot relax the rules it is judged by; edits to
//! `policies/` take effect once merged, and the verdict says so.

use crate::git::{GitError, Repo, Rev};
use crate::plan::{self, Plan, PlanError, PlanOptions};
use crate::policy::{self, CheckItem, Policies, Status, Verdict};
use crate::releaseset::{Bump, Cluster, DocumentError, Node, ReleaseSet};

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
    #[error("clusters/{cluster}/cluster.yaml at {rev} {}; `plan` needs the node list (spec.inventory) until ichor reads it from the cluster", if *missing { "does not exist" } else { "has no spec.inventory" })]
    NoInventory {
        cluster: String,
        rev: String,
        missing: bool,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
}

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
    /// `cluster.yaml` at head (what the rollout will follow once merged), if present.
    pub cluster_doc: Option<Cluster>,
    pub policies: Policies,
    /// Whether the change edits `policies/` (which then applies only after merge).
    pub edits_policies: bool,
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
    let rs_path = format!("clusters/{name}/release-set.yaml");
    let read_rs = |side: &'static str, rev: &Rev| -> Result<ReleaseSet, GateError> {
        let text = repo
            .read_file(rev, &rs_path)?
            .ok_or_else(|| GateError::UnknownCluster {
                name: name.clone(),
                side,
                rev: rev.to_string(),
                available: repo.clusters(rev).unwrap_or_default(),
            })?;
        ReleaseSet::parse(&rs_path, &text).map_err(doc_err(side, rev))
    };
    let base_release_set = read_rs("base", &base)?;
    let head_release_set = read_rs("head", &head)?;
    let cluster_path = format!("clusters/{name}/cluster.yaml");
    let cluster_doc = match repo.read_file(&head, &cluster_path)? {
        Some(text) => Some(Cluster::parse(&cluster_path, &text).map_err(doc_err("head", &head))?),
        None => None,
    };
    let base_policies = repo.policy_files(&base)?;
    let edits_policies = base_policies != repo.policy_files(&head)?;
    let policies = Policies::load(&base_policies).map_err(doc_err("base", &base))?;
    let bump = Bump::between(&base_release_set, &head_release_set);
    Ok(Change {
        cluster: name,
        base,
        head,
        base_release_set,
        head_release_set,
        cluster_doc,
        policies,
        edits_policies,
        bump,
    })
}

/// The static verdict for a change.
pub fn verdict(change: &Change) -> Verdict {
    let nodes = change.nodes();
    let mut items = vec![CheckItem::new(
        "documents",
        "Documents are valid",
        Status::Pass,
        format!(
            "release-set.yaml valid at both revisions{}",
            if change.cluster_doc.is_some() {
                ", cluster.yaml valid at head"
            } else {
                "; no cluster.yaml (static checks only)"
            }
        ),
    )];
    if change.edits_policies {
        items.push(
            CheckItem::new(
                "policies",
                "Policies come from the protected branch",
                Status::Warn,
                "this change edits policies/; the gate judged it with the base revision's policies",
            )
            .hint("merge policy changes on their own first, then re-run the gate on this change"),
        );
    }
    items.extend(policy::evaluate(
        &change.bump,
        &change.policies,
        nodes.as_deref(),
    ));
    Verdict::new(&change.cluster, change.bump.summary(), items)
}

/// The staged plan for a change; needs the inventory in `cluster.yaml`.
pub fn plan(change: &Change, opts: &PlanOptions) -> Result<Plan, GateError> {
    let no_inventory = |missing| GateError::NoInventory {
        cluster: change.cluster.clone(),
        rev: change.head.to_string(),
        missing,
    };
    let doc = change
        .cluster_doc
        .as_ref()
        .ok_or_else(|| no_inventory(true))?;
    let nodes = change.nodes().ok_or_else(|| no_inventory(false))?;
    Ok(plan::plan(
        &change.cluster,
        &change.bump,
        &doc.spec,
        &nodes,
        opts,
    )?)
}

/// A revision in JSON output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RevJson {
    pub rev: String,
    pub commit: String,
}

impl From<&Rev> for RevJson {
    fn from(r: &Rev) -> Self {
        RevJson {
            rev: r.name.clone(),
            commit: r.commit.to_string(),
        }
    }
}

/// `ichor check --output json`: the documented, stable shape (docs/cli.md).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport<'a> {
    pub cluster: &'a str,
    pub base: RevJson,
    pub head: RevJson,
    pub summary: &'a str,
    pub outcome: policy::Outcome,
    pub exit_code: i32,
    pub counts: &'a policy::Counts,
    pub changes: &'a [crate::releaseset::Change],
    pub items: &'a [CheckItem],
}

impl<'a> CheckReport<'a> {
    pub fn new(change: &'a Change, verdict: &'a Verdict) -> Self {
        CheckReport {
            cluster: &change.cluster,
            base: (&change.base).into(),
            head: (&change.head).into(),
            summary: &verdict.summary,
            outcome: verdict.outcome,
            exit_code: verdict.outcome.exit_code(),
            counts: &verdict.counts,
            changes: &change.bump.changes,
            items: &verdict.items,
        }
    }
}

/// `ichor plan --output json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlanReport<'a> {
    pub base: RevJson,
    pub head: RevJson,
    #[serde(flatten)]
    pub plan: &'a Plan,
}
