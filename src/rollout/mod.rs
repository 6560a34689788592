//! The rollout engine, first stage: Talos, node by node, in the plan's order (control planes
//! one at a time, then the worker batches), each node driven by [`step::talos_node`] from
//! what is observed. It holds the cluster's lock (a Lease) for the whole stage and stops the
//! moment the lock is lost; any failure pauses with its root cause, and a node ichor
//! cordoned that is healthy and not mid-upgrade is uncordoned on pause.
//!
//! Then the Kubernetes stages (ADR 0057): kube-apiserver on each control plane, then
//! controller-manager and scheduler, then the kubelets — control planes, then workers, each
//! cordoned and drained. A component switch is the image-field-only edit of the node's own
//! machine configuration, images pre-pulled, a dry run, then NO_REBOOT with its own
//! deadline, verified from the Kubernetes API (the mirror pod on the target tag and Ready;
//! the kubelet's version and Ready). No kubelet moves before every apiserver runs the target.
//!
//! Not yet here (issue 7): kube-proxy and the bootstrap-manifest sync, the rollout record in the cluster
//! (markers live in memory, so a restart re-derives each node from what it observes and
//! only loses a node's deadline), maintenance windows, holds and parallel batches (a batch's
//! nodes go one after another, which is safe but slower).

pub mod step;

use std::time::Duration;

use crate::clock::Clock;
use crate::gate::live::{lock_name, ICHOR_NAMESPACE};
use crate::kube::{DrainOutcome, KubeClient, LiveNode, LockState};
use crate::plan::{Plan, StageId};
use crate::releaseset::{Role, RolloutPolicy, Version};
use crate::talos::client::{CallOptions, ImageNamespace, UpgradeApi};
use crate::talos::machine_config::{set_images, Component};
use crate::talos::proto::machine::apply_configuration_request::Mode as ApplyMode;
use crate::talos::TalosClient;

use step::{Action, NodeObservation, StepMarker, StepState};

/// How long the lock is held without renewal; renewed on every observation.
const LOCK_DURATION: Duration = Duration::from_secs(60);
/// How often a settling node is observed again.
const OBSERVE_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Kube(#[from] crate::kube::KubeError),
    #[error("node {0} is in the plan but not in the cluster")]
    UnknownNode(String),
}

/// Calls about `node` never travel through `node` itself: it is the one that reboots.
fn around(node: &LiveNode) -> CallOptions<'_> {
    CallOptions {
        avoid: Some(&node.name),
        ..CallOptions::default()
    }
}

/// How a stage ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageOutcome {
    Completed {
        nodes: Vec<String>,
    },
    /// Stopped for a human: which node, and why (what was observed, what would unblock it).
    Paused {
        node: String,
        reason: String,
    },
}

/// What the engine needs: the clients, ichor's clock, who it is, and the cluster's policy.
pub struct Rollout<'a> {
    pub kube: &'a KubeClient,
    pub talos: &'a TalosClient,
    pub clock: Clock,
    pub cluster: String,
    /// This engine's identity in the lock.
    pub holder: String,
    pub policy: RolloutPolicy,
    /// The installer image without a tag (`cluster.yaml` `spec.talos.installerImage`).
    pub installer_image: String,
    /// Where progress goes, one line per thing done (a terminal, a PR comment, a log).
    pub report: Option<&'a (dyn Fn(String) + Sync)>,
}

impl Rollout<'_> {
    fn say(&self, line: String) {
        if let Some(r) = self.report {
            r(line);
        }
    }

    async fn hold_lock(&self) -> Result<Option<String>, RolloutError> {
        self.kube.ensure_namespace(ICHOR_NAMESPACE).await?;
        match self
            .kube
            .acquire_lease(
                ICHOR_NAMESPACE,
                &lock_name(&self.cluster),
                &self.holder,
                LOCK_DURATION,
                self.clock.now(),
            )
            .await?
        {
            LockState::Held => Ok(None),
            LockState::HeldBy { holder } => Ok(Some(holder)),
        }
    }

    /// Run the plan's Talos stage to `target`, on the cluster's `nodes` as they run.
    pub async fn talos_stage(
        &self,
        plan: &Plan,
        target: &Version,
        nodes: &[LiveNode],
    ) -> Result<StageOutcome, RolloutError> {
        if let Some(other) = self.hold_lock().await? {
            return Ok(StageOutcome::Paused {
                node: String::new(),
                reason: format!("another rollout holds the lock ({other})"),
            });
        }
        let mut done = Vec::new();
        let steps = plan
            .stages
            .iter()
            .filter(|s| s.id == StageId::Talos)
            .flat_map(|s| s.steps.iter());
        for step in steps {
            for name in &step.nodes {
                let node = nodes
                    .iter()
                    .find(|n| &n.name == name)
                    .ok_or_else(|| RolloutError::UnknownNode(name.clone()))?;
                match self.talos_node(node, target).await? {
                    None => done.push(name.clone()),
                    Some(reason) => {
                        self.release_on_pause(node).await;
                        return Ok(StageOutcome::Paused {
                            node: name.clone(),
                            reason,
                        });
                    }
                }
            }
        }
        self.release_lock().await;
        Ok(StageOutcome::Completed { nodes: done })
    }

    /// Run the plan's Kubernetes stages to `target` (kube-apiserver, controller-manager and
    /// scheduler, kubelets). Stages this slice does not run yet (kube-proxy and the
    /// bootstrap manifests) pause before the kubelets with that reason.
    pub async fn kubernetes_stages(
        &self,
        plan: &Plan,
        target: &Version,
        nodes: &[LiveNode],
    ) -> Result<StageOutcome, RolloutError> {
        if let Some(other) = self.hold_lock().await? {
            return Ok(StageOutcome::Paused {
                node: String::new(),
                reason: format!("another rollout holds the lock ({other})"),
            });
        }
        let mut done = Vec::new();
        for stage in &plan.stages {
            let components: &[Component] = match stage.id {
                StageId::KubeApiserver => &[Component::ApiServer],
                StageId::KubeControllerManagerScheduler => {
                    &[Component::ControllerManager, Component::Scheduler]
                }
                StageId::Kubelet => &[Component::Kubelet],
                StageId::KubeProxyManifests => {
                    // kube-proxy and the bootstrap-manifest sync come with the next slice of
                    // the engine. Where the CNI replaces kube-proxy the kubelets may follow
                    // (the manifests are re-synced by Talos itself on the next apply); where
                    // it does not, stop before the kubelets rather than run them out of order.
                    if stage
                        .steps
                        .iter()
                        .any(|s| s.kind == crate::plan::StepKind::KubeProxyAndManifests)
                    {
                        self.release_lock().await;
                        return Ok(StageOutcome::Paused {
                            node: String::new(),
                            reason: "kube-proxy must move before the kubelets, and this version of ichor does not roll kube-proxy yet: run `talosctl upgrade-k8s` for the rest, or wait for the release that does".into(),
                        });
                    }
                    continue;
                }
                StageId::Talos | StageId::Verify => continue,
            };
            for step in &stage.steps {
                for name in &step.nodes {
                    let node = nodes
                        .iter()
                        .find(|n| &n.name == name)
                        .ok_or_else(|| RolloutError::UnknownNode(name.clone()))?;
                    if let Some(reason) = self.switch(node, components, target).await? {
                        self.release_on_pause(node).await;
                        return Ok(StageOutcome::Paused {
                            node: name.clone(),
                            reason,
                        });
                    }
                    done.push(format!("{}/{}", components[0], name));
                }
            }
        }
        self.release_lock().await;
        Ok(StageOutcome::Completed { nodes: done })
    }

    async fn release_lock(&self) {
        // Best effort: an unreleased lock expires after LOCK_DURATION anyway.
        let _ = self
            .kube
            .release_lease(ICHOR_NAMESPACE, &lock_name(&self.cluster), &self.holder)
            .await;
    }

    /// Whether `components` on `node` already run `tag`, as the Kubernetes API shows.
    async fn runs(
        &self,
        node: &LiveNode,
        components: &[Component],
        tag: &str,
    ) -> Result<bool, RolloutError> {
        if components == [Component::Kubelet] {
            let n = self
                .kube
                .nodes()
                .await?
                .into_iter()
                .find(|n| n.name == node.name);
            return Ok(n.is_some_and(|n| n.kubelet == tag && n.ready));
        }
        let pods = self.kube.mirror_pods().await?;
        Ok(components.iter().all(|c| {
            pods.iter().any(|p| {
                p.node == node.name
                    && p.component == c.name()
                    && crate::kube::inventory::image_tag(&p.image) == Some(tag)
                    && p.ready
            })
        }))
    }

    /// Switch `components` on `node` to `target`: `None` when it runs them, else the reason
    /// it paused.
    async fn switch(
        &self,
        node: &LiveNode,
        components: &[Component],
        target: &Version,
    ) -> Result<Option<String>, RolloutError> {
        let tag = target.tag();
        if self.runs(node, components, &tag).await? {
            return Ok(None);
        }
        let addr = Self::address(node);
        let opts = around(node);
        if let Some(other) = self.hold_lock().await? {
            return Ok(Some(format!(
                "the rollout lock was taken by {other}; every action stopped"
            )));
        }
        let kubelet = components == [Component::Kubelet];
        if kubelet {
            // A kubelet restart is a disruption like a reboot: the node's workloads move first.
            self.kube.cordon(&node.name).await?;
            match self
                .kube
                .drain(&node.name, self.policy.drain_timeout.as_duration(), &self.clock)
                .await?
            {
                DrainOutcome::Drained { .. } => {}
                DrainOutcome::Blocked { pod, budget, message, waited_secs } => {
                    return Ok(Some(format!(
                        "the drain waited {waited_secs}s on {pod}{}: {message}; ichor never deletes or forces a pod",
                        budget.map(|b| format!(" (PodDisruptionBudget {b})")).unwrap_or_default()
                    )))
                }
            }
        }
        let mc = match self.talos.machine_config(&addr, opts).await {
            Ok(mc) => mc,
            Err(e) => return Ok(Some(format!("cannot read the machine configuration: {e}"))),
        };
        let edit = match set_images(&mc.yaml, &tag, components) {
            Ok(e) => e,
            Err(e) => return Ok(Some(format!("the image-only edit is refused: {e}"))),
        };
        let api = match self.talos.version(&addr, opts).await {
            Ok(v) => v.upgrade_api,
            Err(e) => return Ok(Some(format!("cannot read the node's Talos version: {e}"))),
        };
        for (c, _, image) in &edit.images {
            // The kubelet runs as a system container; static pods run in the CRI.
            let ns = if *c == Component::Kubelet {
                ImageNamespace::System
            } else {
                ImageNamespace::Cri
            };
            if let Err(e) = self.talos.pull_image(&addr, image, ns, api, opts).await {
                return Ok(Some(format!(
                    "pre-pulling {image} failed, nothing was switched: {e}"
                )));
            }
        }
        if let Err(e) = self
            .talos
            .apply_configuration(&addr, &edit.yaml, ApplyMode::NoReboot, true, opts)
            .await
        {
            return Ok(Some(format!(
                "the dry run of the image-only edit was refused: {e}"
            )));
        }
        if let Err(e) = self
            .talos
            .apply_configuration(&addr, &edit.yaml, ApplyMode::NoReboot, false, opts)
            .await
        {
            return Ok(Some(format!(
                "applying the image-only edit (NO_REBOOT) failed: {e}"
            )));
        }
        // Verified from the Kubernetes API, within the node timeout.
        let deadline = self
            .clock
            .now()
            .plus(self.policy.node_timeout.as_duration());
        loop {
            if self.runs(node, components, &tag).await? {
                break;
            }
            if self.clock.now() >= deadline {
                let what: Vec<&str> = components.iter().map(|c| c.name()).collect();
                return Ok(Some(format!(
                    "{} on {} still not on {tag} and Ready after {}s (node timeout)",
                    what.join(" and "),
                    node.name,
                    self.policy.node_timeout.as_duration().as_secs()
                )));
            }
            if let Some(other) = self.hold_lock().await? {
                return Ok(Some(format!(
                    "the rollout lock was taken by {other}; every action stopped"
                )));
            }
            self.clock.sleep(OBSERVE_EVERY).await;
        }
        if kubelet {
            self.kube.uncordon(&node.name).await?;
        }
        let what: Vec<&str> = components.iter().map(|c| c.name()).collect();
        self.say(format!(
            "{} {}: on {tag}, Ready",
            what.join(" and "),
            node.name
        ));
        Ok(None)
    }

    /// A paused cluster runs at full capacity: a node ichor cordoned that is Ready and not
    /// mid-upgrade gets its schedulability back.
    async fn release_on_pause(&self, node: &LiveNode) {
        let ready = self
            .kube
            .nodes()
            .await
            .ok()
            .and_then(|ns| ns.into_iter().find(|n| n.name == node.name))
            .is_some_and(|n| n.ready);
        if ready {
            let _ = self.kube.uncordon(&node.name).await;
        }
    }

    fn address(node: &LiveNode) -> String {
        node.internal_ip
            .clone()
            .unwrap_or_else(|| node.name.clone())
    }

    async fn observe(&self, node: &LiveNode) -> Result<NodeObservation, RolloutError> {
        let addr = Self::address(node);
        // Never through the node itself: it is the one that reboots.
        let opts = around(node);
        let talos = self.talos.version(&addr, opts).await.ok().map(|v| v.tag);
        let boot_id = match talos {
            Some(_) => self.talos.boot_id(&addr, opts).await.ok(),
            None => None,
        };
        let live = self
            .kube
            .nodes()
            .await?
            .into_iter()
            .find(|n| n.name == node.name);
        let pods = self
            .kube
            .pods_on(&node.name)
            .await?
            .into_iter()
            .filter(|p| !p.stays)
            .count();
        Ok(NodeObservation {
            talos,
            boot_id,
            ready: live.as_ref().is_some_and(|n| n.ready),
            cordoned: live.as_ref().is_some_and(|n| n.cordoned),
            cordoned_by_ichor: live.as_ref().is_some_and(|n| n.cordoned_by_ichor),
            pods_to_move: pods,
        })
    }

    /// Drive one node to `target`: `None` when done, else the reason it paused.
    async fn talos_node(
        &self,
        node: &LiveNode,
        target: &Version,
    ) -> Result<Option<String>, RolloutError> {
        let addr = Self::address(node);
        let opts = around(node);
        let first = self.observe(node).await?;
        let api = match self.talos.version(&addr, opts).await {
            Ok(v) => v.upgrade_api,
            Err(e) => {
                return Ok(Some(format!(
                    "cannot read the node's Talos version before starting: {e}"
                )))
            }
        };
        let mut marker = StepMarker {
            started_at: Some(self.clock.now()),
            boot_id_before: first.boot_id.clone(),
            ..StepMarker::default()
        };
        let installer = format!("{}:{}", self.installer_image, target.tag());
        let mut obs = first;
        loop {
            if let Some(other) = self.hold_lock().await? {
                return Ok(Some(format!(
                    "the rollout lock was taken by {other}; every action stopped"
                )));
            }
            let state = step::talos_node(
                target,
                &obs,
                &marker,
                self.clock.now(),
                self.policy.node_timeout.as_duration(),
            );
            match state {
                StepState::Done => {
                    self.say(format!(
                        "talos {}: on {target}, Ready, back in service",
                        node.name
                    ));
                    return Ok(None);
                }
                StepState::Failed(why) => {
                    self.say(format!("talos {}: paused: {why}", node.name));
                    return Ok(Some(why));
                }
                StepState::Settling(_) => self.clock.sleep(OBSERVE_EVERY).await,
                StepState::Act(Action::PrePull) => {
                    // A failed pull pauses before anything is disrupted.
                    if let Err(e) = self
                        .talos
                        .pull_image(&addr, &installer, ImageNamespace::System, api, opts)
                        .await
                    {
                        return Ok(Some(format!(
                            "pre-pulling {installer} failed, nothing was disrupted: {e}"
                        )));
                    }
                    marker.pre_pulled = true;
                    self.say(format!("talos {}: pre-pulled {installer}", node.name));
                }
                StepState::Act(Action::Cordon) => {
                    self.kube.cordon(&node.name).await?;
                    self.say(format!("talos {}: cordoned", node.name));
                }
                StepState::Act(Action::Drain) => {
                    match self
                        .kube
                        .drain(&node.name, self.policy.drain_timeout.as_duration(), &self.clock)
                        .await?
                    {
                        DrainOutcome::Drained { evicted } => {
                            self.say(format!("talos {}: drained ({} pods evicted)", node.name, evicted.len()))
                        }
                        DrainOutcome::Blocked { pod, budget, message, waited_secs } => {
                            return Ok(Some(format!(
                                "the drain waited {waited_secs}s on {pod}{}: {message}; ichor never deletes or forces a pod — let the budget allow it, then resume",
                                budget.map(|b| format!(" (PodDisruptionBudget {b})")).unwrap_or_default()
                            )))
                        }
                    }
                }
                StepState::Act(Action::Upgrade) => {
                    if node.role == Role::Controlplane {
                        if let Some(why) = self.etcd_ready_for(node).await {
                            return Ok(Some(why));
                        }
                    }
                    let r = match api {
                        UpgradeApi::Lifecycle => {
                            let long = CallOptions {
                                deadline: self.policy.node_timeout.as_duration(),
                                ..opts
                            };
                            match self.talos.upgrade_lifecycle(&addr, &installer, long).await {
                                Ok(_) => self.talos.reboot(&addr, opts).await,
                                Err(e) => Err(e),
                            }
                        }
                        // Talos ≤ 1.12 cordons, drains and reboots by itself; ichor has
                        // drained already, so its drain finds nothing left to move.
                        UpgradeApi::Machine => self
                            .talos
                            .upgrade_legacy(&addr, &installer, opts)
                            .await
                            .map(|_| ()),
                    };
                    if let Err(e) = r {
                        return Ok(Some(format!("the upgrade to {installer} was refused: {e}")));
                    }
                    marker.upgrade_requested = true;
                    self.say(format!(
                        "talos {}: upgrade to {target} requested ({})",
                        node.name,
                        match api {
                            UpgradeApi::Lifecycle => "LifecycleService, then reboot",
                            UpgradeApi::Machine => "MachineService/Upgrade, which reboots",
                        }
                    ));
                }
                StepState::Act(Action::Uncordon) => {
                    self.kube.uncordon(&node.name).await?;
                }
            }
            obs = self.observe(node).await?;
        }
    }

    /// Before a control plane goes down: every etcd member healthy (so quorum holds with
    /// this one down), and leadership moved off it. `Some(reason)` to pause.
    async fn etcd_ready_for(&self, node: &LiveNode) -> Option<String> {
        let addr = Self::address(node);
        let opts = around(node);
        let members = match self.talos.etcd_members(&addr, opts).await {
            Ok(m) => m,
            Err(e) => {
                return Some(format!(
                    "cannot read etcd before taking {} down: {e}",
                    node.name
                ))
            }
        };
        if members.len() < 3 {
            // One or two members: the cluster has no quorum to spare; proceed, the plan said so.
            return None;
        }
        let cps: Vec<LiveNode> = self
            .kube
            .nodes()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.role == Role::Controlplane)
            .collect();
        for cp in &cps {
            let st = self.talos.etcd_status(&Self::address(cp), opts).await;
            match st {
                Ok(s) if s.errors.is_empty() && !s.is_learner => {}
                Ok(s) => return Some(format!("etcd member on {} is not healthy ({}); a control-plane upgrade now would lose quorum", cp.name, s.errors.join("; "))),
                Err(e) => return Some(format!("etcd member on {} does not answer ({e}); a control-plane upgrade now would lose quorum", cp.name)),
            }
        }
        if let Err(e) = self.talos.etcd_forfeit_leadership(&addr, opts).await {
            return Some(format!(
                "could not move etcd leadership off {}: {e}",
                node.name
            ));
        }
        None
    }
}
