//! The staged plan for one bump: which steps run, in which order, on which nodes, and how
//! long it should take. Pure data derived from the bump, the cluster's rollout policy and
//! the nodes; the rollout engine re-derives the same steps from observed state.
//!
//! Order (docs/architecture.md, "The rollout"): Talos on control planes one at a time, then
//! workers in batches; then Kubernetes: (a) kube-apiserver on each control plane, (b)
//! controller-manager and scheduler on each control plane, (c) kube-proxy (unless the CNI
//! replaces it) and the bootstrap manifests, (d) kubelets, control planes then workers; then
//! a final verification.
//!
//! A bump that moves Talos and Kubernetes drains each worker once instead of twice: Talos
//! moves on the control planes only, the Kubernetes stages follow, and then each worker
//! switches its kubelet and upgrades Talos in one window ([`StageId::Workers`]). That order
//! has a worker run its old Talos with the new kubelet for a moment, so it is taken only
//! when that pair is supported; otherwise (or with `--two-pass`, `spec.rollout.twoPass`) the
//! order above stands.

mod batch;
pub mod eta;
mod render;
pub mod window;

use std::collections::HashMap;

use serde::Serialize;

use crate::clock::Timestamp;
use crate::escape;
use crate::policy::KubeRange;
use crate::releaseset::{
    Bump, ClusterSpec, HumanDuration, MinorVersion, Node, Role, Version, VolumeProvider,
};

pub use batch::{plan_batches, Batches, Placeable};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StageId {
    Talos,
    KubeApiserver,
    KubeControllerManagerScheduler,
    KubeProxyManifests,
    Kubelet,
    /// Each worker once: its kubelet and its Talos in one drain (a bump moving both).
    Workers,
    Verify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepKind {
    /// Pre-pull, cordon, drain, install, reboot, wait for the new boot id and Ready, uncordon.
    TalosUpgrade,
    ApiServer,
    ControllerManagerScheduler,
    KubeProxyAndManifests,
    /// Bootstrap-manifest sync only (the CNI replaces kube-proxy).
    Manifests,
    /// Cordon, drain, switch the kubelet image, wait for Ready and the version, uncordon.
    Kubelet,
    /// Cordon, drain, switch the kubelet image (NO_REBOOT), upgrade Talos, reboot, wait for
    /// the new boot Ready on both versions, uncordon: one drain for both.
    Worker,
    Verify,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// Stable id, e.g. `talos/cp-1`, `talos/workers-2`, `kubelet/w-3`.
    pub id: String,
    pub kind: StepKind,
    /// Nodes the step acts on, all at once.
    pub nodes: Vec<String>,
    pub description: String,
    /// Offset from the start of the rollout, in seconds.
    pub start_secs: u64,
    pub duration_secs: u64,
}

impl Step {
    /// A batch of workers (`talos/workers-2`, `kubelet/workers-1`, `worker/workers-3`):
    /// its nodes run in the rollout's worker pool, started as slots free, not as one unit.
    pub fn is_worker_batch(&self) -> bool {
        self.id
            .split_once('/')
            .is_some_and(|(_, rest)| rest.starts_with("workers-"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stage {
    pub id: StageId,
    pub title: String,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchReport {
    pub max_unavailable: u32,
    pub count: usize,
    pub lower_bound: usize,
    /// Whether volume replicas constrained the batches.
    pub volume_aware: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub cluster: String,
    pub summary: String,
    pub control_planes: usize,
    pub workers: usize,
    pub stages: Vec<Stage>,
    pub worker_batches: BatchReport,
    pub estimate_secs: u64,
    /// The (Talos, Kubernetes) pairs the cluster runs, in order, as the stages complete:
    /// Talos moves first, so every pair here must be supported.
    pub pairings: Vec<Pairing>,
    /// What the plan leaves out and why (nodes already at the target, kube-proxy replaced…).
    pub notes: Vec<String>,
    /// What the rollout will cost that a reader must know before merging (the Kubernetes
    /// API going down with a single control plane…).
    pub warnings: Vec<String>,
    /// The node running ichor, when the plan has it: the engine starts it after every other
    /// node of its stage, so ichor is evicted at the very end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ichor_node: Option<String>,
    /// Where the estimate falls on the calendar with the maintenance windows, once
    /// [`Plan::schedule`] was told the time (a plan for a PR comment has none: it depends
    /// on when the change merges).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// A change that skips minors: the chain's states in order, from the one the cluster
    /// runs to the target (`crate::policy::path`). The stages above are the change as one
    /// jump, which ichor does not roll out yet (docs/rollout.md, "Chains").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<Vec<crate::policy::path::State>>,
}

/// The plan's working time on the calendar: only a window starts a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    /// When the schedule was made (RFC 3339).
    pub from: String,
    /// When the first step may start: `from` inside a window, else when the next opens.
    pub starts_at: String,
    /// When the rollout should end, counting only the time a window lets it work.
    pub ends_at: String,
    /// The windows the rollout needs (each starts at least one step).
    pub windows: usize,
}

impl Schedule {
    /// "starts in the next maintenance window, Sat 06:00 UTC (…); ends ≈ …; needs 1
    /// maintenance window".
    pub fn describe(&self) -> String {
        render::schedule_text(self)
    }
}

impl Plan {
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.stages.iter().flat_map(|s| s.steps.iter())
    }

    /// The steps as the calendar sees them: every step but the final verify starts only
    /// inside a window (src/rollout/nodes.rs `may_go`; the pool, the sync and every
    /// component step ask it).
    pub fn work(&self) -> Vec<window::Work> {
        self.steps()
            .map(|s| window::Work {
                secs: s.duration_secs,
                gated: s.kind != StepKind::Verify,
            })
            .collect()
    }

    /// What is left once the steps `done` says an earlier run finished are taken out: the
    /// rest keeps its order, its offsets close up, and a note counts what was left out.
    /// The final verify always stays.
    pub fn left(&self, done: impl Fn(StageId, &Step) -> bool) -> Plan {
        let mut p = self.clone();
        let mut gone = 0;
        for stage in &mut p.stages {
            let id = stage.id;
            let before = stage.steps.len();
            stage
                .steps
                .retain(|s| s.kind == StepKind::Verify || !done(id, s));
            gone += before - stage.steps.len();
        }
        if gone == 0 {
            return p;
        }
        p.stages.retain(|s| !s.steps.is_empty());
        // A resumed rollout has passed its `before` gate: the rest starts at once.
        let mut at = 0u64;
        p.schedule = None;
        for step in p.stages.iter_mut().flat_map(|s| s.steps.iter_mut()) {
            step.start_secs = at;
            at = at.saturating_add(step.duration_secs);
        }
        p.estimate_secs = at;
        p.notes.insert(
            0,
            format!(
                "resumed: {} an earlier run finished {} left out",
                count(gone, "step"),
                if gone == 1 { "is" } else { "are" }
            ),
        );
        p
    }

    /// Lay the plan on the calendar from `now` with `windows` (none: nothing to say, the
    /// rollout may run any time).
    pub fn schedule(&mut self, windows: &[crate::releaseset::MaintenanceWindow], now: Timestamp) {
        if windows.is_empty() || self.stages.is_empty() {
            self.schedule = None;
            return;
        }
        let c = window::calendar(windows, now, &self.work());
        self.schedule = Some(Schedule {
            from: now.rfc3339(),
            starts_at: c.first_start.rfc3339(),
            ends_at: c.ends_at.rfc3339(),
            windows: c.windows,
        });
    }

    pub fn render_text(&self) -> String {
        render::text(self)
    }
    pub fn render_mermaid(&self) -> String {
        render::mermaid(self)
    }
    pub fn render_markdown(&self) -> String {
        render::markdown(self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pairing {
    pub talos: Version,
    pub kubernetes: Version,
}

/// Options that come from outside the documents.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// The node running ichor: its batch goes last, so ichor is evicted at the very end.
    pub ichor_node: Option<String>,
    /// Keep the two-pass order (`--two-pass`): every worker drained for Talos, then again
    /// for its kubelet.
    pub two_pass: bool,
    /// The Kubernetes minors each Talos minor supports (the policies' `talos` rows): the
    /// one-drain order needs every worker's current Talos to run the target kubelet. Empty:
    /// not known, so the two-pass order.
    pub kubernetes_by_talos: Vec<(MinorVersion, KubeRange)>,
    /// The control plane whose etcd member leads, when read live: the run takes it last
    /// among the control planes' Talos steps (src/rollout/mod.rs `leader_last`), so the
    /// plan lists it last too.
    pub etcd_leader: Option<String>,
}

impl PlanOptions {
    /// With the Talos rows of `policies` for the mixed-pair rule.
    pub fn with_policies(mut self, policies: &crate::policy::Policies) -> Self {
        self.kubernetes_by_talos = policies
            .talos
            .iter()
            .map(|r| (r.version, r.kubernetes))
            .collect();
        self
    }
}

/// Why a bump that moves Talos and Kubernetes keeps the two-pass order, or `None` when
/// each worker can be drained once: every worker that moves both would run its current
/// Talos with the target kubelet between the kubelet switch and the reboot, and that pair
/// must be supported.
fn two_pass_reason(
    opts: &PlanOptions,
    spec: &ClusterSpec,
    workers: &[&Node],
    k8s: &Version,
) -> Option<String> {
    if opts.two_pass {
        return Some("the two-pass order was asked for (--two-pass)".into());
    }
    if spec.rollout.two_pass {
        return Some("the two-pass order was asked for (spec.rollout.twoPass)".into());
    }
    let mut seen: Vec<MinorVersion> = Vec::new();
    for n in workers {
        let m = n.talos.minor_version();
        if seen.contains(&m) {
            continue;
        }
        seen.push(m);
        match opts.kubernetes_by_talos.iter().find(|(t, _)| *t == m) {
            Some((_, range)) if range.contains(k8s.minor_version()) => {}
            Some((_, range)) => {
                return Some(format!(
                    "a worker would run Talos {} with the kubelet {k8s} between its kubelet switch and its reboot, and Talos {m} supports Kubernetes {range} only",
                    n.talos
                ))
            }
            None => {
                return Some(format!(
                    "no compatibility data tells whether Talos {m} (which {} runs) supports the kubelet {k8s}",
                    escape::terminal(&n.name)
                ))
            }
        }
    }
    None
}

/// Why no plan can be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "--ichor-node `{}` is not a node in the inventory (nodes: {})",
        escape::terminal(name),
        name_list(known)
    )]
    UnknownIchorNode { name: String, known: Vec<String> },
}

/// At most this many names in an error; the rest are counted.
const LISTED_NAMES: usize = 10;

fn name_list(names: &[String]) -> String {
    if names.is_empty() {
        return "none".into();
    }
    let shown: Vec<String> = names
        .iter()
        .take(LISTED_NAMES)
        .map(|n| escape::terminal(n))
        .collect();
    let mut out = shown.join(", ");
    if names.len() > LISTED_NAMES {
        out.push_str(&format!(" and {} more", names.len() - LISTED_NAMES));
    }
    out
}

/// Offsets and the estimate saturate: durations come from a pull request, and a wrapped
/// sum would print a short estimate for an endless rollout.
struct Timeline {
    at: u64,
}

impl Timeline {
    fn step(
        &mut self,
        id: String,
        kind: StepKind,
        nodes: Vec<String>,
        description: String,
        d: HumanDuration,
    ) -> Step {
        let s = Step {
            id,
            kind,
            nodes,
            description,
            start_secs: self.at,
            duration_secs: d.0.as_secs(),
        };
        self.at = self.at.saturating_add(s.duration_secs);
        s
    }
}

fn plural(word: &str, n: usize) -> String {
    if n == 1 {
        word.to_string()
    } else if word.ends_with(['s', 'h']) {
        format!("{word}es")
    } else {
        format!("{word}s")
    }
}

/// `3 workers`, `1 batch`.
pub(crate) fn count(n: usize, word: &str) -> String {
    format!("{n} {}", plural(word, n))
}

/// `w-1, w-2: Talos v1.12.6 → v1.13.0` when the nodes agree on where they come from (the
/// version as the node's document spells it), else `w-1 (v1.12.5), w-2 (v1.12.6): Talos →
/// v1.13.0`.
fn from_to(
    members: &[&Node],
    from: impl Fn(&Node) -> &Version,
    what: &str,
    to: &Version,
) -> String {
    let first = members.first().map(|n| from(n).original());
    if members.iter().all(|n| Some(from(n).original()) == first) {
        let names: Vec<&str> = members.iter().map(|n| n.name.as_str()).collect();
        match first {
            Some(v) => format!("{}: {what}{v} → {to}", names.join(", ")),
            None => format!("{what}→ {to}"),
        }
    } else {
        let names: Vec<String> = members
            .iter()
            .map(|n| format!("{} ({})", n.name, from(n)))
            .collect();
        format!("{}: {what}→ {to}", names.join(", "))
    }
}

/// `v1.12.6 → v1.13.0` when the nodes agree on where they come from, else `→ v1.13.0`.
fn versions(members: &[&Node], from: impl Fn(&Node) -> &Version, to: &Version) -> String {
    let first = members.first().map(|n| from(n).original());
    match first {
        Some(v) if members.iter().all(|n| from(n).original() == v) => format!("{v} → {to}"),
        _ => format!("→ {to}"),
    }
}

fn only<'a>(nodes: &[&'a Node], keep: impl Fn(&Node) -> bool) -> Vec<&'a Node> {
    nodes.iter().copied().filter(|n| keep(n)).collect()
}

/// Build the plan for `bump` on `cluster`'s `nodes`.
pub fn plan(
    cluster_name: &str,
    bump: &Bump,
    spec: &ClusterSpec,
    nodes: &[Node],
    opts: &PlanOptions,
) -> Result<Plan, PlanError> {
    if let Some(me) = &opts.ichor_node {
        if !nodes.iter().any(|n| &n.name == me) {
            let mut known: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
            known.sort();
            return Err(PlanError::UnknownIchorNode {
                name: me.clone(),
                known,
            });
        }
    }
    let est = spec.rollout.estimates;
    let max_unavailable = spec.rollout.max_unavailable.get();
    let volume_aware = spec.volumes.provider != VolumeProvider::None;
    let mut cps: Vec<&Node> = nodes
        .iter()
        .filter(|n| n.role == Role::Controlplane)
        .collect();
    let mut workers: Vec<&Node> = nodes.iter().filter(|n| n.role == Role::Worker).collect();
    cps.sort_by(|a, b| a.name.cmp(&b.name));
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    // The control plane running ichor goes last among control planes too.
    if let Some(me) = &opts.ichor_node {
        if let Some(pos) = cps.iter().position(|n| &n.name == me) {
            let n = cps.remove(pos);
            cps.push(n);
        }
    }

    let batch = |ws: &[&Node]| {
        let no_volumes: Vec<String> = Vec::new();
        let placeable: Vec<Placeable> = ws
            .iter()
            .map(|n| Placeable {
                name: &n.name,
                volumes: if volume_aware {
                    &n.volumes
                } else {
                    &no_volumes
                },
            })
            .collect();
        plan_batches(
            &placeable,
            max_unavailable as usize,
            opts.ichor_node.as_deref(),
        )
    };

    let by_name: HashMap<&str, &Node> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let members_of = |names: &[String]| -> Vec<&Node> {
        names
            .iter()
            .filter_map(|n| by_name.get(n.as_str()).copied())
            .collect()
    };

    let mut t = Timeline { at: 0 };
    let mut stages = Vec::new();
    let mut notes = Vec::new();
    let mut warnings = Vec::new();
    let mut report = BatchReport {
        max_unavailable,
        count: 0,
        lower_bound: 0,
        volume_aware,
    };

    let talos = &bump.head.spec.talos;
    let behind = |n: &Node| &n.talos != talos;
    let (talos_cps, talos_workers) = (only(&cps, behind), only(&workers, behind));
    let at_target = nodes.len() - talos_cps.len() - talos_workers.len();
    if at_target > 0 && at_target < nodes.len() {
        notes.push(format!(
            "{} already {} Talos {talos} and {} skipped",
            count(at_target, "node"),
            if at_target == 1 { "runs" } else { "run" },
            if at_target == 1 { "is" } else { "are" },
        ));
    }
    let k8s = &bump.head.spec.kubernetes;
    let stale = |n: &Node| &n.kubelet != k8s;
    // The work is what the nodes run against the target, not what two commits differ by: a
    // rollout resumed on a newer commit (a fix to cluster.yaml, a README) still has the
    // kubelets a paused bump left behind.
    let kubernetes_moves = bump.kubernetes_moves() || nodes.iter().any(stale);
    // Where each stage starts from, as observed: the oldest version still running.
    let talos_from = nodes
        .iter()
        .filter(|n| behind(n))
        .map(|n| &n.talos)
        .min()
        .unwrap_or(&bump.base.spec.talos);
    let kubernetes_from = match bump.kubernetes_moves() {
        true => &bump.base.spec.kubernetes,
        false => nodes
            .iter()
            .filter(|n| stale(n))
            .map(|n| &n.kubelet)
            .min()
            .unwrap_or(k8s),
    };
    // Each worker drained once for Talos and its kubelet, when the mixed pair allows it.
    let moves_both = only(&workers, |n| behind(n) && stale(n));
    let one_drain = kubernetes_moves
        && !moves_both.is_empty()
        && match two_pass_reason(opts, spec, &moves_both, k8s) {
            None => {
                notes.push("each worker is drained once: its kubelet switch and its Talos upgrade share one window, after every control plane runs the target".into());
                true
            }
            Some(why) => {
                notes.push(format!(
                    "each worker is drained twice, for Talos and again for its kubelet: {why}"
                ));
                false
            }
        };
    // What guards a control plane's reboot depends on how many etcd members there are: with
    // three or more, one can go while the rest keep quorum; with fewer, nothing can.
    let cp_guard = match cps.len() {
        0 | 1 => "the only control plane: the Kubernetes API is down until it is back",
        2 => "refused while etcd has 2 members: either down loses quorum",
        _ => "etcd quorum checked, leadership moved off first",
    };
    if !talos_cps.is_empty() || !talos_workers.is_empty() {
        let mut steps = Vec::new();
        // As the run goes: the leader of etcd after every other control plane (it moves
        // leadership once, not at every reboot), even after the node running ichor.
        let mut talos_cps = talos_cps.clone();
        if let Some(leader) = &opts.etcd_leader {
            if let Some(pos) = talos_cps.iter().position(|n| &n.name == leader) {
                let n = talos_cps.remove(pos);
                talos_cps.push(n);
            }
        }
        for n in &talos_cps {
            steps.push(t.step(
                format!("talos/{}", n.name),
                StepKind::TalosUpgrade,
                vec![n.name.clone()],
                format!(
                    "control plane {}: Talos {} → {talos} ({cp_guard})",
                    n.name, n.talos
                ),
                est.talos_node,
            ));
        }
        let b = batch(if one_drain { &[] } else { &talos_workers });
        report.count = b.batches.len();
        report.lower_bound = b.lower_bound;
        for (i, members) in b.batches.into_iter().enumerate() {
            steps.push(t.step(
                format!("talos/workers-{}", i + 1),
                StepKind::TalosUpgrade,
                members.clone(),
                format!(
                    "{} {}",
                    plural("worker", members.len()),
                    from_to(&members_of(&members), |n| &n.talos, "Talos ", talos)
                ),
                est.talos_node,
            ));
        }
        if !steps.is_empty() {
            stages.push(Stage {
                id: StageId::Talos,
                title: if one_drain {
                    format!("Talos {talos_from} → {talos} on the control planes")
                } else {
                    format!("Talos {talos_from} → {talos}")
                },
                steps,
            });
        }
    }

    if kubernetes_moves {
        let from = kubernetes_from;
        let per_cp = |t: &mut Timeline, prefix: &str, kind, what: &str, d| -> Vec<Step> {
            cps.iter()
                .map(|n| {
                    t.step(
                        format!("{prefix}/{}", n.name),
                        kind,
                        vec![n.name.clone()],
                        format!("{what} on {}: {from} → {k8s}", n.name),
                        d,
                    )
                })
                .collect()
        };
        let steps = per_cp(
            &mut t,
            "apiserver",
            StepKind::ApiServer,
            "kube-apiserver",
            est.api_server,
        );
        stages.push(Stage {
            id: StageId::KubeApiserver,
            title: format!("kube-apiserver {from} → {k8s}"),
            steps,
        });
        let steps = per_cp(
            &mut t,
            "controller-manager-scheduler",
            StepKind::ControllerManagerScheduler,
            "kube-controller-manager and kube-scheduler",
            est.controller_manager_scheduler,
        );
        stages.push(Stage {
            id: StageId::KubeControllerManagerScheduler,
            title: format!("kube-controller-manager and kube-scheduler {from} → {k8s}"),
            steps,
        });
        let step = if spec.cni.replaces_kube_proxy {
            notes.push("kube-proxy is skipped: the CNI replaces it".into());
            t.step(
                "manifests".into(),
                StepKind::Manifests,
                vec![],
                format!("bootstrap-manifest sync for {k8s} (every apiserver runs {k8s})"),
                est.kube_proxy_and_manifests,
            )
        } else {
            t.step(
                "kube-proxy-manifests".into(),
                StepKind::KubeProxyAndManifests,
                vec![],
                format!("kube-proxy {from} → {k8s} and the bootstrap-manifest sync (every apiserver runs {k8s})"),
                est.kube_proxy_and_manifests,
            )
        };
        stages.push(Stage {
            id: StageId::KubeProxyManifests,
            title: if spec.cni.replaces_kube_proxy {
                "bootstrap manifests".into()
            } else {
                "kube-proxy and bootstrap manifests".into()
            },
            steps: vec![step],
        });

        let (kcps, kworkers) = (only(&cps, stale), only(&workers, stale));
        let kworkers = if one_drain { Vec::new() } else { kworkers };
        let mut steps = Vec::new();
        for n in &kcps {
            steps.push(t.step(
                format!("kubelet/{}", n.name),
                StepKind::Kubelet,
                vec![n.name.clone()],
                format!("kubelet on control plane {}: {} → {k8s}", n.name, n.kubelet),
                est.kubelet,
            ));
        }
        let b = batch(&kworkers);
        if report.count == 0 {
            report.count = b.batches.len();
            report.lower_bound = b.lower_bound;
        }
        for (i, members) in b.batches.into_iter().enumerate() {
            steps.push(t.step(
                format!("kubelet/workers-{}", i + 1),
                StepKind::Kubelet,
                members.clone(),
                format!(
                    "{} on {} {}",
                    plural("kubelet", members.len()),
                    plural("worker", members.len()),
                    from_to(&members_of(&members), |n| &n.kubelet, "", k8s)
                ),
                est.kubelet,
            ));
        }
        if !steps.is_empty() {
            stages.push(Stage {
                id: StageId::Kubelet,
                title: if one_drain {
                    format!("kubelets {from} → {k8s} on the control planes")
                } else {
                    format!("kubelets {from} → {k8s}, control planes then workers")
                },
                steps,
            });
        }
        if one_drain {
            let members = only(&workers, |n| behind(n) || stale(n));
            let b = batch(&members);
            report.count = b.batches.len();
            report.lower_bound = b.lower_bound;
            let mut steps = Vec::new();
            for (i, names) in b.batches.into_iter().enumerate() {
                let ms = members_of(&names);
                steps.push(t.step(
                    format!("worker/workers-{}", i + 1),
                    StepKind::Worker,
                    names.clone(),
                    format!(
                        "{} {}: Talos {} and kubelet {}, one drain",
                        plural("worker", names.len()),
                        names.join(", "),
                        versions(&ms, |n| &n.talos, talos),
                        versions(&ms, |n| &n.kubelet, k8s),
                    ),
                    est.talos_node,
                ));
            }
            stages.push(Stage {
                id: StageId::Workers,
                title: format!(
                    "workers, each drained once: Talos {talos_from} → {talos} and kubelet {from} → {k8s}"
                ),
                steps,
            });
        }
    }

    if !stages.is_empty() {
        // Promise only the checks that apply: no volume provider, no volume check.
        let volumes = match spec.volumes.provider {
            VolumeProvider::Longhorn => ", Longhorn volumes healthy",
            VolumeProvider::LocalPath => ", local-path volumes healthy",
            VolumeProvider::None => "",
        };
        let step = t.step(
            "verify".into(),
            StepKind::Verify,
            vec![],
            format!("verify the whole cluster: every node Ready at the target versions, etcd healthy{volumes}"),
            est.verify,
        );
        stages.push(Stage {
            id: StageId::Verify,
            title: "verify".into(),
            steps: vec![step],
        });
    } else {
        notes.push(format!(
            "nothing to roll out: every node already runs Talos {talos} and kubelet {k8s}"
        ));
    }
    let cp_restarts = !talos_cps.is_empty() || kubernetes_moves;
    match (cps.as_slice(), cp_restarts) {
        ([only], true) => warnings.push(format!(
            "{} is the only control plane: the Kubernetes API is unavailable while it {}; \
             running workloads keep running, but nothing can be scheduled or changed meanwhile",
            only.name,
            match (!talos_cps.is_empty(), kubernetes_moves) {
                (true, true) => "reboots for Talos and while kube-apiserver restarts",
                (true, false) => "reboots for Talos",
                _ => "restarts kube-apiserver",
            }
        )),
        ([_, _], _) if !talos_cps.is_empty() => warnings.push(
            "2 control planes: etcd has no member to spare, so the rollout refuses to reboot \
             either for Talos (it would lose quorum); add a third control plane first"
                .into(),
        ),
        _ => {}
    }
    let estimate_secs = match with_health_gates(&mut stages, &spec.health_checks) {
        Some((secs, note)) => {
            notes.push(note);
            secs
        }
        None => t.at,
    };
    if !spec.rollout.maintenance_windows.is_empty() && !stages.is_empty() {
        notes.push("the rollout acts only inside the maintenance windows (a node starts only inside one, then finishes); the estimate counts working time only".into());
    }
    let changes: Vec<String> = bump
        .changes
        .iter()
        .filter(|c| {
            !matches!(
                c.component,
                crate::releaseset::ComponentId::Talos | crate::releaseset::ComponentId::Kubernetes
            )
        })
        .map(|c| c.to_string())
        .collect();
    if !changes.is_empty() {
        notes.push(format!(
            "not rolled by ichor (applied by your GitOps tool): {}",
            changes.join("; ")
        ));
    }
    let mut pairings = vec![Pairing {
        talos: bump.base.spec.talos.clone(),
        kubernetes: bump.base.spec.kubernetes.clone(),
    }];
    for stage in &stages {
        let next = match stage.id {
            StageId::Talos => Pairing {
                talos: talos.clone(),
                kubernetes: pairings[pairings.len() - 1].kubernetes.clone(),
            },
            StageId::Kubelet | StageId::KubeApiserver => Pairing {
                talos: pairings[pairings.len() - 1].talos.clone(),
                kubernetes: k8s.clone(),
            },
            // A worker between its kubelet switch and its reboot, then after it.
            StageId::Workers => {
                let mixed = Pairing {
                    talos: bump.base.spec.talos.clone(),
                    kubernetes: k8s.clone(),
                };
                if !pairings.contains(&mixed) {
                    pairings.push(mixed);
                }
                Pairing {
                    talos: talos.clone(),
                    kubernetes: k8s.clone(),
                }
            }
            _ => continue,
        };
        // Each pair once, where a node first runs it (in the one-drain order the control
        // planes reach the target pair before the workers' mixed one).
        if !pairings.contains(&next) {
            pairings.push(next);
        }
    }
    Ok(Plan {
        cluster: cluster_name.to_string(),
        summary: bump.summary(),
        control_planes: cps.len(),
        workers: workers.len(),
        stages,
        worker_batches: report,
        estimate_secs,
        pairings,
        notes,
        warnings,
        ichor_node: opts
            .ichor_node
            .clone()
            .filter(|me| nodes.iter().any(|n| &n.name == me)),
        schedule: None,
        path: None,
    })
}

/// The least a health gate of `phase` waits: its checks are read together, and each must
/// hold for its `stableFor`, counted from the gate's first reading (src/rollout/health.rs).
fn gate_secs(checks: &[crate::health::HealthCheck], phase: crate::health::Phase) -> u64 {
    checks
        .iter()
        .filter(|c| c.applies(phase))
        .map(|c| c.stable_for.0.as_secs())
        .max()
        .unwrap_or(0)
}

/// The health gates' least time added where the engine waits at them: `before` ahead of
/// the first step, `between` after every disruptive unit but the last (a step, or each
/// worker of a pooled batch, one gate at a time: src/rollout/mod.rs `stages_in_order`),
/// `after` at verify. Offsets move with it. `None` when no gate costs anything; else the new
/// total and a note saying what it holds.
fn with_health_gates(
    stages: &mut [Stage],
    checks: &[crate::health::HealthCheck],
) -> Option<(u64, String)> {
    use crate::health::Phase;
    let (before, between, after) = (
        gate_secs(checks, Phase::Before),
        gate_secs(checks, Phase::Between),
        gate_secs(checks, Phase::After),
    );
    if stages.is_empty() || before + between + after == 0 {
        return None;
    }
    let units = |s: &Step| {
        if s.is_worker_batch() {
            s.nodes.len()
        } else {
            1
        }
    };
    let total: usize = stages
        .iter()
        .flat_map(|st| st.steps.iter())
        .filter(|s| s.kind != StepKind::Verify)
        .map(units)
        .sum();
    let last = total.saturating_sub(1);
    let (mut at, mut seen, mut gates) = (before, 0usize, 0usize);
    for step in stages.iter_mut().flat_map(|st| st.steps.iter_mut()) {
        if step.kind == StepKind::Verify {
            step.duration_secs = step.duration_secs.saturating_add(after);
        } else {
            let n = units(step);
            let here = (seen + n).min(last) - seen.min(last);
            seen += n;
            gates += here;
            step.duration_secs = step
                .duration_secs
                .saturating_add((here as u64).saturating_mul(between));
        }
        step.start_secs = at;
        at = at.saturating_add(step.duration_secs);
    }
    let mut parts = Vec::new();
    if before > 0 {
        parts.push(format!("{} before", render::dur(before)));
    }
    if between > 0 && gates > 0 {
        parts.push(format!(
            "{} at each of {} after a node or batch",
            render::dur(between),
            count(gates, "gate")
        ));
    }
    if after > 0 {
        parts.push(format!("{} at the final verify", render::dur(after)));
    }
    Some((
        at,
        format!(
            "the estimate includes the health gates' stableFor: {} (each gate counts stableFor from its own first reading)",
            parts.join(", ")
        ),
    ))
}

/// Plans for other modules' unit tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// Talos on two workers, one after the other, 300 s each.
    pub fn two_worker_plan() -> Plan {
        let step = |n: &str, start| Step {
            id: format!("talos/{n}"),
            kind: StepKind::TalosUpgrade,
            nodes: vec![n.to_string()],
            description: n.to_string(),
            start_secs: start,
            duration_secs: 300,
        };
        Plan {
            cluster: "c".into(),
            summary: String::new(),
            control_planes: 0,
            workers: 2,
            stages: vec![Stage {
                id: StageId::Talos,
                title: "Talos".into(),
                steps: vec![step("w-1", 0), step("w-2", 300)],
            }],
            worker_batches: BatchReport {
                max_unavailable: 1,
                count: 2,
                lower_bound: 2,
                volume_aware: false,
            },
            estimate_secs: 600,
            pairings: vec![],
            notes: vec![],
            warnings: vec![],
            ichor_node: None,
            schedule: None,
            path: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::releaseset::{Cluster, ReleaseSet};

    fn rs(talos: &str, k8s: &str) -> ReleaseSet {
        ReleaseSet::parse(
            "t",
            &format!("apiVersion: ichor.dev/v1alpha1\nkind: ReleaseSet\nmetadata: {{name: t}}\nspec:\n  talos: {talos}\n  kubernetes: {k8s}\n  cni: {{name: cilium, version: 1.18.3}}\n"),
        )
        .unwrap()
    }

    fn cluster(extra: &str) -> Cluster {
        let text = format!(
            "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: t}}\nspec:\n{extra}  volumes: {{provider: longhorn}}\n  inventory:\n    nodes:\n      - {{name: cp-2, role: controlplane}}\n      - {{name: cp-1, role: controlplane}}\n      - {{name: cp-3, role: controlplane}}\n      - {{name: w-1, role: worker, volumes: [a, b]}}\n      - {{name: w-2, role: worker, volumes: [a]}}\n      - {{name: w-3, role: worker, volumes: [b]}}\n      - {{name: w-4, role: worker}}\n"
        );
        Cluster::parse("c", &text).unwrap()
    }

    fn build(base: &ReleaseSet, head: &ReleaseSet, c: &Cluster) -> Plan {
        let nodes = c.spec.inventory.as_ref().unwrap().resolve(base);
        plan(
            "t",
            &Bump::between(base, head),
            &c.spec,
            &nodes,
            &PlanOptions::default(),
        )
        .unwrap()
    }

    fn build_with(base: &ReleaseSet, head: &ReleaseSet, c: &Cluster, opts: &PlanOptions) -> Plan {
        let nodes = c.spec.inventory.as_ref().unwrap().resolve(base);
        plan("t", &Bump::between(base, head), &c.spec, &nodes, opts).unwrap()
    }

    #[test]
    fn a_grouped_bump_drains_each_worker_once_unless_a_mixed_pair_is_unsupported() {
        let policies = crate::policy::Policies::shipped().unwrap();
        let opts = PlanOptions::default().with_policies(&policies);
        let c = cluster("  rollout: {maxUnavailable: 2}\n");
        let p = build_with(
            &rs("v1.12.6", "v1.33.5"),
            &rs("v1.12.9", "v1.34.1"),
            &c,
            &opts,
        );
        let stages: Vec<StageId> = p.stages.iter().map(|s| s.id).collect();
        assert_eq!(
            stages,
            [
                StageId::Talos,
                StageId::KubeApiserver,
                StageId::KubeControllerManagerScheduler,
                StageId::KubeProxyManifests,
                StageId::Kubelet,
                StageId::Workers,
                StageId::Verify
            ]
        );
        // Talos and the kubelet stage on the control planes only; every worker once, after.
        let nodes_of = |id: StageId| -> Vec<String> {
            let mut n: Vec<String> = p
                .stages
                .iter()
                .filter(|s| s.id == id)
                .flat_map(|s| s.steps.iter().flat_map(|st| st.nodes.clone()))
                .collect();
            n.sort();
            n
        };
        assert_eq!(nodes_of(StageId::Talos), ["cp-1", "cp-2", "cp-3"]);
        assert_eq!(nodes_of(StageId::Kubelet), ["cp-1", "cp-2", "cp-3"]);
        assert_eq!(nodes_of(StageId::Workers), ["w-1", "w-2", "w-3", "w-4"]);
        assert!(p.stages[5].steps.iter().all(|s| s.kind == StepKind::Worker
            && s.id.starts_with("worker/workers-")
            && s.nodes.len() <= 2));
        // The mixed pair a worker runs between its kubelet switch and its reboot is listed.
        let pairs: Vec<String> = p
            .pairings
            .iter()
            .map(|x| format!("{}+{}", x.talos, x.kubernetes))
            .collect();
        assert_eq!(
            pairs,
            [
                "v1.12.6+v1.33.5",
                "v1.12.9+v1.33.5",
                "v1.12.9+v1.34.1",
                "v1.12.6+v1.34.1"
            ]
        );
        assert!(
            p.notes.iter().any(|n| n.contains("drained once")),
            "{:?}",
            p.notes
        );
        assert!(p.render_markdown().contains("one drain"));
        // Talos 1.12 supports Kubernetes up to 1.35: a worker cannot run its kubelet 1.36
        // before its reboot, so each is drained twice, and the plan says why.
        let p = build_with(
            &rs("v1.12.6", "v1.35.2"),
            &rs("v1.13.9", "v1.36.1"),
            &c,
            &opts,
        );
        let stages: Vec<StageId> = p.stages.iter().map(|s| s.id).collect();
        assert!(!stages.contains(&StageId::Workers), "{stages:?}");
        assert_eq!(
            p.stages[0]
                .steps
                .iter()
                .flat_map(|s| s.nodes.clone())
                .count(),
            7
        );
        assert!(
            p.notes.iter().any(
                |n| n.contains("drained twice") && n.contains("Talos 1.12 supports Kubernetes")
            ),
            "{:?}",
            p.notes
        );
        // Asked for: two passes.
        let two = PlanOptions {
            two_pass: true,
            ..opts.clone()
        };
        let p = build_with(
            &rs("v1.12.6", "v1.33.5"),
            &rs("v1.12.9", "v1.34.1"),
            &c,
            &two,
        );
        assert!(p.stages.iter().all(|s| s.id != StageId::Workers));
        assert!(
            p.notes.iter().any(|n| n.contains("--two-pass")),
            "{:?}",
            p.notes
        );
        let c2 = cluster("  rollout: {maxUnavailable: 2, twoPass: true}\n");
        let p = build_with(
            &rs("v1.12.6", "v1.33.5"),
            &rs("v1.12.9", "v1.34.1"),
            &c2,
            &opts,
        );
        assert!(
            p.notes.iter().any(|n| n.contains("spec.rollout.twoPass")),
            "{:?}",
            p.notes
        );
        // A Talos-only or Kubernetes-only bump is as before.
        let p = build_with(
            &rs("v1.12.6", "v1.33.5"),
            &rs("v1.12.9", "v1.33.5"),
            &c,
            &opts,
        );
        assert!(p.stages.iter().all(|s| s.id != StageId::Workers));
        let p = build_with(
            &rs("v1.12.9", "v1.33.5"),
            &rs("v1.12.9", "v1.34.1"),
            &c,
            &opts,
        );
        assert!(p.stages.iter().all(|s| s.id != StageId::Workers));
    }

    #[test]
    fn what_is_left_closes_up_and_keeps_verify() {
        let c = cluster("  rollout: {maxUnavailable: 2}\n");
        let p = build(&rs("v1.12.6", "v1.33.5"), &rs("v1.12.9", "v1.33.5"), &c);
        let left = p.left(|stage, s| stage == StageId::Talos && s.id.starts_with("talos/cp-"));
        let ids: Vec<&str> = left.steps().map(|s| s.id.as_str()).collect();
        assert!(!ids.iter().any(|i| i.starts_with("talos/cp-")), "{ids:?}");
        assert_eq!(ids.last(), Some(&"verify"));
        assert_eq!(left.steps().next().map(|s| s.start_secs), Some(0));
        assert_eq!(left.estimate_secs, p.estimate_secs - 3 * 480);
        assert!(left.notes[0].contains("3 steps an earlier run finished are left out"));
        // Everything done still verifies.
        let all = p.left(|_, _| true);
        assert_eq!(all.steps().count(), 1);
        assert_eq!(p.left(|_, _| false), p);
    }

    #[test]
    fn the_etcd_leader_is_planned_last_among_the_control_planes_talos_steps() {
        let c = cluster("  rollout: {maxUnavailable: 2}\n");
        let (base, head) = (rs("v1.12.6", "v1.33.5"), rs("v1.12.9", "v1.33.7"));
        let opts = PlanOptions {
            etcd_leader: Some("cp-1".into()),
            ..PlanOptions::default()
        };
        let p = build_with(&base, &head, &c, &opts);
        let cps: Vec<&str> = p.stages[0]
            .steps
            .iter()
            .filter(|s| s.id.starts_with("talos/cp-"))
            .map(|s| s.id.as_str())
            .collect();
        assert_eq!(cps, ["talos/cp-2", "talos/cp-3", "talos/cp-1"]);
        // The Kubernetes stages keep the plain order: the run takes them as planned.
        assert_eq!(p.stages[1].steps[0].id, "apiserver/cp-1");
        let plain = build(&base, &head, &c);
        assert_eq!(plain.stages[0].steps[0].id, "talos/cp-1");
    }

    #[test]
    fn the_estimate_includes_the_health_gates_stable_for() {
        let checks = "  healthChecks:\n    - {name: a, when: [before, after], stableFor: 2m, kubernetes: {apiVersion: v1, kind: Node, name: cp-1, expression: 'true'}}\n    - {name: b, when: [between], stableFor: 30s, kubernetes: {apiVersion: v1, kind: Node, name: cp-1, expression: 'true'}}\n";
        let rollout = "  rollout: {maxUnavailable: 2}\n";
        let (base, head) = (rs("v1.12.6", "v1.33.5"), rs("v1.12.9", "v1.33.5"));
        let plain = build(&base, &head, &cluster(rollout));
        let gated = build(&base, &head, &cluster(&format!("{rollout}{checks}")));
        // 3 control planes and 4 workers: a `between` gate after each but the last.
        assert_eq!(
            gated.estimate_secs,
            plain.estimate_secs + 120 + 6 * 30 + 120,
            "{gated:#?}"
        );
        let first = gated.steps().next().unwrap();
        assert_eq!(first.start_secs, 120, "the before gate comes first");
        // The timeline stays gap-free and ends at the estimate.
        let steps: Vec<&Step> = gated.steps().collect();
        for pair in steps.windows(2) {
            assert_eq!(
                pair[1].start_secs,
                pair[0].start_secs + pair[0].duration_secs
            );
        }
        let last = steps[steps.len() - 1];
        assert_eq!(last.kind, StepKind::Verify);
        assert_eq!(last.start_secs + last.duration_secs, gated.estimate_secs);
        // A batch of two workers waits at a gate after each of them, but the last unit
        // of all has none.
        let batches: Vec<(&Step, &Step)> = gated
            .steps()
            .zip(plain.steps())
            .filter(|(g, _)| g.is_worker_batch())
            .collect();
        let added: Vec<u64> = batches
            .iter()
            .map(|(g, p)| g.duration_secs - p.duration_secs)
            .collect();
        let last_nodes = batches[batches.len() - 1].0.nodes.len() as u64;
        assert_eq!(added[added.len() - 1], (last_nodes - 1) * 30);
        assert!(
            gated.notes.iter().any(|n| n.contains(
                "2m before, 30s at each of 6 gates after a node or batch, 2m at the final verify"
            )),
            "{:?}",
            gated.notes
        );
        assert!(!plain.notes.iter().any(|n| n.contains("health gates")));
    }

    #[test]
    fn talos_then_kubernetes_in_the_design_order() {
        let c = cluster("  rollout: {maxUnavailable: 2}\n");
        let p = build(&rs("v1.12.6", "v1.33.5"), &rs("v1.13.9", "v1.34.1"), &c);
        let stages: Vec<StageId> = p.stages.iter().map(|s| s.id).collect();
        assert_eq!(
            stages,
            [
                StageId::Talos,
                StageId::KubeApiserver,
                StageId::KubeControllerManagerScheduler,
                StageId::KubeProxyManifests,
                StageId::Kubelet,
                StageId::Verify
            ]
        );
        let talos: Vec<&str> = p.stages[0].steps.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(
            &talos[..3],
            ["talos/cp-1", "talos/cp-2", "talos/cp-3"],
            "control planes one at a time, in order"
        );
        // Workers: w-1 shares a volume with w-2 and with w-3; at most 2 at once.
        for s in &p.stages[0].steps[3..] {
            assert!(s.nodes.len() <= 2);
            assert!(
                !(s.nodes.contains(&"w-1".to_string())
                    && (s.nodes.contains(&"w-2".to_string())
                        || s.nodes.contains(&"w-3".to_string())))
            );
        }
        assert_eq!(
            p.worker_batches.count, p.worker_batches.lower_bound,
            "{:?}",
            p.worker_batches
        );
        let kubelets = &p.stages[4].steps;
        assert_eq!(kubelets[0].id, "kubelet/cp-1");
        assert!(kubelets[3].id.starts_with("kubelet/workers-"));
        // Steps are sequential and the estimate is their sum.
        let mut at = 0;
        for s in p.steps() {
            assert_eq!(s.start_secs, at);
            at += s.duration_secs;
        }
        assert_eq!(p.estimate_secs, at);
        let pairs: Vec<(String, String)> = p
            .pairings
            .iter()
            .map(|x| (x.talos.tag(), x.kubernetes.tag()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("v1.12.6".into(), "v1.33.5".into()),
                ("v1.13.9".into(), "v1.33.5".into()),
                ("v1.13.9".into(), "v1.34.1".into())
            ]
        );
    }

    #[test]
    fn a_kubernetes_patch_skips_talos_and_kube_proxy_when_replaced() {
        let c = cluster("  cni: {replacesKubeProxy: true}\n");
        let p = build(&rs("v1.12.6", "v1.33.5"), &rs("v1.12.6", "v1.33.7"), &c);
        assert_eq!(p.stages[0].id, StageId::KubeApiserver);
        let manifests = p
            .stages
            .iter()
            .find(|s| s.id == StageId::KubeProxyManifests)
            .unwrap();
        assert_eq!(manifests.steps[0].kind, StepKind::Manifests);
        assert!(p.notes.iter().any(|n| n.contains("CNI replaces")));
    }

    #[test]
    fn nothing_to_do_is_said() {
        let c = cluster("");
        let p = build(&rs("v1.12.6", "v1.33.5"), &rs("v1.12.6", "v1.33.5"), &c);
        assert!(p.stages.is_empty());
        assert_eq!(p.estimate_secs, 0);
        assert!(p.notes[0].contains("nothing to roll out"));
    }

    #[test]
    fn renderings_carry_every_step() {
        let c = cluster("");
        let p = build(&rs("v1.12.6", "v1.33.5"), &rs("v1.13.9", "v1.33.5"), &c);
        let gantt = p.render_mermaid();
        assert!(gantt.starts_with("gantt\n"));
        assert_eq!(
            gantt
                .lines()
                .filter(|l| l.contains("s\n") || l.trim_end().ends_with('s') && l.contains(" :"))
                .count(),
            p.steps().count()
        );
        assert!(p
            .render_text()
            .contains("Stage 1 — Talos v1.12.6 → v1.13.9"));
        assert!(p.render_markdown().contains("```mermaid"));
    }

    fn node(name: &str, role: Role, talos: &str) -> Node {
        Node {
            name: name.to_string(),
            role,
            talos: Version::parse(talos).unwrap(),
            kubelet: Version::parse("v1.33.5").unwrap(),
            volumes: vec![],
        }
    }

    /// A cluster document with only a rollout policy and a volume provider; the nodes are
    /// passed to `plan` directly.
    fn spec(provider: &str, max_unavailable: u32) -> ClusterSpec {
        let text = format!(
            "apiVersion: ichor.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: t}}\nspec:\n  rollout: {{maxUnavailable: {max_unavailable}}}\n  volumes: {{provider: {provider}}}\n"
        );
        Cluster::parse("c", &text).unwrap().spec
    }

    fn plan_nodes(
        spec: &ClusterSpec,
        nodes: &[Node],
        head: (&str, &str),
    ) -> Result<Plan, PlanError> {
        let bump = Bump::between(&rs("v1.12.6", "v1.33.5"), &rs(head.0, head.1));
        plan("t", &bump, spec, nodes, &PlanOptions::default())
    }

    #[test]
    fn a_single_control_plane_is_warned_about_not_promised_quorum() {
        let nodes = [
            node("cp-1", Role::Controlplane, "v1.12.6"),
            node("w-1", Role::Worker, "v1.12.6"),
        ];
        let p = plan_nodes(&spec("none", 1), &nodes, ("v1.13.9", "v1.34.1")).unwrap();
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert!(p.warnings[0].contains("cp-1 is the only control plane"));
        assert!(p.warnings[0].contains("Kubernetes API is unavailable"));
        assert!(p.warnings[0].contains("reboots for Talos and while kube-apiserver restarts"));
        assert!(
            p.steps().all(|s| !s.description.contains("quorum checked")),
            "{:#?}",
            p.steps().collect::<Vec<_>>()
        );
        let text = p.render_text();
        assert!(
            text.contains("\nwarning: cp-1 is the only control plane"),
            "{text}"
        );
        assert!(
            text.contains("1 control plane, 1 worker, workers in 1 batch "),
            "{text}"
        );
        assert!(p
            .render_markdown()
            .contains("> [!WARNING]\n> cp-1 is the only"));

        // Two members cannot keep quorum either; three can, and get no warning.
        let mut nodes = nodes.to_vec();
        nodes.push(node("cp-2", Role::Controlplane, "v1.12.6"));
        let p = plan_nodes(&spec("none", 1), &nodes, ("v1.13.9", "v1.33.5")).unwrap();
        assert!(
            p.warnings[0].contains("etcd has no member to spare"),
            "{:?}",
            p.warnings
        );
        nodes.push(node("cp-3", Role::Controlplane, "v1.12.6"));
        let p = plan_nodes(&spec("none", 1), &nodes, ("v1.13.9", "v1.33.5")).unwrap();
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert!(p
            .steps()
            .next()
            .unwrap()
            .description
            .contains("etcd quorum checked"));
    }

    #[test]
    fn volume_checks_are_promised_only_for_a_provider() {
        let nodes = [node("cp-1", Role::Controlplane, "v1.12.6")];
        let verify = |provider| {
            let p = plan_nodes(&spec(provider, 1), &nodes, ("v1.12.9", "v1.33.5")).unwrap();
            p.steps().last().unwrap().description.clone()
        };
        assert!(!verify("none").contains("volume"), "{}", verify("none"));
        assert!(verify("longhorn").contains("Longhorn volumes healthy"));
        assert!(verify("local-path").contains("local-path volumes healthy"));
    }

    /// Issue 43 F1: the work is what the nodes run against the target. A commit on top of
    /// a paused kubelet bump changes no version, yet the workers the bump had not reached
    /// are still planned, each stage titled from what runs.
    #[test]
    fn kubelets_left_behind_are_planned_when_the_commits_differ_in_no_version() {
        let mut nodes = vec![
            node("cp-1", Role::Controlplane, "v1.12.6"),
            node("w-1", Role::Worker, "v1.12.6"),
            node("w-2", Role::Worker, "v1.12.6"),
        ];
        nodes[0].kubelet = Version::parse("v1.33.7").unwrap();
        let same = rs("v1.12.6", "v1.33.7");
        let bump = Bump::between(&same, &same);
        let p = plan(
            "t",
            &bump,
            &spec("none", 1),
            &nodes,
            &PlanOptions::default(),
        )
        .unwrap();
        let kubelets: Vec<&str> = p
            .steps()
            .filter(|s| s.kind == StepKind::Kubelet)
            .flat_map(|s| s.nodes.iter().map(String::as_str))
            .collect();
        assert_eq!(kubelets, ["w-1", "w-2"], "{:#?}", p.stages);
        let titles: Vec<&str> = p.stages.iter().map(|s| s.title.as_str()).collect();
        assert!(
            titles.contains(&"kube-apiserver v1.33.5 → v1.33.7"),
            "{titles:?}"
        );
        assert_eq!(p.stages.last().map(|s| s.id), Some(StageId::Verify));
        // Every node at the target: nothing to roll out, said as what runs.
        for n in &mut nodes {
            n.kubelet = Version::parse("v1.33.7").unwrap();
        }
        let p = plan(
            "t",
            &bump,
            &spec("none", 1),
            &nodes,
            &PlanOptions::default(),
        )
        .unwrap();
        assert!(p.stages.is_empty(), "{:#?}", p.stages);
        assert_eq!(
            p.notes,
            ["nothing to roll out: every node already runs Talos v1.12.6 and kubelet v1.33.7"]
        );
    }

    /// A resumed Talos stage is titled from the oldest version still running, not from the
    /// commit's base (which would read `v1.12.9 → v1.12.9`).
    #[test]
    fn a_resumed_talos_stage_is_titled_from_what_runs() {
        let nodes = vec![
            node("cp-1", Role::Controlplane, "v1.12.9"),
            node("w-1", Role::Worker, "v1.12.6"),
        ];
        let same = rs("v1.12.9", "v1.33.5");
        let p = plan(
            "t",
            &Bump::between(&same, &same),
            &spec("none", 1),
            &nodes,
            &PlanOptions::default(),
        )
        .unwrap();
        assert_eq!(
            p.stages[0].title, "Talos v1.12.6 → v1.12.9",
            "{:#?}",
            p.stages
        );
    }

    #[test]
    fn worker_steps_say_where_each_node_comes_from() {
        let mut nodes = vec![
            node("cp-1", Role::Controlplane, "v1.12.6"),
            node("w-1", Role::Worker, "v1.12.6"),
            node("w-2", Role::Worker, "v1.12.6"),
        ];
        let p = plan_nodes(&spec("none", 2), &nodes, ("v1.12.9", "v1.33.7")).unwrap();
        let descriptions: Vec<&str> = p.steps().map(|s| s.description.as_str()).collect();
        assert!(
            descriptions.contains(&"workers w-1, w-2: Talos v1.12.6 → v1.12.9"),
            "{descriptions:#?}"
        );
        assert!(
            descriptions.contains(&"kubelets on workers w-1, w-2: v1.33.5 → v1.33.7"),
            "{descriptions:#?}"
        );
        nodes[2].talos = Version::parse("1.12.5").unwrap();
        let p = plan_nodes(&spec("none", 2), &nodes, ("v1.12.9", "v1.33.5")).unwrap();
        let descriptions: Vec<&str> = p.steps().map(|s| s.description.as_str()).collect();
        assert!(
            descriptions.contains(&"workers w-1 (v1.12.6), w-2 (1.12.5): Talos → v1.12.9"),
            "versions as written, per node: {descriptions:#?}"
        );
    }

    #[test]
    fn a_plan_with_nothing_to_do_says_so_plainly() {
        let c = cluster("");
        let p = build(&rs("v1.12.6", "v1.33.5"), &rs("v1.12.6", "v1.33.5"), &c);
        let text = p.render_text();
        let headline = text.lines().nth(1).unwrap_or("");
        assert_eq!(
            headline,
            "nothing to roll out: every node already runs Talos v1.12.6 and kubelet v1.33.5"
        );
        assert!(
            !text.contains("batch") && !text.contains("estimated"),
            "{text}"
        );
        assert_eq!(text.matches("nothing to roll out").count(), 1, "{text}");
        let md = p.render_markdown();
        assert!(md.contains("\n\nnothing to roll out: every node"), "{md}");
        assert!(!md.contains("```mermaid"), "no empty chart: {md}");
    }

    #[test]
    fn an_ichor_node_outside_the_inventory_is_refused_naming_the_nodes() {
        let c = cluster("");
        let (base, head) = (rs("v1.12.6", "v1.33.5"), rs("v1.12.9", "v1.33.5"));
        let nodes = c.spec.inventory.as_ref().unwrap().resolve(&base);
        let opts = |n: &str| PlanOptions {
            ichor_node: Some(n.to_string()),
            ..PlanOptions::default()
        };
        let err = plan(
            "t",
            &Bump::between(&base, &head),
            &c.spec,
            &nodes,
            &opts("nosuch"),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "--ichor-node `nosuch` is not a node in the inventory (nodes: cp-1, cp-2, cp-3, w-1, w-2, w-3, w-4)"
        );
        assert!(plan(
            "t",
            &Bump::between(&base, &head),
            &c.spec,
            &nodes,
            &opts("w-2")
        )
        .is_ok());

        let many: Vec<Node> = (0..25)
            .map(|i| node(&format!("n-{i:02}\u{1b}[2J"), Role::Worker, "v1.12.6"))
            .collect();
        let err = plan(
            "t",
            &Bump::between(&base, &head),
            &c.spec,
            &many,
            &opts("\u{1b}]0;x"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.ends_with("n-09\\u{1b}[2J and 15 more)"), "{err}");
        assert!(err.starts_with("--ichor-node `\\u{1b}]0;x`"), "{err}");
        assert!(!err.contains('\u{1b}'), "{err}");
    }

    #[test]
    fn estimates_saturate_instead_of_wrapping() {
        let mut s = spec("none", 1);
        s.rollout.estimates.talos_node = HumanDuration::from_secs(u64::MAX);
        let nodes = [
            node("cp-1", Role::Controlplane, "v1.12.6"),
            node("w-1", Role::Worker, "v1.12.6"),
        ];
        let p = plan_nodes(&s, &nodes, ("v1.12.9", "v1.33.5")).unwrap();
        assert_eq!(p.estimate_secs, u64::MAX);
        let starts: Vec<u64> = p.steps().map(|s| s.start_secs).collect();
        assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");
        let text = p.render_text();
        assert!(text.contains("estimated 213503982334601d7h15s"), "{text}");
        let gantt = p.render_mermaid();
        assert!(gantt.contains("too long to draw"), "{gantt}");
        assert!(
            !gantt.contains("section"),
            "no chart Mermaid cannot date: {gantt}"
        );
    }

    #[test]
    fn plans_longer_than_a_day_count_days() {
        let mut s = spec("none", 1);
        s.rollout.estimates.talos_node = HumanDuration::from_secs(10 * 3600);
        let nodes: Vec<Node> = (1..=6)
            .map(|i| node(&format!("w-{i}"), Role::Worker, "v1.12.6"))
            .collect();
        let p = plan_nodes(&s, &nodes, ("v1.12.9", "v1.33.5")).unwrap();
        let text = p.render_text();
        assert!(text.contains("  6. 2d02:00 +10h "), "{text}");
        let gantt = p.render_mermaid();
        assert!(gantt.contains("axisFormat day %-j %H:%M"), "{gantt}");
        assert!(
            gantt.contains(":talos-workers-6, 2000-01-03 02:00:00, 36000s"),
            "{gantt}"
        );
    }

    /// Names a pull request could carry if nothing refused them at parse time.
    const HOSTILE: &[&str] = &[
        "cp-1\nsection injected",
        "```\n# owned\n```",
        "<script>alert(1)</script>",
        "a|b|c",
        "%%{init: {'theme': 'dark'}}%%",
        "click x call alert()",
        "\u{1b}[2J\u{1b}[31mred",
        "- item",
        "1. one",
        "> quote",
        "w: x; #1",
    ];

    fn hostile_plan() -> Plan {
        let mut nodes = vec![node(HOSTILE[0], Role::Controlplane, "v1.12.6")];
        for h in &HOSTILE[1..] {
            let mut n = node(h, Role::Worker, "v1.12.6");
            n.volumes = vec![format!("{h}-vol")];
            nodes.push(n);
        }
        let bump = Bump::between(&rs("v1.12.6", "v1.33.5"), &rs("v1.12.9", "v1.33.7"));
        plan(
            HOSTILE[2],
            &bump,
            &spec("longhorn", 3),
            &nodes,
            &PlanOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn hostile_names_stay_text_in_the_terminal() {
        let p = hostile_plan();
        let text = p.render_text();
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        let step_lines = text
            .lines()
            .filter(|l| {
                let t = l.trim_start();
                t.split_once(". ")
                    .is_some_and(|(n, _)| n.parse::<usize>().is_ok())
                    && l.starts_with("  ")
            })
            .count();
        assert_eq!(step_lines, p.steps().count(), "one line per step: {text}");
        assert!(text.contains("cp-1\\nsection injected"), "{text}");
    }

    #[test]
    fn hostile_names_stay_text_in_markdown() {
        let p = hostile_plan();
        let md = p.render_markdown();
        assert_eq!(md.matches("```").count(), 2, "only the mermaid fence: {md}");
        let (header, rest) = md.split_once('\n').unwrap();
        assert!(
            header.starts_with("### ichor plan — `<script>alert(1)</script>`: "),
            "the cluster name is code: {header}"
        );
        assert!(!rest.contains('<'), "no HTML: {md}");
        assert!(!md.contains('\u{1b}'));
        let (prose, chart) = rest.split_once("```mermaid\n").unwrap();
        let mut list_items = 0;
        for line in prose.lines().filter(|l| !l.is_empty()) {
            let item = line
                .split_once(". `")
                .is_some_and(|(n, _)| n.parse::<usize>().is_ok());
            list_items += usize::from(item);
            assert!(
                item || line.starts_with("**")
                    || line.starts_with("> ")
                    || line.starts_with("- ")
                    || line.starts_with("1 control plane, "),
                "unexpected block: {line:?}\n{md}"
            );
            // Every pipe is escaped: no table can form.
            assert!(
                line.match_indices('|')
                    .all(|(i, _)| line[..i].ends_with('\\')),
                "{line:?}"
            );
        }
        assert_eq!(list_items, p.steps().count(), "{md}");
        assert_eq!(chart, format!("{}```\n", p.render_mermaid()));
    }

    #[test]
    fn hostile_names_stay_text_in_mermaid() {
        let p = hostile_plan();
        let gantt = p.render_mermaid();
        let mut lines = gantt.lines();
        assert_eq!(lines.next(), Some("gantt"));
        let mut tasks = 0;
        let mut ids = std::collections::HashSet::new();
        for line in lines {
            let body = line
                .strip_prefix("    ")
                .unwrap_or_else(|| panic!("{line:?}"));
            if body.starts_with("axisFormat ")
                || body == "todayMarker off"
                || body == "dateFormat YYYY-MM-DD HH:mm:ss"
            {
                continue;
            }
            // Outside our own settings, `%`, `:`, `;` and `#` appear only in entity codes.
            let text = body.split(" :").next().unwrap_or("");
            let bare = crate::escape::tests::without_entity_codes(text);
            assert!(!bare.contains(['%', ':', ';', '#']), "{line:?}");
            if body.starts_with("title ") || body.starts_with("section ") {
                continue;
            }
            tasks += 1;
            let (name, data) = body.split_once(" :").unwrap_or_else(|| panic!("{line:?}"));
            assert!(!name.contains(':'), "{line:?}");
            let lower = name.to_ascii_lowercase();
            for k in ["click", "call", "section", "title", "href", "gantt"] {
                assert!(!lower.starts_with(k), "{line:?}");
            }
            let fields: Vec<&str> = data.split(", ").collect();
            assert_eq!(fields.len(), 3, "{line:?}");
            assert!(fields[0]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
            assert!(ids.insert(fields[0].to_string()), "ids are unique: {gantt}");
        }
        assert_eq!(tasks, p.steps().count(), "{gantt}");
    }
}
