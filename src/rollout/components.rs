//! Stages 2a, 2b and 2d: a Kubernetes component (kube-apiserver, controller-manager and
//! scheduler, the kubelet) switched on one node by the image-only edit of the node's own
//! machine configuration — images pre-pulled, a dry run, then NO_REBOOT — and verified from
//! the Kubernetes API. A kubelet switch is a disruption: its node is cordoned, drained and
//! volume-checked first.

use super::nodes::{address, around, pulling};
use super::step;
use super::{Flow, Progress, Run};
use crate::plan::StageId;
use crate::talos::client::ImageNamespace;
use crate::talos::machine_config::{set_images, Component};
use crate::talos::proto::machine::apply_configuration_request::Mode as ApplyMode;

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

    /// Switch `components` on one node to the target Kubernetes, verified from the API.
    pub(super) async fn component(
        &self,
        stage: StageId,
        name: &str,
        components: &[Component],
    ) -> Flow<()> {
        let e = self.engine;
        let target = &self.target.kubernetes;
        let tag = target.tag();
        let what: Vec<&str> = components.iter().map(|c| c.name()).collect();
        let what = what.join(" and ");
        let key = format!("{}/{name}", components[0].name());
        let kubelet = components == [Component::Kubelet];
        let node = self.live_node(stage, name).await?;
        let mut marker = self.marker(&key).await;
        if self.runs(stage, name, components, &tag).await? {
            if kubelet && self.ours(&node) {
                self.kube(stage, Some(name), "uncordon", || {
                    e.kube.uncordon(name, self.rollout_id())
                })
                .await?;
            }
            if marker.started_at.is_some() {
                self.finish_marker(stage, &key).await?;
            }
            self.say(Progress::UnitDone {
                node: Some(name.to_string()),
                stage,
                what: format!("{what} {name}: on {tag}"),
            });
            return Ok(());
        }
        self.begin(stage, &key, &node, &mut marker).await?;
        let started = marker.started_at.unwrap_or_else(|| self.now());
        let timeout = e.policy.node_timeout.as_duration();
        let deadline = started.plus(timeout);
        let addr = address(&node);
        let opts = around(&node);
        if kubelet && !self.in_place().await? {
            // A kubelet restart is a disruption like a reboot: the workloads move first,
            // and only once every volume they use has a healthy copy elsewhere.
            self.check_lock(stage, name).await?;
            self.kube(stage, Some(name), "cordon", || {
                e.kube.cordon(name, self.rollout_id())
            })
            .await?;
            loop {
                let obs = self.observe(stage, &node, &marker).await?;
                if obs.unprotected_volumes.is_empty() || obs.pods_to_move == 0 {
                    break;
                }
                if self.now() >= deadline {
                    return Err(self.pause(
                        stage,
                        Some(name),
                        format!(
                            "{} on {name} has no healthy replica elsewhere after {}s (node timeout); evicting its pods could lose the only good copy",
                            step::plural_list("volume", &obs.unprotected_volumes),
                            self.now().since(started).as_secs()
                        ),
                    ));
                }
                e.clock.sleep(e.observe_every).await;
            }
            self.drain(stage, name).await?;
        }
        let mc = e.talos.machine_config(&addr, opts).await.map_err(|err| {
            self.pause(
                stage,
                Some(name),
                format!("cannot read the machine configuration: {err}"),
            )
        })?;
        self.no_pending_config(stage, name, &addr, &mc, opts)
            .await?;
        let edit = set_images(&mc.yaml, &tag, components).map_err(|err| {
            self.pause(
                stage,
                Some(name),
                format!("the image-only edit is refused: {err}"),
            )
        })?;
        if !edit.is_noop() {
            let api = self.upgrade_api(stage, &node).await?;
            for (c, _, image) in &edit.images {
                // The kubelet runs as a system container; static pods run in the CRI.
                let ns = if *c == Component::Kubelet {
                    ImageNamespace::System
                } else {
                    ImageNamespace::Cri
                };
                e.talos
                    .pull_image(&addr, image, ns, api, pulling(&node))
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
        }
        // Verified from the Kubernetes API, within the node timeout.
        loop {
            if self.runs(stage, name, components, &tag).await? {
                break;
            }
            if self.now() >= deadline {
                return Err(self.pause(
                    stage,
                    Some(name),
                    format!(
                        "{what} on {name} still not on {tag} and Ready after {}s (node timeout {}s)",
                        self.now().since(started).as_secs(),
                        timeout.as_secs()
                    ),
                ));
            }
            e.clock.sleep(e.observe_every).await;
        }
        if kubelet {
            self.kube(stage, Some(name), "uncordon", || {
                e.kube.uncordon(name, self.rollout_id())
            })
            .await?;
        }
        self.finish_marker(stage, &key).await?;
        self.say(Progress::UnitDone {
            node: Some(name.to_string()),
            stage,
            what: format!("{what} {name}: on {tag}, Ready"),
        });
        Ok(())
    }
}
