//! The rollout lock: one Lease per cluster keeps rollouts apart. It is renewed while the
//! stages run and checked again right before every disruptive action; losing it stops every
//! action at once.

use std::time::Duration;

use super::{Flow, Rollout, Run, Stop, LOCK_DURATION};
use crate::gate::live::{lock_name, ICHOR_NAMESPACE};
use crate::kube::{KubeError, LockState};
use crate::plan::StageId;

impl Rollout<'_> {
    pub(super) async fn acquire(&self) -> Result<LockState, KubeError> {
        let _one = self.renewing.lock().await;
        self.kube
            .acquire_lease(
                ICHOR_NAMESPACE,
                &lock_name(&self.cluster),
                &self.holder,
                LOCK_DURATION,
                self.clock.now(),
            )
            .await
    }

    /// Renew the lock until it is lost; then say who has it. A failing renewal is retried
    /// every second; the engine stops acting well before the lease could expire unrenewed.
    pub(super) async fn keep_lock(&self) -> String {
        let every = LOCK_DURATION / 4;
        let margin = Duration::from_secs(15);
        let mut renewed = self.clock.now();
        let mut wait = every;
        loop {
            self.clock.sleep(wait).await;
            match self.acquire().await {
                Ok(LockState::Held) => {
                    renewed = self.clock.now();
                    wait = every;
                }
                Ok(LockState::HeldBy { holder }) => return holder,
                Err(e) => {
                    if self.clock.now().since(renewed) + margin >= LOCK_DURATION {
                        return format!(
                            "nobody (it could not be renewed for {}s: {e})",
                            self.clock.now().since(renewed).as_secs()
                        );
                    }
                    wait = Duration::from_secs(1);
                }
            }
        }
    }

    pub(super) async fn release_lock(&self) {
        // Best effort: an unreleased lock expires after LOCK_DURATION anyway.
        let _ = self
            .kube
            .release_lease(ICHOR_NAMESPACE, &lock_name(&self.cluster), &self.holder)
            .await;
    }
}

impl Run<'_, '_> {
    /// Check the lock right before a disruptive action, so a stolen lock stops it.
    pub(super) async fn check_lock(&self, stage: StageId, node: &str) -> Flow<()> {
        match self
            .kube(stage, Some(node), "renew the rollout lock", || {
                self.engine.acquire()
            })
            .await?
        {
            LockState::Held => Ok(()),
            LockState::HeldBy { holder } => Err(Stop::LockLost(holder)),
        }
    }
}
