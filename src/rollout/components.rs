//! Stages 2a, 2b and 2d: a Kubernetes component (kube-apiserver, controller-manager and
//! scheduler, the kubelet) switched on one node by the image-only edit of the node's own
//! machine configuration — images pre-pulled, a dry run, then NO_REBOOT — and verified from
//! the Kubernetes API. A kubelet switch is a disruption: its node is cordoned, drained and
//! volume-checked first. Like a Talos node's step, [`component_step`] decides the next move
//! from what is observed now; [`Run::component`] observes, acts and observes again.

use std::time::Duration;

use super::nodes::{address, around, pulling, Before};
use super::step::{self, NodeObservation, StepState};
use super::{Flow, Progress, Run};
use crate::kube::LiveNode;
use crate::plan::StageId;
use crate::talos::client::ImageNamespace;
use crate::talos::machine_config::{set_images, Component};
use crate::talos::proto::machine::apply_configuration_request::Mode as ApplyMode;

/// What the engine sees of one node for a component switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentObservation {
    /// The components run the target and are Ready, as the Kubernetes API shows.
    pub on_target: bool,
    /// The node's active machine configuration already names the target images.
    pub switched: bool,
    /// For the kubelet (a disruption): the node as a Talos step sees it.
    pub node: Option<NodeObservation>,
}

/// A component step's actions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentAction {
    Cordon,
    Drain,
    /// Pre-pull, dry run, then the NO_REBOOT apply of the image-only edit.
    Switch,
    Uncordon,
}

/// The next move for switching `what` on `node` to `tag`, `waited` into the step.
pub fn component_step(
    what: &str,
    node: &str,
    tag: &str,
    obs: &ComponentObservation,
    waited: Option<Duration>,
    node_timeout: Duration,
) -> StepState<ComponentAction> {
    let timed_out = waited.is_some_and(|w| w > node_timeout);
    let secs = waited.unwrap_or_default().as_secs();
    let disrupting = obs.node.as_ref().filter(|n| !n.in_place);
    if obs.on_target {
        return match &obs.node {
            Some(n) if n.cordoned && n.cordoned_by_ichor => {
                StepState::Act(ComponentAction::Uncordon)
            }
            _ => StepState::Done,
        };
    }
    if !obs.switched {
        if let Some(n) = disrupting {
            // A kubelet restart is a disruption like a reboot: the workloads move first,
            // and only once every volume they use has a healthy copy elsewhere.
            if !n.cordoned {
                return StepState::Act(ComponentAction::Cordon);
            }
            if n.pods_to_move > 0 {
                if n.unprotected_volumes.is_empty() {
                    return StepState::Act(ComponentAction::Drain);
                }
                return if timed_out {
                    StepState::Failed(format!(
                        "{} on {node} has no healthy replica elsewhere after {secs}s (node timeout {}s); evicting its pods could lose the only good copy",
                        step::plural_list("volume", &n.unprotected_volumes),
                        node_timeout.as_secs()
                    ))
                } else {
                    StepState::Settling(format!(
                        "waiting for a healthy replica of {} on another node before draining",
                        n.unprotected_volumes.join(", ")
                    ))
                };
            }
        }
        return StepState::Act(ComponentAction::Switch);
    }
    if timed_out {
        return StepState::Failed(format!(
            "{what} on {node} still not on {tag} and Ready after {secs}s (node timeout {}s)",
            node_timeout.as_secs()
        ));
    }
    StepState::Settling(format!(
        "waiting for {what} on {node} to run {tag} and be Ready"
    ))
}

impl Run<'_, '_> {
    /// Whether `components` on `node` already run `tag`, as the Kubernetes API shows.
    pub(super) async fn runs(
        &self,
        stage: StageId,
        node: &str,
        components: &[Component],
        tag: &str,
    ) -> Flow<bool> {
        let e = self.engine;
        if components == [Component::Kubelet] {
            let n = self
                .live_nodes(stage)
                .await?
                .into_iter()
                .find(|n| n.name == node);
            return Ok(n.is_some_and(|n| n.kubelet == tag && n.ready));
        }
        let pods = self
            .kube(stage, Some(node), "list mirror pods", || {
                e.kube.mirror_pods()
            })
            .await?;
        Ok(components.iter().all(|c| {
            pods.iter().any(|p| {
                p.node == node
                    && p.component == c.name()
                    && crate::kube::inventory::image_tag(&p.image) == Some(tag)
                    && p.ready
            })
        }))
    }

    /// The node's active machine configuration, read for the edit.
    async fn machine_config(
        &self,
        stage: StageId,
        node: &LiveNode,
    ) -> Flow<crate::talos::client::MachineConfig> {
        self.engine
            .talos
            .machine_config(&address(node), around(node))
            .await
            .map_err(|err| {
                self.pause(
                    stage,
                    Some(&node.name),
                    format!("cannot read the machine configuration: {err}"),
                )
            })
    }

    /// What [`component_step`] decides from, as it is now.
    async fn observe_component(
        &self,
        stage: StageId,
        node: &LiveNode,
        components: &[Component],
        marker: &step::StepMarker,
    ) -> Flow<ComponentObservation> {
        let tag = self.target.kubernetes.tag();
        let on_target = self.runs(stage, &node.name, components, &tag).await?;
        // Once on the target nothing more is switched: the configuration need not be read.
        let switched = on_target || {
            let mc = self.machine_config(stage, node).await?;
            set_images(&mc.yaml, &tag, components).is_ok_and(|e| e.is_noop())
        };
        let node_obs = if components == [Component::Kubelet] {
            // Boxed, as every look (see `observe_talos`).
            Some(Box::pin(self.observe(stage, node, marker, Before::Unknown)).await?)
        } else {
            None
        };
        Ok(ComponentObservation {
            on_target,
            switched,
            node: node_obs,
        })
    }

    /// Switch `components` on one node to the target Kubernetes, verified from the API.
    pub(super) async fn component(
        &self,
        stage: StageId,
        name: &str,
        components: &[Component],
    ) -> Flow<()> {
        let e = self.engine;
        let tag = self.target.kubernetes.tag();
        let what: Vec<&str> = components.iter().map(|c| c.name()).collect();
        let what = what.join(" and ");
        let key = format!("{}/{name}", components[0].name());
        let timeout = e.policy.node_timeout.as_duration();
        let node = self.live_node(stage, name).await?;
        let mut marker = self.marker(&key).await;
        let mut last_settling = String::new();
        // A step an earlier run began is judged again before its first act in this run,
        // unless it has disrupted its node already (see `judge_again`).
        let mut judged = marker.started_at.is_none();
        loop {
            let obs = self
                .observe_component(stage, &node, components, &marker)
                .await?;
            let waited = marker.started_at.map(|s| self.now().since(s));
            match component_step(&what, name, &tag, &obs, waited, timeout) {
                StepState::Done => {
                    let fresh = marker.started_at.is_none();
                    if !fresh {
                        self.finish_marker(stage, &key).await?;
                    }
                    self.say(Progress::UnitDone {
                        node: Some(name.to_string()),
                        stage,
                        what: if fresh {
                            format!("{what} {name}: on {tag}")
                        } else {
                            format!("{what} {name}: on {tag}, Ready")
                        },
                    });
                    return Ok(());
                }
                StepState::Failed(why) => return Err(self.pause(stage, Some(name), why)),
                StepState::Settling(w) => {
                    if w != last_settling {
                        self.say(Progress::Note(format!("{what} {name}: {w}")));
                        last_settling = w;
                    }
                    e.clock.sleep_to_beat(e.observe_every).await;
                    continue;
                }
                StepState::Act(a)
                    if marker.started_at.is_none() && a != ComponentAction::Uncordon =>
                {
                    // The right to start (window, hold, rules) before the first act that
                    // changes something; giving a node back needs none.
                    self.begin(stage, &key, &node, &mut marker).await?;
                    judged = true;
                }
                StepState::Act(a) if !judged && a != ComponentAction::Uncordon => {
                    judged = true;
                    let untouched = obs
                        .node
                        .as_ref()
                        .is_none_or(|n| self.undisrupted(n, &marker));
                    if untouched {
                        self.judge_again(stage, &key, name, &mut marker).await?;
                    }
                }
                StepState::Act(ComponentAction::Cordon) => {
                    self.check_lock(stage, name).await?;
                    self.kube(stage, Some(name), "cordon", || {
                        e.kube.cordon(name, self.rollout_id())
                    })
                    .await?;
                    self.say(Progress::Note(format!("{what} {name}: cordoned")));
                }
                StepState::Act(ComponentAction::Drain) => {
                    self.check_lock(stage, name).await?;
                    self.drain(stage, name, None).await?;
                }
                StepState::Act(ComponentAction::Switch) => {
                    self.switch(stage, &node, components, &what).await?;
                }
                StepState::Act(ComponentAction::Uncordon) => {
                    self.kube(stage, Some(name), "uncordon", || {
                        e.kube.uncordon(name, self.rollout_id())
                    })
                    .await?;
                }
            }
        }
    }

    /// The image-only edit of the node's configuration: pre-pulled, dry-run (Talos's own
    /// diff must name only the image fields), then applied with NO_REBOOT.
    pub(super) async fn switch(
        &self,
        stage: StageId,
        node: &LiveNode,
        components: &[Component],
        what: &str,
    ) -> Flow<()> {
        let e = self.engine;
        let name = node.name.as_str();
        let tag = self.target.kubernetes.tag();
        let addr = address(node);
        let opts = around(node);
        let mc = self.machine_config(stage, node).await?;
        self.no_pending_config(stage, name, &addr, &mc, opts)
            .await?;
        let edit = set_images(&mc.yaml, &tag, components).map_err(|err| {
            self.pause(
                stage,
                Some(name),
                format!("the image-only edit is refused: {err}"),
            )
        })?;
        if edit.is_noop() {
            return Ok(());
        }
        let api = self.upgrade_api(stage, node).await?;
        for (c, _, image) in &edit.images {
            // The kubelet runs as a system container; static pods run in the CRI.
            let ns = if *c == Component::Kubelet {
                ImageNamespace::System
            } else {
                ImageNamespace::Cri
            };
            e.talos
                .pull_image(&addr, image, ns, api, pulling(node))
                .await
                .map_err(|err| {
                    self.pause(
                        stage,
                        Some(name),
                        format!("pre-pulling {image} failed, nothing was switched: {err}"),
                    )
                })?;
        }
        let dry = e
            .talos
            .apply_configuration(&addr, &edit.yaml, ApplyMode::NoReboot, true, opts)
            .await
            .map_err(|err| {
                self.pause(
                    stage,
                    Some(name),
                    format!("the dry run of the image-only edit was refused: {err}"),
                )
            })?;
        self.dry_run_verdict(stage, name, &dry.details, &edit)?;
        self.check_lock(stage, name).await?;
        // Its own deadline, not the step's and not the default: a control-plane image
        // change blocks while Talos restarts the static pod (ADR 0057's end-to-end run
        // failed twice at 15 s), so the apply is bounded by APPLY_DEADLINE.
        let apply = crate::talos::client::CallOptions {
            deadline: super::APPLY_DEADLINE,
            ..opts
        };
        e.talos
            .apply_configuration(&addr, &edit.yaml, ApplyMode::NoReboot, false, apply)
            .await
            .map_err(|err| {
                self.pause(
                    stage,
                    Some(name),
                    format!("applying the image-only edit (NO_REBOOT) failed: {err}; resume to check and retry"),
                )
            })?;
        self.say(Progress::Note(format!("{what} {name}: switched to {tag}")));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cordoned: bool, ours: bool, pods: usize, unprotected: &[&str]) -> NodeObservation {
        NodeObservation {
            talos: Some("v1.12.9".into()),
            boot_id: Some("b".into()),
            ready: true,
            cordoned,
            cordoned_by_ichor: ours,
            pods_to_move: pods,
            in_place: false,
            unprotected_volumes: unprotected.iter().map(|s| s.to_string()).collect(),
            attachments: vec![],
            degraded_volumes: vec![],
            kubelet: "v1.33.5".into(),
            talos_unready: None,
        }
    }

    fn next(obs: &ComponentObservation, waited: u64) -> StepState<ComponentAction> {
        component_step(
            "kubelet",
            "w-1",
            "v1.34.2",
            obs,
            Some(Duration::from_secs(waited)),
            Duration::from_secs(600),
        )
    }

    #[test]
    fn a_kubelet_walks_cordon_drain_switch_uncordon() {
        let at = |on_target, switched, n| ComponentObservation {
            on_target,
            switched,
            node: Some(n),
        };
        use ComponentAction::*;
        assert_eq!(
            next(&at(false, false, node(false, false, 4, &[])), 0),
            StepState::Act(Cordon)
        );
        assert_eq!(
            next(&at(false, false, node(true, true, 4, &[])), 1),
            StepState::Act(Drain)
        );
        assert_eq!(
            next(&at(false, false, node(true, true, 0, &[])), 2),
            StepState::Act(Switch)
        );
        assert!(matches!(
            next(&at(false, true, node(true, true, 0, &[])), 3),
            StepState::Settling(_)
        ));
        assert_eq!(
            next(&at(true, true, node(true, true, 0, &[])), 4),
            StepState::Act(Uncordon)
        );
        assert_eq!(
            next(&at(true, true, node(false, false, 0, &[])), 5),
            StepState::Done
        );
        // Someone else's cordon: not cordoned again, never given back by ichor.
        assert_eq!(
            next(&at(false, false, node(true, false, 4, &[])), 0),
            StepState::Act(Drain)
        );
        assert_eq!(
            next(&at(true, true, node(true, false, 0, &[])), 9),
            StepState::Done
        );
    }

    #[test]
    fn volumes_hold_the_drain_and_the_timeout_names_what_is_waited_on() {
        let obs = ComponentObservation {
            on_target: false,
            switched: false,
            node: Some(node(true, true, 3, &["pvc-db"])),
        };
        assert!(matches!(next(&obs, 10), StepState::Settling(w) if w.contains("pvc-db")));
        assert!(
            matches!(next(&obs, 601), StepState::Failed(w) if w.contains("volume pvc-db") && w.contains("601s"))
        );
        let stuck = ComponentObservation {
            on_target: false,
            switched: true,
            node: None,
        };
        assert!(
            matches!(next(&stuck, 601), StepState::Failed(w) if w.contains("still not on v1.34.2"))
        );
    }

    #[test]
    fn a_control_plane_component_is_switched_without_a_drain() {
        let obs = ComponentObservation {
            on_target: false,
            switched: false,
            node: None,
        };
        assert_eq!(next(&obs, 0), StepState::Act(ComponentAction::Switch));
        let in_place = ComponentObservation {
            node: Some(NodeObservation {
                in_place: true,
                ..node(false, false, 5, &[])
            }),
            ..obs
        };
        assert_eq!(next(&in_place, 0), StepState::Act(ComponentAction::Switch));
    }
}
