//! Before the Kubernetes stages: the live pre-checks again (the Talos stage changed what
//! nodes run), and the CNI or an add-on that must move first waited for.

use super::{Flow, Run, WAIT_EVERY};
use crate::gate::Change;
use crate::plan::StageId;
use crate::policy::Status;
use crate::releaseset::Version;

impl Run<'_, '_> {
    /// Before any kubelet moves (the kubelet stage, the one-drain worker stage): every
    /// control plane's kube-apiserver runs the target and is Ready, as the Kubernetes API
    /// shows, so no kubelet is ever newer than an apiserver — judged live, not from the
    /// record's finished stages (a restarted engine, an apiserver rolled back by hand).
    pub(super) async fn apiservers_on_target(&self, stage: StageId) -> Flow<()> {
        let e = self.engine;
        let tag = self.target.kubernetes.tag();
        let pods = self
            .kube(stage, None, "list mirror pods", || e.kube.mirror_pods())
            .await?;
        let cps: Vec<String> = self
            .live_nodes(stage)
            .await?
            .into_iter()
            .filter(|n| n.role == crate::releaseset::Role::Controlplane)
            .map(|n| n.name)
            .collect();
        let behind: Vec<String> = cps
            .iter()
            .filter(|cp| {
                !pods.iter().any(|p| {
                    &p.node == *cp
                        && p.component == "kube-apiserver"
                        && crate::kube::inventory::image_tag(&p.image) == Some(tag.as_str())
                        && p.ready
                })
            })
            .cloned()
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        Err(self.pause(
            stage,
            None,
            format!(
                "kube-apiserver does not run {tag} (Ready) on {}: no kubelet may be newer than an apiserver, so no kubelet moves; bring the apiservers to {tag}, then resume",
                behind.join(", ")
            ),
        ))
    }

    /// Before anything is touched: the live pre-checks, and a start only when none fails
    /// or waits. A wait (a NotReady node, an etcd member not healthy) is reported and
    /// recorded, and the rollout starts once it clears; a failure pauses with nothing
    /// changed. A rollout already begun (a step in the record) has passed this.
    pub(super) async fn before_start(&self) -> Flow<()> {
        let stage = self.plan.stages.first().map_or(StageId::Talos, |s| s.id);
        self.single_node_accepted(stage).await?;
        let Some(change) = self.change else {
            return Ok(());
        };
        if self.begun().await {
            return Ok(());
        }
        let e = self.engine;
        let subject = crate::gate::live::Subject::of(change)
            .with_prometheus_credential(e.prometheus_credential.clone());
        let start = self.now();
        let timeout = e.policy.node_timeout.as_duration();
        loop {
            if let Some(why) = e.pause_requested.and_then(|f| f()) {
                return Err(self.pause(stage, None, why));
            }
            let facts = crate::gate::live::observe(e.kube, Some(e.talos), &subject).await;
            let items = crate::gate::live::items(change, &facts);
            let open: Vec<&crate::policy::CheckItem> = items
                .iter()
                // The lock is ours; the CNI is waited for before the apiservers; a single
                // node was judged above, from the engine's own policy.
                .filter(|i| {
                    // The `before` health checks are the rollout's own gate (stableFor, timeout).
                    !i.id.starts_with("live/health/")
                        && !i.id.ends_with("rollout-lock")
                        && i.id != "live/cni-running"
                        && i.id != "live/single-node"
                })
                .filter(|i| matches!(i.status, Status::Fail | Status::Wait))
                .collect();
            let say = |s: Status| -> Vec<String> {
                open.iter()
                    .filter(|i| i.status == s)
                    .map(|i| format!("{}: {}", i.id, i.message))
                    .collect()
            };
            let failing = say(Status::Fail);
            if !failing.is_empty() {
                return Err(self.pause(
                    stage,
                    None,
                    format!(
                        "the live pre-checks refuse the start, nothing was changed: {}",
                        failing.join("; ")
                    ),
                ));
            }
            let waits = say(Status::Wait);
            if waits.is_empty() {
                return self.waiting(stage, None).await;
            }
            // Waited on up to the node timeout, then a human looks.
            if self.now().since(start) >= timeout {
                return Err(self.pause(
                    stage,
                    None,
                    format!(
                        "the live pre-checks still wait after {}s, nothing was changed: {}",
                        self.now().since(start).as_secs(),
                        waits.join("; ")
                    ),
                ));
            }
            self.waiting(
                stage,
                Some(format!(
                    "the rollout starts once the live pre-checks pass ({})",
                    waits.join("; ")
                )),
            )
            .await?;
            e.clock.sleep(WAIT_EVERY).await;
        }
    }

    /// Before stage (a): the Talos stage changed what nodes run, so the live pre-checks run
    /// again (skew, pairing, Ready, the CNI hand-over); a CNI that must move first is waited
    /// for, reported, up to the node timeout.
    pub(super) async fn before_kubernetes(&self) -> Flow<()> {
        let stage = StageId::KubeApiserver;
        let Some(change) = self.change else {
            return Ok(());
        };
        let e = self.engine;
        let subject = crate::gate::live::Subject::of(change)
            .with_prometheus_credential(e.prometheus_credential.clone());
        let start = self.now();
        let timeout = e.policy.node_timeout.as_duration();
        loop {
            let facts = crate::gate::live::observe(e.kube, Some(e.talos), &subject).await;
            let items = crate::gate::live::items(change, &facts);
            let blocking: Vec<&crate::policy::CheckItem> = items
                .iter()
                // The lock is ours; etcd was checked before each control plane.
                .filter(|i| !i.id.ends_with("rollout-lock") && i.id != "live/single-node")
                .filter(|i| matches!(i.status, Status::Fail | Status::Wait))
                .collect();
            let mut why: Vec<String> = blocking
                .iter()
                .map(|i| format!("{}: {}", i.id, i.message))
                .collect();
            // A failure pauses at once; a wait (an etcd member catching up after its
            // reboot, a node not Ready yet, the CNI or an add-on that Argo CD or Flux still
            // moves — ichor never applies them) is waited for, up to the node timeout.
            let fail_now = blocking.iter().any(|i| i.status == Status::Fail);
            if !fail_now {
                why.extend(self.addons_behind(change).await?);
            }
            if why.is_empty() {
                return self.waiting(stage, None).await;
            }
            if fail_now || self.now().since(start) >= timeout {
                return Err(self.pause(
                    stage,
                    None,
                    format!(
                        "the live pre-checks before the Kubernetes stages do not pass{}: {}",
                        if fail_now {
                            String::new()
                        } else {
                            format!(" after {}s", self.now().since(start).as_secs())
                        },
                        why.join("; ")
                    ),
                ));
            }
            self.waiting(
                stage,
                Some(format!(
                    "the Kubernetes stages start once the live pre-checks pass ({})",
                    why.join("; ")
                )),
            )
            .await?;
            e.clock.sleep(WAIT_EVERY).await;
        }
    }

    /// Add-ons of the release set, found where they install themselves, whose running
    /// version does not support the target Kubernetes or that are still rolling out to the
    /// release set's version: each as a reason to wait.
    pub(super) async fn addons_behind(&self, change: &Change) -> Flow<Vec<String>> {
        let stage = StageId::KubeApiserver;
        let e = self.engine;
        let k8s = &self.target.kubernetes;
        let mut out = Vec::new();
        for a in &change.head_release_set.spec.addons {
            let Some((kind, ns, name)) = crate::gate::live::addon_workload(&a.name) else {
                continue;
            };
            let what = format!("get {kind} {ns}/{name}");
            let w = if kind == "Deployment" {
                self.kube(stage, None, &what, || e.kube.deployment(ns, name))
                    .await?
            } else {
                self.kube(stage, None, &what, || e.kube.daemonset(ns, name))
                    .await?
            };
            let Some(w) = w else { continue };
            let Some(running) = w.version.as_deref().and_then(|v| Version::parse(v).ok()) else {
                continue;
            };
            let unsupported = change.policies.supports(&a.name, &running, k8s) == Some(false);
            let rolling = running != a.version && !w.rolled_out();
            if unsupported || rolling {
                out.push(format!(
                    "{} {ns}/{name} runs {running}{}, the release set says {}",
                    a.name,
                    if unsupported {
                        format!(", which does not support Kubernetes {k8s}")
                    } else {
                        format!(" ({}/{} updated)", w.updated, w.desired)
                    },
                    a.version
                ));
            }
        }
        Ok(out)
    }
}
