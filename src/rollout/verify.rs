//! Stage 3: the whole cluster verified at the target.

use super::{Flow, Progress, Run};
use crate::plan::StageId;
use crate::releaseset::Version;

impl Run<'_, '_> {
    /// The end: every node on the target, Ready, and nothing ichor cordoned left so.
    pub(super) async fn verify(&self) -> Flow<()> {
        let stage = StageId::Verify;
        let nodes = self.live_nodes(stage).await?;
        let talos = self.target.talos.to_string();
        let k8s = self.target.kubernetes.tag();
        let mut wrong = Vec::new();
        for n in &nodes {
            if n.cordoned_by_ichor {
                // Ours is uncordoned; a stale mark on a schedulable node is cleared.
                let name = n.name.as_str();
                self.kube(stage, Some(name), "uncordon", || {
                    self.engine.kube.uncordon(name, self.rollout_id())
                })
                .await?;
            }
            let talos_ok = n
                .talos
                .as_deref()
                .and_then(|t| Version::parse(t).ok())
                .is_none_or(|t| t == self.target.talos);
            if !n.ready || n.kubelet != k8s || !talos_ok {
                wrong.push(format!(
                    "{} (Talos {}, kubelet {}, {})",
                    n.name,
                    n.talos.as_deref().unwrap_or("?"),
                    n.kubelet,
                    if n.ready { "Ready" } else { "NotReady" }
                ));
            }
        }
        if !wrong.is_empty() {
            return Err(self.pause(
                stage,
                None,
                format!(
                    "after every stage, not every node runs the target: {}",
                    wrong.join("; ")
                ),
            ));
        }
        // What the plan promises besides versions: etcd whole again and every volume healthy,
        // waited for within the node timeout (a member or a replica that just came back may
        // need a moment), then a human looks.
        let started = self.now();
        let timeout = self.engine.policy.node_timeout.as_duration();
        loop {
            let sick = self.unhealthy(stage, &nodes).await?;
            if sick.is_empty() {
                break;
            }
            if self.now().since(started) >= timeout {
                return Err(self.pause(
                    stage,
                    None,
                    format!(
                        "every node runs the target, but after {}s {}; check them, then resume",
                        self.now().since(started).as_secs(),
                        sick.join("; ")
                    ),
                ));
            }
            self.engine
                .clock
                .sleep_to_beat(self.engine.observe_every)
                .await;
        }
        self.say(Progress::UnitDone {
            node: None,
            stage,
            what: format!(
                "every node on Talos {talos} and Kubernetes {k8s}, Ready; etcd and every volume healthy"
            ),
        });
        Ok(())
    }

    /// What is not healthy yet: etcd members (from etcd's own list) and volumes.
    async fn unhealthy(
        &self,
        stage: StageId,
        nodes: &[crate::kube::LiveNode],
    ) -> Flow<Vec<String>> {
        let mut sick = Vec::new();
        let any_cp = nodes
            .iter()
            .any(|n| n.role == crate::releaseset::Role::Controlplane);
        if any_cp {
            match crate::gate::live::observe_etcd_around(self.engine.talos, nodes, None).await {
                Ok(view) => {
                    let bad: Vec<String> = view
                        .member_health()
                        .into_iter()
                        .filter_map(|(m, h)| match h {
                            Err(e) => Some(format!("{} ({e})", m.hostname)),
                            Ok(()) if m.is_learner => {
                                Some(format!("{} (still a learner)", m.hostname))
                            }
                            Ok(()) => None,
                        })
                        .collect();
                    if !bad.is_empty() {
                        sick.push(format!("etcd members not healthy: {}", bad.join(", ")));
                    }
                }
                Err(e) => sick.push(format!("etcd could not be read: {e}")),
            }
        }
        let degraded: Vec<String> = self
            .volumes(stage)
            .await?
            .into_iter()
            .filter(|v| v.degraded())
            .map(|v| v.name)
            .collect();
        if !degraded.is_empty() {
            sick.push(format!("volumes not healthy: {}", degraded.join(", ")));
        }
        Ok(sick)
    }
}
