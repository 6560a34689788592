//! Stage 2c: kube-proxy on every control plane (unless the CNI replaces it), the bootstrap
//! manifests applied as Talos's field manager, then kube-proxy's DaemonSet rolled out.

use super::nodes::address;
use super::{Flow, Progress, Run, PULL_DEADLINE};
use crate::kube::LiveNode;
use crate::plan::{StageId, Step, StepKind};
use crate::releaseset::Role;
use crate::talos::client::{CallOptions, ImageNamespace};
use crate::talos::machine_config::{set_images, Component};
use crate::talos::proto::machine::apply_configuration_request::Mode as ApplyMode;

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
            // Stage (c) obeys the rules of every step: a pause request, a closed window or a
            // hold on a control plane stops it before anything is switched or applied.
            for cp in &cps {
                self.may_go(stage, &cp.name, false).await?;
            }
            marker.started_at = Some(self.now());
            self.store_marker(stage, &key, &marker).await?;
        }
        let started = marker.started_at.unwrap_or_else(|| self.now());
        let proxy = step.kind == StepKind::KubeProxyAndManifests;
        if proxy {
            for cp in &cps {
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
                    continue;
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
            }
        }
        // The manifests as a control plane renders them now (any one: they are the same),
        // and the admin kubeconfig that control plane issues: the sync runs as Talos's
        // admin (ADR 0057), never as ichor's ServiceAccount, which may not write them.
        let mut source = Err("no control plane".to_string());
        for cp in &cps {
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
        if proxy {
            let timeout = e.policy.node_timeout.as_duration();
            loop {
                let ds = self
                    .kube(stage, None, "get the kube-proxy DaemonSet", || {
                        e.kube.daemonset("kube-system", "kube-proxy")
                    })
                    .await?;
                match ds {
                    None => {
                        self.say(Progress::Note("kube-proxy: no DaemonSet kube-system/kube-proxy in the cluster; nothing to roll".into()));
                        break;
                    }
                    Some(w) if w.version.as_deref() == Some(tag.as_str()) && w.rolled_out() => {
                        break
                    }
                    Some(w) => {
                        if self.now().since(started) >= timeout {
                            return Err(self.pause(
                                stage,
                                None,
                                format!(
                                    "kube-proxy has not rolled out on {tag} after {}s: {}/{} updated, {} ready, image {}",
                                    self.now().since(started).as_secs(),
                                    w.updated,
                                    w.desired,
                                    w.ready,
                                    w.images.join(", ")
                                ),
                            ));
                        }
                    }
                }
                e.clock.sleep(e.observe_every).await;
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
}
