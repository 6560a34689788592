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
        self.say(Progress::UnitDone {
            node: None,
            stage,
            what: format!("every node on Talos {talos} and Kubernetes {k8s}, Ready"),
        });
        Ok(())
    }
}
