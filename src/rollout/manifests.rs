//! Stage 2c: kube-proxy on every control plane (unless the CNI replaces it), the bootstrap
//! manifests applied as Talos's field manager, then kube-proxy's DaemonSet rolled out. Like
//! every step, [`manifests_step`] decides the next move from what is observed now;
//! [`Run::proxy_and_manifests`] observes, acts and observes again.

use std::time::Duration;

use super::nodes::address;
use super::step::StepState;
use super::{Flow, Progress, Run, PULL_DEADLINE};
use crate::kube::{LiveNode, WorkloadStatus};
use crate::plan::{StageId, Step, StepKind};
use crate::releaseset::Role;
use crate::talos::client::{CallOptions, ImageNamespace};
use crate::talos::machine_config::{set_images, Component};
use crate::talos::proto::machine::apply_configuration_request::Mode as ApplyMode;

/// What the engine sees of stage (c).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestsObservation {
    /// Control planes whose configuration does not name the target kube-proxy image yet.
    pub proxy_behind: Vec<String>,
    /// The manifests were applied in this run, after every kube-proxy switch. Not
    /// remembered: a restarted engine applies them again, which changes nothing.
    pub synced: bool,
    /// kube-proxy's DaemonSet when the step rolls kube-proxy (inner `None`: the cluster has
    /// none); `None` when the CNI replaces it.
    pub kube_proxy: Option<Option<WorkloadStatus>>,
}

/// Stage (c)'s actions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestsAction {
    /// The image-only edit of one control plane's kube-proxy image.
    SwitchProxy(String),
    Sync,
}

/// The next move of stage (c) towards `tag`, `waited` into the step.
pub fn manifests_step(
    tag: &str,
    obs: &ManifestsObservation,
    waited: Duration,
    node_timeout: Duration,
) -> StepState<ManifestsAction> {
    if let Some(cp) = obs.proxy_behind.first() {
        return StepState::Act(ManifestsAction::SwitchProxy(cp.clone()));
    }
    if !obs.synced {
        return StepState::Act(ManifestsAction::Sync);
    }
    match &obs.kube_proxy {
        None | Some(None) => StepState::Done,
        Some(Some(w)) if w.version.as_deref() == Some(tag) && w.rolled_out() => StepState::Done,
        Some(Some(w)) if waited >= node_timeout => StepState::Failed(format!(
            "kube-proxy has not rolled out on {tag} after {}s: {}/{} updated, {} ready, image {}",
            waited.as_secs(),
            w.updated,
            w.desired,
            w.ready,
            w.images.join(", ")
        )),
        Some(Some(w)) => StepState::Settling(format!(
            "waiting for kube-proxy to roll out on {tag} ({}/{} updated, {} ready)",
            w.updated, w.desired, w.ready
        )),
    }
}

impl Run<'_, '_> {
    /// (c): kube-proxy on every control plane (unless the CNI replaces it), then the
    /// bootstrap manifests applied as Talos's field manager, then kube-proxy's DaemonSet
    /// rolled out on the target.
    pub(super) async fn proxy_and_manifests(&self, step: &Step) -> Flow<()> {
        let stage = StageId::KubeProxyManifests;
        let e = self.engine;
        let tag = self.target.kubernetes.tag();
        let cps: Vec<LiveNode> = self
            .live_nodes(stage)
            .await?
            .into_iter()
            .filter(|n| n.role == Role::Controlplane)
            .collect();
        let key = "manifests".to_string();
        let mut marker = self.marker(&key).await;
        if marker.started_at.is_none() {
            marker.started_at = Some(self.now());
            self.store_marker(stage, &key, &marker).await?;
        }
        let mut started = marker.started_at.unwrap_or_else(|| self.now());
        let proxy = step.kind == StepKind::KubeProxyAndManifests;
        let timeout = e.policy.node_timeout.as_duration();
        let mut synced = false;
        let mut switched = std::collections::BTreeSet::new();
        let mut last_settling = String::new();
        loop {
            let obs = self.observe_manifests(stage, &cps, proxy, synced).await?;
            let next = manifests_step(&tag, &obs, self.now().since(started), timeout);
            // Stage (c) obeys the rules of every step before each act, a resumed stage's
            // first included: a pause request, a closed window or a hold on a control plane
            // stops it before the next switch or apply. A wait re-bases its deadline.
            if matches!(next, StepState::Act(_)) && self.may_go_all(stage, &cps).await? {
                started = self.now();
                marker.started_at = Some(started);
                self.store_marker(stage, &key, &marker).await?;
                continue;
            }
            match next {
                StepState::Done => {
                    if obs.kube_proxy == Some(None) {
                        self.say(Progress::Note("kube-proxy: no DaemonSet kube-system/kube-proxy in the cluster; nothing to roll".into()));
                    }
                    break;
                }
                StepState::Failed(why) => return Err(self.pause(stage, None, why)),
                StepState::Settling(w) => {
                    if w != last_settling {
                        self.say(Progress::Note(w.clone()));
                        last_settling = w;
                    }
                    e.clock.sleep_to_beat(e.observe_every).await;
                }
                StepState::Act(ManifestsAction::SwitchProxy(name)) => {
                    let Some(cp) = cps.iter().find(|c| c.name == name) else {
                        return Err(self.pause(
                            stage,
                            Some(&name),
                            "the control plane is gone from the cluster",
                        ));
                    };
                    // Applied once per run: a configuration that still names the old image
                    // afterwards is for a human, not a loop.
                    if !switched.insert(name.clone()) {
                        return Err(self.pause(
                            stage,
                            Some(&name),
                            format!("the configuration still names another kube-proxy image than {tag} after its NO_REBOOT apply was accepted; check the node's machine configuration, then resume"),
                        ));
                    }
                    self.switch_proxy(stage, cp).await?;
                }
                StepState::Act(ManifestsAction::Sync) => {
                    self.sync_manifests(stage, &cps).await?;
                    synced = true;
                }
            }
        }
        self.finish_marker(stage, &key).await?;
        self.say(Progress::UnitDone {
            node: None,
            stage,
            what: if proxy {
                format!("kube-proxy on {tag} and the bootstrap manifests in sync")
            } else {
                "bootstrap manifests in sync".into()
            },
        });
        Ok(())
    }

    /// The right to go on with stage (c): every control plane's (a pause request, the
    /// window, a hold; it takes no node down). `true`: it had to wait.
    async fn may_go_all(&self, stage: StageId, cps: &[LiveNode]) -> Flow<bool> {
        let mut waited = false;
        for cp in cps {
            waited |= self.may_go(stage, &cp.name, false).await?;
        }
        Ok(waited)
    }

    /// What [`manifests_step`] decides from, as it is now.
    async fn observe_manifests(
        &self,
        stage: StageId,
        cps: &[LiveNode],
        proxy: bool,
        synced: bool,
    ) -> Flow<ManifestsObservation> {
        let e = self.engine;
        let tag = self.target.kubernetes.tag();
        let mut proxy_behind = Vec::new();
        if proxy {
            for cp in cps {
                let mc = e
                    .talos
                    .machine_config(&address(cp), CallOptions::default())
                    .await
                    .map_err(|err| {
                        self.pause(
                            stage,
                            Some(&cp.name),
                            format!("cannot read the machine configuration: {err}"),
                        )
                    })?;
                // An edit Talos would refuse counts as behind: the switch names the refusal.
                if !set_images(&mc.yaml, &tag, &[Component::Proxy]).is_ok_and(|e| e.is_noop()) {
                    proxy_behind.push(cp.name.clone());
                }
            }
        }
        // Read only once it matters: after the sync, with every control plane switched.
        let kube_proxy = if proxy && synced && proxy_behind.is_empty() {
            Some(
                self.kube(stage, None, "get the kube-proxy DaemonSet", || {
                    e.kube.daemonset("kube-system", "kube-proxy")
                })
                .await?,
            )
        } else {
            None
        };
        Ok(ManifestsObservation {
            proxy_behind,
            synced,
            kube_proxy,
        })
    }

    /// kube-proxy's image-only edit on one control plane: pre-pulled, dry-run, applied
    /// with NO_REBOOT.
    async fn switch_proxy(&self, stage: StageId, cp: &LiveNode) -> Flow<()> {
        let e = self.engine;
        let tag = self.target.kubernetes.tag();
        let addr = address(cp);
        let opts = CallOptions::default();
        let mc = e.talos.machine_config(&addr, opts).await.map_err(|err| {
            self.pause(
                stage,
                Some(&cp.name),
                format!("cannot read the machine configuration: {err}"),
            )
        })?;
        self.no_pending_config(stage, &cp.name, &addr, &mc, opts)
            .await?;
        let edit = set_images(&mc.yaml, &tag, &[Component::Proxy]).map_err(|err| {
            self.pause(
                stage,
                Some(&cp.name),
                format!("the image-only edit is refused: {err}"),
            )
        })?;
        if edit.is_noop() {
            return Ok(());
        }
        let api = self.upgrade_api(stage, cp).await?;
        for (_, _, image) in &edit.images {
            e.talos
                .pull_image(
                    &addr,
                    image,
                    ImageNamespace::Cri,
                    api,
                    CallOptions {
                        deadline: PULL_DEADLINE,
                        ..opts
                    },
                )
                .await
                .map_err(|err| {
                    self.pause(
                        stage,
                        Some(&cp.name),
                        format!("pre-pulling {image} failed, nothing was switched: {err}"),
                    )
                })?;
        }
        for dry in [true, false] {
            if !dry {
                self.check_lock(stage, &cp.name).await?;
            }
            let bound = CallOptions {
                deadline: if dry {
                    opts.deadline
                } else {
                    super::APPLY_DEADLINE
                },
                ..opts
            };
            let applied = e
                .talos
                .apply_configuration(&addr, &edit.yaml, ApplyMode::NoReboot, dry, bound)
                .await
                .map_err(|err| {
                    self.pause(
                        stage,
                        Some(&cp.name),
                        format!(
                            "{} the kube-proxy image edit failed: {err}",
                            if dry { "the dry run of" } else { "applying" }
                        ),
                    )
                })?;
            if dry {
                self.dry_run_verdict(stage, &cp.name, &applied.details, &edit)?;
            }
        }
        self.say(Progress::Note(format!(
            "kube-proxy image on {}: {tag}",
            cp.name
        )));
        Ok(())
    }

    /// The manifests as a control plane renders them, applied with the admin kubeconfig it
    /// issues.
    async fn sync_manifests(&self, stage: StageId, cps: &[LiveNode]) -> Flow<()> {
        let e = self.engine;
        // The manifests as a control plane renders them now (any one: they are the same),
        // and the admin kubeconfig that control plane issues: the sync runs as Talos's
        // admin (ADR 0057), never as ichor's ServiceAccount, which may not write them.
        let mut source = Err("no control plane".to_string());
        for cp in cps {
            let addr = address(cp);
            let got = async {
                let m = e
                    .talos
                    .bootstrap_manifests(&addr, CallOptions::default())
                    .await?;
                let k = e.talos.kubeconfig(&addr, CallOptions::default()).await?;
                Ok::<_, crate::talos::TalosError>((m, k, cp.name.clone()))
            };
            match got.await {
                Ok(found) => {
                    source = Ok(found);
                    break;
                }
                Err(err) => source = Err(err.to_string()),
            }
        }
        let (manifests, kubeconfig, from) = source.map_err(|err| {
            self.pause(
                stage,
                None,
                format!("cannot read the bootstrap manifests and the admin kubeconfig from a control plane: {err}"),
            )
        })?;
        let objects = crate::kube::manifests::objects(&manifests)
            .map_err(|err| self.pause(stage, None, err.to_string()))?;
        let admin = crate::kube::KubeClient::from_kubeconfig_text(
            &kubeconfig,
            &format!("the admin kubeconfig from {from} (MachineService/Kubeconfig)"),
        )
        .await
        .map_err(|err| self.pause(stage, None, err.to_string()))?;
        drop(kubeconfig);
        self.check_lock(stage, "").await?;
        let applied = super::patiently(&e.clock, "apply the bootstrap manifests", || {
            admin.sync_manifests(&objects)
        })
        .await
        .map_err(|err| {
            let reason = match &err {
                crate::kube::KubeError::Api { code: 409, what, message, .. } => format!(
                    "{what}: another field manager owns what Talos renders ({message}); ichor applies as Talos's field manager `talos` without force, as talosctl upgrade-k8s does by default: let Talos own those fields (move the change into the machine configuration) or remove the other manager's edit, then resume"
                ),
                crate::kube::KubeError::Api { code: 401 | 403, .. } => format!(
                    "the bootstrap manifests were refused to Talos's admin kubeconfig from {from}: {err}; check the control plane's Kubernetes CA and its clock, then resume"
                ),
                _ => format!("the bootstrap-manifest sync failed: {err}; resume once it can"),
            };
            self.pause(stage, None, reason)
        })?;
        let changed: Vec<String> = applied
            .iter()
            .filter(|a| a.changed)
            .map(|a| a.to_string())
            .collect();
        self.say(Progress::Note(format!(
            "bootstrap manifests: {} objects, {} changed{}",
            applied.len(),
            changed.len(),
            if changed.is_empty() {
                String::new()
            } else {
                format!(" ({})", changed.join(", "))
            }
        )));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(version: &str, updated: i32, ready: i32) -> WorkloadStatus {
        WorkloadStatus {
            namespace: "kube-system".into(),
            name: "kube-proxy".into(),
            desired: 3,
            updated,
            ready,
            images: vec![format!("registry.k8s.io/kube-proxy:{version}")],
            version: Some(version.into()),
            observed: true,
        }
    }

    #[test]
    fn switch_every_control_plane_then_sync_then_wait_for_the_roll_out() {
        let t = Duration::from_secs(600);
        let next = |obs: &ManifestsObservation, waited: u64| {
            manifests_step("v1.34.2", obs, Duration::from_secs(waited), t)
        };
        let mut obs = ManifestsObservation {
            proxy_behind: vec!["cp-2".into(), "cp-3".into()],
            synced: false,
            kube_proxy: None,
        };
        assert_eq!(
            next(&obs, 0),
            StepState::Act(ManifestsAction::SwitchProxy("cp-2".into()))
        );
        obs.proxy_behind.clear();
        assert_eq!(next(&obs, 1), StepState::Act(ManifestsAction::Sync));
        obs.synced = true;
        obs.kube_proxy = Some(Some(ds("v1.34.2", 1, 3)));
        assert!(matches!(next(&obs, 2), StepState::Settling(w) if w.contains("1/3 updated")));
        assert!(matches!(next(&obs, 600), StepState::Failed(w) if w.contains("600s")));
        obs.kube_proxy = Some(Some(ds("v1.34.2", 3, 3)));
        assert_eq!(next(&obs, 3), StepState::Done);
        // No DaemonSet to roll, or a CNI that replaces kube-proxy: done once synced.
        obs.kube_proxy = Some(None);
        assert_eq!(next(&obs, 3), StepState::Done);
        obs.kube_proxy = None;
        assert_eq!(next(&obs, 3), StepState::Done);
    }
}
